/* Tests for scans (lm_program_new_scan) on the ref and cpu backends: a forward recurrence and a
 * reverse discounted sum (GAE-style) against plain C loops, for several T and N, with the carry
 * kept across runs; RAND inside a scan drawing what T runs of the step would (run counter
 * run*T + t); the errors (a per-step name that is no input, a per-step state, T unbound); the
 * kernel count of env-local scans on cpu (one kernel for the whole scan); and a step reading
 * other envs' carry, which cpu runs step by step, against ref.
 *
 * Tolerances: the recurrences do the same float operations in the same order as the C loops
 * (one IEEE operation per C statement, no contraction), and RAND is bit-identical to
 * lm_rand_uniform, so those are compared bit for bit. The tanh step (a composition over exp2)
 * is compared with a double-precision C loop within rtol 1e-4 + atol 1e-5. Inputs come from
 * fixed seeds; outputs are NaN-poisoned before every read. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h" /* lm_clear_error */
#include "loopir.h" /* compiler/columns.c on hand-built kernels */
#include "lumen/lumen.h"
#include "support/check.h"

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

static const char *const backends[] = {"ref", "cpu"};

static lm_backend_t *open_backend(const char *name) {
  lm_backend_t *b = lm_backend_new(name);
  cr_assert(b, "backend %s: %s", name, lm_last_error());
  return b;
}

static void put(lm_program_t *p, const char *name, const float *v, size_t n) {
  size_t have = 0;
  OK(lm_program_numel(p, name, &have));
  cr_assert_eq(have, n, "%s holds %zu elements, the test has %zu", name, have, n);
  OK(lm_program_write(p, name, v, n));
}

/* Reads n floats (NaN-poisoned first) into a fresh buffer. */
static float *get(lm_program_t *p, const char *name, size_t n) {
  size_t have = 0;
  OK(lm_program_numel(p, name, &have));
  cr_assert_eq(have, n, "%s holds %zu elements, the test expects %zu", name, have, n);
  float *v = malloc((n ? n : 1) * sizeof *v);
  cr_assert(v);
  check_poison(v, n);
  OK(lm_program_read(p, name, v, n));
  return v;
}

static void expect_bits(const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    cr_assert(got[i] == want[i] && signbit(got[i]) == signbit(want[i]), "%s[%zu] = %.9g, expected %.9g", what, i,
              (double)got[i], (double)want[i]);
}

static float *rand_floats(check_rng *r, size_t n, double lo, double hi) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  cr_assert(v);
  check_fill(r, v, n, lo, hi, 0.01);
  return v;
}

/* ================================================================ forward recurrence */

/* step: h' = 0.5 * h + x_t; y_t = h' (state h [N], per-step x, seen as [N]) */
static lm_graph_t *recurrence_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_mul_scalar(h, 0.5f), x);
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  return g;
}

static void recurrence_on(const char *backend) {
  static const int64_t sizes[][2] = {{1, 1}, {4, 3}, {17, 70}, {3, 129}};
  lm_graph_t *g = recurrence_graph();
  lm_backend_t *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
  cr_assert(p, "%s: lm_program_new_scan: %s", backend, lm_last_error());
  check_rng r = check_rng_new(42);
  for (size_t c = 0; c < CHECK_COUNT(sizes); c++) {
    int64_t T = sizes[c][0], N = sizes[c][1];
    size_t n = (size_t)N, tn = (size_t)(T * N);
    OK(lm_program_bind(p, "T", T));
    OK(lm_program_bind(p, "N", N));
    float *h = rand_floats(&r, n, -4, 4);
    put(p, "h", h, n);
    for (int run = 0; run < 2; run++) { /* the second run continues from the carried state */
      float *x = rand_floats(&r, tn, -1, 1), *want = malloc(tn * sizeof *want);
      for (int64_t t = 0; t < T; t++)
        for (size_t e = 0; e < n; e++) {
          float m = h[e] * 0.5f;
          h[e] = m + x[(size_t)t * n + e];
          want[(size_t)t * n + e] = h[e];
        }
      put(p, "x", x, tn);
      uint64_t before = lm_program_run_index(p);
      OK(lm_program_run(p));
      cr_assert_eq(lm_program_run_index(p), before + 1, "a scan is one run");
      char what[96];
      snprintf(what, sizeof what, "%s T=%lld N=%lld run %d: y", backend, (long long)T, (long long)N, run);
      float *y = get(p, "y", tn);
      expect_bits(what, y, want, tn);
      snprintf(what, sizeof what, "%s T=%lld N=%lld run %d: state h", backend, (long long)T, (long long)N, run);
      float *hs = get(p, "h", n);
      expect_bits(what, hs, h, n);
      free(x);
      free(want);
      free(y);
      free(hs);
    }
    free(h);
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

Test(scan, forward_recurrence_matches_a_c_loop_on_ref) { recurrence_on("ref"); }
Test(scan, forward_recurrence_matches_a_c_loop_on_cpu) { recurrence_on("cpu"); }

/* ================================================================ reverse discounted sum */

#define GAMMA 0.97f

/* step: a' = r_t + gamma * (1 - done_t) * a; out_t = a' (reverse) */
static lm_graph_t *discount_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor a = lm_input(g, "a", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor rw = lm_input(g, "r", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor done = lm_input(g, "done", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor keep = lm_sub(lm_scalar_like(done, 1.0f), done);
  lm_tensor a2 = lm_add(rw, lm_mul(lm_mul_scalar(keep, GAMMA), a));
  OK(lm_output(a2, "ret"));
  OK(lm_assign(a, a2));
  return g;
}

static void discount_on(const char *backend) {
  static const int64_t sizes[][2] = {{1, 2}, {6, 5}, {40, 67}};
  lm_graph_t *g = discount_graph();
  lm_backend_t *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(b, g, "T", 1, (const char *[]){"r", "done"}, 2);
  cr_assert(p, "%s: lm_program_new_scan: %s", backend, lm_last_error());
  check_rng r = check_rng_new(7);
  for (size_t c = 0; c < CHECK_COUNT(sizes); c++) {
    int64_t T = sizes[c][0], N = sizes[c][1];
    size_t n = (size_t)N, tn = (size_t)(T * N);
    OK(lm_program_bind(p, "T", T));
    OK(lm_program_bind(p, "N", N));
    float *a = rand_floats(&r, n, -2, 2), *rw = rand_floats(&r, tn, -1, 1), *done = malloc(tn * sizeof *done);
    float *want = malloc(tn * sizeof *want);
    for (size_t i = 0; i < tn; i++) done[i] = check_next(&r) % 5 == 0 ? 1.0f : 0.0f;
    put(p, "a", a, n);
    put(p, "r", rw, tn);
    put(p, "done", done, tn);
    for (int64_t t = T - 1; t >= 0; t--)
      for (size_t e = 0; e < n; e++) {
        size_t i = (size_t)t * n + e;
        float keep = 1.0f - done[i];
        float k = keep * GAMMA;
        float m = k * a[e];
        a[e] = rw[i] + m;
        want[i] = a[e];
      }
    OK(lm_program_run(p));
    char what[96];
    snprintf(what, sizeof what, "%s T=%lld N=%lld: returns", backend, (long long)T, (long long)N);
    float *got = get(p, "ret", tn);
    expect_bits(what, got, want, tn);
    float *as = get(p, "a", n);
    snprintf(what, sizeof what, "%s T=%lld N=%lld: state a after t=0", backend, (long long)T, (long long)N);
    expect_bits(what, as, a, n);
    free(a);
    free(rw);
    free(done);
    free(want);
    free(got);
    free(as);
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

Test(scan, reverse_discounted_sum_matches_a_backwards_c_loop_on_ref) { discount_on("ref"); }
Test(scan, reverse_discounted_sum_matches_a_backwards_c_loop_on_cpu) { discount_on("cpu"); }

/* ================================================================ RAND */

static void rand_on(const char *backend) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor c = lm_input(g, "c", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor u = lm_rand_stream(g, 7, 1, (lm_dim[]){N});
  OK(lm_output(u, "u"));
  OK(lm_assign(c, lm_add(c, u))); /* a carry next to the draws: u_t stays what step t draws */
  lm_backend_t *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "%s: lm_program_new_scan: %s", backend, lm_last_error());
  const uint64_t seed = 0x1234567890abcdefull;
  lm_program_set_seed(p, seed);
  const int64_t T = 9, n = 70;
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", n));
  float *sum = calloc((size_t)n, sizeof *sum), *want = malloc((size_t)(T * n) * sizeof *want);
  cr_assert(sum && want);
  for (uint64_t run = 0; run < 4; run++) {
    if (run == 3) lm_program_set_run(p, run = 11);
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < n; e++) {
        float v = lm_rand_uniform(seed, 7, (uint64_t)e, run * (uint64_t)T + (uint64_t)t);
        want[t * n + e] = v;
        sum[e] = sum[e] + v;
      }
    OK(lm_program_run(p));
    char what[64];
    snprintf(what, sizeof what, "%s run %llu: u", backend, (unsigned long long)run);
    float *got = get(p, "u", (size_t)(T * n));
    expect_bits(what, got, want, (size_t)(T * n));
    free(got);
    snprintf(what, sizeof what, "%s run %llu: carry", backend, (unsigned long long)run);
    got = get(p, "c", (size_t)n);
    expect_bits(what, got, sum, (size_t)n);
    free(got);
  }
  free(sum);
  free(want);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

Test(scan, rand_in_step_t_draws_with_run_counter_run_times_T_plus_t_on_ref) { rand_on("ref"); }
Test(scan, rand_in_step_t_draws_with_run_counter_run_times_T_plus_t_on_cpu) { rand_on("cpu"); }

/* ================================================================ errors */

static void expect_message(const char *what, const char *const *parts) {
  const char *msg = lm_last_error();
  cr_assert(msg && *msg, "%s: no error message", what);
  for (; *parts; parts++) cr_assert(strstr(msg, *parts), "%s: message \"%s\" does not mention \"%s\"", what, msg, *parts);
}

Test(scan, a_per_step_name_that_is_no_input_is_refused_naming_it) {
  lm_graph_t *g = recurrence_graph();
  for (size_t i = 0; i < CHECK_COUNT(backends); i++) {
    lm_backend_t *b = open_backend(backends[i]);
    lm_clear_error();
    cr_assert_null(lm_program_new_scan(b, g, "T", 0, (const char *[]){"x", "obs"}, 2));
    expect_message("per-step 'obs'", (const char *[]){"obs", NULL});
    lm_clear_error();
    cr_assert_null(lm_program_new_scan(b, g, "T", 0, (const char *[]){"y"}, 1)); /* an output, not an input */
    expect_message("per-step 'y'", (const char *[]){"'y'", NULL});
    lm_backend_free(b);
  }
  lm_graph_free(g);
}

Test(scan, a_per_step_input_that_is_state_is_refused_naming_it) {
  lm_graph_t *g = recurrence_graph();
  for (size_t i = 0; i < CHECK_COUNT(backends); i++) {
    lm_backend_t *b = open_backend(backends[i]);
    lm_clear_error();
    cr_assert_null(lm_program_new_scan(b, g, "T", 0, (const char *[]){"h"}, 1));
    expect_message("per-step state 'h'", (const char *[]){"'h'", "state", NULL});
    lm_backend_free(b);
  }
  lm_graph_free(g);
}

Test(scan, a_missing_or_unbound_T_fails_naming_it) {
  lm_graph_t *g = recurrence_graph();
  for (size_t i = 0; i < CHECK_COUNT(backends); i++) {
    lm_backend_t *b = open_backend(backends[i]);
    lm_clear_error();
    cr_assert_null(lm_program_new_scan(b, g, NULL, 0, (const char *[]){"x"}, 1));
    expect_message("T NULL", (const char *[]){"T", NULL});
    lm_program_t *p = lm_program_new_scan(b, g, "HORIZON", 0, (const char *[]){"x"}, 1);
    cr_assert(p, "%s: %s", backends[i], lm_last_error());
    OK(lm_program_bind(p, "N", 3));
    float h[3] = {1, 2, 3}, x[6] = {1, 2, 3, 4, 5, 6};
    OK(lm_program_write(p, "h", h, 3)); /* state is not per step: T is not needed */
    lm_clear_error();
    cr_assert_neq(lm_program_write(p, "x", x, 6), LM_OK, "writing a per-step input needs T");
    expect_message("write x without T", (const char *[]){"HORIZON", NULL});
    lm_clear_error();
    cr_assert_neq(lm_program_run(p), LM_OK, "a scan with T unbound must not run");
    expect_message("run without T", (const char *[]){"HORIZON", NULL});
    cr_assert_eq(lm_program_run_index(p), 0);
    OK(lm_program_bind(p, "HORIZON", 2));
    OK(lm_program_write(p, "x", x, 6));
    OK(lm_program_run(p));
    lm_program_free(p);
    lm_backend_free(b);
  }
  lm_graph_free(g);
}

/* ================================================================ a per-env matvec step */

enum { H = 5 };

/* step: h' = tanh(W h + x_t) per env (h [N,H] state, W [H,H] parameter); y_t = h' */
static lm_graph_t *tanh_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, H});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, H});
  lm_tensor w = lm_input(g, "W", LM_ROLE_PARAM, 2, (lm_dim[]){H, H});
  lm_tensor h2 = lm_tanh(lm_add(lm_matmul(h, lm_transpose(w, 0, 1)), x)); /* (W h)_i = sum_j W[i,j] h_j */
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  return g;
}

/* contract: the graph allows contraction (lm_graph_set_contraction) */
static void tanh_run(const char *backend, int contract) {
  lm_graph_t *g = tanh_graph();
  lm_graph_set_contraction(g, contract);
  lm_backend_t *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
  cr_assert(p, "%s: %s", backend, lm_last_error());
  const int64_t T = 12, N = 67;
  size_t n = (size_t)N * H, tn = (size_t)T * n;
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", N));
  check_rng r = check_rng_new(99);
  float *h = rand_floats(&r, n, -1, 1), *x = rand_floats(&r, tn, -1, 1), *w = rand_floats(&r, H * H, -0.8, 0.8);
  put(p, "h", h, n);
  put(p, "x", x, tn);
  put(p, "W", w, H * H);
  double *hd = malloc(n * sizeof *hd), *want = malloc(tn * sizeof *want);
  for (size_t i = 0; i < n; i++) hd[i] = h[i];
  for (int64_t t = 0; t < T; t++)
    for (int64_t e = 0; e < N; e++) {
      double next[H];
      for (int i = 0; i < H; i++) {
        double s = 0;
        for (int j = 0; j < H; j++) s += (double)w[i * H + j] * hd[e * H + j];
        next[i] = tanh(s + x[(size_t)t * n + (size_t)e * H + (size_t)i]);
      }
      for (int i = 0; i < H; i++) hd[e * H + i] = want[(size_t)t * n + (size_t)e * H + (size_t)i] = next[i];
    }
  OK(lm_program_run(p));
  float *y = get(p, "y", tn), *hs = get(p, "h", n);
  char what[64];
  snprintf(what, sizeof what, "%s: y", backend);
  check_close(what, y, want, tn, 1e-4, 1e-5);
  snprintf(what, sizeof what, "%s: state h", backend);
  check_close(what, hs, hd, n, 1e-4, 1e-5);
  free(h);
  free(x);
  free(w);
  free(hd);
  free(want);
  free(y);
  free(hs);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

static void tanh_on(const char *backend) { tanh_run(backend, 0); }

Test(scan, per_env_tanh_matvec_step_matches_a_c_loop_on_ref) { tanh_on("ref"); }
Test(scan, per_env_tanh_matvec_step_matches_a_c_loop_on_cpu) { tanh_on("cpu"); }

/* A step with a policy and an env's arithmetic: h' = tanh(W h + x_t) / (1 + |h|^2 / 100), the
 * critic-like head v_t = u . tanh(W h + x_t). W and u have role `wrole` (PARAM: the policy's). */
static lm_graph_t *policy_env_graph(lm_role wrole) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, H});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, H});
  lm_tensor w = lm_input(g, "W", wrole, 2, (lm_dim[]){H, H});
  lm_tensor u = lm_input(g, "u", wrole, 2, (lm_dim[]){H, 1});
  lm_tensor t = lm_tanh(lm_add(lm_matmul(h, lm_transpose(w, 0, 1)), x));
  lm_tensor damp = lm_recip(lm_add_scalar(lm_mul_scalar(lm_sum(lm_square(h), 1, 1), 0.01f), 1.0f)); /* the env's sum */
  lm_tensor h2 = lm_mul(t, damp);
  OK(lm_output(h2, "y"));
  OK(lm_output(lm_matmul(t, u), "v"));
  OK(lm_assign(h, h2));
  lm_graph_set_contraction(g, 1);
  return g;
}

/* Runs the scan on `backend` (threads: LUMEN_THREADS for the cpu, 0 its default), its kernels
 * dumped to dump (NULL: not); returns y then v, T*N*(H+1) floats (to free). */
static float *policy_env_run(lm_role wrole, const char *backend, const char *threads, const char *dump) {
  enum { T = 9, N = 11 };
  lm_graph_t *g = policy_env_graph(wrole);
  if (threads) setenv("LUMEN_THREADS", threads, 1);
  if (dump) setenv("LUMEN_DUMP", dump, 1);
  lm_backend_t *b = open_backend(backend);
  unsetenv("LUMEN_THREADS");
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
  unsetenv("LUMEN_DUMP");
  cr_assert(p, "%s: %s", backend, lm_last_error());
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", N));
  check_rng r = check_rng_new(41);
  float *h = rand_floats(&r, N * H, -1, 1), *x = rand_floats(&r, T * N * H, -1, 1);
  float *w = rand_floats(&r, H * H, -0.8, 0.8), *u = rand_floats(&r, H, -1, 1);
  put(p, "h", h, N * H);
  put(p, "x", x, T * N * H);
  put(p, "W", w, H * H);
  put(p, "u", u, H);
  OK(lm_program_run(p));
  float *y = get(p, "y", T * N * H), *v = get(p, "v", T * N), *out = malloc(T * N * (H + 1) * sizeof *out);
  memcpy(out, y, T * N * H * sizeof *out);
  memcpy(out + T * N * H, v, T * N * sizeof *out);
  free(h), free(x), free(w), free(u), free(y), free(v);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return out;
}

/* In a fused scan of a graph that allows contraction, the policy's loops (those reading a
 * trainable parameter: the matvec's sums, the head's sum over tanh values) are printed under
 * LM_REASSOC, so that clang may keep partial sums and vectorise a sum (render.c, policy_loop);
 * the env's arithmetic is not: with W and u as data rather than parameters no loop is. The
 * values agree with the reference within rounding and are the same bits on 1 and 3 threads. */
Test(scan, a_rollouts_policy_loops_may_sum_in_another_order_and_its_env_loops_not) {
  int blocks[2];
  for (int param = 0; param < 2; param++) {
    char dir[] = "/tmp/lumen-policy-XXXXXX";
    cr_assert(mkdtemp(dir));
    free(policy_env_run(param ? LM_ROLE_PARAM : LM_ROLE_DATA, "cpu", "1", dir));
    blocks[param] = check_dump_lines(dir, "^ *LM_REASSOC$");
  }
  cr_assert_geq(blocks[1], 2, "%d loops under LM_REASSOC where W and u are parameters (the matvec, the head)", blocks[1]);
  cr_assert_eq(blocks[0], 0, "%d loops under LM_REASSOC where no parameter is read", blocks[0]);
  enum { NOUT = 9 * 11 * (H + 1) };
  float *ref = policy_env_run(LM_ROLE_PARAM, "ref", NULL, NULL);
  float *one = policy_env_run(LM_ROLE_PARAM, "cpu", "1", NULL), *three = policy_env_run(LM_ROLE_PARAM, "cpu", "3", NULL);
  double want[NOUT];
  for (int i = 0; i < NOUT; i++) want[i] = ref[i];
  check_close("cpu against ref", one, want, NOUT, 1e-4, 1e-5);
  check_same_bits("1 thread against 3", one, three, NOUT);
  free(ref), free(one), free(three);
}

/* Calls of the inline polynomial exp2 in the cpu kernels of the tanh scan (lm_exp2_c's own
 * definition, "lm_exp2_c(float x)", not counted), the step matching the C loop either way. */
static int polynomial_exp2_calls(int contract) {
  char dir[] = "/tmp/lumen-fastexp-XXXXXX";
  cr_assert(mkdtemp(dir));
  setenv("LUMEN_DUMP", dir, 1);
  tanh_run("cpu", contract);
  unsetenv("LUMEN_DUMP");
  return check_dump_lines(dir, "lm_exp2_c([^f]");
}

/* A graph that allows contraction has given up exp2's reference bits: its fused scan's kernel
 * (which keeps separate roundings, an env's arithmetic inside it) takes exp2 from the update's
 * inline polynomial rather than two calls of libmvec's 8-wide expf per 16 lanes (compile.c);
 * without contraction it keeps lm_exp2. */
Test(scan, a_contracting_graphs_scan_kernel_takes_exp2_from_the_inline_polynomial) {
  int on = polynomial_exp2_calls(1), off = polynomial_exp2_calls(0);
  cr_assert(on > 0, "no lm_exp2_c call in the scan kernel of a graph that allows contraction");
  cr_assert_eq(off, 0, "%d lm_exp2_c calls in the scan kernel of a graph that keeps the reference's rounding", off);
}

/* ================================================================ a step that is not env-local */

/* A step and its kernels per scan on cpu, and its outputs and state on cpu and ref (the same
 * float operations: bit for bit). */
static int scan_vs_ref(lm_graph_t *(*build)(void), int64_t width, int64_t T, int64_t n) {
  lm_graph_t *g = build();
  check_rng r = check_rng_new(17);
  size_t sn = (size_t)(n * width), tn = (size_t)T * (size_t)n;
  float *h0 = rand_floats(&r, sn, -2, 2), *xs = rand_floats(&r, tn, -1, 1), *out[2], *hs[2];
  int kernels = 0;
  for (int i = 0; i < 2; i++) {
    lm_backend_t *b = open_backend(backends[i]);
    lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
    cr_assert(p, "%s: %s", backends[i], lm_last_error());
    OK(lm_program_bind(p, "T", T));
    OK(lm_program_bind(p, "N", n));
    put(p, "h", h0, sn);
    put(p, "x", xs, tn);
    OK(lm_program_run(p));
    out[i] = get(p, "y", tn);
    hs[i] = get(p, "h", sn);
    lm_program_stats st;
    OK(lm_program_get_stats(p, &st));
    if (i == 1) kernels = st.kernels;
    lm_program_free(p);
    lm_backend_free(b);
  }
  expect_bits("cpu vs ref: y", out[1], out[0], tn);
  expect_bits("cpu vs ref: state h", hs[1], hs[0], sn);
  for (int i = 0; i < 2; i++) free(out[i]), free(hs[i]);
  free(h0);
  free(xs);
  lm_graph_free(g);
  return kernels;
}

/* step: h' = 0.5 * (h - mean over envs of h) + x_t: every env reads every other env's carry,
 * so cpu cannot fuse the scan; it must still match ref (same float operations: bit for bit). */
static lm_graph_t *mean_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_sub(h, lm_mean(h, 0, 1)), 0.5f), x);
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  return g;
}

Test(scan, a_step_reading_other_envs_runs_step_by_step_on_cpu_and_matches_ref) {
  const int64_t T = 7;
  int k = scan_vs_ref(mean_graph, 1, T, 70);
  cr_assert(k >= T && k % T == 0, "%d kernels for %lld steps of a step that is not env-local", k,
            (long long)T);
}

/* ================================================================ kernel counts on cpu */

static int scan_kernels(lm_graph_t *g, int64_t T, int64_t N) {
  lm_backend_t *b = open_backend("cpu");
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", N));
  lm_program_stats s;
  OK(lm_program_get_stats(p, &s));
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return s.kernels;
}

Test(scan, the_interpreter_reports_no_kernels) {
  lm_graph_t *g = recurrence_graph();
  lm_backend_t *b = open_backend("ref");
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "T", 8));
  OK(lm_program_bind(p, "N", 4));
  lm_program_stats s;
  OK(lm_program_get_stats(p, &s));
  cr_assert_eq(s.kernels, 0);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* DESIGN.md §3: an env-local step is emitted as one kernel whose time loop keeps the carry in
 * registers (compiler/scan.c), not T launches of the step's kernels. */
Test(scan, env_local_recurrence_is_one_kernel_for_the_whole_scan_on_cpu) {
  int k = scan_kernels(recurrence_graph(), 16, 70);
  cr_assert_eq(k, 1, "the scan of an env-local step took %d kernels per run", k);
}

Test(scan, env_local_tanh_matvec_step_is_one_kernel_for_the_whole_scan_on_cpu) {
  int k = scan_kernels(tanh_graph(), 16, 70);
  cr_assert_eq(k, 1, "the scan of a per-env matvec step took %d kernels per run", k);
}

/* step over h [N, 8]: a = h[:, 0:3] * 0.5 + x_t, c = h[:, 3:8] rolled by one inside its own
 * row, copied (lm_contiguous: a buffer of its own in the step plan); h' = concat(a, c * 1.5),
 * y = the sum of h'. Reading c into h' at columns 3..7 is a load at env*5 + column - 3, which
 * is inside env's row only where the pad's window holds: the fusion takes a load's validity
 * into account, and the scan is one kernel. */
static lm_graph_t *concat_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, 8});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor a = lm_add(lm_mul_scalar(lm_slice(h, 1, 0, 3), 0.5f), lm_unsqueeze(x, 1));
  lm_tensor c = lm_contiguous(lm_roll(lm_slice(h, 1, 3, 8), 1, 1));
  lm_tensor h2 = lm_concat(a, lm_mul_scalar(c, 1.5f), 1);
  OK(lm_output(lm_sum(h2, 1, 0), "y"));
  OK(lm_assign(h, h2));
  return g;
}

Test(scan, a_step_concatenating_computed_rows_into_its_state_is_one_kernel_with_refs_bits) {
  int k = scan_vs_ref(concat_graph, 8, 9, 70);
  cr_assert_eq(k, 1, "the scan of a step that concatenates computed rows took %d kernels per run", k);
}

/* step over h [N, 2100]: h' = h * 0.75 + x_t, y = the sum of h'. A fused scan would hold the
 * 2100 floats of each env's carry in local arrays, past compiler/scan.c's budget of 2048 per
 * env: the step plan runs T times instead, with the same bits. */
static lm_graph_t *wide_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, 2100});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_mul_scalar(h, 0.75f), lm_unsqueeze(x, 1));
  OK(lm_output(lm_sum(h2, 1, 0), "y"));
  OK(lm_assign(h, h2));
  return g;
}

Test(scan, a_step_holding_more_than_2048_floats_per_env_runs_as_its_step_plan_with_refs_bits) {
  const int64_t T = 5;
  int k = scan_vs_ref(wide_graph, 2100, T, 20);
  cr_assert(k >= T && k % T == 0, "%d kernels for %lld steps of a step past the budget", k, (long long)T);
}

/* ================================================================ SIMD lanes (cpu) */

/* compiler/lanes.c blocks envs (32 on the cpu by default) per iteration of a fused scan with a
 * loop over the lanes innermost. A step that uses every kind of statement it rewrites: a matvec (a sum
 * accumulator and weights shared by the lanes), a max over each env's row (a max accumulator),
 * RAND, MOD by a power of two and by another constant (per-step inputs only, so the values
 * are identical on every backend), sin, per-step inputs and outputs and a carried state:
 *   a = W h + x_t;  m = max_i a_i;  f = mod(3 x_t + u, 1);  q = mod(5 x_t, 2.7)
 *   h' = 0.5 sin(a - m) + 0.25 f + 0.1 q;  y_t = h';  z_t = m */
enum { LH = 6 };

static lm_graph_t *lanes_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, LH});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, LH});
  lm_tensor w = lm_input(g, "W", LM_ROLE_PARAM, 2, (lm_dim[]){LH, LH});
  lm_tensor a = lm_add(lm_matmul(h, lm_transpose(w, 0, 1)), x);
  lm_tensor m = lm_max_reduce(a, 1);
  lm_tensor u = lm_rand(g, 2, (lm_dim[]){N, LH});
  lm_tensor f = lm_mod(lm_add(lm_mul_scalar(x, 3.0f), u), lm_const(g, 1.0f));
  lm_tensor q = lm_mod(lm_mul_scalar(x, 5.0f), lm_const(g, 2.7f));
  lm_tensor h2 = lm_add(lm_add(lm_mul_scalar(lm_sin(lm_sub(a, lm_expand(m, 1, LH))), 0.5f), lm_mul_scalar(f, 0.25f)),
                        lm_mul_scalar(q, 0.1f));
  OK(lm_output(h2, "y"));
  OK(lm_output(m, "z"));
  /* draws whose Philox blocks are shared by consecutive envs (drawn once per lane block) */
  OK(lm_output(lm_rand_stream(g, 7, 1, &N), "r1"));
  OK(lm_output(lm_rand_stream(g, 8, 2, (lm_dim[]){N, 2}), "r2"));
  OK(lm_assign(h, h2));
  return g;
}

typedef struct lanes_run {
  float *y, *z, *h, *r1, *r2;
  int kernels;
} lanes_run;

/* One scan of T steps over N envs; lanes/threads set LUMEN_SCAN_LANES/LUMEN_THREADS (NULL:
 * the defaults) while the backend and program are created. */
static lanes_run lanes_on(const char *backend, const char *lanes, const char *threads, int64_t T, int64_t N) {
  lm_graph_t *g = lanes_graph();
  if (lanes) setenv("LUMEN_SCAN_LANES", lanes, 1);
  if (threads) setenv("LUMEN_THREADS", threads, 1);
  lm_backend_t *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
  unsetenv("LUMEN_SCAN_LANES");
  unsetenv("LUMEN_THREADS");
  cr_assert(p, "%s: %s", backend, lm_last_error());
  size_t n = (size_t)N * LH, tn = (size_t)T * n;
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", N));
  check_rng r = check_rng_new(2024 + (uint64_t)N);
  float *h = rand_floats(&r, n, -1, 1), *x = rand_floats(&r, tn, -2, 2), *w = rand_floats(&r, LH * LH, -0.7, 0.7);
  put(p, "h", h, n);
  put(p, "x", x, tn);
  put(p, "W", w, LH * LH);
  lm_program_set_seed(p, 77);
  OK(lm_program_run(p));
  lanes_run out = {get(p, "y", tn), get(p, "z", (size_t)T * (size_t)N), get(p, "h", n),
                   get(p, "r1", (size_t)T * (size_t)N), get(p, "r2", (size_t)T * (size_t)N * 2), -1};
  lm_program_stats s;
  if (lm_program_get_stats(p, &s) == LM_OK) out.kernels = s.kernels;
  free(h);
  free(x);
  free(w);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return out;
}

static void lanes_free(lanes_run *r) {
  free(r->y);
  free(r->z);
  free(r->h);
  free(r->r1);
  free(r->r2);
}

static void check_close_f(const char *what, const float *got, const float *want, size_t n, double rtol,
                          double atol) {
  double *wd = malloc((n ? n : 1) * sizeof *wd);
  cr_assert(wd);
  for (size_t i = 0; i < n; i++) wd[i] = want[i];
  check_close(what, got, wd, n, rtol, atol);
  free(wd);
}

static void lanes_close(const char *what, const lanes_run *got, const lanes_run *want, int64_t T, int64_t N) {
  char w[96];
  size_t n = (size_t)N * LH;
  snprintf(w, sizeof w, "%s (N=%lld): y", what, (long long)N);
  check_close_f(w, got->y, want->y, (size_t)T * n, 2e-5, 2e-6);
  snprintf(w, sizeof w, "%s (N=%lld): z", what, (long long)N);
  check_close_f(w, got->z, want->z, (size_t)T * (size_t)N, 2e-5, 2e-6);
  snprintf(w, sizeof w, "%s (N=%lld): state h", what, (long long)N);
  check_close_f(w, got->h, want->h, n, 2e-5, 2e-6);
  snprintf(w, sizeof w, "%s (N=%lld): RAND [N]", what, (long long)N);
  expect_bits(w, got->r1, want->r1, (size_t)T * (size_t)N);
  snprintf(w, sizeof w, "%s (N=%lld): RAND [N, 2]", what, (long long)N);
  expect_bits(w, got->r2, want->r2, (size_t)T * (size_t)N * 2);
}

/* Envs that fill no whole block (of 64 or of 8), exactly one, one more, and many with a
 * partial last block:
 * the extra lanes of a partial block must neither read nor write past the last env. */
Test(scan, lanes_match_ref_and_one_env_at_a_time_for_partial_and_whole_blocks_on_cpu) {
  const int64_t T = 5, sizes[] = {1, 7, 8, 31, 32, 33, 63, 64, 65, 131};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int64_t N = sizes[i];
    lanes_run ref = lanes_on("ref", NULL, NULL, T, N), lanes = lanes_on("cpu", NULL, NULL, T, N),
              one = lanes_on("cpu", "1", NULL, T, N);
    cr_assert_eq(lanes.kernels, 1, "N=%lld: the lane-blocked scan took %d kernels", (long long)N, lanes.kernels);
    lanes_close("cpu (lanes) vs ref", &lanes, &ref, T, N);
    lanes_close("cpu (1 lane) vs ref", &one, &ref, T, N);
    lanes_close("cpu lanes vs 1 lane", &lanes, &one, T, N);
    lanes_free(&ref);
    lanes_free(&lanes);
    lanes_free(&one);
  }
}

/* A scan whose envs a hint (lm_sym_hint) puts at 8 or fewer (one block of 8) runs one env at
 * a time, a form the cpu backend builds with the program; without the hint it runs in blocks,
 * whatever N a run binds (the form is the graph's choice: compiler/backends/cpu.c). The dumped
 * loop IR tells the forms apart (one env a point: "par i0 < N"), and every run agrees with
 * ref. */
static int runs_at(lm_program_t *p, int64_t N, const char *dir) {
  const int64_t T = 3;
  lanes_run ref = lanes_on("ref", NULL, NULL, T, N);
  size_t n = (size_t)N * LH, tn = (size_t)T * n;
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", N));
  check_rng r = check_rng_new(2024 + (uint64_t)N); /* lanes_on's inputs */
  float *h = rand_floats(&r, n, -1, 1), *x = rand_floats(&r, tn, -2, 2), *w = rand_floats(&r, LH * LH, -0.7, 0.7);
  put(p, "h", h, n);
  put(p, "x", x, tn);
  put(p, "W", w, LH * LH);
  lm_program_set_seed(p, 77);
  lm_program_set_run(p, 0); /* ref's draws: a first run */
  OK(lm_program_run(p));
  lanes_run got = {get(p, "y", tn), get(p, "z", (size_t)T * (size_t)N), get(p, "h", n),
                   get(p, "r1", (size_t)T * (size_t)N), get(p, "r2", (size_t)T * (size_t)N * 2), -1};
  lanes_close("cpu vs ref", &got, &ref, T, N);
  lanes_free(&got);
  lanes_free(&ref);
  free(h);
  free(x);
  free(w);
  return check_dump_count(dir, "par i0 < N:$", 1);
}

Test(scan, hinted_few_envs_run_one_at_a_time_at_every_n) {
  for (int hinted = 0; hinted < 2; hinted++) {
    char dir[] = "/tmp/lumen-single-XXXXXX";
    cr_assert(mkdtemp(dir));
    lm_graph_t *g = lanes_graph();
    if (hinted) OK(lm_sym_hint(g, "N", 3));
    setenv("LUMEN_DUMP", dir, 1);
    lm_backend_t *b = open_backend("cpu");
    lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
    cr_assert(p, "%s", lm_last_error());
    int made = check_dump_count(dir, "par i0 < N:$", 1);
    int at6 = runs_at(p, 6, dir), at3 = runs_at(p, 3, dir), at1 = runs_at(p, 1, dir);
    unsetenv("LUMEN_DUMP");
    cr_log_info("hinted %d: one-env forms built %d with the program, %d after runs of 6, 3 and 1 envs", hinted, made, at1);
    cr_assert_eq(made, hinted, "hinted %d: %d one-env forms built with the program", hinted, made);
    cr_assert(at6 == hinted && at3 == hinted && at1 == hinted, "hinted %d: %d, %d, %d one-env forms after runs of 6, 3, 1",
              hinted, at6, at3, at1);
    lm_program_free(p);
    lm_backend_free(b);
    lm_graph_free(g);
    check_dump_count(dir, "x", 0); /* removes dir */
  }
}

/* Lanes are fixed per block of the parallel loop, so the thread count cannot change which
 * envs share a vector: 1, 2 and 3 threads agree bit for bit. */
Test(scan, lanes_give_the_same_bits_on_1_2_and_3_threads) {
  const int64_t T = 4, N = 1000;
  lanes_run r1 = lanes_on("cpu", NULL, "1", T, N), r2 = lanes_on("cpu", NULL, "2", T, N),
            r3 = lanes_on("cpu", NULL, "3", T, N);
  size_t n = (size_t)N * LH;
  expect_bits("2 threads vs 1: y", r2.y, r1.y, (size_t)T * n);
  expect_bits("3 threads vs 1: y", r3.y, r1.y, (size_t)T * n);
  expect_bits("2 threads vs 1: h", r2.h, r1.h, n);
  expect_bits("3 threads vs 1: z", r3.z, r1.z, (size_t)T * (size_t)N);
  lanes_free(&r1);
  lanes_free(&r2);
  lanes_free(&r3);
}

/* The generated kernel really is in lane form: LUMEN_DUMP's loop IR shows lane loops, and
 * LUMEN_SCAN_LANES=1 turns them off. */
static int dumped_lines(const char *lanes, const char *re) {
  char dir[] = "/tmp/lumen-lanes-XXXXXX";
  cr_assert(mkdtemp(dir));
  setenv("LUMEN_DUMP", dir, 1);
  lanes_run r = lanes_on("cpu", lanes, NULL, 2, 16);
  unsetenv("LUMEN_DUMP");
  lanes_free(&r);
  return check_dump_lines(dir, re);
}

static int dumped_lane_loops(const char *lanes) { return dumped_lines(lanes, "lanes i"); }

Test(scan, the_cpu_scan_kernel_has_lane_loops_unless_turned_off) {
  int on = dumped_lane_loops(NULL), off = dumped_lane_loops("1");
  cr_assert(on >= 3, "%d lane loops in the dumped scan kernel", on);
  cr_assert_eq(off, 0, "LUMEN_SCAN_LANES=1 still left %d lane loops", off);
}

/* With N symbolic the lane blocks' guards (env < N) hold in every block below N / 64: the C
 * entry runs those blocks through a copy of the body with the guards printed as 1, the rest
 * through the guarded body (compiler/render.c, find_tails); the partial and whole block test
 * above checks both against ref. */
Test(scan, the_cpu_scan_kernel_runs_its_whole_blocks_without_the_tail_guards) {
  int n = dumped_lines(NULL, "const int64_t \\(end = lm_full_end\\|start = lm_tail_start\\);");
  /* two lines a kernel (the cpu backend builds its lane widths, 64 and 8, as two kernels) */
  cr_assert(n >= 2 && n % 2 == 0, "%d lines of the two block ranges (whole blocks, the rest) in the dumped kernels", n);
}

/* A layer in lanes is jammed by eight outputs with its dot products as running sums in
 * registers (compiler/lanes.c); each output still adds its terms in order from +0, so a
 * matvec step with no transcendental gives ref's bits on cpu, with lanes and without:
 *   h' = W h + x_t  (h [N, 16], W [16, 16]) */
Test(scan, jammed_matvec_lanes_give_refs_bits) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, 16});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 16});
  lm_tensor w = lm_input(g, "W", LM_ROLE_PARAM, 2, (lm_dim[]){16, 16});
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_matmul(h, lm_transpose(w, 0, 1)), 0.5f), x);
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  const int64_t T = 6, Ns[] = {5, 32, 70};
  for (size_t c = 0; c < sizeof Ns / sizeof Ns[0]; c++) {
    int64_t n = Ns[c];
    size_t sn = (size_t)n * 16, tn = (size_t)T * sn;
    check_rng r = check_rng_new(77 + (uint64_t)n);
    float *h0 = rand_floats(&r, sn, -1, 1), *xs = rand_floats(&r, tn, -1, 1), *ws = rand_floats(&r, 256, -0.5, 0.5);
    float *out[3], *hs[3];
    static const char *const be[3] = {"ref", "cpu", "cpu"};
    for (int i = 0; i < 3; i++) {
      if (i == 2) setenv("LUMEN_SCAN_LANES", "1", 1);
      lm_backend_t *b = open_backend(be[i]);
      lm_program_t *p = lm_program_new_scan(b, g, "T", 0, (const char *[]){"x"}, 1);
      unsetenv("LUMEN_SCAN_LANES");
      cr_assert(p, "%s", lm_last_error());
      OK(lm_program_bind(p, "T", T));
      OK(lm_program_bind(p, "N", n));
      put(p, "h", h0, sn);
      put(p, "x", xs, tn);
      put(p, "W", ws, 256);
      OK(lm_program_run(p));
      out[i] = get(p, "y", tn);
      hs[i] = get(p, "h", sn);
      lm_program_free(p);
      lm_backend_free(b);
    }
    char what[64];
    snprintf(what, sizeof what, "N=%lld: cpu lanes vs ref", (long long)n);
    expect_bits(what, out[1], out[0], tn);
    snprintf(what, sizeof what, "N=%lld: cpu one env at a time vs ref", (long long)n);
    expect_bits(what, out[2], out[0], tn);
    snprintf(what, sizeof what, "N=%lld: carried h, cpu lanes vs ref", (long long)n);
    expect_bits(what, hs[1], hs[0], sn);
    for (int i = 0; i < 3; i++) free(out[i]), free(hs[i]);
    free(h0);
    free(xs);
    free(ws);
  }
  lm_graph_free(g);
}

/* ================================================================ lazy draws (cpu) */

/* compiler/lazy.c computes a fresh draw only for the lanes that keep it. The step: a 2-column
 * state replaced by a fresh uniform draw in (-1, 0] where its first column exceeds 0.5, as an
 * env's auto-reset does:
 *   c = 0.5 < h[:, 0];  h' = select(c, fresh, h);  y_t = h'
 * with lm_env_select ((c*fresh + 0) + (1-c)*h) or variants the pass must leave alone:
 * the select without its + 0, a draw through recip, a draw that is also an output. The kept
 * states start at -0 in every other env: there c*fresh is -0 (fresh < 0), and without the + 0
 * a lazy draw (an array holding 0) would turn the kept -0 into +0. */
enum { LZ_SELECT, LZ_NO_ZERO, LZ_RECIP, LZ_ALSO_OUT };
enum { LZ_N = 70, LZ_T = 6 };

static lm_graph_t *lazy_graph(int kind) {
  static const float lo[2] = {-1.0f, -1.0f}, hi[2] = {0.0f, 0.0f};
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, 2});
  lm_tensor fresh = lm_env_reset_uniform(g, N, 2, lo, hi);
  if (kind == LZ_RECIP) fresh = lm_recip(lm_add_scalar(fresh, -1.0f));
  lm_tensor c = lm_unsqueeze(lm_lt(lm_const(g, 0.5f), lm_env_col(h, 0)), 1);
  lm_tensor kept = lm_mul(lm_add(lm_neg(c), lm_const(g, 1.0f)), h);
  lm_tensor h2 = kind == LZ_NO_ZERO ? lm_add(lm_mul(c, fresh), kept) : lm_env_select(c, fresh, h);
  OK(lm_output(h2, "y"));
  if (kind == LZ_ALSO_OUT) OK(lm_output(fresh, "f"));
  OK(lm_assign(h, h2));
  return g;
}

/* y [T, N, 2] of the scan on cpu, lazy or not (LUMEN_NO_LAZY); *sparse: the sparse loops in
 * its kernel. */
static float *lazy_scan(int kind, int lazy, int *sparse) {
  lm_graph_t *g = lazy_graph(kind);
  char dir[] = "/tmp/lumen-lazy-XXXXXX";
  cr_assert(mkdtemp(dir));
  lm_backend_t *b;
  lm_program_t *p = check_cpu_scan(g, dir, lazy, &b);
  OK(lm_program_bind(p, "N", LZ_N));
  OK(lm_program_bind(p, "T", LZ_T));
  float h[LZ_N * 2];
  for (int i = 0; i < LZ_N * 2; i++) h[i] = i / 2 % 2 ? 1.0f : -0.0f; /* odd envs reset at once */
  put(p, "h", h, LZ_N * 2);
  lm_program_set_seed(p, 3);
  OK(lm_program_run(p));
  float *y = get(p, "y", (size_t)LZ_T * LZ_N * 2);
  *sparse = check_dump_lines(dir, "^ *sparse i");
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return y;
}

static void lazy_case(int kind, int want_sparse) {
  static const char *const names[] = {"select", "select without + 0", "recip of a draw", "a draw also output"};
  int sl, se;
  float *lazy = lazy_scan(kind, 1, &sl), *eager = lazy_scan(kind, 0, &se);
  char what[64];
  snprintf(what, sizeof what, "%s: lazy vs every lane drawing", names[kind]);
  expect_bits(what, lazy, eager, (size_t)LZ_T * LZ_N * 2);
  for (int t = 0; t < LZ_T; t++) /* the premise: the kept -0 stays -0 without the + 0 */
    cr_assert(lazy[t * LZ_N * 2] == 0 && !!signbit(lazy[t * LZ_N * 2]) == (kind == LZ_NO_ZERO), "%s: y[%d][0] = %a",
              names[kind], t, (double)lazy[t * LZ_N * 2]);
  cr_assert(want_sparse ? sl >= 1 : sl == 0, "%s: %d sparse loops", names[kind], sl);
  cr_assert_eq(se, 0, "%s: LUMEN_NO_LAZY left %d sparse loops", names[kind], se);
  free(lazy);
  free(eager);
}

Test(lazy, an_env_select_of_fresh_draws_draws_them_only_where_kept_with_the_same_bits) { lazy_case(LZ_SELECT, 1); }
Test(lazy, a_select_without_its_plus_zero_draws_every_lane_as_lazy_draws_would_flip_a_zero) {
  lazy_case(LZ_NO_ZERO, 0);
}
Test(lazy, a_draw_through_recip_or_also_an_output_draws_every_lane) {
  lazy_case(LZ_RECIP, 0);
  lazy_case(LZ_ALSO_OUT, 0);
}

/* compiler/columns.c and lazy.c's split: an env-style step whose new state is a stack of
 * computed columns (lm_env_stack: each column padded to its place), selected against a fresh
 * draw. In the lane kernel the stack's column loop is unrolled into its lane loop (no padding
 * on the column left in a lane loop inside a loop over columns in the time loop), and the fresh state is
 * still drawn lazily, in a sparse loop. The values are ref's bits (no transcendental here) and
 * the same bits without lazy draws. */
typedef struct ir_facts {
  int column_pads;   /* paddings on the column in a lane loop inside a loop over columns, in the time loop */
  int sparse;        /* sparse loops, and the draws inside them */
  int sparse_draws;
} ir_facts;

/* Does text name variable v (i3, not i30)? */
static int names_var(const char *text, const char *v) {
  size_t n = strlen(v);
  for (const char *p = text; n && (p = strstr(p, v)); p += n)
    if ((p == text || !isalnum((unsigned char)p[-1])) && !isalnum((unsigned char)p[n])) return 1;
  return 0;
}

static ir_facts ir_facts_of(const char *dir) {
  char cmd[256], line[1024];
  snprintf(cmd, sizeof cmd, "cat %s/cpu-*.c; rm -rf %s", dir, dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  ir_facts r = {0};
  struct { int ind, kind, extent; char var[16]; } st[32]; /* open loops: kind 0 for, 1 lanes, 2 sparse, 3 time */
  int n = 0, ir = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "loop IR:")) ir = 1, n = 0;
    if (!ir) continue;
    int ind = (int)strspn(line, " ");
    const char *s = line + ind;
    while (n > 0 && st[n - 1].ind >= ind) n--;
    int time = 0, sparse = 0;
    for (int i = 0; i < n; i++) time |= st[i].kind == 3, sparse |= st[i].kind == 2;
    const char *cond = strstr(s, " if ");
    if (time && n >= 2 && st[n - 1].kind == 1 && st[n - 2].kind == 0 && st[n - 2].extent >= 2 && cond &&
        names_var(cond, st[n - 2].var)) /* a padding on the column */
      r.column_pads++;
    if (sparse && strstr(s, "= rand ")) r.sparse_draws++;
    int kind = !strncmp(s, "for ", 4) ? 0 : !strncmp(s, "lanes ", 6) ? 1 : !strncmp(s, "sparse ", 7) ? 2 : -1;
    if (kind < 0 || n == 32) continue;
    int extent = 0;
    const char *lt = strstr(s, "< ");
    if (lt) extent = atoi(lt + 2);
    if (kind == 0 && lt && lt[2] == 'T') kind = 3;
    r.sparse += kind == 2;
    st[n].ind = ind, st[n].kind = kind, st[n].extent = extent;
    if (sscanf(s, "%*s %15s <", st[n].var) != 1) st[n].var[0] = 0;
    n++;
  }
  pclose(f);
  cr_assert(ir, "no loop IR in the dumped kernels");
  return r;
}

enum { STACK_MAX = 10 };

/* h [N, cols]: h' = select(0.5 < h0, fresh, stack(h0 + 0.375, h1 * h1, h2 - h0, ...)). */
static lm_graph_t *stack_graph(int cols) {
  static const float lo[STACK_MAX] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1}, hi[STACK_MAX] = {0};
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, cols});
  lm_tensor fresh = lm_env_reset_uniform(g, N, cols, lo, hi);
  lm_tensor h0 = lm_env_col(h, 0), c[STACK_MAX];
  c[0] = lm_add_scalar(h0, 0.375f);
  for (int k = 1; k < cols; k++) c[k] = k % 2 ? lm_square(lm_env_col(h, k)) : lm_sub(lm_env_col(h, k), h0);
  lm_tensor kept = lm_unsqueeze(lm_lt(lm_const(g, 0.5f), h0), 1);
  lm_tensor next = lm_env_select(kept, fresh, lm_env_stack(c, cols));
  OK(lm_output(next, "y"));
  OK(lm_assign(h, next));
  return g;
}

/* g as a scan over T: on backend, or (dump not NULL: a mkdtemp template) on cpu with its kernels
 * dumped there, lazy draws or not (check_cpu_scan). */
static lm_program_t *open_scan(lm_graph_t *g, const char *backend, char *dump, int lazy, lm_backend_t **b) {
  if (dump) {
    cr_assert(mkdtemp(dump));
    return check_cpu_scan(g, dump, lazy, b);
  }
  *b = open_backend(backend);
  lm_program_t *p = lm_program_new_scan(*b, g, "T", 0, NULL, 0);
  cr_assert(p, "%s", lm_last_error());
  return p;
}

/* y [T, N, cols] of the scan on backend (cpu: lazy or not, facts of its kernel in *facts). */
static float *stack_scan(int cols, const char *backend, int lazy, ir_facts *facts) {
  lm_graph_t *g = stack_graph(cols);
  char dir[] = "/tmp/lumen-stack-XXXXXX";
  lm_backend_t *b = NULL;
  lm_program_t *p = open_scan(g, backend, facts ? dir : NULL, lazy, &b);
  OK(lm_program_bind(p, "N", LZ_N));
  OK(lm_program_bind(p, "T", LZ_T * 4));
  float h[LZ_N * STACK_MAX];
  for (int i = 0; i < LZ_N * cols; i++) h[i] = (float)((i * 37) % 23) / 23.0f - 0.5f;
  put(p, "h", h, (size_t)LZ_N * cols);
  lm_program_set_seed(p, 9);
  OK(lm_program_run(p));
  float *y = get(p, "y", (size_t)LZ_T * 4 * LZ_N * cols);
  if (facts) *facts = ir_facts_of(dir);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return y;
}

/* stack_graph(4)'s y [T, N, 4] on backend, its graph promising finite values or not; cpu: the
 * lines of its dumped kernels that print a select (compiler/render.c) in *selects, and of
 * those the ones that read an array in a picked operand (`? l3[` or `: b1[`) in *picked. */
static float *select_scan(const char *backend, int finite, int *selects, int *picked) {
  lm_graph_t *g = stack_graph(4);
  if (finite) lm_graph_promise_finite(g);
  char dir[] = "/tmp/lumen-select-XXXXXX";
  lm_backend_t *b = NULL;
  lm_program_t *p = open_scan(g, backend, selects ? dir : NULL, 1, &b);
  OK(lm_program_bind(p, "N", LZ_N));
  OK(lm_program_bind(p, "T", LZ_T * 4));
  float h[LZ_N * 4];
  for (int i = 0; i < LZ_N * 4; i++) h[i] = (float)((i * 37) % 23) / 23.0f - 0.5f;
  put(p, "h", h, (size_t)LZ_N * 4);
  lm_program_set_seed(p, 9);
  OK(lm_program_run(p));
  float *y = get(p, "y", (size_t)LZ_T * 4 * LZ_N * 4);
  if (picked) *picked = check_dump_count(dir, " != 0.0f ? .*[?:] [lb][0-9]*\\[", selects != NULL);
  if (selects) *selects = check_dump_lines(dir, " != 0.0f ? ");
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return y;
}

/* lm_env_select's arithmetic (f*a + 0 + (1-f)*b, f = 0.5 < c) prints as a select in a kernel
 * whose graph promises finite values, and as the arithmetic without the promise; both give
 * the reference's bits here, where every value is finite (ref checking the promise). */
Test(columns, a_select_prints_as_a_select_only_where_the_graph_promises_finite_values) {
  int with = 0, without = 0, picked = -1;
  float *fin = select_scan("cpu", 1, &with, &picked), *plain = select_scan("cpu", 0, &without, NULL);
  float *ref = select_scan("ref", 1, NULL, NULL);
  cr_assert_gt(with, 0, "no select printed in the finite graph's kernel");
  /* the loads a select picks are read before it, not under it (render.c, unguard_picks) */
  cr_assert_eq(picked, 0, "%d selects read an array in a picked operand", picked);
  cr_assert_eq(without, 0, "%d selects printed without the promise", without);
  int off = 0; /* the pass's switch: the promise kept, the kernels printed as without it */
  setenv("LUMEN_NO_FINITE", "1", 1);
  free(select_scan("cpu", 1, &off, NULL));
  unsetenv("LUMEN_NO_FINITE");
  cr_assert_eq(off, 0, "%d selects printed with LUMEN_NO_FINITE=1", off);
  size_t n = (size_t)LZ_T * 4 * LZ_N * 4;
  expect_bits("finite graph: cpu vs ref", fin, ref, n);
  expect_bits("plain graph: cpu vs ref", plain, ref, n);
  free(fin);
  free(plain);
  free(ref);
}

/* cols <= 8: unrolled; 10: more than compiler/columns.c unrolls, the paddings stay in the
 * column loop and the fresh state is drawn lazily through them. */
static void stack_case(int cols) {
  size_t n = (size_t)LZ_T * 4 * LZ_N * cols;
  ir_facts fl, fe;
  float *lazy = stack_scan(cols, "cpu", 1, &fl), *eager = stack_scan(cols, "cpu", 0, &fe);
  float *ref = stack_scan(cols, "ref", 1, NULL);
  char what[64];
  snprintf(what, sizeof what, "stack of %d: cpu with lazy draws vs ref", cols);
  expect_bits(what, lazy, ref, n);
  snprintf(what, sizeof what, "stack of %d: cpu without lazy draws vs ref", cols);
  expect_bits(what, eager, ref, n);
  int resets = 0; /* where h0 exceeded 0.5 the next state is a fresh draw in (-1, 0], else h0 + 0.375 */
  for (int t = 0; t < LZ_T * 4; t++)
    for (int e = 0; e < LZ_N; e++) {
      int at = e * cols;
      float h0 = t ? lazy[((size_t)(t - 1) * LZ_N) * cols + at] : (float)((at * 37) % 23) / 23.0f - 0.5f;
      const float *y = &lazy[((size_t)t * LZ_N) * cols + at];
      if (h0 > 0.5f) {
        resets++;
        for (int k = 0; k < cols; k++) cr_assert(y[k] > -1 && y[k] <= 0, "t %d env %d: %a", t, e, (double)y[k]);
      } else
        cr_assert_eq(y[0], h0 + 0.375f, "t %d env %d", t, e);
    }
  cr_assert(resets > LZ_N, "%d resets", resets);
  int unrolled = cols <= 8;
  cr_assert(unrolled ? fl.column_pads == 0 && fe.column_pads == 0 : fl.column_pads > 0,
            "stack of %d: %d paddings in a column loop of the step (%d without lazy draws)", cols, fl.column_pads,
            fe.column_pads);
  cr_assert(fl.sparse >= 1, "stack of %d: no sparse loop", cols); /* one per kernel: the wide lane form and the narrow one */
  cr_assert_eq(fl.sparse_draws, cols * fl.sparse, "stack of %d: %d draws in %d sparse loops", cols, fl.sparse_draws,
               fl.sparse);
  cr_assert_eq(fe.sparse, 0);
  free(lazy);
  free(eager);
  free(ref);
}

Test(lazy, a_stacked_state_is_unrolled_into_its_lanes_and_its_resets_still_drawn_lazily) {
  stack_case(3);
  stack_case(STACK_MAX);
}

/* compiler/columns.c's index values: each env reads and bumps the cell of a 12-column row that
 * its first column names, through a one-hot mask against lm_arange (MinAtar's grids read cells
 * so). In the lane kernel the arange's digit picks become index values; the outputs keep the
 * reference interpreter's bits. */
enum { CELL_COLS = 12 };

static lm_graph_t *cell_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, CELL_COLS});
  lm_tensor cols = lm_reshape(lm_arange(g, CELL_COLS), 2, (lm_dim[]){1, CELL_COLS});
  lm_tensor mask = lm_eq(lm_unsqueeze(lm_env_col(h, 0), 1), cols);
  OK(lm_output(lm_sum(lm_mul(h, mask), 1, 0), "y"));
  OK(lm_assign(h, lm_add(h, lm_mul_scalar(mask, 0.75f))));
  return g;
}

/* y [T, N] of scan g (freed here) over state h [N, cols] from h0, on backend, or on cpu with
 * the lines of its kernels that match re counted into *count */
static float *dump_scan(lm_graph_t *g, int cols, const float *h0, const char *backend, const char *re, int *count) {
  char dir[] = "/tmp/lumen-dump-XXXXXX";
  lm_backend_t *b = NULL;
  lm_program_t *p = open_scan(g, backend, count ? dir : NULL, 1, &b);
  OK(lm_program_bind(p, "N", LZ_N));
  OK(lm_program_bind(p, "T", LZ_T));
  put(p, "h", h0, (size_t)LZ_N * cols);
  OK(lm_program_run(p));
  float *y = get(p, "y", (size_t)LZ_T * LZ_N);
  if (count) *count = check_dump_lines(dir, re);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  return y;
}

/* y [T, N] on backend (its graph promising finite values or not), or on cpu with the lines of
 * its kernels that match re counted into *count */
static float *cell_scan_ex(const char *backend, int finite, const char *re, int *count) {
  lm_graph_t *g = cell_graph();
  if (finite) lm_graph_promise_finite(g);
  float h[LZ_N * CELL_COLS];
  for (int i = 0; i < LZ_N * CELL_COLS; i++) /* column 0 names a cell 1 .. 11 (or none: 12, -3) */
    h[i] = i % CELL_COLS ? (float)((i * 7) % 13) * 0.25f - 1.0f : (float)(i / CELL_COLS % 14 == 13 ? -3 : 1 + i / CELL_COLS % 12);
  return dump_scan(g, CELL_COLS, h, backend, re, count);
}

/* y [T, N] on backend, or on cpu with its kernels' index values counted into *index */
static float *cell_scan(const char *backend, int *index) { return cell_scan_ex(backend, 0, "= index \\[", index); }

/* The one-hot read of a cell, sum(h * (h0 == arange)), prints as a gather (one load per lane
 * at the named column, compiler/render.c) where the graph promises finite values, and as the
 * loop over the columns without; both give the reference's bits, cells named off the row
 * (12, -3) included. */
Test(columns, a_one_hot_cell_read_prints_as_a_gather_only_where_the_graph_promises_finite_values) {
  int gathers = 0, plain = 0;
  float *fin = cell_scan_ex("cpu", 1, "as a gather", &gathers), *loop = cell_scan_ex("cpu", 0, "as a gather", &plain);
  float *ref = cell_scan_ex("ref", 1, NULL, NULL);
  cr_assert_gt(gathers, 0, "no gather in the finite graph's lane kernel");
  cr_assert_eq(plain, 0, "%d gathers without the promise", plain);
  expect_bits("cell reads, finite graph: cpu vs ref", fin, ref, (size_t)LZ_T * LZ_N);
  expect_bits("cell reads, plain graph: cpu vs ref", loop, ref, (size_t)LZ_T * LZ_N);
  free(fin);
  free(loop);
  free(ref);
}

/* A map kept on columns 8..15 of a 24-column state: h' = 0.5 (h * m) + 0.25 m, m = the pad of
 * ones over those columns, y = the sum of h'. Split at the pad's edges (compiler/columns.c),
 * the other columns compute (h * 0) * 0.5 + 0 * 0.25: where the graph promises finite values
 * the kernel stores a plain 0 there (lm_fold_finite), without the promise the arithmetic; both
 * with the reference's bits. */
enum { KEPT_COLS = 24 };

static lm_graph_t *kept_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, KEPT_COLS});
  lm_tensor m = lm_pad(lm_broadcast_to(lm_const(g, 1.0f), 2, (lm_dim[]){1, 8}), 1, 8, KEPT_COLS - 16);
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_mul(h, m), 0.5f), lm_mul_scalar(m, 0.25f));
  OK(lm_output(lm_sum(h2, 1, 0), "y"));
  OK(lm_assign(h, h2));
  return g;
}

/* (the kernels' stores of a plain 0 to a plan buffer or to the state's local array l0) */
static float *kept_scan(const char *backend, int finite, int *zero_stores) {
  lm_graph_t *g = kept_graph();
  if (finite) lm_graph_promise_finite(g);
  float h[LZ_N * KEPT_COLS];
  for (int i = 0; i < LZ_N * KEPT_COLS; i++) h[i] = (float)((i * 7) % 13) * 0.25f - 1.0f;
  return dump_scan(g, KEPT_COLS, h, backend, "l0\\[.*\\] = 0\\.0f;", zero_stores);
}

Test(columns, a_finite_kernel_stores_zeros_where_its_arithmetic_multiplies_by_a_pads_zero) {
  int with = 0, without = 0;
  float *fin = kept_scan("cpu", 1, &with), *plain = kept_scan("cpu", 0, &without), *ref = kept_scan("ref", 1, NULL);
  cr_assert_gt(with, 0, "no store of a plain 0 in the finite graph's lane kernel");
  cr_assert_eq(without, 0, "%d stores of a plain 0 without the promise", without);
  expect_bits("kept columns, finite graph: cpu vs ref", fin, ref, (size_t)LZ_T * LZ_N);
  expect_bits("kept columns, plain graph: cpu vs ref", plain, ref, (size_t)LZ_T * LZ_N);
  free(fin);
  free(plain);
  free(ref);
}

Test(columns, an_aranges_digits_become_an_index_value_with_the_references_bits) {
  int index = 0;
  float *cpu = cell_scan("cpu", &index), *ref = cell_scan("ref", NULL);
  cr_assert_gt(index, 0, "no index value in the lane kernel");
  expect_bits("cell reads", cpu, ref, (size_t)LZ_T * LZ_N);
  cr_assert_eq(ref[0], (float)((1 * 7) % 13) * 0.25f - 1.0f); /* env 0 reads cell 1 */
  cr_assert_eq(ref[LZ_N], ref[0] + 0.75f);                     /* and bumped it */
  free(cpu);
  free(ref);
}

/* ================================================================ compiler/columns.c on hand-built kernels */

/* A small interpreter of the statements these kernels use (local arrays 0 and 1). */
typedef struct mini {
  lm_kernel k;
  lm_exprs x;
  float arr[2][64], val[256];
  int64_t vars[16];
} mini;

static void mini_block(mini *m, const lm_block *b);
static void mini_loop(mini *m, int32_t l) {
  int64_t e = lm_x_eval(&m->x, m->k.loops[l].extent, m->vars, NULL);
  for (m->vars[l] = 0; m->vars[l] < e; m->vars[l]++) mini_block(m, &m->k.loops[l].body);
}
static void mini_block(mini *m, const lm_block *b) {
  for (size_t i = 0; i < b->n; i++) {
    if (b->items[i].is_loop) {
      mini_loop(m, (int32_t)b->items[i].id);
      continue;
    }
    uint32_t id = b->items[i].id;
    const lm_stmt *s = &m->k.stmts[id];
    cr_assert(id < 256);
    int v = !s->valid || lm_x_eval(&m->x, s->valid, m->vars, NULL);
    int64_t at = s->idx ? lm_x_eval(&m->x, s->idx, m->vars, NULL) : 0;
    cr_assert(at >= 0 && at < 64);
    switch (s->op) {
    case LM_S_CONST: m->val[id] = s->f; break;
    case LM_S_LOAD: m->val[id] = v ? m->arr[s->buf][at] : 0.0f; break;
    case LM_S_SELECT: m->val[id] = v ? m->val[s->a] : 0.0f; break;
    case LM_S_ADD: m->val[id] = m->val[s->a] + m->val[s->b]; break;
    case LM_S_MUL: m->val[id] = m->val[s->a] * m->val[s->b]; break;
    case LM_S_STORE:
      if (v) m->arr[s->buf][at] = m->val[s->a];
      break;
    default: cr_assert_fail("op %d", s->op);
    }
  }
}

/* A kernel of `par p < 1: for c < 3` (loops *P and *L) to be filled in. */
static mini *mini_new(int32_t *P, int32_t *L) {
  mini *m = calloc(1, sizeof *m);
  cr_assert(m);
  lm_exprs_init(&m->x);
  *P = lm_kernel_add_loop(&m->k, -1, lm_x_const(&m->x, 1), LM_L_PARALLEL);
  m->k.npar = 1;
  *L = lm_kernel_add_loop(&m->k, *P, lm_x_const(&m->x, 3), LM_L_SERIAL);
  return m;
}

/* Runs m's kernel on a[i] = i * scale + shift (array 0) and d = -1 (array 1) into before, then
 * compiler/columns.c on it, then the result again into after; frees m. The pass's count. */
static int mini_columns(mini *m, float scale, float shift, float *before, float *after) {
  lm_kernel *k = &m->k;
  int64_t n[2] = {64, 64};
  k->locals = n, k->nlocals = 2;
  for (int i = 0; i < 64; i++) m->arr[0][i] = (float)i * scale + shift, m->arr[1][i] = -1.0f;
  float init[2][64];
  memcpy(init, m->arr, sizeof init);
  mini_block(m, &k->root);
  memcpy(before, m->arr[1], sizeof m->arr[1]);
  int r = lm_lanes_columns(k, &m->x);
  memcpy(m->arr, init, sizeof init);
  mini_block(m, &k->root);
  memcpy(after, m->arr[1], sizeof m->arr[1]);
  k->locals = NULL, k->nlocals = 0;
  lm_kernel_free(k);
  lm_exprs_free(&m->x);
  free(m);
  return r;
}

enum { MC_STACK, MC_STORE_BEFORE, MC_LOADS_STORED, MC_SAME_ELEMENT, MC_VALID_ON_COLUMN };

/* par p < 1: for c < 3: lanes j < 4: d[4c + j] = (c < 1 ? a[j] : 0) + (0 < c ? a[4 + j] * 2 : 0)
 * (a stack of two columns over three), or a variant the pass must leave alone. */
static int mini_case(int kind, float *before, float *after) {
  int32_t P, L;
  mini *m = mini_new(&P, &L);
  lm_exprs *x = &m->x;
  lm_kernel *k = &m->k;
  lm_expr one = lm_x_const(x, 1);
  lm_expr c = lm_x_var(x, L), ccol = lm_x_lt(x, c, one), after0 = lm_x_lt(x, lm_x_const(x, 0), c);
  uint32_t two = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_CONST, .loop = P, .f = 2.0f}, L);
  if (kind == MC_STORE_BEFORE)
    lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_STORE, .loop = L, .local = 1, .buf = 1, .a = two, .idx = c, .valid = one}, -1);
  int32_t C = lm_kernel_add_loop(k, L, lm_x_const(x, 4), LM_L_LANES);
  lm_expr j = lm_x_var(x, C);
  uint32_t x0 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_LOAD, .loop = C, .local = 1, .idx = j, .valid = ccol}, -1);
  uint32_t x1 = lm_kernel_add_stmt(k,
                                   &(lm_stmt){.op = LM_S_LOAD, .loop = C, .local = 1, .buf = kind == MC_LOADS_STORED,
                                              .idx = lm_x_add(x, j, lm_x_const(x, 4)), .valid = one},
                                   -1);
  uint32_t m1 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_MUL, .loop = C, .a = x1, .b = two}, -1);
  uint32_t p1 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_SELECT, .loop = C, .a = m1, .valid = after0}, -1);
  uint32_t sum = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ADD, .loop = C, .a = x0, .b = p1}, -1);
  lm_expr at = kind == MC_SAME_ELEMENT ? j : lm_x_add(x, lm_x_mul(x, c, lm_x_const(x, 4)), j);
  lm_expr valid = kind == MC_VALID_ON_COLUMN ? lm_x_lt(x, c, lm_x_const(x, 2)) : one;
  lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_STORE, .loop = C, .local = 1, .buf = 1, .a = sum, .idx = at, .valid = valid}, -1);
  cr_assert(!x->failed && k->nstmts < 256);
  return mini_columns(m, 1.0f, -7.5f, before, after);
}

/* par p < 1: for c < 3: lanes j < 4: d[4c + j] = a[3j + c] (rows: an env's [N, 3] state copied
 * into lane form), or = a[4c + j] (columns already contiguous per lane: nothing to gain). */
static int copy_case(int rows, float *before, float *after) {
  int32_t P, L;
  mini *m = mini_new(&P, &L);
  lm_exprs *x = &m->x;
  lm_kernel *k = &m->k;
  lm_expr one = lm_x_const(x, 1);
  int32_t C = lm_kernel_add_loop(k, L, lm_x_const(x, 4), LM_L_LANES);
  lm_expr c = lm_x_var(x, L), j = lm_x_var(x, C);
  lm_expr src = rows ? lm_x_add(x, lm_x_mul(x, j, lm_x_const(x, 3)), c) : lm_x_add(x, lm_x_mul(x, c, lm_x_const(x, 4)), j);
  uint32_t v = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_LOAD, .loop = C, .local = 1, .idx = src, .valid = one}, -1);
  lm_kernel_add_stmt(k,
                     &(lm_stmt){.op = LM_S_STORE, .loop = C, .local = 1, .buf = 1, .a = v,
                                .idx = lm_x_add(x, lm_x_mul(x, c, lm_x_const(x, 4)), j), .valid = one},
                     -1);
  cr_assert(!x->failed);
  return mini_columns(m, 1.5f, 0.0f, before, after);
}

Test(columns, a_copy_of_rows_is_unrolled_into_its_lanes_and_a_copy_of_columns_is_not) {
  float before[64], after[64];
  cr_assert_eq(copy_case(1, before, after), 1, "rows: not unrolled");
  expect_bits("columns: rows", after, before, 64);
  cr_assert_eq(before[4 * 2 + 1], (3 * 1 + 2) * 1.5f); /* column 2 of lane 1 */
  cr_assert_eq(copy_case(0, before, after), 0, "columns: unrolled");
  expect_bits("columns: columns", after, before, 64);
}

Test(columns, a_stack_loop_is_unrolled_into_its_lanes_with_the_same_values) {
  float before[64], after[64];
  cr_assert_eq(mini_case(MC_STACK, before, after), 1);
  expect_bits("columns: stack", after, before, 64);
  cr_assert_eq(before[0], -7.5f); /* column 0: a[0] */
  cr_assert_eq(before[4], 2 * (4 - 7.5f));  /* column 1: a[4] * 2 */
}

Test(columns, loops_whose_order_matters_are_left_alone) {
  static const char *const names[] = {"", "a store before the lane loop", "a load of a stored array",
                                      "two columns storing one element", "a store valid in some columns"};
  for (int kind = MC_STORE_BEFORE; kind <= MC_VALID_ON_COLUMN; kind++) {
    float before[64], after[64];
    cr_assert_eq(mini_case(kind, before, after), 0, "%s: unrolled", names[kind]);
    expect_bits(names[kind], after, before, 64);
  }
}

/* compiler/render.c's tiles: an env's row of 40 floats read into the lanes and written back,
 * and a per-step output row of 40, are strided accesses of a column loop around its lane loop
 * (element c + 40 * lane); the cpu kernel copies them in tiles of 16 columns by 16 x 16 register
 * transposes (two whole tiles and a partial one of 8 columns, in the whole lane block; the
 * guarded tail block of 6 envs keeps its loops). h' = 0.5 h + c / 8, y = 3 h' - 1, T steps: the
 * reference's bits with the tiles and without (LUMEN_NO_TILES). */
enum { ROW_COLS = 40 };

static void row_scan(const char *backend, const char *off, float **y, float **h, int *tiles, int *direct) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor hv = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, ROW_COLS});
  lm_tensor cols = lm_mul_scalar(lm_reshape(lm_arange(g, ROW_COLS), 2, (lm_dim[]){1, ROW_COLS}), 0.125f);
  lm_tensor h2 = lm_add(lm_mul_scalar(hv, 0.5f), cols);
  OK(lm_output(lm_add_scalar(lm_mul_scalar(h2, 3.0f), -1.0f), "y"));
  OK(lm_assign(hv, h2));
  if (off) setenv(off, "1", 1);
  char dir[] = "/tmp/lumen-tiles-XXXXXX";
  lm_backend_t *b = NULL;
  lm_program_t *p = open_scan(g, backend, tiles ? dir : NULL, 1, &b);
  if (off) unsetenv(off);
  OK(lm_program_bind(p, "N", LZ_N));
  OK(lm_program_bind(p, "T", LZ_T));
  float h0[LZ_N * ROW_COLS];
  for (int i = 0; i < LZ_N * ROW_COLS; i++) h0[i] = (float)((i * 29) % 31) * 0.0625f - 1.0f;
  put(p, "h", h0, (size_t)LZ_N * ROW_COLS);
  OK(lm_program_run(p));
  *y = get(p, "y", (size_t)LZ_T * LZ_N * ROW_COLS);
  *h = get(p, "h", (size_t)LZ_N * ROW_COLS);
  if (tiles) {
    *direct = check_dump_count(dir, "columns, transposed \\*/", 1);
    *tiles = check_dump_lines(dir, "lm_tr16(&");
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* The state's copies into the lanes and back are copies alone: transposed straight between the
 * row and the state's local array (no tile), LUMEN_NO_TILE_DIRECT=1 through a tile. */
Test(columns, rows_of_an_envs_state_and_outputs_move_in_transposed_tiles_with_the_references_bits) {
  float *y, *h, *ty, *th, *dy, *dh, *ry, *rh;
  int with = 0, without = 0, tiled = 0, direct = 0, direct_off = 0, unused = 0;
  row_scan("cpu", NULL, &y, &h, &with, &direct);
  row_scan("cpu", "LUMEN_NO_TILES", &ty, &th, &without, &unused);
  row_scan("cpu", "LUMEN_NO_TILE_DIRECT", &dy, &dh, &tiled, &direct_off);
  row_scan("ref", NULL, &ry, &rh, NULL, NULL);
  cr_assert_geq(with, 3, "%d transposed copies in the cpu kernel (state in, state out, y out)", with);
  cr_assert_eq(direct, 2, "%d copies transposed straight (state in, state out)", direct);
  cr_assert_eq(without, 0, "%d transposed copies under LUMEN_NO_TILES", without);
  cr_assert(tiled >= 3 && direct_off == 0, "LUMEN_NO_TILE_DIRECT: %d transposed copies, %d straight", tiled, direct_off);
  expect_bits("y with tiles vs ref", y, ry, (size_t)LZ_T * LZ_N * ROW_COLS);
  expect_bits("h with tiles vs ref", h, rh, (size_t)LZ_N * ROW_COLS);
  expect_bits("y without tiles vs ref", ty, ry, (size_t)LZ_T * LZ_N * ROW_COLS);
  expect_bits("h without tiles vs ref", th, rh, (size_t)LZ_N * ROW_COLS);
  expect_bits("y through tiles alone vs ref", dy, ry, (size_t)LZ_T * LZ_N * ROW_COLS);
  expect_bits("h through tiles alone vs ref", dh, rh, (size_t)LZ_N * ROW_COLS);
  free(y), free(h), free(ty), free(th), free(dy), free(dh), free(ry), free(rh);
}
