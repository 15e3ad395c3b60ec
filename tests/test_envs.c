/* Tests for the environments (envs/, examples/pointmass.c, include/lumen/env.h) and the
 * `rltrain list|check|record` commands, over every registered env: the built-in ones and the
 * suite's plugin tests/plugins/corridor.c (graphs only, no reference stepper), loaded into each
 * test process. Where an env has no reference stepper its own graphs, stepped one step at a time
 * on ref (lm_env_stepper), stand in for it, and the test says so.
 * - every row of every Gymnasium golden file (../shared/golden/{cartpole,pendulum,...}.csv, skipped with a message when
 *   absent) through the graph env on ref and on cpu and through the scalar reference stepper,
 *   one transition each: state and obs columns within the env's documented tolerance
 *   (|got - want| <= check_atol + check_rtol |want|: float32 against Gymnasium's float64),
 *   rewards within reward_atol + reward_rtol |want| (0 and 0 — bit-exact — for CartPole,
 *   MountainCar and Acrobot, whose rewards are integers; Pendulum and MountainCarContinuous compute
 *   theirs in float32 from the float32-rounded state), terminated equal on every row, truncated
 *   equal to (t + 1 == time limit and not terminated) on every row;
 * - reset graphs draw bit for bit what ref_reset draws, inside Gymnasium's reset ranges;
 * - lm_env_vec_step: terminated and truncated kept apart, same-step auto-reset from RAND (a fresh
 *   draw every run), final_obs = the state the step reached, t counting and restarting;
 * - batched random-policy runs with auto-reset (256 envs x 300 steps here, or 50 past the time
 *   limit; 4096 x 1000 in
 *   test_envs_slow.c, which includes this file with LUMEN_ENVS_SLOW) on ref and cpu against the
 *   reference stepper driven by the same uniforms: finished episodes, mean length, mean return
 *   and reward per step within STATS_RTOL (float32 graph vs double reference: the runs share resets and actions, so
 *   they only part where float32 rounding flips a termination); observations inside the env's
 *   bounds, where it declares them;
 * - an env's whole step with random actions, time limit and auto-reset is one kernel on cpu
 *   where its graphs keep every env to its own rows (the condition of compiler/scan.c, checked on
 *   the graph here, and against the compiler on hand-built steps that break it);
 * - on cpu an env's auto-reset draws its fresh state only where an episode ended (a sparse lane
 *   loop, compiler/lazy.c) when the env allows it: its step fuses, and its reset is + and * of
 *   RAND and constants with finite bounds (the rule of compiler/lazy.c, checked on the reset
 *   graph here); for every env the bits are those of drawing it for every env;
 * - action clipping, observation bounds, draw lists, the registry, and the CLI via the built
 *   binary (malformed files fail with their line number). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph-impl.h" /* the fusion and lazy-reset rules walk an env's graph nodes */
#include "lumen/env.h"
#include "lumen/lumen.h"
#include "support/check.h"
#include "support/timeout.h"

#define GOLDEN_DIR LUMEN_SOURCE_DIR "/../shared/golden"
#define RLTRAIN LUMEN_BINARY_DIR "/rltrain"
#define STATS_RTOL 0.01  /* episode statistics: graph vs reference stepper */
#define INIT_RUN (1ull << 40) /* run index of the initial reset draws: never a step's run */
#define TEST_PLUGIN LUMEN_SOURCE_DIR "/tests/plugins/corridor.c"

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

/* The suite's plugin env, loaded into this process (compiled once, then from the cache) so that
 * lm_env_count and lm_env_at include it; loading it again gives the same spec. */
static const lm_env_spec *test_plugin(void) {
  const lm_env_spec *e = NULL;
  OK(lm_env_load(TEST_PLUGIN, &e));
  cr_assert(e);
  return e;
}

/* A registered env by name; the test plugin's name loads it first. */
static const lm_env_spec *env_named(const char *name) {
  const lm_env_spec *e = lm_env_find(name);
  if (!e) test_plugin(), e = lm_env_find(name);
  cr_assert(e, "lm_env_find(%s): %s", name, lm_last_error());
  return e;
}

static lm_backend_t *open_backend(const char *name) {
  lm_backend_t *b = lm_backend_new(name);
  cr_assert(b, "backend %s: %s", name, lm_last_error());
  return b;
}

/* ================================================================ the reference side */

/* An env's reference transitions for n envs: its scalar reference stepper, or, for an env that
 * has none, its own reset, step and observe graphs compiled on ref (lm_env_stepper). */
typedef struct refenv {
  const lm_env_spec *e;
  size_t n;
  lm_backend_t *b;   /* these two only without a reference stepper */
  lm_env_stepper *s;
  float *scratch;    /* [n, state_size]: the stepper's next state or reset draw */
} refenv;

static refenv refenv_new(const lm_env_spec *e, size_t n) {
  refenv r = {e, n, NULL, NULL, NULL};
  if (e->ref_reset) return r;
  r.b = open_backend("ref");
  r.s = lm_env_stepper_new(e, r.b, n);
  cr_assert(r.s, "%s: lm_env_stepper_new: %s", e->name, lm_last_error());
  r.scratch = check_floats(n * (size_t)e->state_size);
  return r;
}

static void refenv_free(refenv *r) {
  lm_env_stepper_free(r->s);
  lm_backend_free(r->b);
  free(r->scratch);
}

/* Rows i of state [n, state_size] with where[i] != 0 (every row when where is NULL) become env
 * i's reset draw under (seed, run). */
static void refenv_reset(refenv *r, uint64_t seed, uint64_t run, const uint8_t *where, float *state) {
  size_t S = (size_t)r->e->state_size;
  if (r->s) OK(lm_env_stepper_reset(r->s, seed, run, r->scratch));
  for (size_t i = 0; i < r->n; i++) {
    if (where && !where[i]) continue;
    if (r->s) memcpy(state + i * S, r->scratch + i * S, S * sizeof *state);
    else r->e->ref_reset(state + i * S, seed, (uint64_t)i, run);
  }
}

/* One step of m <= n envs: state [m, state_size] in place, action [m, action size] in; obs
 * [m, obs_size], reward [m] and terminated [m] (0 or 1) out. */
static void refenv_step(refenv *r, size_t m, float *state, const float *action, float *obs, float *reward,
                        float *terminated) {
  const lm_env_spec *e = r->e;
  size_t S = (size_t)e->state_size, A = (size_t)lm_env_action_size(e), O = (size_t)e->obs_size;
  cr_assert_leq(m, r->n);
  if (r->s) {
    OK(lm_env_stepper_step(r->s, m, state, action, r->scratch, obs, reward, terminated));
    memcpy(state, r->scratch, m * S * sizeof *state);
    return;
  }
  for (size_t i = 0; i < m; i++) {
    int t = -1;
    reward[i] = e->ref_step(state + i * S, action + i * A, &t);
    terminated[i] = (float)t;
    e->ref_observe(state + i * S, obs + i * O);
  }
}

/* ================================================================ episode statistics */

typedef struct epstats {
  long episodes;
  double mean_len, mean_ret;
  double reward_per_step; /* over every env and step, finished episodes or not */
} epstats;

typedef struct acc {
  double ret, len, sum_ret, sum_len, all;
  long episodes;
} acc;

static void acc_step(acc *a, double r, int done) {
  a->all += r;
  a->ret += r;
  a->len += 1;
  if (!done) return;
  a->episodes++;
  a->sum_ret += a->ret;
  a->sum_len += a->len;
  a->ret = a->len = 0;
}

static epstats acc_stats(const acc *a, int64_t n, int64_t T) {
  epstats s = {0, 0, 0, 0};
  double sr = 0, sl = 0, all = 0;
  for (int64_t i = 0; i < n; i++) s.episodes += a[i].episodes, sr += a[i].sum_ret, sl += a[i].sum_len, all += a[i].all;
  if (s.episodes) s.mean_len = sl / (double)s.episodes, s.mean_ret = sr / (double)s.episodes;
  s.reward_per_step = all / (double)(n * T);
  return s;
}

/* The graph: random actions + lm_env_vec_step, as a scan of T steps on `backend`. Env i starts
 * from its reference reset (seed, i, INIT_RUN); step t draws with run counter t. */
static epstats stats_graph(const lm_env_spec *e, const char *backend, int64_t n, int64_t T, uint64_t seed) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  OK(lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs));
  OK(lm_output(vs.reward, "reward"));
  OK(lm_output(vs.terminated, "terminated"));
  OK(lm_output(vs.truncated, "truncated"));
  lm_backend_t *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "scan of %s on %s: %s", e->name, backend, lm_last_error());
  lm_graph_free(g);
  OK(lm_program_bind(p, "N", n));
  OK(lm_program_bind(p, "T", T));
  lm_program_set_seed(p, seed);
  size_t S = (size_t)e->state_size, cells = (size_t)(n * T);
  float *state = check_floats((size_t)n * S);
  refenv ref = refenv_new(e, (size_t)n);
  refenv_reset(&ref, seed, INIT_RUN, NULL, state);
  refenv_free(&ref);
  OK(lm_program_write(p, "state", state, (size_t)n * S));
  OK(lm_program_run(p));
  float *r = check_floats(cells), *te = check_floats(cells), *tr = check_floats(cells);
  OK(lm_program_read(p, "reward", r, cells));
  OK(lm_program_read(p, "terminated", te, cells));
  OK(lm_program_read(p, "truncated", tr, cells));
  acc *a = calloc((size_t)n, sizeof *a);
  cr_assert(a);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < n; i++) {
      size_t c = (size_t)(t * n + i);
      cr_assert(isfinite(r[c]) && (te[c] == 0 || te[c] == 1) && (tr[c] == 0 || tr[c] == 1) && !(te[c] && tr[c]),
                "%s on %s: step %lld env %lld: reward %g terminated %g truncated %g", e->name, backend, (long long)t,
                (long long)i, (double)r[c], (double)te[c], (double)tr[c]);
      acc_step(&a[i], r[c], te[c] != 0 || tr[c] != 0);
    }
  epstats s = acc_stats(a, n, T);
  free(a), free(r), free(te), free(tr), free(state);
  lm_program_free(p);
  lm_backend_free(b);
  return s;
}

/* The same run with the reference side (refenv): every env steps at once, step t's actions and
 * resets drawn as the graph draws them; also checks every observation against the env's
 * declared bounds, where it declares them. */
static epstats stats_ref(const lm_env_spec *e, int64_t n, int64_t T, uint64_t seed) {
  size_t N = (size_t)n, S = (size_t)e->state_size, A = (size_t)lm_env_action_size(e), O = (size_t)e->obs_size;
  refenv ref = refenv_new(e, N);
  float *s = check_floats(N * S), *act = check_floats(N * A), *o = check_floats(N * O), *r = check_floats(N), *term = check_floats(N);
  int *steps = calloc(N, sizeof *steps);
  uint8_t *done = calloc(N, 1);
  acc *a = calloc(N, sizeof *a);
  cr_assert(steps && done && a);
  if (!e->obs_low) cr_log_info("%s declares no observation bounds: its observations are not checked", e->name);
  refenv_reset(&ref, seed, INIT_RUN, NULL, s);
  for (int64_t t = 0; t < T; t++) {
    for (size_t i = 0; i < N; i++) lm_env_ref_random_action(e, seed, (uint64_t)i, (uint64_t)t, act + i * A);
    refenv_step(&ref, N, s, act, o, r, term);
    int any = 0;
    for (size_t i = 0; i < N; i++) {
      for (size_t k = 0; e->obs_low && k < O; k++)
        cr_assert(o[i * O + k] >= e->obs_low[k] && o[i * O + k] <= e->obs_high[k], "%s: obs[%zu] = %g outside [%g, %g]",
                  e->name, k, (double)o[i * O + k], (double)e->obs_low[k], (double)e->obs_high[k]);
      cr_assert(term[i] == 0 || term[i] == 1, "%s: env %zu step %lld: terminated %g", e->name, i, (long long)t,
                (double)term[i]);
      steps[i]++;
      done[i] = term[i] != 0 || steps[i] >= e->time_limit;
      acc_step(&a[i], r[i], done[i]);
      if (done[i]) steps[i] = 0, any = 1;
    }
    if (any) refenv_reset(&ref, seed, (uint64_t)t, done, s);
  }
  epstats st = acc_stats(a, n, T);
  free(a), free(done), free(steps), free(s), free(act), free(o), free(r), free(term);
  refenv_free(&ref);
  return st;
}

static void expect_stats_close(const char *what, epstats got, epstats want) {
  cr_assert(want.episodes > 0, "%s: no episode finished", what);
  double de = fabs((double)(got.episodes - want.episodes)) / (double)want.episodes;
  double dl = fabs(got.mean_len - want.mean_len) / want.mean_len;
  double dr = fabs(got.mean_ret - want.mean_ret) / fmax(fabs(want.mean_ret), 1.0);
  double dp = fabs(got.reward_per_step - want.reward_per_step) / fmax(fabs(want.reward_per_step), 0.01);
  cr_assert(de <= STATS_RTOL && dl <= STATS_RTOL && dr <= STATS_RTOL && dp <= STATS_RTOL,
            "%s: graph %ld episodes, mean length %.4f, mean return %.4f, reward per step %.5f; reference %ld, %.4f, "
            "%.4f, %.5f (rtol %g)",
            what, got.episodes, got.mean_len, got.mean_ret, got.reward_per_step, want.episodes, want.mean_len,
            want.mean_ret, want.reward_per_step, STATS_RTOL);
}

static void stats_check(const char *env, int64_t n, int64_t T) {
  const lm_env_spec *e = env_named(env);
  uint64_t seed = 0x5eed0000u + (uint64_t)strlen(env);
  if (!e->ref_step)
    cr_log_info("%s has no reference stepper: the scan is compared with its own step and reset graphs, run one step "
                "at a time on ref (the time limit and auto-reset done here)",
                env);
  epstats want = stats_ref(e, n, T, seed);
  static const char *const backends[] = {"ref", "cpu"};
  for (int i = 0; i < 2; i++) {
    epstats got = stats_graph(e, backends[i], n, T, seed);
    char what[128];
    snprintf(what, sizeof what, "%s on %s, %lld envs x %lld steps", env, backends[i], (long long)n, (long long)T);
    expect_stats_close(what, got, want);
    cr_log_info("%s: graph %ld episodes, mean length %.3f, return %.4f, reward/step %.5f; reference %ld, %.3f, %.4f, "
                "%.5f",
                what, got.episodes, got.mean_len, got.mean_ret, got.reward_per_step, want.episodes, want.mean_len,
                want.mean_ret, want.reward_per_step);
  }
}

#ifdef LUMEN_ENVS_SLOW

#define SLOW_STATS(suite, env)                                                                     \
  Test(suite, random_policy_4096_envs_x_1000_steps_graph_on_ref_and_cpu_matches_reference_stats, \
       .timeout = LM_TIMEOUT(600)) {                                                                           \
    stats_check(env, 4096, 1000);                                                                  \
  }
SLOW_STATS(stats_cartpole, "cartpole")
SLOW_STATS(stats_pendulum, "pendulum")
SLOW_STATS(stats_mountaincar, "mountaincar")
SLOW_STATS(stats_mountaincar_continuous, "mountaincar-continuous")
SLOW_STATS(stats_acrobot, "acrobot")
SLOW_STATS(stats_pointmass, "pointmass")
/* (not the test plugin: without a reference stepper its long run would only compare its scan
 * with its own graphs stepped on ref, what the fast run does already, at 50x the time) */

#else /* the always-on tests */

/* How many envs are registered, the test plugin included: the bound of every loop over envs. */
static int env_count(void) {
  test_plugin();
  return lm_env_count();
}

static float *zeros(size_t n) {
  float *v = calloc(n ? n : 1, sizeof *v);
  cr_assert(v);
  return v;
}

/* 256 envs for 300 steps, or 50 past the time limit where that is longer, so every env finishes
 * an episode. */
#define FAST_STATS(suite, env, T)                                                                  \
  Test(suite, random_policy_256_envs_with_auto_reset_graph_on_ref_and_cpu_matches_reference_stats) { \
    stats_check(env, 256, T);                                                                      \
  }
FAST_STATS(stats_cartpole, "cartpole", 300)
FAST_STATS(stats_pendulum, "pendulum", 300)
FAST_STATS(stats_mountaincar, "mountaincar", 300)
FAST_STATS(stats_mountaincar_continuous, "mountaincar-continuous", 1049)
FAST_STATS(stats_acrobot, "acrobot", 550)
FAST_STATS(stats_pointmass, "pointmass", 300)
FAST_STATS(stats_corridor, "corridor", 300)

/* ================================================================ golden transitions */

typedef struct golden {
  size_t rows, cols;
  double *v;
} golden;

/* Loads GOLDEN_DIR/file; skips the test (with a visible message) when it is absent. */
static int golden_load(const char *file, const lm_env_spec *e, golden *gd) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, file);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "test_envs: SKIPPED: golden file %s not found\n", path);
    cr_skip_test("golden file %s not found", path);
    return 0;
  }
  size_t S = (size_t)e->state_size, A = (size_t)lm_env_action_size(e), O = (size_t)e->obs_size;
  gd->cols = 2 + 2 * S + A + O + 3;
  gd->rows = 0;
  size_t cap = 4096;
  gd->v = malloc(cap * gd->cols * sizeof *gd->v);
  cr_assert(gd->v);
  char line[8192];
  cr_assert(fgets(line, sizeof line, f) && !strncmp(line, "episode,t,", 10), "%s: no header", path);
  while (fgets(line, sizeof line, f)) {
    if (gd->rows == cap) {
      cap *= 2;
      gd->v = realloc(gd->v, cap * gd->cols * sizeof *gd->v);
      cr_assert(gd->v);
    }
    double *row = gd->v + gd->rows * gd->cols;
    char *p = line;
    for (size_t c = 0; c < gd->cols; c++) {
      char *end;
      row[c] = strtod(p, &end);
      cr_assert(end != p, "%s: row %zu column %zu unreadable", path, gd->rows + 2, c);
      p = *end == ',' ? end + 1 : end;
    }
    gd->rows++;
  }
  fclose(f);
  cr_assert(gd->rows > 100, "%s: only %zu rows", path, gd->rows);
  return 1;
}

/* target: "ref" or "cpu" (the graph on that backend) or "reference" (the scalar stepper). */
static void golden_check(const char *env, const char *file, const char *target) {
  const lm_env_spec *e = env_named(env);
  golden gd;
  if (!golden_load(file, e, &gd)) return;
  size_t N = gd.rows, S = (size_t)e->state_size, A = (size_t)lm_env_action_size(e), O = (size_t)e->obs_size;
  float *state = check_floats(N * S), *action = check_floats(N * A), *next = check_floats(N * S), *obs = check_floats(N * O);
  float *rew = check_floats(N), *term = check_floats(N);
  for (size_t r = 0; r < N; r++) {
    const double *row = gd.v + r * gd.cols;
    for (size_t k = 0; k < S; k++) state[r * S + k] = (float)row[2 + k];
    for (size_t k = 0; k < A; k++) action[r * A + k] = (float)row[2 + S + k];
  }
  if (strcmp(target, "reference")) {
    lm_backend_t *b = open_backend(target);
    OK(lm_env_step_batch(e, b, N, state, action, next, obs, rew, term));
    lm_backend_free(b);
  } else {
    for (size_t r = 0; r < N; r++) {
      memcpy(next + r * S, state + r * S, S * sizeof *next);
      int t = -1;
      rew[r] = e->ref_step(next + r * S, action + r * A, &t);
      term[r] = (float)t;
      e->ref_observe(next + r * S, obs + r * O);
    }
  }
  double *worst = calloc(S + O + 1, sizeof *worst);
  cr_assert(worst);
  for (size_t r = 0; r < N; r++) {
    const double *row = gd.v + r * gd.cols;
    const double *want_next = row + 2 + S + A, *want_obs = want_next + S;
    double want_rew = want_obs[O], want_term = want_obs[O + 1], want_trunc = want_obs[O + 2];
    for (size_t k = 0; k < S + O; k++) {
      double got = k < S ? next[r * S + k] : obs[r * O + k - S], want = k < S ? want_next[k] : want_obs[k - S];
      double err = fabs(got - want);
      cr_assert(err <= e->check_atol + e->check_rtol * fabs(want),
                "%s %s, line %zu: %s%zu = %.9g, Gymnasium %.17g (error %.3g > %g + %g |want|)", env, target, r + 2,
                k < S ? "next_s" : "obs", k < S ? k : k - S, got, want, err, (double)e->check_atol,
                (double)e->check_rtol);
      if (err > worst[k]) worst[k] = err;
    }
    double rerr = fabs(rew[r] - want_rew);
    cr_assert(rerr <= e->reward_atol + e->reward_rtol * fabs(want_rew),
              "%s %s, line %zu: reward %.9g, Gymnasium %.17g (error %.3g)", env, target, r + 2, (double)rew[r], want_rew,
              rerr);
    if (rerr > worst[S + O]) worst[S + O] = rerr;
    cr_assert_eq(term[r], (float)want_term, "%s %s, line %zu: terminated %g, Gymnasium %g", env, target, r + 2,
                 (double)term[r], want_term);
    double want_trunc_rule = row[1] + 1 >= e->time_limit && !want_term;
    cr_assert_eq(want_trunc, want_trunc_rule, "%s, line %zu: truncated %g but t = %g and the limit is %d", file, r + 2,
                 want_trunc, row[1], e->time_limit);
  }
  double ws = 0, wo = 0;
  for (size_t k = 0; k < S; k++) ws = fmax(ws, worst[k]);
  for (size_t k = S; k < S + O; k++) wo = fmax(wo, worst[k]);
  cr_log_info("%s %s: %zu rows, max abs error next state %.3g, obs %.3g, reward %.3g", env, target, N, ws, wo,
              worst[S + O]);
  free(state), free(action), free(next), free(obs), free(rew), free(term), free(gd.v), free(worst);
}

#define GOLDEN_TESTS(suite, env, file)                                                             \
  Test(suite, graph_on_ref_matches_every_gymnasium_transition) { golden_check(env, file, "ref"); } \
  Test(suite, graph_on_cpu_matches_every_gymnasium_transition) { golden_check(env, file, "cpu"); } \
  Test(suite, reference_stepper_matches_every_gymnasium_transition) { golden_check(env, file, "reference"); }
GOLDEN_TESTS(golden_cartpole, "CartPole-v1", "cartpole.csv")
GOLDEN_TESTS(golden_pendulum, "Pendulum-v1", "pendulum.csv")
GOLDEN_TESTS(golden_mountaincar, "MountainCar-v0", "mountaincar.csv")
GOLDEN_TESTS(golden_mountaincar_continuous, "MountainCarContinuous-v0", "mountaincar_continuous.csv")
GOLDEN_TESTS(golden_acrobot, "Acrobot-v1", "acrobot.csv")

/* ================================================================ registry and specs */

/* s in upper case, into buf. */
static const char *upper(const char *s, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", s);
  for (char *c = buf; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
  return buf;
}

Test(registry, finds_the_five_gymnasium_envs_and_the_example_by_name_and_gym_id_in_any_case) {
  static const struct {
    const char *name, *gym;
    int obs, discrete, n, limit;
  } want[] = {
      {"cartpole", "CartPole-v1", 4, 1, 2, 500},
      {"pendulum", "Pendulum-v1", 3, 0, 1, 200},
      {"mountaincar", "MountainCar-v0", 2, 1, 3, 200},
      {"mountaincar-continuous", "MountainCarContinuous-v0", 2, 0, 1, 999},
      {"acrobot", "Acrobot-v1", 6, 1, 3, 500},
      {"pointmass", NULL, 6, 0, 2, 200},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const lm_env_spec *e = env_named(want[i].name);
    char buf[128];
    cr_assert_eq(lm_env_find(upper(want[i].name, buf, sizeof buf)), e, "%s", buf);
    if (want[i].gym) {
      cr_assert_eq(lm_env_find(want[i].gym), e, "%s", want[i].gym);
      cr_assert_eq(lm_env_find(upper(want[i].gym, buf, sizeof buf)), e, "%s", buf);
    }
    cr_assert_eq(lm_env_origin(e, NULL, 0, NULL, 0), 0, "%s is built in, not a plugin", e->name);
    cr_assert_eq(e->obs_size, want[i].obs, "%s", e->name);
    cr_assert_eq(e->action.kind == LM_SPACE_DISCRETE, want[i].discrete, "%s", e->name);
    cr_assert_eq(e->action.n, want[i].n, "%s", e->name);
    cr_assert_eq(e->time_limit, want[i].limit, "%s", e->name);
    cr_assert(e->ref_reset && e->ref_step && e->ref_observe && e->draw, "%s: a reference stepper and a draw list",
              e->name);
  }
}

/* Every registered env (the test plugin among them) by its own name and Gymnasium id, as given
 * and in upper case; each passes the env contract; the plugin is known as one, with its file. */
Test(registry, every_registered_env_is_found_by_its_own_name_and_gym_id_the_test_plugin_included) {
  const lm_env_spec *plugin = test_plugin();
  int seen = 0;
  for (int i = 0; i < env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    char buf[256];
    cr_assert(e, "lm_env_at(%d) of %d", i, lm_env_count());
    cr_assert_eq(lm_env_find(e->name), e, "%s", e->name);
    cr_assert_eq(lm_env_find(upper(e->name, buf, sizeof buf)), e, "%s", buf);
    if (e->gym_id) {
      cr_assert_eq(lm_env_find(e->gym_id), e, "%s", e->gym_id);
      cr_assert_eq(lm_env_find(upper(e->gym_id, buf, sizeof buf)), e, "%s", buf);
    }
    OK(lm_env_validate(e));
    seen += e == plugin;
  }
  cr_assert_eq(seen, 1, "the test plugin is registered %d times", seen);
  char path[4096], hash[64], want[4096];
  cr_assert(realpath(TEST_PLUGIN, want));
  cr_assert_eq(lm_env_origin(plugin, path, sizeof path, hash, sizeof hash), 1);
  cr_assert_str_eq(path, want);
  cr_assert(!plugin->ref_reset && !plugin->ref_step && !plugin->ref_observe, "the test plugin has a reference stepper");
  const lm_env_spec *again = NULL;
  OK(lm_env_load(TEST_PLUGIN, &again));
  cr_assert_eq(again, plugin, "loading the plugin again gave another spec");
}

Test(registry, unknown_name_returns_null_with_a_message_listing_the_envs) {
  cr_assert_null(lm_env_find("cartpoles"));
  cr_assert(strstr(lm_last_error(), "cartpoles") && strstr(lm_last_error(), "acrobot"), "message: %s", lm_last_error());
  cr_assert_null(lm_env_find(""));
  cr_assert_null(lm_env_find(NULL));
}

/* ================================================================ resets */

/* The reset graph on ref and cpu draws ref_reset's values bit for bit, inside Gymnasium's ranges
 * (written out here, independently of the env files). */
Test(reset, graph_draws_what_ref_reset_draws_inside_gymnasium_ranges) {
  static const struct {
    const char *env;
    float lo[6], hi[6];
  } ranges[] = {
      {"cartpole", {-0.05f, -0.05f, -0.05f, -0.05f}, {0.05f, 0.05f, 0.05f, 0.05f}},
      {"pendulum", {-3.1415927f, -1.0f}, {3.1415927f, 1.0f}},
      {"mountaincar", {-0.6f, 0.0f}, {-0.4f, 0.0f}},
      {"mountaincar-continuous", {-0.6f, 0.0f}, {-0.4f, 0.0f}},
      {"acrobot", {-0.1f, -0.1f, -0.1f, -0.1f}, {0.1f, 0.1f, 0.1f, 0.1f}},
      {"pointmass", {-1, -1, 0, 0, -0.9f, -0.9f}, {1, 1, 0, 0, 0.9f, 0.9f}},
  };
  const int64_t n = 1000;
  const uint64_t seed = 77, run = 5;
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    const lm_env_spec *e = env_named(ranges[i].env);
    size_t S = (size_t)e->state_size;
    lm_graph_t *g = lm_graph_new();
    lm_dim N = lm_sym(g, "N");
    OK(lm_output(e->reset(g, N), "s0"));
    for (int bi = 0; bi < 2; bi++) {
      lm_backend_t *b = open_backend(bi ? "cpu" : "ref");
      lm_program_t *p = lm_program_new(b, g);
      cr_assert(p, "%s: %s", e->name, lm_last_error());
      OK(lm_program_bind(p, "N", n));
      lm_program_set_seed(p, seed);
      lm_program_set_run(p, run);
      OK(lm_program_run(p));
      float *got = check_floats((size_t)n * S);
      OK(lm_program_read(p, "s0", got, (size_t)n * S));
      double mean0 = 0;
      float *want = check_floats(S);
      for (int64_t env = 0; env < n; env++) {
        e->ref_reset(want, seed, (uint64_t)env, run);
        for (size_t k = 0; k < S; k++) {
          float v = got[(size_t)env * S + k];
          cr_assert(v == want[k], "%s on %s: env %lld column %zu: graph %.9g, ref_reset %.9g", e->name,
                    lm_backend_name(b), (long long)env, k, (double)v, (double)want[k]);
          cr_assert(v >= ranges[i].lo[k] && v <= ranges[i].hi[k], "%s: reset column %zu = %g outside [%g, %g]",
                    e->name, k, (double)v, (double)ranges[i].lo[k], (double)ranges[i].hi[k]);
        }
        mean0 += got[(size_t)env * S];
      }
      /* the draws spread over the range: the mean of 1000 uniforms is within 0.1 range widths of the middle */
      double mid = 0.5 * (ranges[i].lo[0] + ranges[i].hi[0]), width = ranges[i].hi[0] - ranges[i].lo[0];
      cr_assert(fabs(mean0 / (double)n - mid) < 0.1 * width, "%s: mean reset %g", e->name, mean0 / (double)n);
      free(got), free(want);
      lm_program_free(p);
      lm_backend_free(b);
    }
    lm_graph_free(g);
  }
}

/* ================================================================ vec step: time limit, auto-reset */

/* CartPole, 6 envs stepped once on ref and cpu from states chosen to hit every case. */
Test(vec_step, cartpole_keeps_terminated_and_truncated_apart_and_resets_in_the_same_step) {
  const lm_env_spec *e = env_named("cartpole");
  enum { N = 6 };
  static const float s0[N][4] = {
      {0.01f, 0.02f, 0.03f, 0.04f},   /* 0: plain step */
      {0.0f, 0.0f, 0.2094f, 2.0f},    /* 1: pole falls past 12 degrees: terminated */
      {0.01f, -0.02f, 0.01f, -0.03f}, /* 2: t = 499: truncated */
      {0.0f, 0.0f, -0.2094f, -2.0f},  /* 3: t = 499 and falling: terminated, not truncated */
      {2.39f, 1.0f, 0.0f, 0.0f},      /* 4: cart leaves the track: terminated */
      {0.02f, 0.01f, -0.02f, 0.05f},  /* 5: t = 498: not yet truncated */
  };
  static const float t0[N] = {0, 3, 499, 499, 10, 498};
  static const float want_term[N] = {0, 1, 0, 1, 1, 0}, want_trunc[N] = {0, 0, 1, 0, 0, 0};
  const uint64_t seed = 1234;
  for (int bi = 0; bi < 2; bi++) {
    const char *bn = bi ? "cpu" : "ref";
    lm_graph_t *g = lm_graph_new();
    lm_dim Nd = lm_sym(g, "N");
    lm_tensor act = lm_input(g, "action", LM_ROLE_DATA, 1, &Nd);
    lm_vec_step vs;
    OK(lm_env_vec_step(e, g, "cp.", Nd, act, &vs));
    OK(lm_output(vs.obs, "obs"));
    OK(lm_output(vs.final_obs, "final_obs"));
    OK(lm_output(vs.reward, "reward"));
    OK(lm_output(vs.terminated, "terminated"));
    OK(lm_output(vs.truncated, "truncated"));
    lm_backend_t *b = open_backend(bn);
    lm_program_t *p = lm_program_new(b, g);
    cr_assert(p, "%s", lm_last_error());
    lm_graph_free(g);
    OK(lm_program_bind(p, "N", N));
    lm_program_set_seed(p, seed);
    float action[N] = {1, 0, 1, 0, 1, 0};
    OK(lm_program_write(p, "action", action, N));
    for (uint64_t run = 0; run < 2; run++) { /* the second run must draw fresh resets */
      OK(lm_program_write(p, "cp.state", &s0[0][0], N * 4));
      OK(lm_program_write(p, "cp.t", t0, N));
      OK(lm_program_run(p));
      float obs[N * 4], fin[N * 4], rew[N], te[N], tr[N], st[N * 4], t1[N];
      check_poison(obs, N * 4), check_poison(fin, N * 4), check_poison(st, N * 4), check_poison(t1, N);
      OK(lm_program_read(p, "obs", obs, N * 4));
      OK(lm_program_read(p, "final_obs", fin, N * 4));
      OK(lm_program_read(p, "reward", rew, N));
      OK(lm_program_read(p, "terminated", te, N));
      OK(lm_program_read(p, "truncated", tr, N));
      OK(lm_program_read(p, "cp.state", st, N * 4));
      OK(lm_program_read(p, "cp.t", t1, N));
      for (int i = 0; i < N; i++) {
        cr_assert_eq(te[i], want_term[i], "%s env %d: terminated %g", bn, i, (double)te[i]);
        cr_assert_eq(tr[i], want_trunc[i], "%s env %d: truncated %g", bn, i, (double)tr[i]);
        cr_assert_eq(rew[i], 1.0f, "%s env %d: reward %g (CartPole pays 1 on the terminating step too)", bn, i,
                     (double)rew[i]);
        float ref[4], o[4];
        memcpy(ref, s0[i], sizeof ref);
        int rt = 0;
        e->ref_step(ref, &action[i], &rt);
        e->ref_observe(ref, o);
        double want[4];
        for (int k = 0; k < 4; k++) want[k] = o[k];
        check_close("final_obs", fin + 4 * i, want, 4, 1e-5, 1e-6);
        int done = want_term[i] || want_trunc[i];
        float draw[4];
        e->ref_reset(draw, seed, (uint64_t)i, run);
        for (int k = 0; k < 4; k++) {
          if (done)
            cr_assert_eq(obs[4 * i + k], draw[k], "%s env %d run %llu: obs[%d] %.9g is not the reset draw %.9g", bn, i,
                         (unsigned long long)run, k, (double)obs[4 * i + k], (double)draw[k]);
          else
            cr_assert_eq(obs[4 * i + k], fin[4 * i + k], "%s env %d: obs differs from final_obs without a reset", bn, i);
          cr_assert_eq(st[4 * i + k], obs[4 * i + k], "%s env %d: state is not what obs shows", bn, i);
        }
        cr_assert_eq(t1[i], done ? 0.0f : t0[i] + 1, "%s env %d: t = %g", bn, i, (double)t1[i]);
      }
      if (run == 1) { /* a fresh draw: run 1 differs from run 0 */
        float d0[4], d1[4];
        e->ref_reset(d0, seed, 1, 0);
        e->ref_reset(d1, seed, 1, 1);
        cr_assert(memcmp(d0, d1, sizeof d0), "reset draws of run 0 and run 1 coincide");
      }
    }
    lm_program_free(p);
    lm_backend_free(b);
  }
}

/* ================================================================ kernels */

/* e's step with random actions, time limit and auto-reset, its outputs named. */
static lm_graph_t *random_step(const lm_env_spec *e) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  OK(lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs));
  OK(lm_output(vs.obs, "obs"));
  OK(lm_output(vs.final_obs, "final_obs"));
  OK(lm_output(vs.reward, "reward"));
  OK(lm_output(vs.terminated, "terminated"));
  OK(lm_output(vs.truncated, "truncated"));
  return g;
}

/* 1 where shape s is [N, constants...], 0 where its extents are all constants, -1 otherwise
 * (N off axis 0, or another symbolic extent). */
static int env_rows(lm_graph_t *g, const lm_shape *s, lm_dim N) {
  int rows = 0;
  for (int a = 0; a < s->rank; a++) {
    lm_dim d = lm_expr_dim(g, s->dim[a]);
    if (d >= 0) continue;
    if (a > 0 || !lm_dim_equal(g, d, N)) return -1;
    rows = 1;
  }
  return rows;
}

/* The reason an edge lets one env read another's rows, or NULL: each view of a value with env
 * rows keeps axis 0 where it is (a reshape keeps N first); a value without them may be
 * broadcast along it. */
static const char *edge_mixes_envs(lm_graph_t *g, lm_edge e, lm_dim N) {
  if (env_rows(g, &g->nodes[e.node].shape, N) < 0) return "a value whose shape holds N off axis 0";
  for (uint32_t v = e.view; v; v = g->views[v].parent) {
    const lm_view *w = &g->views[v];
    const lm_shape *in = w->parent ? &g->views[w->parent].shape : &g->nodes[e.node].shape;
    int rows_in = env_rows(g, in, N), rows_out = env_rows(g, &w->shape, N);
    if (rows_out < 0) return "a view whose shape holds N off axis 0";
    if (rows_in <= 0) continue;
    if (!rows_out) return "a view that drops the env axis";
    if (w->kind == LM_V_PERMUTE && w->perm[0] != 0) return "a permute that moves the env axis";
    if (w->kind == LM_V_EXPAND && w->axis == 0) return "an expand before the env axis";
    if (w->kind == LM_V_SLICE && w->axis == 0) return "a slice of the env axis";
    if (w->kind == LM_V_PAD && w->axis == 0) return "a pad of the env axis";
    if (w->kind == LM_V_AFFINE_MOD && w->axis == 0) return "an affine_mod (a shuffle) of the env axis";
  }
  return NULL;
}

/* What compiler/scan.c fuses into one kernel: a step in which every env reads and writes only
 * its own rows of every buffer. Checked on graph g over N envs: every value is [N, constants]
 * or constants alone, no reduction runs over the env axis, and every edge (sources, outputs,
 * assigns) keeps it (edge_mixes_envs). 1 when all holds; else 0 and the first reason. */
static int graph_keeps_envs_apart(lm_graph_t *g, lm_dim N, char *why, size_t cap) {
  for (size_t i = 1; i < g->nnodes; i++) {
    const lm_node *nd = &g->nodes[i];
    for (int k = 0; k < nd->nsrc; k++) {
      const char *bad = edge_mixes_envs(g, nd->src[k], N);
      if (!bad && lm_op_table[nd->op].reduce && nd->axis == 0 && env_rows(g, lm_edge_shape(g, nd->src[k]), N) > 0)
        bad = "a reduction over the env axis";
      if (bad) return snprintf(why, cap, "its step holds %s (node %zu, %s)", bad, i, lm_op_name((lm_op)nd->op)), 0;
    }
  }
  for (size_t i = 0; i < g->noutputs; i++) {
    const char *bad = edge_mixes_envs(g, g->outputs[i].src, N);
    if (bad) return snprintf(why, cap, "its step holds %s (output %s)", bad, g->outputs[i].name), 0;
  }
  for (size_t i = 0; i < g->nassigns; i++) {
    const char *bad = edge_mixes_envs(g, g->assigns[i].src, N);
    if (bad) return snprintf(why, cap, "its step holds %s (an assign)", bad), 0;
  }
  return 1;
}

/* graph_keeps_envs_apart for e's random_step graph. */
static int step_keeps_envs_apart(const lm_env_spec *e, char *why, size_t cap) {
  lm_graph_t *g = random_step(e);
  int ok = graph_keeps_envs_apart(g, lm_sym(g, "N"), why, cap);
  lm_graph_free(g);
  return ok;
}

/* The scan of g on cpu over 1024 envs: its kernels for T = 1 and T = 64. */
static void scan_kernels(lm_graph_t *g, int *one, int *many) {
  lm_backend_t *b = open_backend("cpu");
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "N", 1024));
  OK(lm_program_bind(p, "T", 1));
  lm_program_stats s;
  OK(lm_program_get_stats(p, &s));
  *one = s.kernels;
  OK(lm_program_bind(p, "T", 64));
  OK(lm_program_get_stats(p, &s));
  *many = s.kernels;
  lm_program_free(p);
  lm_backend_free(b);
}

/* Every env whose step keeps each env to its own rows (graph_keeps_envs_apart) runs its whole
 * step (random actions, time limit, auto-reset) as one kernel on cpu, and a whole rollout of 64
 * steps too; an env whose step does not is reported with the reason. */
Test(kernels, every_env_step_with_random_actions_time_limit_and_auto_reset_is_one_kernel_on_cpu_where_it_allows) {
  int demanded = 0;
  for (int i = 0; i < env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    lm_graph_t *g = random_step(e);
    char why[256];
    int allows = graph_keeps_envs_apart(g, lm_sym(g, "N"), why, sizeof why), one, many;
    scan_kernels(g, &one, &many);
    if (allows) {
      cr_assert_eq(one, 1, "the fused %s step is %d kernels", e->name, one);
      cr_assert_eq(many, 1, "64 fused %s steps are %d kernels", e->name, many);
      demanded++;
    } else
      cr_log_info("%s: %s: its step is not demanded to fuse into one kernel (it is %d)", e->name, why, one);
    if (e == env_named("cartpole")) {
      /* The plain (unscanned) program: the default schedule gives every output and every
       * assigned value a kernel of its own (compiler/lower.c, lower_once); recorded for the report. */
      lm_backend_t *b = open_backend("cpu");
      lm_program_t *plain = lm_program_new(b, g);
      cr_assert(plain, "%s", lm_last_error());
      OK(lm_program_bind(plain, "N", 1024));
      lm_program_stats s;
      OK(lm_program_get_stats(plain, &s));
      cr_log_info("plain CartPole vec step program: %d kernels", s.kernels);
      lm_program_free(plain);
      lm_backend_free(b);
    }
    lm_graph_free(g);
  }
  cr_assert_gt(demanded, 0, "no env's step keeps its envs apart: one kernel was demanded of none");
}

/* The rule is the compiler's: a step that reads other envs' rows (here the state plus the mean
 * over all envs, or plus the next env's state) is refused with the reason, and its scan indeed
 * runs its step plan once a step; the same step without them is allowed and is one kernel. */
Test(kernels, the_fusion_rule_refuses_steps_that_read_other_envs_rows_as_the_compiler_does) {
  for (int variant = 0; variant < 3; variant++) {
    lm_graph_t *g = lm_graph_new();
    lm_dim N = lm_sym(g, "N");
    lm_tensor s = lm_input(g, "state", LM_ROLE_STATE, 2, (lm_dim[]){N, 4});
    lm_tensor next = lm_add(lm_mul(s, lm_const(g, 0.5f)), lm_const(g, 1.0f));
    if (variant == 1) next = lm_add(next, lm_broadcast_to(lm_mean(s, 0, 1), 2, (lm_dim[]){N, 4}));
    if (variant == 2) next = lm_add(next, lm_affine_mod(s, 0, 1, 1)); /* env i reads env i + 1's row */
    OK(lm_assign(s, next));
    OK(lm_output(lm_mul(next, lm_const(g, 2.0f)), "out"));
    char why[256] = "";
    int allows = graph_keeps_envs_apart(g, N, why, sizeof why), one, many;
    scan_kernels(g, &one, &many);
    cr_log_info("variant %d: %s; %d kernels", variant, allows ? "allowed" : why, one);
    cr_assert_eq(allows, variant == 0, "variant %d: %s", variant, why);
    if (variant == 0) cr_assert_eq(one, 1, "the plain step is %d kernels", one);
    else /* its step plan runs once a step (joined, it may be one kernel; variant 1 is two) */
      cr_assert_geq(many, 64, "variant %d reads other envs' rows but its 64 steps are %d kernels", variant, many);
    lm_graph_free(g);
  }
}

/* ================================================================ lazy reset draws (cpu) */

/* Every env's step with random actions and auto-reset as a scan of T steps on cpu, its kernels
 * dumped to directory `dump`, with lazy draws or (LUMEN_NO_LAZY) without (or on ref when dump is
 * NULL): the carried state, t and episode counters after it, and every per-step output (obs and
 * final_obs too when obs), in one array. */
enum { LZ_N = 67, LZ_T = 260 }; /* a whole block of 64 lanes and a partial one; past 200 steps */

static float *lazy_run(const lm_env_spec *e, int lazy, const char *dump, int obs, size_t *count) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  OK(lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs));
  lm_tensor cnt = lm_input(g, "ep.count", LM_ROLE_STATE, 1, &N);
  OK(lm_assign(cnt, lm_add(cnt, lm_maximum(vs.terminated, vs.truncated))));
  if (obs) OK(lm_output(vs.obs, "obs"));
  if (obs) OK(lm_output(vs.final_obs, "final_obs"));
  OK(lm_output(vs.reward, "reward"));
  OK(lm_output(vs.terminated, "terminated"));
  lm_backend_t *b = dump ? NULL : open_backend("ref");
  lm_program_t *p = dump ? check_cpu_scan(g, dump, lazy, &b) : lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "N", LZ_N));
  OK(lm_program_bind(p, "T", LZ_T));
  size_t S = (size_t)e->state_size, O = (size_t)e->obs_size, TN = (size_t)LZ_T * LZ_N;
  float *s0 = check_floats(LZ_N * S);
  refenv ref = refenv_new(e, LZ_N);
  refenv_reset(&ref, 5, INIT_RUN, NULL, s0);
  refenv_free(&ref);
  OK(lm_program_write(p, "state", s0, LZ_N * S));
  lm_program_set_seed(p, 5);
  OK(lm_program_run(p));
  const struct { const char *name; size_t n; } parts[] = {
      {"state", LZ_N * S}, {"t", LZ_N}, {"ep.count", LZ_N}, {"reward", TN}, {"terminated", TN},
      {"obs", obs ? TN * O : 0}, {"final_obs", obs ? TN * O : 0}};
  size_t total = 0;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) total += parts[i].n;
  float *all = check_floats(total), *at = all;
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++, at += parts[i - 1].n)
    if (parts[i].n) OK(lm_program_read(p, parts[i].name, at, parts[i].n));
  *count = total;
  free(s0);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return all;
}


/* What compiler/lazy.c may draw only where an episode ended (its header comment): a value computed
 * by + and * from RAND and constants alone, with finite bounds. This walks e's reset graph, built
 * on a graph of its own, from the fresh state back to its leaves, with interval arithmetic
 * (RAND in (0, 1], a pad's zeros included): 1 when the fresh state is such a value and draws
 * from RAND at all; else 0 and the reason in why ("its reset uses mod and less_than, ..."). */
#define LAZY_BOUND 1e30 /* compiler/lazy.c's BOUND: values within it stay finite */

static int reset_allows_lazy(const lm_env_spec *e, char *why, size_t cap) {
  lm_graph_t *g = lm_graph_new();
  cr_assert(g);
  lm_tensor s0 = e->reset(g, lm_sym(g, "N"));
  cr_assert(lm_tensor_ok(s0), "%s: the reset graph is invalid", e->name);
  size_t n = (size_t)s0.node + 1;
  uint8_t *used = calloc(n, 1);
  double *lo = calloc(n, sizeof *lo), *hi = calloc(n, sizeof *hi);
  cr_assert(used && lo && hi);
  used[s0.node] = 1;
  for (size_t i = s0.node; i > 0; i--) /* a node's sources were built before it */
    for (int k = 0; used[i] && k < g->nodes[i].nsrc; k++) {
      cr_assert_lt(g->nodes[i].src[k].node, i, "%s: node %zu reads a later node", e->name, i);
      used[g->nodes[i].src[k].node] = 1;
    }
  unsigned others = 0; /* a bit for each op other than + and * (and contiguous) on the way */
  int draws = 0;       /* RAND nodes: a reset that draws nothing has nothing to make lazy */
  double b[2][2];
  for (size_t i = 1; i < n; i++) {
    const lm_node *nd = &g->nodes[i];
    if (!used[i]) continue;
    for (int k = 0; k < nd->nsrc; k++) { /* bounds as seen through the edge's views */
      lm_edge ed = nd->src[k];
      b[k][0] = lo[ed.node], b[k][1] = hi[ed.node];
      for (uint32_t v = ed.view; v; v = g->views[v].parent)
        if (g->views[v].kind == LM_V_PAD) b[k][0] = fmin(b[k][0], 0), b[k][1] = fmax(b[k][1], 0);
    }
    switch ((lm_op)nd->op) {
    case LM_OP_RAND: lo[i] = 0, hi[i] = 1, draws++; break;
    case LM_OP_CONST: lo[i] = hi[i] = nd->value; break;
    case LM_OP_CONTIGUOUS: lo[i] = b[0][0], hi[i] = b[0][1]; break;
    case LM_OP_ADD: lo[i] = b[0][0] + b[1][0], hi[i] = b[0][1] + b[1][1]; break;
    case LM_OP_MUL: {
      double p[4] = {b[0][0] * b[1][0], b[0][0] * b[1][1], b[0][1] * b[1][0], b[0][1] * b[1][1]};
      lo[i] = fmin(fmin(p[0], p[1]), fmin(p[2], p[3])), hi[i] = fmax(fmax(p[0], p[1]), fmax(p[2], p[3]));
      break;
    }
    default: others |= 1u << nd->op, lo[i] = -INFINITY, hi[i] = INFINITY; break;
    }
  }
  double slo = lo[s0.node], shi = hi[s0.node];
  for (uint32_t v = s0.view; v; v = g->views[v].parent)
    if (g->views[v].kind == LM_V_PAD) slo = fmin(slo, 0), shi = fmax(shi, 0);
  int ok = 0;
  if (others) {
    int count = 0, k = 0;
    for (int op = 0; op < LM_OP_COUNT; op++) count += others >> op & 1;
    size_t len = (size_t)snprintf(why, cap, "its reset uses");
    for (int op = 0; op < LM_OP_COUNT; op++) {
      if (!(others >> op & 1) || len >= cap) continue;
      const char *sep = k == 0 ? " " : k == count - 1 ? " and " : ", ";
      len += (size_t)snprintf(why + len, cap - len, "%s%s", sep, lm_op_name((lm_op)op));
      k++;
    }
    if (len < cap) snprintf(why + len, cap - len, ", not only + and * of RAND and constants");
  } else if (!draws)
    snprintf(why, cap, "its reset draws nothing from RAND (a constant state)");
  else if (!(slo > -LAZY_BOUND && shi < LAZY_BOUND))
    snprintf(why, cap, "its reset's values lie in [%g, %g], not within finite bounds", slo, shi);
  else ok = 1;
  free(used), free(lo), free(hi);
  lm_graph_free(g);
  return ok;
}

/* On cpu an env's auto-reset draws its fresh state in a sparse lane loop, only for the envs
 * whose episode ended, when the env allows it: its step fuses into one lane kernel
 * (step_keeps_envs_apart) and its reset is what compiler/lazy.c may draw lazily
 * (reset_allows_lazy); otherwise for every env, and the test says why. For every env every
 * value is the same bits as when every env draws it (LUMEN_NO_LAZY), sign of zero included:
 * the carried state, t, the episode counts and each step's outputs. (ref's sin and exp differ
 * from the vector library's in the last bits, so cpu is compared with itself here; test_envs'
 * statistics and goldens compare it with ref.) */
Test(lazy, every_env_draws_its_resets_only_where_episodes_end_when_it_allows_with_the_same_bits) {
  int demanded = 0;
  for (int i = 0; i < env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    char why[256];
    int allows = step_keeps_envs_apart(e, why, sizeof why) && reset_allows_lazy(e, why, sizeof why);
    char dl[] = "/tmp/lumen-lazy-XXXXXX", de[] = "/tmp/lumen-eager-XXXXXX";
    cr_assert(mkdtemp(dl) && mkdtemp(de));
    size_t nl, ne;
    float *lazy = lazy_run(e, 1, dl, 1, &nl), *eager = lazy_run(e, 0, de, 1, &ne);
    cr_assert_eq(nl, ne);
    check_same_bits(e->name, lazy, eager, nl);
    int sl = check_dump_lines(dl, "^ *sparse i"), se = check_dump_lines(de, "^ *sparse i");
    cr_assert_eq(se, 0, "%s: LUMEN_NO_LAZY left %d sparse loops", e->name, se);
    if (allows) {
      cr_assert(sl >= 1, "%s: the cpu scan kernel has %d sparse loops", e->name, sl);
      demanded++;
    } else
      cr_log_info("%s: %s: resets are drawn for every env (no sparse loop demanded; the kernel has %d)", e->name, why,
                  sl);
    free(lazy);
    free(eager);
  }
  cr_assert_gt(demanded, 0, "no env's reset allows lazy draws: the sparse loop was demanded of none");
}

/* compiler/inplace.c: the lane kernel stores each step's new carried state into the carry
 * itself, not into a local array copied onto the carry at the end of the step (in the dumped
 * loop IR, a local load followed by a store of it into another local array), and the values
 * are ref's bits: the example env's step (state, t and an episode counter carried, as rlbench's
 * env-only scan; lazy reset draws too), whose only transcendental is sqrt. */
static int copies_in_dump(const char *dir) {
  char cmd[128], line[512], loaded[32] = "", from_plan[32] = "";
  snprintf(cmd, sizeof cmd, "cat %s/cpu-*.c; rm -rf %s", dir, dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  int copies = 0, ir = 0, lines = 0;
  char carried[64] = {0}; /* local arrays filled from a plan buffer: the carry */
  while (fgets(line, sizeof line, f)) {
    ir |= strstr(line, "loop IR") != NULL;
    char v[32], arr[32], src[32];
    const char *eq = strrchr(line, '=');
    if (ir && sscanf(line, " %31s = store l%31[0-9][", v, arr) == 2 && eq && sscanf(eq, "= %31s", src) == 1) {
      int a = atoi(arr);
      if (from_plan[0] && !strcmp(src, from_plan) && a < 64) carried[a] = 1;
      if (loaded[0] && !strcmp(src, loaded) && a < 64 && carried[a]) copies++; /* a local copied onto the carry */
    }
    loaded[0] = from_plan[0] = 0;
    if (ir && sscanf(line, " %31s = load l%31[0-9][", v, arr) == 2) strcpy(loaded, v);
    if (ir && sscanf(line, " %31s = load b%31[0-9][", v, arr) == 2) strcpy(from_plan, v);
    lines += ir;
  }
  pclose(f);
  cr_assert(lines > 20, "no loop IR in the dumped kernels");
  return copies;
}

/* env's env-only scan on cpu (dumped) and ref: the same bits, and count(dump) is 0 */
static void lane_kernel_check(const char *env, int (*count)(const char *dir), const char *what) {
  const lm_env_spec *e = env_named(env);
  char dir[] = "/tmp/lumen-lanes-XXXXXX";
  cr_assert(mkdtemp(dir));
  size_t nc, nr;
  float *cpu = lazy_run(e, 1, dir, 0, &nc), *ref = lazy_run(e, 1, NULL, 0, &nr);
  cr_assert_eq(nc, nr);
  check_same_bits(env, cpu, ref, nc);
  int n = count(dir);
  cr_assert_eq(n, 0, "%s: %d %s in the lane kernel", env, n, what);
  free(cpu);
  free(ref);
}

/* Breakout: 108 state columns x 64 lanes, more points than the in-place pass once enumerated
 * (4096); Space Invaders: a kernel of more than 64 loops (the pass once gave up on those); every
 * value a small integer, so cpu and ref agree bit for bit. */
Test(lazy, the_lane_kernel_stores_the_new_carried_state_in_place_with_refs_bits) {
  lane_kernel_check("pointmass", copies_in_dump, "end-of-step copies"); /* sqrt alone: libm's bits */
  lane_kernel_check("minatar-breakout", copies_in_dump, "end-of-step copies");
  lane_kernel_check("minatar-space-invaders", copies_in_dump, "end-of-step copies");
}

/* compiler/render.c (choose_speculation): in the C source no local array is read under a guard
 * (`g ? l7[i] : 0.0f`): such a read stays a branch and its lane loop runs scalar (Space
 * Invaders' state update did, over all 308 columns). The loads are read first and the guard
 * picks the value, with the same bits as ref. */
static int guarded_local_reads(const char *dir) {
  char cmd[128], line[1 << 16];
  snprintf(cmd, sizeof cmd, "cat %s/cpu-*.c; rm -rf %s", dir, dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  int found = 0, ir = 0, lines = 0;
  while (fgets(line, sizeof line, f)) {
    ir |= strstr(line, "loop IR") != NULL;
    if (ir) continue;
    lines++;
    for (const char *q = strstr(line, "? l"); q; q = strstr(q + 1, "? l")) {
      const char *d = q + 3;
      while (*d >= '0' && *d <= '9') d++;
      found += d > q + 3 && *d == '[';
    }
  }
  pclose(f);
  cr_assert(lines > 100, "no kernel source in the dump");
  return found;
}

Test(lazy, minatar_lane_kernels_read_no_local_array_under_a_guard_with_refs_bits) {
  lane_kernel_check("minatar-breakout", guarded_local_reads, "local arrays read under a guard");
  lane_kernel_check("minatar-space-invaders", guarded_local_reads, "local arrays read under a guard");
}

/* compiler/columns.c (split): Breakout's 108-column loops that test the column (the 8 scalar
 * columns, then the map's rows: 0, the wall's 1..3, 4..9) are split where the tests change: in
 * the loop IR, loops over whole rows of the map alone (10 to 100 columns), at least two more
 * than with LUMEN_NO_SPLIT. ref's bits either way. */
static int map_row_loops(const char *dir) {
  char cmd[128], line[1 << 12];
  snprintf(cmd, sizeof cmd, "cat %s/cpu-*.c; rm -rf %s", dir, dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  int n = 0, ir = 0, d;
  while (fgets(line, sizeof line, f)) {
    ir |= strstr(line, "loop IR") != NULL;
    char tail[8];
    int cols;
    if (ir && sscanf(line, " for i%d < %d%1[:]", &d, &cols, tail) == 3 && cols % 10 == 0 && cols >= 10 && cols <= 100) n++;
  }
  pclose(f);
  return n;
}

Test(lazy, breakout_column_loops_split_where_their_tests_change_with_refs_bits) {
  const lm_env_spec *e = env_named("minatar-breakout");
  size_t nr;
  float *ref = lazy_run(e, 1, NULL, 0, &nr);
  int rows[2];
  for (int off = 0; off < 2; off++) {
    if (off) setenv("LUMEN_NO_SPLIT", "1", 1);
    char dir[] = "/tmp/lumen-split-XXXXXX";
    cr_assert(mkdtemp(dir));
    size_t nc;
    float *cpu = lazy_run(e, 1, dir, 0, &nc);
    cr_assert_eq(nc, nr);
    check_same_bits(off ? "breakout, no split" : "breakout, split", cpu, ref, nc);
    rows[off] = map_row_loops(dir);
    free(cpu);
  }
  /* (the wall's own slice, counted for a refill, is such a loop either way) */
  cr_assert_geq(rows[0], rows[1] + 2, "%d loops over the map's rows alone, %d with LUMEN_NO_SPLIT", rows[0], rows[1]);
  unsetenv("LUMEN_NO_SPLIT");
  free(ref);
}

/* ================================================================ action clipping */

static void step_one(const lm_env_spec *e, const char *backend, const float *state, const float *action, float *next,
                     float *reward) {
  float *obs = check_floats((size_t)e->obs_size), term;
  lm_backend_t *b = open_backend(backend);
  OK(lm_env_step_batch(e, b, 1, state, action, next, obs, reward, &term));
  lm_backend_free(b);
  free(obs);
}

Test(actions, box_actions_are_clipped_to_their_bounds_in_graph_and_reference) {
  static const struct {
    const char *env;
    float state[6], over[2], at[2];
  } cases[] = {
      {"pendulum", {0.5f, -0.3f}, {5.0f}, {2.0f}},
      {"pendulum", {-2.0f, 1.5f}, {-7.5f}, {-2.0f}},
      {"mountaincar-continuous", {-0.5f, 0.01f}, {3.0f}, {1.0f}},
      {"mountaincar-continuous", {-0.5f, 0.01f}, {-4.0f}, {-1.0f}},
      {"pointmass", {0.1f, 0.2f, 0.3f, -0.4f, 0.5f, 0.6f}, {9.0f, -9.0f}, {1.0f, -1.0f}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const lm_env_spec *e = env_named(cases[i].env);
    size_t S = (size_t)e->state_size;
    float *n_over = check_floats(S), *n_at = check_floats(S), r_over, r_at;
    for (int bi = 0; bi < 2; bi++) {
      step_one(e, bi ? "cpu" : "ref", cases[i].state, cases[i].over, n_over, &r_over);
      step_one(e, bi ? "cpu" : "ref", cases[i].state, cases[i].at, n_at, &r_at);
      cr_assert(!memcmp(n_over, n_at, S * sizeof *n_over), "%s: an action beyond the bounds moved differently", e->name);
    }
    int t;
    memcpy(n_over, cases[i].state, S * sizeof *n_over);
    memcpy(n_at, cases[i].state, S * sizeof *n_at);
    e->ref_step(n_over, cases[i].over, &t);
    e->ref_step(n_at, cases[i].at, &t);
    cr_assert(!memcmp(n_over, n_at, S * sizeof *n_over), "%s: the reference stepper does not clip", e->name);
    free(n_over), free(n_at);
  }
  /* MountainCarContinuous charges the unclipped action: -0.1 * 3^2 */
  const lm_env_spec *e = env_named("mountaincar-continuous");
  float next[2], r;
  step_one(e, "cpu", (float[]){-0.5f, 0.01f}, (float[]){3.0f}, next, &r);
  cr_assert(fabsf(r + 0.9f) < 1e-6f, "reward %g for action 3", (double)r);
}

/* ================================================================ draw lists */

/* e's draw list for state s, grown until it holds every command the state needs (draw returns
 * that count, as snprintf does); *n is how many. Caller frees. */
static lm_draw_cmd *draw_all(const lm_env_spec *e, const float *s, int *n) {
  int cap = LM_ENV_MAX_DRAW;
  lm_draw_cmd *c = malloc((size_t)cap * sizeof *c);
  cr_assert(c);
  *n = e->draw(s, c, cap);
  if (*n > cap) {
    cr_assert_leq(*n, 1 << 20, "%s: a draw list of %d commands", e->name, *n);
    cap = *n;
    c = realloc(c, (size_t)cap * sizeof *c);
    cr_assert(c);
    *n = e->draw(s, c, cap);
    cr_assert_eq(*n, cap, "%s: asked again with room for the %d commands it needs, draw returns %d", e->name, cap, *n);
  }
  return c;
}

/* Every env with a draw list draws finite commands for its reset state and for a state 20
 * random steps on (the last of them that differs from the reset state), and the two pictures
 * differ; given less room than it needs, it writes no further than the room (the rest of a
 * poisoned buffer untouched) and returns at least what it wrote. An env without a draw list, or
 * whose state 20 steps never moved, is reported and not asked for a picture that changes. */
Test(draw, every_env_draws_a_nonempty_finite_list_that_changes_with_the_state) {
  for (int i = 0; i < env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    if (!e->draw) {
      cr_log_info("%s has no draw list: nothing to check", e->name);
      continue;
    }
    size_t S = (size_t)e->state_size, A = (size_t)lm_env_action_size(e), O = (size_t)e->obs_size;
    refenv ref = refenv_new(e, 1);
    float *s1 = check_floats(S), *s2 = check_floats(S), *cur = check_floats(S), *act = check_floats(A), *obs = check_floats(O), r, term;
    refenv_reset(&ref, 9, 0, NULL, s1);
    memcpy(cur, s1, S * sizeof *cur);
    memcpy(s2, s1, S * sizeof *s2);
    for (int k = 0; k < 20; k++) { /* move away from the first state */
      lm_env_ref_random_action(e, 9, 0, (uint64_t)k, act);
      if (e->action.kind == LM_SPACE_BOX) act[0] = e->action.high[0];
      refenv_step(&ref, 1, cur, act, obs, &r, &term);
      if (memcmp(cur, s1, S * sizeof *cur)) memcpy(s2, cur, S * sizeof *s2);
    }
    int moved = memcmp(s1, s2, S * sizeof *s1) != 0, n1, n2;
    lm_draw_cmd *c1 = draw_all(e, s1, &n1), *c2 = draw_all(e, s2, &n2);
    cr_assert(n1 > 0 && n2 > 0, "%s: %d and %d commands", e->name, n1, n2);
    for (int k = 0; k < n1; k++)
      cr_assert(isfinite(c1[k].x0) && isfinite(c1[k].y0) && isfinite(c1[k].x1) && isfinite(c1[k].y1) &&
                    c1[k].kind <= LM_DRAW_CIRCLE,
                "%s: command %d", e->name, k);
    if (moved)
      cr_assert(n1 != n2 || memcmp(c1, c2, (size_t)n1 * sizeof *c1), "%s: two different states draw the same picture",
                e->name);
    else cr_log_info("%s: 20 random steps never moved its state: no change of picture demanded", e->name);
    lm_draw_cmd *few = malloc((size_t)n1 * sizeof *few), poison;
    cr_assert(few);
    memset(&poison, 0xa5, sizeof poison);
    for (int room = 0; room <= 2 && room < n1; room++) {
      for (int k = 0; k < n1; k++) few[k] = poison;
      int got = e->draw(s1, few, room);
      for (int k = room; k < n1; k++)
        cr_assert(!memcmp(&few[k], &poison, sizeof poison), "%s: draw with room for %d wrote command %d", e->name,
                  room, k);
      cr_assert(got >= room && got <= n1, "%s: draw with room for %d of %d returns %d", e->name, room, n1, got);
    }
    free(few), free(c1), free(c2), free(s1), free(s2), free(cur), free(act), free(obs);
    refenv_free(&ref);
  }
}

/* Acrobot wraps its angles as Gymnasium does (a turn at a time), in constant time: a state with
 * angles of 1e17 or 3.4e38 steps at once to angles in [-pi, pi]; an infinity or NaN gives NaN
 * (Gymnasium's loop never ends on an infinity); angles a few turns out agree with the loop. */
Test(acrobot, huge_and_non_finite_angles_wrap_in_constant_time, .timeout = LM_TIMEOUT(20)) {
  const lm_env_spec *e = lm_env_find("acrobot");
  cr_assert(e, "%s", lm_last_error());
  size_t S = (size_t)e->state_size;
  float *s = zeros(S), *z = zeros(S), act[1] = {1};
  const double huge[] = {1e10, -1e10, 1e17, -1e17, 3.4e38, -3.4e38};
  for (size_t i = 0; i < sizeof huge / sizeof *huge; i++)
    for (int which = 0; which < 2; which++) {
      memset(s, 0, S * sizeof *s);
      s[which] = (float)huge[i];
      int t;
      e->ref_step(s, act, &t);
      cr_assert(s[which] >= -(float)M_PI && s[which] <= (float)M_PI, "theta%d = %g wrapped to %g", which + 1, huge[i],
                (double)s[which]);
    }
  const float bad[] = {INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    memset(s, 0, S * sizeof *s);
    s[0] = bad[i];
    int t;
    e->ref_step(s, act, &t);
    cr_assert(isnan(s[0]), "theta1 = %g stepped to %g, not NaN", (double)bad[i], (double)s[0]);
  }
  /* a few to a thousand turns out: stepping from x is stepping from x wrapped by Gymnasium's loop */
  for (double x = -1000; x <= 1000; x += 7.31) {
    double y = (double)(float)x, diff = 2 * M_PI;
    while (y > M_PI) y -= diff;
    while (y < -M_PI) y += diff;
    memset(s, 0, S * sizeof *s);
    memset(z, 0, S * sizeof *z);
    s[0] = (float)x, z[0] = (float)y;
    int t;
    e->ref_step(s, act, &t);
    e->ref_step(z, act, &t);
    cr_assert(fabs(remainder((double)s[0] - (double)z[0], diff)) < 1e-3 && s[0] >= -(float)M_PI && s[0] <= (float)M_PI,
              "theta1 = %g stepped to %g, from its wrapped %g to %g", x, (double)s[0], y, (double)z[0]);
  }
  free(s), free(z);
}

/* ================================================================ the rltrain CLI */

/* Runs a shell command line, its stdout into out; returns its exit status. */
static int shell(const char *cmd, char *out, size_t cap) {
  FILE *f = popen(cmd, "r");
  cr_assert(f, "popen %s", cmd);
  size_t n = fread(out, 1, cap - 1, f);
  out[n] = 0;
  while (fgetc(f) != EOF) {
  }
  int st = pclose(f);
  cr_assert(WIFEXITED(st), "%s did not exit normally", cmd);
  return WEXITSTATUS(st);
}

/* Runs the built rltrain with args (stderr folded into stdout); returns its exit status. */
static int rltrain(const char *args, char *out, size_t cap) {
  cr_assert(access(RLTRAIN, X_OK) == 0, "%s is not built", RLTRAIN);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", RLTRAIN, args);
  return shell(cmd, out, cap);
}

/* A file name of this test process (malloc'd). */
static char *temp_path(const char *tag) {
  char path[256];
  snprintf(path, sizeof path, "/tmp/lumen_test_envs_%s_%ld.csv", tag, (long)getpid());
  char *p = strdup(path);
  cr_assert(p);
  return p;
}

static char out[1 << 16];

/* `rltrain list`, given the file of every plugin env this process loaded (a plugin joins the
 * list it is given to), shows every env. */
Test(cli, list_shows_every_env_with_obs_size_action_space_and_time_limit) {
  char args[8192] = "list";
  for (int i = 0; i < env_count(); i++) {
    char path[4096];
    if (lm_env_origin(lm_env_at(i), path, sizeof path, NULL, 0)) {
      size_t len = strlen(args);
      cr_assert_lt(snprintf(args + len, sizeof args - len, " '%s'", path), (int)(sizeof args - len));
    }
  }
  cr_assert_eq(rltrain(args, out, sizeof out), 0, "rltrain %s:\n%s", args, out);
  for (int i = 0; i < lm_env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    const char *line = strstr(out, e->name);
    cr_assert(line, "list misses %s:\n%s", e->name, out);
    char lim[32];
    snprintf(lim, sizeof lim, " %d\n", e->time_limit);
    const char *eol = strchr(line, '\n');
    cr_assert(eol && strstr(line, lim) && strstr(line, lim) < eol + 1, "%s: no time limit %d:\n%s", e->name,
              e->time_limit, out);
    if (e->gym_id) cr_assert(strstr(out, e->gym_id), "list misses %s", e->gym_id);
  }
  cr_assert(strstr(out, "discrete(2)") && strstr(out, "box(1) in [-2, 2]") && strstr(out, "box(2) in [-1, 1] x [-1, 1]"),
            "%s", out);
}

Test(cli, check_passes_every_golden_file_on_ref_and_cpu) {
  static const char *const files[][2] = {{"cartpole", "cartpole.csv"},
                                         {"pendulum", "pendulum.csv"},
                                         {"mountaincar", "mountaincar.csv"},
                                         {"MountainCarContinuous-v0", "mountaincar_continuous.csv"},
                                         {"acrobot", "acrobot.csv"}};
  for (size_t i = 0; i < 5; i++) {
    char path[1024], args[2048];
    snprintf(path, sizeof path, "%s/%s", GOLDEN_DIR, files[i][1]);
    if (access(path, R_OK)) {
      fprintf(stderr, "test_envs: SKIPPED: golden file %s not found\n", path);
      cr_skip_test("golden file %s not found", path);
    }
    for (int bi = 0; bi < 2; bi++) {
      snprintf(args, sizeof args, "check %s '%s' --device %s", files[i][0], path, bi ? "cpu" : "ref");
      cr_assert_eq(rltrain(args, out, sizeof out), 0, "rltrain %s:\n%s", args, out);
      cr_assert(strstr(out, "PASS") && strstr(out, "next_s0") && strstr(out, "reward"), "rltrain %s:\n%s", args, out);
    }
  }
}

Test(cli, record_then_check_passes_for_the_example_env_and_a_tampered_file_fails_naming_its_line) {
  char args[1024];
  char *path = temp_path("record");
  snprintf(args, sizeof args, "record pointmass %s --episodes 4 --seed 11", path);
  cr_assert_eq(rltrain(args, out, sizeof out), 0, "%s", out);
  snprintf(args, sizeof args, "check pointmass %s --device cpu", path);
  cr_assert_eq(rltrain(args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "PASS"), "%s", out);
  /* same seed, same file */
  char *again = temp_path("again");
  snprintf(args, sizeof args, "record pointmass %s --episodes 4 --seed 11", again);
  cr_assert_eq(rltrain(args, out, sizeof out), 0, "%s", out);
  FILE *a = fopen(path, "r"), *b = fopen(again, "r");
  cr_assert(a && b);
  static char ta[1 << 20], tb[1 << 20];
  size_t na = fread(ta, 1, sizeof ta - 1, a), nb = fread(tb, 1, sizeof tb - 1, b);
  fclose(a), fclose(b);
  ta[na] = tb[nb] = 0;
  cr_assert(na == nb && !memcmp(ta, tb, na), "two recordings with seed 11 differ");
  /* push next_s0 of the third transition (line 4) off by 0.01 */
  char *line = ta;
  for (int i = 0; i < 3; i++) line = strchr(line, '\n') + 1;
  char *f = line;
  for (int i = 0; i < 2 + 6 + 2; i++) f = strchr(f, ',') + 1; /* episode, t, 6 state, 2 action */
  double v = strtod(f, NULL);
  char num[64];
  snprintf(num, sizeof num, "%.9g", v + 0.01);
  char *comma = strchr(f, ',');
  FILE *w = fopen(again, "w");
  cr_assert(w);
  fwrite(ta, 1, (size_t)(f - ta), w);
  fputs(num, w);
  fputs(comma, w);
  fclose(w);
  snprintf(args, sizeof args, "check pointmass %s --device ref", again);
  cr_assert_eq(rltrain(args, out, sizeof out), 1, "%s", out);
  cr_assert(strstr(out, "FAIL") && strstr(out, "line 4"), "%s", out);
  unlink(path);
  unlink(again);
  free(path);
  free(again);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs(text, f);
  fclose(f);
}

Test(cli, malformed_csv_fails_with_its_line_number) {
  char *path = temp_path("bad"), args[1024];
  write_file(path, "episode,t,s0,s1,s2,s3,a0,next_s0,next_s1,next_s2,next_s3,obs0,obs1,obs2,obs3,reward,terminated,truncated\n"
                   "0,0,0.1,0.2,0.03,0.04,1,0.1,0.2,0.03,0.04,0.1,0.2,0.03,0.04,1,0,0\n"
                   "0,1,0.1,0.2,zero,0.04,1,0.1,0.2,0.03,0.04,0.1,0.2,0.03,0.04,1,0,0\n");
  snprintf(args, sizeof args, "check cartpole %s --device ref", path);
  cr_assert_eq(rltrain(args, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, ":3:") && strstr(out, "zero"), "%s", out);
  /* a row with a missing column */
  write_file(path, "episode,t,s0,s1,s2,s3,a0,next_s0,next_s1,next_s2,next_s3,obs0,obs1,obs2,obs3,reward,terminated,truncated\n"
                   "0,0,0.1,0.2,0.03,0.04,1,0.1,0.2,0.03,0.04,0.1,0.2,0.03,0.04,1,0\n");
  cr_assert_eq(rltrain(args, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, ":2:") && strstr(out, "17 columns"), "%s", out);
  /* an action the env does not have */
  write_file(path, "episode,t,s0,s1,s2,s3,a0,next_s0,next_s1,next_s2,next_s3,obs0,obs1,obs2,obs3,reward,terminated,truncated\n"
                   "0,0,0.1,0.2,0.03,0.04,2,0.1,0.2,0.03,0.04,0.1,0.2,0.03,0.04,1,0,0\n");
  cr_assert_eq(rltrain(args, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, ":2:") && strstr(out, "action"), "%s", out);
  /* no header */
  write_file(path, "0,0,0.1,0.2,0.03,0.04,1,0.1,0.2,0.03,0.04,0.1,0.2,0.03,0.04,1,0,0\n");
  cr_assert_eq(rltrain(args, out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, ":1:") && strstr(out, "header"), "%s", out);
  unlink(path);
  free(path);
}

Test(cli, a_file_for_another_env_unknown_envs_and_unreadable_files_are_clear_errors) {
  char args[2048];
  char path[1024];
  snprintf(path, sizeof path, "%s/cartpole.csv", GOLDEN_DIR);
  if (!access(path, R_OK)) {
    snprintf(args, sizeof args, "check pendulum '%s'", path);
    cr_assert_eq(rltrain(args, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, ":1:") && strstr(out, "18 columns") && strstr(out, "pendulum needs 13"), "%s", out);
  }
  cr_assert_eq(rltrain("check cartpool x.csv", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "unknown environment 'cartpool'") && strstr(out, "cartpole"), "%s", out);
  cr_assert_eq(rltrain("check cartpole /nonexistent/t.csv", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "cannot read '/nonexistent/t.csv'"), "%s", out);
  cr_assert_eq(rltrain("check cartpole", out, sizeof out), 2, "%s", out);
  cr_assert_eq(rltrain("check cartpole x.csv --device tpu", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "tpu"), "%s", out);
  cr_assert_eq(rltrain("record cartpole /tmp/x.csv --episodes 0", out, sizeof out), 2, "%s", out);
}

/* `rltrain compile --passes` lists the compiler's pass table, every row with its dialects,
 * precondition and switch; `compile cartpole --target c` ends with the kernels per graph. */
Test(cli, compile_lists_the_pass_table_and_the_kernels_per_graph, .timeout = LM_TIMEOUT(120)) {
  cr_assert_eq(rltrain("compile --passes", out, sizeof out), 0, "%s", out);
  static const char *const names[] = {"canonicalise", "lower", "search", "interchange", "epilogue", "merge", "join",
                                      "scan-fuse", "lanes", "inplace", "split", "columns", "lazy", "index", "gpu-workgroups",
                                      "finite"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char row[64];
    snprintf(row, sizeof row, "\n%s ", names[i]);
    cr_assert(strstr(out, row), "no row for %s:\n%s", names[i], out);
  }
  cr_assert(strstr(out, "LUMEN_NO_JOIN") && strstr(out, "LUMEN_NO_LAZY") && strstr(out, "LUMEN_NO_FINITE"),
            "switches missing:\n%s", out);
  cr_assert_eq(rltrain("compile --passes cartpole", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "--passes takes no ENV"), "%s", out);
  cr_assert_eq(rltrain("compile cartpole --target c", out, sizeof out), 0, "%s", out);
  const char *per = strstr(out, "kernels per graph: rollout 1 prep ");
  cr_assert(per && strstr(per, " update "), "no kernels per graph line:\n%s", out);
}

/* rltrain applies the tuning cache's decisions (its search log names them) unless
 * --search-budget 0; rltrain tune searches, times both schedules and keeps its decisions only when
 * the searched kernels trained faster, else puts the cache back byte for byte. Which way tune goes
 * depends on timings: each way is checked for what it must leave behind. Bad input is refused. */
static void cli_cache_text(const char *dir, char *text, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cat '%s'/search-*.txt 2>/dev/null", dir);
  shell(cmd, text, cap);
}

Test(cli, rltrain_applies_the_tuning_cache_and_tune_keeps_only_what_trains_faster, .timeout = LM_TIMEOUT(240)) {
  char dir[] = "/tmp/lumen-tune-XXXXXX", cmd[2048];
  cr_assert(mkdtemp(dir));
  cr_assert_eq(rltrain("tune --help", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "--budget"), "%s", out);
  cr_assert_eq(rltrain("tune", out, sizeof out), 2, "%s", out);
  cr_assert_eq(rltrain("tune cartpool", out, sizeof out), 2, "%s", out);
  cr_assert_eq(rltrain("tune cartpole --budget 0", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "--budget"), "%s", out);
  cr_assert_eq(rltrain("tune cartpole --budget", out, sizeof out), 2, "%s", out);
  cr_assert_eq(rltrain("tune cartpole --out x", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "writes no run"), "%s", out);
  cr_assert_eq(rltrain("tune cartpole --search-budget 3", out, sizeof out), 2, "%s", out);
  cr_assert_eq(rltrain("tune cartpole --envs 0", out, sizeof out), 2, "%s", out);
  /* a search fills the cache; a later run applies it, and --search-budget 0 does not look */
  static const char *const modes[] = {"--search-budget 5", "", "--search-budget 0"};
  for (int m = 0; m < 3; m++) {
    snprintf(cmd, sizeof cmd,
             "cd '%s' && LUMEN_CACHE_DIR='%s' LUMEN_SEARCH_LOG='%s/log%d.txt' '%s' cartpole --envs 8 --steps 16 "
             "--minibatches 2 --epochs 1 --hidden 16,16 --total-steps 256 --quiet --out run%d %s >/dev/null 2>&1; "
             "echo rc=$?; cat '%s/log%d.txt' 2>/dev/null",
             dir, dir, dir, m, RLTRAIN, m, modes[m], dir, m);
    shell(cmd, out, sizeof out);
    cr_assert(strstr(out, "rc=0"), "%s", out);
    if (m == 1) cr_assert(strstr(out, "the tuning cache's decisions only") && strstr(out, "from the cache"), "%s", out);
    if (m == 2) cr_assert(!strstr(out, "from the cache"), "--search-budget 0 applied the cache:\n%s", out);
  }
  static char was[1 << 16], now_[1 << 16];
  cli_cache_text(dir, was, sizeof was);
  cr_assert(strlen(was) > 0, "the search left no tuning cache in %s", dir);
  /* --no-keep: a measurement only, the cache put back whatever the times */
  snprintf(cmd, sizeof cmd,
           "LUMEN_CACHE_DIR='%s' '%s' tune cartpole --no-keep --budget 5 --envs 8 --steps 16 --minibatches 2 "
           "--epochs 1 --hidden 24,24 2>&1; echo tune_rc=$?", dir, RLTRAIN);
  shell(cmd, out, sizeof out);
  cr_assert(strstr(out, "tune_rc=0") && strstr(out, "--no-keep: the tuning cache"), "%s", out);
  cli_cache_text(dir, now_, sizeof now_);
  cr_assert_str_eq(now_, was, "tune --no-keep did not put the cache back:\n%s", out);
  snprintf(cmd, sizeof cmd,
           "LUMEN_CACHE_DIR='%s' '%s' tune cartpole --budget 5 --envs 8 --steps 16 --minibatches 2 --epochs 1 "
           "--hidden 24,24 2>&1; echo tune_rc=$?", dir, RLTRAIN);
  shell(cmd, out, sizeof out);
  cr_assert(strstr(out, "tune_rc=0"), "%s", out);
  cr_assert(strstr(out, "searched in ") && strstr(out, "one training iteration") && strstr(out, "default "),
            "%s", out);
  cli_cache_text(dir, now_, sizeof now_);
  if (strstr(out, "not faster")) cr_assert_str_eq(now_, was, "tune did not put the cache back:\n%s", out);
  else {
    cr_assert(strstr(out, "kept in the tuning cache"), "%s", out);
    cr_assert(strlen(now_) > strlen(was), "tune kept nothing in the cache:\n%s", out);
  }
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

Test(cli, unknown_envs_and_options_are_refused_and_help_and_version_work) {
  cr_assert_eq(rltrain("cartpole --help", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "--total-steps") && strstr(out, "--stepper"), "%s", out);
  cr_assert_eq(rltrain("cartpole --no-such-option 1", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "unknown option --no-such-option"), "%s", out);
  cr_assert_eq(rltrain("cartpole --envs zero", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "--envs needs a whole number"), "%s", out);
  cr_assert_eq(rltrain("nosuchenv", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "unknown environment"), "%s", out);
  cr_assert_eq(rltrain("--help", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "check ENV FILE.csv") && strstr(out, "record ENV FILE.csv") && strstr(out, "atol"), "%s", out);
  cr_assert_eq(rltrain("--version", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, lm_version()), "%s", out);
}

/* Every kind of bad input exits 2 at once with a message naming the option or file, before any
 * device is opened or anything is written: numbers parsed strictly (no fraction, no hex, no
 * wrap), full uint64 seeds, empty paths, stray arguments, settings that do not fit together,
 * a device file, a FIFO or a directory where a checkpoint is wanted, a bad --arch. */
Test(cli, bad_input_exits_2_naming_the_problem, .timeout = LM_TIMEOUT(120)) {
  char dir[] = "/tmp/lumen-badcli-XXXXXX";
  cr_assert(mkdtemp(dir));
  char fifo[64], args[256];
  snprintf(fifo, sizeof fifo, "%s/fifo.ckpt", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  const struct {
    const char *args, *says;
  } cases[] = {
      {"cartpole --envs 2.7", "--envs"},
      {"cartpole --envs 0x4", "--envs"},
      {"cartpole --envs 1e3", "--envs"},
      {"cartpole --steps ' 8'", "--steps"},
      {"cartpole --total-steps 0", "--total-steps"},
      {"cartpole --seed 18446744073709551616", "--seed"},
      {"cartpole --seed -1", "--seed"},
      {"cartpole --lr 1e400", "--lr"},
      {"cartpole --lr nan", "--lr"},
      {"cartpole --gamma 0x1p-1", "--gamma"},
      {"cartpole --minibatches 3", "minibatches"},
      {"cartpole --envs 16777216 --steps 1048576", "2^28"},
      {"cartpole --checkpoint-every 1.5", "--checkpoint-every"},
      {"cartpole extra", "unexpected argument 'extra'"},
      {"cartpole --out ''", "--out needs a path"},
      {"cartpole --resume ''", "--resume needs a path"},
      {"eval ''", "which checkpoint"},
      {"eval /dev/zero", "not a regular file"},
      {"eval /tmp", "latest.ckpt"},
      {"record cartpole x.csv --episodes 2.5", "--episodes"},
      {"record cartpole x.csv --seed 99999999999999999999", "--seed"},
      {"record cartpole ''", "FILE.csv"},
      {"view cartpole --seed 0x10", "--seed"},
      {"compile cartpole --target cuda --arch sm_bogus", "sm_bogus"},
  };
  char text[8192];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(args, sizeof args, "%s", cases[i].args);
    int rc = rltrain(args, text, sizeof text);
    cr_assert_eq(rc, 2, "rltrain %s exited %d:\n%s", args, rc, text);
    cr_assert(strstr(text, cases[i].says), "rltrain %s does not say '%s':\n%s", args, cases[i].says, text);
  }
  snprintf(args, sizeof args, "eval '%s'", fifo); /* would block for ever reading */
  cr_assert_eq(rltrain(args, text, sizeof text), 2, "%s", text);
  cr_assert(strstr(text, "regular file"), "%s", text);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* The step-N.ckpt files in dir/checkpoints (latest.ckpt aside); 1 with step-<last> among them. */
static int step_files(const char *dir, const char *last, int *has_last) {
  char cmd[256], text[256];
  snprintf(cmd, sizeof cmd, "ls '%s/checkpoints' | grep -c '^step-[0-9]*\\.ckpt$'", dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  int n = -1;
  cr_assert_eq(fscanf(f, "%d", &n), 1);
  pclose(f);
  snprintf(text, sizeof text, "%s/checkpoints/step-%s.ckpt", dir, last);
  *has_last = access(text, F_OK) == 0;
  return n;
}

/* --checkpoint-every K writes every K iterations exactly; by default every 10, but at least
 * 0.25 s apart (a checkpoint costs about a millisecond of training, and CartPole's iterations
 * take about one: cli_train.c), and the last iteration's always. settings.txt records the
 * spacing (0 where the interval was asked for). 30 iterations of 4 envs x 32 steps. */
Test(cli, default_checkpoints_are_spaced_and_an_asked_interval_is_exact, .timeout = LM_TIMEOUT(300)) {
  char dir[] = "/tmp/lumen-spacing-XXXXXX", args[512], path[256], text[8192];
  cr_assert(mkdtemp(dir));
  for (int asked = 0; asked < 2; asked++) {
    char run[64];
    snprintf(run, sizeof run, "%s/%s", dir, asked ? "asked" : "default");
    snprintf(args, sizeof args, "cartpole --device cpu --quiet --envs 4 --steps 32 --total-steps 3840 --no-stop%s --out '%s'",
             asked ? " --checkpoint-every 10" : "", run);
    cr_assert_eq(rltrain(args, text, sizeof text), 0, "%s", text);
    int last, n = step_files(run, "3840", &last);
    cr_assert(last, "%s: no checkpoint of the last iteration", run);
    if (asked) cr_assert_eq(n, 3, "--checkpoint-every 10 over 30 iterations wrote %d step files", n);
    else cr_assert(n >= 1 && n <= 3, "by default %d step files over 30 iterations", n);
    snprintf(path, sizeof path, "%s/settings.txt", run);
    char *settings = read_text(path);
    cr_assert(settings);
    const char *want = asked ? "checkpoint_spacing_s = 0\n" : "checkpoint_spacing_s = 0.25\n";
    cr_assert(strstr(settings, want), "%s has no '%s':\n%s", path, want, settings);
    free(settings);
  }
  snprintf(path, sizeof path, "rm -rf '%s'", dir);
  cr_assert_eq(system(path), 0);
}

/* Resume keeps the run's own settings and files straight: options that differ are refused by
 * name (exit 2) and nothing is written; without --total-steps the run's budget stays; a stale
 * checkpoint temp file from a killed run is removed; when latest.ckpt cannot be written the
 * step-N.ckpt written just before it goes too (never newer than latest); writes that fail
 * (log.csv or summary.json on a full disk, here /dev/full) end the run with exit 1 naming the
 * file. 16 envs: 2048 steps an iteration. */
Test(cli, resume_refuses_other_settings_keeps_the_budget_and_failed_writes_are_named, .timeout = LM_TIMEOUT(300)) {
  char dir[] = "/tmp/lumen-resume-XXXXXX", args[2048], path[2048], text[8192];
  cr_assert(mkdtemp(dir));
  snprintf(args, sizeof args, "cartpole --device cpu --quiet --envs 16 --total-steps 4096 --no-stop --out '%s'", dir);
  cr_assert_eq(rltrain(args, text, sizeof text), 0, "%s", text);
  snprintf(path, sizeof path, "%s/log.csv", dir);
  char *log = read_text(path);
  cr_assert(log);
  size_t rows = 0;
  for (const char *p = log; (p = strchr(p, '\n')); p++) rows++;
  free(log);
  cr_assert_eq(rows, 3, "header and 2 iterations expected, %zu lines", rows);
  /* another lr, another envs, --no-stop dropped is fine (the run's own rule), a differing interval is not */
  snprintf(args, sizeof args, "cartpole --device cpu --quiet --resume '%s' --lr 0.1 --envs 8", dir);
  cr_assert_eq(rltrain(args, text, sizeof text), 2, "%s", text);
  cr_assert(strstr(text, "lr = ") && strstr(text, "envs = 8"), "%s", text);
  snprintf(args, sizeof args, "cartpole --device cpu --quiet --resume '%s' --checkpoint-every 3", dir);
  cr_assert_eq(rltrain(args, text, sizeof text), 2, "%s", text);
  cr_assert(strstr(text, "checkpoint_every"), "%s", text);
  /* a stale temp file; a resume without --total-steps: the run is done, nothing more is trained */
  snprintf(path, sizeof path, "%s/checkpoints/step-2048.ckpt.tmp.99999", dir);
  FILE *f = fopen(path, "w");
  cr_assert(f);
  fputs("half a checkpoint", f);
  fclose(f);
  snprintf(args, sizeof args, "cartpole --device cpu --quiet --resume '%s'", dir);
  cr_assert_eq(rltrain(args, text, sizeof text), 0, "%s", text);
  cr_assert_neq(access(path, F_OK), 0, "the stale temp file is still there");
  snprintf(path, sizeof path, "%s/log.csv", dir);
  log = read_text(path);
  rows = 0;
  for (const char *p = log; (p = strchr(p, '\n')); p++) rows++;
  free(log);
  cr_assert_eq(rows, 3, "a resume without --total-steps trained on (%zu lines)", rows);
  /* latest.ckpt cannot be replaced (a non-empty directory in its place): the step-N written just
   * before it is removed, and the run ends with exit 1 */
  char second[128];
  snprintf(second, sizeof second, "%s/second", dir);
  snprintf(path, sizeof path, "mkdir -p '%s/latest.ckpt' && touch '%s/latest.ckpt/x'", second, second);
  cr_assert_eq(system(path), 0);
  snprintf(args, sizeof args, "cartpole --device cpu --quiet --envs 16 --total-steps 4096 --out '%s'", second);
  cr_assert_eq(rltrain(args, text, sizeof text), 1, "%s", text);
  cr_assert(strstr(text, "checkpoint failed"), "%s", text);
  snprintf(path, sizeof path, "%s/checkpoints/step-2048.ckpt", second);
  cr_assert_neq(access(path, F_OK), 0, "step-2048.ckpt is newer than latest.ckpt");
  /* writes that fail: log.csv on a full disk */
  char full[128];
  snprintf(full, sizeof full, "%s/full", dir);
  cr_assert_eq(mkdir(full, 0700), 0);
  snprintf(path, sizeof path, "%s/log.csv", full);
  cr_assert_eq(symlink("/dev/full", path), 0);
  snprintf(args, sizeof args, "cartpole --device cpu --quiet --envs 16 --total-steps 4096 --out '%s'", full);
  cr_assert_eq(rltrain(args, text, sizeof text), 1, "%s", text);
  cr_assert(strstr(text, "log.csv") && strstr(text, "No space left"), "%s", text);
  snprintf(path, sizeof path, "rm -rf '%s' && mkdir '%s' && ln -s /dev/full '%s/summary.json'", full, full, full);
  cr_assert_eq(system(path), 0);
  cr_assert_eq(rltrain(args, text, sizeof text), 1, "%s", text);
  cr_assert(strstr(text, "summary.json") && strstr(text, "No space left"), "%s", text);
  snprintf(args, sizeof args, "rm -rf '%s'", dir);
  cr_assert_eq(system(args), 0);
}

#endif /* LUMEN_ENVS_SLOW */
