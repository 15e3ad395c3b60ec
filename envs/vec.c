/* envs/vec.c — the batched env step every rollout uses: the env's own step, the time limit
 * (truncation), and same-step auto-reset, as graph values. Where an episode ends (terminated or
 * truncated) the state takes a fresh reset draw and the step counter returns to 0 in the same
 * step; final_obs keeps what the step reached so truncated episodes can bootstrap from it. The
 * vector env of lumen/vec.h may ask for Gymnasium's next-step auto-reset instead. */
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "lumen/env.h"
#include "lumen/ops.h"

/* The agent's action as the env's (lm_env_configure): through the action map, then sticky: with
 * probability `sticky` the env applies the action it applied last (MinAtar's wrapper), kept in the
 * STATE input prefix + "last_action" ([N], 0 at first, carried across episodes as MinAtar does). */
static lm_tensor env_action(const lm_env_spec *env, lm_graph_t *g, const char *prefix, lm_dim n, lm_tensor a,
                            lm_tensor hold) {
  if (env->action.kind != LM_SPACE_DISCRETE) return a;
  if (env->action_map) {
    lm_tensor m = lm_mul(lm_eq(a, lm_const(g, 0.0f)), lm_const(g, (float)env->action_map[0]));
    for (int k = 1; k < env->action.n; k++)
      m = lm_add(m, lm_mul(lm_eq(a, lm_const(g, (float)k)), lm_const(g, (float)env->action_map[k])));
    a = m;
  }
  if (env->sticky > 0) {
    char name[256];
    snprintf(name, sizeof name, "%slast_action", prefix);
    lm_tensor last = lm_graph_input(g, name);
    if (!lm_tensor_ok(last)) last = lm_input(g, name, LM_ROLE_STATE, 1, &n);
    lm_tensor u = lm_rand_stream(g, LM_ENV_STREAM_STICKY, 1, &n);
    a = lm_env_select(lm_lt(u, lm_const(g, env->sticky)), last, a);
    /* hold (where valid, 1 for envs that take no action this step) keeps their last action */
    if (lm_assign(last, lm_tensor_ok(hold) ? lm_env_select(hold, last, a) : a) != LM_OK) return (lm_tensor){0};
  }
  return a;
}

/* Both auto-reset modes. next_step (Gymnasium's AutoresetMode.NEXT_STEP): an ended episode is
 * reset by the next step instead, which takes no action for that env (a STATE input prefix +
 * "pending", 1 where the last step ended an episode): its state becomes a fresh reset draw, its
 * obs the first observation, reward 0, not terminated or truncated, t 0. */
static lm_status vec_step(const lm_env_spec *env, lm_graph_t *g, const char *prefix, lm_dim n_envs, lm_tensor action,
                          int next_step, lm_vec_step *out) {
  if (!env || !g || !out) return lm_fail(LM_ERR_INVALID, "lm_env_vec_step: %s is NULL", !env ? "env" : !g ? "graph" : "out");
  memset(out, 0, sizeof *out);
  if (!prefix) prefix = "";
  if (env->time_limit < 1 || env->state_size < 1 || env->state_size > LM_ENV_SIZE_LIMIT)
    return lm_fail(LM_ERR_INVALID, "lm_env_vec_step: env '%s' has time limit %d and state size %d", env->name,
                   env->time_limit, env->state_size);
  char name[256];
  /* the inputs are found when the caller declared them already (to observe the state before
   * choosing the action), else declared here */
  snprintf(name, sizeof name, "%sstate", prefix);
  lm_tensor state = lm_graph_input(g, name);
  if (!lm_tensor_ok(state)) state = lm_input(g, name, LM_ROLE_STATE, 2, (lm_dim[]){n_envs, env->state_size});
  snprintf(name, sizeof name, "%st", prefix);
  lm_tensor t = lm_graph_input(g, name);
  if (!lm_tensor_ok(t)) t = lm_input(g, name, LM_ROLE_STATE, 1, &n_envs);
  lm_tensor pending = {0}, keep = {0};
  if (next_step) {
    snprintf(name, sizeof name, "%spending", prefix);
    pending = lm_graph_input(g, name);
    if (!lm_tensor_ok(pending)) pending = lm_input(g, name, LM_ROLE_STATE, 1, &n_envs);
    keep = lm_add(lm_neg(pending), lm_const(g, 1.0f));
  }

  action = env_action(env, g, prefix, n_envs, action, pending);
  lm_env_step_out st;
  memset(&st, 0, sizeof st);
  env->step(g, state, action, &st);
  lm_tensor next = st.state;
  lm_tensor term = st.terminated;
  lm_tensor t1 = lm_add(t, lm_const(g, 1.0f));
  lm_tensor notterm = lm_add(lm_neg(term), lm_const(g, 1.0f));
  lm_tensor trunc = lm_mul(lm_ge(t1, lm_const(g, (float)env->time_limit)), notterm);
  lm_tensor fresh = env->reset(g, n_envs);
  lm_status s;
  out->state = state;
  out->t = t;
  if (next_step) {
    lm_tensor after = lm_env_select(lm_unsqueeze(pending, 1), fresh, next);
    out->obs = out->final_obs = env->observe(g, after);
    out->reward = lm_mul(st.reward, keep);
    out->terminated = lm_mul(term, keep);
    out->truncated = lm_mul(trunc, keep);
    s = lm_assign(state, after);
    if (s == LM_OK) s = lm_assign(t, lm_mul(t1, keep));
    if (s == LM_OK) s = lm_assign(pending, lm_add(out->terminated, out->truncated));
  } else {
    lm_tensor done = lm_add(term, trunc); /* 0 or 1: trunc excludes term */
    lm_tensor after = lm_env_select(lm_unsqueeze(done, 1), fresh, next);
    out->final_obs = env->observe(g, next);
    out->obs = env->observe(g, after);
    out->reward = st.reward;
    out->terminated = term;
    out->truncated = trunc;
    s = lm_assign(state, after);
    if (s == LM_OK) s = lm_assign(t, lm_mul(t1, lm_add(lm_neg(done), lm_const(g, 1.0f))));
  }
  if (s == LM_OK && !lm_tensor_ok(out->obs)) s = lm_graph_validate(g);
  if (s == LM_OK && !lm_tensor_ok(out->obs))
    s = lm_fail(LM_ERR_INVALID, "lm_env_vec_step: env '%s' built an invalid graph", env->name);
  return s;
}

lm_status lm_env_vec_step(const lm_env_spec *env, lm_graph_t *g, const char *prefix, lm_dim n_envs,
                          lm_tensor action, lm_vec_step *out) {
  return vec_step(env, g, prefix, n_envs, action, 0, out);
}

lm_status lm_env_vec_step_next(const lm_env_spec *env, lm_graph_t *g, const char *prefix, lm_dim n_envs,
                               lm_tensor action, lm_vec_step *out) {
  return vec_step(env, g, prefix, n_envs, action, 1, out);
}
