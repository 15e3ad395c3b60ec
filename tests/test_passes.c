/* Tests for canonicalisation (compiler/passes.c): each rewrite on a minimal graph (node counts
 * before and after, the same results on the ref backend), CSE across views, dead-code removal,
 * outputs and assigns that read replaced nodes through views, and a fixed-seed property test
 * over 200 random graphs.
 *
 * Tolerance: none for rewrites passes.c calls exact — results must agree bit for bit, a NaN
 * matching any NaN. Inputs include -0, infinities, NaN, huge and subnormal values, because the
 * exactness claims (x + 0, x * 0, sum over an extent-1 axis) hinge on exactly those. Rewrites
 * that change rounding are checked with a stated tolerance on inputs where they are accurate. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph-impl.h"
#include "lumen/lumen.h"
#include "passes.h"
#include "support/timeout.h"

/* ---------------------------------------------------------------- fixed-seed numbers */

typedef struct rng {
  uint64_t s;
} rng;

static uint64_t rnext(rng *r) { /* splitmix64 */
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static int rint_in(rng *r, int lo, int hi) { return lo + (int)(rnext(r) % (uint64_t)(hi - lo + 1)); }
static float runit(rng *r) { return (float)(rnext(r) >> 40) * 0x1p-24f; }

/* Mostly [-3, 3), with the values where rewrites are easy to get wrong mixed in. */
static float rvalue(rng *r, int specials) {
  static const float sp[] = {0.0f, -0.0f, 1.0f, -1.0f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 1e-40f, -1e-40f, 200.0f};
  if (specials && rint_in(r, 0, 9) == 0) return sp[rint_in(r, 0, (int)(sizeof sp / sizeof sp[0]) - 1)];
  return -3.0f + 6.0f * runit(r);
}

/* ---------------------------------------------------------------- running graphs on ref */

enum { MAXBUF = 24 };

typedef struct results {
  int n;
  char *name[MAXBUF];
  float *val[MAXBUF];
  size_t count[MAXBUF];
} results;

static void results_free(results *r) {
  for (int i = 0; i < r->n; i++) {
    free(r->name[i]);
    free(r->val[i]);
  }
  r->n = 0;
}

static uint64_t name_seed(const char *s, uint64_t seed) {
  uint64_t h = seed * 0x100000001B3ull + 14695981039346656037ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001B3ull;
  return h;
}

/* Binds every symbol to 3, fills every input from (its name, seed), runs once, and collects
 * every output and then every parameter/state input (their values after the assigns). */
static int run_ref(const lm_graph_t *g, uint64_t seed, int specials, results *r, char *err, size_t cap) {
  memset(r, 0, sizeof *r);
  lm_backend_t *b = lm_backend_new("ref");
  lm_program_t *p = b ? lm_program_new(b, g) : NULL;
  int ok = p != NULL;
  if (!ok) snprintf(err, cap, "program: %s", lm_last_error());
  for (size_t i = 0; ok && i < g->x.nsyms; i++)
    if (lm_program_bind(p, g->x.syms[i].name, 3) != LM_OK) ok = 0, snprintf(err, cap, "bind: %s", lm_last_error());
  for (size_t i = 0; ok && i < g->ninputs; i++) {
    size_t n = 0;
    lm_program_numel(p, g->inputs[i].name, &n);
    float *v = malloc((n + 1) * sizeof *v);
    rng ir = {name_seed(g->inputs[i].name, seed)};
    for (size_t k = 0; k < n; k++) v[k] = rvalue(&ir, specials);
    if (lm_program_write(p, g->inputs[i].name, v, n) != LM_OK) ok = 0, snprintf(err, cap, "write: %s", lm_last_error());
    free(v);
  }
  if (ok && lm_program_run(p) != LM_OK) ok = 0, snprintf(err, cap, "run: %s", lm_last_error());
  for (size_t i = 0; ok && i < g->noutputs + g->ninputs && r->n < MAXBUF; i++) {
    const char *name = i < g->noutputs ? g->outputs[i].name : g->inputs[i - g->noutputs].name;
    if (i >= g->noutputs && g->inputs[i - g->noutputs].role == LM_ROLE_DATA) continue;
    size_t n = 0;
    lm_program_numel(p, name, &n);
    float *v = malloc((n + 1) * sizeof *v);
    for (size_t k = 0; k < n; k++) v[k] = NAN;
    if (lm_program_read(p, name, v, n) != LM_OK) {
      ok = 0;
      snprintf(err, cap, "read %s: %s", name, lm_last_error());
      free(v);
      break;
    }
    r->name[r->n] = strdup(name);
    r->val[r->n] = v;
    r->count[r->n++] = n;
  }
  lm_program_free(p);
  lm_backend_free(b);
  if (!ok) results_free(r);
  return ok;
}

static int same_bits(float a, float b) {
  if (isnan(a) && isnan(b)) return 1;
  uint32_t x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  return x == y;
}

/* Tolerances of a comparison: none (bitwise, any NaN equals any NaN), or equal as floats
 * (+0 == -0) within atol + rtol * |original|. */
typedef struct tol {
  int numeric;
  double rtol, atol;
} tol;
static const tol BITWISE = {0, 0, 0}, FLOAT_EQ = {1, 0, 0};

static int results_match(const results *a, const results *b, tol t, char *err, size_t cap) {
  if (a->n != b->n) return snprintf(err, cap, "%d results vs %d", a->n, b->n), 0;
  for (int i = 0; i < a->n; i++) {
    if (strcmp(a->name[i], b->name[i]) || a->count[i] != b->count[i])
      return snprintf(err, cap, "result %d: %s[%zu] vs %s[%zu]", i, a->name[i], a->count[i], b->name[i], b->count[i]), 0;
    for (size_t k = 0; k < a->count[i]; k++) {
      float x = a->val[i][k], y = b->val[i][k];
      int fine = t.numeric ? (x == y || (isnan(x) && isnan(y)) || fabs((double)x - y) <= t.atol + t.rtol * fabs((double)x))
                           : same_bits(x, y);
      if (!fine)
        return snprintf(err, cap, "%s[%zu]: original %.9g vs canonical %.9g", a->name[i], k, (double)x, (double)y), 0;
    }
  }
  return 1;
}

static void log_graph(const char *title, const lm_graph_t *g) {
  char *text = lm_graph_dump(g);
  cr_log_error("%s:\n%s", title, text ? text : "(dump failed)");
  free(text);
}

/* Canonicalises g, checks the result validates, keeps its interface, and computes what g
 * computes (within t); returns the canonical graph. */
static lm_graph_t *canon_checked(const lm_graph_t *g, unsigned flags, lm_pass_stats *st, tol t) {
  lm_graph_t *c = lm_canonicalize_ex(g, flags, st);
  cr_assert(c, "canonicalize: %s", lm_last_error());
  if (lm_graph_validate(c) != LM_OK) {
    log_graph("original", g);
    log_graph("canonical", c);
    cr_assert_fail("canonical graph does not validate: %s", lm_last_error());
  }
  cr_assert_eq(c->ninputs, g->ninputs);
  for (size_t i = 0; i < g->ninputs; i++) {
    cr_assert_str_eq(c->inputs[i].name, g->inputs[i].name);
    cr_assert_eq(c->inputs[i].role, g->inputs[i].role);
  }
  results ra, rb;
  char err[512];
  cr_assert(run_ref(g, 7, 1, &ra, err, sizeof err), "original: %s", err);
  cr_assert(run_ref(c, 7, 1, &rb, err, sizeof err), "canonical: %s", err);
  int ok = results_match(&ra, &rb, t, err, sizeof err);
  results_free(&ra);
  results_free(&rb);
  if (!ok) {
    log_graph("original", g);
    log_graph("canonical", c);
    cr_assert_fail("results differ: %s", err);
  }
  return c;
}

/* ---------------------------------------------------------------- small builders */

static lm_graph_t *G;
static void setup(void) { G = lm_graph_new(); }
static void teardown(void) { lm_graph_free(G); }
TestSuite(passes, .init = setup, .fini = teardown);

static lm_tensor in1(const char *name, lm_dim n) { return lm_input(G, name, LM_ROLE_DATA, 1, &n); }
static lm_tensor in2(const char *name, lm_dim a, lm_dim b) {
  lm_dim d[2] = {a, b};
  return lm_input(G, name, LM_ROLE_DATA, 2, d);
}
/* A scalar constant broadcast to t's shape, axis by axis. */
static lm_tensor cst_like(lm_tensor t, float v) {
  lm_tensor c = lm_const(G, v);
  for (int i = 0; i < lm_rank(t); i++) c = lm_expand(c, i, lm_dim_of(t, i));
  return c;
}
static void out(lm_tensor t, const char *name) { cr_assert(lm_output(t, name) == LM_OK, "%s", lm_last_error()); }

static lm_graph_t *canon(unsigned flags, lm_pass_stats *st) { return canon_checked(G, flags, st, BITWISE); }

/* ---------------------------------------------------------------- dead code */

Test(passes, dce_keeps_inputs_and_removes_unused_branches) {
  lm_tensor x = in1("x", 4), y = in1("unused", 3);
  lm_tensor keep = lm_sin(x);
  lm_tensor dead = lm_add(lm_exp2(x), lm_sqrt(x)); /* three nodes nobody reads */
  (void)lm_recip(y);
  (void)dead;
  out(keep, "out");
  cr_assert_eq(lm_graph_node_count(G), 7);
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(lm_graph_node_count(c), 3, "x, unused and sin remain, got %zu", lm_graph_node_count(c));
  cr_expect_eq(st.dead, 4);
  cr_expect_eq(c->ninputs, 2);
  cr_expect_eq(c->nodes[c->inputs[1].node].op, LM_OP_INPUT);
  lm_graph_free(c);
}

Test(passes, node_ids_are_compact_and_topological) {
  lm_tensor x = in1("x", 4);
  (void)lm_exp2(x);
  lm_tensor a = lm_sin(x);
  (void)lm_log2(x);
  out(lm_add(a, lm_sqrt(a)), "out");
  lm_graph_t *c = canon(0, NULL);
  cr_assert_eq(lm_graph_node_count(c), 4);
  for (size_t i = 1; i < c->nnodes; i++)
    for (int k = 0; k < c->nodes[i].nsrc; k++) cr_expect_lt(c->nodes[i].src[k].node, i, "node %zu reads a later node", i);
  lm_graph_free(c);
}

Test(passes, input_graph_is_not_modified) {
  lm_tensor x = in2("x", 2, 3);
  out(lm_mul(lm_add(x, cst_like(x, 0.0f)), cst_like(x, 1.0f)), "out");
  cr_assert(lm_graph_validate(G) == LM_OK); /* validating interns its own expressions first */
  char *before = lm_graph_dump(G);
  size_t nodes = lm_graph_node_count(G), views = G->nviews, exprs = G->x.n;
  lm_graph_t *c = lm_canonicalize(G, NULL);
  cr_assert(c);
  char *after = lm_graph_dump(G);
  cr_expect_str_eq(after, before);
  cr_expect_eq(lm_graph_node_count(G), nodes);
  cr_expect_eq(G->nviews, views);
  cr_expect_eq(G->x.n, exprs, "the input's expression arena grew");
  free(before);
  free(after);
  lm_graph_free(c);
}

Test(passes, invalid_graph_is_refused_with_a_message) {
  lm_tensor x = in1("x", 4), y = in1("y", 3);
  (void)lm_add(x, y); /* records a construction error */
  cr_assert_null(lm_canonicalize(G, NULL));
  cr_expect_neq(strlen(lm_last_error()), 0);
  cr_assert_null(lm_canonicalize(NULL, NULL));
}

/* ---------------------------------------------------------------- CSE */

Test(passes, cse_merges_identical_nodes_and_constants) {
  lm_tensor x = in1("x", 5);
  lm_tensor a = lm_sin(lm_mul(x, cst_like(x, 2.0f)));
  lm_tensor b = lm_sin(lm_mul(x, cst_like(x, 2.0f)));
  out(lm_add(a, b), "out");
  cr_assert_eq(lm_graph_node_count(G), 8);
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(lm_graph_node_count(c), 5, "x, 2, mul, sin, add; got %zu", lm_graph_node_count(c));
  cr_expect_eq(st.cse, 3);
  lm_graph_free(c);
}

Test(passes, cse_matches_commuted_add_and_mul) {
  lm_tensor x = in1("x", 5), y = in1("y", 5);
  out(lm_add(lm_mul(x, y), lm_mul(y, x)), "m");
  out(lm_sub(lm_add(x, y), lm_add(y, x)), "a");
  lm_graph_t *c = canon(0, NULL);
  /* x, y, mul, add(mul, mul), add, -1, mul(-1, add), add */
  cr_expect_eq(lm_graph_node_count(c), 8, "got %zu", lm_graph_node_count(c));
  lm_graph_free(c);
}

Test(passes, cse_same_permute_on_both_uses_merges) {
  lm_tensor x = in2("x", 2, 3);
  int perm[2] = {1, 0};
  lm_tensor a = lm_exp2(lm_permute(x, perm));
  lm_tensor b = lm_exp2(lm_permute(x, perm)); /* a second, separately built view */
  cr_assert_neq(a.node, b.node);
  out(lm_add(a, b), "out");
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(lm_graph_node_count(c), 3);
  cr_expect_eq(st.cse, 1);
  lm_graph_free(c);
}

Test(passes, cse_different_views_do_not_merge) {
  lm_tensor x = in2("x", 3, 3);
  int perm[2] = {1, 0};
  lm_tensor a = lm_exp2(lm_permute(x, perm));
  lm_tensor b = lm_exp2(x);
  lm_tensor c1 = lm_exp2(lm_slice(x, 0, 0, 2)), c2 = lm_exp2(lm_slice(x, 0, 1, 3));
  lm_tensor d1 = lm_sin(lm_pad(x, 1, 1, 0)), d2 = lm_sin(lm_pad(x, 1, 0, 1));
  out(lm_add(a, b), "ab");
  out(lm_add(c1, c2), "c");
  out(lm_add(d1, d2), "d");
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(lm_graph_node_count(c), lm_graph_node_count(G));
  cr_expect_eq(st.cse, 0);
  lm_graph_free(c);
}

Test(passes, cse_rand_same_stream_merges_other_streams_do_not) {
  lm_dim n = 6;
  lm_tensor a = lm_rand_stream(G, 3, 1, &n), b = lm_rand_stream(G, 3, 1, &n), d = lm_rand_stream(G, 4, 1, &n);
  lm_dim m = 3;
  lm_tensor e = lm_rand_stream(G, 3, 1, &m); /* same stream, another shape */
  out(lm_add(a, b), "ab");
  out(lm_add(a, d), "ad");
  out(e, "e");
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(lm_graph_node_count(c), 5, "rand3[6], rand4[6], rand3[3], two adds; got %zu", lm_graph_node_count(c));
  cr_expect_eq(st.cse, 1);
  lm_graph_free(c);
}

Test(passes, cse_distinguishes_constants_bitwise) {
  lm_tensor x = in1("x", 4);
  out(lm_add(lm_mul(x, cst_like(x, 0.5f)), lm_mul(x, cst_like(x, 0.5f))), "a");
  out(lm_mul(lm_exp2(x), cst_like(x, -0.0f)), "negzero");
  out(lm_mul(lm_exp2(x), cst_like(x, 0.0f)), "poszero");
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  int zeros = 0;
  for (size_t i = 1; i < c->nnodes; i++) zeros += c->nodes[i].op == LM_OP_CONST && c->nodes[i].value == 0;
  cr_expect_eq(zeros, 2, "+0 and -0 are different constants");
  lm_graph_free(c);
}

/* ---------------------------------------------------------------- constant folding */

Test(passes, fold_elementwise_constants) {
  lm_tensor x = in1("x", 4);
  lm_tensor k = lm_sqrt(lm_add(lm_const(G, 2.0f), lm_const(G, 7.0f))); /* 3 */
  lm_tensor m = lm_mod(lm_const(G, 7.5f), lm_const(G, -2.0f));           /* fmodf: 1.5 */
  lm_tensor l = lm_less_than(lm_log2(lm_const(G, 8.0f)), lm_exp2(lm_const(G, 1.5f)));
  out(lm_mul(x, cst_like(x, 1.0f)), "x_out");
  out(lm_add(lm_mul(x, lm_expand(k, 0, 4)), lm_expand(lm_add(m, l), 0, 4)), "out");
  out(lm_sin(lm_recip(lm_const(G, 0.0f))), "nan"); /* sin(inf) folds to a NaN constant */
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_geq(st.folded, 7);
  /* x, then const 3, mul, const 1.5, add; a NaN constant */
  cr_expect_eq(lm_graph_node_count(c), 6, "got %zu", lm_graph_node_count(c));
  lm_graph_free(c);
}

Test(passes, fold_sees_constants_through_broadcasts_and_rebroadcasts_the_result) {
  lm_tensor x = in2("x", 2, 3);
  lm_tensor a = lm_exp2(cst_like(x, 3.0f)); /* exp2 of a [2,3] broadcast */
  int perm[2] = {1, 0};
  out(lm_permute(a, perm), "a_t");
  out(lm_add(x, a), "sum");
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(st.folded, 1);
  cr_expect_eq(lm_graph_node_count(c), 3, "x, 8, add; got %zu", lm_graph_node_count(c));
  lm_graph_free(c);
}

Test(passes, pad_of_a_constant_is_not_constant) {
  lm_tensor c3 = lm_expand(lm_const(G, 2.0f), 0, 3);
  lm_tensor p = lm_pad(c3, 0, 1, 1); /* 0 2 2 2 0 */
  out(lm_sin(p), "sin");
  lm_tensor z = lm_pad(lm_expand(lm_const(G, 0.0f), 0, 3), 0, 1, 1); /* all +0: still constant */
  out(lm_exp2(z), "one");
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(st.folded, 1, "only the padded +0 folds");
  cr_expect_eq(lm_graph_node_count(c), 3, "2, sin, 1; got %zu", lm_graph_node_count(c));
  volatile float two = 2.0f; /* libm's sinf at run time, as ref calls it */
  float s2 = sinf(two), want[5] = {0, s2, s2, s2, 0};
  results r;
  char err[256];
  cr_assert(run_ref(c, 1, 0, &r, err, sizeof err), "%s", err);
  for (int i = 0; i < 5; i++) cr_expect(same_bits(r.val[0][i], want[i]), "sin[%d] = %g", i, (double)r.val[0][i]);
  for (int i = 0; i < 5; i++) cr_expect_eq(r.val[1][i], 1.0f);
  results_free(&r);
  lm_graph_free(c);
}

Test(passes, fold_reductions_of_constants_and_empty_axes) {
  lm_tensor e = lm_expand(lm_const(G, 2.5f), 0, 4);
  out(lm_max_reduce(e, 0), "max");                               /* 2.5 */
  out(lm_sum_reduce(lm_expand(lm_const(G, -0.0f), 0, 4), 0), "zero"); /* +0 */
  lm_tensor x = in2("x", 3, 0);
  out(lm_sum_reduce(x, 1), "empty_sum");
  out(lm_max_reduce(x, 1), "empty_max");
  out(lm_sum_reduce(e, 0), "sum"); /* not folded: 4 roundings */
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(st.folded, 4);
  lm_graph_free(c);
}

/* ---------------------------------------------------------------- identities */

Test(passes, add_zero_is_removed_where_it_is_exact) {
  lm_tensor x = in1("x", 8);
  out(lm_add(lm_exp2(x), cst_like(x, 0.0f)), "pos"); /* exp2 is never -0 */
  out(lm_add(x, cst_like(x, -0.0f)), "neg");          /* x + -0 is x for every x */
  out(lm_add(x, cst_like(x, 0.0f)), "any");           /* -0 + 0 is +0: not exact */
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 2);
  cr_expect_eq(st.rounding, 0);
  cr_expect_eq(lm_graph_node_count(c), 4, "x, exp2, +0, add; got %zu", lm_graph_node_count(c));
  lm_graph_free(c);
  c = lm_canonicalize(G, &st); /* every rewrite: x + 0 goes too, marked */
  cr_assert(c);
  cr_expect_eq(st.identities, 3);
  cr_expect_eq(st.rounding, 1);
  cr_expect_eq(lm_graph_node_count(c), 2);
  lm_graph_free(c);
}

Test(passes, add_zero_stays_when_x_can_be_negative_zero) {
  lm_tensor x = in1("x", 8);
  lm_tensor nz = lm_mul(lm_exp2(x), cst_like(x, -0.0f)); /* -0 for finite exp2(x): kept (exp2 may be inf) */
  out(lm_add(lm_add(nz, nz), cst_like(x, 0.0f)), "sum");  /* -0 + -0 = -0, then + +0 = +0 */
  out(lm_add(lm_sqrt(nz), cst_like(x, 0.0f)), "sqrt");    /* sqrt(-0) = -0 */
  out(lm_add(lm_sin(nz), cst_like(x, 0.0f)), "sin");      /* sin(-0) = -0 */
  out(lm_add(lm_mod(nz, cst_like(x, 3.0f)), cst_like(x, 0.0f)), "mod"); /* fmodf(-0, 3) = -0 */
  out(lm_add(lm_max_reduce(lm_expand(nz, 0, 2), 0), cst_like(x, 0.0f)), "max");
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 0);
  lm_graph_free(c);
}

Test(passes, add_zero_wider_than_x_leaves_x_seen_through_its_broadcast) {
  lm_tensor x = in1("x", 3);
  lm_tensor z = lm_expand(lm_expand(lm_const(G, -0.0f), 0, 2), 1, 3);
  out(lm_add(lm_expand(x, 0, 1), z), "out"); /* [1,3] + [2,3] -> [2,3]: x is read broadcast */
  lm_pass_stats st;
  lm_graph_t *c = canon(0, &st);
  cr_expect_eq(st.identities, 1);
  cr_expect_eq(lm_graph_node_count(c), 1);
  cr_expect_eq(c->outputs[0].src.node, c->inputs[0].node);
  cr_expect_eq(lm_edge_shape(c, c->outputs[0].src)->rank, 2);
  lm_graph_free(c);
}

Test(passes, mul_one_is_removed) {
  lm_tensor x = in2("x", 2, 3);
  int perm[2] = {1, 0};
  out(lm_permute(lm_mul(cst_like(x, 1.0f), x), perm), "out"); /* an output viewing the removed node */
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 1);
  cr_expect_eq(lm_graph_node_count(c), 1);
  cr_expect_eq(c->outputs[0].src.node, c->inputs[0].node);
  cr_expect_neq(c->outputs[0].src.view, 0);
  lm_graph_free(c);
}

Test(passes, mul_zero_only_for_provably_finite_operands) {
  lm_tensor x = in1("x", 8);
  lm_dim n = 8;
  lm_tensor r = lm_rand_stream(G, 0, 1, &n);
  out(lm_mul(r, cst_like(r, 0.0f)), "rand");                        /* finite, >= 0: exact */
  out(lm_mul(lm_less_than(x, r), cst_like(x, -0.0f)), "lt");        /* {0,1} * -0 = -0: exact */
  out(lm_mul(lm_add(lm_sin(r), r), cst_like(x, 0.0f)), "mixed");    /* finite, either sign */
  out(lm_mul(x, cst_like(x, 0.0f)), "input");                       /* inf * 0 = NaN: kept */
  out(lm_mul(lm_sin(x), cst_like(x, 0.0f)), "sin_of_input");        /* sin(inf) = NaN: kept */
  out(lm_mul(lm_mul(cst_like(x, -2.0f), r), cst_like(x, 0.0f)), "neg"); /* negative: -0, exact */
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 3);
  lm_graph_free(c);
  c = canon_checked(G, 0, &st, FLOAT_EQ); /* the marked rewrite may flip a zero's sign */
  cr_expect_eq(st.identities, 4);
  cr_expect_eq(st.rounding, 1);
  lm_graph_free(c);
}

Test(passes, unary_inverse_pairs_are_removed_and_marked_as_rounding) {
  lm_tensor x = in2("x", 2, 3);
  int perm[2] = {1, 0};
  out(lm_recip(lm_permute(lm_recip(x), perm)), "rr");
  out(lm_log2(lm_exp2(x)), "le");
  lm_tensor r = lm_rand_stream(G, 0, 2, (lm_dim[]){2, 3});
  out(lm_exp2(lm_log2(r)), "el_rand"); /* r in (0, 1]: removed */
  out(lm_exp2(lm_log2(x)), "el_any");  /* x may be negative: log2 gives NaN, kept */
  out(lm_recip(lm_pad(lm_recip(x), 0, 1, 0)), "padded"); /* pad reads 0: recip(0) = inf, kept */
  size_t before = lm_graph_node_count(G);
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 0);
  cr_expect_eq(lm_graph_node_count(c), before - 1, "only the two recip(x) merge");
  lm_graph_free(c);
  /* away from overflow these are accurate to a few ulp */
  c = lm_canonicalize(G, &st);
  cr_assert(c);
  cr_expect_eq(st.identities, 3);
  cr_expect_eq(st.rounding, 3);
  results ra, rb;
  char err[256];
  cr_assert(run_ref(G, 3, 0, &ra, err, sizeof err), "%s", err);
  cr_assert(run_ref(c, 3, 0, &rb, err, sizeof err), "%s", err);
  cr_expect(results_match(&ra, &rb, (tol){1, 1e-5, 1e-6}, err, sizeof err), "%s", err);
  results_free(&ra);
  results_free(&rb);
  lm_graph_free(c);
}

Test(passes, contiguous_of_an_identity_view_is_removed) {
  lm_tensor x = in2("x", 2, 3);
  int perm[2] = {1, 0};
  lm_dim flat = 6, back[2] = {2, 3};
  out(lm_sin(lm_contiguous(x)), "plain");
  out(lm_contiguous(lm_reshape(lm_reshape(x, 1, &flat), 2, back)), "round_trip");
  out(lm_contiguous(lm_reshape(x, 1, &flat)), "flat");
  out(lm_contiguous(lm_permute(x, perm)), "transposed"); /* moves data: kept */
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 3);
  cr_expect_eq(lm_graph_node_count(c), 3, "x, sin, contiguous(permute); got %zu", lm_graph_node_count(c));
  lm_graph_free(c);
}

Test(passes, reduce_over_extent_one_becomes_a_reshape_view) {
  lm_dim d[3] = {3, 1, 2};
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 3, d);
  out(lm_sum_reduce(lm_exp2(x), 1), "sum_pos"); /* exp2 is never -0: exact */
  out(lm_max_reduce(lm_exp2(x), 1), "max");     /* exp2(NaN) is NaN, which max ignores: kept */
  out(lm_max_reduce(lm_less_than(x, x), -2), "max_lt");
  out(lm_sum_reduce(x, 1), "sum_any"); /* 0 + -0 = +0: not exact */
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 2);
  lm_graph_free(c);
  c = canon_checked(G, 0, &st, FLOAT_EQ); /* the marked rewrite may flip a zero's sign */
  cr_expect_eq(st.identities, 3);
  cr_expect_eq(st.rounding, 1);
  lm_graph_free(c);
}

Test(passes, assigns_and_outputs_read_replaced_nodes_through_views) {
  lm_dim d[2] = {2, 3};
  lm_tensor s = lm_input(G, "s", LM_ROLE_STATE, 2, d);
  lm_tensor x = lm_input(G, "x", LM_ROLE_DATA, 2, d);
  lm_tensor v = lm_mul(lm_add(lm_exp2(x), cst_like(x, -0.0f)), cst_like(x, 1.0f));
  cr_assert(lm_assign(s, lm_add(s, v)) == LM_OK);
  int perm[2] = {1, 0};
  out(lm_slice(lm_permute(v, perm), 0, 1, 3), "view_of_removed");
  out(lm_pad(lm_exp2(cst_like(x, 1.0f)), 1, 1, 0), "view_of_folded");
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(st.identities, 2);
  cr_expect_eq(st.folded, 1);
  cr_expect_eq(c->nassigns, 1);
  cr_expect_eq(c->assigns[0].target, c->inputs[0].node);
  lm_graph_free(c);
}

Test(passes, canonical_form_is_a_fixed_point) {
  lm_tensor x = in2("x", 2, 3);
  lm_tensor a = lm_mul(lm_add(lm_sin(x), lm_sin(x)), cst_like(x, 1.0f));
  out(lm_add(a, lm_mul(lm_exp2(x), cst_like(x, 0.0f))), "out");
  lm_graph_t *c = canon(0, NULL);
  lm_pass_stats st;
  lm_graph_t *c2 = lm_canonicalize(c, &st);
  cr_assert(c2);
  cr_expect_eq(st.dead + st.cse + st.folded + st.identities, 0);
  cr_expect_eq(lm_graph_node_count(c2), lm_graph_node_count(c));
  char *t1 = lm_graph_dump(c), *t2 = lm_graph_dump(c2);
  cr_expect_str_eq(t1, t2);
  free(t1);
  free(t2);
  lm_graph_free(c);
  lm_graph_free(c2);
}

Test(passes, symbolic_dimensions_survive) {
  lm_dim n = lm_sym(G, "N");
  lm_tensor x = in2("x", n, 4);
  lm_tensor e = lm_exp2(x);
  lm_tensor y = lm_sum_reduce(lm_expand(lm_mul(e, cst_like(x, 1.0f)), 1, 1), 1);
  out(lm_add(y, lm_sum_reduce(lm_expand(lm_mul(e, cst_like(x, 1.0f)), 1, 1), 1)), "out");
  lm_pass_stats st;
  lm_graph_t *c = canon(LM_CANON_EXACT, &st);
  cr_expect_eq(c->x.nsyms, 1);
  cr_expect_eq(lm_graph_node_count(c), 3, "x, exp2, add; got %zu", lm_graph_node_count(c));
  lm_graph_free(c);
}

/* ---------------------------------------------------------------- random graphs */

enum { POOL = 96, MAXRANK = 4, MAXNUMEL = 96 };

typedef struct gen {
  lm_graph_t *g;
  rng r;
  lm_tensor pool[POOL];
  int n;
  lm_dim sym;
  int64_t syms[4];
} gen;

static int64_t est_dim(gen *q, lm_dim d) { return lm_x_eval(&q->g->x, lm_dim_expr(q->g, d), NULL, q->syms); }
static int64_t est_numel(gen *q, lm_tensor t) {
  int64_t n = 1;
  for (int i = 0; i < lm_rank(t); i++) n *= est_dim(q, lm_dim_of(t, i));
  return n;
}
static void add(gen *q, lm_tensor t) {
  cr_assert(lm_tensor_ok(t), "generator made an invalid tensor: %s", q->g->errmsg ? q->g->errmsg : "?");
  if (q->n < POOL) q->pool[q->n++] = t;
  else q->pool[rint_in(&q->r, 0, POOL - 1)] = t;
}
/* Half the time one of the four latest tensors, so graphs grow deep as well as wide. */
static lm_tensor pick(gen *q) {
  int recent = q->n < 4 ? q->n : 4;
  return rint_in(&q->r, 0, 1) ? q->pool[q->n - 1 - rint_in(&q->r, 0, recent - 1)] : q->pool[rint_in(&q->r, 0, q->n - 1)];
}

static lm_dim rdim(gen *q) { /* 1, 2, 3 or N; now and then an empty axis */
  int k = rint_in(&q->r, 0, 19);
  return k == 0 ? 0 : k <= 5 ? 1 : k <= 10 ? 2 : k <= 15 ? 3 : q->sym;
}

static lm_tensor rconst(gen *q) {
  static const float vals[] = {0.0f, 1.0f, -0.0f, 0.0f, 1.0f, -1.0f, 0.5f, 2.0f, 3.25f, -7.0f, INFINITY, NAN};
  return lm_const(q->g, vals[rint_in(&q->r, 0, (int)(sizeof vals / sizeof vals[0]) - 1)]);
}

/* Broadcasts t to (rank, dims): leading axes by expand, extent-1 axes stretched. */
static lm_tensor bcast(lm_tensor t, int rank, const lm_dim *dims) {
  for (int i = 0; lm_rank(t) < rank; i++) t = lm_expand(t, i, dims[i]);
  return lm_broadcast_to(t, rank, dims);
}

/* The numpy broadcast shape of a and b, or 0 when they do not broadcast. */
static int bshape(gen *q, lm_tensor a, lm_tensor b, int *rank, lm_dim *dims) {
  int ra = lm_rank(a), rb = lm_rank(b), r = ra > rb ? ra : rb;
  for (int i = 0; i < r; i++) {
    int ia = i - (r - ra), ib = i - (r - rb);
    lm_dim da = ia >= 0 ? lm_dim_of(a, ia) : 1, db = ib >= 0 ? lm_dim_of(b, ib) : 1;
    if (lm_dim_equal(q->g, da, db) || db == 1) dims[i] = da;
    else if (da == 1) dims[i] = db;
    else return 0;
  }
  *rank = r;
  return 1;
}

static lm_tensor binop(gen *q, int op, lm_tensor a, lm_tensor b) {
  int r;
  lm_dim d[LM_MAX_RANK];
  if (!bshape(q, a, b, &r, d)) return (lm_tensor){0};
  a = bcast(a, r, d);
  b = bcast(b, r, d);
  switch (op) {
  case 0: return lm_add(a, b);
  case 1: return lm_mul(a, b);
  case 2: return lm_mod(a, b);
  default: return lm_less_than(a, b);
  }
}

static lm_tensor unop(int op, lm_tensor x) {
  switch (op) {
  case 0: return lm_log2(x);
  case 1: return lm_exp2(x);
  case 2: return lm_sin(x);
  case 3: return lm_sqrt(x);
  case 4: return lm_recip(x);
  default: return lm_contiguous(x);
  }
}

static lm_tensor rview(gen *q, lm_tensor t) {
  int r = lm_rank(t);
  int kind = rint_in(&q->r, 0, 6);
  if (r == 0) kind = 3;
  switch (kind) {
  case 0: { /* permute */
    int perm[LM_MAX_RANK];
    for (int i = 0; i < r; i++) perm[i] = i;
    for (int i = r - 1; i > 0; i--) {
      int j = rint_in(&q->r, 0, i), s = perm[i];
      perm[i] = perm[j];
      perm[j] = s;
    }
    return lm_permute(t, perm);
  }
  case 1: { /* slice a constant axis */
    int a = rint_in(&q->r, 0, r - 1);
    lm_dim d = lm_dim_of(t, a);
    if (d <= 0) return t;
    int s = rint_in(&q->r, 0, (int)d - 1), e = rint_in(&q->r, s + 1, (int)d);
    return lm_slice(t, a, s, e);
  }
  case 2: { /* pad */
    int a = rint_in(&q->r, 0, r - 1);
    if (est_numel(q, t) * 3 > MAXNUMEL) return t;
    return lm_pad(t, a, rint_in(&q->r, 0, 2), rint_in(&q->r, 0, 1));
  }
  case 3: { /* expand */
    lm_dim n = rint_in(&q->r, 0, 3) == 0 ? q->sym : rint_in(&q->r, 1, 3);
    if (r >= MAXRANK || est_numel(q, t) * est_dim(q, n) > MAXNUMEL) return t;
    return lm_expand(t, rint_in(&q->r, 0, r), n);
  }
  case 4: { /* reshape: flatten, or merge two adjacent axes, or add an extent-1 axis */
    lm_dim d[LM_MAX_RANK];
    for (int i = 0; i < r; i++) d[i] = lm_dim_of(t, i);
    int how = rint_in(&q->r, 0, 2);
    if (how == 0) {
      lm_dim n = 1;
      for (int i = 0; i < r; i++) n = lm_dim_mul(q->g, n, d[i]);
      return lm_reshape(t, 1, &n);
    }
    if (how == 1 && r >= 2) {
      int a = rint_in(&q->r, 0, r - 2);
      d[a] = lm_dim_mul(q->g, d[a], d[a + 1]);
      memmove(&d[a + 1], &d[a + 2], (size_t)(r - a - 2) * sizeof d[0]);
      return lm_reshape(t, r - 1, d);
    }
    if (r >= MAXRANK) return t;
    int a = rint_in(&q->r, 0, r);
    memmove(&d[a + 1], &d[a], (size_t)(r - a) * sizeof d[0]);
    d[a] = 1;
    return lm_reshape(t, r + 1, d);
  }
  case 5: { /* affine_mod: a = 1 is a rotation on any extent */
    int a = rint_in(&q->r, 0, r - 1);
    if (est_dim(q, lm_dim_of(t, a)) == 0) return t;
    return lm_affine_mod(t, a, 1, rint_in(&q->r, 0, 3));
  }
  default: { /* split a constant axis of even extent */
    int a = rint_in(&q->r, 0, r - 1);
    lm_dim d[LM_MAX_RANK];
    for (int i = 0; i < r; i++) d[i] = lm_dim_of(t, i);
    if (r >= MAXRANK || d[a] < 2 || d[a] % 2) return t;
    memmove(&d[a + 1], &d[a], (size_t)(r - a) * sizeof d[0]);
    d[a] = 2;
    d[a + 1] /= 2;
    return lm_reshape(t, r + 1, d);
  }
  }
}

/* A tensor equal in shape to t built from t by one identity-shaped pattern. */
static lm_tensor pattern(gen *q, lm_tensor t) {
  switch (rint_in(&q->r, 0, 8)) {
  case 0: return lm_recip(lm_recip(t));
  case 1: return lm_log2(lm_exp2(t));
  case 2: return lm_exp2(lm_log2(t));
  case 3: return binop(q, 0, t, lm_const(q->g, rint_in(&q->r, 0, 1) ? 0.0f : -0.0f));
  case 4: return binop(q, 1, rconst(q), t);
  case 5: return lm_contiguous(t);
  case 6: {
    int a = rint_in(&q->r, 0, lm_rank(t));
    if (lm_rank(t) >= MAXRANK) return t;
    return rint_in(&q->r, 0, 1) ? lm_sum_reduce(lm_expand(t, a, 1), a) : lm_max_reduce(lm_expand(t, a, 1), a);
  }
  case 7: { /* the same view twice, each under the same op: CSE across views */
    if (lm_rank(t) < 2) return lm_sin(t);
    int perm[LM_MAX_RANK];
    for (int i = 0; i < lm_rank(t); i++) perm[i] = lm_rank(t) - 1 - i;
    lm_tensor a = lm_sin(lm_permute(t, perm)), b = lm_sin(lm_permute(t, perm));
    return lm_permute(lm_add(a, b), perm);
  }
  default: { /* a duplicate of t's own node over the same sources */
    const lm_node *n = &q->g->nodes[t.node];
    if (n->nsrc == 0 || t.view) return t;
    lm_tensor s0 = {q->g, n->src[0].node, n->src[0].view};
    if (lm_op_table[n->op].reduce)
      return n->op == LM_OP_SUM_REDUCE ? lm_sum_reduce(s0, n->axis) : lm_max_reduce(s0, n->axis);
    if (n->nsrc == 1) return unop(n->op == LM_OP_CONTIGUOUS ? 5 : n->op - LM_OP_LOG2, s0);
    lm_tensor s1 = {q->g, n->src[1].node, n->src[1].view};
    return binop(q, n->op - LM_OP_ADD, s0, s1);
  }
  }
}

static void random_graph(gen *q, uint64_t seed) {
  memset(q, 0, sizeof *q);
  q->g = lm_graph_new();
  q->r.s = seed;
  q->sym = lm_sym(q->g, "N");
  q->syms[0] = 3;
  int ndata = rint_in(&q->r, 1, 3), nstate = rint_in(&q->r, 0, 2);
  for (int i = 0; i < ndata + nstate; i++) {
    int rank = rint_in(&q->r, 0, 3);
    lm_dim d[3];
    for (int k = 0; k < rank; k++) d[k] = rdim(q);
    char name[16];
    snprintf(name, sizeof name, i < ndata ? "x%d" : "s%d", i);
    add(q, lm_input(q->g, name, i < ndata ? LM_ROLE_DATA : LM_ROLE_STATE, rank, d));
  }
  int steps = rint_in(&q->r, 4, 24);
  for (int s = 0; s < steps; s++) {
    lm_tensor t = pick(q), u;
    switch (rint_in(&q->r, 0, 9)) {
    case 0: add(q, unop(rint_in(&q->r, 0, 5), t)); break;
    case 1:
    case 2: { /* binary with a pool partner, or a constant if none fits */
      int op = rint_in(&q->r, 0, 3);
      u = binop(q, op, t, pick(q));
      if (!lm_tensor_ok(u) || rint_in(&q->r, 0, 2) == 0)
        u = rint_in(&q->r, 0, 1) ? binop(q, op, t, rconst(q)) : binop(q, op, rconst(q), t);
      add(q, u);
      break;
    }
    case 3: add(q, rview(q, t)); break;
    case 4:
      if (lm_rank(t) > 0) {
        int a = rint_in(&q->r, 0, lm_rank(t) - 1);
        add(q, rint_in(&q->r, 0, 1) ? lm_sum_reduce(t, a) : lm_max_reduce(t, a));
      }
      break;
    case 5: { /* a constant, maybe broadcast and then viewed (padding makes it non-constant) */
      u = rconst(q);
      for (int k = rint_in(&q->r, 0, 2); k > 0; k--) u = rview(q, lm_expand(u, 0, rint_in(&q->r, 1, 3)));
      add(q, u);
      break;
    }
    case 6: {
      int rank = rint_in(&q->r, 0, 2);
      lm_dim d[2];
      for (int k = 0; k < rank; k++) d[k] = rint_in(&q->r, 1, 3);
      add(q, lm_rand_stream(q->g, (uint32_t)rint_in(&q->r, 0, 1), rank, d));
      break;
    }
    default: add(q, pattern(q, t)); break;
    }
  }
  int nout = rint_in(&q->r, 1, 4);
  for (int i = 0; i < nout; i++) {
    char name[16];
    snprintf(name, sizeof name, "o%d", i);
    lm_tensor t = i == 0 ? q->pool[q->n - 1] : pick(q);
    cr_assert(lm_output(t, name) == LM_OK, "%s", lm_last_error());
  }
  for (size_t i = 0; i < q->g->ninputs; i++) {
    if (q->g->inputs[i].role != LM_ROLE_STATE) continue;
    lm_tensor s = {q->g, q->g->inputs[i].node, 0}, best = s;
    for (int k = 0; k < q->n; k++) { /* the latest pool tensor of the state's shape */
      lm_tensor t = q->pool[k];
      int same = lm_rank(t) == lm_rank(s);
      for (int a = 0; same && a < lm_rank(s); a++) same = lm_dim_equal(q->g, lm_dim_of(t, a), lm_dim_of(s, a));
      if (same) best = t;
    }
    if (best.node == s.node && best.view == 0) {
      lm_dim d[LM_MAX_RANK];
      for (int a = 0; a < lm_rank(s); a++) d[a] = lm_dim_of(s, a);
      best = lm_add(s, bcast(lm_exp2(rconst(q)), lm_rank(s), d));
    }
    cr_assert(lm_assign(s, best) == LM_OK, "%s", lm_last_error());
  }
}

Test(passes, random_graphs_keep_their_results, .timeout = LM_TIMEOUT(240)) {
  int exact_rewrites = 0, rounding_graphs = 0, totals[4] = {0};
  for (int gi = 0; gi < 200; gi++) {
    gen q;
    random_graph(&q, 0x5eed0000u + (uint64_t)gi);
    if (lm_graph_validate(q.g) != LM_OK) {
      log_graph("generated", q.g);
      cr_assert_fail("graph %d: the generator built an invalid graph: %s", gi, lm_last_error());
    }
    results ra, rb;
    char err[512];
    if (!run_ref(q.g, (uint64_t)gi, 1, &ra, err, sizeof err)) {
      log_graph("generated", q.g);
      cr_assert_fail("graph %d: original: %s", gi, err);
    }
    for (int mode = 0; mode < 2; mode++) {
      lm_pass_stats st;
      lm_graph_t *c = lm_canonicalize_ex(q.g, mode ? 0 : LM_CANON_EXACT, &st);
      if (!c) {
        log_graph("original", q.g);
        cr_assert_fail("graph %d: canonicalize: %s", gi, lm_last_error());
      }
      int ok = lm_graph_validate(c) == LM_OK;
      if (!ok) snprintf(err, sizeof err, "does not validate: %s", lm_last_error());
      ok = ok && run_ref(c, (uint64_t)gi, 1, &rb, err, sizeof err);
      /* rewrites marked as rounding may legitimately differ; the rest must be bit-exact */
      if (ok && st.rounding == 0) ok = results_match(&ra, &rb, BITWISE, err, sizeof err);
      if (ok) results_free(&rb);
      if (!ok) {
        log_graph("original", q.g);
        log_graph("canonical", c);
        cr_assert_fail("graph %d (%s mode, stats dead %d cse %d folded %d identities %d rounding %d): %s", gi,
                       mode ? "default" : "exact", st.dead, st.cse, st.folded, st.identities, st.rounding, err);
      }
      if (!mode) {
        cr_assert_eq(st.rounding, 0);
        exact_rewrites += st.identities;
        totals[0] += st.dead, totals[1] += st.cse, totals[2] += st.folded, totals[3] += st.identities;
      } else rounding_graphs += st.rounding > 0;
      lm_graph_free(c);
    }
    results_free(&ra);
    lm_graph_free(q.g);
  }
  /* the generator must actually exercise every pass */
  cr_expect_gt(totals[0], 50, "dead %d", totals[0]);
  cr_expect_gt(totals[1], 30, "cse %d", totals[1]);
  cr_expect_gt(totals[2], 50, "folded %d", totals[2]);
  cr_expect_gt(exact_rewrites, 50, "exact identities %d", exact_rewrites);
  cr_expect_gt(rounding_graphs, 10, "graphs with rounding rewrites %d", rounding_graphs);
  cr_log_info("200 graphs (exact mode): dead %d, cse %d, folded %d, identities %d; %d graphs with rounding rewrites",
              totals[0], totals[1], totals[2], totals[3], rounding_graphs);
}
