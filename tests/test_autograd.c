/* Tests for reverse-mode autograd (compiler/autograd.c) and the loss library (train/loss.c).
 *
 * Finite-difference checks: for every primitive, every view kind (and chains of them), every
 * differentiable op of lumen/ops.h and every loss, a case builds y = f(x...) from DATA inputs,
 * takes loss = sum(y * w) with random weights w (so every output element matters, with a
 * different weight), appends lm_grad(loss, x...) and runs the graph on "ref" and, when this
 * machine has a C compiler, on "cpu" (the gradient graph through the fusing compiler). Each
 * gradient element is compared with a double-precision central difference of the same loss
 * computed from a double-precision C reference of f written here:
 *     fd = (L(x + h e_k) - L(x - h e_k)) / 2h,  h = 1e-6 * max(1, |x_k|)
 * (truncation ~h^2, cancellation ~1e-16 |L| / h: both below 1e-8 here). Inputs are drawn away
 * from every kink by at least 0.05 >> h. Tolerance, unless a case states otherwise:
 *     |grad - fd| <= 2e-4 * |fd| + 2e-5 * max(1, max_k |fd_k|)
 * (float32 forward and backward: a few ulp per op over chains of up to ~20 ops, with the
 * cancellation of softmax-like sums absorbed by the absolute term). The forward value y is
 * also checked against the reference (rtol 1e-5, atol 1e-6 unless stated), which guards the
 * references themselves. Gradients that must vanish (comparisons, floor, round, sign, index
 * inputs) are checked to be exactly 0. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph-impl.h"
#include "lumen/autograd.h"
#include "lumen/loss.h"
#include "lumen/ops.h"
#include "passes.h"
#include "support/check.h"

#define MAXIN 3
#define MAXN 512

/* ---------------------------------------------------------------- harness */

enum { IN_FD, IN_INDEX, IN_FIXED };

typedef struct fd_input {
  int rank;
  lm_dim shape[4];     /* concrete extents */
  const char *sym[4];  /* non-NULL: this axis is the symbol of that name (bound to shape[i]) */
  double lo, hi, min_abs;
  double grid, offset, gap; /* grid > 0: values keep `gap` away from offset + k*grid */
  int kind;            /* IN_FD: finite differences; IN_INDEX: integers in [0, nidx), gradient must be 0;
                          IN_FIXED: not differentiated */
  int nidx;
} fd_input;

typedef lm_tensor (*build_fn)(lm_graph_t *g, const lm_tensor *x);
typedef void (*ref_fn)(const double *const *x, double *y);
typedef void (*fill_fn)(check_rng *r, float *const *x, const size_t *n);

typedef struct fd_case {
  const char *name;
  int nin;
  fd_input in[MAXIN];
  build_fn build;
  ref_fn ref;
  fill_fn fill;         /* optional: adjusts the drawn inputs (kinks that depend on two inputs) */
  check_sym syms[3];    /* symbols used by build beyond the input shapes */
  int nsyms;
  double rtol, atol;    /* gradient tolerance (0: the defaults above) */
  double ftol;          /* forward tolerance (0: rtol 1e-5, atol 1e-6) */
} fd_case;

static lm_tensor sum_all(lm_tensor x) {
  while (lm_tensor_ok(x) && lm_rank(x) > 0) x = lm_sum_reduce(x, 0);
  return x;
}

static size_t numel_of(const fd_input *in) {
  size_t n = 1;
  for (int i = 0; i < in->rank; i++) n *= (size_t)in->shape[i];
  return n;
}

static void fill_input(check_rng *r, const fd_input *in, float *x, size_t n) {
  if (in->kind == IN_INDEX) {
    check_fill_index(r, x, n, in->nidx);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    for (;;) {
      check_fill(r, &x[i], 1, in->lo, in->hi, in->min_abs);
      if (in->grid <= 0) break;
      double k = round((x[i] - in->offset) / in->grid);
      if (fabs(x[i] - (in->offset + k * in->grid)) >= in->gap) break;
    }
  }
}

static double loss_of(const fd_case *c, const double *const *xd, const double *w, double *y, size_t ny) {
  c->ref(xd, y);
  double l = 0;
  for (size_t k = 0; k < ny; k++) l += w[k] * y[k];
  return l;
}

static int have_cpu(void) {
  static int known = -1;
  if (known < 0) {
    lm_backend_t *b = lm_backend_new("cpu");
    known = b != NULL;
    lm_backend_free(b);
  }
  return known;
}

static void run_case_on(const fd_case *c, lm_graph_t *g, const char *backend, uint64_t seed) {
  check_prog p = check_prog_new(g, backend);
  lm_program_t *pr = p.program;
  for (int i = 0; i < c->nin; i++)
    for (int a = 0; a < c->in[i].rank; a++)
      if (c->in[i].sym[a]) cr_assert(lm_program_bind(pr, c->in[i].sym[a], c->in[i].shape[a]) == LM_OK, "%s", lm_last_error());
  for (int i = 0; i < c->nsyms; i++)
    cr_assert(lm_program_bind(pr, c->syms[i].name, c->syms[i].value) == LM_OK, "bind %s: %s", c->syms[i].name,
              lm_last_error());
  static float xf[MAXIN][MAXN], wf[MAXN], yf[MAXN], gf[MAXIN][MAXN], lf;
  static double xd[MAXIN][MAXN], w[MAXN], y[MAXN], yref[MAXN];
  size_t nx[MAXIN], ny = 0;
  check_rng r = check_rng_new(seed);
  for (int i = 0; i < c->nin; i++) {
    nx[i] = numel_of(&c->in[i]);
    cr_assert(nx[i] <= MAXN);
    fill_input(&r, &c->in[i], xf[i], nx[i]);
  }
  if (c->fill) {
    float *ptr[MAXIN] = {xf[0], xf[1], xf[2]};
    c->fill(&r, ptr, nx);
  }
  cr_assert(lm_program_numel(pr, "w", &ny) == LM_OK && ny <= MAXN, "numel w: %s", lm_last_error());
  check_fill(&r, wf, ny, -1.5, 1.5, 0.5);
  char name[16];
  for (int i = 0; i < c->nin; i++) {
    snprintf(name, sizeof name, "x%d", i);
    cr_assert(lm_program_write(pr, name, xf[i], nx[i]) == LM_OK, "write %s: %s", name, lm_last_error());
  }
  cr_assert(lm_program_write(pr, "w", wf, ny) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_program_run(pr) == LM_OK, "%s: run on %s: %s", c->name, backend, lm_last_error());
  check_poison(yf, ny);
  cr_assert(lm_program_read(pr, "y", yf, ny) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_program_read(pr, "loss", &lf, 1) == LM_OK, "%s", lm_last_error());
  for (int i = 0; i < c->nin; i++) {
    if (c->in[i].kind == IN_FIXED) continue;
    snprintf(name, sizeof name, "g%d", i);
    check_poison(gf[i], nx[i]);
    cr_assert(lm_program_read(pr, name, gf[i], nx[i]) == LM_OK, "read %s: %s", name, lm_last_error());
  }
  check_prog_free(&p);

  /* the forward against the double reference */
  const double *xp[MAXIN];
  for (int i = 0; i < c->nin; i++) {
    for (size_t k = 0; k < nx[i]; k++) xd[i][k] = xf[i][k];
    xp[i] = xd[i];
  }
  for (size_t k = 0; k < ny; k++) w[k] = wf[k];
  char what[160];
  double l0 = loss_of(c, xp, w, yref, ny);
  snprintf(what, sizeof what, "%s on %s: forward y", c->name, backend);
  double ft = c->ftol > 0 ? c->ftol : 1e-5;
  check_close(what, yf, yref, ny, ft, ft * 0.1);
  snprintf(what, sizeof what, "%s on %s: loss", c->name, backend);
  check_close(what, &lf, &l0, 1, 1e-4, 1e-5);

  /* every gradient element against a central difference */
  static double fd[MAXN];
  for (int i = 0; i < c->nin; i++) {
    if (c->in[i].kind == IN_FIXED) continue;
    snprintf(what, sizeof what, "%s on %s: d loss / d x%d", c->name, backend, i);
    if (c->in[i].kind == IN_INDEX) {
      for (size_t k = 0; k < nx[i]; k++) fd[k] = 0;
      check_close(what, gf[i], fd, nx[i], 0, 0);
      continue;
    }
    double scale = 1;
    for (size_t k = 0; k < nx[i]; k++) {
      double x0 = xd[i][k], h = 1e-6 * fmax(1, fabs(x0));
      xd[i][k] = x0 + h;
      double lp = loss_of(c, xp, w, y, ny);
      xd[i][k] = x0 - h;
      double lm = loss_of(c, xp, w, y, ny);
      xd[i][k] = x0;
      fd[k] = (lp - lm) / (2 * h);
      scale = fmax(scale, fabs(fd[k]));
    }
    double rt = c->rtol > 0 ? c->rtol : 2e-4, at = c->atol > 0 ? c->atol : 2e-5;
    check_close(what, gf[i], fd, nx[i], rt, at * scale);
  }
}

static void fd_check(const fd_case *c, uint64_t seed) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x[MAXIN], wrt[MAXIN];
  int nwrt = 0, slot[MAXIN];
  char name[16];
  for (int i = 0; i < c->nin; i++) {
    lm_dim dims[4];
    for (int a = 0; a < c->in[i].rank; a++) dims[a] = c->in[i].sym[a] ? lm_sym(g, c->in[i].sym[a]) : c->in[i].shape[a];
    snprintf(name, sizeof name, "x%d", i);
    x[i] = lm_input(g, name, LM_ROLE_DATA, c->in[i].rank, dims);
    slot[i] = -1;
    if (c->in[i].kind != IN_FIXED) slot[i] = nwrt, wrt[nwrt++] = x[i];
  }
  lm_tensor y = c->build(g, x);
  cr_assert(lm_tensor_ok(y), "%s: build: %s", c->name, lm_graph_validate(g) == LM_OK ? "?" : lm_last_error());
  lm_dim ydims[LM_MAX_RANK];
  for (int a = 0; a < lm_rank(y); a++) ydims[a] = lm_dim_of(y, a);
  lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, lm_rank(y), ydims);
  lm_tensor loss = sum_all(lm_mul(y, w));
  lm_tensor grads[MAXIN];
  cr_assert(lm_grad(loss, wrt, nwrt, grads) == LM_OK, "%s: lm_grad: %s", c->name, lm_last_error());
  cr_assert(lm_output(y, "y") == LM_OK && lm_output(loss, "loss") == LM_OK, "%s", lm_last_error());
  for (int i = 0; i < c->nin; i++) {
    if (slot[i] < 0) continue;
    snprintf(name, sizeof name, "g%d", i);
    cr_assert(lm_output(grads[slot[i]], name) == LM_OK, "%s: output %s: %s", c->name, name, lm_last_error());
  }
  cr_assert(lm_graph_validate(g) == LM_OK, "%s: %s", c->name, lm_last_error());
  run_case_on(c, g, "ref", seed);
  if (have_cpu()) run_case_on(c, g, "cpu", seed);
  lm_graph_free(g);
}

/* Shorthand for inputs. */
#define IN2(a, b, lo_, hi_, ma) {.rank = 2, .shape = {a, b}, .lo = lo_, .hi = hi_, .min_abs = ma}
#define IN1(a, lo_, hi_, ma) {.rank = 1, .shape = {a}, .lo = lo_, .hi = hi_, .min_abs = ma}
#define IN3(a, b, c_, lo_, hi_, ma) {.rank = 3, .shape = {a, b, c_}, .lo = lo_, .hi = hi_, .min_abs = ma}
#define IDX1(a, n) {.rank = 1, .shape = {a}, .kind = IN_INDEX, .nidx = n}

#define FD_TEST(suite, test, seed, ...)                                                                                \
  Test(suite, test) {                                                                                                  \
    static const fd_case c = {.name = #test, __VA_ARGS__};                                                             \
    fd_check(&c, seed);                                                                                                \
  }

/* ---------------------------------------------------------------- references */

/* [3,4] elementwise */
#define EW1(fn, expr)                                                                                                  \
  static void fn(const double *const *x, double *y) {                                                                  \
    for (int i = 0; i < 12; i++) {                                                                                     \
      double v = x[0][i];                                                                                              \
      y[i] = (expr);                                                                                                   \
    }                                                                                                                  \
  }
#define EW2(fn, expr)                                                                                                  \
  static void fn(const double *const *x, double *y) {                                                                  \
    for (int i = 0; i < 12; i++) {                                                                                     \
      double a = x[0][i], b = x[1][i];                                                                                 \
      y[i] = (expr);                                                                                                   \
    }                                                                                                                  \
  }
#define B1(fn, expr)                                                                                                   \
  static lm_tensor fn(lm_graph_t *g, const lm_tensor *x) {                                                            \
    (void)g;                                                                                                           \
    return (expr);                                                                                                     \
  }

static double sgn(double v) { return (v > 0) - (v < 0); }
static double sigm(double v) { return 1 / (1 + exp(-v)); }

EW1(r_log2, log2(v))
EW1(r_exp2, exp2(v))
EW1(r_sin, sin(v))
EW1(r_sqrt, sqrt(v))
EW1(r_recip, 1 / v)
EW2(r_mod, fmod(a, b))
EW2(r_lt, a < b)
EW2(r_gt, a > b)
EW2(r_le, a <= b)
EW2(r_ge, a >= b)
EW2(r_eq, a == b)
EW2(r_ne, a != b)
EW2(r_div, a / b)
EW2(r_min, fmin(a, b))
EW2(r_max, fmax(a, b))
EW1(r_neg, -v)
EW1(r_add_scalar, v + 0.375)
EW1(r_mul_scalar, v * -1.5)
EW1(r_square, v *v)
EW1(r_cube, v *v *v)
EW1(r_pow_m2, 1 / (v * v))
EW1(r_abs, fabs(v))
EW1(r_sign, sgn(v))
EW1(r_floor, floor(v))
EW1(r_round, round(v))
EW1(r_exp, exp(v))
EW1(r_log, log(v))
EW1(r_cos, cos(v))
EW1(r_tanh, tanh(v))
EW1(r_sigmoid, sigm(v))
EW1(r_relu, v > 0 ? v : 0)
EW1(r_clamp, fmin(fmax(v, -1), 1))
EW1(r_detach_mix, v *v + sin(v) + v)

B1(b_log2, lm_log2(x[0]))
B1(b_exp2, lm_exp2(x[0]))
B1(b_sin, lm_sin(x[0]))
B1(b_sqrt, lm_sqrt(x[0]))
B1(b_recip, lm_recip(x[0]))
B1(b_mod, lm_mod(x[0], x[1]))
B1(b_less_than, lm_less_than(x[0], x[1]))
B1(b_mul, lm_mul(x[0], x[1]))

/* ---------------------------------------------------------------- primitives */

FD_TEST(grad_primitive, log2_is_recip_x_over_ln2, 1, .nin = 1, .in = {IN2(3, 4, 0.2, 3, 0)}, .build = b_log2,
        .ref = r_log2)
FD_TEST(grad_primitive, exp2_is_ln2_times_exp2, 2, .nin = 1, .in = {IN2(3, 4, -3, 3, 0)}, .build = b_exp2,
        .ref = r_exp2)
FD_TEST(grad_primitive, sin_is_cos, 3, .nin = 1, .in = {IN2(3, 4, -4, 4, 0)}, .build = b_sin, .ref = r_sin)
FD_TEST(grad_primitive, sqrt_is_half_over_sqrt, 4, .nin = 1, .in = {IN2(3, 4, 0.2, 4, 0)}, .build = b_sqrt,
        .ref = r_sqrt)
FD_TEST(grad_primitive, recip_is_minus_recip_squared, 5, .nin = 1, .in = {IN2(3, 4, -3, 3, 0.3)}, .build = b_recip,
        .ref = r_recip)

/* a [3,4] + b [4]: the broadcast of b is summed back */
static lm_tensor b_add_bcast(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_add(x[0], x[1]);
}
static void r_add_bcast(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) y[i * 4 + k] = x[0][i * 4 + k] + x[1][k];
}
FD_TEST(grad_primitive, add_passes_gradient_to_both_and_sums_over_broadcast, 6, .nin = 2,
        .in = {IN2(3, 4, -2, 2, 0), IN1(4, -2, 2, 0)}, .build = b_add_bcast, .ref = r_add_bcast)

/* a [3,4] * b [3,1] */
static void r_mul_bcast(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) y[i * 4 + k] = x[0][i * 4 + k] * x[1][i];
}
FD_TEST(grad_primitive, mul_is_the_other_operand_with_stretched_axis_summed, 7, .nin = 2,
        .in = {IN2(3, 4, -2, 2, 0.1), IN2(3, 1, -2, 2, 0.1)}, .build = b_mul, .ref = r_mul_bcast)

/* fmod(a, b) with a/b kept 0.1 away from integers (the kinks): a = (t + f) * b. */
static void fill_mod(check_rng *r, float *const *x, const size_t *n) {
  for (size_t i = 0; i < n[0]; i++) {
    double b = check_uniform(r, 0.7, 2.0) * (check_next(r) & 1 ? 1 : -1);
    double q = (double)((int)(check_next(r) % 9) - 4) + check_uniform(r, 0.1, 0.9);
    x[1][i] = (float)b;
    x[0][i] = (float)(q * b);
  }
}
FD_TEST(grad_primitive, mod_is_one_for_a_and_minus_trunc_quotient_for_b, 8, .nin = 2,
        .in = {IN2(3, 4, -1, 1, 0), IN2(3, 4, -1, 1, 0)}, .build = b_mod, .ref = r_mod, .fill = fill_mod)

FD_TEST(grad_primitive, less_than_has_zero_gradient, 9, .nin = 2, .in = {IN2(3, 4, -2, 2, 0), IN2(3, 4, -2, 2, 0)},
        .build = b_less_than, .ref = r_lt)

static lm_tensor b_sum_reduce(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sum_reduce(lm_sin(x[0]), 1);
}
static void r_sum_reduce(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 5; k++) {
      double s = 0;
      for (int j = 0; j < 4; j++) s += sin(x[0][(i * 4 + j) * 5 + k]);
      y[i * 5 + k] = s;
    }
}
FD_TEST(grad_primitive, sum_reduce_broadcasts_back_over_the_axis, 10, .nin = 1, .in = {IN3(3, 4, 5, -2, 2, 0)},
        .build = b_sum_reduce, .ref = r_sum_reduce)

static lm_tensor b_max_reduce(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_add(lm_max_reduce(x[0], 1), lm_sum_reduce(lm_max_reduce(x[0], 0), 0));
}
static void r_max_reduce(const double *const *x, double *y) {
  double all = 0;
  for (int k = 0; k < 5; k++) {
    double m = -INFINITY;
    for (int i = 0; i < 4; i++) m = fmax(m, x[0][i * 5 + k]);
    all += m;
  }
  for (int i = 0; i < 4; i++) {
    double m = -INFINITY;
    for (int k = 0; k < 5; k++) m = fmax(m, x[0][i * 5 + k]);
    y[i] = m + all;
  }
}
FD_TEST(grad_primitive, max_reduce_sends_gradient_to_the_arg_max_on_either_axis, 11, .nin = 1,
        .in = {IN2(4, 5, -3, 3, 0)}, .build = b_max_reduce, .ref = r_max_reduce)

static lm_tensor b_contiguous(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_contiguous(lm_permute(x[0], (int[]){1, 0})));
}
static void r_contiguous(const double *const *x, double *y) {
  for (int j = 0; j < 4; j++)
    for (int i = 0; i < 3; i++) y[j * 3 + i] = sin(x[0][i * 4 + j]);
}
FD_TEST(grad_primitive, contiguous_is_the_identity, 12, .nin = 1, .in = {IN2(3, 4, -2, 2, 0)}, .build = b_contiguous,
        .ref = r_contiguous)

/* Ties of MAX_REDUCE split the gradient equally between the maxima. */
Test(grad_primitive, max_reduce_splits_the_gradient_equally_between_tied_maxima) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){3, 4});
  lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 1, (lm_dim[]){3});
  lm_tensor loss = sum_all(lm_mul(lm_max_reduce(x, 1), w)), gx;
  cr_assert(lm_grad(loss, &x, 1, &gx) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_output(gx, "gx") == LM_OK);
  float xs[12] = {3, 3, 1, -2, /**/ 2, 5, 5, 5, /**/ -1, -4, -1.5f, -3}, ws[3] = {0.75f, -1.5f, 2};
  float got[12];
  double want[12] = {0.375, 0.375, 0, 0, /**/ 0, -0.5, -0.5, -0.5, /**/ 2, 0, 0, 0};
  const char *backends[2] = {"ref", "cpu"};
  for (int b = 0; b < 1 + have_cpu(); b++) {
    check_prog p = check_prog_new(g, backends[b]);
    check_prog_run(&p, NULL, 0, (check_buf[]){{"x", xs, 12}, {"w", ws, 3}}, 2, (check_buf[]){{"gx", got, 12}}, 1);
    check_prog_free(&p);
    check_close(backends[b], got, want, 12, 1e-7, 0);
  }
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- views */

static lm_tensor b_permute(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_permute(x[0], (int[]){2, 0, 1});
}
static void r_permute(const double *const *x, double *y) { /* y[a][b][c] = x[b][c][a], x [2,3,4] */
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 2; b++)
      for (int c = 0; c < 3; c++) y[(a * 2 + b) * 3 + c] = x[0][(b * 3 + c) * 4 + a];
}
FD_TEST(grad_view, permute_is_undone_by_the_inverse_permutation, 20, .nin = 1, .in = {IN3(2, 3, 4, -2, 2, 0)},
        .build = b_permute, .ref = r_permute)

static lm_tensor b_expand(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_expand(x[0], 1, 5));
}
static void r_expand(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++)
      for (int k = 0; k < 4; k++) y[(i * 5 + j) * 4 + k] = sin(x[0][i * 4 + k]);
}
FD_TEST(grad_view, expand_is_summed_over_the_new_axis, 21, .nin = 1, .in = {IN2(3, 4, -2, 2, 0)}, .build = b_expand,
        .ref = r_expand)

static lm_tensor b_broadcast(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_broadcast_to(x[0], 3, (lm_dim[]){2, 3, 4});
}
static void r_broadcast(const double *const *x, double *y) {
  for (int a = 0; a < 2; a++)
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 4; k++) y[(a * 3 + i) * 4 + k] = x[0][i];
}
FD_TEST(grad_view, broadcast_of_an_extent_1_axis_and_a_new_leading_axis_is_summed, 22, .nin = 1,
        .in = {IN2(3, 1, -2, 2, 0)}, .build = b_broadcast, .ref = r_broadcast)

static lm_tensor b_slice(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_exp(lm_slice(x[0], 1, 1, 4));
}
static void r_slice(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) y[i * 3 + j] = exp(x[0][i * 5 + j + 1]);
}
FD_TEST(grad_view, slice_is_undone_by_zero_padding, 23, .nin = 1, .in = {IN2(3, 5, -2, 2, 0)}, .build = b_slice,
        .ref = r_slice)

static lm_tensor b_pad(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_exp(lm_pad(x[0], 0, 1, 2));
}
static void r_pad(const double *const *x, double *y) {
  for (int i = 0; i < 6; i++)
    for (int k = 0; k < 4; k++) y[i * 4 + k] = exp(i >= 1 && i < 4 ? x[0][(i - 1) * 4 + k] : 0);
}
FD_TEST(grad_view, pad_is_undone_by_slicing, 24, .nin = 1, .in = {IN2(3, 4, -2, 2, 0)}, .build = b_pad, .ref = r_pad)

static lm_tensor b_reshape(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  lm_tensor a = lm_reshape(x[0], 2, (lm_dim[]){4, 6});
  lm_tensor b = lm_reshape(lm_permute(x[0], (int[]){1, 0, 2}), 2, (lm_dim[]){4, 6});
  return lm_mul(lm_sin(a), b);
}
static void r_reshape(const double *const *x, double *y) { /* x [2,3,4] */
  for (int f = 0; f < 24; f++) {
    int j = f / 8, i = (f / 4) % 2, k = f % 4; /* permuted [3,2,4] row-major */
    y[f] = sin(x[0][f]) * x[0][(i * 3 + j) * 4 + k];
  }
}
FD_TEST(grad_view, reshape_is_undone_by_reshaping_back_also_after_a_permute, 25, .nin = 1,
        .in = {IN3(2, 3, 4, -2, 2, 0)}, .build = b_reshape, .ref = r_reshape)

/* affine_mod along axis 0 of [n,3]: y[i][k] = x[(a*i + b) % n][k], and along axis 1 of [3,n]. */
static void affine_ref(const double *x, double *y, int n, int a, int b, int axis) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 3; k++) {
      int s = (a * i + b) % n;
      if (axis == 0) y[i * 3 + k] = sin(x[s * 3 + k]);
      else y[k * n + i] = sin(x[k * n + s]);
    }
}
static lm_tensor b_aff_perm(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_affine_mod(x[0], 0, 3, 2));
}
/* i -> (3i + 2) mod 7 is a permutation that is not its own inverse */
static void r_aff_perm(const double *const *x, double *y) { affine_ref(x[0], y, 7, 3, 2, 0); }
FD_TEST(grad_view, affine_mod_permutation_is_undone_by_the_inverse_affine_map, 26, .nin = 1,
        .in = {IN2(7, 3, -2, 2, 0)}, .build = b_aff_perm, .ref = r_aff_perm)

static lm_tensor b_aff_big(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_affine_mod(x[0], 0, 7, 9));
}
static void r_aff_big(const double *const *x, double *y) { affine_ref(x[0], y, 5, 7, 9, 0); }
FD_TEST(grad_view, affine_mod_with_coefficients_above_the_extent, 27, .nin = 1, .in = {IN2(5, 3, -2, 2, 0)},
        .build = b_aff_big, .ref = r_aff_big)

static lm_tensor b_aff_nonperm0(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_affine_mod(x[0], 0, 2, 1));
}
static void r_aff_nonperm0(const double *const *x, double *y) { affine_ref(x[0], y, 6, 2, 1, 0); }
FD_TEST(grad_view, affine_mod_non_permutation_scatters_with_a_selection_mask_axis0, 28, .nin = 1,
        .in = {IN2(6, 3, -2, 2, 0)}, .build = b_aff_nonperm0, .ref = r_aff_nonperm0)

static lm_tensor b_aff_nonperm1(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_affine_mod(x[0], 1, 3, 2));
}
static void r_aff_nonperm1(const double *const *x, double *y) { affine_ref(x[0], y, 6, 3, 2, 1); }
FD_TEST(grad_view, affine_mod_non_permutation_scatters_with_a_selection_mask_last_axis, 29, .nin = 1,
        .in = {IN2(3, 6, -2, 2, 0)}, .build = b_aff_nonperm1, .ref = r_aff_nonperm1)

static lm_tensor b_aff_sym(lm_graph_t *g, const lm_tensor *x) {
  return lm_sin(lm_affine_mod(x[0], 0, lm_sym_min(g, "a", 0), lm_sym_min(g, "b", 0)));
}
static void r_aff_sym(const double *const *x, double *y) { affine_ref(x[0], y, 7, 3, 2, 0); }
FD_TEST(grad_view, affine_mod_with_symbolic_coefficients_and_extent, 30,
        .nin = 1, .in = {{.rank = 2, .shape = {7, 3}, .sym = {"N"}, .lo = -2, .hi = 2}}, .build = b_aff_sym,
        .ref = r_aff_sym, .syms = {{"a", 3}, {"b", 2}}, .nsyms = 2)

/* a = 0: every row reads row b, so row b collects the whole gradient */
static lm_tensor b_aff_zero(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_affine_mod(x[0], 0, 0, 2));
}
static void r_aff_zero(const double *const *x, double *y) { affine_ref(x[0], y, 4, 0, 2, 0); }
FD_TEST(grad_view, affine_mod_with_a_zero_collects_every_row_in_one, 34, .nin = 1, .in = {IN2(4, 3, -2, 2, 0)},
        .build = b_aff_zero, .ref = r_aff_zero)

/* x [2,3,4] -> permute {1,2,0} [3,4,2] -> slice ax1 [1,4) [3,3,2] -> reshape [9,2] -> expand ax1 2
 * [9,2,2] -> pad ax2 (1,0) [9,2,3] -> affine_mod ax0 (4, 3) [9,2,3], then sin. */
static lm_tensor b_chain1(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  lm_tensor t = lm_permute(x[0], (int[]){1, 2, 0});
  t = lm_slice(t, 1, 1, 4);
  t = lm_reshape(t, 2, (lm_dim[]){9, 2});
  t = lm_expand(t, 1, 2);
  t = lm_pad(t, 2, 1, 0);
  t = lm_affine_mod(t, 0, 4, 3);
  return lm_sin(t);
}
static void r_chain1(const double *const *x, double *y) {
  for (int i = 0; i < 9; i++)
    for (int e = 0; e < 2; e++)
      for (int c = 0; c < 3; c++) {
        int r = (4 * i + 3) % 9; /* row of the [9,2] reshape */
        double v = 0;
        if (c >= 1) {
          int q = r * 2 + (c - 1);              /* flat index into [3,3,2] */
          int p0 = q / 6, p1 = (q / 2) % 3, p2 = q % 2; /* [3,3,2] */
          int j = p0, k = p1 + 1, a = p2;      /* permuted [3,4,2]: x[a][j][k] */
          v = x[0][(a * 3 + j) * 4 + k];
        }
        y[(i * 2 + e) * 3 + c] = sin(v);
      }
}
FD_TEST(grad_view, chain_of_permute_slice_reshape_expand_pad_affine_mod, 31, .nin = 1,
        .in = {IN3(2, 3, 4, -2, 2, 0)}, .build = b_chain1, .ref = r_chain1)

/* x [4,6] -> affine_mod ax1 (2, 3) (not a permutation) -> reshape [2,2,6] -> permute {2,0,1}
 * [6,2,2] -> slice ax0 [1,5) [4,2,2] -> expand ax3 3 [4,2,2,3], times itself plus x's sum. */
static lm_tensor b_chain2(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  lm_tensor t = lm_affine_mod(x[0], 1, 2, 3);
  t = lm_reshape(t, 3, (lm_dim[]){2, 2, 6});
  t = lm_permute(t, (int[]){2, 0, 1});
  t = lm_slice(t, 0, 1, 5);
  t = lm_expand(t, 3, 3);
  return lm_mul(t, t);
}
static void r_chain2(const double *const *x, double *y) {
  for (int s = 0; s < 4; s++)
    for (int a = 0; a < 2; a++)
      for (int b = 0; b < 2; b++)
        for (int e = 0; e < 3; e++) {
          int c = s + 1; /* [2,2,6][a][b][c] = affine[(a*2+b)][c] */
          int row = a * 2 + b, col = (2 * c + 3) % 6;
          double v = x[0][row * 6 + col];
          y[((s * 2 + a) * 2 + b) * 3 + e] = v * v;
        }
}
FD_TEST(grad_view, chain_through_a_non_permutation_affine_mod_reshape_permute_slice_expand, 32, .nin = 1,
        .in = {IN2(4, 6, -2, 2, 0)}, .build = b_chain2, .ref = r_chain2)

/* Symbolic extent N = 5: x [N,3] -> slice ax0 [1,N) -> pad ax0 (2,1) [N+2,3] -> expand ax0 N. */
static lm_tensor b_sym_views(lm_graph_t *g, const lm_tensor *x) {
  lm_dim n = lm_sym(g, "N");
  lm_tensor t = lm_pad(lm_slice(x[0], 0, 1, n), 0, 2, 1);
  return lm_exp(lm_expand(t, 0, n));
}
static void r_sym_views(const double *const *x, double *y) {
  for (int m = 0; m < 5; m++)
    for (int i = 0; i < 7; i++)
      for (int k = 0; k < 3; k++) y[(m * 7 + i) * 3 + k] = exp(i >= 2 && i < 6 ? x[0][(i - 1) * 3 + k] : 0);
}
FD_TEST(grad_view, slice_pad_expand_with_symbolic_extents, 33,
        .nin = 1, .in = {{.rank = 2, .shape = {5, 3}, .sym = {"N"}, .lo = -2, .hi = 2}}, .build = b_sym_views,
        .ref = r_sym_views)

/* ---------------------------------------------------------------- high-level ops (lumen/ops.h) */

B1(b_neg, lm_neg(x[0]))
B1(b_add_scalar, lm_add_scalar(x[0], 0.375f))
B1(b_mul_scalar, lm_mul_scalar(x[0], -1.5f))
B1(b_square, lm_square(x[0]))
B1(b_cube, lm_pow_int(x[0], 3))
B1(b_pow_m2, lm_pow_int(x[0], -2))
B1(b_abs, lm_abs(x[0]))
B1(b_sign, lm_sign(x[0]))
B1(b_floor, lm_floor(x[0]))
B1(b_round, lm_round(x[0]))
B1(b_exp, lm_exp(x[0]))
B1(b_log, lm_log(x[0]))
B1(b_cos, lm_cos(x[0]))
B1(b_tanh, lm_tanh(x[0]))
B1(b_sigmoid, lm_sigmoid(x[0]))
B1(b_relu, lm_relu(x[0]))
B1(b_clamp, lm_clamp(x[0], -1, 1))
B1(b_div, lm_div(x[0], x[1]))
B1(b_lt, lm_lt(x[0], x[1]))
B1(b_gt, lm_gt(x[0], x[1]))
B1(b_le, lm_le(x[0], x[1]))
B1(b_ge, lm_ge(x[0], x[1]))
B1(b_eq, lm_eq(x[0], x[1]))
B1(b_ne, lm_ne(x[0], x[1]))
B1(b_minimum, lm_minimum(x[0], x[1]))
B1(b_maximum, lm_maximum(x[0], x[1]))

#define UNARY(test, seed, b, r, lo, hi, ma, ...)                                                                      \
  FD_TEST(grad_op, test, seed, .nin = 1, .in = {IN2(3, 4, lo, hi, ma)}, .build = b, .ref = r, __VA_ARGS__)
#define BINARY(test, seed, b, r, lo, hi, ma, ...)                                                                     \
  FD_TEST(grad_op, test, seed, .nin = 2, .in = {IN2(3, 4, lo, hi, ma), IN2(3, 4, lo, hi, ma)}, .build = b, .ref = r,  \
          __VA_ARGS__)

UNARY(neg, 40, b_neg, r_neg, -3, 3, 0)
UNARY(add_scalar, 41, b_add_scalar, r_add_scalar, -3, 3, 0)
UNARY(mul_scalar, 42, b_mul_scalar, r_mul_scalar, -3, 3, 0)
UNARY(square, 43, b_square, r_square, -3, 3, 0)
UNARY(pow_int_3, 44, b_cube, r_cube, -2, 2, 0)
UNARY(pow_int_minus_2, 45, b_pow_m2, r_pow_m2, -2, 2, 0.4)
UNARY(abs_away_from_zero, 46, b_abs, r_abs, -3, 3, 0.05)
UNARY(sign_has_zero_gradient, 47, b_sign, r_sign, -3, 3, 0.05)
FD_TEST(grad_op, floor_has_zero_gradient, 48, .nin = 1,
        .in = {{.rank = 2, .shape = {3, 4}, .lo = -4, .hi = 4, .grid = 1, .gap = 0.05}}, .build = b_floor,
        .ref = r_floor)
FD_TEST(grad_op, round_has_zero_gradient, 49, .nin = 1,
        .in = {{.rank = 2, .shape = {3, 4}, .lo = -4, .hi = 4, .grid = 1, .offset = 0.5, .gap = 0.05}},
        .build = b_round, .ref = r_round)
UNARY(exp, 50, b_exp, r_exp, -3, 3, 0)
UNARY(log, 51, b_log, r_log, 0.2, 4, 0)
UNARY(cos, 52, b_cos, r_cos, -4, 4, 0)
UNARY(tanh, 53, b_tanh, r_tanh, -3, 3, 0)
UNARY(sigmoid, 54, b_sigmoid, r_sigmoid, -4, 4, 0)
UNARY(relu_away_from_zero, 55, b_relu, r_relu, -3, 3, 0.05)
FD_TEST(grad_op, clamp_away_from_its_bounds, 56, .nin = 1,
        .in = {{.rank = 2, .shape = {3, 4}, .lo = -2, .hi = 2, .grid = 2, .offset = 1, .gap = 0.05}},
        .build = b_clamp, .ref = r_clamp)
BINARY(div, 57, b_div, r_div, -3, 3, 0.3)
BINARY(lt_has_zero_gradient, 58, b_lt, r_lt, -3, 3, 0)
BINARY(gt_has_zero_gradient, 59, b_gt, r_gt, -3, 3, 0)
BINARY(le_has_zero_gradient, 60, b_le, r_le, -3, 3, 0)
BINARY(ge_has_zero_gradient, 61, b_ge, r_ge, -3, 3, 0)
BINARY(eq_has_zero_gradient, 62, b_eq, r_eq, -3, 3, 0)
BINARY(ne_has_zero_gradient, 63, b_ne, r_ne, -3, 3, 0)

/* minimum / maximum with |a - b| >= 0.1 (away from the tie) */
static void fill_apart(check_rng *r, float *const *x, const size_t *n) {
  for (size_t i = 0; i < n[0]; i++) x[1][i] = x[0][i] + (float)(check_uniform(r, 0.1, 1.5) * (check_next(r) & 1 ? 1 : -1));
}
BINARY(minimum_away_from_ties, 64, b_minimum, r_min, -3, 3, 0, .fill = fill_apart)
BINARY(maximum_away_from_ties, 65, b_maximum, r_max, -3, 3, 0, .fill = fill_apart)

static lm_tensor b_sub(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sub(x[0], x[1]);
}
static void r_sub(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) y[i * 4 + k] = x[0][i * 4 + k] - x[1][k];
}
FD_TEST(grad_op, sub_with_broadcast, 66, .nin = 2, .in = {IN2(3, 4, -2, 2, 0), IN1(4, -2, 2, 0)}, .build = b_sub,
        .ref = r_sub)

/* where(cond [3,4], a [3,4], b [4]) */
static lm_tensor b_where(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_where(x[0], x[1], x[2]);
}
static void r_where(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) y[i * 4 + k] = x[0][i * 4 + k] != 0 ? x[1][i * 4 + k] : x[2][k];
}
FD_TEST(grad_op, where_routes_the_gradient_to_the_branch_taken, 67, .nin = 3,
        .in = {{.rank = 2, .shape = {3, 4}, .lo = -1, .hi = 1, .grid = 2, .offset = 0, .gap = 0.3},
               IN2(3, 4, -2, 2, 0), IN1(4, -2, 2, 0)},
        .build = b_where, .ref = r_where)

/* reductions over [3,4] */
static void red_ref(const double *x, double *y, int axis, double (*f)(const double *, int, int)) {
  if (axis == 1)
    for (int i = 0; i < 3; i++) y[i] = f(x + i * 4, 4, 1);
  else
    for (int k = 0; k < 4; k++) y[k] = f(x + k, 3, 4);
}
static double f_sum(const double *x, int n, int s) {
  double t = 0;
  for (int i = 0; i < n; i++) t += x[i * s];
  return t;
}
static double f_max(const double *x, int n, int s) {
  double t = -INFINITY;
  for (int i = 0; i < n; i++) t = fmax(t, x[i * s]);
  return t;
}
static double f_min(const double *x, int n, int s) {
  double t = INFINITY;
  for (int i = 0; i < n; i++) t = fmin(t, x[i * s]);
  return t;
}
static double f_mean(const double *x, int n, int s) { return f_sum(x, n, s) / n; }
static double f_var(const double *x, int n, int s) {
  double m = f_mean(x, n, s), t = 0;
  for (int i = 0; i < n; i++) t += (x[i * s] - m) * (x[i * s] - m);
  return t / n;
}
static double f_lse(const double *x, int n, int s) {
  double t = 0;
  for (int i = 0; i < n; i++) t += exp(x[i * s]);
  return log(t);
}
B1(b_sum1k, lm_sum(x[0], 1, 1))
B1(b_max0, lm_max(x[0], 0, 0))
B1(b_min1k, lm_min(x[0], -1, 1))
B1(b_mean1, lm_mean(x[0], 1, 0))
B1(b_var1, lm_var(x[0], 1, 0))
B1(b_var0, lm_var(x[0], 0, 1))
B1(b_lse1, lm_logsumexp(x[0], 1, 0))
B1(b_lse0, lm_logsumexp(x[0], 0, 1))
static void r_sum1(const double *const *x, double *y) { red_ref(x[0], y, 1, f_sum); }
static void r_max0(const double *const *x, double *y) { red_ref(x[0], y, 0, f_max); }
static void r_min1(const double *const *x, double *y) { red_ref(x[0], y, 1, f_min); }
static void r_mean1(const double *const *x, double *y) { red_ref(x[0], y, 1, f_mean); }
static void r_var1(const double *const *x, double *y) { red_ref(x[0], y, 1, f_var); }
static void r_var0(const double *const *x, double *y) { red_ref(x[0], y, 0, f_var); }
static void r_lse1(const double *const *x, double *y) { red_ref(x[0], y, 1, f_lse); }
static void r_lse0(const double *const *x, double *y) { red_ref(x[0], y, 0, f_lse); }
UNARY(sum_keepdim, 70, b_sum1k, r_sum1, -3, 3, 0)
UNARY(max_over_axis_0, 71, b_max0, r_max0, -3, 3, 0)
UNARY(min_over_last_axis_keepdim, 72, b_min1k, r_min1, -3, 3, 0)
UNARY(mean, 73, b_mean1, r_mean1, -3, 3, 0)
UNARY(var_over_axis_1, 74, b_var1, r_var1, -3, 3, 0)
UNARY(var_over_axis_0_keepdim, 75, b_var0, r_var0, -3, 3, 0)
UNARY(logsumexp_over_axis_1, 76, b_lse1, r_lse1, -3, 3, 0)
UNARY(logsumexp_over_axis_0_keepdim, 77, b_lse0, r_lse0, -3, 3, 0)

B1(b_softmax1, lm_softmax(x[0], 1))
B1(b_log_softmax0, lm_log_softmax(x[0], 0))
B1(b_cumsum1, lm_cumsum(x[0], 1))
static void r_softmax1(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++) {
    double s = 0;
    for (int k = 0; k < 4; k++) s += exp(x[0][i * 4 + k]);
    for (int k = 0; k < 4; k++) y[i * 4 + k] = exp(x[0][i * 4 + k]) / s;
  }
}
static void r_log_softmax0(const double *const *x, double *y) {
  for (int k = 0; k < 4; k++) {
    double s = 0;
    for (int i = 0; i < 3; i++) s += exp(x[0][i * 4 + k]);
    for (int i = 0; i < 3; i++) y[i * 4 + k] = x[0][i * 4 + k] - log(s);
  }
}
static void r_cumsum1(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++) {
    double s = 0;
    for (int k = 0; k < 4; k++) y[i * 4 + k] = s += x[0][i * 4 + k];
  }
}
UNARY(softmax, 78, b_softmax1, r_softmax1, -3, 3, 0)
UNARY(log_softmax_over_axis_0, 79, b_log_softmax0, r_log_softmax0, -3, 3, 0)
UNARY(cumsum, 80, b_cumsum1, r_cumsum1, -3, 3, 0)

static lm_tensor b_matmul(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_matmul(x[0], x[1]);
}
static void r_matmul(const double *const *x, double *y) { /* [3,4] x [4,5] */
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++) {
      double s = 0;
      for (int k = 0; k < 4; k++) s += x[0][i * 4 + k] * x[1][k * 5 + j];
      y[i * 5 + j] = s;
    }
}
FD_TEST(grad_op, matmul, 81, .nin = 2, .in = {IN2(3, 4, -2, 2, 0), IN2(4, 5, -2, 2, 0)}, .build = b_matmul,
        .ref = r_matmul)
static void r_matmul_batch(const double *const *x, double *y) { /* [2,3,4] x [4,2] */
  for (int b = 0; b < 2; b++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++) {
        double s = 0;
        for (int k = 0; k < 4; k++) s += x[0][(b * 3 + i) * 4 + k] * x[1][k * 2 + j];
        y[(b * 3 + i) * 2 + j] = s;
      }
}
FD_TEST(grad_op, matmul_with_broadcast_batch_axis, 82, .nin = 2, .in = {IN3(2, 3, 4, -2, 2, 0), IN2(4, 2, -2, 2, 0)},
        .build = b_matmul, .ref = r_matmul_batch)

static lm_tensor b_one_hot(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_mul(lm_one_hot(x[0], 4), lm_exp(x[1]));
}
static void r_one_hot(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) y[i * 4 + k] = (x[0][i] == k) * exp(x[1][i * 4 + k]);
}
FD_TEST(grad_op, one_hot_has_zero_gradient_for_its_indices, 83, .nin = 2, .in = {IDX1(3, 4), IN2(3, 4, -2, 2, 0)},
        .build = b_one_hot, .ref = r_one_hot)

static lm_tensor b_gather(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_gather(x[0], 1, x[1]);
}
static void r_gather(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++) y[i] = x[0][i * 4 + (int)x[1][i]];
}
FD_TEST(grad_op, gather_scatters_to_the_picked_entries, 84, .nin = 2, .in = {IN2(3, 4, -2, 2, 0), IDX1(3, 4)},
        .build = b_gather, .ref = r_gather)

static lm_tensor b_concat(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_concat(x[0], x[1], 1));
}
static void r_concat(const double *const *x, double *y) {
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 6; k++) y[i * 6 + k] = sin(k < 2 ? x[0][i * 2 + k] : x[1][i * 4 + k - 2]);
}
FD_TEST(grad_op, concat, 85, .nin = 2, .in = {IN2(3, 2, -2, 2, 0), IN2(3, 4, -2, 2, 0)}, .build = b_concat,
        .ref = r_concat)

static lm_tensor b_transpose(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_sin(lm_transpose(x[0], 0, 2));
}
static void r_transpose(const double *const *x, double *y) { /* [2,3,4] -> [4,3,2] */
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 2; c++) y[(a * 3 + b) * 2 + c] = sin(x[0][(c * 3 + b) * 4 + a]);
}
FD_TEST(grad_op, transpose, 86, .nin = 1, .in = {IN3(2, 3, 4, -2, 2, 0)}, .build = b_transpose, .ref = r_transpose)

B1(b_unsqueeze, lm_sin(lm_unsqueeze(x[0], 1)))
B1(b_squeeze, lm_sin(lm_squeeze(x[0], 1)))
static void r_sin12(const double *const *x, double *y) {
  for (int i = 0; i < 12; i++) y[i] = sin(x[0][i]);
}
UNARY(unsqueeze, 87, b_unsqueeze, r_sin12, -2, 2, 0)
FD_TEST(grad_op, squeeze, 88, .nin = 1, .in = {IN3(3, 1, 4, -2, 2, 0)}, .build = b_squeeze, .ref = r_sin12)

/* A tensor feeding several consumers (and one edge twice) accumulates every contribution. */
static lm_tensor b_fanout(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_add(lm_add(lm_mul(x[0], x[0]), lm_sin(x[0])), x[0]);
}
UNARY(fan_out_accumulates_every_use, 89, b_fanout, r_detach_mix, -3, 3, 0)

/* ---------------------------------------------------------------- losses (lumen/loss.h) */

static lm_tensor b_mse(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_mse(x[0], x[1]);
}
static void r_mse(const double *const *x, double *y) {
  double s = 0;
  for (int i = 0; i < 12; i++) s += (x[0][i] - x[1][i]) * (x[0][i] - x[1][i]);
  y[0] = s / 12;
}
FD_TEST(grad_loss, mse, 100, .nin = 2, .in = {IN2(4, 3, -2, 2, 0), IN2(4, 3, -2, 2, 0)}, .build = b_mse,
        .ref = r_mse)

static lm_tensor b_huber(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_huber(x[0], x[1], 0.8f);
}
static void r_huber(const double *const *x, double *y) {
  double s = 0, d = 0.8f;
  for (int i = 0; i < 12; i++) {
    double e = fabs(x[0][i] - x[1][i]);
    s += e <= d ? 0.5 * e * e : d * (e - 0.5 * d);
  }
  y[0] = s / 12;
}
/* pred - target stays 0.05 away from 0 and +-delta */
static void fill_huber(check_rng *r, float *const *x, const size_t *n) {
  for (size_t i = 0; i < n[0]; i++) {
    double d;
    do d = check_uniform(r, -2, 2);
    while (fabs(d) < 0.05 || fabs(fabs(d) - 0.8) < 0.05);
    x[1][i] = (float)(x[0][i] - d);
  }
}
FD_TEST(grad_loss, huber_inside_and_outside_delta, 101, .nin = 2, .in = {IN2(4, 3, -2, 2, 0), IN2(4, 3, -2, 2, 0)},
        .build = b_huber, .ref = r_huber, .fill = fill_huber)

static void log_softmax_row(const double *z, int n, double *out) {
  double m = -INFINITY, s = 0;
  for (int k = 0; k < n; k++) m = fmax(m, z[k]);
  for (int k = 0; k < n; k++) s += exp(z[k] - m);
  for (int k = 0; k < n; k++) out[k] = z[k] - m - log(s);
}
static lm_tensor b_xent(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_cross_entropy(x[0], x[1]);
}
static void r_xent(const double *const *x, double *y) {
  double s = 0, lp[5];
  for (int b = 0; b < 4; b++) {
    log_softmax_row(x[0] + b * 5, 5, lp);
    s -= lp[(int)x[1][b]];
  }
  y[0] = s / 4;
}
FD_TEST(grad_loss, cross_entropy_with_logits, 102, .nin = 2, .in = {IN2(4, 5, -3, 3, 0), IDX1(4, 5)},
        .build = b_xent, .ref = r_xent)

static lm_tensor b_cat_logp(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_categorical_log_prob(x[0], x[1]);
}
static void r_cat_logp(const double *const *x, double *y) {
  double lp[5];
  for (int b = 0; b < 4; b++) {
    log_softmax_row(x[0] + b * 5, 5, lp);
    y[b] = lp[(int)x[1][b]];
  }
}
FD_TEST(grad_loss, categorical_log_prob, 103, .nin = 2, .in = {IN2(4, 5, -3, 3, 0), IDX1(4, 5)},
        .build = b_cat_logp, .ref = r_cat_logp)

static lm_tensor b_cat_ent(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_categorical_entropy(x[0]);
}
static void r_cat_ent(const double *const *x, double *y) {
  double lp[5];
  for (int b = 0; b < 4; b++) {
    log_softmax_row(x[0] + b * 5, 5, lp);
    double h = 0;
    for (int k = 0; k < 5; k++) h -= exp(lp[k]) * lp[k];
    y[b] = h;
  }
}
FD_TEST(grad_loss, categorical_entropy, 104, .nin = 1, .in = {IN2(4, 5, -3, 3, 0)}, .build = b_cat_ent,
        .ref = r_cat_ent)

#define HALF_LOG_2PI 0.91893853320467274178
static lm_tensor b_gauss_logp(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_gaussian_log_prob(x[0], x[1], x[2]);
}
static void r_gauss_logp(const double *const *x, double *y) { /* mean [4,3], log_std [3], x [4,3] */
  for (int b = 0; b < 4; b++) {
    double s = 0;
    for (int a = 0; a < 3; a++) {
      double z = (x[2][b * 3 + a] - x[0][b * 3 + a]) / exp(x[1][a]);
      s += -0.5 * z * z - x[1][a] - HALF_LOG_2PI;
    }
    y[b] = s;
  }
}
FD_TEST(grad_loss, gaussian_log_prob_wrt_mean_log_std_and_sample, 105, .nin = 3,
        .in = {IN2(4, 3, -2, 2, 0), IN1(3, -1, 0.5, 0), IN2(4, 3, -2, 2, 0)}, .build = b_gauss_logp,
        .ref = r_gauss_logp)

static lm_tensor b_gauss_ent(lm_graph_t *g, const lm_tensor *x) {
  (void)g;
  return lm_loss_gaussian_entropy(x[0], x[1]);
}
static void r_gauss_ent(const double *const *x, double *y) {
  for (int b = 0; b < 4; b++) {
    double s = 0;
    for (int a = 0; a < 3; a++) s += 0.5 + HALF_LOG_2PI + x[1][a];
    y[b] = s;
  }
}
FD_TEST(grad_loss, gaussian_entropy_depends_on_log_std_only, 106, .nin = 2,
        .in = {IN2(4, 3, -2, 2, 0), IN1(3, -1, 0.5, 0)}, .build = b_gauss_ent, .ref = r_gauss_ent)

/* ---------------------------------------------------------------- detach, wrt, higher order */

static void run2(lm_graph_t *g, const char *backend, const check_buf *in, size_t nin, const check_buf *out,
                 size_t nout) {
  check_prog p = check_prog_new(g, backend);
  check_prog_run(&p, NULL, 0, in, nin, out, nout);
  check_prog_free(&p);
}

Test(detach, is_a_bit_exact_identity_for_signed_zeros_infinities_and_nan) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){8});
  cr_assert(lm_output(lm_detach(x), "y") == LM_OK, "%s", lm_last_error());
  float xs[8] = {-0.0f, 0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -3.5f, 3e38f}, ys[8];
  for (int b = 0; b < 1 + have_cpu(); b++) {
    run2(g, b ? "cpu" : "ref", (check_buf[]){{"x", xs, 8}}, 1, (check_buf[]){{"y", ys, 8}}, 1);
    for (int i = 0; i < 8; i++) {
      uint32_t u, v;
      memcpy(&u, &xs[i], 4);
      memcpy(&v, &ys[i], 4);
      if (isnan(xs[i])) cr_assert(isnan(ys[i]), "NaN stays NaN");
      else cr_assert_eq(u, v, "[%d]: %a became %a", i, (double)xs[i], (double)ys[i]);
    }
  }
  lm_graph_free(g);
}

Test(detach, stops_the_gradient_so_x_times_detach_x_has_gradient_x) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){6}), gx;
  lm_tensor loss = sum_all(lm_mul(x, lm_detach(lm_sin(x))));
  cr_assert(lm_grad(loss, &x, 1, &gx) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_output(gx, "gx") == LM_OK);
  float xs[6] = {0.5f, -1.25f, 2, 3, -0.75f, 1}, gs[6];
  double want[6];
  for (int i = 0; i < 6; i++) want[i] = sinf(xs[i]);
  for (int b = 0; b < 1 + have_cpu(); b++) {
    run2(g, b ? "cpu" : "ref", (check_buf[]){{"x", xs, 6}}, 1, (check_buf[]){{"gx", gs, 6}}, 1);
    check_close("d/dx x * detach(sin x) = sin x", gs, want, 6, 4e-7, 0);
  }
  lm_graph_free(g);
}

Test(detach, costs_nothing_after_canonicalisation) {
  lm_graph_t *a = lm_graph_new(), *b = lm_graph_new();
  lm_tensor xa = lm_input(a, "x", LM_ROLE_DATA, 1, (lm_dim[]){4});
  lm_tensor xb = lm_input(b, "x", LM_ROLE_DATA, 1, (lm_dim[]){4});
  cr_assert(lm_output(lm_exp(xa), "y") == LM_OK);
  cr_assert(lm_output(lm_exp(lm_detach(xb)), "y") == LM_OK);
  lm_graph_t *ca = lm_canonicalize_ex(a, LM_CANON_EXACT, NULL), *cb = lm_canonicalize_ex(b, LM_CANON_EXACT, NULL);
  cr_assert(ca && cb, "%s", lm_last_error());
  cr_assert_eq(lm_graph_node_count(ca), lm_graph_node_count(cb), "detach left %zu nodes, plain %zu",
               lm_graph_node_count(cb), lm_graph_node_count(ca));
  lm_graph_free(a), lm_graph_free(b), lm_graph_free(ca), lm_graph_free(cb);
}

Test(grad, wrt_an_intermediate_node_and_an_unused_input) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){5});
  lm_tensor u = lm_input(g, "unused", LM_ROLE_PARAM, 2, (lm_dim[]){2, 3});
  lm_tensor z = lm_sin(x);
  lm_tensor loss = sum_all(lm_mul(z, z)), gr[2];
  cr_assert(lm_grad(loss, (lm_tensor[]){z, u}, 2, gr) == LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_rank(gr[1]), 2);
  cr_assert(lm_output(gr[0], "gz") == LM_OK && lm_output(gr[1], "gu") == LM_OK, "%s", lm_last_error());
  float xs[5] = {0.5f, -1, 2, 0.25f, 3}, gz[5], gu[6];
  double wz[5], wu[6] = {0};
  for (int i = 0; i < 5; i++) wz[i] = 2.0 * sinf(xs[i]);
  run2(g, "ref", (check_buf[]){{"x", xs, 5}}, 1, (check_buf[]){{"gz", gz, 5}, {"gu", gu, 6}}, 2);
  check_close("d sum(z^2) / dz = 2z", gz, wz, 5, 1e-6, 0);
  check_close("unused input gets zeros", gu, wu, 6, 0, 0);
  lm_graph_free(g);
}

Test(grad, twice_gives_the_second_derivative) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){5}), g1, g2;
  cr_assert(lm_grad(sum_all(lm_mul(lm_sin(x), x)), &x, 1, &g1) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_grad(sum_all(g1), &x, 1, &g2) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_output(g1, "g1") == LM_OK && lm_output(g2, "g2") == LM_OK);
  float xs[5] = {0.5f, -1, 2, 0.25f, 3}, a[5], b[5];
  double wa[5], wb[5];
  for (int i = 0; i < 5; i++) {
    double v = xs[i];
    wa[i] = cos(v) * v + sin(v);      /* d/dx x sin x */
    wb[i] = -sin(v) * v + 2 * cos(v); /* d2/dx2 */
  }
  for (int k = 0; k < 1 + have_cpu(); k++) {
    run2(g, k ? "cpu" : "ref", (check_buf[]){{"x", xs, 5}}, 1, (check_buf[]){{"g1", a, 5}, {"g2", b, 5}}, 2);
    check_close("first derivative", a, wa, 5, 1e-5, 1e-6);
    check_close("second derivative", b, wb, 5, 1e-5, 1e-6);
  }
  lm_graph_free(g);
}

/* A broadcast over several axes is summed innermost axis first, so the loop nest reads the
 * outermost axis (a batch) outermost: w [3] broadcast to [4, 5, 6, 3] gets, bit for bit,
 * sum over b of (sum over h of (sum over w)). Mixed magnitudes make every other order round
 * differently (checked when this was written: batch innermost differs in all three). */
Test(grad, a_broadcast_over_several_axes_sums_the_innermost_axis_first) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 1, (lm_dim[]){3}), gw;
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 4, (lm_dim[]){4, 5, 6, 3});
  lm_tensor we = lm_expand(lm_expand(lm_expand(w, 0, 6), 0, 5), 0, 4);
  cr_assert(lm_grad(sum_all(lm_mul(we, x)), &w, 1, &gw) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_output(gw, "gw") == LM_OK);
  enum { NX = 4 * 5 * 6 * 3 };
  float xs[NX], ws[3] = {1, 2, 3}, got[3];
  uint32_t s = 12345;
  for (int i = 0; i < NX; i++) {
    s = s * 1664525u + 1013904223u;
    xs[i] = ldexpf((float)(s >> 8) / 16777216.0f - 0.5f, (int)(s % 24) - 4);
  }
  double want[3];
  for (int f = 0; f < 3; f++) {
    float sb = 0;
    for (int b = 0; b < 4; b++) {
      float sh = 0;
      for (int h = 0; h < 5; h++) {
        float sw = 0;
        for (int c = 0; c < 6; c++) sw += xs[((b * 5 + h) * 6 + c) * 3 + f];
        sh += sw;
      }
      sb += sh;
    }
    want[f] = sb;
  }
  for (int k = 0; k < 1 + have_cpu(); k++) {
    run2(g, k ? "cpu" : "ref", (check_buf[]){{"w", ws, 3}, {"x", xs, NX}}, 2, (check_buf[]){{"gw", got, 3}}, 1);
    check_close(k ? "cpu" : "ref", got, want, 3, 0, 0);
  }
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- errors */

Test(grad_error, non_scalar_loss_is_rejected_with_its_shape) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_PARAM, 2, (lm_dim[]){3, 4}), gx = {g, 7, 7};
  cr_assert_eq(lm_grad(lm_sin(x), &x, 1, &gx), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "scalar") && strstr(lm_last_error(), "[3,4]"), "message: %s", lm_last_error());
  cr_assert_eq(gx.node, 0, "grads are left invalid on error");
  lm_graph_free(g);
}

Test(grad_error, wrt_of_another_graph_or_not_a_node_or_a_view_is_rejected) {
  lm_graph_t *g = lm_graph_new(), *h = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor other = lm_input(h, "x", LM_ROLE_PARAM, 1, (lm_dim[]){3}), gx;
  lm_tensor loss = sum_all(lm_exp(x));
  cr_assert_eq(lm_grad(loss, &other, 1, &gx), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "wrt[0]") && strstr(lm_last_error(), "another graph"), "%s", lm_last_error());
  lm_tensor bogus = {g, 9999, 0};
  cr_assert_eq(lm_grad(loss, &bogus, 1, &gx), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "not a node"), "%s", lm_last_error());
  lm_tensor viewed = lm_expand(x, 0, 2);
  cr_assert_eq(lm_grad(loss, (lm_tensor[]){x, viewed}, 2, (lm_tensor[2]){0}), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "wrt[1]") && strstr(lm_last_error(), "view"), "%s", lm_last_error());
  lm_graph_free(g), lm_graph_free(h);
}

Test(grad_error, invalid_loss_or_a_graph_with_an_error_is_reported) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_PARAM, 1, (lm_dim[]){3}), gx;
  lm_tensor loss = sum_all(lm_exp(x));
  lm_tensor bad = lm_add(x, lm_input(g, "y", LM_ROLE_DATA, 1, (lm_dim[]){4})); /* does not broadcast */
  cr_assert_eq(lm_grad(bad, &x, 1, &gx), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "invalid tensor"), "%s", lm_last_error());
  cr_assert_eq(lm_grad(loss, &x, 1, &gx), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "broadcast"), "the graph's error is repeated: %s", lm_last_error());
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- compiled size */

/* The gradient of a 2-layer MLP's MSE loss, with the Adam-free update p - 0.01 g assigned, on
 * cpu: the whole forward + backward should compile to a handful of fused kernels. */
Test(grad_compile, mlp_gradient_compiles_to_a_handful_of_kernels_on_cpu) {
  if (!have_cpu()) cr_skip_test("no cpu backend (no C compiler)");
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){64, 1});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 2, (lm_dim[]){64, 1});
  lm_tensor w1 = lm_input(g, "w1", LM_ROLE_PARAM, 2, (lm_dim[]){1, 32});
  lm_tensor b1 = lm_input(g, "b1", LM_ROLE_PARAM, 1, (lm_dim[]){32});
  lm_tensor w2 = lm_input(g, "w2", LM_ROLE_PARAM, 2, (lm_dim[]){32, 1});
  lm_tensor b2 = lm_input(g, "b2", LM_ROLE_PARAM, 1, (lm_dim[]){1});
  lm_tensor h = lm_tanh(lm_add(lm_matmul(x, w1), b1));
  lm_tensor loss = lm_loss_mse(lm_add(lm_matmul(h, w2), b2), y);
  lm_tensor ps[4] = {w1, b1, w2, b2}, gs[4];
  cr_assert(lm_grad(loss, ps, 4, gs) == LM_OK, "%s", lm_last_error());
  for (int i = 0; i < 4; i++) cr_assert(lm_assign(ps[i], lm_sub(ps[i], lm_mul_scalar(gs[i], 0.01f))) == LM_OK);
  cr_assert(lm_output(loss, "loss") == LM_OK);
  check_prog p = check_prog_new(g, "cpu");
  lm_program_stats st;
  cr_assert(lm_program_get_stats(p.program, &st) == LM_OK, "%s", lm_last_error());
  cr_log_info("2-layer MLP (1-32-1, batch 64) loss + gradient + SGD update: %d kernels on cpu", st.kernels);
  fprintf(stderr, "[grad_compile] 2-layer MLP loss + gradient + update: %d kernels on cpu\n", st.kernels);
  cr_assert(st.kernels <= 12, "%d kernels", st.kernels);
  check_prog_free(&p);
  lm_graph_free(g);
}
