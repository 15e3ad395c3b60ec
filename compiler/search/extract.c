/* compiler/search/extract.c — choosing terms out of the e-graph: the greedy choice by a static
 * cost (work of a loop nest, bytes loaded, launches), random genomes (one node per class, picked
 * in context: a joint reduction only under loops over its pieces; cycles repaired with the
 * greedy choice), exhaustive enumeration when the space is small, and the genetic search's
 * operators on genomes: mutation (a few classes drawn again) and crossover (per class, the
 * choice of one of two parents). The result is a term DAG (term.h), hash-consed so equal
 * subterms are shared. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "search/search-impl.h"

uint64_t sk_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uni(uint64_t *st) { return (double)(sk_rand(st) >> 11) * 0x1.0p-53; }

/* ---------------------------------------------------------------- greedy costs */

static double ext_of(lm_sk *s, lm_expr e) {
  const lm_xnode *n = lm_x_node(s->x, e);
  return n->op == LM_X_CONST ? (double)(n->v > 0 ? n->v : 1) : 64.0;
}

static double node_cost(lm_sk *s, const lm_enode *n, const double *cc) {
  double c = 0;
  switch (n->op) {
  case SK_NOP: return 1;
  case SK_SEQ: return 1 + cc[0] + cc[1];
  case SK_KERNEL: return 1000 + cc[0];
  case SK_STORE: return 4 + cc[0];
  case SK_LOOP: {
    const sk_loopattr *la = sk_loop_of(s, n->attr);
    c = 1 + ext_of(s, sk_piece_of(s, la->piece)->extent) * (1 + cc[0]);
    return c + (la->kind == SK_PAR ? 0 : 1);
  }
  case SK_CONST: return 1;
  case SK_LOAD: return 4;
  case SK_RAND: return 20;
  case SK_SELECT: return 1 + cc[0];
  case SK_LOG2:
  case SK_EXP2:
  case SK_SIN:
  case SK_SQRT: return 8 + cc[0];
  case SK_RECIP: return 4 + cc[0];
  case SK_RED: {
    const sk_redattr *r = sk_red_of(s, n->attr);
    return 2 + (r->lanes > 1 || r->nj ? 1 : 0) + ext_of(s, s->var_ext[r->var]) * cc[0];
  }
  default: return 1 + cc[0] + (n->n > 1 ? cc[1] : 0);
  }
}

void sk_greedy(lm_sk *s, double *cost, uint32_t *best) {
  lm_egraph *g = s->eg;
  for (size_t c = 0; c < g->nclasses; c++) cost[c] = INFINITY, best[c] = LM_EG_NONE;
  for (int changed = 1, round = 0; changed && round < 1000; round++) {
    changed = 0;
    for (size_t c = 0; c < g->nclasses; c++) {
      if (g->uf[c] != c) continue;
      const lm_eg_vec *v = &g->cnodes[c];
      for (uint32_t i = 0; i < v->n; i++) {
        const lm_enode *n = lm_eg_node(g, v->v[i]);
        double cc[LM_EG_MAXC] = {0};
        int ok = 1;
        for (int k = 0; k < n->n && ok; k++) ok = isfinite(cc[k] = cost[lm_eg_find(g, n->c[k])]);
        if (!ok) continue;
        double x = node_cost(s, n, cc);
        if (x < cost[c]) {
          changed = 1;
          cost[c] = x;
          best[c] = v->v[i];
        }
      }
    }
  }
}

/* ---------------------------------------------------------------- building terms */

typedef struct tb {
  lm_sk *s;
  lm_egraph *g;
  const uint32_t *best;
  const uint32_t *force;  /* per class: node to take (exhaustive / genome), LM_EG_NONE: choose */
  const uint32_t *alt;    /* strict: per class, the node to take when force[] does not fit (crossover) */
  const uint32_t *avoid;  /* per class: a node a random draw must not take (mutation), may be NULL */
  int strict;             /* force[] and alt[] only where the node fits its context */
  uint32_t *genome;       /* per class: node taken (out) */
  uint64_t *rng;          /* NULL: greedy */
  double keep;            /* probability of taking force[] when rng is set (mutation) */
  double greedy_p;        /* probability of the greedy node for plain value classes */
  int prefer_kind;        /* >= 0: loops of this kind are taken where a class offers one (80%) */
  sk_term *t;
  uint8_t *on_stack;
  uint32_t ctx[24];       /* pieces of the enclosing loops */
  int nctx;
  /* memo: (class, context hash) -> term node */
  struct memo_kv {
    uint64_t key;
    uint32_t val;
  } *memo;
  size_t mcap, mn;
  /* term hashcons */
  uint32_t *th;
  size_t thcap;
  int bad;
} tb;

enum { CYCLE = UINT32_MAX - 1 };

static uint64_t ctx_hash(const tb *b) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < b->nctx; i++) h = (h ^ b->ctx[i]) * 1099511628211ull;
  return h;
}

static uint64_t nhash(const lm_enode *n) {
  return lm_hash_bytes(n, sizeof *n, 77);
}

static uint32_t term_add(tb *b, const lm_enode *n, uint32_t src) {
  lm_enode k;
  memset(&k, 0, sizeof k); /* padding too: nodes are hashed and compared as bytes */
  k.op = n->op;
  k.n = n->n;
  k.attr = n->attr;
  for (int i = 0; i < k.n; i++) k.c[i] = n->c[i];
  if ((b->t->count + 1) * 2 > b->thcap) {
    size_t nc = b->thcap ? b->thcap * 2 : 256;
    uint32_t *h = lm_calloc(nc, sizeof *h);
    if (!h) return b->bad = 1, UINT32_MAX;
    for (size_t i = 0; i < b->t->count; i++) {
      size_t j = (size_t)nhash(&b->t->n[i]) & (nc - 1);
      while (h[j]) j = (j + 1) & (nc - 1);
      h[j] = (uint32_t)i + 1;
    }
    lm_free(b->th);
    b->th = h;
    b->thcap = nc;
  }
  size_t j = (size_t)nhash(&k) & (b->thcap - 1);
  while (b->th[j]) {
    if (!memcmp(&b->t->n[b->th[j] - 1], &k, sizeof k)) return b->th[j] - 1;
    j = (j + 1) & (b->thcap - 1);
  }
  uint32_t id = sk_term_push(b->t, &k, src);
  if (id == UINT32_MAX) return b->bad = 1, UINT32_MAX;
  b->th[j] = id + 1;
  return id;
}

static int in_ctx(const tb *b, uint32_t p, int *at) {
  for (int i = 0; i < b->nctx; i++)
    if (b->ctx[i] == p) return *at = i, 1;
  return 0;
}

/* Can node n be taken here? (Joint reductions need loops over their pieces around them.) */
static int fits(const tb *b, const lm_enode *n) {
  if (n->op != SK_RED) return 1;
  const sk_redattr *r = sk_red_of(b->s, n->attr);
  if (!r->nj) return 1;
  int a, c;
  if (!in_ctx(b, r->joint[0], &a)) return 0;
  if (r->nj == 2 && (!in_ctx(b, r->joint[1], &c) || c <= a)) return 0;
  return 1;
}

static uint32_t pick(tb *b, uint32_t c) {
  const lm_eg_vec *v = &b->g->cnodes[c];
  uint32_t f = b->force ? b->force[c] : LM_EG_NONE;
  if (b->strict) { /* genetic operators: a parent's choice where it fits here, else the other's */
    if (f != LM_EG_NONE && fits(b, lm_eg_node(b->g, f))) return f;
    uint32_t a = b->alt ? b->alt[c] : LM_EG_NONE;
    if (a != LM_EG_NONE && fits(b, lm_eg_node(b->g, a))) return a;
  } else if (f != LM_EG_NONE && (!b->rng || uni(b->rng) < b->keep))
    return f;
  if (!b->rng || v->n == 1) return b->best[c];
  uint32_t avoid = b->avoid ? b->avoid[c] : LM_EG_NONE;
  const sk_data *d = lm_eg_data(b->g, c);
  if (avoid == LM_EG_NONE && d->kind == 2 && !d->has_red && uni(b->rng) < b->greedy_p) return b->best[c];
  uint32_t ok[64];
  int n = 0;
  for (uint32_t i = 0; i < v->n && n < 64; i++)
    if (v->v[i] != avoid && fits(b, lm_eg_node(b->g, v->v[i]))) ok[n++] = v->v[i];
  if (!n) return avoid != LM_EG_NONE ? avoid : b->best[c];
  if (b->prefer_kind >= 0 && uni(b->rng) < 0.8) {
    uint32_t pref[64];
    int np = 0;
    for (int i = 0; i < n; i++) {
      const lm_enode *e = lm_eg_node(b->g, ok[i]);
      uint32_t k = e->op == SK_LOOP ? sk_loop_of(b->s, e->attr)->kind : SK_KIND_COUNT;
      if (k == (uint32_t)b->prefer_kind || (b->prefer_kind == SK_GROUP && k == SK_GROUP_STAGED)) pref[np++] = ok[i];
    }
    if (np) return pref[sk_rand(b->rng) % (uint64_t)np];
  }
  return ok[sk_rand(b->rng) % (uint64_t)n];
}

static uint32_t build(tb *b, uint32_t c, int greedy_only);

static uint32_t build_node(tb *b, uint32_t c, uint32_t id, int greedy_only) {
  const lm_enode *n = lm_eg_node(b->g, id);
  lm_enode out = *n;
  int pushed = 0;
  if (n->op == SK_LOOP && b->nctx < (int)LM_COUNTOF(b->ctx)) {
    b->ctx[b->nctx++] = sk_loop_of(b->s, n->attr)->piece;
    pushed = 1;
  }
  uint32_t r = 0;
  for (int k = 0; k < n->n && r != CYCLE && !b->bad; k++) {
    uint32_t ch = build(b, lm_eg_find(b->g, n->c[k]), greedy_only);
    if (ch == CYCLE) r = CYCLE;
    else out.c[k] = ch;
  }
  if (pushed) b->nctx--;
  (void)c;
  if (r == CYCLE || b->bad) return r == CYCLE ? CYCLE : UINT32_MAX;
  return term_add(b, &out, id);
}

static uint32_t build(tb *b, uint32_t c, int greedy_only) {
  if (b->bad) return UINT32_MAX;
  if (b->on_stack[c]) return CYCLE;
  uint64_t key = ((uint64_t)c << 32) ^ ctx_hash(b);
  for (size_t i = 0; i < b->mn; i++) /* small terms: a linear memo is enough */
    if (b->memo[i].key == key) return b->memo[i].val;
  uint32_t id = greedy_only ? b->best[c] : pick(b, c);
  if (id == LM_EG_NONE) return b->bad = 1, UINT32_MAX;
  b->on_stack[c] = 1;
  uint32_t r = build_node(b, c, id, greedy_only);
  if (r == CYCLE && id != b->best[c] && b->best[c] != LM_EG_NONE) { /* repair: the greedy node */
    id = b->best[c];
    r = build_node(b, c, id, 1);
  }
  b->on_stack[c] = 0;
  if (r == CYCLE || r == UINT32_MAX) return r;
  if (b->genome) b->genome[c] = id;
  if (LM_GROW(b->memo, b->mcap, b->mn + 1)) b->memo[b->mn++] = (struct memo_kv){key, r};
  return r;
}

static lm_status extract(tb *b, uint32_t root) {
  lm_sk *s = b->s;
  memset(b->t, 0, sizeof *b->t);
  b->on_stack = lm_calloc(s->eg->nclasses + 1, 1);
  if (!b->on_stack) return LM_ERR_NOMEM;
  if (b->genome)
    for (size_t i = 0; i < s->eg->nclasses; i++) b->genome[i] = LM_EG_NONE;
  uint32_t r = build(b, lm_eg_find(s->eg, root), 0);
  lm_free(b->on_stack);
  lm_free(b->memo);
  lm_free(b->th);
  if (b->bad || r == CYCLE || r == UINT32_MAX) {
    sk_term_free(b->t);
    return b->bad ? LM_ERR_NOMEM : LM_ERR_INVALID;
  }
  b->t->root = r;
  return LM_OK;
}

lm_status sk_extract(lm_sk *s, uint32_t root, const uint32_t *best, const uint32_t *force, uint64_t *rng,
                     double keep, uint32_t *genome, sk_term *out) {
  tb b = {.s = s, .g = s->eg, .best = best, .force = force, .genome = genome, .rng = rng, .keep = keep,
          .greedy_p = 0.85, .prefer_kind = -1, .t = out};
  return extract(&b, root);
}

lm_status sk_extract_preferring(lm_sk *s, uint32_t root, const uint32_t *best, uint64_t *rng, int kind,
                                uint32_t *genome, sk_term *out) {
  tb b = {.s = s, .g = s->eg, .best = best, .genome = genome, .rng = rng, .greedy_p = 0.85, .prefer_kind = kind,
          .t = out};
  return extract(&b, root);
}

/* ---------------------------------------------------------------- register-tile seeds */

/* A tile the `tile` rule built: loops over the tile's outer pieces (two nested, or one merged),
 * then the tile's rows (unrolled) and its columns (a loop: the joint sums in a local array the C
 * compiler keeps in vector registers; unrolled: scalar accumulators). */
typedef struct seed {
  uint32_t c1, n1, c2, n2, c3, n3, c4, n4, ai, bi;
  int rank; /* lower first: array accumulators, unit-stride columns, column panels (packing copies B's
             * panel once for all its row tiles: a 6x16 panel tile in vector form ran 179 us at 256^3,
             * the merged 6x16 218 us), 4x16 or 6x16 */
} seed;

static int is_loop(lm_sk *s, const lm_enode *n, uint32_t type, uint32_t a, uint32_t b, int kind, uint32_t *piece) {
  if (n->op != SK_LOOP) return 0;
  const sk_loopattr *la = sk_loop_of(s, n->attr);
  const sk_piece *p = sk_piece_of(s, la->piece);
  if (p->type != type || p->a != a || p->b != b || (kind >= 0 && la->kind != (uint32_t)kind)) return 0;
  *piece = la->piece;
  return 1;
}

/* Do the stores under class c (the first of each effect class) step by one element along the
 * whole variable of piece p? Columns so are a tile's vectors. */
static int unit_stride(lm_sk *s, uint32_t c, uint32_t p) {
  lm_egraph *g = s->eg;
  const sk_piece *q = sk_piece_of(s, p);
  if (q->type != SKP_ORIG || q->a >= s->nvars) return 0;
  for (int depth = 0; depth < 8; depth++) {
    const lm_eg_vec *v = &g->cnodes[lm_eg_find(g, c)];
    if (!v->n) return 0;
    const lm_enode *n = lm_eg_node(g, v->v[0]);
    if (n->op == SK_STORE) {
      int64_t d = 0;
      return lm_x_step(s->x, sk_access_of(s, n->attr)->idx, (int)q->a, (int)s->nvars, &d) && d == 1;
    }
    if (n->op != SK_SEQ && n->op != SK_LOOP) return 0;
    c = n->c[0];
  }
  return 0;
}

/* Tiles under classes c3 (rows) and c4 (columns) for outer pieces ao and bo. */
static void seeds_below(lm_sk *s, seed base, uint32_t ao, uint32_t bo, seed *out, int *n, int cap) {
  lm_egraph *g = s->eg;
  const sk_piece *pa = sk_piece_of(s, ao), *pb = sk_piece_of(s, bo);
  const lm_eg_vec *v3 = &g->cnodes[base.c3];
  for (uint32_t i = 0; i < v3->n && *n < cap; i++) {
    const lm_enode *n3 = lm_eg_node(g, v3->v[i]);
    uint32_t ai, bi;
    if (!is_loop(s, n3, SKP_IN, pa->a, pa->b, SK_UNROLL, &ai)) continue;
    uint32_t c4 = lm_eg_find(g, n3->c[0]);
    const lm_eg_vec *v4 = &g->cnodes[c4];
    for (uint32_t k = 0; k < v4->n && *n < cap; k++) {
      const lm_enode *n4 = lm_eg_node(g, v4->v[k]);
      int arr = is_loop(s, n4, SKP_IN, pb->a, pb->b, SK_SER, &bi);
      if (!arr && !is_loop(s, n4, SKP_IN, pb->a, pb->b, SK_UNROLL, &bi)) continue;
      seed d = base;
      d.n3 = v3->v[i], d.c4 = c4, d.n4 = v4->v[k], d.ai = ai, d.bi = bi;
      int panel = base.n2 != LM_EG_NONE && sk_loop_of(s, lm_eg_node(g, base.n1)->attr)->piece == bo &&
                  sk_loop_of(s, lm_eg_node(g, base.n2)->attr)->kind == SK_SER; /* columns outside, rows in order */
      d.rank = (arr ? 0 : 8) + (unit_stride(s, n4->c[0], pb->a) ? 0 : 4) + (panel ? 0 : 2) +
               ((pa->b == 4 || pa->b == 6) && pb->b == 16 ? 0 : 1);
      out[(*n)++] = d;
    }
  }
}

static int find_seeds(lm_sk *s, seed *out, int cap) {
  lm_egraph *g = s->eg;
  int n = 0;
  for (size_t c = 0; c < g->nclasses && n < cap; c++) {
    if (g->uf[c] != c) continue;
    const lm_eg_vec *v = &g->cnodes[c];
    for (uint32_t i = 0; i < v->n && n < cap; i++) {
      const lm_enode *n1 = lm_eg_node(g, v->v[i]);
      if (n1->op != SK_LOOP || !((const sk_data *)lm_eg_data(g, n1->c[0]))->has_red) continue;
      uint32_t p1 = sk_loop_of(s, n1->attr)->piece;
      const sk_piece *q1 = sk_piece_of(s, p1);
      seed base = {.c1 = (uint32_t)c, .n1 = v->v[i], .c2 = LM_EG_NONE, .n2 = LM_EG_NONE};
      if (q1->type == SKP_MERGE) {
        const sk_piece *qa = sk_piece_of(s, q1->a), *qb = sk_piece_of(s, q1->b);
        if (qa->type != SKP_OUT || qb->type != SKP_OUT) continue;
        base.c3 = lm_eg_find(g, n1->c[0]);
        seeds_below(s, base, q1->a, q1->b, out, &n, cap);
      } else if (q1->type == SKP_OUT) {
        base.c2 = lm_eg_find(g, n1->c[0]);
        const lm_eg_vec *v2 = &g->cnodes[base.c2];
        for (uint32_t k = 0; k < v2->n && n < cap; k++) {
          const lm_enode *n2 = lm_eg_node(g, v2->v[k]);
          if (n2->op != SK_LOOP) continue;
          uint32_t p2 = sk_loop_of(s, n2->attr)->piece;
          const sk_piece *q2 = sk_piece_of(s, p2);
          if (q2->type != SKP_OUT || q2->a == q1->a) continue;
          base.n2 = v2->v[k];
          base.c3 = lm_eg_find(g, n2->c[0]);
          seeds_below(s, base, p1, p2, out, &n, cap); /* row tiles outside */
          seeds_below(s, base, p2, p1, out, &n, cap); /* column panels outside */
        }
      }
    }
  }
  return n;
}

/* The reductions under class c computed jointly over the tile (ai, bi): forced where offered. */
static void force_joint(lm_sk *s, uint32_t c, uint32_t ai, uint32_t bi, uint32_t *force, uint8_t *seen, int depth) {
  lm_egraph *g = s->eg;
  c = lm_eg_find(g, c);
  if (seen[c] || depth > 24) return;
  seen[c] = 1;
  const lm_eg_vec *v = &g->cnodes[c];
  for (uint32_t i = 0; i < v->n; i++) {
    const lm_enode *n = lm_eg_node(g, v->v[i]);
    if (n->op == SK_RED) {
      const sk_redattr *r = sk_red_of(s, n->attr);
      if (r->nj == 2 && r->joint[0] == ai && r->joint[1] == bi && !r->swap && r->lanes == 1) force[c] = v->v[i];
      continue;
    }
    if (force[c] == LM_EG_NONE || force[c] == v->v[i])
      for (int k = 0; k < n->n; k++)
        if (((const sk_data *)lm_eg_data(g, n->c[k]))->has_red) force_joint(s, n->c[k], ai, bi, force, seen, depth + 1);
  }
}

static int cmp_seed(const void *a, const void *b) {
  const seed *x = a, *y = b;
  return x->rank != y->rank ? x->rank - y->rank : x->n1 < y->n1 ? -1 : x->n1 > y->n1;
}

int sk_tile_seed(lm_sk *s, int which, uint32_t *force) {
  enum { CAP = 4096 }; /* the PPO update's hidden layers offer ~1800 (256 cut off its 6x16 tiles) */
  seed *all = lm_malloc(CAP * sizeof *all);
  uint8_t *seen = lm_calloc(s->eg->nclasses + 1, 1);
  int n = all && seen ? find_seeds(s, all, CAP) : 0, ok = 0;
  size_t ncl = s->eg->nclasses;
  if (n) qsort(all, (size_t)n, sizeof *all, cmp_seed);
  for (int i = 0, valid = 0; i < n && which >= 0 && !ok; i++) { /* seeds with a joint reduction over the tile */
    const seed *d = &all[i];
    for (size_t c = 0; c < ncl; c++) force[c] = LM_EG_NONE;
    memset(seen, 0, ncl + 1);
    force_joint(s, lm_eg_node(s->eg, d->n4)->c[0], d->ai, d->bi, force, seen, 0);
    int joint = 0;
    for (size_t c = 0; c < ncl && !joint; c++) joint = force[c] != LM_EG_NONE;
    if (!joint || valid++ < which) continue;
    force[d->c1] = d->n1;
    if (d->c2 != LM_EG_NONE) force[d->c2] = d->n2;
    force[d->c3] = d->n3;
    force[d->c4] = d->n4;
    ok = 1;
  }
  lm_free(all);
  lm_free(seen);
  return ok;
}

/* A split loop's neighbour in its class: the same loop split by twice or half the factor (a 4x8
 * register tile becomes 4x16 or 4x4), or NONE. A redrawn class takes this half the time: a good
 * tile's neighbours are likelier to be good than a random choice (the 256^3 matmul's best kind
 * of tile, 4x16, is rarely drawn at random among ~1e12 terms). */
static uint32_t factor_step(lm_sk *s, uint32_t c, uint32_t chosen, uint64_t *rng) {
  lm_egraph *g = s->eg;
  const lm_enode *n = lm_eg_node(g, chosen);
  if (n->op != SK_LOOP) return LM_EG_NONE;
  const sk_piece *pc = sk_piece_of(s, sk_loop_of(s, n->attr)->piece);
  if (pc->type != SKP_OUT) return LM_EG_NONE;
  uint32_t want = (sk_rand(rng) & 1) ? pc->b * 2 : pc->b / 2, kind = sk_loop_of(s, n->attr)->kind;
  const lm_eg_vec *v = &g->cnodes[c];
  for (uint32_t i = 0; i < v->n; i++) {
    const lm_enode *m = lm_eg_node(g, v->v[i]);
    if (m->op != SK_LOOP || sk_loop_of(s, m->attr)->kind != kind) continue;
    const sk_piece *pm = sk_piece_of(s, sk_loop_of(s, m->attr)->piece);
    if (pm->type == SKP_OUT && pm->a == pc->a && pm->b == want) return v->v[i];
  }
  return LM_EG_NONE;
}

/* Classes worth drawing again: the parent took a node there and the class has another. Effect
 * classes and those holding a reduction (the schedule: loops, their kinds, reduction forms) come
 * first; plain value classes (commuted and reassociated arithmetic) are drawn a third of the time. */
lm_status sk_mutate(lm_sk *s, uint32_t root, const uint32_t *best, const uint32_t *parent, int nredraw,
                    uint64_t *rng, uint32_t *genome, sk_term *out) {
  lm_egraph *g = s->eg;
  size_t ncl = g->nclasses;
  uint32_t *force = lm_malloc((ncl + 1) * sizeof *force), *avoid = lm_malloc((ncl + 1) * sizeof *avoid);
  uint32_t *sched = lm_malloc((ncl + 1) * sizeof *sched), *value = lm_malloc((ncl + 1) * sizeof *value);
  lm_status st = LM_ERR_NOMEM;
  if (!force || !avoid || !sched || !value) goto done;
  size_t ns = 0, nv = 0;
  for (size_t c = 0; c < ncl; c++) {
    force[c] = parent[c];
    avoid[c] = LM_EG_NONE;
    if (parent[c] == LM_EG_NONE || g->uf[c] != c || g->cnodes[c].n < 2) continue;
    const sk_data *d = lm_eg_data(g, (uint32_t)c);
    if (d->kind == 2 && !d->has_red) value[nv++] = (uint32_t)c;
    else sched[ns++] = (uint32_t)c;
  }
  for (int i = 0; i < nredraw && ns + nv > 0; i++) {
    int from_sched = ns && (!nv || uni(rng) < 2.0 / 3.0);
    uint32_t *list = from_sched ? sched : value;
    size_t *n = from_sched ? &ns : &nv;
    size_t k = (size_t)(sk_rand(rng) % (uint64_t)*n);
    uint32_t c = list[k];
    list[k] = list[--*n]; /* drawn once */
    uint32_t step = from_sched && (sk_rand(rng) & 1) ? factor_step(s, (uint32_t)c, parent[c], rng) : LM_EG_NONE;
    avoid[c] = parent[c];
    force[c] = step;
  }
  tb b = {.s = s, .g = g, .best = best, .force = force, .avoid = avoid, .strict = 1, .genome = genome,
          .rng = rng, .greedy_p = 0.85, .prefer_kind = -1, .t = out};
  st = extract(&b, root);
done:
  lm_free(force);
  lm_free(avoid);
  lm_free(sched);
  lm_free(value);
  if (st == LM_ERR_NOMEM) memset(out, 0, sizeof *out);
  return st;
}

lm_status sk_crossover(lm_sk *s, uint32_t root, const uint32_t *best, const uint32_t *pa, const uint32_t *pb,
                       uint64_t *rng, uint32_t *genome, sk_term *out) {
  size_t ncl = s->eg->nclasses;
  uint32_t *first = lm_malloc((ncl + 1) * sizeof *first), *second = lm_malloc((ncl + 1) * sizeof *second);
  lm_status st = LM_ERR_NOMEM;
  if (first && second) {
    for (size_t c = 0; c < ncl; c++) {
      int swap = pa[c] == LM_EG_NONE || (pb[c] != LM_EG_NONE && (sk_rand(rng) & 1));
      first[c] = swap ? pb[c] : pa[c];
      second[c] = swap ? pa[c] : pb[c];
    }
    tb b = {.s = s, .g = s->eg, .best = best, .force = first, .alt = second, .strict = 1, .genome = genome,
            .prefer_kind = -1, .t = out};
    st = extract(&b, root);
  }
  lm_free(first);
  lm_free(second);
  if (st == LM_ERR_NOMEM) memset(out, 0, sizeof *out);
  return st;
}

/* Classes reachable from root through any node, and the product of their choices (capped). */
double sk_space(lm_sk *s, uint32_t root, uint32_t *classes, size_t *n) {
  lm_egraph *g = s->eg;
  uint8_t *seen = lm_calloc(g->nclasses + 1, 1);
  uint32_t *stack = lm_malloc((g->nclasses + 1) * sizeof *stack);
  double prod = 1;
  size_t ns = 0, nc = 0;
  if (!seen || !stack) {
    lm_free(seen);
    lm_free(stack);
    *n = 0;
    return INFINITY;
  }
  stack[ns++] = lm_eg_find(g, root);
  seen[stack[0]] = 1;
  while (ns) {
    uint32_t c = stack[--ns];
    if (classes) classes[nc] = c;
    nc++;
    const lm_eg_vec *v = &g->cnodes[c];
    prod *= v->n;
    if (prod > 1e12) prod = 1e12;
    for (uint32_t i = 0; i < v->n; i++) {
      const lm_enode *e = lm_eg_node(g, v->v[i]);
      for (int k = 0; k < e->n; k++) {
        uint32_t ch = lm_eg_find(g, e->c[k]);
        if (!seen[ch]) seen[ch] = 1, stack[ns++] = ch;
      }
    }
  }
  lm_free(seen);
  lm_free(stack);
  *n = nc;
  return prod;
}

/* Which rules made the nodes of a term (a bit per rule). */
uint64_t sk_term_rules(const lm_sk *s, const sk_term *t, int *rounding) {
  uint64_t m = 0;
  int n = 0;
  const lm_rule *rules = sk_rules(&n);
  *rounding = 0;
  for (size_t i = 0; i < t->count; i++) {
    uint32_t src = t->src[i];
    if (src == LM_EG_NONE || src >= s->eg->nnodes) continue;
    uint32_t cls = lm_eg_find(s->eg, s->eg->node_cls[src]);
    if (s->eg->taint[cls] || s->eg->node_inexact[src]) *rounding = 1; /* may round differently */
    int r = s->eg->node_rule[src];
    if (r < 0 || r >= n) continue;
    m |= 1ull << r;
    if (rules[r].flags & LM_RULE_ROUNDING) *rounding = 1;
  }
  return m;
}
