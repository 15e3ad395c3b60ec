/* policy/policy.c — actor-critic MLP graphs (after a convolution for image observations), categorical and diagonal-Gaussian heads, and
 * orthogonal initialisation on the host (Householder QR of a Gaussian matrix, as
 * torch.nn.init.orthogonal_ does). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/core.h"
#include "lumen/ops.h"
#include "lumen/policy.h"
#include "lumen/rand.h"

lm_policy_config lm_policy_default(void) {
  return (lm_policy_config){.hidden = {64, 64}, .layers = 2, .activation = LM_ACT_TANH, .shared = 0};
}

static lm_status add_param(lm_graph_t *g, lm_policy *p, const char *name, int rows, int cols, float gain) {
  if (p->nparams >= LM_POLICY_MAX_PARAMS) return lm_fail(LM_ERR_INVALID, "policy: too many parameters");
  int i = p->nparams++;
  snprintf(p->name[i], sizeof p->name[i], "%s", name);
  p->rows[i] = rows;
  p->cols[i] = cols;
  p->gain[i] = gain;
  lm_dim shape[2] = {rows, cols};
  p->param[i] = lm_input(g, name, LM_ROLE_PARAM, cols ? 2 : 1, shape);
  return lm_tensor_ok(p->param[i]) ? LM_OK : lm_fail(LM_ERR_INVALID, "policy: cannot declare %s", name);
}

/* The convolution's kernel [9 C, F] (rows in (dy, dx, c) order, lm_conv2d) and bias [F]. */
static lm_status add_conv(lm_graph_t *g, lm_policy *p, const char *prefix) {
  char name[24];
  snprintf(name, sizeof name, "%s.conv.w", prefix);
  lm_status st = add_param(g, p, name, 9 * p->image[2], p->cfg.conv, sqrtf(2.0f));
  snprintf(name, sizeof name, "%s.conv.b", prefix);
  return st == LM_OK ? add_param(g, p, name, p->cfg.conv, 0, 0.0f) : st;
}

/* Declares the weights and biases of one MLP: trunk layers then a head of width `out`. */
static lm_status add_mlp(lm_graph_t *g, lm_policy *p, const char *prefix, int in, int out, float head_gain,
                         int trunk) {
  char name[24];
  lm_status st = LM_OK;
  for (int l = 0; l < p->cfg.layers && trunk && st == LM_OK; l++) {
    snprintf(name, sizeof name, "%s.w%d", prefix, l);
    st = add_param(g, p, name, in, p->cfg.hidden[l], sqrtf(2.0f));
    snprintf(name, sizeof name, "%s.b%d", prefix, l);
    if (st == LM_OK) st = add_param(g, p, name, p->cfg.hidden[l], 0, 0.0f);
    in = p->cfg.hidden[l];
  }
  if (!trunk) in = p->cfg.hidden[p->cfg.layers - 1];
  snprintf(name, sizeof name, "%s.head.w", prefix);
  if (st == LM_OK) st = add_param(g, p, name, in, out, head_gain);
  snprintf(name, sizeof name, "%s.head.b", prefix);
  if (st == LM_OK) st = add_param(g, p, name, out, 0, 0.0f);
  return st;
}

lm_status lm_policy_build(lm_graph_t *g, const lm_policy_config *cfg, const lm_env_spec *env, lm_policy *out) {
  memset(out, 0, sizeof *out);
  if (!env) return lm_fail(LM_ERR_INVALID, "policy: no env");
  int obs_size = env->obs_size;
  const lm_space *action = &env->action;
  if (cfg->layers < 1 || cfg->layers > LM_POLICY_MAX_LAYERS)
    return lm_fail(LM_ERR_INVALID, "policy: %d hidden layers (1..%d supported)", cfg->layers, LM_POLICY_MAX_LAYERS);
  for (int l = 0; l < cfg->layers; l++)
    if (cfg->hidden[l] < 1) return lm_fail(LM_ERR_INVALID, "policy: hidden layer %d has width %d", l, cfg->hidden[l]);
  if (obs_size < 1 || action->n < 1) return lm_fail(LM_ERR_INVALID, "policy: empty observation or action space");
  if (cfg->conv < 0 || cfg->conv > 1024)
    return lm_fail(LM_ERR_INVALID, "policy: %d convolution filters (0 to 1024)", cfg->conv);
  if (cfg->conv && (env->obs_rank != 3 || env->obs_shape[0] < 1 || env->obs_shape[1] < 1 || env->obs_shape[2] < 1))
    return lm_fail(LM_ERR_INVALID, "policy: a convolution needs an image observation (height x width x channels), and "
                                   "%s's observation is %s", env->name ? env->name : "the env",
                   env->obs_rank ? "not of rank 3" : "a vector");
  out->cfg = *cfg;
  out->obs_size = obs_size;
  out->action = *action;
  int width = action->n, in = obs_size;
  lm_status st = LM_OK;
  if (cfg->conv) {
    memcpy(out->image, env->obs_shape, sizeof out->image);
    in = out->image[0] * out->image[1] * cfg->conv; /* the trunk's input: the flattened feature map */
    st = add_conv(g, out, "pi");
    if (st == LM_OK && !cfg->shared) st = add_conv(g, out, "v");
  }
  if (st == LM_OK) st = add_mlp(g, out, "pi", in, width, 0.01f, 1);
  if (st == LM_OK) st = add_mlp(g, out, "v", in, 1, 1.0f, !cfg->shared);
  if (st == LM_OK && action->kind == LM_SPACE_BOX) st = add_param(g, out, "pi.log_std", width, 0, 0.0f);
  return st;
}

static int find(const lm_policy *p, const char *name) {
  for (int i = 0; i < p->nparams; i++)
    if (!strcmp(p->name[i], name)) return i;
  return -1;
}

static lm_tensor param(const lm_policy *p, const char *fmt, const char *prefix, int l) {
  char name[24];
  snprintf(name, sizeof name, fmt, prefix, l);
  int i = find(p, name);
  return i >= 0 ? p->param[i] : (lm_tensor){0};
}

static lm_tensor dense(lm_tensor x, lm_tensor w, lm_tensor b) { return lm_add(lm_matmul(x, w), b); }

static lm_tensor activate(const lm_policy *p, lm_tensor x) {
  return p->cfg.activation == LM_ACT_RELU ? lm_relu(x) : lm_tanh(x);
}

static lm_tensor trunk(const lm_policy *p, const char *prefix, lm_tensor x) {
  if (p->cfg.conv) { /* [B, H*W*C] -> image -> relu(conv + b) -> [B, H*W*F] */
    lm_dim b = lm_dim_of(x, 0), h = p->image[0], w = p->image[1];
    lm_tensor img = lm_reshape(x, 4, (lm_dim[]){b, h, w, p->image[2]});
    lm_tensor y = lm_conv2d(img, param(p, "%s.conv.w", prefix, 0), 3, 3);
    y = lm_relu(lm_add(y, param(p, "%s.conv.b", prefix, 0)));
    x = lm_reshape(y, 2, (lm_dim[]){b, h * w * p->cfg.conv});
  }
  for (int l = 0; l < p->cfg.layers; l++)
    x = activate(p, dense(x, param(p, "%s.w%d", prefix, l), param(p, "%s.b%d", prefix, l)));
  return x;
}

static lm_tensor head(const lm_policy *p, const char *prefix, lm_tensor h) {
  return dense(h, param(p, "%s.head.w", prefix, 0), param(p, "%s.head.b", prefix, 0));
}

static lm_tensor value_from(const lm_policy *p, lm_tensor h_value) {
  lm_tensor v = head(p, "v", h_value); /* [B, 1] */
  return lm_squeeze(v, 1);
}

lm_status lm_policy_forward(const lm_policy *p, lm_tensor obs, lm_policy_out *out) {
  memset(out, 0, sizeof *out);
  lm_tensor h = trunk(p, "pi", obs);
  lm_tensor a = head(p, "pi", h);
  if (p->action.kind == LM_SPACE_DISCRETE) out->logits = a;
  else {
    out->mean = a;
    out->log_std = p->param[find(p, "pi.log_std")];
  }
  out->value = value_from(p, p->cfg.shared ? h : trunk(p, "v", obs));
  if (!lm_tensor_ok(a) || !lm_tensor_ok(out->value)) return lm_fail(LM_ERR_INVALID, "policy: building the forward graph failed");
  return LM_OK;
}

lm_tensor lm_policy_value(const lm_policy *p, lm_tensor obs) {
  return value_from(p, p->cfg.shared ? trunk(p, "pi", obs) : trunk(p, "v", obs));
}

lm_tensor lm_policy_log_prob(const lm_policy *p, const lm_policy_out *o, lm_tensor action) {
  if (p->action.kind == LM_SPACE_DISCRETE) return lm_gather(lm_log_softmax(o->logits, 1), 1, action);
  /* sum over dims of -((a-mu)^2)/(2 s^2) - log s - log sqrt(2 pi) */
  lm_tensor z = lm_mul(lm_sub(action, o->mean), lm_exp(lm_neg(o->log_std)));
  lm_tensor lp = lm_add_scalar(lm_add(lm_mul_scalar(lm_square(z), -0.5f), lm_neg(o->log_std)),
                               -0.5f * logf(2.0f * (float)M_PI));
  return lm_sum(lp, 1, 0);
}

lm_tensor lm_policy_entropy(const lm_policy *p, const lm_policy_out *o) {
  if (p->action.kind == LM_SPACE_DISCRETE) {
    lm_tensor logp = lm_log_softmax(o->logits, 1);
    return lm_neg(lm_sum(lm_mul(lm_exp(logp), logp), 1, 0));
  }
  /* per dim: 0.5 + 0.5 log(2 pi) + log s, the same for every row */
  lm_tensor per = lm_add_scalar(o->log_std, 0.5f + 0.5f * logf(2.0f * (float)M_PI));
  lm_tensor total = lm_sum(per, 0, 0);
  lm_dim b = lm_dim_of(o->mean, 0);
  return lm_expand(total, 0, b);
}

lm_tensor lm_policy_sample(const lm_policy *p, const lm_policy_out *o, uint32_t stream, lm_tensor *logp) {
  if (p->action.kind == LM_SPACE_DISCRETE) {
    lm_tensor logits = o->logits;
    lm_graph_t *g = logits.g;
    lm_dim b = lm_dim_of(logits, 0);
    int n = p->action.n;
    /* inverse CDF: the number of cumulative probabilities below u, clamped to n-1 */
    lm_tensor cdf = lm_cumsum(lm_softmax(logits, 1), 1);
    lm_tensor u = lm_rand_stream(g, stream, 2, (lm_dim[]){b, 1});
    lm_tensor total = lm_slice(cdf, 1, n - 1, n);
    lm_tensor a = lm_sum(lm_lt(cdf, lm_mul(u, total)), 1, 0);
    a = lm_minimum(a, lm_scalar_like(a, (float)(n - 1)));
    if (logp) *logp = lm_policy_log_prob(p, o, a);
    return a;
  }
  lm_graph_t *g = o->mean.g;
  lm_dim b = lm_dim_of(o->mean, 0);
  int n = p->action.n;
  lm_tensor u = lm_rand_stream(g, stream, 3, (lm_dim[]){b, n, 2});
  lm_tensor u1 = lm_squeeze(lm_slice(u, 2, 0, 1), 2), u2 = lm_squeeze(lm_slice(u, 2, 1, 2), 2);
  lm_tensor r = lm_sqrt(lm_mul_scalar(lm_log(u1), -2.0f));
  lm_tensor z = lm_mul(r, lm_cos(lm_mul_scalar(u2, 2.0f * (float)M_PI)));
  lm_tensor a = lm_add(o->mean, lm_mul(lm_exp(o->log_std), z));
  if (logp) *logp = lm_policy_log_prob(p, o, a);
  return a;
}

/* ---------------------------------------------------------------- initialisation */

size_t lm_policy_param_size(const lm_policy *p, int i) {
  return (size_t)p->rows[i] * (size_t)(p->cols[i] ? p->cols[i] : 1);
}

/* Standard normals from Philox (Box-Muller), so initialisation is reproducible everywhere. */
static double gauss(uint64_t seed, uint32_t stream, uint64_t k) {
  double u1 = lm_rand_uniform(seed, stream, 2 * k, 0), u2 = lm_rand_uniform(seed, stream, 2 * k + 1, 0);
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* q (rows x cols, row-major) gets orthonormal rows (rows <= cols) or columns (rows > cols). */
static lm_status orthogonal(double *q, int rows, int cols, uint64_t seed, uint32_t stream) {
  int tall = rows >= cols, m = tall ? rows : cols, n = tall ? cols : rows; /* work on m x n, m >= n */
  double *a = lm_malloc((size_t)m * (size_t)n * sizeof *a), *v = lm_malloc((size_t)m * sizeof *v);
  double *sgn = lm_malloc((size_t)n * sizeof *sgn);
  if (!a || !v || !sgn) {
    lm_free(a), lm_free(v), lm_free(sgn);
    return LM_ERR_NOMEM;
  }
  for (int i = 0; i < m * n; i++) a[i] = gauss(seed, stream, (uint64_t)i);
  /* Householder QR of a (m x n): q = the first n columns of Q, with sign(diag R) folded in */
  double *qm = q; /* m x n, filled below */
  for (int i = 0; i < m * n; i++) qm[i] = (i / n) == (i % n) ? 1.0 : 0.0;
  double *r = a;
  double *vs = lm_malloc((size_t)m * (size_t)n * sizeof *vs);
  if (!vs) {
    lm_free(a), lm_free(v), lm_free(sgn);
    return LM_ERR_NOMEM;
  }
  for (int k = 0; k < n; k++) {
    double norm = 0;
    for (int i = k; i < m; i++) norm += r[i * n + k] * r[i * n + k];
    norm = sqrt(norm);
    double alpha = r[k * n + k] > 0 ? -norm : norm;
    for (int i = 0; i < m; i++) v[i] = i < k ? 0 : r[i * n + k];
    v[k] -= alpha;
    double vn = 0;
    for (int i = k; i < m; i++) vn += v[i] * v[i];
    for (int i = 0; i < m; i++) vs[i * n + k] = vn > 0 ? v[i] / sqrt(vn) : 0;
    for (int j = 0; j < n; j++) { /* r = (I - 2 v v^T) r */
      double d = 0;
      for (int i = k; i < m; i++) d += vs[i * n + k] * r[i * n + j];
      for (int i = k; i < m; i++) r[i * n + j] -= 2 * vs[i * n + k] * d;
    }
    sgn[k] = r[k * n + k] < 0 ? -1.0 : 1.0;
  }
  for (int k = n - 1; k >= 0; k--) /* Q = H0 H1 ... applied to the first n columns of I */
    for (int j = 0; j < n; j++) {
      double d = 0;
      for (int i = k; i < m; i++) d += vs[i * n + k] * qm[i * n + j];
      for (int i = k; i < m; i++) qm[i * n + j] -= 2 * vs[i * n + k] * d;
    }
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) qm[i * n + j] *= sgn[j];
  if (!tall) { /* we built the transpose: q must be rows x cols with orthonormal rows */
    double *t = a;
    memcpy(t, qm, (size_t)m * (size_t)n * sizeof *t);
    for (int i = 0; i < rows; i++)
      for (int j = 0; j < cols; j++) q[i * cols + j] = t[j * n + i];
  }
  lm_free(a), lm_free(v), lm_free(sgn), lm_free(vs);
  return LM_OK;
}

lm_status lm_policy_init(const lm_policy *p, lm_program_t *prog, uint64_t seed) {
  for (int i = 0; i < p->nparams; i++) {
    size_t n = lm_policy_param_size(p, i);
    float *w = lm_calloc(n, sizeof *w);
    double *q = lm_calloc(n, sizeof *q);
    lm_status st = !w || !q ? LM_ERR_NOMEM : LM_OK;
    if (st == LM_OK && p->cols[i]) {
      /* torch orients a Linear weight as [out, in]; lumen's is [in, out]: orthogonalise the
       * transpose so the same rows/columns come out orthonormal */
      st = orthogonal(q, p->cols[i], p->rows[i], seed, 2000u + (uint32_t)i);
      for (int r = 0; r < p->rows[i] && st == LM_OK; r++)
        for (int c = 0; c < p->cols[i]; c++) w[r * p->cols[i] + c] = (float)(p->gain[i] * q[c * p->rows[i] + r]);
    }
    if (st == LM_OK) st = lm_program_write(prog, p->name[i], w, n);
    lm_free(w);
    lm_free(q);
    if (st != LM_OK) return st;
  }
  return LM_OK;
}
