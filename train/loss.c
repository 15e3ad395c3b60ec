/* train/loss.c — the loss library of lumen/loss.h: regression losses, cross-entropy, and the
 * log-probabilities and entropies of the policy heads (diagonal Gaussian, categorical), all
 * compositions of the high-level ops. */
#include "lumen/loss.h"

#include "graph-impl.h" /* lm_graph_error: the graph's sticky construction error */
#include "lumen/ops.h"

#define LM_HALF_LOG_2PI 0.918938533204672741780f /* 0.5 log(2 pi) */

static const lm_tensor invalid = {0};

/* Mean over every axis (rank 0 result). */
static lm_tensor mean_all(lm_tensor x) {
  while (lm_tensor_ok(x) && lm_rank(x) > 0) x = lm_mean(x, 0, 0);
  return x;
}

lm_tensor lm_loss_mse(lm_tensor pred, lm_tensor target) { return mean_all(lm_square(lm_sub(pred, target))); }

lm_tensor lm_loss_huber(lm_tensor pred, lm_tensor target, float delta) {
  if (!lm_tensor_ok(pred)) return invalid;
  if (!(delta > 0)) {
    lm_graph_error(pred.g, 0, "huber: delta must be > 0 (got %g)", (double)delta);
    return invalid;
  }
  lm_tensor a = lm_abs(lm_sub(pred, target));
  lm_tensor q = lm_minimum(a, lm_const(pred.g, delta));
  lm_tensor per = lm_add(lm_mul_scalar(lm_square(q), 0.5f), lm_mul_scalar(lm_sub(a, q), delta));
  return mean_all(per);
}

lm_tensor lm_loss_categorical_log_prob(lm_tensor logits, lm_tensor action) {
  return lm_gather(lm_log_softmax(logits, -1), -1, action);
}

lm_tensor lm_loss_categorical_entropy(lm_tensor logits) {
  lm_tensor logp = lm_log_softmax(logits, -1);
  return lm_neg(lm_sum(lm_mul(lm_exp(logp), logp), -1, 0));
}

lm_tensor lm_loss_cross_entropy(lm_tensor logits, lm_tensor target) {
  return lm_neg(mean_all(lm_loss_categorical_log_prob(logits, target)));
}

lm_tensor lm_loss_gaussian_log_prob(lm_tensor mean, lm_tensor log_std, lm_tensor x) {
  lm_tensor z = lm_mul(lm_sub(x, mean), lm_exp(lm_neg(log_std)));
  lm_tensor per = lm_sub(lm_add(lm_mul_scalar(lm_square(z), -0.5f), lm_neg(log_std)), lm_const(mean.g, LM_HALF_LOG_2PI));
  return lm_sum(per, -1, 0);
}

lm_tensor lm_loss_gaussian_entropy(lm_tensor mean, lm_tensor log_std) {
  if (!lm_tensor_ok(mean) || !lm_tensor_ok(log_std)) return invalid;
  /* log_std broadcast to mean's shape: a [A] parameter gives one entropy per sample */
  lm_tensor ls = lm_add(log_std, lm_scalar_like(mean, 0.5f + LM_HALF_LOG_2PI));
  return lm_sum(ls, -1, 0);
}
