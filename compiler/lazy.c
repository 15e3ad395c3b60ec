/* compiler/lazy.c — lazy draws in a kernel in lane form (the cpu schedule, after lanes.c,
 * inplace.c and columns.c).
 *
 * An env's auto-reset draws a fresh state for every env at every step and keeps it only where
 * the episode ended (envs/vec.c: after = (done * fresh + 0) + (1 - done) * next). In lane form
 * the fresh state's Philox draws, one block per env and step, are a third of CartPole's env-only
 * step (rlbench, 32 lanes: 8.8 ns per env-step, 5.8 without them), for values one env in about
 * twenty uses. This pass computes such a value only for the lanes that use it:
 *
 *   lanes i < L (S): ...; F[i] = done; ...; A[i] = a(RAND, ...)
 *   sparse i < L where F[i] != 0 (Q, placed right after S): A[i] = a(RAND, ...)
 *   lanes j < L (a consumer C after S): t = ...A[j]...; p = F[j] * t; q = p + 0; ...
 *
 * Bit-identical results: where F[j] != 0 (NaN included) the lane computed A[j] as before. Where
 * F[j] is a zero, p is a zero whatever finite value A[j] holds (a value of an earlier step, or
 * the 0 the array starts at), and p + (+0) is +0 for either zero. So a value is made lazy only
 * when all of this holds (else the kernel is left as it is):
 *   - A is a per-lane array stored once in the kernel, in S at lane i, from a value computed in
 *     S by + and * from RAND and constants alone, with finite bounds (interval arithmetic, RAND
 *     in (0,1]); nothing else uses that computation;
 *   - F is a per-lane array stored once, in S at lane i;
 *   - A is loaded only in lane loops after S in S's block (or inside loops after S), at their
 *     lane; what it feeds is + and * with other such values, constants and padded constants,
 *     and paddings of them (valid ? v : 0, as a stack's columns), with finite bounds,
 *     until a product with F loaded at the same lane, whose every use adds a constant +0
 *     (lm_env_select writes that + 0 for this).
 * A starts at 0: a lane loop at the head of the parallel loop's body stores it. */
#include <math.h>
#include <string.h>

#include "core.h"
#include "loopir.h"

enum { MAX_ARRAYS = 64 };
#define BOUND 1e30 /* values within it stay finite through the sums and products allowed */

typedef struct lz {
  lm_kernel *k;
  lm_exprs *x;
  size_t ns;
  uint32_t *ustart, *users; /* users of statement i: users[ustart[i] .. ustart[i + 1]) */
  uint32_t *nstores, *store; /* per local array: how many STOREs, and one of them */
  double *lo, *hi;          /* per statement: bounds of its values (cone, taint) */
  uint64_t *cone;           /* per statement of S: the candidates whose computation holds it */
  uint64_t *taint;          /* per statement: the candidates whose values flow into it */
  int32_t S;
  uint32_t arr[MAX_ARRAYS];  /* the candidate arrays of S */
  uint32_t flag[MAX_ARRAYS]; /* the array each one's values are multiplied by (UINT32_MAX: none) */
  int narr;
  uint64_t live; /* candidates still standing */
} lz;

static int finite(double lo, double hi) { return lo > -BOUND && hi < BOUND; }

static int lane_access(const lz *z, const lm_stmt *s, int32_t loop) {
  return s->idx == lm_x_var(z->x, loop) && lm_x_is_const(z->x, s->valid, 1);
}

/* Bounds of a product of two intervals. */
static void mul_bounds(double alo, double ahi, double blo, double bhi, double *lo, double *hi) {
  double p[4] = {alo * blo, alo * bhi, ahi * blo, ahi * bhi};
  *lo = *hi = p[0];
  for (int i = 1; i < 4; i++) {
    if (p[i] < *lo) *lo = p[i];
    if (p[i] > *hi) *hi = p[i];
  }
}

/* A constant, or a padded constant (valid ? c : 0): its bounds. */
static int bounded(const lz *z, uint32_t v, double *lo, double *hi) {
  const lm_stmt *s = &z->k->stmts[v];
  int sel = s->op == LM_S_SELECT;
  if (sel) s = &z->k->stmts[s->a];
  if (s->op != LM_S_CONST || !isfinite(s->f)) return 0;
  *lo = *hi = s->f;
  if (sel) *lo = fmin(*lo, 0.0), *hi = fmax(*hi, 0.0);
  return 1;
}

/* Marks the computation of value v (in S) for candidate `bit`; 0 when it is not + and * over
 * RAND and constants with finite bounds. */
static int mark_cone(lz *z, uint32_t v, uint64_t bit) {
  const lm_stmt *s = &z->k->stmts[v];
  if (s->loop != z->S) { /* a constant of an enclosing block */
    if (s->op != LM_S_CONST || !isfinite(s->f)) return 0;
    z->lo[v] = z->hi[v] = s->f;
    return 1;
  }
  if (z->cone[v] & bit) return 1; /* marked (and bounded) from another use */
  z->cone[v] |= bit;
  switch (s->op) {
  case LM_S_RAND: z->lo[v] = 0, z->hi[v] = 1; return 1;
  case LM_S_CONST: z->lo[v] = z->hi[v] = s->f; return isfinite(s->f);
  case LM_S_ADD:
  case LM_S_MUL:
    if (s->a >= v || s->b >= v || !mark_cone(z, s->a, bit) || !mark_cone(z, s->b, bit)) return 0;
    if (s->op == LM_S_ADD) z->lo[v] = z->lo[s->a] + z->lo[s->b], z->hi[v] = z->hi[s->a] + z->hi[s->b];
    else mul_bounds(z->lo[s->a], z->hi[s->a], z->lo[s->b], z->hi[s->b], &z->lo[v], &z->hi[v]);
    return finite(z->lo[v], z->hi[v]);
  default: return 0;
  }
}

/* Is loop c inside a loop that comes after S in S's block (or c itself such a loop)? */
static int after_S(const lz *z, int32_t c) {
  const lm_kernel *k = z->k;
  int32_t p = k->loops[z->S].parent;
  while (c >= 0 && k->loops[c].parent != p) c = k->loops[c].parent;
  if (c < 0) return 0;
  const lm_block *b = p < 0 ? &k->root : &k->loops[p].body;
  size_t at_c = lm_block_find(b, 1, (uint32_t)c);
  return lm_block_find(b, 1, (uint32_t)z->S) < at_c && at_c < b->n;
}

/* The live candidate that is local array a, or -1. */
static int slot_of_array(const lz *z, uint32_t a) {
  for (int i = 0; i < z->narr; i++)
    if ((z->live >> i & 1) && z->arr[i] == a) return i;
  return -1;
}

/* A per-lane array stored once, in S at its lane, and not a candidate: a flag. */
static int flag_array(const lz *z, uint32_t a) {
  if (z->nstores[a] != 1) return 0;
  const lm_stmt *st = &z->k->stmts[z->store[a]];
  return st->loop == z->S && lane_access(z, st, z->S) && slot_of_array(z, a) < 0;
}

static int slot_of(const lz *z, const lm_stmt *s) { return s->op == LM_S_LOAD && s->local ? slot_of_array(z, s->buf) : -1; }

/* Records that the candidates in m are multiplied by flag array f; 0 on a conflict. */
static int set_flag(lz *z, uint64_t m, uint32_t f) {
  for (int i = 0; i < z->narr; i++)
    if (m >> i & 1) {
      if (z->flag[i] != UINT32_MAX && z->flag[i] != f) return 0;
      z->flag[i] = f;
    }
  return 1;
}

/* One pass over the live candidates of S; returns the candidates to drop (0: all stand). */
static uint64_t check(lz *z) {
  lm_kernel *k = z->k;
  memset(z->cone, 0, z->ns * sizeof *z->cone);
  memset(z->taint, 0, z->ns * sizeof *z->taint);
  for (int i = 0; i < z->narr; i++) z->flag[i] = UINT32_MAX;
  for (int i = 0; i < z->narr; i++) {
    if (!(z->live >> i & 1)) continue;
    if (!mark_cone(z, k->stmts[z->store[z->arr[i]]].a, (uint64_t)1 << i)) return (uint64_t)1 << i;
  }
  /* the computations are used by themselves and the candidates' stores alone */
  for (uint32_t v = 0; v < z->ns; v++) {
    if (!z->cone[v]) continue;
    for (uint32_t u = z->ustart[v]; u < z->ustart[v + 1]; u++) {
      uint32_t w = z->users[u];
      const lm_stmt *s = &k->stmts[w];
      int at = s->op == LM_S_STORE && s->local ? slot_of_array(z, s->buf) : -1;
      int own = at >= 0 && z->store[s->buf] == w && (z->cone[v] >> at & 1);
      if (!own && !(z->cone[w] & z->cone[v])) return z->cone[v];
    }
  }
  /* the loads, forward in statement order (operands come first) */
  for (uint32_t v = 0; v < z->ns; v++) {
    const lm_stmt *s = &k->stmts[v];
    int at = slot_of(z, s);
    if (at >= 0) {
      uint64_t bit = (uint64_t)1 << at;
      if (s->loop < 0 || s->loop == z->S || k->loops[s->loop].kind != LM_L_LANES || !lane_access(z, s, s->loop) ||
          !after_S(z, s->loop))
        return bit;
      uint32_t val = k->stmts[z->store[z->arr[at]]].a;
      z->taint[v] = bit;
      z->lo[v] = fmin(z->lo[val], 0.0), z->hi[v] = fmax(z->hi[val], 0.0);
      continue;
    }
    int m = lm_sop_operands(s->op);
    uint64_t ta = (m & LM_OPND_A) ? z->taint[s->a] : 0, tb = (m & LM_OPND_B) ? z->taint[s->b] : 0;
    if (!(ta | tb)) continue;
    if (s->op == LM_S_SELECT && k->stmts[s->a].loop == s->loop) { /* a padding: the value or 0 */
      z->lo[v] = fmin(z->lo[s->a], 0.0), z->hi[v] = fmax(z->hi[s->a], 0.0);
      z->taint[v] = ta;
      continue;
    }
    if (s->op != LM_S_ADD && s->op != LM_S_MUL) return ta | tb;
    if ((ta && k->stmts[s->a].loop != s->loop) || (tb && k->stmts[s->b].loop != s->loop)) return ta | tb;
    if (s->op == LM_S_MUL && !(ta && tb)) { /* a product with the flag? */
      const lm_stmt *o = &k->stmts[ta ? s->b : s->a];
      if (o->op == LM_S_LOAD && o->local && o->loop == s->loop && lane_access(z, o, s->loop) && flag_array(z, o->buf)) {
        if (!set_flag(z, ta | tb, o->buf)) return ta | tb;
        for (uint32_t u = z->ustart[v]; u < z->ustart[v + 1]; u++) { /* every use adds +0 */
          const lm_stmt *w = &k->stmts[z->users[u]];
          const lm_stmt *c = w->op == LM_S_ADD ? &k->stmts[w->a == v ? w->b : w->a] : NULL;
          if (!c || c->op != LM_S_CONST || signbit(c->f) || c->f != 0.0f) return ta | tb;
        }
        continue; /* exact from here on */
      }
    }
    double alo, ahi, blo, bhi;
    if (ta) alo = z->lo[s->a], ahi = z->hi[s->a];
    else if (!bounded(z, s->a, &alo, &ahi)) return tb;
    if (tb) blo = z->lo[s->b], bhi = z->hi[s->b];
    else if (!bounded(z, s->b, &blo, &bhi)) return ta;
    if (s->op == LM_S_ADD) z->lo[v] = alo + blo, z->hi[v] = ahi + bhi;
    else mul_bounds(alo, ahi, blo, bhi, &z->lo[v], &z->hi[v]);
    if (!finite(z->lo[v], z->hi[v])) return ta | tb;
    z->taint[v] = ta | tb;
  }
  uint64_t drop = 0;
  for (int i = 0; i < z->narr; i++)
    if ((z->live >> i & 1) && z->flag[i] == UINT32_MAX) drop |= (uint64_t)1 << i; /* never used */
  /* a computation shared by candidates of two flags would be needed by both sparse loops */
  for (uint32_t v = 0; v < z->ns && !drop; v++)
    for (int i = 0; i < z->narr; i++)
      if ((z->cone[v] >> i & 1) && z->flag[i] != z->flag[__builtin_ctzll(z->cone[v])]) drop |= z->cone[v];
  return drop;
}

/* The sparse loop of flag f right after S, with the statements of its candidates moved in. */
static int make_sparse(lz *z, uint32_t f) {
  lm_kernel *k = z->k;
  uint64_t mine = 0;
  for (int i = 0; i < z->narr; i++)
    if ((z->live >> i & 1) && z->flag[i] == f) mine |= (uint64_t)1 << i;
  if (!mine) return 0;
  int32_t S = z->S, p = k->loops[S].parent;
  if (!LM_GROW(k->loops, k->loopcap, k->nloops + 1)) return -1;
  int32_t Q = (int32_t)k->nloops++;
  k->loops[Q] = (lm_loop){.extent = k->loops[S].extent, .kind = LM_L_SPARSE, .parent = p, .mask = f};
  lm_block *pb = p < 0 ? &k->root : &k->loops[p].body;
  if (!lm_block_insert(pb, lm_block_find(pb, 1, (uint32_t)S) + 1, (lm_item){1, (uint32_t)Q})) return -1;
  lm_expr *vmap = lm_calloc(k->nloops, sizeof *vmap);
  if (!vmap) return -1;
  vmap[S] = lm_x_var(z->x, Q);
  lm_block *sb = &k->loops[S].body, *qb = &k->loops[Q].body;
  size_t keep = 0;
  int st = 0;
  for (size_t i = 0; i < sb->n; i++) {
    lm_item it = sb->items[i];
    lm_stmt *s = &k->stmts[it.id];
    int at = !it.is_loop && s->op == LM_S_STORE && s->local ? slot_of_array(z, s->buf) : -1;
    int move = !it.is_loop && ((z->cone[it.id] & mine) || (at >= 0 && (mine >> at & 1)));
    if (!move) {
      sb->items[keep++] = it;
      continue;
    }
    s->loop = Q;
    s->idx = s->idx ? lm_x_subst(z->x, s->idx, vmap, (int)k->nloops) : 0;
    s->valid = s->valid ? lm_x_subst(z->x, s->valid, vmap, (int)k->nloops) : 0;
    s->step = s->step ? lm_x_subst(z->x, s->step, vmap, (int)k->nloops) : 0;
    if (!lm_block_insert(qb, qb->n, it)) st = -1;
  }
  sb->n = keep;
  lm_free(vmap);
  return st < 0 || z->x->failed ? -1 : __builtin_popcountll(mine);
}

/* Every lazy array starts at 0: a lane loop at the head of the parallel loop's body. */
static int zero_arrays(lz *z, uint64_t arrays) {
  lm_kernel *k = z->k;
  if (!LM_GROW(k->loops, k->loopcap, k->nloops + 1)) return -1;
  int32_t I = (int32_t)k->nloops++;
  k->loops[I] = (lm_loop){.extent = k->loops[z->S].extent, .kind = LM_L_LANES, .parent = 0};
  if (!lm_block_insert(&k->loops[0].body, 0, (lm_item){1, (uint32_t)I})) return -1;
  lm_stmt zero = {.op = LM_S_CONST, .loop = I, .f = 0.0f};
  uint32_t c = lm_kernel_add_stmt(k, &zero, -1);
  for (int i = 0; i < z->narr && c != UINT32_MAX; i++) {
    if (!(arrays >> i & 1)) continue;
    lm_stmt st = {.op = LM_S_STORE, .loop = I, .buf = z->arr[i], .local = 1, .a = c, .idx = lm_x_var(z->x, I),
                  .valid = lm_x_const(z->x, 1)};
    if (lm_kernel_add_stmt(k, &st, -1) == UINT32_MAX) return -1;
  }
  return c == UINT32_MAX ? -1 : 0;
}

/* The candidates of lane loop S: per-lane arrays stored once, there, at its lane. */
static void candidates(lz *z) {
  const lm_kernel *k = z->k;
  const lm_block *b = &k->loops[z->S].body;
  z->narr = 0;
  for (size_t i = 0; i < b->n && z->narr < MAX_ARRAYS; i++) {
    if (b->items[i].is_loop) continue;
    const lm_stmt *s = &k->stmts[b->items[i].id];
    if (s->op == LM_S_STORE && s->local && z->nstores[s->buf] == 1 && lane_access(z, s, z->S) &&
        k->stmts[s->a].loop == z->S && k->stmts[s->a].op != LM_S_LOAD)
      z->arr[z->narr++] = s->buf;
  }
  z->live = z->narr == 64 ? ~(uint64_t)0 : ((uint64_t)1 << z->narr) - 1;
}

static int lazy_loop(lz *z) {
  const lm_kernel *k = z->k;
  const lm_block *b = &k->loops[z->S].body;
  for (size_t i = 0; i < b->n; i++)
    if (b->items[i].is_loop) return 0;
  const lm_xnode *e = lm_x_node(z->x, k->loops[z->S].extent);
  if (e->op != LM_X_CONST || e->v > 64) return 0; /* a sparse loop's lanes are bits of a mask */
  candidates(z);
  uint64_t drop;
  while (z->live && (drop = check(z))) { /* each round drops a candidate; the last one's marks stand */
    if (!(drop & z->live)) return 0;
    z->live &= ~drop;
  }
  if (!z->live) return 0;
  int made = 0;
  uint32_t flags[MAX_ARRAYS];
  int nflags = 0;
  for (int i = 0; i < z->narr; i++) {
    if (!(z->live >> i & 1)) continue;
    int seen = 0;
    for (int j = 0; j < nflags; j++) seen |= flags[j] == z->flag[i];
    if (!seen) flags[nflags++] = z->flag[i];
  }
  if (zero_arrays(z, z->live) < 0) return -1;
  for (int j = 0; j < nflags; j++) {
    int n = make_sparse(z, flags[j]);
    if (n < 0) return -1;
    made += n;
  }
  return made;
}

int lm_lanes_lazy(lm_kernel *k, lm_exprs *x) {
  if (k->npar != 1 || k->nloops == 0 || k->loops[0].kind != LM_L_PARALLEL) return 0;
  lz z = {.k = k, .x = x, .ns = k->nstmts};
  size_t nl = k->nlocals + 1;
  z.ustart = lm_calloc(z.ns + 2, sizeof *z.ustart);
  z.nstores = lm_calloc(nl, sizeof *z.nstores);
  z.store = lm_calloc(nl, sizeof *z.store);
  z.lo = lm_calloc(z.ns + 1, sizeof *z.lo);
  z.hi = lm_calloc(z.ns + 1, sizeof *z.hi);
  z.cone = lm_calloc(z.ns + 1, sizeof *z.cone);
  z.taint = lm_calloc(z.ns + 1, sizeof *z.taint);
  int made = 0;
  if (!z.ustart || !z.nstores || !z.store || !z.lo || !z.hi || !z.cone || !z.taint) goto out;
  /* users, in CSR form */
  for (size_t i = 0; i < z.ns; i++) {
    const lm_stmt *s = &k->stmts[i];
    int m = lm_sop_operands(s->op);
    if (m & LM_OPND_A) z.ustart[s->a + 1]++;
    if ((m & LM_OPND_B) && s->b != s->a) z.ustart[s->b + 1]++;
    if (s->op == LM_S_STORE && s->local) z.nstores[s->buf]++, z.store[s->buf] = (uint32_t)i;
  }
  for (size_t i = 0; i < z.ns; i++) z.ustart[i + 1] += z.ustart[i];
  z.users = lm_calloc(z.ustart[z.ns] + 1, sizeof *z.users);
  uint32_t *fill = lm_calloc(z.ns + 1, sizeof *fill);
  if (!z.users || !fill) {
    lm_free(fill);
    goto out;
  }
  for (size_t i = 0; i < z.ns; i++) {
    const lm_stmt *s = &k->stmts[i];
    int m = lm_sop_operands(s->op);
    if (m & LM_OPND_A) z.users[z.ustart[s->a] + fill[s->a]++] = (uint32_t)i;
    if ((m & LM_OPND_B) && s->b != s->a) z.users[z.ustart[s->b] + fill[s->b]++] = (uint32_t)i;
  }
  lm_free(fill);
  size_t nloops = k->nloops; /* the loops made here are not visited */
  for (size_t l = 0; l < nloops && made >= 0; l++) {
    if (k->loops[l].kind != LM_L_LANES) continue;
    z.S = (int32_t)l;
    int n = lazy_loop(&z);
    made = n < 0 ? -1 : made + n;
  }
out:
  lm_free(z.ustart);
  lm_free(z.users);
  lm_free(z.nstores);
  lm_free(z.store);
  lm_free(z.lo);
  lm_free(z.hi);
  lm_free(z.cone);
  lm_free(z.taint);
  return made;
}
