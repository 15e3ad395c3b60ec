/* compiler/validate.h — checks beyond lm_graph_validate: concrete symbol bindings before a
 * run, and the one rule for the shape a view gives its input, shared by the validator (which
 * re-derives every view chain) and the text parser (which derives the shapes it does not read). */
#ifndef LUMEN_VALIDATE_H
#define LUMEN_VALIDATE_H

#include "graph-impl.h"

/* Checks a validated graph against concrete bindings (arrays indexed by symbol number,
 * g->x.nsyms entries; sym_bound[s] != 0 marks sym_values[s] as given): every symbol a node
 * shape or view parameter uses is bound, each bound value is >= the symbol's least value,
 * every dimension is >= 0, slices lie within their axis, pad amounts are >= 0 and
 * affine_mod's axis is not empty. LM_OK, or LM_ERR_INVALID with a message naming the node. */
lm_status lm_graph_check_bindings(lm_graph_t *g, const int64_t *sym_values, const uint8_t *sym_bound);
/* The symbols each of those checks reads (lm_x_syms_used masks): one per node (index = node
 * number), then one per output, then one per assign. NULL when out of memory. */
uint64_t *lm_graph_binding_masks(lm_graph_t *g);
/* lm_graph_check_bindings over the items whose mask meets `changed` (masks NULL: all of them):
 * after a full check passed, a rebinding need only check what its symbols reach. */
lm_status lm_graph_check_bindings_of(lm_graph_t *g, const int64_t *sym_values, const uint8_t *sym_bound,
                                     uint64_t changed, const uint64_t *masks);

/* The shape view `v` gives an input of shape `in` (a reshape's is its own, checked for the
 * element count; a permute's rank is the number of its entries). 1 and *out on success;
 * 0 with the reason in why (may be NULL) when the view cannot apply to `in`. Interns
 * expressions in g->x, nothing else. */
int lm_view_shape(lm_graph_t *g, const lm_view *v, const lm_shape *in, lm_shape *out, char *why, size_t cap);

/* 1 when e is an expression a dimension may hold: an existing node over constants and
 * declared symbols with + * / % only (no loop variables, no comparisons). */
int lm_expr_is_dim(const lm_exprs *x, lm_expr e);

/* Names of view kinds as the text form writes them ("permute", "expand", ...; "?" if bad). */
const char *lm_view_kind_name(unsigned kind);

#endif
