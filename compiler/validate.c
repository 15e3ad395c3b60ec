/* compiler/validate.c — the graph validator: structure (ops, arity, references, inputs,
 * names), cycles, every view chain re-derived from the shape of the node it starts at, the
 * per-op shape rules, outputs and assigns; and the check of concrete symbol bindings that a
 * run needs. Messages name the node: "node %7 (add): ...". */
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *lm_view_kind_name(unsigned kind) {
  static const char *const names[] = {"permute", "expand", "slice", "pad", "reshape", "affine_mod"};
  _Static_assert(sizeof names / sizeof names[0] == LM_V_COUNT, "view kind names");
  return kind < LM_V_COUNT ? names[kind] : "?";
}

/* ---------------------------------------------------------------- expressions */

/* Children are interned before their parents, so a well-formed child id is below its
 * parent's: requiring that keeps the walk finite on any arena. */
static int expr_is_dim(const lm_exprs *x, lm_expr e, uint8_t *memo) {
  if (!e || e >= x->n) return 0;
  if (memo && memo[e]) return memo[e] == 1;
  const lm_xnode *nd = &x->nodes[e];
  int fine;
  switch (nd->op) {
  case LM_X_CONST: fine = 1; break;
  case LM_X_SYM: fine = nd->v >= 0 && (uint64_t)nd->v < x->nsyms; break;
  case LM_X_ADD:
  case LM_X_MUL:
  case LM_X_DIV:
  case LM_X_MOD:
    fine = nd->a < e && nd->b < e && expr_is_dim(x, nd->a, memo) && expr_is_dim(x, nd->b, memo);
    break;
  default: fine = 0; break; /* loop variables, comparisons, unknown ops */
  }
  if (memo) memo[e] = fine ? 1 : 2;
  return fine;
}

int lm_expr_is_dim(const lm_exprs *x, lm_expr e) { return expr_is_dim(x, e, NULL); }

/* ---------------------------------------------------------------- messages */

typedef struct vctx {
  lm_graph_t *g;
  uint8_t *memo;   /* per expression: 0 unchecked, 1 a dimension, 2 not */
  uint32_t *chain; /* scratch: one view chain, top first */
  size_t chaincap;
} vctx;

static void label(const lm_graph_t *g, uint32_t id, char *buf, size_t cap) {
  const lm_node *n = &g->nodes[id];
  if (n->op == LM_OP_INPUT && n->input < g->ninputs && g->inputs[n->input].name)
    snprintf(buf, cap, "node %%%u (input '%s')", id, g->inputs[n->input].name);
  else snprintf(buf, cap, "node %%%u (%s)", id, lm_op_name((lm_op)n->op));
}

/* Records "WHO: message" as the last error. who is a node label or an output's name. */
static lm_status bad(const char *who, const char *fmt, ...) LM_PRINTF(2, 3);
static lm_status bad(const char *who, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return lm_fail(LM_ERR_INVALID, "%s: %s", who, msg);
}

static const char *dim_text(const lm_graph_t *g, lm_expr e, char *buf, size_t cap) {
  lm_sb sb = {0};
  if (lm_expr_is_dim(&g->x, e)) lm_x_print(&g->x, e, &sb, "i");
  snprintf(buf, cap, "%s", sb.s ? sb.s : "?");
  lm_sb_free(&sb);
  return buf;
}

static const char *shape_text(const lm_graph_t *g, const lm_shape *s, char *buf, size_t cap) {
  if (s->rank < 0 || s->rank > LM_MAX_RANK) {
    snprintf(buf, cap, "<rank %d>", s->rank);
    return buf;
  }
  lm_sb sb = {0};
  lm_sb_puts(&sb, "[");
  for (int i = 0; i < s->rank; i++) {
    if (i) lm_sb_puts(&sb, ",");
    if (lm_expr_is_dim(&g->x, s->dim[i])) lm_x_print(&g->x, s->dim[i], &sb, "i");
    else lm_sb_puts(&sb, "?");
  }
  lm_sb_puts(&sb, "]");
  snprintf(buf, cap, "%s", sb.s ? sb.s : "?");
  lm_sb_free(&sb);
  return buf;
}

static int shape_eq(lm_graph_t *g, const lm_shape *a, const lm_shape *b) {
  if (a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (!lm_x_prove_eq(&g->x, a->dim[i], b->dim[i])) return 0;
  return 1;
}

/* ---------------------------------------------------------------- views */

#define WHY(...) ((why && cap ? (void)snprintf(why, cap, __VA_ARGS__) : (void)0), 0)

int lm_view_shape(lm_graph_t *g, const lm_view *v, const lm_shape *in, lm_shape *out, char *why, size_t cap) {
  lm_exprs *x = &g->x;
  int a = v->axis, r = in->rank;
  char t0[128], t1[128];
  if (r < 0 || r > LM_MAX_RANK) return WHY("its input has rank %d", r);
  int needs_axis = v->kind == LM_V_SLICE || v->kind == LM_V_PAD || v->kind == LM_V_AFFINE_MOD;
  if (needs_axis && (a < 0 || a >= r)) return WHY("axis %d is out of range for input %s", a, shape_text(g, in, t0, sizeof t0));
  int params = v->kind == LM_V_EXPAND ? 1 : needs_axis ? 2 : 0;
  if ((params >= 1 && !lm_expr_is_dim(x, v->p0)) || (params == 2 && !lm_expr_is_dim(x, v->p1)))
    return WHY("a parameter is not a dimension expression of this graph");
  lm_expr zero = lm_x_const(x, 0);
  switch (v->kind) {
  case LM_V_PERMUTE: {
    if (v->shape.rank != r) return WHY("it lists %d axes for input %s", v->shape.rank, shape_text(g, in, t0, sizeof t0));
    unsigned seen = 0;
    out->rank = r;
    for (int j = 0; j < r; j++) {
      int p = v->perm[j];
      if (p < 0 || p >= r || (seen >> p & 1u)) return WHY("entry %d (%d) does not form a permutation of %d axes", j, p, r);
      seen |= 1u << p;
      out->dim[j] = in->dim[p];
    }
    return 1;
  }
  case LM_V_EXPAND:
    if (a < 0 || a > r || r == LM_MAX_RANK)
      return WHY("cannot insert axis %d into input %s", a, shape_text(g, in, t0, sizeof t0));
    out->rank = r + 1;
    for (int i = 0, k = 0; i < out->rank; i++) out->dim[i] = i == a ? v->p0 : in->dim[k++];
    return 1;
  case LM_V_SLICE:
    if (lm_x_prove_gt(x, zero, v->p0, NULL)) return WHY("start %s is negative", dim_text(g, v->p0, t0, sizeof t0));
    if (lm_x_prove_gt(x, v->p0, v->p1, NULL))
      return WHY("start %s is after end %s", dim_text(g, v->p0, t0, sizeof t0), dim_text(g, v->p1, t1, sizeof t1));
    if (lm_x_prove_gt(x, v->p1, in->dim[a], NULL))
      return WHY("end %s is beyond axis %d of input %s", dim_text(g, v->p1, t0, sizeof t0), a, shape_text(g, in, t1, sizeof t1));
    *out = *in;
    out->dim[a] = lm_x_simplify(x, lm_x_sub(x, v->p1, v->p0), NULL);
    break;
  case LM_V_PAD:
    if (lm_x_prove_gt(x, zero, v->p0, NULL) || lm_x_prove_gt(x, zero, v->p1, NULL))
      return WHY("pad amounts %s and %s must not be negative", dim_text(g, v->p0, t0, sizeof t0),
                 dim_text(g, v->p1, t1, sizeof t1));
    *out = *in;
    out->dim[a] = lm_x_simplify(x, lm_x_add(x, lm_x_add(x, v->p0, in->dim[a]), v->p1), NULL);
    break;
  case LM_V_RESHAPE:
    if (v->shape.rank < 0 || v->shape.rank > LM_MAX_RANK) return WHY("it has rank %d", v->shape.rank);
    for (int i = 0; i < v->shape.rank; i++)
      if (!lm_expr_is_dim(x, v->shape.dim[i])) return WHY("its dimension %d is not a dimension expression", i);
    if (!lm_x_prove_eq(x, lm_shape_numel(g, in), lm_shape_numel(g, &v->shape)))
      return WHY("%s and %s hold different element counts", shape_text(g, in, t0, sizeof t0),
                 shape_text(g, &v->shape, t1, sizeof t1));
    *out = v->shape;
    return 1;
  case LM_V_AFFINE_MOD: *out = *in; return 1;
  default: return WHY("unknown view kind %u", (unsigned)v->kind);
  }
  if (!out->dim[a]) return WHY("out of memory simplifying its extent");
  return 1;
}

/* Checks an edge's view chain from the node outward; *shape gets the edge's shape. */
static lm_status check_edge(vctx *c, const char *who, const char *what, lm_edge e, const lm_shape **shape) {
  lm_graph_t *g = c->g;
  size_t len = 0;
  for (uint32_t vi = e.view; vi; vi = g->views[vi].parent) { /* parents precede: checked before */
    if (!LM_GROW(c->chain, c->chaincap, len + 1)) return LM_ERR_NOMEM;
    c->chain[len++] = vi;
  }
  const lm_shape *in = &g->nodes[e.node].shape;
  while (len--) {
    uint32_t vi = c->chain[len];
    const lm_view *v = &g->views[vi];
    lm_shape out;
    char why[512], t0[128], t1[128], t2[128];
    if (!lm_view_shape(g, v, in, &out, why, sizeof why))
      return bad(who, "%s: view %u (%s): %s", what, vi, lm_view_kind_name(v->kind), why);
    if (!shape_eq(g, &out, &v->shape))
      return bad(who, "%s: view %u (%s) records shape %s, but its input %s gives %s", what, vi,
                 lm_view_kind_name(v->kind), shape_text(g, &v->shape, t0, sizeof t0), shape_text(g, in, t1, sizeof t1),
                 shape_text(g, &out, t2, sizeof t2));
    in = &v->shape;
  }
  *shape = in;
  return LM_OK;
}

/* ---------------------------------------------------------------- structure */

static lm_status check_shape_dims(vctx *c, const char *who, const char *what, const lm_shape *s) {
  if (s->rank < 0 || s->rank > LM_MAX_RANK) return bad(who, "%s has rank %d, outside 0..%d", what, s->rank, LM_MAX_RANK);
  for (int i = 0; i < s->rank; i++)
    if (!expr_is_dim(&c->g->x, s->dim[i], c->memo))
      return bad(who, "%s: dimension %d is not a dimension expression of this graph", what, i);
  return LM_OK;
}

/* The edge's node and views exist, and its chain is well formed (kinds, parents, ranks). */
static lm_status check_edge_refs(vctx *c, const char *who, const char *what, lm_edge e) {
  lm_graph_t *g = c->g;
  if (e.node == 0 || e.node >= g->nnodes) return bad(who, "%s refers to node %%%u, which does not exist", what, e.node);
  if (e.view >= g->nviews) return bad(who, "%s refers to view %u, which does not exist", what, e.view);
  for (uint32_t vi = e.view; vi; vi = g->views[vi].parent) {
    const lm_view *v = &g->views[vi];
    char vwhat[160];
    snprintf(vwhat, sizeof vwhat, "%s: view %u", what, vi);
    if (v->parent >= vi) return bad(who, "%s has parent view %u; a view's parent must come before it", vwhat, v->parent);
    if (v->kind >= LM_V_COUNT) return bad(who, "%s has unknown kind %u", vwhat, (unsigned)v->kind);
    lm_status st = check_shape_dims(c, who, vwhat, &v->shape);
    if (st) return st;
  }
  return LM_OK;
}

static lm_status check_nodes(vctx *c) {
  lm_graph_t *g = c->g;
  for (uint32_t i = 1; i < g->nnodes; i++) {
    const lm_node *n = &g->nodes[i];
    char who[192];
    label(g, i, who, sizeof who);
    if (n->op >= LM_OP_COUNT) return bad(who, "unknown op %u", (unsigned)n->op);
    const lm_op_info *info = &lm_op_table[n->op];
    if (n->nsrc != info->arity) return bad(who, "has %u sources; %s takes %d", (unsigned)n->nsrc, info->name, info->arity);
    lm_status st = check_shape_dims(c, who, "its shape", &n->shape);
    if (st) return st;
    for (int k = 0; k < n->nsrc; k++) {
      char what[32];
      snprintf(what, sizeof what, "source %d", k);
      if ((st = check_edge_refs(c, who, what, n->src[k]))) return st;
    }
    if (n->op == LM_OP_CONST && n->shape.rank != 0) return bad(who, "a constant has rank 0, not %d", n->shape.rank);
    if (n->op == LM_OP_INPUT) {
      if (n->input >= g->ninputs) return bad(who, "refers to input %u, which does not exist", n->input);
      if (g->inputs[n->input].node != i)
        return bad(who, "input %u points to node %%%u instead", n->input, g->inputs[n->input].node);
    }
  }
  for (size_t k = 0; k < g->ninputs; k++) {
    const lm_input_info *in = &g->inputs[k];
    char who[64];
    snprintf(who, sizeof who, "input %zu", k);
    if (!in->name || !*in->name) return bad(who, "has no name");
    if (in->role >= LM_ROLE_COUNT) return bad(who, "'%s' has unknown role %u", in->name, (unsigned)in->role);
    if (in->node == 0 || in->node >= g->nnodes || g->nodes[in->node].op != LM_OP_INPUT || g->nodes[in->node].input != k)
      return bad(who, "'%s' points to node %%%u, which is not its input node", in->name, in->node);
  }
  return LM_OK;
}

static lm_status check_outputs_assigns_refs(vctx *c) {
  lm_graph_t *g = c->g;
  lm_status st;
  for (size_t k = 0; k < g->noutputs; k++) {
    const lm_output_info *o = &g->outputs[k];
    char who[192];
    snprintf(who, sizeof who, "output '%s'", o->name ? o->name : "");
    if (!o->name || !*o->name) return bad(who, "has no name");
    if ((st = check_edge_refs(c, who, "its source", o->src))) return st;
  }
  for (size_t k = 0; k < g->nassigns; k++) {
    const lm_assign_info *as = &g->assigns[k];
    char who[192];
    snprintf(who, sizeof who, "assign %zu", k);
    if (as->target == 0 || as->target >= g->nnodes)
      return bad(who, "targets node %%%u, which does not exist", as->target);
    label(g, as->target, who, sizeof who);
    if ((st = check_edge_refs(c, who, "its assigned value", as->src))) return st;
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- shapes */

static lm_status check_node_shape(vctx *c, uint32_t i) {
  lm_graph_t *g = c->g;
  const lm_node *n = &g->nodes[i];
  const lm_op_info *info = &lm_op_table[n->op];
  const lm_shape *s[2] = {NULL, NULL};
  char who[192], t0[128], t1[128], t2[128];
  label(g, i, who, sizeof who);
  for (int k = 0; k < n->nsrc; k++) {
    char what[32];
    snprintf(what, sizeof what, "source %d", k);
    lm_status st = check_edge(c, who, what, n->src[k], &s[k]);
    if (st) return st;
  }
  if (info->elementwise && n->nsrc == 2 && !shape_eq(g, s[0], s[1]))
    return bad(who, "sources have shapes %s and %s", shape_text(g, s[0], t0, sizeof t0), shape_text(g, s[1], t1, sizeof t1));
  if (info->elementwise && !shape_eq(g, &n->shape, s[0]))
    return bad(who, "has shape %s, but its source%s %s", shape_text(g, &n->shape, t0, sizeof t0),
               n->nsrc == 2 ? "s have" : " has", shape_text(g, s[0], t1, sizeof t1));
  if (info->reduce) {
    int a = n->axis;
    if (a < 0 || a >= s[0]->rank)
      return bad(who, "axis %d is out of range for source shape %s", a, shape_text(g, s[0], t0, sizeof t0));
    lm_shape want = {.rank = s[0]->rank - 1};
    for (int k = 0, j = 0; k < s[0]->rank; k++)
      if (k != a) want.dim[j++] = s[0]->dim[k];
    if (!shape_eq(g, &n->shape, &want))
      return bad(who, "has shape %s, but reducing axis %d of %s gives %s", shape_text(g, &n->shape, t0, sizeof t0), a,
                 shape_text(g, s[0], t1, sizeof t1), shape_text(g, &want, t2, sizeof t2));
  }
  return LM_OK;
}

static lm_status check_outputs_assigns(vctx *c) {
  lm_graph_t *g = c->g;
  lm_status st;
  char t0[128], t1[128];
  for (size_t k = 0; k < g->noutputs; k++) {
    const lm_output_info *o = &g->outputs[k];
    char who[192];
    const lm_shape *s;
    snprintf(who, sizeof who, "output '%s' (node %%%u)", o->name, o->src.node);
    if ((st = check_edge(c, who, "its source", o->src, &s))) return st;
  }
  for (size_t k = 0; k < g->nassigns; k++) {
    const lm_assign_info *as = &g->assigns[k];
    const lm_node *t = &g->nodes[as->target];
    const lm_shape *s;
    char who[192];
    label(g, as->target, who, sizeof who);
    if (t->op != LM_OP_INPUT) return bad(who, "is assigned, but only state and parameter inputs can be");
    if (g->inputs[t->input].role == LM_ROLE_DATA)
      return bad(who, "is a data input and is assigned; only state and parameters persist");
    for (size_t j = 0; j < k; j++)
      if (g->assigns[j].target == as->target) return bad(who, "is assigned twice");
    if ((st = check_edge(c, who, "its assigned value", as->src, &s))) return st;
    if (!shape_eq(g, s, &t->shape))
      return bad(who, "has shape %s but is assigned a value of shape %s", shape_text(g, &t->shape, t0, sizeof t0),
                 shape_text(g, s, t1, sizeof t1));
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- names */

typedef struct named {
  const char *name;
  uint32_t order; /* inputs first, then outputs, each in arena order */
} named;

static int named_cmp(const void *pa, const void *pb) {
  const named *a = pa, *b = pb;
  int c = strcmp(a->name, b->name);
  return c ? c : (a->order > b->order) - (a->order < b->order);
}

static void name_owner(const lm_graph_t *g, uint32_t order, char *buf, size_t cap) {
  if (order < g->ninputs) label(g, g->inputs[order].node, buf, cap);
  else snprintf(buf, cap, "output '%s' (node %%%u)", g->outputs[order - g->ninputs].name, g->outputs[order - g->ninputs].src.node);
}

static lm_status check_names(vctx *c) {
  lm_graph_t *g = c->g;
  size_t n = g->ninputs + g->noutputs;
  if (n < 2) return LM_OK;
  named *all = lm_malloc(n * sizeof *all);
  if (!all) return LM_ERR_NOMEM;
  for (size_t k = 0; k < g->ninputs; k++) all[k] = (named){g->inputs[k].name, (uint32_t)k};
  for (size_t k = 0; k < g->noutputs; k++) all[g->ninputs + k] = (named){g->outputs[k].name, (uint32_t)(g->ninputs + k)};
  qsort(all, n, sizeof *all, named_cmp);
  lm_status st = LM_OK;
  for (size_t k = 1; k < n && !st; k++)
    if (!strcmp(all[k - 1].name, all[k].name)) {
      char who[192], first[192];
      name_owner(g, all[k].order, who, sizeof who);
      name_owner(g, all[k - 1].order, first, sizeof first);
      st = bad(who, "name '%s' is already used by %s", all[k].name, first);
    }
  lm_free(all);
  return st;
}

/* ---------------------------------------------------------------- entry points */

static lm_status validate(vctx *c) {
  lm_graph_t *g = c->g;
  lm_status st;
  if ((st = check_nodes(c)) || (st = check_outputs_assigns_refs(c))) return st;
  size_t count = 0;
  uint32_t *order = lm_graph_topo_order(g, &count);
  if (!order) return strstr(lm_last_error(), "cycle") ? LM_ERR_INVALID : LM_ERR_NOMEM;
  for (size_t k = 0; k < count && !st; k++) st = check_node_shape(c, order[k]);
  lm_free(order);
  if (st || (st = check_outputs_assigns(c)) || (st = check_names(c))) return st;
  if (g->x.failed) return lm_fail(LM_ERR_NOMEM, "out of memory interning index expressions");
  return LM_OK;
}

lm_status lm_graph_validate(const lm_graph_t *cg) {
  if (!cg) return lm_fail(LM_ERR_INVALID, "validate: no graph");
  lm_graph_t *g = (lm_graph_t *)cg; /* proving dimensions equal interns expressions */
  if (g->err == LM_ERR_NOMEM)
    return lm_fail(LM_ERR_NOMEM, "the graph ran out of memory while it was built%s%s", g->errmsg ? ": " : "",
                   g->errmsg ? g->errmsg : "");
  if (g->err) return lm_fail(LM_ERR_INVALID, "%s", g->errmsg ? g->errmsg : "the graph recorded an error while it was built");
  if (g->x.failed) return lm_fail(LM_ERR_NOMEM, "out of memory interning index expressions");
  if (!g->nodes || g->nnodes == 0 || !g->views || g->nviews == 0) return lm_fail(LM_ERR_INVALID, "validate: empty arenas");
  vctx c = {.g = g, .memo = lm_calloc(g->x.n + 1, 1)};
  if (!c.memo) return LM_ERR_NOMEM;
  lm_status st = validate(&c);
  lm_free(c.memo);
  lm_free(c.chain);
  return st;
}

/* ---------------------------------------------------------------- concrete bindings */

typedef struct bctx {
  lm_graph_t *g;
  const int64_t *val;
  const uint8_t *bound;
  int quiet; /* no labels: a first walk that only finds whether something is wrong */
  uint8_t *done; /* quiet walks, per view: checked in this walk and found right (NULL: none kept) */
  int known;     /* every symbol bound, and every expression met already found a dimension expression
                  * of the graph by a whole walk before: only the values are evaluated */
} bctx;

/* The first unbound symbol e uses, or -1. */
static int64_t first_unbound(const lm_exprs *x, lm_expr e, const uint8_t *bound) {
  const lm_xnode *nd = &x->nodes[e];
  switch (nd->op) {
  case LM_X_CONST: return -1;
  case LM_X_SYM: return bound[nd->v] ? -1 : nd->v;
  default: {
    int64_t s = first_unbound(x, nd->a, bound);
    return s >= 0 ? s : first_unbound(x, nd->b, bound);
  }
  }
}

/* lm_x_eval for dimensions, with int64 overflow reported (0) instead of undefined. */
static int eval_checked(const lm_exprs *x, lm_expr e, const int64_t *syms, int64_t *out) {
  const lm_xnode *nd = &x->nodes[e];
  int64_t a, b;
  switch (nd->op) {
  case LM_X_CONST: *out = nd->v; return 1;
  case LM_X_SYM: *out = syms[nd->v]; return 1;
  default: break;
  }
  if (!eval_checked(x, nd->a, syms, &a) || !eval_checked(x, nd->b, syms, &b)) return 0;
  switch (nd->op) {
  case LM_X_ADD: return !__builtin_add_overflow(a, b, out);
  case LM_X_MUL: return !__builtin_mul_overflow(a, b, out);
  default: /* DIV, MOD: floor operations; lm_x_eval's value for a divisor <= 0 */
    *out = lm_x_eval(x, e, NULL, syms);
    return 1;
  }
}

/* Evaluates a dimension-like expression; LM_OK and *out, or an error naming who/what. */
static lm_status eval_dim(bctx *c, const char *who, const char *what, lm_expr e, int64_t *out) {
  lm_exprs *x = &c->g->x;
  char t[128];
  if (!c->known && !lm_expr_is_dim(x, e)) return bad(who, "%s is not a dimension expression of this graph", what);
  int64_t s = c->known ? -1 : first_unbound(x, e, c->bound);
  if (s >= 0) return bad(who, "symbol %s is not bound", x->syms[s].name);
  if (!eval_checked(x, e, c->val, out))
    return bad(who, "%s: %s overflows 64 bits under these bindings", what, dim_text(c->g, e, t, sizeof t));
  return LM_OK;
}

static lm_status check_dims_bound(bctx *c, const char *who, const char *what, const lm_shape *s) {
  char t[128];
  int64_t numel = 1;
  for (int i = 0; i < s->rank; i++) {
    int64_t v = 0;
    lm_status st = eval_dim(c, who, what, s->dim[i], &v);
    if (st) return st;
    if (v < 0)
      return bad(who, "%s: dimension %d (%s) is %lld under these bindings", what, i, dim_text(c->g, s->dim[i], t, sizeof t),
                 (long long)v);
    if (__builtin_mul_overflow(numel, v, &numel))
      return bad(who, "%s: the element count overflows 64 bits under these bindings", what);
  }
  return LM_OK;
}

static lm_status check_edge_bound(bctx *c, const char *who, const char *edge, lm_edge e) {
  lm_graph_t *g = c->g;
  lm_status st;
  for (uint32_t vi = e.view; vi; vi = g->views[vi].parent) {
    if (c->done && c->done[vi]) break; /* a view many edges share (a minibatch's gathered rows), and its parents */
    const lm_view *v = &g->views[vi];
    const lm_shape *in = v->parent ? &g->views[v->parent].shape : &g->nodes[e.node].shape;
    char what[160] = "";
    int64_t p0 = 0, p1 = 0, extent = 0;
    if (!c->quiet) snprintf(what, sizeof what, "%s: view %u (%s)", edge, vi, lm_view_kind_name(v->kind));
    if ((st = check_dims_bound(c, who, what, &v->shape))) return st;
    int axis_kind = v->kind == LM_V_SLICE || v->kind == LM_V_PAD || v->kind == LM_V_AFFINE_MOD;
    if (axis_kind || v->kind == LM_V_EXPAND) {
      if ((st = eval_dim(c, who, what, v->p0, &p0))) return st;
      if (v->kind != LM_V_EXPAND && (st = eval_dim(c, who, what, v->p1, &p1))) return st;
    }
    if (axis_kind) {
      if (v->axis < 0 || v->axis >= in->rank) return bad(who, "%s: axis %d is out of range", what, v->axis);
      if ((st = eval_dim(c, who, what, in->dim[v->axis], &extent))) return st;
    }
    switch (v->kind) {
    case LM_V_EXPAND:
      if (p0 < 0) return bad(who, "%s: extent is %lld under these bindings", what, (long long)p0);
      break;
    case LM_V_SLICE:
      if (p0 < 0 || p0 > p1 || p1 > extent)
        return bad(who, "%s: [%lld, %lld) is not within axis %d of extent %lld under these bindings", what, (long long)p0,
                   (long long)p1, v->axis, (long long)extent);
      break;
    case LM_V_PAD:
      if (p0 < 0 || p1 < 0) return bad(who, "%s: pads %lld and %lld under these bindings", what, (long long)p0, (long long)p1);
      break;
    case LM_V_AFFINE_MOD:
      if (extent <= 0) return bad(who, "%s: axis %d is empty under these bindings", what, v->axis);
      break;
    default: break;
    }
    if (c->done) c->done[vi] = 1;
  }
  return LM_OK;
}

/* Checks the items whose mask meets `changed` (masks NULL: every item): nodes, then outputs,
 * then assigns, in lm_graph_binding_masks' order. */
static lm_status check_all_bound(bctx *c, uint64_t changed, const uint64_t *masks) {
  lm_graph_t *g = c->g;
  lm_status st;
  char who[192] = "", what[32] = "";
#define SKIP(item) (masks && !(masks[item] & changed))
  for (uint32_t i = 1; i < g->nnodes; i++) {
    const lm_node *n = &g->nodes[i];
    if (SKIP(i)) continue;

    if (!c->quiet) label(g, i, who, sizeof who);
    if ((st = check_dims_bound(c, who, "its shape", &n->shape))) return st;
    for (int k = 0; k < n->nsrc && k < 2; k++) {
      if (!c->quiet) snprintf(what, sizeof what, "source %d", k);
      if ((st = check_edge_bound(c, who, what, n->src[k]))) return st;
    }
  }
  for (size_t k = 0; k < g->noutputs; k++) {
    if (SKIP(g->nnodes + k)) continue;
    if (!c->quiet) snprintf(who, sizeof who, "output '%s' (node %%%u)", g->outputs[k].name, g->outputs[k].src.node);
    if ((st = check_edge_bound(c, who, "its source", g->outputs[k].src))) return st;
  }
  for (size_t k = 0; k < g->nassigns; k++) {
    if (SKIP(g->nnodes + g->noutputs + k)) continue;
    if (!c->quiet) label(g, g->assigns[k].target, who, sizeof who);
    if ((st = check_edge_bound(c, who, "its assigned value", g->assigns[k].src))) return st;
  }
#undef SKIP
  return LM_OK;
}

static uint64_t shape_syms(const lm_graph_t *g, const lm_shape *s) {
  uint64_t m = 0;
  for (int i = 0; i < s->rank; i++) m |= lm_x_syms_used(&g->x, s->dim[i]);
  return m;
}

static uint64_t edge_syms(const lm_graph_t *g, lm_edge e) {
  uint64_t m = 0;
  for (uint32_t vi = e.view; vi; vi = g->views[vi].parent) {
    const lm_view *v = &g->views[vi];
    m |= shape_syms(g, &v->shape) | lm_x_syms_used(&g->x, v->p0) | lm_x_syms_used(&g->x, v->p1);
  }
  return m;
}

uint64_t *lm_graph_binding_masks(lm_graph_t *g) {
  size_t n = g->nnodes + g->noutputs + g->nassigns;
  uint64_t *m = lm_calloc(n + 1, sizeof *m);
  if (!m) return NULL;
  for (uint32_t i = 1; i < g->nnodes; i++) {
    const lm_node *nd = &g->nodes[i];
    m[i] = shape_syms(g, &nd->shape);
    for (int k = 0; k < nd->nsrc && k < 2; k++) m[i] |= edge_syms(g, nd->src[k]);
  }
  for (size_t k = 0; k < g->noutputs; k++) m[g->nnodes + k] = edge_syms(g, g->outputs[k].src);
  for (size_t k = 0; k < g->nassigns; k++) m[g->nnodes + g->noutputs + k] = edge_syms(g, g->assigns[k].src);
  return m;
}

/* Runs at every change of a program's bindings (a PPO update rebinds its minibatch offset at
 * every run), over only what the changed symbols reach: the walk names nothing, and only when
 * it finds a problem does a second walk build the labels for the message (formatting them for
 * the PPO update's 817 nodes made a check 281 us; it is 36 us without, and about 1 us when
 * only the offset changed). The first walk checks a view once, however many edges read through
 * it, and after a whole walk has passed with every symbol bound it evaluates the expressions
 * without walking them twice more for their form and their symbols (static): CartPole's update
 * at CleanRL's settings spent 5.5 us a minibatch on the offset's check (14 items, 77 views),
 * about 2 us now. */
lm_status lm_graph_check_bindings_of(lm_graph_t *g, const int64_t *sym_values, const uint8_t *sym_bound,
                                     uint64_t changed, const uint64_t *masks) {
  if (!g) return lm_fail(LM_ERR_INVALID, "bindings: no graph");
  if (g->x.nsyms && (!sym_values || !sym_bound)) return lm_fail(LM_ERR_INVALID, "bindings: the graph has symbols but no values were given");
  for (size_t s = 0; s < g->x.nsyms; s++)
    if (sym_bound[s] && sym_values[s] < g->x.syms[s].least)
      return lm_fail(LM_ERR_INVALID, "symbol %s is bound to %lld, below its least value %lld", g->x.syms[s].name,
                     (long long)sym_values[s], (long long)g->x.syms[s].least);
  int all = 1; /* masks: a whole walk passed before, and every expression was found a dimension's */
  for (size_t s = 0; s < g->x.nsyms && all; s++) all = sym_bound[s];
  bctx c = {g, sym_values, sym_bound, 1, lm_calloc(g->nviews + 1, 1), masks && all};
  lm_status st = check_all_bound(&c, changed, masks);
  lm_free(c.done);
  if (st == LM_OK) return LM_OK;
  c.quiet = 0;
  c.done = NULL;
  c.known = 0;
  return check_all_bound(&c, changed, masks);
}

lm_status lm_graph_check_bindings(lm_graph_t *g, const int64_t *sym_values, const uint8_t *sym_bound) {
  return lm_graph_check_bindings_of(g, sym_values, sym_bound, ~0ull, NULL);
}
