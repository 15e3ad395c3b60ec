/* compiler/partial.c — sums over the batch's rows in two halves, one a thread (partial sums).
 *
 * A PPO update's weight gradients are sums over the minibatch's rows: every point of their
 * (stacked) kernel, a block of a weight's columns, reads every row. On two cores half of those
 * rows were written by the other core, in its share of the row-parallel kernels before (the
 * input gradients), and the sums wait on cross-core traffic: CartPole's weight gradients took
 * 21 us a 128-row minibatch on one thread and 25 on two (Xeon model 207).
 *   par p < E: acc = 0; for r < R: acc += f(p, r); out[p] = acc
 * becomes
 *   par q < 2E: h = q / E, p = q % E; acc = 0; for j < H - h(2H - R): acc += f(p, hH + j);
 *               out'[h*n + p] = acc                                    (H = ceil(R / 2))
 * and every later kernel reads out'[i] + out'[n + i] where it read out[i]. The second half's
 * loops over the rows stop one row sooner where R is odd (lm_loop.stop): guarding that row in
 * the loop instead, a select in every row's sum, made clang keep a 64-float accumulator row in
 * memory, a store after every FMA (CartPole's actor weight gradient, 128 rows on AVX2: 36 us
 * guarded, 17 us stopped). The first half of
 * the new domain is the pool's chunk 0 on two threads, the caller's, which ran the first half of
 * the rows in the row-parallel kernels before (and the second half the worker's): each core
 * sums the rows it wrote, and only the partial sums cross.
 *
 * Legal where every value the kernel stores is such a sum: an accumulator (ACC, or a local
 * array set to 0 and then only added to, jam's form) that grows only in loops over R, stored
 * as it is; nothing else stored; the buffers written by this kernel alone, read by later ones.
 * The rows are summed in another order, so only in a graph that allows reassociation
 * (contraction); the halves are fixed (two, whatever the threads), so every thread count gives
 * the same bits. Only where the sums are few (MAX_FLOATS). Not a rule: it changes what other kernels read, and the search's rewrites are
 * kernel-local; and it pays through which core wrote the rows, which a kernel timed alone does
 * not see. */
#include <string.h>

#include "loopir.h"

/* At most this many floats stored: each part is then a small buffer that stays in cache, and
 * its readers' second read is cheap. MinAtar Breakout's dense 1600 -> 128 weight gradient
 * (204800 floats) split so took its training from 21.9k to 17.9k env steps/s (Xeon model 207):
 * its rows (1600 floats each) are read from memory either way, and the parts doubled its Adam's
 * reads. */
enum { PARTS = 2, MAX_FLOATS = 16384 };

typedef struct pk {
  lm_plan *plan;
  lm_kernel *k;
  lm_exprs *x;
  lm_expr R;        /* the rows: the one symbolic extent of the kernel's loops */
  int32_t *in_r;    /* per loop: the loop over R it lies in (itself included), or -1 */
  uint8_t *acc_arr; /* per local array: added to in a loop over R (an accumulator) */
  uint32_t *uses;   /* per statement: how many statements use it as an operand */
  uint8_t *accread; /* per statement: that read of an accumulator array */
} pk;

static int32_t r_of(const pk *c, const lm_stmt *s) { return s->loop >= 0 ? c->in_r[s->loop] : -1; }

/* `add` is L[idx] + t with L[idx] read from local array `buf` at idx: which operand reads it
 * (0: a, 1: b), or -1. */
static int added(const pk *c, uint32_t add, uint32_t buf, lm_expr idx) {
  const lm_stmt *a = &c->k->stmts[add];
  if (a->op != LM_S_ADD) return -1;
  for (int side = 0; side < 2; side++) {
    const lm_stmt *l = &c->k->stmts[side ? a->b : a->a];
    if (l->op == LM_S_LOAD && l->local && l->buf == buf && l->idx == idx) return side;
  }
  return -1;
}

/* Is accumulator statement `acc` (LM_S_ACC) added to in loops over R alone? */
static int acc_in_r(const pk *c, uint32_t acc) {
  int any = 0;
  for (size_t i = 0; i < c->k->nstmts; i++) {
    const lm_stmt *s = &c->k->stmts[i];
    if (s->op != LM_S_ACC_SUM || s->a != acc) continue;
    if (r_of(c, s) < 0) return 0;
    any = 1;
  }
  return any;
}

/* Does statement i have users other than global stores of it? */
static int used_but_stored(const lm_kernel *k, uint32_t i) {
  for (size_t j = 0; j < k->nstmts; j++) {
    const lm_stmt *u = &k->stmts[j];
    int mask = lm_sop_operands(u->op);
    if (((mask & LM_OPND_A) && u->a == i) || ((mask & LM_OPND_B) && u->b == i))
      if (u->op != LM_S_STORE || u->local || u->a != i) return 1;
  }
  return 0;
}

/* Is accumulator `acc` used only to add to and to be stored? */
static int acc_users_ok(const lm_kernel *k, uint32_t acc) {
  for (size_t j = 0; j < k->nstmts; j++) {
    const lm_stmt *u = &k->stmts[j];
    int mask = lm_sop_operands(u->op);
    if ((mask & LM_OPND_B) && u->b == acc) return 0;
    if ((mask & LM_OPND_A) && u->a == acc && u->op != LM_S_ACC_SUM && (u->op != LM_S_STORE || u->local)) return 0;
  }
  return 1;
}

/* The loops over R and the accumulators; 0 when the kernel is not a sum over rows. */
static int analyse(pk *c) {
  lm_kernel *k = c->k;
  lm_exprs *x = c->x;
  if (k->npar != 1 || k->group || k->fixed || k->measured || k->loops[0].kind != LM_L_PARALLEL ||
      lm_x_node(x, k->loops[0].extent)->op != LM_X_CONST)
    return 0;
  c->in_r[0] = -1;
  for (size_t l = 1; l < k->nloops; l++) {
    const lm_loop *lp = &k->loops[l];
    c->in_r[l] = -1;
    if (lm_x_node(x, lp->extent)->op == LM_X_CONST) continue;
    if (lp->kind != LM_L_SERIAL || lp->when || lp->point) return 0;
    if (!c->R) c->R = lp->extent;
    if (!lm_x_prove_eq(x, lp->extent, c->R)) return 0;
    c->in_r[l] = (int32_t)l;
  }
  if (!c->R) return 0;
  for (size_t l = 1; l < k->nloops; l++) /* loops are created after their parents */
    for (int32_t p = k->loops[l].parent; p >= 0; p = k->loops[p].parent)
      if (c->in_r[p] >= 0) {
        if (c->in_r[l] == (int32_t)l) return 0; /* a loop over R inside another */
        c->in_r[l] = c->in_r[p];
        break;
      }
  /* accumulator arrays: every store to them inside a loop over R adds to what it just read */
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    int mask = lm_sop_operands(s->op);
    if (mask & LM_OPND_A) c->uses[s->a]++;
    if (mask & LM_OPND_B) c->uses[s->b]++;
    if (s->op == LM_S_ACC_MAX || s->op == LM_S_BARRIER || s->op == LM_S_WARP_SUM || s->op == LM_S_WARP_MAX) return 0;
    if (s->op == LM_S_STORE && s->local && r_of(c, s) >= 0) {
      int side = added(c, s->a, s->buf, s->idx);
      if (side < 0 || r_of(c, &k->stmts[s->a]) < 0) return 0;
      c->acc_arr[s->buf] = 1;
      c->accread[side ? k->stmts[s->a].b : k->stmts[s->a].a] = 1;
    }
  }
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    int inr = r_of(c, s) >= 0;
    if (s->op == LM_S_STORE && !s->local) { /* stores a sum, once a point */
      const lm_stmt *v = &k->stmts[s->a];
      if (inr || s->loop < 0 || c->plan->bufs[s->buf].kind != LM_BUF_TEMP) return 0;
      if (v->op == LM_S_ACC ? !acc_in_r(c, s->a) || v->f != 0.0f || !acc_users_ok(k, s->a)
                            : !(v->op == LM_S_LOAD && v->local && c->acc_arr[v->buf]))
        return 0;
    } else if (s->op == LM_S_STORE && s->local && c->acc_arr[s->buf] && !inr) { /* 0 at each point */
      const lm_stmt *v = &k->stmts[s->a];
      if (s->loop < 0 || v->op != LM_S_CONST || v->f != 0.0f) return 0;
    } else if (s->op == LM_S_LOAD && s->local && c->acc_arr[s->buf]) {
      if (inr ? c->uses[i] != 1 || !c->accread[i] : used_but_stored(k, (uint32_t)i)) return 0;
    }
  }
  return 1;
}

/* The buffers the kernel stores: written by no other kernel, read by none before it nor by
 * itself, in no copy. */
static int buffers_ok(const pk *c, size_t ki) {
  const lm_kernel *k = c->k;
  int64_t floats = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op != LM_S_STORE || s->local) continue;
    const lm_xnode *n = lm_x_node(c->x, c->plan->bufs[s->buf].numel);
    if (n->op != LM_X_CONST) return 0;
    int counted = 0;
    for (size_t j = 0; j < i && !counted; j++)
      counted = k->stmts[j].op == LM_S_STORE && !k->stmts[j].local && k->stmts[j].buf == s->buf;
    if (!counted && (floats += n->v) > MAX_FLOATS) return 0;
    for (size_t j = 0; j < k->nstmts; j++)
      if (k->stmts[j].op == LM_S_LOAD && !k->stmts[j].local && k->stmts[j].buf == s->buf) return 0;
    for (size_t o = 0; o < c->plan->nkernels; o++) {
      if (o == ki) continue;
      const lm_kernel *ok = &c->plan->kernels[o];
      if (lm_kernel_writes_buf(ok, s->buf)) return 0;
      if (o < ki)
        for (size_t j = 0; j < ok->nstmts; j++)
          if (ok->stmts[j].op == LM_S_LOAD && !ok->stmts[j].local && ok->stmts[j].buf == s->buf) return 0;
    }
    for (size_t j = 0; j < c->plan->ncopies; j++)
      if (c->plan->copies[j].src == s->buf || c->plan->copies[j].dst == s->buf) return 0;
  }
  return 1;
}

/* A statement placed just before statement `at`, in its block; UINT32_MAX when memory ran out. */
static uint32_t put_before(lm_kernel *k, lm_stmt s, uint32_t at) {
  s.loop = k->stmts[at].loop;
  if (!LM_GROW(k->stmts, k->stmtcap, k->nstmts + 1)) return UINT32_MAX;
  uint32_t id = (uint32_t)k->nstmts++;
  k->stmts[id] = s;
  lm_block *b = s.loop < 0 ? &k->root : &k->loops[s.loop].body;
  return lm_block_insert(b, lm_block_find(b, 0, at), (lm_item){0, id}) ? id : UINT32_MAX;
}

/* The kernel in halves; 0 when memory ran out. `split` marks the buffers it stores. */
static int halve(pk *c, uint8_t *split) {
  lm_kernel *k = c->k;
  lm_exprs *x = c->x;
  size_t nl = k->nloops;
  lm_expr *map = lm_calloc(nl, sizeof *map);
  if (!map) return 0;
  lm_expr E = k->loops[0].extent, q = lm_x_var(x, 0), h = lm_x_div(x, q, E);
  lm_expr H = lm_x_simplify(x, lm_x_div(x, lm_x_add(x, c->R, lm_x_const(x, PARTS - 1)), lm_x_const(x, PARTS)), NULL);
  /* the second half's rows: R - H, one fewer than H where R is odd */
  lm_expr stop = lm_x_simplify(x, lm_x_sub(x, H, lm_x_mul(x, h, lm_x_sub(x, lm_x_mul(x, H, lm_x_const(x, PARTS)), c->R))), NULL);
  map[0] = lm_x_mod(x, q, E);
  for (size_t l = 1; l < nl; l++) {
    if (c->in_r[l] != (int32_t)l) continue;
    map[l] = lm_x_add(x, lm_x_mul(x, h, H), lm_x_var(x, (int)l));
    k->loops[l].extent = H;
    k->loops[l].stop = stop;
  }
  for (size_t l = 1; l < nl; l++)
    if (k->loops[l].when) k->loops[l].when = lm_x_simplify(x, lm_x_subst(x, k->loops[l].when, map, (int)nl), NULL);
  for (size_t i = 0; i < k->nstmts; i++) {
    lm_stmt *s = &k->stmts[i];
    if (s->idx) s->idx = lm_x_simplify(x, lm_x_subst(x, s->idx, map, (int)nl), NULL);
    if (s->valid) s->valid = lm_x_simplify(x, lm_x_subst(x, s->valid, map, (int)nl), NULL);
    if (s->step) s->step = lm_x_simplify(x, lm_x_subst(x, s->step, map, (int)nl), NULL);
    if (s->op == LM_S_STORE && !s->local) {
      split[s->buf] = 1;
      s->idx = lm_x_simplify(x, lm_x_add(x, s->idx, lm_x_mul(x, h, c->plan->bufs[s->buf].numel)), NULL);
    }
  }
  k->loops[0].extent = lm_x_simplify(x, lm_x_mul(x, E, lm_x_const(x, PARTS)), NULL);
  lm_free(map);
  return 1;
}

/* Kernel k reads part 0 + part 1 where it read a split buffer; 0 when memory ran out. */
static int read_halves(lm_plan *plan, lm_kernel *k, const uint8_t *split, const lm_expr *numel) {
  lm_exprs *x = &plan->g->x;
  size_t n0 = k->nstmts;
  for (size_t i = 0; i < n0; i++) {
    lm_stmt s = k->stmts[i];
    if (s.op != LM_S_LOAD || s.local || !split[s.buf]) continue;
    uint32_t lo = put_before(k, s, (uint32_t)i);
    s.idx = lm_x_simplify(x, lm_x_add(x, s.idx, numel[s.buf]), NULL);
    uint32_t hi = lo == UINT32_MAX ? lo : put_before(k, s, (uint32_t)i);
    if (hi == UINT32_MAX) return 0;
    lm_stmt *sum = &k->stmts[i];
    *sum = (lm_stmt){.op = LM_S_ADD, .loop = sum->loop, .a = lo, .b = hi};
  }
  return 1;
}

int lm_schedule_partial(lm_plan *plan) {
  lm_exprs *x = &plan->g->x;
  if (!plan->g->contract) return 0;
  int done = 0;
  uint8_t *split = lm_calloc(plan->nbufs + 1, 1);
  lm_expr *numel = lm_calloc(plan->nbufs + 1, sizeof *numel);
  if (!split || !numel) done = -1;
  for (size_t ki = 0; ki < plan->nkernels && done >= 0; ki++) {
    lm_kernel *k = &plan->kernels[ki];
    pk c = {.plan = plan, .k = k, .x = x};
    c.in_r = lm_calloc(k->nloops + 1, sizeof *c.in_r);
    c.acc_arr = lm_calloc(k->nlocals + 1, 1);
    c.uses = lm_calloc(k->nstmts + 1, sizeof *c.uses);
    c.accread = lm_calloc(k->nstmts + 1, 1);
    int ok = c.in_r && c.acc_arr && c.uses && c.accread;
    if (!ok) done = -1;
    else if (analyse(&c) && buffers_ok(&c, ki)) {
      memset(split, 0, plan->nbufs);
      for (size_t b = 0; b < plan->nbufs; b++) numel[b] = plan->bufs[b].numel;
      if (!halve(&c, split)) done = -1;
      for (size_t o = ki + 1; o < plan->nkernels && done >= 0; o++)
        if (!read_halves(plan, &plan->kernels[o], split, numel)) done = -1;
      for (size_t b = 0; b < plan->nbufs; b++)
        if (split[b]) plan->bufs[b].numel = lm_x_simplify(x, lm_x_mul(x, numel[b], lm_x_const(x, PARTS)), NULL);
      if (done >= 0) done++;
    }
    lm_free(c.in_r);
    lm_free(c.acc_arr);
    lm_free(c.uses);
    lm_free(c.accread);
  }
  lm_free(split);
  lm_free(numel);
  return done;
}
