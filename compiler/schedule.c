/* compiler/schedule.c — default-schedule rewrites applied after lowering. Reduction
 * interchange: a kernel whose innermost parallel loop p holds sum reductions
 *   par p: acc = 0; for k: acc += f(p, k); tail(acc); store
 * becomes
 *   a[p] = 0 for all p; for k: for p: a[p] += f(p, k); for p: tail(a[p]); store
 * when every load inside the reduction is contiguous or invariant in p, so the inner p loop
 * vectorises (a matmul in i-k-j order). Each element is still summed in the same k order, so
 * results are bitwise identical to the default schedule. */
#include <string.h>

#include "loopir.h"

enum { MAX_EXTENT = 4096 };

typedef struct ic {
  const lm_kernel *k;
  lm_kernel *n;
  lm_exprs *x;
  int32_t p;        /* the loop being moved inward */
  int64_t extent;
  lm_expr *vmap;    /* old loop -> new variable */
  uint32_t *smap;   /* old statement -> new statement */
  uint32_t *acc;    /* old ACC statement -> local array + 1 (0: not an accumulator of p) */
  int ok;
} ic;

/* idx(p+1) - idx(p): 0 (invariant), 1 (contiguous) or something else. */
static int stride_ok(lm_exprs *x, lm_expr idx, int32_t p, const lm_xctx *ctx) {
  lm_expr map[64] = {0};
  if (p >= 64) return 0;
  map[p] = lm_x_add(x, lm_x_var(x, p), lm_x_const(x, 1));
  lm_expr d = lm_x_simplify(x, lm_x_sub(x, lm_x_subst(x, idx, map, p + 1), idx), ctx);
  return d && (lm_x_is_const(x, d, 0) || lm_x_is_const(x, d, 1));
}

/* Every load in the block (recursively) is invariant or contiguous in p, and the block
 * reads no statement of p's own block except as the accumulator of an update. */
static int body_ok(const lm_kernel *k, lm_exprs *x, const lm_block *b, int32_t p, const lm_xctx *ctx) {
  for (size_t i = 0; i < b->n; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      if (!body_ok(k, x, &k->loops[it.id].body, p, ctx)) return 0;
      continue;
    }
    const lm_stmt *s = &k->stmts[it.id];
    if (s->op == LM_S_LOAD && (s->local || !stride_ok(x, s->idx, p, ctx))) return 0;
    if (s->op == LM_S_STORE || s->op == LM_S_ACC_MAX || s->op == LM_S_RAND) return 0;
    /* operands defined in p's block (not inside a loop of it) may only be accumulators */
    uint32_t ops[2] = {s->a, s->b};
    int nops = s->op == LM_S_SELECT || (s->op >= LM_S_LOG2 && s->op <= LM_S_RECIP) ? 1
               : (s->op >= LM_S_ADD && s->op <= LM_S_LT) || s->op == LM_S_ACC_SUM ? 2 : 0;
    for (int j = 0; j < nops; j++) {
      const lm_stmt *o = &k->stmts[ops[j]];
      if (o->loop == p && !(s->op == LM_S_ACC_SUM && j == 0 && o->op == LM_S_ACC)) return 0;
    }
  }
  return 1;
}

/* Can loop p (the innermost parallel loop) move inside its reductions? */
static int eligible(const lm_kernel *k, lm_exprs *x, int32_t p, int64_t *extent) {
  const lm_xnode *e = lm_x_node(x, k->loops[p].extent);
  if (e->op != LM_X_CONST || e->v < 2 || e->v > MAX_EXTENT) return 0;
  *extent = e->v;
  lm_expr ext[64];
  if (k->nloops > 64) return 0;
  for (size_t i = 0; i < k->nloops; i++) ext[i] = k->loops[i].extent;
  lm_xctx ctx = {ext, (int)k->nloops};
  const lm_block *b = &k->loops[p].body;
  int loops = 0, tail = 0;
  for (size_t i = 0; i < b->n; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      if (tail || k->loops[it.id].kind != LM_L_SERIAL || !body_ok(k, x, &k->loops[it.id].body, p, &ctx)) return 0;
      loops++;
      continue;
    }
    const lm_stmt *s = &k->stmts[it.id];
    if (s->op == LM_S_ACC) {
      if (tail || s->f != 0.0f) return 0; /* sums only */
      continue;
    }
    if (s->op == LM_S_RAND || s->op == LM_S_STORE) {
      if (!loops) return 0;
    }
    if (loops) tail = 1; /* statements before the reductions (read only after them) join the tail */
  }
  return loops > 0;
}

static uint32_t add(ic *c, lm_stmt s) {
  uint32_t id = lm_kernel_add_stmt(c->n, &s, -1);
  if (id == UINT32_MAX) c->ok = 0;
  return id == UINT32_MAX ? 0 : id;
}

static lm_expr remap(ic *c, lm_expr e) { return e ? lm_x_simplify(c->x, lm_x_subst(c->x, e, c->vmap, (int)c->k->nloops), NULL) : 0; }

/* The value of an old statement as seen at new variable pv: accumulators read their array. */
static uint32_t value(ic *c, uint32_t old, lm_expr pv, int32_t loop) {
  if (!c->acc[old]) return c->smap[old];
  lm_stmt ld = {.op = LM_S_LOAD, .loop = loop, .buf = c->acc[old] - 1, .local = 1, .idx = pv,
                .valid = lm_x_const(c->x, 1)};
  return add(c, ld);
}

static void copy_block(ic *c, const lm_block *b, int32_t target, lm_expr pv);

static void copy_stmt(ic *c, uint32_t old, int32_t target, lm_expr pv) {
  lm_stmt s = c->k->stmts[old];
  s.loop = target;
  if (s.op == LM_S_ACC_SUM && c->acc[s.a]) { /* a[p] += v */
    lm_stmt ld = {.op = LM_S_LOAD, .loop = target, .buf = c->acc[s.a] - 1, .local = 1, .idx = pv,
                  .valid = lm_x_const(c->x, 1)};
    uint32_t cur = add(c, ld);
    lm_stmt sum = {.op = LM_S_ADD, .loop = target, .a = cur, .b = c->smap[s.b]};
    uint32_t nv = add(c, sum);
    lm_stmt st = {.op = LM_S_STORE, .loop = target, .buf = ld.buf, .local = 1, .idx = pv, .a = nv, .valid = ld.valid};
    c->smap[old] = add(c, st);
    return;
  }
  int unary = s.op == LM_S_SELECT || s.op == LM_S_STORE || (s.op >= LM_S_LOG2 && s.op <= LM_S_RECIP);
  int binary = (s.op >= LM_S_ADD && s.op <= LM_S_LT) || s.op == LM_S_ACC_SUM || s.op == LM_S_ACC_MAX;
  if (unary || binary) s.a = value(c, s.a, pv, target);
  if (binary) s.b = value(c, s.b, pv, target);
  s.idx = remap(c, s.idx);
  s.valid = remap(c, s.valid);
  s.step = remap(c, s.step);
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && !s.local && !lm_kernel_use_buf(c->n, s.buf)) c->ok = 0;
  c->smap[old] = add(c, s);
}

static int32_t new_loop(ic *c, int32_t parent, lm_expr extent, lm_loopkind kind) {
  int32_t l = lm_kernel_add_loop(c->n, parent, extent, kind);
  if (l < 0) c->ok = 0;
  return l;
}

/* The moved loop p, rebuilt inside the block of its parent. */
static void rebuild_p(ic *c, int32_t target) {
  const lm_kernel *k = c->k;
  const lm_loop *lp = &k->loops[c->p];
  lm_exprs *x = c->x;
  /* arrays for the accumulators, zeroed */
  int32_t init = new_loop(c, target, lp->extent, LM_L_SERIAL);
  if (init < 0) return;
  lm_expr iv = lm_x_var(x, init);
  for (size_t i = 0; i < lp->body.n; i++) {
    lm_item it = lp->body.items[i];
    if (it.is_loop || k->stmts[it.id].op != LM_S_ACC) continue;
    if (!LM_GROW(c->n->locals, c->n->localcap, c->n->nlocals + 1)) {
      c->ok = 0;
      return;
    }
    c->acc[it.id] = (uint32_t)c->n->nlocals + 1;
    c->n->locals[c->n->nlocals++] = c->extent;
    lm_stmt zero = {.op = LM_S_CONST, .loop = init, .f = 0.0f};
    uint32_t z = add(c, zero);
    lm_stmt st = {.op = LM_S_STORE, .loop = init, .buf = c->acc[it.id] - 1, .local = 1, .idx = iv, .a = z,
                  .valid = lm_x_const(x, 1)};
    add(c, st);
  }
  for (size_t i = 0; i < lp->body.n && c->ok; i++) {
    lm_item it = lp->body.items[i];
    if (it.is_loop) { /* for k: for p: body */
      const lm_loop *r = &k->loops[it.id];
      int32_t rl = new_loop(c, target, r->extent, LM_L_SERIAL);
      if (rl < 0) return;
      c->vmap[it.id] = lm_x_var(x, rl);
      int32_t pl = new_loop(c, rl, lp->extent, LM_L_SERIAL);
      if (pl < 0) return;
      c->vmap[c->p] = lm_x_var(x, pl);
      copy_block(c, &r->body, pl, c->vmap[c->p]);
    }
  }
  /* then everything else of p's block, in order, over p once more */
  int32_t tail = -1;
  for (size_t i = 0; i < lp->body.n && c->ok; i++) {
    lm_item it = lp->body.items[i];
    if (it.is_loop || k->stmts[it.id].op == LM_S_ACC) continue;
    if (tail < 0) {
      if ((tail = new_loop(c, target, lp->extent, LM_L_SERIAL)) < 0) return;
      c->vmap[c->p] = lm_x_var(x, tail);
    }
    copy_stmt(c, it.id, tail, c->vmap[c->p]);
  }
}

static void copy_block(ic *c, const lm_block *b, int32_t target, lm_expr pv) {
  const lm_kernel *k = c->k;
  for (size_t i = 0; i < b->n && c->ok; i++) {
    lm_item it = b->items[i];
    if (!it.is_loop) {
      copy_stmt(c, it.id, target, pv);
      continue;
    }
    if ((int32_t)it.id == c->p) {
      rebuild_p(c, target);
      continue;
    }
    const lm_loop *l = &k->loops[it.id];
    int32_t nl = new_loop(c, target, l->extent, (lm_loopkind)l->kind);
    if (nl < 0) return;
    c->vmap[it.id] = lm_x_var(c->x, nl);
    copy_block(c, &l->body, nl, pv);
  }
}

/* Rebuilds kernel k into n with its innermost parallel loop moved inside its reductions. */
static int interchange(const lm_plan *plan, const lm_kernel *k, lm_kernel *n) {
  lm_exprs *x = &plan->g->x;
  int32_t p = k->npar - 1;
  int64_t extent;
  memset(n, 0, sizeof *n);
  if (k->npar < 2 || !eligible(k, x, p, &extent)) return 0;
  ic c = {.k = k, .n = n, .x = x, .p = p, .extent = extent, .ok = 1};
  c.vmap = lm_calloc(k->nloops + 1, sizeof *c.vmap);
  c.smap = lm_calloc(k->nstmts + 1, sizeof *c.smap);
  c.acc = lm_calloc(k->nstmts + 1, sizeof *c.acc);
  memcpy(n->name, k->name, sizeof n->name);
  n->anchor = k->anchor;
  n->npar = k->npar - 1;
  if (c.vmap && c.smap && c.acc) copy_block(&c, &k->root, -1, 0);
  else c.ok = 0;
  lm_free(c.vmap);
  lm_free(c.smap);
  lm_free(c.acc);
  return c.ok && !x->failed;
}

static void kernel_release(lm_kernel *k) {
  for (size_t i = 0; i < k->nloops; i++) lm_free(k->loops[i].body.items);
  lm_free(k->loops);
  lm_free(k->stmts);
  lm_free(k->root.items);
  lm_free(k->bufs);
  lm_free(k->locals);
}

int lm_schedule_interchange(lm_plan *plan) {
  int changed = 0;
  for (size_t i = 0; i < plan->nkernels; i++) {
    lm_kernel n;
    if (interchange(plan, &plan->kernels[i], &n)) {
      kernel_release(&plan->kernels[i]);
      plan->kernels[i] = n;
      changed++;
    } else if (n.loops || n.stmts) kernel_release(&n);
  }
  return changed;
}
