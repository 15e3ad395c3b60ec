/* lumen/optim.h — optimisers as graphs: given PARAM inputs and their gradients (lm_grad),
 * they add their own STATE inputs (moments, step count), a rank-0 DATA input for the
 * learning rate (written before every run, so schedules such as linear annealing need no
 * recompile), and lm_assign updates, so one run of the graph is one training step on the
 * device. Global gradient-norm clipping comes first when asked for. Semantics follow
 * PyTorch's torch.optim.SGD / Adam / AdamW and clip_grad_norm_. */
#ifndef LUMEN_OPTIM_H
#define LUMEN_OPTIM_H

#include "lumen/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Names: the learning-rate input is `lr_name` (created as DATA of rank 0, or reused when
 * the graph already has a rank-0 DATA input of that name, so several optimisers can share
 * it). State inputs are named "<prefix>.<what>.<param name>" ("adam.m.w1", "adam.v.w1") and
 * "<prefix>.t" for the step count (rank 0); they start at zero like all state. params[i]
 * must be PARAM (or STATE) inputs seen without a view; grads[i] their gradients (any tensor
 * of the same shape). grad_norm (may be NULL) receives the global L2 norm of the gradients
 * before clipping (rank 0; computed even without clipping), for the caller to output. */

typedef struct lm_sgd_cfg {
  const char *lr_name;  /* "lr" */
  const char *prefix;   /* "sgd" */
  float momentum;       /* 0: plain SGD, no state */
  int nesterov;         /* 1: g + momentum * buf instead of buf */
  float weight_decay;   /* L2, added to the gradient */
  float max_grad_norm;  /* > 0: clip the global gradient norm first */
} lm_sgd_cfg;

typedef struct lm_adam_cfg {
  const char *lr_name;  /* "lr" */
  const char *prefix;   /* "adam" ("adamw" for lm_adamw_defaults) */
  float beta1, beta2;   /* 0.9, 0.999 */
  float eps;            /* 1e-8, added to sqrt(v_hat) */
  float weight_decay;   /* Adam: L2 added to the gradient; AdamW: decoupled, p *= 1 - lr*wd */
  int decoupled;        /* 1: AdamW */
  float max_grad_norm;  /* > 0: clip the global gradient norm first */
} lm_adam_cfg;

lm_sgd_cfg lm_optim_sgd_defaults(void);   /* momentum 0, no clipping */
lm_adam_cfg lm_optim_adam_defaults(void);  /* PyTorch Adam: 0.9, 0.999, 1e-8, wd 0 */
lm_adam_cfg lm_optim_adamw_defaults(void); /* PyTorch AdamW: 0.9, 0.999, 1e-8, wd 0.01 */

/* SGD (PyTorch, dampening 0): g += wd p; buf = momentum buf + g (buf starts at 0, so the
 * first step's buf is g, as PyTorch's); g = nesterov ? g + momentum buf : buf; p -= lr g. */
lm_status lm_optim_sgd(const lm_sgd_cfg *cfg, const lm_tensor *params, const lm_tensor *grads, int n,
                       lm_tensor *grad_norm);

/* Adam / AdamW (PyTorch): t += 1; [AdamW: p *= 1 - lr wd | Adam: g += wd p];
 * m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), with b^t = exp2(t log2 b)
 * computed in the graph from the step-count state. */
lm_status lm_optim_adam(const lm_adam_cfg *cfg, const lm_tensor *params, const lm_tensor *grads, int n,
                        lm_tensor *grad_norm);

/* Global gradient-norm clipping (PyTorch clip_grad_norm_, L2): norm = sqrt(sum of every
 * g^2); every grad is scaled by min(1, max_norm / (norm + 1e-6)). clipped[i] receives the
 * scaled gradients (may alias grads); norm (may be NULL) the pre-clip norm. */
lm_status lm_optim_clip_grad_norm(const lm_tensor *grads, int n, float max_norm, lm_tensor *clipped,
                                  lm_tensor *norm);

#ifdef __cplusplus
}
#endif
#endif
