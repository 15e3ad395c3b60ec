/* examples/pointmass.c — a new env written as a graph in one file: a point mass on the square
 * [-1, 1]^2 pushed by a 2-D force in [-1, 1]^2 must reach a goal drawn at reset. Registered
 * with one line in envs/registry.c; checked with `rltrain record` + `rltrain check`; see
 * docs/ENVS.md for the walk-through.
 *
 * State (x, y, vx, vy, gx, gy); obs (x, y, vx, vy, gx - x, gy - y).
 * Step (dt 0.1): v' = clamp(0.9 v + 0.1 a, -1, 1); p' = clamp(p + 0.1 v', -1, 1), and a
 * velocity component becomes 0 where the wall stopped it. Terminated when |goal - p'| < 0.1.
 * Reward: 10 (d - d') for the progress towards the goal, -0.01 per step, +1 on arrival.
 * Reset: position uniform in [-1, 1]^2, velocity 0, goal uniform in [-0.9, 0.9]^2.
 * Time limit 200. */
#include <math.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define DT 0.1f
#define DAMPING 0.9f
#define GOAL_RADIUS 0.1f

static const float reset_low[6] = {-1.0f, -1.0f, 0.0f, 0.0f, -0.9f, -0.9f};
static const float reset_high[6] = {1.0f, 1.0f, 0.0f, 0.0f, 0.9f, 0.9f};

static lm_tensor pm_reset(lm_graph_t *g, lm_dim n) { return lm_env_reset_uniform(g, n, 6, reset_low, reset_high); }

static lm_tensor dist(lm_tensor dx, lm_tensor dy) { return lm_sqrt(lm_add(lm_square(dx), lm_square(dy))); }

static void pm_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor s[6], ns[6];
  for (int k = 0; k < 6; k++) s[k] = lm_env_col(state, k);
  for (int k = 0; k < 2; k++) {
    lm_tensor a = lm_clamp(lm_env_col(action, k), -1.0f, 1.0f);
    lm_tensor v = lm_clamp(lm_add(lm_mul(s[2 + k], lm_const(g, DAMPING)), lm_mul(a, lm_const(g, DT))), -1.0f, 1.0f);
    lm_tensor free_p = lm_add(s[k], lm_mul(v, lm_const(g, DT)));
    lm_tensor p = lm_clamp(free_p, -1.0f, 1.0f);
    ns[k] = p;
    ns[2 + k] = lm_env_select(lm_ne(p, free_p), lm_const(g, 0.0f), v); /* the wall stops it */
  }
  ns[4] = s[4];
  ns[5] = s[5];
  lm_tensor next = lm_contiguous(lm_env_stack(ns, 6));
  lm_tensor d0 = dist(lm_sub(s[4], s[0]), lm_sub(s[5], s[1]));
  lm_tensor d1 = dist(lm_sub(lm_env_col(next, 4), lm_env_col(next, 0)), lm_sub(lm_env_col(next, 5), lm_env_col(next, 1)));
  lm_tensor term = lm_lt(d1, lm_const(g, GOAL_RADIUS));
  out->state = next;
  out->terminated = term;
  out->reward = lm_add(lm_add(lm_mul(lm_sub(d0, d1), lm_const(g, 10.0f)), lm_const(g, -0.01f)), term);
}

static lm_tensor pm_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  lm_tensor c[6];
  for (int k = 0; k < 4; k++) c[k] = lm_env_col(state, k);
  c[4] = lm_sub(lm_env_col(state, 4), c[0]);
  c[5] = lm_sub(lm_env_col(state, 5), c[1]);
  return lm_env_stack(c, 6);
}

/* ---- the scalar reference stepper: the same float32 operations in the same order ---- */

static float clampf(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

static float distf(float dx, float dy) {
  float xx = dx * dx, yy = dy * dy;
  return sqrtf(xx + yy);
}

static void pm_ref_reset(float *state, uint64_t seed, uint64_t env, uint64_t run) {
  lm_env_ref_reset_uniform(state, 6, reset_low, reset_high, seed, env, run);
}

static float pm_ref_step(float *s, const float *action, int *terminated) {
  float d0 = distf(s[4] - s[0], s[5] - s[1]);
  for (int k = 0; k < 2; k++) {
    float a = clampf(action[k], -1.0f, 1.0f);
    float damped = s[2 + k] * DAMPING, push = a * DT;
    float v = clampf(damped + push, -1.0f, 1.0f);
    float step = v * DT;
    float free_p = s[k] + step;
    float p = clampf(free_p, -1.0f, 1.0f);
    s[k] = p;
    s[2 + k] = p != free_p ? 0.0f : v;
  }
  float d1 = distf(s[4] - s[0], s[5] - s[1]);
  *terminated = d1 < GOAL_RADIUS;
  float progress = (d0 - d1) * 10.0f;
  float r = progress + -0.01f;
  return r + (*terminated ? 1.0f : 0.0f);
}

static void pm_ref_observe(const float *s, float *obs) {
  for (int k = 0; k < 4; k++) obs[k] = s[k];
  obs[4] = s[4] - s[0];
  obs[5] = s[5] - s[1];
}

static int pm_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  lm_draw_cmd all[] = {
      {LM_DRAW_RECT, -1.0f, -1.0f, 1.0f, 1.0f, 0.0f, 0xe0e0e0ffu},                          /* arena */
      {LM_DRAW_CIRCLE, s[4], s[5], GOAL_RADIUS, 0.0f, 0.0f, 0x33aa33ffu},                    /* goal */
      {LM_DRAW_CIRCLE, s[0], s[1], 0.04f, 0.0f, 0.0f, 0x2255ccffu},                          /* mass */
      {LM_DRAW_LINE, s[0], s[1], s[0] + 0.3f * s[2], s[1] + 0.3f * s[3], 0.0f, 0x2255ccffu}, /* velocity */
  };
  int n = 0;
  for (; n < (int)(sizeof all / sizeof all[0]) && n < cap; n++) cmds[n] = all[n];
  return n;
}

const lm_env_spec lm_env_pointmass = {
    .name = "pointmass",
    .gym_id = NULL,
    .state_size = 6,
    .obs_size = 6,
    .action = {.kind = LM_SPACE_BOX,
               .n = 2,
               .low = (const float[]){-1.0f, -1.0f},
               .high = (const float[]){1.0f, 1.0f}},
    .time_limit = 200,
    .solved_return = 8.0f,
    .obs_low = (const float[]){-1.0f, -1.0f, -1.0f, -1.0f, -2.0f, -2.0f},
    .obs_high = (const float[]){1.0f, 1.0f, 1.0f, 1.0f, 2.0f, 2.0f},
    .world = {-1.1f, -1.1f, 1.1f, 1.1f},
    .fps = 30.0f,
    .check_rtol = 1e-5f,
    .check_atol = 1e-6f,
    .reward_rtol = 1e-5f,
    .reward_atol = 1e-6f,
    .reset = pm_reset,
    .step = pm_step,
    .observe = pm_observe,
    .ref_reset = pm_ref_reset,
    .ref_step = pm_ref_step,
    .ref_observe = pm_ref_observe,
    .draw = pm_draw,
    .train_defaults = "envs = 32\nsteps = 256\ntotal_steps = 1000000\nlr = 0.001\ngamma = 0.95\nent_coef = 0\nepochs = 10\nminibatches = 32\n",
};
