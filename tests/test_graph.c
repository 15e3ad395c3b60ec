/* Tests for the graph IR (compiler/graph.c, validate.c, text.c): view shapes and the
 * flat-index/validity expressions of every view kind and of compositions, checked point by
 * point against hand-written C mappings (also with symbolic dims under several bindings);
 * simplifier results; validator and binding-check errors, each naming the node; sticky
 * construction errors; the text form's exact round trip and its line-numbered rejections. */
#include <criterion/criterion.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/graph-impl.h"
#include "compiler/validate.h"
#include "support/check.h"

/* ---------------------------------------------------------------- helpers */

static const char *last(void) { return lm_last_error(); }

static lm_graph_t *parse_ok(const char *text) {
  lm_graph_t *g = lm_graph_parse(text);
  cr_assert_not_null(g, "parse failed: %s\n%s", last(), text);
  return g;
}

/* Validation fails with LM_ERR_INVALID and a message holding both fragments. */
static void expect_invalid(const lm_graph_t *g, const char *frag1, const char *frag2) {
  lm_status st = lm_graph_validate(g);
  cr_assert_eq(st, LM_ERR_INVALID, "expected LM_ERR_INVALID, got %d (%s)", (int)st, last());
  cr_assert(strstr(last(), frag1), "message '%s' lacks '%s'", last(), frag1);
  if (frag2) cr_assert(strstr(last(), frag2), "message '%s' lacks '%s'", last(), frag2);
}

static void expect_valid(const lm_graph_t *g) {
  lm_status st = lm_graph_validate(g);
  cr_assert_eq(st, LM_OK, "validate: %s", last());
}

static int strcount(const char *s, char c) {
  int n = 0;
  for (; *s; s++) n += *s == c;
  return n;
}

static void print_expr(lm_graph_t *g, lm_expr e, char *buf, size_t cap) {
  lm_sb sb = {0};
  lm_x_print(&g->x, e, &sb, "i");
  snprintf(buf, cap, "%s", sb.s ? sb.s : "?");
  lm_sb_free(&sb);
}

/* Reference mapping: from an index of the viewed shape to the source's flat index and
 * validity; syms holds the symbol values. */
typedef void (*ref_fn)(const int64_t *idx, const int64_t *syms, int64_t *flat, int *valid);

/* Evaluates the edge's index expressions at every index of its (concrete) shape and compares
 * them with ref; also checks every valid read lies inside the source buffer. Returns the
 * number of points checked. */
static long check_index(lm_tensor t, const int64_t *syms, ref_fn ref) {
  lm_graph_t *g = t.g;
  cr_assert(lm_tensor_ok(t), "tensor invalid: %s", g->errmsg ? g->errmsg : "?");
  lm_edge e = lm_edge_of(t);
  lm_shape s = *lm_edge_shape(g, e);
  lm_expr idx[LM_MAX_RANK];
  int64_t dims[LM_MAX_RANK], vars[LM_MAX_RANK] = {0};
  for (int i = 0; i < s.rank; i++) {
    idx[i] = lm_x_var(&g->x, i);
    dims[i] = lm_x_eval(&g->x, s.dim[i], NULL, syms);
    cr_assert_gt(dims[i], 0, "dim %d is %lld", i, (long long)dims[i]);
  }
  lm_xctx ctx = {.extent = s.dim, .nvars = s.rank};
  lm_expr flat, valid;
  lm_edge_index(g, e, idx, &ctx, &flat, &valid);
  cr_assert(flat && valid, "index expressions missing");
  int64_t numel = lm_x_eval(&g->x, lm_shape_numel(g, &g->nodes[e.node].shape), NULL, syms);
  long points = 0;
  for (;;) {
    int64_t rf = -1, gf = lm_x_eval(&g->x, flat, vars, syms), gv = lm_x_eval(&g->x, valid, vars, syms);
    int rv = 0;
    ref(vars, syms, &rf, &rv);
    cr_assert_eq(gv != 0, rv != 0, "validity at point %ld: got %lld, want %d", points, (long long)gv, rv);
    if (rv) {
      cr_assert_eq(gf, rf, "flat index at point %ld (i0=%lld): got %lld, want %lld", points, (long long)vars[0],
                   (long long)gf, (long long)rf);
      cr_assert(gf >= 0 && gf < numel, "read %lld outside the source's %lld elements", (long long)gf, (long long)numel);
    }
    points++;
    int i = s.rank - 1;
    for (; i >= 0; i--) {
      if (++vars[i] < dims[i]) break;
      vars[i] = 0;
    }
    if (i < 0) break;
  }
  return points;
}

static lm_tensor input(lm_graph_t *g, const char *name, int rank, const lm_dim *dims) {
  lm_tensor t = lm_input(g, name, LM_ROLE_DATA, rank, dims);
  cr_assert(lm_tensor_ok(t), "input %s: %s", name, g->errmsg ? g->errmsg : "?");
  return t;
}

static void expect_shape(lm_tensor t, const char *want) {
  lm_sb sb = {0};
  lm_shape_print(t.g, lm_edge_shape(t.g, lm_edge_of(t)), &sb);
  cr_assert_str_eq(sb.s, want);
  lm_sb_free(&sb);
}

/* ---------------------------------------------------------------- views: shapes and index */

static void ref_permute(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* y[a,b,c] = x[b,c,a], x: [2,3,4] */
  *f = i[1] * 12 + i[2] * 4 + i[0];
  *v = 1;
}

Test(views, permute_output_axis_j_reads_input_axis_perm_j) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 3, (lm_dim[]){2, 3, 4});
  lm_tensor y = lm_permute(x, (int[]){2, 0, 1});
  expect_shape(y, "[4,2,3]");
  cr_assert_eq(check_index(y, NULL, ref_permute), 24);
  lm_graph_free(g);
}

static void ref_expand_mid(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* y[a,k,b] = x[a,b], x: [2,3] */
  *f = i[0] * 3 + i[2];
  *v = 1;
}

Test(views, expand_inserts_an_axis_whose_index_is_ignored) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 2, (lm_dim[]){2, 3});
  lm_tensor y = lm_expand(x, 1, 5);
  expect_shape(y, "[2,5,3]");
  cr_assert_eq(check_index(y, NULL, ref_expand_mid), 30);
  lm_graph_free(g);
}

static void ref_slice(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* y[a,b] = x[a, b+2], x: [5,6] */
  *f = i[0] * 6 + i[1] + 2;
  *v = 1;
}

Test(views, slice_offsets_the_axis_by_its_start) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_slice(input(g, "x", 2, (lm_dim[]){5, 6}), 1, 2, 5);
  expect_shape(y, "[5,3]");
  cr_assert_eq(check_index(y, NULL, ref_slice), 15);
  lm_graph_free(g);
}

static void ref_pad(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* y[a,b] = x[a, b-2] for 2 <= b < 6, else 0; x: [3,4] */
  *v = i[1] >= 2 && i[1] < 6;
  *f = i[0] * 4 + i[1] - 2;
}

Test(views, pad_marks_padding_invalid_and_shifts_the_rest) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_pad(input(g, "x", 2, (lm_dim[]){3, 4}), 1, 2, 1);
  expect_shape(y, "[3,7]");
  cr_assert_eq(check_index(y, NULL, ref_pad), 21);
  lm_graph_free(g);
}

static void ref_identity(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* [4,6] over a [2,3,4] buffer: same row-major order */
  *f = i[0] * 6 + i[1];
  *v = 1;
}

static void ref_flat1(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s;
  *f = i[0];
  *v = 1;
}

Test(views, reshape_keeps_row_major_order) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 3, (lm_dim[]){2, 3, 4});
  lm_tensor y = lm_reshape(x, 2, (lm_dim[]){4, 6});
  expect_shape(y, "[4,6]");
  cr_assert_eq(check_index(y, NULL, ref_identity), 24);
  cr_assert_eq(check_index(lm_reshape(x, 1, (lm_dim[]){24}), NULL, ref_flat1), 24);
  lm_graph_free(g);
}

static void ref_affine(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* y[a,b] = x[a, (2b+3) mod 5], x: [3,5] */
  *f = i[0] * 5 + (2 * i[1] + 3) % 5;
  *v = 1;
}

Test(views, affine_mod_reads_a_times_i_plus_b_modulo_the_extent) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_affine_mod(input(g, "x", 2, (lm_dim[]){3, 5}), 1, 2, 3);
  expect_shape(y, "[3,5]");
  cr_assert_eq(check_index(y, NULL, ref_affine), 15);
  lm_graph_free(g);
}

static void ref_transpose_flatten(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s; /* x [2,3] -> permute [3,2] -> reshape [6]: y[k] = x[k%2, k/2] */
  *f = (i[0] % 2) * 3 + i[0] / 2;
  *v = 1;
}

Test(views, permute_then_reshape_reads_the_transposed_order) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 2, (lm_dim[]){2, 3});
  lm_tensor y = lm_reshape(lm_permute(x, (int[]){1, 0}), 1, (lm_dim[]){6});
  expect_shape(y, "[6]");
  cr_assert_eq(check_index(y, NULL, ref_transpose_flatten), 6);
  lm_graph_free(g);
}

static void ref_chain(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  (void)s;
  /* x [4,5] -pad axis1 (1,2)-> [4,8] -slice axis0 [1,4)-> [3,8] -expand axis0 2-> [2,3,8]
   * -permute (2,0,1)-> [8,2,3] -reshape-> [16,3] */
  int64_t lin = i[0] * 3 + i[1];
  int64_t a = lin / 6, c = lin % 3;   /* [8,2,3] index (a, b, c); b is the expanded axis */
  int64_t r = c + 1, col = a - 1;      /* [2,3,8](b, c, a) -> [3,8](c, a) -> [4,8](c+1, a) */
  *v = a >= 1 && a < 6;
  *f = r * 5 + col;
}

Test(views, pad_slice_expand_permute_reshape_compose_like_the_reference) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 2, (lm_dim[]){4, 5});
  lm_tensor y = lm_pad(x, 1, 1, 2);
  y = lm_slice(y, 0, 1, 4);
  y = lm_expand(y, 0, 2);
  y = lm_permute(y, (int[]){2, 0, 1});
  y = lm_reshape(y, 2, (lm_dim[]){16, 3});
  expect_shape(y, "[16,3]");
  cr_assert_eq(check_index(y, NULL, ref_chain), 48);
  expect_valid(g);
  lm_graph_free(g);
}

static void ref_sym_slice_pad(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  /* x [N,T] -slice axis1 [1,T)-> [N,T-1] -pad axis0 (1,0)-> [N+1,T-1] */
  int64_t T = s[1];
  *v = i[0] >= 1;
  *f = (i[0] - 1) * T + i[1] + 1;
}

static void ref_sym_affine(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  /* x [N,T] -reshape-> [N*T] -affine_mod 3, B-> */
  *f = (3 * i[0] + s[2]) % (s[0] * s[1]);
  *v = 1;
}

Test(views, symbolic_slice_pad_and_affine_mod_match_the_reference_under_two_bindings) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N"), T = lm_sym(g, "T"), B = lm_sym_min(g, "B", 0);
  lm_tensor x = input(g, "x", 2, (lm_dim[]){N, T});
  lm_tensor y = lm_pad(lm_slice(x, 1, 1, T), 0, 1, 0);
  expect_shape(y, "[N + 1,T + (-1)]");
  lm_tensor z = lm_affine_mod(lm_reshape(x, 1, (lm_dim[]){lm_dim_mul(g, N, T)}), 0, 3, B);
  expect_shape(z, "[N*T]");
  const int64_t bind[2][3] = {{3, 4, 5}, {2, 5, 0}};
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(check_index(y, bind[k], ref_sym_slice_pad), (bind[k][0] + 1) * (bind[k][1] - 1));
    cr_assert_eq(check_index(z, bind[k], ref_sym_affine), bind[k][0] * bind[k][1]);
  }
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- simplifier */

static void edge_index_text(lm_tensor t, char *flat_text, char *valid_text, size_t cap) {
  lm_graph_t *g = t.g;
  const lm_shape *s = lm_edge_shape(g, lm_edge_of(t));
  lm_expr idx[LM_MAX_RANK], flat, valid;
  for (int i = 0; i < s->rank; i++) idx[i] = lm_x_var(&g->x, i);
  lm_xctx ctx = {.extent = s->dim, .nvars = s->rank};
  lm_edge_index(g, lm_edge_of(t), idx, &ctx, &flat, &valid);
  print_expr(g, flat, flat_text, cap);
  print_expr(g, valid, valid_text, cap);
}

Test(simplify, reshape_round_trip_N_T_to_NT_and_back_is_the_identity_index) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N"), T = lm_sym(g, "T");
  lm_tensor x = input(g, "x", 2, (lm_dim[]){N, T});
  lm_tensor y = lm_reshape(lm_reshape(x, 1, (lm_dim[]){lm_dim_mul(g, N, T)}), 2, (lm_dim[]){N, T});
  cr_assert_neq(y.view, 0, "the round trip should go through two views");
  char flat[256], valid[256];
  edge_index_text(y, flat, valid, sizeof flat);
  cr_assert_str_eq(flat, "i0*T + i1");
  cr_assert_str_eq(valid, "1");
  lm_graph_free(g);
}

Test(simplify, broadcast_index_does_not_depend_on_the_expanded_variable) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor b = input(g, "bias", 1, (lm_dim[]){4});
  lm_tensor y = lm_broadcast_to(b, 2, (lm_dim[]){N, 4});
  expect_shape(y, "[N,4]");
  const lm_shape *s = lm_edge_shape(g, lm_edge_of(y));
  lm_expr idx[2] = {lm_x_var(&g->x, 0), lm_x_var(&g->x, 1)}, flat, valid;
  lm_xctx ctx = {.extent = s->dim, .nvars = 2};
  lm_edge_index(g, lm_edge_of(y), idx, &ctx, &flat, &valid);
  cr_assert_eq(lm_x_vars_used(&g->x, flat), 2u, "flat index should use i1 only");
  char text[64];
  print_expr(g, flat, text, sizeof text);
  cr_assert_str_eq(text, "i1");
  lm_graph_free(g);
}

/* PPO's minibatch: rows (a*(off + i) + b) mod T*N of a trajectory [T, N, 4] flattened to
 * [T*N, 4]. Read through the views, the element is (row / N % T)*4N + (row % N)*4 + column:
 * three divisions per load, in every weight-gradient and forward kernel of the update. It is
 * row*4 + column: the constant factor 4 cancels ((4*row + c) / 4N = row / N for 0 <= c < 4),
 * row / N < T makes the % T vanish, and N*(row / N) + row % N = row (row % N being the
 * canonical form of (..) % T*N % N). */
static void ref_minibatch(const int64_t *i, const int64_t *s, int64_t *f, int *v) {
  /* syms: T, N, perm_a, perm_b, mb_off, M */
  int64_t row = (s[2] * (s[4] + i[0]) + s[3]) % (s[0] * s[1]);
  *f = row * 4 + i[1];
  *v = 1;
}

Test(simplify, a_shuffled_minibatch_of_a_flattened_trajectory_reads_row_times_4_plus_column) {
  lm_graph_t *g = lm_graph_new();
  lm_dim T = lm_sym(g, "T"), N = lm_sym(g, "N"), pa = lm_sym(g, "perm_a"), pb = lm_sym_min(g, "perm_b", 0);
  lm_dim off = lm_sym_min(g, "mb_off", 0), M = lm_sym(g, "M");
  lm_tensor x = input(g, "x", 3, (lm_dim[]){T, N, 4});
  lm_tensor flat = lm_reshape(x, 2, (lm_dim[]){lm_dim_mul(g, T, N), 4});
  lm_tensor mb = lm_slice(lm_affine_mod(flat, 0, pa, pb), 0, off, lm_dim_add(g, off, M));
  char text[512], valid[64];
  edge_index_text(mb, text, valid, sizeof text);
  cr_assert_eq(strchr(text, '/'), NULL, "a division is left in %s", text);
  cr_assert_eq(strcount(text, '%'), 1, "one modulo (the shuffle's) expected in %s", text);
  const int64_t bind[3][6] = {{128, 16, 5, 3, 0, 512}, {3, 7, 11, 20, 4, 9}, {2, 5, 1, 0, 3, 6}};
  for (int k = 0; k < 3; k++) cr_assert_eq(check_index(mb, bind[k], ref_minibatch), bind[k][5] * 4);
  /* a trajectory of scalars [T, N]: the row itself */
  lm_tensor r = input(g, "r", 2, (lm_dim[]){T, N});
  lm_tensor rmb = lm_slice(lm_affine_mod(lm_reshape(r, 1, (lm_dim[]){lm_dim_mul(g, T, N)}), 0, pa, pb), 0, off,
                           lm_dim_add(g, off, M));
  edge_index_text(rmb, text, valid, sizeof text);
  cr_assert_str_eq(text, "(i0*perm_a + perm_a*mb_off + perm_b)%(T*N)");
  lm_graph_free(g);
}

/* Random index expressions (sums, products by constants and symbols, floor divisions and
 * modulos by c or c*S, including c*y + r over c*S with a small r, the shapes the canonicaliser
 * folds) evaluate the same before and after lm_x_simplify, at random points of the loop
 * variables' ranges and random symbol values. */
static lm_expr random_index(lm_exprs *x, check_rng *r, int depth) {
  int pick = (int)(check_next(r) % (depth > 0 ? 9 : 3));
  switch (pick) {
  case 0: return lm_x_const(x, (int64_t)(check_next(r) % 9) - 3);
  case 1: return lm_x_var(x, (int)(check_next(r) % 3));
  case 2: return lm_x_sym(x, (int)(check_next(r) % 3));
  case 3: return lm_x_add(x, random_index(x, r, depth - 1), random_index(x, r, depth - 1));
  case 4: return lm_x_mul(x, lm_x_const(x, 1 + (int64_t)(check_next(r) % 5)), random_index(x, r, depth - 1));
  case 5: return lm_x_mul(x, lm_x_sym(x, (int)(check_next(r) % 3)), random_index(x, r, depth - 1));
  default: {
    int64_t c = 1 + (int64_t)(check_next(r) % 6);
    lm_expr d = lm_x_const(x, c);
    if (check_next(r) % 2) d = lm_x_mul(x, d, lm_x_sym(x, (int)(check_next(r) % 3)));
    lm_expr a = random_index(x, r, depth - 1);
    if (pick == 8) /* c*y + r with 0 <= r < c: loop variable 2 ranges over [0, 3) */
      a = lm_x_add(x, lm_x_mul(x, lm_x_const(x, c), a), check_next(r) % 2 ? lm_x_var(x, 2) : lm_x_const(x, c - 1));
    return check_next(r) % 2 ? lm_x_div(x, a, d) : lm_x_mod(x, a, d);
  }
  }
}

Test(simplify, random_index_expressions_keep_their_value) {
  lm_exprs x;
  lm_exprs_init(&x);
  for (int k = 0; k < 3; k++) cr_assert_eq(lm_x_symbol(&x, (const char *[]){"A", "B", "C"}[k], 1), k);
  lm_expr ext[3] = {lm_x_const(&x, 7), lm_x_sym(&x, 1), lm_x_const(&x, 3)};
  lm_xctx ctx = {.extent = ext, .nvars = 3};
  check_rng r = check_rng_new(20261130);
  int changed = 0;
  for (int n = 0; n < 4000; n++) {
    lm_expr e = random_index(&x, &r, 4), s = lm_x_simplify(&x, e, &ctx);
    cr_assert(s, "simplify failed");
    changed += s != e;
    for (int t = 0; t < 40; t++) {
      int64_t syms[3], vars[3];
      for (int k = 0; k < 3; k++) syms[k] = 1 + (int64_t)(check_next(&r) % 9);
      vars[0] = (int64_t)(check_next(&r) % 7);
      vars[1] = (int64_t)(check_next(&r) % (uint64_t)syms[1]);
      vars[2] = (int64_t)(check_next(&r) % 3);
      int64_t a = lm_x_eval(&x, e, vars, syms), b = lm_x_eval(&x, s, vars, syms);
      if (a != b) {
        lm_sb t1 = {0}, t2 = {0};
        lm_x_print(&x, e, &t1, "i");
        lm_x_print(&x, s, &t2, "i");
        cr_assert_fail("%s = %lld but its simplified form %s = %lld (A=%lld B=%lld C=%lld i0=%lld i1=%lld i2=%lld)",
                       t1.s, (long long)a, t2.s, (long long)b, (long long)syms[0], (long long)syms[1],
                       (long long)syms[2], (long long)vars[0], (long long)vars[1], (long long)vars[2]);
      }
    }
  }
  cr_assert_gt(changed, 1000, "only %d of 4000 expressions were rewritten", changed);
  lm_exprs_free(&x);
}

/* Coefficients over a constant divisor reduce: with i0 < 10 and i1 < 3, (i0 + 13 i1) % 12 is
 * i0 + i1 and (i0 + 13 i1) / 12 is i1 (the rows of a window view), but only where the reduced
 * remainder provably lies in [0, 12); otherwise the modulo stays. */
Test(simplify, coefficients_over_a_constant_divisor_reduce_when_the_remainder_fits) {
  lm_exprs x;
  lm_exprs_init(&x);
  lm_expr ext[2] = {lm_x_const(&x, 10), lm_x_const(&x, 3)};
  lm_xctx ctx = {.extent = ext, .nvars = 2};
  lm_expr i0 = lm_x_var(&x, 0), i1 = lm_x_var(&x, 1), c12 = lm_x_const(&x, 12);
  lm_expr e = lm_x_add(&x, i0, lm_x_mul(&x, lm_x_const(&x, 13), i1));
  cr_assert_eq(lm_x_simplify(&x, lm_x_mod(&x, e, c12), &ctx), lm_x_simplify(&x, lm_x_add(&x, i0, i1), &ctx));
  cr_assert_eq(lm_x_simplify(&x, lm_x_div(&x, e, c12), &ctx), i1);
  /* i0 + 11 i1 reaches 32: 11 i1 = 12 i1 - i1 gives i0 - i1, which can be negative: kept */
  lm_expr f = lm_x_add(&x, i0, lm_x_mul(&x, lm_x_const(&x, 11), i1)), s = lm_x_simplify(&x, lm_x_mod(&x, f, c12), &ctx);
  cr_assert_eq(x.nodes[s].op, LM_X_MOD);
  lm_exprs_free(&x);
}

/* A padded 3x3 window over a 10x10 image with 4 channels: row i0 + i2 - 1, column i1 + i3 - 1,
 * the guard 0 < i0 + i2 < 11 && 0 < i1 + i3 < 11. Where it holds the flat index is inside the
 * image, so its modulo by the image size and its division vanish; without the guard they stay.
 * Both forms agree at every point the guard admits. */
Test(simplify, a_guard_on_affine_terms_removes_the_modulo_it_makes_trivial) {
  lm_exprs x;
  lm_exprs_init(&x);
  lm_expr ext[5] = {lm_x_const(&x, 10), lm_x_const(&x, 10), lm_x_const(&x, 3), lm_x_const(&x, 3), lm_x_const(&x, 4)};
  lm_xctx ctx = {.extent = ext, .nvars = 5};
  lm_expr v[5];
  for (int i = 0; i < 5; i++) v[i] = lm_x_var(&x, i);
  lm_expr row = lm_x_add(&x, v[0], v[2]), col = lm_x_add(&x, v[1], v[3]);
  lm_expr flat = lm_x_add(&x, lm_x_add(&x, lm_x_mul(&x, row, lm_x_const(&x, 40)), lm_x_mul(&x, col, lm_x_const(&x, 4))),
                          lm_x_add(&x, v[4], lm_x_const(&x, -44)));
  lm_expr c400 = lm_x_const(&x, 400), c0 = lm_x_const(&x, 0), c11 = lm_x_const(&x, 11);
  lm_expr e = lm_x_add(&x, lm_x_mod(&x, flat, c400), lm_x_mul(&x, lm_x_div(&x, flat, c400), lm_x_const(&x, 1000)));
  lm_expr guard = lm_x_and(&x, lm_x_and(&x, lm_x_lt(&x, c0, row), lm_x_lt(&x, row, c11)),
                           lm_x_and(&x, lm_x_lt(&x, c0, col), lm_x_lt(&x, col, c11)));
  lm_expr plain = lm_x_simplify(&x, e, &ctx), guarded = lm_x_simplify_guarded(&x, e, guard, &ctx);
  cr_assert_eq(guarded, lm_x_simplify(&x, flat, &ctx), "the guarded index keeps a division or modulo");
  cr_assert_neq(plain, guarded, "without the guard the modulo must stay");
  int64_t at[5];
  for (at[0] = 0; at[0] < 10; at[0]++)
    for (at[1] = 0; at[1] < 10; at[1]++)
      for (at[2] = 0; at[2] < 3; at[2]++)
        for (at[3] = 0; at[3] < 3; at[3]++)
          for (at[4] = 0; at[4] < 4; at[4]++)
            if (lm_x_eval(&x, guard, at, NULL))
              cr_assert_eq(lm_x_eval(&x, guarded, at, NULL), lm_x_eval(&x, e, at, NULL));
  /* a one-sided bound proves nothing here: kept */
  cr_assert_eq(lm_x_simplify_guarded(&x, e, lm_x_lt(&x, c0, row), &ctx), plain);
  lm_exprs_free(&x);
}

/* A padded 10x10 map's cell (i0 - 1, i1 - 1), channel i2, read back through the map's flat index
 * 40*i0 + 4*i1 + i2 - 44 (MinAtar's observation built from its state, inside its conv's pad):
 * the guard 0 < i1 < 11 puts the other terms 4*i1 + i2 - 44 in [-40, -1], one band of 40, so
 * / 80 is (i0 - 1) / 2 and % 80 is 40*((i0 - 1) % 2) + 4*i1 + i2 - 4: no division of the whole
 * sum, and the same values at every point the guard admits. */
Test(simplify, other_terms_within_one_band_of_a_coefficient_leave_its_variable_alone_divided) {
  lm_exprs x;
  lm_exprs_init(&x);
  lm_expr ext[3] = {lm_x_const(&x, 12), lm_x_const(&x, 12), lm_x_const(&x, 4)};
  lm_xctx ctx = {.extent = ext, .nvars = 3};
  lm_expr v[3];
  for (int i = 0; i < 3; i++) v[i] = lm_x_var(&x, i);
  lm_expr flat = lm_x_add(&x, lm_x_add(&x, lm_x_mul(&x, v[0], lm_x_const(&x, 40)), lm_x_mul(&x, v[1], lm_x_const(&x, 4))),
                          lm_x_add(&x, v[2], lm_x_const(&x, -44)));
  lm_expr c0 = lm_x_const(&x, 0), c11 = lm_x_const(&x, 11);
  lm_expr guard = lm_x_and(&x, lm_x_lt(&x, c0, v[1]), lm_x_lt(&x, v[1], c11));
  lm_expr im1 = lm_x_add(&x, v[0], lm_x_const(&x, -1));
  for (int op = 0; op < 2; op++) {
    lm_expr e = op ? lm_x_mod(&x, flat, lm_x_const(&x, 80)) : lm_x_div(&x, flat, lm_x_const(&x, 80));
    lm_expr guarded = lm_x_simplify_guarded(&x, e, guard, &ctx);
    if (!op) cr_assert_eq(guarded, lm_x_simplify(&x, lm_x_div(&x, im1, lm_x_const(&x, 2)), &ctx), "/ 80 is not (i0 - 1) / 2");
    cr_assert_eq(lm_x_divmods(&x, guarded, 1, NULL, NULL) + lm_x_divmods(&x, guarded, 2, NULL, NULL), 0,
                 "%s: i1 or i2 still divided", op ? "% 80" : "/ 80");
    int64_t at[3];
    for (at[0] = 0; at[0] < 12; at[0]++)
      for (at[1] = 0; at[1] < 12; at[1]++)
        for (at[2] = 0; at[2] < 4; at[2]++)
          if (lm_x_eval(&x, guard, at, NULL))
            cr_assert_eq(lm_x_eval(&x, guarded, at, NULL), lm_x_eval(&x, e, at, NULL), "%s at %lld %lld %lld",
                         op ? "% 80" : "/ 80", (long long)at[0], (long long)at[1], (long long)at[2]);
  }
  /* without the guard 4*i1 + i2 - 44 spans [-44, 3]: two bands, the division stays on the sum */
  lm_expr plain = lm_x_simplify(&x, lm_x_div(&x, flat, lm_x_const(&x, 80)), &ctx);
  cr_assert_gt(lm_x_divmods(&x, plain, 1, NULL, NULL), 0);
  lm_exprs_free(&x);
}

/* The permute+reshape index (k%2)*3 + k/2 has two floor atoms whose order in the canonical
 * sum must not depend on what else the graph's arena interned first. */
static void transpose_flatten_text(int pollute, char *out, size_t cap) {
  lm_graph_t *g = lm_graph_new();
  lm_expr k = lm_x_var(&g->x, 0), two = lm_x_const(&g->x, 2);
  if (pollute == 1) lm_x_div(&g->x, k, two); /* intern one floor atom before the other */
  if (pollute == 2) lm_x_mod(&g->x, k, two);
  lm_x_add(&g->x, lm_x_const(&g->x, 77), lm_x_var(&g->x, 3));
  lm_tensor x = input(g, "x", 2, (lm_dim[]){2, 3});
  lm_tensor y = lm_reshape(lm_permute(x, (int[]){1, 0}), 1, (lm_dim[]){6});
  char valid[64];
  edge_index_text(y, out, valid, cap);
  lm_graph_free(g);
}

Test(simplify, canonical_index_prints_identically_in_two_graphs) {
  char a[256], b[256], c[256];
  transpose_flatten_text(0, a, sizeof a);
  transpose_flatten_text(1, b, sizeof b);
  transpose_flatten_text(2, c, sizeof c);
  cr_assert_str_eq(a, b, "interning order changed the canonical form: '%s' vs '%s'", a, b);
  cr_assert_str_eq(a, c, "interning order changed the canonical form: '%s' vs '%s'", a, c);
}

/* ---------------------------------------------------------------- validation */

Test(validate, accepts_a_graph_using_every_op) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = input(g, "x", 2, (lm_dim[]){N, 4});
  lm_tensor r = lm_rand(g, 2, (lm_dim[]){N, 4});
  lm_tensor y = lm_add(lm_mul(lm_log2(x), lm_exp2(r)), lm_mod(lm_sin(x), lm_sqrt(lm_recip(r))));
  y = lm_less_than(lm_contiguous(y), x);
  cr_assert_eq(lm_output(lm_max_reduce(lm_sum_reduce(y, 1), 0), "y"), LM_OK, "%s", last());
  expect_valid(g);
  lm_graph_free(g);
}

Test(validate, reports_elementwise_source_shape_mismatch_naming_the_node) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input a data [4]\n%2 = input b data [5]\n%3 = add %1 %2\n");
  expect_invalid(g, "node %3 (add)", "[4] and [5]");
  lm_graph_free(g);
}

Test(validate, reports_node_shape_that_disagrees_with_its_source) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_sin(input(g, "x", 1, (lm_dim[]){4}));
  g->nodes[y.node].shape.dim[0] = lm_x_const(&g->x, 5);
  expect_invalid(g, "node %2 (sin)", "[5]");
  lm_graph_free(g);
}

Test(validate, reports_a_cycle_described_by_parsed_text) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [2]\n%2 = add %1 %3\n%3 = sin %2\n");
  expect_invalid(g, "cycle", "node %");
  lm_graph_free(g);
}

Test(validate, reports_reduce_axis_out_of_range) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [4,4]\n%2 = sum_reduce %1 axis=2\n");
  expect_invalid(g, "node %2 (sum_reduce)", "axis 2");
  lm_graph_free(g);
}

Test(validate, reports_view_axis_out_of_range) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [4]\n%2 = sin %1|slice 1 0 1\n");
  expect_invalid(g, "node %2 (sin)", "axis 1");
  lm_graph_free(g);
}

Test(validate, reports_dangling_source_node_and_view) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_sin(input(g, "x", 1, (lm_dim[]){4}));
  g->nodes[y.node].src[0].node = 99;
  expect_invalid(g, "node %2 (sin)", "node %99");
  g->nodes[y.node].src[0] = (lm_edge){1, 42};
  expect_invalid(g, "node %2 (sin)", "view 42");
  lm_graph_free(g);
}

Test(validate, reports_unknown_op_and_wrong_arity) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_sin(input(g, "x", 1, (lm_dim[]){4}));
  g->nodes[y.node].nsrc = 2;
  expect_invalid(g, "node %2 (sin)", "2 sources");
  g->nodes[y.node].op = 200;
  expect_invalid(g, "node %2", "unknown op 200");
  lm_graph_free(g);
}

Test(validate, reports_bad_permute) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [2,3]\n%2 = sin %1|permute 0 0\n");
  expect_invalid(g, "node %2 (sin)", "permutation");
  lm_graph_free(g);
  g = parse_ok("lumen-graph 1\n%1 = input x data [2,3]\n%2 = sin %1|permute 1 0 2\n");
  expect_invalid(g, "node %2 (sin)", "3 axes");
  lm_graph_free(g);
}

Test(validate, reports_reshape_that_changes_the_element_count) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [2,3]\n%2 = sin %1|reshape [5]\n");
  expect_invalid(g, "node %2 (sin)", "element counts");
  lm_graph_free(g);
}

Test(validate, reports_slice_provably_outside_its_axis) {
  lm_graph_t *g = parse_ok("lumen-graph 1\nsym N 1\n%1 = input x data [N]\n%2 = sin %1|slice 0 0 N+1\n");
  expect_invalid(g, "node %2 (sin)", "beyond");
  lm_graph_free(g);
  g = parse_ok("lumen-graph 1\n%1 = input x data [8]\n%2 = sin %1|slice 0 5 3\n");
  expect_invalid(g, "node %2 (sin)", "after end");
  lm_graph_free(g);
}

Test(validate, reports_a_view_chain_built_on_another_nodes_shape) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = input(g, "a", 2, (lm_dim[]){4, 6});
  lm_tensor b = input(g, "b", 1, (lm_dim[]){5});
  lm_tensor t = lm_slice(a, 1, 0, 3);
  lm_tensor y = lm_sin(b);
  g->nodes[y.node].src[0].view = t.view; /* a chain made for a [4,6] node, read on a [5] node */
  expect_invalid(g, "node %3 (sin)", "view");
  lm_graph_free(g);
}

Test(validate, reports_a_view_that_records_the_wrong_shape) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor t = lm_expand(input(g, "a", 1, (lm_dim[]){4}), 0, 3);
  lm_tensor y = lm_sin(t);
  g->views[t.view].shape.dim[0] = lm_x_const(&g->x, 7);
  g->nodes[y.node].shape.dim[0] = lm_x_const(&g->x, 7);
  expect_invalid(g, "node %2 (sin)", "records shape [7,4]");
  lm_graph_free(g);
}

Test(validate, reports_dimension_using_an_undeclared_symbol) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 1, (lm_dim[]){4});
  g->nodes[x.node].shape.dim[0] = lm_x_sym(&g->x, 7);
  expect_invalid(g, "node %1 (input 'x')", "dimension 0");
  lm_graph_free(g);
}

Test(validate, reports_input_whose_back_reference_is_wrong) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 1, (lm_dim[]){4});
  input(g, "z", 1, (lm_dim[]){4});
  g->nodes[x.node].input = 1;
  expect_invalid(g, "node %1", "points to node %2");
  lm_graph_free(g);
}

Test(validate, reports_constant_with_nonzero_rank) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_const(g, 1.5f);
  g->nodes[c.node].shape = (lm_shape){.rank = 1, .dim = {lm_x_const(&g->x, 2)}};
  expect_invalid(g, "node %1 (const)", "rank 0");
  lm_graph_free(g);
}

Test(validate, reports_assign_to_a_data_input) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [3]\n%2 = sin %1\nassign %1 %2\n");
  expect_invalid(g, "node %1 (input 'x')", "data");
  lm_graph_free(g);
}

Test(validate, reports_assign_to_a_computed_node_or_twice_or_with_another_shape) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input s state [3]\n%2 = sin %1\nassign %2 %1\n");
  expect_invalid(g, "node %2 (sin)", "only state and parameter");
  lm_graph_free(g);
  g = parse_ok("lumen-graph 1\n%1 = input s state [3]\n%2 = sin %1\nassign %1 %2\nassign %1 %1\n");
  expect_invalid(g, "node %1 (input 's')", "twice");
  lm_graph_free(g);
  g = parse_ok("lumen-graph 1\n%1 = input w param [3]\n%2 = sin %1|expand 0 2\nassign %1 %2\n");
  expect_invalid(g, "node %1 (input 'w')", "shape [3]");
  lm_graph_free(g);
}

Test(validate, reports_duplicate_input_and_output_names) {
  lm_graph_t *g = parse_ok("lumen-graph 1\n%1 = input x data [3]\n%2 = input x data [3]\n");
  expect_invalid(g, "node %2 (input 'x')", "already used by node %1");
  lm_graph_free(g);
  g = parse_ok("lumen-graph 1\n%1 = input x data [3]\n%2 = sin %1\noutput y %2\noutput y %1\noutput x %2\n");
  expect_invalid(g, "output '", "already used by");
  cr_assert(strstr(last(), "%1") && strstr(last(), "%2"), "message should name both nodes: %s", last());
  lm_graph_free(g);
}

Test(validate, construction_errors_are_sticky_and_reported) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = input(g, "a", 1, (lm_dim[]){3});
  lm_tensor b = input(g, "b", 1, (lm_dim[]){4});
  lm_tensor c = lm_add(a, b);
  cr_assert(!lm_tensor_ok(c));
  cr_assert(!lm_tensor_ok(lm_sin(a)), "a graph with an error builds nothing more");
  cr_assert(!lm_tensor_ok(lm_input(g, "z", LM_ROLE_DATA, 0, NULL)));
  expect_invalid(g, "do not broadcast", "[3] and [4]");
  lm_graph_free(g);
}

Test(validate, construction_out_of_memory_is_reported_as_nomem) {
  lm_graph_t *g = lm_graph_new();
  lm_alloc_fail_after(1);
  int built = 0;
  while (built < 1000 && lm_tensor_ok(lm_const(g, 1.0f))) built++;
  lm_alloc_fail_after(0);
  cr_assert_lt(built, 1000, "the injected failure never hit");
  cr_assert_eq(lm_graph_validate(g), LM_ERR_NOMEM, "%s", last());
  lm_graph_free(g);
}

Test(validate, binary_op_broadcasts_a_scalar_to_rank_two) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor y = lm_add(input(g, "x", 2, (lm_dim[]){N, 4}), lm_const(g, 0.5f));
  cr_assert(lm_tensor_ok(y), "%s", g->errmsg ? g->errmsg : "?");
  expect_shape(y, "[N,4]");
  expect_valid(g); /* both sources must be seen as [N,4] */
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- concrete bindings */

Test(bindings, accept_values_that_fit) {
  lm_graph_t *g = parse_ok("lumen-graph 1\nsym N 1\nsym K 0\n%1 = input obs data [N,4]\n"
                           "%2 = sin %1|slice 0 K N|pad 1 K 1|affine_mod 0 3 K\n");
  expect_valid(g);
  int64_t v[2] = {5, 2};
  uint8_t bound[2] = {1, 1};
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_OK, "%s", last());
  lm_graph_free(g);
}

Test(bindings, report_an_unbound_symbol_naming_the_input) {
  lm_graph_t *g = parse_ok("lumen-graph 1\nsym T 1\nsym N 1\n%1 = input obs data [N,4]\n%2 = sin %1\n");
  int64_t v[2] = {3, 0};
  uint8_t bound[2] = {1, 0};
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_ERR_INVALID);
  cr_assert_str_eq(last(), "node %1 (input 'obs'): symbol N is not bound");
  lm_graph_free(g);
}

Test(bindings, report_a_slice_outside_its_axis_under_concrete_values) {
  lm_graph_t *g = parse_ok("lumen-graph 1\nsym N 1\nsym M 1\n%1 = input x data [N]\n%2 = sin %1|slice 0 0 M\n");
  expect_valid(g); /* M <= N cannot be decided symbolically */
  int64_t v[2] = {3, 5};
  uint8_t bound[2] = {1, 1};
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_ERR_INVALID);
  cr_assert(strstr(last(), "node %2 (sin)") && strstr(last(), "[0, 5)"), "%s", last());
  v[1] = 3;
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_OK, "%s", last());
  lm_graph_free(g);
}

Test(bindings, report_values_below_the_least_negative_dims_pads_and_empty_affine_axes) {
  lm_graph_t *g = parse_ok("lumen-graph 1\nsym N 1\nsym P -5\nsym M 0\n%1 = input x data [N]\n"
                           "%2 = sin %1|pad 0 P 0\n%3 = input m data [M]\n%4 = sin %3|affine_mod 0 1 0\n"
                           "%5 = input q data [N+P]\n");
  expect_valid(g);
  int64_t v[3] = {0, 1, 1};
  uint8_t bound[3] = {1, 1, 1};
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_ERR_INVALID);
  cr_assert(strstr(last(), "below its least value 1"), "%s", last());
  v[0] = 4, v[1] = -2;
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_ERR_INVALID);
  cr_assert(strstr(last(), "node %2 (sin)") && strstr(last(), "pads -2"), "%s", last());
  v[1] = 1, v[2] = 0;
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_ERR_INVALID);
  cr_assert(strstr(last(), "node %4 (sin)") && strstr(last(), "empty"), "%s", last());
  v[1] = -5, v[2] = 2;
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_ERR_INVALID);
  cr_assert(strstr(last(), "node %2 (sin)"), "%s", last()); /* pad -5 comes first */
  v[0] = 4, v[1] = 0;
  cr_assert_eq(lm_graph_check_bindings(g, v, bound), LM_OK, "%s", last());
  lm_graph_free(g);
  g = parse_ok("lumen-graph 1\nsym N 1\nsym P -5\n%1 = input q data [N+P]\n");
  int64_t w[2] = {2, -4};
  uint8_t wb[2] = {1, 1};
  cr_assert_eq(lm_graph_check_bindings(g, w, wb), LM_ERR_INVALID);
  cr_assert(strstr(last(), "node %1 (input 'q')") && strstr(last(), "is -2"), "%s", last());
  lm_graph_free(g);
}

/* A program checks its bindings again where a run follows a rebinding, over only what the
 * changed symbol reaches, each view once however many nodes read through it, without walking
 * the expressions again for their form (compiler/validate.c): a window two nodes read, moved
 * past its input's end, is refused naming it, and moved back it runs. */
Test(bindings, a_rebound_window_that_two_nodes_read_is_checked_again_at_each_run) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N"), K = lm_sym_min(g, "K", 0), M = lm_sym(g, "M");
  lm_tensor w = lm_slice(input(g, "x", 1, (lm_dim[]){N}), 0, K, lm_dim_add(g, K, M));
  cr_assert_eq(lm_output(lm_sin(w), "a"), LM_OK, "%s", last());
  cr_assert_eq(lm_output(lm_exp2(w), "b"), LM_OK, "%s", last());
  lm_backend_t *b = lm_backend_new("ref");
  cr_assert(b, "%s", last());
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", last());
  float x[10] = {0};
  cr_assert_eq(lm_program_bind(p, "N", 10), LM_OK);
  cr_assert_eq(lm_program_bind(p, "M", 4), LM_OK);
  cr_assert_eq(lm_program_write(p, "x", x, 10), LM_OK, "%s", last());
  static const struct { int64_t k; int ok; } runs[] = {{0, 1}, {6, 1}, {7, 0}, {2, 1}, {9, 0}, {6, 1}};
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    cr_assert_eq(lm_program_bind(p, "K", runs[i].k), LM_OK);
    lm_status st = lm_program_run(p);
    if (runs[i].ok) cr_assert_eq(st, LM_OK, "K = %lld: %s", (long long)runs[i].k, last());
    else {
      char want[64];
      snprintf(want, sizeof want, "[%lld, %lld) is not within", (long long)runs[i].k, (long long)runs[i].k + 4);
      cr_assert_eq(st, LM_ERR_INVALID, "K = %lld ran", (long long)runs[i].k);
      cr_assert(strstr(last(), want), "K = %lld: %s", (long long)runs[i].k, last());
    }
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- text form */

static lm_graph_t *every_op_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N"), T = lm_sym(g, "T"), B = lm_sym_min(g, "B", 0);
  lm_tensor obs = input(g, "obs", 2, (lm_dim[]){N, 4});
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 2, (lm_dim[]){4, 3});
  lm_tensor st = lm_input(g, "env state", LM_ROLE_STATE, 2, (lm_dim[]){N, T});
  lm_tensor r = lm_rand_stream(g, 7, 2, (lm_dim[]){N, 4});
  lm_tensor c = lm_expand(lm_expand(lm_const(g, 0.1f), 0, 4), 0, N); /* [N,4] */
  lm_tensor h = lm_add(obs, c);
  h = lm_mul(h, lm_log2(lm_exp2(r)));
  h = lm_mod(lm_sin(h), lm_sqrt(lm_recip(r)));
  h = lm_less_than(h, lm_contiguous(r));
  /* matmul [N,4] x [4,3]: expand both to [N,4,3], multiply, sum axis 1 */
  lm_tensor mm = lm_sum_reduce(lm_mul(lm_expand(h, 2, 3), lm_expand(w, 0, N)), 1);
  lm_tensor tr = lm_permute(mm, (int[]){1, 0});
  lm_tensor flat = lm_reshape(st, 1, (lm_dim[]){lm_dim_mul(g, N, T)});
  lm_tensor shuf = lm_reshape(lm_affine_mod(flat, 0, 5, B), 2, (lm_dim[]){N, T});
  lm_tensor sl = lm_pad(lm_slice(shuf, 1, 1, T), 1, 0, 1);
  lm_tensor nst = lm_max_reduce(lm_expand(sl, 0, 2), 0);
  cr_assert(lm_tensor_ok(nst), "%s", g->errmsg ? g->errmsg : "?");
  cr_assert_eq(lm_output(tr, "q"), LM_OK, "%s", last());
  cr_assert_eq(lm_output(lm_sum_reduce(nst, -1), "\"odd\" name\n"), LM_OK, "%s", last());
  cr_assert_eq(lm_assign(st, nst), LM_OK, "%s", last());
  expect_valid(g);
  return g;
}

Test(text, dump_parse_dump_is_identical_for_every_op_view_symbol_assign_and_output) {
  lm_graph_t *g = every_op_graph();
  char *d1 = lm_graph_dump(g);
  cr_assert_not_null(d1);
  const char *must[] = {"lumen-graph 1\n", "sym B 0\n", "input obs data [N,4]", "param", "state", "rand stream=7",
                        "const 0.1\n", "|permute 1 0", "|expand ", "|slice 1 1 T", "|pad 1 0 1", "|reshape [N*T]",
                        "|affine_mod 0 5 B", "axis=1", "output q ", "\"\\\"odd\\\" name\\n\"", "assign %3 ",
                        "\"env state\""};
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
    cr_assert(strstr(d1, must[i]), "dump lacks '%s':\n%s", must[i], d1);
  for (int op = 0; op < LM_OP_COUNT; op++) {
    char want[32];
    snprintf(want, sizeof want, "= %s ", lm_op_name((lm_op)op));
    cr_assert(strstr(d1, want), "dump lacks op %s:\n%s", lm_op_name((lm_op)op), d1);
  }
  lm_graph_t *h = parse_ok(d1);
  expect_valid(h);
  char *d2 = lm_graph_dump(h);
  cr_assert_str_eq(d2, d1);
  cr_assert_eq(h->nnodes, g->nnodes);
  cr_assert_eq(h->next_stream, g->next_stream);
  free(d1);
  free(d2);
  lm_graph_free(g);
  lm_graph_free(h);
}

Test(text, constants_round_trip_bit_exactly) {
  const uint32_t bits[] = {0x3dcccccdu /* 0.1f */, 0x80000000u /* -0 */, 0x00000000u, 0x7f800000u, 0xff800000u,
                           0x7fc00000u, 0x7fc00001u, 0xffc00000u, 0x7f800001u, 0x00000001u /* least denormal */,
                           0x007fffffu, 0x7f7fffffu /* FLT_MAX */, 0x3eaaaaabu /* 1/3 */, 0xc2f6e979u, 0x4b800001u};
  lm_graph_t *g = lm_graph_new();
  for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
    float v;
    memcpy(&v, &bits[i], sizeof v);
    lm_const(g, v);
  }
  char *d = lm_graph_dump(g);
  cr_assert(strstr(d, "= const -0\n") && strstr(d, "= const nan\n") && strstr(d, "= const nan:0x7fc00001\n") &&
                strstr(d, "= const -inf\n"),
            "%s", d);
  lm_graph_t *h = parse_ok(d);
  for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
    uint32_t b;
    memcpy(&b, &h->nodes[i + 1].value, sizeof b);
    cr_assert_eq(b, bits[i], "constant %zu: 0x%08x read back as 0x%08x", i, bits[i], b);
  }
  free(d);
  lm_graph_free(g);
  lm_graph_free(h);
}

Test(text, parse_maps_arbitrary_ids_in_definition_order_and_resolves_forward_references) {
  lm_graph_t *g = parse_ok("# a hand-written graph\n"
                           "\n"
                           "  lumen-graph 1   # header\n"
                           "output y %900|permute 1 0\n"
                           "%900 = mul %42 %7|expand 1 3\n"
                           "sym N 2\n"
                           "%42 = input \"x y\" data [N,3]\n"
                           "%7 = input w param [N]\n"
                           "assign %7 %5 | slice 0 0 N\n"
                           "%5 = exp2 %7|pad 0 1 1\n");
  expect_valid(g);
  cr_assert_eq(lm_graph_node_count(g), 4);
  char *d = lm_graph_dump(g);
  cr_assert_str_eq(d, "lumen-graph 1\n"
                      "sym N 2\n"
                      "%1 = mul %2 %3|expand 1 3\n"
                      "%2 = input \"x y\" data [N,3]\n"
                      "%3 = input w param [N]\n"
                      "%4 = exp2 %3|pad 0 1 1\n"
                      "output y %1|permute 1 0\n"
                      "assign %3 %4|slice 0 0 N\n");
  const lm_shape *s = &g->nodes[4].shape;
  cr_assert_eq(s->rank, 1);
  char t[64];
  print_expr(g, s->dim[0], t, sizeof t);
  cr_assert_str_eq(t, "N + 2");
  free(d);
  lm_graph_free(g);
}

Test(text, construction_error_round_trips_and_is_reported_after_parse) {
  lm_graph_t *g = lm_graph_new();
  lm_add(input(g, "a", 1, (lm_dim[]){3}), input(g, "b", 1, (lm_dim[]){4}));
  char *d = lm_graph_dump(g);
  cr_assert(strstr(d, "error invalid \"add: shapes [3] and [4] do not broadcast"), "%s", d);
  lm_graph_t *h = parse_ok(d);
  expect_invalid(h, "do not broadcast", NULL);
  char *d2 = lm_graph_dump(h);
  cr_assert_str_eq(d2, d);
  free(d);
  free(d2);
  lm_graph_free(g);
  lm_graph_free(h);
}

Test(text, dims_read_left_associative_with_floor_division_and_negative_literals) {
  lm_graph_t *g = parse_ok("lumen-graph 1\nsym N 1\n%1 = input x data [N+3-2,7/2*2,-7%3,2*-3+10,N*6/4]\n");
  /* N*6/4 is (N*6)/4, kept as N*3/2 (the canonical form divides out gcd(6, 4)); N*(6/4) would be N */
  const char *want[] = {"N + 1", "6", "2", "4", "N*3/2"};
  for (int i = 0; i < 5; i++) {
    char t[64];
    print_expr(g, g->nodes[1].shape.dim[i], t, sizeof t);
    cr_assert_str_eq(t, want[i], "dimension %d", i);
  }
  lm_graph_free(g);
}

Test(text, dims_with_negative_terms_division_and_modulo_round_trip) {
  const char *text = "lumen-graph 1\nsym N 3\nsym K 0\n%1 = input x data [N*N-2*N+7,(N+K)/2,N%3,4]\n"
                     "%2 = sin %1|reshape [N*N-2*N+7,(N+K)/2,N%3*4]|slice 0 (-1)+N 2*N-2\n";
  lm_graph_t *g = parse_ok(text);
  char *d1 = lm_graph_dump(g);
  cr_assert(strstr(d1, "[N*(-2)+N*N+7,"), "%s", d1);
  lm_graph_t *h = parse_ok(d1);
  char *d2 = lm_graph_dump(h);
  cr_assert_str_eq(d2, d1);
  free(d1);
  free(d2);
  lm_graph_free(g);
  lm_graph_free(h);
}

typedef struct bad_text {
  const char *text, *want;
} bad_text;

Test(text, parse_rejects_malformed_text_with_line_numbered_messages) {
  const bad_text cases[] = {
      {"", "line 1: missing header"},
      {"\n# only a comment\n", "line 2: missing header"},
      {"%1 = const 1\n", "line 1: missing header"},
      {"lumen-graph 2\n", "line 1: unsupported version 2"},
      {"lumen-graph 1 x\n", "line 1: unexpected 'x'"},
      {"lumen-graph 1\nlumen-graph 1\n", "line 2: a second header"},
      {"lumen-graph 1\n%1 = frobnicate %2\n", "line 2: unknown op 'frobnicate'"},
      {"lumen-graph 1\n%1 = input x data [2]\n%2 = sin %9\n", "line 3: unknown node %9"},
      {"lumen-graph 1\n%1 = input x data [2]\n\n%1 = sin %1\n", "line 4: duplicate node id %1 (first defined on line 2)"},
      {"lumen-graph 1\n%1 = input x data [N]\n", "line 2: bad dimension: unknown symbol 'N'"},
      {"lumen-graph 1\n%1 = input x data [4,]\n", "line 2: bad dimension"},
      {"lumen-graph 1\n%1 = input x data [4\n", "line 2: bad dims"},
      {"lumen-graph 1\n%1 = input x data [1,1,1,1,1,1,1,1,1]\n", "line 2: bad dims: rank exceeds 8"},
      {"lumen-graph 1\n%1 = input x owner [2]\n", "line 2: bad role 'owner'"},
      {"lumen-graph 1\n%1 = const 1 2\n", "line 2: unexpected '2'"},
      {"lumen-graph 1\n%1 = const 1.5x\n", "line 2: bad constant '1.5x'"},
      {"lumen-graph 1\n%1 = const 1e99\n", "line 2: bad constant"},
      {"lumen-graph 1\n%1 = input x data [2]\n%2 = add %1\n", "line 3: add takes 2 sources"},
      {"lumen-graph 1\n%1 = input x data [2]\n%2 = sin %1|twist 3\n", "line 3: unknown view 'twist'"},
      {"lumen-graph 1\n%1 = input x data [2]\n%2 = sum_reduce %1 axis=x\n", "line 3: expected axis"},
      {"lumen-graph 1\n%1 = input \"x data [2]\n", "line 2: unterminated string"},
      {"lumen-graph 1\nsym N 1\nsym N 1\n", "line 3: symbol 'N' declared twice"},
      {"lumen-graph 1\n%0 = const 1\n", "line 2: node ids are positive"},
      {"lumen-graph 1\n%1 = input x state [2]\nassign %1|permute 0 %1\n", "line 3: an assign target"},
      {"lumen-graph 1\nfrob\n", "line 2: unknown statement 'frob'"},
      {"lumen-graph 1\n%1 = input x data [99999999999999999999]\n", "line 2: bad dimension: '99999999999999999999"},
      {"lumen-graph 1\nsym N 1\n%1 = input x data [((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((N))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))]\n",
       "line 3: dimension nests deeper"},
      {"lumen-graph 1\n%1 = rand [2]\n", "line 2: expected stream=N"},
      {"lumen-graph 1\nerror bogus\n", "line 2: bad error kind 'bogus'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    lm_clear_error();
    lm_graph_t *g = lm_graph_parse(cases[i].text);
    cr_expect_null(g, "case %zu parsed:\n%s", i, cases[i].text);
    cr_expect(strstr(last(), cases[i].want) == last(), "case %zu: message '%s' should start with '%s'", i, last(),
              cases[i].want);
    lm_graph_free(g);
  }
}

Test(text, parse_never_leaves_a_graph_after_an_out_of_memory) {
  lm_graph_t *ref = every_op_graph();
  char *d = lm_graph_dump(ref);
  int failures = 0;
  for (long n = 1; n < 400; n++) {
    lm_alloc_fail_after(n);
    lm_graph_t *g = lm_graph_parse(d);
    lm_alloc_fail_after(0);
    if (!g) {
      failures++;
      cr_assert(strstr(last(), "out of memory"), "after failing allocation %ld: %s", n, last());
      continue;
    }
    char *d2 = lm_graph_dump(g);
    cr_assert_str_eq(d2, d, "allocation %ld failed unnoticed", n);
    free(d2);
    lm_graph_free(g);
    break;
  }
  cr_assert_gt(failures, 10);
  free(d);
  lm_graph_free(ref);
}
