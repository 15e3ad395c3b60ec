/* compiler/pool.c — the cpu backend's static thread pool. A run publishes its job by bumping a
 * generation counter; workers spin on it briefly after each run (so back-to-back runs cost a few
 * microseconds), then sleep on a condition variable. The caller runs chunk 0, then polls until
 * the workers are done.
 *
 * Where the threads run matters on Linux. Measured on this project's 2-vCPU VM: a sleeping worker
 * woken by the caller is placed on the caller's CPU, and a caller that slept waiting for a worker
 * is placed on the worker's; both then count as cache-hot, so the balancer does not move either
 * to the idle CPU, and every run's chunks went one after the other (50 of 50 runs of two 200 us
 * chunks; the search timed a 64-row weight gradient at 100 us on two threads against 49 us run by
 * the backend). So workers are pinned to CPUs other than the creating thread's (when the process
 * may use a CPU for every thread; LUMEN_PIN=0 turns it off), a worker whose CPU the caller has
 * moved onto since moves away at the next run, and the caller polls without sleeping until its
 * run ends: then 0 of 50 runs were serialised, at no cost to the PPO update. */
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
/* How long an idle thread polls before it sleeps. It polls with sched_yield rather than a pause
 * loop: on a busy machine the thread a poller waits for is often queued on the poller's own CPU.
 * Measured on 2 vCPUs shared with other jobs (load 5-22), T=2, empty runs: yield polling 4.7-6.9
 * us per back-to-back run and a median 4-6 us after the workers slept; a pause loop 0.6-6 us
 * back-to-back but 60-400 us after a sleep and 30-160 us with 3-4 threads on the 2 CPUs; a 2 us
 * pause phase before yielding made both 2-4 times slower. */
#define SPIN_NS 50000L

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
  /* The job: written by the caller before it publishes `gen` (release), read by workers after
   * they observe it (acquire). */
  lm_pool_fn fn;
  void *arg;
  int64_t n;
  int stop;
  /* Each hot atomic on its own cache line. */
  char pad0[64];
  atomic_uint_fast64_t gen;
  char pad1[64];
  atomic_int pending; /* workers still running the current generation */
  char pad2[64];
  atomic_int sleepers;      /* workers inside the condition-variable wait */
  char pad3[64];
  atomic_int busy; /* a run is in progress (catches nested or concurrent runs) */
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Polls `gen` until it differs from `seen`, for up to spin_ns; returns the value last read. */
static uint_fast64_t spin_for_gen(lm_pool *p, uint_fast64_t seen, int64_t spin_ns) {
  int64_t t0 = now_ns();
  for (;;) {
    uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
    if (g != seen || now_ns() - t0 > spin_ns) return g;
    sched_yield();
  }
}

static void run_chunk(lm_pool *p, int t) {
  int64_t a = lm_pool_chunk_start(p->n, p->size, t);
  int64_t b = lm_pool_chunk_start(p->n, p->size, t + 1);
  if (a < b) p->fn(p->arg, a, b);
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
    run_chunk(p, w->index);
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
  }
}

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

/* CPUs for workers 1..n-1 (p->allowed read already): the allowed CPUs other than the creating
 * thread's, in order; all -1 (no pinning) off Linux, when fewer CPUs are allowed than threads, or
 * with LUMEN_PIN=0. */
static void pin_plan(const lm_pool *p, int n, int *cpus) {
  for (int i = 0; i < n; i++) cpus[i] = -1;
#if defined(__linux__)
  const char *e = getenv("LUMEN_PIN");
  if ((e && !strcmp(e, "0")) || CPU_COUNT(&p->allowed) < n) return;
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
    return lm_fail(LM_ERR_INVALID, "LUMEN_PIN='%s' is not 0 (threads free) or 1 (pinned where there are enough CPUs)",
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
  atomic_init(&p->gen, 0);
  atomic_init(&p->pending, 0);
  atomic_init(&p->busy, 0);
  atomic_init(&p->sleepers, 0);

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
  for (; started < n_threads - 1; started++) {
    p->workers[started] = (worker){p, started + 1, cpus[started + 1]};
    rc = pthread_create(&p->threads[started], NULL, worker_main, &p->workers[started]);
    if (rc) break;
    if (cpus[started + 1] >= 0 && pin(p->threads[started], cpus[started + 1])) p->pinned = 1;
    else p->workers[started].cpu = -1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
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
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  lm_free(p->threads);
  lm_free(p->workers);
  lm_free(p);
}

int lm_pool_size(const lm_pool *p) { return p ? p->size : 0; }

void lm_pool_run(lm_pool *p, lm_pool_fn fn, void *arg, int64_t n, int64_t min_per_thread) {
  LM_ASSERT(p && fn);
  if (n <= 0) return;
  if (p->size == 1 || n / 2 < min_per_thread) { /* n < 2 * min, without overflow */
    fn(arg, 0, n);
    return;
  }
  LM_ASSERT(!atomic_exchange(&p->busy, 1));
  if (p->pinned) unpile(p);
  p->fn = fn;
  p->arg = arg;
  p->n = n;
  atomic_store_explicit(&p->pending, p->size - 1, memory_order_relaxed);
  atomic_fetch_add(&p->gen, 1); /* publishes the job (seq_cst: see worker_main) */
  if (atomic_load(&p->sleepers)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
  }

  run_chunk(p, 0);

  /* no sleeping here: a caller woken by a worker would be moved to its CPU (see the top) */
  while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0) sched_yield();
  atomic_store(&p->busy, 0);
}
