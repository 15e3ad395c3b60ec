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

/* grids and games (exact in float32 for the small integers games count with) */
/* numpy's roll: y[.., i, ..] = x[.., (i - shift) mod n, ..] along axis (a view, lm_affine_mod) */
lm_tensor lm_roll(lm_tensor x, int axis, lm_dim shift);
lm_tensor lm_count_nonzero(lm_tensor x, int axis);  /* nonzeros along axis (axis removed) */
/* Index of the first (last) element along axis where cond != 0, axis removed; the extent n
 * (first) or -1 (last) where there is none. */
lm_tensor lm_first_index(lm_tensor cond, int axis);
lm_tensor lm_last_index(lm_tensor cond, int axis);

/* Stride-1 windows of k along axis, as a view (no copy): the axis (extent L) becomes the window
 * start t (extent L - k + 1) followed by a new axis, the offset j (extent k): element
 * (.., t, j, ..) = x[.., t + j, ..]. */
lm_tensor lm_window(lm_tensor x, int axis, lm_dim k);
/* 2-D convolution, stride 1, SAME zero padding: x [B, H, W, C] (channels last), w [kh*kw*C, F]
 * (rows in (dy, dx, c) order), odd kh and kw -> [B, H, W, F]. Each output cell's window is a
 * view of x (lm_window) and a matmul combines the windows with the kernel: no im2col copy
 * unless the schedule makes one. */
lm_tensor lm_conv2d(lm_tensor x, lm_tensor w, int kh, int kw);

#ifdef __cplusplus
}
#endif
#endif
