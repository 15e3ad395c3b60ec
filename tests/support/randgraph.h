/* tests/support/randgraph.h — the random graph generator of the backend
 * property tests (test_cpu.c, test_opencl.c and through it test_cuda_gpu.c,
 * test_metal.c): many independent random graphs packed into one lm_graph, built
 * from every primitive, numpy broadcasting, every view kind, reductions, shared
 * subexpressions, CONTIGUOUS, RAND, symbolic dimensions N and M, outputs that
 * are views and assigns to state. While a graph is built, interval arithmetic
 * tracks each value's range and whether it is "exact" (no sin/exp2/log2
 * upstream, so every backend must agree with ref bit for bit) or else the
 * largest magnitude an inexact value reached on the way (the scale of the
 * absolute tolerance). Failures abort the current Criterion test. */
#ifndef LUMEN_TESTS_RANDGRAPH_H
#define LUMEN_TESTS_RANDGRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "lumen/lumen.h"
#include "support/check.h"

enum {
  RG_NSUB = 20,        /* random graphs per program */
  RG_MAXPOOL = 64,     /* values per random graph */
  RG_MAXIO = 512,      /* inputs or outputs per program */
  RG_NUMEL_CAP = 3000, /* elements of any tensor under the largest binding */
};

/* The bindings every program runs under: (N, M). 70 is past one 64-wide block,
 * not a multiple. */
extern const int64_t rg_bindings[3][2];

typedef struct rg_val {
  lm_tensor t;
  double lo, hi; /* every element lies in [lo, hi] */
  double err; /* largest magnitude of an inexact value on the way here (0 when
                 exact) */
  int exact;  /* no sin/exp2/log2 upstream: both backends agree bit for bit */
  int id;     /* t<id> in the description */
  int input;  /* an input (data or state) */
} rg_val;

typedef struct rg_io {
  char name[24];
  double lo, hi; /* written values */
  int sub;
} rg_io;

typedef struct rg_outp {
  char name[24];
  double err;
  int exact;
  int sub;
  int state; /* a state input read back after the run */
} rg_outp;

typedef struct rg_sub {
  char prefix[8];
  int symbolic;
  lm_dim base[LM_MAX_RANK];
  int base_rank;
  rg_val pool[RG_MAXPOOL];
  int npool, nid, nin;
  uint8_t used[1024]; /* per value id: consumed by a later operation */
  char desc[6000];
  size_t len;
} rg_sub;

typedef struct rg_gen {
  lm_graph_t *g;
  check_rng r;
  lm_dim N, M;
  int64_t symmax[8]; /* per symbol number: the largest binding */
  rg_sub subs[RG_NSUB];
  rg_io in[RG_MAXIO];
  int nin;
  rg_outp out[RG_MAXIO];
  int nout;
} rg_gen;

/* Set by device suites whose backend sums long or symbolic reductions in a tree
 * (compiler/gpu.c): such sums are then inexact (compared within the tolerance,
 * scaled by the sum's magnitude) instead of bit for bit. 0 by default. */
extern int rg_sums_reordered;

/* Fills G (zeroed first) with a fresh graph of RG_NSUB random graphs from
 * `seed`; validated. */
void rg_program(rg_gen *G, uint64_t seed);

/* Fails the current test with the message, after logging the whole graph
 * (lm_graph_dump) and, when `source` is not NULL, the generated source's path
 * ("(not found)" when empty); the message is followed by the description of
 * random graph `which`. */
void rg_fail(rg_gen *G, int which, const char *source, const char *fmt, ...)
    LM_PRINTF(4, 5);

/* How exact outputs (o->exact) are compared: with the tolerance like the
 * others, with ==, or bit for bit (memcmp: also tells -0 from +0). */
typedef enum rg_exact {
  RG_EXACT_TOLERANCE,
  RG_EXACT_EQUAL,
  RG_EXACT_BITS
} rg_exact;

/* Checks output o: got[i] (from `backend`) against ref[i] for i < n. Every ref
 * value must be finite (else a generator bug); exact outputs per `exact`, the
 * others within |got - ref| <= rtol |ref| + atol max(1, o->err). Fails through
 * rg_fail (source, when: context). */
void rg_check_output(rg_gen *G, const rg_outp *o, const float *got,
                     const float *ref, size_t n, const char *backend,
                     rg_exact exact, double rtol, double atol,
                     const char *source, const char *when);

/* Runs program pd (on `backend`) against pr (the same graph on ref) under every
 * binding in rg_bindings, the first one twice (so the assigned state feeds a
 * second run): same seed, same random inputs, then every output checked by
 * rg_check_output (exact outputs with ==). */
void rg_run_against_ref(rg_gen *G, lm_program_t *pd, lm_program_t *pr,
                        const char *backend, uint64_t seed, double rtol,
                        double atol, const char *source);

#endif
