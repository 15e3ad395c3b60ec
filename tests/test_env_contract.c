/* tests/test_env_contract.c — the env contract (lm_env_validate) and the run-time registry
 * (lm_env_register): every built-in env passes; each easy mistake a new user makes is refused
 * with a message naming the env, the field and both shapes, where an env meets lumen (the
 * trainer, the rollout, lm_env_step_batch), instead of training on garbage or crashing; and
 * lm_rltrain, the command line as a function, over an env the program registered. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lumen/lumen.h"

static const lm_env_spec *cartpole(void) {
  const lm_env_spec *e = lm_env_find("cartpole");
  cr_assert(e, "%s", lm_last_error());
  return e;
}

/* a copy of cartpole under another name, for one mistake at a time */
static lm_env_spec variant(const char *name) {
  lm_env_spec e = *cartpole();
  e.name = name;
  e.gym_id = NULL;
  return e;
}

static void refused(const lm_env_spec *e, const char *const *says) {
  cr_assert_eq(lm_env_validate(e), LM_ERR_INVALID, "%s was accepted", e->name);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", lm_last_error());
  cr_log_info("%s", msg);
  for (const char *const *s = says; *s; s++) cr_assert(strstr(msg, *s), "the message lacks '%s': %s", *s, msg);
  cr_assert_eq(lm_env_register(e), LM_ERR_INVALID, "%s was registered", e->name);
  lm_backend_t *b = lm_backend_new("ref");
  cr_assert(b);
  lm_ppo_config c = lm_ppo_defaults(NULL);
  c.n_envs = 4, c.horizon = 8, c.minibatches = 2;
  lm_trainer *t = lm_trainer_new(b, e, &c);
  cr_assert_null(t, "the trainer took %s", e->name);
  cr_assert(strstr(lm_last_error(), e->name), "the trainer's message does not name the env: %s", lm_last_error());
  float st[16] = {0}, act[8] = {0}, next[16], obs[16], rew[1], term[1];
  cr_assert_neq(lm_env_step_batch(e, b, 1, st, act, next, obs, rew, term), LM_OK);
  lm_backend_free(b);
}

/* the shapes a broken step can give */
static void step_reward_column(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  cartpole()->step(g, s, a, out);
  out->reward = lm_reshape(out->reward, 2, (lm_dim[]){lm_dim_of(out->reward, 0), 1});
}

static void step_narrow_state(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  cartpole()->step(g, s, a, out);
  out->state = lm_slice(out->state, 1, 0, 2); /* [N, 2] for a state of 4 */
}

static void step_bad_broadcast(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  cartpole()->step(g, s, a, out);
  out->state = lm_add(out->state, lm_slice(s, 1, 0, 3)); /* [N, 4] + [N, 3] */
}

static lm_graph_t *other;
static lm_tensor observe_elsewhere(lm_graph_t *g, lm_tensor s) {
  (void)g;
  (void)s;
  if (!other) other = lm_graph_new();
  return lm_input(other, "obs", LM_ROLE_DATA, 2, (lm_dim[]){3, 4});
}

Test(env_contract, every_registered_env_passes) {
  for (int i = 0; i < lm_env_count(); i++)
    cr_assert_eq(lm_env_validate(lm_env_at(i)), LM_OK, "%s: %s", lm_env_at(i)->name, lm_last_error());
}

Test(env_contract, a_reward_of_shape_n_by_1_is_refused_with_both_shapes) {
  lm_env_spec e = variant("rewardcol");
  e.step = step_reward_column;
  refused(&e, (const char *const[]){"rewardcol", "reward", "[3, 1]", "expected [3]", NULL});
}

Test(env_contract, a_state_of_the_wrong_width_is_refused_with_both_shapes) {
  lm_env_spec e = variant("narrow");
  e.step = step_narrow_state;
  refused(&e, (const char *const[]){"narrow", "step's state", "[3, 2]", "expected [3, 4]", NULL});
}

Test(env_contract, a_failed_broadcast_inside_the_step_is_reported_as_the_first_error) {
  lm_env_spec e = variant("badcast");
  e.step = step_bad_broadcast;
  refused(&e, (const char *const[]){"badcast", "step's state", "first error", "broadcast", NULL});
}

Test(env_contract, a_node_from_another_graph_is_refused) {
  lm_env_spec e = variant("elsewhere");
  e.observe = observe_elsewhere;
  refused(&e, (const char *const[]){"elsewhere", "observation", "another graph", NULL});
  lm_graph_free(other);
}

Test(env_contract, missing_callbacks_sizes_over_the_limits_and_a_zero_time_limit_are_refused) {
  lm_env_spec e = variant("nostep");
  e.step = NULL;
  refused(&e, (const char *const[]){"nostep", "step", "NULL", NULL});
  e = variant("halfref");
  e.ref_observe = NULL;
  refused(&e, (const char *const[]){"halfref", "ref_observe", NULL});
  e = variant("wideobs"); /* a size the graphs do not give (any size is fine when they do) */
  e.obs_size = 50;
  refused(&e, (const char *const[]){"wideobs", "observation", "expected [3, 50]", NULL});
  e = variant("hugeobs");
  e.obs_size = LM_ENV_SIZE_LIMIT + 1;
  refused(&e, (const char *const[]){"hugeobs", "obs_size = 16777217", NULL});
  e = variant("halfbounds");
  e.obs_high = NULL;
  refused(&e, (const char *const[]){"halfbounds", "obs_low is set and obs_high is NULL", NULL});
  e = variant("boxnobounds");
  e.action = (lm_space){.kind = LM_SPACE_BOX, .n = 2};
  refused(&e, (const char *const[]){"boxnobounds", "action.low", NULL});
  e = variant("nolimit");
  e.time_limit = 0;
  refused(&e, (const char *const[]){"nolimit", "time_limit = 0", NULL});
  e = variant("oneaction");
  e.action.n = 1;
  refused(&e, (const char *const[]){"oneaction", "1 actions", NULL});
  e = variant("bad name");
  refused(&e, (const char *const[]){"bad name", "letters", NULL});
}

Test(env_contract, an_env_without_a_reference_stepper_is_valid_but_the_host_stepper_refuses_it) {
  lm_env_spec e = variant("graphonly");
  e.ref_reset = NULL, e.ref_step = NULL, e.ref_observe = NULL;
  cr_assert_eq(lm_env_validate(&e), LM_OK, "%s", lm_last_error());
  lm_backend_t *b = lm_backend_new("ref");
  lm_policy_config pc = lm_policy_default();
  lm_rollout *r = lm_rollout_new(b, &e, &pc, 4, 8, LM_STEPPER_HOST);
  cr_assert_null(r);
  cr_assert(strstr(lm_last_error(), "graphonly") && strstr(lm_last_error(), "ref_step"), "%s", lm_last_error());
  lm_backend_free(b);
}

Test(env_contract, registered_envs_are_found_by_name_once_and_names_do_not_collide) {
  static lm_env_spec mine;
  mine = variant("mycartpole");
  int n = lm_env_count();
  cr_assert_null(lm_env_find("mycartpole"));
  cr_assert_eq(lm_env_register(&mine), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_env_find("MyCartPole"), &mine);
  cr_assert_eq(lm_env_count(), n + 1);
  cr_assert_eq(lm_env_at(n), &mine);
  cr_assert_eq(lm_env_register(&mine), LM_OK); /* the same spec again */
  cr_assert_eq(lm_env_count(), n + 1);
  static lm_env_spec clash;
  clash = variant("cartpole");
  cr_assert_eq(lm_env_register(&clash), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "registered already"), "%s", lm_last_error());
}

/* The graph stepper stands in for the reference stepper: for every env that has both, its
 * resets are ref_reset's bit for bit (env i is row i) and a step from each reset state agrees
 * with ref_step within the env's check tolerances (terminated exactly). */
Test(env_stepper, resets_equal_ref_reset_and_steps_agree_with_ref_step) {
  lm_backend_t *b = lm_backend_new("ref");
  cr_assert(b);
  enum { N = 5 };
  for (int i = 0; i < lm_env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    if (!e->ref_step) continue;
    lm_env_stepper *s = lm_env_stepper_new(e, b, N);
    cr_assert(s, "%s: %s", e->name, lm_last_error());
    cr_assert_eq(lm_env_stepper_envs(s), N);
    int S = e->state_size, O = e->obs_size, A = lm_env_action_size(e);
    float *st = calloc((size_t)N * S, sizeof *st), *next = calloc((size_t)N * S, sizeof *next);
    float *obs = calloc((size_t)N * O, sizeof *obs), *o2 = calloc((size_t)N * O, sizeof *o2);
    float *act = calloc((size_t)N * A, sizeof *act), *ref = calloc((size_t)S, sizeof *ref);
    float *robs = calloc((size_t)O, sizeof *robs), rew[N], term[N];
    cr_assert(st && next && obs && o2 && act && ref && robs);
    cr_assert_eq(lm_env_stepper_reset(s, 42, 3, st), LM_OK, "%s", lm_last_error());
    for (int k = 0; k < N; k++) {
      e->ref_reset(ref, 42, (uint64_t)k, 3);
      cr_assert(!memcmp(ref, st + k * S, (size_t)S * sizeof *ref), "%s: env %d's reset differs from ref_reset", e->name,
                k);
      lm_env_ref_random_action(e, 9, (uint64_t)k, 0, act + k * A);
    }
    cr_assert_eq(lm_env_stepper_step(s, N, st, act, next, obs, rew, term), LM_OK, "%s", lm_last_error());
    for (int k = 0; k < N; k++) {
      int t;
      memcpy(ref, st + k * S, (size_t)S * sizeof *ref);
      float r = e->ref_step(ref, act + k * A, &t);
      e->ref_observe(ref, robs);
      for (int c = 0; c < S; c++)
        cr_assert(fabsf(ref[c] - next[k * S + c]) <= e->check_atol + e->check_rtol * fabsf(ref[c]),
                  "%s env %d state[%d]: graph %g, ref %g", e->name, k, c, (double)next[k * S + c], (double)ref[c]);
      for (int c = 0; c < O; c++)
        cr_assert(fabsf(robs[c] - obs[k * O + c]) <= e->check_atol + e->check_rtol * fabsf(robs[c]),
                  "%s env %d obs[%d]", e->name, k, c);
      cr_assert(fabsf(r - rew[k]) <= e->reward_atol + e->reward_rtol * fabsf(r), "%s env %d reward", e->name, k);
      cr_assert_eq((int)term[k], t, "%s env %d terminated", e->name, k);
    }
    cr_assert_eq(lm_env_stepper_observe(s, N, next, o2), LM_OK);
    cr_assert(!memcmp(o2, obs, (size_t)(N * O) * sizeof *o2), "%s: observe differs from the step's obs", e->name);
    free(st), free(next), free(obs), free(o2), free(act), free(ref), free(robs);
    lm_env_stepper_free(s);
  }
  lm_backend_free(b);
}

/* Training settings live with the env (train_defaults, "key = value" lines) and in --config
 * files, parsed by one strict reader: every built-in env's defaults apply and are what its
 * spec says; unknown keys and bad values are refused naming the origin, the line and the key. */
Test(settings, env_defaults_and_config_text_apply_and_bad_lines_are_named) {
  for (int i = 0; i < lm_env_count(); i++) {
    lm_ppo_config c;
    cr_assert_eq(lm_ppo_defaults_for(lm_env_at(i), &c), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_ppo_config_check(&c), LM_OK, "%s: %s", lm_env_at(i)->name, lm_last_error());
  }
  lm_ppo_config c = lm_ppo_defaults(lm_env_find("cartpole"));
  cr_assert_eq(c.total_steps, 300000);
  c = lm_ppo_defaults(lm_env_find("pendulum"));
  cr_assert(c.n_envs == 32 && c.horizon == 256 && c.lr == 1e-3f && c.gamma == 0.95f && c.minibatches == 32);
  const char *keys[8];
  int n = 8;
  cr_assert_eq(lm_ppo_config_apply(&c, "# a comment\n  envs = 8  \n\nhidden = 32,16\nseed = 18446744073709551615\n",
                                   "t.cfg", keys, &n),
               LM_OK, "%s", lm_last_error());
  cr_assert(c.n_envs == 8 && c.policy.layers == 2 && c.policy.hidden[1] == 16 && c.seed == UINT64_MAX);
  cr_assert_eq(n, 3);
  cr_assert_str_eq(keys[0], "envs");
  cr_assert_str_eq(keys[1], "hidden");
  const struct {
    const char *text, *says;
  } bad[] = {{"envz = 8\n", "line 1: unknown setting 'envz'"},
             {"\nenvs = 2.5\n", "line 2: envs = '2.5'"},
             {"lr = 0x1\n", "lr"},
             {"lr = nan\n", "lr"},
             {"hidden = 64,\n", "hidden"},
             {"activation = gelu\n", "activation"},
             {"envs 8\n", "not key = value"},
             {"seed = -1\n", "seed"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    lm_ppo_config d = lm_ppo_defaults(NULL);
    cr_assert_eq(lm_ppo_config_apply(&d, bad[i].text, "t.cfg", NULL, NULL), LM_ERR_INVALID, "'%s' was accepted",
                 bad[i].text);
    cr_assert(strstr(lm_last_error(), "t.cfg") && strstr(lm_last_error(), bad[i].says), "'%s': %s", bad[i].text,
              lm_last_error());
  }
  lm_env_spec e = variant("baddefaults");
  e.train_defaults = "epochs = 0\n";
  lm_ppo_config d;
  cr_assert_eq(lm_ppo_defaults_for(&e, &d), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "baddefaults") && strstr(lm_last_error(), "epochs"), "%s", lm_last_error());
}

/* lm_rltrain: a program registers its own env and hands the command line to rltrain, which
 * knows the env by name in every command; bad input comes back as exit status 2 (the process
 * goes on). */
Test(rltrain_call, a_registered_env_is_trained_checked_and_evaluated_through_the_command_line) {
  static lm_env_spec mine;
  mine = variant("embedded");
  mine.ref_reset = NULL, mine.ref_step = NULL, mine.ref_observe = NULL; /* graphs only */
  cr_assert_eq(lm_env_register(&mine), LM_OK, "%s", lm_last_error());
  char dir[] = "/tmp/lumen-embed-XXXXXX", run[64], csv[64];
  cr_assert(mkdtemp(dir));
  snprintf(run, sizeof run, "%s/run", dir);
  snprintf(csv, sizeof csv, "%s/t.csv", dir);
  char *train[] = {"rltrain", "embedded", "--device", "cpu", "--quiet", "--total-steps", "2048", "--out", run};
  cr_assert_eq(lm_rltrain(9, train), 0);
  char ckpt[96];
  snprintf(ckpt, sizeof ckpt, "%s/latest.ckpt", run);
  cr_assert_eq(access(ckpt, R_OK), 0, "no %s", ckpt);
  char *rec[] = {"rltrain", "record", "embedded", csv, "--episodes", "2"};
  cr_assert_eq(lm_rltrain(6, rec), 0);
  char *chk[] = {"rltrain", "check", "embedded", csv, "--device", "cpu"};
  cr_assert_eq(lm_rltrain(6, chk), 0);
  char *ev[] = {"rltrain", "eval", run, "--episodes", "2"};
  cr_assert_eq(lm_rltrain(5, ev), 0);
  char *bad[] = {"rltrain", "embedded", "--total-steps", "lots"};
  cr_assert_eq(lm_rltrain(4, bad), 2);
  char *unknown[] = {"rltrain", "no-such-env"};
  cr_assert_eq(lm_rltrain(2, unknown), 2);
  cr_assert_eq(lm_rltrain(1, (char *[]){"rltrain"}), 2);
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* ---- env parameters (lm_env_configure) ----
 * "echo": its state is the last env action it received, its reward that action too, so a test
 * sees which action the env applied. */
static lm_tensor echo_reset(lm_graph_t *g, lm_dim n) { return lm_full(g, 0.0f, 2, (lm_dim[]){n, 1}); }
static void echo_step(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  out->state = lm_add(lm_mul(s, lm_const(g, 0.0f)), lm_unsqueeze(a, 1));
  out->reward = a;
  out->terminated = lm_mul(a, lm_const(g, 0.0f));
}
static lm_tensor echo_observe(lm_graph_t *g, lm_tensor s) { return lm_add(s, lm_const(g, 0.0f)); }
static const lm_env_spec echo = {.name = "echo",
                                 .state_size = 1,
                                 .obs_size = 1,
                                 .action = {.kind = LM_SPACE_DISCRETE, .n = 6},
                                 .time_limit = 1000,
                                 .sticky = 0.25f,
                                 .action_sets = "minimal = 0 2 5; two = 4 1",
                                 .reset = echo_reset,
                                 .step = echo_step,
                                 .observe = echo_observe};

Test(env_params, configure_checks_keys_and_values_and_gives_one_canonical_env) {
  cr_assert_eq(lm_env_validate(&echo), LM_OK, "%s", lm_last_error());
  const lm_env_spec *a, *b, *same;
  cr_assert_eq(lm_env_configure(&echo, "", &same), LM_OK);
  cr_assert_eq(same, &echo);
  cr_assert_eq(lm_env_configure(&echo, "sticky=0.25, time_limit=1000", &same), LM_OK); /* the env's own values */
  cr_assert_eq(same, &echo);
  cr_assert_eq(lm_env_configure(&echo, "actions=minimal,sticky=0,time_limit=50", &a), LM_OK, "%s", lm_last_error());
  cr_assert_str_eq(a->params, "time_limit=50,sticky=0,actions=minimal");
  cr_assert_eq(a->time_limit, 50);
  cr_assert_eq(a->sticky, 0.0f);
  cr_assert_eq(a->action.n, 3);
  cr_assert_eq(a->env_actions, 6);
  cr_assert(a->action_map[0] == 0 && a->action_map[1] == 2 && a->action_map[2] == 5);
  cr_assert_eq(lm_env_base(a), &echo);
  cr_assert_eq(lm_env_validate(a), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_env_configure(a, " time_limit = 50 , actions=minimal,sticky=0", &b), LM_OK); /* from the base again */
  cr_assert_eq(a, b, "the same parameters gave two envs");
  static const struct {
    const char *text, *says;
  } bad[] = {{"sticky=1", "[0, 1)"},           {"sticky=-0.1", "[0, 1)"},         {"sticky=x", "sticky"},
             {"time_limit=0", "time_limit"}, {"time_limit=2.5", "whole number"}, {"actions=most", "minimal, two"},
             {"colour=red", "no parameter 'colour'"}, {"sticky", "key=value"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_eq(lm_env_configure(&echo, bad[i].text, &b), LM_ERR_INVALID, "'%s' was accepted", bad[i].text);
    cr_assert(strstr(lm_last_error(), "echo") && strstr(lm_last_error(), bad[i].says), "'%s': %s", bad[i].text,
              lm_last_error());
  }
  cr_assert_eq(lm_env_configure(lm_env_find("pendulum"), "sticky=0.1", &b), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "discrete"), "%s", lm_last_error());
  lm_env_spec broken = echo;
  broken.name = "badsets";
  broken.action_sets = "minimal = 0 9";
  cr_assert_eq(lm_env_validate(&broken), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "badsets") && strstr(lm_last_error(), "'9'"), "%s", lm_last_error());
}

/* The vec env applies the action set, then sticky actions from LM_ENV_STREAM_STICKY, the same
 * bits on ref and cpu, and lm_env_ref_action given the same uniforms agrees on every env and
 * step; about a quarter of the steps repeat the last action (where it differs). */
static void echo_run(const lm_env_spec *e, const char *backend, int n, int steps, const float *acts, float *applied) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor a = lm_input(g, "action", LM_ROLE_DATA, 1, &N);
  lm_vec_step vs;
  cr_assert_eq(lm_env_vec_step(e, g, "env.", N, a, &vs), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_output(vs.reward, "reward"), LM_OK);
  lm_backend_t *b = lm_backend_new(backend);
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", lm_last_error());
  cr_assert_eq(lm_program_bind(p, "N", n), LM_OK);
  lm_program_set_seed(p, 99);
  for (int t = 0; t < steps; t++) {
    cr_assert_eq(lm_program_write(p, "action", acts + (size_t)t * n, (size_t)n), LM_OK);
    cr_assert_eq(lm_program_run(p), LM_OK, "%s", lm_last_error());
    cr_assert_eq(lm_program_read(p, "reward", applied + (size_t)t * n, (size_t)n), LM_OK);
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

Test(env_params, the_vec_env_maps_actions_and_repeats_them_with_the_sticky_probability) {
  enum { NE = 512, T = 8 };
  const lm_env_spec *e;
  cr_assert_eq(lm_env_configure(&echo, "actions=minimal", &e), LM_OK, "%s", lm_last_error());
  static float acts[T * NE], on_ref[T * NE], on_cpu[T * NE];
  for (int i = 0; i < T * NE; i++) acts[i] = (float)((i * 7 + i / NE) % 3);
  echo_run(e, "ref", NE, T, acts, on_ref);
  echo_run(e, "cpu", NE, T, acts, on_cpu);
  cr_assert(!memcmp(on_ref, on_cpu, sizeof on_ref), "ref and cpu applied different actions");
  int repeated = 0, differed = 0;
  float last[NE] = {0};
  for (int t = 0; t < T; t++)
    for (int i = 0; i < NE; i++) {
      float want_last = last[i], mapped = (float)e->action_map[(int)acts[t * NE + i]];
      float u = lm_rand_uniform(99, LM_ENV_STREAM_STICKY, (uint64_t)i, (uint64_t)t);
      float want = lm_env_ref_action(e, acts[t * NE + i], &last[i], u);
      cr_assert_eq(on_ref[t * NE + i], want, "env %d step %d: the graph applied %g, the reference %g", i, t,
                   (double)on_ref[t * NE + i], (double)want);
      if (mapped != want_last) differed++, repeated += want == want_last;
    }
  double frac = (double)repeated / differed;
  cr_log_info("sticky 0.25: %d of %d steps repeated the last action (%.3f)", repeated, differed, frac);
  cr_assert(frac > 0.2 && frac < 0.3, "%d of %d repeated", repeated, differed);
}
