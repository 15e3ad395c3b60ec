/* envs/minatar_space_invaders.c — MinAtar Space Invaders exactly as the minatar package 1.0.15
 * plays it (environments/space_invaders.py, difficulty ramping on): a cannon on the bottom row, a
 * 4x6 wave of aliens marching sideways and stepping down at the walls, bullets both ways, +1 per
 * alien shot, termination when an alien or an enemy bullet reaches the cannon. Sticky actions
 * (MinAtar's 0.1) and the minimal set n l r f are the vec env's wrappers (spec.sticky,
 * spec.action_sets; rltrain --env); reset is deterministic.
 *
 * State (308 floats, small integers): pos, alien_dir, enemy_move_interval, alien_move_timer,
 * alien_shot_timer, ramp_index, shot_timer, terminal, then alien_map, f_bullet_map and e_bullet_map,
 * 10x10 row-major each (the golden files' layout). Observation (600): the 10x10x6 boolean state
 * row-major over (y, x, channel) as 0/1, channels cannon, alien, alien_left, alien_right,
 * friendly_bullet, enemy_bullet. Actions: MinAtar's full set, 0 n, 1 l, 2 u, 3 r, 4 d, 5 f.
 *
 * The graph follows act() statement by statement; each `if` becomes a 0/1 condition per env and
 * a select (the step's comments name the Python they stand for). Maps only ever hold 0 and 1, so
 * count_nonzero is a sum, logical_and a product, and "set a cell to 1" is v + m (1 - v). The
 * reference stepper is a direct port of the Python; both are exact. */
#include <string.h>

#include "lumen/env.h"
#include "lumen/ops.h"

#define H 10
#define W 10
#define CELLS (H * W)
#define SHOT_COOL_DOWN 5
#define ENEMY_MOVE_INTERVAL 12
#define ENEMY_SHOT_INTERVAL 10
#define MIN_MOVE_INTERVAL 6 /* the ramp (on: MinAtar's default) speeds up while enemy_move_interval > 6 */

enum {
  S_POS, S_DIR, S_EMI, S_AMT, S_AST, S_RAMP, S_SHOT, S_TERM, S_SCALARS,
  S_ALIEN = S_SCALARS, S_FBUL = S_ALIEN + CELLS, S_EBUL = S_FBUL + CELLS, S_SIZE = S_EBUL + CELLS
};
enum { CH_CANNON, CH_ALIEN, CH_LEFT, CH_RIGHT, CH_FBUL, CH_EBUL, CHANNELS };
enum { A_NOOP, A_LEFT, A_UP, A_RIGHT, A_DOWN, A_FIRE };

/* reset(): pos 5, alien_dir -1, both intervals and timers at their starts, everything else 0 */
static const float reset_scalars[S_SCALARS] = {5, -1, ENEMY_MOVE_INTERVAL, ENEMY_MOVE_INTERVAL, ENEMY_SHOT_INTERVAL,
                                               0, 0,  0};

/* ---------------------------------------------------------------- graph helpers
 *
 * Each map is worked on as its cells, [N, 100]: a slice of the state's columns (cell (y, x) of
 * the map at `at` is column at + 10 y + x), moved with lm_roll (a view: np.roll, an index mod
 * 100, then a constant mask clearing what wrapped), and the new state is the scalars and the
 * three maps concatenated (pads). Every read stays inside its env's row, which the cpu scan
 * proves (a padded read inside its pad's window: compiler/scan.c), so the scanned step is one
 * env-local kernel. Values shared by many cells are made local arrays with lm_contiguous over
 * a view that moves elements (a roll, a slice of a wider row); over a whole computed value it
 * would be no copy at all. Grids [N, 10, 10] appear only as reshapes feeding reductions (column
 * sums, the lowest alien); per-env values reach a cell by comparing with a constant index. */

static lm_tensor cst(lm_graph_t *g, float v) { return lm_const(g, v); }

/* cells [..., 100] as the columns of the map at `at`, [..., 308] (0 elsewhere) */
static lm_tensor wide(lm_tensor cells, int at) { return lm_pad(cells, lm_rank(cells) - 1, at, S_SIZE - at - CELLS); }

/* [10]: 0, 1, ..., 9 */
static lm_tensor ramp(lm_graph_t *g) { return lm_arange(g, W); }

/* [100]: 10 y + x, each cell's index */
static lm_tensor cell_index(lm_graph_t *g) { return lm_arange(g, CELLS); }

/* [100]: 1 on the cells of rows y0 .. y1 - 1 and columns x0 .. x1 - 1 */
static lm_tensor block(lm_graph_t *g, int y0, int y1, int x0, int x1) {
  lm_tensor b = lm_full(g, 1.0f, 2, (lm_dim[]){y1 - y0, x1 - x0});
  b = lm_pad(lm_pad(b, 0, y0, H - y1), 1, x0, W - x1);
  return lm_reshape(b, 1, (lm_dim[]){CELLS});
}

/* one-hot of x [N] over a row, [N, 10] (0 off the board) */
static lm_tensor column_mask(lm_tensor x) { return lm_eq(lm_unsqueeze(x, 1), ramp(x.g)); }

/* the cell of a [N, 10] row at the one-hot mask [N, 10], as [N] */
static lm_tensor row_at(lm_tensor row, lm_tensor mask) { return lm_sum(lm_mul(row, mask), 1, 0); }

/* c ? a : b per env over the state's columns (c [N] in {0, 1}) */
static lm_tensor sel(lm_tensor c, lm_tensor a, lm_tensor b) { return lm_env_select(lm_unsqueeze(c, 1), a, b); }

/* x [N, 308] with its columns moved by `by` (np.roll along the state), kept on the cells of
 * mask [100] of the map at `at` (0 elsewhere) */
static lm_tensor moved(lm_tensor x, int by, int at, lm_tensor mask) {
  return lm_mul(lm_roll(x, 1, by), wide(mask, at));
}

/* the map at `at` of the state, [N, 100] */
static lm_tensor map_of(lm_tensor s, int at) { return lm_slice(s, 1, at, at + CELLS); }

/* a map [N, 100] as a grid [N, 10, 10] (for reductions) */
static lm_tensor grid(lm_tensor m) { return lm_reshape(m, 3, (lm_dim[]){lm_dim_of(m, 0), H, W}); }

/* the aliens (ones) in column x of a map [N, 100], [N] */
static lm_tensor column_sum(lm_tensor m, int x) {
  return lm_sum(lm_reshape(lm_slice(grid(m), 2, x, x + 1), 2, (lm_dim[]){lm_dim_of(m, 0), H}), 1, 0);
}

/* row y of a map [N, 100], [N, 10] */
static lm_tensor row_of(lm_tensor m, int y) { return lm_slice(m, 1, y * W, (y + 1) * W); }

/* np.roll of a map's cells by `by` (a row is 10 cells), kept on the cells of mask [100] */
static lm_tensor shifted(lm_tensor m, int by, lm_tensor mask) { return lm_mul(lm_roll(m, 1, by), mask); }

/* [N, 100]: 1 at cell `cell` [N] where `where` [N] is 1 */
static lm_tensor cell_at(lm_tensor cell, lm_tensor where) {
  return lm_mul(lm_eq(cell_index(cell.g), lm_unsqueeze(cell, 1)), lm_unsqueeze(where, 1));
}

/* ---------------------------------------------------------------- graphs */

static lm_tensor si_reset(lm_graph_t *g, lm_dim n) {
  lm_tensor s = lm_broadcast_to(wide(block(g, 0, 4, 2, 8), S_ALIEN), 2, (lm_dim[]){n, S_SIZE});
  for (int k = 0; k < S_SCALARS; k++)
    if (reset_scalars[k] != 0.0f)
      s = lm_add(s, lm_pad(lm_full(g, reset_scalars[k], 2, (lm_dim[]){n, 1}), 1, k, S_SIZE - 1 - k));
  return s;
}

static void si_step(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  lm_tensor zero = cst(g, 0.0f), one = cst(g, 1.0f);
  lm_tensor pos = lm_env_col(s, S_POS), dir = lm_env_col(s, S_DIR), emi = lm_env_col(s, S_EMI);
  lm_tensor amt = lm_env_col(s, S_AMT), ast = lm_env_col(s, S_AST), ramp_index = lm_env_col(s, S_RAMP);
  lm_tensor shot = lm_env_col(s, S_SHOT), term0 = lm_env_col(s, S_TERM);
  lm_tensor alien0 = map_of(s, S_ALIEN), fbul0 = map_of(s, S_FBUL), ebul0 = map_of(s, S_EBUL);

  /* if a == 'f' and shot_timer == 0: f_bullet_map[9, pos] = 1; shot_timer = 5
   * elif a == 'l': pos = max(0, pos - 1)   elif a == 'r': pos = min(9, pos + 1) */
  lm_tensor fire = lm_mul(lm_eq(a, cst(g, A_FIRE)), lm_eq(shot, zero));
  /* set to 1: what the new bullet adds to the cell (9, pos) */
  lm_tensor fired = lm_mul(fire, lm_sub(one, row_at(row_of(fbul0, H - 1), column_mask(pos))));
  lm_tensor fired_cell = lm_add(pos, cst(g, (H - 2) * W)); /* where it is once moved: (8, pos) */
  shot = lm_env_select(fire, cst(g, SHOT_COOL_DOWN), shot);
  lm_tensor go_left = lm_mul(lm_eq(a, cst(g, A_LEFT)), lm_gt(pos, zero));
  lm_tensor go_right = lm_mul(lm_eq(a, cst(g, A_RIGHT)), lm_lt(pos, cst(g, W - 1)));
  pos = lm_sub(lm_add(pos, go_right), go_left);
  lm_tensor at_pos = column_mask(pos); /* the cannon's column, [N, 10] */

  /* f_bullet_map = roll(f_bullet_map, -1, axis=0); f_bullet_map[9, :] = 0 (rows move up a row
   * of 10 cells; row 0, wrapped to row 9, is cleared); the bullet just fired lands on row 8 */
  lm_tensor fbul = lm_add(shifted(fbul0, -W, block(g, 0, H - 1, 0, W)), cell_at(fired_cell, fired));

  /* e_bullet_map = roll(e_bullet_map, 1, axis=0); e_bullet_map[0, :] = 0;
   * if e_bullet_map[9, pos]: terminal */
  lm_tensor ebul = lm_mul(lm_contiguous(lm_roll(ebul0, 1, W)), block(g, 1, H, 0, W)); /* (*) */
  lm_tensor hit_bullet = row_at(row_of(ebul, H - 1), at_pos);

  /* if alien_map[9, pos]: terminal */
  lm_tensor hit_alien = row_at(row_of(alien0, H - 1), at_pos);

  /* if alien_move_timer == 0:
   *   alien_move_timer = min(count_nonzero(alien_map), enemy_move_interval)
   *   if (sum(alien_map[:, 0]) > 0 and alien_dir < 0) or (sum(alien_map[:, 9]) > 0 and alien_dir > 0):
   *     alien_dir = -alien_dir; if sum(alien_map[9, :]) > 0: terminal
   *     alien_map = roll(alien_map, 1, axis=0)
   *   else: alien_map = roll(alien_map, alien_dir, axis=1)
   *   if alien_map[9, pos]: terminal
   * The roll down wraps row 9 to row 0, as in the game: a roll of the cells by a row. The
   * sideways roll never wraps an alien: it is taken only when the column it would wrap from (9
   * moving right, 0 moving left) is empty, so it is a move by one cell with the column that
   * wrapped cleared. alien_dir is -1 or 1. */
  lm_tensor move = lm_eq(amt, zero);
  lm_tensor dir_left = lm_lt(dir, zero), dir_right = lm_gt(dir, zero);
  lm_tensor at_left = lm_gt(column_sum(alien0, 0), zero), at_right = lm_gt(column_sum(alien0, W - 1), zero);
  lm_tensor bounce = lm_add(lm_mul(at_left, dir_left), lm_mul(at_right, dir_right)); /* never both */
  lm_tensor flip = lm_mul(move, bounce);
  dir = lm_env_select(flip, lm_neg(dir), dir);
  lm_tensor hit_wall = lm_mul(flip, lm_gt(lm_sum(row_of(alien0, H - 1), 1, 0), zero));
  lm_tensor down = wide(lm_roll(alien0, 1, W), S_ALIEN);
  lm_tensor sideways =
      sel(dir_right, moved(s, 1, S_ALIEN, block(g, 0, H, 1, W)), moved(s, -1, S_ALIEN, block(g, 0, H, 0, W - 1)));
  lm_tensor moved_map = sel(move, sel(bounce, down, sideways), s);
  /* the moved map's cells [N, 100], read by everything below, computed once: the moved map is
   * built over the state's columns so that its cells are a slice of it, which lm_contiguous
   * copies into a local array */
  lm_tensor cells = lm_contiguous(map_of(moved_map, S_ALIEN));
  lm_tensor hit_moved = lm_mul(move, row_at(row_of(cells, H - 1), at_pos));

  /* if alien_shot_timer == 0: alien_shot_timer = 10; e_bullet_map[_nearest_alien(pos)] = 1, where
   * _nearest_alien scans the columns by |x - pos| (a stable sort: the left one first on a tie)
   * and takes the lowest alien of the first column that has one: the column with the least key
   * 2 |x - pos| + (x > pos) among those holding an alien (empty columns' keys pushed past 19).
   * MinAtar would raise on an empty map; it is never empty here (a cleared wave refills at the
   * end of every step), and the graph then shoots nothing. */
  lm_tensor shoot = lm_eq(ast, zero);
  ast = lm_env_select(shoot, cst(g, ENEMY_SHOT_INTERVAL), ast);
  lm_tensor cells_per_column = lm_sum(grid(cells), 1, 0); /* [N, 10] */
  /* count_nonzero(alien_map) before the move: the move keeps every alien (the roll down is a
   * permutation; the sideways move is taken only when the column it would wrap from is empty) */
  amt = lm_env_select(move, lm_minimum(lm_sum(cells_per_column, 1, 0), emi), amt);
  lm_tensor x = ramp(g), has = lm_gt(cells_per_column, zero); /* [10], [N, 10] */
  lm_tensor d = lm_sub(x, lm_unsqueeze(pos, 1));
  lm_tensor key = lm_add(lm_add(lm_mul(lm_abs(d), cst(g, 2.0f)), lm_gt(d, zero)),
                         lm_mul(lm_sub(one, has), cst(g, 2.0f * W)));
  lm_tensor shooter = lm_mul(lm_eq(key, lm_unsqueeze(lm_min(key, 1, 0), 1)), has); /* [N, 10]: its column, or 0 */
  lm_tensor y1 = lm_add(x, one);                                                        /* row + 1 */
  lm_tensor lowest = lm_max(lm_mul(grid(cells), lm_unsqueeze(y1, 1)), 1, 0); /* [N, 10]: lowest row + 1 */
  lm_tensor shot_cell = lm_add(lm_mul(lm_add(row_at(lowest, shooter), cst(g, -1.0f)), cst(g, W)), row_at(x, shooter));
  lm_tensor shoots = lm_mul(shoot, lm_sum(shooter, 1, 0)); /* and there is an alien */
  lm_tensor shot_at = cell_at(shot_cell, shoots);
  ebul = lm_add(ebul, lm_mul(shot_at, lm_sub(one, ebul)));

  /* kill_locations = logical_and(alien_map, alien_map == f_bullet_map); r += sum(kill_locations);
   * alien_map[kill_locations] = f_bullet_map[kill_locations] = 0 (maps hold 0 and 1: the kills
   * are the product) */
  lm_tensor kill = lm_mul(fbul, cells);
  lm_tensor reward = lm_sum(kill, 1, 0);
  lm_tensor alien = lm_sub(cells, kill);
  fbul = lm_sub(fbul, kill);

  /* shot_timer -= shot_timer > 0; alien_move_timer -= 1; alien_shot_timer -= 1 */
  shot = lm_sub(shot, lm_gt(shot, zero));
  amt = lm_sub(amt, one);
  ast = lm_sub(ast, one);

  /* if count_nonzero(alien_map) == 0:
   *   if enemy_move_interval > 6 and ramping: enemy_move_interval -= 1; ramp_index += 1
   *   alien_map[0:4, 2:8] = 1 */
  lm_tensor cleared = lm_eq(lm_sub(lm_sum(cells_per_column, 1, 0), reward), zero); /* the kills are aliens */
  lm_tensor faster = lm_mul(cleared, lm_gt(emi, cst(g, MIN_MOVE_INTERVAL)));
  emi = lm_sub(emi, faster);
  ramp_index = lm_add(ramp_index, faster);
  alien = lm_add(alien, lm_mul(lm_unsqueeze(cleared, 1), block(g, 0, 4, 2, 8)));

  /* if terminal: return 0, terminal (the state as it was). (*) Every cell of the new state is
   * computed from cells at its own index or from local arrays (the moved enemy bullets were
   * copied into one), so the cpu kernel writes the new state over the old in place
   * (compiler/inplace.c). */
  lm_tensor term = lm_gt(lm_add(lm_add(hit_bullet, hit_alien), lm_add(hit_wall, hit_moved)), cst(g, 0.5f));
  lm_tensor cols[S_SCALARS] = {pos, dir, emi, amt, ast, ramp_index, shot, term};
  lm_tensor next = lm_concat(lm_concat(lm_concat(lm_env_stack(cols, S_SCALARS), alien, 1), fbul, 1), ebul, 1);
  out->state = sel(term0, s, next);
  out->reward = lm_env_select(term0, zero, reward);
  out->terminated = lm_env_select(term0, one, term);
}

/* state(): the channels of the (y, x, channel) grid from the state's columns */
static lm_tensor si_observe(lm_graph_t *g, lm_tensor s) {
  lm_tensor alien = lm_slice(s, 1, S_ALIEN, S_ALIEN + CELLS);
  lm_tensor left = lm_mul(alien, lm_unsqueeze(lm_lt(lm_env_col(s, S_DIR), cst(g, 0.0f)), 1)); /* alien_dir < 0 */
  lm_tensor cannon = lm_eq(cell_index(g), lm_unsqueeze(lm_add(lm_env_col(s, S_POS), cst(g, (H - 1) * W)), 1));
  lm_tensor ch[CHANNELS] = {cannon, alien, left, lm_sub(alien, left), lm_slice(s, 1, S_FBUL, S_FBUL + CELLS),
                            lm_slice(s, 1, S_EBUL, S_EBUL + CELLS)};
  lm_tensor obs = lm_pad(lm_unsqueeze(ch[0], 2), 2, 0, CHANNELS - 1);
  for (int c = 1; c < CHANNELS; c++) obs = lm_add(obs, lm_pad(lm_unsqueeze(ch[c], 2), 2, c, CHANNELS - 1 - c));
  return lm_reshape(obs, 2, (lm_dim[]){lm_dim_of(s, 0), CELLS * CHANNELS});
}

/* ---------------------------------------------------------------- the reference stepper */

static void si_ref_reset(float *s, uint64_t seed, uint64_t env, uint64_t run) {
  (void)seed, (void)env, (void)run; /* reset() draws nothing */
  memset(s, 0, S_SIZE * sizeof *s);
  memcpy(s, reset_scalars, sizeof reset_scalars);
  for (int y = 0; y < 4; y++)
    for (int x = 2; x < 8; x++) s[S_ALIEN + y * W + x] = 1.0f;
}

/* A state value as an int in [lo, hi] (the game's values are small integers inside it; NaN gives
 * lo): the stepper never indexes outside its arrays, whatever state it is handed. */
static int ival(float v, int lo, int hi) {
  return v >= (float)lo && v <= (float)hi ? (int)v : v > (float)hi ? hi : lo;
}

static float map_sum(const float *m, int y0, int y1, int x0, int x1) {
  float t = 0.0f;
  for (int y = y0; y < y1; y++)
    for (int x = x0; x < x1; x++) t += m[y * W + x];
  return t;
}

/* _nearest_alien(pos): the columns in order of |x - pos| (a stable sort: the left one first on a
 * tie), the lowest alien of the first column that has one; 0 when the map is empty (MinAtar
 * returns None there and raises). */
static int nearest_alien(const float *alien, int pos, int *y, int *x) {
  for (int d = 0; d < W; d++)
    for (int side = 0; side < (d ? 2 : 1); side++) {
      int c = side ? pos + d : pos - d;
      if (c < 0 || c >= W || !(map_sum(alien, 0, H, c, c + 1) > 0)) continue;
      int r = H - 1; /* np.max(np.where(alien_map[:, c] == 1)) */
      while (r > 0 && alien[r * W + c] != 1.0f) r--;
      *y = r, *x = c;
      return 1;
    }
  return 0;
}

static float si_ref_step(float *s, const float *action, int *terminated) {
  float r = 0.0f;
  if (s[S_TERM] != 0.0f) {
    *terminated = 1;
    return r;
  }
  float *alien = s + S_ALIEN, *fb = s + S_FBUL, *eb = s + S_EBUL, tmp[CELLS];
  int a = ival(action[0], -1, 6), pos = ival(s[S_POS], 0, W - 1); /* the cannon is on the board */

  if (a == A_FIRE && s[S_SHOT] == 0.0f) {
    fb[(H - 1) * W + pos] = 1.0f;
    s[S_SHOT] = SHOT_COOL_DOWN;
  } else if (a == A_LEFT)
    pos = pos - 1 > 0 ? pos - 1 : 0;
  else if (a == A_RIGHT)
    pos = pos + 1 < W - 1 ? pos + 1 : W - 1;

  memmove(fb, fb + W, (CELLS - W) * sizeof *fb); /* roll(-1, axis=0), then row 9 = 0 */
  memset(fb + CELLS - W, 0, W * sizeof *fb);
  memmove(eb + W, eb, (CELLS - W) * sizeof *eb); /* roll(1, axis=0), then row 0 = 0 */
  memset(eb, 0, W * sizeof *eb);
  if (eb[(H - 1) * W + pos] != 0.0f) s[S_TERM] = 1.0f;

  if (alien[(H - 1) * W + pos] != 0.0f) s[S_TERM] = 1.0f;
  if (s[S_AMT] == 0.0f) {
    int count = 0;
    for (int i = 0; i < CELLS; i++) count += alien[i] != 0.0f;
    s[S_AMT] = (float)count < s[S_EMI] ? (float)count : s[S_EMI];
    int dir = ival(s[S_DIR], -1, 1);
    if ((map_sum(alien, 0, H, 0, 1) > 0 && dir < 0) || (map_sum(alien, 0, H, W - 1, W) > 0 && dir > 0)) {
      s[S_DIR] = (float)-dir;
      if (map_sum(alien, H - 1, H, 0, W) > 0) s[S_TERM] = 1.0f;
      for (int i = 0; i < CELLS; i++) tmp[i] = alien[(i + CELLS - W) % CELLS]; /* roll(1, axis=0) */
    } else
      for (int y = 0; y < H; y++) /* roll(dir, axis=1) */
        for (int x = 0; x < W; x++) tmp[y * W + x] = alien[y * W + ((x - dir) % W + W) % W];
    memcpy(alien, tmp, sizeof tmp);
    if (alien[(H - 1) * W + pos] != 0.0f) s[S_TERM] = 1.0f;
  }
  if (s[S_AST] == 0.0f) {
    s[S_AST] = ENEMY_SHOT_INTERVAL;
    int x, y;
    if (nearest_alien(alien, pos, &y, &x)) eb[y * W + x] = 1.0f;
  }
  for (int i = 0; i < CELLS; i++)
    if (alien[i] != 0.0f && alien[i] == fb[i]) {
      r += 1.0f;
      alien[i] = fb[i] = 0.0f;
    }

  s[S_SHOT] -= s[S_SHOT] > 0.0f;
  s[S_AMT] -= 1.0f;
  s[S_AST] -= 1.0f;
  int count = 0;
  for (int i = 0; i < CELLS; i++) count += alien[i] != 0.0f;
  if (count == 0) {
    if (s[S_EMI] > MIN_MOVE_INTERVAL) { /* and ramping */
      s[S_EMI] -= 1.0f;
      s[S_RAMP] += 1.0f;
    }
    for (int y = 0; y < 4; y++)
      for (int x = 2; x < 8; x++) alien[y * W + x] = 1.0f;
  }
  s[S_POS] = (float)pos;
  *terminated = s[S_TERM] != 0.0f;
  return r;
}

static void si_ref_observe(const float *s, float *obs) {
  memset(obs, 0, CELLS * CHANNELS * sizeof *obs);
  obs[((H - 1) * W + ival(s[S_POS], 0, W - 1)) * CHANNELS + CH_CANNON] = 1.0f;
  for (int i = 0; i < CELLS; i++) {
    float al = s[S_ALIEN + i];
    obs[i * CHANNELS + CH_ALIEN] = al;
    obs[i * CHANNELS + (s[S_DIR] < 0.0f ? CH_LEFT : CH_RIGHT)] = al;
    obs[i * CHANNELS + CH_FBUL] = s[S_FBUL + i];
    obs[i * CHANNELS + CH_EBUL] = s[S_EBUL + i];
  }
}

/* ---------------------------------------------------------------- drawing */

/* MinAtar's display: each cell takes the colour of its highest channel (1 + channel index; 0 is
 * black), sns.color_palette("cubehelix", 6) — matplotlib's cubehelix at 1/7 .. 6/7. */
static const uint32_t palette[CHANNELS + 1] = {0x000000ffu, 0x1a2441ffu, 0x1b6145ffu, 0x697b30ffu,
                                               0xc87b7cffu, 0xcda2e0ffu, 0xc6e1f1ffu};

/* Row y of the grid spans world y in [9 - y, 10 - y] (y up). The board, then runs of equal
 * colour along each row: the cannon and the bullets first, the aliens after (so a short list
 * keeps the player's view). Writes up to cap of them and returns how many the state needs. */
static int si_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  int code[CELLS];
  float obs[CELLS * CHANNELS];
  si_ref_observe(s, obs);
  for (int i = 0; i < CELLS; i++) {
    code[i] = 0;
    for (int c = 0; c < CHANNELS; c++)
      if (obs[i * CHANNELS + c] != 0.0f) code[i] = c + 1;
  }
  int n = 0;
  if (n < cap) cmds[n] = (lm_draw_cmd){LM_DRAW_RECT, 0.0f, 0.0f, (float)W, (float)H, 0.0f, palette[0]};
  n++;
  for (int pass = 0; pass < 2; pass++) /* 0: cannon and bullets; 1: aliens */
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W;) {
        int c = code[y * W + x], end = x + 1;
        while (end < W && code[y * W + end] == c) end++;
        int alien = c == CH_LEFT + 1 || c == CH_RIGHT + 1 || c == CH_ALIEN + 1;
        if (c && alien == pass) {
          if (n < cap)
            cmds[n] = (lm_draw_cmd){LM_DRAW_RECT, (float)x, (float)(H - 1 - y), (float)end, (float)(H - y), 0.0f,
                                    palette[c]};
          n++;
        }
        x = end;
      }
  return n;
}

/* ---------------------------------------------------------------- the spec */

#define ZERO10 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
#define ZERO100 ZERO10, ZERO10, ZERO10, ZERO10, ZERO10, ZERO10, ZERO10, ZERO10, ZERO10, ZERO10
#define ONE10 1, 1, 1, 1, 1, 1, 1, 1, 1, 1
#define ONE100 ONE10, ONE10, ONE10, ONE10, ONE10, ONE10, ONE10, ONE10, ONE10, ONE10
static const float obs_low[CELLS * CHANNELS] = {ZERO100, ZERO100, ZERO100, ZERO100, ZERO100, ZERO100};
static const float obs_high[CELLS * CHANNELS] = {ONE100, ONE100, ONE100, ONE100, ONE100, ONE100};

const lm_env_spec lm_env_minatar_space_invaders = {
    .name = "minatar-space-invaders",
    .gym_id = "MinAtar/SpaceInvaders-v0",
    .state_size = S_SIZE,
    .obs_size = CELLS * CHANNELS,
    .obs_rank = 3,
    .obs_shape = {H, W, CHANNELS},
    .action = {.kind = LM_SPACE_DISCRETE, .n = 6},
    /* MinAtar has no time limit; this one only bounds a runaway episode (gymnax uses 1000:
     * --env time_limit=1000) */
    .time_limit = 100000,
    .sticky = 0.1f, /* MinAtar's sticky_action_prob (--env sticky=0: none) */
    /* five waves of 24 aliens: far above random play (about 4), a little under what PPO reaches
     * in 2M steps with gymnax's settings (143 for PureJaxRL's, time limit 1000) */
    .solved_return = 120.0f,
    .obs_low = obs_low,
    .obs_high = obs_high,
    .world = {0.0f, 0.0f, (float)W, (float)H},
    .fps = 20.0f, /* MinAtar's display_state shows each frame for 50 ms */
    .check_rtol = 0.0f,
    .check_atol = 0.0f,
    .reward_rtol = 0.0f,
    .reward_atol = 0.0f,
    .finite = 1, /* small integers throughout */
    .reset = si_reset,
    .step = si_step,
    .observe = si_observe,
    .ref_reset = si_ref_reset,
    .ref_step = si_ref_step,
    .ref_observe = si_ref_observe,
    .draw = si_draw,
    /* the PureJaxRL MinAtar settings (../shared/peers/purejaxrl_minatar.py) with a shared trunk */
    .train_defaults = "envs = 64\nsteps = 128\nlr = 0.005\nminibatches = 8\nshared = 1\ntotal_steps = 5000000\n",
    .action_sets = "minimal = 0 1 3 5", /* minimal_action_set(): n l r f */
};
