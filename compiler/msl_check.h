/* compiler/msl_check.h — Metal without a Mac: the exact MSL source the metal backend compiles
 * for a plan, its validation under the C++ shim (msl_shim.h), and the device layer the metal
 * backend's host logic runs on — the real one (Objective-C runtime, compiler/backends/metal.c)
 * and an emulated one that runs the shim-compiled kernels on the CPU (msl_check.c).
 *
 * Validation: the source is checked for Metal's limits (at most LM_MSL_MAX_SLOTS buffer slots per
 * kernel, [[buffer(j)]] numbered 0, 1, 2... in parameter order, a [[thread_position_in_grid]]
 * parameter), then compiled with the system C++ compiler ($LUMEN_CXX, else clang++, g++, c++)
 * as C++17 with the shim as <metal_stdlib>, -fno-exceptions -fno-rtti, fp contraction off and
 * warnings as errors, into a shared object cached under lm_cc_cache_dir()/msl (keyed by the
 * source, the shim, the compiler's --version line and the flags). A C-ABI launcher
 * lm_msl_launch_<kernel>(void *const *slots, long start, long end) is appended for every
 * kernel; it calls the kernel once per thread position, parameter j taking slots[j] (a buffer
 * for [[buffer(j)]]; for a `uint` index parameter a pointer to its value, or NULL for the
 * position in [start, end)). Index parameters: [[thread_position_in_grid]],
 * [[thread_position_in_threadgroup]], [[thread_index_in_threadgroup]],
 * [[threadgroup_position_in_grid]], [[threads_per_threadgroup]] (1-D, uint). Never prints. */
#ifndef LUMEN_MSL_CHECK_H
#define LUMEN_MSL_CHECK_H

#include <stdint.h>

#include "backends/backend.h"
#include "loopir.h"

/* Metal's limit on buffer argument slots ([[buffer(0)]] .. [[buffer(30)]]) per kernel. */
enum { LM_MSL_MAX_SLOTS = 31 };
/* Parameters of a kernel the validator and the emulator accept: the buffers and up to 5 indices. */
enum { LM_MSL_MAX_PARAMS = LM_MSL_MAX_SLOTS + 5 };

/* The kernel the metal backend appends to every program to apply assigns (plan copies):
 * dst [[buffer(0)]] = src [[buffer(1)]], n [[buffer(2)]] elements, one thread per element. */
#define LM_MSL_COPY_ENTRY "lumen_copy_f32"

/* What the metal backend compiles for plan p: lm_render_plan(p, LM_DIALECT_MSL), with
 * `#pragma METAL fp contract(off)` after the prelude when the renderer did not put it there
 * (Metal fuses a*b+c into an FMA even in safe math mode; only the pragma stops it), then the copy
 * kernel. malloc'd (lm_free); NULL with lm_last_error on a render failure or a kernel named
 * LM_MSL_COPY_ENTRY. */
char *lm_msl_plan_source(const lm_plan *p);

/* Validates MSL source: Metal's limits, then a compile under the shim. LM_OK with a one-line
 * summary in log ("msl: 93 kernels (0 with threadgroup barriers), at most 16 of 31 buffer slots;
 * compiled under the shim with clang++ (...) -O1 (0.61 s)"), else LM_ERR_COMPILE (or LM_ERR_UNSUPPORTED when no
 * C++ compiler runs) with the problem in log and lm_last_error: the compiler's messages name
 * the kept source file. log may be NULL. */
lm_status lm_msl_check_source(const char *msl, char *log, size_t cap);
/* lm_msl_plan_source + lm_msl_check_source. */
lm_status lm_msl_check_plan(const lm_plan *p, char *log, size_t cap);
/* Compiles a graph as a backend does (lm_compile, with a scan over the symbol named T when T is
 * not NULL: reverse, and the inputs named in per_step fed per step) and checks its MSL. This is
 * what `rltrain compile ENV --target metal` runs for each lm_train_graph. */
lm_status lm_msl_check_graph(const lm_graph_t *g, const char *T, int reverse, const char *const *per_step,
                             int n_per_step, char *log, size_t cap);

/* ---------------------------------------------------------------- the device layer */

/* What the metal backend's host logic needs from a device. Buffers are shared storage (the CPU
 * reads and writes `contents` directly). One encoder records one command buffer: dispatches in
 * a concurrent compute encoder, whose order Metal may change between barriers. */
typedef struct lm_mtl_device {
  const char *name;
  lm_status (*open)(void **dev); /* fails saying why the device is unavailable */
  void (*close)(void *dev);
  lm_status (*buffer_new)(void *dev, size_t bytes, void **buf, void **contents); /* zeroed */
  void (*buffer_free)(void *dev, void *buf);
  /* Compiles msl (fast math off) and makes one compute pipeline per entry point. */
  lm_status (*library_new)(void *dev, const char *msl, const char *const *entries, size_t n, void **lib);
  void (*library_free)(void *dev, void *lib);
  lm_status (*encoder_new)(void *dev, void **enc);
  void (*set_kernel)(void *enc, void *lib, size_t entry);
  void (*set_buffer)(void *enc, void *buf, size_t offset, uint32_t slot);
  void (*set_bytes)(void *enc, const void *bytes, size_t n, uint32_t slot); /* copied now */
  /* A 1-D grid of at least `threads` threads in threadgroups of `group` (0: the device's choice). */
  void (*dispatch)(void *enc, uint64_t threads, uint32_t group);
  void (*barrier)(void *enc); /* every dispatch before it finishes its buffer writes first */
  /* Ends the encoder; with commit, runs the command buffer and waits. Frees enc. */
  lm_status (*finish)(void *enc, int commit, double *gpu_seconds);
} lm_mtl_device;

/* The emulated device: kernels compiled under the shim and executed on the CPU, one call per
 * thread position. Between two barriers it runs the recorded dispatches in REVERSE order, so a
 * barrier the host forgot changes results instead of passing unnoticed. A kernel that calls
 * threadgroup_barrier runs one threadgroup at a time with one OS thread per work-item and a real
 * barrier (a work-item that returns stops counting); its threadgroup variables (`static` under
 * the shim) are shared by the group. Threadgroups default to LM_MSL_SHIM_GROUP work-items. */
enum { LM_MSL_SHIM_GROUP = 64 };
extern const lm_mtl_device lm_mtl_device_shim;

/* Process-wide counts of what the emulated device did (for tests). */
typedef struct lm_msl_shim_counts {
  int64_t command_buffers, dispatches, barriers, threads;
} lm_msl_shim_counts;
void lm_msl_shim_counts_get(lm_msl_shim_counts *out);

/* The metal backends (compiler/backends/metal.c): "metal" on the Objective-C runtime, and
 * "metal-shim", the same host code on the emulated device. */
extern const lm_backend_ops lm_backend_metal;
extern const lm_backend_ops lm_backend_metal_shim;
/* GPU seconds (command buffer GPUEndTime - GPUStartTime; wall time on the emulated device) of
 * the last run of a prepared executable of either metal backend: the search's timing. */
double lm_metal_last_gpu_seconds(const void *exe);

#endif
