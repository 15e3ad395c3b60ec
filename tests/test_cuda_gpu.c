/* Tests for the cuda backend (compiler/backends/cuda.c). On a machine with an NVIDIA GPU:
 * - the whole device suite of tests/test_opencl.c (random graphs, scans fused and step by step,
 *   RAND bit-identical to lm_rand_uniform, assigns, rebinding, links) with "cuda" as the device;
 * - CUDA Graphs: a program run many times (direct launch on the first run, capture on the second,
 *   replays after) matches ref after every run, also after a rebind and after a buffer moves
 *   (both force a re-capture), and a scan run step by step replays too.
 * Without one, every test above is skipped with the reason ("no CUDA device: no CUDA driver:
 * libcuda.so.1 not found ..."), never passed; and this file still checks that "cuda" fails with
 * that clear message and that "auto" then picks cpu and says why.
 * Criterion forks a worker per test: CUDA is initialised only inside tests, never in the runner,
 * and CMake runs this file with --jobs 1 (label gpu). */
#define DEVICE "cuda"
#define DEVICE_TEXT "CUDA"
#define DEVICE_SRC_EXT ".cu"
#define DEVICE_SHARED "__shared__"
#define DEVICE_BARRIER "__syncthreads()"
#include "test_opencl.c"

/* ================================================================ availability */

Test(cuda, cuda_opens_or_fails_saying_why_and_auto_picks_cuda_or_cpu_accordingly) {
  lm_clear_error();
  lm_backend_t *cuda = lm_backend_new("cuda");
  char reason[1024];
  snprintf(reason, sizeof reason, "%s", lm_last_error());
  lm_backend_free(cuda);
  char why[1024] = "";
  lm_backend_t *b = lm_backend_open("auto", why, sizeof why);
  cr_assert(b, "auto: %s", lm_last_error());
  if (cuda) {
    cr_assert_str_eq(lm_backend_name(b), "cuda", "a GPU answers but auto picked %s (%s)", lm_backend_name(b), why);
    cr_assert(strstr(why, "cuda"), "why: %s", why);
  } else {
    cr_assert(!strncmp(reason, "no CUDA driver", 14) || !strncmp(reason, "no CUDA device", 14) ||
                  !strncmp(reason, "no usable CUDA driver", 21) || !strncmp(reason, "no NVRTC", 8),
              "lm_backend_new(\"cuda\") failed without a clear reason: \"%s\"", reason);
    cr_assert_str_eq(lm_backend_name(b), "cpu", "no GPU, yet auto picked %s (%s)", lm_backend_name(b), why);
    cr_assert(strstr(why, "cpu") && strstr(why, "cuda unavailable") && strstr(why, reason),
              "why does not say cuda was unavailable and why: %s", why);
  }
  lm_backend_free(b);
  cr_assert_null(lm_backend_open(cuda ? "warp-drive" : "cuda", why, sizeof why), "a named backend never falls back");
}

/* ================================================================ CUDA Graphs */

/* s' = fmod(s * w + x + RAND, 4); out = sum over columns of s'. Eight runs with the same
 * addresses: direct, capture, then replays; every run against ref, bit for bit. */
Test(cuda, a_captured_graph_replays_every_run_and_is_recaptured_after_a_rebind_or_a_moved_buffer) {
  lm_graph_t *g = lm_graph_new();
  lm_dim N = lm_sym(g, "N");
  lm_tensor s = lm_input(g, "s", LM_ROLE_STATE, 2, (lm_dim[]){N, 5});
  lm_tensor w = lm_input(g, "w", LM_ROLE_PARAM, 1, (lm_dim[]){5});
  lm_tensor xt = lm_input(g, "x", LM_ROLE_DATA, 2, (lm_dim[]){N, 5});
  lm_tensor s2 = lm_mod(lm_add(lm_add(lm_mul(s, w), xt), lm_rand(g, 2, (lm_dim[]){N, 5})), lm_const(g, 4.0f));
  OK(lm_output(lm_sum(lm_sin(s2), 1, 0), "out"));
  OK(lm_assign(s, s2));
  lm_backend_t *be[2] = {open_device(), open_ref()};
  lm_program_t *p[2];
  for (int i = 0; i < 2; i++) {
    p[i] = lm_program_new(be[i], g);
    cr_assert(p[i], "%s", lm_last_error());
    lm_program_set_seed(p[i], 77);
  }
  check_rng r = check_rng_new(9);
  lm_program_t *other = NULL; /* owns the weights buffer p[0] is linked to in the last round */
  const int64_t sizes[] = {1000, 3, 1000};
  for (size_t c = 0; c < CHECK_COUNT(sizes); c++) {
    size_t n = (size_t)sizes[c];
    float *wv = rand_floats(&r, 5, -1, 1), *xv = rand_floats(&r, n * 5, -2, 2);
    for (int i = 0; i < 2; i++) {
      OK(lm_program_bind(p[i], "N", sizes[c]));
      put(p[i], "w", wv, 5);
      put(p[i], "x", xv, n * 5);
    }
    for (int run = 0; run < 8; run++) {
      if (c == 2 && run == 4) { /* the weights move to another buffer: p[0] must re-capture */
        other = lm_program_new(be[0], g);
        cr_assert(other, "%s", lm_last_error());
        OK(lm_program_bind(other, "N", sizes[c]));
        put(other, "w", wv, 5);
        OK(lm_program_link(p[0], "w", other, "w"));
      }
      for (int i = 0; i < 2; i++) OK(lm_program_run(p[i]));
      char what[96];
      snprintf(what, sizeof what, "N=%zu run %d: state s", n, run);
      float *got = get(p[0], "s", n * 5), *want = get(p[1], "s", n * 5);
      expect_bits(what, got, want, n * 5);
      free(got);
      free(want);
      got = get(p[0], "out", n);
      want = get(p[1], "out", n);
      for (size_t e = 0; e < n; e++) /* sin: within the suite's tolerance (|out| <= 5) */
        cr_assert(fabs((double)got[e] - want[e]) <= RTOL * fabs(want[e]) + 5 * ATOL,
                  "N=%zu run %d: out[%zu] = %.9g, ref %.9g", n, run, e, (double)got[e], (double)want[e]);
      free(got);
      free(want);
    }
    free(wv);
    free(xv);
  }
  for (int i = 0; i < 2; i++) lm_program_free(p[i]);
  lm_program_free(other);
  for (int i = 0; i < 2; i++) lm_backend_free(be[i]);
  lm_graph_free(g);
}
