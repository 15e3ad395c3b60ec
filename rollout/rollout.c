/* rollout/rollout.c — the fused rollout scan, its reset program, the host-stepped baseline
 * (policy on the device, scalar reference env on the host) and episode statistics. A rollout
 * may be one part of a larger batch (one rank of several): its envs are envs first .. first+N-1
 * of all_envs, and every random stream is keyed by the global env index. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/core.h"
#include "compiler/graph-impl.h"
#include "lumen/ops.h"
#include "lumen/rand.h"
#include "lumen/rollout.h"

struct lm_rollout {
  const lm_env_spec *env;
  lm_policy policy;
  lm_stepper stepper;
  int64_t n, T;
  int64_t first, all; /* these envs are envs first .. first+n-1 of all (0 and n: the whole batch) */
  lm_backend_t *b;
  lm_program_t *prog;   /* device: the rollout scan; host: holds the trajectory it writes */
  lm_program_t *reset;  /* device: resets env state and statistics */
  lm_program_t *pol;    /* host: obs -> action, logp, value */
  /* host stepper */
  float *state, *t, *ep_ret, *ep_len;
  float *last; /* the env's last action, for sticky actions (lm_env_ref_action) */
  int once;       /* lm_rollout_truncates_once: the final observations per env, not per step */
  float *traj[8]; /* obs, action, logp, value, reward, terminated, truncated, final_obs or trunc_obs */
  double sum_ret, sum_len, count;
  uint64_t seed, run;
};

static const char *const traj_names[8] = {"obs", "action", "logp", "value", "reward", "terminated", "truncated", "final_obs"};
static const char *const stat_names[5] = {"ep.ret", "ep.len", "ep.sum_ret", "ep.sum_len", "ep.count"};

static int act_width(const lm_env_spec *env) { return env->action.kind == LM_SPACE_DISCRETE ? 1 : env->action.n; }

/* Width per env of trajectory buffer i. */
static int traj_width(const lm_env_spec *env, int i) {
  return i == 0 || i == 7 ? env->obs_size : i == 1 ? act_width(env) : 1;
}

int lm_rollout_truncates_once(const lm_env_spec *env, int64_t horizon) { return env && env->time_limit >= horizon; }

const char *lm_rollout_final_obs_name(const lm_env_spec *env, int64_t horizon) {
  return lm_rollout_truncates_once(env, horizon) ? "trunc_obs" : "final_obs";
}

/* Name of trajectory buffer i and its steps (T, or 1 for the per-env trunc_obs). */
static const char *traj_name(const lm_rollout *r, int i) { return i == 7 && r->once ? "trunc_obs" : traj_names[i]; }
static int64_t traj_steps(const lm_rollout *r, int i) { return i == 7 && r->once ? 1 : r->T; }

static lm_tensor state_input(lm_graph_t *g, const char *name, lm_dim n, int width) {
  lm_dim shape[2] = {n, width};
  return lm_input(g, name, LM_ROLE_STATE, width ? 2 : 1, shape);
}

lm_graph_t *lm_rollout_step_graph(const lm_env_spec *env, const lm_policy_config *cfg, int64_t horizon,
                                  lm_policy *policy) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_graph_set_contraction(g, cfg->contract);
  lm_dim N = lm_sym(g, "N");
  lm_tensor state = state_input(g, "env.state", N, env->state_size);
  state_input(g, "env.t", N, 0);
  lm_tensor obs = env->observe(g, state);
  lm_status st = lm_policy_build(g, cfg, env, policy);
  lm_policy_out po;
  if (st == LM_OK) st = lm_policy_forward(policy, obs, &po);
  lm_tensor logp, action = lm_policy_sample(policy, &po, LM_STREAM_ACTION, &logp);
  lm_vec_step vs;
  if (st == LM_OK) st = lm_env_vec_step(env, g, "env.", N, action, &vs);
  if (st != LM_OK) goto fail;
  /* episode statistics, per env so the step stays env-local */
  lm_tensor ret = state_input(g, "ep.ret", N, 0), len = state_input(g, "ep.len", N, 0);
  lm_tensor sret = state_input(g, "ep.sum_ret", N, 0), slen = state_input(g, "ep.sum_len", N, 0);
  lm_tensor cnt = state_input(g, "ep.count", N, 0);
  lm_tensor done = lm_maximum(vs.terminated, vs.truncated), live = lm_sub(lm_scalar_like(done, 1.0f), done);
  lm_tensor ret1 = lm_add(ret, vs.reward), len1 = lm_add_scalar(len, 1.0f);
  lm_assign(sret, lm_add(sret, lm_mul(done, ret1)));
  lm_assign(slen, lm_add(slen, lm_mul(done, len1)));
  lm_assign(cnt, lm_add(cnt, done));
  lm_assign(ret, lm_mul(ret1, live));
  lm_assign(len, lm_mul(len1, live));
  lm_tensor outs[8] = {obs, action, logp, po.value, vs.reward, vs.terminated, vs.truncated, vs.final_obs};
  int nout = 8;
  if (lm_rollout_truncates_once(env, horizon)) { /* the final obs where truncated, kept per env */
    lm_tensor kept = state_input(g, "trunc_obs", N, env->obs_size);
    st = lm_assign(kept, lm_where(lm_unsqueeze(vs.truncated, 1), vs.final_obs, kept));
    nout = 7;
  }
  for (int i = 0; i < nout && st == LM_OK; i++) st = lm_output(outs[i], traj_names[i]);
  if (st == LM_OK && lm_graph_validate(g) == LM_OK) return g;
fail:
  lm_graph_free(g);
  return NULL;
}


/* ---------------------------------------------------------------- part of a larger batch */

/* An edge reading node `id` reads it through `slice` first: its view chain is copied with the
 * copy's bottom resting on the slice (remap: old view -> its copy, shared by edges that share a
 * chain; views from nviews on are copies already). */
static lm_status rebase(lm_graph_t *g, lm_edge *e, uint32_t id, uint32_t slice, uint32_t *remap, size_t nviews) {
  if (e->node != id) return LM_OK;
  uint32_t chain[LM_MAX_RANK * 8], depth = 0, v = e->view;
  while (v && v < nviews && !remap[v]) {
    if (depth == LM_COUNTOF(chain)) return lm_fail(LM_ERR_INVALID, "rollout: a view chain of over %zu steps", LM_COUNTOF(chain));
    chain[depth++] = v;
    v = g->views[v].parent;
  }
  uint32_t below = v && v < nviews ? remap[v] : slice;
  while (depth) {
    uint32_t old = chain[--depth];
    lm_view copy = g->views[old];
    copy.parent = below;
    if (!(below = lm_graph_push_view(g, &copy))) return LM_ERR_NOMEM;
    remap[old] = below;
  }
  e->view = below;
  return LM_OK;
}

/* RAND draws element i of its shape from counter i, so a draw of shape [N, ...] gives env e the
 * numbers of row e. For the rollout's envs to be envs first .. first+N-1 of a batch of all_envs,
 * every RAND whose first axis is the envs becomes a RAND over [env_all, ...] read through a slice
 * [env_first, env_first + N) on every edge that reads it: the same numbers a one-process run with
 * env_all envs draws for those rows, and, fused into its consumer, no more draws than before.
 * env_first and env_all are symbols, so every rank runs the same kernels. */
static lm_status rand_rows_of_batch(lm_graph_t *g) {
  lm_dim N = lm_sym(g, "N"), first = lm_sym_min(g, "env_first", 0), all = lm_sym(g, "env_all");
  lm_expr n_expr = lm_dim_expr(g, N), all_expr = lm_dim_expr(g, all);
  size_t nnodes = g->nnodes;
  lm_status st = LM_OK;
  for (uint32_t id = 1; id < nnodes && st == LM_OK; id++) {
    lm_node *nd = &g->nodes[id];
    if (nd->op != LM_OP_RAND || nd->shape.rank < 1 || !lm_x_prove_eq(&g->x, nd->shape.dim[0], n_expr)) continue;
    lm_shape old = nd->shape;
    nd->shape.dim[0] = all_expr;
    lm_tensor sl = lm_slice((lm_tensor){g, id, 0}, 0, first, lm_dim_add(g, first, N));
    if (!lm_tensor_ok(sl)) {
      st = lm_fail(LM_ERR_INVALID, "rollout: cannot read rows of a batch-wide RAND: %s", g->errmsg ? g->errmsg : "?");
      break;
    }
    g->views[sl.view].shape = old; /* [N, ...], exactly the shape the readers saw */
    size_t nviews = g->nviews;
    uint32_t *remap = lm_calloc(nviews + 1, sizeof *remap); /* old view -> its copy over the slice (0: none yet) */
    if (!remap) return LM_ERR_NOMEM;
    for (uint32_t c = 1; c < g->nnodes && st == LM_OK; c++)
      for (int k = 0; k < g->nodes[c].nsrc && st == LM_OK; k++) st = rebase(g, &g->nodes[c].src[k], id, sl.view, remap, nviews);
    for (size_t o = 0; o < g->noutputs && st == LM_OK; o++) st = rebase(g, &g->outputs[o].src, id, sl.view, remap, nviews);
    for (size_t q = 0; q < g->nassigns && st == LM_OK; q++) st = rebase(g, &g->assigns[q].src, id, sl.view, remap, nviews);
    lm_free(remap);
  }
  return st == LM_OK ? lm_graph_validate(g) : st;
}

/* A program of the rollout learns where its envs sit in the batch. */
static lm_status bind_part(const lm_rollout *r, lm_program_t *p) {
  if (r->first == 0 && r->all == r->n) return LM_OK;
  lm_status st = lm_program_bind(p, "env_first", r->first);
  return st == LM_OK ? lm_program_bind(p, "env_all", r->all) : st;
}

static int is_part(const lm_rollout *r) { return !(r->first == 0 && r->all == r->n); }

static lm_status build_device(lm_rollout *r, const lm_policy_config *cfg) {
  const lm_env_spec *env = r->env;
  lm_graph_t *g = lm_rollout_step_graph(env, cfg, r->T, &r->policy);
  lm_status st = LM_OK;
  lm_dim N;
  if (!g) return LM_ERR_INVALID;
  if (is_part(r) && (st = rand_rows_of_batch(g)) != LM_OK) goto done;
  /* the envs the backend schedules the scan for: the whole batch's, so that a rank's part runs
   * the kernel (and rounds as) one process would (compiler/backends/cpu.c, SINGLE_ENVS) */
  (void)lm_sym_hint(g, "N", r->all);
  r->prog = lm_program_new_scan(r->b, g, "T", 0, NULL, 0);
  if (!r->prog) {
    st = LM_ERR_INVALID;
    goto done;
  }
  if ((st = lm_program_bind(r->prog, "N", r->n)) != LM_OK || (st = lm_program_bind(r->prog, "T", r->T)) != LM_OK ||
      (st = bind_part(r, r->prog)) != LM_OK)
    goto done;
  lm_graph_free(g);
  /* the reset program: fresh env state, t = 0, zero statistics (all linked to the rollout) */
  g = lm_graph_new();
  if (!g) return LM_ERR_NOMEM;
  N = lm_sym(g, "N");
  lm_tensor s2 = state_input(g, "env.state", N, env->state_size), t2 = state_input(g, "env.t", N, 0);
  lm_assign(s2, env->reset(g, N));
  lm_assign(t2, lm_mul_scalar(t2, 0.0f));
  for (int i = 0; i < 5; i++) {
    lm_tensor sv = state_input(g, stat_names[i], N, 0);
    lm_assign(sv, lm_full(g, 0.0f, 1, &N));
  }
  if (r->once) { /* finite rows before any truncation: the bootstrap multiplies them by 0 */
    lm_tensor kept = state_input(g, "trunc_obs", N, env->obs_size);
    lm_assign(kept, lm_full(g, 0.0f, 2, (lm_dim[]){N, env->obs_size}));
  }
  if (is_part(r) && (st = rand_rows_of_batch(g)) != LM_OK) goto done;
  r->reset = lm_program_new(r->b, g);
  st = r->reset ? lm_program_bind(r->reset, "N", r->n) : LM_ERR_INVALID;
  if (st == LM_OK) st = bind_part(r, r->reset);
  if (st == LM_OK) st = lm_program_link(r->reset, "env.state", r->prog, "env.state");
  if (st == LM_OK) st = lm_program_link(r->reset, "env.t", r->prog, "env.t");
  for (int i = 0; i < 5 && st == LM_OK; i++) st = lm_program_link(r->reset, stat_names[i], r->prog, stat_names[i]);
  if (st == LM_OK && r->once) st = lm_program_link(r->reset, "trunc_obs", r->prog, "trunc_obs");
done:
  lm_graph_free(g);
  return st;
}

static lm_status build_host(lm_rollout *r, const lm_policy_config *cfg) {
  const lm_env_spec *env = r->env;
  /* the policy program: obs [N, obs] -> action, logp, value */
  lm_graph_t *g = lm_graph_new();
  if (!g) return LM_ERR_NOMEM;
  lm_dim N = lm_sym(g, "N");
  lm_tensor obs = lm_input(g, "obs", LM_ROLE_DATA, 2, (lm_dim[]){N, env->obs_size});
  lm_status st = lm_policy_build(g, cfg, env, &r->policy);
  lm_policy_out po;
  if (st == LM_OK) st = lm_policy_forward(&r->policy, obs, &po);
  lm_tensor logp, action = lm_policy_sample(&r->policy, &po, LM_STREAM_ACTION, &logp);
  if (st == LM_OK) st = lm_output(action, "action");
  if (st == LM_OK) st = lm_output(logp, "logp");
  if (st == LM_OK) st = lm_output(po.value, "value");
  if (st == LM_OK && is_part(r)) st = rand_rows_of_batch(g);
  if (st == LM_OK && !(r->pol = lm_program_new(r->b, g))) st = LM_ERR_INVALID;
  if (st == LM_OK) st = lm_program_bind(r->pol, "N", r->n);
  if (st == LM_OK) st = bind_part(r, r->pol);
  lm_graph_free(g);
  if (st != LM_OK) return st;
  /* the holder of the trajectory: data inputs the trainer links to; the policy's parameters
   * live in the policy program */
  g = lm_graph_new();
  if (!g) return LM_ERR_NOMEM;
  N = lm_sym(g, "N");
  lm_dim T = lm_sym(g, "T");
  for (int i = 0; i < 8; i++) {
    int w = traj_width(env, i);
    lm_dim shape[3] = {T, N, w};
    int rank = (i == 0 || i == 7 || (i == 1 && env->action.kind == LM_SPACE_BOX)) ? 3 : 2;
    if (traj_steps(r, i) == 1) lm_input(g, traj_name(r, i), LM_ROLE_DATA, 2, shape + 1);
    else lm_input(g, traj_name(r, i), LM_ROLE_DATA, rank, shape);
  }
  lm_input(g, "env.state", LM_ROLE_DATA, 2, (lm_dim[]){N, env->state_size});
  r->prog = lm_program_new(r->b, g);
  lm_graph_free(g);
  if (!r->prog) return LM_ERR_INVALID;
  if ((st = lm_program_bind(r->prog, "N", r->n)) != LM_OK || (st = lm_program_bind(r->prog, "T", r->T)) != LM_OK) return st;
  size_t n = (size_t)r->n;
  r->state = lm_calloc(n * (size_t)env->state_size, sizeof(float));
  r->t = lm_calloc(n, sizeof(float));
  r->ep_ret = lm_calloc(n, sizeof(float));
  r->ep_len = lm_calloc(n, sizeof(float));
  r->last = lm_calloc(n, sizeof(float));
  if (!r->state || !r->t || !r->ep_ret || !r->ep_len || !r->last) return LM_ERR_NOMEM;
  for (int i = 0; i < 8; i++)
    if (!(r->traj[i] = lm_calloc((size_t)traj_steps(r, i) * n * (size_t)traj_width(env, i), sizeof(float)))) return LM_ERR_NOMEM;
  return LM_OK;
}

lm_rollout *lm_rollout_new(lm_backend_t *b, const lm_env_spec *env, const lm_policy_config *cfg, int64_t n_envs,
                           int64_t horizon, lm_stepper stepper) {
  return lm_rollout_new_part(b, env, cfg, n_envs, horizon, stepper, 0, n_envs);
}

lm_rollout *lm_rollout_new_part(lm_backend_t *b, const lm_env_spec *env, const lm_policy_config *cfg, int64_t n_envs,
                                int64_t horizon, lm_stepper stepper, int64_t first_env, int64_t all_envs) {
  if (!b || !env || !cfg) {
    lm_fail(LM_ERR_INVALID, "rollout: missing backend, env or policy config");
    return NULL;
  }
  if (n_envs < 1 || horizon < 1) {
    lm_fail(LM_ERR_INVALID, "rollout: need at least one env and one step (got %lld envs, %lld steps)",
            (long long)n_envs, (long long)horizon);
    return NULL;
  }
  if (first_env < 0 || all_envs < n_envs || first_env > all_envs - n_envs) {
    lm_fail(LM_ERR_INVALID, "rollout: envs %lld .. %lld are not within a batch of %lld envs", (long long)first_env,
            (long long)(first_env + n_envs - 1), (long long)all_envs);
    return NULL;
  }
  if (lm_env_validate(env) != LM_OK) return NULL;
  if (stepper == LM_STEPPER_HOST && !env->ref_step) {
    lm_fail(LM_ERR_INVALID, "rollout: env %s has no reference stepper (ref_step): the host stepper needs one; "
                            "use the device stepper", env->name);
    return NULL;
  }
  lm_rollout *r = lm_calloc(1, sizeof *r);
  if (!r) return NULL;
  r->env = env;
  r->b = b;
  r->n = n_envs;
  r->T = horizon;
  r->first = first_env;
  r->all = all_envs;
  r->stepper = stepper;
  r->once = lm_rollout_truncates_once(env, horizon);
  lm_status st = stepper == LM_STEPPER_HOST ? build_host(r, cfg) : build_device(r, cfg);
  if (st != LM_OK) {
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", lm_last_error());
    lm_rollout_free(r);
    lm_fail(st, "rollout for %s: %s", env->name, msg);
    return NULL;
  }
  return r;
}

void lm_rollout_free(lm_rollout *r) {
  if (!r) return;
  lm_program_free(r->reset);
  lm_program_free(r->pol);
  lm_program_free(r->prog);
  lm_free(r->state);
  lm_free(r->t);
  lm_free(r->ep_ret);
  lm_free(r->ep_len);
  lm_free(r->last);
  for (int i = 0; i < 8; i++) lm_free(r->traj[i]);
  lm_free(r);
}

lm_program_t *lm_rollout_program(lm_rollout *r) { return r->prog; }
lm_program_t *lm_rollout_policy_program(lm_rollout *r) { return r->pol; }
const lm_policy *lm_rollout_policy(const lm_rollout *r) { return &r->policy; }
uint64_t lm_rollout_run_index(const lm_rollout *r) { return r->stepper == LM_STEPPER_HOST ? r->run : lm_program_run_index(r->prog); }

void lm_rollout_set_run_index(lm_rollout *r, uint64_t run) {
  if (r->stepper == LM_STEPPER_HOST) {
    r->run = run;
    lm_program_set_run(r->pol, run * (uint64_t)r->T);
  } else lm_program_set_run(r->prog, run);
}

lm_status lm_rollout_reset(lm_rollout *r, uint64_t seed) {
  r->seed = seed;
  if (r->stepper == LM_STEPPER_DEVICE) {
    lm_program_set_seed(r->prog, seed);
    lm_program_set_seed(r->reset, seed ^ 0x5eed5eed5eed5eedull);
    return lm_program_run(r->reset);
  }
  lm_program_set_seed(r->pol, seed);
  const lm_env_spec *env = r->env;
  for (int64_t e = 0; e < r->n; e++) {
    env->ref_reset(r->state + e * env->state_size, seed ^ 0x5eed5eed5eed5eedull, (uint64_t)(r->first + e), 0);
    r->t[e] = r->ep_ret[e] = r->ep_len[e] = 0;
  }
  if (r->once) memset(r->traj[7], 0, (size_t)r->n * (size_t)env->obs_size * sizeof(float));
  r->sum_ret = r->sum_len = r->count = 0;
  return LM_OK;
}

/* One iteration with the env on the host: per step, obs to the device, actions back. */
static lm_status run_host(lm_rollout *r) {
  const lm_env_spec *env = r->env;
  size_t n = (size_t)r->n, os = (size_t)env->obs_size, ss = (size_t)env->state_size, aw = (size_t)act_width(env);
  lm_status st = LM_OK;
  float *act = lm_malloc(aw * sizeof *act);
  if (!act) return LM_ERR_NOMEM;
  for (int64_t t = 0; t < r->T && st == LM_OK; t++) {
    float *obs = r->traj[0] + (size_t)t * n * os;
    for (size_t e = 0; e < n; e++) env->ref_observe(r->state + e * ss, obs + e * os);
    if ((st = lm_program_write(r->pol, "obs", obs, n * os)) != LM_OK) break;
    if ((st = lm_program_run(r->pol)) != LM_OK) break;
    float *action = r->traj[1] + (size_t)t * n * aw, *logp = r->traj[2] + (size_t)t * n, *value = r->traj[3] + (size_t)t * n;
    if ((st = lm_program_read(r->pol, "action", action, n * aw)) != LM_OK) break;
    if ((st = lm_program_read(r->pol, "logp", logp, n)) != LM_OK) break;
    if ((st = lm_program_read(r->pol, "value", value, n)) != LM_OK) break;
    float *rew = r->traj[4] + (size_t)t * n, *term = r->traj[5] + (size_t)t * n, *trunc = r->traj[6] + (size_t)t * n;
    float *fin = r->traj[7] + (r->once ? 0 : (size_t)t * n * os);
    uint64_t step_run = r->run * (uint64_t)r->T + (uint64_t)t;
    for (size_t e = 0; e < n; e++) {
      float *s = r->state + e * ss;
      for (size_t k = 0; k < aw; k++) act[k] = action[e * aw + k];
      if (env->action.kind == LM_SPACE_DISCRETE) /* the vec env's action set and sticky actions */
        act[0] = lm_env_ref_action(env, act[0], &r->last[e],
                                   env->sticky > 0 ? lm_rand_uniform(r->seed, LM_ENV_STREAM_STICKY, (uint64_t)r->first + e, step_run)
                                                   : 1.0f); /* a Philox block per step only where it is read */
      int terminated = 0;
      rew[e] = env->ref_step(s, act, &terminated);
      r->t[e] += 1;
      term[e] = (float)terminated;
      trunc[e] = !terminated && r->t[e] >= (float)env->time_limit;
      if (!r->once || trunc[e] != 0.0f) env->ref_observe(s, fin + e * os);
      r->ep_ret[e] += rew[e];
      r->ep_len[e] += 1;
      if (terminated || trunc[e] != 0.0f) {
        r->sum_ret += r->ep_ret[e];
        r->sum_len += r->ep_len[e];
        r->count += 1;
        r->ep_ret[e] = r->ep_len[e] = 0;
        r->t[e] = 0;
        env->ref_reset(s, r->seed, (uint64_t)r->first + e, step_run);
      }
    }
  }
  lm_free(act);
  for (int i = 0; i < 8 && st == LM_OK; i++)
    st = lm_program_write(r->prog, traj_name(r, i), r->traj[i], (size_t)traj_steps(r, i) * n * (size_t)traj_width(env, i));
  if (st == LM_OK) st = lm_program_write(r->prog, "env.state", r->state, n * ss);
  if (st == LM_OK) r->run++;
  return st;
}

lm_status lm_rollout_run(lm_rollout *r) { return r->stepper == LM_STEPPER_HOST ? run_host(r) : lm_program_run(r->prog); }

lm_status lm_rollout_take_sums(lm_rollout *r, double *episodes, double *sum_return, double *sum_length) {
  double sr = 0, sl = 0, c = 0;
  if (r->stepper == LM_STEPPER_HOST) {
    sr = r->sum_ret, sl = r->sum_len, c = r->count;
    r->sum_ret = r->sum_len = r->count = 0;
  } else {
    size_t n = (size_t)r->n;
    float *buf = lm_malloc(3 * n * sizeof *buf), *zero = lm_calloc(n, sizeof *zero);
    lm_status st = buf && zero ? LM_OK : LM_ERR_NOMEM;
    for (int i = 0; i < 3 && st == LM_OK; i++) st = lm_program_read(r->prog, stat_names[2 + i], buf + (size_t)i * n, n);
    for (int i = 0; i < 3 && st == LM_OK; i++) st = lm_program_write(r->prog, stat_names[2 + i], zero, n);
    for (size_t e = 0; e < n && st == LM_OK; e++) sr += buf[e], sl += buf[n + e], c += buf[2 * n + e];
    lm_free(buf);
    lm_free(zero);
    if (st != LM_OK) return st;
  }
  *episodes = c;
  *sum_return = sr;
  *sum_length = sl;
  return LM_OK;
}

lm_status lm_rollout_take_stats(lm_rollout *r, double *episodes, double *mean_return, double *mean_length) {
  double c = 0, sr = 0, sl = 0;
  lm_status st = lm_rollout_take_sums(r, &c, &sr, &sl);
  if (st != LM_OK) return st;
  *episodes = c;
  *mean_return = c > 0 ? sr / c : 0;
  *mean_length = c > 0 ? sl / c : 0;
  return LM_OK;
}

/* ---------------------------------------------------------------- checkpoint state */

int lm_rollout_state_per_env(const char *name) { return strcmp(name, "ep.sums") && strcmp(name, "rollout.seed"); }

static const char *const host_names[6] = {"env.state", "env.t", "ep.ret", "ep.len", "ep.sums", "rollout.seed"};

int lm_rollout_state_list(lm_rollout *r, const char **names, size_t *counts, int cap) {
  size_t n = (size_t)r->n, ss = (size_t)r->env->state_size;
  int k = 0;
  if (r->stepper == LM_STEPPER_DEVICE) {
    const char *dev[7] = {"env.state", "env.t", "ep.ret", "ep.len", "ep.sum_ret", "ep.sum_len", "ep.count"};
    for (int i = 0; i < 7 && k < cap; i++, k++) {
      names[k] = dev[i];
      counts[k] = i == 0 ? n * ss : n;
    }
  } else {
    size_t c[6] = {n * ss, n, n, n, 3, 2};
    for (int i = 0; i < 6 && k < cap; i++, k++) names[k] = host_names[i], counts[k] = c[i];
  }
  if (r->env->sticky > 0 && k < cap) names[k] = "env.last_action", counts[k++] = n; /* envs/vec.c */
  return k;
}

/* Host stepper arrays by name; scalars travel as floats split into exact 16-bit pieces. */
static float *host_array(lm_rollout *r, const char *name) {
  if (!strcmp(name, "env.state")) return r->state;
  if (!strcmp(name, "env.t")) return r->t;
  if (!strcmp(name, "ep.ret")) return r->ep_ret;
  if (!strcmp(name, "ep.len")) return r->ep_len;
  if (!strcmp(name, "env.last_action")) return r->last;
  return NULL;
}

lm_status lm_rollout_state_read(lm_rollout *r, const char *name, float *dst, size_t count) {
  if (r->stepper == LM_STEPPER_DEVICE) return lm_program_read(r->prog, name, dst, count);
  float *a = host_array(r, name);
  if (a) {
    memcpy(dst, a, count * sizeof *dst);
    return LM_OK;
  }
  if (!strcmp(name, "ep.sums") && count == 3) {
    dst[0] = (float)r->sum_ret, dst[1] = (float)r->sum_len, dst[2] = (float)r->count;
    return LM_OK;
  }
  if (!strcmp(name, "rollout.seed") && count == 2) {
    dst[0] = (float)(r->seed & 0xffffff), dst[1] = (float)((r->seed >> 24) & 0xffffff);
    return LM_OK;
  }
  return lm_fail(LM_ERR_INVALID, "rollout: no state named '%s'", name);
}

lm_status lm_rollout_state_write(lm_rollout *r, const char *name, const float *src, size_t count) {
  if (r->stepper == LM_STEPPER_DEVICE) return lm_program_write(r->prog, name, src, count);
  float *a = host_array(r, name);
  if (a) {
    memcpy(a, src, count * sizeof *src);
    return LM_OK;
  }
  if (!strcmp(name, "ep.sums") && count == 3) {
    r->sum_ret = src[0], r->sum_len = src[1], r->count = src[2];
    return LM_OK;
  }
  if (!strcmp(name, "rollout.seed") && count == 2) return LM_OK; /* the seed comes from the config */
  return lm_fail(LM_ERR_INVALID, "rollout: no state named '%s'", name);
}

void lm_rollout_set_seed(lm_rollout *r, uint64_t seed) {
  r->seed = seed;
  if (r->stepper == LM_STEPPER_DEVICE) lm_program_set_seed(r->prog, seed);
  else lm_program_set_seed(r->pol, seed);
}
