/* compiler/search/emit.c — an extracted term back to a loop-IR kernel (term.h). Effects become
 * loops and stores in order; values become SSA statements placed, as the lowering places them,
 * in the shallowest open loop where their variables are bound (loop-invariant code is hoisted
 * by construction) and shared while visible. Logical variables are computed from the counters
 * of the loops over their pieces and substituted into the index expressions here, outside the
 * e-graph. Reductions become an accumulator and a serial loop (or f partial sums in a local
 * array, or a joint computation into a local array before the loop over the joint piece), and
 * the loops finally get renumbered so the chain of parallel loops from the root is 0..npar-1. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "search/term.h"

typedef struct undo {
  uint8_t piece; /* 0: variable, 1: piece, 2: the guard of ragged splits (e) */
  uint32_t id;
  lm_expr e;
  int32_t at;
} undo;

typedef struct real {
  uint32_t term, local, P, Q;
  int64_t EQ;
  int32_t at;   /* the loop whose block holds the joint computation */
  int32_t regs; /* >= 0: scalar accumulators regs..regs+EP*EQ-1 of ob.accs (the loops are unrolled) */
} real;

typedef struct memo_e {
  uint32_t term;
  uint64_t sig;
  uint32_t stmt;
} memo_e;

typedef struct ob {
  lm_sk *s;
  const sk_term *t;
  lm_kernel *k;
  lm_exprs *x;
  int32_t cur;
  lm_expr *vexpr; /* per logical variable: its value over the new loops (0: unbound) */
  int32_t *vat;   /* the loop where it became bound */
  lm_expr *pexpr; /* per piece: its counter */
  int32_t *pat;
  size_t npieces;
  undo *u;
  size_t nu, ucap;
  real *r;
  size_t nr, rcap;
  memo_e *m;
  size_t nm, mcap;
  uint32_t *accs; /* scalar accumulators of joint reductions in registers */
  size_t nacc, acccap;
  lm_expr *ext;   /* per new loop */
  size_t extcap;
  uint64_t *fv;   /* per term node: W words, bit v = logical variable v is free */
  size_t W;
  uint8_t *seen;  /* scratch per term node */
  lm_expr zero;
  int32_t group_loop; /* the loop of an SK_GROUP term (-1: none) */
  lm_expr guard;      /* stores hold only where this does: the open ragged splits (0: none) */
  uint8_t *full;      /* per piece: a ragged outer piece's loop is over its full tiles only here */
  /* loads read from a shared-memory copy (SK_GROUP_STAGED): the access, its shared array, the
   * reduction variables its index uses besides the grid's (the copy's shape, row-major) */
  struct stg {
    uint32_t acc, local;
    int nv;
    uint32_t var[4];
    int64_t ext[4];
  } *stg;
  size_t nstg, stgcap;
  int bad;
} ob;

static void ofail(ob *o, const char *fmt, ...) LM_PRINTF(2, 3);
static void ofail(ob *o, const char *fmt, ...) {
  if (o->bad) return;
  o->bad = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->s->why, sizeof o->s->why, fmt, ap);
  va_end(ap);
}

/* ---------------------------------------------------------------- kernels */


static int block_copy(const lm_block *s, lm_block *d) {
  memset(d, 0, sizeof *d);
  if (!s->n) return 1;
  d->items = lm_malloc(s->n * sizeof *d->items);
  if (!d->items) return 0;
  memcpy(d->items, s->items, s->n * sizeof *d->items);
  d->n = d->cap = s->n;
  return 1;
}

lm_status sk_kernel_copy(const lm_kernel *src, lm_kernel *dst) {
  memset(dst, 0, sizeof *dst);
  memcpy(dst->name, src->name, sizeof dst->name);
  dst->anchor = src->anchor;
  dst->npar = src->npar;
  int ok = 1;
  if (src->nloops) {
    ok = (dst->loops = lm_calloc(src->nloops, sizeof *dst->loops)) != NULL;
    for (size_t i = 0; ok && i < src->nloops; i++) {
      dst->loops[i] = src->loops[i];
      ok = block_copy(&src->loops[i].body, &dst->loops[i].body);
      dst->nloops = i + 1;
    }
    dst->loopcap = dst->nloops;
  }
  if (ok && src->nstmts) {
    ok = (dst->stmts = lm_malloc(src->nstmts * sizeof *dst->stmts)) != NULL;
    if (ok) memcpy(dst->stmts, src->stmts, src->nstmts * sizeof *dst->stmts), dst->nstmts = dst->stmtcap = src->nstmts;
  }
  if (ok) ok = block_copy(&src->root, &dst->root);
  if (ok && src->nbufs) {
    ok = (dst->bufs = lm_malloc(src->nbufs * sizeof *dst->bufs)) != NULL;
    if (ok) memcpy(dst->bufs, src->bufs, src->nbufs * sizeof *dst->bufs), dst->nbufs = dst->bufcap = src->nbufs;
  }
  if (ok && src->nlocals) {
    ok = (dst->locals = lm_malloc(src->nlocals * sizeof *dst->locals)) != NULL;
    if (ok)
      memcpy(dst->locals, src->locals, src->nlocals * sizeof *dst->locals), dst->nlocals = dst->localcap = src->nlocals;
  }
  dst->group = src->group; /* a work-group schedule and its shared arrays */
  dst->fixed = src->fixed;
  dst->measured = src->measured;
  dst->contract = src->contract;
  dst->finite = src->finite;
  dst->fast_exp = src->fast_exp;
  if (ok && src->nshared) {
    ok = (dst->shared = lm_malloc(src->nshared)) != NULL;
    if (ok) memcpy(dst->shared, src->shared, src->nshared), dst->nshared = dst->sharedcap = src->nshared;
  }
  if (!ok) {
    lm_kernel_free(dst);
    return LM_ERR_NOMEM;
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- loops and statements */

static lm_block *blk(lm_kernel *k, int32_t l) { return l < 0 ? &k->root : &k->loops[l].body; }

static int on_chain(const ob *o, int32_t loop) {
  if (loop < 0) return 1;
  for (int32_t l = o->cur; l >= 0; l = o->k->loops[l].parent)
    if (l == loop) return 1;
  return 0;
}

/* The child of `anc` on the path from anc down to cur (-1 when anc == cur). */
static int32_t open_child(const ob *o, int32_t anc) {
  int32_t child = -1;
  for (int32_t l = o->cur; l != anc && l >= 0; l = o->k->loops[l].parent) child = l;
  return child;
}

static int32_t deeper(const ob *o, int32_t a, int32_t b) {
  return lm_loop_depth(o->k, a) >= lm_loop_depth(o->k, b) ? a : b;
}

/* The deepest open loop among the new loop variables in `mask` and loop `other`. */
static int32_t deepest(const ob *o, uint64_t mask, int32_t other) {
  for (int32_t l = o->cur; l >= 0; l = o->k->loops[l].parent)
    if (l == other || (l < 64 && (mask >> l) & 1)) return l;
  return -1;
}

static uint32_t put(ob *o, lm_stmt s, int32_t loop) {
  if (o->bad) return 0;
  s.loop = loop;
  uint32_t id = lm_kernel_add_stmt(o->k, &s, open_child(o, loop));
  if (id == UINT32_MAX) {
    ofail(o, "out of memory");
    return 0;
  }
  return id;
}

/* A loop in the block of `parent`, before the open child of parent (appended when parent is cur). */
static int32_t new_loop(ob *o, int32_t parent, lm_expr extent, lm_loopkind kind) {
  if (o->bad) return -1;
  if (o->k->nloops >= 60) {
    ofail(o, "too many loops");
    return -1;
  }
  int32_t before = open_child(o, parent);
  int32_t id = lm_kernel_add_loop(o->k, parent, extent, kind);
  if (id < 0 || !LM_GROW(o->ext, o->extcap, o->k->nloops + 1)) {
    ofail(o, "out of memory");
    return -1;
  }
  o->ext[id] = extent;
  if (before >= 0) { /* move it from the end to just before the open child */
    lm_block *b = blk(o->k, parent);
    lm_item it = b->items[b->n - 1];
    size_t at = 0;
    while (at < b->n && !(b->items[at].is_loop && (int32_t)b->items[at].id == before)) at++;
    LM_ASSERT(at < b->n);
    memmove(&b->items[at + 1], &b->items[at], (b->n - 1 - at) * sizeof *b->items);
    b->items[at] = it;
  }
  return id;
}

static uint32_t new_local(ob *o, int64_t n) {
  if (!LM_GROW(o->k->locals, o->k->localcap, o->k->nlocals + 1)) {
    ofail(o, "out of memory");
    return 0;
  }
  o->k->locals[o->k->nlocals] = n;
  return (uint32_t)o->k->nlocals++;
}

/* ---------------------------------------------------------------- bindings */

static void push_undo(ob *o, uint8_t piece, uint32_t id) {
  if (!LM_GROW(o->u, o->ucap, o->nu + 1)) {
    ofail(o, "out of memory");
    return;
  }
  o->u[o->nu++] = piece == 2 ? (undo){2, 0, o->guard, 0}
                  : piece  ? (undo){1, id, o->pexpr[id], o->pat[id]}
                           : (undo){0, id, o->vexpr[id], o->vat[id]};
}

static void undo_to(ob *o, size_t mark) {
  while (o->nu > mark) {
    undo u = o->u[--o->nu];
    if (u.piece == 2) o->guard = u.e;
    else if (u.piece) o->pexpr[u.id] = u.e, o->pat[u.id] = u.at;
    else o->vexpr[u.id] = u.e, o->vat[u.id] = u.at;
  }
}

static void bind_var(ob *o, uint32_t v, lm_expr e, int32_t at) {
  if (v >= o->s->nvars) return ofail(o, "variable %u out of range", v);
  if (o->vexpr[v]) return ofail(o, "variable %u bound twice", v);
  push_undo(o, 0, v);
  o->vexpr[v] = e;
  o->vat[v] = at;
}

/* Is split piece q (OUT or IN) ragged: its factor does not divide the extent, or that is symbolic? */
static int split_ragged(const lm_sk *s, const sk_piece *q) {
  int64_t whole = sk_piece_const(s, q->a);
  return whole < 0 || whole % q->b;
}

/* Is p the outer part of a ragged split? */
static int ragged(ob *o, uint32_t p) {
  const sk_piece *q = sk_piece_of(o->s, p);
  return q->type == SKP_OUT && split_ragged(o->s, q);
}

static void bind_piece(ob *o, uint32_t p, lm_expr e, int32_t at) {
  if (o->bad) return;
  if (p >= o->npieces) return ofail(o, "piece %u out of range", p);
  if (o->pexpr[p]) return ofail(o, "piece %u bound twice", p);
  push_undo(o, 1, p);
  o->pexpr[p] = e;
  o->pat[p] = at;
  const sk_piece *q = sk_piece_of(o->s, p);
  lm_exprs *x = o->x;
  switch (q->type) {
  case SKP_ORIG: bind_var(o, q->a, e, at); return;
  case SKP_GROUP:
    bind_piece(o, q->a, e, at);
    bind_piece(o, q->b, e, at);
    return;
  case SKP_MERGE: {
    lm_expr eb = sk_piece_of(o->s, q->b)->extent;
    bind_piece(o, q->a, lm_x_div(x, e, eb), at);
    bind_piece(o, q->b, lm_x_mod(x, e, eb), at);
    return;
  }
  default: { /* OUT / IN: the split piece is bound once both parts are */
    sk_piece sib = *q;
    sib.type = q->type == SKP_OUT ? SKP_IN : SKP_OUT;
    sib.extent = q->type == SKP_OUT ? lm_x_const(x, q->b) : 0;
    if (q->type == SKP_IN) sib.extent = sk_split_outer_extent(o->s, q->a, q->b); /* ragged: one more */
    uint32_t s = sk_lookup(&o->s->pieces, &sib);
    if (s == UINT32_MAX || s >= o->npieces || !o->pexpr[s]) return;
    lm_expr outer = q->type == SKP_OUT ? e : o->pexpr[s], inner = q->type == SKP_OUT ? o->pexpr[s] : e;
    lm_expr v = lm_x_add(x, lm_x_mul(x, outer, lm_x_const(x, q->b)), inner);
    if (split_ragged(o->s, q) && !o->full[q->type == SKP_OUT ? p : s]) {
      /* a ragged split: the last outer iteration runs past the end. It reads the last element
       * again (min(v, E - 1) = E - 1 + (v < E) * (v - E + 1)) and stores nothing. A symbolic E
       * is taken as ragged: the guard costs a compare per row, a multiple of b nothing else. */
      lm_expr E = sk_piece_of(o->s, q->a)->extent;
      lm_expr last = lm_x_sub(x, E, lm_x_const(x, 1)), in = lm_x_lt(x, v, E);
      push_undo(o, 2, 0);
      o->guard = o->guard ? lm_x_and(x, o->guard, in) : in;
      v = lm_x_add(x, last, lm_x_mul(x, in, lm_x_sub(x, v, last)));
    }
    bind_piece(o, q->a, v, deeper(o, at, o->pat[s]));
    return;
  }
  }
}

/* ---------------------------------------------------------------- expressions */

static int vars_bound(ob *o, lm_expr e) {
  if (!e) return 1;
  const lm_xnode *n = &o->x->nodes[e];
  switch (n->op) {
  case LM_X_CONST:
  case LM_X_SYM: return 1;
  case LM_X_VAR: return n->v >= 0 && (size_t)n->v < o->s->nvars && o->vexpr[n->v];
  default: return vars_bound(o, n->a) && vars_bound(o, n->b);
  }
}

static lm_xctx xctx(ob *o) { return (lm_xctx){.extent = o->ext, .nvars = (int)o->k->nloops}; }

/* e over logical variables -> over the new loops' variables, simplified. */
static lm_expr tx(ob *o, lm_expr e) {
  if (!e || o->bad) return e;
  if (!vars_bound(o, e)) {
    ofail(o, "an index uses a variable no open loop binds");
    return 0;
  }
  lm_expr r = lm_x_subst(o->x, e, o->vexpr, (int)o->s->nvars);
  lm_xctx c = xctx(o);
  return lm_x_simplify(o->x, r, &c);
}

static lm_expr simp(ob *o, lm_expr e) {
  lm_xctx c = xctx(o);
  return lm_x_simplify(o->x, e, &c);
}

/* ---------------------------------------------------------------- values */

static int fv_has(const ob *o, uint32_t i, size_t v) { return (o->fv[(size_t)i * o->W + (v >> 6)] >> (v & 63)) & 1; }

static uint64_t sig_of(ob *o, uint32_t i) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ i;
  for (size_t v = 0; v < o->s->nvars; v++)
    if (fv_has(o, i, v)) h = (h ^ o->vexpr[v]) * 0x100000001B3ull + v;
  for (size_t r = 0; r < o->nr; r++) h = (h ^ (o->r[r].term * 31u + o->r[r].local)) * 0x100000001B3ull;
  return h;
}

static int32_t loop_of(ob *o, uint32_t stmt) { return o->k->stmts[stmt].loop; }

static uint32_t value(ob *o, uint32_t i);

static void fv_placement(ob *o, uint32_t i, int32_t *loop) {
  for (size_t v = 0; v < o->s->nvars; v++)
    if (fv_has(o, i, v) && o->vexpr[v]) *loop = *loop == -1 ? o->vat[v] : deeper(o, *loop, o->vat[v]);
}

static uint32_t red_value(ob *o, uint32_t i) {
  const lm_enode *n = &o->t->n[i];
  const sk_redattr *r = sk_red_of(o->s, n->attr);
  lm_exprs *x = o->x;
  if (r->nj) /* realised jointly before the loop over the joint piece? */
    for (size_t q = o->nr; q-- > 0;) {
      const real *re = &o->r[q];
      if (re->term != i || !o->pexpr[re->P] || (re->Q != UINT32_MAX && !o->pexpr[re->Q])) continue;
      if (re->regs >= 0) { /* unrolled: the counters are constants naming a scalar */
        const lm_xnode *u = lm_x_node(x, o->pexpr[re->P]);
        const lm_xnode *v = re->Q == UINT32_MAX ? NULL : lm_x_node(x, o->pexpr[re->Q]);
        if (u->op != LM_X_CONST || (v && v->op != LM_X_CONST)) continue;
        return o->accs[re->regs + u->v * re->EQ + (v ? v->v : 0)];
      }
      lm_expr idx = lm_x_mul(x, o->pexpr[re->P], lm_x_const(x, re->EQ));
      if (re->Q != UINT32_MAX) idx = lm_x_add(x, idx, o->pexpr[re->Q]);
      idx = simp(o, idx);
      lm_stmt s = {.op = LM_S_LOAD, .buf = re->local, .local = 1, .idx = idx, .valid = lm_x_const(x, 1)};
      /* never above the joint computation (an unrolled index is a constant) */
      return put(o, s, deepest(o, lm_x_vars_used(x, idx), re->at));
    }
  if (r->var >= o->s->nvars || o->vexpr[r->var]) return ofail(o, "reduction variable bound twice"), 0;
  int32_t parent = -1;
  fv_placement(o, i, &parent);
  lm_expr K = o->s->var_ext[r->var];
  /* a copy: interning expressions below may move the node array */
  int64_t kconst = lm_x_node(x, K)->op == LM_X_CONST ? lm_x_node(x, K)->v : -1;
  uint32_t lanes = r->lanes;
  if (lanes > 1 && (r->op != SK_RED_SUM || (kconst >= 0 && (kconst < (int64_t)lanes || kconst % lanes)))) lanes = 1;
  int32_t saved = o->cur;
  size_t mark = o->nu;
  uint32_t body = n->c[0];
  lm_expr one = lm_x_const(x, 1);
  if (lanes == 1) {
    lm_stmt acc = {.op = LM_S_ACC, .f = r->op == SK_RED_SUM ? 0.0f : -INFINITY};
    uint32_t a = put(o, acc, parent);
    int32_t L = new_loop(o, parent, K, LM_L_SERIAL);
    if (o->bad) return 0;
    bind_var(o, r->var, lm_x_var(x, L), L);
    o->cur = L;
    uint32_t v = value(o, body);
    lm_stmt up = {.op = r->op == SK_RED_SUM ? LM_S_ACC_SUM : LM_S_ACC_MAX, .a = a, .b = v};
    put(o, up, L);
    o->cur = saved;
    undo_to(o, mark);
    return a;
  }
  /* f partial sums l[u] over k = ko*f + u, then their sum; over a symbolic K the last K % f
   * terms go to lanes 0.. K % f - 1 after the full groups */
  uint32_t la = new_local(o, lanes);
  lm_expr f = lm_x_const(x, lanes);
  lm_expr groups = kconst >= 0 ? lm_x_const(x, kconst / lanes) : simp(o, lm_x_div(x, K, f));
  int32_t Li = new_loop(o, parent, f, LM_L_SERIAL);
  if (o->bad) return 0;
  o->cur = Li;
  uint32_t zero = put(o, (lm_stmt){.op = LM_S_CONST, .f = 0.0f}, -1);
  put(o, (lm_stmt){.op = LM_S_STORE, .a = zero, .buf = la, .local = 1, .idx = lm_x_var(x, Li), .valid = one}, Li);
  o->cur = saved;
  int32_t Lo = new_loop(o, parent, groups, LM_L_SERIAL);
  if (o->bad) return 0;
  for (int tail = 0; tail < 1 + (kconst < 0) && !o->bad; tail++) {
    if (!tail) o->cur = Lo;
    int32_t Lu = tail ? new_loop(o, parent, simp(o, lm_x_mod(x, K, f)), LM_L_SERIAL) : new_loop(o, Lo, f, LM_L_SERIAL);
    if (o->bad) return 0;
    o->cur = Lu;
    lm_expr base = tail ? groups : lm_x_var(x, Lo);
    bind_var(o, r->var, simp(o, lm_x_add(x, lm_x_mul(x, base, f), lm_x_var(x, Lu))), Lu);
    uint32_t v = value(o, body);
    lm_expr iu = lm_x_var(x, Lu);
    uint32_t old = put(o, (lm_stmt){.op = LM_S_LOAD, .buf = la, .local = 1, .idx = iu, .valid = one}, Lu);
    uint32_t sum = put(o, (lm_stmt){.op = LM_S_ADD, .a = old, .b = v}, Lu);
    put(o, (lm_stmt){.op = LM_S_STORE, .a = sum, .buf = la, .local = 1, .idx = iu, .valid = one}, Lu);
    undo_to(o, mark);
    o->cur = saved;
  }
  uint32_t a = put(o, (lm_stmt){.op = LM_S_ACC, .f = 0.0f}, parent);
  int32_t Lr = new_loop(o, parent, f, LM_L_SERIAL);
  if (o->bad) return 0;
  o->cur = Lr;
  uint32_t part = put(o, (lm_stmt){.op = LM_S_LOAD, .buf = la, .local = 1, .idx = lm_x_var(x, Lr), .valid = one}, Lr);
  put(o, (lm_stmt){.op = LM_S_ACC_SUM, .a = a, .b = part}, Lr);
  o->cur = saved;
  return a;
}

static uint32_t value(ob *o, uint32_t i) {
  if (o->bad) return 0;
  const lm_enode *n = &o->t->n[i];
  if (sk_is_effect(n->op)) return ofail(o, "an effect used as a value"), 0;
  uint64_t sig = sig_of(o, i);
  for (size_t q = o->nm; q-- > 0;)
    if (o->m[q].term == i && o->m[q].sig == sig && on_chain(o, loop_of(o, o->m[q].stmt))) return o->m[q].stmt;
  lm_exprs *x = o->x;
  lm_stmt s = {0};
  uint32_t id = 0;
  if (n->op == SK_LOAD || n->op == SK_RAND || n->op == SK_SELECT) {
    const sk_access *ac = sk_access_of(o->s, n->attr);
    const struct stg *sg = NULL;
    for (size_t q = 0; n->op == SK_LOAD && q < o->nstg && !sg; q++)
      if (o->stg[q].acc == n->attr && o->stg[q].local != UINT32_MAX) sg = &o->stg[q];
    if (sg) { /* from its shared copy, at the row-major offset of its reduction variables */
      lm_expr flat = o->zero;
      for (int v = 0; v < sg->nv; v++)
        flat = lm_x_add(x, lm_x_mul(x, flat, lm_x_const(x, sg->ext[v])), lm_x_var(x, (int)sg->var[v]));
      s = (lm_stmt){.op = LM_S_LOAD, .buf = sg->local, .local = 1, .idx = tx(o, flat), .valid = lm_x_const(x, 1)};
      id = put(o, s, deepest(o, lm_x_vars_used(x, s.idx), -2));
    } else if (n->op == SK_LOAD) {
      s = (lm_stmt){.op = LM_S_LOAD, .buf = ac->buf, .idx = tx(o, ac->idx), .valid = tx(o, ac->valid)};
      if (!lm_kernel_use_buf(o->k, ac->buf)) ofail(o, "out of memory");
      id = put(o, s, deepest(o, lm_x_vars_used(x, s.idx) | lm_x_vars_used(x, s.valid), -2));
    } else if (n->op == SK_RAND) {
      s = (lm_stmt){.op = LM_S_RAND, .stream = ac->stream, .idx = tx(o, ac->idx), .step = tx(o, ac->step)};
      id = put(o, s, deepest(o, lm_x_vars_used(x, s.idx) | lm_x_vars_used(x, s.step), -2));
    } else {
      uint32_t a = value(o, n->c[0]);
      s = (lm_stmt){.op = LM_S_SELECT, .a = a, .valid = tx(o, ac->valid)};
      id = put(o, s, o->bad ? -1 : deepest(o, lm_x_vars_used(x, s.valid), loop_of(o, a)));
    }
  } else if (n->op == SK_CONST) {
    s.op = LM_S_CONST;
    memcpy(&s.f, &n->attr, sizeof s.f);
    id = put(o, s, -1);
  } else if (n->op >= SK_LOG2 && n->op <= SK_RECIP) {
    uint32_t a = value(o, n->c[0]);
    s = (lm_stmt){.op = (uint8_t)(LM_S_LOG2 + (n->op - SK_LOG2)), .a = a};
    id = put(o, s, o->bad ? -1 : loop_of(o, a));
  } else if (n->op >= SK_ADD && n->op <= SK_LT) {
    uint32_t a = value(o, n->c[0]), b = value(o, n->c[1]);
    s = (lm_stmt){.op = (uint8_t)(LM_S_ADD + (n->op - SK_ADD)), .a = a, .b = b};
    id = put(o, s, o->bad ? -1 : deeper(o, loop_of(o, a), loop_of(o, b)));
  } else if (n->op == SK_RED) {
    id = red_value(o, i);
  } else ofail(o, "unknown value op %u", n->op);
  if (o->bad) return 0;
  if (LM_GROW(o->m, o->mcap, o->nm + 1)) o->m[o->nm++] = (memo_e){i, sig, id};
  return id;
}

/* ---------------------------------------------------------------- joint reductions */

static void collect_reds(ob *o, uint32_t i, uint32_t P, uint32_t *out, size_t *n, size_t cap) {
  if (o->seen[i]) return;
  o->seen[i] = 1;
  const lm_enode *nd = &o->t->n[i];
  if (nd->op == SK_RED) {
    const sk_redattr *r = sk_red_of(o->s, nd->attr);
    if (r->nj && r->joint[0] == P && *n < cap) out[(*n)++] = i;
  }
  for (int c = 0; c < nd->n; c++) collect_reds(o, nd->c[c], P, out, n, cap);
}

/* The kind of the loop over piece Q under term node i, or -1. */
static int piece_kind(ob *o, uint32_t i, uint32_t Q) {
  if (o->seen[i]) return -1;
  o->seen[i] = 1;
  const lm_enode *nd = &o->t->n[i];
  if (nd->op == SK_LOOP && sk_loop_of(o->s, nd->attr)->piece == Q) return (int)sk_loop_of(o->s, nd->attr)->kind;
  if (!sk_is_effect(nd->op)) return -1;
  for (int c = 0; c < nd->n; c++) {
    int k = piece_kind(o, nd->c[c], Q);
    if (k >= 0) return k;
  }
  return -1;
}

/* Register mode: scalar accumulators, every (P, Q) pair unrolled inside the reduction loop. */
static int realise_regs(ob *o, uint32_t i, uint32_t P, uint32_t Q, int64_t EP, int64_t EQ) {
  const sk_redattr *r = sk_red_of(o->s, o->t->n[i].attr);
  lm_exprs *x = o->x;
  int32_t saved = o->cur;
  size_t base = o->nacc;
  if (!LM_GROW(o->accs, o->acccap, o->nacc + (size_t)(EP * EQ))) return ofail(o, "out of memory"), -1;
  for (int64_t e = 0; e < EP * EQ; e++) o->accs[o->nacc++] = put(o, (lm_stmt){.op = LM_S_ACC, .f = 0.0f}, saved);
  int32_t Lk = new_loop(o, saved, o->s->var_ext[r->var], LM_L_SERIAL);
  if (o->bad) return -1;
  o->cur = Lk;
  size_t mark = o->nu;
  bind_var(o, r->var, lm_x_var(x, Lk), Lk);
  int swap = Q != UINT32_MAX && r->swap;
  int64_t n1 = swap ? EQ : EP, n2 = swap ? EP : EQ;
  for (int64_t a = 0; a < n1 && !o->bad; a++)
    for (int64_t b = 0; b < n2 && !o->bad; b++) {
      int64_t u = swap ? b : a, v = swap ? a : b;
      size_t m2 = o->nu;
      bind_piece(o, P, lm_x_const(x, u), Lk);
      if (Q != UINT32_MAX) bind_piece(o, Q, lm_x_const(x, v), Lk);
      uint32_t val = value(o, o->t->n[i].c[0]);
      put(o, (lm_stmt){.op = LM_S_ACC_SUM, .a = o->accs[base + (size_t)(u * EQ + v)], .b = val}, Lk);
      undo_to(o, m2);
    }
  undo_to(o, mark);
  o->cur = saved;
  return (int)base;
}

/* Before the loop over piece P: every reduction in its body that is computed jointly over P
 * (and Q), reduction loop outermost, into a local array (or scalars when those loops unroll). */
static void realise(ob *o, uint32_t loop_term, uint32_t P) {
  uint32_t found[16];
  size_t nf = 0;
  memset(o->seen, 0, o->t->count);
  collect_reds(o, o->t->n[loop_term].c[0], P, found, &nf, LM_COUNTOF(found));
  lm_exprs *x = o->x;
  for (size_t q = 0; q < nf && !o->bad; q++) {
    uint32_t i = found[q];
    const sk_redattr *r = sk_red_of(o->s, o->t->n[i].attr);
    uint32_t Q = r->nj == 2 ? r->joint[1] : UINT32_MAX;
    if (r->op != SK_RED_SUM || r->var >= o->s->nvars || o->vexpr[r->var]) continue;
    if (Q != UINT32_MAX && (Q == P || Q >= o->npieces || o->pexpr[Q])) continue;
    int64_t EP = sk_piece_const(o->s, P), EQ = Q == UINT32_MAX ? 1 : sk_piece_const(o->s, Q);
    if (EP <= 0 || EQ <= 0 || EP * EQ > 8192) continue;
    /* feasible when P, Q and k bind every variable the body needs that is not bound already */
    size_t mark = o->nu;
    bind_piece(o, P, o->zero, o->cur);
    if (Q != UINT32_MAX) bind_piece(o, Q, o->zero, o->cur);
    bind_var(o, r->var, o->zero, o->cur);
    int ok = !o->bad;
    uint32_t body = o->t->n[i].c[0];
    for (size_t v = 0; v < o->s->nvars && ok; v++)
      if (fv_has(o, body, v) && !o->vexpr[v]) ok = 0;
    undo_to(o, mark);
    if (o->bad) {
      o->bad = 0; /* a piece bound twice: this joint reduction is not for this loop */
      continue;
    }
    if (!ok) continue;
    int kp = (int)sk_loop_of(o->s, o->t->n[loop_term].attr)->kind, kq = SK_UNROLL;
    if (Q != UINT32_MAX) {
      memset(o->seen, 0, o->t->count);
      kq = piece_kind(o, o->t->n[loop_term].c[0], Q);
    }
    if (kp == SK_UNROLL && kq == SK_UNROLL && EP <= 64 && EQ <= 64 && EP * EQ <= 128) {
      int regs = realise_regs(o, i, P, Q, EP, EQ);
      if (o->bad) return;
      if (!LM_GROW(o->r, o->rcap, o->nr + 1)) return ofail(o, "out of memory");
      o->r[o->nr++] = (real){i, 0, P, Q, EQ, o->cur, regs};
      continue;
    }
    int32_t saved = o->cur;
    lm_expr one = lm_x_const(x, 1);
    uint32_t la = new_local(o, EP * EQ);
    int32_t Li = new_loop(o, saved, lm_x_const(x, EP * EQ), LM_L_SERIAL);
    if (o->bad) return;
    o->cur = Li;
    uint32_t zero = put(o, (lm_stmt){.op = LM_S_CONST, .f = 0.0f}, -1);
    put(o, (lm_stmt){.op = LM_S_STORE, .a = zero, .buf = la, .local = 1, .idx = lm_x_var(x, Li), .valid = one}, Li);
    o->cur = saved;
    int32_t Lk = new_loop(o, saved, o->s->var_ext[r->var], LM_L_SERIAL);
    if (o->bad) return;
    o->cur = Lk;
    bind_var(o, r->var, lm_x_var(x, Lk), Lk);
    uint32_t first = P, second = Q;
    if (Q != UINT32_MAX && r->swap) first = Q, second = P;
    int32_t L1 = new_loop(o, Lk, sk_piece_of(o->s, first)->extent, LM_L_SERIAL);
    if (o->bad) return;
    o->cur = L1;
    bind_piece(o, first, lm_x_var(x, L1), L1);
    if (second != UINT32_MAX) {
      int32_t L2 = new_loop(o, L1, sk_piece_of(o->s, second)->extent, LM_L_SERIAL);
      if (o->bad) return;
      o->cur = L2;
      bind_piece(o, second, lm_x_var(x, L2), L2);
    }
    uint32_t v = value(o, o->t->n[i].c[0]);
    lm_expr idx = lm_x_mul(x, o->pexpr[P], lm_x_const(x, EQ));
    if (Q != UINT32_MAX) idx = lm_x_add(x, idx, o->pexpr[Q]);
    idx = simp(o, idx);
    uint32_t old = put(o, (lm_stmt){.op = LM_S_LOAD, .buf = la, .local = 1, .idx = idx, .valid = one}, o->cur);
    uint32_t sum = put(o, (lm_stmt){.op = LM_S_ADD, .a = old, .b = v}, o->cur);
    put(o, (lm_stmt){.op = LM_S_STORE, .a = sum, .buf = la, .local = 1, .idx = idx, .valid = one}, o->cur);
    undo_to(o, mark);
    o->cur = saved;
    if (!LM_GROW(o->r, o->rcap, o->nr + 1)) return ofail(o, "out of memory");
    o->r[o->nr++] = (real){i, la, P, Q, EQ, saved, -1};
  }
}

/* ---------------------------------------------------------------- shared-memory staging */

enum { STAGE_MAX = 4096, STAGE_TOTAL = 8192 }; /* floats per copy, and per kernel */

/* Loads under term node i that every thread of the work-group loop L makes alike: read-only
 * buffers, indexes over variables bound outside L and over the variables of enclosing
 * reductions (constant extents) — at least one of those, else there is nothing to share. */
static void stage_find(ob *o, uint32_t i, const uint32_t *reds, int nred, const uint8_t *written, int32_t L,
                       int64_t *total) {
  const lm_enode *n = &o->t->n[i];
  if (n->op == SK_LOAD) {
    const sk_access *ac = sk_access_of(o->s, n->attr);
    if (ac->buf >= o->s->plan->nbufs || written[ac->buf]) return;
    for (size_t q = 0; q < o->nstg; q++)
      if (o->stg[q].acc == n->attr) return;
    struct stg g = {.acc = n->attr};
    int64_t E = 1;
    for (size_t v = 0; v < o->s->nvars; v++) {
      if (!fv_has(o, i, v)) continue;
      if (o->vexpr[v]) {
        if (o->vat[v] == L) return; /* the thread's own */
        continue;
      }
      int r = -1;
      for (int q = 0; q < nred && r < 0; q++)
        if (reds[q] == v) r = q;
      const lm_xnode *e = lm_x_node(o->x, o->s->var_ext[v]);
      if (r < 0 || g.nv == 4 || e->op != LM_X_CONST || e->v < 1) return;
      g.var[g.nv] = (uint32_t)v, g.ext[g.nv++] = e->v;
      E *= e->v;
    }
    if (!g.nv || E > STAGE_MAX || *total + E > STAGE_TOTAL || !LM_GROW(o->stg, o->stgcap, o->nstg + 1)) return;
    g.local = UINT32_MAX;
    o->stg[o->nstg++] = g;
    *total += E;
    return;
  }
  if (n->op == SK_RAND || n->op == SK_CONST) return;
  uint32_t r2[16];
  int n2 = nred;
  memcpy(r2, reds, (size_t)nred * sizeof *reds);
  if (n->op == SK_RED && n2 < 16) r2[n2++] = sk_red_of(o->s, n->attr)->var;
  for (int c = 0; c < n->n; c++) stage_find(o, n->c[c], r2, n2, written, L, total);
}

/* At the top of work-group loop L (extent G): the threads copy every staged load's elements into
 * its shared array together (thread t the elements t, t + G, ...), then wait at a barrier. */
static void stage(ob *o, uint32_t body, int32_t L, int64_t G) {
  lm_exprs *x = o->x;
  uint8_t *written = lm_calloc(o->s->plan->nbufs + 1, 1);
  if (!written) return ofail(o, "out of memory");
  for (size_t i = 0; i < o->t->count; i++)
    if (o->t->n[i].op == SK_STORE) {
      uint32_t b = sk_access_of(o->s, o->t->n[i].attr)->buf;
      if (b < o->s->plan->nbufs) written[b] = 1;
    }
  size_t first = o->nstg;
  int64_t total = 0;
  uint32_t none[1] = {0};
  stage_find(o, body, none, 0, written, L, &total);
  lm_free(written);
  for (size_t q = first; q < o->nstg && !o->bad; q++) {
    struct stg *g = &o->stg[q];
    int64_t E = 1;
    for (int v = 0; v < g->nv; v++) E *= g->ext[v];
    uint32_t loc = lm_kernel_add_local(o->k, E, 1);
    if (loc == UINT32_MAX) return ofail(o, "out of memory");
    int32_t Lc = new_loop(o, L, lm_x_const(x, (E + G - 1) / G), LM_L_SERIAL);
    if (o->bad) return;
    o->cur = Lc;
    lm_expr e = lm_x_add(x, lm_x_mul(x, lm_x_var(x, Lc), lm_x_const(x, G)), lm_x_var(x, L));
    lm_expr in = lm_x_lt(x, e, lm_x_const(x, E));
    size_t mark = o->nu;
    int64_t stride = E;
    for (int v = 0; v < g->nv; v++) {
      stride /= g->ext[v];
      bind_var(o, g->var[v], simp(o, lm_x_mod(x, lm_x_div(x, e, lm_x_const(x, stride)), lm_x_const(x, g->ext[v]))), Lc);
    }
    const sk_access *ac = sk_access_of(o->s, g->acc);
    lm_expr valid = tx(o, ac->valid);
    lm_stmt ld = {.op = LM_S_LOAD, .buf = ac->buf, .idx = tx(o, ac->idx),
                  .valid = simp(o, valid ? lm_x_and(x, valid, in) : in)};
    if (!lm_kernel_use_buf(o->k, ac->buf)) return ofail(o, "out of memory");
    uint32_t v = put(o, ld, Lc);
    put(o, (lm_stmt){.op = LM_S_STORE, .a = v, .buf = loc, .local = 1, .idx = simp(o, e), .valid = in}, Lc);
    undo_to(o, mark);
    o->cur = L;
    o->stg[q].local = loc; /* loads in the body read it from here on */
  }
  if (o->nstg > first) put(o, (lm_stmt){.op = LM_S_BARRIER}, L);
}

/* ---------------------------------------------------------------- effects */

static void effect(ob *o, uint32_t i) {
  if (o->bad) return;
  const lm_enode *n = &o->t->n[i];
  lm_exprs *x = o->x;
  switch (n->op) {
  case SK_NOP: return;
  case SK_SEQ:
    effect(o, n->c[0]);
    effect(o, n->c[1]);
    return;
  case SK_KERNEL: effect(o, n->c[0]); return;
  case SK_STORE: {
    const sk_access *ac = sk_access_of(o->s, n->attr);
    uint32_t v = value(o, n->c[0]);
    lm_stmt s = {.op = LM_S_STORE, .a = v, .buf = ac->buf, .idx = tx(o, ac->idx), .valid = tx(o, ac->valid)};
    if (o->guard) s.valid = simp(o, s.valid ? lm_x_and(x, s.valid, o->guard) : o->guard);
    if (!lm_kernel_use_buf(o->k, ac->buf)) ofail(o, "out of memory");
    put(o, s, o->cur);
    return;
  }
  case SK_LOOP: {
    const sk_loopattr *la = sk_loop_of(o->s, n->attr);
    uint32_t P = la->piece;
    size_t rmark = o->nr;
    realise(o, i, P);
    lm_expr E = sk_piece_of(o->s, P)->extent;
    int64_t ce = sk_piece_const(o->s, P);
    if (la->kind == SK_UNROLL && ce > 0 && ce <= 64) {
      for (int64_t u = 0; u < ce && !o->bad; u++) {
        size_t mark = o->nu;
        bind_piece(o, P, lm_x_const(x, u), o->cur);
        effect(o, n->c[0]);
        undo_to(o, mark);
      }
    } else if (la->kind == SK_SER && ragged(o, P)) {
      /* a serial loop over a ragged split's tiles is peeled: the full tiles with plain indices,
       * then the last one (if any) reading its last row again and guarding its stores. One loop
       * with the guard and the clamp computes every row index as a sum of products of compares,
       * which the C compiler does not hoist: a 6x16 tile of a 512-row batch ran at half speed. */
      const sk_piece *q = sk_piece_of(o->s, P);
      lm_expr W = sk_piece_of(o->s, q->a)->extent, F = lm_x_const(x, q->b);
      lm_expr nfull = simp(o, lm_x_div(x, W, F));
      lm_expr ntail = simp(o, lm_x_div(x, lm_x_add(x, lm_x_mod(x, W, F), lm_x_const(x, q->b - 1)), F));
      for (int tail = 0; tail < 2 && !o->bad; tail++) {
        int32_t L = new_loop(o, o->cur, tail ? ntail : nfull, LM_L_SERIAL);
        if (o->bad) return;
        size_t mark = o->nu;
        o->full[P] = !tail;
        bind_piece(o, P, tail ? lm_x_add(x, nfull, lm_x_var(x, L)) : lm_x_var(x, L), L);
        int32_t saved = o->cur;
        o->cur = L;
        effect(o, n->c[0]);
        o->cur = saved;
        undo_to(o, mark);
        o->full[P] = 0;
      }
    } else {
      int group = la->kind == SK_GROUP || la->kind == SK_GROUP_STAGED;
      int32_t L = new_loop(o, o->cur, E, la->kind == SK_PAR || group ? LM_L_PARALLEL : LM_L_SERIAL);
      if (o->bad) return;
      if (group && (o->group_loop >= 0 || ce < 1)) return ofail(o, "two work-group loops, or one of symbolic extent");
      if (group) o->group_loop = L;
      size_t mark = o->nu;
      bind_piece(o, P, lm_x_var(x, L), L);
      int32_t saved = o->cur;
      o->cur = L;
      if (la->kind == SK_GROUP_STAGED) stage(o, n->c[0], L, ce);
      effect(o, n->c[0]);
      o->cur = saved;
      undo_to(o, mark);
    }
    o->nr = rmark;
    return;
  }
  default: ofail(o, "a value used as an effect"); return;
  }
}

/* ---------------------------------------------------------------- the parallel domain */

static int has_global_store(const lm_kernel *k, int32_t loop) {
  const lm_block *b = loop < 0 ? &k->root : &k->loops[loop].body;
  for (size_t i = 0; i < b->n; i++) {
    lm_item it = b->items[i];
    if (it.is_loop ? has_global_store(k, (int32_t)it.id)
                   : (k->stmts[it.id].op == LM_S_STORE && !k->stmts[it.id].local))
      return 1;
  }
  return 0;
}

/* The chain of parallel loops from the root (each the only parallel loop of its block, beside
 * nothing that stores to a buffer) becomes loops 0..npar-1; expressions follow the renumbering. */
static void finish(ob *o) {
  lm_kernel *k = o->k;
  size_t nl = k->nloops;
  int32_t *chain = lm_calloc(nl + 1, sizeof *chain), *map = lm_calloc(nl + 1, sizeof *map);
  lm_expr *xm = lm_calloc(nl + 1, sizeof *xm);
  lm_loop *nloops = lm_calloc(nl + 1, sizeof *nloops);
  if (!chain || !map || !xm || !nloops) {
    ofail(o, "out of memory");
    goto done;
  }
  int npar = 0;
  for (int32_t cur = -1;;) {
    const lm_block *b = blk(k, cur);
    int32_t par = -1;
    int npl = 0, stores = 0;
    for (size_t i = 0; i < b->n; i++) {
      lm_item it = b->items[i];
      if (it.is_loop && k->loops[it.id].kind == LM_L_PARALLEL) npl++, par = (int32_t)it.id;
      else if (!it.is_loop && k->stmts[it.id].op == LM_S_STORE && !k->stmts[it.id].local) stores++;
    }
    if (npl != 1 || stores) break;
    for (size_t i = 0; i < b->n; i++)
      if (b->items[i].is_loop && (int32_t)b->items[i].id != par && has_global_store(k, (int32_t)b->items[i].id))
        stores++;
    if (stores) break;
    chain[npar++] = par;
    cur = par;
  }
  /* GPU dialects run what sits outside the innermost parallel loop in every thread (a joint
   * reduction placed at the root would redo the whole kernel per thread): constants only there */
  for (int d = 0; o->s->gpu && d < npar; d++) {
    const lm_block *gb = blk(k, d ? chain[d - 1] : -1);
    for (size_t i = 0; i < gb->n; i++)
      if (gb->items[i].is_loop ? (int32_t)gb->items[i].id != chain[d] : k->stmts[gb->items[i].id].op != LM_S_CONST) {
        ofail(o, "work outside the innermost parallel loop (every GPU thread would repeat it)");
        goto done;
      }
  }
  if (o->group_loop >= 0) { /* the threads of a work-group: the innermost loop of the domain */
    if (npar < 2 || chain[npar - 1] != o->group_loop) {
      ofail(o, "a work-group loop that is not the innermost loop of the parallel domain");
      goto done;
    }
    k->group = (int32_t)lm_x_node(o->x, k->loops[o->group_loop].extent)->v;
  }
  for (size_t i = 0; i < nl; i++) map[i] = -1;
  for (int i = 0; i < npar; i++) map[chain[i]] = i;
  int32_t next = npar;
  for (size_t i = 0; i < nl; i++)
    if (map[i] < 0) map[i] = next++;
  for (size_t i = 0; i < nl; i++) xm[i] = lm_x_var(o->x, map[i]);
  for (size_t i = 0; i < nl; i++) {
    lm_loop l = k->loops[i];
    l.parent = l.parent < 0 ? -1 : map[l.parent];
    for (size_t j = 0; j < l.body.n; j++)
      if (l.body.items[j].is_loop) l.body.items[j].id = (uint32_t)map[l.body.items[j].id];
    nloops[map[i]] = l;
  }
  for (size_t j = 0; j < k->root.n; j++)
    if (k->root.items[j].is_loop) k->root.items[j].id = (uint32_t)map[k->root.items[j].id];
  if (nl) memcpy(k->loops, nloops, nl * sizeof *nloops);
  lm_expr *ext2 = lm_calloc(nl + 1, sizeof *ext2);
  if (!ext2) {
    ofail(o, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < nl; i++) ext2[i] = k->loops[i].extent;
  lm_xctx c = {.extent = ext2, .nvars = (int)nl};
  for (size_t i = 0; i < k->nstmts; i++) {
    lm_stmt *s = &k->stmts[i];
    if (s->loop >= 0) s->loop = map[s->loop];
    if (s->idx) s->idx = lm_x_simplify(o->x, lm_x_subst(o->x, s->idx, xm, (int)nl), &c);
    if (s->valid) s->valid = lm_x_simplify(o->x, lm_x_subst(o->x, s->valid, xm, (int)nl), &c);
    if (s->step) s->step = lm_x_simplify(o->x, lm_x_subst(o->x, s->step, xm, (int)nl), &c);
  }
  lm_free(ext2);
  k->npar = npar;
done:
  lm_free(chain);
  lm_free(map);
  lm_free(xm);
  lm_free(nloops);
}

/* ---------------------------------------------------------------- entry */

static void set_expr_vars(ob *o, uint64_t *w, lm_expr e) {
  if (!e) return;
  const lm_xnode *n = &o->x->nodes[e];
  switch (n->op) {
  case LM_X_CONST:
  case LM_X_SYM: return;
  case LM_X_VAR:
    if (n->v >= 0 && (size_t)n->v < o->s->nvars) w[n->v >> 6] |= 1ull << (n->v & 63);
    return;
  default:
    set_expr_vars(o, w, n->a);
    set_expr_vars(o, w, n->b);
  }
}

static void clear_piece_vars(ob *o, uint64_t *w, uint32_t p) {
  const sk_piece *q = sk_piece_of(o->s, p);
  switch (q->type) {
  case SKP_ORIG:
    if (q->a < o->s->nvars) w[q->a >> 6] &= ~(1ull << (q->a & 63));
    return;
  case SKP_OUT:
  case SKP_IN: clear_piece_vars(o, w, q->a); return;
  default:
    clear_piece_vars(o, w, q->a);
    clear_piece_vars(o, w, q->b);
  }
}

/* Exact free variables of every term node (children come first). */
static void free_vars(ob *o) {
  lm_sk *s = o->s;
  for (size_t i = 0; i < o->t->count; i++) {
    const lm_enode *n = &o->t->n[i];
    uint64_t *w = &o->fv[i * o->W];
    for (int c = 0; c < n->n; c++)
      for (size_t j = 0; j < o->W; j++) w[j] |= o->fv[(size_t)n->c[c] * o->W + j];
    switch (n->op) {
    case SK_LOAD:
    case SK_RAND:
    case SK_SELECT:
    case SK_STORE: {
      const sk_access *a = sk_access_of(s, n->attr);
      set_expr_vars(o, w, a->idx);
      set_expr_vars(o, w, a->valid);
      set_expr_vars(o, w, a->step);
      break;
    }
    case SK_LOOP: clear_piece_vars(o, w, sk_loop_of(s, n->attr)->piece); break;
    case SK_RED: {
      uint32_t v = sk_red_of(s, n->attr)->var;
      if (v < s->nvars) w[v >> 6] &= ~(1ull << (v & 63));
      break;
    }
    default: break;
    }
  }
}

lm_status sk_emit_kernel(lm_sk *s, const sk_term *t, uint32_t node, const lm_kernel *like, lm_kernel *out) {
  memset(out, 0, sizeof *out);
  if (like) {
    memcpy(out->name, like->name, sizeof out->name);
    out->anchor = like->anchor;
  }
  ob o = {.s = s, .t = t, .k = out, .x = s->x, .cur = -1, .group_loop = -1};
  o.npieces = s->pieces.n;
  o.vexpr = lm_calloc(s->nvars + 1, sizeof *o.vexpr);
  o.vat = lm_calloc(s->nvars + 1, sizeof *o.vat);
  o.pexpr = lm_calloc(o.npieces + 1, sizeof *o.pexpr);
  o.pat = lm_calloc(o.npieces + 1, sizeof *o.pat);
  o.full = lm_calloc(o.npieces + 1, 1);
  o.W = (s->nvars + 63) / 64 + 1;
  o.fv = lm_calloc((t->count + 1) * o.W, sizeof *o.fv);
  o.seen = lm_calloc(t->count + 1, 1);
  o.zero = lm_x_const(s->x, 0);
  s->why[0] = 0;
  lm_status st = LM_OK;
  if (!o.vexpr || !o.vat || !o.pexpr || !o.pat || !o.full || !o.fv || !o.seen) st = LM_ERR_NOMEM;
  else {
    free_vars(&o);
    effect(&o, node);
    if (!o.bad) finish(&o);
    if (o.bad) st = LM_ERR_INVALID;
    else if (s->x->failed) st = LM_ERR_NOMEM;
  }
  lm_free(o.vexpr);
  lm_free(o.vat);
  lm_free(o.stg);
  lm_free(o.pexpr);
  lm_free(o.pat);
  lm_free(o.full);
  lm_free(o.fv);
  lm_free(o.seen);
  lm_free(o.u);
  lm_free(o.r);
  lm_free(o.m);
  lm_free(o.accs);
  lm_free(o.ext);
  if (st != LM_OK) {
    lm_kernel_free(out);
    if (st == LM_ERR_NOMEM) snprintf(s->why, sizeof s->why, "out of memory");
    return lm_fail(st, "search: cannot emit the kernel: %s", s->why);
  }
  return LM_OK;
}
