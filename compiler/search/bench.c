/* compiler/search/bench.c — lm_search_bench (lumen/search.h): the default schedule and the
 * searched one of the same graph, compiled and run side by side on the cpu on the same random
 * inputs; outputs compared, each plan timed as a whole (kernels only, minimum over batches).
 * LUMEN_SEARCH_PROFILE=1 also prints every kernel's time in both plans (stderr). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "compile.h"
#include "gpu.h"
#include "passes.h"
#include "render.h"
#include "search/search-impl.h"

typedef struct built {
  lm_compiled comp;
  lm_cc_lib *lib;
  const lm_search_device *dev; /* NULL: the cpu */
  void *module;                /* on the device */
  void **fns;
  int64_t *syms;
  sk_bench bench;
  skb_shape *shapes; /* per kernel, as the backend precomputes its cuts */
  int have_bench;
} built;

static void built_free(built *b) {
  if (b->have_bench) skb_close(&b->bench);
  if (b->lib) lm_cc_lib_close(b->lib);
  for (size_t i = 0; b->dev && b->fns && i < b->comp.plan->nkernels; i++)
    if (b->fns[i]) b->dev->ops->entry_free(b->dev->ctx, b->fns[i]);
  if (b->module) b->dev->ops->module_free(b->dev->ctx, b->module);
  lm_free(b->fns);
  lm_free(b->shapes);
  lm_free(b->syms);
  lm_compiled_free(&b->comp);
  memset(b, 0, sizeof *b);
}

static lm_status bind_syms(built *b, const char *const *names, const int64_t *values, int nsyms, int64_t dflt) {
  const lm_exprs *x = &b->comp.g->x;
  if (!(b->syms = lm_calloc(x->nsyms + 1, sizeof *b->syms))) return LM_ERR_NOMEM;
  for (size_t i = 0; i < x->nsyms; i++) {
    b->syms[i] = sk_sym_value(&x->syms[i], dflt);
    for (int j = 0; j < nsyms; j++)
      if (names && names[j] && !strcmp(names[j], x->syms[i].name)) b->syms[i] = values[j];
  }
  return LM_OK;
}

static lm_status build_plan(built *b, lm_cc *cc, lm_pool *pool, uint64_t seed, const char *tag) {
  const lm_search_device *dev = b->dev;
  char *src = lm_render_plan(b->comp.plan, dev ? dev->ops->kernel_dialect : LM_DIALECT_C);
  if (!src) return LM_ERR_INVALID;
  lm_dump_source(tag, dev ? "gpu" : "c", src, b->comp.plan);
  lm_status st = dev ? dev->ops->module_build(dev->ctx, src, &b->module) : lm_cc_build(cc, src, &b->lib);
  lm_free(src);
  if (st != LM_OK) return st;
  const lm_plan *p = b->comp.plan;
  if (!(b->fns = lm_calloc(p->nkernels + 1, sizeof *b->fns))) return LM_ERR_NOMEM;
  for (size_t i = 0; i < p->nkernels; i++) {
    char name[48];
    lm_render_entry_name(&p->kernels[i], name, sizeof name);
    if (dev) {
      if ((st = dev->ops->module_entry(dev->ctx, b->module, name, &p->kernels[i], &b->fns[i])) != LM_OK) return st;
    } else if (!(b->fns[i] = lm_cc_sym(b->lib, name)))
      return LM_ERR_COMPILE;
  }
  st = skb_open(&b->bench, p, b->syms, pool, dev, seed);
  b->have_bench = st == LM_OK;
  if (st == LM_OK && !(b->shapes = lm_calloc(p->nkernels + 1, sizeof *b->shapes))) st = LM_ERR_NOMEM;
  for (size_t i = 0; st == LM_OK && i < p->nkernels; i++) b->shapes[i] = skb_shape_of(&b->bench, &p->kernels[i]);
  return st;
}

static void run_plan(built *b) {
  const lm_plan *p = b->comp.plan;
  for (size_t i = 0; i < p->nkernels; i++) skb_launch_shaped(&b->bench, &p->kernels[i], b->fns[i], &b->shapes[i]);
  skb_sync(&b->bench);
}

/* The minimum over many short samples (about 200 us, at least one run each). */
static double time_plan(built *b, double max_s) {
  double best = INFINITY, start = lm_search_now();
  run_plan(b);
  for (int rep = 0; rep < 2000; rep++) {
    double a = lm_search_now();
    int n = 0;
    do {
      run_plan(b);
      n++;
    } while (lm_search_now() - a < 2e-4);
    double per = (lm_search_now() - a) / n;
    if (per < best) best = per;
    if (rep >= 5 && lm_search_now() - start > max_s) break;
  }
  return best;
}

/* Buffers holding results: the outputs and the values assigned to state. */
static int is_result(const lm_plan *p, size_t b) {
  if (p->bufs[b].kind == LM_BUF_OUTPUT) return 1;
  for (size_t i = 0; i < p->ncopies; i++)
    if (p->copies[i].src == b) return 1;
  return 0;
}

lm_status lm_search_bench(const lm_graph_t *g, const char *const *sym_names, const int64_t *sym_values, int nsyms,
                          const lm_search_options *o, lm_search_bench_result *out) {
  memset(out, 0, sizeof *out);
  lm_search_options dflt;
  if (!o) {
    lm_search_options_init(&dflt);
    o = &dflt;
  }
  built a = {0}, b = {0};
  lm_cc *cc = NULL;
  lm_pool *pool = NULL;
  lm_search_report rep = {0};
  lm_status st;
  /* on a device: its search view, and its work-group schedules for both plans */
  lm_backend_t *be = NULL;
  lm_search_device sd, *dev = NULL;
  lm_gpu_options go;
  if (o->backend && *o->backend && strcmp(o->backend, "cpu")) {
    void *ctx = NULL;
    const lm_backend_ops *ops = (be = lm_backend_new(o->backend)) ? lm_backend_parts(be, &ctx) : NULL;
    if (!ops) {
      st = LM_ERR_UNSUPPORTED; /* the message says why */
      goto done;
    }
    if (!ops->search_device || !ops->module_build) {
      st = lm_fail(LM_ERR_UNSUPPORTED, "search bench: the %s backend cannot time kernels one by one", ops->name);
      goto done;
    }
    ops->search_device(ctx, &sd, &go);
    dev = &sd;
  }
  a.dev = b.dev = dev;
  /* a: the default schedule; b: the lowered plan, which the search rewrites (it applies the default
   * schedule's rewrites itself where it keeps a kernel) */
  static const lm_compile_options cpu_default = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  static const lm_compile_options gpu_default = {0};                          /* as the GPU backends */
  if ((st = lm_compile_ex(g, NULL, dev ? &gpu_default : &cpu_default, &a.comp)) != LM_OK) goto done;
  if (dev && dev->gpu) lm_schedule_gpu(a.comp.plan, dev->gpu);
  if (!(b.comp.g = lm_canonicalize_ex(g, LM_CANON_EXACT, NULL))) {
    st = LM_ERR_INVALID;
    goto done;
  }
  if ((st = lm_lower(b.comp.g, &b.comp.plan)) != LM_OK) goto done;
  int64_t d = o->sym_default > 0 ? o->sym_default : 256;
  if ((st = bind_syms(&a, sym_names, sym_values, nsyms, d)) != LM_OK) goto done;
  if ((st = bind_syms(&b, sym_names, sym_values, nsyms, d)) != LM_OK) goto done;
  double t0 = lm_search_now();
  st = lm_search_plan_on(b.comp.plan, b.syms, o, &rep, dev);
  out->search_wall_s = lm_search_now() - t0;
  if (st != LM_OK) goto done;
  /* then the rest of the default pipeline, as lm_compile runs it after the interchange (on the
   * cpu: epilogues, merge, joins; they leave the kernels the search measured alone) */
  if ((!dev && !getenv("LUMEN_NO_EPILOGUE") && lm_schedule_epilogue(b.comp.plan) < 0) ||
      (!getenv("LUMEN_NO_MERGE") && lm_schedule_merge(b.comp.plan, LM_MERGE_BACK) < 0) ||
      (!dev && !getenv("LUMEN_NO_JOIN") && lm_schedule_join(b.comp.plan) < 0)) {
    st = lm_fail(LM_ERR_NOMEM, "search bench: out of memory merging kernels");
    goto done;
  }
  if (dev && dev->gpu) lm_schedule_gpu(b.comp.plan, dev->gpu); /* the kernels the search left */
  out->candidates = rep.candidates;
  out->wrong = rep.wrong;
  out->from_cache = rep.from_cache;
  size_t len = 0;
  for (int i = 0; i < rep.nkernels; i++)
    if (rep.kernels[i].rules[0] && len < sizeof out->winner) {
      int w = snprintf(out->winner + len, sizeof out->winner - len, "%s%s: %s", len ? "; " : "", rep.kernels[i].name,
                       rep.kernels[i].rules);
      if (w > 0) len += (size_t)w;
    }
  if (len >= sizeof out->winner) out->winner[sizeof out->winner - 1] = 0;
  if (!dev && ((st = lm_cc_open(&cc)) != LM_OK || (st = lm_pool_new(o->threads, &pool)) != LM_OK)) goto done;
  if ((st = build_plan(&a, cc, pool, o->seed + 99, "search-default")) != LM_OK || (st = build_plan(&b, cc, pool, o->seed + 99, "search-searched")) != LM_OK)
    goto done;
  out->kernels_default = (int)a.comp.plan->nkernels;
  out->kernels_searched = (int)b.comp.plan->nkernels;
  const lm_plan *pa = a.comp.plan, *pb = b.comp.plan;
  if (pa->nbufs != pb->nbufs) {
    st = lm_fail(LM_ERR_INVALID, "search bench: the plans differ in buffers");
    goto done;
  }
  run_plan(&a);
  run_plan(&b);
  skb_pull(&a.bench, NULL);
  skb_pull(&b.bench, NULL);
  if (a.bench.dev_status != LM_OK || b.bench.dev_status != LM_OK) {
    st = a.bench.dev_status != LM_OK ? a.bench.dev_status : b.bench.dev_status;
    goto done;
  }
  for (size_t i = 0; i < pa->nbufs; i++) {
    if (!is_result(pa, i)) continue;
    double num = 0, den = 0;
    for (size_t j = 0; j < a.bench.count[i]; j++) {
      double x = a.bench.bufs[i][j], y = b.bench.bufs[i][j];
      if (fabs(x - y) > num || (isnan(x) != isnan(y))) num = isnan(x) != isnan(y) ? INFINITY : fabs(x - y);
      if (fabs(x) > den) den = fabs(x);
    }
    double e = den > 0 ? num / den : num;
    if (e > out->max_rel_err) out->max_rel_err = e;
  }
  if (getenv("LUMEN_SEARCH_PROFILE")) {
    for (int w = 0; w < 2; w++) {
      built *x = w ? &b : &a;
      double sum = 0;
      for (size_t i = 0; i < x->comp.plan->nkernels; i++) {
        const lm_kernel *k = &x->comp.plan->kernels[i];
        double t = skb_time(&x->bench, k, x->fns[i], INFINITY, 0.02);
        sum += t;
        fprintf(stderr, "%s %-20s %8.2f us\n", w ? "searched" : "default ", k->name, 1e6 * t);
      }
      fprintf(stderr, "%s sum %.2f us\n", w ? "searched" : "default ", 1e6 * sum);
    }
  }
  /* in turns, the minimum of each: a slow spell of the machine (another process, the search's
   * last compiles finishing) then costs both plans alike instead of whichever was timing */
  out->default_s = out->searched_s = INFINITY;
  for (int turn = 0; turn < 3; turn++) {
    out->default_s = fmin(out->default_s, time_plan(&a, 0.5));
    out->searched_s = fmin(out->searched_s, time_plan(&b, 0.5));
  }
  out->speedup = out->searched_s > 0 ? out->default_s / out->searched_s : 0;
done:
  lm_search_report_free(&rep);
  built_free(&a);
  built_free(&b);
  if (pool) lm_pool_free(pool);
  if (cc) lm_cc_close(cc);
  lm_backend_free(be);
  return st;
}
