/* lumen/train.h — PPO on the device: rollouts (lumen/rollout.h), GAE(λ) as a reverse scan,
 * the clipped-surrogate loss with a clipped value loss and an entropy bonus, autograd, Adam
 * with a linearly annealed learning rate and global grad-norm clipping, epochs × minibatches
 * shuffled on the device by an affine index map — and checkpoints that resume a run
 * exactly. The host launches programs and reads a few statistics per iteration. */
#ifndef LUMEN_TRAIN_H
#define LUMEN_TRAIN_H

#include "lumen/dist.h"
#include "lumen/rollout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_ppo_config {
  int64_t n_envs, horizon;  /* N and T: each iteration collects N*T steps */
  int64_t total_steps;      /* stop after this many env steps */
  uint64_t seed;
  float lr;                 /* Adam learning rate (annealed linearly to 0 when anneal_lr) */
  int anneal_lr;
  float gamma, gae_lambda;
  int epochs, minibatches;
  float clip_coef;
  int clip_vloss;
  float ent_coef, vf_coef, max_grad_norm;
  int norm_adv;
  lm_policy_config policy;
  lm_stepper stepper;
  int exact; /* 1: the update keeps the reference's rounding on every backend; 0 (the default):
              * its cpu kernels may contract a*b + c into FMAs and sum narrow reductions in
              * partial sums (lm_graph_set_contraction) */
} lm_ppo_config;

/* Defaults tuned for the env (CartPole solves out of the box). */
/* lumen's defaults, then the env's own (its train_defaults text), or lumen's alone with env NULL.
 * lm_ppo_defaults_for says what is wrong with an env's defaults; lm_ppo_defaults falls back to
 * lumen's then. */
lm_ppo_config lm_ppo_defaults(const lm_env_spec *env);
lm_status lm_ppo_defaults_for(const lm_env_spec *env, lm_ppo_config *out);
/* Settings as text, one "key = value" a line (the names checkpoints and settings.txt use: envs,
 * steps, total_steps, seed, lr, anneal_lr, gamma, gae_lambda, epochs, minibatches, clip_coef,
 * clip_vloss, ent_coef, vf_coef, max_grad_norm, norm_adv, hidden, activation, shared, stepper, exact),
 * '#' starting a comment, applied over *cfg. Every value is checked as the command line checks
 * it; an unknown key or a bad value is LM_ERR_INVALID naming origin, the line and the key. keys
 * (optional, room for *nkeys): the keys set, in order. */
lm_status lm_ppo_config_apply(lm_ppo_config *cfg, const char *text, const char *origin, const char **keys, int *nkeys);
/* One line per field, "key = value", for logs and checkpoints. */
void lm_ppo_config_print(const lm_ppo_config *cfg, char *buf, size_t cap);
/* Every setting within its range (lm_ppo_limit), envs x steps at most 2^28 and a whole number of
 * minibatches, a policy of 1-4 layers of width 1-4096: LM_OK, or LM_ERR_INVALID naming the field. */
lm_status lm_ppo_config_check(const lm_ppo_config *cfg);
/* [lo, hi] of a numeric setting by its checkpoint name ("envs", "lr", ...): 2 for a whole
 * number, 1 for a real one, 0 for an unknown name. */
int lm_ppo_limit(const char *key, double *lo, double *hi);

typedef struct lm_iter_stats {
  int64_t iteration, env_steps;
  double episodes, mean_return, mean_length; /* episodes finished during this iteration */
  double recent_return, recent_episodes;     /* mean return of the last LM_RECENT_EPISODES episodes
                                                of the run (fewer early on: recent_episodes) */
  float lr, loss, pg_loss, v_loss, entropy, approx_kl, clipfrac, grad_norm;
  double rollout_s, update_s;                 /* wall time of the two phases */
} lm_iter_stats;

/* The episodes of the last iterations, as (episodes, sum of returns) per iteration: what the
 * "solved" stop reads. The trainer keeps it and checkpoints save it (exactly), so a resumed run
 * stops where the uninterrupted one does. */
enum { LM_RECENT_EPISODES = 100, LM_RECENT_MAX = 256 };
typedef struct lm_recent {
  double count[LM_RECENT_MAX], sum[LM_RECENT_MAX];
  size_t n;
} lm_recent;
void lm_recent_add(lm_recent *r, double episodes, double sum_of_returns);
/* Mean return of the last LM_RECENT_EPISODES episodes (0 with none); *episodes: how many counted. */
double lm_recent_mean(const lm_recent *r, double *episodes);

typedef struct lm_trainer lm_trainer;

lm_trainer *lm_trainer_new(lm_backend_t *b, const lm_env_spec *env, const lm_ppo_config *cfg);
/* One rank of a data-parallel run over lm_dist_size(dist) ranks (dist NULL: one process, the
 * same as lm_trainer_new). cfg->n_envs is this rank's; rank r's envs are envs r*n_envs ..
 * (r+1)*n_envs-1 of the run's K*n_envs, drawn as one process with K*n_envs envs would draw them;
 * total_steps counts the whole run's steps. With K > 1 the update is a gradient graph, the
 * gradients of all ranks summed in rank order (bitwise the same on every rank), and an Adam
 * graph; statistics are reduced the same way, so every rank holds the same weights and stats.
 * Every rank must call lm_trainer_iterate, lm_trainer_save and lm_trainer_load together. */
lm_trainer *lm_trainer_new_dist(lm_backend_t *b, const lm_env_spec *env, const lm_ppo_config *cfg, lm_dist_t *dist);
lm_dist_t *lm_trainer_dist(const lm_trainer *t);
/* K > 1: how the gradients cross ranks, in words ("gradients by MPI allgather between the
 * programs' buffers", "... ncclAllGather ...", "gradients through the host (...)"); "" for one
 * process. */
const char *lm_trainer_exchange(const lm_trainer *t);
void lm_trainer_free(lm_trainer *t);
/* Collects one rollout and runs epochs × minibatches of updates. */
lm_status lm_trainer_iterate(lm_trainer *t, lm_iter_stats *stats);
int64_t lm_trainer_env_steps(const lm_trainer *t);
int64_t lm_trainer_iterations(const lm_trainer *t);
int64_t lm_trainer_total_iterations(const lm_trainer *t);
const lm_ppo_config *lm_trainer_config(const lm_trainer *t);
lm_rollout *lm_trainer_rollout(lm_trainer *t);
const lm_recent *lm_trainer_recent(const lm_trainer *t);
/* Kernels launched per iteration (rollout + GAE + updates), from the programs' stats. */
int lm_trainer_kernels_per_iteration(lm_trainer *t);

/* The graphs of one training iteration, for compiling without running (rltrain compile):
 * the rollout step (a forward scan over "T"), the bootstrap prep, GAE (a reverse scan over
 * "T" with per-step inputs) and the minibatch update. Returns how many (4), or -1. The
 * caller frees each graph. */
typedef struct lm_train_graph {
  const char *name;
  lm_graph_t *g;
  int scan, reverse;            /* scans run over the symbol "T" */
  const char *per_step[8];
  int n_per_step;
} lm_train_graph;
int lm_trainer_graphs(const lm_env_spec *env, const lm_ppo_config *cfg, lm_train_graph *out, int cap);

/* Checkpoints: weights, optimiser state, env and statistics state, RNG counters, config
 * and step counts; written atomically (temp file + rename) with a format version and a
 * checksum. Loading refuses a corrupt file or one made for another env or shape, with a
 * message saying which. A data-parallel run's checkpoint is the whole run's (envs = K*n_envs,
 * every env's state in order; rank 0 writes it) and resumes at any K dividing its env count. */
lm_status lm_trainer_save(lm_trainer *t, const char *path);
lm_status lm_trainer_load(lm_trainer *t, const char *path);
/* Checkpoints written off the training thread (rltrain's): lm_checkpointer_save reads the
 * trainer's state now (on every rank, as lm_trainer_save) and writes it to paths[0], paths[1],
 * ... in order on a thread of its own (rank 0's), each file as lm_trainer_save writes one; when
 * one cannot be written, the ones before it in that save are removed. A save first waits for
 * the one before it: if that one failed, it returns the failure and saves nothing.
 * lm_checkpointer_finish waits for the last save and returns how it went (lm_last_error says
 * why not); each failure is returned once. lm_checkpointer_free finishes first. */
typedef struct lm_checkpointer lm_checkpointer;
lm_checkpointer *lm_checkpointer_new(void);
lm_status lm_checkpointer_save(lm_checkpointer *w, lm_trainer *t, const char *const *paths, int npaths);
lm_status lm_checkpointer_finish(lm_checkpointer *w);
void lm_checkpointer_free(lm_checkpointer *w);
/* Reads only the config of a checkpoint (to rebuild a trainer before loading it). */
lm_status lm_checkpoint_peek(const char *path, char *env_name, size_t cap, lm_ppo_config *cfg);
/* The env and config of a checkpoint: the env by name, or, for an env from a plugin, loaded
 * again from the plugin file the checkpoint names, which must still hold the same bytes (else
 * the message says what is missing or changed, and how to point at it). */
lm_status lm_checkpoint_env(const char *path, const lm_env_spec **env, lm_ppo_config *cfg);

/* The rltrain command line in this process: lm_rltrain(argc, argv) does what `rltrain argv[1]
 * ... argv[argc - 1]` does (argv[0] is the program's name), so a program can register its own
 * envs (lm_env_register) and hand the rest to rltrain: they are known by name to every command.
 * It prints to stdout and stderr, as rltrain does, and returns rltrain's exit status: 0 success,
 * 1 the work failed, 2 bad input (rltrain help). It never exits the process. */
int lm_rltrain(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
