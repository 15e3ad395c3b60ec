/* lumen/dist.h — data-parallel training across processes: MPI for processes and nodes (loaded at
 * run time, like the GPU libraries, so one binary runs with or without it) and NCCL for cuda
 * (libnccl dlopened, bootstrapped through MPI). Every collective here is a fixed-order one: an
 * exchange of every rank's bytes followed by a rank-ordered reduction on every rank, so K ranks
 * compute bit-identical results, and every wait has a deadline (the collective timeout), after
 * which the waiting rank names the ranks it has not heard from. */
#ifndef LUMEN_DIST_H
#define LUMEN_DIST_H

#include "lumen/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_dist lm_dist_t;

/* 1 when a launcher started this process as one rank of several or one (mpirun, srun: the
 * OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE or PMI_RANK environment variables), else 0. */
int lm_dist_launched(void);
/* Loads the MPI library (LUMEN_MPI_LIB, else libmpi.so.40, libmpi.so), initialises it and joins
 * MPI_COMM_WORLD. timeout_s (> 0) bounds every later wait. NULL and lm_last_error() naming the
 * reason when there is no usable MPI (not found, not Open MPI, MPI_Init failed). */
lm_dist_t *lm_dist_open(double timeout_s);
/* Finalises MPI (after every rank's last collective). */
void lm_dist_close(lm_dist_t *d);
int lm_dist_rank(const lm_dist_t *d);
int lm_dist_size(const lm_dist_t *d);
double lm_dist_timeout(const lm_dist_t *d);
/* The library's description, e.g. "Open MPI v4.1.4 (libmpi.so.40)". */
const char *lm_dist_library(const lm_dist_t *d);

/* all[r * bytes ...] receives rank r's `bytes` bytes (this rank's own included), for every r.
 * `what` names the collective in a timeout's message. LM_ERR_IO on an MPI error or a timeout,
 * the message naming the ranks not heard from. */
lm_status lm_dist_allgather(lm_dist_t *d, const void *mine, size_t bytes, void *all, const char *what);
/* v[i] = v_0[i] + v_1[i] + ... + v_{K-1}[i], summed in rank order on every rank (bitwise the
 * same everywhere). */
lm_status lm_dist_sum_f32(lm_dist_t *d, float *v, size_t n, const char *what);
lm_status lm_dist_sum_f64(lm_dist_t *d, double *v, size_t n, const char *what);
/* Every rank says whether it is fine: LM_OK when all are, else LM_ERR_IO with the message of the
 * first failing rank ("rank R: why"). Every rank must call it at the same point. */
lm_status lm_dist_agree(lm_dist_t *d, int ok, const char *why);
/* Ends the job on every rank (MPI_Abort) with `code`, after printing nothing: the caller has
 * said why. */
void lm_dist_abort(lm_dist_t *d, int code);

/* NCCL, for the cuda backend: loads libnccl.so.2 (LUMEN_NCCL_LIB overrides), has rank 0 draw the
 * unique id and broadcasts it through MPI, and joins a communicator of all ranks on the current
 * CUDA device (one GPU per rank: LUMEN_CUDA_DEVICE or CUDA_VISIBLE_DEVICES picks it; cuda_device is
 * kept for when the backend hands its device over). Every rank must call it. NULL and
 * lm_last_error() naming the reason (library missing, a failed call with NCCL's own error string).
 * The trainer gathers gradients with it on cuda when every rank has a GPU of its own
 * (docs/SCALE.md). */
typedef struct lm_nccl lm_nccl_t;
lm_nccl_t *lm_nccl_open(lm_dist_t *d, int cuda_device);
void lm_nccl_close(lm_nccl_t *n);
/* "NCCL 2.21.5" */
const char *lm_nccl_version(const lm_nccl_t *n);
/* ncclAllGather of `count` floats from device memory `send` into `recv` (K * count floats), on
 * `stream` (a CUstream; 0 for the default stream): the fixed-order exchange of the gradient
 * vectors, reduced after it in rank order by the caller's graph. */
lm_status lm_nccl_allgather_f32(lm_nccl_t *n, const void *send, void *recv, size_t count, void *stream);
/* ncclGroupStart (begin) or ncclGroupEnd: the collectives between them launch as one (the
 * trainer's allgather of every parameter's gradients). */
lm_status lm_nccl_group(lm_nccl_t *n, int begin);
/* ncclAllReduce (sum) of `count` floats in place: NCCL's own order, fixed for a given topology. */
lm_status lm_nccl_allreduce_f32(lm_nccl_t *n, void *buf, size_t count, void *stream);

#ifdef __cplusplus
}
#endif
#endif
