/* tests/plugins/catch_pixels.c — bsuite's Catch seen as pixels: the 10 x 5 board as 50 floats
 * (1 where the ball or the paddle is, else 0), as bsuite observes it. A new user's env with an
 * observation wider than 16 floats and no reference stepper: graphs only, one file ending with
 * LM_ENV_PLUGIN. The ball falls one row a step from a random column; the paddle on the bottom
 * row moves left, stays or moves right; at the bottom the episode ends with +1 if the paddle is
 * under the ball, else -1.
 *
 * State (ball column, ball row, paddle column). */
#include "lumen/env.h"
#include "lumen/ops.h"

#define ROWS 10
#define COLS 5

static const float low[3] = {0.0f, 0.0f, 0.0f}, high[3] = {COLS, 0.0f, COLS};

static lm_tensor reset(lm_graph_t *g, lm_dim n) {
  lm_tensor u = lm_env_reset_uniform(g, n, 3, low, high); /* columns uniform in (0, 5] */
  lm_tensor c[3];
  for (int k = 0; k < 3; k++) c[k] = lm_minimum(lm_floor(lm_env_col(u, k)), lm_const(g, COLS - 1));
  return lm_contiguous(lm_env_stack(c, 3));
}

static void step(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  lm_tensor bx = lm_env_col(s, 0), by = lm_env_col(s, 1), px = lm_env_col(s, 2);
  lm_tensor move = lm_sub(lm_clamp(a, 0.0f, 2.0f), lm_const(g, 1.0f)); /* 0, 1, 2 -> -1, 0, +1 */
  lm_tensor np = lm_clamp(lm_add(px, move), 0.0f, COLS - 1);
  lm_tensor nb = lm_add(by, lm_const(g, 1.0f));
  lm_tensor done = lm_ge(nb, lm_const(g, ROWS - 1));
  lm_tensor hit = lm_eq(bx, np);
  lm_tensor c[3] = {bx, nb, np};
  out->state = lm_contiguous(lm_env_stack(c, 3));
  out->terminated = done;
  out->reward = lm_mul(done, lm_sub(lm_mul(hit, lm_const(g, 2.0f)), lm_const(g, 1.0f)));
}

/* the board, row-major: the ball's cell and the paddle's cell on the bottom row */
static lm_tensor observe(lm_graph_t *g, lm_tensor s) {
  lm_tensor ball = lm_add(lm_mul(lm_env_col(s, 1), lm_const(g, COLS)), lm_env_col(s, 0));
  lm_tensor paddle = lm_add(lm_env_col(s, 2), lm_const(g, (ROWS - 1) * COLS));
  return lm_maximum(lm_one_hot(ball, ROWS * COLS), lm_one_hot(paddle, ROWS * COLS));
}

static int draw(const float *s, lm_draw_cmd *cmds, int cap) {
  int n = 0;
  if (n < cap) cmds[n++] = (lm_draw_cmd){LM_DRAW_RECT, s[0], ROWS - 1 - s[1], s[0] + 1, ROWS - s[1], 0, 0xffcc33ffu};
  if (n < cap) cmds[n++] = (lm_draw_cmd){LM_DRAW_RECT, s[2], 0, s[2] + 1, 0.3f, 0, 0x33ccffffu};
  return n;
}

static const lm_env_spec catch_pixels = {
    .name = "catch-pixels",
    .gym_id = "bsuite/catch-pixels",
    .state_size = 3,
    .obs_size = ROWS * COLS,
    .action = {.kind = LM_SPACE_DISCRETE, .n = 3},
    .time_limit = 10,
    .solved_return = 0.9f,
    .world = {0, 0, COLS, ROWS},
    .fps = 10,
    .reset = reset,
    .step = step,
    .observe = observe,
    .draw = draw,
};

LM_ENV_PLUGIN(catch_pixels)
