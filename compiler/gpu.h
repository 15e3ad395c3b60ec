/* compiler/gpu.h — work-group schedules for the GPU dialects (compiler/gpu.c): matmul tiles in
 * shared memory, env-local kernels (fused scans) with the read-only arrays every env reads
 * (policy weights) staged in shared memory — both bitwise the one-thread-per-point mapping —
 * and tree reductions in shared memory for long reductions (sums round differently). */
#ifndef LUMEN_GPU_H
#define LUMEN_GPU_H

#include "loopir.h"

typedef struct lm_gpu_options {
  int tile_matmuls;           /* 16x16 output tiles, 256 threads, k in tiles of up to 16 */
  int64_t stage_shared_bytes; /* shared memory the staged arrays of one kernel may take (0: none) */
  int32_t scan_threads;       /* threads per work-group of a staged env-local kernel */
  int warp;                   /* > 0 (CUDA: 32): a tree's last halvings by warp shuffles */
  int tree_reductions;        /* a work-group of 256 per output of a long (512+ or symbolic)
                               * reduction: strided partials and a barrier tree in shared memory;
                               * sums round differently from the sequential loop */
} lm_gpu_options;

/* Tiles and staging on, staging within 3/4 of `shared_bytes` (the device's work-group memory). */
void lm_gpu_options_default(lm_gpu_options *o, int64_t shared_bytes);
/* 0 when LUMEN_GPU_SCHEDULE=0: backends keep one thread per point (for comparisons). */
int lm_gpu_schedules_enabled(void);
/* Rewrites the plan's kernels that fit either schedule; returns how many. */
int lm_schedule_gpu(lm_plan *p, const lm_gpu_options *o);

#endif
