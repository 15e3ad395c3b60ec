/* lumen/rollout.h — the fused rollout: a scan over T steps of observe → policy → sample →
 * env step → auto-reset for N envs, writing the trajectory (obs, action, log-prob, value,
 * reward, terminated, truncated, final obs) and keeping episode statistics on the device.
 * Env-local, so the compiler makes it one kernel per rollout. Also the CPU-stepped
 * baseline: the same policy program on the device, the env stepped by the scalar reference
 * on the host, data copied across every step. */
#ifndef LUMEN_ROLLOUT_H
#define LUMEN_ROLLOUT_H

#include "lumen/env.h"
#include "lumen/policy.h"
#include "lumen/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RAND stream of action sampling. */
enum { LM_STREAM_ACTION = 1 };

typedef enum lm_stepper { LM_STEPPER_DEVICE, LM_STEPPER_HOST } lm_stepper;

typedef struct lm_rollout lm_rollout;

/* 1 when an env truncates at most once in a rollout of `horizon` steps (its time limit is at
 * least the horizon: the step counter restarts at 0 after a truncation). A rollout then keeps
 * the final observation of each env's truncated episode, "trunc_obs" [N, obs] (zeros after a
 * reset, a stale row where the env did not truncate in this rollout), not one per step: the
 * bootstrap of a truncated episode, V(final obs), needs N policy forwards and not T N. */
int lm_rollout_truncates_once(const lm_env_spec *env, int64_t horizon);
/* The name of the trajectory's final observations: "trunc_obs" [N, obs] when
 * lm_rollout_truncates_once, else "final_obs" [T, N, obs] (the observation each step reached,
 * before an auto-reset). */
const char *lm_rollout_final_obs_name(const lm_env_spec *env, int64_t horizon);

/* The device stepper's step graph (scan it over "T" = horizon), and the policy declared in it. */
lm_graph_t *lm_rollout_step_graph(const lm_env_spec *env, const lm_policy_config *cfg, int64_t horizon,
                                  lm_policy *policy);

/* Names of the trajectory buffers, each [T, N, ...]: "obs", "action", "logp", "value",
 * "reward", "terminated", "truncated", and the final observations (lm_rollout_final_obs_name:
 * "trunc_obs" [N, obs] or "final_obs" [T, N, obs]). Episode statistics are per-env STATE:
 * "ep.ret", "ep.len" (running), "ep.sum_ret", "ep.sum_len", "ep.count" (finished since the
 * last lm_rollout_take_stats). Env state: "env.state", "env.t". Policy parameters: the
 * policy's names (link them to the trainer's). */
lm_rollout *lm_rollout_new(lm_backend_t *b, const lm_env_spec *env, const lm_policy_config *cfg, int64_t n_envs,
                           int64_t horizon, lm_stepper stepper);
/* The same rollout as one part of a batch of all_envs envs (one rank of several): its n_envs envs
 * are envs first_env .. first_env+n_envs-1 of the batch, every random draw (resets, actions,
 * sticky actions) keyed by that global index, so the part collects exactly what those envs of a
 * one-process rollout over all_envs collect. lm_rollout_new is the part (0, n_envs). */
lm_rollout *lm_rollout_new_part(lm_backend_t *b, const lm_env_spec *env, const lm_policy_config *cfg, int64_t n_envs,
                                int64_t horizon, lm_stepper stepper, int64_t first_env, int64_t all_envs);
void lm_rollout_free(lm_rollout *r);
/* The program that owns the trajectory and env state (for links and reads). */
lm_program_t *lm_rollout_program(lm_rollout *r);
/* The policy program of the host stepper (NULL for the device stepper). */
lm_program_t *lm_rollout_policy_program(lm_rollout *r);
const lm_policy *lm_rollout_policy(const lm_rollout *r);
/* Resets every env (RAND resets drawn from the seed) and zeroes the statistics. */
lm_status lm_rollout_reset(lm_rollout *r, uint64_t seed);
/* Collects T steps of N envs. */
lm_status lm_rollout_run(lm_rollout *r);
/* Episodes finished since the last call: count, mean return and mean length (0 if none);
 * then starts counting afresh. Reads N floats per statistic. */
lm_status lm_rollout_take_stats(lm_rollout *r, double *episodes, double *mean_return, double *mean_length);
/* The same as sums (of returns and of lengths), which add up across the parts of a batch. */
lm_status lm_rollout_take_sums(lm_rollout *r, double *episodes, double *sum_return, double *sum_length);
/* The rollout's persistent state as named float arrays (env state, episode counters), for
 * checkpoints: names[i] with counts[i] elements; returns how many (at most cap). */
int lm_rollout_state_list(lm_rollout *r, const char **names, size_t *counts, int cap);
/* 1 when the state array `name` holds a row per env (a batch's parts hold rows of it), 0 for the
 * host stepper's scalars ("ep.sums", "rollout.seed"). */
int lm_rollout_state_per_env(const char *name);
lm_status lm_rollout_state_read(lm_rollout *r, const char *name, float *dst, size_t count);
lm_status lm_rollout_state_write(lm_rollout *r, const char *name, const float *src, size_t count);
/* Sets the seed without resetting (after restoring a checkpoint). */
void lm_rollout_set_seed(lm_rollout *r, uint64_t seed);
/* Run counters of the programs (for checkpoints) and their restoration. */
uint64_t lm_rollout_run_index(const lm_rollout *r);
void lm_rollout_set_run_index(lm_rollout *r, uint64_t run);

#ifdef __cplusplus
}
#endif
#endif
