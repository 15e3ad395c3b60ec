/* train/dist.c — MPI and NCCL, loaded at run time (lumen/dist.h). Open MPI's handles
 * (MPI_COMM_WORLD, MPI_BYTE, ...) are the addresses of symbols libmpi exports (ompi_mpi_comm_world,
 * ompi_mpi_byte), resolved with dlsym, so mpi.h is never needed to build lumen. Collectives are
 * point-to-point exchanges polled with MPI_Test against a deadline: a rank that stops answering is
 * named, never waited for for ever, and the job ends with MPI_Abort. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/core.h"
#include "lumen/dist.h"

/* Open MPI's ABI (v4 and v5): handles are pointers, MPI_STATUS_IGNORE is NULL. */
typedef void *mpi_handle;
typedef void *mpi_request;
enum { MPI_SUCCESS_ = 0, MPI_MAX_ERROR_STRING_ = 256, MPI_MAX_LIBRARY_VERSION_STRING_ = 256, DIST_TAG = 2641 };

typedef struct mpi_api {
  int (*Initialized)(int *flag);
  int (*Init)(int *argc, char ***argv);
  int (*Finalize)(void);
  int (*Comm_rank)(mpi_handle comm, int *rank);
  int (*Comm_size)(mpi_handle comm, int *size);
  int (*Comm_set_errhandler)(mpi_handle comm, mpi_handle errhandler);
  int (*Isend)(const void *buf, int count, mpi_handle type, int dest, int tag, mpi_handle comm, mpi_request *req);
  int (*Irecv)(void *buf, int count, mpi_handle type, int source, int tag, mpi_handle comm, mpi_request *req);
  int (*Test)(mpi_request *req, int *flag, void *status);
  int (*Abort)(mpi_handle comm, int code);
  int (*Error_string)(int code, char *text, int *len);
  int (*Get_library_version)(char *text, int *len);
} mpi_api;

static const struct {
  const char *name;
  size_t offset;
} mpi_symbols[] = {
#define SYM(f) {"MPI_" #f, offsetof(mpi_api, f)}
    SYM(Initialized), SYM(Init),  SYM(Finalize), SYM(Comm_rank),    SYM(Comm_size),          SYM(Comm_set_errhandler),
    SYM(Isend),       SYM(Irecv), SYM(Test),     SYM(Abort),        SYM(Error_string),       SYM(Get_library_version),
#undef SYM
};

struct lm_dist {
  void *lib;
  mpi_api mpi;
  mpi_handle world, byte;
  int rank, size;
  double timeout;
  char library[320];
  /* buffers of collectives that timed out: MPI may still write or read them, so they live until
   * MPI_Finalize; `broken` refuses every later collective (the job must end) */
  void **graves;
  size_t ngraves, gravecap;
  int broken;
};

int lm_dist_launched(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};
  for (size_t i = 0; i < LM_COUNTOF(vars); i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return 1;
  }
  return 0;
}

/* The one checking funnel for MPI calls: keeps the call and MPI's error string. */
static lm_status mpi_check(const lm_dist_t *d, int r, const char *call, int line) {
  if (r == MPI_SUCCESS_) return LM_OK;
  char text[MPI_MAX_ERROR_STRING_] = "";
  int len = 0;
  if (d->mpi.Error_string && d->mpi.Error_string(r, text, &len) != MPI_SUCCESS_) snprintf(text, sizeof text, "error %d", r);
  return lm_fail(LM_ERR_IO, "mpi: rank %d: %s failed: %s [dist.c:%d]", d->rank, call, text, line);
}
#define MPI(call) mpi_check(d, (d->mpi.call), #call, __LINE__)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

lm_dist_t *lm_dist_open(double timeout_s) {
  if (!(timeout_s > 0)) {
    lm_fail(LM_ERR_INVALID, "mpi: the collective timeout must be > 0 s (got %g)", timeout_s);
    return NULL;
  }
  lm_dist_t *d = lm_calloc(1, sizeof *d);
  if (!d) return NULL;
  d->timeout = timeout_s;
  const char *want = getenv("LUMEN_MPI_LIB");
  const char *names[3] = {want && *want ? want : "libmpi.so.40", want && *want ? NULL : "libmpi.so", NULL};
  char tried[1024] = "";
  const char *used = NULL;
  for (int i = 0; names[i] && !d->lib; i++) {
    /* RTLD_GLOBAL: Open MPI's own plugins resolve libmpi's symbols through the global scope */
    d->lib = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
    if (d->lib) used = names[i];
    else {
      const char *e = dlerror();
      snprintf(tried + strlen(tried), sizeof tried - strlen(tried), "%s%s", tried[0] ? "; " : "", e ? e : names[i]);
    }
  }
  if (!d->lib) {
    lm_fail(LM_ERR_UNSUPPORTED, "mpi: started by mpirun but no MPI library loads (%s); install Open MPI "
                                "(apt-get install openmpi-bin libopenmpi-dev) or set LUMEN_MPI_LIB", tried);
    goto fail;
  }
  for (size_t i = 0; i < LM_COUNTOF(mpi_symbols); i++) {
    void *p = dlsym(d->lib, mpi_symbols[i].name);
    if (!p) {
      lm_fail(LM_ERR_UNSUPPORTED, "mpi: %s lacks %s: not a usable MPI library", used, mpi_symbols[i].name);
      goto fail;
    }
    memcpy((char *)&d->mpi + mpi_symbols[i].offset, &p, sizeof p); /* object -> function pointer, as dlsym requires */
  }
  d->world = dlsym(d->lib, "ompi_mpi_comm_world");
  d->byte = dlsym(d->lib, "ompi_mpi_byte");
  mpi_handle errors_return = dlsym(d->lib, "ompi_mpi_errors_return");
  if (!d->world || !d->byte || !errors_return) {
    lm_fail(LM_ERR_UNSUPPORTED, "mpi: %s is not Open MPI (no ompi_mpi_comm_world, ompi_mpi_byte, "
                                "ompi_mpi_errors_return); lumen speaks Open MPI's ABI", used);
    goto fail;
  }
  char ver[MPI_MAX_LIBRARY_VERSION_STRING_] = "";
  int len = 0, inited = 0;
  d->mpi.Get_library_version(ver, &len);
  char *nl = strpbrk(ver, ",\n");
  if (nl) *nl = 0;
  snprintf(d->library, sizeof d->library, "%.200s (%.100s)", ver[0] ? ver : "MPI", used);
  if (MPI(Initialized(&inited)) != LM_OK) goto fail;
  if (!inited && MPI(Init(NULL, NULL)) != LM_OK) goto fail;
  if (MPI(Comm_set_errhandler(d->world, errors_return)) != LM_OK || MPI(Comm_rank(d->world, &d->rank)) != LM_OK ||
      MPI(Comm_size(d->world, &d->size)) != LM_OK)
    goto fail;
  return d;
fail:
  /* the library stays loaded: Open MPI does not survive dlclose after MPI_Init */
  lm_free(d);
  return NULL;
}

void lm_dist_close(lm_dist_t *d) {
  if (!d) return;
  d->mpi.Finalize();
  for (size_t i = 0; i < d->ngraves; i++) lm_free(d->graves[i]);
  lm_free(d->graves);
  lm_free(d);
}

int lm_dist_rank(const lm_dist_t *d) { return d ? d->rank : 0; }
int lm_dist_size(const lm_dist_t *d) { return d ? d->size : 1; }
double lm_dist_timeout(const lm_dist_t *d) { return d ? d->timeout : 0; }
const char *lm_dist_library(const lm_dist_t *d) { return d ? d->library : ""; }

void lm_dist_abort(lm_dist_t *d, int code) {
  fflush(stdout);
  fflush(stderr);
  /* the launcher forwards a rank's output through a pipe it stops reading once the job aborts:
   * a second for it to pass on what this rank said */
  struct timespec grace = {1, 0};
  nanosleep(&grace, NULL);
  d->mpi.Abort(d->world, code);
  exit(code); /* MPI_Abort does not return; should it, this rank still ends */
}

/* Messages are cut into pieces MPI's int counts hold. */
enum { PIECE = 1 << 30 };

lm_status lm_dist_allgather(lm_dist_t *d, const void *mine, size_t bytes, void *all, const char *what) {
  int K = d->size, me = d->rank;
  if (d->broken)
    return lm_fail(LM_ERR_IO, "mpi: rank %d: a collective timed out before '%s'; the job must end", me, what ? what : "?");
  if (K == 1 || !bytes) {
    if (bytes) memmove((char *)all + (size_t)me * bytes, mine, bytes);
    return LM_OK;
  }
  /* MPI works on buffers of its own, which a timed-out exchange leaves to MPI (d->graves) */
  size_t pieces = (bytes + PIECE - 1) / PIECE, nreq = 2 * (size_t)(K - 1) * pieces;
  char *out = lm_malloc((size_t)(K + 1) * bytes), *send = out ? out + (size_t)K * bytes : NULL;
  mpi_request *req = lm_calloc(nreq, sizeof *req);
  int *from = lm_calloc(nreq, sizeof *from); /* the peer of each request; -1 once complete */
  void **graves = LM_GROW(d->graves, d->gravecap, d->ngraves + 1) ? d->graves : NULL;
  if (!req || !from || !out || !graves) {
    lm_free(req), lm_free(from), lm_free(out);
    return LM_ERR_NOMEM;
  }
  memcpy(send, mine, bytes);
  mine = send;
  lm_status st = LM_OK;
  size_t n = 0;
  for (int p = 0; p < K && st == LM_OK; p++) {
    if (p == me) continue;
    for (size_t q = 0; q < pieces && st == LM_OK; q++) {
      size_t at = q * PIECE, len = bytes - at < PIECE ? bytes - at : PIECE;
      from[n] = p;
      st = MPI(Irecv(out + (size_t)p * bytes + at, (int)len, d->byte, p, DIST_TAG, d->world, &req[n]));
      n++;
      if (st != LM_OK) break;
      from[n] = p;
      st = MPI(Isend((const char *)mine + at, (int)len, d->byte, p, DIST_TAG, d->world, &req[n]));
      n++;
    }
  }
  /* poll: tests alone for the first 200 us (a peer a few microseconds behind), then a sleep
   * between tests, doubling to 1 ms, that leaves the core to a rank that shares it */
  double start = now(), deadline = start + d->timeout;
  long nap = 10000; /* ns */
  size_t left = n;
  while (st == LM_OK && left) {
    for (size_t i = 0; i < n && st == LM_OK; i++) {
      if (from[i] < 0) continue;
      int done = 0;
      st = MPI(Test(&req[i], &done, NULL));
      if (done) from[i] = -1, left--;
    }
    if (!left || st != LM_OK) break;
    if (now() > deadline) {
      char who[512] = "";
      int last = -1;
      for (size_t i = 0; i < n; i++) /* a peer whose data has not come, or who has not taken ours */
        if (from[i] >= 0 && from[i] != last) {
          last = from[i];
          snprintf(who + strlen(who), sizeof who - strlen(who), "%s%d", who[0] ? ", " : "", from[i]);
        }
      st = lm_fail(LM_ERR_IO, "mpi: rank %d heard nothing from rank %s within %g s in the collective '%s' "
                              "(the collective timeout, --dist-timeout): a rank stopped, hangs or is far behind",
                   me, who[0] ? who : "?", d->timeout, what ? what : "?");
      break;
    }
    if (now() - start < 200e-6) continue;
    struct timespec ts = {0, nap};
    nanosleep(&ts, NULL);
    if (nap < 1000000) nap *= 2;
  }
  if (st == LM_OK) {
    memcpy(all, out, (size_t)K * bytes);
    memcpy((char *)all + (size_t)me * bytes, send, bytes);
    lm_free(out);
  } else if (left) { /* requests still pending: their buffers stay with MPI, and so does this job */
    d->graves[d->ngraves++] = out;
    d->broken = 1;
  } else lm_free(out);
  lm_free(req);
  lm_free(from);
  return st;
}

lm_status lm_dist_sum_f32(lm_dist_t *d, float *v, size_t n, const char *what) {
  if (d->size == 1 || !n) return LM_OK;
  float *all = lm_malloc((size_t)d->size * n * sizeof *all);
  if (!all) return LM_ERR_NOMEM;
  lm_status st = lm_dist_allgather(d, v, n * sizeof *v, all, what);
  if (st == LM_OK)
    for (size_t i = 0; i < n; i++) {
      float s = all[i];
      for (int r = 1; r < d->size; r++) s += all[(size_t)r * n + i];
      v[i] = s;
    }
  lm_free(all);
  return st;
}

lm_status lm_dist_sum_f64(lm_dist_t *d, double *v, size_t n, const char *what) {
  if (d->size == 1 || !n) return LM_OK;
  double *all = lm_malloc((size_t)d->size * n * sizeof *all);
  if (!all) return LM_ERR_NOMEM;
  lm_status st = lm_dist_allgather(d, v, n * sizeof *v, all, what);
  if (st == LM_OK)
    for (size_t i = 0; i < n; i++) {
      double s = all[i];
      for (int r = 1; r < d->size; r++) s += all[(size_t)r * n + i];
      v[i] = s;
    }
  lm_free(all);
  return st;
}

typedef struct verdict {
  int32_t ok;
  char why[1020];
} verdict;

lm_status lm_dist_agree(lm_dist_t *d, int ok, const char *why) {
  verdict mine = {.ok = ok};
  if (!ok) snprintf(mine.why, sizeof mine.why, "%s", why ? why : "failed");
  if (d->size == 1) return ok ? LM_OK : lm_fail(LM_ERR_IO, "rank 0: %s", mine.why);
  verdict *all = lm_malloc((size_t)d->size * sizeof *all);
  if (!all) return LM_ERR_NOMEM;
  lm_status st = lm_dist_allgather(d, &mine, sizeof mine, all, "status");
  for (int r = 0; r < d->size && st == LM_OK; r++)
    if (!all[r].ok) {
      all[r].why[sizeof all[r].why - 1] = 0;
      st = lm_fail(LM_ERR_IO, "rank %d: %s", r, all[r].why);
    }
  lm_free(all);
  return st;
}

/* ---------------------------------------------------------------- NCCL */

typedef void *nccl_comm;
typedef struct nccl_id {
  char internal[128];
} nccl_id;
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 }; /* ncclFloat32, ncclSum (nccl.h, every 2.x) */

typedef struct nccl_api {
  int (*GetVersion)(int *version);
  int (*GetUniqueId)(nccl_id *id);
  int (*CommInitRank)(nccl_comm *comm, int nranks, nccl_id id, int rank);
  int (*CommDestroy)(nccl_comm comm);
  int (*AllGather)(const void *send, void *recv, size_t count, int type, nccl_comm comm, void *stream);
  int (*AllReduce)(const void *send, void *recv, size_t count, int type, int op, nccl_comm comm, void *stream);
  const char *(*GetErrorString)(int result);
  int (*GroupStart)(void);
  int (*GroupEnd)(void);
} nccl_api;

static const struct {
  const char *name;
  size_t offset;
} nccl_symbols[] = {
#define SYM(f) {"nccl" #f, offsetof(nccl_api, f)}
    SYM(GetVersion), SYM(GetUniqueId), SYM(CommInitRank), SYM(CommDestroy), SYM(AllGather), SYM(AllReduce),
    SYM(GetErrorString), SYM(GroupStart), SYM(GroupEnd),
#undef SYM
};

struct lm_nccl {
  void *lib;
  nccl_api nc;
  nccl_comm comm;
  int rank;
  char version[32];
};

/* The one checking funnel for NCCL calls: keeps the call and ncclGetErrorString's text. */
static lm_status nccl_check(const lm_nccl_t *n, int r, const char *call, int line) {
  if (r == 0) return LM_OK;
  const char *text = n->nc.GetErrorString ? n->nc.GetErrorString(r) : NULL;
  return lm_fail(LM_ERR_BACKEND, "nccl: rank %d: %s failed: %s (%d) [dist.c:%d]", n->rank, call,
                 text ? text : "unknown error", r, line);
}
#define NCCL(call) nccl_check(n, (n->nc.call), #call, __LINE__)

lm_nccl_t *lm_nccl_open(lm_dist_t *d, int cuda_device) {
  (void)cuda_device; /* NCCL runs on the current device: with one GPU per rank, CUDA_VISIBLE_DEVICES picks it */
  if (!d) {
    lm_fail(LM_ERR_INVALID, "nccl: needs MPI to bootstrap (run under mpirun)");
    return NULL;
  }
  lm_nccl_t *n = lm_calloc(1, sizeof *n);
  if (!n) return NULL;
  n->rank = d->rank;
  const char *want = getenv("LUMEN_NCCL_LIB"), *name = want && *want ? want : "libnccl.so.2";
  lm_status st = LM_OK;
  n->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) {
    const char *e = dlerror();
    st = lm_fail(LM_ERR_UNSUPPORTED, "nccl: rank %d: %s not found (%s): install NCCL (libnccl2) for training on "
                                     "several GPUs, or set LUMEN_NCCL_LIB", d->rank, name, e ? e : "dlopen failed");
  }
  for (size_t i = 0; st == LM_OK && i < LM_COUNTOF(nccl_symbols); i++) {
    void *p = dlsym(n->lib, nccl_symbols[i].name);
    if (!p) st = lm_fail(LM_ERR_UNSUPPORTED, "nccl: %s lacks %s: not a usable NCCL", name, nccl_symbols[i].name);
    else memcpy((char *)&n->nc + nccl_symbols[i].offset, &p, sizeof p);
  }
  int v = 0;
  if (st == LM_OK && (st = NCCL(GetVersion(&v))) == LM_OK)
    snprintf(n->version, sizeof n->version, "NCCL %d.%d.%d", v / 10000, (v / 100) % 100, v % 100);
  /* rank 0 draws the id; every rank then has rank 0's (a failing rank 0 says so to all) */
  nccl_id id, *all = NULL;
  memset(&id, 0, sizeof id);
  if (st == LM_OK && d->rank == 0) st = NCCL(GetUniqueId(&id));
  char why[1024];
  snprintf(why, sizeof why, "%s", st == LM_OK ? "" : lm_last_error());
  lm_status agreed = lm_dist_agree(d, st == LM_OK, why);
  if (agreed != LM_OK) goto fail;
  if (!(all = lm_malloc((size_t)d->size * sizeof *all))) goto fail;
  if (lm_dist_allgather(d, &id, sizeof id, all, "nccl unique id") != LM_OK) goto fail;
  id = all[0];
  lm_free(all);
  all = NULL;
  st = NCCL(CommInitRank(&n->comm, d->size, id, d->rank));
  snprintf(why, sizeof why, "%s", st == LM_OK ? "" : lm_last_error());
  if (lm_dist_agree(d, st == LM_OK, why) != LM_OK) goto fail;
  return n;
fail:
  lm_free(all);
  lm_nccl_close(n);
  return NULL;
}

void lm_nccl_close(lm_nccl_t *n) {
  if (!n) return;
  if (n->comm) n->nc.CommDestroy(n->comm);
  lm_free(n); /* the library stays loaded, as the CUDA driver does */
}

const char *lm_nccl_version(const lm_nccl_t *n) { return n ? n->version : ""; }

lm_status lm_nccl_allgather_f32(lm_nccl_t *n, const void *send, void *recv, size_t count, void *stream) {
  return NCCL(AllGather(send, recv, count, NCCL_FLOAT32, n->comm, stream));
}

lm_status lm_nccl_group(lm_nccl_t *n, int begin) { return begin ? NCCL(GroupStart()) : NCCL(GroupEnd()); }

lm_status lm_nccl_allreduce_f32(lm_nccl_t *n, void *buf, size_t count, void *stream) {
  return NCCL(AllReduce(buf, buf, count, NCCL_FLOAT32, NCCL_SUM, n->comm, stream));
}
