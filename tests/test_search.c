/* Tests of the schedule search (compiler/search): on a 64x64x64 matmul, a softmax and a small
 * Adam-style PPO update (three assigned values, so three kernels before fusion):
 * - every distinct candidate extracted from the saturated e-graph (greedy, 150 random genomes)
 *   gives what the original kernel gives, both run by the reference interpreter on random inputs
 *   away from zero (exact candidates: float ==; rounding ones: rtol 1e-4 + 1e-5 of the largest);
 * - the same for every kernel of the graphs lumen trains with: CartPole's PPO minibatch update and
 *   its rollout step (symbolic sizes bound small);
 * - lm_search_plan times candidates on the cpu, finds none wrong, and the plan it leaves computes
 *   the same outputs as the lowered plan (interpreter, rtol 1e-4 + 1e-5 of the largest), also
 *   for the whole PPO update;
 * - the bench launches a kernel cut over the thread pool as the cpu backend does;
 * - the tuning cache: a second search of the same plan takes every decision from the cache,
 *   compiles nothing and times nothing, and leaves the same code; corrupt, truncated and
 *   foreign lines are skipped, and the valid lines still apply; a line whose term computes
 *   something else is checked against the reference, discarded and searched again, and a valid
 *   one written by another process is checked once per process;
 * - a zero budget leaves the default schedule; the search log names candidates and the winner;
 * - lm_search_bench runs both schedules side by side and they agree;
 * - the genetic search: crossover takes every choice from a parent (or the greedy repair),
 *   mutation changes a few choices and keeps the rest, offspring of offspring equal the reference
 *   (matmul, adam), and a search of a 128^3 matmul (space far above the exhaustive limit) runs
 *   more than one generation of candidates distinct by source, none wrong, each offspring naming
 *   earlier parents, the winner timed ok, a log line per generation, and a warm cache that
 *   searches nothing;
 * - register-tile seeds take their forced nodes and equal the reference; packing copies a
 *   read-only panel once, changes no bit, and leaves written buffers, loads that name the loop
 *   and small copies alone.
 * Searches use a fresh cache directory under $TMPDIR so no test sees another's decisions. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cc.h"
#include "compile.h"
#include "gpu.h"
#include "nvrtc.h"
#include "loopir.h"
#include "lumen/lumen.h"
#include "memplan.h"
#include "pool.h"
#include "lumen/search.h"
#include "passes.h"
#include "render.h"
#include "search/search-impl.h"
#include "support/check.h"
#include "support/timeout.h"

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

/* ---------------------------------------------------------------- graphs */

static lm_graph_t *matmul64(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim d[2] = {64, 64};
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, d), b = lm_input(g, "b", LM_ROLE_DATA, 2, d);
  cr_assert_eq(lm_output(lm_matmul(a, b), "c"), LM_OK);
  return g;
}

/* Large enough that its space is far above the exhaustive limit and the reference check runs the
 * default schedule's code rather than the interpreter. */
static lm_graph_t *matmul128(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim d[2] = {128, 128};
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, d), b = lm_input(g, "b", LM_ROLE_DATA, 2, d);
  cr_assert_eq(lm_output(lm_matmul(a, b), "c"), LM_OK);
  return g;
}

static lm_graph_t *softmax(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim d[2] = {32, 128};
  cr_assert_eq(lm_output(lm_softmax(lm_input(g, "x", LM_ROLE_DATA, 2, d), 1), "y"), LM_OK);
  return g;
}

/* Adam on one parameter vector: m, v and p are each assigned (one kernel each by default). */
static lm_graph_t *adam(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim d[1] = {4096};
  lm_tensor p = lm_input(g, "p", LM_ROLE_PARAM, 1, d), m = lm_input(g, "m", LM_ROLE_STATE, 1, d);
  lm_tensor v = lm_input(g, "v", LM_ROLE_STATE, 1, d), gr = lm_input(g, "g", LM_ROLE_DATA, 1, d);
  lm_tensor m2 = lm_add(lm_mul_scalar(m, 0.9f), lm_mul_scalar(gr, 0.1f));
  lm_tensor v2 = lm_add(lm_mul_scalar(v, 0.999f), lm_mul_scalar(lm_mul(gr, gr), 0.001f));
  lm_tensor step = lm_div(m2, lm_add_scalar(lm_sqrt(v2), 1e-8f));
  lm_tensor p2 = lm_sub(p, lm_mul_scalar(step, 3e-4f));
  cr_assert_eq(lm_assign(m, m2), LM_OK);
  cr_assert_eq(lm_assign(v, v2), LM_OK);
  cr_assert_eq(lm_assign(p, p2), LM_OK);
  cr_assert_eq(lm_output(lm_sum(step, 0, 0), "step_sum"), LM_OK);
  return g;
}

typedef struct lowered {
  lm_graph_t *g;
  lm_plan *p;
} lowered;

/* The plan the search starts from: canonical, lowered, before the default schedule's rewrites. */
static lowered lower(lm_graph_t *g0) {
  cr_assert_eq(lm_graph_validate(g0), LM_OK, "%s", lm_last_error());
  lowered l = {lm_canonicalize_ex(g0, LM_CANON_EXACT, NULL), NULL};
  cr_assert(l.g);
  lm_graph_free(g0);
  OK(lm_lower(l.g, &l.p));
  return l;
}

static void lowered_free(lowered *l) {
  lm_plan_free(l->p);
  lm_graph_free(l->g);
}

/* ---------------------------------------------------------------- interpreting plans */

typedef struct bufs {
  size_t n;
  float **b;
  size_t *count;
} bufs;

/* Symbol values of the graphs with symbolic dimensions (the training graphs); NULL otherwise.
 * Each test runs in its own process. */
static const int64_t *test_syms;

static bufs bufs_new(const lm_plan *p, uint64_t seed) {
  bufs s = {p->nbufs, calloc(p->nbufs + 1, sizeof(float *)), calloc(p->nbufs + 1, sizeof(size_t))};
  check_rng r = check_rng_new(seed);
  for (size_t i = 0; i < p->nbufs; i++) {
    s.count[i] = (size_t)lm_x_eval(&p->g->x, p->bufs[i].numel, NULL, test_syms);
    s.b[i] = malloc((s.count[i] + 1) * sizeof(float));
    check_fill(&r, s.b[i], s.count[i], -1.0, 1.0, 0.1);
  }
  return s;
}

static void bufs_free(bufs *s) {
  for (size_t i = 0; i < s->n; i++) free(s->b[i]);
  free(s->b);
  free(s->count);
}

static void bufs_copy(bufs *d, const bufs *s) {
  for (size_t i = 0; i < s->n; i++) memcpy(d->b[i], s->b[i], s->count[i] * sizeof(float));
}

static void interpret(const lm_plan *p, const lm_kernel *ks, size_t n, bufs *b) {
  for (size_t i = 0; i < n; i++) OK(sk_interpret(p, &ks[i], b->b, b->count, test_syms, 5, 1));
}

/* Buffers the plan's kernels write that hold results (outputs and assigned values). */
static int result_buf(const lm_plan *p, size_t b) {
  if (p->bufs[b].kind == LM_BUF_OUTPUT) return 1;
  for (size_t i = 0; i < p->ncopies; i++)
    if (p->copies[i].src == b) return 1;
  return 0;
}

static void expect_close(const lm_plan *p, const bufs *got, const bufs *want, int exact, int all, const char *what) {
  for (size_t i = 0; i < want->n; i++) {
    if (!all && !result_buf(p, i)) continue;
    double scale = 0;
    for (size_t j = 0; j < want->count[i]; j++)
      if (isfinite(want->b[i][j]) && fabs(want->b[i][j]) > scale) scale = fabs(want->b[i][j]);
    for (size_t j = 0; j < want->count[i]; j++) {
      float a = got->b[i][j], b = want->b[i][j];
      if (isnan(a) && isnan(b)) continue;
      int ok = exact ? a == b : fabs((double)a - b) <= 1e-4 * fabs(b) + 1e-5 * scale;
      cr_assert(ok, "%s: buffer %zu element %zu: %.9g, the reference gives %.9g", what, i, j, (double)a, (double)b);
    }
  }
}

/* ---------------------------------------------------------------- every candidate */

/* Records h and returns 1 the first time it is seen (while there is room), else 0. */
/* Kernels a and b run from the same inputs compute bitwise the same results. */
static void expect_same_kernels(const lm_plan *p, const lm_kernel *a, const lm_kernel *b, const bufs *in, bufs *want,
                                bufs *got, const char *what) {
  bufs_copy(want, in);
  interpret(p, a, 1, want);
  bufs_copy(got, in);
  interpret(p, b, 1, got);
  expect_close(p, got, want, 1, 1, what);
}

static int first_sight(uint64_t *seen, size_t *n, size_t cap, uint64_t h) {
  for (size_t q = 0; q < *n; q++)
    if (seen[q] == h) return 0;
  if (*n >= cap) return 0;
  seen[(*n)++] = h;
  return 1;
}

/* Kernel ki of a lowered plan as a saturated e-graph (the search's kernel-stage limits) with the
 * greedy choice per class. */
typedef struct saturated {
  lm_sk s;
  uint32_t root;
  size_t ncl;
  double *cost;
  uint32_t *best;
} saturated;

static void saturate_gpu(lowered *l, uint32_t ki, saturated *z, const char *what, int gpu) {
  OK(sk_init(&z->s, l->p));
  z->s.stage = SK_STAGE_KERNEL;
  z->s.gpu = gpu;
  z->root = sk_add_kernel(&z->s, ki, 0);
  cr_assert_neq(z->root, LM_EG_NONE, "%s: kernel %u: %s", what, ki, z->s.why);
  int nr;
  const lm_rule *rules = sk_rules(&nr);
  uint8_t enabled[64] = {0};
  for (int r = 0; r < nr; r++) enabled[r] = (uint8_t)sk_rule_stage_ok(&z->s, r);
  lm_run_limits lim = {.iterations = 8, .nodes = 40000, .seconds = 3, .match_limit = 1000, .ban_length = 2,
                       .enabled = enabled};
  lm_run_report rr = {0};
  lm_eg_run(z->s.eg, rules, nr, &z->s, &lim, &rr);
  z->ncl = z->s.eg->nclasses;
  z->cost = malloc((z->ncl + 1) * sizeof *z->cost);
  z->best = malloc((z->ncl + 1) * sizeof *z->best);
  sk_greedy(&z->s, z->cost, z->best);
}

static void saturate(lowered *l, uint32_t ki, saturated *z, const char *what) { saturate_gpu(l, ki, z, what, 0); }

/* The kernel of a tile seed (sk_tile_seed's force map; greedy elsewhere); 0 when it does not
 * emit (unrolled scalar tiles past the emitter's limits). */
static int emit_seed(saturated *z, const lm_plan *p, uint32_t *force, lm_kernel *k) {
  sk_term t;
  OK(sk_extract(&z->s, z->root, z->best, force, NULL, 1.0, NULL, &t));
  lm_status st = sk_emit_kernel(&z->s, &t, t.root, &p->kernels[0], k);
  sk_term_free(&t);
  return st == LM_OK;
}

static void saturated_free(saturated *z) {
  free(z->cost);
  free(z->best);
  sk_free(&z->s);
}

/* Genomes for the genetic mode: the first POP draws are random genomes, every later one an
 * offspring of two (crossover, crossover then mutation) or one (mutation) earlier genomes. */
enum { POP = 20 };

/* Draw d of a term: d = 0 greedy; random genomes; in genetic mode, after POP, offspring. */
static lm_status draw(saturated *z, int genetic, int d, uint64_t *rng, uint32_t **pop, int *npop, sk_term *t) {
  uint32_t *g = malloc((z->ncl + 1) * sizeof *g);
  lm_status st;
  if (!genetic || d <= POP || *npop < 2) st = sk_extract(&z->s, z->root, z->best, NULL, d ? rng : NULL, 0, g, t);
  else {
    const uint32_t *a = pop[sk_rand(rng) % (uint64_t)*npop], *b = pop[sk_rand(rng) % (uint64_t)*npop];
    switch (d % 3) {
    case 0: st = sk_crossover(&z->s, z->root, z->best, a, b, rng, g, t); break;
    case 1: st = sk_mutate(&z->s, z->root, z->best, a, 1 + (int)(d % 4), rng, g, t); break;
    default: {
      uint32_t *m = malloc((z->ncl + 1) * sizeof *m);
      st = sk_crossover(&z->s, z->root, z->best, a, b, rng, m, t);
      if (st == LM_OK) {
        sk_term_free(t);
        st = sk_mutate(&z->s, z->root, z->best, m, 1, rng, g, t);
      }
      free(m);
    }
    }
  }
  if (st == LM_OK && genetic && *npop < 4 * POP) pop[(*npop)++] = g;
  else free(g);
  return st;
}

/* Every distinct candidate (by kernel text) drawn from kernel ki's saturated e-graph computes
 * what the original kernel computes (interpreter, random inputs). genetic: after POP random
 * genomes the draws are their offspring (mutation, crossover, both), and offspring of those.
 * Returns the candidates checked (offspring only in genetic mode). */
static size_t check_all_candidates_ex(lowered *l, const char *what, int genetic, int ndraws) {
  lm_plan *p = l->p;
  bufs in = bufs_new(p, 3);
  size_t checked = 0, differing = 0;
  for (uint32_t ki = 0; ki < p->nkernels; ki++) {
    saturated z;
    saturate(l, ki, &z, what);
    uint64_t rng = 99 + ki, seen[200];
    size_t nseen = 0;
    uint32_t *pop[4 * POP];
    int npop = 0;
    bufs want = bufs_new(p, 1), got = bufs_new(p, 1);
    bufs_copy(&want, &in);
    interpret(p, &p->kernels[ki], 1, &want);
    char *orig = sk_kernel_text(p, &p->kernels[ki]);
    for (int d = 0; d <= ndraws; d++) {
      sk_term t;
      if (draw(&z, genetic, d, &rng, pop, &npop, &t) != LM_OK) continue;
      lm_kernel k;
      if (sk_emit_kernel(&z.s, &t, t.root, &p->kernels[ki], &k) == LM_OK) {
        char *text = sk_kernel_text(p, &k);
        if (first_sight(seen, &nseen, LM_COUNTOF(seen), lm_hash_bytes(text, strlen(text), 0))) {
          int rounding;
          sk_term_rules(&z.s, &t, &rounding);
          bufs_copy(&got, &in);
          interpret(p, &k, 1, &got);
          char *tt = sk_term_print(&z.s, &t);
          cr_log_info("%s kernel %u: candidate %zu (%s%s) %s", what, ki, nseen, rounding ? "rounding" : "exact",
                      genetic && d > POP ? ", offspring" : "", tt);
          expect_close(p, &got, &want, !rounding, 1, what);
          lm_free(tt);
          if (!genetic || d > POP) {
            checked++;
            differing += strcmp(text, orig) != 0;
          }
        }
        lm_free(text);
        lm_kernel_free(&k);
      }
      sk_term_free(&t);
    }
    for (int i = 0; i < npop; i++) free(pop[i]);
    lm_free(orig);
    bufs_free(&want);
    bufs_free(&got);
    saturated_free(&z);
  }
  bufs_free(&in);
  cr_assert_gt(differing, 10, "%s: only %zu candidates differ from the original", what, differing);
  return checked;
}

static size_t check_all_candidates(lowered *l, const char *what) { return check_all_candidates_ex(l, what, 0, 150); }

Test(candidates, every_candidate_of_a_64_matmul_equals_the_reference, .timeout = LM_TIMEOUT(280)) {
  lowered l = lower(matmul64());
  check_all_candidates(&l, "matmul 64^3");
  lowered_free(&l);
}

/* The training graphs lumen searches: CartPole's PPO minibatch update (M = 32 rows of a 4 x 16
 * trajectory) and one rollout step (N = 8 envs), every kernel's candidates (greedy and 40 random
 * genomes each) against its original kernel. */
static int64_t *bind_syms(const lm_graph_t *g, const char *const *names, const int64_t *values, int n) {
  int64_t *v = calloc(g->x.nsyms + 1, sizeof *v);
  for (size_t i = 0; i < g->x.nsyms; i++) {
    int k = 0;
    while (k < n && strcmp(names[k], g->x.syms[i].name)) k++;
    cr_assert_lt(k, n, "symbol %s has no value", g->x.syms[i].name);
    v[i] = values[k];
  }
  return v;
}

static lm_graph_t *training_graph(int which) {
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_ppo_config cfg = lm_ppo_defaults(env);
  lm_train_graph tg[4];
  cr_assert_eq(lm_trainer_graphs(env, &cfg, tg, 4), 4, "%s", lm_last_error());
  for (int i = 0; i < 4; i++)
    if (i != which) lm_graph_free(tg[i].g);
  return tg[which].g;
}

static lm_graph_t *ppo_update(void) { return training_graph(3); }

static const char *const ppo_names[] = {"N", "T", "M", "perm_a", "perm_b", "mb_off"};
static const int64_t ppo_values[] = {4, 16, 32, 5, 3, 16}; /* rows (5*(16 + i) + 3) mod 64: shuffled, wrapping */

static void check_training_graph(int which, const char *const *names, const int64_t *values, int n, const char *what) {
  lowered l = lower(training_graph(which));
  int64_t *v = bind_syms(l.g, names, values, n);
  test_syms = v;
  size_t checked = check_all_candidates_ex(&l, what, 0, 40);
  cr_log_info("%s: %zu kernels, %zu candidates checked", what, l.p->nkernels, checked);
  cr_assert_gt(checked, l.p->nkernels, "%s: %zu candidates for %zu kernels", what, checked, l.p->nkernels);
  test_syms = NULL;
  free(v);
  lowered_free(&l);
}

Test(candidates, every_candidate_of_the_ppo_update_equals_the_reference, .timeout = LM_TIMEOUT(280)) {
  check_training_graph(3, ppo_names, ppo_values, 6, "ppo update");
}

Test(candidates, every_candidate_of_the_rollout_step_equals_the_reference, .timeout = LM_TIMEOUT(280)) {
  const char *names[] = {"N"};
  const int64_t values[] = {8};
  check_training_graph(0, names, values, 1, "rollout step");
}

/* The interpreter runs work-group schedules in lockstep (compiler/search/interp.c): the plans of
 * a matmul (16x16 shared-memory tiles, barriers) and of long row sums and maxima (trees in shared
 * memory ending in warp shuffles) under compiler/gpu.c's schedules compute what their plain
 * kernels compute: the tiles bit for bit, the trees' sums within rounding and their maxima
 * exactly. So GPU-shaped candidates have a reference on the cpu too. */
Test(interpreter, work_group_schedules_run_in_lockstep_and_match_the_plain_kernels, .timeout = LM_TIMEOUT(120)) {
  for (int which = 0; which < 2; which++) {
    lm_graph_t *g = lm_graph_new();
    if (which == 0) {
      lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){40, 37});
      lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){37, 50});
      cr_assert_eq(lm_output(lm_matmul(a, b), "c"), LM_OK);
    } else {
      lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){5, 1500});
      cr_assert_eq(lm_output(lm_sum_reduce(x, 1), "s"), LM_OK);
      cr_assert_eq(lm_output(lm_max_reduce(x, 1), "m"), LM_OK);
    }
    lowered l = lower(g);
    lm_gpu_options go;
    lm_gpu_options_default(&go, 48 * 1024);
    go.warp = 32;
    size_t nk = l.p->nkernels;
    lm_kernel *plain = calloc(nk + 1, sizeof *plain);
    for (size_t i = 0; i < nk; i++) OK(sk_kernel_copy(&l.p->kernels[i], &plain[i]));
    int changed = lm_schedule_gpu(l.p, &go);
    cr_assert_geq(changed, 1, "gpu.c scheduled none of the %zu kernels", nk);
    int grouped = 0;
    for (size_t i = 0; i < nk; i++) grouped += l.p->kernels[i].group > 0;
    cr_assert_geq(grouped, 1);
    bufs in = bufs_new(l.p, 11), want = bufs_new(l.p, 1), got = bufs_new(l.p, 1);
    bufs_copy(&want, &in);
    bufs_copy(&got, &in);
    interpret(l.p, plain, nk, &want);
    interpret(l.p, l.p->kernels, nk, &got);
    expect_close(l.p, &got, &want, which == 0, 0, which == 0 ? "tiled matmul" : "tree reductions");
    if (which == 1) /* maxima: exact whatever the order */
      for (size_t i = 0; i < want.n; i++)
        if (result_buf(l.p, i) && l.p->bufs[i].kind == LM_BUF_OUTPUT && l.p->bufs[i].index == 1)
          for (size_t j = 0; j < want.count[i]; j++) cr_assert_eq(got.b[i][j], want.b[i][j], "max row %zu", j);
    for (size_t i = 0; i < nk; i++) lm_kernel_free(&plain[i]);
    free(plain);
    bufs_free(&in), bufs_free(&want), bufs_free(&got);
    lowered_free(&l);
  }
}

/* What a device search hands to the backend's module_build (compiler/search/search.c with a
 * lm_search_device): the candidates of a 64^3 matmul and of a softmax, drawn as a device search
 * draws them (the group and stage rules on, genomes preferring work-group loops), each also under
 * the work-group schedules of compiler/gpu.c, rendered in CUDA and in OpenCL C. Every one
 * renders and computes what the original kernel computes (the interpreter runs work-groups in
 * lockstep); some are mapped to work-groups, some copy loads into shared memory; the CUDA
 * translation unit of them all compiles with NVRTC for sm_90 and the OpenCL one builds on the
 * OpenCL device, each where present (the cuda backend's search cannot run here: no GPU). */
Test(candidates, device_search_candidates_render_and_build_for_cuda_and_opencl, .timeout = LM_TIMEOUT(280)) {
  lm_graph_t *(*makers[])(void) = {matmul64, softmax};
  lm_sb cu = {0}, cl = {0};
  char *pre = lm_render_prelude(LM_DIALECT_CUDA), *pre_cl = lm_render_prelude(LM_DIALECT_OPENCL);
  lm_sb_puts(&cu, pre);
  lm_sb_puts(&cl, pre_cl);
  lm_free(pre);
  lm_free(pre_cl);
  int grouped = 0, staged = 0, scheduled = 0, n = 0;
  lm_gpu_options go;
  lm_gpu_options_default(&go, 48 * 1024);
  go.warp = 32;
  for (size_t m = 0; m < LM_COUNTOF(makers); m++) {
    lowered l = lower(makers[m]());
    bufs in = bufs_new(l.p, 5), want = bufs_new(l.p, 1), got = bufs_new(l.p, 1);
    for (uint32_t ki = 0; ki < l.p->nkernels; ki++) {
      saturated z;
      saturate_gpu(&l, ki, &z, "device candidates", 1);
      bufs_copy(&want, &in);
      interpret(l.p, &l.p->kernels[ki], 1, &want);
      uint64_t rng = 7 + ki, seen[256];
      size_t nseen = 0;
      /* staged work-group loops, each forced once under a parallel loop (greedy elsewhere): random
       * draws rarely put one innermost in the parallel domain with a reduction inside */
      uint32_t staged_nodes[16], *force = malloc((z.ncl + 1) * sizeof *force);
      int nstaged = 0;
      for (size_t c = 0; c < z.ncl && nstaged < 16; c++) {
        const lm_eg_vec *v = &z.s.eg->cnodes[c];
        for (uint32_t q = 0; q < v->n && nstaged < 16; q++) {
          const lm_enode *e = lm_eg_node(z.s.eg, v->v[q]);
          if (e->op == SK_LOOP && sk_loop_of(&z.s, e->attr)->kind == SK_GROUP_STAGED) staged_nodes[nstaged++] = v->v[q];
        }
      }
      for (int d = 0; d < 50 + nstaged; d++) { /* greedy and random, preferring work-groups, forced staging */
        sk_term t;
        lm_status st;
        if (d < 25) st = sk_extract(&z.s, z.root, z.best, NULL, d ? &rng : NULL, 0, NULL, &t);
        else if (d < 50) st = sk_extract_preferring(&z.s, z.root, z.best, &rng, SK_GROUP, NULL, &t);
        else {
          for (size_t c = 0; c < z.ncl; c++) force[c] = LM_EG_NONE;
          uint32_t e = staged_nodes[d - 50], ce = lm_eg_find(z.s.eg, z.s.eg->node_cls[e]);
          force[ce] = e;
          for (size_t c = 0; c < z.ncl; c++) { /* and a parallel loop around it */
            const lm_eg_vec *v = &z.s.eg->cnodes[c];
            for (uint32_t q = 0; q < v->n && force[c] == LM_EG_NONE; q++) {
              const lm_enode *pe = lm_eg_node(z.s.eg, v->v[q]);
              if (pe->op == SK_LOOP && sk_loop_of(&z.s, pe->attr)->kind == SK_PAR && lm_eg_find(z.s.eg, pe->c[0]) == ce)
                force[c] = v->v[q];
            }
          }
          st = sk_extract(&z.s, z.root, z.best, force, NULL, 1.0, NULL, &t);
        }
        if (st != LM_OK) continue;
        lm_kernel k[2];
        int nk = 0;
        if (sk_emit_kernel(&z.s, &t, t.root, &l.p->kernels[ki], &k[0]) == LM_OK) {
          nk = 1;
          lm_plan one = *l.p; /* its work-group schedule, on a copy of the buffers' liveness */
          lm_pbuf *pb = malloc((l.p->nbufs + 1) * sizeof *pb);
          memcpy(pb, l.p->bufs, l.p->nbufs * sizeof *pb);
          one.bufs = pb, one.copies = NULL, one.ncopies = 0;
          OK(sk_kernel_copy(&k[0], &k[1]));
          one.kernels = &k[1], one.nkernels = one.kernelcap = 1;
          if (!k[1].group && lm_schedule_gpu(&one, &go) > 0) nk = 2, scheduled++;
          else lm_kernel_free(&k[1]);
          free(pb);
        }
        for (int i = 0; i < nk; i++) {
          snprintf(k[i].name, sizeof k[i].name, "c%d", n);
          char *src = lm_render_kernel(l.p, &k[i], LM_DIALECT_CUDA);
          cr_assert(src, "a candidate does not render in CUDA: %s", lm_last_error());
          uint64_t h = lm_hash_bytes(src + strlen(k[i].name), strlen(src) - strlen(k[i].name), 0);
          if (first_sight(seen, &nseen, LM_COUNTOF(seen), h)) {
            int rounding;
            sk_term_rules(&z.s, &t, &rounding);
            bufs_copy(&got, &in);
            interpret(l.p, &k[i], 1, &got);
            expect_close(l.p, &got, &want, !rounding && i == 0, 1, "a device candidate");
            for (size_t q = 0; q < k[i].nstmts && i == 0; q++)
              if (k[i].stmts[q].op == LM_S_BARRIER) {
                staged++;
                break;
              }
            char *src_cl = lm_render_kernel(l.p, &k[i], LM_DIALECT_OPENCL);
            cr_assert(src_cl, "a candidate does not render in OpenCL C: %s", lm_last_error());
            lm_sb_puts(&cu, "\n"), lm_sb_puts(&cu, src);
            lm_sb_puts(&cl, "\n"), lm_sb_puts(&cl, src_cl);
            lm_free(src_cl);
            grouped += k[i].group > 0 && i == 0;
            n++;
          }
          lm_free(src);
          lm_kernel_free(&k[i]);
        }
        sk_term_free(&t);
      }
      free(force);
      saturated_free(&z);
    }
    bufs_free(&in), bufs_free(&want), bufs_free(&got);
    lowered_free(&l);
  }
  cr_log_info("%d distinct device candidates, %d mapped to work-groups by the group rule (%d staging loads in shared "
              "memory), %d under gpu.c's schedules",
              n, grouped, staged, scheduled);
  cr_assert_geq(n, 30);
  cr_assert_geq(grouped, 1, "the group rule mapped no candidate to work-groups");
  cr_assert_geq(staged, 1, "the stage rule copied no load into shared memory");
  cr_assert_geq(scheduled, 1);
  lm_nvrtc *nv = NULL;
  if (lm_nvrtc_open(&nv) == LM_OK) {
    lm_cubin c = {0};
    lm_status st = lm_nvrtc_compile(nv, cu.s, "search-candidates.cu", "sm_90", &c);
    cr_assert_eq(st, LM_OK, "NVRTC: %s", lm_last_error());
    lm_cubin_free(&c);
    lm_nvrtc_close(nv);
  } else
    cr_log_info("no NVRTC: the CUDA translation unit was rendered, not compiled (%s)", lm_last_error());
  char desc[256] = "";
  lm_status st = lm_opencl_build_check(cl.s, "search-candidates.cl", desc, sizeof desc);
  if (st == LM_ERR_UNSUPPORTED) cr_log_info("no OpenCL device: the OpenCL C was rendered, not built");
  else cr_assert_eq(st, LM_OK, "OpenCL: %s", lm_last_error());
  lm_sb_free(&cu);
  lm_sb_free(&cl);
}

Test(candidates, every_candidate_of_a_softmax_equals_the_reference, .timeout = LM_TIMEOUT(280)) {
  lowered l = lower(softmax());
  check_all_candidates(&l, "softmax");
  lowered_free(&l);
}

Test(candidates, every_candidate_of_an_adam_update_equals_the_reference, .timeout = LM_TIMEOUT(280)) {
  lowered l = lower(adam());
  check_all_candidates(&l, "adam");
  lowered_free(&l);
}

Test(candidates, offspring_of_mutation_and_crossover_equal_the_reference, .timeout = LM_TIMEOUT(280)) {
  lm_graph_t *(*makers[])(void) = {matmul64, adam};
  const char *names[] = {"matmul 64^3 offspring", "adam offspring"};
  for (int i = 0; i < 2; i++) {
    lowered l = lower(makers[i]());
    size_t n = check_all_candidates_ex(&l, names[i], 1, POP + 60);
    cr_log_info("%s: %zu distinct offspring checked", names[i], n);
    cr_assert_gt(n, 10, "%s: only %zu distinct offspring", names[i], n);
    lowered_free(&l);
  }
}

/* ---------------------------------------------------------------- genetic operators */

/* NG random genomes of kernel 0 (each a successful extraction). */
enum { NG = 40 };
static void random_genomes(saturated *z, uint64_t *rng, uint32_t **g) {
  for (int i = 0; i < NG; i++) {
    g[i] = malloc((z->ncl + 1) * sizeof *g[i]);
    sk_term t;
    int tries = 0;
    while (sk_extract(&z->s, z->root, z->best, NULL, rng, 0, g[i], &t) != LM_OK) cr_assert_lt(++tries, 100);
    sk_term_free(&t);
  }
}

Test(genetic, crossover_takes_every_choice_from_a_parent_or_the_greedy_repair) {
  lowered l = lower(matmul64());
  saturated z;
  saturate(&l, 0, &z, "matmul 64^3");
  uint64_t rng = 5;
  uint32_t *g[NG], *child = malloc((z.ncl + 1) * sizeof *child);
  random_genomes(&z, &rng, g);
  int trials = 0, mixed = 0, differ = 0;
  for (int i = 0; i < NG; i++) { /* parents i and i+7, then a genome with itself */
    const uint32_t *a = g[i], *b = g[(i + 7) % NG];
    sk_term t;
    lm_status st = sk_crossover(&z.s, z.root, z.best, a, b, &rng, child, &t);
    cr_assert(st == LM_OK || st == LM_ERR_INVALID, "crossover %d: %s", i, lm_status_name(st));
    if (st != LM_OK) continue;
    trials++;
    int from_a = 0, from_b = 0, reached = 0;
    for (size_t c = 0; c < z.ncl; c++) {
      if (child[c] == LM_EG_NONE) continue;
      reached++;
      cr_assert(child[c] == a[c] || child[c] == b[c] || child[c] == z.best[c],
                "crossover %d: class %zu takes node %u; the parents have %u and %u, the greedy choice %u", i, c,
                child[c], a[c], b[c], z.best[c]);
      if (a[c] != b[c]) from_a |= child[c] == a[c], from_b |= child[c] == b[c];
    }
    cr_assert_gt(reached, 0);
    mixed += from_a && from_b;
    /* the child's own choices reproduce its term */
    sk_term t2;
    OK(sk_extract(&z.s, z.root, z.best, child, NULL, 0, NULL, &t2));
    char *x = sk_term_print(&z.s, &t), *y = sk_term_print(&z.s, &t2);
    cr_assert_str_eq(x, y, "crossover %d: the child genome gives another term", i);
    /* a child that took choices from both parents is neither parent */
    sk_term ta, tb;
    OK(sk_extract(&z.s, z.root, z.best, a, NULL, 0, NULL, &ta));
    OK(sk_extract(&z.s, z.root, z.best, b, NULL, 0, NULL, &tb));
    char *xa = sk_term_print(&z.s, &ta), *xb = sk_term_print(&z.s, &tb);
    differ += strcmp(x, xa) && strcmp(x, xb);
    lm_free(x);
    lm_free(y);
    lm_free(xa);
    lm_free(xb);
    sk_term_free(&t);
    sk_term_free(&t2);
    sk_term_free(&ta);
    sk_term_free(&tb);
    /* a genome crossed with itself is itself */
    OK(sk_crossover(&z.s, z.root, z.best, a, a, &rng, child, &t));
    OK(sk_extract(&z.s, z.root, z.best, a, NULL, 0, NULL, &ta));
    x = sk_term_print(&z.s, &t);
    xa = sk_term_print(&z.s, &ta);
    cr_assert_str_eq(x, xa, "crossover %d: a genome crossed with itself gives another term", i);
    lm_free(x);
    lm_free(xa);
    sk_term_free(&t);
    sk_term_free(&ta);
  }
  /* Random genomes share few classes below their first differing choice (a split and a merge
   * of the same loops reach different classes), so per-class crossover mixes them where they
   * share classes and are different there: a minority of pairs, but never none. */
  cr_log_info("crossover: %d of %d children took choices from both parents, %d are neither parent", mixed, trials,
              differ);
  cr_assert_gt(trials, NG / 2, "only %d crossovers gave a term", trials);
  cr_assert_geq(mixed, 2, "only %d of %d children took choices from both parents", mixed, trials);
  cr_assert_geq(differ, 2, "only %d of %d children differ from both parents", differ, trials);
  for (int i = 0; i < NG; i++) free(g[i]);
  free(child);
  saturated_free(&z);
  lowered_free(&l);
}

/* Register-tile seeds (sk_tile_seed): the tiles the `tile` rule built, assembled on purpose.
 * Seed 0 of a 64^3 matmul is a merged 4x16 tile with its sums in a 64-float local array (the
 * form the C compiler keeps in vector registers); every seed's term takes every forced loop it
 * reaches, has a joint reduction, and computes what the original kernel computes. */
Test(genetic, tile_seeds_assemble_register_tiles_that_equal_the_reference) {
  lowered l = lower(matmul64());
  lm_plan *p = l.p;
  saturated z;
  saturate(&l, 0, &z, "matmul 64^3");
  int nr, tile = -1, joint = -1;
  const lm_rule *rules = sk_rules(&nr);
  for (int r = 0; r < nr; r++) {
    if (!strcmp(rules[r].name, "tile")) tile = r;
    if (!strcmp(rules[r].name, "red-joint")) joint = r;
  }
  cr_assert(tile >= 0 && joint >= 0);
  bufs in = bufs_new(p, 3), want = bufs_new(p, 1), got = bufs_new(p, 1);
  bufs_copy(&want, &in);
  interpret(p, &p->kernels[0], 1, &want);
  uint32_t *force = malloc((z.ncl + 1) * sizeof *force), *g = malloc((z.ncl + 1) * sizeof *g);
  int n = 0, arrays = 0, emitted = 0, ragged = 0;
  for (; n < 64 && sk_tile_seed(&z.s, n, force); n++) {
    size_t forced = 0;
    for (size_t c = 0; c < z.ncl; c++) forced += force[c] != LM_EG_NONE;
    cr_assert_geq(forced, 4, "seed %d forces %zu classes: the tile's loops and its reduction", n, forced);
    sk_term t;
    OK(sk_extract(&z.s, z.root, z.best, force, NULL, 1.0, g, &t));
    for (size_t c = 0; c < z.ncl; c++)
      cr_assert(force[c] == LM_EG_NONE || g[c] == LM_EG_NONE || g[c] == force[c],
                "seed %d: class %zu took node %u, not the forced %u", n, c, g[c], force[c]);
    int rounding = 0;
    uint64_t used = sk_term_rules(&z.s, &t, &rounding);
    /* a node is credited to the rule that made it first: split, swap and unroll make some tiles too */
    cr_assert(n > 0 || (used >> tile & 1), "seed 0: the term does not use the tile rule");
    cr_assert(used >> joint & 1, "seed %d: the term has no joint reduction", n);
    cr_assert(!rounding, "seed %d: a tile sums in the original order", n);
    lm_kernel k;
    lm_status st = sk_emit_kernel(&z.s, &t, t.root, &p->kernels[0], &k);
    cr_assert(st == LM_OK || (n > 0 && st == LM_ERR_INVALID), "seed %d: %s", n, lm_last_error());
    if (st != LM_OK) { /* unrolled scalar tiles past the emitter's limits: not schedulable */
      cr_log_info("seed %d: %s", n, z.s.why);
      sk_term_free(&t);
      continue;
    }
    emitted++;
    if (n == 0) { /* a column panel: 16 columns a thread's iteration, its row tiles in order inside
                   * (a ragged 6x16 one peeled: the full tiles, then the last with its own sums) */
      cr_assert(k.nlocals == 1 || (k.nlocals == 2 && k.locals[1] == k.locals[0]), "seed 0: %zu local arrays",
                k.nlocals);
      cr_assert(k.locals[0] == 64 || k.locals[0] == 96, "seed 0: the sums of a 4x16 or 6x16 tile in one array, not %lld",
                (long long)k.locals[0]);
      cr_assert_eq(k.npar, 1, "seed 0: the panels as the parallel loop, not %d loops (loop 0 of %lld)", k.npar, (long long)lm_x_eval(&p->g->x, k.loops[0].extent, NULL, NULL));
      cr_assert_eq(lm_x_eval(&p->g->x, k.loops[0].extent, NULL, NULL), 4, "seed 0: 4 panels of 16 columns, not %lld (l0[%lld])", (long long)lm_x_eval(&p->g->x, k.loops[0].extent, NULL, NULL), (long long)k.locals[0]);
    }
    if (k.nlocals >= 1 && k.locals[0] == 96) { /* 6 rows in 64: the last row tile is ragged */
      int guarded = 0;
      for (size_t i = 0; i < k.nstmts; i++)
        guarded += k.stmts[i].op == LM_S_STORE && !k.stmts[i].local && !lm_x_is_const(&p->g->x, k.stmts[i].valid, 1);
      cr_assert_gt(guarded, 0, "seed %d: a 6-row tile of 64 rows stores only the rows that exist", n);
      ragged++;
    }
    arrays += k.nlocals > 0;
    bufs_copy(&got, &in);
    interpret(p, &k, 1, &got);
    expect_close(p, &got, &want, 1, 1, "tile seed");
    lm_kernel_free(&k);
    sk_term_free(&t);
  }
  cr_log_info("matmul 64^3: %d tile seeds, %d emitted, %d with array accumulators, %d ragged 6x16", n, emitted, arrays,
              ragged);
  cr_assert_geq(ragged, 1, "no ragged 6x16 tile among the seeds");
  cr_assert_geq(emitted, 8, "only %d of %d tile seeds emitted (tiles 6x16, 4x16, 4x8, 2x16, 8x8, 2x32; nested or merged)",
                emitted, n);
  cr_assert_geq(arrays, 4, "only %d seeds keep their sums in an array", arrays);
  cr_assert_eq(sk_tile_seed(&z.s, 100000, force), 0);
  cr_assert_eq(sk_tile_seed(&z.s, -1, force), 0);
  free(force);
  free(g);
  bufs_free(&in);
  bufs_free(&want);
  bufs_free(&got);
  saturated_free(&z);
  lowered_free(&l);
}

/* Is loop a the loop l or one around it? */
static int loop_encloses(const lm_kernel *k, int32_t a, int32_t l) {
  for (; l >= 0; l = k->loops[l].parent)
    if (l == a) return 1;
  return 0;
}

/* Tiles over a symbolic batch (the PPO update's hidden layers: M x 64 times 64 x 64): the rows of
 * extent M are always taken as ragged. A serial loop over the row tiles is peeled (emit.c): M / 6
 * full tiles with plain indices and unguarded stores, then (M % 6 + 5) / 6 tail tiles that read
 * the last row again and guard every store. Each seed, and its packed form, computes what the
 * original kernel does for a batch of 50 rows (8 full tiles and a tail), 48 (no tail) and 5 (no
 * full tile). */
Test(genetic, tiles_over_a_symbolic_batch_are_peeled_and_equal_the_reference_for_any_batch) {
  lm_graph_t *g0 = lm_graph_new();
  lm_dim M = lm_sym(g0, "M");
  lm_tensor xx = lm_input(g0, "x", LM_ROLE_DATA, 2, (lm_dim[]){M, 64});
  lm_tensor w = lm_input(g0, "w", LM_ROLE_DATA, 2, (lm_dim[]){64, 64});
  cr_assert_eq(lm_output(lm_tanh(lm_matmul(xx, w)), "y"), LM_OK);
  lowered l = lower(g0);
  lm_plan *p = l.p;
  saturated z;
  saturate(&l, 0, &z, "x W over a batch");
  static const char *const names[] = {"M"};
  static const int64_t batches[] = {50, 48, 5};
  uint32_t *force = malloc((z.ncl + 1) * sizeof *force);
  int n = 0, emitted = 0, peeled = 0, packed = 0;
  for (; n < 12 && sk_tile_seed(&z.s, n, force); n++) {
    lm_kernel k;
    if (!emit_seed(&z, p, force, &k)) continue;
    emitted++;
    /* the peeled pair: two serial loops of the same parent, M / 6 and (M % 6 + 5) / 6 iterations */
    int32_t full = -1, tail = -1;
    int64_t at50[2] = {0, 0}, at48[2] = {0, 0};
    for (size_t a = 0; a < k.nloops && tail < 0; a++)
      for (size_t b = a + 1; b < k.nloops && tail < 0; b++) {
        if (k.loops[a].kind != LM_L_SERIAL || k.loops[b].kind != LM_L_SERIAL || k.loops[a].parent != k.loops[b].parent)
          continue;
        int64_t s50[1] = {50}, s48[1] = {48};
        at50[0] = lm_x_eval(&p->g->x, k.loops[a].extent, NULL, s50), at50[1] = lm_x_eval(&p->g->x, k.loops[b].extent, NULL, s50);
        at48[0] = lm_x_eval(&p->g->x, k.loops[a].extent, NULL, s48), at48[1] = lm_x_eval(&p->g->x, k.loops[b].extent, NULL, s48);
        if ((at50[0] == 8 && at50[1] == 1 && at48[0] == 8 && at48[1] == 0) ||
            (at50[0] == 12 && at50[1] == 1 && at48[0] == 12 && at48[1] == 0))
          full = (int32_t)a, tail = (int32_t)b;
      }
    if (tail >= 0) {
      peeled++;
      int guarded_full = 0, guarded_tail = 0;
      for (size_t i = 0; i < k.nstmts; i++) {
        const lm_stmt *q = &k.stmts[i];
        if (q->op != LM_S_STORE || q->local || lm_x_is_const(&p->g->x, q->valid, 1)) continue;
        guarded_full += loop_encloses(&k, full, q->loop);
        guarded_tail += loop_encloses(&k, tail, q->loop);
      }
      cr_assert_eq(guarded_full, 0, "seed %d: the full row tiles guard %d stores", n, guarded_full);
      cr_assert_gt(guarded_tail, 0, "seed %d: the tail row tile stores only the rows that exist", n);
    }
    /* packing copies a panel before a serial loop of symbolic extent too (it may run once) */
    lm_kernel pk;
    OK(sk_kernel_copy(&k, &pk));
    int r = sk_pack_kernel(p, &pk);
    cr_assert_geq(r, 0);
    packed += r > 0;
    for (size_t b = 0; b < LM_COUNTOF(batches); b++) {
      int64_t *v = bind_syms(l.g, names, &batches[b], 1);
      test_syms = v;
      bufs in = bufs_new(p, 7), want = bufs_new(p, 1), got = bufs_new(p, 1), gotp = bufs_new(p, 1);
      bufs_copy(&want, &in);
      bufs_copy(&got, &in);
      bufs_copy(&gotp, &in);
      interpret(p, &p->kernels[0], 1, &want);
      interpret(p, &k, 1, &got);
      interpret(p, &pk, 1, &gotp);
      char what[64];
      snprintf(what, sizeof what, "seed %d, a batch of %lld", n, (long long)batches[b]);
      expect_close(p, &got, &want, 1, 1, what);
      snprintf(what, sizeof what, "seed %d packed, a batch of %lld", n, (long long)batches[b]);
      expect_close(p, &gotp, &want, 1, 1, what);
      bufs_free(&in);
      bufs_free(&want);
      bufs_free(&got);
      bufs_free(&gotp);
      test_syms = NULL;
      free(v);
    }
    lm_kernel_free(&pk);
    lm_kernel_free(&k);
  }
  cr_log_info("x W over a batch: %d tile seeds, %d emitted, %d peeled, %d packed", n, emitted, peeled, packed);
  cr_assert_geq(emitted, 4, "only %d of %d tile seeds over a symbolic batch emitted", emitted, n);
  cr_assert_geq(peeled, 1, "no seed peels its ragged row tiles");
  cr_assert_geq(packed, 1, "no seed over a symbolic batch packs W's panel");
  free(force);
  saturated_free(&z);
  lowered_free(&l);
}

/* Laned sums over a symbolic batch (red-lanes; the PPO update's entropy and clipped-loss sums
 * over M rows): f partial sums over the M / f full groups, then the last M % f terms into lanes
 * 0.., then the lanes summed. Every laned candidate drawn agrees with the reference (within
 * rounding: the order of the sum changes) for 50, 48 and 5 rows, and one has the tail loop. */
Test(genetic, laned_sums_over_a_symbolic_batch_add_the_last_terms_after_the_full_groups) {
  lm_graph_t *g0 = lm_graph_new();
  lm_dim M = lm_sym(g0, "M");
  lm_tensor xx = lm_input(g0, "x", LM_ROLE_DATA, 2, (lm_dim[]){M, 2});
  cr_assert_eq(lm_output(lm_sum(lm_mul(xx, lm_exp(xx)), 0, 0), "s"), LM_OK);
  lowered l = lower(g0);
  lm_plan *p = l.p;
  saturated z;
  saturate(&l, 0, &z, "sum over a batch");
  int nr, lanes = -1;
  const lm_rule *rules = sk_rules(&nr);
  for (int r = 0; r < nr; r++)
    if (!strcmp(rules[r].name, "red-lanes")) lanes = r;
  cr_assert(lanes >= 0);
  static const char *const names[] = {"M"};
  static const int64_t batches[] = {50, 48, 5};
  uint64_t rng = 5;
  int laned = 0, tails = 0;
  for (int d = 0; d < 200 && laned < 12; d++) {
    sk_term t;
    if (sk_extract(&z.s, z.root, z.best, NULL, &rng, 0, NULL, &t) != LM_OK) continue;
    int rounding = 0;
    uint64_t used = sk_term_rules(&z.s, &t, &rounding);
    lm_kernel k;
    lm_status st = (used >> lanes & 1) ? sk_emit_kernel(&z.s, &t, t.root, &p->kernels[0], &k) : LM_ERR_INVALID;
    sk_term_free(&t);
    if (st != LM_OK) continue;
    laned++;
    for (size_t a = 0; a < k.nloops; a++) { /* M % f iterations: 2 of 50 and 0 of 48 for f = 4 or 8 or 16 */
      int64_t s50[1] = {50}, s48[1] = {48};
      int64_t e50 = lm_x_eval(&p->g->x, k.loops[a].extent, NULL, s50), e48 = lm_x_eval(&p->g->x, k.loops[a].extent, NULL, s48);
      tails += e50 == 2 && e48 == 0;
    }
    for (size_t b = 0; b < LM_COUNTOF(batches); b++) {
      int64_t *v = bind_syms(l.g, names, &batches[b], 1);
      test_syms = v;
      bufs in = bufs_new(p, 3), want = bufs_new(p, 1), got = bufs_new(p, 1);
      bufs_copy(&want, &in);
      bufs_copy(&got, &in);
      interpret(p, &p->kernels[0], 1, &want);
      interpret(p, &k, 1, &got);
      char what[64];
      snprintf(what, sizeof what, "laned candidate %d, a batch of %lld", laned, (long long)batches[b]);
      expect_close(p, &got, &want, 0, 0, what);
      bufs_free(&in);
      bufs_free(&want);
      bufs_free(&got);
      test_syms = NULL;
      free(v);
    }
    lm_kernel_free(&k);
  }
  cr_log_info("sum over a batch: %d laned candidates, %d tail loops", laned, tails);
  cr_assert_geq(laned, 3, "only %d laned candidates of a sum over a symbolic batch", laned);
  cr_assert_geq(tails, 1, "no laned candidate adds the last M %% f terms in a loop of its own");
  saturated_free(&z);
  lowered_free(&l);
}

/* Packing (pack.c): a matmul's column panels (tile seeds whose column tiles are the parallel
 * loop and whose row tiles run in order inside) get B's panel copied once per panel into a
 * 64 x 16 local array that the tile's loads read; every seed, packed or not, and every
 * candidate of an Adam update (which reads and writes the same buffers: nothing there is packed
 * that is written) computes bitwise what the unpacked kernel computes. */
Test(genetic, packing_copies_a_read_only_panel_once_and_changes_no_bit) {
  lowered l = lower(matmul64());
  lm_plan *p = l.p;
  saturated z;
  saturate(&l, 0, &z, "matmul 64^3");
  bufs in = bufs_new(p, 3), want = bufs_new(p, 1), got = bufs_new(p, 1);
  uint32_t *force = malloc((z.ncl + 1) * sizeof *force);
  int packed = 0, panels = 0;
  for (int n = 0; n < 64 && sk_tile_seed(&z.s, n, force); n++) {
    lm_kernel k, pk;
    if (!emit_seed(&z, p, force, &k)) continue;
    OK(sk_kernel_copy(&k, &pk));
    int r = sk_pack_kernel(p, &pk);
    cr_assert_geq(r, 0);
    if (r > 0) {
      packed++;
      cr_assert_eq(pk.nlocals, k.nlocals + (size_t)r, "seed %d: one local array per packed operand", n);
      int panel = 0;
      for (size_t a = k.nlocals; a < pk.nlocals; a++) panel |= pk.locals[a] == 64 * 16;
      panels += panel;
      size_t global = 0, global_packed = 0; /* loads of the inputs: the copy's instead of the tile's */
      for (size_t i = 0; i < k.nstmts; i++) global += k.stmts[i].op == LM_S_LOAD && !k.stmts[i].local;
      for (size_t i = 0; i < pk.nstmts; i++) global_packed += pk.stmts[i].op == LM_S_LOAD && !pk.stmts[i].local;
      cr_assert_eq(global_packed, global, "seed %d: each packed load is replaced by its copy's load", n);
      expect_same_kernels(p, &k, &pk, &in, &want, &got, "a packed tile");
    }
    lm_kernel_free(&pk);
    lm_kernel_free(&k);
  }
  cr_log_info("matmul 64^3: %d tile seeds packed, %d with a 64 x 16 panel of B", packed, panels);
  cr_assert_geq(panels, 1, "no seed had B's panel packed");
  free(force);
  bufs_free(&in), bufs_free(&want), bufs_free(&got);
  saturated_free(&z);
  lowered_free(&l);

  lowered a = lower(adam());
  int tried = 0;
  for (uint32_t ki = 0; ki < a.p->nkernels; ki++) {
    saturated za;
    saturate(&a, ki, &za, "adam");
    bufs ina = bufs_new(a.p, 4), wa = bufs_new(a.p, 1), ga = bufs_new(a.p, 1);
    uint64_t rng = 3 + ki;
    for (int d = 0; d < 40; d++) {
      sk_term t;
      if (sk_extract(&za.s, za.root, za.best, NULL, d ? &rng : NULL, 0, NULL, &t) != LM_OK) continue;
      lm_kernel k, pk;
      if (sk_emit_kernel(&za.s, &t, t.root, &a.p->kernels[ki], &k) == LM_OK) {
        OK(sk_kernel_copy(&k, &pk));
        cr_assert_geq(sk_pack_kernel(a.p, &pk), 0);
        expect_same_kernels(a.p, &k, &pk, &ina, &wa, &ga, "an adam candidate, packed");
        tried++;
        lm_kernel_free(&pk);
        lm_kernel_free(&k);
      }
      sk_term_free(&t);
    }
    bufs_free(&ina), bufs_free(&wa), bufs_free(&ga);
    saturated_free(&za);
  }
  cr_assert_gt(tried, 10);
  lowered_free(&a);
}

Test(genetic, vector_variants_of_tile_seeds_mark_the_column_loops_and_compute_the_same) {
  lowered l = lower(matmul64());
  lm_plan *p = l.p;
  saturated z;
  saturate(&l, 0, &z, "matmul 64^3");
  bufs in = bufs_new(p, 5), want = bufs_new(p, 1), got = bufs_new(p, 1);
  uint32_t *force = malloc((z.ncl + 1) * sizeof *force);
  int vectors = 0, seeds = 0;
  for (int n = 0; n < 64 && sk_tile_seed(&z.s, n, force); n++) {
    lm_kernel k, vk;
    if (!emit_seed(&z, p, force, &k)) continue;
    seeds++;
    OK(sk_kernel_copy(&k, &vk));
    int r = sk_vec_kernel(p, &vk);
    cr_assert_geq(r, 0);
    cr_assert_eq(vk.contract, r > 0, "seed %d: FMAs exactly when a loop went vector", n);
    int marked = 0;
    for (size_t i = 0; i < vk.nloops; i++) {
      marked += vk.loops[i].kind == LM_L_VECTOR;
      cr_assert(vk.loops[i].kind == LM_L_VECTOR || vk.loops[i].kind == k.loops[i].kind, "seed %d: only kinds change", n);
    }
    cr_assert_eq(marked, r);
    if (r > 0) {
      vectors++;
      char *src = lm_render_kernel(p, &vk, LM_DIALECT_C);
      cr_assert(src && strstr(src, "lm_v8") && strstr(src, "LM_CONTRACT"), "seed %d: %s", n, src ? src : lm_last_error());
      free(src);
      /* the interpreter runs a vec loop as the serial loop it was */
      expect_same_kernels(p, &k, &vk, &in, &want, &got, "a tile seed in vector form");
    }
    cr_assert_eq(sk_vec_kernel(p, &vk), 0, "seed %d: a second pass finds nothing left", n);
    lm_kernel_free(&vk);
    lm_kernel_free(&k);
  }
  cr_log_info("matmul 64^3: %d of %d tile seeds have vector loops", vectors, seeds);
  cr_assert_geq(vectors, seeds / 2, "only %d of %d seeds went vector", vectors, seeds);
  free(force);
  bufs_free(&in), bufs_free(&want), bufs_free(&got);
  saturated_free(&z);
  lowered_free(&l);
}

/* par p < 2: for r < 4: for k < 256: out[1024 p + 256 r + k] = in[256 p + k] (in's row is the
 * same for every r: packed once per p), or a variant packing must leave alone. */
static int pack_case(int kind) {
  lm_graph_t *g = lm_graph_new();
  lm_plan p = {.g = g};
  lm_exprs *x = &g->x;
  lm_kernel k = {0};
  lm_expr one = lm_x_const(x, 1);
  int32_t P = lm_kernel_add_loop(&k, -1, lm_x_const(x, 2), LM_L_PARALLEL);
  int32_t R = lm_kernel_add_loop(&k, P, lm_x_const(x, 4), LM_L_SERIAL);
  int32_t K = lm_kernel_add_loop(&k, R, lm_x_const(x, kind == 3 ? 8 : 256), LM_L_SERIAL);
  k.npar = 1;
  lm_expr vp = lm_x_var(x, P), vr = lm_x_var(x, R), vk = lm_x_var(x, K);
  lm_expr in_idx = lm_x_add(x, lm_x_mul(x, vp, lm_x_const(x, 256)), vk);
  if (kind == 2) in_idx = lm_x_add(x, in_idx, vr); /* names the loop: not the same in every r */
  uint32_t ld = lm_kernel_add_stmt(&k, &(lm_stmt){.op = LM_S_LOAD, .loop = K, .buf = 0, .idx = in_idx, .valid = one}, -1);
  lm_expr out_idx = lm_x_add(x, lm_x_add(x, lm_x_mul(x, vp, lm_x_const(x, 1024)), lm_x_mul(x, vr, lm_x_const(x, 256))), vk);
  uint32_t dst = kind == 1 ? 0 : 1; /* 1: the kernel writes what it reads */
  lm_kernel_add_stmt(&k, &(lm_stmt){.op = LM_S_STORE, .loop = K, .buf = dst, .a = ld, .idx = out_idx, .valid = one}, -1);
  int r = sk_pack_kernel(&p, &k);
  if (r > 0) { /* the copy: before loop R, 256 floats of in[256 p + k'], and the load reads it */
    cr_assert_eq(k.nlocals, 1);
    cr_assert_eq(k.locals[0], 256);
    const lm_stmt *o = &k.stmts[ld];
    cr_assert(o->local && o->buf == 0, "the load reads the copy");
    cr_assert(lm_x_prove_eq(x, o->idx, vk), "the copy is indexed by k alone");
    const lm_block *pb = &k.loops[P].body;
    cr_assert_eq(pb->n, 2);
    cr_assert(pb->items[0].is_loop && (int32_t)pb->items[0].id != R, "the copy loop comes first");
    cr_assert(pb->items[1].is_loop && (int32_t)pb->items[1].id == R);
  }
  lm_kernel_free(&k);
  lm_graph_free(g);
  return r;
}

Test(genetic, packing_leaves_written_buffers_and_loop_dependent_loads_alone) {
  cr_assert_eq(pack_case(0), 1, "a row every r reads alike is packed");
  cr_assert_eq(pack_case(1), 0, "a buffer the kernel writes is not packed");
  cr_assert_eq(pack_case(2), 0, "a load whose index names the loop is not packed");
  cr_assert_eq(pack_case(3), 0, "8 floats are not worth a copy");
}

Test(genetic, mutation_draws_a_few_classes_again_and_keeps_the_rest) {
  lowered l = lower(matmul64());
  saturated z;
  saturate(&l, 0, &z, "matmul 64^3");
  uint64_t rng = 11;
  uint32_t *g[NG], *child = malloc((z.ncl + 1) * sizeof *child);
  random_genomes(&z, &rng, g);
  int trials = 0, changed = 0;
  size_t kept = 0, both = 0;
  for (int i = 0; i < NG; i++) {
    sk_term t;
    lm_status st = sk_mutate(&z.s, z.root, z.best, g[i], 1, &rng, child, &t);
    cr_assert(st == LM_OK || st == LM_ERR_INVALID, "mutation %d: %s", i, lm_status_name(st));
    if (st != LM_OK) continue;
    trials++;
    int diff = 0;
    for (size_t c = 0; c < z.ncl; c++)
      if (child[c] != LM_EG_NONE && g[i][c] != LM_EG_NONE) {
        both++;
        if (child[c] == g[i][c]) kept++;
        else diff++;
      }
    changed += diff > 0;
    sk_term_free(&t);
  }
  cr_log_info("mutation: %d of %d children changed a choice; %zu of %zu shared classes kept", changed, trials, kept,
              both);
  cr_assert_gt(trials, NG / 2, "only %d mutations gave a term", trials);
  cr_assert_geq(changed, trials * 3 / 4, "only %d of %d mutations changed a choice the parent made", changed, trials);
  /* one class drawn again (and, rarely, a choice below it that no longer fits its loops) */
  cr_assert_leq(both - kept, 2 * (size_t)trials, "%d mutations of one class changed %zu of %zu shared choices", trials,
                both - kept, both);
  for (int i = 0; i < NG; i++) free(g[i]);
  free(child);
  saturated_free(&z);
  lowered_free(&l);
}

/* ---------------------------------------------------------------- the search */

static char *temp_dir(void) {
  const char *t = getenv("TMPDIR");
  char *d = malloc(4096);
  snprintf(d, 4096, "%s/lumen-search-test-XXXXXX", t && *t ? t : "/tmp");
  cr_assert(mkdtemp(d), "mkdtemp");
  return d;
}

static void remove_dir(const char *d) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  cr_assert_eq(system(cmd), 0);
}

/* The budget's clock in these tests never moves: a search is bounded by its counts alone
 * (kernels, candidates, generations, e-graph iterations and nodes), so what a test sees does not
 * depend on how busy the machine is. The budget itself is tested with a clock that ticks. */
static double frozen_clock(void *ctx) {
  (void)ctx;
  return 0;
}

static lm_search_options opts(const char *cache_dir) {
  lm_search_options o;
  lm_search_options_init(&o);
  o.budget_s = 1;
  o.clock = frozen_clock;
  o.generations = 1;
  o.cache_dir = cache_dir;
  o.use_cache = 1;
  o.max_candidates = 12;
  o.samples = 100;
  o.log_path = NULL;
  return o;
}

/* Searches a fresh lowering of g and checks the plan it leaves against the lowered plan. */
static void search_and_compare(lm_graph_t *(*make)(void), const lm_search_options *o, lm_search_report *rep,
                               char **code, const char *what) {
  lowered ref = lower(make()), l = lower(make());
  OK(lm_search_plan(l.p, test_syms, o, rep));
  bufs in = bufs_new(ref.p, 21), want = bufs_new(ref.p, 1), got = bufs_new(ref.p, 1);
  bufs_copy(&want, &in);
  bufs_copy(&got, &in);
  interpret(ref.p, ref.p->kernels, ref.p->nkernels, &want);
  cr_assert_eq(l.p->nbufs, ref.p->nbufs);
  interpret(l.p, l.p->kernels, l.p->nkernels, &got);
  expect_close(ref.p, &got, &want, 0, 0, what);
  if (code) *code = lm_render_plan(l.p, LM_DIALECT_C);
  bufs_free(&in);
  bufs_free(&want);
  bufs_free(&got);
  lowered_free(&ref);
  lowered_free(&l);
}

/* The same, and no candidate (nor cached decision) disagreed with the reference. */
static void search_and_check(lm_graph_t *(*make)(void), const lm_search_options *o, lm_search_report *rep,
                             char **code, const char *what) {
  search_and_compare(make, o, rep, code, what);
  cr_assert_eq(rep->wrong, 0, "%s: %d candidates disagreed with the reference", what, rep->wrong);
}

Test(search, matmul_softmax_adam_searched_plans_compute_the_same_and_time_no_wrong_candidate, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  lm_graph_t *(*makers[])(void) = {matmul64, softmax, adam};
  const char *names[] = {"matmul", "softmax", "adam"};
  for (int i = 0; i < 3; i++) {
    lm_search_report rep;
    search_and_check(makers[i], &o, &rep, NULL, names[i]);
    cr_log_info("%s: %d -> %d kernels, %d searched, %d candidates timed, %.2f us -> %.2f us, %.2f s", names[i],
                rep.kernels_before, rep.kernels_after, rep.searched, rep.candidates, 1e6 * rep.default_s,
                1e6 * rep.best_s, rep.wall_s);
    if (i < 2) cr_assert_gt(rep.candidates, 0, "%s: no candidate was timed", names[i]);
    lm_search_report_free(&rep);
  }
  remove_dir(dir);
  free(dir);
}

/* The whole PPO update searched (kernels fused, candidates timed on the cpu at M = 32) computes
 * what its lowered plan computes. */
Test(search, the_searched_ppo_update_computes_the_same_and_times_no_wrong_candidate, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  o.max_kernels = 3; /* the three slowest of the fused plan's kernels */
  lm_graph_t *g = ppo_update();
  lowered probe = lower(g);
  int64_t *v = bind_syms(probe.g, ppo_names, ppo_values, 6);
  lowered_free(&probe);
  test_syms = v;
  lm_search_report rep;
  search_and_check(ppo_update, &o, &rep, NULL, "ppo update");
  cr_log_info("ppo update: %d -> %d kernels, %d searched, %d candidates timed, %.2f us -> %.2f us, %.2f s",
              rep.kernels_before, rep.kernels_after, rep.searched, rep.candidates, 1e6 * rep.default_s,
              1e6 * rep.best_s, rep.wall_s);
  cr_assert_gt(rep.candidates, 0, "no candidate was timed");
  cr_assert_leq(rep.searched, 3);
  lm_search_report_free(&rep);
  test_syms = NULL;
  free(v);
  remove_dir(dir);
  free(dir);
}

Test(search, a_second_run_with_a_warm_cache_does_no_search, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  lm_search_report r1, r2;
  char *code1 = NULL, *code2 = NULL;
  search_and_check(matmul64, &o, &r1, &code1, "first run");
  cr_assert_gt(r1.searched, 0);
  cr_assert_gt(r1.candidates, 0);
  int64_t builds = lm_cc_compile_count();
  search_and_check(matmul64, &o, &r2, &code2, "second run");
  cr_assert_eq(r2.searched, 0, "the second run searched %d kernels", r2.searched);
  cr_assert_eq(r2.candidates, 0);
  cr_assert_geq(r2.from_cache, 1);
  cr_assert_eq(lm_cc_compile_count(), builds, "the second run compiled something");
  cr_assert_str_eq(code1, code2, "the cached decision gives other code");
  cr_log_info("first run %.2f s, second %.3f s", r1.wall_s, r2.wall_s);
  lm_search_report_free(&r1);
  lm_search_report_free(&r2);
  free(code1);
  free(code2);
  remove_dir(dir);
  free(dir);
}

/* A graph that allows contraction: the default's kernels get FMAs at the end of lm_compile_ex,
 * while a searched winner keeps the contraction it was timed with (a vector variant's FMAs, or
 * none): a register tile timed without FMAs and run with them spills its accumulators. */
static lm_graph_t *contracting_matmul(void) {
  lm_graph_t *g = matmul64();
  lm_graph_set_contraction(g, 1);
  return g;
}

Test(search, winners_run_with_the_contraction_they_were_timed_with, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  lm_compile_options co = {.search = &o, .interchange = 1, .stage = 1, .join = 1};
  lm_graph_t *g = contracting_matmul();
  lm_compiled comp;
  OK(lm_compile_ex(g, NULL, &co, &comp));
  int measured = 0;
  for (size_t i = 0; i < comp.plan->nkernels; i++) {
    const lm_kernel *k = &comp.plan->kernels[i];
    int vec = 0;
    for (size_t l = 0; l < k->nloops; l++) vec |= k->loops[l].kind == LM_L_VECTOR;
    if (k->measured) {
      measured++;
      cr_assert_eq(k->contract, vec, "kernel %s: contraction %d, vector loops %d", k->name, k->contract, vec);
    } else
      cr_assert_eq(k->contract, 1, "kernel %s of the default schedule without FMAs", k->name);
  }
  cr_log_info("%d of %zu kernels searched winners", measured, comp.plan->nkernels);
  lm_compiled_free(&comp);
  lm_graph_free(g);
  remove_dir(dir);
  free(dir);
}

/* cache_only (rltrain's default): with no budget the cache's decisions apply and nothing is
 * searched; with an empty cache the plan is the default schedule's. */
Test(search, cache_only_applies_the_cache_and_searches_nothing, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir(), *empty = temp_dir();
  lm_search_options o = opts(dir);
  lm_search_report r1, r2, r3;
  char *code1 = NULL, *code2 = NULL, *code3 = NULL;
  search_and_check(matmul64, &o, &r1, &code1, "search");
  cr_assert_gt(r1.searched, 0);
  o.budget_s = 0;
  o.cache_only = 1;
  search_and_check(matmul64, &o, &r2, &code2, "cache only");
  cr_assert_eq(r2.searched, 0, "cache_only searched %d kernels", r2.searched);
  cr_assert_eq(r2.candidates, 0);
  cr_assert_geq(r2.from_cache, 1);
  cr_assert_str_eq(code1, code2, "the cached decision gives other code");
  o.cache_dir = empty;
  search_and_check(matmul64, &o, &r3, &code3, "cache only, empty cache");
  cr_assert_eq(r3.searched + r3.from_cache + r3.candidates, 0);
  lowered c = lower(matmul64());
  lm_schedule_interchange(c.p, 1);
  char *want = lm_render_plan(c.p, LM_DIALECT_C);
  cr_assert_str_eq(code3, want, "with an empty cache the plan is not the default schedule");
  lm_free(want);
  lowered_free(&c);
  lm_search_report_free(&r1);
  lm_search_report_free(&r2);
  lm_search_report_free(&r3);
  free(code1);
  free(code2);
  free(code3);
  remove_dir(dir);
  remove_dir(empty);
  free(dir);
  free(empty);
}

Test(search, corrupt_cache_lines_are_skipped_and_the_rest_still_applies, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  lm_search_report r1, r2;
  char *code1 = NULL, *code2 = NULL;
  search_and_check(matmul64, &o, &r1, &code1, "first run");
  /* the cache file: append corrupt lines, and corrupt a copy of every valid line */
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "ls '%s'/search-*.txt", dir);
  FILE *ls = popen(cmd, "r");
  char path[4096] = "";
  cr_assert(ls && fgets(path, sizeof path, ls), "no cache file in %s", dir);
  pclose(ls);
  path[strcspn(path, "\n")] = 0;
  FILE *f = fopen(path, "r");
  cr_assert(f);
  char lines[64][2048];
  int n = 0;
  while (n < 64 && fgets(lines[n], sizeof lines[n], f)) n++;
  fclose(f);
  f = fopen(path, "w");
  cr_assert(f);
  fputs("this is not a cache line\n", f);
  fputs("0123456789abcdef deadbeef W|1|1|1|0|0|-\n", f); /* wrong check */
  fputs("0123456789abcdef\n", f);                         /* truncated */
  fputs("zzzzzzzzzzzzzzzz 00000000 D|0|0|0|0|0|-\n", f);
  for (int i = 0; i < n; i++) {
    if (lines[i][0] == '#') continue;
    char bad[2048];
    size_t len = strnlen(lines[i], sizeof bad - 1);
    memcpy(bad, lines[i], len);
    bad[len] = 0;
    if (len > 30) bad[len - 3] ^= 1; /* a flipped bit in the value: the check no longer matches */
    fputs(bad, f);
    fputs(lines[i], f);
  }
  fputs("ffffffffffffffff 1234", f); /* a last line cut short */
  fclose(f);
  /* the cache layer itself: every corrupt line skipped, every valid one kept */
  sk_cache c;
  OK(skc_load(&c, path));
  cr_assert_geq(c.skipped, 5, "%zu lines skipped", c.skipped);
  cr_assert_geq(c.n, 1);
  size_t valid = c.n;
  skc_free(&c);
  /* and the search still takes its decisions from the valid lines */
  int64_t builds = lm_cc_compile_count();
  search_and_check(matmul64, &o, &r2, &code2, "after corruption");
  cr_assert_eq(r2.searched, 0);
  cr_assert_geq(r2.from_cache, 1);
  cr_assert_eq(lm_cc_compile_count(), builds);
  cr_assert_str_eq(code1, code2);
  cr_log_info("%zu valid entries kept", valid);
  lm_search_report_free(&r1);
  lm_search_report_free(&r2);
  free(code1);
  free(code2);
  remove_dir(dir);
  free(dir);
}

/* ---------------------------------------------------------------- cached decisions are checked */

/* The tuning-cache file of a search directory (one device: one file). */
static void cache_file(const char *dir, char *path, size_t cap) {
  char cmd[4400];
  snprintf(cmd, sizeof cmd, "ls '%s'/search-*.txt", dir);
  FILE *ls = popen(cmd, "r");
  path[0] = 0;
  cr_assert(ls && fgets(path, (int)cap, ls), "no cache file in %s", dir);
  pclose(ls);
  path[strcspn(path, "\n")] = 0;
}

/* A file's text ("" when it is missing); the caller frees it. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  char *text = calloc(1 << 20, 1);
  if (f) {
    size_t n = fread(text, 1, (1 << 20) - 1, f);
    text[n] = 0;
    fclose(f);
  }
  return text;
}

static int occurrences(const char *text, const char *what) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* A step of 16 floats an env: a tanh layer over the carried state (its W a parameter) and a
 * per-step input, and a damping sum over the state, as a policy and an env would be. */
static lm_graph_t *scan_step_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, 16});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 16});
  lm_tensor w = lm_input(g, "W", LM_ROLE_PARAM, 2, (lm_dim[]){16, 16});
  lm_tensor t = lm_tanh(lm_add(lm_matmul(h, w), x));
  lm_tensor h2 = lm_mul(t, lm_recip(lm_add_scalar(lm_mul_scalar(lm_sum(lm_square(h), 1, 1), 0.01f), 1.0f)));
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  return g;
}

/* The fused scan's kernel (which the e-graph does not represent) is searched as whole variants
 * of its passes (compile.c): on a frozen clock every variant is built, checked against the
 * default bit for bit on the same inputs and timed, the lanes at 64, 32, 16 and 8 and each later
 * pass off; the choice is cached, and a compile with no budget takes it from the cache. The
 * programs, searched or not, give the same bits. */
Test(search, a_fused_scans_schedule_is_chosen_among_whole_variants_of_its_passes) {
  char *dir = temp_dir(), logp[4200];
  snprintf(logp, sizeof logp, "%s/log.txt", dir);
  lm_graph_t *g = scan_step_graph();
  lm_graph_t *gc = lm_graph_clone(g);
  int sym = lm_x_symbol(&gc->x, "T", 1);
  cr_assert(sym >= 0 && gc->ninputs == 3);
  uint8_t per[3] = {0, 1, 0}; /* x is fed per step */
  lm_scan_info scan = {1, sym, 0, per};
  lm_search_options o = opts(dir);
  o.log_path = logp;
  lm_compile_options co = {.search = &o, .interchange = 1, .stage = 1, .lanes = LM_CPU_SCAN_LANES, .join = 1};
  lm_compiled comp;
  OK(lm_compile_ex(gc, &scan, &co, &comp));
  cr_assert(comp.fused, "the scan was not fused");
  lm_compiled_free(&comp);
  char *log = slurp(logp);
  int timed = occurrences(log, " us\nvariants: "), chosen = occurrences(log, ") chosen, ");
  cr_assert_eq(chosen, 1, "%d choices among the scan's variants:\n%s", chosen, log);
  cr_assert_geq(timed, 8, "%d variants timed (9 expected):\n%s", timed + 1, log);
  cr_assert(strstr(log, "(lanes-32)") && strstr(log, "(lanes-8)") && strstr(log, "-no-inplace)") &&
                strstr(log, "-no-lazy)") && !strstr(log, "WRONG"),
            "%s", log);
  free(log);
  o.budget_s = 0; /* the cache's choice */
  o.cache_only = 1;
  remove(logp);
  OK(lm_compile_ex(gc, &scan, &co, &comp));
  lm_compiled_free(&comp);
  log = slurp(logp);
  cr_assert(strstr(log, "variants: from the cache: "), "%s", log);
  free(log);
  lm_graph_free(gc);
  /* the programs: searched (a real clock, a small budget) and not */
  float *out[2];
  for (int searched = 0; searched < 2; searched++) {
    if (searched) setenv("LUMEN_SEARCH_BUDGET", "0.3", 1);
    setenv("LUMEN_SEARCH_CACHE", "0", 1);
    lm_backend_t *b = lm_backend_new("cpu");
    lm_program_t *p = b ? lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1) : NULL;
    unsetenv("LUMEN_SEARCH_BUDGET");
    unsetenv("LUMEN_SEARCH_CACHE");
    cr_assert(p, "%s", lm_last_error());
    enum { T = 7, N = 70 };
    OK(lm_program_bind(p, "T", T));
    OK(lm_program_bind(p, "N", N));
    check_rng r = check_rng_new(5);
    float h[N * 16], x[T * N * 16], w[256];
    check_fill(&r, h, N * 16, -1, 1, 0);
    check_fill(&r, x, T * N * 16, -1, 1, 0);
    check_fill(&r, w, 256, -0.5, 0.5, 0);
    OK(lm_program_write(p, "h", h, N * 16));
    OK(lm_program_write(p, "x", x, T * N * 16));
    OK(lm_program_write(p, "W", w, 256));
    OK(lm_program_run(p));
    out[searched] = malloc(T * N * 16 * sizeof(float));
    OK(lm_program_read(p, "y", out[searched], T * N * 16));
    lm_program_free(p);
    lm_backend_free(b);
  }
  check_same_bits("y searched against the default", out[1], out[0], 7 * 70 * 16);
  free(out[0]), free(out[1]);
  lm_graph_free(g);
  remove_dir(dir);
  free(dir);
}

/* The kernel a cache term gives kernel 0 of p, parsed and emitted as the search reads a cached
 * winner; 0 when it does not parse or emit. */
static int term_kernel(lm_plan *p, const char *text, lm_kernel *k) {
  lm_sk s;
  OK(sk_init(&s, p));
  s.stage = SK_STAGE_KERNEL;
  int ok = sk_add_kernel(&s, 0, 0) != LM_EG_NONE;
  sk_term t = {0};
  ok = ok && sk_term_parse(&s, text, &t) == LM_OK && sk_emit_kernel(&s, &t, t.root, &p->kernels[0], k) == LM_OK;
  sk_term_free(&t);
  sk_free(&s);
  return ok;
}

/* Kernel 0 of p as a cache term: the lowered kernel itself (the greedy extraction of its e-graph
 * before any rewrite); *rounding: whether the term changes rounding. */
static char *kernel_term(lm_plan *p, int *rounding) {
  lm_sk s;
  OK(sk_init(&s, p));
  s.stage = SK_STAGE_KERNEL;
  uint32_t root = sk_add_kernel(&s, 0, 0);
  cr_assert_neq(root, LM_EG_NONE, "%s", s.why);
  size_t ncl = s.eg->nclasses;
  double *cost = malloc((ncl + 1) * sizeof *cost);
  uint32_t *best = malloc((ncl + 1) * sizeof *best);
  sk_greedy(&s, cost, best);
  sk_term t;
  OK(sk_extract(&s, root, best, NULL, NULL, 0, NULL, &t));
  sk_term_rules(&s, &t, rounding);
  char *text = sk_term_print(&s, &t);
  cr_assert(text);
  sk_term_free(&t);
  free(cost);
  free(best);
  sk_free(&s);
  return text;
}

/* Term with one number changed so that it still parses and emits, stays inside its buffers and
 * stores where kernel 0 stores, but computes something else (worse than 1e-3 relative on random
 * inputs): the first such of every (digit, +1 .. +9) in order; NULL when there is none. *emitting:
 * how many of the mutations tried parse and emit. */
static char *wrong_mutation(lm_plan *p, const char *term, int *emitting) {
  bufs in = bufs_new(p, 3), want = bufs_new(p, 1), got = bufs_new(p, 1);
  bufs_copy(&want, &in);
  interpret(p, &p->kernels[0], 1, &want);
  size_t len = strlen(term);
  char *m = malloc(len + 1);
  *emitting = 0;
  for (size_t i = 0; i < len; i++) {
    if (term[i] < '0' || term[i] > '9') continue;
    for (int d = 1; d <= 9; d++) {
      memcpy(m, term, len + 1);
      m[i] = (char)('0' + (term[i] - '0' + d) % 10);
      lm_kernel k;
      if (!term_kernel(p, m, &k)) continue;
      ++*emitting;
      int same_stores = k.nstmts > 0, differs = 0;
      for (size_t q = 0; q < k.nstmts; q++)
        if (k.stmts[q].op == LM_S_STORE && !k.stmts[q].local && !result_buf(p, k.stmts[q].buf)) same_stores = 0;
      bufs_copy(&got, &in);
      if (same_stores && sk_interpret(p, &k, got.b, got.count, test_syms, 5, 1) == LM_OK)
        for (size_t b = 0; b < p->nbufs; b++)
          if (result_buf(p, b) && skb_compare(got.b[b], want.b[b], got.count[b], 1e-3, 1e-4) > 1) differs = 1;
      lm_kernel_free(&k);
      if (differs) {
        bufs_free(&in);
        bufs_free(&want);
        bufs_free(&got);
        return m;
      }
    }
  }
  free(m);
  bufs_free(&in);
  bufs_free(&want);
  bufs_free(&got);
  return NULL;
}

/* Replaces the decision of the one kernel the cache of dir holds by value; its key. */
static uint64_t set_kernel_decision(const char *dir, const char *value) {
  char path[4096];
  cache_file(dir, path, sizeof path);
  sk_cache c;
  OK(skc_load(&c, path));
  cr_assert_eq(c.n, 1, "%zu cache entries: expected the kernel's decision only", c.n);
  uint64_t key = c.e[0].key;
  OK(skc_put(&c, key, value));
  OK(skc_save(&c));
  skc_free(&c);
  return key;
}

static char *kernel_decision(const char *dir, uint64_t key) {
  char path[4096];
  cache_file(dir, path, sizeof path);
  sk_cache c;
  OK(skc_load(&c, path));
  const char *v = skc_get(&c, key);
  char *r = strdup(v ? v : "");
  skc_free(&c);
  return r;
}

/* A cache line with one number of its term changed (it parses, emits and computes something
 * else; its check is recomputed, so the cache takes it): the search checks it against the
 * reference before applying it, discards it (searches the kernel again, and the plan computes
 * what the lowered plan computes), writes a fresh decision over it, and a third run applies that
 * one, not the bad one. Without the check the second run's plan is wrong on every row. */
Test(search, a_cached_decision_that_fails_its_check_against_the_reference_is_discarded, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  char log2[4200], log3[4200];
  snprintf(log2, sizeof log2, "%s/second.log", dir);
  snprintf(log3, sizeof log3, "%s/third.log", dir);
  lm_search_options o = opts(dir);
  lm_search_report r1, r2, r3;
  search_and_check(matmul64, &o, &r1, NULL, "first run");
  lm_search_report_free(&r1);
  lowered l = lower(matmul64());
  int rounding, emitting;
  char *term = kernel_term(l.p, &rounding);
  char *bad = wrong_mutation(l.p, term, &emitting);
  cr_assert(bad, "no mutation of %s parses, emits and computes something else (%d emit)", term, emitting);
  cr_log_info("%d mutations emit; the first wrong one: %s", emitting, bad);
  size_t cap = strlen(bad) + 64;
  char *value = malloc(cap);
  snprintf(value, cap, "W|3.14159e-05|1.23457e-05|7|%d|0|%s", rounding, bad);
  uint64_t key = set_kernel_decision(dir, value);
  o.log_path = log2;
  search_and_compare(matmul64, &o, &r2, NULL, "the run after the mutation"); /* the plan is right */
  char *text = slurp(log2);
  cr_assert(strstr(text, "the cached decision fails its check against the reference"), "%s", text);
  cr_assert(strstr(text, "discarded"), "%s", text);
  cr_assert_eq(r2.from_cache, 0, "the bad decision was counted as applied");
  cr_assert_eq(r2.searched, 1, "the kernel was not searched again");
  cr_assert_geq(r2.wrong, 1, "the discarded decision is not counted wrong");
  char *now = kernel_decision(dir, key);
  cr_assert(now[0], "no decision for the kernel after the discard");
  cr_assert_str_neq(now, value, "the bad decision is still in the cache");
  o.log_path = log3;
  search_and_check(matmul64, &o, &r3, NULL, "third run");
  char *text3 = slurp(log3);
  cr_assert_eq(r3.searched, 0, "the third run searched again");
  cr_assert_geq(r3.from_cache, 1);
  cr_assert_null(strstr(text3, "discarded"), "%s", text3);
  lm_search_report_free(&r2);
  lm_search_report_free(&r3);
  free(text);
  free(text3);
  free(now);
  free(value);
  free(bad);
  lm_free(term);
  lowered_free(&l);
  remove_dir(dir);
  free(dir);
}

/* A valid decision another process wrote (here: the kernel's own lowered form) is checked the first
 * time this process applies it, and applied unchecked, compiling nothing, the second time. */
Test(search, a_valid_cached_decision_is_checked_once_per_process, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  char loga[4200], logb[4200];
  snprintf(loga, sizeof loga, "%s/a.log", dir);
  snprintf(logb, sizeof logb, "%s/b.log", dir);
  lm_search_options o = opts(dir);
  lm_search_report r1, ra, rb;
  search_and_check(matmul64, &o, &r1, NULL, "first run");
  lm_search_report_free(&r1);
  lowered l = lower(matmul64());
  int rounding;
  char *term = kernel_term(l.p, &rounding);
  size_t cap = strlen(term) + 64;
  char *value = malloc(cap);
  snprintf(value, cap, "W|3.14159e-05|2.71828e-05|7|%d|0|%s", rounding, term);
  uint64_t key = set_kernel_decision(dir, value);
  o.log_path = loga;
  search_and_check(matmul64, &o, &ra, NULL, "first application");
  char *a = slurp(loga);
  cr_assert_eq(ra.searched, 0, "the valid decision was not applied: %s", a);
  cr_assert_eq(occurrences(a, "checked against the reference"), 1, "%s", a);
  cr_assert_null(strstr(a, "discarded"), "%s", a);
  int64_t builds = lm_cc_compile_count();
  o.log_path = logb;
  search_and_check(matmul64, &o, &rb, NULL, "second application");
  char *b = slurp(logb);
  cr_assert_eq(rb.searched, 0);
  cr_assert_geq(rb.from_cache, 1);
  cr_assert(strstr(b, "from the cache:"), "%s", b);
  cr_assert_eq(occurrences(b, "checked against the reference"), 0, "checked a second time: %s", b);
  cr_assert_eq(lm_cc_compile_count(), builds, "the second application compiled something");
  char *now = kernel_decision(dir, key);
  cr_assert_str_eq(now, value, "the valid decision was replaced");
  lm_search_report_free(&ra);
  lm_search_report_free(&rb);
  free(a);
  free(b);
  free(now);
  free(value);
  lm_free(term);
  lowered_free(&l);
  remove_dir(dir);
  free(dir);
}

Test(search, the_cache_merges_entries_and_survives_a_reload) {
  char *dir = temp_dir();
  char path[4200];
  snprintf(path, sizeof path, "%s/c.txt", dir);
  sk_cache a, b;
  OK(skc_load(&a, path)); /* a missing file is an empty cache */
  cr_assert_eq(a.n, 0);
  OK(skc_put(&a, 1, "D|1|1|0|0|0|-"));
  OK(skc_put(&a, 2, "W|2|1|3|0|ff|r0;nop:0;"));
  OK(skc_save(&a));
  OK(skc_load(&b, path));
  OK(skc_put(&b, 3, "D|3|3|0|0|0|-"));
  OK(skc_put(&b, 1, "D|9|9|0|0|0|-")); /* a newer decision replaces the older */
  OK(skc_save(&b));
  skc_free(&b);
  OK(skc_load(&b, path));
  cr_assert_eq(b.n, 3);
  cr_assert_eq(b.skipped, 0);
  cr_assert_str_eq(skc_get(&b, 1), "D|9|9|0|0|0|-");
  cr_assert_str_eq(skc_get(&b, 2), "W|2|1|3|0|ff|r0;nop:0;");
  cr_assert_null(skc_get(&b, 4));
  cr_assert_neq(skc_put(&b, 5, "two\nlines"), LM_OK);
  skc_free(&a);
  skc_free(&b);
  remove_dir(dir);
  free(dir);
}

/* A clock that moves `step` seconds every time the search reads it. */
typedef struct ticking {
  double t, step;
  long reads;
} ticking;

static double ticking_clock(void *ctx) {
  ticking *k = ctx;
  k->reads++;
  return k->t += k->step;
}

/* The same genetic search (a 128^3 matmul, up to 2 generations after the first) on a clock that stands still and
 * on one that ticks: only the second runs out of budget, and then it stops where the budget says
 * (no generation starts past the deadline, at most 4 candidates are timed past it, a tenth of
 * the budget at most over it), with everything it did time still checked. */
Test(search, the_budget_is_read_on_the_search_clock_and_stops_the_search, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  o.use_cache = 0;
  o.generations = 2;
  sk_trace frozen, ticked;
  lm_search_report r1, r2;
  lowered a = lower(matmul128()), b = lower(matmul128());
  OK(sk_search_plan_traced(a.p, NULL, &o, &r1, &frozen));
  ticking clk = {.step = 0.01};
  o.clock = ticking_clock;
  o.clock_ctx = &clk;
  OK(sk_search_plan_traced(b.p, NULL, &o, &r2, &ticked));
  cr_log_info("frozen clock: %d candidates timed, %d generations (stop: %s); ticking: %d timed, %d generations "
              "(stop: %s), %ld reads to %.2f s",
              r1.candidates, frozen.k[0].generations, frozen.k[0].stop, r2.candidates, ticked.k[0].generations,
              ticked.k[0].stop, clk.reads, clk.t);
  cr_assert_eq(frozen.n, 1);
  cr_assert_eq(ticked.n, 1);
  cr_assert(frozen.k[0].genetic && ticked.k[0].genetic);
  cr_assert_gt(frozen.k[0].generations, 1, "on a frozen clock the search stopped after generation 0 (%s)",
               frozen.k[0].stop);
  cr_assert(strcmp(frozen.k[0].stop, "time"), "a clock that never moves ran out of time");
  cr_assert_str_eq(ticked.k[0].stop, "time", "the ticking clock's budget did not stop the genetic search");
  cr_assert_eq(ticked.k[0].generations, 1, "a generation started past the deadline");
  cr_assert_leq(r2.candidates, r1.candidates);
  cr_assert_leq(clk.t, o.budget_s + 0.5 + 10 * clk.step, "the search read the clock at %.2f s on a 1 s budget", clk.t);
  cr_assert_eq(r1.wrong + r2.wrong, 0);
  lowered ref = lower(matmul128());
  bufs in = bufs_new(ref.p, 21), want = bufs_new(ref.p, 1), got = bufs_new(ref.p, 1);
  bufs_copy(&want, &in);
  interpret(ref.p, ref.p->kernels, ref.p->nkernels, &want);
  lowered *plans[] = {&a, &b};
  for (int i = 0; i < 2; i++) {
    bufs_copy(&got, &in);
    interpret(plans[i]->p, plans[i]->p->kernels, plans[i]->p->nkernels, &got);
    expect_close(ref.p, &got, &want, 0, 0, i ? "ticking" : "frozen");
  }
  bufs_free(&in);
  bufs_free(&want);
  bufs_free(&got);
  lowered_free(&ref);
  sk_trace_free(&frozen);
  sk_trace_free(&ticked);
  lm_search_report_free(&r1);
  lm_search_report_free(&r2);
  lowered_free(&a);
  lowered_free(&b);
  remove_dir(dir);
  free(dir);
}

Test(search, a_zero_budget_leaves_the_default_schedule) {
  lowered l = lower(matmul64()), c = lower(matmul64());
  lm_schedule_interchange(c.p, 1); /* what lm_search_plan stands in for */
  lm_search_options o;
  lm_search_options_init(&o);
  o.budget_s = 0;
  lm_search_report rep;
  OK(lm_search_plan(l.p, NULL, &o, &rep));
  cr_assert_eq(rep.searched, 0);
  char *a = lm_render_plan(l.p, LM_DIALECT_C), *b = lm_render_plan(c.p, LM_DIALECT_C);
  cr_assert_str_eq(a, b, "with no budget the plan is not the default schedule");
  cr_assert(strstr(a, "float l0["), "the default schedule's interchange did not apply:\n%s", a);
  lm_free(a);
  lm_free(b);
  lowered_free(&c);
  lowered_free(&l);
}

/* ---------------------------------------------------------------- how candidates are launched */

/* The calls a launch made: (start, end) of loop 0 per call. */
static pthread_mutex_t calls_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t calls[8][2];
static int ncalls;

static size_t calls_nbufs;   /* buffers of the launched kernel's plan */
static uintptr_t calls_align; /* the low bits of every one of their addresses, or'ed */

static void record_call(float *const *B, const int64_t *S, const uint64_t *R, int64_t start, int64_t end) {
  (void)S, (void)R;
  pthread_mutex_lock(&calls_mu);
  if (ncalls < 8) calls[ncalls][0] = start, calls[ncalls][1] = end;
  ncalls++;
  for (size_t i = 0; i < calls_nbufs; i++) calls_align |= (uintptr_t)B[i] & 63;
  pthread_mutex_unlock(&calls_mu);
}

static int cmp_call(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Launches kernel 0 of g's default schedule on a 2-thread pool through the search's bench and
 * returns the calls, sorted; also what the cpu backend's cut would give. */
static int bench_calls(lm_graph_t *g0, const char *sym, int64_t value, lm_cpu_cut *cut) {
  lowered l = lower(g0);
  lm_schedule_interchange(l.p, 1);
  int64_t syms[4] = {0};
  if (sym) {
    cr_assert_eq(l.g->x.nsyms, 1);
    syms[0] = value;
  }
  const lm_kernel *k = &l.p->kernels[0];
  const lm_exprs *x = &l.p->g->x;
  *cut = lm_cpu_cut_of(lm_kernel_fine(x, k), lm_x_eval(x, k->loops[0].extent, NULL, syms), lm_kernel_cost(x, k, syms));
  lm_pool *pool;
  OK(lm_pool_new(2, &pool));
  sk_bench b;
  OK(skb_open(&b, l.p, syms, pool, NULL, 1));
  ncalls = 0;
  calls_nbufs = l.p->nbufs;
  calls_align = 0;
  sk_kernel_fn fn = record_call;
  void *fp;
  memcpy(&fp, &fn, sizeof fp);
  skb_launch(&b, k, fp);
  skb_close(&b);
  lm_pool_free(pool);
  lowered_free(&l);
  cr_assert(ncalls <= 8);
  qsort(calls, (size_t)ncalls, sizeof calls[0], cmp_call);
  return ncalls;
}

/* The search must time what the cpu backend runs. It used to cut loop 0 by the size of the
 * parallel domain alone, so a 512-row matmul (64x64 work per row) ran on one thread in the search
 * and on two in the backend, and every measured time of such a kernel was about twice too long. */
/* Candidates are timed on buffers on a cache line, as the cpu backend's (lm_malloc_aligned):
 * at malloc's 16 bytes past a line, a register tile's 32-byte loads split every other line: the
 * PPO update's input-gradient tile ran 11% slower there (27.4 against 24.7 us), the default's
 * loop as fast, and the search kept the default. */
Test(search, candidates_run_on_buffers_aligned_to_a_cache_line) {
  lm_cpu_cut cut;
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){100, 3});
  lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){3, 5});
  cr_assert_eq(lm_output(lm_exp(lm_matmul(a, w)), "c"), LM_OK);
  cr_assert(bench_calls(g, NULL, 0, &cut) >= 1);
  cr_assert_geq(calls_nbufs, 3);
  cr_assert_eq(calls_align, 0, "a buffer sits %zu bytes past a 64-byte line", (size_t)calls_align);
}

Test(search, candidates_are_launched_cut_over_threads_as_the_cpu_backend_cuts_them) {
  lm_cpu_cut cut;
  { /* 512x16 times 16x16 (a row's 16 x 16 a C compiler may unroll whole, leaving the row loop
     * innermost): blocks of 64 rows, 8 of them, four to a thread */
    lm_graph_t *g = lm_graph_new();
    lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){512, 16});
    lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){16, 16});
    cr_assert_eq(lm_output(lm_matmul(a, w), "c"), LM_OK);
    cr_assert_eq(bench_calls(g, NULL, 0, &cut), 2, "a 512-row matmul ran in %d calls", ncalls);
    cr_assert_eq(cut.unit, 64);
    cr_assert_eq(calls[0][0], 0);
    cr_assert_eq(calls[0][1], 256);
    cr_assert_eq(calls[1][0], 256);
    cr_assert_eq(calls[1][1], 512);
  }
  { /* 64 rows of 64x64 times 64x64: a row's 64 x 64 nest (4096 statements whole) is never
     * unrolled away, so rows are cut apart (a rollout's dense layer over 64 envs) */
    lm_graph_t *g = lm_graph_new();
    lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){64, 64});
    lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){64, 64});
    cr_assert_eq(lm_output(lm_matmul(a, w), "c"), LM_OK);
    cr_assert_eq(bench_calls(g, NULL, 0, &cut), 2, "a 64-row matmul ran in %d calls", ncalls);
    cr_assert_eq(cut.unit, 1);
    cr_assert_eq(calls[0][1], 32);
    cr_assert_eq(calls[1][0], 32);
  }
  { /* a weight gradient X^T G over a symbolic minibatch: 64 rows, each cut apart */
    lm_graph_t *g = lm_graph_new();
    lm_dim M = lm_sym(g, "M");
    lm_tensor xx = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){M, 64});
    lm_tensor gg = lm_input(g, "g", LM_ROLE_DATA, 2, (lm_dim[]){M, 64});
    cr_assert_eq(lm_output(lm_matmul(lm_transpose(xx, 0, 1), gg), "dw"), LM_OK);
    cr_assert_eq(bench_calls(g, "M", 512, &cut), 2, "a 64-row weight gradient ran in %d calls", ncalls);
    cr_assert_eq(cut.unit, 1);
    cr_assert_eq(calls[0][1], 32);
    cr_assert_eq(calls[1][0], 32);
    cr_assert_eq(calls[1][1], 64);
  }
  { /* 64 rows of 64 x 1024 times 1024 x 64: the k loop (1024 iterations, a loop inside) is never
     * unrolled away, so rows are cut apart */
    lm_graph_t *g = lm_graph_new();
    lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){64, 1024});
    lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){1024, 64});
    cr_assert_eq(lm_output(lm_matmul(a, w), "c"), LM_OK);
    cr_assert_eq(bench_calls(g, NULL, 0, &cut), 2, "a 64-row matmul with a long k ran in %d calls", ncalls);
    cr_assert_eq(cut.unit, 1);
    cr_assert_eq(calls[0][1], 32);
    cr_assert_eq(calls[1][0], 32);
  }
  { /* 1000 additions are not worth a second thread */
    lm_graph_t *g = lm_graph_new();
    lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 1, (lm_dim[]){1000});
    cr_assert_eq(lm_output(lm_add(a, a), "c"), LM_OK);
    cr_assert_eq(bench_calls(g, NULL, 0, &cut), 1);
    cr_assert_eq(calls[0][0], 0);
    cr_assert_eq(calls[0][1], 1000);
    cr_assert_gt(cut.min_chunks, 8);
  }
}

/* A search log's text (at most cap - 1 bytes). */
static void read_log(const char *path, char *text, size_t cap) {
  FILE *f = fopen(path, "r");
  cr_assert(f, "no log at %s", path);
  size_t n = fread(text, 1, cap - 1, f);
  text[n] = 0;
  fclose(f);
}

Test(search, the_log_names_candidates_times_the_winner_and_its_rules, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  char log[4200];
  snprintf(log, sizeof log, "%s/search.log", dir);
  lm_search_options o = opts(dir);
  o.log_path = log;
  lm_search_report rep;
  search_and_check(matmul64, &o, &rep, NULL, "logged");
  char text[65536];
  read_log(log, text, sizeof text);
  cr_assert(strstr(text, "cand 0 default schedule"), "%s", text);
  cr_assert(strstr(text, "e-graph:"), "%s", text);
  cr_assert(strstr(text, "winner"), "%s", text);
  cr_assert(strstr(text, "rules="), "%s", text);
  cr_assert(strstr(text, "search done"), "%s", text);
  cr_assert(strstr(text, "+vec rules="), "no vector variant was timed: %s", text); /* compiled and checked */
  cr_assert(strstr(text, "default+vec"), "the default schedule's vector form was not timed: %s", text);
  lm_search_report_free(&rep);
  remove_dir(dir);
  free(dir);
}

/* y[M, 16] = x[M, 16] w[16, 16] + b[K]... with M hinted (the rows a trainer will bind) and K not. */
static lm_graph_t *hinted_rows(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim M = lm_sym(g, "M"), K = lm_sym(g, "K");
  lm_dim dx[2] = {M, 16}, dw[2] = {16, 16}, dk[1] = {K};
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, dx), w = lm_input(g, "w", LM_ROLE_DATA, 2, dw);
  lm_tensor k = lm_input(g, "k", LM_ROLE_DATA, 1, dk);
  cr_assert_eq(lm_output(lm_matmul(x, w), "y"), LM_OK);
  cr_assert_eq(lm_output(lm_sum(k, 0, 0), "s"), LM_OK);
  cr_assert_eq(lm_sym_hint(g, "M", 48), LM_OK, "%s", lm_last_error());
  return g;
}

Test(search, candidates_are_timed_at_the_hinted_sizes, .timeout = LM_TIMEOUT(120)) {
  lm_graph_t *g = lm_graph_new();
  (void)lm_sym_min(g, "off", 0);
  cr_assert_eq(lm_sym_hint(g, "rows", 8), LM_ERR_INVALID, "a hint for a symbol the graph lacks");
  cr_assert(strstr(lm_last_error(), "no symbol rows"), "%s", lm_last_error());
  cr_assert_eq(lm_sym_hint(g, "off", 0), LM_ERR_INVALID, "a hint of 0 (nothing to time at)");
  cr_assert_eq(lm_sym_hint(g, "off", 5), LM_OK, "%s", lm_last_error());
  lm_graph_free(g);

  char *dir = temp_dir();
  char log[4200];
  snprintf(log, sizeof log, "%s/search.log", dir);
  lm_search_options o = opts(dir);
  o.log_path = log;
  o.max_candidates = 2;
  o.generations = 0;
  lowered l = lower(hinted_rows()); /* the hint survives canonicalisation */
  lm_search_report rep;
  OK(lm_search_plan(l.p, NULL, &o, &rep));
  char text[65536];
  read_log(log, text, sizeof text);
  cr_assert(strstr(text, "symbol M = 48 (hinted)"), "%s", text);
  cr_assert(strstr(text, "symbol K = 256 (guessed)"), "%s", text);
  lm_search_report_free(&rep);
  lowered_free(&l);
  remove_dir(dir);
  free(dir);
}

Test(search, bench_runs_both_schedules_side_by_side, .timeout = LM_TIMEOUT(280)) {
  char *dir = temp_dir();
  lm_search_options o = opts(dir);
  lm_graph_t *g = matmul64();
  lm_search_bench_result r;
  OK(lm_search_bench(g, NULL, NULL, 0, &o, &r));
  cr_log_info("matmul 64^3: default %.2f us, searched %.2f us (%.2fx), search %.2f s, %d candidates, winner %s",
              1e6 * r.default_s, 1e6 * r.searched_s, r.speedup, r.search_wall_s, r.candidates, r.winner);
  cr_assert_gt(r.default_s, 0);
  cr_assert_gt(r.searched_s, 0);
  cr_assert_lt(r.max_rel_err, 1e-4, "searched and default disagree: %g", r.max_rel_err);
  cr_assert_eq(r.wrong, 0);
  cr_assert_eq(r.kernels_default, 1);
  lm_graph_free(g);
  remove_dir(dir);
  free(dir);
}

/* ---------------------------------------------------------------- the genetic search */

static int parent_ok(const char *op, size_t self, size_t *nparents) {
  const char *p = op;
  *nparents = 0;
  while ((p = strchr(p, 'c'))) {
    char *end;
    if (p[1] < '0' || p[1] > '9') {
      p++;
      continue;
    }
    unsigned long v = strtoul(p + 1, &end, 10);
    if (v >= self) return 0;
    ++*nparents;
    p = end;
  }
  return 1;
}

Test(genetic, a_large_space_runs_generations_of_distinct_checked_candidates, .timeout = LM_TIMEOUT(120)) {
  char *dir = temp_dir();
  char log[4200];
  snprintf(log, sizeof log, "%s/search.log", dir);
  lm_search_options o = opts(dir);
  o.generations = 3;
  o.log_path = log;
  lowered ref = lower(matmul128()), l = lower(matmul128());
  lm_search_report rep;
  sk_trace tr;
  OK(sk_search_plan_traced(l.p, NULL, &o, &rep, &tr));
  cr_assert_eq(rep.wrong, 0, "%d candidates disagreed with the reference", rep.wrong);
  cr_assert_eq(tr.n, 1, "%zu kernels searched", tr.n);
  const sk_trace_kernel *k = &tr.k[0];
  cr_log_info("%s: space %.3g terms, %d generations (stop: %s), %zu candidates, winner %d (%s, generation %d)",
              k->name, k->space, k->generations, k->stop, k->nc, k->winner, k->c[k->winner].op,
              k->c[k->winner].generation);
  cr_assert(k->genetic);
  cr_assert_gt(k->space, 64);
  cr_assert_gt(k->generations, 1, "one generation only (stop: %s)", k->stop);
  cr_assert_leq(k->generations, 4, "%d generations past the limit of 3 after the first", k->generations);
  size_t offspring_timed = 0;
  for (size_t i = 0; i < k->nc; i++) {
    const sk_trace_cand *d = &k->c[i];
    cr_assert_neq(d->status, SK_CS_WRONG, "candidate %zu (%s) is wrong", i, d->op);
    for (size_t q = 0; q < i; q++)
      cr_assert_neq(d->hash, k->c[q].hash, "candidates %zu (%s) and %zu (%s) have the same source", q, k->c[q].op, i,
                    d->op);
    cr_assert_lt(d->generation, k->generations);
    if (d->generation == 0) continue;
    size_t np;
    cr_assert(!strncmp(d->op, "mutation(c", 10) || !strncmp(d->op, "crossover(c", 11), "candidate %zu: %s", i, d->op);
    cr_assert(parent_ok(d->op, i, &np), "candidate %zu (%s) names a parent made after it", i, d->op);
    cr_assert_eq(np, d->op[0] == 'm' ? 1u : 2u, "candidate %zu: %s", i, d->op);
    offspring_timed += d->status == SK_CS_OK || d->status == SK_CS_SLOW;
  }
  cr_assert_gt(offspring_timed, 0, "no offspring was timed");
  cr_assert(k->winner == 0 || k->c[k->winner].status == SK_CS_OK, "the winner %d has status %d", k->winner,
            k->c[k->winner].status);
  for (size_t i = 1; i < k->nc; i++) /* nothing correct and timed beats the winner by the winner rule's margins */
    if (k->c[i].status == SK_CS_OK && !k->c[i].rounding && !k->c[k->winner].rounding)
      cr_assert_geq(k->c[i].time, k->winner ? k->c[k->winner].time : 0.98 * k->c[0].time,
                    "candidate %zu (%.2f us) is faster than the winner %d", i, 1e6 * k->c[i].time, k->winner);
  /* the plan computes what the lowered plan computes */
  bufs in = bufs_new(ref.p, 21), want = bufs_new(ref.p, 1), got = bufs_new(ref.p, 1);
  bufs_copy(&want, &in);
  bufs_copy(&got, &in);
  interpret(ref.p, ref.p->kernels, ref.p->nkernels, &want);
  interpret(l.p, l.p->kernels, l.p->nkernels, &got);
  expect_close(ref.p, &got, &want, 0, 0, "genetic");
  /* the log: a line per generation with its best and the ops that made it, then the winner's */
  FILE *f = fopen(log, "r");
  cr_assert(f, "no log at %s", log);
  static char text[1 << 20];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  cr_assert(strstr(text, "generation 0: "), "%s", text);
  cr_assert(strstr(text, "generation 1: "), "%s", text);
  cr_assert(strstr(text, "genetic search: "), "%s", text);
  cr_assert(strstr(text, "winner"), "%s", text);
  /* a warm cache: no search, nothing compiled, the same code */
  char *code1 = lm_render_plan(l.p, LM_DIALECT_C);
  lowered l2 = lower(matmul128());
  sk_trace tr2;
  lm_search_report rep2;
  int64_t builds = lm_cc_compile_count();
  OK(sk_search_plan_traced(l2.p, NULL, &o, &rep2, &tr2));
  cr_assert_eq(tr2.n, 0);
  cr_assert_eq(rep2.searched, 0);
  cr_assert_geq(rep2.from_cache, 1);
  cr_assert_eq(lm_cc_compile_count(), builds, "the second run compiled something");
  char *code2 = lm_render_plan(l2.p, LM_DIALECT_C);
  cr_assert_str_eq(code1, code2, "the cached decision gives other code");
  lm_free(code1);
  lm_free(code2);
  lm_search_report_free(&rep);
  lm_search_report_free(&rep2);
  sk_trace_free(&tr);
  sk_trace_free(&tr2);
  bufs_free(&in);
  bufs_free(&want);
  bufs_free(&got);
  lowered_free(&ref);
  lowered_free(&l);
  lowered_free(&l2);
  remove_dir(dir);
  free(dir);
}
