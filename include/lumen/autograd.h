/* lumen/autograd.h — reverse-mode automatic differentiation as a graph transformation, and
 * stop-gradient. lm_grad appends the gradient graph of a scalar loss to the loss's own graph,
 * built from the same primitives and views as everything else, so it is compiled, fused and
 * run like any other part of the graph (DESIGN.md §1, §3). */
#ifndef LUMEN_AUTOGRAD_H
#define LUMEN_AUTOGRAD_H

#include "lumen/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Appends to loss's graph the gradient of `loss` (rank 0) with respect to each of the n
 * tensors wrt[i], and stores it in grads[i] (same shape as wrt[i]). A wrt tensor is a node
 * seen without a view: usually a PARAM input, but any node works (an intermediate result,
 * a DATA input). A wrt the loss does not depend on gets zeros (a broadcast constant).
 * Nothing is computed; the gradients are tensors like any other, to be output, assigned or
 * fed to an optimiser (lumen/optim.h). Calling lm_grad again (even on a loss that uses
 * earlier gradients) gives higher-order derivatives.
 *
 * Conventions where the derivative is not classical (subgradients at kinks):
 * - MOD, fmod(a, b) = a - trunc(a/b) * b: d/da = 1 and d/db = -trunc(a/b), computed as
 *   -(a - fmod(a, b)) / b (the rounded quotient; exact away from the kinks at multiples of b).
 *   So floor and round get gradient 0 and x mod c (constant c) gets gradient 1.
 * - LESS_THAN, and every comparison built on it: zero for both operands.
 * - MAX_REDUCE: the gradient goes to the maxima of each reduced row, split equally between
 *   them when there are ties (a row [3, 3, 1] passes g/2, g/2, 0); relu, abs, minimum,
 *   maximum and clamp, being selections, pass the gradient to the branch taken (at a tie
 *   of minimum/maximum: to the operand the select picks, see lumen/ops.h).
 * - SQRT at 0, LOG2 at 0, RECIP at 0 give inf/NaN gradients, as the calculus does.
 * - RAND, CONST and INPUT are leaves; nodes flagged by lm_detach pass no gradient.
 * Views are inverted on the gradient: permute -> inverse permute, expand -> sum over the new
 * axis, slice -> zero pad, pad -> slice, reshape -> reshape back, affine_mod -> its scatter:
 * when a, b and the extent are constants and gcd(a, n) = 1 the inverse permutation
 * affine_mod(a^-1 mod n, -a^-1 b mod n); otherwise (a non-permutation, or symbolic a, b, n) a
 * sum against the [n, n] 0/1 selection mask sel[j][i] = ((a*i + b) mod n == j), built from
 * views of arange and comparisons (O(n^2) work per gradient row, no gather).
 *
 * Errors (LM_ERR_INVALID with a message, grads[i] left invalid): a loss that is not rank 0,
 * an invalid loss (the graph's construction error is repeated), a wrt tensor of another
 * graph or not a node of this one, or one seen through a view. */
lm_status lm_grad(lm_tensor loss, const lm_tensor *wrt, int n, lm_tensor *grads);

/* Stop-gradient: the values of x, but lm_grad treats the result as a constant (PPO's
 * targets and old log-probs). Built as x + (-0.0f), an exact identity for every float
 * (-0 stays -0, NaN stays NaN), flagged so lm_grad does not differentiate through it;
 * canonicalisation removes the addition, so it costs nothing at run time. */
lm_tensor lm_detach(lm_tensor x);

#ifdef __cplusplus
}
#endif
#endif
