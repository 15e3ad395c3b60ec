/* compiler/memplan.c — best-fit placement of temporaries by liveness, and the layout of a
 * plan under concrete symbol values. */
#include "memplan.h"

#include <string.h>

typedef struct placed {
  size_t off, size;
  int last;
} placed;

lm_status lm_memplan(size_t n, const size_t *bytes, const int *first, const int *last, size_t align,
                     size_t *offset, size_t *total) {
  size_t *order = lm_malloc((n + 1) * sizeof *order);
  placed *live = lm_malloc((n + 1) * sizeof *live);
  if (!order || !live) {
    lm_free(order);
    lm_free(live);
    return LM_ERR_NOMEM;
  }
  size_t m = 0, nlive = 0, end = 0;
  for (size_t i = 0; i < n; i++) {
    offset[i] = 0;
    if (first[i] >= 0 && bytes[i]) order[m++] = i;
  }
  /* by first use, then larger first (deterministic: ties by index) */
  for (size_t i = 1; i < m; i++) {
    size_t v = order[i], j = i;
    while (j > 0) {
      size_t u = order[j - 1];
      int later = first[u] > first[v] || (first[u] == first[v] && (bytes[u] < bytes[v] || (bytes[u] == bytes[v] && u > v)));
      if (!later) break;
      order[j] = u;
      j--;
    }
    order[j] = v;
  }
  for (size_t oi = 0; oi < m; oi++) {
    size_t b = order[oi];
    size_t need = (bytes[b] + align - 1) / align * align;
    /* free what died before this buffer is first written */
    size_t k = 0;
    for (size_t i = 0; i < nlive; i++)
      if (live[i].last >= first[b]) live[k++] = live[i];
    nlive = k;
    /* live blocks sorted by offset: find the smallest gap that fits */
    for (size_t i = 1; i < nlive; i++) {
      placed v = live[i];
      size_t j = i;
      while (j > 0 && live[j - 1].off > v.off) live[j] = live[j - 1], j--;
      live[j] = v;
    }
    size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (size_t i = 0; i <= nlive; i++) {
      size_t gap_end = i < nlive ? live[i].off : SIZE_MAX;
      int fits = gap_end >= cursor + need;
      if (fits && (i < nlive ? gap_end - cursor < best_gap : best == SIZE_MAX)) {
        best = cursor;
        best_gap = gap_end - cursor;
      }
      if (i < nlive && live[i].off + live[i].size > cursor) cursor = live[i].off + live[i].size;
    }
    offset[b] = best;
    live[nlive++] = (placed){best, need, last[b]};
    if (best + need > end) end = best + need;
  }
  *total = end;
  lm_free(order);
  lm_free(live);
  return LM_OK;
}

void lm_layout_free(lm_layout *l) {
  lm_free(l->count);
  lm_free(l->offset);
  lm_free(l->extent);
  lm_free(l->work);
  lm_free(l->cost);
  memset(l, 0, sizeof *l);
}

lm_status lm_layout_compute(const lm_plan *p, const int64_t *syms, lm_layout *out) {
  const lm_exprs *x = &p->g->x;
  memset(out, 0, sizeof *out);
  size_t nb = p->nbufs + 1, nk = p->nkernels + 1;
  size_t *bytes = lm_calloc(nb, sizeof *bytes);
  int *first = lm_calloc(nb, sizeof *first), *last = lm_calloc(nb, sizeof *last);
  out->count = lm_calloc(nb, sizeof *out->count);
  out->offset = lm_calloc(nb, sizeof *out->offset);
  out->extent = lm_calloc(nk, sizeof *out->extent);
  out->work = lm_calloc(nk, sizeof *out->work);
  out->cost = lm_calloc(nk, sizeof *out->cost);
  lm_status st = LM_ERR_NOMEM;
  if (!bytes || !first || !last || !out->count || !out->offset || !out->extent || !out->work || !out->cost) goto done;
  for (size_t i = 0; i < p->nbufs; i++) {
    const lm_pbuf *b = &p->bufs[i];
    int64_t n = lm_x_eval(x, b->numel, NULL, syms);
    out->syms |= lm_x_syms_used(x, b->numel);
    out->count[i] = n > 0 ? (size_t)n : 0;
    first[i] = b->kind == LM_BUF_TEMP ? b->first : -1;
    last[i] = b->last;
    bytes[i] = out->count[i] * sizeof(float);
    if (b->kind == LM_BUF_TEMP) out->temp_bytes += bytes[i];
  }
  for (size_t i = 0; i < p->nkernels; i++) {
    const lm_kernel *k = &p->kernels[i];
    out->extent[i] = k->npar ? lm_x_eval(x, k->loops[0].extent, NULL, syms) : 1;
    out->work[i] = 1;
    for (int l = 0; l < k->npar; l++) out->work[i] *= lm_x_eval(x, k->loops[l].extent, NULL, syms);
    out->cost[i] = lm_kernel_cost(x, k, syms);
    for (size_t l = 0; l < k->nloops; l++) out->syms |= lm_x_syms_used(x, k->loops[l].extent);
  }
  st = lm_memplan(p->nbufs, bytes, first, last, 64, out->offset, &out->arena_bytes);
done:
  lm_free(bytes);
  lm_free(first);
  lm_free(last);
  if (st != LM_OK) lm_layout_free(out);
  return st;
}

/* Statements executed, a transcendental function or a random draw counting as 8 (about what
 * libm's and Philox's cost against an add): nested loops multiply, sibling loops add. */
int64_t lm_kernel_cost(const lm_exprs *x, const lm_kernel *k, const int64_t *syms) {
  double *trips = lm_malloc((k->nloops + 1) * sizeof *trips), w = 0;
  if (!trips) return INT64_MAX / 2; /* unknown: worth every thread */
  for (size_t l = 0; l < k->nloops; l++) { /* loops are created before their children */
    double e = (double)lm_x_eval(x, k->loops[l].extent, NULL, syms);
    int32_t p = k->loops[l].parent;
    trips[l] = (e > 1 ? e : 1) * (p >= 0 ? trips[p] : 1);
  }
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op == LM_S_CONST || s->op == LM_S_ACC) continue;
    int heavy = s->op == LM_S_LOG2 || s->op == LM_S_EXP2 || s->op == LM_S_SIN || s->op == LM_S_SQRT ||
                s->op == LM_S_RECIP || s->op == LM_S_RAND || s->op == LM_S_MOD;
    w += (heavy ? 8.0 : 1.0) * (s->loop >= 0 ? trips[s->loop] : 1.0);
  }
  lm_free(trips);
  return w < 1 ? 1 : w > 4e18 ? (int64_t)4e18 : (int64_t)w;
}

/* Chunks are whole blocks of BLOCK iterations of the outer loop: the C compiler may
 * vectorise that loop (even over an inner one it unrolled), and libmvec's SIMD math differs
 * from scalar libm in the last bits, so chunk borders must fall where every thread count puts
 * the same elements in vector lanes. The price: an outer extent below 2*BLOCK runs on one
 * thread. Not so when a loop that is never unrolled away sits inside the outer one (a symbolic
 * extent, or a long loop: kept_below): the outer loop is then never innermost and never
 * vectorised (C compilers vectorise innermost loops; outer-loop vectorisation and
 * unroll-and-jam are off by default), and chunks may be single iterations: a weight gradient's
 * 64 rows, each a reduction over the minibatch, then run on every thread; so do the env blocks
 * of a fused scan (its time loop) and the 16 column panels of a searched 256^3 matmul.
 * A thread is worth starting for about 16384 statements of work (lm_kernel_cost). */
enum { BLOCK = LM_CPU_BLOCK, THREAD_WORK = LM_CPU_THREAD_WORK };

lm_cpu_cut lm_cpu_cut_of(int fine, int64_t extent, int64_t cost) {
  lm_cpu_cut c = {fine ? 1 : BLOCK, 1};
  double per = (extent > 0 ? (double)cost / (double)extent : 1.0) * (double)c.unit; /* work of a chunk */
  if (per < THREAD_WORK) c.min_chunks = (int64_t)(THREAD_WORK / (per > 1 ? per : 1));
  return c;
}

/* Does block b hold a loop of 4 or more iterations (or of symbolic extent)? */
static int has_loop(const lm_exprs *x, const lm_kernel *k, const lm_block *b) {
  for (size_t i = 0; i < b->n; i++) {
    if (!b->items[i].is_loop) continue;
    const lm_xnode *e = lm_x_node(x, k->loops[b->items[i].id].extent);
    if (e->op != LM_X_CONST || e->v >= 4) return 1;
  }
  return 0;
}

/* Statements block b would become unrolled whole (at least `cap` when more or symbolic). */
static int64_t unrolled(const lm_exprs *x, const lm_kernel *k, const lm_block *b, int64_t cap) {
  int64_t n = 0;
  for (size_t i = 0; i < b->n && n < cap; i++) {
    if (!b->items[i].is_loop) {
      n++;
      continue;
    }
    const lm_loop *l = &k->loops[b->items[i].id];
    const lm_xnode *e = lm_x_node(x, l->extent);
    if (e->op != LM_X_CONST) return cap;
    int64_t body = unrolled(x, k, &l->body, cap);
    n += e->v > 0 && body > cap / e->v ? cap : e->v * body;
  }
  return n < cap ? n : cap;
}

/* A loop in block b (or below) that no C compiler unrolls away: one of symbolic extent, of 4096
 * iterations or more, of 256 or more around a loop of 4 or more, or a nest of 4096 statements
 * or more unrolled whole (a dense layer's 10 x 160 x 64 over a block of rows). GCC peels at
 * most 16 iterations and 200 instructions whole; clang unrolls whole only what stays under a
 * few hundred instructions (four times that where it expects the copies to simplify). */
static int kept_below(const lm_exprs *x, const lm_kernel *k, const lm_block *b) {
  for (size_t i = 0; i < b->n; i++) {
    if (!b->items[i].is_loop) continue;
    const lm_loop *l = &k->loops[b->items[i].id];
    const lm_xnode *e = lm_x_node(x, l->extent);
    if (e->op != LM_X_CONST || e->v >= 4096 || (e->v >= 256 && has_loop(x, k, &l->body)) ||
        e->v * unrolled(x, k, &l->body, 4096) >= 4096 || kept_below(x, k, &l->body))
      return 1;
  }
  return 0;
}

int lm_kernel_fine(const lm_exprs *x, const lm_kernel *k) {
  return k->npar > 0 && k->nloops > 0 && kept_below(x, k, &k->loops[0].body);
}
