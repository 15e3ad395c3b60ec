/* Tests for the metal backend (compiler/backends/metal.c) and MSL validation without a Mac
 * (compiler/msl_check.c, compiler/msl_shim.h). No Apple machine runs these tests here, so:
 * - the real "metal" backend is compiled in every build and, off macOS, refuses to open with
 *   the documented message; "auto" does not pick it and says why (skipped while
 *   compiler/runtime.c's registry does not list &lm_backend_metal);
 * - MSL for every registered env's training iteration (lm_trainer_graphs: rollout scan, prep,
 *   GAE reverse scan, update) compiles under the shim;
 * - the validator refuses what Metal refuses (a write through a read-only buffer, `double`,
 *   misnumbered or too many [[buffer(n)]] slots), so these checks can fail;
 * - "metal-shim" (the metal backend's host code on an emulated device that runs the MSL kernels,
 *   compiled as C++, on the CPU) is compared with the ref interpreter: 120 random graphs (test_cpu.c's
 *   generator, 20 independent graphs packed per program) under three bindings of N and M, RAND
 *   bit for bit, and scans (fused into one kernel, and unfused: T steps in one command buffer with
 *   per-step buffer offsets and the assign copies between steps);
 * - one command buffer per run, and barriers only where dispatches depend on each other: the
 *   emulated device runs the dispatches between two barriers in REVERSE order, so a missing
 *   barrier changes results (shown directly on two dependent copies);
 * - a hand-written kernel with threadgroup memory and threadgroup_barrier (the renderer emits
 *   none yet) runs on the emulated device with one OS thread per work-item.
 * On macOS with a Metal GPU the last test runs the same random graphs on real Metal.
 *
 * Tolerance (as test_cpu.c): |got - ref| <= 2e-5 |ref| + 1e-5 S, where S >= 1 bounds the magnitude
 * of every value computed by sin, exp2 or log2 on the way to an output; values no transcendental
 * reaches must match bit for bit (the shim calls the same libm float functions as ref, with fp
 * contraction off on both sides). On real Metal every value gets the tolerance: precise:: math
 * is not libm. Outputs are NaN-poisoned before every read. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "graph-impl.h"
#include "loopir.h"
#include "lumen/lumen.h"
#include "lumen/train.h"
#include "msl_check.h"
#include "support/check.h"

#define RTOL 2e-5
#define ATOL 1e-5

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

static const char linux_message[] = "Metal is only available on macOS: Metal.framework not found";

/* ================================================================ the random graph generator */

enum {
  NSUB = 20,         /* random graphs per program */
  MAXPOOL = 64,      /* values per random graph */
  MAXIO = 512,       /* inputs or outputs per program */
  NUMEL_CAP = 3000,  /* elements of any tensor under the largest binding */
};

#define MAG_CAP 1e4 /* |values| stay below this */

/* The bindings every program runs under: (N, M). 70 is past one 64-wide block, not a multiple. */
static const int64_t bindings[][2] = {{3, 2}, {70, 5}, {1, 1}};
#define N_MAX 70
#define M_MAX 5

typedef struct val {
  lm_tensor t;
  double lo, hi; /* every element lies in [lo, hi] */
  double err;    /* largest magnitude of an inexact value on the way here (0 when exact) */
  int exact;     /* no sin/exp2/log2 upstream: both backends agree bit for bit */
  int id;        /* t<id> in the description */
  int input;     /* an input (data or state) */
} val;

typedef struct io {
  char name[24];
  double lo, hi; /* written values */
  int sub;
} io;

typedef struct outp {
  char name[24];
  double err;
  int exact;
  int sub;
  int state; /* a state input read back after the run */
} outp;

typedef struct sub {
  char prefix[8];
  int symbolic;
  lm_dim base[LM_MAX_RANK];
  int base_rank;
  val pool[MAXPOOL];
  int npool, nid, nin;
  uint8_t used[1024]; /* per value id: consumed by a later operation */
  char desc[6000];
  size_t len;
} sub;

typedef struct gen {
  lm_graph_t *g;
  check_rng r;
  lm_dim N, M;
  int64_t symmax[8]; /* per symbol number: the largest binding */
  sub subs[NSUB];
  io in[MAXIO];
  int nin;
  outp out[MAXIO];
  int nout;
} gen;

static int rnd(gen *G, int n) { return (int)(check_next(&G->r) % (uint64_t)n); }
static double unif(gen *G, double lo, double hi) { return check_uniform(&G->r, lo, hi); }
static int chance(gen *G, double p) { return unif(G, 0, 1) < p; }
static double mag(const val *v) { return fmax(fabs(v->lo), fabs(v->hi)); }

static void sub_log(sub *s, const char *fmt, ...) LM_PRINTF(2, 3);
static void sub_log(sub *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (s->len < sizeof s->desc) {
    int n = vsnprintf(s->desc + s->len, sizeof s->desc - s->len, fmt, ap);
    if (n > 0) s->len += (size_t)n;
    if (s->len > sizeof s->desc) s->len = sizeof s->desc;
  }
  va_end(ap);
}

static const char *dim_text(gen *G, lm_dim d, char *buf, size_t cap) { return lm_dim_str(G->g, d, buf, cap); }

/* A dimension's value under the largest binding. */
static int64_t dim_max(gen *G, lm_dim d) {
  if (d >= 0) return d;
  return lm_x_eval(&G->g->x, lm_dim_expr(G->g, d), NULL, G->symmax);
}

static int64_t numel_max(gen *G, int rank, const lm_dim *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++) n *= dim_max(G, dims[i]);
  return n;
}

static int shape_of(lm_tensor t, lm_dim *dims) {
  int r = lm_rank(t);
  for (int i = 0; i < r; i++) dims[i] = lm_dim_of(t, i);
  return r;
}

static void shape_log(gen *G, sub *s, int rank, const lm_dim *dims) {
  char b[64];
  sub_log(s, "[");
  for (int i = 0; i < rank; i++) sub_log(s, "%s%s", i ? "," : "", dim_text(G, dims[i], b, sizeof b));
  sub_log(s, "]");
}

static int is_one(lm_dim d) { return d == 1; }

/* numpy broadcasting of two shapes; 0 when they do not broadcast statically. */
static int broadcast_shape(gen *G, int ra, const lm_dim *a, int rb, const lm_dim *b, int *rank, lm_dim *out) {
  int r = ra > rb ? ra : rb;
  for (int i = 0; i < r; i++) {
    int ia = ra - r + i, ib = rb - r + i;
    lm_dim da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (lm_dim_equal(G->g, da, db)) out[i] = da;
    else if (is_one(da)) out[i] = db;
    else if (is_one(db)) out[i] = da;
    else return 0;
  }
  *rank = r;
  return 1;
}

static void expect_ok(gen *G, sub *s, lm_tensor t) {
  if (lm_tensor_ok(t)) return;
  lm_graph_validate(G->g);
  cr_assert_fail("graph %s: construction failed: %s\n%.*s", s->prefix, lm_last_error(), (int)s->len, s->desc);
}

static val *push(gen *G, sub *s, val v) {
  expect_ok(G, s, v.t);
  if (!v.exact) v.err = fmax(v.err, mag(&v));
  v.id = s->nid++;
  int slot = s->npool < MAXPOOL ? s->npool++ : rnd(G, MAXPOOL);
  s->pool[slot] = v;
  return &s->pool[slot];
}

/* The most recent value half of the time, else any. */
static val *use(sub *s, val *v) {
  if (v->id < (int)sizeof s->used) s->used[v->id] = 1;
  return v;
}

static int unused(const sub *s, const val *v) { return !v->input && v->id < (int)sizeof s->used && !s->used[v->id]; }

/* The most recent value 45% of the time, else one nothing consumed yet (30%), else any. */
static val *pick(gen *G, sub *s) {
  if (chance(G, 0.45)) return use(s, &s->pool[s->npool - 1]);
  if (chance(G, 0.55)) {
    int start = rnd(G, s->npool);
    for (int k = 0; k < s->npool; k++)
      if (unused(s, &s->pool[(start + k) % s->npool])) return use(s, &s->pool[(start + k) % s->npool]);
  }
  return use(s, &s->pool[rnd(G, s->npool)]);
}

static val *pick_where(gen *G, sub *s, int (*ok)(gen *, const val *)) {
  int start = rnd(G, s->npool);
  for (int k = 0; k < s->npool; k++) {
    val *v = &s->pool[(start + k) % s->npool];
    if (ok(G, v)) return use(s, v);
  }
  return NULL;
}

/* A data input of the given shape; values in [-2, 2] (signed) or [0.25, 3] (positive). */
static val new_input(gen *G, sub *s, int rank, const lm_dim *dims, int positive, lm_role role) {
  cr_assert(G->nin < MAXIO);
  io *in = &G->in[G->nin++];
  snprintf(in->name, sizeof in->name, "%s%s%d", s->prefix, role == LM_ROLE_STATE ? "s" : "x", s->nin++);
  in->lo = positive ? 0.25 : -2.0;
  in->hi = positive ? 3.0 : 2.0;
  in->sub = (int)(s - G->subs);
  val v = {.t = lm_input(G->g, in->name, role, rank, dims), .lo = in->lo, .hi = in->hi, .exact = 1, .input = 1};
  val *p = push(G, s, v);
  sub_log(s, "  t%d = %s %s", p->id, role == LM_ROLE_STATE ? "state" : "input", in->name);
  shape_log(G, s, rank, dims);
  sub_log(s, " in [%g, %g]\n", in->lo, in->hi);
  return *p;
}

/* The base shape with leading axes dropped and some axes set to 1 (numpy broadcasting). */
static int broadcast_variant(gen *G, const lm_dim *base, int rank, lm_dim *out) {
  int drop = rank && chance(G, 0.4) ? rnd(G, rank + 1) : 0, r = 0;
  for (int i = drop; i < rank; i++) out[r++] = chance(G, 0.3) ? 1 : base[i];
  return r;
}

static void interval_mul(double alo, double ahi, double blo, double bhi, double *lo, double *hi) {
  double p[4] = {alo * blo, alo * bhi, ahi * blo, ahi * bhi};
  *lo = *hi = p[0];
  for (int i = 1; i < 4; i++) *lo = fmin(*lo, p[i]), *hi = fmax(*hi, p[i]);
}

/* A result value combining a and b (exactness, error scale). */
static val combine(const val *a, const val *b) {
  val r = {0};
  r.exact = a->exact && (!b || b->exact);
  r.err = fmax(a->err, b ? b->err : 0);
  return r;
}

/* x * x + c with c in [0.25, 1]: positive and exact when x is. */
static val *make_positive(gen *G, sub *s, const val *a) {
  if (mag(a) > 90) return NULL;
  float c = (float)unif(G, 0.25, 1.0);
  val r = combine(a, a);
  r.t = lm_add(lm_mul(a->t, a->t), lm_const(G->g, c));
  double sq_lo = a->lo > 0 ? a->lo * a->lo : a->hi < 0 ? a->hi * a->hi : 0;
  r.lo = sq_lo + c;
  r.hi = mag(a) * mag(a) + c;
  int aid = a->id;
  val *p = push(G, s, r);
  sub_log(s, "  t%d = t%d * t%d + %.9g\n", p->id, aid, aid, (double)c);
  return p;
}

static const char *const unary_names[] = {"sin", "exp2", "log2", "sqrt", "recip"};

static int op_unary(gen *G, sub *s) {
  val *a = pick(G, s);
  int which = rnd(G, 5);
  val r;
  switch (which) {
  case 0: /* sin */
    if (mag(a) > 100) return 0;
    r = combine(a, NULL);
    r.t = lm_sin(a->t);
    r.lo = -1, r.hi = 1, r.exact = 0;
    break;
  case 1: /* exp2 */
    if (a->hi > 6 || a->lo < -12) return 0;
    r = combine(a, NULL);
    r.t = lm_exp2(a->t);
    r.lo = exp2(a->lo), r.hi = exp2(a->hi), r.exact = 0;
    break;
  case 2: /* log2 of values >= 0.05 */
    if (a->lo < 0.05 && !(a = make_positive(G, s, a))) return 0;
    r = combine(a, NULL);
    r.t = lm_log2(a->t);
    r.lo = log2(a->lo), r.hi = log2(a->hi), r.exact = 0;
    break;
  case 3: /* sqrt of values >= 0.01 (or exact values >= 0) */
    if (!(a->lo >= 0.01 || (a->lo >= 0 && a->exact)) && !(a = make_positive(G, s, a))) return 0;
    r = combine(a, NULL);
    r.t = lm_sqrt(a->t);
    r.lo = sqrt(a->lo), r.hi = sqrt(a->hi);
    break;
  default: /* recip of values away from zero */
    if (!(a->lo >= 0.1 || a->hi <= -0.1) && !(a = make_positive(G, s, a))) return 0;
    r = combine(a, NULL);
    r.t = lm_recip(a->t);
    r.lo = 1 / a->hi, r.hi = 1 / a->lo;
    break;
  }
  int aid = a->id;
  val *p = push(G, s, r);
  sub_log(s, "  t%d = %s(t%d)\n", p->id, unary_names[which], aid);
  return 1;
}

/* A partner for a binary op with `a`: a constant, a fresh input of a broadcastable shape, a
 * pool value that broadcasts with a, or a itself. `need_exact`: only exact partners. */
typedef struct partner {
  val v;
  char text[48];
} partner;

static int find_partner(gen *G, sub *s, const val *a, int need_exact, int positive_away, double clo, double chi,
                        partner *out) {
  lm_dim da[LM_MAX_RANK], db[LM_MAX_RANK], dr[LM_MAX_RANK];
  int ra = shape_of(a->t, da), rr;
  int kind = rnd(G, 4);
  if (kind == 0) { /* constant */
    float c;
    do c = (float)unif(G, clo, chi);
    while (fabsf(c) < 0.05f);
    out->v = (val){.t = lm_const(G->g, c), .lo = c, .hi = c, .exact = 1};
    snprintf(out->text, sizeof out->text, "%.9g", (double)c);
    return 1;
  }
  if (kind == 1) { /* fresh input */
    int rb = broadcast_variant(G, da, ra, db);
    if (!broadcast_shape(G, ra, da, rb, db, &rr, dr) || numel_max(G, rr, dr) > NUMEL_CAP) return 0;
    out->v = new_input(G, s, rb, db, positive_away, LM_ROLE_DATA);
    snprintf(out->text, sizeof out->text, "t%d", out->v.id);
    return 1;
  }
  if (kind == 2) { /* another pool value that broadcasts */
    int start = rnd(G, s->npool);
    for (int k = 0; k < s->npool; k++) {
      val *b = &s->pool[(start + k) % s->npool];
      if (need_exact && !b->exact) continue;
      if (positive_away && !(b->lo >= 0.5 || b->hi <= -0.5)) continue;
      int rb = shape_of(b->t, db);
      if (!broadcast_shape(G, ra, da, rb, db, &rr, dr) || numel_max(G, rr, dr) > NUMEL_CAP) continue;
      out->v = *use(s, b);
      snprintf(out->text, sizeof out->text, "t%d", b->id);
      return 1;
    }
    return 0;
  }
  if (need_exact && !a->exact) return 0; /* a with itself: a shared operand */
  if (positive_away && !(a->lo >= 0.5 || a->hi <= -0.5)) return 0;
  out->v = *a;
  snprintf(out->text, sizeof out->text, "t%d", a->id);
  return 1;
}

static int op_add_mul(gen *G, sub *s) {
  val *a = pick(G, s);
  int mul = chance(G, 0.5);
  val av = *a;
  partner b;
  if (!find_partner(G, s, &av, 0, 0, -2, 2, &b)) return 0;
  val r = combine(&av, &b.v);
  if (mul) interval_mul(av.lo, av.hi, b.v.lo, b.v.hi, &r.lo, &r.hi);
  else r.lo = av.lo + b.v.lo, r.hi = av.hi + b.v.hi;
  if (mag(&r) > MAG_CAP) return 0;
  int swap = chance(G, 0.5);
  lm_tensor x = swap ? b.v.t : av.t, y = swap ? av.t : b.v.t;
  r.t = mul ? lm_mul(x, y) : lm_add(x, y);
  val *p = push(G, s, r);
  char at[16];
  snprintf(at, sizeof at, "t%d", av.id);
  sub_log(s, "  t%d = %s %s %s\n", p->id, swap ? b.text : at, mul ? "*" : "+", swap ? at : b.text);
  return 1;
}

static int is_exact(gen *G, const val *v) {
  (void)G;
  return v->exact;
}

/* a mod b and a < b on exact values only: the discontinuities must not see rounding noise. */
static int op_mod_lt(gen *G, sub *s) {
  val *a = pick(G, s);
  if (!a->exact && !(a = pick_where(G, s, is_exact))) return 0;
  val av = *a;
  int lt = chance(G, 0.5);
  partner b;
  if (lt) {
    double lo = fmin(av.lo, -0.5), hi = fmax(av.hi, 0.5);
    if (!find_partner(G, s, &av, 1, 0, lo, hi, &b)) return 0;
  } else {
    double c = chance(G, 0.5) ? unif(G, 0.5, 3) : -unif(G, 0.5, 3);
    if (!find_partner(G, s, &av, 1, 1, c < 0 ? c : 0.5, c < 0 ? -0.5 : c, &b)) return 0;
  }
  val r = combine(&av, &b.v);
  int swap = lt && chance(G, 0.5);
  if (lt) {
    r.lo = 0, r.hi = 1;
    r.t = swap ? lm_less_than(b.v.t, av.t) : lm_less_than(av.t, b.v.t);
  } else {
    double bm = mag(&b.v);
    r.lo = av.lo >= 0 ? 0 : -bm;
    r.hi = av.hi <= 0 ? 0 : bm;
    r.t = lm_mod(av.t, b.v.t);
  }
  val *p = push(G, s, r);
  char at[16];
  snprintf(at, sizeof at, "t%d", av.id);
  sub_log(s, "  t%d = %s %s %s\n", p->id, swap ? b.text : at, lt ? "<" : "mod", swap ? at : b.text);
  return 1;
}

static int has_rank(gen *G, const val *v) {
  (void)G;
  return lm_rank(v->t) >= 1;
}

/* Sum or max over a random axis; sometimes kept and broadcast back, sometimes reduced again. */
static int op_reduce(gen *G, sub *s) {
  val *a = pick(G, s);
  if (lm_rank(a->t) < 1 && !(a = pick_where(G, s, has_rank))) return 0;
  for (int again = 0; again < 3; again++) {
    val av = *a;
    int rank = lm_rank(av.t), axis = rnd(G, rank), max = chance(G, 0.4), keep = chance(G, 0.35);
    int64_t k = dim_max(G, lm_dim_of(av.t, axis));
    int symbolic = lm_dim_of(av.t, axis) < 0;
    val r = combine(&av, NULL);
    if (max) r.lo = av.lo, r.hi = av.hi;
    else if (symbolic) r.lo = fmin(av.lo, (double)k * av.lo), r.hi = fmax(av.hi, (double)k * av.hi);
    else r.lo = (double)k * av.lo, r.hi = (double)k * av.hi;
    if (mag(&r) > MAG_CAP) return again > 0;
    int form = rnd(G, 3); /* primitive, lm_sum/lm_max with keepdim, negative axis */
    if (form == 0 && !keep) r.t = max ? lm_max_reduce(av.t, axis) : lm_sum_reduce(av.t, axis);
    else r.t = max ? lm_max(av.t, axis - (form == 2 ? rank : 0), keep) : lm_sum(av.t, axis - (form == 2 ? rank : 0), keep);
    val *p = push(G, s, r);
    sub_log(s, "  t%d = %s(t%d, axis %d%s)\n", p->id, max ? "max" : "sum", av.id, axis, keep ? ", keepdim" : "");
    if (keep && chance(G, 0.6)) { /* broadcast back: a - r or a * r */
      val red = *p;
      int mul = chance(G, 0.3);
      val b = combine(&av, &red);
      if (mul) interval_mul(av.lo, av.hi, red.lo, red.hi, &b.lo, &b.hi);
      else b.lo = av.lo - red.hi, b.hi = av.hi - red.lo;
      if (mag(&b) > MAG_CAP) return 1;
      b.t = mul ? lm_mul(av.t, red.t) : lm_sub(av.t, red.t);
      val *q = push(G, s, b);
      sub_log(s, "  t%d = t%d %s t%d\n", q->id, av.id, mul ? "*" : "-", red.id);
      return 1;
    }
    if (lm_rank(p->t) < 1 || !chance(G, 0.35)) return 1;
    a = p; /* a reduction feeding a reduction */
  }
  return 1;
}

/* softmax-like: exp2(a - max a) / sum exp2(a - max a) over a random axis. */
static int op_softmax(gen *G, sub *s) {
  val *a = pick(G, s);
  if (lm_rank(a->t) < 1 || a->hi - a->lo > 12) return 0;
  val av = *a;
  int axis = rnd(G, lm_rank(av.t));
  int64_t k = dim_max(G, lm_dim_of(av.t, axis));
  lm_tensor z = lm_sub(av.t, lm_max(av.t, axis, 1));
  lm_tensor e = lm_exp2(z);
  val r = combine(&av, NULL);
  r.t = lm_mul(e, lm_recip(lm_sum(e, axis, 1)));
  r.lo = 0, r.hi = 1, r.exact = 0;
  r.err = fmax(r.err, fmax((double)k, 2 * mag(&av)));
  val *p = push(G, s, r);
  sub_log(s, "  t%d = softmax2(t%d, axis %d)\n", p->id, av.id, axis);
  return 1;
}

/* One random view step on v (in place); 0 when none applied. */
static int view_step(gen *G, sub *s, val *v) {
  lm_dim d[LM_MAX_RANK], nd[LM_MAX_RANK];
  int r = shape_of(v->t, d), nr = 0;
  char b1[64];
  switch (rnd(G, 6)) {
  case 0: { /* permute */
    if (r < 2) return 0;
    int perm[LM_MAX_RANK];
    for (int i = 0; i < r; i++) perm[i] = i;
    for (int i = r - 1; i > 0; i--) {
      int j = rnd(G, i + 1), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    v->t = lm_permute(v->t, perm);
    sub_log(s, " permute{");
    for (int i = 0; i < r; i++) sub_log(s, "%s%d", i ? "," : "", perm[i]);
    sub_log(s, "}");
    return 1;
  }
  case 1: { /* expand by a constant or a symbol */
    if (r >= 5) return 0;
    int axis = rnd(G, r + 1);
    lm_dim n = s->symbolic && chance(G, 0.3) ? (chance(G, 0.5) ? G->N : G->M) : 1 + rnd(G, 3);
    if (numel_max(G, r, d) * dim_max(G, n) > NUMEL_CAP) return 0;
    v->t = lm_expand(v->t, axis, n);
    sub_log(s, " expand(%d, %s)", axis, dim_text(G, n, b1, sizeof b1));
    return 1;
  }
  case 2: { /* slice a constant axis, never empty */
    int axis = -1;
    for (int k = 0, st = rnd(G, r + 1); k < r; k++)
      if (d[(st + k) % r] >= 2) axis = (st + k) % r;
    if (axis < 0) return 0;
    int64_t a = rnd(G, (int)d[axis]), e = a + 1 + rnd(G, (int)(d[axis] - a));
    v->t = lm_slice(v->t, axis, a, e);
    sub_log(s, " slice(%d, %lld, %lld)", axis, (long long)a, (long long)e);
    return 1;
  }
  case 3: { /* pad: zeros join the interval */
    if (!r) return 0;
    int axis = rnd(G, r);
    int64_t before = rnd(G, 3), after = rnd(G, 3);
    int64_t ext = dim_max(G, d[axis]);
    if (numel_max(G, r, d) / (ext ? ext : 1) * (ext + before + after) > NUMEL_CAP) return 0;
    v->t = lm_pad(v->t, axis, before, after);
    v->lo = fmin(v->lo, 0), v->hi = fmax(v->hi, 0);
    sub_log(s, " pad(%d, %lld, %lld)", axis, (long long)before, (long long)after);
    return 1;
  }
  case 4: { /* reshape: merge two neighbours, split a constant axis, add or drop a unit axis */
    int kind = rnd(G, 4);
    if (kind == 0 && r >= 2) {
      int a = rnd(G, r - 1);
      for (int i = 0; i < r; i++) {
        if (i == a + 1) continue;
        nd[nr++] = i == a ? (d[a] >= 0 && d[a + 1] >= 0 ? d[a] * d[a + 1] : lm_dim_mul(G->g, d[a], d[a + 1])) : d[i];
      }
    } else if (kind == 1 && r >= 1 && r < 5) {
      int a = rnd(G, r);
      int64_t f = 0;
      for (int64_t c = 2; d[a] >= 0 && c < d[a]; c++)
        if (d[a] % c == 0 && (!f || chance(G, 0.5))) f = c;
      if (!f) return 0;
      for (int i = 0; i < r; i++) {
        if (i == a) nd[nr++] = f, nd[nr++] = d[a] / f;
        else nd[nr++] = d[i];
      }
    } else if (kind == 2 && r < 5) {
      int a = rnd(G, r + 1);
      for (int i = 0, k = 0; i <= r; i++) nd[nr++] = i == a ? 1 : d[k++];
    } else if (kind == 3 && r >= 1) {
      int a = -1;
      for (int i = 0; i < r; i++)
        if (d[i] == 1) a = i;
      if (a < 0) return 0;
      for (int i = 0; i < r; i++)
        if (i != a) nd[nr++] = d[i];
    } else return 0;
    v->t = lm_reshape(v->t, nr, nd);
    sub_log(s, " reshape");
    shape_log(G, s, nr, nd);
    return 1;
  }
  default: { /* affine_mod */
    if (!r) return 0;
    int axis = rnd(G, r);
    int64_t a, b;
    if (d[axis] >= 1) a = 1 + rnd(G, (int)d[axis] + 2), b = rnd(G, 2 * (int)d[axis] + 1);
    else if (d[axis] < 0) a = 1 + rnd(G, 3), b = rnd(G, 5);
    else return 0;
    v->t = lm_affine_mod(v->t, axis, a, b);
    sub_log(s, " affine_mod(%d, %lld, %lld)", axis, (long long)a, (long long)b);
    return 1;
  }
  }
}

/* A chain of 1..3 views (then CONTIGUOUS half of the time). */
static int op_view(gen *G, sub *s) {
  val *a = pick(G, s);
  val v = *a;
  int aid = a->id, steps = 1 + rnd(G, 3), done = 0;
  size_t mark = s->len;
  sub_log(s, "  t%d = t%d", s->nid, aid);
  for (int i = 0; i < steps; i++) {
    done += view_step(G, s, &v);
    expect_ok(G, s, v.t);
  }
  if (!done) {
    s->len = mark;
    s->desc[mark] = 0;
    return 0;
  }
  if (chance(G, 0.5)) {
    v.t = lm_contiguous(v.t);
    sub_log(s, " contiguous");
  }
  sub_log(s, "\n");
  push(G, s, v);
  return 1;
}

static int op_rand(gen *G, sub *s) {
  val *a = pick(G, s);
  lm_dim d[LM_MAX_RANK];
  int r = shape_of(a->t, d);
  val v = {.t = lm_rand(G->g, r, d), .lo = 0x1p-33, .hi = 1, .exact = 1};
  val *p = push(G, s, v);
  sub_log(s, "  t%d = rand", p->id);
  shape_log(G, s, r, d);
  sub_log(s, "\n");
  return 1;
}

/* The same expression built twice, combined: canonicalisation must merge, not confuse them. */
static int op_shared(gen *G, sub *s) {
  val *a = pick(G, s);
  if (mag(a) > 100) return 0;
  val r = combine(a, NULL);
  r.t = lm_add(lm_sin(a->t), lm_mul(lm_sin(a->t), lm_sin(a->t)));
  r.lo = -1.25, r.hi = 2, r.exact = 0;
  int aid = a->id;
  val *p = push(G, s, r);
  sub_log(s, "  t%d = sin(t%d) + sin(t%d) * sin(t%d)\n", p->id, aid, aid, aid);
  return 1;
}

static int op_contiguous(gen *G, sub *s) {
  val *a = pick(G, s);
  val v = *a;
  v.t = lm_contiguous(a->t);
  int aid = a->id;
  val *p = push(G, s, v);
  sub_log(s, "  t%d = contiguous(t%d)\n", p->id, aid);
  return 1;
}

static void add_output(gen *G, sub *s, const val *v, lm_tensor t, int state) {
  cr_assert(G->nout < MAXIO);
  outp *o = &G->out[G->nout++];
  snprintf(o->name, sizeof o->name, "%so%d", s->prefix, G->nout);
  o->err = v->err;
  o->exact = v->exact;
  o->sub = (int)(s - G->subs);
  o->state = state;
  if (!state) OK(lm_output(t, o->name));
}

/* One random graph: inputs, 3..10 random operations, outputs (some through views) and
 * possibly a state with its assign. */
static void gen_sub(gen *G, sub *s, int index) {
  snprintf(s->prefix, sizeof s->prefix, "g%02d_", index);
  s->symbolic = chance(G, 0.4);
  s->base_rank = 1 + rnd(G, 3);
  for (int i = 0; i < s->base_rank; i++) s->base[i] = 1 + rnd(G, 5);
  if (s->symbolic) {
    s->base[rnd(G, s->base_rank)] = G->N;
    if (s->base_rank >= 2 && chance(G, 0.3)) {
      int i = rnd(G, s->base_rank);
      if (s->base[i] != G->N) s->base[i] = G->M;
    }
  }
  sub_log(s, "graph %s:\n", s->prefix);
  val x0 = new_input(G, s, s->base_rank, s->base, chance(G, 0.3), LM_ROLE_DATA);
  (void)x0;
  if (chance(G, 0.5)) {
    lm_dim d[LM_MAX_RANK];
    int r = broadcast_variant(G, s->base, s->base_rank, d);
    new_input(G, s, r, d, chance(G, 0.3), LM_ROLE_DATA);
  }
  val state = {0};
  char state_name[24] = "";
  int has_state = chance(G, 0.35);
  if (has_state) {
    state = new_input(G, s, s->base_rank, s->base, 0, LM_ROLE_STATE);
    snprintf(state_name, sizeof state_name, "%s", G->in[G->nin - 1].name);
  }
  int steps = chance(G, 0.25) ? 12 + rnd(G, 13) : 4 + rnd(G, 9); /* a quarter are deep */
  for (int done = 0, tries = 0; done < steps && tries < 60; tries++) {
    int ok;
    switch (rnd(G, 20)) {
    case 0: case 1: case 2: ok = op_unary(G, s); break;
    case 3: case 4: case 5: case 6: ok = op_add_mul(G, s); break;
    case 7: case 8: ok = op_mod_lt(G, s); break;
    case 9: case 10: case 11: ok = op_reduce(G, s); break;
    case 12: case 13: case 14: ok = op_view(G, s); break;
    case 15: ok = op_softmax(G, s); break;
    case 16: ok = op_rand(G, s); break;
    case 17: ok = op_shared(G, s); break;
    default: ok = op_contiguous(G, s); break;
    }
    done += ok;
  }
  /* outputs: the last value and up to two that nothing consumed; a third through views */
  for (int k = 0; k < 3; k++) {
    val v = s->pool[s->npool - 1];
    if (k > 0) {
      int start = rnd(G, s->npool), found = -1;
      for (int j = 0; j < s->npool && found < 0; j++)
        if (unused(s, &s->pool[(start + j) % s->npool]) && (start + j) % s->npool != s->npool - 1)
          found = (start + j) % s->npool;
      if (found < 0 || chance(G, 0.3)) continue;
      v = *use(s, &s->pool[found]);
    }
    sub_log(s, "  output %so%d = t%d", s->prefix, G->nout + 1, v.id);
    if (chance(G, 0.35)) {
      int steps2 = 1 + rnd(G, 2);
      for (int i = 0; i < steps2; i++) {
        view_step(G, s, &v);
        expect_ok(G, s, v.t);
      }
    }
    sub_log(s, "\n");
    add_output(G, s, &v, v.t, 0);
  }
  if (has_state) {
    /* the new state: an exact value of the state's shape, folded into (-2, 2) by fmod so the
     * next run sees values the generator planned for, bit-identical on both backends */
    val *cand = NULL;
    int start = rnd(G, s->npool);
    for (int k = 0; k < s->npool && !cand; k++) {
      val *v = &s->pool[(start + k) % s->npool];
      lm_dim d[LM_MAX_RANK];
      int r = shape_of(v->t, d), same = v->exact && v->id != state.id && r == s->base_rank;
      for (int i = 0; same && i < r; i++) same = lm_dim_equal(G->g, d[i], s->base[i]);
      if (same) cand = v;
    }
    lm_tensor src;
    if (cand) {
      src = cand->t;
      sub_log(s, "  assign %s = fmod(t%d, 2)", state_name, cand->id);
    } else {
      src = lm_add(lm_mul_scalar(state.t, 1.5f), lm_const(G->g, 0.375f));
      sub_log(s, "  assign %s = fmod(1.5 t%d + 0.375, 2)", state_name, state.id);
    }
    lm_tensor v = lm_mod(src, lm_const(G->g, 2.0f));
    if (s->base_rank >= 2 && chance(G, 0.3)) { /* through a view that gives back the shape */
      v = lm_transpose(lm_contiguous(lm_transpose(v, 0, 1)), 0, 1);
      sub_log(s, " via transpose-contiguous-transpose");
    }
    sub_log(s, "\n");
    expect_ok(G, s, v);
    OK(lm_assign(state.t, v));
    cr_assert(G->nout < MAXIO);
    outp *o = &G->out[G->nout++];
    snprintf(o->name, sizeof o->name, "%s", state_name);
    o->err = 0;
    o->exact = 1;
    o->sub = (int)(s - G->subs);
    o->state = 1;
  }
  /* sometimes read an input (old state included) back through a view */
  if (chance(G, 0.1)) {
    val v = s->pool[0];
    if (has_state && chance(G, 0.5)) v = state;
    sub_log(s, "  output %so%d = t%d", s->prefix, G->nout + 1, v.id);
    view_step(G, s, &v);
    expect_ok(G, s, v.t);
    sub_log(s, "\n");
    add_output(G, s, &v, v.t, 0);
  }
}

static void gen_program(gen *G, uint64_t seed) {
  memset(G, 0, sizeof *G);
  G->r = check_rng_new(seed);
  G->g = lm_graph_new();
  cr_assert(G->g);
  G->N = lm_sym(G->g, "N");
  G->M = lm_sym(G->g, "M");
  int sn = (int)lm_x_node(&G->g->x, lm_dim_expr(G->g, G->N))->v;
  int sm = (int)lm_x_node(&G->g->x, lm_dim_expr(G->g, G->M))->v;
  cr_assert(sn < 8 && sm < 8);
  G->symmax[sn] = N_MAX;
  G->symmax[sm] = M_MAX;
  for (int i = 0; i < NSUB; i++) gen_sub(G, &G->subs[i], i);
  OK(lm_graph_validate(G->g));
}


/* ================================================================ a program on a backend's ops */

/* The metal backends are driven through their vtable (compiler/runtime.c's registry is not
 * needed): the same calls lm_program_* makes, with buffers sized from the ref program. */
typedef struct vprog {
  const lm_backend_ops *ops;
  void *ctx, *exe;
  lm_graph_t *g; /* the graph prepared (owned) */
  int64_t syms[16];
  void **in, **out;
  size_t *in_n, *out_n;
  uint64_t seed, run;
} vprog;

/* Opens `ops`; 0 (and the reason in why) when the device is not available. */
static int vopen(const lm_backend_ops *ops, void **ctx, char *why, size_t cap) {
  lm_status st = ops->open(ctx);
  if (st != LM_OK) snprintf(why, cap, "%s", lm_last_error());
  return st == LM_OK;
}

/* Prepares g (cloned) on ctx; with T, as a scan over the symbol T. */
static vprog *vprog_new(const lm_backend_ops *ops, void *ctx, const lm_graph_t *g, const char *T, int reverse,
                        const char *const *per_step, int n_per_step) {
  vprog *p = calloc(1, sizeof *p);
  cr_assert(p);
  p->ops = ops;
  p->ctx = ctx;
  p->g = lm_graph_clone(g);
  cr_assert(p->g);
  uint8_t per[64] = {0};
  lm_scan_info scan = {0};
  if (T) {
    int sym = lm_x_symbol(&p->g->x, T, 1);
    cr_assert(sym >= 0);
    for (int i = 0; i < n_per_step; i++)
      for (size_t j = 0; j < p->g->ninputs; j++)
        if (!strcmp(p->g->inputs[j].name, per_step[i])) per[j] = 1;
    scan = (lm_scan_info){1, sym, reverse, per};
  }
  cr_assert(p->g->x.nsyms <= 16 && p->g->ninputs < 64);
  p->in = calloc(p->g->ninputs + 1, sizeof *p->in);
  p->out = calloc(p->g->noutputs + 1, sizeof *p->out);
  p->in_n = calloc(p->g->ninputs + 1, sizeof *p->in_n);
  p->out_n = calloc(p->g->noutputs + 1, sizeof *p->out_n);
  cr_assert(p->in && p->out && p->in_n && p->out_n);
  lm_status st = ops->prepare(ctx, p->g, &scan, &p->exe);
  cr_assert_eq(st, LM_OK, "%s: prepare: %s", ops->name, lm_last_error());
  return p;
}

static void vprog_free(vprog *p) {
  for (size_t i = 0; i < p->g->ninputs; i++)
    if (p->in[i]) p->ops->release(p->ctx, p->in[i]);
  for (size_t i = 0; i < p->g->noutputs; i++)
    if (p->out[i]) p->ops->release(p->ctx, p->out[i]);
  p->ops->unprepare(p->ctx, p->exe);
  lm_graph_free(p->g);
  free(p->in);
  free(p->out);
  free(p->in_n);
  free(p->out_n);
  free(p);
}

static void vbind(vprog *p, const char *name, int64_t v) {
  size_t k = 0;
  while (k < p->g->x.nsyms && strcmp(p->g->x.syms[k].name, name)) k++;
  cr_assert(k < p->g->x.nsyms, "no symbol %s", name);
  p->syms[k] = v;
}

static int find_name(const lm_graph_t *g, const char *name, int *is_out) {
  for (size_t i = 0; i < g->ninputs; i++)
    if (!strcmp(g->inputs[i].name, name)) return *is_out = 0, (int)i;
  for (size_t i = 0; i < g->noutputs; i++)
    if (!strcmp(g->outputs[i].name, name)) return *is_out = 1, (int)i;
  cr_assert_fail("no input or output named %s", name);
  return -1;
}

/* The buffer of `name`, (re)allocated to n elements; fresh buffers start at zero. */
static void *vbuf(vprog *p, const char *name, size_t n) {
  int is_out, i = find_name(p->g, name, &is_out);
  void **b = is_out ? &p->out[i] : &p->in[i];
  size_t *have = is_out ? &p->out_n[i] : &p->in_n[i];
  if (*b && *have == n) return *b;
  if (*b) p->ops->release(p->ctx, *b);
  OK(p->ops->alloc(p->ctx, (n ? n : 1) * sizeof(float), b));
  OK(p->ops->fill_zero(p->ctx, *b, (n ? n : 1) * sizeof(float)));
  *have = n;
  return *b;
}

static void vwrite(vprog *p, const char *name, const float *v, size_t n) {
  OK(p->ops->write(p->ctx, vbuf(p, name, n), v, n * sizeof(float)));
}

static void vread(vprog *p, const char *name, float *v, size_t n) {
  OK(p->ops->read(p->ctx, vbuf(p, name, n), v, n * sizeof(float)));
}

/* Sizes every output from the ref program r (same graph, same bindings), then runs once. */
static lm_status vrun(vprog *p, lm_program_t *r) {
  for (size_t i = 0; i < p->g->noutputs; i++) {
    size_t n = 0;
    OK(lm_program_numel(r, p->g->outputs[i].name, &n));
    vbuf(p, p->g->outputs[i].name, n);
  }
  for (size_t i = 0; i < p->g->ninputs; i++) {
    size_t n = 0;
    OK(lm_program_numel(r, p->g->inputs[i].name, &n));
    vbuf(p, p->g->inputs[i].name, n);
  }
  lm_run_args a = {p->syms, p->in, p->out, p->seed, p->run};
  lm_status st = p->ops->run(p->ctx, p->exe, &a);
  if (st == LM_OK) p->run++;
  return st;
}

/* ================================================================ random graphs vs ref */

typedef struct target {
  const lm_backend_ops *ops;
  void *ctx;
  lm_backend_t *ref;
  int exact_bits; /* compare exact values bit for bit */
} target;

static void fail_report(gen *G, int which, const char *fmt, ...) LM_PRINTF(3, 4);
static void fail_report(gen *G, int which, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *dump = lm_graph_dump(G->g);
  cr_log_error("whole graph (lm_graph_dump):\n%s", dump ? dump : "(dump failed)");
  free(dump);
  const sub *s = &G->subs[which];
  cr_assert_fail("%s\n%.*s", msg, (int)s->len, s->desc);
}

static void compare(gen *G, const target *T, vprog *pm, lm_program_t *pr, const outp *o, const char *when) {
  size_t n = 0;
  OK(lm_program_numel(pr, o->name, &n));
  float *got = malloc((n ? n : 1) * sizeof *got), *ref = malloc((n ? n : 1) * sizeof *ref);
  cr_assert(got && ref);
  check_poison(got, n);
  check_poison(ref, n);
  vread(pm, o->name, got, n);
  OK(lm_program_read(pr, o->name, ref, n));
  double atol = ATOL * fmax(1.0, o->err);
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(ref[i]))
      fail_report(G, o->sub, "%s: ref's %s[%zu] = %g is not finite (a generator bug)", when, o->name, i,
                  (double)ref[i]);
    int bits = o->exact && T->exact_bits;
    int good = bits ? !memcmp(&got[i], &ref[i], sizeof(float))
                    : fabs((double)got[i] - ref[i]) <= RTOL * fabs(ref[i]) + atol;
    if (!good)
      fail_report(G, o->sub, "%s: %s[%zu] of %zu: %s %.9g, ref %.9g (%s, atol %.3g)", when, o->name, i, n, T->ops->name,
                  (double)got[i], (double)ref[i], bits ? "exact: must match bit for bit" : "rtol 2e-5", atol);
  }
  free(got);
  free(ref);
}

static void property_program(const target *T, uint64_t seed) {
  gen *G = calloc(1, sizeof *G);
  cr_assert(G);
  gen_program(G, seed);
  vprog *pm = vprog_new(T->ops, T->ctx, G->g, NULL, 0, NULL, 0);
  lm_program_t *pr = lm_program_new(T->ref, G->g);
  cr_assert(pr, "ref: %s", lm_last_error());
  pm->seed = seed;
  lm_program_set_seed(pr, seed);
  check_rng data = check_rng_new(seed ^ 0xda7a);
  for (size_t bi = 0; bi < CHECK_COUNT(bindings); bi++) {
    vbind(pm, "N", bindings[bi][0]);
    vbind(pm, "M", bindings[bi][1]);
    OK(lm_program_bind(pr, "N", bindings[bi][0]));
    OK(lm_program_bind(pr, "M", bindings[bi][1]));
    for (int i = 0; i < G->nin; i++) {
      size_t n = 0;
      OK(lm_program_numel(pr, G->in[i].name, &n));
      float *v = malloc((n ? n : 1) * sizeof *v);
      cr_assert(v);
      check_fill(&data, v, n, G->in[i].lo, G->in[i].hi, 0.05);
      vwrite(pm, G->in[i].name, v, n);
      OK(lm_program_write(pr, G->in[i].name, v, n));
      free(v);
    }
    for (int run = 0; run < (bi == 0 ? 2 : 1); run++) {
      lm_status sm = vrun(pm, pr);
      if (sm != LM_OK) fail_report(G, 0, "%s run: %s", T->ops->name, lm_last_error());
      OK(lm_program_run(pr));
      char when[128];
      snprintf(when, sizeof when, "seed %#llx, N=%lld M=%lld, run %d", (unsigned long long)seed,
               (long long)bindings[bi][0], (long long)bindings[bi][1], run);
      for (int o = 0; o < G->nout; o++) compare(G, T, pm, pr, &G->out[o], when);
    }
  }
  vprog_free(pm);
  lm_program_free(pr);
  lm_graph_free(G->g);
  free(G);
}

/* Part `part` of the property test: PROGRAMS programs of NSUB random graphs each. */
enum { PARTS = 3, PROGRAMS = 2 };

static void property_part(const lm_backend_ops *ops, int exact_bits, int part) {
  target T = {ops, NULL, lm_backend_new("ref"), exact_bits};
  char why[1024];
  if (!vopen(ops, &T.ctx, why, sizeof why)) {
    lm_backend_free(T.ref);
    cr_skip_test("%s is not available here: %s", ops->name, why);
  }
  cr_assert(T.ref, "%s", lm_last_error());
  for (int i = 0; i < PROGRAMS; i++)
    property_program(&T, 0xa0761d6478bd642full * (uint64_t)(part * PROGRAMS + i + 1));
  ops->close(T.ctx);
  lm_backend_free(T.ref);
}

Test(metal_shim_vs_ref, random_graphs_part_1_of_3, .timeout = 240) { property_part(&lm_backend_metal_shim, 1, 0); }
Test(metal_shim_vs_ref, random_graphs_part_2_of_3, .timeout = 240) { property_part(&lm_backend_metal_shim, 1, 1); }
Test(metal_shim_vs_ref, random_graphs_part_3_of_3, .timeout = 240) { property_part(&lm_backend_metal_shim, 1, 2); }

/* On a Mac with a Metal GPU: the same 120 graphs on the real device (skipped elsewhere). */
Test(metal_vs_ref, random_graphs_on_a_real_metal_device, .timeout = 600) {
  for (int part = 0; part < PARTS; part++) property_part(&lm_backend_metal, 0, part);
}

/* ================================================================ RAND */

/* RAND through MSL draws what lm_rand_uniform draws, bit for bit, for 64-bit seeds, several run
 * counters, streams and shapes with symbolic sizes. */
Test(metal_shim, rand_is_bit_identical_to_ref) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 7});
  OK(lm_output(lm_rand(g, 2, (lm_dim[]){N, 7}), "u"));
  OK(lm_output(lm_mul(lm_rand(g, 2, (lm_dim[]){N, 7}), x), "ux"));
  OK(lm_output(lm_rand(g, 1, (lm_dim[]){N}), "v"));
  void *ctx;
  char why[512];
  cr_assert(vopen(&lm_backend_metal_shim, &ctx, why, sizeof why), "%s", why);
  lm_backend_t *ref = lm_backend_new("ref");
  vprog *pm = vprog_new(&lm_backend_metal_shim, ctx, g, NULL, 0, NULL, 0);
  lm_program_t *pr = lm_program_new(ref, g);
  cr_assert(pr);
  static const uint64_t seeds[] = {0, 1, 0xfedcba9876543210ull};
  static const char *const outs[] = {"u", "ux", "v"};
  check_rng r = check_rng_new(8);
  for (size_t si = 0; si < CHECK_COUNT(seeds); si++) {
    int64_t n = 37 + 64 * (int64_t)si;
    vbind(pm, "N", n);
    OK(lm_program_bind(pr, "N", n));
    pm->seed = seeds[si];
    lm_program_set_seed(pr, seeds[si]);
    uint64_t run = si == 2 ? 0x100000003ull : 5; /* a run counter past 32 bits */
    pm->run = run;
    lm_program_set_run(pr, run);
    float *xv = malloc((size_t)n * 7 * sizeof *xv);
    check_fill(&r, xv, (size_t)n * 7, -2, 2, 0.1);
    vwrite(pm, "x", xv, (size_t)n * 7);
    OK(lm_program_write(pr, "x", xv, (size_t)n * 7));
    for (int k = 0; k < 2; k++) {
      OK(vrun(pm, pr));
      OK(lm_program_run(pr));
      for (size_t o = 0; o < CHECK_COUNT(outs); o++) {
        size_t cnt = 0;
        OK(lm_program_numel(pr, outs[o], &cnt));
        float *a = malloc(cnt * sizeof *a), *b = malloc(cnt * sizeof *b);
        check_poison(a, cnt);
        check_poison(b, cnt);
        vread(pm, outs[o], a, cnt);
        OK(lm_program_read(pr, outs[o], b, cnt));
        for (size_t i = 0; i < cnt; i++) /* uniforms lie in (0, 1] */
          cr_assert(!memcmp(&a[i], &b[i], sizeof(float)) && (o == 1 || (a[i] > 0 && a[i] <= 1)),
                    "seed %#llx run %llu: %s[%zu] = %a through MSL, %a on ref", (unsigned long long)seeds[si],
                    (unsigned long long)(run + (uint64_t)k), outs[o], i, (double)a[i], (double)b[i]);
        free(a);
        free(b);
      }
    }
    free(xv);
  }
  vprog_free(pm);
  lm_program_free(pr);
  lm_backend_free(ref);
  lm_backend_metal_shim.close(ctx);
  lm_graph_free(g);
}

/* ================================================================ scans */

static lm_graph_t *recurrence_graph(void) { /* h' = 0.5 h + x_t + u_t; y_t = h' */
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_add(lm_mul_scalar(h, 0.5f), x), lm_rand(g, 1, (lm_dim[]){N}));
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  return g;
}

static lm_graph_t *global_graph(void) { /* h' = 0.5 (h - mean h) + x_t: not env-local, unfused */
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_sub(h, lm_mean(h, 0, 1)), 0.5f), lm_mul(x, lm_rand(g, 1, (lm_dim[]){N})));
  OK(lm_output(h2, "y"));
  OK(lm_output(lm_sum(h2, 0, 0), "total"));
  OK(lm_assign(h, h2));
  return g;
}

/* Runs the scan of g on metal-shim and ref for two runs (the carry continues) and compares y
 * and the state bit for bit; returns the emulated device's counts of the last run. */
static lm_msl_shim_counts scan_vs_ref(lm_graph_t *g, int reverse, int64_t T, int64_t n, int want_fused_kernels) {
  void *ctx;
  char why[512];
  cr_assert(vopen(&lm_backend_metal_shim, &ctx, why, sizeof why), "%s", why);
  lm_backend_t *ref = lm_backend_new("ref");
  const char *per[] = {"x"};
  vprog *pm = vprog_new(&lm_backend_metal_shim, ctx, g, "T", reverse, per, 1);
  lm_program_t *pr = lm_program_new_scan(ref, g, "T", reverse, per, 1);
  cr_assert(pr, "%s", lm_last_error());
  vbind(pm, "T", T);
  vbind(pm, "N", n);
  OK(lm_program_bind(pr, "T", T));
  OK(lm_program_bind(pr, "N", n));
  pm->seed = 77;
  lm_program_set_seed(pr, 77);
  lm_program_stats stats;
  OK(lm_backend_metal_shim.stats(ctx, pm->exe, pm->syms, &stats));
  if (want_fused_kernels) cr_assert_eq(stats.kernels, want_fused_kernels, "the scan took %d kernels", stats.kernels);
  else
    cr_assert(stats.kernels >= T && stats.kernels % T == 0, "%d kernels for %lld unfused steps", stats.kernels,
              (long long)T);
  check_rng r = check_rng_new(13);
  float *h0 = malloc((size_t)n * sizeof *h0), *xs = malloc((size_t)(T * n) * sizeof *xs);
  check_fill(&r, h0, (size_t)n, -3, 3, 0.01);
  vwrite(pm, "h", h0, (size_t)n);
  OK(lm_program_write(pr, "h", h0, (size_t)n));
  lm_msl_shim_counts before = {0}, after = {0};
  for (int run = 0; run < 2; run++) {
    check_fill(&r, xs, (size_t)(T * n), -1, 1, 0.01);
    vwrite(pm, "x", xs, (size_t)(T * n));
    OK(lm_program_write(pr, "x", xs, (size_t)(T * n)));
    lm_msl_shim_counts_get(&before);
    OK(vrun(pm, pr));
    lm_msl_shim_counts_get(&after);
    OK(lm_program_run(pr));
    static const char *const names[] = {"y", "h", "total"};
    for (int k = 0; k < 3; k++) {
      size_t cnt = 0;
      int found = k < 2;
      for (size_t i = 0; i < pm->g->noutputs; i++) found |= !strcmp(pm->g->outputs[i].name, names[k]);
      if (!found) continue;
      OK(lm_program_numel(pr, names[k], &cnt));
      float *a = malloc(cnt * sizeof *a), *b = malloc(cnt * sizeof *b);
      check_poison(a, cnt);
      check_poison(b, cnt);
      vread(pm, names[k], a, cnt);
      OK(lm_program_read(pr, names[k], b, cnt));
      for (size_t i = 0; i < cnt; i++)
        cr_assert(!memcmp(&a[i], &b[i], sizeof(float)), "run %d: %s[%zu] = %.9g through MSL, %.9g on ref", run,
                  names[k], i, (double)a[i], (double)b[i]);
      free(a);
      free(b);
    }
  }
  free(h0);
  free(xs);
  vprog_free(pm);
  lm_program_free(pr);
  lm_backend_free(ref);
  lm_backend_metal_shim.close(ctx);
  lm_graph_free(g);
  return (lm_msl_shim_counts){after.command_buffers - before.command_buffers, after.dispatches - before.dispatches,
                              after.barriers - before.barriers, after.threads - before.threads};
}

Test(metal_shim, env_local_scan_is_one_fused_kernel_and_matches_ref_bit_for_bit) {
  lm_msl_shim_counts c = scan_vs_ref(recurrence_graph(), 0, 9, 70, 1);
  cr_assert_eq(c.command_buffers, 1);
  cr_assert_eq(c.dispatches, 1, "a fused scan is one dispatch (got %lld)", (long long)c.dispatches);
}

Test(metal_shim, reverse_env_local_scan_matches_ref_bit_for_bit) { scan_vs_ref(recurrence_graph(), 1, 6, 33, 1); }

/* Not env-local: T steps of several kernels, per-step x and y offset with setBuffer:offset:,
 * the state copy after every step, run counter run*T + t — all in one command buffer. */
Test(metal_shim, unfused_scan_runs_every_step_in_one_command_buffer_and_matches_ref_bit_for_bit) {
  const int64_t T = 7;
  lm_msl_shim_counts c = scan_vs_ref(global_graph(), 0, T, 70, 0);
  cr_assert_eq(c.command_buffers, 1, "%lld command buffers for one run", (long long)c.command_buffers);
  cr_assert(c.dispatches >= 2 * T, "%lld dispatches for %lld steps", (long long)c.dispatches, (long long)T);
  cr_assert(c.barriers >= T - 1 && c.barriers < c.dispatches, "%lld barriers for %lld dispatches",
            (long long)c.barriers, (long long)c.dispatches);
}

Test(metal_shim, unfused_reverse_scan_matches_ref_bit_for_bit) { scan_vs_ref(global_graph(), 1, 5, 9, 0); }

/* ================================================================ the emulated device */

/* Two dependent copies (a -> b, then b -> c) in one command buffer: with the barrier c = a;
 * without it the emulator runs them last-first and c keeps b's old zeros. This is why the
 * property tests above catch a barrier the host logic forgot. */
Test(metal_shim, dispatches_between_barriers_run_in_reverse_so_a_missing_barrier_shows) {
  const lm_mtl_device *d = &lm_mtl_device_shim;
  void *dev, *lib, *buf[3], *mem[3];
  OK(d->open(&dev));
  static const char src[] =
      "#include <metal_stdlib>\nusing namespace metal;\n"
      "kernel void copy4(device float *dst [[buffer(0)]], const device float *src [[buffer(1)]], "
      "uint tid [[thread_position_in_grid]]) {\n  if (tid < 4) dst[tid] = src[tid];\n}\n";
  const char *entries[] = {"copy4"};
  OK(d->library_new(dev, src, entries, 1, &lib));
  for (int with_barrier = 0; with_barrier < 2; with_barrier++) {
    for (int i = 0; i < 3; i++) OK(d->buffer_new(dev, 4 * sizeof(float), &buf[i], &mem[i]));
    for (int i = 0; i < 4; i++) ((float *)mem[0])[i] = (float)(i + 1);
    void *enc;
    OK(d->encoder_new(dev, &enc));
    d->set_kernel(enc, lib, 0);
    d->set_buffer(enc, buf[1], 0, 0);
    d->set_buffer(enc, buf[0], 0, 1);
    d->dispatch(enc, 4, 0);
    if (with_barrier) d->barrier(enc);
    d->set_buffer(enc, buf[2], 0, 0);
    d->set_buffer(enc, buf[1], 0, 1);
    d->dispatch(enc, 4, 0);
    OK(d->finish(enc, 1, NULL));
    for (int i = 0; i < 4; i++)
      cr_assert_eq(((float *)mem[2])[i], with_barrier ? (float)(i + 1) : 0.0f, "with_barrier=%d: c[%d] = %g",
                   with_barrier, i, (double)((float *)mem[2])[i]);
    for (int i = 0; i < 3; i++) d->buffer_free(dev, buf[i]);
  }
  d->library_free(dev, lib);
  d->close(dev);
}

/* A threadgroup tree reduction: threadgroup memory, barriers in a loop, the work-item's index in
 * its group and the group's index. Each work-item is an OS thread, so the barriers are real. */
Test(metal_shim, a_kernel_with_threadgroup_barriers_runs_a_thread_per_work_item) {
  const lm_mtl_device *d = &lm_mtl_device_shim;
  void *dev, *lib, *in, *out, *pin, *pout;
  OK(d->open(&dev));
  static const char src[] =
      "#include <metal_stdlib>\nusing namespace metal;\n"
      "kernel void group_sum(device float *out [[buffer(0)]], const device float *in [[buffer(1)]],\n"
      "                      constant long &n [[buffer(2)]], uint lid [[thread_position_in_threadgroup]],\n"
      "                      uint group [[threadgroup_position_in_grid]], uint size [[threads_per_threadgroup]],\n"
      "                      uint tid [[thread_position_in_grid]]) {\n"
      "  threadgroup float tile[64];\n"
      "  tile[lid] = (long)tid < n ? in[tid] : 0.0f;\n"
      "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
      "  for (uint s = size / 2; s > 0; s >>= 1) {\n"
      "    if (lid < s) tile[lid] += tile[lid + s];\n"
      "    threadgroup_barrier(mem_flags::mem_threadgroup);\n"
      "  }\n"
      "  if (lid == 0) out[group] = tile[0];\n"
      "}\n";
  char log[1024];
  OK(lm_msl_check_source(src, log, sizeof log));
  cr_assert(strstr(log, "1 with threadgroup barriers"), "%s", log);
  const char *entries[] = {"group_sum"};
  OK(d->library_new(dev, src, entries, 1, &lib));
  const int64_t n = 200; /* 4 groups of 64, the last one partial */
  OK(d->buffer_new(dev, (size_t)n * sizeof(float), &in, &pin));
  OK(d->buffer_new(dev, 4 * sizeof(float), &out, &pout));
  float want[4] = {0};
  for (int64_t i = 0; i < n; i++) {
    ((float *)pin)[i] = (float)((i * 37) % 11) - 5; /* small integers: every sum is exact */
    want[i / 64] += ((float *)pin)[i];
  }
  check_poison(pout, 4);
  void *enc;
  OK(d->encoder_new(dev, &enc));
  d->set_kernel(enc, lib, 0);
  d->set_buffer(enc, out, 0, 0);
  d->set_buffer(enc, in, 0, 1);
  d->set_bytes(enc, &n, sizeof n, 2);
  d->dispatch(enc, (uint64_t)n, 64);
  OK(d->finish(enc, 1, NULL));
  for (int i = 0; i < 4; i++)
    cr_assert_eq(((float *)pout)[i], want[i], "group %d: %g, expected %g", i, (double)((float *)pout)[i],
                 (double)want[i]);
  d->buffer_free(dev, in);
  d->buffer_free(dev, out);
  d->library_free(dev, lib);
  d->close(dev);
}

/* ================================================================ the validator */

static lm_status check_text(const char *kernel_text, char *log, size_t cap) {
  char src[8192];
  snprintf(src, sizeof src, "#include <metal_stdlib>\nusing namespace metal;\n%s", kernel_text);
  return lm_msl_check_source(src, log, cap);
}

Test(msl_check, a_well_formed_kernel_compiles_and_the_log_says_so) {
  char log[2048];
  lm_status st = check_text("kernel void k(device float *o [[buffer(0)]], const device float *a [[buffer(1)]], "
                            "constant long &n [[buffer(2)]], uint tid [[thread_position_in_grid]]) {\n"
                            "  if ((long)tid < n)\n"
                            "    o[tid] = metal::precise::sin(a[tid]) + metal::fast::exp2(a[tid]);\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_OK, "%s", log);
  cr_assert(strstr(log, "1 kernel (") && strstr(log, "compiled under the shim"), "log: %s", log);
}

Test(msl_check, a_write_through_a_read_only_buffer_fails_to_compile) {
  char log[8192];
  lm_status st = check_text("kernel void k(const device float *o [[buffer(0)]],\n"
                            "              uint tid [[thread_position_in_grid]]) {\n  o[tid] = 1.0f;\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_ERR_COMPILE, "%s", log);
  cr_assert(strstr(log, "read-only") || strstr(log, "const"), "log: %s", log);
}

Test(msl_check, double_is_refused_as_in_msl) {
  char log[8192];
  lm_status st = check_text("kernel void k(device float *o [[buffer(0)]], uint tid [[thread_position_in_grid]]) {\n"
                            "  double d = 2.0;\n  o[tid] = (float)d;\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_ERR_COMPILE, "%s", log);
  cr_assert(strstr(log, "double"), "log: %s", log);
}

Test(msl_check, buffer_slots_out_of_order_are_refused_naming_the_kernel) {
  char log[2048];
  lm_status st = check_text("kernel void swapped(device float *o [[buffer(1)]], const device float *a [[buffer(0)]], "
                            "uint tid [[thread_position_in_grid]]) {\n  o[tid] = a[tid];\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_ERR_COMPILE);
  cr_assert(strstr(log, "swapped") && strstr(log, "[[buffer(1)]]"), "log: %s", log);
}

Test(msl_check, more_than_31_buffer_slots_are_refused_naming_the_kernel) {
  char text[6000];
  int n = snprintf(text, sizeof text, "kernel void wide(");
  for (int i = 0; i < 32; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, "device float *b%d [[buffer(%d)]], ", i, i);
  snprintf(text + n, sizeof text - (size_t)n, "uint tid [[thread_position_in_grid]]) {\n  b0[tid] = 0.0f;\n}\n");
  char log[2048];
  cr_assert_eq(check_text(text, log, sizeof log), LM_ERR_COMPILE);
  cr_assert(strstr(log, "wide") && strstr(log, "32 buffer slots"), "log: %s", log);
}

/* A graph whose one fused kernel reads 30 inputs: 34 slots with S, R and total. */
Test(metal_shim, a_kernel_needing_more_than_31_buffer_slots_is_refused_naming_it) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor s = lm_input(g, "x0", LM_ROLE_DATA, 1, (lm_dim[]){5});
  for (int i = 1; i < 30; i++) {
    char name[8];
    snprintf(name, sizeof name, "x%d", i);
    s = lm_add(s, lm_input(g, name, LM_ROLE_DATA, 1, (lm_dim[]){5}));
  }
  OK(lm_output(s, "sum"));
  void *ctx, *exe = NULL;
  char why[512];
  cr_assert(vopen(&lm_backend_metal_shim, &ctx, why, sizeof why), "%s", why);
  lm_scan_info none = {0};
  lm_status st = lm_backend_metal_shim.prepare(ctx, g, &none, &exe);
  cr_assert_eq(st, LM_ERR_UNSUPPORTED, "prepare: %s", lm_last_error());
  cr_assert(strstr(lm_last_error(), "buffer slots") && strstr(lm_last_error(), "31"), "%s", lm_last_error());
  lm_backend_metal_shim.close(ctx);
  lm_graph_free(g);
}

/* The source Metal gets keeps the renderer's kernels and turns off FMA contraction (Metal
 * contracts a*b+c even in safe math mode), then adds the copy kernel. */
Test(msl_check, the_metal_source_has_contraction_off_and_the_copy_kernel) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 1, (lm_dim[]){8});
  lm_tensor s = lm_input(g, "s", LM_ROLE_STATE, 1, (lm_dim[]){8});
  OK(lm_output(lm_add(lm_mul(a, a), s), "y"));
  OK(lm_assign(s, lm_mul(s, a)));
  lm_plan *plan = NULL;
  OK(lm_lower(g, &plan));
  char *src = lm_msl_plan_source(plan);
  cr_assert(src, "%s", lm_last_error());
  const char *pragma = strstr(src, "#pragma METAL fp contract(off)"), *first = strstr(src, "\nkernel void ");
  cr_assert(pragma && first && pragma < first, "no contraction pragma before the kernels:\n%s", src);
  cr_assert(strstr(src, "kernel void " LM_MSL_COPY_ENTRY "("), "no copy kernel:\n%s", src);
  for (size_t k = 0; k < plan->nkernels; k++) {
    char decl[96];
    snprintf(decl, sizeof decl, "kernel void %s(", plan->kernels[k].name);
    cr_assert(strstr(src, decl), "kernel %s is missing", plan->kernels[k].name);
  }
  free(src);
  lm_plan_free(plan);
  lm_graph_free(g);
}

/* ================================================================ every env's training iteration */

static void env_iteration_compiles(int e) {
  const lm_env_spec *env = lm_env_at(e);
  if (!env) cr_skip_test("this build registers %d envs", lm_env_count());
  lm_ppo_config cfg = lm_ppo_defaults(env);
  lm_train_graph tg[4];
  int n = lm_trainer_graphs(env, &cfg, tg, 4);
  cr_assert_eq(n, 4, "%s: lm_trainer_graphs: %s", env->name, lm_last_error());
  char log[16384];
  for (int i = 0; i < n; i++) {
    lm_status st = lm_msl_check_graph(tg[i].g, tg[i].scan ? "T" : NULL, tg[i].reverse, tg[i].per_step,
                                      tg[i].n_per_step, log, sizeof log);
    cr_assert_eq(st, LM_OK, "%s %s: %s", env->name, tg[i].name, log);
    cr_assert(strstr(log, "compiled under the shim"), "%s %s: %s", env->name, tg[i].name, log);
    cr_log_info("%s %s: %s", env->name, tg[i].name, log);
  }
  for (int i = 0; i < n; i++) lm_graph_free(tg[i].g);
}

Test(msl_env, training_iteration_of_env_0_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(0); }
Test(msl_env, training_iteration_of_env_1_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(1); }
Test(msl_env, training_iteration_of_env_2_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(2); }
Test(msl_env, training_iteration_of_env_3_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(3); }
Test(msl_env, training_iteration_of_env_4_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(4); }
Test(msl_env, training_iteration_of_env_5_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(5); }
Test(msl_env, training_iteration_of_env_6_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(6); }
Test(msl_env, training_iteration_of_env_7_compiles_under_the_shim, .timeout = 120) { env_iteration_compiles(7); }

Test(msl_env, every_registered_env_is_covered_by_the_tests_above) {
  cr_assert_leq(lm_env_count(), 8, "%d envs: add tests for envs 8 and up", lm_env_count());
}

/* ================================================================ the real backend off macOS */

#if !defined(__APPLE__)
Test(metal, off_macos_the_metal_backend_refuses_to_open_with_the_documented_message) {
  void *ctx = NULL;
  lm_status st = lm_backend_metal.open(&ctx);
  cr_assert_eq(st, LM_ERR_UNSUPPORTED, "open gave %s", lm_status_name(st));
  cr_assert(strstr(lm_last_error(), linux_message), "message: %s", lm_last_error());
}

static int registry_index(const char *name) {
  for (int i = 0; i < lm_backend_count(); i++)
    if (!strcmp(lm_backend_name_at(i), name)) return i;
  return -1;
}

Test(metal, off_macos_device_metal_fails_and_auto_picks_another_backend_saying_why) {
  int m = registry_index("metal");
  if (m < 0) cr_skip_test("compiler/runtime.c's registry does not list &lm_backend_metal yet");
  cr_assert(registry_index("cpu") > m && registry_index("ref") > m, "metal must come before cpu and ref");
  cr_assert_null(lm_backend_new("metal"));
  cr_assert(strstr(lm_last_error(), linux_message), "lm_backend_new(\"metal\"): %s", lm_last_error());
  char why[1024] = "";
  cr_assert_null(lm_backend_open("metal", why, sizeof why), "asking for metal by name does not fall back");
  lm_backend_t *b = lm_backend_open("auto", why, sizeof why);
  cr_assert(b, "auto: %s", lm_last_error());
  cr_assert_str_neq(lm_backend_name(b), "metal");
  if (registry_index(lm_backend_name(b)) > m) /* metal was tried first: the line says so */
    cr_assert(strstr(why, "metal unavailable") && strstr(why, linux_message), "why: %s", why);
  lm_backend_free(b);
}
#endif
