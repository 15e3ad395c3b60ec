/* compiler/backends/cuda.c — the cuda backend: the driver API (libcuda.so.1, dlopened; its types
 * and entry points are declared here, so building needs no CUDA header), NVRTC to CUBIN for the
 * device's own sm_XX (compiler/nvrtc.h), device memory from the memory plan (one arena for the
 * temporaries; inputs and outputs are the runtime's own allocations), one non-blocking stream,
 * and a CUDA Graph of the whole run captured after the first run and replayed.
 *
 * Kernel arguments follow render.h: B (device array of buffer pointers), S (symbol values),
 * R (seed, run counter), total. They live in one device parameter block: S, then per step
 * R[2] and B[nbufs]. A scan that runs step by step (not fused) gets one (R, B) per step with
 * its buffers offset to slice t, so the whole scan is one upload and one graph. Only the block's
 * contents change between runs: the graph is re-captured when a symbol value or a buffer address
 * changes, never for a new run counter. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "compile.h"
#include "gpu.h"
#include "memplan.h"
#include "nvrtc.h"
#include "render.h"
#include "search/search.h"

/* ---------------------------------------------------------------- the driver API, declared */

typedef int cu_result; /* CUresult: 0 = CUDA_SUCCESS */
typedef int cu_device;
typedef unsigned long long cu_ptr; /* CUdeviceptr */
typedef struct cu_ctx_st *cu_context;
typedef struct cu_mod_st *cu_module;
typedef struct cu_func_st *cu_function;
typedef struct cu_stream_st *cu_stream;
typedef struct cu_event_st *cu_event;
typedef struct cu_graph_st *cu_graph;
typedef struct cu_graph_exec_st *cu_graph_exec;

enum {
  CU_ATTR_CC_MAJOR = 75, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  CU_ATTR_CC_MINOR = 76,
  CU_ERR_NO_DEVICE = 100,
  CU_ERR_STUB = 34,
  CU_STREAM_NONBLOCKING = 1,
  CU_EVENT_NO_TIMING = 2,
  CU_CAPTURE_THREAD_LOCAL = 1,
};

#ifdef LUMEN_HAVE_CUDA /* when the header is at hand, check the declarations against it */
#include <cuda.h>
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(CU_ATTR_CC_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), "cuda.h");
_Static_assert(SAME(CU_ATTR_CC_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), "cuda.h");
_Static_assert(SAME(CU_ERR_NO_DEVICE, CUDA_ERROR_NO_DEVICE) && SAME(CU_ERR_STUB, CUDA_ERROR_STUB_LIBRARY), "cuda.h");
_Static_assert(SAME(CU_STREAM_NONBLOCKING, CU_STREAM_NON_BLOCKING) && SAME(CU_EVENT_NO_TIMING, CU_EVENT_DISABLE_TIMING), "cuda.h");
_Static_assert(SAME(CU_CAPTURE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuda.h");
#undef SAME
_Static_assert(sizeof(cu_ptr) == sizeof(CUdeviceptr) && sizeof(cu_result) == sizeof(CUresult), "cuda.h");
#endif

typedef struct cu_api {
  cu_result (*Init)(unsigned);
  cu_result (*DriverGetVersion)(int *);
  cu_result (*GetErrorName)(cu_result, const char **);
  cu_result (*GetErrorString)(cu_result, const char **);
  cu_result (*DeviceGetCount)(int *);
  cu_result (*DeviceGet)(cu_device *, int);
  cu_result (*DeviceGetName)(char *, int, cu_device);
  cu_result (*DeviceGetPCIBusId)(char *, int, cu_device);
  cu_result (*DeviceGetAttribute)(int *, int, cu_device);
  cu_result (*PrimaryCtxRetain)(cu_context *, cu_device);
  cu_result (*PrimaryCtxRelease)(cu_device);
  cu_result (*CtxSetCurrent)(cu_context);
  cu_result (*StreamCreate)(cu_stream *, unsigned);
  cu_result (*StreamDestroy)(cu_stream);
  cu_result (*StreamSynchronize)(cu_stream);
  cu_result (*MemAlloc)(cu_ptr *, size_t);
  cu_result (*MemFree)(cu_ptr);
  cu_result (*MemHostAlloc)(void **, size_t, unsigned);
  cu_result (*MemFreeHost)(void *);
  cu_result (*MemcpyHtoDAsync)(cu_ptr, const void *, size_t, cu_stream);
  cu_result (*MemcpyDtoHAsync)(void *, cu_ptr, size_t, cu_stream);
  cu_result (*MemcpyDtoDAsync)(cu_ptr, cu_ptr, size_t, cu_stream);
  cu_result (*MemsetD8Async)(cu_ptr, unsigned char, size_t, cu_stream);
  cu_result (*ModuleLoadData)(cu_module *, const void *);
  cu_result (*ModuleUnload)(cu_module);
  cu_result (*ModuleGetFunction)(cu_function *, cu_module, const char *);
  cu_result (*LaunchKernel)(cu_function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            cu_stream, void **, void **);
  cu_result (*EventCreate)(cu_event *, unsigned);
  cu_result (*EventDestroy)(cu_event);
  cu_result (*EventRecord)(cu_event, cu_stream);
  cu_result (*EventSynchronize)(cu_event);
  cu_result (*EventElapsedTime)(float *, cu_event, cu_event);
  cu_result (*StreamBeginCapture)(cu_stream, int);
  cu_result (*StreamEndCapture)(cu_stream, cu_graph *);
  cu_result (*GraphInstantiate)(cu_graph_exec *, cu_graph, unsigned long long);
  cu_result (*GraphLaunch)(cu_graph_exec, cu_stream);
  cu_result (*GraphExecDestroy)(cu_graph_exec);
  cu_result (*GraphDestroy)(cu_graph);
} cu_api;

/* Versioned names: what cuda.h's macros map the plain names to (CUDA 12 and 13 drivers). */
static const struct {
  size_t offset;
  const char *name, *fallback;
} cu_symbols[] = {
#define SYM(field, name, fallback) {offsetof(cu_api, field), name, fallback}
    SYM(Init, "cuInit", NULL),
    SYM(DriverGetVersion, "cuDriverGetVersion", NULL),
    SYM(GetErrorName, "cuGetErrorName", NULL),
    SYM(GetErrorString, "cuGetErrorString", NULL),
    SYM(DeviceGetCount, "cuDeviceGetCount", NULL),
    SYM(DeviceGet, "cuDeviceGet", NULL),
    SYM(DeviceGetName, "cuDeviceGetName", NULL),
    SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", NULL),
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute", NULL),
    SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL),
    SYM(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", NULL),
    SYM(CtxSetCurrent, "cuCtxSetCurrent", NULL),
    SYM(StreamCreate, "cuStreamCreate", NULL),
    SYM(StreamDestroy, "cuStreamDestroy_v2", NULL),
    SYM(StreamSynchronize, "cuStreamSynchronize", NULL),
    SYM(MemAlloc, "cuMemAlloc_v2", NULL),
    SYM(MemFree, "cuMemFree_v2", NULL),
    SYM(MemHostAlloc, "cuMemHostAlloc", NULL),
    SYM(MemFreeHost, "cuMemFreeHost", NULL),
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL),
    SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL),
    SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL),
    SYM(MemsetD8Async, "cuMemsetD8Async", NULL),
    SYM(ModuleLoadData, "cuModuleLoadData", NULL),
    SYM(ModuleUnload, "cuModuleUnload", NULL),
    SYM(ModuleGetFunction, "cuModuleGetFunction", NULL),
    SYM(LaunchKernel, "cuLaunchKernel", NULL),
    SYM(EventCreate, "cuEventCreate", NULL),
    SYM(EventDestroy, "cuEventDestroy_v2", NULL),
    SYM(EventRecord, "cuEventRecord", NULL),
    SYM(EventSynchronize, "cuEventSynchronize", NULL),
    SYM(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    SYM(StreamBeginCapture, "cuStreamBeginCapture_v2", NULL),
    SYM(StreamEndCapture, "cuStreamEndCapture", NULL),
    SYM(GraphInstantiate, "cuGraphInstantiateWithFlags", NULL),
    SYM(GraphLaunch, "cuGraphLaunch", NULL),
    SYM(GraphExecDestroy, "cuGraphExecDestroy", NULL),
    SYM(GraphDestroy, "cuGraphDestroy", NULL),
#undef SYM
};

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static cu_api cu;
static int cu_ready;
static char cu_error[1024];

/* The one checking funnel for driver calls: keeps the call and the driver's error string. */
static lm_status cu_check(cu_result r, const char *call, int line) {
  if (r == 0) return LM_OK;
  const char *name = NULL, *text = NULL;
  if (cu.GetErrorName) cu.GetErrorName(r, &name);
  if (cu.GetErrorString) cu.GetErrorString(r, &text);
  return lm_fail(LM_ERR_BACKEND, "cuda: %s failed: %s (%s) [cuda.c:%d]", call, name ? name : "unknown error",
                 text ? text : "no description", line);
}
#define CU(call) cu_check((call), #call, __LINE__)

/* Loads libcuda.so.1 and initialises the driver, once per process. The library is never
 * unloaded (a driver does not survive dlclose well, and its allocations stay reachable). */
static void cu_load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(cu_error, sizeof cu_error, "no CUDA driver: libcuda.so.1 not found (%s)", e ? e : "dlopen failed");
    return;
  }
  for (size_t i = 0; i < LM_COUNTOF(cu_symbols); i++) {
    void *p = dlsym(lib, cu_symbols[i].name);
    if (!p && cu_symbols[i].fallback) p = dlsym(lib, cu_symbols[i].fallback);
    if (!p) {
      snprintf(cu_error, sizeof cu_error, "no usable CUDA driver: libcuda.so.1 lacks %s (driver too old?)",
               cu_symbols[i].name);
      return;
    }
    memcpy((char *)&cu + cu_symbols[i].offset, &p, sizeof p); /* object -> function pointer, as dlsym requires */
  }
  cu_result r = cu.Init(0);
  if (r != 0) {
    const char *name = NULL, *text = NULL;
    cu.GetErrorName(r, &name);
    cu.GetErrorString(r, &text);
    snprintf(cu_error, sizeof cu_error, "no CUDA device: cuInit: %s (%s)", name ? name : "error",
             r == CU_ERR_STUB ? "libcuda.so.1 is the toolkit's stub, not a driver" : text ? text : "no description");
    return;
  }
  int n = 0;
  if (cu.DeviceGetCount(&n) != 0 || n == 0) {
    snprintf(cu_error, sizeof cu_error, "no CUDA device: the driver sees none");
    return;
  }
  cu_ready = 1;
}

/* ---------------------------------------------------------------- device */

typedef struct cuda_ctx {
  cu_device dev;
  cu_context ctx;
  cu_stream stream;
  int sm;        /* compute capability as major*10 + minor */
  char arch[16]; /* "sm_90" */
  char name[256];
  char pci[64]; /* "0000:17:00.0": which device, for ranks that must not share one */
  lm_nvrtc *nv;
  /* kernel by kernel (the search): the device array of buffer pointers and its host copy */
  cu_ptr kb;
  uint64_t *kb_host;
  size_t kb_cap;
} cuda_ctx;

static lm_status cur(const cuda_ctx *c) { return CU(cu.CtxSetCurrent(c->ctx)); }

static void cuda_close(void *ctx) {
  cuda_ctx *c = ctx;
  if (!c) return;
  if (c->ctx) {
    cu.CtxSetCurrent(c->ctx);
    if (c->stream) {
      cu.StreamSynchronize(c->stream);
      cu.StreamDestroy(c->stream);
    }
    if (c->kb) cu.MemFree(c->kb);
    cu.PrimaryCtxRelease(c->dev);
  }
  lm_nvrtc_close(c->nv);
  lm_free(c->kb_host);
  lm_free(c);
}

static lm_status cuda_open(void **out) {
  pthread_once(&cu_once, cu_load);
  if (!cu_ready) return lm_fail(LM_ERR_UNSUPPORTED, "%s", cu_error);
  cuda_ctx *c = lm_calloc(1, sizeof *c);
  if (!c) return LM_ERR_NOMEM;
  int ordinal = 0, count = 0, major = 0, minor = 0;
  const char *env = getenv("LUMEN_CUDA_DEVICE");
  if (env && *env) ordinal = atoi(env);
  lm_status st = CU(cu.DeviceGetCount(&count));
  if (st == LM_OK && (ordinal < 0 || ordinal >= count))
    st = lm_fail(LM_ERR_UNSUPPORTED, "no CUDA device: LUMEN_CUDA_DEVICE=%s but the driver sees %d device(s)", env, count);
  if (st == LM_OK) st = CU(cu.DeviceGet(&c->dev, ordinal));
  if (st == LM_OK) st = CU(cu.DeviceGetName(c->name, (int)sizeof c->name - 1, c->dev));
  if (st == LM_OK) st = CU(cu.DeviceGetPCIBusId(c->pci, (int)sizeof c->pci - 1, c->dev));
  if (st == LM_OK) st = CU(cu.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, c->dev));
  if (st == LM_OK) st = CU(cu.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, c->dev));
  if (st == LM_OK) {
    c->sm = major * 10 + minor;
    snprintf(c->arch, sizeof c->arch, "sm_%d", c->sm);
    st = lm_nvrtc_open(&c->nv);
  }
  if (st == LM_OK && !lm_nvrtc_supports(c->nv, c->sm))
    st = lm_fail(LM_ERR_UNSUPPORTED, "cuda: %s cannot make CUBIN for %s (%s); install a newer CUDA toolkit",
                 lm_nvrtc_describe(c->nv), c->arch, c->name);
  if (st == LM_OK && (st = CU(cu.PrimaryCtxRetain(&c->ctx, c->dev))) != LM_OK) c->ctx = NULL;
  if (st == LM_OK) st = cur(c);
  if (st == LM_OK && (st = CU(cu.StreamCreate(&c->stream, CU_STREAM_NONBLOCKING))) != LM_OK) c->stream = NULL;
  if (st != LM_OK) {
    cuda_close(c);
    return st;
  }
  *out = c;
  return LM_OK;
}

static lm_status cuda_alloc(void *ctx, size_t bytes, void **buf) {
  cuda_ctx *c = ctx;
  cu_ptr p = 0;
  lm_status st = cur(c);
  if (st == LM_OK) st = CU(cu.MemAlloc(&p, bytes ? bytes : 1));
  *buf = st == LM_OK ? (void *)(uintptr_t)p : NULL;
  return st;
}

static void *cuda_queue(void *ctx) { return ((cuda_ctx *)ctx)->stream; }
static const char *cuda_device_id(void *ctx) { return ((cuda_ctx *)ctx)->pci; }

static void cuda_release(void *ctx, void *buf) {
  cuda_ctx *c = ctx;
  if (!buf || cur(c) != LM_OK) return;
  cu.StreamSynchronize(c->stream); /* a pending kernel may still use it */
  cu.MemFree((cu_ptr)(uintptr_t)buf);
}

static lm_status cuda_write(void *ctx, void *buf, const void *src, size_t bytes) {
  cuda_ctx *c = ctx;
  lm_status st = cur(c);
  if (st == LM_OK) st = CU(cu.MemcpyHtoDAsync((cu_ptr)(uintptr_t)buf, src, bytes, c->stream));
  if (st == LM_OK) st = CU(cu.StreamSynchronize(c->stream));
  return st;
}

static lm_status cuda_read(void *ctx, const void *buf, void *dst, size_t bytes) {
  cuda_ctx *c = ctx;
  lm_status st = cur(c);
  if (st == LM_OK) st = CU(cu.MemcpyDtoHAsync(dst, (cu_ptr)(uintptr_t)buf, bytes, c->stream));
  if (st == LM_OK) st = CU(cu.StreamSynchronize(c->stream));
  return st;
}

static lm_status cuda_zero(void *ctx, void *buf, size_t bytes) {
  cuda_ctx *c = ctx;
  lm_status st = cur(c);
  return st == LM_OK ? CU(cu.MemsetD8Async((cu_ptr)(uintptr_t)buf, 0, bytes, c->stream)) : st;
}

static lm_status cuda_sync(void *ctx) {
  cuda_ctx *c = ctx;
  lm_status st = cur(c);
  return st == LM_OK ? CU(cu.StreamSynchronize(c->stream)) : st;
}

/* ---------------------------------------------------------------- programs */

enum {
  BLOCK = 256, /* threads per block (one thread per point; work-group schedules bring their own) */
  SHARED_BYTES = 48 * 1024, /* static shared memory a block may use without an opt-in */
  NSLOT = 4,   /* pinned host copies of the parameter block in flight */
};

typedef struct cuda_exe {
  lm_graph_t *g; /* canonical graph (owned) */
  lm_plan *plan;
  int fused;
  lm_scan_info scan;
  uint8_t *per_step;
  cu_module mod;
  cu_function *fns;
  lm_layout layout;
  int64_t *layout_syms;
  int have_layout;
  cu_ptr arena;
  size_t arena_cap;
  cu_ptr *base; /* per plan buffer: its address (slice 0) */
  /* the parameter block: S[nsyms], then per step R[2], B[nbufs] (all 8-byte words) */
  cu_ptr params;
  size_t params_cap;
  uint64_t *host[NSLOT]; /* pinned */
  cu_event host_done[NSLOT];
  int host_used[NSLOT];
  size_t host_cap;
  int slot;
  /* the CUDA Graph and what it was captured for */
  uint64_t *key, *graph_key;
  size_t key_len, graph_key_len, key_cap, graph_key_cap;
  int seen_key; /* runs with the current key so far */
  cu_graph graph;
  cu_graph_exec gexec;
  int graphs_off; /* capture failed once: launch directly */
  cu_event t0, t1;
  int timed;
} cuda_exe;

static void drop_graph(cuda_exe *x) {
  if (x->gexec) cu.GraphExecDestroy(x->gexec);
  if (x->graph) cu.GraphDestroy(x->graph);
  x->gexec = NULL;
  x->graph = NULL;
}

static void cuda_unprepare(void *ctx, void *p) {
  cuda_ctx *c = ctx;
  cuda_exe *x = p;
  if (!x) return;
  if (cur(c) == LM_OK) {
    cu.StreamSynchronize(c->stream);
    drop_graph(x);
    for (int i = 0; i < NSLOT; i++) {
      if (x->host[i]) cu.MemFreeHost(x->host[i]);
      if (x->host_done[i]) cu.EventDestroy(x->host_done[i]);
    }
    if (x->t0) cu.EventDestroy(x->t0);
    if (x->t1) cu.EventDestroy(x->t1);
    if (x->params) cu.MemFree(x->params);
    if (x->arena) cu.MemFree(x->arena);
    if (x->mod) cu.ModuleUnload(x->mod);
  }
  lm_plan_free(x->plan);
  lm_graph_free(x->g);
  lm_layout_free(&x->layout);
  lm_free(x->layout_syms);
  lm_free(x->fns);
  lm_free(x->base);
  lm_free(x->per_step);
  lm_free(x->key);
  lm_free(x->graph_key);
  lm_free(x);
}

/* This GPU for the search, with the work-group schedules prepare applies. */
static void cuda_search_device(void *ctx, lm_search_device *out, lm_gpu_options *go) {
  cuda_ctx *c = ctx;
  lm_gpu_options_default(go, SHARED_BYTES);
  go->warp = 32; /* tree reductions end in warp shuffles */
  *out = (lm_search_device){.ops = &lm_backend_cuda, .ctx = c, .name = c->name,
                            .gpu = lm_gpu_schedules_enabled() ? go : NULL};
}

static lm_status cuda_prepare(void *ctx, lm_graph_t *g, const lm_scan_info *scan, void **out) {
  cuda_ctx *c = ctx;
  cuda_exe *x = lm_calloc(1, sizeof *x);
  if (!x) return LM_ERR_NOMEM;
  char *src = NULL;
  lm_cubin cubin = {0};
  lm_status st = cur(c);
  if (st != LM_OK) goto fail;
  st = LM_ERR_NOMEM;
  if (scan->active) {
    x->scan = *scan;
    if (!(x->per_step = lm_calloc(g->ninputs + 1, 1))) goto fail;
    memcpy(x->per_step, scan->per_step, g->ninputs);
    x->scan.per_step = x->per_step;
  }
  lm_compiled comp;
  lm_gpu_options go; /* shared-memory tiles and staged weights (compiler/gpu.c) */
  lm_search_device sd;
  cuda_search_device(c, &sd, &go);
  /* a search ($LUMEN_SEARCH_BUDGET > 0) times its candidates on this GPU */
  lm_search_options so;
  lm_search_options_init(&so);
  lm_compile_options co = {.search = &so, .device = &sd, .gpu = sd.gpu};
  if ((st = lm_compile_ex(g, scan, &co, &comp)) != LM_OK) goto fail;
  x->g = comp.g;
  x->plan = comp.plan;
  x->fused = comp.fused;
  st = LM_ERR_NOMEM;
  x->fns = lm_calloc(x->plan->nkernels + 1, sizeof *x->fns);
  x->base = lm_calloc(x->plan->nbufs + 1, sizeof *x->base);
  x->layout_syms = lm_calloc(x->g->x.nsyms + 1, sizeof *x->layout_syms);
  if (!x->fns || !x->base || !x->layout_syms) goto fail;
  if (!(src = lm_render_plan(x->plan, LM_DIALECT_CUDA))) goto fail;
  lm_dump_source("cuda", "cu", src, x->plan);
  char what[64];
  snprintf(what, sizeof what, "lumen-%016llx.cu", (unsigned long long)lm_hash_bytes(src, strlen(src), 0));
  if ((st = lm_nvrtc_compile(c->nv, src, what, c->arch, &cubin)) != LM_OK) goto fail;
  if ((st = CU(cu.ModuleLoadData(&x->mod, cubin.data))) != LM_OK) {
    x->mod = NULL;
    goto fail;
  }
  for (size_t i = 0; i < x->plan->nkernels; i++) {
    char name[48];
    lm_render_entry_name(&x->plan->kernels[i], name, sizeof name);
    if ((st = CU(cu.ModuleGetFunction(&x->fns[i], x->mod, name))) != LM_OK) goto fail;
  }
  if ((st = CU(cu.EventCreate(&x->t0, 0))) != LM_OK || (st = CU(cu.EventCreate(&x->t1, 0))) != LM_OK) goto fail;
  for (int i = 0; i < NSLOT; i++)
    if ((st = CU(cu.EventCreate(&x->host_done[i], CU_EVENT_NO_TIMING))) != LM_OK) goto fail;
  lm_cubin_free(&cubin);
  lm_free(src);
  *out = x;
  return LM_OK;
fail:
  lm_cubin_free(&cubin);
  lm_free(src);
  cuda_unprepare(ctx, x);
  return st;
}

/* Layout under these symbols; the arena grows (once per larger size) when it must. */
static lm_status update_layout(cuda_ctx *c, cuda_exe *x, const int64_t *syms) {
  size_t ns = x->g->x.nsyms;
  if (x->have_layout && lm_layout_holds(&x->layout, x->layout_syms, syms, ns)) return LM_OK;
  lm_layout_free(&x->layout);
  x->have_layout = 0;
  lm_status st = lm_layout_compute(x->plan, syms, &x->layout);
  if (st != LM_OK) return st;
  if (x->layout.arena_bytes > x->arena_cap || !x->arena) {
    if (x->arena) {
      if ((st = CU(cu.StreamSynchronize(c->stream))) != LM_OK) return st;
      cu.MemFree(x->arena);
      x->arena = 0;
      x->arena_cap = 0;
    }
    size_t bytes = x->layout.arena_bytes ? x->layout.arena_bytes : 64;
    if ((st = CU(cu.MemAlloc(&x->arena, bytes))) != LM_OK) {
      x->arena = 0;
      return st;
    }
    x->arena_cap = bytes;
  }
  if (ns) memcpy(x->layout_syms, syms, ns * sizeof *syms);
  x->have_layout = 1;
  return LM_OK;
}

/* Room for a parameter block of `words` 8-byte words, on the device and in every host slot. */
static lm_status reserve_params(cuda_ctx *c, cuda_exe *x, size_t words) {
  size_t bytes = words * sizeof(uint64_t);
  if (bytes <= x->params_cap && bytes <= x->host_cap) return LM_OK;
  lm_status st = CU(cu.StreamSynchronize(c->stream));
  if (st != LM_OK) return st;
  size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
  if (x->params) cu.MemFree(x->params);
  x->params = 0;
  x->params_cap = x->host_cap = 0;
  for (int i = 0; i < NSLOT; i++) {
    if (x->host[i]) cu.MemFreeHost(x->host[i]);
    x->host[i] = NULL;
    x->host_used[i] = 0;
  }
  if ((st = CU(cu.MemAlloc(&x->params, cap))) != LM_OK) {
    x->params = 0;
    return st;
  }
  for (int i = 0; i < NSLOT; i++) {
    void *h = NULL;
    if ((st = CU(cu.MemHostAlloc(&h, cap, 0))) != LM_OK) return st;
    x->host[i] = h;
  }
  x->params_cap = x->host_cap = cap;
  return LM_OK;
}

/* Word offsets in the parameter block. */
static size_t s_words(const cuda_exe *x) { return x->g->x.nsyms ? x->g->x.nsyms : 1; }
static size_t step_words(const cuda_exe *x) { return 2 + x->plan->nbufs; }
static size_t step_at(const cuda_exe *x, int64_t s) { return s_words(x) + (size_t)s * step_words(x); }

/* Enqueues every kernel and assign copy of every step (directly, or into a capture). */
static lm_status enqueue(cuda_ctx *c, cuda_exe *x, const uint64_t *host, int64_t steps) {
  const lm_plan *plan = x->plan;
  for (int64_t s = 0; s < steps; s++) {
    size_t at = step_at(x, s);
    cu_ptr S = x->params, R = x->params + at * sizeof(uint64_t), B = R + 2 * sizeof(uint64_t);
    const uint64_t *bufs = host + at + 2;
    for (size_t i = 0; i < plan->nkernels; i++) {
      long long total = x->layout.work[i];
      if (total <= 0) continue;
      unsigned block = plan->kernels[i].group > 0 ? (unsigned)plan->kernels[i].group : BLOCK;
      unsigned long long blocks = ((unsigned long long)total + block - 1) / block;
      if (blocks > 0x7fffffffull)
        return lm_fail(LM_ERR_UNSUPPORTED, "cuda: kernel %s needs %llu blocks (more than a 1-D grid holds)",
                       plan->kernels[i].name, blocks);
      void *args[] = {&B, &S, &R, &total};
      lm_status st = CU(cu.LaunchKernel(x->fns[i], (unsigned)blocks, 1, 1, block, 1, 1, 0, c->stream, args, NULL));
      if (st != LM_OK) return st;
    }
    for (size_t i = 0; i < plan->ncopies; i++) {
      const lm_copy *cp = &plan->copies[i];
      size_t bytes = x->layout.count[cp->dst] * sizeof(float);
      if (!bytes) continue;
      lm_status st = CU(cu.MemcpyDtoDAsync(bufs[cp->dst], bufs[cp->src], bytes, c->stream));
      if (st != LM_OK) return st;
    }
  }
  return LM_OK;
}

/* Captures the run into a CUDA Graph; on any failure graphs are turned off for this program
 * (the work is then launched directly: nothing captured has run). */
static lm_status capture(cuda_ctx *c, cuda_exe *x, const uint64_t *host, int64_t steps) {
  drop_graph(x);
  if (CU(cu.StreamBeginCapture(c->stream, CU_CAPTURE_THREAD_LOCAL)) != LM_OK) {
    x->graphs_off = 1;
    return LM_OK;
  }
  lm_status st = enqueue(c, x, host, steps);
  cu_graph gr = NULL;
  lm_status end = CU(cu.StreamEndCapture(c->stream, &gr));
  if (st != LM_OK) {
    if (gr) cu.GraphDestroy(gr);
    return st;
  }
  if (end != LM_OK || !gr) {
    x->graphs_off = 1;
    return LM_OK;
  }
  x->graph = gr;
  if (CU(cu.GraphInstantiate(&x->gexec, gr, 0)) != LM_OK) {
    x->gexec = NULL;
    drop_graph(x);
    x->graphs_off = 1;
  }
  return LM_OK;
}

static lm_status cuda_run(void *ctx, void *p, const lm_run_args *args) {
  cuda_ctx *c = ctx;
  cuda_exe *x = p;
  const lm_plan *plan = x->plan;
  lm_status st = cur(c);
  if (st == LM_OK) st = update_layout(c, x, args->syms);
  if (st != LM_OK) return st;
  int64_t T = x->scan.active ? args->syms[x->scan.sym_T] : 1;
  int64_t steps = x->scan.active && !x->fused ? T : 1;
  if (steps <= 0) return LM_OK;
  for (size_t i = 0; i < plan->nbufs; i++) {
    const lm_pbuf *b = &plan->bufs[i];
    x->base[i] = b->kind == LM_BUF_INPUT    ? (cu_ptr)(uintptr_t)args->inputs[b->index]
                 : b->kind == LM_BUF_OUTPUT ? (cu_ptr)(uintptr_t)args->outputs[b->index]
                                            : x->arena + x->layout.offset[i];
  }
  size_t ns = x->g->x.nsyms, words = step_at(x, steps);
  if ((st = reserve_params(c, x, words)) != LM_OK) return st;

  /* the host copy of the parameter block, in a slot whose last upload has completed */
  int slot = x->slot;
  x->slot = (x->slot + 1) % NSLOT;
  if (x->host_used[slot] && (st = CU(cu.EventSynchronize(x->host_done[slot]))) != LM_OK) return st;
  uint64_t *h = x->host[slot];
  for (size_t k = 0; k < ns; k++) h[k] = (uint64_t)args->syms[k];
  if (!ns) h[0] = 0;
  for (int64_t s = 0; s < steps; s++) {
    uint64_t *step = h + step_at(x, s);
    int64_t t = x->scan.reverse ? steps - 1 - s : s; /* the slice step s reads and writes */
    step[0] = args->seed;
    step[1] = x->fused ? args->run * (uint64_t)T : x->scan.active ? args->run * (uint64_t)T + (uint64_t)t : args->run;
    for (size_t i = 0; i < plan->nbufs; i++) {
      const lm_pbuf *b = &plan->bufs[i];
      /* a plan buffer of a step holds one step: per-step inputs and outputs move by its size */
      int sliced = x->scan.active && !x->fused &&
                   ((b->kind == LM_BUF_INPUT && x->per_step[b->index]) || b->kind == LM_BUF_OUTPUT);
      step[2 + i] = x->base[i] + (sliced ? (uint64_t)t * x->layout.count[i] * sizeof(float) : 0);
    }
  }
  if ((st = CU(cu.MemcpyHtoDAsync(x->params, h, words * sizeof(uint64_t), c->stream))) != LM_OK) return st;
  if ((st = CU(cu.EventRecord(x->host_done[slot], c->stream))) != LM_OK) return st;
  x->host_used[slot] = 1;

  /* what a captured graph depends on: symbol values, buffer addresses, the block's address */
  size_t klen = ns + plan->nbufs + 1;
  if (klen > x->key_cap) {
    uint64_t *k = lm_realloc(x->key, klen * sizeof *k);
    if (!k) return LM_ERR_NOMEM;
    x->key = k;
    x->key_cap = klen;
  }
  for (size_t k = 0; k < ns; k++) x->key[k] = (uint64_t)args->syms[k];
  for (size_t i = 0; i < plan->nbufs; i++) x->key[ns + i] = x->base[i];
  x->key[ns + plan->nbufs] = x->params;
  int same = x->graph_key && x->graph_key_len == klen && !memcmp(x->key, x->graph_key, klen * sizeof *x->key);
  if (!same) {
    drop_graph(x);
    if (klen > x->graph_key_cap) {
      uint64_t *k = lm_realloc(x->graph_key, klen * sizeof *k);
      if (!k) return LM_ERR_NOMEM;
      x->graph_key = k;
      x->graph_key_cap = klen;
    }
    memcpy(x->graph_key, x->key, klen * sizeof *x->key);
    x->graph_key_len = klen;
    x->seen_key = 0;
  }
  x->seen_key++;

  if ((st = CU(cu.EventRecord(x->t0, c->stream))) != LM_OK) return st;
  /* the first run with these addresses runs directly (and loads everything); the second captures */
  if (!x->gexec && !x->graphs_off && x->seen_key >= 2 && (st = capture(c, x, h, steps)) != LM_OK) return st;
  st = x->gexec ? CU(cu.GraphLaunch(x->gexec, c->stream)) : enqueue(c, x, h, steps);
  if (st == LM_OK) st = CU(cu.EventRecord(x->t1, c->stream));
  x->timed = st == LM_OK;
  return st;
}

/* Milliseconds the device spent on the last run (CUDA events around it); waits for it to end.
 * Ready for a `time` entry of the vtable (backend.h has none yet). */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static lm_status cuda_time(void *ctx, void *p, double *ms) {
  cuda_exe *x = p;
  float f = 0;
  lm_status st = cur(ctx);
  if (st == LM_OK && !x->timed) return lm_fail(LM_ERR_INVALID, "cuda: no run to time yet");
  if (st == LM_OK) st = CU(cu.EventSynchronize(x->t1));
  if (st == LM_OK) st = CU(cu.EventElapsedTime(&f, x->t0, x->t1));
  *ms = f;
  return st;
}

/* ---------------------------------------------------------------- kernel by kernel (search) */

typedef struct cuda_entry {
  cu_function fn;
  unsigned block;
} cuda_entry;

static lm_status cuda_module_build(void *ctx, const char *src, void **module) {
  cuda_ctx *c = ctx;
  *module = NULL;
  lm_cubin cubin = {0};
  char what[64];
  snprintf(what, sizeof what, "lumen-search-%016llx.cu", (unsigned long long)lm_hash_bytes(src, strlen(src), 0));
  cu_module mod = NULL;
  lm_status st = cur(c);
  if (st == LM_OK) st = lm_nvrtc_compile(c->nv, src, what, c->arch, &cubin);
  if (st == LM_OK && (st = CU(cu.ModuleLoadData(&mod, cubin.data))) == LM_OK) *module = mod;
  lm_cubin_free(&cubin);
  return st;
}

static void cuda_module_free(void *ctx, void *module) {
  if (module && cur(ctx) == LM_OK) cu.ModuleUnload((cu_module)module);
}

static lm_status cuda_module_entry(void *ctx, void *module, const char *name, const lm_kernel *k, void **entry) {
  cuda_entry *e = lm_calloc(1, sizeof *e);
  if (!e) return LM_ERR_NOMEM;
  lm_status st = cur(ctx);
  if (st == LM_OK) st = CU(cu.ModuleGetFunction(&e->fn, (cu_module)module, name));
  e->block = k->group > 0 ? (unsigned)k->group : BLOCK;
  if (st != LM_OK) lm_free(e), e = NULL;
  *entry = e;
  return st;
}

static void cuda_entry_free(void *ctx, void *entry) {
  (void)ctx;
  lm_free(entry);
}

/* Kernels take B, a device array of buffer pointers by plan buffer: kept in c->kb, uploaded
 * when the pointers a launch needs differ from the last ones. */
static lm_status cuda_launch_kernel(void *ctx, void *entry, const lm_kernel *k, void *const *bufs, void *S, void *R,
                                    int64_t work) {
  cuda_ctx *c = ctx;
  cuda_entry *e = entry;
  if (work <= 0) return LM_OK;
  size_t n = 1;
  for (size_t j = 0; j < k->nbufs; j++)
    if (k->bufs[j] + 1 > n) n = k->bufs[j] + 1;
  lm_status st = cur(c);
  if (st != LM_OK) return st;
  int changed = n > c->kb_cap;
  if (changed) {
    if (c->kb) cu.MemFree(c->kb), c->kb = 0;
    lm_free(c->kb_host);
    c->kb_cap = 0;
    if (!(c->kb_host = lm_calloc(n, sizeof *c->kb_host))) return LM_ERR_NOMEM;
    if ((st = CU(cu.MemAlloc(&c->kb, n * sizeof(uint64_t)))) != LM_OK) return st;
    c->kb_cap = n;
  }
  for (size_t j = 0; j < k->nbufs; j++) {
    uint64_t p = (uint64_t)(uintptr_t)bufs[k->bufs[j]];
    if (c->kb_host[k->bufs[j]] != p) c->kb_host[k->bufs[j]] = p, changed = 1;
  }
  if (changed && (st = CU(cu.MemcpyHtoDAsync(c->kb, c->kb_host, c->kb_cap * sizeof(uint64_t), c->stream))) != LM_OK)
    return st;
  unsigned long long blocks = ((unsigned long long)work + e->block - 1) / e->block;
  if (blocks > 0x7fffffffull)
    return lm_fail(LM_ERR_UNSUPPORTED, "cuda: kernel %s needs %llu blocks (more than a 1-D grid holds)", k->name, blocks);
  cu_ptr B = c->kb, Sp = (cu_ptr)(uintptr_t)S, Rp = (cu_ptr)(uintptr_t)R;
  long long total = work;
  void *args[] = {&B, &Sp, &Rp, &total};
  return CU(cu.LaunchKernel(e->fn, (unsigned)blocks, 1, 1, e->block, 1, 1, 0, c->stream, args, NULL));
}

static lm_status cuda_stats(void *ctx, void *p, const int64_t *syms, lm_program_stats *out) {
  (void)ctx;
  cuda_exe *x = p;
  return lm_plan_stats(x->plan, &x->scan, x->fused, syms, out);
}

const lm_backend_ops lm_backend_cuda = {
    .name = "cuda",
    .description = "CUDA kernels compiled by NVRTC to CUBIN, run through the driver API and CUDA Graphs",
    .open = cuda_open,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .write = cuda_write,
    .read = cuda_read,
    .fill_zero = cuda_zero,
    .queue = cuda_queue,
    .device_id = cuda_device_id,
    .prepare = cuda_prepare,
    .unprepare = cuda_unprepare,
    .run = cuda_run,
    .sync = cuda_sync,
    .stats = cuda_stats,
    .kernel_dialect = LM_DIALECT_CUDA,
    .search_device = cuda_search_device,
    .module_build = cuda_module_build,
    .module_free = cuda_module_free,
    .module_entry = cuda_module_entry,
    .entry_free = cuda_entry_free,
    .launch_kernel = cuda_launch_kernel,
};
