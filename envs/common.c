/* envs/common.c — helpers every env shares: columns and stacks of batched state, 0/1 selects,
 * uniform reset draws and the uniform random policy, each as a graph and as the scalar code
 * that reproduces the graph bit for bit (same float32 operations in the same order). */
#include <math.h>
#include <stdlib.h>

#include "core.h"
#include "lumen/env.h"
#include "lumen/ops.h"
#include "lumen/rand.h"

static const lm_tensor invalid = {0};

lm_tensor lm_env_col(lm_tensor x, int k) {
  if (!lm_tensor_ok(x)) return invalid;
  lm_dim n = lm_dim_of(x, 0);
  return lm_reshape(lm_slice(x, 1, k, k + 1), 1, &n);
}

/* Sum over k of col_k [N, 1] padded to column k of n: each column holds its value plus zeros
 * (x + 0 is x, but +0 for -0), and a NaN or inf stays in its own column. In lane form the
 * padding's conditions fold once the column loop is unrolled (compiler/columns.c). */
lm_tensor lm_env_stack(const lm_tensor *cols, int n) {
  lm_tensor acc = invalid;
  for (int k = 0; k < n; k++) {
    if (!lm_tensor_ok(cols[k])) return invalid;
    lm_tensor c = lm_pad(lm_unsqueeze(cols[k], 1), 1, k, n - 1 - k);
    acc = k ? lm_add(acc, c) : c;
  }
  return acc;
}

/* f*a + 0 is +0 wherever f is 0, whatever finite value a has (f*a alone is -0 for a < 0): so a
 * kernel may leave a uncomputed where f is 0 and give the same bits (compiler/lazy.c: the
 * auto-reset's fresh state is drawn only for the envs whose episode ended). The flag f is
 * 0.5 < c, which is c itself for c in {0, 1} and a comparison's 0 or 1 by construction: a
 * kernel whose graph promises finite values (lm_graph_promise_finite) can then print the whole
 * form as a select (compiler/render.c), where c read from a state would prove nothing. */
lm_tensor lm_env_select(lm_tensor c, lm_tensor a, lm_tensor b) {
  if (!lm_tensor_ok(c)) return invalid;
  lm_tensor f = lm_lt(lm_const(c.g, 0.5f), c);
  lm_tensor notf = lm_add(lm_neg(f), lm_const(c.g, 1.0f));
  return lm_add(lm_add(lm_mul(f, a), lm_const(c.g, 0.0f)), lm_mul(notf, b));
}

lm_tensor lm_env_reset_uniform(lm_graph_t *g, lm_dim n_envs, int size, const float *low, const float *high) {
  if (!g || size < 1 || size > LM_ENV_SIZE_LIMIT || !low || !high) return invalid;
  lm_tensor u = lm_rand_stream(g, LM_ENV_STREAM_RESET, 2, (lm_dim[]){n_envs, size});
  lm_tensor *cols = malloc((size_t)size * sizeof *cols);
  if (!cols) return invalid;
  for (int k = 0; k < size; k++) {
    float scale = high[k] - low[k];
    cols[k] = lm_add(lm_mul(lm_env_col(u, k), lm_const(g, scale)), lm_const(g, low[k]));
  }
  lm_tensor out = lm_env_stack(cols, size);
  free(cols);
  return out;
}

void lm_env_ref_reset_uniform(float *state, int size, const float *low, const float *high, uint64_t seed,
                              uint64_t env, uint64_t run) {
  for (int k = 0; k < size; k++) {
    float u = lm_rand_uniform(seed, LM_ENV_STREAM_RESET, env * (uint64_t)size + (uint64_t)k, run);
    float scale = high[k] - low[k];
    float v = u * scale; /* two statements: no contraction into an FMA */
    state[k] = v + low[k];
  }
}

/* [N]: base + y * w + x where (y, x) is a cell of the h x w map (0 <= y < h, 0 <= x < w, both
 * whole numbers), -1 elsewhere: small integers, exact. A mask over many columns compares this one
 * index with each column's (one comparison per column, not two and a product): Breakout's step
 * does, over the 108 columns of its state. */
lm_tensor lm_env_cell_index(lm_tensor y, lm_tensor x, int h, int w, int base) {
  if (!lm_tensor_ok(y) || !lm_tensor_ok(x) || h < 1 || w < 1 || base < 0) return invalid;
  lm_graph_t *g = x.g;
  lm_tensor in_y = lm_mul(lm_ge(y, lm_const(g, 0.0f)), lm_lt(y, lm_const(g, (float)h)));
  lm_tensor in_x = lm_mul(lm_ge(x, lm_const(g, 0.0f)), lm_lt(x, lm_const(g, (float)w)));
  lm_tensor whole = lm_mul(lm_eq(lm_floor(y), y), lm_eq(lm_floor(x), x));
  lm_tensor on = lm_mul(lm_mul(in_y, in_x), whole);
  lm_tensor at = lm_add(lm_add(lm_mul(y, lm_const(g, (float)w)), x), lm_const(g, (float)base));
  return lm_env_select(on, at, lm_scalar_like(x, -1.0f));
}

/* [1, h * w]: each cell's row (axis 0) or column (axis 1), a view of lm_arange */
static lm_tensor cell_coord(lm_graph_t *g, int h, int w, int axis) {
  lm_tensor c = lm_expand(lm_arange(g, axis ? w : h), axis ? 0 : 1, axis ? h : w); /* [h, w] */
  return lm_reshape(c, 2, (lm_dim[]){1, (lm_dim)h * w});
}

/* The row and the column compared apart (a position off the map matches no cell), not the flat
 * index: an observation's masks then fuse into their consumer (with lm_env_cell_index the
 * index is a kernel of its own: Breakout's rollout 15 kernels instead of 14). */
lm_tensor lm_env_cell_mask(lm_tensor y, lm_tensor x, int h, int w) {
  if (!lm_tensor_ok(y) || !lm_tensor_ok(x) || h < 1 || w < 1) return invalid;
  lm_graph_t *g = x.g;
  return lm_mul(lm_eq(lm_unsqueeze(y, -1), cell_coord(g, h, w, 0)), lm_eq(lm_unsqueeze(x, -1), cell_coord(g, h, w, 1)));
}

lm_tensor lm_env_cell_get(lm_tensor map, lm_tensor y, lm_tensor x, int h, int w) {
  return lm_sum(lm_mul(map, lm_env_cell_mask(y, x, h, w)), -1, 0);
}

lm_tensor lm_env_cell_set(lm_tensor map, lm_tensor y, lm_tensor x, int h, int w, lm_tensor value, lm_tensor where) {
  lm_tensor m = lm_mul(lm_env_cell_mask(y, x, h, w), lm_unsqueeze(where, -1));
  return lm_where(m, lm_broadcast_to(lm_unsqueeze(value, -1), 2, (lm_dim[]){lm_dim_of(map, 0), lm_dim_of(map, 1)}),
                  map);
}

int lm_env_action_size(const lm_env_spec *env) {
  return env->action.kind == LM_SPACE_DISCRETE ? 1 : env->action.n;
}

lm_tensor lm_env_random_action(const lm_env_spec *env, lm_graph_t *g, lm_dim n_envs) {
  if (!env || !g) return invalid;
  if (env->action.kind == LM_SPACE_DISCRETE) {
    float n = (float)env->action.n;
    lm_tensor u = lm_rand_stream(g, LM_ENV_STREAM_ACTION, 1, &n_envs);
    lm_tensor un = lm_mul(u, lm_const(g, n));
    if (env->action.n > 8) return lm_minimum(lm_floor(un), lm_const(g, n - 1.0f));
    /* min(floor(u n), n - 1) counts the j in 1 .. n-1 with j <= u n: a comparison per j is
     * the same integer for every u, and a few of them cost less than floor and minimum */
    if (env->action.n == 1) return lm_mul(un, lm_const(g, 0.0f)); /* action 0 (u n is finite) */
    lm_tensor a = lm_ge(un, lm_const(g, 1.0f));
    for (int j = 2; j < env->action.n; j++) a = lm_add(a, lm_ge(un, lm_const(g, (float)j)));
    return a;
  }
  int a = env->action.n;
  lm_tensor u = lm_rand_stream(g, LM_ENV_STREAM_ACTION, 2, (lm_dim[]){n_envs, a});
  lm_tensor *cols = malloc((size_t)a * sizeof *cols);
  if (!cols) return invalid;
  for (int k = 0; k < a; k++) {
    float scale = env->action.high[k] - env->action.low[k];
    cols[k] = lm_add(lm_mul(lm_env_col(u, k), lm_const(g, scale)), lm_const(g, env->action.low[k]));
  }
  lm_tensor out = lm_env_stack(cols, a);
  free(cols);
  return out;
}

void lm_env_ref_random_action(const lm_env_spec *env, uint64_t seed, uint64_t envi, uint64_t run, float *action) {
  if (env->action.kind == LM_SPACE_DISCRETE) {
    float n = (float)env->action.n;
    float v = lm_rand_uniform(seed, LM_ENV_STREAM_ACTION, envi, run) * n;
    float f = floorf(v);
    action[0] = f < n - 1.0f ? f : n - 1.0f;
    return;
  }
  int a = env->action.n;
  for (int k = 0; k < a; k++) {
    float u = lm_rand_uniform(seed, LM_ENV_STREAM_ACTION, envi * (uint64_t)a + (uint64_t)k, run);
    float scale = env->action.high[k] - env->action.low[k];
    float v = u * scale;
    action[k] = v + env->action.low[k];
  }
}
