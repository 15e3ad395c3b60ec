/* Tests for the compile-only path of `rltrain compile ENV --target cuda` (train/iteration.h), which
 * needs NVRTC but no GPU:
 * - for every registered env, every kernel of one training iteration (rollout scan, bootstrap
 *   prep, GAE scan, minibatch update) compiles to CUBIN for sm_90, ptxas reports a register
 *   count for each, and the rollout's kernels spill nothing to local memory;
 * - a compile error carries the NVRTC log and the source, and names a file that keeps both;
 * - the ptxas -v parser on a log as NVRTC writes it; the CUBIN cache returns what NVRTC made;
 * - bad targets and architectures are refused, naming them;
 * - on the c target (no NVRTC needed), CartPole's minibatch update stays within its kernel count.
 * Skipped, saying so, when libnvrtc cannot be loaded. */
#define _DEFAULT_SOURCE /* mkdtemp, setenv */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lumen/lumen.h"
#include "nvrtc.h"
#include "../train/iteration.h"
#include "support/timeout.h"

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

static lm_nvrtc *need_nvrtc(void) {
  lm_nvrtc *nv = NULL;
  if (lm_nvrtc_open(&nv) != LM_OK) cr_skip_test("%s", lm_last_error());
  return nv;
}

/* ================================================================ every env */

ParameterizedTestParameters(compile_cuda, every_kernel_of_the_env_compiles_to_cubin_and_the_rollout_does_not_spill) {
  static int index[64];
  int n = lm_env_count() < 64 ? lm_env_count() : 64;
  for (int i = 0; i < n; i++) index[i] = i;
  return cr_make_param_array(int, index, (size_t)n);
}

ParameterizedTest(int *i, compile_cuda, every_kernel_of_the_env_compiles_to_cubin_and_the_rollout_does_not_spill,
                  .timeout = LM_TIMEOUT(120)) {
  lm_nvrtc_close(need_nvrtc());
  const char *env = lm_env_at(*i)->name;
  lm_compile_report r;
  lm_status st = lm_compile_iteration(env, LM_TARGET_CUDA, "sm_90", &r);
  cr_assert_eq(st, LM_OK, "%s: %s: %s", env, lm_status_name(st), lm_last_error());
  cr_assert(strstr(r.compiler, "NVRTC") && strstr(r.compiler, "sm_90"), "compiler: %s", r.compiler);
  static const char *const graphs[] = {"rollout", "prep", "gae", "update"};
  int per_graph[4] = {0};
  for (size_t k = 0; k < r.n; k++) {
    const lm_kernel_report *kr = &r.kernels[k];
    for (int gi = 0; gi < 4; gi++) per_graph[gi] += !strcmp(kr->graph, graphs[gi]);
    cr_assert(kr->registers > 0 && kr->registers <= 255, "%s/%s/%s: %d registers", env, kr->graph, kr->kernel,
              kr->registers);
    cr_assert(kr->spill_stores >= 0 && kr->spill_loads >= 0 && kr->stack_bytes >= 0, "%s/%s: no ptxas figures", env,
              kr->kernel);
    if (!strcmp(kr->graph, "rollout"))
      cr_expect(kr->spill_stores == 0 && kr->spill_loads == 0,
                "%s: rollout kernel %s spills (%d bytes stored, %d loaded; %d registers, %d bytes stack)", env,
                kr->kernel, kr->spill_stores, kr->spill_loads, kr->registers, kr->stack_bytes);
  }
  for (int gi = 0; gi < 4; gi++) cr_assert(per_graph[gi] > 0, "%s: no kernel for the %s graph", env, graphs[gi]);
  lm_compile_report_free(&r);
}

/* ================================================================ errors */

Test(compile_cuda, an_nvrtc_error_carries_the_log_and_the_source_and_keeps_both_in_a_file) {
  lm_nvrtc *nv = need_nvrtc();
  const char *src = "extern \"C\" __global__ void broken(float *b) { b[0] = undeclared_name_42; }\n";
  lm_cubin c;
  lm_status st = lm_nvrtc_compile(nv, src, "broken.cu", "sm_90", &c);
  cr_assert_eq(st, LM_ERR_COMPILE, "%s: %s", lm_status_name(st), lm_last_error());
  cr_assert_null(c.data);
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, "broken.cu") && strstr(msg, "---- log ----") && strstr(msg, "undeclared_name_42") &&
                strstr(msg, "---- source ----") && strstr(msg, "__global__ void broken"),
            "the message lacks the log or the source: %s", msg);
  const char *at = strstr(msg, "source in ");
  cr_assert(at, "no file named: %s", msg);
  char path[1024];
  cr_assert_eq(sscanf(at + 10, "%1023s", path), 1);
  FILE *f = fopen(path, "r");
  cr_assert(f, "the named file %s does not exist", path);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  cr_assert(strstr(text, src) && strstr(text, "undeclared_name_42") && strstr(text, "error"),
            "%s lacks the log or the source:\n%s", path, text);
  unlink(path);
  lm_nvrtc_close(nv);
}

Test(compile_cuda, a_good_program_compiles_for_several_architectures_with_ptxas_figures) {
  lm_nvrtc *nv = need_nvrtc();
  const char *src = "extern \"C\" __global__ void twice(float *b, long long total) {\n"
                    "  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                    "  if (i < total) b[i] = 2.0f * b[i];\n"
                    "}\n";
  static const char *const archs[] = {"sm_80", "sm_90"};
  for (size_t a = 0; a < 2; a++) {
    if (!lm_nvrtc_supports(nv, atoi(archs[a] + 3))) continue;
    lm_cubin c;
    OK(lm_nvrtc_compile(nv, src, "twice.cu", archs[a], &c));
    cr_assert(c.size > 4 && !memcmp(c.data, "\177ELF", 4), "%s: the CUBIN is not an ELF image", archs[a]);
    lm_ptxas_info pi;
    OK(lm_ptxas_info_parse(c.log, "twice", &pi));
    cr_assert(pi.registers > 0 && pi.spill_stores == 0, "%s: %d registers, %d spill bytes", archs[a], pi.registers,
              pi.spill_stores);
    lm_cubin_free(&c);
  }
  lm_nvrtc_close(nv);
}

Test(compile_cuda, bad_targets_and_architectures_are_refused_naming_them) {
  lm_target t;
  cr_assert_eq(lm_target_parse("vulkan", &t), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "vulkan") && strstr(lm_last_error(), "cuda"), "%s", lm_last_error());
  OK(lm_target_parse("opencl", &t));
  cr_assert_eq(t, LM_TARGET_OPENCL);
  lm_compile_report r;
  cr_assert_eq(lm_compile_iteration("cartpole", LM_TARGET_CUDA, "compute_90", &r), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "compute_90"), "%s", lm_last_error());
  cr_assert_eq(r.n, 0);
  cr_assert_neq(lm_compile_iteration("no-such-env", LM_TARGET_CUDA, NULL, &r), LM_OK);
  cr_assert(strstr(lm_last_error(), "no-such-env"), "%s", lm_last_error());
}

/* ================================================================ the c target */

/* The kernels of CartPole's PPO minibatch update on the c target (as the cpu backend builds
 * them): 62 before elementwise epilogues and one-thread joins (compiler/schedule.c), 27 with
 * them, 11 with chains of point-local kernels, 8 with stacked domains: issue 24's bound. A pass
 * that stops firing is caught. */
Test(compile_c, the_cartpole_update_takes_at_most_8_kernels_on_the_c_target, .timeout = LM_TIMEOUT(120)) {
  lm_compile_report r;
  lm_status st = lm_compile_iteration("cartpole", LM_TARGET_C, NULL, &r);
  if (st == LM_ERR_UNSUPPORTED) cr_skip_test("no C compiler: %s", lm_last_error());
  cr_assert_eq(st, LM_OK, "%s: %s", lm_status_name(st), lm_last_error());
  int update = 0, rollout = 0;
  for (size_t k = 0; k < r.n; k++) {
    update += !strcmp(r.kernels[k].graph, "update");
    rollout += !strcmp(r.kernels[k].graph, "rollout");
  }
  cr_log_info("cartpole on c: %d update kernels, %d rollout kernels, %zu in all", update, rollout, r.n);
  cr_assert_eq(rollout, 1, "the rollout is one fused scan: %d kernels", rollout);
  cr_assert(update >= 1 && update <= 8, "the minibatch update took %d kernels", update);
  lm_compile_report_free(&r);
}

/* ================================================================ ptxas -v */

Test(compile_cuda, the_ptxas_parser_reads_each_entry_and_only_its_own_lines) {
  const char *log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'k1_add' for 'sm_90'\n"
      "ptxas info    : Function properties for k1_add\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 18 registers, used 0 barriers, 384 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'scan' for 'sm_90'\n"
      "ptxas info    : Function properties for scan\n"
      "    1072 bytes stack frame, 776 bytes spill stores, 772 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 0 barriers, 1072 bytes cumulative stack size, 384 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'k2' for 'sm_90'\n"
      "ptxas info    : Used 8 registers, used 0 barriers, 368 bytes cmem[0]\n";
  lm_ptxas_info pi;
  OK(lm_ptxas_info_parse(log, "k1_add", &pi));
  cr_assert(pi.registers == 18 && pi.stack_bytes == 0 && pi.spill_stores == 0 && pi.spill_loads == 0);
  OK(lm_ptxas_info_parse(log, "scan", &pi));
  cr_assert(pi.registers == 255 && pi.stack_bytes == 1072 && pi.spill_stores == 776 && pi.spill_loads == 772,
            "scan: %d %d %d %d", pi.registers, pi.stack_bytes, pi.spill_stores, pi.spill_loads);
  OK(lm_ptxas_info_parse(log, "k2", &pi)); /* no properties line: nothing on the stack */
  cr_assert(pi.registers == 8 && pi.stack_bytes == 0 && pi.spill_stores == 0);
  cr_assert_eq(lm_ptxas_info_parse(log, "k1", &pi), LM_ERR_INVALID, "'k1' is a prefix of an entry, not an entry");
  cr_assert(strstr(lm_last_error(), "k1"), "%s", lm_last_error());
}

/* ================================================================ the CUBIN cache */

Test(compile_cuda, a_second_compile_of_the_same_source_comes_from_the_cache_with_its_log) {
  lm_nvrtc *nv = need_nvrtc();
  char dir[] = "/tmp/lumen-test-nvrtc-XXXXXX";
  cr_assert(mkdtemp(dir));
  setenv("LUMEN_CACHE_DIR", dir, 1);
  const char *src = "extern \"C\" __global__ void cached(float *b) { b[threadIdx.x] += 1.0f; }\n";
  lm_cubin a, b;
  OK(lm_nvrtc_compile(nv, src, "cached.cu", "sm_90", &a));
  char path[1200];
  snprintf(path, sizeof path, "%s/nvrtc", dir);
  DIR *d = opendir(path);
  cr_assert(d, "no cache directory %s", path);
  int files = 0;
  for (struct dirent *e; (e = readdir(d));) files += e->d_name[0] != '.';
  closedir(d);
  cr_assert_eq(files, 2, "%d files in %s, expected a .cubin and a .log", files, path);
  OK(lm_nvrtc_compile(nv, src, "cached.cu", "sm_90", &b));
  cr_assert(a.size == b.size && !memcmp(a.data, b.data, a.size), "the cached CUBIN differs");
  cr_assert_str_eq(a.log, b.log);
  lm_ptxas_info pi;
  OK(lm_ptxas_info_parse(b.log, "cached", &pi));
  lm_cubin_free(&a);
  lm_cubin_free(&b);
  unsetenv("LUMEN_CACHE_DIR");
  char cmd[1300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
  lm_nvrtc_close(nv);
}
