/* compiler/jam.c — register blocking of the default schedule on the cpu (unroll and jam): the
 * outer parallel loop of a kernel that accumulates in inner loops runs LM_JAM points at a time,
 * each statement inside copied once per point and the copies kept side by side in the loops they
 * sit in; point loops too wide for that in registers run in tiles first (16 wide, or 64 with
 * AVX-512's wider register file; below with 16):
 *   par i: acc[128] = 0; for k: for j < 128: acc[j] += w[k, j] * x[i, k]
 * becomes
 *   par i4: for t < 8: acc0..3[16] = 0; for k: for j < 16: w' = w[k, 16t + j];
 *                                              acc0[j] += w' * x[4 i4, k]; ... acc3[j] += w' * x[4 i4 + 3, k]
 * A value the outer loop does not change (a weight, a staged operand) is loaded once for four
 * points, and four independent chains of additions run where one did. Each point computes exactly
 * what it did, in the same order: the same bits. Where the extent is not a known multiple of
 * LM_JAM, copy c > 0 of every load and store is guarded by 4 i4 + c < E, and the renderer runs the
 * blocks below E / 4 without those guards (render.c, find_tails). Measured on MinAtar Breakout's
 * PPO update (one thread, each kernel alone): the convolution's weight gradient 3.5x faster (a
 * dependent chain per output before), its forward 1.6x, the dense layer's forward, weight and
 * input gradients 1.2-1.9x; the whole training 1.3x.
 * Not a rewrite rule: rules live in the search's e-graph and need a budget and a device to time
 * their candidates; this is the static default the search starts from (it leaves searched,
 * `fixed`, kernels alone), as the interchange before it. */
#include <string.h>

#include "loopir.h"

enum { MAX_LOCAL_FLOATS = 262144 }; /* every local array of a kernel together: 1 MiB of stack */

typedef struct jam {
  const lm_kernel *k;
  lm_kernel *n;
  lm_exprs *x;
  int f;            /* points per iteration */
  lm_expr guard_e;  /* the old extent when copies need guards, else 0 */
  uint8_t *inside;  /* old loop: loop 0 or a loop inside it */
  uint8_t *dep;     /* old statement: copied per point */
  uint8_t *own;     /* old local array: written inside loop 0 (one per point) */
  uint32_t *lmap;   /* old local * f + c -> new local */
  uint32_t *smap;   /* old statement * f + c -> new statement */
  lm_expr *vmap;    /* old loop -> new variable (loop 0: 4 i4 + c, set per copy) */
  uint8_t *point;   /* old loop: a point loop run in tiles (tile_ep != 0) */
  uint8_t *tiled;   /* old loop: inside the tiles (an item holding a tiled point loop) */
  uint8_t *tlocal;  /* old local array: a tile's row of accumulators */
  uint8_t *major;   /* old local array: a staged operand laid out tile-major (tile_major) */
  int64_t regs, tw; /* accumulator floats that fit in registers; a tile's width (register_file) */
  int64_t tile_ep;  /* the point loops' extent when they run in tiles of tw, else 0 */
  int smooth;       /* the graph allows contraction: exp2, 1/x and sqrt print the same per
                     * element jammed or not (lm_exp2_c, division, sqrtf), so they may be inside */
  int32_t tile;     /* the new loop over the tiles */
  int ok;
} jam;

static int is_update(uint8_t op) { return op == LM_S_ACC || op == LM_S_ACC_SUM || op == LM_S_ACC_MAX || op == LM_S_STORE; }

static int stmt_inside(const jam *j, const lm_stmt *s) { return s->loop >= 0 && j->inside[s->loop]; }

/* Which statements vary with loop 0: those that read its variable, a local array of a point,
 * or a value that varies; accumulators and stores inside it always get a copy per point. */
static void find_deps(jam *j) {
  const lm_kernel *k = j->k;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op == LM_S_STORE && s->local && stmt_inside(j, s)) j->own[s->buf] = 1;
  }
  for (int changed = 1; changed;) {
    changed = 0;
    for (size_t i = 0; i < k->nstmts; i++) {
      const lm_stmt *s = &k->stmts[i];
      if (j->dep[i] || !stmt_inside(j, s)) continue;
      int d = is_update(s->op) || ((s->op == LM_S_LOAD || s->op == LM_S_STORE) && s->local && j->own[s->buf]);
      uint64_t used = lm_x_vars_used(j->x, s->idx) | lm_x_vars_used(j->x, s->valid) | lm_x_vars_used(j->x, s->step);
      d = d || (used & 1);
      int ops = lm_sop_operands(s->op);
      if ((ops & LM_OPND_A) && j->dep[s->a]) d = 1;
      if ((ops & LM_OPND_B) && j->dep[s->b]) d = 1;
      if (d) j->dep[i] = 1, changed = 1;
    }
  }
}

/* f i + c: loop 0's variable as copy c of a jammed iteration sees it */
static lm_expr point(jam *j, int c) {
  return lm_x_add(j->x, lm_x_mul(j->x, lm_x_var(j->x, 0), lm_x_const(j->x, j->f)), lm_x_const(j->x, c));
}

static lm_expr remap(jam *j, lm_expr e) {
  return e ? lm_x_simplify(j->x, lm_x_subst(j->x, e, j->vmap, (int)j->k->nloops), NULL) : 0;
}

/* A staged operand (schedule.c: a weight read by columns, copied once per call into a local
 * [R][P] array) read in tiles walks its columns a tile at a time: l[r*P + t*tw + p] for r < R,
 * a stride of P floats per step of r. For MinAtar's [1600, 128] layer that is 6400 bytes, a new
 * page every load, which the prefetchers do not follow (the input gradient ran at 55% of the FMA
 * peak where the forward, reading the weights in rows, ran at 80%). Tile-major, element r*P + q
 * of the array sits at (q / tw) * R*tw + r*tw + q % tw: each tile's columns one after another,
 * read in order. Every load and store of the array (the copy's included) takes the new index: a
 * bijection on its floats, so nothing reads anything else. Measured on a 2-core Zen 4 EPYC, the
 * input-gradient kernel alone (1024 rows, one thread, bitwise equal): 6.2 ms -> 5.1 ms. */
static lm_expr tile_major(jam *j, uint32_t local, lm_expr e) {
  lm_exprs *x = j->x;
  const int64_t ep = j->tile_ep, tw = j->tw, R = j->k->locals[local] / ep;
  lm_expr q = lm_x_mod(x, e, lm_x_const(x, ep)), r = lm_x_div(x, e, lm_x_const(x, ep));
  lm_expr v = lm_x_add(x, lm_x_mul(x, lm_x_div(x, q, lm_x_const(x, tw)), lm_x_const(x, R * tw)),
                       lm_x_add(x, lm_x_mul(x, r, lm_x_const(x, tw)), lm_x_mod(x, q, lm_x_const(x, tw))));
  lm_expr ext[64];
  const lm_kernel *n = j->n;
  for (size_t l = 0; l < n->nloops && l < 64; l++) ext[l] = n->loops[l].extent;
  lm_xctx ctx = {.extent = ext, .nvars = (int)(n->nloops < 64 ? n->nloops : 64)};
  return lm_x_simplify(x, v, &ctx);
}

/* Which local arrays go tile-major: read-only inside loop 0 (written only by a copy before it),
 * shared by the points, a whole number of columns of the tiled extent, and read only inside point
 * loops at indices that come out without a division or modulo (a column walk). */
static void plan_major(jam *j) {
  const lm_kernel *k = j->k;
  lm_exprs *x = j->x;
  for (size_t i = 0; i < k->nlocals; i++)
    j->major[i] = !j->own[i] && k->locals[i] % j->tile_ep == 0 && k->locals[i] > j->tile_ep;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if ((s->op != LM_S_LOAD && s->op != LM_S_STORE) || !s->local || !j->major[s->buf]) continue;
    if (!stmt_inside(j, s)) continue;
    lm_expr e = s->op == LM_S_LOAD && j->point[s->loop] ? remap(j, s->idx) : 0;
    if (!e || lm_x_divmods(x, tile_major(j, s->buf, e), -1, NULL, NULL)) j->major[s->buf] = 0;
  }
}

static void copy_stmt(jam *j, uint32_t old, int c) {
  const lm_kernel *k = j->k;
  lm_stmt s = k->stmts[old];
  int ops = lm_sop_operands(s.op);
  if (ops & LM_OPND_A) s.a = j->smap[(size_t)s.a * j->f + c];
  if (ops & LM_OPND_B) s.b = j->smap[(size_t)s.b * j->f + c];
  s.idx = remap(j, s.idx);
  s.valid = remap(j, s.valid);
  s.step = remap(j, s.step);
  if ((s.op == LM_S_LOAD || s.op == LM_S_STORE) && s.local) {
    if (j->tlocal[s.buf]) s.idx = lm_x_var(j->x, s.loop); /* a tile's row of accumulators */
    else if (j->major[s.buf]) s.idx = tile_major(j, s.buf, s.idx);
    s.buf = j->lmap[(size_t)s.buf * j->f + c];
  }
  int reads_var = ((lm_x_vars_used(j->x, k->stmts[old].idx) | lm_x_vars_used(j->x, k->stmts[old].valid)) & 1) != 0;
  if (c > 0 && j->guard_e && (s.op == LM_S_LOAD || s.op == LM_S_STORE) && (!s.local || reads_var)) {
    lm_expr g = lm_x_lt(j->x, point(j, c), j->guard_e); /* unsimplified: the renderer recognises it */
    s.valid = s.valid && !lm_x_is_const(j->x, s.valid, 1) ? lm_x_and(j->x, s.valid, g) : g;
  }
  uint32_t id = lm_kernel_add_stmt(j->n, &s, -1);
  if (id == UINT32_MAX || !s.idx != !k->stmts[old].idx) j->ok = 0;
  for (int d = j->dep[old] ? c : 0; d < (j->dep[old] ? c + 1 : j->f); d++) j->smap[(size_t)old * j->f + d] = id;
}

/* Appends old block b's items to the new kernel, statements of loop 0's subtree that vary once
 * per point (copy 0, 1, ... side by side), the others once. */
static void copy_block(jam *j, const lm_block *b) {
  const lm_kernel *k = j->k;
  for (size_t i = 0; i < b->n && j->ok; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      int32_t parent = j->n->loops[it.id].parent;
      lm_block *d = parent < 0 ? &j->n->root : &j->n->loops[parent].body;
      if (!lm_block_insert(d, d->n, it)) j->ok = 0;
      else copy_block(j, &k->loops[it.id].body);
      continue;
    }
    if (!j->dep[it.id]) {
      copy_stmt(j, it.id, 0);
      continue;
    }
    for (int c = 0; c < j->f && j->ok; c++) {
      j->vmap[0] = point(j, c);
      copy_stmt(j, it.id, c);
    }
    j->vmap[0] = lm_x_var(j->x, 0);
  }
}

/* Can plain kernel k be jammed by f, and does it pay? Accumulations in inner loops whose
 * accumulators, f times over, still fit in registers (a point loop of at most regs / f, or a scalar
 * chain), or never did (a point loop of at least MEM_FLOATS: the shared operand's loads are
 * what jamming saves). In between it spills what fitted: measured on the cpu, a dense layer's
 * rows of 128 accumulators ran 0.76x (forward) and 0.57x (weight gradient) jammed, while
 * 16-wide convolutions ran 1.5-2.3x and a 1600-wide input gradient 1.28x. No transcendental
 * or RAND inside: clang vectorises four copies of an exp with libmvec's few-ulp exp where the
 * unjammed kernel called the scalar one, and the results would no longer be the same bits.
 * Where the graph allows contraction exp2 is the inline polynomial lm_exp2_c, 1/x a division
 * and sqrt sqrtf, each the same bits per element in any vector form: those may be inside (a
 * dense layer's tanh epilogue; log2 and sin still go to libmvec when vectorised). */
enum { MEM_FLOATS = 512 };

/* The floats of accumulators a kernel keeps in registers (regs) and a tile's width (tw), from
 * the vector registers of this host, which the cpu backend compiles for (-march=native): 16
 * registers of 8 floats (AVX2) hold 64 floats of accumulators beside the operands, 32 of 16
 * (AVX-512) four times as many. Measured on a 2-core Xeon with AVX-512, MinAtar Breakout's PPO
 * (side by side, the same bits): tiles of 16 and 64 floats 13.4k env steps/s, of 32 and 128
 * 14.0k, of 64 and 256 14.7k. */
static void register_file(int64_t *regs, int64_t *tw) {
  int wide = 0;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  wide = __builtin_cpu_supports("avx512f");
#endif
  *regs = wide ? 256 : 64;
  *tw = wide ? 64 : 16;
}

/* Point loops (independent points an interchange moved inward: a dense layer's 128 outputs)
 * whose accumulators would spill f times over run in tiles of tw instead: a loop over the
 * tiles inside the domain around the items of its body that hold such a loop, each point loop
 * tw long, the accumulator arrays a tile's row. That reorders only independent points: it holds
 * when every point loop of the widest extent ep is innermost, the innermost parallel loop's
 * block has loops only, the accumulator arrays are read and written only at their point loop's
 * own point, nothing outside a point loop reads a value computed inside one, and a buffer the
 * kernel writes is stored and read only inside point loops at one index (an epilogue reading
 * back what the layer stored). Items whose point loops are narrower and fit f times over (the
 * 64 -> 2 logits beside the critic's 4 -> 64 layer) stay outside the tiles, run once, when they
 * share nothing written with the tiled ones; their order against the tiles does not matter
 * then. Every point sees exactly what it saw: the same bits. Sets j->tile_ep, j->point,
 * j->tiled and j->tlocal when so. */
static int64_t tiles_of(jam *j, int f) {
  const lm_kernel *k = j->k;
  lm_exprs *x = j->x;
  int64_t ep = 0;
  int32_t tp = k->npar - 1;
  if (k->nloops >= 63 || tp < 0) return 0;
  for (size_t l = 1; l < k->nloops; l++) {
    if (!j->inside[l] || !k->loops[l].point) continue;
    const lm_xnode *e = lm_x_node(x, k->loops[l].extent);
    if (e->op != LM_X_CONST) return 0;
    if (e->v > ep) ep = e->v;
  }
  if (!ep || ep % j->tw || ep * f <= j->regs) return 0;
  int32_t top[64]; /* per loop inside the domain: its item in the innermost parallel loop's block */
  for (size_t l = 0; l < k->nloops; l++) {
    int32_t t = (int32_t)l;
    while (t >= 0 && k->loops[t].parent != tp) t = k->loops[t].parent;
    top[l] = (int32_t)l > tp ? t : -1;
  }
  for (size_t l = 1; l < k->nloops; l++) {
    if (!j->inside[l] || !k->loops[l].point || top[l] < 0) continue;
    int64_t e = lm_x_node(x, k->loops[l].extent)->v;
    if (e == ep) j->point[l] = j->tiled[top[l]] = 1;
    else if (e * f > j->regs) return 0;
  }
  for (size_t l = 0; l < k->nloops; l++) j->tiled[l] = top[l] >= 0 && j->tiled[top[l]];
  for (size_t l = 1; l < k->nloops; l++)
    if (k->loops[l].parent >= 0 && j->point[k->loops[l].parent]) return 0; /* innermost */
  const lm_block *pb = &k->loops[tp].body; /* the tiles run inside the domain */
  for (size_t i = 0; i < pb->n; i++)
    if (!pb->items[i].is_loop) return 0;
  lm_expr canon[64];
  for (size_t l = 0; l < k->nloops; l++) canon[l] = lm_x_var(x, j->point[l] ? 63 : (int)l);
  lm_expr at[64] = {0};        /* per buffer written (by its place in k->bufs): the one index */
  uint8_t side[64] = {0};      /* per buffer written: 1 read or written in tiles, 2 outside them */
  uint8_t *lside = j->tlocal; /* per local array: the same, 1 marking a tile's row */
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!stmt_inside(j, s) || s->loop <= tp) continue;
    int in_point = j->point[s->loop], tiled = j->tiled[s->loop], ops = lm_sop_operands(s->op);
    for (int o = 0; o < 2; o++) { /* values cross neither out of a point loop nor between sides */
      if (!(ops & (o ? LM_OPND_B : LM_OPND_A))) continue;
      const lm_stmt *v = &k->stmts[o ? s->b : s->a];
      if (stmt_inside(j, v) && v->loop > tp && ((!in_point && j->point[v->loop]) || j->tiled[v->loop] != tiled)) return 0;
    }
    if (s->op != LM_S_LOAD && s->op != LM_S_STORE) continue;
    if (s->local) {
      if (!j->own[s->buf]) continue;
      if ((lside[s->buf] && lside[s->buf] != 2 - tiled) || (tiled && k->locals[s->buf] != ep)) return 0;
      lside[s->buf] = (uint8_t)(2 - tiled);
      if (tiled && (!in_point || s->idx != lm_x_var(x, s->loop) || (s->valid && !lm_x_is_const(x, s->valid, 1))))
        return 0;
      continue;
    }
    if (!lm_kernel_writes_buf(k, s->buf)) continue;
    size_t b = 0;
    while (b < k->nbufs && k->bufs[b] != s->buf) b++;
    if (b >= 64 || (side[b] && side[b] != 2 - tiled)) return 0;
    side[b] = (uint8_t)(2 - tiled);
    if (!tiled) continue;
    lm_expr e = lm_x_simplify(x, lm_x_subst(x, s->idx, canon, (int)k->nloops), NULL);
    if (!in_point || !e || (at[b] && at[b] != e)) return 0;
    at[b] = e;
  }
  for (size_t i = 0; i < k->nlocals; i++) j->tlocal[i] = lside[i] == 1;
  return ep;
}

static void plan_tiles(jam *j, int f) {
  j->tile_ep = tiles_of(j, f);
  if (j->tile_ep) return;
  memset(j->point, 0, j->k->nloops);
  memset(j->tiled, 0, j->k->nloops);
  memset(j->tlocal, 0, j->k->nlocals);
}

/* A plain parallel outer loop: no lanes, vectors, work-groups or searched schedule. */
static int plain(const lm_kernel *k) {
  return k->npar >= 1 && !k->fixed && !k->measured && !k->group && !k->nshared && !k->contract && k->nloops <= 64 &&
         k->loops[0].kind == LM_L_PARALLEL && k->loops[0].parent == -1;
}

/* Does op give the same bits per element in a jammed copy, which clang may vectorise? */
static int same_bits_jammed(const jam *j, uint8_t op) {
  switch (op) {
  case LM_S_RAND:
  case LM_S_LOG2:
  case LM_S_SIN: return 0; /* libmvec where vectorised */
  case LM_S_EXP2:
  case LM_S_SQRT:
  case LM_S_RECIP: return j->smooth;
  default: return 1;
  }
}

static int eligible(const jam *j, int f) {
  const lm_kernel *k = j->k;
  const lm_xnode *e = lm_x_node(j->x, k->loops[0].extent);
  if (e->op == LM_X_CONST && e->v < 2 * f) return 0;
  int64_t fp[64] = {0}; /* per loop inside loop 0: accumulator floats (0: none), -1: not innermost */
  for (size_t l = 0; l < k->nloops; l++) {
    if (k->loops[l].kind != LM_L_PARALLEL && k->loops[l].kind != LM_L_SERIAL) return 0;
    if (l && k->loops[l].parent >= 0) fp[k->loops[l].parent] = -1;
  }
  fp[0] = -1;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!stmt_inside(j, s)) continue;
    if (!same_bits_jammed(j, s->op)) return 0;
    if (fp[s->loop] < 0) continue;
    const lm_xnode *ext = lm_x_node(j->x, k->loops[s->loop].extent);
    if (s->op == LM_S_STORE && s->local && j->own[s->buf]) {
      if (ext->op != LM_X_CONST) return 0;
      fp[s->loop] = ext->v;
    } else if (s->op == LM_S_ACC_SUM && !fp[s->loop]) fp[s->loop] = 1;
  }
  int any = 0;
  for (size_t l = 1; l < k->nloops; l++) {
    if (fp[l] <= 0 || !j->inside[l]) continue;
    if (j->tile_ep && j->point[l]) fp[l] = j->tw;
    if (fp[l] * f > j->regs && fp[l] < MEM_FLOATS) return 0;
    any = 1;
  }
  return any;
}

static int jam_kernel(lm_exprs *x, const lm_kernel *k, lm_kernel *n, int f, int smooth) {
  memset(n, 0, sizeof *n);
  jam j = {.k = k, .n = n, .x = x, .f = f, .ok = 1, .smooth = smooth};
  register_file(&j.regs, &j.tw);
  j.inside = lm_calloc(k->nloops + 1, 1);
  j.dep = lm_calloc(k->nstmts + 1, 1);
  j.own = lm_calloc(k->nlocals + 1, 1);
  j.lmap = lm_calloc(k->nlocals * (size_t)f + 1, sizeof *j.lmap);
  j.smap = lm_calloc(k->nstmts * (size_t)f + 1, sizeof *j.smap);
  j.vmap = lm_calloc(k->nloops + 1, sizeof *j.vmap);
  j.point = lm_calloc(k->nloops + 1, 1);
  j.tiled = lm_calloc(k->nloops + 1, 1);
  j.tlocal = lm_calloc(k->nlocals + 1, 1);
  j.major = lm_calloc(k->nlocals + 1, 1);
  int done = 0;
  if (!plain(k) || !j.inside || !j.dep || !j.own || !j.lmap || !j.smap || !j.vmap || !j.point || !j.tiled || !j.tlocal || !j.major) goto out;
  for (size_t l = 0; l < k->nloops; l++) {
    int32_t p = (int32_t)l;
    while (p > 0) p = k->loops[p].parent;
    j.inside[l] = p == 0;
  }
  find_deps(&j);
  plan_tiles(&j, f);
  if (!eligible(&j, f)) goto out;
  int64_t floats = 0;
  for (size_t i = 0; i < k->nlocals; i++) floats += k->locals[i] * (j.own[i] ? f : 1);
  if (floats > MAX_LOCAL_FLOATS) goto out;
  const lm_xnode e = *lm_x_node(x, k->loops[0].extent); /* a copy: building expressions may move the nodes */
  j.guard_e = e.op == LM_X_CONST && e.v % f == 0 ? 0 : k->loops[0].extent;
  memcpy(n->name, k->name, sizeof n->name);
  n->anchor = k->anchor;
  n->npar = k->npar;
  if (!LM_GROW(n->loops, n->loopcap, k->nloops + 1) || !LM_GROW(n->bufs, n->bufcap, k->nbufs + 1)) goto out;
  for (size_t l = 0; l < k->nloops; l++) { /* the same loops, same numbers, bodies refilled */
    n->loops[l] = k->loops[l];
    n->loops[l].body = (lm_block){0};
    j.vmap[l] = lm_x_var(x, (int)l);
  }
  n->nloops = k->nloops;
  if (j.tile_ep) { /* the loop over tiles, the innermost parallel loop's one item; the point loops a tile long */
    int32_t tp = k->npar - 1;
    j.tile = (int32_t)n->nloops++;
    n->loops[j.tile] = (lm_loop){.extent = lm_x_const(x, j.tile_ep / j.tw), .kind = LM_L_SERIAL, .parent = tp};
    if (!lm_block_insert(&n->loops[tp].body, 0, (lm_item){1, (uint32_t)j.tile})) goto out;
    for (size_t l = 1; l < k->nloops; l++) {
      if (n->loops[l].parent == tp && j.tiled[l]) n->loops[l].parent = j.tile;
      if (!j.point[l]) continue;
      n->loops[l].extent = lm_x_const(x, j.tw);
      j.vmap[l] = lm_x_add(x, lm_x_mul(x, lm_x_var(x, j.tile), lm_x_const(x, j.tw)), lm_x_var(x, (int)l));
    }
  }
  if (j.tile_ep) plan_major(&j);
  lm_expr fe = lm_x_const(x, f);
  n->loops[0].extent = e.op == LM_X_CONST ? lm_x_const(x, (e.v + f - 1) / f)
                                          : lm_x_simplify(x, lm_x_div(x, lm_x_add(x, k->loops[0].extent, lm_x_const(x, f - 1)), fe), NULL);
  memcpy(n->bufs, k->bufs, k->nbufs * sizeof *k->bufs);
  n->nbufs = k->nbufs;
  for (size_t i = 0; i < k->nlocals && j.ok; i++)
    for (int c = 0; c < f; c++) {
      if (c && !j.own[i]) {
        j.lmap[i * (size_t)f + c] = j.lmap[i * (size_t)f];
        continue;
      }
      uint32_t id = lm_kernel_add_local(n, j.tlocal[i] ? j.tw : k->locals[i], 0);
      if (id == UINT32_MAX) j.ok = 0;
      j.lmap[i * (size_t)f + c] = id;
    }
  if (j.ok) copy_block(&j, &k->root);
  done = j.ok && !x->failed && n->loops[0].extent;
out:
  lm_free(j.inside);
  lm_free(j.dep);
  lm_free(j.own);
  lm_free(j.lmap);
  lm_free(j.smap);
  lm_free(j.vmap);
  lm_free(j.point);
  lm_free(j.tiled);
  lm_free(j.tlocal);
  lm_free(j.major);
  return done;
}

/* Points per iteration for kernel k: f, or for a constant extent that f does not divide the
 * largest smaller factor that does: no guarded tail, and a jammed copy's index divides evenly
 * (Space Invaders' 54 window taps of 6 channels by 3: (3 i + c) / 6 is i / 2; by 4 the copies'
 * guards kept their divisions, and its PPO trained at 7.9k against 9.5k env steps/s by 3). */
static int points_of(const lm_exprs *x, const lm_kernel *k, int f) {
  const lm_xnode *e = k->nloops ? lm_x_node(x, k->loops[0].extent) : NULL;
  if (!e || e->op != LM_X_CONST || e->v % f == 0) return f;
  for (int g = f - 1; g >= 2; g--)
    if (e->v % g == 0) return g;
  return f;
}

/* Divisions and modulos of the parallel loop's variable per load and store of kernel k. */
static double divs_per_access(const lm_exprs *x, const lm_kernel *k) {
  size_t n = 0, d = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op != LM_S_LOAD && s->op != LM_S_STORE) continue;
    n++;
    if (s->idx) d += (size_t)lm_x_divmods(x, s->idx, 0, NULL, NULL);
    if (s->valid) d += (size_t)lm_x_divmods(x, s->valid, 0, NULL, NULL);
  }
  return n ? (double)d / (double)n : 0.0;
}

/* Wider than LM_JAM where the points' accumulators leave room (f = 0): a kernel whose points
 * each keep a few floats in registers runs more of them at a time, and more independent chains
 * of additions hide the FMA's latency. MinAtar's convolution weight gradient keeps 16 floats per
 * point of 36 (tap x input channel): by 4 its four chains of 16-float FMAs ran at about a sixth of
 * the FMA peak (one thread, 4.2k samples a 10-iteration run); by 12 (a row of three taps) 2.1k,
 * the whole PPO 1.04x on two threads. The candidates are the factors of a constant extent E
 * above LM_JAM, up to MAX_POINTS, that leave at least two iterations, largest first; one is taken
 * when its accumulators fit the registers (eligible) and its copies' indices divide no more
 * often per access than LM_JAM's: by 6 the same kernel's taps became (6 i + c) / 4 % 3 in every
 * load and ran 2.7x slower than by 4, where by 12 they simplify to i and c / 4. */
enum { MAX_POINTS = 16 };
static int jam_wider(lm_exprs *x, const lm_kernel *k, const lm_kernel *dflt, lm_kernel *out, int smooth) {
  const lm_xnode *e = k->nloops ? lm_x_node(x, k->loops[0].extent) : NULL;
  if (!e || e->op != LM_X_CONST) return 0;
  int64_t E = e->v;
  double limit = divs_per_access(x, dflt);
  for (int g = MAX_POINTS; g > LM_JAM; g--) {
    if (E % g || E / g < 2) continue;
    lm_kernel n;
    int ok = jam_kernel(x, k, &n, g, smooth) && divs_per_access(x, &n) <= limit;
    if (ok) {
      *out = n;
      return 1;
    }
    lm_kernel_free(&n);
    if (x->failed) return -1;
  }
  return 0;
}

int lm_schedule_jam(lm_plan *plan, int f) {
  int changed = 0, automatic = f == 0, smooth = plan->g->contract;
  if (automatic) f = LM_JAM;
  if (f < 2) return 0;
  for (size_t i = 0; i < plan->nkernels; i++) {
    lm_kernel n, w;
    if (!jam_kernel(&plan->g->x, &plan->kernels[i], &n, points_of(&plan->g->x, &plan->kernels[i], f), smooth)) {
      lm_kernel_free(&n);
      if (plan->g->x.failed) return -1;
      continue;
    }
    int wide = automatic ? jam_wider(&plan->g->x, &plan->kernels[i], &n, &w, smooth) : 0;
    if (wide < 0) {
      lm_kernel_free(&n);
      return -1;
    }
    if (wide) {
      lm_kernel_free(&n);
      n = w;
    }
    lm_kernel_free(&plan->kernels[i]);
    plan->kernels[i] = n;
    changed++;
  }
  return changed;
}
