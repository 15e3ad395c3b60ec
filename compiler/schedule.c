/* compiler/schedule.c — default-schedule rewrites applied after lowering. Reduction
 * interchange: a kernel whose innermost parallel loop p holds sum reductions
 *   par p: acc = 0; for k: acc += f(p, k); tail(acc); store
 * becomes
 *   a[p] = 0 for all p; for k: for p: a[p] += f(p, k); for p: tail(a[p]); store
 * when every load inside the reduction is contiguous or invariant in p, so the inner p loop
 * vectorises (a matmul in i-k-j order). Each element is still summed in the same k order, so
 * results are bitwise identical to the default schedule.
 * With staging (the C dialect: a kernel call runs a whole chunk of the domain), a read-only
 * operand that is strided in p and indexed by p and k alone (a weight matrix read by rows in
 * a backward matmul) is first copied, once per call, into a local array laid out [k][p]:
 *   for k: for p: w'[k*P + p] = w[idx(p, k)];   ...   for k: for p: a[p] += w'[k*P + p] * ...
 * so the interchange applies to it too.
 * A reduction over several axes is nested sums (acc0 += (acc1 = sum_b (acc2 = sum_y f))); the
 * moved p loop is then interchanged again, inward through each level, every level keeping an
 * array of accumulators, until p is innermost: for x: for b: for y: for p: a2[p] += f(p, ...)
 * (a convolution's weight gradient), still in the same order for every element. */
#include <string.h>

#include "loopir.h"
#include "memplan.h"

enum { MAX_EXTENT = 4096, MAX_MERGED_BUFS = 24, MAX_STAGED = 8, MAX_STAGED_FLOATS = 262144 };

/* Loads of one kernel to stage (see above). */
typedef struct staging {
  int allow;                   /* 0: no staging (GPU dialects: the root block runs per thread) */
  const lm_kernel *k;
  int n;
  uint32_t load[MAX_STAGED];   /* old statement */
  int32_t loop[MAX_STAGED];    /* the reduction loop k that holds it */
  int64_t floats;
} staging;

typedef struct ic {
  const lm_kernel *k;
  const staging *stg;
  uint32_t *staged;  /* old LOAD statement -> staged local array + 1 (0: not staged) */
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

/* Can this strided load be staged: read-only, directly in a reduction loop r of p's block,
 * indexed by p and r alone, constant extents, small enough for the stack (MAX_STAGED_FLOATS
 * with the kernel's other local arrays: 1 MiB, a [1600, 128] dense layer read by columns)? */
static int stage_load(staging *sg, lm_exprs *x, const lm_stmt *s, int32_t p) {
  const lm_kernel *k = sg->k;
  if (!sg->allow || s->local || sg->n == MAX_STAGED || s->loop < 0 || k->loops[s->loop].parent != p) return 0;
  uint64_t allowed = ((uint64_t)1 << p) | ((uint64_t)1 << s->loop);
  if (p >= 64 || s->loop >= 64 || (lm_x_vars_used(x, s->idx) & ~allowed) ||
      (s->valid && (lm_x_vars_used(x, s->valid) & ~allowed)))
    return 0;
  const lm_xnode *ep = lm_x_node(x, k->loops[p].extent), *er = lm_x_node(x, k->loops[s->loop].extent);
  if (ep->op != LM_X_CONST || er->op != LM_X_CONST || lm_kernel_writes_buf(k, s->buf)) return 0;
  int64_t floats = ep->v * er->v;
  if (sg->floats + floats > MAX_STAGED_FLOATS) return 0;
  sg->floats += floats;
  sg->load[sg->n] = (uint32_t)(s - k->stmts);
  sg->loop[sg->n++] = s->loop;
  return 1;
}

/* Every load in the block (recursively) is invariant or contiguous in p (or staged), and the
 * block reads no statement of p's own block except as the accumulator of an update. */
static int body_ok(const lm_kernel *k, lm_exprs *x, const lm_block *b, int32_t p, const lm_xctx *ctx, staging *sg) {
  for (size_t i = 0; i < b->n; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      if (!body_ok(k, x, &k->loops[it.id].body, p, ctx, sg)) return 0;
      continue;
    }
    const lm_stmt *s = &k->stmts[it.id];
    if (s->op == LM_S_LOAD && (s->local || !stride_ok(x, s->idx, p, ctx)) && !stage_load(sg, x, s, p)) return 0;
    if (s->op == LM_S_STORE || s->op == LM_S_ACC_MAX || s->op == LM_S_RAND) return 0;
    /* operands defined in p's block (not inside a loop of it) may only be accumulators */
    uint32_t ops[2] = {s->a, s->b};
    int nops = s->op == LM_S_SELECT || (s->op >= LM_S_LOG2 && s->op <= LM_S_RECIP) ? 1
               : (s->op >= LM_S_ADD && s->op <= LM_S_MAX) || s->op == LM_S_ACC_SUM ? 2 : 0;
    for (int j = 0; j < nops; j++) {
      const lm_stmt *o = &k->stmts[ops[j]];
      if (o->loop == p && !(s->op == LM_S_ACC_SUM && j == 0 && o->op == LM_S_ACC)) return 0;
    }
  }
  return 1;
}

/* Can loop p (the innermost parallel loop) move inside its reductions? */
static int eligible(const lm_kernel *k, lm_exprs *x, int32_t p, int64_t *extent, staging *sg) {
  const lm_xnode *e = lm_x_node(x, k->loops[p].extent);
  if (e->op != LM_X_CONST || e->v < 2 || e->v > MAX_EXTENT) return 0;
  *extent = e->v;
  lm_expr ext[64];
  if (k->nloops > 64) return 0;
  for (size_t i = 0; i < k->nloops; i++) ext[i] = k->loops[i].extent;
  lm_xctx ctx = {.extent = ext, .nvars = (int)k->nloops};
  const lm_block *b = &k->loops[p].body;
  int loops = 0, tail = 0;
  for (size_t i = 0; i < b->n; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      if (tail || k->loops[it.id].kind != LM_L_SERIAL || !body_ok(k, x, &k->loops[it.id].body, p, &ctx, sg)) return 0;
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
  if (s.op == LM_S_LOAD && c->staged[old]) { /* w'[k*P + p] */
    lm_expr P = c->k->loops[c->p].extent;
    lm_expr at = lm_x_add(c->x, lm_x_mul(c->x, lm_x_var(c->x, c->k->stmts[old].loop), P), lm_x_var(c->x, c->p));
    lm_stmt ld = {.op = LM_S_LOAD, .loop = target, .buf = c->staged[old] - 1, .local = 1, .idx = remap(c, at),
                  .valid = lm_x_const(c->x, 1)};
    c->smap[old] = add(c, ld);
    return;
  }
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
  int binary = (s.op >= LM_S_ADD && s.op <= LM_S_MAX) || s.op == LM_S_ACC_SUM || s.op == LM_S_ACC_MAX;
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
  c->n->loops[init].point = 1;
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
      c->n->loops[pl].point = 1;
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
      c->n->loops[tail].point = 1;
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
    c->n->loops[nl].point = l->point;
    c->vmap[it.id] = lm_x_var(c->x, nl);
    copy_block(c, &l->body, nl, pv);
  }
}

/* Local arrays for the staged loads, then (after the kernel is built) the copies into them,
 * placed first in the root block: they run once per call, before the parallel loops. */
static void stage_alloc(ic *c) {
  for (int i = 0; i < c->stg->n && c->ok; i++) {
    const lm_kernel *k = c->k;
    if (!LM_GROW(c->n->locals, c->n->localcap, c->n->nlocals + 1)) {
      c->ok = 0;
      return;
    }
    int64_t P = lm_x_node(c->x, k->loops[c->p].extent)->v, R = lm_x_node(c->x, k->loops[c->stg->loop[i]].extent)->v;
    c->staged[c->stg->load[i]] = (uint32_t)c->n->nlocals + 1;
    c->n->locals[c->n->nlocals++] = P * R;
  }
}

static void stage_copies(ic *c) {
  const lm_kernel *k = c->k;
  lm_exprs *x = c->x;
  size_t first = c->n->root.n;
  for (int i = 0; i < c->stg->n && c->ok; i++) {
    const lm_stmt *s = &k->stmts[c->stg->load[i]];
    int32_t r = c->stg->loop[i];
    /* the copy reads in the source's order where it is contiguous in k (a [P, K] weight read by
     * columns: w[p*K + k]), its stores then strided over a few lines that stay in L1; the other
     * order read a new line every element: MinAtar's [1600, 128] layer, 24% of its input
     * gradient's time went on the copy */
    int r_inner = stride_ok(x, s->idx, r, NULL);
    int32_t outer = new_loop(c, -1, k->loops[r_inner ? c->p : r].extent, LM_L_SERIAL);
    int32_t inner = outer < 0 ? -1 : new_loop(c, outer, k->loops[r_inner ? r : c->p].extent, LM_L_SERIAL);
    if (inner < 0) return;
    int32_t lr = r_inner ? inner : outer, lp = r_inner ? outer : inner;
    lm_expr map[64] = {0};
    map[c->p] = lm_x_var(x, lp);
    map[r] = lm_x_var(x, lr);
    int nmap = (int)(k->nloops < 64 ? k->nloops : 64);
    lm_stmt ld = *s;
    ld.loop = inner;
    ld.idx = lm_x_simplify(x, lm_x_subst(x, s->idx, map, nmap), NULL);
    ld.valid = s->valid ? lm_x_simplify(x, lm_x_subst(x, s->valid, map, nmap), NULL) : 0;
    if (!lm_kernel_use_buf(c->n, s->buf)) c->ok = 0;
    uint32_t v = add(c, ld);
    lm_expr at = lm_x_add(x, lm_x_mul(x, lm_x_var(x, lr), k->loops[c->p].extent), lm_x_var(x, lp));
    lm_stmt st = {.op = LM_S_STORE, .loop = inner, .buf = c->staged[c->stg->load[i]] - 1, .local = 1,
                  .idx = lm_x_simplify(x, at, NULL), .a = v, .valid = lm_x_const(x, 1)};
    add(c, st);
  }
  /* rotate the copies to the front of the root block */
  lm_block *root = &c->n->root;
  size_t moved = root->n - first;
  if (!c->ok || !moved) return;
  lm_item *tmp = lm_calloc(moved, sizeof *tmp);
  if (!tmp) {
    c->ok = 0;
    return;
  }
  memcpy(tmp, root->items + first, moved * sizeof *tmp);
  memmove(root->items + moved, root->items, first * sizeof *tmp);
  memcpy(root->items, tmp, moved * sizeof *tmp);
  lm_free(tmp);
}

/* Rebuilds kernel k into n with loop p (its innermost parallel loop, or a point loop an earlier
 * interchange made) moved inside its reductions. */
static int interchange(const lm_plan *plan, const lm_kernel *k, lm_kernel *n, int32_t p, int stage) {
  lm_exprs *x = &plan->g->x;
  int64_t extent;
  memset(n, 0, sizeof *n);
  staging sg = {.allow = stage, .k = k};
  for (size_t i = 0; i < k->nlocals; i++) sg.floats += k->locals[i]; /* one stack budget for all rounds */
  if (p < 0 || (p < k->npar ? k->npar < 2 || p != k->npar - 1 : !k->loops[p].point) || !eligible(k, x, p, &extent, &sg))
    return 0;
  ic c = {.k = k, .stg = &sg, .n = n, .x = x, .p = p, .extent = extent, .ok = 1};
  c.vmap = lm_calloc(k->nloops + 1, sizeof *c.vmap);
  c.smap = lm_calloc(k->nstmts + 1, sizeof *c.smap);
  c.acc = lm_calloc(k->nstmts + 1, sizeof *c.acc);
  c.staged = lm_calloc(k->nstmts + 1, sizeof *c.staged);
  memcpy(n->name, k->name, sizeof n->name);
  n->anchor = k->anchor;
  n->npar = p < k->npar ? k->npar - 1 : k->npar;
  if (k->nlocals && LM_GROW(n->locals, n->localcap, k->nlocals)) { /* (those of an earlier interchange) */
    memcpy(n->locals, k->locals, k->nlocals * sizeof *k->locals);
    n->nlocals = k->nlocals;
  }
  if (c.vmap && c.smap && c.acc && c.staged && n->nlocals == k->nlocals) {
    stage_alloc(&c);
    if (c.ok) copy_block(&c, &k->root, -1, 0);
    if (c.ok) stage_copies(&c);
  } else c.ok = 0;
  lm_free(c.vmap);
  lm_free(c.smap);
  lm_free(c.acc);
  lm_free(c.staged);
  return c.ok && !x->failed;
}

/* A kernel whose outer parallel loop has a constant extent E, a multiple of SPLIT (E >= 2 SPLIT),
 * and whose other parallel loops (if any) have extent 1, as two parallel loops E/SPLIT x SPLIT,
 * the loops of extent 1 dropped: the inner one can then move inside the reductions. A sum over a
 * strided axis per output (a bias gradient: par j < 64: for i < M: a += dy[i*64 + j]) has one
 * parallel loop, which interchange() keeps for the threads, and then runs as one dependent
 * chain of additions per output (PPO update, 64 outputs, M = 512: 14 us; as 8 chains side by
 * side in a vector: 2 us). Each output sums in the same order: the same bits. */
enum { SPLIT = 8 };

/* Appends the items of old block b to new block d, with the items of dropped loops spliced in. */
static int split_items(const lm_kernel *k, const lm_block *b, const int32_t *newid, const uint8_t *dropped, lm_block *d) {
  for (size_t i = 0; i < b->n; i++) {
    lm_item it = b->items[i];
    if (it.is_loop && dropped[it.id]) {
      if (!split_items(k, &k->loops[it.id].body, newid, dropped, d)) return 0;
      continue;
    }
    if (it.is_loop) it.id = (uint32_t)newid[it.id];
    if (!lm_block_insert(d, d->n, it)) return 0;
  }
  return 1;
}

static int split_par(const lm_kernel *k, lm_exprs *x, lm_kernel *n) {
  memset(n, 0, sizeof *n);
  const lm_xnode *e = k->nloops ? lm_x_node(x, k->loops[0].extent) : NULL;
  if (k->npar < 1 || k->loops[0].kind != LM_L_PARALLEL || k->fixed || k->group || k->nshared || k->root.n != 1 ||
      !k->root.items[0].is_loop || k->root.items[0].id ||
      !e || e->op != LM_X_CONST || e->v % SPLIT || e->v < 2 * SPLIT || k->nloops >= 64)
    return 0;
  const int64_t E = e->v; /* (building expressions may move the nodes) */
  const lm_block *inner = &k->loops[k->npar - 1].body; /* no loop in it: nothing to interchange */
  int loops = 0;
  for (size_t i = 0; i < inner->n; i++) loops += inner->items[i].is_loop;
  if (!loops) return 0;
  uint8_t dropped[64] = {0};
  int32_t newid[64];
  lm_expr map[64] = {0};
  for (int j = 1; j < k->npar; j++) {
    if (!lm_x_is_const(x, k->loops[j].extent, 1) || k->loops[j].parent != j - 1) return 0;
    dropped[j] = 1;
    map[j] = lm_x_const(x, 0);
  }
  map[0] = lm_x_add(x, lm_x_mul(x, lm_x_var(x, 0), lm_x_const(x, SPLIT)), lm_x_var(x, 1));
  int32_t next = 1;
  for (size_t j = 0; j < k->nloops; j++) {
    if (dropped[j]) continue;
    newid[j] = next++;
    if (j) map[j] = lm_x_var(x, newid[j]);
  }
  for (size_t j = 1; j < k->nloops; j++)
    if (dropped[j]) newid[j] = newid[k->loops[j].parent]; /* its parent is never dropped after it */
  memcpy(n->name, k->name, sizeof n->name);
  n->anchor = k->anchor;
  n->npar = 2;
  int ok = lm_kernel_add_loop(n, -1, lm_x_const(x, E / SPLIT), LM_L_PARALLEL) == 0 &&
           LM_GROW(n->loops, n->loopcap, (size_t)next);
  for (size_t j = 0; j < k->nloops && ok; j++) { /* the kept loops, in their old order */
    const lm_loop *l = &k->loops[j];
    if (dropped[j]) continue;
    lm_loop *m = &n->loops[n->nloops++];
    *m = (lm_loop){.extent = j ? l->extent : lm_x_const(x, SPLIT), .kind = l->kind,
                   .parent = j ? newid[l->parent] : 0, .mask = l->mask};
    ok = split_items(k, &l->body, newid, dropped, &m->body);
  }
  ok = ok && lm_block_insert(&n->loops[0].body, 0, (lm_item){1, 1});
  ok = ok && LM_GROW(n->stmts, n->stmtcap, k->nstmts) && LM_GROW(n->bufs, n->bufcap, k->nbufs) &&
       LM_GROW(n->locals, n->localcap, k->nlocals);
  for (size_t i = 0; i < k->nstmts && ok; i++) {
    lm_stmt s = k->stmts[i];
    s.loop = newid[s.loop];
    s.idx = s.idx ? lm_x_simplify(x, lm_x_subst(x, s.idx, map, (int)k->nloops), NULL) : 0;
    s.valid = s.valid ? lm_x_simplify(x, lm_x_subst(x, s.valid, map, (int)k->nloops), NULL) : 0;
    s.step = s.step ? lm_x_simplify(x, lm_x_subst(x, s.step, map, (int)k->nloops), NULL) : 0;
    n->stmts[n->nstmts++] = s;
  }
  if (ok) {
    if (k->nbufs) memcpy(n->bufs, k->bufs, k->nbufs * sizeof *k->bufs);
    n->nbufs = k->nbufs;
    if (k->nlocals) memcpy(n->locals, k->locals, k->nlocals * sizeof *k->locals);
    n->nlocals = k->nlocals;
  }
  if (!ok || x->failed) lm_kernel_free(n);
  return ok && !x->failed;
}

/* Perfectly nested parallel loops a > 0 and b (a's body is loop b alone, constant extents) that
 * every index steps through as one axis (the step in a is extent(b) times the step in b; no
 * other use) become one loop: a's extent 1, b's extent(a) * extent(b), a replaced by 0. A
 * [N, 10, 10, 16] gradient is then one axis of 1600 that interchange() can move, contiguously,
 * inside its reduction. Same loads, same order: the same bits. */
static int merge_par(lm_exprs *x, lm_kernel *k) {
  int merged = 0;
  for (int32_t a = 1; a + 1 < k->npar && k->nloops <= 64; a++) {
    lm_loop *la = &k->loops[a], *lb = &k->loops[a + 1];
    const lm_xnode *ea = lm_x_node(x, la->extent), *eb = lm_x_node(x, lb->extent);
    if (la->body.n != 1 || !la->body.items[0].is_loop || la->body.items[0].id != (uint32_t)(a + 1) ||
        lb->kind != LM_L_PARALLEL || ea->op != LM_X_CONST || eb->op != LM_X_CONST || ea->v < 2)
      continue;
    const int64_t A = ea->v, B = eb->v;
    int ok = 1;
    for (size_t i = 0; i < k->nstmts && ok; i++) {
      const lm_stmt *st = &k->stmts[i];
      lm_expr es[3] = {st->idx, st->valid, st->step};
      for (int j = 0; j < 3 && ok; j++) {
        int64_t da, db;
        if (!es[j] || !(lm_x_vars_used(x, es[j]) & ((uint64_t)3 << a))) continue;
        ok = j != 1 && lm_x_step(x, es[j], a, (int)k->nloops, &da) && lm_x_step(x, es[j], a + 1, (int)k->nloops, &db) &&
             da == B * db;
      }
    }
    if (!ok) continue;
    lm_expr map[64] = {0};
    map[a] = lm_x_const(x, 0);
    for (size_t i = 0; i < k->nstmts; i++) {
      lm_stmt *st = &k->stmts[i];
      if (st->idx) st->idx = lm_x_simplify(x, lm_x_subst(x, st->idx, map, (int)k->nloops), NULL);
      if (st->step) st->step = lm_x_simplify(x, lm_x_subst(x, st->step, map, (int)k->nloops), NULL);
    }
    k->loops[a].extent = lm_x_const(x, 1);
    k->loops[a + 1].extent = lm_x_const(x, A * B);
    merged++;
  }
  return merged;
}

/* The moved point loops of k, interchanged again inward through nested reductions, in place. */
static void interchange_points(const lm_plan *plan, lm_kernel *k, int stage) {
  for (int round = 0; round < 8; round++) {
    lm_kernel n;
    int32_t q = 0;
    for (; q < (int32_t)k->nloops; q++) {
      if (interchange(plan, k, &n, q, stage)) break;
      lm_kernel_free(&n);
    }
    if (q == (int32_t)k->nloops) return;
    lm_kernel_free(k);
    *k = n;
  }
}

static int kernel_divmods(const lm_exprs *x, const lm_kernel *k) {
  int n = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    lm_expr es[3] = {s->idx, s->valid, s->step};
    for (int j = 0; j < 3; j++) n += es[j] ? lm_x_divmods(x, es[j], -1, NULL, NULL) : 0;
  }
  return n;
}

/* A serial loop l whose variable is read through floor divisions and modulos by constants
 * (a reduction over a flattened [3, 3, 4] window: l / 12, l / 4 % 3, l % 4) becomes two nested
 * loops, l = a * d + b, when that leaves fewer divisions: the same iterations in the same
 * order (the same bits), and a guard on the outer part (the window inside the image) is
 * decided once per inner run. Repeated until no split pays. */
static int split_serial(lm_exprs *x, lm_kernel *k) {
  int splits = 0;
  for (int round = 0; round < 16; round++) {
    int best = kernel_divmods(x, k), done = 0;
    for (int32_t l = k->npar; l < (int32_t)k->nloops && !done && k->nloops < 63; l++) {
      const lm_loop *lp = &k->loops[l];
      const lm_xnode *e = lm_x_node(x, lp->extent);
      if (lp->kind != LM_L_SERIAL || lp->point || e->op != LM_X_CONST) continue;
      const int64_t E = e->v;
      int64_t d[8];
      int nd = 0;
      for (size_t i = 0; i < k->nstmts && nd < 8; i++) {
        const lm_stmt *s = &k->stmts[i];
        lm_expr es[3] = {s->idx, s->valid, s->step};
        for (int j = 0; j < 3; j++)
          if (es[j]) lm_x_divmods(x, es[j], l, d, &nd);
      }
      for (int c = 0; c < nd && !done; c++) {
        if (d[c] < 2 || d[c] >= E || E % d[c]) continue;
        const int64_t D = d[c];
        int32_t nl = (int32_t)k->nloops;
        lm_expr ext[64];
        for (int32_t i = 0; i < nl; i++) ext[i] = k->loops[i].extent;
        ext[l] = lm_x_const(x, E / D);
        ext[nl] = lm_x_const(x, D);
        lm_xctx ctx = {.extent = ext, .nvars = nl + 1};
        lm_expr map[64] = {0};
        map[l] = lm_x_add(x, lm_x_mul(x, lm_x_var(x, l), lm_x_const(x, D)), lm_x_var(x, nl));
        lm_kernel tmp = *k; /* counted through a copy of the statements */
        tmp.stmts = lm_calloc(k->nstmts + 1, sizeof *tmp.stmts);
        if (!tmp.stmts) return splits;
        for (size_t i = 0; i < k->nstmts; i++) {
          lm_stmt st = k->stmts[i];
          lm_expr *es[3] = {&st.idx, &st.valid, &st.step};
          for (int j = 0; j < 3; j++)
            if (*es[j]) *es[j] = lm_x_simplify(x, lm_x_subst(x, *es[j], map, nl), &ctx);
          tmp.stmts[i] = st;
        }
        if (!x->failed && kernel_divmods(x, &tmp) < best && LM_GROW(k->loops, k->loopcap, k->nloops + 1)) {
          lm_loop *ol = &k->loops[l];
          k->loops[nl] = (lm_loop){.extent = ext[nl], .kind = LM_L_SERIAL, .parent = l, .body = ol->body};
          ol->body = (lm_block){0};
          ol->extent = ext[l];
          k->nloops++;
          if (lm_block_insert(&k->loops[l].body, 0, (lm_item){1, (uint32_t)nl})) {
            for (size_t i = 0; i + 1 < k->nloops; i++)
              if (k->loops[i].parent == l && (int32_t)i != nl) k->loops[i].parent = nl;
            for (size_t i = 0; i < k->nstmts; i++) {
              tmp.stmts[i].loop = tmp.stmts[i].loop == l ? nl : tmp.stmts[i].loop;
              k->stmts[i] = tmp.stmts[i];
            }
            done = 1;
            splits++;
          } else { /* (out of memory: undo) */
            k->loops[l].body = k->loops[nl].body;
            k->loops[l].extent = lm_x_const(x, E);
            k->nloops--;
          }
        }
        lm_free(tmp.stmts);
      }
    }
    if (!done) break;
  }
  return splits;
}

int lm_schedule_interchange(lm_plan *plan, int stage) {
  int changed = 0;
  for (size_t i = 0; i < plan->nkernels; i++) {
    lm_kernel n, s;
    lm_kernel *k = &plan->kernels[i];
    merge_par(&plan->g->x, k);
    if (!interchange(plan, k, &n, k->npar - 1, stage)) {
      lm_kernel_free(&n); /* (zeroed or partly built) */
      if (!split_par(k, &plan->g->x, &s)) continue;
      int done = interchange(plan, &s, &n, s.npar - 1, stage);
      lm_kernel_free(&s);
      if (!done) {
        lm_kernel_free(&n);
        continue;
      }
    }
    interchange_points(plan, &n, stage);
    lm_kernel_free(k);
    *k = n;
    changed++;
  }
  for (size_t i = 0; i < plan->nkernels; i++) changed += split_serial(&plan->g->x, &plan->kernels[i]) > 0;
  return changed;
}

/* ---------------------------------------------------------------- horizontal fusion */

/* Kernels over the same parallel domain that do not depend on each other become one kernel
 * (several stores per point): an env step's outputs and assigned state, an optimiser's
 * updates of same-shaped parameters. Statements the two compute alike are shared. */

typedef struct mg {
  lm_kernel *a;        /* the kernel merged into */
  const lm_kernel *b;  /* the kernel merged in */
  lm_exprs *x;
  lm_expr *vmap;
  uint32_t *smap;
  int ok;
} mg;

static int pure_op(uint8_t op) { return op != LM_S_ACC && op != LM_S_ACC_SUM && op != LM_S_ACC_MAX && op != LM_S_STORE; }

static int chain_has(const lm_kernel *k, int32_t from, int32_t loop) {
  if (loop < 0) return 1;
  for (int32_t l = from; l >= 0; l = k->loops[l].parent)
    if (l == loop) return 1;
  return 0;
}

/* Inserts statement s into block `loop` of a, before child loop `before` (or at the end),
 * reusing an identical pure statement already visible there. */
static uint32_t place_stmt(mg *m, lm_stmt s, int32_t before) {
  lm_kernel *a = m->a;
  if (pure_op(s.op)) {
    const lm_block *blk = s.loop < 0 ? &a->root : &a->loops[s.loop].body;
    size_t at = before < 0 ? blk->n : lm_block_find(blk, 1, (uint32_t)before);
    for (size_t i = 0; i < a->nstmts; i++) {
      const lm_stmt *o = &a->stmts[i];
      if (o->op != s.op || o->a != s.a || o->b != s.b || o->buf != s.buf || o->local != s.local || o->idx != s.idx ||
          o->valid != s.valid || o->step != s.step || o->stream != s.stream || memcmp(&o->f, &s.f, sizeof s.f))
        continue;
      if (!chain_has(a, s.loop, o->loop)) continue;
      if (o->loop == s.loop && lm_block_find(blk, 0, (uint32_t)i) >= at) continue;
      return (uint32_t)i;
    }
  }
  uint32_t id = lm_kernel_add_stmt(a, &s, before);
  if (id == UINT32_MAX) m->ok = 0;
  return id == UINT32_MAX ? 0 : id;
}

/* Adds a loop to block `parent` of a, placed before child loop `before` (or at the end). */
static int32_t place_loop(mg *m, int32_t parent, int32_t before, lm_expr extent, lm_loopkind kind) {
  lm_kernel *a = m->a;
  int32_t l = lm_kernel_add_loop(a, parent, extent, kind);
  if (l < 0) {
    m->ok = 0;
    return -1;
  }
  if (before >= 0) { /* move the new item from the end to before `before` */
    lm_block *blk = parent < 0 ? &a->root : &a->loops[parent].body;
    size_t at = lm_block_find(blk, 1, (uint32_t)before);
    lm_item it = blk->items[blk->n - 1];
    memmove(&blk->items[at + 1], &blk->items[at], (blk->n - 1 - at) * sizeof *blk->items);
    blk->items[at] = it;
  }
  return l;
}

static lm_stmt remap_stmt(mg *m, uint32_t id, int32_t loop) {
  const lm_kernel *b = m->b;
  lm_stmt s = b->stmts[id];
  s.loop = loop;
  s.a = m->smap[s.a];
  s.b = m->smap[s.b];
  s.idx = s.idx ? lm_x_subst(m->x, s.idx, m->vmap, (int)b->nloops) : 0;
  s.valid = s.valid ? lm_x_subst(m->x, s.valid, m->vmap, (int)b->nloops) : 0;
  s.step = s.step ? lm_x_subst(m->x, s.step, m->vmap, (int)b->nloops) : 0;
  if (s.local) s.buf += (uint32_t)(m->a->nlocals - b->nlocals); /* b's arrays follow a's */
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && !s.local && !lm_kernel_use_buf(m->a, s.buf)) m->ok = 0;
  return s;
}

/* A serial loop of b, whole, into a new loop of a. */
static void copy_serial(mg *m, uint32_t bloop, int32_t parent, int32_t before) {
  const lm_loop *lp = &m->b->loops[bloop];
  int32_t nl = place_loop(m, parent, before, lp->extent, (lm_loopkind)lp->kind);
  if (nl < 0) return;
  m->a->loops[nl].point = lp->point; /* jam's tiles run over point loops (jam.c, plan_tiles) */
  m->vmap[bloop] = lm_x_var(m->x, nl);
  for (size_t j = 0; j < lp->body.n && m->ok; j++) {
    lm_item it = lp->body.items[j];
    if (it.is_loop) copy_serial(m, it.id, nl, -1);
    else m->smap[it.id] = place_stmt(m, remap_stmt(m, it.id, nl), -1);
  }
}

/* b's block at parallel level bl into a's block at the same level al: items before b's
 * parallel child go before a's parallel child, the rest after everything. */
static void merge_block(mg *m, int32_t bl, int32_t al) {
  const lm_kernel *b = m->b;
  const lm_block *blk = bl < 0 ? &b->root : &b->loops[bl].body;
  int32_t bchild = bl + 1 < b->npar ? bl + 1 : -1;
  int32_t achild = al + 1 < m->a->npar ? al + 1 : -1;
  int passed = 0;
  for (size_t i = 0; i < blk->n && m->ok; i++) {
    lm_item it = blk->items[i];
    int32_t before = passed ? -1 : achild;
    if (it.is_loop && (int32_t)it.id == bchild) {
      passed = 1;
      merge_block(m, bchild, achild);
    } else if (it.is_loop) copy_serial(m, it.id, al, before);
    else m->smap[it.id] = place_stmt(m, remap_stmt(m, it.id, al), before);
  }
}

static int reads_or_writes(const lm_kernel *k, uint32_t buf, int write) {
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!s->local && s->buf == buf && (write ? s->op == LM_S_STORE : s->op == LM_S_LOAD)) return 1;
  }
  return 0;
}

/* Neither kernel reads or writes what the other writes: they may run in either order. */
static int independent(const lm_kernel *a, const lm_kernel *b) {
  for (size_t i = 0; i < b->nstmts; i++) {
    const lm_stmt *s = &b->stmts[i];
    if (s->local || (s->op != LM_S_LOAD && s->op != LM_S_STORE)) continue;
    if (reads_or_writes(a, s->buf, 1) || (s->op == LM_S_STORE && reads_or_writes(a, s->buf, 0))) return 0;
  }
  return 1;
}

/* The same outer parallel loops (b's domain a prefix of a's), and neither reads what the
 * other writes. */
static int mergeable(const lm_kernel *a, const lm_kernel *b) {
  if (b->npar > a->npar || b->npar < 1 || a->nloops + b->nloops > 60) return 0;
  if (a->group || b->group) return 0; /* a work-group schedule's threads are not a domain to share */
  if (a->contract != b->contract) return 0; /* an FMA where the other kernel was measured without */
  for (int l = 0; l < b->npar; l++)
    if (a->loops[l].extent != b->loops[l].extent) return 0;
  /* GPU dialects pass every buffer as its own argument: Metal allows 31 slots a kernel (3 are
   * taken by S, R and total), so a merged kernel keeps to MAX_MERGED_BUFS */
  size_t both = a->nbufs;
  for (size_t i = 0; i < b->nbufs; i++) {
    int in_a = 0;
    for (size_t j = 0; j < a->nbufs && !in_a; j++) in_a = a->bufs[j] == b->bufs[i];
    both += !in_a;
  }
  return both <= MAX_MERGED_BUFS && independent(a, b);
}

/* Every kernel b, in launch order, offered to `absorb` with the kernels kept before it
 * (kernels[0..out-1], of which it may look `back`): 1 when b went into one of them (b is then
 * freed), 0 when b stays, -1 when memory ran out. Returns how many were absorbed, or -1. */
static int fold_kernels(lm_plan *plan, int back, int (*absorb)(lm_plan *, size_t out, lm_kernel *b, int back)) {
  int absorbed = 0;
  size_t out = 0;
  for (size_t i = 0; i < plan->nkernels; i++) {
    lm_kernel *b = &plan->kernels[i];
    int r = absorb(plan, out, b, back);
    if (r < 0) return -1; /* memory ran out, the kernel taking b half-built: reported */
    if (r) {
      lm_kernel_free(b);
      absorbed++;
      continue;
    }
    if (out != i) plan->kernels[out] = *b;
    out++;
  }
  plan->nkernels = out;
  if (absorbed) lm_plan_liveness(plan);
  return absorbed;
}

/* Sets m up to put b into a: the maps, and b's local arrays after a's. 0 when memory ran out. */
static int mg_begin(mg *m, lm_kernel *a, const lm_kernel *b, lm_exprs *x) {
  *m = (mg){.a = a, .b = b, .x = x, .ok = 1};
  m->vmap = lm_calloc(b->nloops + 1, sizeof *m->vmap);
  m->smap = lm_calloc(b->nstmts + 1, sizeof *m->smap);
  int ok = m->vmap && m->smap;
  for (size_t l = 0; ok && l < b->nlocals; l++) {
    ok = LM_GROW(a->locals, a->localcap, a->nlocals + 1);
    if (ok) a->locals[a->nlocals++] = b->locals[l];
  }
  return ok;
}

/* Frees m's maps; 1 when everything went in, -1 when memory ran out. */
static int mg_end(mg *m) {
  lm_free(m->vmap);
  lm_free(m->smap);
  return m->ok && !m->x->failed ? 1 : -1;
}

static int merge_one(lm_plan *plan, size_t out, lm_kernel *b, int back) {
  if (out > 0 && !mergeable(&plan->kernels[out - 1], b) && mergeable(b, &plan->kernels[out - 1])) {
    /* independent kernels may swap: merge into the one with the deeper domain */
    lm_kernel t = plan->kernels[out - 1];
    plan->kernels[out - 1] = *b;
    *b = t;
  }
  /* the latest kernel b may merge into, moving b up past the kernels after it (b must be
   * independent of each) */
  size_t into = out;
  for (size_t j = out; j-- > 0 && out - j <= (size_t)back;) {
    if (mergeable(&plan->kernels[j], b)) {
      into = j;
      break;
    }
    if (!independent(&plan->kernels[j], b)) break;
  }
  if (into == out) return 0;
  mg m;
  if (mg_begin(&m, &plan->kernels[into], b, &plan->g->x)) {
    for (int l = 0; l < b->npar; l++) m.vmap[l] = lm_x_var(m.x, l);
    merge_block(&m, -1, -1);
  } else m.ok = 0;
  return mg_end(&m);
}

int lm_schedule_merge(lm_plan *plan, int back) { return fold_kernels(plan, back < 1 ? 1 : back, merge_one); }

/* ---------------------------------------------------------------- one thread's kernels as one */

/* On the cpu a kernel of little work runs on one thread (lm_cpu_cut_of), and so do one
 * without a parallel domain and one whose outer loop is a single chunk; a run of such kernels,
 * one after the other, becomes one kernel without a parallel domain whose root block runs their
 * bodies in launch order: their parallel loops become serial loops over independent points.
 * Nothing runs on fewer threads than before, and a launch is saved per kernel (an optimiser's
 * update of every parameter, the global norm before it, a loss's scalar reductions). Bitwise
 * identical: every loop keeps its order and every statement its operands. (A pass, not a rule:
 * it changes the plan's kernel list, which the search's rules, kernel-local, do not see.) */

static int one_thread(const lm_exprs *x, const lm_kernel *k) {
  if (k->group || k->fixed) return 0;
  if (k->npar == 0) return 1;
  const lm_xnode *outer = lm_x_node(x, k->loops[0].extent); /* one chunk of the outer loop */
  if (outer->op == LM_X_CONST && (outer->v <= 1 || (outer->v <= LM_CPU_BLOCK && !lm_kernel_fine(x, k)))) return 1;
  for (size_t l = 0; l < k->nloops; l++)
    if (lm_x_node(x, k->loops[l].extent)->op != LM_X_CONST) return 0;
  return lm_kernel_cost(x, k, NULL) <= LM_CPU_THREAD_WORK;
}

/* b's block `bl` (-1: its root) appended to a's block `al`, loops and statements in order,
 * nothing shared (a load of b may follow a store of a to the same buffer). */
static void append_block(mg *m, int32_t bl, int32_t al) {
  const lm_kernel *b = m->b;
  const lm_block *blk = bl < 0 ? &b->root : &b->loops[bl].body;
  for (size_t i = 0; i < blk->n && m->ok; i++) {
    lm_item it = blk->items[i];
    if (!it.is_loop) {
      lm_stmt s = remap_stmt(m, it.id, al);
      uint32_t id = lm_kernel_add_stmt(m->a, &s, -1);
      if (id == UINT32_MAX) m->ok = 0;
      m->smap[it.id] = id;
      continue;
    }
    const lm_loop *lp = &b->loops[it.id];
    int32_t nl = lm_kernel_add_loop(m->a, al, lp->extent, lp->kind == LM_L_PARALLEL ? LM_L_SERIAL : (lm_loopkind)lp->kind);
    if (nl < 0) {
      m->ok = 0;
      return;
    }
    lm_loop *n = &m->a->loops[nl];
    n->point = lp->point || lp->kind == LM_L_PARALLEL;
    n->mask = lp->kind == LM_L_SPARSE ? lp->mask + (uint32_t)(m->a->nlocals - b->nlocals) : lp->mask;
    m->vmap[it.id] = lm_x_var(m->x, nl);
    append_block(m, (int32_t)it.id, nl);
  }
}

static int join_one(lm_plan *plan, size_t out, lm_kernel *b, int back) {
  (void)back;
  lm_exprs *x = &plan->g->x;
  lm_kernel *a = out > 0 ? &plan->kernels[out - 1] : NULL;
  if (!a || a->contract != b->contract || !one_thread(x, a) || !one_thread(x, b)) return 0;
  for (int l = 0; l < a->npar; l++) { /* a's domain: serial loops over independent points */
    a->loops[l].kind = LM_L_SERIAL;
    a->loops[l].point = 1;
  }
  a->npar = 0;
  mg m;
  if (mg_begin(&m, a, b, x)) append_block(&m, -1, -1);
  else m.ok = 0;
  return mg_end(&m);
}

int lm_schedule_join(lm_plan *plan) { return fold_kernels(plan, 1, join_one); }

/* ---------------------------------------------------------------- elementwise epilogues */

/* A kernel Y that is elementwise (parallel loops only) and reads a buffer that an earlier
 * kernel X stores at each point of the same domain, at the very index X stores it, runs inside
 * X: a matmul's tanh tail, a derivative of it, a bias's broadcast. X's loops around the store
 * (parallel, or serial over independent points after the interchange) stand for Y's parallel
 * loops; Y's innermost loop becomes a loop of its own right after the one holding the store,
 * reading back what X stored in that iteration of the loops around (still in cache). Fusing
 * Y's statements into the store's loop itself would save the loads but change what the C
 * compiler makes of that loop: clang then no longer vectorises a matmul's exp2 tail, scalar
 * expf replaces libmvec's, and results differ in the last bits. Y must not touch what X
 * writes otherwise, nor store what X reads, and moves up past the kernels between only when
 * independent of them. Bitwise identical. (A pass, not a rule: it joins two kernels of the
 * plan, which the search's kernel-local rules do not see; lowering cannot place the tail
 * there itself, because it materialises a node once per kernel, at its own domain.) */

static int store_count(const lm_kernel *k, uint32_t buf, uint32_t *at) {
  int n = 0;
  for (size_t i = 0; i < k->nstmts; i++)
    if (k->stmts[i].op == LM_S_STORE && !k->stmts[i].local && k->stmts[i].buf == buf) n++, *at = (uint32_t)i;
  return n;
}

/* Y's block `yl` (-1: its root; Y's parallel loops nest one per level) into X's block `into`,
 * before X's loop `before` (-1: at the end). Levels above depth - 1 are X's chain loops; Y's
 * innermost loop becomes a new loop at the end of chain[depth - 2] (one level deep: Y's
 * statements follow X's store in its loop, taking the stored value `fwd_val`). */
static void place_epilogue(mg *m, const int32_t *chain, int depth, int32_t yl, int level, int32_t into,
                           int32_t before, uint32_t fwd_buf, uint32_t fwd_val) {
  const lm_kernel *y = m->b;
  const lm_block *blk = yl < 0 ? &y->root : &y->loops[yl].body;
  for (size_t i = 0; i < blk->n && m->ok; i++) {
    lm_item it = blk->items[i];
    if (it.is_loop) {
      int next = level + 1;
      if (depth >= 2 && next == depth - 1) { /* Y's innermost loop, after the store's */
        int32_t nl = lm_kernel_add_loop(m->a, chain[depth - 2], y->loops[it.id].extent, LM_L_SERIAL);
        if (nl < 0) {
          m->ok = 0;
          return;
        }
        m->a->loops[nl].point = 1;
        m->vmap[it.id] = lm_x_var(m->x, nl);
        place_epilogue(m, chain, depth, (int32_t)it.id, next, nl, -1, fwd_buf, fwd_val);
      } else {
        m->vmap[it.id] = lm_x_var(m->x, chain[next]);
        place_epilogue(m, chain, depth, (int32_t)it.id, next, chain[next], next + 1 < depth ? chain[next + 1] : -1,
                       fwd_buf, fwd_val);
      }
      continue;
    }
    const lm_stmt *s = &y->stmts[it.id];
    if (depth == 1 && s->op == LM_S_LOAD && !s->local && s->buf == fwd_buf) {
      m->smap[it.id] = fwd_val;
      continue;
    }
    lm_stmt n = remap_stmt(m, it.id, into);
    uint32_t id = lm_kernel_add_stmt(m->a, &n, before);
    if (id == UINT32_MAX) m->ok = 0;
    m->smap[it.id] = id;
  }
}

/* Y into X when it fits (see above); 1 when done, 0 when not, -1 when memory ran out. */
static int epilogue_into(lm_exprs *x, lm_kernel *X, const lm_kernel *Y) {
  if (X->group || Y->group || X->fixed || Y->fixed || X->contract != Y->contract) return 0;
  if (Y->npar < 1 || (size_t)Y->npar != Y->nloops || Y->nlocals || Y->npar > LM_MAX_RANK) return 0;
  uint32_t buf = UINT32_MAX, store = 0;
  for (size_t i = 0; i < Y->nstmts; i++) { /* the one buffer of X's that Y reads */
    const lm_stmt *s = &Y->stmts[i];
    if (s->local || (s->op != LM_S_LOAD && s->op != LM_S_STORE)) continue;
    if (s->op == LM_S_STORE && (reads_or_writes(X, s->buf, 0) || reads_or_writes(X, s->buf, 1))) return 0;
    if (s->op == LM_S_LOAD && reads_or_writes(X, s->buf, 1)) {
      if (buf != UINT32_MAX && buf != s->buf) return 0;
      buf = s->buf;
    }
  }
  if (buf == UINT32_MAX || store_count(X, buf, &store) != 1) return 0;
  const lm_stmt *st = &X->stmts[store];
  if (!lm_x_is_const(x, st->valid, 1)) return 0;
  int32_t chain[LM_MAX_RANK];
  int depth = 0;
  for (int32_t l = st->loop; l >= 0; l = X->loops[l].parent) {
    const lm_loop *lp = &X->loops[l];
    if (depth == Y->npar || !(lp->kind == LM_L_PARALLEL || (lp->kind == LM_L_SERIAL && lp->point))) return 0;
    chain[depth++] = l;
  }
  if (depth != Y->npar) return 0;
  for (int i = 0; i < depth / 2; i++) {
    int32_t t = chain[i];
    chain[i] = chain[depth - 1 - i];
    chain[depth - 1 - i] = t;
  }
  lm_expr vmap[LM_MAX_RANK + 1] = {0};
  for (int l = 0; l < depth; l++) {
    if (X->loops[chain[l]].extent != Y->loops[l].extent) return 0;
    vmap[l] = lm_x_var(x, chain[l]);
  }
  for (size_t i = 0; i < Y->nstmts; i++) { /* every read of the buffer: the stored point */
    const lm_stmt *s = &Y->stmts[i];
    if (s->op != LM_S_LOAD || s->local || s->buf != buf) continue;
    if (s->loop != Y->npar - 1 || !lm_x_is_const(x, s->valid, 1)) return 0;
    lm_expr d = lm_x_simplify(x, lm_x_sub(x, lm_x_subst(x, s->idx, vmap, depth), st->idx), NULL);
    if (!d || !lm_x_is_const(x, d, 0)) return 0;
  }
  memset(vmap, 0, sizeof vmap); /* set again as Y's loops are placed */
  mg m = {.a = X, .b = Y, .x = x, .vmap = vmap, .ok = 1};
  m.smap = lm_calloc(Y->nstmts + 1, sizeof *m.smap);
  if (!m.smap) return -1;
  place_epilogue(&m, chain, depth, -1, -1, -1, chain[0], buf, st->a);
  lm_free(m.smap);
  return m.ok && !x->failed ? 1 : -1;
}

static int epilogue_one(lm_plan *plan, size_t out, lm_kernel *y, int back) {
  for (size_t j = out; j-- > 0 && out - j <= (size_t)back;) {
    int done = epilogue_into(&plan->g->x, &plan->kernels[j], y);
    if (done) return done;
    if (!independent(&plan->kernels[j], y)) break;
  }
  return 0;
}

int lm_schedule_epilogue(lm_plan *plan) { return fold_kernels(plan, LM_MERGE_BACK, epilogue_one); }

/* ---------------------------------------------------------------- chains of point-local kernels */

/* A kernel B over the same parallel domain as an earlier kernel A, that reads what A stores
 * only where A's same point stores it (or nothing A stores), runs inside A: B's body after A's
 * in each point. A PPO update's forward layers (each point a jammed block of rows: the next
 * layer reads the rows this one wrote), the loss's per-row terms, the backward pass's rows and
 * the weight gradients of one shape become one kernel each instead of a launch (and on the cpu
 * a fork and join) each. Domains are first cut to their common outer parallel loops: a kernel
 * over rows and actions runs inside one over rows, the actions a loop in each row.
 *
 * Where is what a point stores? For an access inside the innermost parallel loop, whose index
 * is affine in the loops around it inside the domain (constant extents), the index runs over
 * [lo, hi] at each point, both affine in the point. With one reference r (A's first store) the
 * offsets lo - r and hi - r are constants: A's stores of the buffer at a point span [amin, amax]
 * past r, B's loads [bmin, bmax]. Point p' writes [r(p') + amin, r(p') + amax] and
 * r(p') - r(p) = sum_j k_j S_j (k = p' - p, S_j the step of r in parallel loop j), so B's reads
 * at p miss every other point's writes when each nonzero sum lies outside [-D, D],
 * D = max(bmax - amin, amax - bmin): the smallest stride above D, each larger one above D plus
 * the span the smaller ones can reach ((E_i - 1) S_i, constant extents). Guards only take
 * elements away. B stores nothing that A reads or writes, its items outside the innermost
 * parallel loop read nothing A stores, and it moves up past the kernels between only when
 * independent of them. Every statement keeps its operands and order within its point: bitwise
 * identical. (A pass, not a rule: it joins two kernels of the plan, which the search's
 * kernel-local rules do not see; the epilogue pass above is its special case of one stored
 * point read back, placed inside the store's loop.) */

enum { CHAIN_LOOPS = 60 }; /* loops of a chained kernel: the variable masks are 64 bits */

/* [*lo, *hi]: where statement s's index runs at a point of k's domain (see above); 0 when the
 * access is not inside the innermost parallel loop or not affine in the loops around it. */
static int point_span(lm_exprs *x, const lm_kernel *k, const lm_stmt *s, lm_expr *lo, lm_expr *hi) {
  lm_expr lmap[CHAIN_LOOPS] = {0}, hmap[CHAIN_LOOPS] = {0};
  int inside = 0;
  if (k->nloops > CHAIN_LOOPS) return 0;
  for (int32_t l = s->loop; l >= 0; l = k->loops[l].parent) {
    if (l < k->npar) {
      inside |= l == k->npar - 1;
      continue;
    }
    const lm_xnode e = *lm_x_node(x, k->loops[l].extent); /* a copy: the arena may grow */
    int64_t d = 0;
    if (e.op != LM_X_CONST || e.v < 1 || !lm_x_step(x, s->idx, l, (int)k->nloops, &d)) return 0;
    lmap[l] = lm_x_const(x, d >= 0 ? 0 : e.v - 1);
    hmap[l] = lm_x_const(x, d >= 0 ? e.v - 1 : 0);
  }
  *lo = lm_x_simplify(x, lm_x_subst(x, s->idx, lmap, (int)k->nloops), NULL);
  *hi = lm_x_simplify(x, lm_x_subst(x, s->idx, hmap, (int)k->nloops), NULL);
  return inside && *lo && *hi && !x->failed;
}

/* e - r as a constant in *d; 0 when it is not one. */
static int offset_of(lm_exprs *x, lm_expr e, lm_expr r, int64_t *d) {
  lm_expr v = lm_x_simplify(x, lm_x_sub(x, e, r), NULL);
  if (!v || lm_x_node(x, v)->op != LM_X_CONST) return 0;
  *d = lm_x_node(x, v)->v;
  return 1;
}

/* Do B's loads of buffer buf at a point read only what A stores at that point (see above)? */
static int point_local(lm_exprs *x, const lm_kernel *a, const lm_kernel *b, uint32_t buf) {
  lm_expr ref = 0;
  int64_t amin = INT64_MAX, amax = INT64_MIN, bmin = INT64_MAX, bmax = INT64_MIN;
  for (int side = 0; side < 2; side++) {
    const lm_kernel *k = side ? b : a;
    for (size_t i = 0; i < k->nstmts; i++) {
      const lm_stmt *s = &k->stmts[i];
      if (s->local || s->buf != buf || s->op != (side ? LM_S_LOAD : LM_S_STORE)) continue;
      lm_expr lo, hi;
      int64_t dl, dh;
      if (!point_span(x, k, s, &lo, &hi)) return 0;
      if (!ref) ref = lo;
      if (!offset_of(x, lo, ref, &dl) || !offset_of(x, hi, ref, &dh)) return 0;
      int64_t *mn = side ? &bmin : &amin, *mx = side ? &bmax : &amax;
      if (dl < *mn) *mn = dl;
      if (dh > *mx) *mx = dh;
    }
  }
  if (!ref || bmin > bmax) return 0;
  int64_t reach = bmax - amin > amax - bmin ? bmax - amin : amax - bmin; /* D above */
  int64_t stride[LM_MAX_RANK], extent[LM_MAX_RANK];
  int n = 0;
  for (int j = 0; j < a->npar && j < LM_MAX_RANK; j++, n++) {
    int64_t d = 0;
    if (!lm_x_step(x, ref, j, (int)a->nloops, &d)) return 0;
    const lm_xnode e = *lm_x_node(x, a->loops[j].extent);
    stride[n] = d < 0 ? -d : d;
    extent[n] = e.op == LM_X_CONST ? e.v : -1;
  }
  if (n != a->npar) return 0;
  for (int i = 1; i < n; i++) /* ascending strides */
    for (int j = i; j > 0 && stride[j] < stride[j - 1]; j--) {
      int64_t t = stride[j], u = extent[j];
      stride[j] = stride[j - 1], extent[j] = extent[j - 1];
      stride[j - 1] = t, extent[j - 1] = u;
    }
  int64_t below = 0; /* what the smaller strides reach */
  for (int j = 0; j < n; j++) {
    if (stride[j] - below <= reach) return 0;
    if (j + 1 < n) {
      if (extent[j] < 1 || extent[j] > INT32_MAX || stride[j] > INT32_MAX) return 0;
      below += (extent[j] - 1) * stride[j];
    }
  }
  return 1;
}

/* Has B no item outside its innermost parallel loop that reads what A stores? */
static int outer_reads(const lm_kernel *a, const lm_kernel *b) {
  for (size_t i = 0; i < b->nstmts; i++) {
    const lm_stmt *s = &b->stmts[i];
    if (s->local || s->op != LM_S_LOAD || !reads_or_writes(a, s->buf, 1)) continue;
    int inside = 0;
    for (int32_t l = s->loop; l >= 0 && !inside; l = b->loops[l].parent) inside = l == b->npar - 1;
    if (!inside) return 1;
  }
  return 0;
}

/* B into A (their domains already cut to the same parallel loops, chainable_demoted)? */
static int chainable(lm_exprs *x, const lm_kernel *a, const lm_kernel *b) {
  if (a->group || b->group || a->fixed || b->fixed || a->contract != b->contract) return 0;
  if (a->nloops + b->nloops > CHAIN_LOOPS) return 0;
  for (size_t i = 0; i < b->nstmts; i++) {
    const lm_stmt *s = &b->stmts[i];
    if (s->local) continue;
    if (s->op == LM_S_STORE && (reads_or_writes(a, s->buf, 0) || reads_or_writes(a, s->buf, 1))) return 0;
    if (s->op == LM_S_LOAD && reads_or_writes(a, s->buf, 1)) {
      int seen = 0; /* each buffer once */
      for (size_t j = 0; j < i && !seen; j++)
        seen = !b->stmts[j].local && b->stmts[j].op == LM_S_LOAD && b->stmts[j].buf == s->buf;
      if (!seen && !point_local(x, a, b, s->buf)) return 0;
    }
  }
  return !outer_reads(a, b);
}

/* B's block `bl` at parallel level bl + 1 (-1: its root) into A's block at the same level:
 * items before B's parallel child go before A's, the rest after A's; the innermost level's
 * items after everything of A's in that point. */
static void chain_block(mg *m, int32_t bl, int32_t al) {
  const lm_kernel *b = m->b;
  if (bl == b->npar - 1) {
    append_block(m, bl, al);
    return;
  }
  const lm_block *blk = bl < 0 ? &b->root : &b->loops[bl].body;
  int passed = 0;
  for (size_t i = 0; i < blk->n && m->ok; i++) {
    lm_item it = blk->items[i];
    int32_t before = passed ? -1 : al + 1;
    if (it.is_loop && (int32_t)it.id == bl + 1) {
      passed = 1;
      chain_block(m, bl + 1, al + 1);
    } else if (it.is_loop) copy_serial(m, it.id, al, before);
    else m->smap[it.id] = place_stmt(m, remap_stmt(m, it.id, al), before);
  }
}

/* k's parallel loops from `keep` on as serial loops over independent points (1), or back as
 * they were (0). */
static void demote(lm_kernel *k, int keep, int npar, int on) {
  for (int l = keep; l < npar; l++) {
    k->loops[l].kind = on ? LM_L_SERIAL : LM_L_PARALLEL;
    k->loops[l].point = (uint8_t)on;
  }
  k->npar = on ? keep : npar;
}

/* Chainable with the domains cut to their common outer parallel loops (left cut when so):
 * a kernel over rows and actions (npar 2) runs inside one over rows, its actions a loop in
 * each row. */
static int chainable_demoted(lm_exprs *x, lm_kernel *a, lm_kernel *b) {
  int an = a->npar, bn = b->npar, keep = an < bn ? an : bn;
  if (keep < 1) return 0;
  for (int l = 0; l < keep; l++)
    if (a->loops[l].extent != b->loops[l].extent) return 0;
  demote(a, keep, an, 1);
  demote(b, keep, bn, 1);
  if (chainable(x, a, b)) return 1;
  demote(a, keep, an, 0);
  demote(b, keep, bn, 0);
  return 0;
}

static int chain_one(lm_plan *plan, size_t out, lm_kernel *b, int back) {
  lm_exprs *x = &plan->g->x;
  for (size_t j = out; j-- > 0 && out - j <= (size_t)back;) {
    lm_kernel *a = &plan->kernels[j];
    if (chainable_demoted(x, a, b)) {
      mg m;
      if (mg_begin(&m, a, b, x)) {
        for (int l = 0; l < b->npar; l++) m.vmap[l] = lm_x_var(x, l);
        chain_block(&m, -1, -1);
      } else m.ok = 0;
      return mg_end(&m);
    }
    if (!independent(a, b)) break;
  }
  return 0;
}

int lm_schedule_chain(lm_plan *plan) { return fold_kernels(plan, LM_MERGE_BACK, chain_one); }

/* ---------------------------------------------------------------- stacked domains */

/* Independent kernels whose domains differ (a PPO update's weight gradients: one bias of 1
 * point, one of 2, a layer's 16 blocks of outputs; a loss's scalar sums, no domain at all)
 * become one kernel over their domains end to end: par q < E1 + E2 + ...; where q falls in
 * member i's range, its body runs with its point q - (E1 + ... + Ei-1), under a test (a loop
 * with a `when`, lm_loop). What the chain pass cannot join for want of a common domain is
 * launched once (on the cpu one fork and join) instead of once a member. A member keeps at most
 * one parallel loop (the others run as loops over its points), and nothing but statements
 * outside it (they then run once a call of the stack, not of the member: loops there, a staged
 * operand's copy or a sum over the batch, would run for every member's calls). Every point
 * runs its own statements in its own order: bitwise identical. (A pass, not a rule: it joins
 * kernels of the plan, which the search's kernel-local rules do not see.) */

/* Is k a stack built here: one parallel loop holding only members? */
static int is_stack(const lm_kernel *k) {
  if (k->npar != 1 || k->loops[0].body.n == 0) return 0;
  for (size_t i = 0; i < k->loops[0].body.n; i++) {
    lm_item it = k->loops[0].body.items[i];
    if (!it.is_loop || !k->loops[it.id].when) return 0;
  }
  return 1;
}

/* Can k be a member: no parallel domain, or one parallel loop (more cut to one) with only
 * statements, none of them a store, outside it? */
static int member_ok(const lm_kernel *k) {
  if (k->group || k->fixed || k->npar > LM_MAX_RANK) return 0;
  if (k->npar == 0) return 1;
  for (size_t i = 0; i < k->root.n; i++) {
    lm_item it = k->root.items[i];
    if (it.is_loop ? it.id != 0 : k->stmts[it.id].op == LM_S_STORE) return 0;
  }
  return 1;
}

static lm_expr domain_of(lm_exprs *x, const lm_kernel *k) { return k->npar ? k->loops[0].extent : lm_x_const(x, 1); }

/* Member b into stack s, at points [at, end). */
static void add_member(mg *m, lm_expr at, lm_expr end) {
  lm_exprs *x = m->x;
  const lm_kernel *b = m->b;
  lm_kernel *s = m->a;
  lm_expr q = lm_x_var(x, 0), when = lm_x_lt(x, q, end);
  if (!lm_x_is_const(x, at, 0)) when = lm_x_and(x, lm_x_lt(x, lm_x_sub(x, at, lm_x_const(x, 1)), q), when);
  int32_t g = lm_kernel_add_loop(s, 0, lm_x_const(x, 1), LM_L_SERIAL);
  if (g < 0) {
    m->ok = 0;
    return;
  }
  s->loops[g].when = lm_x_simplify(x, when, NULL);
  if (b->npar == 0) { /* the whole kernel is one point */
    append_block(m, -1, g);
    return;
  }
  m->vmap[0] = lm_x_simplify(x, lm_x_sub(x, q, at), NULL);
  for (size_t i = 0; i < b->root.n && m->ok; i++) { /* statements once a call, before the points */
    lm_item it = b->root.items[i];
    if (!it.is_loop) m->smap[it.id] = place_stmt(m, remap_stmt(m, it.id, -1), 0);
  }
  append_block(m, 0, g);
}

/* Puts b into s (a stack) at its end; 1 when done, -1 when memory ran out. */
static int stack_onto(lm_exprs *x, lm_kernel *s, const lm_kernel *b) {
  lm_expr at = s->loops[0].extent, end = lm_x_simplify(x, lm_x_add(x, at, domain_of(x, b)), NULL);
  mg m;
  if (mg_begin(&m, s, b, x)) add_member(&m, at, end);
  else m.ok = 0;
  s->loops[0].extent = end;
  return mg_end(&m);
}

/* A stack holding a alone, in place of a (same name); 1 when done, -1 when memory ran out. */
static int make_stack(lm_exprs *x, lm_kernel *a) {
  lm_kernel s = {0};
  memcpy(s.name, a->name, sizeof s.name);
  s.anchor = a->anchor;
  s.contract = a->contract;
  s.measured = a->measured;
  s.fast_exp = a->fast_exp;
  s.finite = a->finite;
  s.npar = 1;
  if (lm_kernel_add_loop(&s, -1, lm_x_const(x, 0), LM_L_PARALLEL) != 0) {
    lm_kernel_free(&s);
    return -1;
  }
  int r = stack_onto(x, &s, a);
  if (r < 0) {
    lm_kernel_free(&s);
    return -1;
  }
  lm_kernel_free(a);
  *a = s;
  return 1;
}

static int stackable(const lm_kernel *a, const lm_kernel *b) {
  if (a->contract != b->contract || a->fast_exp != b->fast_exp || a->finite != b->finite) return 0;
  if (a->nloops + b->nloops + 2 > CHAIN_LOOPS || !member_ok(b) || !(is_stack(a) || member_ok(a))) return 0;
  return independent(a, b);
}

static int stack_one(lm_plan *plan, size_t out, lm_kernel *b, int back) {
  lm_exprs *x = &plan->g->x;
  for (size_t j = out; j-- > 0 && out - j <= (size_t)back;) {
    lm_kernel *a = &plan->kernels[j];
    if (stackable(a, b)) {
      if (b->npar > 1) demote(b, 1, b->npar, 1);
      if (!is_stack(a)) {
        if (a->npar > 1) demote(a, 1, a->npar, 1);
        if (make_stack(x, a) < 0) return -1;
      }
      return stack_onto(x, a, b);
    }
    if (!independent(a, b)) break;
  }
  return 0;
}

int lm_schedule_stack(lm_plan *plan) { return fold_kernels(plan, LM_MERGE_BACK, stack_one); }
