/* bench/rlbench.c — rlbench, lumen's benchmark tool (DESIGN.md §8): a table of named benchmarks,
 * selectable from the command line, each timing lumen side by side with a baseline measured in the
 * same run, printed as a table and optionally written as JSON. Only the public API is used.
 * Today it measures the compiler's cpu backend; env, rollout and training benchmarks join the
 * table in `benches[]` as they land. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "lumen/lumen.h"

/* ================================================================ options */

enum { MAX_THREAD_SETTINGS = 8, EXIT_USAGE = 2 };

typedef struct opts {
  int64_t n;       /* elements of the elementwise chain on cpu */
  int64_t ref_n;   /* elements of the chain on the ref interpreter */
  int reps;        /* timed repetitions; medians and minima are over these */
  int quick;       /* skip the slowest cases (1024^3 matmul) */
  const char *json;
  const char *only;
  int threads[MAX_THREAD_SETTINGS]; /* 0 = the pool's default ($LUMEN_THREADS or every online CPU) */
  int nthreads;
} opts;

/* ================================================================ output */

/* The table goes to stdout, or to stderr when the JSON does (--json -). */
static FILE *table_out;

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(table_out ? table_out : stdout, fmt, ap);
  va_end(ap);
}

/* ================================================================ results (table + JSON) */

/* Every number printed is also recorded as one flat JSON object per row. */
typedef struct field {
  char key[32];
  int is_str;
  double num;
  char str[192];
} field;

typedef struct record {
  field f[24];
  int n;
} record;

static record *records;
static size_t nrecords, caprecords;

static record *rec_new(const char *bench, const char *variant) {
  if (nrecords == caprecords) {
    size_t cap = caprecords ? 2 * caprecords : 32;
    record *r = realloc(records, cap * sizeof *r);
    if (!r) {
      fputs("rlbench: out of memory\n", stderr);
      exit(1);
    }
    records = r;
    caprecords = cap;
  }
  record *r = &records[nrecords++];
  memset(r, 0, sizeof *r);
  field *f = &r->f[r->n++];
  snprintf(f->key, sizeof f->key, "bench");
  f->is_str = 1;
  snprintf(f->str, sizeof f->str, "%s", bench);
  f = &r->f[r->n++];
  snprintf(f->key, sizeof f->key, "variant");
  f->is_str = 1;
  snprintf(f->str, sizeof f->str, "%s", variant);
  return r;
}

static void rec_num(record *r, const char *key, double v) {
  if (r->n == (int)(sizeof r->f / sizeof r->f[0])) return;
  field *f = &r->f[r->n++];
  snprintf(f->key, sizeof f->key, "%s", key);
  f->num = v;
}

static void rec_str(record *r, const char *key, const char *fmt, ...) {
  if (r->n == (int)(sizeof r->f / sizeof r->f[0])) return;
  field *f = &r->f[r->n++];
  snprintf(f->key, sizeof f->key, "%s", key);
  f->is_str = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->str, sizeof f->str, fmt, ap);
  va_end(ap);
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void json_number(FILE *f, double v) {
  if (!isfinite(v))
    fputs("null", f);
  else if (v == floor(v) && fabs(v) < 9e15)
    fprintf(f, "%.0f", v);
  else
    fprintf(f, "%.6g", v);
}

/* ================================================================ host facts */

static int online_cpus(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c < 1 ? 1 : (int)c;
}

static void cpu_model(char *buf, size_t cap) {
  snprintf(buf, cap, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10)) continue;
    char *v = strchr(line, ':');
    if (!v) break;
    for (v++; *v == ' ' || *v == '\t'; v++) {
    }
    v[strcspn(v, "\n")] = 0;
    snprintf(buf, cap, "%s", v);
    break;
  }
  fclose(f);
}

/* How the naive baselines in this file were compiled: the project's flags (CMake's build type
 * plus -std=c11 -Wall -Wextra -Wshadow), judged from the predefined macros. */
static const char *self_compiler(void) {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "an unknown C compiler";
#endif
}

static const char *self_isa(void) {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2 baseline, no -march";
#else
  return "baseline ISA";
#endif
}

static const char *self_opt(void) {
#if defined(__OPTIMIZE_SIZE__)
  return "-Os";
#elif defined(__OPTIMIZE__)
#if defined(NDEBUG)
  return "optimised, NDEBUG (the default RelWithDebInfo build: -O2 -g -DNDEBUG)";
#else
  return "optimised, asserts on";
#endif
#else
  return "NOT optimised (-O0: a Debug build; naive numbers are meaningless)";
#endif
}

/* ================================================================ timing */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One unit of work; returns 0 on success. */
typedef int (*work_fn)(void *arg);

typedef struct timing {
  double med, min; /* seconds per call */
  int reps, iters; /* repetitions, calls per repetition */
} timing;

enum { MAX_REPS = 1000 };
static const double TARGET_REP_S = 0.04; /* calls per repetition are batched to about this long */
static const double SLOW_CALL_S = 2.0;   /* calls slower than this get at most 3 repetitions */

/* One warm-up call; unless it took TARGET_REP_S or more, a second call sizes the batches. Then
 * `reps` batches of `iters` calls; the median and minimum are over batches, divided by iters. */
static int time_work(work_fn fn, void *arg, int reps, timing *t) {
  double t0 = now_s();
  if (fn(arg)) return 1;
  double one = now_s() - t0;
  if (one < TARGET_REP_S) {
    t0 = now_s();
    if (fn(arg)) return 1;
    one = now_s() - t0;
  }
  int iters = one >= TARGET_REP_S ? 1 : (int)ceil(TARGET_REP_S / (one > 1e-7 ? one : 1e-7));
  if (iters > 100000) iters = 100000;
  if (one > SLOW_CALL_S && reps > 3) reps = 3;
  double s[MAX_REPS];
  for (int r = 0; r < reps; r++) {
    double a = now_s();
    for (int i = 0; i < iters; i++)
      if (fn(arg)) return 1;
    s[r] = (now_s() - a) / iters;
  }
  qsort(s, (size_t)reps, sizeof s[0], cmp_double);
  t->med = reps % 2 ? s[reps / 2] : 0.5 * (s[reps / 2 - 1] + s[reps / 2]);
  t->min = s[0];
  t->reps = reps;
  t->iters = iters;
  return 0;
}

static void rec_timing(record *r, const timing *t) {
  rec_num(r, "ms_median", 1e3 * t->med);
  rec_num(r, "ms_min", 1e3 * t->min);
  rec_num(r, "reps", t->reps);
  rec_num(r, "iters_per_rep", t->iters);
}

/* ================================================================ shared helpers */

static int fail_lm(const char *what) {
  fprintf(stderr, "rlbench: %s: %s\n", what, lm_last_error());
  return 1;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
/* Uniform in [lo, hi) (xorshift64*: deterministic, never exactly zero-filled). */
static float uniform(float lo, float hi) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  uint64_t v = rng_state * 0x2545f4914f6cdd1dull;
  return lo + (hi - lo) * (float)((double)(v >> 40) / 16777216.0);
}

static float *alloc_floats(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  if (!p) {
    fputs("rlbench: out of memory\n", stderr);
    exit(1);
  }
  return p;
}

/* max |a - b| / max |b|: a normwise relative error, so single entries near zero do not dominate. */
static double rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]), m = fabs((double)b[i]);
    if (!(d <= num)) num = d; /* NaN propagates */
    if (m > den) den = m;
  }
  return den > 0 ? num / den : num;
}

/* The thread setting as LUMEN_THREADS, before the cpu backend (and its pool) is opened. */
static char *saved_threads_env;
static double first_open_s = -1; /* the process's first cpu backend open: it probes the compiler */
static int thread_label(int setting) {
  if (setting > 0) return setting;
  if (saved_threads_env) return atoi(saved_threads_env);
  return online_cpus();
}

static lm_backend_t *open_cpu(int setting) {
  char v[32];
  if (setting > 0) {
    snprintf(v, sizeof v, "%d", setting);
    setenv("LUMEN_THREADS", v, 1);
  } else if (saved_threads_env) {
    setenv("LUMEN_THREADS", saved_threads_env, 1);
  } else {
    unsetenv("LUMEN_THREADS");
  }
  char why[256];
  double t0 = now_s();
  lm_backend_t *b = lm_backend_open("cpu", why, sizeof why);
  if (!b) fail_lm("cannot open the cpu backend");
  else if (first_open_s < 0) first_open_s = now_s() - t0;
  return b;
}

typedef struct run_arg {
  lm_program_t *p;
} run_arg;

static int run_program(void *arg) {
  run_arg *a = arg;
  if (lm_program_run(a->p) != LM_OK) return fail_lm("lm_program_run");
  return 0;
}

/* ================================================================ fusion: elementwise chains */

/* A chain is a list of steps, each one op applied to y (x is the input). The same list builds the
 * graph and the plain-C version the results are checked against. */
typedef enum chain_op {
  STEP_SIN,
  STEP_EXP2,
  STEP_LOG2,
  STEP_SQRT,
  STEP_RECIP,
  STEP_ABS,
  STEP_MUL_C, /* y * 0.75 */
  STEP_ADD_1, /* y + 1 */
  STEP_ADD_X, /* y + x */
  STEP_MUL_X, /* y * x */
} chain_op;

enum { MAX_CHAIN = 12 };

typedef struct chain_def {
  const char *name;
  const char *text;
  void (*c)(const float *x, float *y, int64_t n); /* the same chain as a plain C loop */
  int nsteps;
  chain_op steps[MAX_CHAIN];
} chain_def;

static void chain_c_transcendental(const float *x, float *y, int64_t n);
static void chain_c_arithmetic(const float *x, float *y, int64_t n);

static const chain_def chains[] = {
    {"transcendental", "y = log2(sqrt(|0.75*exp2(sin x) + x|) + 1)", chain_c_transcendental, 8,
     {STEP_SIN, STEP_EXP2, STEP_MUL_C, STEP_ADD_X, STEP_ABS, STEP_SQRT, STEP_ADD_1, STEP_LOG2}},
    {"arithmetic", "y = x / (sqrt(|(0.75x + x) * x|) + 1)", chain_c_arithmetic, 8,
     {STEP_MUL_C, STEP_ADD_X, STEP_MUL_X, STEP_ABS, STEP_SQRT, STEP_ADD_1, STEP_RECIP, STEP_MUL_X}},
};

static lm_tensor chain_step(chain_op op, lm_tensor y, lm_tensor x) {
  switch (op) {
  case STEP_SIN: return lm_sin(y);
  case STEP_EXP2: return lm_exp2(y);
  case STEP_LOG2: return lm_log2(y);
  case STEP_SQRT: return lm_sqrt(y);
  case STEP_RECIP: return lm_recip(y);
  case STEP_ABS: return lm_abs(y);
  case STEP_MUL_C: return lm_mul_scalar(y, 0.75f);
  case STEP_ADD_1: return lm_add_scalar(y, 1.0f);
  case STEP_ADD_X: return lm_add(y, x);
  case STEP_MUL_X: return lm_mul(y, x);
  }
  return lm_sin(y);
}

/* The chains as plain C loops (scalar libm; compiled into rlbench with the project's flags). */
static void chain_c_transcendental(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = log2f(sqrtf(fabsf(exp2f(sinf(x[i])) * 0.75f + x[i])) + 1.0f);
}

static void chain_c_arithmetic(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = 1.0f / (sqrtf(fabsf((x[i] * 0.75f + x[i]) * x[i])) + 1.0f) * x[i];
}

/* How the chain is built. CONTIGUOUS is what "unfused" would naturally be, but the canonicaliser
 * drops a contiguous of an unviewed tensor (it copies the buffer unchanged), so it stays one
 * kernel; OUTPUTS forces materialisation by naming every intermediate an output. */
typedef enum chain_mode { CHAIN_FUSED, CHAIN_CONTIGUOUS, CHAIN_OUTPUTS } chain_mode;

static lm_graph_t *chain_graph(const chain_def *c, chain_mode mode) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_dim n = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, &n), y = x;
  int bad = 0;
  for (int s = 0; s < c->nsteps; s++) {
    y = chain_step(c->steps[s], y, x);
    if (s + 1 == c->nsteps) break; /* the last step is the output y */
    if (mode == CHAIN_CONTIGUOUS) y = lm_contiguous(y);
    char name[16];
    snprintf(name, sizeof name, "t%d", s + 1);
    if (mode == CHAIN_OUTPUTS && lm_output(y, name) != LM_OK) bad = 1;
  }
  if (bad || lm_output(y, "y") != LM_OK || lm_graph_validate(g) != LM_OK) {
    fail_lm("building the chain graph");
    lm_graph_free(g);
    return NULL;
  }
  return g;
}

typedef struct chain_result {
  timing t;
  lm_program_stats st;
  double interm_bytes; /* intermediates: the arena plus the outputs other than y */
  double err;
} chain_result;

/* Builds the chain in `mode` on b, checks y against plain C, and times lm_program_run (or, with
 * reps == 0, only reports the stats). */
static int chain_measure(lm_backend_t *b, const chain_def *c, chain_mode mode, int64_t n, const float *x,
                         const float *want, int reps, chain_result *out) {
  memset(out, 0, sizeof *out);
  lm_graph_t *g = chain_graph(c, mode);
  if (!g) return 1;
  lm_program_t *p = lm_program_new(b, g);
  lm_graph_free(g);
  if (!p) return fail_lm("lm_program_new (chain)");
  int rc = 1;
  float *y = alloc_floats((size_t)n);
  if (lm_program_bind(p, "N", n) != LM_OK || lm_program_write(p, "x", x, (size_t)n) != LM_OK) {
    fail_lm("chain: bind/write");
    goto done;
  }
  if (lm_program_get_stats(p, &out->st) != LM_OK) {
    fail_lm("lm_program_get_stats");
    goto done;
  }
  out->interm_bytes = (double)out->st.arena_bytes;
  if (mode == CHAIN_OUTPUTS) out->interm_bytes += (c->nsteps - 1) * 4.0 * (double)n;
  if (reps == 0) {
    rc = 0;
    goto done;
  }
  for (size_t i = 0; i < (size_t)n; i++) y[i] = NAN; /* poison */
  if (lm_program_run(p) != LM_OK || lm_program_read(p, "y", y, (size_t)n) != LM_OK) {
    fail_lm("chain: first run");
    goto done;
  }
  out->err = rel_err(y, want, (size_t)n);
  if (!(out->err <= 1e-4)) {
    fprintf(stderr, "rlbench: %s chain on %s disagrees with plain C: normwise relative error %.3g > 1e-4\n",
            c->name, lm_backend_name(b), out->err);
    goto done;
  }
  run_arg a = {p};
  if (time_work(run_program, &a, reps, &out->t)) goto done;
  rc = 0;
done:
  free(y);
  lm_program_free(p);
  return rc;
}

typedef struct chain_c_arg {
  const chain_def *c;
  const float *x;
  float *y;
  int64_t n;
} chain_c_arg;

static int run_chain_c(void *arg) {
  chain_c_arg *q = arg;
  q->c->c(q->x, q->y, q->n);
  return 0;
}

/* speedup < 0: not shown. */
static void chain_row(const char *label, int thr, int64_t n, int kernels, double interm_bytes, const timing *t,
                      double err, double speedup) {
  char thr_s[16] = "-", kern_s[16] = "-", sp_s[16] = "";
  if (thr > 0) snprintf(thr_s, sizeof thr_s, "%d", thr);
  if (kernels >= 0) snprintf(kern_s, sizeof kern_s, "%d", kernels);
  if (speedup >= 0) snprintf(sp_s, sizeof sp_s, "%.2fx", speedup);
  say("  %-27s %3s %8lld %4s %6.0f %8.2f %8.2f %8.1f %6.2f %7s %7.1e %3dx%d\n", label, thr_s, (long long)n,
         kern_s, interm_bytes / 1048576.0, 1e3 * t->med, 1e3 * t->min, (double)n / t->med * 1e-6,
         8.0 * (double)n / t->med * 1e-9, sp_s, err, t->reps, t->iters);
}

static void chain_record(const chain_def *c, const char *variant, const char *backend, int thr, int64_t n,
                         int kernels, double interm_bytes, const timing *t, double err) {
  record *rec = rec_new("fusion", variant);
  rec_str(rec, "chain", "%s", c->name);
  rec_str(rec, "backend", "%s", backend);
  rec_num(rec, "threads", thr);
  rec_num(rec, "n", (double)n);
  rec_timing(rec, t);
  rec_num(rec, "melem_per_s", (double)n / t->med * 1e-6);
  rec_num(rec, "gbps_compulsory", 8.0 * (double)n / t->med * 1e-9);
  rec_num(rec, "kernels", kernels >= 0 ? kernels : NAN);
  rec_num(rec, "intermediate_bytes", interm_bytes);
  rec_num(rec, "max_rel_err_vs_c", err);
}

static int bench_fusion(const opts *o) {
  int64_t n = o->n, rn = o->ref_n < o->n ? o->ref_n : o->n;
  say("\n== fusion: elementwise chains, fused vs unfused, on the cpu backend ==\n");
  for (size_t ci = 0; ci < sizeof chains / sizeof chains[0]; ci++)
    say("  %-15s %s (%d steps)\n", chains[ci].name, chains[ci].text, chains[ci].nsteps);
  say("  x ~ U[-4,4) of N floats, N a symbol bound at run time. fused = the graph as written (default\n"
         "  schedule); unfused = every intermediate named an output: a kernel and an N-float buffer per\n"
         "  step. interm = MiB of intermediates written per run; GB/s = compulsory traffic (8 B/elem: read x,\n"
         "  write y) / time; speedup = unfused/fused time; err = max|y - C| / max|C| (checked before timing).\n"
         "  plain C = the same chain as a loop in rlbench (1 thread); ref = the interpreter, at a smaller N\n");
  say("  %-27s %3s %8s %4s %6s %8s %8s %8s %6s %7s %7s %s\n", "chain / variant", "thr", "N", "kern", "interm",
         "ms med", "ms min", "Melem/s", "GB/s", "speedup", "err", "reps x iters");
  float *x = alloc_floats((size_t)n), *want = alloc_floats((size_t)n), *y = alloc_floats((size_t)n);
  for (int64_t i = 0; i < n; i++) x[i] = uniform(-4.0f, 4.0f);
  int rc = 0, contiguous_kernels = -1;
  lm_backend_t *backends[MAX_THREAD_SETTINGS] = {0};
  for (int k = 0; k < o->nthreads; k++)
    if (!(backends[k] = open_cpu(o->threads[k]))) rc = 1;
  lm_backend_t *ref = lm_backend_open("ref", NULL, 0);
  if (!ref) rc = fail_lm("cannot open the ref backend");

  for (size_t ci = 0; ci < sizeof chains / sizeof chains[0]; ci++) {
    const chain_def *c = &chains[ci];
    char label[64];
    c->c(x, want, n);
    for (int k = 0; k < o->nthreads; k++) {
      if (!backends[k]) continue;
      int thr = thread_label(o->threads[k]);
      chain_result fu, un, co;
      if (chain_measure(backends[k], c, CHAIN_FUSED, n, x, want, o->reps, &fu) ||
          chain_measure(backends[k], c, CHAIN_OUTPUTS, n, x, want, o->reps, &un) ||
          chain_measure(backends[k], c, CHAIN_CONTIGUOUS, n, x, want, 0, &co)) {
        rc = 1;
        continue;
      }
      if (contiguous_kernels < 0) contiguous_kernels = co.st.kernels;
      double ratio = un.t.med / fu.t.med;
      snprintf(label, sizeof label, "%.14s: cpu fused", c->name);
      chain_row(label, thr, n, fu.st.kernels, fu.interm_bytes, &fu.t, fu.err, ratio);
      snprintf(label, sizeof label, "%.14s: cpu unfused", c->name);
      chain_row(label, thr, n, un.st.kernels, un.interm_bytes, &un.t, un.err, -1);
      chain_record(c, "cpu_fused", "cpu", thr, n, fu.st.kernels, fu.interm_bytes, &fu.t, fu.err);
      chain_record(c, "cpu_unfused", "cpu", thr, n, un.st.kernels, un.interm_bytes, &un.t, un.err);
      record *r = rec_new("fusion", "fused_speedup");
      rec_str(r, "chain", "%s", c->name);
      rec_num(r, "threads", thr);
      rec_num(r, "n", (double)n);
      rec_num(r, "unfused_over_fused_time", ratio);
      r = rec_new("fusion", "cpu_contiguous_per_step");
      rec_str(r, "chain", "%s", c->name);
      rec_num(r, "threads", thr);
      rec_num(r, "kernels", co.st.kernels);
    }
    chain_c_arg q = {c, x, y, n};
    timing tc;
    time_work(run_chain_c, &q, o->reps, &tc);
    double err = rel_err(y, want, (size_t)n);
    snprintf(label, sizeof label, "%.14s: plain C", c->name);
    chain_row(label, 1, n, -1, 0, &tc, err, -1);
    chain_record(c, "plain_c", "none", 1, n, -1, 0, &tc, err);
    chain_result rr;
    if (!ref) continue;
    if (chain_measure(ref, c, CHAIN_FUSED, rn, x, want, o->reps, &rr)) {
      rc = 1;
      continue;
    }
    snprintf(label, sizeof label, "%.14s: ref", c->name);
    chain_row(label, 1, rn, -1, rr.interm_bytes, &rr.t, rr.err, -1);
    chain_record(c, "ref_interpreter", "ref", 1, rn, -1, rr.interm_bytes, &rr.t, rr.err);
  }
  if (contiguous_kernels >= 0)
    say("  note: lm_contiguous after every step gives %d kernel(s), not %d: the canonicaliser drops a\n"
           "  contiguous of an unviewed tensor, so it is no fusion barrier; unfused uses outputs instead\n",
           contiguous_kernels, chains[0].nsteps);
  for (int k = 0; k < o->nthreads; k++) lm_backend_free(backends[k]);
  lm_backend_free(ref);
  free(x);
  free(want);
  free(y);
  return rc;
}

/* ================================================================ matmul: generated vs naive C */

typedef struct mm_shape {
  int64_t m, k, n;
  const char *what;
  int slow; /* skipped by --quick */
} mm_shape;

static const mm_shape mm_shapes[] = {
    {4096, 64, 64, "policy hidden layer, 4096 envs", 0},
    {4096, 4, 64, "policy input layer", 0},
    {4096, 64, 2, "policy output layer", 0},
    {64, 4096, 64, "weight gradient", 0},
    {256, 256, 256, "square", 0},
    {1024, 1024, 1024, "square, large", 1},
};

/* The plain i-k-j loop: C row i accumulates a[i,k] * B row k. */
static void matmul_ikj(const float *restrict a, const float *restrict b, float *restrict c, int64_t m, int64_t k,
                       int64_t n) {
  for (int64_t i = 0; i < m; i++) {
    float *ci = c + i * n;
    for (int64_t j = 0; j < n; j++) ci[j] = 0.0f;
    for (int64_t p = 0; p < k; p++) {
      float aip = a[i * k + p];
      const float *bp = b + p * n;
      for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
    }
  }
}

/* The plain i-j-k loop: one dot product per output, walking B down a column. */
static void matmul_ijk(const float *restrict a, const float *restrict b, float *restrict c, int64_t m, int64_t k,
                       int64_t n) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = s;
    }
}

typedef struct naive_arg {
  void (*fn)(const float *restrict, const float *restrict, float *restrict, int64_t, int64_t, int64_t);
  const float *a, *b;
  float *c;
  int64_t m, k, n;
} naive_arg;

static int run_naive(void *arg) {
  naive_arg *q = arg;
  q->fn(q->a, q->b, q->c, q->m, q->k, q->n);
  return 0;
}

static lm_graph_t *matmul_graph(int64_t m, int64_t k, int64_t n) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  lm_dim sa[2] = {m, k}, sb[2] = {k, n};
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, sa), b = lm_input(g, "b", LM_ROLE_DATA, 2, sb);
  if (lm_output(lm_matmul(a, b), "c") != LM_OK || lm_graph_validate(g) != LM_OK) {
    fail_lm("building the matmul graph");
    lm_graph_free(g);
    return NULL;
  }
  return g;
}

static double gflops(const mm_shape *s, double seconds) {
  return 2.0 * (double)s->m * (double)s->k * (double)s->n / seconds * 1e-9;
}

static int bench_matmul(const opts *o) {
  say("\n== matmul: C = A.B in GFLOP/s, generated (lm_matmul on the cpu backend) vs naive C ==\n"
         "  naive = rlbench's own loops, 1 thread, built with the project's flags:\n"
         "    %s, %s, %s\n"
         "  gen/ikj, gen/ijk = generated GFLOP/s over naive (generated uses thr threads, naive 1);\n"
         "  generated is timed on lm_program_run only (program built and warmed up first);\n"
         "  err = max|C_gen - C_ikj| / max|C_ikj| (A, B ~ U[-1,1)), must be <= 1e-4 before timing\n",
         self_compiler(), self_opt(), self_isa());
  say("  %-20s %3s %5s %9s %9s %9s %9s %7s %7s %8s %s\n", "M x K . K x N", "thr", "kern", "ikj GF/s",
         "ijk GF/s", "gen GF/s", "gen ms", "gen/ikj", "gen/ijk", "err", "reps x iters (gen)");
  int rc = 0;
  lm_backend_t *backends[MAX_THREAD_SETTINGS] = {0};
  for (int k = 0; k < o->nthreads; k++)
    if (!(backends[k] = open_cpu(o->threads[k]))) rc = 1;

  for (size_t si = 0; si < sizeof mm_shapes / sizeof mm_shapes[0]; si++) {
    const mm_shape *s = &mm_shapes[si];
    char name[48];
    snprintf(name, sizeof name, "%lldx%lld.%lldx%lld", (long long)s->m, (long long)s->k, (long long)s->k,
             (long long)s->n);
    if (s->slow && o->quick) {
      say("  %-20s skipped (--quick)\n", name);
      continue;
    }
    size_t na = (size_t)(s->m * s->k), nb = (size_t)(s->k * s->n), nc = (size_t)(s->m * s->n);
    float *a = alloc_floats(na), *b = alloc_floats(nb), *want = alloc_floats(nc), *c1 = alloc_floats(nc),
          *got = alloc_floats(nc);
    for (size_t i = 0; i < na; i++) a[i] = uniform(-1.0f, 1.0f);
    for (size_t i = 0; i < nb; i++) b[i] = uniform(-1.0f, 1.0f);
    matmul_ikj(a, b, want, s->m, s->k, s->n);
    matmul_ijk(a, b, c1, s->m, s->k, s->n);
    double err_ijk = rel_err(c1, want, nc);
    if (!(err_ijk <= 1e-4)) {
      fprintf(stderr, "rlbench: matmul %s: the naive i-j-k and i-k-j loops disagree (error %.3g > 1e-4)\n", name,
              err_ijk);
      rc = 1;
    }
    timing t_ikj, t_ijk;
    naive_arg q_ikj = {matmul_ikj, a, b, c1, s->m, s->k, s->n}, q_ijk = {matmul_ijk, a, b, c1, s->m, s->k, s->n};
    time_work(run_naive, &q_ikj, o->reps, &t_ikj);
    time_work(run_naive, &q_ijk, o->reps, &t_ijk);
    double g_ikj = gflops(s, t_ikj.med), g_ijk = gflops(s, t_ijk.med);
    record *r = rec_new("matmul", "naive_ikj_c");
    rec_str(r, "shape", "%s", name);
    rec_num(r, "threads", 1);
    rec_timing(r, &t_ikj);
    rec_num(r, "gflops", g_ikj);
    r = rec_new("matmul", "naive_ijk_c");
    rec_str(r, "shape", "%s", name);
    rec_num(r, "threads", 1);
    rec_timing(r, &t_ijk);
    rec_num(r, "gflops", g_ijk);
    rec_num(r, "max_rel_err_vs_ikj", err_ijk);

    lm_graph_t *g = matmul_graph(s->m, s->k, s->n);
    for (int k = 0; k < o->nthreads && g; k++) {
      if (!backends[k]) continue;
      int thr = thread_label(o->threads[k]);
      lm_program_t *p = lm_program_new(backends[k], g);
      lm_program_stats st = {0};
      timing t = {0};
      double err = NAN;
      int ok = 0;
      for (size_t i = 0; i < nc; i++) got[i] = NAN; /* poison */
      if (!p)
        fail_lm("lm_program_new (matmul)");
      else if (lm_program_write(p, "a", a, na) != LM_OK || lm_program_write(p, "b", b, nb) != LM_OK ||
               lm_program_run(p) != LM_OK || lm_program_read(p, "c", got, nc) != LM_OK ||
               lm_program_get_stats(p, &st) != LM_OK)
        fail_lm("matmul: write/run/read");
      else if (!((err = rel_err(got, want, nc)) <= 1e-4))
        fprintf(stderr, "rlbench: matmul %s: generated result disagrees with naive C (error %.3g > 1e-4)\n", name,
                err);
      else {
        run_arg ra = {p};
        ok = time_work(run_program, &ra, o->reps, &t) == 0;
      }
      lm_program_free(p);
      if (!ok) {
        say("  %-20s %3d  FAILED (see stderr)\n", name, thr);
        rc = 1;
        continue;
      }
      double gg = gflops(s, t.med);
      say("  %-20s %3d %5d %9.2f %9.2f %9.2f %9.3f %6.2fx %6.2fx %8.1e %3dx%d\n", name, thr, st.kernels, g_ikj,
             g_ijk, gg, 1e3 * t.med, gg / g_ikj, gg / g_ijk, err, t.reps, t.iters);
      r = rec_new("matmul", "generated_cpu");
      rec_str(r, "shape", "%s", name);
      rec_num(r, "threads", thr);
      rec_timing(r, &t);
      rec_num(r, "gflops", gg);
      rec_num(r, "kernels", st.kernels);
      rec_num(r, "ratio_vs_naive_ikj", gg / g_ikj);
      rec_num(r, "ratio_vs_naive_ijk", gg / g_ijk);
      rec_num(r, "max_rel_err_vs_ikj", err);
    }
    if (!g) rc = 1;
    lm_graph_free(g);
    free(a);
    free(b);
    free(want);
    free(c1);
    free(got);
  }
  for (int k = 0; k < o->nthreads; k++) lm_backend_free(backends[k]);
  return rc;
}

/* ================================================================ compile time */

/* rm -r of the fresh cache directory this process made (files and, in case, subdirectories). */
static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char sub[4096];
      snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
      struct stat sb;
      if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
        remove_tree(sub);
      else
        unlink(sub);
    }
    closedir(d);
  }
  rmdir(path);
}

typedef struct compile_case {
  const char *name;
  const char *what;
  lm_graph_t *(*build)(void);
} compile_case;

static lm_graph_t *compile_chain(void) { return chain_graph(&chains[0], CHAIN_FUSED); }
static lm_graph_t *compile_matmul(void) { return matmul_graph(4096, 64, 64); }

static const compile_case compile_cases[] = {
    {"chain", "transcendental chain, fused (1 kernel)", compile_chain},
    {"matmul", "matmul 4096x64.64x64", compile_matmul},
};

static int bench_compile(const opts *o) {
  say("\n== compile: lm_program_new on the cpu backend (graph -> C -> compiler -> .so -> dlopen) ==\n"
         "  cold = in a fresh, empty LUMEN_CACHE_DIR (the C compiler runs); warm = the same graph in a new\n"
         "  backend on that now-filled cache (no compiler: hash, stat, dlopen from disk); open =\n"
         "  lm_backend_open(\"cpu\") on a fresh cache directory (the compiler probe runs once per process)\n");
  say("  %-8s %-36s %10s %10s %10s %10s %10s %5s\n", "graph", "what", "cold med", "cold min", "warm med",
         "warm min", "open med", "reps");
  const char *old_env = getenv("LUMEN_CACHE_DIR");
  char *saved = old_env ? strdup(old_env) : NULL;
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp) tmp = "/tmp";
  int rc = 0;
  for (size_t ci = 0; ci < sizeof compile_cases / sizeof compile_cases[0]; ci++) {
    const compile_case *cc = &compile_cases[ci];
    lm_graph_t *g = cc->build();
    if (!g) {
      rc = 1;
      continue;
    }
    double cold[MAX_REPS], warm[MAX_REPS], open[MAX_REPS];
    int reps = 0;
    for (int r = 0; r < o->reps; r++) {
      char dir[4096];
      snprintf(dir, sizeof dir, "%s/rlbench-cache-XXXXXX", tmp);
      if (!mkdtemp(dir)) {
        fprintf(stderr, "rlbench: cannot create a temporary cache directory in %s: %s\n", tmp, strerror(errno));
        rc = 1;
        break;
      }
      setenv("LUMEN_CACHE_DIR", dir, 1);
      double t0 = now_s();
      lm_backend_t *b = open_cpu(0);
      double t1 = now_s();
      lm_program_t *p = b ? lm_program_new(b, g) : NULL;
      double t2 = now_s();
      int ok = p != NULL;
      lm_program_free(p);
      lm_backend_free(b);
      double t3 = 0, t4 = 0;
      if (ok) {
        b = open_cpu(0);
        t3 = now_s();
        p = b ? lm_program_new(b, g) : NULL;
        t4 = now_s();
        ok = p != NULL;
        lm_program_free(p);
        lm_backend_free(b);
      }
      if (!ok) fail_lm("lm_program_new (compile benchmark)");
      remove_tree(dir);
      if (!ok) {
        rc = 1;
        break;
      }
      open[reps] = t1 - t0;
      cold[reps] = t2 - t1;
      warm[reps] = t4 - t3;
      reps++;
    }
    lm_graph_free(g);
    if (!reps) continue;
    qsort(open, (size_t)reps, sizeof open[0], cmp_double);
    qsort(cold, (size_t)reps, sizeof cold[0], cmp_double);
    qsort(warm, (size_t)reps, sizeof warm[0], cmp_double);
#define MED(v) (reps % 2 ? (v)[reps / 2] : 0.5 * ((v)[reps / 2 - 1] + (v)[reps / 2]))
    say("  %-8s %-36s %8.1fms %8.1fms %8.2fms %8.2fms %8.2fms %5d\n", cc->name, cc->what, 1e3 * MED(cold),
           1e3 * cold[0], 1e3 * MED(warm), 1e3 * warm[0], 1e3 * MED(open), reps);
    const char *variants[3] = {"cold", "warm", "backend_open"};
    double *vals[3] = {cold, warm, open};
    for (int v = 0; v < 3; v++) {
      record *rec = rec_new("compile", variants[v]);
      rec_str(rec, "graph", "%s", cc->name);
      rec_num(rec, "ms_median", 1e3 * MED(vals[v]));
      rec_num(rec, "ms_min", 1e3 * vals[v][0]);
      rec_num(rec, "reps", reps);
    }
#undef MED
  }
  if (first_open_s >= 0) {
    say("  this process's first lm_backend_open(\"cpu\") (with the compiler probe): %.1f ms\n", 1e3 * first_open_s);
    record *rec = rec_new("compile", "first_backend_open");
    rec_num(rec, "ms", 1e3 * first_open_s);
  }
  if (saved)
    setenv("LUMEN_CACHE_DIR", saved, 1);
  else
    unsetenv("LUMEN_CACHE_DIR");
  free(saved);
  return rc;
}

/* ================================================================ the table of benchmarks */

typedef struct bench {
  const char *name;
  const char *what;
  int (*run)(const opts *o); /* 0 on success; prints its rows and records them */
} bench;

static const bench benches[] = {
    {"fusion", "elementwise chains: fused vs unfused (a kernel per step) on cpu; plain C, ref for scale", bench_fusion},
    {"matmul", "matmul GFLOP/s: generated cpu kernels vs naive i-k-j / i-j-k C, BENCHMARKS.md shapes",
     bench_matmul},
    {"compile", "lm_program_new time, cold and warm kernel cache", bench_compile},
};
enum { NBENCHES = sizeof benches / sizeof benches[0] };

/* ================================================================ command line */

static void usage(FILE *f) {
  fputs("usage: rlbench [options]\n"
        "\n"
        "Benchmarks lumen on this machine, each against a baseline measured in the same run, and\n"
        "prints a table (medians and minima of several repetitions, and ratios).\n"
        "\n"
        "options:\n"
        "  --list               list the benchmarks and exit\n"
        "  --only NAME[,NAME]   run only these benchmarks (default: all)\n"
        "  --quick              skip the slowest cases (the 1024^3 matmul)\n"
        "  --reps K             timed repetitions per measurement (default 7, 1..1000)\n"
        "  --n N                elements of the elementwise chain on cpu (default 4194304 = 1<<22)\n"
        "  --ref-n N            elements of the chain on the ref interpreter (default 65536)\n"
        "  --threads T[,T]      cpu thread counts to measure, each a number or 'all' (the pool's\n"
        "                       default: $LUMEN_THREADS, else every online CPU); default: all\n"
        "  --json FILE          also write every number as JSON to FILE ('-' = stdout)\n"
        "  -h, --help           this text\n"
        "\n"
        "Environment: LUMEN_CC / LUMEN_CFLAGS pick the kernel compiler, LUMEN_CACHE_DIR the kernel\n"
        "cache (the compile benchmark uses fresh temporary ones), LUMEN_DUMP=DIR writes the kernels.\n"
        "Exit status: 0 ok, 1 a benchmark failed (its results disagreed or lumen reported an error),\n"
        "2 bad arguments.\n",
        f);
}

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("rlbench: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs(" (see rlbench --help)\n", stderr);
  return EXIT_USAGE;
}

static int parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = s && *s ? strtoll(s, &end, 10) : 0;
  if (!s || !*s || errno || *end || v < lo || v > hi)
    return usage_error("%s wants an integer in %lld..%lld, got '%s'", opt, (long long)lo, (long long)hi,
                       s ? s : "(nothing)");
  *out = v;
  return 0;
}

static const bench *find_bench(const char *name, size_t len) {
  for (size_t i = 0; i < NBENCHES; i++)
    if (strlen(benches[i].name) == len && !strncmp(benches[i].name, name, len)) return &benches[i];
  return NULL;
}

static int parse_only(const char *s, int *selected) {
  if (!s || !*s) return usage_error("--only wants a benchmark name");
  for (const char *p = s;;) {
    size_t len = strcspn(p, ",");
    const bench *b = find_bench(p, len);
    if (!b) {
      char known[256] = "";
      for (size_t i = 0; i < NBENCHES; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", benches[i].name);
      return usage_error("unknown benchmark '%.*s' in --only (known: %s)", (int)len, p, known);
    }
    selected[b - benches] = 1;
    if (!p[len]) break;
    p += len + 1;
  }
  return 0;
}

static int parse_threads(const char *s, opts *o) {
  o->nthreads = 0;
  if (!s || !*s) return usage_error("--threads wants a list such as 1,all");
  for (const char *p = s;;) {
    size_t len = strcspn(p, ",");
    if (o->nthreads == MAX_THREAD_SETTINGS) return usage_error("--threads takes at most %d settings", MAX_THREAD_SETTINGS);
    int v;
    if (len == 3 && !strncmp(p, "all", 3)) {
      v = 0;
    } else {
      char buf[32];
      if (len == 0 || len >= sizeof buf) return usage_error("--threads: bad entry '%.*s'", (int)len, p);
      memcpy(buf, p, len);
      buf[len] = 0;
      int64_t t;
      if (parse_int("--threads", buf, 1, 1024, &t)) return EXIT_USAGE;
      v = (int)t;
    }
    o->threads[o->nthreads++] = v;
    if (!p[len]) break;
    p += len + 1;
  }
  return 0;
}

static int write_json(const opts *o, const int *selected, const char *model) {
  FILE *f = strcmp(o->json, "-") ? fopen(o->json, "w") : stdout;
  if (!f) {
    fprintf(stderr, "rlbench: cannot write %s: %s\n", o->json, strerror(errno));
    return 1;
  }
  fprintf(f, "{\n  \"tool\": \"rlbench\",\n  \"lumen_version\": ");
  json_string(f, lm_version());
  fprintf(f, ",\n  \"host\": {\"cpu\": ");
  json_string(f, model);
  fprintf(f, ", \"online_cpus\": %d},\n  \"naive_c_compiler\": ", online_cpus());
  char cc[512];
  snprintf(cc, sizeof cc, "%s; %s; %s", self_compiler(), self_opt(), self_isa());
  json_string(f, cc);
  fprintf(f, ",\n  \"options\": {\"n\": %lld, \"ref_n\": %lld, \"reps\": %d, \"quick\": %s, \"threads\": [",
          (long long)o->n, (long long)o->ref_n, o->reps, o->quick ? "true" : "false");
  for (int k = 0; k < o->nthreads; k++) fprintf(f, "%s%d", k ? ", " : "", thread_label(o->threads[k]));
  fprintf(f, "], \"benchmarks\": [");
  for (size_t i = 0, first = 1; i < NBENCHES; i++)
    if (selected[i]) {
      fprintf(f, "%s", first ? "" : ", ");
      json_string(f, benches[i].name);
      first = 0;
    }
  fprintf(f, "]},\n  \"results\": [");
  for (size_t i = 0; i < nrecords; i++) {
    fprintf(f, "%s\n    {", i ? "," : "");
    for (int j = 0; j < records[i].n; j++) {
      const field *fl = &records[i].f[j];
      fprintf(f, "%s", j ? ", " : "");
      json_string(f, fl->key);
      fputs(": ", f);
      if (fl->is_str)
        json_string(f, fl->str);
      else
        json_number(f, fl->num);
    }
    fputc('}', f);
  }
  fprintf(f, "\n  ]\n}\n");
  int bad = ferror(f);
  if (f != stdout) bad |= fclose(f) != 0;
  if (bad) {
    fprintf(stderr, "rlbench: error writing %s\n", o->json);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  opts o = {.n = (int64_t)1 << 22, .ref_n = (int64_t)1 << 16, .reps = 7, .nthreads = 1};
  int selected[NBENCHES] = {0}, any_only = 0, list = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const char *eq = strchr(arg, '=');
    char name[64];
    size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
    if (nlen >= sizeof name) return usage_error("unknown option '%s'", arg);
    memcpy(name, arg, nlen);
    name[nlen] = 0;
    int takes_value = !strcmp(name, "--only") || !strcmp(name, "--reps") || !strcmp(name, "--n") ||
                      !strcmp(name, "--ref-n") || !strcmp(name, "--threads") || !strcmp(name, "--json");
    const char *val = NULL;
    if (takes_value) {
      if (eq)
        val = eq + 1;
      else if (i + 1 < argc)
        val = argv[++i];
      else
        return usage_error("%s needs a value", name);
    } else if (eq) {
      return usage_error("%s takes no value", name);
    }
    int64_t v;
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(name, "--list")) {
      list = 1;
    } else if (!strcmp(name, "--quick")) {
      o.quick = 1;
    } else if (!strcmp(name, "--only")) {
      if (parse_only(val, selected)) return EXIT_USAGE;
      any_only = 1;
    } else if (!strcmp(name, "--reps")) {
      if (parse_int(name, val, 1, MAX_REPS, &v)) return EXIT_USAGE;
      o.reps = (int)v;
    } else if (!strcmp(name, "--n")) {
      if (parse_int(name, val, 1, (int64_t)1 << 30, &v)) return EXIT_USAGE;
      o.n = v;
    } else if (!strcmp(name, "--ref-n")) {
      if (parse_int(name, val, 1, (int64_t)1 << 30, &v)) return EXIT_USAGE;
      o.ref_n = v;
    } else if (!strcmp(name, "--threads")) {
      if (parse_threads(val, &o)) return EXIT_USAGE;
    } else if (!strcmp(name, "--json")) {
      if (!*val) return usage_error("--json needs a file name");
      o.json = val;
    } else {
      return usage_error("unknown %s '%s'", arg[0] == '-' ? "option" : "argument", arg);
    }
  }
  if (list) {
    for (size_t i = 0; i < NBENCHES; i++) say("%-10s %s\n", benches[i].name, benches[i].what);
    return 0;
  }
  if (o.json && !strcmp(o.json, "-")) table_out = stderr;
  if (!any_only)
    for (size_t i = 0; i < NBENCHES; i++) selected[i] = 1;
  const char *env_thr = getenv("LUMEN_THREADS");
  if (env_thr && *env_thr) saved_threads_env = strdup(env_thr);

  char model[256];
  cpu_model(model, sizeof model);
  const char *lcc = getenv("LUMEN_CC"), *lcf = getenv("LUMEN_CFLAGS");
  say("rlbench (lumen %s): %s, %d online CPUs; medians (and minima) of %d reps, wall clock\n", lm_version(),
         model, online_cpus(), o.reps);
  say("kernels: the cpu backend's compiler (%s%s%s%s)%s\n", lcc && *lcc ? "LUMEN_CC=" : "default: clang, gcc, cc",
         lcc && *lcc ? lcc : "", lcf && *lcf ? ", LUMEN_CFLAGS=" : "", lcf && *lcf ? lcf : "",
         o.quick ? "; --quick" : "");

  int rc = 0;
  for (size_t i = 0; i < NBENCHES; i++)
    if (selected[i] && benches[i].run(&o)) rc = 1;
  if (o.json && write_json(&o, selected, model)) rc = 1;
  free(saved_threads_env);
  free(records);
  if (rc) fputs("rlbench: some benchmarks failed (see above)\n", stderr);
  return rc;
}
