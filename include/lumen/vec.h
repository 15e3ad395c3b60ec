/* lumen/vec.h — lumen for other languages: a vector env compiled once from lm_env_vec_step (a
 * reset and a step are one program run each), and a policy loaded from a checkpoint that acts on
 * observations. Plain C types, caller-owned buffers and opaque handles only, so a foreign-function
 * layer binds it directly (the Python package, python/lumen, does so through ctypes). Every
 * function that can fail returns an lm_status (or NULL) and leaves lm_last_error's message. */
#ifndef LUMEN_VEC_H
#define LUMEN_VEC_H

#include "lumen/env.h"
#include "lumen/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_vecenv lm_vecenv_t;
typedef struct lm_actor lm_actor_t;

/* The element type of an actions buffer handed to lm_vecenv_step. */
typedef enum lm_vec_dtype {
  LM_VEC_DTYPE_F32, /* float */
  LM_VEC_DTYPE_F64, /* double */
  LM_VEC_DTYPE_I32, /* int32_t (discrete spaces) */
  LM_VEC_DTYPE_I64, /* int64_t (discrete spaces) */
  LM_VEC_DTYPE_COUNT
} lm_vec_dtype;

/* When an ended episode restarts (Gymnasium's AutoresetMode): SAME_STEP in the step that ended it
 * (obs is the new episode's first observation, final_obs the one the step reached), NEXT_STEP in
 * the next step, which ignores that env's action (obs is the observation the step reached; the
 * next step gives the first observation with reward 0 and both flags 0; no final_obs). */
typedef enum lm_vec_autoreset { LM_VEC_SAME_STEP, LM_VEC_NEXT_STEP } lm_vec_autoreset;

/* What a vector env is, for building its spaces: the env's own fields after lm_env_configure
 * (pointers stay valid for the life of the process, like the spec they come from). */
typedef struct lm_vecenv_info {
  const char *name, *gym_id;    /* gym_id may be NULL */
  const char *params;           /* the canonical parameter text ("" when none) */
  const char *device;           /* the backend it runs on ("cpu", "ref", "opencl", ...) */
  int64_t num_envs;
  int state_size, obs_size;
  int obs_rank;                 /* 0: a vector of obs_size; else obs_shape[0..obs_rank) */
  int obs_shape[LM_MAX_RANK];
  int discrete;                 /* 1: Discrete(action_n); 0: Box of action_n dimensions */
  int action_n;
  int action_size;              /* floats per env's action: 1 (discrete) or action_n */
  const float *action_low, *action_high; /* Box: action_n each; discrete: NULL */
  const float *obs_low, *obs_high;       /* obs_size each, or NULL: unbounded */
  int time_limit;
  float solved_return;
  float sticky;
  /* `rltrain check`'s tolerances between the graph and the reference stepper (lm_env_spec) */
  float check_rtol, check_atol, reward_rtol, reward_atol;
  int autoreset;                /* lm_vec_autoreset (lm_vecenv_get_info; 0 from lm_vecenv_spec_info) */
} lm_vecenv_info;

/* ---- the vector env ----
 * env: a built-in name, a Gymnasium id or a plugin path (lm_env_resolve); params: NULL or
 * lm_env_configure's "key=value,..." text; device: "cpu", "ref", "opencl", "cuda", "metal" or
 * "auto" (lm_backend_open; lm_vecenv_why says what auto picked and why); num_envs >= 1.
 * Compiles the reset and the step programs once. Episodes auto-reset in the same step
 * (Gymnasium's AutoresetMode.SAME_STEP): where an episode ends, obs is the new episode's first
 * observation and final_obs the one the step reached.
 *
 * Random streams, keyed by (seed, run counter) as everywhere in lumen: lm_vecenv_reset with a
 * seed s draws env i's first state from the reset graph under (s, run 0) — ref_reset(s, i, 0),
 * where `rltrain record --seed s` starts its episode i — and then the k-th step (k = 0, 1, ...)
 * runs under (s, run k + 1): its auto-resets and sticky actions draw there, never where the first
 * states came from. A reset without a new seed draws at the next unused run counter c and the
 * steps continue from c + 1. lm_vecenv_random_actions gives record's uniform random actions. */
lm_vecenv_t *lm_vecenv_new(const char *env, const char *params, const char *device, int64_t num_envs, uint64_t seed);
/* lm_vecenv_new with the auto-reset mode (lm_vecenv_new is LM_VEC_SAME_STEP). Under NEXT_STEP
 * the reset of an ended episode draws at the step that performs it (run counter k + 1 of that
 * step), so an env's episodes are drawn at other counters than under SAME_STEP. */
lm_vecenv_t *lm_vecenv_open(const char *env, const char *params, const char *device, int64_t num_envs, uint64_t seed,
                            lm_vec_autoreset autoreset);
void lm_vecenv_free(lm_vecenv_t *v);
lm_status lm_vecenv_get_info(const lm_vecenv_t *v, lm_vecenv_info *out);
/* The same fields for an env spec alone (device NULL, num_envs 0): what lm_actor_env's env is. */
lm_status lm_vecenv_spec_info(const lm_env_spec *env, lm_vecenv_info *out);
const lm_env_spec *lm_vecenv_spec(const lm_vecenv_t *v);
/* One line: the backend and, for "auto", why it was picked. */
const char *lm_vecenv_why(const lm_vecenv_t *v);

/* Output buffers of reset and step, each NULL or of the size given: obs and final_obs
 * num_envs * obs_size floats, reward, terminated and truncated num_envs floats (0 or 1). A NULL
 * buffer is not written (lm_vecenv_buffers gives the vec env's own, valid until it is freed);
 * final_obs is never written under NEXT_STEP. */
typedef struct lm_vecenv_out {
  float *obs, *reward, *terminated, *truncated, *final_obs;
} lm_vecenv_out;
lm_vecenv_out lm_vecenv_buffers(lm_vecenv_t *v);
/* The programs' own output buffers, where the backend's memory is the host's (cpu, ref): what a
 * step (step = 1) or a reset (step = 0: obs only) writes, in place, at every call, so a caller
 * can read them without lm_vecenv_step copying anything (pass an lm_vecenv_out of NULLs). NULL
 * fields where the backend's buffers are not host memory (opencl, cuda: copy through out), and
 * final_obs under NEXT_STEP. Valid until the vec env is freed. */
lm_status lm_vecenv_views(lm_vecenv_t *v, int step, lm_vecenv_out *views);

/* Starts every env's episode: with reseed the key becomes seed (as above), without it the key
 * stays and the draws continue. Writes out->obs when given (the other buffers are not touched). */
lm_status lm_vecenv_reset(lm_vecenv_t *v, int reseed, uint64_t seed, const lm_vecenv_out *out);
/* One step of every env: actions are count values of type dtype, num_envs * action_size of them
 * (row-major [num_envs, action_n] for boxes). A discrete action must be a whole number in
 * 0 .. n-1 (floats too); a box action must be finite (the env clips it to its bounds). A bad
 * action, a wrong count or a step before the first reset is LM_ERR_INVALID naming the env, the
 * index and the value, and changes nothing. Copies: the actions into the program's input (one
 * conversion to float), the five outputs from the program into *out (lm_program_read: a
 * memcpy on cpu and ref, a device-to-host transfer on opencl and cuda); out NULL: into the vec
 * env's own buffers. */
lm_status lm_vecenv_step(lm_vecenv_t *v, const void *actions, lm_vec_dtype dtype, size_t count,
                         const lm_vecenv_out *out);
/* The uniform random policy of `rltrain record` at step k of the current key: env i's action is
 * lm_env_ref_random_action(spec, seed, i, k). actions holds num_envs * action_size floats. */
lm_status lm_vecenv_random_actions(const lm_vecenv_t *v, uint64_t k, float *actions, size_t count);
/* The envs' state after the last reset or step, num_envs * state_size floats (for tests and
 * debugging; an env's state layout is its own). write_state replaces it (after a reset: the
 * episodes' step counters stay), which is how a test replays recorded transitions one step each.
 * An env that promises finite values (lm_env_spec.finite) refuses a non-finite state. */
lm_status lm_vecenv_read_state(lm_vecenv_t *v, float *state, size_t count);
lm_status lm_vecenv_write_state(lm_vecenv_t *v, const float *state, size_t count);

/* ---- a policy from a checkpoint ----
 * ckpt: a checkpoint file or a run directory (its latest.ckpt); the env comes with it (by name,
 * or from the plugin file the checkpoint names, lm_checkpoint_env). The weights are copied into a
 * policy program over a batch of any size, compiled on device. */
lm_actor_t *lm_actor_load(const char *ckpt, const char *device);
void lm_actor_free(lm_actor_t *a);
const lm_env_spec *lm_actor_env(const lm_actor_t *a);
/* The seed of sampled actions (RAND stream LM_STREAM_ACTION of the policy; run counter from 0,
 * one per lm_actor_act call). The default is 0. */
void lm_actor_set_seed(lm_actor_t *a, uint64_t seed);
/* Actions for n observations (n * obs_size floats, row-major): greedy takes the argmax of the
 * logits (discrete) or the mean (box); otherwise they are drawn from the policy. Writes n *
 * lm_env_action_size floats: the agent's action indices as whole floats, or box actions not
 * clipped (the env clips them). A non-finite observation is LM_ERR_INVALID naming the row. */
lm_status lm_actor_act(lm_actor_t *a, size_t n, const float *obs, int greedy, float *actions);

#ifdef __cplusplus
}
#endif
#endif
