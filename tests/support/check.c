/* tests/support/check.c — the shared test helpers of check.h. */
#define _POSIX_C_SOURCE 200809L /* popen, setenv */
#include "support/check.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

check_rng check_rng_new(uint64_t seed) { return (check_rng){seed}; }

uint64_t check_next(check_rng *r) {
  uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double check_uniform(check_rng *r, double lo, double hi) {
  return lo + (hi - lo) * (double)(check_next(r) >> 11) * 0x1.0p-53;
}

void check_fill(check_rng *r, float *dst, size_t n, double lo, double hi, double min_abs) {
  cr_assert(hi > lo && (hi > min_abs || lo < -min_abs), "check_fill: [%g, %g) has nothing with |v| >= %g", lo, hi,
            min_abs);
  for (size_t i = 0; i < n; i++) {
    float v;
    do v = (float)check_uniform(r, lo, hi);
    while (fabsf(v) < min_abs || v >= hi);
    dst[i] = v;
  }
}

void check_fill_index(check_rng *r, float *dst, size_t count, int n) {
  for (size_t i = 0; i < count; i++) dst[i] = (float)(check_next(r) % (uint64_t)n);
}

float *check_floats(size_t n) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  cr_assert(v, "out of memory for %zu floats", n);
  check_poison(v, n);
  return v;
}

void check_same_bits(const char *what, const float *got, const float *want, size_t n) {
  size_t bad = 0, first = 0;
  for (size_t j = 0; j < n; j++)
    if (memcmp(&got[j], &want[j], sizeof *got) && !bad++) first = j;
  cr_assert_eq(bad, 0, "%s: %zu of %zu values differ in their bits, the first at %zu (%a vs %a)", what, bad, n, first,
               (double)got[first], (double)want[first]);
}

void check_golden_load(const char *path, int S, int A, int O, int exact, check_golden *gd) {
  memset(gd, 0, sizeof *gd);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "SKIPPED: transitions file %s not found\n", path);
    cr_skip_test("transitions file %s not found", path);
  }
  gd->S = S, gd->A = A, gd->O = O;
  size_t cols = (size_t)(2 + S + A + S + O + 3), cap = 0;
  double *v = malloc(cols * sizeof *v);
  char *line = NULL;
  size_t len = 0;
  cr_assert(v && getline(&line, &len, f) > 0 && !strncmp(line, "episode,t,", 10), "%s: no header", path);
  while (getline(&line, &len, f) > 0) {
    if (gd->rows == cap) {
      cap = cap ? 2 * cap : 1024;
      float **arr[7] = {&gd->state, &gd->action, &gd->next, &gd->obs, &gd->reward, &gd->terminated, &gd->truncated};
      size_t w[7] = {(size_t)S, (size_t)A, (size_t)S, (size_t)O, 1, 1, 1};
      for (int k = 0; k < 7; k++) cr_assert((*arr[k] = realloc(*arr[k], cap * w[k] * sizeof(float))), "out of memory");
    }
    char *p = line;
    for (size_t c = 0; c < cols; c++) {
      char *end;
      v[c] = strtod(p, &end);
      cr_assert(end != p && (!exact || v[c] == (float)v[c]), "%s: line %zu column %zu unreadable%s", path,
                gd->rows + 2, c, exact ? " or not a float" : "");
      p = *end == ',' ? end + 1 : end;
    }
    size_t r = gd->rows++;
    const double *at = v + 2;
    for (int k = 0; k < S; k++) gd->state[r * (size_t)S + (size_t)k] = (float)*at++;
    for (int k = 0; k < A; k++) gd->action[r * (size_t)A + (size_t)k] = (float)*at++;
    for (int k = 0; k < S; k++) gd->next[r * (size_t)S + (size_t)k] = (float)*at++;
    for (int k = 0; k < O; k++) gd->obs[r * (size_t)O + (size_t)k] = (float)*at++;
    gd->reward[r] = (float)at[0], gd->terminated[r] = (float)at[1], gd->truncated[r] = (float)at[2];
  }
  free(line);
  free(v);
  fclose(f);
}

void check_golden_free(check_golden *gd) {
  free(gd->state), free(gd->action), free(gd->next), free(gd->obs), free(gd->reward), free(gd->terminated);
  free(gd->truncated);
  memset(gd, 0, sizeof *gd);
}

void check_poison(float *dst, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = NAN;
}

lm_program_t *check_cpu_scan(lm_graph_t *g, const char *dir, int lazy, lm_backend_t **b) {
  setenv("LUMEN_DUMP", dir, 1);
  if (!lazy) setenv("LUMEN_NO_LAZY", "1", 1);
  *b = lm_backend_new("cpu");
  lm_program_t *p = *b ? lm_program_new_scan(*b, g, "T", 0, NULL, 0) : NULL;
  unsetenv("LUMEN_DUMP");
  unsetenv("LUMEN_NO_LAZY");
  cr_assert(p, "the cpu scan program: %s", lm_last_error());
  return p;
}

int check_dump_lines(const char *dir, const char *re) { return check_dump_count(dir, re, 0); }

int check_dump_count(const char *dir, const char *re, int keep) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "cat %s/cpu-*.c | grep -c '%s'; %s %s", dir, re, keep ? "true" : "rm -rf", dir);
  FILE *f = popen(cmd, "r");
  cr_assert(f, "popen(%s)", cmd);
  int n = -1;
  cr_assert_eq(fscanf(f, "%d", &n), 1, "%s printed no count", cmd);
  pclose(f);
  return n;
}

static int matches(float got, double want, double rtol, double atol) {
  if (isnan(want)) return isnan(got);
  if (isinf(want)) return isinf(got) && signbit(got) == signbit(want);
  if (!isfinite(got)) return 0;
  return fabs((double)got - want) <= atol + rtol * fabs(want);
}

void check_close(const char *what, const float *got, const double *want, size_t n, double rtol, double atol) {
  size_t bad = n, nbad = 0;
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    if (matches(got[i], want[i], rtol, atol)) continue;
    if (bad == n) bad = i;
    nbad++;
    double err = fabs((double)got[i] - want[i]);
    if (!(err <= worst)) worst = err;
  }
  if (nbad)
    cr_assert_fail("%s: %zu of %zu values off (rtol %g, atol %g); first at [%zu]: got %.9g, want %.9g; "
                   "worst abs error %.3g",
                   what, nbad, n, rtol, atol, bad, (double)got[bad], want[bad], worst);
}

void check_finite(const char *what, const float *got, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(got[i])) cr_assert_fail("%s: value [%zu] = %g is not finite", what, i, (double)got[i]);
}

check_prog check_prog_new(const lm_graph_t *g, const char *backend) {
  check_prog p = {lm_backend_new(backend), NULL};
  cr_assert(p.backend, "backend %s: %s", backend, lm_last_error());
  p.program = lm_program_new(p.backend, g);
  if (!p.program) {
    lm_backend_free(p.backend);
    cr_assert_fail("lm_program_new on %s: %s", backend, lm_last_error());
  }
  return p;
}

void check_prog_free(check_prog *p) {
  lm_program_free(p->program);
  lm_backend_free(p->backend);
  *p = (check_prog){0};
}

void check_prog_run(check_prog *p, const check_sym *syms, size_t nsyms, const check_buf *in, size_t nin,
                    const check_buf *out, size_t nout) {
  for (size_t i = 0; i < nsyms; i++)
    cr_assert(lm_program_bind(p->program, syms[i].name, syms[i].value) == LM_OK, "bind %s = %lld: %s", syms[i].name,
              (long long)syms[i].value, lm_last_error());
  for (size_t i = 0; i < nin; i++)
    cr_assert(lm_program_write(p->program, in[i].name, in[i].data, in[i].count) == LM_OK, "write %s: %s",
              in[i].name, lm_last_error());
  cr_assert(lm_program_run(p->program) == LM_OK, "run: %s", lm_last_error());
  for (size_t i = 0; i < nout; i++) {
    size_t count = 0;
    cr_assert(lm_program_numel(p->program, out[i].name, &count) == LM_OK, "numel %s: %s", out[i].name,
              lm_last_error());
    cr_assert(count == out[i].count, "output %s holds %zu elements, the test expects %zu", out[i].name, count,
              out[i].count);
    check_poison(out[i].data, out[i].count);
    cr_assert(lm_program_read(p->program, out[i].name, out[i].data, out[i].count) == LM_OK, "read %s: %s",
              out[i].name, lm_last_error());
  }
}

void check_run_ref(const lm_graph_t *g, const check_sym *syms, size_t nsyms, const check_buf *in, size_t nin,
                   const check_buf *out, size_t nout) {
  check_prog p = check_prog_new(g, "ref");
  check_prog_run(&p, syms, nsyms, in, nin, out, nout);
  check_prog_free(&p);
}

#define CHECK_OK(expr) cr_assert_eq((expr), LM_OK, "%s: %s", #expr, lm_last_error())

void check_random_play(const lm_env_spec *e, const char *backend, size_t n, size_t T, uint64_t seed, float *state,
                       float *reward, float *terminated) {
  size_t S = (size_t)e->state_size;
  lm_graph_t *g = lm_graph_new();
  cr_assert(g, "%s", lm_last_error());
  lm_graph_promise_finite(g);
  lm_dim N = lm_sym(g, "N");
  lm_vec_step vs;
  CHECK_OK(lm_env_vec_step(e, g, "", N, lm_env_random_action(e, g, N), &vs));
  CHECK_OK(lm_output(vs.reward, "reward"));
  CHECK_OK(lm_output(vs.terminated, "terminated"));
  lm_backend_t *b = lm_backend_new(backend);
  cr_assert(b, "%s", lm_last_error());
  lm_program_t *p = lm_program_new_scan(b, g, "T", 0, NULL, 0);
  cr_assert(p, "scan on %s: %s", backend, lm_last_error());
  lm_graph_free(g);
  CHECK_OK(lm_program_bind(p, "N", (int64_t)n));
  CHECK_OK(lm_program_bind(p, "T", (int64_t)T));
  lm_program_set_seed(p, seed);
  CHECK_OK(lm_program_write(p, "state", state, n * S));
  CHECK_OK(lm_program_run(p));
  CHECK_OK(lm_program_read(p, "reward", reward, n * T));
  CHECK_OK(lm_program_read(p, "terminated", terminated, n * T));
  CHECK_OK(lm_program_read(p, "state", state, n * S));
  lm_program_free(p);
  lm_backend_free(b);
}
