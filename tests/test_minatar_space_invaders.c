/* tests/test_minatar_space_invaders.c — MinAtar Space Invaders (envs/minatar_space_invaders.c)
 * against the minatar package's own game (../shared/golden/minatar_space_invaders.csv, skipped
 * with a message when absent), with zero tolerance: every value is a small integer.
 * - every golden row, one transition each, through the graph on ref, on cpu and on opencl (PoCL;
 *   skipped with a message when no OpenCL device opens) and through the scalar reference stepper:
 *   next state, observation, reward and terminated equal bit for bit; `rltrain check` on cpu
 *   passes on the file;
 * - a terminal state steps to itself with reward 0 (act()'s early return), graph and reference;
 * - the reset graph (deterministic: it draws nothing) equals ref_reset for 1024 envs, ref and cpu;
 * - random actions with auto-reset as a scan (lm_env_vec_step), 1024 envs x 2000 steps on cpu and
 *   the first 64 envs x 160 steps on ref (the full run, three minutes there, is in
 *   test_minatar_ref_slow.c), against
 *   the reference stepper driven by the same action draws: identical per-step rewards and
 *   terminations and final states bit for bit, hence identical episode statistics;
 * - the scanned step (random actions, auto-reset) is one kernel on cpu;
 * - the env passes lm_env_validate; the draw list stays inside the world box and within cap.
 * The env is not in the registry yet: each test registers it first. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lumen/env.h"
#include "lumen/lumen.h"
#include "support/check.h"
#include "support/timeout.h"

#define GOLDEN LUMEN_SOURCE_DIR "/../shared/golden/minatar_space_invaders.csv"
#define INIT_RUN (1ull << 40) /* run index of the initial reset draws: never a step's run */

/* Random play with auto-reset: 1024 envs x 2000 steps on cpu; on ref (an interpreter, about 1e4
 * env-steps/s for this step) the first 64 envs for 160 steps. Under ASan both smaller. */
#if defined(LM_TEST_SANITIZED)
enum { STATS_N = 256, STATS_T = 500, REF_N = 16, REF_T = 80 };
#else
enum { STATS_N = 1024, STATS_T = 2000, REF_N = 64, REF_T = 160 };
#endif

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

extern const lm_env_spec lm_env_minatar_space_invaders;

static const lm_env_spec *env(void) {
  if (!lm_env_find("minatar-space-invaders")) OK(lm_env_register(&lm_env_minatar_space_invaders));
  const lm_env_spec *e = lm_env_find("minatar-space-invaders");
  cr_assert(e, "%s", lm_last_error());
  return e;
}

/* ================================================================ golden transitions */

enum { S = 308, O = 600 };

typedef check_golden golden;

/* 1 with the file read (the test is skipped when it is not there) */
static int golden_load(golden *gd) {
  check_golden_load(GOLDEN, S, 1, O, 1, gd);
  for (size_t r = 0; r < gd->rows; r++)
    cr_assert_eq(gd->truncated[r], 0.0f, "%s: line %zu is truncated (MinAtar has no time limit)", GOLDEN, r + 2);
  cr_assert_gt(gd->rows, 1000, "%s: only %zu rows", GOLDEN, gd->rows);
  return 1;
}

static void golden_free(golden *gd) { check_golden_free(gd); }

/* Steps n envs from `state` with `action` on a backend ("ref", "cpu", an opened backend via b)
 * or, for b == NULL, the scalar reference stepper. */
static void step_all(const lm_env_spec *e, lm_backend_t *b, size_t n, const float *state, const float *action,
                     float *next, float *obs, float *reward, float *terminated) {
  if (b) {
    OK(lm_env_step_batch(e, b, n, state, action, next, obs, reward, terminated));
    return;
  }
  for (size_t r = 0; r < n; r++) {
    memcpy(next + r * S, state + r * S, S * sizeof *next);
    int t = -1;
    reward[r] = e->ref_step(next + r * S, action + r, &t);
    terminated[r] = (float)t;
    e->ref_observe(next + r * S, obs + r * O);
  }
}

/* got and want hold equal floats: counts the rows that differ, fails naming the first one and
 * its first column. */
static void same_rows(const char *who, const char *what, const float *got, const float *want, size_t rows,
                      size_t width) {
  size_t bad = 0, first = 0, col = 0;
  for (size_t r = 0; r < rows; r++)
    for (size_t k = 0; k < width; k++)
      if (got[r * width + k] != want[r * width + k]) {
        if (!bad++) first = r, col = k;
        break;
      }
  cr_assert_eq(bad, 0, "%s: %s differs on %zu of %zu rows, the first on line %zu, column %zu: %g, want %g", who, what,
               bad, rows, first + 2, col, (double)got[first * width + col], (double)want[first * width + col]);
}

static void golden_check(const char *who, lm_backend_t *b) {
  const lm_env_spec *e = env();
  golden gd;
  if (!golden_load(&gd)) return;
  size_t n = gd.rows;
  float *next = check_floats(n * S), *obs = check_floats(n * O), *rew = check_floats(n), *term = check_floats(n);
  step_all(e, b, n, gd.state, gd.action, next, obs, rew, term);
  same_rows(who, "the next state", next, gd.next, n, S);
  same_rows(who, "the observation", obs, gd.obs, n, O);
  same_rows(who, "the reward", rew, gd.reward, n, 1);
  same_rows(who, "terminated", term, gd.terminated, n, 1);
  size_t rewarded = 0, ended = 0;
  for (size_t r = 0; r < n; r++) rewarded += rew[r] != 0, ended += term[r] != 0;
  cr_log_info("%s: %zu golden rows bit for bit (%zu rewarded, %zu terminating)", who, n, rewarded, ended);
  free(next), free(obs), free(rew), free(term);
  golden_free(&gd);
}

static void golden_on(const char *backend) {
  char why[512] = "";
  lm_backend_t *b = lm_backend_open(backend, why, sizeof why);
  cr_assert(b, "backend %s: %s", backend, lm_last_error());
  golden_check(backend, b);
  lm_backend_free(b);
}

Test(golden, every_row_replays_bit_for_bit_through_the_graph_on_ref) { golden_on("ref"); }
Test(golden, every_row_replays_bit_for_bit_through_the_graph_on_cpu) { golden_on("cpu"); }
Test(golden, every_row_replays_bit_for_bit_through_the_reference_stepper) { golden_check("reference", NULL); }

Test(golden, every_row_replays_bit_for_bit_through_the_graph_on_opencl, .timeout = LM_TIMEOUT(300)) {
  env();
  char why[512] = "";
  lm_backend_t *b = lm_backend_open("opencl", why, sizeof why);
  if (!b) {
    fprintf(stderr, "test_minatar_space_invaders: SKIPPED: no OpenCL backend: %s\n", lm_last_error());
    cr_skip_test("no OpenCL backend: %s", lm_last_error());
    return;
  }
  golden_check("opencl", b);
  lm_backend_free(b);
}

/* `rltrain check` with the env's zero tolerances: exit 0 and PASS on stdout. */
Test(golden, rltrain_check_on_cpu_passes_with_zero_tolerance) {
  env();
  if (access(GOLDEN, R_OK)) {
    fprintf(stderr, "test_minatar_space_invaders: SKIPPED: golden file %s not found\n", GOLDEN);
    cr_skip_test("golden file %s not found", GOLDEN);
  }
  char out[] = "/tmp/lumen-si-check-XXXXXX";
  int fd = mkstemp(out);
  cr_assert(fd >= 0);
  fflush(stdout);
  int saved = dup(1);
  cr_assert(saved >= 0 && dup2(fd, 1) >= 0);
  char *argv[] = {"rltrain", "check", "minatar-space-invaders", GOLDEN, "--device", "cpu"};
  int rc = lm_rltrain(6, argv);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  FILE *f = fdopen(fd, "r");
  cr_assert(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  char *text = malloc((size_t)size + 1);
  cr_assert(text && size > 0);
  size_t got = fread(text, 1, (size_t)size, f);
  text[got] = 0;
  fclose(f);
  unlink(out);
  /* one line per column (over 1200): the log keeps the last line, the verdict */
  const char *last = text + got;
  while (last > text && last[-1] == '\n') last--;
  while (last > text && last[-1] != '\n') last--;
  cr_log_info("rltrain check (%zu bytes of output) ends: %s", got, last);
  cr_assert_eq(rc, 0, "rltrain check exited %d:\n%s", rc, text);
  cr_assert(!strncmp(last, "PASS", 4), "rltrain check did not end with PASS:\n%s", text);
  free(text);
}

/* act() returns 0 and leaves everything as it was once terminal: the golden rows' states made
 * terminal (they hold terminal = 0 before every step) step to themselves. */
Test(terminal, a_terminal_state_steps_to_itself_with_reward_0_in_graph_and_reference) {
  const lm_env_spec *e = env();
  golden gd;
  if (!golden_load(&gd)) return;
  size_t n = gd.rows;
  for (size_t r = 0; r < n; r++) gd.state[r * S + 7] = 1.0f;
  float *next = check_floats(n * S), *obs = check_floats(n * O), *rew = check_floats(n), *term = check_floats(n), *want_obs = check_floats(n * O);
  float *zeros = calloc(n, sizeof *zeros), *ones = malloc(n * sizeof *ones);
  cr_assert(zeros && ones);
  for (size_t r = 0; r < n; r++) ones[r] = 1.0f, e->ref_observe(gd.state + r * S, want_obs + r * O);
  static const char *const who[] = {"ref", "cpu", "reference"};
  for (int i = 0; i < 3; i++) {
    lm_backend_t *b = i < 2 ? lm_backend_new(who[i]) : NULL;
    cr_assert(i == 2 || b, "%s", lm_last_error());
    step_all(e, b, n, gd.state, gd.action, next, obs, rew, term);
    lm_backend_free(b);
    same_rows(who[i], "the state after a terminal step", next, gd.state, n, S);
    same_rows(who[i], "the observation after a terminal step", obs, want_obs, n, O);
    same_rows(who[i], "the reward of a terminal step", rew, zeros, n, 1);
    same_rows(who[i], "terminated after a terminal step", term, ones, n, 1);
  }
  free(next), free(obs), free(rew), free(term), free(want_obs), free(zeros), free(ones);
  golden_free(&gd);
}

/* ================================================================ reset */

Test(reset, the_reset_graph_equals_ref_reset_for_1024_envs_on_ref_and_cpu) {
  const lm_env_spec *e = env();
  enum { N = 1024 };
  float *want = check_floats((size_t)N * S), *got = check_floats((size_t)N * S);
  for (size_t i = 0; i < N; i++) e->ref_reset(want + i * S, 7, i, 3);
  /* reset(): pos 5, alien_dir -1, intervals and timers 12, 12, 10, the 4x6 wave at rows 0-3,
   * columns 2-7, nothing else */
  float aliens = 0;
  for (int k = 8; k < 108; k++) aliens += want[k];
  cr_assert(want[0] == 5 && want[1] == -1 && want[2] == 12 && want[3] == 12 && want[4] == 10 && aliens == 24 &&
                want[8 + 2] == 1 && want[8 + 3 * 10 + 7] == 1 && want[8 + 1] == 0,
            "ref_reset is not MinAtar's reset");
  static const char *const backends[] = {"ref", "cpu"};
  for (int i = 0; i < 2; i++) {
    lm_backend_t *b = lm_backend_new(backends[i]);
    cr_assert(b, "%s", lm_last_error());
    lm_env_stepper *st = lm_env_stepper_new(e, b, N);
    cr_assert(st, "%s", lm_last_error());
    check_poison(got, (size_t)N * S);
    OK(lm_env_stepper_reset(st, 7, 3, got));
    cr_assert_eq(memcmp(got, want, (size_t)N * S * sizeof *got), 0, "%s: the reset graph differs from ref_reset",
                 backends[i]);
    lm_env_stepper_free(st);
    lm_backend_free(b);
  }
  free(want), free(got);
}

/* ================================================================ random play with auto-reset */

typedef struct run_out {
  float *reward, *terminated, *state; /* [T, N], [T, N], [N, S] */
  long episodes;
  double return_sum;
} run_out;

static void run_stats(run_out *o, size_t n, size_t T) {
  o->episodes = 0, o->return_sum = 0;
  for (size_t c = 0; c < n * T; c++) o->episodes += o->terminated[c] != 0, o->return_sum += o->reward[c];
}

/* Random actions + lm_env_vec_step as a scan of T steps on `backend` (check_random_play), every
 * env starting from its reset. */
static run_out run_graph(const lm_env_spec *e, const char *backend, size_t n, size_t T, uint64_t seed) {
  run_out o = {check_floats(n * T), check_floats(n * T), check_floats(n * S), 0, 0};
  for (size_t i = 0; i < n; i++) e->ref_reset(o.state + i * S, seed, i, INIT_RUN);
  check_random_play(e, backend, n, T, seed, o.state, o.reward, o.terminated);
  run_stats(&o, n, T);
  return o;
}

/* The same with the reference stepper: step t's actions drawn as the graph draws them
 * (lm_env_ref_random_action, run t); the time limit and auto-reset done here. */
static run_out run_reference(const lm_env_spec *e, size_t n, size_t T, uint64_t seed) {
  run_out o = {check_floats(n * T), check_floats(n * T), check_floats(n * S), 0, 0};
  float obs[O];
  int *steps = calloc(n, sizeof *steps);
  cr_assert(steps);
  for (size_t i = 0; i < n; i++) e->ref_reset(o.state + i * S, seed, i, INIT_RUN);
  for (size_t t = 0; t < T; t++)
    for (size_t i = 0; i < n; i++) {
      float a, *s = o.state + i * S;
      lm_env_ref_random_action(e, seed, i, t, &a);
      int term = -1;
      o.reward[t * n + i] = e->ref_step(s, &a, &term);
      o.terminated[t * n + i] = (float)term;
      e->ref_observe(s, obs);
      for (int k = 0; k < O; k++)
        cr_assert(obs[k] == 0 || obs[k] == 1, "env %zu step %zu: obs[%d] = %g", i, t, k, (double)obs[k]);
      if (term || ++steps[i] >= e->time_limit) steps[i] = 0, e->ref_reset(s, seed, i, t);
    }
  free(steps);
  run_stats(&o, n, T);
  return o;
}

static void run_free(run_out *o) { free(o->reward), free(o->terminated), free(o->state); }

static void expect_same_run(const char *who, const run_out *got, const run_out *want, size_t n, size_t T) {
  same_rows(who, "the per-step rewards", got->reward, want->reward, T, n);
  same_rows(who, "the per-step terminations", got->terminated, want->terminated, T, n);
  same_rows(who, "the final states", got->state, want->state, n, S);
  cr_assert(got->episodes == want->episodes && got->return_sum == want->return_sum,
            "%s: %ld episodes, return sum %g; reference %ld, %g", who, got->episodes, got->return_sum, want->episodes,
            want->return_sum);
  cr_log_info("%s, %zu envs x %zu steps: %ld episodes, return sum %.0f (mean %.3f), as the reference stepper", who, n,
              T, got->episodes, got->return_sum, got->return_sum / (double)got->episodes);
}

#define STATS_SEED 0x51u

/* the env without sticky actions: the reference side applies the agent's action as it is */
static const lm_env_spec *unsticky(void) {
  const lm_env_spec *e;
  OK(lm_env_configure(env(), "sticky=0", &e));
  return e;
}

Test(stats, random_play_with_auto_reset_on_cpu_gives_the_reference_steppers_episodes_bit_for_bit,
     .timeout = LM_TIMEOUT(300)) {
  const lm_env_spec *e = unsticky();
  run_out want = run_reference(e, STATS_N, STATS_T, STATS_SEED);
  cr_assert_gt(want.episodes, (long)STATS_N, "only %ld episodes ended", want.episodes);
  run_out got = run_graph(e, "cpu", STATS_N, STATS_T, STATS_SEED);
  expect_same_run("cpu", &got, &want, STATS_N, STATS_T);
  run_free(&got);
  run_free(&want);
}

/* The same streams on ref for the first REF_N envs and REF_T steps: the reference stepper's run
 * of that size is the cpu test's run cut to it (each env's draws depend on its index and the step
 * alone), so ref and cpu agree with each other too. */
Test(stats, random_play_with_auto_reset_on_ref_gives_the_reference_steppers_episodes_bit_for_bit,
     .timeout = LM_TIMEOUT(300)) {
  const lm_env_spec *e = unsticky();
  run_out want = run_reference(e, REF_N, REF_T, STATS_SEED);
  run_out big = run_reference(e, STATS_N, REF_T, STATS_SEED);
  for (size_t t = 0; t < REF_T; t++) {
    cr_assert_eq(memcmp(want.reward + t * REF_N, big.reward + t * STATS_N, REF_N * sizeof(float)), 0);
    cr_assert_eq(memcmp(want.terminated + t * REF_N, big.terminated + t * STATS_N, REF_N * sizeof(float)), 0);
  }
  cr_assert_gt(want.episodes, (long)REF_N, "only %ld episodes ended", want.episodes);
  run_out got = run_graph(e, "ref", REF_N, REF_T, STATS_SEED);
  expect_same_run("ref", &got, &want, REF_N, REF_T);
  run_free(&got);
  run_free(&big);
  run_free(&want);
}

/* ================================================================ one kernel */

/* envs/minatar_space_invaders.c keeps every read of the step inside its own env's row of the
 * state (its helpers' comment), so the cpu compiler fuses the whole scanned step, random actions
 * and auto-reset included, into one kernel: a read it could not prove env-local would split it
 * into a kernel per step and stage (5 per step when this was first written). */
Test(kernels, the_step_with_random_actions_and_auto_reset_is_one_kernel_on_cpu, .timeout = LM_TIMEOUT(120)) {
  const lm_env_spec *e = env();
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  OK(lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs));
  OK(lm_output(vs.reward, "reward"));
  OK(lm_output(vs.terminated, "terminated"));
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "%s", lm_last_error());
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "N", 1024));
  OK(lm_program_bind(p, "T", 64));
  lm_program_stats st;
  OK(lm_program_get_stats(p, &st));
  cr_assert_eq(st.kernels, 1, "64 scanned Space Invaders steps are %d kernels", st.kernels);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* ================================================================ contract and drawing */

Test(contract, the_env_passes_lm_env_validate_and_is_found_by_name_and_gym_id) {
  const lm_env_spec *e = env();
  OK(lm_env_validate(e));
  cr_assert_eq(lm_env_find("MinAtar/SpaceInvaders-v0"), e);
  cr_assert_eq(e->state_size, S);
  cr_assert_eq(e->obs_size, O);
  cr_assert(e->action.kind == LM_SPACE_DISCRETE && e->action.n == 6);
  cr_assert(e->check_rtol == 0 && e->check_atol == 0 && e->reward_rtol == 0 && e->reward_atol == 0);
}

/* The reset picture: the board, the cannon and the wave's 4 rows as one run each, every rect
 * inside the world box; a smaller cap gets what fits, the cannon first, and the count the state
 * needs (as snprintf). */
Test(draw, the_reset_state_draws_the_board_the_cannon_and_four_alien_rows_within_cap) {
  const lm_env_spec *e = env();
  float s[S];
  e->ref_reset(s, 0, 0, 0);
  lm_draw_cmd cmds[LM_ENV_MAX_DRAW];
  int n = e->draw(s, cmds, LM_ENV_MAX_DRAW);
  cr_assert_eq(n, 6, "the reset state drew %d commands", n);
  for (int i = 0; i < n; i++)
    cr_assert(cmds[i].kind == LM_DRAW_RECT && cmds[i].x0 >= e->world[0] && cmds[i].y0 >= e->world[1] &&
                  cmds[i].x1 <= e->world[2] && cmds[i].y1 <= e->world[3] && cmds[i].x0 < cmds[i].x1,
              "command %d is not a rect inside the world box", i);
  cr_assert(cmds[1].x0 == 5 && cmds[1].x1 == 6 && cmds[1].y0 == 0, "the cannon is not drawn second at (9, 5)");
  cr_assert(cmds[2].x0 == 2 && cmds[2].x1 == 8 && cmds[2].y1 == 10, "the top alien row is not one run over x 2..8");
  lm_draw_cmd few[2];
  cr_assert_eq(e->draw(s, few, 2), 6, "a cap of 2 does not report the 6 commands the state needs");
  cr_assert(few[1].x0 == 5 && few[1].y0 == 0, "a cap of 2 does not keep the cannon");
  cr_assert_eq(e->draw(s, NULL, 0), 6);
}
