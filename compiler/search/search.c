/* compiler/search/search.c — the search driver (search.h). Two stages, each cached:
 *  1. the plan: independent kernels over the same domain are fused (kernel-fuse + loop fusion
 *     in an e-graph of the whole plan; the greedy extraction is then timed against the default);
 *  2. each kernel: equality saturation over the kernel's term, candidates extracted (greedy,
 *     exhaustive when few, else random genomes in context), emitted, rendered and deduplicated by
 *     source, ranked by a static estimate; the best and a few random ones are compiled together,
 *     checked against the reference interpreter on random inputs and timed (generation 0). When
 *     the space is too large to enumerate, a genetic search follows within the kernel's share of
 *     the budget: offspring of the fastest measured genomes (crossover, mutation), deduplicated
 *     by source against every candidate tried, compiled, checked and timed the same way, a
 *     generation at a time. The fastest correct candidate replaces the kernel when it beats the
 *     default.
 * Identical kernels are searched once. Every decision (winners, and "keep the default") goes into
 * the tuning cache, keyed by the kernel's canonical text, the device, the compiler and flags and
 * the size bucket of every symbol; a rerun with a warm cache builds no e-graph and times nothing.
 * A cached decision is checked against the reference (random inputs, one run) the first time a
 * process applies it; one that fails is discarded and the kernel (or the fusion) searched again. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "compile.h"
#include "gpu.h"
#include "render.h"
#include "search/search-impl.h"

void lm_search_options_init(lm_search_options *o) {
  memset(o, 0, sizeof *o);
  o->max_candidates = 24;
  o->samples = 160;
  o->use_cache = 1;
  o->allow_rounding = 1;
  o->fuse_kernels = 1;
  o->sym_default = 256;
  o->min_work = 4096;
  o->seed = 0x5EA6C4ull;
  o->generations = SK_GA_GENERATIONS;
  const char *e;
  if ((e = getenv("LUMEN_SEARCH_BUDGET")) && *e) {
    double b = strtod(e, NULL);
    o->budget_s = b > 0 && b < 1e7 ? b : 0;
  }
  if ((e = getenv("LUMEN_SEARCH_GENERATIONS")) && *e) {
    long g = strtol(e, NULL, 10);
    o->generations = g < 0 ? 0 : g > 1000 ? 1000 : (int)g;
  }
  if ((e = getenv("LUMEN_SEARCH_LOG")) && *e) o->log_path = e;
  if ((e = getenv("LUMEN_SEARCH_CACHE")) && !strcmp(e, "0")) o->use_cache = 0;
  if ((e = getenv("LUMEN_SEARCH_CACHE_ONLY")) && !strcmp(e, "1")) o->cache_only = 1;
  if ((e = getenv("LUMEN_SEARCH_EXACT")) && !strcmp(e, "1")) o->allow_rounding = 0;
}

void lm_search_report_free(lm_search_report *r) {
  if (!r) return;
  lm_free(r->kernels);
  memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- state */

static const char *const cs_names[] = {"untested", "ok", "WRONG", "no-build", "slow"};

typedef struct cand {
  lm_kernel k;
  char *term; /* NULL: the default schedule */
  uint64_t hash, rules;
  int rounding;
  double est, time;
  int status;
  void *fn;        /* cpu: an sk_kernel_fn; device: the backend's entry */
  int gpu;         /* the gpu work-group schedule applied on top of the term (device searches) */
  uint8_t part;     /* the translation unit it was compiled in (compile_jobs) */
  uint32_t *genome; /* node per class (genetic search only; NULL otherwise) */
  int gen;          /* generation that made it */
  int variant;      /* 0 as emitted, 1 work-groups, 2 packed, 3 vector, 4 packed vector (add_term) */
  int seed;         /* 1: a register tile assembled on purpose (sk_tile_seed); 2: the default in vector form */
  int seed_order;   /* tile seeds: which are timed first past the cut (lower first) */
  char op[48];      /* how: default, greedy, random, exhaustive, mutation(cN), crossover(cA,cB)[+mutation] */
} cand;

typedef struct job {
  uint32_t ki;
  uint64_t key;
  cand *c; /* c[0]: the default */
  size_t nc, cap;
  size_t enode, eclass;
  int iters, stop, samples, distinct, unemitted;
  double egraph_s;
  double space;     /* terms in the reachable space (capped) */
  /* the genetic search (a large space): the saturated e-graph is kept until the job is measured */
  lm_sk *sk;
  uint32_t root, *best;
  int generations;  /* generations timed (the first included) */
  char stop_why[64];
} job;

typedef struct sctx {
  const lm_search_options *o;
  lm_plan *plan;
  int64_t *syms;
  lm_cc *cc;
  lm_pool *pool;
  sk_cache cache;
  char *devid;
  FILE *log;
  double t0, deadline;
  uint64_t rng;
  sk_bench bench;
  int have_bench;
  lm_search_report *rep;
  lm_search_kernel_report *kr; /* per kernel of the plan after stage 1 */
  const lm_search_device *dev; /* NULL: the cpu */
  int dialect;                 /* what candidates are rendered in */
  void **libs;                 /* cpu: lm_cc_lib; device: the backend's modules */
  double cc_s, cc_n;           /* compiling so far: wall seconds, candidates */
  size_t keep_cap;             /* candidates a kernel's generation 0 may keep (0: no cap) */
  size_t nlibs, libcap;
  void **entries;              /* device: the entries looked up (freed at the end) */
  size_t nentries, entrycap;
  uint8_t *enabled_k, *enabled_p;
  int ga_generations; /* generation limit of the genetic search (0: none) */
  sk_trace *trace;    /* NULL: not recorded */
} sctx;

static void logf_(sctx *c, const char *fmt, ...) LM_PRINTF(2, 3);
static void logf_(sctx *c, const char *fmt, ...) {
  if (!c->log) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(c->log, fmt, ap);
  va_end(ap);
}

static void rule_names(uint64_t mask, char *buf, size_t cap) {
  int n;
  const lm_rule *rules = sk_rules(&n);
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n && i < 64; i++)
    if ((mask >> i) & 1) {
      int w = snprintf(buf + len, cap - len, "%s%s", len ? "+" : "", rules[i].name);
      if (w < 0 || (size_t)w >= cap - len) break;
      len += (size_t)w;
    }
}

static uint64_t key_of(sctx *c, const char *text, const char *stage) {
  uint64_t h = lm_hash_bytes(text, strlen(text), 0x4C554D454E5345ull);
  h = lm_hash_bytes(c->devid, strlen(c->devid), h);
  h = lm_hash_bytes(stage, strlen(stage), h);
  const lm_exprs *x = &c->plan->g->x;
  for (size_t i = 0; i < x->nsyms; i++) { /* symbol-size bucket: the bit length of each value */
    int bits = 0;
    for (uint64_t v = (uint64_t)(c->syms[i] > 0 ? c->syms[i] : 0); v; v >>= 1) bits++;
    h = lm_hash_bytes(x->syms[i].name, strlen(x->syms[i].name), h);
    h = lm_hash_bytes(&bits, sizeof bits, h);
  }
  int opts[2] = {c->o->allow_rounding, c->o->fuse_kernels};
  return lm_hash_bytes(opts, sizeof opts, h);
}

/* The budget's clock (lm_search_options.clock); candidates are timed on lm_search_now. */
static double now_(const sctx *c) { return c->o->clock ? c->o->clock(c->o->clock_ctx) : lm_search_now(); }
static int time_left(const sctx *c) { return now_(c) < c->deadline; }
/* A kernel whose default schedule takes under 2 us, or under 0.5% of the plan's, is too small to
 * matter. A measured time: under a caller's clock (tests) every kernel counts, so what is searched
 * does not depend on how fast the machine runs it (a 64^3 matmul: 1.5-3 us on 2-core machines). */
static int too_small(const sctx *c, double t, double total) {
  return !c->o->clock && (t < 0.005 * total || t < 2e-6);
}
static double overrun(const sctx *c) { return c->o->budget_s / 10 > 0.5 ? c->o->budget_s / 10 : 0.5; }

/* Statements a kernel executes: a loop of 1024 iterations whose body calls exp and log is
 * worth a search (the PPO update's entropy sum: 9.6 us), one that copies 1024 floats is not. */
static int64_t kernel_work(const sctx *c, const lm_kernel *k) {
  int64_t w = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    int64_t n = 1;
    for (int32_t l = k->stmts[i].loop; l >= 0 && n < ((int64_t)1 << 40); l = k->loops[l].parent) {
      int64_t e = lm_x_eval(&c->plan->g->x, k->loops[l].extent, NULL, c->syms);
      n *= e > 0 ? e : 1;
    }
    w += n;
    if (w > ((int64_t)1 << 40)) return w;
  }
  return w;
}

/* Buffers a kernel stores to (a bitmap over plan buffers). */
static void written(const lm_plan *p, const lm_kernel *k, uint8_t *w) {
  memset(w, 0, p->nbufs + 1);
  for (size_t i = 0; i < k->nstmts; i++)
    if (k->stmts[i].op == LM_S_STORE && !k->stmts[i].local && k->stmts[i].buf < p->nbufs) w[k->stmts[i].buf] = 1;
}

/* ---------------------------------------------------------------- compiling */

static lm_status add_source(sctx *c, lm_sb *tu, const lm_kernel *k, const char *name) {
  lm_kernel tmp = *k; /* shallow: only the name differs */
  size_t len = strlen(name);
  if (len >= sizeof tmp.name) return LM_ERR_INVALID; /* a truncated name could repeat another */
  memcpy(tmp.name, name, len + 1);
  char *src = lm_render_kernel(c->plan, &tmp, c->dialect);
  if (!src) return LM_ERR_INVALID;
  lm_sb_puts(tu, "\n");
  lm_sb_puts(tu, src);
  lm_free(src);
  return LM_OK;
}

static void *build_tu(sctx *c, const char *src) {
  void *lib = NULL;
  if (c->dev) {
    if (c->dev->ops->module_build(c->dev->ctx, src, &lib) != LM_OK) {
      logf_(c, "  (a translation unit did not build on the device: %.400s)\n", lm_last_error());
      return NULL;
    }
  } else if (lm_cc_build(c->cc, src, (lm_cc_lib **)&lib) != LM_OK)
    return NULL;
  if (!LM_GROW(c->libs, c->libcap, c->nlibs + 1)) {
    if (c->dev) c->dev->ops->module_free(c->dev->ctx, lib);
    else lm_cc_lib_close(lib);
    return NULL;
  }
  c->libs[c->nlibs++] = lib;
  return lib;
}

/* The kernel `name` of a built translation unit: a function pointer on the cpu, the backend's
 * entry (kept for freeing at the end) on a device. */
static void *sym_fn(sctx *c, void *lib, const char *name, const lm_kernel *k) {
  if (c->dev) {
    void *e = NULL;
    if (!LM_GROW(c->entries, c->entrycap, c->nentries + 1) ||
        c->dev->ops->module_entry(c->dev->ctx, lib, name, k, &e) != LM_OK)
      return NULL;
    c->entries[c->nentries++] = e;
    return e;
  }
  return lm_cc_sym(lib, name);
}

/* One translation unit built by a thread of its own (the C compiler runs as a process). */
typedef struct tu_build {
  lm_cc *cc;
  char *src;
  lm_cc_lib *lib;
  char why[400];
} tu_build;

static void *tu_build_main(void *arg) {
  tu_build *t = arg;
  if (lm_cc_build(t->cc, t->src, &t->lib) != LM_OK) {
    t->lib = NULL;
    snprintf(t->why, sizeof t->why, "%s", lm_last_error());
  }
  return NULL;
}

enum { MAX_PARTS = 8 };

/* Compiles every candidate of every job: on the cpu in one translation unit per thread of the
 * pool (at most 8), built side by side, the candidates dealt out in turn (a cold compile cache
 * made generation 0 of four PPO kernels, 96 candidates, one 11 s compile that took the whole
 * budget); on a device in one unit. When a unit fails, per job. */
static void compile_jobs(sctx *c, job *jobs, size_t nj, int per_job) {
  char *pre = lm_render_prelude(c->dialect);
  if (!pre) return;
  double t0 = now_(c);
  size_t built = 0;
  for (size_t j = 0; j < nj; j++)
    for (size_t n = 0; n < jobs[j].nc; n++) built += jobs[j].c[n].status == SK_CS_UNTESTED && !jobs[j].c[n].fn;
  int parts = c->dev || per_job ? 1 : c->pool ? lm_pool_size(c->pool) : 1;
  if (parts > MAX_PARTS) parts = MAX_PARTS;
  if (parts < 1) parts = 1;
  size_t lo = 0;
  while (lo < nj) {
    size_t hi = per_job ? lo + 1 : nj;
    lm_sb tu[MAX_PARTS] = {{0}};
    int used[MAX_PARTS] = {0}, next = 0;
    for (int q = 0; q < parts; q++) lm_sb_puts(&tu[q], pre);
    char name[48];
    for (size_t j = lo; j < hi; j++)
      for (size_t n = 0; n < jobs[j].nc; n++) {
        cand *d = &jobs[j].c[n];
        if (d->status != SK_CS_UNTESTED || d->fn) continue;
        snprintf(name, sizeof name, "sj%zu_%zu", j, n);
        d->part = (uint8_t)next;
        if (add_source(c, &tu[next], &d->k, name) != LM_OK) d->status = SK_CS_NOBUILD;
        else used[next] = 1;
        next = (next + 1) % parts;
      }
    void *lib[MAX_PARTS] = {0};
    int failed = 0;
    if (parts == 1) {
      char *src = lm_sb_take(&tu[0]);
      lm_dump_source("search", c->dialect == LM_DIALECT_C ? "c" : "gpu", src, NULL); /* $LUMEN_DUMP */
      lib[0] = src ? build_tu(c, src) : NULL;
      failed = !lib[0];
      lm_free(src);
    } else {
      tu_build tb[MAX_PARTS] = {{0}};
      pthread_t th[MAX_PARTS];
      int started[MAX_PARTS] = {0};
      for (int q = 0; q < parts; q++) {
        tb[q].cc = c->cc;
        tb[q].src = lm_sb_take(&tu[q]);
        if (!used[q] || !tb[q].src) continue;
        lm_dump_source("search", "c", tb[q].src, NULL);
        started[q] = q > 0 && pthread_create(&th[q], NULL, tu_build_main, &tb[q]) == 0;
      }
      for (int q = 0; q < parts; q++) /* unit 0, and any whose thread did not start, here */
        if (used[q] && tb[q].src && !started[q]) tu_build_main(&tb[q]);
      for (int q = 0; q < parts; q++) {
        if (started[q]) pthread_join(th[q], NULL);
        if (!used[q]) {
          lm_free(tb[q].src);
          continue;
        }
        if (!tb[q].lib) {
          failed = 1;
          logf_(c, "  (a translation unit did not build: %.300s)\n", tb[q].src ? tb[q].why : "out of memory");
        } else if (!LM_GROW(c->libs, c->libcap, c->nlibs + 1)) {
          lm_cc_lib_close(tb[q].lib);
          failed = 1;
        } else c->libs[c->nlibs++] = lib[q] = tb[q].lib;
        lm_free(tb[q].src);
      }
    }
    if (failed && !per_job && nj > 1) {
      lm_free(pre);
      compile_jobs(c, jobs, nj, 1);
      return;
    }
    for (size_t j = lo; j < hi; j++)
      for (size_t n = 0; n < jobs[j].nc; n++) {
        cand *d = &jobs[j].c[n];
        if (d->status != SK_CS_UNTESTED || d->fn) continue;
        snprintf(name, sizeof name, "sj%zu_%zu", j, n);
        void *l = lib[d->part < parts ? d->part : 0];
        if (!l || !(d->fn = sym_fn(c, l, name, &d->k))) d->status = SK_CS_NOBUILD;
      }
    lo = hi;
  }
  lm_free(pre);
  c->cc_s += now_(c) - t0;
  c->cc_n += (double)built;
  if (built) logf_(c, "  (compiled %zu candidates in %.2f s)\n", built, now_(c) - t0);
}

/* ---------------------------------------------------------------- the default schedule */

/* The default schedule's rewrite of a lowered kernel (compiler/schedule.c), in place. */
/* plan with kernel k alone, for a plan-wide pass to rewrite k in place */
static lm_plan one_kernel(const lm_plan *plan, lm_kernel *k) {
  lm_plan tmp = *plan;
  tmp.kernels = k;
  tmp.nkernels = tmp.kernelcap = 1;
  return tmp;
}

static int interchange_one(lm_plan *plan, lm_kernel *k) {
  if (getenv("LUMEN_NO_INTERCHANGE")) return 0;
  lm_plan tmp = one_kernel(plan, k);
  return lm_schedule_interchange(&tmp, 1); /* the cpu's default */
}

/* The GPU work-group schedules (compiler/gpu.c) of one kernel, in place; 1 when they apply. */
static int gpu_one(const lm_plan *plan, lm_kernel *k, const lm_gpu_options *go) {
  lm_plan tmp = one_kernel(plan, k);
  tmp.copies = NULL, tmp.ncopies = 0; /* liveness over this kernel alone must not touch the plan */
  lm_pbuf *bufs = lm_malloc((plan->nbufs + 1) * sizeof *bufs);
  if (!bufs) return 0;
  memcpy(bufs, plan->bufs, plan->nbufs * sizeof *bufs);
  tmp.bufs = bufs;
  int r = lm_schedule_gpu(&tmp, go) > 0;
  lm_free(bufs);
  return r;
}

/* The kernel's unroll and jam (compiler/jam.c), in place, as the cpu's pipeline gives every
 * kernel after the interchange; 1 when it applies. */
static int jam_one(lm_plan *plan, lm_kernel *k) {
  if (getenv("LUMEN_NO_JAM")) return 0;
  lm_plan tmp = one_kernel(plan, k);
  return lm_schedule_jam(&tmp, 0) > 0;
}

/* The default schedule's rewrite of a lowered kernel: the cpu's interchange, or on a device the
 * work-group schedules the backend applies after lowering. (The form the vector variant of the
 * default starts from, and that static estimates compare with the candidates.) */
static int default_rewrite(sctx *c, lm_kernel *k) {
  if (!c->dev) return interchange_one(c->plan, k);
  return c->dev->gpu && lm_gpu_schedules_enabled() ? gpu_one(c->plan, k, c->dev->gpu) : 0;
}

/* The kernel as the backend runs it without a search, the baseline a candidate must beat: on the
 * cpu the unroll and jam follows the interchange, and a graph that allows contraction gets FMAs
 * (candidates run as timed: lm_compile_ex leaves their contraction). A baseline without the jam
 * (1.2-3.5x on the default's matmuls) and the FMAs let candidates win that ran slower than the
 * kernels they replaced: MinAtar Breakout's training with searched kernels 3x slower. */
static void as_run(sctx *c, lm_kernel *k) {
  if (c->dev) return;
  jam_one(c->plan, k);
  if (c->plan->g->contract) k->contract = 1; /* as lm_compile_ex gives the default's kernels */
}

/* ---------------------------------------------------------------- candidates of one kernel */

static void cand_free(cand *d) {
  lm_kernel_free(&d->k);
  lm_free(d->term);
  lm_free(d->genome);
  memset(d, 0, sizeof *d);
}

/* The e-graph kept for the genetic search, dropped once the job's winner is known. */
static void job_drop_egraph(job *j) {
  if (j->sk) sk_free(j->sk);
  lm_free(j->sk);
  lm_free(j->best);
  j->sk = NULL;
  j->best = NULL;
}

static void job_free(job *j) {
  for (size_t i = 0; i < j->nc; i++) cand_free(&j->c[i]);
  lm_free(j->c);
  job_drop_egraph(j);
  memset(j, 0, sizeof *j);
}

static int cmp_est(const void *a, const void *b) {
  const cand *x = a, *y = b;
  return x->est < y->est ? -1 : x->est > y->est;
}

static uint64_t source_hash(sctx *c, const lm_kernel *k) {
  lm_kernel tmp = *k;
  snprintf(tmp.name, sizeof tmp.name, "cand");
  char *src = lm_render_kernel(c->plan, &tmp, c->dialect);
  if (!src) return 0;
  uint64_t h = lm_hash_bytes(src, strlen(src), 3);
  lm_free(src);
  return h ? h : 1;
}

/* Adds the term's kernel unless an equal source is there already: the new candidate's index,
 * else -1 (its source is there: a genome is kept for a candidate that had none, so the default
 * schedule's twin among the extractions can be a parent) or -2 (not schedulable as chosen). */
static int add_kernel(sctx *c, lm_sk *s, job *j, const sk_term *t, const uint32_t *genome, int gen, const char *op,
                      lm_kernel *k, int variant);

/* On a device with work-group schedules, the term's kernel is tried both as emitted (one thread
 * per point of its parallel loops) and under the schedules of compiler/gpu.c where they apply:
 * thread mapping, shared-memory tiles and staging, tree reductions. */
static int add_term(sctx *c, lm_sk *s, job *j, const sk_term *t, const uint32_t *genome, int gen, const char *op) {
  lm_kernel k;
  if (sk_emit_kernel(s, t, t->root, &c->plan->kernels[j->ki], &k) != LM_OK) {
    j->unemitted++;
    return -2;
  }
  lm_kernel g;
  lm_gpu_options go;
  int gpu = c->dev && c->dev->gpu && lm_gpu_schedules_enabled() && sk_kernel_copy(&k, &g) == LM_OK;
  if (gpu) {
    go = *c->dev->gpu;
    if (!c->o->allow_rounding) go.tree_reductions = 0; /* trees sum in another order */
    if (!gpu_one(c->plan, &g, &go)) lm_kernel_free(&g), gpu = 0;
  }
  lm_kernel pk; /* on the cpu, read-only operands packed too where that applies */
  int pack = !c->dev && sk_kernel_copy(&k, &pk) == LM_OK;
  if (pack && sk_pack_kernel(c->plan, &pk) <= 0) lm_kernel_free(&pk), pack = 0;
  lm_kernel vk[2]; /* and in vector form with FMAs (a rounding change), plain and packed */
  int vec[2] = {0, 0};
  for (int i = 0; i < 2 && !c->dev && c->o->allow_rounding; i++)
    if ((i == 0 || pack) && sk_kernel_copy(i ? &pk : &k, &vk[i]) == LM_OK && !(vec[i] = sk_vec_kernel(c->plan, &vk[i]) > 0))
      lm_kernel_free(&vk[i]);
  static const char *const suffix[] = {"", "+gpu", "+pack", "+vec", "+pack+vec"};
  lm_kernel *ks[] = {&k, gpu ? &g : NULL, pack ? &pk : NULL, vec[0] ? &vk[0] : NULL, vec[1] ? &vk[1] : NULL};
  int r = -2;
  for (int v = 0; v < (int)LM_COUNTOF(ks); v++)
    if (ks[v]) {
      char op2[48];
      snprintf(op2, sizeof op2, "%.38s%s", op, suffix[v]);
      int r2 = add_kernel(c, s, j, t, genome, gen, op2, ks[v], v);
      if (r < 0) r = r2;
    }
  return r;
}

static int add_kernel(sctx *c, lm_sk *s, job *j, const sk_term *t, const uint32_t *genome, int gen, const char *op,
                      lm_kernel *k, int variant) {
  size_t ncl = s->eg->nclasses;
  cand d;
  memset(&d, 0, sizeof d);
  d.k = *k; /* owned from here */
  memset(k, 0, sizeof *k);
  d.gpu = variant == 1;
  d.variant = variant;
  d.rounding = (variant == 1 && c->dev->gpu->tree_reductions && c->o->allow_rounding) || variant >= 3; /* FMAs */
  d.hash = source_hash(c, &d.k);
  if (!d.hash) {
    logf_(c, "  (an emitted kernel did not render: %s)\n", lm_last_error());
    lm_kernel_free(&d.k);
    return -2;
  }
  for (size_t i = 0; i < j->nc; i++)
    if (j->c[i].hash == d.hash) {
      lm_kernel_free(&d.k);
      if (genome && !j->c[i].genome && (j->c[i].genome = lm_malloc((ncl + 1) * sizeof *genome)))
        memcpy(j->c[i].genome, genome, ncl * sizeof *genome);
      return -1;
    }
  char *term = sk_term_print(s, t);
  if (term && variant) { /* the cache keeps the variant before the term: "gpu ", "pack ", "vec ", "pack vec " */
    static const char *const pres[] = {"", "gpu ", "pack ", "vec ", "pack vec "};
    const char *pre = pres[variant];
    size_t n = strlen(term), np = strlen(pre);
    char *g2 = lm_malloc(n + np + 1);
    if (g2) memcpy(g2, pre, np), memcpy(g2 + np, term, n + 1);
    lm_free(term);
    term = g2;
  }
  d.term = term;
  int rounding = 0;
  d.rules = sk_term_rules(s, t, &rounding);
  d.rounding |= rounding;
  d.est = sk_estimate(c->plan, &d.k, c->syms);
  d.gen = gen;
  snprintf(d.op, sizeof d.op, "%s", op);
  if (genome && (d.genome = lm_malloc((ncl + 1) * sizeof *genome))) memcpy(d.genome, genome, ncl * sizeof *genome);
  if (!d.term || (genome && !d.genome) || !LM_GROW(j->c, j->cap, j->nc + 1)) {
    cand_free(&d);
    return -2;
  }
  j->c[j->nc++] = d;
  return (int)j->nc - 1;
}

/* c[0]: the default schedule as the backend runs it (default_rewrite, then as_run); its static
 * estimate is of the form before as_run, which the candidates' estimates compare with (the jam's
 * copies read as several times the work: prune_slow then dropped every candidate of a 1024^3
 * matmul). */
static lm_status default_cand(sctx *c, job *j) {
  lm_plan *plan = c->plan;
  if (!LM_GROW(j->c, j->cap, 1)) return LM_ERR_NOMEM;
  memset(&j->c[0], 0, sizeof j->c[0]);
  lm_status st = sk_kernel_copy(&plan->kernels[j->ki], &j->c[0].k);
  if (st != LM_OK) return st;
  default_rewrite(c, &j->c[0].k);
  j->c[0].est = sk_estimate(plan, &j->c[0].k, c->syms);
  as_run(c, &j->c[0].k);
  j->nc = 1;
  snprintf(j->c[0].op, sizeof j->c[0].op, "default");
  j->c[0].hash = source_hash(c, &j->c[0].k);
  return LM_OK;
}

/* The default schedule in vector form with FMAs (compiler/search/vec.c), kept with the tile seeds
 * past the cut: the lowered kernel is often the best loop order already (a 1x64 row of a layer),
 * and the random terms rarely come back to it. Its cache text is "vec default". */
static void default_vec(sctx *c, job *j) {
  if (c->dev || !c->o->allow_rounding || !LM_GROW(j->c, j->cap, j->nc + 1)) return;
  cand d;
  memset(&d, 0, sizeof d);
  if (sk_kernel_copy(&c->plan->kernels[j->ki], &d.k) != LM_OK) return;
  default_rewrite(c, &d.k);
  int fresh = sk_vec_kernel(c->plan, &d.k) > 0 && (d.hash = source_hash(c, &d.k)) != 0;
  for (size_t i = 0; fresh && i < j->nc; i++) fresh = j->c[i].hash != d.hash; /* a term's vector variant */
  if (fresh && (d.term = lm_strdup("vec default"))) {
    d.rounding = 1;
    d.seed = 2; /* kept past the cut */
    d.est = j->c[0].est;
    snprintf(d.op, sizeof d.op, "default+vec");
    j->c[j->nc++] = d;
  } else cand_free(&d);
}

/* A kernel whose default schedule takes milliseconds cannot afford the random tail: a candidate
 * estimated at several times its cost has run 10-200x slower (a 1024^3 matmul's took seconds a
 * run), so those beyond 3x the default's estimate are dropped from [from, nc) before compiling.
 * Below that the estimate is too rough to judge by (winners have had 2-5x the default's). */
enum { SLOW_KERNEL_US = 2000 };
static void prune_slow(sctx *c, job *j, size_t from) {
  if (!j->nc || !(j->c[0].time >= SLOW_KERNEL_US * 1e-6) || !(j->c[0].est > 0)) return;
  size_t w = from, dropped = 0;
  for (size_t n = from; n < j->nc; n++) {
    if (j->c[n].est > 3 * j->c[0].est && !j->c[n].fn) {
      cand_free(&j->c[n]);
      dropped++;
      continue;
    }
    if (w != n) j->c[w] = j->c[n], memset(&j->c[n], 0, sizeof j->c[n]);
    w++;
  }
  j->nc = w;
  if (dropped) logf_(c, "  %zu candidates estimated at over 3x the default's cost dropped (a slow kernel)\n", dropped);
}

/* Generation 0 of a kernel: the greedy term, then every term when the space is small, else
 * random genomes; emitted, deduplicated by source, ranked by the static estimate and cut to
 * max_candidates (the best two thirds and a random third). A large space keeps its e-graph and
 * the genomes for the genetic search (evolve). */
static lm_status gen_candidates(sctx *c, job *j, double egraph_s) {
  const lm_search_options *o = c->o;
  lm_plan *plan = c->plan;
  lm_sk *s = lm_calloc(1, sizeof *s);
  if (!s) return LM_ERR_NOMEM;
  lm_status st = sk_init(s, plan);
  if (st != LM_OK) {
    lm_free(s);
    return st;
  }
  s->stage = SK_STAGE_KERNEL;
  s->rounding = o->allow_rounding;
  s->gpu = c->dialect != LM_DIALECT_C; /* work-group mapping */
  uint32_t root = sk_add_kernel(s, j->ki, 0);
  if (root == LM_EG_NONE) {
    logf_(c, "  not searched: %s\n", s->why);
    sk_free(s);
    lm_free(s);
    return LM_ERR_UNSUPPORTED;
  }
  int nr;
  const lm_rule *rules = sk_rules(&nr);
  lm_run_limits lim = {.iterations = 8, .nodes = 40000, .seconds = egraph_s, .match_limit = 1000, .ban_length = 2,
                       .enabled = c->enabled_k, .clock = c->o->clock, .clock_ctx = c->o->clock_ctx};
  lm_run_report rr = {0};
  lm_eg_run(s->eg, rules, nr, s, &lim, &rr);
  j->enode = rr.nodes;
  j->eclass = rr.classes;
  j->iters = rr.iterations;
  j->stop = rr.stop;
  j->egraph_s = rr.seconds;
  size_t ncl = s->eg->nclasses;
  double *cost = lm_malloc((ncl + 1) * sizeof *cost);
  uint32_t *best = lm_malloc((ncl + 1) * sizeof *best), *force = lm_malloc((ncl + 1) * sizeof *force);
  uint32_t *classes = lm_malloc((ncl + 1) * sizeof *classes), *genome = NULL;
  int genetic = 0;
  if (!cost || !best || !force || !classes) st = LM_ERR_NOMEM;
  if (st == LM_OK) {
    size_t nreach = 0;
    j->space = sk_space(s, root, classes, &nreach);
    genetic = j->space > 64 && c->ga_generations > 0;
    if (genetic && !(genome = lm_malloc((ncl + 1) * sizeof *genome))) genetic = 0;
    sk_greedy(s, cost, best);
    sk_term t;
    if (sk_extract(s, root, best, NULL, NULL, 0, genome, &t) == LM_OK) {
      add_term(c, s, j, &t, genome, 0, "greedy");
      sk_term_free(&t);
      j->samples++;
    }
    default_vec(c, j);
    if (j->space <= 64) { /* exhaustive: every combination of choices */
      for (size_t i = 0; i < ncl; i++) force[i] = LM_EG_NONE;
      for (uint64_t idx = 0; idx < (uint64_t)j->space; idx++) {
        uint64_t rem = idx;
        for (size_t q = 0; q < nreach; q++) {
          const lm_eg_vec *v = &s->eg->cnodes[classes[q]];
          force[classes[q]] = v->v[rem % v->n];
          rem /= v->n;
        }
        if (sk_extract(s, root, best, force, NULL, 0, NULL, &t) == LM_OK) {
          add_term(c, s, j, &t, NULL, 0, "exhaustive");
          sk_term_free(&t);
        }
        j->samples++;
      }
    } else {
      /* register tiles assembled on purpose, the rest of the term greedy and then random */
      uint32_t *took_g = genome ? genome : lm_malloc((ncl + 1) * sizeof *took_g);
      for (int w = 0; took_g && w < SK_TILE_SEEDS && time_left(c) && sk_tile_seed(s, w, force); w++)
        for (int r = 0; r < 2; r++) {
          if (sk_extract(s, root, best, force, r ? &c->rng : NULL, 1.0, took_g, &t) == LM_OK) {
            /* a seed only where the term took the tile (its loops may sit under a class the
             * extraction did not reach): else it is one more random sample */
            int took = 1, reached = 0;
            for (size_t q = 0; q < ncl; q++)
              if (force[q] != LM_EG_NONE && took_g[q] != LM_EG_NONE) reached = 1, took &= took_g[q] == force[q];
            size_t at = j->nc; /* the term's kernel and its variants (packed) */
            add_term(c, s, j, &t, genome, 0, !(took && reached) ? "random" : r ? "tile-seed+random" : "tile-seed");
            for (; at < j->nc; at++) { /* past the cut: packed vector forms first, then vector, packed, plain */
              static const int rank[] = {3, 3, 2, 1, 0}; /* by variant */
              j->c[at].seed = took && reached;
              j->c[at].seed_order = rank[j->c[at].variant] * 2 * SK_TILE_SEEDS + 2 * w + r;
            }
            sk_term_free(&t);
          }
          j->samples++;
        }
      if (took_g != genome) lm_free(took_g);
      for (int n = 0; n < o->samples && time_left(c); n++) {
        if (sk_extract(s, root, best, NULL, &c->rng, 0, genome, &t) == LM_OK) {
          add_term(c, s, j, &t, genome, 0, "random");
          sk_term_free(&t);
        }
        j->samples++;
      }
      for (int n = 0; s->gpu && n < o->samples / 4 && time_left(c); n++) { /* work-group mappings */
        if (sk_extract_preferring(s, root, best, &c->rng, SK_GROUP, genome, &t) == LM_OK) {
          add_term(c, s, j, &t, genome, 0, "random-group");
          sk_term_free(&t);
        }
        j->samples++;
      }
    }
  }
  lm_free(cost);
  lm_free(force);
  lm_free(classes);
  lm_free(genome);
  if (st == LM_OK && genetic) {
    j->sk = s;
    j->root = root;
    j->best = best;
  } else {
    lm_free(best);
    sk_free(s);
    lm_free(s);
  }
  if (st != LM_OK) return st;
  j->distinct = (int)j->nc - 1;
  j->generations = 1;
  prune_slow(c, j, 1);
  /* keep the best by estimate and a few random others */
  if (j->nc > 1) qsort(j->c + 1, j->nc - 1, sizeof *j->c, cmp_est);
  size_t keep = (size_t)(o->max_candidates > 0 ? o->max_candidates : 24);
  if (c->keep_cap && keep > c->keep_cap) keep = c->keep_cap;
  size_t top = keep - keep / 3;
  if (j->nc - 1 > keep) {
    /* on a device, the best few work-group mappings by estimate next (up to a sixth) */
    size_t at = 1 + top;
    for (size_t i = at; i < j->nc && at < 1 + top + keep / 6; i++)
      if (j->c[i].k.group && !j->c[i].gpu) {
        cand tmp = j->c[at];
        j->c[at] = j->c[i];
        j->c[i] = tmp;
        at++;
      }
    top = at - 1;
    /* then the default's vector form and the tile seeds the estimate ranked below the cut (up
     * to a third) */
    for (size_t i = at; i < j->nc && at < 1 + keep; i++)
      if (j->c[i].seed == 2) {
        cand tmp = j->c[at];
        j->c[at] = j->c[i];
        j->c[i] = tmp;
        at++;
      }
    for (size_t cut = at + keep / 3; at < cut && at < 1 + keep;) { /* in seed order */
      size_t b = j->nc;
      for (size_t i = at; i < j->nc; i++)
        if (j->c[i].seed == 1 && (b == j->nc || j->c[i].seed_order < j->c[b].seed_order)) b = i;
      if (b == j->nc) break;
      cand tmp = j->c[at];
      j->c[at] = j->c[b];
      j->c[b] = tmp;
      at++;
    }
    top = at - 1;
    for (size_t i = 1 + top; i < 1 + keep; i++) { /* random picks from the rest */
      size_t r = i + (size_t)(sk_rand(&c->rng) % (uint64_t)(j->nc - i));
      cand t = j->c[i];
      j->c[i] = j->c[r];
      j->c[r] = t;
    }
    for (size_t i = 1 + keep; i < j->nc; i++) cand_free(&j->c[i]);
    j->nc = 1 + keep;
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- measuring one kernel */

static lm_status ensure_bench(sctx *c) {
  if (c->have_bench) return LM_OK;
  lm_status st = skb_open(&c->bench, c->plan, c->syms, c->pool, c->dev, c->o->seed);
  if (st == LM_OK) c->have_bench = 1;
  return st;
}

static void poison(sctx *c, const uint8_t *w) {
  for (size_t b = 0; b < c->plan->nbufs; b++)
    if (w[b])
      for (size_t i = 0; i < c->bench.count[b]; i++) c->bench.bufs[b][i] = NAN;
  skb_touch(&c->bench, w);
}

/* Worst normalised error of the written buffers against ref (> 1 fails). */
static double check(sctx *c, const uint8_t *w, float *const *ref, double rtol, double atol) {
  double worst = 0;
  skb_pull(&c->bench, w);
  for (size_t b = 0; b < c->plan->nbufs; b++)
    if (w[b]) {
      double e = skb_compare(c->bench.bufs[b], ref[b], c->bench.count[b], rtol, atol);
      if (e > worst) worst = e;
    }
  return worst;
}

#define RTOL_EXACT 2e-5
#define ATOL_EXACT 2e-6
#define RTOL_ROUND 1e-3
#define ATOL_ROUND 1e-4

/* Checks candidates [from, nc) against the reference and times them; *best (the fastest so far)
 * sets the cut-off: a candidate stops once it is 3x slower. Past the deadline only min_n more. */
static void time_range(sctx *c, job *j, size_t from, const uint8_t *w, float *const *ref, double max_s, double *best,
                       size_t min_n) {
  for (size_t n = from; n < j->nc; n++) {
    cand *d = &j->c[n];
    char names[160];
    rule_names(d->rules, names, sizeof names);
    if (d->status != SK_CS_UNTESTED || !d->fn) {
      logf_(c, "  cand %zu %s rules=%s\n", n, cs_names[d->status], names);
      continue;
    }
    /* compiled already: the best few are still worth timing, within a tenth of the budget (at
     * least half a second) past the deadline; a device's launches can take a tenth of a second */
    if (!time_left(c) && (n - from >= min_n || now_(c) > c->deadline + overrun(c))) break;
    if (c->dev) { /* an OpenCL driver may compile a kernel at its first launch (PoCL does) */
      skb_launch(&c->bench, &d->k, d->fn);
      skb_sync(&c->bench);
    }
    poison(c, w);
    double t_check = lm_search_now();
    skb_launch(&c->bench, &d->k, d->fn);
    skb_sync(&c->bench);
    t_check = lm_search_now() - t_check;
    double e = check(c, w, ref, d->rounding ? RTOL_ROUND : RTOL_EXACT, d->rounding ? ATOL_ROUND : ATOL_EXACT);
    if (c->bench.dev_status != LM_OK) { /* the device refused this one (its launch shape, ...) */
      d->status = SK_CS_NOBUILD;
      c->bench.dev_status = LM_OK;
      logf_(c, "  cand %zu no-build on the device: %.300s\n", n, lm_last_error());
      continue;
    }
    if (e > 1) {
      d->status = SK_CS_WRONG;
      c->rep->wrong++;
      logf_(c, "  cand %zu WRONG (error %.3g x tolerance) %s rules=%s term=%s\n", n, e, d->op, names, d->term);
      continue;
    }
    /* a first run 20x slower than the best (and over 10 ms) is not run again: one such launch
     * can take seconds (on PoCL, a work-group of threads run one after another) */
    if (t_check > 20 * *best && t_check > 0.01) d->time = t_check;
    else d->time = skb_time(&c->bench, &d->k, d->fn, 3 * *best, max_s);
    d->status = d->time > 3 * *best ? SK_CS_SLOW : SK_CS_OK;
    c->rep->candidates++;
    logf_(c, "  cand %zu %-4s %10.2f us  est %.3g%s %s rules=%s\n", n, cs_names[d->status], 1e6 * d->time, d->est,
          d->rounding ? " (rounding)" : "", d->op, names);
    if (d->status == SK_CS_OK && d->time < *best) *best = d->time;
  }
}

/* The fastest candidate timed ok in [from, nc), or 0 when there is none. */
static size_t fastest(const job *j, size_t from) {
  size_t f = SIZE_MAX;
  for (size_t n = from; n < j->nc; n++)
    if (j->c[n].status == SK_CS_OK && (f == SIZE_MAX || j->c[n].time < j->c[f].time)) f = n;
  return f == SIZE_MAX ? 0 : f;
}

/* ---------------------------------------------------------------- the genetic search */

static double uni01(uint64_t *rng) { return (double)(sk_rand(rng) >> 11) * 0x1.0p-53; }

/* Tournament of three (with replacement) among the parents: the fastest. */
static size_t tournament(const job *j, const size_t *pool, size_t np, uint64_t *rng) {
  size_t b = pool[sk_rand(rng) % np];
  for (int i = 1; i < 3; i++) {
    size_t x = pool[sk_rand(rng) % np];
    if (j->c[x].time < j->c[b].time) b = x;
  }
  return b;
}

/* Generations after the first, for a kernel whose space is too large to enumerate. Parents: every
 * candidate timed ok so far (correct, not cut off at 3x the best) that has a genome, picked by
 * tournament on the measured time. Offspring: crossover (70%, half of them mutated once more) or
 * mutation (1-3 classes drawn again), deduplicated by source against every candidate of the job,
 * compiled, checked against the reference and timed like the first generation. Stops at the generation limit, when
 * the next generation (expected to take as long as the last, the first gen_est) would end after
 * `until` (the job's share of the budget), after SK_GA_STALL generations without a 1% gain, with
 * no parent, or when no new distinct candidate appears. */
static void evolve(sctx *c, job *j, const uint8_t *w, float *const *ref, double until, double gen_est, double *best) {
  lm_sk *s = j->sk;
  size_t ncl = s->eg->nclasses;
  size_t want = (size_t)(c->o->max_candidates > 0 ? c->o->max_candidates : 24) / 2;
  if (want < 4) want = 4;
  uint64_t rng = (c->o->seed ? c->o->seed : 1) ^ (j->key * 0x9E3779B97F4A7C15ull);
  uint32_t *genome = lm_malloc((ncl + 1) * sizeof *genome), *mid = lm_malloc((ncl + 1) * sizeof *mid);
  size_t *pool = NULL, poolcap = 0;
  int stall = 0;
  const char *why = "out of memory";
  size_t f0 = fastest(j, 0);
  logf_(c,
        "  generation 0: %zu candidates, best %.2f us (cand %zu, %s); space %.3g terms: genetic search until %.2f s\n",
        j->nc - 1, 1e6 * j->c[f0].time, f0, j->c[f0].op, j->space, until - c->t0);
  while (genome && mid) {
    if (j->generations > c->ga_generations) {
      why = "generation limit";
      break;
    }
    double g_start = now_(c);
    if (g_start + gen_est >= until || !time_left(c)) { /* a generation must fit in what is left */
      why = "time";
      break;
    }
    size_t np = 0;
    if (!LM_GROW(pool, poolcap, j->nc + 1)) break;
    for (size_t n = 0; n < j->nc; n++)
      if (j->c[n].status == SK_CS_OK && j->c[n].genome) pool[np++] = n;
    if (!np) {
      why = "no parent (no candidate with a genome within 3x of the best)";
      break;
    }
    size_t from = j->nc;
    int offspring = 0, dup = 0, unsched = 0;
    for (size_t tries = 0; j->nc - from < want && tries < 10 * want; tries++) {
      size_t pa = tournament(j, pool, np, &rng), pb = pa;
      char op[48];
      sk_term t;
      lm_status st;
      if (np >= 2 && uni01(&rng) < 0.7)
        for (int k = 0; k < 4 && pb == pa; k++) pb = tournament(j, pool, np, &rng);
      if (pb != pa) {
        snprintf(op, sizeof op, "crossover(c%zu,c%zu)", pa, pb);
        st = sk_crossover(s, j->root, j->best, j->c[pa].genome, j->c[pb].genome, &rng, genome, &t);
        if (st == LM_OK && uni01(&rng) < 0.5) {
          memcpy(mid, genome, ncl * sizeof *mid);
          sk_term_free(&t);
          st = sk_mutate(s, j->root, j->best, mid, 1, &rng, genome, &t);
          snprintf(op, sizeof op, "crossover(c%zu,c%zu)+mutation", pa, pb);
        }
      } else {
        snprintf(op, sizeof op, "mutation(c%zu)", pa);
        st = sk_mutate(s, j->root, j->best, j->c[pa].genome, 1 + (int)(sk_rand(&rng) % 3), &rng, genome, &t);
      }
      offspring++;
      if (st != LM_OK) {
        unsched++;
        continue;
      }
      int r = add_term(c, s, j, &t, genome, j->generations, op);
      sk_term_free(&t);
      if (r == -1) dup++;
      else if (r < 0) unsched++;
    }
    prune_slow(c, j, from);
    size_t made = j->nc - from;
    if (!made) {
      why = "no new distinct candidate";
      break;
    }
    qsort(j->c + from, made, sizeof *j->c, cmp_est);
    compile_jobs(c, j, 1, 1);
    double prev = *best, left = until - now_(c);
    double max_s = left / (double)(made + 1);
    max_s = max_s > 0.3 ? 0.3 : max_s < 0.01 ? 0.01 : max_s;
    time_range(c, j, from, w, ref, max_s, best, 2);
    size_t g = fastest(j, from), all = fastest(j, 0);
    if (g)
      logf_(c, "  generation %d: %zu candidates (%d offspring: %d duplicates, %d not schedulable), best %.2f us "
               "(cand %zu, %s); best so far %.2f us (cand %zu, generation %d, %s); %.2f s\n",
            j->generations, made, offspring, dup, unsched, 1e6 * j->c[g].time, g, j->c[g].op, 1e6 * j->c[all].time,
            all, j->c[all].gen, j->c[all].op, now_(c) - g_start);
    else
      logf_(c, "  generation %d: %zu candidates (%d offspring: %d duplicates, %d not schedulable), none correct and "
               "within 3x of the best; best so far %.2f us (cand %zu, generation %d, %s); %.2f s\n",
            j->generations, made, offspring, dup, unsched, 1e6 * j->c[all].time, all, j->c[all].gen, j->c[all].op,
            now_(c) - g_start);
    j->generations++;
    gen_est = now_(c) - g_start;
    stall = *best < 0.99 * prev ? 0 : stall + 1;
    if (stall >= SK_GA_STALL) {
      why = "no gain in the last generations";
      break;
    }
  }
  snprintf(j->stop_why, sizeof j->stop_why, "%s", why);
  logf_(c, "  genetic search: %d generations, stopped: %s (at %.2f s of the search)\n", j->generations, why,
        now_(c) - c->t0);
  lm_free(genome);
  lm_free(mid);
  lm_free(pool);
}

/* The reference for job j's kernel (c[0]: its default schedule, compiled) on random inputs: the
 * written buffers flagged in w, their results in ref (allocated here; the caller frees them), the
 * bench left holding those inputs. The interpreter where it is quick, else, or where the default's
 * code disagrees with it, the default schedule's code. */
static lm_status reference(sctx *c, job *j, uint8_t *w, float **ref) {
  lm_plan *plan = c->plan;
  const lm_kernel *orig = &plan->kernels[j->ki];
  cand *d0 = &j->c[0];
  lm_status st = ensure_bench(c);
  if (st != LM_OK) return st;
  written(plan, orig, w);
  for (size_t b = 0; b < plan->nbufs; b++)
    if (w[b] && !(ref[b] = lm_malloc((c->bench.count[b] + 1) * sizeof(float)))) return LM_ERR_NOMEM;
  skb_fill(&c->bench, c->o->seed + 1000003ull * j->ki);
  int interp = kernel_work(c, orig) * (int64_t)(orig->nstmts + 1) <= 4000000;
  poison(c, w);
  if (interp && sk_interpret(plan, orig, c->bench.bufs, c->bench.count, c->syms, c->bench.seed, 7) != LM_OK) interp = 0;
  if (!interp && !d0->fn) return lm_fail(LM_ERR_INVALID, "search: no reference for kernel %s", orig->name);
  if (!interp) skb_launch(&c->bench, &d0->k, d0->fn);
  skb_pull(&c->bench, w);
  for (size_t b = 0; b < plan->nbufs; b++)
    if (w[b]) memcpy(ref[b], c->bench.bufs[b], c->bench.count[b] * sizeof(float));
  if (interp && d0->fn) { /* the default's code agrees with the interpreter */
    poison(c, w);
    skb_launch(&c->bench, &d0->k, d0->fn);
    double e = check(c, w, ref, RTOL_EXACT, ATOL_EXACT);
    if (e > 1) {
      logf_(c, "  default schedule vs interpreter: error %.3g x tolerance; checking against the default's code\n", e);
      for (size_t b = 0; b < plan->nbufs; b++)
        if (w[b]) memcpy(ref[b], c->bench.bufs[b], c->bench.count[b] * sizeof(float));
    }
  }
  return LM_OK;
}

/* Measures a job's candidates: the reference on random inputs, then generation 0 (and, for a large
 * space, the genetic search until `until`); *winner: the candidate that replaces the kernel. */
static void measure_job(sctx *c, job *j, size_t slot, double until, double gen0_mean, int *winner, double *gen0_s) {
  double t0 = now_(c);
  lm_plan *plan = c->plan;
  *winner = 0;
  uint8_t *w = lm_calloc(plan->nbufs + 1, 1);
  float **ref = lm_calloc(plan->nbufs + 1, sizeof *ref);
  cand *d0 = &j->c[0];
  if (!w || !ref || !d0->fn || reference(c, j, w, ref) != LM_OK) goto done;
  double remaining = c->deadline - now_(c);
  double per = remaining > 0 ? remaining / (double)(slot + 1) : 0;
  double max_s = per / (double)(j->nc + 1);
  if (max_s > 0.3) max_s = 0.3;
  if (max_s < 0.01) max_s = 0.01;
  double best = d0->time;
  logf_(c, "  cand 0 default schedule %10.2f us  est %.3g\n", 1e6 * d0->time, d0->est);
  time_range(c, j, 1, w, ref, max_s, &best, 4);
  *gen0_s += now_(c) - t0;
  if (j->sk) /* a generation is about half a first one (half the candidates); then as the last one took */
    evolve(c, j, w, ref, until, 0.5 * (now_(c) - t0 + gen0_mean), &best); /* j->c may move */
  /* the winner: the fastest, an exact one when within 5% of a rounding one, and 2% better than the default */
  int win = 0;
  for (size_t n = 1; n < j->nc; n++) {
    const cand *d = &j->c[n];
    if (d->status != SK_CS_OK) continue;
    const cand *b = &j->c[win];
    int better = d->time < b->time;
    if (win && b->rounding && !d->rounding && d->time < 1.05 * b->time) better = 1;
    if (win && !b->rounding && d->rounding && d->time > 0.95 * b->time) better = 0;
    if (better) win = (int)n;
  }
  if (win && !(j->c[win].time < 0.98 * j->c[0].time)) win = 0;
  *winner = win;
done:
  for (size_t b = 0; ref && b < plan->nbufs; b++) lm_free(ref[b]);
  lm_free(ref);
  lm_free(w);
}

/* ---------------------------------------------------------------- applying decisions */

/* A cached decision is checked against the reference the first time this process applies it: a
 * cache line can be wrong (edited, or written by a build that emitted differently) and would then
 * break every row of the graph silently. The decisions checked, and those this process's own
 * searches made (each checked as a candidate), are remembered for the whole process: a set of
 * hashes of (cache key, value), open addressing, shared by every search. When it is full it stops
 * remembering, so a decision is checked again rather than applied unchecked. */
enum { CHECKED_CAP = 4096 };
_Static_assert((CHECKED_CAP & (CHECKED_CAP - 1)) == 0, "CHECKED_CAP is a power of two");
static uint64_t checked_ids[CHECKED_CAP]; /* 0: empty */
static size_t nchecked;
static pthread_mutex_t checked_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t decision_id(uint64_t key, const char *value) {
  uint64_t h = lm_hash_bytes(value, strlen(value), key ^ 0x434845434B4544ull);
  return h ? h : 1;
}

/* 1 when the decision was checked (or made) in this process; add: remember it. */
static int decision_checked(uint64_t id, int add) {
  pthread_mutex_lock(&checked_mu);
  size_t i = (size_t)(id * 0x9E3779B97F4A7C15ull >> 40) & (CHECKED_CAP - 1);
  while (checked_ids[i] && checked_ids[i] != id) i = (i + 1) & (CHECKED_CAP - 1);
  int found = checked_ids[i] == id;
  if (!found && add && nchecked < CHECKED_CAP / 4 * 3) {
    checked_ids[i] = id;
    nchecked++;
  }
  pthread_mutex_unlock(&checked_mu);
  return found;
}

static lm_status emit_from_text(sctx *c, uint32_t ki, const char *text, lm_kernel *out) {
  int gpu = !strncmp(text, "gpu ", 4), pack = !strncmp(text, "pack ", 5);
  if (gpu) text += 4;
  if (pack) text += 5;
  int vec = !strncmp(text, "vec ", 4);
  if (vec) text += 4;
  if ((pack || vec) && c->dev)
    return lm_fail(LM_ERR_INVALID, "search: a packed or vector cpu kernel in the cache of a device");
  if (gpu && !(c->dev && c->dev->gpu))
    return lm_fail(LM_ERR_INVALID, "search: a work-group schedule in the cache of a device without them");
  if (!strcmp(text, "default")) { /* the default schedule, in vector form (default_vec) */
    lm_status st = vec ? sk_kernel_copy(&c->plan->kernels[ki], out) : LM_ERR_INVALID;
    if (st != LM_OK) return st == LM_ERR_INVALID ? lm_fail(st, "search: a cached default schedule without a variant") : st;
    default_rewrite(c, out);
    if (sk_vec_kernel(c->plan, out) > 0) return LM_OK;
    lm_kernel_free(out);
    return lm_fail(LM_ERR_INVALID, "search: the cached vector form no longer applies");
  }
  lm_sk s;
  lm_status st = sk_init(&s, c->plan);
  if (st != LM_OK) return st;
  s.stage = SK_STAGE_KERNEL;
  if (sk_add_kernel(&s, ki, 0) == LM_EG_NONE) st = lm_fail(LM_ERR_INVALID, "search: %s", s.why);
  sk_term t = {0};
  if (st == LM_OK) st = sk_term_parse(&s, text, &t);
  if (st == LM_OK) st = sk_emit_kernel(&s, &t, t.root, &c->plan->kernels[ki], out);
  sk_term_free(&t);
  sk_free(&s);
  lm_gpu_options go;
  if (gpu) {
    go = *c->dev->gpu;
    if (!c->o->allow_rounding) go.tree_reductions = 0;
  }
  if (st == LM_OK && gpu && !gpu_one(c->plan, out, &go)) {
    lm_kernel_free(out);
    st = lm_fail(LM_ERR_INVALID, "search: the cached work-group schedule no longer applies");
  }
  if (st == LM_OK && pack && sk_pack_kernel(c->plan, out) <= 0) {
    lm_kernel_free(out);
    st = lm_fail(LM_ERR_INVALID, "search: the cached packing no longer applies");
  }
  if (st == LM_OK && vec && sk_vec_kernel(c->plan, out) <= 0) {
    lm_kernel_free(out);
    st = lm_fail(LM_ERR_INVALID, "search: the cached vector form no longer applies");
  }
  return st;
}

static void replace_kernel(sctx *c, uint32_t ki, lm_kernel *k) {
  lm_kernel *old = &c->plan->kernels[ki];
  memcpy(k->name, old->name, sizeof k->name);
  k->anchor = old->anchor;
  k->fixed = c->dev != NULL; /* as measured: a device backend's passes leave it */
  k->measured = 1;           /* and the cpu's jam */
  lm_kernel_free(old);
  *old = *k;
  memset(k, 0, sizeof *k);
}

/* Cache values: "W|default_s|best_s|candidates|rounding|rules|term" or "D|default_s|best_s|candidates|0|0|-". */
static int parse_value(const char *v, char *kind, double *def, double *best, int *ncand, int *rounding,
                       uint64_t *rules, const char **term) {
  char *end;
  if ((v[0] != 'W' && v[0] != 'D' && v[0] != 'P') || v[1] != '|') return 0;
  *kind = v[0];
  *def = strtod(v + 2, &end);
  if (*end != '|') return 0;
  *best = strtod(end + 1, &end);
  if (*end != '|') return 0;
  *ncand = (int)strtol(end + 1, &end, 10);
  if (*end != '|') return 0;
  *rounding = (int)strtol(end + 1, &end, 10);
  if (*end != '|') return 0;
  *rules = strtoull(end + 1, &end, 16);
  if (*end != '|') return 0;
  *term = end + 1;
  return 1;
}

static void put_decision(sctx *c, uint64_t key, char kind, double def, double best, int ncand, int rounding,
                         uint64_t rules, const char *term) {
  lm_sb sb = {0};
  lm_sb_printf(&sb, "%c|%.6g|%.6g|%d|%d|%llx|%s", kind, def, best, ncand, rounding, (unsigned long long)rules,
               term ? term : "-");
  char *v = lm_sb_take(&sb);
  if (v && skc_put(&c->cache, key, v) == LM_OK) decision_checked(decision_id(key, v), 1); /* checked as made */
  lm_free(v);
}

/* The winner's variant, from its cache text, for the report: " (packed)", " (vector+fma)"... */
static const char *variant_of(const char *term) {
  if (!term) return "";
  if (!strncmp(term, "pack vec ", 9)) return " (packed, vector+fma)";
  if (!strncmp(term, "pack ", 5)) return " (packed)";
  if (!strncmp(term, "vec default", 11)) return "default (vector+fma)";
  if (!strncmp(term, "vec ", 4)) return " (vector+fma)";
  if (!strncmp(term, "gpu ", 4)) return " (work-groups)";
  return "";
}

static void note_kernel(sctx *c, uint32_t ki, double def, double best, int ncand, int wrong, int cached,
                        int rounding, uint64_t rules, const char *term) {
  lm_search_kernel_report *r = &c->kr[ki];
  snprintf(r->name, sizeof r->name, "%s", c->plan->kernels[ki].name);
  r->default_s = def;
  r->best_s = best;
  r->candidates = ncand;
  r->wrong = wrong;
  r->from_cache = cached;
  r->rounding = rounding;
  rule_names(rules, r->rules, sizeof r->rules);
  size_t n = strlen(r->rules);
  snprintf(r->rules + n, sizeof r->rules - n, "%s", variant_of(term));
  if (def > 0) {
    c->rep->default_s += def;
    c->rep->best_s += best > 0 ? best : def;
  }
}

/* ---------------------------------------------------------------- stage 2: kernels */

static int cmp_base(const void *a, const void *b) {
  const job *x = a, *y = b;
  double tx = x->nc ? x->c[0].time : 0, ty = y->nc ? y->c[0].time : 0;
  return tx > ty ? -1 : tx < ty;
}

/* Applies a decision to every pending kernel with this key. */
static void decide(sctx *c, job *j, int win, uint64_t *keys, uint8_t *pending, uint8_t *won, int ncand, int nwrong) {
  lm_plan *plan = c->plan;
  cand *d0 = &j->c[0], *w = &j->c[win];
  put_decision(c, j->key, win ? 'W' : 'D', d0->time, w->time, ncand, w->rounding, win ? w->rules : 0,
               win ? w->term : NULL);
  for (uint32_t i = 0; i < plan->nkernels; i++) {
    if (!pending[i] || keys[i] != j->key) continue;
    pending[i] = 0;
    int first = i == j->ki;
    note_kernel(c, i, d0->time, w->time, first ? ncand : 0, first ? nwrong : 0, !first, w->rounding,
                win ? w->rules : 0, win ? w->term : NULL);
    if (!win) continue;
    lm_kernel out;
    if (first) {
      out = w->k;
      memset(&w->k, 0, sizeof w->k);
      replace_kernel(c, i, &out);
      won[i] = 1;
    } else if (emit_from_text(c, i, w->term, &out) == LM_OK) {
      replace_kernel(c, i, &out);
      won[i] = 1;
    }
  }
}

static void trace_job(sctx *c, const job *j, int win) {
  sk_trace *tr = c->trace;
  if (!tr || !LM_GROW(tr->k, tr->cap, tr->n + 1)) return;
  sk_trace_kernel *k = &tr->k[tr->n];
  memset(k, 0, sizeof *k);
  if (!(k->c = lm_calloc(j->nc + 1, sizeof *k->c))) return;
  tr->n++;
  snprintf(k->name, sizeof k->name, "%s", c->plan->kernels[j->ki].name);
  k->space = j->space;
  k->generations = j->generations;
  k->genetic = j->space > 64 && c->ga_generations > 0;
  snprintf(k->stop, sizeof k->stop, "%s", j->stop_why);
  k->winner = win;
  k->nc = j->nc;
  for (size_t n = 0; n < j->nc; n++) {
    const cand *d = &j->c[n];
    sk_trace_cand *t = &k->c[n];
    t->hash = d->hash;
    t->status = d->status;
    t->generation = d->gen;
    t->rounding = d->rounding;
    t->time = d->time;
    snprintf(t->op, sizeof t->op, "%s", d->op);
  }
}

void sk_trace_free(sk_trace *tr) {
  if (!tr) return;
  for (size_t i = 0; i < tr->n; i++) lm_free(tr->k[i].c);
  lm_free(tr->k);
  memset(tr, 0, sizeof *tr);
}

/* Checks the kernels that cached decisions give (chk[q].c[1]; c[0] the default schedule) against
 * the reference on random inputs as candidates are checked, timing nothing: compiled together in
 * one translation unit, the same source for the same decisions (a later process finds it in the
 * kernel object cache). err[q]: the worst error over its tolerance (> 1 fails; INFINITY when it
 * did not build or run). */
static void check_cached(sctx *c, job *chk, size_t n, double *err) {
  lm_plan *plan = c->plan;
  uint8_t *w = lm_calloc(plan->nbufs + 1, 1), *wk = lm_calloc(plan->nbufs + 1, 1);
  float **ref = lm_calloc(plan->nbufs + 1, sizeof *ref);
  for (size_t q = 0; q < n; q++) err[q] = INFINITY;
  if (!w || !wk || !ref) goto done;
  compile_jobs(c, chk, n, 0);
  for (size_t q = 0; q < n; q++) {
    cand *d = &chk[q].c[1];
    for (size_t b = 0; b < plan->nbufs; b++) lm_free(ref[b]), ref[b] = NULL;
    if (chk[q].nc < 2 || !d->fn || reference(c, &chk[q], w, ref) != LM_OK) continue;
    written(plan, &d->k, wk); /* it stores where the kernel stores, and (where the interpreter is quick)
                                 only inside its buffers: else its code is never run */
    if (memcmp(w, wk, plan->nbufs)) continue;
    if (kernel_work(c, &d->k) * (int64_t)(d->k.nstmts + 1) <= 4000000 &&
        sk_interpret(plan, &d->k, c->bench.bufs, c->bench.count, c->syms, c->bench.seed, 7) != LM_OK)
      continue;
    poison(c, w);
    skb_launch(&c->bench, &d->k, d->fn);
    skb_sync(&c->bench);
    double e = check(c, w, ref, d->rounding ? RTOL_ROUND : RTOL_EXACT, d->rounding ? ATOL_ROUND : ATOL_EXACT);
    if (c->bench.dev_status != LM_OK) { /* the device refused it */
      c->bench.dev_status = LM_OK;
      continue;
    }
    err[q] = e;
  }
done:
  for (size_t b = 0; ref && b < plan->nbufs; b++) lm_free(ref[b]);
  lm_free(ref);
  lm_free(w);
  lm_free(wk);
}

/* A cached winner not yet checked in this process: its kernel waits in chk[n] (c[0] the default
 * schedule, c[1] the kernel, its term the cache value) until the cached decisions are checked. */
static int defer_cached(sctx *c, job *chk, size_t n, uint32_t ki, uint64_t key, const char *value, int rounding,
                        lm_kernel *k) {
  job *j = &chk[n];
  memset(j, 0, sizeof *j);
  j->ki = ki;
  j->key = key;
  if (default_cand(c, j) != LM_OK || !LM_GROW(j->c, j->cap, 2)) {
    lm_kernel_free(k);
    job_free(j);
    return 0;
  }
  cand *d = &j->c[1];
  memset(d, 0, sizeof *d);
  d->k = *k;
  memset(k, 0, sizeof *k);
  d->rounding = rounding;
  snprintf(d->op, sizeof d->op, "cached");
  j->nc = 2;
  if (!(d->term = lm_strdup(value))) {
    job_free(j);
    return 0;
  }
  return 1;
}

static void kernel_stage(sctx *c, uint8_t *won) {
  lm_plan *plan = c->plan;
  size_t nk = plan->nkernels;
  job *jobs = lm_calloc(nk + 1, sizeof *jobs), *chk = lm_calloc(nk + 1, sizeof *chk);
  uint64_t *keys = lm_calloc(nk + 1, sizeof *keys);
  uint8_t *pending = lm_calloc(nk + 1, 1);
  double *err = lm_calloc(nk + 1, sizeof *err);
  size_t nj = 0, nchk = 0;
  if (!jobs || !chk || !keys || !pending || !err) goto done;
  for (uint32_t i = 0; i < nk; i++) {
    lm_kernel *k = &plan->kernels[i];
    snprintf(c->kr[i].name, sizeof c->kr[i].name, "%s", k->name);
    if (kernel_work(c, k) < c->o->min_work) continue;
    char *text = sk_kernel_text(plan, k);
    if (!text) continue;
    keys[i] = key_of(c, text, "kernel");
    lm_free(text);
    pending[i] = 1;
  }
  /* cached decisions apply now; twins are decided with their first */
  for (uint32_t i = 0; i < nk; i++) {
    if (!pending[i]) continue;
    const char *v = skc_get(&c->cache, keys[i]);
    int dup = 0;
    for (size_t q = 0; q < nj && !v; q++) dup |= jobs[q].key == keys[i];
    if (dup) continue;
    if (v) {
      pending[i] = 0;
      char kind;
      double def, best;
      int ncand, rounding;
      uint64_t rules;
      const char *term;
      if (!parse_value(v, &kind, &def, &best, &ncand, &rounding, &rules, &term)) continue;
      lm_kernel out;
      int emitted = kind == 'W' && emit_from_text(c, i, term, &out) == LM_OK, unchecked = 0;
      if (emitted && !decision_checked(decision_id(keys[i], v), 0)) { /* checked below: applied or discarded */
        if (defer_cached(c, chk, nchk, i, keys[i], v, rounding, &out)) {
          nchk++;
          continue;
        }
        unchecked = 1; /* out of memory: not applied unchecked */
      }
      if (emitted && !unchecked) {
        c->rep->from_cache++;
        replace_kernel(c, i, &out);
        won[i] = 1;
        note_kernel(c, i, def, best, 0, 0, 1, rounding, rules, term);
        logf_(c, "kernel %s: from the cache: %.2f us -> %.2f us\n", plan->kernels[i].name, 1e6 * def, 1e6 * best);
      } else {
        c->rep->from_cache++;
        note_kernel(c, i, def, def, 0, 0, 1, 0, 0, NULL);
        logf_(c, "kernel %s: from the cache: the default schedule\n", plan->kernels[i].name);
      }
      continue;
    }
    jobs[nj].ki = i;
    jobs[nj].key = keys[i];
    nj++;
  }
  /* cached winners first applied in this process: checked against the reference; one that fails
   * is discarded (a default decision over it) and the kernel searched as if it had no entry */
  if (nchk) check_cached(c, chk, nchk, err);
  for (size_t q = 0; q < nchk; q++) {
    job *j = &chk[q];
    uint32_t i = j->ki;
    const char *term = NULL;
    char kind = 0;
    double def = 0, best = 0;
    int ncand = 0, rounding = 0;
    uint64_t rules = 0;
    parse_value(j->c[1].term, &kind, &def, &best, &ncand, &rounding, &rules, &term);
    if (err[q] <= 1) {
      decision_checked(decision_id(j->key, j->c[1].term), 1);
      c->rep->from_cache++;
      replace_kernel(c, i, &j->c[1].k);
      won[i] = 1;
      note_kernel(c, i, def, best, 0, 0, 1, rounding, rules, term);
      logf_(c, "kernel %s: from the cache, checked against the reference (error %.3g x tolerance): %.2f us -> %.2f us\n",
            plan->kernels[i].name, err[q], 1e6 * def, 1e6 * best);
      continue;
    }
    c->rep->wrong++;
    logf_(c, "kernel %s: the cached decision fails its check against the reference (error %.3g x tolerance): "
             "discarded\n", plan->kernels[i].name, err[q]);
    put_decision(c, j->key, 'D', def, def, 0, 0, 0, NULL);
    pending[i] = 1;
    int dup = 0;
    for (size_t r = 0; r < nj; r++) dup |= jobs[r].key == j->key;
    if (!dup) {
      jobs[nj].ki = i;
      jobs[nj].key = j->key;
      nj++;
    }
  }
  if (!nj || !(c->o->budget_s > 0)) goto done; /* cache_only: what the cache does not hold keeps the default */
  /* the default schedules, compiled together and timed: the budget goes to the slow ones */
  for (size_t q = 0; q < nj; q++)
    if (default_cand(c, &jobs[q]) != LM_OK) job_free(&jobs[q]);
  compile_jobs(c, jobs, nj, 0);
  if (ensure_bench(c) != LM_OK) goto done;
  /* on the inputs candidates are timed on (uninitialised memory may hold denormals or NaN) */
  skb_fill(&c->bench, c->o->seed);
  double total = 0, gen0_s = 0; /* gen0_s: seconds spent on generation 0 (e-graphs, compiles, timing) */
  int gen0_n = 0;               /* kernels whose generation 0 was made */
  for (size_t q = 0; q < nj; q++) {
    cand *d0 = jobs[q].nc ? &jobs[q].c[0] : NULL;
    if (!d0 || !d0->fn) continue;
    d0->time = skb_time(&c->bench, &d0->k, d0->fn, INFINITY, 0.02);
    d0->status = SK_CS_OK;
    total += d0->time;
  }
  qsort(jobs, nj, sizeof *jobs, cmp_base);
  logf_(c, "kernels: %zu to search, default schedules %.2f us in all\n", nj, 1e6 * total);
  size_t taken = 0; /* kernels given a search (o->max_kernels bounds them; the rest keep the default, uncached) */
  size_t max_k = c->o->max_kernels > 0 ? (size_t)c->o->max_kernels : SIZE_MAX;
  for (size_t lo = 0; lo < nj;) {
    size_t hi = lo, ncands = 0;
    while (hi < nj && (hi == lo || ncands < 96) && time_left(c) && taken < max_k) {
      job *j = &jobs[hi++];
      if (!j->nc || j->c[0].status != SK_CS_OK) continue;
      if (too_small(c, j->c[0].time, total)) {
        logf_(c, "kernel %s: %.2f us, left to the default schedule\n", plan->kernels[j->ki].name,
              1e6 * j->c[0].time);
        decide(c, j, 0, keys, pending, won, 0, 0);
        continue;
      }
      taken++;
      double left = c->deadline - now_(c);
      double eg = left / (double)(nj - hi + 1) / 4;
      /* as many candidates as compiling them leaves time to time them: at most 40% of this
       * kernel's share of what is left (a cold compile cache compiles at ~0.1 s a candidate) */
      double per = c->cc_n > 0 ? c->cc_s / c->cc_n : 0;
      double cap = per > 0 ? 0.4 * left / (double)(nj - hi + 1) / per : 24;
      c->keep_cap = !(cap >= 6) ? 6 : cap > 24 ? 0 : (size_t)cap;
      eg = eg > 3.0 ? 3.0 : eg < 0.05 ? 0.05 : eg;
      logf_(c, "kernel %s (key %016llx, default schedule %.2f us):\n", plan->kernels[j->ki].name,
            (unsigned long long)j->key, 1e6 * j->c[0].time);
      double g0 = now_(c);
      lm_status gst = gen_candidates(c, j, eg);
      gen0_s += now_(c) - g0;
      gen0_n++;
      if (gst == LM_OK) {
        logf_(c, "  e-graph: %zu nodes, %zu classes, %d iterations (stop %d) in %.3f s; %d terms (%d not "
                 "schedulable), %d distinct, timing %zu\n",
              j->enode, j->eclass, j->iters, j->stop, j->egraph_s, j->samples, j->unemitted, j->distinct, j->nc - 1);
        ncands += j->nc;
      } else decide(c, j, 0, keys, pending, won, 0, 0);
    }
    if (lo == hi) break;
    double cc0 = now_(c);
    compile_jobs(c, jobs + lo, hi - lo, 0);
    gen0_s += now_(c) - cc0;
    for (size_t q = lo; q < hi; q++) {
      job *j = &jobs[q];
      if (!j->nc || (j->nc < 2 && !j->sk) || !pending[j->ki]) continue;
      logf_(c, "kernel %s: timing\n", plan->kernels[j->ki].name);
      /* the genetic search's time for this job: half an equal share of what is left, half by its
       * default time, less what the generation 0 of the kernels still waiting will take (at the
       * mean so far): every kernel gets its first generation before any gets a later one */
      double rest = 0, now = now_(c);
      int waiting = 0;
      for (size_t r = q; r < nj; r++)
        if (jobs[r].nc && pending[jobs[r].ki] && jobs[r].c[0].status == SK_CS_OK) {
          rest += jobs[r].c[0].time;
          waiting += r > q && !too_small(c, jobs[r].c[0].time, total);
        }
      double share = 0.5 / (double)(nj - q) + 0.5 * (rest > 0 ? j->c[0].time / rest : 1);
      double until = now + (share < 1 ? share : 1) * (c->deadline - now);
      double reserve = waiting * (gen0_n ? gen0_s / gen0_n : 0);
      if (until > c->deadline - reserve) until = c->deadline - reserve;
      int win = 0, wrong0 = c->rep->wrong, cand0 = c->rep->candidates;
      measure_job(c, j, nj - q, until, gen0_n ? gen0_s / gen0_n : 0, &win, &gen0_s);
      job_drop_egraph(j);
      c->rep->searched++;
      trace_job(c, j, win);
      cand *w = &j->c[win];
      char names[160];
      rule_names(w->rules, names, sizeof names);
      if (win)
        logf_(c, "  winner cand %d (generation %d, %s): %.2f us (%.2fx) rules=%s\n", win, w->gen, w->op,
              1e6 * w->time, j->c[0].time / w->time, names);
      else logf_(c, "  winner: the default schedule (%.2f us)\n", 1e6 * j->c[0].time);
      decide(c, j, win, keys, pending, won, c->rep->candidates - cand0, c->rep->wrong - wrong0);
    }
    for (size_t q = lo; q < hi; q++) job_free(&jobs[q]);
    lo = hi;
  }
done:
  for (size_t q = 0; jobs && q < nj; q++) job_free(&jobs[q]);
  for (size_t q = 0; chk && q < nchk; q++) job_free(&chk[q]);
  lm_free(jobs);
  lm_free(chk);
  lm_free(keys);
  lm_free(pending);
  lm_free(err);
}

/* ---------------------------------------------------------------- stage 1: the plan */

static uint32_t plan_root(lm_sk *s, lm_plan *plan) {
  size_t nk = plan->nkernels;
  uint32_t *ks = lm_calloc(nk + 1, sizeof *ks);
  if (!ks) return LM_EG_NONE;
  uint32_t base = 0;
  for (uint32_t i = 0; i < nk; i++) {
    ks[i] = sk_add_kernel(s, i, base);
    if (ks[i] == LM_EG_NONE) { /* opaque: kept as it is */
      lm_enode nop = {.op = SK_NOP, .attr = i + 1};
      uint32_t body = lm_eg_add(s->eg, &nop);
      lm_enode kn = {.op = SK_KERNEL, .n = 1, .attr = i, .c = {body}};
      ks[i] = lm_eg_add(s->eg, &kn);
    }
    base += (uint32_t)plan->kernels[i].nloops;
  }
  lm_enode nop = {.op = SK_NOP};
  uint32_t list = lm_eg_add(s->eg, &nop);
  for (size_t i = nk; i-- > 0 && list != LM_EG_NONE;) {
    lm_enode sq = {.op = SK_SEQ, .n = 2, .c = {ks[i], list}};
    list = lm_eg_add(s->eg, &sq);
  }
  lm_free(ks);
  return list;
}

/* The kernels of a plan term (a SEQ list of KERNEL nodes). */
static lm_status emit_plan(sctx *c, lm_sk *s, const sk_term *t, lm_kernel **out, size_t *nout) {
  lm_plan *plan = c->plan;
  size_t n = 0;
  for (uint32_t i = t->root; t->n[i].op == SK_SEQ; i = t->n[i].c[1]) n++;
  lm_kernel *ks = lm_calloc(n + 1, sizeof *ks);
  if (!ks) return LM_ERR_NOMEM;
  lm_status st = LM_OK;
  size_t m = 0;
  for (uint32_t i = t->root; t->n[i].op == SK_SEQ && st == LM_OK; i = t->n[i].c[1]) {
    const lm_enode *kn = &t->n[t->n[i].c[0]];
    if (kn->op != SK_KERNEL || kn->attr >= plan->nkernels) {
      st = lm_fail(LM_ERR_INVALID, "search: a plan term without a kernel");
      break;
    }
    const lm_enode *body = &t->n[kn->c[0]];
    if (body->op == SK_NOP && body->attr) st = sk_kernel_copy(&plan->kernels[body->attr - 1], &ks[m]);
    else st = sk_emit_kernel(s, t, t->n[i].c[0], &plan->kernels[kn->attr], &ks[m]);
    if (st == LM_OK) m++;
  }
  if (st != LM_OK) {
    for (size_t i = 0; i < m; i++) lm_kernel_free(&ks[i]);
    lm_free(ks);
    return st;
  }
  *out = ks;
  *nout = m;
  return LM_OK;
}

static double time_seq(sctx *c, const lm_kernel *ks, void **fns, size_t n, double max_s) {
  double best = INFINITY, start = lm_search_now();
  for (int rep = 0; rep < 2000; rep++) {
    double a = lm_search_now();
    int reps = 0;
    do {
      for (size_t i = 0; i < n; i++) skb_launch(&c->bench, &ks[i], fns[i]);
      skb_sync(&c->bench);
      reps++;
    } while (lm_search_now() - a < 2e-4);
    double per = (lm_search_now() - a) / reps;
    if (per < best) best = per;
    if (rep >= 5 && lm_search_now() - start > max_s) break;
  }
  return best;
}

/* Times the plan's kernels against the fused ones on the same inputs; 1 when the fused plan is
 * correct and faster. t_old NULL: checks them only (a cached fusion), 1 when the fused plan is
 * correct. *err: the fused plan's worst error over the tolerance (> 1 fails; INFINITY when it
 * could not run). */
static int judge_plan(sctx *c, lm_kernel *nks_in, size_t nn, double *t_old, double *t_new, double *err) {
  lm_plan *plan = c->plan;
  size_t no = plan->nkernels;
  int ok = 0;
  *err = INFINITY;
  /* both plans as they would run: after the default schedule's rewrite of each kernel */
  lm_kernel *oks = lm_calloc(no + 1, sizeof *oks), *nks = lm_calloc(nn + 1, sizeof *nks);
  for (size_t i = 0; oks && nks && i < no; i++)
    if (sk_kernel_copy(&plan->kernels[i], &oks[i]) == LM_OK) default_rewrite(c, &oks[i]), as_run(c, &oks[i]);
  for (size_t i = 0; oks && nks && i < nn; i++)
    if (sk_kernel_copy(&nks_in[i], &nks[i]) == LM_OK) default_rewrite(c, &nks[i]), as_run(c, &nks[i]);
  void **fo = lm_calloc(no + 1, sizeof *fo), **fn = lm_calloc(nn + 1, sizeof *fn);
  uint8_t *w = lm_calloc(plan->nbufs + 1, 1), *wk = lm_calloc(plan->nbufs + 1, 1);
  float **ref = lm_calloc(plan->nbufs + 1, sizeof *ref);
  char *pre = lm_render_prelude(c->dialect);
  lm_sb tu = {0};
  if (!oks || !nks || !fo || !fn || !w || !wk || !ref || !pre || ensure_bench(c) != LM_OK) goto done;
  lm_sb_puts(&tu, pre);
  char name[32];
  for (size_t i = 0; i < no; i++) {
    snprintf(name, sizeof name, "po%zu", i);
    if (add_source(c, &tu, &oks[i], name) != LM_OK) goto done;
    written(plan, &oks[i], wk);
    for (size_t b = 0; b < plan->nbufs; b++) w[b] |= wk[b];
  }
  for (size_t i = 0; i < nn; i++) {
    snprintf(name, sizeof name, "pn%zu", i);
    if (add_source(c, &tu, &nks[i], name) != LM_OK) goto done;
  }
  char *src = lm_sb_take(&tu);
  void *lib = src ? build_tu(c, src) : NULL;
  lm_free(src);
  if (!lib) goto done;
  for (size_t i = 0; i < no; i++) {
    snprintf(name, sizeof name, "po%zu", i);
    if (!(fo[i] = sym_fn(c, lib, name, &oks[i]))) goto done;
  }
  for (size_t i = 0; i < nn; i++) {
    snprintf(name, sizeof name, "pn%zu", i);
    if (!(fn[i] = sym_fn(c, lib, name, &nks[i]))) goto done;
  }
  skb_fill(&c->bench, c->o->seed + 17);
  poison(c, w);
  for (size_t i = 0; i < no; i++) skb_launch(&c->bench, &oks[i], fo[i]);
  skb_pull(&c->bench, w);
  for (size_t b = 0; b < plan->nbufs; b++)
    if (w[b]) {
      if (!(ref[b] = lm_malloc((c->bench.count[b] + 1) * sizeof(float)))) goto done;
      memcpy(ref[b], c->bench.bufs[b], c->bench.count[b] * sizeof(float));
    }
  skb_fill(&c->bench, c->o->seed + 17);
  poison(c, w);
  for (size_t i = 0; i < nn; i++) skb_launch(&c->bench, &nks[i], fn[i]);
  double e = check(c, w, ref, RTOL_EXACT, ATOL_EXACT);
  *err = e;
  if (!t_old) {
    ok = e <= 1;
    goto done;
  }
  if (!(e <= 1)) {
    c->rep->wrong++;
    logf_(c, "plan: the fused plan is WRONG (error %.3g x tolerance)\n", e);
    goto done;
  }
  double budget = (c->deadline - now_(c)) / 8;
  if (budget > 1.0) budget = 1.0;
  if (budget < 0.02) budget = 0.02;
  *t_old = time_seq(c, oks, fo, no, budget);
  *t_new = time_seq(c, nks, fn, nn, budget);
  ok = *t_new < 0.98 * *t_old;
done:
  for (size_t i = 0; oks && i < no; i++) lm_kernel_free(&oks[i]);
  for (size_t i = 0; nks && i < nn; i++) lm_kernel_free(&nks[i]);
  lm_free(oks);
  lm_free(nks);
  lm_sb_free(&tu);
  lm_free(pre);
  for (size_t b = 0; ref && b < plan->nbufs; b++) lm_free(ref[b]);
  lm_free(ref);
  lm_free(w);
  lm_free(wk);
  lm_free(fo);
  lm_free(fn);
  return ok;
}

static void set_kernels(sctx *c, lm_kernel *ks, size_t n) {
  lm_plan *plan = c->plan;
  for (size_t i = 0; i < plan->nkernels; i++) lm_kernel_free(&plan->kernels[i]);
  lm_free(plan->kernels);
  plan->kernels = ks;
  plan->nkernels = plan->kernelcap = n;
  lm_plan_liveness(plan);
}

static void plan_stage(sctx *c) {
  lm_plan *plan = c->plan;
  if (!c->o->fuse_kernels || plan->nkernels < 2) return;
  lm_sb sb = {0};
  lm_plan_dump(plan, &sb);
  char *text = lm_sb_take(&sb);
  if (!text) return;
  uint64_t key = key_of(c, text, "plan");
  lm_free(text);
  const char *cached = skc_get(&c->cache, key);
  char kind = 0;
  double def = 0, best = 0;
  int ncand = 0, rounding = 0;
  uint64_t rules = 0;
  const char *term = NULL;
  if (cached && !parse_value(cached, &kind, &def, &best, &ncand, &rounding, &rules, &term)) cached = NULL;
  if (cached && kind == 'D') {
    c->rep->from_cache++;
    logf_(c, "plan: from the cache: no kernel fusion\n");
    return;
  }
  lm_sk s;
  if (sk_init(&s, plan) != LM_OK) return;
  s.stage = SK_STAGE_PLAN;
  s.rounding = 0;
  uint32_t root = plan_root(&s, plan);
  sk_term t = {0};
  lm_kernel *nks = NULL;
  size_t nn = 0;
  if (root == LM_EG_NONE) goto done;
  if (cached) { /* checked against the unfused plan the first time this process applies it */
    if (sk_term_parse(&s, term, &t) != LM_OK || emit_plan(c, &s, &t, &nks, &nn) != LM_OK) goto done;
    uint64_t id = decision_id(key, cached);
    double e = 0;
    int before = decision_checked(id, 0);
    if (before || judge_plan(c, nks, nn, NULL, NULL, &e)) {
      decision_checked(id, 1);
      c->rep->from_cache++;
      if (before) logf_(c, "plan: from the cache: %zu kernels -> %zu\n", plan->nkernels, nn);
      else
        logf_(c, "plan: from the cache, checked against the reference (error %.3g x tolerance): %zu kernels -> %zu\n",
              e, plan->nkernels, nn);
      set_kernels(c, nks, nn);
      nks = NULL;
      goto done;
    }
    /* discarded: a default decision over it, and the fusion searched as if there were no entry */
    c->rep->wrong++;
    logf_(c, "plan: the cached kernel fusion fails its check against the reference (error %.3g x tolerance): "
             "discarded\n", e);
    put_decision(c, key, 'D', 0, 0, 0, 0, 0, NULL);
    cached = NULL;
    term = NULL;
    for (size_t i = 0; i < nn; i++) lm_kernel_free(&nks[i]);
    lm_free(nks);
    nks = NULL;
    nn = 0;
    sk_term_free(&t);
    sk_free(&s);
    if (sk_init(&s, plan) != LM_OK) return;
    s.stage = SK_STAGE_PLAN;
    s.rounding = 0;
    if ((root = plan_root(&s, plan)) == LM_EG_NONE) goto done;
  }
  if (!(c->o->budget_s > 0)) goto done; /* cache_only */
  if (c->dev && c->o->budget_s < 30) { /* judging builds two whole plans: a device compiler is slow */
    logf_(c, "plan: kernel fusion not tried: on a device a search under 30 s keeps its budget for the kernels\n");
    goto done;
  }
  int nr;
  const lm_rule *rl = sk_rules(&nr);
  lm_run_limits lim = {.iterations = 24, .nodes = 200000, .seconds = (c->deadline - now_(c)) / 6,
                       .match_limit = 100000, .ban_length = 1, .enabled = c->enabled_p, .clock = c->o->clock,
                       .clock_ctx = c->o->clock_ctx};
  lm_run_report rr = {0};
  uint32_t applied[64] = {0};
  rr.applied = applied;
  lm_eg_run(s.eg, rl, nr, &s, &lim, &rr);
  for (int r = 0; r < nr; r++)
    if (applied[r]) logf_(c, "plan: rule %s applied %u times\n", rl[r].name, applied[r]);
  size_t ncl = s.eg->nclasses;
  double *cost = lm_malloc((ncl + 1) * sizeof *cost);
  uint32_t *bestn = lm_malloc((ncl + 1) * sizeof *bestn);
  if (cost && bestn) {
    sk_greedy(&s, cost, bestn);
    if (sk_extract(&s, root, bestn, NULL, NULL, 0, NULL, &t) != LM_OK || emit_plan(c, &s, &t, &nks, &nn) != LM_OK)
      nn = 0;
  }
  lm_free(cost);
  lm_free(bestn);
  logf_(c, "plan: e-graph %zu nodes, %zu classes, %d iterations in %.3f s: %zu kernels -> %zu\n", rr.nodes,
        rr.classes, rr.iterations, rr.seconds, plan->nkernels, nn);
  if (nn && nn < plan->nkernels && getenv("LUMEN_SEARCH_DEBUG") && c->log) {
    lm_plan tmp = *plan;
    tmp.kernels = nks;
    tmp.nkernels = nn;
    lm_sb db = {0};
    lm_plan_dump(&tmp, &db);
    if (db.s) logf_(c, "plan: fused plan:\n%s", db.s);
    lm_sb_free(&db);
  }
  if (nn && nn < plan->nkernels) {
    double t_old = 0, t_new = 0;
    double e;
    int ok = judge_plan(c, nks, nn, &t_old, &t_new, &e);
    logf_(c, "plan: default %.2f us, fused %.2f us: %s\n", 1e6 * t_old, 1e6 * t_new, ok ? "fused" : "kept");
    char *tt = ok ? sk_term_print(&s, &t) : NULL;
    if (!ok || tt) put_decision(c, key, ok ? 'P' : 'D', t_old, t_new, 1, 0, 0, tt);
    lm_free(tt);
    if (ok) {
      set_kernels(c, nks, nn);
      nks = NULL;
    }
  } else put_decision(c, key, 'D', 0, 0, 0, 0, 0, NULL);
done:
  if (nks) {
    for (size_t i = 0; i < nn; i++) lm_kernel_free(&nks[i]);
    lm_free(nks);
  }
  sk_term_free(&t);
  sk_free(&s);
}

/* ---------------------------------------------------------------- whole variants of a plan */

typedef struct variant {
  lm_kernel *ks;
  size_t nk;
  void **fns;
  double t;
  char name[64];
} variant;

/* Runs variant v's kernels once on the inputs of `seed`. */
static void run_variant(sctx *c, const variant *v, uint64_t seed) {
  skb_fill(&c->bench, seed);
  for (size_t i = 0; i < v->nk; i++) skb_launch(&c->bench, &v->ks[i], v->fns[i]);
  skb_pull(&c->bench, NULL);
}

/* Do the plan's inputs and outputs hold ref's bits? Where ref[b] is NULL, buffer b is copied
 * into it (variant 0's run). */
static int same_io(sctx *c, float **ref) {
  for (size_t b = 0; b < c->plan->nbufs; b++) {
    if (c->plan->bufs[b].kind == LM_BUF_TEMP) continue;
    size_t n = c->bench.count[b] * sizeof(float);
    if (!ref[b]) {
      if (!(ref[b] = lm_malloc(n + sizeof(float)))) return 0;
      memcpy(ref[b], c->bench.bufs[b], n);
    } else if (memcmp(ref[b], c->bench.bufs[b], n))
      return 0;
  }
  return 1;
}

static void variant_stage(sctx *c, const lm_search_variants *vs, int *chosen) {
  variant *v = lm_calloc((size_t)vs->n + 1, sizeof *v);
  float **ref = lm_calloc(c->plan->nbufs + 1, sizeof *ref);
  char *pre = lm_render_prelude(c->dialect);
  if (!v || !ref || !pre) goto done;
  lm_sb sb = {0};
  lm_plan_dump(c->plan, &sb);
  lm_sb_printf(&sb, "variants of %s", vs->tag);
  char *text = lm_sb_take(&sb);
  if (!text) goto done;
  uint64_t key = key_of(c, text, "variants");
  lm_free(text);
  const char *cached = skc_get(&c->cache, key);
  int idx = -1, at = 0;
  char name[64];
  if (cached && sscanf(cached, "V %d %63s%n", &idx, name, &at) == 2 && at > 0 && idx >= 0 && idx < vs->n) {
    char made[64] = "";
    lm_kernel *ks = NULL;
    size_t nk = 0;
    int applies = vs->make(vs->ctx, idx, &ks, &nk, made, sizeof made) == LM_OK && !strcmp(made, name);
    if (applies) {
      *chosen = idx;
      c->rep->from_cache++;
      logf_(c, "variants: from the cache: %d (%s)\n", idx, name);
    } else
      logf_(c, "variants: the cache's choice %d (%s) is not this compiler's variant %d (%s): ignored\n", idx, name,
            idx, made);
    for (size_t i = 0; i < nk; i++) lm_kernel_free(&ks[i]);
    lm_free(ks);
    if (applies) goto done;
  }
  if (!(c->o->budget_s > 0) || ensure_bench(c) != LM_OK) goto done;
  for (size_t b = 0; vs->io_sym >= 0 && b < c->plan->nbufs; b++) { /* T steps of each */
    if (c->plan->bufs[b].kind == LM_BUF_TEMP) continue;
    size_t n = c->bench.count[b] * (size_t)c->syms[vs->io_sym];
    float *f = lm_malloc_aligned((n + 16) * sizeof(float));
    if (!f) goto done;
    lm_free(c->bench.bufs[b]);
    c->bench.bufs[b] = f;
    c->bench.count[b] = n;
  }
  int built = 0;
  for (int i = 0; i < vs->n && (i == 0 || time_left(c)); i++) {
    if (vs->make(vs->ctx, i, &v[i].ks, &v[i].nk, v[i].name, sizeof v[i].name) != LM_OK) {
      logf_(c, "variants: %d not made: %s\n", i, lm_last_error());
      if (i == 0) goto done;
      continue;
    }
    lm_sb tu = {0};
    lm_sb_puts(&tu, pre);
    char fn[48];
    lm_status st = LM_OK;
    for (size_t k = 0; k < v[i].nk && st == LM_OK; k++) {
      snprintf(fn, sizeof fn, "sv%d_%zu", i, k);
      st = add_source(c, &tu, &v[i].ks[k], fn);
    }
    char *src = lm_sb_take(&tu);
    void *lib = st == LM_OK && src ? build_tu(c, src) : NULL;
    lm_free(src);
    v[i].fns = lib ? lm_calloc(v[i].nk + 1, sizeof *v[i].fns) : NULL;
    for (size_t k = 0; v[i].fns && k < v[i].nk; k++) {
      snprintf(fn, sizeof fn, "sv%d_%zu", i, k);
      if (!(v[i].fns[k] = sym_fn(c, lib, fn, &v[i].ks[k]))) lm_free(v[i].fns), v[i].fns = NULL;
    }
    if (!v[i].fns) {
      logf_(c, "variants: %d (%s) did not build\n", i, v[i].name);
      if (i == 0) goto done;
      continue;
    }
    run_variant(c, &v[i], c->o->seed + 29);
    if (!same_io(c, ref)) {
      c->rep->wrong++;
      logf_(c, "variants: %d (%s) is WRONG: its inputs and outputs differ from the default's\n", i, v[i].name);
      lm_free(v[i].fns);
      v[i].fns = NULL;
      continue;
    }
    v[i].t = INFINITY;
    built++;
  }
  /* timed in turns, so that each sees the same load; each from the same inputs */
  double share = (c->deadline - now_(c)) / (3.0 * (built > 0 ? built : 1));
  if (share > 0.5) share = 0.5;
  if (share < 0.02) share = 0.02;
  for (int r = 0; r < 3; r++)
    for (int i = 0; i < vs->n; i++) {
      if (!v[i].fns) continue;
      skb_fill(&c->bench, c->o->seed + 31);
      double t = time_seq(c, v[i].ks, v[i].fns, v[i].nk, share);
      if (t < v[i].t) v[i].t = t;
      c->rep->candidates += r == 0;
    }
  int best = 0;
  for (int i = 0; i < vs->n; i++) {
    if (!v[i].fns) continue;
    logf_(c, "variants: %d (%s) %.2f us\n", i, v[i].name, 1e6 * v[i].t);
    if (v[i].t < v[best].t) best = i;
  }
  if (!(v[best].t < 0.97 * v[0].t)) best = 0;
  c->rep->searched++;
  c->rep->default_s += v[0].t;
  c->rep->best_s += v[best].t;
  logf_(c, "variants: %d (%s) chosen, %.2f us against the default's %.2f\n", best, v[best].name, 1e6 * v[best].t,
        1e6 * v[0].t);
  char val[160];
  snprintf(val, sizeof val, "V %d %s %.3f %.3f", best, v[best].name, 1e6 * v[0].t, 1e6 * v[best].t);
  if (skc_put(&c->cache, key, val) == LM_OK) *chosen = best;
done:
  for (int i = 0; v && i < vs->n; i++) {
    for (size_t k = 0; k < v[i].nk; k++) lm_kernel_free(&v[i].ks[k]);
    lm_free(v[i].ks);
    lm_free(v[i].fns);
  }
  lm_free(v);
  for (size_t b = 0; ref && b < c->plan->nbufs; b++) lm_free(ref[b]);
  lm_free(ref);
  lm_free(pre);
}

/* ---------------------------------------------------------------- entry */

lm_status lm_search_plan(lm_plan *plan, const int64_t *syms, const lm_search_options *opts, lm_search_report *rep) {
  return sk_search_plan_traced(plan, syms, opts, rep, NULL);
}

static lm_status search_plan(lm_plan *plan, const int64_t *syms, const lm_search_options *opts,
                             lm_search_report *rep, sk_trace *trace, const lm_search_device *dev,
                             const lm_search_variants *vs, int *chosen);

lm_status lm_search_plan_on(lm_plan *plan, const int64_t *syms, const lm_search_options *o, lm_search_report *r,
                            const lm_search_device *dev) {
  if (dev && (!dev->ops || !dev->ops->module_build || !dev->ops->module_entry || !dev->ops->launch_kernel))
    return lm_fail(LM_ERR_UNSUPPORTED, "search: the %s backend cannot time kernels one by one",
                   dev->ops ? dev->ops->name : "(no)");
  return search_plan(plan, syms, o, r, NULL, dev, NULL, NULL);
}

lm_status lm_search_variants_on(lm_plan *plan, const int64_t *syms, const lm_search_options *o,
                                const lm_search_device *dev, const lm_search_variants *vs, int *chosen) {
  *chosen = 0;
  if (dev) return LM_OK; /* the variants are the cpu's passes; a device times kernels one by one */
  return search_plan(plan, syms, o, NULL, NULL, NULL, vs, chosen);
}

lm_status sk_search_plan_traced(lm_plan *plan, const int64_t *syms, const lm_search_options *opts,
                                lm_search_report *rep, sk_trace *trace) {
  return search_plan(plan, syms, opts, rep, trace, NULL, NULL, NULL);
}

static lm_status search_plan(lm_plan *plan, const int64_t *syms, const lm_search_options *opts,
                             lm_search_report *rep, sk_trace *trace, const lm_search_device *dev,
                             const lm_search_variants *vs, int *chosen) {
  if (trace) memset(trace, 0, sizeof *trace);
  lm_search_options defaults;
  if (!opts) {
    lm_search_options_init(&defaults);
    opts = &defaults;
  }
  lm_search_report local_rep;
  if (!rep) rep = &local_rep;
  memset(rep, 0, sizeof *rep);
  if (!plan || !plan->g) return lm_fail(LM_ERR_INVALID, "search: no plan");
  rep->kernels_before = rep->kernels_after = (int)plan->nkernels;
  if (!(opts->budget_s > 0) && !(opts->cache_only && opts->use_cache)) {
    for (size_t i = 0; !dev && !vs && i < plan->nkernels; i++) interchange_one(plan, &plan->kernels[i]);
    return LM_OK;
  }
  sctx c = {.o = opts, .plan = plan, .rep = rep, .rng = opts->seed ? opts->seed : 1, .trace = trace,
            .ga_generations = opts->generations < 0 ? 0 : opts->generations > 1000 ? 1000 : opts->generations,
            .dev = dev, .dialect = dev ? dev->ops->kernel_dialect : LM_DIALECT_C};
  uint8_t *won = NULL;
  c.t0 = now_(&c);
  double wall0 = lm_search_now();
  c.deadline = c.t0 + (opts->budget_s > 0 ? opts->budget_s : 0); /* cache_only: none */
  lm_status st = LM_OK;
  const lm_exprs *x = &plan->g->x;
  c.syms = lm_calloc(x->nsyms + 1, sizeof *c.syms);
  int nr;
  sk_rules(&nr);
  c.enabled_k = lm_calloc((size_t)nr + 1, 1);
  c.enabled_p = lm_calloc((size_t)nr + 1, 1);
  if (!c.syms || !c.enabled_k || !c.enabled_p) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  for (size_t i = 0; i < x->nsyms; i++)
    c.syms[i] = syms ? syms[i] : sk_sym_value(&x->syms[i], opts->sym_default > 0 ? opts->sym_default : 256);
  lm_sk probe = {.rounding = opts->allow_rounding, .stage = SK_STAGE_KERNEL, .gpu = c.dialect != LM_DIALECT_C};
  for (int r = 0; r < nr; r++) c.enabled_k[r] = (uint8_t)sk_rule_stage_ok(&probe, r);
  probe.stage = SK_STAGE_PLAN;
  probe.rounding = 0;
  for (int r = 0; r < nr; r++) c.enabled_p[r] = (uint8_t)sk_rule_stage_ok(&probe, r);
  if (dev) { /* the backend and its device name the cache */
    size_t n = strlen(dev->ops->name) + strlen(dev->name ? dev->name : "?") + 32;
    if ((c.devid = lm_malloc(n)))
      snprintf(c.devid, n, "%s|%s|%s", dev->ops->name, dev->name ? dev->name : "?", LM_SEARCH_VERSION);
  } else {
    if ((st = lm_cc_open(&c.cc)) != LM_OK) goto done;
    if ((st = lm_pool_new(opts->threads, &c.pool)) != LM_OK) goto done;
    c.devid = sk_device_id(c.cc, lm_pool_size(c.pool));
  }
  if (!c.devid) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  char path[4200] = "";
  if (opts->use_cache) {
    const char *dir = opts->cache_dir ? opts->cache_dir : lm_cc_cache_dir();
    snprintf(path, sizeof path, "%s/search-%016llx.txt", dir,
             (unsigned long long)lm_hash_bytes(c.devid, strlen(c.devid), 0));
    if (skc_load(&c.cache, path) != LM_OK) memset(&c.cache, 0, sizeof c.cache);
  }
  if (!(opts->budget_s > 0) && !c.cache.n) goto done; /* cache_only, and the cache holds nothing */
  const char *lp = opts->log_path;
  if (lp && *lp) c.log = fopen(lp, "a");
  logf_(&c, "==== lumen search: %zu kernels, budget %.1f s%s, device %s\n", plan->nkernels, opts->budget_s,
        opts->budget_s > 0 ? "" : " (the tuning cache's decisions only)", c.devid);
  if (c.cache.skipped) logf_(&c, "cache %s: %zu malformed lines skipped\n", path, c.cache.skipped);
  for (size_t i = 0; i < x->nsyms; i++) /* the sizes candidates are timed at */
    logf_(&c, "symbol %s = %lld%s\n", x->syms[i].name, (long long)c.syms[i],
          syms ? " (bound)" : x->syms[i].hint ? " (hinted)" : " (guessed)");

  if (vs) {
    variant_stage(&c, vs, chosen);
    if (opts->use_cache && c.cache.path) skc_save(&c.cache);
    goto done;
  }
  plan_stage(&c);
  rep->kernels_after = (int)plan->nkernels;
  if (!(c.kr = lm_calloc(plan->nkernels + 1, sizeof *c.kr))) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  if (!(won = lm_calloc(plan->nkernels + 1, 1))) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  kernel_stage(&c, won);
  rep->kernels = c.kr;
  rep->nkernels = (int)plan->nkernels;
  c.kr = NULL;
  if (opts->use_cache && c.cache.path) skc_save(&c.cache);
done:
  /* what the search did not replace gets the default schedule's rewrite, as without a search */
  for (size_t i = 0; !dev && !vs && i < plan->nkernels; i++) /* a device backend applies its own after */
    if (!won || !won[i]) interchange_one(plan, &plan->kernels[i]);
  lm_free(won);
  rep->wall_s = lm_search_now() - wall0;
  logf_(&c, "==== search done in %.2f s: %d kernels searched, %d from the cache, %d candidates timed, %d wrong; "
            "kernels %.2f us -> %.2f us\n",
        rep->wall_s, rep->searched, rep->from_cache, rep->candidates, rep->wrong, 1e6 * rep->default_s,
        1e6 * rep->best_s);
  if (c.log) fclose(c.log);
  if (c.have_bench) skb_close(&c.bench);
  for (size_t i = 0; i < c.nentries; i++) dev->ops->entry_free(dev->ctx, c.entries[i]);
  lm_free(c.entries);
  for (size_t i = 0; i < c.nlibs; i++)
    if (dev) dev->ops->module_free(dev->ctx, c.libs[i]);
    else lm_cc_lib_close(c.libs[i]);
  lm_free(c.libs);
  skc_free(&c.cache);
  lm_free(c.devid);
  lm_free(c.kr);
  lm_free(c.syms);
  lm_free(c.enabled_k);
  lm_free(c.enabled_p);
  if (c.pool) lm_pool_free(c.pool);
  if (c.cc) lm_cc_close(c.cc);
  if (rep == &local_rep) lm_search_report_free(rep);
  return st;
}
