/* compiler/search/search.h — the search's entry point for backends: rewrites a lowered plan's
 * kernels into the measured winners (see lumen/search.h for the options and the report). */
#ifndef LUMEN_SEARCH_SEARCH_H
#define LUMEN_SEARCH_SEARCH_H

#include "loopir.h"
#include "lumen/search.h"

/* Searches every kernel of `plan` (after fusing independent same-domain kernels) and replaces
 * each by the fastest correct candidate measured on the cpu. syms: a value per symbol of
 * plan->g (NULL: every symbol gets max(its least value, o->sym_default)). Kernels the search
 * cannot represent (scans with local arrays) stay as they are. On any failure the plan keeps its
 * default schedule for the kernels not yet decided, and the status says why. r may be NULL. */
lm_status lm_search_plan(lm_plan *plan, const int64_t *syms, const lm_search_options *o, lm_search_report *r);

/* Where candidates are timed when not on the cpu: a GPU backend's kernel-level entries
 * (backends/backend.h: module_build ... launch_kernel) on its open context. Candidates are
 * rendered in the backend's dialect; with gpu options each candidate is also tried under the
 * work-group schedules of compiler/gpu.c (thread mapping, shared-memory tiles and staging, tree
 * reductions), and the plan's kernels the search decides are marked fixed (later passes keep
 * what was measured). */
struct lm_backend_ops;
struct lm_gpu_options;
typedef struct lm_search_device {
  const struct lm_backend_ops *ops;
  void *ctx;
  const char *name;                 /* the device, for the tuning cache's key */
  const struct lm_gpu_options *gpu; /* NULL: no work-group schedules */
} lm_search_device;

lm_status lm_search_plan_on(lm_plan *plan, const int64_t *syms, const lm_search_options *o, lm_search_report *r,
                            const lm_search_device *dev);

/* Whole variants of a plan's schedule, for a plan whose kernels the search cannot take apart (a
 * fused scan: its kernel holds an env's local arrays, which the e-graph does not represent).
 * make(ctx, v, ...) gives variant v's kernels over plan's buffers (allocated; the search frees
 * them) and its name; variant 0 is the default. Every variant must leave each input and output
 * with variant 0's bits on the same inputs; the fastest, timed as a whole, is chosen where it
 * runs 3% faster than variant 0, and the choice cached (its number and its name, which must
 * match to be applied again). *chosen: the variant to apply (0 on any failure). */
typedef struct lm_search_variants {
  int n;
  lm_status (*make)(void *ctx, int v, lm_kernel **ks, size_t *nk, char *name, size_t cap);
  void *ctx;
  int io_sym; /* -1, or the symbol whose value multiplies every input's and output's floats (a
               * fused scan reads and writes T steps of its per-step arrays) */
  const char *tag; /* names variant 0 in the cache's key (a scan's wide and narrow forms share
                    * their plan) */
} lm_search_variants;
lm_status lm_search_variants_on(lm_plan *plan, const int64_t *syms, const lm_search_options *o,
                                const lm_search_device *dev, const lm_search_variants *vs, int *chosen);

#endif
