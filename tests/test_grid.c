/* tests/test_grid.c — the compositions games are written with (lumen/ops.h: lm_roll,
 * lm_count_nonzero, lm_first_index, lm_last_index; lumen/env.h: lm_env_cell_index, _mask, _get,
 * _set)
 * against a plain C reference computed here, exactly (every value is a small integer, so
 * nothing may round), on ref, cpu and opencl (PoCL; skipped with a message where no OpenCL
 * device opens): a batch of per-env 10 x 10 maps with positions on, at the edges of and off the
 * map (a few between cells: off the map too), and a symbolic number of envs. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lumen/env.h"
#include "lumen/ops.h"
#include "support/check.h"

enum { N = 37, H = 10, W = 10, C = H * W };

typedef struct world {
  float map[N * C], y[N], x[N], v[N], on[N];
} world;

/* maps of 0s and small integers; positions from -2 to 11 so some fall off the map */
static void make_world(world *w, uint64_t seed) {
  check_rng r = check_rng_new(seed);
  for (size_t i = 0; i < N * C; i++) w->map[i] = check_uniform(&r, 0, 1) < 0.3 ? (float)(1 + check_next(&r) % 4) : 0;
  for (int e = 0; e < 3; e++) memset(w->map + e * C + 40, 0, 20 * sizeof(float)); /* rows with nothing */
  for (int e = 0; e < N; e++) {
    w->y[e] = (float)((int)(check_next(&r) % 14) - 2);
    w->x[e] = (float)((int)(check_next(&r) % 14) - 2);
    w->v[e] = (float)(check_next(&r) % 7);
    w->on[e] = (float)(check_next(&r) % 2);
    if (e % 9 == 4) w->x[e] += 0.5f; /* between two cells: on no cell */
    if (e % 11 == 6) w->y[e] -= 0.25f;
  }
}

static int inside(float y, float x) {
  return y >= 0 && y < H && x >= 0 && x < W && y == (float)(int)y && x == (float)(int)x;
}

enum { BASE = 3 }; /* lm_env_cell_index's offset in the test */

typedef struct outs {
  float index[N], mask[N * C], get[N], set[N * C], roll_x[N * C], roll_y[N * C], count[N * H], first[N * H], last[N * W];
} outs;

static void reference(const world *w, outs *o) {
  for (int e = 0; e < N; e++) {
    const float *m = w->map + e * C;
    int in = inside(w->y[e], w->x[e]), at = in ? (int)w->y[e] * W + (int)w->x[e] : -1;
    o->get[e] = in ? m[at] : 0;
    o->index[e] = in ? (float)(BASE + at) : -1.0f;
    for (int c = 0; c < C; c++) {
      o->mask[e * C + c] = c == at;
      o->set[e * C + c] = c == at && w->on[e] != 0 ? w->v[e] : m[c];
    }
    for (int yy = 0; yy < H; yy++)
      for (int xx = 0; xx < W; xx++) {
        o->roll_x[e * C + yy * W + xx] = m[yy * W + (xx - 3 + W) % W];  /* numpy roll by 3 along x */
        o->roll_y[e * C + yy * W + xx] = m[((yy + 1) % H) * W + xx];     /* by -1 along y */
      }
    for (int yy = 0; yy < H; yy++) {
      int n = 0, first = W;
      for (int xx = W - 1; xx >= 0; xx--)
        if (m[yy * W + xx] != 0) n++, first = xx;
      o->count[e * H + yy] = (float)n, o->first[e * H + yy] = (float)first;
    }
    for (int xx = 0; xx < W; xx++) {
      int last = -1;
      for (int yy = 0; yy < H; yy++)
        if (m[yy * W + xx] != 0) last = yy;
      o->last[e * W + xx] = (float)last;
    }
  }
}

static lm_graph_t *build(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "N");
  lm_tensor map = lm_input(g, "map", LM_ROLE_DATA, 2, (lm_dim[]){n, C});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 1, &n), x = lm_input(g, "x", LM_ROLE_DATA, 1, &n);
  lm_tensor v = lm_input(g, "v", LM_ROLE_DATA, 1, &n), on = lm_input(g, "on", LM_ROLE_DATA, 1, &n);
  lm_tensor grid = lm_reshape(map, 3, (lm_dim[]){n, H, W});
  struct { lm_tensor t; const char *name; } out[] = {
      {lm_env_cell_index(y, x, H, W, BASE), "index"},
      {lm_env_cell_mask(y, x, H, W), "mask"},
      {lm_env_cell_get(map, y, x, H, W), "get"},
      {lm_env_cell_set(map, y, x, H, W, v, on), "set"},
      {lm_roll(grid, 2, 3), "roll_x"},
      {lm_roll(grid, 1, -1), "roll_y"},
      {lm_count_nonzero(grid, 2), "count"},
      {lm_first_index(grid, 2), "first"},
      {lm_last_index(grid, 1), "last"},
  };
  for (size_t i = 0; i < CHECK_COUNT(out); i++)
    cr_assert_eq(lm_output(out[i].t, out[i].name), LM_OK, "%s: %s", out[i].name, lm_last_error());
  return g;
}

static void exact(const char *backend, const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    cr_assert(!memcmp(&got[i], &want[i], sizeof *got), "%s on %s: element %zu is %g, expected %g", what, backend, i,
              (double)got[i], (double)want[i]);
}

static void run_on(const char *backend) {
  world w;
  make_world(&w, 7);
  outs want, got;
  reference(&w, &want);
  lm_graph_t *g = build();
  check_prog p = check_prog_new(g, backend);
  check_sym syms[] = {{"N", N}};
  check_buf in[] = {{"map", w.map, N * C}, {"y", w.y, N}, {"x", w.x, N}, {"v", w.v, N}, {"on", w.on, N}};
  check_buf out[] = {{"index", got.index, N},       {"mask", got.mask, N * C},     {"get", got.get, N},        {"set", got.set, N * C},
                     {"roll_x", got.roll_x, N * C}, {"roll_y", got.roll_y, N * C}, {"count", got.count, N * H},
                     {"first", got.first, N * H},   {"last", got.last, N * W}};
  check_prog_run(&p, syms, CHECK_COUNT(syms), in, CHECK_COUNT(in), out, CHECK_COUNT(out));
  exact(backend, "cell_index", got.index, want.index, N);
  exact(backend, "cell_mask", got.mask, want.mask, N * C);
  exact(backend, "cell_get", got.get, want.get, N);
  exact(backend, "cell_set", got.set, want.set, N * C);
  exact(backend, "roll by 3 along x", got.roll_x, want.roll_x, N * C);
  exact(backend, "roll by -1 along y", got.roll_y, want.roll_y, N * C);
  exact(backend, "count_nonzero", got.count, want.count, N * H);
  exact(backend, "first_index", got.first, want.first, N * H);
  exact(backend, "last_index", got.last, want.last, N * W);
  check_prog_free(&p);
  lm_graph_free(g);
}

Test(grid, cells_rolls_counts_and_indices_are_exact_on_ref) { run_on("ref"); }
Test(grid, cells_rolls_counts_and_indices_are_exact_on_cpu) { run_on("cpu"); }
Test(grid, cells_rolls_counts_and_indices_are_exact_on_opencl) {
  char why[512] = "";
  lm_backend_t *b = lm_backend_open("opencl", why, sizeof why);
  if (!b) cr_skip_test("no OpenCL device: %s", lm_last_error());
  lm_backend_free(b);
  run_on("opencl");
}

Test(grid, roll_and_indices_refuse_a_bad_axis_naming_the_op) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){4, 5});
  cr_assert(lm_tensor_ok(lm_roll(x, 1, -7)) && lm_tensor_ok(lm_roll(x, 0, 0)));
  cr_assert(!lm_tensor_ok(lm_roll(x, 2, 1)));
  cr_assert_neq(lm_graph_validate(g), LM_OK);
  cr_assert(strstr(lm_last_error(), "roll") && strstr(lm_last_error(), "axis 2"), "%s", lm_last_error());
  lm_graph_free(g);
  g = lm_graph_new();
  x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){4, 5});
  cr_assert(!lm_tensor_ok(lm_first_index(x, -3)));
  cr_assert_neq(lm_graph_validate(g), LM_OK);
  cr_assert(strstr(lm_last_error(), "first_index"), "%s", lm_last_error());
  lm_graph_free(g);
}
