/* envs/mountaincar_continuous.c — MountainCarContinuous-v0 as Gymnasium 1.x defines it: force =
 * action clipped to [-1, 1] times power 0.0015, gravity 0.0025 along cos(3 x), velocity
 * clipped to +-0.07, position to [-1.2, 0.6] with the left-wall rule, termination at x >= 0.45
 * with v >= 0, reward 100 on reaching the goal minus 0.1 a^2 (the unclipped action), time limit
 * 999, reset x uniform in [-0.6, -0.4], v = 0. State = obs = (position, velocity); Gymnasium
 * itself stores this state in float32. */
#include <math.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define MIN_ACTION -1.0
#define MAX_ACTION 1.0
#define MIN_POSITION -1.2
#define MAX_POSITION 0.6
#define MAX_SPEED 0.07
#define GOAL_POSITION 0.45
#define POWER 0.0015
#define GRAVITY 0.0025

int lm_env_mountaincar_draw(const float *s, lm_draw_cmd *cmds, int cap, float goal); /* mountaincar.c */

static const float reset_low[2] = {-0.6f, 0.0f};
static const float reset_high[2] = {-0.4f, 0.0f};

static lm_tensor cst(lm_graph_t *g, double v) { return lm_const(g, (float)v); }

static lm_tensor mcc_reset(lm_graph_t *g, lm_dim n) { return lm_env_reset_uniform(g, n, 2, reset_low, reset_high); }

static void mcc_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor pos = lm_env_col(state, 0), vel = lm_env_col(state, 1);
  lm_tensor a = lm_env_col(action, 0);
  lm_tensor force = lm_clamp(a, (float)MIN_ACTION, (float)MAX_ACTION);
  vel = lm_add(vel, lm_sub(lm_mul(force, cst(g, POWER)), lm_mul(cst(g, GRAVITY), lm_cos(lm_mul(cst(g, 3.0), pos)))));
  vel = lm_clamp(vel, -(float)MAX_SPEED, (float)MAX_SPEED);
  pos = lm_clamp(lm_add(pos, vel), (float)MIN_POSITION, (float)MAX_POSITION);
  lm_tensor stop = lm_mul(lm_le(pos, cst(g, MIN_POSITION)), lm_lt(vel, cst(g, 0.0)));
  vel = lm_env_select(stop, cst(g, 0.0), vel);
  lm_tensor next = lm_contiguous(lm_env_stack((lm_tensor[]){pos, vel}, 2));
  lm_tensor npos = lm_env_col(next, 0), nvel = lm_env_col(next, 1);
  lm_tensor term = lm_mul(lm_ge(npos, cst(g, GOAL_POSITION)), lm_ge(nvel, cst(g, 0.0)));
  out->state = next;
  out->terminated = term;
  out->reward = lm_sub(lm_mul(term, cst(g, 100.0)), lm_mul(lm_square(a), cst(g, 0.1)));
}

static lm_tensor mcc_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  return state;
}

static void mcc_ref_reset(float *state, uint64_t seed, uint64_t env, uint64_t run) {
  lm_env_ref_reset_uniform(state, 2, reset_low, reset_high, seed, env, run);
}

/* Gymnasium's arithmetic: double throughout from the float32 state (this reproduces the
 * recorded transitions bit for bit except on an episode's first step, whose state Gymnasium
 * still holds in float64), stored back as float32 as Gymnasium stores it. */
static float mcc_ref_step(float *state, const float *action, int *terminated) {
  double position = state[0], velocity = state[1];
  double a = action[0];
  double force = a < MIN_ACTION ? MIN_ACTION : a > MAX_ACTION ? MAX_ACTION : a;
  velocity += force * POWER - GRAVITY * cos(3 * position);
  if (velocity > MAX_SPEED) velocity = MAX_SPEED;
  if (velocity < -MAX_SPEED) velocity = -MAX_SPEED;
  position += velocity;
  if (position > MAX_POSITION) position = MAX_POSITION;
  if (position < MIN_POSITION) position = MIN_POSITION;
  if (position == MIN_POSITION && velocity < 0) velocity = 0;
  int term = position >= GOAL_POSITION && velocity >= 0;
  *terminated = term;
  state[0] = (float)position;
  state[1] = (float)velocity;
  double reward = term ? 100.0 : 0.0;
  reward -= a * a * 0.1;
  return (float)reward;
}

static void mcc_ref_observe(const float *state, float *obs) {
  obs[0] = state[0];
  obs[1] = state[1];
}

static int mcc_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  return lm_env_mountaincar_draw(s, cmds, cap, (float)GOAL_POSITION);
}

const lm_env_spec lm_env_mountaincar_continuous = {
    .name = "mountaincar-continuous",
    .gym_id = "MountainCarContinuous-v0",
    .state_size = 2,
    .obs_size = 2,
    .action = {.kind = LM_SPACE_BOX,
               .n = 1,
               .low = (const float[]){(float)MIN_ACTION},
               .high = (const float[]){(float)MAX_ACTION}},
    .time_limit = 999,
    .solved_return = 90.0f,
    .obs_low = (const float[]){(float)MIN_POSITION, -(float)MAX_SPEED},
    .obs_high = (const float[]){(float)MAX_POSITION, (float)MAX_SPEED},
    .world = {-1.2f, -0.05f, 0.6f, 1.15f},
    .fps = 30.0f,
    .check_rtol = 1e-5f,
    .check_atol = 1e-6f,
    .reward_rtol = 1e-6f,
    .reward_atol = 1e-7f,
    .reset = mcc_reset,
    .step = mcc_step,
    .observe = mcc_observe,
    .ref_reset = mcc_ref_reset,
    .ref_step = mcc_ref_step,
    .ref_observe = mcc_ref_observe,
    .draw = mcc_draw,
    .train_defaults = "envs = 32\nsteps = 256\ntotal_steps = 1000000\nlr = 0.001\ngamma = 0.95\nent_coef = 0\nepochs = 10\nminibatches = 32\n",
};
