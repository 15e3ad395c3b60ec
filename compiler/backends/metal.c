/* compiler/backends/metal.c — the metal backend: MSL from the shared renderer, run by host code in
 * plain C. The host logic (memory plan, one command buffer per run, barriers between dependent
 * dispatches, scans) talks to an lm_mtl_device (msl_check.h). The real device below drives
 * Metal through the Objective-C runtime — Metal.framework and libobjc are dlopened, selectors
 * cached, objc_msgSend cast to each call's exact prototype — so this file compiles and links
 * everywhere with no Apple header; off macOS "metal" fails to open and says why. "metal-shim"
 * runs the same host logic on the emulated device of msl_check.c (MSL compiled as C++, run on
 * the CPU). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "compile.h"
#include "memplan.h"
#include "msl_check.h"
#include "render.h"

/* ================================================================ the Objective-C runtime */

typedef void *objc_obj; /* id, Class */
typedef void *objc_sel; /* SEL */
typedef unsigned long ns_uint; /* NSUInteger (64-bit Apple platforms) */
typedef long ns_int;           /* NSInteger */
#if defined(__aarch64__) || defined(__arm64__)
typedef _Bool objc_bool; /* BOOL is bool on arm64 */
#else
typedef signed char objc_bool; /* and signed char on x86_64 */
#endif
typedef struct mtl_size { /* MTLSize */
  ns_uint width, height, depth;
} mtl_size;
typedef void (*objc_imp)(void); /* objc_msgSend, only ever called through a cast */

/* Metal's enum values (MTLMathMode, MTLMathFloatingPointFunctions, MTLDispatchType,
 * MTLBarrierScope, MTLResourceOptions, MTLCommandBufferStatus). */
enum {
  MTL_MATH_MODE_SAFE = 0,
  MTL_FP_FUNCTIONS_PRECISE = 1,
  MTL_DISPATCH_CONCURRENT = 1,
  MTL_BARRIER_SCOPE_BUFFERS = 1,
  MTL_RESOURCE_STORAGE_SHARED = 0,
  MTL_CB_STATUS_COMPLETED = 4,
};

#define METAL_PATH "/System/Library/Frameworks/Metal.framework/Metal"
#define FOUNDATION_PATH "/System/Library/Frameworks/Foundation.framework/Foundation"
#define COREGRAPHICS_PATH "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"
#define OBJC_PATH "/usr/lib/libobjc.A.dylib"

#define SELECTORS(X)                                                                                           \
  X(alloc, "alloc")                                                                                            \
  X(init, "init")                                                                                              \
  X(release, "release")                                                                                        \
  X(count, "count")                                                                                            \
  X(object_at, "objectAtIndex:")                                                                               \
  X(with_utf8, "stringWithUTF8String:")                                                                        \
  X(utf8, "UTF8String")                                                                                        \
  X(description, "localizedDescription")                                                                       \
  X(name, "name")                                                                                              \
  X(responds, "respondsToSelector:")                                                                           \
  X(new_queue, "newCommandQueue")                                                                              \
  X(set_fast_math, "setFastMathEnabled:")                                                                      \
  X(set_math_mode, "setMathMode:")                                                                             \
  X(set_fp_functions, "setMathFloatingPointFunctions:")                                                        \
  X(new_library, "newLibraryWithSource:options:error:")                                                        \
  X(new_function, "newFunctionWithName:")                                                                      \
  X(new_pipeline, "newComputePipelineStateWithFunction:error:")                                                \
  X(max_threads, "maxTotalThreadsPerThreadgroup")                                                              \
  X(exec_width, "threadExecutionWidth")                                                                        \
  X(new_buffer, "newBufferWithLength:options:")                                                                \
  X(contents, "contents")                                                                                      \
  X(command_buffer, "commandBuffer")                                                                           \
  X(compute_encoder, "computeCommandEncoderWithDispatchType:")                                                 \
  X(set_pipeline, "setComputePipelineState:")                                                                  \
  X(set_buffer, "setBuffer:offset:atIndex:")                                                                   \
  X(set_bytes, "setBytes:length:atIndex:")                                                                     \
  X(dispatch, "dispatchThreadgroups:threadsPerThreadgroup:")                                                   \
  X(barrier, "memoryBarrierWithScope:")                                                                        \
  X(end_encoding, "endEncoding")                                                                               \
  X(commit, "commit")                                                                                          \
  X(wait, "waitUntilCompleted")                                                                                \
  X(status, "status")                                                                                          \
  X(error, "error")                                                                                            \
  X(gpu_start, "GPUStartTime")                                                                                 \
  X(gpu_end, "GPUEndTime")

typedef struct objc_api {
  lm_status st;
  char why[700];
  objc_obj (*get_class)(const char *);
  objc_sel (*sel)(const char *);
  objc_imp send;
  void *(*pool_push)(void);
  void (*pool_pop)(void *);
  objc_obj (*create_device)(void);
  objc_obj (*copy_devices)(void);
  objc_obj NSString, MTLCompileOptions;
  struct {
#define FIELD(field, text) objc_sel field;
    SELECTORS(FIELD)
#undef FIELD
  } s;
} objc_api;

static objc_api api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;

/* dlsym into a function pointer of any type (the object-to-function conversion by memcpy). */
static int load_fn(void *lib, const char *name, void *fn_ptr, size_t size) {
  void *p = lib ? dlsym(lib, name) : NULL;
  if (p) memcpy(fn_ptr, &p, size);
  return p != NULL;
}

static void api_load(void) {
  api.st = LM_ERR_UNSUPPORTED;
  void *metal = dlopen(METAL_PATH, RTLD_LAZY | RTLD_LOCAL);
  if (!metal) {
    const char *e = dlerror();
#if defined(__APPLE__)
    snprintf(api.why, sizeof api.why, "Metal.framework could not be loaded: %s", e ? e : METAL_PATH);
#else
    (void)e; /* "no such file" says nothing more than the message */
    snprintf(api.why, sizeof api.why, "Metal is only available on macOS: Metal.framework not found");
#endif
    return;
  }
  /* Foundation for NSString; CoreGraphics because command-line tools get no default Metal
   * device without it (Apple's documentation of MTLCreateSystemDefaultDevice) */
  dlopen(FOUNDATION_PATH, RTLD_LAZY | RTLD_LOCAL);
  dlopen(COREGRAPHICS_PATH, RTLD_LAZY | RTLD_LOCAL);
  void *objc = dlopen(OBJC_PATH, RTLD_LAZY | RTLD_LOCAL);
  int ok = load_fn(objc, "objc_getClass", &api.get_class, sizeof api.get_class) &&
           load_fn(objc, "sel_registerName", &api.sel, sizeof api.sel) &&
           load_fn(objc, "objc_msgSend", &api.send, sizeof api.send) &&
           load_fn(objc, "objc_autoreleasePoolPush", &api.pool_push, sizeof api.pool_push) &&
           load_fn(objc, "objc_autoreleasePoolPop", &api.pool_pop, sizeof api.pool_pop) &&
           load_fn(metal, "MTLCreateSystemDefaultDevice", &api.create_device, sizeof api.create_device);
  if (!ok) {
    snprintf(api.why, sizeof api.why, "the Objective-C runtime or Metal lacks an entry point (%s)",
             objc ? "dlsym failed" : OBJC_PATH " not found");
    return;
  }
  load_fn(metal, "MTLCopyAllDevices", &api.copy_devices, sizeof api.copy_devices);
#define REGISTER(field, text) api.s.field = api.sel(text);
  SELECTORS(REGISTER)
#undef REGISTER
  api.NSString = api.get_class("NSString");
  api.MTLCompileOptions = api.get_class("MTLCompileOptions");
  if (!api.NSString || !api.MTLCompileOptions) {
    snprintf(api.why, sizeof api.why, "the Objective-C classes NSString and MTLCompileOptions are missing");
    return;
  }
  api.st = LM_OK;
}

/* One typed view of objc_msgSend per prototype used (arguments after self and _cmd). */
typedef objc_obj (*msg_o)(objc_obj, objc_sel);
typedef objc_obj (*msg_o_s)(objc_obj, objc_sel, const char *);
typedef objc_obj (*msg_o_u)(objc_obj, objc_sel, ns_uint);
typedef objc_obj (*msg_o_o)(objc_obj, objc_sel, objc_obj);
typedef objc_obj (*msg_o_oe)(objc_obj, objc_sel, objc_obj, objc_obj *);
typedef objc_obj (*msg_o_ooe)(objc_obj, objc_sel, objc_obj, objc_obj, objc_obj *);
typedef objc_obj (*msg_o_uu)(objc_obj, objc_sel, ns_uint, ns_uint);
typedef const char *(*msg_s)(objc_obj, objc_sel);
typedef void *(*msg_p)(objc_obj, objc_sel);
typedef ns_uint (*msg_u)(objc_obj, objc_sel);
typedef double (*msg_d)(objc_obj, objc_sel);
typedef objc_bool (*msg_b_sel)(objc_obj, objc_sel, objc_sel);
typedef void (*msg_v)(objc_obj, objc_sel);
typedef void (*msg_v_b)(objc_obj, objc_sel, objc_bool);
typedef void (*msg_v_i)(objc_obj, objc_sel, ns_int);
typedef void (*msg_v_u)(objc_obj, objc_sel, ns_uint);
typedef void (*msg_v_o)(objc_obj, objc_sel, objc_obj);
typedef void (*msg_v_ouu)(objc_obj, objc_sel, objc_obj, ns_uint, ns_uint);
typedef void (*msg_v_puu)(objc_obj, objc_sel, const void *, ns_uint, ns_uint);
typedef void (*msg_v_zz)(objc_obj, objc_sel, mtl_size, mtl_size);
#define SEND(type) ((type)api.send)

static void release(objc_obj o) {
  if (o) SEND(msg_v)(o, api.s.release);
}

static objc_obj ns_string(const char *s) { return SEND(msg_o_s)(api.NSString, api.s.with_utf8, s); }

/* An NSError's text (or `fallback`). */
static const char *error_text(objc_obj err, const char *fallback) {
  objc_obj d = err ? SEND(msg_o)(err, api.s.description) : NULL;
  const char *s = d ? SEND(msg_s)(d, api.s.utf8) : NULL;
  return s ? s : fallback;
}

/* ---------------------------------------------------------------- the real device */

typedef struct objc_dev {
  objc_obj device, queue;
} objc_dev;

typedef struct objc_lib {
  objc_obj library;
  objc_obj *pipe;
  ns_uint *group; /* threads per threadgroup, per pipeline */
  size_t n;
} objc_lib;

typedef struct objc_enc {
  void *pool;
  objc_obj cb, enc;
  ns_uint group;
} objc_enc;

static lm_status objc_open(void **out) {
  pthread_once(&api_once, api_load);
  if (api.st != LM_OK) return lm_fail(api.st, "%s", api.why);
  void *pool = api.pool_push();
  objc_obj device = api.create_device();
  if (!device && api.copy_devices) { /* a headless machine may have devices but no default */
    objc_obj all = api.copy_devices();
    if (all && SEND(msg_u)(all, api.s.count) > 0) {
      device = SEND(msg_o_u)(all, api.s.object_at, 0);
      if (device) SEND(msg_o)(device, api.sel("retain"));
    }
    release(all);
  }
  objc_obj queue = device ? SEND(msg_o)(device, api.s.new_queue) : NULL;
  api.pool_pop(pool);
  if (!device || !queue) {
    release(device);
    return lm_fail(LM_ERR_UNSUPPORTED, "%s",
                   device ? "Metal: newCommandQueue failed"
                          : "Metal: no Metal device (MTLCreateSystemDefaultDevice returned nil)");
  }
  objc_dev *d = lm_calloc(1, sizeof *d);
  if (!d) {
    release(queue);
    release(device);
    return LM_ERR_NOMEM;
  }
  d->device = device;
  d->queue = queue;
  *out = d;
  return LM_OK;
}

static void objc_close(void *dev) {
  objc_dev *d = dev;
  if (!d) return;
  release(d->queue);
  release(d->device);
  lm_free(d);
}

static lm_status objc_buffer_new(void *dev, size_t bytes, void **buf, void **contents) {
  objc_dev *d = dev;
  size_t n = bytes ? bytes : 4;
  objc_obj b = SEND(msg_o_uu)(d->device, api.s.new_buffer, (ns_uint)n, (ns_uint)MTL_RESOURCE_STORAGE_SHARED);
  void *p = b ? SEND(msg_p)(b, api.s.contents) : NULL;
  if (!p) {
    release(b);
    return lm_fail(LM_ERR_NOMEM, "Metal: newBufferWithLength:%zu failed", n);
  }
  memset(p, 0, n);
  *buf = b;
  *contents = p;
  return LM_OK;
}

static void objc_buffer_free(void *dev, void *buf) {
  (void)dev;
  release(buf);
}

static void objc_library_free(void *dev, void *lib) {
  (void)dev;
  objc_lib *l = lib;
  if (!l) return;
  for (size_t i = 0; i < l->n; i++) release(l->pipe[i]);
  release(l->library);
  lm_free(l->pipe);
  lm_free(l->group);
  lm_free(l);
}

static lm_status objc_library_new(void *dev, const char *msl, const char *const *entries, size_t n, void **out) {
  objc_dev *d = dev;
  objc_lib *l = lm_calloc(1, sizeof *l);
  if (!l) return LM_ERR_NOMEM;
  l->pipe = lm_calloc(n + 1, sizeof *l->pipe);
  l->group = lm_calloc(n + 1, sizeof *l->group);
  if (!l->pipe || !l->group) {
    objc_library_free(dev, l);
    return LM_ERR_NOMEM;
  }
  void *pool = api.pool_push();
  lm_status st = LM_OK;
  objc_obj opts = SEND(msg_o)(SEND(msg_o)(api.MTLCompileOptions, api.s.alloc), api.s.init);
  if (opts && SEND(msg_b_sel)(opts, api.s.responds, api.s.set_math_mode)) { /* macOS 15 and later */
    SEND(msg_v_i)(opts, api.s.set_math_mode, MTL_MATH_MODE_SAFE);
    if (SEND(msg_b_sel)(opts, api.s.responds, api.s.set_fp_functions))
      SEND(msg_v_i)(opts, api.s.set_fp_functions, MTL_FP_FUNCTIONS_PRECISE);
  } else if (opts) SEND(msg_v_b)(opts, api.s.set_fast_math, 0);
  objc_obj err = NULL;
  l->library = opts ? SEND(msg_o_ooe)(d->device, api.s.new_library, ns_string(msl), opts, &err) : NULL;
  if (!l->library)
    st = lm_fail(LM_ERR_COMPILE, "Metal: newLibraryWithSource failed: %s", error_text(err, "(no error object)"));
  for (size_t i = 0; i < n && st == LM_OK; i++, l->n = i) {
    objc_obj fn = SEND(msg_o_o)(l->library, api.s.new_function, ns_string(entries[i]));
    if (!fn) {
      st = lm_fail(LM_ERR_COMPILE, "Metal: the library has no kernel named %s", entries[i]);
      break;
    }
    err = NULL;
    l->pipe[i] = SEND(msg_o_oe)(d->device, api.s.new_pipeline, fn, &err);
    release(fn);
    if (!l->pipe[i]) {
      st = lm_fail(LM_ERR_COMPILE, "Metal: no compute pipeline for %s: %s", entries[i], error_text(err, "(no error)"));
      break;
    }
    ns_uint most = SEND(msg_u)(l->pipe[i], api.s.max_threads), width = SEND(msg_u)(l->pipe[i], api.s.exec_width);
    ns_uint g = most < 256 ? most : 256;
    if (width && g >= width) g -= g % width;
    l->group[i] = g ? g : 1;
  }
  release(opts);
  api.pool_pop(pool);
  if (st != LM_OK) {
    objc_library_free(dev, l);
    return st;
  }
  *out = l;
  return LM_OK;
}

static lm_status objc_encoder_new(void *dev, void **out) {
  objc_dev *d = dev;
  objc_enc *e = lm_calloc(1, sizeof *e);
  if (!e) return LM_ERR_NOMEM;
  e->pool = api.pool_push(); /* the command buffer and encoder are autoreleased */
  e->cb = SEND(msg_o)(d->queue, api.s.command_buffer);
  e->enc = e->cb ? SEND(msg_o_u)(e->cb, api.s.compute_encoder, MTL_DISPATCH_CONCURRENT) : NULL;
  if (!e->enc) {
    api.pool_pop(e->pool);
    lm_free(e);
    return lm_fail(LM_ERR_BACKEND, "Metal: no command buffer or compute encoder");
  }
  *out = e;
  return LM_OK;
}

static void objc_set_kernel(void *enc, void *lib, size_t entry) {
  objc_enc *e = enc;
  const objc_lib *l = lib;
  SEND(msg_v_o)(e->enc, api.s.set_pipeline, l->pipe[entry]);
  e->group = l->group[entry];
}

static void objc_set_buffer(void *enc, void *buf, size_t offset, uint32_t slot) {
  objc_enc *e = enc;
  SEND(msg_v_ouu)(e->enc, api.s.set_buffer, buf, (ns_uint)offset, (ns_uint)slot);
}

static void objc_set_bytes(void *enc, const void *bytes, size_t n, uint32_t slot) {
  objc_enc *e = enc;
  SEND(msg_v_puu)(e->enc, api.s.set_bytes, bytes, (ns_uint)n, (ns_uint)slot);
}

/* Whole threadgroups (every Metal GPU supports them, unlike non-uniform grids): the kernel
 * returns for gid >= total. */
static void objc_dispatch(void *enc, uint64_t threads, uint32_t group) {
  objc_enc *e = enc;
  ns_uint g = group ? group : e->group;
  mtl_size groups = {(ns_uint)((threads + g - 1) / g), 1, 1}, per = {g, 1, 1};
  SEND(msg_v_zz)(e->enc, api.s.dispatch, groups, per);
}

static void objc_barrier(void *enc) {
  objc_enc *e = enc;
  SEND(msg_v_u)(e->enc, api.s.barrier, MTL_BARRIER_SCOPE_BUFFERS);
}

static lm_status objc_finish(void *enc, int commit, double *gpu_seconds) {
  objc_enc *e = enc;
  lm_status st = LM_OK;
  SEND(msg_v)(e->enc, api.s.end_encoding);
  if (commit) {
    SEND(msg_v)(e->cb, api.s.commit);
    SEND(msg_v)(e->cb, api.s.wait);
    ns_uint status = SEND(msg_u)(e->cb, api.s.status);
    if (status != MTL_CB_STATUS_COMPLETED)
      st = lm_fail(LM_ERR_BACKEND, "Metal: the command buffer ended with status %lu: %s", (unsigned long)status,
                   error_text(SEND(msg_o)(e->cb, api.s.error), "(no error object)"));
    else if (gpu_seconds)
      *gpu_seconds = SEND(msg_d)(e->cb, api.s.gpu_end) - SEND(msg_d)(e->cb, api.s.gpu_start);
  }
  api.pool_pop(e->pool);
  lm_free(e);
  return st;
}

static const lm_mtl_device device_objc = {
    .name = "metal",
    .open = objc_open,
    .close = objc_close,
    .buffer_new = objc_buffer_new,
    .buffer_free = objc_buffer_free,
    .library_new = objc_library_new,
    .library_free = objc_library_free,
    .encoder_new = objc_encoder_new,
    .set_kernel = objc_set_kernel,
    .set_buffer = objc_set_buffer,
    .set_bytes = objc_set_bytes,
    .dispatch = objc_dispatch,
    .barrier = objc_barrier,
    .finish = objc_finish,
};

/* ================================================================ the host logic */

typedef struct mtl_ctx {
  const lm_mtl_device *d;
  void *dev;
} mtl_ctx;

/* A backend buffer: a shared-storage device buffer and its CPU address. */
typedef struct mtl_buf {
  void *buf, *contents;
  size_t bytes;
} mtl_buf;

/* Bytes a dispatch touches, for barrier placement. */
typedef struct region {
  void *buf;
  size_t lo, hi;
  int write;
} region;

typedef struct binding {
  void *buf;
  size_t offset;
} binding;

typedef struct mtl_exe {
  lm_graph_t *g; /* canonical graph (owned) */
  lm_plan *plan;
  int fused;
  lm_scan_info scan;
  uint8_t *per_step;
  void *lib;             /* one pipeline per kernel, then the copy kernel */
  uint8_t **written;     /* per kernel, per slot: the kernel stores to that buffer */
  lm_layout layout;
  int64_t *layout_syms;
  int have_layout;
  mtl_buf arena;
  binding *bind;         /* per plan buffer, for the step being encoded */
  region *pending;       /* accesses since the last barrier */
  size_t npending, pendcap;
  double gpu_seconds;
} mtl_exe;

static lm_status open_on(const lm_mtl_device *d, void **out) {
  mtl_ctx *c = lm_calloc(1, sizeof *c);
  if (!c) return LM_ERR_NOMEM;
  c->d = d;
  lm_status st = d->open(&c->dev);
  if (st != LM_OK) {
    lm_free(c);
    return st;
  }
  *out = c;
  return LM_OK;
}

static lm_status metal_open(void **out) { return open_on(&device_objc, out); }
static lm_status metal_shim_open(void **out) { return open_on(&lm_mtl_device_shim, out); }

static void metal_close(void *ctx) {
  mtl_ctx *c = ctx;
  if (!c) return;
  c->d->close(c->dev);
  lm_free(c);
}

static lm_status metal_alloc(void *ctx, size_t bytes, void **out) {
  mtl_ctx *c = ctx;
  mtl_buf *b = lm_calloc(1, sizeof *b);
  if (!b) return LM_ERR_NOMEM;
  lm_status st = c->d->buffer_new(c->dev, bytes, &b->buf, &b->contents);
  if (st != LM_OK) {
    lm_free(b);
    return st;
  }
  b->bytes = bytes;
  *out = b;
  return LM_OK;
}

static void metal_release(void *ctx, void *buf) {
  mtl_ctx *c = ctx;
  mtl_buf *b = buf;
  if (!b) return;
  c->d->buffer_free(c->dev, b->buf);
  lm_free(b);
}

/* Shared storage: the CPU copies straight into and out of the buffer (runs are synchronous). */
static lm_status metal_write(void *ctx, void *buf, const void *src, size_t bytes) {
  (void)ctx;
  memcpy(((mtl_buf *)buf)->contents, src, bytes);
  return LM_OK;
}
static lm_status metal_read(void *ctx, const void *buf, void *dst, size_t bytes) {
  (void)ctx;
  memcpy(dst, ((const mtl_buf *)buf)->contents, bytes);
  return LM_OK;
}
static lm_status metal_zero(void *ctx, void *buf, size_t bytes) {
  (void)ctx;
  memset(((mtl_buf *)buf)->contents, 0, bytes);
  return LM_OK;
}

static void metal_unprepare(void *ctx, void *p) {
  mtl_ctx *c = ctx;
  mtl_exe *x = p;
  if (!x) return;
  if (x->lib) c->d->library_free(c->dev, x->lib);
  if (x->arena.buf) c->d->buffer_free(c->dev, x->arena.buf);
  if (x->written && x->plan)
    for (size_t i = 0; i < x->plan->nkernels; i++) lm_free(x->written[i]);
  lm_free(x->written);
  lm_plan_free(x->plan);
  lm_graph_free(x->g);
  lm_layout_free(&x->layout);
  lm_free(x->layout_syms);
  lm_free(x->bind);
  lm_free(x->pending);
  lm_free(x->per_step);
  lm_free(x);
}

static lm_status metal_prepare(void *ctx, lm_graph_t *g, const lm_scan_info *scan, void **out) {
  mtl_ctx *c = ctx;
  mtl_exe *x = lm_calloc(1, sizeof *x);
  if (!x) return LM_ERR_NOMEM;
  lm_status st = LM_ERR_NOMEM;
  char *src = NULL;
  char (*names)[48] = NULL;
  const char **entries = NULL;
  if (scan->active) {
    x->scan = *scan;
    if (!(x->per_step = lm_calloc(g->ninputs + 1, 1))) goto fail;
    memcpy(x->per_step, scan->per_step, g->ninputs);
    x->scan.per_step = x->per_step;
  }
  lm_compiled comp;
  if ((st = lm_compile(g, scan, &comp)) != LM_OK) goto fail;
  x->g = comp.g;
  x->plan = comp.plan;
  x->fused = comp.fused;
  const lm_plan *plan = x->plan;
  size_t nk = plan->nkernels;
  for (size_t i = 0; i < nk; i++)
    if (plan->kernels[i].nbufs + 3 > LM_MSL_MAX_SLOTS) {
      st = lm_fail(LM_ERR_UNSUPPORTED,
                   "metal: kernel %.32s needs %zu buffer slots (its %zu buffers, S, R, total); Metal has %d",
                   plan->kernels[i].name, plan->kernels[i].nbufs + 3, plan->kernels[i].nbufs, LM_MSL_MAX_SLOTS);
      goto fail;
    }
  st = LM_ERR_NOMEM;
  x->written = lm_calloc(nk + 1, sizeof *x->written);
  x->bind = lm_calloc(plan->nbufs + 1, sizeof *x->bind);
  x->layout_syms = lm_calloc(x->g->x.nsyms + 1, sizeof *x->layout_syms);
  names = lm_calloc(nk + 1, sizeof *names);
  entries = lm_calloc(nk + 2, sizeof *entries);
  if (!x->written || !x->bind || !x->layout_syms || !names || !entries) goto fail;
  for (size_t i = 0; i < nk; i++) {
    const lm_kernel *k = &plan->kernels[i];
    if (!(x->written[i] = lm_calloc(k->nbufs + 1, 1))) goto fail;
    for (size_t s = 0; s < k->nstmts; s++)
      if (k->stmts[s].op == LM_S_STORE && !k->stmts[s].local)
        for (size_t j = 0; j < k->nbufs; j++)
          if (k->bufs[j] == k->stmts[s].buf) x->written[i][j] = 1;
    entries[i] = lm_render_entry_name(k, names[i], sizeof names[i]);
  }
  entries[nk] = LM_MSL_COPY_ENTRY;
  if (!(src = lm_msl_plan_source(plan))) {
    st = LM_ERR_INVALID;
    goto fail;
  }
  lm_dump_source(c->d->name, "metal", src, plan);
  if ((st = c->d->library_new(c->dev, src, entries, nk + 1, &x->lib)) != LM_OK) goto fail;
  lm_free(src);
  lm_free(names);
  lm_free(entries);
  *out = x;
  return LM_OK;
fail:
  lm_free(src);
  lm_free(names);
  lm_free(entries);
  metal_unprepare(ctx, x);
  return st;
}

/* Records that the next dispatch touches acc[0..n); puts a barrier first when it conflicts
 * with a dispatch since the last barrier (overlapping bytes of one buffer, one side writing). */
static lm_status track_access(mtl_ctx *c, mtl_exe *x, void *enc, const region *acc, size_t n) {
  int conflict = 0;
  for (size_t i = 0; i < n && !conflict; i++)
    for (size_t j = 0; j < x->npending && !conflict; j++) {
      const region *p = &x->pending[j];
      conflict = p->buf == acc[i].buf && p->lo < acc[i].hi && acc[i].lo < p->hi && (p->write || acc[i].write);
    }
  if (conflict) {
    c->d->barrier(enc);
    x->npending = 0;
  }
  if (!LM_GROW(x->pending, x->pendcap, x->npending + n)) return LM_ERR_NOMEM;
  for (size_t i = 0; i < n; i++)
    if (acc[i].hi > acc[i].lo) x->pending[x->npending++] = acc[i];
  return LM_OK;
}

/* Encodes one pass over the plan: step t of an unfused scan (t >= 0: per-step inputs and every
 * output offset to slice t), else the whole plan; `run` is RAND's run counter. */
static lm_status encode_plan(mtl_ctx *c, mtl_exe *x, void *enc, const lm_run_args *args, int64_t t, uint64_t run) {
  const lm_plan *plan = x->plan;
  const lm_layout *L = &x->layout;
  const lm_mtl_device *d = c->d;
  for (size_t i = 0; i < plan->nbufs; i++) {
    const lm_pbuf *b = &plan->bufs[i];
    size_t slice = t >= 0 ? (size_t)t * L->count[i] * sizeof(float) : 0;
    if (b->kind == LM_BUF_INPUT)
      x->bind[i] = (binding){((mtl_buf *)args->inputs[b->index])->buf,
                             x->per_step && x->per_step[b->index] ? slice : 0};
    else if (b->kind == LM_BUF_OUTPUT) x->bind[i] = (binding){((mtl_buf *)args->outputs[b->index])->buf, slice};
    else x->bind[i] = (binding){x->arena.buf, L->offset[i]};
  }
  uint64_t rng[2] = {args->seed, run};
  int64_t no_syms = 0;
  size_t nsyms = x->g->x.nsyms;
  const void *syms = nsyms ? (const void *)args->syms : (const void *)&no_syms;
  size_t sym_bytes = nsyms ? nsyms * sizeof(int64_t) : sizeof no_syms;
  region acc[LM_MSL_MAX_SLOTS];
  lm_status st;
  for (size_t i = 0; i < plan->nkernels; i++) {
    const lm_kernel *k = &plan->kernels[i];
    int64_t total = L->work[i];
    if (total <= 0) continue;
    if ((uint64_t)total > UINT32_MAX)
      return lm_fail(LM_ERR_UNSUPPORTED, "metal: kernel %.32s has %lld threads; the thread position is a uint", k->name,
                     (long long)total);
    for (size_t j = 0; j < k->nbufs; j++) {
      const binding *b = &x->bind[k->bufs[j]];
      acc[j] = (region){b->buf, b->offset, b->offset + L->count[k->bufs[j]] * sizeof(float), x->written[i][j]};
    }
    if ((st = track_access(c, x, enc, acc, k->nbufs)) != LM_OK) return st;
    d->set_kernel(enc, x->lib, i);
    for (size_t j = 0; j < k->nbufs; j++)
      d->set_buffer(enc, x->bind[k->bufs[j]].buf, x->bind[k->bufs[j]].offset, (uint32_t)j);
    d->set_bytes(enc, syms, sym_bytes, (uint32_t)k->nbufs);
    d->set_bytes(enc, rng, sizeof rng, (uint32_t)k->nbufs + 1);
    d->set_bytes(enc, &total, sizeof total, (uint32_t)k->nbufs + 2);
    d->dispatch(enc, (uint64_t)total, 0);
  }
  for (size_t i = 0; i < plan->ncopies; i++) { /* assigns, after every kernel, in order */
    const lm_copy *cp = &plan->copies[i];
    int64_t n = (int64_t)L->count[cp->dst];
    if (n <= 0) continue;
    const binding *dst = &x->bind[cp->dst], *src = &x->bind[cp->src];
    size_t bytes = (size_t)n * sizeof(float);
    acc[0] = (region){dst->buf, dst->offset, dst->offset + bytes, 1};
    acc[1] = (region){src->buf, src->offset, src->offset + bytes, 0};
    if ((st = track_access(c, x, enc, acc, 2)) != LM_OK) return st;
    d->set_kernel(enc, x->lib, plan->nkernels);
    d->set_buffer(enc, dst->buf, dst->offset, 0);
    d->set_buffer(enc, src->buf, src->offset, 1);
    d->set_bytes(enc, &n, sizeof n, 2);
    d->dispatch(enc, (uint64_t)n, 0);
  }
  return LM_OK;
}

static lm_status ensure_layout(mtl_ctx *c, mtl_exe *x, const int64_t *syms) {
  size_t ns = x->g->x.nsyms;
  if (x->have_layout && lm_layout_holds(&x->layout, x->layout_syms, syms, ns)) return LM_OK;
  lm_layout_free(&x->layout);
  x->have_layout = 0;
  lm_status st = lm_layout_compute(x->plan, syms, &x->layout);
  if (st != LM_OK) return st;
  if (ns) memcpy(x->layout_syms, syms, ns * sizeof *syms);
  x->have_layout = 1;
  if (!x->arena.buf || x->layout.arena_bytes > x->arena.bytes) {
    if (x->arena.buf) c->d->buffer_free(c->dev, x->arena.buf);
    x->arena = (mtl_buf){0};
    st = c->d->buffer_new(c->dev, x->layout.arena_bytes, &x->arena.buf, &x->arena.contents);
    if (st != LM_OK) return st;
    x->arena.bytes = x->layout.arena_bytes;
  }
  return LM_OK;
}

/* One run = one command buffer: the whole plan, or all T steps of a scan. */
static lm_status metal_run(void *ctx, void *p, const lm_run_args *args) {
  mtl_ctx *c = ctx;
  mtl_exe *x = p;
  lm_status st = ensure_layout(c, x, args->syms);
  if (st != LM_OK) return st;
  void *enc;
  if ((st = c->d->encoder_new(c->dev, &enc)) != LM_OK) return st;
  x->npending = 0;
  if (x->fused) {
    st = encode_plan(c, x, enc, args, -1, args->run * (uint64_t)args->syms[x->scan.sym_T]);
  } else if (x->scan.active) {
    int64_t T = args->syms[x->scan.sym_T];
    for (int64_t s = 0; s < T && st == LM_OK; s++) {
      int64_t t = x->scan.reverse ? T - 1 - s : s;
      st = encode_plan(c, x, enc, args, t, args->run * (uint64_t)T + (uint64_t)t);
    }
  } else {
    st = encode_plan(c, x, enc, args, -1, args->run);
  }
  lm_status fin = c->d->finish(enc, st == LM_OK, &x->gpu_seconds);
  return st != LM_OK ? st : fin;
}

static lm_status metal_stats(void *ctx, void *p, const int64_t *syms, lm_program_stats *out) {
  (void)ctx;
  mtl_exe *x = p;
  return lm_plan_stats(x->plan, &x->scan, x->fused, syms, out);
}

static lm_status metal_sync(void *ctx) {
  (void)ctx;
  return LM_OK; /* every run waits for its command buffer */
}

double lm_metal_last_gpu_seconds(const void *exe) { return exe ? ((const mtl_exe *)exe)->gpu_seconds : 0; }

const lm_backend_ops lm_backend_metal = {
    .name = "metal",
    .description = "MSL kernels on the system's Metal GPU (macOS), one command buffer per run",
    .open = metal_open,
    .close = metal_close,
    .alloc = metal_alloc,
    .release = metal_release,
    .write = metal_write,
    .read = metal_read,
    .fill_zero = metal_zero,
    .prepare = metal_prepare,
    .unprepare = metal_unprepare,
    .run = metal_run,
    .sync = metal_sync,
    .stats = metal_stats,
};

const lm_backend_ops lm_backend_metal_shim = {
    .name = "metal-shim",
    .description = "the metal backend's host code and MSL kernels, compiled as C++ and run on the CPU (for testing)",
    .open = metal_shim_open,
    .close = metal_close,
    .alloc = metal_alloc,
    .release = metal_release,
    .write = metal_write,
    .read = metal_read,
    .fill_zero = metal_zero,
    .prepare = metal_prepare,
    .unprepare = metal_unprepare,
    .run = metal_run,
    .sync = metal_sync,
    .stats = metal_stats,
};
