/* Tests for the cpu backend's compiler driver (compiler/cc.c): generated C is compiled, loaded
 * and run; the disk cache skips the compiler; compile errors carry the compiler's output and the
 * kept source's path; $LUMEN_CC, $LUMEN_CFLAGS, $LUMEN_CACHE_DIR and the time-out are honoured;
 * concurrent processes building the same source all succeed; a good probe is remembered on disk
 * for the next process, and probed again when its record is damaged or the compiler changes.
 * Each test gets its own cache dir. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cc.h"
#include "core.h"

static char cache_root[256];

/* rm -r for the flat trees these tests create (files and one level of directories). */
static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
      remove_tree(path);
    else
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static void setup(void) {
  snprintf(cache_root, sizeof cache_root, "/tmp/lumen-test-cc-XXXXXX");
  cr_assert(mkdtemp(cache_root));
  char dir[512];
  snprintf(dir, sizeof dir, "%s/cache", cache_root);
  setenv("LUMEN_CACHE_DIR", dir, 1);
}

static void teardown(void) { remove_tree(cache_root); }

TestSuite(cc, .init = setup, .fini = teardown);

static lm_cc *open_cc(void) {
  lm_cc *cc = NULL;
  cr_assert_eq(lm_cc_open(&cc), LM_OK, "%s", lm_last_error());
  cr_assert_not_null(cc);
  return cc;
}

/* Counts the entries of `dir` whose name ends with `suffix`. */
static int count_files(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t a = strlen(e->d_name), b = strlen(suffix);
    if (a >= b && !strcmp(e->d_name + a - b, suffix)) n++;
  }
  closedir(d);
  return n;
}

static const char kernel_source[] =
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "void lm_kernel_sin_exp(float *restrict out, const float *restrict x, int64_t start,\n"
    "                       int64_t end) {\n"
    "  for (int64_t i = start; i < end; i++) out[i] = sinf(x[i]) * 0.5f + expf(-x[i]);\n"
    "}\n"
    "int lm_kernel_answer(int a) { return a * 6 + 0; }\n";

typedef void (*sin_exp_fn)(float *, const float *, int64_t, int64_t);

Test(cc, generated_source_compiles_loads_and_computes_like_libm) {
  lm_cc *cc = open_cc();
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, kernel_source, &lib), LM_OK, "%s", lm_last_error());
  int (*answer)(int);
  sin_exp_fn fn;
  *(void **)&answer = lm_cc_sym(lib, "lm_kernel_answer");
  *(void **)&fn = lm_cc_sym(lib, "lm_kernel_sin_exp");
  cr_assert(answer && fn, "%s", lm_last_error());
  cr_assert_eq(answer(7), 42);
  enum { N = 1003 };
  float x[N], out[N];
  for (int i = 0; i < N; i++) x[i] = (float)(i - 500) * 0.013f + 0.001f, out[i] = NAN;
  fn(out, x, 0, N);
  for (int i = 0; i < N; i++) {
    double want = sin((double)x[i]) * 0.5 + exp(-(double)x[i]);
    /* libmvec's SIMD sinf/expf are within 4 ulp of the exact result. */
    cr_assert(fabs(out[i] - want) <= 1e-6 * fabs(want) + 1e-7, "x=%g: %.9g vs %.9g", x[i],
              out[i], want);
  }
  const char *path = lm_cc_lib_path(lib);
  cr_assert(strncmp(path, lm_cc_cache_dir(), strlen(lm_cc_cache_dir())) == 0, "%s", path);
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
}

Test(cc, default_flags_are_optimised_without_fast_math) {
  if (getenv("LUMEN_CFLAGS")) cr_skip_test("LUMEN_CFLAGS is set");
  lm_cc *cc = open_cc();
  const char *d = lm_cc_describe(cc);
  cr_assert(strstr(d, "-O3") && strstr(d, "-fno-math-errno") && strstr(d, "-ffp-contract=off"),
            "%s", d);
  cr_assert(strstr(d, "-fPIC") && strstr(d, "-shared"), "%s", d);
  cr_assert_null(strstr(d, "fast-math"), "%s", d);
  cr_assert(strchr(d, '('), "the describe string names the compiler version: %s", d);
  lm_cc_close(cc);
}

Test(cc, cache_hit_runs_no_compiler_even_from_a_new_handle) {
  lm_cc *cc = open_cc();
  lm_cc_lib *a = NULL, *b = NULL, *c = NULL;
  int64_t before = lm_cc_compile_count();
  cr_assert_eq(lm_cc_build(cc, kernel_source, &a), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_cc_compile_count(), before + 1);
  /* Same source again, while the first load is still open: no compiler, a second load works. */
  cr_assert_eq(lm_cc_build(cc, kernel_source, &b), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_cc_compile_count(), before + 1);
  cr_assert_str_eq(lm_cc_lib_path(a), lm_cc_lib_path(b));
  int (*fa)(int), (*fb)(int);
  *(void **)&fa = lm_cc_sym(a, "lm_kernel_answer");
  *(void **)&fb = lm_cc_sym(b, "lm_kernel_answer");
  cr_assert(fa && fb);
  lm_cc_lib_close(a);
  cr_assert_eq(fb(2), 12, "the second handle survives closing the first");
  lm_cc_lib_close(b);
  lm_cc_close(cc);
  /* A new handle in this process: the probe is remembered and the .so is reused. */
  cc = open_cc();
  cr_assert_eq(lm_cc_build(cc, kernel_source, &c), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_cc_compile_count(), before + 1);
  lm_cc_lib_close(c);
  lm_cc_close(cc);
  /* One .so and its kept .c, and no temporaries, are left in the cache. */
  const char *dir = lm_cc_cache_dir();
  cr_assert_eq(count_files(dir, ".so"), 1);
  cr_assert_eq(count_files(dir, ".c"), 1);
  cr_assert_eq(count_files(dir, ".log"), 0);
}

Test(cc, a_different_source_is_a_cache_miss) {
  lm_cc *cc = open_cc();
  lm_cc_lib *a = NULL, *b = NULL;
  cr_assert_eq(lm_cc_build(cc, "int lm_f(void) { return 1; }\n", &a), LM_OK, "%s",
               lm_last_error());
  int64_t before = lm_cc_compile_count();
  cr_assert_eq(lm_cc_build(cc, "int lm_f(void) { return 2; }\n", &b), LM_OK, "%s",
               lm_last_error());
  cr_assert_eq(lm_cc_compile_count(), before + 1);
  int (*fa)(void), (*fb)(void);
  *(void **)&fa = lm_cc_sym(a, "lm_f");
  *(void **)&fb = lm_cc_sym(b, "lm_f");
  cr_assert(fa && fb);
  cr_assert_eq(fa(), 1);
  cr_assert_eq(fb(), 2, "RTLD_LOCAL keeps two objects' same-named symbols apart");
  lm_cc_lib_close(a);
  lm_cc_lib_close(b);
  lm_cc_close(cc);
}

Test(cc, syntax_error_reports_the_compiler_output_and_the_kept_source) {
  lm_cc *cc = open_cc();
  lm_cc_lib *lib = (lm_cc_lib *)1;
  static const char bad[] = "int lm_ok(void) { return 1; }\nint lm_bad(void) { return 1 }\n";
  cr_assert_eq(lm_cc_build(cc, bad, &lib), LM_ERR_COMPILE);
  cr_assert_null(lib);
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "error"), "%s", msg);
  /* The compiler's own error line: <cache>/<key>.c:2:<col>: error: ... */
  const char *dir = lm_cc_cache_dir();
  const char *at = strstr(msg, dir);
  cr_assert(at, "the message names the cache dir %s: %s", dir, msg);
  char path[1024];
  size_t len = strcspn(at, " :\n(;");
  cr_assert_lt(len, sizeof path);
  memcpy(path, at, len);
  path[len] = 0;
  cr_assert(len > 2 && !strcmp(path + len - 2, ".c"), "source path %s", path);
  char line2[1100];
  snprintf(line2, sizeof line2, "%s:2:", path);
  cr_assert(strstr(msg, line2), "compiler error line for %s missing: %s", line2, msg);
  /* The kept source holds the text that failed. */
  FILE *f = fopen(path, "r");
  cr_assert(f, "kept source %s", path);
  char text[256] = {0};
  cr_assert_gt(fread(text, 1, sizeof text - 1, f), 0);
  fclose(f);
  cr_assert(!strncmp(text, bad, strlen(bad)), "%s", text);
  cr_assert_eq(count_files(dir, ".so"), 0, "no object for a failed build");
  cr_assert_eq(count_files(dir, ".log"), 1, "the full log is kept");
  /* The same handle still builds good code afterwards. */
  cr_assert_eq(lm_cc_build(cc, "int lm_ok(void) { return 1; }\n", &lib), LM_OK, "%s",
               lm_last_error());
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
}

Test(cc, missing_symbol_is_null_with_a_message) {
  lm_cc *cc = open_cc();
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, "int lm_here(void) { return 3; }\n", &lib), LM_OK);
  cr_assert_null(lm_cc_sym(lib, "lm_not_here"));
  cr_assert(strstr(lm_last_error(), "lm_not_here"), "%s", lm_last_error());
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
}

Test(cc, nonexistent_lumen_cc_fails_naming_it) {
  setenv("LUMEN_CC", "lumen-nonexistent-compiler", 1);
  lm_cc *cc = (lm_cc *)1;
  cr_assert_eq(lm_cc_open(&cc), LM_ERR_UNSUPPORTED);
  cr_assert_null(cc);
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "lumen-nonexistent-compiler"), "%s", msg);
  cr_assert(strstr(msg, "LUMEN_CC"), "%s", msg);
  cr_assert(strstr(msg, "No such file"), "%s", msg);
}

/* The compiler the default choice found, as a bare command (first word of the description). */
static void default_compiler(char *buf, size_t n) {
  unsetenv("LUMEN_CC");
  unsetenv("LUMEN_CFLAGS");
  lm_cc *cc = open_cc();
  snprintf(buf, n, "%s", lm_cc_describe(cc));
  buf[strcspn(buf, " ")] = 0;
  lm_cc_close(cc);
}

Test(cc, lumen_cc_may_carry_arguments) {
  char cmd[256], env[300];
  default_compiler(cmd, sizeof cmd);
  snprintf(env, sizeof env, "  %s  -DLM_FROM_LUMEN_CC=17 ", cmd);
  setenv("LUMEN_CC", env, 1);
  lm_cc *cc = open_cc();
  cr_assert(strstr(lm_cc_describe(cc), "-DLM_FROM_LUMEN_CC=17"), "%s", lm_cc_describe(cc));
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, "int lm_v(void) { return LM_FROM_LUMEN_CC; }\n", &lib), LM_OK,
               "%s", lm_last_error());
  int (*v)(void);
  *(void **)&v = lm_cc_sym(lib, "lm_v");
  cr_assert(v);
  cr_assert_eq(v(), 17);
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
}

Test(cc, lumen_cflags_replace_the_defaults_and_keep_shared) {
  unsetenv("LUMEN_CC");
  setenv("LUMEN_CFLAGS", "-O1 -DLM_FROM_CFLAGS=5", 1);
  lm_cc *cc = open_cc();
  const char *d = lm_cc_describe(cc);
  cr_assert(strstr(d, "-O1 -DLM_FROM_CFLAGS=5 -fPIC -shared"), "%s", d);
  cr_assert_null(strstr(d, "-O3"), "%s", d);
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, "int lm_v(void) { return LM_FROM_CFLAGS; }\n", &lib), LM_OK,
               "%s", lm_last_error());
  int (*v)(void);
  *(void **)&v = lm_cc_sym(lib, "lm_v");
  cr_assert(v);
  cr_assert_eq(v(), 5);
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
}

Test(cc, bad_lumen_cflags_fail_the_probe_with_the_compiler_output) {
  unsetenv("LUMEN_CC");
  setenv("LUMEN_CFLAGS", "-fno-such-flag-for-lumen", 1);
  lm_cc *cc = NULL;
  cr_assert_eq(lm_cc_open(&cc), LM_ERR_UNSUPPORTED);
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "LUMEN_CFLAGS"), "%s", msg);
  cr_assert(strstr(msg, "-fno-such-flag-for-lumen"), "the compiler's complaint is quoted: %s",
            msg);
  cr_assert(strstr(msg, "clang") && strstr(msg, "gcc") && strstr(msg, "tried"),
            "every default compiler is named: %s", msg);
}

Test(cc, cache_dir_follows_lumen_cache_dir_then_xdg_then_home) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/a/b/c", cache_root);
  setenv("LUMEN_CACHE_DIR", dir, 1);
  cr_assert_str_eq(lm_cc_cache_dir(), dir);
  lm_cc *cc = open_cc(); /* creates a/b/c */
  struct stat sb;
  cr_assert(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode));
  cr_assert_eq(sb.st_mode & 077, 0, "created private (mode %o)", (unsigned)sb.st_mode & 0777);
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, "int lm_x(void) { return 0; }\n", &lib), LM_OK);
  cr_assert(!strncmp(lm_cc_lib_path(lib), dir, strlen(dir)), "%s", lm_cc_lib_path(lib));
  cr_assert_eq(count_files(dir, ".so"), 1);
  lm_cc_lib_close(lib);
  lm_cc_close(cc);

  unsetenv("LUMEN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  cr_assert_str_eq(lm_cc_cache_dir(), "/xdg/lumen");
  setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  setenv("HOME", "/home/someone", 1);
  cr_assert_str_eq(lm_cc_cache_dir(), "/home/someone/.cache/lumen");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  char want[64];
  snprintf(want, sizeof want, "/tmp/lumen-cache-%lu", (unsigned long)getuid());
  cr_assert_str_eq(lm_cc_cache_dir(), want);
}

Test(cc, a_hung_compiler_is_killed_at_the_time_out) {
  char script[512];
  snprintf(script, sizeof script, "%s/slowcc", cache_root);
  FILE *f = fopen(script, "w");
  cr_assert(f);
  fputs("#!/bin/sh\nsleep 30\n", f);
  fclose(f);
  chmod(script, 0755);
  setenv("LUMEN_CC", script, 1);
  setenv("LUMEN_CC_TIMEOUT", "0.3", 1);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  lm_cc *cc = NULL;
  cr_assert_eq(lm_cc_open(&cc), LM_ERR_UNSUPPORTED);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  cr_assert(strstr(lm_last_error(), "timed out after 0.3 s"), "%s", lm_last_error());
  cr_assert_lt(s, 10.0, "took %.1f s", s);
  setenv("LUMEN_CC_TIMEOUT", "soon", 1);
  cr_assert_eq(lm_cc_open(&cc), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "LUMEN_CC_TIMEOUT"), "%s", lm_last_error());
}

/* Runs lm_cc_open in a fresh child (no probe in its memory); returns the child's exit status. */
static int open_in_child(void) {
  pid_t kid = fork();
  cr_assert_geq(kid, 0);
  if (kid == 0) {
    lm_cc *cc = NULL;
    int ok = lm_cc_open(&cc) == LM_OK;
    if (!ok) fprintf(stderr, "child: %s\n", lm_last_error());
    lm_cc_close(cc);
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  cr_assert_eq(waitpid(kid, &st, 0), kid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* The compiler is a script that logs a line per run and runs the real one. */
Test(cc, the_probe_is_remembered_for_the_next_process_until_its_record_or_compiler_changes) {
  char script[512], calls[512], real[256] = "cc";
  snprintf(script, sizeof script, "%s/countcc", cache_root);
  snprintf(calls, sizeof calls, "%s/calls", cache_root);
  for (const char *c = "clang\0gcc\0"; *c; c += strlen(c) + 1) {
    char probe[300];
    snprintf(probe, sizeof probe, "command -v %s > /dev/null", c);
    if (system(probe) == 0) {
      snprintf(real, sizeof real, "%s", c);
      break;
    }
  }
  FILE *f = fopen(script, "w");
  cr_assert(f);
  fprintf(f, "#!/bin/sh\necho run >> %s\nexec %s \"$@\"\n", calls, real);
  fclose(f);
  chmod(script, 0755);
  setenv("LUMEN_CC", script, 1);
  cr_assert_eq(open_in_child(), 0);
  long first = file_size(calls);
  cr_assert_gt(first, 0, "the first process probes the compiler");
  const char *dir = lm_cc_cache_dir();
  cr_assert_eq(count_files(dir, ""), 4, "., .., mac-key and one probe record");
  cr_assert_eq(open_in_child(), 0);
  cr_assert_eq(file_size(calls), first, "the second process runs no compiler");
  /* a damaged record is not believed: probed again and rewritten */
  DIR *d = opendir(dir);
  struct dirent *e;
  char record[1024] = "";
  while ((e = readdir(d)))
    if (!strncmp(e->d_name, "probe-", 6)) snprintf(record, sizeof record, "%s/%s", dir, e->d_name);
  closedir(d);
  cr_assert(record[0]);
  f = fopen(record, "r+");
  cr_assert(f);
  fputc('9', f); /* the family digit */
  fclose(f);
  cr_assert_eq(open_in_child(), 0);
  long second = file_size(calls);
  cr_assert_gt(second, first, "a damaged record is probed again");
  cr_assert_eq(open_in_child(), 0);
  cr_assert_eq(file_size(calls), second, "and the rewritten record is believed");
  /* a changed compiler file is probed again, under a new record */
  f = fopen(script, "a");
  cr_assert(f);
  fputs("# upgraded\n", f);
  fclose(f);
  cr_assert_eq(open_in_child(), 0);
  cr_assert_gt(file_size(calls), second, "a changed compiler is probed again");
  cr_assert_eq(count_files(dir, ""), 5, "., .., mac-key and two probe records");
  unsetenv("LUMEN_CC");
}

Test(cc, concurrent_processes_building_the_same_source_all_succeed) {
  lm_cc *cc = open_cc(); /* probe before forking, so the children race on the build itself */
  char src[256];
  snprintf(src, sizeof src, "/* %ld.%ld */\nint lm_race(int x) { return x + 1; }\n",
           (long)getpid(), (long)time(NULL));
  enum { KIDS = 4 };
  pid_t kids[KIDS];
  for (int k = 0; k < KIDS; k++) {
    kids[k] = fork();
    cr_assert_geq(kids[k], 0);
    if (kids[k] == 0) {
      lm_cc_lib *lib = NULL;
      int ok = lm_cc_build(cc, src, &lib) == LM_OK;
      int (*fn)(int) = NULL;
      if (ok) *(void **)&fn = lm_cc_sym(lib, "lm_race");
      ok = ok && fn && fn(41) == 42;
      if (!ok) fprintf(stderr, "child %d: %s\n", k, lm_last_error());
      _exit(ok ? 0 : 1);
    }
  }
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, src, &lib), LM_OK, "%s", lm_last_error());
  for (int k = 0; k < KIDS; k++) {
    int st = 0;
    cr_assert_eq(waitpid(kids[k], &st, 0), kids[k]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed", k);
  }
  int (*fn)(int);
  *(void **)&fn = lm_cc_sym(lib, "lm_race");
  cr_assert(fn);
  cr_assert_eq(fn(1), 2);
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
  const char *dir = lm_cc_cache_dir();
  cr_assert_eq(count_files(dir, ".so"), 1);
  cr_assert_eq(count_files(dir, ""), 6,
               "only ., .., mac-key, probe-<key>, <key>.so and <key>.c: no temporaries");
}

/* Every allocation in open and build, failed in turn: each reports LM_ERR_NOMEM (or, for the
 * compiler's log, degrades), nothing crashes or leaks (under ASan), and the next try works. */
Test(cc, each_failed_allocation_is_reported_and_recovered_from) {
  static const char src[] = "int lm_fault(void) { return 9; }\n";
  long n;
  for (n = 1; n < 1000; n++) {
    lm_alloc_fail_after(n);
    lm_cc *cc = NULL;
    lm_cc_lib *lib = NULL;
    lm_status st = lm_cc_open(&cc);
    if (st == LM_OK) st = lm_cc_build(cc, src, &lib);
    lm_alloc_fail_after(0);
    if (st == LM_OK) {
      int (*fn)(void);
      *(void **)&fn = lm_cc_sym(lib, "lm_fault");
      cr_assert(fn && fn() == 9);
    } else {
      cr_assert_eq(st, LM_ERR_NOMEM, "allocation %ld: %s: %s", n, lm_status_name(st),
                   lm_last_error());
    }
    lm_cc_lib_close(lib);
    lm_cc_close(cc);
    if (st == LM_OK) break; /* past the last allocation */
  }
  /* the loop ends at the first success: by then the probe and the object are on disk (written
   * by tries that failed later), so the last try needs only the recall and the load */
  cr_assert(n > 8 && n < 1000, "%ld allocations", n);
}

typedef struct thread_job {
  lm_cc *cc;
  int index;
  int ok;
} thread_job;

static void *build_in_thread(void *arg) {
  thread_job *j = arg;
  char src[128];
  snprintf(src, sizeof src, "int lm_t(void) { return %d; }\n", j->index % 2); /* pairs share */
  lm_cc_lib *lib = NULL;
  if (lm_cc_build(j->cc, src, &lib) != LM_OK) return NULL;
  int (*fn)(void);
  *(void **)&fn = lm_cc_sym(lib, "lm_t");
  j->ok = fn && fn() == j->index % 2;
  lm_cc_lib_close(lib);
  return NULL;
}

Test(cc, threads_sharing_one_handle_build_concurrently) {
  lm_cc *cc = open_cc();
  enum { THREADS = 4 };
  pthread_t t[THREADS];
  thread_job jobs[THREADS];
  for (int i = 0; i < THREADS; i++) {
    jobs[i] = (thread_job){cc, i, 0};
    cr_assert_eq(pthread_create(&t[i], NULL, build_in_thread, &jobs[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < THREADS; i++) cr_assert(jobs[i].ok, "thread %d", i);
  cr_assert_eq(count_files(lm_cc_cache_dir(), ".so"), 2);
  lm_cc_close(cc);
}

/* The contract the cpu backend relies on for thread-count determinism: libmvec's SIMD functions
 * differ from scalar libm in the last bits, so a kernel split at multiples of 64 elements (the
 * widest vector loop step) computes bitwise what one call over everything computes. */
Test(cc, vector_math_kernel_split_at_multiples_of_64_matches_one_call_bitwise) {
  lm_cc *cc = open_cc();
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, kernel_source, &lib), LM_OK, "%s", lm_last_error());
  sin_exp_fn fn;
  *(void **)&fn = lm_cc_sym(lib, "lm_kernel_sin_exp");
  cr_assert(fn);
  enum { N = 64 * 37 + 29 };
  static float x[N], whole[N], split[N];
  for (int i = 0; i < N; i++) x[i] = sinf((float)i * 0.37f) * 40.0f, whole[i] = split[i] = NAN;
  fn(whole, x, 0, N);
  static const int64_t cuts[] = {0, 64, 640, 704, 64 * 20, 64 * 37, N};
  for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) fn(split, x, cuts[c], cuts[c + 1]);
  cr_assert(!memcmp(whole, split, sizeof whole));
  lm_cc_lib_close(lib);
  lm_cc_close(cc);
}
