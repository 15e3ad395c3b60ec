/* Tests for the cpu backend (compiler/backends/cpu.c) against the ref interpreter, the oracle:
 * - a property test over 320 random graphs (fixed seeds) built from every primitive, numpy
 *   broadcasting, every view kind and their compositions, reductions over random axes (also
 *   feeding reductions and broadcasts back), shared subexpressions, CONTIGUOUS, RAND, symbolic
 *   dimensions N and M (each program runs under several bindings without recompiling), outputs
 *   that are views and assigns to state. Compiling is the slow part (the system C compiler runs
 *   once per program), so 20 independent random graphs are packed into one lm_graph as disjoint
 *   subgraphs, each with its own inputs, outputs and state;
 * - determinism: 1, 2 and 3 threads give bitwise equal results (a vectorised 1-loop kernel with N
 *   not a multiple of 64, a 2-D kernel, reductions);
 * - LUMEN_DUMP=dir writes the generated source with the loop IR;
 * - without a working C compiler, "cpu" fails naming the compiler and "auto" falls back to "ref".
 *
 * Tolerance: |cpu - ref| <= 2e-5 |ref| + 1e-5 S, where S >= 1 is the largest magnitude any
 * value computed by sin, exp2 or log2 can reach on the way to that output (tracked by interval
 * arithmetic while the graph is built). The cpu build vectorises sin/exp2/log2 with libmvec, whose
 * results differ from scalar libm by a few ulp; everything else (+, *, 1/x, sqrt, fmod, <, max,
 * RAND, and sums, which are sequential on both backends) rounds identically, so values that no
 * transcendental reaches ("exact" values) must match bit for bit — the generator only feeds
 * exact values to the discontinuous MOD and LESS_THAN, and keeps log2, sqrt and 1/x on inputs
 * provably away from zero. Outputs are NaN-poisoned before every read, so a value the backend
 * never wrote fails; ref itself must produce only finite values. */
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

#include "backends/backend.h"
#include "compile.h"
#include "graph-impl.h"
#include "loopir.h"
#include "lumen/lumen.h"
#include "passes.h"
#include "support/check.h"
#include "support/randgraph.h"
#include "support/timeout.h"

#define RTOL 2e-5
#define ATOL 1e-5

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

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

/* The .c file in dir that is not in `seen` (a '\n'-separated list, updated); "" if none. */
static void new_source(const char *dir, char *seen, size_t cap, char *path, size_t pcap) {
  path[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 3 || strcmp(e->d_name + len - 2, ".c")) continue;
    char key[300];
    snprintf(key, sizeof key, "%s\n", e->d_name);
    if (strstr(seen, key)) continue;
    snprintf(path, pcap, "%s/%s", dir, e->d_name);
    if (strlen(seen) + strlen(key) < cap) strcat(seen, key);
  }
  closedir(d);
}

/* ================================================================ running both backends */

typedef struct pair {
  lm_backend_t *cpu, *ref;
} pair;

/* Builds program `index` of a part, runs it on cpu and ref under every binding (the first one
 * twice, so the assigned state feeds a second run) and compares everything. */
static void property_program(pair *B, uint64_t seed, const char *dump_dir, char *seen, size_t seen_cap) {
  rg_gen *G = calloc(1, sizeof *G);
  cr_assert(G);
  rg_program(G, seed);
  lm_program_t *pc = lm_program_new(B->cpu, G->g), *pr = lm_program_new(B->ref, G->g);
  char source[1024];
  new_source(dump_dir, seen, seen_cap, source, sizeof source);
  if (!pc || !pr) rg_fail(G, 0, source, "seed %#llx: lm_program_new: %s", (unsigned long long)seed, lm_last_error());
  rg_run_against_ref(G, pc, pr, "cpu", seed, RTOL, ATOL, source);
  lm_program_free(pc);
  lm_program_free(pr);
  lm_graph_free(G->g);
  free(G);
}

/* Part `part` of the property test: PROGRAMS programs of RG_NSUB random graphs each. */
enum { PARTS = 4, PROGRAMS = 4 };

static void property_part(int part) {
  char dir[] = "/tmp/lumen-test-cpu-XXXXXX";
  cr_assert(mkdtemp(dir));
  setenv("LUMEN_DUMP", dir, 1);
  pair B = {lm_backend_new("cpu"), lm_backend_new("ref")};
  cr_assert(B.cpu && B.ref, "backends: %s", lm_last_error());
  char *seen = calloc(1, 1 << 16);
  cr_assert(seen);
  for (int i = 0; i < PROGRAMS; i++)
    property_program(&B, 0x9e3779b97f4a7c15ull * (uint64_t)(part * PROGRAMS + i + 1), dir, seen, 1 << 16);
  free(seen);
  lm_backend_free(B.cpu);
  lm_backend_free(B.ref);
  unsetenv("LUMEN_DUMP");
  remove_tree(dir); /* kept when a check failed: the report names the source in it */
}

Test(cpu_vs_ref, random_graphs_part_1_of_4, .timeout = LM_TIMEOUT(240)) { property_part(0); }
Test(cpu_vs_ref, random_graphs_part_2_of_4, .timeout = LM_TIMEOUT(240)) { property_part(1); }
Test(cpu_vs_ref, random_graphs_part_3_of_4, .timeout = LM_TIMEOUT(240)) { property_part(2); }
Test(cpu_vs_ref, random_graphs_part_4_of_4, .timeout = LM_TIMEOUT(240)) { property_part(3); }

/* ================================================================ determinism over threads */

static lm_backend_t *cpu_with_threads(const char *n) {
  setenv("LUMEN_THREADS", n, 1);
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "cpu with LUMEN_THREADS=%s: %s", n, lm_last_error());
  return b;
}

Test(cpu_threads, one_two_and_three_threads_give_bitwise_equal_results, .timeout = LM_TIMEOUT(120)) {
  /* sizes where the pool splits every kernel: a vectorised 1-loop kernel (N1 = 100003, not a
   * multiple of 64), a 2-D kernel [N2, 7] and reductions over a row and over a column */
  lm_graph_t *g = lm_graph_new();
  lm_dim n1 = lm_sym(g, "N1"), n2 = lm_sym(g, "N2"), n3 = lm_sym(g, "N3");
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 1, (lm_dim[]){n1});
  OK(lm_output(lm_add(lm_exp2(lm_sin(a)), lm_log2(lm_add_scalar(lm_mul(a, a), 0.5f))), "one_loop"));
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 2, (lm_dim[]){n2, 7});
  lm_tensor c = lm_input(g, "c", LM_ROLE_DATA, 1, (lm_dim[]){7});
  OK(lm_output(lm_mul(lm_sin(b), lm_exp2(lm_pad(lm_slice(c, 0, 1, 7), 0, 1, 0))), "two_d"));
  lm_tensor d = lm_input(g, "d", LM_ROLE_DATA, 2, (lm_dim[]){n3, 33});
  OK(lm_output(lm_sum_reduce(lm_sin(d), 1), "row_sum"));
  OK(lm_output(lm_max_reduce(lm_exp2(lm_transpose(d, 0, 1)), 0), "column_max"));
  /* 67 rows of sum_k exp2(e[n,k] w[k,j]): a 64 x 64 nest under each row, never unrolled away,
   * so the rows are cut apart one by one (not in blocks of 64) */
  lm_tensor en = lm_input(g, "e", LM_ROLE_DATA, 2, (lm_dim[]){67, 64});
  lm_tensor wn = lm_input(g, "w", LM_ROLE_DATA, 2, (lm_dim[]){64, 64});
  OK(lm_output(lm_sum_reduce(lm_exp2(lm_mul(lm_expand(en, 2, 64), lm_expand(wn, 0, 67))), 1), "row_nest"));
  static const char *const outs[] = {"one_loop", "two_d", "row_sum", "column_max", "row_nest"};
  static const char *const ins[] = {"a", "b", "c", "d", "e", "w"};
  static const char *const threads[] = {"1", "2", "3"};
  lm_backend_t *be[4];
  lm_program_t *p[4];
  for (int i = 0; i < 4; i++) {
    be[i] = i < 3 ? cpu_with_threads(threads[i]) : lm_backend_new("ref");
    cr_assert(be[i]);
    p[i] = lm_program_new(be[i], g);
    cr_assert(p[i], "%s", lm_last_error());
    OK(lm_program_bind(p[i], "N1", 100003));
    OK(lm_program_bind(p[i], "N2", 5003));
    OK(lm_program_bind(p[i], "N3", 20001));
  }
  unsetenv("LUMEN_THREADS");
  check_rng r = check_rng_new(3);
  for (int k = 0; k < 6; k++) {
    size_t n = 0;
    OK(lm_program_numel(p[0], ins[k], &n));
    float *v = malloc(n * sizeof *v);
    check_fill(&r, v, n, -3, 3, 0.01);
    for (int i = 0; i < 4; i++) OK(lm_program_write(p[i], ins[k], v, n));
    free(v);
  }
  for (int i = 0; i < 4; i++) OK(lm_program_run(p[i]));
  for (int k = 0; k < 5; k++) {
    size_t n = 0;
    OK(lm_program_numel(p[0], outs[k], &n));
    float *got[4];
    for (int i = 0; i < 4; i++) {
      got[i] = malloc(n * sizeof *got[i]);
      check_poison(got[i], n);
      OK(lm_program_read(p[i], outs[k], got[i], n));
    }
    for (int i = 1; i < 3; i++)
      for (size_t e = 0; e < n; e++)
        cr_assert(!memcmp(&got[0][e], &got[i][e], sizeof(float)), "%s[%zu]: %a with 1 thread, %a with %s", outs[k], e,
                  (double)got[0][e], (double)got[i][e], threads[i]);
    double *want = malloc(n * sizeof *want);
    for (size_t e = 0; e < n; e++) want[e] = got[3][e];
    check_close(outs[k], got[0], want, n, RTOL, ATOL * 40); /* values up to 33 (row sums of 33 sines) */
    free(want);
    for (int i = 0; i < 4; i++) free(got[i]);
  }
  for (int i = 0; i < 4; i++) {
    lm_program_free(p[i]);
    lm_backend_free(be[i]);
  }
  lm_graph_free(g);
}

/* ================================================================ LUMEN_DUMP */

/* Every buffer the cpu backend hands out starts a 64-byte line (lm_malloc_aligned; the arena of
 * temporaries too, whose offsets memplan rounds to 64): malloc's 16 bytes past a line split
 * every other 32-byte vector access, a tenth of a register tile's speed. */
Test(cpu, buffers_start_a_cache_line) {
  char why[256];
  lm_backend_t *be = lm_backend_open("cpu", why, sizeof why);
  if (!be) cr_skip_test("no cpu backend here: %s", why);
  void *ctx = NULL;
  const lm_backend_ops *ops = lm_backend_parts(be, &ctx);
  cr_assert(ops && ops->alloc && ops->release);
  const size_t sizes[] = {1, 4, 100, 4096, 131072 + 4, 1u << 20};
  void *bufs[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    cr_assert_eq(ops->alloc(ctx, sizes[i], &bufs[i]), LM_OK);
    cr_assert_eq((uintptr_t)bufs[i] % 64, 0, "a %zu-byte buffer at %p", sizes[i], bufs[i]);
    memset(bufs[i], 0xA5, sizes[i]); /* all of it is ours (ASan checks) */
  }
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) ops->release(ctx, bufs[i]);
  lm_backend_free(be);
}

/* lm_malloc_aligned: any size on a line, all of it usable; a size that cannot be rounded up to
 * a whole line fails as out of memory instead of wrapping around to a small block. */
Test(cpu, aligned_allocations_start_a_line_and_oversized_ones_fail) {
  const size_t sizes[] = {0, 1, 63, 64, 65, 4097};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char *p = lm_malloc_aligned(sizes[i]);
    cr_assert(p && (uintptr_t)p % LM_BUFFER_ALIGN == 0, "%zu bytes at %p", sizes[i], (void *)p);
    memset(p, 0x5A, sizes[i]);
    lm_free(p);
  }
  cr_assert_null(lm_malloc_aligned(SIZE_MAX - 10));
  cr_assert(strstr(lm_last_error(), "out of memory"), "%s", lm_last_error());
}

Test(cpu, lumen_dump_writes_the_kernel_source_with_its_loop_ir) {
  char dir[] = "/tmp/lumen-test-dump-XXXXXX";
  cr_assert(mkdtemp(dir));
  char kdir[64];
  snprintf(kdir, sizeof kdir, "%s/kernels", dir); /* created by the backend */
  setenv("LUMEN_DUMP", kdir, 1);
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){n, 3});
  lm_tensor s = lm_input(g, "s", LM_ROLE_STATE, 1, (lm_dim[]){n});
  OK(lm_output(lm_softmax(x, 1), "p"));
  OK(lm_output(lm_transpose(lm_sin(x), 0, 1), "t"));
  OK(lm_assign(s, lm_add(s, lm_sum(x, 1, 0))));
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "%s", lm_last_error());
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", lm_last_error());
  unsetenv("LUMEN_DUMP");
  /* the kernels the backend builds: the same compile front (canonicalise, lower, schedule) */
  lm_compiled comp;
  lm_compile_options co = {.interchange = 1, .stage = 1, .join = 1}; /* as cpu_prepare */
  OK(lm_compile_ex(g, NULL, &co, &comp));
  lm_plan *plan = comp.plan;
  cr_assert_geq(plan->nkernels, 1);
  char seen[4096] = "", path[1024];
  new_source(kdir, seen, sizeof seen, path, sizeof path);
  cr_assert(path[0], "no .c file in %s", kdir);
  FILE *f = fopen(path, "r");
  cr_assert(f);
  static char text[1 << 20];
  size_t len = fread(text, 1, sizeof text - 1, f);
  text[len] = 0;
  fclose(f);
  for (size_t k = 0; k < plan->nkernels; k++) {
    char decl[64];
    snprintf(decl, sizeof decl, "void %s(", plan->kernels[k].name);
    cr_assert(strstr(text, decl), "%s: no definition of kernel %s", path, plan->kernels[k].name);
    snprintf(decl, sizeof decl, "kernel %s ", plan->kernels[k].name);
    cr_assert(strstr(text, decl), "%s: the loop IR does not show kernel %s", path, plan->kernels[k].name);
  }
  cr_assert(strstr(text, "loop IR"), "%s: no loop IR comment", path);
  new_source(kdir, seen, sizeof seen, path, sizeof path);
  cr_assert_eq(path[0], 0, "one program, one source file (another: %s)", path);
  lm_compiled_free(&comp);
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  remove_tree(kdir);
  rmdir(dir);
}

/* ================================================================ no C compiler */

Test(cpu, without_a_c_compiler_cpu_fails_naming_it_and_auto_falls_back_to_ref) {
  const char *cc = "/nonexistent/lumen-no-such-cc";
  setenv("LUMEN_CC", cc, 1);
  setenv("CUDA_VISIBLE_DEVICES", "", 1); /* on a GPU machine auto would pick cuda */
  cr_assert_null(lm_backend_new("cpu"), "cpu opened with LUMEN_CC=%s", cc);
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "lumen-no-such-cc"), "the error does not name the compiler: %s", msg);
  char why[512] = "";
  lm_backend_t *b = lm_backend_open("auto", why, sizeof why);
  cr_assert(b, "auto: %s", lm_last_error());
  cr_assert_str_eq(lm_backend_name(b), "ref");
  cr_assert(strstr(why, "ref"), "why: %s", why);
  cr_assert(strstr(why, "cpu") && strstr(why, "unavailable"), "why does not say cpu was unavailable: %s", why);
  cr_assert(strstr(why, "lumen-no-such-cc"), "why does not say why cpu was unavailable: %s", why);
  /* the fallback works */
  lm_graph_t *g = lm_graph_new();
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){3});
  OK(lm_output(lm_mul(x, x), "y"));
  lm_program_t *p = lm_program_new(b, g);
  cr_assert(p, "%s", lm_last_error());
  float v[3] = {1.5f, -2, 3}, y[3];
  OK(lm_program_write(p, "x", v, 3));
  OK(lm_program_run(p));
  check_poison(y, 3);
  OK(lm_program_read(p, "y", y, 3));
  for (int i = 0; i < 3; i++) cr_assert_eq(y[i], v[i] * v[i]);
  /* asking for cpu by name does not fall back */
  cr_assert_null(lm_backend_open("cpu", why, sizeof why));
  lm_program_free(p);
  lm_backend_free(b);
  lm_graph_free(g);
  unsetenv("LUMEN_CC");
}

/* The C dialect renders MOD by a constant whose magnitude is a power of two >= 1 as
 * lm_fmod_p2 (vectorisable) instead of fmodf: it must give fmodf's bits, signed zeros, NaN
 * for infinities and all, for small, huge, negative, integral and non-finite dividends. */
Test(cpu, mod_by_a_power_of_two_constant_gives_fmodf_bits) {
  static const float divisors[] = {1.0f, 2.0f, 4.0f, -1.0f, -8.0f, 1024.0f, 3.0f};
  float x[64];
  size_t n = 0;
  static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 3.75f, -3.75f, 7.0f,
                                  -7.0f, 1e-30f, -1e-30f, 1e-45f, 16777217.0f, -16777216.0f, 3.4e38f, -3.4e38f,
                                  INFINITY, -INFINITY, NAN, 0.99999994f, -0.99999994f, 1024.5f, -2047.75f};
  for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[n++] = special[i];
  check_rng r = check_rng_new(31);
  while (n < 64) {
    float v;
    check_fill(&r, &v, 1, -5000, 5000, 0);
    x[n++] = v;
  }
  for (size_t d = 0; d < sizeof divisors / sizeof divisors[0]; d++) {
    lm_graph_t *g = lm_graph_new();
    lm_tensor in = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){64});
    lm_tensor out = lm_mod(in, lm_const(g, divisors[d]));
    cr_assert_eq(lm_output(out, "y"), LM_OK, "%s", lm_last_error());
    lm_backend_t *b = lm_backend_new("cpu");
    cr_assert(b, "%s", lm_last_error());
    lm_program_t *p = lm_program_new(b, g);
    cr_assert(p, "%s", lm_last_error());
    cr_assert_eq(lm_program_write(p, "x", x, 64), LM_OK);
    cr_assert_eq(lm_program_run(p), LM_OK, "%s", lm_last_error());
    float y[64];
    cr_assert_eq(lm_program_read(p, "y", y, 64), LM_OK);
    for (size_t i = 0; i < 64; i++) {
      float want = fmodf(x[i], divisors[d]);
      int same = isnan(want) ? isnan(y[i]) : (y[i] == want && signbit(y[i]) == signbit(want));
      cr_assert(same, "fmod(%.9g, %g): cpu %.9g, fmodf %.9g", (double)x[i], (double)divisors[d], (double)y[i],
                (double)want);
    }
    lm_program_free(p);
    lm_backend_free(b);
    lm_graph_free(g);
  }
}
