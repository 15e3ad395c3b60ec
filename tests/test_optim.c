/* Tests for the optimisers as graphs (train/optim.c): SGD (momentum, Nesterov, weight decay),
 * Adam and AdamW against a plain-C double-precision implementation of PyTorch's update rules,
 * step by step over several runs (so the step-count state, the bias correction and the
 * learning-rate input are exercised), on "ref" and "cpu"; global gradient-norm clipping; the
 * names and errors of the API; and a small MLP (1-32-32-1, tanh) trained with Adam on
 * y = sin(3x), whose loss curve must fall and agree between "ref" and "cpu".
 *
 * Tolerances: an optimiser step is float32 arithmetic over O(1) values, compared with the
 * double reference with rtol 1e-6 (atol 1e-7 for values that cross zero). The MLP curves of
 * ref and cpu may differ by summation order only: 1e-3 relative per step over 200 steps. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lumen/autograd.h"
#include "lumen/loss.h"
#include "lumen/ops.h"
#include "lumen/optim.h"
#include "support/check.h"
#include "support/timeout.h"

static int have_cpu(void) {
  static int known = -1;
  if (known < 0) {
    lm_backend_t *b = lm_backend_new("cpu");
    known = b != NULL;
    lm_backend_free(b);
  }
  return known;
}

static int nbackends(void) { return 1 + have_cpu(); }
static const char *backend_at(int i) { return i ? "cpu" : "ref"; }

/* ---------------------------------------------------------------- plain-C references */

enum { NP = 2, N0 = 12, N1 = 5, NMAX = 12 };
static const size_t sizes[NP] = {N0, N1};

typedef struct ref_opt {
  int kind; /* 0 SGD, 1 Adam */
  double momentum, wd, beta1, beta2, eps, max_norm;
  int nesterov, decoupled;
  double p[NP][NMAX], m[NP][NMAX], v[NP][NMAX];
  double t;
} ref_opt;

/* One step of PyTorch's rule, in double, on gradients g (float inputs). Returns the pre-clip norm. */
static double ref_step(ref_opt *o, float g[NP][NMAX], double lr) {
  double sq = 0, coef = 1;
  for (int i = 0; i < NP; i++)
    for (size_t k = 0; k < sizes[i]; k++) sq += (double)g[i][k] * g[i][k];
  double norm = sqrt(sq);
  if (o->max_norm > 0) coef = fmin(1.0, o->max_norm / (norm + 1e-6));
  o->t += 1;
  for (int i = 0; i < NP; i++)
    for (size_t k = 0; k < sizes[i]; k++) {
      double d = g[i][k] * coef, *p = &o->p[i][k];
      if (o->kind == 0) {
        d += o->wd * *p;
        if (o->momentum > 0) {
          o->m[i][k] = o->momentum * o->m[i][k] + d;
          d = o->nesterov ? d + o->momentum * o->m[i][k] : o->m[i][k];
        }
        *p -= lr * d;
      } else {
        if (o->decoupled) *p *= 1 - lr * o->wd;
        else d += o->wd * *p;
        o->m[i][k] = o->beta1 * o->m[i][k] + (1 - o->beta1) * d;
        o->v[i][k] = o->beta2 * o->v[i][k] + (1 - o->beta2) * d * d;
        double mh = o->m[i][k] / (1 - pow(o->beta1, o->t)), vh = o->v[i][k] / (1 - pow(o->beta2, o->t));
        *p -= lr * mh / (sqrt(vh) + o->eps);
      }
    }
  return norm;
}

/* ---------------------------------------------------------------- graph side */

typedef lm_status (*apply_fn)(const void *cfg, const lm_tensor *params, const lm_tensor *grads, int n,
                              lm_tensor *grad_norm);
static lm_status apply_sgd(const void *cfg, const lm_tensor *p, const lm_tensor *g, int n, lm_tensor *norm) {
  return lm_optim_sgd(cfg, p, g, n, norm);
}
static lm_status apply_adam(const void *cfg, const lm_tensor *p, const lm_tensor *g, int n, lm_tensor *norm) {
  return lm_optim_adam(cfg, p, g, n, norm);
}

/* Params p0 [3,4] and p1 [5] with their gradients fed as DATA inputs g0, g1; four steps with
 * a new gradient and learning rate each; after each, the params (and the reported norm) are
 * compared with ref_step. */
static void step_check(const char *what, apply_fn apply, const void *cfg, ref_opt ro, float grad_scale,
                       uint64_t seed) {
  lm_graph_t *gr = lm_graph_new();
  lm_tensor p[NP] = {lm_input(gr, "p0", LM_ROLE_PARAM, 2, (lm_dim[]){3, 4}),
                     lm_input(gr, "p1", LM_ROLE_PARAM, 1, (lm_dim[]){5})};
  lm_tensor g[NP] = {lm_input(gr, "g0", LM_ROLE_DATA, 2, (lm_dim[]){3, 4}),
                     lm_input(gr, "g1", LM_ROLE_DATA, 1, (lm_dim[]){5})};
  lm_tensor norm;
  cr_assert(apply(cfg, p, g, NP, &norm) == LM_OK, "%s: %s", what, lm_last_error());
  cr_assert(lm_output(norm, "norm") == LM_OK, "%s", lm_last_error());
  cr_assert(lm_graph_validate(gr) == LM_OK, "%s", lm_last_error());
  for (int b = 0; b < nbackends(); b++) {
    check_prog pr = check_prog_new(gr, backend_at(b));
    check_rng r = check_rng_new(seed);
    ref_opt o = ro;
    float pf[NP][NMAX], gf[NP][NMAX], got[NMAX];
    for (int i = 0; i < NP; i++) {
      check_fill(&r, pf[i], sizes[i], -1, 1, 0.05);
      for (size_t k = 0; k < sizes[i]; k++) o.p[i][k] = pf[i][k];
      char name[4] = {'p', (char)('0' + i), 0};
      cr_assert(lm_program_write(pr.program, name, pf[i], sizes[i]) == LM_OK, "%s", lm_last_error());
    }
    for (int step = 0; step < 4; step++) {
      float lr = (float)(0.01 * (4 - step)); /* a linearly annealed rate, fed each run */
      for (int i = 0; i < NP; i++) check_fill(&r, gf[i], sizes[i], -grad_scale, grad_scale, 0.01 * grad_scale);
      double want_norm = ref_step(&o, gf, lr);
      float nf;
      check_prog_run(&pr, NULL, 0,
                     (check_buf[]){{"g0", gf[0], N0}, {"g1", gf[1], N1}, {"lr", &lr, 1}}, 3,
                     (check_buf[]){{"norm", &nf, 1}}, 1);
      char msg[128];
      snprintf(msg, sizeof msg, "%s on %s, step %d: pre-clip gradient norm", what, backend_at(b), step + 1);
      check_close(msg, &nf, &want_norm, 1, 1e-6, 0);
      for (int i = 0; i < NP; i++) {
        char name[4] = {'p', (char)('0' + i), 0};
        check_poison(got, sizes[i]);
        cr_assert(lm_program_read(pr.program, name, got, sizes[i]) == LM_OK, "%s", lm_last_error());
        snprintf(msg, sizeof msg, "%s on %s, step %d: %s", what, backend_at(b), step + 1, name);
        check_close(msg, got, o.p[i], sizes[i], 1e-6, 1e-7);
      }
    }
    check_prog_free(&pr);
  }
  lm_graph_free(gr);
}

/* ---------------------------------------------------------------- update rules */

Test(optim, adam_matches_plain_c_over_four_steps_with_an_annealed_lr) {
  lm_adam_cfg c = lm_optim_adam_defaults();
  step_check("adam", apply_adam, &c, (ref_opt){.kind = 1, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f}, 1, 1);
}

Test(optim, adam_with_l2_weight_decay_matches_plain_c) {
  lm_adam_cfg c = lm_optim_adam_defaults();
  c.weight_decay = 0.05f;
  step_check("adam+L2", apply_adam, &c,
             (ref_opt){.kind = 1, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .wd = 0.05f}, 1, 2);
}

Test(optim, adamw_decoupled_weight_decay_matches_plain_c) {
  lm_adam_cfg c = lm_optim_adamw_defaults();
  c.weight_decay = 0.1f;
  c.beta1 = 0.8f;
  c.beta2 = 0.99f;
  c.eps = 1e-6f;
  step_check("adamw", apply_adam, &c,
             (ref_opt){.kind = 1, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .wd = 0.1f, .decoupled = 1}, 1, 3);
}

Test(optim, sgd_plain_matches_plain_c) {
  lm_sgd_cfg c = lm_optim_sgd_defaults();
  step_check("sgd", apply_sgd, &c, (ref_opt){.kind = 0}, 1, 4);
}

Test(optim, sgd_momentum_matches_plain_c) {
  lm_sgd_cfg c = lm_optim_sgd_defaults();
  c.momentum = 0.9f;
  c.weight_decay = 0.01f;
  step_check("sgd momentum", apply_sgd, &c, (ref_opt){.kind = 0, .momentum = 0.9f, .wd = 0.01f}, 1, 5);
}

Test(optim, sgd_nesterov_matches_plain_c) {
  lm_sgd_cfg c = lm_optim_sgd_defaults();
  c.momentum = 0.8f;
  c.nesterov = 1;
  step_check("sgd nesterov", apply_sgd, &c, (ref_opt){.kind = 0, .momentum = 0.8f, .nesterov = 1}, 1, 6);
}

Test(optim, clipping_scales_large_gradients_to_max_norm_before_adam) {
  lm_adam_cfg c = lm_optim_adam_defaults();
  c.max_grad_norm = 0.5f;
  /* gradients of norm ~10: clipped every step (Adam is scale-invariant only up to eps, so
   * SGD below checks the scale itself) */
  step_check("adam clip", apply_adam, &c,
             (ref_opt){.kind = 1, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .max_norm = 0.5f}, 3, 7);
}

Test(optim, clipping_scales_sgd_steps_and_leaves_small_gradients_alone) {
  lm_sgd_cfg c = lm_optim_sgd_defaults();
  c.max_grad_norm = 1.0f;
  c.momentum = 0.5f;
  step_check("sgd clip (large)", apply_sgd, &c, (ref_opt){.kind = 0, .momentum = 0.5f, .max_norm = 1.0f}, 2, 8);
  step_check("sgd clip (small)", apply_sgd, &c, (ref_opt){.kind = 0, .momentum = 0.5f, .max_norm = 1.0f}, 0.05f, 9);
}

Test(optim, clip_grad_norm_alone_returns_scaled_gradients_and_the_norm) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor a = lm_input(g, "a", LM_ROLE_DATA, 1, (lm_dim[]){2});
  lm_tensor b = lm_input(g, "b", LM_ROLE_DATA, 0, NULL);
  lm_tensor in[2] = {a, b}, out[2], norm;
  cr_assert(lm_optim_clip_grad_norm(in, 2, 2.5f, out, &norm) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_output(out[0], "ca") == LM_OK && lm_output(out[1], "cb") == LM_OK && lm_output(norm, "n") == LM_OK);
  float as[2] = {3, 4}, bs = 12, ca[2], cb, n; /* norm 13 */
  check_run_ref(g, NULL, 0, (check_buf[]){{"a", as, 2}, {"b", &bs, 1}}, 2,
                (check_buf[]){{"ca", ca, 2}, {"cb", &cb, 1}, {"n", &n, 1}}, 3);
  double k = 2.5 / (13 + 1e-6), wa[2] = {3 * k, 4 * k}, wb = 12 * k, wn = 13;
  check_close("clipped a", ca, wa, 2, 1e-6, 0);
  check_close("clipped b", &cb, &wb, 1, 1e-6, 0);
  check_close("norm", &n, &wn, 1, 1e-7, 0);
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- names and errors */

Test(optim, creates_named_state_and_shares_one_lr_input_between_optimisers) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor v = lm_input(g, "v", LM_ROLE_PARAM, 1, (lm_dim[]){2});
  lm_tensor loss = lm_add(lm_sum(lm_square(w), 0, 0), lm_sum(lm_exp(v), 0, 0)), gs[2];
  cr_assert(lm_grad(loss, (lm_tensor[]){w, v}, 2, gs) == LM_OK, "%s", lm_last_error());
  lm_adam_cfg ac = lm_optim_adam_defaults();
  lm_sgd_cfg sc = lm_optim_sgd_defaults();
  sc.momentum = 0.9f;
  cr_assert(lm_optim_adam(&ac, &w, &gs[0], 1, NULL) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_optim_sgd(&sc, &v, &gs[1], 1, NULL) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_graph_validate(g) == LM_OK, "%s", lm_last_error());
  check_prog p = check_prog_new(g, "ref");
  size_t n;
  const char *names[] = {"lr", "adam.m.w", "adam.v.w", "adam.t", "sgd.buf.v"};
  const size_t want[] = {1, 3, 3, 1, 2};
  for (int i = 0; i < 5; i++) {
    cr_assert(lm_program_numel(p.program, names[i], &n) == LM_OK, "%s: %s", names[i], lm_last_error());
    cr_assert_eq(n, want[i], "%s holds %zu", names[i], n);
  }
  /* t counts runs */
  float lr = 0.1f, ws[3] = {1, 2, 3}, t;
  cr_assert(lm_program_write(p.program, "w", ws, 3) == LM_OK);
  for (int i = 0; i < 3; i++) check_prog_run(&p, NULL, 0, (check_buf[]){{"lr", &lr, 1}}, 1, NULL, 0);
  cr_assert(lm_program_read(p.program, "adam.t", &t, 1) == LM_OK);
  cr_assert_eq(t, 3.0f, "adam.t after 3 runs is %g", (double)t);
  check_prog_free(&p);
  lm_graph_free(g);
}

Test(optim, errors_name_the_problem) {
  lm_graph_t *g = lm_graph_new();
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 1, (lm_dim[]){3});
  lm_tensor d = lm_input(g, "d", LM_ROLE_DATA, 1, (lm_dim[]){3});
  lm_tensor g4 = lm_input(g, "g4", LM_ROLE_DATA, 1, (lm_dim[]){4});
  lm_adam_cfg c = lm_optim_adam_defaults();
  cr_assert_eq(lm_optim_adam(&c, &d, &w, 1, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "PARAM"), "%s", lm_last_error());
  lm_tensor viewed = lm_expand(w, 0, 1);
  cr_assert_eq(lm_optim_adam(&c, &viewed, &d, 1, NULL), LM_ERR_INVALID);
  cr_assert_eq(lm_optim_adam(&c, &w, &g4, 1, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "shape"), "%s", lm_last_error());
  c.beta1 = 1.0f;
  cr_assert_eq(lm_optim_adam(&c, &w, &d, 1, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "beta1"), "%s", lm_last_error());
  c = lm_optim_adam_defaults();
  c.lr_name = "d"; /* exists, but is [3] */
  cr_assert_eq(lm_optim_adam(&c, &w, &d, 1, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "rank-0"), "%s", lm_last_error());
  lm_sgd_cfg s = lm_optim_sgd_defaults();
  s.nesterov = 1;
  cr_assert_eq(lm_optim_sgd(&s, &w, &d, 1, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "Nesterov"), "%s", lm_last_error());
  cr_assert_eq(lm_optim_clip_grad_norm(&d, 1, 0.0f, &d, NULL), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "max_norm"), "%s", lm_last_error());
  lm_graph_free(g);
}

/* ---------------------------------------------------------------- an MLP learns sin(3x) */

enum { BATCH = 64, H = 32, STEPS = 200 };

typedef struct mlp {
  lm_graph_t *g;
  lm_tensor p[6];
} mlp;

static const char *const pnames[6] = {"w1", "b1", "w2", "b2", "w3", "b3"};
static const lm_dim pshape[6][2] = {{1, H}, {H, 0}, {H, H}, {H, 0}, {H, 1}, {1, 0}};
static const int prank[6] = {2, 1, 2, 1, 2, 1};

static size_t pcount(int i) { return (size_t)(pshape[i][0] * (prank[i] == 2 ? pshape[i][1] : 1)); }

/* 1 -> 32 -> 32 -> 1 with tanh, MSE against y, Adam on every parameter. */
static mlp mlp_build(void) {
  mlp m = {lm_graph_new(), {{0}}};
  lm_graph_t *g = m.g;
  for (int i = 0; i < 6; i++) m.p[i] = lm_input(g, pnames[i], LM_ROLE_PARAM, prank[i], pshape[i]);
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){BATCH, 1});
  lm_tensor y = lm_input(g, "y", LM_ROLE_DATA, 2, (lm_dim[]){BATCH, 1});
  lm_tensor h = lm_tanh(lm_add(lm_matmul(x, m.p[0]), m.p[1]));
  h = lm_tanh(lm_add(lm_matmul(h, m.p[2]), m.p[3]));
  lm_tensor loss = lm_loss_mse(lm_add(lm_matmul(h, m.p[4]), m.p[5]), y), grads[6];
  cr_assert(lm_grad(loss, m.p, 6, grads) == LM_OK, "%s", lm_last_error());
  lm_adam_cfg c = lm_optim_adam_defaults();
  lm_tensor norm;
  cr_assert(lm_optim_adam(&c, m.p, grads, 6, &norm) == LM_OK, "%s", lm_last_error());
  cr_assert(lm_output(loss, "loss") == LM_OK && lm_output(norm, "grad_norm") == LM_OK, "%s", lm_last_error());
  return m;
}

/* Trains from a fixed initialisation (PyTorch's default: U(+-1/sqrt(fan_in))) and records the
 * loss of every step (the loss before that step's update). */
static void mlp_train(const mlp *m, const char *backend, float *curve) {
  check_prog p = check_prog_new(m->g, backend);
  lm_program_stats st;
  cr_assert(lm_program_get_stats(p.program, &st) == LM_OK, "%s", lm_last_error());
  cr_log_info("MLP 1-32-32-1 loss + gradient + grad norm + Adam on %s: %d kernels", backend, st.kernels);
  check_rng r = check_rng_new(42);
  float xs[BATCH], ys[BATCH], buf[H * H];
  for (int i = 0; i < BATCH; i++) {
    xs[i] = -1.0f + 2.0f * (float)i / (BATCH - 1);
    ys[i] = sinf(3 * xs[i]);
  }
  for (int i = 0; i < 6; i++) {
    double bound = 1 / sqrt(i < 2 ? 1.0 : (double)H);
    for (size_t k = 0; k < pcount(i); k++) buf[k] = (float)check_uniform(&r, -bound, bound);
    cr_assert(lm_program_write(p.program, pnames[i], buf, pcount(i)) == LM_OK, "%s", lm_last_error());
  }
  cr_assert(lm_program_write(p.program, "x", xs, BATCH) == LM_OK);
  cr_assert(lm_program_write(p.program, "y", ys, BATCH) == LM_OK);
  float lr = 0.01f, gn;
  for (int s = 0; s < STEPS; s++)
    check_prog_run(&p, NULL, 0, (check_buf[]){{"lr", &lr, 1}}, 1,
                   (check_buf[]){{"loss", &curve[s], 1}, {"grad_norm", &gn, 1}}, 2);
  check_prog_free(&p);
}

Test(optim_mlp, adam_fits_sin_3x_with_the_same_loss_curve_on_ref_and_cpu, .timeout = LM_TIMEOUT(240)) {
  mlp m = mlp_build();
  static float curve[2][STEPS];
  for (int b = 0; b < nbackends(); b++) mlp_train(&m, backend_at(b), curve[b]);
  cr_log_info("MLP loss: step 0 %.4f, 50 %.4f, 100 %.4f, 199 %.5f", (double)curve[0][0], (double)curve[0][50],
              (double)curve[0][100], (double)curve[0][STEPS - 1]);
  cr_assert(curve[0][STEPS - 1] < 0.05f * curve[0][0], "loss %g -> %g: no convergence", (double)curve[0][0],
            (double)curve[0][STEPS - 1]);
  cr_assert(curve[0][STEPS - 1] < 0.02f, "final loss %g", (double)curve[0][STEPS - 1]);
  if (nbackends() > 1) {
    double want[STEPS];
    double worst = 0;
    for (int s = 0; s < STEPS; s++) {
      want[s] = curve[0][s];
      worst = fmax(worst, fabs(curve[1][s] - want[s]) / want[s]);
    }
    cr_log_info("MLP loss curves, cpu vs ref: worst relative difference %.3g over %d steps", worst, STEPS);
    check_close("cpu loss curve vs ref", curve[1], want, STEPS, 1e-3, 0);
  }
  lm_graph_free(m.g);
}
