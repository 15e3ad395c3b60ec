/* train/optim.c — optimisers as graphs (lumen/optim.h): SGD with momentum and Nesterov, Adam
 * and AdamW with in-graph bias correction, and global gradient-norm clipping. Each adds its
 * STATE inputs, a learning-rate DATA input and lm_assign updates to the parameters' graph. */
#include "lumen/optim.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "graph-impl.h"
#include "lumen/ops.h"

lm_sgd_cfg lm_optim_sgd_defaults(void) { return (lm_sgd_cfg){.lr_name = "lr", .prefix = "sgd"}; }

lm_adam_cfg lm_optim_adam_defaults(void) {
  return (lm_adam_cfg){.lr_name = "lr", .prefix = "adam", .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
}

lm_adam_cfg lm_optim_adamw_defaults(void) {
  lm_adam_cfg c = lm_optim_adam_defaults();
  c.prefix = "adamw";
  c.weight_decay = 0.01f;
  c.decoupled = 1;
  return c;
}

/* ---------------------------------------------------------------- checks and names */

static const char *input_name(lm_tensor t) {
  const lm_node *n = &t.g->nodes[t.node];
  return t.g->inputs[n->input].name;
}

static lm_status check_lists(const char *what, const lm_tensor *params, const lm_tensor *grads, int n) {
  if (n <= 0 || !params || !grads) return lm_fail(LM_ERR_INVALID, "%s: needs n >= 1 parameters and their gradients", what);
  lm_graph_t *g = params[0].g;
  if (!g) return lm_fail(LM_ERR_INVALID, "%s: params[0] is an invalid tensor", what);
  if (g->err) return lm_fail(g->err, "%s: the graph has an error: %s", what, g->errmsg ? g->errmsg : "out of memory");
  for (int i = 0; i < n; i++) {
    lm_tensor p = params[i], d = grads[i];
    if (p.g != g || !lm_tensor_ok(p)) return lm_fail(LM_ERR_INVALID, "%s: params[%d] is not a tensor of params[0]'s graph", what, i);
    const lm_node *nd = &g->nodes[p.node];
    if (nd->op != LM_OP_INPUT || p.view || g->inputs[nd->input].role == LM_ROLE_DATA)
      return lm_fail(LM_ERR_INVALID, "%s: params[%d] must be a PARAM or STATE input seen without a view", what, i);
    if (d.g != g || !lm_tensor_ok(d))
      return lm_fail(LM_ERR_INVALID, "%s: grads[%d] (for %s) is not a valid tensor of the same graph", what, i,
                     input_name(p));
    int same = lm_rank(d) == lm_rank(p);
    for (int k = 0; same && k < lm_rank(p); k++) same = lm_dim_equal(g, lm_dim_of(d, k), lm_dim_of(p, k));
    if (!same) return lm_fail(LM_ERR_INVALID, "%s: grads[%d] does not have the shape of %s", what, i, input_name(p));
  }
  return LM_OK;
}

/* The rank-0 DATA input `name`: the graph's own if it has one, else a new one. */
static lm_tensor lr_input(lm_graph_t *g, const char *name) {
  for (size_t i = 0; i < g->ninputs; i++) {
    if (strcmp(g->inputs[i].name, name)) continue;
    uint32_t node = g->inputs[i].node;
    if (g->inputs[i].role != LM_ROLE_DATA || g->nodes[node].shape.rank != 0) {
      lm_fail(LM_ERR_INVALID, "optimiser: input %s exists but is not a rank-0 data input (the learning rate)", name);
      return (lm_tensor){0};
    }
    return (lm_tensor){g, node, 0};
  }
  lm_tensor t = lm_input(g, name, LM_ROLE_DATA, 0, NULL);
  if (!lm_tensor_ok(t)) lm_fail(LM_ERR_INVALID, "optimiser: learning rate %s: %s", name, g->errmsg ? g->errmsg : "?");
  return t;
}

/* A zero-initialised STATE input shaped like p, named "<prefix>.<what>.<p's name>". */
static lm_tensor state_like(lm_tensor p, const char *prefix, const char *what) {
  lm_sb sb = {0};
  lm_sb_printf(&sb, "%s.%s.%s", prefix, what, input_name(p));
  char *name = lm_sb_take(&sb);
  if (!name) return (lm_tensor){0};
  lm_dim dims[LM_MAX_RANK];
  int r = lm_rank(p);
  for (int i = 0; i < r; i++) dims[i] = lm_dim_of(p, i);
  lm_tensor s = lm_input(p.g, name, LM_ROLE_STATE, r, dims);
  if (!lm_tensor_ok(s)) lm_fail(LM_ERR_INVALID, "optimiser: state %s: %s", name, p.g->errmsg ? p.g->errmsg : "?");
  lm_free(name);
  return s;
}

static lm_status assign(lm_tensor target, lm_tensor value) {
  if (!lm_tensor_ok(value)) {
    lm_graph_t *g = target.g;
    return lm_fail(g->err ? g->err : LM_ERR_INVALID, "optimiser: building the update failed: %s",
                   g->errmsg ? g->errmsg : "invalid tensor");
  }
  return lm_assign(target, value);
}

/* ---------------------------------------------------------------- clipping */

static lm_tensor sum_all(lm_tensor x) {
  while (lm_tensor_ok(x) && lm_rank(x) > 0) x = lm_sum_reduce(x, -1);
  return x;
}

static lm_tensor global_norm(const lm_tensor *grads, int n) {
  lm_tensor acc = {0};
  for (int i = 0; i < n; i++) {
    lm_tensor s = sum_all(lm_square(grads[i]));
    acc = i ? lm_add(acc, s) : s;
  }
  return lm_sqrt(acc);
}

lm_status lm_optim_clip_grad_norm(const lm_tensor *grads, int n, float max_norm, lm_tensor *clipped,
                                  lm_tensor *norm) {
  if (n <= 0 || !grads || !clipped) return lm_fail(LM_ERR_INVALID, "clip_grad_norm: needs n >= 1 gradients");
  if (!(max_norm > 0)) return lm_fail(LM_ERR_INVALID, "clip_grad_norm: max_norm must be > 0 (got %g)", (double)max_norm);
  lm_graph_t *g = grads[0].g;
  for (int i = 0; i < n; i++)
    if (!lm_tensor_ok(grads[i]) || grads[i].g != g)
      return lm_fail(LM_ERR_INVALID, "clip_grad_norm: grads[%d] is not a valid tensor of grads[0]'s graph", i);
  lm_tensor total = global_norm(grads, n);
  lm_tensor coef = lm_mul_scalar(lm_recip(lm_add_scalar(total, 1e-6f)), max_norm);
  coef = lm_minimum(coef, lm_const(g, 1.0f));
  for (int i = 0; i < n; i++) clipped[i] = lm_mul(grads[i], coef);
  if (norm) *norm = total;
  if (g->err) return lm_fail(g->err, "clip_grad_norm: %s", g->errmsg ? g->errmsg : "out of memory");
  return LM_OK;
}

/* Clips into a fresh array when asked (max_norm > 0), and reports the pre-clip norm. */
static lm_status prepare_grads(const lm_tensor *grads, int n, float max_norm, lm_tensor *out, lm_tensor *norm) {
  if (max_norm > 0) return lm_optim_clip_grad_norm(grads, n, max_norm, out, norm);
  memcpy(out, grads, (size_t)n * sizeof *out);
  if (norm) {
    *norm = global_norm(grads, n);
    if (!lm_tensor_ok(*norm)) return lm_fail(LM_ERR_INVALID, "optimiser: gradient norm: invalid tensor");
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- SGD */

lm_status lm_optim_sgd(const lm_sgd_cfg *cfg, const lm_tensor *params, const lm_tensor *grads, int n,
                       lm_tensor *grad_norm) {
  lm_sgd_cfg c = cfg ? *cfg : lm_optim_sgd_defaults();
  if (!c.lr_name || !*c.lr_name) c.lr_name = "lr";
  if (!c.prefix || !*c.prefix) c.prefix = "sgd";
  lm_status st = check_lists("sgd", params, grads, n);
  if (st != LM_OK) return st;
  if (c.momentum < 0 || c.weight_decay < 0 || (c.nesterov && c.momentum <= 0))
    return lm_fail(LM_ERR_INVALID, "sgd: momentum and weight_decay must be >= 0, and Nesterov needs momentum > 0");
  lm_graph_t *g = params[0].g;
  lm_tensor *gs = lm_malloc((size_t)n * sizeof *gs);
  if (!gs) return LM_ERR_NOMEM;
  if ((st = prepare_grads(grads, n, c.max_grad_norm, gs, grad_norm)) != LM_OK) goto done;
  lm_tensor lr = lr_input(g, c.lr_name);
  if (!lm_tensor_ok(lr)) {
    st = LM_ERR_INVALID;
    goto done;
  }
  for (int i = 0; i < n && st == LM_OK; i++) {
    lm_tensor p = params[i], d = gs[i];
    if (c.weight_decay > 0) d = lm_add(d, lm_mul_scalar(p, c.weight_decay));
    if (c.momentum > 0) {
      lm_tensor buf = state_like(p, c.prefix, "buf");
      if (!lm_tensor_ok(buf)) {
        st = LM_ERR_INVALID;
        break;
      }
      lm_tensor nb = lm_add(lm_mul_scalar(buf, c.momentum), d);
      if ((st = assign(buf, nb)) != LM_OK) break;
      d = c.nesterov ? lm_add(d, lm_mul_scalar(nb, c.momentum)) : nb;
    }
    st = assign(p, lm_sub(p, lm_mul(d, lr)));
  }
done:
  lm_free(gs);
  return st;
}

/* ---------------------------------------------------------------- Adam, AdamW */

/* 1 - beta^t, with beta^t = exp2(t log2 beta); log2 beta taken in double, rounded once. */
static lm_tensor bias_correction(lm_tensor t, float beta) {
  float l2 = (float)log2((double)beta);
  return lm_sub(lm_const(t.g, 1.0f), lm_exp2(lm_mul_scalar(t, l2)));
}

lm_status lm_optim_adam(const lm_adam_cfg *cfg, const lm_tensor *params, const lm_tensor *grads, int n,
                        lm_tensor *grad_norm) {
  lm_adam_cfg c = cfg ? *cfg : lm_optim_adam_defaults();
  if (!c.lr_name || !*c.lr_name) c.lr_name = "lr";
  if (!c.prefix || !*c.prefix) c.prefix = c.decoupled ? "adamw" : "adam";
  const char *what = c.decoupled ? "adamw" : "adam";
  lm_status st = check_lists(what, params, grads, n);
  if (st != LM_OK) return st;
  if (!(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1 && c.eps >= 0 && c.weight_decay >= 0))
    return lm_fail(LM_ERR_INVALID, "%s: needs 0 <= beta1, beta2 < 1, eps >= 0 and weight_decay >= 0", what);
  lm_graph_t *g = params[0].g;
  lm_tensor *gs = lm_malloc((size_t)n * sizeof *gs);
  if (!gs) return LM_ERR_NOMEM;
  if ((st = prepare_grads(grads, n, c.max_grad_norm, gs, grad_norm)) != LM_OK) goto done;
  lm_tensor lr = lr_input(g, c.lr_name);
  if (!lm_tensor_ok(lr)) {
    st = LM_ERR_INVALID;
    goto done;
  }
  /* the step count: t' = t + 1, used by this step's bias correction */
  lm_sb sb = {0};
  lm_sb_printf(&sb, "%s.t", c.prefix);
  char *tname = lm_sb_take(&sb);
  if (!tname) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  lm_tensor t = lm_input(g, tname, LM_ROLE_STATE, 0, NULL);
  if (!lm_tensor_ok(t)) {
    st = lm_fail(LM_ERR_INVALID, "%s: step count %s: %s", what, tname, g->errmsg ? g->errmsg : "?");
    lm_free(tname);
    goto done;
  }
  lm_free(tname);
  lm_tensor t1 = lm_add_scalar(t, 1.0f);
  if ((st = assign(t, t1)) != LM_OK) goto done;
  /* step = lr / (1 - b1^t); denominator sqrt(v) / sqrt(1 - b2^t) + eps, as PyTorch */
  lm_tensor step = lm_mul(lr, lm_recip(bias_correction(t1, c.beta1)));
  lm_tensor inv_sqrt_bc2 = lm_recip(lm_sqrt(bias_correction(t1, c.beta2)));
  lm_tensor eps = lm_const(g, c.eps);
  for (int i = 0; i < n && st == LM_OK; i++) {
    lm_tensor p = params[i], d = gs[i], p0 = p;
    if (c.weight_decay > 0) {
      if (c.decoupled) p0 = lm_mul(p, lm_sub(lm_const(g, 1.0f), lm_mul_scalar(lr, c.weight_decay)));
      else d = lm_add(d, lm_mul_scalar(p, c.weight_decay));
    }
    lm_tensor m = state_like(p, c.prefix, "m"), v = state_like(p, c.prefix, "v");
    if (!lm_tensor_ok(m) || !lm_tensor_ok(v)) {
      st = LM_ERR_INVALID;
      break;
    }
    lm_tensor m1 = lm_add(lm_mul_scalar(m, c.beta1), lm_mul_scalar(d, 1.0f - c.beta1));
    lm_tensor v1 = lm_add(lm_mul_scalar(v, c.beta2), lm_mul_scalar(lm_square(d), 1.0f - c.beta2));
    lm_tensor denom = lm_add(lm_mul(lm_sqrt(v1), inv_sqrt_bc2), eps);
    lm_tensor p1 = lm_sub(p0, lm_mul(lm_mul(m1, step), lm_recip(denom)));
    if ((st = assign(m, m1)) != LM_OK || (st = assign(v, v1)) != LM_OK) break;
    st = assign(p, p1);
  }
done:
  lm_free(gs);
  return st;
}
