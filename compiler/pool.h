/* compiler/pool.h — a static thread pool with deterministic partitioning for the cpu backend:
 * [0, n) is cut into one contiguous chunk per thread by a fixed formula, so which index runs in
 * which chunk depends only on n and the pool size, never on timing. */
#ifndef LUMEN_POOL_H
#define LUMEN_POOL_H

#include <stdint.h>

#include "lumen/base.h"

typedef struct lm_pool lm_pool;
typedef void (*lm_pool_fn)(void *arg, int64_t start, int64_t end);

/* n_threads = 0: $LUMEN_THREADS if set, else the number of online CPUs. The calling thread is
 * worker 0; n_threads - 1 threads are started. Fails with LM_ERR_INVALID for a negative count or
 * a malformed $LUMEN_THREADS, LM_ERR_NOMEM if threads cannot be created. */
lm_status lm_pool_new(int n_threads, lm_pool **out);
void lm_pool_free(lm_pool *p);
int lm_pool_size(const lm_pool *p);

/* Start of chunk t of [0, n) split T ways: floor(t * n / T), computed without overflow. Chunk t is
 * [lm_pool_chunk_start(n, T, t), lm_pool_chunk_start(n, T, t + 1)). */
static inline int64_t lm_pool_chunk_start(int64_t n, int T, int t) {
  return (n / T) * t + (n % T) * t / T;
}

/* Runs fn(arg, start, end) on chunk t of [0, n) for t = 0..T-1 (T = lm_pool_size), chunk 0 on the
 * caller, and returns when all are done (their writes are then visible to the caller). Empty
 * chunks are skipped. If n < 2 * min_per_thread, the caller runs fn(arg, 0, n) alone. One run at
 * a time per pool: calling it from inside fn, or from two threads at once, is a bug (asserted).
 * Which thread runs a chunk depends on timing (never which indices are in it): after chunk 0 the
 * caller runs every chunk no worker has started, so a worker that is asleep or preempted delays
 * nothing it has not begun. Idle workers poll (sched_yield) for up to 1 ms after a run, but stop
 * at the first sched_yield that ran another thread, then sleep on a condition variable:
 * back-to-back runs cost a few microseconds, and on a busy machine nobody polls long. The caller
 * polls for the workers' chunks a while, then sleeps. When the workers cost more than they save
 * (a busy machine, or runs too small to share), the caller runs the chunks alone, one after the
 * other, for a spell that doubles while that lasts (lm_pool_judge). Threads are not pinned to
 * CPUs unless LUMEN_PIN=1; compiler/pool.c says why and what was measured. */
void lm_pool_run(lm_pool *p, lm_pool_fn fn, void *arg, int64_t n, int64_t min_per_thread);

/* The caller's judgement of whether its workers pay. Each parallel run is scored: the chunks the
 * workers ran, at the caller's pace or theirs (the lesser), minus what publishing the run and
 * waiting for the workers cost. A window of runs loses when its score is below zero (in all, or
 * by a millisecond at any point) or when the workers helped in fewer than half its runs (known
 * as soon as more than half went without them); then the pool goes solo for a spell. Spells
 * double while windows keep losing and halve when one gains. Kept apart from the pool, with the
 * clock passed in, so that the rule can be tested. */
enum { LM_POOL_JUDGE_RUNS = 16 }; /* parallel runs in a window */
typedef struct lm_pool_judge {
  int64_t gain_ns;       /* of the window so far */
  int runs, helped;      /* parallel runs in the window; those where a worker ran a chunk */
  int64_t solo_until_ns; /* runs start solo before this (CLOCK_MONOTONIC ns) */
  int64_t spell_ns;      /* the next solo spell */
  /* counts, for reports */
  int64_t parallel_runs, solo_runs, spells, sleeps;
} lm_pool_judge;
void lm_pool_judge_init(lm_pool_judge *j);
/* Scores one parallel run that ended at `now` (helped: a worker ran one of its chunks); 1 when
 * the window lost and a spell began. */
int lm_pool_judge_run(lm_pool_judge *j, int64_t gain_ns, int helped, int64_t now);
int lm_pool_judge_solo(const lm_pool_judge *j, int64_t now);
/* A copy of the pool's judgement (read it between runs). */
lm_pool_judge lm_pool_judgement(const lm_pool *p);
/* lm_pool_run judged by j (lm_pool_judge_init'ed, the caller's, NULL: the pool's own) instead of
 * the pool's one judgement: the cpu backend keeps one per kernel, so that a kernel whose runs the
 * workers cannot help (a few microseconds, over before a sleeping worker wakes) goes solo
 * without taking the kernels they do help with it. On a busy machine each kernel loses its own
 * windows and goes solo. */
void lm_pool_run_judged(lm_pool *p, lm_pool_fn fn, void *arg, int64_t n, int64_t min_per_thread, lm_pool_judge *j);

#endif
