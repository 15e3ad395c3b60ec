/* tests/support/randgraph.c — the random graph generator of randgraph.h. */
#include "support/randgraph.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph-impl.h"

#define OK(call)                                                               \
  do {                                                                         \
    lm_status st_ = (call);                                                    \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_),       \
                 lm_last_error());                                             \
  } while (0)

typedef rg_val val;
typedef rg_io io;
typedef rg_outp outp;
typedef rg_sub sub;
typedef rg_gen gen;

#define NSUB RG_NSUB
#define MAXPOOL RG_MAXPOOL
#define MAXIO RG_MAXIO
#define NUMEL_CAP RG_NUMEL_CAP
#define MAG_CAP 1e4 /* |values| stay below this */

const int64_t rg_bindings[3][2] = {{3, 2}, {70, 5}, {1, 1}};
#define N_MAX 70
#define M_MAX 5

static int rnd(gen *G, int n) { return (int)(check_next(&G->r) % (uint64_t)n); }
static double unif(gen *G, double lo, double hi) {
  return check_uniform(&G->r, lo, hi);
}
static int chance(gen *G, double p) { return unif(G, 0, 1) < p; }
static double mag(const val *v) { return fmax(fabs(v->lo), fabs(v->hi)); }

static void sub_log(sub *s, const char *fmt, ...) LM_PRINTF(2, 3);
static void sub_log(sub *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (s->len < sizeof s->desc) {
    int n = vsnprintf(s->desc + s->len, sizeof s->desc - s->len, fmt, ap);
    if (n > 0)
      s->len += (size_t)n;
    if (s->len > sizeof s->desc)
      s->len = sizeof s->desc;
  }
  va_end(ap);
}

static const char *dim_text(gen *G, lm_dim d, char *buf, size_t cap) {
  return lm_dim_str(G->g, d, buf, cap);
}

/* A dimension's value under the largest binding. */
static int64_t dim_max(gen *G, lm_dim d) {
  if (d >= 0)
    return d;
  return lm_x_eval(&G->g->x, lm_dim_expr(G->g, d), NULL, G->symmax);
}

static int64_t numel_max(gen *G, int rank, const lm_dim *dims) {
  int64_t n = 1;
  for (int i = 0; i < rank; i++)
    n *= dim_max(G, dims[i]);
  return n;
}

static int shape_of(lm_tensor t, lm_dim *dims) {
  int r = lm_rank(t);
  for (int i = 0; i < r; i++)
    dims[i] = lm_dim_of(t, i);
  return r;
}

static void shape_log(gen *G, sub *s, int rank, const lm_dim *dims) {
  char b[64];
  sub_log(s, "[");
  for (int i = 0; i < rank; i++)
    sub_log(s, "%s%s", i ? "," : "", dim_text(G, dims[i], b, sizeof b));
  sub_log(s, "]");
}

static int is_one(lm_dim d) { return d == 1; }

/* numpy broadcasting of two shapes; 0 when they do not broadcast statically. */
static int broadcast_shape(gen *G, int ra, const lm_dim *a, int rb,
                           const lm_dim *b, int *rank, lm_dim *out) {
  int r = ra > rb ? ra : rb;
  for (int i = 0; i < r; i++) {
    int ia = ra - r + i, ib = rb - r + i;
    lm_dim da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (lm_dim_equal(G->g, da, db))
      out[i] = da;
    else if (is_one(da))
      out[i] = db;
    else if (is_one(db))
      out[i] = da;
    else
      return 0;
  }
  *rank = r;
  return 1;
}

static void expect_ok(gen *G, sub *s, lm_tensor t) {
  if (lm_tensor_ok(t))
    return;
  lm_graph_validate(G->g);
  cr_assert_fail("graph %s: construction failed: %s\n%.*s", s->prefix,
                 lm_last_error(), (int)s->len, s->desc);
}

static val *push(gen *G, sub *s, val v) {
  expect_ok(G, s, v.t);
  if (!v.exact)
    v.err = fmax(v.err, mag(&v));
  v.id = s->nid++;
  int slot = s->npool < MAXPOOL ? s->npool++ : rnd(G, MAXPOOL);
  s->pool[slot] = v;
  return &s->pool[slot];
}

/* The most recent value half of the time, else any. */
static val *use(sub *s, val *v) {
  if (v->id < (int)sizeof s->used)
    s->used[v->id] = 1;
  return v;
}

static int unused(const sub *s, const val *v) {
  return !v->input && v->id < (int)sizeof s->used && !s->used[v->id];
}

/* The most recent value 45% of the time, else one nothing consumed yet (30%),
 * else any. */
static val *pick(gen *G, sub *s) {
  if (chance(G, 0.45))
    return use(s, &s->pool[s->npool - 1]);
  if (chance(G, 0.55)) {
    int start = rnd(G, s->npool);
    for (int k = 0; k < s->npool; k++)
      if (unused(s, &s->pool[(start + k) % s->npool]))
        return use(s, &s->pool[(start + k) % s->npool]);
  }
  return use(s, &s->pool[rnd(G, s->npool)]);
}

static val *pick_where(gen *G, sub *s, int (*ok)(gen *, const val *)) {
  int start = rnd(G, s->npool);
  for (int k = 0; k < s->npool; k++) {
    val *v = &s->pool[(start + k) % s->npool];
    if (ok(G, v))
      return use(s, v);
  }
  return NULL;
}

/* A data input of the given shape; values in [-2, 2] (signed) or [0.25, 3]
 * (positive). */
static val new_input(gen *G, sub *s, int rank, const lm_dim *dims, int positive,
                     lm_role role) {
  cr_assert(G->nin < MAXIO);
  io *in = &G->in[G->nin++];
  snprintf(in->name, sizeof in->name, "%s%s%d", s->prefix,
           role == LM_ROLE_STATE ? "s" : "x", s->nin++);
  in->lo = positive ? 0.25 : -2.0;
  in->hi = positive ? 3.0 : 2.0;
  in->sub = (int)(s - G->subs);
  val v = {.t = lm_input(G->g, in->name, role, rank, dims),
           .lo = in->lo,
           .hi = in->hi,
           .exact = 1,
           .input = 1};
  val *p = push(G, s, v);
  sub_log(s, "  t%d = %s %s", p->id, role == LM_ROLE_STATE ? "state" : "input",
          in->name);
  shape_log(G, s, rank, dims);
  sub_log(s, " in [%g, %g]\n", in->lo, in->hi);
  return *p;
}

/* The base shape with leading axes dropped and some axes set to 1 (numpy
 * broadcasting). */
static int broadcast_variant(gen *G, const lm_dim *base, int rank,
                             lm_dim *out) {
  int drop = rank && chance(G, 0.4) ? rnd(G, rank + 1) : 0, r = 0;
  for (int i = drop; i < rank; i++)
    out[r++] = chance(G, 0.3) ? 1 : base[i];
  return r;
}

static void interval_mul(double alo, double ahi, double blo, double bhi,
                         double *lo, double *hi) {
  double p[4] = {alo * blo, alo * bhi, ahi * blo, ahi * bhi};
  *lo = *hi = p[0];
  for (int i = 1; i < 4; i++)
    *lo = fmin(*lo, p[i]), *hi = fmax(*hi, p[i]);
}

/* A result value combining a and b (exactness, error scale). */
int rg_sums_reordered = 0;

static val combine(const val *a, const val *b) {
  val r = {0};
  r.exact = a->exact && (!b || b->exact);
  r.err = fmax(a->err, b ? b->err : 0);
  return r;
}

/* x * x + c with c in [0.25, 1]: positive and exact when x is. */
static val *make_positive(gen *G, sub *s, const val *a) {
  if (mag(a) > 90)
    return NULL;
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

static const char *const unary_names[] = {"sin", "exp2", "log2", "sqrt",
                                          "recip"};

static int op_unary(gen *G, sub *s) {
  val *a = pick(G, s);
  int which = rnd(G, 5);
  val r;
  switch (which) {
  case 0: /* sin */
    if (mag(a) > 100)
      return 0;
    r = combine(a, NULL);
    r.t = lm_sin(a->t);
    r.lo = -1, r.hi = 1, r.exact = 0;
    break;
  case 1: /* exp2 */
    if (a->hi > 6 || a->lo < -12)
      return 0;
    r = combine(a, NULL);
    r.t = lm_exp2(a->t);
    r.lo = exp2(a->lo), r.hi = exp2(a->hi), r.exact = 0;
    break;
  case 2: /* log2 of values >= 0.05 */
    if (a->lo < 0.05 && !(a = make_positive(G, s, a)))
      return 0;
    r = combine(a, NULL);
    r.t = lm_log2(a->t);
    r.lo = log2(a->lo), r.hi = log2(a->hi), r.exact = 0;
    break;
  case 3: /* sqrt of values >= 0.01 (or exact values >= 0) */
    if (!(a->lo >= 0.01 || (a->lo >= 0 && a->exact)) &&
        !(a = make_positive(G, s, a)))
      return 0;
    r = combine(a, NULL);
    r.t = lm_sqrt(a->t);
    r.lo = sqrt(a->lo), r.hi = sqrt(a->hi);
    break;
  default: /* recip of values away from zero */
    if (!(a->lo >= 0.1 || a->hi <= -0.1) && !(a = make_positive(G, s, a)))
      return 0;
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

/* A partner for a binary op with `a`: a constant, a fresh input of a
 * broadcastable shape, a pool value that broadcasts with a, or a itself.
 * `need_exact`: only exact partners. */
typedef struct partner {
  val v;
  char text[48];
} partner;

static int find_partner(gen *G, sub *s, const val *a, int need_exact,
                        int positive_away, double clo, double chi,
                        partner *out) {
  lm_dim da[LM_MAX_RANK], db[LM_MAX_RANK], dr[LM_MAX_RANK];
  int ra = shape_of(a->t, da), rr;
  int kind = rnd(G, 4);
  if (kind == 0) { /* constant */
    float c;
    do
      c = (float)unif(G, clo, chi);
    while (fabsf(c) < 0.05f);
    out->v = (val){.t = lm_const(G->g, c), .lo = c, .hi = c, .exact = 1};
    snprintf(out->text, sizeof out->text, "%.9g", (double)c);
    return 1;
  }
  if (kind == 1) { /* fresh input */
    int rb = broadcast_variant(G, da, ra, db);
    if (!broadcast_shape(G, ra, da, rb, db, &rr, dr) ||
        numel_max(G, rr, dr) > NUMEL_CAP)
      return 0;
    out->v = new_input(G, s, rb, db, positive_away, LM_ROLE_DATA);
    snprintf(out->text, sizeof out->text, "t%d", out->v.id);
    return 1;
  }
  if (kind == 2) { /* another pool value that broadcasts */
    int start = rnd(G, s->npool);
    for (int k = 0; k < s->npool; k++) {
      val *b = &s->pool[(start + k) % s->npool];
      if (need_exact && !b->exact)
        continue;
      if (positive_away && !(b->lo >= 0.5 || b->hi <= -0.5))
        continue;
      int rb = shape_of(b->t, db);
      if (!broadcast_shape(G, ra, da, rb, db, &rr, dr) ||
          numel_max(G, rr, dr) > NUMEL_CAP)
        continue;
      out->v = *use(s, b);
      snprintf(out->text, sizeof out->text, "t%d", b->id);
      return 1;
    }
    return 0;
  }
  if (need_exact && !a->exact)
    return 0; /* a with itself: a shared operand */
  if (positive_away && !(a->lo >= 0.5 || a->hi <= -0.5))
    return 0;
  out->v = *a;
  snprintf(out->text, sizeof out->text, "t%d", a->id);
  return 1;
}

static int op_add_mul(gen *G, sub *s) {
  val *a = pick(G, s);
  int mul = chance(G, 0.5);
  val av = *a;
  partner b;
  if (!find_partner(G, s, &av, 0, 0, -2, 2, &b))
    return 0;
  val r = combine(&av, &b.v);
  if (mul)
    interval_mul(av.lo, av.hi, b.v.lo, b.v.hi, &r.lo, &r.hi);
  else
    r.lo = av.lo + b.v.lo, r.hi = av.hi + b.v.hi;
  if (mag(&r) > MAG_CAP)
    return 0;
  int swap = chance(G, 0.5);
  lm_tensor x = swap ? b.v.t : av.t, y = swap ? av.t : b.v.t;
  r.t = mul ? lm_mul(x, y) : lm_add(x, y);
  val *p = push(G, s, r);
  char at[16];
  snprintf(at, sizeof at, "t%d", av.id);
  sub_log(s, "  t%d = %s %s %s\n", p->id, swap ? b.text : at, mul ? "*" : "+",
          swap ? at : b.text);
  return 1;
}

static int is_exact(gen *G, const val *v) {
  (void)G;
  return v->exact;
}

/* a mod b and a < b on exact values only: the discontinuities must not see
 * rounding noise. */
static int op_mod_lt(gen *G, sub *s) {
  val *a = pick(G, s);
  if (!a->exact && !(a = pick_where(G, s, is_exact)))
    return 0;
  val av = *a;
  int lt = chance(G, 0.5);
  partner b;
  if (lt) {
    double lo = fmin(av.lo, -0.5), hi = fmax(av.hi, 0.5);
    if (!find_partner(G, s, &av, 1, 0, lo, hi, &b))
      return 0;
  } else {
    double c = chance(G, 0.5) ? unif(G, 0.5, 3) : -unif(G, 0.5, 3);
    if (!find_partner(G, s, &av, 1, 1, c < 0 ? c : 0.5, c < 0 ? -0.5 : c, &b))
      return 0;
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
  sub_log(s, "  t%d = %s %s %s\n", p->id, swap ? b.text : at, lt ? "<" : "mod",
          swap ? at : b.text);
  return 1;
}

static int has_rank(gen *G, const val *v) {
  (void)G;
  return lm_rank(v->t) >= 1;
}

/* Sum or max over a random axis; sometimes kept and broadcast back, sometimes
 * reduced again. */
static int op_reduce(gen *G, sub *s) {
  val *a = pick(G, s);
  if (lm_rank(a->t) < 1 && !(a = pick_where(G, s, has_rank)))
    return 0;
  for (int again = 0; again < 3; again++) {
    val av = *a;
    int rank = lm_rank(av.t), axis = rnd(G, rank), max = chance(G, 0.4),
        keep = chance(G, 0.35);
    int64_t k = dim_max(G, lm_dim_of(av.t, axis));
    int symbolic = lm_dim_of(av.t, axis) < 0;
    val r = combine(&av, NULL);
    if (max)
      r.lo = av.lo, r.hi = av.hi;
    else if (symbolic)
      r.lo = fmin(av.lo, (double)k * av.lo),
      r.hi = fmax(av.hi, (double)k * av.hi);
    else
      r.lo = (double)k * av.lo, r.hi = (double)k * av.hi;
    if (mag(&r) > MAG_CAP)
      return again > 0;
    if (!max && rg_sums_reordered && (symbolic || k >= 512)) { /* a device's tree sum rounds differently */
      r.exact = 0;
      r.err = fmax(r.err, mag(&r));
    }
    int form =
        rnd(G, 3); /* primitive, lm_sum/lm_max with keepdim, negative axis */
    if (form == 0 && !keep)
      r.t = max ? lm_max_reduce(av.t, axis) : lm_sum_reduce(av.t, axis);
    else
      r.t = max ? lm_max(av.t, axis - (form == 2 ? rank : 0), keep)
                : lm_sum(av.t, axis - (form == 2 ? rank : 0), keep);
    val *p = push(G, s, r);
    sub_log(s, "  t%d = %s(t%d, axis %d%s)\n", p->id, max ? "max" : "sum",
            av.id, axis, keep ? ", keepdim" : "");
    if (keep && chance(G, 0.6)) { /* broadcast back: a - r or a * r */
      val red = *p;
      int mul = chance(G, 0.3);
      val b = combine(&av, &red);
      if (mul)
        interval_mul(av.lo, av.hi, red.lo, red.hi, &b.lo, &b.hi);
      else
        b.lo = av.lo - red.hi, b.hi = av.hi - red.lo;
      if (mag(&b) > MAG_CAP)
        return 1;
      b.t = mul ? lm_mul(av.t, red.t) : lm_sub(av.t, red.t);
      val *q = push(G, s, b);
      sub_log(s, "  t%d = t%d %s t%d\n", q->id, av.id, mul ? "*" : "-", red.id);
      return 1;
    }
    if (lm_rank(p->t) < 1 || !chance(G, 0.35))
      return 1;
    a = p; /* a reduction feeding a reduction */
  }
  return 1;
}

/* softmax-like: exp2(a - max a) / sum exp2(a - max a) over a random axis. */
static int op_softmax(gen *G, sub *s) {
  val *a = pick(G, s);
  if (lm_rank(a->t) < 1 || a->hi - a->lo > 12)
    return 0;
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
    if (r < 2)
      return 0;
    int perm[LM_MAX_RANK];
    for (int i = 0; i < r; i++)
      perm[i] = i;
    for (int i = r - 1; i > 0; i--) {
      int j = rnd(G, i + 1), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    v->t = lm_permute(v->t, perm);
    sub_log(s, " permute{");
    for (int i = 0; i < r; i++)
      sub_log(s, "%s%d", i ? "," : "", perm[i]);
    sub_log(s, "}");
    return 1;
  }
  case 1: { /* expand by a constant or a symbol */
    if (r >= 5)
      return 0;
    int axis = rnd(G, r + 1);
    lm_dim n = s->symbolic && chance(G, 0.3) ? (chance(G, 0.5) ? G->N : G->M)
                                             : 1 + rnd(G, 3);
    if (numel_max(G, r, d) * dim_max(G, n) > NUMEL_CAP)
      return 0;
    v->t = lm_expand(v->t, axis, n);
    sub_log(s, " expand(%d, %s)", axis, dim_text(G, n, b1, sizeof b1));
    return 1;
  }
  case 2: { /* slice a constant axis, never empty */
    int axis = -1;
    for (int k = 0, st = rnd(G, r + 1); k < r; k++)
      if (d[(st + k) % r] >= 2)
        axis = (st + k) % r;
    if (axis < 0)
      return 0;
    int64_t a = rnd(G, (int)d[axis]), e = a + 1 + rnd(G, (int)(d[axis] - a));
    v->t = lm_slice(v->t, axis, a, e);
    sub_log(s, " slice(%d, %lld, %lld)", axis, (long long)a, (long long)e);
    return 1;
  }
  case 3: { /* pad: zeros join the interval */
    if (!r)
      return 0;
    int axis = rnd(G, r);
    int64_t before = rnd(G, 3), after = rnd(G, 3);
    int64_t ext = dim_max(G, d[axis]);
    if (numel_max(G, r, d) / (ext ? ext : 1) * (ext + before + after) >
        NUMEL_CAP)
      return 0;
    v->t = lm_pad(v->t, axis, before, after);
    v->lo = fmin(v->lo, 0), v->hi = fmax(v->hi, 0);
    sub_log(s, " pad(%d, %lld, %lld)", axis, (long long)before,
            (long long)after);
    return 1;
  }
  case 4: { /* reshape: merge two neighbours, split a constant axis, add or drop
               a unit axis */
    int kind = rnd(G, 4);
    if (kind == 0 && r >= 2) {
      int a = rnd(G, r - 1);
      for (int i = 0; i < r; i++) {
        if (i == a + 1)
          continue;
        nd[nr++] = i == a ? (d[a] >= 0 && d[a + 1] >= 0
                                 ? d[a] * d[a + 1]
                                 : lm_dim_mul(G->g, d[a], d[a + 1]))
                          : d[i];
      }
    } else if (kind == 1 && r >= 1 && r < 5) {
      int a = rnd(G, r);
      int64_t f = 0;
      for (int64_t c = 2; d[a] >= 0 && c < d[a]; c++)
        if (d[a] % c == 0 && (!f || chance(G, 0.5)))
          f = c;
      if (!f)
        return 0;
      for (int i = 0; i < r; i++) {
        if (i == a)
          nd[nr++] = f, nd[nr++] = d[a] / f;
        else
          nd[nr++] = d[i];
      }
    } else if (kind == 2 && r < 5) {
      int a = rnd(G, r + 1);
      for (int i = 0, k = 0; i <= r; i++)
        nd[nr++] = i == a ? 1 : d[k++];
    } else if (kind == 3 && r >= 1) {
      int a = -1;
      for (int i = 0; i < r; i++)
        if (d[i] == 1)
          a = i;
      if (a < 0)
        return 0;
      for (int i = 0; i < r; i++)
        if (i != a)
          nd[nr++] = d[i];
    } else
      return 0;
    v->t = lm_reshape(v->t, nr, nd);
    sub_log(s, " reshape");
    shape_log(G, s, nr, nd);
    return 1;
  }
  default: { /* affine_mod */
    if (!r)
      return 0;
    int axis = rnd(G, r);
    int64_t a, b;
    if (d[axis] >= 1)
      a = 1 + rnd(G, (int)d[axis] + 2), b = rnd(G, 2 * (int)d[axis] + 1);
    else if (d[axis] < 0)
      a = 1 + rnd(G, 3), b = rnd(G, 5);
    else
      return 0;
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

/* The same expression built twice, combined: canonicalisation must merge, not
 * confuse them. */
static int op_shared(gen *G, sub *s) {
  val *a = pick(G, s);
  if (mag(a) > 100)
    return 0;
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
  if (!state)
    OK(lm_output(t, o->name));
}

/* One random graph: inputs, 3..10 random operations, outputs (some through
 * views) and possibly a state with its assign. */
static void gen_sub(gen *G, sub *s, int index) {
  snprintf(s->prefix, sizeof s->prefix, "g%02d_", index);
  s->symbolic = chance(G, 0.4);
  s->base_rank = 1 + rnd(G, 3);
  for (int i = 0; i < s->base_rank; i++)
    s->base[i] = 1 + rnd(G, 5);
  if (s->symbolic) {
    s->base[rnd(G, s->base_rank)] = G->N;
    if (s->base_rank >= 2 && chance(G, 0.3)) {
      int i = rnd(G, s->base_rank);
      if (s->base[i] != G->N)
        s->base[i] = G->M;
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
  int steps = chance(G, 0.25) ? 12 + rnd(G, 13)
                              : 4 + rnd(G, 9); /* a quarter are deep */
  for (int done = 0, tries = 0; done < steps && tries < 60; tries++) {
    int ok;
    switch (rnd(G, 20)) {
    case 0:
    case 1:
    case 2:
      ok = op_unary(G, s);
      break;
    case 3:
    case 4:
    case 5:
    case 6:
      ok = op_add_mul(G, s);
      break;
    case 7:
    case 8:
      ok = op_mod_lt(G, s);
      break;
    case 9:
    case 10:
    case 11:
      ok = op_reduce(G, s);
      break;
    case 12:
    case 13:
    case 14:
      ok = op_view(G, s);
      break;
    case 15:
      ok = op_softmax(G, s);
      break;
    case 16:
      ok = op_rand(G, s);
      break;
    case 17:
      ok = op_shared(G, s);
      break;
    default:
      ok = op_contiguous(G, s);
      break;
    }
    done += ok;
  }
  /* outputs: the last value and up to two that nothing consumed; a third
   * through views */
  for (int k = 0; k < 3; k++) {
    val v = s->pool[s->npool - 1];
    if (k > 0) {
      int start = rnd(G, s->npool), found = -1;
      for (int j = 0; j < s->npool && found < 0; j++)
        if (unused(s, &s->pool[(start + j) % s->npool]) &&
            (start + j) % s->npool != s->npool - 1)
          found = (start + j) % s->npool;
      if (found < 0 || chance(G, 0.3))
        continue;
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
    /* the new state: an exact value of the state's shape, folded into (-2, 2)
     * by fmod so the next run sees values the generator planned for,
     * bit-identical on both backends */
    val *cand = NULL;
    int start = rnd(G, s->npool);
    for (int k = 0; k < s->npool && !cand; k++) {
      val *v = &s->pool[(start + k) % s->npool];
      lm_dim d[LM_MAX_RANK];
      int r = shape_of(v->t, d),
          same = v->exact && v->id != state.id && r == s->base_rank;
      for (int i = 0; same && i < r; i++)
        same = lm_dim_equal(G->g, d[i], s->base[i]);
      if (same)
        cand = v;
    }
    lm_tensor src;
    if (cand) {
      src = cand->t;
      sub_log(s, "  assign %s = fmod(t%d, 2)", state_name, cand->id);
    } else {
      src = lm_add(lm_mul_scalar(state.t, 1.5f), lm_const(G->g, 0.375f));
      sub_log(s, "  assign %s = fmod(1.5 t%d + 0.375, 2)", state_name,
              state.id);
    }
    lm_tensor v = lm_mod(src, lm_const(G->g, 2.0f));
    if (s->base_rank >= 2 &&
        chance(G, 0.3)) { /* through a view that gives back the shape */
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
    if (has_state && chance(G, 0.5))
      v = state;
    sub_log(s, "  output %so%d = t%d", s->prefix, G->nout + 1, v.id);
    view_step(G, s, &v);
    expect_ok(G, s, v.t);
    sub_log(s, "\n");
    add_output(G, s, &v, v.t, 0);
  }
}

void rg_program(gen *G, uint64_t seed) {
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
  for (int i = 0; i < NSUB; i++)
    gen_sub(G, &G->subs[i], i);
  OK(lm_graph_validate(G->g));
}

/* ================================================================ reporting
 * and comparing */

void rg_fail(gen *G, int which, const char *source, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *dump = lm_graph_dump(G->g);
  cr_log_error("whole graph (lm_graph_dump):\n%s",
               dump ? dump : "(dump failed)");
  free(dump);
  if (source)
    cr_log_error("generated source (LUMEN_DUMP): %s",
                 *source ? source : "(not found)");
  const sub *s = &G->subs[which];
  cr_assert_fail("%s\n%.*s", msg, (int)s->len, s->desc);
}

void rg_check_output(gen *G, const outp *o, const float *got, const float *ref,
                     size_t n, const char *backend, rg_exact exact, double rtol,
                     double atol, const char *source, const char *when) {
  double tol = atol * fmax(1.0, o->err);
  int strict = o->exact && exact != RG_EXACT_TOLERANCE;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(ref[i]))
      rg_fail(G, o->sub, source,
              "%s: ref's %s[%zu] = %g is not finite (a generator bug)", when,
              o->name, i, (double)ref[i]);
    int good =
        !strict ? fabs((double)got[i] - ref[i]) <= rtol * fabs(ref[i]) + tol
        : exact == RG_EXACT_BITS ? !memcmp(&got[i], &ref[i], sizeof(float))
                                 : got[i] == ref[i];
    if (!good) {
      char how[48];
      if (strict)
        snprintf(how, sizeof how, "exact: must match bit for bit");
      else
        snprintf(how, sizeof how, "rtol %g", rtol);
      rg_fail(G, o->sub, source,
              "%s: %s[%zu] of %zu: %s %.9g, ref %.9g (%s, atol %.3g)", when,
              o->name, i, n, backend, (double)got[i], (double)ref[i], how, tol);
    }
  }
}

/* Output o of both programs, read into NaN-poisoned buffers and checked. */
static void compare(gen *G, lm_program_t *pd, lm_program_t *pr,
                    const char *backend, const outp *o, double rtol,
                    double atol, const char *source, const char *when) {
  size_t nd = 0, nr = 0;
  OK(lm_program_numel(pd, o->name, &nd));
  OK(lm_program_numel(pr, o->name, &nr));
  cr_assert_eq(nd, nr, "%s: %s has %zu elements on %s, %zu on ref", when,
               o->name, nd, backend, nr);
  float *got = malloc((nd ? nd : 1) * sizeof *got),
        *ref = malloc((nd ? nd : 1) * sizeof *ref);
  cr_assert(got && ref);
  check_poison(got, nd);
  check_poison(ref, nd);
  OK(lm_program_read(pd, o->name, got, nd));
  OK(lm_program_read(pr, o->name, ref, nd));
  rg_check_output(G, o, got, ref, nd, backend, RG_EXACT_EQUAL, rtol, atol,
                  source, when);
  free(got);
  free(ref);
}

void rg_run_against_ref(gen *G, lm_program_t *pd, lm_program_t *pr,
                        const char *backend, uint64_t seed, double rtol,
                        double atol, const char *source) {
  lm_program_set_seed(pd, seed);
  lm_program_set_seed(pr, seed);
  check_rng data = check_rng_new(seed ^ 0xda7a);
  for (size_t bi = 0; bi < CHECK_COUNT(rg_bindings); bi++) {
    OK(lm_program_bind(pd, "N", rg_bindings[bi][0]));
    OK(lm_program_bind(pr, "N", rg_bindings[bi][0]));
    OK(lm_program_bind(pd, "M", rg_bindings[bi][1]));
    OK(lm_program_bind(pr, "M", rg_bindings[bi][1]));
    for (int i = 0; i < G->nin; i++) {
      size_t n = 0;
      OK(lm_program_numel(pd, G->in[i].name, &n));
      float *v = malloc((n ? n : 1) * sizeof *v);
      cr_assert(v);
      check_fill(&data, v, n, G->in[i].lo, G->in[i].hi, 0.05);
      OK(lm_program_write(pd, G->in[i].name, v, n));
      OK(lm_program_write(pr, G->in[i].name, v, n));
      free(v);
    }
    for (int run = 0; run < (bi == 0 ? 2 : 1); run++) {
      if (lm_program_run(pd) != LM_OK)
        rg_fail(G, 0, source, "%s run: %s", backend, lm_last_error());
      OK(lm_program_run(pr));
      char when[128];
      snprintf(when, sizeof when, "seed %#llx, N=%lld M=%lld, run %d",
               (unsigned long long)seed, (long long)rg_bindings[bi][0],
               (long long)rg_bindings[bi][1], run);
      for (int o = 0; o < G->nout; o++)
        compare(G, pd, pr, backend, &G->out[o], rtol, atol, source, when);
    }
  }
}
