/* Tests for the reference interpreter (compiler/backends/ref.c), the oracle every other backend is
 * checked against, so it is checked here against plain C: every primitive, every view kind and
 * their compositions (hand-written and a seeded random fuzz), symbolic dimensions, RAND, assign,
 * and deep or wide graphs. Inputs come from a fixed-seed generator, kept away from zero; host
 * buffers are NaN-poisoned before every read and every element is compared.
 *
 * Tolerance: none. The interpreter performs the same single float operation per element as the C
 * reference below (same libm functions, same summation order, one operation per C statement so
 * no contraction), and views only move values, so every comparison is bit-exact. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lumen/lumen.h"
#include "support/timeout.h"

/* ---------------------------------------------------------------- fixed-seed inputs */

static uint64_t rng_state;

static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int rng_int(int lo, int hi) { /* inclusive */
  return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

/* Magnitude uniform in [lo, hi); a random sign when `signs`. */
static float rng_float(float lo, float hi, int signs) {
  float u = (float)(rng_next() >> 40) * 0x1p-24f;
  float v = lo + (hi - lo) * u;
  return signs && (rng_next() & 1) ? -v : v;
}

/* ---------------------------------------------------------------- scratch memory */

#define MAX_SCRATCH 8192
static void *scratch[MAX_SCRATCH];
static size_t nscratch;

static void *talloc(size_t bytes) {
  cr_assert(nscratch < MAX_SCRATCH, "test scratch exhausted");
  void *p = malloc(bytes ? bytes : 1);
  cr_assert(p, "test malloc failed");
  scratch[nscratch++] = p;
  return p;
}

static void scratch_reset(void) {
  while (nscratch) free(scratch[--nscratch]);
}

/* ---------------------------------------------------------------- host tensors (the C reference) */

typedef struct ht {
  int rank;
  int64_t dim[LM_MAX_RANK];
  float *v;
} ht;

static size_t ht_numel(const ht *t) {
  size_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= (size_t)t->dim[i];
  return n;
}

static ht ht_new(int rank, const int64_t *dim) {
  ht t = {.rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dim[i];
  t.v = talloc(ht_numel(&t) * sizeof(float));
  return t;
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})
#define NDIMS(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define HT(...) ht_new(NDIMS(__VA_ARGS__), DIMS(__VA_ARGS__))

static ht ht_rand(int rank, const int64_t *dim, float lo, float hi, int signs) {
  ht t = ht_new(rank, dim);
  for (size_t i = 0; i < ht_numel(&t); i++) t.v[i] = rng_float(lo, hi, signs);
  return t;
}

/* Row-major multi-index <-> flat index. */
static void ht_unflat(const ht *t, size_t f, int64_t *idx) {
  for (int i = t->rank - 1; i >= 0; i--) {
    idx[i] = (int64_t)(f % (size_t)t->dim[i]);
    f /= (size_t)t->dim[i];
  }
}

static size_t ht_flat(const ht *t, const int64_t *idx) {
  size_t f = 0;
  for (int i = 0; i < t->rank; i++) f = f * (size_t)t->dim[i] + (size_t)idx[i];
  return f;
}

static const char *idx_str(const ht *t, size_t f) {
  static char buf[160];
  int64_t idx[LM_MAX_RANK];
  ht_unflat(t, f, idx);
  int n = snprintf(buf, sizeof buf, "[");
  for (int i = 0; i < t->rank && n < (int)sizeof buf - 24; i++) n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%lld", i ? "," : "", (long long)idx[i]);
  snprintf(buf + n, sizeof buf - (size_t)n, "]");
  return buf;
}

/* Eager versions of the views: each makes a new contiguous host tensor, one plain loop apiece. */
static ht ht_permute(const ht *x, const int *perm) {
  int64_t d[LM_MAX_RANK], oi[LM_MAX_RANK], ii[LM_MAX_RANK];
  for (int j = 0; j < x->rank; j++) d[j] = x->dim[perm[j]];
  ht y = ht_new(x->rank, d);
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    for (int j = 0; j < x->rank; j++) ii[perm[j]] = oi[j];
    y.v[f] = x->v[ht_flat(x, ii)];
  }
  return y;
}

static ht ht_expand(const ht *x, int axis, int64_t n) {
  int64_t d[LM_MAX_RANK], oi[LM_MAX_RANK], ii[LM_MAX_RANK];
  for (int i = 0, k = 0; i <= x->rank; i++) d[i] = i == axis ? n : x->dim[k++];
  ht y = ht_new(x->rank + 1, d);
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    for (int i = 0, k = 0; i <= x->rank; i++)
      if (i != axis) ii[k++] = oi[i];
    y.v[f] = x->v[ht_flat(x, ii)];
  }
  return y;
}

static ht ht_broadcast_to(const ht *x, int rank, const int64_t *dim) {
  int64_t oi[LM_MAX_RANK], ii[LM_MAX_RANK];
  ht y = ht_new(rank, dim);
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    for (int i = 0; i < x->rank; i++) {
      int j = i + rank - x->rank;
      ii[i] = x->dim[i] == 1 ? 0 : oi[j];
    }
    y.v[f] = x->v[ht_flat(x, ii)];
  }
  return y;
}

static ht ht_slice(const ht *x, int axis, int64_t start, int64_t end) {
  int64_t d[LM_MAX_RANK], oi[LM_MAX_RANK] = {0};
  memcpy(d, x->dim, sizeof d);
  d[axis] = end - start;
  ht y = ht_new(x->rank, d);
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    oi[axis] += start;
    y.v[f] = x->v[ht_flat(x, oi)];
  }
  return y;
}

static ht ht_pad(const ht *x, int axis, int64_t before, int64_t after) {
  int64_t d[LM_MAX_RANK], oi[LM_MAX_RANK] = {0};
  memcpy(d, x->dim, sizeof d);
  d[axis] = before + x->dim[axis] + after;
  ht y = ht_new(x->rank, d);
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    oi[axis] -= before;
    y.v[f] = oi[axis] >= 0 && oi[axis] < x->dim[axis] ? x->v[ht_flat(x, oi)] : 0.0f;
  }
  return y;
}

static ht ht_reshape(const ht *x, int rank, const int64_t *dim) {
  ht y = ht_new(rank, dim);
  cr_assert_eq(ht_numel(&y), ht_numel(x), "test bug: reshape changes the element count");
  memcpy(y.v, x->v, ht_numel(x) * sizeof(float));
  return y;
}

static ht ht_affine_mod(const ht *x, int axis, int64_t a, int64_t b) {
  int64_t oi[LM_MAX_RANK];
  ht y = ht_new(x->rank, x->dim);
  int64_t n = x->dim[axis];
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    oi[axis] = ((a * oi[axis] + b) % n + n) % n;
    y.v[f] = x->v[ht_flat(x, oi)];
  }
  return y;
}

/* Reductions in the interpreter's order: ascending along the axis, from 0.0f or -INFINITY. */
static ht ht_reduce(const ht *x, int axis, int is_max) {
  int64_t d[LM_MAX_RANK], oi[LM_MAX_RANK], ii[LM_MAX_RANK];
  for (int i = 0, k = 0; i < x->rank; i++)
    if (i != axis) d[k++] = x->dim[i];
  ht y = ht_new(x->rank - 1, d);
  for (size_t f = 0; f < ht_numel(&y); f++) {
    ht_unflat(&y, f, oi);
    for (int i = 0, k = 0; i < x->rank; i++)
      if (i != axis) ii[i] = oi[k++];
    float acc = is_max ? -INFINITY : 0.0f;
    for (int64_t r = 0; r < x->dim[axis]; r++) {
      ii[axis] = r;
      float v = x->v[ht_flat(x, ii)];
      acc = is_max ? fmaxf(acc, v) : acc + v;
    }
    y.v[f] = acc;
  }
  return y;
}

static ht ht_map1(const ht *x, float (*fn)(float)) {
  ht y = ht_new(x->rank, x->dim);
  for (size_t i = 0; i < ht_numel(x); i++) y.v[i] = fn(x->v[i]);
  return y;
}

static ht ht_map2(const ht *a, const ht *b, float (*fn)(float, float)) {
  cr_assert_eq(ht_numel(a), ht_numel(b), "test bug: map2 of different sizes");
  ht y = ht_new(a->rank, a->dim);
  for (size_t i = 0; i < ht_numel(a); i++) y.v[i] = fn(a->v[i], b->v[i]);
  return y;
}

static float f_add(float a, float b) { return a + b; }
static float f_mul(float a, float b) { return a * b; }
static float f_mod(float a, float b) { return fmodf(a, b); }
static float f_lt(float a, float b) { return a < b ? 1.0f : 0.0f; }
static float f_recip(float a) { return 1.0f / a; }
static float f_ident(float a) { return a; }

/* ---------------------------------------------------------------- the system under test */

static lm_backend_t *B;
static lm_graph_t *G;
static lm_program_t *progs[8];
static int nprogs;

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

static void free_programs(void) {
  while (nprogs) lm_program_free(progs[--nprogs]);
}

static void new_graph(void) {
  free_programs();
  lm_graph_free(G);
  G = lm_graph_new();
  cr_assert(G, "lm_graph_new: %s", lm_last_error());
}

static void setup(void) {
  rng_state = 0x5EED0001u;
  B = lm_backend_new("ref");
  cr_assert(B, "ref backend: %s", lm_last_error());
  new_graph();
}

static void teardown(void) {
  free_programs();
  lm_graph_free(G);
  G = NULL;
  lm_backend_free(B);
  B = NULL;
  scratch_reset();
}

TestSuite(ref, .init = setup, .fini = teardown);

static lm_program_t *compile(void) {
  cr_assert(nprogs < (int)(sizeof progs / sizeof progs[0]), "test bug: too many programs");
  lm_program_t *p = lm_program_new(B, G);
  cr_assert(p, "lm_program_new: %s", lm_last_error());
  progs[nprogs++] = p;
  return p;
}

static lm_tensor input_like(const char *name, lm_role role, const ht *t) {
  lm_tensor x = lm_input(G, name, role, t->rank, t->dim);
  cr_assert(lm_tensor_ok(x), "input %s: %s", name, lm_last_error());
  return x;
}

/* The tensor's (constant) shape must be want's. */
static void expect_shape(lm_tensor t, const ht *want, const char *what) {
  cr_assert(lm_tensor_ok(t), "%s: invalid tensor (%s)", what, lm_graph_validate(G) ? lm_last_error() : "?");
  cr_assert_eq(lm_rank(t), want->rank, "%s: rank %d, expected %d", what, lm_rank(t), want->rank);
  for (int i = 0; i < want->rank; i++)
    cr_assert_eq(lm_dim_of(t, i), want->dim[i], "%s: axis %d has extent %lld, expected %lld", what, i,
                 (long long)lm_dim_of(t, i), (long long)want->dim[i]);
}

static void output_like(lm_tensor t, const char *name, const ht *want) {
  expect_shape(t, want, name);
  OK(lm_output(t, name));
}

static void put(lm_program_t *p, const char *name, const ht *t) {
  size_t n = 0;
  OK(lm_program_numel(p, name, &n));
  cr_assert_eq(n, ht_numel(t), "%s holds %zu elements, the host tensor %zu", name, n, ht_numel(t));
  OK(lm_program_write(p, name, t->v, n));
}

/* Reads into a NaN-poisoned host tensor of the given shape. */
static ht get(lm_program_t *p, const char *name, int rank, const int64_t *dim) {
  ht t = ht_new(rank, dim);
  size_t n = 0;
  for (size_t i = 0; i < ht_numel(&t); i++) t.v[i] = NAN;
  OK(lm_program_numel(p, name, &n));
  cr_assert_eq(n, ht_numel(&t), "%s holds %zu elements, expected %zu", name, n, ht_numel(&t));
  OK(lm_program_read(p, name, t.v, n));
  return t;
}

static ht get_like(lm_program_t *p, const char *name, const ht *like) { return get(p, name, like->rank, like->dim); }

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Every element bit-for-bit (tolerance 0: see the file comment). */
static void expect_bits(const ht *got, const ht *want, const char *what) {
  cr_assert_eq(got->rank, want->rank, "%s: rank %d, expected %d", what, got->rank, want->rank);
  for (int i = 0; i < want->rank; i++) cr_assert_eq(got->dim[i], want->dim[i], "%s: axis %d differs", what, i);
  for (size_t i = 0; i < ht_numel(want); i++)
    if (bits(got->v[i]) != bits(want->v[i]))
      cr_assert_fail("%s: element %zu %s is %a (%.9g), expected %a (%.9g)", what, i, idx_str(want, i),
                     (double)got->v[i], (double)got->v[i], (double)want->v[i], (double)want->v[i]);
}

/* Builds out = x viewed, runs it, compares with the host view. */
static void expect_output(lm_program_t *p, const char *name, const ht *want) {
  ht got = get_like(p, name, want);
  expect_bits(&got, want, name);
}

/* ================================================================ primitives */

static void check_unary(lm_tensor (*op)(lm_tensor), float (*fn)(float), float lo, float hi, int signs,
                        const char *what) {
  ht x = ht_rand(3, DIMS(4, 5, 6), lo, hi, signs);
  ht want = ht_map1(&x, fn);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x);
  output_like(op(tx), what, &want);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, what, &want);
}

Test(ref, log2_equals_log2f_bitwise) { check_unary(lm_log2, log2f, 0.01f, 1000.0f, 0, "log2"); }
Test(ref, exp2_equals_exp2f_bitwise) { check_unary(lm_exp2, exp2f, 0.05f, 20.0f, 1, "exp2"); }
Test(ref, sin_equals_sinf_bitwise) { check_unary(lm_sin, sinf, 0.05f, 40.0f, 1, "sin"); }
Test(ref, sqrt_equals_sqrtf_bitwise) { check_unary(lm_sqrt, sqrtf, 0.01f, 1000.0f, 0, "sqrt"); }
Test(ref, recip_equals_one_over_x_bitwise) { check_unary(lm_recip, f_recip, 0.05f, 50.0f, 1, "recip"); }
Test(ref, contiguous_copies_its_input_exactly) { check_unary(lm_contiguous, f_ident, 0.05f, 50.0f, 1, "contiguous"); }

static void check_binary(lm_tensor (*op)(lm_tensor, lm_tensor), float (*fn)(float, float), const ht *a, const ht *b) {
  ht want = ht_map2(a, b, fn);
  lm_tensor ta = input_like("a", LM_ROLE_DATA, a), tb = input_like("b", LM_ROLE_DATA, b);
  output_like(op(ta, tb), "y", &want);
  lm_program_t *p = compile();
  put(p, "a", a);
  put(p, "b", b);
  OK(lm_program_run(p));
  expect_output(p, "y", &want);
}

Test(ref, add_equals_float_addition_bitwise) {
  ht a = ht_rand(3, DIMS(4, 5, 6), 0.05f, 100.0f, 1), b = ht_rand(3, DIMS(4, 5, 6), 0.05f, 100.0f, 1);
  check_binary(lm_add, f_add, &a, &b);
}

Test(ref, mul_equals_float_multiplication_bitwise) {
  ht a = ht_rand(3, DIMS(4, 5, 6), 0.05f, 100.0f, 1), b = ht_rand(3, DIMS(4, 5, 6), 0.05f, 100.0f, 1);
  check_binary(lm_mul, f_mul, &a, &b);
}

Test(ref, mod_equals_fmodf_for_every_sign_combination) {
  ht a = ht_rand(2, DIMS(12, 10), 0.5f, 60.0f, 1), b = ht_rand(2, DIMS(12, 10), 0.5f, 7.0f, 1);
  /* row 0 spells out fmodf's semantics: the result has the sign of the dividend */
  static const float table[][3] = {{-7.0f, 3.0f, -1.0f}, {7.0f, -3.0f, 1.0f},   {-7.0f, -3.0f, -1.0f},
                                   {7.0f, 3.0f, 1.0f},   {-7.5f, 2.0f, -1.5f}, {5.25f, 0.5f, 0.25f},
                                   {-2.0f, 5.0f, -2.0f}, {2.0f, -5.0f, 2.0f},  {-6.0f, 3.0f, -0.0f},
                                   {6.0f, -3.0f, 0.0f}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    a.v[i] = table[i][0];
    b.v[i] = table[i][1];
    cr_assert_eq(bits(fmodf(a.v[i], b.v[i])), bits(table[i][2]), "test bug: fmodf table row %zu", i);
  }
  check_binary(lm_mod, f_mod, &a, &b);
  ht got = get(progs[0], "y", 2, DIMS(12, 10));
  cr_assert(signbit(got.v[0]) && got.v[0] == -1.0f, "mod(-7, 3) is %g, expected -1", (double)got.v[0]);
  cr_assert(signbit(got.v[8]), "mod(-6, 3) must be -0.0 (sign of the dividend), got %g", (double)got.v[8]);
}

Test(ref, less_than_is_one_or_zero_and_false_on_ties) {
  ht a = ht_rand(2, DIMS(9, 11), 0.05f, 10.0f, 1), b = ht_rand(2, DIMS(9, 11), 0.05f, 10.0f, 1);
  for (size_t i = 0; i < ht_numel(&a); i += 3) b.v[i] = a.v[i]; /* a third are ties */
  check_binary(lm_less_than, f_lt, &a, &b);
  ht got = get(progs[0], "y", 2, DIMS(9, 11));
  size_t ones = 0;
  for (size_t i = 0; i < ht_numel(&got); i++) ones += got.v[i] == 1.0f;
  cr_assert(ones > 10 && ones < ht_numel(&got) - 40, "suspicious count of 1s: %zu", ones);
}

Test(ref, binary_ops_broadcast_numpy_style) {
  ht a = ht_rand(3, DIMS(4, 1, 6), 0.05f, 10.0f, 1), b = ht_rand(2, DIMS(5, 1), 0.05f, 10.0f, 1);
  ht ab = ht_broadcast_to(&a, 3, DIMS(4, 5, 6)), bb = ht_broadcast_to(&b, 3, DIMS(4, 5, 6));
  ht want = ht_map2(&ab, &bb, f_mul);
  lm_tensor ta = input_like("a", LM_ROLE_DATA, &a), tb = input_like("b", LM_ROLE_DATA, &b);
  output_like(lm_mul(ta, tb), "y", &want);
  output_like(lm_add(tb, tb), "twice_b", &b); /* the same tensor on both sides */
  lm_program_t *p = compile();
  put(p, "a", &a);
  put(p, "b", &b);
  OK(lm_program_run(p));
  expect_output(p, "y", &want);
  ht bpb = ht_map2(&b, &b, f_add);
  expect_output(p, "twice_b", &bpb);
}

Test(ref, sum_and_max_reduce_over_every_axis_of_a_rank3_tensor) {
  ht x = ht_rand(3, DIMS(3, 4, 5), 0.05f, 10.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x);
  ht want[2][3];
  char name[32];
  for (int m = 0; m < 2; m++)
    for (int a = 0; a < 3; a++) {
      want[m][a] = ht_reduce(&x, a, m);
      snprintf(name, sizeof name, "%s%d", m ? "max" : "sum", a);
      output_like(m ? lm_max_reduce(tx, a) : lm_sum_reduce(tx, a), name, &want[m][a]);
      snprintf(name, sizeof name, "%s%d_neg", m ? "max" : "sum", a);
      output_like(m ? lm_max_reduce(tx, a - 3) : lm_sum_reduce(tx, a - 3), name, &want[m][a]);
    }
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  for (int m = 0; m < 2; m++)
    for (int a = 0; a < 3; a++) {
      snprintf(name, sizeof name, "%s%d", m ? "max" : "sum", a);
      expect_output(p, name, &want[m][a]);
      snprintf(name, sizeof name, "%s%d_neg", m ? "max" : "sum", a);
      expect_output(p, name, &want[m][a]);
    }
}

Test(ref, max_reduce_of_all_negative_values_is_the_largest_not_zero) {
  ht x = ht_rand(2, DIMS(6, 7), 0.5f, 10.0f, 0);
  for (size_t i = 0; i < ht_numel(&x); i++) x.v[i] = -x.v[i];
  ht want = ht_reduce(&x, 1, 1);
  output_like(lm_max_reduce(input_like("x", LM_ROLE_DATA, &x), 1), "m", &want);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "m", &want);
  for (size_t i = 0; i < ht_numel(&want); i++) cr_assert(want.v[i] < 0.0f);
}

Test(ref, reductions_chain_down_to_a_scalar) {
  ht x = ht_rand(3, DIMS(3, 4, 5), 0.05f, 10.0f, 1);
  ht r1 = ht_reduce(&x, 1, 0), r2 = ht_reduce(&r1, 1, 1), r3 = ht_reduce(&r2, 0, 0);
  lm_tensor t = lm_sum_reduce(lm_max_reduce(lm_sum_reduce(input_like("x", LM_ROLE_DATA, &x), 1), 1), 0);
  output_like(t, "s", &r3);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "s", &r3);
}

Test(ref, contiguous_materialises_a_permuted_view) {
  ht x = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  int perm[3] = {2, 0, 1};
  ht want = ht_permute(&x, perm);
  lm_tensor c = lm_contiguous(lm_permute(input_like("x", LM_ROLE_DATA, &x), perm));
  output_like(c, "c", &want);
  ht r = ht_reshape(&want, 1, DIMS(24));
  output_like(lm_reshape(c, 1, DIMS(24)), "flat", &r); /* the contiguous buffer is in permuted order */
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "c", &want);
  expect_output(p, "flat", &r);
}

Test(ref, const_broadcasts_to_any_shape_and_into_binary_ops) {
  ht x = ht_rand(2, DIMS(3, 4), 0.05f, 10.0f, 1);
  ht full = HT(3, 4), plus = HT(3, 4), scalar = ht_new(0, NULL);
  for (size_t i = 0; i < 12; i++) {
    full.v[i] = -2.75f;
    plus.v[i] = x.v[i] + 0.1f;
  }
  scalar.v[0] = 1.0e-3f;
  lm_tensor c = lm_const(G, -2.75f);
  output_like(lm_broadcast_to(c, 2, DIMS(3, 4)), "full", &full);
  output_like(lm_add(input_like("x", LM_ROLE_DATA, &x), lm_const(G, 0.1f)), "plus", &plus);
  output_like(lm_const(G, 1.0e-3f), "scalar", &scalar);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "full", &full);
  expect_output(p, "plus", &plus);
  expect_output(p, "scalar", &scalar);
}

Test(ref, inputs_of_every_role_are_read_and_output_directly) {
  ht x = ht_rand(2, DIMS(3, 5), 0.05f, 10.0f, 1), w = ht_rand(1, DIMS(5), 0.05f, 10.0f, 1),
     s = ht_rand(2, DIMS(3, 5), 0.05f, 10.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x), tw = input_like("w", LM_ROLE_PARAM, &w),
            ts = input_like("s", LM_ROLE_STATE, &s);
  ht wb = ht_broadcast_to(&w, 2, DIMS(3, 5)), xw = ht_map2(&x, &wb, f_mul), want = ht_map2(&xw, &s, f_add);
  output_like(lm_add(lm_mul(tx, tw), ts), "y", &want);
  output_like(tx, "x_out", &x);
  output_like(tw, "w_out", &w);
  output_like(ts, "s_out", &s);
  lm_program_t *p = compile();
  put(p, "x", &x);
  put(p, "w", &w);
  put(p, "s", &s);
  OK(lm_program_run(p));
  expect_output(p, "y", &want);
  expect_output(p, "x_out", &x);
  expect_output(p, "w_out", &w);
  expect_output(p, "s_out", &s);
  expect_output(p, "w", &w); /* parameters and state read back by name too */
  expect_output(p, "s", &s);
}

/* ================================================================ RAND */

static ht rand_ref(int rank, const int64_t *dim, uint64_t seed, uint32_t stream, uint64_t run) {
  ht t = ht_new(rank, dim);
  for (size_t i = 0; i < ht_numel(&t); i++) t.v[i] = lm_rand_uniform(seed, stream, i, run);
  return t;
}

Test(ref, rand_equals_lm_rand_uniform_for_every_element) {
  lm_tensor r = lm_rand(G, 3, DIMS(3, 5, 7)); /* 105 elements: not a multiple of the 4-word block */
  OK(lm_output(r, "r"));
  lm_program_t *p = compile();
  lm_program_set_seed(p, 0x0123456789ABCDEFull);
  OK(lm_program_run(p));
  ht want = rand_ref(3, DIMS(3, 5, 7), 0x0123456789ABCDEFull, 0, 0);
  expect_output(p, "r", &want);
  for (size_t i = 0; i < ht_numel(&want); i++)
    cr_assert(want.v[i] > 0.0f && want.v[i] <= 1.0f, "uniform %g outside (0,1]", (double)want.v[i]);
}

Test(ref, rand_nodes_get_distinct_streams_in_call_order) {
  lm_tensor r0 = lm_rand(G, 1, DIMS(64)), r1 = lm_rand(G, 1, DIMS(64));
  lm_tensor r9 = lm_rand_stream(G, 9, 1, DIMS(64)), r10 = lm_rand(G, 1, DIMS(64));
  OK(lm_output(r0, "r0"));
  OK(lm_output(r1, "r1"));
  OK(lm_output(r9, "r9"));
  OK(lm_output(r10, "r10"));
  lm_program_t *p = compile();
  lm_program_set_seed(p, 77);
  OK(lm_program_run(p));
  ht w0 = rand_ref(1, DIMS(64), 77, 0, 0), w1 = rand_ref(1, DIMS(64), 77, 1, 0);
  ht w9 = rand_ref(1, DIMS(64), 77, 9, 0), w10 = rand_ref(1, DIMS(64), 77, 10, 0);
  expect_output(p, "r0", &w0);
  expect_output(p, "r1", &w1);
  expect_output(p, "r9", &w9);
  expect_output(p, "r10", &w10);
  size_t same = 0;
  for (size_t i = 0; i < 64; i++) same += w0.v[i] == w1.v[i];
  cr_assert_lt(same, 4, "streams 0 and 1 agree on %zu of 64 elements", same);
}

Test(ref, rand_changes_with_the_run_counter_and_honours_set_run_and_set_seed) {
  OK(lm_output(lm_rand(G, 2, DIMS(5, 6)), "r"));
  lm_program_t *p = compile();
  cr_assert_eq(lm_program_run_index(p), 0);
  OK(lm_program_run(p));
  ht a = get(p, "r", 2, DIMS(5, 6)), wa = rand_ref(2, DIMS(5, 6), 0, 0, 0);
  expect_bits(&a, &wa, "run 0, seed 0");
  cr_assert_eq(lm_program_run_index(p), 1);
  OK(lm_program_run(p));
  ht b = get(p, "r", 2, DIMS(5, 6)), wb = rand_ref(2, DIMS(5, 6), 0, 0, 1);
  expect_bits(&b, &wb, "run 1, seed 0");
  size_t same = 0;
  for (size_t i = 0; i < 30; i++) same += a.v[i] == b.v[i];
  cr_assert_lt(same, 3, "runs 0 and 1 agree on %zu of 30 elements", same);
  lm_program_set_run(p, 0xFFFFFFFF5ull); /* the high word of the run counter matters */
  lm_program_set_seed(p, 0xDEADBEEFCAFEull);
  cr_assert_eq(lm_program_run_index(p), 0xFFFFFFFF5ull);
  OK(lm_program_run(p));
  ht c = get(p, "r", 2, DIMS(5, 6)), wc = rand_ref(2, DIMS(5, 6), 0xDEADBEEFCAFEull, 0, 0xFFFFFFFF5ull);
  expect_bits(&c, &wc, "run 0xFFFFFFFF5, seed 0xDEADBEEFCAFE");
  cr_assert_eq(lm_program_run_index(p), 0xFFFFFFFF6ull);
}

Test(ref, two_programs_with_the_same_seed_agree) {
  lm_tensor r = lm_rand(G, 2, DIMS(7, 9));
  OK(lm_output(lm_mul(r, lm_rand(G, 1, DIMS(9))), "r"));
  lm_program_t *p = compile(), *q = compile();
  lm_program_set_seed(p, 4242);
  lm_program_set_seed(q, 4242);
  for (int k = 0; k < 3; k++) {
    OK(lm_program_run(p));
    OK(lm_program_run(q));
    ht a = get(p, "r", 2, DIMS(7, 9)), b = get(q, "r", 2, DIMS(7, 9));
    expect_bits(&a, &b, "same seed, same run");
  }
}

Test(ref, rand_through_views_reads_the_underlying_elements) {
  lm_dim N = lm_sym(G, "N");
  lm_tensor r = lm_rand(G, 2, (lm_dim[]){N, 3});
  int perm[2] = {1, 0};
  OK(lm_output(lm_permute(r, perm), "rt"));
  OK(lm_output(lm_expand(lm_slice(lm_permute(r, perm), 0, 1, 2), 0, 2), "row1x2"));
  lm_program_t *p = compile();
  lm_program_set_seed(p, 5);
  for (int64_t n = 1; n <= 9; n += 4) {
    OK(lm_program_bind(p, "N", n));
    lm_program_set_run(p, (uint64_t)n);
    OK(lm_program_run(p));
    ht base = rand_ref(2, DIMS(n, 3), 5, 0, (uint64_t)n);
    ht t = ht_permute(&base, perm), s = ht_slice(&t, 0, 1, 2), e = ht_expand(&s, 0, 2);
    expect_output(p, "rt", &t);
    expect_output(p, "row1x2", &e);
  }
}

/* ================================================================ views, one kind at a time */

Test(ref, permute_of_rank_2_3_and_4_matches_index_mapping) {
  static const int p2[][2] = {{1, 0}, {0, 1}};
  static const int p3[][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  static const int p4[][4] = {{3, 1, 0, 2}, {1, 3, 2, 0}, {3, 2, 1, 0}, {0, 2, 3, 1}};
  ht x2 = ht_rand(2, DIMS(3, 5), 0.05f, 10.0f, 1), x3 = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1),
     x4 = ht_rand(4, DIMS(2, 3, 4, 5), 0.05f, 10.0f, 1);
  lm_tensor t2 = input_like("x2", LM_ROLE_DATA, &x2), t3 = input_like("x3", LM_ROLE_DATA, &x3),
            t4 = input_like("x4", LM_ROLE_DATA, &x4);
  ht want[12];
  int k = 0;
  char name[16];
  for (size_t i = 0; i < 2; i++, k++) {
    want[k] = ht_permute(&x2, p2[i]);
    snprintf(name, sizeof name, "y%d", k);
    output_like(lm_permute(t2, p2[i]), name, &want[k]);
  }
  for (size_t i = 0; i < 6; i++, k++) {
    want[k] = ht_permute(&x3, p3[i]);
    snprintf(name, sizeof name, "y%d", k);
    output_like(lm_permute(t3, p3[i]), name, &want[k]);
  }
  for (size_t i = 0; i < 4; i++, k++) {
    want[k] = ht_permute(&x4, p4[i]);
    snprintf(name, sizeof name, "y%d", k);
    output_like(lm_permute(t4, p4[i]), name, &want[k]);
  }
  lm_program_t *p = compile();
  put(p, "x2", &x2);
  put(p, "x3", &x3);
  put(p, "x4", &x4);
  OK(lm_program_run(p));
  for (int i = 0; i < k; i++) {
    snprintf(name, sizeof name, "y%d", i);
    expect_output(p, name, &want[i]);
  }
}

Test(ref, permute_twice_composes_and_negative_entries_count_from_the_end) {
  ht x = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  int pa[3] = {1, 2, 0}, pb[3] = {2, 0, 1}, pneg[3] = {-1, 0, -2}, pneg_n[3] = {2, 0, 1};
  ht a = ht_permute(&x, pa), ab = ht_permute(&a, pb), n = ht_permute(&x, pneg_n);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  output_like(lm_permute(lm_permute(t, pa), pb), "ab", &ab);
  output_like(lm_permute(t, pneg), "neg", &n);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "ab", &ab); /* pa then its inverse: the identity */
  expect_bits(&ab, &x, "host: pb undoes pa");
  expect_output(p, "neg", &n);
}

Test(ref, expand_at_every_position_repeats_the_input) {
  ht x = ht_rand(2, DIMS(3, 4), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht want[4];
  char name[16];
  for (int a = 0; a <= 2; a++) {
    want[a] = ht_expand(&x, a, 5);
    snprintf(name, sizeof name, "e%d", a);
    output_like(lm_expand(t, a, 5), name, &want[a]);
  }
  want[3] = ht_expand(&x, 2, 2);
  output_like(lm_expand(t, -1, 2), "eneg", &want[3]); /* -1 inserts at the end */
  ht twice = ht_expand(&want[1], 0, 2);
  output_like(lm_expand(lm_expand(t, 1, 5), 0, 2), "twice", &twice);
  ht one = ht_expand(&x, 1, 1);
  output_like(lm_expand(t, 1, 1), "one", &one);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  for (int a = 0; a <= 2; a++) {
    snprintf(name, sizeof name, "e%d", a);
    expect_output(p, name, &want[a]);
  }
  expect_output(p, "eneg", &want[3]);
  expect_output(p, "twice", &twice);
  expect_output(p, "one", &one);
}

Test(ref, broadcast_to_adds_leading_axes_and_stretches_unit_axes) {
  ht x = ht_rand(2, DIMS(3, 1), 0.05f, 10.0f, 1), y = ht_rand(1, DIMS(1), 0.05f, 10.0f, 1),
     z = ht_rand(3, DIMS(1, 4, 1), 0.05f, 10.0f, 1);
  ht bx = ht_broadcast_to(&x, 3, DIMS(2, 3, 4)), by = ht_broadcast_to(&y, 2, DIMS(4, 5)),
     bz = ht_broadcast_to(&z, 4, DIMS(2, 3, 4, 5)), same = ht_broadcast_to(&x, 2, DIMS(3, 1));
  output_like(lm_broadcast_to(input_like("x", LM_ROLE_DATA, &x), 3, DIMS(2, 3, 4)), "bx", &bx);
  output_like(lm_broadcast_to(input_like("y", LM_ROLE_DATA, &y), 2, DIMS(4, 5)), "by", &by);
  lm_tensor tz = input_like("z", LM_ROLE_DATA, &z);
  output_like(lm_broadcast_to(tz, 4, DIMS(2, 3, 4, 5)), "bz", &bz);
  lm_program_t *p = compile();
  put(p, "x", &x);
  put(p, "y", &y);
  put(p, "z", &z);
  OK(lm_program_run(p));
  expect_output(p, "bx", &bx);
  expect_output(p, "by", &by);
  expect_output(p, "bz", &bz);
  expect_bits(&same, &x, "host: broadcast to its own shape");
}

Test(ref, slice_keeps_the_range_on_every_axis_and_full_range_is_a_no_op) {
  ht x = ht_rand(3, DIMS(4, 5, 6), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht s0 = ht_slice(&x, 0, 1, 3), s1 = ht_slice(&x, 1, 0, 1), s2 = ht_slice(&x, 2, 2, 6), sneg = ht_slice(&x, 2, 5, 6);
  output_like(lm_slice(t, 0, 1, 3), "s0", &s0);
  output_like(lm_slice(t, 1, 0, 1), "s1", &s1);
  output_like(lm_slice(t, 2, 2, 6), "s2", &s2);
  output_like(lm_slice(t, -1, 5, 6), "sneg", &sneg);
  lm_tensor full = lm_slice(t, 1, 0, 5);
  cr_assert(full.node == t.node && full.view == t.view, "a full-range slice must add no view");
  output_like(full, "full", &x);
  ht s12 = ht_slice(&s1, 2, 1, 4), s120 = ht_slice(&s12, 0, 3, 4);
  output_like(lm_slice(lm_slice(lm_slice(t, 1, 0, 1), 2, 1, 4), 0, 3, 4), "s120", &s120);
  ht ss = ht_slice(&x, 2, 1, 5), ss2 = ht_slice(&ss, 2, 1, 3); /* a slice of a slice on one axis */
  output_like(lm_slice(lm_slice(t, 2, 1, 5), 2, 1, 3), "ss", &ss2);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "s0", &s0);
  expect_output(p, "s1", &s1);
  expect_output(p, "s2", &s2);
  expect_output(p, "sneg", &sneg);
  expect_output(p, "full", &x);
  expect_output(p, "s120", &s120);
  expect_output(p, "ss", &ss2);
}

Test(ref, empty_slice_gives_zero_elements_and_empty_reductions_give_identities) {
  ht x = ht_rand(2, DIMS(3, 4), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  lm_tensor e = lm_slice(t, 1, 2, 2);
  ht empty = HT(3, 0), zeros = HT(3), ninf = HT(3);
  for (int i = 0; i < 3; i++) {
    zeros.v[i] = 0.0f;
    ninf.v[i] = -INFINITY;
  }
  output_like(e, "e", &empty);
  output_like(lm_add(e, e), "sum_e", &empty);
  output_like(lm_sum_reduce(e, 1), "s", &zeros);
  output_like(lm_max_reduce(e, 1), "m", &ninf);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  size_t n = 99;
  OK(lm_program_numel(p, "e", &n));
  cr_assert_eq(n, 0);
  OK(lm_program_read(p, "e", NULL, 0));
  expect_output(p, "s", &zeros);
  expect_output(p, "m", &ninf);
}

Test(ref, pad_reads_zero_before_and_after_on_every_axis) {
  ht x = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht a = ht_pad(&x, 0, 2, 0), b = ht_pad(&x, 1, 0, 3), c = ht_pad(&x, 2, 1, 2), d = ht_pad(&x, 2, 3, 3);
  output_like(lm_pad(t, 0, 2, 0), "a", &a);
  output_like(lm_pad(t, 1, 0, 3), "b", &b);
  output_like(lm_pad(t, 2, 1, 2), "c", &c);
  output_like(lm_pad(t, -1, 3, 3), "d", &d);
  ht ab = ht_pad(&a, 1, 1, 1), abb = ht_pad(&ab, 1, 2, 0); /* pads stack, also on one axis */
  output_like(lm_pad(lm_pad(lm_pad(t, 0, 2, 0), 1, 1, 1), 1, 2, 0), "abb", &abb);
  lm_tensor none = lm_pad(t, 1, 0, 0);
  cr_assert(none.view == t.view, "padding by nothing must add no view");
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "a", &a);
  expect_output(p, "b", &b);
  expect_output(p, "c", &c);
  expect_output(p, "d", &d);
  expect_output(p, "abb", &abb);
  size_t zeros = 0;
  for (size_t i = 0; i < ht_numel(&c); i++) zeros += c.v[i] == 0.0f;
  cr_assert_eq(zeros, ht_numel(&c) - ht_numel(&x), "host: pad must add exactly the zeros");
}

Test(ref, reshape_splits_merges_and_round_trips) {
  ht x = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  static const int64_t shapes[][4] = {{6, 4}, {2, 12}, {1, 24},       {4, 3, 2},   {2, 2, 3, 2},
                                      {3, 8}, {24},    {1, 2, 1, 12}, {2, 3, 2, 2}};
  static const int ranks[] = {2, 2, 2, 3, 4, 2, 1, 4, 4};
  ht want[9];
  char name[16];
  for (int i = 0; i < 9; i++) {
    const int64_t *d = shapes[i];
    want[i] = ht_reshape(&x, ranks[i], d);
    snprintf(name, sizeof name, "r%d", i);
    output_like(lm_reshape(t, ranks[i], d), name, &want[i]);
  }
  lm_tensor rt = lm_reshape(lm_reshape(lm_reshape(t, 1, DIMS(24)), 2, DIMS(4, 6)), 3, DIMS(2, 3, 4));
  output_like(rt, "round_trip", &x);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  for (int i = 0; i < 9; i++) {
    snprintf(name, sizeof name, "r%d", i);
    expect_output(p, name, &want[i]);
  }
  expect_output(p, "round_trip", &x);
}

Test(ref, reshape_of_a_non_contiguous_view_uses_the_viewed_order) {
  ht x = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  int perm[3] = {2, 0, 1};
  ht px = ht_permute(&x, perm); /* [4,2,3] */
  ht m = ht_reshape(&px, 2, DIMS(8, 3)), s = ht_reshape(&px, 3, DIMS(2, 2, 6)), f = ht_reshape(&px, 1, DIMS(24));
  output_like(lm_reshape(lm_permute(t, perm), 2, DIMS(8, 3)), "merge", &m);
  output_like(lm_reshape(lm_permute(t, perm), 3, DIMS(2, 2, 6)), "split", &s);
  output_like(lm_reshape(lm_permute(t, perm), 1, DIMS(24)), "flat", &f);
  ht pd = ht_pad(&x, 1, 1, 0), pr = ht_reshape(&pd, 2, DIMS(4, 8)); /* [2,4,4] -> [4,8] */
  output_like(lm_reshape(lm_pad(t, 1, 1, 0), 2, DIMS(4, 8)), "pad_reshape", &pr);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "merge", &m);
  expect_output(p, "split", &s);
  expect_output(p, "flat", &f);
  expect_output(p, "pad_reshape", &pr);
}

Test(ref, affine_mod_with_coprime_a_is_a_permutation_and_matches_the_index_map) {
  ht x = HT(8);
  for (int i = 0; i < 8; i++) x.v[i] = (float)(i + 1) * 1.5f;
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht y = ht_affine_mod(&x, 0, 3, 2);
  output_like(lm_affine_mod(t, 0, 3, 2), "y", &y);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "y", &y);
  int seen[8] = {0};
  for (int i = 0; i < 8; i++) {
    int k = (3 * i + 2) % 8;
    cr_assert_eq(bits(y.v[i]), bits(x.v[k]), "y[%d] must be x[%d]", i, k);
    seen[k]++;
  }
  for (int i = 0; i < 8; i++) cr_assert_eq(seen[i], 1, "x[%d] is read %d times: not a permutation", i, seen[i]);
}

Test(ref, affine_mod_with_non_coprime_a_repeats_elements) {
  ht x = ht_rand(2, DIMS(3, 8), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht y = ht_affine_mod(&x, 1, 2, 1), z = ht_affine_mod(&x, 0, 5, 11), w = ht_affine_mod(&x, 1, 8, 3);
  output_like(lm_affine_mod(t, 1, 2, 1), "y", &y);   /* reads 1,3,5,7,1,3,5,7 */
  output_like(lm_affine_mod(t, 0, 5, 11), "z", &z);  /* b beyond the extent */
  output_like(lm_affine_mod(t, -1, 8, 3), "w", &w);  /* a == n: constant index b mod n */
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "y", &y);
  expect_output(p, "z", &z);
  expect_output(p, "w", &w);
  cr_assert_eq(bits(y.v[4]), bits(x.v[1]), "y[0,4] reads x[0,(2*4+1) mod 8] = x[0,1]");
}

Test(ref, affine_mod_composed_twice_is_the_composed_map) {
  ht x = ht_rand(1, DIMS(10), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht a = ht_affine_mod(&x, 0, 3, 4), ab = ht_affine_mod(&a, 0, 7, 1);
  output_like(lm_affine_mod(lm_affine_mod(t, 0, 3, 4), 0, 7, 1), "ab", &ab);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "ab", &ab);
}

/* ================================================================ compositions */

Test(ref, chain_of_expand_reshape_slice_pad_permute_feeds_a_binary_op) {
  ht x = ht_rand(2, DIMS(4, 6), 0.05f, 10.0f, 1);
  ht y = ht_rand(4, DIMS(4, 3, 4, 2), 0.05f, 10.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x), ty = input_like("y", LM_ROLE_DATA, &y);
  int perm[4] = {3, 1, 0, 2};
  /* x [4,6] -> reshape [2,2,6] -> expand axis 1 by 3 [2,3,2,6] -> slice axis 3 [1,5) [2,3,2,4]
   *   -> pad axis 0 (1,1) [4,3,2,4] -> permute {3,1,0,2} [4,3,4,2] */
  ht h = ht_reshape(&x, 3, DIMS(2, 2, 6));
  h = ht_expand(&h, 1, 3);
  h = ht_slice(&h, 3, 1, 5);
  h = ht_pad(&h, 0, 1, 1);
  h = ht_permute(&h, perm);
  lm_tensor v = lm_reshape(tx, 3, DIMS(2, 2, 6));
  v = lm_expand(v, 1, 3);
  v = lm_slice(v, 3, 1, 5);
  v = lm_pad(v, 0, 1, 1);
  v = lm_permute(v, perm);
  expect_shape(v, &h, "chain");
  ht want = ht_map2(&h, &y, f_add);
  output_like(lm_add(v, ty), "sum", &want);
  output_like(v, "view", &h);
  lm_program_t *p = compile();
  put(p, "x", &x);
  put(p, "y", &y);
  OK(lm_program_run(p));
  expect_output(p, "sum", &want);
  expect_output(p, "view", &h);
}

Test(ref, views_on_both_operands_of_an_op) {
  ht a = ht_rand(2, DIMS(5, 3), 0.05f, 10.0f, 1), b = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  lm_tensor ta = input_like("a", LM_ROLE_DATA, &a), tb = input_like("b", LM_ROLE_DATA, &b);
  int tr[2] = {1, 0}, pb[3] = {1, 2, 0};
  /* a^T [3,5] sliced to [3,4]; b permuted [3,4,2] summed over the last axis [3,4] */
  ht at = ht_permute(&a, tr), as = ht_slice(&at, 1, 1, 5);
  ht bp = ht_permute(&b, pb), bs = ht_reduce(&bp, 2, 0);
  ht prod = ht_map2(&as, &bs, f_mul);
  lm_tensor va = lm_slice(lm_permute(ta, tr), 1, 1, 5);
  lm_tensor vb = lm_sum_reduce(lm_permute(tb, pb), 2);
  output_like(lm_mul(va, vb), "prod", &prod);
  /* the same input through two different views, on both sides of one op: a^T padded after,
   * a reshaped to [3,5] (same shape, different elements) padded before */
  ht ap = ht_pad(&at, 1, 0, 2), ar = ht_reshape(&a, 2, DIMS(3, 5)), arp = ht_pad(&ar, 1, 2, 0);
  ht mix = ht_map2(&ap, &arp, f_add);
  output_like(lm_add(lm_pad(lm_permute(ta, tr), 1, 0, 2), lm_pad(lm_reshape(ta, 2, DIMS(3, 5)), 1, 2, 0)), "mix", &mix);
  lm_program_t *p = compile();
  put(p, "a", &a);
  put(p, "b", &b);
  OK(lm_program_run(p));
  expect_output(p, "mix", &mix);
  expect_output(p, "prod", &prod);
}

Test(ref, views_on_outputs_of_computed_nodes) {
  ht x = ht_rand(2, DIMS(3, 4), 0.05f, 10.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x);
  ht s = ht_map1(&x, sinf);
  int tr[2] = {1, 0};
  ht st = ht_permute(&s, tr), sp = ht_pad(&st, 0, 1, 0), spa = ht_affine_mod(&sp, 0, 2, 1);
  lm_tensor ts = lm_sin(tx);
  output_like(lm_affine_mod(lm_pad(lm_permute(ts, tr), 0, 1, 0), 0, 2, 1), "y", &spa);
  ht se = ht_expand(&s, 1, 2), ser = ht_reshape(&se, 2, DIMS(6, 4));
  output_like(lm_reshape(lm_expand(ts, 1, 2), 2, DIMS(6, 4)), "rows_twice", &ser);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "y", &spa);
  expect_output(p, "rows_twice", &ser);
}

Test(ref, views_feeding_reductions) {
  ht x = ht_rand(3, DIMS(2, 3, 4), 0.05f, 10.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x);
  int perm[3] = {2, 0, 1};
  ht px = ht_permute(&x, perm), pp = ht_pad(&px, 1, 1, 2), r1 = ht_reduce(&pp, 1, 0);
  output_like(lm_sum_reduce(lm_pad(lm_permute(tx, perm), 1, 1, 2), 1), "sum_pad", &r1);
  ht ex = ht_expand(&x, 1, 5), r2 = ht_reduce(&ex, 1, 1), r3 = ht_reduce(&ex, 1, 0);
  output_like(lm_max_reduce(lm_expand(tx, 1, 5), 1), "max_expand", &r2);
  output_like(lm_sum_reduce(lm_expand(tx, 1, 5), 1), "sum_expand", &r3);
  ht sl = ht_slice(&x, 2, 1, 3), am = ht_affine_mod(&sl, 1, 2, 0), rs = ht_reshape(&am, 2, DIMS(2, 6)),
     r4 = ht_reduce(&rs, 1, 1);
  output_like(lm_max_reduce(lm_reshape(lm_affine_mod(lm_slice(tx, 2, 1, 3), 1, 2, 0), 2, DIMS(2, 6)), 1), "mixed",
              &r4);
  /* padding zeros take part in a max: all-negative rows padded must reduce to 0 */
  ht neg = ht_map1(&x, fabsf);
  for (size_t i = 0; i < ht_numel(&neg); i++) neg.v[i] = -neg.v[i];
  lm_tensor tn = input_like("neg", LM_ROLE_DATA, &neg);
  ht np = ht_pad(&neg, 2, 0, 1), r5 = ht_reduce(&np, 2, 1);
  output_like(lm_max_reduce(lm_pad(tn, 2, 0, 1), 2), "max_pad", &r5);
  lm_program_t *p = compile();
  put(p, "x", &x);
  put(p, "neg", &neg);
  OK(lm_program_run(p));
  expect_output(p, "sum_pad", &r1);
  expect_output(p, "max_expand", &r2);
  expect_output(p, "sum_expand", &r3);
  expect_output(p, "mixed", &r4);
  expect_output(p, "max_pad", &r5);
  for (size_t i = 0; i < ht_numel(&r5); i++) cr_assert_eq(r5.v[i], 0.0f);
}

/* Random chains of views (seeded), each applied to the interpreter and eagerly on the host; the
 * chain ends in an output, an add with a data input, a sum or a max over a random axis. */
#define FUZZ_MAX_NUMEL 3000

typedef struct fuzz {
  lm_tensor t;
  ht h;
  char desc[1024];
  size_t len;
} fuzz;

static void fz_log(fuzz *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fz_log(fuzz *f, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (f->len < sizeof f->desc) {
    int n = vsnprintf(f->desc + f->len, sizeof f->desc - f->len, fmt, ap);
    if (n > 0) f->len += (size_t)n;
  }
  va_end(ap);
}

/* Applies one random view (or a contiguous) to both sides; 0 when the draw did not fit. */
static int fz_step(fuzz *f) {
  ht *h = &f->h;
  int r = h->rank;
  size_t n = ht_numel(h);
  switch (rng_int(0, 6)) {
  case 0: { /* permute */
    if (r < 2) return 0;
    int perm[LM_MAX_RANK];
    for (int i = 0; i < r; i++) perm[i] = i;
    for (int i = r - 1; i > 0; i--) {
      int j = rng_int(0, i), tmp = perm[i];
      perm[i] = perm[j];
      perm[j] = tmp;
    }
    fz_log(f, " permute{");
    for (int i = 0; i < r; i++) fz_log(f, "%s%d", i ? "," : "", perm[i]);
    fz_log(f, "}");
    f->t = lm_permute(f->t, perm);
    *h = ht_permute(h, perm);
    return 1;
  }
  case 1: { /* expand */
    int a = rng_int(0, r);
    int64_t k = rng_int(1, 3);
    if (r >= 6 || n * (size_t)k > FUZZ_MAX_NUMEL) return 0;
    fz_log(f, " expand(%d,%lld)", a, (long long)k);
    f->t = lm_expand(f->t, a, k);
    *h = ht_expand(h, a, k);
    return 1;
  }
  case 2: { /* slice, never empty */
    if (!r) return 0;
    int a = rng_int(0, r - 1);
    int64_t d = h->dim[a], s = rng_int(0, (int)d - 1), e = rng_int((int)s + 1, (int)d);
    fz_log(f, " slice(%d,%lld,%lld)", a, (long long)s, (long long)e);
    f->t = lm_slice(f->t, a, s, e);
    *h = ht_slice(h, a, s, e);
    return 1;
  }
  case 3: { /* pad */
    if (!r) return 0;
    int a = rng_int(0, r - 1);
    int64_t b = rng_int(0, 2), e = rng_int(0, 2);
    if (n / (size_t)h->dim[a] * (size_t)(h->dim[a] + b + e) > FUZZ_MAX_NUMEL) return 0;
    fz_log(f, " pad(%d,%lld,%lld)", a, (long long)b, (long long)e);
    f->t = lm_pad(f->t, a, b, e);
    *h = ht_pad(h, a, b, e);
    return 1;
  }
  case 4: { /* reshape: merge two neighbours, split one axis, or add/drop a unit axis */
    int64_t d[LM_MAX_RANK];
    int nr = 0, kind = rng_int(0, 3);
    if (kind == 0 && r >= 2) {
      int a = rng_int(0, r - 2);
      for (int i = 0; i < r; i++) {
        if (i == a + 1) continue;
        d[nr++] = i == a ? h->dim[a] * h->dim[a + 1] : h->dim[i];
      }
    } else if (kind == 1 && r >= 1 && r < 6) {
      int a = rng_int(0, r - 1);
      int64_t f0 = 0;
      for (int64_t c = 2; c < h->dim[a]; c++)
        if (h->dim[a] % c == 0 && (!f0 || rng_int(0, 1))) f0 = c;
      if (!f0) return 0;
      for (int i = 0; i < r; i++) {
        if (i == a) {
          d[nr++] = f0;
          d[nr++] = h->dim[a] / f0;
        } else d[nr++] = h->dim[i];
      }
    } else if (kind == 2 && r < 6) {
      int a = rng_int(0, r);
      for (int i = 0, k = 0; i <= r; i++) d[nr++] = i == a ? 1 : h->dim[k++];
    } else if (kind == 3 && r >= 1) {
      int a = -1;
      for (int i = 0; i < r; i++)
        if (h->dim[i] == 1) a = i;
      if (a < 0) return 0;
      for (int i = 0; i < r; i++)
        if (i != a) d[nr++] = h->dim[i];
    } else return 0;
    fz_log(f, " reshape[");
    for (int i = 0; i < nr; i++) fz_log(f, "%s%lld", i ? "," : "", (long long)d[i]);
    fz_log(f, "]");
    f->t = lm_reshape(f->t, nr, d);
    *h = ht_reshape(h, nr, d);
    return 1;
  }
  case 5: { /* affine_mod */
    if (!r) return 0;
    int a = rng_int(0, r - 1);
    int64_t d = h->dim[a], ca = rng_int(1, (int)d + 2), cb = rng_int(0, 2 * (int)d);
    fz_log(f, " affine_mod(%d,%lld,%lld)", a, (long long)ca, (long long)cb);
    f->t = lm_affine_mod(f->t, a, ca, cb);
    *h = ht_affine_mod(h, a, ca, cb);
    return 1;
  }
  default: /* a computed node in the middle: the chain restarts from a contiguous buffer */
    fz_log(f, " contiguous");
    f->t = lm_contiguous(f->t);
    return 1;
  }
}

Test(ref, random_view_chains_match_eager_host_views, .timeout = LM_TIMEOUT(120)) {
  int applied = 0, ends[4] = {0};
  for (int trial = 0; trial < 300; trial++) {
    scratch_reset();
    new_graph();
    fuzz f = {0};
    int r = rng_int(1, 3);
    int64_t d[3];
    for (int i = 0; i < r; i++) d[i] = rng_int(1, 5);
    ht x = ht_rand(r, d, 0.05f, 10.0f, 1);
    f.h = x;
    f.t = input_like("x", LM_ROLE_DATA, &x);
    fz_log(&f, "trial %d: x[", trial);
    for (int i = 0; i < r; i++) fz_log(&f, "%s%lld", i ? "," : "", (long long)d[i]);
    fz_log(&f, "]");
    int steps = rng_int(1, 8);
    for (int s = 0; s < steps; s++) {
      applied += fz_step(&f);
      cr_assert(lm_tensor_ok(f.t), "%s: construction failed: %s", f.desc,
                lm_graph_validate(G) != LM_OK ? lm_last_error() : "?");
    }
    ht want, other = {0};
    int end = rng_int(0, 3);
    if (end >= 2 && f.h.rank == 0) end = 0;
    ends[end]++;
    lm_tensor out;
    if (end == 1) {
      other = ht_rand(f.h.rank, f.h.dim, 0.05f, 10.0f, 1);
      want = ht_map2(&f.h, &other, f_add);
      out = lm_add(f.t, input_like("y", LM_ROLE_DATA, &other));
      fz_log(&f, " + y");
    } else if (end >= 2) {
      int a = rng_int(0, f.h.rank - 1);
      want = ht_reduce(&f.h, a, end == 3);
      out = end == 3 ? lm_max_reduce(f.t, a) : lm_sum_reduce(f.t, a);
      fz_log(&f, " %s(%d)", end == 3 ? "max" : "sum", a);
    } else {
      want = f.h;
      out = f.t;
    }
    cr_assert(lm_tensor_ok(out), "%s: construction failed", f.desc);
    expect_shape(out, &want, f.desc);
    OK(lm_output(out, "out"));
    lm_program_t *p = lm_program_new(B, G);
    cr_assert(p, "%s: lm_program_new: %s", f.desc, lm_last_error());
    progs[nprogs++] = p;
    put(p, "x", &x);
    if (end == 1) put(p, "y", &other);
    lm_status st = lm_program_run(p);
    cr_assert_eq(st, LM_OK, "%s: run: %s", f.desc, lm_last_error());
    ht got = get_like(p, "out", &want);
    expect_bits(&got, &want, f.desc);
  }
  cr_log_info("%d views applied; endings: %d outputs, %d adds, %d sums, %d maxes", applied, ends[0], ends[1], ends[2],
              ends[3]);
  cr_assert_gt(applied, 600, "the generator applied only %d views", applied); /* the fuzz must not be vacuous */
  for (int e = 0; e < 4; e++) cr_assert_gt(ends[e], 30, "ending %d drawn only %d times", e, ends[e]);
}

/* ================================================================ symbolic dimensions */

Test(ref, reshapes_over_N_times_T_run_for_several_bindings_of_one_program) {
  lm_dim N = lm_sym(G, "N"), T = lm_sym(G, "T"), NT = lm_dim_mul(G, N, T), TN = lm_dim_mul(G, T, N);
  cr_assert(lm_dim_equal(G, NT, TN), "N*T and T*N must be provably equal");
  lm_tensor a = lm_input(G, "a", LM_ROLE_DATA, 2, (lm_dim[]){N, T});
  lm_tensor b = lm_input(G, "b", LM_ROLE_DATA, 1, (lm_dim[]){NT});
  lm_tensor c = lm_input(G, "c", LM_ROLE_DATA, 2, (lm_dim[]){N, 3});
  lm_tensor flat = lm_mul(lm_reshape(a, 1, (lm_dim[]){NT}), b);
  lm_tensor tn = lm_reshape(flat, 2, (lm_dim[]){T, N});
  OK(lm_output(flat, "flat"));
  OK(lm_output(tn, "tn"));
  OK(lm_output(lm_sum_reduce(tn, 0), "colsum"));
  int tr[2] = {1, 0};
  OK(lm_output(lm_reshape(lm_permute(a, tr), 3, (lm_dim[]){T, N, 1}), "at"));
  OK(lm_output(lm_max_reduce(c, 0), "cmax"));
  OK(lm_output(lm_reshape(c, 1, (lm_dim[]){lm_dim_mul(G, N, 3)}), "cflat"));
  lm_program_t *p = compile();
  static const int64_t binds[][2] = {{1, 1}, {3, 2}, {2, 5}, {4, 4}, {7, 3}, {3, 2}};
  for (size_t k = 0; k < sizeof binds / sizeof binds[0]; k++) {
    int64_t n = binds[k][0], t = binds[k][1];
    OK(lm_program_bind(p, "N", n));
    OK(lm_program_bind(p, "T", t));
    ht ha = ht_rand(2, DIMS(n, t), 0.05f, 10.0f, 1), hb = ht_rand(1, DIMS(n * t), 0.05f, 10.0f, 1),
       hc = ht_rand(2, DIMS(n, 3), 0.05f, 10.0f, 1);
    put(p, "a", &ha);
    put(p, "b", &hb);
    put(p, "c", &hc);
    OK(lm_program_run(p));
    ht fa = ht_reshape(&ha, 1, DIMS(n * t)), hf = ht_map2(&fa, &hb, f_mul), htn = ht_reshape(&hf, 2, DIMS(t, n)),
       cs = ht_reduce(&htn, 0, 0), pa = ht_permute(&ha, tr), at = ht_reshape(&pa, 3, DIMS(t, n, 1)),
       cm = ht_reduce(&hc, 0, 1), cf = ht_reshape(&hc, 1, DIMS(n * 3));
    expect_output(p, "flat", &hf);
    expect_output(p, "tn", &htn);
    expect_output(p, "colsum", &cs);
    expect_output(p, "at", &at);
    expect_output(p, "cmax", &cm);
    expect_output(p, "cflat", &cf);
  }
}

Test(ref, pad_makes_N_plus_2_and_slicing_it_back_recovers_the_input) {
  lm_dim N = lm_sym(G, "N"), N1 = lm_dim_add(G, N, 1), N2 = lm_dim_add(G, N, 2);
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 3});
  lm_tensor px = lm_pad(x, 0, 1, 1);
  cr_assert(lm_dim_equal(G, lm_dim_of(px, 0), N2), "pad(1,1) of N must be N+2");
  lm_tensor back = lm_slice(px, 0, 1, N1);
  cr_assert(lm_dim_equal(G, lm_dim_of(back, 0), N), "slice [1, N+1) of N+2 must be N");
  OK(lm_output(px, "px"));
  OK(lm_output(back, "back"));
  OK(lm_output(lm_sum_reduce(px, 0), "colsum"));
  lm_tensor y = lm_input(G, "y", LM_ROLE_DATA, 2, (lm_dim[]){N2, 3});
  OK(lm_output(lm_mul(px, y), "prod")); /* N+2 from pad meets N+2 from an input */
  OK(lm_output(lm_pad(lm_expand(lm_sum_reduce(x, 1), 1, N), 1, N, 0), "sympad")); /* [N, 2N] */
  lm_program_t *p = compile();
  for (int64_t n = 1; n <= 7; n += 3) {
    OK(lm_program_bind(p, "N", n));
    ht hx = ht_rand(2, DIMS(n, 3), 0.05f, 10.0f, 1), hy = ht_rand(2, DIMS(n + 2, 3), 0.05f, 10.0f, 1);
    put(p, "x", &hx);
    put(p, "y", &hy);
    OK(lm_program_run(p));
    ht hp = ht_pad(&hx, 0, 1, 1), cs = ht_reduce(&hp, 0, 0), prod = ht_map2(&hp, &hy, f_mul);
    ht rs = ht_reduce(&hx, 1, 0), re = ht_expand(&rs, 1, n), sp = ht_pad(&re, 1, n, 0);
    expect_output(p, "px", &hp);
    expect_output(p, "back", &hx);
    expect_output(p, "colsum", &cs);
    expect_output(p, "prod", &prod);
    expect_output(p, "sympad", &sp);
  }
}

Test(ref, expand_and_broadcast_by_a_symbol) {
  lm_dim N = lm_sym(G, "N");
  ht w = ht_rand(1, DIMS(3), 0.05f, 10.0f, 1);
  lm_tensor tw = input_like("w", LM_ROLE_PARAM, &w);
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 3});
  OK(lm_output(lm_mul(x, tw), "xw"));                                   /* implicit broadcast */
  OK(lm_output(lm_expand(tw, 0, N), "rows"));                            /* explicit expand */
  OK(lm_output(lm_broadcast_to(lm_const(G, 0.5f), 2, (lm_dim[]){N, 3}), "half"));
  lm_program_t *p = compile();
  put(p, "w", &w);
  for (int64_t n = 2; n <= 6; n += 4) {
    OK(lm_program_bind(p, "N", n));
    ht hx = ht_rand(2, DIMS(n, 3), 0.05f, 10.0f, 1);
    put(p, "x", &hx);
    OK(lm_program_run(p));
    ht wb = ht_broadcast_to(&w, 2, DIMS(n, 3)), xw = ht_map2(&hx, &wb, f_mul), half = HT(n, 3);
    for (size_t i = 0; i < ht_numel(&half); i++) half.v[i] = 0.5f;
    expect_output(p, "xw", &xw);
    expect_output(p, "rows", &wb);
    expect_output(p, "half", &half);
  }
}

Test(ref, affine_mod_shuffle_with_symbolic_offset_and_extent) {
  lm_dim N = lm_sym(G, "N"), Boff = lm_sym_min(G, "B", 0);
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 2});
  OK(lm_output(lm_affine_mod(x, 0, 3, Boff), "shuffled"));
  lm_program_t *p = compile();
  static const int64_t binds[][2] = {{8, 0}, {8, 5}, {8, 13}, {7, 2}, {1, 0}};
  for (size_t k = 0; k < sizeof binds / sizeof binds[0]; k++) {
    int64_t n = binds[k][0], b = binds[k][1];
    OK(lm_program_bind(p, "N", n));
    OK(lm_program_bind(p, "B", b));
    ht hx = ht_rand(2, DIMS(n, 2), 0.05f, 10.0f, 1);
    put(p, "x", &hx);
    OK(lm_program_run(p));
    ht want = ht_affine_mod(&hx, 0, 3, b);
    expect_output(p, "shuffled", &want);
  }
}

/* ================================================================ assign */

Test(ref, assign_updates_state_after_the_run_and_reads_see_the_old_value) {
  ht s0 = ht_rand(2, DIMS(2, 3), 0.5f, 10.0f, 1);
  lm_tensor s = input_like("s", LM_ROLE_STATE, &s0);
  lm_tensor s1 = lm_add(s, lm_const(G, 1.0f));
  OK(lm_output(s, "before"));
  OK(lm_output(lm_mul(s, lm_const(G, 2.0f)), "twice_before"));
  OK(lm_output(s1, "plus_one"));
  OK(lm_assign(s, s1));
  lm_program_t *p = compile();
  put(p, "s", &s0);
  ht cur = s0;
  for (int k = 0; k < 3; k++) {
    OK(lm_program_run(p));
    ht next = ht_new(2, cur.dim), twice = ht_new(2, cur.dim);
    for (size_t i = 0; i < 6; i++) {
      next.v[i] = cur.v[i] + 1.0f;
      twice.v[i] = cur.v[i] * 2.0f;
    }
    expect_output(p, "before", &cur);
    expect_output(p, "twice_before", &twice);
    expect_output(p, "plus_one", &next);
    expect_output(p, "s", &next);
    cur = next;
  }
}

Test(ref, two_assigns_swap_state) {
  ht a0 = ht_rand(1, DIMS(5), 0.5f, 10.0f, 1), b0 = ht_rand(1, DIMS(5), 0.5f, 10.0f, 1);
  lm_tensor a = input_like("a", LM_ROLE_STATE, &a0), b = input_like("b", LM_ROLE_STATE, &b0);
  OK(lm_assign(a, b));
  OK(lm_assign(b, a));
  lm_program_t *p = compile();
  put(p, "a", &a0);
  put(p, "b", &b0);
  OK(lm_program_run(p));
  expect_output(p, "a", &b0);
  expect_output(p, "b", &a0);
  OK(lm_program_run(p));
  expect_output(p, "a", &a0);
  expect_output(p, "b", &b0);
}

Test(ref, parameters_are_assignable_and_state_starts_at_zero) {
  ht w0 = ht_rand(1, DIMS(4), 0.5f, 10.0f, 1), g = ht_rand(1, DIMS(4), 0.5f, 10.0f, 1);
  lm_tensor w = input_like("w", LM_ROLE_PARAM, &w0), tg = input_like("g", LM_ROLE_DATA, &g);
  lm_tensor m = lm_input(G, "m", LM_ROLE_STATE, 1, DIMS(4));
  /* one SGD-with-momentum step: m <- m*0.5 + g ; w <- w + m*(-0.1) (reading the old m) */
  lm_tensor m1 = lm_add(lm_mul(m, lm_const(G, 0.5f)), tg);
  OK(lm_assign(m, m1));
  OK(lm_assign(w, lm_add(w, lm_mul(m, lm_const(G, -0.1f)))));
  lm_program_t *p = compile();
  put(p, "w", &w0);
  put(p, "g", &g);
  ht hm = HT(4), hw = HT(4);
  for (int i = 0; i < 4; i++) {
    hm.v[i] = 0.0f;
    hw.v[i] = w0.v[i];
  }
  expect_output(p, "m", &hm);
  for (int k = 0; k < 3; k++) {
    OK(lm_program_run(p));
    for (int i = 0; i < 4; i++) {
      float step = hm.v[i] * -0.1f;
      hw.v[i] = hw.v[i] + step;
      float decayed = hm.v[i] * 0.5f;
      hm.v[i] = decayed + g.v[i];
    }
    expect_output(p, "m", &hm);
    expect_output(p, "w", &hw);
  }
}

Test(ref, assign_of_a_viewed_value) {
  ht s0 = ht_rand(2, DIMS(4, 4), 0.5f, 10.0f, 1), x = ht_rand(2, DIMS(3, 2), 0.5f, 10.0f, 1);
  lm_tensor s = input_like("s", LM_ROLE_STATE, &s0), tx = input_like("x", LM_ROLE_DATA, &x);
  lm_tensor u = lm_input(G, "u", LM_ROLE_STATE, 2, DIMS(2, 3));
  lm_tensor v = lm_input(G, "v", LM_ROLE_STATE, 1, DIMS(6));
  int tr[2] = {1, 0};
  OK(lm_assign(s, lm_permute(s, tr))); /* in-place transpose: every read must see the old s */
  OK(lm_assign(u, lm_permute(tx, tr)));
  OK(lm_assign(v, lm_reshape(lm_permute(tx, tr), 1, DIMS(6))));
  lm_program_t *p = compile();
  put(p, "s", &s0);
  put(p, "x", &x);
  OK(lm_program_run(p));
  ht st = ht_permute(&s0, tr), xt = ht_permute(&x, tr), xf = ht_reshape(&xt, 1, DIMS(6));
  expect_output(p, "s", &st);
  expect_output(p, "u", &xt);
  expect_output(p, "v", &xf);
  OK(lm_program_run(p));
  expect_output(p, "s", &s0);
}

Test(ref, assign_from_a_data_input_and_from_a_reduction) {
  ht x = ht_rand(2, DIMS(3, 4), 0.5f, 10.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x);
  lm_tensor last = lm_input(G, "last", LM_ROLE_STATE, 2, DIMS(3, 4));
  lm_tensor acc = lm_input(G, "acc", LM_ROLE_STATE, 1, DIMS(3));
  OK(lm_output(last, "prev"));
  OK(lm_assign(last, tx));
  OK(lm_assign(acc, lm_add(acc, lm_sum_reduce(tx, 1))));
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  ht zeros = HT(3, 4), rs = ht_reduce(&x, 1, 0), acc1 = HT(3), acc2 = HT(3);
  for (size_t i = 0; i < 12; i++) zeros.v[i] = 0.0f;
  for (int i = 0; i < 3; i++) {
    acc1.v[i] = 0.0f + rs.v[i];
    acc2.v[i] = acc1.v[i] + rs.v[i];
  }
  expect_output(p, "prev", &zeros);
  expect_output(p, "last", &x);
  expect_output(p, "acc", &acc1);
  OK(lm_program_run(p));
  expect_output(p, "prev", &x);
  expect_output(p, "acc", &acc2);
}

/* ================================================================ deep and wide graphs */

Test(ref, two_hundred_chained_ops_match_the_same_float_sequence) {
  ht x = ht_rand(2, DIMS(3, 7), 0.5f, 2.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht want = ht_new(2, x.dim);
  memcpy(want.v, x.v, 21 * sizeof(float));
  for (int i = 0; i < 200; i++) {
    float c = i % 2 ? 1.0f + (float)(i % 7 - 3) * 0.01f : (float)(i % 5 - 2) * 0.125f + 0.0625f;
    t = i % 2 ? lm_mul(t, lm_const(G, c)) : lm_add(t, lm_const(G, c));
    for (size_t k = 0; k < 21; k++) want.v[k] = i % 2 ? want.v[k] * c : want.v[k] + c;
  }
  cr_assert_geq(lm_graph_node_count(G), 400);
  output_like(t, "y", &want);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "y", &want);
}

/* A DAG-shaped index expression (every reshape reads the same linear index several times) must
 * be simplified in time linear in its size, not exponential: 36 views must take milliseconds. */
Test(ref, long_view_chains_on_one_edge_resolve_to_the_right_index, .timeout = LM_TIMEOUT(20)) {
  ht x = ht_rand(2, DIMS(4, 6), 0.05f, 10.0f, 1);
  lm_tensor t = input_like("x", LM_ROLE_DATA, &x);
  ht h = x;
  int tr[2] = {1, 0};
  for (int i = 0; i < 36; i++) {
    switch (i % 3) {
    case 0:
      t = lm_permute(t, tr);
      h = ht_permute(&h, tr);
      break;
    case 1: {
      int64_t d[2] = {h.dim[0] % 2 == 0 ? h.dim[0] / 2 : h.dim[0], 0};
      d[1] = (int64_t)ht_numel(&h) / d[0];
      t = lm_reshape(t, 2, d);
      h = ht_reshape(&h, 2, d);
      break;
    }
    default:
      t = lm_affine_mod(t, 1, 5, i);
      h = ht_affine_mod(&h, 1, 5, i);
    }
  }
  output_like(t, "y", &h);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "y", &h);
}

Test(ref, a_node_consumed_by_many_others) {
  ht x = ht_rand(2, DIMS(4, 5), 0.05f, 3.0f, 1);
  lm_tensor h = lm_sin(input_like("x", LM_ROLE_DATA, &x));
  ht hs = ht_map1(&x, sinf), acc = HT(4, 5);
  for (size_t i = 0; i < 20; i++) acc.v[i] = 0.0f;
  lm_tensor total = lm_broadcast_to(lm_const(G, 0.0f), 2, DIMS(4, 5));
  int tr[2] = {1, 0};
  for (int k = 1; k <= 64; k++) {
    float c = (float)k * 0.25f;
    total = lm_add(total, lm_mul(h, lm_const(G, c)));
    for (size_t i = 0; i < 20; i++) {
      float term = hs.v[i] * c;
      acc.v[i] = acc.v[i] + term;
    }
  }
  output_like(total, "total", &acc);
  /* the same node also read through a dozen different views by other consumers */
  ht want[12];
  char name[16];
  for (int k = 0; k < 12; k++) {
    ht v = k % 2 ? ht_permute(&hs, tr) : ht_pad(&hs, 1, (int64_t)k, 0);
    want[k] = ht_map2(&v, &v, f_mul);
    lm_tensor tv = k % 2 ? lm_permute(h, tr) : lm_pad(h, 1, k, 0);
    snprintf(name, sizeof name, "v%d", k);
    output_like(lm_mul(tv, tv), name, &want[k]);
  }
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p));
  expect_output(p, "total", &acc);
  for (int k = 0; k < 12; k++) {
    snprintf(name, sizeof name, "v%d", k);
    expect_output(p, name, &want[k]);
  }
}

/* ================================================================ the promise of finite values */

/* A graph that promises finite values (lm_graph_promise_finite) computes as any other while
 * they are; a value that is not fails the run with LM_ERR_INVALID naming the node and its op
 * (an input that is not: the input's name), since a compiled kernel may then differ. */
Test(ref, a_broken_promise_of_finite_values_fails_naming_the_node) {
  ht x = ht_rand(1, DIMS(8), 0.5f, 4.0f, 1);
  lm_tensor tx = input_like("x", LM_ROLE_DATA, &x);
  OK(lm_output(lm_recip(tx), "y"));
  lm_graph_promise_finite(G);
  lm_program_t *p = compile();
  put(p, "x", &x);
  OK(lm_program_run(p)); /* finite: runs */
  ht got = get(p, "y", 1, (int64_t[]){8});
  for (int i = 0; i < 8; i++) cr_assert_eq(bits(got.v[i]), bits(1.0f / x.v[i]));
  x.v[5] = 0.0f; /* 1/0: the recip computes inf */
  put(p, "x", &x);
  cr_assert_eq(lm_program_run(p), LM_ERR_INVALID);
  const char *m = lm_last_error();
  cr_assert(strstr(m, "promises finite values") && strstr(m, "computed inf at element 5") && strstr(m, "(recip)"), "%s",
            m);
  x.v[5] = NAN; /* a NaN input: named by the input's name */
  put(p, "x", &x);
  cr_assert_eq(lm_program_run(p), LM_ERR_INVALID);
  m = lm_last_error();
  cr_assert(strstr(m, "was given nan at element 5") && strstr(m, "(x)"), "%s", m);
}
