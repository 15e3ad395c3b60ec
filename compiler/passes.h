/* compiler/passes.h — graph canonicalisation, step 1 of the compiler (DESIGN.md §4): dead-code
 * removal, common-subexpression elimination, constant folding and algebraic identities,
 * iterated to a fixed point. The result is a fresh graph with compact node ids in
 * topological order; the input graph is never modified. */
#ifndef LUMEN_PASSES_H
#define LUMEN_PASSES_H

#include "graph-impl.h"

/* What the passes did, summed over every sweep. `rounding` counts the rewrites among them that
 * may change a result bit-for-bit (rounding, overflow, or the sign of a zero); with
 * LM_CANON_EXACT it is always 0. */
typedef struct lm_pass_stats {
  int dead;       /* nodes dropped because no output or assign reads them (also those that
                   * other rewrites left unread, such as the operands of a folded node) */
  int cse;        /* nodes merged into an identical earlier node */
  int folded;     /* nodes computed at compile time into a CONST */
  int identities; /* algebraic identities applied (x+0, x*1, x*0, recip(recip x), ...) */
  int rounding;   /* of those, the ones that may change a result's bits */
} lm_pass_stats;

typedef enum lm_canon_flags {
  /* Only rewrites that give bit-identical results on every input (NaN payloads aside):
   * recip(recip x), log2(exp2 x), exp2(log2 x) and the sign-of-zero-changing forms of x+0,
   * x*0 and sum over an extent-1 axis are left alone. */
  LM_CANON_EXACT = 1u << 0,
} lm_canon_flags;

/* Returns a new, equivalent graph (same inputs in the same order with the same names, roles
 * and shapes; same outputs and assigns by name), canonicalised with every rewrite. The input
 * graph is not modified. NULL + lm_last_error on failure. Stats optional. */
lm_graph_t *lm_canonicalize(const lm_graph_t *g, lm_pass_stats *stats);
/* The same with lm_canon_flags. */
lm_graph_t *lm_canonicalize_ex(const lm_graph_t *g, unsigned flags, lm_pass_stats *stats);

#endif
