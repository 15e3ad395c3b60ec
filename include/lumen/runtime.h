/* lumen/runtime.h — backends and programs: a program is a graph prepared for one backend,
 * with its symbolic dimensions bound at run time and its persistent parameters and state
 * kept on the backend between runs. */
#ifndef LUMEN_RUNTIME_H
#define LUMEN_RUNTIME_H

#include "lumen/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_backend lm_backend_t;
typedef struct lm_program lm_program_t;

/* Backends compiled into this build, in preference order ("ref" is always present). */
int lm_backend_count(void);
const char *lm_backend_name_at(int i);

/* Opens a backend by name; NULL (and lm_last_error) when unknown or unavailable. */
lm_backend_t *lm_backend_new(const char *name);
void lm_backend_free(lm_backend_t *b);
const char *lm_backend_name(const lm_backend_t *b);

/* Validates the graph and prepares it for the backend. The program keeps its own copy
 * of the graph, so the caller may free the graph afterwards. */
lm_program_t *lm_program_new(lm_backend_t *b, const lm_graph_t *g);
void lm_program_free(lm_program_t *p);

/* Binds a symbol (by name) to a value >= its least value. Rebinding to another value
 * resizes the buffers that depend on it; persistent ones are zeroed. */
lm_status lm_program_bind(lm_program_t *p, const char *symbol, int64_t value);

/* RAND's key and counter: uniforms of a run depend on (seed, stream, element, run).
 * The run counter starts at 0 and advances by one after every run. */
void lm_program_set_seed(lm_program_t *p, uint64_t seed);
void lm_program_set_run(lm_program_t *p, uint64_t run);
uint64_t lm_program_run_index(const lm_program_t *p);

/* The program's inputs, in declaration order (names, roles). */
int lm_program_input_count(const lm_program_t *p);
const char *lm_program_input_name(const lm_program_t *p, int i);
lm_role lm_program_input_role(const lm_program_t *p, int i);

/* Element count of a named input or output under the current bindings. */
lm_status lm_program_numel(lm_program_t *p, const char *name, size_t *count);
/* Copies host floats into a named input (data, parameter or state); count must equal
 * its element count. Data inputs must be written before the first run; parameters and
 * state start at zero. */
lm_status lm_program_write(lm_program_t *p, const char *name, const float *src, size_t count);
/* Copies a named output, parameter or state to the host. */
lm_status lm_program_read(lm_program_t *p, const char *name, float *dst, size_t count);
/* The backend's own buffer behind a named input or output, for code that moves data without a
 * copy through lumen (a library's collective, a numpy view). native: the backend's handle (a
 * host pointer on ref and cpu, a CUdeviceptr on cuda, a cl_mem on opencl); host: the same memory
 * as a host pointer where the backend's buffers are host memory (ref, cpu), else NULL. Valid
 * until a bind that resizes it, or the program is freed; runs write an output's buffer in place.
 * An output's buffer is allocated here if no run has made it yet. Taking a data input's buffer
 * counts as writing it: the caller fills it (through host, or on the device's queue). */
typedef struct lm_buffer_view {
  void *native;
  float *host;
  size_t count;
} lm_buffer_view;
lm_status lm_program_buffer(lm_program_t *p, const char *name, lm_buffer_view *out);
/* The queue the backend issues its runs on, in order (a CUstream on cuda), for a library whose
 * calls must run between two programs' runs without a wait on the host; NULL where the backend
 * has none (ref, cpu, opencl: a run has finished when lm_program_run returns). */
void *lm_backend_queue(lm_backend_t *b);
/* Which device of this machine the backend runs on (cuda: its PCI bus id, "0000:17:00.0"), for
 * ranks that must each have their own; NULL for backends that run on the host's CPUs. */
const char *lm_backend_device_id(lm_backend_t *b);
/* Runs the graph once: computes the outputs, then applies every assign. */
lm_status lm_program_run(lm_program_t *p);

/* Makes input `name` of p use the buffer of `owner`'s input or output `owner_name` (same
 * backend; element counts must agree at every run; the owner must outlive p). This is how
 * a rollout reads the weights a training program updates, and a training program reads the
 * trajectory a rollout wrote, with no copies. Reads and writes through p reach that buffer. */
lm_status lm_program_link(lm_program_t *p, const char *name, lm_program_t *owner, const char *owner_name);

/* A scan program runs a step graph T times per lm_program_run, as a rollout or a discounted
 * sum does: STATE inputs are the carry (the step's assigns update them after every step);
 * the DATA inputs named in per_step are fed as [T, ...] and step t reads slice t; every
 * output is collected as [T, ...], step t writing slice t; everything else is read as is.
 * RAND in step t uses the run counter run*T + t, so a scan of T steps draws what T runs of
 * the step would. With reverse, t goes from T-1 down to 0. `T` names a symbol (new, or one
 * of the step graph's), bound with lm_program_bind like any other. */
lm_program_t *lm_program_new_scan(lm_backend_t *b, const lm_graph_t *step, const char *T, int reverse,
                                  const char *const *per_step, int n_per_step);

/* What the backend made of the program (under the current bindings for the sizes). */
typedef struct lm_program_stats {
  int kernels;            /* kernel launches per run (0 for the interpreter) */
  size_t arena_bytes;     /* bytes of the arena holding intermediates */
  size_t temp_bytes;      /* bytes the intermediates would take without reuse */
} lm_program_stats;
lm_status lm_program_get_stats(lm_program_t *p, lm_program_stats *stats);

/* Opens `name`, or for "auto" the best backend this machine can run, trying them in
 * preference order. `why` (may be NULL) receives one line saying what was picked and why,
 * e.g. "cpu: no CUDA driver (libcuda.so.1 not found)" or "ref: no working C compiler: ...". */
lm_backend_t *lm_backend_open(const char *name, char *why, size_t why_cap);

#ifdef __cplusplus
}
#endif
#endif
