/* compiler/lanes.c — SIMD lanes for a fused scan (the cpu schedule). A fused scan steps one
 * env at a time:
 *   par env: carry in; for t: step(env); carry out
 * which leaves a C compiler nothing to vectorise but a single env's scalar code. This pass
 * blocks L envs into one iteration of the parallel loop and puts a loop over the L lanes
 * innermost around every straight-line run of the step:
 *   par blk: for j: for lane: l[j*L + lane] = b[...(blk*L + lane)...]
 *            for t: w = W[..];  for lane: ...step(blk*L + lane)...;  for k: for lane: ...
 * Each lane loop is a plain counted loop over contiguous lane arrays, so sin/exp/log go
 * through the vector math library and the body runs L envs per instruction. What a lane
 * loop needs from another one travels through a small per-lane array; statements that do
 * not depend on the env (weights, constants) sit outside the lane loops and are shared by
 * all lanes; accumulators become per-lane arrays updated in place. Each env computes the
 * same operations in the same order as before.
 *
 * RAND draws one word of a Philox block (four words) per element; when four consecutive envs
 * share a block (one draw per env: element = env, a random action or a sampled one), the
 * blocks are drawn once for the whole lane block, four words to a lane of a short loop before
 * the lane loop that reads them, instead of once per env: one Philox evaluation per four
 * envs, the same values (rlbench envs, 1 thread: CartPole 8.7e7 -> 1.06e8 steps/s, mountaincar
 * 9.7e7 -> 1.38e8). Two envs per block (a two-value reset) measured slower this way: the
 * short drawing loop's dependent Philox rounds no longer overlap the step's arithmetic.
 *
 * Three passes then rewrite the lane form, each giving the same bits: the step stores the new
 * carried state into the carry itself instead of copying it there at the end of the step
 * (compiler/inplace.c); a stacked state's short loop over its columns is unrolled into its lane
 * loop, where the paddings' conditions fold (compiler/columns.c); and values a lane uses only
 * where a flag is set (an auto-reset's fresh state) are computed in a sparse loop over the
 * flagged lanes (compiler/lazy.c). */
#include <stdlib.h>
#include <string.h>

#include "loopir.h"

enum { MAX_SHARED_RANDS = 16 };

/* The words of one RAND stream for the current lane block (see above). */
typedef struct srand_ {
  uint32_t stream, arr; /* the RAND's stream; the local array of L*c words */
  int64_t c;
  lm_expr step;         /* new variables */
  int32_t parent;       /* the new loop whose block holds the drawing loop */
} srand_;

typedef struct ln {
  const lm_kernel *k; /* the fused scan kernel */
  lm_kernel *n;       /* its lane form */
  const lm_plan *p;
  lm_exprs *x;
  int L;
  lm_expr E;          /* envs: the extent of the old parallel loop */
  int exact;          /* E is a multiple of L: no lane runs past the last env */
  uint8_t *varying;   /* per old statement: depends on the env */
  uint8_t *written;   /* per plan buffer: stored by the kernel */
  lm_expr *vmap;      /* old loop variable -> new expression (0 = the current lane's env) */
  uint32_t *smap;     /* old statement -> new statement (in its segment for varying ones) */
  int32_t *sseg;      /* old statement -> lane loop that computes it (-1: outside any) */
  uint32_t *spill;    /* old statement -> per-lane array + 1 holding it for other lane loops */
  uint32_t *cache;    /* old statement -> its load from the spill array in cseg */
  int32_t *cseg;
  int32_t seg;        /* the lane loop open in the current block, -1 none */
  srand_ rands[MAX_SHARED_RANDS];
  int nrands;
  uint8_t *jam;       /* per old loop: a layer's output loop, jammed (see mark_jams) */
  uint8_t *unroll;    /* per old loop: the dot product inside a jammed loop, unrolled */
  uint8_t *racc;      /* per old statement: an ACC kept as a running value (in a register) */
  int unrolling;      /* inside a jammed loop: shared statements stay in the lane loop */
  int ok;
} ln;

static int uses_env(const ln *c, lm_expr e) { return e && (lm_x_vars_used(c->x, e) & 1); }

enum { UNROLL_MAX = 64, UNROLL_STMTS = 2048, JAM = 8 };

/* A layer of a policy, per env: for j (outputs): a = 0; for k: a += w[j,k] x[k]; h[j] = f(a).
 * In lanes, `for k: for lane: a[lane] += ...` stores and reloads a[] per term. Instead, the
 * output loop is jammed by JAM (or 4, 2) and the dot product unrolled into one lane loop per
 * group of outputs, the sums running in registers, k-major:
 *   for jj: for lane: a0..a7 = 0; for k (unrolled): x = x[k][lane]; a_u += w[8jj+u, k] x;
 *           h[8jj+u][lane] = f(a_u)
 * eight independent chains per lane (a single chain of dependent additions is latency-bound).
 * Each output still sums its terms in order: the same values. A reduction loop qualifies when
 * its extent is a constant of at most UNROLL_MAX and it holds loads and arithmetic only (no
 * store, transcendental or RAND: 64 calls of exp in one lane loop do not vectorise), and
 * updates accumulators declared in the output loop; the output loop when its extent is a
 * constant multiple of the jam factor and it holds that reduction loop and statements. */
static int reduction_ok(ln *c, int32_t l) {
  const lm_kernel *k = c->k;
  const lm_loop *lp = &k->loops[l];
  const lm_xnode *e = lm_x_node(c->x, lp->extent);
  if (lp->kind != LM_L_SERIAL || e->op != LM_X_CONST || e->v < 1 || e->v > UNROLL_MAX ||
      (int64_t)lp->body.n * e->v > UNROLL_STMTS)
    return 0;
  int updates = 0;
  for (size_t i = 0; i < lp->body.n; i++) {
    lm_item it = lp->body.items[i];
    const lm_stmt *s = it.is_loop ? NULL : &k->stmts[it.id];
    if (!s || s->op == LM_S_STORE || s->op == LM_S_ACC || (s->op >= LM_S_LOG2 && s->op <= LM_S_RECIP) ||
        s->op == LM_S_RAND)
      return 0;
    if (s->op == LM_S_ACC_SUM || s->op == LM_S_ACC_MAX) {
      if (k->stmts[s->a].loop != lp->parent) return 0;
      updates++;
    }
  }
  return updates > 0;
}

static int jam_factor(ln *c, int32_t l) {
  const lm_xnode *e = lm_x_node(c->x, c->k->loops[l].extent);
  if (e->op != LM_X_CONST) return 0;
  for (int u = JAM; u >= 2; u /= 2)
    if (e->v % u == 0) return u;
  return 0;
}

static void mark_jams(ln *c) {
  const lm_kernel *k = c->k;
  for (size_t l = 1; l < k->nloops; l++) {
    const lm_loop *lp = &k->loops[l];
    if (lp->kind != LM_L_SERIAL || !jam_factor(c, (int32_t)l)) continue;
    int32_t red = -1;
    int ok = 1;
    for (size_t i = 0; i < lp->body.n && ok; i++) {
      lm_item it = lp->body.items[i];
      if (!it.is_loop) continue;
      if (red >= 0 || !reduction_ok(c, (int32_t)it.id)) ok = 0;
      red = (int32_t)it.id;
    }
    if (!ok || red < 0) continue;
    c->jam[l] = 1;
    c->unroll[red] = 1;
  }
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if ((s->op == LM_S_ACC_SUM || s->op == LM_S_ACC_MAX) && s->loop >= 0 && c->unroll[s->loop]) c->racc[s->a] = 1;
  }
  for (size_t i = 0; i < k->nstmts; i++) { /* every update of a running accumulator is unrolled */
    const lm_stmt *s = &k->stmts[i];
    if ((s->op == LM_S_ACC_SUM || s->op == LM_S_ACC_MAX) && (s->loop < 0 || !c->unroll[s->loop])) c->racc[s->a] = 0;
  }
}

static void classify(ln *c) {
  const lm_kernel *k = c->k;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op == LM_S_STORE && !s->local) c->written[s->buf] = 1;
  }
  for (int changed = 1; changed;) {
    changed = 0;
    for (size_t i = 0; i < k->nstmts; i++) {
      const lm_stmt *s = &k->stmts[i];
      if (c->varying[i]) continue;
      int v = 0;
      switch (s->op) {
      case LM_S_CONST: break;
      case LM_S_STORE:
      case LM_S_ACC:
      case LM_S_ACC_SUM:
      case LM_S_ACC_MAX: v = 1; break;
      case LM_S_LOAD: v = s->local || c->written[s->buf] || uses_env(c, s->idx) || uses_env(c, s->valid); break;
      case LM_S_RAND: v = uses_env(c, s->idx) || uses_env(c, s->step); break;
      default: {
        int m = lm_sop_operands(s->op);
        v = (s->op == LM_S_SELECT && uses_env(c, s->valid)) || ((m & 1) && c->varying[s->a]) ||
            ((m & 2) && c->varying[s->b]);
      }
      }
      if (v) c->varying[i] = 1, changed = 1;
    }
  }
}

static uint32_t add(ln *c, lm_stmt s, int32_t before_loop) {
  uint32_t id = lm_kernel_add_stmt(c->n, &s, before_loop);
  if (id == UINT32_MAX) c->ok = 0;
  return id == UINT32_MAX ? 0 : id;
}

static lm_expr remap(ln *c, lm_expr e) {
  return e ? lm_x_simplify(c->x, lm_x_subst(c->x, e, c->vmap, (int)c->k->nloops), NULL) : 0;
}

static uint32_t new_local(ln *c, int64_t n) {
  if (!LM_GROW(c->n->locals, c->n->localcap, c->n->nlocals + 1)) {
    c->ok = 0;
    return 0;
  }
  c->n->locals[c->n->nlocals] = n;
  return (uint32_t)c->n->nlocals++;
}

/* Opens a lane loop in the block of `parent` when none is open there. */
static void open_seg(ln *c, int32_t parent) {
  if (c->seg >= 0) return;
  c->seg = lm_kernel_add_loop(c->n, parent, lm_x_const(c->x, c->L), LM_L_LANES);
  if (c->seg < 0) {
    c->ok = 0;
    c->seg = -1;
  }
}

/* The env of the current lane: blk*L + lane. */
static lm_expr lane_env(ln *c) {
  lm_exprs *x = c->x;
  return lm_x_add(x, lm_x_mul(x, lm_x_var(x, 0), lm_x_const(x, c->L)), lm_x_var(x, c->seg));
}

/* When E is not a multiple of L the last block's extra lanes compute on zeros and neither
 * read nor write memory: every buffer access that names the env is guarded by env < E. */
static lm_expr lane_guard(ln *c, lm_expr valid, lm_expr idx) {
  if (c->exact || !uses_env(c, idx)) return valid;
  lm_exprs *x = c->x;
  lm_expr in = lm_x_lt(x, lm_x_var(x, 0), c->E); /* in the old variables: remapped with idx */
  return valid ? lm_x_and(x, valid, in) : in;
}

/* The value of old statement o for a statement in the current lane loop. */
static uint32_t value(ln *c, uint32_t o) {
  const lm_stmt *d = &c->k->stmts[o];
  lm_exprs *x = c->x;
  lm_expr lane = lm_x_var(x, c->seg), one = lm_x_const(x, 1);
  if (!c->varying[o]) return c->smap[o];
  if (d->op == LM_S_ACC && !c->racc[o]) { /* the accumulator's current value */
    lm_stmt ld = {.op = LM_S_LOAD, .loop = c->seg, .buf = c->spill[o] - 1, .local = 1, .idx = lane, .valid = one};
    return add(c, ld, -1);
  }
  if (c->sseg[o] == c->seg) return c->smap[o];
  if (c->cseg[o] == c->seg) return c->cache[o];
  if (!c->spill[o]) { /* store it where it is computed, for every later lane loop */
    c->spill[o] = new_local(c, c->L) + 1;
    lm_stmt st = {.op = LM_S_STORE, .loop = c->sseg[o], .buf = c->spill[o] - 1, .local = 1,
                  .idx = lm_x_var(x, c->sseg[o]), .a = c->smap[o], .valid = one};
    add(c, st, -1);
  }
  lm_stmt ld = {.op = LM_S_LOAD, .loop = c->seg, .buf = c->spill[o] - 1, .local = 1, .idx = lane, .valid = one};
  c->cseg[o] = c->seg;
  return c->cache[o] = add(c, ld, -1);
}

/* RAND element = env (one draw per env) with L a multiple of 4? Then *cm = 1, *r = 0: the
 * drawing code below handles element = env*cm + r for any cm dividing 4, but sharing a block
 * between two envs measured slower (see above). */
static int shared_group(ln *c, const lm_stmt *s, int64_t *cm, int64_t *r) {
  lm_exprs *x = c->x;
  if (lm_x_vars_used(x, s->idx) != 1 || c->L % 4) return 0; /* the env alone */
  lm_expr d = lm_x_simplify(x, lm_x_sub(x, s->idx, lm_x_var(x, 0)), NULL);
  if (!d || !lm_x_is_const(x, d, 0)) return 0;
  *cm = 1;
  *r = 0;
  return 1;
}

/* The local array holding this block's words of the RAND stream, drawn (once per parent
 * block) by a lane loop placed before the open lane loop. */
static uint32_t shared_words(ln *c, const lm_stmt *s, int64_t cm, int32_t parent) {
  lm_exprs *x = c->x;
  lm_expr step = s->step ? remap(c, s->step) : 0;
  for (int i = 0; i < c->nrands; i++) {
    srand_ *q = &c->rands[i];
    if (q->stream == s->stream && q->c == cm && q->step == step && q->parent == parent) return q->arr;
  }
  if (c->nrands == MAX_SHARED_RANDS) return UINT32_MAX;
  uint32_t arr = new_local(c, c->L * cm);
  int64_t groups = c->L * cm / 4;
  int32_t g = lm_kernel_add_loop_before(c->n, parent, c->seg, lm_x_const(x, groups), LM_L_LANES);
  if (g < 0 || !c->ok) {
    c->ok = 0;
    return UINT32_MAX;
  }
  /* element blk*L*cm + 4g + w: Philox block blk*L*cm/4 + g, word w */
  lm_expr base = lm_x_add(x, lm_x_mul(x, lm_x_var(x, 0), lm_x_const(x, groups)), lm_x_var(x, g));
  for (int64_t w = 0; w < 4; w++) {
    lm_stmt rs = {.op = LM_S_RAND, .loop = g, .stream = s->stream, .step = step,
                  .idx = lm_x_simplify(x, lm_x_add(x, lm_x_mul(x, base, lm_x_const(x, 4)), lm_x_const(x, w)), NULL)};
    uint32_t v = add(c, rs, -1);
    lm_stmt st = {.op = LM_S_STORE, .loop = g, .buf = arr, .local = 1, .a = v, .valid = lm_x_const(x, 1),
                  .idx = lm_x_simplify(x, lm_x_add(x, lm_x_mul(x, lm_x_var(x, g), lm_x_const(x, 4)), lm_x_const(x, w)), NULL)};
    add(c, st, -1);
  }
  c->rands[c->nrands++] = (srand_){s->stream, arr, cm, step, parent};
  return arr;
}

static void copy_stmt(ln *c, uint32_t old, int32_t parent) {
  lm_stmt s = c->k->stmts[old];
  lm_exprs *x = c->x;
  if (!c->varying[old] && !c->unrolling) { /* shared by the lanes: before the open lane loop */
    int m = lm_sop_operands(s.op);
    s.loop = parent;
    if (m & 1) s.a = c->smap[s.a];
    if (m & 2) s.b = c->smap[s.b];
    s.idx = remap(c, s.idx);
    s.valid = remap(c, s.valid);
    s.step = remap(c, s.step);
    if (s.op == LM_S_LOAD && !lm_kernel_use_buf(c->n, s.buf)) c->ok = 0;
    c->smap[old] = add(c, s, c->seg);
    c->sseg[old] = -1;
    return;
  }
  open_seg(c, parent);
  if (!c->ok) return;
  lm_expr lane = lm_x_var(x, c->seg), one = lm_x_const(x, 1);
  c->vmap[0] = lane_env(c);
  c->sseg[old] = c->seg;
  if (s.op == LM_S_ACC && c->racc[old]) { /* a running value: its initial one */
    lm_stmt cst = {.op = LM_S_CONST, .loop = c->seg, .f = s.f};
    c->smap[old] = add(c, cst, -1);
    return;
  }
  if ((s.op == LM_S_ACC_SUM || s.op == LM_S_ACC_MAX) && c->racc[s.a]) { /* a' = a (+|max) v */
    uint32_t v = value(c, s.b), cur = value(c, s.a);
    lm_stmt op = {.op = s.op == LM_S_ACC_SUM ? LM_S_ADD : LM_S_MAX, .loop = c->seg, .a = cur, .b = v};
    c->smap[s.a] = add(c, op, -1); /* the accumulator's value from here on */
    c->sseg[s.a] = c->seg;
    c->spill[s.a] = 0, c->cseg[s.a] = -2; /* an older spill would hold an older value */
    c->smap[old] = c->smap[s.a];
    return;
  }
  if (s.op == LM_S_ACC) { /* a per-lane accumulator array */
    c->spill[old] = new_local(c, c->L) + 1;
    lm_stmt cst = {.op = LM_S_CONST, .loop = c->seg, .f = s.f};
    lm_stmt st = {.op = LM_S_STORE, .loop = c->seg, .buf = c->spill[old] - 1, .local = 1, .idx = lane,
                  .a = add(c, cst, -1), .valid = one};
    c->smap[old] = add(c, st, -1);
    return;
  }
  if (s.op == LM_S_ACC_SUM || s.op == LM_S_ACC_MAX) { /* acc[lane] = acc[lane] (+|max) v */
    uint32_t v = value(c, s.b), cur = value(c, s.a);
    lm_stmt op = {.op = s.op == LM_S_ACC_SUM ? LM_S_ADD : LM_S_MAX, .loop = c->seg, .a = cur, .b = v};
    lm_stmt st = {.op = LM_S_STORE, .loop = c->seg, .buf = c->spill[s.a] - 1, .local = 1, .idx = lane,
                  .a = add(c, op, -1), .valid = one};
    c->smap[old] = add(c, st, -1);
    return;
  }
  int64_t cm, r;
  if (s.op == LM_S_RAND && shared_group(c, &s, &cm, &r)) {
    uint32_t arr = shared_words(c, &s, cm, parent);
    if (arr != UINT32_MAX) {
      lm_expr at = lm_x_add(x, lm_x_mul(x, lane, lm_x_const(x, cm)), lm_x_const(x, r));
      lm_stmt ld = {.op = LM_S_LOAD, .loop = c->seg, .buf = arr, .local = 1, .idx = lm_x_simplify(x, at, NULL),
                    .valid = one};
      c->smap[old] = add(c, ld, -1);
      return;
    }
  }
  int m = lm_sop_operands(s.op);
  if (m & 1) s.a = value(c, s.a);
  if (m & 2) s.b = value(c, s.b);
  s.loop = c->seg;
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && !s.local) s.valid = lane_guard(c, s.valid, s.idx);
  s.valid = remap(c, s.valid);
  s.step = remap(c, s.step);
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && s.local) /* a per-env array: lane-minor */
    s.idx = lm_x_simplify(x, lm_x_add(x, lm_x_mul(x, remap(c, s.idx), lm_x_const(x, c->L)), lane), NULL);
  else s.idx = remap(c, s.idx);
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && !s.local && !lm_kernel_use_buf(c->n, s.buf)) c->ok = 0;
  c->smap[old] = add(c, s, -1);
}

/* Per jammed output u: the mappings of the output loop's statements. */
typedef struct jamst {
  uint32_t *ids;      /* the loop's statements (its block and its reduction's) */
  size_t n;
  uint32_t *smap;     /* [JAM][n] */
  int32_t *sseg;
} jamst;

static void jam_load(ln *c, jamst *j, int u) {
  for (size_t i = 0; i < j->n; i++) c->smap[j->ids[i]] = j->smap[u * j->n + i], c->sseg[j->ids[i]] = j->sseg[u * j->n + i];
}

static void jam_save(ln *c, jamst *j, int u) {
  for (size_t i = 0; i < j->n; i++) j->smap[u * j->n + i] = c->smap[j->ids[i]], j->sseg[u * j->n + i] = c->sseg[j->ids[i]];
}

/* Output loop J jammed by U into one lane loop per group (see mark_jams). */
static void jam_loop(ln *c, int32_t J, int32_t parent) {
  const lm_kernel *k = c->k;
  lm_exprs *x = c->x;
  const lm_loop *jl = &k->loops[J];
  int U = jam_factor(c, J);
  int64_t ext = lm_x_node(x, jl->extent)->v;
  int32_t R = -1;
  size_t at = 0;
  for (size_t i = 0; i < jl->body.n; i++)
    if (jl->body.items[i].is_loop) R = (int32_t)jl->body.items[i].id, at = i;
  const lm_block *rb = &k->loops[R].body;
  int64_t K = lm_x_node(x, k->loops[R].extent)->v;
  jamst js = {0};
  js.n = jl->body.n - 1 + rb->n;
  js.ids = lm_calloc(js.n + 1, sizeof *js.ids);
  js.smap = lm_calloc((size_t)U * js.n + 1, sizeof *js.smap);
  js.sseg = lm_calloc((size_t)U * js.n + 1, sizeof *js.sseg);
  int32_t jj = js.ids && js.smap && js.sseg ? lm_kernel_add_loop(c->n, parent, lm_x_const(x, ext / U), LM_L_SERIAL) : -1;
  if (jj < 0) {
    c->ok = 0;
    goto out;
  }
  size_t n = 0;
  for (size_t i = 0; i < jl->body.n; i++)
    if (!jl->body.items[i].is_loop) js.ids[n++] = jl->body.items[i].id;
  for (size_t i = 0; i < rb->n; i++) js.ids[n++] = rb->items[i].id;
  for (int u = 0; u < U; u++) jam_save(c, &js, u);
  c->seg = -1;
  c->unrolling = 1;
  lm_expr base = lm_x_mul(x, lm_x_var(x, jj), lm_x_const(x, U));
  /* the statements before the reduction, per output; then the terms, k-major; then the rest */
  for (int phase = 0; phase < 3 && c->ok; phase++) {
    int64_t terms = phase == 1 ? K : 1;
    for (int64_t kk = 0; kk < terms && c->ok; kk++)
      for (int u = 0; u < U && c->ok; u++) {
        jam_load(c, &js, u);
        c->vmap[J] = lm_x_add(x, base, lm_x_const(x, u));
        if (phase == 1) {
          c->vmap[R] = lm_x_const(x, kk);
          for (size_t i = 0; i < rb->n && c->ok; i++) copy_stmt(c, rb->items[i].id, jj);
        } else
          for (size_t i = phase ? at + 1 : 0; i < (phase ? jl->body.n : at) && c->ok; i++)
            copy_stmt(c, jl->body.items[i].id, jj);
        jam_save(c, &js, u);
      }
  }
  c->unrolling = 0;
  c->seg = -1;
out:
  lm_free(js.ids);
  lm_free(js.smap);
  lm_free(js.sseg);
}

static void walk(ln *c, const lm_block *b, int32_t parent) {
  for (size_t i = 0; i < b->n && c->ok; i++) {
    lm_item it = b->items[i];
    if (!it.is_loop) {
      copy_stmt(c, it.id, parent);
      continue;
    }
    const lm_loop *l = &c->k->loops[it.id];
    if (c->jam[it.id]) {
      jam_loop(c, (int32_t)it.id, parent);
      continue;
    }
    c->seg = -1;
    int32_t nl = lm_kernel_add_loop(c->n, parent, remap(c, l->extent), (lm_loopkind)l->kind);
    if (nl < 0) {
      c->ok = 0;
      return;
    }
    c->vmap[it.id] = lm_x_var(c->x, nl);
    walk(c, &l->body, nl);
    c->seg = -1;
  }
}

/* The fused scan kernel of `p` in lane form; 0 when it does not apply (left unchanged). */
static int lanes_kernel(lm_plan *p, size_t ki, int L) {
  const lm_kernel *k = &p->kernels[ki];
  lm_exprs *x = &p->g->x;
  if (k->npar != 1 || k->root.n != 1 || !k->root.items[0].is_loop || k->root.items[0].id != 0) return 0;
  ln c = {.k = k, .p = p, .x = x, .L = L, .E = k->loops[0].extent, .seg = -1, .ok = 1};
  size_t ns = k->nstmts + 1;
  c.varying = lm_calloc(ns, 1);
  c.written = lm_calloc(p->nbufs + 1, 1);
  c.vmap = lm_calloc(k->nloops + 1, sizeof *c.vmap);
  c.smap = lm_calloc(ns, sizeof *c.smap);
  c.sseg = lm_calloc(ns, sizeof *c.sseg);
  c.spill = lm_calloc(ns, sizeof *c.spill);
  c.cache = lm_calloc(ns, sizeof *c.cache);
  c.cseg = lm_calloc(ns, sizeof *c.cseg);
  c.jam = lm_calloc(k->nloops + 1, 1);
  c.unroll = lm_calloc(k->nloops + 1, 1);
  c.racc = lm_calloc(ns, 1);
  lm_kernel *n = lm_calloc(1, sizeof *n);
  int done = 0;
  if (!c.varying || !c.written || !c.vmap || !c.smap || !c.sseg || !c.spill || !c.cache || !c.cseg || !c.jam || !c.unroll || !c.racc || !n) goto out;
  c.n = n;
  for (size_t i = 0; i < ns; i++) c.cseg[i] = c.sseg[i] = -2;
  classify(&c);
  mark_jams(&c);
  memcpy(n->name, k->name, sizeof n->name);
  n->anchor = k->anchor;
  n->npar = 1;
  for (size_t i = 0; i < k->nlocals; i++) new_local(&c, k->locals[i] * L);
  lm_expr Lx = lm_x_const(x, L);
  c.exact = lm_x_prove_eq(x, lm_x_mul(x, lm_x_div(x, c.E, Lx), Lx), c.E);
  lm_expr blocks = lm_x_simplify(x, lm_x_div(x, lm_x_add(x, c.E, lm_x_const(x, L - 1)), Lx), NULL);
  if (lm_kernel_add_loop(n, -1, blocks, LM_L_PARALLEL) != 0) goto out;
  walk(&c, &k->loops[0].body, 0);
  /* in place, columns and lazy draws follow as passes of their own (compiler/compile.c) */
  if (!c.ok || x->failed) goto out;
  /* swap the kernel in */
  lm_kernel old = p->kernels[ki];
  p->kernels[ki] = *n;
  *n = old; /* freed below */
  done = 1;
out:
  if (n) {
    lm_kernel_free(n);
    lm_free(n);
  }
  lm_free(c.varying);
  lm_free(c.written);
  lm_free(c.vmap);
  lm_free(c.smap);
  lm_free(c.sseg);
  lm_free(c.spill);
  lm_free(c.cache);
  lm_free(c.cseg);
  lm_free(c.jam);
  lm_free(c.unroll);
  lm_free(c.racc);
  return done;
}

int lm_scan_lanes(lm_plan *p, int lanes) {
  if (lanes < 2) return 0;
  int changed = 0;
  for (size_t i = 0; i < p->nkernels; i++) changed += lanes_kernel(p, i, lanes);
  if (changed) lm_plan_liveness(p);
  return changed;
}
