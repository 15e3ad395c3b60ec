/* envs/pendulum.c — Pendulum-v1 as Gymnasium 1.x defines it: torque clipped to [-2, 2], speed
 * clipped to [-8, 8], dt 0.05, g 10, m = l = 1, reward -(angle_normalize(th)^2 + 0.1 thdot^2
 * + 0.001 u^2) from the state before the step, never terminates, time limit 200, reset uniform
 * in [-pi, pi] x [-1, 1]. State (theta, theta_dot), theta unwrapped as in Gymnasium;
 * obs (cos theta, sin theta, theta_dot). */
#include <math.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define MAX_SPEED 8.0
#define MAX_TORQUE 2.0
#define DT 0.05
#define G 10.0
#define M 1.0
#define L 1.0

static const float reset_low[2] = {-(float)M_PI, -1.0f};
static const float reset_high[2] = {(float)M_PI, 1.0f};

static lm_tensor cst(lm_graph_t *g, double v) { return lm_const(g, (float)v); }

static lm_tensor pd_reset(lm_graph_t *g, lm_dim n) { return lm_env_reset_uniform(g, n, 2, reset_low, reset_high); }

/* ((x + pi) mod 2 pi) - pi with Python's mod (the result takes the divisor's sign). */
static lm_tensor angle_normalize(lm_graph_t *g, lm_tensor x) {
  lm_tensor two_pi = cst(g, 2 * M_PI);
  lm_tensor r = lm_mod(lm_add(x, cst(g, M_PI)), two_pi);
  r = lm_add(r, lm_mul(lm_lt(r, cst(g, 0.0)), two_pi));
  return lm_sub(r, cst(g, M_PI));
}

static void pd_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor th = lm_env_col(state, 0), th_dot = lm_env_col(state, 1);
  lm_tensor u = lm_clamp(lm_env_col(action, 0), -(float)MAX_TORQUE, (float)MAX_TORQUE);
  lm_tensor an = angle_normalize(g, th);
  lm_tensor costs = lm_add(lm_add(lm_square(an), lm_mul(cst(g, 0.1), lm_square(th_dot))),
                           lm_mul(cst(g, 0.001), lm_square(u)));
  lm_tensor acc = lm_add(lm_mul(cst(g, 3 * G / (2 * L)), lm_sin(th)), lm_mul(cst(g, 3.0 / (M * L * L)), u));
  lm_tensor new_th_dot = lm_clamp(lm_add(th_dot, lm_mul(acc, cst(g, DT))), -(float)MAX_SPEED, (float)MAX_SPEED);
  lm_tensor new_th = lm_add(th, lm_mul(new_th_dot, cst(g, DT)));
  out->state = lm_contiguous(lm_env_stack((lm_tensor[]){new_th, new_th_dot}, 2));
  out->reward = lm_neg(costs);
  out->terminated = lm_scalar_like(th, 0.0f);
}

static lm_tensor pd_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  lm_tensor th = lm_env_col(state, 0);
  return lm_env_stack((lm_tensor[]){lm_cos(th), lm_sin(th), lm_env_col(state, 1)}, 3);
}

static void pd_ref_reset(float *state, uint64_t seed, uint64_t env, uint64_t run) {
  lm_env_ref_reset_uniform(state, 2, reset_low, reset_high, seed, env, run);
}

static double py_mod(double x, double m) {
  double r = fmod(x, m);
  if (r != 0 && ((r < 0) != (m < 0))) r += m;
  return r;
}

/* Gymnasium's arithmetic: the torque is the float32 action clipped in float32, everything else
 * double (this reproduces the recorded float64 transitions bit for bit from float64 states). */
static float pd_ref_step(float *state, const float *action, int *terminated) {
  double th = state[0], thdot = state[1];
  float uf = action[0];
  uf = uf < -(float)MAX_TORQUE ? -(float)MAX_TORQUE : uf > (float)MAX_TORQUE ? (float)MAX_TORQUE : uf;
  double u = uf;
  double an = py_mod(th + M_PI, 2 * M_PI) - M_PI;
  double costs = an * an + 0.1 * (thdot * thdot) + 0.001 * (u * u);
  double newthdot = thdot + (3 * G / (2 * L) * sin(th) + 3.0 / (M * L * L) * u) * DT;
  newthdot = newthdot < -MAX_SPEED ? -MAX_SPEED : newthdot > MAX_SPEED ? MAX_SPEED : newthdot;
  double newth = th + newthdot * DT;
  state[0] = (float)newth;
  state[1] = (float)newthdot;
  *terminated = 0;
  return (float)-costs;
}

static void pd_ref_observe(const float *state, float *obs) {
  obs[0] = (float)cos((double)state[0]);
  obs[1] = (float)sin((double)state[0]);
  obs[2] = state[1];
}

/* Gymnasium's picture: a rod of length 1 from the origin, theta = 0 pointing up. */
static int pd_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  float ex = -sinf(s[0]), ey = cosf(s[0]);
  lm_draw_cmd all[] = {
      {LM_DRAW_LINE, 0.0f, 0.0f, ex, ey, 0.2f, 0xcc4c4cffu},         /* rod */
      {LM_DRAW_CIRCLE, ex, ey, 0.1f, 0.0f, 0.0f, 0xcc4c4cffu},       /* bob */
      {LM_DRAW_CIRCLE, 0.0f, 0.0f, 0.05f, 0.0f, 0.0f, 0x000000ffu},  /* axle */
  };
  int n = 0;
  for (; n < (int)(sizeof all / sizeof all[0]) && n < cap; n++) cmds[n] = all[n];
  return n;
}

const lm_env_spec lm_env_pendulum = {
    .name = "pendulum",
    .gym_id = "Pendulum-v1",
    .state_size = 2,
    .obs_size = 3,
    .action = {.kind = LM_SPACE_BOX,
               .n = 1,
               .low = (const float[]){-(float)MAX_TORQUE},
               .high = (const float[]){(float)MAX_TORQUE}},
    .time_limit = 200,
    .solved_return = -200.0f,
    .obs_low = (const float[]){-1.0f, -1.0f, -(float)MAX_SPEED},
    .obs_high = (const float[]){1.0f, 1.0f, (float)MAX_SPEED},
    .world = {-2.2f, -2.2f, 2.2f, 2.2f},
    .fps = 30.0f,
    .check_rtol = 1e-5f,
    .check_atol = 2e-5f,
    .reward_rtol = 1e-5f,
    .reward_atol = 5e-5f,
    .reset = pd_reset,
    .step = pd_step,
    .observe = pd_observe,
    .ref_reset = pd_ref_reset,
    .ref_step = pd_ref_step,
    .ref_observe = pd_ref_observe,
    .draw = pd_draw,
    .train_defaults = "envs = 32\nsteps = 256\ntotal_steps = 1000000\nlr = 0.001\ngamma = 0.95\nent_coef = 0\nepochs = 10\nminibatches = 32\n",
};
