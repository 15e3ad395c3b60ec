/* envs/mountaincar.c — MountainCar-v0 as Gymnasium 1.x defines it: actions 0/1/2 push left,
 * coast, push right (force 0.001), gravity 0.0025 along cos(3 x), velocity clipped to +-0.07,
 * position clipped to [-1.2, 0.6] with the velocity zeroed when the car sits at the left wall
 * moving left, termination at x >= 0.5 with v >= 0, reward -1 every step, time limit 200,
 * reset x uniform in [-0.6, -0.4], v = 0. State = obs = (position, velocity). */
#include <math.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define MIN_POSITION -1.2
#define MAX_POSITION 0.6
#define MAX_SPEED 0.07
#define GOAL_POSITION 0.5
#define FORCE 0.001
#define GRAVITY 0.0025

/* velocity's column draws a uniform too (unused: 0 * u + 0), so elements stay env * 2 + k */
static const float reset_low[2] = {-0.6f, 0.0f};
static const float reset_high[2] = {-0.4f, 0.0f};

static lm_tensor cst(lm_graph_t *g, double v) { return lm_const(g, (float)v); }

static lm_tensor mc_reset(lm_graph_t *g, lm_dim n) { return lm_env_reset_uniform(g, n, 2, reset_low, reset_high); }

static void mc_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor pos = lm_env_col(state, 0), vel = lm_env_col(state, 1);
  /* action - 1 for the indices 0, 1, 2, by comparisons */
  lm_tensor push = lm_add(lm_add(lm_gt(action, cst(g, 0.5)), lm_gt(action, cst(g, 1.5))), cst(g, -1.0));
  vel = lm_add(lm_add(vel, lm_mul(push, cst(g, FORCE))), lm_mul(lm_cos(lm_mul(cst(g, 3.0), pos)), cst(g, -GRAVITY)));
  vel = lm_clamp(vel, -(float)MAX_SPEED, (float)MAX_SPEED);
  pos = lm_clamp(lm_add(pos, vel), (float)MIN_POSITION, (float)MAX_POSITION);
  lm_tensor stop = lm_mul(lm_le(pos, cst(g, MIN_POSITION)), lm_lt(vel, cst(g, 0.0)));
  vel = lm_env_select(stop, cst(g, 0.0), vel);
  lm_tensor next = lm_contiguous(lm_env_stack((lm_tensor[]){pos, vel}, 2));
  lm_tensor npos = lm_env_col(next, 0), nvel = lm_env_col(next, 1);
  out->state = next;
  out->terminated = lm_mul(lm_ge(npos, cst(g, GOAL_POSITION)), lm_ge(nvel, cst(g, 0.0)));
  out->reward = lm_scalar_like(npos, -1.0f);
}

static lm_tensor mc_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  return state;
}

static void mc_ref_reset(float *state, uint64_t seed, uint64_t env, uint64_t run) {
  lm_env_ref_reset_uniform(state, 2, reset_low, reset_high, seed, env, run);
}

static float mc_ref_step(float *state, const float *action, int *terminated) {
  double position = state[0], velocity = state[1];
  int a = (action[0] > 0.5f) + (action[0] > 1.5f);
  velocity += (a - 1) * FORCE + cos(3 * position) * (-GRAVITY);
  velocity = velocity < -MAX_SPEED ? -MAX_SPEED : velocity > MAX_SPEED ? MAX_SPEED : velocity;
  position += velocity;
  position = position < MIN_POSITION ? MIN_POSITION : position > MAX_POSITION ? MAX_POSITION : position;
  if (position == MIN_POSITION && velocity < 0) velocity = 0;
  *terminated = position >= GOAL_POSITION && velocity >= 0;
  state[0] = (float)position;
  state[1] = (float)velocity;
  return -1.0f;
}

static void mc_ref_observe(const float *state, float *obs) {
  obs[0] = state[0];
  obs[1] = state[1];
}

/* The hill y = 0.45 sin(3x) + 0.55, the car on it and the goal flag; shared with the
 * continuous variant through lm_env_mountaincar_draw. */
int lm_env_mountaincar_draw(const float *s, lm_draw_cmd *cmds, int cap, float goal);
int lm_env_mountaincar_draw(const float *s, lm_draw_cmd *cmds, int cap, float goal) {
  enum { SEGMENTS = 36 };
  int n = 0;
  const float x0 = (float)MIN_POSITION, x1 = (float)MAX_POSITION;
  for (int i = 0; i < SEGMENTS && n < cap; i++) {
    float a = x0 + (x1 - x0) * (float)i / SEGMENTS, b = x0 + (x1 - x0) * (float)(i + 1) / SEGMENTS;
    cmds[n++] = (lm_draw_cmd){LM_DRAW_LINE, a, 0.45f * sinf(3 * a) + 0.55f, b, 0.45f * sinf(3 * b) + 0.55f, 0.0f,
                              0x000000ffu};
  }
  float gy = 0.45f * sinf(3 * goal) + 0.55f;
  float cy = 0.45f * sinf(3 * s[0]) + 0.55f;
  lm_draw_cmd rest[] = {
      {LM_DRAW_LINE, goal, gy, goal, gy + 0.1f, 0.0f, 0x000000ffu},               /* flagpole */
      {LM_DRAW_RECT, goal, gy + 0.07f, goal + 0.05f, gy + 0.1f, 0.0f, 0xcccc00ffu}, /* flag */
      {LM_DRAW_CIRCLE, s[0], cy + 0.04f, 0.04f, 0.0f, 0.0f, 0x000000ffu},           /* car */
  };
  for (int i = 0; i < (int)(sizeof rest / sizeof rest[0]) && n < cap; i++) cmds[n++] = rest[i];
  return n;
}

static int mc_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  return lm_env_mountaincar_draw(s, cmds, cap, (float)GOAL_POSITION);
}

const lm_env_spec lm_env_mountaincar = {
    .name = "mountaincar",
    .gym_id = "MountainCar-v0",
    .state_size = 2,
    .obs_size = 2,
    .action = {.kind = LM_SPACE_DISCRETE, .n = 3},
    .time_limit = 200,
    .solved_return = -110.0f,
    .obs_low = (const float[]){(float)MIN_POSITION, -(float)MAX_SPEED},
    .obs_high = (const float[]){(float)MAX_POSITION, (float)MAX_SPEED},
    .world = {-1.2f, -0.05f, 0.6f, 1.15f},
    .fps = 30.0f,
    .check_rtol = 1e-5f,
    .check_atol = 1e-6f,
    .reward_rtol = 0.0f,
    .reward_atol = 0.0f,
    .reset = mc_reset,
    .step = mc_step,
    .observe = mc_observe,
    .ref_reset = mc_ref_reset,
    .ref_step = mc_ref_step,
    .ref_observe = mc_ref_observe,
    .draw = mc_draw,
    .train_defaults = "total_steps = 1000000\n",
};
