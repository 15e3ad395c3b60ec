/* compiler/lower.c — lowering a graph to the loop IR with the default schedule.
 * Materialised nodes (outputs, assigned values, CONTIGUOUS, shared reductions, and whatever
 * would otherwise be recomputed) each get a kernel over their shape; everything else is
 * inlined into its consumers by evaluating it at the consumer's index through the edge's
 * view. A reduction is inlined as a serial loop placed under the deepest loop its index
 * uses, so softmax over rows is one kernel. Statements hoist to the shallowest loop whose
 * variables they use, and are shared (CSE) while visible. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loopir.h"

/* ---------------------------------------------------------------- IR building blocks */

int lm_block_insert(lm_block *b, size_t at, lm_item it) {
  if (!LM_GROW(b->items, b->cap, b->n + 1)) return 0;
  memmove(&b->items[at + 1], &b->items[at], (b->n - at) * sizeof *b->items);
  b->items[at] = it;
  b->n++;
  return 1;
}

static lm_block *block_of(lm_kernel *k, int32_t loop) { return loop < 0 ? &k->root : &k->loops[loop].body; }

size_t lm_block_find(const lm_block *b, int is_loop, uint32_t id) {
  for (size_t i = 0; i < b->n; i++)
    if (b->items[i].is_loop == is_loop && b->items[i].id == id) return i;
  return b->n;
}

/* Position in the block of `loop` just before the item holding child loop `child`. */
static size_t insert_pos(lm_kernel *k, int32_t loop, int32_t child) {
  lm_block *b = block_of(k, loop);
  if (child < 0) return b->n;
  size_t at = lm_block_find(b, 1, (uint32_t)child);
  LM_ASSERT(at < b->n && "open loop not found in its parent block");
  return at;
}

int lm_loop_depth(const lm_kernel *k, int32_t loop) {
  int d = 0;
  for (; loop >= 0; loop = k->loops[loop].parent) d++;
  return d;
}

lm_kernel *lm_plan_add_kernel(lm_plan *p, const char *name) {
  if (!LM_GROW(p->kernels, p->kernelcap, p->nkernels + 1)) return NULL;
  lm_kernel *k = &p->kernels[p->nkernels++];
  memset(k, 0, sizeof *k);
  snprintf(k->name, sizeof k->name, "%s", name);
  return k;
}

int32_t lm_kernel_add_loop(lm_kernel *k, int32_t parent, lm_expr extent, lm_loopkind kind) {
  if (!LM_GROW(k->loops, k->loopcap, k->nloops + 1)) return -1;
  int32_t id = (int32_t)k->nloops++;
  k->loops[id] = (lm_loop){.extent = extent, .kind = (uint8_t)kind, .parent = parent};
  lm_block *b = block_of(k, parent);
  if (!lm_block_insert(b, b->n, (lm_item){1, (uint32_t)id})) return -1;
  return id;
}

int32_t lm_kernel_add_loop_before(lm_kernel *k, int32_t parent, int32_t before, lm_expr extent, lm_loopkind kind) {
  if (!LM_GROW(k->loops, k->loopcap, k->nloops + 1)) return -1;
  int32_t id = (int32_t)k->nloops++;
  k->loops[id] = (lm_loop){.extent = extent, .kind = (uint8_t)kind, .parent = parent};
  if (!lm_block_insert(block_of(k, parent), insert_pos(k, parent, before), (lm_item){1, (uint32_t)id})) return -1;
  return id;
}

uint32_t lm_kernel_add_stmt(lm_kernel *k, const lm_stmt *s, int32_t before_loop) {
  if (!LM_GROW(k->stmts, k->stmtcap, k->nstmts + 1)) return UINT32_MAX;
  uint32_t id = (uint32_t)k->nstmts++;
  k->stmts[id] = *s;
  if (!lm_block_insert(block_of(k, s->loop), insert_pos(k, s->loop, before_loop), (lm_item){0, id})) return UINT32_MAX;
  return id;
}

int lm_kernel_use_buf(lm_kernel *k, uint32_t buf) {
  size_t i = 0;
  while (i < k->nbufs && k->bufs[i] < buf) i++;
  if (i < k->nbufs && k->bufs[i] == buf) return 1;
  if (!LM_GROW(k->bufs, k->bufcap, k->nbufs + 1)) return 0;
  memmove(&k->bufs[i + 1], &k->bufs[i], (k->nbufs - i) * sizeof *k->bufs);
  k->bufs[i] = buf;
  k->nbufs++;
  return 1;
}

void lm_kernel_free(lm_kernel *k) {
  if (!k) return;
  for (size_t i = 0; i < k->nloops; i++) lm_free(k->loops[i].body.items);
  lm_free(k->loops);
  lm_free(k->stmts);
  lm_free(k->root.items);
  lm_free(k->bufs);
  lm_free(k->locals);
  lm_free(k->shared);
  memset(k, 0, sizeof *k);
}

int lm_kernel_writes_buf(const lm_kernel *k, uint32_t buf) {
  for (size_t i = 0; i < k->nstmts; i++)
    if (k->stmts[i].op == LM_S_STORE && !k->stmts[i].local && k->stmts[i].buf == buf) return 1;
  return 0;
}

uint32_t lm_kernel_add_local(lm_kernel *k, int64_t n, int shared) {
  if (!LM_GROW(k->locals, k->localcap, k->nlocals + 1)) return UINT32_MAX;
  uint32_t id = (uint32_t)k->nlocals;
  if (shared) {
    if (!LM_GROW(k->shared, k->sharedcap, k->nlocals + 1)) return UINT32_MAX;
    for (size_t i = k->nshared; i < k->nlocals; i++) k->shared[i] = 0;
    k->shared[id] = 1;
    k->nshared = k->nlocals + 1;
  }
  k->locals[id] = n;
  k->nlocals++;
  return id;
}

int lm_sop_operands(uint8_t op) {
  switch (op) {
  case LM_S_LOG2:
  case LM_S_EXP2:
  case LM_S_SIN:
  case LM_S_SQRT:
  case LM_S_RECIP:
  case LM_S_SELECT:
  case LM_S_WARP_SUM:
  case LM_S_WARP_MAX:
  case LM_S_STORE: return LM_OPND_A;
  case LM_S_ADD:
  case LM_S_MUL:
  case LM_S_MOD:
  case LM_S_LT:
  case LM_S_MAX:
  case LM_S_ACC_SUM:
  case LM_S_ACC_MAX: return LM_OPND_A | LM_OPND_B;
  default: return 0;
  }
}

void lm_plan_free(lm_plan *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nkernels; i++) lm_kernel_free(&p->kernels[i]);
  lm_free(p->kernels);
  lm_free(p->bufs);
  lm_free(p->copies);
  lm_free(p);
}

static uint32_t add_buf(lm_plan *p, lm_bufkind kind, uint32_t index, uint32_t node, lm_expr numel) {
  if (!LM_GROW(p->bufs, p->bufcap, p->nbufs + 1)) return UINT32_MAX;
  p->bufs[p->nbufs] = (lm_pbuf){(uint8_t)kind, index, node, numel, -1, -1};
  return (uint32_t)p->nbufs++;
}

/* ---------------------------------------------------------------- lowering state */

typedef struct memo {
  uint32_t node;
  lm_expr idx[LM_MAX_RANK];
  lm_expr valid;
  uint32_t stmt;
} memo;

typedef struct lowering {
  lm_graph_t *g;
  lm_plan *p;
  uint8_t *mat;       /* per node: computed by a kernel of its own */
  uint32_t *home;     /* per node: plan buffer holding its values, UINT32_MAX if none */
  uint32_t *uses;     /* per node: consumer edges (outputs and assigns included) */
  int *cost;          /* per node: inlining cost estimate, -1 = unknown */
  uint8_t *cheap_const; /* per node: depends on constants only, and computing it is cheap */
  uint8_t *out_only;  /* per node: has a buffer only because it is an output */
  int restart;        /* a new node was materialised: lower again */
  lm_status st;
} lowering;

typedef struct kbuild {
  lowering *L;
  lm_kernel *k;
  int32_t cur;        /* innermost open loop */
  lm_expr *extent;    /* per loop variable */
  size_t extcap;
  memo *memo;
  size_t nmemo, memocap;
} kbuild;

/* COST_SHARED: a node used more than once that costs this much to recompute (a reduction
 * inside) gets a buffer, even when each use alone would fuse. Cheaper shared nodes are
 * recomputed by each consumer kernel; kernels over one domain are then merged, and the
 * merged kernel computes them once (lm_schedule_merge shares equal statements). CONST_WORK: a
 * node computed from constants alone (an arange, a triangular mask) is recomputed wherever
 * it is used while its work stays under this: a kernel of its own would cost more, and it
 * would split env-local scans. */
enum { COST_CHEAP = 2, COST_REDUCE = 1000, COST_SHARED = COST_REDUCE, CONST_WORK = 256, NESTED_REDUCE_MIN = 16 };

static int transcendental(lm_op op) {
  return op == LM_OP_LOG2 || op == LM_OP_EXP2 || op == LM_OP_SIN || op == LM_OP_SQRT || op == LM_OP_RECIP;
}

/* Rough cost of evaluating a node inline once: what is lost when an index recomputes it. */
static int inline_cost(lowering *L, uint32_t id) {
  if (L->cost[id] >= 0) return L->cost[id];
  const lm_node *n = &L->g->nodes[id];
  int c;
  if (n->op == LM_OP_INPUT || n->op == LM_OP_CONST || L->mat[id]) c = 0;
  else if (n->op == LM_OP_RAND) c = 10;
  else if (lm_op_table[n->op].reduce) c = COST_REDUCE;
  else {
    c = transcendental((lm_op)n->op) ? 8 : 1;
    for (int i = 0; i < n->nsrc; i++) c += inline_cost(L, n->src[i].node);
    if (c > COST_REDUCE) c = COST_REDUCE;
  }
  return L->cost[id] = c;
}

/* The cost of computing node id inline, whether or not it has a buffer of its own. */
static int own_cost(lowering *L, uint32_t id) {
  const lm_node *n = &L->g->nodes[id];
  if (n->op == LM_OP_INPUT || n->op == LM_OP_CONST) return 0;
  if (n->op == LM_OP_RAND) return 10;
  if (lm_op_table[n->op].reduce) return COST_REDUCE;
  int c = transcendental((lm_op)n->op) ? 8 : 1;
  for (int i = 0; i < n->nsrc; i++) c += inline_cost(L, n->src[i].node);
  return c > COST_REDUCE ? COST_REDUCE : c;
}

static int on_chain(const lm_kernel *k, int32_t cur, int32_t loop) {
  if (loop < 0) return 1;
  for (int32_t l = cur; l >= 0; l = k->loops[l].parent)
    if (l == loop) return 1;
  return 0;
}

/* The child of `anc` on the path from anc down to cur (-1 when anc == cur). */
static int32_t open_child(const lm_kernel *k, int32_t cur, int32_t anc) {
  int32_t child = -1;
  for (int32_t l = cur; l != anc; l = k->loops[l].parent) child = l;
  return child;
}

/* The deepest loop of the current chain among the variables of `vars` and loop `other`. */
static int32_t deepest(const kbuild *b, uint64_t vars, int32_t other) {
  for (int32_t l = b->cur; l >= 0; l = b->k->loops[l].parent)
    if (l == other || (l < 64 && (vars >> l) & 1)) return l;
  return -1;
}

static int pure(uint8_t op) { return op != LM_S_ACC && op != LM_S_ACC_SUM && op != LM_S_ACC_MAX && op != LM_S_STORE; }

static uint32_t emit(kbuild *b, lm_stmt s, uint64_t vars, int32_t operand_loop) {
  s.loop = deepest(b, vars, operand_loop);
  if (pure(s.op)) /* value numbering: the same statement, visible from here, is reused */
    for (size_t i = b->k->nstmts; i-- > 0;) {
      const lm_stmt *o = &b->k->stmts[i];
      if (o->op == s.op && o->a == s.a && o->b == s.b && o->buf == s.buf && o->idx == s.idx &&
          o->valid == s.valid && o->stream == s.stream && !memcmp(&o->f, &s.f, sizeof s.f) &&
          on_chain(b->k, b->cur, o->loop))
        return (uint32_t)i;
    }
  uint32_t id = lm_kernel_add_stmt(b->k, &s, open_child(b->k, b->cur, s.loop));
  if (id == UINT32_MAX) b->L->st = LM_ERR_NOMEM;
  return id == UINT32_MAX ? 0 : id;
}

static int32_t loop_of(const kbuild *b, uint32_t stmt) { return b->k->stmts[stmt].loop; }

static int32_t deeper(const kbuild *b, int32_t x, int32_t y) {
  return lm_loop_depth(b->k, x) >= lm_loop_depth(b->k, y) ? x : y;
}

static lm_xctx ctx_of(kbuild *b) { return (lm_xctx){.extent = b->extent, .nvars = (int)b->k->nloops}; }

static uint32_t op_stmt(kbuild *b, lm_sop op, uint32_t a, uint32_t c) {
  lm_stmt s = {.op = (uint8_t)op, .a = a, .b = c};
  int32_t l = loop_of(b, a);
  if (op >= LM_S_ADD && op <= LM_S_LT) l = deeper(b, l, loop_of(b, c));
  return emit(b, s, 0, l);
}

static uint32_t load(kbuild *b, uint32_t buf, const lm_shape *shape, const lm_expr *idx, lm_expr valid) {
  lowering *L = b->L;
  lm_xctx ctx = ctx_of(b);
  lm_stmt s = {.op = LM_S_LOAD, .buf = buf, .valid = valid};
  lm_expr flat = lm_shape_flat(L->g, shape, idx);
  s.idx = lm_x_simplify(&L->g->x, flat, &ctx);
  /* an index inside the buffer wherever it is evaluated needs no guard: the load can then
   * be hoisted and shared (a SELECT still zeroes the padded positions) -- unless the guard
   * makes the index cheaper (fewer divisions: a padded window inside its image), where the
   * guard stays with the cheaper index */
  lm_expr guarded = lm_x_is_const(&L->g->x, valid, 1) ? s.idx : lm_x_simplify_guarded(&L->g->x, flat, valid, &ctx);
  if (lm_x_divmods(&L->g->x, guarded, -1, NULL, NULL) < lm_x_divmods(&L->g->x, s.idx, -1, NULL, NULL))
    s.idx = guarded;
  else if (!lm_x_is_const(&L->g->x, valid, 1) && lm_x_prove_ge(&L->g->x, s.idx, lm_x_const(&L->g->x, 0), &ctx) &&
           lm_x_prove_gt(&L->g->x, lm_shape_numel(L->g, shape), s.idx, &ctx))
    s.valid = valid = lm_x_const(&L->g->x, 1);
  if (!lm_kernel_use_buf(b->k, buf)) L->st = LM_ERR_NOMEM;
  return emit(b, s, lm_x_vars_used(&L->g->x, s.idx) | lm_x_vars_used(&L->g->x, valid), -1);
}

static uint32_t eval(kbuild *b, uint32_t node, const lm_expr *idx, lm_expr valid);

/* Unused loop of the chain at or above the deepest used one: evaluating here recomputes. */
static int recomputes(const kbuild *b, uint64_t used) {
  int32_t d = deepest(b, used, -2);
  if (d < 0) return 0;
  for (int32_t l = d; l >= 0; l = b->k->loops[l].parent)
    if (!(l < 64 && (used >> l) & 1)) return 1;
  return 0;
}

/* The guard of a select inside a value computed under `valid`: the value is used only where
 * valid holds (each enclosing guard has its own select, which gives 0 elsewhere whatever the
 * value), so the guard may be simplified as if valid held, where that saves divisions (a padded
 * observation's cells, read through a roll: inside the pad the roll's floor modulo is the
 * index itself). */
static lm_expr select_guard(kbuild *b, lm_expr sv, lm_expr valid) {
  lm_exprs *x = &b->L->g->x;
  if (lm_x_is_const(x, valid, 1)) return sv;
  lm_xctx ctx = ctx_of(b);
  lm_expr g = lm_x_simplify_guarded(x, sv, valid, &ctx);
  return lm_x_divmods(x, g, -1, NULL, NULL) < lm_x_divmods(x, sv, -1, NULL, NULL) ? g : sv;
}

static uint32_t compute(kbuild *b, uint32_t id, const lm_expr *idx, lm_expr valid) {
  lowering *L = b->L;
  lm_graph_t *g = L->g;
  const lm_node *n = &g->nodes[id];
  lm_op op = (lm_op)n->op;
  lm_xctx ctx = ctx_of(b);
  switch (op) {
  case LM_OP_CONST: return emit(b, (lm_stmt){.op = LM_S_CONST, .f = n->value}, 0, -1);
  case LM_OP_RAND: {
    lm_stmt s = {.op = LM_S_RAND, .stream = n->stream};
    s.idx = lm_x_simplify(&g->x, lm_shape_flat(g, &n->shape, idx), &ctx);
    return emit(b, s, lm_x_vars_used(&g->x, s.idx), -1);
  }
  case LM_OP_SUM_REDUCE:
  case LM_OP_MAX_REDUCE: {
    const lm_shape *ss = lm_edge_shape(g, n->src[0]);
    uint64_t used = lm_x_vars_used(&g->x, valid);
    for (int i = 0; i < n->shape.rank; i++) used |= lm_x_vars_used(&g->x, idx[i]);
    int32_t parent = deepest(b, used, -2);
    /* A long reduction nested inside another one (a hidden layer evaluated inside the next
     * layer's dot product) would leave a scalar dot product innermost: it gets a buffer of its
     * own, which the interchange then turns into a vectorised matmul. */
    const lm_xnode *rext = lm_x_node(&g->x, ss->dim[n->axis]);
    if (parent >= 0 && b->k->loops[parent].kind == LM_L_SERIAL && rext->op == LM_X_CONST &&
        rext->v >= NESTED_REDUCE_MIN && !L->mat[id]) {
      L->mat[id] = 1;
      L->restart = 1;
      return emit(b, (lm_stmt){.op = LM_S_CONST}, 0, -1);
    }
    int32_t saved = b->cur;
    int32_t lp = lm_kernel_add_loop_before(b->k, parent, open_child(b->k, saved, parent), ss->dim[n->axis], LM_L_SERIAL);
    if (lp < 0 || !LM_GROW(b->extent, b->extcap, b->k->nloops)) return L->st = LM_ERR_NOMEM, 0;
    b->extent[lp] = ss->dim[n->axis];
    lm_stmt acc = {.op = LM_S_ACC, .loop = parent, .f = op == LM_OP_SUM_REDUCE ? 0.0f : -INFINITY};
    uint32_t a = lm_kernel_add_stmt(b->k, &acc, lp);
    if (a == UINT32_MAX) return L->st = LM_ERR_NOMEM, 0;
    b->cur = lp;
    lm_expr full[LM_MAX_RANK], sidx[LM_MAX_RANK], sv;
    for (int i = 0, j = 0; i < ss->rank; i++) full[i] = i == n->axis ? lm_x_var(&g->x, lp) : idx[j++];
    ctx = ctx_of(b);
    lm_edge_index_nd(g, n->src[0], full, &ctx, sidx, &sv);
    lm_expr v2 = lm_x_simplify(&g->x, lm_x_and(&g->x, valid, sv), &ctx);
    uint32_t v = eval(b, n->src[0].node, sidx, v2);
    if (!lm_x_is_const(&g->x, sv, 1)) {
      sv = select_guard(b, sv, valid);
      lm_stmt sel = {.op = LM_S_SELECT, .a = v, .valid = sv};
      v = emit(b, sel, lm_x_vars_used(&g->x, sv), loop_of(b, v));
    }
    lm_stmt up = {.op = op == LM_OP_SUM_REDUCE ? LM_S_ACC_SUM : LM_S_ACC_MAX, .loop = lp, .a = a, .b = v};
    if (lm_kernel_add_stmt(b->k, &up, -1) == UINT32_MAX) L->st = LM_ERR_NOMEM;
    b->cur = saved;
    return a;
  }
  default: break;
  }
  uint32_t v[2] = {0, 0};
  for (int i = 0; i < n->nsrc; i++) {
    lm_expr sidx[LM_MAX_RANK], sv;
    ctx = ctx_of(b); /* evaluating an earlier operand may add loops and move b->extent */
    lm_edge_index_nd(g, n->src[i], idx, &ctx, sidx, &sv);
    lm_expr v2 = lm_x_simplify(&g->x, lm_x_and(&g->x, valid, sv), &ctx);
    v[i] = eval(b, n->src[i].node, sidx, v2);
    if (!lm_x_is_const(&g->x, sv, 1)) {
      sv = select_guard(b, sv, valid);
      lm_stmt sel = {.op = LM_S_SELECT, .a = v[i], .valid = sv};
      v[i] = emit(b, sel, lm_x_vars_used(&g->x, sv), loop_of(b, v[i]));
    }
  }
  if (op == LM_OP_CONTIGUOUS) return v[0];
  static const lm_sop sops[LM_OP_COUNT] = {
      [LM_OP_LOG2] = LM_S_LOG2, [LM_OP_EXP2] = LM_S_EXP2, [LM_OP_SIN] = LM_S_SIN,
      [LM_OP_SQRT] = LM_S_SQRT, [LM_OP_RECIP] = LM_S_RECIP, [LM_OP_ADD] = LM_S_ADD,
      [LM_OP_MUL] = LM_S_MUL,   [LM_OP_MOD] = LM_S_MOD,     [LM_OP_LESS_THAN] = LM_S_LT,
  };
  LM_ASSERT(sops[op] != 0);
  return op_stmt(b, sops[op], v[0], v[1]);
}

static uint32_t eval(kbuild *b, uint32_t id, const lm_expr *idx, lm_expr valid) {
  lowering *L = b->L;
  lm_graph_t *g = L->g;
  const lm_node *n = &g->nodes[id];
  int rank = n->shape.rank;
  if (L->st != LM_OK) return 0;
  /* A guard over none of the index's variables (padding around a per-env value, read across a
   * row's columns) cannot change which element is read: the value is the same at every point,
   * valid or not (a guard that holds nowhere has no variables left: it stays), so it is
   * computed unguarded, once, where its own index allows. */
  uint64_t gv = lm_x_vars_used(&g->x, valid);
  if (gv) {
    uint64_t iv = 0;
    for (int i = 0; i < rank; i++) iv |= lm_x_vars_used(&g->x, idx[i]);
    if (!(iv & gv)) valid = lm_x_const(&g->x, 1);
  }
  for (size_t i = 0; i < b->nmemo; i++) {
    const memo *m = &b->memo[i];
    if (m->node == id && m->valid == valid && !memcmp(m->idx, idx, (size_t)rank * sizeof *idx) &&
        on_chain(b->k, b->cur, loop_of(b, m->stmt)))
      return m->stmt;
  }
  uint32_t s;
  /* a cheap output is recomputed where it is used rather than read back from its buffer:
   * its consumers then do not depend on its kernel, and kernels over one domain merge */
  int recompute = L->out_only[id] && own_cost(L, id) < COST_SHARED;
  if (L->home[id] != UINT32_MAX && (n->op == LM_OP_INPUT || L->mat[id]) && !recompute) {
    s = load(b, L->home[id], &n->shape, idx, valid);
  } else {
    if (n->op != LM_OP_CONST && n->op != LM_OP_RAND && !L->cheap_const[id] && inline_cost(L, id) > COST_CHEAP) {
      uint64_t used = lm_x_vars_used(&g->x, valid);
      for (int i = 0; i < rank; i++) used |= lm_x_vars_used(&g->x, idx[i]);
      int shared_reduce = lm_op_table[n->op].reduce && L->uses[id] > 1;
      if (shared_reduce || recomputes(b, used)) {
        L->mat[id] = 1; /* worth a buffer: lower again with it materialised */
        L->restart = 1;
        return emit(b, (lm_stmt){.op = LM_S_CONST}, 0, -1);
      }
    }
    s = compute(b, id, idx, valid);
  }
  if (LM_GROW(b->memo, b->memocap, b->nmemo + 1)) {
    memo *m = &b->memo[b->nmemo++];
    memset(m, 0, sizeof *m);
    m->node = id;
    m->valid = valid;
    memcpy(m->idx, idx, (size_t)rank * sizeof *idx);
    m->stmt = s;
  }
  return s;
}

/* One kernel over `shape` that stores value(edge or node) into buffer `dst`. */
static void build_kernel(lowering *L, const char *name, uint32_t anchor, const lm_shape *shape, uint32_t node,
                         const lm_edge *edge, uint32_t dst) {
  lm_graph_t *g = L->g;
  lm_kernel *k = lm_plan_add_kernel(L->p, name);
  if (!k) {
    L->st = LM_ERR_NOMEM;
    return;
  }
  k->anchor = anchor;
  kbuild b = {.L = L, .k = k, .cur = -1};
  lm_expr idx[LM_MAX_RANK];
  for (int i = 0; i < shape->rank; i++) {
    int32_t lp = lm_kernel_add_loop(k, b.cur, shape->dim[i], LM_L_PARALLEL);
    if (lp < 0 || !LM_GROW(b.extent, b.extcap, k->nloops)) {
      L->st = LM_ERR_NOMEM;
      goto done;
    }
    b.extent[lp] = shape->dim[i];
    idx[i] = lm_x_var(&g->x, lp);
    b.cur = lp;
  }
  k->npar = shape->rank;
  lm_expr one = lm_x_const(&g->x, 1);
  uint32_t v;
  if (edge) {
    lm_xctx ctx = ctx_of(&b);
    lm_expr sidx[LM_MAX_RANK], sv;
    lm_edge_index_nd(g, *edge, idx, &ctx, sidx, &sv);
    v = eval(&b, edge->node, sidx, sv);
    if (!lm_x_is_const(&g->x, sv, 1)) {
      lm_stmt sel = {.op = LM_S_SELECT, .a = v, .valid = sv};
      v = emit(&b, sel, lm_x_vars_used(&g->x, sv), loop_of(&b, v));
    }
  } else {
    v = compute(&b, node, idx, one);
  }
  lm_xctx ctx = ctx_of(&b);
  lm_stmt st = {.op = LM_S_STORE, .a = v, .buf = dst, .valid = one};
  st.idx = lm_x_simplify(&g->x, lm_shape_flat(g, shape, idx), &ctx);
  if (!lm_kernel_use_buf(k, dst)) L->st = LM_ERR_NOMEM;
  st.loop = b.cur;
  if (lm_kernel_add_stmt(k, &st, -1) == UINT32_MAX) L->st = LM_ERR_NOMEM;
done:
  lm_free(b.extent);
  lm_free(b.memo);
}

static void reset_plan(lm_plan *p) {
  for (size_t i = 0; i < p->nkernels; i++) lm_kernel_free(&p->kernels[i]);
  p->nkernels = p->nbufs = p->ncopies = 0;
}

static void lower_once(lowering *L, const uint32_t *order, size_t norder) {
  lm_graph_t *g = L->g;
  lm_plan *p = L->p;
  reset_plan(p);
  for (size_t i = 0; i < g->nnodes; i++) L->home[i] = UINT32_MAX, L->cost[i] = -1;
  for (size_t i = 0; i < g->ninputs; i++) {
    uint32_t node = g->inputs[i].node;
    L->home[node] = add_buf(p, LM_BUF_INPUT, (uint32_t)i, node, lm_shape_numel(g, &g->nodes[node].shape));
  }
  uint32_t *outbuf = lm_calloc(g->noutputs + 1, sizeof *outbuf);
  if (!outbuf) {
    L->st = LM_ERR_NOMEM;
    return;
  }
  for (size_t i = 0; i < g->noutputs; i++) {
    lm_edge e = g->outputs[i].src;
    outbuf[i] = add_buf(p, LM_BUF_OUTPUT, (uint32_t)i, 0, lm_shape_numel(g, lm_edge_shape(g, e)));
    if (!e.view && g->nodes[e.node].op != LM_OP_INPUT && L->home[e.node] == UINT32_MAX) {
      L->home[e.node] = outbuf[i];
      p->bufs[outbuf[i]].node = e.node;
      if (!L->mat[e.node]) L->out_only[e.node] = 1;
      L->mat[e.node] = 1;
    }
  }
  for (size_t i = 0; i < norder; i++) {
    uint32_t id = order[i];
    if (!L->mat[id] || g->nodes[id].op == LM_OP_INPUT) continue;
    if (L->home[id] == UINT32_MAX)
      L->home[id] = add_buf(p, LM_BUF_TEMP, 0, id, lm_shape_numel(g, &g->nodes[id].shape));
    char name[32];
    snprintf(name, sizeof name, "k%zu_%s", p->nkernels, lm_op_name((lm_op)g->nodes[id].op));
    build_kernel(L, name, id, &g->nodes[id].shape, id, NULL, L->home[id]);
    if (L->restart || L->st) goto done;
  }
  for (size_t i = 0; i < g->noutputs; i++) {
    lm_edge e = g->outputs[i].src;
    if (L->home[e.node] == outbuf[i]) continue;
    char name[32];
    snprintf(name, sizeof name, "k%zu_out%zu", p->nkernels, i);
    build_kernel(L, name, 0, lm_edge_shape(g, e), 0, &e, outbuf[i]);
    if (L->restart || L->st) goto done;
  }
  for (size_t i = 0; i < g->nassigns; i++) {
    lm_edge e = g->assigns[i].src;
    const lm_node *t = &g->nodes[g->assigns[i].target];
    uint32_t src;
    if (!e.view && L->home[e.node] != UINT32_MAX && g->nodes[e.node].op != LM_OP_INPUT) {
      src = L->home[e.node];
    } else {
      src = add_buf(p, LM_BUF_TEMP, 0, 0, lm_shape_numel(g, &t->shape));
      char name[32];
      snprintf(name, sizeof name, "k%zu_assign%zu", p->nkernels, i);
      build_kernel(L, name, 0, &t->shape, 0, &e, src);
      if (L->restart || L->st) goto done;
    }
    if (!LM_GROW(p->copies, p->copycap, p->ncopies + 1)) {
      L->st = LM_ERR_NOMEM;
      goto done;
    }
    p->copies[p->ncopies++] = (lm_copy){L->home[g->assigns[i].target], src, lm_shape_numel(g, &t->shape)};
  }
done:
  lm_free(outbuf);
}

void lm_plan_liveness(lm_plan *p) {
  for (size_t b = 0; b < p->nbufs; b++) p->bufs[b].first = p->bufs[b].last = -1;
  for (size_t ki = 0; ki < p->nkernels; ki++) {
    const lm_kernel *k = &p->kernels[ki];
    for (size_t i = 0; i < k->nbufs; i++) {
      lm_pbuf *b = &p->bufs[k->bufs[i]];
      if (b->first < 0) b->first = (int)ki;
      b->last = (int)ki;
    }
  }
  /* assign sources are read by the copies after the last kernel */
  for (size_t i = 0; i < p->ncopies; i++) p->bufs[p->copies[i].src].last = (int)p->nkernels;
}

/* ---------------------------------------------------------------- assigns stored in place */

/* Does statement `from` reach statement `to` through operands (is `to`'s value computed from
 * it)? */
static int feeds(const lm_kernel *k, uint32_t from, uint32_t to, uint8_t *seen) {
  if (from == to) return 1;
  if (seen[to]) return 0;
  seen[to] = 1;
  const lm_stmt *s = &k->stmts[to];
  int ops = lm_sop_operands(s->op);
  return ((ops & LM_OPND_A) && feeds(k, from, s->a, seen)) || ((ops & LM_OPND_B) && feeds(k, from, s->b, seen));
}

/* Every iteration of the loops around statement s (constant extents, `when` tests honoured)
 * stores a different element: marks them in `hit` (numel long); 0 when two meet, an extent or
 * an index names a symbol, or there are over 2^22 iterations. */
static int stores_once(const lm_exprs *x, const lm_kernel *k, const lm_stmt *s, uint8_t *hit, int64_t numel) {
  int32_t chain[64];
  int depth = 0;
  if (lm_x_syms_used(x, s->idx) | (s->valid ? lm_x_syms_used(x, s->valid) : 0)) return 0;
  for (int32_t l = s->loop; l >= 0; l = k->loops[l].parent) {
    const lm_loop *lp = &k->loops[l];
    if (depth == 64 || lm_x_node(x, lp->extent)->op != LM_X_CONST || (lp->when && lm_x_syms_used(x, lp->when))) return 0;
    chain[depth++] = l;
  }
  int64_t *vars = lm_calloc(k->nloops + 1, sizeof *vars), iters = 0;
  int ok = vars != NULL;
  for (int more = ok; more;) {
    int run = 1;
    for (int d = 0; d < depth && run; d++)
      if (k->loops[chain[d]].when) run = lm_x_eval(x, k->loops[chain[d]].when, vars, NULL) != 0;
    if (run && (!s->valid || lm_x_eval(x, s->valid, vars, NULL))) {
      int64_t i = lm_x_eval(x, s->idx, vars, NULL);
      if (i < 0 || i >= numel || hit[i] || ++iters > (int64_t)1 << 22) ok = more = 0;
      else hit[i] = 1;
    }
    int d = 0; /* the next iteration, innermost loop first */
    for (; more && d < depth; d++) {
      int32_t l = chain[d];
      if (++vars[l] < lm_x_node(x, k->loops[l].extent)->v) break;
      vars[l] = 0;
    }
    if (d == depth) more = 0;
  }
  lm_free(vars);
  return ok;
}

/* Can kernel K store src's values into dst (an assign's copy dst <- src, K the only writer of
 * src) and the copy go? No kernel reads src before K (its reads in and after K then read dst,
 * which holds the same values from the store on), none after K reads dst; each store of src
 * writes a different element, and every read of dst in K is at a store's element, in its loop,
 * before it: the store's value is computed from it (an optimiser's w' = w - lr * ...). */
static int assign_in_place_ok(const lm_plan *p, size_t c, size_t *kout) {
  const lm_copy *cp = &p->copies[c];
  const lm_exprs *x = &p->g->x;
  const lm_pbuf *src = &p->bufs[cp->src], *dst = &p->bufs[cp->dst];
  if (src->kind != LM_BUF_TEMP || dst->kind != LM_BUF_INPUT || src->numel != dst->numel ||
      lm_x_node(x, dst->numel)->op != LM_X_CONST)
    return 0;
  for (size_t j = 0; j < p->ncopies; j++)
    if (j != c && (p->copies[j].src == cp->src || p->copies[j].src == cp->dst || p->copies[j].dst == cp->dst)) return 0;
  size_t K = p->nkernels;
  for (size_t ki = 0; ki < p->nkernels; ki++) {
    const lm_kernel *k = &p->kernels[ki];
    if (lm_kernel_writes_buf(k, cp->dst)) return 0;
    if (lm_kernel_writes_buf(k, cp->src)) {
      if (K < p->nkernels) return 0;
      K = ki;
    }
    for (size_t i = 0; i < k->nstmts; i++) {
      const lm_stmt *s = &k->stmts[i];
      if (s->op != LM_S_LOAD || s->local) continue;
      if ((s->buf == cp->src && K == p->nkernels) || (s->buf == cp->dst && K < p->nkernels && ki > K)) return 0;
    }
  }
  if (K == p->nkernels) return 0;
  const lm_kernel *k = &p->kernels[K];
  int64_t numel = lm_x_node(x, dst->numel)->v;
  uint8_t *hit = lm_calloc((size_t)numel + 1, 1), *seen = lm_calloc(k->nstmts + 1, 1);
  int ok = hit && seen;
  for (size_t i = 0; i < k->nstmts && ok; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op == LM_S_STORE && !s->local && s->buf == cp->src) ok = stores_once(x, k, s, hit, numel);
    if (s->op != LM_S_LOAD || s->local || s->buf != cp->dst) continue;
    int matched = 0; /* a store of src at its element, in its loop, computed from it */
    for (size_t j = 0; j < k->nstmts && !matched; j++) {
      const lm_stmt *t = &k->stmts[j];
      if (t->op != LM_S_STORE || t->local || t->buf != cp->src || t->loop != s->loop || t->idx != s->idx ||
          t->valid != s->valid)
        continue;
      memset(seen, 0, k->nstmts);
      matched = feeds(k, (uint32_t)i, (uint32_t)j, seen);
    }
    ok = matched;
  }
  lm_free(hit);
  lm_free(seen);
  *kout = K;
  return ok;
}

int lm_plan_assign_in_place(lm_plan *p) {
  int done = 0;
  for (size_t c = 0; c < p->ncopies;) {
    size_t K;
    if (!assign_in_place_ok(p, c, &K)) {
      c++;
      continue;
    }
    uint32_t src = p->copies[c].src, dst = p->copies[c].dst;
    for (size_t ki = K; ki < p->nkernels; ki++) {
      lm_kernel *k = &p->kernels[ki];
      int had = 0;
      for (size_t i = 0; i < k->nstmts; i++) {
        lm_stmt *s = &k->stmts[i];
        if ((s->op == LM_S_STORE || s->op == LM_S_LOAD) && !s->local && s->buf == src) s->buf = dst, had = 1;
      }
      if (!had) continue;
      size_t at = 0; /* src leaves the kernel's buffers, dst joins them (ascending) */
      int have_dst = 0;
      for (size_t i = 0; i < k->nbufs; i++) have_dst |= k->bufs[i] == dst;
      for (size_t i = 0; i < k->nbufs; i++)
        if (k->bufs[i] != src) k->bufs[at++] = k->bufs[i];
      k->nbufs = at;
      if (!have_dst && !lm_kernel_use_buf(k, dst)) return -1;
    }
    memmove(&p->copies[c], &p->copies[c + 1], (p->ncopies - c - 1) * sizeof *p->copies);
    p->ncopies--;
    done++;
  }
  if (done) lm_plan_liveness(p);
  return done;
}

/* Nodes that depend on constants only, with their work (elements visited) under CONST_WORK. */
static void mark_cheap_consts(lowering *L, const uint32_t *order, size_t norder) {
  lm_graph_t *g = L->g;
  double *work = lm_calloc(g->nnodes, sizeof *work);
  if (!work) return; /* an optimisation only */
  for (size_t k = 0; k < norder; k++) {
    uint32_t i = order[k];
    const lm_node *n = &g->nodes[i];
    if (n->op == LM_OP_CONST) {
      work[i] = 1;
      L->cheap_const[i] = 1;
      continue;
    }
    if (n->op == LM_OP_INPUT || n->op == LM_OP_RAND) continue;
    int konst = 1;
    double w = 1;
    for (int s = 0; s < n->nsrc; s++) {
      konst &= L->cheap_const[n->src[s].node];
      w += work[n->src[s].node];
    }
    if (konst && lm_op_table[n->op].reduce) {
      const lm_xnode *ext = lm_x_node(&g->x, lm_edge_shape(g, n->src[0])->dim[n->axis]);
      w = ext->op == LM_X_CONST ? w * (double)(ext->v > 0 ? ext->v : 1) : 1e30;
    }
    work[i] = w;
    L->cheap_const[i] = (uint8_t)(konst && w <= CONST_WORK);
  }
  lm_free(work);
}

lm_status lm_lower(lm_graph_t *g, lm_plan **out) {
  *out = NULL;
  lowering L = {.g = g};
  size_t norder = 0;
  uint32_t *order = lm_graph_topo_order(g, &norder);
  L.p = lm_calloc(1, sizeof *L.p);
  L.mat = lm_calloc(g->nnodes, 1);
  L.home = lm_calloc(g->nnodes, sizeof *L.home);
  L.uses = lm_calloc(g->nnodes, sizeof *L.uses);
  L.cost = lm_calloc(g->nnodes, sizeof *L.cost);
  L.cheap_const = lm_calloc(g->nnodes, 1);
  L.out_only = lm_calloc(g->nnodes, 1);
  if (!order || !L.p || !L.mat || !L.home || !L.uses || !L.cost || !L.cheap_const || !L.out_only) {
    L.st = order ? LM_ERR_NOMEM : LM_ERR_INVALID;
    goto done;
  }
  L.p->g = g;
  for (size_t i = 1; i < g->nnodes; i++) {
    const lm_node *n = &g->nodes[i];
    for (int k = 0; k < n->nsrc; k++) L.uses[n->src[k].node]++;
    if (n->op == LM_OP_CONTIGUOUS) L.mat[i] = 1;
  }
  for (size_t i = 0; i < g->noutputs; i++) L.uses[g->outputs[i].src.node]++;
  for (size_t i = 0; i < g->nassigns; i++) {
    lm_edge e = g->assigns[i].src;
    L.uses[e.node]++;
    if (!e.view && g->nodes[e.node].op != LM_OP_INPUT) L.mat[e.node] = 1;
  }
  mark_cheap_consts(&L, order, norder);
  /* shared work: computed once into a buffer rather than once per use */
  uint8_t *red = lm_calloc(g->nnodes, 1); /* a reduction is inlined inside this node */
  for (size_t k = 0; red && k < norder; k++) {
    uint32_t i = order[k];
    const lm_node *n = &g->nodes[i];
    red[i] = lm_op_table[n->op].reduce;
    for (int j = 0; j < n->nsrc; j++) red[i] |= red[n->src[j].node] && !L.mat[n->src[j].node];
    if (L.mat[i] || L.cheap_const[i] || L.uses[i] < 2 || n->op == LM_OP_INPUT || !red[i]) continue;
    L.mat[i] = 1;
    red[i] = 0;
  }
  lm_free(red);
  do {
    L.restart = 0;
    lower_once(&L, order, norder);
  } while (L.restart && L.st == LM_OK);
  if (L.st == LM_OK && g->x.failed) L.st = LM_ERR_NOMEM;
  if (L.st == LM_OK) lm_plan_liveness(L.p);
done:
  lm_free(order);
  lm_free(L.mat);
  lm_free(L.home);
  lm_free(L.uses);
  lm_free(L.cost);
  lm_free(L.cheap_const);
  lm_free(L.out_only);
  if (L.st != LM_OK) {
    lm_plan_free(L.p);
    return L.st == LM_ERR_NOMEM ? lm_fail(LM_ERR_NOMEM, "out of memory lowering the graph") : L.st;
  }
  *out = L.p;
  return LM_OK;
}

/* ---------------------------------------------------------------- text */

static const char *const sop_names[LM_S_COUNT] = {
    "const", "load", "rand", "log2", "exp2", "sin",  "sqrt",    "recip",   "add",
    "mul",   "mod",  "lt",   "max",    "select", "acc", "acc_sum", "acc_max", "store", "barrier", "warp_sum", "warp_max", "index",
};
_Static_assert(sizeof sop_names / sizeof sop_names[0] == LM_S_COUNT, "sop_names covers every statement op");

static void dump_block(const lm_plan *p, const lm_kernel *k, const lm_block *b, int depth, lm_sb *sb) {
  const lm_exprs *x = &p->g->x;
  for (size_t i = 0; i < b->n; i++) {
    lm_sb_printf(sb, "%*s", 2 * depth + 2, "");
    if (b->items[i].is_loop) {
      const lm_loop *l = &k->loops[b->items[i].id];
      static const char *const kinds[LM_L_COUNT] = {"par", "for", "lanes", "sparse", "vec"};
      if (l->when) { /* a stacked kernel's member */
        lm_sb_puts(sb, "if ");
        lm_x_print(x, l->when, sb, "i");
        lm_sb_puts(sb, ":\n");
        dump_block(p, k, &l->body, depth + 1, sb);
        continue;
      }
      lm_sb_printf(sb, "%s i%u < ", kinds[l->kind], b->items[i].id);
      lm_x_print(x, l->stop ? l->stop : l->extent, sb, "i");
      if (l->kind == LM_L_SPARSE) lm_sb_printf(sb, " where l%u", l->mask);
      lm_sb_puts(sb, ":\n");
      dump_block(p, k, &l->body, depth + 1, sb);
      continue;
    }
    uint32_t id = b->items[i].id;
    const lm_stmt *s = &k->stmts[id];
    lm_sb_printf(sb, "v%u = %s", id, sop_names[s->op]);
    switch (s->op) {
    case LM_S_CONST:
    case LM_S_ACC: lm_sb_printf(sb, " %g", (double)s->f); break;
    case LM_S_INDEX:
      lm_sb_puts(sb, " [");
      lm_x_print(x, s->idx, sb, "i");
      lm_sb_puts(sb, "]");
      break;
    case LM_S_LOAD:
    case LM_S_STORE:
    case LM_S_RAND:
      if (s->op == LM_S_RAND) lm_sb_printf(sb, " stream %u [", s->stream);
      else lm_sb_printf(sb, " %s%u[", s->local ? "l" : "b", s->buf);
      lm_x_print(x, s->idx, sb, "i");
      lm_sb_puts(sb, "]");
      if (s->op == LM_S_STORE) lm_sb_printf(sb, " = v%u", s->a);
      break;
    case LM_S_SELECT: lm_sb_printf(sb, " v%u", s->a); break;
    case LM_S_BARRIER: break;
    default:
      lm_sb_printf(sb, " v%u", s->a);
      if (s->op >= LM_S_ADD || s->op == LM_S_ACC_SUM) lm_sb_printf(sb, " v%u", s->b);
    }
    if ((s->op == LM_S_LOAD || s->op == LM_S_SELECT) && !lm_x_is_const(x, s->valid, 1)) {
      lm_sb_puts(sb, " if ");
      lm_x_print(x, s->valid, sb, "i");
    }
    lm_sb_puts(sb, "\n");
  }
}

void lm_plan_dump(const lm_plan *p, lm_sb *sb) {
  static const char *const kinds[LM_BUF_COUNT] = {"input", "output", "temp"};
  for (size_t i = 0; i < p->nbufs; i++) {
    lm_sb_printf(sb, "b%zu: %s", i, kinds[p->bufs[i].kind]);
    if (p->bufs[i].kind != LM_BUF_TEMP) lm_sb_printf(sb, " %u", p->bufs[i].index);
    lm_sb_puts(sb, " numel ");
    lm_x_print(&p->g->x, p->bufs[i].numel, sb, "i");
    lm_sb_printf(sb, " live %d..%d\n", p->bufs[i].first, p->bufs[i].last);
  }
  for (size_t i = 0; i < p->nkernels; i++) {
    const lm_kernel *k = &p->kernels[i];
    lm_sb_printf(sb, "kernel %s (npar %d", k->name, k->npar);
    if (k->group) lm_sb_printf(sb, ", work-groups of %d", k->group);
    if (k->contract) lm_sb_puts(sb, ", fma");
    if (k->finite) lm_sb_puts(sb, ", finite");
    for (size_t l = 0; l < k->nlocals; l++)
      if (l < k->nshared && k->shared[l]) lm_sb_printf(sb, ", l%zu[%lld] shared", l, (long long)k->locals[l]);
    lm_sb_puts(sb, "):\n");
    dump_block(p, k, &k->root, 0, sb);
  }
  for (size_t i = 0; i < p->ncopies; i++) lm_sb_printf(sb, "copy b%u <- b%u\n", p->copies[i].dst, p->copies[i].src);
}
