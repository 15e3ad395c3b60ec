/* tests/test_minatar_breakout.c — MinAtar Breakout (envs/minatar_breakout.c) against the minatar
 * package 1.0.15's own transitions (../shared/golden/minatar_breakout.csv), bit for bit:
 * - every golden row through the graph on ref, on cpu, on opencl (PoCL) and on cuda (each
 *   device skipped with the reason when it cannot open), and through the scalar reference stepper: next state, obs,
 *   reward and terminated equal to MinAtar's in every bit; `rltrain check` with the env's zero
 *   tolerances passes on cpu and ref;
 * - the terminal state's early return (reward 0, state unchanged), which no golden row steps,
 *   and 4096 scrambled states (bricks anywhere on rows 1..3, an empty wall, strike set) on ref and cpu
 *   against the reference stepper, bit for bit;
 * - the reset graph draws what ref_reset draws, bit for bit, for 1024 envs on ref and cpu, and
 *   over 4096 resets each ball_start ((0, 2) or (9, 3)) comes up 50% +- 3%;
 * - random actions with auto-reset (lm_env_vec_step in a scan), the graph on cpu for 1024 envs x
 *   2000 steps (256 x 500 under AddressSanitizer, several times slower) and on ref and cpu for
 *   64 x 120 (32 x 60 under AddressSanitizer; ref and cpu meet at the full size in
 *   test_minatar_ref_slow.c),
 *   against the reference stepper driven by the same uniforms: identical episode counts,
 *   lengths and returns, and every step's reward and done flag and the final states bit for
 *   bit; the cpu compile time and env-only steps/s go to the log;
 * - lm_env_validate, the registry entry, and the draw list (fits LM_ENV_MAX_DRAW for any brick
 *   map, stops at a smaller cap). */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lumen/env.h"
#include "lumen/lumen.h"
#include "lumen/train.h"
#include "support/check.h"
#include "support/timeout.h"

#define GOLDEN LUMEN_SOURCE_DIR "/../shared/golden/minatar_breakout.csv"
#define INIT_RUN (1ull << 40) /* run index of the initial reset draws: never a step's run */

#if defined(LM_TEST_SANITIZED)
#define STATS_N 256 /* ASan + UBSan at -O0: several times slower */
#define STATS_T 500
#define REF_N 32
#define REF_T 60
#else
#define STATS_N 1024
#define STATS_T 2000
#define REF_N 64 /* the full size on ref: test_minatar_ref_slow.c */
#define REF_T 120
#endif

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

extern const lm_env_spec lm_env_minatar_breakout;

enum { S = 108, O = 400, BALL_X = 0, BALL_DIR = 2, TERMINAL = 7, BRICKS = 8 };

/* The env, registered in this process if the build's registry does not list it yet. */
static const lm_env_spec *breakout(void) {
  if (!lm_env_find("minatar-breakout")) OK(lm_env_register(&lm_env_minatar_breakout));
  const lm_env_spec *e = lm_env_find("MinAtar/Breakout-v0");
  cr_assert(e, "%s", lm_last_error());
  return e;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ================================================================ the golden transitions */

/* Columns: episode, t, state (108), a0, next state (108), obs (400), reward, terminated,
 * truncated; every value a small integer, exact as a float. */
typedef check_golden golden;

static golden golden_load(void) {
  golden gd;
  check_golden_load(GOLDEN, S, 1, O, 1, &gd);
  for (size_t r = 0; r < gd.rows; r++)
    cr_assert_eq(gd.truncated[r], 0.0f, "%s: line %zu is truncated (the recording has no time limit)", GOLDEN, r + 2);
  cr_assert_gt(gd.rows, 1000, "%s: only %zu rows", GOLDEN, gd.rows);
  return gd;
}

static void golden_free(golden *gd) { check_golden_free(gd); }

/* Each column of the results against MinAtar's, bit for bit, with the first row that differs. */
static void golden_compare(const char *who, const golden *gd, const float *next, const float *obs, const float *rew,
                           const float *term) {
  size_t n = gd->rows;
  for (size_t r = 0; r < n; r++) {
    for (size_t k = 0; k < S; k++)
      cr_assert(!memcmp(&next[r * S + k], &gd->next[r * S + k], sizeof *next),
                "%s, line %zu (action %g): next_s%zu = %a, MinAtar %g", who, r + 2, (double)gd->action[r], k,
                (double)next[r * S + k], (double)gd->next[r * S + k]);
    for (size_t k = 0; k < O; k++)
      cr_assert(!memcmp(&obs[r * O + k], &gd->obs[r * O + k], sizeof *obs), "%s, line %zu: obs%zu = %a, MinAtar %g", who,
                r + 2, k, (double)obs[r * O + k], (double)gd->obs[r * O + k]);
    cr_assert(!memcmp(&rew[r], &gd->reward[r], sizeof *rew), "%s, line %zu: reward %a, MinAtar %g", who, r + 2,
              (double)rew[r], (double)gd->reward[r]);
    cr_assert(!memcmp(&term[r], &gd->terminated[r], sizeof *term), "%s, line %zu: terminated %a, MinAtar %g", who,
              r + 2, (double)term[r], (double)gd->terminated[r]);
  }
}

/* What the golden rows cover, so that a file without the rare branches cannot pass unnoticed. */
static void golden_coverage(const golden *gd) {
  size_t bricks = 0, refills = 0, deaths = 0, side = 0, top = 0, under = 0, corner = 0, strike2 = 0;
  for (size_t r = 0; r < gd->rows; r++) {
    const float *s = gd->state + r * S, *x = gd->next + r * S;
    int before = 0, after = 0;
    for (int i = 0; i < 100; i++) before += s[BRICKS + i] != 0, after += x[BRICKS + i] != 0;
    bricks += gd->reward[r] != 0;
    refills += after > before;
    deaths += gd->terminated[r] != 0;
    side += (s[BALL_X] == 0 || s[BALL_X] == 9) && x[BALL_X] == s[BALL_X];
    top += s[1] == 0;
    int bounced = s[1] == 8 && s[BALL_DIR] >= 2 && x[1] == 8 && !gd->terminated[r]; /* off the paddle's row */
    under += bounced && s[BALL_X] == x[3];
    corner += bounced && s[BALL_X] != x[3];
    strike2 += s[4] != 0 && x[4] != 0; /* a brick hit right after another: no reward, no bounce */
  }
  cr_log_info("golden: %zu rows: %zu bricks broken, %zu refills, %zu deaths, %zu side bounces, %zu at the top, "
              "%zu bounces off the paddle under the ball and %zu off its corner, %zu brick hits while striking",
              gd->rows, bricks, refills, deaths, side, top, under, corner, strike2);
  cr_assert(bricks && refills && deaths && side && top && under && corner, "the golden rows miss a branch");
}

/* The graph's step + observe on `backend`, every row one env of one batch. */
static void golden_graph(const char *backend) {
  const lm_env_spec *e = breakout();
  golden gd = golden_load();
  char why[512] = "";
  lm_backend_t *b = lm_backend_open(backend, why, sizeof why);
  if (!b && (!strcmp(backend, "opencl") || !strcmp(backend, "cuda"))) { /* devices: skipped where absent */
    golden_free(&gd);
    fprintf(stderr, "test_minatar_breakout: SKIPPED: no %s device: %s\n", backend, lm_last_error());
    cr_skip_test("no %s device: %s", backend, lm_last_error());
  }
  cr_assert(b, "backend %s: %s", backend, lm_last_error());
  cr_assert_str_eq(lm_backend_name(b), backend, "%s", why);
  size_t n = gd.rows;
  float *next = check_floats(n * S), *obs = check_floats(n * O), *rew = check_floats(n), *term = check_floats(n);
  double t0 = now();
  OK(lm_env_step_batch(e, b, n, gd.state, gd.action, next, obs, rew, term));
  char who[64];
  snprintf(who, sizeof who, "the graph on %s", backend);
  golden_compare(who, &gd, next, obs, rew, term);
  cr_log_info("minatar-breakout, %s: %zu golden rows bit for bit (%.2f s with the compile)", who, n, now() - t0);
  free(next), free(obs), free(rew), free(term);
  lm_backend_free(b);
  golden_free(&gd);
}

Test(golden, graph_on_ref_replays_every_minatar_row_bit_for_bit, .timeout = LM_TIMEOUT(120)) { golden_graph("ref"); }
Test(golden, graph_on_cpu_replays_every_minatar_row_bit_for_bit, .timeout = LM_TIMEOUT(120)) { golden_graph("cpu"); }
Test(golden, graph_on_opencl_replays_every_minatar_row_bit_for_bit, .timeout = LM_TIMEOUT(300)) {
  golden_graph("opencl");
}
Test(golden, graph_on_cuda_replays_every_minatar_row_bit_for_bit, .timeout = LM_TIMEOUT(300)) { golden_graph("cuda"); }

Test(golden, reference_stepper_replays_every_minatar_row_bit_for_bit_and_the_rows_cover_every_branch) {
  const lm_env_spec *e = breakout();
  golden gd = golden_load();
  golden_coverage(&gd);
  size_t n = gd.rows;
  float *next = check_floats(n * S), *obs = check_floats(n * O), *rew = check_floats(n), *term = check_floats(n);
  for (size_t r = 0; r < n; r++) {
    memcpy(next + r * S, gd.state + r * S, S * sizeof *next);
    int t = -1;
    rew[r] = e->ref_step(next + r * S, gd.action + r, &t);
    term[r] = (float)t;
    e->ref_observe(next + r * S, obs + r * O);
  }
  golden_compare("the reference stepper", &gd, next, obs, rew, term);
  free(next), free(obs), free(rew), free(term);
  golden_free(&gd);
}

/* `rltrain check` (as a function: the env is registered in this process only) with the env's
 * zero tolerances: exit 0 and PASS on cpu and on ref. */
Test(golden, rltrain_check_passes_with_zero_tolerance_on_cpu_and_ref, .timeout = LM_TIMEOUT(180)) {
  const lm_env_spec *e = breakout();
  cr_assert(e->check_rtol == 0 && e->check_atol == 0 && e->reward_rtol == 0 && e->reward_atol == 0);
  if (access(GOLDEN, R_OK)) cr_skip_test("golden file %s not found", GOLDEN);
  static const char *const devices[] = {"cpu", "ref"};
  for (int d = 0; d < 2; d++) {
    char out[] = "/tmp/lumen-breakout-check-XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    fflush(stdout);
    int saved = dup(1);
    cr_assert(saved >= 0 && dup2(fd, 1) == 1);
    char *argv[] = {"rltrain", "check", "minatar-breakout", GOLDEN, "--device", (char *)devices[d]};
    int rc = lm_rltrain(6, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    cr_assert_gt(size, 0, "rltrain check on %s printed nothing", devices[d]);
    char *text = malloc((size_t)size + 1);
    cr_assert(text);
    ssize_t got = pread(fd, text, (size_t)size, 0);
    close(fd);
    unlink(out);
    text[got > 0 ? got : 0] = 0;
    const char *tail = text + (strlen(text) > 600 ? strlen(text) - 600 : 0); /* the per-column table is long */
    cr_log_info("rltrain check on %s (%zd bytes printed), its end:\n%s", devices[d], got, tail);
    cr_assert_eq(rc, 0, "rltrain check on %s exited %d; its output ends:\n%s", devices[d], rc, tail);
    cr_assert(strstr(text, "PASS") && !strstr(text, "FAIL"), "rltrain check on %s; its output ends:\n%s", devices[d],
              tail);
    free(text);
  }
}

/* ================================================================ the terminal state */

/* act() returns (0, True) at once for a terminal state: on the graph (ref and cpu) and the
 * reference stepper, the state stays as it was, bit for bit, with no reward. */
Test(step, a_terminal_state_returns_reward_0_and_stays_as_it_was) {
  const lm_env_spec *e = breakout();
  enum { N = 6 };
  float state[N * S], action[N];
  for (int i = 0; i < N; i++) {
    float *s = state + i * S;
    e->ref_reset(s, 7, (uint64_t)i, 0);
    /* a ball moving up just under the wall (a brick where its next move goes), one moving
     * down on row 9 beside the paddle */
    s[0] = (float)(i % 2 ? 9 : 2), s[1] = i % 4 < 2 ? 4 : 9, s[2] = (float)(i % 4), s[3] = 5, s[5] = s[0] - 1;
    s[6] = s[1] - 1, s[4] = (float)(i % 2), s[TERMINAL] = 1;
    action[i] = (float)i; /* every action */
  }
  static const char *const backends[] = {"ref", "cpu"};
  for (int k = 0; k < 2; k++) {
    lm_backend_t *b = lm_backend_new(backends[k]);
    cr_assert(b, "%s", lm_last_error());
    float next[N * S], obs[N * O], rew[N], term[N], want_obs[N * O];
    check_poison(next, N * S);
    OK(lm_env_step_batch(e, b, N, state, action, next, obs, rew, term));
    lm_backend_free(b);
    check_same_bits(backends[k], next, state, N * S);
    for (int i = 0; i < N; i++) {
      e->ref_observe(state + i * S, want_obs + i * O);
      cr_assert(rew[i] == 0 && term[i] == 1, "%s, env %d: reward %g terminated %g", backends[k], i, (double)rew[i],
                (double)term[i]);
    }
    check_same_bits("the observation of a terminal state", obs, want_obs, N * O);
  }
  for (int i = 0; i < N; i++) {
    float s[S];
    memcpy(s, state + i * S, sizeof s);
    int t = -1;
    cr_assert_eq(e->ref_step(s, action + i, &t), 0.0f);
    cr_assert_eq(t, 1);
    check_same_bits("the reference stepper", s, state + i * S, S);
  }
}

/* Scrambled states, every branch many times over (bricks anywhere on the wall's rows 1..3, the
 * only rows a reset and the steps put them on; an empty wall, strike set,
 * the ball anywhere above the bottom row, terminal states, every action): the graph on ref and
 * cpu steps each as the reference stepper does, bit for bit. */
Test(step, scrambled_states_step_on_ref_and_cpu_as_the_reference_stepper_bit_for_bit) {
  const lm_env_spec *e = breakout();
  enum { N = 4096 };
  check_rng rng = check_rng_new(23);
  float *state = check_floats((size_t)N * S), *action = check_floats(N);
  for (size_t i = 0; i < N; i++) {
    float *st = state + i * S;
    int kind = (int)(check_next(&rng) % 4); /* 0: no bricks, 1: sparse, 2: dense, 3: the start's rows */
    for (int c = 0; c < 100; c++) {
      double u = check_uniform(&rng, 0, 1);
      int wall = c >= 10 && c < 40; /* bricks live on rows 1..3 in every reachable state */
      st[BRICKS + c] = !wall || kind == 0 ? 0.0f : kind == 3 ? 1.0f : u < (kind == 1 ? 0.1 : 0.6);
    }
    st[0] = (float)(check_next(&rng) % 10), st[1] = (float)(check_next(&rng) % 9);
    st[2] = (float)(check_next(&rng) % 4), st[3] = (float)(check_next(&rng) % 10);
    st[4] = (float)(check_next(&rng) % 2);
    st[5] = (float)(check_next(&rng) % 10), st[6] = (float)(check_next(&rng) % 10);
    st[TERMINAL] = check_next(&rng) % 16 == 0;
    action[i] = (float)(check_next(&rng) % 6);
  }
  float *want = check_floats((size_t)N * S), *want_obs = check_floats((size_t)N * O), want_rew[N], want_term[N];
  for (size_t i = 0; i < N; i++) {
    memcpy(want + i * S, state + i * S, S * sizeof *want);
    int t = -1;
    want_rew[i] = e->ref_step(want + i * S, action + i, &t);
    want_term[i] = (float)t;
    e->ref_observe(want + i * S, want_obs + i * O);
  }
  static const char *const backends[] = {"ref", "cpu"};
  for (int k = 0; k < 2; k++) {
    lm_backend_t *b = lm_backend_new(backends[k]);
    cr_assert(b, "%s", lm_last_error());
    float *next = check_floats((size_t)N * S), *obs = check_floats((size_t)N * O), rew[N], term[N];
    OK(lm_env_step_batch(e, b, N, state, action, next, obs, rew, term));
    lm_backend_free(b);
    char what[64];
    snprintf(what, sizeof what, "%s: next states", backends[k]);
    check_same_bits(what, next, want, (size_t)N * S);
    snprintf(what, sizeof what, "%s: observations", backends[k]);
    check_same_bits(what, obs, want_obs, (size_t)N * O);
    snprintf(what, sizeof what, "%s: rewards", backends[k]);
    check_same_bits(what, rew, want_rew, N);
    snprintf(what, sizeof what, "%s: terminated", backends[k]);
    check_same_bits(what, term, want_term, N);
    free(next), free(obs);
  }
  free(state), free(action), free(want), free(want_obs);
}

/* ================================================================ resets */

Test(reset, graph_draws_what_ref_reset_draws_bit_for_bit_and_each_ball_start_half_the_time) {
  const lm_env_spec *e = breakout();
  enum { N = 4096, SAME = 1024 };
  static const char *const backends[] = {"ref", "cpu"};
  float *want = check_floats((size_t)N * S);
  for (size_t i = 0; i < N; i++) e->ref_reset(want + i * S, 11, i, 3);
  for (int k = 0; k < 2; k++) {
    lm_backend_t *b = lm_backend_new(backends[k]);
    cr_assert(b, "%s", lm_last_error());
    size_t n = k ? SAME : N;
    lm_env_stepper *st = lm_env_stepper_new(e, b, n);
    cr_assert(st, "%s", lm_last_error());
    float *got = check_floats(n * S);
    OK(lm_env_stepper_reset(st, 11, 3, got));
    char what[64];
    snprintf(what, sizeof what, "reset graph on %s vs ref_reset, %zu envs", backends[k], n);
    check_same_bits(what, got, want, n * S);
    free(got);
    lm_env_stepper_free(st);
    lm_backend_free(b);
  }
  size_t right = 0;
  for (size_t i = 0; i < N; i++) {
    const float *s = want + i * S;
    int r = s[BALL_X] == 9;
    cr_assert(r ? s[BALL_DIR] == 3 : s[BALL_X] == 0 && s[BALL_DIR] == 2, "env %zu: ball (%g, dir %g)", i,
              (double)s[BALL_X], (double)s[BALL_DIR]);
    cr_assert(s[1] == 3 && s[3] == 4 && s[4] == 0 && s[5] == s[0] && s[6] == 3 && s[TERMINAL] == 0, "env %zu", i);
    for (int c = 0; c < 100; c++)
      cr_assert_eq(s[BRICKS + c], c >= 10 && c < 40 ? 1.0f : 0.0f, "env %zu: brick %d", i, c);
    right += (size_t)r;
  }
  double p = (double)right / N;
  cr_log_info("ball_start = 1 (x 9, dir 3) in %zu of %d resets (%.4f)", right, N, p);
  cr_assert(fabs(p - 0.5) <= 0.03, "ball_start = 1 in %.4f of %d resets", p, N);
}

/* ================================================================ random play with auto-reset */

typedef struct stats {
  long episodes;   /* finished */
  double ret, len; /* summed over finished episodes */
  double all;      /* every reward of the run */
} stats;

typedef struct acc {
  double ret, len;
} acc;

static void acc_step(stats *st, acc *a, float r, int done) {
  st->all += r;
  a->ret += r, a->len += 1;
  if (!done) return;
  st->episodes++, st->ret += a->ret, st->len += a->len;
  a->ret = a->len = 0;
}

/* One run of n envs x T steps: the statistics, every step's reward and done flag ([T, n]) and
 * the final states. */
typedef struct run {
  stats st;
  float *reward, *done, *state;
} run;

static void run_free(run *r) { free(r->reward), free(r->done), free(r->state); }

static run run_new(int64_t n, int64_t T) {
  run r = {{0}, check_floats((size_t)(n * T)), check_floats((size_t)(n * T)), check_floats((size_t)n * S)};
  return r;
}

static void run_stats(run *r, int64_t n, int64_t T) {
  acc *a = calloc((size_t)n, sizeof *a);
  cr_assert(a);
  for (int64_t t = 0; t < T; t++)
    for (int64_t i = 0; i < n; i++) {
      size_t c = (size_t)(t * n + i);
      cr_assert((r->done[c] == 0 || r->done[c] == 1) && (r->reward[c] == 0 || r->reward[c] == 1),
                "step %lld env %lld: reward %g done %g", (long long)t, (long long)i, (double)r->reward[c],
                (double)r->done[c]);
      acc_step(&r->st, &a[i], r->reward[c], r->done[c] != 0);
    }
  free(a);
}

/* Random actions + lm_env_vec_step as a scan of T steps on `backend`, promising finite values;
 * env i starts from ref_reset(seed, i, INIT_RUN), step t draws with run counter t. */
static run run_graph(const lm_env_spec *e, const char *backend, int64_t n, int64_t T, uint64_t seed) {
  lm_graph_t *g = lm_graph_new();
  lm_graph_promise_finite(g); /* as the env's own programs (lm_env_spec.finite): ref checks it */
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  OK(lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs));
  OK(lm_output(vs.reward, "reward"));
  OK(lm_output(lm_maximum(vs.terminated, vs.truncated), "done"));
  lm_backend_t *b = lm_backend_new(backend);
  cr_assert(b, "%s", lm_last_error());
  double t0 = now();
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "scan on %s: %s", backend, lm_last_error());
  double t1 = now();
  lm_graph_free(g);
  OK(lm_program_bind(p, "N", n));
  OK(lm_program_bind(p, "T", T));
  lm_program_set_seed(p, seed);
  run r = run_new(n, T);
  for (int64_t i = 0; i < n; i++) e->ref_reset(r.state + i * S, seed, (uint64_t)i, INIT_RUN);
  OK(lm_program_write(p, "state", r.state, (size_t)n * S));
  double t2 = now();
  OK(lm_program_run(p));
  double t3 = now();
  size_t cells = (size_t)(n * T);
  OK(lm_program_read(p, "reward", r.reward, cells));
  OK(lm_program_read(p, "done", r.done, cells));
  check_poison(r.state, (size_t)n * S);
  OK(lm_program_read(p, "state", r.state, (size_t)n * S));
  lm_program_stats ps = {0};
  OK(lm_program_get_stats(p, &ps));
  cr_log_info("minatar-breakout on %s: scan compiled in %.2f s (%d kernels); %lld envs x %lld steps in %.2f s: "
              "%.3g env steps/s (random actions, auto-reset, rewards and done flags written)",
              backend, t1 - t0, ps.kernels, (long long)n, (long long)T, t3 - t2, (double)cells / (t3 - t2));
  run_stats(&r, n, T);
  lm_program_free(p);
  lm_backend_free(b);
  return r;
}

/* The same run on the reference stepper, with the same action and reset draws, observations
 * checked against the env's bounds (the first 64 envs'), and every state's bricks on the wall's
 * rows 1..3 only (the graph reads and writes those rows alone). */
static run run_reference(const lm_env_spec *e, int64_t n, int64_t T, uint64_t seed) {
  size_t N = (size_t)n;
  run r = run_new(n, T);
  float *o = check_floats(O);
  int *steps = calloc(N, sizeof *steps);
  cr_assert(steps);
  for (size_t i = 0; i < N; i++) e->ref_reset(r.state + i * S, seed, i, INIT_RUN);
  for (int64_t t = 0; t < T; t++)
    for (size_t i = 0; i < N; i++) {
      float act, *s = r.state + i * S;
      lm_env_ref_random_action(e, seed, i, (uint64_t)t, &act);
      int term = -1;
      r.reward[(size_t)t * N + i] = e->ref_step(s, &act, &term);
      int off_wall = 0;
      for (int c = 0; c < 100; c++) off_wall += (c < 10 || c >= 40) && s[BRICKS + c] != 0;
      cr_assert(!off_wall, "env %zu, step %lld: %d bricks off the wall's rows 1..3", i, (long long)t, off_wall);
      if (i < 64) { /* the observations of the first 64 envs, checked against the bounds */
        e->ref_observe(s, o);
        for (int k = 0; k < O; k++) cr_assert(o[k] >= e->obs_low[k] && o[k] <= e->obs_high[k]);
      }
      int done = term || ++steps[i] >= e->time_limit;
      r.done[(size_t)t * N + i] = (float)done;
      if (done) steps[i] = 0, e->ref_reset(s, seed, i, (uint64_t)t);
    }
  run_stats(&r, n, T);
  free(o), free(steps);
  return r;
}

static void expect_same_run(const char *who, const run *got, const run *want, int64_t n, int64_t T) {
  cr_assert(got->st.episodes == want->st.episodes && got->st.ret == want->st.ret && got->st.len == want->st.len &&
                got->st.all == want->st.all,
            "%s: %ld episodes, return sum %.0f, length sum %.0f, rewards %.0f; reference stepper %ld, %.0f, %.0f, %.0f",
            who, got->st.episodes, got->st.ret, got->st.len, got->st.all, want->st.episodes, want->st.ret,
            want->st.len, want->st.all);
  char what[128];
  snprintf(what, sizeof what, "%s: rewards of every step vs the reference stepper", who);
  check_same_bits(what, got->reward, want->reward, (size_t)(n * T));
  snprintf(what, sizeof what, "%s: done flags of every step vs the reference stepper", who);
  check_same_bits(what, got->done, want->done, (size_t)(n * T));
  snprintf(what, sizeof what, "%s: the final states vs the reference stepper", who);
  check_same_bits(what, got->state, want->state, (size_t)n * S);
}

static void random_play(const char *const *backends, int nb, int64_t n, int64_t T) {
  const lm_env_spec *e; /* the reference side applies the agent's action as it is: no sticky actions */
  OK(lm_env_configure(breakout(), "sticky=0", &e));
  uint64_t seed = 0xb4ea6u;
  run want = run_reference(e, n, T, seed);
  const stats *w = &want.st;
  cr_log_info("reference stepper, %lld envs x %lld steps: %ld episodes, mean length %.3f, mean return %.4f, %.0f "
              "rewards",
              (long long)n, (long long)T, w->episodes, w->len / (double)w->episodes, w->ret / (double)w->episodes,
              w->all);
  cr_assert_gt(w->episodes, n, "too few episodes finished");
  cr_assert_gt(w->ret, 0, "no brick was ever broken");
  for (int k = 0; k < nb; k++) {
    run got = run_graph(e, backends[k], n, T, seed);
    expect_same_run(backends[k], &got, &want, n, T);
    run_free(&got);
  }
  run_free(&want);
}

/* cpu at the size; ref (an interpreter: about 1.5e4 env steps/s for this env, two minutes
 * for 2M) on a smaller run that cpu repeats, and at the full size in test_minatar_ref_slow.c */
Test(random_play, graph_on_cpu_1024_envs_x_2000_steps_with_auto_reset_steps_as_the_reference_stepper_bit_for_bit,
     .timeout = LM_TIMEOUT(300)) {
  random_play((const char *const[]){"cpu"}, 1, STATS_N, STATS_T);
}

Test(random_play, graph_on_ref_and_cpu_64_envs_x_120_steps_with_auto_reset_step_as_the_reference_stepper_bit_for_bit,
     .timeout = LM_TIMEOUT(300)) {
  random_play((const char *const[]){"ref", "cpu"}, 2, REF_N, REF_T);
}

/* ================================================================ the spec */

Test(spec, validates_and_is_found_by_name_and_gym_id) {
  const lm_env_spec *e = breakout();
  OK(lm_env_validate(e));
  cr_assert_eq(lm_env_find("MINATAR-BREAKOUT"), e);
  cr_assert_eq(e->state_size, S);
  cr_assert_eq(e->obs_size, O);
  cr_assert(e->action.kind == LM_SPACE_DISCRETE && e->action.n == 6);
  for (int k = 0; k < O; k++) cr_assert(e->obs_low[k] == 0 && e->obs_high[k] == 1, "obs bound %d", k);
}

/* A brick map of every other cell, on all ten rows: 50 runs, the most a map can have. */
Test(draw, fits_the_draw_limit_for_any_brick_map_and_stops_at_a_smaller_cap) {
  const lm_env_spec *e = breakout();
  float s[S];
  e->ref_reset(s, 1, 0, 0);
  lm_draw_cmd cmds[LM_ENV_MAX_DRAW];
  int n = e->draw(s, cmds, LM_ENV_MAX_DRAW);
  cr_assert_eq(n, 1 + 3 + 3, "a fresh game: background, paddle, ball, trail and 3 brick rows, got %d", n);
  for (int i = 0; i < n; i++)
    cr_assert(cmds[i].kind == LM_DRAW_RECT && cmds[i].x0 >= e->world[0] && cmds[i].x1 <= e->world[2] &&
              cmds[i].y0 >= e->world[1] && cmds[i].y1 <= e->world[3] && cmds[i].x0 < cmds[i].x1 &&
              cmds[i].y0 < cmds[i].y1, "command %d outside the world box", i);
  for (int c = 0; c < 100; c++) s[BRICKS + c] = (float)((c + c / 10) % 2);
  n = e->draw(s, cmds, LM_ENV_MAX_DRAW);
  cr_assert_eq(n, 1 + 3 + 50);
  cr_assert_eq(e->draw(s, cmds, 5), 5);
  cr_assert_eq(e->draw(s, cmds, 0), 0);
}
