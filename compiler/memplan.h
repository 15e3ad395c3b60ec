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
  int64_t *cost;       /* per kernel: iterations of all its loops (a rough size of its work) */
} lm_layout;

lm_status lm_layout_compute(const lm_plan *p, const int64_t *syms, lm_layout *out);
void lm_layout_free(lm_layout *l);

#endif
