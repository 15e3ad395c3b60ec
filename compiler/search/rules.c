/* compiler/search/rules.c — the rewrite rules over kernel terms (term.h). Each is a pattern (or a
 * custom matcher) with a guard and a computed right side that is unioned with the match. Rules
 * need not make a kernel faster; they open paths that measurement judges. Rules whose right side
 * may round differently are marked LM_RULE_ROUNDING. Soundness rests on two facts: effect loops
 * have independent iterations (so their order, grouping and mapping to threads are free), and
 * a joint or laned reduction is the same value as the plain one (only how it is computed
 * differs). tests/test_egraph.c checks every rule on random kernels against the interpreter. */
#include <math.h>
#include <string.h>

#include "search/term.h"

/* ---------------------------------------------------------------- helpers */

static uint32_t mk(lm_egraph *g, uint16_t op, uint32_t attr, int n, uint32_t a, uint32_t b) {
  lm_enode e = {.op = op, .n = (uint8_t)n, .attr = attr, .c = {a, b, 0}};
  return lm_eg_add(g, &e);
}

static int join(lm_egraph *g, uint32_t root, uint32_t c) {
  if (c == LM_EG_NONE) return 0;
  return lm_eg_union(g, root, c) || 1;
}

static const sk_data *dat(lm_egraph *g, uint32_t c) { return lm_eg_data(g, c); }

static uint32_t f32bits(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

#define V(i) {.op = -1, .var = (i)}
#define OP1(o, c0) {.op = (o), .n = 1, .attr_any = 1, .c = {(c0)}}
#define OP2(o, c0, c1) {.op = (o), .n = 2, .attr_any = 1, .c = {(c0), (c1)}}

static int pieces_share(const lm_sk *s, uint32_t a, uint32_t b);

/* ---------------------------------------------------------------- loops */

static const lm_pat pat_loop[] = {OP1(SK_LOOP, 1), V(0)};
static const lm_pat pat_loop_loop[] = {OP1(SK_LOOP, 1), OP1(SK_LOOP, 2), V(0)};
static const lm_pat pat_loop_seq[] = {OP1(SK_LOOP, 1), OP2(SK_SEQ, 2, 3), V(0), V(1)};

static const sk_loopattr *loop_at(lm_sk *s, lm_egraph *g, const lm_match *m, int pi) {
  return sk_loop_of(s, lm_eg_node(g, m->node[pi])->attr);
}

static int split_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *la = loop_at(s, g, m, 0);
  return la->kind != SK_UNROLL && la->kind < SK_GROUP && sk_piece_depth(s, la->piece) < 2 &&
         sk_piece_const(s, la->piece) >= 4;
}
static int split_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  sk_loopattr la = *loop_at(s, g, m, 0);
  int64_t E = sk_piece_const(s, la.piece);
  int made = 0;
  static const uint32_t fs[] = {2, 4, 8, 16, 32};
  for (size_t i = 0; i < LM_COUNTOF(fs); i++) {
    uint32_t f = fs[i];
    if (E % f || (int64_t)f >= E) continue;
    uint32_t po = sk_piece_new(s, SKP_OUT, la.piece, f), pi = sk_piece_new(s, SKP_IN, la.piece, f);
    if (po == UINT32_MAX || pi == UINT32_MAX) continue;
    uint32_t ai = sk_loopattr_new(s, pi, la.kind), ao = sk_loopattr_new(s, po, la.kind);
    uint32_t inner = mk(g, SK_LOOP, ai, 1, m->var[0], 0);
    made += join(g, m->root, mk(g, SK_LOOP, ao, 1, inner, 0));
  }
  return made;
}

static int swap_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  return loop_at(s, g, m, 0)->piece != loop_at(s, g, m, 1)->piece;
}
static int swap_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  uint32_t a = lm_eg_node(g, m->node[0])->attr, b = lm_eg_node(g, m->node[1])->attr;
  uint32_t inner = mk(g, SK_LOOP, a, 1, m->var[0], 0);
  return join(g, m->root, mk(g, SK_LOOP, b, 1, inner, 0));
}

static int merge_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *a = loop_at(s, g, m, 0), *b = loop_at(s, g, m, 1);
  /* whole variables, or the outer parts of splits (the tiles of a tiled nest) */
  const sk_piece *pa = sk_piece_of(s, a->piece), *pb = sk_piece_of(s, b->piece);
  int ok_a = sk_piece_depth(s, a->piece) == 0 || (pa->type == SKP_OUT && sk_piece_depth(s, a->piece) == 1);
  int ok_b = sk_piece_depth(s, b->piece) == 0 || (pb->type == SKP_OUT && sk_piece_depth(s, b->piece) == 1);
  return a->kind == SK_PAR && b->kind == SK_PAR && ok_a && ok_b && sk_piece_const(s, b->piece) > 1 &&
         !pieces_share(s, a->piece, b->piece);
}
static int merge_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  uint32_t p = sk_piece_new(s, SKP_MERGE, loop_at(s, g, m, 0)->piece, loop_at(s, g, m, 1)->piece);
  if (p == UINT32_MAX) return 0;
  return join(g, m->root, mk(g, SK_LOOP, sk_loopattr_new(s, p, SK_PAR), 1, m->var[0], 0));
}

/* tile: a register tile of fa x fb iterations of two nested loops whose body reduces, the
 * tile's loops innermost: both unrolled (a joint reduction over them then keeps its sums in
 * scalar accumulators: the register-blocked matmul micro-kernel), or the rows unrolled and the
 * columns a loop (the sums in a local array, which the C compiler keeps in vector registers).
 * Tiles of two parallel loops also come merged into one loop, and as panels: the column tiles
 * parallel, the row tiles in order inside (what packing a panel of B needs: pack.c). */
static int tile_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *a = loop_at(s, g, m, 0), *b = loop_at(s, g, m, 1);
  int64_t Ea = sk_piece_const(s, a->piece); /* -1: symbolic (a batch); its tiles are ragged */
  return a->kind < SK_UNROLL && b->kind < SK_UNROLL && sk_piece_depth(s, a->piece) == 0 &&
         sk_piece_depth(s, b->piece) == 0 && dat(g, m->var[0])->has_red && (Ea >= 4 || Ea < 0) &&
         sk_piece_const(s, b->piece) >= 16;
}
static int tile_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  sk_loopattr a = *loop_at(s, g, m, 0), b = *loop_at(s, g, m, 1);
  int64_t Ea = sk_piece_const(s, a.piece), Eb = sk_piece_const(s, b.piece);
  /* 6x16: twelve accumulators, enough FMAs in flight to fill both pipes (4x16 has eight); its
   * rows may be ragged (256 = 42 * 6 + 4): the last tile reads the last row again and stores
   * only the rows that exist (emit.c); rows of a symbolic extent (a batch) are always taken as
   * ragged, in tiles of 6 or 4 */
  static const uint32_t tiles[][2] = {{6, 16}, {4, 16}, {4, 8}, {2, 16}, {8, 8}, {2, 32}};
  int made = 0;
  for (size_t t = 0; t < LM_COUNTOF(tiles); t++) {
    uint32_t fa = tiles[t][0], fb = tiles[t][1];
    if (Ea < 0 ? fa != 6 && fa != 4 : (Ea % fa && fa != 6) || Ea <= fa) continue;
    if (Eb % fb || Eb <= fb) continue;
    uint32_t ao = sk_piece_new(s, SKP_OUT, a.piece, fa), ai = sk_piece_new(s, SKP_IN, a.piece, fa);
    uint32_t bo = sk_piece_new(s, SKP_OUT, b.piece, fb), bi = sk_piece_new(s, SKP_IN, b.piece, fb);
    if (ao == UINT32_MAX || ai == UINT32_MAX || bo == UINT32_MAX || bi == UINT32_MAX) continue;
    for (int arr = 0; arr < 2; arr++) {
      uint32_t l4 = mk(g, SK_LOOP, sk_loopattr_new(s, bi, arr ? SK_SER : SK_UNROLL), 1, m->var[0], 0);
      uint32_t l3 = mk(g, SK_LOOP, sk_loopattr_new(s, ai, SK_UNROLL), 1, l4, 0);
      uint32_t l2 = mk(g, SK_LOOP, sk_loopattr_new(s, bo, b.kind), 1, l3, 0);
      made += join(g, m->root, mk(g, SK_LOOP, sk_loopattr_new(s, ao, a.kind), 1, l2, 0));
      if (a.kind == SK_PAR && b.kind == SK_PAR) { /* the tiles as one loop: more of them for the threads */
        uint32_t mo = sk_piece_new(s, SKP_MERGE, ao, bo);
        if (mo != UINT32_MAX) made += join(g, m->root, mk(g, SK_LOOP, sk_loopattr_new(s, mo, SK_PAR), 1, l3, 0));
      }
      if (arr && a.kind == SK_PAR && b.kind == SK_PAR) { /* a panel of columns per thread, its rows in order */
        uint32_t r2 = mk(g, SK_LOOP, sk_loopattr_new(s, ao, SK_SER), 1, l3, 0);
        made += join(g, m->root, mk(g, SK_LOOP, sk_loopattr_new(s, bo, SK_PAR), 1, r2, 0));
      }
    }
  }
  return made;
}

static int fission_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  uint32_t a = lm_eg_node(g, m->node[0])->attr;
  uint32_t l0 = mk(g, SK_LOOP, a, 1, m->var[0], 0), l1 = mk(g, SK_LOOP, a, 1, m->var[1], 0);
  return join(g, m->root, mk(g, SK_SEQ, 0, 2, l0, l1));
}

static int map_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  uint32_t k = loop_at(ctx, g, m, 0)->kind;
  return k != SK_UNROLL && k < SK_GROUP;
}
static int unroll_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *a = loop_at(s, g, m, 0);
  int64_t e = sk_piece_const(s, a->piece);
  return a->kind != SK_UNROLL && a->kind < SK_GROUP && e >= 2 && e <= 16;
}
static int rekind(lm_sk *s, lm_egraph *g, const lm_match *m, uint32_t kind) {
  const sk_loopattr *a = loop_at(s, g, m, 0);
  return join(g, m->root, mk(g, SK_LOOP, sk_loopattr_new(s, a->piece, kind), 1, m->var[0], 0));
}
/* map: a loop's iterations to threads (the parallel domain) or to one thread in order */
static int map_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  return rekind(ctx, g, m, loop_at(ctx, g, m, 0)->kind == SK_PAR ? SK_SER : SK_PAR);
}
static int unroll_apply(void *ctx, lm_egraph *g, const lm_match *m) { return rekind(ctx, g, m, SK_UNROLL); }

/* group (GPU dialects): a parallel loop of 32..256 iterations (a multiple of 32) as the threads of
 * a work-group, the loops around it the grid. With split and merge this chooses the block shape
 * (a row of a matrix per block, 16x16 tiles of it, ...); emission refuses it unless it ends up
 * the innermost loop of the parallel domain, below at least one other. */
static int group_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *a = loop_at(s, g, m, 0);
  int64_t e = sk_piece_const(s, a->piece);
  return a->kind == SK_PAR && e >= 32 && e <= 256 && e % 32 == 0;
}
static int group_apply(void *ctx, lm_egraph *g, const lm_match *m) { return rekind(ctx, g, m, SK_GROUP); }

/* stage (GPU dialects): a work-group's loop whose threads all read some read-only elements alike
 * loads those into shared memory together first (emission finds them: see SK_GROUP_STAGED). */
static int stage_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  return loop_at(s, g, m, 0)->kind == SK_GROUP && dat(g, m->var[0])->has_red;
}
static int stage_apply(void *ctx, lm_egraph *g, const lm_match *m) { return rekind(ctx, g, m, SK_GROUP_STAGED); }

/* ---------------------------------------------------------------- loop fusion */

static int disjoint(const uint64_t *a, const uint64_t *b) {
  for (int i = 0; i < 4; i++)
    if (a[i] & b[i]) return 0;
  return 1;
}

/* Two effects that may run interleaved: neither writes what the other reads or writes. */
static int independent(lm_egraph *g, uint32_t x, uint32_t y) {
  const sk_data *a = dat(g, x), *b = dat(g, y);
  return disjoint(a->wr, b->rd) && disjoint(a->wr, b->wr) && disjoint(b->wr, a->rd);
}

static int piece_has_var(const lm_sk *s, uint32_t p, uint32_t v) {
  const sk_piece *q = sk_piece_of(s, p);
  switch (q->type) {
  case SKP_ORIG: return q->a == v;
  case SKP_OUT:
  case SKP_IN: return piece_has_var(s, q->a, v);
  default: return piece_has_var(s, q->a, v) || piece_has_var(s, q->b, v);
  }
}

/* Do two pieces bind a common variable? (Exact, also past 64 variables.) */
static int pieces_share(const lm_sk *s, uint32_t a, uint32_t b) {
  const sk_piece *q = sk_piece_of(s, a);
  switch (q->type) {
  case SKP_ORIG: return piece_has_var(s, b, q->a);
  case SKP_OUT:
  case SKP_IN: return pieces_share(s, q->a, b);
  default: return pieces_share(s, q->a, b) || pieces_share(s, q->b, b);
  }
}

/* The piece a fused loop iterates: a itself, or a and b together. UINT32_MAX when not fusible. */
static uint32_t fused_piece(lm_sk *s, uint32_t a, uint32_t b) {
  if (a == b) return a;
  const sk_piece *pa = sk_piece_of(s, a), *pb = sk_piece_of(s, b);
  if (pa->extent != pb->extent && !lm_x_prove_eq(s->x, pa->extent, pb->extent)) return UINT32_MAX;
  if (pieces_share(s, a, b)) return UINT32_MAX;
  return sk_piece_new(s, SKP_GROUP, a, b);
}

typedef struct fsearch {
  lm_sk *s;
  lm_match_fn fn;
  void *fnctx;
  int plan; /* kernel fusion */
} fsearch;

/* SEQ(LOOP a x, LOOP b y) and SEQ(LOOP a x, SEQ(LOOP b y, r)) */
static void fusion_search(void *ctx, lm_egraph *g, lm_match_fn fn, void *fnctx) {
  lm_sk *s = ctx;
  for (size_t c = 0; c < g->nclasses; c++) {
    if (g->uf[c] != c) continue;
    const lm_eg_vec *cv = &g->cnodes[c];
    for (uint32_t i = 0; i < cv->n; i++) {
      const lm_enode *seq = lm_eg_node(g, cv->v[i]);
      if (seq->op != SK_SEQ) continue;
      const lm_eg_vec *xv = &g->cnodes[lm_eg_find(g, seq->c[0])];
      for (uint32_t a = 0; a < xv->n; a++) {
        const lm_enode *la = lm_eg_node(g, xv->v[a]);
        if (la->op != SK_LOOP) continue;
        const lm_eg_vec *yv = &g->cnodes[lm_eg_find(g, seq->c[1])];
        for (uint32_t b = 0; b < yv->n; b++) {
          const lm_enode *yn = lm_eg_node(g, yv->v[b]);
          uint32_t lb_id = yv->v[b], rest = LM_EG_NONE;
          if (yn->op == SK_SEQ) {
            const lm_eg_vec *zv = &g->cnodes[lm_eg_find(g, yn->c[0])];
            for (uint32_t z = 0; z < zv->n; z++) {
              const lm_enode *lb = lm_eg_node(g, zv->v[z]);
              if (lb->op != SK_LOOP) continue;
              lm_match m;
              memset(&m, 0, sizeof m);
              m.root = (uint32_t)c;
              m.node[0] = cv->v[i];
              m.node[1] = xv->v[a];
              m.node[2] = zv->v[z];
              m.var[0] = la->c[0];
              m.var[1] = lb->c[0];
              m.var[2] = yn->c[1];
              if (!fn(fnctx, &m)) return;
            }
            continue;
          }
          if (yn->op != SK_LOOP) continue;
          lm_match m;
          memset(&m, 0, sizeof m);
          m.root = (uint32_t)c;
          m.node[0] = cv->v[i];
          m.node[1] = xv->v[a];
          m.node[2] = lb_id;
          m.var[0] = la->c[0];
          m.var[1] = yn->c[0];
          m.var[2] = rest;
          if (!fn(fnctx, &m)) return;
        }
      }
    }
  }
  (void)s;
}

static int fusion_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *a = loop_at(s, g, m, 1), *b = loop_at(s, g, m, 2);
  if (a->kind != b->kind || a->kind == SK_UNROLL) return 0;
  if (!independent(g, m->var[0], m->var[1])) return 0;
  return fused_piece(s, a->piece, b->piece) != UINT32_MAX;
}
static int fusion_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_loopattr *a = loop_at(s, g, m, 1), *b = loop_at(s, g, m, 2);
  uint32_t kind = a->kind, p = fused_piece(s, a->piece, b->piece);
  if (p == UINT32_MAX) return 0;
  uint32_t body = mk(g, SK_SEQ, 0, 2, m->var[0], m->var[1]);
  uint32_t loop = mk(g, SK_LOOP, sk_loopattr_new(s, p, kind), 1, body, 0);
  if (m->var[2] != LM_EG_NONE) loop = mk(g, SK_SEQ, 0, 2, loop, m->var[2]);
  return join(g, m->root, loop);
}

/* SEQ(KERNEL k1 x, SEQ(KERNEL k2 y, r)) -> SEQ(KERNEL k1 SEQ(x, y), r) when x and y are elementwise
 * loops the fusion rule can then merge (a fused kernel whose loops stay apart would run on one
 * thread): the optimiser's updates, one kernel per assigned value, become one launch. */
static void kfuse_search(void *ctx, lm_egraph *g, lm_match_fn fn, void *fnctx) {
  (void)ctx;
  for (size_t c = 0; c < g->nclasses; c++) {
    if (g->uf[c] != c) continue;
    const lm_eg_vec *cv = &g->cnodes[c];
    for (uint32_t i = 0; i < cv->n; i++) {
      const lm_enode *seq = lm_eg_node(g, cv->v[i]);
      if (seq->op != SK_SEQ) continue;
      const lm_eg_vec *kv = &g->cnodes[lm_eg_find(g, seq->c[0])];
      const lm_eg_vec *sv = &g->cnodes[lm_eg_find(g, seq->c[1])];
      for (uint32_t a = 0; a < kv->n; a++) {
        const lm_enode *k1 = lm_eg_node(g, kv->v[a]);
        if (k1->op != SK_KERNEL) continue;
        for (uint32_t b = 0; b < sv->n; b++) {
          const lm_enode *s2 = lm_eg_node(g, sv->v[b]);
          if (s2->op != SK_SEQ) continue;
          const lm_eg_vec *k2v = &g->cnodes[lm_eg_find(g, s2->c[0])];
          for (uint32_t d = 0; d < k2v->n; d++) {
            const lm_enode *k2 = lm_eg_node(g, k2v->v[d]);
            if (k2->op != SK_KERNEL) continue;
            lm_match m;
            memset(&m, 0, sizeof m);
            m.root = (uint32_t)c;
            m.node[0] = kv->v[a];
            m.node[1] = k2v->v[d];
            m.var[0] = k1->c[0];
            m.var[1] = k2->c[0];
            m.var[2] = s2->c[1];
            if (!fn(fnctx, &m)) return;
          }
        }
      }
    }
  }
}

static int kfuse_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  /* elementwise kernels only: a reduction kernel keeps its own schedule (interchange, tiles) */
  if (dat(g, m->var[0])->has_red || dat(g, m->var[1])->has_red) return 0;
  if (!independent(g, m->var[0], m->var[1])) return 0;
  const lm_eg_vec *xv = &g->cnodes[lm_eg_find(g, m->var[0])], *yv = &g->cnodes[lm_eg_find(g, m->var[1])];
  for (uint32_t a = 0; a < xv->n; a++) {
    const lm_enode *la = lm_eg_node(g, xv->v[a]);
    if (la->op != SK_LOOP) continue;
    for (uint32_t b = 0; b < yv->n; b++) {
      const lm_enode *lb = lm_eg_node(g, yv->v[b]);
      if (lb->op != SK_LOOP) continue;
      const sk_loopattr *pa = sk_loop_of(s, la->attr), *pb = sk_loop_of(s, lb->attr);
      if (pa->kind == pb->kind && fused_piece(s, pa->piece, pb->piece) != UINT32_MAX) return 1;
    }
  }
  return 0;
}
static int kfuse_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  uint32_t k1 = lm_eg_node(g, m->node[0])->attr;
  uint32_t body = mk(g, SK_SEQ, 0, 2, m->var[0], m->var[1]);
  uint32_t kern = mk(g, SK_KERNEL, k1, 1, body, 0);
  return join(g, m->root, mk(g, SK_SEQ, 0, 2, kern, m->var[2]));
}

static const lm_pat pat_ksplit[] = {OP2(SK_SEQ, 1, 4), OP1(SK_KERNEL, 2), OP2(SK_SEQ, 3, 5), V(0), V(2), V(1)};
static int ksplit_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  uint32_t k = lm_eg_node(g, m->node[1])->attr;
  uint32_t k2 = mk(g, SK_KERNEL, k, 1, m->var[1], 0);
  uint32_t tail = mk(g, SK_SEQ, 0, 2, k2, m->var[2]);
  uint32_t k1 = mk(g, SK_KERNEL, k, 1, m->var[0], 0);
  return join(g, m->root, mk(g, SK_SEQ, 0, 2, k1, tail));
}

/* ---------------------------------------------------------------- reductions */

static const lm_pat pat_red[] = {OP1(SK_RED, 1), V(0)};

static const sk_redattr *red_at(lm_sk *s, lm_egraph *g, const lm_match *m) {
  return sk_red_of(s, lm_eg_node(g, m->node[0])->attr);
}

/* red-joint: a sum computed for every iteration of an enclosing loop over piece P at once,
 * reduction loop outside (matmul's i-k-j order), optionally over P and the loop Q inside it. */
typedef struct jctx {
  lm_sk *s;
  lm_egraph *g;
  lm_match_fn fn;
  void *fnctx;
  uint32_t P, Q;
  uint32_t seen[64];
  int nseen;
  int stop;
} jctx;

static void joint_values(jctx *j, uint32_t cls, int depth) {
  lm_egraph *g = j->g;
  cls = lm_eg_find(g, cls);
  if (j->stop || depth > 6 || !dat(g, cls)->has_red) return;
  for (int i = 0; i < j->nseen; i++)
    if (j->seen[i] == cls) return;
  if (j->nseen < (int)LM_COUNTOF(j->seen)) j->seen[j->nseen++] = cls;
  const lm_eg_vec *v = &g->cnodes[cls];
  for (uint32_t i = 0; i < v->n && !j->stop; i++) {
    const lm_enode *n = lm_eg_node(g, v->v[i]);
    if (n->op == SK_RED) {
      const sk_redattr *r = sk_red_of(j->s, n->attr);
      if (r->op != SK_RED_SUM || r->nj || r->lanes != 1) continue;
      uint64_t bv = dat(g, n->c[0])->vars;
      if (!(bv & sk_piece_vars(j->s, j->P))) continue;
      lm_match m;
      memset(&m, 0, sizeof m);
      m.root = cls;
      m.node[0] = v->v[i];
      m.var[0] = n->c[0];
      m.var[1] = j->P;
      m.var[2] = (j->Q != LM_EG_NONE && (bv & sk_piece_vars(j->s, j->Q))) ? j->Q : LM_EG_NONE;
      if (!j->fn(j->fnctx, &m)) j->stop = 1;
      continue; /* not into the reduction's body */
    }
    for (int c = 0; c < n->n; c++) joint_values(j, n->c[c], depth + 1);
  }
}

static void joint_stores(jctx *j, uint32_t cls) {
  lm_egraph *g = j->g;
  const lm_eg_vec *v = &g->cnodes[lm_eg_find(g, cls)];
  for (uint32_t i = 0; i < v->n && !j->stop; i++) {
    const lm_enode *n = lm_eg_node(g, v->v[i]);
    if (n->op == SK_STORE) joint_values(j, n->c[0], 0);
  }
}

static void joint_search(void *ctx, lm_egraph *g, lm_match_fn fn, void *fnctx) {
  lm_sk *s = ctx;
  jctx j = {.s = s, .g = g, .fn = fn, .fnctx = fnctx};
  for (size_t c = 0; c < g->nclasses && !j.stop; c++) {
    if (g->uf[c] != c) continue;
    const lm_eg_vec *cv = &g->cnodes[c];
    for (uint32_t i = 0; i < cv->n && !j.stop; i++) {
      const lm_enode *l = lm_eg_node(g, cv->v[i]);
      if (l->op != SK_LOOP || !dat(g, l->c[0])->has_red) continue;
      j.P = sk_loop_of(s, l->attr)->piece;
      j.Q = LM_EG_NONE;
      j.nseen = 0;
      joint_stores(&j, l->c[0]);
      const lm_eg_vec *bv = &g->cnodes[lm_eg_find(g, l->c[0])];
      for (uint32_t b = 0; b < bv->n && !j.stop; b++) {
        const lm_enode *l2 = lm_eg_node(g, bv->v[b]);
        if (l2->op != SK_LOOP) continue;
        j.Q = sk_loop_of(s, l2->attr)->piece;
        j.nseen = 0;
        joint_stores(&j, l2->c[0]);
      }
    }
  }
}

static int joint_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  sk_redattr r = *red_at(s, g, m);
  int made = 0;
  r.nj = 1;
  r.joint[0] = m->var[1];
  r.swap = 0;
  made += join(g, m->root, mk(g, SK_RED, sk_red_new(s, &r), 1, m->var[0], 0));
  if (m->var[2] != LM_EG_NONE && m->var[2] != m->var[1]) {
    r.nj = 2;
    r.joint[1] = m->var[2];
    for (uint32_t sw = 0; sw < 2; sw++) {
      r.swap = sw;
      made += join(g, m->root, mk(g, SK_RED, sk_red_new(s, &r), 1, m->var[0], 0));
    }
  }
  return made;
}

static int64_t var_const(lm_sk *s, uint32_t v) {
  const lm_xnode *n = lm_x_node(s->x, s->var_ext[v]);
  return n->op == LM_X_CONST ? n->v : -1;
}

static int lanes_guard(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  const sk_redattr *r = red_at(s, g, m);
  int64_t K = var_const(s, r->var); /* -1: symbolic (a batch); its last K % f terms follow the groups */
  return r->op == SK_RED_SUM && r->lanes == 1 && !r->nj && (K >= 8 || K < 0);
}
static int lanes_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  sk_redattr r = *red_at(s, g, m);
  int64_t K = var_const(s, r.var);
  int made = 0;
  static const uint32_t fs[] = {4, 8, 16};
  for (size_t i = 0; i < LM_COUNTOF(fs); i++) {
    if (K >= 0 && (K % fs[i] || K < 2 * (int64_t)fs[i])) continue;
    r.lanes = fs[i];
    made += join(g, m->root, mk(g, SK_RED, sk_red_new(s, &r), 1, m->var[0], 0));
  }
  return made;
}

static int bcast_guard(lm_sk *s, lm_egraph *g, const lm_match *m, uint32_t op) {
  const sk_redattr *r = red_at(s, g, m);
  return !s->wide && r->op == op && var_const(s, r->var) >= 1 && !(dat(g, m->var[0])->vars & (1ull << (r->var & 63)));
}
static int bsum_guard(void *ctx, lm_egraph *g, const lm_match *m) { return bcast_guard(ctx, g, m, SK_RED_SUM); }
static int bmax_guard(void *ctx, lm_egraph *g, const lm_match *m) { return bcast_guard(ctx, g, m, SK_RED_MAX); }
static int bsum_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  lm_sk *s = ctx;
  float k = (float)var_const(s, red_at(s, g, m)->var);
  return join(g, m->root, mk(g, SK_MUL, 0, 2, m->var[0], mk(g, SK_CONST, f32bits(k), 0, 0, 0)));
}
static int bmax_apply(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return join(g, m->root, m->var[0]);
}

/* ---------------------------------------------------------------- algebra */

static const lm_pat pat_add[] = {OP2(SK_ADD, 1, 2), V(0), V(1)};
static const lm_pat pat_mul[] = {OP2(SK_MUL, 1, 2), V(0), V(1)};
static int add_comm(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return join(g, m->root, mk(g, SK_ADD, 0, 2, m->var[1], m->var[0]));
}
static int mul_comm(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return join(g, m->root, mk(g, SK_MUL, 0, 2, m->var[1], m->var[0]));
}

static const lm_pat pat_add_assoc[] = {OP2(SK_ADD, 1, 4), OP2(SK_ADD, 2, 3), V(0), V(1), V(2)};
static const lm_pat pat_mul_assoc[] = {OP2(SK_MUL, 1, 4), OP2(SK_MUL, 2, 3), V(0), V(1), V(2)};
static int assoc(lm_egraph *g, const lm_match *m, uint16_t op) {
  uint32_t bc = mk(g, op, 0, 2, m->var[1], m->var[2]);
  return join(g, m->root, mk(g, op, 0, 2, m->var[0], bc));
}
static int add_assoc(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return assoc(g, m, SK_ADD);
}
static int mul_assoc(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return assoc(g, m, SK_MUL);
}

static const lm_pat pat_log2_exp2[] = {OP1(SK_LOG2, 1), OP1(SK_EXP2, 2), V(0)};
static const lm_pat pat_recip_recip[] = {OP1(SK_RECIP, 1), OP1(SK_RECIP, 2), V(0)};
static int to_var0(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return join(g, m->root, m->var[0]);
}

static const lm_pat pat_exp2_mul[] = {OP2(SK_MUL, 1, 2), OP1(SK_EXP2, 3), OP1(SK_EXP2, 4), V(0), V(1)};
static int exp2_mul(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  return join(g, m->root, mk(g, SK_EXP2, 0, 1, mk(g, SK_ADD, 0, 2, m->var[0], m->var[1]), 0));
}

static const lm_pat pat_recip_mul[] = {OP1(SK_RECIP, 1), OP2(SK_MUL, 2, 3), V(0), V(1)};
static int recip_mul(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  uint32_t a = mk(g, SK_RECIP, 0, 1, m->var[0], 0), b = mk(g, SK_RECIP, 0, 1, m->var[1], 0);
  return join(g, m->root, mk(g, SK_MUL, 0, 2, a, b));
}

static const lm_pat pat_mul_one[] = {OP2(SK_MUL, 1, 2), V(0), {.op = SK_CONST, .attr = 0x3f800000u}};
static const lm_pat pat_add_zero[] = {OP2(SK_ADD, 1, 2), V(0), {.op = SK_CONST, .attr = 0}};

static const lm_pat pat_factor[] = {OP2(SK_ADD, 1, 2), OP2(SK_MUL, 3, 5), OP2(SK_MUL, 4, 5), V(0), V(1), V(2)};
static int factor(void *ctx, lm_egraph *g, const lm_match *m) {
  (void)ctx;
  uint32_t s = mk(g, SK_ADD, 0, 2, m->var[0], m->var[1]);
  return join(g, m->root, mk(g, SK_MUL, 0, 2, s, m->var[2]));
}

/* ---------------------------------------------------------------- the table */

#define PAT(p) (p), (int)LM_COUNTOF(p)
enum { STAGE_K = 1, STAGE_P = 2 };

static const lm_rule rules[] = {
    {"split", LM_RULE_EXPLOSIVE, PAT(pat_loop), split_guard, split_apply, NULL},
    {"swap", LM_RULE_EXPLOSIVE, PAT(pat_loop_loop), swap_guard, swap_apply, NULL},
    {"merge", 0, PAT(pat_loop_loop), merge_guard, merge_apply, NULL},
    {"fission", 0, PAT(pat_loop_seq), NULL, fission_apply, NULL},
    {"fusion", 0, NULL, 0, fusion_guard, fusion_apply, fusion_search},
    {"map", 0, PAT(pat_loop), map_guard, map_apply, NULL},
    {"unroll", 0, PAT(pat_loop), unroll_guard, unroll_apply, NULL},
    {"tile", 0, PAT(pat_loop_loop), tile_guard, tile_apply, NULL},
    {"red-joint", 0, NULL, 0, NULL, joint_apply, joint_search},
    {"red-lanes", LM_RULE_ROUNDING, PAT(pat_red), lanes_guard, lanes_apply, NULL},
    {"red-bcast-sum", LM_RULE_ROUNDING, PAT(pat_red), bsum_guard, bsum_apply, NULL},
    {"red-bcast-max", 0, PAT(pat_red), bmax_guard, bmax_apply, NULL},
    {"add-comm", LM_RULE_EXPLOSIVE, PAT(pat_add), NULL, add_comm, NULL},
    {"mul-comm", LM_RULE_EXPLOSIVE, PAT(pat_mul), NULL, mul_comm, NULL},
    {"add-assoc", LM_RULE_ROUNDING | LM_RULE_EXPLOSIVE, PAT(pat_add_assoc), NULL, add_assoc, NULL},
    {"mul-assoc", LM_RULE_ROUNDING | LM_RULE_EXPLOSIVE, PAT(pat_mul_assoc), NULL, mul_assoc, NULL},
    {"log2-exp2", LM_RULE_ROUNDING, PAT(pat_log2_exp2), NULL, to_var0, NULL},
    {"exp2-mul", LM_RULE_ROUNDING, PAT(pat_exp2_mul), NULL, exp2_mul, NULL},
    {"recip-recip", LM_RULE_ROUNDING, PAT(pat_recip_recip), NULL, to_var0, NULL},
    {"recip-mul", LM_RULE_ROUNDING, PAT(pat_recip_mul), NULL, recip_mul, NULL},
    {"mul-one", 0, PAT(pat_mul_one), NULL, to_var0, NULL},
    {"add-zero", 0, PAT(pat_add_zero), NULL, to_var0, NULL},
    {"factor", LM_RULE_ROUNDING, PAT(pat_factor), NULL, factor, NULL},
    {"group", LM_RULE_GPU, PAT(pat_loop), group_guard, group_apply, NULL},
    {"stage", LM_RULE_GPU, PAT(pat_loop), stage_guard, stage_apply, NULL},
    {"kernel-fuse", 0, NULL, 0, kfuse_guard, kfuse_apply, kfuse_search},
    {"kernel-split", 0, PAT(pat_ksplit), NULL, ksplit_apply, NULL},
};

static const uint8_t stage_of[LM_COUNTOF(rules)] = {
    STAGE_K, STAGE_K, STAGE_K, STAGE_K, STAGE_K | STAGE_P, STAGE_K, STAGE_K, STAGE_K, STAGE_K,
    STAGE_K, STAGE_K, STAGE_K, STAGE_K, STAGE_K,           STAGE_K, STAGE_K, STAGE_K, STAGE_K,
    STAGE_K, STAGE_K, STAGE_K, STAGE_K, STAGE_K,           STAGE_K, STAGE_K, STAGE_P, STAGE_P,
};

const lm_rule *sk_rules(int *count) {
  *count = (int)LM_COUNTOF(rules);
  return rules;
}

int sk_rule_stage_ok(const lm_sk *s, int rule) {
  if (rule < 0 || rule >= (int)LM_COUNTOF(rules)) return 0;
  if (!s->rounding && (rules[rule].flags & LM_RULE_ROUNDING)) return 0;
  if (!s->gpu && (rules[rule].flags & LM_RULE_GPU)) return 0;
  return (stage_of[rule] & (s->stage == SK_STAGE_PLAN ? STAGE_P : STAGE_K)) != 0;
}
