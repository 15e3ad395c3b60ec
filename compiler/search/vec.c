/* compiler/search/vec.c — the vector variant, a cpu variant of a searched kernel: every serial
 * loop that may run eight iterations at a time (lm_vector_loop_check: a constant extent that 8
 * divides, loads and stores at stride 1 or not naming it, +, * and 1/x between them) becomes an
 * LM_L_VECTOR loop, which the C dialect prints with explicit lm_v8 values, and the kernel may
 * fuse a*b + c into an FMA. Left to clang's loop vectoriser, a 4x16 register tile of a matmul
 * runs at 75 GFLOP/s on one Zen 2 core with contraction off and at 31 with it on (it spills the
 * accumulators); written as lm_v8 values with FMAs it runs at 82, and a 6x16 tile at 98 of the
 * core's 108 (an FMA every cycle on both pipes). The lanes compute what the serial loop computes,
 * so only the FMAs change rounding: the variant counts as a rounding rewrite at the gate. */
#include "render.h"
#include "search/search-impl.h"

int sk_vec_kernel(const lm_plan *p, lm_kernel *k) {
  if (k->group || k->contract) return 0;
  for (size_t l = 0; l < k->nloops; l++)
    if (k->loops[l].kind == LM_L_LANES || k->loops[l].kind == LM_L_SPARSE) return 0; /* compiler/lanes.c's */
  uint8_t *vary = lm_calloc(k->nstmts + 1, 1);
  if (!vary) return -1;
  char why[160];
  int n = 0;
  for (size_t l = (size_t)(k->npar > 0 ? k->npar : 0); l < k->nloops; l++) {
    if (k->loops[l].kind != LM_L_SERIAL) continue;
    if (lm_vector_loop_check(&p->g->x, k, (int32_t)l, vary, why, sizeof why)) k->loops[l].kind = LM_L_VECTOR, n++;
  }
  lm_free(vary);
  if (n) k->contract = 1;
  return n;
}
