/* tests/test_train.c — the PPO trainer: the device and host steppers give the same run, a
 * resumed run equals an uninterrupted one, checkpoints refuse corruption and mismatches,
 * orthogonal initialisation, and the rollout is one kernel. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lumen/lumen.h"

static lm_backend_t *cpu(void) {
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "cpu backend: %s", lm_last_error());
  return b;
}

static lm_ppo_config small(const lm_env_spec *env) {
  lm_ppo_config c = lm_ppo_defaults(env);
  c.n_envs = 8;
  c.horizon = 32;
  c.minibatches = 2;
  c.epochs = 2;
  c.total_steps = 8 * 32 * 20;
  return c;
}

static lm_trainer *trainer(lm_backend_t *b, const char *env, lm_ppo_config *c) {
  const lm_env_spec *e = lm_env_find(env);
  cr_assert(e);
  lm_trainer *t = lm_trainer_new(b, e, c);
  cr_assert(t, "trainer: %s", lm_last_error());
  return t;
}

static void iterate(lm_trainer *t, int n, lm_iter_stats *last) {
  for (int i = 0; i < n; i++) cr_assert_eq(lm_trainer_iterate(t, last), LM_OK, "%s", lm_last_error());
}

/* Reads every parameter of the policy that the trainer updates. */
static float *weights(lm_trainer *t, size_t *n) {
  const lm_policy *p = lm_rollout_policy(lm_trainer_rollout(t));
  lm_program_t *prog = lm_trainer_config(t)->stepper == LM_STEPPER_HOST ? lm_rollout_policy_program(lm_trainer_rollout(t))
                                                                           : lm_rollout_program(lm_trainer_rollout(t));
  size_t total = 0;
  for (int i = 0; i < p->nparams; i++) total += lm_policy_param_size(p, i);
  float *w = malloc(total * sizeof *w);
  size_t at = 0;
  for (int i = 0; i < p->nparams; i++) {
    size_t k = lm_policy_param_size(p, i);
    cr_assert_eq(lm_program_read(prog, p->name[i], w + at, k), LM_OK, "%s", lm_last_error());
    at += k;
  }
  *n = total;
  return w;
}

Test(train, the_cartpole_rollout_is_one_kernel_and_the_iteration_reports_its_kernels) {
  lm_backend_t *b = cpu();
  lm_ppo_config c = small(lm_env_find("cartpole"));
  lm_trainer *t = trainer(b, "cartpole", &c);
  lm_program_stats s;
  cr_assert_eq(lm_program_get_stats(lm_rollout_program(lm_trainer_rollout(t)), &s), LM_OK);
  cr_assert_eq(s.kernels, 1, "the rollout scan took %d kernels", s.kernels);
  cr_assert_eq(s.arena_bytes, 0, "the fused rollout keeps its intermediates in registers");
  cr_assert_gt(lm_trainer_kernels_per_iteration(t), 1);
  lm_trainer_free(t);
  lm_backend_free(b);
}

Test(train, device_and_host_steppers_produce_the_same_run) {
  lm_backend_t *b = cpu();
  lm_ppo_config c = small(lm_env_find("cartpole"));
  lm_trainer *dev = trainer(b, "cartpole", &c);
  c.stepper = LM_STEPPER_HOST;
  lm_trainer *host = trainer(b, "cartpole", &c);
  for (int i = 0; i < 3; i++) {
    lm_iter_stats a, h;
    iterate(dev, 1, &a);
    iterate(host, 1, &h);
    cr_assert_eq(a.episodes, h.episodes, "iteration %d: %g vs %g episodes", i, a.episodes, h.episodes);
    cr_assert_float_eq(a.mean_return, h.mean_return, 1e-9, "iteration %d", i);
    cr_assert(fabsf(a.loss - h.loss) <= 1e-5f * fabsf(a.loss) + 1e-6f, "iteration %d: loss %g vs %g", i, a.loss, h.loss);
  }
  size_t n1, n2;
  float *w1 = weights(dev, &n1), *w2 = weights(host, &n2);
  cr_assert_eq(n1, n2);
  for (size_t i = 0; i < n1; i++) cr_assert(fabsf(w1[i] - w2[i]) <= 1e-5f, "weight %zu: %g vs %g", i, w1[i], w2[i]);
  free(w1), free(w2);
  lm_trainer_free(dev);
  lm_trainer_free(host);
  lm_backend_free(b);
}

/* prep (the bootstrap) over one trajectory: the graph lm_trainer_graphs builds for `horizon`,
 * run with T = the trajectory's steps; `fin` is the final observations under `fin_name` */
static float *prep_reward_b(lm_backend_t *b, const lm_env_spec *env, lm_ppo_config c, int64_t horizon, lm_rollout *r,
                            int64_t n, int64_t T, const char *fin_name, const float *fin, size_t nfin) {
  c.horizon = horizon;
  lm_train_graph gs[4];
  cr_assert_eq(lm_trainer_graphs(env, &c, gs, 4), 4, "%s", lm_last_error());
  lm_program_t *p = lm_program_new(b, gs[1].g);
  for (int i = 0; i < 4; i++) lm_graph_free(gs[i].g);
  cr_assert(p, "%s", lm_last_error());
  cr_assert_eq(lm_program_bind(p, "N", n), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_bind(p, "T", T), LM_OK, "%s", lm_last_error());
  lm_program_t *ro = lm_rollout_program(r);
  const lm_policy *pol = lm_rollout_policy(r);
  for (int i = 0; i < pol->nparams; i++) cr_assert_eq(lm_program_link(p, pol->name[i], ro, pol->name[i]), LM_OK, "%s", lm_last_error());
  const char *from_ro[5] = {"value", "reward", "terminated", "truncated", "env.state"};
  for (int i = 0; i < 5; i++) cr_assert_eq(lm_program_link(p, from_ro[i], ro, from_ro[i]), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_write(p, fin_name, fin, nfin), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_run(p), LM_OK, "%s", lm_last_error());
  float *out = malloc((size_t)(T * n) * sizeof *out);
  cr_assert_eq(lm_program_read(p, "reward_b", out, (size_t)(T * n)), LM_OK, "%s", lm_last_error());
  lm_program_free(p);
  return out;
}

/* An env whose time limit is at least the horizon truncates at most once a rollout: the rollout
 * keeps the final obs per env ("trunc_obs"), and the bootstrap from it equals the one from a
 * final obs per step (the graph built for a longer horizon than the limit, run on the same data). */
Test(train, the_bootstrap_from_the_final_obs_kept_per_env_equals_the_one_kept_per_step) {
  lm_backend_t *b = cpu();
  const lm_env_spec *env = lm_env_find("pendulum");
  cr_assert_eq(lm_env_configure(env, "time_limit=16", &env), LM_OK, "%s", lm_last_error());
  const int64_t n = 4, T = 16;
  lm_ppo_config c = small(env);
  cr_assert(lm_rollout_truncates_once(env, T) && !lm_rollout_truncates_once(env, T + 1));
  cr_assert_str_eq(lm_rollout_final_obs_name(env, T), "trunc_obs");
  lm_rollout *r = lm_rollout_new(b, env, &c.policy, n, T, LM_STEPPER_DEVICE);
  cr_assert(r, "%s", lm_last_error());
  cr_assert_eq(lm_policy_init(lm_rollout_policy(r), lm_rollout_program(r), 7), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_rollout_reset(r, 99), LM_OK, "%s", lm_last_error());
  for (int k = 0; k < 2; k++) cr_assert_eq(lm_rollout_run(r), LM_OK, "%s", lm_last_error());
  size_t os = (size_t)env->obs_size, tn = (size_t)(T * n);
  float *kept = malloc((size_t)n * os * sizeof *kept), *trunc = malloc(tn * sizeof *trunc), *reward = malloc(tn * sizeof *reward);
  float *per_step = calloc(tn * os, sizeof *per_step);
  cr_assert_eq(lm_program_read(lm_rollout_program(r), "trunc_obs", kept, (size_t)n * os), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_read(lm_rollout_program(r), "truncated", trunc, tn), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_read(lm_rollout_program(r), "reward", reward, tn), LM_OK, "%s", lm_last_error());
  int truncations = 0;
  for (size_t i = 0; i < tn; i++)
    if (trunc[i] != 0.0f) {
      truncations++;
      memcpy(per_step + i * os, kept + (i % (size_t)n) * os, os * sizeof *kept);
    }
  cr_assert_eq(truncations, (int)n, "every env truncates once in %lld steps at time_limit 16", (long long)T);
  for (size_t e = 0; e < (size_t)n; e++) cr_assert(kept[e * os] != 0.0f || kept[e * os + 1] != 0.0f, "env %zu kept no obs", e);
  float *once = prep_reward_b(b, env, c, T, r, n, T, "trunc_obs", kept, (size_t)n * os);
  float *each = prep_reward_b(b, env, c, T + 1, r, n, T, "final_obs", per_step, tn * os);
  int bootstrapped = 0;
  for (size_t i = 0; i < tn; i++) {
    /* not bit for bit: tanh's vector (libmvec) and scalar paths round apart, by rows per kernel */
    cr_assert(fabsf(once[i] - each[i]) <= 1e-5f * fabsf(each[i]) + 1e-6f, "reward_b %zu: %a per env, %a per step", i,
              (double)once[i], (double)each[i]);
    bootstrapped += once[i] != reward[i];
  }
  cr_assert_eq(bootstrapped, (int)n, "the bootstrap changed %d rewards, not the %lld truncated ones", bootstrapped, (long long)n);
  free(once), free(each), free(kept), free(trunc), free(reward), free(per_step);
  lm_rollout_free(r);
  lm_backend_free(b);
}

/* Two rollouts of CartPole's PPO policy over n envs, LUMEN_SCAN_LANES set to `lanes` (NULL:
 * the default) while the backend builds them; the log-probabilities and values of every step. */
static float *rollout_outputs(int64_t n, const char *lanes) {
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_ppo_config c = small(env);
  const int64_t T = 32;
  if (lanes) setenv("LUMEN_SCAN_LANES", lanes, 1);
  lm_backend_t *b = cpu();
  lm_rollout *r = lm_rollout_new(b, env, &c.policy, n, T, LM_STEPPER_DEVICE);
  unsetenv("LUMEN_SCAN_LANES");
  cr_assert(r, "%s", lm_last_error());
  cr_assert_eq(lm_policy_init(lm_rollout_policy(r), lm_rollout_program(r), 7), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_rollout_reset(r, 99), LM_OK, "%s", lm_last_error());
  for (int k = 0; k < 2; k++) cr_assert_eq(lm_rollout_run(r), LM_OK, "%s", lm_last_error());
  size_t tn = (size_t)(T * n);
  float *out = malloc(2 * tn * sizeof *out);
  cr_assert(out);
  cr_assert_eq(lm_program_read(lm_rollout_program(r), "logp", out, tn), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_read(lm_rollout_program(r), "value", out + tn, tn), LM_OK, "%s", lm_last_error());
  lm_rollout_free(r);
  lm_backend_free(b);
  return out;
}

/* A rollout of at most 8 envs runs one env at a time (compiler/backends/cpu.c, SINGLE_ENVS):
 * bit for bit what LUMEN_SCAN_LANES=1 builds; 12 envs run in blocks of 8, bit for bit
 * LUMEN_SCAN_LANES=8's. The two forms round apart (vector and scalar sinf and expf): logged.
 * (test_dist: a rank's part runs the whole batch's form.) */
Test(train, a_rollout_of_few_envs_runs_one_env_at_a_time_and_more_in_blocks) {
  static const int64_t ns[2] = {8, 12};
  for (int i = 0; i < 2; i++) {
    int64_t n = ns[i];
    size_t m = (size_t)(2 * 32 * n);
    float *dflt = rollout_outputs(n, NULL), *one = rollout_outputs(n, "1"), *blocks = rollout_outputs(n, "8");
    const float *want = n <= 8 ? one : blocks;
    for (size_t k = 0; k < m; k++)
      cr_assert(!memcmp(&dflt[k], &want[k], sizeof(float)), "%lld envs, value %zu: %a, the %s form's %a", (long long)n, k,
                (double)dflt[k], n <= 8 ? "one-env" : "blocks", (double)want[k]);
    int apart = 0;
    for (size_t k = 0; k < m; k++) apart += memcmp(&one[k], &blocks[k], sizeof(float)) != 0;
    cr_log_info("%lld envs: the one-env and block forms differ in %d of %zu values", (long long)n, apart, m);
    free(dflt), free(one), free(blocks);
  }
}

static void resume_equals_uninterrupted(const char *env, lm_stepper stepper) {
  lm_backend_t *b = cpu();
  lm_ppo_config c = small(lm_env_find(env));
  c.stepper = stepper;
  char path[] = "/tmp/lumen-ckpt-XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  close(fd);
  lm_iter_stats s1, s2;
  lm_trainer *whole = trainer(b, env, &c);
  iterate(whole, 4, &s1);
  lm_trainer *first = trainer(b, env, &c);
  iterate(first, 2, &s2);
  cr_assert_eq(lm_trainer_save(first, path), LM_OK, "%s", lm_last_error());
  lm_trainer_free(first);
  lm_trainer *second = trainer(b, env, &c);
  cr_assert_eq(lm_trainer_load(second, path), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_trainer_iterations(second), 2);
  iterate(second, 2, &s2);
  cr_assert_eq(s1.env_steps, s2.env_steps);
  cr_assert_eq(s1.episodes, s2.episodes);
  cr_assert_eq(s1.loss, s2.loss, "loss %.9g vs %.9g", s1.loss, s2.loss);
  size_t n1, n2;
  float *w1 = weights(whole, &n1), *w2 = weights(second, &n2);
  cr_assert_eq(memcmp(w1, w2, n1 * sizeof *w1), 0, "resumed weights differ from the uninterrupted run");
  free(w1), free(w2);
  lm_trainer_free(whole);
  lm_trainer_free(second);
  lm_backend_free(b);
  unlink(path);
}

Test(train, a_resumed_run_equals_an_uninterrupted_one) { resume_equals_uninterrupted("cartpole", LM_STEPPER_DEVICE); }
Test(train, a_resumed_host_stepped_gaussian_run_equals_an_uninterrupted_one) {
  resume_equals_uninterrupted("pendulum", LM_STEPPER_HOST);
}

Test(train, corrupt_truncated_and_mismatched_checkpoints_are_refused) {
  lm_backend_t *b = cpu();
  lm_ppo_config c = small(lm_env_find("cartpole"));
  lm_trainer *t = trainer(b, "cartpole", &c);
  char path[] = "/tmp/lumen-ckpt-XXXXXX";
  int fd = mkstemp(path);
  close(fd);
  cr_assert_eq(lm_trainer_save(t, path), LM_OK, "%s", lm_last_error());
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  unsigned char *data = malloc((size_t)size);
  cr_assert_eq(fread(data, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  /* truncated */
  f = fopen(path, "wb");
  fwrite(data, 1, (size_t)size / 2, f);
  fclose(f);
  cr_assert_eq(lm_trainer_load(t, path), LM_ERR_CORRUPT);
  cr_assert(strstr(lm_last_error(), "checksum") || strstr(lm_last_error(), "truncated"), "%s", lm_last_error());
  /* one flipped byte */
  data[size / 3] ^= 0x40;
  f = fopen(path, "wb");
  fwrite(data, 1, (size_t)size, f);
  fclose(f);
  cr_assert_eq(lm_trainer_load(t, path), LM_ERR_CORRUPT, "%s", lm_last_error());
  /* not a checkpoint */
  f = fopen(path, "wb");
  fputs("hello", f);
  fclose(f);
  cr_assert_eq(lm_trainer_load(t, path), LM_ERR_CORRUPT);
  cr_assert(strstr(lm_last_error(), "not a lumen checkpoint"), "%s", lm_last_error());
  /* another env's checkpoint */
  lm_ppo_config c2 = small(lm_env_find("acrobot"));
  lm_trainer *other = trainer(b, "acrobot", &c2);
  cr_assert_eq(lm_trainer_save(other, path), LM_OK);
  cr_assert_eq(lm_trainer_load(t, path), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "acrobot"), "%s", lm_last_error());
  /* another shape */
  lm_ppo_config c3 = small(lm_env_find("cartpole"));
  c3.n_envs = 16;
  lm_trainer *wide = trainer(b, "cartpole", &c3);
  cr_assert_eq(lm_trainer_save(wide, path), LM_OK);
  cr_assert_eq(lm_trainer_load(t, path), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "shape"), "%s", lm_last_error());
  /* a missing file */
  cr_assert_eq(lm_trainer_load(t, "/nonexistent/lumen.ckpt"), LM_ERR_IO);
  free(data);
  lm_trainer_free(wide);
  lm_trainer_free(other);
  lm_trainer_free(t);
  lm_backend_free(b);
  unlink(path);
}

Test(train, orthogonal_initialisation_has_orthonormal_columns_scaled_by_the_gain) {
  lm_backend_t *b = cpu();
  lm_graph_t *g = lm_graph_new();
  lm_policy p;
  lm_policy_config cfg = lm_policy_default();
  cr_assert_eq(lm_policy_build(g, &cfg, lm_env_find("cartpole"), &p), LM_OK);
  lm_program_t *prog = lm_program_new(b, g);
  cr_assert(prog, "%s", lm_last_error());
  cr_assert_eq(lm_policy_init(&p, prog, 7), LM_OK, "%s", lm_last_error());
  for (int i = 0; i < p.nparams; i++) {
    size_t n = lm_policy_param_size(&p, i);
    float *w = malloc(n * sizeof *w);
    cr_assert_eq(lm_program_read(prog, p.name[i], w, n), LM_OK);
    if (!p.cols[i]) {
      for (size_t k = 0; k < n; k++) cr_assert_eq(w[k], 0.0f, "%s is a bias: zero", p.name[i]);
    } else {
      /* [rows, cols] with the smaller side orthonormal (times the gain) */
      int r = p.rows[i], c = p.cols[i], small_side = r < c ? r : c;
      for (int a = 0; a < small_side; a++)
        for (int bb = 0; bb < small_side; bb++) {
          double dot = 0;
          for (int k = 0; k < (r < c ? c : r); k++)
            dot += r < c ? (double)w[a * c + k] * w[bb * c + k] : (double)w[k * c + a] * w[k * c + bb];
          double want = a == bb ? (double)p.gain[i] * p.gain[i] : 0.0;
          cr_assert(fabs(dot - want) < 1e-4 * (1 + want), "%s: <%d,%d> = %g, want %g", p.name[i], a, bb, dot, want);
        }
    }
    free(w);
  }
  lm_program_free(prog);
  lm_graph_free(g);
  lm_backend_free(b);
}

Test(train, bad_shapes_are_refused_with_a_message) {
  lm_backend_t *b = cpu();
  lm_ppo_config c = small(lm_env_find("cartpole"));
  c.minibatches = 7; /* 8*32 does not split into 7 */
  cr_assert_null(lm_trainer_new(b, lm_env_find("cartpole"), &c));
  cr_assert(strstr(lm_last_error(), "minibatches"), "%s", lm_last_error());
  lm_backend_free(b);
}
