/* tests/test_vecenv.c — the C API of lumen/vec.h: a vector env's first states are ref_reset's
 * under (seed, run 0), bit for bit; the k-th step's auto-resets draw under (seed, run k + 1)
 * and an unseeded reset at the next unused counter; record's random actions; bad actions, counts
 * and calls before a reset are refused by name and change nothing; two vec envs with one seed
 * agree; the caller's buffers get what the own buffers get. lm_actor_t: a checkpoint's policy
 * acts on any batch size as on each row, greedy is the argmax, sampling follows the seed, and
 * bad input is refused. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lumen/lumen.h"
#include "support/check.h"

enum { N = 32 };

static lm_vecenv_t *cartpole(uint64_t seed) {
  lm_vecenv_t *v = lm_vecenv_new("cartpole", NULL, "cpu", N, seed);
  cr_assert(v, "%s", lm_last_error());
  return v;
}

Test(vecenv, first_states_are_ref_reset_under_the_seed_and_run_0) {
  lm_vecenv_t *v = cartpole(0);
  const lm_env_spec *e = lm_vecenv_spec(v);
  float *obs = check_floats(N * 4), *state = check_floats(N * 4), *want = check_floats(N * 4);
  lm_vecenv_out out = {.obs = obs};
  cr_assert_eq(lm_vecenv_reset(v, 1, 1234, &out), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_read_state(v, state, N * 4), LM_OK, "%s", lm_last_error());
  for (int i = 0; i < N; i++) e->ref_reset(want + i * 4, 1234, (uint64_t)i, 0);
  check_same_bits("first states", state, want, N * 4);
  check_same_bits("first obs (CartPole's obs is its state)", obs, want, N * 4);
  free(obs), free(state), free(want);
  lm_vecenv_free(v);
}

Test(vecenv, step_k_auto_resets_under_run_k_plus_1_and_a_reset_continues) {
  lm_vecenv_t *v = cartpole(0);
  const lm_env_spec *e = lm_vecenv_spec(v);
  lm_vecenv_out own = lm_vecenv_buffers(v);
  const uint64_t seed = 99;
  float act[N], fresh[4];
  cr_assert_eq(lm_vecenv_reset(v, 1, seed, NULL), LM_OK, "%s", lm_last_error());
  int resets = 0;
  uint64_t k = 0;
  for (; k < 200; k++) {
    cr_assert_eq(lm_vecenv_random_actions(v, k, act, N), LM_OK);
    cr_assert_eq(lm_vecenv_step(v, act, LM_VEC_DTYPE_F32, N, NULL), LM_OK, "%s", lm_last_error());
    for (int i = 0; i < N; i++) {
      cr_assert(own.terminated[i] == 0 || own.terminated[i] == 1);
      if (own.terminated[i] == 0 && own.truncated[i] == 0) {
        check_same_bits("obs where no episode ended is final_obs", own.obs + i * 4, own.final_obs + i * 4, 4);
        continue;
      }
      e->ref_reset(fresh, seed, (uint64_t)i, k + 1);
      check_same_bits("auto-reset state", own.obs + i * 4, fresh, 4);
      resets++;
    }
  }
  cr_assert_gt(resets, 100, "random CartPole episodes end every ~22 steps: %d ends in 200 steps of %d envs", resets, N);
  /* a reset without a seed: the next unused counter, 200 steps after the seeded reset -> 201 */
  cr_assert_eq(lm_vecenv_reset(v, 0, 0, NULL), LM_OK);
  for (int i = 0; i < N; i++) {
    e->ref_reset(fresh, seed, (uint64_t)i, k + 1);
    check_same_bits("unseeded reset", own.obs + i * 4, fresh, 4);
  }
  lm_vecenv_free(v);
}

Test(vecenv, random_actions_are_records) {
  lm_vecenv_t *v = lm_vecenv_new("pendulum", NULL, "cpu", 5, 0);
  cr_assert(v, "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_reset(v, 1, 7, NULL), LM_OK);
  float got[5], want[1];
  cr_assert_eq(lm_vecenv_random_actions(v, 3, got, 5), LM_OK);
  for (int i = 0; i < 5; i++) {
    lm_env_ref_random_action(lm_vecenv_spec(v), 7, (uint64_t)i, 3, want);
    check_same_bits("action", &got[i], want, 1);
  }
  cr_assert_eq(lm_vecenv_random_actions(v, 3, got, 4), LM_ERR_INVALID);
  lm_vecenv_free(v);
}

Test(vecenv, bad_actions_and_calls_are_refused_by_name) {
  lm_vecenv_t *v = cartpole(0);
  float a[N] = {0};
  cr_assert_eq(lm_vecenv_step(v, a, LM_VEC_DTYPE_F32, N, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "reset"), "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_reset(v, 1, 5, NULL), LM_OK);
  float before[N * 4], after[N * 4];
  cr_assert_eq(lm_vecenv_read_state(v, before, N * 4), LM_OK);
  cr_assert_eq(lm_vecenv_step(v, a, LM_VEC_DTYPE_F32, N - 1, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "expected 32"), "%s", lm_last_error());
  a[7] = 2;
  cr_assert_eq(lm_vecenv_step(v, a, LM_VEC_DTYPE_F32, N, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "env 7") && strstr(lm_last_error(), "Discrete(2)"), "%s", lm_last_error());
  a[7] = 0.5f;
  cr_assert_eq(lm_vecenv_step(v, a, LM_VEC_DTYPE_F32, N, NULL), LM_ERR_INVALID);
  a[7] = NAN;
  cr_assert_eq(lm_vecenv_step(v, a, LM_VEC_DTYPE_F32, N, NULL), LM_ERR_INVALID);
  int64_t ia[N] = {0};
  ia[3] = -1;
  cr_assert_eq(lm_vecenv_step(v, ia, LM_VEC_DTYPE_I64, N, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "env 3"), "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_step(v, ia, (lm_vec_dtype)9, N, NULL), LM_ERR_INVALID);
  cr_assert_eq(lm_vecenv_read_state(v, after, N * 4), LM_OK);
  check_same_bits("state after refused steps", after, before, N * 4);
  ia[3] = 1;
  cr_assert_eq(lm_vecenv_step(v, ia, LM_VEC_DTYPE_I64, N, NULL), LM_OK, "%s", lm_last_error());
  lm_vecenv_free(v);

  lm_vecenv_t *p = lm_vecenv_new("pendulum", NULL, "cpu", 2, 0);
  cr_assert(p);
  cr_assert_eq(lm_vecenv_reset(p, 1, 0, NULL), LM_OK);
  double d[2] = {0.5, INFINITY};
  cr_assert_eq(lm_vecenv_step(p, d, LM_VEC_DTYPE_F64, 2, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "not finite"), "%s", lm_last_error());
  int32_t i32[2] = {0, 1};
  cr_assert_eq(lm_vecenv_step(p, i32, LM_VEC_DTYPE_I32, 2, NULL), LM_ERR_INVALID);
  lm_vecenv_free(p);
}

/* An env that promises finite values (lm_env_spec.finite: MinAtar's) takes no non-finite state:
 * its kernels print selects as selects, which a NaN or an infinity would tell apart. */
Test(vecenv, a_non_finite_state_is_refused_where_the_env_promises_finite_values) {
  lm_vecenv_t *v = lm_vecenv_new("minatar-breakout", NULL, "cpu", 2, 0);
  cr_assert(v, "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_reset(v, 1, 3, NULL), LM_OK);
  float s[2 * 108], before[2 * 108];
  cr_assert_eq(lm_vecenv_read_state(v, before, 2 * 108), LM_OK);
  memcpy(s, before, sizeof s);
  s[108 + 20] = INFINITY;
  cr_assert_eq(lm_vecenv_write_state(v, s, 2 * 108), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "minatar-breakout") && strstr(lm_last_error(), "value 128 is inf"), "%s",
            lm_last_error());
  cr_assert_eq(lm_vecenv_read_state(v, s, 2 * 108), LM_OK);
  check_same_bits("state after the refused write", s, before, 2 * 108);
  lm_vecenv_free(v);
}

Test(vecenv, bad_construction_is_refused_by_name) {
  cr_assert_null(lm_vecenv_new("no-such-env", NULL, "cpu", 4, 0));
  cr_assert(strstr(lm_last_error(), "no-such-env"), "%s", lm_last_error());
  cr_assert_null(lm_vecenv_new("cartpole", NULL, "cpu", 0, 0));
  cr_assert(strstr(lm_last_error(), "num_envs"), "%s", lm_last_error());
  cr_assert_null(lm_vecenv_new("cartpole", "time_limit=0", "cpu", 4, 0));
  cr_assert(strstr(lm_last_error(), "time_limit"), "%s", lm_last_error());
  cr_assert_null(lm_vecenv_new("cartpole", NULL, "no-such-device", 4, 0));
  cr_assert(strstr(lm_last_error(), "no-such-device"), "%s", lm_last_error());
  cr_assert_null(lm_vecenv_new(NULL, NULL, "cpu", 4, 0));
}

Test(vecenv, two_vec_envs_and_the_callers_buffers_agree) {
  lm_vecenv_t *a = lm_vecenv_new("minatar-breakout", "sticky=0.25", "cpu", 8, 3);
  lm_vecenv_t *b = lm_vecenv_new("minatar-breakout", "sticky=0.25", "cpu", 8, 3);
  cr_assert(a && b, "%s", lm_last_error());
  lm_vecenv_info info;
  cr_assert_eq(lm_vecenv_get_info(a, &info), LM_OK);
  cr_assert_eq(info.obs_size, 400);
  cr_assert_eq(info.obs_rank, 3);
  cr_assert_eq(info.discrete, 1);
  cr_assert_str_eq(info.params, "sticky=0.25");
  size_t O = 400;
  float *obs = check_floats(8 * O), *fin = check_floats(8 * O), *rew = check_floats(8), *term = check_floats(8),
        *trunc = check_floats(8);
  lm_vecenv_out mine = {obs, rew, term, trunc, fin}, own = lm_vecenv_buffers(a);
  cr_assert_eq(lm_vecenv_reset(a, 0, 0, NULL), LM_OK); /* the first reset uses the seed given at creation */
  cr_assert_eq(lm_vecenv_reset(b, 1, 3, &mine), LM_OK);
  check_same_bits("reset obs", obs, own.obs, 8 * O);
  float act[8];
  for (uint64_t k = 0; k < 100; k++) {
    cr_assert_eq(lm_vecenv_random_actions(a, k, act, 8), LM_OK);
    cr_assert_eq(lm_vecenv_step(a, act, LM_VEC_DTYPE_F32, 8, NULL), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_vecenv_step(b, act, LM_VEC_DTYPE_F32, 8, &mine), LM_OK, "%s", lm_last_error());
    check_same_bits("obs", obs, own.obs, 8 * O);
    check_same_bits("final obs", fin, own.final_obs, 8 * O);
    check_same_bits("reward", rew, own.reward, 8);
    check_same_bits("terminated", term, own.terminated, 8);
    check_same_bits("truncated", trunc, own.truncated, 8);
  }
  free(obs), free(fin), free(rew), free(term), free(trunc);
  lm_vecenv_free(a);
  lm_vecenv_free(b);
}

/* NEXT_STEP against SAME_STEP on the same seed and actions: until an env's first episode ends
 * the two step the same states (NEXT's obs is SAME's final_obs, rewards and flags equal); the
 * step after any end of a NEXT episode takes no action and gives ref_reset under that step's
 * counter (k + 2 after an end at step k), reward 0, both flags 0. A second NEXT env read through
 * lm_vecenv_views (no copies; no final_obs) gives the same bits as copies. */
Test(vecenv, next_step_autoreset_resets_in_the_step_after_an_end) {
  const uint64_t seed = 7;
  lm_vecenv_t *same = lm_vecenv_open("cartpole", NULL, "cpu", N, seed, LM_VEC_SAME_STEP);
  lm_vecenv_t *next = lm_vecenv_open("cartpole", NULL, "cpu", N, seed, LM_VEC_NEXT_STEP);
  lm_vecenv_t *viewed = lm_vecenv_open("cartpole", NULL, "cpu", N, seed, LM_VEC_NEXT_STEP);
  cr_assert(same && next && viewed, "%s", lm_last_error());
  lm_vecenv_info info;
  cr_assert_eq(lm_vecenv_get_info(next, &info), LM_OK);
  cr_assert_eq(info.autoreset, LM_VEC_NEXT_STEP);
  cr_assert_null(lm_vecenv_open("cartpole", NULL, "cpu", N, seed, (lm_vec_autoreset)5));
  cr_assert(strstr(lm_last_error(), "auto-reset mode 5"), "%s", lm_last_error());
  const lm_env_spec *e = lm_vecenv_spec(next);
  lm_vecenv_out s = lm_vecenv_buffers(same), x = lm_vecenv_buffers(next), vs, vr, none = {0};
  cr_assert_eq(lm_vecenv_views(viewed, 1, &vs), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_views(viewed, 0, &vr), LM_OK, "%s", lm_last_error());
  cr_assert(vs.obs && vs.reward && vs.terminated && vs.truncated && vr.obs, "cpu's buffers are host memory");
  cr_assert_null(vs.final_obs, "no final_obs under NEXT_STEP");
  cr_assert_null(vr.reward, "a reset gives obs only");
  cr_assert_eq(lm_vecenv_reset(same, 1, seed, NULL), LM_OK);
  cr_assert_eq(lm_vecenv_reset(next, 1, seed, NULL), LM_OK);
  cr_assert_eq(lm_vecenv_reset(viewed, 1, seed, &none), LM_OK);
  check_same_bits("first obs through the reset's view", vr.obs, x.obs, N * 4);
  int ended[N] = {0}, due[N] = {0}, resets = 0, checked = 0;
  float act[N], fresh[4];
  for (uint64_t k = 0; k < 120; k++) {
    cr_assert_eq(lm_vecenv_random_actions(same, k, act, N), LM_OK);
    cr_assert_eq(lm_vecenv_step(same, act, LM_VEC_DTYPE_F32, N, NULL), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_vecenv_step(next, act, LM_VEC_DTYPE_F32, N, NULL), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_vecenv_step(viewed, act, LM_VEC_DTYPE_F32, N, &none), LM_OK, "%s", lm_last_error());
    check_same_bits("obs through the view", vs.obs, x.obs, N * 4);
    check_same_bits("reward through the view", vs.reward, x.reward, N);
    check_same_bits("terminated through the view", vs.terminated, x.terminated, N);
    check_same_bits("truncated through the view", vs.truncated, x.truncated, N);
    for (int i = 0; i < N; i++) {
      if (due[i]) { /* the reset step */
        e->ref_reset(fresh, seed, (uint64_t)i, k + 1);
        check_same_bits("the reset step's first obs", x.obs + i * 4, fresh, 4);
        cr_assert(x.reward[i] == 0 && x.terminated[i] == 0 && x.truncated[i] == 0, "env %d step %d: %g %g %g", i,
                  (int)k, (double)x.reward[i], (double)x.terminated[i], (double)x.truncated[i]);
        due[i] = 0;
        resets++;
        continue;
      }
      if (!ended[i]) { /* still the first episode: the same states as under SAME_STEP */
        check_same_bits("obs is what the step reached", x.obs + i * 4, s.final_obs + i * 4, 4);
        cr_assert(x.reward[i] == s.reward[i] && x.terminated[i] == s.terminated[i] && x.truncated[i] == s.truncated[i]);
        checked++;
      }
      if (x.terminated[i] != 0 || x.truncated[i] != 0) ended[i] = due[i] = 1;
    }
  }
  cr_assert_gt(resets, 60, "random CartPole episodes end every ~22 steps: %d reset steps", resets);
  cr_assert_gt(checked, 300);
  lm_vecenv_free(same);
  lm_vecenv_free(next);
  lm_vecenv_free(viewed);
}

/* ---------------------------------------------------------------- lm_actor_t */

static char ckpt[64] = "/tmp/lumen-vecenv-XXXXXX"; /* room for the file name after the directory */

static void make_checkpoint(void) {
  cr_assert(mkdtemp(ckpt));
  strcat(ckpt, "/c.ckpt");
  const lm_env_spec *e = lm_env_find("cartpole");
  lm_ppo_config c = lm_ppo_defaults(e);
  c.n_envs = 8, c.horizon = 32, c.total_steps = 256 * 4, c.seed = 5;
  lm_backend_t *b = lm_backend_new("cpu");
  lm_trainer *t = b ? lm_trainer_new(b, e, &c) : NULL;
  cr_assert(t, "%s", lm_last_error());
  lm_iter_stats st;
  for (int i = 0; i < 2; i++) cr_assert_eq(lm_trainer_iterate(t, &st), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_trainer_save(t, ckpt), LM_OK, "%s", lm_last_error());
  lm_trainer_free(t);
  lm_backend_free(b);
}

static void remove_checkpoint(void) {
  unlink(ckpt);
  *strrchr(ckpt, '/') = 0;
  rmdir(ckpt);
}

Test(actor, acts_on_any_batch_as_on_each_row, .init = make_checkpoint, .fini = remove_checkpoint) {
  lm_actor_t *a = lm_actor_load(ckpt, "cpu");
  cr_assert(a, "%s", lm_last_error());
  cr_assert_str_eq(lm_actor_env(a)->name, "cartpole");
  enum { B = 37 };
  check_rng r = check_rng_new(1);
  float obs[B * 4], act[B], one, s1[B], s2[B];
  check_fill(&r, obs, B * 4, -0.2, 0.2, 1e-3);
  cr_assert_eq(lm_actor_act(a, B, obs, 1, act), LM_OK, "%s", lm_last_error());
  for (int i = 0; i < B; i++) {
    cr_assert(act[i] == 0 || act[i] == 1, "action %g", (double)act[i]);
    cr_assert_eq(lm_actor_act(a, 1, obs + i * 4, 1, &one), LM_OK);
    cr_assert_eq(one, act[i], "row %d: batch %g, alone %g", i, (double)act[i], (double)one);
  }
  /* sampled: the same seed, the same draws; the next call draws anew */
  lm_actor_set_seed(a, 11);
  cr_assert_eq(lm_actor_act(a, B, obs, 0, s1), LM_OK);
  lm_actor_set_seed(a, 11);
  cr_assert_eq(lm_actor_act(a, B, obs, 0, s2), LM_OK);
  check_same_bits("sampled actions under one seed", s1, s2, B);
  cr_assert_eq(lm_actor_act(a, B, obs, 0, s2), LM_OK);
  cr_assert(memcmp(s1, s2, sizeof s1), "a second call drew the same %d actions", B);
  obs[5] = NAN;
  cr_assert_eq(lm_actor_act(a, B, obs, 1, act), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "observation 1"), "%s", lm_last_error());
  cr_assert_eq(lm_actor_act(a, 0, obs, 1, act), LM_ERR_INVALID);
  lm_actor_free(a);
}

Test(actor, missing_checkpoint_is_named) {
  cr_assert_null(lm_actor_load("/nonexistent/x.ckpt", "cpu"));
  cr_assert(strstr(lm_last_error(), "/nonexistent/x.ckpt"), "%s", lm_last_error());
  cr_assert_null(lm_actor_load("", "cpu"));
}

/* MinAtar's vec-env step on cpu runs its whole lane blocks without tail guards (Space Invaders'
 * kernel has over 64 loops and a guard per lane loop) and moves each env's state row and its
 * observation row through transposed tiles of 16 columns (compiler/render.c), Breakout's
 * observation columns 4 at a time (its channel tests are i % 4): 130 envs (two whole blocks of
 * 64 and a tail of 2), 40 steps of record's random actions in both auto-reset modes, every
 * output with the reference interpreter's bits. */
static void minatar_step_like_ref(const char *env, lm_vec_autoreset mode, int by4) {
  enum { NE = 130, STEPS = 40 };
  char dir[] = "/tmp/lumen-vecenv-XXXXXX";
  cr_assert(mkdtemp(dir));
  setenv("LUMEN_DUMP", dir, 1);
  lm_vecenv_t *c = lm_vecenv_open(env, NULL, "cpu", NE, 7, mode);
  unsetenv("LUMEN_DUMP");
  lm_vecenv_t *r = lm_vecenv_open(env, NULL, "ref", NE, 7, mode);
  cr_assert(c && r, "%s", lm_last_error());
  lm_vecenv_info info;
  cr_assert_eq(lm_vecenv_get_info(c, &info), LM_OK);
  size_t no = (size_t)NE * (size_t)info.obs_size;
  cr_assert_eq(lm_vecenv_reset(c, 1, 7, NULL), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_vecenv_reset(r, 1, 7, NULL), LM_OK, "%s", lm_last_error());
  lm_vecenv_out oc = lm_vecenv_buffers(c), orf = lm_vecenv_buffers(r);
  float *act = check_floats((size_t)NE);
  for (uint64_t k = 0; k < STEPS; k++) {
    cr_assert_eq(lm_vecenv_random_actions(c, k, act, NE), LM_OK);
    cr_assert_eq(lm_vecenv_step(c, act, LM_VEC_DTYPE_F32, NE, NULL), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_vecenv_step(r, act, LM_VEC_DTYPE_F32, NE, NULL), LM_OK, "%s", lm_last_error());
    check_same_bits("obs", oc.obs, orf.obs, no);
    check_same_bits("reward", oc.reward, orf.reward, NE);
    check_same_bits("terminated", oc.terminated, orf.terminated, NE);
    check_same_bits("truncated", oc.truncated, orf.truncated, NE);
    if (mode == LM_VEC_SAME_STEP) check_same_bits("final_obs", oc.final_obs, orf.final_obs, no);
  }
  free(act);
  lm_vecenv_free(c);
  lm_vecenv_free(r);
  int full = check_dump_count(dir, "lm_full_end", 1), fours = check_dump_count(dir, "4 columns a time", 1);
  int tiles = check_dump_lines(dir, "lm_tr16(&");
  if (by4) cr_assert_gt(fours, 0, "%s: no tile's columns printed 4 at a time", env);
  else cr_assert_eq(fours, 0, "%s: %d tiles printed 4 columns at a time (its column tests are i %% 6)", env, fours);
  cr_assert_gt(full, 0, "%s: no kernel runs whole blocks without the tail guards", env);
  cr_assert_geq(tiles, 3, "%s: %d transposed copies (state in, state out, obs out)", env, tiles);
}

Test(vecenv, minatar_breakout_steps_with_the_references_bits_through_tiles) {
  minatar_step_like_ref("minatar-breakout", LM_VEC_NEXT_STEP, 1);
  minatar_step_like_ref("minatar-breakout", LM_VEC_SAME_STEP, 1);
}

Test(vecenv, minatar_space_invaders_steps_with_the_references_bits_through_tiles) {
  minatar_step_like_ref("minatar-space-invaders", LM_VEC_NEXT_STEP, 0);
  minatar_step_like_ref("minatar-space-invaders", LM_VEC_SAME_STEP, 0);
}
