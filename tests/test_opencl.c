/* The device backend suite, against the ref interpreter (the oracle). This file runs it on the
 * opencl backend (PoCL in CI: real work-groups and barriers on the CPU); tests/test_cuda_gpu.c
 * includes it with DEVICE "cuda" to run the same checks on a GPU. When the device cannot be
 * opened every test is skipped, naming the reason ("no OpenCL device: ...").
 * - a property test over random graphs (tests/test_cpu.c's generator, copied: every primitive,
 *   broadcasting, every view kind, reductions, shared subexpressions, CONTIGUOUS, RAND, symbolic
 *   N and M under several bindings without recompiling, views as outputs, assigns to state);
 *   fewer graphs than on cpu, since the device compiler is the slow part;
 * - scans: a forward recurrence and a reverse discounted sum (fused into one kernel), a step
 *   reading other envs' carry forward and reverse with per-step inputs and outputs (run step by
 *   step), the carry kept across runs;
 * - RAND bit-identical to lm_rand_uniform (lumen/rand.h) in plain runs and inside scans
 *   (run counter run*T + t), with a seed above 2^32 and a run counter set past 2^32;
 * - assigns across runs, rebinding, and a program reading another's buffer (lm_program_link);
 * - opencl only: LUMEN_OPENCL_DEVICE, build errors (log + source + a file keeping both), the
 *   `rltrain compile --target opencl` path for CartPole, and "auto" never picking opencl.
 *
 * Tolerances: as in test_cpu.c, |device - ref| <= 2e-5 |ref| + 1e-5 S for values downstream of
 * sin/exp2/log2 (S bounds their magnitude); everything else (+, *, 1/x and sqrt correctly
 * rounded, fmod, <, max, sequential sums, RAND) must match bit for bit: OpenCL is built with
 * -cl-fp32-correctly-rounded-divide-sqrt and FP_CONTRACT OFF, CUDA with --fmad=false. Outputs
 * are NaN-poisoned before every read. */
#define _DEFAULT_SOURCE /* mkdtemp, setenv */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "graph-impl.h"
#include "loopir.h"
#include "lumen/lumen.h"
#include "lumen/rand.h"
#include "passes.h"
#include "support/check.h"

#ifndef DEVICE
#define DEVICE "opencl"     /* the backend under test */
#define DEVICE_TEXT "OpenCL" /* in skip messages */
#define DEVICE_SRC_EXT ".cl" /* LUMEN_DUMP files of the backend */
#define DEVICE_IS_OPENCL 1
#endif

#define RTOL 2e-5
#define ATOL 1e-5

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

/* Under LeakSanitizer (the sanitizer build): the OpenCL compiler PoCL runs LLVM inside this
 * process, and LLVM keeps what it allocates while compiling until exit; those are not lumen's. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LUMEN_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(LUMEN_TEST_ASAN)
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libLLVM\nleak:libpocl\nleak:libstdc++\n"; }
#endif

/* The device, or the test is skipped with the reason it could not be opened. */
static lm_backend_t *open_device(void) {
  lm_backend_t *b = lm_backend_new(DEVICE);
  if (!b) cr_skip_test("no " DEVICE_TEXT " device: %s", lm_last_error());
  return b;
}

static lm_backend_t *open_ref(void) {
  lm_backend_t *b = lm_backend_new("ref");
  cr_assert(b, "ref: %s", lm_last_error());
  return b;
}

/* ---------------------------------------------------------------- temporary directories */

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* The device source file in dir that is not in `seen` (a '\n'-separated list, updated). */
static void new_source(const char *dir, char *seen, size_t cap, char *path, size_t pcap) {
  path[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  size_t ext = strlen(DEVICE_SRC_EXT);
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len <= ext || strcmp(e->d_name + len - ext, DEVICE_SRC_EXT)) continue;
    char key[300];
    snprintf(key, sizeof key, "%s\n", e->d_name);
    if (strstr(seen, key)) continue;
    snprintf(path, pcap, "%s/%s", dir, e->d_name);
    if (strlen(seen) + strlen(key) < cap) strcat(seen, key);
  }
  closedir(d);
}

/* ================================================================ the random graph generator
 * Copied from tests/test_cpu.c (keep the two in step). */

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


/* ================================================================ the device against ref */

static void fail_report(gen *G, int which, const char *source, const char *fmt, ...) LM_PRINTF(4, 5);
static void fail_report(gen *G, int which, const char *source, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *dump = lm_graph_dump(G->g);
  cr_log_error("whole graph (lm_graph_dump):\n%s", dump ? dump : "(dump failed)");
  free(dump);
  cr_log_error("generated source (LUMEN_DUMP): %s", source && *source ? source : "(not found)");
  const sub *s = &G->subs[which];
  cr_assert_fail("%s\n%.*s", msg, (int)s->len, s->desc);
}

static void compare(gen *G, lm_program_t *pd, lm_program_t *pr, const outp *o, const char *source, const char *when) {
  size_t nd = 0, nr = 0;
  OK(lm_program_numel(pd, o->name, &nd));
  OK(lm_program_numel(pr, o->name, &nr));
  cr_assert_eq(nd, nr, "%s: %s has %zu elements on " DEVICE ", %zu on ref", when, o->name, nd, nr);
  float *got = malloc((nd ? nd : 1) * sizeof *got), *ref = malloc((nd ? nd : 1) * sizeof *ref);
  cr_assert(got && ref);
  check_poison(got, nd);
  check_poison(ref, nd);
  OK(lm_program_read(pd, o->name, got, nd));
  OK(lm_program_read(pr, o->name, ref, nd));
  double atol = ATOL * fmax(1.0, o->err);
  for (size_t i = 0; i < nd; i++) {
    if (!isfinite(ref[i]))
      fail_report(G, o->sub, source, "%s: ref's %s[%zu] = %g is not finite (a generator bug)", when, o->name, i,
                  (double)ref[i]);
    int good = o->exact ? got[i] == ref[i] : fabs((double)got[i] - ref[i]) <= RTOL * fabs(ref[i]) + atol;
    if (!good)
      fail_report(G, o->sub, source, "%s: %s[%zu] of %zu: " DEVICE " %.9g, ref %.9g (%s, atol %.3g)", when, o->name, i,
                  nd, (double)got[i], (double)ref[i], o->exact ? "exact: must match bit for bit" : "rtol 2e-5", atol);
  }
  free(got);
  free(ref);
}

/* One program of NSUB random graphs, on the device and on ref, under every binding (the first
 * one twice, so the assigned state feeds a second run), everything compared. */
static void property_program(lm_backend_t *dev, lm_backend_t *ref, uint64_t seed, const char *dump_dir, char *seen,
                             size_t seen_cap) {
  gen *G = calloc(1, sizeof *G);
  cr_assert(G);
  gen_program(G, seed);
  lm_program_t *pd = lm_program_new(dev, G->g), *pr = lm_program_new(ref, G->g);
  char source[1024];
  new_source(dump_dir, seen, seen_cap, source, sizeof source);
  if (!pd || !pr) fail_report(G, 0, source, "seed %#llx: lm_program_new: %s", (unsigned long long)seed, lm_last_error());
  lm_program_set_seed(pd, seed);
  lm_program_set_seed(pr, seed);
  check_rng data = check_rng_new(seed ^ 0xda7a);
  for (size_t bi = 0; bi < CHECK_COUNT(bindings); bi++) {
    OK(lm_program_bind(pd, "N", bindings[bi][0]));
    OK(lm_program_bind(pr, "N", bindings[bi][0]));
    OK(lm_program_bind(pd, "M", bindings[bi][1]));
    OK(lm_program_bind(pr, "M", bindings[bi][1]));
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
      if (lm_program_run(pd) != LM_OK) fail_report(G, 0, source, DEVICE " run: %s", lm_last_error());
      OK(lm_program_run(pr));
      char when[128];
      snprintf(when, sizeof when, "seed %#llx, N=%lld M=%lld, run %d", (unsigned long long)seed,
               (long long)bindings[bi][0], (long long)bindings[bi][1], run);
      for (int o = 0; o < G->nout; o++) compare(G, pd, pr, &G->out[o], source, when);
    }
  }
  lm_program_free(pd);
  lm_program_free(pr);
  lm_graph_free(G->g);
  free(G);
}

/* PROGRAMS programs of NSUB random graphs each per part (seeds differ from test_cpu.c's). */
enum { PROGRAMS = 2 };

static void property_part(int part) {
  lm_backend_t *dev = open_device(), *ref = open_ref();
  char dir[] = "/tmp/lumen-test-" DEVICE "-XXXXXX";
  cr_assert(mkdtemp(dir));
  setenv("LUMEN_DUMP", dir, 1);
  char *seen = calloc(1, 1 << 16);
  cr_assert(seen);
  for (int i = 0; i < PROGRAMS; i++)
    property_program(dev, ref, 0xd1b54a32d192ed03ull * (uint64_t)(part * PROGRAMS + i + 1), dir, seen, 1 << 16);
  free(seen);
  lm_backend_free(dev);
  lm_backend_free(ref);
  unsetenv("LUMEN_DUMP");
  remove_tree(dir); /* kept when a check failed: the report names the source in it */
}

Test(device_vs_ref, random_graphs_part_1_of_2, .timeout = 240) { property_part(0); }
Test(device_vs_ref, random_graphs_part_2_of_2, .timeout = 240) { property_part(1); }

/* ================================================================ scans */

static void put(lm_program_t *p, const char *name, const float *v, size_t n) {
  size_t have = 0;
  OK(lm_program_numel(p, name, &have));
  cr_assert_eq(have, n, "%s holds %zu elements, the test has %zu", name, have, n);
  OK(lm_program_write(p, name, v, n));
}

/* n floats read into a fresh NaN-poisoned buffer */
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

static int kernels_per_run(lm_program_t *p) {
  lm_program_stats s;
  OK(lm_program_get_stats(p, &s));
  return s.kernels;
}

/* A scan program on the device and on ref, fed the same inputs, run `runs` times; every output
 * and state compared bit for bit after every run. Returns the device's kernels per run. */
typedef struct scan_case {
  const char *name;
  lm_graph_t *g;
  int reverse;
  const char *per_step[4];
  int n_per_step;
  const char *state[4]; /* compared after every run */
  int n_state;
  const char *outputs[4];
  int n_outputs;
} scan_case;

static int run_scan_case(const scan_case *sc, const int64_t (*sizes)[2], size_t nsizes, int runs, uint64_t seed) {
  lm_backend_t *dev = open_device(), *ref = open_ref();
  lm_program_t *p[2];
  lm_backend_t *be[2] = {dev, ref};
  for (int i = 0; i < 2; i++) {
    p[i] = lm_program_new_scan(be[i], sc->g, "T", sc->reverse, sc->per_step, sc->n_per_step);
    cr_assert(p[i], "%s on %s: %s", sc->name, lm_backend_name(be[i]), lm_last_error());
    lm_program_set_seed(p[i], seed);
  }
  int kernels = 0;
  check_rng r = check_rng_new(seed);
  for (size_t c = 0; c < nsizes; c++) {
    int64_t T = sizes[c][0], N = sizes[c][1];
    for (int i = 0; i < 2; i++) {
      OK(lm_program_bind(p[i], "T", T));
      OK(lm_program_bind(p[i], "N", N));
    }
    for (int run = 0; run < runs; run++) {
      for (int k = 0; k < lm_program_input_count(p[0]); k++) {
        const char *name = lm_program_input_name(p[0], k);
        if (run > 0 && lm_program_input_role(p[0], k) == LM_ROLE_STATE) continue; /* the carry goes on */
        size_t n = 0;
        OK(lm_program_numel(p[0], name, &n));
        float *v = rand_floats(&r, n, -2, 2);
        for (int i = 0; i < 2; i++) put(p[i], name, v, n);
        free(v);
      }
      for (int i = 0; i < 2; i++) OK(lm_program_run(p[i]));
      for (int k = 0; k < sc->n_outputs + sc->n_state; k++) {
        const char *name = k < sc->n_outputs ? sc->outputs[k] : sc->state[k - sc->n_outputs];
        size_t n = 0;
        OK(lm_program_numel(p[1], name, &n));
        float *got = get(p[0], name, n), *want = get(p[1], name, n);
        char what[160];
        snprintf(what, sizeof what, "%s T=%lld N=%lld run %d: %s (" DEVICE " vs ref)", sc->name, (long long)T,
                 (long long)N, run, name);
        expect_bits(what, got, want, n);
        free(got);
        free(want);
      }
    }
    kernels = kernels_per_run(p[0]);
  }
  for (int i = 0; i < 2; i++) lm_program_free(p[i]);
  lm_backend_free(dev);
  lm_backend_free(ref);
  lm_graph_free(sc->g);
  return kernels;
}

static const int64_t scan_sizes[][2] = {{1, 1}, {4, 3}, {17, 70}, {3, 300}};

/* step: h' = 0.5 h + x_t; y_t = h' */
Test(device_scan, forward_recurrence_is_one_kernel_and_matches_ref_bit_for_bit) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_mul_scalar(h, 0.5f), x);
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  scan_case sc = {"recurrence", g, 0, {"x"}, 1, {"h"}, 1, {"y"}, 1};
  int k = run_scan_case(&sc, scan_sizes, CHECK_COUNT(scan_sizes), 2, 1);
  cr_assert_eq(k, 1, "an env-local scan took %d kernels per run", k);
}

/* step: a' = r_t + 0.97 (1 - done_t) a; ret_t = a' (reverse) */
Test(device_scan, reverse_discounted_sum_is_one_kernel_and_matches_ref_bit_for_bit) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor a = lm_input(g, "a", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor rw = lm_input(g, "r", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor done = lm_input(g, "done", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor keep = lm_sub(lm_scalar_like(done, 1.0f), done);
  lm_tensor a2 = lm_add(rw, lm_mul(lm_mul_scalar(keep, 0.97f), a));
  OK(lm_output(a2, "ret"));
  OK(lm_assign(a, a2));
  scan_case sc = {"discount", g, 1, {"r", "done"}, 2, {"a"}, 1, {"ret"}, 1};
  int k = run_scan_case(&sc, scan_sizes, CHECK_COUNT(scan_sizes), 2, 2);
  cr_assert_eq(k, 1, "an env-local reverse scan took %d kernels per run", k);
}

/* step: h' = 0.5 (h - mean h) + sum x_t; y_t = h'; z_t = h' h + RAND (every env reads every
 * other's carry: not fusable, so the device runs the step T times with slices of x, y and z and
 * run counter run*T + t), forward and reverse */
static lm_graph_t *coupled_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 2});
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_sub(h, lm_mean(h, 0, 1)), 0.5f), lm_sum(x, 1, 0));
  OK(lm_output(h2, "y"));
  OK(lm_output(lm_add(lm_mul(lm_contiguous(h2), h), lm_rand_stream(g, 3, 1, (lm_dim[]){N})), "z"));
  OK(lm_assign(h, h2));
  return g;
}

static void coupled(int reverse) {
  static const int64_t sizes[][2] = {{1, 2}, {7, 70}, {5, 3}};
  scan_case sc = {reverse ? "coupled reverse" : "coupled forward", coupled_graph(), reverse, {"x"}, 1, {"h"}, 1,
                  {"y", "z"}, 2};
  int k = run_scan_case(&sc, sizes, CHECK_COUNT(sizes), 2, 3);
  cr_assert(k >= 5 && k % 5 == 0, "%d kernels per run for 5 steps of a step that is not env-local", k);
}

Test(device_scan, a_step_reading_other_envs_runs_step_by_step_forward_and_matches_ref) { coupled(0); }
Test(device_scan, a_step_reading_other_envs_runs_step_by_step_in_reverse_and_matches_ref) { coupled(1); }

/* ================================================================ RAND */

static void expect_rand(const char *what, const float *got, uint64_t seed, uint32_t stream, uint64_t run, size_t n) {
  for (size_t e = 0; e < n; e++) {
    float want = lm_rand_uniform(seed, stream, e, run);
    cr_assert(got[e] == want, "%s: element %zu = %a, lm_rand_uniform gives %a", what, e, (double)got[e], (double)want);
  }
}

Test(device_rand, rand_is_bit_identical_to_lm_rand_uniform_across_runs_seeds_and_run_counters) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  OK(lm_output(lm_rand_stream(g, 5, 2, (lm_dim[]){N, 3}), "u"));
  OK(lm_output(lm_rand_stream(g, 1u << 20, 1, (lm_dim[]){N}), "v"));
  lm_backend_t *b = open_device();
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", lm_last_error());
  const uint64_t seed = 0xfedcba9876543210ull; /* both key words matter */
  lm_program_set_seed(p, seed);
  const size_t n = 1001;
  OK(lm_program_bind(p, "N", (int64_t)n));
  uint64_t runs[] = {0, 1, 2, 0x1234567890ull, 0x1234567891ull};
  for (size_t i = 0; i < CHECK_COUNT(runs); i++) {
    if (i == 3) lm_program_set_run(p, runs[i]);
    cr_assert_eq(lm_program_run_index(p), runs[i]);
    OK(lm_program_run(p));
    char what[64];
    float *u = get(p, "u", 3 * n), *v = get(p, "v", n);
    snprintf(what, sizeof what, "u, run %#llx", (unsigned long long)runs[i]);
    expect_rand(what, u, seed, 5, runs[i], 3 * n);
    snprintf(what, sizeof what, "v, run %#llx", (unsigned long long)runs[i]);
    expect_rand(what, v, seed, 1u << 20, runs[i], n);
    free(u);
    free(v);
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

/* RAND in step t of a scan uses run counter run*T + t: fused (env-local) and step by step */
static void rand_in_scan(int coupled_step) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor c = lm_input(g, "c", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor u = lm_rand_stream(g, 7, 1, (lm_dim[]){N});
  OK(lm_output(u, "u"));
  lm_tensor next = lm_add(c, u);
  if (coupled_step) next = lm_add(next, lm_mul_scalar(lm_mean(c, 0, 1), 0.0f)); /* reads other envs: not fusable */
  OK(lm_assign(c, next));
  lm_backend_t *b = open_device();
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "%s", lm_last_error());
  const uint64_t seed = 0x1234567890abcdefull;
  lm_program_set_seed(p, seed);
  const int64_t T = 9, n = 70;
  OK(lm_program_bind(p, "T", T));
  OK(lm_program_bind(p, "N", n));
  int k = kernels_per_run(p);
  if (coupled_step) cr_assert(k >= T, "a coupled step ran as %d kernels for %lld steps", k, (long long)T);
  else cr_assert_eq(k, 1, "an env-local scan took %d kernels", k);
  float *want = malloc((size_t)(T * n) * sizeof *want);
  for (uint64_t run = 0; run < 4; run++) {
    if (run == 3) lm_program_set_run(p, run = 11);
    for (int64_t t = 0; t < T; t++)
      for (int64_t e = 0; e < n; e++) want[t * n + e] = lm_rand_uniform(seed, 7, (uint64_t)e, run * (uint64_t)T + (uint64_t)t);
    OK(lm_program_run(p));
    char what[64];
    snprintf(what, sizeof what, "run %llu: u", (unsigned long long)run);
    float *got = get(p, "u", (size_t)(T * n));
    expect_bits(what, got, want, (size_t)(T * n));
    free(got);
  }
  free(want);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

Test(device_rand, rand_in_a_fused_scan_draws_with_run_counter_run_times_T_plus_t) { rand_in_scan(0); }
Test(device_rand, rand_in_a_step_by_step_scan_draws_with_run_counter_run_times_T_plus_t) { rand_in_scan(1); }

/* ================================================================ assigns, rebinding, links */

Test(device_program, assigns_persist_across_runs_and_rebinding_resizes) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor s = lm_input(g, "s", LM_ROLE_STATE, 2, (lm_dim[]){N, 3});
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor xt = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 3});
  lm_tensor s2 = lm_add(lm_mul(s, w), lm_transpose(lm_contiguous(lm_transpose(xt, 0, 1)), 0, 1));
  OK(lm_output(lm_sum(s2, 1, 0), "row"));
  OK(lm_assign(s, lm_mod(s2, lm_const(g, 4.0f))));
  lm_backend_t *b = open_device();
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", lm_last_error());
  check_rng r = check_rng_new(11);
  float w0[3] = {0.5f, -1.25f, 2.0f};
  OK(lm_program_write(p, "w", w0, 3));
  const int64_t sizes[] = {5, 130, 1};
  for (size_t c = 0; c < CHECK_COUNT(sizes); c++) {
    size_t n = (size_t)sizes[c];
    OK(lm_program_bind(p, "N", sizes[c]));
    float *s_host = calloc(n * 3, sizeof *s_host), *x = rand_floats(&r, n * 3, -2, 2);
    float *row = malloc(n * sizeof *row);
    OK(lm_program_write(p, "x", x, n * 3));
    float *s0 = get(p, "s", n * 3); /* state starts at zero after a resize */
    for (size_t i = 0; i < n * 3; i++) cr_assert_eq(s0[i], 0.0f, "N=%zu: s[%zu] = %g after a rebind", n, i, (double)s0[i]);
    free(s0);
    for (int run = 0; run < 3; run++) {
      for (size_t e = 0; e < n; e++) {
        float acc = 0;
        for (int j = 0; j < 3; j++) {
          float v = s_host[e * 3 + j] * w0[j] + x[e * 3 + j];
          acc += v;
          s_host[e * 3 + j] = fmodf(v, 4.0f);
        }
        row[e] = acc;
      }
      OK(lm_program_run(p));
      char what[64];
      snprintf(what, sizeof what, "N=%zu run %d: row", n, run);
      float *got = get(p, "row", n);
      expect_bits(what, got, row, n);
      free(got);
      snprintf(what, sizeof what, "N=%zu run %d: state s", n, run);
      got = get(p, "s", n * 3);
      expect_bits(what, got, s_host, n * 3);
      free(got);
    }
    free(s_host);
    free(x);
    free(row);
  }
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
}

Test(device_program, a_linked_input_reads_the_owner_programs_buffer_on_the_device) {
  lm_graph_t *ga = lm_graph_new(), *gb = lm_graph_new();
  lm_dim Na = lm_sym(ga, "N"), Nb = lm_sym(gb, "N");
  lm_tensor x = lm_input(ga, "x", LM_ROLE_DATA, 1, (lm_dim[]){Na});
  OK(lm_output(lm_mul(x, x), "sq"));
  lm_tensor y = lm_input(gb, "sq", LM_ROLE_DATA, 1, (lm_dim[]){Nb});
  OK(lm_output(lm_add_scalar(y, 1.0f), "out"));
  lm_backend_t *b = open_device();
  lm_program_t *pa = lm_program_new(b, ga), *pb = lm_program_new(b, gb);
  cr_assert(pa && pb, "%s", lm_last_error());
  OK(lm_program_bind(pa, "N", 100));
  OK(lm_program_bind(pb, "N", 100));
  OK(lm_program_link(pb, "sq", pa, "sq"));
  check_rng r = check_rng_new(5);
  for (int run = 0; run < 2; run++) {
    float *v = rand_floats(&r, 100, -3, 3), want[100];
    for (int i = 0; i < 100; i++) want[i] = v[i] * v[i] + 1.0f;
    OK(lm_program_write(pa, "x", v, 100));
    OK(lm_program_run(pa));
    OK(lm_program_run(pb));
    float *got = get(pb, "out", 100);
    expect_bits("out", got, want, 100);
    free(got);
    free(v);
  }
  lm_program_free(pb);
  lm_program_free(pa);
  lm_backend_free(b);
  lm_graph_free(ga);
  lm_graph_free(gb);
}

#ifdef DEVICE_IS_OPENCL
/* ================================================================ opencl only */

#include "nvrtc.h" /* lm_opencl_build_check */

Test(opencl, lumen_opencl_device_that_matches_nothing_fails_listing_the_devices) {
  lm_backend_free(open_device()); /* skips without a platform */
  setenv("LUMEN_OPENCL_DEVICE", "no-such-device-anywhere", 1);
  lm_backend_t *b = lm_backend_new("opencl");
  unsetenv("LUMEN_OPENCL_DEVICE");
  cr_assert_null(b, "opencl opened a device for LUMEN_OPENCL_DEVICE=no-such-device-anywhere");
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "LUMEN_OPENCL_DEVICE=no-such-device-anywhere") && strstr(msg, "0:0"),
            "the message names neither the setting nor the devices: %s", msg);
  setenv("LUMEN_OPENCL_DEVICE", "0:0", 1);
  b = lm_backend_new("opencl");
  unsetenv("LUMEN_OPENCL_DEVICE");
  cr_assert(b, "LUMEN_OPENCL_DEVICE=0:0: %s", lm_last_error());
  lm_backend_free(b);
}

Test(opencl, a_build_error_carries_the_build_log_and_the_source_and_keeps_both_in_a_file) {
  lm_backend_free(open_device());
  const char *src = "__kernel void broken(__global float *b) { b[0] = undeclared_name_42; }\n";
  char desc[256] = "";
  lm_status st = lm_opencl_build_check(src, "broken.cl", desc, sizeof desc);
  cr_assert_eq(st, LM_ERR_COMPILE, "%s: %s", lm_status_name(st), lm_last_error());
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "build log") && strstr(msg, "undeclared_name_42") && strstr(msg, "broken.cl"),
            "message lacks the log or the source: %s", msg);
  const char *at = strstr(msg, " in /");
  cr_assert(at, "no file named: %s", msg);
  char path[1024];
  cr_assert_eq(sscanf(at + 4, "%1023s", path), 1);
  FILE *f = fopen(path, "r");
  cr_assert(f, "the named file %s does not exist", path);
  char text[4096];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  cr_assert(strstr(text, src), "%s does not hold the source", path);
  unlink(path);
  cr_assert(strstr(desc, "OpenCL on"), "describe: %s", desc);
}

Test(opencl, rltrain_compile_target_opencl_builds_every_kernel_of_a_cartpole_iteration, .timeout = 120) {
  lm_backend_free(open_device());
  lm_compile_report r;
  lm_status st = lm_compile_iteration("cartpole", LM_TARGET_OPENCL, NULL, &r);
  cr_assert_eq(st, LM_OK, "%s: %s", lm_status_name(st), lm_last_error());
  cr_assert(strstr(r.compiler, "OpenCL on"), "compiler: %s", r.compiler);
  int rollout = 0, update = 0;
  for (size_t k = 0; k < r.n; k++) {
    rollout += !strcmp(r.kernels[k].graph, "rollout");
    update += !strcmp(r.kernels[k].graph, "update");
    cr_assert_eq(r.kernels[k].registers, -1, "OpenCL reports no register counts");
  }
  cr_assert(rollout >= 1 && update >= 1, "%d rollout and %d update kernels", rollout, update);
  lm_compile_report_free(&r);
}

Test(opencl, auto_never_picks_opencl) {
  char why[512] = "";
  lm_backend_t *b = lm_backend_open("auto", why, sizeof why);
  cr_assert(b, "auto: %s", lm_last_error());
  cr_assert_str_neq(lm_backend_name(b), "opencl", "auto picked opencl: %s", why);
  lm_backend_free(b);
}
#endif
