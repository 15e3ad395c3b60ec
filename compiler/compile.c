/* compiler/compile.c — canonicalise, lower, fuse scans; dump generated sources. */
#include "compile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lumen/search.h"
#include "memplan.h"
#include "passes.h"
#include "search/search.h"

lm_status lm_compile(const lm_graph_t *g, const lm_scan_info *scan, lm_compiled *out) {
  return lm_compile_ex(g, scan, NULL, out);
}

/* lower, then the default schedule: search or interchange (unless `plain`), merge */
static lm_status lower_plan(lm_compiled *out, const lm_scan_info *scan, const lm_compile_options *opts, int plain) {
  const lm_search_options *search = opts->search;
  lm_plan_free(out->plan);
  out->plan = NULL;
  lm_status st = lm_lower(out->g, &out->plan);
  /* search measures candidates on this machine and keeps the winners; kernels it leaves
   * alone get the default interchange (a fused scan holds local arrays: not searched) */
  if (st == LM_OK && !plain && search && search->budget_s > 0 && !(scan && scan->active))
    (void)lm_search_plan_on(out->plan, NULL, search, NULL, opts->device);
  else if (st == LM_OK && !plain && opts->interchange && !getenv("LUMEN_NO_INTERCHANGE"))
    lm_schedule_interchange(out->plan, opts->stage);
  if (st == LM_OK && !getenv("LUMEN_NO_MERGE") && lm_schedule_merge(out->plan) < 0)
    st = lm_fail(LM_ERR_NOMEM, "out of memory merging kernels");
  return st;
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
  lm_status st = lower_plan(out, scan, opts, lanes);
  if (st == LM_OK && scan && scan->active) {
    lm_plan *fused = NULL;
    st = lm_scan_fuse(out->plan, scan->sym_T, scan->reverse, scan->per_step, &fused);
    if (st == LM_OK) {
      lm_plan_free(out->plan);
      out->plan = fused;
      out->fused = 1;
      out->lanes = lm_scan_lanes(out->plan, opts->lanes) > 0 ? opts->lanes : 1;
    } else if (st == LM_ERR_UNSUPPORTED) /* the step plan runs T times */
      st = lanes ? lower_plan(out, scan, opts, 0) : LM_OK;
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
