/* compiler/graph.c — graph construction: the node and view arenas, primitives with
 * numpy broadcasting, shape-tracking views, inputs, outputs and assigns, and the index
 * math that turns a view chain into flat-index and validity expressions. */
#include "graph-impl.h"
#include "validate.h"

#include <stdio.h>
#include <string.h>

const lm_op_info lm_op_table[LM_OP_COUNT] = {
    [LM_OP_INPUT] = {"input", 0, 0, 0},
    [LM_OP_CONST] = {"const", 0, 0, 0},
    [LM_OP_RAND] = {"rand", 0, 0, 0},
    [LM_OP_LOG2] = {"log2", 1, 1, 0},
    [LM_OP_EXP2] = {"exp2", 1, 1, 0},
    [LM_OP_SIN] = {"sin", 1, 1, 0},
    [LM_OP_SQRT] = {"sqrt", 1, 1, 0},
    [LM_OP_RECIP] = {"recip", 1, 1, 0},
    [LM_OP_ADD] = {"add", 2, 1, 0},
    [LM_OP_MUL] = {"mul", 2, 1, 0},
    [LM_OP_MOD] = {"mod", 2, 1, 0},
    [LM_OP_LESS_THAN] = {"less_than", 2, 1, 0},
    [LM_OP_SUM_REDUCE] = {"sum_reduce", 1, 0, 1},
    [LM_OP_MAX_REDUCE] = {"max_reduce", 1, 0, 1},
    [LM_OP_CONTIGUOUS] = {"contiguous", 1, 1, 0},
};
_Static_assert(LM_OP_CONTIGUOUS + 1 == LM_OP_COUNT, "lm_op_table must cover every op");

const char *lm_op_name(lm_op op) {
  return (unsigned)op < LM_OP_COUNT && lm_op_table[op].name ? lm_op_table[op].name : "?";
}

const char *lm_role_name(lm_role role) {
  static const char *const names[] = {"data", "param", "state"};
  _Static_assert(sizeof names / sizeof names[0] == LM_ROLE_COUNT, "role names");
  return (unsigned)role < LM_ROLE_COUNT ? names[role] : "?";
}

/* ---------------------------------------------------------------- arena */

lm_graph_t *lm_graph_new(void) {
  lm_graph_t *g = lm_calloc(1, sizeof *g);
  if (!g) return NULL;
  lm_exprs_init(&g->x);
  if (!LM_GROW(g->nodes, g->nodecap, 64) || !LM_GROW(g->views, g->viewcap, 64)) {
    lm_graph_free(g);
    return NULL;
  }
  g->nnodes = 1;
  g->nviews = 1;
  return g;
}

void lm_graph_set_contraction(lm_graph_t *g, int on) {
  if (g) g->contract = on != 0;
}

void lm_graph_promise_finite(lm_graph_t *g) {
  if (g) g->finite = 1;
}

void lm_graph_free(lm_graph_t *g) {
  if (!g) return;
  for (size_t i = 0; i < g->ninputs; i++) lm_free(g->inputs[i].name);
  for (size_t i = 0; i < g->noutputs; i++) lm_free(g->outputs[i].name);
  lm_free(g->inputs);
  lm_free(g->outputs);
  lm_free(g->assigns);
  lm_free(g->nodes);
  lm_free(g->views);
  lm_free(g->errmsg);
  lm_exprs_free(&g->x);
  lm_free(g);
}

void lm_graph_error(lm_graph_t *g, uint32_t node, const char *fmt, ...) {
  if (g->err) return;
  lm_sb sb = {0};
  if (node) lm_sb_printf(&sb, "node %%%u (%s): ", node, lm_op_name((lm_op)g->nodes[node].op));
  va_list ap;
  va_start(ap, fmt);
  lm_sb_vprintf(&sb, fmt, ap);
  va_end(ap);
  g->err = LM_ERR_INVALID;
  g->errmsg = lm_sb_take(&sb);
}

static void oom(lm_graph_t *g) {
  if (!g->err) {
    g->err = LM_ERR_NOMEM;
    g->errmsg = NULL;
  }
}

uint32_t lm_graph_push_node(lm_graph_t *g, const lm_node *n) {
  if (!LM_GROW(g->nodes, g->nodecap, g->nnodes + 1)) return oom(g), 0;
  g->nodes[g->nnodes] = *n;
  return (uint32_t)g->nnodes++;
}

uint32_t lm_graph_push_view(lm_graph_t *g, const lm_view *v) {
  if (!LM_GROW(g->views, g->viewcap, g->nviews + 1)) return oom(g), 0;
  g->views[g->nviews] = *v;
  return (uint32_t)g->nviews++;
}

size_t lm_graph_node_count(const lm_graph_t *g) { return g ? g->nnodes - 1 : 0; }

/* ---------------------------------------------------------------- dimensions */

lm_expr lm_dim_expr(lm_graph_t *g, lm_dim d) {
  if (d >= 0) return lm_x_const(&g->x, d);
  if (d == INT64_MIN) return 0;
  uint64_t id = (uint64_t)(-d);
  return id < g->x.n && lm_expr_is_dim(&g->x, (lm_expr)id) ? (lm_expr)id : 0;
}

lm_dim lm_expr_dim(const lm_graph_t *g, lm_expr e) {
  const lm_xnode *n = lm_x_node(&g->x, e);
  return n->op == LM_X_CONST && n->v >= 0 ? n->v : -(lm_dim)e;
}

static void oom(lm_graph_t *g);

static lm_dim canon_dim(lm_graph_t *g, lm_expr e) {
  lm_expr s = e ? lm_x_simplify(&g->x, e, NULL) : 0;
  if (!s) return oom(g), 0;
  return lm_expr_dim(g, s);
}

static int identifier(const char *s) {
  if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return 0;
  for (; *s; s++)
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
  return 1;
}

lm_dim lm_sym_min(lm_graph_t *g, const char *name, int64_t least) {
  if (!g || !name) return 0;
  if (!identifier(name)) {
    lm_graph_error(g, 0, "symbol name '%s' is not an identifier (letters, digits, _)", name);
    return 0;
  }
  int s = lm_x_symbol(&g->x, name, least);
  if (s < 0) return oom(g), 0;
  if (g->x.syms[s].least != least) {
    lm_graph_error(g, 0, "symbol %s declared with least value %lld and %lld", name, (long long)g->x.syms[s].least,
                   (long long)least);
    return 0;
  }
  lm_expr e = lm_x_sym(&g->x, s);
  if (!e) return oom(g), 0;
  return lm_expr_dim(g, e);
}

lm_dim lm_sym(lm_graph_t *g, const char *name) { return lm_sym_min(g, name, 1); }

lm_status lm_sym_hint(lm_graph_t *g, const char *name, int64_t value) {
  if (!g || !name) return lm_fail(LM_ERR_INVALID, "lm_sym_hint: a NULL graph or name");
  for (size_t i = 0; i < g->x.nsyms; i++) {
    if (strcmp(g->x.syms[i].name, name)) continue;
    if (value < g->x.syms[i].least || value < 1)
      return lm_fail(LM_ERR_INVALID, "lm_sym_hint: %s = %lld is below its least value %lld", name, (long long)value,
                     (long long)(g->x.syms[i].least > 1 ? g->x.syms[i].least : 1));
    g->x.syms[i].hint = value;
    return LM_OK;
  }
  return lm_fail(LM_ERR_INVALID, "lm_sym_hint: the graph has no symbol %s", name);
}

lm_dim lm_dim_mul(lm_graph_t *g, lm_dim a, lm_dim b) {
  return canon_dim(g, lm_x_mul(&g->x, lm_dim_expr(g, a), lm_dim_expr(g, b)));
}

lm_dim lm_dim_add(lm_graph_t *g, lm_dim a, lm_dim b) {
  return canon_dim(g, lm_x_add(&g->x, lm_dim_expr(g, a), lm_dim_expr(g, b)));
}

const char *lm_dim_str(const lm_graph_t *g, lm_dim d, char *buf, size_t cap) {
  if (!cap) return buf;
  if (d >= 0) {
    snprintf(buf, cap, "%lld", (long long)d);
    return buf;
  }
  lm_sb sb = {0};
  lm_x_print(&g->x, lm_dim_expr((lm_graph_t *)g, d), &sb, "i");
  snprintf(buf, cap, "%s", sb.s ? sb.s : "?");
  lm_sb_free(&sb);
  return buf;
}

int lm_dim_equal(const lm_graph_t *g, lm_dim a, lm_dim b) {
  lm_graph_t *mg = (lm_graph_t *)g; /* simplification interns new nodes */
  return lm_x_prove_eq(&mg->x, lm_dim_expr(mg, a), lm_dim_expr(mg, b));
}

static int dims_equal(lm_graph_t *g, lm_expr a, lm_expr b) { return lm_x_prove_eq(&g->x, a, b); }

lm_expr lm_shape_numel(lm_graph_t *g, const lm_shape *s) {
  lm_expr n = lm_x_const(&g->x, 1);
  for (int i = 0; i < s->rank; i++) n = lm_x_mul(&g->x, n, s->dim[i]);
  return lm_x_simplify(&g->x, n, NULL);
}

lm_expr lm_shape_flat(lm_graph_t *g, const lm_shape *s, const lm_expr *idx) {
  lm_expr flat = lm_x_const(&g->x, 0), stride = lm_x_const(&g->x, 1);
  for (int i = s->rank - 1; i >= 0; i--) {
    flat = lm_x_add(&g->x, flat, lm_x_mul(&g->x, idx[i], stride));
    stride = lm_x_mul(&g->x, stride, s->dim[i]);
  }
  return flat;
}

void lm_shape_print(const lm_graph_t *g, const lm_shape *s, lm_sb *sb) {
  lm_sb_puts(sb, "[");
  for (int i = 0; i < s->rank; i++) {
    if (i) lm_sb_puts(sb, ",");
    lm_x_print(&g->x, s->dim[i], sb, "i");
  }
  lm_sb_puts(sb, "]");
}

static char *shape_str(const lm_graph_t *g, const lm_shape *s) {
  static _Thread_local char buf[2][256];
  static _Thread_local int k;
  lm_sb sb = {0};
  lm_shape_print(g, s, &sb);
  k ^= 1;
  snprintf(buf[k], sizeof buf[k], "%s", sb.s ? sb.s : "?");
  lm_sb_free(&sb);
  return buf[k];
}

/* ---------------------------------------------------------------- tensors */

static const lm_tensor invalid_tensor = {0};

static int ok(lm_tensor t) {
  return t.g && t.node && t.node < t.g->nnodes && t.view < t.g->nviews && !t.g->err;
}

int lm_tensor_ok(lm_tensor t) { return ok(t); }

const lm_shape *lm_edge_shape(const lm_graph_t *g, lm_edge e) {
  return e.view ? &g->views[e.view].shape : &g->nodes[e.node].shape;
}

static const lm_shape *tshape(lm_tensor t) { return lm_edge_shape(t.g, lm_edge_of(t)); }

int lm_rank(lm_tensor t) { return ok(t) ? tshape(t)->rank : -1; }

static int norm_axis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

lm_dim lm_dim_of(lm_tensor t, int axis) {
  if (!ok(t)) return 0;
  const lm_shape *s = tshape(t);
  axis = norm_axis(axis, s->rank);
  if (axis < 0 || axis >= s->rank) return 0;
  return lm_expr_dim(t.g, s->dim[axis]);
}

static int shape_from_dims(lm_graph_t *g, int rank, const lm_dim *dims, lm_shape *s, const char *what) {
  if (rank < 0 || rank > LM_MAX_RANK) {
    lm_graph_error(g, 0, "%s: rank %d is outside 0..%d", what, rank, LM_MAX_RANK);
    return 0;
  }
  s->rank = rank;
  for (int i = 0; i < rank; i++) {
    s->dim[i] = lm_dim_expr(g, dims[i]);
    if (!s->dim[i]) {
      lm_graph_error(g, 0, "%s: dimension %d (%lld) is not a dimension of this graph", what, i, (long long)dims[i]);
      return 0;
    }
    s->dim[i] = lm_x_simplify(&g->x, s->dim[i], NULL);
  }
  return 1;
}

static lm_tensor make(lm_graph_t *g, const lm_node *n) {
  uint32_t id = lm_graph_push_node(g, n);
  return id ? (lm_tensor){g, id, 0} : invalid_tensor;
}

lm_tensor lm_input(lm_graph_t *g, const char *name, lm_role role, int rank, const lm_dim *shape) {
  if (!g || g->err) return invalid_tensor;
  if (!name || !*name) return lm_graph_error(g, 0, "input: empty name"), invalid_tensor;
  if ((unsigned)role >= LM_ROLE_COUNT) return lm_graph_error(g, 0, "input %s: bad role %d", name, (int)role), invalid_tensor;
  for (size_t i = 0; i < g->ninputs; i++)
    if (!strcmp(g->inputs[i].name, name)) return lm_graph_error(g, 0, "input %s: name already used", name), invalid_tensor;
  for (size_t i = 0; i < g->noutputs; i++)
    if (!strcmp(g->outputs[i].name, name))
      return lm_graph_error(g, 0, "input %s: name already used by an output", name), invalid_tensor;
  lm_node n = {.op = LM_OP_INPUT, .input = (uint32_t)g->ninputs};
  if (!shape_from_dims(g, rank, shape, &n.shape, name)) return invalid_tensor;
  char *copy = lm_strdup(name);
  if (!copy || !LM_GROW(g->inputs, g->inputcap, g->ninputs + 1)) return lm_free(copy), oom(g), invalid_tensor;
  lm_tensor t = make(g, &n);
  if (!t.node) return lm_free(copy), invalid_tensor;
  g->inputs[g->ninputs++] = (lm_input_info){copy, (uint8_t)role, t.node};
  return t;
}

lm_tensor lm_graph_input(lm_graph_t *g, const char *name) {
  if (!g || !name) return invalid_tensor;
  for (size_t i = 0; i < g->ninputs; i++)
    if (!strcmp(g->inputs[i].name, name)) return (lm_tensor){g, g->inputs[i].node, 0};
  return invalid_tensor;
}

lm_tensor lm_const(lm_graph_t *g, float value) {
  if (!g || g->err) return invalid_tensor;
  lm_node n = {.op = LM_OP_CONST, .value = value};
  return make(g, &n);
}

lm_tensor lm_rand_stream(lm_graph_t *g, uint32_t stream, int rank, const lm_dim *shape) {
  if (!g || g->err) return invalid_tensor;
  lm_node n = {.op = LM_OP_RAND, .stream = stream};
  if (!shape_from_dims(g, rank, shape, &n.shape, "rand")) return invalid_tensor;
  if (stream == UINT32_MAX) return lm_graph_error(g, 0, "rand: stream %u is reserved", stream), invalid_tensor;
  if (stream >= g->next_stream) g->next_stream = stream + 1;
  return make(g, &n);
}

lm_tensor lm_rand(lm_graph_t *g, int rank, const lm_dim *shape) {
  return g ? lm_rand_stream(g, g->next_stream, rank, shape) : invalid_tensor;
}

static lm_tensor unary(lm_op op, lm_tensor x) {
  if (!ok(x)) return invalid_tensor;
  lm_node n = {.op = (uint8_t)op, .nsrc = 1, .src = {lm_edge_of(x)}, .shape = *tshape(x)};
  return make(x.g, &n);
}

lm_tensor lm_log2(lm_tensor x) { return unary(LM_OP_LOG2, x); }
lm_tensor lm_exp2(lm_tensor x) { return unary(LM_OP_EXP2, x); }
lm_tensor lm_sin(lm_tensor x) { return unary(LM_OP_SIN, x); }
lm_tensor lm_sqrt(lm_tensor x) { return unary(LM_OP_SQRT, x); }
lm_tensor lm_recip(lm_tensor x) { return unary(LM_OP_RECIP, x); }
lm_tensor lm_contiguous(lm_tensor x) { return unary(LM_OP_CONTIGUOUS, x); }

static lm_tensor binary(lm_op op, lm_tensor a, lm_tensor b) {
  if (!ok(a) || !ok(b)) return invalid_tensor;
  lm_graph_t *g = a.g;
  if (b.g != g) return lm_graph_error(g, 0, "%s: operands belong to different graphs", lm_op_name(op)), invalid_tensor;
  const lm_shape *sa = tshape(a), *sb = tshape(b);
  int r = sa->rank > sb->rank ? sa->rank : sb->rank;
  lm_dim out[LM_MAX_RANK];
  for (int i = 0; i < r; i++) {
    int ia = i - (r - sa->rank), ib = i - (r - sb->rank);
    lm_expr da = ia >= 0 ? sa->dim[ia] : lm_x_const(&g->x, 1);
    lm_expr db = ib >= 0 ? sb->dim[ib] : lm_x_const(&g->x, 1);
    lm_expr d;
    if (dims_equal(g, da, db) || lm_x_is_const(&g->x, db, 1)) d = da;
    else if (lm_x_is_const(&g->x, da, 1)) d = db;
    else {
      lm_graph_error(g, 0, "%s: shapes %s and %s do not broadcast (axis %d)", lm_op_name(op), shape_str(g, sa),
                     shape_str(g, sb), i);
      return invalid_tensor;
    }
    out[i] = lm_expr_dim(g, d);
  }
  a = lm_broadcast_to(a, r, out);
  b = lm_broadcast_to(b, r, out);
  if (!ok(a) || !ok(b)) return invalid_tensor;
  lm_node n = {.op = (uint8_t)op, .nsrc = 2, .src = {lm_edge_of(a), lm_edge_of(b)}, .shape = *tshape(a)};
  return make(g, &n);
}

lm_tensor lm_add(lm_tensor a, lm_tensor b) { return binary(LM_OP_ADD, a, b); }
lm_tensor lm_mul(lm_tensor a, lm_tensor b) { return binary(LM_OP_MUL, a, b); }
lm_tensor lm_mod(lm_tensor a, lm_tensor b) { return binary(LM_OP_MOD, a, b); }
lm_tensor lm_less_than(lm_tensor a, lm_tensor b) { return binary(LM_OP_LESS_THAN, a, b); }

static lm_tensor reduce(lm_op op, lm_tensor x, int axis) {
  if (!ok(x)) return invalid_tensor;
  const lm_shape *s = tshape(x);
  int a = norm_axis(axis, s->rank);
  if (a < 0 || a >= s->rank) {
    lm_graph_error(x.g, 0, "%s: axis %d out of range for shape %s", lm_op_name(op), axis, shape_str(x.g, s));
    return invalid_tensor;
  }
  lm_node n = {.op = (uint8_t)op, .nsrc = 1, .axis = (int8_t)a, .src = {lm_edge_of(x)}};
  n.shape.rank = s->rank - 1;
  for (int i = 0, k = 0; i < s->rank; i++)
    if (i != a) n.shape.dim[k++] = s->dim[i];
  return make(x.g, &n);
}

lm_tensor lm_sum_reduce(lm_tensor x, int axis) { return reduce(LM_OP_SUM_REDUCE, x, axis); }
lm_tensor lm_max_reduce(lm_tensor x, int axis) { return reduce(LM_OP_MAX_REDUCE, x, axis); }

/* ---------------------------------------------------------------- views */

static lm_tensor push_view(lm_tensor x, lm_view v) {
  v.parent = x.view;
  uint32_t id = lm_graph_push_view(x.g, &v);
  return id ? (lm_tensor){x.g, x.node, id} : invalid_tensor;
}

lm_tensor lm_permute(lm_tensor x, const int *perm) {
  if (!ok(x)) return invalid_tensor;
  const lm_shape *s = tshape(x);
  lm_view v = {.kind = LM_V_PERMUTE, .shape = {.rank = s->rank}};
  int seen[LM_MAX_RANK] = {0}, identity = 1;
  for (int i = 0; i < s->rank; i++) {
    int p = norm_axis(perm[i], s->rank);
    if (p < 0 || p >= s->rank || seen[p]++) {
      lm_graph_error(x.g, 0, "permute: entry %d (%d) does not form a permutation of %d axes", i, perm[i], s->rank);
      return invalid_tensor;
    }
    v.perm[i] = (int8_t)p;
    v.shape.dim[i] = s->dim[p];
    identity &= p == i;
  }
  return identity ? x : push_view(x, v);
}

lm_tensor lm_expand(lm_tensor x, int axis, lm_dim n) {
  if (!ok(x)) return invalid_tensor;
  const lm_shape *s = tshape(x);
  int a = axis < 0 ? axis + s->rank + 1 : axis;
  if (a < 0 || a > s->rank || s->rank == LM_MAX_RANK) {
    lm_graph_error(x.g, 0, "expand: cannot insert axis %d into shape %s", axis, shape_str(x.g, s));
    return invalid_tensor;
  }
  lm_expr e = lm_dim_expr(x.g, n);
  if (!e) return lm_graph_error(x.g, 0, "expand: %lld is not a dimension of this graph", (long long)n), invalid_tensor;
  lm_view v = {.kind = LM_V_EXPAND, .axis = (int8_t)a, .p0 = lm_x_simplify(&x.g->x, e, NULL)};
  v.shape.rank = s->rank + 1;
  for (int i = 0, k = 0; i < v.shape.rank; i++) v.shape.dim[i] = i == a ? v.p0 : s->dim[k++];
  return push_view(x, v);
}

lm_tensor lm_reshape(lm_tensor x, int rank, const lm_dim *shape) {
  if (!ok(x)) return invalid_tensor;
  lm_view v = {.kind = LM_V_RESHAPE};
  if (!shape_from_dims(x.g, rank, shape, &v.shape, "reshape")) return invalid_tensor;
  const lm_shape *s = tshape(x);
  if (!dims_equal(x.g, lm_shape_numel(x.g, s), lm_shape_numel(x.g, &v.shape))) {
    lm_graph_error(x.g, 0, "reshape: %s and %s hold different element counts", shape_str(x.g, s),
                   shape_str(x.g, &v.shape));
    return invalid_tensor;
  }
  int same = s->rank == rank;
  for (int i = 0; i < rank && same; i++) same = s->dim[i] == v.shape.dim[i];
  return same ? x : push_view(x, v);
}

lm_tensor lm_broadcast_to(lm_tensor x, int rank, const lm_dim *shape) {
  if (!ok(x)) return invalid_tensor;
  lm_graph_t *g = x.g;
  int r0 = tshape(x)->rank;
  if (rank < r0 || rank > LM_MAX_RANK) {
    lm_graph_error(g, 0, "broadcast: cannot broadcast rank %d to rank %d", r0, rank);
    return invalid_tensor;
  }
  for (int i = 0; i < rank - r0; i++) x = lm_expand(x, i, shape[i]);
  for (int i = rank - r0; i < rank && ok(x); i++) {
    lm_expr have = tshape(x)->dim[i], want = lm_dim_expr(g, shape[i]);
    if (!want) return lm_graph_error(g, 0, "broadcast: bad dimension %lld", (long long)shape[i]), invalid_tensor;
    if (dims_equal(g, have, want)) continue;
    if (!lm_x_is_const(&g->x, have, 1)) {
      lm_graph_error(g, 0, "broadcast: axis %d of %s cannot stretch to %lld", i, shape_str(g, tshape(x)),
                     (long long)shape[i]);
      return invalid_tensor;
    }
    /* drop the extent-1 axis, then insert the broadcast one in its place */
    lm_dim dims[LM_MAX_RANK];
    const lm_shape *s = tshape(x);
    for (int k = 0, j = 0; k < s->rank; k++)
      if (k != i) dims[j++] = lm_expr_dim(g, s->dim[k]);
    x = lm_expand(lm_reshape(x, s->rank - 1, dims), i, shape[i]);
  }
  return x;
}

lm_tensor lm_slice(lm_tensor x, int axis, lm_dim start, lm_dim end) {
  if (!ok(x)) return invalid_tensor;
  lm_graph_t *g = x.g;
  const lm_shape *s = tshape(x);
  int a = norm_axis(axis, s->rank);
  if (a < 0 || a >= s->rank) return lm_graph_error(g, 0, "slice: axis %d out of range for %s", axis, shape_str(g, s)), invalid_tensor;
  lm_expr e0 = lm_dim_expr(g, start), e1 = lm_dim_expr(g, end);
  if (!e0 || !e1) return lm_graph_error(g, 0, "slice: bad bounds"), invalid_tensor;
  e0 = lm_x_simplify(&g->x, e0, NULL);
  e1 = lm_x_simplify(&g->x, e1, NULL);
  if (lm_x_prove_gt(&g->x, e0, e1, NULL) || lm_x_prove_gt(&g->x, e1, s->dim[a], NULL)) {
    char b0[64], b1[64];
    lm_graph_error(g, 0, "slice: [%s, %s) is not within axis %d of %s", lm_dim_str(g, start, b0, sizeof b0),
                   lm_dim_str(g, end, b1, sizeof b1), a, shape_str(g, s));
    return invalid_tensor;
  }
  if (lm_x_is_const(&g->x, e0, 0) && dims_equal(g, e1, s->dim[a])) return x;
  lm_view v = {.kind = LM_V_SLICE, .axis = (int8_t)a, .p0 = e0, .p1 = e1, .shape = *s};
  v.shape.dim[a] = lm_x_simplify(&g->x, lm_x_sub(&g->x, e1, e0), NULL);
  return push_view(x, v);
}

lm_tensor lm_pad(lm_tensor x, int axis, lm_dim before, lm_dim after) {
  if (!ok(x)) return invalid_tensor;
  lm_graph_t *g = x.g;
  const lm_shape *s = tshape(x);
  int a = norm_axis(axis, s->rank);
  if (a < 0 || a >= s->rank) return lm_graph_error(g, 0, "pad: axis %d out of range for %s", axis, shape_str(g, s)), invalid_tensor;
  lm_expr e0 = lm_dim_expr(g, before), e1 = lm_dim_expr(g, after);
  if (!e0 || !e1) return lm_graph_error(g, 0, "pad: bad amounts"), invalid_tensor;
  if (lm_x_is_const(&g->x, e0, 0) && lm_x_is_const(&g->x, e1, 0)) return x;
  lm_view v = {.kind = LM_V_PAD, .axis = (int8_t)a, .p0 = e0, .p1 = e1, .shape = *s};
  v.shape.dim[a] = lm_x_simplify(&g->x, lm_x_add(&g->x, lm_x_add(&g->x, e0, s->dim[a]), e1), NULL);
  return push_view(x, v);
}

lm_tensor lm_affine_mod(lm_tensor x, int axis, lm_dim a, lm_dim b) {
  if (!ok(x)) return invalid_tensor;
  lm_graph_t *g = x.g;
  const lm_shape *s = tshape(x);
  int ax = norm_axis(axis, s->rank);
  if (ax < 0 || ax >= s->rank) return lm_graph_error(g, 0, "affine_mod: axis %d out of range for %s", axis, shape_str(g, s)), invalid_tensor;
  lm_expr ea = lm_dim_expr(g, a), eb = lm_dim_expr(g, b);
  if (!ea || !eb) return lm_graph_error(g, 0, "affine_mod: bad coefficients"), invalid_tensor;
  lm_view v = {.kind = LM_V_AFFINE_MOD, .axis = (int8_t)ax, .p0 = ea, .p1 = eb, .shape = *s};
  return push_view(x, v);
}

/* ---------------------------------------------------------------- index math */

void lm_edge_index_nd(lm_graph_t *g, lm_edge e, const lm_expr *idx_in, const lm_xctx *ctx, lm_expr *src_idx,
                      lm_expr *valid) {
  lm_exprs *x = &g->x;
  lm_expr idx[LM_MAX_RANK], tmp[LM_MAX_RANK];
  const lm_shape *cur = lm_edge_shape(g, e);
  memcpy(idx, idx_in, (size_t)cur->rank * sizeof *idx);
  lm_expr ok_e = lm_x_const(x, 1);
  for (uint32_t vi = e.view; vi; vi = g->views[vi].parent) {
    const lm_view *v = &g->views[vi];
    const lm_shape *in = v->parent ? &g->views[v->parent].shape : &g->nodes[e.node].shape;
    int a = v->axis;
    switch (v->kind) {
    case LM_V_PERMUTE:
      for (int j = 0; j < v->shape.rank; j++) tmp[v->perm[j]] = idx[j];
      memcpy(idx, tmp, (size_t)in->rank * sizeof *idx);
      break;
    case LM_V_EXPAND:
      memmove(&idx[a], &idx[a + 1], (size_t)(v->shape.rank - a - 1) * sizeof *idx);
      break;
    case LM_V_SLICE: idx[a] = lm_x_add(x, idx[a], v->p0); break;
    case LM_V_PAD: {
      lm_expr lo = lm_x_lt(x, lm_x_sub(x, v->p0, lm_x_const(x, 1)), idx[a]);
      lm_expr hi = lm_x_lt(x, idx[a], lm_x_add(x, v->p0, in->dim[a]));
      ok_e = lm_x_and(x, ok_e, lm_x_and(x, lo, hi));
      idx[a] = lm_x_sub(x, idx[a], v->p0);
      break;
    }
    case LM_V_RESHAPE: {
      lm_expr lin = lm_shape_flat(g, &v->shape, idx), stride = lm_x_const(x, 1);
      for (int k = in->rank - 1; k >= 0; k--) {
        tmp[k] = lm_x_mod(x, lm_x_div(x, lin, stride), in->dim[k]);
        stride = lm_x_mul(x, stride, in->dim[k]);
      }
      memcpy(idx, tmp, (size_t)in->rank * sizeof *idx);
      break;
    }
    case LM_V_AFFINE_MOD:
      idx[a] = lm_x_mod(x, lm_x_add(x, lm_x_mul(x, v->p0, idx[a]), v->p1), in->dim[a]);
      break;
    default: LM_ASSERT(!"bad view kind");
    }
    /* simplify step by step: raw chains share subterms and would expand exponentially */
    for (int i = 0; i < in->rank; i++) idx[i] = lm_x_simplify(x, idx[i], ctx);
    ok_e = lm_x_simplify(x, ok_e, ctx);
  }
  for (int i = 0; i < g->nodes[e.node].shape.rank; i++) src_idx[i] = lm_x_simplify(x, idx[i], ctx);
  *valid = lm_x_simplify(x, ok_e, ctx);
}

void lm_edge_index(lm_graph_t *g, lm_edge e, const lm_expr *idx, const lm_xctx *ctx, lm_expr *flat, lm_expr *valid) {
  lm_expr src[LM_MAX_RANK];
  lm_edge_index_nd(g, e, idx, ctx, src, valid);
  *flat = lm_x_simplify(&g->x, lm_shape_flat(g, &g->nodes[e.node].shape, src), ctx);
}

/* ---------------------------------------------------------------- outputs, assigns */

lm_status lm_output(lm_tensor t, const char *name) {
  if (!t.g) return lm_fail(LM_ERR_INVALID, "output: tensor has no graph");
  lm_graph_t *g = t.g;
  if (!ok(t)) return lm_fail(LM_ERR_INVALID, "output %s: %s", name ? name : "?", g->errmsg ? g->errmsg : "invalid tensor");
  if (!name || !*name) return lm_fail(LM_ERR_INVALID, "output: empty name");
  for (size_t i = 0; i < g->noutputs; i++)
    if (!strcmp(g->outputs[i].name, name)) return lm_fail(LM_ERR_INVALID, "output %s: name already used", name);
  for (size_t i = 0; i < g->ninputs; i++)
    if (!strcmp(g->inputs[i].name, name)) return lm_fail(LM_ERR_INVALID, "output %s: name already used by an input", name);
  char *copy = lm_strdup(name);
  if (!copy || !LM_GROW(g->outputs, g->outputcap, g->noutputs + 1)) return lm_free(copy), LM_ERR_NOMEM;
  g->outputs[g->noutputs++] = (lm_output_info){copy, lm_edge_of(t)};
  return LM_OK;
}

lm_status lm_assign(lm_tensor target, lm_tensor value) {
  if (!ok(target) || !ok(value)) return lm_fail(LM_ERR_INVALID, "assign: invalid tensor");
  lm_graph_t *g = target.g;
  if (value.g != g) return lm_fail(LM_ERR_INVALID, "assign: tensors of different graphs");
  const lm_node *n = &g->nodes[target.node];
  if (n->op != LM_OP_INPUT || target.view)
    return lm_fail(LM_ERR_INVALID, "assign: target node %%%u is not an input seen without a view", target.node);
  const lm_input_info *in = &g->inputs[n->input];
  if (in->role == LM_ROLE_DATA)
    return lm_fail(LM_ERR_INVALID, "assign: input %s is data; only state and parameters persist", in->name);
  for (size_t i = 0; i < g->nassigns; i++)
    if (g->assigns[i].target == target.node) return lm_fail(LM_ERR_INVALID, "assign: input %s is already assigned", in->name);
  const lm_shape *sv = tshape(value);
  int same = sv->rank == n->shape.rank;
  for (int i = 0; i < sv->rank && same; i++) same = dims_equal(g, sv->dim[i], n->shape.dim[i]);
  if (!same)
    return lm_fail(LM_ERR_INVALID, "assign: %s has shape %s but the value has shape %s", in->name, shape_str(g, &n->shape),
                   shape_str(g, sv));
  if (!LM_GROW(g->assigns, g->assigncap, g->nassigns + 1)) return LM_ERR_NOMEM;
  g->assigns[g->nassigns++] = (lm_assign_info){target.node, lm_edge_of(value)};
  return LM_OK;
}

/* ---------------------------------------------------------------- copies and order */

lm_graph_t *lm_graph_clone(const lm_graph_t *src) {
  lm_graph_t *g = lm_calloc(1, sizeof *g);
  if (!g) return NULL;
  *g = *src;
  g->nodes = NULL, g->views = NULL, g->inputs = NULL, g->outputs = NULL, g->assigns = NULL, g->errmsg = NULL;
  g->nodecap = g->viewcap = g->inputcap = g->outputcap = g->assigncap = 0;
  g->ninputs = g->noutputs = 0;
  lm_exprs_init(&g->x);
  int fine = LM_GROW(g->nodes, g->nodecap, src->nnodes) && LM_GROW(g->views, g->viewcap, src->nviews) &&
             LM_GROW(g->inputs, g->inputcap, src->ninputs + 1) && LM_GROW(g->outputs, g->outputcap, src->noutputs + 1) &&
             LM_GROW(g->assigns, g->assigncap, src->nassigns + 1) && lm_exprs_copy(&g->x, &src->x);
  if (fine) {
    memcpy(g->nodes, src->nodes, src->nnodes * sizeof *g->nodes);
    memcpy(g->views, src->views, src->nviews * sizeof *g->views);
    if (src->nassigns) memcpy(g->assigns, src->assigns, src->nassigns * sizeof *g->assigns);
    for (; fine && g->ninputs < src->ninputs; g->ninputs++) {
      g->inputs[g->ninputs] = src->inputs[g->ninputs];
      fine = (g->inputs[g->ninputs].name = lm_strdup(src->inputs[g->ninputs].name)) != NULL;
    }
    for (; fine && g->noutputs < src->noutputs; g->noutputs++) {
      g->outputs[g->noutputs] = src->outputs[g->noutputs];
      fine = (g->outputs[g->noutputs].name = lm_strdup(src->outputs[g->noutputs].name)) != NULL;
    }
    if (fine && src->errmsg) fine = (g->errmsg = lm_strdup(src->errmsg)) != NULL;
  }
  if (!fine) {
    lm_graph_free(g);
    return NULL;
  }
  return g;
}

uint32_t *lm_graph_topo_order(const lm_graph_t *g, size_t *count) {
  size_t n = g->nnodes;
  uint32_t *order = lm_malloc(n * sizeof *order), *stack = lm_malloc(2 * n * sizeof *stack);
  uint8_t *mark = lm_calloc(n, 1); /* 0 new, 1 on stack, 2 done */
  size_t k = 0;
  if (!order || !stack || !mark) goto fail;
  for (uint32_t root = 1; root < n; root++) {
    if (mark[root]) continue;
    size_t sp = 0;
    stack[sp++] = root;
    mark[root] = 1;
    while (sp) {
      uint32_t v = stack[sp - 1];
      const lm_node *nd = &g->nodes[v];
      int pushed = 0;
      for (int i = 0; i < nd->nsrc && !pushed; i++) {
        uint32_t s = nd->src[i].node;
        if (s == 0 || s >= n) continue; /* the validator reports dangling sources */
        if (mark[s] == 1) {
          lm_fail(LM_ERR_INVALID, "node %%%u (%s): cycle through node %%%u", v, lm_op_name((lm_op)nd->op), s);
          goto fail;
        }
        if (!mark[s]) {
          mark[s] = 1;
          stack[sp++] = s;
          pushed = 1;
        }
      }
      if (!pushed) {
        mark[v] = 2;
        order[k++] = v;
        sp--;
      }
    }
  }
  lm_free(stack);
  lm_free(mark);
  *count = k;
  return order;
fail:
  lm_free(order);
  lm_free(stack);
  lm_free(mark);
  return NULL;
}
