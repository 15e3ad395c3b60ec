/* compiler/compile.c — the compiler's pipeline as one table of named passes (canonicalise, lower,
 * the loop-IR rewrites, scan fusion, lanes, GPU work-groups), and generated sources dumped. */
#include "compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lumen/search.h"
#include "memplan.h"
#include "gpu.h"
#include "passes.h"
#include "search/search.h"
#include "search/term.h"

lm_status lm_compile(const lm_graph_t *g, const lm_scan_info *scan, lm_compiled *out) {
  return lm_compile_ex(g, scan, NULL, out);
}

/* ---------------------------------------------------------------- the pass table */

/* What a pass sees: the plan it rewrites and why it is being compiled. */
typedef struct pass_ctx {
  lm_plan *plan;
  const lm_scan_info *scan;
  const lm_compile_options *opts;
  int lanes_headed; /* a scan lowered for SIMD lanes: no interchange, no search */
  int stepwise;     /* a scan's step plan that runs T times (its step could not be fused) */
  int lanes;        /* a fused scan's envs per SIMD block (opts->lanes, or a variant's) */
  uint64_t off;     /* rows of the table switched off (bit i: row i), a variant's */
} pass_ctx;

static int scanning(const pass_ctx *c) { return c->scan && c->scan->active; }
static int lane_form(const lm_kernel *k) {
  for (size_t l = 0; l < k->nloops; l++)
    if (k->loops[l].kind == LM_L_LANES) return 1;
  return 0;
}

static int when_search(const pass_ctx *c) {
  const lm_search_options *o = c->opts->search;
  return !c->lanes_headed && o && (o->budget_s > 0 || (o->cache_only && o->use_cache)) && !scanning(c);
}
static int when_interchange(const pass_ctx *c) {
  return !c->lanes_headed && c->opts->interchange && !when_search(c);
}
/* (a step plan that runs T times is a plan like any other for these) */
static int when_cpu_plan(const pass_ctx *c) { return c->opts->join && (!scanning(c) || c->stepwise); }
static int when_always(const pass_ctx *c) {
  (void)c;
  return 1;
}
static int when_lanes(const pass_ctx *c) { return c->lanes > 1; }
static int when_gpu(const pass_ctx *c) { return c->opts->gpu != NULL; }
static int when_finite(const pass_ctx *c) { return c->plan->g->finite; }

static int run_search(pass_ctx *c) {
  (void)lm_search_plan_on(c->plan, NULL, c->opts->search, NULL, c->opts->device);
  return 0;
}
static int run_interchange(pass_ctx *c) { return lm_schedule_interchange(c->plan, c->opts->stage); }
static int run_epilogue(pass_ctx *c) { return lm_schedule_epilogue(c->plan); }
static int run_merge(pass_ctx *c) { return lm_schedule_merge(c->plan, scanning(c) ? 1 : LM_MERGE_BACK); }
static int run_join(pass_ctx *c) { return lm_schedule_join(c->plan); }
static int run_jam(pass_ctx *c) {
  const char *e = getenv("LUMEN_JAM"); /* points per iteration, fixed, for experiments */
  return lm_schedule_jam(c->plan, e && *e ? atoi(e) : 0);
}
static int run_chain(pass_ctx *c) { return lm_schedule_chain(c->plan); }
static int run_stack(pass_ctx *c) { return lm_schedule_stack(c->plan); }
static int when_plain_cpu(const pass_ctx *c) { return when_cpu_plan(c) && !scanning(c); }
static int when_partial(const pass_ctx *c) { return when_plain_cpu(c) && c->plan->g->contract; }
static int run_partial(pass_ctx *c) { return lm_schedule_partial(c->plan); }
static int run_assign(pass_ctx *c) { return lm_plan_assign_in_place(c->plan); }
static int run_lanes(pass_ctx *c) { return lm_scan_lanes(c->plan, c->lanes); }
static int on_lane_kernels(pass_ctx *c, int (*f)(lm_kernel *, lm_exprs *)) {
  int n = 0;
  for (size_t i = 0; i < c->plan->nkernels; i++) {
    if (!lane_form(&c->plan->kernels[i])) continue;
    int r = f(&c->plan->kernels[i], &c->plan->g->x);
    if (r < 0) return r;
    n += r;
  }
  if (n) lm_plan_liveness(c->plan);
  return n;
}
static int run_inplace(pass_ctx *c) { return on_lane_kernels(c, lm_lanes_inplace); }
static int run_split(pass_ctx *c) { return on_lane_kernels(c, lm_lanes_split); }
static int run_columns(pass_ctx *c) { return on_lane_kernels(c, lm_lanes_columns); }
static int run_lazy(pass_ctx *c) { return on_lane_kernels(c, lm_lanes_lazy); }
static int run_index(pass_ctx *c) { return on_lane_kernels(c, lm_lanes_index); }
static int run_gpu(pass_ctx *c) { return lm_schedule_gpu(c->plan, c->opts->gpu); }
/* Marks the kernels of a graph that promises finite values; render.c prints them so, and on
 * the cpu their zeros fold (columns.c, lm_fold_finite). Not a rule: the search's rewrites hold
 * for every input, and these hold only for finite ones. */
static int run_finite(pass_ctx *c) {
  int n = 0;
  for (size_t i = 0; i < c->plan->nkernels; i++) {
    c->plan->kernels[i].finite = 1;
    int r = c->opts->join ? lm_fold_finite(&c->plan->kernels[i], &c->plan->g->x) : 0; /* the cpu */
    if (r < 0) return r;
    n += r;
  }
  if (n) lm_plan_liveness(c->plan);
  return (int)c->plan->nkernels;
}

enum { FRONT, PLAN, SCAN, DEVICE }; /* where lm_compile_ex runs a row */

typedef struct pass {
  lm_pass_info info;
  int stage;
  int (*when)(const pass_ctx *);
  int (*run)(pass_ctx *); /* how many changed; < 0: out of memory (NULL: lm_compile_ex's own) */
} pass;

/* Every step from a graph to the plan a backend renders, in order. FRONT rows are
 * lm_compile_ex's own; PLAN rows rewrite each lowered plan; SCAN rows a fused scan's plan;
 * DEVICE rows come last, with the device's limits. A row runs when its precondition holds and
 * its switch (an environment variable, for experiments) is not set. */
static const pass passes[] = {
    {{"canonicalise", "all", "always", NULL,
      "dead code, CSE, constant folding, exact identities, to a fixed point (passes.c)"}, FRONT, NULL, NULL},
    {{"lower", "all", "always", NULL,
      "the default schedule: kernels for materialised nodes, the rest inlined, statements hoisted (lower.c)"},
     FRONT, NULL, NULL},
    {{"search", "all", "a search budget (or a tuning cache to apply)", "LUMEN_SEARCH_BUDGET=0",
      "e-graph search over each hot kernel, candidates timed on the device (search/); a fused scan's kernel "
      "(cpu): whole variants of the SCAN rows timed, the lanes narrower or one row off (run_scan_rows)"},
     PLAN, when_search, run_search},
    {{"interchange", "c", "a vector cpu, not searched, not a scan headed for lanes", "LUMEN_NO_INTERCHANGE",
      "reductions in i-k-j order over local rows, staged operands, serial loops split at divisions (schedule.c)"},
     PLAN, when_interchange, run_interchange},
    {{"epilogue", "c", "a cpu plan (a scan: its step plan)", "LUMEN_NO_EPILOGUE",
      "an elementwise kernel reading another's stores point for point runs inside it (schedule.c)"},
     PLAN, when_cpu_plan, run_epilogue},
    {{"merge", "all", "always", "LUMEN_NO_MERGE",
      "independent kernels over one parallel domain become one, equal statements shared (schedule.c)"},
     PLAN, when_always, run_merge},
    {{"join", "c", "a cpu plan (a scan: its step plan)", "LUMEN_NO_JOIN",
      "consecutive kernels that would each run on one thread become one serial kernel (schedule.c)"},
     PLAN, when_cpu_plan, run_join},
    {{"jam", "c", "a cpu plan (a scan: its step plan)", "LUMEN_NO_JAM",
      "accumulating kernels run 4 outer points at a time (up to 16 where accumulators fit and indices divide no more), copies jammed inward, wide outputs in tiles of 16 (jam.c)"},
     PLAN, when_cpu_plan, run_jam},
    {{"chain", "c", "a cpu plan (a scan: its step plan)", "LUMEN_NO_CHAIN",
      "a kernel over an earlier one's outer parallel loops, reading what it stores only at the point that stores it (or nothing it stores), runs inside it, point by point (schedule.c)"},
     PLAN, when_cpu_plan, run_chain},
    {{"stack", "c", "a cpu plan (a scan: its step plan)", "LUMEN_NO_STACK",
      "independent kernels of different domains become one over their domains end to end, each point testing whose it is (schedule.c)"},
     PLAN, when_cpu_plan, run_stack},
    {{"partial", "c", "a cpu plan, not a scan, of a graph that allows contraction", "LUMEN_NO_PARTIAL",
      "a kernel whose stores are all sums over the batch's rows runs in two halves of the rows, each into its own part of the buffers; its readers add the parts (partial.c)"},
     PLAN, when_partial, run_partial},
    {{"assign", "c", "a cpu plan, not a scan", "LUMEN_NO_ASSIGN",
      "an assign's copy after the last kernel dropped where the kernel computing the value stores it into the assigned input, each element after its own reads of it (lower.c)"},
     PLAN, when_plain_cpu, run_assign},
    {{"scan-fuse", "all", "a scan whose step is env-local, at most 2048 floats of locals per env", NULL,
      "the whole scan as one plan: a time loop inside each env's kernel, the carry kept (scan.c)"},
     FRONT, NULL, NULL},
    {{"lanes", "c", "a fused scan, lanes > 1", "LUMEN_SCAN_LANES=1",
      "envs in SIMD blocks, each layer's dot products as running sums in registers (lanes.c)"},
     SCAN, when_lanes, run_lanes},
    {{"inplace", "c", "a kernel in lane form", "LUMEN_NO_INPLACE",
      "the carried state stored in place where the step allows, no end-of-step copies (inplace.c)"},
     SCAN, when_lanes, run_inplace},
    {{"split", "c", "a kernel in lane form", "LUMEN_NO_SPLIT",
      "long column loops split where their tests of the column change, the tests folded (columns.c)"},
     SCAN, when_lanes, run_split},
    {{"columns", "c", "a kernel in lane form", "LUMEN_NO_COLUMNS",
      "short constant loops around a lane loop (a stacked state's columns) unrolled into it (columns.c)"},
     SCAN, when_lanes, run_columns},
    {{"lazy", "c", "a kernel in lane form", "LUMEN_NO_LAZY",
      "values used only under a per-lane flag (auto-reset draws) computed for flagged lanes only (lazy.c)"},
     SCAN, when_lanes, run_lazy},
    {{"index", "c", "a kernel in lane form", "LUMEN_NO_INDEX",
      "sums of picked constants equal to an index at every point (an arange's digits) as that index's value (columns.c)"},
     SCAN, when_lanes, run_index},
    {{"gpu-workgroups", "cuda opencl", "a GPU backend (its shared memory, its warp)", "LUMEN_GPU_SCHEDULE=0",
      "matmuls tiled through shared memory, reductions as trees, weights staged (gpu.c)"},
     DEVICE, when_gpu, run_gpu},
    {{"finite", "c", "its graph promises finite values", "LUMEN_NO_FINITE",
      "x * 0 as 0 and x + 0 as x, stores of what was just read dropped (columns.c); arithmetic selects over a proved 0/1 flag printed as selects (the loads they pick read before them), one-hot reads as gathers (render.c)"},
     DEVICE, when_finite, run_finite},
};
enum { NPASSES = sizeof passes / sizeof passes[0] };

const lm_pass_info *lm_compile_pass(int i) { return i >= 0 && i < NPASSES ? &passes[i].info : NULL; }

/* A switch is set: "VAR" set at all, or "VAR=VALUE" set to that value. */
static int switched_off(const char *sw) {
  if (!sw) return 0;
  const char *eq = strchr(sw, '=');
  char name[64];
  size_t n = eq ? (size_t)(eq - sw) : strlen(sw);
  if (n >= sizeof name) return 0;
  memcpy(name, sw, n);
  name[n] = 0;
  const char *v = getenv(name);
  return v && (!eq || !strcmp(v, eq + 1));
}

/* The rows of one stage, in order; LM_ERR_NOMEM when one ran out of memory. */
static lm_status run_stage(int stage, pass_ctx *c) {
  for (int i = 0; i < NPASSES; i++) {
    const pass *p = &passes[i];
    if (p->stage != stage || c->off >> i & 1 || !p->when(c) || switched_off(p->info.off)) continue;
    if (p->run(c) < 0) return lm_fail(LM_ERR_NOMEM, "out of memory in the %s pass", p->info.name);
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- the fused scan searched */

/* A fused scan's kernel holds the env's local arrays, which the search's e-graph does not
 * represent; under a search its schedule is chosen among whole variants of the SCAN rows,
 * each built and timed by the search (lm_search_variants_on): the lanes at half, a quarter and
 * an eighth of the default width (at least 8 envs a block), and each row after the lanes
 * switched off in turn. Variant 0 is the rows as the table has them, the search's cheapest
 * static choice. */
enum { SCAN_NARROWER = 3 };

typedef struct scan_search {
  const pass_ctx *base; /* the fused plan before the SCAN rows */
  int lanes;            /* variant 0's envs a block */
  int rows[NPASSES], nrows;
  char tag[32];         /* variant 0's name */
} scan_search;

/* Variant v's lane width and switched-off rows; 0 when there is no such variant. */
static int scan_variant(const scan_search *s, int v, int *lanes, uint64_t *off) {
  *lanes = s->lanes;
  *off = 0;
  if (v == 0) return 1;
  if (v <= SCAN_NARROWER) {
    *lanes = s->lanes >> v;
    return *lanes >= 8;
  }
  v -= SCAN_NARROWER + 1;
  if (v >= s->nrows) return 0;
  *off = (uint64_t)1 << s->rows[v];
  return 1;
}

static lm_status make_scan_variant(void *ctx, int v, lm_kernel **ks, size_t *nk, char *name, size_t cap) {
  const scan_search *s = ctx;
  int lanes;
  uint64_t off;
  if (!scan_variant(s, v, &lanes, &off)) return lm_fail(LM_ERR_INVALID, "no scan variant %d", v);
  const lm_plan *p = s->base->plan;
  lm_plan copy = *p;
  copy.kernels = lm_calloc(p->nkernels + 1, sizeof *copy.kernels);
  copy.kernelcap = p->nkernels + 1;
  if (!copy.kernels) return LM_ERR_NOMEM;
  lm_status st = LM_OK;
  for (size_t i = 0; i < p->nkernels && st == LM_OK; i++) st = sk_kernel_copy(&p->kernels[i], &copy.kernels[i]);
  pass_ctx c = *s->base;
  c.plan = &copy;
  c.lanes = lanes;
  c.off = off;
  if (st == LM_OK) st = run_stage(SCAN, &c);
  if (st == LM_OK) st = run_stage(DEVICE, &c);
  for (size_t i = 0; i < copy.nkernels && p->g->contract; i++) copy.kernels[i].fast_exp = 1; /* as lm_compile_ex */
  if (st != LM_OK) {
    for (size_t i = 0; i < p->nkernels; i++) lm_kernel_free(&copy.kernels[i]);
    lm_free(copy.kernels);
    return st;
  }
  *ks = copy.kernels;
  *nk = copy.nkernels;
  if (off) snprintf(name, cap, "lanes-%d-no-%s", lanes, passes[__builtin_ctzll(off)].info.name);
  else snprintf(name, cap, "lanes-%d", lanes);
  return LM_OK;
}

/* The SCAN rows on c's fused plan: the search's choice among their variants where a search
 * runs, else as the table has them. */
static lm_status run_scan_rows(pass_ctx *c) {
  const lm_search_options *o = c->opts->search;
  if (!o || !(o->budget_s > 0 || (o->cache_only && o->use_cache)) || c->opts->device || c->lanes < 2)
    return run_stage(SCAN, c);
  scan_search s = {.base = c, .lanes = c->lanes};
  for (int i = 0; i < NPASSES; i++)
    if (passes[i].stage == SCAN && passes[i].run != run_lanes) s.rows[s.nrows++] = i;
  snprintf(s.tag, sizeof s.tag, "lanes-%d", s.lanes);
  lm_search_variants vs = {1 + SCAN_NARROWER + s.nrows, make_scan_variant, &s, (int)c->scan->sym_T, s.tag};
  int v = 0;
  if (lm_search_variants_on(c->plan, NULL, o, NULL, &vs, &v) != LM_OK || !scan_variant(&s, v, &c->lanes, &c->off))
    scan_variant(&s, 0, &c->lanes, &c->off);
  return run_stage(SCAN, c);
}

/* lower, then the PLAN rows */
static lm_status lower_plan(lm_compiled *out, const lm_scan_info *scan, const lm_compile_options *opts,
                            int lanes_headed, int stepwise) {
  lm_plan_free(out->plan);
  out->plan = NULL;
  lm_status st = lm_lower(out->g, &out->plan);
  pass_ctx c = {.plan = out->plan, .scan = scan, .opts = opts, .lanes_headed = lanes_headed, .stepwise = stepwise,
               .lanes = opts->lanes};
  return st == LM_OK ? run_stage(PLAN, &c) : st;
}

lm_status lm_compile_ex(const lm_graph_t *g, const lm_scan_info *scan, const lm_compile_options *opts,
                        lm_compiled *out) {
  static const lm_compile_options none = {0};
  if (!opts) opts = &none;
  memset(out, 0, sizeof *out);
  /* rewrites that change rounding are left to search, whose gate tolerates them */
  out->g = lm_canonicalize_ex(g, LM_CANON_EXACT, NULL);
  if (!out->g) return LM_ERR_INVALID;
  /* A scan headed for SIMD lanes is lowered without the interchange: lanes vectorise across
   * envs, and its layers' dot products become running sums in registers there
   * (compiler/lanes.c); when the step turns out not to be env-local, it is lowered again with
   * the interchange, for the step plan that runs T times. */
  int lanes = scan && scan->active && opts->lanes > 1;
  lm_status st = lower_plan(out, scan, opts, lanes, 0);
  if (st == LM_OK && scan && scan->active) {
    lm_plan *fused = NULL;
    st = lm_scan_fuse(out->plan, scan->sym_T, scan->reverse, scan->per_step, &fused);
    if (st == LM_OK) {
      lm_plan_free(out->plan);
      out->plan = fused;
      out->fused = 1;
      for (size_t i = 0; i < fused->nkernels && !out->envs; i++)
        if (fused->kernels[i].npar > 0) out->envs = fused->kernels[i].loops[0].extent;
      pass_ctx c = {.plan = fused, .scan = scan, .opts = opts, .lanes_headed = lanes, .lanes = opts->lanes};
      st = run_scan_rows(&c);
      out->lanes = 1;
      for (size_t i = 0; i < fused->nkernels; i++)
        if (lane_form(&fused->kernels[i])) out->lanes = c.lanes;
    } else if (st == LM_ERR_UNSUPPORTED && (lanes || opts->join)) /* the step plan runs T times: */
      st = lower_plan(out, scan, opts, 0, 1); /* lowered again where a plain plan's passes differ */
    else if (st == LM_ERR_UNSUPPORTED)
      st = LM_OK;
  }
  if (st == LM_OK) {
    pass_ctx c = {.plan = out->plan, .scan = scan, .opts = opts, .lanes_headed = lanes, .lanes = opts->lanes};
    st = run_stage(DEVICE, &c);
  }
  /* a graph that allows contraction: its kernels may fuse a*b + c (the C dialect's FMAs; jam's
   * blocks are the same either way), except those the search timed as they are (a register
   * tile left to clang's vectoriser with contraction on spills its accumulators: 75 -> 31
   * GFLOP/s, compiler/search/vec.c). A fused scan's kernel keeps separate roundings (an env's
   * arithmetic stays as the reference rounds it), but its exp2 is the update's inline
   * polynomial (render.c, lm_exp2_c), not two calls of libmvec's 8-wide expf per 16 lanes with
   * the lanes' registers spilled around them (the tanh and the sampling: a third of CartPole's
   * rollout kernel) */
  if (st == LM_OK && out->g->contract)
    for (size_t i = 0; i < out->plan->nkernels; i++) {
      lm_kernel *k = &out->plan->kernels[i];
      if (out->fused) k->fast_exp = 1;
      else k->contract |= !k->measured;
    }
  if (st != LM_OK) lm_compiled_free(out);
  return st;
}

void lm_compiled_free(lm_compiled *c) {
  lm_plan_free(c->plan);
  lm_graph_free(c->g);
  memset(c, 0, sizeof *c);
}

void lm_dump_source(const char *tag, const char *ext, const char *src, const lm_plan *plan) {
  const char *dir = getenv("LUMEN_DUMP");
  if (!dir || !*dir || !src) return;
  mkdir(dir, 0777);
  char path[4096];
  uint64_t h = lm_hash_bytes(src, strlen(src), 0);
  snprintf(path, sizeof path, "%s/%s-%016llx.%s", dir, tag, (unsigned long long)h, ext);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(src, f);
  lm_sb sb = {0};
  if (plan) lm_plan_dump(plan, &sb);
  if (sb.s) fprintf(f, "\n/* loop IR:\n%s*/\n", sb.s);
  lm_sb_free(&sb);
  fclose(f);
}

lm_status lm_plan_stats(const lm_plan *plan, const lm_scan_info *scan, int fused, const int64_t *syms,
                        lm_program_stats *out) {
  lm_layout l;
  lm_status st = lm_layout_compute(plan, syms, &l);
  if (st != LM_OK) return st;
  out->kernels = (int)plan->nkernels;
  if (scan->active && !fused) out->kernels *= (int)syms[scan->sym_T];
  out->arena_bytes = l.arena_bytes;
  out->temp_bytes = l.temp_bytes;
  lm_layout_free(&l);
  return LM_OK;
}
