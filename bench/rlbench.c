/* bench/rlbench.c — rlbench, lumen's benchmark tool (DESIGN.md §8): a table of named benchmarks,
 * selectable from the command line, each timing lumen side by side with a baseline measured in the
 * same run, printed as a table and optionally written as JSON. It measures the compiler's cpu
 * backend (fusion, matmul, compile time), the envs on their own, the rollout (env + policy) and
 * PPO training with the device and host steppers, time-to-solve CartPole, and training beside
 * busy processes (default threads against one, started and stopped here). Only the public API
 * is used, plus compiler/cc.h (the kernel compiler) to build a hand-written baseline loop with the
 * kernels' compiler and flags. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "lumen/lumen.h"
#include "lumen/search.h"
#include "../compiler/cc.h"

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
  int threads_given;        /* --threads was given (else envs measures 1 and every CPU) */
  int64_t envs;             /* N of the envs and rollout benchmarks */
  int64_t env_steps;        /* steps per call of the envs benchmark */
  int64_t horizon;          /* T of the rollout benchmark */
  const char *rollout_envs; /* envs of the rollout benchmark */
  const char *env_list;     /* envs of the envs benchmark (NULL: every env) */
  const char *env_params;   /* parameters of each of them (lm_env_configure; NULL: the envs' own) */
  int64_t solve_budget;     /* env steps of time-to-solve (0: lm_ppo_defaults' total_steps) */
  int seeds;                /* time-to-solve runs per stepper */
  const char *search_device; /* where the search benchmark runs and times (NULL: the cpu) */
  int search_budget;         /* seconds per graph of the search benchmark (0: 30, --quick 10) */
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

/* CPU time of the whole process (every thread): against wall time it shows how much of the
 * machine a measurement got while other jobs ran. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
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
  double cpu_med;  /* process CPU seconds per call (all threads), median over repetitions */
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
  double s[MAX_REPS], c[MAX_REPS];
  for (int r = 0; r < reps; r++) {
    double a = now_s(), ca = cpu_s();
    for (int i = 0; i < iters; i++)
      if (fn(arg)) return 1;
    s[r] = (now_s() - a) / iters;
    c[r] = (cpu_s() - ca) / iters;
  }
  qsort(s, (size_t)reps, sizeof s[0], cmp_double);
  qsort(c, (size_t)reps, sizeof c[0], cmp_double);
  t->med = reps % 2 ? s[reps / 2] : 0.5 * (s[reps / 2 - 1] + s[reps / 2]);
  t->cpu_med = reps % 2 ? c[reps / 2] : 0.5 * (c[reps / 2 - 1] + c[reps / 2]);
  t->min = s[0];
  t->reps = reps;
  t->iters = iters;
  return 0;
}

/* `calls` single calls, each timed, with no warm-up: for work of seconds per call, where a
 * warm-up call would cost more than the first-touch effects it hides. */
static int time_calls(work_fn fn, void *arg, int calls, timing *t) {
  double s[MAX_REPS], c[MAX_REPS];
  if (calls > MAX_REPS) calls = MAX_REPS;
  for (int r = 0; r < calls; r++) {
    double a = now_s(), ca = cpu_s();
    if (fn(arg)) return 1;
    s[r] = now_s() - a;
    c[r] = cpu_s() - ca;
  }
  qsort(s, (size_t)calls, sizeof s[0], cmp_double);
  qsort(c, (size_t)calls, sizeof c[0], cmp_double);
  t->med = calls % 2 ? s[calls / 2] : 0.5 * (s[calls / 2 - 1] + s[calls / 2]);
  t->cpu_med = calls % 2 ? c[calls / 2] : 0.5 * (c[calls / 2 - 1] + c[calls / 2]);
  t->min = s[0];
  t->reps = calls;
  t->iters = 1;
  return 0;
}

static void rec_timing(record *r, const timing *t) {
  rec_num(r, "ms_median", 1e3 * t->med);
  rec_num(r, "ms_min", 1e3 * t->min);
  rec_num(r, "reps", t->reps);
  rec_num(r, "iters_per_rep", t->iters);
  rec_num(r, "cpu_ms_median", 1e3 * t->cpu_med);
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

/* ================================================================ envs: env-only steps/s */

/* What every env-only variant computes, per env and step: a uniformly random action, the env's
 * step, the time limit and same-step auto-reset, and two per-env counters (finished episodes and
 * summed reward) that are checked across the variants before anything is timed. Nothing else is
 * written per step (no observation or trajectory buffers): the state and the counters only. */

static double loadavg1(void) {
  double l = NAN;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = NAN;
    fclose(f);
  }
  return l;
}

/* The thread settings of the env benchmark: 1 and every CPU, unless --threads names others. */
static int env_thread_settings(const opts *o, int *out) {
  if (o->threads_given) {
    for (int k = 0; k < o->nthreads; k++) out[k] = o->threads[k];
    return o->nthreads;
  }
  out[0] = 1;
  if (thread_label(0) == 1) return 1;
  out[1] = 0;
  return 2;
}

/* Counters of one env-only run, summed over envs. */
typedef struct env_counts {
  double episodes, reward, steps;
  double var_episodes, var_reward; /* variances of the sums, from the per-env spread */
} env_counts;

/* Sums of per-env counters, and the variance of each sum (n times the per-env variance). */
static void counts_from(const float *eps, const float *rew, int64_t n, double steps, env_counts *c) {
  double se = 0, se2 = 0, sr = 0, sr2 = 0;
  for (int64_t i = 0; i < n; i++) {
    se += eps[i], se2 += (double)eps[i] * eps[i];
    sr += rew[i], sr2 += (double)rew[i] * rew[i];
  }
  c->episodes = se;
  c->reward = sr;
  c->steps = steps;
  c->var_episodes = n > 1 ? fmax(se2 - se * se / (double)n, 0) * (double)n / (double)(n - 1) : 0;
  c->var_reward = n > 1 ? fmax(sr2 - sr * sr / (double)n, 0) * (double)n / (double)(n - 1) : 0;
}

/* Compares a variant's counters with the reference stepper's. The random streams differ, so the
 * test is statistical: the episode count and the total reward must agree to 5% or to 5 standard
 * errors of their difference (from the per-env spread), whichever is looser. */
static int env_counts_check(const char *env, const char *variant, env_counts got, env_counts want) {
  double de = fabs(got.episodes - want.episodes);
  double te = fmax(0.05 * fmax(want.episodes, 20.0), 5 * sqrt(got.var_episodes + want.var_episodes));
  double dr = fabs(got.reward - want.reward);
  double tr = fmax(0.05 * fabs(want.reward), 5 * sqrt(got.var_reward + want.var_reward));
  double rg = got.reward / got.steps, rw = want.reward / want.steps;
  if (de <= te && dr <= tr && isfinite(rg)) return 0;
  fprintf(stderr,
          "rlbench: envs: %s %s disagrees with the reference stepper: %.0f episodes and %.5g reward per step over "
          "%.0f steps; reference %.0f and %.5g\n",
          env, variant, got.episodes, rg, got.steps, want.episodes, rw);
  return 1;
}

static lm_graph_t *env_graph(const lm_env_spec *e) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return NULL;
  if (e->finite) lm_graph_promise_finite(g);
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  lm_status s = lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs);
  if (s == LM_OK) {
    lm_tensor cnt = lm_input(g, "ep.count", LM_ROLE_STATE, 1, &N);
    lm_tensor rsum = lm_input(g, "ep.reward", LM_ROLE_STATE, 1, &N);
    s = lm_assign(cnt, lm_add(cnt, lm_add(vs.terminated, vs.truncated)));
    if (s == LM_OK) s = lm_assign(rsum, lm_add(rsum, vs.reward));
  }
  if (s == LM_OK) s = lm_graph_validate(g);
  if (s != LM_OK) {
    fprintf(stderr, "rlbench: envs: building the %s step graph: %s\n", e->name, lm_last_error());
    lm_graph_free(g);
    return NULL;
  }
  return g;
}

static int env_read_counts(lm_program_t *p, int64_t n, float *buf, double steps, env_counts *c) {
  if (lm_program_read(p, "ep.count", buf, (size_t)n) != LM_OK) return fail_lm("envs: reading ep.count");
  if (lm_program_read(p, "ep.reward", buf + n, (size_t)n) != LM_OK) return fail_lm("envs: reading ep.reward");
  counts_from(buf, buf + n, n, steps, c);
  return 0;
}

/* Initial states of the n envs: the reference reset with seed 1, env i, run 0. */
static float *env_initial_state(const lm_env_spec *e, int64_t n) {
  size_t S = (size_t)e->state_size;
  float *s = alloc_floats((size_t)n * S);
  for (int64_t i = 0; i < n; i++) e->ref_reset(s + (size_t)i * S, 1, (uint64_t)i, 0);
  return s;
}

/* The compiled env on one cpu backend: build the scan, run it once from the initial state for
 * the counters, then time it (each call continues from where the last left off). */
static int env_compiled(lm_backend_t *b, const lm_env_spec *e, lm_graph_t *g, int64_t n, int64_t T, int reps,
                        timing *t, int *kernels, env_counts *c) {
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  if (!p) return fail_lm("envs: lm_program_new_scan");
  int rc = 1;
  float *s0 = env_initial_state(e, n), *buf = alloc_floats(2 * (size_t)n);
  lm_program_stats st = {0};
  if (lm_program_bind(p, "N", n) != LM_OK || lm_program_bind(p, "T", T) != LM_OK ||
      lm_program_write(p, "state", s0, (size_t)n * (size_t)e->state_size) != LM_OK) {
    fail_lm("envs: bind/write");
    goto done;
  }
  lm_program_set_seed(p, 1);
  if (lm_program_run(p) != LM_OK) {
    fail_lm("envs: first run");
    goto done;
  }
  if (env_read_counts(p, n, buf, (double)n * (double)T, c)) goto done;
  if (lm_program_get_stats(p, &st) != LM_OK) {
    fail_lm("lm_program_get_stats");
    goto done;
  }
  *kernels = st.kernels;
  run_arg a = {p};
  rc = time_work(run_program, &a, reps, t);
done:
  free(s0);
  free(buf);
  lm_program_free(p);
  return rc;
}

/* The scalar reference stepper on the host, one env at a time (step-major, as the host stepper
 * of a rollout runs it), random actions from a xorshift64* generator. */
typedef struct ref_env_arg {
  const lm_env_spec *e;
  int64_t n, T;
  float *state;
  int *t;
  uint64_t rng, calls;
  float *eps, *rew; /* per-env counters */
  float *last;      /* per-env action applied last (sticky actions, as the vec env keeps it) */
} ref_env_arg;

static int run_ref_env(void *arg) {
  ref_env_arg *q = arg;
  const lm_env_spec *e = q->e;
  size_t S = (size_t)e->state_size;
  int A = lm_env_action_size(e);
  uint64_t r = q->rng;
  float *act = malloc((size_t)A * sizeof *act);
  if (!act) return -1;
  for (int64_t t = 0; t < q->T; t++) {
    uint64_t run = q->calls * (uint64_t)q->T + (uint64_t)t + 1;
    for (int64_t i = 0; i < q->n; i++) {
      float *s = q->state + (size_t)i * S;
      for (int k = 0; k < A; k++) {
        r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
        uint32_t u = (uint32_t)((r * 0x2545f4914f6cdd1dull) >> 32);
        if (e->action.kind == LM_SPACE_DISCRETE)
          act[k] = (float)(int)(((uint64_t)u * (uint64_t)e->action.n) >> 32);
        else
          act[k] = e->action.low[k] + (e->action.high[k] - e->action.low[k]) * (float)(u >> 8) * (1.0f / 16777216.0f);
      }
      if (e->action.kind == LM_SPACE_DISCRETE) { /* the vec env's action wrappers (sticky actions) */
        r ^= r >> 12, r ^= r << 25, r ^= r >> 27;
        float u = (float)(((r * 0x2545f4914f6cdd1dull) >> 40) + 1) * (1.0f / 16777216.0f); /* (0, 1] */
        act[0] = lm_env_ref_action(e, act[0], &q->last[i], u);
      }
      int term = 0;
      q->rew[i] += e->ref_step(s, act, &term);
      if (term || ++q->t[i] >= e->time_limit) {
        q->eps[i] += 1;
        q->t[i] = 0;
        e->ref_reset(s, 1, (uint64_t)i, run);
      }
    }
  }
  free(act);
  q->rng = r;
  q->calls++;
  return 0;
}

/* ---- the hand-written struct-of-arrays CartPole (Gymnasium's Euler physics in float32,
 * auto-reset, random actions and resets from a per-env xorshift32). The text below is compiled
 * twice: into rlbench with the project's flags, and at run time by the kernel compiler
 * (compiler/cc.h) with its flags. Envs are processed in blocks of 256 (the block's state stays
 * in L1 over the T steps); within a block the i loop is branch-free so it can be vectorised.
 * A second variant draws its actions and resets from Philox4x32-10 exactly as the graph env
 * does (lumen's RAND, the counter-based generator cuRAND uses: the action from stream 1002,
 * element env; the four reset values from stream 1000, elements 4 env .. 4 env + 3; run
 * counter = call * T + t), written as well as we can: one Philox block gives four envs their
 * actions (in a loop before the physics), and the reset block is drawn only for the envs whose
 * episode ended (a branch after it). */
#define SOA_TEXT(...)                                   \
  static const char soa_cartpole_src[] = #__VA_ARGS__; \
  __VA_ARGS__

static void soa_cartpole(int64_t env0, int64_t n, int64_t T, uint64_t seed, uint64_t run, float *restrict x,
                         float *restrict xd, float *restrict th, float *restrict thd, int32_t *restrict tt,
                         uint32_t *restrict rng, float *restrict eps, float *restrict rsum);
/* built into rlbench only to keep the text honest C; timed as built by the kernel compiler */
__attribute__((unused)) static void soa_cartpole_philox(int64_t env0, int64_t n, int64_t T, uint64_t seed, uint64_t run,
                                float *restrict x, float *restrict xd, float *restrict th, float *restrict thd,
                                int32_t *restrict tt, uint32_t *restrict rng, float *restrict eps,
                                float *restrict rsum);

SOA_TEXT(
void soa_cartpole(int64_t env0, int64_t n, int64_t T, uint64_t seed, uint64_t run, float *restrict x,
                  float *restrict xd, float *restrict th, float *restrict thd, int32_t *restrict tt,
                  uint32_t *restrict rng, float *restrict eps, float *restrict rsum) {
  (void)env0, (void)seed, (void)run;
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    int64_t i1 = i0 + 256 < n ? i0 + 256 : n;
    for (int64_t t = 0; t < T; t++) {
      for (int64_t i = i0; i < i1; i++) {
        uint32_t r0 = rng[i];
        r0 ^= r0 << 13; r0 ^= r0 >> 17; r0 ^= r0 << 5;
        uint32_t r1 = r0 ^ (r0 << 13); r1 ^= r1 >> 17; r1 ^= r1 << 5;
        uint32_t r2 = r1 ^ (r1 << 13); r2 ^= r2 >> 17; r2 ^= r2 << 5;
        uint32_t r3 = r2 ^ (r2 << 13); r3 ^= r3 >> 17; r3 ^= r3 << 5;
        uint32_t r4 = r3 ^ (r3 << 13); r4 ^= r4 >> 17; r4 ^= r4 << 5;
        float force = (r0 >> 31) ? 10.0f : -10.0f;
        float x0 = x[i], xd0 = xd[i], th0 = th[i], thd0 = thd[i];
        float c = cosf(th0), s = sinf(th0);
        float temp = (force + 0.05f * (thd0 * thd0) * s) / 1.1f;
        float thacc = (9.8f * s - c * temp) / (0.5f * (4.0f / 3.0f - 0.1f * (c * c) / 1.1f));
        float xacc = temp - 0.05f * thacc * c / 1.1f;
        float nx = x0 + 0.02f * xd0, nxd = xd0 + 0.02f * xacc;
        float nth = th0 + 0.02f * thd0, nthd = thd0 + 0.02f * thacc;
        int32_t nt = tt[i] + 1;
        int term = (nx < -2.4f) | (nx > 2.4f) | (nth < -0.20943951f) | (nth > 0.20943951f);
        int done = term | (nt >= 500);
        x[i] = done ? (float)(int32_t)(r1 >> 8) * (0.1f / 16777216.0f) - 0.05f : nx;
        xd[i] = done ? (float)(int32_t)(r2 >> 8) * (0.1f / 16777216.0f) - 0.05f : nxd;
        th[i] = done ? (float)(int32_t)(r3 >> 8) * (0.1f / 16777216.0f) - 0.05f : nth;
        thd[i] = done ? (float)(int32_t)(r4 >> 8) * (0.1f / 16777216.0f) - 0.05f : nthd;
        tt[i] = done ? 0 : nt;
        rng[i] = done ? r4 : r0;
        eps[i] += done ? 1.0f : 0.0f;
        rsum[i] += 1.0f;
      }
    }
  }
}

static inline __attribute__((always_inline)) void soa_philox(uint64_t seed, uint32_t stream, uint32_t group,
                                                             uint64_t run, uint32_t out[4]) {
  uint32_t a = group, b = stream, c = (uint32_t)run, d = (uint32_t)(run >> 32);
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * a, p1 = (uint64_t)0xCD9E8D57u * c;
    uint32_t na = (uint32_t)(p1 >> 32) ^ b ^ k0, nc = (uint32_t)(p0 >> 32) ^ d ^ k1;
    b = (uint32_t)p1, d = (uint32_t)p0, a = na, c = nc;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  out[0] = a, out[1] = b, out[2] = c, out[3] = d;
}

static inline __attribute__((always_inline)) float soa_uniform(uint32_t w) {
  return (float)w * 2.3283064365386963e-10f + 1.16415321826934814e-10f;
}

void soa_cartpole_philox(int64_t env0, int64_t n, int64_t T, uint64_t seed, uint64_t run, float *restrict x,
                         float *restrict xd, float *restrict th, float *restrict thd, int32_t *restrict tt,
                         uint32_t *restrict rng, float *restrict eps, float *restrict rsum) {
  (void)rng;
  uint32_t act[256 + 8]; /* the block's action words, from offset `off` */
  uint8_t done[256];
  uint16_t ended[256];
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    int64_t i1 = i0 + 256 < n ? i0 + 256 : n;
    uint64_t first = (uint64_t)(env0 + i0);
    int64_t off = (int64_t)(first & 3), groups = (i1 - i0 + off + 3) / 4;
    for (int64_t t = 0; t < T; t++) {
      /* one Philox block per four envs (the action of env e is word e & 3 of block e >> 2) */
      for (int64_t g = 0; g < groups; g++) {
        uint32_t w[4];
        soa_philox(seed, 1002u, (uint32_t)((first >> 2) + (uint64_t)g), run + (uint64_t)t, w);
        act[4 * g] = w[0], act[4 * g + 1] = w[1], act[4 * g + 2] = w[2], act[4 * g + 3] = w[3];
      }
      for (int64_t i = i0; i < i1; i++) {
        float force = soa_uniform(act[i - i0 + off]) > 0.5f ? 10.0f : -10.0f;
        float x0 = x[i], xd0 = xd[i], th0 = th[i], thd0 = thd[i];
        float c = cosf(th0), s = sinf(th0);
        float temp = (force + 0.05f * (thd0 * thd0) * s) / 1.1f;
        float thacc = (9.8f * s - c * temp) / (0.5f * (4.0f / 3.0f - 0.1f * (c * c) / 1.1f));
        float xacc = temp - 0.05f * thacc * c / 1.1f;
        float nx = x0 + 0.02f * xd0, nxd = xd0 + 0.02f * xacc;
        float nth = th0 + 0.02f * thd0, nthd = thd0 + 0.02f * thacc;
        int32_t nt = tt[i] + 1;
        int term = (nx < -2.4f) | (nx > 2.4f) | (nth < -0.20943951f) | (nth > 0.20943951f);
        int d = term | (nt >= 500);
        x[i] = nx, xd[i] = nxd, th[i] = nth, thd[i] = nthd;
        tt[i] = d ? 0 : nt;
        eps[i] += d ? 1.0f : 0.0f;
        rsum[i] += 1.0f;
        done[i - i0] = (uint8_t)d;
      }
      /* the reset draws (one Philox block per env: stream 1000, elements 4 env .. 4 env + 3),
       * only for the envs whose episode ended: a list of them first (a loop over the flags with
       * a branch inside, the vectoriser would turn into masked draws for every env) */
      int nd = 0;
      for (int64_t i = 0; i < i1 - i0; i++) {
        ended[nd] = (uint16_t)i;
        nd += done[i];
      }
      for (int k = 0; k < nd; k++) {
        int64_t i = i0 + ended[k];
        uint32_t rs[4];
        soa_philox(seed, 1000u, (uint32_t)(env0 + i), run + (uint64_t)t, rs);
        x[i] = 0.1f * soa_uniform(rs[0]) - 0.05f;
        xd[i] = 0.1f * soa_uniform(rs[1]) - 0.05f;
        th[i] = 0.1f * soa_uniform(rs[2]) - 0.05f;
        thd[i] = 0.1f * soa_uniform(rs[3]) - 0.05f;
      }
    }
  }
}
)

typedef void (*soa_fn)(int64_t, int64_t, int64_t, uint64_t, uint64_t, float *restrict, float *restrict,
                       float *restrict, float *restrict, int32_t *restrict, uint32_t *restrict, float *restrict,
                       float *restrict);

typedef struct soa_state {
  int64_t n, T;
  uint64_t run; /* Philox run counter of the next call's first step */
  float *x, *xd, *th, *thd, *eps, *rsum;
  int32_t *tt;
  uint32_t *rng;
} soa_state;

static void soa_init(soa_state *s, const lm_env_spec *cartpole, int64_t n, int64_t T) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->T = T;
  float *all = alloc_floats((size_t)n * 8);
  s->x = all, s->xd = all + n, s->th = all + 2 * n, s->thd = all + 3 * n, s->eps = all + 4 * n, s->rsum = all + 5 * n;
  s->tt = (int32_t *)(all + 6 * n);
  s->rng = (uint32_t *)(all + 7 * n);
  float *s0 = env_initial_state(cartpole, n);
  for (int64_t i = 0; i < n; i++) {
    s->x[i] = s0[4 * i], s->xd[i] = s0[4 * i + 1], s->th[i] = s0[4 * i + 2], s->thd[i] = s0[4 * i + 3];
    s->tt[i] = 0;
    s->rng[i] = (uint32_t)(0x9e3779b9u * (uint32_t)(i + 1)) | 1u;
    s->eps[i] = s->rsum[i] = 0;
  }
  free(s0);
}

static void soa_counts(const soa_state *s, env_counts *c) {
  counts_from(s->eps, s->rsum, s->n, (double)s->n * (double)s->T, c);
}

typedef struct soa_job {
  soa_fn fn;
  soa_state *s;
  int64_t lo, hi;
} soa_job;

static void *soa_thread(void *arg) {
  soa_job *j = arg;
  soa_state *s = j->s;
  int64_t lo = j->lo;
  j->fn(lo, j->hi - lo, s->T, 0x2545f4914f6cdd1dull, s->run, s->x + lo, s->xd + lo, s->th + lo, s->thd + lo, s->tt + lo, s->rng + lo, s->eps + lo,
        s->rsum + lo);
  return NULL;
}

typedef struct soa_arg {
  soa_fn fn;
  soa_state *s;
  int threads;
} soa_arg;

/* One call: T steps of all n envs, split into `threads` contiguous ranges (a pthread each,
 * created per call: a few tens of microseconds against milliseconds of work). */
static int run_soa(void *arg) {
  soa_arg *q = arg;
  enum { MAXT = 64 };
  int nt = q->threads < 1 ? 1 : q->threads > MAXT ? MAXT : q->threads;
  soa_job jobs[MAXT];
  pthread_t tid[MAXT];
  int64_t n = q->s->n, chunk = ((n + nt - 1) / nt + 15) / 16 * 16;
  int started = 0;
  for (int k = 0; k < nt; k++) {
    int64_t lo = k * chunk, hi = lo + chunk < n ? lo + chunk : n;
    jobs[k] = (soa_job){q->fn, q->s, lo < n ? lo : n, hi > lo ? hi : lo};
  }
  for (int k = 1; k < nt; k++)
    if (pthread_create(&tid[k], NULL, soa_thread, &jobs[k]) == 0) started |= 1 << (k & 31);
    else soa_thread(&jobs[k]);
  soa_thread(&jobs[0]);
  for (int k = 1; k < nt; k++)
    if (started & (1 << (k & 31))) pthread_join(tid[k], NULL);
  q->s->run += (uint64_t)q->s->T;
  return 0;
}

/* One hand-written variant: a first call for the counters, then timed. */
static int soa_measure(soa_fn fn, const lm_env_spec *cartpole, int64_t n, int64_t T, int threads, int reps,
                       timing *t, env_counts *c) {
  soa_state s;
  soa_init(&s, cartpole, n, T);
  soa_arg a = {fn, &s, threads};
  run_soa(&a);
  soa_counts(&s, c);
  int rc = time_work(run_soa, &a, reps, t);
  free(s.x);
  return rc;
}

static void env_row(const char *env, const char *variant, int thr, int kernels, const timing *t, double steps,
                    double vs_ref, double vs_hand, const env_counts *c) {
  char thr_s[16] = "-", kern_s[16] = "-", r1[16] = "", r2[16] = "";
  if (thr > 0) snprintf(thr_s, sizeof thr_s, "%d", thr);
  if (kernels >= 0) snprintf(kern_s, sizeof kern_s, "%d", kernels);
  if (vs_ref > 0) snprintf(r1, sizeof r1, vs_ref < 0.995 ? "%.2fx" : "%.1fx", vs_ref);
  if (vs_hand > 0) snprintf(r2, sizeof r2, vs_hand < 0.095 ? "%.3fx" : "%.2fx", vs_hand);
  char len_s[16] = "-";
  if (c->episodes > 0) snprintf(len_s, sizeof len_s, "%.2f", c->steps / c->episodes);
  say("  %-22s %-26s %3s %4s %9.2e %9.2e %8.2f %5.0f%% %7s %7s %7s %3dx%d\n", env, variant, thr_s, kern_s,
      steps / t->med, steps / t->min, 1e3 * t->med, 100.0 * t->cpu_med / t->med, r1, r2, len_s, t->reps, t->iters);
}

static record *env_record(const lm_env_spec *e, const char *variant, int thr, int kernels, const timing *t, int64_t n,
                          int64_t T, const env_counts *c) {
  record *r = rec_new("envs", variant);
  rec_str(r, "env", "%s", e->name);
  rec_str(r, "env_params", "%s", e->params ? e->params : "");
  rec_num(r, "threads", thr > 0 ? thr : NAN);
  rec_num(r, "n_envs", (double)n);
  rec_num(r, "steps_per_call", (double)T);
  rec_num(r, "kernels", kernels >= 0 ? kernels : NAN);
  rec_timing(r, t);
  rec_num(r, "steps_per_s", (double)n * (double)T / t->med);
  rec_num(r, "steps_per_s_best", (double)n * (double)T / t->min);
  rec_num(r, "episodes_first_call", c->episodes);
  rec_num(r, "reward_per_step_first_call", c->steps > 0 ? c->reward / c->steps : NAN);
  return r;
}

static int env_list(const char *list, const lm_env_spec **out, int cap, int *count);

static int bench_envs(const opts *o) {
  int64_t n = o->envs, T = o->env_steps;
  int reps = o->reps < 3 ? o->reps : 3;
  int settings[MAX_THREAD_SETTINGS], ns = env_thread_settings(o, settings);
  say("\n== envs: env-only steps/s, random actions, time limit and same-step auto-reset, %lld envs x %lld steps "
      "per call ==\n"
      "  compiled = a scan program (lm_program_new_scan) of lm_env_vec_step with the random action drawn by\n"
      "    RAND inside the graph (lm_env_random_action), on the cpu backend, LUMEN_THREADS=thr; kern = kernels\n"
      "    per scan (lm_program_get_stats).\n"
      "  reference = the env's scalar reference stepper (ref_step, ref_reset) on the host, one env at a time,\n"
      "    1 thread, actions from xorshift64* (through lm_env_ref_action: sticky actions as the graph's).\n"
      "  hand SoA (CartPole only) = a struct-of-arrays C loop written in rlbench (float32 Euler physics as\n"
      "    Gymnasium, branch-free auto-reset, per-env xorshift32 for actions and resets, 256-env blocks),\n"
      "    and the same loop with lumen's Philox4x32-10 draws (the graph env's streams and counters: a\n"
      "    Philox block per four envs for the actions, one per finished episode for the resets),\n"
      "    split over thr pthreads; once built with rlbench's own flags (%s, %s, %s) and\n"
      "    once at run time by the kernel compiler with the kernels' flags (compiler/cc.h).\n"
      "  Every variant keeps two per-env counters (episodes, summed reward) and writes nothing else per step;\n"
      "  the first call's counters are checked against the reference (5%% or 5 standard errors of the\n"
      "  difference, the random streams being different) before timing. x ref = compiled /\n"
      "  reference steps/s; x hand = compiled / hand-written at the same thr: the run-time-built loop with the\n"
      "  Philox draws the graph makes (RAND is Philox4x32-10 everywhere), when there is one. ep len = steps\n"
      "  per finished episode in the first call. cpu = process CPU time / wall time (all threads): below\n"
      "  100%% x thr, other jobs took the rest of the machine.\n"
      "  Calls of the env benchmark are timed in at most 3 repetitions (after a warm-up call).\n",
      (long long)n, (long long)T, self_compiler(), self_opt(), self_isa());
  say("  %-22s %-26s %3s %4s %9s %9s %8s %6s %7s %7s %7s %s\n", "env", "variant", "thr", "kern", "steps/s", "best/s",
      "ms/call", "cpu", "x ref", "x hand", "ep len", "reps x iters");
  int rc = 0;
  lm_backend_t *backends[MAX_THREAD_SETTINGS] = {0};
  for (int k = 0; k < ns; k++)
    if (!(backends[k] = open_cpu(settings[k]))) rc = 1;
  double steps = (double)n * (double)T;
  char cp_summary[1024] = "";

  /* the run-time-built SoA loop */
  lm_cc *cc = NULL;
  lm_cc_lib *lib = NULL;
  soa_fn soa_rt = NULL, soa_rt_philox = NULL;
  char cc_desc[256] = "";
  if (lm_cc_open(&cc) == LM_OK) {
    snprintf(cc_desc, sizeof cc_desc, "%s", lm_cc_describe(cc));
    size_t len = strlen(soa_cartpole_src) + 128;
    char *src = malloc(len);
    if (src) {
      snprintf(src, len, "#include <math.h>\n#include <stdint.h>\n%s\n", soa_cartpole_src);
      if (lm_cc_build(cc, src, &lib) == LM_OK) {
        soa_rt = (soa_fn)(uintptr_t)lm_cc_sym(lib, "soa_cartpole");
        soa_rt_philox = (soa_fn)(uintptr_t)lm_cc_sym(lib, "soa_cartpole_philox");
      }
      free(src);
    }
    if (!soa_rt || !soa_rt_philox) fprintf(stderr, "rlbench: envs: building the SoA loop at run time failed: %s\n", lm_last_error());
  } else {
    fprintf(stderr, "rlbench: envs: no run-time C compiler (%s); the hand SoA loop is measured as built only\n",
            lm_last_error());
  }

  const lm_env_spec *chosen[64];
  int nchosen = 0;
  if (o->env_list) env_list(o->env_list, chosen, 64, &nchosen); /* checked when parsed */
  else
    for (int ei = 0; ei < lm_env_count() && nchosen < 64; ei++) chosen[nchosen++] = lm_env_at(ei);
  if (o->env_params) {
    say("  env parameters (--env-params): %s\n", o->env_params);
    for (int ei = 0; ei < nchosen; ei++)
      if (lm_env_configure(chosen[ei], o->env_params, &chosen[ei]) != LM_OK) { /* checked when parsed */
        fprintf(stderr, "rlbench: envs: --env-params %s: %s\n", o->env_params, lm_last_error());
        return 1;
      }
  }
  for (int ei = 0; ei < nchosen; ei++) {
    const lm_env_spec *e = chosen[ei];
    int is_cp = !strcmp(e->name, "cartpole");
    /* the reference first: the others are checked against its counters */
    ref_env_arg ra = {e, n, T, env_initial_state(e, n), calloc((size_t)n, sizeof(int)), 0x2545f4914f6cdd1dull, 0,
                      NULL, NULL, calloc((size_t)n, sizeof(float))};
    float *ref_counts = calloc(2 * (size_t)n, sizeof(float));
    if (!ra.t || !ra.last || !ref_counts) {
      fputs("rlbench: out of memory\n", stderr);
      exit(1);
    }
    ra.eps = ref_counts, ra.rew = ref_counts + n;
    run_ref_env(&ra);
    env_counts want;
    counts_from(ra.eps, ra.rew, n, steps, &want);
    timing tref = {0};
    time_work(run_ref_env, &ra, reps, &tref);
    free(ra.state);
    free(ra.t);
    free(ra.last);
    free(ref_counts);
    double ref_sps = steps / tref.med;
    env_row(e->name, "reference stepper", 1, -1, &tref, steps, -1, -1, &want);
    env_record(e, "reference", 1, -1, &tref, n, T, &want);

    /* the hand-written loops (CartPole) */
    double hand_sps[3][MAX_THREAD_SETTINGS] = {{0}};
    static const char *const hand_names[3] = {"hand SoA, rlbench flags", "hand SoA, kernel cc",
                                              "hand SoA Philox, kernel cc"};
    static const char *const hand_keys[3] = {"hand_soa_rlbench_flags", "hand_soa_runtime_cc",
                                             "hand_soa_philox_runtime_cc"};
    if (is_cp) {
      for (int which = 0; which < 3; which++) {
        soa_fn fn = which == 0 ? soa_cartpole : which == 1 ? soa_rt : soa_rt_philox;
        if (!fn) continue;
        for (int k = 0; k < ns; k++) {
          int thr = thread_label(settings[k]);
          timing th;
          env_counts hc;
          if (soa_measure(fn, e, n, T, thr, reps, &th, &hc) || env_counts_check(e->name, "hand SoA", hc, want)) {
            rc = 1;
            continue;
          }
          hand_sps[which][k] = steps / th.med;
          env_row(e->name, hand_names[which], thr, -1, &th, steps, -1, -1, &hc);
          record *r = env_record(e, hand_keys[which], thr, -1, &th, n, T, &hc);
          rec_str(r, "compiler", "%s", which ? cc_desc : self_compiler());
          if (!which) rec_str(r, "flags", "%s; %s", self_opt(), self_isa());
        }
      }
    }

    /* the compiled graph */
    lm_graph_t *g = env_graph(e);
    if (!g) {
      rc = 1;
      continue;
    }
    for (int k = 0; k < ns; k++) {
      if (!backends[k]) continue;
      int thr = thread_label(settings[k]), kernels = -1;
      timing tc;
      env_counts cc_counts;
      if (env_compiled(backends[k], e, g, n, T, reps, &tc, &kernels, &cc_counts) ||
          env_counts_check(e->name, "compiled", cc_counts, want)) {
        say("  %-22s %-26s %3d  FAILED (see stderr)\n", e->name, "compiled (cpu)", thr);
        rc = 1;
        continue;
      }
      double sps = steps / tc.med;
      /* like for like: the hand loop that draws what the graph draws (RAND is Philox4x32-10,
       * DESIGN.md), else the xorshift one */
      double hand = !is_cp ? 0 : hand_sps[2][k] > 0 ? hand_sps[2][k] : hand_sps[1][k] > 0 ? hand_sps[1][k] : hand_sps[0][k];
      env_row(e->name, "compiled (cpu)", thr, kernels, &tc, steps, sps / ref_sps, hand > 0 ? sps / hand : -1,
              &cc_counts);
      record *r = env_record(e, "compiled_cpu", thr, kernels, &tc, n, T, &cc_counts);
      rec_num(r, "ratio_vs_reference", sps / ref_sps);
      if (is_cp && hand_sps[0][k] > 0) rec_num(r, "ratio_vs_hand_rlbench_flags", sps / hand_sps[0][k]);
      if (is_cp && hand_sps[1][k] > 0) rec_num(r, "ratio_vs_hand_runtime_cc", sps / hand_sps[1][k]);
      if (is_cp && hand_sps[2][k] > 0) rec_num(r, "ratio_vs_hand_philox_runtime_cc", sps / hand_sps[2][k]);
      if (is_cp)
        snprintf(cp_summary + strlen(cp_summary), sizeof cp_summary - strlen(cp_summary),
                 "%s%d thr: %.3gx the hand loop with the same Philox draws, %.3gx the hand loop with xorshift "
                 "draws (both built by the kernel compiler), %.3gx the hand loop built with rlbench's flags, %.3gx "
                 "the reference",
                 cp_summary[0] ? "; " : "", thr, hand_sps[2][k] > 0 ? sps / hand_sps[2][k] : NAN,
                 hand_sps[1][k] > 0 ? sps / hand_sps[1][k] : NAN, hand_sps[0][k] > 0 ? sps / hand_sps[0][k] : NAN,
                 sps / ref_sps);
    }
    lm_graph_free(g);
  }
  if (cc_desc[0]) say("  kernel compiler (compiled rows and 'hand SoA, kernel cc'): %s\n", cc_desc);
  if (cp_summary[0]) say("  CartPole compiled (target: >= 1x the hand loop with the same draws): %s\n", cp_summary);
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
  for (int k = 0; k < ns; k++) lm_backend_free(backends[k]);
  return rc;
}

/* ================================================================ rollout: env + policy */

static const char *stepper_name(lm_stepper s) { return s == LM_STEPPER_HOST ? "host" : "device"; }

/* Splits a comma-separated list of env names into specs; 0 on success. */
static int env_list(const char *list, const lm_env_spec **out, int cap, int *count) {
  *count = 0;
  for (const char *p = list;;) {
    size_t len = strcspn(p, ",");
    char name[64];
    if (!len || len >= sizeof name) return 1;
    memcpy(name, p, len);
    name[len] = 0;
    const lm_env_spec *e = lm_env_find(name);
    if (!e || *count == cap) return 1;
    out[(*count)++] = e;
    if (!p[len]) break;
    p += len + 1;
  }
  return 0;
}

typedef struct rollout_arg {
  lm_rollout *r;
} rollout_arg;

static int run_rollout(void *arg) {
  rollout_arg *a = arg;
  if (lm_rollout_run(a->r) != LM_OK) return fail_lm("lm_rollout_run");
  return 0;
}

typedef struct rollout_result {
  timing t;
  int kernels;
  double episodes, mean_return, mean_length;
} rollout_result;

/* The policy rltrain trains for env (lm_ppo_defaults: CleanRL's 64-64 tanh actor-critic,
 * MinAtar's convolutional network for image observations), contraction allowed as PPO runs it
 * unless --exact (train/ppo.c). */
static lm_policy_config rollout_policy(const lm_env_spec *e) {
  lm_policy_config cfg = lm_ppo_defaults(e).policy;
  cfg.contract = 1;
  return cfg;
}

/* The sum of per(pol, i) over the weights (parameters with cols > 0) of the policy cfg builds
 * for env; 0 when it cannot be built. */
static double over_weights(const lm_env_spec *env, const lm_policy_config *cfg, double (*per)(const lm_policy *, int)) {
  lm_graph_t *g = lm_graph_new();
  lm_policy pol;
  double sum = 0;
  if (g && lm_policy_build(g, cfg, env, &pol) == LM_OK)
    for (int i = 0; i < pol.nparams; i++)
      if (pol.cols[i]) sum += per(&pol, i);
  lm_graph_free(g);
  return sum;
}

static int name_ends(const char *name, const char *tail) {
  const size_t n = strlen(name), t = strlen(tail);
  return n > t && !strcmp(name + n - t, tail);
}

/* A weight's forward FLOPs for one observation: 2 rows x cols, a convolution's at every pixel
 * of the image (its SAME padding's zeros counted). */
static double forward_flops(const lm_policy *pol, int i) {
  const int conv = name_ends(pol->name[i], ".conv.w");
  return 2.0 * pol->rows[i] * pol->cols[i] * (conv ? (double)pol->image[0] * pol->image[1] : 1.0);
}

/* FLOPs of the policy's forward pass for one observation, actor and critic. */
static double policy_forward_flops(const lm_env_spec *env, const lm_policy_config *cfg) {
  return over_weights(env, cfg, forward_flops);
}

static int fma_peak(int threads, double *one, double *all);

/* Builds a rollout (rltrain's policy for the env, rollout_policy; orthogonal init, seed 1), times
 * lm_rollout_run, then reads the statistics of the episodes every run so far finished (they are
 * compared between the steppers). */
static int rollout_measure(lm_backend_t *b, const lm_env_spec *e, lm_stepper st, int64_t n, int64_t T, int reps,
                           rollout_result *out) {
  lm_policy_config cfg = rollout_policy(e);
  lm_rollout *r = lm_rollout_new(b, e, &cfg, n, T, st);
  if (!r) return fail_lm("lm_rollout_new");
  int rc = 1;
  lm_program_t *pp = st == LM_STEPPER_HOST ? lm_rollout_policy_program(r) : lm_rollout_program(r);
  lm_program_stats s = {0};
  if (lm_policy_init(lm_rollout_policy(r), pp, 1) != LM_OK || lm_rollout_reset(r, 1) != LM_OK ||
      lm_program_get_stats(pp, &s) != LM_OK) {
    fail_lm("rollout: init/reset/stats");
    goto done;
  }
  out->kernels = st == LM_STEPPER_HOST ? s.kernels * (int)T : s.kernels;
  rollout_arg a = {r};
  if (time_calls(run_rollout, &a, reps, &out->t)) goto done;
  if (lm_rollout_take_stats(r, &out->episodes, &out->mean_return, &out->mean_length) != LM_OK) {
    fail_lm("lm_rollout_take_stats");
    goto done;
  }
  rc = 0;
done:
  lm_rollout_free(r);
  return rc;
}

static int bench_rollout(const opts *o) {
  const lm_env_spec *envs[16];
  int ne = 0;
  if (env_list(o->rollout_envs, envs, 16, &ne)) {
    fprintf(stderr, "rlbench: rollout: bad env list '%s'\n", o->rollout_envs);
    return 1;
  }
  int64_t n = o->envs, T = o->horizon;
  say("\n== rollout: env + policy steps/s (rollout only), %lld envs x %lld steps per lm_rollout_run ==\n"
      "  policy: the one rltrain trains for the env (lm_ppo_defaults: obs -> 64 -> 64 -> actions/value, tanh,\n"
      "  separate actor and critic trunks; for image observations MinAtar's conv 3x3 x 16 -> dense 128, relu,\n"
      "  one trunk), orthogonal init, contraction allowed as PPO runs it (lm_policy_config.contract);\n"
      "  sampling from RAND, same-step auto-reset, the whole trajectory written (obs, action,\n"
      "  logp, value, reward, terminated, truncated, final obs) and episode statistics kept.\n"
      "  device = one scan program (the whole rollout; kern = kernels per rollout); host = the policy program\n"
      "  run once per step (kern = its kernels x T) with the env stepped by the scalar reference on the host\n"
      "  and obs/actions copied across every step. x host = device / host steps/s. ep len/ret = means of the\n"
      "  episodes finished during the timed calls (-: none; the steppers must agree on the length to 25%%,\n"
      "  compared when both finished some). cpu = process CPU time / wall time. A call is long (N*T steps: seconds\n"
      "  here), so at most 2 calls are timed (med = their mean), with no warm-up call (the kernels are\n"
      "  compiled in lm_rollout_new; first-touch costs are a few ms). Below each env: the policy's forward\n"
      "  FLOPs per env step (2 x rows x cols of each weight; a convolution's at every pixel) at the device's\n"
      "  steps/s, against the FMA peak on as many threads (ten chains of FMAs 16 lanes wide with AVX-512, else 8).\n",
      (long long)n, (long long)T);
  say("  %-22s %3s %-7s %5s %9s %9s %9s %5s %8s %8s %9s %s\n", "env", "thr", "stepper", "kern", "steps/s", "best/s",
      "ms/call", "cpu", "x host", "ep len", "ep ret", "reps x iters");
  int reps = o->reps < 2 ? o->reps : 2;
  int rc = 0;
  lm_backend_t *backends[MAX_THREAD_SETTINGS] = {0};
  for (int k = 0; k < o->nthreads; k++)
    if (!(backends[k] = open_cpu(o->threads[k]))) rc = 1;
  double steps = (double)n * (double)T;
  double peak[MAX_THREAD_SETTINGS];
  for (int k = 0; k < o->nthreads; k++) {
    double one, all;
    int thr = thread_label(o->threads[k]);
    peak[k] = fma_peak(thr, &one, &all) ? NAN : thr == 1 ? one : all;
  }
  for (int ei = 0; ei < ne; ei++) {
    const lm_env_spec *e = envs[ei];
    const lm_policy_config pcfg = rollout_policy(e);
    const double flops = policy_forward_flops(e, &pcfg);
    for (int k = 0; k < o->nthreads; k++) {
      if (!backends[k]) continue;
      int thr = thread_label(o->threads[k]);
      rollout_result res[2];
      int ok[2] = {0, 0};
      for (int si = 1; si >= 0; si--) { /* host first: the device row carries the ratio */
        lm_stepper st = si ? LM_STEPPER_HOST : LM_STEPPER_DEVICE;
        memset(&res[si], 0, sizeof res[si]);
        ok[si] = rollout_measure(backends[k], e, st, n, T, reps, &res[si]) == 0;
        if (!ok[si]) {
          say("  %-22s %3d %-7s  FAILED (see stderr)\n", e->name, thr, stepper_name(st));
          rc = 1;
          continue;
        }
        if (!si && ok[0] && ok[1]) {
          double d = res[0].mean_length, h = res[1].mean_length;
          if (res[0].episodes > 0 && res[1].episodes > 0 && !(fabs(d - h) <= 0.25 * fmax(d, h))) {
            fprintf(stderr,
                    "rlbench: rollout %s: the device and host steppers disagree: %.0f episodes of mean length %.2f "
                    "vs %.0f of %.2f\n",
                    e->name, res[0].episodes, d, res[1].episodes, h);
            rc = 1;
          }
        }
        const rollout_result *q = &res[si];
        double sps = steps / q->t.med;
        char ratio[16] = "";
        if (!si && ok[1]) snprintf(ratio, sizeof ratio, "%.2fx", sps / (steps / res[1].t.med));
        char len_s[24] = "-", ret_s[24] = "-";
        if (q->episodes > 0) {
          snprintf(len_s, sizeof len_s, "%.2f", q->mean_length);
          snprintf(ret_s, sizeof ret_s, "%.2f", q->mean_return);
        }
        say("  %-22s %3d %-7s %5d %9.2e %9.2e %9.2f %4.0f%% %8s %8s %9s %3dx%d\n", e->name, thr, stepper_name(st),
            q->kernels, sps, steps / q->t.min, 1e3 * q->t.med, 100.0 * q->t.cpu_med / q->t.med, ratio, len_s, ret_s,
            q->t.reps, q->t.iters);
        record *r = rec_new("rollout", stepper_name(st));
        rec_str(r, "env", "%s", e->name);
        rec_num(r, "threads", thr);
        rec_num(r, "n_envs", (double)n);
        rec_num(r, "horizon", (double)T);
        rec_num(r, "kernels_per_rollout", q->kernels);
        rec_timing(r, &q->t);
        rec_num(r, "steps_per_s", sps);
        rec_num(r, "steps_per_s_best", steps / q->t.min);
        rec_num(r, "check_episodes", q->episodes);
        rec_num(r, "check_mean_length", q->mean_length);
        rec_num(r, "check_mean_return", q->mean_return);
        if (!si && ok[1]) rec_num(r, "ratio_device_over_host", sps / (steps / res[1].t.med));
        if (!si && flops > 0) {
          const double gf = flops * sps * 1e-9;
          say("  %-22s %3d policy  forward %.1f kFLOP/step: %.1f GFLOP/s, %.0f%% of the FMA peak (%.0f GFLOP/s)\n", "",
              thr, flops * 1e-3, gf, 100 * gf / peak[k], peak[k]);
          rec_num(r, "policy_flops_per_step", flops);
          rec_num(r, "policy_gflops", gf);
          rec_num(r, "fma_peak_gflops", peak[k]);
        }
      }
    }
  }
  for (int k = 0; k < o->nthreads; k++) lm_backend_free(backends[k]);
  return rc;
}

/* ================================================================ train: env + policy + PPO */

/* Mean return of the last `want` finished episodes from per-iteration counts and means (as
 * rltrain computes it): the newest iterations first, the oldest one counted in part. */
typedef struct ep_window {
  double count[4096], sum[4096];
  int n;
} ep_window;

static void window_push(ep_window *w, double count, double mean) {
  if (w->n == 4096) {
    memmove(w->count, w->count + 2048, 2048 * sizeof w->count[0]);
    memmove(w->sum, w->sum + 2048, 2048 * sizeof w->sum[0]);
    w->n = 2048;
  }
  w->count[w->n] = count;
  w->sum[w->n++] = count * mean;
}

static double window_mean(const ep_window *w, double want, double *have) {
  double c = 0, s = 0;
  for (int i = w->n; i-- > 0 && c < want;) {
    double take = w->count[i] < want - c ? w->count[i] : want - c;
    if (w->count[i] > 0) s += w->sum[i] * take / w->count[i];
    c += take;
  }
  *have = c;
  return c > 0 ? s / c : 0;
}

typedef struct train_tput {
  double med, min, rollout_med, update_med, cpu_med; /* seconds per iteration */
  int kernels, iters;
  int64_t steps_per_iter;
} train_tput;

/* lm_trainer_iterate with lm_ppo_defaults: 2 warm-up iterations, then `iters` timed one by one. */
static int train_throughput(lm_backend_t *b, const lm_env_spec *e, lm_stepper st, int iters, train_tput *out) {
  lm_ppo_config cfg = lm_ppo_defaults(e);
  cfg.stepper = st;
  lm_trainer *t = lm_trainer_new(b, e, &cfg);
  if (!t) return fail_lm("lm_trainer_new");
  double wall[MAX_REPS], ro[MAX_REPS], up[MAX_REPS], cpu[MAX_REPS];
  int rc = 0;
  for (int i = 0; i < 2 + iters && !rc; i++) {
    lm_iter_stats s;
    double t0 = now_s(), c0 = cpu_s();
    if (lm_trainer_iterate(t, &s) != LM_OK) {
      rc = fail_lm("lm_trainer_iterate");
      break;
    }
    if (i >= 2) wall[i - 2] = now_s() - t0, cpu[i - 2] = cpu_s() - c0, ro[i - 2] = s.rollout_s, up[i - 2] = s.update_s;
  }
  if (!rc) {
    qsort(wall, (size_t)iters, sizeof wall[0], cmp_double);
    qsort(ro, (size_t)iters, sizeof ro[0], cmp_double);
    qsort(up, (size_t)iters, sizeof up[0], cmp_double);
    qsort(cpu, (size_t)iters, sizeof cpu[0], cmp_double);
#define MEDIAN(v) (iters % 2 ? (v)[iters / 2] : 0.5 * ((v)[iters / 2 - 1] + (v)[iters / 2]))
    out->med = MEDIAN(wall);
    out->min = wall[0];
    out->rollout_med = MEDIAN(ro);
    out->update_med = MEDIAN(up);
    out->cpu_med = MEDIAN(cpu);
#undef MEDIAN
    out->kernels = lm_trainer_kernels_per_iteration(t);
    out->iters = iters;
    out->steps_per_iter = cfg.n_envs * cfg.horizon;
  }
  lm_trainer_free(t);
  return rc;
}

typedef struct solve_result {
  int solved;
  double wall_s, setup_s, mean100, cpu_s;
  int64_t env_steps, iterations;
} solve_result;

/* Time-to-solve: wall seconds from lm_trainer_new (kernels already in the on-disk cache) until
 * the mean return of the last 100 finished episodes reaches the env's threshold, or the step
 * budget runs out. */
static int train_solve(lm_backend_t *b, const lm_env_spec *e, lm_stepper st, uint64_t seed, int64_t budget,
                       solve_result *out) {
  lm_ppo_config cfg = lm_ppo_defaults(e);
  cfg.stepper = st;
  cfg.seed = seed;
  if (budget > 0) cfg.total_steps = budget;
  memset(out, 0, sizeof *out);
  /* warm the compile cache (a no-op if the throughput run already did) */
  lm_trainer *t = lm_trainer_new(b, e, &cfg);
  if (!t) return fail_lm("lm_trainer_new");
  lm_trainer_free(t);
  static ep_window w;
  memset(&w, 0, sizeof w);
  double t0 = now_s(), c0 = cpu_s();
  t = lm_trainer_new(b, e, &cfg);
  if (!t) return fail_lm("lm_trainer_new");
  out->setup_s = now_s() - t0;
  int rc = 0;
  int64_t iters = lm_trainer_total_iterations(t);
  while (lm_trainer_iterations(t) < iters) {
    lm_iter_stats s;
    if (lm_trainer_iterate(t, &s) != LM_OK) {
      rc = fail_lm("lm_trainer_iterate");
      break;
    }
    window_push(&w, s.episodes, s.mean_return);
    double have;
    out->mean100 = window_mean(&w, 100, &have);
    out->env_steps = s.env_steps;
    out->iterations = s.iteration;
    if (have >= 100 && out->mean100 >= e->solved_return) {
      out->solved = 1;
      break;
    }
  }
  out->wall_s = now_s() - t0;
  out->cpu_s = cpu_s() - c0;
  lm_trainer_free(t);
  return rc;
}

static int cmp_solve(const void *a, const void *b) {
  const solve_result *x = a, *y = b;
  /* unsolved runs sort last */
  double u = x->solved ? x->wall_s : INFINITY, v = y->solved ? y->wall_s : INFINITY;
  return (u > v) - (u < v);
}

static int bench_train(const opts *o) {
  const lm_env_spec *e = lm_env_find("cartpole");
  if (!e) return fail_lm("train: no cartpole env");
  lm_ppo_config def = lm_ppo_defaults(e);
  int64_t budget = o->solve_budget > 0 ? o->solve_budget : def.total_steps;
  say("\n== train: env + policy + PPO steps/s and time-to-solve, %s with lm_ppo_defaults ==\n"
      "  defaults: %lld envs x %lld steps per iteration, %d epochs x %d minibatches, lr %g annealed over\n"
      "  total_steps, 64-64 tanh actor-critic. steps/s = envs x steps / median wall time of one\n"
      "  lm_trainer_iterate (after 2 warm-up iterations; %d timed); rollout/update = medians of the two\n"
      "  phases (lm_iter_stats); kern = kernels launched per iteration (lm_trainer_kernels_per_iteration;\n"
      "  host: the policy program's kernels x T). x host = device / host steps/s.\n",
      e->gym_id, (long long)def.n_envs, (long long)def.horizon, def.epochs, def.minibatches, (double)def.lr,
      o->reps);
  say("  %-10s %3s %-7s %5s %9s %9s %9s %10s %10s %5s %8s\n", "env", "thr", "stepper", "kern", "steps/s", "best/s",
      "ms/iter", "rollout ms", "update ms", "cpu", "x host");
  int rc = 0;
  lm_backend_t *backends[MAX_THREAD_SETTINGS] = {0};
  for (int k = 0; k < o->nthreads; k++)
    if (!(backends[k] = open_cpu(o->threads[k]))) rc = 1;
  for (int k = 0; k < o->nthreads; k++) {
    if (!backends[k]) continue;
    int thr = thread_label(o->threads[k]);
    train_tput tp[2];
    int ok[2] = {0, 0};
    for (int si = 1; si >= 0; si--) {
      lm_stepper st = si ? LM_STEPPER_HOST : LM_STEPPER_DEVICE;
      memset(&tp[si], 0, sizeof tp[si]);
      ok[si] = train_throughput(backends[k], e, st, o->reps, &tp[si]) == 0;
      if (!ok[si]) {
        say("  %-10s %3d %-7s  FAILED (see stderr)\n", e->name, thr, stepper_name(st));
        rc = 1;
        continue;
      }
      const train_tput *q = &tp[si];
      double sps = (double)q->steps_per_iter / q->med;
      char ratio[16] = "";
      if (!si && ok[1]) snprintf(ratio, sizeof ratio, "%.2fx", sps / ((double)tp[1].steps_per_iter / tp[1].med));
      say("  %-10s %3d %-7s %5d %9.2e %9.2e %9.1f %10.1f %10.1f %4.0f%% %8s\n", e->name, thr, stepper_name(st),
          q->kernels, sps, (double)q->steps_per_iter / q->min, 1e3 * q->med, 1e3 * q->rollout_med,
          1e3 * q->update_med, 100.0 * q->cpu_med / q->med, ratio);
      record *r = rec_new("train", stepper_name(st));
      rec_str(r, "env", "%s", e->name);
      rec_num(r, "threads", thr);
      rec_num(r, "n_envs", (double)def.n_envs);
      rec_num(r, "horizon", (double)def.horizon);
      rec_num(r, "kernels_per_iteration", q->kernels);
      rec_num(r, "iterations_timed", q->iters);
      rec_num(r, "ms_per_iter_median", 1e3 * q->med);
      rec_num(r, "ms_per_iter_min", 1e3 * q->min);
      rec_num(r, "rollout_ms_median", 1e3 * q->rollout_med);
      rec_num(r, "update_ms_median", 1e3 * q->update_med);
      rec_num(r, "cpu_ms_per_iter_median", 1e3 * q->cpu_med);
      rec_num(r, "steps_per_s", sps);
      rec_num(r, "steps_per_s_best", (double)q->steps_per_iter / q->min);
      if (!si && ok[1]) rec_num(r, "ratio_device_over_host", sps / ((double)tp[1].steps_per_iter / tp[1].med));
    }
  }

  say("\n  time-to-solve %s: wall seconds from lm_trainer_new (warm kernel cache: a trainer is built and\n"
      "  freed first) until the mean return of the last 100 finished episodes (a rolling window over\n"
      "  per-iteration counts and means, as rltrain computes it) is >= %.0f; budget %lld env steps%s\n"
      "  (the learning rate anneals over the budget). %d seed(s) per stepper, from 1; one run each, so\n"
      "  this is noisy: the wall time depends on the seed and on other jobs on the machine. setup = the\n"
      "  lm_trainer_new part; cpu s = process CPU seconds (all threads) of the same span. x host = host\n"
      "  wall / device wall (of the medians).\n",
      e->gym_id, (double)e->solved_return, (long long)budget, o->solve_budget > 0 ? "" : " (lm_ppo_defaults)",
      o->seeds);
  say("  %-10s %3s %-7s %6s %8s %8s %8s %10s %8s %10s %8s %8s\n", "env", "thr", "stepper", "solved", "wall s",
      "cpu s", "setup s", "env steps", "iters", "last100", "steps/s", "x host");
  for (int k = 0; k < o->nthreads; k++) {
    if (!backends[k]) continue;
    int thr = thread_label(o->threads[k]);
    double med_wall[2] = {NAN, NAN};
    for (int si = 1; si >= 0; si--) {
      lm_stepper st = si ? LM_STEPPER_HOST : LM_STEPPER_DEVICE;
      solve_result runs[16];
      int nr = 0, solved = 0;
      for (int s = 0; s < o->seeds; s++) {
        if (train_solve(backends[k], e, st, (uint64_t)(s + 1), budget, &runs[nr])) {
          rc = 1;
          continue;
        }
        record *r = rec_new("time_to_solve", stepper_name(st));
        rec_str(r, "env", "%s", e->name);
        rec_num(r, "threads", thr);
        rec_num(r, "seed", s + 1);
        rec_num(r, "solved", runs[nr].solved);
        rec_num(r, "wall_s", runs[nr].wall_s);
        rec_num(r, "setup_s", runs[nr].setup_s);
        rec_num(r, "cpu_s", runs[nr].cpu_s);
        rec_num(r, "env_steps", (double)runs[nr].env_steps);
        rec_num(r, "iterations", (double)runs[nr].iterations);
        rec_num(r, "mean_return_last100", runs[nr].mean100);
        rec_num(r, "threshold", e->solved_return);
        rec_num(r, "budget_env_steps", (double)budget);
        solved += runs[nr].solved;
        nr++;
      }
      if (!nr) continue;
      qsort(runs, (size_t)nr, sizeof runs[0], cmp_solve);
      /* the median run, unsolved ones counting as slowest */
      const solve_result *m = &runs[nr / 2];
      char sv[16], ratio[16] = "";
      snprintf(sv, sizeof sv, "%d/%d", solved, nr);
      if (m->solved) med_wall[si] = m->wall_s;
      if (!si && isfinite(med_wall[0]) && isfinite(med_wall[1]))
        snprintf(ratio, sizeof ratio, "%.2fx", med_wall[1] / med_wall[0]);
      if (m->solved)
        say("  %-10s %3d %-7s %6s %8.2f %8.2f %8.2f %10lld %8lld %10.2f %8.0f %8s\n", e->name, thr,
            stepper_name(st), sv, m->wall_s, m->cpu_s, m->setup_s, (long long)m->env_steps, (long long)m->iterations,
            m->mean100, (double)m->env_steps / m->wall_s, ratio);
      else
        say("  %-10s %3d %-7s %6s %8s %8.2f %8.2f %10lld %8lld %10.2f %8.0f %8s  NOT SOLVED within %lld steps (%.1f s)\n",
            e->name, thr, stepper_name(st), sv, "-", m->cpu_s, m->setup_s, (long long)m->env_steps,
            (long long)m->iterations, m->mean100, (double)m->env_steps / m->wall_s, ratio, (long long)budget,
            m->wall_s);
      record *r = rec_new("time_to_solve", stepper_name(st));
      rec_str(r, "env", "%s", e->name);
      rec_num(r, "threads", thr);
      rec_str(r, "summary", "median of %d seed(s)", nr);
      rec_num(r, "solved_runs", solved);
      rec_num(r, "runs", nr);
      rec_num(r, "wall_s_median", m->solved ? m->wall_s : NAN);
      rec_num(r, "env_steps_median_run", (double)m->env_steps);
      if (!si && isfinite(med_wall[0]) && isfinite(med_wall[1]))
        rec_num(r, "ratio_host_over_device_wall", med_wall[1] / med_wall[0]);
    }
  }
  for (int k = 0; k < o->nthreads; k++) lm_backend_free(backends[k]);
  return rc;
}

/* ================================================================ busy: training beside busy processes */

/* A child that spins until it is killed (and dies with rlbench on Linux). */
static pid_t spin_child(void) {
  pid_t pid = fork();
  if (pid == 0) {
#if defined(__linux__)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    volatile unsigned long spin = 0;
    for (;;) spin++;
  }
  return pid;
}

static void stop_children(pid_t *pids, int n) {
  for (int i = 0; i < n; i++)
    if (pids[i] > 0) kill(pids[i], SIGKILL);
  for (int i = 0; i < n; i++)
    if (pids[i] > 0) waitpid(pids[i], NULL, 0), pids[i] = 0;
}

/* lm_trainer_iterate calls per timed round; rounds at least (a verdict on 7 rounds of 3 calls
 * swung between 0.9x and 1.5x from one run to the next) */
enum { BUSY_ITERS = 5, BUSY_MIN_ROUNDS = 11 };

/* `rounds` rounds, each BUSY_ITERS iterations of every trainer in turn (interleaved, so both see
 * the same load); medians and minima over rounds of seconds per iteration, and CPU use. */
static int busy_rounds(lm_trainer **t, int nt, int rounds, double *med, double *mn, double *cpu) {
  double w[2][MAX_REPS], c[2][MAX_REPS];
  for (int r = 0; r < rounds; r++)
    for (int k = 0; k < nt; k++) {
      double t0 = now_s(), c0 = cpu_s();
      for (int i = 0; i < BUSY_ITERS; i++) {
        lm_iter_stats st;
        if (lm_trainer_iterate(t[k], &st) != LM_OK) return fail_lm("lm_trainer_iterate");
      }
      w[k][r] = (now_s() - t0) / BUSY_ITERS;
      c[k][r] = (cpu_s() - c0) / BUSY_ITERS;
    }
  for (int k = 0; k < nt; k++) {
    qsort(w[k], (size_t)rounds, sizeof w[k][0], cmp_double);
    qsort(c[k], (size_t)rounds, sizeof c[k][0], cmp_double);
    med[k] = rounds % 2 ? w[k][rounds / 2] : 0.5 * (w[k][rounds / 2 - 1] + w[k][rounds / 2]);
    cpu[k] = rounds % 2 ? c[k][rounds / 2] : 0.5 * (c[k][rounds / 2 - 1] + c[k][rounds / 2]);
    mn[k] = w[k][0];
  }
  return 0;
}

static int bench_busy(const opts *o) {
  const lm_env_spec *e = lm_env_find("cartpole");
  if (!e) return fail_lm("busy: no cartpole env");
  int thr = thread_label(0), nspin = online_cpus() < 64 ? online_cpus() : 64;
  int rounds = o->reps < BUSY_MIN_ROUNDS ? BUSY_MIN_ROUNDS : o->reps;
  lm_ppo_config cfg = lm_ppo_defaults(e);
  say("\n== busy: PPO training of %s beside %d busy processes, the default threads (%d) vs 1 thread ==\n"
      "  the machine as it is, then with one spinning child process per online CPU (forked here and\n"
      "  killed at the end). lm_ppo_defaults (%lld envs x %lld steps); %d rounds, each %d\n"
      "  lm_trainer_iterate calls of the default-threads trainer then %d of the 1-thread one\n"
      "  (interleaved); ms/iter = median over rounds (min beside it); cpu = process CPU / wall;\n"
      "  load = the 1-minute load average after the rounds.\n"
      "  x 1 thr = default / 1 thread (median ms/iter); the bound (issue 24): at most 1.5x busy.\n",
      e->gym_id, nspin, thr, (long long)cfg.n_envs, (long long)cfg.horizon, rounds, BUSY_ITERS, BUSY_ITERS);
  if (thr == 1) {
    say("  the default is 1 thread here: nothing to compare\n");
    return 0;
  }
  say("  %-12s %5s %3s %9s %9s %5s %8s %6s\n", "machine", "load", "thr", "ms/iter", "min", "cpu", "x 1 thr", "bound");
  lm_backend_t *b[2] = {open_cpu(0), open_cpu(1)};
  lm_trainer *t[2] = {NULL, NULL};
  int rc = 0;
  pid_t pids[64] = {0};
  if (!b[0] || !b[1]) {
    rc = 1;
    goto done;
  }
  for (int k = 0; k < 2 && !rc; k++) {
    cfg.stepper = LM_STEPPER_DEVICE;
    if (!(t[k] = lm_trainer_new(b[k], e, &cfg))) rc = fail_lm("lm_trainer_new");
    for (int i = 0; i < 2 && !rc; i++) { /* warm-up */
      lm_iter_stats st;
      if (lm_trainer_iterate(t[k], &st) != LM_OK) rc = fail_lm("lm_trainer_iterate");
    }
  }
  for (int busy = 0; busy < 2 && !rc; busy++) {
    if (busy)
      for (int i = 0; i < nspin; i++)
        if ((pids[i] = spin_child()) < 0) {
          fprintf(stderr, "rlbench: busy: fork: %s\n", strerror(errno));
          rc = 1;
          break;
        }
    if (busy) nanosleep(&(struct timespec){0, 100000000}, NULL); /* let the spinners start */
    double med[2], mn[2], cpu[2];
    if (!rc) rc = busy_rounds(t, 2, rounds, med, mn, cpu);
    double load = loadavg1(); /* after: it lags by a minute */
    if (busy) stop_children(pids, nspin);
    if (rc) break;
    double ratio = med[0] / med[1];
    char label[32];
    snprintf(label, sizeof label, busy ? "+%d spinning" : "as it is", nspin);
    for (int k = 0; k < 2; k++) {
      char rs[16] = "", bound[16] = "";
      if (!k) snprintf(rs, sizeof rs, "%.2fx", ratio);
      if (!k && busy) snprintf(bound, sizeof bound, "%s", ratio <= 1.5 ? "ok" : "OVER");
      say("  %-12s %5.2f %3d %9.1f %9.1f %4.0f%% %8s %6s\n", label, load, k ? 1 : thr, 1e3 * med[k], 1e3 * mn[k],
          100.0 * cpu[k] / med[k], rs, bound);
      record *r = rec_new("busy", busy ? "spinning" : "as_is");
      rec_str(r, "env", "%s", e->name);
      rec_num(r, "threads", k ? 1 : thr);
      rec_num(r, "spinning_processes", busy ? nspin : 0);
      rec_num(r, "loadavg1", load);
      rec_num(r, "rounds", rounds);
      rec_num(r, "iterations_per_round", BUSY_ITERS);
      rec_num(r, "ms_per_iter_median", 1e3 * med[k]);
      rec_num(r, "ms_per_iter_min", 1e3 * mn[k]);
      rec_num(r, "cpu_ms_per_iter_median", 1e3 * cpu[k]);
      if (!k) rec_num(r, "ratio_default_over_1_thread", ratio);
    }
  }
done:
  stop_children(pids, nspin);
  for (int k = 0; k < 2; k++) {
    if (t[k]) lm_trainer_free(t[k]);
    if (b[k]) lm_backend_free(b[k]);
  }
  return rc;
}

/* ================================================================ search */

/* One graph, the default schedule vs the searched one (lm_search_bench: both measured here,
 * the searched plan checked against the default first). flops: the graph's matmul FLOPs (0: not
 * counted); peak: the FMA peak on the threads the plans use (NaN: not measured). */
static int search_row(const char *name, const lm_graph_t *g, const char *const *names, const int64_t *values, int n,
                      double budget, const char *device, double flops, double peak) {
  lm_search_options so;
  lm_search_options_init(&so);
  so.budget_s = budget;
  so.backend = device;
  lm_search_bench_result r;
  if (lm_search_bench(g, names, values, n, &so, &r) != LM_OK) {
    say("  %-22s failed: %s\n", name, lm_last_error());
    return 1;
  }
  say("  %-22s %5d %5d %10.3f %10.3f %7.2fx %9.1f %6d %5d %9.1e  %s\n", name, r.kernels_default, r.kernels_searched,
      1e3 * r.default_s, 1e3 * r.searched_s, r.speedup, r.search_wall_s, r.candidates, r.from_cache, r.max_rel_err,
      r.winner);
  record *rec = rec_new("search", name);
  rec_num(rec, "default_ms", 1e3 * r.default_s);
  rec_num(rec, "searched_ms", 1e3 * r.searched_s);
  rec_num(rec, "speedup", r.speedup);
  rec_num(rec, "search_wall_s", r.search_wall_s);
  rec_num(rec, "candidates", r.candidates);
  rec_num(rec, "wrong", r.wrong);
  rec_str(rec, "winner", "%s", r.winner);
  if (flops > 0 && r.default_s > 0 && r.searched_s > 0) {
    const double gd = flops / r.default_s * 1e-9, gs = flops / r.searched_s * 1e-9;
    rec_num(rec, "matmul_mflop", flops * 1e-6);
    rec_num(rec, "default_gflops", gd);
    rec_num(rec, "searched_gflops", gs);
    if (isfinite(peak) && peak > 0)
      say("  %-22s matmuls %.1f MFLOP: default %.0f GFLOP/s (%.0f%% of the FMA peak), searched %.0f (%.0f%%)\n", "",
          flops * 1e-6, gd, 100 * gd / peak, gs, 100 * gs / peak);
    else
      say("  %-22s matmuls %.1f MFLOP: default %.0f GFLOP/s, searched %.0f\n", "", flops * 1e-6, gd, gs);
  }
  return r.wrong ? 1 : 0;
}

/* ---- this CPU's FMA peak, the ceiling the search's GFLOP/s are read against */

/* Ten independent chains of a*x + y in the widest vectors the kernels' flags give (16 lanes
 * with AVX-512, else 8), contracted to FMAs: 20 FLOP a lane per iteration, no memory. Built by
 * the kernel compiler with the kernels' flags (-march=native), so it runs the instructions a
 * kernel can use. 8 lanes on an AVX-512 host read half its peak: 189 against 350 GFLOP/s on
 * two cores of a Xeon (model 207) where a 16-lane loop ran 175 GFLOP/s on each. */
static const char fma_peak_src[] =
    "#include <stdint.h>\n"
    "#if defined(__clang__)\n"
    "#pragma clang fp contract(fast)\n"
    "#elif defined(__GNUC__)\n"
    "#pragma GCC optimize(\"fp-contract=fast\")\n"
    "#endif\n"
    "#if defined(__AVX512F__)\n"
    "#define LANES 16\n"
    "#else\n"
    "#define LANES 8\n"
    "#endif\n"
    "typedef float v __attribute__((vector_size(LANES * 4)));\n"
    "int lm_fma_lanes(void) { return LANES; }\n"
    "float lm_fma_peak(int64_t n) {\n"
    "  v x, y;\n"
    "  for (int l = 0; l < LANES; l++) x[l] = 0.999999f - 1e-6f * (float)l;\n"
    "  y = x * 1e-6f;\n"
    "  v a0 = x, a1 = x + 1, a2 = x + 2, a3 = x + 3, a4 = x + 4, a5 = x + 5, a6 = x + 6, a7 = x + 7, a8 = x + 8, a9 = x + 9;\n"
    "  for (int64_t i = 0; i < n; i++) {\n"
    "    a0 = a0 * x + y; a1 = a1 * x + y; a2 = a2 * x + y; a3 = a3 * x + y; a4 = a4 * x + y;\n"
    "    a5 = a5 * x + y; a6 = a6 * x + y; a7 = a7 * x + y; a8 = a8 * x + y; a9 = a9 * x + y;\n"
    "  }\n"
    "  const v s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9;\n"
    "  float t = 0;\n"
    "  for (int l = 0; l < LANES; l++) t += s[l];\n"
    "  return t;\n"
    "}\n";
enum { FMA_PEAK_FLOP_PER_LANE = 20, FMA_PEAK_MAX_THREADS = 64 };

typedef float (*fma_peak_fn)(int64_t n);
typedef struct peak_job {
  fma_peak_fn fn;
  int64_t n;
  float out;
} peak_job;

static void *peak_thread(void *arg) {
  peak_job *j = arg;
  j->out = j->fn(j->n);
  return NULL;
}

/* GFLOP/s of `threads` threads each running n iterations at once: the best of 25 (about 0.15 s
 * in all; with 9 a slow spell of the machine once read 195 GFLOP/s on two threads for 214). */
static double peak_gflops(fma_peak_fn fn, int lanes, int64_t n, int threads) {
  double best = INFINITY;
  for (int r = 0; r < 25; r++) {
    peak_job jobs[FMA_PEAK_MAX_THREADS];
    pthread_t tid[FMA_PEAK_MAX_THREADS];
    int started = 0;
    double t0 = now_s();
    for (int k = 1; k < threads; k++) {
      jobs[k] = (peak_job){fn, n, 0};
      if (pthread_create(&tid[k], NULL, peak_thread, &jobs[k]) != 0) break;
      started++;
    }
    jobs[0] = (peak_job){fn, n, 0};
    peak_thread(&jobs[0]);
    for (int k = 1; k <= started; k++) pthread_join(tid[k], NULL);
    double t = now_s() - t0;
    if (started != threads - 1) return NAN;
    if (t < best) best = t;
  }
  return (double)FMA_PEAK_FLOP_PER_LANE * lanes * (double)n * threads / best * 1e-9;
}

/* The FMA peak on one thread and on `threads` threads, 0 on success; the kernel compiler's
 * failure is reported, not fatal (the search rows then print no percentages). */
static int fma_peak(int threads, double *one, double *all) {
  *one = *all = NAN;
  if (threads > FMA_PEAK_MAX_THREADS) threads = FMA_PEAK_MAX_THREADS;
  lm_cc *cc = NULL;
  lm_cc_lib *lib = NULL;
  fma_peak_fn fn = NULL;
  int (*lanes)(void) = NULL;
  if (lm_cc_open(&cc) == LM_OK && lm_cc_build(cc, fma_peak_src, &lib) == LM_OK) {
    fn = (fma_peak_fn)(uintptr_t)lm_cc_sym(lib, "lm_fma_peak");
    lanes = (int (*)(void))(uintptr_t)lm_cc_sym(lib, "lm_fma_lanes");
  }
  if (fn && lanes) {
    const int64_t n = 4000000; /* 640 MFLOP a thread at 8 lanes: about 6 ms at 100 GFLOP/s */
    *one = peak_gflops(fn, lanes(), n, 1);
    *all = peak_gflops(fn, lanes(), n, threads);
  } else {
    fprintf(stderr, "rlbench: FMA peak not measured (%s)\n", lm_last_error());
  }
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
  return fn && lanes ? 0 : 1;
}

/* A weight's multiply-adds per row in the update: its forward product, its gradient, and the
 * gradient into its input (but the first layer's, whose input is the observation). */
static double update_macs(const lm_policy *pol, int i) {
  return (double)pol->rows[i] * pol->cols[i] * (name_ends(pol->name[i], ".w0") ? 2 : 3);
}

/* FLOPs of the PPO minibatch update's matmuls over `rows` rows, per the policy's weight shapes;
 * 0 when the policy cannot be built. */
static double update_matmul_flops(const lm_env_spec *env, const lm_ppo_config *cfg, int64_t rows) {
  return 2 * over_weights(env, &cfg->policy, update_macs) * (double)rows;
}

/* An n^3 matmul, default vs searched. */
static int search_matmul(int64_t n, double budget, const char *device, double peak) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){n, n});
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){n, n});
  lm_output(lm_matmul(a, b), "c");
  char name[32];
  snprintf(name, sizeof name, "matmul %lld^3", (long long)n);
  int rc = search_row(name, g, NULL, NULL, 0, budget, device, 2.0 * (double)n * (double)n * (double)n, peak);
  lm_graph_free(g);
  return rc;
}

static int bench_search(const opts *o) {
  double budget = o->search_budget > 0 ? o->search_budget : o->quick ? 10 : 30;
  const char *dev = o->search_device ? o->search_device : "cpu";
  say("\n== search: default schedule vs the e-graph search's measured winner (%s backend) ==\n"
      "  ms = one run of the whole plan; search s = wall time of the search (a warm tuning cache makes it\n"
      "  ~0: rerun to see); cand = candidates timed; err = searched vs default; winner = the rules on its path.\n"
      "  budget %.0f s per graph.%s\n",
      dev, budget,
      strcmp(dev, "cpu") ? " The default is what that backend runs without a search (its work-group schedules)." : "");
  /* the plans run on the pool's threads: $LUMEN_THREADS, else every online CPU */
  const char *lt = getenv("LUMEN_THREADS");
  const int threads = lt && atoi(lt) > 0 ? atoi(lt) : online_cpus();
  double peak1 = NAN, peak = NAN;
  if (!strcmp(dev, "cpu")) {
    fma_peak(threads, &peak1, &peak);
    say("  FMA peak of this cpu (ten chains of 16-lane FMAs with AVX-512, else 8-lane, built by the kernel compiler): %.0f GFLOP/s on 1\n"
        "  thread, %.0f on %d; below each graph, its matmuls' GFLOP/s in both plans against that peak.\n",
        peak1, peak, threads);
    record *r = rec_new("search", "fma_peak");
    rec_num(r, "gflops_1_thread", peak1);
    rec_num(r, "gflops", peak);
    rec_num(r, "threads", threads);
  }
  say("  %-22s %5s %5s %10s %10s %8s %9s %6s %5s %9s  %s\n", "graph", "kern", "kern'", "default ms", "search ms",
      "speedup", "search s", "cand", "cache", "err", "winner");
  int rc = search_matmul(256, budget, o->search_device, peak);
  if (!o->quick) rc |= search_matmul(1024, budget, o->search_device, peak); /* B past L2: packing its panels pays */
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_ppo_config cfg = lm_ppo_defaults(env);
  lm_train_graph tg[4];
  if (lm_trainer_graphs(env, &cfg, tg, 4) != 4) {
    say("  training graphs: %s\n", lm_last_error());
    return 1;
  }
  { /* the PPO minibatch update */
    const char *names[] = {"N", "T", "M", "perm_a", "perm_b", "mb_off"};
    int64_t values[] = {cfg.n_envs, cfg.horizon, cfg.n_envs * cfg.horizon / cfg.minibatches, 1, 0, 0};
    rc |= search_row("ppo update (cartpole)", tg[3].g, names, values, 6, budget, o->search_device,
                     update_matmul_flops(env, &cfg, values[2]), peak);
  }
  { /* one rollout step as a plain program (the fused scan itself is not searched) */
    const char *names[] = {"N"};
    int64_t values[] = {4096};
    rc |= search_row("rollout step (4096)", tg[0].g, names, values, 1, budget, o->search_device, 0, peak);
  }
  for (int i = 0; i < 4; i++) lm_graph_free(tg[i].g);
  return rc;
}


/* ================================================================ scale: data-parallel training */

/* Training steps/s of CartPole at K = 1 (rank 0 alone, the others waiting) and at K = every rank
 * of the mpirun, with the same work per rank (N envs x T steps, the same PPO settings), and the
 * efficiency steps/s(K) / (K x steps/s(1)). Counts bound the work: one warm-up iteration, then
 * `reps` timed ones. Outside mpirun it says how to run it. */
static double train_iterations(lm_trainer *t, int iters, int *failed) {
  lm_iter_stats st;
  double t0 = now_s();
  for (int i = 0; i < iters && !*failed; i++)
    if (lm_trainer_iterate(t, &st) != LM_OK) {
      fprintf(stderr, "rlbench: scale: %s\n", lm_last_error());
      *failed = 1;
    }
  return now_s() - t0;
}

static int bench_scale(const opts *o) {
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_ppo_config c = lm_ppo_defaults(env);
  c.n_envs = o->quick ? 32 : 64;
  c.horizon = o->quick ? 64 : 128;
  c.total_steps = (int64_t)1 << 40; /* a learning rate that stays put over the timed iterations */
  int iters = o->quick ? 3 : 5;
  say("\n== scale: data-parallel PPO training steps/s, CartPole, %lld envs x %lld steps per rank, %d epochs x %d "
      "minibatches; %d timed iterations ==\n",
      (long long)c.n_envs, (long long)c.horizon, c.epochs, c.minibatches, iters);
  if (!lm_dist_launched()) {
    say("  not under mpirun: `LUMEN_THREADS=1 mpirun -np K rlbench --only scale` measures K = 1 and K\n");
    return 0;
  }
  lm_dist_t *d = lm_dist_open(900);
  if (!d) {
    fprintf(stderr, "rlbench: scale: %s\n", lm_last_error());
    return 1;
  }
  int K = lm_dist_size(d), rank = lm_dist_rank(d), failed = 0;
  char why[1024];
  lm_backend_t *b = lm_backend_open("auto", why, sizeof why);
  if (!b) {
    fprintf(stderr, "rlbench: scale: rank %d: %s\n", rank, lm_last_error());
    lm_dist_abort(d, 1);
  }
  const char *thr = getenv("LUMEN_THREADS");
  say("  %d ranks (%s) on %s; LUMEN_THREADS=%s per rank\n", K, lm_dist_library(d), lm_backend_name(b),
      thr && *thr ? thr : "(every CPU: set it to CPUs / ranks)");
  double sps1 = 0, spsK = 0, dt;
  double steps = (double)iters * (double)(c.n_envs * c.horizon);
  if (rank == 0) { /* K = 1: one process, the one-graph update */
    lm_trainer *t = lm_trainer_new(b, env, &c);
    if (!t) fprintf(stderr, "rlbench: scale: %s\n", lm_last_error()), failed = 1;
    else {
      train_iterations(t, 1, &failed);
      dt = train_iterations(t, iters, &failed);
      sps1 = steps / dt;
      lm_trainer_free(t);
    }
  }
  size_t weights = 0;
  int kernels = 0;
  double sum_us = 0;
  if (lm_dist_agree(d, !failed, "K = 1 failed") != LM_OK) failed = 1;
  if (!failed && K > 1) {
    lm_trainer *t = lm_trainer_new_dist(b, env, &c, d);
    if (!t) fprintf(stderr, "rlbench: scale: rank %d: %s\n", rank, lm_last_error()), lm_dist_abort(d, 1);
    const lm_policy *pol = lm_rollout_policy(lm_trainer_rollout(t));
    for (int i = 0; i < pol->nparams; i++) weights += lm_policy_param_size(pol, i);
    kernels = lm_trainer_kernels_per_iteration(t);
    train_iterations(t, 1, &failed);
    if (lm_dist_agree(d, !failed, "warm-up failed") != LM_OK) failed = 1; /* start the clock together */
    dt = train_iterations(t, iters, &failed);
    if (lm_dist_agree(d, !failed, "timed iterations failed") != LM_OK) failed = 1;
    double mine = dt, all[64] = {0};
    if (!failed && K <= 64 && lm_dist_allgather(d, &mine, sizeof mine, all, "times") == LM_OK)
      for (int r = 0; r < K; r++) dt = all[r] > dt ? all[r] : dt; /* the slowest rank's */
    spsK = (double)K * steps / dt;
    /* what one minibatch's exchange costs alone: the gradient vector's rank-ordered sum, 200 times */
    float *g = calloc(weights ? weights : 1, sizeof *g);
    double s0 = now_s();
    for (int i = 0; i < 200 && g && !failed; i++)
      if (lm_dist_sum_f32(d, g, weights, "gradients") != LM_OK) failed = 1;
    sum_us = (now_s() - s0) / 200 * 1e6;
    free(g);
    lm_trainer_free(t);
  }
  if (!failed) {
    say("  %-28s %14s %12s\n", "ranks", "steps/s", "efficiency");
    say("  %-28s %14.0f %12s\n", "K = 1 (one process)", sps1, "1.00");
    record *r = rec_new("scale", "K=1");
    rec_num(r, "ranks", 1);
    rec_num(r, "steps_per_s", sps1);
    if (K > 1) {
      char name[64];
      snprintf(name, sizeof name, "K = %d (data-parallel)", K);
      double eff = spsK / ((double)K * sps1);
      say("  %-28s %14.0f %12.2f\n", name, spsK, eff);
      say("  gradients crossing ranks: %zu floats (%zu bytes) per minibatch from every rank, %d minibatches an "
          "iteration; %d kernels per iteration per rank\n",
          weights, weights * sizeof(float), c.epochs * c.minibatches, kernels);
      say("  one exchange and rank-ordered sum of them alone: %.1f us (mean of 200)\n", sum_us);
      r = rec_new("scale", "K");
      rec_num(r, "ranks", K);
      rec_num(r, "steps_per_s", spsK);
      rec_num(r, "efficiency", eff);
      rec_num(r, "gradient_bytes", (double)(weights * sizeof(float)));
      rec_num(r, "exchange_us", sum_us);
    }
  }
  lm_backend_free(b);
  lm_dist_close(d);
  return failed;
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
    {"envs", "env-only steps/s of every env: compiled graph (1 and all threads) vs reference stepper vs hand SoA C",
     bench_envs},
    {"rollout", "env + policy steps/s (rollout only): device stepper vs host stepper", bench_rollout},
    {"train", "env + policy + PPO steps/s and time-to-solve CartPole: device vs host stepper", bench_train},
    {"busy", "PPO training beside a spinning process per CPU: default threads vs 1 (issue 24: at most 1.5x)",
     bench_busy},
    {"search", "default schedule vs e-graph search winners: 256^3 matmul, PPO update, rollout step", bench_search},
    {"scale", "data-parallel PPO under mpirun: training steps/s at K = 1 and K ranks, same work per rank; efficiency",
     bench_scale},
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
        "  --quick              shorter: no 1024^3 matmul; envs 64 steps per call, rollout cartpole only\n"
        "                       and T=32, 3 training iterations timed\n"
        "  --reps K             timed repetitions per measurement (default 7, 1..1000)\n"
        "  --n N                elements of the elementwise chain on cpu (default 4194304 = 1<<22)\n"
        "  --ref-n N            elements of the chain on the ref interpreter (default 65536)\n"
        "  --threads T[,T]      cpu thread counts to measure, each a number or 'all' (the pool's\n"
        "                       default: $LUMEN_THREADS, else every online CPU); default: all\n"
        "  --envs N             envs of the envs and rollout benchmarks (default 4096)\n"
        "  --env-steps T        steps per call of the envs benchmark (default 256; --quick 64)\n"
        "  --horizon T          steps per rollout of the rollout benchmark (default 128; --quick 32)\n"
        "  --env-list LIST      envs of the envs benchmark (default: every env)\n"
        "  --env-params P       parameters of every env in --env-list, as rltrain's --env takes them\n"
        "                       (key=value,...: e.g. sticky=0,actions=minimal,time_limit=1000)\n"
        "  --rollout-envs LIST  envs of the rollout benchmark (default cartpole,acrobot,pendulum;\n"
        "                       --quick cartpole)\n"
        "  --solve-budget S     env-step budget of time-to-solve (default: lm_ppo_defaults' total_steps)\n"
        "  --seeds K            time-to-solve runs per stepper, seeds 1..K (default 1, at most 16)\n"
        "  --search-budget S    seconds of schedule search per cpu program (0 = the default schedule);\n"
        "                       the 'search' benchmark compares the two side by side, S per graph\n"
        "                       (default 30, --quick 10)\n"
        "  --search-device D    the 'search' benchmark on cpu (default), opencl or cuda: both plans\n"
        "                       run there and the search times its candidates there\n"
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
      int64_t t = 0;
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
  fprintf(f, "], \"envs\": %lld, \"env_steps\": %lld, \"horizon\": %lld, \"rollout_envs\": ", (long long)o->envs,
          (long long)o->env_steps, (long long)o->horizon);
  json_string(f, o->rollout_envs);
  fprintf(f, ", \"solve_budget\": %lld, \"seeds\": %d", (long long)o->solve_budget, o->seeds);
  fprintf(f, ", \"benchmarks\": [");
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
  opts o = {.n = (int64_t)1 << 22, .ref_n = (int64_t)1 << 16, .reps = 7, .nthreads = 1, .envs = 4096, .seeds = 1};
  int64_t env_steps = 0, horizon = 0; /* 0: by --quick */
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
                      !strcmp(name, "--ref-n") || !strcmp(name, "--threads") || !strcmp(name, "--json") ||
                      !strcmp(name, "--envs") || !strcmp(name, "--env-steps") || !strcmp(name, "--horizon") ||
                      !strcmp(name, "--rollout-envs") || !strcmp(name, "--env-list") || !strcmp(name, "--env-params") || !strcmp(name, "--solve-budget") || !strcmp(name, "--seeds") ||
                      !strcmp(name, "--search-budget") || !strcmp(name, "--search-device");
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
      o.threads_given = 1;
    } else if (!strcmp(name, "--envs")) {
      if (parse_int(name, val, 1, (int64_t)1 << 24, &v)) return EXIT_USAGE;
      o.envs = v;
    } else if (!strcmp(name, "--env-steps")) {
      if (parse_int(name, val, 1, 1 << 20, &v)) return EXIT_USAGE;
      env_steps = v;
    } else if (!strcmp(name, "--horizon")) {
      if (parse_int(name, val, 1, 1 << 16, &v)) return EXIT_USAGE;
      horizon = v;
    } else if (!strcmp(name, "--rollout-envs")) {
      const lm_env_spec *specs[16];
      int ne;
      if (env_list(val, specs, 16, &ne)) {
        char known[512] = "";
        for (int j = 0; j < lm_env_count(); j++)
          snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", lm_env_at(j)->name);
        return usage_error("--rollout-envs wants a comma-separated list of env names (known: %s), got '%s'", known,
                           val);
      }
      o.rollout_envs = val;
    } else if (!strcmp(name, "--env-list")) {
      const lm_env_spec *specs[64];
      int ne;
      if (env_list(val, specs, 64, &ne)) {
        char known[512] = "";
        for (int j = 0; j < lm_env_count(); j++)
          snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", lm_env_at(j)->name);
        return usage_error("--env-list wants a comma-separated list of env names (known: %s), got '%s'", known, val);
      }
      o.env_list = val;
    } else if (!strcmp(name, "--env-params")) {
      if (!*val) return usage_error("--env-params needs key=value pairs");
      o.env_params = val;
    } else if (!strcmp(name, "--solve-budget")) {
      if (parse_int(name, val, 1, (int64_t)1 << 40, &v)) return EXIT_USAGE;
      o.solve_budget = v;
    } else if (!strcmp(name, "--seeds")) {
      if (parse_int(name, val, 1, 16, &v)) return EXIT_USAGE;
      o.seeds = (int)v;
    } else if (!strcmp(name, "--search-budget")) {
      if (parse_int(name, val, 0, 86400, &v)) return EXIT_USAGE;
      setenv("LUMEN_SEARCH_BUDGET", val, 1); /* every cpu program compiled from here on searches */
      o.search_budget = (int)v;
    } else if (!strcmp(name, "--search-device")) {
      if (strcmp(val, "cpu") && strcmp(val, "opencl") && strcmp(val, "cuda"))
        return usage_error("--search-device: '%s' is not cpu, opencl or cuda", val);
      o.search_device = val;
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
  if (o.env_params) { /* every listed env must take them: nothing is skipped silently */
    if (!o.env_list) return usage_error("--env-params sets the parameters of the envs in --env-list: give --env-list");
    const lm_env_spec *specs[64];
    int ne;
    env_list(o.env_list, specs, 64, &ne); /* checked when parsed */
    for (int j = 0; j < ne; j++) {
      const lm_env_spec *c;
      if (lm_env_configure(specs[j], o.env_params, &c) != LM_OK)
        return usage_error("--env-params %s: %s: %s", o.env_params, specs[j]->name, lm_last_error());
    }
  }
  o.env_steps = env_steps ? env_steps : o.quick ? 64 : 256;
  o.horizon = horizon ? horizon : o.quick ? 32 : 128;
  if (!o.rollout_envs) o.rollout_envs = o.quick ? "cartpole" : "cartpole,acrobot,pendulum";
  if (o.json && !strcmp(o.json, "-")) table_out = stderr;
  const char *mpi_rank = getenv("OMPI_COMM_WORLD_RANK");
  if (!mpi_rank) mpi_rank = getenv("PMIX_RANK");
  if (!mpi_rank) mpi_rank = getenv("PMI_RANK");
  if (mpi_rank && strcmp(mpi_rank, "0")) { /* under mpirun, rank 0 speaks for the run */
    table_out = fopen("/dev/null", "w");
    o.json = NULL;
  }
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
  for (size_t i = 0; i < NBENCHES; i++) {
    if (!selected[i]) continue;
    double l0 = loadavg1(), t0 = now_s();
    if (benches[i].run(&o)) rc = 1;
    double l1 = loadavg1(), dt = now_s() - t0;
    /* other jobs share this machine: the load average says how much */
    say("  (%s: %.1f s; 1-min load average %.2f before, %.2f after, on %d CPUs)\n", benches[i].name, dt, l0, l1,
        online_cpus());
    record *r = rec_new(benches[i].name, "run");
    rec_num(r, "wall_s", dt);
    rec_num(r, "loadavg1_before", l0);
    rec_num(r, "loadavg1_after", l1);
  }
  if (o.json && write_json(&o, selected, model)) rc = 1;
  free(saved_threads_env);
  free(records);
  if (rc) fputs("rlbench: some benchmarks failed (see above)\n", stderr);
  return rc;
}
