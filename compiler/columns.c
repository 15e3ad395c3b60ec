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
 *   - some padding (a load or select) in it has a condition that folds once c is a constant,
 *     or some access in it reads or writes rows of the columns, one row per lane (column c of
 *     lane j at element c + E j from the first, an env's state or observation as [N, E]
 *     rows): column-major, each column is a stride-E access the C compiler makes a gather or
 *     a scatter per vector, unrolled into one lane loop the E columns are one interleaved
 *     access it shuffles (CartPole's vec-env step of 4096 envs, a scan of one step that
 *     copies the state in and out: 48 -> 40 us on one thread, clang 14, AVX-512);
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

/* 1 when s is a load or store of rows: element c + E j of lane j's column c, relative to
 * column 0 of lane 0 (at: scratch, nv variables; at[L] and at[C] are left set). */
static int rows(lm_exprs *x, const lm_stmt *s, int32_t L, int32_t C, int64_t E, lm_expr *at, size_t nv) {
  if ((s->op != LM_S_LOAD && s->op != LM_S_STORE) || !s->idx) return 0;
  lm_expr first = 0;
  for (int p = 0; p < 3; p++) { /* (0, 0), then column 1 of lane 0, then column 0 of lane 1 */
    at[L] = lm_x_const(x, p == 1), at[C] = lm_x_const(x, p == 2);
    lm_expr e = lm_x_subst(x, s->idx, at, (int)nv);
    if (!e || x->failed) return 0;
    if (p == 0) {
      first = e;
      continue;
    }
    lm_expr d = lm_x_simplify(x, lm_x_sub(x, e, first), NULL);
    if (!d || x->failed || lm_x_node(x, d)->op != LM_X_CONST || lm_x_node(x, d)->v != (p == 1 ? 1 : E)) return 0;
  }
  return 1;
}

/* Loop L's statements and those of its lane loop C: plain, with paddings that fold or rows; what they
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
  for (size_t i = 0; i < bc->n && ok && !folds; i++)
    if (!bc->items[i].is_loop) folds = rows(x, &k->stmts[bc->items[i].id], L, C, E, at, nv);
  if (ok) at[L] = lm_x_const(x, 0), at[C] = 0;
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
                        uint32_t *smap, lm_block *into, const lm_xctx *ctx) {
  for (size_t i = 0; i < n; i++) {
    lm_stmt s = k->stmts[items[i].id];
    int m = lm_sop_operands(s.op);
    if ((m & LM_OPND_A) && smap[s.a] != UINT32_MAX) s.a = smap[s.a];
    if ((m & LM_OPND_B) && smap[s.b] != UINT32_MAX) s.b = smap[s.b];
    s.loop = C;
    s.idx = s.idx ? lm_x_subst(x, s.idx, vmap, (int)nv) : 0;
    s.valid = s.valid ? lm_x_subst(x, s.valid, vmap, (int)nv) : 0;
    if (ctx && s.valid) s.valid = lm_x_simplify(x, s.valid, ctx); /* a split piece's range folds it */
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
    st = unroll_block(k, x, old_l.items, pre, C, vmap, nv, smap, &fresh, NULL);
    if (st == 0) st = unroll_block(k, x, old_c.items, old_c.n, C, vmap, nv, smap, &fresh, NULL);
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

/* Loop l as a serial loop of constant extent (*E) holding statements, then one lane loop (*C, of
 * *lanes <= 64) holding statements only: 0 when it is not one. */
static int column_loop(const lm_kernel *k, lm_exprs *x, size_t l, int32_t *C, int64_t *E, int64_t *lanes) {
  const lm_loop *lp = &k->loops[l];
  const lm_xnode *e = lm_x_node(x, lp->extent);
  if (lp->kind != LM_L_SERIAL || e->op != LM_X_CONST || e->v < 2 || lp->body.n == 0) return 0;
  const lm_item *last = &lp->body.items[lp->body.n - 1];
  if (!last->is_loop) return 0;
  *C = (int32_t)last->id;
  const lm_loop *cp = &k->loops[*C];
  const lm_xnode *ce = lm_x_node(x, cp->extent);
  int bad = cp->kind != LM_L_LANES || ce->op != LM_X_CONST || ce->v > 64;
  for (size_t i = 0; i + 1 < lp->body.n && !bad; i++) bad = lp->body.items[i].is_loop;
  for (size_t i = 0; i < cp->body.n && !bad; i++) bad = cp->body.items[i].is_loop;
  *E = e->v, *lanes = ce->v;
  return !bad;
}

int lm_lanes_columns(lm_kernel *k, lm_exprs *x) {
  int made = 0;
  size_t nloops = k->nloops;
  for (size_t l = 0; l < nloops; l++) {
    int32_t C;
    int64_t E, lanes;
    if (!column_loop(k, x, l, &C, &E, &lanes) || E > MAX_COLS || !qualifies(k, x, (int32_t)l, C, E, lanes)) continue;
    int r = unroll(k, x, (int32_t)l, C, E);
    if (r < 0) return -1;
    made += r;
  }
  return x->failed ? -1 : made;
}

/* ---------------------------------------------------------------- splitting
 *
 * A long column loop whose statements test its variable against constants (a stacked state's
 * scalar columns before its maps, one map's columns after another's) split where those tests
 * change: pieces of at least MIN_PIECE columns, each a copy of the loop over its own range
 * with every test that the range decides folded (a pick that always holds is its operand, one
 * that never does a 0), runs of shorter ones kept together. The pieces run in the loop's order,
 * so every value and every accumulation is what it was. Breakout's state update tested each of
 * its 108 columns against the 8 scalar columns' ranges, 8 picks per element; split, the map's
 * 100 columns pick nothing. Not a rewrite rule: the search does not see a fused scan's kernel
 * (its local arrays), and this acts on the lane form the lanes pass makes. */
enum { MIN_PIECE = 8, MAX_PIECES = 6, MAX_SPLIT_EXTENT = 4096 };

/* Marks in cut[1..E-1] where a test `v + k < c` or `c < v + k` of e on variable L changes. */
static void tests_of(const lm_exprs *x, lm_expr e, int32_t L, int64_t E, uint8_t *cut) {
  const lm_xnode *n = lm_x_node(x, e);
  if (n->op == LM_X_CONST || n->op == LM_X_VAR || n->op == LM_X_SYM) return;
  if (n->op == LM_X_LT) {
    for (int side = 0; side < 2; side++) {
      const lm_xnode *v = lm_x_node(x, side ? n->b : n->a), *c = lm_x_node(x, side ? n->a : n->b);
      int64_t off = 0;
      if (v->op == LM_X_ADD && lm_x_node(x, v->a)->op == LM_X_VAR && lm_x_node(x, v->b)->op == LM_X_CONST)
        off = lm_x_node(x, v->b)->v, v = lm_x_node(x, v->a);
      else if (v->op == LM_X_ADD && lm_x_node(x, v->b)->op == LM_X_VAR && lm_x_node(x, v->a)->op == LM_X_CONST)
        off = lm_x_node(x, v->a)->v, v = lm_x_node(x, v->b);
      if (v->op != LM_X_VAR || v->v != L || c->op != LM_X_CONST) continue;
      int64_t at = side ? c->v - off + 1 : c->v - off; /* c < v + k holds from v = c - k + 1 */
      if (at > 0 && at < E) cut[at] = 1;
    }
  }
  if (n->a) tests_of(x, n->a, L, E, cut);
  if (n->b) tests_of(x, n->b, L, E, cut);
}

/* The pieces of loop L (lo[i] .. hi[i]-1, in order): their number, 1 when there is nothing to split */
static int pieces_of(const lm_kernel *k, lm_exprs *x, int32_t L, int32_t C, int64_t E, int64_t *lo, int64_t *hi) {
  uint8_t *cut = lm_calloc((size_t)E + 1, 1);
  if (!cut) return 1;
  const lm_block *bs[2] = {&k->loops[L].body, &k->loops[C].body};
  int plain_only = 1;
  for (int w = 0; w < 2; w++)
    for (size_t i = 0; i < bs[w]->n; i++) {
      if (bs[w]->items[i].is_loop) continue;
      const lm_stmt *s = &k->stmts[bs[w]->items[i].id];
      plain_only &= plain(s->op) && (w == 1 || s->op != LM_S_STORE);
      if (s->valid && (s->op == LM_S_LOAD || s->op == LM_S_SELECT)) tests_of(x, s->valid, L, E, cut);
    }
  int n = 0, longest = 0;
  for (int64_t a = 0; a < E && plain_only;) {
    int64_t b = a + 1;
    while (b < E && !cut[b]) b++;
    int is_long = b - a >= MIN_PIECE;
    if (n > 0 && !is_long && hi[n - 1] - lo[n - 1] < MIN_PIECE && hi[n - 1] == a) hi[n - 1] = b; /* short runs together */
    else if (n == MAX_PIECES) {
      n = 1;
      break;
    } else lo[n] = a, hi[n] = b, n++;
    longest |= is_long;
    a = b;
  }
  lm_free(cut);
  return plain_only && longest && n > 1 ? n : 1;
}

/* Loop L (around lane loop C) replaced by one copy per piece, in order. */
static int split(lm_kernel *k, lm_exprs *x, int32_t L, int32_t C, const int64_t *lo, const int64_t *hi, int np) {
  size_t ns = k->nstmts, nv = k->nloops;
  lm_block old_l = k->loops[L].body, old_c = k->loops[C].body;
  size_t pre = lm_block_find(&old_l, 1, (uint32_t)C);
  int32_t parent = k->loops[L].parent;
  uint32_t *smap = lm_malloc((ns + 1) * sizeof *smap);
  lm_expr *vmap = lm_calloc(nv + 1, sizeof *vmap), *ext = NULL;
  int st = smap && vmap ? 0 : -1;
  for (int p = 0; p < np && st == 0; p++) {
    int32_t L2 = lm_kernel_add_loop_before(k, parent, L, lm_x_const(x, hi[p] - lo[p]), LM_L_SERIAL);
    int32_t C2 = L2 < 0 ? -1 : lm_kernel_add_loop(k, L2, k->loops[C].extent, (lm_loopkind)k->loops[C].kind);
    lm_free(ext);
    ext = lm_calloc(k->nloops + 1, sizeof *ext);
    if (C2 < 0 || !ext) {
      st = -1;
      break;
    }
    for (size_t i = 0; i < k->nloops; i++) ext[i] = k->loops[i].extent;
    lm_xctx ctx = {.extent = ext, .nvars = (int)k->nloops};
    for (size_t i = 0; i <= ns; i++) smap[i] = UINT32_MAX;
    vmap[L] = lm_x_add(x, lm_x_var(x, L2), lm_x_const(x, lo[p]));
    vmap[C] = lm_x_var(x, C2);
    lm_block fresh = {0};
    st = unroll_block(k, x, old_l.items, pre, L2, vmap, nv, smap, &fresh, &ctx);
    if (st == 0 && !lm_block_insert(&fresh, fresh.n, (lm_item){1, (uint32_t)C2})) st = -1;
    lm_free(k->loops[L2].body.items);
    k->loops[L2].body = fresh;
    if (st == 0) st = unroll_block(k, x, old_c.items, old_c.n, C2, vmap, nv, smap, &k->loops[C2].body, &ctx);
  }
  lm_free(smap);
  lm_free(vmap);
  lm_free(ext);
  if (st < 0) return -1;
  for (size_t w = 0; w < 2; w++) { /* the old statements: constants nothing uses, in no block */
    const lm_block *b = w ? &old_c : &old_l;
    for (size_t i = 0; i < b->n; i++)
      if (!b->items[i].is_loop) k->stmts[b->items[i].id] = (lm_stmt){.op = LM_S_CONST, .loop = w ? C : L};
  }
  lm_block *pb = parent < 0 ? &k->root : &k->loops[parent].body;
  size_t at = lm_block_find(pb, 1, (uint32_t)L);
  memmove(&pb->items[at], &pb->items[at + 1], (pb->n - at - 1) * sizeof *pb->items);
  pb->n--;
  k->loops[L].body.n = 0;
  k->loops[C].body.n = 0;
  return 1;
}

int lm_lanes_split(lm_kernel *k, lm_exprs *x) {
  int made = 0;
  size_t nloops = k->nloops;
  for (size_t l = 0; l < nloops; l++) {
    int32_t C;
    int64_t E, lanes, lo[MAX_PIECES], hi[MAX_PIECES];
    if (!column_loop(k, x, l, &C, &E, &lanes) || E < 2 * MIN_PIECE || E > MAX_SPLIT_EXTENT) continue;
    int np = pieces_of(k, x, (int32_t)l, C, E, lo, hi);
    if (np < 2) continue;
    if (split(k, x, (int32_t)l, C, lo, hi, np) < 0) return -1;
    made++;
  }
  return x->failed ? -1 : made;
}

/* ---------------------------------------------------------------- index values
 *
 * lm_arange (compiler/ops.c) is a sum of views, one per binary digit: entry i reads 2^k where
 * bit k of i is set. In a kernel each entry is a chain of log2(n) picks of constants added up,
 * `(0 < c / 2^k % 2) ? 2^k : 0 + ...`, recomputed for every point of the loop it is read in:
 * Breakout's step compares a cell index with each of its 108 columns, in three passes, every
 * step. Where a sum of constants and picks of them (valid ? v : 0) equals an index expression e
 * at every point of the one constant loop its picks test (checked point by point, with every
 * partial sum a whole number below 2^24 and no -0, so the float sum is exact and equals e), it
 * becomes LM_S_INDEX, the float of e: the same value. Candidates for e: the number whose digit
 * a pick tests (`0 < e / 2^k % 2`, `0 < e % 2`), and the line through the first two points.
 * Not a rewrite rule: the search does not see a fused scan's lane kernel (as for the split). */
enum { INDEX_MAX_POINTS = 1 << 16, INDEX_MAX_NODES = 256, INDEX_MAX_CANDIDATES = 8 };
#define INDEX_EXACT 16777216.0 /* 2^24: whole numbers below it are floats, their sums exact */

/* Records in *var the one loop variable e names (-1: none yet); 0 when e names a symbol or a
 * second variable. */
static int one_var(const lm_exprs *x, lm_expr e, int32_t *var) {
  const lm_xnode *n = lm_x_node(x, e);
  switch (n->op) {
  case LM_X_CONST: return 1;
  case LM_X_SYM: return 0;
  case LM_X_VAR:
    if (*var >= 0 && *var != (int32_t)n->v) return 0;
    *var = (int32_t)n->v;
    return 1;
  default: return one_var(x, n->a, var) && (!n->b || one_var(x, n->b, var));
  }
}

/* 1 when statement v is a sum of constants and picks of such sums whose tests name one loop
 * variable at most (*var, -1 none); the picks counted in *picks, the statements visited in
 * *nodes (bounded). */
static int index_chain(const lm_kernel *k, const lm_exprs *x, uint32_t v, int32_t *var, int *picks, int *nodes) {
  if (v >= k->nstmts || ++*nodes > INDEX_MAX_NODES) return 0;
  const lm_stmt *s = &k->stmts[v];
  switch (s->op) {
  case LM_S_CONST: return 1;
  case LM_S_INDEX: /* an earlier part of the chain, made an index: counts as its two picks */
    *picks += 2;
    return one_var(x, s->idx, var);
  case LM_S_SELECT:
    ++*picks;
    return (!s->valid || one_var(x, s->valid, var)) && index_chain(k, x, s->a, var, picks, nodes);
  case LM_S_ADD: return index_chain(k, x, s->a, var, picks, nodes) && index_chain(k, x, s->b, var, picks, nodes);
  default: return 0;
  }
}

/* A float value is exact here: a whole number below 2^24, and not -0. */
static double exact_or_nan(double v) { return v == floor(v) && fabs(v) < INDEX_EXACT && !(v == 0 && signbit(v)) ? v : NAN; }

/* The chain's value at the point vars, NAN where it is not exact. */
static double index_value(const lm_kernel *k, const lm_exprs *x, uint32_t v, const int64_t *vars) {
  const lm_stmt *s = &k->stmts[v];
  switch (s->op) {
  case LM_S_CONST: return exact_or_nan(s->f);
  case LM_S_INDEX: return exact_or_nan((double)lm_x_eval(x, s->idx, vars, NULL));
  case LM_S_SELECT: return !s->valid || lm_x_eval(x, s->valid, vars, NULL) ? index_value(k, x, s->a, vars) : 0.0;
  default: return exact_or_nan(index_value(k, x, s->a, vars) + index_value(k, x, s->b, vars));
  }
}

/* Adds e to cand (n of them) unless it is there or cand is full. */
static void add_candidate(lm_expr *cand, int *n, lm_expr e) {
  for (int i = 0; i < *n; i++)
    if (cand[i] == e) return;
  if (e && *n < INDEX_MAX_CANDIDATES) cand[(*n)++] = e;
}

/* The numbers the chain's picks test a digit of: `0 < e / d % 2` or `0 < e % 2` gives e. */
static void digit_candidates(const lm_kernel *k, const lm_exprs *x, uint32_t v, lm_expr *cand, int *n, int depth) {
  const lm_stmt *s = &k->stmts[v];
  if (depth > 64) return;
  if (s->op == LM_S_ADD) {
    digit_candidates(k, x, s->a, cand, n, depth + 1);
    digit_candidates(k, x, s->b, cand, n, depth + 1);
  } else if (s->op == LM_S_SELECT && s->valid) {
    const lm_xnode *lt = lm_x_node(x, s->valid);
    if (lt->op != LM_X_LT || !lm_x_is_const(x, lt->a, 0)) return;
    const lm_xnode *mod = lm_x_node(x, lt->b);
    if (mod->op != LM_X_MOD || !lm_x_is_const(x, mod->b, 2)) return;
    const lm_xnode *div = lm_x_node(x, mod->a);
    add_candidate(cand, n, div->op == LM_X_DIV && lm_x_node(x, div->b)->op == LM_X_CONST ? div->a : mod->a);
  }
}

/* Statement v as LM_S_INDEX when it is such a chain with at least two picks: 1 when it was. */
static int index_stmt(lm_kernel *k, lm_exprs *x, uint32_t v, int64_t *vars) {
  int32_t var = -1;
  int picks = 0, nodes = 0;
  if (k->stmts[v].op != LM_S_ADD || !index_chain(k, x, v, &var, &picks, &nodes) || picks < 2) return 0;
  if (var < 0 || (size_t)var >= k->nloops) return 0;
  const lm_xnode *ext = lm_x_node(x, k->loops[var].extent);
  if (ext->op != LM_X_CONST || ext->v < 2 || ext->v > INDEX_MAX_POINTS) return 0;
  lm_expr cand[INDEX_MAX_CANDIDATES];
  int n = 0;
  digit_candidates(k, x, v, cand, &n, 0);
  vars[var] = 0;
  double f0 = index_value(k, x, v, vars);
  vars[var] = 1;
  double f1 = index_value(k, x, v, vars);
  if (!isnan(f0) && !isnan(f1)) /* the line through the first two points */
    add_candidate(cand, &n,
                  lm_x_simplify(x,
                                lm_x_add(x, lm_x_mul(x, lm_x_var(x, var), lm_x_const(x, (int64_t)(f1 - f0))),
                                         lm_x_const(x, (int64_t)f0)),
                                NULL));
  if (x->failed) return -1;
  unsigned alive = 0; /* the candidates that agree with the chain so far, a bit each */
  for (int c = 0; c < n; c++) {
    int32_t cv = var;
    if (one_var(x, cand[c], &cv)) alive |= 1u << c;
  }
  for (int64_t i = 0; i < ext->v && alive; i++) { /* the chain evaluated once per point */
    vars[var] = i;
    double want = index_value(k, x, v, vars);
    for (int c = 0; c < n; c++)
      if (alive >> c & 1 && (isnan(want) || (double)lm_x_eval(x, cand[c], vars, NULL) != want)) alive &= ~(1u << c);
  }
  vars[var] = 0;
  if (!alive) return 0;
  int c = 0;
  while (!(alive >> c & 1)) c++;
  lm_stmt *s = &k->stmts[v];
  *s = (lm_stmt){.op = LM_S_INDEX, .loop = s->loop, .idx = cand[c]};
  return 1;
}

int lm_lanes_index(lm_kernel *k, lm_exprs *x) {
  int64_t *vars = lm_calloc(k->nloops + 1, sizeof *vars);
  if (!vars) return -1;
  int made = 0;
  for (uint32_t v = 0; v < k->nstmts && made >= 0; v++) {
    int r = index_stmt(k, x, v, vars);
    made = r < 0 ? -1 : made + r;
  }
  lm_free(vars);
  return made < 0 || x->failed ? -1 : made;
}

/* ---- a finite kernel's zeros folded (the cpu; lm_graph_promise_finite) ----------------------
 * Not a rule: x * 0 = 0 and x + 0 = x hold only for finite x with zeros' signs unobserved,
 * which the graph promises and the search's rewrites may not assume. Pads and one-hot masks
 * leave such zeros after the lowering and the splits: a map's columns outside a pad's window
 * compute 0 * x, sum 0 + x, and a lane's running sum adds 0 * (a test) at every column. Here
 * x * 0 is 0, x + 0 is x, two constants combine, a padding of 0 is 0, and a store of what a
 * load just read from the same element of a local array (nothing stored to it between) is
 * dropped, to a fixed point; render.c's liveness drops what nothing uses any more. */
static int is_zero(const lm_kernel *k, uint32_t id) { return k->stmts[id].op == LM_S_CONST && k->stmts[id].f == 0.0f; }

/* s's operands renamed through rep, then s folded when it can be: 1 changed, 0 not. */
static int fold_stmt(lm_kernel *k, lm_exprs *x, uint32_t i, uint32_t *rep) {
  lm_stmt *s = &k->stmts[i];
  int m = lm_sop_operands(s->op), changed = 0;
  if ((m & LM_OPND_A) && s->op != LM_S_ACC_SUM && s->op != LM_S_ACC_MAX && rep[s->a] != s->a)
    s->a = rep[s->a], changed = 1;
  if ((m & LM_OPND_B) && rep[s->b] != s->b) s->b = rep[s->b], changed = 1;
  const lm_stmt *a = &k->stmts[s->a], *b = &k->stmts[s->b];
  int ca = (m & LM_OPND_A) && a->op == LM_S_CONST, cb = (m & LM_OPND_B) && b->op == LM_S_CONST;
  float f = NAN;
  switch (s->op) {
  case LM_S_MUL:
    if (is_zero(k, s->a) || is_zero(k, s->b)) f = 0.0f;
    else if (ca && cb) f = a->f * b->f;
    break;
  case LM_S_ADD:
    if (ca && cb) f = a->f + b->f;
    else if (is_zero(k, s->a) || is_zero(k, s->b)) {
      uint32_t to = is_zero(k, s->a) ? s->b : s->a;
      if (rep[i] == to) return changed;
      rep[i] = to;
      return 1;
    }
    break;
  case LM_S_LT:
    if (ca && cb) f = a->f < b->f ? 1.0f : 0.0f;
    break;
  case LM_S_MAX:
    if (ca && cb) f = fmaxf(a->f, b->f);
    break;
  case LM_S_SELECT:
  case LM_S_LOAD:
    if (s->valid && lm_x_is_const(x, s->valid, 0)) f = 0.0f;
    else if (s->op == LM_S_SELECT && is_zero(k, s->a)) f = 0.0f;
    break;
  default: break;
  }
  if (!isfinite(f)) return changed;
  *s = (lm_stmt){.op = LM_S_CONST, .loop = s->loop, .f = f};
  return 1;
}

/* A store to local array element e of the value a load of e read in the same block, with no
 * loop and no store to that array between them: the array holds that value already. */
static int idle_store(const lm_kernel *k, lm_exprs *x, const lm_block *b, size_t at) {
  const lm_stmt *st = &k->stmts[b->items[at].id], *ld = &k->stmts[st->a];
  if (!st->local || ld->op != LM_S_LOAD || !ld->local || ld->buf != st->buf || ld->idx != st->idx ||
      ld->loop != st->loop || (ld->valid && !lm_x_is_const(x, ld->valid, 1)))
    return 0;
  size_t from = lm_block_find(b, 0, st->a);
  if (from >= at) return 0;
  for (size_t j = from + 1; j < at; j++) {
    const lm_stmt *t = &k->stmts[b->items[j].id];
    if (b->items[j].is_loop || (t->op == LM_S_STORE && t->local && t->buf == st->buf)) return 0;
  }
  return 1;
}

int lm_fold_finite(lm_kernel *k, lm_exprs *x) {
  uint32_t *rep = lm_malloc((k->nstmts + 1) * sizeof *rep);
  if (!rep) return -1;
  int made = 0, changed = 1;
  for (uint32_t i = 0; i < k->nstmts; i++) rep[i] = i;
  while (changed) {
    changed = 0;
    for (uint32_t i = 0; i < k->nstmts; i++) changed |= fold_stmt(k, x, i, rep);
    for (uint32_t i = 0; i < k->nstmts; i++) /* chains of renames end where they cannot go on */
      while (rep[rep[i]] != rep[i]) rep[i] = rep[rep[i]];
    made += changed;
  }
  for (size_t l = 0; l <= k->nloops; l++) {
    const lm_block *b = l < k->nloops ? &k->loops[l].body : &k->root;
    for (size_t i = 0; i < b->n; i++)
      if (!b->items[i].is_loop && k->stmts[b->items[i].id].op == LM_S_STORE && idle_store(k, x, b, i)) {
        lm_stmt *st = &k->stmts[b->items[i].id];
        *st = (lm_stmt){.op = LM_S_CONST, .loop = st->loop};
        made++;
      }
  }
  lm_free(rep);
  return made;
}
