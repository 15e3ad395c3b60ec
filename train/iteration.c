/* train/iteration.c — compile-only (train/iteration.h): the trainer's graphs through the
 * compiler's shared front (compile.h), rendered in the target's dialect and compiled by NVRTC,
 * the OpenCL platform or the system C compiler, one translation unit per graph. */
#include "iteration.h"

#include <stdio.h>
#include <string.h>

#include "cc.h"
#include "compile.h"
#include "core.h"
#include "gpu.h"
#include "lumen/env.h"
#include "lumen/train.h"
#include "nvrtc.h"
#include "render.h"
#include "validate.h"

static const char *const target_names[LM_TARGET_COUNT] = {"cuda", "opencl", "c"};

lm_status lm_target_parse(const char *name, lm_target *out) {
  for (int i = 0; i < LM_TARGET_COUNT; i++)
    if (name && !strcmp(name, target_names[i])) {
      *out = (lm_target)i;
      return LM_OK;
    }
  return lm_fail(LM_ERR_INVALID, "unknown target '%s' (targets: cuda, opencl, c)", name ? name : "(null)");
}

const char *lm_target_name(lm_target t) { return (unsigned)t < LM_TARGET_COUNT ? target_names[t] : "unknown"; }

void lm_compile_report_free(lm_compile_report *r) {
  if (!r) return;
  lm_free(r->kernels);
  memset(r, 0, sizeof *r);
}

/* The scan info of a trainer graph (over the symbol "T"), as lm_program_new_scan makes it. */
static lm_status scan_of(const lm_train_graph *tg, uint8_t *per_step, lm_scan_info *scan) {
  lm_graph_t *g = tg->g;
  *scan = (lm_scan_info){0};
  if (!tg->scan) return LM_OK;
  int sym = lm_x_symbol(&g->x, "T", 1);
  if (sym < 0) return lm_fail(LM_ERR_NOMEM, "%s: no room for the symbol T", tg->name);
  for (int i = 0; i < tg->n_per_step; i++) {
    size_t k = 0;
    while (k < g->ninputs && strcmp(g->inputs[k].name, tg->per_step[i])) k++;
    if (k == g->ninputs) return lm_fail(LM_ERR_INVALID, "%s: per-step input '%s' is no input", tg->name, tg->per_step[i]);
    per_step[k] = 1;
  }
  *scan = (lm_scan_info){1, sym, tg->reverse, per_step};
  return LM_OK;
}

static lm_status add_report(lm_compile_report *r, size_t *cap, const char *graph, const char *kernel) {
  if (r->n == *cap) {
    size_t nc = *cap ? 2 * *cap : 32;
    lm_kernel_report *k = lm_realloc(r->kernels, nc * sizeof *k);
    if (!k) return LM_ERR_NOMEM;
    r->kernels = k;
    *cap = nc;
  }
  lm_kernel_report *k = &r->kernels[r->n++];
  memset(k, 0, sizeof *k);
  snprintf(k->graph, sizeof k->graph, "%s", graph);
  snprintf(k->kernel, sizeof k->kernel, "%s", kernel);
  k->registers = k->stack_bytes = k->spill_stores = k->spill_loads = k->shared_bytes = -1;
  return LM_OK;
}

typedef struct compilers {
  lm_nvrtc *nv;
  lm_cc *cc;
} compilers;

/* Compiles one rendered plan; fills the kernels' reports. */
static lm_status compile_plan(compilers *cs, lm_target target, const char *arch, const char *what, const char *graph,
                              const lm_plan *plan, lm_compile_report *r, size_t *cap, char *desc, size_t desc_cap) {
  static const lm_dialect dialect[LM_TARGET_COUNT] = {LM_DIALECT_CUDA, LM_DIALECT_OPENCL, LM_DIALECT_C};
  char *src = lm_render_plan(plan, dialect[target]);
  if (!src) return LM_ERR_INVALID;
  lm_dump_source(target_names[target], target == LM_TARGET_CUDA ? "cu" : target == LM_TARGET_OPENCL ? "cl" : "c", src,
                 plan);
  lm_status st = LM_OK;
  lm_cubin cubin = {0};
  if (target == LM_TARGET_CUDA) st = lm_nvrtc_compile(cs->nv, src, what, arch, &cubin);
  else if (target == LM_TARGET_OPENCL) st = lm_opencl_build_check(src, what, desc, desc_cap);
  else {
    lm_cc_lib *lib = NULL;
    st = lm_cc_build(cs->cc, src, &lib);
    if (lib) lm_cc_lib_close(lib);
  }
  for (size_t i = 0; i < plan->nkernels && st == LM_OK; i++) {
    char name[48];
    lm_render_entry_name(&plan->kernels[i], name, sizeof name);
    if ((st = add_report(r, cap, graph, name)) != LM_OK) break;
    r->kernels[r->n - 1].group = plan->kernels[i].group;
    if (target != LM_TARGET_CUDA) continue;
    lm_ptxas_info pi;
    if ((st = lm_ptxas_info_parse(cubin.log, name, &pi)) != LM_OK) break;
    lm_kernel_report *k = &r->kernels[r->n - 1];
    k->registers = pi.registers;
    k->stack_bytes = pi.stack_bytes;
    k->spill_stores = pi.spill_stores;
    k->spill_loads = pi.spill_loads;
    k->shared_bytes = pi.shared_bytes;
  }
  lm_cubin_free(&cubin);
  lm_free(src);
  return st;
}

lm_status lm_compile_iteration(const char *env, lm_target target, const char *arch, lm_compile_report *out) {
  memset(out, 0, sizeof *out);
  if ((unsigned)target >= LM_TARGET_COUNT) return lm_fail(LM_ERR_INVALID, "compile: bad target %d", (int)target);
  if (!arch || !*arch) arch = "sm_90";
  int sm = 0;
  if (target == LM_TARGET_CUDA && (sscanf(arch, "sm_%d", &sm) != 1 || sm < 10))
    return lm_fail(LM_ERR_INVALID, "compile: --arch wants sm_XX (e.g. sm_90), got '%s'", arch);
  const lm_env_spec *spec = lm_env_find(env);
  if (!spec) return LM_ERR_INVALID;
  compilers cs = {0};
  lm_status st = LM_OK;
  if (target == LM_TARGET_CUDA) {
    if ((st = lm_nvrtc_open(&cs.nv)) != LM_OK) return st;
    if (!lm_nvrtc_supports(cs.nv, sm)) {
      st = lm_fail(LM_ERR_UNSUPPORTED, "compile: %s cannot make CUBIN for %s", lm_nvrtc_describe(cs.nv), arch);
      lm_nvrtc_close(cs.nv);
      return st;
    }
    snprintf(out->compiler, sizeof out->compiler, "%s for %s", lm_nvrtc_describe(cs.nv), arch);
  } else if (target == LM_TARGET_C) {
    if ((st = lm_cc_open(&cs.cc)) != LM_OK) return st;
    snprintf(out->compiler, sizeof out->compiler, "%s", lm_cc_describe(cs.cc));
  }
  lm_ppo_config cfg = lm_ppo_defaults(spec);
  lm_train_graph tg[8];
  int ng = lm_trainer_graphs(spec, &cfg, tg, (int)LM_COUNTOF(tg));
  if (ng < 0) st = LM_ERR_INVALID;
  size_t cap = 0;
  for (int i = 0; i < ng && st == LM_OK; i++) {
    lm_graph_t *g = tg[i].g;
    uint8_t *per_step = lm_calloc(g->ninputs + 1, 1);
    lm_scan_info scan;
    lm_compiled comp = {0};
    char what[96];
    snprintf(what, sizeof what, "%s/%s", spec->name, tg[i].name);
    if (!per_step) st = LM_ERR_NOMEM;
    if (st == LM_OK) st = lm_graph_validate(g);
    if (st == LM_OK) st = scan_of(&tg[i], per_step, &scan);
    lm_compile_options co = {.interchange = target == LM_TARGET_C, .stage = target == LM_TARGET_C,
                             .lanes = target == LM_TARGET_C ? LM_CPU_SCAN_LANES : 0,
                             .join = target == LM_TARGET_C}; /* as the cpu backend */
    lm_gpu_options go; /* as the backends schedule them: 48 KiB of static shared memory on CUDA, */
    lm_gpu_options_default(&go, target == LM_TARGET_CUDA ? 48 * 1024 : 32 * 1024); /* OpenCL's minimum */
    if (target == LM_TARGET_CUDA) go.warp = 32;
    if (target != LM_TARGET_C) co.gpu = &go; /* LUMEN_GPU_SCHEDULE=0 switches it off in the table */
    if (st == LM_OK) st = lm_compile_ex(g, &scan, &co, &comp);
    if (st == LM_OK)
      st = compile_plan(&cs, target, arch, what, tg[i].name, comp.plan, out, &cap, out->compiler, sizeof out->compiler);
    lm_compiled_free(&comp);
    lm_free(per_step);
  }
  for (int i = 0; i < ng; i++) lm_graph_free(tg[i].g);
  if (cs.nv) lm_nvrtc_close(cs.nv);
  if (cs.cc) lm_cc_close(cs.cc);
  return st;
}
