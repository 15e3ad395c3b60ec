/* compiler/backends/backend.h — the one vtable every backend implements (ref, cpu, cuda,
 * opencl, metal). Optional entries may be NULL; capabilities are asked, never assumed.
 * Buffers are opaque device allocations; a prepared executable is whatever the backend
 * made of a graph (an interpreter plan, a shared object, CUDA modules...). */
#ifndef LUMEN_BACKEND_H
#define LUMEN_BACKEND_H

#include "graph-impl.h"
#include "lumen/runtime.h"

struct lm_kernel;         /* loopir.h */
struct lm_gpu_options;    /* gpu.h */
struct lm_search_device;  /* search/search.h */

/* Everything a run needs, indexed like the graph's inputs and outputs. */
typedef struct lm_run_args {
  const int64_t *syms;  /* value of every symbol of the graph */
  void *const *inputs;  /* one buffer per graph input */
  void *const *outputs; /* one buffer per graph output */
  uint64_t seed, run;   /* RAND key and run counter */
} lm_run_args;

/* How a program runs its graph: once per run, or as a scan of T steps (lumen/runtime.h). */
typedef struct lm_scan_info {
  int active;
  int sym_T;               /* symbol holding T */
  int reverse;
  const uint8_t *per_step; /* per graph input: fed as [T, ...] */
} lm_scan_info;

/* Runs a step graph as a scan by calling `run_step` T times, each with the inputs and
 * outputs offset to slice t and the run counter run*T + t (the generic path). */
typedef lm_status (*lm_step_fn)(void *ctx, void *exe, const lm_run_args *args);
lm_status lm_scan_by_steps(void *ctx, void *exe, const lm_graph_t *g, const lm_scan_info *scan,
                           const lm_run_args *args, lm_step_fn run_step);

typedef struct lm_backend_ops {
  const char *name;
  const char *description;
  /* Opens the device; an error here means "not available on this machine" and says why. */
  lm_status (*open)(void **ctx);
  void (*close)(void *ctx);
  lm_status (*alloc)(void *ctx, size_t bytes, void **buf);
  void (*release)(void *ctx, void *buf);
  lm_status (*write)(void *ctx, void *buf, const void *src, size_t bytes);
  lm_status (*read)(void *ctx, const void *buf, void *dst, size_t bytes);
  lm_status (*fill_zero)(void *ctx, void *buf, size_t bytes);
  /* 1 where a buffer is a host pointer the host may read and write between runs (ref, cpu). */
  int host_memory;
  /* The queue runs are issued on, for libraries that join it (a CUstream on cuda; NULL: none). */
  void *(*queue)(void *ctx);
  /* Which device of the machine it runs on (cuda: the PCI bus id); NULL: the host's CPUs. */
  const char *(*device_id)(void *ctx);
  /* Prepares a validated graph (owned by the program, which outlives the executable).
   * Symbols are not bound yet: nothing may depend on their values. */
  lm_status (*prepare)(void *ctx, lm_graph_t *g, const lm_scan_info *scan, void **exe);
  void (*unprepare)(void *ctx, void *exe);
  /* Computes every output, then applies every assign (reads see the old values). */
  lm_status (*run)(void *ctx, void *exe, const lm_run_args *args);
  lm_status (*sync)(void *ctx);
  /* Kernels per run and arena sizes under these symbol values (NULL: nothing to report). */
  lm_status (*stats)(void *ctx, void *exe, const int64_t *syms, lm_program_stats *out);
  /* Kernel by kernel, for the search to time candidates on the device (NULL where absent):
   * builds rendered source of kernel_dialect (lm_dialect) into a module (LM_ERR_COMPILE with
   * the log); looks up the entry of kernel k (its launch shape: k's work-group size or the
   * backend's own); launches it over `work` points (the product of k's parallel extents) with
   * bufs[b] the device buffer of plan buffer b, S the symbols (int64) and R (seed, run) on the
   * device. Launches are asynchronous: sync waits. */
  int kernel_dialect;
  /* The search's view of this device: ops, context, device name, and in *gpu the work-group
   * schedules this backend applies (out->gpu points there, or is NULL when they are off). */
  void (*search_device)(void *ctx, struct lm_search_device *out, struct lm_gpu_options *gpu);
  lm_status (*module_build)(void *ctx, const char *src, void **module);
  void (*module_free)(void *ctx, void *module);
  lm_status (*module_entry)(void *ctx, void *module, const char *name, const struct lm_kernel *k, void **entry);
  void (*entry_free)(void *ctx, void *entry);
  lm_status (*launch_kernel)(void *ctx, void *entry, const struct lm_kernel *k, void *const *bufs, void *S, void *R,
                             int64_t work);
} lm_backend_ops;

/* The ops and context behind a backend handle (lumen/runtime.h). */
const lm_backend_ops *lm_backend_parts(lm_backend_t *b, void **ctx);

extern const lm_backend_ops lm_backend_ref;
extern const lm_backend_ops lm_backend_cpu;
extern const lm_backend_ops lm_backend_metal;
extern const lm_backend_ops lm_backend_cuda;
extern const lm_backend_ops lm_backend_opencl;

#endif
