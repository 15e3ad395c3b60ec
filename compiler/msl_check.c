/* compiler/msl_check.c — Metal Shading Language checked on Linux (msl_check.h): the source the
 * metal backend compiles, Metal's limits read off the kernel signatures, the shim compile with
 * the system C++ compiler (run without a shell, cached on disk), and the emulated Metal device
 * that executes shim-compiled kernels on the CPU for the "metal-shim" backend. */
#include "msl_check.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cc.h"
#include "compile.h"
#include "msl_shim.h"
#include "render.h"

extern char **environ;

static const char copy_kernel[] =
    "\n/* plan copies (assigns): dst = src, one thread per element */\n"
    "kernel void " LM_MSL_COPY_ENTRY "(device float *dst [[buffer(0)]], const device float *src [[buffer(1)]], "
    "constant long &n [[buffer(2)]], uint tid [[thread_position_in_grid]]) {\n"
    "  if ((long)tid < n) dst[tid] = src[tid];\n"
    "}\n";

static const char contract_pragma[] = "#pragma METAL fp contract(off)";

/* The flags after the compiler's words; -I<shim folder> and the files follow. */
static const char *const cxx_flags[] = {"-x", "c++", "-std=c++17", "-O1", "-fPIC", "-shared",
                                        "-ffp-contract=off", "-fno-fast-math", "-fno-exceptions",
                                        "-fno-rtti", "-Wall", "-Wextra", "-Werror",
                                        "-Wno-unknown-pragmas", "-Wno-unused-function"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put_log(char *log, size_t cap, const char *s) {
  if (log && cap) snprintf(log, cap, "%s", s);
}

/* ---------------------------------------------------------------- the source */

char *lm_msl_plan_source(const lm_plan *p) {
  if (!p) {
    lm_fail(LM_ERR_INVALID, "msl: no plan");
    return NULL;
  }
  char entry[48];
  for (size_t i = 0; i < p->nkernels; i++)
    if (!strcmp(lm_render_entry_name(&p->kernels[i], entry, sizeof entry), LM_MSL_COPY_ENTRY)) {
      lm_fail(LM_ERR_INVALID, "msl: kernel %zu is named %s, the name of metal's copy kernel", i, entry);
      return NULL;
    }
  char *src = lm_render_plan(p, LM_DIALECT_MSL);
  if (!src) return NULL;
  lm_sb sb = {0};
  const char *after = strstr(src, "using namespace metal;\n");
  if (strstr(src, contract_pragma) || !after) {
    lm_sb_puts(&sb, src);
    if (!strstr(src, contract_pragma)) lm_sb_printf(&sb, "%s\n", contract_pragma);
  } else { /* the renderer's prelude lacks it: put it right after */
    after += strlen("using namespace metal;\n");
    lm_sb_printf(&sb, "%.*s%s /* added by the metal backend: no FMA contraction */\n%s", (int)(after - src), src,
                 contract_pragma, after);
  }
  lm_sb_puts(&sb, copy_kernel);
  lm_free(src);
  char *out = lm_sb_take(&sb);
  if (!out) lm_fail(LM_ERR_NOMEM, "msl: out of memory");
  return out;
}

/* ---------------------------------------------------------------- kernel signatures */

/* What a kernel parameter is. */
enum { P_BUFFER, P_GRID, P_LOCAL, P_GROUP, P_GROUP_SIZE };

typedef struct msl_kernel {
  char name[64];
  int slots;   /* [[buffer(j)]] parameters */
  int barrier; /* the body calls threadgroup_barrier */
  int uses_group; /* reads its position in or of a threadgroup */
  int nparams;
  uint8_t kind[LM_MSL_MAX_PARAMS]; /* P_* per parameter */
} msl_kernel;

typedef struct msl_info {
  msl_kernel *k;
  size_t n, cap;
  int max_slots;
  int barriers;
} msl_info;

static int is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static const struct {
  const char *attr;
  uint8_t kind;
} index_attrs[] = {
    {"[[thread_position_in_grid]]", P_GRID},          {"[[thread_position_in_threadgroup]]", P_LOCAL},
    {"[[thread_index_in_threadgroup]]", P_LOCAL},     {"[[threadgroup_position_in_grid]]", P_GROUP},
    {"[[threads_per_threadgroup]]", P_GROUP_SIZE},
};

/* Reads every `kernel void NAME(...)` at the start of a line: checks the buffer numbering and
 * the index parameters, notes barriers. LM_ERR_COMPILE with the problem in why. */
static lm_status scan_kernels(const char *src, msl_info *info, char *why, size_t cap) {
  static const char head[] = "kernel void ";
  memset(info, 0, sizeof *info);
  /* a barrier in a helper before the first kernel: every kernel may reach it */
  const char *first = strstr(src, "\nkernel void "), *any = strstr(src, "threadgroup_barrier(");
  int helper_barrier = any && (!first || any < first);
  for (const char *p = src; (p = strstr(p, head)); p++) {
    if (p != src && p[-1] != '\n') continue;
    const char *name = p + strlen(head), *e = name;
    while (is_ident(*e)) e++;
    if (e == name || *e != '(') {
      snprintf(why, cap, "a kernel declaration without a name: %.40s", p);
      return LM_ERR_COMPILE;
    }
    if (!LM_GROW(info->k, info->cap, info->n + 1)) return LM_ERR_NOMEM;
    msl_kernel *k = &info->k[info->n++];
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%.*s", (int)(e - name), name);
    if ((size_t)(e - name) >= sizeof k->name) {
      snprintf(why, cap, "kernel name %.40s... is too long", name);
      return LM_ERR_COMPILE;
    }
    /* parameters: split at top-level commas up to the matching ')' */
    int depth = 0, param = 0, tid = 0;
    const char *start = e + 1, *q = e + 1;
    for (;; q++) {
      if (!*q) {
        snprintf(why, cap, "kernel %s: unterminated parameter list", k->name);
        return LM_ERR_COMPILE;
      }
      if (*q == '(' || *q == '[') depth++;
      else if ((*q == ')' || *q == ']') && depth > 0) depth--;
      else if ((*q == ',' || *q == ')') && depth == 0) {
        char text[256];
        snprintf(text, sizeof text, "%.*s", (int)(q - start), start);
        const char *b = strstr(text, "[[buffer(");
        int kind = -1;
        for (size_t a = 0; a < LM_COUNTOF(index_attrs) && kind < 0; a++)
          if (strstr(text, index_attrs[a].attr)) kind = index_attrs[a].kind;
        if (param >= LM_MSL_MAX_PARAMS) {
          snprintf(why, cap, "kernel %s has more than %d parameters", k->name, LM_MSL_MAX_PARAMS);
          return LM_ERR_COMPILE;
        }
        if (b) {
          int slot = atoi(b + strlen("[[buffer("));
          if (slot != param) {
            snprintf(why, cap, "kernel %s: parameter %d is [[buffer(%d)]]: the ABI numbers buffers 0, 1, 2... in order",
                     k->name, param, slot);
            return LM_ERR_COMPILE;
          }
          k->slots++;
          kind = P_BUFFER;
        } else if (kind < 0 || !strstr(text, "uint ")) {
          snprintf(why, cap, "kernel %s: parameter %d (%s) is neither a buffer nor a uint thread index", k->name,
                   param, text);
          return LM_ERR_COMPILE;
        }
        tid |= kind == P_GRID || kind == P_LOCAL;
        k->uses_group |= kind == P_LOCAL || kind == P_GROUP || kind == P_GROUP_SIZE;
        k->kind[param] = (uint8_t)kind;
        k->nparams = ++param;
        start = q + 1;
        if (*q == ')') break;
      }
    }
    if (!tid) {
      snprintf(why, cap, "kernel %s has no thread position parameter ([[thread_position_in_grid]])", k->name);
      return LM_ERR_COMPILE;
    }
    if (k->slots > LM_MSL_MAX_SLOTS) {
      snprintf(why, cap, "kernel %s needs %d buffer slots; Metal has %d per kernel", k->name, k->slots,
               LM_MSL_MAX_SLOTS);
      return LM_ERR_COMPILE;
    }
    if (k->slots > info->max_slots) info->max_slots = k->slots;
    const char *next = strstr(q, "\nkernel void ");
    size_t body = next ? (size_t)(next - q) : strlen(q);
    const char *bar = strstr(q, "threadgroup_barrier(");
    k->barrier = helper_barrier || (bar && (size_t)(bar - q) < body);
    info->barriers += k->barrier;
  }
  return LM_OK;
}

/* ---------------------------------------------------------------- running the compiler */

static lm_status write_file(const char *path, const char *text) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) return lm_fail(LM_ERR_IO, "msl: cannot create %s: %s", tmp, strerror(errno));
  size_t n = strlen(text), done = 0;
  while (done < n) {
    ssize_t k = write(fd, text + done, n - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    done += (size_t)k;
  }
  int ok = done == n && close(fd) == 0;
  if (done != n) close(fd);
  if (ok && rename(tmp, path) == 0) return LM_OK;
  unlink(tmp);
  return lm_fail(LM_ERR_IO, "msl: cannot write %s", path);
}

static void read_file(lm_sb *sb, const char *path, size_t max) {
  FILE *f = fopen(path, "rb");
  if (!f) return;
  char buf[4096];
  size_t k, total = 0;
  while (total < max && (k = fread(buf, 1, sizeof buf - 1 < max - total ? sizeof buf - 1 : max - total, f)) > 0) {
    buf[k] = 0;
    lm_sb_puts(sb, buf);
    total += k;
  }
  fclose(f);
}

/* Runs argv (no shell) with output into log_path; *ok when it exited with status 0. */
static lm_status run_tool(char *const *argv, const char *log_path, double timeout_s, int *ok, char *what,
                          size_t what_cap) {
  *ok = 0;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&fa)) return lm_fail(LM_ERR_NOMEM, "msl: posix_spawn");
  if (posix_spawnattr_init(&attr)) {
    posix_spawn_file_actions_destroy(&fa);
    return lm_fail(LM_ERR_NOMEM, "msl: posix_spawn");
  }
  sigset_t none;
  sigemptyset(&none);
  int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!rc) rc = posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (!rc) rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  if (!rc) rc = posix_spawnattr_setpgroup(&attr, 0);
  if (!rc) rc = posix_spawnattr_setsigmask(&attr, &none);
  pid_t pid = -1;
  if (!rc) rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc) return lm_fail(LM_ERR_UNSUPPORTED, "cannot run '%s': %s", argv[0], strerror(rc));
  double deadline = now_s() + timeout_s;
  long sleep_ns = 200000;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      kill(-pid, SIGKILL);
      return lm_fail(LM_ERR_BACKEND, "msl: cannot wait for '%s': %s", argv[0], strerror(errno));
    }
    if (now_s() > deadline) {
      kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      snprintf(what, what_cap, "timed out after %g s", timeout_s);
      return LM_OK;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 5000000) sleep_ns *= 2;
  }
  if (WIFEXITED(status)) snprintf(what, what_cap, "exit status %d", WEXITSTATUS(status));
  else snprintf(what, what_cap, "killed by signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : -1);
  *ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return LM_OK;
}

/* The chosen C++ compiler, once per process. */
typedef struct cxx {
  char *words[16]; /* the command, NULL-terminated */
  int nwords;
  char version[256]; /* first line of --version */
  char dir[4096];    /* the cache folder: <trusted lumen cache>/msl (cc.h) */
  char shim_dir[4200];
  lm_cc_secret secret; /* the cache's key: the shim libraries are sealed with it */
  double timeout_s;
  lm_status st;
  char why[2048];
} cxx;

static pthread_mutex_t cxx_mu = PTHREAD_MUTEX_INITIALIZER;
static cxx the_cxx;
static int cxx_done;

static int split_words(cxx *c, const char *s) {
  c->nwords = 0;
  while (*s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t len = strcspn(s, " \t");
    if (len) {
      if (c->nwords + 1 >= (int)LM_COUNTOF(c->words)) return 0;
      char *w = lm_malloc(len + 1);
      if (!w) return 0;
      memcpy(w, s, len);
      w[len] = 0;
      c->words[c->nwords++] = w;
    }
    s += len;
  }
  c->words[c->nwords] = NULL;
  return c->nwords > 0;
}

static void free_words(cxx *c) {
  for (int i = 0; i < c->nwords; i++) lm_free(c->words[i]);
  c->nwords = 0;
  c->words[0] = NULL;
}

/* `cmd --version` runs: its first line identifies the compiler. */
static int probe(cxx *c, lm_sb *tried) {
  char log[4300];
  snprintf(log, sizeof log, "%s/probe-%ld.log", c->dir, (long)getpid());
  char *argv[20];
  int n = 0;
  for (int i = 0; i < c->nwords; i++) argv[n++] = c->words[i];
  argv[n++] = "--version";
  argv[n] = NULL;
  int ok = 0;
  char what[64] = "";
  lm_status st = run_tool(argv, log, 30, &ok, what, sizeof what);
  lm_sb out = {0};
  read_file(&out, log, 4000);
  unlink(log);
  if (st != LM_OK || !ok) {
    lm_sb_printf(tried, "%s%s: %s", tried->len ? "; " : "", c->words[0], st != LM_OK ? lm_last_error() : what);
    lm_sb_free(&out);
    return 0;
  }
  snprintf(c->version, sizeof c->version, "%.*s", out.s ? (int)strcspn(out.s, "\n") : 0, out.s ? out.s : "");
  lm_sb_free(&out);
  return 1;
}

/* The shim header on disk is used only if it is ours (lm_cc_file_open's checks) and holds exactly
 * lm_msl_shim_text; anything else is rewritten. */
static int shim_is_intact(const char *path) {
  int fd;
  if (lm_cc_file_open(path, &fd) != LM_OK || fd < 0) return 0;
  size_t n = strlen(lm_msl_shim_text), got = 0;
  char *buf = lm_malloc(n + 1);
  while (buf && got <= n) {
    ssize_t k = read(fd, buf + got, n + 1 - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  int same = buf && got == n && !memcmp(buf, lm_msl_shim_text, n);
  lm_free(buf);
  return same;
}

static void cxx_init(cxx *c) {
  c->timeout_s = 120;
  const char *tv = getenv("LUMEN_CC_TIMEOUT");
  if (tv && atof(tv) > 0) c->timeout_s = atof(tv);
  char *dir = NULL;
  if ((c->st = lm_cc_cache_open_dir(&dir, &c->secret)) != LM_OK) {
    snprintf(c->why, sizeof c->why, "%s", lm_last_error());
    return;
  }
  snprintf(c->dir, sizeof c->dir, "%s/msl", dir);
  lm_free(dir);
  if ((c->st = lm_cc_dir_make(c->dir)) != LM_OK) {
    snprintf(c->why, sizeof c->why, "%s", lm_last_error());
    return;
  }
  /* the shim, as the file `metal_stdlib`, in a folder named by its hash */
  uint64_t h = lm_hash_bytes(lm_msl_shim_text, sizeof lm_msl_shim_text, 0x5eed);
  snprintf(c->shim_dir, sizeof c->shim_dir, "%s/shim-%016llx", c->dir, (unsigned long long)h);
  char shim_path[4300];
  snprintf(shim_path, sizeof shim_path, "%s/metal_stdlib", c->shim_dir);
  if ((c->st = lm_cc_dir_make(c->shim_dir)) != LM_OK ||
      (!shim_is_intact(shim_path) && (c->st = write_file(shim_path, lm_msl_shim_text)) != LM_OK)) {
    snprintf(c->why, sizeof c->why, "%s", lm_last_error());
    return;
  }
  const char *env = getenv("LUMEN_CXX");
  static const char *const defaults[] = {"clang++", "g++", "c++"};
  lm_sb tried = {0};
  c->st = LM_ERR_UNSUPPORTED;
  size_t n = env && *env ? 1 : LM_COUNTOF(defaults);
  for (size_t i = 0; i < n && c->st != LM_OK; i++) {
    free_words(c);
    if (!split_words(c, env && *env ? env : defaults[i])) continue;
    if (probe(c, &tried)) c->st = LM_OK;
  }
  if (c->st != LM_OK) {
    free_words(c);
    snprintf(c->why, sizeof c->why,
             "no C++ compiler for the MSL shim%s; tried %s (install g++ or clang++, or set $LUMEN_CXX)",
             env && *env ? " ($LUMEN_CXX)" : "", tried.s ? tried.s : "nothing");
  }
  lm_sb_free(&tried);
}

static const cxx *cxx_get(void) {
  pthread_mutex_lock(&cxx_mu);
  if (!cxx_done) {
    cxx_init(&the_cxx);
    cxx_done = 1;
  }
  pthread_mutex_unlock(&cxx_mu);
  if (the_cxx.st != LM_OK) lm_fail(the_cxx.st, "%s", the_cxx.why);
  return the_cxx.st == LM_OK ? &the_cxx : NULL;
}

/* ---------------------------------------------------------------- building */

typedef void (*launch_fn)(void *const *slots, long start, long end);

typedef struct msl_so {
  lm_cc_lib *lib; /* loaded with lm_cc_lib_load: sealed, checked on the inode it maps */
  msl_info info;
  launch_fn *fn; /* per info.k */
} msl_so;

static void so_free(msl_so *so) {
  if (!so) return;
  lm_cc_lib_close(so->lib);
  lm_free(so->info.k);
  lm_free(so->fn);
  lm_free(so);
}

/* Checks and compiles msl (cached); with `load`, dlopens it and finds every launcher. The
 * summary or the problem goes to log. */
static lm_status build(const char *msl, int load, msl_so **out, char *log, size_t cap) {
  if (out) *out = NULL;
  if (!msl) return lm_fail(LM_ERR_INVALID, "msl: no source");
  msl_so *so = lm_calloc(1, sizeof *so);
  if (!so) return LM_ERR_NOMEM;
  char why[1024] = "";
  lm_status st = scan_kernels(msl, &so->info, why, sizeof why);
  if (st != LM_OK) {
    if (st == LM_ERR_COMPILE) {
      lm_fail(st, "msl: %s", why);
      put_log(log, cap, lm_last_error());
    }
    so_free(so);
    return st;
  }
  const cxx *c = cxx_get();
  if (!c) {
    put_log(log, cap, lm_last_error());
    so_free(so);
    return LM_ERR_UNSUPPORTED;
  }
  /* the translation unit: the MSL as rendered, the barrier hook, one launcher per kernel */
  lm_sb sb = {0};
  lm_sb_puts(&sb, msl);
  lm_sb_puts(&sb, "\n/* ---- lumen msl_check: the CPU launchers (not part of the Metal source) */\n"
                  "extern \"C\" {\nvoid (*lm_msl_barrier_hook)(void) = 0;\n");
  for (size_t i = 0; i < so->info.n; i++)
    lm_sb_printf(&sb, "void lm_msl_launch_%s(void *const *a, long s, long e) { lm_launch(%s, a, s, e); }\n",
                 so->info.k[i].name, so->info.k[i].name);
  lm_sb_puts(&sb, "}\n");
  char *text = lm_sb_take(&sb);
  if (!text) {
    so_free(so);
    return lm_fail(LM_ERR_NOMEM, "msl: out of memory");
  }
  uint64_t h[2] = {0x6d736c31u, 0x6c756d65u};
  for (int k = 0; k < 2; k++) {
    h[k] = lm_hash_bytes(lm_msl_shim_text, sizeof lm_msl_shim_text, h[k]);
    h[k] = lm_hash_bytes(text, strlen(text), h[k]);
    h[k] = lm_hash_bytes(c->version, strlen(c->version), h[k]);
    for (int i = 0; i < c->nwords; i++) h[k] = lm_hash_bytes(c->words[i], strlen(c->words[i]) + 1, h[k]);
    for (size_t i = 0; i < LM_COUNTOF(cxx_flags); i++)
      h[k] = lm_hash_bytes(cxx_flags[i], strlen(cxx_flags[i]) + 1, h[k]);
  }
  char base[4200], src[4300], lib[4300], tmp_lib[4300], logp[4300];
  if (snprintf(base, sizeof base, "%s/%016llx%016llx", c->dir, (unsigned long long)h[0], (unsigned long long)h[1]) >=
      (int)sizeof base - 16) { /* room for the suffixes below */
    st = lm_fail(LM_ERR_INVALID, "msl: the cache folder's path is too long: %s", c->dir);
    goto fail;
  }
  snprintf(src, sizeof src, "%s.cpp", base);
  snprintf(lib, sizeof lib, "%s.so", base);
  snprintf(logp, sizeof logp, "%s.log", base);
  snprintf(tmp_lib, sizeof tmp_lib, "%s.so.%ld", base, (long)getpid());
  double t0 = now_s();
  int cached = lm_cc_sealed_read(&c->secret, lib, NULL, NULL) == LM_OK; /* else (re)built */
  if (!cached) {
    if ((st = write_file(src, text)) != LM_OK) goto fail;
    char inc[4300];
    if (snprintf(inc, sizeof inc, "-I%s", c->shim_dir) >= (int)sizeof inc) {
      st = lm_fail(LM_ERR_INVALID, "msl: the shim folder's path is too long: %s", c->shim_dir);
      goto fail;
    }
    char *argv[48];
    int n = 0;
    for (int i = 0; i < c->nwords; i++) argv[n++] = c->words[i];
    for (size_t i = 0; i < LM_COUNTOF(cxx_flags); i++) argv[n++] = (char *)cxx_flags[i];
    argv[n++] = inc;
    argv[n++] = src;
    argv[n++] = "-o";
    argv[n++] = tmp_lib;
    argv[n] = NULL;
    char tmp_log[4400];
    snprintf(tmp_log, sizeof tmp_log, "%s.%ld", logp, (long)getpid());
    int ok = 0;
    char what[64] = "";
    if ((st = run_tool(argv, tmp_log, c->timeout_s, &ok, what, sizeof what)) != LM_OK) goto fail;
    if (!ok) {
      unlink(tmp_lib);
      rename(tmp_log, logp);
      lm_sb msg = {0};
      lm_sb_printf(&msg, "msl: the shim compile of %s failed (%s; %s; log %s):\n", src, c->words[0], what, logp);
      read_file(&msg, logp, 6000);
      char *m = lm_sb_take(&msg);
      st = lm_fail(LM_ERR_COMPILE, "%s", m ? m : "msl: the shim compile failed");
      lm_free(m);
      goto fail;
    }
    unlink(tmp_log);
    if ((st = lm_cc_seal_file(&c->secret, tmp_lib, lib)) != LM_OK) goto fail;
  }
  if (load) {
    if ((st = lm_cc_lib_load(&c->secret, lib, &so->lib)) != LM_OK) {
      char load_why[1024];
      snprintf(load_why, sizeof load_why, "%s", lm_last_error());
      if (st != LM_ERR_NOMEM) st = lm_fail(LM_ERR_COMPILE, "msl: cannot load %s: %s", lib, load_why);
      goto fail;
    }
    if (!(so->fn = lm_calloc(so->info.n + 1, sizeof *so->fn))) {
      st = LM_ERR_NOMEM;
      goto fail;
    }
    for (size_t i = 0; i < so->info.n; i++) {
      char sym[96];
      snprintf(sym, sizeof sym, "lm_msl_launch_%s", so->info.k[i].name);
      void *p = lm_cc_sym(so->lib, sym);
      if (!p) {
        st = lm_fail(LM_ERR_COMPILE, "msl: %s lacks %s", lib, sym);
        goto fail;
      }
      memcpy(&so->fn[i], &p, sizeof p);
    }
  }
  if (log && cap)
    snprintf(log, cap,
             "msl: %zu kernel%s (%d with threadgroup barriers), at most %d of %d buffer slots; compiled under the "
             "shim with %s (%s) -O1%s (%.2f s)",
             so->info.n, so->info.n == 1 ? "" : "s", so->info.barriers, so->info.max_slots, LM_MSL_MAX_SLOTS,
             c->words[0], c->version,
             cached ? ", cached" : "", now_s() - t0);
  lm_free(text);
  if (out) *out = so;
  else so_free(so);
  return LM_OK;
fail:
  put_log(log, cap, lm_last_error());
  lm_free(text);
  so_free(so);
  return st;
}

lm_status lm_msl_check_source(const char *msl, char *log, size_t cap) { return build(msl, 0, NULL, log, cap); }

lm_status lm_msl_check_plan(const lm_plan *p, char *log, size_t cap) {
  char *src = lm_msl_plan_source(p);
  if (!src) { /* a kernel the renderer refuses, or out of memory */
    put_log(log, cap, lm_last_error());
    return LM_ERR_INVALID;
  }
  lm_status st = build(src, 0, NULL, log, cap);
  lm_free(src);
  return st;
}

lm_status lm_msl_check_graph(const lm_graph_t *g, const char *T, int reverse, const char *const *per_step,
                             int n_per_step, char *log, size_t cap) {
  if (!g) return lm_fail(LM_ERR_INVALID, "msl: no graph");
  lm_status st = lm_graph_validate(g);
  if (st != LM_OK) {
    put_log(log, cap, lm_last_error());
    return st;
  }
  lm_graph_t *c = lm_graph_clone(g);
  uint8_t *per = c ? lm_calloc(c->ninputs + 1, 1) : NULL;
  if (!c || !per) {
    lm_graph_free(c);
    return LM_ERR_NOMEM;
  }
  lm_scan_info scan = {0};
  if (T) {
    int sym = lm_x_symbol(&c->x, T, 1);
    st = sym < 0 ? LM_ERR_NOMEM : LM_OK;
    for (int i = 0; i < n_per_step && st == LM_OK; i++) {
      size_t j = 0;
      while (j < c->ninputs && strcmp(c->inputs[j].name, per_step[i])) j++;
      if (j == c->ninputs) st = lm_fail(LM_ERR_INVALID, "msl: the step graph has no input named '%s'", per_step[i]);
      else per[j] = 1;
    }
    scan = (lm_scan_info){1, sym, reverse != 0, per};
  }
  lm_compiled comp = {0};
  if (st == LM_OK) st = lm_compile(c, &scan, &comp);
  if (st == LM_OK) st = lm_msl_check_plan(comp.plan, log, cap);
  else put_log(log, cap, lm_last_error());
  lm_compiled_free(&comp);
  lm_free(per);
  lm_graph_free(c);
  return st;
}

/* ---------------------------------------------------------------- the emulated device */

static atomic_llong n_cbufs, n_dispatch, n_barrier, n_threads;

void lm_msl_shim_counts_get(lm_msl_shim_counts *out) {
  out->command_buffers = atomic_load(&n_cbufs);
  out->dispatches = atomic_load(&n_dispatch);
  out->barriers = atomic_load(&n_barrier);
  out->threads = atomic_load(&n_threads);
}

enum { SLOTS = LM_MSL_MAX_PARAMS }; /* launcher arguments: buffers and thread indices */

typedef struct shim_cmd {
  int is_barrier;
  const msl_so *so;
  size_t entry;
  uint64_t threads;
  uint32_t group;
  void *slot[SLOTS];
} shim_cmd;

/* ---- threadgroups with barriers: one OS thread per work-item */

typedef struct tg_barrier {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int live, arrived;
  unsigned gen;
} tg_barrier;

static pthread_mutex_t group_mu = PTHREAD_MUTEX_INITIALIZER; /* one barrier kernel at a time */
static tg_barrier *active_barrier;

static void barrier_release(tg_barrier *b) {
  b->arrived = 0;
  b->gen++;
  pthread_cond_broadcast(&b->cv);
}

/* The shim's threadgroup_barrier: waits until every live work-item of the group arrives. */
static void barrier_wait(void) {
  tg_barrier *b = active_barrier;
  LM_ASSERT(b); /* only kernels the scan saw call threadgroup_barrier run with one */
  pthread_mutex_lock(&b->mu);
  unsigned gen = b->gen;
  if (++b->arrived == b->live) barrier_release(b);
  else
    while (gen == b->gen) pthread_cond_wait(&b->cv, &b->mu);
  pthread_mutex_unlock(&b->mu);
}

/* A work-item that returned no longer counts (Metal leaves that undefined; this does not hang). */
static void barrier_leave(tg_barrier *b) {
  pthread_mutex_lock(&b->mu);
  b->live--;
  if (b->arrived > 0 && b->arrived == b->live) barrier_release(b);
  pthread_mutex_unlock(&b->mu);
}

typedef struct work_item {
  launch_fn fn;
  void *slot[SLOTS];
  uint32_t index[P_GROUP_SIZE + 1]; /* per P_* kind */
  long gid;
  tg_barrier *b;
} work_item;

static void *work_item_main(void *arg) {
  work_item *w = arg;
  w->fn(w->slot, w->gid, w->gid + 1);
  if (w->b) barrier_leave(w->b);
  return NULL;
}

/* The slots of work-item gid of a kernel with group-size g: index parameters point at w->index. */
static void item_slots(work_item *w, const msl_kernel *k, void *const *slot, uint64_t gid, uint32_t g) {
  memcpy(w->slot, slot, sizeof(void *) * SLOTS);
  w->gid = (long)gid;
  w->index[P_LOCAL] = (uint32_t)(gid % g);
  w->index[P_GROUP] = (uint32_t)(gid / g);
  w->index[P_GROUP_SIZE] = g;
  for (int i = 0; i < k->nparams; i++)
    if (k->kind[i] != P_BUFFER) w->slot[i] = k->kind[i] == P_GRID ? NULL : &w->index[k->kind[i]];
}

/* Runs one dispatch: straight through when no thread needs its threadgroup, else per work-item
 * (whole groups of g, as dispatchThreadgroups runs them); with barriers, a thread per item. */
static lm_status run_dispatch(const shim_cmd *c) {
  const msl_kernel *k = &c->so->info.k[c->entry];
  launch_fn fn = c->so->fn[c->entry];
  uint32_t g = c->group ? c->group : LM_MSL_SHIM_GROUP;
  if (!k->barrier && !k->uses_group) {
    void *slot[SLOTS];
    memcpy(slot, c->slot, sizeof slot);
    for (int i = 0; i < k->nparams; i++)
      if (k->kind[i] != P_BUFFER) slot[i] = NULL; /* the position; no stale buffer pointer */
    fn(slot, 0, (long)c->threads);
    return LM_OK;
  }
  uint64_t groups = (c->threads + g - 1) / g;
  if (!k->barrier) {
    work_item w = {.fn = fn};
    for (uint64_t gid = 0; gid < groups * g; gid++) {
      item_slots(&w, k, c->slot, gid, g);
      fn(w.slot, w.gid, w.gid + 1);
    }
    return LM_OK;
  }
  work_item *items = lm_calloc(g, sizeof *items);
  pthread_t *th = lm_calloc(g, sizeof *th);
  if (!items || !th) {
    lm_free(items);
    lm_free(th);
    return LM_ERR_NOMEM;
  }
  lm_status st = LM_OK;
  pthread_mutex_lock(&group_mu);
  for (uint64_t grp = 0; grp < groups && st == LM_OK; grp++) {
    tg_barrier b = {.live = (int)g};
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    active_barrier = &b;
    uint32_t started = 0;
    for (; started < g; started++) {
      item_slots(&items[started], k, c->slot, grp * g + started, g);
      items[started].fn = fn;
      items[started].b = &b;
      if (pthread_create(&th[started], NULL, work_item_main, &items[started])) break;
    }
    if (started < g) { /* the others must not wait for work-items that never ran */
      st = lm_fail(LM_ERR_BACKEND, "metal-shim: cannot start %u threads for a threadgroup of %s", g, k->name);
      pthread_mutex_lock(&b.mu);
      b.live -= (int)(g - started);
      if (b.arrived > 0 && b.arrived == b.live) barrier_release(&b);
      pthread_mutex_unlock(&b.mu);
    }
    for (uint32_t i = 0; i < started; i++) pthread_join(th[i], NULL);
    active_barrier = NULL;
    pthread_cond_destroy(&b.cv);
    pthread_mutex_destroy(&b.mu);
  }
  pthread_mutex_unlock(&group_mu);
  lm_free(items);
  lm_free(th);
  return st;
}

typedef struct shim_enc {
  shim_cmd *cmd;
  size_t n, cap;
  void **blobs; /* set_bytes copies, freed at finish */
  size_t nblobs, blobcap;
  const msl_so *so; /* current kernel */
  size_t entry;
  void *slot[SLOTS];
  int failed;
} shim_enc;

static lm_status shim_open(void **dev) {
  const cxx *c = cxx_get();
  if (!c) return LM_ERR_UNSUPPORTED;
  *dev = (void *)c;
  return LM_OK;
}

static void shim_close(void *dev) { (void)dev; }

static lm_status shim_buffer_new(void *dev, size_t bytes, void **buf, void **contents) {
  (void)dev;
  *buf = *contents = lm_calloc(1, bytes ? bytes : 1);
  return *buf ? LM_OK : LM_ERR_NOMEM;
}

static void shim_buffer_free(void *dev, void *buf) {
  (void)dev;
  lm_free(buf);
}

static lm_status shim_library_new(void *dev, const char *msl, const char *const *entries, size_t n, void **lib) {
  (void)dev;
  msl_so *so = NULL;
  lm_status st = build(msl, 1, &so, NULL, 0);
  if (st != LM_OK) return st;
  /* entry i of the caller becomes index i: reorder the launchers */
  launch_fn *fn = lm_calloc(n + 1, sizeof *fn);
  msl_kernel *k = lm_calloc(n + 1, sizeof *k);
  if (!fn || !k) {
    lm_free(fn);
    lm_free(k);
    so_free(so);
    return LM_ERR_NOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    size_t j = 0;
    while (j < so->info.n && strcmp(so->info.k[j].name, entries[i])) j++;
    if (j == so->info.n) {
      lm_free(fn);
      lm_free(k);
      so_free(so);
      return lm_fail(LM_ERR_COMPILE, "msl: the library has no kernel named %s", entries[i]);
    }
    fn[i] = so->fn[j];
    k[i] = so->info.k[j];
  }
  lm_free(so->fn);
  lm_free(so->info.k);
  so->fn = fn;
  so->info.k = k;
  so->info.n = so->info.cap = n;
  void *hook = lm_cc_sym(so->lib, "lm_msl_barrier_hook");
  void (*wait)(void) = barrier_wait;
  if (hook) memcpy(hook, &wait, sizeof wait);
  *lib = so;
  return LM_OK;
}

static void shim_library_free(void *dev, void *lib) {
  (void)dev;
  so_free(lib);
}

static lm_status shim_encoder_new(void *dev, void **out) {
  (void)dev;
  shim_enc *e = lm_calloc(1, sizeof *e);
  *out = e;
  return e ? LM_OK : LM_ERR_NOMEM;
}

static void shim_set_kernel(void *enc, void *lib, size_t entry) {
  shim_enc *e = enc;
  e->so = lib;
  e->entry = entry;
}

static void shim_set_buffer(void *enc, void *buf, size_t offset, uint32_t slot) {
  shim_enc *e = enc;
  if (slot >= SLOTS) e->failed = 1;
  else e->slot[slot] = (char *)buf + offset;
}

static void shim_set_bytes(void *enc, const void *bytes, size_t n, uint32_t slot) {
  shim_enc *e = enc;
  void *copy = lm_malloc(n ? n : 1);
  if (!copy || slot >= SLOTS || !LM_GROW(e->blobs, e->blobcap, e->nblobs + 1)) {
    lm_free(copy);
    e->failed = 1;
    return;
  }
  memcpy(copy, bytes, n);
  e->blobs[e->nblobs++] = copy;
  e->slot[slot] = copy;
}

static shim_cmd *shim_push(shim_enc *e) {
  if (!LM_GROW(e->cmd, e->cap, e->n + 1)) {
    e->failed = 1;
    return NULL;
  }
  shim_cmd *c = &e->cmd[e->n++];
  memset(c, 0, sizeof *c);
  return c;
}

static void shim_dispatch(void *enc, uint64_t threads, uint32_t group) {
  shim_enc *e = enc;
  if (!e->so) {
    e->failed = 1;
    return;
  }
  shim_cmd *c = shim_push(e);
  if (!c) return;
  c->so = e->so;
  c->entry = e->entry;
  c->threads = threads;
  c->group = group;
  memcpy(c->slot, e->slot, sizeof c->slot);
}

static void shim_barrier(void *enc) {
  shim_cmd *c = shim_push(enc);
  if (c) c->is_barrier = 1;
}

/* Runs dispatches [a, b) last to first: a legal order for a concurrent encoder. */
static lm_status run_group(shim_enc *e, size_t a, size_t b) {
  for (size_t i = b; i-- > a;) {
    const shim_cmd *c = &e->cmd[i];
    const msl_kernel *k = &c->so->info.k[c->entry];
    if (c->threads + LM_MSL_SHIM_GROUP > UINT32_MAX)
      return lm_fail(LM_ERR_UNSUPPORTED, "metal-shim: kernel %s: %llu threads exceed a uint thread position", k->name,
                     (unsigned long long)c->threads);
    lm_status st = run_dispatch(c);
    if (st != LM_OK) return st;
    atomic_fetch_add(&n_dispatch, 1);
    atomic_fetch_add(&n_threads, (long long)c->threads);
  }
  return LM_OK;
}

static lm_status shim_finish(void *enc, int commit, double *gpu_seconds) {
  shim_enc *e = enc;
  double t0 = now_s();
  lm_status st = LM_OK;
  if (e->failed) st = lm_fail(LM_ERR_NOMEM, "metal-shim: encoding failed (out of memory or a bad slot)");
  else if (commit) {
    atomic_fetch_add(&n_cbufs, 1);
    size_t start = 0;
    for (size_t i = 0; i <= e->n && st == LM_OK; i++)
      if (i == e->n || e->cmd[i].is_barrier) {
        st = run_group(e, start, i);
        start = i + 1;
        if (i < e->n) atomic_fetch_add(&n_barrier, 1);
      }
  }
  if (gpu_seconds) *gpu_seconds = now_s() - t0;
  for (size_t i = 0; i < e->nblobs; i++) lm_free(e->blobs[i]);
  lm_free(e->blobs);
  lm_free(e->cmd);
  lm_free(e);
  return st;
}

const lm_mtl_device lm_mtl_device_shim = {
    .name = "metal-shim",
    .open = shim_open,
    .close = shim_close,
    .buffer_new = shim_buffer_new,
    .buffer_free = shim_buffer_free,
    .library_new = shim_library_new,
    .library_free = shim_library_free,
    .encoder_new = shim_encoder_new,
    .set_kernel = shim_set_kernel,
    .set_buffer = shim_set_buffer,
    .set_bytes = shim_set_bytes,
    .dispatch = shim_dispatch,
    .barrier = shim_barrier,
    .finish = shim_finish,
};
