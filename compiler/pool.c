/* compiler/pool.c — the cpu backend's static thread pool. A run publishes its job by bumping a
 * generation counter; workers poll it after each run (so back-to-back runs cost a few
 * microseconds), then sleep on a condition variable. Chunks are claimed from a counter: the
 * caller runs chunk 0, then every chunk no worker has started, then waits (polling a while, then
 * asleep) for the chunks workers hold. The caller scores each run (what the workers saved against
 * what publishing and waiting cost) and runs the chunks alone for a while when they lose.
 *
 * Why, measured on this project's 2-vCPU VM (2026-12-02; rltrain cartpole --total-steps 20000,
 * 7 interleaved rounds, medians of training seconds, load averages beside them). Until then the
 * workers were pinned to CPUs other than the caller's and the caller polled until every chunk
 * was done: unpinned, a worker woken by the caller was placed on the caller's CPU and stayed
 * there (both cache-hot), and a run's chunks went one after the other. But a pinned worker that
 * shares its CPU with another process is off it for a scheduler slice at a time, and the caller
 * waited that out in every run. Beside two spinning processes (load 3.8-4.0): the old pool 13.65
 * s, this one 0.37 s, LUMEN_PIN=1 0.48 s, one thread 0.38 s (process wall 14.2 / 1.12 / 1.13 /
 * 0.99 s); rlbench --only busy: the old pool 32x one thread, this one 0.91-1.09x in five runs.
 * Beside the other jobs of this machine (load 1.6-2.1): old 0.38 s, this 0.23, pinned 0.25, one
 * thread 0.26. Idle (load 1.2, 9 rounds): old 0.147 s, this 0.151, pinned 0.146, one thread
 * 0.211; back-to-back runs of two 180 us chunks, run / chunk time 1.02-1.06 (old 1.01-1.07), of
 * two 18 us chunks 1.06-1.13 (old 1.06-1.11). With claiming the caller never waits for a chunk
 * nobody has begun, and the score sends a busy pool solo within a millisecond of loss, for
 * spells doubling up to a second. Pinning (LUMEN_PIN=1) is an opt-in: it still helps runs that
 * come after the workers fell asleep (two 180 us chunks after 2 ms sleeps, idle: run / chunk
 * 1.14-1.31 pinned, 1.95-2.07 free, i.e. one thread's time; the old pool 1.28-1.44 and 2.1),
 * and costs most beside busy processes. A chunk counts as saved at the lesser of the caller's
 * pace and the worker's own, because a preemption of the caller during its chunk made pinned
 * workers look useful when they were not. */
#if defined(__linux__)
#define _GNU_SOURCE
#endif
#include "pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

#define POOL_MAX_THREADS 1024
/* How long an idle worker polls before it sleeps, and how long the caller polls for the workers'
 * chunks (plus twice its own chunks' time) before it sleeps. They poll with sched_yield rather
 * than a pause loop: on a busy machine the thread a poller waits for is often queued on the
 * poller's own CPU. Measured on 2 vCPUs shared with other jobs (load 5-22), T=2, empty runs:
 * yield polling 4.7-6.9 us per back-to-back run and a median 4-6 us after the workers slept; a
 * pause loop 0.6-6 us back-to-back but 60-400 us after a sleep and 30-160 us with 3-4 threads on
 * the 2 CPUs; a 2 us pause phase before yielding made both 2-4 times slower. A worker stops
 * polling as soon as one sched_yield took longer than GAP_NS (another thread wanted the CPU),
 * so it polls long only where its CPU would idle: long enough to stay awake through a run the
 * caller ran alone. With 50 us, a worker woken late for back-to-back runs of two 180 us chunks
 * found its chunk taken, fell asleep before the next run, and every run went serial (run /
 * chunk 2.0 on an idle machine, 1.0 once it polls for 1 ms). */
#define SPIN_NS 1000000L
#define POLL_NS 50000L
#define GAP_NS 20000L

typedef struct worker {
  struct lm_pool *pool;
  int index;
  int cpu; /* pinned to this CPU, or -1 */
} worker;

struct lm_pool {
  int size;
  int pinned; /* workers are pinned (each worker's cpu) */
#if defined(__linux__)
  cpu_set_t allowed; /* the CPUs the creating thread could use */
#endif
  pthread_t *threads;
  worker *workers;
  pthread_mutex_t mu;
  pthread_cond_t wake; /* workers wait here for a new generation */
  pthread_cond_t done_cv; /* the caller waits here for the last chunk */
  /* The job: written by the caller before it publishes `next` (release), read by whoever claims
   * a chunk from it (acquire). */
  lm_pool_fn fn;
  void *arg;
  int64_t n;
  int stop;
  lm_pool_judge judge; /* the caller's alone */
  /* Each hot atomic on its own cache line. */
  char pad0[64];
  atomic_uint_fast64_t gen;
  char pad1[64];
  atomic_int next; /* the next chunk to claim (chunk 0 is the caller's) */
  char pad2[64];
  atomic_int done; /* chunks 1..size-1 finished */
  atomic_llong worker_ns; /* the workers' time in this run's chunks */
  char pad3[64];
  atomic_int sleepers;      /* workers inside the condition-variable wait */
  atomic_int caller_asleep; /* the caller waits on done_cv */
  char pad4[64];
  atomic_int busy; /* a run is in progress (catches nested or concurrent runs) */
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the judgement --------------------------------------------------------------------------- */

/* A window is judged after LM_POOL_JUDGE_RUNS parallel runs, or as soon as it has lost LOSS_NS or
 * can no longer have the workers help in half its runs. A window loses when its score is below
 * zero or when the workers ran a chunk in fewer than half its runs: waking workers that then find
 * nothing to do costs more than publishing (measured beside two spinning processes: the woken
 * worker shares the caller's CPU, and the caller's time between runs tripled while the score said
 * +8 ms; judged after 64 runs instead of 16, probing cost 20k steps of CartPole 0.44 s against
 * 0.29 s on one thread). Solo spells start at SOLO_MIN_NS and double while windows keep losing,
 * up to SOLO_MAX_NS; a window that gains halves the next spell. Under two busy processes a run
 * whose worker is preempted loses a scheduler slice (1-10 ms), so one such run ends the window. */
#define LOSS_NS 1000000L
#define SOLO_MIN_NS 8000000L
#define SOLO_MAX_NS 1000000000L

void lm_pool_judge_init(lm_pool_judge *j) {
  memset(j, 0, sizeof *j);
  j->spell_ns = SOLO_MIN_NS;
}

int lm_pool_judge_solo(const lm_pool_judge *j, int64_t now) { return now < j->solo_until_ns; }

int lm_pool_judge_run(lm_pool_judge *j, int64_t gain_ns, int helped, int64_t now) {
  j->gain_ns += gain_ns;
  j->helped += helped != 0;
  j->runs++;
  int over = j->runs >= LM_POOL_JUDGE_RUNS;
  int alone = j->runs - j->helped; /* runs the workers did not help in */
  int lost = j->gain_ns < -LOSS_NS || 2 * alone > LM_POOL_JUDGE_RUNS || (over && j->gain_ns < 0);
  if (!lost && !over) return 0;
  if (lost) {
    j->solo_until_ns = now + j->spell_ns;
    j->spell_ns = j->spell_ns >= SOLO_MAX_NS / 2 ? SOLO_MAX_NS : 2 * j->spell_ns;
    j->spells++;
  } else {
    j->spell_ns = j->spell_ns / 2 < SOLO_MIN_NS ? SOLO_MIN_NS : j->spell_ns / 2;
  }
  j->gain_ns = 0;
  j->helped = 0;
  j->runs = 0;
  return lost;
}

/* ---- running chunks -------------------------------------------------------------------------- */

/* Polls `gen` until it differs from `seen`, for up to spin_ns, or until one poll took longer
 * than GAP_NS: sched_yield then ran another thread, and on a busy machine a poller only takes
 * CPU time from the threads that have work (the caller among them). Returns the value last read. */
static uint_fast64_t spin_for_gen(lm_pool *p, uint_fast64_t seen, int64_t spin_ns) {
  int64_t t0 = now_ns(), last = t0;
  for (;;) {
    uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    int64_t t = now_ns();
    if (g != seen || t - t0 > spin_ns || t - last > GAP_NS) return g;
    last = t;
    sched_yield();
  }
}

static void run_chunk(lm_pool *p, int t) {
  int64_t a = lm_pool_chunk_start(p->n, p->size, t);
  int64_t b = lm_pool_chunk_start(p->n, p->size, t + 1);
  if (a < b) p->fn(p->arg, a, b);
}

/* Claims and runs chunks of the current run until none is left; returns how many it ran. A
 * claim that reads the caller's reset of `next` (or a later claim) sees the job it published;
 * a stale claim, from a thread that woke for a run that has ended, reads a count past the last
 * chunk and runs nothing. */
static int claim_chunks(lm_pool *p, int timed) {
  int ran = 0;
  for (;;) {
    int t = atomic_fetch_add_explicit(&p->next, 1, memory_order_acquire);
    if (t >= p->size) return ran;
    int64_t t0 = timed ? now_ns() : 0;
    run_chunk(p, t);
    if (timed) atomic_fetch_add_explicit(&p->worker_ns, now_ns() - t0, memory_order_relaxed);
    ran++;
    if (atomic_fetch_add(&p->done, 1) + 1 == p->size - 1 && atomic_load(&p->caller_asleep)) {
      /* the caller set caller_asleep before its last look at `done` (both seq_cst): either it
       * saw our count, or we see its flag and signal under the mutex it waits with */
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

static void *worker_main(void *arg) {
  worker *w = arg;
  lm_pool *p = w->pool;

  uint_fast64_t seen = 0;
  for (;;) {
    uint_fast64_t g = spin_for_gen(p, seen, SPIN_NS);
    if (g == seen) {
      /* Announce the sleep before the last look at gen; the caller bumps gen before it looks at
       * `sleepers` (both seq_cst), so either it sees us and signals, or we see its bump. */
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->wake, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    seen = g;
    if (p->stop) return NULL;
    claim_chunks(p, 1);
  }
}

/* ---- creating and freeing -------------------------------------------------------------------- */

static lm_status threads_from_env(int *n) {
  const char *v = getenv("LUMEN_THREADS");
  if (v && *v) {
    char *end;
    errno = 0;
    long t = strtol(v, &end, 10);
    if (errno || *end || t < 1 || t > POOL_MAX_THREADS)
      return lm_fail(LM_ERR_INVALID, "LUMEN_THREADS='%s' is not a thread count in 1..%d", v,
                     POOL_MAX_THREADS);
    *n = (int)t;
    return LM_OK;
  }
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  *n = c < 1 ? 1 : c > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)c;
  return LM_OK;
}

static void pool_stop(lm_pool *p, int started) {
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < started; i++) pthread_join(p->threads[i], NULL);
}

/* Pins thread t to one CPU; 1 when it is. */
static int pin(pthread_t t, int cpu) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(t, sizeof set, &set) == 0;
#else
  (void)t, (void)cpu;
  return 0;
#endif
}

/* The caller moved onto a worker's CPU (it is not pinned: it is the application's thread): that
 * worker moves to a CPU no thread of the pool uses, the caller's previous one, say. Rare: once per
 * move of the caller; sched_getcpu costs nanoseconds. */
static void unpile(lm_pool *p) {
#if defined(__linux__)
  int me = sched_getcpu();
  for (int i = 0; i < p->size - 1; i++) {
    if (p->workers[i].cpu != me) continue;
    for (int c = 0; c < CPU_SETSIZE; c++) {
      if (!CPU_ISSET(c, &p->allowed) || c == me) continue;
      int used = 0;
      for (int k = 0; k < p->size - 1; k++) used |= p->workers[k].cpu == c;
      if (!used && pin(p->threads[i], c)) {
        p->workers[i].cpu = c;
        break;
      }
    }
  }
#else
  (void)p;
#endif
}

/* CPUs for workers 1..n-1 (p->allowed read already) with LUMEN_PIN=1: the allowed CPUs other
 * than the creating thread's, in order; all -1 (no pinning) by default, off Linux, or when fewer
 * CPUs are allowed than threads. */
static void pin_plan(const lm_pool *p, int n, int *cpus) {
  for (int i = 0; i < n; i++) cpus[i] = -1;
#if defined(__linux__)
  const char *e = getenv("LUMEN_PIN");
  if (!e || strcmp(e, "1") || CPU_COUNT(&p->allowed) < n) return;
  int self = sched_getcpu(), k = 1;
  for (int c = 0; c < CPU_SETSIZE && k < n; c++)
    if (CPU_ISSET(c, &p->allowed) && c != self) cpus[k++] = c;
  if (k < n)
    for (int i = 0; i < n; i++) cpus[i] = -1;
#else
  (void)p;
#endif
}

lm_status lm_pool_new(int n_threads, lm_pool **out) {
  if (!out) return lm_fail(LM_ERR_INVALID, "lm_pool_new: out is NULL");
  *out = NULL;
  if (n_threads < 0 || n_threads > POOL_MAX_THREADS)
    return lm_fail(LM_ERR_INVALID, "lm_pool_new: %d threads (want 0..%d)", n_threads,
                   POOL_MAX_THREADS);
  if (n_threads == 0) {
    lm_status st = threads_from_env(&n_threads);
    if (st != LM_OK) return st;
  }
  const char *pin_env = getenv("LUMEN_PIN");
  if (pin_env && strcmp(pin_env, "0") && strcmp(pin_env, "1"))
    return lm_fail(LM_ERR_INVALID,
                   "LUMEN_PIN='%s' is not 0 (threads free, the default) or 1 (pinned where there "
                   "are enough CPUs)",
                   pin_env);
  lm_pool *p = lm_calloc(1, sizeof *p);
  if (!p) return LM_ERR_NOMEM;
  p->size = n_threads;
  if (n_threads > 1) {
    p->threads = lm_calloc((size_t)n_threads - 1, sizeof *p->threads);
    p->workers = lm_calloc((size_t)n_threads - 1, sizeof *p->workers);
    if (!p->threads || !p->workers) {
      lm_free(p->threads);
      lm_free(p->workers);
      lm_free(p);
      return LM_ERR_NOMEM;
    }
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  atomic_init(&p->gen, 0);
  atomic_init(&p->next, n_threads); /* nothing to claim */
  atomic_init(&p->done, 0);
  atomic_init(&p->worker_ns, 0);
  atomic_init(&p->busy, 0);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->caller_asleep, 0);
  lm_pool_judge_init(&p->judge);

  /* Workers start with every signal blocked, so signals go to the application's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int started = 0, rc = 0;
  int *cpus = lm_calloc((size_t)n_threads, sizeof *cpus);
  if (!cpus) {
    lm_free(p->threads);
    lm_free(p->workers);
    lm_free(p);
    return LM_ERR_NOMEM;
  }
#if defined(__linux__)
  if (sched_getaffinity(0, sizeof p->allowed, &p->allowed) != 0) CPU_ZERO(&p->allowed);
#endif
  pin_plan(p, n_threads, cpus);
  /* kernels keep local arrays on the stack (a staged weight matrix: up to 1 MiB), so workers
   * get the main thread's usual 8 MiB whatever the process's stack limit says */
  pthread_attr_t attr;
  int have_attr = pthread_attr_init(&attr) == 0 && pthread_attr_setstacksize(&attr, (size_t)8 << 20) == 0;
  for (; started < n_threads - 1; started++) {
    p->workers[started] = (worker){p, started + 1, cpus[started + 1]};
    rc = pthread_create(&p->threads[started], have_attr ? &attr : NULL, worker_main, &p->workers[started]);
    if (rc) break;
    if (cpus[started + 1] >= 0 && pin(p->threads[started], cpus[started + 1])) p->pinned = 1;
    else p->workers[started].cpu = -1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (have_attr) pthread_attr_destroy(&attr);
  lm_free(cpus);
  if (rc) {
    pool_stop(p, started);
    lm_free(p->threads);
    lm_free(p->workers);
    lm_free(p);
    return lm_fail(LM_ERR_NOMEM, "cannot start thread %d of a %d-thread pool: %s", started + 1,
                   n_threads, strerror(rc));
  }
  *out = p;
  return LM_OK;
}

void lm_pool_free(lm_pool *p) {
  if (!p) return;
  LM_ASSERT(!atomic_load(&p->busy));
  pool_stop(p, p->size - 1);
  pthread_cond_destroy(&p->done_cv);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  lm_free(p->threads);
  lm_free(p->workers);
  lm_free(p);
}

int lm_pool_size(const lm_pool *p) { return p ? p->size : 0; }

lm_pool_judge lm_pool_judgement(const lm_pool *p) { return p->judge; }

/* ---- a run ----------------------------------------------------------------------------------- */

void lm_pool_run(lm_pool *p, lm_pool_fn fn, void *arg, int64_t n, int64_t min_per_thread) {
  lm_pool_run_judged(p, fn, arg, n, min_per_thread, NULL);
}

void lm_pool_run_judged(lm_pool *p, lm_pool_fn fn, void *arg, int64_t n, int64_t min_per_thread, lm_pool_judge *j) {
  LM_ASSERT(p && fn);
  if (!j) j = &p->judge;
  if (n <= 0) return;
  if (p->size == 1 || n / 2 < min_per_thread) { /* n < 2 * min, without overflow */
    fn(arg, 0, n);
    return;
  }
  LM_ASSERT(!atomic_exchange(&p->busy, 1));
  p->fn = fn;
  p->arg = arg;
  p->n = n;
  int64_t t0 = now_ns();
  if (lm_pool_judge_solo(j, t0)) { /* the same chunks, on the caller */
    for (int t = 0; t < p->size; t++) run_chunk(p, t);
    j->solo_runs++;
    atomic_store(&p->busy, 0);
    return;
  }
  if (p->pinned) unpile(p);
  atomic_store_explicit(&p->done, 0, memory_order_relaxed);
  atomic_store_explicit(&p->worker_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&p->next, 1, memory_order_release); /* publishes the job to claimers */
  atomic_fetch_add(&p->gen, 1); /* wakes the spinners (seq_cst: see worker_main) */
  if (atomic_load(&p->sleepers)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }
  int64_t t1 = now_ns();

  run_chunk(p, 0);
  /* then what no worker has started yet: waiting for it would gain nothing */
  int mine = 1 + claim_chunks(p, 0);
  int64_t t2 = now_ns(), t3 = t2;

  /* The workers' chunks should end about when ours did: poll a while, then sleep. */
  int64_t poll_ns = POLL_NS + 2 * (t2 - t1);
  while (atomic_load_explicit(&p->done, memory_order_acquire) != p->size - 1) {
    if ((t3 = now_ns()) - t2 > poll_ns) {
      pthread_mutex_lock(&p->mu);
      atomic_store(&p->caller_asleep, 1);
      while (atomic_load(&p->done) != p->size - 1) pthread_cond_wait(&p->done_cv, &p->mu);
      atomic_store(&p->caller_asleep, 0);
      pthread_mutex_unlock(&p->mu);
      j->sleeps++;
      t3 = now_ns();
      break;
    }
    sched_yield();
  }
  /* The workers saved their chunks, at our pace or theirs, whichever is less: a chunk stretched
   * by a preemption on one side is not counted as saved. We paid publishing and the wait. */
  int64_t ours = (int64_t)(p->size - mine) * ((t2 - t1) / mine);
  int64_t theirs = atomic_load_explicit(&p->worker_ns, memory_order_relaxed);
  int64_t gain = (ours < theirs ? ours : theirs) - (t1 - t0) - (t3 - t2);
  j->parallel_runs++;
  lm_pool_judge_run(j, gain, mine < p->size, t3);
  atomic_store(&p->busy, 0);
}
