/* compiler/gpu.c — work-group schedules for the GPU dialects (CUDA, OpenCL C, MSL). The
 * default GPU mapping is one thread per point of a kernel's parallel domain; two kernels gain
 * from threads that cooperate through work-group shared memory:
 *
 * Matmul-shaped kernels (par ..., i, j: acc = sum over k of f(A(i,k), B(k,j)); tail; store)
 * become 16x16 output tiles, one work-group of 256 threads each; the threads copy a 16xTK
 * tile of every A-like operand and a TKx16 tile of every B-like one into shared arrays, wait
 * at a barrier, and each accumulates its element from the shared tiles:
 *   group (gi, gj), thread t: i = 16 gi + t/16, j = 16 gj + t%16
 *     acc = 0
 *     for kk: As[t] = A(16 gi + t/TK, TK kk + t%TK); Bs[t] = B(TK kk + t/16, 16 gj + t%16)
 *             barrier; for k2 < TK: acc += f(As[(t/16) TK + k2], Bs[k2 16 + t%16]); barrier
 *     tail; store where i and j are in range
 * Each element still sums its terms in k order from +0: bitwise the value of the plain kernel
 * (where the tile does not divide k, the terms past the end add +0.0, which changes no sum
 * that starts at +0; max reductions are tiled only where the tile divides k).
 *
 * Env-local kernels with serial loops inside (a fused scan: the whole rollout) keep one
 * thread per env but stage the read-only arrays every env reads alike (the policy's weights)
 * in shared memory once per work-group, so the time loop's matvecs read shared memory:
 *   group g, thread t: for r: W'[r G + t] = W[r G + t]; barrier; env = g G + t: the step loop
 * Accesses that name the env are guarded by env < E (the last group may be partial).
 *
 * Both schedules leave the arithmetic and its order unchanged: results are bitwise those of
 * the default mapping.
 *
 * Long reductions (512+ terms or a symbolic count) under the innermost parallel loop that no
 * tile took get a work-group of 256 threads per output: strided partials, then a tree of
 * barriers in shared memory (the GPU's usual reduction). A sum's terms are then added in a
 * different order: it rounds differently from the sequential loop (within n eps sum |x|). */
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

enum { TILE = 16, TK_MAX = 16, THREADS = TILE * TILE, MAX_TILED_LOADS = 8 };

typedef struct gb {
  const lm_plan *p;
  const lm_kernel *k; /* old */
  lm_kernel *n;       /* new */
  lm_exprs *x;
  lm_expr *vmap;      /* old loop variable -> expression in the new kernel */
  uint32_t *smap;     /* old statement -> new statement */
  int ok;
} gb;

static uint32_t add(gb *b, lm_stmt s) {
  uint32_t id = lm_kernel_add_stmt(b->n, &s, -1);
  if (id == UINT32_MAX) b->ok = 0;
  return id == UINT32_MAX ? 0 : id;
}

static int32_t loop(gb *b, int32_t parent, lm_expr extent, lm_loopkind kind) {
  int32_t l = lm_kernel_add_loop(b->n, parent, extent, kind);
  if (l < 0) b->ok = 0;
  return l;
}

static lm_expr remap(gb *b, lm_expr e) {
  return e ? lm_x_simplify(b->x, lm_x_subst(b->x, e, b->vmap, (int)b->k->nloops), NULL) : 0;
}

static lm_expr and_(lm_exprs *x, lm_expr a, lm_expr c) {
  if (!a || lm_x_is_const(x, a, 1)) return c;
  return lm_x_and(x, a, c);
}

static int uses(const lm_exprs *x, lm_expr e, int32_t var) {
  return e && var >= 0 && var < 64 && ((lm_x_vars_used(x, e) >> var) & 1);
}

/* The root block and the blocks of parallel loops 0..last-1 hold nothing but the next loop
 * and statements that store nothing (the shape both work-group rewrites start from). */
static int outer_blocks_plain(const lm_kernel *k, int32_t last) {
  for (int32_t l = -1; l < last; l++) {
    const lm_block *bl = l < 0 ? &k->root : &k->loops[l].body;
    for (size_t i = 0; i < bl->n; i++) {
      lm_item it = bl->items[i];
      if (it.is_loop ? (int32_t)it.id != l + 1 : k->stmts[it.id].op == LM_S_STORE) return 0;
    }
  }
  return 1;
}

/* A copy of old statement s in loop `at`: operands mapped, expressions remapped, and loads and
 * stores of global buffers guarded by `guard` where they name a variable in `guarded` (a bit
 * mask of old loop variables). */
static uint32_t copy(gb *b, uint32_t old, int32_t at, lm_expr guard, uint64_t guarded) {
  lm_stmt s = b->k->stmts[old];
  int m = lm_sop_operands(s.op);
  if (m & LM_OPND_A) s.a = b->smap[s.a];
  if (m & LM_OPND_B) s.b = b->smap[s.b];
  s.loop = at;
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && !s.local) {
    uint64_t v = lm_x_vars_used(b->x, s.idx) | (s.valid ? lm_x_vars_used(b->x, s.valid) : 0);
    if (guard && (v & guarded)) s.valid = and_(b->x, remap(b, s.valid), guard);
    else s.valid = remap(b, s.valid);
    if (!lm_kernel_use_buf(b->n, s.buf)) b->ok = 0;
  } else s.valid = remap(b, s.valid);
  s.idx = remap(b, s.idx);
  s.step = remap(b, s.step);
  return b->smap[old] = add(b, s);
}

static lm_expr ceil_div(lm_exprs *x, lm_expr a, int64_t d) {
  return lm_x_simplify(x, lm_x_div(x, lm_x_add(x, a, lm_x_const(x, d - 1)), lm_x_const(x, d)), NULL);
}

/* A builder of a new kernel n from k (its local arrays copied); b is always set up for finish. */
static lm_status start(gb *b, const lm_plan *p, const lm_kernel *k, lm_kernel *n) {
  memset(n, 0, sizeof *n);
  *b = (gb){.p = p, .k = k, .n = n, .x = &p->g->x, .ok = 1};
  b->vmap = lm_calloc(k->nloops + 1, sizeof *b->vmap);
  b->smap = lm_calloc(k->nstmts + 1, sizeof *b->smap);
  memcpy(n->name, k->name, sizeof n->name);
  n->anchor = k->anchor;
  for (size_t i = 0; i < k->nlocals && b->vmap && b->smap; i++)
    if (lm_kernel_add_local(n, k->locals[i], 0) == UINT32_MAX) b->ok = 0;
  return b->vmap && b->smap ? LM_OK : LM_ERR_NOMEM;
}

/* Frees the builder; 1 when the new kernel is complete (else it is freed too). */
static int finish(gb *b) {
  lm_free(b->vmap);
  lm_free(b->smap);
  int ok = b->ok && !b->x->failed;
  if (!ok) lm_kernel_free(b->n);
  return ok;
}

/* ---------------------------------------------------------------- matmul tiles */

typedef struct mm {
  int32_t I, J, R;           /* old loops: the last two parallel ones and the reduction */
  int nA, nB;
  uint32_t A[MAX_TILED_LOADS], B[MAX_TILED_LOADS]; /* old LOADs read through tiles */
  uint32_t sA[MAX_TILED_LOADS], sB[MAX_TILED_LOADS]; /* their shared arrays in the new kernel */
  int64_t tk;
} mm;

/* Which role a load inside the reduction plays: 1 A-like (i, k), 2 B-like (k, j), 0 neither
 * i nor j, -1 both (not tileable). */
static int role(const gb *b, const mm *q, const lm_stmt *s) {
  int ui = uses(b->x, s->idx, q->I) || uses(b->x, s->valid, q->I);
  int uj = uses(b->x, s->idx, q->J) || uses(b->x, s->valid, q->J);
  return ui && uj ? -1 : ui ? 1 : uj ? 2 : 0;
}

static int tileable(gb *b, mm *q) {
  const lm_kernel *k = b->k;
  if (k->group || k->npar < 2 || k->nlocals) return 0;
  q->I = k->npar - 2, q->J = k->npar - 1, q->R = -1;
  if (!outer_blocks_plain(k, q->J)) return 0;
  const lm_block *jb = &k->loops[q->J].body;
  for (size_t i = 0; i < jb->n; i++) {
    lm_item it = jb->items[i];
    if (!it.is_loop) continue;
    if (q->R >= 0 || k->loops[it.id].kind != LM_L_SERIAL) return 0;
    q->R = (int32_t)it.id;
  }
  if (q->R < 0) return 0;
  const lm_block *rb = &k->loops[q->R].body;
  int has_max = 0;
  for (size_t i = 0; i < rb->n; i++) {
    lm_item it = rb->items[i];
    if (it.is_loop) return 0;
    const lm_stmt *s = &k->stmts[it.id];
    if (s->op == LM_S_STORE || s->op == LM_S_ACC || s->op == LM_S_BARRIER || (s->op == LM_S_LOAD && s->local)) return 0;
    if (s->op == LM_S_ACC_MAX) has_max = 1;
    if (s->op != LM_S_LOAD) continue;
    int r = role(b, q, s);
    if (r < 0 || lm_kernel_writes_buf(k, s->buf)) return 0;
    if (r == 1 && q->nA < MAX_TILED_LOADS) q->A[q->nA++] = it.id;
    else if (r == 2 && q->nB < MAX_TILED_LOADS) q->B[q->nB++] = it.id;
    else if (r) return 0;
  }
  if (!q->nA || !q->nB) return 0; /* nothing shared between the threads of a tile */
  lm_expr K = k->loops[q->R].extent;
  const lm_xnode *kn = lm_x_node(b->x, K);
  q->tk = kn->op == LM_X_CONST && kn->v < TK_MAX ? kn->v : TK_MAX;
  if (q->tk < 1) return 0;
  /* a max cannot absorb padding terms: only when the tile divides k */
  lm_expr tkx = lm_x_const(b->x, q->tk);
  if (has_max && !lm_x_prove_eq(b->x, lm_x_mul(b->x, lm_x_div(b->x, K, tkx), tkx), K)) return 0;
  return 1;
}

static void tile(gb *b, mm *q) {
  const lm_kernel *k = b->k;
  lm_exprs *x = b->x;
  lm_kernel *n = b->n;
  lm_expr one = lm_x_const(x, 1), T = lm_x_const(x, TILE), TK = lm_x_const(x, q->tk);
  lm_expr EI = k->loops[q->I].extent, EJ = k->loops[q->J].extent, K = k->loops[q->R].extent;
  /* the grid: outer parallel loops, then tile rows and columns; then the threads */
  int32_t parent = -1;
  for (int32_t l = 0; l < q->I && b->ok; l++) {
    parent = loop(b, parent, k->loops[l].extent, LM_L_PARALLEL);
    b->vmap[l] = lm_x_var(x, parent);
  }
  int32_t gi = loop(b, parent, ceil_div(x, EI, TILE), LM_L_PARALLEL);
  int32_t gj = gi < 0 ? -1 : loop(b, gi, ceil_div(x, EJ, TILE), LM_L_PARALLEL);
  int32_t th = gj < 0 ? -1 : loop(b, gj, lm_x_const(x, THREADS), LM_L_PARALLEL);
  if (th < 0) return;
  n->npar = k->npar + 1;
  n->group = THREADS;
  lm_expr t = lm_x_var(x, th), ti = lm_x_div(x, t, T), tj = lm_x_mod(x, t, T);
  lm_expr iv = lm_x_add(x, lm_x_mul(x, lm_x_var(x, gi), T), ti), jv = lm_x_add(x, lm_x_mul(x, lm_x_var(x, gj), T), tj);
  lm_expr in_ij = lm_x_simplify(x, lm_x_and(x, lm_x_lt(x, iv, EI), lm_x_lt(x, jv, EJ)), NULL);
  b->vmap[q->I] = iv;
  b->vmap[q->J] = jv;
  uint64_t ij = ((uint64_t)1 << q->I) | ((uint64_t)1 << q->J);
  /* everything outside the reduction loop, in order, into the thread's block */
  for (int32_t l = -1; l <= q->J && b->ok; l++) {
    const lm_block *bl = l < 0 ? &k->root : &k->loops[l].body;
    for (size_t i = 0; i < bl->n && b->ok; i++) {
      lm_item it = bl->items[i];
      if (it.is_loop && (int32_t)it.id != q->R) continue;
      if (!it.is_loop) {
        copy(b, it.id, th, in_ij, ij); /* root statements too: pure, per thread */
        continue;
      }
      /* the reduction: tiles of TK terms */
      int32_t kk = loop(b, th, ceil_div(x, K, q->tk), LM_L_SERIAL);
      if (kk < 0) return;
      lm_expr kkv = lm_x_var(x, kk);
      for (int s = 0; s < q->nA + q->nB && b->ok; s++) { /* cooperative copies into the tiles */
        int isA = s < q->nA;
        uint32_t ld = isA ? q->A[s] : q->B[s - q->nA];
        int64_t cells = TILE * q->tk;
        uint32_t arr = lm_kernel_add_local(n, cells, 1);
        if (arr == UINT32_MAX) {
          b->ok = 0;
          return;
        }
        if (isA) q->sA[s] = arr;
        else q->sB[s - q->nA] = arr;
        for (int64_t r0 = 0; r0 < cells && b->ok; r0 += THREADS) {
          lm_expr e = lm_x_add(x, t, lm_x_const(x, r0));
          lm_expr row, col;
          if (isA) row = lm_x_add(x, lm_x_mul(x, lm_x_var(x, gi), T), lm_x_div(x, e, TK)), col = lm_x_mod(x, e, TK);
          else row = lm_x_div(x, e, T), col = lm_x_add(x, lm_x_mul(x, lm_x_var(x, gj), T), lm_x_mod(x, e, T));
          lm_expr kv = lm_x_add(x, lm_x_mul(x, kkv, TK), isA ? col : row), other = isA ? row : col;
          lm_expr save_i = b->vmap[q->I], save_j = b->vmap[q->J];
          b->vmap[q->R] = kv;
          if (isA) b->vmap[q->I] = other;
          else b->vmap[q->J] = other;
          const lm_stmt *o = &k->stmts[ld];
          lm_expr ok = lm_x_and(x, lm_x_lt(x, kv, K), lm_x_lt(x, other, isA ? EI : EJ));
          if (r0 + THREADS > cells) ok = lm_x_and(x, ok, lm_x_lt(x, e, lm_x_const(x, cells)));
          lm_stmt l2 = {.op = LM_S_LOAD, .loop = kk, .buf = o->buf, .idx = remap(b, o->idx),
                        .valid = lm_x_simplify(x, and_(x, remap(b, o->valid), ok), NULL)};
          if (!lm_kernel_use_buf(n, o->buf)) b->ok = 0;
          uint32_t v = add(b, l2);
          lm_expr in_cells = r0 + THREADS > cells ? lm_x_lt(x, e, lm_x_const(x, cells)) : one;
          lm_stmt st = {.op = LM_S_STORE, .loop = kk, .buf = arr, .local = 1, .idx = lm_x_simplify(x, e, NULL),
                        .a = v, .valid = lm_x_simplify(x, in_cells, NULL)};
          add(b, st);
          b->vmap[q->I] = save_i, b->vmap[q->J] = save_j;
        }
      }
      add(b, (lm_stmt){.op = LM_S_BARRIER, .loop = kk});
      int32_t k2 = loop(b, kk, TK, LM_L_SERIAL);
      if (k2 < 0) return;
      lm_expr kv = lm_x_add(x, lm_x_mul(x, kkv, TK), lm_x_var(x, k2));
      b->vmap[q->R] = kv;
      lm_expr in_k = lm_x_simplify(x, lm_x_lt(x, kv, K), NULL);
      int ragged = !lm_x_is_const(x, in_k, 1) &&
                   !lm_x_prove_eq(x, lm_x_mul(x, lm_x_div(x, K, TK), TK), K);
      const lm_block *rb = &k->loops[q->R].body;
      for (size_t ri = 0; ri < rb->n && b->ok; ri++) {
        uint32_t sid = rb->items[ri].id;
        const lm_stmt *o = &k->stmts[sid];
        int tiled = -1, isA = 0;
        for (int s = 0; s < q->nA; s++)
          if (q->A[s] == sid) tiled = s, isA = 1;
        for (int s = 0; s < q->nB; s++)
          if (q->B[s] == sid) tiled = s;
        if (tiled >= 0) {
          lm_expr idx = isA ? lm_x_add(x, lm_x_mul(x, ti, TK), lm_x_var(x, k2))
                            : lm_x_add(x, lm_x_mul(x, lm_x_var(x, k2), T), tj);
          lm_stmt l2 = {.op = LM_S_LOAD, .loop = k2, .buf = isA ? q->sA[tiled] : q->sB[tiled], .local = 1,
                        .idx = lm_x_simplify(x, idx, NULL), .valid = one};
          b->smap[sid] = add(b, l2);
        } else if ((o->op == LM_S_ACC_SUM) && ragged) { /* past the end of k: add +0 */
          lm_stmt sel = {.op = LM_S_SELECT, .loop = k2, .a = b->smap[o->b], .valid = in_k};
          lm_stmt up = *o;
          up.loop = k2;
          up.b = add(b, sel);
          up.a = b->smap[o->a];
          b->smap[sid] = add(b, up);
        } else {
          lm_expr kguard = ragged ? in_k : 0;
          copy(b, sid, k2, kguard, (uint64_t)1 << q->R);
        }
      }
      add(b, (lm_stmt){.op = LM_S_BARRIER, .loop = kk});
    }
  }
}

/* ---------------------------------------------------------------- staged uniform arrays */

typedef struct st {
  uint8_t *stage;      /* per plan buffer: staged */
  uint32_t *arr;       /* per plan buffer: its shared array */
} st_t;

static int in_serial_loop(const lm_kernel *k, int32_t l) {
  for (; l >= 0; l = k->loops[l].parent)
    if (k->loops[l].kind == LM_L_SERIAL) return 1;
  return 0;
}

/* Buffers worth staging: read (not written) by loads that do not name the env, inside a
 * serial loop, of a constant size, largest reuse first until the budget is spent. */
static int choose_staged(gb *b, st_t *s, int64_t budget) {
  const lm_kernel *k = b->k;
  int any = 0;
  int64_t used = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *o = &k->stmts[i];
    if (o->op != LM_S_LOAD || o->local || s->stage[o->buf] || !in_serial_loop(k, o->loop)) continue;
    if (uses(b->x, o->idx, 0) || uses(b->x, o->valid, 0) || lm_kernel_writes_buf(k, o->buf)) continue;
    const lm_xnode *ne = lm_x_node(b->x, b->p->bufs[o->buf].numel);
    if (ne->op != LM_X_CONST || ne->v < 1 || used + ne->v > budget) continue;
    s->stage[o->buf] = 1;
    used += ne->v;
    any = 1;
  }
  return any;
}

/* Old block bl into new loop `at`: staged loads read the shared arrays, accesses naming the
 * env (staged loads too: the copy ends at the last env) are guarded by in_env, loops rebuilt. */
static void stage_block(gb *b, const st_t *s, const lm_block *bl, int32_t at, lm_expr in_env) {
  const lm_kernel *k = b->k;
  for (size_t i = 0; i < bl->n && b->ok; i++) {
    lm_item it = bl->items[i];
    if (it.is_loop) {
      const lm_loop *ol = &k->loops[it.id];
      int32_t nl = loop(b, at, remap(b, ol->extent), (lm_loopkind)ol->kind);
      if (nl < 0) return;
      b->vmap[it.id] = lm_x_var(b->x, nl);
      stage_block(b, s, &ol->body, nl, in_env);
      continue;
    }
    const lm_stmt *o = &k->stmts[it.id];
    if (o->op == LM_S_LOAD && !o->local && s->stage[o->buf]) {
      /* a load that names the env reads past the copy in the threads past the last env */
      lm_expr valid = o->valid ? remap(b, o->valid) : lm_x_const(b->x, 1);
      if (uses(b->x, o->idx, 0) || uses(b->x, o->valid, 0)) valid = lm_x_simplify(b->x, and_(b->x, valid, in_env), NULL);
      lm_stmt l2 = {.op = LM_S_LOAD, .loop = at, .buf = s->arr[o->buf], .local = 1, .idx = remap(b, o->idx),
                    .valid = valid};
      b->smap[it.id] = add(b, l2);
    } else copy(b, it.id, at, in_env, 1);
  }
}

static void stage_kernel(gb *b, st_t *s, int32_t threads) {
  const lm_kernel *k = b->k;
  lm_exprs *x = b->x;
  lm_kernel *n = b->n;
  lm_expr E = k->loops[0].extent, W = lm_x_const(x, threads);
  int32_t g = loop(b, -1, ceil_div(x, E, threads), LM_L_PARALLEL);
  int32_t th = g < 0 ? -1 : loop(b, g, W, LM_L_PARALLEL);
  if (th < 0) return;
  n->npar = 2;
  n->group = threads;
  lm_expr t = lm_x_var(x, th), env = lm_x_add(x, lm_x_mul(x, lm_x_var(x, g), W), t);
  b->vmap[0] = env;
  for (size_t bi = 0; bi < b->p->nbufs && b->ok; bi++) { /* the copies */
    if (!s->stage[bi]) continue;
    int64_t numel = lm_x_node(x, b->p->bufs[bi].numel)->v;
    if ((s->arr[bi] = lm_kernel_add_local(n, numel, 1)) == UINT32_MAX) {
      b->ok = 0;
      return;
    }
    int32_t r = loop(b, th, ceil_div(x, lm_x_const(x, numel), threads), LM_L_SERIAL);
    if (r < 0) return;
    lm_expr e = lm_x_add(x, lm_x_mul(x, lm_x_var(x, r), W), t);
    lm_expr in = lm_x_simplify(x, lm_x_lt(x, e, lm_x_const(x, numel)), NULL);
    lm_stmt ld = {.op = LM_S_LOAD, .loop = r, .buf = (uint32_t)bi, .idx = lm_x_simplify(x, e, NULL), .valid = in};
    if (!lm_kernel_use_buf(n, (uint32_t)bi)) b->ok = 0;
    uint32_t v = add(b, ld);
    add(b, (lm_stmt){.op = LM_S_STORE, .loop = r, .buf = s->arr[bi], .local = 1, .idx = ld.idx, .a = v, .valid = in});
  }
  add(b, (lm_stmt){.op = LM_S_BARRIER, .loop = th});
  /* the body: the old env loop's block inside the thread loop */
  stage_block(b, s, &k->loops[0].body, th, lm_x_simplify(x, lm_x_lt(x, env, E), NULL));
}

/* ---------------------------------------------------------------- the pass */

static int try_tile(const lm_plan *p, const lm_kernel *k, lm_kernel *n) {
  gb b;
  mm q = {0};
  if (start(&b, p, k, n) != LM_OK || !tileable(&b, &q)) b.ok = 0;
  else tile(&b, &q);
  return finish(&b);
}

/* ---------------------------------------------------------------- work-group reductions */

enum { RED_THREADS = 256, RED_MIN = 512, MAX_ACCS = 4 };

typedef struct rd {
  int warp;               /* > 0: the last halvings by warp shuffles (CUDA) */
  int32_t P;              /* old: the innermost parallel loop */
  int nacc;
  uint32_t acc[MAX_ACCS]; /* old ACC statements updated in reduction loops */
  uint8_t is_max[MAX_ACCS];
  uint32_t sh[MAX_ACCS];  /* their shared arrays */
} rd;

/* par ...: acc = 0; for k (long or symbolic): acc (+|max)= f(k); tail; store  --  loops under
 * the innermost parallel one are such reductions (merged kernels hold several), statements
 * only inside them, and at least one is long. */
static int reducible(gb *b, rd *q) {
  const lm_kernel *k = b->k;
  if (k->group || k->npar < 1 || k->nlocals) return 0;
  q->P = k->npar - 1;
  int long_one = 0;
  if (!outer_blocks_plain(k, q->P)) return 0;
  const lm_block *pb = &k->loops[q->P].body;
  for (size_t i = 0; i < pb->n; i++) {
    lm_item it = pb->items[i];
    if (!it.is_loop) continue;
    if (k->loops[it.id].kind != LM_L_SERIAL) return 0;
    const lm_xnode *e = lm_x_node(b->x, k->loops[it.id].extent);
    long_one |= e->op != LM_X_CONST || e->v >= RED_MIN;
    const lm_block *rb = &k->loops[it.id].body;
    int updates = 0;
    for (size_t j = 0; j < rb->n; j++) {
      lm_item jt = rb->items[j];
      if (jt.is_loop) return 0;
      const lm_stmt *s = &k->stmts[jt.id];
      if (s->op == LM_S_STORE || s->op == LM_S_ACC || s->op == LM_S_BARRIER || (s->op == LM_S_LOAD && s->local))
        return 0;
      if (s->op != LM_S_ACC_SUM && s->op != LM_S_ACC_MAX) continue;
      for (int a = 0; a < q->nacc; a++)
        if (q->acc[a] == s->a) return 0; /* one update per accumulator */
      if (q->nacc == MAX_ACCS || k->stmts[s->a].loop != q->P) return 0;
      q->is_max[q->nacc] = s->op == LM_S_ACC_MAX;
      q->acc[q->nacc++] = s->a;
      updates++;
    }
    if (!updates) return 0;
  }
  return long_one && q->nacc > 0;
}

/* One work-group of RED_THREADS per output: thread t folds terms t, t + 256, ... into its own
 * partial (a max re-reads the last term past the end, a sum adds +0), the partials go to shared
 * memory, and a tree of barriers halves them down to one; the tail and the store run where
 * t == 0. A sum's terms are added in a different order than the sequential loop: a rounding
 * change (max is exact). */
static void tree(gb *b, rd *q) {
  const lm_kernel *k = b->k;
  lm_exprs *x = b->x;
  lm_kernel *n = b->n;
  lm_expr one = lm_x_const(x, 1), W = lm_x_const(x, RED_THREADS);
  int32_t parent = -1;
  for (int32_t l = 0; l <= q->P && b->ok; l++) {
    parent = loop(b, parent, k->loops[l].extent, LM_L_PARALLEL);
    b->vmap[l] = lm_x_var(x, parent);
  }
  int32_t th = parent < 0 ? -1 : loop(b, parent, W, LM_L_PARALLEL);
  if (th < 0) return;
  n->npar = k->npar + 1;
  n->group = RED_THREADS;
  lm_expr t = lm_x_var(x, th), first = lm_x_simplify(x, lm_x_lt(x, t, one), NULL);
  uint32_t *sh = q->sh;
  for (int a = 0; a < q->nacc; a++)
    if ((sh[a] = lm_kernel_add_local(n, RED_THREADS, 1)) == UINT32_MAX) {
      b->ok = 0;
      return;
    }
  for (int32_t l = -1; l <= q->P && b->ok; l++) {
    const lm_block *bl = l < 0 ? &k->root : &k->loops[l].body;
    for (size_t i = 0; i < bl->n && b->ok; i++) {
      lm_item it = bl->items[i];
      if (it.is_loop && l != q->P) continue;
      if (!it.is_loop) {
        int ai = -1;
        for (int a = 0; a < q->nacc; a++)
          if (q->acc[a] == it.id) ai = a;
        if (ai < 0 && k->stmts[it.id].op == LM_S_STORE) { /* the tail's stores: by thread 0 */
          lm_stmt st = k->stmts[it.id];
          st.a = b->smap[st.a];
          st.loop = th;
          st.idx = remap(b, st.idx);
          st.valid = lm_x_simplify(x, and_(x, remap(b, st.valid), first), NULL);
          if (!lm_kernel_use_buf(n, st.buf)) b->ok = 0;
          b->smap[it.id] = add(b, st);
        } else copy(b, it.id, th, 0, 0);
        continue;
      }
      /* the strided partial sums of this loop's accumulators */
      int32_t R = (int32_t)it.id;
      lm_expr K = k->loops[R].extent;
      int mine[MAX_ACCS] = {0}, any_max = 0;
      for (size_t j = 0; j < k->loops[R].body.n; j++) {
        const lm_stmt *u = &k->stmts[k->loops[R].body.items[j].id];
        if (u->op == LM_S_ACC_SUM || u->op == LM_S_ACC_MAX)
          for (int a = 0; a < q->nacc; a++)
            if (q->acc[a] == u->a) mine[a] = 1, any_max |= q->is_max[a];
      }
      int32_t rr = loop(b, th, ceil_div(x, K, RED_THREADS), LM_L_SERIAL);
      if (rr < 0) return;
      lm_expr kv = lm_x_add(x, lm_x_mul(x, lm_x_var(x, rr), W), t);
      lm_expr in_k = lm_x_simplify(x, lm_x_lt(x, kv, K), NULL);
      lm_expr last = lm_x_sub(x, K, one); /* min(kv, K - 1) for the max: a repeated term */
      lm_expr clamped = lm_x_add(x, kv, lm_x_mul(x, lm_x_lt(x, last, kv), lm_x_sub(x, last, kv)));
      b->vmap[R] = any_max ? clamped : kv;
      const lm_block *rb = &k->loops[R].body;
      for (size_t ri = 0; ri < rb->n && b->ok; ri++) {
        uint32_t sid = rb->items[ri].id;
        const lm_stmt *o = &k->stmts[sid];
        if (o->op == LM_S_ACC_SUM) { /* past the end: + 0 */
          lm_stmt sel = {.op = LM_S_SELECT, .loop = rr, .a = b->smap[o->b], .valid = in_k};
          lm_stmt up = *o;
          up.loop = rr;
          up.a = b->smap[o->a];
          up.b = add(b, sel);
          b->smap[sid] = add(b, up);
        } else copy(b, sid, rr, any_max ? 0 : in_k, (uint64_t)1 << R);
      }
      /* partials to shared memory, then the tree */
      for (int a = 0; a < q->nacc && b->ok; a++)
        if (mine[a])
          add(b, (lm_stmt){.op = LM_S_STORE, .loop = th, .buf = sh[a], .local = 1, .idx = t, .a = b->smap[q->acc[a]],
                         .valid = one});
      add(b, (lm_stmt){.op = LM_S_BARRIER, .loop = th});
      int warp = q->warp; /* halvings below the warp's width go by shuffles */
      for (int half = RED_THREADS / 2; half >= (warp ? warp : 1) && b->ok; half /= 2) {
        lm_expr low = lm_x_simplify(x, lm_x_lt(x, t, lm_x_const(x, half)), NULL);
        lm_expr up = lm_x_simplify(x, lm_x_add(x, t, lm_x_const(x, half)), NULL);
        for (int a = 0; a < q->nacc && b->ok; a++) {
          if (!mine[a]) continue;
          uint32_t u = add(b, (lm_stmt){.op = LM_S_LOAD, .loop = th, .buf = sh[a], .local = 1, .idx = t, .valid = low});
          uint32_t v = add(b, (lm_stmt){.op = LM_S_LOAD, .loop = th, .buf = sh[a], .local = 1, .idx = up, .valid = low});
          uint32_t s2 = add(b, (lm_stmt){.op = q->is_max[a] ? LM_S_MAX : LM_S_ADD, .loop = th, .a = u, .b = v});
          add(b, (lm_stmt){.op = LM_S_STORE, .loop = th, .buf = sh[a], .local = 1, .idx = t, .a = s2, .valid = low});
        }
        add(b, (lm_stmt){.op = LM_S_BARRIER, .loop = th});
      }
      /* the result, for the tail (thread 0's: the only one that stores) */
      for (int a = 0; a < q->nacc && b->ok; a++) {
        if (!mine[a]) continue;
        if (warp) { /* the first warp's 32 partials, halved 16, 8, 4, 2, 1 apart: the same pairs */
          uint32_t v = add(b, (lm_stmt){.op = LM_S_LOAD, .loop = th, .buf = sh[a], .local = 1,
                                        .idx = lm_x_simplify(x, lm_x_mod(x, t, lm_x_const(x, warp)), NULL), .valid = one});
          b->smap[q->acc[a]] = add(b, (lm_stmt){.op = q->is_max[a] ? LM_S_WARP_MAX : LM_S_WARP_SUM, .loop = th, .a = v});
        } else
          b->smap[q->acc[a]] = add(b, (lm_stmt){.op = LM_S_LOAD, .loop = th, .buf = sh[a], .local = 1,
                                                .idx = lm_x_const(x, 0), .valid = one});
      }
    }
  }
}

static int try_tree(const lm_plan *p, const lm_kernel *k, lm_kernel *n, int warp) {
  gb b;
  rd q = {.warp = warp == 32 ? 32 : 0};
  if (start(&b, p, k, n) != LM_OK || !reducible(&b, &q)) b.ok = 0;
  else tree(&b, &q);
  return finish(&b);
}

static int try_stage(const lm_plan *p, const lm_kernel *k, lm_kernel *n, const lm_gpu_options *o) {
  if (k->group || k->npar != 1 || k->root.n != 1 || !k->root.items[0].is_loop || o->stage_shared_bytes < 4) return 0;
  st_t s = {lm_calloc(p->nbufs + 1, 1), lm_calloc(p->nbufs + 1, sizeof(uint32_t))};
  gb b;
  if (!s.stage || !s.arr || start(&b, p, k, n) != LM_OK || !choose_staged(&b, &s, o->stage_shared_bytes / 4)) b.ok = 0;
  else stage_kernel(&b, &s, o->scan_threads > 0 ? o->scan_threads : 64);
  lm_free(s.stage);
  lm_free(s.arr);
  return finish(&b);
}

int lm_schedule_gpu(lm_plan *p, const lm_gpu_options *o) {
  int changed = 0;
  for (size_t ki = 0; ki < p->nkernels; ki++) {
    const lm_kernel *k = &p->kernels[ki];
    if (k->group || k->fixed) continue; /* scheduled already, or measured as it is by the search */
    lm_kernel n;
    int done = o->tile_matmuls && try_tile(p, k, &n);
    if (!done) done = try_stage(p, k, &n, o);
    if (!done && o->tree_reductions) done = try_tree(p, k, &n, o->warp);
    if (done) {
      lm_kernel_free(&p->kernels[ki]);
      p->kernels[ki] = n;
      changed++;
    }
  }
  if (changed) lm_plan_liveness(p);
  return changed;
}

int lm_gpu_schedules_enabled(void) {
  const char *e = getenv("LUMEN_GPU_SCHEDULE");
  return !(e && !strcmp(e, "0"));
}

void lm_gpu_options_default(lm_gpu_options *o, int64_t shared_bytes) {
  memset(o, 0, sizeof *o);
  o->tile_matmuls = 1;
  o->tree_reductions = 1;
  /* leave a quarter of the work-group memory to the tiles of other kernels' compilers */
  o->stage_shared_bytes = shared_bytes > 0 ? shared_bytes * 3 / 4 : 0;
  o->scan_threads = 64;
}
