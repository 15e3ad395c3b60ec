/* lumen/ops.h — the high-level op library. Every function here is a composition of the
 * primitives and views of lumen/graph.h: nothing new reaches the compiler.
 * Binary ops broadcast numpy-style. Axes may be negative (counted from the end). */
#ifndef LUMEN_OPS_H
#define LUMEN_OPS_H

#include "lumen/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* constants and ranges */
lm_tensor lm_full(lm_graph_t *g, float value, int rank, const lm_dim *shape);
lm_tensor lm_scalar_like(lm_tensor like, float value);     /* constant broadcast to like's shape */
lm_tensor lm_arange(lm_graph_t *g, lm_dim n);               /* 0, 1, ..., n-1 as floats */

/* arithmetic */
lm_tensor lm_neg(lm_tensor x);
lm_tensor lm_sub(lm_tensor a, lm_tensor b);
lm_tensor lm_div(lm_tensor a, lm_tensor b);
lm_tensor lm_add_scalar(lm_tensor x, float c);
lm_tensor lm_mul_scalar(lm_tensor x, float c);
lm_tensor lm_square(lm_tensor x);
lm_tensor lm_pow_int(lm_tensor x, int n);                   /* n may be negative; x^0 = 1 */
lm_tensor lm_abs(lm_tensor x);
lm_tensor lm_sign(lm_tensor x);                             /* -1, 0 or 1 */
lm_tensor lm_floor(lm_tensor x);                            /* via MOD */
lm_tensor lm_round(lm_tensor x);                            /* half away from zero, via MOD */

/* transcendental */
lm_tensor lm_exp(lm_tensor x);
lm_tensor lm_log(lm_tensor x);
lm_tensor lm_cos(lm_tensor x);
lm_tensor lm_tanh(lm_tensor x);
lm_tensor lm_sigmoid(lm_tensor x);
lm_tensor lm_relu(lm_tensor x);

/* comparisons and selection (results are 0.0f / 1.0f) */
lm_tensor lm_lt(lm_tensor a, lm_tensor b);
lm_tensor lm_gt(lm_tensor a, lm_tensor b);
lm_tensor lm_le(lm_tensor a, lm_tensor b);
lm_tensor lm_ge(lm_tensor a, lm_tensor b);
lm_tensor lm_eq(lm_tensor a, lm_tensor b);
lm_tensor lm_ne(lm_tensor a, lm_tensor b);
lm_tensor lm_where(lm_tensor cond, lm_tensor a, lm_tensor b); /* cond != 0 ? a : b */
lm_tensor lm_minimum(lm_tensor a, lm_tensor b);
lm_tensor lm_maximum(lm_tensor a, lm_tensor b);
lm_tensor lm_clamp(lm_tensor x, float lo, float hi);

/* reductions (keepdim = 1 keeps the reduced axis with extent 1) */
lm_tensor lm_sum(lm_tensor x, int axis, int keepdim);
lm_tensor lm_max(lm_tensor x, int axis, int keepdim);
lm_tensor lm_min(lm_tensor x, int axis, int keepdim);
lm_tensor lm_mean(lm_tensor x, int axis, int keepdim);
lm_tensor lm_var(lm_tensor x, int axis, int keepdim);        /* population variance */
lm_tensor lm_logsumexp(lm_tensor x, int axis, int keepdim);  /* max-shifted */
lm_tensor lm_softmax(lm_tensor x, int axis);
lm_tensor lm_log_softmax(lm_tensor x, int axis);
lm_tensor lm_cumsum(lm_tensor x, int axis);

/* linear algebra: [..., M, K] x [..., K, N] -> [..., M, N], batch axes broadcast;
 * a broadcast multiply followed by a sum over K. */
lm_tensor lm_matmul(lm_tensor a, lm_tensor b);

/* indexing and layout */
lm_tensor lm_one_hot(lm_tensor idx, lm_dim n);      /* float indices -> [..., n] */
/* Picks along `axis` of x the entries named by idx (float indices; idx has x's shape with
 * `axis` removed): a one-hot product and sum, for small gathers such as log-prob of the
 * taken action. */
lm_tensor lm_gather(lm_tensor x, int axis, lm_tensor idx);
lm_tensor lm_concat(lm_tensor a, lm_tensor b, int axis);
lm_tensor lm_transpose(lm_tensor x, int axis0, int axis1);
lm_tensor lm_unsqueeze(lm_tensor x, int axis);      /* inserts an extent-1 axis */
lm_tensor lm_squeeze(lm_tensor x, int axis);        /* removes an extent-1 axis */

#ifdef __cplusplus
}
#endif
#endif
