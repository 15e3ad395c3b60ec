/* Tests for the program API (compiler/runtime.c, include/lumen/runtime.h) on the ref backend:
 * the backend registry, symbol bindings and buffer (re)sizing, reads and writes by name, the
 * error for every misuse (status and a message naming what was wrong), buffers that start at
 * zero, a program that outlives its graph, and allocation-failure injection at every
 * allocation of a build-and-run pass (each failure must surface as an error, leak nothing
 * under ASan, and leave the program usable). Values are compared bit-for-bit: the expected
 * numbers come from the same single float operations in C. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core.h" /* lm_alloc_fail_after, lm_clear_error */
#include "lumen/lumen.h"
#include "support/timeout.h"

static lm_backend_t *B;
static lm_graph_t *G;
static lm_program_t *P;

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

/* The call failed with `want` and the message names every given fragment. */
#define FAILS(call, want, ...)                                                                     \
  do {                                                                                             \
    lm_clear_error();                                                                              \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, (want), "%s -> %s (%s), expected %s", #call, lm_status_name(st_),            \
                 lm_last_error(), lm_status_name(want));                                           \
    expect_message(#call, (const char *[]){__VA_ARGS__, NULL});                                    \
  } while (0)

static void expect_message(const char *what, const char *const *parts) {
  const char *msg = lm_last_error();
  cr_assert(msg && *msg, "%s: no error message", what);
  for (; *parts; parts++) cr_assert(strstr(msg, *parts), "%s: message \"%s\" does not mention \"%s\"", what, msg, *parts);
}

static void setup(void) {
  lm_alloc_fail_after(0);
  B = lm_backend_new("ref");
  cr_assert(B, "ref backend: %s", lm_last_error());
  G = lm_graph_new();
  cr_assert(G);
}

static void teardown(void) {
  lm_alloc_fail_after(0);
  lm_program_free(P);
  P = NULL;
  lm_graph_free(G);
  G = NULL;
  lm_backend_free(B);
  B = NULL;
}

TestSuite(runtime, .init = setup, .fini = teardown);

static lm_program_t *compile(void) {
  P = lm_program_new(B, G);
  cr_assert(P, "lm_program_new: %s", lm_last_error());
  return P;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Reads n floats into a NaN-poisoned buffer and compares every one bit-for-bit. */
static void expect_read(lm_program_t *p, const char *name, const float *want, size_t n) {
  float got[256];
  cr_assert(n <= 256);
  for (size_t i = 0; i < 256; i++) got[i] = NAN;
  OK(lm_program_read(p, name, got, n));
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(bits(got[i]), bits(want[i]), "%s[%zu] = %a, expected %a", name, i, (double)got[i], (double)want[i]);
}

static void expect_zeros(lm_program_t *p, const char *name, size_t n) {
  float z[256] = {0};
  expect_read(p, name, z, n);
}

static size_t numel(lm_program_t *p, const char *name) {
  size_t n = (size_t)-1;
  OK(lm_program_numel(p, name, &n));
  return n;
}

/* ================================================================ backends */

Test(runtime, backend_registry_lists_ref_and_nothing_past_the_end) {
  int n = lm_backend_count(), ref = 0;
  cr_assert_geq(n, 1);
  for (int i = 0; i < n; i++) {
    const char *name = lm_backend_name_at(i);
    cr_assert(name && *name, "backend %d has no name", i);
    ref += !strcmp(name, "ref");
  }
  cr_assert_eq(ref, 1, "\"ref\" must be listed exactly once");
  cr_assert_null(lm_backend_name_at(n));
  cr_assert_null(lm_backend_name_at(-1));
  cr_assert_str_eq(lm_backend_name(B), "ref");
  cr_assert_null(lm_backend_name(NULL));
}

Test(runtime, unknown_backend_is_null_and_the_error_names_it_and_lists_ref) {
  lm_clear_error();
  cr_assert_null(lm_backend_new("warp-drive"));
  expect_message("lm_backend_new(\"warp-drive\")", (const char *[]){"warp-drive", "ref", NULL});
  lm_clear_error();
  cr_assert_null(lm_backend_new(NULL));
  expect_message("lm_backend_new(NULL)", (const char *[]){"ref", NULL});
  lm_backend_free(NULL); /* a no-op */
}

/* ================================================================ bindings */

Test(runtime, run_with_an_unbound_symbol_fails_naming_it) {
  lm_dim n = lm_sym(G, "NUM_ENVS");
  lm_tensor x = lm_input(G, "x", LM_ROLE_STATE, 1, (lm_dim[]){n});
  OK(lm_output(lm_sin(x), "y"));
  lm_program_t *p = compile();
  FAILS(lm_program_run(p), LM_ERR_INVALID, "NUM_ENVS");
  cr_assert_eq(lm_program_run_index(p), 0, "a failed run must not advance the run counter");
  size_t c;
  FAILS(lm_program_numel(p, "x", &c), LM_ERR_INVALID, "NUM_ENVS");
  float v[4];
  FAILS(lm_program_write(p, "x", v, 4), LM_ERR_INVALID, "NUM_ENVS");
  FAILS(lm_program_read(p, "x", v, 4), LM_ERR_INVALID, "NUM_ENVS");
}

Test(runtime, a_symbol_only_in_a_rand_shape_must_be_bound_too) {
  lm_dim k = lm_sym(G, "HORIZON");
  OK(lm_output(lm_rand(G, 1, (lm_dim[]){k}), "r"));
  lm_program_t *p = compile();
  FAILS(lm_program_run(p), LM_ERR_INVALID, "HORIZON");
  OK(lm_program_bind(p, "HORIZON", 3));
  OK(lm_program_run(p));
  float want[3] = {lm_rand_uniform(0, 0, 0, 0), lm_rand_uniform(0, 0, 1, 0), lm_rand_uniform(0, 0, 2, 0)};
  expect_read(p, "r", want, 3);
}

Test(runtime, binding_an_unknown_symbol_fails_naming_it) {
  lm_dim n = lm_sym(G, "N");
  OK(lm_output(lm_input(G, "x", LM_ROLE_STATE, 1, (lm_dim[]){n}), "y"));
  lm_program_t *p = compile();
  FAILS(lm_program_bind(p, "M", 3), LM_ERR_INVALID, "'M'");
  FAILS(lm_program_bind(p, "n", 3), LM_ERR_INVALID, "'n'"); /* names are case-sensitive */
  OK(lm_program_bind(p, "N", 3));
}

Test(runtime, binding_below_the_least_value_fails_and_keeps_the_old_binding) {
  lm_dim n = lm_sym(G, "N"), off = lm_sym_min(G, "OFF", 0);
  lm_tensor x = lm_input(G, "x", LM_ROLE_STATE, 1, (lm_dim[]){n});
  OK(lm_output(lm_affine_mod(x, 0, 1, off), "y"));
  lm_program_t *p = compile();
  FAILS(lm_program_bind(p, "N", 0), LM_ERR_INVALID, "N", "0", "1");
  FAILS(lm_program_bind(p, "N", -5), LM_ERR_INVALID, "N", "-5");
  OK(lm_program_bind(p, "OFF", 0)); /* lm_sym_min(.., 0) admits 0 */
  FAILS(lm_program_bind(p, "OFF", -1), LM_ERR_INVALID, "OFF", "-1");
  OK(lm_program_bind(p, "N", 4));
  FAILS(lm_program_bind(p, "N", 0), LM_ERR_INVALID, "N");
  cr_assert_eq(numel(p, "x"), 4, "a rejected bind must keep N = 4");
  float v[4] = {1.5f, 2.5f, 3.5f, 4.5f};
  OK(lm_program_write(p, "x", v, 4));
  OK(lm_program_bind(p, "OFF", 6));
  OK(lm_program_run(p));
  float want[4] = {3.5f, 4.5f, 1.5f, 2.5f}; /* y[i] = x[(i + 6) mod 4] */
  expect_read(p, "y", want, 4);
}

/* A rebinding is checked over what its symbol reaches (lm_graph_binding_masks): moving a
 * minibatch-like window out of its axis is refused naming the slice, moving it back runs, and
 * the layout kept across the move serves the new window. */
Test(runtime, a_moved_slice_is_checked_again_and_out_of_range_is_refused) {
  lm_dim off = lm_sym_min(G, "OFF", 0);
  lm_tensor x = lm_input(G, "x", LM_ROLE_STATE, 1, (lm_dim[]){6});
  OK(lm_output(lm_mul(lm_slice(x, 0, off, lm_dim_add(G, off, 2)), lm_const(G, 2)), "y"));
  lm_program_t *p = compile();
  float v[6] = {1, 2, 3, 4, 5, 6};
  OK(lm_program_write(p, "x", v, 6));
  OK(lm_program_bind(p, "OFF", 0));
  OK(lm_program_run(p));
  expect_read(p, "y", ((float[]){2, 4}), 2);
  OK(lm_program_bind(p, "OFF", 5)); /* [5, 7) is past the end */
  FAILS(lm_program_run(p), LM_ERR_INVALID, "slice", "[5, 7)");
  OK(lm_program_bind(p, "OFF", 4));
  OK(lm_program_run(p));
  expect_read(p, "y", ((float[]){10, 12}), 2);
  OK(lm_program_bind(p, "OFF", 2));
  OK(lm_program_run(p));
  expect_read(p, "y", ((float[]){6, 8}), 2);
}

Test(runtime, rebinding_resizes_zeroes_persistent_buffers_and_requires_data_again) {
  lm_dim n = lm_sym(G, "N");
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 1, (lm_dim[]){n});
  lm_tensor c = lm_input(G, "c", LM_ROLE_DATA, 1, (lm_dim[]){1});
  lm_tensor w = lm_input(G, "w", LM_ROLE_PARAM, 1, (lm_dim[]){1});
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 1, (lm_dim[]){n});
  lm_tensor y = lm_add(lm_mul(x, w), lm_add(s, c));
  OK(lm_output(y, "y"));
  OK(lm_assign(s, y));
  lm_program_t *p = compile();
  OK(lm_program_bind(p, "N", 2));
  float x2[2] = {1.5f, -2.5f}, cv[1] = {0.25f}, wv[1] = {3.0f}, s2[2] = {10.0f, 20.0f};
  OK(lm_program_write(p, "x", x2, 2));
  OK(lm_program_write(p, "c", cv, 1));
  OK(lm_program_write(p, "w", wv, 1));
  OK(lm_program_write(p, "s", s2, 2));
  OK(lm_program_run(p));
  float y2[2] = {1.5f * 3.0f + (10.0f + 0.25f), -2.5f * 3.0f + (20.0f + 0.25f)};
  expect_read(p, "y", y2, 2);

  OK(lm_program_bind(p, "N", 3));
  cr_assert_eq(numel(p, "x"), 3);
  cr_assert_eq(numel(p, "s"), 3);
  cr_assert_eq(numel(p, "y"), 3);
  expect_zeros(p, "s", 3);  /* resized persistent buffers start again at zero */
  expect_read(p, "w", wv, 1); /* ones that do not depend on N keep their values */
  float out[3];
  FAILS(lm_program_read(p, "y", out, 3), LM_ERR_INVALID, "'y'"); /* no stale output of the old size */
  FAILS(lm_program_run(p), LM_ERR_INVALID, "'x'");             /* x was resized: rewrite it */
  float x3[3] = {1.0f, 2.0f, 3.0f};
  OK(lm_program_write(p, "x", x3, 3));
  OK(lm_program_run(p)); /* c kept its size, so it is still written */
  float y3[3] = {1.0f * 3.0f + 0.25f, 2.0f * 3.0f + 0.25f, 3.0f * 3.0f + 0.25f};
  expect_read(p, "y", y3, 3);
  expect_read(p, "s", y3, 3);

  OK(lm_program_bind(p, "N", 2)); /* back to 2: a fresh zeroed state, not the old one */
  expect_zeros(p, "s", 2);
}

Test(runtime, binding_the_same_value_keeps_state_data_and_outputs) {
  lm_dim n = lm_sym(G, "N");
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 1, (lm_dim[]){n});
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 1, (lm_dim[]){n});
  lm_tensor y = lm_add(s, x);
  OK(lm_output(y, "y"));
  OK(lm_assign(s, y));
  lm_program_t *p = compile();
  OK(lm_program_bind(p, "N", 2));
  float xv[2] = {0.5f, 1.25f};
  OK(lm_program_write(p, "x", xv, 2));
  OK(lm_program_run(p));
  OK(lm_program_bind(p, "N", 2));
  expect_read(p, "y", xv, 2); /* the output survives */
  expect_read(p, "s", xv, 2); /* so does the state */
  OK(lm_program_run(p));      /* and x needs no rewrite */
  float twice[2] = {0.5f + 0.5f, 1.25f + 1.25f};
  expect_read(p, "s", twice, 2);
}

Test(runtime, a_symbol_bound_to_zero_gives_empty_buffers) {
  lm_dim k = lm_sym_min(G, "K", 0);
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 2, (lm_dim[]){k, 3});
  OK(lm_output(lm_sum_reduce(x, 0), "colsum"));
  OK(lm_output(lm_sin(x), "y"));
  lm_program_t *p = compile();
  OK(lm_program_bind(p, "K", 0));
  cr_assert_eq(numel(p, "x"), 0);
  OK(lm_program_write(p, "x", NULL, 0));
  OK(lm_program_run(p));
  cr_assert_eq(numel(p, "y"), 0);
  expect_zeros(p, "colsum", 3);
}

/* ================================================================ reads, writes, names */

Test(runtime, write_with_the_wrong_count_fails_naming_both_counts) {
  OK(lm_output(lm_input(G, "x", LM_ROLE_DATA, 2, (lm_dim[]){3, 4}), "y"));
  lm_program_t *p = compile();
  float v[13] = {0};
  FAILS(lm_program_write(p, "x", v, 11), LM_ERR_INVALID, "'x'", "12", "11");
  FAILS(lm_program_write(p, "x", v, 13), LM_ERR_INVALID, "12", "13");
  FAILS(lm_program_run(p), LM_ERR_INVALID, "'x'"); /* a rejected write does not count as written */
}

Test(runtime, unknown_names_fail_for_write_read_and_numel) {
  OK(lm_output(lm_input(G, "x", LM_ROLE_DATA, 1, (lm_dim[]){2}), "y"));
  lm_program_t *p = compile();
  float v[2] = {1.0f, 2.0f};
  size_t n;
  FAILS(lm_program_write(p, "nope", v, 2), LM_ERR_INVALID, "nope");
  FAILS(lm_program_write(p, "y", v, 2), LM_ERR_INVALID, "'y'"); /* outputs are not writable */
  FAILS(lm_program_read(p, "nope", v, 2), LM_ERR_INVALID, "nope");
  FAILS(lm_program_numel(p, "nope", &n), LM_ERR_INVALID, "nope");
}

Test(runtime, reading_an_output_before_any_run_fails) {
  OK(lm_output(lm_sin(lm_input(G, "x", LM_ROLE_PARAM, 1, (lm_dim[]){2})), "y"));
  lm_program_t *p = compile();
  float v[2];
  FAILS(lm_program_read(p, "y", v, 2), LM_ERR_INVALID, "'y'", "run");
  OK(lm_program_run(p)); /* parameters start at zero: sin(0) = 0 */
  expect_zeros(p, "y", 2);
}

Test(runtime, a_data_input_never_written_fails_the_run_naming_it) {
  lm_tensor a = lm_input(G, "a", LM_ROLE_DATA, 1, (lm_dim[]){2});
  lm_tensor obs = lm_input(G, "observation", LM_ROLE_DATA, 1, (lm_dim[]){2});
  OK(lm_output(lm_add(a, obs), "y"));
  lm_program_t *p = compile();
  float v[2] = {1.0f, 2.0f};
  OK(lm_program_write(p, "a", v, 2));
  FAILS(lm_program_run(p), LM_ERR_INVALID, "'observation'");
  cr_assert_eq(lm_program_run_index(p), 0);
  FAILS(lm_program_read(p, "observation", v, 2), LM_ERR_INVALID, "'observation'");
  OK(lm_program_write(p, "observation", v, 2));
  OK(lm_program_run(p));
  float want[2] = {2.0f, 4.0f};
  expect_read(p, "y", want, 2);
  expect_read(p, "observation", v, 2); /* data inputs read back what was written */
}

Test(runtime, reading_with_the_wrong_count_fails_naming_both_counts) {
  OK(lm_output(lm_input(G, "w", LM_ROLE_PARAM, 1, (lm_dim[]){5}), "y"));
  lm_program_t *p = compile();
  OK(lm_program_run(p));
  float v[6];
  FAILS(lm_program_read(p, "y", v, 4), LM_ERR_INVALID, "'y'", "5", "4");
  FAILS(lm_program_read(p, "w", v, 6), LM_ERR_INVALID, "'w'", "5", "6");
}

Test(runtime, parameters_and_state_start_at_zero) {
  lm_dim n = lm_sym(G, "N");
  lm_input(G, "w", LM_ROLE_PARAM, 2, (lm_dim[]){3, 4});
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 2, (lm_dim[]){n, 2});
  OK(lm_output(s, "y"));
  lm_program_t *p = compile();
  expect_zeros(p, "w", 12); /* before any run, even before binding N (w does not use it) */
  OK(lm_program_bind(p, "N", 7));
  expect_zeros(p, "s", 14);
  OK(lm_program_run(p));
  expect_zeros(p, "y", 14);
}

Test(runtime, numel_counts_inputs_and_outputs_under_the_current_bindings) {
  lm_dim n = lm_sym(G, "N"), t = lm_sym(G, "T");
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 3, (lm_dim[]){t, n, 4});
  OK(lm_output(lm_sum_reduce(lm_pad(x, 1, 1, 2), 2), "y")); /* [T, N+3] */
  OK(lm_output(lm_const(G, 1.0f), "scalar"));
  lm_program_t *p = compile();
  cr_assert_eq(numel(p, "scalar"), 1);
  OK(lm_program_bind(p, "N", 5));
  size_t c;
  FAILS(lm_program_numel(p, "y", &c), LM_ERR_INVALID, "T");
  OK(lm_program_bind(p, "T", 2));
  cr_assert_eq(numel(p, "x"), 2 * 5 * 4);
  cr_assert_eq(numel(p, "y"), 2 * (5 + 3));
  OK(lm_program_bind(p, "N", 1));
  cr_assert_eq(numel(p, "y"), 2 * (1 + 3));
}

Test(runtime, run_counter_advances_only_on_successful_runs) {
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 1, (lm_dim[]){2});
  OK(lm_output(lm_add(x, lm_rand(G, 1, (lm_dim[]){2})), "y"));
  lm_program_t *p = compile();
  cr_assert_eq(lm_program_run_index(p), 0);
  cr_assert_neq(lm_program_run(p), LM_OK);
  cr_assert_eq(lm_program_run_index(p), 0);
  float v[2] = {1.0f, 2.0f};
  OK(lm_program_write(p, "x", v, 2));
  OK(lm_program_run(p));
  OK(lm_program_run(p));
  cr_assert_eq(lm_program_run_index(p), 2);
  float want[2] = {1.0f + lm_rand_uniform(0, 0, 0, 1), 2.0f + lm_rand_uniform(0, 0, 1, 1)};
  expect_read(p, "y", want, 2);
}

/* ================================================================ programs and graphs */

Test(runtime, a_program_outlives_its_graph) {
  lm_dim n = lm_sym(G, "N");
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 1, (lm_dim[]){n});
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 1, (lm_dim[]){n});
  int perm[1] = {0};
  OK(lm_output(lm_mul(lm_permute(x, perm), lm_const(G, 2.0f)), "y"));
  OK(lm_assign(s, lm_add(s, x)));
  lm_program_t *p = compile();
  lm_graph_free(G); /* everything below runs on the program's own copy */
  G = NULL;
  OK(lm_program_bind(p, "N", 3));
  float v[3] = {1.0f, 2.0f, 3.0f}, want[3] = {2.0f, 4.0f, 6.0f};
  OK(lm_program_write(p, "x", v, 3));
  OK(lm_program_run(p));
  OK(lm_program_run(p));
  expect_read(p, "y", want, 3);
  expect_read(p, "s", want, 3);
}

Test(runtime, edits_to_the_graph_after_lm_program_new_do_not_reach_the_program) {
  lm_tensor x = lm_input(G, "x", LM_ROLE_PARAM, 1, (lm_dim[]){2});
  OK(lm_output(x, "y"));
  lm_program_t *p = compile();
  OK(lm_output(lm_sin(x), "late"));
  size_t n;
  FAILS(lm_program_numel(p, "late", &n), LM_ERR_INVALID, "late");
  OK(lm_program_run(p));
}

Test(runtime, lm_program_new_on_an_invalid_graph_is_null_with_the_construction_message) {
  lm_tensor a = lm_input(G, "a", LM_ROLE_DATA, 1, (lm_dim[]){3});
  lm_tensor b = lm_input(G, "b", LM_ROLE_DATA, 1, (lm_dim[]){4});
  lm_tensor c = lm_add(a, b);
  cr_assert(!lm_tensor_ok(c));
  lm_clear_error();
  cr_assert_neq(lm_output(c, "c"), LM_OK);
  lm_clear_error();
  cr_assert_null(lm_program_new(B, G));
  expect_message("lm_program_new", (const char *[]){"add", "[3]", "[4]", NULL});
}

Test(runtime, lm_program_new_with_a_null_argument_fails) {
  OK(lm_output(lm_const(G, 1.0f), "one"));
  lm_clear_error();
  cr_assert_null(lm_program_new(NULL, G));
  expect_message("lm_program_new(NULL, g)", (const char *[]){"backend", NULL});
  lm_clear_error();
  cr_assert_null(lm_program_new(B, NULL));
  expect_message("lm_program_new(b, NULL)", (const char *[]){"graph", NULL});
  lm_program_free(NULL); /* a no-op */
}

Test(runtime, two_programs_of_one_graph_keep_separate_state) {
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 1, (lm_dim[]){1});
  OK(lm_assign(s, lm_add(s, lm_const(G, 1.0f))));
  lm_program_t *p = compile(), *q = lm_program_new(B, G);
  cr_assert(q, "%s", lm_last_error());
  OK(lm_program_run(p));
  OK(lm_program_run(p));
  OK(lm_program_run(q));
  float two[1] = {2.0f}, one[1] = {1.0f};
  expect_read(p, "s", two, 1);
  expect_read(q, "s", one, 1);
  lm_program_free(q);
}

/* ================================================================ allocation failures */

/* One pass over a program: bind, write, run three times (with a rebind), read everything.
 * Deterministic from any starting point (state is rewritten, the run counter reset). Returns 0
 * when every call succeeded, else the number of the call that failed (its status != LM_OK). */
typedef struct pass_result {
  float z1[4], z2[4], s2[6], z3[4], s3[9], yr3[9];
} pass_result;

static int program_pass(lm_program_t *p, pass_result *r) {
  static const float x2[6] = {0.5f, -1.5f, 2.25f, 3.0f, -0.75f, 1.125f};
  static const float x3[9] = {1.0f, 2.0f, -3.0f, 0.25f, 0.5f, 0.75f, -1.0f, 4.0f, 2.5f};
  static const float w[3] = {2.0f, -0.5f, 1.5f}, zero[6] = {0};
  int step = 0;
#define STEP(call)                                                                                 \
  do {                                                                                             \
    step++;                                                                                        \
    if ((call) != LM_OK) return step;                                                              \
  } while (0)
  lm_program_set_run(p, 0);
  STEP(lm_program_bind(p, "N", 2));
  STEP(lm_program_write(p, "x", x2, 6));
  STEP(lm_program_write(p, "w", w, 3));
  STEP(lm_program_write(p, "s", zero, 6));
  STEP(lm_program_run(p));
  STEP(lm_program_read(p, "z", r->z1, 4));
  STEP(lm_program_run(p));
  STEP(lm_program_read(p, "z", r->z2, 4));
  STEP(lm_program_read(p, "s", r->s2, 6));
  STEP(lm_program_bind(p, "N", 3));
  STEP(lm_program_write(p, "x", x3, 9));
  STEP(lm_program_run(p));
  STEP(lm_program_read(p, "z", r->z3, 4));
  STEP(lm_program_read(p, "s", r->s3, 9));
  STEP(lm_program_read(p, "yr", r->yr3, 9));
#undef STEP
  return 0;
}

/* The same pass computed in plain C: y = x*w + s; z = sums over N of y padded by one leading
 * zero column; s <- y; yr = y * rand. */
static void pass_reference(pass_result *r) {
  static const float x2[6] = {0.5f, -1.5f, 2.25f, 3.0f, -0.75f, 1.125f};
  static const float x3[9] = {1.0f, 2.0f, -3.0f, 0.25f, 0.5f, 0.75f, -1.0f, 4.0f, 2.5f};
  static const float w[3] = {2.0f, -0.5f, 1.5f};
  float s[9] = {0}, y[9];
  for (int run = 0; run < 3; run++) {
    int n = run < 2 ? 2 : 3;
    const float *x = run < 2 ? x2 : x3;
    if (run == 2) memset(s, 0, sizeof s); /* rebinding N zeroed the state */
    for (int i = 0; i < n * 3; i++) {
      float xw = x[i] * w[i % 3];
      y[i] = xw + s[i];
    }
    float *z = run == 0 ? r->z1 : run == 1 ? r->z2 : r->z3;
    z[0] = 0.0f;
    for (int j = 0; j < 3; j++) {
      float acc = 0.0f;
      for (int k = 0; k < n; k++) acc = acc + y[k * 3 + j];
      z[j + 1] = acc;
    }
    for (int i = 0; i < n * 3; i++) s[i] = y[i];
    if (run == 1) memcpy(r->s2, s, sizeof r->s2);
    if (run == 2) {
      memcpy(r->s3, s, sizeof r->s3);
      /* run counter: set to 0, then runs 0 and 1 before the rebind, so this is run 2 */
      for (int i = 0; i < 9; i++) r->yr3[i] = y[i] * lm_rand_uniform(0, 0, (uint64_t)i, 2);
    }
  }
}

static void expect_pass(const pass_result *got, const pass_result *want, long k, const char *when) {
  const float *g = (const float *)got, *w = (const float *)want;
  for (size_t i = 0; i < sizeof *got / sizeof(float); i++)
    cr_assert_eq(bits(g[i]), bits(w[i]), "failure at allocation %ld (%s): result float %zu is %a, expected %a", k, when,
                 i, (double)g[i], (double)w[i]);
}

/* Builds the graph (every construction call may fail), makes a program, frees the graph.
 * Returns the program or NULL; *failed_at names the step that failed. */
static lm_program_t *build_program(lm_backend_t **b, int *failed_at) {
  lm_graph_t *g = lm_graph_new();
  *failed_at = 1;
  if (!g) return NULL;
  lm_dim n = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){n, 3});
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor s = lm_input(g, "s", LM_ROLE_STATE, 2, (lm_dim[]){n, 3});
  lm_tensor y = lm_add(lm_mul(x, w), s);
  int tr[2] = {1, 0};
  lm_tensor z = lm_sum_reduce(lm_permute(lm_pad(y, 1, 1, 0), tr), 1);
  lm_tensor yr = lm_mul(y, lm_rand(g, 2, (lm_dim[]){n, 3}));
  lm_program_t *p = NULL;
  *failed_at = 2;
  if (lm_output(z, "z") != LM_OK) goto done;
  *failed_at = 3;
  if (lm_output(yr, "yr") != LM_OK) goto done;
  *failed_at = 4;
  if (lm_assign(s, y) != LM_OK) goto done;
  *failed_at = 5;
  if (!(*b = lm_backend_new("ref"))) goto done;
  *failed_at = 6;
  if (!(p = lm_program_new(*b, g))) goto done;
  *failed_at = 0;
done:
  lm_graph_free(g);
  return p;
}

Test(runtime, every_allocation_failure_is_reported_and_leaves_the_program_usable, .timeout = LM_TIMEOUT(120)) {
  pass_result want, got;
  pass_reference(&want);
  long k;
  int build_failures = 0, pass_failures = 0, absorbed = 0, done = 0;
  for (k = 1; k < 100000; k++) {
    lm_backend_t *b = NULL;
    int failed_at;
    lm_clear_error();
    lm_alloc_fail_after(k);
    lm_program_t *p = build_program(&b, &failed_at);
    if (!p) {
      cr_assert_neq(failed_at, 0);
      cr_assert(lm_last_error()[0], "allocation %ld: build step %d failed without a message", k, failed_at);
      lm_alloc_fail_after(0);
      lm_backend_free(b);
      build_failures++;
      continue;
    }
    memset(&got, 0xFF, sizeof got);
    int step = program_pass(p, &got);
    if (step) {
      cr_assert(lm_last_error()[0], "allocation %ld: pass step %d failed without a message", k, step);
      /* the failure must leave the program consistent: the whole pass now succeeds */
      lm_alloc_fail_after(0);
      memset(&got, 0xFF, sizeof got);
      int again = program_pass(p, &got);
      cr_assert_eq(again, 0, "allocation %ld failed at pass step %d; the retry then failed at step %d: %s", k, step,
                   again, lm_last_error());
      expect_pass(&got, &want, k, "retry after the failure");
      pass_failures++;
    } else {
      /* Every call succeeded. Either the injected failure is still pending (the pass needs
       * fewer than k allocations: the very next one fails and the loop is done), or an
       * optional allocation (a cache) absorbed it, in which case the results must still be
       * exact and the loop goes on. */
      expect_pass(&got, &want, k, "no reported failure");
      lm_graph_t *probe = lm_graph_new();
      done = probe == NULL;
      absorbed += !done;
      lm_graph_free(probe);
      lm_alloc_fail_after(0);
    }
    lm_program_free(p);
    lm_backend_free(b);
    if (done) break;
  }
  lm_alloc_fail_after(0);
  cr_log_info("%ld allocations: %d failed the build, %d a pass, %d absorbed", k - 1, build_failures, pass_failures,
              absorbed);
  cr_assert(done, "the pass never completed without an injected failure");
  cr_assert_lt(absorbed, k / 2, "%d of %ld failures were absorbed without an error", absorbed, k);
  cr_assert_gt(build_failures, 10, "only %d build failures: is the injection working?", build_failures);
  cr_assert_gt(pass_failures, 5, "only %d pass failures: is the injection working?", pass_failures);
}

/* ================================================================ buffer views */

/* lm_program_buffer on ref and cpu (host memory): an output's view is the buffer runs write in
 * place (allocated before the first run), a data input's view counts as written and what the
 * host puts there is what the run reads; a state input's view is the buffer its assign updates;
 * unknown names fail. */
static void buffer_views_on(const char *backend) {
  lm_backend_t *b = lm_backend_new(backend);
  cr_assert(b, "%s: %s", backend, lm_last_error());
  lm_dim n = lm_sym(G, "n");
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 1, &n);
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 1, &n);
  OK(lm_output(lm_add(x, s), "y"));
  OK(lm_assign(s, lm_add(s, lm_const(G, 1.0f))));
  P = lm_program_new(b, G);
  cr_assert(P, "%s: %s", backend, lm_last_error());
  OK(lm_program_bind(P, "n", 3));
  lm_buffer_view y, xv, sv;
  OK(lm_program_buffer(P, "y", &y));
  cr_assert_eq(y.count, 3);
  cr_assert(y.host && y.native == (void *)y.host, "%s's buffers are host memory", backend);
  OK(lm_program_buffer(P, "x", &xv));
  OK(lm_program_buffer(P, "s", &sv));
  for (int i = 0; i < 3; i++) xv.host[i] = 0.5f * (float)(i + 1);
  OK(lm_program_run(P)); /* x was never lm_program_write-n: the view wrote it */
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(bits(y.host[i]), bits(0.5f * (float)(i + 1)), "%s: y[%d] = %a", backend, i, (double)y.host[i]);
    cr_assert_eq(bits(sv.host[i]), bits(1.0f), "%s: the assign went to the state's view", backend);
  }
  OK(lm_program_run(P));
  lm_buffer_view again;
  OK(lm_program_buffer(P, "y", &again));
  cr_assert_eq(again.native, y.native, "%s: runs write the output in place", backend);
  cr_assert_eq(bits(y.host[2]), bits(1.5f + 1.0f));
  FAILS(lm_program_buffer(P, "nope", &again), LM_ERR_INVALID, "nope");
  cr_assert_null(again.native);
  cr_assert_null(lm_backend_queue(b), "%s has no queue", backend);
  cr_assert_null(lm_backend_device_id(b), "%s runs on the host's CPUs", backend);
  lm_program_free(P);
  P = NULL;
  lm_backend_free(b);
}

Test(runtime, a_buffer_view_is_the_memory_runs_read_and_write_on_ref) { buffer_views_on("ref"); }
Test(runtime, a_buffer_view_is_the_memory_runs_read_and_write_on_cpu) { buffer_views_on("cpu"); }
