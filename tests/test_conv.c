/* tests/test_conv.c — windows and convolution as views (lumen/ops.h: lm_window, lm_conv2d):
 * lm_window picks x[t + j] exactly along any axis; lm_conv2d (stride 1, SAME) against a direct
 * double-precision convolution on ref and cpu, with MinAtar's shapes (10 x 10 x 4 in, 16
 * filters of 3 x 3), compiled on cpu without an im2col buffer (the arena holds no B x H x W x 9C
 * intermediate); its gradients with respect to input and kernel against central finite
 * differences of the same graph (ref backend). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lumen/autograd.h"
#include "lumen/ops.h"
#include "support/check.h"

Test(window, picks_x_at_t_plus_j_along_every_axis) {
  enum { A = 3, B = 7, C = 5 };
  float x[A * B * C];
  for (int i = 0; i < A * B * C; i++) x[i] = (float)i;
  for (int axis = 0; axis < 3; axis++) {
    int ext[3] = {A, B, C}, k = axis == 0 ? 2 : 3, L = ext[axis], n = L - k + 1;
    lm_graph_t *g = lm_graph_new();
    lm_tensor in = lm_input(g, "x", LM_ROLE_DATA, 3, (lm_dim[]){A, B, C});
    lm_tensor w = lm_window(in, axis, k);
    cr_assert_eq(lm_rank(w), 4);
    cr_assert_eq(lm_dim_of(w, axis), n);
    cr_assert_eq(lm_dim_of(w, axis + 1), k);
    cr_assert_eq(lm_output(lm_contiguous(w), "w"), LM_OK, "%s", lm_last_error());
    size_t count = (size_t)A * B * C / (size_t)L * (size_t)n * (size_t)k;
    float *got = malloc(count * sizeof *got);
    for (int be = 0; be < 2; be++) {
      check_prog p = check_prog_new(g, be ? "cpu" : "ref");
      check_buf inb[] = {{"x", x, A * B * C}}, outb[] = {{"w", got, count}};
      check_prog_run(&p, NULL, 0, inb, 1, outb, 1);
      check_prog_free(&p);
      /* walk the output in row-major order over (.., t, j, ..) */
      int dims[4], idx[4] = {0};
      for (int i = 0, d = 0; i < 3; i++) {
        if (i == axis) dims[d++] = n, dims[d++] = k;
        else dims[d++] = ext[i];
      }
      for (size_t f = 0; f < count; f++) {
        int src[3];
        for (int i = 0, d = 0; i < 3; i++) {
          if (i == axis) src[i] = idx[d] + idx[d + 1], d += 2;
          else src[i] = idx[d++];
        }
        float want = x[(src[0] * B + src[1]) * C + src[2]];
        cr_assert_eq(got[f], want, "axis %d on %s: element %zu is %g, expected %g", axis, be ? "cpu" : "ref", f,
                     (double)got[f], (double)want);
        for (int d = 3; d >= 0 && ++idx[d] == dims[d]; d--) idx[d] = 0;
      }
    }
    free(got);
    lm_graph_free(g);
  }
}

enum { NB = 5, H = 10, W = 10, C = 4, F = 16, K = 9 * C };

static void conv_ref(const float *x, const float *w, const float *bias, double *out) {
  for (int b = 0; b < NB; b++)
    for (int y = 0; y < H; y++)
      for (int xx = 0; xx < W; xx++)
        for (int f = 0; f < F; f++) {
          double acc = bias[f];
          for (int dy = 0; dy < 3; dy++)
            for (int dx = 0; dx < 3; dx++) {
              int sy = y + dy - 1, sx = xx + dx - 1;
              if (sy < 0 || sy >= H || sx < 0 || sx >= W) continue;
              for (int c = 0; c < C; c++)
                acc += (double)x[((b * H + sy) * W + sx) * C + c] * w[((dy * 3 + dx) * C + c) * F + f];
            }
          out[((b * H + y) * W + xx) * F + f] = acc > 0 ? acc : 0;
        }
}

/* y = relu(conv2d(x, w) + bias); with a loss, the loss is of conv2d(x, w) + bias alone (linear
 * in x and in w, so central differences are exact up to float32 rounding at any step). */
static lm_graph_t *conv_graph(lm_tensor *loss_out, int h, int wd, int c, int f) {
  lm_graph_t *g = lm_graph_new();
  lm_dim n = lm_sym(g, "B");
  lm_tensor x = lm_input(g, "x", LM_ROLE_DATA, 4, (lm_dim[]){n, h, wd, c});
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 2, (lm_dim[]){9 * c, f});
  lm_tensor bias = lm_input(g, "bias", LM_ROLE_PARAM, 1, (lm_dim[]){f});
  lm_tensor z = lm_add(lm_conv2d(x, w, 3, 3), bias), y = lm_relu(z);
  cr_assert_eq(lm_output(y, "y"), LM_OK, "%s", lm_last_error());
  if (loss_out) { /* a scalar of the outputs, weighting every cell differently */
    lm_tensor pos = lm_reshape(lm_arange(g, (lm_dim)h * wd * f), 3, (lm_dim[]){h, wd, f});
    *loss_out = lm_sum(lm_sum(lm_sum(lm_sum(lm_mul(z, lm_sin(pos)), 3, 0), 2, 0), 1, 0), 0, 0);
  }
  return g;
}

static void conv_inputs(float *x, float *w, float *bias) {
  check_rng r = check_rng_new(3);
  check_fill(&r, x, NB * H * W * C, -1, 1, 0);
  check_fill(&r, w, K * F, -0.5, 0.5, 0);
  check_fill(&r, bias, F, -0.2, 0.2, 0);
}

Test(conv2d, matches_a_direct_convolution_on_ref_and_cpu_without_an_im2col_buffer) {
  static float x[NB * H * W * C], w[K * F], bias[F], got[NB * H * W * F];
  static double want[NB * H * W * F];
  conv_inputs(x, w, bias);
  conv_ref(x, w, bias, want);
  lm_graph_t *g = conv_graph(NULL, H, W, C, F);
  for (int be = 0; be < 2; be++) {
    check_prog p = check_prog_new(g, be ? "cpu" : "ref");
    check_sym syms[] = {{"B", NB}};
    check_buf in[] = {{"x", x, NB * H * W * C}, {"w", w, K * F}, {"bias", bias, F}};
    check_buf out[] = {{"y", got, NB * H * W * F}};
    check_prog_run(&p, syms, 1, in, 3, out, 1);
    check_close(be ? "conv2d on cpu" : "conv2d on ref", got, want, NB * H * W * F, 1e-5, 1e-5);
    if (be) {
      lm_program_stats s;
      cr_assert_eq(lm_program_get_stats(p.program, &s), LM_OK);
      cr_log_info("conv2d on cpu: %d kernels, arena %zu bytes", s.kernels, s.arena_bytes);
      /* the padded copy of x, then the windows' matmul with bias and relu in its epilogue */
      cr_assert_leq(s.kernels, 3, "conv2d + bias + relu took %d kernels", s.kernels);
      cr_assert_lt(s.arena_bytes, (size_t)NB * H * W * K * sizeof(float), "an im2col-sized buffer: %zu bytes",
                   s.arena_bytes);
    }
    check_prog_free(&p);
  }
  lm_graph_free(g);
}

/* d loss / d w and d loss / d x by lm_grad against central differences of the loss (float32 runs
 * of the same graph; the loss is linear in each, so a step of 0.25 has no truncation error and
 * keeps the loss's rounding small against the difference). */
/* (smaller than MinAtar's, as the reference interpreter runs the graph twice per entry) */
Test(conv2d, gradients_match_finite_differences) {
  enum { GB = 2, GH = 5, GW = 6, GC = 3, GF = 4, GK = 9 * GC };
  static float x[GB * GH * GW * GC], w[GK * GF], bias[GF];
  check_rng r = check_rng_new(5);
  check_fill(&r, x, GB * GH * GW * GC, -1, 1, 0);
  check_fill(&r, w, GK * GF, -0.5, 0.5, 0);
  check_fill(&r, bias, GF, -0.2, 0.2, 0);
  lm_tensor loss;
  lm_graph_t *g = conv_graph(&loss, GH, GW, GC, GF);
  lm_tensor wrt[2] = {lm_graph_input(g, "w"), lm_graph_input(g, "x")}, grads[2];
  cr_assert_eq(lm_grad(loss, wrt, 2, grads), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_output(loss, "loss"), LM_OK);
  cr_assert_eq(lm_output(grads[0], "dw"), LM_OK);
  cr_assert_eq(lm_output(grads[1], "dx"), LM_OK);
  check_prog p = check_prog_new(g, "ref");
  cr_assert_eq(lm_program_bind(p.program, "B", GB), LM_OK);
  cr_assert_eq(lm_program_write(p.program, "bias", bias, GF), LM_OK);
  static float dw[GK * GF], dx[GB * GH * GW * GC];
  cr_assert_eq(lm_program_write(p.program, "x", x, GB * GH * GW * GC), LM_OK);
  cr_assert_eq(lm_program_write(p.program, "w", w, GK * GF), LM_OK);
  cr_assert_eq(lm_program_run(p.program), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_read(p.program, "dw", dw, GK * GF), LM_OK);
  cr_assert_eq(lm_program_read(p.program, "dx", dx, GB * GH * GW * GC), LM_OK);
  const float h = 0.25f;
  int checked = 0;
  for (int which = 0; which < 2; which++) {
    float *v = which ? x : w, *grad = which ? dx : dw;
    size_t n = which ? (size_t)GB * GH * GW * GC : (size_t)GK * GF;
    const char *name = which ? "x" : "w";
    for (size_t i = 0; i < n; i += n / 40 + 1) {
      float keep = v[i], lp, lmn;
      v[i] = keep + h;
      cr_assert_eq(lm_program_write(p.program, name, v, n), LM_OK);
      cr_assert_eq(lm_program_run(p.program), LM_OK);
      cr_assert_eq(lm_program_read(p.program, "loss", &lp, 1), LM_OK);
      v[i] = keep - h;
      cr_assert_eq(lm_program_write(p.program, name, v, n), LM_OK);
      cr_assert_eq(lm_program_run(p.program), LM_OK);
      cr_assert_eq(lm_program_read(p.program, "loss", &lmn, 1), LM_OK);
      v[i] = keep;
      double fd = ((double)lp - (double)lmn) / (2.0 * h);
      cr_assert(fabs(fd - grad[i]) <= 2e-3 * fmax(1.0, fabs(fd)), "d loss / d %s[%zu]: lm_grad %g, differences %g", name,
                i, (double)grad[i], fd);
      checked++;
    }
    cr_assert_eq(lm_program_write(p.program, name, v, n), LM_OK);
  }
  cr_log_info("%d gradient entries checked", checked);
  check_prog_free(&p);
  lm_graph_free(g);
}
