/* tests/mpi/dist_check.c — lumen/dist.h under `mpirun -np 2`: the exchange, the rank-ordered sums
 * (the same bits on every rank), a failing rank named to all, a missing libnccl named, and a rank
 * that answers late named by the rank that waited past the collective timeout. Each rank prints
 * "rank R ok" and exits 0 when every check holds; each failed check prints "FAIL ..." and the rank
 * exits 1 (and so does mpirun). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lumen/dist.h"

static int failures;
#define CHECK(cond, ...)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      fprintf(stderr, "FAIL rank %d, dist_check.c:%d: ", rank, __LINE__);                         \
      fprintf(stderr, __VA_ARGS__);                                                               \
      fputc('\n', stderr);                                                                        \
      failures++;                                                                                 \
    }                                                                                             \
  } while (0)

int main(void) {
  int rank = -1;
  setenv("LUMEN_NCCL_LIB", "libnccl-absent-for-lumen-tests.so.2", 1);
  lm_dist_t *d = lm_dist_open(2.0);
  if (!d) {
    fprintf(stderr, "FAIL: %s\n", lm_last_error());
    return 1;
  }
  rank = lm_dist_rank(d);
  int K = lm_dist_size(d);
  CHECK(K == 2, "%d ranks, the test wants 2", K);
  /* the exchange: every rank's bytes in rank order */
  int mine[3] = {rank * 10 + 1, rank * 10 + 2, rank * 10 + 3}, all[6] = {0};
  CHECK(lm_dist_allgather(d, mine, sizeof mine, all, "test") == LM_OK, "%s", lm_last_error());
  for (int r = 0; r < K; r++)
    for (int i = 0; i < 3; i++) CHECK(all[r * 3 + i] == r * 10 + i + 1, "all[%d] = %d", r * 3 + i, all[r * 3 + i]);
  /* sums, rank 0's term first, the same bits on every rank */
  float v[2] = {rank == 0 ? 1.0f : 0.125f, rank == 0 ? 3.0f : -1.5f};
  CHECK(lm_dist_sum_f32(d, v, 2, "test sum") == LM_OK, "%s", lm_last_error());
  CHECK(v[0] == 1.125f && v[1] == 1.5f, "sums %a %a", (double)v[0], (double)v[1]);
  float both[4];
  CHECK(lm_dist_allgather(d, v, sizeof v, both, "test bits") == LM_OK, "%s", lm_last_error());
  CHECK(!memcmp(both, both + 2, sizeof v), "the ranks' sums differ in their bits");
  double w = rank + 0.25;
  CHECK(lm_dist_sum_f64(d, &w, 1, "test sum") == LM_OK && w == 1.5, "f64 sum %g", w);
  /* a failing rank is named, with its reason, on every rank */
  lm_status st = lm_dist_agree(d, rank != 1, "the disk is on fire");
  CHECK(st != LM_OK && strstr(lm_last_error(), "rank 1: the disk is on fire"), "agree: %s", lm_last_error());
  CHECK(lm_dist_agree(d, 1, NULL) == LM_OK, "%s", lm_last_error());
  /* NCCL missing: every rank says which library */
  lm_nccl_t *n = lm_nccl_open(d, 0);
  CHECK(!n && strstr(lm_last_error(), "libnccl-absent-for-lumen-tests.so.2 not found"), "nccl: %s",
        n ? "opened" : lm_last_error());
  /* a late rank, last: rank 1 answers after rank 0's 2 s timeout, which names it; then rank 0's
   * collectives are refused (the job must end), and rank 1's late exchange still completes */
  if (rank == 1) sleep(4);
  st = lm_dist_allgather(d, mine, sizeof mine, all, "late");
  if (rank == 0) {
    CHECK(st != LM_OK && strstr(lm_last_error(), "heard nothing from rank 1 within 2 s in the collective 'late'"),
          "timeout: %s", st == LM_OK ? "no timeout" : lm_last_error());
    CHECK(lm_dist_agree(d, 1, NULL) != LM_OK && strstr(lm_last_error(), "timed out before 'status'"),
          "after a timeout: %s", lm_last_error());
  } else
    CHECK(st == LM_OK && all[0] == 1 && all[3] == 11, "rank 1's late exchange: %s", lm_last_error());
  if (!failures) printf("rank %d ok\n", rank);
  lm_dist_close(d);
  return failures ? 1 : 0;
}
