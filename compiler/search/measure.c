/* compiler/search/measure.c — measuring candidates on the cpu: host buffers for a plan under
 * concrete sizes with random inputs, launches that split loop 0 on the thread pool exactly as
 * the cpu backend does (compiler/backends/cpu.c), timing of the kernel alone (minimum over
 * batches, early stop for slow candidates), the tolerance check, a static cost estimate that
 * ranks candidates before any is compiled, and the canonical kernel text that keys the cache. */
#include <math.h>
#include <string.h>

#include "backends/backend.h"
#include "memplan.h"
#include "search/search-impl.h"

/* ---------------------------------------------------------------- buffers */

static lm_status dev_check(sk_bench *b, lm_status st) {
  if (st != LM_OK && b->dev_status == LM_OK) b->dev_status = st;
  return st;
}

lm_status skb_open(sk_bench *b, const lm_plan *plan, const int64_t *syms, lm_pool *pool, const lm_search_device *dev,
                   uint64_t seed) {
  memset(b, 0, sizeof *b);
  b->plan = plan;
  b->syms = syms;
  b->pool = pool;
  b->dev = dev;
  b->nbufs = plan->nbufs;
  b->bufs = lm_calloc(plan->nbufs + 1, sizeof *b->bufs);
  b->count = lm_calloc(plan->nbufs + 1, sizeof *b->count);
  if (!b->bufs || !b->count) {
    skb_close(b);
    return LM_ERR_NOMEM;
  }
  for (size_t i = 0; i < plan->nbufs; i++) {
    int64_t n = lm_x_eval(&plan->g->x, plan->bufs[i].numel, NULL, syms);
    if (n < 0 || n > ((int64_t)1 << 31)) {
      skb_close(b);
      return lm_fail(LM_ERR_INVALID, "search: buffer %zu has %lld elements", i, (long long)n);
    }
    b->count[i] = (size_t)n;
    if (!(b->bufs[i] = lm_malloc_aligned(((size_t)n + 16) * sizeof(float)))) { /* as the cpu backend's */
      skb_close(b);
      return LM_ERR_NOMEM;
    }
  }
  if (dev) {
    const lm_backend_ops *ops = dev->ops;
    size_t ns = plan->g->x.nsyms;
    b->dbufs = lm_calloc(plan->nbufs + 1, sizeof *b->dbufs);
    b->host_new = lm_calloc(plan->nbufs + 1, 1);
    b->dev_new = lm_calloc(plan->nbufs + 1, 1);
    lm_status st = b->dbufs && b->host_new && b->dev_new ? LM_OK : LM_ERR_NOMEM;
    for (size_t i = 0; i < plan->nbufs && st == LM_OK; i++)
      st = ops->alloc(dev->ctx, (b->count[i] + 16) * sizeof(float), &b->dbufs[i]);
    if (st == LM_OK) st = ops->alloc(dev->ctx, (ns + 1) * sizeof(int64_t), &b->dS);
    if (st == LM_OK) st = ops->alloc(dev->ctx, 2 * sizeof(uint64_t), &b->dR);
    if (st == LM_OK && ns) st = ops->write(dev->ctx, b->dS, syms, ns * sizeof(int64_t));
    if (st != LM_OK) {
      skb_close(b);
      return st;
    }
  }
  skb_fill(b, seed);
  return LM_OK;
}

void skb_close(sk_bench *b) {
  if (b->dev) {
    const lm_backend_ops *ops = b->dev->ops;
    ops->sync(b->dev->ctx);
    for (size_t i = 0; b->dbufs && i < b->nbufs; i++) ops->release(b->dev->ctx, b->dbufs[i]);
    if (b->dS) ops->release(b->dev->ctx, b->dS);
    if (b->dR) ops->release(b->dev->ctx, b->dR);
  }
  for (size_t i = 0; b->bufs && i < b->nbufs; i++) lm_free(b->bufs[i]);
  lm_free(b->bufs);
  lm_free(b->count);
  lm_free(b->dbufs);
  lm_free(b->host_new);
  lm_free(b->dev_new);
  memset(b, 0, sizeof *b);
}

void skb_fill(sk_bench *b, uint64_t seed) {
  uint64_t st = seed ^ 0x5EA2C4ull;
  for (size_t i = 0; i < b->nbufs; i++)
    for (size_t j = 0; j < b->count[i]; j++) {
      double u = (double)(sk_rand(&st) >> 11) * 0x1.0p-53;
      float v = (float)(0.1 + 0.9 * u);
      b->bufs[i][j] = (sk_rand(&st) & 1) ? v : -v;
    }
  b->seed = seed;
  skb_touch(b, NULL);
  if (b->dev) { /* R = (seed, 7), as the cpu launch passes it */
    uint64_t r[2] = {seed, 7};
    dev_check(b, b->dev->ops->write(b->dev->ctx, b->dR, r, sizeof r));
  }
}

void skb_touch(sk_bench *b, const uint8_t *w) {
  for (size_t i = 0; b->dev && i < b->nbufs; i++)
    if (!w || w[i]) b->host_new[i] = 1, b->dev_new[i] = 0;
}

void skb_pull(sk_bench *b, const uint8_t *w) {
  if (!b->dev) return;
  int synced = 0;
  for (size_t i = 0; i < b->nbufs; i++)
    if ((!w || w[i]) && b->dev_new[i]) {
      if (!synced) dev_check(b, b->dev->ops->sync(b->dev->ctx)), synced = 1;
      if (b->count[i]) dev_check(b, b->dev->ops->read(b->dev->ctx, b->dbufs[i], b->bufs[i], b->count[i] * sizeof(float)));
      b->dev_new[i] = 0;
    }
}

void skb_sync(sk_bench *b) {
  if (b->dev) dev_check(b, b->dev->ops->sync(b->dev->ctx));
}

/* ---------------------------------------------------------------- launching and timing */

typedef struct launch {
  sk_kernel_fn fn;
  float *const *bufs;
  const int64_t *syms;
  const uint64_t *rng;
  int64_t unit, n;
} launch;

static void run_chunk(void *arg, int64_t start, int64_t end) {
  const launch *l = arg;
  int64_t s = start * l->unit, e = end * l->unit;
  l->fn(l->bufs, l->syms, l->rng, s, e < l->n ? e : l->n);
}

enum { BLOCK = 64 }; /* lm_cpu_cut_of's block (compiler/memplan.c) */

/* On the device: up-to-date inputs, one launch, its stores marked newer there. */
static void dev_launch(sk_bench *b, const lm_kernel *k, void *fn, int64_t work) {
  const lm_backend_ops *ops = b->dev->ops;
  if (b->dev_status != LM_OK) return;
  for (size_t j = 0; j < k->nbufs; j++) {
    uint32_t i = k->bufs[j];
    if (i < b->nbufs && b->host_new[i]) {
      if (b->count[i] && dev_check(b, ops->write(b->dev->ctx, b->dbufs[i], b->bufs[i], b->count[i] * sizeof(float))))
        return;
      b->host_new[i] = 0;
    }
  }
  if (dev_check(b, ops->launch_kernel(b->dev->ctx, fn, k, b->dbufs, b->dS, b->dR, work)) != LM_OK) return;
  for (size_t i = 0; i < k->nstmts; i++)
    if (k->stmts[i].op == LM_S_STORE && !k->stmts[i].local && k->stmts[i].buf < b->nbufs) b->dev_new[k->stmts[i].buf] = 1;
}

skb_shape skb_shape_of(const sk_bench *b, const lm_kernel *k) {
  const lm_exprs *x = &b->plan->g->x;
  skb_shape s = {k->npar ? lm_x_eval(x, k->loops[0].extent, NULL, b->syms) : 1, 1, {1, 1}};
  for (int l = 0; l < k->npar; l++) s.work *= lm_x_eval(x, k->loops[l].extent, NULL, b->syms);
  /* cut as the cpu backend cuts it (it used to be by the parallel domain's size alone, which
   * left a 512-row matmul on one thread here and on two in the backend) */
  if (!b->dev) s.cut = lm_cpu_cut_of(lm_kernel_fine(x, k), s.n, lm_kernel_cost(x, k, b->syms));
  return s;
}

void skb_launch_shaped(sk_bench *b, const lm_kernel *k, void *fnp, const skb_shape *s) {
  if (b->dev) {
    dev_launch(b, k, fnp, s->work);
    return;
  }
  sk_kernel_fn fn;
  memcpy(&fn, &fnp, sizeof fn);
  uint64_t rng[2] = {b->seed, 7};
  launch l = {fn, b->bufs, b->syms, rng, s->cut.unit, s->n};
  int64_t chunks = (s->n + s->cut.unit - 1) / s->cut.unit;
  if (b->pool) lm_pool_run(b->pool, run_chunk, &l, chunks, s->cut.min_chunks);
  else run_chunk(&l, 0, chunks);
}

void skb_launch(sk_bench *b, const lm_kernel *k, void *fn) {
  skb_shape s = skb_shape_of(b, k);
  skb_launch_shaped(b, k, fn, &s);
}

double skb_time(sk_bench *b, const lm_kernel *k, void *fn, double cutoff, double max_s) {
  const skb_shape shape = skb_shape_of(b, k);
  skb_launch_shaped(b, k, fn, &shape); /* warm up: caches, page faults, the pool's threads */
  skb_sync(b);
  double t0 = lm_search_now();
  skb_launch_shaped(b, k, fn, &shape);
  skb_sync(b);
  double best = lm_search_now() - t0;
  if (best > cutoff) return best;
  /* many short samples (about 100 us each): on a shared machine the minimum of short samples
   * is the one least disturbed by other processes */
  long batch = best > 0 ? (long)(1e-4 / best) : 1000;
  if (batch < 1) batch = 1;
  if (batch > 100000) batch = 100000;
  double start = lm_search_now();
  for (int rep = 0; rep < 200; rep++) {
    double a = lm_search_now();
    for (long i = 0; i < batch; i++) skb_launch_shaped(b, k, fn, &shape);
    skb_sync(b);
    double per = (lm_search_now() - a) / (double)batch;
    if (per < best) best = per;
    /* five samples at least, but two are enough for a launch of 10 ms or more: its noise is small
     * against it, and a device search may meet many such (a PoCL work-group runs its threads in turn) */
    if (per > cutoff || ((rep >= 4 || per > 0.01) && lm_search_now() - start > max_s)) break;
  }
  return best;
}

double skb_compare(const float *a, const float *b, size_t n, double rtol, double atol) {
  double scale = 0;
  for (size_t i = 0; i < n; i++)
    if (isfinite(b[i]) && fabs(b[i]) > scale) scale = fabs(b[i]);
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(b[i]) || isnan(a[i])) {
      if (isnan(a[i]) != isnan(b[i])) return INFINITY;
      continue;
    }
    if (isinf(b[i]) || isinf(a[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    double tol = rtol * fabs(b[i]) + atol * scale;
    double d = fabs((double)a[i] - (double)b[i]);
    if (d == 0) continue;
    double e = tol > 0 ? d / tol : INFINITY;
    if (e > worst) worst = e;
  }
  return worst;
}

/* ---------------------------------------------------------------- static estimate */

static int is_transcendental(uint8_t op) {
  return op == LM_S_LOG2 || op == LM_S_EXP2 || op == LM_S_SIN || op == LM_S_SQRT || op == LM_S_RAND;
}

double sk_estimate(const lm_plan *p, const lm_kernel *k, const int64_t *syms) {
  const lm_exprs *x = &p->g->x;
  size_t nl = k->nloops;
  double *mult = lm_calloc(nl + 1, sizeof *mult);
  int64_t *trip = lm_calloc(nl + 1, sizeof *trip), *vars = lm_calloc(nl + 1, sizeof *vars);
  uint8_t *inner = lm_calloc(nl + 1, 1), *vec = lm_calloc(nl + 1, 1);
  double total = 0;
  if (!mult || !trip || !vars || !inner || !vec) goto done;
  for (size_t l = 0; l < nl; l++) trip[l] = lm_x_eval(x, k->loops[l].extent, NULL, syms);
  /* what sits outside loop 0 runs once per call, and a call runs a chunk of BLOCK iterations of
   * loop 0 (skb_launch): a joint reduction hoisted to the root is redone for every chunk */
  double calls = k->npar >= 1 && nl && trip[0] > 0 ? (double)((trip[0] + BLOCK - 1) / BLOCK) : 1.0;
  for (size_t l = 0; l < nl; l++) { /* loops are created before their children */
    int32_t par = k->loops[l].parent;
    mult[l] = (double)(trip[l] > 0 ? trip[l] : 0) * (par >= 0 ? mult[par] : l == 0 && k->npar >= 1 ? 1.0 : calls);
    inner[l] = 1;
  }
  for (size_t l = 0; l < nl; l++)
    if (k->loops[l].parent >= 0) inner[k->loops[l].parent] = 0;
  for (size_t l = 0; l < nl; l++) vec[l] = inner[l] && trip[l] >= 8;
  uint32_t *updates = lm_calloc(nl + 1, sizeof *updates);
  if (!updates) goto done;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if ((s->op == LM_S_ACC_SUM || s->op == LM_S_ACC_MAX) && s->loop >= 0) updates[s->loop]++;
  }
  /* one scalar reduction keeps its loop scalar; 8 or more side by side vectorise across statements */
  for (size_t l = 0; l < nl; l++)
    if (updates[l] && updates[l] < 8) vec[l] = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (s->op == LM_S_CONST || s->op == LM_S_ACC) continue;
    double m = s->loop >= 0 ? mult[s->loop] : calls, w = is_transcendental(s->op) ? 12 : 1;
    int v = s->loop >= 0 && vec[s->loop];
    if (v && updates[s->loop] < 8 && (s->op == LM_S_LOAD || s->op == LM_S_STORE) && s->idx) {
      memset(vars, 0, (nl + 1) * sizeof *vars);
      int64_t a = lm_x_eval(x, s->idx, vars, syms);
      vars[s->loop] = 1;
      int64_t d = lm_x_eval(x, s->idx, vars, syms) - a;
      if (d != 0 && d != 1 && d != -1) v = 0, w = 4; /* a strided access: a gather, cache misses */
    }
    if (is_transcendental(s->op)) v = 0;
    total += m * w / (v ? 8.0 : 1.0);
  }
  if (k->npar >= 1 && nl && trip[0] >= 128) total /= 2;
  total += 200; /* launch */
  lm_free(updates);
done:
  lm_free(mult);
  lm_free(trip);
  lm_free(vars);
  lm_free(inner);
  lm_free(vec);
  return total;
}

/* ---------------------------------------------------------------- canonical text */

static void text_block(const lm_plan *p, const lm_kernel *k, int32_t loop, lm_sb *sb) {
  const lm_block *b = loop < 0 ? &k->root : &k->loops[loop].body;
  lm_sb_printf(sb, "{");
  for (size_t i = 0; i < b->n; i++) {
    if (b->items[i].is_loop) {
      const lm_loop *l = &k->loops[b->items[i].id];
      lm_sb_printf(sb, "L%u/%u<", b->items[i].id, l->kind);
      lm_x_print(&p->g->x, l->extent, sb, "i");
      lm_sb_puts(sb, ">");
      text_block(p, k, (int32_t)b->items[i].id, sb);
    } else lm_sb_printf(sb, "s%u,", b->items[i].id);
  }
  lm_sb_printf(sb, "}");
}

char *sk_kernel_text(const lm_plan *p, const lm_kernel *k) {
  lm_sb sb = {0};
  uint32_t *ren = lm_calloc(p->nbufs + 1, sizeof *ren);
  if (!ren) return NULL;
  uint32_t next = 1;
  lm_sb_printf(&sb, "npar %d locals", k->npar);
  for (size_t i = 0; i < k->nlocals; i++) lm_sb_printf(&sb, " %lld", (long long)k->locals[i]);
  lm_sb_puts(&sb, "\n");
  text_block(p, k, -1, &sb);
  lm_sb_puts(&sb, "\n");
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    uint32_t buf = s->buf;
    if ((s->op == LM_S_LOAD || s->op == LM_S_STORE) && !s->local && buf < p->nbufs) {
      if (!ren[buf]) ren[buf] = next++;
      buf = ren[buf];
    }
    uint32_t fb;
    memcpy(&fb, &s->f, sizeof fb);
    lm_sb_printf(&sb, "%zu:%u,%d,%u,%u,%u,%u,%x,%u[", i, s->op, s->loop, s->a, s->b, buf, s->local, fb, s->stream);
    if (s->idx) lm_x_print(&p->g->x, s->idx, &sb, "i");
    lm_sb_puts(&sb, "|");
    if (s->valid) lm_x_print(&p->g->x, s->valid, &sb, "i");
    lm_sb_puts(&sb, "|");
    if (s->step) lm_x_print(&p->g->x, s->step, &sb, "i");
    lm_sb_puts(&sb, "]\n");
  }
  lm_free(ren);
  return lm_sb_take(&sb);
}
