/* compiler/columns.c — short column loops of a kernel in lane form unrolled into their lane
 * loop (the cpu schedule, after lanes.c and inplace.c, before lazy.c).
 *
 * An env's state is a few columns stacked into one row per env (envs/common.c: the sum over k
 * of col_k padded to column k). In lane form the stack is a loop over the columns around a lane
 * loop, and each column's value is a sum of padded loads, one per column:
 *   for c < 4: lanes j: D[c*L + j] = (c == 0 ? X0[j] : 0) + (c == 1 ? X1[j] : 0) + ...
 * The conditions hold c, so the C compiler must keep every load with a blend, and every add,
 * 4 columns x 4 terms per lane, and how well it vectorises that varies: the example env's
 * env-only step (rlbench, one thread) ran at 4.5e7 steps/s so, 1.1e8 unrolled (CartPole's ran
 * as fast either way). Unrolled into the lane loop with c a constant, the conditions fold:
 * each column is its own load plus zeros, which the C compiler drops where the value cannot be
 * -0 (x + 0 + 0 is x + 0):
 *   lanes j: D[j] = X0[j] + 0 + 0 + 0; D[L + j] = 0 + X1[j] + 0 + 0; ...
 * The same operations on the same values, in the same order for each element: bit-identical.
 * Sums and products of two constants are folded (float arithmetic, as the kernel would do it).
 * A loop qualifies when
 *   - it is serial with a constant extent of at most MAX_COLS, and holds statements without
 *     side effects followed by one lane loop without loops of its own, of at most MAX_BODY
 *     statements (a layer's output loop of a policy is no stack: unrolled, it only grows);
 *   - some padding (a load or select) in it has a condition that folds once c is a constant;
 *   - its statements are plain arithmetic, loads and stores (no accumulators, no draws);
 *   - nothing it stores (local arrays, or plan buffers such as a per-step output) is loaded in
 *     it, its stores hold in the same lanes in every column, and they name a different element
 *     at every point of the two loops (each point's offset from the first store, a constant
 *     for every value of the symbols), so running the columns inside the lanes changes no
 *     value. */
#include <math.h>
#include <string.h>

#include "core.h"
#include "loopir.h"

enum { MAX_COLS = 8, MAX_POINTS = 8 * 64, MAX_BODY = 64 };

static int plain(uint8_t op) {
  return op != LM_S_ACC && op != LM_S_ACC_SUM && op != LM_S_ACC_MAX && op != LM_S_BARRIER && op != LM_S_WARP_SUM &&
         op != LM_S_WARP_MAX && op != LM_S_RAND;
}

/* Loop L's statements and those of its lane loop C: plain, with paddings that fold; what they
 * store (local arrays or plan buffers) is not loaded in L, at elements a constant apart from the
 * first store's at (0, 0) (proved over the symbols), all different. */
static int qualifies(const lm_kernel *k, lm_exprs *x, int32_t L, int32_t C, int64_t E, int64_t lanes) {
  const lm_block *bl = &k->loops[L].body, *bc = &k->loops[C].body;
  const lm_block *bs[2] = {bl, bc};
  size_t nv = k->nloops;
  lm_expr *at = lm_calloc(nv + 1, sizeof *at);
  int64_t(*seen)[2] = lm_calloc(MAX_POINTS * 8 + 1, sizeof *seen);
  size_t nseen = 0;
  int ok = at && seen && bc->n <= MAX_BODY && L < 64, folds = 0;
  if (ok) at[L] = lm_x_const(x, 0);
  for (int w = 0; w < 2 && ok; w++)
    for (size_t i = 0; i < bs[w]->n && ok; i++) {
      if (bs[w]->items[i].is_loop) continue;
      const lm_stmt *s = &k->stmts[bs[w]->items[i].id];
      ok = plain(s->op) && (w == 1 || s->op != LM_S_STORE);
      if ((s->op == LM_S_LOAD || s->op == LM_S_SELECT) && s->valid && lm_x_node(x, s->valid)->op != LM_X_CONST) {
        lm_expr v = lm_x_subst(x, s->valid, at, (int)nv);
        folds |= v && lm_x_node(x, v)->op == LM_X_CONST;
      }
      if (s->op != LM_S_STORE) continue;
      ok = ok && s->valid && !(lm_x_vars_used(x, s->valid) >> L & 1); /* the same lanes in every column */
      for (int w2 = 0; w2 < 2 && ok; w2++) /* what L stores it does not load */
        for (size_t j = 0; j < bs[w2]->n && ok; j++) {
          const lm_stmt *o = &k->stmts[bs[w2]->items[j].id];
          ok = bs[w2]->items[j].is_loop || !(o->op == LM_S_LOAD && o->local == s->local && o->buf == s->buf);
        }
    }
  ok = ok && folds && !x->failed;
  for (size_t i = 0; i < bc->n && ok; i++) { /* the elements stored, relative to the first store */
    const lm_stmt *s = &k->stmts[bc->items[i].id];
    if (s->op != LM_S_STORE) continue;
    lm_expr base = 0;
    for (size_t j = 0; j <= i && !base; j++) {
      const lm_stmt *f = &k->stmts[bc->items[j].id];
      if (f->op == LM_S_STORE && f->local == s->local && f->buf == s->buf) {
        at[L] = at[C] = lm_x_const(x, 0);
        base = lm_x_subst(x, f->idx, at, (int)nv);
      }
    }
    if (nseen + (size_t)(E * lanes) > MAX_POINTS * 8) ok = 0;
    for (int64_t c = 0; c < E && ok; c++)
      for (int64_t j = 0; j < lanes && ok; j++) {
        at[L] = lm_x_const(x, c), at[C] = lm_x_const(x, j);
        lm_expr d = lm_x_simplify(x, lm_x_sub(x, lm_x_subst(x, s->idx, at, (int)nv), base), NULL);
        if (!d || x->failed || lm_x_node(x, d)->op != LM_X_CONST) {
          ok = 0;
          break;
        }
        int64_t key = (int64_t)s->buf * 2 + s->local, off = lm_x_node(x, d)->v;
        for (size_t q = 0; q < nseen && ok; q++) ok = !(seen[q][0] == key && seen[q][1] == off);
        seen[nseen][0] = key, seen[nseen][1] = off, nseen++;
      }
  }
  lm_free(at);
  lm_free(seen);
  return ok;
}

/* Appends to C's new block the statements of old block b with L's variable = c; smap maps old
 * statements to new ones. A padding whose condition folds to true is its operand, to false a 0. */
static int unroll_block(lm_kernel *k, lm_exprs *x, const lm_item *items, size_t n, int32_t C, lm_expr *vmap, size_t nv,
                        uint32_t *smap, lm_block *into) {
  for (size_t i = 0; i < n; i++) {
    lm_stmt s = k->stmts[items[i].id];
    int m = lm_sop_operands(s.op);
    if ((m & LM_OPND_A) && smap[s.a] != UINT32_MAX) s.a = smap[s.a];
    if ((m & LM_OPND_B) && smap[s.b] != UINT32_MAX) s.b = smap[s.b];
    s.loop = C;
    s.idx = s.idx ? lm_x_subst(x, s.idx, vmap, (int)nv) : 0;
    s.valid = s.valid ? lm_x_subst(x, s.valid, vmap, (int)nv) : 0;
    if (x->failed) return -1;
    const lm_stmt *a = &k->stmts[s.a], *b = &k->stmts[s.b];
    int consts = (s.op == LM_S_ADD || s.op == LM_S_MUL) && a->op == LM_S_CONST && b->op == LM_S_CONST;
    float folded = !consts ? 0.0f : s.op == LM_S_ADD ? a->f + b->f : a->f * b->f;
    if ((s.op == LM_S_SELECT || s.op == LM_S_LOAD) && s.valid && lm_x_is_const(x, s.valid, 0))
      s = (lm_stmt){.op = LM_S_CONST, .loop = C, .f = 0.0f};
    else if (consts && isfinite(folded)) /* 0 + 0 (a NaN or inf result stays computed) */
      s = (lm_stmt){.op = LM_S_CONST, .loop = C, .f = folded};
    else if (s.op == LM_S_SELECT && s.valid && lm_x_is_const(x, s.valid, 1)) {
      smap[items[i].id] = s.a;
      continue;
    }
    if (!LM_GROW(k->stmts, k->stmtcap, k->nstmts + 1) || !lm_block_insert(into, into->n, (lm_item){0, (uint32_t)k->nstmts}))
      return -1;
    k->stmts[k->nstmts] = s;
    smap[items[i].id] = (uint32_t)k->nstmts++;
  }
  return 0;
}

/* Loop L (around lane loop C) unrolled into C, which takes L's place. */
static int unroll(lm_kernel *k, lm_exprs *x, int32_t L, int32_t C, int64_t E) {
  size_t ns = k->nstmts, nv = k->nloops;
  lm_block old_l = k->loops[L].body, old_c = k->loops[C].body, fresh = {0};
  size_t pre = lm_block_find(&old_l, 1, (uint32_t)C); /* L's statements before C */
  uint32_t *smap = lm_malloc((ns + 1) * sizeof *smap);
  lm_expr *vmap = lm_calloc(nv + 1, sizeof *vmap);
  int st = smap && vmap ? 0 : -1;
  for (int64_t c = 0; c < E && st == 0; c++) {
    for (size_t i = 0; i <= ns; i++) smap[i] = UINT32_MAX;
    vmap[L] = lm_x_const(x, c);
    st = unroll_block(k, x, old_l.items, pre, C, vmap, nv, smap, &fresh);
    if (st == 0) st = unroll_block(k, x, old_c.items, old_c.n, C, vmap, nv, smap, &fresh);
  }
  lm_free(smap);
  lm_free(vmap);
  if (st < 0) {
    lm_free(fresh.items);
    return -1;
  }
  /* the old statements leave every block: constants nothing uses */
  for (size_t w = 0; w < 2; w++) {
    const lm_block *b = w ? &old_c : &old_l;
    for (size_t i = 0; i < b->n; i++)
      if (!b->items[i].is_loop) k->stmts[b->items[i].id] = (lm_stmt){.op = LM_S_CONST, .loop = w ? C : L};
  }
  int32_t p = k->loops[L].parent;
  lm_block *pb = p < 0 ? &k->root : &k->loops[p].body;
  pb->items[lm_block_find(pb, 1, (uint32_t)L)] = (lm_item){1, (uint32_t)C};
  k->loops[C].parent = p;
  k->loops[C].body = fresh;
  lm_free(old_c.items);
  k->loops[L].body.n = 0; /* L is in no block now */
  return 1;
}

int lm_lanes_columns(lm_kernel *k, lm_exprs *x) {
  int made = 0;
  size_t nloops = k->nloops;
  for (size_t l = 0; l < nloops; l++) {
    const lm_loop *lp = &k->loops[l];
    const lm_xnode *e = lm_x_node(x, lp->extent);
    if (lp->kind != LM_L_SERIAL || e->op != LM_X_CONST || e->v < 2 || e->v > MAX_COLS || lp->body.n == 0) continue;
    const lm_item *last = &lp->body.items[lp->body.n - 1];
    if (!last->is_loop) continue;
    int32_t C = (int32_t)last->id;
    const lm_loop *cp = &k->loops[C];
    const lm_xnode *ce = lm_x_node(x, cp->extent);
    int bad = cp->kind != LM_L_LANES || ce->op != LM_X_CONST || ce->v > 64;
    for (size_t i = 0; i + 1 < lp->body.n && !bad; i++) bad = lp->body.items[i].is_loop;
    for (size_t i = 0; i < cp->body.n && !bad; i++) bad = cp->body.items[i].is_loop;
    int64_t E = e->v, lanes = ce->v;
    if (bad || !qualifies(k, x, (int32_t)l, C, E, lanes)) continue;
    int r = unroll(k, x, (int32_t)l, C, E);
    if (r < 0) return -1;
    made += r;
  }
  return x->failed ? -1 : made;
}
