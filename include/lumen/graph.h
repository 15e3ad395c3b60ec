/* lumen/graph.h — the graph IR: primitive ops, shape-tracking views on edges, inputs with
 * roles, assign, symbolic dimensions, validation and a round-trippable text form.
 * Building a graph computes nothing; programs (lumen/runtime.h) run graphs on a backend. */
#ifndef LUMEN_GRAPH_H
#define LUMEN_GRAPH_H

#include "lumen/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LM_MAX_RANK 8

typedef struct lm_graph lm_graph_t;

/* A tensor is a light handle: a node of its graph seen through a view (shape tracker).
 * Views cost nothing until a consumer reads through them. node == 0 marks an invalid
 * tensor (a failed construction); operations on it yield invalid tensors again, and the
 * graph remembers the first error (lm_graph_validate reports it). */
typedef struct lm_tensor {
  lm_graph_t *g;
  uint32_t node;
  uint32_t view;
} lm_tensor;

/* The primitive vocabulary: exactly these reach the compiler. */
typedef enum lm_op {
  LM_OP_INPUT,      /* leaf: data, parameter or state */
  LM_OP_CONST,      /* leaf: a scalar constant (rank 0; broadcast through views) */
  LM_OP_RAND,       /* leaf: Philox uniforms in (0,1], see lumen/rand.h */
  LM_OP_LOG2,
  LM_OP_EXP2,
  LM_OP_SIN,
  LM_OP_SQRT,
  LM_OP_RECIP,
  LM_OP_ADD,
  LM_OP_MUL,
  LM_OP_MOD,        /* C fmodf: result has the sign of the dividend */
  LM_OP_LESS_THAN,  /* 1.0f where a < b, else 0.0f */
  LM_OP_SUM_REDUCE, /* over one axis, which is removed */
  LM_OP_MAX_REDUCE, /* over one axis, which is removed */
  LM_OP_CONTIGUOUS, /* materialise a view */
  LM_OP_COUNT
} lm_op;

typedef enum lm_role {
  LM_ROLE_DATA,  /* fed by the host before a run */
  LM_ROLE_PARAM, /* persistent and trainable */
  LM_ROLE_STATE, /* persistent, updated by assign */
  LM_ROLE_COUNT
} lm_role;

const char *lm_op_name(lm_op op);
const char *lm_role_name(lm_role role);

/* ---- dimensions ----
 * A dimension is an lm_dim: a value >= 0 is a constant extent; a negative value names a
 * symbolic expression of the graph (a symbol such as N, or a product/sum of them), bound
 * to an integer at run time, so a new N does not recompile. */
typedef int64_t lm_dim;

lm_graph_t *lm_graph_new(void);
void lm_graph_free(lm_graph_t *g);

/* Contraction: with on != 0 the cpu backend may compute a*b + c as one FMA (one rounding where
 * the reference interpreter rounds twice), and a reduction that carries at most 16 floats from
 * one step to the next (a narrow layer's dot products, a row's sum of squares) in partial sums
 * of the C compiler's choosing, in the kernels of this graph's plain plans (not in a fused
 * scan's), and runs those kernels with subnormals flushed to zero (x86: MXCSR FTZ and DAZ,
 * restored after each call). Results then match the reference within rounding, not bit for bit;
 * each run of one program still gives the same bits, on any number of threads. Off by default;
 * PPO turns it on for its update, bootstrap and rollout graphs (lm_ppo_config.exact = 0). */
void lm_graph_set_contraction(lm_graph_t *g, int on);

/* A promise about the values of this graph: every input and every value a node computes is
 * finite (no infinity, no NaN), and nothing depends on the sign of a zero. The cpu backend may
 * then print an arithmetic select, c*a + (1-c)*b with c proved 0 or 1 (lm_env_select's form,
 * lm_minimum's), as a select, which differs from the arithmetic only where the unpicked operand
 * is not finite (NaN there) or in the sign of a zero result. The reference interpreter checks
 * the promise: a run that meets a non-finite input or value fails naming the node (so `rltrain
 * check` and the tests that compare backends against ref catch a broken promise). Envs make it
 * for their env-only graphs with lm_env_spec.finite. */
void lm_graph_promise_finite(lm_graph_t *g);

/* A symbol: a positive integer (>= 1) bound at run time. lm_sym_min allows another
 * least value (0 for offsets such as a shuffle's b). Same name -> same symbol. */
lm_dim lm_sym(lm_graph_t *g, const char *name);
lm_dim lm_sym_min(lm_graph_t *g, const char *name, int64_t least);
/* The value symbol `name` is expected to take when the graph runs (PPO's minibatch rows, say).
 * Nothing binds it: a schedule search (lumen/search.h) times its candidates at it, where it
 * would otherwise guess 256, and keys its tuning cache by it. Fails with LM_ERR_INVALID for a
 * symbol the graph does not have or a value below the symbol's least. */
lm_status lm_sym_hint(lm_graph_t *g, const char *name, int64_t value);
lm_dim lm_dim_mul(lm_graph_t *g, lm_dim a, lm_dim b);
lm_dim lm_dim_add(lm_graph_t *g, lm_dim a, lm_dim b);
/* Writes the dimension as text ("4", "N", "N*T") into buf; returns buf. */
const char *lm_dim_str(const lm_graph_t *g, lm_dim d, char *buf, size_t cap);
/* 1 when a and b are provably equal for every binding, else 0. */
int lm_dim_equal(const lm_graph_t *g, lm_dim a, lm_dim b);

/* ---- leaves ---- */
lm_tensor lm_input(lm_graph_t *g, const char *name, lm_role role, int rank, const lm_dim *shape);
/* The input named `name`, or an invalid tensor if the graph has none. */
lm_tensor lm_graph_input(lm_graph_t *g, const char *name);
lm_tensor lm_const(lm_graph_t *g, float value);
/* Uniforms in (0,1]; each call gets the next stream id of the graph unless given one. */
lm_tensor lm_rand(lm_graph_t *g, int rank, const lm_dim *shape);
lm_tensor lm_rand_stream(lm_graph_t *g, uint32_t stream, int rank, const lm_dim *shape);

/* ---- unary and binary primitives (binary ones broadcast numpy-style through views) ---- */
lm_tensor lm_log2(lm_tensor x);
lm_tensor lm_exp2(lm_tensor x);
lm_tensor lm_sin(lm_tensor x);
lm_tensor lm_sqrt(lm_tensor x);
lm_tensor lm_recip(lm_tensor x);
lm_tensor lm_add(lm_tensor a, lm_tensor b);
lm_tensor lm_mul(lm_tensor a, lm_tensor b);
lm_tensor lm_mod(lm_tensor a, lm_tensor b);
lm_tensor lm_less_than(lm_tensor a, lm_tensor b);
/* Reductions remove `axis` (negative axes count from the end). */
lm_tensor lm_sum_reduce(lm_tensor x, int axis);
lm_tensor lm_max_reduce(lm_tensor x, int axis);
lm_tensor lm_contiguous(lm_tensor x);

/* ---- views (no node is created; the consumer's edge carries them) ---- */
lm_tensor lm_permute(lm_tensor x, const int *perm);
/* Inserts a new axis of extent n at position axis (a broadcast: every index reads the same). */
lm_tensor lm_expand(lm_tensor x, int axis, lm_dim n);
/* numpy broadcasting: leading axes are added, extent-1 axes are stretched. */
lm_tensor lm_broadcast_to(lm_tensor x, int rank, const lm_dim *shape);
/* Keeps indices [start, end) of axis. */
lm_tensor lm_slice(lm_tensor x, int axis, lm_dim start, lm_dim end);
/* Adds `before` and `after` zeros around axis. */
lm_tensor lm_pad(lm_tensor x, int axis, lm_dim before, lm_dim after);
/* Same elements in row-major order, new shape (same element count). */
lm_tensor lm_reshape(lm_tensor x, int rank, const lm_dim *shape);
/* y[.., i, ..] = x[.., (a*i + b) mod n, ..] with n the axis extent: a permutation when
 * gcd(a, n) == 1, which is how minibatches are shuffled on the device without a gather. */
lm_tensor lm_affine_mod(lm_tensor x, int axis, lm_dim a, lm_dim b);

/* ---- queries ---- */
int lm_rank(lm_tensor t);
lm_dim lm_dim_of(lm_tensor t, int axis); /* negative axes count from the end */
int lm_tensor_ok(lm_tensor t);
size_t lm_graph_node_count(const lm_graph_t *g);

/* ---- outputs and persistent updates ---- */
/* Names a tensor the host can read after a run. */
lm_status lm_output(lm_tensor t, const char *name);
/* At the end of every run, the STATE or PARAM input `target` takes `value` (same shape);
 * every read in the run sees the old value. */
lm_status lm_assign(lm_tensor target, lm_tensor value);

/* ---- checking and text ---- */
/* LM_OK, or LM_ERR_INVALID with a message naming the node (shape mismatches, cycles, bad
 * axes, dangling references, a construction error recorded earlier). */
lm_status lm_graph_validate(const lm_graph_t *g);
/* Text dump (malloc'd, free with free()); lm_graph_parse reads it back. */
char *lm_graph_dump(const lm_graph_t *g);
lm_graph_t *lm_graph_parse(const char *text);

#ifdef __cplusplus
}
#endif
#endif
