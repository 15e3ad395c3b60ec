/* compiler/memplan.h — the memory planner and the run-time layout of a plan: liveness
 * intervals become offsets in one arena (best fit, reuse once a buffer's last reader has
 * run); inputs and outputs (parameters and state among them) are pinned outside it. */
#ifndef LUMEN_MEMPLAN_H
#define LUMEN_MEMPLAN_H

#include "loopir.h"

/* Places n buffers of `bytes` alive over kernels [first, last] (first < 0: unused) into one
 * arena. Two buffers share bytes only if one's last use is before the other's first. */
lm_status lm_memplan(size_t n, const size_t *bytes, const int *first, const int *last, size_t align,
                     size_t *offset, size_t *total);

/* Sizes under concrete symbol values. */
typedef struct lm_layout {
  size_t *count;       /* per plan buffer: elements */
  size_t *offset;      /* per plan buffer: byte offset in the arena (temps only) */
  size_t arena_bytes;  /* the arena */
  size_t temp_bytes;   /* sum of all temps, for comparison */
  int64_t *extent;     /* per kernel: extent of the partitioned outer loop (1 if none) */
  int64_t *work;       /* per kernel: iterations of its whole parallel domain */
  int64_t *cost;       /* per kernel: lm_kernel_cost (a rough size of its work) */
  uint64_t syms;       /* the symbols it depends on (lm_x_syms_used of sizes and extents) */
} lm_layout;

lm_status lm_layout_compute(const lm_plan *p, const int64_t *syms, lm_layout *out);
/* 1 when layout l, computed under the values `had`, holds under `syms` too: a PPO update's
 * minibatch offset moves a slice, not a size, so rebinding it keeps the layout. */
static inline int lm_layout_holds(const lm_layout *l, const int64_t *had, const int64_t *syms, size_t nsyms) {
  return lm_x_syms_agree(l->syms, had, syms, nsyms);
}

/* The work of kernel k under these symbol values: statements executed, heavy ones weighted
 * (the layout's cost). */
int64_t lm_kernel_cost(const lm_exprs *x, const lm_kernel *k, const int64_t *syms);

/* How the cpu backend cuts a kernel's outer loop over its thread pool; the search times its
 * candidates cut the same way, so that it measures what the backend will run. Chunks are `unit`
 * iterations (see memplan.c for why), and a thread is given at least `min_chunks` of them. */
typedef struct lm_cpu_cut {
  int64_t unit, min_chunks;
} lm_cpu_cut;
/* A thread is worth starting for about this much work (lm_kernel_cost): a kernel with less runs
 * on one thread. */
enum { LM_CPU_THREAD_WORK = 16384 };
/* Outer iterations per chunk, unless the kernel is fine (lm_kernel_fine): one chunk, one thread,
 * for an outer loop of at most this many. */
enum { LM_CPU_BLOCK = 64 };
/* fine: lm_kernel_fine(k); extent: of the outer loop; cost: lm_kernel_cost */
lm_cpu_cut lm_cpu_cut_of(int fine, int64_t extent, int64_t cost);
/* Does a loop of symbolic extent sit inside kernel k's outer loop? (Then chunks may be single
 * iterations.) */
int lm_kernel_fine(const lm_exprs *x, const lm_kernel *k);
void lm_layout_free(lm_layout *l);

#endif
