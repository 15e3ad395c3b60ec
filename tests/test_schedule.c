/* Tests for what the default schedule (compiler/lower.c) and the memory planner
 * (compiler/memplan.c) make of representative graphs: kernel counts (an elementwise chain, softmax,
 * log-softmax, x - mean(x), a 2-layer MLP, a node shared by two outputs, a shared reduction),
 * temporaries and arena sizes, loop-invariant hoisting in the plan text, lm_memplan itself on
 * random interval sets (no two buffers alive together share a byte, offsets aligned, the arena
 * never exceeds the sum), and a kernel that indexes an operand after inlining many reductions
 * (run it under the sanitizer build: a stale loop-extent table is a use-after-free there), and
 * a clipped-Adam MLP update with elementwise epilogues and one-thread joins (lm_schedule_epilogue,
 * lm_schedule_join), each alone and both, against neither: fewer kernels, the same bits.
 *
 * Plans come from lm_lower on the graph canonicalised as the cpu backend does it
 * (LM_CANON_EXACT). Where the values are checked too, the cpu backend is compared with the ref
 * interpreter on fixed-seed inputs away from zero, NaN-poisoned outputs, relative tolerance 2e-5
 * plus absolute 1e-5 (libmvec's SIMD sin/exp2/log2 may differ from scalar libm by a few ulp). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"
#include "loopir.h"
#include "lumen/lumen.h"
#include "memplan.h"
#include "graph-impl.h"
#include "passes.h"
#include "render.h"
#include "support/check.h"

#define RTOL 2e-5
#define ATOL 1e-5

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

/* ---------------------------------------------------------------- plans */

typedef struct lowered {
  lm_graph_t *g; /* canonical graph (owns the plan's expressions) */
  lm_plan *p;
  char *text;    /* lm_plan_dump */
} lowered;

static lowered lower(const lm_graph_t *g) {
  cr_assert_eq(lm_graph_validate(g), LM_OK, "graph: %s", lm_last_error());
  lowered l = {0};
  l.g = lm_canonicalize_ex(g, LM_CANON_EXACT, NULL);
  cr_assert(l.g, "canonicalise: %s", lm_last_error());
  OK(lm_lower(l.g, &l.p));
  lm_sb sb = {0};
  lm_plan_dump(l.p, &sb);
  l.text = lm_sb_take(&sb);
  cr_assert(l.text);
  return l;
}

static void lowered_free(lowered *l) {
  lm_free(l->text);
  lm_plan_free(l->p);
  lm_graph_free(l->g);
  memset(l, 0, sizeof *l);
}

static size_t temps(const lowered *l) {
  size_t n = 0;
  for (size_t i = 0; i < l->p->nbufs; i++) n += l->p->bufs[i].kind == LM_BUF_TEMP;
  return n;
}

static void expect_kernels(const lowered *l, size_t lo, size_t hi, const char *what) {
  size_t n = l->p->nkernels;
  cr_assert(n >= lo && n <= hi, "%s: %zu kernels, expected %zu..%zu; plan:\n%s", what, n, lo, hi, l->text);
}

/* The plan buffer of the program input named `name`. */
static uint32_t input_buf(const lowered *l, const char *name) {
  int in = -1;
  for (size_t i = 0; i < l->g->ninputs; i++)
    if (!strcmp(l->g->inputs[i].name, name)) in = (int)i;
  cr_assert(in >= 0, "no input %s", name);
  for (size_t b = 0; b < l->p->nbufs; b++)
    if (l->p->bufs[b].kind == LM_BUF_INPUT && l->p->bufs[b].index == (uint32_t)in) return (uint32_t)b;
  cr_assert_fail("input %s has no plan buffer", name);
  return 0;
}

/* ---------------------------------------------------------------- cpu against ref */

typedef struct feed {
  const char *name;
  double lo, hi; /* values in [lo, hi) away from zero */
} feed;

/* Builds g on cpu and ref, binds N, writes every input (fixed seed), runs both and compares
 * every output; returns the cpu program's stats. */
static lm_program_stats run_both(const lm_graph_t *g, int64_t N, const feed *in, size_t nin, const char *const *out,
                                 size_t nout) {
  lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
  cr_assert(bc && br, "backends: %s", lm_last_error());
  lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
  cr_assert(pc && pr, "lm_program_new: %s", lm_last_error());
  OK(lm_program_bind(pc, "N", N));
  OK(lm_program_bind(pr, "N", N));
  check_rng r = check_rng_new(0x5c4ed01e);
  for (size_t i = 0; i < nin; i++) {
    size_t n = 0;
    OK(lm_program_numel(pc, in[i].name, &n));
    float *v = malloc(n * sizeof *v);
    cr_assert(v);
    check_fill(&r, v, n, in[i].lo, in[i].hi, 0.01);
    OK(lm_program_write(pc, in[i].name, v, n));
    OK(lm_program_write(pr, in[i].name, v, n));
    free(v);
  }
  OK(lm_program_run(pc));
  OK(lm_program_run(pr));
  for (size_t i = 0; i < nout; i++) {
    size_t n = 0;
    OK(lm_program_numel(pc, out[i], &n));
    float *got = malloc(n * sizeof *got), *ref = malloc(n * sizeof *ref);
    double *want = malloc(n * sizeof *want);
    cr_assert(got && ref && want);
    check_poison(got, n);
    check_poison(ref, n);
    OK(lm_program_read(pc, out[i], got, n));
    OK(lm_program_read(pr, out[i], ref, n));
    check_finite(out[i], ref, n);
    for (size_t k = 0; k < n; k++) want[k] = ref[k];
    check_close(out[i], got, want, n, RTOL, ATOL);
    free(got);
    free(ref);
    free(want);
  }
  lm_program_stats s;
  OK(lm_program_get_stats(pc, &s));
  lm_program_free(pc);
  lm_program_free(pr);
  lm_backend_free(bc);
  lm_backend_free(br);
  return s;
}

/* ================================================================ kernel counts */

Test(schedule, sin_exp2_mul_add_chain_is_one_kernel_without_temporaries) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 4});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 2, (lm_dim[]){N, 4});
  lm_tensor z = lm_input(g, "z", LM_ROLE_DATA, 1, (lm_dim[]){4});
  OK(lm_output(lm_add(lm_mul(lm_exp2(lm_sin(x)), y), z), "out"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 1, "sin-exp2-mul-add");
  cr_assert_eq(temps(&l), 0, "no intermediate buffer expected:\n%s", l.text);
  lowered_free(&l);
  lm_program_stats s = run_both(g, 37, (feed[]){{"x", -3, 3}, {"y", -2, 2}, {"z", -1, 1}}, 3,
                                (const char *[]){"out"}, 1);
  cr_assert_eq(s.kernels, 1);
  cr_assert_eq(s.arena_bytes, 0, "arena %zu bytes for a fused chain", s.arena_bytes);
  cr_assert_eq(s.temp_bytes, 0);
  lm_graph_free(g);
}

Test(schedule, softmax_over_rows_is_at_most_two_kernels) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 10});
  OK(lm_output(lm_softmax(x, 1), "p"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 2, "softmax");
  lowered_free(&l);
  lm_program_stats s = run_both(g, 13, (feed[]){{"x", -4, 4}}, 1, (const char *[]){"p"}, 1);
  cr_assert(s.kernels >= 1 && s.kernels <= 2);
  lm_graph_free(g);
}

Test(schedule, log_softmax_over_rows_is_at_most_two_kernels) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 6});
  OK(lm_output(lm_log_softmax(x, -1), "lp"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 2, "log-softmax");
  lowered_free(&l);
  run_both(g, 9, (feed[]){{"x", -4, 4}}, 1, (const char *[]){"lp"}, 1);
  lm_graph_free(g);
}

Test(schedule, reduction_broadcast_back_x_minus_mean_is_one_kernel) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 10});
  OK(lm_output(lm_sub(x, lm_mean(x, 1, 1)), "c"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 1, "x - mean(x)");
  cr_assert_eq(temps(&l), 0, "the row mean must live in a register:\n%s", l.text);
  lowered_free(&l);
  lm_program_stats s = run_both(g, 11, (feed[]){{"x", -5, 5}}, 1, (const char *[]){"c"}, 1);
  cr_assert_eq(s.kernels, 1);
  cr_assert_eq(s.arena_bytes, 0);
  lm_graph_free(g);
}

static lm_graph_t *mlp_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 4});
  lm_tensor w1 = lm_input(g, "W1", LM_ROLE_PARAM, 2, (lm_dim[]){4, 16});
  lm_tensor b1 = lm_input(g, "b1", LM_ROLE_PARAM, 1, (lm_dim[]){16});
  lm_tensor w2 = lm_input(g, "W2", LM_ROLE_PARAM, 2, (lm_dim[]){16, 3});
  lm_tensor b2 = lm_input(g, "b2", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor h = lm_tanh(lm_add(lm_matmul(x, w1), b1));
  OK(lm_output(lm_tanh(lm_add(lm_matmul(h, w2), b2)), "y"));
  return g;
}

Test(schedule, two_layer_mlp_forward_is_at_most_one_kernel_per_layer) {
  lm_graph_t *g = mlp_graph();
  lowered l = lower(g);
  expect_kernels(&l, 1, 2, "2-layer MLP");
  cr_assert_leq(temps(&l), 1, "at most the hidden activations are a temporary:\n%s", l.text);
  lowered_free(&l);
  lm_program_stats s = run_both(g, 21,
                                (feed[]){{"x", -1, 1}, {"W1", -0.5, 0.5}, {"b1", -0.2, 0.2}, {"W2", -0.5, 0.5},
                                         {"b2", -0.2, 0.2}},
                                5, (const char *[]){"y"}, 1);
  cr_assert_leq(s.kernels, 2);
  lm_graph_free(g);
}

Test(schedule, elementwise_node_shared_by_two_outputs_is_computed_once_in_one_kernel) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 4});
  lm_tensor e = lm_exp2(lm_sin(x));
  OK(lm_output(lm_mul_scalar(e, 2.0f), "o1"));
  OK(lm_output(lm_add_scalar(e, 1.0f), "o2"));
  lowered l = lower(g);
  /* One kernel per output; the cheap shared node is evaluated in both rather than stored. */
  expect_kernels(&l, 2, 2, "shared elementwise node");
  cr_assert_eq(temps(&l), 0, "a shared elementwise node needs no buffer:\n%s", l.text);
  lowered_free(&l);
  lm_program_stats s = run_both(g, 70, (feed[]){{"x", -3, 3}}, 1, (const char *[]){"o1", "o2"}, 2);
  /* the compile front then fuses the two output kernels (same domain, independent) into one,
   * where the shared sin and exp2 are computed once */
  cr_assert_eq(s.kernels, 1);
  cr_assert_eq(s.arena_bytes, 0);
  lm_graph_free(g);
}

Test(schedule, a_reduction_shared_by_two_consumers_is_stored_once) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 8});
  lm_tensor m = lm_sum_reduce(x, 1);
  OK(lm_output(lm_sin(m), "a"));
  OK(lm_output(lm_mul(m, m), "b"));
  lowered l = lower(g);
  expect_kernels(&l, 2, 3, "shared reduction");
  int reductions = 0;
  for (const char *s = l.text; (s = strstr(s, "acc_sum")); s++) reductions++;
  cr_assert_eq(reductions, 1, "the shared sum must be computed once:\n%s", l.text);
  lowered_free(&l);
  run_both(g, 5, (feed[]){{"x", -2, 2}}, 1, (const char *[]){"a", "b"}, 2);
  lm_graph_free(g);
}

/* ================================================================ hoisting */

/* Indentation depth of a plan-text line (lm_plan_dump indents 2 spaces per level). */
static int depth_of(const char *line) {
  int n = 0;
  while (line[n] == ' ') n++;
  return n / 2;
}

Test(schedule, matmul_bias_kernel_loads_the_bias_outside_the_reduction_loop) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 5});
  lm_tensor w = lm_input(g, "W", LM_ROLE_PARAM, 2, (lm_dim[]){5, 7});
  lm_tensor b = lm_input(g, "b", LM_ROLE_PARAM, 1, (lm_dim[]){7});
  OK(lm_output(lm_add(lm_matmul(x, w), b), "y"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 1, "matmul + bias");
  char bias[32], weight[32];
  snprintf(bias, sizeof bias, "load b%u[", input_buf(&l, "b"));
  snprintf(weight, sizeof weight, "load b%u[", input_buf(&l, "W"));
  /* walk the text: track the open serial loop's depth */
  int for_depth = -1, bias_depth = -1, bias_in_for = 0, weight_in_for = 0, fors = 0;
  char *text = strdup(l.text);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    int d = depth_of(line);
    if (for_depth >= 0 && d <= for_depth) for_depth = -1;
    if (strstr(line, "for i")) for_depth = d, fors++;
    if (strstr(line, bias)) bias_depth = d, bias_in_for = for_depth >= 0;
    if (strstr(line, weight)) weight_in_for = for_depth >= 0;
  }
  free(text);
  cr_assert_eq(fors, 1, "one reduction loop expected:\n%s", l.text);
  cr_assert(bias_depth >= 0, "no load of the bias:\n%s", l.text);
  cr_assert(!bias_in_for, "the bias load sits inside the reduction loop:\n%s", l.text);
  cr_assert(weight_in_for, "the weight load must be inside the reduction loop:\n%s", l.text);
  lowered_free(&l);
  run_both(g, 19, (feed[]){{"x", -1, 1}, {"W", -1, 1}, {"b", -1, 1}}, 3, (const char *[]){"y"}, 1);
  lm_graph_free(g);
}

/* y = concat(2 x, sum(x) repeated 3 times) over rows of x [N, 6]: the row's sum is read in the
 * pad's window of each row, under a guard on the column that its own index does not use. It is
 * computed once per row, outside the loop over the row's 9 columns (compiler/lower.c evaluates
 * a value unguarded when the guard names none of its index's variables), not once per column;
 * the values are ref's. */
Test(schedule, a_row_value_padded_across_the_rows_columns_is_computed_once_per_row) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 6});
  OK(lm_output(lm_concat(lm_mul_scalar(x, 2.0f), lm_expand(lm_sum(x, 1, 0), 1, 3), 1), "y"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 1, "a row and its sum");
  int col_depth = -1, sum_depth = -1, sums = 0;
  char *text = strdup(l.text);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    if (strstr(line, "par i") && strstr(line, "< 9")) col_depth = depth_of(line);
    if (strstr(line, "for i") && strstr(line, "< 6")) sum_depth = depth_of(line), sums++;
  }
  free(text);
  cr_assert(col_depth >= 0 && sum_depth >= 0, "no column loop or no sum loop:\n%s", l.text);
  cr_assert_eq(sums, 1, "the sum is taken %d times:\n%s", sums, l.text);
  cr_assert_eq(sum_depth, col_depth, "the row's sum sits inside the loop over its columns:\n%s", l.text);
  lowered_free(&l);
  run_both(g, 19, (feed[]){{"x", -1, 1}}, 1, (const char *[]){"y"}, 1);
  lm_graph_free(g);
}

/* A sum over the batch per output (a bias gradient: [N, 64] -> [64]) and the value head's
 * weight gradient (x^T dy: [N, 64] x [N, 1] -> [64, 1], with a parallel loop of extent 1) have
 * one parallel loop of 64 outputs: the cpu schedule splits it 8 x 8 and moves the inner 8 inside
 * the reduction (compiler/schedule.c, split_par), so eight sums run side by side in a vector.
 * Each output still adds its terms in batch order: cpu gives ref's bits. */
Test(schedule, sums_over_the_batch_run_eight_outputs_side_by_side_with_refs_bits) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor dy = lm_input(g, "dy", LM_ROLE_DATA, 2, (lm_dim[]){N, 64});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 64});
  lm_tensor d1 = lm_input(g, "d1", LM_ROLE_DATA, 2, (lm_dim[]){N, 1});
  OK(lm_output(lm_sum(dy, 0, 0), "b"));
  OK(lm_output(lm_matmul(lm_transpose(x, 0, 1), d1), "w"));
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  for (size_t k = 0; k < comp.plan->nkernels; k++) {
    const lm_kernel *kn = &comp.plan->kernels[k];
    const lm_xnode *e = lm_x_node(&comp.g->x, kn->loops[0].extent);
    cr_assert(kn->npar == 1 && e->op == LM_X_CONST && e->v == 8 && kn->nlocals >= 1 && kn->locals[0] == 8,
              "kernel %s: %d parallel loops, the first of extent %lld, %zu local arrays", kn->name, kn->npar,
              (long long)e->v, kn->nlocals);
  }
  lm_compiled_free(&comp);
  const int64_t n = 517;
  lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
  cr_assert(bc && br, "%s", lm_last_error());
  lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
  cr_assert(pc && pr, "%s", lm_last_error());
  check_rng r = check_rng_new(41);
  const struct { const char *name; size_t count; } in[] = {{"dy", n * 64}, {"x", n * 64}, {"d1", n}};
  for (size_t i = 0; i < 3; i++) {
    float *v = malloc(in[i].count * sizeof *v);
    cr_assert(v);
    check_fill(&r, v, in[i].count, -1, 1, 0.01);
    for (int b = 0; b < 2; b++) {
      lm_program_t *p = b ? pr : pc;
      OK(lm_program_bind(p, "N", n));
      OK(lm_program_write(p, in[i].name, v, in[i].count));
    }
    free(v);
  }
  OK(lm_program_run(pc));
  OK(lm_program_run(pr));
  float got[64], want[64];
  for (int o = 0; o < 2; o++) {
    const char *name = o ? "w" : "b";
    OK(lm_program_read(pc, name, got, 64));
    OK(lm_program_read(pr, name, want, 64));
    for (int i = 0; i < 64; i++)
      cr_assert(!memcmp(&got[i], &want[i], sizeof got[i]), "%s[%d] = %a on cpu, %a on ref", name, i, (double)got[i],
                (double)want[i]);
  }
  lm_program_free(pc);
  lm_program_free(pr);
  lm_backend_free(bc);
  lm_backend_free(br);
  lm_graph_free(g);
}

/* 1 when e holds a floor division or modulo by the constant d. */
static int divides_by(const lm_exprs *x, lm_expr e, int64_t d) {
  const lm_xnode *nd = lm_x_node(x, e);
  if (nd->op == LM_X_CONST || nd->op == LM_X_VAR || nd->op == LM_X_SYM) return 0;
  if ((nd->op == LM_X_DIV || nd->op == LM_X_MOD) && lm_x_is_const(x, nd->b, d)) return 1;
  return divides_by(x, nd->a, d) || divides_by(x, nd->b, d);
}

/* MinAtar's network, cut down: conv 3x3 (4 -> 16 channels, SAME padding) on a 10x10 image,
 * relu, flatten, dense 1600 -> 8, and the gradients of a sum of squares. The convolution's
 * weight gradient sums over batch, rows and columns: three nested sums, through which the
 * interchange moves the output channels until they are innermost (three arrays of 16
 * accumulators); the dense layer's input gradient, [N, 10, 10, 16], is one axis of 1600 that
 * reads the weights by columns from a staged copy; the padded image's index needs no modulo
 * by the image size where the padding guard holds; the forward sum over the flattened window
 * is split back into its 3 x 3 x 4 loops. Every element sums in the ref's order:
 * the same bits. */
Test(schedule, conv_gradients_interchange_through_nested_sums_with_refs_bits) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 4, (lm_dim[]){N, 10, 10, 4});
  lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){36, 16});
  lm_tensor w2 = lm_input(g, "w2", LM_ROLE_DATA, 2, (lm_dim[]){1600, 8});
  lm_tensor h = lm_reshape(lm_relu(lm_conv2d(x, w, 3, 3)), 2, (lm_dim[]){N, 1600});
  lm_tensor y = lm_matmul(h, w2);
  lm_tensor loss = lm_sum(lm_sum(lm_mul(y, y), 1, 0), 0, 0);
  lm_tensor grads[2];
  OK(lm_grad(loss, (lm_tensor[]){w, w2}, 2, grads));
  OK(lm_output(grads[0], "dw"));
  OK(lm_output(grads[1], "dw2"));
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  int nested = 0, staged = 0, xloads = 0, unsplit = 0;
  uint32_t xb = UINT32_MAX;
  for (size_t b = 0; b < comp.plan->nbufs; b++)
    if (comp.plan->bufs[b].kind == LM_BUF_INPUT && !strcmp(comp.g->inputs[comp.plan->bufs[b].index].name, "x"))
      xb = (uint32_t)b;
  cr_assert(xb != UINT32_MAX, "x has no plan buffer");
  for (size_t k = 0; k < comp.plan->nkernels; k++) {
    const lm_kernel *kn = &comp.plan->kernels[k];
    int sixteen = 0;
    for (size_t l = 0; l < kn->nlocals; l++) {
      sixteen += kn->locals[l] == 16;
      staged += kn->locals[l] == 1600 * 8;
    }
    nested += sixteen >= 3;
    for (size_t i = 0; i < kn->nstmts; i++) {
      const lm_stmt *st = &kn->stmts[i];
      if (st->op == LM_S_LOAD && !st->local && st->buf == xb) {
        cr_assert(!divides_by(&comp.g->x, st->idx, 400), "kernel %s reads x with an index modulo 400", kn->name);
        unsplit += divides_by(&comp.g->x, st->idx, 12) || divides_by(&comp.g->x, st->idx, 4);
        xloads++;
      }
    }
  }
  cr_assert(nested >= 1, "no kernel keeps three levels of 16 accumulators (the weight gradient)");
  cr_assert(staged >= 1, "no kernel stages the dense weights [1600, 8] by columns");
  /* the forward convolution's sum over the window's 36 rows runs as 3 x 3 x 4 loops: no
   * division left in its index (the weight gradient's window rows are its parallel axis) */
  cr_assert(xloads > unsplit, "every load of x divides its loop variable by 12 or 4 (%d loads)", xloads);
  lm_compiled_free(&comp);
  const int64_t n = 6;
  lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
  cr_assert(bc && br, "%s", lm_last_error());
  lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
  cr_assert(pc && pr, "%s", lm_last_error());
  check_rng r = check_rng_new(7);
  const struct { const char *name; size_t count; } in[] = {{"x", n * 400}, {"w", 36 * 16}, {"w2", 1600 * 8}};
  for (size_t i = 0; i < 3; i++) {
    float *v = malloc(in[i].count * sizeof *v);
    cr_assert(v);
    check_fill(&r, v, in[i].count, -1, 1, 0.01);
    for (int b = 0; b < 2; b++) {
      lm_program_t *p = b ? pr : pc;
      OK(lm_program_bind(p, "N", n));
      OK(lm_program_write(p, in[i].name, v, in[i].count));
    }
    free(v);
  }
  OK(lm_program_run(pc));
  OK(lm_program_run(pr));
  const struct { const char *name; size_t count; } out[] = {{"dw", 36 * 16}, {"dw2", 1600 * 8}};
  for (int o = 0; o < 2; o++) {
    float *got = malloc(out[o].count * sizeof *got), *want = malloc(out[o].count * sizeof *want);
    cr_assert(got && want);
    OK(lm_program_read(pc, out[o].name, got, out[o].count));
    OK(lm_program_read(pr, out[o].name, want, out[o].count));
    check_same_bits(out[o].name, got, want, out[o].count);
    free(got);
    free(want);
  }
  lm_program_free(pc);
  lm_program_free(pr);
  lm_backend_free(bc);
  lm_backend_free(br);
  lm_graph_free(g);
}

/* MinAtar's network and its gradients over C channels: a 3x3 convolution of 16 filters, relu, a
 * dense layer of 128 (relu), a head of 4. */
static lm_graph_t *cnn_grad_graph(int64_t C) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 4, (lm_dim[]){N, 10, 10, C});
  lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){9 * C, 16});
  lm_tensor w2 = lm_input(g, "w2", LM_ROLE_DATA, 2, (lm_dim[]){1600, 128});
  lm_tensor w3 = lm_input(g, "w3", LM_ROLE_DATA, 2, (lm_dim[]){128, 4});
  lm_tensor h = lm_reshape(lm_relu(lm_conv2d(x, w, 3, 3)), 2, (lm_dim[]){N, 1600});
  lm_tensor y = lm_matmul(lm_relu(lm_matmul(h, w2)), w3);
  lm_tensor loss = lm_sum(lm_sum(lm_mul(y, y), 1, 0), 0, 0);
  lm_tensor grads[3];
  OK(lm_grad(loss, (lm_tensor[]){w, w2, w3}, 3, grads));
  OK(lm_output(y, "y"));
  OK(lm_output(grads[0], "dw"));
  OK(lm_output(grads[1], "dw2"));
  OK(lm_output(grads[2], "dw3"));
  return g;
}

/* Local arrays of 16 or 64 floats in the cpu's plan of g: a tile's row of accumulators (the
 * convolution's 16 filters, a dense layer's tile: 16 wide, 64 with AVX-512, compiler/jam.c). */
static int tile_rows(const lm_graph_t *g) {
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  int n = 0;
  for (size_t k = 0; k < comp.plan->nkernels; k++)
    for (size_t l = 0; l < comp.plan->kernels[k].nlocals; l++)
      n += comp.plan->kernels[k].locals[l] == 16 || comp.plan->kernels[k].locals[l] == 64;
  lm_compiled_free(&comp);
  return n;
}

/* The steps, over the loop variables, of the loads of local arrays of `floats` floats in the
 * cpu's plan of g, as a bit set of the steps 16, 64 and 1600 (1, 2, 4): the staged [1600, 128]
 * weight of the dense layer's input gradient (compiler/schedule.c) is read down its columns, a
 * step of 1600 floats per output laid out [k][p], of a tile's width (16 or 64) laid out
 * tile-major (compiler/jam.c). */
static int staged_steps(lm_graph_t *g, int64_t floats) {
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  int seen = 0;
  for (size_t k = 0; k < comp.plan->nkernels; k++) {
    const lm_kernel *kn = &comp.plan->kernels[k];
    for (size_t i = 0; i < kn->nstmts; i++) {
      const lm_stmt *s = &kn->stmts[i];
      if (s->op != LM_S_LOAD || !s->local || kn->locals[s->buf] != floats) continue;
      for (int v = 0; v < (int)kn->nloops; v++) {
        int64_t d = 0;
        if (lm_x_step(&comp.g->x, s->idx, v, (int)kn->nloops, &d)) seen |= (d == 16) | (d == 64) << 1 | (d == 1600) << 2;
      }
    }
  }
  lm_compiled_free(&comp);
  return seen;
}

/* Jamming runs four rows of a kernel at a time, or more where the points keep few accumulators
 * (the convolution's weight gradient: 12 of Breakout's 36 taps (4 channels), 6 of Space
 * Invaders' 54 (6)), the dense layers' 128 outputs in tiles (of 16 or 64): more accumulator rows, and
 * not a bit of any result changes, for a batch that 4 divides (full blocks only) and one it does
 * not (the guarded tail), against the reference and against the cpu without the pass. */
static void jam_keeps_bits(int64_t C) {
  lm_graph_t *g = cnn_grad_graph(C);
  setenv("LUMEN_NO_JAM", "1", 1);
  int plain = tile_rows(g);
  lm_backend_t *bp = lm_backend_new("cpu");
  lm_program_t *pp = bp ? lm_program_new(bp, g) : NULL;
  unsetenv("LUMEN_NO_JAM");
  int jammed = tile_rows(g);
  cr_log_info("%lld channels: local rows of 16 or 64 floats: %d plain, %d jammed", (long long)C, plain, jammed);
  cr_assert_geq(jammed, plain + 3 * 4, "jammed: %d rows of 16 or 64 floats, plain %d", jammed, plain);
  int steps = staged_steps(g, 1600 * 128);
  cr_assert(steps && steps < 4, "the staged [1600, 128] operand's loads step by%s%s%s floats, not only by a tile's width "
            "(16 or 64): not tile-major", steps & 1 ? " 16" : "", steps & 2 ? " 64" : "", steps & 4 ? " 1600" : "");
  lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
  cr_assert(bp && bc && br, "%s", lm_last_error());
  lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
  cr_assert(pp && pc && pr, "%s", lm_last_error());
  const size_t taps = (size_t)(9 * C);
  const struct { const char *name; size_t count; } in[] = {{"w", taps * 16}, {"w2", 1600 * 128}, {"w3", 128 * 4}, {"x", 0}};
  const struct { const char *name; size_t count; } out[] = {{"y", 0}, {"dw", taps * 16}, {"dw2", 1600 * 128}, {"dw3", 128 * 4}};
  for (int64_t n = 7; n <= 8; n++) {
    check_rng r = check_rng_new((uint64_t)n);
    lm_program_t *ps[3] = {pc, pp, pr};
    for (size_t i = 0; i < 4; i++) {
      size_t count = in[i].count ? in[i].count : (size_t)n * 100 * (size_t)C;
      float *v = malloc(count * sizeof *v);
      cr_assert(v);
      check_fill(&r, v, count, -1, 1, 0.01);
      for (int b = 0; b < 3; b++) {
        OK(lm_program_bind(ps[b], "N", n));
        OK(lm_program_write(ps[b], in[i].name, v, count));
      }
      free(v);
    }
    for (int b = 0; b < 3; b++) OK(lm_program_run(ps[b]));
    for (int o = 0; o < 4; o++) {
      size_t count = out[o].count ? out[o].count : (size_t)n * 4;
      float *got = malloc(count * sizeof *got), *was = malloc(count * sizeof *was), *want = malloc(count * sizeof *want);
      cr_assert(got && was && want);
      OK(lm_program_read(pc, out[o].name, got, count));
      OK(lm_program_read(pp, out[o].name, was, count));
      OK(lm_program_read(pr, out[o].name, want, count));
      check_same_bits(out[o].name, got, want, count);
      check_same_bits(out[o].name, was, want, count);
      free(got);
      free(was);
      free(want);
    }
  }
  lm_program_free(pc);
  lm_program_free(pp);
  lm_program_free(pr);
  lm_backend_free(bc);
  lm_backend_free(bp);
  lm_backend_free(br);
  lm_graph_free(g);
}

Test(schedule, jammed_rows_and_tiled_outputs_keep_the_bits_of_the_reference) {
  jam_keeps_bits(4);
  jam_keeps_bits(6);
}

/* Two layers over the same rows in one kernel, 4 -> 2 and 4 -> 256 (a policy's logits beside a
 * wide first layer): the 256 outputs, 4 rows of them, overflow the registers on any x86 and run
 * in tiles (of 16, or 64 with AVX-512), while the 2 logits, which fit 4 rows over, run once
 * beside the tiles, not again in every tile. The same bits as the reference and as the
 * kernel not jammed, for 7 rows (a guarded tail) and 8. */
Test(schedule, narrow_outputs_beside_tiled_ones_run_once_outside_the_tiles) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 4});
  lm_tensor w1 = lm_input(g, "w1", LM_ROLE_DATA, 2, (lm_dim[]){4, 2});
  lm_tensor w2 = lm_input(g, "w2", LM_ROLE_DATA, 2, (lm_dim[]){4, 256});
  OK(lm_output(lm_matmul(x, w1), "a"));
  OK(lm_output(lm_matmul(x, w2), "b"));
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  int both = 0;
  for (size_t k = 0; k < comp.plan->nkernels; k++) {
    const lm_kernel *kn = &comp.plan->kernels[k];
    int rows = 0, narrow = 0;
    for (size_t l = 0; l < kn->nlocals; l++) {
      rows += kn->locals[l] == 16 || kn->locals[l] == 64;
      narrow += kn->locals[l] == 2;
    }
    int tiles = 0; /* a loop over 256 / 16 (or 256 / 64) tiles, its loops 16 (or 64) long */
    for (size_t l = 1; l < kn->nloops; l++) {
      const lm_loop *lp = &kn->loops[l];
      const lm_xnode *e = lm_x_node(&comp.plan->g->x, lp->extent);
      if (lp->parent || e->op != LM_X_CONST || !lp->body.n || !lp->body.items[0].is_loop) continue;
      const lm_xnode *t = lm_x_node(&comp.plan->g->x, kn->loops[lp->body.items[0].id].extent);
      tiles += t->op == LM_X_CONST && (t->v == 16 || t->v == 64) && t->v * e->v == 256;
    }
    both += rows >= 4 && narrow >= 4 && tiles == 1;
  }
  lm_compiled_free(&comp);
  cr_assert_eq(both, 1, "no kernel holds 4 tile rows and 4 rows of 2 logits beside one loop over the tiles");
  setenv("LUMEN_NO_JAM", "1", 1);
  lm_backend_t *bp = lm_backend_new("cpu");
  lm_program_t *pp = bp ? lm_program_new(bp, g) : NULL;
  unsetenv("LUMEN_NO_JAM");
  lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
  cr_assert(bp && bc && br, "%s", lm_last_error());
  lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
  cr_assert(pp && pc && pr, "%s", lm_last_error());
  lm_program_t *ps[3] = {pc, pp, pr};
  for (int64_t n = 7; n <= 8; n++) {
    check_rng r = check_rng_new((uint64_t)n);
    const struct { const char *name; size_t count; } in[] = {{"x", (size_t)n * 4}, {"w1", 8}, {"w2", 1024}};
    for (size_t i = 0; i < 3; i++) {
      float v[1024];
      check_fill(&r, v, in[i].count, -1, 1, 0.01);
      for (int b = 0; b < 3; b++) {
        OK(lm_program_bind(ps[b], "N", n));
        OK(lm_program_write(ps[b], in[i].name, v, in[i].count));
      }
    }
    for (int b = 0; b < 3; b++) OK(lm_program_run(ps[b]));
    const struct { const char *name; size_t count; } out[] = {{"a", (size_t)n * 2}, {"b", (size_t)n * 256}};
    for (int o = 0; o < 2; o++) {
      float got[8 * 256], was[8 * 256], want[8 * 256];
      OK(lm_program_read(pc, out[o].name, got, out[o].count));
      OK(lm_program_read(pp, out[o].name, was, out[o].count));
      OK(lm_program_read(pr, out[o].name, want, out[o].count));
      check_same_bits(out[o].name, got, want, out[o].count);
      check_same_bits(out[o].name, was, want, out[o].count);
    }
  }
  for (int b = 0; b < 3; b++) lm_program_free(ps[b]);
  lm_backend_free(bc);
  lm_backend_free(bp);
  lm_backend_free(br);
  lm_graph_free(g);
}

/* The convolution's forward keeps 4 jammed rows of 16 filters in accumulator arrays inside its
 * reduction over the window: that point loop is rendered LM_NARROW (vectorised eight wide, so
 * clang keeps the accumulators in registers). The weight gradient's 12 rows of 16 would be 24
 * vectors of 8: left alone. Every narrowed loop runs 8 or 16 iterations. (The bits are
 * jam_keeps_bits' over the same graph.) */
Test(schedule, small_accumulating_point_loops_are_narrowed_for_the_c_compiler) {
  lm_graph_t *g = cnn_grad_graph(4);
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  setenv("LUMEN_NO_STACK", "1", 1); /* the forward and the weight gradient in kernels of their own */
  lm_status st = lm_compile_ex(g, NULL, &co, &comp);
  unsetenv("LUMEN_NO_STACK");
  OK(st);
  int narrowed_kernels = 0, wide_jams = 0;
  for (size_t k = 0; k < comp.plan->nkernels; k++) {
    const lm_kernel *kn = &comp.plan->kernels[k];
    char *src = lm_render_kernel(comp.plan, kn, LM_DIALECT_C);
    cr_assert(src, "%s", lm_last_error());
    int rows16 = 0;
    for (size_t l = 0; l < kn->nlocals; l++) rows16 += kn->locals[l] == 16;
    int n = 0;
    for (const char *at = strstr(src, "LM_NARROW\n"); at; at = strstr(at + 1, "LM_NARROW\n")) {
      long long ext = 0;
      const char *f = strstr(at, "for (");
      cr_assert(f && sscanf(strchr(f, '<') + 1, "%lld", &ext) == 1 && (ext == 8 || ext == 16),
                "kernel %s: LM_NARROW before a loop of %lld iterations", kn->name, ext);
      n++;
    }
    if (rows16 >= 24) { /* the weight gradient, jammed by 12 at two levels of its reduction */
      wide_jams++;
      cr_assert_eq(n, 0, "kernel %s (%d accumulator rows of 16): %d narrowed loops", kn->name, rows16, n);
    }
    narrowed_kernels += n > 0;
    lm_free(src);
  }
  cr_assert_geq(narrowed_kernels, 1, "no kernel narrowed its accumulating point loop (the convolution's forward)");
  /* jam.c's register_file: 12 rows where AVX-512's 32 registers hold them, 4 with AVX2's 16 */
  if (__builtin_cpu_supports("avx512f"))
    cr_assert_geq(wide_jams, 1, "no kernel keeps 12 jammed rows of 16 accumulators (the weight gradient)");
  lm_compiled_free(&comp);
  lm_graph_free(g);
}

/* ================================================================ memory planning */

Test(schedule, deep_materialised_chain_reuses_the_arena_and_matches_ref) {
  enum { STAGES = 12 };
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor y = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 64});
  /* CONTIGUOUS of a node seen as it is would be dropped by the canonicaliser: each stage is
   * materialised transposed ([N,64] and [64,N] alternate). */
  for (int s = 0; s < STAGES; s++) {
    if (s % 2 == 0) /* elementwise */
      y = lm_add_scalar(lm_mul_scalar(lm_sin(y), 0.75f), 0.125f * (float)s);
    else /* a reduction broadcast back */
      y = lm_sub(y, lm_max(y, 1, 1));
    y = lm_contiguous(lm_transpose(y, 0, 1));
  }
  OK(lm_output(lm_mul_scalar(y, 3.0f), "out"));
  lowered l = lower(g);
  cr_assert_geq(l.p->nkernels, STAGES, "every stage must be its own kernel:\n%s", l.text);
  cr_assert_geq(temps(&l), STAGES - 1);
  lowered_free(&l);
  int64_t n = 33;
  lm_program_stats s = run_both(g, n, (feed[]){{"x", -2, 2}}, 1, (const char *[]){"out"}, 1);
  size_t one = (size_t)n * 64 * sizeof(float);
  cr_assert_geq(s.temp_bytes, (STAGES - 1) * one, "temp_bytes %zu", s.temp_bytes);
  cr_assert(s.arena_bytes >= one, "arena %zu smaller than one stage", s.arena_bytes);
  cr_assert(s.arena_bytes * 3 <= s.temp_bytes, "arena %zu bytes is not far below the %zu bytes of temporaries",
            s.arena_bytes, s.temp_bytes);
  lm_graph_free(g);
}

/* Checks a placement: aligned, inside the arena, arena <= sum, no shared byte between buffers
 * alive in overlapping kernel ranges. */
static void check_placement(size_t n, const size_t *bytes, const int *first, const int *last, size_t align,
                            const size_t *off, size_t total, const char *what) {
  size_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (first[i] < 0 || !bytes[i]) continue;
    size_t need = (bytes[i] + align - 1) / align * align;
    sum += need;
    cr_assert_eq(off[i] % align, 0, "%s: buffer %zu at offset %zu, not %zu-aligned", what, i, off[i], align);
    cr_assert_leq(off[i] + bytes[i], total, "%s: buffer %zu [%zu, +%zu) ends past the arena (%zu)", what, i, off[i],
                  bytes[i], total);
  }
  cr_assert_leq(total, sum, "%s: arena %zu exceeds the sum of the buffers %zu", what, total, sum);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++) {
      if (first[i] < 0 || first[j] < 0 || !bytes[i] || !bytes[j]) continue;
      int live_together = !(last[i] < first[j] || last[j] < first[i]);
      int share = off[i] < off[j] + bytes[j] && off[j] < off[i] + bytes[i];
      cr_assert(!(live_together && share),
                "%s: buffers %zu (%zu bytes at %zu, live %d..%d) and %zu (%zu bytes at %zu, live %d..%d) overlap", what,
                i, bytes[i], off[i], first[i], last[i], j, bytes[j], off[j], first[j], last[j]);
    }
}

Test(memplan, random_interval_sets_never_share_bytes_between_live_buffers) {
  check_rng r = check_rng_new(0xa11ce);
  enum { MAXN = 48 };
  for (int trial = 0; trial < 2000; trial++) {
    size_t n = 1 + check_next(&r) % MAXN, bytes[MAXN], off[MAXN], total = 0;
    int first[MAXN], last[MAXN], kernels = 1 + (int)(check_next(&r) % 24);
    size_t align = (size_t)1 << (check_next(&r) % 8);
    for (size_t i = 0; i < n; i++) {
      first[i] = check_next(&r) % 10 == 0 ? -1 : (int)(check_next(&r) % (uint64_t)kernels);
      last[i] = first[i] < 0 ? -1 : first[i] + (int)(check_next(&r) % (uint64_t)(kernels - first[i] + 1));
      bytes[i] = check_next(&r) % 16 == 0 ? 0 : 1 + check_next(&r) % (check_next(&r) % 2 ? 64 : 5000);
      off[i] = (size_t)-1;
    }
    char what[64];
    snprintf(what, sizeof what, "trial %d (n %zu, align %zu)", trial, n, align);
    OK(lm_memplan(n, bytes, first, last, align, off, &total));
    check_placement(n, bytes, first, last, align, off, total, what);
  }
}

Test(memplan, a_chain_needs_two_buffers_and_touching_ranges_do_not_share) {
  /* buffer i is written by kernel i and read by kernel i + 1 */
  enum { N = 10 };
  size_t bytes[N], off[N], total = 0;
  int first[N], last[N];
  for (int i = 0; i < N; i++) bytes[i] = 1000, first[i] = i, last[i] = i + 1;
  OK(lm_memplan(N, bytes, first, last, 64, off, &total));
  check_placement(N, bytes, first, last, 64, off, total, "chain");
  cr_assert_eq(total, 2 * 1024, "a chain of 1000-byte buffers needs 2 x 1024 bytes, got %zu", total);
  /* every buffer alive at once: nothing can be shared */
  for (int i = 0; i < N; i++) first[i] = 0, last[i] = 5;
  OK(lm_memplan(N, bytes, first, last, 64, off, &total));
  check_placement(N, bytes, first, last, 64, off, total, "all live");
  cr_assert_eq(total, N * 1024);
  /* unused and empty buffers take nothing */
  for (int i = 0; i < N; i++) first[i] = i % 2 ? -1 : 0, last[i] = i % 2 ? -1 : 0, bytes[i] = i % 4 == 2 ? 0 : 8;
  OK(lm_memplan(N, bytes, first, last, 16, off, &total));
  check_placement(N, bytes, first, last, 16, off, total, "unused");
  cr_assert_eq(total, 3 * 16, "buffers 0, 4 and 8 take 16 bytes each, got %zu", total);
  OK(lm_memplan(0, bytes, first, last, 16, off, &total));
  cr_assert_eq(total, 0);
}

Test(memplan, a_freed_gap_is_reused_by_a_buffer_that_fits) {
  /* A (100 B) and B (100 B) live together; A dies; C (64 B) fits where A was. */
  size_t bytes[3] = {100, 100, 64}, off[3], total = 0;
  int first[3] = {0, 0, 2}, last[3] = {1, 3, 3};
  OK(lm_memplan(3, bytes, first, last, 64, off, &total));
  check_placement(3, bytes, first, last, 64, off, total, "gap");
  cr_assert_eq(total, 256, "C must reuse A's bytes: arena %zu", total);
}

/* ================================================================ lowering robustness */

/* One kernel whose first operand inlines many reductions (each a serial loop of the kernel)
 * and whose second operand is read through a view afterwards: the lowering must index the
 * second operand with the kernel's current loop extents (the extent table grows, and moves,
 * as reductions add loops). */
Test(schedule, operand_read_after_many_inlined_reductions_lowers_to_one_kernel_matching_ref) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 5});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 2, (lm_dim[]){6, N});
  lm_tensor a = lm_sum_reduce(x, 1);
  for (int k = 2; k <= 40; k++) a = lm_add(a, lm_sum_reduce(lm_mul_scalar(x, (float)k), 1));
  lm_tensor row = lm_reshape(lm_affine_mod(lm_slice(y, 0, 2, 3), 1, 3, 1), 1, (lm_dim[]){N});
  OK(lm_output(lm_add(a, row), "out"));
  lowered l = lower(g);
  expect_kernels(&l, 1, 1, "40 inlined sums + a viewed operand");
  lowered_free(&l);
  run_both(g, 7, (feed[]){{"x", -1, 1}, {"y", -1, 1}}, 2, (const char *[]){"out"}, 1);
  lm_graph_free(g);
}

Test(schedule, the_batched_cartpole_step_with_auto_reset_and_rand_is_one_kernel) {
  const lm_env_spec *env = lm_env_find("cartpole");
  cr_assert(env);
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor u = lm_rand(g, 1, &N);
  lm_tensor action = lm_lt(u, lm_scalar_like(u, 0.5f));
  lm_vec_step vs;
  OK(lm_env_vec_step(env, g, "env.", N, action, &vs));
  OK(lm_output(vs.obs, "obs"));
  OK(lm_output(vs.final_obs, "final_obs"));
  OK(lm_output(vs.reward, "reward"));
  OK(lm_output(vs.terminated, "terminated"));
  OK(lm_output(vs.truncated, "truncated"));
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "%s", lm_last_error());
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "N", 4096));
  lm_program_stats s;
  OK(lm_program_get_stats(p, &s));
  cr_assert_eq(s.kernels, 1, "the batched step took %d kernels", s.kernels);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* ================================================================ epilogues and one-thread joins */

/* A 2-layer tanh MLP's MSE loss, its gradient and Adam with global-norm clipping over a symbolic
 * batch: the update of a PPO minibatch in miniature. */
static lm_graph_t *mlp_update_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 4});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 2, (lm_dim[]){N, 3});
  lm_tensor w1 = lm_input(g, "W1", LM_ROLE_PARAM, 2, (lm_dim[]){4, 32});
  lm_tensor b1 = lm_input(g, "b1", LM_ROLE_PARAM, 1, (lm_dim[]){32});
  lm_tensor w2 = lm_input(g, "W2", LM_ROLE_PARAM, 2, (lm_dim[]){32, 32});
  lm_tensor b2 = lm_input(g, "b2", LM_ROLE_PARAM, 1, (lm_dim[]){32});
  lm_tensor w3 = lm_input(g, "W3", LM_ROLE_PARAM, 2, (lm_dim[]){32, 3});
  lm_tensor b3 = lm_input(g, "b3", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor h = lm_tanh(lm_add(lm_matmul(x, w1), b1));
  h = lm_tanh(lm_add(lm_matmul(h, w2), b2));
  lm_tensor loss = lm_loss_mse(lm_add(lm_matmul(h, w3), b3), y);
  lm_tensor ps[6] = {w1, b1, w2, b2, w3, b3}, gs[6];
  OK(lm_grad(loss, ps, 6, gs));
  lm_adam_cfg cfg = lm_optim_adam_defaults();
  cfg.max_grad_norm = 0.5f;
  lm_tensor norm;
  OK(lm_optim_adam(&cfg, ps, gs, 6, &norm));
  OK(lm_output(loss, "loss"));
  OK(lm_output(norm, "norm"));
  return g;
}

static const char *const update_state[] = {"loss", "norm", "W1", "b1", "W2", "b2", "W3", "b3"};
enum { UPDATE_STATE = sizeof update_state / sizeof *update_state };

/* Three update steps on cpu with the passes in `passes` (1: epilogues, 2: joins, 4: chains,
 * 8: stacks; the others off through their switches); every value read back. */
static float *run_updates(lm_backend_t *b, const lm_graph_t *g, int passes, int *kernels, size_t *total) {
  if (!(passes & 1)) setenv("LUMEN_NO_EPILOGUE", "1", 1);
  if (!(passes & 2)) setenv("LUMEN_NO_JOIN", "1", 1);
  if (!(passes & 4)) setenv("LUMEN_NO_CHAIN", "1", 1);
  if (!(passes & 8)) setenv("LUMEN_NO_STACK", "1", 1);
  lm_program_t *p = lm_program_new(b, g);
  unsetenv("LUMEN_NO_EPILOGUE");
  unsetenv("LUMEN_NO_JOIN");
  unsetenv("LUMEN_NO_CHAIN");
  unsetenv("LUMEN_NO_STACK");
  cr_assert(p, "%s", lm_last_error());
  OK(lm_program_bind(p, "N", 37));
  check_rng r = check_rng_new(0xe9110603);
  static const char *const in[] = {"x", "y", "W1", "b1", "W2", "b2", "W3", "b3"};
  for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
    size_t n = 0;
    OK(lm_program_numel(p, in[i], &n));
    float *v = malloc(n * sizeof *v);
    cr_assert(v);
    check_fill(&r, v, n, -0.7, 0.7, 0.01);
    OK(lm_program_write(p, in[i], v, n));
    free(v);
  }
  OK(lm_program_write(p, "lr", (float[]){1e-2f}, 1));
  for (int step = 0; step < 3; step++) OK(lm_program_run(p));
  lm_program_stats s;
  OK(lm_program_get_stats(p, &s));
  *kernels = s.kernels;
  size_t n[UPDATE_STATE], sum = 0;
  for (int i = 0; i < UPDATE_STATE; i++) {
    OK(lm_program_numel(p, update_state[i], &n[i]));
    sum += n[i];
  }
  float *all = malloc(sum * sizeof *all), *at = all;
  cr_assert(all);
  for (int i = 0; i < UPDATE_STATE; i++) {
    OK(lm_program_read(p, update_state[i], at, n[i]));
    at += n[i];
  }
  *total = sum;
  lm_program_free(p);
  return all;
}

/* Epilogues, joins, chains and stacks change which kernels run, not a bit of what they compute
 * (each pass alone and together); epilogues and joins cut the kernel count by more than a
 * third, chains cut it further, and stacks further still. N = 37: the jammed blocks of rows end
 * in a partial one. */
Test(schedule, update_epilogues_joins_chains_and_stacks_cut_kernels_with_the_same_bits) {
  lm_graph_t *g = mlp_update_graph();
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "%s", lm_last_error());
  static const int sets[] = {0, 1, 2, 3, 4, 7, 8, 15};
  enum { SETS = sizeof sets / sizeof *sets };
  int k[16] = {0};
  size_t n[16] = {0};
  float *v[16] = {0};
  for (int c = 0; c < SETS; c++) v[sets[c]] = run_updates(b, g, sets[c], &k[sets[c]], &n[sets[c]]);
  cr_log_info("MLP loss + gradient + clipped Adam: %d kernels plain, %d with epilogues, %d with joins, %d with both, "
              "%d with chains, %d with those three, %d with stacks, %d with all four",
              k[0], k[1], k[2], k[3], k[4], k[7], k[8], k[15]);
  for (int c = 1; c < SETS; c++) {
    int p = sets[c];
    cr_assert_eq(n[p], n[0]);
    for (size_t i = 0; i < n[0]; i++)
      cr_assert(!memcmp(&v[p][i], &v[0][i], sizeof(float)), "passes %d, value %zu: %.9g, plain %.9g", p, i,
                v[p][i], v[0][i]);
  }
  cr_assert_lt(k[1], k[0], "epilogues: %d kernels, plain %d", k[1], k[0]);
  cr_assert_lt(k[2], k[0], "joins: %d kernels, plain %d", k[2], k[0]);
  cr_assert_lt(3 * k[3], 2 * k[0], "both: %d kernels, plain %d", k[3], k[0]);
  cr_assert_lt(k[4], k[0], "chains: %d kernels, plain %d", k[4], k[0]);
  cr_assert_lt(k[7], k[3], "those three: %d kernels, epilogues and joins %d", k[7], k[3]);
  cr_assert_lt(k[8], k[0], "stacks: %d kernels, plain %d", k[8], k[0]);
  cr_assert_lt(k[15], k[7], "all four: %d kernels, without stacks %d", k[15], k[7]);
  for (int c = 0; c < SETS; c++) free(v[sets[c]]);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* Copies after the last kernel in g's cpu plan (LUMEN_NO_ASSIGN set when `off`). */
static size_t plan_copies(const lm_graph_t *g, int off) {
  if (off) setenv("LUMEN_NO_ASSIGN", "1", 1);
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  unsetenv("LUMEN_NO_ASSIGN");
  size_t n = comp.plan->ncopies;
  lm_compiled_free(&comp);
  return n;
}

/* Adam's new parameters, moments and step count are stored into the assigned inputs by the
 * kernel that computes them, each element after its own reads of the old value, and the copies
 * after the last kernel go (compiler/lower.c, lm_plan_assign_in_place): the same bits over three
 * steps as with the copies. A state whose new value reads another element of the old (s'[i] =
 * s[i]/2 + s[i+1]) keeps its copy, and matches the reference. */
Test(schedule, an_optimisers_updates_are_stored_in_place_with_the_same_bits) {
  lm_graph_t *g = mlp_update_graph();
  size_t with = plan_copies(g, 0), without = plan_copies(g, 1);
  cr_assert_eq(with, 0, "%zu copies left after the update's last kernel", with);
  cr_assert_geq(without, 13, "LUMEN_NO_ASSIGN=1: %zu copies (6 parameters, 12 moments, the step)", without);
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "%s", lm_last_error());
  int k[2];
  size_t n[2];
  float *v[2];
  v[0] = run_updates(b, g, 15, &k[0], &n[0]);
  setenv("LUMEN_NO_ASSIGN", "1", 1);
  v[1] = run_updates(b, g, 15, &k[1], &n[1]);
  unsetenv("LUMEN_NO_ASSIGN");
  cr_assert_eq(n[0], n[1]);
  for (size_t i = 0; i < n[0]; i++)
    cr_assert(!memcmp(&v[0][i], &v[1][i], sizeof(float)), "value %zu: %.9g in place, %.9g copied", i, v[0][i], v[1][i]);
  free(v[0]), free(v[1]);
  lm_backend_free(b);
  lm_graph_free(g);

  g = lm_graph_new();
  lm_tensor st = lm_input(g, "s", LM_ROLE_STATE, 1, (lm_dim[]){8});
  lm_tensor next = lm_add(lm_mul_scalar(st, 0.5f), lm_pad(lm_slice(st, 0, 1, 8), 0, 0, 1)); /* s/2 + s[i+1] */
  OK(lm_assign(st, next));
  OK(lm_output(lm_sum(st, 0, 0), "y"));
  cr_assert_eq(plan_copies(g, 0), 1, "a state read at other elements is stored in place");
  float got[2][8];
  for (int ref = 0; ref < 2; ref++) {
    lm_backend_t *be = lm_backend_new(ref ? "ref" : "cpu");
    cr_assert(be, "%s", lm_last_error());
    lm_program_t *p = lm_program_new(be, g);
    cr_assert(p, "%s", lm_last_error());
    OK(lm_program_write(p, "s", (float[]){1, -2, 3, -4, 0.5f, 0.25f, -1, 2}, 8));
    for (int step = 0; step < 3; step++) OK(lm_program_run(p));
    OK(lm_program_read(p, "s", got[ref], 8));
    lm_program_free(p);
    lm_backend_free(be);
  }
  double want[8];
  for (int i = 0; i < 8; i++) want[i] = got[1][i];
  check_close("the state with its copy", got[0], want, 8, 1e-5, 1e-5);
  lm_graph_free(g);
}

/* Two tanh layers over the rows of a symbolic batch; `shift`: the second reads the first's next
 * row (a view: rows 1..N, the last padded with zeros). */
static lm_graph_t *two_layers(int shift) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 8});
  lm_tensor w1 = lm_input(g, "W1", LM_ROLE_PARAM, 2, (lm_dim[]){8, 16});
  lm_tensor w2 = lm_input(g, "W2", LM_ROLE_PARAM, 2, (lm_dim[]){16, 16});
  lm_tensor h = lm_tanh(lm_matmul(x, w1));
  if (shift) h = lm_pad(lm_slice(h, 0, 1, N), 0, 0, 1);
  OK(lm_output(lm_tanh(lm_matmul(h, w2)), "y"));
  return g;
}

/* Kernels per run of g on cpu against ref, with chains on or off. */
static int chained_kernels(const lm_graph_t *g, int chain) {
  static const feed in[] = {{"x", -1, 1}, {"W1", -0.5, 0.5}, {"W2", -0.5, 0.5}};
  static const char *const out[] = {"y"};
  if (!chain) setenv("LUMEN_NO_CHAIN", "1", 1);
  lm_program_stats s = run_both(g, 37, in, 3, out, 1);
  unsetenv("LUMEN_NO_CHAIN");
  return s.kernels;
}

/* A layer reading the rows the layer before wrote in the same block of rows runs in that
 * layer's kernel; one reading the next row (written by the next block, perhaps on another
 * thread) does not. Both agree with the reference, N = 37 ending in a partial block. */
Test(schedule, a_layer_runs_inside_the_one_before_only_where_it_reads_its_own_rows) {
  lm_graph_t *g = two_layers(0), *s = two_layers(1);
  int own[2] = {chained_kernels(g, 0), chained_kernels(g, 1)};
  int next[2] = {chained_kernels(s, 0), chained_kernels(s, 1)};
  cr_log_info("two layers: %d kernels, %d chained; the next row: %d, %d", own[0], own[1], next[0], next[1]);
  cr_assert_eq(own[1], own[0] - 1, "own rows: %d kernels chained, %d without", own[1], own[0]);
  cr_assert_eq(next[1], next[0], "the next row: %d kernels chained, %d without", next[1], next[0]);
  lm_graph_free(g);
  lm_graph_free(s);
}

/* Sums over the batch of three shapes (8 columns, 3 columns, everything) and a row-wise
 * product (N rows: a member after it starts at a symbolic point): independent kernels over
 * different domains, stacked into one whose points test which member they run; the same values
 * as ref, N = 37. Without stacks they stay apart. */
static lm_graph_t *three_sums(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 8});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 2, (lm_dim[]){N, 3});
  OK(lm_output(lm_sum_reduce(x, 0), "sx"));
  OK(lm_output(lm_mul(lm_sin(y), y), "py"));
  OK(lm_output(lm_sum_reduce(lm_mul(y, y), 0), "sy"));
  OK(lm_output(lm_sum_reduce(lm_sum_reduce(x, 1), 0), "s"));
  return g;
}

Test(schedule, independent_sums_of_three_shapes_run_as_one_stacked_kernel_with_refs_values) {
  static const feed in[] = {{"x", -1, 1}, {"y", -1, 1}};
  static const char *const out[] = {"sx", "py", "sy", "s"};
  lm_graph_t *g = three_sums();
  lm_program_stats on = run_both(g, 37, in, 2, out, 4);
  setenv("LUMEN_NO_STACK", "1", 1);
  lm_program_stats off = run_both(g, 37, in, 2, out, 4);
  unsetenv("LUMEN_NO_STACK");
  cr_log_info("three sums: %d kernels stacked, %d apart", on.kernels, off.kernels);
  cr_assert_eq(on.kernels, 1, "stacked: %d kernels", on.kernels);
  cr_assert_geq(off.kernels, 2, "apart: %d kernels", off.kernels);
  lm_graph_free(g);
}

/* Contraction (lm_graph_set_contraction): the kernels of a graph that allows it are rendered
 * under the contraction pragmas (FMAs), those of one that does not are not, and both agree with the
 * reference: the plain one bit for bit, the contracted one within rounding. Contraction
 * survives canonicalisation and cloning. */
Test(schedule, a_graph_that_allows_contraction_renders_fmas_and_agrees_with_the_reference) {
  for (int on = 0; on < 2; on++) {
    lm_graph_t *g = lm_graph_new();
    lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){24, 64});
    lm_tensor w = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){64, 48});
    lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 1, (lm_dim[]){48});
    OK(lm_output(lm_add(lm_matmul(x, w), lm_expand(b, 0, 24)), "y"));
    lm_graph_set_contraction(g, on);
    lm_graph_t *c = lm_graph_clone(g);
    cr_assert(c);
    lm_compiled comp;
    lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
    OK(lm_compile_ex(c, NULL, &co, &comp));
    for (size_t k = 0; k < comp.plan->nkernels; k++)
      cr_assert_eq(comp.plan->kernels[k].contract, on, "kernel %zu: contract %d, graph %d", k,
                   comp.plan->kernels[k].contract, on);
    char *src = lm_render_plan(comp.plan, LM_DIALECT_C);
    cr_assert(src);
    int fma = strstr(src, "#pragma GCC optimize(\"fp-contract=fast\")") != NULL; /* around a contracted kernel */
    cr_assert_eq(fma, on, "the contraction pragmas are %s in the source", on ? "missing" : "present");
    lm_free(src);
    lm_compiled_free(&comp);
    lm_graph_free(c);

    lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
    cr_assert(bc && br, "%s", lm_last_error());
    lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
    cr_assert(pc && pr, "%s", lm_last_error());
    check_rng r = check_rng_new(7);
    const struct { const char *name; size_t n; } in[] = {{"x", 24 * 64}, {"w", 64 * 48}, {"b", 48}};
    for (int i = 0; i < 3; i++) {
      float v[64 * 48];
      check_fill(&r, v, in[i].n, -1, 1, 0.01);
      OK(lm_program_write(pc, in[i].name, v, in[i].n));
      OK(lm_program_write(pr, in[i].name, v, in[i].n));
    }
    OK(lm_program_run(pc));
    OK(lm_program_run(pr));
    float got[24 * 48], want[24 * 48];
    double wd[24 * 48];
    OK(lm_program_read(pc, "y", got, 24 * 48));
    OK(lm_program_read(pr, "y", want, 24 * 48));
    for (int i = 0; i < 24 * 48; i++) wd[i] = want[i];
    if (on) check_close("contracted", got, wd, 24 * 48, 1e-5, 1e-5);
    else check_same_bits("plain", got, want, 24 * 48);
    lm_program_free(pc);
    lm_program_free(pr);
    lm_backend_free(bc);
    lm_backend_free(br);
    lm_graph_free(g);
  }
}

/* Reductions that carry a few floats from one iteration to the next (a 64 -> 2 head over jammed
 * rows, a row's sum of squares) are printed under LM_REASSOC in a graph that allows
 * contraction, so that clang sums them in vector partial sums rather than waiting on each add
 * (render.c, latency_bound); no block under it touches a local array of more than 16 floats
 * (a 64-wide layer's register tile), and a plain graph has none. The contracted result agrees
 * with the reference within rounding and is the same bits on one thread and on three. */
static int reassoc_blocks(const char *src, int *wide) {
  int n = 0;
  *wide = 0;
  for (const char *at = strstr(src, "LM_REASSOC\n"); at; at = strstr(at + 1, "LM_REASSOC\n")) {
    if (at >= src + 8 && !strncmp(at - 8, "#define ", 8)) continue; /* the prelude's */
    n++;
    const char *open = at; /* the block it opens: from its '{' to the matching '}' */
    while (open > src && *open != '{') open--;
    int depth = 0;
    const char *end = open;
    for (; *end; end++) {
      depth += *end == '{';
      depth -= *end == '}';
      if (!depth) break;
    }
    for (const char *l = strstr(open, " l"); l && l < end; l = strstr(l + 1, " l")) {
      int id, used = 0;
      if (sscanf(l + 2, "%d[%n", &id, &used) != 1 || !used) continue;
      char decl[48];
      snprintf(decl, sizeof decl, "float l%d[", id);
      const char *d = strstr(src, decl);
      long long size = 0;
      cr_assert(d && sscanf(d + strlen(decl), "%lld", &size) == 1, "local l%d has no declaration", id);
      *wide += size > 16;
    }
  }
  return n;
}

/* g's program on the reference interpreter (t = 0), or on the cpu on 1 (t = 1) or 3 threads. */
static lm_program_t *ref_or_threads(lm_graph_t *g, int t, lm_backend_t **b) {
  if (t) setenv("LUMEN_THREADS", t == 1 ? "1" : "3", 1);
  *b = lm_backend_new(t ? "cpu" : "ref");
  unsetenv("LUMEN_THREADS");
  cr_assert(*b, "%s", lm_last_error());
  lm_program_t *p = lm_program_new(*b, g);
  cr_assert(p, "%s", lm_last_error());
  return p;
}

Test(schedule, narrow_reductions_of_a_contracting_graph_may_be_summed_in_another_order) {
  enum { ROWS = 37 };
  for (int on = 0; on < 2; on++) {
    lm_graph_t *g = lm_graph_new();
    lm_dim N = lm_sym(g, "N");
    lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 64});
    lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 2, (lm_dim[]){64, 64});
    lm_tensor v = lm_input(g, "v", LM_ROLE_PARAM, 2, (lm_dim[]){64, 2});
    lm_tensor h = lm_tanh(lm_matmul(x, w));
    OK(lm_output(lm_matmul(h, v), "y"));
    OK(lm_output(lm_sum(lm_mul(h, h), 1, 0), "sq"));
    lm_graph_set_contraction(g, on);
    lm_compiled comp;
    lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
    OK(lm_compile_ex(g, NULL, &co, &comp));
    char *src = lm_render_plan(comp.plan, LM_DIALECT_C);
    cr_assert(src, "%s", lm_last_error());
    int wide = 0, n = reassoc_blocks(src, &wide);
    if (on) cr_assert_geq(n, 2, "contracting: %d loops under LM_REASSOC (the head and the sum of squares):\n%s", n, src);
    else cr_assert_eq(n, 0, "plain: %d loops under LM_REASSOC", n);
    cr_assert_eq(wide, 0, "%d wide local arrays under LM_REASSOC:\n%s", wide, src);
    lm_free(src);
    lm_compiled_free(&comp);

    check_rng r = check_rng_new(5);
    float xv[ROWS * 64], wv[64 * 64], vv[64 * 2], out[3][ROWS * 3];
    double wd[ROWS * 3];
    check_fill(&r, xv, ROWS * 64, -1, 1, 0.01);
    check_fill(&r, wv, 64 * 64, -0.2, 0.2, 0.01);
    check_fill(&r, vv, 64 * 2, -0.5, 0.5, 0.01);
    for (int t = 0; t < 3; t++) { /* the ref, then the cpu on 1 and on 3 threads */
      lm_backend_t *b;
      lm_program_t *p = ref_or_threads(g, t, &b);
      OK(lm_program_bind(p, "N", ROWS));
      OK(lm_program_write(p, "x", xv, ROWS * 64));
      OK(lm_program_write(p, "w", wv, 64 * 64));
      OK(lm_program_write(p, "v", vv, 64 * 2));
      OK(lm_program_run(p));
      OK(lm_program_read(p, "y", out[t], ROWS * 2));
      OK(lm_program_read(p, "sq", out[t] + ROWS * 2, ROWS));
      lm_program_free(p);
      lm_backend_free(b);
    }
    for (int i = 0; i < ROWS * 3; i++) wd[i] = out[0][i];
    check_close(on ? "contracted" : "plain", out[1], wd, ROWS * 3, 1e-5, 1e-5);
    check_same_bits("1 thread against 3", out[1], out[2], ROWS * 3);
    lm_graph_free(g);
  }
}

/* A dense tanh layer's kernel (its tanh an exp2 and a 1/x) is jammed, rows four or more at a
 * time, only where the graph allows contraction: there exp2 is the inline polynomial and 1/x a
 * division, the same bits per element in any vector form (compiler/jam.c); elsewhere clang
 * would vectorise the copies' exp2 through libmvec. The cpu's result agrees with the
 * reference either way (within the polynomial's error where it is jammed). */
Test(schedule, a_tanh_layer_is_jammed_only_where_the_graph_allows_contraction) {
  for (int on = 0; on < 2; on++) {
    lm_graph_t *g = lm_graph_new();
    lm_dim N = lm_sym(g, "N");
    lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 64});
    lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 2, (lm_dim[]){64, 64});
    OK(lm_output(lm_tanh(lm_matmul(x, w)), "y"));
    lm_graph_set_contraction(g, on);
    lm_compiled comp;
    lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
    OK(lm_compile_ex(g, NULL, &co, &comp));
    int exps = 0;
    for (size_t k = 0; k < comp.plan->nkernels; k++)
      for (size_t i = 0; i < comp.plan->kernels[k].nstmts; i++) exps += comp.plan->kernels[k].stmts[i].op == LM_S_EXP2;
    if (on) cr_assert_geq(exps, 4, "contracting: %d exp2 statements, not a copy per jammed row", exps);
    else cr_assert_eq(exps, 1, "plain: %d exp2 statements, the layer jammed", exps);
    lm_compiled_free(&comp);

    lm_backend_t *bc = lm_backend_new("cpu"), *br = lm_backend_new("ref");
    cr_assert(bc && br, "%s", lm_last_error());
    lm_program_t *pc = lm_program_new(bc, g), *pr = lm_program_new(br, g);
    cr_assert(pc && pr, "%s", lm_last_error());
    enum { ROWS = 37 }; /* not a multiple of the jam: the guarded rows too */
    OK(lm_program_bind(pc, "N", ROWS));
    OK(lm_program_bind(pr, "N", ROWS));
    check_rng r = check_rng_new(11);
    float xv[ROWS * 64], wv[64 * 64], got[ROWS * 64], want[ROWS * 64];
    double wd[ROWS * 64];
    check_fill(&r, xv, ROWS * 64, -1, 1, 0.01);
    check_fill(&r, wv, 64 * 64, -0.2, 0.2, 0.01);
    OK(lm_program_write(pc, "x", xv, ROWS * 64));
    OK(lm_program_write(pr, "x", xv, ROWS * 64));
    OK(lm_program_write(pc, "w", wv, 64 * 64));
    OK(lm_program_write(pr, "w", wv, 64 * 64));
    OK(lm_program_run(pc));
    OK(lm_program_run(pr));
    OK(lm_program_read(pc, "y", got, ROWS * 64));
    OK(lm_program_read(pr, "y", want, ROWS * 64));
    for (int i = 0; i < ROWS * 64; i++) wd[i] = want[i];
    check_close(on ? "jammed, contracted" : "plain", got, wd, ROWS * 64, 1e-5, 1e-5);
    lm_program_free(pc);
    lm_program_free(pr);
    lm_backend_free(bc);
    lm_backend_free(br);
    lm_graph_free(g);
  }
}

/* A kernel whose stores are all sums over the batch's rows (here a weight's and a bias's
 * gradients, stacked into one) runs in two halves of the rows where the graph allows
 * reassociation, each half into its own part of the buffers, and the clipping's norm and the
 * update read the parts' sum (compiler/partial.c): each core then sums the rows it wrote. An
 * odd number of rows leaves the second half one row short, masked. The result agrees with the
 * reference within rounding, and is the same bits on one thread and on three; a plain graph
 * keeps one pass over the rows, and so does a sum that is a graph output (nothing would add
 * its parts). */
static char *partial_plan(lm_graph_t *g) {
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  lm_sb sb = {0};
  lm_plan_dump(comp.plan, &sb);
  lm_compiled_free(&comp);
  return lm_sb_take(&sb);
}

Test(schedule, sums_over_the_rows_run_in_two_halves_whose_readers_add_them) {
  for (int on = 0; on < 2; on++)
    for (int rows = 37; rows <= 40; rows += 3) {
      lm_graph_t *g = lm_graph_new();
      lm_dim N = lm_sym(g, "N");
      lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 16});
      lm_tensor d = lm_input(g, "d", LM_ROLE_DATA, 2, (lm_dim[]){N, 8});
      lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 2, (lm_dim[]){16, 8});
      lm_tensor b = lm_input(g, "b", LM_ROLE_PARAM, 1, (lm_dim[]){8});
      /* (the bias's sum adds 0.5 a row: the masked row must add nothing, not 0.5) */
      lm_tensor grads[2] = {lm_matmul(lm_transpose(x, 0, 1), d), lm_sum(lm_add_scalar(d, 0.5f), 0, 0)}, clipped[2], norm;
      OK(lm_optim_clip_grad_norm(grads, 2, 0.5f, clipped, &norm));
      OK(lm_output(lm_sub(w, lm_mul_scalar(clipped[0], 0.1f)), "w2"));
      OK(lm_output(lm_sub(b, lm_mul_scalar(clipped[1], 0.1f)), "b2"));
      OK(lm_output(norm, "norm"));
      lm_graph_set_contraction(g, on);
      char *text = partial_plan(g);
      int halves = strstr(text, "(N + 1)/2") != NULL;
      cr_assert_eq(halves, on, "%s: the rows are %s:\n%s", on ? "contracting" : "plain",
                   halves ? "halved" : "not halved", text);
      lm_free(text);
      setenv("LUMEN_NO_PARTIAL", "1", 1); /* the switch turns it off */
      text = partial_plan(g);
      unsetenv("LUMEN_NO_PARTIAL");
      cr_assert_null(strstr(text, "(N + 1)/2"), "LUMEN_NO_PARTIAL=1 halves the rows:\n%s", text);
      lm_free(text);

      check_rng r = check_rng_new(11);
      enum { NOUT = 16 * 8 + 8 + 1 };
      float xv[40 * 16], dv[40 * 8], wv[16 * 8], bv[8], out[3][NOUT];
      check_fill(&r, xv, (size_t)rows * 16, -1, 1, 0.01);
      check_fill(&r, dv, (size_t)rows * 8, -1, 1, 0.01);
      check_fill(&r, wv, 16 * 8, -1, 1, 0.01);
      check_fill(&r, bv, 8, -1, 1, 0.01);
      for (int t = 0; t < 3; t++) { /* the ref, then the cpu on 1 and on 3 threads */
        lm_backend_t *be;
        lm_program_t *p = ref_or_threads(g, t, &be);
        OK(lm_program_bind(p, "N", rows));
        OK(lm_program_write(p, "x", xv, (size_t)rows * 16));
        OK(lm_program_write(p, "d", dv, (size_t)rows * 8));
        OK(lm_program_write(p, "w", wv, 16 * 8));
        OK(lm_program_write(p, "b", bv, 8));
        OK(lm_program_run(p));
        OK(lm_program_read(p, "w2", out[t], 16 * 8));
        OK(lm_program_read(p, "b2", out[t] + 16 * 8, 8));
        OK(lm_program_read(p, "norm", out[t] + 16 * 8 + 8, 1));
        lm_program_free(p);
        lm_backend_free(be);
      }
      double want[NOUT];
      for (int i = 0; i < NOUT; i++) want[i] = out[0][i];
      check_close(on ? "contracted" : "plain", out[1], want, NOUT, 1e-5, 1e-5);
      check_same_bits("1 thread against 3", out[1], out[2], NOUT);
      lm_graph_free(g);
    }
  lm_graph_t *g = lm_graph_new(); /* a sum over the rows that is an output */
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){lm_sym(g, "N"), 16});
  OK(lm_output(lm_sum(x, 0, 0), "xsum"));
  lm_graph_set_contraction(g, 1);
  char *text = partial_plan(g);
  cr_assert_null(strstr(text, "(N + 1)/2"), "an output's sum is halved:\n%s", text);
  lm_free(text);
  lm_graph_free(g);
}
