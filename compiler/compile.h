/* compiler/compile.h — the front every compiling backend shares: canonicalise the graph,
 * lower it with the default schedule, fuse an env-local scan into one kernel, and write
 * generated sources to $LUMEN_DUMP. Backends then render the plan in their dialect. */
#ifndef LUMEN_COMPILE_H
#define LUMEN_COMPILE_H

#include "backends/backend.h"
#include "loopir.h"

typedef struct lm_compiled {
  lm_graph_t *g;  /* the canonical graph (owned); the plan's expressions live in it */
  lm_plan *plan;
  int fused;      /* a scan that runs as one plan over all T steps (run counter = run*T) */
  int lanes;      /* envs per iteration of the fused scan's parallel loop (1: not in lanes) */
  lm_expr envs;   /* a fused scan: its envs (the parallel domain of its step before SIMD blocks) */
} lm_compiled;

lm_status lm_compile(const lm_graph_t *g, const lm_scan_info *scan, lm_compiled *out);

/* What a backend asks of the compiler beyond the default (all zero: lm_compile, the GPU
 * backends' front). */
struct lm_search_options;
typedef struct lm_compile_options {
  /* a search of the loop IR (lumen/search.h) when search->budget_s > 0: the measured winners
   * replace the default schedule of every kernel (not of fused scans) */
  const struct lm_search_options *search;
  const struct lm_search_device *device; /* where the search times candidates (NULL: the cpu) */
  int interchange; /* reductions in i-k-j order over a local row (lm_schedule_interchange): for
                    * vector CPUs; GPUs keep one thread per output element and tile instead */
  int stage;  /* interchange may stage operands in local arrays (a kernel call runs a chunk) */
  int lanes;  /* envs per SIMD block of a fused scan (lm_scan_lanes; < 2: none) */
  const struct lm_gpu_options *gpu; /* GPU work-group schedules with these limits (compiler/gpu.c) */
  int join;   /* runs of kernels that would each run on one thread become one kernel
               * (lm_schedule_join): the cpu, where a launch costs more than such a kernel */
} lm_compile_options;
/* One row of the pass table (compiler/compile.c), as `rltrain compile --passes` lists it. */
typedef struct lm_pass_info {
  const char *name;
  const char *dialects; /* "all", or the dialects it runs for */
  const char *when;     /* its precondition, in words */
  const char *off;      /* the environment variable that switches it off ("VAR" or "VAR=VALUE"), or NULL */
  const char *what;
} lm_pass_info;
/* Row i of the pass table, in the order the passes run; NULL past the end. */
const lm_pass_info *lm_compile_pass(int i);
/* The cpu backend's envs per SIMD block (see compiler/backends/cpu.c, scan_lanes). */
enum { LM_CPU_SCAN_LANES = 64 };
lm_status lm_compile_ex(const lm_graph_t *g, const lm_scan_info *scan, const lm_compile_options *opts,
                        lm_compiled *out);
void lm_compiled_free(lm_compiled *c);
/* Kernels per run and arena sizes of a compiled plan under these symbol values (the stats
 * entry of every compiling backend): a scan that was not fused launches its plan T times. */
lm_status lm_plan_stats(const lm_plan *plan, const lm_scan_info *scan, int fused, const int64_t *syms,
                        lm_program_stats *out);
/* LUMEN_DUMP=dir: writes src (with the plan's loop IR as a comment) to dir/<tag>-<hash>.<ext>. */
void lm_dump_source(const char *tag, const char *ext, const char *src, const lm_plan *plan);

#endif
