/* envs/vecenv.c — the vector env of lumen/vec.h: an env (built in, configured or from a plugin)
 * as two programs compiled once on a backend — a reset that draws every env's first state, and
 * lm_env_vec_step (envs/vec.c: time limit, same-step auto-reset, the action wrappers) as the step
 * — sharing the env state through lm_program_link. The host side checks and converts actions and
 * copies the outputs into the caller's buffers (or leaves them in the programs' own, lm_vecenv_views);
 * what `rltrain record` draws is reproduced here. Auto-reset in the same step or in the next. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "lumen/ops.h"
#include "lumen/vec.h"

enum { WHY_CAP = 512 };

struct lm_vecenv {
  const lm_env_spec *env;
  lm_backend_t *b;
  lm_program_t *step, *reset;
  int64_t n;
  int asize;         /* floats per env's action */
  uint64_t seed;     /* the current key */
  int started;       /* reset has run */
  int next_step;     /* LM_VEC_NEXT_STEP: no final_obs output, a "pending" state */
  float *action;     /* n * asize: the actions as the program reads them */
  float *action_in;  /* the step program's own action buffer where it is host memory (cpu, ref), else NULL */
  float *own;        /* the vec env's own output buffers, lm_vecenv_buffers */
  lm_vecenv_out bufs;
  char why[WHY_CAP];
};

static const char *const out_names[5] = {"obs", "reward", "terminated", "truncated", "final_obs"};

/* The step program: actions in, lm_env_vec_step's five outputs out; the env state is STATE.
 * It is compiled as a scan of T = 1 steps, which for an env-local step is one kernel with the
 * env state in registers, as in the rollout, and with the rollout's cpu schedule: SIMD lane
 * blocks, and reset draws made only in the lanes whose episode ended (compiler/lazy.c). The
 * plain program computes every env's reset draws at every step, and an env whose step is
 * several kernels runs them all per call (MinAtar Breakout, 4096 envs: 63 ms as 3 kernels, 35 ms
 * as the scan, on a busy 2-core machine). Measured at 4096 envs on a 2-core Xeon with AVX-512,
 * best of 5 over 3000 calls: CartPole 31-32 us a step plain and 22 as the scan (either
 * auto-reset mode), Acrobot, MountainCar and Pendulum within 3% either way; at 16 envs the scan
 * costs CartPole 0.07 us more. The plain program is built only where the scan cannot be (its error
 * is then the plain program's, if that fails too). The choice follows the graph alone, never a
 * timing, so an env's transitions do not depend on the machine's load. RAND's run counter in a
 * scan is run * T + t = run, as in the plain program. *scan says which was built. */
static lm_program_t *step_program(const lm_env_spec *env, lm_backend_t *b, int next_step, int *scan) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  if (env->finite) lm_graph_promise_finite(g);
  lm_dim N = lm_sym(g, "N");
  int A = lm_env_action_size(env);
  lm_tensor act = env->action.kind == LM_SPACE_DISCRETE ? lm_input(g, "action", LM_ROLE_DATA, 1, &N)
                                                        : lm_input(g, "action", LM_ROLE_DATA, 2, (lm_dim[]){N, A});
  lm_vec_step vs;
  lm_status st = (next_step ? lm_env_vec_step_next : lm_env_vec_step)(env, g, "env.", N, act, &vs);
  lm_tensor outs[5] = {vs.obs, vs.reward, vs.terminated, vs.truncated, vs.final_obs};
  for (int i = 0; i < (next_step ? 4 : 5) && st == LM_OK; i++) st = lm_output(outs[i], out_names[i]);
  static const char *const per_step[1] = {"action"};
  lm_program_t *p = st == LM_OK ? lm_program_new_scan(b, g, "T", 0, per_step, 1) : NULL;
  *scan = p != NULL;
  if (st == LM_OK && !p) p = lm_program_new(b, g);
  lm_graph_free(g);
  return p;
}

/* The reset program: a fresh state from the reset graph, t = 0, the sticky wrapper's last action
 * 0 (a seeded reset then starts from nothing of the previous episodes), and the first obs. */
static lm_program_t *reset_program(const lm_env_spec *env, lm_backend_t *b, int next_step) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  if (env->finite) lm_graph_promise_finite(g);
  lm_dim N = lm_sym(g, "N");
  lm_tensor s = lm_input(g, "env.state", LM_ROLE_STATE, 2, (lm_dim[]){N, env->state_size});
  lm_tensor t = lm_input(g, "env.t", LM_ROLE_STATE, 1, &N);
  lm_tensor fresh = env->reset(g, N);
  lm_status st = lm_output(env->observe(g, fresh), "obs");
  if (st == LM_OK) st = lm_assign(s, fresh);
  if (st == LM_OK) st = lm_assign(t, lm_full(g, 0.0f, 1, &N));
  if (st == LM_OK && next_step) /* envs/vec.c's name: no reset is due */
    st = lm_assign(lm_input(g, "env.pending", LM_ROLE_STATE, 1, &N), lm_full(g, 0.0f, 1, &N));
  if (st == LM_OK && env->action.kind == LM_SPACE_DISCRETE && env->sticky > 0) {
    lm_tensor last = lm_input(g, "env.last_action", LM_ROLE_STATE, 1, &N); /* envs/vec.c's name */
    st = lm_assign(last, lm_full(g, 0.0f, 1, &N));
  }
  lm_program_t *p = st == LM_OK ? lm_program_new(b, g) : NULL;
  lm_graph_free(g);
  return p;
}

lm_vecenv_t *lm_vecenv_new(const char *name, const char *params, const char *device, int64_t num_envs, uint64_t seed) {
  return lm_vecenv_open(name, params, device, num_envs, seed, LM_VEC_SAME_STEP);
}

lm_vecenv_t *lm_vecenv_open(const char *name, const char *params, const char *device, int64_t num_envs, uint64_t seed,
                            lm_vec_autoreset autoreset) {
  if (autoreset != LM_VEC_SAME_STEP && autoreset != LM_VEC_NEXT_STEP) {
    lm_fail(LM_ERR_INVALID, "lm_vecenv_open: auto-reset mode %d, expected LM_VEC_SAME_STEP (0) or LM_VEC_NEXT_STEP (1)",
            (int)autoreset);
    return NULL;
  }
  if (!name || !*name) {
    lm_fail(LM_ERR_INVALID, "lm_vecenv_new: no env given (a name such as 'cartpole', or a plugin path)");
    return NULL;
  }
  if (num_envs < 1 || num_envs > (int64_t)1 << 28) {
    lm_fail(LM_ERR_INVALID, "lm_vecenv_new: num_envs = %lld, expected 1 .. %lld", (long long)num_envs,
            (long long)1 << 28);
    return NULL;
  }
  const lm_env_spec *env = NULL;
  if (lm_env_resolve(name, &env) != LM_OK) return NULL;
  if (params && *params && lm_env_configure(env, params, &env) != LM_OK) return NULL;
  if (lm_env_validate(env) != LM_OK) return NULL;
  size_t per_env = (size_t)env->obs_size > (size_t)env->state_size ? (size_t)env->obs_size : (size_t)env->state_size;
  if ((uint64_t)num_envs * per_env > ((uint64_t)1 << 31)) {
    lm_fail(LM_ERR_INVALID, "lm_vecenv_new: %lld envs of %s hold %llu floats of state or observation, over the limit of 2^31",
            (long long)num_envs, env->name, (unsigned long long)((uint64_t)num_envs * per_env));
    return NULL;
  }
  lm_vecenv_t *v = lm_calloc(1, sizeof *v);
  if (!v) return NULL;
  v->env = env;
  v->n = num_envs;
  v->seed = seed;
  v->next_step = autoreset == LM_VEC_NEXT_STEP;
  v->asize = lm_env_action_size(env);
  const char *dev = device && *device ? device : "auto";
  lm_status st = LM_OK;
  char msg[2048];
  size_t n = (size_t)num_envs, O = (size_t)env->obs_size;
  if (!(v->b = lm_backend_open(dev, v->why, sizeof v->why))) {
    st = LM_ERR_UNSUPPORTED;
    snprintf(msg, sizeof msg, "cannot open device '%s': %s", dev, lm_last_error());
    goto fail;
  }
  if (!v->why[0]) snprintf(v->why, sizeof v->why, "%s", lm_backend_name(v->b));
  int scan = 0;
  v->step = step_program(env, v->b, v->next_step, &scan);
  v->reset = v->step ? reset_program(env, v->b, v->next_step) : NULL;
  if (!v->reset) {
    st = LM_ERR_INVALID;
    snprintf(msg, sizeof msg, "cannot build its programs on %s: %s", lm_backend_name(v->b), lm_last_error());
    goto fail;
  }
  if ((st = lm_program_bind(v->step, "N", num_envs)) != LM_OK || (scan && (st = lm_program_bind(v->step, "T", 1)) != LM_OK) ||
      (st = lm_program_bind(v->reset, "N", num_envs)) != LM_OK ||
      (st = lm_program_link(v->reset, "env.state", v->step, "env.state")) != LM_OK ||
      (st = lm_program_link(v->reset, "env.t", v->step, "env.t")) != LM_OK ||
      (v->next_step && (st = lm_program_link(v->reset, "env.pending", v->step, "env.pending")) != LM_OK) ||
      (env->action.kind == LM_SPACE_DISCRETE && env->sticky > 0 &&
       (st = lm_program_link(v->reset, "env.last_action", v->step, "env.last_action")) != LM_OK)) {
    snprintf(msg, sizeof msg, "%s", lm_last_error());
    goto fail;
  }
  lm_buffer_view av; /* host memory: the actions are converted straight into the program's input */
  if (lm_program_buffer(v->step, "action", &av) == LM_OK && av.host && av.count == n * (size_t)v->asize)
    v->action_in = av.host;
  v->action = lm_calloc(n * (size_t)v->asize, sizeof(float));
  v->own = lm_calloc(n * (2 * O + 3), sizeof(float));
  if (!v->action || !v->own) {
    lm_vecenv_free(v);
    lm_fail(LM_ERR_NOMEM, "lm_vecenv_new: no memory for %zu envs of %s", n, env->name);
    return NULL;
  }
  v->bufs.obs = v->own;
  v->bufs.final_obs = v->own + n * O;
  v->bufs.reward = v->own + 2 * n * O;
  v->bufs.terminated = v->bufs.reward + n;
  v->bufs.truncated = v->bufs.terminated + n;
  return v;
fail:
  lm_vecenv_free(v);
  lm_fail(st, "vector env %s (%lld envs): %s", env->name, (long long)num_envs, msg);
  return NULL;
}

void lm_vecenv_free(lm_vecenv_t *v) {
  if (!v) return;
  lm_program_free(v->reset); /* linked to the step program's state: freed first */
  lm_program_free(v->step);
  lm_backend_free(v->b);
  lm_free(v->action);
  lm_free(v->own);
  lm_free(v);
}

const lm_env_spec *lm_vecenv_spec(const lm_vecenv_t *v) { return v ? v->env : NULL; }
const char *lm_vecenv_why(const lm_vecenv_t *v) { return v ? v->why : ""; }

lm_status lm_vecenv_spec_info(const lm_env_spec *e, lm_vecenv_info *out) {
  if (!e || !out) return lm_fail(LM_ERR_INVALID, "lm_vecenv_spec_info: %s is NULL", !e ? "the env" : "out");
  memset(out, 0, sizeof *out);
  out->name = e->name;
  out->gym_id = e->gym_id;
  out->params = e->params ? e->params : "";
  out->state_size = e->state_size;
  out->obs_size = e->obs_size;
  out->obs_rank = e->obs_rank;
  for (int k = 0; k < e->obs_rank && k < LM_MAX_RANK; k++) out->obs_shape[k] = e->obs_shape[k];
  out->discrete = e->action.kind == LM_SPACE_DISCRETE;
  out->action_n = e->action.n;
  out->action_size = lm_env_action_size(e);
  out->action_low = out->discrete ? NULL : e->action.low;
  out->action_high = out->discrete ? NULL : e->action.high;
  out->obs_low = e->obs_low;
  out->obs_high = e->obs_high;
  out->time_limit = e->time_limit;
  out->solved_return = e->solved_return;
  out->sticky = e->sticky;
  out->check_rtol = e->check_rtol;
  out->check_atol = e->check_atol;
  out->reward_rtol = e->reward_rtol;
  out->reward_atol = e->reward_atol;
  return LM_OK;
}

lm_status lm_vecenv_get_info(const lm_vecenv_t *v, lm_vecenv_info *out) {
  if (!v || !out) return lm_fail(LM_ERR_INVALID, "lm_vecenv_get_info: %s is NULL", !v ? "the vec env" : "out");
  lm_status st = lm_vecenv_spec_info(v->env, out);
  out->device = lm_backend_name(v->b);
  out->num_envs = v->n;
  out->autoreset = v->next_step ? LM_VEC_NEXT_STEP : LM_VEC_SAME_STEP;
  return st;
}

lm_vecenv_out lm_vecenv_buffers(lm_vecenv_t *v) {
  lm_vecenv_out none = {0};
  return v ? v->bufs : none;
}

/* Copies the program's outputs named in out_names into the non-NULL buffers of o. */
static lm_status read_outputs(lm_vecenv_t *v, lm_program_t *p, const lm_vecenv_out *o, int only_obs) {
  size_t n = (size_t)v->n, O = (size_t)v->env->obs_size;
  float *dst[5] = {o->obs, o->reward, o->terminated, o->truncated, o->final_obs};
  size_t cnt[5] = {n * O, n, n, n, n * O};
  lm_status st = LM_OK;
  for (int i = 0; i < (only_obs ? 1 : v->next_step ? 4 : 5) && st == LM_OK; i++)
    if (dst[i]) st = lm_program_read(p, out_names[i], dst[i], cnt[i]);
  return st;
}

lm_status lm_vecenv_views(lm_vecenv_t *v, int step, lm_vecenv_out *views) {
  if (!v || !views) return lm_fail(LM_ERR_INVALID, "lm_vecenv_views: %s is NULL", !v ? "the vec env" : "views");
  memset(views, 0, sizeof *views);
  lm_program_t *p = step ? v->step : v->reset;
  lm_vecenv_out got = {0};
  float **field[5] = {&got.obs, &got.reward, &got.terminated, &got.truncated, &got.final_obs};
  int n = !step ? 1 : v->next_step ? 4 : 5;
  for (int i = 0; i < n; i++) {
    lm_buffer_view bv;
    lm_status st = lm_program_buffer(p, out_names[i], &bv);
    if (st != LM_OK) return st;
    if (!bv.host) return LM_OK; /* not host memory: no views at all */
    *field[i] = bv.host;
  }
  *views = got;
  return LM_OK;
}

lm_status lm_vecenv_reset(lm_vecenv_t *v, int reseed, uint64_t seed, const lm_vecenv_out *out) {
  if (!v) return lm_fail(LM_ERR_INVALID, "lm_vecenv_reset: the vec env is NULL");
  uint64_t run = 0;
  if (reseed) v->seed = seed;
  else if (v->started) run = lm_program_run_index(v->step); /* the next counter no step has used */
  lm_program_set_seed(v->reset, v->seed);
  lm_program_set_run(v->reset, run);
  lm_status st = lm_program_run(v->reset);
  if (st != LM_OK) return st;
  lm_program_set_seed(v->step, v->seed);
  lm_program_set_run(v->step, run + 1);
  v->started = 1;
  return read_outputs(v, v->reset, out ? out : &v->bufs, 1);
}

/* The message for the first bad action of count values (take_actions found one). */
static lm_status bad_action(const lm_vecenv_t *v, const void *actions, lm_vec_dtype dtype, size_t count) {
  const lm_env_spec *e = v->env;
  int disc = e->action.kind == LM_SPACE_DISCRETE;
  for (size_t i = 0; i < count; i++) {
    double a;
    switch (dtype) {
    case LM_VEC_DTYPE_F32: a = ((const float *)actions)[i]; break;
    case LM_VEC_DTYPE_F64: a = ((const double *)actions)[i]; break;
    case LM_VEC_DTYPE_I32: a = ((const int32_t *)actions)[i]; break;
    default: a = (double)((const int64_t *)actions)[i]; break;
    }
    if (disc && !(a >= 0 && a < (double)e->action.n && a == floor(a)))
      return lm_fail(LM_ERR_INVALID, "%s: action %.9g of env %zu is not in Discrete(%d) (a whole number 0 .. %d)",
                     e->name, a, i, e->action.n, e->action.n - 1);
    if (!disc && !isfinite(a))
      return lm_fail(LM_ERR_INVALID, "%s: action %.9g of env %zu (dimension %zu) is not finite", e->name, a,
                     i / (size_t)v->asize, i % (size_t)v->asize);
  }
  return lm_fail(LM_ERR_INVALID, "%s: an action was refused but none is bad", e->name);
}

/* Converts and checks the actions into the step program's input (v->action_in, or v->action to
 * be written to it); LM_ERR_INVALID names the first bad one. A refused step leaves the input
 * half written, which no run reads: the next step converts every action again. One
 * branch-free pass per type (the compiler vectorises it: at 4096 envs the checked conversion
 * with a branch per action took ~17 us of a 54 us CartPole step), and a second pass only to name a bad
 * action. */
static lm_status take_actions(lm_vecenv_t *v, const void *actions, lm_vec_dtype dtype) {
  const lm_env_spec *e = v->env;
  size_t count = (size_t)v->n * (size_t)v->asize;
  int disc = e->action.kind == LM_SPACE_DISCRETE;
  if (!disc && (dtype == LM_VEC_DTYPE_I32 || dtype == LM_VEC_DTYPE_I64))
    return lm_fail(LM_ERR_INVALID, "%s: actions are a Box of %d floats per env, got integers", e->name, e->action.n);
  float *out = v->action_in ? v->action_in : v->action;
  int bad = 0;
  switch (dtype) {
  case LM_VEC_DTYPE_I32: {
    const int32_t *a = actions;
    uint32_t n = (uint32_t)e->action.n;
    for (size_t i = 0; i < count; i++) {
      bad |= (uint32_t)a[i] >= n;
      out[i] = (float)a[i];
    }
    break;
  }
  case LM_VEC_DTYPE_I64: { /* blocks of 8 on the words' halves, which the C compiler vectorises */
    const int64_t *a = actions;
    int32_t n = (int32_t)e->action.n; /* a Discrete space's n is an int */
    uint32_t off = 0;
    size_t i = 0;
    for (; i + 8 <= count; i += 8)
      for (int j = 0; j < 8; j++) {
        uint64_t x = (uint64_t)a[i + j];
        int32_t lo = (int32_t)(uint32_t)x;
        off |= (uint32_t)(x >> 32) | (uint32_t)(lo < 0) | (uint32_t)(lo >= n); /* x outside 0 .. n-1 */
        out[i + j] = (float)lo;
      }
    for (; i < count; i++) {
      off |= (uint64_t)a[i] >= (uint64_t)n;
      out[i] = (float)a[i];
    }
    bad = off != 0;
    break;
  }
  case LM_VEC_DTYPE_F32: {
    const float *a = actions;
    float hi = (float)e->action.n;
    for (size_t i = 0; i < count; i++) {
      float x = a[i];
      bad |= disc ? !(x >= 0.0f && x < hi && x == truncf(x)) : !(x - x == 0.0f); /* x - x: NaN for inf and NaN */
      out[i] = x;
    }
    break;
  }
  default: {
    const double *a = actions;
    double hi = (double)e->action.n;
    for (size_t i = 0; i < count; i++) {
      double x = a[i];
      bad |= disc ? !(x >= 0.0 && x < hi && x == trunc(x)) : !(x - x == 0.0);
      out[i] = (float)x;
    }
    break;
  }
  }
  return bad ? bad_action(v, actions, dtype, count) : LM_OK;
}

lm_status lm_vecenv_step(lm_vecenv_t *v, const void *actions, lm_vec_dtype dtype, size_t count,
                         const lm_vecenv_out *out) {
  if (!v || !actions) return lm_fail(LM_ERR_INVALID, "lm_vecenv_step: %s is NULL", !v ? "the vec env" : "actions");
  if ((int)dtype < 0 || dtype >= LM_VEC_DTYPE_COUNT)
    return lm_fail(LM_ERR_INVALID, "lm_vecenv_step: unknown action type %d", (int)dtype);
  size_t want = (size_t)v->n * (size_t)v->asize;
  if (count != want)
    return lm_fail(LM_ERR_INVALID, "%s: got %zu action values, expected %zu (%lld envs x %d)", v->env->name, count, want,
                   (long long)v->n, v->asize);
  if (!v->started) return lm_fail(LM_ERR_INVALID, "%s: step before the first reset (call reset first)", v->env->name);
  lm_status st = take_actions(v, actions, dtype);
  if (st == LM_OK && !v->action_in) st = lm_program_write(v->step, "action", v->action, want);
  if (st == LM_OK) st = lm_program_run(v->step);
  return st == LM_OK ? read_outputs(v, v->step, out ? out : &v->bufs, 0) : st;
}

lm_status lm_vecenv_random_actions(const lm_vecenv_t *v, uint64_t k, float *actions, size_t count) {
  if (!v || !actions) return lm_fail(LM_ERR_INVALID, "lm_vecenv_random_actions: %s is NULL", !v ? "the vec env" : "actions");
  size_t want = (size_t)v->n * (size_t)v->asize;
  if (count != want)
    return lm_fail(LM_ERR_INVALID, "%s: room for %zu actions, need %zu", v->env->name, count, want);
  for (int64_t i = 0; i < v->n; i++)
    lm_env_ref_random_action(v->env, v->seed, (uint64_t)i, k, actions + (size_t)i * (size_t)v->asize);
  return LM_OK;
}

lm_status lm_vecenv_read_state(lm_vecenv_t *v, float *state, size_t count) {
  if (!v || !state) return lm_fail(LM_ERR_INVALID, "lm_vecenv_read_state: %s is NULL", !v ? "the vec env" : "state");
  if (!v->started) return lm_fail(LM_ERR_INVALID, "%s: no state before the first reset", v->env->name);
  return lm_program_read(v->step, "env.state", state, count);
}

lm_status lm_vecenv_write_state(lm_vecenv_t *v, const float *state, size_t count) {
  if (!v || !state) return lm_fail(LM_ERR_INVALID, "lm_vecenv_write_state: %s is NULL", !v ? "the vec env" : "state");
  if (!v->started) return lm_fail(LM_ERR_INVALID, "%s: write the state after the first reset", v->env->name);
  if (v->env->finite) /* its programs promise finite values (lm_graph_promise_finite) */
    for (size_t i = 0; i < count; i++)
      if (!isfinite(state[i]))
        return lm_fail(LM_ERR_INVALID, "%s: state value %zu is %g; the env's values are finite", v->env->name, i,
                       (double)state[i]);
  return lm_program_write(v->step, "env.state", state, count);
}
