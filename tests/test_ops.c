/* Tests for the high-level op library (compiler/ops.c): every op of lumen/ops.h against a
 * closed-form double-precision reference computed here, on the "ref" backend through the
 * runtime API, with seeded random inputs away from zero and kinks, poisoned outputs and the
 * tolerance stated next to each check. Also: numpy broadcasting, operands seen through views,
 * symbolic dimensions rebound within one program, saturation at extreme inputs, and the
 * errors a bad shape leaves in the graph.
 *
 * Tolerances (u = 2^-24 ~ 6e-8, a float's half ulp): "exact" ops are compared with 0/0;
 * one rounding gets rtol 2u; each further rounding adds 2u. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lumen/ops.h"
#include "support/check.h"

#define U 5.9604644775390625e-8 /* 2^-24 */

typedef lm_tensor (*op1_fn)(lm_tensor);
typedef lm_tensor (*op2_fn)(lm_tensor, lm_tensor);
typedef double (*ref1_fn)(double);
typedef double (*ref2_fn)(double, double);
typedef void (*fill_fn)(check_rng *, float *, size_t);

static lm_tensor data(lm_graph_t *g, const char *name, int rank, const lm_dim *shape) {
  lm_tensor t = lm_input(g, name, LM_ROLE_DATA, rank, shape);
  cr_assert(lm_tensor_ok(t), "input %s: %s", name, lm_last_error());
  return t;
}

static void output(lm_tensor t, const char *name) {
  cr_assert(lm_output(t, name) == LM_OK, "output %s: %s", name, lm_last_error());
}

static size_t numel(int rank, const lm_dim *shape) {
  size_t n = 1;
  for (int i = 0; i < rank; i++) n *= (size_t)shape[i];
  return n;
}

static void expect_shape(lm_tensor t, int rank, const lm_dim *shape) {
  cr_assert(lm_tensor_ok(t), "tensor is invalid: %s", lm_last_error());
  cr_assert_eq(lm_rank(t), rank, "rank %d, want %d", lm_rank(t), rank);
  for (int i = 0; i < rank; i++)
    cr_assert_eq(lm_dim_of(t, i), shape[i], "axis %d has extent %lld, want %lld", i, (long long)lm_dim_of(t, i),
                 (long long)shape[i]);
}

/* Flat index into a source of shape s (rank r) of the output multi-index idx (rank ro),
 * with numpy broadcasting (leading axes missing, extent-1 axes stretched). */
static size_t bcast_flat(const size_t *idx, int ro, int r, const lm_dim *s) {
  size_t flat = 0;
  for (int i = 0; i < r; i++) {
    size_t k = s[i] == 1 ? 0 : idx[i + ro - r];
    flat = flat * (size_t)s[i] + k;
  }
  return flat;
}

static int next_idx(size_t *idx, int rank, const lm_dim *shape) {
  for (int i = rank - 1; i >= 0; i--) {
    if (++idx[i] < (size_t)shape[i]) return 1;
    idx[i] = 0;
  }
  return 0;
}

/* outer x n x inner decomposition of a shape around one axis */
static void split_axis(int rank, const lm_dim *shape, int axis, size_t *outer, size_t *n, size_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < axis; i++) *outer *= (size_t)shape[i];
  *n = (size_t)shape[axis];
  for (int i = axis + 1; i < rank; i++) *inner *= (size_t)shape[i];
}

/* ---------------------------------------------------------------- fills */

static void fill_pm3(check_rng *r, float *d, size_t n) { check_fill(r, d, n, -3, 3, 0.05); }
/* integers -2..2: ties are frequent, so comparisons meet equal operands */
static void fill_ties(check_rng *r, float *d, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = (float)((int)(check_next(r) % 5) - 2);
}

/* ---------------------------------------------------------------- drivers */

/* y = op(x) on a [5, 8] input against ref, inputs in [lo, hi) with |x| >= min_abs. */
static void unary_case(const char *what, op1_fn op, ref1_fn ref, double lo, double hi, double min_abs, double rtol,
                       double atol, uint64_t seed) {
  enum { R = 5, C = 8, N = R * C };
  lm_graph_t *g = lm_graph_new();
  output(op(data(g, "x", 2, (lm_dim[]){R, C})), "y");
  float xs[N], ys[N];
  double want[N];
  check_rng rng = check_rng_new(seed);
  check_fill(&rng, xs, N, lo, hi, min_abs);
  for (int i = 0; i < N; i++) want[i] = ref(xs[i]);
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, N}}, 1, (check_buf[]){{"y", ys, N}}, 1);
  check_close(what, ys, want, N, rtol, atol);
  lm_graph_free(g);
}

/* y = op(x) on the given values (edge cases). */
static void unary_values(const char *what, op1_fn op, const float *xs, const double *want, size_t n, double rtol,
                         double atol) {
  lm_graph_t *g = lm_graph_new();
  output(op(data(g, "x", 1, (lm_dim[]){(lm_dim)n})), "y");
  float ys[64];
  cr_assert(n <= 64);
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", (float *)xs, n}}, 1, (check_buf[]){{"y", ys, n}}, 1);
  check_close(what, ys, want, n, rtol, atol);
  lm_graph_free(g);
}

/* c = op(a, b) for shapes sa, sb that broadcast to so. */
static void binary_shapes(const char *what, op2_fn op, ref2_fn ref, fill_fn fill, int ra, const lm_dim *sa, int rb,
                          const lm_dim *sb, int ro, const lm_dim *so, double rtol, double atol, uint64_t seed) {
  size_t na = numel(ra, sa), nb = numel(rb, sb), no = numel(ro, so);
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = op(data(g, "a", ra, sa), data(g, "b", rb, sb));
  expect_shape(c, ro, so);
  output(c, "c");
  float as[64], bs[64], cs[64];
  double want[64];
  cr_assert(na <= 64 && nb <= 64 && no <= 64);
  check_rng rng = check_rng_new(seed);
  fill(&rng, as, na);
  fill(&rng, bs, nb);
  size_t idx[LM_MAX_RANK] = {0}, k = 0;
  do want[k++] = ref(as[bcast_flat(idx, ro, ra, sa)], bs[bcast_flat(idx, ro, rb, sb)]);
  while (next_idx(idx, ro, so));
  check_run_ref(g, NULL, 0, (check_buf[]){{"a", as, na}, {"b", bs, nb}}, 2, (check_buf[]){{"c", cs, no}}, 1);
  check_close(what, cs, want, no, rtol, atol);
  lm_graph_free(g);
}

/* Three layouts: equal shapes, [3,1] x [1,4], and rank mismatch both ways. */
static void binary_case(const char *what, op2_fn op, ref2_fn ref, fill_fn fill, double rtol, double atol,
                        uint64_t seed) {
  binary_shapes(what, op, ref, fill, 2, (lm_dim[]){3, 4}, 2, (lm_dim[]){3, 4}, 2, (lm_dim[]){3, 4}, rtol, atol,
                seed);
  binary_shapes(what, op, ref, fill, 2, (lm_dim[]){3, 1}, 2, (lm_dim[]){1, 4}, 2, (lm_dim[]){3, 4}, rtol, atol,
                seed + 1);
  binary_shapes(what, op, ref, fill, 3, (lm_dim[]){2, 3, 4}, 1, (lm_dim[]){4}, 3, (lm_dim[]){2, 3, 4}, rtol, atol,
                seed + 2);
  binary_shapes(what, op, ref, fill, 1, (lm_dim[]){4}, 3, (lm_dim[]){2, 3, 1}, 3, (lm_dim[]){2, 3, 4}, rtol, atol,
                seed + 3);
}

/* ---------------------------------------------------------------- constants and ranges */

Test(ops, full_fills_constant_and_symbolic_shapes) {
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "N");
  lm_tensor a = lm_full(g, 2.5f, 2, (lm_dim[]){3, 4}), b = lm_full(g, -0.75f, 2, (lm_dim[]){n, 2});
  expect_shape(a, 2, (lm_dim[]){3, 4});
  expect_shape(b, 2, (lm_dim[]){n, 2});
  output(a, "a");
  output(b, "b");
  float as[12], bs[6];
  double wa[12], wb[6];
  for (int i = 0; i < 12; i++) wa[i] = 2.5;
  for (int i = 0; i < 6; i++) wb[i] = -0.75;
  check_run_ref(g, (check_sym[]){{"N", 3}}, 1, NULL, 0, (check_buf[]){{"a", as, 12}, {"b", bs, 6}}, 2);
  check_close("full [3,4]", as, wa, 12, 0, 0); /* exact */
  check_close("full [N,2]", bs, wb, 6, 0, 0);
  lm_graph_free(g);
}

Test(ops, scalar_like_takes_the_shape_of_its_argument_including_symbols) {
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "N");
  lm_tensor x = data(g, "x", 2, (lm_dim[]){n, 3});
  lm_tensor s = lm_scalar_like(x, -1.25f);
  expect_shape(s, 2, (lm_dim[]){n, 3});
  output(s, "s");
  check_prog p = check_prog_new(g, "ref");
  for (int v = 2; v <= 4; v += 2) {
    float xs[12] = {0}, ss[12];
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = -1.25;
    check_prog_run(&p, (check_sym[]){{"N", v}}, 1, (check_buf[]){{"x", xs, (size_t)v * 3}}, 1,
                   (check_buf[]){{"s", ss, (size_t)v * 3}}, 1);
    check_close("scalar_like", ss, want, (size_t)v * 3, 0, 0); /* exact */
  }
  check_prog_free(&p);
  lm_graph_free(g);
}

Test(ops, arange_counts_from_zero_for_n_1_2_7_64_100_1000) {
  static const int sizes[] = {1, 2, 7, 64, 100, 1000};
  for (size_t k = 0; k < CHECK_COUNT(sizes); k++) {
    int n = sizes[k];
    lm_graph_t *g = lm_graph_new();
    lm_tensor r = lm_arange(g, n);
    expect_shape(r, 1, (lm_dim[]){n});
    output(r, "r");
    static float rs[1000];
    static double want[1000];
    for (int i = 0; i < n; i++) want[i] = i;
    check_run_ref(g, NULL, 0, NULL, 0, (check_buf[]){{"r", rs, (size_t)n}}, 1);
    check_close("arange", rs, want, (size_t)n, 0, 0); /* exact: sums of ones */
    lm_graph_free(g);
  }
}

Test(ops, arange_of_symbolic_n_follows_each_binding) {
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "N");
  lm_tensor r = lm_arange(g, n);
  expect_shape(r, 1, (lm_dim[]){n});
  output(r, "r");
  check_prog p = check_prog_new(g, "ref");
  static const int binds[] = {5, 9, 1};
  for (size_t k = 0; k < CHECK_COUNT(binds); k++) {
    float rs[9];
    double want[9];
    for (int i = 0; i < binds[k]; i++) want[i] = i;
    check_prog_run(&p, (check_sym[]){{"N", binds[k]}}, 1, NULL, 0, (check_buf[]){{"r", rs, (size_t)binds[k]}}, 1);
    check_close("arange(N)", rs, want, (size_t)binds[k], 0, 0);
  }
  check_prog_free(&p);
  lm_graph_free(g);
}

/* A constant n: one constant per binary digit and the additions, no reduction (an entry costs
 * log2 n additions wherever it is read); a symbolic n: one constant and one reduction. */
Test(ops, arange_costs_a_constant_and_an_addition_per_binary_digit_or_one_reduction) {
  lm_graph_t *g = lm_graph_new();
  cr_assert(lm_tensor_ok(lm_arange(g, 64)));
  cr_assert_eq(lm_graph_node_count(g), 6 + 5, "arange(64) made %zu nodes", lm_graph_node_count(g));
  lm_graph_free(g);
  g = lm_graph_new();
  cr_assert(lm_tensor_ok(lm_arange(g, lm_sym(g, "N"))));
  cr_assert_eq(lm_graph_node_count(g), 2, "arange(N) made %zu nodes; its mask should be views of one constant",
               lm_graph_node_count(g));
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- arithmetic */

static double r_neg(double x) { return -x; }
static double r_sub(double a, double b) { return (double)((float)a - (float)b); }
static double r_div(double a, double b) { return a / b; }
static double r_square(double x) { return x * x; }
static double r_add_scalar(double x) { return x + 0.375; }
static double r_mul_scalar(double x) { return x * -1.5; }
static lm_tensor add_scalar_0375(lm_tensor x) { return lm_add_scalar(x, 0.375f); }
static lm_tensor mul_scalar_m15(lm_tensor x) { return lm_mul_scalar(x, -1.5f); }

Test(ops, neg_is_exact) { unary_case("neg", lm_neg, r_neg, -5, 5, 0.01, 0, 0, 1); }

Test(ops, sub_is_exact_and_broadcasts) {
  /* the reference rounds the double difference to float: sub must round the same way */
  binary_case("sub", lm_sub, r_sub, fill_pm3, 0, 0, 2);
}

Test(ops, div_is_within_two_roundings_and_broadcasts) {
  binary_case("div", lm_div, r_div, fill_pm3, 4 * U, 0, 3); /* a * recip(b): 2 roundings */
}

Test(ops, add_scalar_rounds_once) { unary_case("add_scalar", add_scalar_0375, r_add_scalar, -5, 5, 0.6, 2 * U, 0, 4); }
Test(ops, mul_scalar_is_exact_for_a_short_constant) {
  unary_case("mul_scalar", mul_scalar_m15, r_mul_scalar, -5, 5, 0.01, 2 * U, 0, 5);
}
Test(ops, square_rounds_once) { unary_case("square", lm_square, r_square, -5, 5, 0.01, 2 * U, 0, 6); }

static int pow_n;
static lm_tensor pow_op(lm_tensor x) { return lm_pow_int(x, pow_n); }
static double pow_ref(double x) { return pow(x, pow_n); }

Test(ops, pow_int_matches_pow_for_positive_negative_and_zero_exponents) {
  static const int exps[] = {0, 1, 2, 3, 5, 7, 8, -1, -2, -3, -6};
  for (size_t k = 0; k < CHECK_COUNT(exps); k++) {
    pow_n = exps[k];
    char what[32];
    snprintf(what, sizeof what, "pow_int(x, %d)", pow_n);
    /* repeated squaring: at most 2*log2|n| + 1 roundings (plus recip), each relative error
     * doubling through later squarings: bound 2u * (|n| + 1) */
    double rtol = 2 * U * (abs(pow_n) + 1);
    unary_case(what, pow_op, pow_ref, -2, 2, 0.5, rtol, 0, 10 + k);
  }
}

static double r_abs(double x) { return fabs(x); }
static double r_sign(double x) { return (x > 0) - (x < 0); }

Test(ops, abs_is_exact_including_infinities) {
  unary_case("abs", lm_abs, r_abs, -5, 5, 0.01, 0, 0, 20);
  static const float xs[] = {-INFINITY, INFINITY, -0.0f, 3e38f, -3e38f};
  static const double want[] = {INFINITY, INFINITY, 0, 3e38f, 3e38f};
  unary_values("abs edges", lm_abs, xs, want, 5, 0, 0);
}

Test(ops, sign_is_minus_one_zero_or_one) {
  unary_case("sign", lm_sign, r_sign, -5, 5, 0.01, 0, 0, 21);
  static const float xs[] = {0.0f, -0.0f, 1e-30f, -1e-30f, INFINITY, -INFINITY};
  static const double want[] = {0, 0, 1, -1, 1, -1};
  unary_values("sign edges", lm_sign, xs, want, 6, 0, 0);
}

Test(ops, floor_is_exact_for_negative_fractions_and_integers) {
  unary_case("floor", lm_floor, floor, -50, 50, 0.01, 0, 0, 22);
  static const float xs[] = {-0.5f, -2.0f, 2.0f, -1e-7f, 0.99999994f, -0.99999994f, 8388607.5f, -8388607.5f, 1e9f, -1e9f};
  double want[10];
  for (int i = 0; i < 10; i++) want[i] = floor(xs[i]);
  unary_values("floor edges", lm_floor, xs, want, 10, 0, 0);
}

static double r_round(double x) { return round(x); } /* C round: half away from zero */

Test(ops, round_is_half_away_from_zero_and_exact_next_to_halves) {
  unary_case("round", lm_round, r_round, -50, 50, 0.01, 0, 0, 23);
  static const float xs[] = {0.5f, -0.5f, 2.5f, -2.5f, 1.5f, 0.49999997f, -0.49999997f, 1.4999999f, 8388607.5f, -3.0f};
  double want[10];
  for (int i = 0; i < 10; i++) want[i] = round(xs[i]);
  unary_values("round edges", lm_round, xs, want, 10, 0, 0);
}

/* ---------------------------------------------------------------- transcendental */

static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x > 0 ? x : 0; }

Test(ops, exp_matches_libm_within_argument_rounding) {
  /* x*log2(e) is rounded: relative error <= 1.25 u (|x| + 1) (ops.c): 14u at |x| <= 10,
   * 101u at |x| <= 80 */
  unary_case("exp", lm_exp, exp, -10, 10, 0.01, 16 * U, 0, 30);
  unary_case("exp (large)", lm_exp, exp, -80, 80, 1, 104 * U, 0, 31);
}

Test(ops, log_matches_libm_within_3_ulp_away_from_one) {
  /* log2f * rounded ln2: three roundings; inputs away from 1, where log -> 0 */
  unary_case("log (above 1)", lm_log, log, 1.2, 1000, 0, 6 * U, 0, 32);
  unary_case("log (below 1)", lm_log, log, 1e-3, 0.8, 0, 6 * U, 0, 33);
}

Test(ops, cos_absolute_error_is_below_1e6_within_8_radians) {
  /* sin(x + pi/2): half an ulp of |x| + pi/2 (<= 2^-21 below 16), pi/2's own rounding
   * (4.4e-8) and sinf's ulp: absolute, not relative, error */
  unary_case("cos", lm_cos, cos, -8, 8, 0, 0, 1e-6, 34);
}

Test(ops, tanh_absolute_error_is_below_3e7) {
  /* 2*sigmoid(2x) - 1: sigmoid's half-ulp-of-1 errors, doubled */
  unary_case("tanh", lm_tanh, tanh, -6, 6, 0.05, 0, 3e-7, 35);
}

Test(ops, sigmoid_matches_closed_form) {
  /* exp's argument rounding (1.25 u (|x| + 1) <= 27u) plus add and recip */
  unary_case("sigmoid", lm_sigmoid, r_sigmoid, -20, 20, 0.05, 32 * U, 0, 36);
}

Test(ops, tanh_and_sigmoid_saturate_without_nan_at_plus_minus_100_and_inf) {
  static const float xs[] = {100, -100, 1e30f, -1e30f, INFINITY, -INFINITY, 20, -20};
  double t[8], s[8];
  for (int i = 0; i < 8; i++) t[i] = tanh(xs[i]), s[i] = r_sigmoid(xs[i]);
  unary_values("tanh saturation", lm_tanh, xs, t, 8, 0, 3e-7);
  /* sigmoid(-100) is 3.7e-44 (subnormal): exp2 overflows and recip gives 0, within 1e-38 */
  unary_values("sigmoid saturation", lm_sigmoid, xs, s, 8, 32 * U, 1e-38);
}

Test(ops, relu_is_exact) {
  unary_case("relu", lm_relu, r_relu, -5, 5, 0.01, 0, 0, 37);
  static const float xs[] = {0.0f, 3e38f, -3e38f, INFINITY};
  static const double want[] = {0, 3e38f, 0, INFINITY};
  unary_values("relu edges", lm_relu, xs, want, 4, 0, 0);
}

/* ---------------------------------------------------------------- comparisons, selection */

static double r_lt(double a, double b) { return a < b; }
static double r_gt(double a, double b) { return a > b; }
static double r_le(double a, double b) { return a <= b; }
static double r_ge(double a, double b) { return a >= b; }
static double r_eq(double a, double b) { return a == b; }
static double r_ne(double a, double b) { return a != b; }
static double r_min(double a, double b) { return a < b ? a : b; }
static double r_max(double a, double b) { return a > b ? a : b; }

/* comparisons are exact 0/1 values; the tie-heavy fill meets a == b often */
Test(ops, lt_is_exact_with_ties_and_broadcasting) { binary_case("lt", lm_lt, r_lt, fill_ties, 0, 0, 40); }
Test(ops, gt_is_exact_with_ties_and_broadcasting) { binary_case("gt", lm_gt, r_gt, fill_ties, 0, 0, 41); }
Test(ops, le_is_exact_with_ties_and_broadcasting) { binary_case("le", lm_le, r_le, fill_ties, 0, 0, 42); }
Test(ops, ge_is_exact_with_ties_and_broadcasting) { binary_case("ge", lm_ge, r_ge, fill_ties, 0, 0, 43); }
Test(ops, eq_is_exact_with_ties_and_broadcasting) { binary_case("eq", lm_eq, r_eq, fill_ties, 0, 0, 44); }
Test(ops, ne_is_exact_with_ties_and_broadcasting) { binary_case("ne", lm_ne, r_ne, fill_ties, 0, 0, 45); }

/* The C kernels print eq and ne as one test (compiler/render.c, eq_form): the composition's
 * value, +0 or 1, for every pair, NaN included (eq(NaN, x) = 1 - ((NaN < x) + (x < NaN)) = 1),
 * inside a larger expression too. cpu and opencl against ref, bit for bit. */
Test(ops, eq_and_ne_keep_the_compositions_bits_on_every_backend) {
  const float nan = NAN, inf = INFINITY;
  enum { K = 8, M = K * K };
  const float v[K] = {0.0f, -0.0f, 1.0f, -1.0f, nan, inf, -inf, 3.5f};
  float xs[M], ys[M];
  for (int i = 0; i < M; i++) xs[i] = v[i / K], ys[i] = v[i % K];
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = data(g, "x", 1, (lm_dim[]){M}), y = data(g, "y", 1, (lm_dim[]){M});
  output(lm_eq(x, y), "eq");
  output(lm_ne(x, y), "ne");
  output(lm_add(lm_mul(lm_eq(x, y), lm_const(g, 3.0f)), lm_ne(y, x)), "mix");
  const char *backends[] = {"ref", "cpu", "opencl"};
  float got[3][3][M];
  for (int b = 0; b < 3; b++) {
    if (b == 2) {
      char why[256];
      lm_backend_t *cl = lm_backend_open("opencl", why, sizeof why);
      if (!cl) {
        cr_log_info("no OpenCL device (%s): ref and cpu only", why);
        break;
      }
      lm_backend_free(cl);
    }
    check_prog p = check_prog_new(g, backends[b]);
    check_buf in[] = {{"x", xs, M}, {"y", ys, M}};
    check_buf out[] = {{"eq", got[b][0], M}, {"ne", got[b][1], M}, {"mix", got[b][2], M}};
    check_prog_run(&p, NULL, 0, in, 2, out, 3);
    check_prog_free(&p);
    for (int i = 0; b > 0 && i < 3 * M; i++)
      cr_assert(!memcmp(&got[b][i / M][i % M], &got[0][i / M][i % M], sizeof(float)),
                "%s on %s, x = %g, y = %g: %g, ref %g", i / M == 0 ? "eq" : i / M == 1 ? "ne" : "mix",
                backends[b], (double)xs[i % M], (double)ys[i % M], (double)got[b][i / M][i % M],
                (double)got[0][i / M][i % M]);
  }
  for (int i = 0; i < M; i++) { /* the composition's own values on ref */
    float want_ne = (xs[i] < ys[i]) + (ys[i] < xs[i]);
    cr_assert_eq(got[0][0][i], 1.0f - want_ne, "eq(%g, %g)", (double)xs[i], (double)ys[i]);
    cr_assert_eq(got[0][1][i], want_ne, "ne(%g, %g)", (double)xs[i], (double)ys[i]);
  }
  lm_graph_free(g);
}
Test(ops, minimum_is_exact_and_broadcasts) { binary_case("minimum", lm_minimum, r_min, fill_pm3, 0, 0, 46); }
Test(ops, maximum_is_exact_and_broadcasts) { binary_case("maximum", lm_maximum, r_max, fill_pm3, 0, 0, 47); }
Test(ops, minimum_and_maximum_are_exact_on_ties) {
  binary_case("minimum ties", lm_minimum, r_min, fill_ties, 0, 0, 48);
  binary_case("maximum ties", lm_maximum, r_max, fill_ties, 0, 0, 49);
}

Test(ops, where_picks_a_for_every_nonzero_condition_and_broadcasts) {
  /* cond [3,1] (values 0, 1, -3.5, 0.25), a [1,4], b [3,4] -> [3,4]; exact */
  lm_graph_t *g = lm_graph_new();
  lm_tensor w = lm_where(data(g, "c", 2, (lm_dim[]){4, 1}), data(g, "a", 2, (lm_dim[]){1, 4}),
                         data(g, "b", 2, (lm_dim[]){4, 4}));
  expect_shape(w, 2, (lm_dim[]){4, 4});
  output(w, "w");
  float cs[4] = {0, 1, -3.5f, 0.25f}, as[4], bs[16], ws[16];
  double want[16];
  check_rng rng = check_rng_new(50);
  check_fill(&rng, as, 4, -3, 3, 0.01);
  check_fill(&rng, bs, 16, -3, 3, 0.01);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) want[i * 4 + j] = cs[i] != 0 ? as[j] : bs[i * 4 + j];
  check_run_ref(g, NULL, 0, (check_buf[]){{"c", cs, 4}, {"a", as, 4}, {"b", bs, 16}}, 3,
                (check_buf[]){{"w", ws, 16}}, 1);
  check_close("where", ws, want, 16, 0, 0);
  lm_graph_free(g);
}

Test(ops, where_evaluates_both_branches_so_inf_in_the_unused_one_gives_nan) {
  /* documented limitation: c*a + (1-c)*b, and 0 * inf is NaN */
  lm_graph_t *g = lm_graph_new();
  output(lm_where(data(g, "c", 1, (lm_dim[]){2}), data(g, "a", 1, (lm_dim[]){2}), data(g, "b", 1, (lm_dim[]){2})),
         "w");
  float cs[2] = {1, 0}, as[2] = {2, INFINITY}, bs[2] = {INFINITY, 3}, ws[2];
  check_run_ref(g, NULL, 0, (check_buf[]){{"c", cs, 2}, {"a", as, 2}, {"b", bs, 2}}, 3, (check_buf[]){{"w", ws, 2}},
                1);
  cr_expect(isnan(ws[0]) && isnan(ws[1]), "where with inf in the unused branch gave %g, %g", (double)ws[0],
            (double)ws[1]);
  lm_graph_free(g);
}

static lm_tensor clamp_op(lm_tensor x) { return lm_clamp(x, -1.0f, 1.5f); }
static double clamp_ref(double x) { return x < -1 ? -1 : x > 1.5 ? 1.5 : x; }

Test(ops, clamp_limits_to_its_bounds_exactly) {
  unary_case("clamp", clamp_op, clamp_ref, -3, 3, 0.01, 0, 0, 51);
  static const float xs[] = {-1.0f, 1.5f, -3e38f, 3e38f};
  static const double want[] = {-1, 1.5, -1, 1.5};
  unary_values("clamp bounds", clamp_op, xs, want, 4, 0, 0);
}

/* ---------------------------------------------------------------- reductions */

typedef enum red_kind { RED_SUM, RED_MAX, RED_MIN, RED_MEAN, RED_VAR, RED_LSE } red_kind;
typedef lm_tensor (*red_fn)(lm_tensor, int, int);

static double host_reduce(red_kind kind, const float *x, size_t n, size_t stride) {
  double acc = kind == RED_MAX ? -INFINITY : kind == RED_MIN ? INFINITY : 0, m = -INFINITY;
  for (size_t k = 0; k < n; k++) {
    double v = x[k * stride];
    if (kind == RED_MAX) acc = fmax(acc, v);
    else if (kind == RED_MIN) acc = fmin(acc, v);
    else acc += v;
    m = fmax(m, v);
  }
  if (kind == RED_MEAN) acc /= (double)n;
  if (kind == RED_VAR) {
    double mean = acc / (double)n, s = 0;
    for (size_t k = 0; k < n; k++) s += (x[k * stride] - mean) * (x[k * stride] - mean);
    acc = s / (double)n;
  }
  if (kind == RED_LSE) {
    double s = 0;
    for (size_t k = 0; k < n; k++) s += exp(x[k * stride] - m);
    acc = m + log(s);
  }
  return acc;
}

/* op over every axis of a [3,4,5] input (negative and positive axis), with and without
 * keepdim, against the double reference. */
static void reduce_case(const char *what, red_fn op, red_kind kind, double lo, double hi, double rtol, double atol,
                        uint64_t seed) {
  static const lm_dim shape[3] = {3, 4, 5};
  enum { N = 60 };
  float xs[N];
  check_rng rng = check_rng_new(seed);
  check_fill(&rng, xs, N, lo, hi, 0.01);
  for (int axis = -3; axis < 3; axis++) {
    int a = axis < 0 ? axis + 3 : axis;
    for (int keepdim = 0; keepdim < 2; keepdim++) {
      lm_graph_t *g = lm_graph_new();
      lm_tensor y = op(data(g, "x", 3, shape), axis, keepdim);
      lm_dim want_shape[3];
      for (int i = 0, k = 0; i < 3; i++)
        if (i != a) want_shape[k++] = shape[i];
        else if (keepdim) want_shape[k++] = 1;
      expect_shape(y, keepdim ? 3 : 2, want_shape);
      output(y, "y");
      size_t outer, n, inner;
      split_axis(3, shape, a, &outer, &n, &inner);
      float ys[N];
      double want[N];
      for (size_t o = 0; o < outer; o++)
        for (size_t i = 0; i < inner; i++) want[o * inner + i] = host_reduce(kind, xs + o * n * inner + i, n, inner);
      check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, N}}, 1, (check_buf[]){{"y", ys, outer * inner}}, 1);
      char label[96];
      snprintf(label, sizeof label, "%s(axis %d, keepdim %d)", what, axis, keepdim);
      check_close(label, ys, want, outer * inner, rtol, atol);
      lm_graph_free(g);
    }
  }
}

/* sums of <= 5 values of one sign: <= 5 roundings */
Test(ops, sum_over_every_axis_with_and_without_keepdim) { reduce_case("sum", lm_sum, RED_SUM, 0.5, 2, 10 * U, 0, 60); }
Test(ops, max_over_every_axis_is_exact) { reduce_case("max", lm_max, RED_MAX, -3, 3, 0, 0, 61); }
Test(ops, min_over_every_axis_is_exact) { reduce_case("min", lm_min, RED_MIN, -3, 3, 0, 0, 62); }
Test(ops, mean_over_every_constant_axis) { reduce_case("mean", lm_mean, RED_MEAN, 0.5, 2, 14 * U, 0, 63); }
/* two-pass variance of values in [0.5, 2): mean's error enters squared; 1e-6 relative */
Test(ops, var_is_the_population_variance) { reduce_case("var", lm_var, RED_VAR, 0.5, 2, 1e-6, 1e-7, 64); }
Test(ops, logsumexp_matches_the_closed_form_on_every_axis) {
  /* exp of a shifted argument (<= 6 |x| u), sum, log: 1e-6 absolute on values of order 1-5 */
  reduce_case("logsumexp", lm_logsumexp, RED_LSE, -3, 3, 2e-7, 1e-6, 65);
}

Test(ops, logsumexp_of_large_logits_is_finite_and_accurate) {
  /* naive log(sum(exp(x))) overflows at x > 88; shifted by the max it stays exact-ish: the
   * result is m + log(s) rounded at ulp(1e4) ~ 1e-3 */
  lm_graph_t *g = lm_graph_new();
  output(lm_logsumexp(data(g, "x", 2, (lm_dim[]){2, 4}), 1, 0), "y");
  float xs[8] = {1e4f, 1e4f + 1, 1e4f - 2, 1e4f + 0.5f, -1e4f, -1e4f - 3, -1e4f + 1, -1e4f};
  float ys[2];
  double want[2] = {host_reduce(RED_LSE, xs, 4, 1), host_reduce(RED_LSE, xs + 4, 4, 1)};
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, 8}}, 1, (check_buf[]){{"y", ys, 2}}, 1);
  check_close("logsumexp large", ys, want, 2, 2 * U, 0);
  lm_graph_free(g);
}

Test(ops, softmax_rows_sum_to_one_and_match_the_closed_form) {
  enum { R = 4, C = 6 };
  check_rng rng = check_rng_new(66);
  float xs[R * C], ys[R * C];
  check_fill(&rng, xs, R * C, -5, 5, 0.01);
  xs[0] = 80, xs[1] = 79.5f; /* would overflow exp2 unshifted at 89 */
  for (int axis = 0; axis < 2; axis++) {
    lm_graph_t *g = lm_graph_new();
    lm_tensor s = lm_softmax(data(g, "x", 2, (lm_dim[]){R, C}), axis ? 1 : -2);
    expect_shape(s, 2, (lm_dim[]){R, C});
    output(s, "s");
    output(lm_sum(s, axis, 0), "sum");
    size_t outer, n, inner, nsum = axis ? R : C;
    split_axis(2, (lm_dim[]){R, C}, axis, &outer, &n, &inner);
    double want[R * C], ones[R * C];
    for (size_t o = 0; o < outer; o++)
      for (size_t i = 0; i < inner; i++) {
        const float *row = xs + o * n * inner + i;
        double m = host_reduce(RED_MAX, row, n, inner), tot = 0;
        for (size_t k = 0; k < n; k++) tot += exp(row[k * inner] - m);
        for (size_t k = 0; k < n; k++) want[o * n * inner + k * inner + i] = exp(row[k * inner] - m) / tot;
      }
    for (size_t i = 0; i < nsum; i++) ones[i] = 1;
    float sums_buf[C];
    check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, R * C}}, 1,
                  (check_buf[]){{"s", ys, R * C}, {"sum", sums_buf, nsum}}, 2);
    /* exp of shifted arguments (1.25 u (|x - m| + 1) <= 14u where the value is above 1e-12)
     * times a rounded reciprocal of a sum with its own error */
    check_close("softmax", ys, want, R * C, 40 * U, 1e-12);
    check_close("softmax sums", sums_buf, ones, nsum, 16 * U, 0); /* n roundings of terms <= 1 */
    lm_graph_free(g);
  }
}

Test(ops, log_softmax_of_large_logits_is_finite_and_accurate) {
  /* logits around +-1e4 (exp overflows without the max shift); (x - m) is exact for
   * nearby values, so the result is accurate to ~1e-6 absolute */
  lm_graph_t *g = lm_graph_new();
  output(lm_log_softmax(data(g, "x", 2, (lm_dim[]){2, 5}), -1), "y");
  float xs[10] = {1e4f, 1e4f + 1, 1e4f - 2, 1e4f + 0.5f, 1e4f - 30, -1e4f, -1e4f - 3, -1e4f + 1, -1e4f, -1e4f - 0.25f};
  float ys[10];
  double want[10];
  for (int r = 0; r < 2; r++) {
    double lse = host_reduce(RED_LSE, xs + 5 * r, 5, 1);
    for (int k = 0; k < 5; k++) want[5 * r + k] = (double)xs[5 * r + k] - lse;
  }
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, 10}}, 1, (check_buf[]){{"y", ys, 10}}, 1);
  check_finite("log_softmax large", ys, 10);
  check_close("log_softmax large", ys, want, 10, 4 * U, 1e-6);
  lm_graph_free(g);
}

Test(ops, log_softmax_matches_the_closed_form) {
  enum { R = 3, C = 7 };
  lm_graph_t *g = lm_graph_new();
  output(lm_log_softmax(data(g, "x", 2, (lm_dim[]){R, C}), 1), "y");
  check_rng rng = check_rng_new(67);
  float xs[R * C], ys[R * C];
  double want[R * C];
  check_fill(&rng, xs, R * C, -5, 5, 0.01);
  for (int r = 0; r < R; r++) {
    double lse = host_reduce(RED_LSE, xs + C * r, C, 1);
    for (int k = 0; k < C; k++) want[C * r + k] = xs[C * r + k] - lse;
  }
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, R * C}}, 1, (check_buf[]){{"y", ys, R * C}}, 1);
  check_close("log_softmax", ys, want, R * C, 4 * U, 2e-6); /* (x - m) - log(s): ~1e-6 absolute */
  lm_graph_free(g);
}

Test(ops, cumsum_along_every_axis_of_a_rank_3_input) {
  static const lm_dim shape[3] = {3, 5, 4};
  enum { N = 60 };
  float xs[N], ys[N];
  check_rng rng = check_rng_new(68);
  check_fill(&rng, xs, N, 0.5, 2, 0);
  for (int axis = -1; axis < 3; axis++) {
    int a = axis < 0 ? axis + 3 : axis;
    lm_graph_t *g = lm_graph_new();
    lm_tensor y = lm_cumsum(data(g, "x", 3, shape), axis);
    expect_shape(y, 3, shape);
    output(y, "y");
    size_t outer, n, inner;
    split_axis(3, shape, a, &outer, &n, &inner);
    double want[N];
    for (size_t o = 0; o < outer; o++)
      for (size_t i = 0; i < inner; i++) {
        double acc = 0;
        for (size_t k = 0; k < n; k++) want[o * n * inner + k * inner + i] = acc += xs[o * n * inner + k * inner + i];
      }
    check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, N}}, 1, (check_buf[]){{"y", ys, N}}, 1);
    char label[32];
    snprintf(label, sizeof label, "cumsum(axis %d)", axis);
    check_close(label, ys, want, N, 10 * U, 0); /* <= 5 same-sign roundings */
    lm_graph_free(g);
  }
}

/* ---------------------------------------------------------------- linear algebra */

static void host_matmul(const float *a, const float *b, double *c, int m, int k, int n, size_t sa_m, size_t sa_k,
                        size_t sb_k, size_t sb_n) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double acc = 0;
      for (int t = 0; t < k; t++) acc += (double)a[i * sa_m + t * sa_k] * b[t * sb_k + j * sb_n];
      c[i * n + j] = acc;
    }
}

/* inputs in [-1, 1): K products and sums: absolute 2u * K * sum|a||b| <= 1e-6 for K <= 8 */
Test(ops, matmul_of_3x4_and_4x5_matches_the_reference) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_matmul(data(g, "a", 2, (lm_dim[]){3, 4}), data(g, "b", 2, (lm_dim[]){4, 5}));
  expect_shape(c, 2, (lm_dim[]){3, 5});
  output(c, "c");
  check_rng rng = check_rng_new(70);
  float as[12], bs[20], cs[15];
  double want[15];
  check_fill(&rng, as, 12, -1, 1, 0.01);
  check_fill(&rng, bs, 20, -1, 1, 0.01);
  host_matmul(as, bs, want, 3, 4, 5, 4, 1, 5, 1);
  check_run_ref(g, NULL, 0, (check_buf[]){{"a", as, 12}, {"b", bs, 20}}, 2, (check_buf[]){{"c", cs, 15}}, 1);
  check_close("matmul", cs, want, 15, 0, 1e-6);
  lm_graph_free(g);
}

Test(ops, matmul_broadcasts_batch_axes_of_different_rank) {
  /* [2,1,3,4] x [5,4,2] -> [2,5,3,2] */
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_matmul(data(g, "a", 4, (lm_dim[]){2, 1, 3, 4}), data(g, "b", 3, (lm_dim[]){5, 4, 2}));
  expect_shape(c, 4, (lm_dim[]){2, 5, 3, 2});
  output(c, "c");
  check_rng rng = check_rng_new(71);
  float as[24], bs[40], cs[60];
  double want[60];
  check_fill(&rng, as, 24, -1, 1, 0.01);
  check_fill(&rng, bs, 40, -1, 1, 0.01);
  for (int p = 0; p < 2; p++)
    for (int q = 0; q < 5; q++) host_matmul(as + p * 12, bs + q * 8, want + (p * 5 + q) * 6, 3, 4, 2, 4, 1, 2, 1);
  check_run_ref(g, NULL, 0, (check_buf[]){{"a", as, 24}, {"b", bs, 40}}, 2, (check_buf[]){{"c", cs, 60}}, 1);
  check_close("batched matmul", cs, want, 60, 0, 1e-6);
  lm_graph_free(g);
}

Test(ops, matmul_reads_transposed_and_sliced_operands_through_views) {
  /* a = transpose(A [4,3]) -> [3,4]; b = B [4,7] sliced to columns 2..6 -> [4,5] */
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_transpose(data(g, "A", 2, (lm_dim[]){4, 3}), 0, 1);
  lm_tensor b = lm_slice(data(g, "B", 2, (lm_dim[]){4, 7}), 1, 2, 7);
  lm_tensor c = lm_matmul(a, b);
  expect_shape(c, 2, (lm_dim[]){3, 5});
  output(c, "c");
  check_rng rng = check_rng_new(72);
  float as[12], bs[28], cs[15];
  double want[15];
  check_fill(&rng, as, 12, -1, 1, 0.01);
  check_fill(&rng, bs, 28, -1, 1, 0.01);
  host_matmul(as, bs + 2, want, 3, 4, 5, 1, 3, 7, 1);
  check_run_ref(g, NULL, 0, (check_buf[]){{"A", as, 12}, {"B", bs, 28}}, 2, (check_buf[]){{"c", cs, 15}}, 1);
  check_close("matmul of views", cs, want, 15, 0, 1e-6);
  lm_graph_free(g);
}

static void expect_graph_error(lm_graph_t *g, lm_tensor t, const char *needle1, const char *needle2) {
  cr_assert_not(lm_tensor_ok(t), "expected an invalid tensor");
  cr_assert_eq(t.node, 0, "a failed op must return the invalid tensor {0}");
  cr_assert_eq(lm_graph_validate(g), LM_ERR_INVALID, "validate accepted a graph with a construction error");
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, needle1) && strstr(msg, needle2), "message \"%s\" should name \"%s\" and \"%s\"", msg,
            needle1, needle2);
  lm_backend_t *b = lm_backend_new("ref");
  cr_assert_null(lm_program_new(b, g), "a program was prepared from an invalid graph");
  lm_backend_free(b);
}

Test(ops, matmul_inner_mismatch_gives_invalid_tensor_and_a_validate_message) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_matmul(data(g, "a", 2, (lm_dim[]){3, 4}), data(g, "b", 2, (lm_dim[]){5, 2}));
  expect_graph_error(g, c, "matmul", "inner dimensions");
  lm_graph_free(g);
}

Test(ops, matmul_inner_extent_1_is_not_silently_broadcast) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_matmul(data(g, "a", 2, (lm_dim[]){3, 4}), data(g, "b", 2, (lm_dim[]){1, 2}));
  expect_graph_error(g, c, "matmul", "[1,2]");
  lm_graph_free(g);
}

Test(ops, matmul_rejects_vectors_and_unbroadcastable_batches) {
  lm_graph_t *g = lm_graph_new();
  expect_graph_error(g, lm_matmul(data(g, "a", 1, (lm_dim[]){4}), data(g, "b", 2, (lm_dim[]){4, 2})), "matmul",
                     "rank >= 2");
  lm_graph_free(g);
  g = lm_graph_new();
  expect_graph_error(g, lm_matmul(data(g, "a", 3, (lm_dim[]){2, 3, 4}), data(g, "b", 3, (lm_dim[]){3, 4, 2})),
                     "matmul", "batch");
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- indexing and layout */

Test(ops, one_hot_marks_each_index_and_leaves_out_of_range_rows_empty) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor h = lm_one_hot(data(g, "i", 2, (lm_dim[]){2, 4}), 5);
  expect_shape(h, 3, (lm_dim[]){2, 4, 5});
  output(h, "h");
  float is[8] = {0, 4, 2, 2, 1, 3, -1, 5}, hs[40];
  double want[40];
  for (int k = 0; k < 8; k++)
    for (int j = 0; j < 5; j++) want[k * 5 + j] = is[k] == j;
  check_run_ref(g, NULL, 0, (check_buf[]){{"i", is, 8}}, 1, (check_buf[]){{"h", hs, 40}}, 1);
  check_close("one_hot", hs, want, 40, 0, 0);
  lm_graph_free(g);
}

Test(ops, one_hot_of_symbolic_width) {
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "A");
  output(lm_one_hot(data(g, "i", 1, (lm_dim[]){3}), n), "h");
  check_prog p = check_prog_new(g, "ref");
  for (int a = 3; a <= 6; a += 3) {
    float is[3] = {2, 0, 1}, hs[18];
    double want[18];
    for (int k = 0; k < 3; k++)
      for (int j = 0; j < a; j++) want[k * a + j] = is[k] == j;
    check_prog_run(&p, (check_sym[]){{"A", a}}, 1, (check_buf[]){{"i", is, 3}}, 1,
                   (check_buf[]){{"h", hs, (size_t)(3 * a)}}, 1);
    check_close("one_hot(A)", hs, want, (size_t)(3 * a), 0, 0);
  }
  check_prog_free(&p);
  lm_graph_free(g);
}

Test(ops, gather_picks_entries_along_every_axis_exactly) {
  static const lm_dim shape[3] = {3, 4, 5};
  enum { N = 60 };
  check_rng rng = check_rng_new(80);
  float xs[N], is[20], ys[20];
  check_fill(&rng, xs, N, -3, 3, 0.01);
  for (int axis = -3; axis < 3; axis++) {
    int a = axis < 0 ? axis + 3 : axis;
    lm_dim ishape[2];
    for (int i = 0, k = 0; i < 3; i++)
      if (i != a) ishape[k++] = shape[i];
    size_t outer, n, inner;
    split_axis(3, shape, a, &outer, &n, &inner);
    check_fill_index(&rng, is, outer * inner, (int)n);
    lm_graph_t *g = lm_graph_new();
    lm_tensor y = lm_gather(data(g, "x", 3, shape), axis, data(g, "i", 2, ishape));
    expect_shape(y, 2, ishape);
    output(y, "y");
    double want[20];
    for (size_t o = 0; o < outer; o++)
      for (size_t i = 0; i < inner; i++) want[o * inner + i] = xs[o * n * inner + (size_t)is[o * inner + i] * inner + i];
    check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, N}, {"i", is, outer * inner}}, 2,
                  (check_buf[]){{"y", ys, outer * inner}}, 1);
    check_close("gather", ys, want, outer * inner, 0, 0); /* x*1 plus zeros: exact */
    lm_graph_free(g);
  }
}

Test(ops, gather_with_idx_of_the_wrong_shape_is_an_error) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor y = lm_gather(data(g, "x", 2, (lm_dim[]){4, 6}), 1, data(g, "i", 1, (lm_dim[]){6}));
  expect_graph_error(g, y, "gather", "idx");
  lm_graph_free(g);
}

Test(ops, concat_along_each_axis_is_exact) {
  check_rng rng = check_rng_new(81);
  float as[6], bs[8], cs[14], b2[9], c2[15];
  check_fill(&rng, as, 6, -3, 3, 0.01);
  check_fill(&rng, bs, 8, -3, 3, 0.01);
  check_fill(&rng, b2, 9, -3, 3, 0.01);
  /* [2,3] ++ [2,4] along axis 1 (given as -1) */
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_concat(data(g, "a", 2, (lm_dim[]){2, 3}), data(g, "b", 2, (lm_dim[]){2, 4}), -1);
  expect_shape(c, 2, (lm_dim[]){2, 7});
  output(c, "c");
  double want[15];
  for (int r = 0; r < 2; r++)
    for (int j = 0; j < 7; j++) want[r * 7 + j] = j < 3 ? as[r * 3 + j] : bs[r * 4 + j - 3];
  check_run_ref(g, NULL, 0, (check_buf[]){{"a", as, 6}, {"b", bs, 8}}, 2, (check_buf[]){{"c", cs, 14}}, 1);
  check_close("concat axis 1", cs, want, 14, 0, 0);
  lm_graph_free(g);
  /* [2,3] ++ [3,3] along axis 0 */
  g = lm_graph_new();
  c = lm_concat(data(g, "a", 2, (lm_dim[]){2, 3}), data(g, "b", 2, (lm_dim[]){3, 3}), 0);
  expect_shape(c, 2, (lm_dim[]){5, 3});
  output(c, "c");
  for (int i = 0; i < 15; i++) want[i] = i < 6 ? as[i] : b2[i - 6];
  check_run_ref(g, NULL, 0, (check_buf[]){{"a", as, 6}, {"b", b2, 9}}, 2, (check_buf[]){{"c", c2, 15}}, 1);
  check_close("concat axis 0", c2, want, 15, 0, 0);
  lm_graph_free(g);
}

Test(ops, concat_of_shapes_that_differ_elsewhere_is_an_error_not_a_broadcast) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor c = lm_concat(data(g, "a", 2, (lm_dim[]){3, 1}), data(g, "b", 2, (lm_dim[]){3, 4}), 0);
  expect_graph_error(g, c, "concat", "differ outside axis 0");
  lm_graph_free(g);
}

Test(ops, transpose_swaps_two_axes_including_negative_ones) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor t = lm_transpose(data(g, "x", 3, (lm_dim[]){2, 3, 4}), -1, 0);
  expect_shape(t, 3, (lm_dim[]){4, 3, 2});
  output(t, "t");
  check_rng rng = check_rng_new(82);
  float xs[24], ts[24];
  double want[24];
  check_fill(&rng, xs, 24, -3, 3, 0.01);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 2; k++) want[(i * 3 + j) * 2 + k] = xs[(k * 3 + j) * 4 + i];
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, 24}}, 1, (check_buf[]){{"t", ts, 24}}, 1);
  check_close("transpose", ts, want, 24, 0, 0);
  lm_graph_free(g);
}

Test(ops, unsqueeze_inserts_an_extent_1_axis_anywhere) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = data(g, "x", 2, (lm_dim[]){2, 3});
  expect_shape(lm_unsqueeze(x, 0), 3, (lm_dim[]){1, 2, 3});
  expect_shape(lm_unsqueeze(x, 1), 3, (lm_dim[]){2, 1, 3});
  expect_shape(lm_unsqueeze(x, -1), 3, (lm_dim[]){2, 3, 1});
  lm_tensor u = lm_unsqueeze(x, -2);
  expect_shape(u, 3, (lm_dim[]){2, 1, 3});
  output(u, "u");
  float xs[6] = {1, -2, 3, -4, 5, -6}, us[6];
  double want[6] = {1, -2, 3, -4, 5, -6};
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, 6}}, 1, (check_buf[]){{"u", us, 6}}, 1);
  check_close("unsqueeze", us, want, 6, 0, 0);
  expect_graph_error(g, lm_unsqueeze(x, 4), "unsqueeze", "axis 4");
  lm_graph_free(g);
}

Test(ops, squeeze_removes_an_extent_1_axis_and_rejects_others) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = data(g, "x", 3, (lm_dim[]){2, 1, 3});
  lm_tensor s = lm_squeeze(x, -2);
  expect_shape(s, 2, (lm_dim[]){2, 3});
  output(s, "s");
  float xs[6] = {1, -2, 3, -4, 5, -6}, ss[6];
  double want[6] = {1, -2, 3, -4, 5, -6};
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, 6}}, 1, (check_buf[]){{"s", ss, 6}}, 1);
  check_close("squeeze", ss, want, 6, 0, 0);
  expect_graph_error(g, lm_squeeze(x, 0), "squeeze", "extent 1");
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- views, symbols, errors */

/* exp and tanh of four views of one [4,6] input: permuted [6,4], sliced [4,3], padded
 * [4,9] (zeros read as 0), expanded [3,4,6]. */
Test(ops, unary_ops_read_permuted_sliced_padded_and_expanded_operands) {
  enum { R = 4, C = 6, N = R * C };
  check_rng rng = check_rng_new(90);
  float xs[N];
  check_fill(&rng, xs, N, -3, 3, 0.05);
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = data(g, "x", 2, (lm_dim[]){R, C});
  lm_tensor views[4] = {lm_permute(x, (int[]){1, 0}), lm_slice(x, 1, 2, 5), lm_pad(x, 1, 1, 2), lm_expand(x, 0, 3)};
  static const char *names[4][2] = {{"e0", "t0"}, {"e1", "t1"}, {"e2", "t2"}, {"e3", "t3"}};
  static const size_t counts[4] = {N, R * 3, R * 9, 3 * N};
  for (int v = 0; v < 4; v++) {
    output(lm_exp(views[v]), names[v][0]);
    output(lm_tanh(views[v]), names[v][1]);
  }
  float out[8][3 * N];
  check_buf bufs[8];
  for (int v = 0; v < 4; v++)
    for (int k = 0; k < 2; k++) bufs[2 * v + k] = (check_buf){names[v][k], out[2 * v + k], counts[v]};
  check_run_ref(g, NULL, 0, (check_buf[]){{"x", xs, N}}, 1, bufs, 8);
  double src[4][3 * N];
  for (int i = 0; i < C; i++)
    for (int j = 0; j < R; j++) src[0][i * R + j] = xs[j * C + i];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < 3; j++) src[1][i * 3 + j] = xs[i * C + 2 + j];
  for (int i = 0; i < R; i++)
    for (int j = 0; j < 9; j++) src[2][i * 9 + j] = j >= 1 && j < 7 ? xs[i * C + j - 1] : 0;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < N; i++) src[3][k * N + i] = xs[i];
  for (int v = 0; v < 4; v++) {
    double we[3 * N], wt[3 * N];
    for (size_t i = 0; i < counts[v]; i++) we[i] = exp(src[v][i]), wt[i] = tanh(src[v][i]);
    check_close(names[v][0], out[2 * v], we, counts[v], 8 * U, 0);  /* exp, |x| <= 3 */
    check_close(names[v][1], out[2 * v + 1], wt, counts[v], 0, 3e-7); /* tanh, absolute */
  }
  lm_graph_free(g);
}

Test(ops, binary_ops_and_reductions_read_views_of_both_operands) {
  /* a = permute(A [3,4]) -> [4,3]; b = pad(B [4,1], axis 1, 1, 1) -> [4,3];
   * outputs: maximum(a, b), a - b, and softmax over axis 0 of a */
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_permute(data(g, "A", 2, (lm_dim[]){3, 4}), (int[]){1, 0});
  lm_tensor b = lm_pad(data(g, "B", 2, (lm_dim[]){4, 1}), 1, 1, 1);
  output(lm_maximum(a, b), "mx");
  output(lm_sub(a, b), "d");
  output(lm_softmax(a, 0), "s");
  check_rng rng = check_rng_new(91);
  float as[12], bs[4], mx[12], d[12], s[12];
  check_fill(&rng, as, 12, -3, 3, 0.05);
  check_fill(&rng, bs, 4, -3, 3, 0.05);
  double wm[12], wd[12], ws[12];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) {
      double av = as[j * 4 + i], bv = j == 1 ? bs[i] : 0;
      wm[i * 3 + j] = av > bv ? av : bv;
      wd[i * 3 + j] = (float)(av - bv);
    }
  for (int j = 0; j < 3; j++) {
    double m = -INFINITY, tot = 0;
    for (int i = 0; i < 4; i++) m = fmax(m, as[j * 4 + i]);
    for (int i = 0; i < 4; i++) tot += exp(as[j * 4 + i] - m);
    for (int i = 0; i < 4; i++) ws[i * 3 + j] = exp(as[j * 4 + i] - m) / tot;
  }
  check_run_ref(g, NULL, 0, (check_buf[]){{"A", as, 12}, {"B", bs, 4}}, 2,
                (check_buf[]){{"mx", mx, 12}, {"d", d, 12}, {"s", s, 12}}, 3);
  check_close("maximum of views", mx, wm, 12, 0, 0);
  check_close("sub of views", d, wd, 12, 0, 0);
  check_close("softmax of a view", s, ws, 12, 40 * U, 1e-12);
  lm_graph_free(g);
}

Test(ops, symbolic_n_bound_to_two_values_in_one_program) {
  /* x [N,5]: softmax over axis 1, mean and var over the symbolic axis 0, cumsum along N,
   * logsumexp over N, matmul [N,5] x [5,N] -> [N,N]; the program is run with N = 5 then 3 */
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "N");
  lm_tensor x = data(g, "x", 2, (lm_dim[]){n, 5});
  output(lm_softmax(x, 1), "soft");
  output(lm_mean(x, 0, 0), "mean");
  output(lm_var(x, 0, 1), "var");
  output(lm_cumsum(x, 0), "cum");
  output(lm_logsumexp(x, 0, 0), "lse");
  output(lm_matmul(x, lm_transpose(x, 0, 1)), "gram");
  check_prog p = check_prog_new(g, "ref");
  check_rng rng = check_rng_new(92);
  static const int binds[2] = {5, 3};
  for (int b = 0; b < 2; b++) {
    int rows = binds[b];
    size_t nx = (size_t)rows * 5;
    float xs[25], soft[25], mean[5], var[5], cum[25], lse[5], gram[25];
    check_fill(&rng, xs, nx, 0.5, 2, 0);
    check_prog_run(&p, (check_sym[]){{"N", rows}}, 1, (check_buf[]){{"x", xs, nx}}, 1,
                   (check_buf[]){{"soft", soft, nx},
                                 {"mean", mean, 5},
                                 {"var", var, 5},
                                 {"cum", cum, nx},
                                 {"lse", lse, 5},
                                 {"gram", gram, (size_t)(rows * rows)}},
                   6);
    double wsoft[25], wmean[5], wvar[5], wcum[25], wlse[5], wgram[25];
    for (int r = 0; r < rows; r++) {
      double m = host_reduce(RED_MAX, xs + 5 * r, 5, 1), tot = 0;
      for (int k = 0; k < 5; k++) tot += exp(xs[5 * r + k] - m);
      for (int k = 0; k < 5; k++) wsoft[5 * r + k] = exp(xs[5 * r + k] - m) / tot;
    }
    for (int c = 0; c < 5; c++) {
      wmean[c] = host_reduce(RED_MEAN, xs + c, (size_t)rows, 5);
      wvar[c] = host_reduce(RED_VAR, xs + c, (size_t)rows, 5);
      wlse[c] = host_reduce(RED_LSE, xs + c, (size_t)rows, 5);
      double acc = 0;
      for (int r = 0; r < rows; r++) wcum[5 * r + c] = acc += xs[5 * r + c];
    }
    host_matmul(xs, xs, wgram, rows, 5, rows, 5, 1, 1, 5);
    char label[32];
    snprintf(label, sizeof label, "N=%d", rows);
    check_close(label, soft, wsoft, nx, 40 * U, 1e-12);
    check_close(label, mean, wmean, 5, 16 * U, 0); /* sum + recip(sum of ones) */
    check_close(label, var, wvar, 5, 1e-6, 1e-7);
    check_close(label, cum, wcum, nx, 10 * U, 0);
    check_close(label, lse, wlse, 5, 2e-7, 1e-6);
    check_close(label, gram, wgram, (size_t)(rows * rows), 12 * U, 0); /* positive products */
  }
  check_prog_free(&p);
  lm_graph_free(g);
}

Test(ops, bad_reduction_axis_is_reported_and_the_first_error_sticks) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = data(g, "x", 2, (lm_dim[]){2, 3});
  lm_tensor s = lm_sum(x, 2, 0);
  cr_assert_not(lm_tensor_ok(s));
  /* later ops on valid tensors fail too, and the message stays the first one */
  cr_assert_not(lm_tensor_ok(lm_exp(x)));
  cr_assert_not(lm_tensor_ok(lm_concat(x, lm_full(g, 1, 2, (lm_dim[]){5, 5}), 0)));
  expect_graph_error(g, lm_softmax(s, 0), "sum", "axis 2");
  lm_graph_free(g);
}

Test(ops, every_op_returns_the_invalid_tensor_for_an_invalid_operand) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = data(g, "x", 2, (lm_dim[]){2, 3});
  lm_tensor bad = lm_squeeze(x, 0); /* extent 2: error */
  cr_assert_not(lm_tensor_ok(bad));
  lm_tensor outs[] = {lm_neg(bad), lm_exp(bad), lm_tanh(bad), lm_where(bad, x, x), lm_sum(bad, 0, 1),
                      lm_softmax(bad, 0), lm_cumsum(bad, 0), lm_matmul(bad, x), lm_gather(x, 0, bad),
                      lm_concat(x, bad, 0), lm_one_hot(bad, 3), lm_pow_int(bad, 3), lm_scalar_like(bad, 1)};
  for (size_t i = 0; i < CHECK_COUNT(outs); i++) cr_assert_not(lm_tensor_ok(outs[i]), "op %zu accepted an invalid operand", i);
  expect_graph_error(g, bad, "squeeze", "extent 1");
  lm_graph_free(g);
}
