/* tests/support/check.h — small helpers any test file may use: a seeded RNG, inputs away from
 * zero, NaN-poisoned output buffers, an error check with stated relative and absolute
 * tolerances, and a runner that builds a program on a backend, binds symbols, writes inputs,
 * runs once and reads (poisoned) outputs. Failures abort the current Criterion test. */
#ifndef LUMEN_TESTS_CHECK_H
#define LUMEN_TESTS_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "lumen/env.h"
#include "lumen/graph.h"
#include "lumen/runtime.h"

/* ---- random inputs (splitmix64: the same seed gives the same numbers everywhere) ---- */
typedef struct check_rng {
  uint64_t state;
} check_rng;

check_rng check_rng_new(uint64_t seed);
uint64_t check_next(check_rng *r);
/* Uniform in [lo, hi). */
double check_uniform(check_rng *r, double lo, double hi);
/* Uniforms in [lo, hi) with |value| >= min_abs (redrawn until they are): inputs away from
 * zero and, shifted by the caller, away from any other kink. */
void check_fill(check_rng *r, float *dst, size_t n, double lo, double hi, double min_abs);
/* Integers in [0, n) as floats (indices for one-hot and gather). */
void check_fill_index(check_rng *r, float *dst, size_t count, int n);

/* NaN everywhere, so an output that was never written fails every comparison. */
void check_poison(float *dst, size_t n);
/* n floats (at least one), poisoned; the test fails when memory runs out. */
float *check_floats(size_t n);
/* got and want hold the same bits (the sign of a zero and NaN payloads included); fails naming
 * `what`, how many differ and the first. */
void check_same_bits(const char *what, const float *got, const float *want, size_t n);

/* ---- transitions files (the goldens in ../shared/golden, rltrain record): one row per step,
 * episode,t,<state S>,<action A>,<next state S>,<obs O>,reward,terminated,truncated ---- */
typedef struct check_golden {
  size_t rows;
  int S, A, O;
  float *state, *action, *next, *obs, *reward, *terminated, *truncated; /* as recorded, as floats */
} check_golden;
/* Reads path; skips the test (with a line on stderr) when the file is not there. exact: every
 * value must be a float exactly (games' small integers). */
void check_golden_load(const char *path, int S, int A, int O, int exact, check_golden *gd);
void check_golden_free(check_golden *gd);

/* Passes when |got[i] - want[i]| <= atol + rtol * |want[i]| for every i; a NaN or inf in
 * want must be matched exactly (same class and sign), a NaN in got never passes otherwise.
 * Fails the test naming `what`, the first bad index, both values and the worst error. */
void check_close(const char *what, const float *got, const double *want, size_t n, double rtol, double atol);
/* Every got[i] is finite. */
void check_finite(const char *what, const float *got, size_t n);

/* Random actions and lm_env_vec_step (auto-reset, time limit) scanned T steps for n envs on
 * `backend`, seeded `seed`, promising finite values as an env's own programs do (ref checks it):
 * from the states in state [n, S], overwritten with the final ones; each step's rewards and
 * terminations [T, n] into reward and terminated. */
void check_random_play(const lm_env_spec *e, const char *backend, size_t n, size_t T, uint64_t seed, float *state,
                       float *reward, float *terminated);

/* Lines of the cpu kernels dumped into dir (LUMEN_DUMP) that match the basic regular
 * expression re (their loop IR included), counted with grep; removes dir. */
int check_dump_lines(const char *dir, const char *re);
/* The same, dir removed unless keep. */
int check_dump_count(const char *dir, const char *re, int keep);
/* g as a scan program over symbol T (no per-step inputs) on a new cpu backend (*b), its
 * kernels dumped into dir, with lazy draws (compiler/lazy.c) or without (LUMEN_NO_LAZY). */
lm_program_t *check_cpu_scan(lm_graph_t *g, const char *dir, int lazy, lm_backend_t **b);

/* ---- programs ---- */
typedef struct check_sym {
  const char *name;
  int64_t value;
} check_sym;

typedef struct check_buf {
  const char *name;
  float *data;
  size_t count;
} check_buf;

typedef struct check_prog {
  lm_backend_t *backend;
  lm_program_t *program;
} check_prog;

/* Opens the backend and prepares g (which the caller may free afterwards). */
check_prog check_prog_new(const lm_graph_t *g, const char *backend);
void check_prog_free(check_prog *p);
/* Binds every symbol, writes every input (count must be its element count), runs once, then
 * poisons and reads every output. */
void check_prog_run(check_prog *p, const check_sym *syms, size_t nsyms, const check_buf *in, size_t nin,
                    const check_buf *out, size_t nout);
/* check_prog_new + check_prog_run + check_prog_free on the "ref" backend. */
void check_run_ref(const lm_graph_t *g, const check_sym *syms, size_t nsyms, const check_buf *in, size_t nin,
                   const check_buf *out, size_t nout);

#define CHECK_COUNT(a) (sizeof(a) / sizeof((a)[0]))

#endif
