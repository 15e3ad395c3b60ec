/* train/iteration.h — compile-only: every kernel of one training iteration (rollout scan,
 * bootstrap prep, GAE scan, minibatch update) for a target, as `rltrain compile` reports it.
 * It builds the trainer's graphs, so it lives with the trainer: the compiler (compiler/) knows
 * nothing of envs or training. */
#ifndef LUMEN_TRAIN_ITERATION_H
#define LUMEN_TRAIN_ITERATION_H

#include <stddef.h>

#include "lumen/base.h"

typedef enum lm_target {
  LM_TARGET_CUDA,   /* NVRTC to CUBIN for an sm_XX (no device needed) */
  LM_TARGET_OPENCL, /* clBuildProgram on the first OpenCL device (needs a platform) */
  LM_TARGET_C,      /* the system C compiler (compiler/cc.h) */
  LM_TARGET_COUNT
} lm_target;

/* "cuda", "opencl" or "c"; LM_ERR_INVALID (naming the choices) otherwise. */
lm_status lm_target_parse(const char *name, lm_target *out);
const char *lm_target_name(lm_target t);

typedef struct lm_kernel_report {
  char graph[24];  /* "rollout", "prep", "gae", "update" */
  char kernel[48]; /* the entry name */
  /* from ptxas (cuda); -1 where the target does not say */
  int registers, stack_bytes, spill_stores, spill_loads, shared_bytes;
  int group; /* threads per work-group of a work-group schedule (compiler/gpu.c), 0: one per point */
} lm_kernel_report;

typedef struct lm_compile_report {
  lm_kernel_report *kernels;
  size_t n;
  char compiler[256]; /* which compiler built them, e.g. "NVRTC 13.0 (libnvrtc.so.13) for sm_90" */
} lm_compile_report;

/* Builds lm_trainer_graphs(env, lm_ppo_defaults(env)), compiles each graph with the shared front
 * (compile.h: canonicalise, lower, fuse scans), renders it in the target's dialect and compiles
 * the whole translation unit, one per graph. `arch` (cuda only; NULL = "sm_90"). On a compile
 * failure: LM_ERR_COMPILE with the log (and the report holds the kernels before it). */
lm_status lm_compile_iteration(const char *env, lm_target target, const char *arch, lm_compile_report *out);
void lm_compile_report_free(lm_compile_report *r);

#endif
