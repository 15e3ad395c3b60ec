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
 * Idle threads poll (sched_yield) for about 50 us after a run, then sleep on a condition
 * variable: back-to-back runs cost a few microseconds. The caller polls (sched_yield) until the
 * run ends. On Linux the workers are pinned to CPUs other than the creating thread's when there
 * are enough (LUMEN_PIN=0: never); compiler/pool.c says why. */
void lm_pool_run(lm_pool *p, lm_pool_fn fn, void *arg, int64_t n, int64_t min_per_thread);

#endif
