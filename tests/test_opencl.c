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
 * - work-group schedules (compiler/gpu.c): matmuls in shared-memory tiles and a matvec scan with
 *   its weights staged in shared memory, bit for bit against ref and against the plain
 *   one-thread-per-point mapping (LUMEN_GPU_SCHEDULE=0), for sizes that fill no tile, cut tiles
 *   and fill many, with the device source checked for shared arrays and barriers; tree
 *   reductions: row sums and maxima of 1 to 5000 terms (max bit for bit, sums within n eps);
 * - opencl only: LUMEN_OPENCL_DEVICE, build errors (log + source + a file keeping both), the
 *   `rltrain compile --target opencl` path for CartPole, and "auto" never picking opencl.
 *
 * Tolerances: as in test_cpu.c, |device - ref| <= 2e-5 |ref| + 1e-5 S for values downstream of
 * sin/exp2/log2 and of sums over symbolic or 512+ terms (the device adds those in a tree; S
 * bounds their magnitude); everything else (+, *, 1/x and sqrt correctly rounded, fmod, <, max,
 * shorter sums, RAND) must match bit for bit: OpenCL is built with
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
#include "lumen/search.h"
#include "passes.h"
#include "support/check.h"
#include "support/randgraph.h"
#include "support/timeout.h"

#ifndef DEVICE
#define DEVICE "opencl"     /* the backend under test */
#define DEVICE_TEXT "OpenCL" /* in skip messages */
#define DEVICE_SRC_EXT ".cl" /* LUMEN_DUMP files of the backend */
#define DEVICE_IS_OPENCL 1
#define DEVICE_SHARED "__local"                     /* a shared array in the device source */
#define DEVICE_BARRIER "barrier(CLK_LOCAL_MEM_FENCE)" /* a work-group barrier */
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

/* ================================================================ the device against ref */

/* One program of RG_NSUB random graphs, on the device and on ref, under every binding (the first
 * one twice, so the assigned state feeds a second run), everything compared. */
static void property_program(lm_backend_t *dev, lm_backend_t *ref, uint64_t seed, const char *dump_dir, char *seen,
                             size_t seen_cap) {
  rg_gen *G = calloc(1, sizeof *G);
  cr_assert(G);
  rg_program(G, seed);
  lm_program_t *pd = lm_program_new(dev, G->g), *pr = lm_program_new(ref, G->g);
  char source[1024];
  new_source(dump_dir, seen, seen_cap, source, sizeof source);
  if (!pd || !pr) rg_fail(G, 0, source, "seed %#llx: lm_program_new: %s", (unsigned long long)seed, lm_last_error());
  rg_run_against_ref(G, pd, pr, DEVICE, seed, RTOL, ATOL, source);
  lm_program_free(pd);
  lm_program_free(pr);
  lm_graph_free(G->g);
  free(G);
}

/* PROGRAMS programs of RG_NSUB random graphs each per part (seeds differ from test_cpu.c's). */
enum { PROGRAMS = 2 };

static void property_part(int part) {
  lm_backend_t *dev = open_device(), *ref = open_ref();
  rg_sums_reordered = 1; /* work-group tree reductions (compiler/gpu.c) */
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

Test(device_vs_ref, random_graphs_part_1_of_2, .timeout = LM_TIMEOUT(240)) { property_part(0); }
Test(device_vs_ref, random_graphs_part_2_of_2, .timeout = LM_TIMEOUT(240)) { property_part(1); }

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

/* ================================================================ search on the device */

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  static char buf[1 << 22];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static size_t count_of(const char *text, const char *what) {
  size_t n = 0;
  for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
  return n;
}

/* y = A B + C (96x64 times 64x64) and r = row sums of X (8 x 1000): with LUMEN_SEARCH_BUDGET the
 * program's preparation searches both kernels, timing every candidate on the device (the
 * emitted kernel and, where they apply, its work-group schedules: tiles, trees); the result
 * matches ref; a second program of the same graph takes every decision from the tuning cache. */
Test(device_search, candidates_are_timed_on_the_device_and_a_warm_cache_searches_nothing, .timeout = LM_TIMEOUT(240)) {
  char dir[] = "/tmp/lumen-dsearch-XXXXXX";
  cr_assert(mkdtemp(dir));
  char log[1200];
  snprintf(log, sizeof log, "%s/search.log", dir);
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){96, 64});
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){64, 64});
  lm_tensor c = lm_input(g, "c", LM_ROLE_DATA, 2, (lm_dim[]){96, 64});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){8, 1000});
  OK(lm_output(lm_add(lm_matmul(a, b), c), "y"));
  OK(lm_output(lm_sum_reduce(x, 1), "r"));
  lm_backend_t *dev = open_device(), *ref = open_ref();
  setenv("LUMEN_SEARCH_BUDGET", "90", 1);     /* a ceiling (the OpenCL compiler may be slow, its cache */
  setenv("LUMEN_SEARCH_GENERATIONS", "0", 1); /* cold): generation 0 alone, every candidate timed */
  setenv("LUMEN_SEARCH_LOG", log, 1);
  setenv("LUMEN_CACHE_DIR", dir, 1);
  lm_program_t *p = lm_program_new(dev, g);
  cr_assert(p, "%s", lm_last_error());
  lm_program_t *want = lm_program_new(ref, g);
  cr_assert(want, "%s", lm_last_error());
  const char *text = slurp(log);
  cr_assert(text, "no search log at %s", log);
  cr_assert(strstr(text, "device " DEVICE "|"), "the search did not time on " DEVICE ":\n%.3000s", text);
  /* checked and timed: "ok" or "slow" (slow: over 3x the best so far, which depends on how busy the
   * machine is, so the count takes both) */
  cr_assert(count_of(text, " ok ") + count_of(text, " slow ") >= 4,
            "fewer than 4 candidates were checked and timed on the device:\n%.4000s", text);
  cr_assert(strstr(text, "  winner"), "no winner named by the device search:\n%.4000s", text);
  cr_assert(strstr(text, "+gpu"), "no candidate under a work-group schedule:\n%.4000s", text);
  /* the group rule: a candidate mapping a loop to a work-group's threads, checked and timed (ok,
   * or slow: on PoCL, work-groups run their threads one after another) */
  int grouped = 0;
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    const char *e = strchr(l, '\n'), *gr = strstr(l, "group");
    const char *ok = strstr(l, " ok "), *slow = strstr(l, " slow ");
    if (gr && (!e || gr < e) && ((ok && (!e || ok < e)) || (slow && (!e || slow < e)))) grouped++;
  }
  cr_assert(grouped >= 1, "no candidate made by the group rule was checked and timed:\n%.6000s", text);
  cr_assert(strstr(text, " 0 wrong"), "a candidate disagreed with the reference:\n%.4000s", text);
  check_rng r = check_rng_new(11);
  float *va = rand_floats(&r, 96 * 64, -1, 1), *vb = rand_floats(&r, 64 * 64, -1, 1),
        *vc = rand_floats(&r, 96 * 64, -1, 1), *vx = rand_floats(&r, 8 * 1000, -1, 1);
  lm_program_t *ps[2] = {p, want};
  float *y[2], *rs[2];
  for (int i = 0; i < 2; i++) {
    put(ps[i], "a", va, 96 * 64);
    put(ps[i], "b", vb, 64 * 64);
    put(ps[i], "c", vc, 96 * 64);
    put(ps[i], "x", vx, 8 * 1000);
    OK(lm_program_run(ps[i]));
    y[i] = get(ps[i], "y", 96 * 64);
    rs[i] = get(ps[i], "r", 8);
  }
  /* searched candidates may sum in another order (split-K, trees): within n eps of ref */
  for (size_t i = 0; i < 96 * 64; i++)
    cr_assert(fabsf(y[0][i] - y[1][i]) <= 64 * 1.2e-7f * 64, "y[%zu] = %.9g, ref %.9g", i, (double)y[0][i],
              (double)y[1][i]);
  for (size_t i = 0; i < 8; i++)
    cr_assert(fabsf(rs[0][i] - rs[1][i]) <= 1000 * 1.2e-7f * 1000, "r[%zu] = %.9g, ref %.9g", i, (double)rs[0][i],
              (double)rs[1][i]);
  for (int i = 0; i < 2; i++) free(y[i]), free(rs[i]);
  /* the same graph again: every kernel from the cache, nothing timed */
  size_t before = strlen(text);
  lm_program_t *again = lm_program_new(dev, g);
  cr_assert(again, "%s", lm_last_error());
  text = slurp(log);
  const char *tail = text + before;
  cr_assert(strstr(tail, " 0 candidates timed") && !strstr(tail, "cand 0 "),
            "the second search timed candidates despite the cache:\n%.3000s", tail);
  unsetenv("LUMEN_SEARCH_BUDGET");
  unsetenv("LUMEN_SEARCH_GENERATIONS");
  unsetenv("LUMEN_SEARCH_LOG");
  unsetenv("LUMEN_CACHE_DIR");
  free(va), free(vb), free(vc), free(vx);
  lm_program_free(again);
  lm_program_free(p);
  lm_program_free(want);
  lm_backend_free(dev);
  lm_backend_free(ref);
  lm_graph_free(g);
  remove_tree(dir);
}

static double frozen_clock(void *ctx) {
  (void)ctx;
  return 0;
}

/* rlbench's search benchmark on the device (lm_search_bench with o.backend): the default plan is
 * what the backend runs without a search, the searched plan what the search made of it; both
 * run there on the same inputs and agree. */
Test(device_search, the_search_bench_runs_both_plans_on_the_device, .timeout = LM_TIMEOUT(240)) {
  lm_backend_free(open_device());
  char dir[] = "/tmp/lumen-dbench-XXXXXX";
  cr_assert(mkdtemp(dir));
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){64, 48});
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){48, 64});
  OK(lm_output(lm_exp2(lm_mul_scalar(lm_matmul(a, b), 0.1f)), "y"));
  lm_search_options o;
  lm_search_options_init(&o);
  o.budget_s = 1;
  o.clock = frozen_clock; /* bounded by counts: generation 0 only, every candidate timed */
  o.generations = 0;
  o.cache_dir = dir;
  o.use_cache = 0;
  o.backend = DEVICE;
  lm_search_bench_result r;
  OK(lm_search_bench(g, NULL, NULL, 0, &o, &r));
  cr_log_info("on " DEVICE ": default %.3f ms, searched %.3f ms (%.2fx), %d candidates, error %.2g", 1e3 * r.default_s,
              1e3 * r.searched_s, r.speedup, r.candidates, r.max_rel_err);
  cr_assert(r.default_s > 0 && r.searched_s > 0 && r.speedup > 0);
  cr_assert_geq(r.candidates, 4);
  cr_assert_eq(r.wrong, 0);
  cr_assert_leq(r.max_rel_err, 1e-3, "the searched plan differs from the default by %g", r.max_rel_err);
  lm_search_options bad = o;
  bad.backend = "no-such-backend";
  cr_assert_neq(lm_search_bench(g, NULL, NULL, 0, &bad, &r), LM_OK);
  cr_assert(strstr(lm_last_error(), "no-such-backend"), "the error does not name the backend: %s", lm_last_error());
  lm_graph_free(g);
  remove_tree(dir);
}

#ifdef DEVICE_IS_OPENCL
/* ================================================================ work-group schedules */

/* How many of the dumped device sources of the current dump dir contain `what`. */
static int dumped_with(const char *dir, const char *what) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name), ext = strlen(DEVICE_SRC_EXT);
    if (len <= ext || strcmp(e->d_name + len - ext, DEVICE_SRC_EXT)) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    const char *text = slurp(path);
    if (text && strstr(text, what)) n++;
  }
  closedir(d);
  return n;
}

/* y = A B with every dimension symbolic: M x K times K x N. */
static lm_graph_t *matmul_graph(void) {
  lm_graph_t *g = lm_graph_new();
  lm_dim M = lm_sym(g, "M"), K = lm_sym(g, "K"), N = lm_sym(g, "N");
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 2, (lm_dim[]){M, K});
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){K, N});
  lm_tensor c = lm_input(g, "c", LM_ROLE_DATA, 2, (lm_dim[]){M, N});
  OK(lm_output(lm_add(lm_matmul(a, b), c), "y"));
  return g;
}

/* The matmul on the device with work-group schedules on or off, and on ref: every size compared
 * bit for bit (each element sums its k terms in order: the tiles change no rounding). */
Test(device_gpu_schedule, matmul_tiles_match_ref_and_the_plain_mapping_bit_for_bit, .timeout = LM_TIMEOUT(120)) {
  static const int64_t sizes[][3] = {{1, 1, 1}, {5, 3, 7}, {16, 16, 16}, {33, 20, 17}, {64, 64, 64}, {70, 37, 100}, {2, 200, 3}};
  char dir[] = "/tmp/lumen-gpu-XXXXXX";
  cr_assert(mkdtemp(dir));
  lm_graph_t *g = matmul_graph();
  lm_backend_t *dev = open_device(), *ref = open_ref();
  setenv("LUMEN_DUMP", dir, 1);
  lm_program_t *tiled = lm_program_new(dev, g);
  unsetenv("LUMEN_DUMP");
  setenv("LUMEN_GPU_SCHEDULE", "0", 1);
  lm_program_t *plain = lm_program_new(dev, g);
  unsetenv("LUMEN_GPU_SCHEDULE");
  lm_program_t *want = lm_program_new(ref, g);
  cr_assert(tiled && plain && want, "%s", lm_last_error());
  cr_assert(dumped_with(dir, DEVICE_SHARED) >= 1 && dumped_with(dir, DEVICE_BARRIER) >= 1,
            "the matmul's device source has no shared tiles and barriers (dumped in %s)", dir);
  remove_tree(dir);
  lm_program_t *ps[3] = {tiled, plain, want};
  check_rng r = check_rng_new(7);
  for (size_t c = 0; c < CHECK_COUNT(sizes); c++) {
    int64_t M = sizes[c][0], K = sizes[c][1], N = sizes[c][2];
    float *a = rand_floats(&r, (size_t)(M * K), -1, 1), *b = rand_floats(&r, (size_t)(K * N), -1, 1),
          *cc = rand_floats(&r, (size_t)(M * N), -1, 1), *y[3];
    for (int i = 0; i < 3; i++) {
      OK(lm_program_bind(ps[i], "M", M));
      OK(lm_program_bind(ps[i], "K", K));
      OK(lm_program_bind(ps[i], "N", N));
      put(ps[i], "a", a, (size_t)(M * K));
      put(ps[i], "b", b, (size_t)(K * N));
      put(ps[i], "c", cc, (size_t)(M * N));
      OK(lm_program_run(ps[i]));
      y[i] = get(ps[i], "y", (size_t)(M * N));
    }
    char what[96];
    snprintf(what, sizeof what, "%lldx%lld times %lldx%lld, tiled vs ref", (long long)M, (long long)K, (long long)K,
             (long long)N);
    expect_bits(what, y[0], y[2], (size_t)(M * N));
    snprintf(what, sizeof what, "%lldx%lld times %lldx%lld, plain vs ref", (long long)M, (long long)K, (long long)K,
             (long long)N);
    expect_bits(what, y[1], y[2], (size_t)(M * N));
    for (int i = 0; i < 3; i++) free(y[i]);
    free(a);
    free(b);
    free(cc);
  }
  for (int i = 0; i < 3; i++) lm_program_free(ps[i]);
  lm_backend_free(dev);
  lm_backend_free(ref);
  lm_graph_free(g);
}

/* step: h' = W h + x_t per env (h [N, 24] state, W [24, 24] a parameter every env reads in the
 * time loop: staged in shared memory once per work-group); y_t = h'. */
Test(device_gpu_schedule, a_matvec_scan_with_staged_weights_is_one_kernel_and_matches_ref_bit_for_bit, .timeout = LM_TIMEOUT(120)) {
  char dir[] = "/tmp/lumen-gpu-XXXXXX";
  cr_assert(mkdtemp(dir));
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 2, (lm_dim[]){N, 24});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 24});
  lm_tensor w = lm_input(g, "W", LM_ROLE_PARAM, 2, (lm_dim[]){24, 24});
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_matmul(h, lm_transpose(w, 0, 1)), 0.25f), x);
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  scan_case sc = {"staged matvec", g, 0, {"x"}, 1, {"h"}, 1, {"y"}, 1};
  setenv("LUMEN_DUMP", dir, 1);
  int k = run_scan_case(&sc, scan_sizes, CHECK_COUNT(scan_sizes), 2, 3);
  unsetenv("LUMEN_DUMP");
  cr_assert_eq(k, 1, "the staged scan took %d kernels per run", k);
  cr_assert(dumped_with(dir, DEVICE_SHARED) >= 1 && dumped_with(dir, DEVICE_BARRIER) >= 1,
            "the scan's device source stages nothing in shared memory (dumped in %s)", dir);
  remove_tree(dir);
}

/* y[i] = sum_k x[i, k] and z[i] = max_k x[i, k] + y[i] over a symbolic row length K: a tree of
 * barriers per row on the device. The max is exact in any order (bit for bit); the sum is
 * compared within K eps sum |x| (a different order of additions). */
Test(device_gpu_schedule, tree_reductions_of_long_rows_match_ref, .timeout = LM_TIMEOUT(120)) {
  static const int64_t ks[] = {1, 255, 256, 257, 5000};
  char dir[] = "/tmp/lumen-gpu-XXXXXX";
  cr_assert(mkdtemp(dir));
  lm_graph_t *g = lm_graph_new();
  lm_dim K = lm_sym(g, "K");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){3, K});
  lm_tensor y = lm_sum_reduce(x, 1);
  OK(lm_output(y, "y"));
  OK(lm_output(lm_max_reduce(x, 1), "z"));
  lm_backend_t *dev = open_device(), *ref = open_ref();
  setenv("LUMEN_DUMP", dir, 1);
  lm_program_t *pd = lm_program_new(dev, g);
  unsetenv("LUMEN_DUMP");
  lm_program_t *pr = lm_program_new(ref, g);
  cr_assert(pd && pr, "%s", lm_last_error());
  cr_assert(dumped_with(dir, DEVICE_BARRIER) >= 1, "no tree reduction in the device source (dumped in %s)", dir);
  remove_tree(dir);
  check_rng r = check_rng_new(11);
  for (size_t c = 0; c < CHECK_COUNT(ks); c++) {
    size_t n = (size_t)(3 * ks[c]);
    float *xs = rand_floats(&r, n, -1, 1);
    lm_program_t *ps[2] = {pd, pr};
    float *got[2][2];
    for (int i = 0; i < 2; i++) {
      OK(lm_program_bind(ps[i], "K", ks[c]));
      put(ps[i], "x", xs, n);
      OK(lm_program_run(ps[i]));
      got[i][0] = get(ps[i], "y", 3);
      got[i][1] = get(ps[i], "z", 3);
    }
    char what[64];
    snprintf(what, sizeof what, "row max of %lld", (long long)ks[c]);
    expect_bits(what, got[0][1], got[1][1], 3);
    for (int row = 0; row < 3; row++) {
      double abs_sum = 0;
      for (int64_t k = 0; k < ks[c]; k++) abs_sum += fabs((double)xs[row * ks[c] + k]);
      double tol = (double)ks[c] * 0x1p-23 * abs_sum + 1e-30;
      cr_assert(fabs((double)got[0][0][row] - (double)got[1][0][row]) <= tol,
                "row sum of %lld, row %d: device %.9g, ref %.9g (tolerance %.3g)", (long long)ks[c], row,
                (double)got[0][0][row], (double)got[1][0][row], tol);
    }
    for (int i = 0; i < 2; i++) free(got[i][0]), free(got[i][1]);
    free(xs);
  }
  lm_program_free(pd);
  lm_program_free(pr);
  lm_backend_free(dev);
  lm_backend_free(ref);
  lm_graph_free(g);
}

/* ================================================================ opencl only */

#include "nvrtc.h" /* lm_opencl_build_check */
#include "../train/iteration.h" /* lm_compile_iteration */

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

Test(opencl, rltrain_compile_target_opencl_builds_every_kernel_of_a_cartpole_iteration, .timeout = LM_TIMEOUT(120)) {
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
