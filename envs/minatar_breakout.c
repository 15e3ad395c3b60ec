/* envs/minatar_breakout.c — MinAtar Breakout as the minatar package 1.0.15 plays it
 * (environments/breakout.py): a paddle on row 9 of a 10x10 grid, a ball moving on diagonals,
 * three rows of bricks (+1 each, refilled when the wall is cleared and the ball reaches row 9),
 * termination when the ball passes the paddle. MinAtar's full action set of 6 (n l u r d f;
 * only l and r act); sticky actions (MinAtar's 0.1) and the minimal set n l r are the vec env's
 * wrappers (spec.sticky, spec.action_sets; rltrain --env). State (108): ball_x, ball_y, ball_dir, pos, strike, last_x, last_y, terminal, then
 * brick_map 10x10 row-major; obs (400): the 10x10x4 boolean grid over (y, x, channel) as 0/1,
 * channels paddle, ball, trail, brick. Every value is a small integer: the float32 graph, the
 * scalar reference stepper and MinAtar agree bit for bit. Bricks lie on rows 1..3 in every
 * state a reset and the steps reach (the tests check the reference stepper keeps it so), and
 * the graph reads and writes those rows only: a state with bricks elsewhere, which MinAtar never
 * makes, loses them in a step. */
#include "lumen/env.h"
#include "lumen/ops.h"
#include "lumen/rand.h"

enum { BALL_X, BALL_Y, BALL_DIR, POS, STRIKE, LAST_X, LAST_Y, TERMINAL, BRICKS, SCALARS = BRICKS };
enum { H = 10, W = 10, CELLS = H * W, STATE_SIZE = SCALARS + CELLS, CHANNELS = 4, OBS_SIZE = CELLS * CHANNELS };
enum { CH_PADDLE, CH_BALL, CH_TRAIL, CH_BRICK };
enum { ACT_LEFT = 1, ACT_RIGHT = 3 }; /* action_map = n l u r d f */
enum { BRICK_ROW0 = 1, BRICK_ROW1 = 4 }; /* brick_map[1:4, :] = 1 */

/* ball_dir: 0 up-left, 1 up-right, 2 down-right, 3 down-left (y grows downwards) */
static const float dir_dx[4] = {-1, 1, 1, -1}, dir_dy[4] = {-1, -1, 1, 1};
static const float flip_x[4] = {1, 0, 3, 2};   /* a side wall */
static const float flip_y[4] = {3, 2, 1, 0};   /* the top, a brick, the paddle under the ball's column */
static const float flip_xy[4] = {2, 3, 0, 1};  /* the paddle's corner: straight back */

/* ================================================================ the graphs */

static lm_tensor cst(lm_graph_t *g, float v) { return lm_const(g, v); }
static lm_tensor not01(lm_tensor c) { return lm_add(lm_neg(c), cst(c.g, 1.0f)); }
static lm_tensor sel(lm_tensor c, lm_tensor a, lm_tensor b) { return lm_env_select(c, a, b); }

/* Python's table[d] for d in {0, 1, 2, 3}, as a staircase of selects: table[0] plus, for each
 * k where the table changes, (d >= k) * (table[k] - table[k-1]). Small integers: exact. */
static lm_tensor lut4(lm_tensor d, const float table[4]) {
  lm_graph_t *g = d.g;
  lm_tensor v = lm_scalar_like(d, table[0]);
  for (int k = 1; k < 4; k++) {
    float step = table[k] - table[k - 1];
    if (step == 0) continue;
    lm_tensor at = lm_ge(d, cst(g, (float)k));
    v = lm_add(v, step == 1 ? at : lm_mul(at, cst(g, step)));
  }
  return v;
}

/* Grids. The brick map is worked on in the state's own columns, as [N, STATE_SIZE] with cell
 * (y, x) at column BRICKS + 10 y + x and 0 on the scalars' columns: every map the step makes is
 * then read at the column it is written at, with no offset (so the cpu scan keeps each env's
 * step in one kernel), and the new state is the scalars' stack plus the new map. */
static lm_tensor wide(lm_tensor cells) { return lm_pad(cells, 1, BRICKS, 0); } /* [., CELLS] -> [., STATE_SIZE] */

static lm_tensor ones(lm_graph_t *g, int n) { return lm_broadcast_to(cst(g, 1.0f), 2, (lm_dim[]){1, n}); }

/* [1, STATE_SIZE]: 1 on the brick rows 1..3 (padded constants: views) */
static lm_tensor brick_rows(lm_graph_t *g) {
  return wide(lm_pad(ones(g, (BRICK_ROW1 - BRICK_ROW0) * W), 1, BRICK_ROW0 * W, (H - BRICK_ROW1) * W));
}

/* [N, CELLS] (in_state = 0) or [N, STATE_SIZE] (in_state = 1): 1 at cell (y, x), 0 elsewhere
 * and everywhere when (y, x) is off the grid: lm_env_cell_mask, or the same mask over the
 * state's own columns (cell (y, x) at column BRICKS + 10 y + x; a mask padded into them would be
 * read at an offset, which the cpu scan cannot prove stays in each env's row, and splits the
 * step). One comparison per column with the cell's flat index (-1 off the grid). */
static lm_tensor cell_mask(lm_tensor y, lm_tensor x, int in_state) {
  if (!in_state) return lm_env_cell_mask(y, x, H, W);
  lm_tensor cols = lm_reshape(lm_arange(x.g, STATE_SIZE), 2, (lm_dim[]){1, STATE_SIZE});
  return lm_eq(lm_unsqueeze(lm_env_cell_index(y, x, H, W, BRICKS), 1), cols);
}

/* The 8 scalars [N] and a wide map [N, STATE_SIZE] (0 on the scalars' columns) as the state. */
static lm_tensor pack(const lm_tensor *scalars, lm_tensor map) {
  return lm_add(lm_pad(lm_env_stack(scalars, SCALARS), 1, 0, CELLS), map);
}

/* reset(): ball_start = randint(2) -> (ball_x, ball_dir) = (0, 2) or (9, 3), drawn as
 * u < 0.5 ? 0 : 1 from column 0's uniform (probability 1/2 each: u is in (0, 1]). */
static lm_tensor br_reset(lm_graph_t *g, lm_dim n) {
  lm_tensor u = lm_env_col(lm_rand_stream(g, LM_ENV_STREAM_RESET, 2, (lm_dim[]){n, STATE_SIZE}), 0);
  lm_tensor start = lm_ge(u, cst(g, 0.5f));
  lm_tensor x = lm_mul(start, cst(g, 9.0f));
  lm_tensor c[SCALARS];
  c[BALL_X] = x;
  c[BALL_Y] = lm_scalar_like(u, 3.0f);
  c[BALL_DIR] = lm_add(start, cst(g, 2.0f));
  c[POS] = lm_scalar_like(u, 4.0f);
  c[STRIKE] = lm_scalar_like(u, 0.0f);
  c[LAST_X] = x;
  c[LAST_Y] = lm_scalar_like(u, 3.0f);
  c[TERMINAL] = lm_scalar_like(u, 0.0f);
  return pack(c, brick_rows(g));
}

/* act(a), MinAtar's if/elif chain as 0/1 conditions that exclude one another, each branch's
 * assignments as selects; the terminal state's early return selects the old state. */
static void br_step(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out) {
  lm_tensor bx = lm_env_col(state, BALL_X), by = lm_env_col(state, BALL_Y), dir = lm_env_col(state, BALL_DIR);
  lm_tensor pos = lm_env_col(state, POS), strike = lm_env_col(state, STRIKE), term = lm_env_col(state, TERMINAL);
  /* Bricks exist on rows 1..3 only: a reset fills them, a step clears one or refills them, so
   * every reachable state (and every golden row) has zeros elsewhere. The step reads and writes
   * those 30 cells; the other 70 are zeros it writes back as constants. */
  lm_tensor bricks = lm_mul(state, brick_rows(g)); /* wide */

  /* the player: l -> max(0, pos - 1), r -> min(9, pos + 1) */
  lm_tensor left = lm_eq(action, cst(g, ACT_LEFT)), right = lm_eq(action, cst(g, ACT_RIGHT));
  lm_tensor npos = sel(left, lm_maximum(lm_add_scalar(pos, -1.0f), cst(g, 0.0f)),
                       sel(right, lm_minimum(lm_add_scalar(pos, 1.0f), cst(g, 9.0f)), pos));

  /* the ball's move along its diagonal */
  lm_tensor nx0 = lm_add(bx, lut4(dir, dir_dx)), ny = lm_add(by, lut4(dir, dir_dy));

  /* if new_x < 0 or new_x > 9: clamp, reflect */
  lm_tensor side = lm_add(lm_lt(nx0, cst(g, 0.0f)), lm_gt(nx0, cst(g, 9.0f))); /* never both */
  lm_tensor nx = lm_clamp(nx0, 0.0f, 9.0f);
  lm_tensor d1 = sel(side, lut4(dir, flip_x), dir);

  /* if new_y < 0 / elif brick_map[new_y, new_x] == 1 / elif new_y == 9 */
  lm_tensor at = cell_mask(ny, nx, 1);
  lm_tensor top = lm_lt(ny, cst(g, 0.0f)), below_top = not01(top);
  lm_tensor hit = lm_mul(below_top, lm_eq(lm_sum(lm_mul(bricks, at), 1, 0), cst(g, 1.0f)));
  lm_tensor broke = lm_mul(hit, not01(strike)); /* if not strike: r += 1, the brick goes, bounce */
  lm_tensor bottom = lm_mul(lm_mul(below_top, not01(hit)), lm_eq(ny, cst(g, 9.0f)));
  /*   if count_nonzero(brick_map) == 0: brick_map[1:4, :] = 1 */
  lm_tensor wall = lm_slice(state, 1, BRICKS + BRICK_ROW0 * W, BRICKS + BRICK_ROW1 * W);
  lm_tensor refill = lm_mul(bottom, lm_eq(lm_count_nonzero(wall, 1), cst(g, 0.0f)));
  /*   if ball_x == pos (the paddle under the ball) / elif new_x == pos (its corner) / else */
  lm_tensor under = lm_mul(bottom, lm_eq(bx, npos));
  lm_tensor corner = lm_mul(lm_mul(bottom, not01(under)), lm_eq(nx, npos));
  lm_tensor missed = lm_mul(lm_mul(bottom, not01(under)), not01(corner));

  lm_tensor d2 = sel(lm_add(lm_add(top, broke), under), lut4(d1, flip_y), sel(corner, lut4(d1, flip_xy), d1));
  lm_tensor ny2 = sel(top, lm_scalar_like(ny, 0.0f), sel(lm_add(lm_add(broke, under), corner), by, ny));
  /* brick_map[new_y, new_x] = 0 where one broke; the refill where the wall is gone */
  lm_tensor bricks2 = lm_mul(bricks, not01(lm_mul(at, lm_unsqueeze(broke, 1))));
  bricks2 = lm_maximum(bricks2, lm_mul(lm_unsqueeze(refill, 1), brick_rows(g)));
  /* strike = True where a brick is hit (it was, or becomes, True), else False: the hit itself */

  lm_tensor c[SCALARS] = {nx, ny2, d2, npos, hit, bx, by, missed};
  for (int k = 0; k < SCALARS; k++) c[k] = sel(term, lm_env_col(state, k), c[k]);
  out->state = pack(c, sel(lm_unsqueeze(term, 1), bricks, bricks2));
  out->reward = lm_mul(not01(term), broke);
  out->terminated = sel(term, lm_scalar_like(term, 1.0f), missed);
}

/* state(): ball, paddle (row 9), trail and brick maps as channels of the (y, x, channel) grid */
static lm_tensor br_observe(lm_graph_t *g, lm_tensor state) {
  (void)g;
  lm_tensor pos = lm_env_col(state, POS);
  lm_tensor ch[CHANNELS];
  ch[CH_PADDLE] = cell_mask(lm_scalar_like(pos, 9.0f), pos, 0);
  ch[CH_BALL] = cell_mask(lm_env_col(state, BALL_Y), lm_env_col(state, BALL_X), 0);
  ch[CH_TRAIL] = cell_mask(lm_env_col(state, LAST_Y), lm_env_col(state, LAST_X), 0);
  ch[CH_BRICK] = lm_slice(state, 1, BRICKS, STATE_SIZE);
  lm_tensor grid = {0};
  for (int k = 0; k < CHANNELS; k++) {
    lm_tensor c = lm_pad(lm_unsqueeze(ch[k], 2), 2, k, CHANNELS - 1 - k);
    grid = k ? lm_add(grid, c) : c;
  }
  return lm_reshape(grid, 2, (lm_dim[]){lm_dim_of(state, 0), OBS_SIZE});
}

/* ================================================================ the reference stepper */

static void br_ref_reset(float *s, uint64_t seed, uint64_t env, uint64_t run) {
  float u = lm_rand_uniform(seed, LM_ENV_STREAM_RESET, env * (uint64_t)STATE_SIZE + 0, run);
  int start = u < 0.5f ? 0 : 1; /* ball_start = randint(2) */
  s[BALL_Y] = 3;
  s[BALL_X] = start ? 9.0f : 0.0f;
  s[BALL_DIR] = start ? 3.0f : 2.0f;
  s[POS] = 4;
  for (int i = 0; i < CELLS; i++) s[BRICKS + i] = i >= BRICK_ROW0 * W && i < BRICK_ROW1 * W ? 1.0f : 0.0f;
  s[STRIKE] = 0;
  s[LAST_X] = s[BALL_X];
  s[LAST_Y] = s[BALL_Y];
  s[TERMINAL] = 0;
}

/* A state value as an int; the positions and the direction are small integers in any state the
 * game reaches (a value far off the grid, or NaN, becomes -1: off the grid, never an index). */
static int ival(float v) { return v >= -16.0f && v <= 16.0f ? (int)v : -1; }

/* 1 when (y, x) is on the grid */
static int on_grid(int y, int x) { return y >= 0 && y < H && x >= 0 && x < W; }

/* breakout.py's act(a), line for line */
static float br_ref_step(float *s, const float *action, int *terminated) {
  float r = 0;
  if (s[TERMINAL] != 0) {
    *terminated = 1;
    return r;
  }
  float *brick_map = s + BRICKS;
  int ball_x = ival(s[BALL_X]), ball_y = ival(s[BALL_Y]), ball_dir = ival(s[BALL_DIR]), pos = ival(s[POS]);
  if (ball_dir < 0 || ball_dir > 3) ball_dir = ball_dir < 0 ? 0 : 3; /* as the graph's tables read */
  int strike = s[STRIKE] != 0, terminal = 0;
  /* Resolve player action */
  if (action[0] == ACT_LEFT) pos = pos - 1 > 0 ? pos - 1 : 0;
  else if (action[0] == ACT_RIGHT) pos = pos + 1 < 9 ? pos + 1 : 9;
  /* Update ball position */
  int last_x = ball_x, last_y = ball_y, new_x = ball_x, new_y = ball_y;
  if (ball_dir == 0) new_x = ball_x - 1, new_y = ball_y - 1;
  else if (ball_dir == 1) new_x = ball_x + 1, new_y = ball_y - 1;
  else if (ball_dir == 2) new_x = ball_x + 1, new_y = ball_y + 1;
  else if (ball_dir == 3) new_x = ball_x - 1, new_y = ball_y + 1;
  static const int fx[4] = {1, 0, 3, 2}, fy[4] = {3, 2, 1, 0}, fxy[4] = {2, 3, 0, 1};
  int strike_toggle = 0;
  if (new_x < 0 || new_x > 9) {
    if (new_x < 0) new_x = 0;
    if (new_x > 9) new_x = 9;
    ball_dir = fx[ball_dir];
  }
  if (new_y < 0) {
    new_y = 0;
    ball_dir = fy[ball_dir];
  } else if (on_grid(new_y, new_x) && brick_map[new_y * W + new_x] == 1) {
    strike_toggle = 1;
    if (!strike) {
      r += 1;
      strike = 1;
      brick_map[new_y * W + new_x] = 0;
      new_y = last_y;
      ball_dir = fy[ball_dir];
    }
  } else if (new_y == 9) {
    int count = 0;
    for (int i = 0; i < CELLS; i++) count += brick_map[i] != 0;
    if (count == 0)
      for (int i = BRICK_ROW0 * W; i < BRICK_ROW1 * W; i++) brick_map[i] = 1;
    if (ball_x == pos) {
      ball_dir = fy[ball_dir];
      new_y = last_y;
    } else if (new_x == pos) {
      ball_dir = fxy[ball_dir];
      new_y = last_y;
    } else
      terminal = 1;
  }
  if (!strike_toggle) strike = 0;
  s[BALL_X] = (float)new_x;
  s[BALL_Y] = (float)new_y;
  s[BALL_DIR] = (float)ball_dir;
  s[POS] = (float)pos;
  s[STRIKE] = (float)strike;
  s[LAST_X] = (float)last_x;
  s[LAST_Y] = (float)last_y;
  s[TERMINAL] = (float)terminal;
  *terminated = terminal;
  return r;
}

static void br_ref_observe(const float *s, float *obs) {
  for (int i = 0; i < OBS_SIZE; i++) obs[i] = 0;
  int bx = ival(s[BALL_X]), by = ival(s[BALL_Y]), pos = ival(s[POS]), lx = ival(s[LAST_X]), ly = ival(s[LAST_Y]);
  if (on_grid(by, bx)) obs[(by * W + bx) * CHANNELS + CH_BALL] = 1;
  if (on_grid(9, pos)) obs[(9 * W + pos) * CHANNELS + CH_PADDLE] = 1;
  if (on_grid(ly, lx)) obs[(ly * W + lx) * CHANNELS + CH_TRAIL] = 1;
  for (int i = 0; i < CELLS; i++) obs[i * CHANNELS + CH_BRICK] = s[BRICKS + i] != 0 ? 1.0f : 0.0f;
}

/* ================================================================ drawing */

/* MinAtar's display: black, then each cell in the colour of its highest channel present
 * (seaborn's cubehelix palette of 4, sampled at 0.2, 0.4, 0.6, 0.8). Channels are drawn in
 * increasing order so a later one covers an earlier one in the same cell; the bricks, drawn
 * last, go as runs along each row: at most 5 runs a row, so background + 3 cells + 50 runs
 * always fit LM_ENV_MAX_DRAW (with a smaller cap the list stops at cap). */
static const uint32_t colour[CHANNELS] = {0x163d4effu, 0x54792fffu, 0xd07e93ffu, 0xc1caf3ffu};

static void put_rect(lm_draw_cmd *cmds, int cap, int *n, float x0, float y0, float x1, float y1, uint32_t rgba) {
  if (*n >= cap) return;
  cmds[(*n)++] = (lm_draw_cmd){LM_DRAW_RECT, x0, y0, x1, y1, 0.0f, rgba};
}

/* cells x0..x1-1 of row y (row 0 at the top of the world box) */
static void put_cells(lm_draw_cmd *cmds, int cap, int *n, float y, float x0, float x1, int channel) {
  put_rect(cmds, cap, n, x0, (float)(H - 1) - y, x1, (float)H - y, colour[channel]);
}

static int br_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  int n = 0;
  put_rect(cmds, cap, &n, 0.0f, 0.0f, (float)W, (float)H, 0x000000ffu);
  put_cells(cmds, cap, &n, 9.0f, s[POS], s[POS] + 1, CH_PADDLE);
  put_cells(cmds, cap, &n, s[BALL_Y], s[BALL_X], s[BALL_X] + 1, CH_BALL);
  put_cells(cmds, cap, &n, s[LAST_Y], s[LAST_X], s[LAST_X] + 1, CH_TRAIL);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W;) {
      if (s[BRICKS + y * W + x] == 0) {
        x++;
        continue;
      }
      int x1 = x;
      while (x1 < W && s[BRICKS + y * W + x1] != 0) x1++;
      put_cells(cmds, cap, &n, (float)y, (float)x, (float)x1, CH_BRICK);
      x = x1;
    }
  return n;
}

/* ================================================================ the spec */

#define ONES10 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
#define ONES100 ONES10, ONES10, ONES10, ONES10, ONES10, ONES10, ONES10, ONES10, ONES10, ONES10
static const float obs_low[OBS_SIZE] = {0};
static const float obs_high[OBS_SIZE] = {ONES100, ONES100, ONES100, ONES100};

const lm_env_spec lm_env_minatar_breakout = {
    .name = "minatar-breakout",
    .gym_id = "MinAtar/Breakout-v0",
    .state_size = STATE_SIZE,
    .obs_size = OBS_SIZE,
    .obs_rank = 3,
    .obs_shape = {H, W, 4}, /* y, x, channel: a convolutional policy by default */
    .action = {.kind = LM_SPACE_DISCRETE, .n = 6},
    /* MinAtar itself has no time limit; gymnax uses 1000 (--env time_limit=1000) */
    .time_limit = 100000,
    .sticky = 0.1f,                     /* MinAtar's sticky_action_prob (--env sticky=0: none) */
    .action_sets = "minimal = 0 1 3", /* n l r, MinAtar's minimal_action_set (--env actions=minimal) */
    /* a wall is 30 bricks: 50 is clearing it and most of the refill, about what PPO reaches in
     * 2M steps under gymnax's 1000-step limit (the peer's 57); random play scores 0.4 */
    .solved_return = 50.0f,
    .obs_low = obs_low,
    .obs_high = obs_high,
    .world = {0.0f, 0.0f, (float)W, (float)H},
    .fps = 20.0f, /* MinAtar's display_state shows a frame for 50 ms */
    .check_rtol = 0.0f,
    .check_atol = 0.0f,
    .reward_rtol = 0.0f,
    .reward_atol = 0.0f,
    .finite = 1, /* small integers throughout */
    .reset = br_reset,
    .step = br_step,
    .observe = br_observe,
    .ref_reset = br_ref_reset,
    .ref_step = br_ref_step,
    .ref_observe = br_ref_observe,
    .draw = br_draw,
    /* the PureJaxRL MinAtar settings (../shared/peers/purejaxrl_minatar.py) with a shared trunk */
    .train_defaults = "envs = 64\nsteps = 128\nlr = 0.005\nminibatches = 8\nshared = 1\ntotal_steps = 5000000\n",
};
