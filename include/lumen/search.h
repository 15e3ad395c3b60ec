/* lumen/search.h — the schedule search: rewrite rules over the loop IR generate equivalent
 * kernels in an e-graph, candidates are compiled, checked against the reference interpreter on
 * random inputs and timed on the device, and the fastest replaces the default schedule. Winners
 * are kept in a tuning cache per (kernel, device, compiler, size bucket), so a second run with
 * the same graph searches nothing. A budget of 0 seconds means the default schedule. */
#ifndef LUMEN_SEARCH_H
#define LUMEN_SEARCH_H

#include "lumen/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The clock a search's budget is read on: seconds since any fixed point. */
typedef double (*lm_search_clock_fn)(void *ctx);

typedef struct lm_search_options {
  double budget_s;      /* budget for one plan in seconds of `clock`; 0 = no search ($LUMEN_SEARCH_BUDGET) */
  lm_search_clock_fn clock; /* NULL: the monotonic wall clock. Only the budget is read on it; candidates
                           are always timed on the wall clock. A clock that never moves bounds the
                           search by the counts below alone (tests use one: their work does not
                           depend on how busy the machine is); under one no kernel of min_work is
                           too fast to search */
  void *clock_ctx;
  int max_candidates;   /* candidates timed per kernel (besides the default), default 24 */
  int generations;      /* generations of the genetic search after the first, default 12
                           ($LUMEN_SEARCH_GENERATIONS; 0: generation 0 only) */
  int max_kernels;      /* kernels searched per plan, the slowest first (0: every kernel worth it) */
  int samples;          /* genomes drawn per kernel before ranking, default 160 */
  int threads;          /* thread pool size for timing (0: $LUMEN_THREADS or every CPU) */
  int use_cache;        /* read and write the tuning cache (default 1; $LUMEN_SEARCH_CACHE=0 turns off) */
  int cache_only;       /* with no budget: apply what the tuning cache decided for a kernel (checked once
                           per process), search nothing, the rest keeps the default schedule (default 0;
                           $LUMEN_SEARCH_CACHE_ONLY=1, which rltrain sets: `rltrain tune` fills the cache) */
  const char *cache_dir;/* NULL: the kernel cache directory ($LUMEN_CACHE_DIR, ...) */
  const char *log_path; /* NULL: $LUMEN_SEARCH_LOG; a file appended with every candidate tried */
  int allow_rounding;   /* rules that change rounding (checked with a looser tolerance), default 1
                           ($LUMEN_SEARCH_EXACT=1 turns them off) */
  int fuse_kernels;     /* fuse independent kernels over the same domain first, default 1 */
  int64_t sym_default;  /* value of a symbol the caller does not bind (default 256) */
  int64_t min_work;     /* kernels that execute fewer statements are left alone (default 4096) */
  uint64_t seed;
  const char *backend;  /* lm_search_bench only: where both plans run and the search times (NULL or
                           "cpu": the cpu; "opencl", "cuda": that device, kernel by kernel) */
} lm_search_options;

/* Defaults, then the environment: LUMEN_SEARCH_BUDGET (seconds), LUMEN_SEARCH_LOG (file),
 * LUMEN_SEARCH_CACHE (0 disables the cache), LUMEN_SEARCH_CACHE_ONLY (1: cache_only),
 * LUMEN_SEARCH_EXACT (1: exact rules only). */
void lm_search_options_init(lm_search_options *o);

/* What one search did, per kernel and in total. */
typedef struct lm_search_kernel_report {
  char name[32];
  double default_s, best_s; /* seconds per launch at the measured sizes (0 when not timed) */
  int candidates;           /* candidates timed */
  int wrong;                /* candidates that disagreed with the reference (a rule bug) */
  int from_cache, rounding; /* decided by the cache; the winner may round differently */
  char rules[160];          /* rules that made the winner's nodes ("" = the default schedule) */
} lm_search_kernel_report;

typedef struct lm_search_report {
  int kernels_before, kernels_after; /* after kernel fusion */
  int searched;                      /* kernels searched (not from the cache) */
  int from_cache;                    /* kernels (and plans) decided by the cache */
  int candidates, wrong;
  double default_s, best_s;          /* sums over the kernels timed */
  double wall_s;
  lm_search_kernel_report *kernels;  /* one per kernel of the final plan */
  int nkernels;
} lm_search_report;

void lm_search_report_free(lm_search_report *r);

/* Default schedule vs searched, side by side on the cpu backend (or on o->backend's device: the
 * default is what that backend runs without a search), for a graph with no scan:
 * both plans are compiled and run on the same random inputs (outputs must agree: max_rel_err),
 * and each is timed as a whole (kernels only, the minimum of several runs). `syms` binds the
 * named symbols (others get o->sym_default). For rlbench: matmul, the PPO update graph, ... */
typedef struct lm_search_bench_result {
  int kernels_default, kernels_searched;
  double default_s, searched_s, speedup; /* seconds per run of the whole plan */
  double search_wall_s;
  int candidates, wrong, from_cache;
  double max_rel_err;                   /* searched vs default, normwise per output */
  char winner[256];                      /* "kernel: rules; ..." for the kernels that changed */
} lm_search_bench_result;

lm_status lm_search_bench(const lm_graph_t *g, const char *const *sym_names, const int64_t *sym_values, int nsyms,
                          const lm_search_options *o, lm_search_bench_result *out);

#ifdef __cplusplus
}
#endif
#endif
