/* envs/acrobot.c — Acrobot-v1 as Gymnasium 1.x defines it ("book" dynamics): torques -1, 0, +1
 * for actions 0, 1, 2 (torque noise 0), one RK4 step of dt 0.2 over Gymnasium's _dsdt, angles
 * wrapped to [-pi, pi], velocities bounded by 4 pi and 9 pi, termination when the tip rises
 * above one link length over the pivot (-cos t1 - cos(t1 + t2) > 1), reward -1 per step and 0
 * on the terminating one, time limit 500, reset uniform in [-0.1, 0.1]^4.
 * State (theta1, theta2, dtheta1, dtheta2); obs (cos t1, sin t1, cos t2, sin t2, dt1, dt2). */
#include <math.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define DT 0.2
#define LINK_LENGTH_1 1.0
#define LINK_MASS_1 1.0
#define LINK_MASS_2 1.0
#define LINK_COM_POS_1 0.5
#define LINK_COM_POS_2 0.5
#define LINK_MOI 1.0
#define MAX_VEL_1 (4 * M_PI)
#define MAX_VEL_2 (9 * M_PI)
#define GRAV 9.8

static const float reset_low[4] = {-0.1f, -0.1f, -0.1f, -0.1f};
static const float reset_high[4] = {0.1f, 0.1f, 0.1f, 0.1f};

static lm_tensor cst(lm_graph_t *g, double v) { return lm_const(g, (float)v); }

static lm_tensor ab_reset(lm_graph_t *g, lm_dim n) { return lm_env_reset_uniform(g, n, 4, reset_low, reset_high); }

/* Gymnasium's _dsdt for the book dynamics; cos(x - pi/2) written as sin(x). */
static void dsdt(lm_graph_t *g, const lm_tensor *s, lm_tensor a, lm_tensor *d) {
  const double m1 = LINK_MASS_1, m2 = LINK_MASS_2, l1 = LINK_LENGTH_1, lc1 = LINK_COM_POS_1, lc2 = LINK_COM_POS_2;
  const double I1 = LINK_MOI, I2 = LINK_MOI;
  lm_tensor theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
  lm_tensor c2 = lm_cos(theta2), s2 = lm_sin(theta2);
  lm_tensor d1 = lm_add(lm_mul(cst(g, 2 * m2 * l1 * lc2), c2), cst(g, m1 * lc1 * lc1 + m2 * (l1 * l1 + lc2 * lc2) + I1 + I2));
  lm_tensor d2 = lm_add(lm_mul(cst(g, m2 * l1 * lc2), c2), cst(g, m2 * lc2 * lc2 + I2));
  lm_tensor phi2 = lm_mul(cst(g, m2 * lc2 * GRAV), lm_sin(lm_add(theta1, theta2)));
  lm_tensor phi1 = lm_add(
      lm_add(lm_mul(lm_mul(cst(g, -m2 * l1 * lc2), lm_square(dtheta2)), s2),
             lm_mul(lm_mul(lm_mul(cst(g, -2 * m2 * l1 * lc2), dtheta2), dtheta1), s2)),
      lm_add(lm_mul(cst(g, (m1 * lc1 + m2 * l1) * GRAV), lm_sin(theta1)), phi2));
  lm_tensor inv_d1 = lm_recip(d1);
  lm_tensor num = lm_sub(lm_sub(lm_add(a, lm_mul(lm_mul(d2, inv_d1), phi1)),
                                lm_mul(lm_mul(cst(g, m2 * l1 * lc2), lm_square(dtheta1)), s2)),
                         phi2);
  lm_tensor den = lm_sub(cst(g, m2 * lc2 * lc2 + I2), lm_mul(lm_square(d2), inv_d1));
  lm_tensor ddtheta2 = lm_div(num, den);
  lm_tensor ddtheta1 = lm_neg(lm_mul(lm_add(lm_mul(d2, ddtheta2), phi1), inv_d1));
  d[0] = dtheta1;
  d[1] = dtheta2;
  d[2] = ddtheta1;
  d[3] = ddtheta2;
}

/* floor via the op library; ceil(y) = -floor(-y) */
static lm_tensor ceil_(lm_tensor y) { return lm_neg(lm_floor(lm_neg(y))); }

/* Gymnasium's wrap(x, -pi, pi): subtract (add) 2 pi while above pi (below -pi). */
static lm_tensor wrap(lm_graph_t *g, lm_tensor x) {
  lm_tensor pi = cst(g, M_PI), two_pi = cst(g, 2 * M_PI);
  lm_tensor down = lm_mul(lm_gt(x, pi), ceil_(lm_div(lm_sub(x, pi), two_pi)));
  lm_tensor up = lm_mul(lm_lt(x, lm_neg(pi)), ceil_(lm_div(lm_sub(lm_neg(pi), x), two_pi)));
  return lm_add(x, lm_mul(lm_sub(up, down), two_pi));
}

static void ab_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor y0[4], k1[4], k2[4], k3[4], k4[4], y[4];
  for (int i = 0; i < 4; i++) y0[i] = lm_env_col(state, i);
  /* torque = action - 1, by comparisons */
  lm_tensor torque = lm_add(lm_add(lm_gt(action, cst(g, 0.5)), lm_gt(action, cst(g, 1.5))), cst(g, -1.0));
  lm_tensor dt = cst(g, DT), dt2 = cst(g, DT / 2.0);
  dsdt(g, y0, torque, k1);
  for (int i = 0; i < 4; i++) y[i] = lm_add(y0[i], lm_mul(dt2, k1[i]));
  dsdt(g, y, torque, k2);
  for (int i = 0; i < 4; i++) y[i] = lm_add(y0[i], lm_mul(dt2, k2[i]));
  dsdt(g, y, torque, k3);
  for (int i = 0; i < 4; i++) y[i] = lm_add(y0[i], lm_mul(dt, k3[i]));
  dsdt(g, y, torque, k4);
  lm_tensor ns[4];
  for (int i = 0; i < 4; i++) {
    lm_tensor sum = lm_add(lm_add(lm_add(k1[i], lm_mul_scalar(k2[i], 2.0f)), lm_mul_scalar(k3[i], 2.0f)), k4[i]);
    ns[i] = lm_add(y0[i], lm_mul(cst(g, DT / 6.0), sum));
  }
  ns[0] = wrap(g, ns[0]);
  ns[1] = wrap(g, ns[1]);
  ns[2] = lm_clamp(ns[2], -(float)MAX_VEL_1, (float)MAX_VEL_1);
  ns[3] = lm_clamp(ns[3], -(float)MAX_VEL_2, (float)MAX_VEL_2);
  lm_tensor next = lm_contiguous(lm_env_stack(ns, 4));
  lm_tensor t1 = lm_env_col(next, 0), t2 = lm_env_col(next, 1);
  lm_tensor height = lm_sub(lm_neg(lm_cos(t1)), lm_cos(lm_add(t2, t1)));
  out->state = next;
  out->terminated = lm_gt(height, cst(g, 1.0));
  out->reward = lm_add(out->terminated, cst(g, -1.0));
}

static lm_tensor ab_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  lm_tensor t1 = lm_env_col(state, 0), t2 = lm_env_col(state, 1);
  lm_tensor cols[6] = {lm_cos(t1), lm_sin(t1), lm_cos(t2), lm_sin(t2), lm_env_col(state, 2), lm_env_col(state, 3)};
  return lm_env_stack(cols, 6);
}

static void ab_ref_reset(float *state, uint64_t seed, uint64_t env, uint64_t run) {
  lm_env_ref_reset_uniform(state, 4, reset_low, reset_high, seed, env, run);
}

/* ---- the reference: Gymnasium's code in double, operation for operation ---- */

static void ref_dsdt(const double *s, double *d) {
  const double m1 = LINK_MASS_1, m2 = LINK_MASS_2, l1 = LINK_LENGTH_1, lc1 = LINK_COM_POS_1, lc2 = LINK_COM_POS_2;
  const double I1 = LINK_MOI, I2 = LINK_MOI, g = GRAV;
  double a = s[4], theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
  double d1 = m1 * (lc1 * lc1) + m2 * ((l1 * l1) + (lc2 * lc2) + 2 * l1 * lc2 * cos(theta2)) + I1 + I2;
  double d2 = m2 * ((lc2 * lc2) + l1 * lc2 * cos(theta2)) + I2;
  double phi2 = m2 * lc2 * g * cos(theta1 + theta2 - M_PI / 2.0);
  double phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * sin(theta2) - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2) +
                (m1 * lc1 + m2 * l1) * g * cos(theta1 - M_PI / 2) + phi2;
  double ddtheta2 =
      (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * sin(theta2) - phi2) / (m2 * (lc2 * lc2) + I2 - (d2 * d2) / d1);
  double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
  d[0] = dtheta1;
  d[1] = dtheta2;
  d[2] = ddtheta1;
  d[3] = ddtheta2;
  d[4] = 0.0;
}

/* Gymnasium's wrap: its loops subtract or add the period one turn at a time. Past four turns
 * (no step from a state Gymnasium reaches goes there) fmod brings x to within one turn first, so
 * huge angles take constant time; an infinity gives NaN (Gymnasium's loop never ends). The
 * loops then run as Gymnasium's, so every value it meets wraps to the same double. */
static double ref_wrap(double x, double m, double M) {
  double diff = M - m;
  if (isinf(x)) return NAN;
  if (x > M + 4 * diff || x < m - 4 * diff) x = m + fmod(x - m, diff);
  while (x > M) x = x - diff;
  while (x < m) x = x + diff;
  return x;
}

static double ref_bound(double x, double m, double M) { return fmin(fmax(x, m), M); }

static float ab_ref_step(float *state, const float *action, int *terminated) {
  double y0[5], k1[5], k2[5], k3[5], k4[5], y[5];
  for (int i = 0; i < 4; i++) y0[i] = state[i];
  y0[4] = (double)((action[0] > 0.5f) + (action[0] > 1.5f) - 1); /* AVAIL_TORQUE[a] */
  const double dt = DT, dt2 = dt / 2.0;
  ref_dsdt(y0, k1);
  for (int i = 0; i < 5; i++) y[i] = y0[i] + dt2 * k1[i];
  ref_dsdt(y, k2);
  for (int i = 0; i < 5; i++) y[i] = y0[i] + dt2 * k2[i];
  ref_dsdt(y, k3);
  for (int i = 0; i < 5; i++) y[i] = y0[i] + dt * k3[i];
  ref_dsdt(y, k4);
  double ns[4];
  for (int i = 0; i < 4; i++) ns[i] = y0[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
  ns[0] = ref_wrap(ns[0], -M_PI, M_PI);
  ns[1] = ref_wrap(ns[1], -M_PI, M_PI);
  ns[2] = ref_bound(ns[2], -MAX_VEL_1, MAX_VEL_1);
  ns[3] = ref_bound(ns[3], -MAX_VEL_2, MAX_VEL_2);
  *terminated = -cos(ns[0]) - cos(ns[1] + ns[0]) > 1.0;
  for (int i = 0; i < 4; i++) state[i] = (float)ns[i];
  return *terminated ? 0.0f : -1.0f;
}

static void ab_ref_observe(const float *s, float *obs) {
  obs[0] = (float)cos((double)s[0]);
  obs[1] = (float)sin((double)s[0]);
  obs[2] = (float)cos((double)s[1]);
  obs[3] = (float)sin((double)s[1]);
  obs[4] = s[2];
  obs[5] = s[3];
}

/* Gymnasium's picture: both links hang from the origin; the line marks the goal height. */
static int ab_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  float p1x = sinf(s[0]), p1y = -cosf(s[0]);
  float p2x = p1x + sinf(s[0] + s[1]), p2y = p1y - cosf(s[0] + s[1]);
  lm_draw_cmd all[] = {
      {LM_DRAW_LINE, -2.2f, 1.0f, 2.2f, 1.0f, 0.0f, 0x000000ffu},       /* goal height */
      {LM_DRAW_LINE, 0.0f, 0.0f, p1x, p1y, 0.1f, 0x00ccccffu},          /* link 1 */
      {LM_DRAW_LINE, p1x, p1y, p2x, p2y, 0.1f, 0x00ccccffu},            /* link 2 */
      {LM_DRAW_CIRCLE, 0.0f, 0.0f, 0.05f, 0.0f, 0.0f, 0xcccc00ffu},     /* pivot */
      {LM_DRAW_CIRCLE, p1x, p1y, 0.05f, 0.0f, 0.0f, 0xcccc00ffu},       /* joint */
  };
  int n = 0;
  for (; n < (int)(sizeof all / sizeof all[0]) && n < cap; n++) cmds[n] = all[n];
  return n;
}

const lm_env_spec lm_env_acrobot = {
    .name = "acrobot",
    .gym_id = "Acrobot-v1",
    .state_size = 4,
    .obs_size = 6,
    .action = {.kind = LM_SPACE_DISCRETE, .n = 3},
    .time_limit = 500,
    .solved_return = -100.0f,
    .obs_low = (const float[]){-1.0f, -1.0f, -1.0f, -1.0f, -(float)MAX_VEL_1, -(float)MAX_VEL_2},
    .obs_high = (const float[]){1.0f, 1.0f, 1.0f, 1.0f, (float)MAX_VEL_1, (float)MAX_VEL_2},
    .world = {-2.2f, -2.2f, 2.2f, 2.2f},
    .fps = 15.0f,
    .check_rtol = 1e-5f,
    .check_atol = 1e-5f,
    .reward_rtol = 0.0f,
    .reward_atol = 0.0f,
    .reset = ab_reset,
    .step = ab_step,
    .observe = ab_observe,
    .ref_reset = ab_ref_reset,
    .ref_step = ab_ref_step,
    .ref_observe = ab_ref_observe,
    .draw = ab_draw,
    .train_defaults = "total_steps = 500000\nent_coef = 0\n",
};
