/* compiler/ops.c — the high-level op library of lumen/ops.h: every op is a composition of
 * the primitives and views of lumen/graph.h, so nothing new reaches the compiler. Shape
 * errors the primitives would report confusingly (or not at all, by broadcasting) are
 * checked here and recorded as the graph's sticky error.
 *
 * Semantics and accuracy (float32, finite inputs unless stated):
 * - sub, neg, abs, sign, floor, round, comparisons, where, minimum, maximum, clamp, concat,
 *   one_hot, arange (n <= 2^24) are exact. floor/round of +-inf give NaN (fmod(inf, 1)).
 * - div = a * recip(b): two roundings, <= 1.5 ulp.
 * - exp(x) = exp2(x * log2 e): rounding the argument costs relative error up to about
 *   1.25 * 2^-24 * (|x| + 1) (7e-7 at |x| = 10, 6.5e-6 at |x| = 88, measured on a dense
 *   sweep); log(x) = log2(x) * ln 2: a few ulp.
 * - cos(x) = sin(x + pi/2): the shifted argument is rounded to float, so the error is
 *   absolute, at most 2^-24 * (|x| + 2) (measured up to |x| = 100; 1e-6 at |x| = 15), and
 *   not relative near the zeros of cos.
 * - sigmoid(x) = 1 / (1 + exp(-x)) and tanh(x) = 2 sigmoid(2x) - 1: no NaN for any |x|
 *   (exp2(+large) = inf, recip(inf) = 0), tanh(+-100) = +-1. tanh's error is absolute,
 *   <= 2e-7 (1.8e-7 measured), so its relative error grows like 2e-7 / |x| close to 0.
 * - Both branches of where are evaluated: it computes c*a + (1-c)*b with c in {0, 1}, which
 *   is exact for finite a and b, but an inf or NaN in the branch not taken yields NaN
 *   (0 * inf). The same holds for minimum, maximum, clamp, relu (relu(-inf) is NaN).
 * - Comparisons are built from LESS_THAN alone, so a NaN operand compares as "equal":
 *   lt/gt/ne give 0 and le/ge/eq give 1. where treats a NaN condition as false.
 * - Reductions sum in the backend's order; mean multiplies by a rounded 1/n (constant n)
 *   or by recip(n) computed on the device (symbolic n). var is two-pass.
 * - logsumexp / softmax / log_softmax shift by the max: finite for any finite logits; a
 *   row that is all -inf, or holds +inf, gives NaN.
 * - cumsum, gather and matmul multiply by 0/1 masks or sum products: an inf or NaN
 *   anywhere along the summed axis poisons every output that sums over it (0 * inf).
 * - matmul needs rank >= 2 on both sides (1-D operands are rejected; unsqueeze them).
 *   Batch axes broadcast numpy-style. Its cost is a broadcast product of M*K*N elements.
 * - arange(n) and cumsum use an n x n triangular mask built from views of one constant:
 *   O(n^2) work, meant for the small extents of RL (action counts, horizons). */
#include <stdio.h>

#include "graph-impl.h"
#include "lumen/ops.h"

#define LM_LOG2E 1.44269504088896340736f /* log2(e) */
#define LM_LN2 0.693147180559945309417f  /* ln(2) */
#define LM_PI_2 1.57079632679489661923f  /* pi/2 */

static const lm_tensor invalid = {0};

static int bad(lm_tensor t) { return !lm_tensor_ok(t); }

static lm_tensor cst(lm_tensor like, float v) { return lm_const(like.g, v); }

/* "[N,4]" into buf. */
static const char *shape_text(lm_tensor t, char *buf, size_t cap) {
  size_t len = 0;
  int r = lm_rank(t);
  len += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < r && len < cap; i++) {
    char d[64];
    len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "," : "", lm_dim_str(t.g, lm_dim_of(t, i), d, sizeof d));
  }
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

/* Normalises axis into [0, rank + extra); records an error naming `what` otherwise. */
static int axis_in(lm_tensor x, int axis, int extra, const char *what) {
  int r = lm_rank(x);
  int a = axis < 0 ? axis + r + extra : axis;
  if (a < 0 || a >= r + extra) {
    char s[256];
    lm_graph_error(x.g, 0, "%s: axis %d out of range for shape %s", what, axis, shape_text(x, s, sizeof s));
    return -1;
  }
  return a;
}

/* ---------------------------------------------------------------- constants and ranges */

lm_tensor lm_full(lm_graph_t *g, float value, int rank, const lm_dim *shape) {
  return lm_broadcast_to(lm_const(g, value), rank, shape);
}

lm_tensor lm_scalar_like(lm_tensor like, float value) {
  if (bad(like)) return invalid;
  lm_dim dims[LM_MAX_RANK];
  int r = lm_rank(like);
  for (int i = 0; i < r; i++) dims[i] = lm_dim_of(like, i);
  return lm_full(like.g, value, r, dims);
}

/* The [n, n] mask m[i][j] = (j < i), a view of one constant (no node of its own).
 * p = n zeros then n+1 ones; repeated n times and reread with row length 2n (one less than
 * the period 2n+1), row i starts i places further back in p, so m[i][j] = p[(j - i) mod
 * (2n+1)]: a zero for j >= i (index j-i < n), a one for j < i (index 2n+1+j-i > n). */
static lm_tensor tri_strict(lm_graph_t *g, lm_dim n) {
  lm_dim n1 = lm_dim_add(g, n, 1), n2 = lm_dim_mul(g, n, 2);
  lm_dim period = lm_dim_add(g, n2, 1);
  lm_tensor p = lm_pad(lm_full(g, 1.0f, 1, &n1), 0, n, 0);
  lm_dim flat = lm_dim_mul(g, n, period), used = lm_dim_mul(g, n, n2);
  lm_tensor t = lm_reshape(lm_expand(p, 0, n), 1, &flat);
  lm_dim rows[2] = {n, n2};
  t = lm_reshape(lm_slice(t, 0, 0, used), 2, rows);
  return lm_slice(t, 1, 0, n);
}

/* m[i][j] = (j <= i): rows 1..n, columns 0..n-1 of the strict mask of size n+1. */
static lm_tensor tri_inclusive(lm_graph_t *g, lm_dim n) {
  lm_dim n1 = lm_dim_add(g, n, 1);
  return lm_slice(lm_slice(tri_strict(g, n1), 0, 1, n1), 1, 0, n);
}

/* For a constant n: i as the sum of its binary digits' values, one view per digit k ([0, 2^k]
 * repeated so that entry i reads 2^k exactly where bit k of i is set), so an entry costs about
 * log2(n) additions wherever it is used, not a reduction of n. A symbolic n sums the strict
 * triangular mask instead. */
lm_tensor lm_arange(lm_graph_t *g, lm_dim n) {
  if (!g) return invalid;
  if (n < 0 || n > (1 << 24)) return lm_sum_reduce(tri_strict(g, n), 1);
  if (n <= 1) return lm_full(g, 0.0f, 1, &n);
  lm_tensor acc = invalid;
  for (lm_dim blk = 1; blk < n; blk *= 2) {
    lm_dim reps = (n + 2 * blk - 1) / (2 * blk), flat = reps * 2 * blk;
    lm_tensor bit = lm_pad(lm_full(g, (float)blk, 1, (lm_dim[]){1}), 0, 1, 0); /* [0, blk] */
    lm_tensor t = lm_expand(lm_expand(bit, 0, reps), 2, blk);                  /* [reps, 2, blk] */
    t = lm_slice(lm_reshape(t, 1, &flat), 0, 0, n);
    acc = blk > 1 ? lm_add(acc, t) : t;
  }
  return acc;
}

/* ---------------------------------------------------------------- arithmetic */

lm_tensor lm_add_scalar(lm_tensor x, float c) { return lm_add(x, cst(x, c)); }
lm_tensor lm_mul_scalar(lm_tensor x, float c) { return lm_mul(x, cst(x, c)); }
lm_tensor lm_neg(lm_tensor x) { return lm_mul_scalar(x, -1.0f); }
lm_tensor lm_sub(lm_tensor a, lm_tensor b) { return lm_add(a, lm_neg(b)); }
lm_tensor lm_div(lm_tensor a, lm_tensor b) { return lm_mul(a, lm_recip(b)); }
lm_tensor lm_square(lm_tensor x) { return lm_mul(x, x); }

/* 1 - x for x in {0, 1}: exact. */
static lm_tensor not01(lm_tensor x) { return lm_add_scalar(lm_neg(x), 1.0f); }

lm_tensor lm_pow_int(lm_tensor x, int n) {
  if (bad(x)) return invalid;
  if (n == 0) return lm_scalar_like(x, 1.0f);
  unsigned m = n < 0 ? 0u - (unsigned)n : (unsigned)n;
  /* recip first: x^-n stays representable where x^n would overflow */
  lm_tensor base = n < 0 ? lm_recip(x) : x, acc = invalid;
  for (int have = 0;;) {
    if (m & 1u) acc = have++ ? lm_mul(acc, base) : base;
    m >>= 1;
    if (!m) break;
    base = lm_square(base);
  }
  return acc;
}

lm_tensor lm_sign(lm_tensor x) {
  lm_tensor zero = cst(x, 0.0f);
  return lm_sub(lm_less_than(zero, x), lm_less_than(x, zero));
}

lm_tensor lm_abs(lm_tensor x) { return lm_mul(x, lm_sign(x)); }

/* fmod keeps the dividend's sign, so x - fmod(x, 1) truncates; negative fractions step down. */
lm_tensor lm_floor(lm_tensor x) {
  lm_tensor r = lm_mod(x, cst(x, 1.0f));
  return lm_sub(lm_sub(x, r), lm_less_than(r, cst(x, 0.0f)));
}

/* sign(x) * (trunc|x| + (frac|x| >= 0.5)): exact, unlike floor(|x| + 0.5), which rounds
 * 0.49999997 up because the sum itself rounds to 1. */
lm_tensor lm_round(lm_tensor x) {
  lm_tensor s = lm_sign(x);
  lm_tensor a = lm_mul(x, s);
  lm_tensor r = lm_mod(a, cst(x, 1.0f));
  lm_tensor up = not01(lm_less_than(r, cst(x, 0.5f)));
  return lm_mul(s, lm_add(lm_sub(a, r), up));
}

/* ---------------------------------------------------------------- transcendental */

lm_tensor lm_exp(lm_tensor x) { return lm_exp2(lm_mul_scalar(x, LM_LOG2E)); }
lm_tensor lm_log(lm_tensor x) { return lm_mul_scalar(lm_log2(x), LM_LN2); }
lm_tensor lm_cos(lm_tensor x) { return lm_sin(lm_add_scalar(x, LM_PI_2)); }

lm_tensor lm_sigmoid(lm_tensor x) {
  return lm_recip(lm_add_scalar(lm_exp2(lm_mul_scalar(x, -LM_LOG2E)), 1.0f));
}

lm_tensor lm_tanh(lm_tensor x) {
  return lm_add_scalar(lm_mul_scalar(lm_sigmoid(lm_mul_scalar(x, 2.0f)), 2.0f), -1.0f);
}

/* ---------------------------------------------------------------- comparisons, selection */

lm_tensor lm_lt(lm_tensor a, lm_tensor b) { return lm_less_than(a, b); }
lm_tensor lm_gt(lm_tensor a, lm_tensor b) { return lm_less_than(b, a); }
lm_tensor lm_le(lm_tensor a, lm_tensor b) { return not01(lm_gt(a, b)); }
lm_tensor lm_ge(lm_tensor a, lm_tensor b) { return not01(lm_lt(a, b)); }
/* a < b and b < a never hold together, so their sum is 0 or 1 */
lm_tensor lm_ne(lm_tensor a, lm_tensor b) { return lm_add(lm_lt(a, b), lm_lt(b, a)); }
lm_tensor lm_eq(lm_tensor a, lm_tensor b) { return not01(lm_ne(a, b)); }

/* c ? a : b for c in {0, 1}; exact for finite a, b (see the header comment on inf). */
static lm_tensor select01(lm_tensor c, lm_tensor a, lm_tensor b) {
  return lm_add(lm_mul(c, a), lm_mul(not01(c), b));
}

lm_tensor lm_where(lm_tensor cond, lm_tensor a, lm_tensor b) {
  return select01(lm_ne(cond, cst(cond, 0.0f)), a, b);
}

lm_tensor lm_minimum(lm_tensor a, lm_tensor b) { return select01(lm_lt(b, a), b, a); }
lm_tensor lm_maximum(lm_tensor a, lm_tensor b) { return select01(lm_lt(a, b), b, a); }

lm_tensor lm_clamp(lm_tensor x, float lo, float hi) {
  return lm_minimum(lm_maximum(x, cst(x, lo)), cst(x, hi));
}

lm_tensor lm_relu(lm_tensor x) { return lm_maximum(x, cst(x, 0.0f)); }

/* ---------------------------------------------------------------- reductions */

static lm_tensor keep(lm_tensor r, int axis, int keepdim) { return keepdim ? lm_expand(r, axis, 1) : r; }

lm_tensor lm_sum(lm_tensor x, int axis, int keepdim) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "sum");
  return a < 0 ? invalid : keep(lm_sum_reduce(x, a), a, keepdim);
}

lm_tensor lm_max(lm_tensor x, int axis, int keepdim) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "max");
  return a < 0 ? invalid : keep(lm_max_reduce(x, a), a, keepdim);
}

lm_tensor lm_min(lm_tensor x, int axis, int keepdim) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "min");
  return a < 0 ? invalid : lm_neg(lm_max(lm_neg(x), a, keepdim));
}

/* 1/n for the extent of axis a: a constant, or recip of a sum of n ones when n is symbolic. */
static lm_tensor inv_count(lm_tensor x, int a) {
  lm_dim n = lm_dim_of(x, a);
  if (n >= 0) return cst(x, (float)(1.0 / (double)n));
  return lm_recip(lm_sum_reduce(lm_full(x.g, 1.0f, 1, &n), 0));
}

lm_tensor lm_mean(lm_tensor x, int axis, int keepdim) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "mean");
  if (a < 0) return invalid;
  return lm_mul(lm_sum(x, a, keepdim), inv_count(x, a));
}

lm_tensor lm_var(lm_tensor x, int axis, int keepdim) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "var");
  if (a < 0) return invalid;
  return lm_mean(lm_square(lm_sub(x, lm_mean(x, a, 1))), a, keepdim);
}

/* Shared by logsumexp, softmax and log_softmax: x - max(x) (broadcast back) and the sum
 * of its exponentials (axis removed). */
static int shifted(lm_tensor x, int axis, const char *what, int *a, lm_tensor *z, lm_tensor *m, lm_tensor *s) {
  if (bad(x)) return 0;
  if ((*a = axis_in(x, axis, 0, what)) < 0) return 0;
  *m = lm_max_reduce(x, *a);
  *z = lm_sub(x, lm_expand(*m, *a, 1));
  *s = lm_sum_reduce(lm_exp(*z), *a);
  return lm_tensor_ok(*s);
}

lm_tensor lm_logsumexp(lm_tensor x, int axis, int keepdim) {
  int a;
  lm_tensor z, m, s;
  if (!shifted(x, axis, "logsumexp", &a, &z, &m, &s)) return invalid;
  return keep(lm_add(m, lm_log(s)), a, keepdim);
}

lm_tensor lm_softmax(lm_tensor x, int axis) {
  int a;
  lm_tensor z, m, s;
  if (!shifted(x, axis, "softmax", &a, &z, &m, &s)) return invalid;
  return lm_mul(lm_exp(z), lm_expand(lm_recip(s), a, 1));
}

/* (x - m) - log(sum): subtracting m first keeps large logits accurate. */
lm_tensor lm_log_softmax(lm_tensor x, int axis) {
  int a;
  lm_tensor z, m, s;
  if (!shifted(x, axis, "log_softmax", &a, &z, &m, &s)) return invalid;
  return lm_sub(z, lm_expand(lm_log(s), a, 1));
}

/* y[.., i, rest] = sum_j x[.., j, rest] * (j <= i). */
lm_tensor lm_cumsum(lm_tensor x, int axis) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "cumsum");
  if (a < 0) return invalid;
  int r = lm_rank(x);
  lm_dim n = lm_dim_of(x, a);
  if (r + 1 > LM_MAX_RANK) {
    lm_graph_error(x.g, 0, "cumsum: rank %d leaves no room for the mask axis (max rank %d)", r, LM_MAX_RANK);
    return invalid;
  }
  lm_dim mshape[LM_MAX_RANK] = {n, n};
  for (int i = 2; i < r - a + 1; i++) mshape[i] = 1;
  lm_tensor mask = lm_reshape(tri_inclusive(x.g, n), r - a + 1, mshape);
  return lm_sum_reduce(lm_mul(lm_expand(x, a, n), mask), a + 1);
}

/* ---------------------------------------------------------------- linear algebra */

lm_tensor lm_matmul(lm_tensor a, lm_tensor b) {
  if (bad(a) || bad(b)) return invalid;
  lm_graph_t *g = a.g;
  int ra = lm_rank(a), rb = lm_rank(b);
  char sa[256], sb[256];
  if (b.g != g) return lm_graph_error(g, 0, "matmul: operands belong to different graphs"), invalid;
  if (ra < 2 || rb < 2) {
    lm_graph_error(g, 0, "matmul: operands need rank >= 2 (got %s and %s); unsqueeze vectors first",
                   shape_text(a, sa, sizeof sa), shape_text(b, sb, sizeof sb));
    return invalid;
  }
  if (!lm_dim_equal(g, lm_dim_of(a, -1), lm_dim_of(b, -2))) {
    lm_graph_error(g, 0, "matmul: inner dimensions differ (%s x %s: a's last axis must equal b's second-to-last)",
                   shape_text(a, sa, sizeof sa), shape_text(b, sb, sizeof sb));
    return invalid;
  }
  int batch = (ra > rb ? ra : rb) - 2;
  if (batch + 3 > LM_MAX_RANK) {
    lm_graph_error(g, 0, "matmul: %s x %s needs rank %d, more than %d", shape_text(a, sa, sizeof sa),
                   shape_text(b, sb, sizeof sb), batch + 3, LM_MAX_RANK);
    return invalid;
  }
  for (int i = 1; i <= batch; i++) {
    int ia = ra - 2 - i, ib = rb - 2 - i;
    lm_dim da = ia >= 0 ? lm_dim_of(a, ia) : 1, db = ib >= 0 ? lm_dim_of(b, ib) : 1;
    if (da != 1 && db != 1 && !lm_dim_equal(g, da, db)) {
      lm_graph_error(g, 0, "matmul: batch axes of %s and %s do not broadcast", shape_text(a, sa, sizeof sa),
                     shape_text(b, sb, sizeof sb));
      return invalid;
    }
  }
  /* a -> [.., M, K, N], b -> [.., M, K, N], multiply, sum over K */
  lm_tensor ae = lm_expand(a, ra, lm_dim_of(b, -1));
  lm_tensor be = lm_expand(b, rb - 2, lm_dim_of(a, -2));
  return lm_sum_reduce(lm_mul(ae, be), -2);
}

/* ---------------------------------------------------------------- indexing and layout */

lm_tensor lm_one_hot(lm_tensor idx, lm_dim n) {
  if (bad(idx)) return invalid;
  return lm_eq(lm_expand(idx, lm_rank(idx), 1), lm_arange(idx.g, n));
}

lm_tensor lm_gather(lm_tensor x, int axis, lm_tensor idx) {
  if (bad(x) || bad(idx)) return invalid;
  lm_graph_t *g = x.g;
  int a = axis_in(x, axis, 0, "gather");
  if (a < 0) return invalid;
  int r = lm_rank(x), same = lm_rank(idx) == r - 1 && idx.g == g;
  for (int i = 0, k = 0; i < r && same; i++)
    if (i != a) same = lm_dim_equal(g, lm_dim_of(x, i), lm_dim_of(idx, k++));
  if (!same) {
    char sx[256], si[256];
    lm_graph_error(g, 0, "gather: idx has shape %s but must have x's shape %s without axis %d",
                   shape_text(idx, si, sizeof si), shape_text(x, sx, sizeof sx), a);
    return invalid;
  }
  /* arange along `axis`: [n, 1, .., 1] with one 1 per axis after it */
  lm_dim n = lm_dim_of(x, a), shape[LM_MAX_RANK];
  shape[0] = n;
  for (int i = 1; i < r - a; i++) shape[i] = 1;
  lm_tensor pos = lm_reshape(lm_arange(g, n), r - a, shape);
  lm_tensor hot = lm_eq(lm_expand(idx, a, 1), pos);
  return lm_sum_reduce(lm_mul(x, hot), a);
}

lm_tensor lm_concat(lm_tensor a, lm_tensor b, int axis) {
  if (bad(a) || bad(b)) return invalid;
  lm_graph_t *g = a.g;
  int ax = axis_in(a, axis, 0, "concat");
  if (ax < 0) return invalid;
  int r = lm_rank(a), same = lm_rank(b) == r && b.g == g;
  for (int i = 0; i < r && same; i++)
    if (i != ax) same = lm_dim_equal(g, lm_dim_of(a, i), lm_dim_of(b, i));
  if (!same) {
    char sa[256], sb[256];
    lm_graph_error(g, 0, "concat: shapes %s and %s differ outside axis %d", shape_text(a, sa, sizeof sa),
                   shape_text(b, sb, sizeof sb), ax);
    return invalid;
  }
  lm_dim na = lm_dim_of(a, ax), nb = lm_dim_of(b, ax);
  return lm_add(lm_pad(a, ax, 0, nb), lm_pad(b, ax, na, 0));
}

lm_tensor lm_transpose(lm_tensor x, int axis0, int axis1) {
  if (bad(x)) return invalid;
  int a0 = axis_in(x, axis0, 0, "transpose"), a1 = a0 < 0 ? -1 : axis_in(x, axis1, 0, "transpose");
  if (a1 < 0) return invalid;
  int perm[LM_MAX_RANK];
  for (int i = 0; i < lm_rank(x); i++) perm[i] = i;
  perm[a0] = a1;
  perm[a1] = a0;
  return lm_permute(x, perm);
}

lm_tensor lm_unsqueeze(lm_tensor x, int axis) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 1, "unsqueeze");
  return a < 0 ? invalid : lm_expand(x, a, 1);
}

lm_tensor lm_squeeze(lm_tensor x, int axis) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "squeeze");
  if (a < 0) return invalid;
  if (lm_dim_of(x, a) != 1) {
    char s[256];
    lm_graph_error(x.g, 0, "squeeze: axis %d of %s does not have extent 1", a, shape_text(x, s, sizeof s));
    return invalid;
  }
  lm_dim dims[LM_MAX_RANK];
  int r = lm_rank(x);
  for (int i = 0, k = 0; i < r; i++)
    if (i != a) dims[k++] = lm_dim_of(x, i);
  return lm_reshape(x, r - 1, dims);
}

/* ---------------------------------------------------------------- grids and games */

/* [n, 1, .., 1]: 0 .. n-1 along axis a of a rank-r tensor (broadcasts over the other axes) */
static lm_tensor arange_along(lm_graph_t *g, lm_dim n, int r, int a) {
  lm_dim shape[LM_MAX_RANK];
  shape[0] = n;
  for (int i = 1; i < r - a; i++) shape[i] = 1;
  return lm_reshape(lm_arange(g, n), r - a, shape);
}

lm_tensor lm_roll(lm_tensor x, int axis, lm_dim shift) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "roll");
  if (a < 0) return invalid;
  lm_dim n = lm_dim_of(x, a);
  if (n < 1) return lm_graph_error(x.g, 0, "roll: axis %d needs a constant extent", a), invalid;
  lm_dim b = ((-shift) % n + n) % n; /* y[i] = x[(i - shift) mod n] */
  return b ? lm_affine_mod(x, a, 1, b) : x;
}

lm_tensor lm_count_nonzero(lm_tensor x, int axis) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "count_nonzero");
  return a < 0 ? invalid : lm_sum_reduce(lm_ne(x, cst(x, 0.0f)), a);
}

/* min over the axis of (cond ? i : n), max of (cond ? i : -1): small integers, exact */
static lm_tensor index_where(lm_tensor cond, int axis, int last) {
  if (bad(cond)) return invalid;
  int a = axis_in(cond, axis, 0, last ? "last_index" : "first_index");
  if (a < 0) return invalid;
  lm_dim n = lm_dim_of(cond, a);
  if (n < 1) return lm_graph_error(cond.g, 0, "%s: axis %d needs a constant extent", last ? "last_index" : "first_index", a), invalid;
  lm_tensor i = arange_along(cond.g, n, lm_rank(cond), a);
  lm_tensor at = select01(lm_ne(cond, cst(cond, 0.0f)), i, cst(cond, last ? -1.0f : (float)n));
  return last ? lm_max(at, a, 0) : lm_min(at, a, 0);
}

lm_tensor lm_first_index(lm_tensor cond, int axis) { return index_where(cond, axis, 0); }
lm_tensor lm_last_index(lm_tensor cond, int axis) { return index_where(cond, axis, 1); }

/* ---------------------------------------------------------------- windows and convolution */

/* Stride-1 windows of k along the last axis as views alone (tinygrad's trick): x [.., L] is
 * repeated k times ([.., k, L]), flattened, padded by k and cut into rows of L + 1, so row j is
 * x shifted by j: element (j, t) is x[t + j]; the first L - k + 1 columns are the windows. */
static lm_tensor window_last(lm_tensor x, lm_dim k) {
  int r = lm_rank(x);
  lm_dim d[LM_MAX_RANK];
  for (int i = 0; i < r - 1; i++) d[i] = lm_dim_of(x, i);
  lm_dim L = lm_dim_of(x, r - 1);
  lm_tensor e = lm_expand(x, r - 1, k); /* [.., k, L] */
  d[r - 1] = k * L;
  lm_tensor f = lm_pad(lm_reshape(e, r, d), r - 1, 0, k); /* [.., k (L + 1)] */
  d[r - 1] = k, d[r] = L + 1;
  lm_tensor rows = lm_reshape(f, r + 1, d); /* [.., k, L + 1]: row j starts at x[j] */
  lm_tensor w = lm_slice(rows, r, 0, L - k + 1);   /* [.., k, L - k + 1] */
  return lm_transpose(w, r - 1, r);                /* [.., L - k + 1, k] */
}

lm_tensor lm_window(lm_tensor x, int axis, lm_dim k) {
  if (bad(x)) return invalid;
  int a = axis_in(x, axis, 0, "window");
  if (a < 0) return invalid;
  int r = lm_rank(x);
  lm_dim L = lm_dim_of(x, a);
  if (r + 1 > LM_MAX_RANK) return lm_graph_error(x.g, 0, "window: rank %d leaves no room for the window axis", r), invalid;
  if (L < 1 || k < 1 || k > L)
    return lm_graph_error(x.g, 0, "window: %lld-wide windows along axis %d of extent %lld", (long long)k, a, (long long)L),
           invalid;
  int perm[LM_MAX_RANK];
  for (int i = 0, j = 0; i < r; i++) /* the axis last, the others in order */
    if (i != a) perm[j++] = i;
  perm[r - 1] = a;
  lm_tensor w = window_last(lm_permute(x, perm), k); /* [others.., L - k + 1, k] */
  int back[LM_MAX_RANK]; /* the axes before a, the window start t, its offset j, the axes after a */
  for (int i = 0; i < a; i++) back[i] = i;
  back[a] = r - 1, back[a + 1] = r;
  for (int i = a; i < r - 1; i++) back[i + 2] = i;
  return lm_permute(w, back);
}

lm_tensor lm_conv2d(lm_tensor x, lm_tensor w, int kh, int kw) {
  if (bad(x) || bad(w)) return invalid;
  lm_graph_t *g = x.g;
  char sx[256], sw[256];
  if (lm_rank(x) != 4 || lm_rank(w) != 2 || lm_dim_of(x, 3) < 1 || kh < 1 || kw < 1 || kh % 2 == 0 || kw % 2 == 0 ||
      lm_dim_of(w, 0) != (lm_dim)kh * kw * lm_dim_of(x, 3)) {
    lm_graph_error(g, 0, "conv2d: x %s [B, H, W, C] and w %s [%d*%d*C, F] with odd kernel sides do not fit",
                   shape_text(x, sx, sizeof sx), shape_text(w, sw, sizeof sw), kh, kw);
    return invalid;
  }
  lm_dim B = lm_dim_of(x, 0), H = lm_dim_of(x, 1), W = lm_dim_of(x, 2), C = lm_dim_of(x, 3);
  /* SAME padding written out once ((H + kh - 1) x (W + kw - 1) x C a sample, not the kh x kw
   * times larger im2col), then each output cell's kh x kw x C window as a view of it:
   * [B, H, kh, W, kw, C]. Left as a view, the padding is a bounds condition on every tap's load
   * in the matmul and in its weight gradient, which keeps those loops from vectorising cleanly:
   * MinAtar Breakout PPO (2 threads) 15.3-16.0k -> 17.9-18.2k env steps/s with the copy, the same
   * bits. Where the copy should go is a choice the search could time (materialised or not, as
   * pack.c stages panels); until it does, the copy is here. */
  lm_tensor p = lm_contiguous(lm_pad(lm_pad(x, 1, kh / 2, kh / 2), 2, kw / 2, kw / 2));
  lm_tensor win = lm_window(lm_window(p, 1, kh), 3, kw); /* [B, H, kh, W, kw, C] after both */
  lm_tensor cells = lm_permute(win, (const int[]){0, 1, 3, 2, 4, 5}); /* [B, H, W, kh, kw, C] */
  lm_tensor rows = lm_reshape(cells, 4, (lm_dim[]){B, H, W, (lm_dim)kh * kw * C});
  return lm_matmul(rows, w); /* [B, H, W, F] */
}
