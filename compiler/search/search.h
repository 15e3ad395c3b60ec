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

#endif
