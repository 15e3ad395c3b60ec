/* compiler/backends/opencl.c — the opencl backend: libOpenCL.so.1 (the ICD loader) dlopened, its
 * OpenCL 1.2 entry points declared here (no header needed to build); the OpenCL C rendering of
 * the plan built with -cl-fp32-correctly-rounded-divide-sqrt; one in-order queue; kernels
 * launched 1-D with work-groups of 64. In CI it runs on PoCL, which executes real work-groups
 * and barriers on the CPU.
 *
 * Buffers are cl_mem. The memory plan's arena is one cl_mem and every temporary a sub-buffer of
 * it, placed with the device's base-address alignment. Kernel arguments follow render.h: one
 * cl_mem per buffer the kernel touches, then S, R and total. A scan that runs step by step
 * copies slice t of its per-step inputs into a one-step buffer before the step and its outputs
 * out after it (OpenCL 1.2 cannot offset a cl_mem argument), and each step reads its own R. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend.h"
#include "compile.h"
#include "gpu.h"
#include "memplan.h"
#include "nvrtc.h"
#include "render.h"
#include "search/search.h"

/* ---------------------------------------------------------------- OpenCL 1.2, declared */

typedef int32_t cl_int_;
typedef uint32_t cl_uint_;
typedef uint64_t cl_bits_;
typedef struct cl_platform_st *cl_platform;
typedef struct cl_device_st *cl_device;
typedef struct cl_context_st *cl_ctx;
typedef struct cl_queue_st *cl_queue;
typedef struct cl_mem_st *cl_buf;
typedef struct cl_program_st *cl_prog;
typedef struct cl_kernel_st *cl_kern;
typedef struct cl_event_st *cl_ev;
typedef struct {
  size_t origin, size;
} cl_region;

enum {
  CL_OK = 0,
  CL_NO_PLATFORM = -1001, /* CL_PLATFORM_NOT_FOUND_KHR (from the ICD loader) */
  CL_BUILD_FAILURE = -11, /* CL_BUILD_PROGRAM_FAILURE */
  CL_PLATFORM_NAME_ = 0x0902,
  CL_DEVICE_TYPE_ = 0x1000,
  CL_DEVICE_MAX_WORK_GROUP_SIZE_ = 0x1004,
  CL_DEVICE_MEM_BASE_ADDR_ALIGN_ = 0x1019,
  CL_DEVICE_LOCAL_MEM_SIZE_ = 0x1023,
  CL_DEVICE_NAME_ = 0x102B,
  CL_PROGRAM_BUILD_LOG_ = 0x1183,
  CL_KERNEL_WORK_GROUP_SIZE_ = 0x11B0,
  CL_BUFFER_CREATE_TYPE_REGION_ = 0x1220,
  CL_MEM_READ_WRITE_ = 1,
};
#define CL_TYPE_GPU ((cl_bits_)1 << 2)
#define CL_TYPE_ALL ((cl_bits_)0xFFFFFFFF)

#ifdef LUMEN_HAVE_OPENCL /* when the header is at hand, check the declarations against it */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <CL/cl_ext.h>
_Static_assert(CL_NO_PLATFORM == CL_PLATFORM_NOT_FOUND_KHR && CL_BUILD_FAILURE == CL_BUILD_PROGRAM_FAILURE, "cl.h");
_Static_assert(CL_PLATFORM_NAME_ == CL_PLATFORM_NAME && CL_DEVICE_TYPE_ == CL_DEVICE_TYPE, "cl.h");
_Static_assert(CL_DEVICE_MAX_WORK_GROUP_SIZE_ == CL_DEVICE_MAX_WORK_GROUP_SIZE, "cl.h");
_Static_assert(CL_DEVICE_LOCAL_MEM_SIZE_ == CL_DEVICE_LOCAL_MEM_SIZE, "cl.h");
_Static_assert(CL_DEVICE_MEM_BASE_ADDR_ALIGN_ == CL_DEVICE_MEM_BASE_ADDR_ALIGN && CL_DEVICE_NAME_ == CL_DEVICE_NAME, "cl.h");
_Static_assert(CL_PROGRAM_BUILD_LOG_ == CL_PROGRAM_BUILD_LOG && CL_KERNEL_WORK_GROUP_SIZE_ == CL_KERNEL_WORK_GROUP_SIZE, "cl.h");
_Static_assert(CL_BUFFER_CREATE_TYPE_REGION_ == CL_BUFFER_CREATE_TYPE_REGION && CL_MEM_READ_WRITE_ == CL_MEM_READ_WRITE, "cl.h");
_Static_assert(CL_TYPE_GPU == CL_DEVICE_TYPE_GPU && CL_TYPE_ALL == CL_DEVICE_TYPE_ALL, "cl.h");
_Static_assert(sizeof(cl_int_) == sizeof(cl_int) && sizeof(cl_bits_) == sizeof(cl_bitfield), "cl.h");
_Static_assert(sizeof(cl_region) == sizeof(cl_buffer_region), "cl.h");
#endif

typedef struct cl_api {
  cl_int_ (*GetPlatformIDs)(cl_uint_, cl_platform *, cl_uint_ *);
  cl_int_ (*GetPlatformInfo)(cl_platform, cl_uint_, size_t, void *, size_t *);
  cl_int_ (*GetDeviceIDs)(cl_platform, cl_bits_, cl_uint_, cl_device *, cl_uint_ *);
  cl_int_ (*GetDeviceInfo)(cl_device, cl_uint_, size_t, void *, size_t *);
  cl_ctx (*CreateContext)(const intptr_t *, cl_uint_, const cl_device *, void (*)(const char *, const void *, size_t, void *),
                          void *, cl_int_ *);
  cl_int_ (*ReleaseContext)(cl_ctx);
  cl_queue (*CreateCommandQueue)(cl_ctx, cl_device, cl_bits_, cl_int_ *);
  cl_int_ (*ReleaseCommandQueue)(cl_queue);
  cl_buf (*CreateBuffer)(cl_ctx, cl_bits_, size_t, void *, cl_int_ *);
  cl_buf (*CreateSubBuffer)(cl_buf, cl_bits_, cl_uint_, const void *, cl_int_ *);
  cl_int_ (*ReleaseMemObject)(cl_buf);
  cl_int_ (*EnqueueWriteBuffer)(cl_queue, cl_buf, cl_uint_, size_t, size_t, const void *, cl_uint_, const cl_ev *, cl_ev *);
  cl_int_ (*EnqueueReadBuffer)(cl_queue, cl_buf, cl_uint_, size_t, size_t, void *, cl_uint_, const cl_ev *, cl_ev *);
  cl_int_ (*EnqueueCopyBuffer)(cl_queue, cl_buf, cl_buf, size_t, size_t, size_t, cl_uint_, const cl_ev *, cl_ev *);
  cl_int_ (*EnqueueFillBuffer)(cl_queue, cl_buf, const void *, size_t, size_t, size_t, cl_uint_, const cl_ev *, cl_ev *);
  cl_prog (*CreateProgramWithSource)(cl_ctx, cl_uint_, const char **, const size_t *, cl_int_ *);
  cl_int_ (*BuildProgram)(cl_prog, cl_uint_, const cl_device *, const char *, void (*)(cl_prog, void *), void *);
  cl_int_ (*GetProgramBuildInfo)(cl_prog, cl_device, cl_uint_, size_t, void *, size_t *);
  cl_int_ (*ReleaseProgram)(cl_prog);
  cl_kern (*CreateKernel)(cl_prog, const char *, cl_int_ *);
  cl_int_ (*ReleaseKernel)(cl_kern);
  cl_int_ (*SetKernelArg)(cl_kern, cl_uint_, size_t, const void *);
  cl_int_ (*GetKernelWorkGroupInfo)(cl_kern, cl_device, cl_uint_, size_t, void *, size_t *);
  cl_int_ (*EnqueueNDRangeKernel)(cl_queue, cl_kern, cl_uint_, const size_t *, const size_t *, const size_t *, cl_uint_,
                                  const cl_ev *, cl_ev *);
  cl_int_ (*WaitForEvents)(cl_uint_, const cl_ev *);
  cl_int_ (*ReleaseEvent)(cl_ev);
  cl_int_ (*Finish)(cl_queue);
} cl_api;

static const struct {
  size_t offset;
  const char *name;
} cl_symbols[] = {
#define SYM(field) {offsetof(cl_api, field), "cl" #field}
    SYM(GetPlatformIDs),      SYM(GetPlatformInfo),        SYM(GetDeviceIDs),       SYM(GetDeviceInfo),
    SYM(CreateContext),       SYM(ReleaseContext),         SYM(CreateCommandQueue), SYM(ReleaseCommandQueue),
    SYM(CreateBuffer),        SYM(CreateSubBuffer),        SYM(ReleaseMemObject),   SYM(EnqueueWriteBuffer),
    SYM(EnqueueReadBuffer),   SYM(EnqueueCopyBuffer),      SYM(EnqueueFillBuffer),  SYM(CreateProgramWithSource),
    SYM(BuildProgram),        SYM(GetProgramBuildInfo),    SYM(ReleaseProgram),     SYM(CreateKernel),
    SYM(ReleaseKernel),       SYM(SetKernelArg),           SYM(GetKernelWorkGroupInfo), SYM(EnqueueNDRangeKernel),
    SYM(WaitForEvents),       SYM(ReleaseEvent),           SYM(Finish),
#undef SYM
};

static pthread_once_t cl_once = PTHREAD_ONCE_INIT;
static cl_api cl;
static int cl_ready;
static char cl_error[1024];

static const char *cl_err_name(cl_int_ e) {
  switch (e) {
  case -1: return "CL_DEVICE_NOT_FOUND";
  case -2: return "CL_DEVICE_NOT_AVAILABLE";
  case -3: return "CL_COMPILER_NOT_AVAILABLE";
  case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
  case -5: return "CL_OUT_OF_RESOURCES";
  case -6: return "CL_OUT_OF_HOST_MEMORY";
  case -11: return "CL_BUILD_PROGRAM_FAILURE";
  case -13: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
  case -30: return "CL_INVALID_VALUE";
  case -33: return "CL_INVALID_DEVICE";
  case -34: return "CL_INVALID_CONTEXT";
  case -36: return "CL_INVALID_COMMAND_QUEUE";
  case -38: return "CL_INVALID_MEM_OBJECT";
  case -43: return "CL_INVALID_BUILD_OPTIONS";
  case -44: return "CL_INVALID_PROGRAM";
  case -46: return "CL_INVALID_KERNEL_NAME";
  case -48: return "CL_INVALID_KERNEL";
  case -49: return "CL_INVALID_ARG_INDEX";
  case -50: return "CL_INVALID_ARG_VALUE";
  case -51: return "CL_INVALID_ARG_SIZE";
  case -52: return "CL_INVALID_KERNEL_ARGS";
  case -54: return "CL_INVALID_WORK_GROUP_SIZE";
  case -61: return "CL_INVALID_BUFFER_SIZE";
  case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
  case CL_NO_PLATFORM: return "CL_PLATFORM_NOT_FOUND_KHR";
  default: return "an OpenCL error";
  }
}

/* The one checking funnel for OpenCL calls: keeps the call and the error's name. */
static lm_status cl_check(cl_int_ e, const char *call, int line) {
  if (e == CL_OK) return LM_OK;
  return lm_fail(LM_ERR_BACKEND, "opencl: %s failed: %s (%d) [opencl.c:%d]", call, cl_err_name(e), (int)e, line);
}
#define CL(call) cl_check((call), #call, __LINE__)
/* For the calls that return an object and report through their last argument. */
#define CL_OUT(var, call)                                                                          \
  do {                                                                                             \
    cl_int_ e_ = CL_OK;                                                                            \
    var = call;                                                                                    \
    st = cl_check(var ? e_ : (e_ ? e_ : -6), #call, __LINE__);                                      \
  } while (0)

/* Loads the ICD loader once per process; it is never unloaded (drivers keep threads). */
static void cl_load(void) {
  void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(cl_error, sizeof cl_error, "no OpenCL: libOpenCL.so.1 not found (%s)", e ? e : "dlopen failed");
    return;
  }
  for (size_t i = 0; i < LM_COUNTOF(cl_symbols); i++) {
    void *p = dlsym(lib, cl_symbols[i].name);
    if (!p) {
      snprintf(cl_error, sizeof cl_error, "no usable OpenCL: libOpenCL.so.1 lacks %s (OpenCL 1.2 is needed)",
               cl_symbols[i].name);
      return;
    }
    memcpy((char *)&cl + cl_symbols[i].offset, &p, sizeof p); /* object -> function pointer */
  }
  cl_ready = 1;
}

/* ---------------------------------------------------------------- device */

typedef struct cl_context_ {
  cl_device dev;
  cl_ctx ctx;
  cl_queue queue;
  size_t max_wg;
  uint64_t local_mem; /* CL_DEVICE_LOCAL_MEM_SIZE: work-group shared memory in bytes */
  size_t align; /* sub-buffer offsets: CL_DEVICE_MEM_BASE_ADDR_ALIGN in bytes */
  char name[512];
} ocl_ctx;

static void info_string(cl_device d, cl_platform p, char *buf, size_t cap) {
  char dn[256] = "?", pn[256] = "?";
  cl.GetDeviceInfo(d, CL_DEVICE_NAME_, sizeof dn - 1, dn, NULL);
  cl.GetPlatformInfo(p, CL_PLATFORM_NAME_, sizeof pn - 1, pn, NULL);
  snprintf(buf, cap, "%s (%s)", dn, pn);
}

/* $LUMEN_OPENCL_DEVICE: "P:D" (platform and device numbers) or a piece of "device (platform)"
 * (case-insensitive); unset: the first GPU, else the first device. */
static lm_status pick_device(cl_device *out, char *name, size_t cap) {
  cl_platform plats[16];
  cl_uint_ np = 0;
  cl_int_ e = cl.GetPlatformIDs(16, plats, &np);
  if (e == CL_NO_PLATFORM || (e == CL_OK && np == 0))
    return lm_fail(LM_ERR_UNSUPPORTED, "no OpenCL platform: the ICD loader found none (install one, e.g. pocl-opencl-icd)");
  lm_status st = CL(e);
  if (st != LM_OK) return st;
  if (np > 16) np = 16;
  const char *want = getenv("LUMEN_OPENCL_DEVICE");
  int wp = -1, wd = -1;
  if (want && !*want) want = NULL;
  if (want && sscanf(want, "%d:%d", &wp, &wd) != 2) wp = wd = -1;
  cl_device first = NULL, gpu = NULL, chosen = NULL;
  char first_name[512] = "", gpu_name[512] = "";
  lm_sb seen = {0};
  for (cl_uint_ p = 0; p < np && !chosen; p++) {
    cl_device devs[16];
    cl_uint_ nd = 0;
    if (cl.GetDeviceIDs(plats[p], CL_TYPE_ALL, 16, devs, &nd) != CL_OK) continue;
    if (nd > 16) nd = 16;
    for (cl_uint_ d = 0; d < nd && !chosen; d++) {
      char text[512];
      info_string(devs[d], plats[p], text, sizeof text);
      lm_sb_printf(&seen, "%s%u:%u %s", seen.len ? ", " : "", p, d, text);
      cl_bits_ type = 0;
      cl.GetDeviceInfo(devs[d], CL_DEVICE_TYPE_, sizeof type, &type, NULL);
      int match = 0;
      if (want && wp >= 0) match = (int)p == wp && (int)d == wd;
      else if (want) {
        for (const char *s = text; *s && !match; s++) match = !strncasecmp(s, want, strlen(want));
      }
      if (match) {
        chosen = devs[d];
        snprintf(name, cap, "%s", text);
      }
      if (!first) first = devs[d], snprintf(first_name, sizeof first_name, "%s", text);
      if (!gpu && (type & CL_TYPE_GPU)) gpu = devs[d], snprintf(gpu_name, sizeof gpu_name, "%s", text);
    }
  }
  if (!chosen && want) {
    st = lm_fail(LM_ERR_UNSUPPORTED, "no OpenCL device matches LUMEN_OPENCL_DEVICE=%s (devices: %s)", want,
                 seen.s ? seen.s : "none");
    lm_sb_free(&seen);
    return st;
  }
  lm_sb_free(&seen);
  if (!chosen) {
    chosen = gpu ? gpu : first;
    snprintf(name, cap, "%s", gpu ? gpu_name : first_name);
  }
  if (!chosen) return lm_fail(LM_ERR_UNSUPPORTED, "no OpenCL device: the platforms list none");
  *out = chosen;
  return LM_OK;
}

static void ocl_close(void *ctx) {
  ocl_ctx *c = ctx;
  if (!c) return;
  if (c->queue) {
    cl.Finish(c->queue);
    cl.ReleaseCommandQueue(c->queue);
  }
  if (c->ctx) cl.ReleaseContext(c->ctx);
  lm_free(c);
}

static lm_status ocl_open(void **out) {
  pthread_once(&cl_once, cl_load);
  if (!cl_ready) return lm_fail(LM_ERR_UNSUPPORTED, "%s", cl_error);
  ocl_ctx *c = lm_calloc(1, sizeof *c);
  if (!c) return LM_ERR_NOMEM;
  lm_status st = pick_device(&c->dev, c->name, sizeof c->name);
  cl_uint_ align_bits = 0;
  if (st == LM_OK) st = CL(cl.GetDeviceInfo(c->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE_, sizeof c->max_wg, &c->max_wg, NULL));
  if (st == LM_OK) st = CL(cl.GetDeviceInfo(c->dev, CL_DEVICE_LOCAL_MEM_SIZE_, sizeof c->local_mem, &c->local_mem, NULL));
  if (st == LM_OK) st = CL(cl.GetDeviceInfo(c->dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN_, sizeof align_bits, &align_bits, NULL));
  if (st == LM_OK) {
    c->align = align_bits / 8 > 64 ? align_bits / 8 : 64;
    CL_OUT(c->ctx, cl.CreateContext(NULL, 1, &c->dev, NULL, NULL, &e_));
  }
  if (st == LM_OK) CL_OUT(c->queue, cl.CreateCommandQueue(c->ctx, c->dev, 0, &e_));
  if (st != LM_OK) {
    ocl_close(c);
    return st;
  }
  *out = c;
  return LM_OK;
}

static lm_status ocl_alloc(void *ctx, size_t bytes, void **buf) {
  ocl_ctx *c = ctx;
  cl_buf m = NULL;
  lm_status st;
  CL_OUT(m, cl.CreateBuffer(c->ctx, CL_MEM_READ_WRITE_, bytes ? bytes : 4, NULL, &e_));
  *buf = st == LM_OK ? (void *)m : NULL;
  return st;
}

static void ocl_release(void *ctx, void *buf) {
  (void)ctx;
  if (buf) cl.ReleaseMemObject((cl_buf)buf); /* OpenCL keeps it alive until pending commands finish */
}

static lm_status ocl_write(void *ctx, void *buf, const void *src, size_t bytes) {
  ocl_ctx *c = ctx;
  return CL(cl.EnqueueWriteBuffer(c->queue, (cl_buf)buf, 1, 0, bytes, src, 0, NULL, NULL));
}

static lm_status ocl_read(void *ctx, const void *buf, void *dst, size_t bytes) {
  ocl_ctx *c = ctx;
  return CL(cl.EnqueueReadBuffer(c->queue, (cl_buf)(uintptr_t)buf, 1, 0, bytes, dst, 0, NULL, NULL));
}

static lm_status ocl_zero(void *ctx, void *buf, size_t bytes) {
  ocl_ctx *c = ctx;
  const unsigned char zero = 0;
  return CL(cl.EnqueueFillBuffer(c->queue, (cl_buf)buf, &zero, 1, 0, bytes, 0, NULL, NULL));
}

static lm_status ocl_sync(void *ctx) {
  ocl_ctx *c = ctx;
  return CL(cl.Finish(c->queue));
}

/* Builds source on the context's device; LM_ERR_COMPILE with the build log and the source. */
static lm_status build(ocl_ctx *c, const char *src, const char *what, cl_prog *out) {
  lm_status st;
  cl_prog prog = NULL;
  *out = NULL;
  CL_OUT(prog, cl.CreateProgramWithSource(c->ctx, 1, &src, NULL, &e_));
  if (st != LM_OK) return st;
  cl_int_ e = cl.BuildProgram(prog, 1, &c->dev, "-cl-fp32-correctly-rounded-divide-sqrt", NULL, NULL);
  if (e == CL_OK) {
    *out = prog;
    return LM_OK;
  }
  size_t n = 0;
  char *log = NULL;
  if (cl.GetProgramBuildInfo(prog, c->dev, CL_PROGRAM_BUILD_LOG_, 0, NULL, &n) == CL_OK && (log = lm_calloc(n + 1, 1)))
    cl.GetProgramBuildInfo(prog, c->dev, CL_PROGRAM_BUILD_LOG_, n, log, NULL);
  char path[4200];
  lm_keep_compile_failure("opencl", what, c->name, log, src, path, sizeof path);
  st = lm_fail(LM_ERR_COMPILE,
               "OpenCL could not build %s on %s (%s): whole log and source in %s\n---- build log ----\n%s\n"
               "---- source ----\n%s",
               what, c->name, cl_err_name(e), path, log ? log : "(none)", src);
  lm_free(log);
  cl.ReleaseProgram(prog);
  return st;
}

lm_status lm_opencl_build_check(const char *source, const char *what, char *describe, size_t cap) {
  void *ctx = NULL;
  lm_status st = ocl_open(&ctx);
  if (st != LM_OK) return st;
  ocl_ctx *c = ctx;
  if (describe && cap) snprintf(describe, cap, "OpenCL on %s", c->name);
  cl_prog prog = NULL;
  st = build(c, source, what, &prog);
  if (prog) cl.ReleaseProgram(prog);
  ocl_close(c);
  return st;
}

/* ---------------------------------------------------------------- programs */

enum {
  LOCAL = 64, /* work-items per work-group */
  NSLOT = 4,  /* host copies of S and R in flight */
};

typedef struct ocl_exe {
  lm_graph_t *g; /* canonical graph (owned) */
  lm_plan *plan;
  int fused;
  lm_scan_info scan;
  uint8_t *per_step;
  cl_prog prog;
  cl_kern *kernels;
  size_t *local; /* per kernel: work-group size */
  /* layout under layout_syms: temps as sub-buffers of one arena, and one-step staging buffers */
  lm_layout layout;
  int64_t *layout_syms;
  int have_layout;
  size_t *offset;    /* per plan buffer: arena offset (aligned for sub-buffers) */
  cl_buf arena;
  size_t arena_cap;
  cl_buf *temp;      /* per plan buffer: the temp's sub-buffer */
  cl_buf *stage;     /* per plan buffer: one-step copy of a per-step input or an output */
  cl_buf *bufs;      /* per plan buffer: what kernels get this step */
  cl_buf dummy;      /* stands in for an empty buffer */
  /* S, then R per step, each at an aligned offset of one buffer */
  cl_buf params;
  size_t params_cap, params_steps;
  cl_buf s_sub, *r_sub;
  unsigned char *host[NSLOT];
  cl_ev host_ev[NSLOT];
  size_t host_cap;
  int slot;
} ocl_exe;

static void release_layout_bufs(ocl_exe *x) {
  for (size_t i = 0; i < x->plan->nbufs; i++) {
    if (x->temp[i]) cl.ReleaseMemObject(x->temp[i]);
    if (x->stage[i]) cl.ReleaseMemObject(x->stage[i]);
    x->temp[i] = x->stage[i] = NULL;
  }
}

static void release_params(ocl_exe *x) {
  if (x->s_sub) cl.ReleaseMemObject(x->s_sub);
  for (size_t s = 0; s < x->params_steps; s++)
    if (x->r_sub[s]) cl.ReleaseMemObject(x->r_sub[s]);
  if (x->params) cl.ReleaseMemObject(x->params);
  lm_free(x->r_sub);
  x->s_sub = x->params = NULL;
  x->r_sub = NULL;
  x->params_cap = x->params_steps = 0;
}

static void ocl_unprepare(void *ctx, void *p) {
  ocl_ctx *c = ctx;
  ocl_exe *x = p;
  if (!x) return;
  cl.Finish(c->queue);
  if (x->plan && x->temp && x->stage) release_layout_bufs(x);
  release_params(x);
  for (int i = 0; i < NSLOT; i++) {
    if (x->host_ev[i]) cl.ReleaseEvent(x->host_ev[i]);
    lm_free(x->host[i]);
  }
  if (x->arena) cl.ReleaseMemObject(x->arena);
  if (x->dummy) cl.ReleaseMemObject(x->dummy);
  for (size_t i = 0; x->kernels && i < x->plan->nkernels; i++)
    if (x->kernels[i]) cl.ReleaseKernel(x->kernels[i]);
  if (x->prog) cl.ReleaseProgram(x->prog);
  lm_plan_free(x->plan);
  lm_graph_free(x->g);
  lm_layout_free(&x->layout);
  lm_free(x->layout_syms);
  lm_free(x->kernels);
  lm_free(x->local);
  lm_free(x->offset);
  lm_free(x->temp);
  lm_free(x->stage);
  lm_free(x->bufs);
  lm_free(x->per_step);
  lm_free(x);
}

/* This device for the search, with the work-group schedules prepare applies. */
static void ocl_search_device(void *ctx, lm_search_device *out, lm_gpu_options *go) {
  ocl_ctx *c = ctx;
  lm_gpu_options_default(go, (int64_t)c->local_mem);
  if (c->max_wg < 256) go->tile_matmuls = 0;
  if (c->max_wg < (size_t)go->scan_threads) go->stage_shared_bytes = 0;
  *out = (lm_search_device){.ops = &lm_backend_opencl, .ctx = c, .name = c->name,
                            .gpu = lm_gpu_schedules_enabled() ? go : NULL};
}

/* Work-group size of kernel k built as kr: its work-group schedule's threads (an error when the
 * device allows fewer for it), else LOCAL within what the device allows. */
static lm_status local_size(ocl_ctx *c, cl_kern kr, const lm_kernel *k, const char *name, size_t *out) {
  size_t wg = 0;
  lm_status st = CL(cl.GetKernelWorkGroupInfo(kr, c->dev, CL_KERNEL_WORK_GROUP_SIZE_, sizeof wg, &wg, NULL));
  if (st != LM_OK) return st;
  size_t local = LOCAL, group = (size_t)k->group;
  if (group) { /* a work-group schedule: exactly its threads, or it cannot run */
    if (wg && wg < group)
      return lm_fail(LM_ERR_COMPILE, "opencl: kernel %s needs work-groups of %zu threads; the device allows %zu for it",
                     name, group, wg);
    local = group;
  } else {
    if (wg && wg < local) local = wg;
    if (c->max_wg && c->max_wg < local) local = c->max_wg;
  }
  *out = local ? local : 1;
  return LM_OK;
}

static lm_status ocl_prepare(void *ctx, lm_graph_t *g, const lm_scan_info *scan, void **out) {
  ocl_ctx *c = ctx;
  ocl_exe *x = lm_calloc(1, sizeof *x);
  if (!x) return LM_ERR_NOMEM;
  char *src = NULL;
  lm_status st = LM_ERR_NOMEM;
  if (scan->active) {
    x->scan = *scan;
    if (!(x->per_step = lm_calloc(g->ninputs + 1, 1))) goto fail;
    memcpy(x->per_step, scan->per_step, g->ninputs);
    x->scan.per_step = x->per_step;
  }
  lm_compiled comp;
  lm_gpu_options go;
  lm_search_device sd;
  ocl_search_device(c, &sd, &go);
  /* a search ($LUMEN_SEARCH_BUDGET > 0) times its candidates on this device, each also under
   * the work-group schedules; what it decides stays as measured */
  lm_search_options so;
  lm_search_options_init(&so);
  lm_compile_options co = {.search = &so, .device = &sd, .gpu = sd.gpu};
  if ((st = lm_compile_ex(g, scan, &co, &comp)) != LM_OK) goto fail;
  x->g = comp.g;
  x->plan = comp.plan;
  x->fused = comp.fused;
  st = LM_ERR_NOMEM;
  size_t nb = x->plan->nbufs + 1, nk = x->plan->nkernels + 1;
  x->kernels = lm_calloc(nk, sizeof *x->kernels);
  x->local = lm_calloc(nk, sizeof *x->local);
  x->offset = lm_calloc(nb, sizeof *x->offset);
  x->temp = lm_calloc(nb, sizeof *x->temp);
  x->stage = lm_calloc(nb, sizeof *x->stage);
  x->bufs = lm_calloc(nb, sizeof *x->bufs);
  x->layout_syms = lm_calloc(x->g->x.nsyms + 1, sizeof *x->layout_syms);
  if (!x->kernels || !x->local || !x->offset || !x->temp || !x->stage || !x->bufs ||
      !x->layout_syms)
    goto fail;
  if (!(src = lm_render_plan(x->plan, LM_DIALECT_OPENCL))) goto fail;
  lm_dump_source("opencl", "cl", src, x->plan);
  char what[64];
  snprintf(what, sizeof what, "lumen-%016llx.cl", (unsigned long long)lm_hash_bytes(src, strlen(src), 0));
  if ((st = build(c, src, what, &x->prog)) != LM_OK) goto fail;
  for (size_t i = 0; i < x->plan->nkernels; i++) {
    char name[48];
    lm_render_entry_name(&x->plan->kernels[i], name, sizeof name);
    CL_OUT(x->kernels[i], cl.CreateKernel(x->prog, name, &e_));
    if (st != LM_OK || (st = local_size(c, x->kernels[i], &x->plan->kernels[i], name, &x->local[i])) != LM_OK) goto fail;
  }
  CL_OUT(x->dummy, cl.CreateBuffer(c->ctx, CL_MEM_READ_WRITE_, 64, NULL, &e_));
  if (st != LM_OK) goto fail;
  lm_free(src);
  *out = x;
  return LM_OK;
fail:
  lm_free(src);
  ocl_unprepare(ctx, x);
  return st;
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* Layout under these symbols: temps placed by the memory planner with the device's alignment,
 * as sub-buffers of one arena; one-step buffers for scans that run step by step. */
static lm_status update_layout(ocl_ctx *c, ocl_exe *x, const int64_t *syms, int stepwise) {
  size_t ns = x->g->x.nsyms, nb = x->plan->nbufs;
  if (x->have_layout && lm_layout_holds(&x->layout, x->layout_syms, syms, ns)) return LM_OK;
  lm_status st = CL(cl.Finish(c->queue));
  if (st != LM_OK) return st;
  release_layout_bufs(x);
  lm_layout_free(&x->layout);
  x->have_layout = 0;
  if ((st = lm_layout_compute(x->plan, syms, &x->layout)) != LM_OK) return st;
  size_t *bytes = lm_calloc(nb + 1, sizeof *bytes);
  int *first = lm_calloc(nb + 1, sizeof *first), *last = lm_calloc(nb + 1, sizeof *last);
  size_t total = 0;
  st = LM_ERR_NOMEM;
  if (bytes && first && last) {
    for (size_t i = 0; i < nb; i++) {
      const lm_pbuf *b = &x->plan->bufs[i];
      bytes[i] = x->layout.count[i] * sizeof(float);
      first[i] = b->kind == LM_BUF_TEMP ? b->first : -1;
      last[i] = b->last;
    }
    st = lm_memplan(nb, bytes, first, last, c->align, x->offset, &total);
  }
  lm_free(first);
  lm_free(last);
  if (st == LM_OK && (total > x->arena_cap || !x->arena)) {
    if (x->arena) cl.ReleaseMemObject(x->arena);
    x->arena = NULL;
    x->arena_cap = 0;
    size_t cap = total ? total : 64;
    CL_OUT(x->arena, cl.CreateBuffer(c->ctx, CL_MEM_READ_WRITE_, cap, NULL, &e_));
    if (st == LM_OK) x->arena_cap = cap;
  }
  for (size_t i = 0; i < nb && st == LM_OK; i++) {
    const lm_pbuf *b = &x->plan->bufs[i];
    if (b->kind == LM_BUF_TEMP && bytes[i] && b->first >= 0) {
      cl_region r = {x->offset[i], bytes[i]};
      CL_OUT(x->temp[i], cl.CreateSubBuffer(x->arena, CL_MEM_READ_WRITE_, CL_BUFFER_CREATE_TYPE_REGION_, &r, &e_));
    } else if (stepwise && bytes[i] &&
               ((b->kind == LM_BUF_INPUT && x->per_step[b->index]) || b->kind == LM_BUF_OUTPUT)) {
      CL_OUT(x->stage[i], cl.CreateBuffer(c->ctx, CL_MEM_READ_WRITE_, bytes[i], NULL, &e_));
    }
  }
  lm_free(bytes);
  if (st != LM_OK) {
    release_layout_bufs(x);
    return st;
  }
  if (ns) memcpy(x->layout_syms, syms, ns * sizeof *syms);
  x->have_layout = 1;
  return LM_OK;
}

/* Room for S and `steps` R's: sub-buffers at aligned offsets of one buffer, and host slots. */
static lm_status reserve_params(ocl_ctx *c, ocl_exe *x, size_t steps, size_t *bytes_out) {
  size_t a = c->align, s_bytes = round_up((x->g->x.nsyms ? x->g->x.nsyms : 1) * sizeof(int64_t), a);
  size_t bytes = s_bytes + steps * a;
  *bytes_out = bytes;
  lm_status st = LM_OK;
  if (bytes > x->host_cap) {
    for (int i = 0; i < NSLOT; i++) {
      if (x->host_ev[i]) {
        cl.WaitForEvents(1, &x->host_ev[i]);
        cl.ReleaseEvent(x->host_ev[i]);
        x->host_ev[i] = NULL;
      }
      lm_free(x->host[i]);
      if (!(x->host[i] = lm_calloc(1, bytes))) {
        x->host_cap = 0;
        return LM_ERR_NOMEM;
      }
    }
    x->host_cap = bytes;
  }
  if (steps <= x->params_steps && x->params) return LM_OK;
  if ((st = CL(cl.Finish(c->queue))) != LM_OK) return st;
  release_params(x);
  if (!(x->r_sub = lm_calloc(steps, sizeof *x->r_sub))) return LM_ERR_NOMEM;
  CL_OUT(x->params, cl.CreateBuffer(c->ctx, CL_MEM_READ_WRITE_, bytes, NULL, &e_));
  if (st != LM_OK) return st;
  x->params_cap = bytes;
  x->params_steps = steps;
  cl_region r = {0, s_bytes};
  CL_OUT(x->s_sub, cl.CreateSubBuffer(x->params, CL_MEM_READ_WRITE_, CL_BUFFER_CREATE_TYPE_REGION_, &r, &e_));
  for (size_t s = 0; s < steps && st == LM_OK; s++) {
    r = (cl_region){s_bytes + s * a, 2 * sizeof(uint64_t)};
    CL_OUT(x->r_sub[s], cl.CreateSubBuffer(x->params, CL_MEM_READ_WRITE_, CL_BUFFER_CREATE_TYPE_REGION_, &r, &e_));
  }
  return st;
}

static lm_status launch(ocl_ctx *c, ocl_exe *x, size_t k, cl_buf R) {
  const lm_kernel *kn = &x->plan->kernels[k];
  cl_kern kr = x->kernels[k];
  int64_t total = x->layout.work[k]; /* cl_long */
  if (total <= 0) return LM_OK;
  lm_status st = LM_OK;
  cl_uint_ a = 0;
  for (size_t j = 0; j < kn->nbufs && st == LM_OK; j++, a++) {
    cl_buf m = x->bufs[kn->bufs[j]] ? x->bufs[kn->bufs[j]] : x->dummy;
    st = CL(cl.SetKernelArg(kr, a, sizeof m, &m));
  }
  if (st == LM_OK) st = CL(cl.SetKernelArg(kr, a++, sizeof x->s_sub, &x->s_sub));
  if (st == LM_OK) st = CL(cl.SetKernelArg(kr, a++, sizeof R, &R));
  if (st == LM_OK) st = CL(cl.SetKernelArg(kr, a++, sizeof total, &total));
  size_t local = x->local[k], global = round_up((size_t)total, local);
  if (st == LM_OK) st = CL(cl.EnqueueNDRangeKernel(c->queue, kr, 1, NULL, &global, &local, 0, NULL, NULL));
  return st;
}

static lm_status ocl_run(void *ctx, void *p, const lm_run_args *args) {
  ocl_ctx *c = ctx;
  ocl_exe *x = p;
  const lm_plan *plan = x->plan;
  int64_t T = x->scan.active ? args->syms[x->scan.sym_T] : 1;
  int stepwise = x->scan.active && !x->fused;
  int64_t steps = stepwise ? T : 1;
  lm_status st = update_layout(c, x, args->syms, stepwise);
  if (st != LM_OK || steps <= 0) return st;
  size_t bytes = 0;
  if ((st = reserve_params(c, x, (size_t)steps, &bytes)) != LM_OK) return st;

  /* S and every step's R, uploaded at once from a host slot whose last upload has completed */
  int slot = x->slot;
  x->slot = (x->slot + 1) % NSLOT;
  if (x->host_ev[slot]) {
    st = CL(cl.WaitForEvents(1, &x->host_ev[slot]));
    cl.ReleaseEvent(x->host_ev[slot]);
    x->host_ev[slot] = NULL;
    if (st != LM_OK) return st;
  }
  unsigned char *h = x->host[slot];
  size_t ns = x->g->x.nsyms, s_bytes = round_up((ns ? ns : 1) * sizeof(int64_t), c->align);
  memset(h, 0, bytes);
  if (ns) memcpy(h, args->syms, ns * sizeof *args->syms);
  for (int64_t s = 0; s < steps; s++) {
    int64_t t = x->scan.reverse ? steps - 1 - s : s;
    uint64_t run = x->fused ? args->run * (uint64_t)T : stepwise ? args->run * (uint64_t)T + (uint64_t)t : args->run;
    uint64_t r[2] = {args->seed, run};
    memcpy(h + s_bytes + (size_t)s * c->align, r, sizeof r);
  }
  if ((st = CL(cl.EnqueueWriteBuffer(c->queue, x->params, 0, 0, bytes, h, 0, NULL, &x->host_ev[slot]))) != LM_OK) {
    x->host_ev[slot] = NULL;
    return st;
  }

  for (int64_t s = 0; s < steps && st == LM_OK; s++) {
    int64_t t = x->scan.reverse ? steps - 1 - s : s;
    /* this step's buffers; per-step inputs copied in from slice t */
    for (size_t i = 0; i < plan->nbufs && st == LM_OK; i++) {
      const lm_pbuf *b = &plan->bufs[i];
      size_t n = x->layout.count[i] * sizeof(float);
      if (b->kind == LM_BUF_TEMP) x->bufs[i] = x->temp[i];
      else if (!stepwise || !x->stage[i])
        x->bufs[i] = (cl_buf)(b->kind == LM_BUF_INPUT ? args->inputs[b->index] : args->outputs[b->index]);
      else {
        x->bufs[i] = x->stage[i];
        if (b->kind == LM_BUF_INPUT)
          st = CL(cl.EnqueueCopyBuffer(c->queue, (cl_buf)args->inputs[b->index], x->stage[i], (size_t)t * n, 0, n, 0,
                                       NULL, NULL));
      }
    }
    for (size_t k = 0; k < plan->nkernels && st == LM_OK; k++) st = launch(c, x, k, x->r_sub[s]);
    for (size_t i = 0; i < plan->ncopies && st == LM_OK; i++) {
      const lm_copy *cp = &plan->copies[i];
      size_t n = x->layout.count[cp->dst] * sizeof(float);
      if (n) st = CL(cl.EnqueueCopyBuffer(c->queue, x->bufs[cp->src], x->bufs[cp->dst], 0, 0, n, 0, NULL, NULL));
    }
    for (size_t i = 0; stepwise && i < plan->nbufs && st == LM_OK; i++) {
      const lm_pbuf *b = &plan->bufs[i];
      size_t n = x->layout.count[i] * sizeof(float);
      if (b->kind == LM_BUF_OUTPUT && x->stage[i])
        st = CL(cl.EnqueueCopyBuffer(c->queue, x->stage[i], (cl_buf)args->outputs[b->index], 0, (size_t)t * n, n, 0,
                                     NULL, NULL));
    }
  }
  return st;
}

/* ---------------------------------------------------------------- kernel by kernel (search) */

typedef struct ocl_entry {
  cl_kern kern;
  size_t local;
} ocl_entry;

static lm_status ocl_module_build(void *ctx, const char *src, void **module) {
  ocl_ctx *c = ctx;
  char what[64];
  snprintf(what, sizeof what, "lumen-search-%016llx.cl", (unsigned long long)lm_hash_bytes(src, strlen(src), 0));
  cl_prog prog = NULL;
  lm_status st = build(c, src, what, &prog);
  *module = st == LM_OK ? (void *)prog : NULL;
  return st;
}

static void ocl_module_free(void *ctx, void *module) {
  (void)ctx;
  if (module) cl.ReleaseProgram((cl_prog)module);
}

static lm_status ocl_module_entry(void *ctx, void *module, const char *name, const lm_kernel *k, void **entry) {
  ocl_ctx *c = ctx;
  ocl_entry *e = lm_calloc(1, sizeof *e);
  if (!e) return LM_ERR_NOMEM;
  lm_status st;
  CL_OUT(e->kern, cl.CreateKernel((cl_prog)module, name, &e_));
  if (st == LM_OK) st = local_size(c, e->kern, k, name, &e->local);
  if (st != LM_OK) {
    if (e->kern) cl.ReleaseKernel(e->kern);
    lm_free(e);
    e = NULL;
  }
  *entry = e;
  return st;
}

static void ocl_entry_free(void *ctx, void *entry) {
  (void)ctx;
  ocl_entry *e = entry;
  if (!e) return;
  if (e->kern) cl.ReleaseKernel(e->kern);
  lm_free(e);
}

static lm_status ocl_launch_kernel(void *ctx, void *entry, const lm_kernel *k, void *const *bufs, void *S, void *R,
                                   int64_t work) {
  ocl_ctx *c = ctx;
  ocl_entry *e = entry;
  if (work <= 0) return LM_OK;
  lm_status st = LM_OK;
  cl_uint_ a = 0;
  for (size_t j = 0; j < k->nbufs && st == LM_OK; j++, a++) {
    cl_buf m = (cl_buf)bufs[k->bufs[j]];
    st = CL(cl.SetKernelArg(e->kern, a, sizeof m, &m));
  }
  cl_buf s = (cl_buf)S, r = (cl_buf)R;
  int64_t total = work; /* cl_long */
  if (st == LM_OK) st = CL(cl.SetKernelArg(e->kern, a++, sizeof s, &s));
  if (st == LM_OK) st = CL(cl.SetKernelArg(e->kern, a++, sizeof r, &r));
  if (st == LM_OK) st = CL(cl.SetKernelArg(e->kern, a++, sizeof total, &total));
  size_t global = round_up((size_t)work, e->local);
  if (st == LM_OK) st = CL(cl.EnqueueNDRangeKernel(c->queue, e->kern, 1, NULL, &global, &e->local, 0, NULL, NULL));
  return st;
}

static lm_status ocl_stats(void *ctx, void *p, const int64_t *syms, lm_program_stats *out) {
  (void)ctx;
  ocl_exe *x = p;
  return lm_plan_stats(x->plan, &x->scan, x->fused, syms, out);
}

const lm_backend_ops lm_backend_opencl = {
    .name = "opencl",
    .description = "OpenCL C kernels built by the OpenCL driver (PoCL on a CPU), 1-D work-groups of 64",
    .open = ocl_open,
    .close = ocl_close,
    .alloc = ocl_alloc,
    .release = ocl_release,
    .write = ocl_write,
    .read = ocl_read,
    .fill_zero = ocl_zero,
    .prepare = ocl_prepare,
    .unprepare = ocl_unprepare,
    .run = ocl_run,
    .sync = ocl_sync,
    .stats = ocl_stats,
    .kernel_dialect = LM_DIALECT_OPENCL,
    .search_device = ocl_search_device,
    .module_build = ocl_module_build,
    .module_free = ocl_module_free,
    .module_entry = ocl_module_entry,
    .entry_free = ocl_entry_free,
    .launch_kernel = ocl_launch_kernel,
};
