/* tests/test_install.c — lumen as an installed library: `cmake --install` of this build into a
 * fresh prefix, then, from that prefix alone (PKG_CONFIG_PATH and CMAKE_PREFIX_PATH name it; no
 * -I into the source tree; CPATH and friends unset): every installed header compiles on its own;
 * a program built with `pkg-config --cflags --libs lumen` links liblumen.so, one built with
 * `--static` and the archive links no liblumen.so, and both run a graph on the ref backend and
 * find CartPole; a CMake project with find_package(lumen) links lumen::lumen and
 * lumen::lumen_static and runs both; the installed rltrain lists the envs and exports every
 * lm_* function of the library (for env plugins); no installed package file names a path of the
 * build or source tree. Each test installs into its own /tmp/lumen-install-XXXXXX. A failing
 * step prints its command line and its output. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/timeout.h"

#ifndef LUMEN_BINARY_DIR
#define LUMEN_BINARY_DIR LUMEN_SOURCE_DIR "/build"
#endif
#ifndef LUMEN_C_COMPILER
#define LUMEN_C_COMPILER "cc"
#endif
#ifndef LUMEN_INSTALL_LIBDIR
#define LUMEN_INSTALL_LIBDIR "lib"
#endif
#ifndef LUMEN_SANITIZE_FLAGS
#define LUMEN_SANITIZE_FLAGS ""
#endif
#ifndef LUMEN_VERSION_STRING
#define LUMEN_VERSION_STRING "0.1.0"
#endif
#ifndef LUMEN_SOVERSION
#define LUMEN_SOVERSION "0.1"
#endif
#ifndef LUMEN_CMAKE_COMMAND
#define LUMEN_CMAKE_COMMAND "cmake"
#endif

#define CC LUMEN_C_COMPILER " " LUMEN_SANITIZE_FLAGS

static char tmp[256];     /* /tmp/lumen-install-XXXXXX: the working directory of every step */
static char prefix[512];  /* tmp/prefix: the install prefix */
static char logpath[512]; /* tmp/step.log: the last step's output */

static char *slurp(const char *path) {
  static char buf[1 << 16];
  buf[0] = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* Runs the shell command (printf-style) in tmp with its output in logpath; its exit status. */
static int sh_status(char *cmd, size_t cap, const char *fmt, va_list ap) {
  char body[6000];
  vsnprintf(body, sizeof body, fmt, ap);
  int n = snprintf(cmd, cap, "cd '%s' && ( %s ) > '%s' 2>&1", tmp, body, logpath);
  cr_assert(n > 0 && (size_t)n < cap, "command line too long: %s", body);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Runs the command and fails the test, showing the command and its output, unless it exits 0;
 * returns its output. */
static char *run_ok(const char *what, const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  int rc = sh_status(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char *out = slurp(logpath);
  cr_assert_eq(rc, 0, "%s failed (exit %d)\n$ %s\n%s", what, rc, cmd, out);
  return out;
}

/* A fresh prefix holding `cmake --install` of this build, and an environment that sees only it. */
static void install_prefix(void) {
  const char *base = getenv("TMPDIR");
  snprintf(tmp, sizeof tmp, "%s/lumen-install-XXXXXX", base && *base ? base : "/tmp");
  cr_assert_not_null(mkdtemp(tmp), "mkdtemp %s", tmp);
  snprintf(prefix, sizeof prefix, "%s/prefix", tmp);
  snprintf(logpath, sizeof logpath, "%s/step.log", tmp);
  run_ok("install", "'%s' --install '%s' --prefix '%s'", LUMEN_CMAKE_COMMAND, LUMEN_BINARY_DIR, prefix);

  char path[1024];
  snprintf(path, sizeof path, "%s/" LUMEN_INSTALL_LIBDIR "/pkgconfig", prefix);
  setenv("PKG_CONFIG_PATH", path, 1);
  unsetenv("PKG_CONFIG_LIBDIR"); /* the system's .pc files stay visible (sdl2 for Requires.private) */
  setenv("CMAKE_PREFIX_PATH", prefix, 1);
  const char *const leaks[] = {"CPATH", "C_INCLUDE_PATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "lumen_DIR"};
  for (size_t i = 0; i < sizeof leaks / sizeof *leaks; i++) unsetenv(leaks[i]);
}

static void remove_prefix(void) {
  if (!tmp[0]) return;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
  tmp[0] = 0;
}

/* The consumer program: lumen's version, CartPole's spec, and y = x * x + 1 run on ref. */
static const char consumer_c[] =
    "#include <stdio.h>\n"
    "#include <lumen/lumen.h>\n"
    "int main(void) {\n"
    "  const lm_env_spec *cp = lm_env_find(\"cartpole\");\n"
    "  if (!cp) { fprintf(stderr, \"lm_env_find: %s\\n\", lm_last_error()); return 1; }\n"
    "  lm_graph_t *g = lm_graph_new();\n"
    "  lm_dim n = 4;\n"
    "  lm_tensor x = lm_input(g, \"x\", LM_ROLE_DATA, 1, &n);\n"
    "  lm_status st = lm_output(lm_add(lm_mul(x, x), lm_const(g, 1.0f)), \"y\");\n"
    "  lm_backend_t *b = lm_backend_new(\"ref\");\n"
    "  lm_program_t *p = st == LM_OK && b ? lm_program_new(b, g) : NULL;\n"
    "  float in[4] = {1.5f, -2.0f, 3.0f, 0.25f}, out[4] = {-7.0f, -7.0f, -7.0f, -7.0f};\n"
    "  if (!p || lm_program_write(p, \"x\", in, 4) != LM_OK || lm_program_run(p) != LM_OK ||\n"
    "      lm_program_read(p, \"y\", out, 4) != LM_OK) {\n"
    "    fprintf(stderr, \"graph: %s\\n\", lm_last_error());\n"
    "    return 1;\n"
    "  }\n"
    "  int bad = 0;\n"
    "  for (int k = 0; k < 4; k++) bad |= out[k] != in[k] * in[k] + 1.0f;\n"
    "  printf(\"lumen %s: %s obs %d; y = %g %g %g %g\\n\", lm_version(), cp->gym_id, cp->obs_size,\n"
    "         out[0], out[1], out[2], out[3]);\n"
    "  lm_program_free(p);\n"
    "  lm_backend_free(b);\n"
    "  lm_graph_free(g);\n"
    "  return bad;\n"
    "}\n";

#define CONSUMER_SAYS "lumen " LUMEN_VERSION_STRING ": CartPole-v1 obs 4; y = 3.25 5 10 1.0625"

static void write_file(const char *dir, const char *name, const char *text) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  cr_assert(fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

TestSuite(install, .init = install_prefix, .fini = remove_prefix, .timeout = LM_TIMEOUT(120));

Test(install, every_installed_header_compiles_alone_with_pkg_config_cflags) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/include/lumen", prefix);
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "no %s", dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
    char what[512];
    snprintf(what, sizeof what, "lumen/%s alone", e->d_name);
    run_ok(what,
           "printf '#include <lumen/%s>\\nint lm_test_unit;\\n' | " CC
           " -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only $(pkg-config --cflags lumen) -x c -",
           e->d_name);
    n++;
  }
  closedir(d);
  /* as many as the source tree has: install(DIRECTORY) took them all */
  int want = 0;
  d = opendir(LUMEN_SOURCE_DIR "/include/lumen");
  cr_assert_not_null(d);
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    want += len >= 3 && !strcmp(e->d_name + len - 2, ".h");
  }
  closedir(d);
  cr_assert_eq(n, want, "%d headers installed, %d in include/lumen", n, want);
  cr_assert_gt(n, 10);
}

Test(install, pkg_config_links_the_shared_and_the_static_library_and_both_run) {
  write_file(tmp, "consumer.c", consumer_c);
  run_ok("pkg-config", "pkg-config --exists --print-errors lumen && pkg-config --modversion lumen");
  /* shared: liblumen.so found through LD_LIBRARY_PATH at run time */
  run_ok("link against liblumen.so", CC " -o app-shared consumer.c $(pkg-config --cflags --libs lumen)");
  char *out = run_ok("readelf app-shared", "readelf -d app-shared | grep NEEDED");
  cr_assert(strstr(out, "liblumen.so"), "app-shared does not need liblumen.so:\n%s", out);
  out = run_ok("run app-shared", "LD_LIBRARY_PATH='%s/" LUMEN_INSTALL_LIBDIR "' ./app-shared", prefix);
  cr_assert(strstr(out, CONSUMER_SAYS), "app-shared says:\n%s", out);

  /* static: --static adds Libs.private (libm, libdl, threads, SDL2); -l:liblumen.a picks the
   * archive where the linker would prefer the .so beside it */
  run_ok("link against liblumen.a",
         "libs=$(pkg-config --static --libs lumen) && " CC
         " -o app-static consumer.c $(pkg-config --cflags lumen) $(echo \" $libs \" | sed 's/ -llumen / -l:liblumen.a /')");
  out = run_ok("readelf app-static", "readelf -d app-static");
  cr_assert_null(strstr(out, "liblumen"), "app-static needs a liblumen shared object:\n%s", out);
  out = run_ok("run app-static", "./app-static");
  cr_assert(strstr(out, CONSUMER_SAYS), "app-static says:\n%s", out);
}

Test(install, cmake_find_package_links_lumen_lumen_and_lumen_static) {
  char src[1024];
  snprintf(src, sizeof src, "%s/consumer", tmp);
  run_ok("mkdir", "mkdir consumer");
  write_file(src, "consumer.c", consumer_c);
  write_file(src, "CMakeLists.txt",
             "cmake_minimum_required(VERSION 3.16)\n"
             "project(consumer LANGUAGES C)\n"
             "find_package(lumen 0.1 REQUIRED)\n"
             "message(STATUS \"lumen ${lumen_VERSION} from ${lumen_DIR}\")\n"
             "add_executable(app consumer.c)\n"
             "target_link_libraries(app PRIVATE lumen::lumen)\n"
             "add_executable(app_static consumer.c)\n"
             "target_link_libraries(app_static PRIVATE lumen::lumen_static)\n");
  char *out = run_ok("configure the consumer",
                     "'%s' -S consumer -B consumer-build -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER='%s'"
                     " -DCMAKE_C_FLAGS='%s' -DCMAKE_EXE_LINKER_FLAGS='%s'",
                     LUMEN_CMAKE_COMMAND, LUMEN_C_COMPILER, LUMEN_SANITIZE_FLAGS, LUMEN_SANITIZE_FLAGS);
  char want[1024];
  snprintf(want, sizeof want, "lumen " LUMEN_VERSION_STRING " from %s/", prefix);
  cr_assert(strstr(out, want), "find_package(lumen) did not take the installed package:\n%s", out);
  run_ok("build the consumer", "'%s' --build consumer-build", LUMEN_CMAKE_COMMAND);
  out = run_ok("readelf app", "readelf -d consumer-build/app | grep NEEDED");
  cr_assert(strstr(out, "liblumen.so"), "lumen::lumen is not liblumen.so:\n%s", out);
  /* the build tree's RPATH names the prefix's lib dir: no LD_LIBRARY_PATH */
  out = run_ok("run app", "consumer-build/app");
  cr_assert(strstr(out, CONSUMER_SAYS), "app says:\n%s", out);
  out = run_ok("readelf app_static", "readelf -d consumer-build/app_static");
  cr_assert_null(strstr(out, "liblumen"), "app_static needs a liblumen shared object:\n%s", out);
  out = run_ok("run app_static", "consumer-build/app_static");
  cr_assert(strstr(out, CONSUMER_SAYS), "app_static says:\n%s", out);
}

Test(install, installed_rltrain_lists_envs_and_exports_every_lm_function) {
  char *out = run_ok("rltrain list", "'%s/bin/rltrain' list", prefix);
  cr_assert(strstr(out, "cartpole"), "rltrain list does not name cartpole:\n%s", out);
  run_ok("rlbench --help", "'%s/bin/rlbench' --help", prefix);
  /* an env plugin dlopened by rltrain resolves lm_* against rltrain: every lm_ function of the
   * library is in rltrain's dynamic symbol table */
  run_ok("nm", "nm -D --defined-only '%s/" LUMEN_INSTALL_LIBDIR "/liblumen.so' | awk '$2 == \"T\" && $3 ~ /^lm_/ { print $3 }' | sort > lib.syms &&"
         " nm -D --defined-only '%s/bin/rltrain' | awk '$2 == \"T\" && $3 ~ /^lm_/ { print $3 }' | sort > exe.syms",
         prefix, prefix);
  out = run_ok("count", "wc -l < lib.syms");
  cr_assert_gt(atoi(out), 100, "liblumen.so defines only %d lm_ functions", atoi(out));
  out = run_ok("compare", "comm -23 lib.syms exe.syms");
  cr_assert_str_empty(out, "lm_ functions of liblumen.so that rltrain does not export:\n%s", out);
}

Test(install, installed_package_files_name_no_build_or_source_tree_path) {
  char *out = run_ok("list", "cd '%s' && find . -type f | sort", prefix);
  cr_assert(strstr(out, "./" LUMEN_INSTALL_LIBDIR "/liblumen.a\n"), "no liblumen.a:\n%s", out);
  cr_assert(strstr(out, "./" LUMEN_INSTALL_LIBDIR "/liblumen.so." LUMEN_VERSION_STRING "\n"), "no liblumen.so." LUMEN_VERSION_STRING ":\n%s", out);
  cr_assert(strstr(out, "./" LUMEN_INSTALL_LIBDIR "/pkgconfig/lumen.pc\n"), "no lumen.pc:\n%s", out);
  cr_assert(strstr(out, "./" LUMEN_INSTALL_LIBDIR "/cmake/lumen/lumenConfig.cmake\n"), "no lumenConfig.cmake:\n%s", out);
  out = run_ok("soname", "readelf -d '%s/" LUMEN_INSTALL_LIBDIR "/liblumen.so' | grep SONAME", prefix);
  cr_assert(strstr(out, "[liblumen.so." LUMEN_SOVERSION "]"), "SONAME is not liblumen.so." LUMEN_SOVERSION ":\n%s", out);
  /* grep exits 1 when it finds nothing: that is the pass. The feature macros (LUMEN_HAVE_*) and
   * the CUDA/OpenCL header directories are the build's own business, not the package's. */
  run_ok("grep for build paths", "! grep -rn -e '%s' -e '%s' '%s/" LUMEN_INSTALL_LIBDIR "/pkgconfig' '%s/" LUMEN_INSTALL_LIBDIR
         "/cmake' '%s/include'",
         LUMEN_SOURCE_DIR, LUMEN_BINARY_DIR, prefix, prefix, prefix);
  run_ok("grep for feature macros", "! grep -rn -e LUMEN_HAVE_ -e LUMEN_CUDA_ROOT -e INTERFACE_COMPILE_DEFINITIONS '%s/" LUMEN_INSTALL_LIBDIR
         "/pkgconfig' '%s/" LUMEN_INSTALL_LIBDIR "/cmake'", prefix, prefix);
}

/* The out-of-tree project in examples/project, using only the prefix: built with CMake and with
 * pkg-config, its program trains catch.c through the C API, its own rltrain (lm_rltrain with
 * catch registered) trains and evaluates it by name; the installed rltrain trains the
 * same file as a plugin (compiled against the prefix's headers), and evaluates the checkpoint
 * from another directory. */
Test(install, the_example_project_builds_and_its_env_trains_as_a_program_and_as_a_plugin, .timeout = LM_TIMEOUT(300)) {
  run_ok("copy the example", "cp -r '%s/examples/project' project", LUMEN_SOURCE_DIR);
  run_ok("configure the example",
         "'%s' -S project -B project-build -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER='%s' -DCMAKE_C_FLAGS='%s'"
         " -DCMAKE_EXE_LINKER_FLAGS='%s'",
         LUMEN_CMAKE_COMMAND, LUMEN_C_COMPILER, LUMEN_SANITIZE_FLAGS, LUMEN_SANITIZE_FLAGS);
  run_ok("build the example", "'%s' --build project-build", LUMEN_CMAKE_COMMAND);
  char *out = run_ok("run the example's program", "project-build/train_catch catch.ckpt");
  cr_assert(strstr(out, "catch:") && strstr(out, "wrote catch.ckpt"), "%s", out);
  out = run_ok("train through the example's own rltrain (lm_rltrain)",
               "project-build/catch_cli catch --device cpu --quiet --total-steps 4096 --out run-cli");
  out = run_ok("evaluate through it", "project-build/catch_cli eval run-cli --episodes 3");
  cr_assert(strstr(out, "catch: 3 episodes"), "%s", out);
  run_ok("build the example with pkg-config",
         "'%s' %s project/catch.c project/train_catch.c $(pkg-config --cflags --libs lumen) -o train_pc",
         LUMEN_C_COMPILER, LUMEN_SANITIZE_FLAGS);
  out = run_ok("run the pkg-config build", "LD_LIBRARY_PATH='%s/lib' ./train_pc pc.ckpt", prefix);
  cr_assert(strstr(out, "wrote pc.ckpt"), "%s", out);
  out = run_ok("train the env file as a plugin",
               "'%s/bin/rltrain' project/catch.c --device cpu --quiet --total-steps 8192 --out run", prefix);
  out = run_ok("eval from another directory", "mkdir -p elsewhere && cd elsewhere && '%s/bin/rltrain' eval ../run "
               "--episodes 5", prefix);
  cr_assert(strstr(out, "catch: 5 episodes"), "%s", out);
}
