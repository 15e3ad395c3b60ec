/* envs/plugin.c — envs from outside the tree. A plugin is one C file that ends with
 * LM_ENV_PLUGIN(spec): `lm_env_load("myenv.c")` compiles it with the system compiler against
 * lumen's headers into the kernel cache (once per source: the cpu backend's compiler, flags,
 * cache rules and seals apply), or loads a prebuilt "libmyenv.so" as given; the spec is then
 * checked (lm_env_validate) and registered, so every path that takes an env by name finds it.
 * The registry remembers where each plugin came from (its path and a hash of its bytes), which
 * checkpoints record so that eval, view and --resume can find the env again. */
#include <dlfcn.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc.h"
#include "core.h"
#include "lumen/env.h"

#ifndef LUMEN_BUILD_INCLUDE_DIR
#define LUMEN_BUILD_INCLUDE_DIR ""
#endif
#ifndef LUMEN_INSTALL_INCLUDE_DIR
#define LUMEN_INSTALL_INCLUDE_DIR ""
#endif
#ifndef LUMEN_INSTALL_BIN_TO_INCLUDE_DIR
#define LUMEN_INSTALL_BIN_TO_INCLUDE_DIR "../include"
#endif

enum { MAX_PLUGINS = 32, MAX_SOURCE = 1 << 20 };

typedef struct plugin {
  const lm_env_spec *spec;
  char path[PATH_MAX];
  char hash[17];
  lm_cc_lib *lib; /* a compiled .c (kept loaded) */
  void *handle;   /* a prebuilt .so (kept loaded) */
} plugin;

static plugin plugins[MAX_PLUGINS];
static int nplugins;
static pthread_mutex_t plugin_mu = PTHREAD_MUTEX_INITIALIZER;

int lm_env_is_path(const char *arg) {
  if (!arg || !*arg) return 0;
  size_t n = strlen(arg);
  return strchr(arg, '/') || (n > 2 && !strcmp(arg + n - 2, ".c")) || (n > 3 && !strcmp(arg + n - 3, ".so"));
}

/* The whole file (a regular file of at most `cap` bytes), NUL-terminated, or NULL with a message. */
static char *read_file(const char *path, size_t cap, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    lm_fail(LM_ERR_IO, "env plugin %s: cannot open it: %s", path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  char *buf = NULL;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) lm_fail(LM_ERR_INVALID, "env plugin %s: not a regular file", path);
  else if ((uint64_t)sb.st_size > cap)
    lm_fail(LM_ERR_INVALID, "env plugin %s: %lld bytes, over the limit of %zu", path, (long long)sb.st_size, cap);
  else if ((buf = lm_malloc((size_t)sb.st_size + 1))) {
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
      ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += (size_t)r;
    }
    buf[got] = 0;
    *len = got;
    if (got != (size_t)sb.st_size) {
      lm_fail(LM_ERR_IO, "env plugin %s: read %zu of %lld bytes", path, got, (long long)sb.st_size);
      lm_free(buf);
      buf = NULL;
    }
  }
  close(fd);
  return buf;
}

/* lumen's public headers for compiling a plugin: $LUMEN_INCLUDE_DIR, else those beside the
 * running program when it is an installed one (PREFIX/bin/rltrain -> PREFIX/include, wherever
 * the prefix was put), else the configured install prefix's, else the build tree's (whichever
 * holds lumen/env.h). */
static const char *include_dir(void) {
  static char beside[PATH_MAX];
  const char *e = getenv("LUMEN_INCLUDE_DIR");
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  beside[0] = 0;
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      snprintf(beside, sizeof beside, "%.3000s/%s", exe, LUMEN_INSTALL_BIN_TO_INCLUDE_DIR);
    }
  }
  const char *cands[4] = {e, beside, LUMEN_INSTALL_INCLUDE_DIR, LUMEN_BUILD_INCLUDE_DIR};
  for (int i = 0; i < 4; i++) {
    if (!cands[i] || !*cands[i]) continue;
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/lumen/env.h", cands[i]);
    if (access(probe, R_OK) == 0) return cands[i];
    if (i == 0) return NULL; /* an explicit LUMEN_INCLUDE_DIR that lacks the headers */
  }
  return NULL;
}

/* A hash of every header in inc/lumen: part of a plugin's cache key, so a plugin compiled
 * against other headers (an older lumen) is compiled again rather than loaded. */
static uint64_t headers_hash(const char *inc) {
  char dir[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s/lumen", inc);
  DIR *d = opendir(dir);
  uint64_t h = 0x48454144ull;
  if (!d) return h;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name), n = 0;
    if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
    char file[PATH_MAX + 300];
    snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
    char *text = read_file(file, MAX_SOURCE, &n);
    /* an order-free combination: readdir's order is not fixed */
    if (text) h += lm_hash_bytes(e->d_name, len, lm_hash_bytes(text, n, 0x48ull));
    lm_free(text);
  }
  closedir(d);
  return h;
}

static lm_status load_locked(const char *path, const lm_env_spec **out) {
  char real[PATH_MAX];
  if (!realpath(path, real)) return lm_fail(LM_ERR_IO, "env plugin %s: %s", path, strerror(errno));
  for (int i = 0; i < nplugins; i++)
    if (!strcmp(plugins[i].path, real)) { /* loaded already in this process */
      *out = plugins[i].spec;
      return LM_OK;
    }
  if (nplugins >= MAX_PLUGINS) return lm_fail(LM_ERR_INVALID, "env plugin %s: %d plugins loaded already", path, MAX_PLUGINS);
  size_t n = 0, plen = strlen(real);
  char *bytes = read_file(real, plen > 3 && !strcmp(real + plen - 3, ".so") ? (size_t)1 << 30 : MAX_SOURCE, &n);
  if (!bytes) return LM_ERR_INVALID;
  plugin *p = &plugins[nplugins];
  memset(p, 0, sizeof *p);
  snprintf(p->path, sizeof p->path, "%s", real);
  snprintf(p->hash, sizeof p->hash, "%016llx", (unsigned long long)lm_hash_bytes(bytes, n, 0x504C5547ull));
  lm_status st = LM_OK;
  void *entry = NULL;
  if (plen > 2 && !strcmp(real + plen - 2, ".c")) {
    const char *inc = include_dir();
    lm_cc *cc = NULL;
    if (!inc) st = lm_fail(LM_ERR_INVALID, "env plugin %s: lumen's headers (lumen/env.h) are not found; set "
                                           "LUMEN_INCLUDE_DIR to the folder that holds lumen/", path);
    else if ((st = lm_cc_open(&cc)) == LM_OK) {
      lm_sb src = {0}, flags = {0};
      lm_sb_printf(&src, "#line 1 \"%s\"\n%s", real, bytes); /* compiler messages name the user's file */
      lm_sb_printf(&flags, "-I%s -DLUMEN_HEADERS=0x%016llx", inc, (unsigned long long)headers_hash(inc));
      char *text = lm_sb_take(&src), *fl = lm_sb_take(&flags);
      st = text && fl ? lm_cc_build_ex(cc, text, fl, &p->lib) : LM_ERR_NOMEM;
      lm_free(text);
      lm_free(fl);
      lm_cc_close(cc);
      if (st == LM_OK) entry = lm_cc_sym(p->lib, "lm_env_plugin_v1");
    }
  } else {
    dlerror();
    if (!(p->handle = dlopen(real, RTLD_NOW | RTLD_LOCAL)))
      st = lm_fail(LM_ERR_INVALID, "env plugin %s: cannot load it: %s", path, dlerror());
    else entry = dlsym(p->handle, "lm_env_plugin_v1");
  }
  lm_free(bytes);
  if (st == LM_OK && !entry)
    st = lm_fail(LM_ERR_INVALID, "env plugin %s: no LM_ENV_PLUGIN(spec) in it (the symbol lm_env_plugin_v1 is missing)",
                 path);
  if (st == LM_OK) { /* the layout of lm_env_spec it was compiled against */
    void *abi_sym = p->lib ? lm_cc_sym(p->lib, "lm_env_plugin_abi") : dlsym(p->handle, "lm_env_plugin_abi");
    int abi = abi_sym ? ((int (*)(void))(uintptr_t)abi_sym)() : 0;
    if (abi != LM_ENV_ABI)
      st = lm_fail(LM_ERR_INVALID, "env plugin %s was built against another lumen's env.h (env ABI %#x, this lumen's "
                                   "%#x): build it again against these headers", path, (unsigned)abi,
                   (unsigned)LM_ENV_ABI);
  }
  const lm_env_spec *spec = NULL;
  if (st == LM_OK) {
    const lm_env_spec *(*get)(void) = (const lm_env_spec *(*)(void))(uintptr_t)entry;
    if (!(spec = get())) st = lm_fail(LM_ERR_INVALID, "env plugin %s: LM_ENV_PLUGIN gave no spec", path);
  }
  if (st == LM_OK) {
    char why[1024];
    if ((st = lm_env_register(spec)) != LM_OK) {
      snprintf(why, sizeof why, "%s", lm_last_error());
      st = lm_fail(st, "env plugin %s: %s", path, why);
    }
  }
  if (st != LM_OK) {
    if (p->lib) lm_cc_lib_close(p->lib);
    if (p->handle) dlclose(p->handle);
    return st;
  }
  p->spec = spec;
  nplugins++;
  *out = spec;
  return LM_OK;
}

lm_status lm_env_load(const char *path, const lm_env_spec **out) {
  if (!out) return lm_fail(LM_ERR_INVALID, "lm_env_load: out is NULL");
  *out = NULL;
  if (!path || !*path) return lm_fail(LM_ERR_INVALID, "lm_env_load: an empty path");
  pthread_mutex_lock(&plugin_mu);
  lm_status st = load_locked(path, out);
  pthread_mutex_unlock(&plugin_mu);
  return st;
}

lm_status lm_env_resolve(const char *name_or_path, const lm_env_spec **out) {
  if (!out) return lm_fail(LM_ERR_INVALID, "lm_env_resolve: out is NULL");
  if (lm_env_is_path(name_or_path)) return lm_env_load(name_or_path, out);
  *out = lm_env_find(name_or_path);
  return *out ? LM_OK : LM_ERR_INVALID;
}

int lm_env_origin(const lm_env_spec *env, char *path, size_t cap, char *hash, size_t hcap) {
  int found = 0;
  env = lm_env_base(env); /* a configured plugin env comes from its plugin */
  pthread_mutex_lock(&plugin_mu);
  for (int i = 0; i < nplugins && !found; i++)
    if (plugins[i].spec == env) {
      if (path) snprintf(path, cap, "%s", plugins[i].path);
      if (hash) snprintf(hash, hcap, "%s", plugins[i].hash);
      found = 1;
    }
  pthread_mutex_unlock(&plugin_mu);
  return found;
}
