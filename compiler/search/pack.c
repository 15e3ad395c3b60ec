/* compiler/search/pack.c — packing, a cpu variant of a searched kernel. A read-only operand that
 * a serial loop L reads alike in every iteration (its index does not name L), spanning serial
 * loops of constant extent inside L, is copied once before L into a local array laid out in the
 * order of those loops, and the loads read the copy: the B panel of a register-tiled matmul
 * (bo outer, ao serial inside) becomes a contiguous k x 16 block that stays in L1 instead of 16
 * floats every 1 KB of B (which map to a few cache sets). The values are the same, so the
 * kernel computes bitwise what the unpacked one does. Whether it pays is for measurement. */
#include <string.h>

#include "search/search-impl.h"

enum {
  PACK_MIN = 256,   /* floats: a smaller copy is not worth its loop */
  PACK_MAX = 16384,  /* floats per copy (64 KB: a 1024 x 16 panel; contiguous, it streams from L2) */
  PACK_TOTAL = 32768 /* floats per kernel (the copies live on the stack of the thread) */
};

/* Is loop a the loop l or one around it? */
static int encloses(const lm_kernel *k, int32_t a, int32_t l) {
  for (; l >= 0; l = k->loops[l].parent)
    if (l == a) return 1;
  return 0;
}

static int depth(const lm_kernel *k, int32_t l) {
  int d = 0;
  for (; l >= 0; l = k->loops[l].parent) d++;
  return d;
}

/* Packs load i at loop L when it qualifies; 1 when it did. Loads name only the kernel's first nl
 * loops (nl <= 64: the loops packing added come after them). */
static int pack_load(const lm_plan *p, lm_kernel *k, int32_t nl, int32_t L, uint32_t i, int64_t *total) {
  lm_exprs *x = &p->g->x;
  const lm_stmt s = k->stmts[i];
  if (lm_kernel_writes_buf(k, s.buf) || (s.valid && !lm_x_is_const(x, s.valid, 1))) return 0;
  uint64_t used = lm_x_vars_used(x, s.idx);
  if ((used >> L) & 1) return 0;
  int32_t inner[8];
  int ni = 0;
  int64_t F = 1;
  for (int32_t v = 0; v < nl; v++) {
    if (!((used >> v) & 1) || encloses(k, v, L)) continue; /* around L: the same in every iteration */
    const lm_xnode *e = lm_x_node(x, k->loops[v].extent);
    if (!encloses(k, L, v) || !encloses(k, v, s.loop) || k->loops[v].kind != LM_L_SERIAL || e->op != LM_X_CONST ||
        e->v < 1 || ni == (int)LM_COUNTOF(inner))
      return 0;
    inner[ni++] = v;
    F *= e->v;
  }
  if (!ni || F < PACK_MIN || F > PACK_MAX || *total + F > PACK_TOTAL) return 0;
  for (int a = 1; a < ni; a++) /* outermost first: the copy's layout follows the loops */
    for (int b = a; b > 0 && depth(k, inner[b]) < depth(k, inner[b - 1]); b--) {
      int32_t t = inner[b];
      inner[b] = inner[b - 1];
      inner[b - 1] = t;
    }
  uint32_t loc = lm_kernel_add_local(k, F, 0);
  lm_expr *map = lm_calloc(k->nloops + ni + 1, sizeof *map);
  if (loc == UINT32_MAX || !map) {
    lm_free(map);
    return -1;
  }
  int32_t at = k->loops[L].parent, c = -1;
  lm_expr lin_copy = lm_x_const(x, 0), lin_use = lm_x_const(x, 0);
  for (int q = 0; q < ni; q++) {
    lm_expr ext = k->loops[inner[q]].extent;
    c = q == 0 ? lm_kernel_add_loop_before(k, at, L, ext, LM_L_SERIAL) : lm_kernel_add_loop(k, c, ext, LM_L_SERIAL);
    if (c < 0) {
      lm_free(map);
      return -1;
    }
    map[inner[q]] = lm_x_var(x, c);
    lin_copy = lm_x_add(x, lm_x_mul(x, lin_copy, ext), lm_x_var(x, c));
    lin_use = lm_x_add(x, lm_x_mul(x, lin_use, ext), lm_x_var(x, inner[q]));
  }
  lm_expr one = lm_x_const(x, 1);
  lm_stmt ld = {.op = LM_S_LOAD, .loop = c, .buf = s.buf, .valid = one,
                .idx = lm_x_simplify(x, lm_x_subst(x, s.idx, map, (int)k->nloops), NULL)};
  lm_free(map);
  uint32_t v = lm_kernel_add_stmt(k, &ld, -1);
  if (v == UINT32_MAX) return -1;
  lm_stmt st = {.op = LM_S_STORE, .loop = c, .a = v, .buf = loc, .local = 1, .valid = one,
                .idx = lm_x_simplify(x, lin_copy, NULL)};
  if (lm_kernel_add_stmt(k, &st, -1) == UINT32_MAX) return -1;
  lm_stmt *o = &k->stmts[i];
  o->buf = loc;
  o->local = 1;
  o->valid = one;
  o->idx = lm_x_simplify(x, lin_use, NULL);
  *total += F;
  return 1;
}

int sk_pack_kernel(const lm_plan *p, lm_kernel *k) {
  if (k->nloops > 64 || k->group) return 0; /* variable sets are 64-bit masks; not on a GPU */
  int64_t total = 0;
  int packed = 0;
  size_t nl = k->nloops, ns = k->nstmts; /* loops and loads added here are not candidates */
  for (int32_t L = 0; L < (int32_t)nl; L++) { /* parents before children: the outermost L first */
    const lm_xnode *e = lm_x_node(&p->g->x, k->loops[L].extent);
    /* a symbolic extent (the row tiles of a batch) may be 1 at run time: measurement decides */
    if (L < k->npar || k->loops[L].kind != LM_L_SERIAL || (e->op == LM_X_CONST && e->v < 2)) continue;
    for (uint32_t i = 0; i < ns; i++) {
      const lm_stmt *s = &k->stmts[i];
      if (s->op != LM_S_LOAD || s->local || !encloses(k, L, s->loop)) continue;
      int r = pack_load(p, k, (int32_t)nl, L, i, &total);
      if (r < 0) return -1;
      packed += r;
    }
  }
  return packed;
}
