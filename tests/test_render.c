/* Tests for the renderer (compiler/render.c) on loop-IR plans built by hand: the C output is
 * compiled warning-free by gcc and clang, dlopened and run on host buffers (loop 0 split into
 * uneven chunks run in reverse order, reads outside a padded input trapped by guard pages) and
 * compared with values computed here; RAND is compared bit for bit with lm_rand_uniform. CUDA
 * output is compiled to CUBIN by NVRTC (dlopened; no GPU needed); OpenCL output is built and run
 * on the first OpenCL platform (PoCL in CI); MSL output is checked for its qualifiers. Parts
 * whose toolchain is missing skip with a message saying what is missing.
 *
 * Tolerances: statements that round once per IEEE operation (+, *, 1/x, sqrt, fmod, fmax, <) and
 * RAND are compared bit for bit on every dialect. Transcendentals (sin, exp2, log2) are bit for
 * bit on C (same libm as this test) and within rtol 2e-6 elsewhere (each device's libm is a few
 * ulp from glibc's; exp2(sin(x)) compounds two). */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>


#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The C dialect's exp2 and log2 (render.c's prelude): through expf and logf, which vectorise. */
static float c_exp2(float x) { return expf(x * 0.693147180559945309f); }
static float c_log2(float x) { return logf(x) * 1.44269504088896341f; }
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lumen/rand.h"
#include "render.h"
#include "support/check.h"

#define DEVICE_RTOL 2e-6

/* ---------------------------------------------------------------- fixtures: plans by hand */

enum { MAXB = 8, MAXS = 4 };

typedef struct fx {
  lm_graph_t *g;
  lm_plan *p;
  int64_t sym[MAXS];  /* symbol values, by symbol number */
  float *buf[MAXB];   /* host data per plan buffer */
  size_t count[MAXB];
  void *map[MAXB];    /* guarded buffers: the mapping, with PROT_NONE pages around the data */
  size_t maplen[MAXB];
  uint64_t rng[2];    /* seed, run */
  void (*verify)(const struct fx *f, double rtol);
} fx;

static lm_exprs *X(fx *f) { return &f->g->x; }
static lm_expr xv(fx *f, int i) { return lm_x_var(X(f), i); }
static lm_expr xc(fx *f, int64_t v) { return lm_x_const(X(f), v); }
static lm_expr xadd(fx *f, lm_expr a, lm_expr b) { return lm_x_add(X(f), a, b); }
static lm_expr xmul(fx *f, lm_expr a, lm_expr b) { return lm_x_mul(X(f), a, b); }
static lm_expr xsym(fx *f, const char *name, int64_t value) {
  lm_dim d = lm_sym(f->g, name);
  lm_expr e = lm_dim_expr(f->g, d);
  cr_assert(e && lm_x_node(X(f), e)->op == LM_X_SYM, "symbol %s", name);
  f->sym[lm_x_node(X(f), e)->v] = value;
  return e;
}

static fx *fx_new(void) {
  fx *f = calloc(1, sizeof *f);
  cr_assert(f);
  f->g = lm_graph_new();
  f->p = lm_calloc(1, sizeof *f->p);
  cr_assert(f->g && f->p);
  f->p->g = f->g;
  f->rng[0] = 0x0123456789abcdefull;
  f->rng[1] = 7;
  return f;
}

static void fx_free(fx *f) {
  for (int b = 0; b < MAXB; b++) {
    if (f->map[b]) munmap(f->map[b], f->maplen[b]);
    else free(f->buf[b]);
  }
  lm_plan_free(f->p);
  lm_graph_free(f->g);
  free(f);
}

/* A plan buffer of `count` floats. Guarded: the data ends exactly where a PROT_NONE page
 * begins and, when count fills whole pages, starts right after another. */
static uint32_t fx_buf(fx *f, lm_bufkind kind, size_t count, int guarded) {
  lm_plan *p = f->p;
  cr_assert(LM_GROW(p->bufs, p->bufcap, p->nbufs + 1));
  uint32_t b = (uint32_t)p->nbufs++;
  cr_assert(b < MAXB);
  p->bufs[b] = (lm_pbuf){.kind = (uint8_t)kind, .index = b, .numel = xc(f, (int64_t)count), .first = -1, .last = -1};
  f->count[b] = count;
  if (guarded) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (count * sizeof(float) + page - 1) / page * page;
    char *m = mmap(NULL, bytes + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(m != MAP_FAILED);
    cr_assert(!mprotect(m, page, PROT_NONE) && !mprotect(m + page + bytes, page, PROT_NONE));
    f->map[b] = m;
    f->maplen[b] = bytes + 2 * page;
    f->buf[b] = (float *)(void *)(m + page + bytes - count * sizeof(float));
  } else {
    f->buf[b] = calloc(count ? count : 1, sizeof(float));
    cr_assert(f->buf[b]);
  }
  return b;
}

static void fx_fill(fx *f, uint32_t b, uint64_t seed, double lo, double hi) {
  check_rng r = check_rng_new(seed);
  check_fill(&r, f->buf[b], f->count[b], lo, hi, 0.0);
}

static lm_kernel *fx_kernel(fx *f, const char *name) {
  lm_kernel *k = lm_plan_add_kernel(f->p, name);
  cr_assert(k);
  return k;
}

static int32_t loop(lm_kernel *k, int32_t parent, lm_expr extent, lm_loopkind kind) {
  int32_t l = lm_kernel_add_loop(k, parent, extent, kind);
  cr_assert(l >= 0);
  return l;
}

static uint32_t stmt(lm_kernel *k, lm_stmt s, int32_t before) {
  if (s.op == LM_S_LOAD || s.op == LM_S_STORE) cr_assert(lm_kernel_use_buf(k, s.buf));
  uint32_t id = lm_kernel_add_stmt(k, &s, before);
  cr_assert(id != UINT32_MAX);
  return id;
}

static uint32_t s_load(fx *f, lm_kernel *k, int32_t l, uint32_t buf, lm_expr idx, lm_expr valid, int32_t before) {
  return stmt(k, (lm_stmt){.op = LM_S_LOAD, .loop = l, .buf = buf, .idx = idx, .valid = valid ? valid : xc(f, 1)},
              before);
}
static uint32_t s_op(lm_kernel *k, int32_t l, lm_sop op, uint32_t a, uint32_t b) {
  return stmt(k, (lm_stmt){.op = (uint8_t)op, .loop = l, .a = a, .b = b}, -1);
}
static uint32_t s_const(lm_kernel *k, int32_t l, float v, int32_t before) {
  return stmt(k, (lm_stmt){.op = LM_S_CONST, .loop = l, .f = v}, before);
}
static uint32_t s_store(fx *f, lm_kernel *k, int32_t l, uint32_t buf, lm_expr idx, uint32_t a) {
  return stmt(k, (lm_stmt){.op = LM_S_STORE, .loop = l, .buf = buf, .idx = idx, .a = a, .valid = xc(f, 1)}, -1);
}

/* ---- comparisons */

static uint32_t bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

static void expect_float(const char *what, size_t i, float got, float want, double rtol) {
  if (isnan(want)) {
    cr_assert(isnan(got), "%s[%zu] = %.9g (0x%08x), want NaN", what, i, (double)got, bits(got));
    return;
  }
  if (rtol == 0.0 || isinf(want))
    cr_assert(bits(got) == bits(want), "%s[%zu] = %.9g (0x%08x), want %.9g (0x%08x) bit for bit", what, i,
              (double)got, bits(got), (double)want, bits(want));
  else
    cr_assert(fabs((double)got - (double)want) <= rtol * fabs((double)want), "%s[%zu] = %.9g, want %.9g (rtol %g)",
              what, i, (double)got, (double)want, rtol);
}

/* ---- the chain: out[n,j] = exp2(sin(x[n,j])) * w[j] * 1.5 over [N, 4] */

static void verify_chain(const fx *f, double rtol) {
  for (size_t i = 0; i < f->count[2]; i++)
    expect_float("chain", i, f->buf[2][i], c_exp2(sinf(f->buf[0][i])) * f->buf[1][i % 4] * 1.5f, rtol);
}

static fx *fx_chain(void) {
  fx *f = fx_new();
  lm_expr n = xsym(f, "N", 37);
  uint32_t x = fx_buf(f, LM_BUF_INPUT, 37 * 4, 0), w = fx_buf(f, LM_BUF_INPUT, 4, 0);
  uint32_t out = fx_buf(f, LM_BUF_OUTPUT, 37 * 4, 0);
  fx_fill(f, x, 1, -3, 3);
  fx_fill(f, w, 2, 0.5, 2);
  lm_kernel *k = fx_kernel(f, "k0_chain");
  int32_t l0 = loop(k, -1, n, LM_L_PARALLEL), l1 = loop(k, l0, xc(f, 4), LM_L_PARALLEL);
  k->npar = 2;
  lm_expr idx = xadd(f, xmul(f, xv(f, 0), xc(f, 4)), xv(f, 1));
  uint32_t a = s_load(f, k, l1, x, idx, 0, -1);
  uint32_t s = s_op(k, l1, LM_S_SIN, a, 0), e = s_op(k, l1, LM_S_EXP2, s, 0);
  uint32_t wv = s_load(f, k, l1, w, xv(f, 1), 0, -1);
  uint32_t m = s_op(k, l1, LM_S_MUL, e, wv), c = s_const(k, l1, 1.5f, -1);
  s_store(f, k, l1, out, idx, s_op(k, l1, LM_S_MUL, m, c));
  f->verify = verify_chain;
  return f;
}

/* ---- a reduction: osum[m] = sum_k A[m,k] * scale[m] (scale hoisted), omax[m] = max_k A[m,k] */

static void verify_reduce(const fx *f, double rtol) {
  (void)rtol; /* + * fmax only: exact everywhere */
  int64_t mm = f->sym[0], kk = f->sym[1];
  for (int64_t m = 0; m < mm; m++) {
    float acc = 0.0f, mx = -INFINITY;
    for (int64_t k = 0; k < kk; k++) {
      float a = f->buf[0][m * kk + k];
      acc += a * f->buf[1][m];
      mx = fmaxf(mx, a);
    }
    expect_float("sum", (size_t)m, f->buf[2][m], acc, 0);
    expect_float("max", (size_t)m, f->buf[3][m], mx, 0);
  }
}

static fx *fx_reduce(void) {
  fx *f = fx_new();
  lm_expr m = xsym(f, "M", 5), kx = xsym(f, "K_len", 7);
  uint32_t a = fx_buf(f, LM_BUF_INPUT, 35, 0), scale = fx_buf(f, LM_BUF_INPUT, 5, 0);
  uint32_t osum = fx_buf(f, LM_BUF_OUTPUT, 5, 0), omax = fx_buf(f, LM_BUF_OUTPUT, 5, 0);
  fx_fill(f, a, 3, -2, 2);
  fx_fill(f, scale, 4, 0.5, 2);
  lm_kernel *k = fx_kernel(f, "k0_reduce");
  int32_t l0 = loop(k, -1, m, LM_L_PARALLEL);
  k->npar = 1;
  int32_t l1 = loop(k, l0, kx, LM_L_SERIAL);
  uint32_t acc = stmt(k, (lm_stmt){.op = LM_S_ACC, .loop = l0, .f = 0.0f}, l1);
  uint32_t accm = stmt(k, (lm_stmt){.op = LM_S_ACC, .loop = l0, .f = -INFINITY}, l1);
  uint32_t sc = s_load(f, k, l0, scale, xv(f, 0), 0, l1);
  uint32_t av = s_load(f, k, l1, a, xadd(f, xmul(f, xv(f, 0), kx), xv(f, 1)), 0, -1);
  uint32_t prod = s_op(k, l1, LM_S_MUL, av, sc);
  stmt(k, (lm_stmt){.op = LM_S_ACC_SUM, .loop = l1, .a = acc, .b = prod}, -1);
  stmt(k, (lm_stmt){.op = LM_S_ACC_MAX, .loop = l1, .a = accm, .b = av}, -1);
  s_store(f, k, l0, osum, xv(f, 0), acc);
  s_store(f, k, l0, omax, xv(f, 0), accm);
  f->verify = verify_reduce;
  return f;
}

/* ---- padding and floor division: out[i] = 0 < i <= N ? exp2(x[i-1]) : 0 and
 * plus[i] = (0 < i <= N ? x[i-1] : 0) + 2 over [N+2] (x between guard pages, so evaluating the
 * index where it is invalid faults), and
 * roll[i] = x[(i-3) mod N] + x[(i+5) mod N] + x[floor((i-3)/4) + 1] */

static int64_t floordiv64(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0); }
static int64_t floormod64(int64_t a, int64_t b) { return a - b * floordiv64(a, b); }

static void verify_pad(const fx *f, double rtol) {
  int64_t n = f->sym[0];
  const float *x = f->buf[0];
  for (int64_t i = 0; i < n + 2; i++) {
    expect_float("pad", (size_t)i, f->buf[1][i], i >= 1 && i <= n ? c_exp2(x[i - 1]) : 0.0f, rtol);
    expect_float("pad_plus", (size_t)i, f->buf[3][i], (i >= 1 && i <= n ? x[i - 1] : 0.0f) + 2.0f, 0);
  }
  for (int64_t i = 0; i < n; i++) {
    float want = (x[floormod64(i - 3, n)] + x[floormod64(i + 5, n)]) + x[floordiv64(i - 3, 4) + 1];
    expect_float("roll", (size_t)i, f->buf[2][i], want, 0);
  }
}

static fx *fx_pad(void) {
  fx *f = fx_new();
  int64_t nv = (int64_t)sysconf(_SC_PAGESIZE) / 4; /* x fills one page exactly */
  lm_expr n = xsym(f, "N", nv);
  uint32_t x = fx_buf(f, LM_BUF_INPUT, (size_t)nv, 1), out = fx_buf(f, LM_BUF_OUTPUT, (size_t)nv + 2, 0);
  uint32_t roll = fx_buf(f, LM_BUF_OUTPUT, (size_t)nv, 0), plus = fx_buf(f, LM_BUF_OUTPUT, (size_t)nv + 2, 0);
  fx_fill(f, x, 5, -4, 4);

  lm_kernel *k = fx_kernel(f, "k0_pad");
  int32_t l0 = loop(k, -1, xadd(f, n, xc(f, 2)), LM_L_PARALLEL);
  k->npar = 1;
  lm_expr i = xv(f, 0);
  lm_expr valid = lm_x_and(X(f), lm_x_lt(X(f), xc(f, 0), i), lm_x_lt(X(f), i, xadd(f, n, xc(f, 1))));
  uint32_t v = s_load(f, k, l0, x, xadd(f, i, xc(f, -1)), valid, -1);
  uint32_t e = s_op(k, l0, LM_S_EXP2, v, 0);
  uint32_t sel = stmt(k, (lm_stmt){.op = LM_S_SELECT, .loop = l0, .a = e, .valid = valid}, -1);
  s_store(f, k, l0, out, i, sel);
  s_store(f, k, l0, plus, i, s_op(k, l0, LM_S_ADD, v, s_const(k, l0, 2.0f, -1))); /* v read twice: a local */

  k = fx_kernel(f, "k1_roll");
  l0 = loop(k, -1, n, LM_L_PARALLEL);
  k->npar = 1;
  i = xv(f, 0);
  uint32_t a = s_load(f, k, l0, x, lm_x_mod(X(f), xadd(f, i, xc(f, -3)), n), 0, -1);
  uint32_t b = s_load(f, k, l0, x, lm_x_mod(X(f), xadd(f, i, xc(f, 5)), n), 0, -1);
  uint32_t c = s_load(f, k, l0, x, xadd(f, lm_x_div(X(f), xadd(f, i, xc(f, -3)), xc(f, 4)), xc(f, 1)), 0, -1);
  uint32_t ab = s_op(k, l0, LM_S_ADD, a, b);
  s_store(f, k, l0, roll, i, s_op(k, l0, LM_S_ADD, ab, c));
  f->verify = verify_pad;
  return f;
}

/* ---- a gather by running remainders: for i < 6 (threads), j < 7 (serial), with symbols N = 13
 * and A = 30 (a step larger than the divisor):
 *   out[7 i + j] = x[(A i - 3 j + 11) mod N] + x[(2 A j + i) mod N] + x[(A i + 5) mod N] */
static void verify_gather(const fx *f, double rtol) {
  (void)rtol;
  int64_t n = f->sym[0], a = f->sym[1];
  const float *x = f->buf[0];
  for (int64_t i = 0; i < 6; i++)
    for (int64_t j = 0; j < 7; j++) {
      float want = x[floormod64(a * i - 3 * j + 11, n)] + x[floormod64(2 * a * j + i, n)] + x[floormod64(a * i + 5, n)];
      expect_float("gather", (size_t)(i * 7 + j), f->buf[1][i * 7 + j], want, 0);
    }
}

static fx *fx_gather(void) {
  fx *f = fx_new();
  lm_expr n = xsym(f, "N", 13), a = xsym(f, "A", 30);
  uint32_t x = fx_buf(f, LM_BUF_INPUT, 13, 1), out = fx_buf(f, LM_BUF_OUTPUT, 42, 0);
  fx_fill(f, x, 9, -4, 4);
  lm_kernel *k = fx_kernel(f, "k0_gather");
  int32_t l0 = loop(k, -1, xc(f, 6), LM_L_PARALLEL);
  k->npar = 1;
  int32_t l1 = loop(k, l0, xc(f, 7), LM_L_SERIAL);
  lm_expr i = xv(f, l0), j = xv(f, l1);
  lm_expr e0 = xadd(f, xadd(f, xmul(f, a, i), xmul(f, j, xc(f, -3))), xc(f, 11));
  lm_expr e1 = xadd(f, xmul(f, xmul(f, a, xc(f, 2)), j), i), e2 = xadd(f, xmul(f, a, i), xc(f, 5));
  uint32_t v0 = s_load(f, k, l1, x, lm_x_mod(X(f), e0, n), 0, -1);
  uint32_t v1 = s_load(f, k, l1, x, lm_x_mod(X(f), e1, n), 0, -1);
  uint32_t v2 = s_load(f, k, l1, x, lm_x_mod(X(f), e2, n), 0, -1);
  uint32_t sum = s_op(k, l1, LM_S_ADD, s_op(k, l1, LM_S_ADD, v0, v1), v2);
  s_store(f, k, l1, out, xadd(f, xmul(f, i, xc(f, 7)), j), sum);
  f->verify = verify_gather;
  return f;
}

/* ---- RAND: out[i] = uniform(stream 3, element i), big[i] = uniform(stream 0, element i + 2^33 + 1)
 * over [N, 4] (the large offset needs 64-bit index arithmetic) */

#define RAND_OFFSET ((1ll << 33) + 1)

static void verify_rand(const fx *f, double rtol) {
  (void)rtol; /* bit for bit everywhere */
  for (size_t i = 0; i < f->count[0]; i++) {
    expect_float("rand", i, f->buf[0][i], lm_rand_uniform(f->rng[0], 3, i, f->rng[1]), 0);
    expect_float("rand_big", i, f->buf[1][i], lm_rand_uniform(f->rng[0], 0, i + RAND_OFFSET, f->rng[1]), 0);
  }
}

static fx *fx_rand(void) {
  fx *f = fx_new();
  lm_expr n = xsym(f, "N", 19);
  uint32_t out = fx_buf(f, LM_BUF_OUTPUT, 19 * 4, 0), big = fx_buf(f, LM_BUF_OUTPUT, 19 * 4, 0);
  lm_kernel *k = fx_kernel(f, "k0_rand");
  int32_t l0 = loop(k, -1, n, LM_L_PARALLEL), l1 = loop(k, l0, xc(f, 4), LM_L_PARALLEL);
  k->npar = 2;
  lm_expr idx = xadd(f, xmul(f, xv(f, 0), xc(f, 4)), xv(f, 1));
  uint32_t r = stmt(k, (lm_stmt){.op = LM_S_RAND, .loop = l1, .idx = idx, .stream = 3}, -1);
  s_store(f, k, l1, out, idx, r);
  uint32_t r2 = stmt(k, (lm_stmt){.op = LM_S_RAND, .loop = l1, .idx = xadd(f, idx, xc(f, RAND_OFFSET)), .stream = 0}, -1);
  s_store(f, k, l1, big, idx, r2);
  f->verify = verify_rand;
  return f;
}

/* ---- npar == 0: the root block runs once. out = {0.5 * sum x[0..N), x0 < x1, fmod(x2, x3),
 * sqrt(x4), log2(x5), 1/x6, x1 < x0} */

static void verify_root(const fx *f, double rtol) {
  const float *x = f->buf[0], *o = f->buf[1];
  float acc = 0.0f;
  for (int64_t i = 0; i < f->sym[0]; i++) acc += x[i];
  expect_float("root", 0, o[0], acc * 0.5f, 0);
  expect_float("root", 1, o[1], x[0] < x[1] ? 1.0f : 0.0f, 0);
  expect_float("root", 2, o[2], fmodf(x[2], x[3]), 0);
  expect_float("root", 3, o[3], sqrtf(x[4]), 0);
  expect_float("root", 4, o[4], c_log2(x[5]), rtol);
  expect_float("root", 5, o[5], 1.0f / x[6], 0);
  expect_float("root", 6, o[6], x[1] < x[0] ? 1.0f : 0.0f, 0);
}

static fx *fx_root(void) {
  fx *f = fx_new();
  lm_expr n = xsym(f, "N", 9);
  uint32_t x = fx_buf(f, LM_BUF_INPUT, 16, 0), out = fx_buf(f, LM_BUF_OUTPUT, 7, 0);
  fx_fill(f, x, 6, 0.5, 3);
  lm_kernel *k = fx_kernel(f, "k0_root");
  k->npar = 0;
  int32_t l0 = loop(k, -1, n, LM_L_SERIAL);
  uint32_t acc = stmt(k, (lm_stmt){.op = LM_S_ACC, .loop = -1, .f = 0.0f}, l0);
  uint32_t xi = s_load(f, k, l0, x, xv(f, 0), 0, -1);
  stmt(k, (lm_stmt){.op = LM_S_ACC_SUM, .loop = l0, .a = acc, .b = xi}, -1);
  uint32_t half = s_const(k, -1, 0.5f, -1);
  s_store(f, k, -1, out, xc(f, 0), s_op(k, -1, LM_S_MUL, acc, half));
  uint32_t x0 = s_load(f, k, -1, x, xc(f, 0), 0, -1), x1 = s_load(f, k, -1, x, xc(f, 1), 0, -1);
  s_store(f, k, -1, out, xc(f, 1), s_op(k, -1, LM_S_LT, x0, x1));
  uint32_t x2 = s_load(f, k, -1, x, xc(f, 2), 0, -1), x3 = s_load(f, k, -1, x, xc(f, 3), 0, -1);
  s_store(f, k, -1, out, xc(f, 2), s_op(k, -1, LM_S_MOD, x2, x3));
  s_store(f, k, -1, out, xc(f, 3), s_op(k, -1, LM_S_SQRT, s_load(f, k, -1, x, xc(f, 4), 0, -1), 0));
  s_store(f, k, -1, out, xc(f, 4), s_op(k, -1, LM_S_LOG2, s_load(f, k, -1, x, xc(f, 5), 0, -1), 0));
  s_store(f, k, -1, out, xc(f, 5), s_op(k, -1, LM_S_RECIP, s_load(f, k, -1, x, xc(f, 6), 0, -1), 0));
  s_store(f, k, -1, out, xc(f, 6), s_op(k, -1, LM_S_LT, x1, x0));
  f->verify = verify_root;
  return f;
}

/* ---- float constants that must survive printing: out[j] = constant j */

static float const_values(int j) {
  float denorm_min, v16777217 = 16777216.0f;
  uint32_t one = 1;
  memcpy(&denorm_min, &one, sizeof one);
  const float v[] = {0.1f,     1.0f,    -0.0f,     denorm_min, FLT_MAX, -2.5e-38f, v16777217, INFINITY,
                     -INFINITY, NAN,    3.0f,      -1.0f / 3.0f, 1e10f, FLT_MIN,  0.0f};
  return v[j];
}
enum { NCONST = 15 };

static void verify_consts(const fx *f, double rtol) {
  (void)rtol;
  for (int j = 0; j < NCONST; j++) expect_float("const", (size_t)j, f->buf[0][j], const_values(j), 0);
}

static fx *fx_consts(void) {
  fx *f = fx_new();
  uint32_t out = fx_buf(f, LM_BUF_OUTPUT, NCONST, 0);
  lm_kernel *k = fx_kernel(f, "k0_consts");
  for (int j = 0; j < NCONST; j++) s_store(f, k, -1, out, xc(f, j), s_const(k, -1, const_values(j), -1));
  f->verify = verify_consts;
  return f;
}

/* ---- dead code: out[i] = x[i]; an unread load of w, an accumulator nobody reads (with its loop)
 * and an unused RAND must leave no unused variable behind */

static void verify_dead(const fx *f, double rtol) {
  (void)rtol;
  for (size_t i = 0; i < f->count[2]; i++) expect_float("dead", i, f->buf[2][i], f->buf[0][i], 0);
}

static fx *fx_dead(void) {
  fx *f = fx_new();
  lm_expr n = xsym(f, "N", 11);
  uint32_t x = fx_buf(f, LM_BUF_INPUT, 11, 0), w = fx_buf(f, LM_BUF_INPUT, 11, 0);
  uint32_t out = fx_buf(f, LM_BUF_OUTPUT, 11, 0);
  fx_fill(f, x, 7, -1, 1);
  lm_kernel *k = fx_kernel(f, "k0_dead");
  int32_t l0 = loop(k, -1, n, LM_L_PARALLEL);
  k->npar = 1;
  int32_t l1 = loop(k, l0, n, LM_L_SERIAL);
  uint32_t acc = stmt(k, (lm_stmt){.op = LM_S_ACC, .loop = l0, .f = 0.0f}, l1);
  uint32_t xj = s_load(f, k, l1, x, xv(f, 1), 0, -1);
  stmt(k, (lm_stmt){.op = LM_S_ACC_SUM, .loop = l1, .a = acc, .b = xj}, -1);
  uint32_t wv = s_load(f, k, l0, w, xv(f, 0), 0, -1);
  s_op(k, l0, LM_S_SIN, wv, 0);
  stmt(k, (lm_stmt){.op = LM_S_RAND, .loop = l0, .idx = xv(f, 0), .stream = 1}, -1);
  s_store(f, k, l0, out, xv(f, 0), s_load(f, k, l0, x, xv(f, 0), 0, -1));
  f->verify = verify_dead;
  return f;
}

/* ---- vector form: out[m,j] = (sum_k A[m,k] * B[k,j]) * (1 / s[j]) + 0.25 over [3, 24], K = 5,
 * the columns an LM_L_VECTOR loop (three lm_v8 per row) summing into a local row, FMAs allowed */

static void verify_vec(const fx *f, double rtol) {
  (void)rtol; /* FMAs round a*b+c once: within a few ulp of the magnitude of the terms */
  for (int m = 0; m < 3; m++)
    for (int j = 0; j < 24; j++) {
      double want = 0, mag = 0;
      for (int k = 0; k < 5; k++) {
        double t = (double)f->buf[0][m * 5 + k] * f->buf[1][k * 24 + j];
        want += t;
        mag += fabs(t);
      }
      double r = 1.0 / f->buf[2][j], got = f->buf[3][m * 24 + j];
      want = want * r + 0.25;
      cr_assert(fabs(got - want) <= 1e-6 * (mag * fabs(r) + 0.25), "vec[%d,%d] = %.9g, want %.9g", m, j, got, want);
    }
}

static uint32_t s_local(lm_kernel *k, lm_sop op, int32_t l, uint32_t loc, lm_expr idx, uint32_t a, lm_expr one) {
  uint32_t id = lm_kernel_add_stmt(k, &(lm_stmt){.op = (uint8_t)op, .loop = l, .buf = loc, .local = 1, .idx = idx,
                                                  .a = a, .valid = one}, -1);
  cr_assert(id != UINT32_MAX);
  return id;
}

static fx *fx_vec(void) {
  fx *f = fx_new();
  uint32_t a = fx_buf(f, LM_BUF_INPUT, 15, 0), b = fx_buf(f, LM_BUF_INPUT, 120, 0), sc = fx_buf(f, LM_BUF_INPUT, 24, 0);
  uint32_t out = fx_buf(f, LM_BUF_OUTPUT, 72, 0);
  fx_fill(f, a, 11, -2, 2);
  fx_fill(f, b, 12, -2, 2);
  fx_fill(f, sc, 13, 0.5, 2);
  lm_kernel *k = fx_kernel(f, "k0_vec");
  lm_expr one = xc(f, 1);
  int32_t m = loop(k, -1, xc(f, 3), LM_L_PARALLEL);
  k->npar = 1;
  k->contract = 1;
  uint32_t row = lm_kernel_add_local(k, 24, 0);
  int32_t zi = loop(k, m, xc(f, 24), LM_L_VECTOR);
  s_local(k, LM_S_STORE, zi, row, xv(f, zi), s_const(k, zi, 0.0f, -1), one); /* one value in every lane */
  int32_t kk = loop(k, m, xc(f, 5), LM_L_SERIAL);
  uint32_t av = s_load(f, k, kk, a, xadd(f, xmul(f, xv(f, m), xc(f, 5)), xv(f, kk)), 0, -1);
  int32_t j = loop(k, kk, xc(f, 24), LM_L_VECTOR);
  uint32_t bv = s_load(f, k, j, b, xadd(f, xmul(f, xv(f, kk), xc(f, 24)), xv(f, j)), 0, -1);
  uint32_t acc = s_local(k, LM_S_LOAD, j, row, xv(f, j), 0, one);
  s_local(k, LM_S_STORE, j, row, xv(f, j), s_op(k, j, LM_S_ADD, acc, s_op(k, j, LM_S_MUL, av, bv)), one);
  int32_t o = loop(k, m, xc(f, 24), LM_L_VECTOR);
  uint32_t r = s_op(k, o, LM_S_RECIP, s_load(f, k, o, sc, xv(f, o), 0, -1), 0);
  uint32_t sum = s_local(k, LM_S_LOAD, o, row, xv(f, o), 0, one);
  uint32_t v = s_op(k, o, LM_S_ADD, s_op(k, o, LM_S_MUL, sum, r), s_const(k, o, 0.25f, -1));
  s_store(f, k, o, out, xadd(f, xmul(f, xv(f, m), xc(f, 24)), xv(f, o)), v);
  f->verify = verify_vec;
  return f;
}

/* exp2 in a vec loop (lm_exp2_v8): 2 x 64 inputs from -200 to 200 with the edges of float's
 * range (2^128 overflows, 2^-149 is the smallest subnormal), the infinities and NaN. */
static const float vexp_edges[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 127.0f, 127.99f, 128.0f, 128.5f,
                                   -126.0f, -126.5f, -140.25f, -149.0f, -149.5f, -150.5f, 160.0f, -160.0f,
                                   200.0f, -200.0f, 1e-8f, -1e-8f, 23.999f, -0.49999997f};

static void vexp_inputs(fx *f, uint32_t b) {
  fx_fill(f, b, 21, -200, 200);
  float *x = f->buf[b];
  for (size_t i = 0; i < CHECK_COUNT(vexp_edges); i++) x[i] = vexp_edges[i];
  for (size_t i = 24; i < 64; i++) x[i] = (float)(i % 16) * 0.37f - 3.0f; /* tanh's range */
  x[70] = INFINITY;
  x[71] = -INFINITY;
  x[72] = NAN;
}

/* y = exp2(x) within 6e-7 where normal; a subnormal result within one step of 2^-149 (as exp2f
 * rounds), or 0 where the kernel flushes subnormals (flushed) */
static void verify_exp2(const fx *f, int flushed) {
  const float *x = f->buf[0], *y = f->buf[1];
  for (size_t i = 0; i < 128; i++) {
    double want = exp2((double)x[i]), got = y[i];
    if (isnan(x[i])) cr_assert(isnan(got), "exp2(NaN) = %.9g", got);
    else if (want >= 0x1p128) cr_assert(isinf(got) && got > 0, "exp2(%.9g) = %.9g, want inf", x[i], got);
    else if (want < 0x1p-126)
      cr_assert((flushed && got == 0.0) || fabs(got - want) <= 0x1p-149, "exp2(%.9g) = %.9g, want %.9g", x[i], got,
                want);
    else cr_assert(fabs(got - want) <= 6e-7 * want, "exp2(%.9g) = %.9g, want %.9g (rel %.3g)", x[i], got, want,
                   fabs(got - want) / want);
  }
}

static void verify_vexp(const fx *f, double rtol) {
  (void)rtol;
  verify_exp2(f, 0);
}

static fx *fx_vexp(void) {
  fx *f = fx_new();
  uint32_t in = fx_buf(f, LM_BUF_INPUT, 128, 0), out = fx_buf(f, LM_BUF_OUTPUT, 128, 0);
  vexp_inputs(f, in);
  lm_kernel *k = fx_kernel(f, "k0_vexp");
  int32_t p = loop(k, -1, xc(f, 2), LM_L_PARALLEL);
  k->npar = 1; /* not contracted: such a kernel flushes subnormal results to zero on the cpu */
  int32_t l = loop(k, p, xc(f, 64), LM_L_VECTOR);
  lm_expr at = xadd(f, xmul(f, xv(f, p), xc(f, 64)), xv(f, l));
  s_store(f, k, l, out, at, s_op(k, l, LM_S_EXP2, s_load(f, k, l, in, at, 0, -1), 0));
  f->verify = verify_vexp;
  return f;
}

/* A contracting kernel out[i] = op(in[i]) over `points` points of 64 serial elements each. */
static void contracted_unary(fx *f, const char *name, lm_sop op, uint32_t in, uint32_t out, int64_t points) {
  lm_kernel *k = fx_kernel(f, name);
  int32_t p = loop(k, -1, xc(f, points), LM_L_PARALLEL);
  k->npar = 1;
  k->contract = 1;
  int32_t l = loop(k, p, xc(f, 64), LM_L_SERIAL);
  lm_expr at = xadd(f, xmul(f, xv(f, p), xc(f, 64)), xv(f, l));
  s_store(f, k, l, out, at, s_op(k, l, op, s_load(f, k, l, in, at, 0, -1), 0));
}

/* a contracted kernel (FMAs, subnormals flushed) prints exp2 as lm_exp2_c, one value at a time:
 * the same polynomial as lm_exp2_v8 */
static void verify_cexp(const fx *f, double rtol) {
  (void)rtol;
  verify_exp2(f, 1);
}

static fx *fx_cexp(void) {
  fx *f = fx_new();
  uint32_t in = fx_buf(f, LM_BUF_INPUT, 128, 0), out = fx_buf(f, LM_BUF_OUTPUT, 128, 0);
  vexp_inputs(f, in);
  contracted_unary(f, "k0_cexp", LM_S_EXP2, in, out, 2);
  f->verify = verify_cexp;
  return f;
}

typedef fx *(*fx_maker)(void);
static const struct {
  const char *name;
  fx_maker make;
} fixtures[] = {{"chain", fx_chain}, {"reduce", fx_reduce}, {"pad", fx_pad}, {"rand", fx_rand},
                {"root", fx_root},   {"consts", fx_consts}, {"dead", fx_dead}, {"vec", fx_vec},
                {"vexp", fx_vexp}, {"gather", fx_gather}};

static char *render(const fx *f, lm_dialect d) {
  char *s = lm_render_plan(f->p, d);
  cr_assert(s, "render %s: %s", lm_dialect_name(d), lm_last_error());
  return s;
}

/* Text of kernel `name` within a rendered plan (from its signature to the end; in C, from its
 * helper's, which the entry follows). */
static const char *kernel_text(const char *src, const char *name) {
  char pat[64];
  snprintf(pat, sizeof pat, "void %s_k(", name);
  const char *s = strstr(src, pat);
  snprintf(pat, sizeof pat, "void %s(", name);
  if (!s) s = strstr(src, pat);
  cr_assert(s, "no kernel %s in:\n%s", name, src);
  return s;
}

static void expect_in(const char *src, const char *needle) {
  cr_assert(strstr(src, needle), "expected \"%s\" in:\n%s", needle, src);
}
static void expect_not_in(const char *src, const char *needle) {
  cr_assert(!strstr(src, needle), "unexpected \"%s\" in:\n%s", needle, src);
}

/* ---------------------------------------------------------------- C: compile, dlopen, run */

typedef void (*c_kernel)(float *const *B, const int64_t *S, const uint64_t *R, int64_t start, int64_t end);

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long n = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  char *s = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
  if (s && n > 0 && fread(s, 1, (size_t)n, fp) != (size_t)n) s[0] = 0;
  fclose(fp);
  return s;
}

static int have_tool(const char *tool) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "command -v %s > /dev/null 2>&1", tool);
  return system(cmd) == 0;
}

/* Compiles src with `cmd` (the compiler and its flags) into a shared object; dlopens it unless
 * handle is NULL. Fails the test with the compiler's output and the source. */
static void build_c(const char *src, const char *cmd, void **handle) {
  const char *tmp = getenv("TMPDIR");
  char dir[512], path[600], so[600], log[600], line[2048];
  snprintf(dir, sizeof dir, "%s/lumen-render-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  cr_assert(mkdtemp(dir), "mkdtemp %s", dir);
  snprintf(path, sizeof path, "%s/k.c", dir);
  snprintf(so, sizeof so, "%s/k.so", dir);
  snprintf(log, sizeof log, "%s/log", dir);
  FILE *fp = fopen(path, "w");
  cr_assert(fp);
  fputs(src, fp);
  fclose(fp);
  snprintf(line, sizeof line, "%s -o %s %s -lm > %s 2>&1", cmd, so, path, log);
  int rc = system(line);
  char *out = slurp(log);
  if (rc != 0) cr_assert_fail("`%s` failed:\n%s\n---- source ----\n%s", cmd, out ? out : "", src);
  free(out);
  if (handle) {
    *handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert(*handle, "dlopen: %s", dlerror());
  }
  remove(path);
  remove(so);
  remove(log);
  rmdir(dir);
}

static int64_t eval_sym_expr(const fx *f, lm_expr e) { return lm_x_eval(&f->g->x, e, NULL, f->sym); }

/* Runs every kernel like the cpu backend: loop 0 split into `chunks` uneven pieces, the last
 * first (results must not depend on the partition). */
static void run_c(fx *f, void *lib, int chunks) {
  for (size_t ki = 0; ki < f->p->nkernels; ki++) {
    const lm_kernel *k = &f->p->kernels[ki];
    char name[48];
    lm_render_entry_name(k, name, sizeof name);
    void *sym = dlsym(lib, name);
    cr_assert(sym, "kernel %s not exported", name);
    c_kernel fn;
    memcpy(&fn, &sym, sizeof sym);
    int64_t n = k->npar ? eval_sym_expr(f, k->loops[0].extent) : 1;
    for (int c = chunks; c-- > 0;) {
      int64_t lo = n * c * c / ((int64_t)chunks * chunks), hi = n * (c + 1) * (c + 1) / ((int64_t)chunks * chunks);
      fn(f->buf, f->sym, f->rng, lo, hi);
    }
  }
}

static void poison_outputs(fx *f) {
  for (size_t b = 0; b < f->p->nbufs; b++)
    if (f->p->bufs[b].kind != LM_BUF_INPUT) check_poison(f->buf[b], f->count[b]);
}

static const char *cc_run = "cc -std=c11 -O2 -Wall -Wextra -Werror -fPIC -shared";

/* Renders, builds and runs fixture `make` on C, then verifies it (bit for bit). */
static fx *run_c_fixture(fx_maker make, int chunks) {
  fx *f = make();
  char *src = render(f, LM_DIALECT_C);
  void *lib;
  build_c(src, cc_run, &lib);
  poison_outputs(f);
  run_c(f, lib, chunks);
  f->verify(f, 0.0);
  dlclose(lib);
  free(src);
  return f;
}

Test(render_c, chain_matches_sinf_exp2_product_bit_for_bit_for_any_chunking) {
  for (int chunks = 1; chunks <= 5; chunks += 2) fx_free(run_c_fixture(fx_chain, chunks));
  fx *f = fx_chain();
  char *src = render(f, LM_DIALECT_C);
  const char *k = kernel_text(src, "k0_chain");
  expect_in(k, "for (int64_t i0 = start; i0 < end; i0++) {");
  expect_in(k, "for (int64_t i1 = 0; i1 < 4; i1++) {");
  expect_in(k, "b2[i0*4 + i1] = lm_exp2(sinf(b0[i0*4 + i1])) * b1[i1] * 1.5f;");
  /* the buffers are restrict parameters of the helper (C honours restrict there), from B */
  expect_in(k, "void k0_chain_k(const float *restrict b0, const float *restrict b1, float *restrict b2, ");
  expect_in(k, "k0_chain_k(B[0], B[1], B[2], R, start, end);");
  expect_in(k, "(void)S;"); /* N only bounds loop 0, which runs over [start, end) */
  expect_in(k, "(void)R;");
  expect_not_in(k, "lm_floor");
  free(src);
  fx_free(f);
}

Test(render_c, reduction_with_accumulators_and_hoisted_load_is_exact) {
  fx_free(run_c_fixture(fx_reduce, 3));
  fx *f = fx_reduce();
  char *src = render(f, LM_DIALECT_C);
  const char *k = kernel_text(src, "k0_reduce");
  expect_not_in(k, "s_M"); /* M only bounds loop 0, which runs over [start, end) */
  expect_in(k, "const int64_t s_K_len, "); /* a parameter of the helper, */
  expect_in(k, "S[1], R, start, end);");    /* taken from S by the entry */
  expect_in(k, "float v0 = 0.0f;");
  expect_in(k, "float v1 = -INFINITY;");
  expect_in(k, "v1 = fmaxf(v1, v3);");
  const char *hoisted = strstr(k, "float v2 = b1[i0];"), *serial = strstr(k, "for (int64_t i1 = 0; i1 < s_K_len; i1++)");
  cr_assert(hoisted && serial && hoisted < serial, "scale[i0] is not loaded before the serial loop:\n%s", k);
  expect_in(serial, "v0 += v3 * v2;");
  free(src);
  fx_free(f);
}

Test(render_c, padded_load_reads_only_where_valid_and_floor_division_is_exact) {
  fx_free(run_c_fixture(fx_pad, 4)); /* a read of x[-1] or x[N] would fault on a guard page */
  fx *f = fx_pad();
  char *src = render(f, LM_DIALECT_C);
  const char *pad = kernel_text(src, "k0_pad"), *roll = kernel_text(src, "k1_roll");
  expect_in(pad, "float v0 = (0 < i0 && i0 < s_N + 1) ? b0[i0 - 1] : 0.0f;");
  /* (i0 - 3) mod N and (i0 + 5) mod N: running remainders over the thread's rows (strength_reduce) */
  expect_in(roll, "q0_0 = lm_floormod(-3 + start, s_N), q0_0d = lm_floormod(1, s_N), q0_0n = s_N");
  expect_in(roll, "b0[q0_0] + b0[q0_1]");
  expect_in(roll, "b0[lm_floordiv(i0 - 3, 4) + 1]"); /* a constant divisor: the compiler multiplies */
  expect_not_in(roll, " % ");
  free(src);
  fx_free(f);
}

/* A modulo by a symbolic divisor whose dividend steps by the same amount each iteration of an
 * open loop is a running remainder instead of a 64-bit division per iteration: over the serial
 * loop (steps -3 and 2A, A = 30 > N = 13) and over a thread's chunk of the parallel loop (step A,
 * from its start); every chunking computes exactly what the indices do. */
Test(render_c, modulos_by_a_symbol_become_running_remainders_for_any_chunking) {
  for (int chunks = 1; chunks <= 6; chunks += 2) fx_free(run_c_fixture(fx_gather, chunks));
  fx *f = fx_gather();
  char *src = render(f, LM_DIALECT_C);
  const char *k = kernel_text(src, "k0_gather");
  expect_in(k, "for (int64_t i0 = start, q0_");
  expect_in(k, "+ start*(s_A)");
  expect_in(k, "for (int64_t i1 = 0, q1_");
  expect_in(k, "= lm_floormod(-3, s_N)");
  expect_not_in(k, " % ");
  expect_in(k, "b1[i0*7 + i1] = b0[q1_1] + b0[q1_2] + b0[q0_0];"); /* no division in the body */
  free(src);
  fx_free(f);
}

Test(render_c, rand_equals_lm_rand_uniform_bit_for_bit) {
  static const uint64_t runs[][2] = {
      {0x0123456789abcdefull, 7}, {42, (1ull << 32) + 5}, {~0ull, ~0ull - 1}, {0, 0}};
  fx *f = fx_rand();
  char *src = render(f, LM_DIALECT_C);
  void *lib;
  build_c(src, cc_run, &lib);
  for (size_t i = 0; i < CHECK_COUNT(runs); i++) {
    f->rng[0] = runs[i][0];
    f->rng[1] = runs[i][1];
    poison_outputs(f);
    run_c(f, lib, 3);
    f->verify(f, 0.0);
  }
  expect_in(src, "lm_philox_u(R[0], 3u, (uint64_t)(i0), (uint32_t)(i1), R[1])");
  expect_in(src, "((int64_t)8589934593)");
  dlclose(lib);
  free(src);
  fx_free(f);
}

Test(render_c, npar_zero_kernel_runs_root_block_once_in_the_first_chunk) {
  fx *f = fx_root();
  char *src = render(f, LM_DIALECT_C);
  void *lib;
  build_c(src, cc_run, &lib);
  c_kernel fn;
  void *sym = dlsym(lib, "k0_root");
  cr_assert(sym);
  memcpy(&fn, &sym, sizeof sym);
  poison_outputs(f);
  fn(f->buf, f->sym, f->rng, 1, 2); /* not the first chunk */
  fn(f->buf, f->sym, f->rng, 0, 0); /* empty */
  for (size_t i = 0; i < f->count[1]; i++) cr_assert(isnan(f->buf[1][i]), "out[%zu] written outside [0, 1)", i);
  fn(f->buf, f->sym, f->rng, 0, 1);
  f->verify(f, 0.0);
  expect_in(src, "if (start == 0 && end > 0) {");
  dlclose(lib);
  free(src);
  fx_free(f);
}

Test(render_c, float_constants_round_trip_bit_for_bit) {
  fx *f = run_c_fixture(fx_consts, 1);
  char *src = render(f, LM_DIALECT_C);
  expect_in(src, "= -0.0f;");
  expect_in(src, "= 0.100000001f;");
  expect_in(src, "= 1.0f;");
  expect_in(src, "= -INFINITY;");
  expect_in(src, "= NAN;");
  free(src);
  fx_free(f);
}

Test(render_c, dead_statements_leave_no_unused_variables) {
  fx *f = run_c_fixture(fx_dead, 2); /* -Wall -Wextra -Werror */
  char *src = render(f, LM_DIALECT_C);
  const char *k = kernel_text(src, "k0_dead");
  expect_not_in(k, "b1"); /* w is only read by dead statements */
  expect_not_in(k, "lm_philox_uniform");
  expect_not_in(k, "+=");
  expect_not_in(k, "sinf");
  expect_not_in(k, "i1"); /* the accumulator's loop does nothing live */
  expect_not_in(k, "s_N");
  free(src);
  fx_free(f);
}

Test(render_c, vector_loops_run_eight_lanes_at_a_time_with_fmas_and_match_the_sums) {
  fx *f = run_c_fixture(fx_vec, 2); /* verify_vec: within FMA rounding */
  char *src = render(f, LM_DIALECT_C);
  const char *k = kernel_text(src, "k0_vec");
  expect_in(k, "LM_CONTRACT");
  expect_in(k, "LM_FLUSH_ON"); /* its entry runs the helper with subnormals flushed, then restores */
  expect_in(k, "LM_FLUSH_OFF");
  expect_in(src, "#pragma GCC optimize(\"fp-contract=fast\")");
  expect_in(k, "i1 += 8");
  expect_in(k, "lm_splat8(0.0f)");
  expect_in(k, "(*(const lm_v8 *)&b1[");
  expect_in(k, "*(lm_v8 *)&b3[");
  free(src);
  char *cu = render(f, LM_DIALECT_CUDA); /* other dialects: a plain serial loop, no FMA pragma */
  expect_not_in(cu, "lm_v8");
  expect_not_in(cu, "+= 8");
  free(cu);
  fx_free(f);
}

/* exp2 of eight lanes at a time (lm_exp2_v8, a polynomial with FMAs) is within 6e-7 of exp2 where
 * the result is normal, rounds subnormal results as exp2f does within one step, overflows to inf
 * from 2^128 on, keeps NaN; built and run with gcc too (its FMAs come from the kernel's pragma). */
Test(render_c, vector_exp2_is_within_6e_7_of_exp2_from_subnormals_to_overflow) {
  static const char *const compilers[] = {"gcc", "clang"};
  fx_free(run_c_fixture(fx_vexp, 2));
  int built = 0;
  for (size_t c = 0; c < CHECK_COUNT(compilers); c++) {
    if (!have_tool(compilers[c])) continue;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s -std=c11 -O3 -march=native -fno-math-errno -ffp-contract=off -fPIC -shared",
             compilers[c]);
    fx *f = fx_vexp();
    char *src = render(f, LM_DIALECT_C);
    expect_in(kernel_text(src, "k0_vexp"), "lm_exp2_v8((*(const lm_v8 *)&b0[");
    void *lib;
    build_c(src, cmd, &lib);
    poison_outputs(f);
    run_c(f, lib, 2);
    f->verify(f, 0.0);
    dlclose(lib);
    free(src);
    fx_free(f);
    built++;
  }
  if (!built) cr_skip_test("neither gcc nor clang is on PATH");
}

Test(render_c, a_contracted_kernels_exp2_is_the_polynomial_within_6e_7_of_exp2) {
  fx *f = run_c_fixture(fx_cexp, 2);
  char *src = render(f, LM_DIALECT_C);
  expect_in(kernel_text(src, "k0_cexp"), "lm_exp2_c(b0[");
  free(src);
  fx_free(f);
  f = fx_cexp();
  f->p->kernels[0].contract = 0; /* the reference's rounding kept: libm's expf */
  src = render(f, LM_DIALECT_C);
  expect_in(kernel_text(src, "k0_cexp"), "lm_exp2(b0[");
  free(src);
  fx_free(f);
}

/* ---- a point loop's scalar head printed as a loop of its own (render.c, point_fission) ------
 * Per row p < 37: y[p] = a[p] * 2 + 1 (or log2(a[p] * a[p] + 1)), then z[p, j] = y[p] * w[j] for
 * j < 64, y[p] read back from memory (FIS_MEM, FIS_LOG, FIS_CLOG: contracting) or used as the
 * head computed it (FIS_SSA: the loop cannot split). */
enum { FIS_MEM, FIS_SSA, FIS_LOG, FIS_CLOG };
static int fis_variant;

static void verify_fis(const fx *f, double rtol) {
  (void)rtol;
  const float *a = f->buf[0], *w = f->buf[1], *y = f->buf[2], *z = f->buf[3];
  int lg = fis_variant == FIS_LOG || fis_variant == FIS_CLOG;
  for (int p = 0; p < 37; p++) {
    float want = lg ? (float)log2((double)(a[p] * a[p] + 1.0f)) : a[p] * 2.0f + 1.0f;
    expect_float("y", (size_t)p, y[p], want, lg ? 3e-7 : 0.0);
    for (int j = 0; j < 64; j++) expect_float("z", (size_t)(p * 64 + j), z[p * 64 + j], y[p] * w[j], 0.0);
  }
}

static fx *fx_fis(void) {
  fx *f = fx_new();
  lm_expr n = xsym(f, "N", 37);
  uint32_t a = fx_buf(f, LM_BUF_INPUT, 37, 0), w = fx_buf(f, LM_BUF_INPUT, 64, 0);
  uint32_t y = fx_buf(f, LM_BUF_OUTPUT, 37, 0), z = fx_buf(f, LM_BUF_OUTPUT, 37 * 64, 0);
  fx_fill(f, a, 3, -2, 2);
  fx_fill(f, w, 4, -1, 1);
  lm_kernel *k = fx_kernel(f, "k0_fis");
  int32_t p = loop(k, -1, n, LM_L_PARALLEL);
  k->npar = 1;
  k->contract = fis_variant == FIS_CLOG;
  uint32_t av = s_load(f, k, p, a, xv(f, 0), 0, -1), v;
  if (fis_variant == FIS_LOG || fis_variant == FIS_CLOG)
    v = s_op(k, p, LM_S_LOG2, s_op(k, p, LM_S_ADD, s_op(k, p, LM_S_MUL, av, av), s_const(k, p, 1.0f, -1)), 0);
  else v = s_op(k, p, LM_S_ADD, s_op(k, p, LM_S_MUL, av, s_const(k, p, 2.0f, -1)), s_const(k, p, 1.0f, -1));
  s_store(f, k, p, y, xv(f, 0), v);
  uint32_t yb = fis_variant == FIS_SSA ? v : s_load(f, k, p, y, xv(f, 0), 0, -1);
  int32_t j = loop(k, p, xc(f, 64), LM_L_SERIAL);
  s_store(f, k, j, z, xadd(f, xmul(f, xv(f, 0), xc(f, 64)), xv(f, j)),
          s_op(k, j, LM_S_MUL, yb, s_load(f, k, j, w, xv(f, j), 0, -1)));
  f->verify = verify_fis;
  return f;
}

/* How many loops over the chunk's points the kernel prints, and whether the first has a loop. */
static int point_loops(const char *k, int *first_nested) {
  int n = 0;
  const char *at = strstr(k, "for (int64_t i0 = start"), *first = at;
  for (; at; at = strstr(at + 1, "for (int64_t i0 = start")) n++;
  const char *second = first ? strstr(first + 1, "for (int64_t i0 = start") : NULL, *inner = first ? strstr(first + 1, "for (") : NULL;
  *first_nested = inner && (!second || inner < second);
  return n;
}

Test(render_c, a_point_loops_scalar_head_runs_as_a_loop_of_its_own_where_the_rest_reads_it_from_memory) {
  static const struct {
    int variant, loops;
  } cases[] = {{FIS_MEM, 2}, {FIS_SSA, 1}, {FIS_LOG, 1}, {FIS_CLOG, 2}};
  for (size_t c = 0; c < CHECK_COUNT(cases); c++) {
    fis_variant = cases[c].variant;
    for (int chunks = 1; chunks <= 3; chunks += 2) fx_free(run_c_fixture(fx_fis, chunks));
    fx *f = fx_fis();
    char *src = render(f, LM_DIALECT_C);
    const char *k = kernel_text(src, "k0_fis");
    int nested = 0, n = point_loops(k, &nested);
    cr_assert_eq(n, cases[c].loops, "variant %d: %d point loops in:\n%s", cases[c].variant, n, k);
    if (n == 2) cr_assert(!nested, "variant %d: the head has a loop inside:\n%s", cases[c].variant, k);
    if (cases[c].variant == FIS_CLOG) expect_in(k, "lm_log2_c(");
    if (cases[c].variant == FIS_LOG) expect_in(k, "lm_log2(");
    free(src);
    fx_free(f);
  }
}

/* The contracting kernels' log2 (lm_log2_c) within 1.5 ulp of log2 over 2^20 floats of every
 * exponent, -inf at 0 and at subnormals (flushed), NaN below 0 and at NaN, inf at inf. */
enum { CLOG_N = 1 << 20 };
static void verify_clog(const fx *f, double rtol) {
  (void)rtol;
  const float *x = f->buf[0], *y = f->buf[1];
  for (size_t i = 0; i < CLOG_N; i++) {
    float got = y[i];
    if (isnan(x[i]) || x[i] < 0) cr_assert(isnan(got), "log2(%a) = %a, want NaN", (double)x[i], (double)got);
    else if (x[i] == 0 || fpclassify(x[i]) == FP_SUBNORMAL) cr_assert(got == -INFINITY, "log2(%a) = %a", (double)x[i], (double)got);
    else if (isinf(x[i])) cr_assert(got == INFINITY, "log2(inf) = %a", (double)got);
    else {
      double want = log2((double)x[i]), ulp = nextafterf((float)fabs(want), INFINITY) - (float)fabs(want);
      if (want == 0) cr_assert(got == 0, "log2(1) = %a", (double)got);
      else cr_assert(fabs(got - want) <= 1.5 * ulp, "log2(%a) = %a, want %a (%.2f ulp)", (double)x[i], (double)got, want,
                     fabs(got - want) / ulp);
    }
  }
}

static fx *fx_clog(void) {
  fx *f = fx_new();
  uint32_t in = fx_buf(f, LM_BUF_INPUT, CLOG_N, 0), out = fx_buf(f, LM_BUF_OUTPUT, CLOG_N, 0);
  float *x = f->buf[in];
  uint32_t s = 12345;
  for (size_t i = 0; i < CLOG_N; i++) { /* any bit pattern of a positive float, then the edges */
    s = s * 1664525u + 1013904223u;
    uint32_t b = s >> 1;
    memcpy(&x[i], &b, sizeof b);
  }
  const float edges[] = {0.0f, -0.0f, 1.0f, 2.0f, 0.5f, 1.41421356f, 0.70710678f, 1.0f + 0x1p-23f, 1.0f - 0x1p-24f,
                         FLT_MAX, FLT_MIN, 0x1p-140f, -1.0f, INFINITY, -INFINITY, NAN};
  memcpy(x, edges, sizeof edges);
  contracted_unary(f, "k0_clog", LM_S_LOG2, in, out, CLOG_N / 64);
  f->verify = verify_clog;
  return f;
}

Test(render_c, a_contracted_kernels_log2_is_the_polynomial_within_1_5_ulp_of_log2) {
  fx *f = run_c_fixture(fx_clog, 2);
  char *src = render(f, LM_DIALECT_C);
  expect_in(kernel_text(src, "k0_clog"), "lm_log2_c(b0[");
  free(src);
  fx_free(f);
}

/* par p < 2: for k < E: out[16 p + k] = in[16 p + k] * w[p], or a variant that must stay serial */
static int vec_case(int kind, char *why, size_t cap) {
  fx *f = fx_new();
  uint32_t in = fx_buf(f, LM_BUF_INPUT, 64, 0), w = fx_buf(f, LM_BUF_INPUT, 2, 0), out = fx_buf(f, LM_BUF_OUTPUT, 64, 0);
  lm_kernel *k = fx_kernel(f, "k0_case");
  int32_t p = loop(k, -1, xc(f, 2), LM_L_PARALLEL);
  k->npar = 1;
  int32_t l = loop(k, p, xc(f, kind == 1 ? 12 : 16), LM_L_SERIAL);
  lm_expr at = xadd(f, xmul(f, xv(f, p), xc(f, 16)), xmul(f, xv(f, l), xc(f, kind == 2 ? 2 : 1)));
  lm_expr valid = kind == 3 ? lm_x_lt(X(f), xv(f, l), xc(f, 10)) : 0;
  uint32_t x = s_load(f, k, l, in, at, valid, -1);
  uint32_t v = s_op(k, l, LM_S_MUL, x, s_load(f, k, l, w, xv(f, p), 0, -1));
  if (kind == 4) {
    uint32_t acc = stmt(k, (lm_stmt){.op = LM_S_ACC, .loop = p, .f = 0.0f}, l);
    stmt(k, (lm_stmt){.op = LM_S_ACC_SUM, .loop = l, .a = acc, .b = v}, -1);
  }
  if (kind == 6) v = s_op(k, l, LM_S_LOG2, v, 0);
  if (kind == 7) v = s_op(k, l, LM_S_ADD, v, s_load(f, k, l, out, xadd(f, at, xc(f, 1)), 0, -1));
  if (kind == 8) loop(k, l, xc(f, 2), LM_L_SERIAL);
  s_store(f, k, l, out, kind == 5 ? xv(f, p) : at, v);
  uint8_t *vary = calloc(k->nstmts + 1, 1);
  int ok = lm_vector_loop_check(X(f), k, l, vary, why, cap);
  if (ok) {
    cr_assert(vary[x] && vary[v], "the load and the product hold lanes");
    cr_assert(!vary[k->stmts[v].b], "w[p] is one value for every lane");
  }
  free(vary);
  fx_free(f);
  return ok;
}

Test(render, vector_loop_check_says_what_keeps_a_loop_serial) {
  char why[160];
  cr_assert(vec_case(0, why, sizeof why), "%s", why);
  static const struct {
    int kind;
    const char *why;
  } no[] = {{1, "multiple of 8"}, {2, "does not step by 0 or 1"}, {3, "guarded"}, {4, "not per lane"},
            {5, "one element from every lane"}, {6, "no vector form"}, {7, "two indices"}, {8, "a loop inside"}};
  for (size_t i = 0; i < CHECK_COUNT(no); i++) {
    why[0] = 0;
    cr_assert(!vec_case(no[i].kind, why, sizeof why), "case %d passed the check", no[i].kind);
    cr_assert(strstr(why, no[i].why), "case %d: \"%s\" does not say \"%s\"", no[i].kind, why, no[i].why);
  }
}

Test(render_c, every_fixture_compiles_warning_free_with_gcc_and_clang_at_O3) {
  static const char *const compilers[] = {"gcc", "clang"};
  int built = 0;
  for (size_t c = 0; c < CHECK_COUNT(compilers); c++) {
    if (!have_tool(compilers[c])) continue;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s -std=c11 -O3 -Wall -Wextra -Wshadow -Wpedantic -Werror -fPIC -shared",
             compilers[c]);
    for (size_t i = 0; i < CHECK_COUNT(fixtures); i++) {
      fx *f = fixtures[i].make();
      char *src = render(f, LM_DIALECT_C);
      build_c(src, cmd, NULL);
      free(src);
      fx_free(f);
    }
    built++;
  }
  if (!built) cr_skip_test("neither gcc nor clang is on PATH");
}

/* ---------------------------------------------------------------- the table, errors, OOM */

Test(render, dialect_table_is_complete) {
  for (int d = 0; d < LM_DIALECT_COUNT; d++) {
    const lm_dialect_info *t = lm_dialect_get((lm_dialect)d);
    cr_assert(t && t->name && t->kernel_qual && t->func_qual && t->global_qual && t->restrict_kw && t->i64 &&
              t->u32 && t->u64 && t->inf && t->nan && t->prelude, "dialect %d", d);
    for (int m = 0; m < LM_MATH_COUNT; m++) cr_assert(t->math[m] && *t->math[m], "dialect %s math %d", t->name, m);
    cr_assert((d == LM_DIALECT_C) == !t->global_id, "dialect %s: thread index", t->name);
    cr_assert(d == LM_DIALECT_C || (t->barrier && t->shared_qual), "dialect %s: barrier", t->name);
    cr_assert_str_eq(lm_dialect_name((lm_dialect)d), t->name);
    char *pre = lm_render_prelude((lm_dialect)d);
    cr_assert(pre && strstr(pre, "lm_philox_uniform") && strstr(pre, "lm_floordiv"));
    free(pre);
  }
  cr_assert_null(lm_dialect_get(LM_DIALECT_COUNT));
  cr_assert_null(lm_render_plan(NULL, LM_DIALECT_C));
}

Test(render, malformed_kernel_renders_null_with_a_message) {
  fx *f = fx_chain();
  lm_kernel *k = &f->p->kernels[0];
  k->stmts[k->nstmts - 1].buf = 5; /* the store names a buffer the plan lacks */
  cr_assert_null(lm_render_plan(f->p, LM_DIALECT_C));
  cr_assert(strstr(lm_last_error(), "k0_chain") && strstr(lm_last_error(), "buffer"), "%s", lm_last_error());
  k->stmts[k->nstmts - 1].buf = 2;
  k->stmts[k->nstmts - 1].a = 999; /* operand out of range */
  cr_assert_null(lm_render_kernel(f->p, k, LM_DIALECT_CUDA));
  cr_assert(strstr(lm_last_error(), "operand"), "%s", lm_last_error());
  fx_free(f);
}

Test(render, entry_names_are_identifiers) {
  lm_kernel k = {0};
  char buf[48];
  snprintf(k.name, sizeof k.name, "k3_out_loss/value.x");
  cr_assert_str_eq(lm_render_entry_name(&k, buf, sizeof buf), "k3_out_loss_value_x");
  snprintf(k.name, sizeof k.name, "3d");
  cr_assert_str_eq(lm_render_entry_name(&k, buf, sizeof buf), "k_3d");
}

Test(render, survives_every_allocation_failure) {
  for (int d = 0; d < LM_DIALECT_COUNT; d++) {
    fx *ref = fx_pad();
    char *want = render(ref, (lm_dialect)d);
    fx_free(ref);
    long ok = 0;
    for (long n = 1; n < 100000 && !ok; n++) {
      fx *f = fx_pad(); /* fresh: a failed intern leaves the expression arena unusable */
      lm_alloc_fail_after(n);
      char *got = lm_render_plan(f->p, (lm_dialect)d);
      lm_alloc_fail_after(0);
      if (got) {
        cr_assert_str_eq(got, want, "render after %ld allocations differs", n);
        ok = n;
      } else {
        cr_assert(strstr(lm_last_error(), "memory"), "n = %ld: %s", n, lm_last_error());
      }
      free(got);
      fx_free(f);
    }
    cr_assert(ok > 20, "%s: the first %ld allocations cannot all be the renderer's", lm_dialect_name((lm_dialect)d), ok);
    free(want);
  }
}

/* ---------------------------------------------------------------- CUDA: NVRTC to CUBIN */

typedef int (*nvrtc_create_fn)(void **prog, const char *src, const char *name, int nh, const char *const *h,
                               const char *const *hn);
typedef int (*nvrtc_compile_fn)(void *prog, int n, const char *const *opts);
typedef int (*nvrtc_size_fn)(void *prog, size_t *n);
typedef int (*nvrtc_get_fn)(void *prog, char *out);
typedef int (*nvrtc_destroy_fn)(void **prog);

static void *sym_or_null(void *lib, const char *name) { return lib ? dlsym(lib, name) : NULL; }
#define LOAD_FN(var, lib, name)                                                                                        \
  do {                                                                                                                 \
    void *s_ = sym_or_null(lib, name);                                                                                 \
    cr_assert(s_, "%s missing", name);                                                                                 \
    memcpy(&(var), &s_, sizeof s_);                                                                                    \
  } while (0)

Test(render_cuda, every_fixture_compiles_to_cubin_with_nvrtc_without_warnings) {
  if (access("/usr/local/cuda/include/nvrtc.h", F_OK) != 0)
    cr_skip_test("no CUDA toolkit (/usr/local/cuda/include/nvrtc.h): NVRTC compile not checked");
  static const char *const libs[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12",
                                     "/usr/local/cuda/lib64/libnvrtc.so"};
  void *lib = NULL;
  for (size_t i = 0; i < CHECK_COUNT(libs) && !lib; i++) lib = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) cr_skip_test("libnvrtc not loadable (%s): NVRTC compile not checked", dlerror());
  nvrtc_create_fn create;
  nvrtc_compile_fn compile;
  nvrtc_size_fn log_size, cubin_size;
  nvrtc_get_fn get_log, get_cubin;
  nvrtc_destroy_fn destroy;
  LOAD_FN(create, lib, "nvrtcCreateProgram");
  LOAD_FN(compile, lib, "nvrtcCompileProgram");
  LOAD_FN(log_size, lib, "nvrtcGetProgramLogSize");
  LOAD_FN(get_log, lib, "nvrtcGetProgramLog");
  LOAD_FN(cubin_size, lib, "nvrtcGetCUBINSize");
  LOAD_FN(get_cubin, lib, "nvrtcGetCUBIN");
  LOAD_FN(destroy, lib, "nvrtcDestroyProgram");
  static const char *const opts[] = {"--gpu-architecture=sm_90", "--fmad=false"};
  for (size_t i = 0; i < CHECK_COUNT(fixtures); i++) {
    fx *f = fixtures[i].make();
    char *src = render(f, LM_DIALECT_CUDA);
    void *prog = NULL;
    cr_assert_eq(create(&prog, src, "lumen.cu", 0, NULL, NULL), 0);
    int rc = compile(prog, (int)CHECK_COUNT(opts), opts);
    size_t n = 0;
    cr_assert_eq(log_size(prog, &n), 0);
    char *log = calloc(n + 1, 1);
    cr_assert(log && get_log(prog, log) == 0);
    cr_assert(rc == 0 && !strstr(log, "warning"), "NVRTC (%s): rc %d\n%s\n---- source ----\n%s", fixtures[i].name,
              rc, log, src);
    cr_assert_eq(cubin_size(prog, &n), 0);
    cr_assert(n > 0);
    char *cubin = malloc(n);
    cr_assert(cubin && get_cubin(prog, cubin) == 0);
    cr_assert(!memcmp(cubin, "\177ELF", 4), "CUBIN is not an ELF image");
    free(cubin);
    free(log);
    destroy(&prog);
    if (!strcmp(fixtures[i].name, "chain")) {
      const char *k = kernel_text(src, "k0_chain");
      expect_in(src, "extern \"C\" __global__ void k0_chain(float *const *B, const long long *S, "
                     "const unsigned long long *R, long long total) {");
      expect_in(k, "const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;");
      expect_in(k, "if (gid >= total) return;");
      expect_in(k, "const long long i0 = gid / 4;");
      expect_in(k, "const long long i1 = gid % 4;");
      expect_in(k, "const float *__restrict__ b0 = B[0];");
    }
    free(src);
    fx_free(f);
  }
  /* NVRTC stays loaded: unloaded, what it keeps reachable from its own globals reads as a leak */
  (void)lib;
}

/* ---------------------------------------------------------------- OpenCL: build and run */

typedef struct cl_api {
  void *lib, *ctx, *queue, *device;
  int32_t (*get_platforms)(uint32_t, void **, uint32_t *);
  int32_t (*get_devices)(void *, uint64_t, uint32_t, void **, uint32_t *);
  void *(*create_context)(const intptr_t *, uint32_t, void *const *, void *, void *, int32_t *);
  void *(*create_queue)(void *, void *, uint64_t, int32_t *);
  void *(*create_program)(void *, uint32_t, const char **, const size_t *, int32_t *);
  int32_t (*build_program)(void *, uint32_t, void *const *, const char *, void *, void *);
  int32_t (*build_info)(void *, void *, uint32_t, size_t, void *, size_t *);
  void *(*create_kernel)(void *, const char *, int32_t *);
  void *(*create_buffer)(void *, uint64_t, size_t, void *, int32_t *);
  int32_t (*set_arg)(void *, uint32_t, size_t, const void *);
  int32_t (*enqueue)(void *, void *, uint32_t, const size_t *, const size_t *, const size_t *, uint32_t,
                     const void *, void *);
  int32_t (*read)(void *, void *, uint32_t, size_t, size_t, void *, uint32_t, const void *, void *);
  int32_t (*finish)(void *);
  int32_t (*release_mem)(void *);
  int32_t (*release_kernel)(void *);
  int32_t (*release_program)(void *);
  int32_t (*release_queue)(void *);
  int32_t (*release_context)(void *);
} cl_api;

#define CL_DEVICE_TYPE_ALL_ 0xFFFFFFFFull
#define CL_MEM_READ_WRITE_ (1ull << 0)
#define CL_MEM_COPY_HOST_PTR_ (1ull << 5)
#define CL_PROGRAM_BUILD_LOG_ 0x1183u

/* 1 with a context and queue on the first device of the first platform, else 0 and why. */
static int cl_open(cl_api *cl, char *why, size_t cap) {
  memset(cl, 0, sizeof *cl);
  cl->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cl->lib) cl->lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
  if (!cl->lib) {
    snprintf(why, cap, "libOpenCL not loadable (install ocl-icd-libopencl1 and pocl-opencl-icd)");
    return 0;
  }
  LOAD_FN(cl->get_platforms, cl->lib, "clGetPlatformIDs");
  LOAD_FN(cl->get_devices, cl->lib, "clGetDeviceIDs");
  LOAD_FN(cl->create_context, cl->lib, "clCreateContext");
  LOAD_FN(cl->create_queue, cl->lib, "clCreateCommandQueue");
  LOAD_FN(cl->create_program, cl->lib, "clCreateProgramWithSource");
  LOAD_FN(cl->build_program, cl->lib, "clBuildProgram");
  LOAD_FN(cl->build_info, cl->lib, "clGetProgramBuildInfo");
  LOAD_FN(cl->create_kernel, cl->lib, "clCreateKernel");
  LOAD_FN(cl->create_buffer, cl->lib, "clCreateBuffer");
  LOAD_FN(cl->set_arg, cl->lib, "clSetKernelArg");
  LOAD_FN(cl->enqueue, cl->lib, "clEnqueueNDRangeKernel");
  LOAD_FN(cl->read, cl->lib, "clEnqueueReadBuffer");
  LOAD_FN(cl->finish, cl->lib, "clFinish");
  LOAD_FN(cl->release_mem, cl->lib, "clReleaseMemObject");
  LOAD_FN(cl->release_kernel, cl->lib, "clReleaseKernel");
  LOAD_FN(cl->release_program, cl->lib, "clReleaseProgram");
  LOAD_FN(cl->release_queue, cl->lib, "clReleaseCommandQueue");
  LOAD_FN(cl->release_context, cl->lib, "clReleaseContext");
  void *platform = NULL;
  uint32_t n = 0;
  if (cl->get_platforms(1, &platform, &n) != 0 || n == 0) {
    snprintf(why, cap, "no OpenCL platform (install pocl-opencl-icd)");
    return 0;
  }
  if (cl->get_devices(platform, CL_DEVICE_TYPE_ALL_, 1, &cl->device, &n) != 0 || n == 0) {
    snprintf(why, cap, "the OpenCL platform has no device");
    return 0;
  }
  int32_t err = 0;
  cl->ctx = cl->create_context(NULL, 1, &cl->device, NULL, NULL, &err);
  cr_assert(cl->ctx && err == 0, "clCreateContext: %d", err);
  cl->queue = cl->create_queue(cl->ctx, cl->device, 0, &err);
  cr_assert(cl->queue && err == 0, "clCreateCommandQueue: %d", err);
  return 1;
}

static void cl_close(cl_api *cl) {
  if (cl->queue) cl->release_queue(cl->queue);
  if (cl->ctx) cl->release_context(cl->ctx);
  /* libOpenCL stays loaded (see the NVRTC test): its platforms keep allocations of their own */
}

/* Builds the plan's OpenCL source and runs every kernel in order; outputs come back to f. */
static void run_cl(cl_api *cl, fx *f, const char *src) {
  int32_t err = 0;
  void *prog = cl->create_program(cl->ctx, 1, &src, NULL, &err);
  cr_assert(prog && err == 0);
  err = cl->build_program(prog, 1, &cl->device, "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt", NULL, NULL);
  size_t n = 0;
  cl->build_info(prog, cl->device, CL_PROGRAM_BUILD_LOG_, 0, NULL, &n);
  char *log = calloc(n + 1, 1);
  cr_assert(log);
  cl->build_info(prog, cl->device, CL_PROGRAM_BUILD_LOG_, n, log, NULL);
  cr_assert(err == 0, "clBuildProgram: %d\n%s\n---- source ----\n%s", err, log, src);
  free(log);
  const lm_plan *p = f->p;
  void *mem[MAXB] = {0};
  for (size_t b = 0; b < p->nbufs; b++) {
    mem[b] = cl->create_buffer(cl->ctx, CL_MEM_READ_WRITE_ | CL_MEM_COPY_HOST_PTR_, f->count[b] * sizeof(float),
                               f->buf[b], &err);
    cr_assert(mem[b] && err == 0, "clCreateBuffer: %d", err);
  }
  int64_t syms[MAXS];
  memcpy(syms, f->sym, sizeof syms);
  void *smem = cl->create_buffer(cl->ctx, CL_MEM_READ_WRITE_ | CL_MEM_COPY_HOST_PTR_, sizeof syms, syms, &err);
  void *rmem = cl->create_buffer(cl->ctx, CL_MEM_READ_WRITE_ | CL_MEM_COPY_HOST_PTR_, sizeof f->rng, f->rng, &err);
  cr_assert(smem && rmem);
  for (size_t ki = 0; ki < p->nkernels; ki++) {
    const lm_kernel *k = &p->kernels[ki];
    char name[48];
    void *kern = cl->create_kernel(prog, lm_render_entry_name(k, name, sizeof name), &err);
    cr_assert(kern && err == 0, "clCreateKernel %s: %d", name, err);
    uint32_t arg = 0;
    for (size_t j = 0; j < k->nbufs; j++) cr_assert_eq(cl->set_arg(kern, arg++, sizeof(void *), &mem[k->bufs[j]]), 0);
    int64_t total = 1;
    for (int l = 0; l < k->npar; l++) total *= eval_sym_expr(f, k->loops[l].extent);
    cr_assert_eq(cl->set_arg(kern, arg++, sizeof(void *), &smem), 0);
    cr_assert_eq(cl->set_arg(kern, arg++, sizeof(void *), &rmem), 0);
    cr_assert_eq(cl->set_arg(kern, arg++, sizeof total, &total), 0);
    size_t global = ((size_t)total + 63) / 64 * 64; /* more work-items than points: the guard */
    cr_assert_eq(cl->enqueue(cl->queue, kern, 1, NULL, &global, NULL, 0, NULL, NULL), 0);
    cr_assert_eq(cl->finish(cl->queue), 0);
    cl->release_kernel(kern);
  }
  for (size_t b = 0; b < p->nbufs; b++) {
    if (p->bufs[b].kind != LM_BUF_INPUT)
      cr_assert_eq(cl->read(cl->queue, mem[b], 1, 0, f->count[b] * sizeof(float), f->buf[b], 0, NULL, NULL), 0);
    cl->release_mem(mem[b]);
  }
  cl->release_mem(smem);
  cl->release_mem(rmem);
  cl->release_program(prog);
}

Test(render_opencl, every_fixture_builds_and_matches_on_the_first_platform) {
  cl_api cl;
  char why[256];
  if (!cl_open(&cl, why, sizeof why)) {
    cl_close(&cl);
    cr_skip_test("%s: OpenCL output not built or run", why);
  }
  for (size_t i = 0; i < CHECK_COUNT(fixtures); i++) {
    fx *f = fixtures[i].make();
    char *src = render(f, LM_DIALECT_OPENCL);
    poison_outputs(f);
    run_cl(&cl, f, src);
    f->verify(f, DEVICE_RTOL);
    if (!strcmp(fixtures[i].name, "rand")) { /* a run counter >= 2^32 and another seed */
      f->rng[0] = 42;
      f->rng[1] = (1ull << 32) + 5;
      poison_outputs(f);
      run_cl(&cl, f, src);
      f->verify(f, 0.0);
    }
    if (!strcmp(fixtures[i].name, "chain"))
      expect_in(src, "__kernel void k0_chain(__global const float *restrict b0, __global const float *restrict b1, "
                     "__global float *restrict b2, __global const long *S, __global const ulong *R, long total) {");
    free(src);
    fx_free(f);
  }
  cl_close(&cl);
}

/* ---------------------------------------------------------------- MSL: text only */

Test(render_msl, kernels_carry_metal_qualifiers_and_buffer_indices) {
  fx *f = fx_chain();
  char *src = render(f, LM_DIALECT_MSL);
  expect_in(src, "#include <metal_stdlib>");
  expect_in(src, "kernel void k0_chain(const device float *b0 [[buffer(0)]], const device float *b1 [[buffer(1)]], "
                 "device float *b2 [[buffer(2)]], constant long *S [[buffer(3)]], constant ulong *R [[buffer(4)]], "
                 "constant long &total [[buffer(5)]], uint tid [[thread_position_in_grid]]) {");
  expect_in(src, "const long gid = (long)tid;");
  expect_in(src, "metal::precise::exp2(metal::precise::sin(b0[i0*4 + i1]))");
  expect_in(src, "static inline float lm_philox_uniform(ulong seed, uint stream, ulong element, ulong run)");
  free(src);
  fx_free(f);
  f = fx_reduce();
  src = render(f, LM_DIALECT_MSL);
  expect_in(src, "v1 = metal::precise::fmax(v1, v3);");
  expect_in(src, "float v1 = -INFINITY;");
  free(src);
  fx_free(f);
}

/* ================================================================ work-group schedules */

#include "compile.h"
#include "gpu.h"
#include "lumen/lumen.h"

/* A matmul plan with compiler/gpu.c's tiles: the kernel has work-groups of 256 and shared
 * arrays; every GPU dialect declares them shared, waits at its own barrier and reads the
 * group and thread indices; C refuses it, naming why; a barrier outside a work-group schedule
 * is refused too. */
Test(render, work_group_schedules_render_shared_arrays_and_barriers_in_gpu_dialects_only) {
  lm_graph_t *g = lm_graph_new();
  lm_dim M = lm_sym(g, "M"), K = lm_sym(g, "K"), N = lm_sym(g, "N");
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){M, K});
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){K, N});
  cr_assert_eq(lm_output(lm_matmul(a, b), "y"), LM_OK);
  lm_compiled comp;
  cr_assert_eq(lm_compile(g, NULL, &comp), LM_OK, "%s", lm_last_error());
  lm_gpu_options go;
  lm_gpu_options_default(&go, 48 * 1024);
  cr_assert_eq(lm_schedule_gpu(comp.plan, &go), 1, "the matmul was not tiled");
  const lm_kernel *k = &comp.plan->kernels[0];
  cr_assert_eq(k->group, 256);
  cr_assert(k->nshared >= 2, "no shared arrays");
  static const struct {
    lm_dialect d;
    const char *shared, *barrier, *index;
  } want[] = {
      {LM_DIALECT_CUDA, "__shared__ float", "__syncthreads();", "blockIdx.x"},
      {LM_DIALECT_OPENCL, "__local float", "barrier(CLK_LOCAL_MEM_FENCE);", "get_group_id(0)"},
      {LM_DIALECT_MSL, "threadgroup float", "threadgroup_barrier(mem_flags::mem_threadgroup);",
       "[[thread_position_in_threadgroup]]"},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *src = lm_render_plan(comp.plan, want[i].d);
    cr_assert(src, "%s: %s", lm_dialect_name(want[i].d), lm_last_error());
    cr_assert(strstr(src, want[i].shared) && strstr(src, want[i].barrier) && strstr(src, want[i].index),
              "%s source lacks %s / %s / %s:\n%s", lm_dialect_name(want[i].d), want[i].shared, want[i].barrier,
              want[i].index, src);
    cr_assert_null(strstr(src, "if (gid >= total) return;"), "a work-group kernel must not return early");
    lm_free(src);
  }
  cr_assert_null(lm_render_plan(comp.plan, LM_DIALECT_C));
  cr_assert(strstr(lm_last_error(), "GPU dialect"), "%s", lm_last_error());
  /* a barrier in a kernel without work-groups */
  lm_kernel *kk = &comp.plan->kernels[0];
  kk->group = 0;
  for (size_t i = 0; i < kk->nshared; i++) kk->shared[i] = 0;
  cr_assert_null(lm_render_plan(comp.plan, LM_DIALECT_CUDA));
  cr_assert(strstr(lm_last_error(), "barrier") || strstr(lm_last_error(), "thread loop"), "%s", lm_last_error());
  lm_compiled_free(&comp);
  lm_graph_free(g);
}

/* A long row sum as a tree reduction (compiler/gpu.c): with warp = 32 (CUDA) its last five
 * halvings are warp shuffles, which only the CUDA dialect prints; without, the whole tree
 * stays in shared memory and renders everywhere. */
Test(render, tree_reductions_end_in_warp_shuffles_in_cuda_only) {
  lm_graph_t *g = lm_graph_new();
  lm_dim K = lm_sym(g, "K");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){4, K});
  cr_assert_eq(lm_output(lm_sum_reduce(x, 1), "y"), LM_OK);
  for (int warp = 0; warp <= 32; warp += 32) {
    lm_compiled comp;
    cr_assert_eq(lm_compile(g, NULL, &comp), LM_OK, "%s", lm_last_error());
    lm_gpu_options go;
    lm_gpu_options_default(&go, 48 * 1024);
    go.warp = warp;
    cr_assert_eq(lm_schedule_gpu(comp.plan, &go), 1, "the row sum was not scheduled");
    cr_assert_eq(comp.plan->kernels[0].group, 256);
    char *cu = lm_render_plan(comp.plan, LM_DIALECT_CUDA);
    cr_assert(cu, "%s", lm_last_error());
    cr_assert_eq(strstr(cu, "__shfl_down_sync") != NULL, warp == 32, "warp %d:\n%s", warp, cu);
    lm_free(cu);
    char *cl = lm_render_plan(comp.plan, LM_DIALECT_OPENCL);
    if (warp) {
      cr_assert_null(cl, "OpenCL printed a warp shuffle");
      cr_assert(strstr(lm_last_error(), "warp"), "%s", lm_last_error());
    } else {
      cr_assert(cl && strstr(cl, "barrier(CLK_LOCAL_MEM_FENCE);"), "%s", cl ? cl : lm_last_error());
    }
    lm_free(cl);
    lm_compiled_free(&comp);
  }
  lm_graph_free(g);
}
