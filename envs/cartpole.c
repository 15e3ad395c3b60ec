/* envs/cartpole.c — CartPole-v1 as Gymnasium 1.x defines it: Euler integration (tau 0.02),
 * force +-10 for actions 1 / 0, reward +1 on every step including the terminating one,
 * termination when |x| > 2.4 or |theta| > 12 degrees, time limit 500, reset uniform in
 * [-0.05, 0.05]^4. State = obs = (x, x_dot, theta, theta_dot). The graph works in float32; the
 * reference stepper computes in double from the float32 state, as Gymnasium does in float64. */
#include <float.h>
#include <math.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define TOTAL_MASS (MASSPOLE + MASSCART)
#define LENGTH 0.5 /* half the pole's length */
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define FORCE_MAG 10.0
#define TAU 0.02
#define THETA_THRESHOLD (12 * 2 * M_PI / 360)
#define X_THRESHOLD 2.4

static const float reset_low[4] = {-0.05f, -0.05f, -0.05f, -0.05f};
static const float reset_high[4] = {0.05f, 0.05f, 0.05f, 0.05f};

static lm_tensor cst(lm_graph_t *g, double v) { return lm_const(g, (float)v); }

static lm_tensor cp_reset(lm_graph_t *g, lm_dim n) { return lm_env_reset_uniform(g, n, 4, reset_low, reset_high); }

static void cp_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor x = lm_env_col(state, 0), x_dot = lm_env_col(state, 1);
  lm_tensor th = lm_env_col(state, 2), th_dot = lm_env_col(state, 3);
  /* action 1 pushes right, anything else left */
  lm_tensor force = lm_add(lm_mul(lm_gt(action, cst(g, 0.5)), cst(g, 2 * FORCE_MAG)), cst(g, -FORCE_MAG));
  lm_tensor c = lm_cos(th), s = lm_sin(th);
  lm_tensor temp = lm_div(lm_add(force, lm_mul(lm_mul(cst(g, POLEMASS_LENGTH), lm_square(th_dot)), s)),
                          cst(g, TOTAL_MASS));
  lm_tensor den = lm_mul(cst(g, LENGTH),
                         lm_sub(cst(g, 4.0 / 3.0), lm_div(lm_mul(cst(g, MASSPOLE), lm_square(c)), cst(g, TOTAL_MASS))));
  lm_tensor th_acc = lm_div(lm_sub(lm_mul(cst(g, GRAVITY), s), lm_mul(c, temp)), den);
  lm_tensor x_acc = lm_sub(temp, lm_div(lm_mul(lm_mul(cst(g, POLEMASS_LENGTH), th_acc), c), cst(g, TOTAL_MASS)));
  lm_tensor cols[4] = {
      lm_add(x, lm_mul(cst(g, TAU), x_dot)),
      lm_add(x_dot, lm_mul(cst(g, TAU), x_acc)),
      lm_add(th, lm_mul(cst(g, TAU), th_dot)),
      lm_add(th_dot, lm_mul(cst(g, TAU), th_acc)),
  };
  /* the termination test reads the columns themselves, not the stacked state: a column of the
   * stack is a sum of every column times 0 or 1, which the compiler must keep (0 * inf is NaN) */
  lm_tensor next = lm_env_stack(cols, 4);
  lm_tensor nx = cols[0], nth = cols[2];
  lm_tensor out_x = lm_add(lm_lt(nx, cst(g, -X_THRESHOLD)), lm_gt(nx, cst(g, X_THRESHOLD)));
  lm_tensor out_th = lm_add(lm_lt(nth, cst(g, -THETA_THRESHOLD)), lm_gt(nth, cst(g, THETA_THRESHOLD)));
  out->state = next;
  out->terminated = lm_gt(lm_add(out_x, out_th), cst(g, 0.5)); /* either: the sum is 0, 1 or 2 */
  out->reward = lm_scalar_like(nx, 1.0f);
}

static lm_tensor cp_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  return state;
}

static void cp_ref_reset(float *state, uint64_t seed, uint64_t env, uint64_t run) {
  lm_env_ref_reset_uniform(state, 4, reset_low, reset_high, seed, env, run);
}

static float cp_ref_step(float *state, const float *action, int *terminated) {
  double x = state[0], x_dot = state[1], theta = state[2], theta_dot = state[3];
  double force = action[0] > 0.5f ? FORCE_MAG : -FORCE_MAG;
  double costheta = cos(theta), sintheta = sin(theta);
  double temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
  double thetaacc = (GRAVITY * sintheta - costheta * temp) /
                    (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
  double xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
  x = x + TAU * x_dot;
  x_dot = x_dot + TAU * xacc;
  theta = theta + TAU * theta_dot;
  theta_dot = theta_dot + TAU * thetaacc;
  state[0] = (float)x;
  state[1] = (float)x_dot;
  state[2] = (float)theta;
  state[3] = (float)theta_dot;
  *terminated = x < -X_THRESHOLD || x > X_THRESHOLD || theta < -THETA_THRESHOLD || theta > THETA_THRESHOLD;
  return 1.0f;
}

static void cp_ref_observe(const float *state, float *obs) {
  for (int k = 0; k < 4; k++) obs[k] = state[k];
}

/* Gymnasium's picture in world units: the 600-pixel screen spans the 4.8 m track. */
static int cp_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  const float cart_y = 0.8f, cart_w = 0.4f, cart_h = 0.24f, pole_len = 2 * (float)LENGTH;
  float axle = cart_y + cart_h / 4;
  lm_draw_cmd all[] = {
      {LM_DRAW_LINE, -2.4f, cart_y, 2.4f, cart_y, 0.0f, 0x000000ffu},                         /* track */
      {LM_DRAW_RECT, s[0] - cart_w / 2, cart_y - cart_h / 2, s[0] + cart_w / 2, cart_y + cart_h / 2, 0.0f,
       0x000000ffu},                                                                              /* cart */
      {LM_DRAW_LINE, s[0], axle, s[0] + pole_len * sinf(s[2]), axle + pole_len * cosf(s[2]), 0.08f,
       0xca9865ffu},                                                                              /* pole */
      {LM_DRAW_CIRCLE, s[0], axle, 0.04f, 0.0f, 0.0f, 0x8184cbffu},                              /* axle */
  };
  int n = 0;
  for (; n < (int)(sizeof all / sizeof all[0]) && n < cap; n++) cmds[n] = all[n];
  return n;
}

const lm_env_spec lm_env_cartpole = {
    .name = "cartpole",
    .gym_id = "CartPole-v1",
    .state_size = 4,
    .obs_size = 4,
    .action = {.kind = LM_SPACE_DISCRETE, .n = 2},
    .time_limit = 500,
    .solved_return = 475.0f,
    .obs_low = (const float[]){-4.8f, -FLT_MAX, -0.41887903f, -FLT_MAX},
    .obs_high = (const float[]){4.8f, FLT_MAX, 0.41887903f, FLT_MAX},
    .world = {-2.4f, 0.0f, 2.4f, 3.2f},
    .fps = 50.0f,
    .check_rtol = 1e-5f,
    .check_atol = 1e-6f,
    .reward_rtol = 0.0f,
    .reward_atol = 0.0f,
    .reset = cp_reset,
    .step = cp_step,
    .observe = cp_observe,
    .ref_reset = cp_ref_reset,
    .ref_step = cp_ref_step,
    .ref_observe = cp_ref_observe,
    .draw = cp_draw,
    /* the fastest to solve of 16 settings tried on seeds 1-10 (2026-12-03): 128k env steps, 0.57 s
     * median, every seed solved; 16 envs, 4 epochs and lr 2.5e-3 took 172k steps and 1.0 s */
    .train_defaults = "envs = 8\nepochs = 2\nlr = 0.005\ntotal_steps = 300000\n",
};
