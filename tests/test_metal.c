/* Tests for the metal backend (compiler/backends/metal.c) and MSL validation without a Mac
 * (compiler/msl_check.c, compiler/msl_shim.h). No Apple machine runs these tests here, so:
 * - the real "metal" backend is compiled in every build and, off macOS, refuses to open with
 *   the documented message; "auto" does not pick it and says why (skipped while
 *   compiler/runtime.c's registry does not list &lm_backend_metal);
 * - MSL for every registered env's training iteration (lm_trainer_graphs: rollout scan, prep,
 *   GAE reverse scan, update) compiles under the shim;
 * - the validator refuses what Metal refuses (a write through a read-only buffer, `double`,
 *   misnumbered or too many [[buffer(n)]] slots), so these checks can fail;
 * - "metal-shim" (the metal backend's host code on an emulated device that runs the MSL kernels,
 *   compiled as C++, on the CPU) is compared with the ref interpreter: 120 random graphs (test_cpu.c's
 *   generator, 20 independent graphs packed per program) under three bindings of N and M, RAND
 *   bit for bit, and scans (fused into one kernel, and unfused: T steps in one command buffer with
 *   per-step buffer offsets and the assign copies between steps);
 * - one command buffer per run, and barriers only where dispatches depend on each other: the
 *   emulated device runs the dispatches between two barriers in REVERSE order, so a missing
 *   barrier changes results (shown directly on two dependent copies);
 * - a hand-written kernel with threadgroup memory and threadgroup_barrier (the renderer emits
 *   none yet) runs on the emulated device with one OS thread per work-item.
 * On macOS with a Metal GPU the last test runs the same random graphs on real Metal.
 *
 * Tolerance (as test_cpu.c): |got - ref| <= 2e-5 |ref| + 1e-5 S, where S >= 1 bounds the magnitude
 * of every value computed by sin, exp2 or log2 on the way to an output; values no transcendental
 * reaches must match bit for bit (the shim calls the same libm float functions as ref, with fp
 * contraction off on both sides). On real Metal every value gets the tolerance: precise:: math
 * is not libm. Outputs are NaN-poisoned before every read. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "graph-impl.h"
#include "loopir.h"
#include "lumen/lumen.h"
#include "lumen/train.h"
#include "msl_check.h"
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

static const char linux_message[] = "Metal is only available on macOS: Metal.framework not found";

/* ================================================================ a program on a backend's ops */

/* The metal backends are driven through their vtable (compiler/runtime.c's registry is not
 * needed): the same calls lm_program_* makes, with buffers sized from the ref program. */
typedef struct vprog {
  const lm_backend_ops *ops;
  void *ctx, *exe;
  lm_graph_t *g; /* the graph prepared (owned) */
  int64_t syms[16];
  void **in, **out;
  size_t *in_n, *out_n;
  uint64_t seed, run;
} vprog;

/* Opens `ops`; 0 (and the reason in why) when the device is not available. */
static int vopen(const lm_backend_ops *ops, void **ctx, char *why, size_t cap) {
  lm_status st = ops->open(ctx);
  if (st != LM_OK) snprintf(why, cap, "%s", lm_last_error());
  return st == LM_OK;
}

/* Prepares g (cloned) on ctx; with T, as a scan over the symbol T. */
static vprog *vprog_new(const lm_backend_ops *ops, void *ctx, const lm_graph_t *g, const char *T, int reverse,
                        const char *const *per_step, int n_per_step) {
  vprog *p = calloc(1, sizeof *p);
  cr_assert(p);
  p->ops = ops;
  p->ctx = ctx;
  p->g = lm_graph_clone(g);
  cr_assert(p->g);
  uint8_t per[64] = {0};
  lm_scan_info scan = {0};
  if (T) {
    int sym = lm_x_symbol(&p->g->x, T, 1);
    cr_assert(sym >= 0);
    for (int i = 0; i < n_per_step; i++)
      for (size_t j = 0; j < p->g->ninputs; j++)
        if (!strcmp(p->g->inputs[j].name, per_step[i])) per[j] = 1;
    scan = (lm_scan_info){1, sym, reverse, per};
  }
  cr_assert(p->g->x.nsyms <= 16 && p->g->ninputs < 64);
  p->in = calloc(p->g->ninputs + 1, sizeof *p->in);
  p->out = calloc(p->g->noutputs + 1, sizeof *p->out);
  p->in_n = calloc(p->g->ninputs + 1, sizeof *p->in_n);
  p->out_n = calloc(p->g->noutputs + 1, sizeof *p->out_n);
  cr_assert(p->in && p->out && p->in_n && p->out_n);
  lm_status st = ops->prepare(ctx, p->g, &scan, &p->exe);
  cr_assert_eq(st, LM_OK, "%s: prepare: %s", ops->name, lm_last_error());
  return p;
}

static void vprog_free(vprog *p) {
  for (size_t i = 0; i < p->g->ninputs; i++)
    if (p->in[i]) p->ops->release(p->ctx, p->in[i]);
  for (size_t i = 0; i < p->g->noutputs; i++)
    if (p->out[i]) p->ops->release(p->ctx, p->out[i]);
  p->ops->unprepare(p->ctx, p->exe);
  lm_graph_free(p->g);
  free(p->in);
  free(p->out);
  free(p->in_n);
  free(p->out_n);
  free(p);
}

static void vbind(vprog *p, const char *name, int64_t v) {
  size_t k = 0;
  while (k < p->g->x.nsyms && strcmp(p->g->x.syms[k].name, name)) k++;
  cr_assert(k < p->g->x.nsyms, "no symbol %s", name);
  p->syms[k] = v;
}

static int find_name(const lm_graph_t *g, const char *name, int *is_out) {
  for (size_t i = 0; i < g->ninputs; i++)
    if (!strcmp(g->inputs[i].name, name)) return *is_out = 0, (int)i;
  for (size_t i = 0; i < g->noutputs; i++)
    if (!strcmp(g->outputs[i].name, name)) return *is_out = 1, (int)i;
  cr_assert_fail("no input or output named %s", name);
  return -1;
}

/* The buffer of `name`, (re)allocated to n elements; fresh buffers start at zero. */
static void *vbuf(vprog *p, const char *name, size_t n) {
  int is_out, i = find_name(p->g, name, &is_out);
  void **b = is_out ? &p->out[i] : &p->in[i];
  size_t *have = is_out ? &p->out_n[i] : &p->in_n[i];
  if (*b && *have == n) return *b;
  if (*b) p->ops->release(p->ctx, *b);
  OK(p->ops->alloc(p->ctx, (n ? n : 1) * sizeof(float), b));
  OK(p->ops->fill_zero(p->ctx, *b, (n ? n : 1) * sizeof(float)));
  *have = n;
  return *b;
}

static void vwrite(vprog *p, const char *name, const float *v, size_t n) {
  OK(p->ops->write(p->ctx, vbuf(p, name, n), v, n * sizeof(float)));
}

static void vread(vprog *p, const char *name, float *v, size_t n) {
  OK(p->ops->read(p->ctx, vbuf(p, name, n), v, n * sizeof(float)));
}

/* Sizes every output from the ref program r (same graph, same bindings), then runs once. */
static lm_status vrun(vprog *p, lm_program_t *r) {
  for (size_t i = 0; i < p->g->noutputs; i++) {
    size_t n = 0;
    OK(lm_program_numel(r, p->g->outputs[i].name, &n));
    vbuf(p, p->g->outputs[i].name, n);
  }
  for (size_t i = 0; i < p->g->ninputs; i++) {
    size_t n = 0;
    OK(lm_program_numel(r, p->g->inputs[i].name, &n));
    vbuf(p, p->g->inputs[i].name, n);
  }
  lm_run_args a = {p->syms, p->in, p->out, p->seed, p->run};
  lm_status st = p->ops->run(p->ctx, p->exe, &a);
  if (st == LM_OK) p->run++;
  return st;
}

/* ================================================================ random graphs vs ref */

typedef struct target {
  const lm_backend_ops *ops;
  void *ctx;
  lm_backend_t *ref;
  int exact_bits; /* compare exact values bit for bit */
} target;

static void compare(rg_gen *G, const target *T, vprog *pm, lm_program_t *pr, const rg_outp *o, const char *when) {
  size_t n = 0;
  OK(lm_program_numel(pr, o->name, &n));
  float *got = malloc((n ? n : 1) * sizeof *got), *ref = malloc((n ? n : 1) * sizeof *ref);
  cr_assert(got && ref);
  check_poison(got, n);
  check_poison(ref, n);
  vread(pm, o->name, got, n);
  OK(lm_program_read(pr, o->name, ref, n));
  rg_check_output(G, o, got, ref, n, T->ops->name, T->exact_bits ? RG_EXACT_BITS : RG_EXACT_TOLERANCE, RTOL, ATOL, NULL,
                  when);
  free(got);
  free(ref);
}

static void property_program(const target *T, uint64_t seed) {
  rg_gen *G = calloc(1, sizeof *G);
  cr_assert(G);
  rg_program(G, seed);
  vprog *pm = vprog_new(T->ops, T->ctx, G->g, NULL, 0, NULL, 0);
  lm_program_t *pr = lm_program_new(T->ref, G->g);
  cr_assert(pr, "ref: %s", lm_last_error());
  pm->seed = seed;
  lm_program_set_seed(pr, seed);
  check_rng data = check_rng_new(seed ^ 0xda7a);
  for (size_t bi = 0; bi < CHECK_COUNT(rg_bindings); bi++) {
    vbind(pm, "N", rg_bindings[bi][0]);
    vbind(pm, "M", rg_bindings[bi][1]);
    OK(lm_program_bind(pr, "N", rg_bindings[bi][0]));
    OK(lm_program_bind(pr, "M", rg_bindings[bi][1]));
    for (int i = 0; i < G->nin; i++) {
      size_t n = 0;
      OK(lm_program_numel(pr, G->in[i].name, &n));
      float *v = malloc((n ? n : 1) * sizeof *v);
      cr_assert(v);
      check_fill(&data, v, n, G->in[i].lo, G->in[i].hi, 0.05);
      vwrite(pm, G->in[i].name, v, n);
      OK(lm_program_write(pr, G->in[i].name, v, n));
      free(v);
    }
    for (int run = 0; run < (bi == 0 ? 2 : 1); run++) {
      lm_status sm = vrun(pm, pr);
      if (sm != LM_OK) rg_fail(G, 0, NULL, "%s run: %s", T->ops->name, lm_last_error());
      OK(lm_program_run(pr));
      char when[128];
      snprintf(when, sizeof when, "seed %#llx, N=%lld M=%lld, run %d", (unsigned long long)seed,
               (long long)rg_bindings[bi][0], (long long)rg_bindings[bi][1], run);
      for (int o = 0; o < G->nout; o++) compare(G, T, pm, pr, &G->out[o], when);
    }
  }
  vprog_free(pm);
  lm_program_free(pr);
  lm_graph_free(G->g);
  free(G);
}

/* Part `part` of the property test: PROGRAMS programs of RG_NSUB random graphs each. */
enum { PARTS = 3, PROGRAMS = 2 };

static void property_part(const lm_backend_ops *ops, int exact_bits, int part) {
  target T = {ops, NULL, lm_backend_new("ref"), exact_bits};
  char why[1024];
  if (!vopen(ops, &T.ctx, why, sizeof why)) {
    lm_backend_free(T.ref);
    cr_skip_test("%s is not available here: %s", ops->name, why);
  }
  cr_assert(T.ref, "%s", lm_last_error());
  for (int i = 0; i < PROGRAMS; i++)
    property_program(&T, 0xa0761d6478bd642full * (uint64_t)(part * PROGRAMS + i + 1));
  ops->close(T.ctx);
  lm_backend_free(T.ref);
}

Test(metal_shim_vs_ref, random_graphs_part_1_of_3, .timeout = LM_TIMEOUT(240)) { property_part(&lm_backend_metal_shim, 1, 0); }
Test(metal_shim_vs_ref, random_graphs_part_2_of_3, .timeout = LM_TIMEOUT(240)) { property_part(&lm_backend_metal_shim, 1, 1); }
Test(metal_shim_vs_ref, random_graphs_part_3_of_3, .timeout = LM_TIMEOUT(240)) { property_part(&lm_backend_metal_shim, 1, 2); }

/* On a Mac with a Metal GPU: the same 120 graphs on the real device (skipped elsewhere). */
Test(metal_vs_ref, random_graphs_on_a_real_metal_device, .timeout = LM_TIMEOUT(600)) {
  for (int part = 0; part < PARTS; part++) property_part(&lm_backend_metal, 0, part);
}

/* ================================================================ RAND */

/* RAND through MSL draws what lm_rand_uniform draws, bit for bit, for 64-bit seeds, several run
 * counters, streams and shapes with symbolic sizes. */
Test(metal_shim, rand_is_bit_identical_to_ref) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 7});
  OK(lm_output(lm_rand(g, 2, (lm_dim[]){N, 7}), "u"));
  OK(lm_output(lm_mul(lm_rand(g, 2, (lm_dim[]){N, 7}), x), "ux"));
  OK(lm_output(lm_rand(g, 1, (lm_dim[]){N}), "v"));
  void *ctx;
  char why[512];
  cr_assert(vopen(&lm_backend_metal_shim, &ctx, why, sizeof why), "%s", why);
  lm_backend_t *ref = lm_backend_new("ref");
  vprog *pm = vprog_new(&lm_backend_metal_shim, ctx, g, NULL, 0, NULL, 0);
  lm_program_t *pr = lm_program_new(ref, g);
  cr_assert(pr);
  static const uint64_t seeds[] = {0, 1, 0xfedcba9876543210ull};
  static const char *const outs[] = {"u", "ux", "v"};
  check_rng r = check_rng_new(8);
  for (size_t si = 0; si < CHECK_COUNT(seeds); si++) {
    int64_t n = 37 + 64 * (int64_t)si;
    vbind(pm, "N", n);
    OK(lm_program_bind(pr, "N", n));
    pm->seed = seeds[si];
    lm_program_set_seed(pr, seeds[si]);
    uint64_t run = si == 2 ? 0x100000003ull : 5; /* a run counter past 32 bits */
    pm->run = run;
    lm_program_set_run(pr, run);
    float *xv = malloc((size_t)n * 7 * sizeof *xv);
    check_fill(&r, xv, (size_t)n * 7, -2, 2, 0.1);
    vwrite(pm, "x", xv, (size_t)n * 7);
    OK(lm_program_write(pr, "x", xv, (size_t)n * 7));
    for (int k = 0; k < 2; k++) {
      OK(vrun(pm, pr));
      OK(lm_program_run(pr));
      for (size_t o = 0; o < CHECK_COUNT(outs); o++) {
        size_t cnt = 0;
        OK(lm_program_numel(pr, outs[o], &cnt));
        float *a = malloc(cnt * sizeof *a), *b = malloc(cnt * sizeof *b);
        check_poison(a, cnt);
        check_poison(b, cnt);
        vread(pm, outs[o], a, cnt);
        OK(lm_program_read(pr, outs[o], b, cnt));
        for (size_t i = 0; i < cnt; i++) /* uniforms lie in (0, 1] */
          cr_assert(!memcmp(&a[i], &b[i], sizeof(float)) && (o == 1 || (a[i] > 0 && a[i] <= 1)),
                    "seed %#llx run %llu: %s[%zu] = %a through MSL, %a on ref", (unsigned long long)seeds[si],
                    (unsigned long long)(run + (uint64_t)k), outs[o], i, (double)a[i], (double)b[i]);
        free(a);
        free(b);
      }
    }
    free(xv);
  }
  vprog_free(pm);
  lm_program_free(pr);
  lm_backend_free(ref);
  lm_backend_metal_shim.close(ctx);
  lm_graph_free(g);
}

/* ================================================================ scans */

static lm_graph_t *recurrence_graph(void) { /* h' = 0.5 h + x_t + u_t; y_t = h' */
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_add(lm_mul_scalar(h, 0.5f), x), lm_rand(g, 1, (lm_dim[]){N}));
  OK(lm_output(h2, "y"));
  OK(lm_assign(h, h2));
  return g;
}

static lm_graph_t *global_graph(void) { /* h' = 0.5 (h - mean h) + x_t: not env-local, unfused */
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor h = lm_input(g, "h", LM_ROLE_STATE, 1, (lm_dim[]){N});
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 1, (lm_dim[]){N});
  lm_tensor h2 = lm_add(lm_mul_scalar(lm_sub(h, lm_mean(h, 0, 1)), 0.5f), lm_mul(x, lm_rand(g, 1, (lm_dim[]){N})));
  OK(lm_output(h2, "y"));
  OK(lm_output(lm_sum(h2, 0, 0), "total"));
  OK(lm_assign(h, h2));
  return g;
}

/* Runs the scan of g on metal-shim and ref for two runs (the carry continues) and compares y
 * and the state bit for bit; returns the emulated device's counts of the last run. */
static lm_msl_shim_counts scan_vs_ref(lm_graph_t *g, int reverse, int64_t T, int64_t n, int want_fused_kernels) {
  void *ctx;
  char why[512];
  cr_assert(vopen(&lm_backend_metal_shim, &ctx, why, sizeof why), "%s", why);
  lm_backend_t *ref = lm_backend_new("ref");
  const char *per[] = {"x"};
  vprog *pm = vprog_new(&lm_backend_metal_shim, ctx, g, "T", reverse, per, 1);
  lm_program_t *pr = lm_program_new_scan(ref, g, "T", reverse, per, 1);
  cr_assert(pr, "%s", lm_last_error());
  vbind(pm, "T", T);
  vbind(pm, "N", n);
  OK(lm_program_bind(pr, "T", T));
  OK(lm_program_bind(pr, "N", n));
  pm->seed = 77;
  lm_program_set_seed(pr, 77);
  lm_program_stats stats;
  OK(lm_backend_metal_shim.stats(ctx, pm->exe, pm->syms, &stats));
  if (want_fused_kernels) cr_assert_eq(stats.kernels, want_fused_kernels, "the scan took %d kernels", stats.kernels);
  else
    cr_assert(stats.kernels >= T && stats.kernels % T == 0, "%d kernels for %lld unfused steps", stats.kernels,
              (long long)T);
  check_rng r = check_rng_new(13);
  float *h0 = malloc((size_t)n * sizeof *h0), *xs = malloc((size_t)(T * n) * sizeof *xs);
  check_fill(&r, h0, (size_t)n, -3, 3, 0.01);
  vwrite(pm, "h", h0, (size_t)n);
  OK(lm_program_write(pr, "h", h0, (size_t)n));
  lm_msl_shim_counts before = {0}, after = {0};
  for (int run = 0; run < 2; run++) {
    check_fill(&r, xs, (size_t)(T * n), -1, 1, 0.01);
    vwrite(pm, "x", xs, (size_t)(T * n));
    OK(lm_program_write(pr, "x", xs, (size_t)(T * n)));
    lm_msl_shim_counts_get(&before);
    OK(vrun(pm, pr));
    lm_msl_shim_counts_get(&after);
    OK(lm_program_run(pr));
    static const char *const names[] = {"y", "h", "total"};
    for (int k = 0; k < 3; k++) {
      size_t cnt = 0;
      int found = k < 2;
      for (size_t i = 0; i < pm->g->noutputs; i++) found |= !strcmp(pm->g->outputs[i].name, names[k]);
      if (!found) continue;
      OK(lm_program_numel(pr, names[k], &cnt));
      float *a = malloc(cnt * sizeof *a), *b = malloc(cnt * sizeof *b);
      check_poison(a, cnt);
      check_poison(b, cnt);
      vread(pm, names[k], a, cnt);
      OK(lm_program_read(pr, names[k], b, cnt));
      for (size_t i = 0; i < cnt; i++)
        cr_assert(!memcmp(&a[i], &b[i], sizeof(float)), "run %d: %s[%zu] = %.9g through MSL, %.9g on ref", run,
                  names[k], i, (double)a[i], (double)b[i]);
      free(a);
      free(b);
    }
  }
  free(h0);
  free(xs);
  vprog_free(pm);
  lm_program_free(pr);
  lm_backend_free(ref);
  lm_backend_metal_shim.close(ctx);
  lm_graph_free(g);
  return (lm_msl_shim_counts){after.command_buffers - before.command_buffers, after.dispatches - before.dispatches,
                              after.barriers - before.barriers, after.threads - before.threads};
}

Test(metal_shim, env_local_scan_is_one_fused_kernel_and_matches_ref_bit_for_bit) {
  lm_msl_shim_counts c = scan_vs_ref(recurrence_graph(), 0, 9, 70, 1);
  cr_assert_eq(c.command_buffers, 1);
  cr_assert_eq(c.dispatches, 1, "a fused scan is one dispatch (got %lld)", (long long)c.dispatches);
}

Test(metal_shim, reverse_env_local_scan_matches_ref_bit_for_bit) { scan_vs_ref(recurrence_graph(), 1, 6, 33, 1); }

/* Not env-local: T steps of several kernels, per-step x and y offset with setBuffer:offset:,
 * the state copy after every step, run counter run*T + t — all in one command buffer. */
Test(metal_shim, unfused_scan_runs_every_step_in_one_command_buffer_and_matches_ref_bit_for_bit) {
  const int64_t T = 7;
  lm_msl_shim_counts c = scan_vs_ref(global_graph(), 0, T, 70, 0);
  cr_assert_eq(c.command_buffers, 1, "%lld command buffers for one run", (long long)c.command_buffers);
  cr_assert(c.dispatches >= 2 * T, "%lld dispatches for %lld steps", (long long)c.dispatches, (long long)T);
  cr_assert(c.barriers >= T - 1 && c.barriers < c.dispatches, "%lld barriers for %lld dispatches",
            (long long)c.barriers, (long long)c.dispatches);
}

Test(metal_shim, unfused_reverse_scan_matches_ref_bit_for_bit) { scan_vs_ref(global_graph(), 1, 5, 9, 0); }

/* ================================================================ the emulated device */

/* Two dependent copies (a -> b, then b -> c) in one command buffer: with the barrier c = a;
 * without it the emulator runs them last-first and c keeps b's old zeros. This is why the
 * property tests above catch a barrier the host logic forgot. */
Test(metal_shim, dispatches_between_barriers_run_in_reverse_so_a_missing_barrier_shows) {
  const lm_mtl_device *d = &lm_mtl_device_shim;
  void *dev, *lib, *buf[3], *mem[3];
  OK(d->open(&dev));
  static const char src[] =
      "#include <metal_stdlib>\nusing namespace metal;\n"
      "kernel void copy4(device float *dst [[buffer(0)]], const device float *src [[buffer(1)]], "
      "uint tid [[thread_position_in_grid]]) {\n  if (tid < 4) dst[tid] = src[tid];\n}\n";
  const char *entries[] = {"copy4"};
  OK(d->library_new(dev, src, entries, 1, &lib));
  for (int with_barrier = 0; with_barrier < 2; with_barrier++) {
    for (int i = 0; i < 3; i++) OK(d->buffer_new(dev, 4 * sizeof(float), &buf[i], &mem[i]));
    for (int i = 0; i < 4; i++) ((float *)mem[0])[i] = (float)(i + 1);
    void *enc;
    OK(d->encoder_new(dev, &enc));
    d->set_kernel(enc, lib, 0);
    d->set_buffer(enc, buf[1], 0, 0);
    d->set_buffer(enc, buf[0], 0, 1);
    d->dispatch(enc, 4, 0);
    if (with_barrier) d->barrier(enc);
    d->set_buffer(enc, buf[2], 0, 0);
    d->set_buffer(enc, buf[1], 0, 1);
    d->dispatch(enc, 4, 0);
    OK(d->finish(enc, 1, NULL));
    for (int i = 0; i < 4; i++)
      cr_assert_eq(((float *)mem[2])[i], with_barrier ? (float)(i + 1) : 0.0f, "with_barrier=%d: c[%d] = %g",
                   with_barrier, i, (double)((float *)mem[2])[i]);
    for (int i = 0; i < 3; i++) d->buffer_free(dev, buf[i]);
  }
  d->library_free(dev, lib);
  d->close(dev);
}

/* A threadgroup tree reduction: threadgroup memory, barriers in a loop, the work-item's index in
 * its group and the group's index. Each work-item is an OS thread, so the barriers are real. */
Test(metal_shim, a_kernel_with_threadgroup_barriers_runs_a_thread_per_work_item) {
  const lm_mtl_device *d = &lm_mtl_device_shim;
  void *dev, *lib, *in, *out, *pin, *pout;
  OK(d->open(&dev));
  static const char src[] =
      "#include <metal_stdlib>\nusing namespace metal;\n"
      "kernel void group_sum(device float *out [[buffer(0)]], const device float *in [[buffer(1)]],\n"
      "                      constant long &n [[buffer(2)]], uint lid [[thread_position_in_threadgroup]],\n"
      "                      uint group [[threadgroup_position_in_grid]], uint size [[threads_per_threadgroup]],\n"
      "                      uint tid [[thread_position_in_grid]]) {\n"
      "  threadgroup float tile[64];\n"
      "  tile[lid] = (long)tid < n ? in[tid] : 0.0f;\n"
      "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
      "  for (uint s = size / 2; s > 0; s >>= 1) {\n"
      "    if (lid < s) tile[lid] += tile[lid + s];\n"
      "    threadgroup_barrier(mem_flags::mem_threadgroup);\n"
      "  }\n"
      "  if (lid == 0) out[group] = tile[0];\n"
      "}\n";
  char log[1024];
  OK(lm_msl_check_source(src, log, sizeof log));
  cr_assert(strstr(log, "1 with threadgroup barriers"), "%s", log);
  const char *entries[] = {"group_sum"};
  OK(d->library_new(dev, src, entries, 1, &lib));
  const int64_t n = 200; /* 4 groups of 64, the last one partial */
  OK(d->buffer_new(dev, (size_t)n * sizeof(float), &in, &pin));
  OK(d->buffer_new(dev, 4 * sizeof(float), &out, &pout));
  float want[4] = {0};
  for (int64_t i = 0; i < n; i++) {
    ((float *)pin)[i] = (float)((i * 37) % 11) - 5; /* small integers: every sum is exact */
    want[i / 64] += ((float *)pin)[i];
  }
  check_poison(pout, 4);
  void *enc;
  OK(d->encoder_new(dev, &enc));
  d->set_kernel(enc, lib, 0);
  d->set_buffer(enc, out, 0, 0);
  d->set_buffer(enc, in, 0, 1);
  d->set_bytes(enc, &n, sizeof n, 2);
  d->dispatch(enc, (uint64_t)n, 64);
  OK(d->finish(enc, 1, NULL));
  for (int i = 0; i < 4; i++)
    cr_assert_eq(((float *)pout)[i], want[i], "group %d: %g, expected %g", i, (double)((float *)pout)[i],
                 (double)want[i]);
  d->buffer_free(dev, in);
  d->buffer_free(dev, out);
  d->library_free(dev, lib);
  d->close(dev);
}

/* ================================================================ the validator */

static lm_status check_text(const char *kernel_text, char *log, size_t cap) {
  char src[8192];
  snprintf(src, sizeof src, "#include <metal_stdlib>\nusing namespace metal;\n%s", kernel_text);
  return lm_msl_check_source(src, log, cap);
}

Test(msl_check, a_well_formed_kernel_compiles_and_the_log_says_so) {
  char log[2048];
  lm_status st = check_text("kernel void k(device float *o [[buffer(0)]], const device float *a [[buffer(1)]], "
                            "constant long &n [[buffer(2)]], uint tid [[thread_position_in_grid]]) {\n"
                            "  if ((long)tid < n)\n"
                            "    o[tid] = metal::precise::sin(a[tid]) + metal::fast::exp2(a[tid]);\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_OK, "%s", log);
  cr_assert(strstr(log, "1 kernel (") && strstr(log, "compiled under the shim"), "log: %s", log);
}

Test(msl_check, a_write_through_a_read_only_buffer_fails_to_compile) {
  char log[8192];
  lm_status st = check_text("kernel void k(const device float *o [[buffer(0)]],\n"
                            "              uint tid [[thread_position_in_grid]]) {\n  o[tid] = 1.0f;\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_ERR_COMPILE, "%s", log);
  cr_assert(strstr(log, "read-only") || strstr(log, "const"), "log: %s", log);
}

Test(msl_check, double_is_refused_as_in_msl) {
  char log[8192];
  lm_status st = check_text("kernel void k(device float *o [[buffer(0)]], uint tid [[thread_position_in_grid]]) {\n"
                            "  double d = 2.0;\n  o[tid] = (float)d;\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_ERR_COMPILE, "%s", log);
  cr_assert(strstr(log, "double"), "log: %s", log);
}

Test(msl_check, buffer_slots_out_of_order_are_refused_naming_the_kernel) {
  char log[2048];
  lm_status st = check_text("kernel void swapped(device float *o [[buffer(1)]], const device float *a [[buffer(0)]], "
                            "uint tid [[thread_position_in_grid]]) {\n  o[tid] = a[tid];\n}\n",
                            log, sizeof log);
  cr_assert_eq(st, LM_ERR_COMPILE);
  cr_assert(strstr(log, "swapped") && strstr(log, "[[buffer(1)]]"), "log: %s", log);
}

Test(msl_check, more_than_31_buffer_slots_are_refused_naming_the_kernel) {
  char text[6000];
  int n = snprintf(text, sizeof text, "kernel void wide(");
  for (int i = 0; i < 32; i++)
    n += snprintf(text + n, sizeof text - (size_t)n, "device float *b%d [[buffer(%d)]], ", i, i);
  snprintf(text + n, sizeof text - (size_t)n, "uint tid [[thread_position_in_grid]]) {\n  b0[tid] = 0.0f;\n}\n");
  char log[2048];
  cr_assert_eq(check_text(text, log, sizeof log), LM_ERR_COMPILE);
  cr_assert(strstr(log, "wide") && strstr(log, "32 buffer slots"), "log: %s", log);
}

/* A graph whose one fused kernel reads 30 inputs: 34 slots with S, R and total. */
Test(metal_shim, a_kernel_needing_more_than_31_buffer_slots_is_refused_naming_it) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor s = lm_input(g, "x0", LM_ROLE_DATA, 1, (lm_dim[]){5});
  for (int i = 1; i < 30; i++) {
    char name[8];
    snprintf(name, sizeof name, "x%d", i);
    s = lm_add(s, lm_input(g, name, LM_ROLE_DATA, 1, (lm_dim[]){5}));
  }
  OK(lm_output(s, "sum"));
  void *ctx, *exe = NULL;
  char why[512];
  cr_assert(vopen(&lm_backend_metal_shim, &ctx, why, sizeof why), "%s", why);
  lm_scan_info none = {0};
  lm_status st = lm_backend_metal_shim.prepare(ctx, g, &none, &exe);
  cr_assert_eq(st, LM_ERR_UNSUPPORTED, "prepare: %s", lm_last_error());
  cr_assert(strstr(lm_last_error(), "buffer slots") && strstr(lm_last_error(), "31"), "%s", lm_last_error());
  lm_backend_metal_shim.close(ctx);
  lm_graph_free(g);
}

/* The source Metal gets keeps the renderer's kernels and turns off FMA contraction (Metal
 * contracts a*b+c even in safe math mode), then adds the copy kernel. */
Test(msl_check, the_metal_source_has_contraction_off_and_the_copy_kernel) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 1, (lm_dim[]){8});
  lm_tensor s = lm_input(g, "s", LM_ROLE_STATE, 1, (lm_dim[]){8});
  OK(lm_output(lm_add(lm_mul(a, a), s), "y"));
  OK(lm_assign(s, lm_mul(s, a)));
  lm_plan *plan = NULL;
  OK(lm_lower(g, &plan));
  char *src = lm_msl_plan_source(plan);
  cr_assert(src, "%s", lm_last_error());
  const char *pragma = strstr(src, "#pragma METAL fp contract(off)"), *first = strstr(src, "\nkernel void ");
  cr_assert(pragma && first && pragma < first, "no contraction pragma before the kernels:\n%s", src);
  cr_assert(strstr(src, "kernel void " LM_MSL_COPY_ENTRY "("), "no copy kernel:\n%s", src);
  for (size_t k = 0; k < plan->nkernels; k++) {
    char decl[96];
    snprintf(decl, sizeof decl, "kernel void %s(", plan->kernels[k].name);
    cr_assert(strstr(src, decl), "kernel %s is missing", plan->kernels[k].name);
  }
  free(src);
  lm_plan_free(plan);
  lm_graph_free(g);
}

/* ================================================================ every env's training iteration */

static void env_iteration_compiles(int e) {
  const lm_env_spec *env = lm_env_at(e);
  if (!env) cr_skip_test("this build registers %d envs", lm_env_count());
  lm_ppo_config cfg = lm_ppo_defaults(env);
  lm_train_graph tg[4];
  int n = lm_trainer_graphs(env, &cfg, tg, 4);
  cr_assert_eq(n, 4, "%s: lm_trainer_graphs: %s", env->name, lm_last_error());
  char log[16384];
  for (int i = 0; i < n; i++) {
    lm_status st = lm_msl_check_graph(tg[i].g, tg[i].scan ? "T" : NULL, tg[i].reverse, tg[i].per_step,
                                      tg[i].n_per_step, log, sizeof log);
    cr_assert_eq(st, LM_OK, "%s %s: %s", env->name, tg[i].name, log);
    cr_assert(strstr(log, "compiled under the shim"), "%s %s: %s", env->name, tg[i].name, log);
    cr_log_info("%s %s: %s", env->name, tg[i].name, log);
  }
  for (int i = 0; i < n; i++) lm_graph_free(tg[i].g);
}

Test(msl_env, training_iteration_of_env_0_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(0); }
Test(msl_env, training_iteration_of_env_1_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(1); }
Test(msl_env, training_iteration_of_env_2_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(2); }
Test(msl_env, training_iteration_of_env_3_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(3); }
Test(msl_env, training_iteration_of_env_4_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(4); }
Test(msl_env, training_iteration_of_env_5_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(5); }
Test(msl_env, training_iteration_of_env_6_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(6); }
Test(msl_env, training_iteration_of_env_7_compiles_under_the_shim, .timeout = LM_TIMEOUT(120)) { env_iteration_compiles(7); }

Test(msl_env, every_registered_env_is_covered_by_the_tests_above) {
  cr_assert_leq(lm_env_count(), 8, "%d envs: add tests for envs 8 and up", lm_env_count());
}

/* ================================================================ the real backend off macOS */

#if !defined(__APPLE__)
Test(metal, off_macos_the_metal_backend_refuses_to_open_with_the_documented_message) {
  void *ctx = NULL;
  lm_status st = lm_backend_metal.open(&ctx);
  cr_assert_eq(st, LM_ERR_UNSUPPORTED, "open gave %s", lm_status_name(st));
  cr_assert(strstr(lm_last_error(), linux_message), "message: %s", lm_last_error());
}

static int registry_index(const char *name) {
  for (int i = 0; i < lm_backend_count(); i++)
    if (!strcmp(lm_backend_name_at(i), name)) return i;
  return -1;
}

Test(metal, off_macos_device_metal_fails_and_auto_picks_another_backend_saying_why) {
  int m = registry_index("metal");
  if (m < 0) cr_skip_test("compiler/runtime.c's registry does not list &lm_backend_metal yet");
  cr_assert(registry_index("cpu") > m && registry_index("ref") > m, "metal must come before cpu and ref");
  cr_assert_null(lm_backend_new("metal"));
  cr_assert(strstr(lm_last_error(), linux_message), "lm_backend_new(\"metal\"): %s", lm_last_error());
  char why[1024] = "";
  cr_assert_null(lm_backend_open("metal", why, sizeof why), "asking for metal by name does not fall back");
  lm_backend_t *b = lm_backend_open("auto", why, sizeof why);
  cr_assert(b, "auto: %s", lm_last_error());
  cr_assert_str_neq(lm_backend_name(b), "metal");
  if (registry_index(lm_backend_name(b)) > m) /* metal was tried first: the line says so */
    cr_assert(strstr(why, "metal unavailable") && strstr(why, linux_message), "why: %s", why);
  lm_backend_free(b);
}
#endif
