/* train/act.c — a trained policy as a function (lm_actor_t, lumen/vec.h): the weights of a
 * checkpoint, restored through a trainer as `rltrain eval` does, copied into one policy program
 * over a batch of any size (N is a symbol) that gives the head (logits or mean) and a sampled
 * action per observation. What the Python package's lumen.load_policy(ckpt).act(obs) runs. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core.h"
#include "lumen/train.h"
#include "lumen/vec.h"

struct lm_actor {
  const lm_env_spec *env;
  lm_backend_t *b;
  lm_program_t *p;
  int64_t bound; /* N the program is bound to (0: none yet) */
  float *head;   /* room for the head's output */
  size_t head_cap;
};

/* The policy program (obs [N, obs_size] in; "head" and "sample" out) with the trainer's weights. */
static lm_status build(lm_actor_t *a, const lm_ppo_config *cfg, lm_trainer *t) {
  const lm_env_spec *env = a->env;
  lm_graph_t *g = lm_graph_new();
  if (!g) return LM_ERR_NOMEM;
  lm_dim N = lm_sym(g, "N");
  lm_tensor obs = lm_input(g, "obs", LM_ROLE_DATA, 2, (lm_dim[]){N, env->obs_size});
  lm_policy pol;
  lm_policy_out po;
  lm_status st = lm_policy_build(g, &cfg->policy, env, &pol);
  if (st == LM_OK) st = lm_policy_forward(&pol, obs, &po);
  lm_tensor logp, sample = st == LM_OK ? lm_policy_sample(&pol, &po, LM_STREAM_ACTION, &logp) : (lm_tensor){0};
  if (st == LM_OK) st = lm_output(env->action.kind == LM_SPACE_DISCRETE ? po.logits : po.mean, "head");
  if (st == LM_OK) st = lm_output(sample, "sample");
  if (st == LM_OK && !(a->p = lm_program_new(a->b, g))) st = LM_ERR_INVALID;
  lm_graph_free(g);
  /* the weights live in the rollout program (device stepper) or its policy program (host) */
  lm_program_t *src = lm_rollout_program(lm_trainer_rollout(t));
  if (cfg->stepper == LM_STEPPER_HOST) src = lm_rollout_policy_program(lm_trainer_rollout(t));
  for (int i = 0; i < pol.nparams && st == LM_OK; i++) {
    size_t n = lm_policy_param_size(&pol, i);
    float *buf = lm_malloc(n * sizeof *buf);
    st = buf ? lm_program_read(src, pol.name[i], buf, n) : LM_ERR_NOMEM;
    if (st == LM_OK) st = lm_program_write(a->p, pol.name[i], buf, n);
    lm_free(buf);
  }
  return st;
}

lm_actor_t *lm_actor_load(const char *ckpt, const char *device) {
  if (!ckpt || !*ckpt) {
    lm_fail(LM_ERR_INVALID, "lm_actor_load: no checkpoint given (a .ckpt file or a run directory)");
    return NULL;
  }
  char path[4200];
  struct stat sb;
  if (!stat(ckpt, &sb) && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/latest.ckpt", ckpt);
  else snprintf(path, sizeof path, "%s", ckpt);
  lm_ppo_config cfg;
  const lm_env_spec *env = NULL;
  if (lm_checkpoint_env(path, &env, &cfg) != LM_OK) return NULL;
  lm_actor_t *a = lm_calloc(1, sizeof *a);
  if (!a) return NULL;
  a->env = env;
  char why[512], msg[2048];
  const char *dev = device && *device ? device : "auto";
  lm_trainer *t = NULL;
  lm_status st = LM_OK;
  if (!(a->b = lm_backend_open(dev, why, sizeof why))) {
    st = LM_ERR_UNSUPPORTED;
    snprintf(msg, sizeof msg, "cannot open device '%s': %s", dev, lm_last_error());
    goto fail;
  }
  /* restore the weights through a trainer (its load checks every field), then copy them out */
  if (!(t = lm_trainer_new(a->b, env, &cfg)) || (st = lm_trainer_load(t, path)) != LM_OK || (st = build(a, &cfg, t)) != LM_OK) {
    if (st == LM_OK) st = LM_ERR_INVALID;
    snprintf(msg, sizeof msg, "%s", lm_last_error());
    goto fail;
  }
  lm_trainer_free(t);
  return a;
fail:
  lm_trainer_free(t);
  lm_actor_free(a);
  lm_fail(st, "policy from %s: %s", path, msg);
  return NULL;
}

void lm_actor_free(lm_actor_t *a) {
  if (!a) return;
  lm_program_free(a->p);
  lm_backend_free(a->b);
  lm_free(a->head);
  lm_free(a);
}

const lm_env_spec *lm_actor_env(const lm_actor_t *a) { return a ? a->env : NULL; }

void lm_actor_set_seed(lm_actor_t *a, uint64_t seed) {
  if (!a) return;
  lm_program_set_seed(a->p, seed);
  lm_program_set_run(a->p, 0);
}

lm_status lm_actor_act(lm_actor_t *a, size_t n, const float *obs, int greedy, float *actions) {
  if (!a || !obs || !actions)
    return lm_fail(LM_ERR_INVALID, "lm_actor_act: %s is NULL", !a ? "the policy" : !obs ? "obs" : "actions");
  const lm_env_spec *env = a->env;
  if (n < 1 || n > ((size_t)1 << 24))
    return lm_fail(LM_ERR_INVALID, "%s policy: %zu observations, expected 1 .. %d", env->name, n, 1 << 24);
  size_t O = (size_t)env->obs_size, A = (size_t)lm_env_action_size(env), H = (size_t)env->action.n;
  for (size_t i = 0; i < n * O; i++)
    if (!isfinite(obs[i]))
      return lm_fail(LM_ERR_INVALID, "%s policy: observation %zu holds %g at index %zu", env->name, i / O,
                     (double)obs[i], i % O);
  lm_status st = LM_OK;
  if (a->bound != (int64_t)n) {
    if ((st = lm_program_bind(a->p, "N", (int64_t)n)) != LM_OK) return st;
    a->bound = (int64_t)n;
  }
  if (greedy && env->action.kind == LM_SPACE_DISCRETE && a->head_cap < n * H) {
    float *h = lm_realloc(a->head, n * H * sizeof *h);
    if (!h) return LM_ERR_NOMEM;
    a->head = h, a->head_cap = n * H;
  }
  if ((st = lm_program_write(a->p, "obs", obs, n * O)) != LM_OK || (st = lm_program_run(a->p)) != LM_OK) return st;
  if (!greedy) return lm_program_read(a->p, "sample", actions, n * A);
  if (env->action.kind != LM_SPACE_DISCRETE) return lm_program_read(a->p, "head", actions, n * A);
  if ((st = lm_program_read(a->p, "head", a->head, n * H)) != LM_OK) return st;
  for (size_t i = 0; i < n; i++) {
    const float *row = a->head + i * H;
    size_t best = 0;
    for (size_t k = 1; k < H; k++) best = row[k] > row[best] ? k : best;
    actions[i] = (float)best;
  }
  return LM_OK;
}
