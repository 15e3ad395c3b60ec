/* compiler/autograd.c — reverse-mode autograd as a graph transformation (lumen/autograd.h):
 * the local derivative of every primitive, the inverse of every view kind on the edges, and
 * gradient accumulation, all appended to the loss's graph as ordinary primitives and views.
 * Also lm_detach, the stop-gradient. */
#include <string.h>

#include "graph-impl.h"
#include "lumen/autograd.h"
#include "lumen/ops.h"

#define LM_LN2 0.693147180559945309417f   /* ln 2 */
#define LM_LOG2E 1.44269504088896340736f  /* 1 / ln 2 */

static const lm_tensor invalid = {0};

typedef struct grad_ctx {
  lm_graph_t *g;
  size_t nnodes;   /* nodes that existed when lm_grad was called: the only ones differentiated */
  lm_tensor *grad; /* per node: accumulated gradient (node == 0: none yet) */
  uint8_t *reach;  /* per node: depends on a wrt node through differentiable edges */
} grad_ctx;

static lm_dim dim_of_expr(lm_graph_t *g, lm_expr e) { return lm_expr_dim(g, lm_x_simplify(&g->x, e, NULL)); }

static int expr_const(lm_graph_t *g, lm_expr e, int64_t *v) {
  const lm_xnode *n = lm_x_node(&g->x, lm_x_simplify(&g->x, e, NULL));
  if (n->op != LM_X_CONST) return 0;
  *v = n->v;
  return 1;
}

/* The inverse of a modulo n, or 0 when gcd(a, n) != 1. */
static int64_t mod_inverse(int64_t a, int64_t n) {
  int64_t r0 = n, r1 = a % n, t0 = 0, t1 = 1;
  while (r1) {
    int64_t q = r0 / r1, r = r0 - q * r1, t = t0 - q * t1;
    r0 = r1, r1 = r;
    t0 = t1, t1 = t;
  }
  if (r0 != 1) return 0;
  return t0 < 0 ? t0 + n : t0;
}

/* d (seen as y = x[(a*i + b) mod n] along `axis`) pulled back to x: x'[j] = sum_i [(a*i+b) mod n == j] d[i]. */
static lm_tensor affine_mod_back(lm_graph_t *g, lm_tensor d, int axis, lm_expr ea, lm_expr eb, lm_expr en) {
  int64_t a, b, n;
  if (expr_const(g, ea, &a) && expr_const(g, eb, &b) && expr_const(g, en, &n) && n > 0) {
    int64_t inv = mod_inverse(((a % n) + n) % n, n);
    if (n == 1) return d; /* the only index is 0 */
    if (inv) {
      /* i = a^-1 (j - b) mod n: another affine map */
      int64_t nb = (n - (inv * (b % n)) % n) % n;
      return lm_affine_mod(d, axis, inv, nb);
    }
  }
  /* General scatter: sel[j][i] = ((a*i + b) mod n == j); the map itself is a view of arange. */
  lm_dim nd = dim_of_expr(g, en);
  int r = lm_rank(d);
  if (r + 1 > LM_MAX_RANK) {
    lm_graph_error(g, 0, "grad: the gradient of affine_mod on a rank-%d tensor needs rank %d (max %d)", r, r + 1,
                   LM_MAX_RANK);
    return invalid;
  }
  lm_tensor ar = lm_arange(g, nd);
  lm_tensor src = lm_affine_mod(ar, 0, dim_of_expr(g, ea), dim_of_expr(g, eb)); /* [n] over i */
  lm_tensor sel = lm_eq(lm_expand(ar, 1, nd), lm_expand(src, 0, nd));        /* [n(j), n(i)] */
  lm_dim mshape[LM_MAX_RANK];
  mshape[0] = nd, mshape[1] = nd;
  for (int i = 2; i < r - axis + 1; i++) mshape[i] = 1;
  sel = lm_reshape(sel, r - axis + 1, mshape);
  /* d -> [.., n(j), n(i), ..], times sel, summed over i */
  return lm_sum_reduce(lm_mul(lm_expand(d, axis, nd), sel), axis + 1);
}

/* Moves a gradient d, shaped like edge e as its consumer sees it, back to the shape of e's
 * node by inverting the views of the chain, outermost first. */
static lm_tensor unview(lm_graph_t *g, lm_edge e, lm_tensor d) {
  for (uint32_t vi = e.view; vi && lm_tensor_ok(d);) {
    lm_view v = g->views[vi]; /* by value: building views may move the arena */
    lm_shape in = v.parent ? g->views[v.parent].shape : g->nodes[e.node].shape;
    int a = v.axis;
    switch (v.kind) {
    case LM_V_PERMUTE: {
      int inv[LM_MAX_RANK];
      for (int j = 0; j < v.shape.rank; j++) inv[v.perm[j]] = j;
      d = lm_permute(d, inv);
      break;
    }
    case LM_V_EXPAND: {
      int64_t one;
      if (expr_const(g, v.p0, &one) && one == 1) { /* an extent-1 axis: reshape it away */
        lm_dim dims[LM_MAX_RANK];
        for (int i = 0; i < in.rank; i++) dims[i] = lm_expr_dim(g, in.dim[i]);
        d = lm_reshape(d, in.rank, dims);
        break;
      }
      /* A run of expands (a broadcast over several axes, a convolution's weight over batch, rows
       * and columns) is summed innermost axis first: its loop nest then runs the outermost axis
       * outermost and reads each of its rows contiguously. Summed outermost first, the weight
       * gradient of MinAtar's convolution read the minibatch's observations column by column
       * through the permutation, one 64-byte line per product row. */
      int axes[LM_MAX_RANK], n = 0; /* the run's axes in the outermost view's numbering, ascending */
      for (;;) {
        int ax = v.axis, at = 0;
        for (; at < n && axes[at] <= ax; at++) ax++;
        memmove(axes + at + 1, axes + at, (size_t)(n - at) * sizeof *axes);
        axes[at] = ax, n++;
        const lm_view *p = v.parent ? &g->views[v.parent] : NULL;
        if (!p || p->kind != LM_V_EXPAND || (expr_const(g, p->p0, &one) && one == 1) || n == LM_MAX_RANK) break;
        vi = v.parent;
        v = g->views[vi];
      }
      while (n > 0 && lm_tensor_ok(d)) d = lm_sum_reduce(d, axes[--n]);
      break;
    }
    case LM_V_SLICE:
      d = lm_pad(d, a, lm_expr_dim(g, v.p0), dim_of_expr(g, lm_x_sub(&g->x, in.dim[a], v.p1)));
      break;
    case LM_V_PAD:
      d = lm_slice(d, a, lm_expr_dim(g, v.p0), dim_of_expr(g, lm_x_add(&g->x, v.p0, in.dim[a])));
      break;
    case LM_V_RESHAPE: {
      lm_dim dims[LM_MAX_RANK];
      for (int i = 0; i < in.rank; i++) dims[i] = lm_expr_dim(g, in.dim[i]);
      d = lm_reshape(d, in.rank, dims);
      break;
    }
    case LM_V_AFFINE_MOD: d = affine_mod_back(g, d, a, v.p0, v.p1, in.dim[a]); break;
    default: LM_ASSERT(!"bad view kind");
    }
    vi = v.parent;
  }
  return d;
}

/* Adds contribution d (in the consumer's view of edge e) to the gradient of e's node. */
static void accumulate(grad_ctx *c, lm_edge e, lm_tensor d) {
  if (!c->reach[e.node]) return;
  d = unview(c->g, e, d);
  lm_tensor *acc = &c->grad[e.node];
  *acc = acc->node ? lm_add(*acc, d) : d;
}

static lm_tensor node_t(lm_graph_t *g, uint32_t id) { return (lm_tensor){g, id, 0}; }
static lm_tensor edge_t(lm_graph_t *g, lm_edge e) { return (lm_tensor){g, e.node, e.view}; }

/* Pushes the gradient gy of node id (in its own shape) to its sources. */
static void backprop(grad_ctx *c, uint32_t id, lm_tensor gy) {
  lm_graph_t *g = c->g;
  lm_node n = g->nodes[id]; /* by value: new nodes may move the arena */
  lm_tensor y = node_t(g, id);
  lm_tensor x = n.nsrc > 0 ? edge_t(g, n.src[0]) : invalid;
  lm_tensor b = n.nsrc > 1 ? edge_t(g, n.src[1]) : invalid;
  int need0 = n.nsrc > 0 && c->reach[n.src[0].node], need1 = n.nsrc > 1 && c->reach[n.src[1].node];
  switch ((lm_op)n.op) {
  case LM_OP_INPUT:
  case LM_OP_CONST:
  case LM_OP_RAND:
  case LM_OP_LESS_THAN: /* piecewise constant: zero almost everywhere */
    return;
  case LM_OP_LOG2: /* 1 / (x ln 2) */
    accumulate(c, n.src[0], lm_mul(gy, lm_mul_scalar(lm_recip(x), LM_LOG2E)));
    return;
  case LM_OP_EXP2: /* ln 2 * exp2(x) = ln 2 * y */
    accumulate(c, n.src[0], lm_mul(gy, lm_mul_scalar(y, LM_LN2)));
    return;
  case LM_OP_SIN: accumulate(c, n.src[0], lm_mul(gy, lm_cos(x))); return;
  case LM_OP_SQRT: /* 1 / (2 sqrt x) = 0.5 / y */
    accumulate(c, n.src[0], lm_mul(gy, lm_mul_scalar(lm_recip(y), 0.5f)));
    return;
  case LM_OP_RECIP: /* -1/x^2 = -y*y */
    accumulate(c, n.src[0], lm_mul(gy, lm_neg(lm_square(y))));
    return;
  case LM_OP_ADD:
    if (need0) accumulate(c, n.src[0], gy);
    if (need1) accumulate(c, n.src[1], gy);
    return;
  case LM_OP_MUL:
    if (need0) accumulate(c, n.src[0], lm_mul(gy, b));
    if (need1) accumulate(c, n.src[1], lm_mul(gy, x));
    return;
  case LM_OP_MOD: /* fmod(a, b) = a - trunc(a/b) b; trunc(a/b) = (a - y) / b */
    if (need0) accumulate(c, n.src[0], gy);
    if (need1) accumulate(c, n.src[1], lm_mul(gy, lm_neg(lm_div(lm_sub(x, y), b))));
    return;
  case LM_OP_SUM_REDUCE: {
    lm_dim len = lm_expr_dim(g, lm_edge_shape(g, n.src[0])->dim[n.axis]);
    accumulate(c, n.src[0], lm_expand(gy, n.axis, len));
    return;
  }
  case LM_OP_MAX_REDUCE: { /* to the maxima, split equally between ties */
    lm_dim len = lm_expr_dim(g, lm_edge_shape(g, n.src[0])->dim[n.axis]);
    lm_tensor hit = lm_ge(x, lm_expand(y, n.axis, len)); /* x <= max: 1 exactly at the maxima */
    lm_tensor share = lm_mul(gy, lm_recip(lm_sum_reduce(hit, n.axis)));
    accumulate(c, n.src[0], lm_mul(hit, lm_expand(share, n.axis, len)));
    return;
  }
  case LM_OP_CONTIGUOUS: accumulate(c, n.src[0], gy); return;
  case LM_OP_COUNT: break;
  }
  LM_ASSERT(!"autograd: op without a derivative rule");
}

/* Every rule above is a case of this switch; a new op must add one (static check below). */
_Static_assert(LM_OP_CONTIGUOUS + 1 == LM_OP_COUNT, "autograd: every op needs a derivative rule");

static lm_status check_args(lm_tensor loss, const lm_tensor *wrt, int n, lm_tensor *grads) {
  if (n < 0 || (n > 0 && (!wrt || !grads))) return lm_fail(LM_ERR_INVALID, "grad: %d wrt tensors and NULL arrays", n);
  for (int i = 0; i < n; i++) grads[i] = invalid;
  if (!loss.g)
    return lm_fail(LM_ERR_INVALID,
                   "grad: the loss is an invalid tensor (a failed construction; lm_graph_validate names the error)");
  lm_graph_t *g = loss.g;
  if (g->err)
    return lm_fail(g->err, "grad: the loss's graph has an error: %s", g->errmsg ? g->errmsg : "out of memory");
  if (!lm_tensor_ok(loss)) return lm_fail(LM_ERR_INVALID, "grad: the loss is not a valid tensor of its graph");
  const lm_shape *ls = lm_edge_shape(g, lm_edge_of(loss));
  if (ls->rank != 0) {
    lm_sb sb = {0};
    lm_shape_print(g, ls, &sb);
    lm_status st = lm_fail(LM_ERR_INVALID,
                           "grad: the loss must be a scalar (rank 0) but has shape %s; reduce it first (lm_sum, "
                           "lm_mean)",
                           sb.s ? sb.s : "?");
    lm_sb_free(&sb);
    return st;
  }
  for (int i = 0; i < n; i++) {
    lm_tensor w = wrt[i];
    if (w.g != g)
      return lm_fail(LM_ERR_INVALID, "grad: wrt[%d] is %s", i,
                     w.g ? "a tensor of another graph than the loss's" : "an invalid tensor (no graph)");
    if (!w.node || w.node >= g->nnodes)
      return lm_fail(LM_ERR_INVALID, "grad: wrt[%d] (node %%%u) is not a node of the loss's graph", i, w.node);
    if (w.view)
      return lm_fail(LM_ERR_INVALID,
                     "grad: wrt[%d] (node %%%u) is seen through a view; pass the node itself (the tensor "
                     "lm_input or the op returned)",
                     i, w.node);
  }
  return LM_OK;
}

lm_status lm_grad(lm_tensor loss, const lm_tensor *wrt, int n, lm_tensor *grads) {
  lm_status st = check_args(loss, wrt, n, grads);
  if (st != LM_OK) return st;
  lm_graph_t *g = loss.g;
  grad_ctx c = {.g = g, .nnodes = g->nnodes};
  size_t norder = 0;
  uint32_t *order = lm_graph_topo_order(g, &norder);
  if (!order) return lm_fail(LM_ERR_INVALID, "grad: %s", lm_last_error());
  c.grad = lm_calloc(c.nnodes, sizeof *c.grad);
  c.reach = lm_calloc(c.nnodes, 1);
  if (!c.grad || !c.reach) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  for (int i = 0; i < n; i++) c.reach[wrt[i].node] = 1;
  for (size_t k = 0; k < norder; k++) {
    const lm_node *nd = &g->nodes[order[k]];
    if (nd->nograd) continue;
    for (int s = 0; s < nd->nsrc; s++) c.reach[order[k]] |= c.reach[nd->src[s].node];
  }
  if (c.reach[loss.node]) {
    c.grad[loss.node] = unview(g, lm_edge_of(loss), lm_const(g, 1.0f));
    for (size_t k = norder; k-- > 0;) {
      uint32_t id = order[k];
      if (!c.grad[id].node || g->nodes[id].nograd) continue;
      backprop(&c, id, c.grad[id]);
      if (g->err) break;
    }
  }
  for (int i = 0; i < n && !g->err; i++) {
    lm_tensor w = wrt[i];
    grads[i] = c.grad[w.node].node && !g->nodes[w.node].nograd ? c.grad[w.node] : lm_scalar_like(w, 0.0f);
  }
  if (g->err) {
    for (int i = 0; i < n; i++) grads[i] = invalid;
    st = lm_fail(g->err, "grad: building the gradient graph failed: %s", g->errmsg ? g->errmsg : "out of memory");
  }
done:
  lm_free(order);
  lm_free(c.grad);
  lm_free(c.reach);
  return st;
}

lm_tensor lm_detach(lm_tensor x) {
  if (!lm_tensor_ok(x)) return invalid;
  lm_tensor y = lm_add(x, lm_const(x.g, -0.0f));
  if (lm_tensor_ok(y)) y.g->nodes[y.node].nograd = 1;
  return y;
}
