/* train/cli_compile.c — `rltrain compile ENV --target cuda|opencl|c [--arch sm_90]`: builds every
 * kernel of one training iteration of ENV for a target without running it (the work is
 * lm_compile_iteration, train/iteration.h) and prints one row per kernel: graph, kernel,
 * registers and spill bytes (cuda: from ptxas), stack frame, then the kernels per graph.
 * `rltrain compile --passes` lists the compiler's pass table (compiler/compile.c). Exit 0 when
 * every kernel compiled, 1 on a compile failure (with the compiler's log), 2 on bad usage. */
#include <stdio.h>
#include <string.h>

#include "iteration.h"
#include "cli.h"
#include "compiler/compile.h"
#include "compiler/msl_check.h"
#include "lumen/env.h"
#include "lumen/lumen.h"

static int usage(FILE *out, int code) {
  fputs("usage: rltrain compile ENV --target cuda|opencl|metal|c [--arch sm_XX]\n"
        "       rltrain compile --passes\n"
        "\n"
        "Builds every kernel of one training iteration of ENV (rollout scan, bootstrap prep, GAE\n"
        "scan, minibatch update; PPO defaults for ENV) and compiles it for the target:\n"
        "  cuda    NVRTC to CUBIN for --arch (default sm_90); no GPU needed. Prints each kernel's\n"
        "          registers, stack frame and spill bytes from ptxas.\n"
        "  opencl  clBuildProgram on the OpenCL device the opencl backend picks\n"
        "          ($LUMEN_OPENCL_DEVICE); needs an OpenCL platform (e.g. PoCL).\n"
        "  c       the system C compiler the cpu backend uses.\n"
        "--passes lists the compiler's passes in the order they run: name, dialects, precondition,\n"
        "the environment variable that switches one off (for experiments), and what it does.\n"
        "Exit status: 0 all kernels compiled, 1 a compile failed (its log is printed), 2 bad usage\n"
        "(an unknown env, target or --arch).\n",
        out);
  return code;
}

static void cell(char *buf, size_t cap, int v) {
  if (v < 0) snprintf(buf, cap, "-");
  else snprintf(buf, cap, "%d", v);
}

/* --target metal: every kernel of the iteration rendered as MSL and validated on this
 * machine through the C++ shim (compiled, and barrier-free kernels run; see docs/METAL.md). */
static int compile_metal(const char *env_name) {
  const lm_env_spec *env = lm_env_find(env_name);
  if (!env) {
    fprintf(stderr, "rltrain compile: %s\n", lm_last_error());
    return 2;
  }
  lm_ppo_config cfg = lm_ppo_defaults(env);
  lm_train_graph graphs[4];
  int n = lm_trainer_graphs(env, &cfg, graphs, 4);
  if (n < 0) {
    fprintf(stderr, "rltrain compile: %s\n", lm_last_error());
    return 1;
  }
  int rc = 0;
  for (int i = 0; i < n; i++) {
    char log[4096] = "";
    lm_status st = lm_msl_check_graph(graphs[i].g, graphs[i].scan ? "T" : NULL, graphs[i].reverse,
                                      graphs[i].per_step, graphs[i].n_per_step, log, sizeof log);
    printf("%-8s %s: %s\n", graphs[i].name, st == LM_OK ? "ok" : "FAILED", log);
    if (st != LM_OK) rc = 1;
    lm_graph_free(graphs[i].g);
  }
  return rc;
}

/* --passes: the pass table */
static int list_passes(void) {
  printf("%-15s %-12s %-55s %-22s %s\n", "pass", "dialects", "when", "off", "what");
  for (int i = 0; lm_compile_pass(i); i++) {
    const lm_pass_info *p = lm_compile_pass(i);
    printf("%-15s %-12s %-55s %-22s %s\n", p->name, p->dialects, p->when, p->off ? p->off : "-", p->what);
  }
  return 0;
}

int lm_cli_compile(int argc, char **argv) {
  const char *env = NULL, *target_name = NULL, *arch = NULL;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout, 0);
    if (!strcmp(a, "--passes")) {
      if (argc != 1) {
        fprintf(stderr, "rltrain compile: --passes takes no ENV or other options\n");
        return usage(stderr, 2);
      }
      return list_passes();
    }
    if (!strcmp(a, "--target") || !strcmp(a, "--arch")) {
      if (i + 1 >= argc) {
        fprintf(stderr, "rltrain compile: %s needs a value\n", a);
        return usage(stderr, 2);
      }
      if (!strcmp(a, "--target")) target_name = argv[++i];
      else arch = argv[++i];
    } else if (!strncmp(a, "--target=", 9)) target_name = a + 9;
    else if (!strncmp(a, "--arch=", 7)) arch = a + 7;
    else if (a[0] == '-') {
      fprintf(stderr, "rltrain compile: unknown option '%s'\n", a);
      return usage(stderr, 2);
    } else if (!env) env = a;
    else {
      fprintf(stderr, "rltrain compile: one ENV only ('%s' and '%s')\n", env, a);
      return usage(stderr, 2);
    }
  }
  if (!env || !target_name) {
    fprintf(stderr, "rltrain compile: %s\n", !env ? "which ENV? (rltrain list shows them)" : "--target is required");
    return usage(stderr, 2);
  }
  const lm_env_spec *spec; /* by name, or an env file (compiled and registered under its name) */
  if (lm_env_resolve(env, &spec) != LM_OK) {
    fprintf(stderr, "rltrain compile: %s\n", lm_last_error());
    return 2;
  }
  env = spec->name;
  if (!strcmp(target_name, "metal")) return compile_metal(env);
  lm_target target;
  if (lm_target_parse(target_name, &target) != LM_OK) {
    fprintf(stderr, "rltrain compile: %s\n", lm_last_error());
    return 2;
  }
  if (arch && target != LM_TARGET_CUDA) {
    fprintf(stderr, "rltrain compile: --arch applies to --target cuda only\n");
    return 2;
  }
  if (!lm_env_find(env)) {
    fprintf(stderr, "rltrain compile: %s\n", lm_last_error());
    return 2;
  }
  lm_compile_report r;
  lm_status st = lm_compile_iteration(env, target, arch, &r);
  if (r.compiler[0]) printf("%s: %s kernels, %s\n", env, lm_target_name(target), r.compiler);
  if (r.n) {
    printf("%-8s %-34s %9s %11s %12s %11s %12s %5s\n", "graph", "kernel", "registers", "stack bytes", "spill stores",
           "spill loads", "shared bytes", "group");
    for (size_t i = 0; i < r.n; i++) {
      const lm_kernel_report *k = &r.kernels[i];
      char reg[16], stack[16], ss[16], sl[16], sh[16], grp[16];
      cell(reg, sizeof reg, k->registers);
      cell(stack, sizeof stack, k->stack_bytes);
      cell(ss, sizeof ss, k->spill_stores);
      cell(sl, sizeof sl, k->spill_loads);
      cell(sh, sizeof sh, k->shared_bytes);
      cell(grp, sizeof grp, k->group > 0 ? k->group : -1);
      printf("%-8s %-34s %9s %11s %12s %11s %12s %5s\n", k->graph, k->kernel, reg, stack, ss, sl, sh, grp);
    }
  }
  size_t n = r.n;
  if (n) { /* kernels per graph, in the order the graphs come */
    printf("kernels per graph:");
    for (size_t i = 0; i < r.n; i++) {
      if (i && !strcmp(r.kernels[i - 1].graph, r.kernels[i].graph)) continue;
      int c = 0;
      for (size_t j = i; j < r.n && !strcmp(r.kernels[j].graph, r.kernels[i].graph); j++) c++;
      printf(" %s %d", r.kernels[i].graph, c);
    }
    printf("\n");
  }
  lm_compile_report_free(&r);
  if (st != LM_OK) {
    fprintf(stderr, "rltrain compile: %s: %s\n", lm_status_name(st), lm_last_error());
    return lm_cli_exit(st);
  }
  printf("%zu kernels compiled\n", n);
  return 0;
}
