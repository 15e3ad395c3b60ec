/* compiler/passes.c — canonicalisation: dead-code removal, CSE, constant folding and algebraic
 * identities over the graph IR, iterated to a fixed point. Each sweep rebuilds the graph fresh
 * (new arenas, nodes in topological order, views hash-consed so structurally equal chains
 * share an id); an interval analysis over the new nodes decides where identities are safe.
 *
 * Rewrites and their numerics (ref.c's float semantics; "exact" = bit-identical results for
 * every input, NaN payloads aside):
 *   fold      elementwise op of constants -> CONST (computed with ref.c's functions)   exact
 *   fold      sum/max over an empty axis -> 0 / -inf; max of a non-NaN constant over a
 *             non-empty axis -> it; sum of a zero constant -> +0                        exact
 *   identity  x + (-0) -> x                                                               exact
 *             x + (+0) -> x: exact when x is never -0; else ROUNDING (-0 + 0 is +0)
 *             x * 1 -> x                                                                exact
 *             x * (+-0) -> a zero, only for x provably finite and not NaN (interval
 *             analysis: constants, LESS_THAN, RAND, SIN of a finite value, sums and
 *             products of those, ...); exact when x's sign is known, else ROUNDING (sign
 *             of the zero)
 *             sum over an extent-1 axis -> reshape view: exact when the source is never -0
 *             (0 + -0 is +0), else ROUNDING; max over an extent-1 axis -> reshape view only
 *             when the source is never NaN (max ignores NaN)                           exact
 *             contiguous(x seen through a layout-preserving view) -> that view          exact
 *             recip(recip x) -> x                                                    ROUNDING
 *             log2(exp2 x) -> x (also where exp2 would over/underflow)               ROUNDING
 *             exp2(log2 x) -> x, only for x provably >= +0 or NaN (log2 of a negative
 *             is NaN and of -0 is -inf, which exp2 would not give back)              ROUNDING
 * ROUNDING rewrites are counted in lm_pass_stats.rounding and skipped with LM_CANON_EXACT.
 * The unary-pair rewrites look through the view between the two ops only when it has no PAD
 * (padding reads zeros, and f(0) != 0 for these f). */
#include "passes.h"

#include <math.h>
#include <string.h>

enum { MAX_SWEEPS = 1000 };

/* What a node's values may be: every value compares within [lo, hi]; nan: may be NaN;
 * nz: may be -0. (lo <= 0 <= hi whenever nz.) */
typedef struct fact {
  float lo, hi;
  uint8_t nan, nz;
} fact;

typedef struct sweep {
  const lm_graph_t *src; /* read only: its expression ids are valid in dst */
  lm_graph_t *dst;
  unsigned flags;
  lm_pass_stats st;
  lm_edge *map;     /* src node -> dst edge */
  fact *facts;      /* per dst node */
  size_t factcap;
  uint32_t *ntab;   /* hashcons of dst nodes (CSE) */
  size_t ntcap, ncount;
  uint32_t *vtab;   /* hashcons of dst views */
  size_t vtcap, vcount;
  uint32_t *chain;  /* scratch for compose */
  size_t chaincap;
  int failed;
} sweep;

static const fact fact_any = {-INFINITY, INFINITY, 1, 1};

static int exact_only(const sweep *sw) { return (sw->flags & LM_CANON_EXACT) != 0; }

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* ---------------------------------------------------------------- hash tables */

typedef int (*slot_eq)(const sweep *sw, uint32_t id, const void *key);

/* Open addressing over ids; returns the slot holding an equal entry, or the empty slot. */
static size_t table_find(const sweep *sw, const uint32_t *tab, size_t cap, uint64_t h, slot_eq eq, const void *key) {
  size_t i = (size_t)h & (cap - 1);
  while (tab[i] && !eq(sw, tab[i], key)) i = (i + 1) & (cap - 1);
  return i;
}

static int table_grow(uint32_t **tab, size_t *cap, size_t count, uint64_t (*hash_id)(const sweep *, uint32_t),
                      const sweep *sw) {
  if ((count + 1) * 2 <= *cap) return 1;
  size_t ncap = *cap ? *cap * 2 : 256;
  uint32_t *t = lm_calloc(ncap, sizeof *t);
  if (!t) return 0;
  for (size_t i = 0; i < *cap; i++) {
    if (!(*tab)[i]) continue;
    size_t j = (size_t)hash_id(sw, (*tab)[i]) & (ncap - 1);
    while (t[j]) j = (j + 1) & (ncap - 1);
    t[j] = (*tab)[i];
  }
  lm_free(*tab);
  *tab = t;
  *cap = ncap;
  return 1;
}

/* ---------------------------------------------------------------- views */

/* Zeroes the fields a view kind does not use, so structural comparison is field-wise. */
static lm_view view_norm(const lm_view *v) {
  lm_view o;
  memset(&o, 0, sizeof o);
  o.parent = v->parent;
  o.kind = v->kind;
  o.shape.rank = v->shape.rank;
  for (int i = 0; i < v->shape.rank; i++) o.shape.dim[i] = v->shape.dim[i];
  switch (v->kind) {
  case LM_V_PERMUTE:
    for (int i = 0; i < v->shape.rank; i++) o.perm[i] = v->perm[i];
    break;
  case LM_V_EXPAND:
    o.axis = v->axis;
    o.p0 = v->p0;
    break;
  case LM_V_SLICE:
  case LM_V_PAD:
  case LM_V_AFFINE_MOD:
    o.axis = v->axis;
    o.p0 = v->p0;
    o.p1 = v->p1;
    break;
  default: break; /* RESHAPE: the shape says it all */
  }
  return o;
}

static uint64_t view_hash(const lm_view *v) {
  uint64_t k[6 + 2 * LM_MAX_RANK];
  size_t m = 0;
  k[m++] = v->parent;
  k[m++] = (uint64_t)v->kind | (uint64_t)(uint8_t)v->axis << 8 | (uint64_t)(uint32_t)v->shape.rank << 16;
  k[m++] = v->p0;
  k[m++] = v->p1;
  for (int i = 0; i < v->shape.rank; i++) k[m++] = (uint64_t)v->shape.dim[i] << 8 | (uint8_t)v->perm[i];
  return lm_hash_bytes(k, m * sizeof k[0], 0);
}

static uint64_t view_hash_id(const sweep *sw, uint32_t id) { return view_hash(&sw->dst->views[id]); }

static int view_eq(const sweep *sw, uint32_t id, const void *key) {
  const lm_view *a = &sw->dst->views[id], *b = key;
  if (a->parent != b->parent || a->kind != b->kind || a->axis != b->axis || a->p0 != b->p0 || a->p1 != b->p1 ||
      a->shape.rank != b->shape.rank)
    return 0;
  for (int i = 0; i < a->shape.rank; i++)
    if (a->shape.dim[i] != b->shape.dim[i] || a->perm[i] != b->perm[i]) return 0;
  return 1;
}

/* Pushes one view step (parent already set) into dst, reusing a structurally equal one. */
static uint32_t view_intern(sweep *sw, const lm_view *step) {
  if (sw->failed) return 0;
  lm_view v = view_norm(step);
  if (!table_grow(&sw->vtab, &sw->vtcap, sw->vcount, view_hash_id, sw)) return sw->failed = 1, 0;
  uint64_t h = view_hash(&v);
  size_t slot = table_find(sw, sw->vtab, sw->vtcap, h, view_eq, &v);
  if (sw->vtab[slot]) return sw->vtab[slot];
  uint32_t id = lm_graph_push_view(sw->dst, &v);
  if (!id) return sw->failed = 1, 0;
  sw->vtab[slot] = id;
  sw->vcount++;
  return id;
}

/* base seen through the chain `view` of graph g (g may be dst itself): the chain is stored
 * child -> parent, so it is collected first and re-pushed base-first on top of base.view. */
static lm_edge compose(sweep *sw, lm_edge base, const lm_graph_t *g, uint32_t view) {
  size_t n = 0;
  for (uint32_t v = view; v; v = g->views[v].parent) {
    if (!LM_GROW(sw->chain, sw->chaincap, n + 1)) return sw->failed = 1, base;
    sw->chain[n++] = v;
  }
  lm_edge e = base;
  while (n-- > 0 && !sw->failed) {
    lm_view step = g->views[sw->chain[n]]; /* by value: pushing may move g->views */
    step.parent = e.view;
    e.view = view_intern(sw, &step);
  }
  return e;
}

static int chain_has_pad(const lm_graph_t *g, uint32_t view) {
  for (uint32_t v = view; v; v = g->views[v].parent)
    if (g->views[v].kind == LM_V_PAD) return 1;
  return 0;
}

static lm_shape edge_shape(const sweep *sw, lm_edge e) { return *lm_edge_shape(sw->dst, e); }

static int shape_eq(sweep *sw, const lm_shape *a, const lm_shape *b) {
  if (a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (!lm_x_prove_eq(&sw->dst->x, a->dim[i], b->dim[i])) return 0;
  return 1;
}

/* 1 when e reads its node's buffer in row-major order over e's own shape, without padding:
 * materialising it copies the buffer unchanged. */
static int layout_preserving(sweep *sw, lm_edge e) {
  if (!e.view) return 1;
  lm_graph_t *g = sw->dst;
  lm_shape s = edge_shape(sw, e), ns = g->nodes[e.node].shape;
  if (!lm_x_prove_eq(&g->x, lm_shape_numel(g, &s), lm_shape_numel(g, &ns))) return 0;
  lm_expr idx[LM_MAX_RANK], flat, valid;
  for (int i = 0; i < s.rank; i++) idx[i] = lm_x_var(&g->x, i);
  lm_xctx ctx = {.extent = s.dim, .nvars = s.rank};
  lm_edge_index(g, e, idx, &ctx, &flat, &valid);
  lm_expr want = lm_x_simplify(&g->x, lm_shape_flat(g, &s, idx), &ctx);
  return flat && want && flat == want && lm_x_is_const(&g->x, valid, 1);
}

/* ---------------------------------------------------------------- interval analysis */

static float fdown(float x) { return isfinite(x) ? nextafterf(x, -INFINITY) : x; }
static float fup(float x) { return isfinite(x) ? nextafterf(x, INFINITY) : x; }

static int fact_finite(const fact *f) { return !f->nan && isfinite(f->lo) && isfinite(f->hi); }
/* Every value is +0 or positive (or NaN). */
static int fact_sign_pos(const fact *f) { return f->lo >= 0 && !f->nz; }

static fact edge_fact(const sweep *sw, lm_edge e) {
  fact f = sw->facts[e.node];
  if (chain_has_pad(sw->dst, e.view)) { /* padding reads +0 */
    f.lo = fminf(f.lo, 0.0f);
    f.hi = fmaxf(f.hi, 0.0f);
  }
  return f;
}

static fact fact_of(sweep *sw, const lm_node *n) {
  fact a = n->nsrc > 0 ? edge_fact(sw, n->src[0]) : fact_any;
  fact b = n->nsrc > 1 ? edge_fact(sw, n->src[1]) : fact_any;
  fact r = fact_any;
  switch ((lm_op)n->op) {
  case LM_OP_INPUT: break;
  case LM_OP_CONST:
    if (isnan(n->value)) break;
    r = (fact){n->value, n->value, 0, n->value == 0 && signbit(n->value)};
    break;
  case LM_OP_RAND: r = (fact){0x1p-33f, 1.0f, 0, 0}; break; /* lm_uniform_u32: (0,1], least 2^-33 */
  case LM_OP_LESS_THAN: r = (fact){0.0f, 1.0f, 0, 0}; break;
  case LM_OP_SIN: r = (fact){-1.0f, 1.0f, !fact_finite(&a), a.nz || a.lo < 0}; break;
  case LM_OP_EXP2: r = (fact){fmaxf(0.0f, fdown(exp2f(a.lo))), fup(exp2f(a.hi)), a.nan, 0}; break;
  case LM_OP_LOG2:
    if (a.lo >= 0) r = (fact){fdown(log2f(a.lo)), fup(log2f(a.hi)), a.nan, 0};
    else r.nz = 0;
    break;
  case LM_OP_SQRT:
    r = (fact){a.lo >= 0 ? sqrtf(a.lo) : 0.0f, sqrtf(fmaxf(a.hi, 0.0f)), a.nan || a.lo < 0, a.nz};
    break;
  case LM_OP_RECIP:
    if (a.lo > 0) r = (fact){1.0f / a.hi, 1.0f / a.lo, a.nan, 0};
    else if (a.hi < 0 && !a.nz) r = (fact){1.0f / a.hi, 1.0f / a.lo, a.nan, a.lo == -INFINITY};
    else r.nan = a.nan;
    break;
  case LM_OP_ADD:
    r.nan = a.nan || b.nan || (a.hi == INFINITY && b.lo == -INFINITY) || (a.lo == -INFINITY && b.hi == INFINITY);
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi;
    if (isnan(r.lo)) r.lo = -INFINITY;
    if (isnan(r.hi)) r.hi = INFINITY;
    r.nz = a.nz && b.nz;
    break;
  case LM_OP_MUL: {
    int a0 = a.lo <= 0 && a.hi >= 0, b0 = b.lo <= 0 && b.hi >= 0;
    int ainf = !isfinite(a.lo) || !isfinite(a.hi), binf = !isfinite(b.lo) || !isfinite(b.hi);
    r.nan = a.nan || b.nan || (a0 && binf) || (b0 && ainf);
    float c[4] = {a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi};
    r.lo = INFINITY, r.hi = -INFINITY;
    for (int i = 0; i < 4; i++) {
      if (isnan(c[i])) {
        r.lo = -INFINITY, r.hi = INFINITY;
        break;
      }
      r.lo = fminf(r.lo, c[i]);
      r.hi = fmaxf(r.hi, c[i]);
    }
    r.nz = !fact_sign_pos(&a) || !fact_sign_pos(&b);
    break;
  }
  case LM_OP_MOD: {
    float m = fmaxf(fabsf(b.lo), fabsf(b.hi));
    r.nan = a.nan || b.nan || !isfinite(a.lo) || !isfinite(a.hi) || (b.lo <= 0 && b.hi >= 0);
    r.lo = a.lo >= 0 ? 0.0f : fmaxf(-m, a.lo);
    r.hi = a.hi <= 0 ? 0.0f : fminf(m, a.hi);
    r.nz = a.nz || a.lo < 0;
    break;
  }
  case LM_OP_SUM_REDUCE:
    /* partial sums of one sign cannot meet an infinity of the other sign */
    if (a.lo >= 0) r = (fact){0.0f, a.hi == 0 ? 0.0f : INFINITY, a.nan, 0};
    else if (a.hi <= 0) r = (fact){-INFINITY, 0.0f, a.nan, 1};
    else r.nan = 1;
    break;
  case LM_OP_MAX_REDUCE: {
    const lm_shape s = *lm_edge_shape(sw->dst, n->src[0]);
    int nonempty = lm_x_prove_ge(&sw->dst->x, s.dim[n->axis], lm_x_const(&sw->dst->x, 1), NULL);
    r = (fact){nonempty ? a.lo : -INFINITY, a.hi, a.nan, a.nz};
    break;
  }
  case LM_OP_CONTIGUOUS: r = a; break;
  default: break;
  }
  if (isnan(r.lo) || isnan(r.hi)) r = fact_any;
  if (r.nz && (r.lo > 0 || r.hi < 0)) r.nz = 0; /* cannot hold: no zero in range */
  return r;
}

/* ---------------------------------------------------------------- nodes */

static uint64_t node_hash(const lm_node *n) {
  uint64_t k[8 + LM_MAX_RANK];
  size_t m = 0;
  k[m++] = (uint64_t)n->op | (uint64_t)n->nsrc << 8 | (uint64_t)(uint8_t)n->axis << 16;
  for (int i = 0; i < n->nsrc; i++) k[m++] = (uint64_t)n->src[i].node << 32 | n->src[i].view;
  k[m++] = n->op == LM_OP_CONST ? fbits(n->value) : 0;
  k[m++] = n->op == LM_OP_RAND ? n->stream : 0;
  k[m++] = (uint64_t)(uint32_t)n->shape.rank;
  for (int i = 0; i < n->shape.rank; i++) k[m++] = n->shape.dim[i];
  return lm_hash_bytes(k, m * sizeof k[0], 0);
}

static uint64_t node_hash_id(const sweep *sw, uint32_t id) { return node_hash(&sw->dst->nodes[id]); }

static int node_eq(const sweep *sw, uint32_t id, const void *key) {
  const lm_node *a = &sw->dst->nodes[id], *b = key;
  if (a->op != b->op || a->nsrc != b->nsrc || a->axis != b->axis || a->shape.rank != b->shape.rank) return 0;
  for (int i = 0; i < a->nsrc; i++)
    if (a->src[i].node != b->src[i].node || a->src[i].view != b->src[i].view) return 0;
  for (int i = 0; i < a->shape.rank; i++)
    if (a->shape.dim[i] != b->shape.dim[i]) return 0;
  if (a->op == LM_OP_CONST && fbits(a->value) != fbits(b->value)) return 0;
  if (a->op == LM_OP_RAND && a->stream != b->stream) return 0;
  return a->op != LM_OP_INPUT; /* inputs are the interface: never merged */
}

static uint32_t push_node(sweep *sw, const lm_node *n) {
  if (sw->failed) return 0;
  uint32_t id = lm_graph_push_node(sw->dst, n);
  if (!id || !LM_GROW(sw->facts, sw->factcap, (size_t)id + 1)) return sw->failed = 1, 0;
  sw->facts[id] = fact_of(sw, n);
  return id;
}

/* Adds a (non-INPUT) node to dst, or returns the equal node already there. */
static uint32_t emit(sweep *sw, lm_node n, int count_cse) {
  if (sw->failed) return 0;
  /* commutative ops: sources in a canonical order, so a+b and b+a meet */
  if ((n.op == LM_OP_ADD || n.op == LM_OP_MUL) &&
      (n.src[0].node > n.src[1].node || (n.src[0].node == n.src[1].node && n.src[0].view > n.src[1].view))) {
    lm_edge t = n.src[0];
    n.src[0] = n.src[1];
    n.src[1] = t;
  }
  if (!table_grow(&sw->ntab, &sw->ntcap, sw->ncount, node_hash_id, sw)) return sw->failed = 1, 0;
  size_t slot = table_find(sw, sw->ntab, sw->ntcap, node_hash(&n), node_eq, &n);
  if (sw->ntab[slot]) {
    sw->st.cse += count_cse;
    return sw->ntab[slot];
  }
  uint32_t id = push_node(sw, &n);
  if (id) {
    sw->ntab[slot] = id;
    sw->ncount++;
  }
  return id;
}

/* A constant seen with the given shape: a rank-0 CONST broadcast by EXPAND steps. */
static lm_edge const_edge(sweep *sw, float v, const lm_shape *shape) {
  lm_node c = {.op = LM_OP_CONST, .value = v};
  lm_edge e = {emit(sw, c, 0), 0};
  lm_view step = {.kind = LM_V_EXPAND};
  for (int i = 0; i < shape->rank && !sw->failed; i++) {
    step.parent = e.view;
    step.axis = (int8_t)i;
    step.p0 = shape->dim[i];
    step.shape.rank = i + 1;
    step.shape.dim[i] = shape->dim[i];
    e.view = view_intern(sw, &step);
  }
  return e;
}

/* 1 and *v when every element e reads is the same constant: a rank-0 CONST through views
 * that only move or repeat it (a PAD reads +0, so it keeps only a +0 constant constant). */
static int edge_const(const sweep *sw, lm_edge e, float *v) {
  const lm_node *n = &sw->dst->nodes[e.node];
  if (n->op != LM_OP_CONST || n->shape.rank != 0) return 0;
  if (fbits(n->value) != 0 && chain_has_pad(sw->dst, e.view)) return 0;
  *v = n->value;
  return 1;
}

/* ref.c's arithmetic, so folding gives the bits the reference would. */
static float apply_op(lm_op op, float a, float b) {
  switch (op) {
  case LM_OP_LOG2: return log2f(a);
  case LM_OP_EXP2: return exp2f(a);
  case LM_OP_SIN: return sinf(a);
  case LM_OP_SQRT: return sqrtf(a);
  case LM_OP_RECIP: return 1.0f / a;
  case LM_OP_CONTIGUOUS: return a;
  case LM_OP_ADD: return a + b;
  case LM_OP_MUL: return a * b;
  case LM_OP_MOD: return fmodf(a, b);
  case LM_OP_LESS_THAN: return a < b ? 1.0f : 0.0f;
  default: LM_ASSERT(!"not an elementwise op"); return 0;
  }
}

static int folded(sweep *sw, float v, const lm_shape *shape, lm_edge *out) {
  *out = const_edge(sw, v, shape);
  sw->st.folded++;
  return 1;
}

/* An identity fired; `rounding` marks one that may change bits (skipped in exact mode). */
static int identity(sweep *sw, lm_edge e, int rounding, lm_edge *out) {
  if (rounding && exact_only(sw)) return 0;
  *out = e;
  sw->st.identities++;
  sw->st.rounding += rounding;
  return 1;
}

/* Tries folding and identities on a node whose sources are already dst edges. 1 and *out
 * (the dst edge that replaces the node, with the node's shape) when one applies. */
static int simplify(sweep *sw, const lm_node *n, lm_edge *out) {
  lm_op op = (lm_op)n->op;
  const lm_op_info *info = &lm_op_table[op];
  lm_exprs *x = &sw->dst->x;
  float c[2] = {0, 0};

  if (info->elementwise) {
    int all = 1;
    for (int i = 0; i < n->nsrc; i++) all &= edge_const(sw, n->src[i], &c[i]);
    if (all) return folded(sw, apply_op(op, c[0], c[1]), &n->shape, out);
  }

  if (info->reduce) {
    lm_edge s = n->src[0];
    lm_shape ss = edge_shape(sw, s);
    lm_expr ext = ss.dim[n->axis];
    float v;
    if (lm_x_prove_eq(x, ext, lm_x_const(x, 0)))
      return folded(sw, op == LM_OP_SUM_REDUCE ? 0.0f : -INFINITY, &n->shape, out);
    int nonempty = lm_x_prove_ge(x, ext, lm_x_const(x, 1), NULL);
    if (edge_const(sw, s, &v)) {
      if (op == LM_OP_SUM_REDUCE && v == 0) return folded(sw, 0.0f, &n->shape, out); /* +0 + +-0 = +0 */
      if (op == LM_OP_MAX_REDUCE && nonempty && !isnan(v)) return folded(sw, v, &n->shape, out);
    }
    if (lm_x_prove_eq(x, ext, lm_x_const(x, 1))) {
      fact f = edge_fact(sw, s);
      int ok = op == LM_OP_SUM_REDUCE || !f.nan;
      lm_view step = {.kind = LM_V_RESHAPE, .parent = s.view, .shape = n->shape};
      if (ok && (!exact_only(sw) || op == LM_OP_MAX_REDUCE || !f.nz)) {
        lm_edge e = {s.node, view_intern(sw, &step)};
        /* sum: 0 + v is v except for v = -0 */
        return identity(sw, e, op == LM_OP_SUM_REDUCE && f.nz, out);
      }
    }
    return 0;
  }

  if (op == LM_OP_ADD || op == LM_OP_MUL) {
    for (int k = 0; k < 2; k++) {
      lm_edge other = n->src[1 - k];
      if (!edge_const(sw, n->src[k], &c[k])) continue;
      lm_shape os = edge_shape(sw, other);
      int same = shape_eq(sw, &os, &n->shape);
      fact f = edge_fact(sw, other);
      if (op == LM_OP_ADD && c[k] == 0 && same) {
        /* x + -0 = x always; x + +0 = x unless x is -0 */
        if (identity(sw, other, !signbit(c[k]) && f.nz, out)) return 1;
      } else if (op == LM_OP_MUL && c[k] == 1 && same) {
        return identity(sw, other, 0, out);
      } else if (op == LM_OP_MUL && c[k] == 0 && fact_finite(&f)) {
        /* x * 0 is a zero carrying the xor of the signs */
        int known = fact_sign_pos(&f) || f.hi < 0;
        float z = f.hi < 0 ? -c[k] : c[k];
        if (known || !exact_only(sw)) {
          *out = const_edge(sw, z, &n->shape);
          sw->st.identities++;
          sw->st.rounding += !known;
          return 1;
        }
      }
    }
    return 0;
  }

  if (op == LM_OP_RECIP || op == LM_OP_LOG2 || op == LM_OP_EXP2) {
    lm_edge s = n->src[0];
    const lm_node *inner = &sw->dst->nodes[s.node];
    lm_op want = op == LM_OP_RECIP ? LM_OP_RECIP : op == LM_OP_LOG2 ? LM_OP_EXP2 : LM_OP_LOG2;
    if (inner->op != want || chain_has_pad(sw->dst, s.view) || exact_only(sw)) return 0;
    lm_edge a = inner->src[0];
    if (op == LM_OP_EXP2) { /* exp2(log2 x) = x needs x >= +0 (or NaN) */
      fact f = edge_fact(sw, a);
      if (!fact_sign_pos(&f)) return 0;
    }
    return identity(sw, compose(sw, a, sw->dst, s.view), 1, out);
  }

  if (op == LM_OP_CONTIGUOUS && layout_preserving(sw, n->src[0])) {
    lm_edge s = n->src[0];
    lm_shape ns = sw->dst->nodes[s.node].shape;
    if (shape_eq(sw, &ns, &n->shape)) s.view = 0;
    return identity(sw, s, 0, out);
  }
  return 0;
}

/* ---------------------------------------------------------------- one sweep */

/* Marks the nodes some output or assign reads (inputs are always kept by the caller). */
static uint8_t *live_nodes(const lm_graph_t *g, const uint32_t *order, size_t norder) {
  uint8_t *live = lm_calloc(g->nnodes, 1);
  if (!live) return NULL;
  for (size_t i = 0; i < g->noutputs; i++) live[g->outputs[i].src.node] = 1;
  for (size_t i = 0; i < g->nassigns; i++) live[g->assigns[i].src.node] = live[g->assigns[i].target] = 1;
  for (size_t k = norder; k-- > 0;) {
    const lm_node *n = &g->nodes[order[k]];
    if (live[order[k]])
      for (int i = 0; i < n->nsrc; i++) live[n->src[i].node] = 1;
  }
  return live;
}

static void sweep_free(sweep *sw) {
  lm_free(sw->map);
  lm_free(sw->facts);
  lm_free(sw->ntab);
  lm_free(sw->vtab);
  lm_free(sw->chain);
}

/* Rebuilds src into a fresh graph: live nodes only, in topological order, each simplified
 * and hash-consed. NULL on failure (the error is set). */
static lm_graph_t *sweep_once(const lm_graph_t *src, unsigned flags, lm_pass_stats *st) {
  sweep sw = {.src = src, .flags = flags};
  size_t norder = 0;
  uint32_t *order = lm_graph_topo_order(src, &norder);
  uint8_t *live = order ? live_nodes(src, order, norder) : NULL;
  lm_graph_t *g = lm_calloc(1, sizeof *g);
  sw.dst = g;
  sw.map = lm_calloc(src->nnodes, sizeof *sw.map);
  if (!order || !live || !g || !sw.map) goto fail;
  g->nnodes = g->nviews = 1;
  g->next_stream = src->next_stream;
  g->contract = src->contract;
  g->finite = src->finite;
  if (!LM_GROW(g->nodes, g->nodecap, src->nnodes) || !LM_GROW(g->views, g->viewcap, src->nviews) ||
      !LM_GROW(g->inputs, g->inputcap, src->ninputs + 1) || !LM_GROW(g->outputs, g->outputcap, src->noutputs + 1) ||
      !LM_GROW(g->assigns, g->assigncap, src->nassigns + 1) || !lm_exprs_copy(&g->x, &src->x))
    goto fail;

  /* the interface first, in its order */
  for (size_t i = 0; i < src->ninputs; i++) {
    const lm_input_info *in = &src->inputs[i];
    lm_node n = {.op = LM_OP_INPUT, .shape = src->nodes[in->node].shape, .input = (uint32_t)i};
    char *name = lm_strdup(in->name);
    uint32_t id = name ? push_node(&sw, &n) : 0;
    if (!id) {
      lm_free(name);
      goto fail;
    }
    g->inputs[g->ninputs++] = (lm_input_info){name, in->role, id};
    sw.map[in->node] = (lm_edge){id, 0};
  }

  for (size_t k = 0; k < norder && !sw.failed; k++) {
    uint32_t u = order[k];
    const lm_node *sn = &src->nodes[u];
    if (sn->op == LM_OP_INPUT) continue;
    if (!live[u]) {
      sw.st.dead++;
      continue;
    }
    lm_node n = {.op = sn->op, .nsrc = sn->nsrc, .shape = sn->shape};
    if (lm_op_table[sn->op].reduce) n.axis = sn->axis;
    if (sn->op == LM_OP_CONST) n.value = sn->value;
    if (sn->op == LM_OP_RAND) n.stream = sn->stream;
    for (int i = 0; i < sn->nsrc; i++) n.src[i] = compose(&sw, sw.map[sn->src[i].node], src, sn->src[i].view);
    lm_edge e;
    if (!simplify(&sw, &n, &e)) e = (lm_edge){emit(&sw, n, 1), 0};
    sw.map[u] = e;
  }

  for (size_t i = 0; i < src->noutputs && !sw.failed; i++) {
    const lm_output_info *o = &src->outputs[i];
    lm_edge e = compose(&sw, sw.map[o->src.node], src, o->src.view);
    char *name = lm_strdup(o->name);
    if (!name) goto fail;
    g->outputs[g->noutputs++] = (lm_output_info){name, e};
  }
  for (size_t i = 0; i < src->nassigns && !sw.failed; i++) {
    const lm_assign_info *a = &src->assigns[i];
    lm_edge e = compose(&sw, sw.map[a->src.node], src, a->src.view);
    g->assigns[g->nassigns++] = (lm_assign_info){sw.map[a->target].node, e};
  }
  if (sw.failed || g->err || g->x.failed) goto fail;

  lm_free(order);
  lm_free(live);
  sweep_free(&sw);
  *st = sw.st;
  return g;
fail:
  lm_free(order);
  lm_free(live);
  sweep_free(&sw);
  if (g) lm_graph_free(g);
  lm_fail(LM_ERR_NOMEM, "canonicalize: out of memory");
  return NULL;
}

/* ---------------------------------------------------------------- driver */

lm_graph_t *lm_canonicalize_ex(const lm_graph_t *g, unsigned flags, lm_pass_stats *stats) {
  if (stats) *stats = (lm_pass_stats){0};
  if (!g) {
    lm_fail(LM_ERR_INVALID, "canonicalize: graph is NULL");
    return NULL;
  }
  if (lm_graph_validate(g) != LM_OK) return NULL;
  lm_pass_stats total = {0};
  lm_graph_t *cur = NULL;
  for (int i = 0; i < MAX_SWEEPS; i++) {
    lm_pass_stats st;
    lm_graph_t *next = sweep_once(cur ? cur : g, flags, &st);
    lm_graph_free(cur);
    if (!next) return NULL;
    cur = next;
    total.dead += st.dead;
    total.cse += st.cse;
    total.folded += st.folded;
    total.identities += st.identities;
    total.rounding += st.rounding;
    /* every change removes a node or turns an op into a CONST, so this ends */
    if (!st.dead && !st.cse && !st.folded && !st.identities) break;
  }
  if (stats) *stats = total;
  return cur;
}

lm_graph_t *lm_canonicalize(const lm_graph_t *g, lm_pass_stats *stats) { return lm_canonicalize_ex(g, 0, stats); }
