/* tests/test_minatar_ref_slow.c — both MinAtar games played at random with auto-reset for 1024
 * envs x 2000 steps as a scan on ref (the interpreter) and on cpu, with the same random streams:
 * every reward, termination and final state the same bits, so the same episode statistics.
 * Labelled slow (its name): ref steps Breakout about 1.5e4 and Space Invaders about 1e4 times a
 * second, two and three minutes of the test. The games' own test files compare each backend with
 * the reference stepper (ref on a smaller run); here the two backends meet at the full size. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "lumen/env.h"
#include "lumen/lumen.h"
#include "support/check.h"
#include "support/timeout.h"

#define OK(expr) cr_assert_eq((expr), LM_OK, "%s: %s", #expr, lm_last_error())

#if defined(LM_TEST_SANITIZED)
enum { N = 64, T = 200 }; /* not run there (slow tests are left out of the sanitizer build) */
#else
enum { N = 1024, T = 2000 };
#endif
#define INIT_RUN (1ull << 40) /* the initial reset's draws: never a step's run */
#define SEED 0x5eedu

typedef struct play {
  float *reward, *terminated, *state; /* [T, N], [T, N], [N, S] */
  long episodes;
  double returns;
} play;

/* Random play on `backend` (check_random_play), the envs starting from ref_reset's states. */
static play run(const lm_env_spec *e, const char *backend) {
  size_t S = (size_t)e->state_size;
  play o = {check_floats((size_t)N * T), check_floats((size_t)N * T), check_floats(N * S), 0, 0};
  for (size_t i = 0; i < N; i++) e->ref_reset(o.state + i * S, SEED, i, INIT_RUN);
  check_random_play(e, backend, N, T, SEED, o.state, o.reward, o.terminated);
  for (size_t c = 0; c < (size_t)N * T; c++) o.episodes += o.terminated[c] != 0, o.returns += o.reward[c];
  return o;
}

static void same_play(const char *name) {
  const lm_env_spec *e = lm_env_find(name), *c;
  cr_assert(e, "%s is not registered", name);
  OK(lm_env_configure(e, "sticky=0", &c)); /* the random action is what the env applies */
  play ref = run(c, "ref"), cpu = run(c, "cpu");
  check_same_bits("rewards", cpu.reward, ref.reward, (size_t)N * T);
  check_same_bits("terminations", cpu.terminated, ref.terminated, (size_t)N * T);
  check_same_bits("final states", cpu.state, ref.state, N * (size_t)c->state_size);
  cr_assert_gt(ref.episodes, N, "%s: only %ld episodes ended", name, ref.episodes);
  cr_assert(cpu.episodes == ref.episodes && cpu.returns == ref.returns, "%s: cpu %ld episodes, return %g; ref %ld, %g",
            name, cpu.episodes, cpu.returns, ref.episodes, ref.returns);
  cr_log_info("%s, %d envs x %d steps: %ld episodes, returns %.0f (mean %.3f) on both", name, N, T, ref.episodes,
              ref.returns, ref.returns / (double)ref.episodes);
  free(ref.reward), free(ref.terminated), free(ref.state);
  free(cpu.reward), free(cpu.terminated), free(cpu.state);
}

Test(random_play, breakout_on_ref_and_cpu_1024_envs_x_2000_steps_the_same_bits, .timeout = LM_TIMEOUT(1800)) {
  same_play("minatar-breakout");
}

Test(random_play, space_invaders_on_ref_and_cpu_1024_envs_x_2000_steps_the_same_bits, .timeout = LM_TIMEOUT(1800)) {
  same_play("minatar-space-invaders");
}
