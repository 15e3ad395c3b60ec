/* Tests for the cpu backend's thread pool (compiler/pool.c): every index runs exactly once, the
 * partition is the documented formula, chunk 0 runs on the caller, per-block float reductions are
 * bitwise identical for any thread count, many back-to-back runs stay correct, also when workers
 * are slow and the caller runs their chunks, the rule that sends the pool solo, and (Linux)
 * workers are free by default and pinned to another CPU than the caller's with LUMEN_PIN=1.
 * Nothing here depends on how busy the machine is: waits are bounded by counts, and what timing
 * decides (who runs a chunk, solo or not) is only checked where it cannot vary. */
#if defined(__linux__)
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pool.h"

/* ---- coverage and partition ------------------------------------------------------------------ */

#define MAX_CALLS 64

typedef struct record {
  atomic_int *hits; /* per index */
  atomic_int n_calls;
  int64_t start[MAX_CALLS], end[MAX_CALLS];
  int on_caller[MAX_CALLS];
  pthread_t caller;
} record;

static void record_fn(void *arg, int64_t start, int64_t end) {
  record *r = arg;
  int c = atomic_fetch_add(&r->n_calls, 1);
  if (c < MAX_CALLS) {
    r->start[c] = start;
    r->end[c] = end;
    r->on_caller[c] = pthread_equal(pthread_self(), r->caller);
  }
  for (int64_t i = start; i < end; i++) atomic_fetch_add(&r->hits[i], 1);
}

/* Runs [0, n) on a T-thread pool and checks: each index once; the calls are exactly the nonempty
 * documented chunks; the chunk starting at 0 ran on the caller. */
static void check_partition(lm_pool *p, int64_t n, int64_t min_per_thread) {
  int T = lm_pool_size(p);
  record r = {0};
  r.hits = calloc((size_t)n + 1, sizeof *r.hits);
  cr_assert(r.hits);
  r.caller = pthread_self();
  lm_pool_run(p, record_fn, &r, n, min_per_thread);
  for (int64_t i = 0; i < n; i++)
    cr_assert_eq(atomic_load(&r.hits[i]), 1, "T=%d n=%lld: index %lld ran %d times", T,
                 (long long)n, (long long)i, atomic_load(&r.hits[i]));
  int calls = atomic_load(&r.n_calls);
  cr_assert_leq(calls, MAX_CALLS);
  int alone = T == 1 || n / 2 < min_per_thread; /* n < 2 * min, without overflow */
  int expected = 0;
  for (int t = 0; t < T && n > 0; t++) {
    int64_t a = alone ? (t ? n : 0) : lm_pool_chunk_start(n, T, t);
    int64_t b = alone ? n : lm_pool_chunk_start(n, T, t + 1);
    if (a == b) continue;
    expected++;
    int found = 0;
    for (int c = 0; c < calls; c++) {
      if (r.start[c] != a || r.end[c] != b) continue;
      found = 1;
      if (t == 0) cr_assert(r.on_caller[c], "T=%d n=%lld: chunk 0 ran off the caller", T, (long long)n);
    }
    cr_assert(found, "T=%d n=%lld: chunk %d [%lld, %lld) never ran", T, (long long)n, t,
              (long long)a, (long long)b);
  }
  cr_assert_eq(calls, expected, "T=%d n=%lld: %d calls, expected %d (no empty chunks)", T,
               (long long)n, calls, expected);
  free(r.hits);
}

Test(pool, every_index_runs_exactly_once_for_many_sizes_and_thread_counts) {
  static const int64_t sizes[] = {0, 1, 2, 3, 7, 1000};
  for (int T = 1; T <= 4; T++) {
    lm_pool *p = NULL;
    cr_assert_eq(lm_pool_new(T, &p), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_pool_size(p), T);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      check_partition(p, sizes[i], 0);
      check_partition(p, sizes[i], 1);
    }
    lm_pool_free(p);
  }
}

Test(pool, partition_is_floor_t_n_over_T) {
  cr_assert_eq(lm_pool_chunk_start(10, 3, 0), 0);
  cr_assert_eq(lm_pool_chunk_start(10, 3, 1), 3);
  cr_assert_eq(lm_pool_chunk_start(10, 3, 2), 6);
  cr_assert_eq(lm_pool_chunk_start(10, 3, 3), 10);
  cr_assert_eq(lm_pool_chunk_start(3, 4, 1), 0);
  cr_assert_eq(lm_pool_chunk_start(3, 4, 2), 1);
  for (int64_t n = 0; n < 200; n++)
    for (int T = 1; T <= 9; T++)
      for (int t = 0; t <= T; t++) cr_assert_eq(lm_pool_chunk_start(n, T, t), t * n / T);
  /* No overflow near the top of int64_t: exact, monotone, ends at n. */
  int64_t big = INT64_MAX - 5;
  int64_t prev = 0;
  for (int t = 0; t <= 7; t++) {
    int64_t s = lm_pool_chunk_start(big, 7, t);
    cr_assert_geq(s, prev);
    prev = s;
  }
  cr_assert_eq(prev, big);
  cr_assert_eq(lm_pool_chunk_start(big, 7, 3), (int64_t)((__int128)big * 3 / 7));
}

Test(pool, small_n_runs_on_the_caller_alone) {
  lm_pool *p = NULL;
  cr_assert_eq(lm_pool_new(4, &p), LM_OK);
  check_partition(p, 5, 3);   /* 5 < 2*3: one call [0, 5) on the caller */
  check_partition(p, 6, 3);   /* 6 >= 2*3: split four ways */
  check_partition(p, 100, INT64_MAX); /* no overflow in 2 * min_per_thread */
  lm_pool_free(p);
}

/* ---- deterministic reduction ----------------------------------------------------------------- */

#define BLOCK 4096

typedef struct reduce_job {
  const float *x;
  int64_t n;
  float *partial; /* one per block */
} reduce_job;

static void reduce_blocks(void *arg, int64_t start, int64_t end) {
  reduce_job *j = arg;
  for (int64_t b = start; b < end; b++) {
    int64_t lo = b * BLOCK, hi = lo + BLOCK < j->n ? lo + BLOCK : j->n;
    float s = 0;
    for (int64_t i = lo; i < hi; i++) s += j->x[i] * j->x[i] - 0.5f * j->x[i];
    j->partial[b] = s;
  }
}

static float reduce_with(int T, const float *x, int64_t n) {
  int64_t nb = (n + BLOCK - 1) / BLOCK;
  float *partial = malloc((size_t)nb * sizeof *partial);
  cr_assert(partial);
  for (int64_t b = 0; b < nb; b++) partial[b] = NAN; /* poison */
  lm_pool *p = NULL;
  cr_assert_eq(lm_pool_new(T, &p), LM_OK);
  reduce_job j = {x, n, partial};
  lm_pool_run(p, reduce_blocks, &j, nb, 1);
  lm_pool_free(p);
  float s = 0;
  for (int64_t b = 0; b < nb; b++) s += partial[b]; /* combined in chunk (block) order */
  free(partial);
  return s;
}

Test(pool, per_block_float_reduction_is_bitwise_identical_for_1_to_4_threads) {
  int64_t n = 1000003;
  float *x = malloc((size_t)n * sizeof *x);
  cr_assert(x);
  uint32_t s = 12345;
  for (int64_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = ((float)(s >> 8) / 16777216.0f - 0.3f) * (float)(1 + (i % 97)); /* mixed magnitudes */
  }
  float one = reduce_with(1, x, n);
  cr_assert(one == one && one != 0);
  for (int T = 2; T <= 4; T++) {
    float r = reduce_with(T, x, n);
    cr_assert(memcmp(&r, &one, sizeof r) == 0, "T=%d: %.9g vs %.9g with 1 thread", T, r, one);
  }
  free(x);
}

/* ---- back-to-back runs ----------------------------------------------------------------------- */

typedef struct add_job {
  int64_t *v;
  int64_t round;
} add_job;

static void add_round(void *arg, int64_t start, int64_t end) {
  add_job *j = arg;
  for (int64_t i = start; i < end; i++) j->v[i] += j->round + i;
}

Test(pool, many_back_to_back_runs_all_complete_before_returning) {
  for (int T = 2; T <= 4; T++) {
    lm_pool *p = NULL;
    cr_assert_eq(lm_pool_new(T, &p), LM_OK);
    enum { N = 37, ROUNDS = 20000 };
    int64_t v[N] = {0};
    add_job j = {v, 0};
    for (int r = 0; r < ROUNDS; r++) {
      j.round = r;
      lm_pool_run(p, add_round, &j, N, 1);
      /* The caller reads every chunk's result right away: it must be complete and visible. */
      for (int i = 0; i < N; i++)
        cr_assert_eq(v[i], (int64_t)r * (r + 1) / 2 + (int64_t)(r + 1) * i,
                     "T=%d round %d index %d", T, r, i);
    }
    lm_pool_free(p);
  }
}

Test(pool, runs_after_workers_fell_asleep_still_complete) {
  lm_pool *p = NULL;
  cr_assert_eq(lm_pool_new(3, &p), LM_OK);
  for (int r = 0; r < 5; r++) {
    nanosleep(&(struct timespec){0, 2000000}, NULL); /* longer than the spin: workers are asleep on the condition variable */
    check_partition(p, 1000, 1);
  }
  lm_pool_free(p);
}

/* ---- slow workers ---------------------------------------------------------------------------- */

typedef struct slow_job {
  atomic_int *hits;
  pthread_t caller;
} slow_job;

/* Off the caller, every chunk sleeps first: the caller finds the workers' chunks unstarted or
 * late, runs what it can, and the pool may go solo. */
static void slow_fn(void *arg, int64_t start, int64_t end) {
  slow_job *j = arg;
  if (!pthread_equal(pthread_self(), j->caller)) nanosleep(&(struct timespec){0, 300000}, NULL);
  for (int64_t i = start; i < end; i++) atomic_fetch_add(&j->hits[i], 1);
}

Test(pool, runs_with_slow_workers_complete_every_index_once_and_every_run_is_counted) {
  enum { N = 1000, ROUNDS = 300 };
  for (int T = 2; T <= 4; T += 2) {
    lm_pool *p = NULL;
    cr_assert_eq(lm_pool_new(T, &p), LM_OK);
    atomic_int *hits = calloc(N, sizeof *hits);
    cr_assert(hits);
    slow_job j = {hits, pthread_self()};
    for (int r = 0; r < ROUNDS; r++) {
      lm_pool_run(p, slow_fn, &j, N, 1);
      for (int i = 0; i < N; i++)
        cr_assert_eq(atomic_load(&hits[i]), r + 1, "T=%d round %d: index %d ran %d times", T, r, i,
                     atomic_load(&hits[i]));
    }
    lm_pool_judge jd = lm_pool_judgement(p);
    cr_assert_eq(jd.parallel_runs + jd.solo_runs, ROUNDS, "T=%d: %lld parallel + %lld solo runs", T,
                 (long long)jd.parallel_runs, (long long)jd.solo_runs);
    cr_assert_geq(jd.parallel_runs, 1); /* a fresh pool starts parallel */
    free(hits);
    lm_pool_free(p);
  }
}

/* A run judged by the caller's judgement counts there, not in the pool's; a judgement sent solo
 * keeps its runs on the caller while the pool's own runs (and another judgement's) go on in
 * parallel. */
Test(pool, a_callers_judgement_counts_its_runs_and_goes_solo_alone) {
  enum { N = 1000 };
  lm_pool *p = NULL;
  cr_assert_eq(lm_pool_new(2, &p), LM_OK);
  atomic_int *hits = calloc(N, sizeof *hits);
  cr_assert(hits);
  slow_job job = {hits, pthread_self()};
  lm_pool_judge mine, other;
  lm_pool_judge_init(&mine);
  lm_pool_judge_init(&other);
  mine.solo_until_ns = INT64_MAX; /* as if its windows had lost */
  for (int r = 0; r < 5; r++) {
    lm_pool_run_judged(p, slow_fn, &job, N, 1, &mine);
    lm_pool_run_judged(p, slow_fn, &job, N, 1, &other);
    lm_pool_run(p, slow_fn, &job, N, 1);
  }
  for (int i = 0; i < N; i++) cr_assert_eq(atomic_load(&hits[i]), 15, "index %d ran %d times", i, atomic_load(&hits[i]));
  lm_pool_judge pool = lm_pool_judgement(p);
  cr_assert(mine.solo_runs == 5 && mine.parallel_runs == 0, "mine: %lld solo, %lld parallel", (long long)mine.solo_runs,
            (long long)mine.parallel_runs);
  cr_assert_eq(other.parallel_runs + other.solo_runs, 5);
  cr_assert_geq(other.parallel_runs, 1, "a fresh judgement starts parallel");
  cr_assert_eq(pool.parallel_runs + pool.solo_runs, 5, "the pool's: %lld parallel + %lld solo",
               (long long)pool.parallel_runs, (long long)pool.solo_runs);
  free(hits);
  lm_pool_free(p);
}

/* ---- the judge ------------------------------------------------------------------------------- */

#define MS 1000000LL

Test(pool, a_window_that_loses_sends_the_pool_solo_for_spells_that_double_then_halve) {
  enum { W = LM_POOL_JUDGE_RUNS };
  lm_pool_judge j;
  lm_pool_judge_init(&j);
  int64_t t = 1000 * MS;
  cr_assert(!lm_pool_judge_solo(&j, t), "a new pool runs in parallel");
  /* W - 1 helped runs that each lose a little: the window is not over */
  for (int r = 0; r < W - 1; r++) cr_assert_eq(lm_pool_judge_run(&j, -1000, 1, t), 0, "run %d", r);
  cr_assert(!lm_pool_judge_solo(&j, t));
  /* the last ends a window that lost in all: a spell of the minimum length */
  cr_assert_eq(lm_pool_judge_run(&j, -1000, 1, t), 1);
  int64_t first = j.solo_until_ns - t;
  cr_assert_gt(first, 0);
  cr_assert(lm_pool_judge_solo(&j, t + first - 1));
  cr_assert(!lm_pool_judge_solo(&j, t + first), "the spell ends at solo_until_ns");
  /* one run that loses two milliseconds ends its window at once; the spell doubles */
  t += first;
  cr_assert_eq(lm_pool_judge_run(&j, -2 * MS, 1, t), 1);
  cr_assert_eq(j.solo_until_ns - t, 2 * first);
  t += 2 * first;
  cr_assert_eq(lm_pool_judge_run(&j, -2 * MS, 1, t), 1);
  cr_assert_eq(j.solo_until_ns - t, 4 * first);
  /* a window that gains: no spell, and the next one is half as long */
  t += 4 * first;
  for (int r = 0; r < W; r++) cr_assert_eq(lm_pool_judge_run(&j, 5000, 1, t), 0, "gaining run %d", r);
  cr_assert(!lm_pool_judge_solo(&j, t));
  cr_assert_eq(lm_pool_judge_run(&j, -2 * MS, 1, t), 1);
  cr_assert_eq(j.solo_until_ns - t, 4 * first);
  /* gains and losses of one window add up: a loss the gains cover is no loss */
  t += 4 * first;
  cr_assert_eq(lm_pool_judge_run(&j, 3 * MS, 1, t), 0);
  cr_assert_eq(lm_pool_judge_run(&j, -2 * MS, 1, t), 0);
  cr_assert_eq(j.spells, 4);
}

Test(pool, a_window_where_the_workers_helped_in_under_half_the_runs_loses_whatever_its_score) {
  enum { W = LM_POOL_JUDGE_RUNS };
  lm_pool_judge j;
  lm_pool_judge_init(&j);
  /* runs a worker helped in, by a lot, then runs the caller did alone: the window is lost as
   * soon as more than half of it went without the workers, before it is over */
  for (int r = 0; r < W / 2 - 2; r++) cr_assert_eq(lm_pool_judge_run(&j, 100000, 1, 0), 0);
  for (int r = 0; r < W / 2; r++) cr_assert_eq(lm_pool_judge_run(&j, -100, 0, 0), 0, "alone run %d", r);
  cr_assert_eq(lm_pool_judge_run(&j, -100, 0, 0), 1);
  cr_assert_lt(j.runs, W);
  cr_assert(lm_pool_judge_solo(&j, 0));
  /* half and half, with a positive score, does not lose */
  lm_pool_judge_init(&j);
  for (int r = 0; r < W / 2; r++) cr_assert_eq(lm_pool_judge_run(&j, -100, 0, 0), 0);
  for (int r = 0; r < W / 2; r++) cr_assert_eq(lm_pool_judge_run(&j, 100000, 1, 0), 0);
  cr_assert(!lm_pool_judge_solo(&j, 0));
  cr_assert_eq(j.spells, 0);
}

Test(pool, spells_never_grow_past_the_maximum_nor_shrink_below_the_minimum) {
  lm_pool_judge j;
  lm_pool_judge_init(&j);
  int64_t min = j.spell_ns, t = 0, longest = 0;
  for (int r = 0; r < 100; r++) {
    cr_assert_eq(lm_pool_judge_run(&j, -10 * MS, 1, t), 1);
    int64_t spell = j.solo_until_ns - t;
    cr_assert_geq(spell, longest, "spell %d shrank while losing", r);
    longest = spell;
    t = j.solo_until_ns;
  }
  cr_assert_leq(longest, 1000 * MS, "spells stay at most a second");
  for (int w = 0; w < 100; w++)
    for (int r = 0; r < LM_POOL_JUDGE_RUNS; r++) lm_pool_judge_run(&j, 1000, 1, t);
  cr_assert_eq(j.spell_ns, min);
}

/* ---- sizing ---------------------------------------------------------------------------------- */

Test(pool, zero_threads_means_lumen_threads_then_online_cpus) {
  lm_pool *p = NULL;
  setenv("LUMEN_THREADS", "3", 1);
  cr_assert_eq(lm_pool_new(0, &p), LM_OK);
  cr_assert_eq(lm_pool_size(p), 3);
  lm_pool_free(p);
  unsetenv("LUMEN_THREADS");
  cr_assert_eq(lm_pool_new(0, &p), LM_OK);
  cr_assert_eq(lm_pool_size(p), (int)sysconf(_SC_NPROCESSORS_ONLN));
  lm_pool_free(p);
}

Test(pool, bad_thread_counts_are_rejected_with_a_message) {
  lm_pool *p = (lm_pool *)1;
  cr_assert_eq(lm_pool_new(-1, &p), LM_ERR_INVALID);
  cr_assert_null(p);
  setenv("LUMEN_THREADS", "two", 1);
  cr_assert_eq(lm_pool_new(0, &p), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "LUMEN_THREADS='two'"), "%s", lm_last_error());
  setenv("LUMEN_THREADS", "0", 1);
  cr_assert_eq(lm_pool_new(0, &p), LM_ERR_INVALID);
  unsetenv("LUMEN_THREADS");
  setenv("LUMEN_PIN", "yes", 1);
  cr_assert_eq(lm_pool_new(2, &p), LM_ERR_INVALID);
  cr_assert_null(p);
  cr_assert(strstr(lm_last_error(), "LUMEN_PIN='yes'"), "%s", lm_last_error());
}

/* ---- where the workers run ------------------------------------------------------------------- */

#if defined(__linux__)
int sched_getcpu(void);

typedef struct where {
  int cpu[2];
  int by_worker; /* chunk 1 ran off the caller */
  cpu_set_t affinity; /* of the thread that ran chunk 1 */
  pthread_t caller;
  atomic_int started; /* chunk 1 has begun */
} where;

/* Chunk 0 waits (a bounded number of yields) until chunk 1 has begun, so that a worker runs it
 * whenever one wakes in that time; the caller takes it otherwise. */
static void where_fn(void *arg, int64_t start, int64_t end) {
  where *w = arg;
  (void)end;
  if (start == 1) {
    atomic_store(&w->started, 1);
    w->by_worker = !pthread_equal(pthread_self(), w->caller);
    sched_getaffinity(0, sizeof w->affinity, &w->affinity);
  } else {
    for (long i = 0; i < 1000000 && !atomic_load(&w->started); i++) sched_yield();
  }
  w->cpu[start] = sched_getcpu();
}

static void where_run(lm_pool *p, where *w) {
  memset(w, 0, sizeof *w);
  w->cpu[0] = w->cpu[1] = -1;
  w->caller = pthread_self();
  lm_pool_run(p, where_fn, w, 2, 1);
}

/* By default the workers may run on every CPU the process may use (pinned, they were stuck
 * behind other processes: compiler/pool.c). */
Test(pool, workers_are_free_to_run_on_any_allowed_cpu_by_default) {
  unsetenv("LUMEN_PIN");
  cpu_set_t allowed;
  cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  lm_pool *p;
  cr_assert_eq(lm_pool_new(2, &p), LM_OK);
  int seen = 0;
  for (int r = 0; r < 5; r++) {
    where w;
    where_run(p, &w);
    if (!w.by_worker) continue;
    seen++;
    cr_assert(CPU_EQUAL(&w.affinity, &allowed), "run %d: the worker's affinity is not the process's", r);
  }
  cr_assert_gt(seen, 0, "no worker ran chunk 1 in 5 runs");
  lm_pool_free(p);
}

/* With LUMEN_PIN=1 workers are pinned to CPUs other than the caller's (unpinned, a woken worker
 * could be placed on the caller's CPU and the two chunks of a run went one after the other):
 * whenever a worker runs chunk 1, it runs on another CPU than the caller's chunk, also after it
 * fell asleep between runs, and after the caller moved onto the worker's CPU. Needs two CPUs the
 * process may use. */
Test(pool, with_lumen_pin_1_a_workers_chunk_runs_on_another_cpu_than_the_callers) {
  cpu_set_t allowed;
  cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) {
    cr_skip_test("one CPU: nothing to pin");
    return;
  }
  setenv("LUMEN_PIN", "1", 1);
  lm_pool *p;
  cr_assert_eq(lm_pool_new(2, &p), LM_OK);
  unsetenv("LUMEN_PIN");
  /* the worker's CPU, from the first run it takes part in; then the caller is kept on another
   * CPU of its own, so the scheduler cannot move it onto the worker's between two checks (on a
   * busy machine it would) */
  int seen = 0, worker_cpu = -1, home = -1;
  for (int r = 0; r < 40 && worker_cpu < 0; r++) {
    where w;
    where_run(p, &w);
    if (w.by_worker && CPU_COUNT(&w.affinity) == 1) worker_cpu = w.cpu[1];
  }
  cr_assert(worker_cpu >= 0, "no pinned worker ran chunk 1 in 40 runs");
  for (int c = 0; c < CPU_SETSIZE && home < 0; c++)
    if (c != worker_cpu && CPU_ISSET(c, &allowed)) home = c;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  CPU_SET(home, &mine);
  cr_assert_eq(sched_setaffinity(0, sizeof mine, &mine), 0);
  for (int r = 0; r < 20; r++) {
    usleep(2000); /* the worker falls asleep: unpinned, waking it could put it on the caller's CPU */
    where w;
    where_run(p, &w);
    cr_assert_eq(w.cpu[0], home, "run %d: the caller ran on CPU %d, not its own %d", r, w.cpu[0], home);
    if (!w.by_worker) continue;
    seen++;
    cr_assert_eq(CPU_COUNT(&w.affinity), 1, "run %d: the worker is not pinned", r);
    cr_assert_eq(w.cpu[1], worker_cpu, "run %d: the worker ran on CPU %d, not its own %d", r, w.cpu[1], worker_cpu);
  }
  cr_assert_gt(seen, 0, "no worker ran chunk 1 in 20 runs");
  /* the caller moves onto the worker's CPU: the worker moves away at the next run */
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(worker_cpu, &one);
  cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
  for (int r = 0; r < 5; r++) {
    where w;
    where_run(p, &w);
    cr_assert_eq(w.cpu[0], worker_cpu);
    if (w.by_worker) cr_assert_neq(w.cpu[1], w.cpu[0], "after the caller moved: both chunks ran on CPU %d", w.cpu[0]);
  }
  cr_assert_eq(sched_setaffinity(0, sizeof allowed, &allowed), 0);
  lm_pool_free(p);
}
#endif
