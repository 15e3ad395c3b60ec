/* compiler/render.h — the one C-style renderer: turns loop-IR kernels (loopir.h) into C, CUDA,
 * OpenCL C or Metal Shading Language source. Everything that differs between the languages is a
 * row of the per-dialect table (qualifiers, types, math names, thread indices, barrier, shared
 * memory, prelude); the kernel signature is the only per-dialect code path.
 *
 * Kernel ABI (every float buffer is a plan buffer, numbered as in lm_plan.bufs):
 *
 * C (cpu backend; dlsym the kernel by lm_render_entry_name):
 *   void NAME(float *const *restrict B, const int64_t *restrict S, const uint64_t *restrict R,
 *             int64_t start, int64_t end)
 *   B[i] = plan buffer i (only the buffers the kernel uses are read from B); S[k] = value of
 *   graph symbol k (g->x.syms order); R[0] = seed, R[1] = run counter. Loop 0 (the outermost
 *   parallel loop) runs over [start, end): the host splits [0, extent of loop 0) into disjoint
 *   chunks (one per thread, any partition gives the same results). A kernel with npar == 0 runs
 *   its root block once, in the call whose chunk has start == 0 and end > 0: call it with [0, 1).
 *
 * CUDA (NVRTC; compile with --fmad=false for results that match the C and ref backends):
 *   extern "C" __global__ void NAME(float *const *B, const long long *S,
 *                                   const unsigned long long *R, long long total)
 *   B, S and R are device arrays (B holds device pointers). The npar parallel loops are flattened:
 *   one thread per point of the domain, gid = blockIdx.x * blockDim.x + threadIdx.x, threads with
 *   gid >= total return; loop npar-1 varies fastest. total = product of the parallel loops'
 *   extents (1 when npar == 0). Any 1-D grid with at least total threads works.
 *
 * OpenCL C 1.2 (build with -cl-fp32-correctly-rounded-divide-sqrt; FP_CONTRACT is off in the
 * prelude):
 *   __kernel void NAME(__global float *restrict b<i> ..., __global const long *S,
 *                      __global const ulong *R, long total)
 *   One buffer argument per entry of k->bufs, in that (ascending) order: argument j is plan buffer
 *   k->bufs[j] (buffers only read are declared __global const float *restrict); then S (argument
 *   nbufs), R (nbufs + 1) and total (nbufs + 2). Flattening as for CUDA, gid = get_global_id(0);
 *   the global size may exceed total. S may be a 1-element dummy when the graph has no symbols.
 *
 * MSL (compile with fast math off, i.e. MTLMathModeSafe / fastMathEnabled = NO):
 *   kernel void NAME(device float *b<i> [[buffer(j)]] ..., constant long *S [[buffer(n)]],
 *                    constant ulong *R [[buffer(n+1)]], constant long &total [[buffer(n+2)]],
 *                    uint tid [[thread_position_in_grid]])
 *   Buffer argument j (index j) is plan buffer k->bufs[j], n = k->nbufs (read-only buffers are
 *   `const device float *`); S, R and total follow. Flattening as for CUDA with gid = tid.
 *
 * Every dialect's prelude defines lm_philox_uniform(seed, stream, element, run), bit-identical
 * to lm_rand_uniform (compiler/rand.c), and lm_floordiv / lm_floormod for index expressions whose
 * dividend may be negative (plain / and % where lm_x_prove_ge shows it is >= 0 over the kernel's
 * loop extents). Values are float; statement N is the local vN. Constants, and statements read
 * once later in their own block with only pure statements in between, are printed inside their
 * reader; statements no store depends on, and loops left with nothing live, are not printed, so
 * the C output compiles under -Wall -Wextra -Werror with gcc and clang.
 *
 * What a kernel must satisfy (else the render fails with LM_ERR_INVALID and a message): loops
 * 0..npar-1 nested in that order from the root block, every loop in exactly one block (its
 * parent's), operands that are value statements, ACC_SUM/ACC_MAX updating an ACC, LOAD/STORE
 * buffers listed in k->bufs, and index expressions over the kernel's loops and the graph's
 * symbols. Buffers used by one kernel must not overlap (they are restrict pointers). With npar > 0,
 * C runs the root block's statements once per chunk, and GPUs run an outer parallel loop's
 * statements once per thread of its inner loops: correct for pure statements, redundant stores. */
#ifndef LUMEN_RENDER_H
#define LUMEN_RENDER_H

#include "loopir.h"

typedef enum lm_dialect {
  LM_DIALECT_C,
  LM_DIALECT_CUDA,
  LM_DIALECT_OPENCL,
  LM_DIALECT_MSL,
  LM_DIALECT_COUNT
} lm_dialect;

/* The math functions the renderer calls, one name per dialect. */
typedef enum lm_math {
  LM_MATH_LOG2,
  LM_MATH_EXP2,
  LM_MATH_SIN,
  LM_MATH_SQRT,
  LM_MATH_FMOD,
  LM_MATH_FMAX,
  LM_MATH_COUNT
} lm_math;

/* One row of the per-language table. */
typedef struct lm_dialect_info {
  const char *name;        /* "c", "cuda", "opencl", "msl" */
  const char *kernel_qual; /* before `void NAME(` */
  const char *func_qual;   /* before the prelude's helper functions */
  const char *global_qual; /* address space of buffer pointers ("" where there is one) */
  const char *restrict_kw; /* "" where the language has none */
  const char *i64, *u32, *u64;
  const char *math[LM_MATH_COUNT];
  const char *inf, *nan;   /* float infinity and quiet NaN */
  const char *barrier;     /* work-group barrier statement (for GPU schedules) */
  const char *shared_qual; /* work-group shared memory qualifier (for GPU schedules) */
  const char *global_id;   /* linear global thread index as a 64-bit expression (NULL for C) */
  const char *local_id, *group_id, *local_size; /* for GPU schedules (NULL for C) */
  const char *prelude;     /* head of every translation unit: includes, pragmas, macros */
} lm_dialect_info;

/* NULL when d is out of range. */
const lm_dialect_info *lm_dialect_get(lm_dialect d);
const char *lm_dialect_name(lm_dialect d);

/* The identifier a kernel is rendered under: k->name with every character outside [A-Za-z0-9_]
 * replaced by '_' (and a leading "k_" when it would start with a digit or be empty). Backends
 * look kernels up by this name. Returns buf. */
const char *lm_render_entry_name(const lm_kernel *k, char *buf, size_t cap);

/* The prelude alone (types, helpers, Philox); malloc'd via lm_sb_take; NULL on OOM. */
char *lm_render_prelude(lm_dialect d);
/* A whole translation unit: prelude + every kernel of the plan, in launch order. malloc'd
 * (free with lm_free); NULL on OOM or on a malformed kernel (LM_ERR_INVALID, see lm_last_error). */
char *lm_render_plan(const lm_plan *p, lm_dialect d);
/* One kernel, without the prelude. Expressions are interned in p->g->x while proving bounds. */
char *lm_render_kernel(const lm_plan *p, const lm_kernel *k, lm_dialect d);
/* May loop l of kernel k be an LM_L_VECTOR loop (the C dialect runs it eight iterations at a
 * time)? Its extent is a constant multiple of 8 and no loop sits in its body; each statement
 * there either holds eight lanes (an unguarded load, or a store guarded alike for every lane,
 * whose index steps by 1 with l, and +, * and 1/x of such values; an unguarded select of one) or one value for all of them (it does not
 * name l); nothing in it accumulates, draws per lane, or writes one element from every lane;
 * and a buffer stored there is stored once and read there only at the stored index, so the
 * lanes of an iteration touch disjoint elements. vary (per statement, zeroed by the caller) is
 * set where a statement holds lanes. 1 when it may, else 0 with the reason in why. */
int lm_vector_loop_check(lm_exprs *x, const lm_kernel *k, int32_t l, uint8_t *vary, char *why, size_t cap);

#endif
