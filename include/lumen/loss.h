/* lumen/loss.h — losses and distribution terms as graphs (compositions of lumen/ops.h, so
 * lm_grad differentiates them like anything else). Regression losses and cross-entropy
 * return the mean over every element / the batch (rank 0, ready for lm_grad); log-probs and
 * entropies return one value per sample (the batch axes), as PPO's ratio and entropy bonus
 * need. Index-valued arguments (class targets, taken actions) are floats holding integers
 * in [0, C), and get no gradient. */
#ifndef LUMEN_LOSS_H
#define LUMEN_LOSS_H

#include "lumen/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mean((pred - target)^2) over every element (shapes broadcast). */
lm_tensor lm_loss_mse(lm_tensor pred, lm_tensor target);

/* PyTorch's HuberLoss: mean of 0.5 d^2 where |d| <= delta, delta (|d| - 0.5 delta) elsewhere,
 * d = pred - target; delta > 0. Built as q = min(|d|, delta), 0.5 q^2 + delta (|d| - q), so
 * the gradient is d inside and delta sign(d) outside (0 at d = 0). */
lm_tensor lm_loss_huber(lm_tensor pred, lm_tensor target, float delta);

/* Cross-entropy of logits [..., C] against class indices [...]: mean over every sample of
 * -log_softmax(logits)[target] (PyTorch's CrossEntropyLoss with class-index targets). */
lm_tensor lm_loss_cross_entropy(lm_tensor logits, lm_tensor target);

/* Diagonal Gaussian with mean [..., A] and log standard deviation log_std (broadcasting to
 * mean's shape, e.g. a [A] parameter): log-density of x [..., A], summed over the last axis:
 * sum(-0.5 ((x - mean) / std)^2 - log_std - 0.5 log(2 pi)) -> [...]. */
lm_tensor lm_loss_gaussian_log_prob(lm_tensor mean, lm_tensor log_std, lm_tensor x);
/* Its entropy, sum(0.5 + 0.5 log(2 pi) + log_std) over the last axis of mean's shape -> [...]. */
lm_tensor lm_loss_gaussian_entropy(lm_tensor mean, lm_tensor log_std);

/* Categorical distribution given by logits [..., C]: log-probability of the taken actions
 * [...] (log_softmax gathered at the action) -> [...], and entropy -sum(p log p) -> [...]. */
lm_tensor lm_loss_categorical_log_prob(lm_tensor logits, lm_tensor action);
lm_tensor lm_loss_categorical_entropy(lm_tensor logits);

#ifdef __cplusplus
}
#endif
#endif
