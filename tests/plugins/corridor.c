/* tests/plugins/corridor.c — the env suite's own plugin, written from docs/ENVS.md as a user
 * would: graphs only (no reference stepper), one file ending with LM_ENV_PLUGIN. A corridor of
 * 20 cells with walls at both ends; the agent steps left, stays or steps right; stepping onto
 * the goal ends the episode with +1, every other step costs 0.02.
 *
 * Reset: the agent's cell is floor(20 u0), the goal 1 to 19 cells further round the corridor
 * (mod 20), so the goal is never where the agent starts. Whole cells come from floor, minimum
 * and mod: the reset is not a + and * function of RAND, and the cpu kernel draws it for every
 * env instead of only where an episode ended (compiler/lazy.c; tests/test_envs.c says so).
 *
 * State (agent cell, goal cell); obs the agent's cell one-hot, then the goal's: 40 floats
 * (more than the 16 an env once had), with no bounds declared (obs_low = obs_high = NULL). */
#include "lumen/env.h"
#include "lumen/ops.h"

enum { CELLS = 20 }; /* cells of the corridor */
#define STEP_COST 0.02f

/* A whole number 0 .. n-1 from a uniform u in (0, 1]: min(floor(n u), n - 1). */
static lm_tensor whole(lm_graph_t *g, lm_tensor u, int n) {
  return lm_minimum(lm_floor(lm_mul(u, lm_const(g, (float)n))), lm_const(g, (float)n - 1));
}

static lm_tensor corridor_reset(lm_graph_t *g, lm_dim n) {
  lm_tensor u = lm_rand_stream(g, LM_ENV_STREAM_RESET, 2, (lm_dim[]){n, 2}); /* element env * 2 + k */
  lm_tensor agent = whole(g, lm_env_col(u, 0), CELLS);
  lm_tensor ahead = lm_add(whole(g, lm_env_col(u, 1), CELLS - 1), lm_const(g, 1.0f)); /* 1 .. 19 */
  lm_tensor c[2] = {agent, lm_mod(lm_add(agent, ahead), lm_const(g, (float)CELLS))};
  return lm_contiguous(lm_env_stack(c, 2));
}

static void corridor_step(lm_graph_t *g, lm_tensor s, lm_tensor a, lm_env_step_out *out) {
  lm_tensor agent = lm_env_col(s, 0), goal = lm_env_col(s, 1);
  lm_tensor move = lm_sub(lm_clamp(a, 0.0f, 2.0f), lm_const(g, 1.0f)); /* 0, 1, 2 -> -1, 0, +1 */
  lm_tensor next = lm_clamp(lm_add(agent, move), 0.0f, (float)CELLS - 1);
  lm_tensor c[2] = {next, goal};
  out->state = lm_contiguous(lm_env_stack(c, 2));
  lm_tensor at = lm_eq(lm_env_col(out->state, 0), lm_env_col(out->state, 1));
  out->terminated = at;
  out->reward = lm_env_select(at, lm_scalar_like(at, 1.0f), lm_scalar_like(at, -STEP_COST));
}

static lm_tensor corridor_observe(lm_graph_t *g, lm_tensor s) {
  (void)g;
  return lm_concat(lm_one_hot(lm_env_col(s, 0), CELLS), lm_one_hot(lm_env_col(s, 1), CELLS), 1);
}

/* The cells, the goal's cell in green and the agent as a disc: writes at most cap commands and
 * returns how many the state needs (CELLS + 1), as snprintf does. */
static int corridor_draw(const float *s, lm_draw_cmd *cmds, int cap) {
  int n = 0;
  for (int i = 0; i < CELLS; i++, n++) {
    uint32_t rgba = i == (int)s[1] ? 0x33cc66ffu : 0xccccccffu;
    if (n < cap) cmds[n] = (lm_draw_cmd){LM_DRAW_RECT, (float)i + 0.05f, 1.0f, (float)i + 0.95f, 2.0f, 0, rgba};
  }
  if (n < cap) cmds[n] = (lm_draw_cmd){LM_DRAW_CIRCLE, s[0] + 0.5f, 1.5f, 0.35f, 0, 0, 0x3366ccffu};
  return n + 1;
}

static const lm_env_spec corridor_env = {
    .name = "corridor",
    .gym_id = "lumen-tests/Corridor-v0",
    .state_size = 2,
    .obs_size = 2 * CELLS,
    .action = {.kind = LM_SPACE_DISCRETE, .n = 3},
    .time_limit = 60,
    .solved_return = 0.8f,
    .obs_low = NULL, /* no bounds declared: unbounded */
    .obs_high = NULL,
    .world = {0, 0, (float)CELLS, 3},
    .fps = 10,
    .check_rtol = 0,
    .check_atol = 0,
    .reset = corridor_reset,
    .step = corridor_step,
    .observe = corridor_observe,
    .draw = corridor_draw,
};

LM_ENV_PLUGIN(corridor_env)
