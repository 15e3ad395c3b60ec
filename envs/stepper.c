/* envs/stepper.c — an env stepped through its own graphs, compiled once on a backend: what
 * `rltrain record`, `check` and `eval` use for an env that has no scalar reference stepper
 * (the reference stepper is optional; the graphs are not). The reset program draws what the
 * reset graph draws for envs 0..n-1 (so row i is what ref_reset gives env i); the step and
 * observe programs run over any batch (N is a symbol). lm_env_step_batch is one such step,
 * compiled for a single call (how `rltrain check` replays a transitions file). */
#include <string.h>

#include "core.h"
#include "lumen/env.h"

struct lm_env_stepper {
  const lm_env_spec *env;
  lm_program_t *reset, *step, *observe;
  size_t n;
};

static lm_program_t *reset_program(const lm_env_spec *env, lm_backend_t *b, size_t n) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  if (env->finite) lm_graph_promise_finite(g);
  lm_status st = lm_output(env->reset(g, (lm_dim)n), "state");
  lm_program_t *p = st == LM_OK ? lm_program_new(b, g) : NULL;
  lm_graph_free(g);
  return p;
}

static lm_program_t *step_program(const lm_env_spec *env, lm_backend_t *b, int with_step) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  if (env->finite) lm_graph_promise_finite(g);
  lm_dim N = lm_sym(g, "N"), A = lm_env_action_size(env);
  lm_tensor st = lm_input(g, "state", LM_ROLE_DATA, 2, (lm_dim[]){N, env->state_size});
  lm_status s;
  if (with_step) {
    lm_tensor act = env->action.kind == LM_SPACE_DISCRETE ? lm_input(g, "action", LM_ROLE_DATA, 1, &N)
                                                          : lm_input(g, "action", LM_ROLE_DATA, 2, (lm_dim[]){N, A});
    lm_env_step_out so;
    memset(&so, 0, sizeof so);
    env->step(g, st, act, &so);
    s = lm_output(so.state, "next");
    if (s == LM_OK) s = lm_output(env->observe(g, so.state), "obs");
    if (s == LM_OK) s = lm_output(so.reward, "reward");
    if (s == LM_OK) s = lm_output(so.terminated, "terminated");
  } else
    s = lm_output(env->observe(g, st), "obs");
  lm_program_t *p = s == LM_OK ? lm_program_new(b, g) : NULL;
  lm_graph_free(g);
  return p;
}

lm_env_stepper *lm_env_stepper_new(const lm_env_spec *env, lm_backend_t *b, size_t n) {
  if (!env || !b || !n) {
    lm_fail(LM_ERR_INVALID, "lm_env_stepper_new: %s", !env ? "no env" : !b ? "no backend" : "no envs (n = 0)");
    return NULL;
  }
  if (lm_env_validate(env) != LM_OK) return NULL;
  lm_env_stepper *s = lm_calloc(1, sizeof *s);
  if (!s) return NULL;
  s->env = env;
  s->n = n;
  if (!(s->reset = reset_program(env, b, n)) || !(s->step = step_program(env, b, 1)) ||
      !(s->observe = step_program(env, b, 0))) {
    lm_env_stepper_free(s);
    return NULL;
  }
  return s;
}

void lm_env_stepper_free(lm_env_stepper *s) {
  if (!s) return;
  lm_program_free(s->reset);
  lm_program_free(s->step);
  lm_program_free(s->observe);
  lm_free(s);
}

size_t lm_env_stepper_envs(const lm_env_stepper *s) { return s ? s->n : 0; }

lm_status lm_env_stepper_reset(lm_env_stepper *s, uint64_t seed, uint64_t run, float *state) {
  if (!s || !state) return lm_fail(LM_ERR_INVALID, "lm_env_stepper_reset: a NULL argument");
  lm_program_set_seed(s->reset, seed);
  lm_program_set_run(s->reset, run);
  lm_status st = lm_program_run(s->reset);
  return st == LM_OK ? lm_program_read(s->reset, "state", state, s->n * (size_t)s->env->state_size) : st;
}

/* One batched step through a step program (step_program(env, b, 1)). */
static lm_status run_step(const lm_env_spec *env, lm_program_t *p, size_t n, const float *state, const float *action,
                          float *next, float *obs, float *reward, float *terminated) {
  size_t S = (size_t)env->state_size, A = (size_t)lm_env_action_size(env), O = (size_t)env->obs_size;
  lm_status st = lm_program_bind(p, "N", (int64_t)n);
  if (st == LM_OK) st = lm_program_write(p, "state", state, n * S);
  if (st == LM_OK) st = lm_program_write(p, "action", action, n * A);
  if (st == LM_OK) st = lm_program_run(p);
  if (st == LM_OK) st = lm_program_read(p, "next", next, n * S);
  if (st == LM_OK) st = lm_program_read(p, "obs", obs, n * O);
  if (st == LM_OK) st = lm_program_read(p, "reward", reward, n);
  if (st == LM_OK) st = lm_program_read(p, "terminated", terminated, n);
  return st;
}

lm_status lm_env_stepper_step(lm_env_stepper *s, size_t n, const float *state, const float *action, float *next,
                              float *obs, float *reward, float *terminated) {
  if (!s || !state || !action || !next || !obs || !reward || !terminated)
    return lm_fail(LM_ERR_INVALID, "lm_env_stepper_step: a NULL argument");
  return n ? run_step(s->env, s->step, n, state, action, next, obs, reward, terminated) : LM_OK;
}

lm_status lm_env_step_batch(const lm_env_spec *env, lm_backend_t *b, size_t n, const float *state,
                            const float *action, float *next, float *obs, float *reward, float *terminated) {
  if (!env || !b || !state || !action || !next || !obs || !reward || !terminated)
    return lm_fail(LM_ERR_INVALID, "lm_env_step_batch: a NULL argument");
  lm_status st = lm_env_validate(env);
  if (st != LM_OK || !n) return st;
  lm_program_t *p = step_program(env, b, 1);
  if (!p) return LM_ERR_INVALID;
  st = run_step(env, p, n, state, action, next, obs, reward, terminated);
  lm_program_free(p);
  return st;
}

lm_status lm_env_stepper_observe(lm_env_stepper *s, size_t n, const float *state, float *obs) {
  if (!s || !state || !obs) return lm_fail(LM_ERR_INVALID, "lm_env_stepper_observe: a NULL argument");
  if (!n) return LM_OK;
  lm_program_t *p = s->observe;
  lm_status st = lm_program_bind(p, "N", (int64_t)n);
  if (st == LM_OK) st = lm_program_write(p, "state", state, n * (size_t)s->env->state_size);
  if (st == LM_OK) st = lm_program_run(p);
  return st == LM_OK ? lm_program_read(p, "obs", obs, n * (size_t)s->env->obs_size) : st;
}
