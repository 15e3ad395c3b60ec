/* train/ppo.c — the PPO trainer: four programs linked to each other's buffers (rollout,
 * bootstrap prep, GAE reverse scan, minibatch update with autograd and Adam), driven by a
 * host loop that launches them and reads a few scalars per iteration. One rank of K (lumen/dist.h)
 * splits the update in two: the gradient graph, then the ranks' gradients summed in rank order,
 * then the Adam graph, so every rank takes the same step. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compiler/core.h"
#include "lumen/autograd.h"
#include "lumen/dist.h"
#include "lumen/ops.h"
#include "lumen/optim.h"
#include "lumen/train.h"

struct lm_trainer {
  const lm_env_spec *env;
  lm_ppo_config cfg;
  lm_backend_t *b;
  lm_rollout *ro;
  lm_program_t *prep, *gae, *upd;
  lm_program_t *adam; /* K > 1: the Adam step, after the gradients of every rank are summed; else NULL */
  lm_dist_t *dist;    /* NULL: one process */
  int K;              /* ranks (1: one process) */
  float *grads;       /* K > 1, host exchange: the gradient vector crossing ranks */
  size_t nweights;
  /* K > 1, exchange between buffers: every rank's gradients gathered into rsum's inputs
   * "all.<param>" ([K, ...], straight from upd's outputs "grad.<param>"), summed there in rank
   * order; Adam's "grad.<param>" inputs are linked to rsum's outputs */
  lm_program_t *rsum;
  lm_nccl_t *nccl; /* the gather is ncclAllGather on the backend's queue; NULL: MPI's, on host memory */
  lm_buffer_view send[LM_POLICY_MAX_PARAMS], recv[LM_POLICY_MAX_PARAMS];
  char exchange[256]; /* how the gradients cross ranks, in words */
  lm_policy upol;
  int64_t iter, steps, total_iters, B, M;
  uint64_t shuffle;
  lm_recent recent; /* episodes of the last iterations, for the "solved" stop (saved in checkpoints) */
};

static const char *const upd_outputs[7] = {"loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "grad_norm"};

static lm_ppo_config base_defaults(void) {
  lm_ppo_config c = {
      .n_envs = 16, .horizon = 128, .total_steps = 500000, .seed = 1, .lr = 2.5e-3f, .anneal_lr = 1,
      .gamma = 0.99f, .gae_lambda = 0.95f, .epochs = 4, .minibatches = 4, .clip_coef = 0.2f, .clip_vloss = 1,
      .ent_coef = 0.01f, .vf_coef = 0.5f, .max_grad_norm = 0.5f, .norm_adv = 1,
      .policy = lm_policy_default(), .stepper = LM_STEPPER_DEVICE,
  };
  return c;
}

lm_status lm_ppo_defaults_for(const lm_env_spec *env, lm_ppo_config *out) {
  *out = base_defaults();
  if (env && env->obs_rank == 3) { /* images: MinAtar's network (conv 3x3 x 16, relu, dense 128, relu) */
    out->policy.conv = 16;
    out->policy.layers = 1, out->policy.hidden[0] = 128;
    out->policy.activation = LM_ACT_RELU;
  }
  if (!env || !env->train_defaults) return LM_OK;
  char origin[96];
  snprintf(origin, sizeof origin, "env %s's train_defaults", env->name ? env->name : "?");
  return lm_ppo_config_apply(out, env->train_defaults, origin, NULL, NULL);
}

lm_ppo_config lm_ppo_defaults(const lm_env_spec *env) {
  lm_ppo_config c;
  if (lm_ppo_defaults_for(env, &c) != LM_OK) c = base_defaults(); /* lm_ppo_defaults_for says why */
  return c;
}

/* The range of every numeric setting, by its name in checkpoints and summaries: the CLI, the
 * trainer and the checkpoint reader all check against this one table. */
static const struct {
  const char *key;
  double lo, hi;
  int integer;
} limits[] = {
    {"envs", 1, 1 << 24, 1},     {"steps", 1, 1 << 20, 1},   {"total_steps", 1, 1e13, 1}, {"lr", 0, 10, 0},
    {"gamma", 0, 1, 0},          {"gae_lambda", 0, 1, 0},    {"epochs", 1, 1000, 1},      {"minibatches", 1, 1 << 20, 1},
    {"clip_coef", 0, 10, 0},     {"ent_coef", 0, 10, 0},     {"vf_coef", 0, 100, 0},      {"max_grad_norm", 0, 1e6, 0},
    {"anneal_lr", 0, 1, 1},      {"clip_vloss", 0, 1, 1},    {"norm_adv", 0, 1, 1},       {"shared", 0, 1, 1},
    {"conv", 0, 1024, 1},        {"exact", 0, 1, 1},
};

int lm_ppo_limit(const char *key, double *lo, double *hi) {
  for (size_t i = 0; i < LM_COUNTOF(limits); i++)
    if (!strcmp(limits[i].key, key)) {
      *lo = limits[i].lo;
      *hi = limits[i].hi;
      return limits[i].integer ? 2 : 1;
    }
  return 0;
}

static lm_status in_range(const char *key, double v) {
  double lo = 0, hi = 0;
  LM_ASSERT(lm_ppo_limit(key, &lo, &hi));
  if (!(v >= lo && v <= hi)) return lm_fail(LM_ERR_INVALID, "ppo: %s = %.9g is outside [%g, %g]", key, v, lo, hi);
  return LM_OK;
}

lm_status lm_ppo_config_check(const lm_ppo_config *c) {
  lm_status st;
  const double v[] = {(double)c->n_envs,     (double)c->horizon,   (double)c->total_steps,   (double)c->lr,
                      (double)c->gamma,      (double)c->gae_lambda, (double)c->epochs,        (double)c->minibatches,
                      (double)c->clip_coef,  (double)c->ent_coef,   (double)c->vf_coef,       (double)c->max_grad_norm,
                      (double)c->anneal_lr,  (double)c->clip_vloss, (double)c->norm_adv,      (double)c->policy.shared,
                      (double)c->policy.conv, (double)c->exact};
  _Static_assert(LM_COUNTOF(v) == LM_COUNTOF(limits), "a setting without a range");
  for (size_t i = 0; i < LM_COUNTOF(limits); i++)
    if ((st = in_range(limits[i].key, v[i])) != LM_OK) return st;
  int64_t B = c->n_envs * c->horizon; /* both under 2^25: no overflow */
  if (B > ((int64_t)1 << 28))
    return lm_fail(LM_ERR_INVALID, "ppo: envs x steps = %lld rows per iteration, over the limit of 2^28", (long long)B);
  if (B % c->minibatches)
    return lm_fail(LM_ERR_INVALID, "ppo: envs x steps (%lld) must split into %d equal minibatches", (long long)B,
                   c->minibatches);
  if (c->policy.layers < 1 || c->policy.layers > LM_POLICY_MAX_LAYERS)
    return lm_fail(LM_ERR_INVALID, "ppo: %d hidden layers, expected 1 to %d", c->policy.layers, LM_POLICY_MAX_LAYERS);
  for (int l = 0; l < c->policy.layers; l++)
    if (c->policy.hidden[l] < 1 || c->policy.hidden[l] > 4096)
      return lm_fail(LM_ERR_INVALID, "ppo: hidden layer %d has width %d, expected 1 to 4096", l, c->policy.hidden[l]);
  if (c->policy.activation != LM_ACT_TANH && c->policy.activation != LM_ACT_RELU)
    return lm_fail(LM_ERR_INVALID, "ppo: unknown activation %d", (int)c->policy.activation);
  if (c->stepper != LM_STEPPER_DEVICE && c->stepper != LM_STEPPER_HOST)
    return lm_fail(LM_ERR_INVALID, "ppo: unknown stepper %d", (int)c->stepper);
  return LM_OK;
}

/* ---------------------------------------------------------------- settings as text */

/* One "key = value" setting into c; 0 with why set when the value is not valid for the key, -1
 * for an unknown key. */
static int apply_one(lm_ppo_config *c, const char *key, const char *v, char *why, size_t cap) {
  double lo, hi;
  int kind = lm_ppo_limit(key, &lo, &hi);
  if (kind) {
    double x = 0;
    long long i = 0;
    if (kind == 2 ? !lm_parse_i64(v, (long long)lo, (long long)hi, &i) : !lm_parse_real(v, &x) || !(x >= lo && x <= hi)) {
      if (kind == 2) snprintf(why, cap, "%s = '%s': expected a whole number in %.0f..%.0f", key, v, lo, hi);
      else snprintf(why, cap, "%s = '%s': expected a number in [%g, %g]", key, v, lo, hi);
      return 0;
    }
    if (kind == 2) x = (double)i;
    if (!strcmp(key, "envs")) c->n_envs = i;
    else if (!strcmp(key, "steps")) c->horizon = i;
    else if (!strcmp(key, "total_steps")) c->total_steps = i;
    else if (!strcmp(key, "lr")) c->lr = (float)x;
    else if (!strcmp(key, "gamma")) c->gamma = (float)x;
    else if (!strcmp(key, "gae_lambda")) c->gae_lambda = (float)x;
    else if (!strcmp(key, "epochs")) c->epochs = (int)i;
    else if (!strcmp(key, "minibatches")) c->minibatches = (int)i;
    else if (!strcmp(key, "clip_coef")) c->clip_coef = (float)x;
    else if (!strcmp(key, "ent_coef")) c->ent_coef = (float)x;
    else if (!strcmp(key, "vf_coef")) c->vf_coef = (float)x;
    else if (!strcmp(key, "max_grad_norm")) c->max_grad_norm = (float)x;
    else if (!strcmp(key, "anneal_lr")) c->anneal_lr = (int)i;
    else if (!strcmp(key, "clip_vloss")) c->clip_vloss = (int)i;
    else if (!strcmp(key, "norm_adv")) c->norm_adv = (int)i;
    else if (!strcmp(key, "shared")) c->policy.shared = (int)i;
    else if (!strcmp(key, "conv")) c->policy.conv = (int)i;
    else if (!strcmp(key, "exact")) c->exact = (int)i;
    else LM_ASSERT(0 && "a setting in the limits table without a field");
    return 1;
  }
  if (!strcmp(key, "seed")) {
    if (!lm_parse_u64(v, &c->seed)) {
      snprintf(why, cap, "seed = '%s': expected a whole number in 0..18446744073709551615", v);
      return 0;
    }
    return 1;
  }
  if (!strcmp(key, "hidden")) {
    lm_policy_config p = c->policy;
    p.layers = 0;
    for (const char *q = v; *q;) {
      char *end;
      errno = 0;
      long w = strtol(q, &end, 10);
      if (end == q || errno || w < 1 || w > 4096 || p.layers >= LM_POLICY_MAX_LAYERS || (*end && *end != ',') ||
          (*end == ',' && !end[1])) {
        snprintf(why, cap, "hidden = '%s': expected 1 to %d widths of 1-4096 such as 64,64", v, LM_POLICY_MAX_LAYERS);
        return 0;
      }
      p.hidden[p.layers++] = (int)w;
      q = *end ? end + 1 : end;
    }
    if (!p.layers) {
      snprintf(why, cap, "hidden is empty");
      return 0;
    }
    c->policy = p;
    return 1;
  }
  if (!strcmp(key, "activation")) {
    if (strcmp(v, "tanh") && strcmp(v, "relu")) {
      snprintf(why, cap, "activation = '%s': expected tanh or relu", v);
      return 0;
    }
    c->policy.activation = !strcmp(v, "relu") ? LM_ACT_RELU : LM_ACT_TANH;
    return 1;
  }
  if (!strcmp(key, "stepper")) {
    if (strcmp(v, "device") && strcmp(v, "host")) {
      snprintf(why, cap, "stepper = '%s': expected device or host", v);
      return 0;
    }
    c->stepper = !strcmp(v, "host") ? LM_STEPPER_HOST : LM_STEPPER_DEVICE;
    return 1;
  }
  return -1;
}

lm_status lm_ppo_config_apply(lm_ppo_config *c, const char *text, const char *origin, const char **keys, int *nkeys) {
  int line = 0, cap = nkeys ? *nkeys : 0;
  if (nkeys) *nkeys = 0;
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    line++;
    const char *e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l) : strlen(l);
    char buf[512], why[256];
    if (len >= sizeof buf) return lm_fail(LM_ERR_INVALID, "%s line %d: longer than %zu characters", origin, line, sizeof buf - 1);
    memcpy(buf, l, len);
    buf[len] = 0;
    char *hash = strchr(buf, '#');
    if (hash) *hash = 0;
    char *k = buf;
    while (*k == ' ' || *k == '\t' || *k == '\r') k++;
    size_t n = strlen(k);
    while (n && (k[n - 1] == ' ' || k[n - 1] == '\t' || k[n - 1] == '\r')) k[--n] = 0;
    if (!*k) continue; /* blank or comment */
    char *eq = strchr(k, '=');
    if (!eq) return lm_fail(LM_ERR_INVALID, "%s line %d: '%s' is not key = value", origin, line, k);
    char *v = eq + 1, *kend = eq;
    while (kend > k && (kend[-1] == ' ' || kend[-1] == '\t')) kend--;
    *kend = 0;
    while (*v == ' ' || *v == '\t') v++;
    int r = apply_one(c, k, v, why, sizeof why);
    if (r < 0) return lm_fail(LM_ERR_INVALID, "%s line %d: unknown setting '%s'", origin, line, k);
    if (r == 0) return lm_fail(LM_ERR_INVALID, "%s line %d: %s", origin, line, why);
    if (keys && *nkeys < cap) {
      static const char *const names[] = {"envs", "steps", "total_steps", "lr", "gamma", "gae_lambda", "epochs",
                                          "minibatches", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm",
                                          "anneal_lr", "clip_vloss", "norm_adv", "shared", "conv", "seed",
                                          "hidden", "activation", "stepper", "exact"};
      for (size_t q = 0; q < LM_COUNTOF(names); q++)
        if (!strcmp(names[q], k)) keys[(*nkeys)++] = names[q];
    }
  }
  return LM_OK;
}

void lm_ppo_config_print(const lm_ppo_config *c, char *buf, size_t cap) {
  char hidden[64] = "";
  for (int l = 0; l < c->policy.layers; l++)
    snprintf(hidden + strlen(hidden), sizeof hidden - strlen(hidden), "%s%d", l ? "," : "", c->policy.hidden[l]);
  snprintf(buf, cap,
           "envs = %lld\nsteps = %lld\ntotal_steps = %lld\nseed = %llu\nlr = %.9g\nanneal_lr = %d\ngamma = %.9g\n"
           "gae_lambda = %.9g\nepochs = %d\nminibatches = %d\nclip_coef = %.9g\nclip_vloss = %d\nent_coef = %.9g\n"
           "vf_coef = %.9g\nmax_grad_norm = %.9g\nnorm_adv = %d\nhidden = %s\nactivation = %s\nshared = %d\n"
           "conv = %d\nstepper = %s\nexact = %d\n",
           (long long)c->n_envs, (long long)c->horizon, (long long)c->total_steps, (unsigned long long)c->seed,
           (double)c->lr, c->anneal_lr, (double)c->gamma, (double)c->gae_lambda, c->epochs, c->minibatches,
           (double)c->clip_coef, c->clip_vloss, (double)c->ent_coef, (double)c->vf_coef, (double)c->max_grad_norm,
           c->norm_adv, hidden, c->policy.activation == LM_ACT_RELU ? "relu" : "tanh", c->policy.shared,
           c->policy.conv, c->stepper == LM_STEPPER_HOST ? "host" : "device", c->exact);
}

/* ---------------------------------------------------------------- graphs */

static lm_dim traj_shape(lm_graph_t *g, int width, lm_dim *shape) {
  shape[0] = lm_sym(g, "T");
  shape[1] = lm_sym(g, "N");
  shape[2] = width;
  return width ? 3 : 2;
}

static lm_tensor traj_input(lm_graph_t *g, const char *name, int width) {
  lm_dim shape[3];
  int rank = (int)traj_shape(g, width, shape);
  return lm_input(g, name, LM_ROLE_DATA, rank, shape);
}

static int64_t gcd(int64_t a, int64_t b);

/* The sizes the trainer will bind, as hints for a schedule search (lm_sym_hint): it times its
 * candidates at them, where it would guess 256 for every symbol (MinAtar Breakout's update runs
 * 1024 rows a minibatch). */
static void hint_shape(lm_graph_t *g, const lm_ppo_config *c, int minibatch) {
  (void)lm_sym_hint(g, "T", c->horizon);
  (void)lm_sym_hint(g, "N", c->n_envs);
  if (!minibatch) return;
  /* and a shuffle like the ones lm_trainer_iterate draws: a multiplier coprime to the batch that
   * scatters the minibatch's rows over it (guessed at 256, the minibatch read 32 rows of 8192
   * again and again: 256 (256 + i) mod 8192) */
  int64_t B = c->horizon * c->n_envs, a = B * 618 / 1000 | 1;
  while (a > 1 && gcd(a, B) != 1) a -= 2;
  (void)lm_sym_hint(g, "M", B / c->minibatches);
  (void)lm_sym_hint(g, "perm_a", a > 0 ? a : 1);
  (void)lm_sym_hint(g, "perm_b", B / 3 > 0 ? B / 3 : 1);
  (void)lm_sym_hint(g, "mb_off", B / c->minibatches);
}

static int act_width(const lm_env_spec *env) { return env->action.kind == LM_SPACE_BOX ? env->action.n : 0; }

/* Bootstrap values: V(final obs) where truncated, V(obs after the rollout) for the last step. */
static lm_graph_t *build_prep(const lm_env_spec *env, const lm_ppo_config *c) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_graph_set_contraction(g, !c->exact);
  lm_dim T = lm_sym(g, "T"), N = lm_sym(g, "N"), B = lm_dim_mul(g, T, N);
  hint_shape(g, c, 0);
  lm_tensor value = traj_input(g, "value", 0), reward = traj_input(g, "reward", 0);
  lm_tensor term = traj_input(g, "terminated", 0), trunc = traj_input(g, "truncated", 0);
  /* an env that truncates at most once a rollout keeps its final obs per env: N forwards */
  int once = lm_rollout_truncates_once(env, c->horizon);
  lm_tensor fin = once ? lm_input(g, "trunc_obs", LM_ROLE_DATA, 2, (lm_dim[]){N, env->obs_size})
                       : traj_input(g, "final_obs", env->obs_size);
  lm_tensor state = lm_input(g, "env.state", LM_ROLE_DATA, 2, (lm_dim[]){N, env->state_size});
  lm_policy pol;
  if (lm_policy_build(g, &c->policy, env, &pol) != LM_OK) goto fail;
  lm_tensor fin_v = once ? lm_broadcast_to(lm_unsqueeze(lm_policy_value(&pol, fin), 0), 2, (lm_dim[]){T, N})
                         : lm_reshape(lm_policy_value(&pol, lm_reshape(fin, 2, (lm_dim[]){B, env->obs_size})), 2,
                                      (lm_dim[]){T, N});
  lm_tensor last_v = lm_policy_value(&pol, env->observe(g, state));
  lm_tensor reward_b = lm_add(reward, lm_mul(lm_mul_scalar(trunc, c->gamma), fin_v));
  lm_tensor done = lm_maximum(term, trunc);
  lm_tensor next_v = lm_concat(lm_slice(value, 0, 1, T), lm_unsqueeze(last_v, 0), 0);
  if (lm_output(reward_b, "reward_b") || lm_output(done, "done") || lm_output(next_v, "next_value")) goto fail;
  return g;
fail:
  lm_graph_free(g);
  return NULL;
}

/* GAE(λ) as a reverse scan: A_t = δ_t + γλ(1 − done_t) A_{t+1}. */
static const char *const gae_per_step[4] = {"reward_b", "done", "value", "next_value"};

static lm_graph_t *build_gae(const lm_ppo_config *c) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_dim N = lm_sym(g, "N");
  (void)lm_sym_hint(g, "N", c->n_envs); /* (T is the scan's, added when the program is made) */
  lm_tensor r = lm_input(g, "reward_b", LM_ROLE_DATA, 1, &N), d = lm_input(g, "done", LM_ROLE_DATA, 1, &N);
  lm_tensor v = lm_input(g, "value", LM_ROLE_DATA, 1, &N), nv = lm_input(g, "next_value", LM_ROLE_DATA, 1, &N);
  lm_tensor a = lm_input(g, "adv_next", LM_ROLE_STATE, 1, &N);
  lm_tensor live = lm_sub(lm_scalar_like(d, 1.0f), d);
  lm_tensor delta = lm_sub(lm_add(r, lm_mul(lm_mul_scalar(live, c->gamma), nv)), v);
  lm_tensor adv = lm_add(delta, lm_mul(lm_mul_scalar(live, c->gamma * c->gae_lambda), a));
  if (lm_assign(a, adv) == LM_OK && lm_output(adv, "adv") == LM_OK) return g;
  lm_graph_free(g);
  return NULL;
}

static lm_adam_cfg adam_config(const lm_ppo_config *c) {
  lm_adam_cfg adam = lm_optim_adam_defaults();
  adam.lr_name = "lr";
  adam.eps = 1e-5f; /* CleanRL's PPO */
  adam.max_grad_norm = c->max_grad_norm;
  return adam;
}

/* The Adam step of a split update: the parameters (linked to the gradient graph's), the summed
 * gradients as data "grad.<param>", the same optimiser state as the one-graph update. */
static lm_graph_t *build_adam(const lm_ppo_config *c, const lm_policy *pol) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_tensor params[LM_POLICY_MAX_PARAMS], grads[LM_POLICY_MAX_PARAMS], gnorm;
  for (int i = 0; i < pol->nparams; i++) {
    lm_dim shape[2] = {pol->rows[i], pol->cols[i]};
    int rank = pol->cols[i] ? 2 : 1;
    char name[40];
    snprintf(name, sizeof name, "grad.%s", pol->name[i]);
    params[i] = lm_input(g, pol->name[i], LM_ROLE_PARAM, rank, shape);
    grads[i] = lm_input(g, name, LM_ROLE_DATA, rank, shape);
  }
  lm_adam_cfg adam = adam_config(c);
  if (lm_optim_adam(&adam, params, grads, pol->nparams, &gnorm) == LM_OK && lm_output(gnorm, "grad_norm") == LM_OK &&
      lm_graph_validate(g) == LM_OK)
    return g;
  lm_graph_free(g);
  return NULL;
}

/* K > 1 with the exchange between buffers: the gathered gradients "all.<param>" [K, ...] summed
 * over the ranks in rank order (a reduction kernel adds rank 0's, then rank 1's, ...: the order
 * lm_dist_sum_f32 adds them in on the host) and divided by K, as outputs "grad.<param>". */
static lm_graph_t *build_rank_sum(const lm_policy *pol, int K) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_status st = LM_OK;
  for (int i = 0; i < pol->nparams && st == LM_OK; i++) {
    lm_dim shape[3] = {K, pol->rows[i], pol->cols[i]};
    int rank = pol->cols[i] ? 3 : 2;
    char name[40];
    snprintf(name, sizeof name, "all.%s", pol->name[i]);
    lm_tensor all = lm_input(g, name, LM_ROLE_DATA, rank, shape);
    snprintf(name, sizeof name, "grad.%s", pol->name[i]);
    st = lm_output(lm_mul(lm_sum(all, 0, 0), lm_const(g, 1.0f / (float)K)), name);
  }
  if (st == LM_OK && lm_graph_validate(g) == LM_OK) return g;
  lm_graph_free(g);
  return NULL;
}

/* One minibatch: rows (a*(off + i) + b) mod B of the flattened trajectory, i < M. */
static lm_tensor minibatch(lm_tensor x, lm_dim B, lm_dim M, lm_dim pa, lm_dim pb, lm_dim off) {
  lm_graph_t *g = x.g;
  int rank = lm_rank(x);
  lm_dim shape[3] = {B, rank == 3 ? lm_dim_of(x, 2) : 0, 0};
  lm_tensor flat = lm_reshape(x, rank - 1, shape);
  lm_tensor shuffled = lm_affine_mod(flat, 0, pa, pb);
  return lm_slice(shuffled, 0, off, lm_dim_add(g, off, M));
}

/* split: the gradients are outputs "grad.<param>" and Adam is a graph of its own (build_adam). */
static lm_graph_t *build_update(const lm_env_spec *env, const lm_ppo_config *c, lm_policy *pol, int split) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_graph_set_contraction(g, !c->exact); /* FMAs: the update's matmuls 1.2x on MinAtar */
  lm_dim T = lm_sym(g, "T"), N = lm_sym(g, "N"), B = lm_dim_mul(g, T, N), M = lm_sym(g, "M");
  lm_dim pa = lm_sym(g, "perm_a"), pb = lm_sym_min(g, "perm_b", 0), off = lm_sym_min(g, "mb_off", 0);
  hint_shape(g, c, 1);
  lm_tensor obs = minibatch(traj_input(g, "obs", env->obs_size), B, M, pa, pb, off);
  lm_tensor act = minibatch(traj_input(g, "action", act_width(env)), B, M, pa, pb, off);
  lm_tensor old_logp = minibatch(traj_input(g, "logp", 0), B, M, pa, pb, off);
  lm_tensor old_v = minibatch(traj_input(g, "value", 0), B, M, pa, pb, off);
  lm_tensor adv = minibatch(traj_input(g, "adv", 0), B, M, pa, pb, off);
  lm_tensor ret = lm_add(adv, old_v);
  if (lm_policy_build(g, &c->policy, env, pol) != LM_OK) goto fail;
  lm_policy_out po;
  if (lm_policy_forward(pol, obs, &po) != LM_OK) goto fail;
  lm_tensor logp = lm_policy_log_prob(pol, &po, act);
  lm_tensor ent = lm_mean(lm_policy_entropy(pol, &po), 0, 0);
  if (c->norm_adv) {
    lm_tensor mu = lm_mean(adv, 0, 1), sd = lm_sqrt(lm_var(adv, 0, 1));
    adv = lm_div(lm_sub(adv, mu), lm_add_scalar(sd, 1e-8f));
  }
  lm_tensor logratio = lm_sub(logp, old_logp), ratio = lm_exp(logratio);
  lm_tensor pg1 = lm_mul(lm_neg(adv), ratio);
  lm_tensor pg2 = lm_mul(lm_neg(adv), lm_clamp(ratio, 1.0f - c->clip_coef, 1.0f + c->clip_coef));
  lm_tensor pg_loss = lm_mean(lm_maximum(pg1, pg2), 0, 0);
  lm_tensor v = po.value, v_loss;
  if (c->clip_vloss) {
    lm_tensor vu = lm_square(lm_sub(v, ret));
    lm_tensor vc = lm_add(old_v, lm_clamp(lm_sub(v, old_v), -c->clip_coef, c->clip_coef));
    v_loss = lm_mul_scalar(lm_mean(lm_maximum(vu, lm_square(lm_sub(vc, ret))), 0, 0), 0.5f);
  } else v_loss = lm_mul_scalar(lm_mean(lm_square(lm_sub(v, ret)), 0, 0), 0.5f);
  lm_tensor loss = lm_add(lm_sub(pg_loss, lm_mul_scalar(ent, c->ent_coef)), lm_mul_scalar(v_loss, c->vf_coef));
  lm_tensor kl = lm_mean(lm_sub(lm_add_scalar(ratio, -1.0f), logratio), 0, 0);
  lm_tensor clipfrac = lm_mean(lm_gt(lm_abs(lm_add_scalar(ratio, -1.0f)), lm_scalar_like(ratio, c->clip_coef)), 0, 0);
  lm_tensor grads[LM_POLICY_MAX_PARAMS], gnorm;
  if (lm_grad(loss, pol->param, pol->nparams, grads) != LM_OK) goto fail;
  lm_tensor outs[7] = {loss, pg_loss, v_loss, ent, kl, clipfrac, {0}};
  if (split) {
    for (int i = 0; i < pol->nparams; i++) {
      char name[40];
      snprintf(name, sizeof name, "grad.%s", pol->name[i]);
      if (lm_output(grads[i], name) != LM_OK) goto fail;
    }
  } else {
    lm_adam_cfg adam = adam_config(c);
    if (lm_optim_adam(&adam, pol->param, grads, pol->nparams, &gnorm) != LM_OK) goto fail;
    outs[6] = gnorm;
  }
  for (int i = 0; i < (split ? 6 : 7); i++)
    if (lm_output(outs[i], upd_outputs[i]) != LM_OK) goto fail;
  return g;
fail:
  lm_graph_free(g);
  return NULL;
}

static lm_program_t *program_of(lm_graph_t *g, lm_backend_t *b, int gae) {
  if (!g) return NULL;
  lm_program_t *p = gae ? lm_program_new_scan(b, g, "T", 1, gae_per_step, 4) : lm_program_new(b, g);
  lm_graph_free(g);
  return p;
}

int lm_trainer_graphs(const lm_env_spec *env, const lm_ppo_config *cfg, lm_train_graph *out, int cap) {
  if (cap < 4) return lm_fail(LM_ERR_INVALID, "lm_trainer_graphs: room for 4 graphs needed"), -1;
  memset(out, 0, 4 * sizeof *out);
  lm_policy pol;
  lm_policy_config pc = cfg->policy;
  out[0].name = "rollout";
  out[0].g = lm_rollout_step_graph(env, &pc, cfg->horizon, &pol);
  out[0].scan = 1;
  out[1] = (lm_train_graph){.name = "prep", .g = build_prep(env, cfg)};
  out[2] = (lm_train_graph){.name = "gae", .g = build_gae(cfg), .scan = 1, .reverse = 1, .n_per_step = 4};
  for (int i = 0; i < 4; i++) out[2].per_step[i] = gae_per_step[i];
  out[3] = (lm_train_graph){.name = "update", .g = build_update(env, cfg, &pol, 0)};
  for (int i = 0; i < 4; i++)
    if (!out[i].g) {
      for (int k = 0; k < 4; k++) lm_graph_free(out[k].g);
      return -1;
    }
  return 4;
}

/* ---------------------------------------------------------------- the trainer */

static lm_status bind_shape(lm_program_t *p, const lm_trainer *t) {
  lm_status st = lm_program_bind(p, "N", t->cfg.n_envs);
  return st == LM_OK ? lm_program_bind(p, "T", t->cfg.horizon) : st;
}

static lm_status link_all(lm_program_t *p, const char *const *names, int n, lm_program_t *owner) {
  for (int i = 0; i < n; i++) {
    lm_status st = lm_program_link(p, names[i], owner, names[i]);
    if (st != LM_OK) return st;
  }
  return LM_OK;
}

static lm_status link_params(lm_program_t *p, const lm_policy *pol, lm_program_t *owner) {
  for (int i = 0; i < pol->nparams; i++) {
    lm_status st = lm_program_link(p, pol->name[i], owner, pol->name[i]);
    if (st != LM_OK) return st;
  }
  return LM_OK;
}

static lm_status wire(lm_trainer *t) {
  const lm_ppo_config *c = &t->cfg;
  lm_program_t *ro = lm_rollout_program(t->ro);
  lm_program_t *pol = c->stepper == LM_STEPPER_HOST ? lm_rollout_policy_program(t->ro) : ro;
  lm_status st;
  if ((st = bind_shape(t->upd, t)) || (st = lm_program_bind(t->upd, "M", t->M)) ||
      (st = lm_program_bind(t->upd, "perm_a", 1)) || (st = lm_program_bind(t->upd, "perm_b", 0)) ||
      (st = lm_program_bind(t->upd, "mb_off", 0)))
    return st;
  if ((st = bind_shape(t->prep, t)) || (st = bind_shape(t->gae, t))) return st;
  if ((st = link_params(pol, &t->upol, t->upd)) || (st = link_params(t->prep, &t->upol, t->upd))) return st;
  const char *traj[4] = {"obs", "action", "logp", "value"};
  if ((st = link_all(t->upd, traj, 4, ro)) || (st = lm_program_link(t->upd, "adv", t->gae, "adv"))) return st;
  const char *prep_in[6] = {"value", "reward", "terminated", "truncated", lm_rollout_final_obs_name(t->env, c->horizon),
                            "env.state"};
  if ((st = link_all(t->prep, prep_in, 6, ro))) return st;
  const char *gae_in[3] = {"reward_b", "done", "next_value"};
  if ((st = link_all(t->gae, gae_in, 3, t->prep)) || (st = lm_program_link(t->gae, "value", ro, "value"))) return st;
  if (t->adam && (st = link_params(t->adam, &t->upol, t->upd))) return st;
  return LM_OK;
}

/* K > 1: how the gradients cross ranks, the same choice on every rank (it follows the backend,
 * which every rank opened by the same name, and NCCL's collective opening, which agrees):
 * - nccl (cuda, libnccl present, every rank on a device of its own): ncclAllGather from the
 *   gradient program's output buffers into the rank sum's input buffers, issued on the backend's
 *   queue between the two programs' runs: no copy through the host and no wait on it;
 * - buffers (ref, cpu: buffers in host memory): MPI's allgather between the same buffers;
 * - host (any backend; opencl, metal, cuda without NCCL): the gradients copied out, summed on the
 *   host in rank order, copied into Adam.
 * buffers and nccl sum with the rank-sum program, host with lm_dist_sum_f32, in the same order:
 * the three give the same bits (tests/mpi: checkpoints of host and buffers runs are identical).
 * LUMEN_DIST_EXCHANGE=host|buffers|nccl asks for one (experiments, tests); one that cannot run
 * here is an error naming why. */
static lm_status setup_exchange(lm_trainer *t) {
  const char *want = getenv("LUMEN_DIST_EXCHANGE");
  if (want && !*want) want = NULL;
  if (want && strcmp(want, "host") && strcmp(want, "buffers") && strcmp(want, "nccl"))
    return lm_fail(LM_ERR_INVALID, "LUMEN_DIST_EXCHANGE='%s': expected host, buffers or nccl", want);
  int cuda = !strcmp(lm_backend_name(t->b), "cuda");
  char why[512] = "";
  if (want && !strcmp(want, "host")) {
    snprintf(t->exchange, sizeof t->exchange, "gradients through the host (LUMEN_DIST_EXCHANGE=host)");
    return LM_OK;
  }
  if (cuda && (!want || !strcmp(want, "nccl"))) {
    /* NCCL refuses two ranks on one GPU; a single GPU can still host several ranks through MPI */
    enum { ID = 192 };
    char mine[ID] = "", *all = lm_calloc((size_t)t->K, ID);
    if (!all) return LM_ERR_NOMEM;
    const char *dev = lm_backend_device_id(t->b);
    char host[96] = "";
    gethostname(host, sizeof host - 1);
    snprintf(mine, sizeof mine, "%s/%s", host, dev ? dev : "?");
    lm_status st = lm_dist_allgather(t->dist, mine, ID, all, "cuda devices");
    int r1 = -1, r2 = -1;
    for (int r = 0; st == LM_OK && r < t->K && r2 < 0; r++)
      for (int q = 0; q < r && r2 < 0; q++)
        if (!strncmp(all + (size_t)r * ID, all + (size_t)q * ID, ID)) r1 = q, r2 = r;
    if (st == LM_OK && r2 >= 0)
      snprintf(why, sizeof why, "ranks %d and %d share the GPU %.*s, which NCCL does not allow", r1, r2, (int)ID,
               all + (size_t)r2 * ID);
    lm_free(all);
    if (st != LM_OK) return st;
    if (!why[0]) {
      t->nccl = lm_nccl_open(t->dist, 0);
      if (!t->nccl) snprintf(why, sizeof why, "%s", lm_last_error());
    }
    if (!t->nccl && want) return lm_fail(LM_ERR_UNSUPPORTED, "LUMEN_DIST_EXCHANGE=nccl: %s", why);
  } else if (want && !strcmp(want, "nccl"))
    return lm_fail(LM_ERR_UNSUPPORTED, "LUMEN_DIST_EXCHANGE=nccl: NCCL runs on the cuda backend, not on %s",
                   lm_backend_name(t->b));
  lm_program_t *rs = program_of(build_rank_sum(&t->upol, t->K), t->b, 0);
  if (!rs) return lm_fail(LM_ERR_INVALID, "the rank sum of the gradients: %s", lm_last_error());
  lm_status st = LM_OK;
  char name[40];
  for (int i = 0; i < t->upol.nparams && st == LM_OK; i++) {
    snprintf(name, sizeof name, "grad.%s", t->upol.name[i]);
    if ((st = lm_program_buffer(t->upd, name, &t->send[i])) != LM_OK) break;
    snprintf(name, sizeof name, "all.%s", t->upol.name[i]);
    if ((st = lm_program_buffer(rs, name, &t->recv[i])) != LM_OK) break;
    if (t->recv[i].count != (size_t)t->K * t->send[i].count)
      st = lm_fail(LM_ERR_INVALID, "%s holds %zu floats, not %d x %zu", name, t->recv[i].count, t->K, t->send[i].count);
    if (!t->nccl && (!t->send[i].host || !t->recv[i].host)) { /* MPI reads and writes host memory only */
      lm_program_free(rs);
      if (want) return lm_fail(LM_ERR_UNSUPPORTED, "LUMEN_DIST_EXCHANGE=buffers: %s's buffers are not host memory", lm_backend_name(t->b));
      snprintf(t->exchange, sizeof t->exchange, "gradients through the host%s%s%s", why[0] ? " (no NCCL: " : "", why,
               why[0] ? ")" : "");
      return LM_OK;
    }
  }
  for (int i = 0; i < t->upol.nparams && st == LM_OK; i++) {
    snprintf(name, sizeof name, "grad.%s", t->upol.name[i]);
    st = lm_program_link(t->adam, name, rs, name);
  }
  t->rsum = rs;
  if (st != LM_OK) return st;
  if (t->nccl)
    snprintf(t->exchange, sizeof t->exchange, "gradients by ncclAllGather between device buffers (%s)", lm_nccl_version(t->nccl));
  else
    snprintf(t->exchange, sizeof t->exchange, "gradients by MPI allgather between the programs' buffers");
  return LM_OK;
}

lm_trainer *lm_trainer_new(lm_backend_t *b, const lm_env_spec *env, const lm_ppo_config *cfg) {
  return lm_trainer_new_dist(b, env, cfg, NULL);
}

lm_trainer *lm_trainer_new_dist(lm_backend_t *b, const lm_env_spec *env, const lm_ppo_config *cfg, lm_dist_t *dist) {
  lm_trainer *t = lm_calloc(1, sizeof *t);
  if (!t) return NULL;
  t->env = env;
  t->cfg = *cfg;
  t->b = b;
  t->dist = dist;
  t->K = dist ? lm_dist_size(dist) : 1;
  int64_t rank = dist ? lm_dist_rank(dist) : 0;
  lm_status st = LM_ERR_INVALID;
  if (lm_ppo_config_check(cfg) != LM_OK) goto fail;
  t->B = cfg->n_envs * cfg->horizon;
  t->M = t->B / cfg->minibatches;
  t->total_iters = cfg->total_steps / (t->B * t->K);
  if (t->total_iters < 1) t->total_iters = 1;
  t->shuffle = cfg->seed * 0x9e3779b97f4a7c15ull + 1;
  if (!(t->upd = program_of(build_update(env, cfg, &t->upol, t->K > 1), b, 0))) goto fail;
  if (t->K > 1) {
    if (!(t->adam = program_of(build_adam(cfg, &t->upol), b, 0))) goto fail;
    for (int i = 0; i < t->upol.nparams; i++) t->nweights += lm_policy_param_size(&t->upol, i);
    if (!(t->grads = lm_malloc(t->nweights * sizeof *t->grads))) goto fail;
  }
  lm_policy_config pc = cfg->policy;
  pc.contract = !cfg->exact; /* the rollout's and the bootstrap's forwards round as the update's */
  if (!(t->ro = lm_rollout_new_part(b, env, &pc, cfg->n_envs, cfg->horizon, cfg->stepper, rank * cfg->n_envs,
                                    t->K * cfg->n_envs)))
    goto fail;
  if (!(t->prep = program_of(build_prep(env, cfg), b, 0)) || !(t->gae = program_of(build_gae(cfg), b, 1))) goto fail;
  if ((st = wire(t)) != LM_OK) goto fail;
  if (t->K > 1 && (st = setup_exchange(t)) != LM_OK) goto fail;
  if ((st = lm_policy_init(&t->upol, t->upd, cfg->seed)) != LM_OK) goto fail;
  if ((st = lm_rollout_reset(t->ro, cfg->seed)) != LM_OK) goto fail;
  return t;
fail: {
  char msg[4096];
  snprintf(msg, sizeof msg, "%s", lm_last_error());
  lm_trainer_free(t);
  lm_fail(st == LM_OK ? LM_ERR_INVALID : st, "%s", msg);
  return NULL;
}
}

void lm_trainer_free(lm_trainer *t) {
  if (!t) return;
  /* linked programs first, owners last */
  lm_program_free(t->adam); /* linked to rsum's outputs: freed first */
  lm_program_free(t->rsum);
  lm_nccl_close(t->nccl);
  lm_free(t->grads);
  lm_program_free(t->gae);
  lm_program_free(t->prep);
  lm_rollout_free(t->ro);
  lm_program_free(t->upd);
  lm_free(t);
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int64_t gcd(int64_t a, int64_t b) {
  while (b) {
    int64_t r = a % b;
    a = b;
    b = r;
  }
  return a;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* K > 1, after a minibatch's gradients: every rank's gradient vector, summed in rank order on
 * every rank and divided by K (each rank's loss is a mean over its own rows: the mean over all
 * ranks' rows is their mean), into the Adam graph, which steps the weights the same everywhere. */
static lm_status step_across_ranks(lm_trainer *t) {
  lm_status st = LM_OK;
  if (t->rsum) { /* setup_exchange: gathered between the buffers, summed by rsum, read there by Adam */
    void *queue = lm_backend_queue(t->b);
    if (t->nccl) st = lm_nccl_group(t->nccl, 1); /* one launch for every parameter's allgather */
    for (int i = 0; i < t->upol.nparams && st == LM_OK; i++)
      st = t->nccl ? lm_nccl_allgather_f32(t->nccl, t->send[i].native, t->recv[i].native, t->send[i].count, queue)
                   : lm_dist_allgather(t->dist, t->send[i].host, t->send[i].count * sizeof(float), t->recv[i].host,
                                       "gradients");
    if (t->nccl) {
      lm_status end = lm_nccl_group(t->nccl, 0);
      if (st == LM_OK) st = end;
    }
    if (st == LM_OK) st = lm_program_run(t->rsum);
    return st == LM_OK ? lm_program_run(t->adam) : st;
  }
  size_t at = 0;
  char name[40];
  for (int i = 0; i < t->upol.nparams && st == LM_OK; i++) {
    size_t n = lm_policy_param_size(&t->upol, i);
    snprintf(name, sizeof name, "grad.%s", t->upol.name[i]);
    st = lm_program_read(t->upd, name, t->grads + at, n);
    at += n;
  }
  if (st == LM_OK) st = lm_dist_sum_f32(t->dist, t->grads, t->nweights, "gradients");
  float inv = 1.0f / (float)t->K;
  for (size_t j = 0; j < t->nweights && st == LM_OK; j++) t->grads[j] *= inv;
  at = 0;
  for (int i = 0; i < t->upol.nparams && st == LM_OK; i++) {
    size_t n = lm_policy_param_size(&t->upol, i);
    snprintf(name, sizeof name, "grad.%s", t->upol.name[i]);
    st = lm_program_write(t->adam, name, t->grads + at, n);
    at += n;
  }
  return st == LM_OK ? lm_program_run(t->adam) : st;
}

lm_status lm_trainer_iterate(lm_trainer *t, lm_iter_stats *s) {
  const lm_ppo_config *c = &t->cfg;
  memset(s, 0, sizeof *s);
  float lr = c->anneal_lr ? c->lr * (1.0f - (float)t->iter / (float)t->total_iters) : c->lr;
  if (lr < 0) lr = 0;
  double t0 = now();
  lm_status st = lm_rollout_run(t->ro);
  double t1 = now();
  size_t n = (size_t)c->n_envs;
  float *zero = lm_calloc(n, sizeof *zero);
  if (!zero) return LM_ERR_NOMEM;
  if (st == LM_OK) st = lm_program_run(t->prep);
  if (st == LM_OK) st = lm_program_write(t->gae, "adv_next", zero, n);
  if (st == LM_OK) st = lm_program_run(t->gae);
  if (st == LM_OK) st = lm_program_write(t->adam ? t->adam : t->upd, "lr", &lr, 1);
  lm_free(zero);
  for (int e = 0; e < c->epochs && st == LM_OK; e++) {
    int64_t a;
    do a = 1 + (int64_t)(splitmix(&t->shuffle) % (uint64_t)(t->B > 1 ? t->B - 1 : 1));
    while (gcd(a, t->B) != 1);
    int64_t b = (int64_t)(splitmix(&t->shuffle) % (uint64_t)t->B);
    if ((st = lm_program_bind(t->upd, "perm_a", a)) || (st = lm_program_bind(t->upd, "perm_b", b))) break;
    for (int m = 0; m < c->minibatches && st == LM_OK; m++) {
      if ((st = lm_program_bind(t->upd, "mb_off", (int64_t)m * t->M)) == LM_OK) st = lm_program_run(t->upd);
      if (st == LM_OK && t->adam) st = step_across_ranks(t);
    }
  }
  double t2 = now();
  float v[7] = {0};
  for (int i = 0; i < 7 && st == LM_OK; i++)
    st = lm_program_read(i == 6 && t->adam ? t->adam : t->upd, upd_outputs[i], &v[i], 1);
  double ep[3] = {0}; /* episodes, sum of returns, sum of lengths */
  if (st == LM_OK) st = lm_rollout_take_sums(t->ro, &ep[0], &ep[1], &ep[2]);
  if (st == LM_OK && t->K > 1) {
    /* the ranks' means of the update statistics and sums of the episodes, in rank order */
    st = lm_dist_sum_f32(t->dist, v, 6, "update statistics");
    for (int i = 0; i < 6; i++) v[i] /= (float)t->K;
    if (st == LM_OK) st = lm_dist_sum_f64(t->dist, ep, 3, "episode statistics");
  }
  if (st != LM_OK) return st;
  s->episodes = ep[0];
  s->mean_return = ep[0] > 0 ? ep[1] / ep[0] : 0;
  s->mean_length = ep[0] > 0 ? ep[2] / ep[0] : 0;
  t->iter++;
  t->steps += t->B * t->K;
  s->iteration = t->iter;
  s->env_steps = t->steps;
  s->lr = lr;
  s->loss = v[0], s->pg_loss = v[1], s->v_loss = v[2], s->entropy = v[3], s->approx_kl = v[4], s->clipfrac = v[5];
  s->grad_norm = v[6];
  s->rollout_s = t1 - t0;
  s->update_s = t2 - t1;
  lm_recent_add(&t->recent, s->episodes, s->episodes * s->mean_return);
  s->recent_return = lm_recent_mean(&t->recent, &s->recent_episodes);
  return LM_OK;
}

/* ---------------------------------------------------------------- the last episodes */

/* Appends an iteration's (episodes, mean return), then drops the oldest entries the last
 * LM_RECENT_EPISODES episodes no longer reach (and entries with no episode): what stays is
 * exactly what lm_recent_mean reads, so a checkpoint holding it resumes the same stop. */
void lm_recent_add(lm_recent *r, double count, double sum) {
  if (!(count > 0)) return;
  if (r->n == LM_RECENT_MAX) { /* only entries of under one episode each could fill it */
    memmove(r->count, r->count + 1, (LM_RECENT_MAX - 1) * sizeof *r->count);
    memmove(r->sum, r->sum + 1, (LM_RECENT_MAX - 1) * sizeof *r->sum);
    r->n--;
  }
  r->count[r->n] = count;
  r->sum[r->n++] = sum;
  double c = 0;
  size_t keep = 0;
  for (size_t i = r->n; i-- > 0;) {
    keep++;
    c += r->count[i];
    if (c >= LM_RECENT_EPISODES) break;
  }
  size_t drop = r->n - keep;
  if (drop) {
    memmove(r->count, r->count + drop, keep * sizeof *r->count);
    memmove(r->sum, r->sum + drop, keep * sizeof *r->sum);
    r->n = keep;
  }
}

double lm_recent_mean(const lm_recent *r, double *episodes) {
  double c = 0, s = 0, want = LM_RECENT_EPISODES;
  for (size_t i = r->n; i-- > 0 && c < want;) {
    double take = r->count[i] < want - c ? r->count[i] : want - c;
    s += r->sum[i] * take / r->count[i];
    c += take;
  }
  if (episodes) *episodes = c;
  return c > 0 ? s / c : 0;
}

const lm_recent *lm_trainer_recent(const lm_trainer *t) { return &t->recent; }
lm_recent *lm_trainer_recent_mut(lm_trainer *t) { return &t->recent; }

int64_t lm_trainer_env_steps(const lm_trainer *t) { return t->steps; }
int64_t lm_trainer_iterations(const lm_trainer *t) { return t->iter; }
int64_t lm_trainer_total_iterations(const lm_trainer *t) { return t->total_iters; }
const lm_ppo_config *lm_trainer_config(const lm_trainer *t) { return &t->cfg; }
lm_rollout *lm_trainer_rollout(lm_trainer *t) { return t->ro; }

int lm_trainer_kernels_per_iteration(lm_trainer *t) {
  lm_program_stats s;
  int total = 0;
  lm_program_t *ro = lm_rollout_program(t->ro);
  if (t->cfg.stepper == LM_STEPPER_HOST) {
    if (lm_program_get_stats(lm_rollout_policy_program(t->ro), &s) == LM_OK) total += s.kernels * (int)t->cfg.horizon;
  } else if (lm_program_get_stats(ro, &s) == LM_OK) total += s.kernels;
  if (lm_program_get_stats(t->prep, &s) == LM_OK) total += s.kernels;
  if (lm_program_get_stats(t->gae, &s) == LM_OK) total += s.kernels;
  if (lm_program_get_stats(t->upd, &s) == LM_OK) total += s.kernels * t->cfg.epochs * t->cfg.minibatches;
  if (t->adam && lm_program_get_stats(t->adam, &s) == LM_OK) total += s.kernels * t->cfg.epochs * t->cfg.minibatches;
  if (t->rsum && lm_program_get_stats(t->rsum, &s) == LM_OK) total += s.kernels * t->cfg.epochs * t->cfg.minibatches;
  return total;
}

/* ---------------------------------------------------------------- for train/checkpoint.c */

lm_program_t *lm_trainer_update_program(lm_trainer *t);
lm_program_t *lm_trainer_adam_program(lm_trainer *t);
void lm_trainer_counters(lm_trainer *t, int64_t **iter, int64_t **steps, uint64_t **shuffle);
const lm_env_spec *lm_trainer_env(const lm_trainer *t);

lm_program_t *lm_trainer_update_program(lm_trainer *t) { return t->upd; }
lm_program_t *lm_trainer_adam_program(lm_trainer *t) { return t->adam; }
lm_dist_t *lm_trainer_dist(const lm_trainer *t) { return t->dist; }
const char *lm_trainer_exchange(const lm_trainer *t) { return t->K > 1 ? t->exchange : ""; }
void lm_trainer_counters(lm_trainer *t, int64_t **iter, int64_t **steps, uint64_t **shuffle) {
  *iter = &t->iter;
  *steps = &t->steps;
  *shuffle = &t->shuffle;
}
const lm_env_spec *lm_trainer_env(const lm_trainer *t) { return t->env; }
