/* compiler/nvrtc.c — NVRTC through dlopen (declared here, so no CUDA header is needed to build),
 * CUBIN compiles with their logs and the ptxas -v parser (the compile-only path of `rltrain
 * compile` is train/iteration.c). */
#include "nvrtc.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc.h"
#include "core.h"

/* ---------------------------------------------------------------- the loaded library */

typedef int nvrtc_result; /* nvrtcResult: 0 = NVRTC_SUCCESS */
typedef struct nvrtc_program_st *nvrtc_program;

typedef struct nvrtc_api {
  const char *(*GetErrorString)(nvrtc_result);
  nvrtc_result (*Version)(int *, int *);
  nvrtc_result (*CreateProgram)(nvrtc_program *, const char *, const char *, int, const char *const *,
                                const char *const *);
  nvrtc_result (*DestroyProgram)(nvrtc_program *);
  nvrtc_result (*CompileProgram)(nvrtc_program, int, const char *const *);
  nvrtc_result (*GetProgramLogSize)(nvrtc_program, size_t *);
  nvrtc_result (*GetProgramLog)(nvrtc_program, char *);
  nvrtc_result (*GetCUBINSize)(nvrtc_program, size_t *);
  nvrtc_result (*GetCUBIN)(nvrtc_program, char *);
  /* optional (NVRTC >= 11.2) */
  nvrtc_result (*GetNumSupportedArchs)(int *);
  nvrtc_result (*GetSupportedArchs)(int *);
} nvrtc_api;

struct lm_nvrtc {
  int unused;
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static nvrtc_api api;
static int loaded;
static char load_error[2048];
static char describe[256];
static int archs[64], narchs = -1; /* -1: NVRTC cannot list them */

/* dlsym into a function pointer (object pointer -> function pointer, as dlsym requires) */
static void load_sym(void *fn, size_t size, void *lib, const char *name, int required, lm_sb *missing) {
  void *p = dlsym(lib, name);
  LM_ASSERT(size == sizeof p);
  memcpy(fn, &p, sizeof p);
  if (!p && required) lm_sb_printf(missing, "%s%s", missing->len ? ", " : "", name);
}

static void load(void) {
  const char *candidates[8];
  size_t n = 0;
  const char *env = getenv("LUMEN_NVRTC");
  if (env && *env) candidates[n++] = env;
  else {
    candidates[n++] = "libnvrtc.so.13";
    candidates[n++] = "libnvrtc.so.12";
    candidates[n++] = "libnvrtc.so.11.2";
    candidates[n++] = "libnvrtc.so";
#ifdef LUMEN_CUDA_ROOT
    candidates[n++] = LUMEN_CUDA_ROOT "/lib64/libnvrtc.so";
#endif
    candidates[n++] = "/usr/local/cuda/lib64/libnvrtc.so";
  }
  lm_sb tried = {0};
  void *lib = NULL;
  const char *name = NULL;
  for (size_t i = 0; i < n && !lib; i++) {
    lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
    if (lib) name = candidates[i];
    else {
      const char *e = dlerror();
      lm_sb_printf(&tried, "%s%s (%s)", i ? "; " : "", candidates[i], e ? e : "not found");
    }
  }
  if (!lib) {
    snprintf(load_error, sizeof load_error, "no NVRTC: could not load %s%s", tried.s ? tried.s : "libnvrtc",
             env && *env ? " ($LUMEN_NVRTC)" : "; set LUMEN_NVRTC to its path");
    lm_sb_free(&tried);
    return;
  }
  lm_sb_free(&tried);
  lm_sb missing = {0};
#define REQ(field, name) load_sym(&api.field, sizeof api.field, lib, name, 1, &missing)
  REQ(GetErrorString, "nvrtcGetErrorString");
  REQ(Version, "nvrtcVersion");
  REQ(CreateProgram, "nvrtcCreateProgram");
  REQ(DestroyProgram, "nvrtcDestroyProgram");
  REQ(CompileProgram, "nvrtcCompileProgram");
  REQ(GetProgramLogSize, "nvrtcGetProgramLogSize");
  REQ(GetProgramLog, "nvrtcGetProgramLog");
  REQ(GetCUBINSize, "nvrtcGetCUBINSize");
  REQ(GetCUBIN, "nvrtcGetCUBIN");
#undef REQ
  load_sym(&api.GetNumSupportedArchs, sizeof api.GetNumSupportedArchs, lib, "nvrtcGetNumSupportedArchs", 0, &missing);
  load_sym(&api.GetSupportedArchs, sizeof api.GetSupportedArchs, lib, "nvrtcGetSupportedArchs", 0, &missing);
  if (missing.len) {
    snprintf(load_error, sizeof load_error, "no NVRTC: %s lacks %s (NVRTC 11.1 or newer is needed)", name,
             missing.s ? missing.s : "symbols");
    lm_sb_free(&missing);
    return; /* the library stays loaded: unloading a compiler can leave its threads behind */
  }
  lm_sb_free(&missing);
  int major = 0, minor = 0;
  api.Version(&major, &minor);
  snprintf(describe, sizeof describe, "NVRTC %d.%d (%s)", major, minor, name);
  int k = 0;
  if (api.GetNumSupportedArchs && api.GetSupportedArchs && api.GetNumSupportedArchs(&k) == 0 && k > 0 &&
      k <= (int)LM_COUNTOF(archs) && api.GetSupportedArchs(archs) == 0)
    narchs = k;
  loaded = 1;
}

lm_status lm_nvrtc_open(lm_nvrtc **out) {
  *out = NULL;
  pthread_once(&load_once, load);
  if (!loaded) return lm_fail(LM_ERR_UNSUPPORTED, "%s", load_error);
  lm_nvrtc *nv = lm_calloc(1, sizeof *nv);
  if (!nv) return LM_ERR_NOMEM;
  *out = nv;
  return LM_OK;
}

void lm_nvrtc_close(lm_nvrtc *nv) { lm_free(nv); }

const char *lm_nvrtc_describe(const lm_nvrtc *nv) { return nv ? describe : ""; }

int lm_nvrtc_supports(const lm_nvrtc *nv, int sm) {
  if (!nv || narchs < 0) return 1;
  for (int i = 0; i < narchs; i++)
    if (archs[i] == sm) return 1;
  return 0;
}

/* ---------------------------------------------------------------- compiling */

void lm_keep_compile_failure(const char *tool, const char *what, const char *target, const char *log,
                             const char *source, char *path, size_t cap) {
  uint64_t h = lm_hash_bytes(source, strlen(source), lm_hash_bytes(target, strlen(target), 0));
  /* the trusted cache directory, else a fresh file in /tmp (O_EXCL: never another user's file) */
  char *dir = NULL;
  lm_cc_secret unused;
  if (lm_cc_cache_open_dir(&dir, &unused) != LM_OK) dir = NULL;
  for (int i = dir ? 0 : 1; i < 2; i++) {
    int fd;
    if (i == 0) {
      snprintf(path, cap, "%s/%s-%016llx.txt", dir, tool, (unsigned long long)h);
      fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    } else {
      snprintf(path, cap, "/tmp/%s-%016llx-XXXXXX", tool, (unsigned long long)h);
      fd = mkstemp(path);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
      if (fd >= 0) close(fd);
      continue;
    }
    fprintf(f, "%s: compiling %s for %s failed\n\n---- log ----\n%s\n---- source ----\n%s", tool, what, target,
            log ? log : "", source);
    if (fclose(f) == 0) {
      lm_free(dir);
      return;
    }
  }
  lm_free(dir);
  snprintf(path, cap, "(no file could be written)");
}

/* The one checking funnel for NVRTC calls: names the call and NVRTC's error string. */
static lm_status nv_check(nvrtc_result r, const char *call, const char *what) {
  if (r == 0) return LM_OK;
  return lm_fail(LM_ERR_BACKEND, "NVRTC: %s failed for %s: %s (%d)", call, what, api.GetErrorString(r), r);
}
#define NV(call, what) nv_check((call), #call, (what))

/* ---- the CUBIN cache: <lumen cache dir>/nvrtc/<key>.cubin and .log, where key is a 128-bit hash
 * of (source, architecture, options, NVRTC identity); LUMEN_NVRTC_CACHE=0 turns it off. Only the
 * trusted cache directory is used, and both files are sealed with its key (cc.h): a CUBIN that is
 * missing, fails its seal or is not ours is compiled again and rewritten. */

/* The cache folder (and its key), or 0 when the cache is off or cannot be trusted. */
static int cache_dir(char *buf, size_t cap, lm_cc_secret *secret) {
  const char *v = getenv("LUMEN_NVRTC_CACHE");
  if (v && !strcmp(v, "0")) return 0;
  char *dir = NULL;
  if (lm_cc_cache_open_dir(&dir, secret) != LM_OK) return 0;
  int n = snprintf(buf, cap, "%s/nvrtc", dir);
  lm_free(dir);
  return n > 0 && (size_t)n < cap && lm_cc_dir_make(buf) == LM_OK;
}

lm_status lm_nvrtc_compile(lm_nvrtc *nv, const char *source, const char *what, const char *arch, lm_cubin *out) {
  memset(out, 0, sizeof *out);
  if (!nv || !loaded) return lm_fail(LM_ERR_INVALID, "lm_nvrtc_compile: NVRTC is not open");
  char opt_arch[64];
  snprintf(opt_arch, sizeof opt_arch, "--gpu-architecture=%s", arch);
  const char *opts[] = {opt_arch, "--fmad=false", "-default-device", "--ptxas-options=-v"};
  uint64_t h0 = lm_hash_bytes(describe, strlen(describe), 0x6e7672746331ull), h1 = ~h0;
  for (size_t i = 0; i < LM_COUNTOF(opts); i++) {
    h0 = lm_hash_bytes(opts[i], strlen(opts[i]) + 1, h0);
    h1 = lm_hash_bytes(opts[i], strlen(opts[i]) + 1, h1 ^ 0x9e3779b97f4a7c15ull);
  }
  h0 = lm_hash_bytes(source, strlen(source), h0);
  h1 = lm_hash_bytes(source, strlen(source), h1);
  char dir[4096], cubin_path[4200], log_path[4200];
  lm_cc_secret secret;
  int cached = cache_dir(dir, sizeof dir, &secret);
  if (cached) {
    snprintf(cubin_path, sizeof cubin_path, "%s/%016llx%016llx.cubin", dir, (unsigned long long)h0,
             (unsigned long long)h1);
    snprintf(log_path, sizeof log_path, "%s/%016llx%016llx.log", dir, (unsigned long long)h0,
             (unsigned long long)h1);
    size_t log_size = 0;
    char *data = NULL, *log = NULL;
    if (lm_cc_sealed_read(&secret, cubin_path, &data, &out->size) == LM_OK &&
        lm_cc_sealed_read(&secret, log_path, &log, &log_size) == LM_OK) {
      out->data = data;
      out->log = log;
      return LM_OK;
    }
    lm_free(data);
    lm_free(log);
    memset(out, 0, sizeof *out);
  }
  nvrtc_program prog = NULL;
  lm_status st = NV(api.CreateProgram(&prog, source, what, 0, NULL, NULL), what);
  if (st != LM_OK) return st;
  nvrtc_result cr = api.CompileProgram(prog, (int)LM_COUNTOF(opts), opts);
  size_t log_size = 0;
  if ((st = NV(api.GetProgramLogSize(prog, &log_size), what)) != LM_OK) goto done;
  st = LM_ERR_NOMEM;
  if (!(out->log = lm_calloc(log_size + 1, 1))) goto done;
  if ((st = NV(api.GetProgramLog(prog, out->log), what)) != LM_OK) goto done;
  if (cr != 0) {
    char path[4200];
    lm_keep_compile_failure("nvrtc", what, arch, out->log, source, path, sizeof path);
    st = lm_fail(LM_ERR_COMPILE,
                 "NVRTC could not compile %s for %s (%s): whole log and source in %s\n---- log ----\n%s\n"
                 "---- source ----\n%s",
                 what, arch, api.GetErrorString(cr), path, out->log, source);
    goto done;
  }
  if ((st = NV(api.GetCUBINSize(prog, &out->size), what)) != LM_OK) goto done;
  st = LM_ERR_NOMEM;
  if (!(out->data = lm_malloc(out->size ? out->size : 1))) goto done;
  st = NV(api.GetCUBIN(prog, out->data), what);
  if (st == LM_OK && cached) { /* the log first: a reader needs both, and checks both */
    lm_cc_sealed_write(&secret, log_path, out->log, strlen(out->log));
    lm_cc_sealed_write(&secret, cubin_path, out->data, out->size);
  }
done:
  api.DestroyProgram(&prog);
  if (st != LM_OK) lm_cubin_free(out);
  return st;
}

void lm_cubin_free(lm_cubin *c) {
  if (!c) return;
  lm_free(c->data);
  lm_free(c->log);
  memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- ptxas -v */

/* The number before `unit` on the line starting at p (up to its end), or -1. */
static int number_before(const char *p, const char *end, const char *unit) {
  size_t ul = strlen(unit);
  for (const char *q = p; q + ul <= end; q++) {
    if (strncmp(q, unit, ul)) continue;
    const char *d = q;
    while (d > p && d[-1] == ' ') d--;
    const char *s = d;
    while (s > p && s[-1] >= '0' && s[-1] <= '9') s--;
    if (s == d) continue;
    return atoi(s);
  }
  return -1;
}

/* ptxas -v prints, per entry function:
 *   ptxas info    : Compiling entry function 'NAME' for 'sm_90'
 *   ptxas info    : Function properties for NAME
 *       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 24 registers, used 0 barriers, 384 bytes cmem[0]  */
lm_status lm_ptxas_info_parse(const char *log, const char *entry, lm_ptxas_info *out) {
  *out = (lm_ptxas_info){-1, -1, -1, -1, -1};
  if (!log || !entry) return lm_fail(LM_ERR_INVALID, "ptxas info: no log");
  char head[160];
  snprintf(head, sizeof head, "Compiling entry function '%s'", entry);
  const char *p = strstr(log, head);
  if (!p) return lm_fail(LM_ERR_INVALID, "ptxas info: the log has no entry function '%s'", entry);
  p += strlen(head);
  /* this entry's lines run to the next "Compiling entry function" */
  const char *stop = strstr(p, "Compiling entry function");
  if (!stop) stop = p + strlen(p);
  for (const char *line = p; line < stop;) {
    const char *eol = memchr(line, '\n', (size_t)(stop - line));
    if (!eol) eol = stop;
    int v;
    if ((v = number_before(line, eol, "bytes stack frame")) >= 0) out->stack_bytes = v;
    if ((v = number_before(line, eol, "bytes spill stores")) >= 0) out->spill_stores = v;
    if ((v = number_before(line, eol, "bytes spill loads")) >= 0) out->spill_loads = v;
    if ((v = number_before(line, eol, "bytes smem")) >= 0) out->shared_bytes = v;
    if ((v = number_before(line, eol, "registers")) >= 0 && strstr(line, "Used") && strstr(line, "Used") < eol)
      out->registers = v;
    line = eol + 1;
  }
  if (out->registers < 0) return lm_fail(LM_ERR_INVALID, "ptxas info: no register count for '%s'", entry);
  if (out->stack_bytes < 0) out->stack_bytes = 0; /* ptxas omits the properties line for trivial kernels */
  if (out->spill_stores < 0) out->spill_stores = 0;
  if (out->spill_loads < 0) out->spill_loads = 0;
  if (out->shared_bytes < 0) out->shared_bytes = 0;
  return LM_OK;
}
