/* compiler/backends/cpu.c — the cpu backend: canonicalise, lower with the default schedule,
 * render C, build a shared object with the system compiler (cached), and run the plan's
 * kernels in order on a static thread pool. Each kernel's outer parallel loop is split
 * into contiguous chunks, so results do not depend on the thread count. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cc.h"
#include "memplan.h"
#include "compile.h"
#include "lumen/search.h"
#include "pool.h"
#include "render.h"

typedef void (*kernel_fn)(float *const *B, const int64_t *S, const uint64_t *R, int64_t start, int64_t end);

typedef struct cpu_ctx {
  lm_cc *cc;
  lm_pool *pool;
} cpu_ctx;

typedef struct cpu_exe {
  lm_graph_t *g; /* canonical graph (owned) */
  lm_plan *plan;
  lm_cc_lib *lib;
  kernel_fn *fns;
  lm_layout layout;
  int64_t *layout_syms; /* symbol values the layout was computed for */
  int have_layout;
  char *arena;
  size_t arena_cap;
  float **bufs;
  lm_scan_info scan;
  uint8_t *per_step;
  int fused; /* the scan runs as one plan over all steps */
  uint8_t *fine; /* per kernel: chunks may split its outer loop anywhere (lm_kernel_fine) */
  lm_pool_judge *judges; /* per kernel: whether its runs are worth the workers (lm_pool_run_judged) */
  int lanes;     /* envs per block of the fused scan in lanes (1: none) */
  struct cpu_exe *narrow; /* the same scan in blocks of NARROW_LANES, for few envs (or NULL) */
  struct cpu_exe *single; /* the same scan one env at a time, for fewer hinted envs (or NULL) */
  lm_expr envs;           /* a fused scan's envs (lm_compiled.envs; 0: unknown) */
} cpu_exe;

static lm_status cpu_open(void **out) {
  cpu_ctx *c = lm_calloc(1, sizeof *c);
  if (!c) return LM_ERR_NOMEM;
  lm_status st = lm_cc_open(&c->cc);
  if (st == LM_OK) st = lm_pool_new(0, &c->pool);
  if (st != LM_OK) {
    if (c->cc) lm_cc_close(c->cc);
    lm_free(c);
    return st;
  }
  *out = c;
  return LM_OK;
}

static void cpu_close(void *ctx) {
  cpu_ctx *c = ctx;
  if (!c) return;
  lm_pool_free(c->pool);
  lm_cc_close(c->cc);
  lm_free(c);
}

static lm_status cpu_alloc(void *ctx, size_t bytes, void **buf) {
  (void)ctx;
  *buf = lm_malloc_aligned(bytes);
  return *buf ? LM_OK : LM_ERR_NOMEM;
}
static void cpu_release(void *ctx, void *buf) {
  (void)ctx;
  lm_free(buf);
}
static lm_status cpu_write(void *ctx, void *buf, const void *src, size_t bytes) {
  (void)ctx;
  memcpy(buf, src, bytes);
  return LM_OK;
}
static lm_status cpu_read(void *ctx, const void *buf, void *dst, size_t bytes) {
  (void)ctx;
  memcpy(dst, buf, bytes);
  return LM_OK;
}
static lm_status cpu_zero(void *ctx, void *buf, size_t bytes) {
  (void)ctx;
  memset(buf, 0, bytes);
  return LM_OK;
}

static void cpu_unprepare(void *ctx, void *p) {
  (void)ctx;
  cpu_exe *x = p;
  if (!x) return;
  if (x->lib) lm_cc_lib_close(x->lib);
  lm_plan_free(x->plan);
  lm_graph_free(x->g);
  lm_layout_free(&x->layout);
  lm_free(x->layout_syms);
  lm_free(x->fns);
  lm_free(x->arena);
  lm_free(x->bufs);
  lm_free(x->per_step);
  lm_free(x->fine);
  lm_free(x->judges);
  if (x->narrow) cpu_unprepare(ctx, x->narrow);
  if (x->single) cpu_unprepare(ctx, x->single);
  lm_free(x);
}

/* Envs per SIMD block of a fused scan: 64, eight 256-bit vectors of floats per lane loop (one
 * vector per loop leaves the C compiler a one-trip loop around each vector statement; more
 * amortise it: the CartPole rollout runs 1.44x faster with 32 than with 8, and with 64 than
 * with 32 3.39e6 against 3.16e6 steps/s, env-only CartPole 1.61e8 against 1.49e8, where a
 * block's lazy reset draws (compiler/lazy.c) then overlap more). 64 is the most a sparse
 * loop's mask holds. LUMEN_SCAN_LANES overrides it (1 = one env at a time, for comparisons). */
static int scan_lanes(void) {
  const char *e = getenv("LUMEN_SCAN_LANES");
  if (!e || !*e) return LM_CPU_SCAN_LANES;
  long v = strtol(e, NULL, 10);
  return v < 1 ? 1 : v > 64 ? 64 : (int)v;
}

static lm_status prepare_lanes(void *ctx, lm_graph_t *g, const lm_scan_info *scan, int lanes, cpu_exe **out) {
  cpu_ctx *c = ctx;
  cpu_exe *x = lm_calloc(1, sizeof *x);
  if (!x) return LM_ERR_NOMEM;
  lm_status st = LM_ERR_NOMEM;
  char *src = NULL;
  if (scan->active) {
    x->scan = *scan;
    if (!(x->per_step = lm_calloc(g->ninputs + 1, 1))) goto fail;
    memcpy(x->per_step, scan->per_step, g->ninputs);
    x->scan.per_step = x->per_step;
  }
  lm_compiled comp;
  lm_search_options so;
  lm_search_options_init(&so); /* budget from $LUMEN_SEARCH_BUDGET; 0 = the default schedule */
  lm_compile_options co = {.search = &so, .interchange = 1, .stage = 1, .lanes = lanes, .join = 1};
  if ((st = lm_compile_ex(g, scan, &co, &comp)) != LM_OK) goto fail;
  x->g = comp.g;
  x->plan = comp.plan;
  x->fused = comp.fused;
  x->lanes = comp.lanes > 1 ? comp.lanes : 1;
  x->envs = comp.envs;
  st = LM_ERR_NOMEM;
  if (!(src = lm_render_plan(x->plan, LM_DIALECT_C))) goto fail;
  lm_dump_source("cpu", "c", src, x->plan);
  if ((st = lm_cc_build(c->cc, src, &x->lib)) != LM_OK) goto fail;
  x->fns = lm_calloc(x->plan->nkernels + 1, sizeof *x->fns);
  if ((x->fine = lm_calloc(x->plan->nkernels + 1, 1)))
    for (size_t i = 0; i < x->plan->nkernels; i++) x->fine[i] = (uint8_t)lm_kernel_fine(&x->plan->g->x, &x->plan->kernels[i]);
  if ((x->judges = lm_calloc(x->plan->nkernels + 1, sizeof *x->judges)))
    for (size_t i = 0; i < x->plan->nkernels; i++) lm_pool_judge_init(&x->judges[i]);
  x->bufs = lm_calloc(x->plan->nbufs + 1, sizeof *x->bufs);
  x->layout_syms = lm_calloc(x->g->x.nsyms + 1, sizeof *x->layout_syms);
  st = LM_ERR_NOMEM;
  if (!x->fns || !x->bufs || !x->layout_syms || !x->judges) goto fail;
  for (size_t i = 0; i < x->plan->nkernels; i++) {
    void *sym = lm_cc_sym(x->lib, x->plan->kernels[i].name);
    if (!sym) {
      st = LM_ERR_COMPILE;
      goto fail;
    }
    memcpy(&x->fns[i], &sym, sizeof sym); /* object pointer -> function pointer, as dlsym requires */
  }
  lm_free(src);
  *out = x;
  return LM_OK;
fail:
  lm_free(src);
  cpu_unprepare(ctx, x);
  return st;
}

/* A fused scan in blocks of 64 envs leaves most threads idle, and most lanes empty, when there
 * are few envs (PPO's default 16): such scans are also compiled in blocks of 8, and a run
 * takes that form while the wide one has fewer than two blocks per thread. */
enum { NARROW_LANES = 8 };

/* A scan whose envs the graph's hints (lm_sym_hint) put at one narrow block or fewer runs one env
 * at a time (LUMEN_SCAN_LANES=1's form: each layer's outputs a loop in SIMD, an env a point), so
 * that its envs spread over the threads where a block would keep them on one. rlbench --only
 * rollout, CartPole + 64x64 MLP, 128 steps, env steps/s, one at a time against 8-lane blocks:
 * 4 envs 2.10e6 against 1.42e6 on one thread, 3.02e6-3.45e6 against 1.45e6 on two; 8 envs
 * 2.15e6 against 2.33e6 on one thread, 3.20e6-3.87e6 against 2.18e6-2.34e6 on two; 12 envs
 * (two blocks) 1.86e6 against 2.17e6-2.25e6 on two. rltrain cartpole with defaults (8 envs),
 * 500k steps, medians interleaved: 0.505 s against 0.564 s on two threads, 0.738 against 0.705
 * on one. The two forms round apart where the lanes vectorise a transcendental (libmvec's sinf,
 * expf) that one env computes in scalar code, so the form is the graph's choice (its hints),
 * never the bound N's, the threads' or timing's: a program runs one form at every N, and a
 * rank's part of a batch, hinted with the whole batch's envs (rollout/rollout.c), runs the form
 * one process would. */
enum { SINGLE_ENVS = NARROW_LANES };

/* Do the graph's hints (lm_sym_hint: a rollout's envs) put the scan's envs at SINGLE_ENVS or
 * fewer? */
static int few_envs_hinted(const cpu_exe *x) {
  const lm_exprs *e = &x->g->x;
  if (!x->envs || e->nsyms > 64) return 0;
  int64_t syms[64];
  for (size_t i = 0; i < e->nsyms; i++) syms[i] = e->syms[i].hint;
  uint64_t used = lm_x_syms_used(e, x->envs);
  for (size_t i = 0; i < e->nsyms; i++)
    if (used >> i & 1 && syms[i] < 1) return 0; /* one not hinted */
  return lm_x_eval(e, x->envs, NULL, syms) <= SINGLE_ENVS;
}

static lm_status cpu_prepare(void *ctx, lm_graph_t *g, const lm_scan_info *scan, void **out) {
  cpu_exe *x = NULL;
  int lanes = scan_lanes();
  lm_status st = prepare_lanes(ctx, g, scan, lanes, &x);
  if (st != LM_OK) return st;
  int forms = x->lanes > NARROW_LANES && !getenv("LUMEN_SCAN_LANES"); /* other lane widths */
  if (forms && few_envs_hinted(x)) { /* one env at a time: the narrow blocks are not needed */
    if ((st = prepare_lanes(ctx, g, scan, 1, &x->single)) != LM_OK) {
      cpu_unprepare(ctx, x);
      return st;
    }
    if (!x->single->fused) { /* not one kernel: the blocks run it */
      cpu_unprepare(ctx, x->single);
      x->single = NULL;
    }
  }
  if (forms && !x->single && (st = prepare_lanes(ctx, g, scan, NARROW_LANES, &x->narrow)) != LM_OK) {
    cpu_unprepare(ctx, x);
    return st;
  }
  *out = x;
  return LM_OK;
}


typedef struct launch {
  kernel_fn fn;
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

/* The plan's layout (sizes, offsets, the arena) under these symbol values. */
static lm_status ensure_layout(cpu_exe *x, const int64_t *syms) {
  const lm_plan *plan = x->plan;
  size_t ns = x->g->x.nsyms;
  if (!x->have_layout || !lm_layout_holds(&x->layout, x->layout_syms, syms, ns)) {
    lm_layout_free(&x->layout);
    x->have_layout = 0;
    lm_status st = lm_layout_compute(plan, syms, &x->layout);
    if (st != LM_OK) return st;
    if (ns) memcpy(x->layout_syms, syms, ns * sizeof *syms);
    x->have_layout = 1;
    if (x->layout.arena_bytes > x->arena_cap) { /* temporaries only: nothing to carry over */
      char *a = lm_malloc_aligned(x->layout.arena_bytes);
      if (!a) return LM_ERR_NOMEM;
      lm_free(x->arena);
      x->arena = a;
      x->arena_cap = x->layout.arena_bytes;
    }
  }
  return LM_OK;
}

static lm_status cpu_step(void *ctx, void *p, const lm_run_args *args) {
  cpu_ctx *c = ctx;
  cpu_exe *x = p;
  const lm_plan *plan = x->plan;
  lm_status st = ensure_layout(x, args->syms);
  if (st != LM_OK) return st;
  for (size_t i = 0; i < plan->nbufs; i++) {
    const lm_pbuf *b = &plan->bufs[i];
    x->bufs[i] = b->kind == LM_BUF_INPUT    ? args->inputs[b->index]
                 : b->kind == LM_BUF_OUTPUT ? args->outputs[b->index]
                 : x->arena                 ? (float *)(void *)(x->arena + x->layout.offset[i])
                                            : NULL; /* no temporaries live in memory */
  }
  uint64_t rng[2] = {args->seed, args->run};
  for (size_t i = 0; i < plan->nkernels; i++) {
    int64_t n = x->layout.extent[i];
    lm_cpu_cut cut = lm_cpu_cut_of(x->fine && x->fine[i], n, x->layout.cost[i]);
    launch l = {x->fns[i], x->bufs, args->syms, rng, cut.unit, n};
    lm_pool_run_judged(c->pool, run_chunk, &l, (n + cut.unit - 1) / cut.unit, cut.min_chunks, &x->judges[i]);
  }
  for (size_t i = 0; i < plan->ncopies; i++) {
    const lm_copy *cp = &plan->copies[i];
    memcpy(x->bufs[cp->dst], x->bufs[cp->src], x->layout.count[cp->dst] * sizeof(float));
  }
  return LM_OK;
}

static lm_status cpu_run(void *ctx, void *p, const lm_run_args *args) {
  cpu_ctx *c = ctx;
  cpu_exe *x = p;
  if (x->fused) {
    lm_run_args a = *args;
    a.run = args->run * (uint64_t)args->syms[x->scan.sym_T];
    if (x->single) return cpu_step(ctx, x->single, &a);
    if (x->narrow) {
      lm_status st = ensure_layout(x, args->syms);
      if (st != LM_OK) return st;
      if (x->layout.extent[0] < 2 * (int64_t)lm_pool_size(c->pool)) return cpu_step(ctx, x->narrow, &a);
    }
    return cpu_step(ctx, p, &a);
  }
  return x->scan.active ? lm_scan_by_steps(ctx, p, x->g, &x->scan, args, cpu_step) : cpu_step(ctx, p, args);
}

static lm_status cpu_stats(void *ctx, void *p, const int64_t *syms, lm_program_stats *out) {
  (void)ctx;
  cpu_exe *x = p;
  return lm_plan_stats(x->plan, &x->scan, x->fused, syms, out);
}

static lm_status cpu_sync(void *ctx) {
  (void)ctx;
  return LM_OK;
}

const lm_backend_ops lm_backend_cpu = {
    .name = "cpu",
    .description = "C kernels built with the system compiler, run on a thread pool",
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .write = cpu_write,
    .read = cpu_read,
    .fill_zero = cpu_zero,
    .host_memory = 1,
    .prepare = cpu_prepare,
    .unprepare = cpu_unprepare,
    .run = cpu_run,
    .sync = cpu_sync,
    .stats = cpu_stats,
};
