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

#endif
