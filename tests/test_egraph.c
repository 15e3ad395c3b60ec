/* Tests of the search's e-graph (compiler/search/egraph.c) and of every rewrite rule
 * (compiler/search/rules.c):
 * - after every rebuild on random sequences of adds and unions, the e-graph's invariants hold
 *   (lm_eg_check: canonical hashcons, canonical children, parents, analysis at its fixed point)
 *   and its classes are exactly those of a brute-force congruence closure of the same unions;
 * - the pattern matcher finds exactly the matches a brute-force walk finds;
 * - every rule is sound on random kernels: all kernel-stage rules saturate a kernel's e-graph,
 *   candidates are extracted (random genomes in context, and exhaustively when few), emitted and
 *   run by the reference interpreter against the original kernel on random inputs away from
 *   zero. Candidates built with exact rules only must agree exactly (float ==, NaN = NaN);
 *   those with a rule marked LM_RULE_ROUNDING to rtol 1e-4 plus 1e-5 of the largest value.
 *   Plan-stage rules (kernel fusion) are checked on whole plans the same way. Every rule must
 *   have made nodes of at least two checked candidates, so no rule passes untested;
 * - terms survive their text form (what the tuning cache stores). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loopir.h"
#include "lumen/lumen.h"
#include "passes.h"
#include "render.h"
#include "search/search-impl.h"
#include "support/check.h"
#include "support/timeout.h"

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

/* ---------------------------------------------------------------- congruence closure */

typedef struct call {
  lm_enode n;    /* children are call indices */
  uint32_t cls;  /* class lm_eg_add returned */
} call;

/* analysis: the least attribute in the class */
static void min_make(void *ctx, lm_egraph *g, const lm_enode *n, void *out) {
  (void)ctx;
  uint32_t m = n->attr;
  for (int i = 0; i < n->n; i++) {
    uint32_t c = *(uint32_t *)lm_eg_data(g, n->c[i]);
    if (c < m) m = c;
  }
  *(uint32_t *)out = m;
}
static int min_join(void *ctx, void *into, const void *from) {
  (void)ctx;
  uint32_t *a = into;
  const uint32_t *b = from;
  if (*b < *a) {
    *a = *b;
    return 1;
  }
  return 0;
}

static size_t bf_find(size_t *uf, size_t i) {
  while (uf[i] != i) i = uf[i] = uf[uf[i]];
  return i;
}

/* The brute-force closure: explicit unions, then congruence to a fixed point. */
static void brute_force(const call *calls, size_t n, const size_t (*un)[2], size_t nun, size_t *uf) {
  for (size_t i = 0; i < n; i++) uf[i] = i;
  for (size_t u = 0; u < nun; u++) uf[bf_find(uf, un[u][0])] = bf_find(uf, un[u][1]);
  for (int changed = 1; changed;) {
    changed = 0;
    for (size_t i = 0; i < n; i++)
      for (size_t j = i + 1; j < n; j++) {
        const lm_enode *a = &calls[i].n, *b = &calls[j].n;
        if (a->op != b->op || a->attr != b->attr || a->n != b->n || bf_find(uf, i) == bf_find(uf, j)) continue;
        int same = 1;
        for (int k = 0; k < a->n && same; k++) same = bf_find(uf, a->c[k]) == bf_find(uf, b->c[k]);
        if (same) {
          uf[bf_find(uf, i)] = bf_find(uf, j);
          changed = 1;
        }
      }
  }
}

static void expect_same_partition(lm_egraph *g, const call *calls, size_t n, const size_t (*un)[2], size_t nun,
                                  int seed) {
  char why[256];
  cr_assert(lm_eg_check(g, why, sizeof why), "seed %d: invariant broken after rebuild: %s", seed, why);
  size_t *uf = malloc(n * sizeof *uf);
  cr_assert(uf);
  brute_force(calls, n, un, nun, uf);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) {
      int want = bf_find(uf, i) == bf_find(uf, j);
      int got = lm_eg_find(g, calls[i].cls) == lm_eg_find(g, calls[j].cls);
      cr_assert_eq(got, want, "seed %d: terms %zu and %zu: e-graph says %s, congruence closure says %s", seed, i, j,
                   got ? "equal" : "different", want ? "equal" : "different");
    }
  /* the analysis of each class is the least attribute over every term in it */
  for (size_t i = 0; i < n; i++) {
    uint32_t want = UINT32_MAX;
    for (size_t j = 0; j < n; j++)
      if (bf_find(uf, i) == bf_find(uf, j) && calls[j].n.attr < want) want = calls[j].n.attr;
    uint32_t got = *(uint32_t *)lm_eg_data(g, calls[i].cls);
    cr_assert_leq(got, want, "seed %d: analysis of term %zu is %u, a term of its class has %u", seed, i, got, want);
  }
  free(uf);
}

Test(egraph, classes_equal_brute_force_congruence_closure_after_every_rebuild) {
  for (int seed = 1; seed <= 40; seed++) {
    check_rng r = check_rng_new((uint64_t)seed * 7919);
    lm_eg_analysis an = {sizeof(uint32_t), min_make, min_join, NULL};
    lm_egraph *g = lm_eg_new(&an);
    cr_assert(g);
    call calls[160];
    size_t n = 0, nun = 0, rebuilds = 0, merged = 0;
    size_t un[200][2];
    for (int step = 0; step < 300; step++) {
      uint64_t a = check_next(&r) % 100;
      if ((a < 45 || n < 6) && n < LM_COUNTOF(calls)) { /* add: a leaf, or an op over earlier terms */
        call *c = &calls[n];
        memset(c, 0, sizeof *c);
        int arity = n < 4 ? 0 : (int)(check_next(&r) % 4);
        c->n.op = (uint16_t)(arity + 1);
        c->n.n = (uint8_t)arity;
        c->n.attr = (uint32_t)(check_next(&r) % (arity ? 2 : 5));
        lm_enode e = c->n;
        for (int k = 0; k < arity; k++) {
          c->n.c[k] = (uint32_t)(check_next(&r) % n);
          e.c[k] = calls[c->n.c[k]].cls;
        }
        c->cls = lm_eg_add(g, &e);
        cr_assert_neq(c->cls, LM_EG_NONE);
        n++;
      } else if (a < 85 && n >= 2 && nun < LM_COUNTOF(un)) {
        size_t i = check_next(&r) % n, j = check_next(&r) % n;
        un[nun][0] = i;
        un[nun][1] = j;
        nun++;
        merged += (size_t)lm_eg_union(g, calls[i].cls, calls[j].cls);
      } else {
        lm_eg_rebuild(g);
        rebuilds++;
        expect_same_partition(g, calls, n, (const size_t(*)[2])un, nun, seed);
      }
    }
    lm_eg_rebuild(g);
    expect_same_partition(g, calls, n, (const size_t(*)[2])un, nun, seed);
    cr_assert_gt(rebuilds, 5);
    cr_assert_gt(merged, 5, "seed %d: the test merged too little to mean anything", seed);
    lm_eg_free(g);
  }
}

/* ---------------------------------------------------------------- e-matching */

typedef struct mcount {
  size_t n;
  uint32_t roots[4096];
} mcount;

static int count_match(void *ctx, const lm_match *m) {
  mcount *c = ctx;
  if (c->n < LM_COUNTOF(c->roots)) c->roots[c->n] = m->root;
  c->n++;
  return 1;
}

Test(egraph, ematch_finds_exactly_the_brute_force_matches) {
  /* op 2 = binary f, op 1 = leaf; pattern f(f(?x, ?y), ?x) */
  check_rng r = check_rng_new(99);
  lm_egraph *g = lm_eg_new(NULL);
  uint32_t cls[120];
  size_t n = 0;
  for (; n < 8; n++) {
    lm_enode e = {.op = 1, .attr = (uint32_t)n % 3};
    cls[n] = lm_eg_add(g, &e);
  }
  for (; n < LM_COUNTOF(cls); n++) {
    lm_enode e = {.op = 2, .n = 2, .c = {cls[check_next(&r) % n], cls[check_next(&r) % n]}};
    cls[n] = lm_eg_add(g, &e);
    if (check_next(&r) % 5 == 0) lm_eg_union(g, cls[check_next(&r) % n], cls[check_next(&r) % n]);
  }
  lm_eg_rebuild(g);
  static const lm_pat pat[] = {{.op = 2, .n = 2, .attr_any = 1, .c = {1, 2}},
                               {.op = 2, .n = 2, .attr_any = 1, .c = {2, 3}},
                               {.op = -1, .var = 0},
                               {.op = -1, .var = 1}};
  size_t total = 0, want = 0;
  for (size_t c = 0; c < g->nclasses; c++) {
    if (g->uf[c] != c) continue;
    mcount mc = {0};
    lm_eg_ematch(g, pat, 4, (uint32_t)c, count_match, &mc);
    total += mc.n;
    /* brute force: nodes f(a, b) of c, nodes f(x, y) of class a, with b == x */
    const lm_eg_vec *v = &g->cnodes[c];
    for (uint32_t i = 0; i < v->n; i++) {
      const lm_enode *o = lm_eg_node(g, v->v[i]);
      if (o->op != 2) continue;
      const lm_eg_vec *w = &g->cnodes[lm_eg_find(g, o->c[0])];
      for (uint32_t j = 0; j < w->n; j++) {
        const lm_enode *in = lm_eg_node(g, w->v[j]);
        if (in->op == 2 && lm_eg_find(g, in->c[0]) == lm_eg_find(g, o->c[1])) want++;
      }
    }
    cr_assert_eq(total, want, "class %zu: %zu matches, brute force finds %zu", c, total, want);
  }
  cr_assert_gt(want, 0, "the random e-graph has no match to find");
  lm_eg_free(g);
}

/* ---------------------------------------------------------------- rule soundness */

typedef struct tally {
  uint32_t checked[64];   /* candidates checked whose nodes or merged classes come from the rule */
  uint32_t exercised[64]; /* candidates that differ from the original, checked with the rule alone */
  int nrules;
  size_t candidates, rounding;
  size_t grouped, staged; /* candidates mapped to work-groups; of those, with shared-memory copies */
} tally;

static lm_graph_t *canon(lm_graph_t *g) {
  cr_assert_eq(lm_graph_validate(g), LM_OK, "graph: %s", lm_last_error());
  lm_graph_t *c = lm_canonicalize_ex(g, LM_CANON_EXACT, NULL);
  cr_assert(c, "canonicalise: %s", lm_last_error());
  lm_graph_free(g);
  return c;
}

typedef struct bufs {
  size_t n;
  float **b;
  size_t *count;
} bufs;

static bufs bufs_new(const lm_plan *p, uint64_t seed) {
  bufs s = {p->nbufs, calloc(p->nbufs + 1, sizeof(float *)), calloc(p->nbufs + 1, sizeof(size_t))};
  check_rng r = check_rng_new(seed);
  for (size_t i = 0; i < p->nbufs; i++) {
    s.count[i] = (size_t)lm_x_eval(&p->g->x, p->bufs[i].numel, NULL, NULL);
    s.b[i] = malloc((s.count[i] + 1) * sizeof(float));
    check_fill(&r, s.b[i], s.count[i], -1.0, 1.0, 0.1);
  }
  return s;
}

static void bufs_free(bufs *s) {
  for (size_t i = 0; i < s->n; i++) free(s->b[i]);
  free(s->b);
  free(s->count);
}

static void bufs_copy(bufs *dst, const bufs *src) {
  for (size_t i = 0; i < src->n; i++) memcpy(dst->b[i], src->b[i], src->count[i] * sizeof(float));
}

/* Equal (exact) or within tolerance (rounding); NaN only where the reference has NaN. */
static int agree(const bufs *got, const bufs *want, int rounding, char *why, size_t cap) {
  for (size_t i = 0; i < want->n; i++) {
    double scale = 0;
    for (size_t j = 0; j < want->count[i]; j++)
      if (isfinite(want->b[i][j]) && fabs(want->b[i][j]) > scale) scale = fabs(want->b[i][j]);
    for (size_t j = 0; j < want->count[i]; j++) {
      float a = got->b[i][j], b = want->b[i][j];
      if (isnan(a) && isnan(b)) continue;
      int ok = rounding ? fabs((double)a - b) <= 1e-4 * fabs(b) + 1e-5 * scale : a == b;
      if (!ok) {
        snprintf(why, cap, "buffer %zu element %zu: %.9g, the original gives %.9g", i, j, (double)a, (double)b);
        return 0;
      }
    }
  }
  return 1;
}

static void run_kernels(const lm_plan *p, const lm_kernel *ks, size_t n, bufs *b) {
  for (size_t i = 0; i < n; i++) OK(sk_interpret(p, &ks[i], b->b, b->count, NULL, 42, 3));
}

static char *plan_text(const lm_plan *p, const lm_kernel *ks, size_t n) {
  lm_sb sb = {0};
  for (size_t i = 0; i < n; i++) {
    char *t = sk_kernel_text(p, &ks[i]);
    lm_sb_puts(&sb, t);
    lm_free(t);
  }
  return lm_sb_take(&sb);
}

/* Runs the candidate (kernels replacing the plan's [k0, k0 + nold)) and the original on the same
 * inputs; returns 1 when the candidate's code differs from the original's. */
static int check_candidate(const lm_plan *p, size_t k0, size_t nold, const lm_kernel *ks, size_t n, const bufs *in,
                           const char *what, const char *term, uint64_t rules, int rounding, tally *t) {
  bufs want = bufs_new(p, 1), got = bufs_new(p, 1);
  bufs_copy(&want, in);
  bufs_copy(&got, in);
  run_kernels(p, p->kernels + k0, nold, &want);
  run_kernels(p, ks, n, &got);
  char why[200];
  if (!agree(&got, &want, rounding, why, sizeof why)) {
    char names[512] = "";
    int nr;
    const lm_rule *rl = sk_rules(&nr);
    for (int r = 0; r < nr; r++)
      if ((rules >> r) & 1) strcat(names, rl[r].name), strcat(names, " ");
    lm_sb sb = {0};
    lm_plan tmp = *p;
    tmp.kernels = (lm_kernel *)ks;
    tmp.nkernels = n;
    lm_plan_dump(&tmp, &sb);
    cr_assert_fail("%s: a candidate made by [%s] (%s) disagrees: %s\nterm %s\n%s", what, names,
                   rounding ? "rounding" : "exact", why, term, sb.s);
  }
  for (int r = 0; r < t->nrules; r++)
    if ((rules >> r) & 1) t->checked[r]++;
  t->candidates++;
  t->rounding += (size_t)rounding;
  int grouped = 0, staged = 0;
  for (size_t i = 0; i < n; i++) {
    grouped |= ks[i].group > 0;
    for (size_t j = 0; j < ks[i].nstmts; j++) staged |= ks[i].stmts[j].op == LM_S_BARRIER;
  }
  t->grouped += (size_t)grouped;
  t->staged += (size_t)staged;
  bufs_free(&want);
  bufs_free(&got);
  char *a = plan_text(p, p->kernels + k0, nold), *b = plan_text(p, ks, n);
  int differs = strcmp(a, b) != 0;
  lm_free(a);
  lm_free(b);
  return differs;
}

/* Rules of a term: those that made its nodes, and those whose unions merged its classes. */
static uint64_t term_rules(lm_sk *s, const sk_term *term, int *rounding) {
  uint64_t m = sk_term_rules(s, term, rounding);
  for (size_t i = 0; i < term->count; i++)
    if (term->src[i] != LM_EG_NONE) m |= s->eg->merged_by[lm_eg_find(s->eg, s->eg->node_cls[term->src[i]])];
  return m;
}

/* Saturates an e-graph (the rules of its stage, or rule `only` alone for two rounds) and checks
 * every distinct candidate drawn from root: the greedy one, `draws` random genomes, and every
 * combination when there are at most 256. */
static void check_egraph(lm_sk *s, uint32_t root, lm_plan *p, size_t k0, size_t nold, const bufs *in, int only,
                         int draws, tally *t, const char *what) {
  int nr;
  const lm_rule *rules = sk_rules(&nr);
  uint8_t enabled[64] = {0};
  for (int r = 0; r < nr; r++) enabled[r] = (uint8_t)(only < 0 ? sk_rule_stage_ok(s, r) : r == only);
  lm_run_limits lim = {.iterations = only < 0 ? 5 : 2, .nodes = 6000, .seconds = 5, .match_limit = 400,
                       .ban_length = 2, .enabled = enabled};
  lm_run_report rr = {0};
  lm_eg_run(s->eg, rules, nr, s, &lim, &rr);
  char why[256];
  cr_assert(lm_eg_check(s->eg, why, sizeof why), "%s: e-graph invariant after the rules: %s", what, why);
  size_t ncl = s->eg->nclasses, nreach = 0;
  double *cost = malloc((ncl + 1) * sizeof *cost);
  uint32_t *best = malloc((ncl + 1) * sizeof *best), *force = malloc((ncl + 1) * sizeof *force);
  uint32_t *classes = malloc((ncl + 1) * sizeof *classes);
  sk_greedy(s, cost, best);
  double space = sk_space(s, root, classes, &nreach);
  int exhaustive = space <= 256;
  uint64_t rng = 12345 + k0 * 31 + (uint64_t)(only + 1) * 7;
  /* GPU rules: a third more draws that prefer work-group loops (rarely drawn otherwise) */
  int gpu_draws = !exhaustive && s->gpu && s->stage == SK_STAGE_KERNEL ? draws / 3 : 0;
  int total = exhaustive ? (int)space : draws + 1 + gpu_draws;
  uint64_t *seen = calloc((size_t)total + 2, sizeof *seen);
  size_t nseen = 0;
  for (int d = 0; d < total; d++) {
    sk_term term;
    if (exhaustive) {
      for (size_t i = 0; i < ncl; i++) force[i] = LM_EG_NONE;
      uint64_t rem = (uint64_t)d;
      for (size_t q = 0; q < nreach; q++) {
        const lm_eg_vec *v = &s->eg->cnodes[classes[q]];
        force[classes[q]] = v->v[rem % v->n];
        rem /= v->n;
      }
    }
    lm_status st = exhaustive       ? sk_extract(s, root, best, force, NULL, 0, NULL, &term)
                   : d > draws ? sk_extract_preferring(s, root, best, &rng, SK_GROUP, NULL, &term)
                               : sk_extract(s, root, best, NULL, d ? &rng : NULL, 0, NULL, &term);
    if (st != LM_OK) continue;
    lm_kernel out[16];
    size_t n = 0;
    int emitted = 1;
    if (s->stage == SK_STAGE_PLAN) {
      for (uint32_t i = term.root; term.n[i].op == SK_SEQ && n < 16 && emitted; i = term.n[i].c[1]) {
        const lm_enode *kn = &term.n[term.n[i].c[0]];
        emitted = sk_emit_kernel(s, &term, term.n[i].c[0], &p->kernels[kn->attr], &out[n]) == LM_OK;
        n += (size_t)emitted;
      }
    } else {
      emitted = sk_emit_kernel(s, &term, term.root, &p->kernels[k0], &out[0]) == LM_OK;
      n = (size_t)emitted;
    }
    if (emitted) {
      char *text = plan_text(p, out, n);
      uint64_t h = lm_hash_bytes(text, strlen(text), 0);
      lm_free(text);
      int dup = 0;
      for (size_t q = 0; q < nseen && !dup; q++) dup = seen[q] == h;
      if (!dup) {
        seen[nseen++] = h;
        int rounding;
        uint64_t rm = term_rules(s, &term, &rounding);
        char *tt = sk_term_print(s, &term);
        for (size_t i = 0; i < n; i++) { /* the C renderer takes it too (OpenCL C: work-groups) */
          char *src = lm_render_kernel(p, &out[i], out[i].group ? LM_DIALECT_OPENCL : LM_DIALECT_C);
          cr_assert(src, "%s: a candidate does not render: %s\nterm %s", what, lm_last_error(), tt);
          lm_free(src);
        }
        if (only >= 0) rounding = (rules[only].flags & LM_RULE_ROUNDING) != 0;
        int differs = check_candidate(p, k0, nold, out, n, in, what, tt, rm, rounding, t);
        if (only >= 0 && differs) t->exercised[only]++;
        lm_free(tt);
      }
    }
    for (size_t i = 0; i < n; i++) lm_kernel_free(&out[i]);
    sk_term_free(&term);
  }
  free(seen);
  free(cost);
  free(best);
  free(force);
  free(classes);
}

static void check_kernel(lm_plan *p, uint32_t ki, const bufs *in, int only, int draws, tally *t, const char *what) {
  lm_sk s;
  OK(sk_init(&s, p));
  s.stage = SK_STAGE_KERNEL;
  s.gpu = 1; /* work-group mapping too: the interpreter runs a work-group's threads in order */
  uint32_t root = sk_add_kernel(&s, ki, 0);
  cr_assert_neq(root, LM_EG_NONE, "%s: kernel %u not convertible: %s", what, ki, s.why);
  check_egraph(&s, root, p, ki, 1, in, only, draws, t, what);
  sk_free(&s);
}

/* The whole plan as one term (a SEQ list of kernels) in a plan-stage e-graph. */
static uint32_t plan_term(lm_sk *s, lm_plan *p) {
  OK(sk_init(s, p));
  s->stage = SK_STAGE_PLAN;
  s->rounding = 0;
  uint32_t base = 0, *ks = calloc(p->nkernels + 1, sizeof *ks);
  for (uint32_t i = 0; i < p->nkernels; i++) {
    ks[i] = sk_add_kernel(s, i, base);
    cr_assert_neq(ks[i], LM_EG_NONE, "%s", s->why);
    base += (uint32_t)p->kernels[i].nloops;
  }
  lm_enode nop = {.op = SK_NOP};
  uint32_t list = lm_eg_add(s->eg, &nop);
  for (size_t i = p->nkernels; i-- > 0;) {
    lm_enode sq = {.op = SK_SEQ, .n = 2, .c = {ks[i], list}};
    list = lm_eg_add(s->eg, &sq);
  }
  free(ks);
  return list;
}

static void check_plan(lm_plan *p, const bufs *in, int only, int draws, tally *t, const char *what) {
  lm_sk s;
  uint32_t root = plan_term(&s, p);
  check_egraph(&s, root, p, 0, p->nkernels, in, only, draws, t, what);
  sk_free(&s);
}

/* The plan after kernel fusion alone (kernels holding several loops) or with loop fusion too
 * (loops holding several stores): inputs for fission, fusion and kernel-split. */
static lm_plan *fused_plan(lm_plan *p, int loops) {
  lm_sk s;
  uint32_t root = plan_term(&s, p);
  int nr;
  const lm_rule *rules = sk_rules(&nr);
  uint8_t enabled[64] = {0};
  for (int r = 0; r < nr; r++)
    enabled[r] = !strcmp(rules[r].name, "kernel-fuse") || (loops && !strcmp(rules[r].name, "fusion"));
  lm_run_limits lim = {.iterations = 8, .nodes = 20000, .seconds = 5, .match_limit = 10000, .ban_length = 1,
                       .enabled = enabled};
  lm_run_report rr = {0};
  lm_eg_run(s.eg, rules, nr, &s, &lim, &rr);
  size_t ncl = s.eg->nclasses;
  double *cost = malloc((ncl + 1) * sizeof *cost);
  uint32_t *best = malloc((ncl + 1) * sizeof *best);
  sk_greedy(&s, cost, best);
  sk_term term;
  OK(sk_extract(&s, root, best, NULL, NULL, 0, NULL, &term));
  lm_plan *q = calloc(1, sizeof *q);
  *q = *p;
  q->bufs = lm_malloc(p->nbufs * sizeof *q->bufs);
  memcpy(q->bufs, p->bufs, p->nbufs * sizeof *q->bufs);
  q->bufcap = p->nbufs;
  q->copies = NULL;
  q->ncopies = q->copycap = 0;
  q->kernels = lm_calloc(p->nkernels + 1, sizeof *q->kernels);
  q->nkernels = 0;
  q->kernelcap = p->nkernels + 1;
  for (uint32_t i = term.root; term.n[i].op == SK_SEQ; i = term.n[i].c[1]) {
    const lm_enode *kn = &term.n[term.n[i].c[0]];
    OK(sk_emit_kernel(&s, &term, term.n[i].c[0], &p->kernels[kn->attr], &q->kernels[q->nkernels]));
    q->nkernels++;
  }
  cr_assert_lt(q->nkernels, p->nkernels, "kernel fusion fused nothing");
  sk_term_free(&term);
  free(cost);
  free(best);
  sk_free(&s);
  /* lm_plan_free frees with lm_free: move the struct into lumen's allocation funnel */
  lm_plan *r = lm_malloc(sizeof *r);
  *r = *q;
  free(q);
  return r;
}

static lm_plan *lower(lm_graph_t *g) {
  lm_plan *p = NULL;
  OK(lm_lower(g, &p));
  return p;
}

static lm_tensor input(lm_graph_t *g, const char *name, int64_t a, int64_t b) {
  lm_dim d[2] = {a, b};
  return lm_input(g, name, LM_ROLE_DATA, b ? 2 : 1, d);
}

/* A hand-built kernel: y[i, j] = (x*1 + 0) + max_r x + sum_r x, with patterns the canonicaliser
 * would have folded (x*1, x + 0, reductions of a value that does not depend on the loop). */
static lm_plan *handmade(lm_graph_t **gout) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = input(g, "x", 16, 32);
  lm_output(lm_add_scalar(x, 0.5f), "y");
  lm_graph_t *c = canon(g);
  lm_plan *p = lower(c);
  lm_kernel *k = &p->kernels[0];
  uint32_t bx = k->bufs[0], by = k->bufs[1];
  for (size_t i = 0; i < k->nloops; i++) lm_free(k->loops[i].body.items);
  lm_free(k->loops), lm_free(k->stmts), lm_free(k->root.items);
  k->loops = NULL, k->stmts = NULL, k->root.items = NULL;
  k->nloops = k->loopcap = k->nstmts = k->stmtcap = k->root.n = k->root.cap = 0;
  lm_exprs *xp = &c->x;
  int32_t i = lm_kernel_add_loop(k, -1, lm_x_const(xp, 16), LM_L_PARALLEL);
  int32_t j = lm_kernel_add_loop(k, i, lm_x_const(xp, 32), LM_L_PARALLEL);
  k->npar = 2;
  lm_expr idx = lm_x_add(xp, lm_x_mul(xp, lm_x_var(xp, i), lm_x_const(xp, 32)), lm_x_var(xp, j));
  lm_expr one = lm_x_const(xp, 1);
  uint32_t ld = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_LOAD, .loop = j, .buf = bx, .idx = idx, .valid = one}, -1);
  uint32_t c1 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_CONST, .loop = -1, .f = 1.0f}, i);
  uint32_t c0 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_CONST, .loop = -1, .f = 0.0f}, i);
  uint32_t m1 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_MUL, .loop = j, .a = ld, .b = c1}, -1);
  uint32_t a0 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ADD, .loop = j, .a = m1, .b = c0}, -1);
  uint32_t am = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ACC, .loop = j, .f = -INFINITY}, -1);
  int32_t r1 = lm_kernel_add_loop(k, j, lm_x_const(xp, 4), LM_L_SERIAL);
  lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ACC_MAX, .loop = r1, .a = am, .b = ld}, -1);
  uint32_t as = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ACC, .loop = j, .f = 0.0f}, -1);
  int32_t r2 = lm_kernel_add_loop(k, j, lm_x_const(xp, 8), LM_L_SERIAL);
  lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ACC_SUM, .loop = r2, .a = as, .b = ld}, -1);
  uint32_t s1 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ADD, .loop = j, .a = a0, .b = am}, -1);
  uint32_t s2 = lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_ADD, .loop = j, .a = s1, .b = as}, -1);
  lm_kernel_add_stmt(k, &(lm_stmt){.op = LM_S_STORE, .loop = j, .a = s2, .buf = by, .idx = idx, .valid = one}, -1);
  *gout = c;
  return p;
}

typedef struct instance {
  const char *what;
  lm_graph_t *g;
  lm_plan *p;
  bufs in;
  int plan_level; /* checked as a whole plan (plan-stage rules) rather than kernel by kernel */
} instance;

/* The kernels and plans every rule is tried on. */
static size_t instances(instance *out) {
  size_t n = 0;
  {
    lm_graph_t *g = lm_graph_new(); /* a dense layer: loops, tiles, joint and laned reductions */
    lm_tensor a = input(g, "a", 8, 32), b = input(g, "b", 32, 32), bias = input(g, "bias", 32, 0);
    lm_output(lm_relu(lm_add(lm_matmul(a, b), lm_broadcast_to(bias, 2, (lm_dim[]){8, 32}))), "y");
    out[n++] = (instance){.what = "dense layer", .g = canon(g)};
  }
  {
    lm_graph_t *g = lm_graph_new(); /* softmax and log-softmax rows */
    lm_tensor x = input(g, "x", 8, 32);
    lm_output(lm_softmax(x, 1), "s");
    lm_output(lm_log_softmax(x, 0), "l");
    out[n++] = (instance){.what = "softmax", .g = canon(g)};
  }
  {
    lm_graph_t *g = lm_graph_new(); /* algebra; a sum over a broadcast axis */
    lm_tensor x = input(g, "x", 16, 16), y = input(g, "y", 16, 16), z = input(g, "z", 16, 16);
    lm_tensor f = lm_add(lm_add(lm_mul(x, y), lm_mul(z, y)), x);
    lm_tensor e = lm_mul(lm_exp2(x), lm_exp2(lm_mul(y, z)));
    lm_tensor q = lm_add(lm_log2(lm_exp2(y)), lm_recip(lm_recip(z)));
    lm_tensor w = lm_mul(lm_mul(lm_recip(lm_mul(x, y)), z), x);
    lm_output(lm_add(lm_add(f, e), lm_add(q, w)), "o");
    lm_output(lm_sum_reduce(lm_expand(input(g, "v", 16, 0), 1, 8), 1), "bs");
    out[n++] = (instance){.what = "algebra", .g = canon(g)};
  }
  {
    lm_graph_t *g;
    lm_plan *p = handmade(&g);
    out[n++] = (instance){.what = "handmade", .g = g, .p = p};
  }
  {
    lm_graph_t *g = lm_graph_new(); /* independent elementwise outputs over one domain */
    lm_tensor x = input(g, "x", 64, 0), y = input(g, "y", 64, 0), z = input(g, "z", 32, 2);
    lm_output(lm_mul(x, y), "a");
    lm_output(lm_add(x, lm_sqrt(lm_abs(y))), "b");
    lm_output(lm_mul_scalar(z, 3.0f), "c");
    lm_output(lm_exp2(y), "d");
    lm_graph_t *c = canon(g);
    lm_plan *p = lower(c);
    out[n++] = (instance){.what = "plan", .g = c, .p = p, .plan_level = 1};
    out[n++] = (instance){.what = "kernel-fused plan", .g = c, .p = fused_plan(p, 0), .plan_level = 1};
    out[n++] = (instance){.what = "kernel-fused kernels", .g = c, .p = fused_plan(p, 0)};
    out[n++] = (instance){.what = "loop-fused kernels", .g = c, .p = fused_plan(p, 1)};
  }
  for (size_t i = 0; i < n; i++) {
    if (!out[i].p) out[i].p = lower(out[i].g);
    out[i].in = bufs_new(out[i].p, 7 + i);
  }
  return n;
}

static void instances_free(instance *in, size_t n) {
  for (size_t i = 0; i < n; i++) {
    bufs_free(&in[i].in);
    lm_plan_free(in[i].p);
  }
  for (size_t i = 0; i < n; i++) { /* graphs are shared by several instances */
    int first = 1;
    for (size_t j = 0; j < i; j++) first &= in[j].g != in[i].g;
    if (first) lm_graph_free(in[i].g);
  }
}

static void check_instance(instance *it, int only, int draws, tally *t) {
  if (it->plan_level) {
    lm_sk probe = {.stage = SK_STAGE_PLAN};
    if (only < 0 || sk_rule_stage_ok(&probe, only)) check_plan(it->p, &it->in, only, draws, t, it->what);
    return;
  }
  lm_sk probe = {.stage = SK_STAGE_KERNEL, .rounding = 1, .gpu = 1};
  if (only >= 0 && !sk_rule_stage_ok(&probe, only)) return;
  for (uint32_t k = 0; k < it->p->nkernels; k++)
    if (!it->p->kernels[k].nlocals) check_kernel(it->p, k, &it->in, only, draws, t, it->what);
}

Test(rules, each_rule_alone_is_sound_and_exercised, .timeout = LM_TIMEOUT(280)) {
  tally t = {0};
  int n;
  const lm_rule *rules = sk_rules(&n);
  t.nrules = n;
  cr_assert_leq(n, 64);
  instance in[16];
  size_t ni = instances(in);
  for (int r = 0; r < n; r++)
    for (size_t i = 0; i < ni; i++) check_instance(&in[i], r, 40, &t);
  instances_free(in, ni);
  char missing[512] = "";
  for (int r = 0; r < n; r++) {
    cr_log_info("rule %-14s alone: %u candidates differing from the original, all equal to it", rules[r].name,
                t.exercised[r]);
    if (!t.exercised[r]) strcat(missing, rules[r].name), strcat(missing, " ");
  }
  cr_assert(!missing[0], "rules that changed no kernel of the instances (so were not tested): %s", missing);
}

Test(rules, all_rules_together_give_only_correct_candidates, .timeout = LM_TIMEOUT(280)) {
  tally t = {0};
  sk_rules(&t.nrules);
  instance in[16];
  size_t ni = instances(in);
  for (size_t i = 0; i < ni; i++) check_instance(&in[i], -1, 100, &t);
  instances_free(in, ni);
  cr_log_info("%zu candidates checked, %zu of them with rounding", t.candidates, t.rounding);
  cr_assert_gt(t.candidates, 300, "too few candidates to mean anything");
  cr_assert_gt(t.rounding, 0);
  cr_assert_gt(t.candidates - t.rounding, 50);
  cr_log_info("%zu candidates mapped to work-groups, %zu of them with shared-memory copies", t.grouped, t.staged);
  cr_assert_geq(t.grouped, 2, "only %zu candidates mapped loops to work-groups", t.grouped);
}

/* ---------------------------------------------------------------- text form */

Test(terms, text_form_round_trips_to_the_same_kernel) {
  lm_graph_t *g0 = lm_graph_new();
  lm_tensor a = input(g0, "a", 16, 32), b = input(g0, "b", 32, 64);
  lm_output(lm_matmul(a, b), "c");
  lm_graph_t *g = canon(g0);
  lm_plan *p = lower(g);
  lm_sk s;
  OK(sk_init(&s, p));
  uint32_t root = sk_add_kernel(&s, 0, 0);
  cr_assert_neq(root, LM_EG_NONE);
  int nr;
  const lm_rule *rules = sk_rules(&nr);
  uint8_t enabled[64] = {0};
  for (int r = 0; r < nr; r++) enabled[r] = (uint8_t)sk_rule_stage_ok(&s, r);
  lm_run_limits lim = {.iterations = 5, .nodes = 5000, .seconds = 5, .match_limit = 400, .ban_length = 2,
                       .enabled = enabled};
  lm_run_report rr = {0};
  lm_eg_run(s.eg, rules, nr, &s, &lim, &rr);
  size_t ncl = s.eg->nclasses;
  double *cost = malloc((ncl + 1) * sizeof *cost);
  uint32_t *best = malloc((ncl + 1) * sizeof *best);
  sk_greedy(&s, cost, best);
  uint64_t rng = 77;
  int compared = 0;
  for (int d = 0; d < 30; d++) {
    sk_term t;
    if (sk_extract(&s, root, best, NULL, &rng, 0, NULL, &t) != LM_OK) continue;
    lm_kernel k1, k2;
    if (sk_emit_kernel(&s, &t, t.root, &p->kernels[0], &k1) != LM_OK) {
      sk_term_free(&t);
      continue;
    }
    char *text = sk_term_print(&s, &t);
    /* parse with a fresh context over the same kernel, as the cache does */
    lm_sk s2;
    OK(sk_init(&s2, p));
    cr_assert_neq(sk_add_kernel(&s2, 0, 0), LM_EG_NONE);
    sk_term t2;
    OK(sk_term_parse(&s2, text, &t2));
    OK(sk_emit_kernel(&s2, &t2, t2.root, &p->kernels[0], &k2));
    char *a1 = lm_render_kernel(p, &k1, LM_DIALECT_C), *a2 = lm_render_kernel(p, &k2, LM_DIALECT_C);
    cr_assert_str_eq(a1, a2, "term %s", text);
    compared++;
    lm_free(a1);
    lm_free(a2);
    lm_free(text);
    lm_kernel_free(&k1);
    lm_kernel_free(&k2);
    sk_term_free(&t2);
    sk_term_free(&t);
    sk_free(&s2);
  }
  cr_assert_gt(compared, 5);
  /* malformed text is refused, not misread */
  sk_term bad;
  cr_assert_neq(sk_term_parse(&s, "r3;load:0;mul:0:0,7;", &bad), LM_OK);
  cr_assert_neq(sk_term_parse(&s, "r0;loop:9/o0:0;", &bad), LM_OK);
  cr_assert_neq(sk_term_parse(&s, "garbage", &bad), LM_OK);
  free(cost);
  free(best);
  sk_free(&s);
  lm_plan_free(p);
  lm_graph_free(g);
}
