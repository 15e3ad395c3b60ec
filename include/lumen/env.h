/* lumen/env.h — environments as graphs. An env declares its spaces and time limit, builds
 * batched graphs for reset, step and observe over state [N, state_size], carries a scalar
 * reference stepper in plain C (the oracle, and the host-stepped baseline), and a draw list
 * for the viewer. Adding an env is one file in envs/ (or examples/) plus one registry line. */
#ifndef LUMEN_ENV_H
#define LUMEN_ENV_H

#include "lumen/graph.h"
#include "lumen/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes are the env's own: state_size, obs_size and a box's n may be anything from 1 to
 * LM_ENV_SIZE_LIMIT (a bound that keeps N * size products in range, not a buffer size: every
 * host buffer is sized from the spec). */
#define LM_ENV_SIZE_LIMIT (1 << 24)
#define LM_ENV_MAX_DRAW 64 /* the viewer's first draw-list size (an env may need more: see draw) */

typedef enum lm_space_kind { LM_SPACE_DISCRETE, LM_SPACE_BOX } lm_space_kind;

typedef struct lm_space {
  lm_space_kind kind;
  int n;                      /* discrete: number of actions; box: number of dimensions */
  const float *low, *high;    /* box: n bounds each (actions are clipped to them); discrete: unused */
} lm_space;

/* RAND streams an env uses: its resets draw from stream `LM_ENV_STREAM_RESET`; its step, if
 * it is stochastic, from `LM_ENV_STREAM_STEP`. Element index = env * width + k.
 * `LM_ENV_STREAM_ACTION` feeds the uniform random policy (lm_env_random_action), which
 * `rltrain record`, the env tests and the benchmarks use. */
enum { LM_ENV_STREAM_RESET = 1000, LM_ENV_STREAM_STEP = 1001, LM_ENV_STREAM_ACTION = 1002 };
/* The vec env's sticky actions (lm_env_spec.sticky) draw from this stream, element env. */
enum { LM_ENV_STREAM_STICKY = 1003 };

/* A draw command in world coordinates (the viewer scales the env's world box to the window). */
typedef enum lm_draw_kind { LM_DRAW_LINE, LM_DRAW_RECT, LM_DRAW_CIRCLE } lm_draw_kind;
typedef struct lm_draw_cmd {
  lm_draw_kind kind;
  float x0, y0, x1, y1; /* line: endpoints; rect: min and max corners; circle: centre, (radius, -) */
  float width;          /* line width in world units (0: one pixel) */
  uint32_t rgba;
} lm_draw_cmd;

/* One batched step's graph values. */
typedef struct lm_env_step_out {
  lm_tensor state;      /* [N, state_size] after the step */
  lm_tensor reward;     /* [N] */
  lm_tensor terminated; /* [N], 1.0f where the episode ended by the env's own rule */
} lm_env_step_out;

typedef struct lm_env_spec {
  const char *name;       /* "cartpole": what people type */
  const char *gym_id;     /* "CartPole-v1" */
  int state_size, obs_size;
  /* The observation's shape when it is more than a vector: obs_rank axes of obs_shape (their
   * product obs_size, row-major), e.g. MinAtar's 10 x 10 x C image (height, width, channels);
   * the graphs still give [N, obs_size]. obs_rank 0: a vector. A rank-3 shape gets a
   * convolutional policy by default. */
  int obs_rank;
  int obs_shape[LM_MAX_RANK];
  lm_space action;
  int time_limit;         /* steps before truncation */
  float solved_return;    /* mean episode return counted as solved (drawn on curves) */
  const float *obs_low, *obs_high; /* obs_size bounds each, or both NULL: unbounded */
  float world[4];         /* viewer's world box: xmin, ymin, xmax, ymax */
  float fps;              /* natural frame rate for the viewer */
  /* What `rltrain check` allows between the float32 graph and recorded transitions (state and
   * obs columns: |got - want| <= atol + rtol * |want|; reward: |got - want| <= reward_atol +
   * reward_rtol * |want|, so 0 and 0 demand the exact value). See docs/ENVS.md. */
  float check_rtol, check_atol;
  float reward_rtol, reward_atol;
  /* 1: from the states its reset and steps reach, and any action, every value the env's graphs
   * compute is finite, and nothing the env gives depends on the sign of a zero (an env over
   * small integers, as MinAtar's). Its env-only programs (the vec env's, `rltrain check`'s,
   * rlbench's) then promise finite values (lm_graph_promise_finite): their cpu kernels print
   * selects as selects, and on ref a value that breaks the promise fails the run, naming its
   * node (a state written by hand far outside the reachable ones can: 1e38 in a coordinate
   * that the step multiplies). 0: no promise. */
  int finite;

  /* ---- graphs (batched over axis 0, N envs; actions: [N] action indices as floats for
   * discrete spaces, [N, n] for boxes; build nothing but graph nodes) ---- */
  lm_tensor (*reset)(lm_graph_t *g, lm_dim n_envs);
  void (*step)(lm_graph_t *g, lm_tensor state, lm_tensor action, lm_env_step_out *out);
  lm_tensor (*observe)(lm_graph_t *g, lm_tensor state);

  /* ---- the scalar reference stepper (one env; float32 state like the graph) ---- */
  /* Initial state of env `env` from the same uniforms the reset graph draws
   * (lm_rand_uniform(seed, LM_ENV_STREAM_RESET, env * state_size + k, run)). */
  void (*ref_reset)(float *state, uint64_t seed, uint64_t env, uint64_t run);
  /* One step; returns the reward and writes terminated. Actions as in the graph. */
  float (*ref_step)(float *state, const float *action, int *terminated);
  void (*ref_observe)(const float *state, float *obs);

  /* ---- drawing: writes up to cap commands for one env's state and returns how many the state
   * needs, as snprintf does: a caller given more than cap calls again with that many ---- */
  int (*draw)(const float *state, lm_draw_cmd *cmds, int cap);

  /* ---- training settings that suit this env, over lumen's defaults: "key = value" lines as
   * in `rltrain ENV --config FILE` (lm_ppo_config_apply); NULL: lumen's defaults ---- */
  const char *train_defaults;

  /* ---- the vec env's action wrappers, for discrete spaces; `rltrain ENV --env` sets them ---- */
  float sticky;            /* probability that a step repeats the action the env applied last,
                            * as MinAtar does (its default 0.1); 0: never */
  const char *action_sets; /* named subsets of the actions, "minimal = 0 1 3; moves = 1 3" (optional) */
  /* ---- set by lm_env_configure (an env leaves them 0) ---- */
  const int *action_map;   /* the agent's action k is the env's action action_map[k] (NULL: the same) */
  int env_actions;         /* with action_map: how many actions the env itself has */
  const char *params;      /* the canonical parameter text it was configured with */
  const struct lm_env_spec *base; /* the env it was configured from */
} lm_env_spec;

/* ---- helpers for writing env graphs and reference steppers (compositions of lumen/ops.h) ---- */
/* Column k of x [N, S] as [N]. */
lm_tensor lm_env_col(lm_tensor x, int k);
/* n tensors [N] side by side as [N, n]. */
lm_tensor lm_env_stack(const lm_tensor *cols, int n);
/* c ? a : b for c in {0, 1}: with f = (0.5 < c), (f*a + 0) + (1-f)*b, exact for finite a and b
 * up to the sign of a zero (the + 0 lets a kernel skip computing a where f is 0). Any other c
 * picks a where c > 0.5 and b elsewhere (NaN included); a non-finite unpicked operand gives NaN
 * unless the graph promises finite values (lm_graph_promise_finite). */
lm_tensor lm_env_select(lm_tensor c, lm_tensor a, lm_tensor b);
/* [N, size] with column k uniform in (low[k], high[k]] from stream LM_ENV_STREAM_RESET, element
 * env * size + k: low + (high - low) * u in float32, which lm_env_ref_reset_uniform reproduces
 * bit for bit (so graph and reference stepper start from the same state). */
lm_tensor lm_env_reset_uniform(lm_graph_t *g, lm_dim n_envs, int size, const float *low, const float *high);
void lm_env_ref_reset_uniform(float *state, int size, const float *low, const float *high, uint64_t seed,
                              uint64_t env, uint64_t run);
/* The uniform random policy from stream LM_ENV_STREAM_ACTION: discrete: min(floor(u * n), n - 1)
 * with u at element env ([N]); box: low + (high - low) * u at element env * n + k ([N, n]).
 * lm_env_ref_random_action writes the same action for one env, bit for bit. */
lm_tensor lm_env_random_action(const lm_env_spec *env, lm_graph_t *g, lm_dim n_envs);
void lm_env_ref_random_action(const lm_env_spec *env, uint64_t seed, uint64_t envi, uint64_t run,
                              float *action);
/* Grids: a per-env map of h x w cells kept as [N, h * w] (row-major), positions y, x [N] as
 * small integers in floats. All three are exact: one-hot masks and selects, no rounding. */
/* [N]: base + y * w + x, the flat index of cell (y, x) counted from base, where it is a cell of
 * the map (whole numbers, 0 <= y < h, 0 <= x < w); -1 elsewhere. */
lm_tensor lm_env_cell_index(lm_tensor y, lm_tensor x, int h, int w, int base);
/* [N, h * w]: 1 at cell (y, x), 0 elsewhere (all 0 when (y, x) is off the map). */
lm_tensor lm_env_cell_mask(lm_tensor y, lm_tensor x, int h, int w);
/* [N]: map's value at (y, x); 0 off the map. */
lm_tensor lm_env_cell_get(lm_tensor map, lm_tensor y, lm_tensor x, int h, int w);
/* map with cell (y, x) set to value [N] in the envs where `where` [N] is 1 (unchanged where it is
 * 0, or off the map). */
lm_tensor lm_env_cell_set(lm_tensor map, lm_tensor y, lm_tensor x, int h, int w, lm_tensor value, lm_tensor where);
/* Floats per action: 1 for discrete spaces (the index), n for boxes. */
int lm_env_action_size(const lm_env_spec *env);

/* The env contract, checked where an env meets lumen: a name, the reset, step and observe
 * graphs (a reference stepper is optional, but all three of ref_reset, ref_step and ref_observe
 * or none), sizes from 1 to LM_ENV_SIZE_LIMIT, a sane action space (a box's bounds finite with
 * low < high), observation bounds (both or neither, low <= high), a time limit, and, on a
 * trial build over 3 envs, reset [N, state_size], step's state [N, state_size], reward [N] and
 * terminated [N], observe [N, obs_size], all in the graph passed in. LM_OK, or LM_ERR_INVALID
 * with a message naming the env, the field and both shapes (and the graph's own first error). */
lm_status lm_env_validate(const lm_env_spec *env);

/* ---- env parameters: `rltrain ENV --env time_limit=1000,sticky=0,actions=minimal` ----
 * text is "key=value" items separated by commas, for every env:
 *   time_limit=K  steps before an episode is truncated (K >= 1)
 *   sticky=P      discrete spaces: probability in [0, 1) that a step repeats the action the env
 *                 applied last instead of the agent's (drawn from LM_ENV_STREAM_STICKY)
 *   actions=SET   discrete spaces: the agent's actions, "full" (the env's own) or a set named in
 *                 the spec's action_sets; the agent's action k is then the set's k-th action
 * *out is a configured copy of env (same name, the params text canonical: keys in this order,
 * only those that differ from the env's own), interned for the process (the same env and text
 * give the same pointer), or env itself for an empty text. LM_ERR_INVALID names a bad key or
 * value, and the keys there are. */
lm_status lm_env_configure(const lm_env_spec *env, const char *text, const lm_env_spec **out);
/* The env a configured env was made from (env itself when it was not configured). */
const lm_env_spec *lm_env_base(const lm_env_spec *env);
/* The reference stepper's view of the vec env's action wrappers: the env's action for the
 * agent's action a (through action_map), repeated from *last where u < sticky; *last is updated.
 * u: a uniform in (0, 1], the vec env's draw being lm_rand_uniform(seed, LM_ENV_STREAM_STICKY,
 * env, run). Box spaces: a itself. */
float lm_env_ref_action(const lm_env_spec *env, float a, float *last, float u);

/* The registry: every env compiled into this build, then those added by lm_env_register. */
int lm_env_count(void);
const lm_env_spec *lm_env_at(int i);
/* By name or Gymnasium id, case-insensitive; NULL (and lm_last_error) when unknown. */
const lm_env_spec *lm_env_find(const char *name);
/* Adds an env (checked by lm_env_validate; its name and Gymnasium id must be new) for the rest
 * of the process: lm_env_find and lm_env_at see it, and so does everything that takes an env by
 * name. The spec must outlive its use. Registering the same spec twice is a no-op. */
lm_status lm_env_register(const lm_env_spec *env);

/* The batched env with time limit and same-step auto-reset, as graph values. Reads and
 * assigns two STATE inputs, named prefix + "state" ([N, state_size]) and prefix + "t"
 * ([N], steps taken in the current episode). */
typedef struct lm_vec_step {
  lm_tensor state, t;    /* the STATE inputs */
  lm_tensor obs;         /* [N, obs_size] observation after the step (after reset where done) */
  lm_tensor final_obs;   /* [N, obs_size] observation the step reached, before any reset */
  lm_tensor reward;      /* [N] */
  lm_tensor terminated;  /* [N] */
  lm_tensor truncated;   /* [N] (time limit reached and not terminated) */
} lm_vec_step;
lm_status lm_env_vec_step(const lm_env_spec *env, lm_graph_t *g, const char *prefix, lm_dim n_envs,
                          lm_tensor action, lm_vec_step *out);
/* The same env with Gymnasium's next-step auto-reset (AutoresetMode.NEXT_STEP): obs is what the
 * step reached (final_obs is the same tensor), and an env whose episode ended is reset by the
 * next step, which ignores its action and gives the first observation, reward 0, terminated
 * and truncated 0. A third STATE input, prefix + "pending" ([N]), is 1 where that reset is due
 * (0 at first). The reset draws at the step that performs it. */
lm_status lm_env_vec_step_next(const lm_env_spec *env, lm_graph_t *g, const char *prefix, lm_dim n_envs,
                               lm_tensor action, lm_vec_step *out);

/* Steps n envs once, each from its own given state: the env's step and observe graphs compiled
 * on backend b and run once over the batch (no time limit, no reset). state [n, state_size] and
 * action [n, lm_env_action_size] in; next [n, state_size], obs [n, obs_size], reward [n] and
 * terminated [n] out. This is how `rltrain check` replays a transitions file. */
lm_status lm_env_step_batch(const lm_env_spec *env, lm_backend_t *b, size_t n, const float *state,
                            const float *action, float *next, float *obs, float *reward, float *terminated);

/* ---- env plugins: an env in one C file of its own, outside lumen's tree ----
 * The file defines its spec and ends with LM_ENV_PLUGIN(spec). `rltrain path/to/myenv.c`
 * compiles it with the system compiler against lumen's headers (cached like kernels);
 * `rltrain path/to/libmyenv.so` loads one built by hand (cc -shared -fPIC -I...). */
#if defined(__GNUC__) || defined(__clang__)
#define LM_ENV_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define LM_ENV_PLUGIN_EXPORT
#endif
/* The layout of lm_env_spec a plugin was compiled against: lumen refuses a plugin built against
 * another (a prebuilt .so must be rebuilt; a .c file is rebuilt by itself). */
#define LM_ENV_ABI_VERSION 2
#define LM_ENV_ABI ((LM_ENV_ABI_VERSION << 16) | (int)sizeof(lm_env_spec))
#define LM_ENV_PLUGIN(spec)                                                                                      \
  LM_ENV_PLUGIN_EXPORT const lm_env_spec *lm_env_plugin_v1(void);                                                \
  LM_ENV_PLUGIN_EXPORT const lm_env_spec *lm_env_plugin_v1(void) { return &(spec); }                             \
  LM_ENV_PLUGIN_EXPORT int lm_env_plugin_abi(void);                                                              \
  LM_ENV_PLUGIN_EXPORT int lm_env_plugin_abi(void) { return LM_ENV_ABI; }

/* Loads a plugin (PATH.c compiled, or PATH.so as it is), checks its spec (lm_env_validate) and
 * registers it; loading the same file again in a process gives the same spec. The headers for
 * compiling come from $LUMEN_INCLUDE_DIR, else lumen's install prefix, else its build tree. */
lm_status lm_env_load(const char *path, const lm_env_spec **out);
/* 1 when an argument names an env file rather than an env (it holds a '/' or ends in .c or .so). */
int lm_env_is_path(const char *arg);
/* A plugin's file (or a registered name): lm_env_load for a path, lm_env_find for a name. */
lm_status lm_env_resolve(const char *name_or_path, const lm_env_spec **out);
/* Where a plugin env came from: its absolute path and a hash of its bytes; 0 for an env that is
 * not a plugin (built in, or registered by the program). */
int lm_env_origin(const lm_env_spec *env, char *path, size_t cap, char *hash, size_t hcap);

/* An env stepped through its own graphs, compiled once on backend b: the stand-in for the scalar
 * reference stepper of an env that has none. lm_env_stepper_reset writes [n, state_size]: row i
 * is what the reset graph (and ref_reset) gives env i under (seed, run). step and observe take
 * any batch of up to any size (N is a symbol): state [m, S] and action [m, action size] in;
 * next [m, S], obs [m, O], reward [m] and terminated [m] out. */
typedef struct lm_env_stepper lm_env_stepper;
lm_env_stepper *lm_env_stepper_new(const lm_env_spec *env, lm_backend_t *b, size_t n);
void lm_env_stepper_free(lm_env_stepper *s);
size_t lm_env_stepper_envs(const lm_env_stepper *s);
lm_status lm_env_stepper_reset(lm_env_stepper *s, uint64_t seed, uint64_t run, float *state);
lm_status lm_env_stepper_step(lm_env_stepper *s, size_t m, const float *state, const float *action, float *next,
                              float *obs, float *reward, float *terminated);
lm_status lm_env_stepper_observe(lm_env_stepper *s, size_t m, const float *state, float *obs);

#ifdef __cplusplus
}
#endif
#endif
