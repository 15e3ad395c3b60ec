/* compiler/nvrtc.h — NVRTC loaded at run time (never linked): CUDA C++ to CUBIN for one sm_XX,
 * with the ptxas figures (registers, stack, spills) of every entry function parsed from its log
 * (the compile-only path of `rltrain compile` that uses it: train/iteration.h). Only public
 * lumen types cross this header. Never prints or exits. */
#ifndef LUMEN_NVRTC_H
#define LUMEN_NVRTC_H

#include <stddef.h>

#include "lumen/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- NVRTC ---- */
typedef struct lm_nvrtc lm_nvrtc;

/* Loads NVRTC: $LUMEN_NVRTC (a path) if set, else libnvrtc.so.13/.12/.11.2/libnvrtc.so from the
 * loader path, else <cuda root>/lib64. The library stays loaded for the life of the process.
 * LM_ERR_UNSUPPORTED ("no NVRTC: ...", naming every file tried) when none loads. */
lm_status lm_nvrtc_open(lm_nvrtc **out);
void lm_nvrtc_close(lm_nvrtc *nv);
/* "NVRTC 13.0 (libnvrtc.so.13)"; valid until lm_nvrtc_close. */
const char *lm_nvrtc_describe(const lm_nvrtc *nv);
/* 1 when this NVRTC makes CUBIN for sm_<sm> (e.g. 90); 1 too when it cannot say (old NVRTC). */
int lm_nvrtc_supports(const lm_nvrtc *nv, int sm);

/* A compiled module: the CUBIN bytes and NVRTC's whole log (ptxas -v output included). */
typedef struct lm_cubin {
  void *data;
  size_t size;
  char *log;
} lm_cubin;

/* Compiles `source` (name `what`, used in messages and file names) to CUBIN for `arch` ("sm_90")
 * with --fmad=false -default-device --ptxas-options=-v. Results are cached on disk, keyed by
 * (source, arch, options, NVRTC version): <lumen cache dir>/nvrtc/<key>.cubin and .log (the
 * log of the compile that made it); LUMEN_NVRTC_CACHE=0 always compiles. On failure LM_ERR_COMPILE; the message
 * names a file holding the whole log and source (<lumen cache dir>/nvrtc-<hash>.txt), then
 * carries the log and the source themselves (lm_last_error keeps the first 4 KB). */
lm_status lm_nvrtc_compile(lm_nvrtc *nv, const char *source, const char *what, const char *arch, lm_cubin *out);
void lm_cubin_free(lm_cubin *c);

/* Writes a failed compile's log and source to <lumen cache dir>/<tool>-<hash>.txt (else /tmp) and
 * puts the path in `path` (or a note that no file could be written). For error messages, which
 * lm_last_error truncates. */
void lm_keep_compile_failure(const char *tool, const char *what, const char *target, const char *log,
                             const char *source, char *path, size_t cap);

/* What ptxas said about one entry function. */
typedef struct lm_ptxas_info {
  int registers;
  int stack_bytes;  /* stack frame (local arrays indexed at run time live here) */
  int spill_stores; /* bytes */
  int spill_loads;  /* bytes */
  int shared_bytes; /* static shared memory (work-group schedules: tiles, staged weights) */
} lm_ptxas_info;

/* Parses the ptxas -v lines of `entry` out of an NVRTC log. LM_ERR_INVALID when the log has
 * no such entry. */
lm_status lm_ptxas_info_parse(const char *log, const char *entry, lm_ptxas_info *out);


/* Provided by compiler/backends/opencl.c: builds OpenCL C source on the device the opencl
 * backend would pick, discarding the program; LM_ERR_UNSUPPORTED when there is no platform,
 * LM_ERR_COMPILE with the build log. `describe` receives the device and platform. */
lm_status lm_opencl_build_check(const char *source, const char *what, char *describe, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
