/* compiler/cc.c — the system C compiler for the cpu backend: choosing and probing a compiler,
 * running it without a shell (posix_spawnp, output to a log file, time-out kills its process
 * group), the on-disk cache of kernel shared objects, and dlopen. It also owns the cache's trust:
 * the directory checks, the per-user key file, the SipHash seal every cached object carries and
 * the load that checks it on the very inode it maps (rules in cc.h). Rebuilds are not printed:
 * they are counted (lm_cc_rebuild_count) and the last one is kept as lm_cc_notice(). */
#include "cc.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
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

#include "core.h"

extern char **environ;

/* Default flags, and why (measured with clang 14.0.6 and gcc 12.2 on glibc 2.36, AVX2 host):
 * - -fno-math-errno: without it sinf/expf/logf may set errno, so neither compiler treats them as
 *   pure and no loop calling them vectorises. It changes no result: NaN and inf stay as in libm.
 * - -fveclib=libmvec (clang) + -lmvec: clang then vectorises sinf, cosf, expf, logf, powf loops
 *   with glibc's SIMD variants (_ZGVdN8v_sinf on AVX2; clang 14 knows no _ZGVeN16v AVX-512 names,
 *   and has no mapping for tanhf). No -ffast-math: it is needed only to vectorise reductions
 *   (reassociation) and min/max (nnan), and those must stay bitwise like the reference
 *   interpreter. gcc needs no -fveclib: it uses libmvec where a declaration carries
 *   __attribute__((simd)) (glibc's headers add it only under -ffast-math), so the renderer may
 *   declare those itself; -lmvec lets such code link. The libmvec variants differ from scalar libm
 *   by up to 2 (sinf), 3 (expf), 4 (logf) ulp, in 10-50% of elements, so a kernel's result depends
 *   on which elements take the vector path: split work at multiples of 64 elements to keep
 *   results independent of the thread count.
 * - -mprefer-vector-width=512: on a host with AVX-512 both compilers otherwise keep to 256-bit
 *   vectors; the jammed register tiles (compiler/jam.c) fill 512-bit ones. MinAtar Breakout's
 *   PPO trained at 11.9k against 9.4k env steps/s on a Xeon with AVX-512 (the same bits), CartPole's
 *   1.5% faster; without AVX-512 the flag changes nothing.
 * - -ffp-contract=off: clang's default fuses a*b+c into an FMA, which rounds once; the reference
 *   rounds the product. Measured on random data: a*b+c near cancellation differed in 99.97% of
 *   elements, and a*b - a*b came out nonzero in 99.99%. gcc -std=c11 already defaults to off.
 *   A kernel that wants an FMA calls fmaf() explicitly (and the reference does the same).
 * - -mllvm -licm-mssa-optimization-cap=1 (clang): loop-invariant code motion gives up sooner on
 *   big loops. In a fused rollout's lane form a 64x64 layer's lane loop reads 512 weights that do
 *   not change across its lanes; LICM hoisted them out of the loop, where the vectoriser turned
 *   each into a 64-byte broadcast kept on the stack (379 stack stores and 379 stack-operand
 *   multiplies per 8 outputs), where left in the loop each is an embedded broadcast operand
 *   (vmulps m32{1to16}). It changes no result (code motion only). Measured on a 2-core Zen 4
 *   EPYC, interleaved against the list without it: rlbench's CartPole rollout (4096 envs, 64x64
 *   MLP) 1.08-1.33x on one thread (4 pairs), 1.14-1.26x on two, MinAtar Breakout's CNN rollout
 *   1.04-1.07x; `rltrain cartpole` 1.02-1.10x (4 pairs); the update's and MinAtar's env kernels
 *   compile to the same code, the rollout's twice as fast (0.8 s against 1.65 s). Clangs
 *   without the option fall back to the next list.
 * Each list is tried in order; the plain one serves systems without libmvec. */
static const char *const flags_clang[] = {
    "-std=c11 -O3 -march=native -mprefer-vector-width=512 -fPIC -shared -fno-math-errno -ffp-contract=off "
    "-fveclib=libmvec -mllvm -licm-mssa-optimization-cap=1 -lmvec -lm",
    "-std=c11 -O3 -march=native -mprefer-vector-width=512 -fPIC -shared -fno-math-errno -ffp-contract=off "
    "-fveclib=libmvec -lmvec -lm",
    "-std=c11 -O3 -march=native -fPIC -shared -fno-math-errno -ffp-contract=off -lm",
    NULL};
static const char *const flags_gcc[] = {
    "-std=c11 -O3 -march=native -mprefer-vector-width=512 -fPIC -shared -fno-math-errno -ffp-contract=off -lmvec -lm",
    "-std=c11 -O3 -march=native -fPIC -shared -fno-math-errno -ffp-contract=off -lm", NULL};
static const char *const flags_other[] = {"-std=c11 -O2 -fPIC -shared -lm", NULL};
static const char *const flags_mandatory = "-fPIC -shared"; /* appended to $LUMEN_CFLAGS */
static const char *const default_compilers[] = {"clang", "gcc", "cc"};
enum { FAMILY_OTHER, FAMILY_CLANG, FAMILY_GCC };

static const char probe_source[] =
    "#include <math.h>\n"
    "const char lm_cc_probe_version[] = __VERSION__;\n"
    "#if defined(__clang__)\n"
    "const int lm_cc_probe_family = 1;\n"
    "#elif defined(__GNUC__)\n"
    "const int lm_cc_probe_family = 2;\n"
    "#else\n"
    "const int lm_cc_probe_family = 0;\n"
    "#endif\n"
    "void lm_cc_probe(float *restrict o, const float *restrict a, int n) {\n"
    "  for (int i = 0; i < n; i++) o[i] = sinf(a[i]) + expf(a[i]);\n"
    "}\n";

#define DEFAULT_TIMEOUT_S 120.0
#define REASON_MAX 600 /* characters of compiler output quoted per failed probe */

static atomic_llong compile_count;
int64_t lm_cc_compile_count(void) { return (int64_t)atomic_load(&compile_count); }

/* ---- words: a command line split on blanks -------------------------------------------------- */

typedef struct words {
  char **v;
  size_t n, cap;
} words;

static void words_free(words *w) {
  for (size_t i = 0; i < w->n; i++) lm_free(w->v[i]);
  lm_free(w->v);
  *w = (words){0};
}

static int words_add(words *w, const char *s, size_t len) {
  if (!LM_GROW(w->v, w->cap, w->n + 2)) return 0; /* room for a NULL terminator */
  char *d = lm_malloc(len + 1);
  if (!d) return 0;
  memcpy(d, s, len);
  d[len] = 0;
  w->v[w->n++] = d;
  w->v[w->n] = NULL;
  return 1;
}

static int words_split(words *w, const char *s) {
  while (*s) {
    while (*s == ' ' || *s == '\t' || *s == '\n') s++;
    size_t len = strcspn(s, " \t\n");
    if (len && !words_add(w, s, len)) return 0;
    s += len;
  }
  return 1;
}

static void words_join(lm_sb *b, const words *w) {
  for (size_t i = 0; i < w->n; i++) lm_sb_printf(b, "%s%s", i ? " " : "", w->v[i]);
}

/* ---- files ---------------------------------------------------------------------------------- */

static char *path_printf(const char *fmt, ...) LM_PRINTF(1, 2);
static char *path_printf(const char *fmt, ...) {
  lm_sb b = {0};
  va_list ap;
  va_start(ap, fmt);
  lm_sb_vprintf(&b, fmt, ap);
  va_end(ap);
  char *s = lm_sb_take(&b);
  if (!s) lm_fail(LM_ERR_NOMEM, "out of memory building a path");
  return s;
}

static int write_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t k = write(fd, s, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return 0;
    s += k;
    n -= (size_t)k;
  }
  return 1;
}

/* Writes `text` to `path` so that readers see the old file or the whole new one. */
static lm_status write_file_atomic(const char *path, const char *text) {
  char *tmp = path_printf("%s.XXXXXX", path);
  if (!tmp) return LM_ERR_NOMEM;
  int fd = mkstemp(tmp);
  if (fd < 0) {
    lm_status st = lm_fail(LM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    lm_free(tmp);
    return st;
  }
  int ok = write_all(fd, text, strlen(text));
  int err = errno;
  if (close(fd) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  lm_status st = LM_OK;
  if (!ok) {
    unlink(tmp);
    st = lm_fail(LM_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  lm_free(tmp);
  return st;
}

/* Appends the contents of `path` to `b` (nothing if it cannot be read). */
static void read_file_into(lm_sb *b, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof buf - 1, f)) > 0) {
    buf[k] = 0;
    lm_sb_puts(b, buf);
  }
  fclose(f);
}

/* ---- the trusted cache directory (the rules are in cc.h) ------------------------------------ */

static pthread_mutex_t notice_mu = PTHREAD_MUTEX_INITIALIZER;
static char notice_text[1200];
static atomic_llong rebuild_count;

static void notice(const char *fmt, ...) LM_PRINTF(1, 2);
static void notice(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&notice_mu);
  vsnprintf(notice_text, sizeof notice_text, fmt, ap);
  pthread_mutex_unlock(&notice_mu);
  va_end(ap);
}

const char *lm_cc_notice(void) {
  static _Thread_local char buf[sizeof notice_text];
  pthread_mutex_lock(&notice_mu);
  memcpy(buf, notice_text, sizeof buf);
  pthread_mutex_unlock(&notice_mu);
  return buf;
}

int64_t lm_cc_rebuild_count(void) { return (int64_t)atomic_load(&rebuild_count); }

/* Fails unless `sb` (of `path`, described as `what`) is owned by us and not group/world
 * writable; `fix` ends the message. */
static lm_status check_owner_mode(const char *what, const char *path, const struct stat *sb,
                                  const char *fix) {
  unsigned long me = (unsigned long)geteuid();
  if ((unsigned long)sb->st_uid != me)
    return lm_fail(LM_ERR_CORRUPT,
                   "%s %s is owned by uid %lu, not by this process's uid %lu, so lumen will not "
                   "use it (another user could plant code there); %s",
                   what, path, (unsigned long)sb->st_uid, me, fix);
  if (sb->st_mode & (S_IWGRP | S_IWOTH))
    return lm_fail(LM_ERR_CORRUPT,
                   "%s %s is writable by %s (mode %04o), so lumen will not use it (they could "
                   "plant code there); run 'chmod go-w %s', or %s",
                   what, path, (sb->st_mode & S_IWGRP) && (sb->st_mode & S_IWOTH) ? "group and others"
                               : sb->st_mode & S_IWGRP ? "its group" : "others",
                   (unsigned)(sb->st_mode & 07777), path, fix);
  return LM_OK;
}

static const char dir_fix[] = "set LUMEN_CACHE_DIR to a directory of your own";

/* The trust check of an existing directory: lstat (a link is refused), then open it with
 * O_NOFOLLOW and check the same inode through the descriptor. */
static lm_status dir_check(const char *dir) {
  struct stat ls, fs;
  if (lstat(dir, &ls) != 0)
    return lm_fail(LM_ERR_IO, "the cache directory %s: %s", dir, strerror(errno));
  if (S_ISLNK(ls.st_mode))
    return lm_fail(LM_ERR_CORRUPT,
                   "the cache directory %s is a symbolic link; lumen uses only a real directory "
                   "(a link can be redirected): %s, or replace the link by a directory",
                   dir, dir_fix);
  if (!S_ISDIR(ls.st_mode))
    return lm_fail(LM_ERR_IO, "the cache directory %s is not a directory; %s", dir, dir_fix);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return lm_fail(LM_ERR_IO, "the cache directory %s: %s", dir, strerror(errno));
  int ok = fstat(fd, &fs) == 0;
  close(fd);
  if (!ok || fs.st_dev != ls.st_dev || fs.st_ino != ls.st_ino)
    return lm_fail(LM_ERR_CORRUPT, "the cache directory %s changed while it was checked", dir);
  lm_status st = check_owner_mode("the cache directory", dir, &fs, dir_fix);
  if (st != LM_OK) return st;
  if (access(dir, W_OK | X_OK) != 0)
    return lm_fail(LM_ERR_IO, "the cache directory %s is not writable: %s", dir, strerror(errno));
  return LM_OK;
}

/* mkdir -p with mode 0700; every component created here, and `dir` itself, is checked. Existing
 * parents are taken as they are (a ~/.cache that is a link to another disk is fine). */
lm_status lm_cc_dir_make(const char *dir) {
  if (!dir || !*dir) return lm_fail(LM_ERR_INVALID, "lm_cc_dir_make: no directory");
  char *p = lm_strdup(dir);
  if (!p) return lm_fail(LM_ERR_NOMEM, "out of memory");
  for (size_t len = strlen(p); len > 1 && p[len - 1] == '/';) p[--len] = 0; /* "d/" follows a link */
  lm_status st = LM_OK;
  for (char *s = p + 1; st == LM_OK; s++) {
    if (*s != '/' && *s) continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0700) == 0) {
      if (c) st = dir_check(p); /* ours by construction, unless someone raced us */
    } else if (errno != EEXIST) {
      st = lm_fail(LM_ERR_IO, "cannot create the cache directory %s: %s", p, strerror(errno));
    }
    *s = c;
    if (!c) break;
  }
  if (st == LM_OK) st = dir_check(p);
  lm_free(p);
  return st;
}

/* Opens `path` read-only without following a link and checks it is a regular file of ours;
 * `strict` also refuses group/world-writable files. *missing is set for ENOENT. */
static int open_checked(const char *path, int strict, struct stat *sb, int *missing,
                        lm_status *st) {
  *missing = 0;
  *st = LM_OK;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) *missing = 1;
    *st = err == ELOOP ? lm_fail(LM_ERR_CORRUPT, "%s is a symbolic link", path)
          : lm_fail(err == ENOENT ? LM_ERR_IO : LM_ERR_CORRUPT, "cannot open %s: %s", path,
                    strerror(err));
    return -1;
  }
  if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode))
    *st = lm_fail(LM_ERR_CORRUPT, "%s is not a regular file", path);
  else if (strict)
    *st = check_owner_mode("the cache file", path, sb, "remove it and lumen writes it anew");
  else if (sb->st_uid != geteuid())
    *st = lm_fail(LM_ERR_CORRUPT, "the cache file %s is owned by uid %lu, not by uid %lu", path,
                  (unsigned long)sb->st_uid, (unsigned long)geteuid());
  if (*st != LM_OK) {
    close(fd);
    return -1;
  }
  return fd;
}

lm_status lm_cc_file_open(const char *path, int *fd) {
  *fd = -1;
  struct stat sb;
  int missing;
  lm_status st;
  *fd = open_checked(path, 1, &sb, &missing, &st);
  return missing ? LM_OK : st;
}

/* Reads what is left of fd (sb->st_size bytes expected) into a NUL-terminated buffer. */
static lm_status read_fd(int fd, const char *path, const struct stat *sb, char **data,
                         size_t *n) {
  *data = NULL;
  *n = 0;
  if (sb->st_size < 0 || (uint64_t)sb->st_size > ((uint64_t)1 << 31))
    return lm_fail(LM_ERR_CORRUPT, "%s is too large for a cache file", path);
  size_t size = (size_t)sb->st_size, got = 0;
  char *buf = lm_malloc(size + 1);
  if (!buf) return LM_ERR_NOMEM;
  while (got < size) {
    ssize_t k = pread(fd, buf + got, size - got, (off_t)got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  if (got != size) {
    lm_free(buf);
    return lm_fail(LM_ERR_CORRUPT, "%s: short read (%zu of %zu bytes)", path, got, size);
  }
  buf[size] = 0;
  *data = buf;
  *n = size;
  return LM_OK;
}

/* ---- the key file and the seal -------------------------------------------------------------- */

static uint64_t load64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static void store64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t rotl64(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

#define SIP_ROUND                                                                               \
  do {                                                                                          \
    v0 += v1, v1 = rotl64(v1, 13), v1 ^= v0, v0 = rotl64(v0, 32);                              \
    v2 += v3, v3 = rotl64(v3, 16), v3 ^= v2;                                                   \
    v0 += v3, v3 = rotl64(v3, 21), v3 ^= v0;                                                   \
    v2 += v1, v1 = rotl64(v1, 17), v1 ^= v2, v2 = rotl64(v2, 32);                              \
  } while (0)

uint64_t lm_siphash24(const uint8_t key[16], const void *data, size_t n) {
  const uint8_t *m = data;
  uint64_t k0 = load64(key), k1 = load64(key + 8);
  uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
  size_t whole = n - n % 8;
  for (size_t i = 0; i < whole; i += 8) {
    uint64_t w = load64(m + i);
    v3 ^= w;
    SIP_ROUND;
    SIP_ROUND;
    v0 ^= w;
  }
  uint64_t last = (uint64_t)n << 56;
  for (size_t i = 0; i < n % 8; i++) last |= (uint64_t)m[whole + i] << (8 * i);
  v3 ^= last;
  SIP_ROUND;
  SIP_ROUND;
  v0 ^= last;
  v2 ^= 0xff;
  SIP_ROUND;
  SIP_ROUND;
  SIP_ROUND;
  SIP_ROUND;
  return v0 ^ v1 ^ v2 ^ v3;
}

#define SECRET_FILE "mac-key"
#define SEAL_MAGIC "LMSEAL1\n"
enum { SEAL_NAME = 64, SEAL_TAG = 16, SEAL_BYTES = 8 + SEAL_NAME + SEAL_TAG };

static void seal_tag(const lm_cc_secret *s, const void *data, size_t n, uint8_t tag[SEAL_TAG]) {
  store64(tag, lm_siphash24(s->bytes, data, n));
  store64(tag + 8, lm_siphash24(s->bytes + 16, data, n));
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* The 8 + SEAL_NAME bytes before the tag: the magic and the file's own name. */
static void seal_head(const char *path, uint8_t head[8 + SEAL_NAME]) {
  memset(head, 0, 8 + SEAL_NAME);
  memcpy(head, SEAL_MAGIC, 8);
  const char *name = base_name(path);
  size_t len = strlen(name);
  memcpy(head + 8, name, len < SEAL_NAME ? len : SEAL_NAME);
}

/* NULL if data (n bytes, the whole file at `path`) carries a good seal, else why not. */
static const char *seal_check(const lm_cc_secret *s, const char *path, const char *data,
                              size_t n) {
  if (n < SEAL_BYTES) return "it is too short to carry a lumen seal (truncated?)";
  uint8_t head[8 + SEAL_NAME], tag[SEAL_TAG];
  seal_head(path, head);
  const uint8_t *trailer = (const uint8_t *)data + n - SEAL_BYTES;
  if (memcmp(trailer, head, 8) != 0) return "it carries no lumen seal (truncated, or not written by lumen)";
  if (memcmp(trailer + 8, head + 8, SEAL_NAME) != 0) return "its seal is for another file";
  seal_tag(s, data, n - SEAL_TAG, tag);
  uint8_t diff = 0;
  for (int i = 0; i < SEAL_TAG; i++) diff |= (uint8_t)(tag[i] ^ trailer[8 + SEAL_NAME + i]);
  return diff ? "its seal does not match (modified, or sealed with another key)" : NULL;
}

static int random_bytes(uint8_t *p, size_t n) {
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, p + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
  }
  close(fd);
  return got == n;
}

/* Reads <dir>/mac-key, creating it first if it is missing: 32 random bytes written to a mkstemp
 * file (mode 0600) and hard-linked into place, so a reader never sees a partial key and two
 * processes creating it at once agree on one. */
static lm_status secret_get(const char *dir, lm_cc_secret *s) {
  char *path = path_printf("%s/" SECRET_FILE, dir);
  char *tmp = path_printf("%s/" SECRET_FILE ".XXXXXX", dir);
  lm_status st = LM_ERR_NOMEM;
  if (!path || !tmp) goto done;
  for (int attempt = 0; attempt < 3; attempt++) {
    struct stat sb;
    int missing;
    int fd = open_checked(path, 0, &sb, &missing, &st);
    if (fd >= 0) {
      ssize_t k = sb.st_mode & 077 || sb.st_size != (off_t)sizeof s->bytes
                      ? -1
                      : pread(fd, s->bytes, sizeof s->bytes, 0);
      close(fd);
      st = k == (ssize_t)sizeof s->bytes
               ? LM_OK
               : lm_fail(LM_ERR_CORRUPT,
                         "the cache key file %s is unsafe or damaged (mode %04o, %lld bytes; it "
                         "must be 32 bytes with mode 0600)",
                         path, (unsigned)(sb.st_mode & 07777), (long long)sb.st_size);
      goto done;
    }
    if (!missing) goto done;
    uint8_t fresh[sizeof s->bytes];
    snprintf(tmp, strlen(tmp) + 1, "%s/" SECRET_FILE ".XXXXXX", dir);
    int tfd = mkstemp(tmp);
    if (tfd < 0) {
      st = lm_fail(LM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
      goto done;
    }
    int ok = random_bytes(fresh, sizeof fresh) && fchmod(tfd, 0600) == 0 &&
             write_all(tfd, (const char *)fresh, sizeof fresh);
    ok = close(tfd) == 0 && ok;
    int linked = ok && link(tmp, path) == 0;
    int err = errno;
    unlink(tmp);
    if (!ok || (!linked && err != EEXIST)) {
      st = lm_fail(LM_ERR_IO, "cannot create the cache key file %s: %s", path,
                   ok ? strerror(err) : "no random bytes");
      goto done;
    }
  }
  st = lm_fail(LM_ERR_IO, "the cache key file %s keeps disappearing", path);
done:
  if (st != LM_OK && st != LM_ERR_NOMEM && st != LM_ERR_IO) {
    char *msg = lm_strdup(lm_last_error());
    st = lm_fail(st, "%s; remove it (lumen makes a new key and rebuilds what it loads) or %s",
                 msg ? msg : "the cache key file is unsafe", dir_fix);
    lm_free(msg);
  }
  lm_free(path);
  lm_free(tmp);
  return st;
}

lm_status lm_cc_sealed_write(const lm_cc_secret *secret, const char *path, const void *data,
                             size_t n) {
  char *tmp = path_printf("%s.XXXXXX", path);
  char *buf = lm_malloc(n + SEAL_BYTES);
  lm_status st = LM_ERR_NOMEM;
  if (!tmp || !buf) goto done;
  if (n) memcpy(buf, data, n);
  seal_head(path, (uint8_t *)buf + n);
  seal_tag(secret, buf, n + SEAL_BYTES - SEAL_TAG, (uint8_t *)buf + n + SEAL_BYTES - SEAL_TAG);
  int fd = mkstemp(tmp); /* O_CREAT | O_EXCL, mode 0600 */
  if (fd < 0) {
    st = lm_fail(LM_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    goto done;
  }
  int ok = write_all(fd, buf, n + SEAL_BYTES);
  int err = errno;
  if (close(fd) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  st = LM_OK;
  if (!ok) {
    unlink(tmp);
    st = lm_fail(LM_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
done:
  lm_free(tmp);
  lm_free(buf);
  return st;
}

lm_status lm_cc_seal_file(const lm_cc_secret *secret, const char *tmp, const char *path) {
  struct stat sb;
  int missing;
  lm_status st;
  int fd = open_checked(tmp, 0, &sb, &missing, &st); /* the compiler's umask decides its mode */
  if (fd < 0) {
    unlink(tmp);
    return st;
  }
  char *data;
  size_t n;
  st = read_fd(fd, tmp, &sb, &data, &n);
  close(fd);
  if (st == LM_OK) st = lm_cc_sealed_write(secret, path, data, n);
  lm_free(data);
  unlink(tmp);
  return st;
}

/* Opens, reads and checks a sealed file; on success *fd (if fd) stays open on it. */
static lm_status sealed_open(const lm_cc_secret *secret, const char *path, int *fd_out,
                             struct stat *sb, char **data, size_t *n) {
  if (fd_out) *fd_out = -1;
  if (data) *data = NULL;
  int missing;
  lm_status st;
  int fd = open_checked(path, 1, sb, &missing, &st);
  if (fd < 0) return st;
  char *buf;
  size_t size;
  if ((st = read_fd(fd, path, sb, &buf, &size)) != LM_OK) {
    close(fd);
    return st;
  }
  const char *why = seal_check(secret, path, buf, size);
  if (why) {
    close(fd);
    lm_free(buf);
    return lm_fail(LM_ERR_CORRUPT, "%s: %s", path, why);
  }
  if (fd_out) *fd_out = fd;
  else close(fd);
  if (data) {
    buf[size - SEAL_BYTES] = 0;
    *data = buf;
    if (n) *n = size - SEAL_BYTES;
  } else {
    lm_free(buf);
  }
  return LM_OK;
}

lm_status lm_cc_sealed_read(const lm_cc_secret *secret, const char *path, char **data, size_t *n) {
  struct stat sb;
  return sealed_open(secret, path, NULL, &sb, data, n);
}

/* ---- choosing the directory ----------------------------------------------------------------- */

/* The /tmp fallback refused in this process, and the private directory used instead. */
static pthread_mutex_t fallback_mu = PTHREAD_MUTEX_INITIALIZER;
static char fallback_refused[4096], fallback_used[4096];

/* The environment's choice; *is_fallback when it is /tmp/lumen-cache-<uid>. */
static void select_dir(char *buf, size_t cap, int *is_fallback) {
  const char *v;
  *is_fallback = 0;
  if ((v = getenv("LUMEN_CACHE_DIR")) && *v)
    snprintf(buf, cap, "%s", v);
  else if ((v = getenv("XDG_CACHE_HOME")) && *v == '/') /* XDG: relative paths are invalid */
    snprintf(buf, cap, "%s/lumen", v);
  else if ((v = getenv("HOME")) && *v)
    snprintf(buf, cap, "%s/.cache/lumen", v);
  else
    snprintf(buf, cap, "/tmp/lumen-cache-%lu", (unsigned long)getuid()), *is_fallback = 1;
}

const char *lm_cc_cache_dir(void) {
  static _Thread_local char buf[4096];
  int is_fallback;
  select_dir(buf, sizeof buf, &is_fallback);
  if (is_fallback) {
    pthread_mutex_lock(&fallback_mu);
    if (fallback_used[0] && !strcmp(buf, fallback_refused))
      snprintf(buf, sizeof buf, "%s", fallback_used);
    pthread_mutex_unlock(&fallback_mu);
  }
  return buf;
}

lm_status lm_cc_cache_open_dir(char **out, lm_cc_secret *secret) {
  *out = NULL;
  char want[4096], cwd[4096];
  int is_fallback;
  select_dir(want, sizeof want, &is_fallback);
  char *dir = want[0] != '/' && getcwd(cwd, sizeof cwd) ? path_printf("%s/%s", cwd, want)
                                                         : lm_strdup(want);
  if (!dir) return lm_fail(LM_ERR_NOMEM, "out of memory");
  if (is_fallback) { /* a substitute chosen earlier in this process stays chosen */
    pthread_mutex_lock(&fallback_mu);
    if (fallback_used[0] && !strcmp(dir, fallback_refused)) {
      lm_free(dir);
      dir = lm_strdup(fallback_used);
    }
    pthread_mutex_unlock(&fallback_mu);
    if (!dir) return lm_fail(LM_ERR_NOMEM, "out of memory");
  }
  lm_status st = lm_cc_dir_make(dir);
  if (st == LM_OK) st = secret_get(dir, secret);
  if (st != LM_OK && st != LM_ERR_NOMEM && is_fallback && !strcmp(dir, want)) {
    /* Anyone may create /tmp/lumen-cache-<uid> first: leave theirs alone, use a fresh one. */
    char why[600];
    snprintf(why, sizeof why, "%s", lm_last_error());
    char *sub = path_printf("%s-XXXXXX", want);
    if (!sub) {
      lm_free(dir);
      return LM_ERR_NOMEM;
    }
    if (!mkdtemp(sub)) {
      st = lm_fail(LM_ERR_IO, "%s; and cannot create a private substitute %s: %s", why, sub,
                   strerror(errno));
      lm_free(sub);
    } else {
      lm_free(dir);
      dir = sub;
      st = dir_check(dir);
      if (st == LM_OK) st = secret_get(dir, secret);
      if (st == LM_OK) {
        pthread_mutex_lock(&fallback_mu);
        snprintf(fallback_refused, sizeof fallback_refused, "%s", want);
        snprintf(fallback_used, sizeof fallback_used, "%s", dir);
        pthread_mutex_unlock(&fallback_mu);
        notice("lumen: not using the kernel cache %s (%s); this process caches in %s", want, why,
               dir);
      }
    }
  }
  if (st != LM_OK) {
    lm_free(dir);
    return st;
  }
  *out = dir;
  return LM_OK;
}

/* ---- host identity: -march=native code must not be reused on another CPU ------------------- */

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static char host_id[8192];

static void host_id_init(void) {
  size_t len = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[4096];
    int have_model = 0, have_flags = 0;
    while (fgets(line, sizeof line, f) && !(have_model && have_flags)) {
      int *have = !strncmp(line, "model name", 10) ? &have_model
                  : !strncmp(line, "flags", 5)     ? &have_flags
                                                   : NULL;
      if (!have || *have) continue;
      *have = 1;
      int k = snprintf(host_id + len, sizeof host_id - len, "%s", line);
      if (k > 0) len += (size_t)k < sizeof host_id - len ? (size_t)k : sizeof host_id - len - 1;
    }
    fclose(f);
  }
#if defined(__x86_64__)
  snprintf(host_id + len, sizeof host_id - len, "x86_64");
#elif defined(__aarch64__)
  snprintf(host_id + len, sizeof host_id - len, "aarch64");
#else
  snprintf(host_id + len, sizeof host_id - len, "other");
#endif
}

/* ---- running the compiler ------------------------------------------------------------------- */

typedef struct run_result {
  int status; /* as from waitpid */
  int timed_out;
} run_result;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs argv (PATH lookup, no shell) with stdin from /dev/null and stdout+stderr into log_path.
 * The child leads its own process group, so a time-out kills the compiler's sub-processes too.
 * Fails only if the program could not be started or waited for. */
static lm_status run_tool(char *const *argv, const char *log_path, double timeout_s,
                          run_result *rr) {
  *rr = (run_result){0};
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  if (posix_spawn_file_actions_init(&fa) != 0) return lm_fail(LM_ERR_NOMEM, "posix_spawn init");
  if (posix_spawnattr_init(&attr) != 0) {
    posix_spawn_file_actions_destroy(&fa);
    return lm_fail(LM_ERR_NOMEM, "posix_spawn init");
  }
  sigset_t none, dfl;
  sigemptyset(&none);
  sigemptyset(&dfl);
  int dfl_signals[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGALRM};
  for (size_t i = 0; i < LM_COUNTOF(dfl_signals); i++) sigaddset(&dfl, dfl_signals[i]);
  int rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!rc) rc = posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC,
                                                 0600);
  if (!rc) rc = posix_spawn_file_actions_adddup2(&fa, 1, 2);
  if (!rc)
    rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                             POSIX_SPAWN_SETSIGDEF);
  if (!rc) rc = posix_spawnattr_setpgroup(&attr, 0);
  if (!rc) rc = posix_spawnattr_setsigmask(&attr, &none);
  if (!rc) rc = posix_spawnattr_setsigdefault(&attr, &dfl);
  pid_t pid = -1;
  if (!rc) rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc) return lm_fail(LM_ERR_UNSUPPORTED, "cannot run '%s': %s", argv[0], strerror(rc));
  atomic_fetch_add(&compile_count, 1);

  double deadline = now_s() + timeout_s;
  long sleep_ns = 100000;
  for (;;) {
    pid_t r = waitpid(pid, &rr->status, WNOHANG);
    if (r == pid) return LM_OK;
    if (r < 0 && errno != EINTR) {
      int err = errno;
      kill(-pid, SIGKILL);
      return lm_fail(LM_ERR_BACKEND, "cannot wait for '%s': %s", argv[0], strerror(err));
    }
    if (now_s() > deadline) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      while (waitpid(pid, &rr->status, 0) < 0 && errno == EINTR) {
      }
      rr->timed_out = 1;
      return LM_OK;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 5000000) sleep_ns *= 2;
  }
}

/* "exit status 1", "killed by signal 9", "timed out after 120 s". */
static void describe_exit(lm_sb *b, const run_result *rr, double timeout_s) {
  if (rr->timed_out)
    lm_sb_printf(b, "timed out after %g s (killed)", timeout_s);
  else if (WIFEXITED(rr->status))
    lm_sb_printf(b, "exit status %d", WEXITSTATUS(rr->status));
  else if (WIFSIGNALED(rr->status))
    lm_sb_printf(b, "killed by signal %d", WTERMSIG(rr->status));
  else
    lm_sb_printf(b, "wait status %d", rr->status);
}

static int run_ok(const run_result *rr) {
  return !rr->timed_out && WIFEXITED(rr->status) && WEXITSTATUS(rr->status) == 0;
}

/* Runs `cmd src flags -o out`, logging to `log`. */
static lm_status compile_ex(const words *cmd, const words *flags, const words *extra, const char *src,
                            const char *out, const char *log, double timeout_s, run_result *rr);

static lm_status compile(const words *cmd, const words *flags, const char *src, const char *out,
                         const char *log, double timeout_s, run_result *rr) {
  return compile_ex(cmd, flags, NULL, src, out, log, timeout_s, rr);
}

/* compile with `extra` flags (include directories, ...) before the source. */
static lm_status compile_ex(const words *cmd, const words *flags, const words *extra, const char *src,
                            const char *out, const char *log, double timeout_s, run_result *rr) {
  words argv = {0};
  int ok = 1;
  for (size_t i = 0; i < cmd->n && ok; i++) ok = words_add(&argv, cmd->v[i], strlen(cmd->v[i]));
  for (size_t i = 0; extra && i < extra->n && ok; i++) ok = words_add(&argv, extra->v[i], strlen(extra->v[i]));
  /* Flags after the source, so -l libraries follow the object that needs them. */
  ok = ok && words_add(&argv, src, strlen(src));
  for (size_t i = 0; i < flags->n && ok; i++)
    ok = words_add(&argv, flags->v[i], strlen(flags->v[i]));
  ok = ok && words_add(&argv, "-o", 2) && words_add(&argv, out, strlen(out));
  lm_status st = ok ? run_tool(argv.v, log, timeout_s, rr) : LM_ERR_NOMEM;
  words_free(&argv);
  return st;
}

/* ---- probing -------------------------------------------------------------------------------- */

/* One probed (command, flags) pair; kept for the life of the process. */
typedef struct probe {
  struct probe *next;
  char *key;     /* command "\n" $LUMEN_CFLAGS-or-"(default)" */
  int ok;
  int family;    /* FAMILY_* */
  char *flags;   /* the flags that worked */
  char *version; /* __VERSION__ as the compiler reported it */
  char *why;     /* why it failed */
} probe;

static pthread_mutex_t probe_mu = PTHREAD_MUTEX_INITIALIZER;
static probe *probes;

enum probe_outcome { PROBE_OK, PROBE_FAILED, PROBE_CANNOT_RUN, PROBE_NOMEM };

/* Compiles, loads and runs the probe program with `flags`. On success sets *version, *family;
 * otherwise appends the reason to `why`. PROBE_CANNOT_RUN: the compiler could not even be started
 * (other flags will not help); PROBE_NOMEM: an allocation failed (nothing learnt). */
static enum probe_outcome probe_try(const words *cmd, const char *flags_text, const char *dir,
                                    double timeout_s, char **version, int *family, lm_sb *why) {
  words flags = {0};
  char *tmpdir = path_printf("%s/probe-XXXXXX", dir);
  char *src = NULL, *so = NULL, *log = NULL;
  enum probe_outcome result = PROBE_FAILED;
  if (!words_split(&flags, flags_text) || !tmpdir) {
    result = PROBE_NOMEM;
    goto done;
  }
  if (!mkdtemp(tmpdir)) {
    lm_sb_printf(why, "cannot create %s: %s", tmpdir, strerror(errno));
    goto done;
  }
  src = path_printf("%s/probe.c", tmpdir);
  so = path_printf("%s/probe.so", tmpdir);
  log = path_printf("%s/probe.log", tmpdir);
  if (!src || !so || !log) {
    result = PROBE_NOMEM;
    goto cleanup;
  }
  lm_status st = write_file_atomic(src, probe_source);
  if (st != LM_OK) {
    if (st == LM_ERR_NOMEM) result = PROBE_NOMEM;
    lm_sb_puts(why, lm_last_error());
    goto cleanup;
  }
  run_result rr;
  st = compile(cmd, &flags, src, so, log, timeout_s, &rr);
  if (st != LM_OK) {
    result = st == LM_ERR_NOMEM ? PROBE_NOMEM : PROBE_CANNOT_RUN;
    lm_sb_puts(why, lm_last_error());
    goto cleanup;
  }
  if (!run_ok(&rr)) {
    describe_exit(why, &rr, timeout_s);
    lm_sb out = {0};
    read_file_into(&out, log);
    char *text = lm_sb_take(&out);
    if (text && *text)
      lm_sb_printf(why, ": %.*s%s", REASON_MAX, text, strlen(text) > REASON_MAX ? "..." : "");
    lm_free(text);
    goto cleanup;
  }
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    lm_sb_printf(why, "the probe compiled but does not load: %s", dlerror());
    goto cleanup;
  }
  const char *ver = dlsym(h, "lm_cc_probe_version");
  const int *fam = dlsym(h, "lm_cc_probe_family");
  void (*fn)(float *, const float *, int);
  *(void **)&fn = dlsym(h, "lm_cc_probe");
  if (!ver || !fam || !fn) {
    lm_sb_puts(why, "the probe loads but lacks its symbols");
  } else {
    float a[64], o[64];
    for (int i = 0; i < 64; i++) a[i] = (float)i * 0.03125f, o[i] = NAN;
    fn(o, a, 64);
    int good = o[0] == 1.0f; /* sin(0) + exp(0) */
    for (int i = 0; i < 64; i++) good = good && fabsf(o[i] - (sinf(a[i]) + expf(a[i]))) < 1e-5f;
    if (!good) {
      lm_sb_puts(why, "the probe runs but computes wrong results");
    } else {
      *version = lm_strdup(ver);
      *family = *fam;
      result = *version ? PROBE_OK : PROBE_NOMEM;
    }
  }
  dlclose(h);
cleanup:
  if (src) unlink(src);
  if (so) unlink(so);
  if (log) unlink(log);
  rmdir(tmpdir);
done:
  words_free(&flags);
  lm_free(tmpdir);
  lm_free(src);
  lm_free(so);
  lm_free(log);
  return result;
}

static const char *const *family_flags(int family) {
  return family == FAMILY_CLANG ? flags_clang : family == FAMILY_GCC ? flags_gcc : flags_other;
}

/* Fills `p` (key already set) by probing; returns 0 if an allocation failed. Default flags: guess
 * the family from the name, probe, and if the compiler turns out to be of another family (cc is
 * often clang or gcc), start over with that family's flags. */
static int probe_run(probe *p, const words *cmd, const char *user_flags, const char *dir,
                     double timeout_s) {
  lm_sb why = {0};
  enum probe_outcome r = PROBE_FAILED;
  if (user_flags) {
    char *flags = path_printf("%s %s", user_flags, flags_mandatory);
    r = flags ? probe_try(cmd, flags, dir, timeout_s, &p->version, &p->family, &why)
              : PROBE_NOMEM;
    if (r == PROBE_OK)
      p->flags = flags;
    else
      lm_free(flags);
  } else {
    const char *base = strrchr(cmd->v[0], '/');
    base = base ? base + 1 : cmd->v[0];
    int family = strstr(base, "clang") ? FAMILY_CLANG : FAMILY_GCC;
    const char *used = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
      const char *const *sets = family_flags(family);
      for (int i = 0; sets[i]; i++) {
        lm_sb reason = {0};
        r = probe_try(cmd, sets[i], dir, timeout_s, &p->version, &p->family, &reason);
        used = sets[i];
        if (r != PROBE_OK && !why.len) lm_sb_puts(&why, reason.s ? reason.s : "");
        lm_sb_free(&reason);
        if (r != PROBE_FAILED) break; /* worked, cannot run at all, or out of memory */
      }
      if (r != PROBE_OK || p->family == family || attempt == 1) break;
      family = p->family; /* wrong guess: probe again with the right family's flags */
      lm_free(p->version);
      p->version = NULL;
    }
    if (r == PROBE_OK && !(p->flags = lm_strdup(used))) r = PROBE_NOMEM;
  }
  p->ok = r == PROBE_OK;
  if (!p->ok && r != PROBE_NOMEM) p->why = lm_sb_take(&why);
  lm_sb_free(&why);
  return r != PROBE_NOMEM && (p->ok || p->why);
}

/* Seeds of the two 64-bit halves of every cache key (probe records and objects). */
static const uint64_t key_seed[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};

/* A good probe is remembered on disk, sealed, in <dir>/probe-<key>: probing runs the compiler
 * and the linker (~80 ms, a third of a short run's start). The key names the command, the flags
 * asked for, the host and the compiler's file (found on PATH, links followed: device, inode, size,
 * mtime, ctime), so an upgraded or switched compiler is probed again, as is every compiler when
 * lumen's default flag lists change. Record: family, flags and
 * version on three lines. Anything unreadable, unsealed or malformed is probed again. */
static char *probe_record_path(const words *cmd, const char *key, const char *dir) {
  const char *name = cmd->v[0], *path = getenv("PATH");
  char buf[4096];
  struct stat sb;
  int found = 0;
  if (strchr(name, '/')) {
    found = stat(name, &sb) == 0;
  } else {
    for (const char *d = path ? path : "/usr/bin:/bin"; !found && *d;) {
      size_t len = strcspn(d, ":");
      snprintf(buf, sizeof buf, "%.*s/%s", (int)len, len ? d : ".", name);
      found = access(buf, X_OK) == 0 && stat(buf, &sb) == 0 && S_ISREG(sb.st_mode);
      d += len + (d[len] == ':');
    }
  }
  if (!found) return NULL;
  long long id[7] = {(long long)sb.st_dev, (long long)sb.st_ino, (long long)sb.st_size,
                     (long long)sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec,
                     (long long)sb.st_ctim.tv_sec, sb.st_ctim.tv_nsec};
  pthread_once(&host_once, host_id_init);
  uint64_t h[2];
  static const char tag[] = "lumen-cc-probe-v1";
  for (int k = 0; k < 2; k++) {
    h[k] = lm_hash_bytes(tag, sizeof tag, key_seed[k]);
    h[k] = lm_hash_bytes(key, strlen(key) + 1, h[k]);
    h[k] = lm_hash_bytes(id, sizeof id, h[k]);
    h[k] = lm_hash_bytes(host_id, strlen(host_id) + 1, h[k]);
    static const char *const *const lists[] = {flags_clang, flags_gcc, flags_other}; /* a new default is probed */
    for (int l = 0; l < 3; l++)
      for (const char *const *f = lists[l]; *f; f++) h[k] = lm_hash_bytes(*f, strlen(*f) + 1, h[k]);
  }
  return path_printf("%s/probe-%016llx%016llx", dir, (unsigned long long)h[0],
                     (unsigned long long)h[1]);
}

static int probe_recall(probe *p, const lm_cc_secret *secret, const char *record) {
  char *data, *flags, *version, *end;
  size_t n;
  if (!record || lm_cc_sealed_read(secret, record, &data, &n) != LM_OK) return 0;
  int ok = n > 2 && data[0] >= '0' + FAMILY_OTHER && data[0] <= '0' + FAMILY_GCC &&
           data[1] == '\n' && (version = strchr(flags = data + 2, '\n')) &&
           (end = strchr(++version, '\n')) && !end[1] && end > version;
  if (ok) {
    version[-1] = *end = 0;
    p->family = data[0] - '0';
    p->flags = lm_strdup(flags);
    p->version = lm_strdup(version);
    ok = p->flags && p->version;
  }
  lm_free(data);
  if (!ok) lm_free(p->flags), lm_free(p->version), p->flags = p->version = NULL;
  return p->ok = ok;
}

static void probe_remember(const probe *p, const lm_cc_secret *secret, const char *record) {
  char *text = record ? path_printf("%d\n%s\n%s\n", p->family, p->flags, p->version) : NULL;
  if (text) lm_cc_sealed_write(secret, record, text, strlen(text)); /* best effort */
  lm_free(text);
}

/* The process-wide probe result for (cmd, $LUMEN_CFLAGS); NULL only when out of memory. */
static probe *probe_get(const words *cmd, const char *user_flags, const char *dir,
                        const lm_cc_secret *secret, double timeout_s) {
  lm_sb kb = {0};
  words_join(&kb, cmd);
  lm_sb_printf(&kb, "\n%s", user_flags ? user_flags : "(default)");
  char *key = lm_sb_take(&kb);
  if (!key) return NULL;
  pthread_mutex_lock(&probe_mu);
  probe *p = probes;
  while (p && strcmp(p->key, key) != 0) p = p->next;
  if (p) {
    lm_free(key);
  } else if ((p = lm_calloc(1, sizeof *p))) {
    p->key = key;
    char *record = probe_record_path(cmd, key, dir);
    int recalled = probe_recall(p, secret, record);
    int known = recalled || probe_run(p, cmd, user_flags, dir, timeout_s);
    if (!recalled && known && p->ok) probe_remember(p, secret, record);
    lm_free(record);
    if (known) {
      p->next = probes;
      probes = p;
    } else { /* out of memory while probing: remember nothing */
      lm_free(p->key);
      lm_free(p->version);
      lm_free(p->flags);
      lm_free(p->why);
      lm_free(p);
      p = NULL;
    }
  } else {
    lm_free(key);
  }
  pthread_mutex_unlock(&probe_mu);
  return p;
}

/* ---- lm_cc ---------------------------------------------------------------------------------- */

struct lm_cc {
  words cmd, flags;
  char *version;
  char *describe;
  char *cache_dir;
  double timeout_s;
  uint64_t ident[2]; /* hash state after the identity, one per half of the key */
  lm_cc_secret secret;
};

/* One loaded object, shared by every lm_cc_lib of the same inode. `fd` is the descriptor it was
 * checked and loaded through ("/proc/self/fd/<fd>" is its name in the loader). */
typedef struct loaded_obj {
  struct loaded_obj *next;
  dev_t dev;
  ino_t ino;
  void *handle;
  int fd;
  int refs;
} loaded_obj;

static pthread_mutex_t loaded_mu = PTHREAD_MUTEX_INITIALIZER;
static loaded_obj *loaded_list;

struct lm_cc_lib {
  loaded_obj *obj;
  char *path;
};

void lm_cc_close(lm_cc *cc) {
  if (!cc) return;
  words_free(&cc->cmd);
  words_free(&cc->flags);
  lm_free(cc->version);
  lm_free(cc->describe);
  lm_free(cc->cache_dir);
  lm_free(cc);
}

const char *lm_cc_describe(const lm_cc *cc) { return cc ? cc->describe : ""; }


lm_status lm_cc_open(lm_cc **out) {
  if (!out) return lm_fail(LM_ERR_INVALID, "lm_cc_open: out is NULL");
  *out = NULL;
  double timeout_s = DEFAULT_TIMEOUT_S;
  const char *tv = getenv("LUMEN_CC_TIMEOUT");
  if (tv && *tv) {
    char *end;
    timeout_s = strtod(tv, &end);
    if (*end || !(timeout_s > 0))
      return lm_fail(LM_ERR_INVALID, "LUMEN_CC_TIMEOUT='%s' is not a positive number of seconds",
                     tv);
  }
  lm_cc *cc = lm_calloc(1, sizeof *cc);
  if (!cc) return LM_ERR_NOMEM;
  cc->timeout_s = timeout_s;
  lm_status st = lm_cc_cache_open_dir(&cc->cache_dir, &cc->secret);
  if (st != LM_OK) {
    lm_cc_close(cc);
    return st;
  }

  const char *env_cc = getenv("LUMEN_CC");
  const char *user_flags = getenv("LUMEN_CFLAGS");
  if (user_flags && !*user_flags) user_flags = NULL;
  int from_env = env_cc && *env_cc;
  lm_sb tried = {0};
  probe *chosen = NULL;
  size_t n_candidates = from_env ? 1 : LM_COUNTOF(default_compilers);
  for (size_t i = 0; i < n_candidates && !chosen; i++) {
    words cmd = {0};
    if (!words_split(&cmd, from_env ? env_cc : default_compilers[i])) {
      words_free(&cmd);
      lm_sb_free(&tried);
      goto nomem;
    }
    if (!cmd.n) {
      lm_sb_printf(&tried, "%s'%s' (from $LUMEN_CC): empty command", tried.len ? "; " : "",
                   env_cc);
      words_free(&cmd);
      continue;
    }
    probe *p = probe_get(&cmd, user_flags, cc->cache_dir, &cc->secret, timeout_s);
    if (!p) {
      words_free(&cmd);
      lm_sb_free(&tried);
      goto nomem;
    }
    if (p->ok) {
      chosen = p;
      cc->cmd = cmd;
    } else {
      lm_sb_printf(&tried, "%s%s: %s", tried.len ? "; " : "",
                   from_env ? env_cc : default_compilers[i], p->why);
      if (from_env) lm_sb_puts(&tried, " (from $LUMEN_CC)");
      words_free(&cmd);
    }
  }
  if (!chosen) {
    char *msg = lm_sb_take(&tried);
    st = lm_fail(LM_ERR_UNSUPPORTED, "no working C compiler for the cpu backend%s; tried %s",
                 user_flags ? " (with $LUMEN_CFLAGS)" : "", msg ? msg : "(out of memory)");
    lm_free(msg);
    lm_cc_close(cc);
    return st;
  }
  lm_sb_free(&tried);

  cc->version = lm_strdup(chosen->version);
  if (!cc->version || !words_split(&cc->flags, chosen->flags)) goto nomem;
  lm_sb d = {0};
  words_join(&d, &cc->cmd);
  lm_sb_printf(&d, " (%s) ", cc->version);
  words_join(&d, &cc->flags);
  if (!(cc->describe = lm_sb_take(&d))) goto nomem;

  pthread_once(&host_once, host_id_init);
  for (int k = 0; k < 2; k++) {
    uint64_t h = key_seed[k];
    static const char tag[] = "lumen-cc-cache-v1";
    h = lm_hash_bytes(tag, sizeof tag, h);
    h = lm_hash_bytes(cc->describe, strlen(cc->describe) + 1, h);
    h = lm_hash_bytes(host_id, strlen(host_id) + 1, h);
    cc->ident[k] = h;
  }
  *out = cc;
  return LM_OK;
nomem:
  lm_cc_close(cc);
  return lm_fail(LM_ERR_NOMEM, "out of memory choosing a C compiler");
}

/* ---- building ------------------------------------------------------------------------------- */

lm_status lm_cc_lib_load(const lm_cc_secret *secret, const char *path, lm_cc_lib **out) {
  *out = NULL;
  struct stat sb;
  int fd;
  lm_status st = sealed_open(secret, path, &fd, &sb, NULL, NULL);
  if (st != LM_OK) return st;
  lm_cc_lib *lib = lm_calloc(1, sizeof *lib);
  if (!lib || !(lib->path = lm_strdup(path))) {
    lm_free(lib);
    close(fd);
    return lm_fail(LM_ERR_NOMEM, "out of memory loading %s", path);
  }
  pthread_mutex_lock(&loaded_mu);
  loaded_obj *o = loaded_list;
  while (o && !(o->dev == sb.st_dev && o->ino == sb.st_ino)) o = o->next;
  if (o) { /* this very file is loaded already: share it, as dlopen of one path would */
    o->refs++;
    close(fd);
  } else if ((o = lm_calloc(1, sizeof *o))) {
    char name[64];
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    dlerror();
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    struct stat now;
    if (!h && access("/proc/self/fd", X_OK) != 0 && stat(path, &now) == 0 &&
        now.st_dev == sb.st_dev && now.st_ino == sb.st_ino) /* no /proc: by path, rechecked */
      h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *e = dlerror();
      st = lm_fail(LM_ERR_CORRUPT, "cannot load %s: %s", path, e ? e : "dlopen failed");
      lm_free(o);
      o = NULL;
      close(fd);
    } else {
      *o = (loaded_obj){loaded_list, sb.st_dev, sb.st_ino, h, fd, 1};
      loaded_list = o;
    }
  } else {
    close(fd);
    st = lm_fail(LM_ERR_NOMEM, "out of memory loading %s", path);
  }
  pthread_mutex_unlock(&loaded_mu);
  if (!o) {
    lm_free(lib->path);
    lm_free(lib);
    return st;
  }
  lib->obj = o;
  *out = lib;
  return LM_OK;
}

lm_status lm_cc_build(lm_cc *cc, const char *source, lm_cc_lib **out) {
  return lm_cc_build_ex(cc, source, NULL, out);
}

lm_status lm_cc_build_ex(lm_cc *cc, const char *source, const char *extra_flags, lm_cc_lib **out) {
  if (!out) return lm_fail(LM_ERR_INVALID, "lm_cc_build: out is NULL");
  *out = NULL;
  if (!cc || !source) return lm_fail(LM_ERR_INVALID, "lm_cc_build: NULL compiler or source");
  words extra = {0};
  if (extra_flags && !words_split(&extra, extra_flags)) return lm_fail(LM_ERR_NOMEM, "out of memory");
  size_t n = strlen(source);
  uint64_t h0 = lm_hash_bytes(source, n, cc->ident[0]);
  uint64_t h1 = lm_hash_bytes(source, n, cc->ident[1]);
  if (extra_flags) { /* part of the key: the same source with other includes is another object */
    h0 = lm_hash_bytes(extra_flags, strlen(extra_flags), h0 ^ 0x45585452ull);
    h1 = lm_hash_bytes(extra_flags, strlen(extra_flags), h1 ^ 0x45585452ull);
  }
  char key[33];
  snprintf(key, sizeof key, "%016llx%016llx", (unsigned long long)h0, (unsigned long long)h1);

  char *so = path_printf("%s/%s.so", cc->cache_dir, key);
  char *src = path_printf("%s/%s.c", cc->cache_dir, key);
  char *log = path_printf("%s/%s.log", cc->cache_dir, key);
  char *tmp_so = path_printf("%s/%s.so.XXXXXX", cc->cache_dir, key);
  char *tmp_log = path_printf("%s/%s.log.XXXXXX", cc->cache_dir, key);
  lm_status st = LM_ERR_NOMEM;
  if (!so || !src || !log || !tmp_so || !tmp_log) goto done;

  /* Cache hit: the .so is only ever renamed into place whole, sealed. If it is there but fails
   * the seal or does not load (planted, truncated, damaged by hand), rebuild it. */
  char why[700] = "";
  if ((st = lm_cc_lib_load(&cc->secret, so, out)) == LM_OK || st == LM_ERR_NOMEM) goto done;
  if (st == LM_ERR_CORRUPT) snprintf(why, sizeof why, "%s", lm_last_error());

  /* The kept source ends with a comment saying how it was built (at the end, so line numbers in
   * compiler messages match the generated text). */
  lm_sb text = {0};
  lm_sb_puts(&text, source);
  lm_sb_printf(&text, "%s/* lumen: built by %s */\n", n && source[n - 1] != '\n' ? "\n" : "",
               cc->describe);
  char *full = lm_sb_take(&text);
  if (!full) {
    st = lm_fail(LM_ERR_NOMEM, "out of memory writing %s", src);
    goto done;
  }
  st = write_file_atomic(src, full);
  lm_free(full);
  if (st != LM_OK) goto done;

  int fd_so = mkstemp(tmp_so), fd_log = fd_so >= 0 ? mkstemp(tmp_log) : -1;
  if (fd_so < 0 || fd_log < 0) {
    st = lm_fail(LM_ERR_IO, "cannot create a temporary file in %s: %s", cc->cache_dir,
                 strerror(errno));
    if (fd_so >= 0) close(fd_so), unlink(tmp_so);
    goto done;
  }
  close(fd_so);
  close(fd_log);
  run_result rr;
  st = compile_ex(&cc->cmd, &cc->flags, &extra, src, tmp_so, tmp_log, cc->timeout_s, &rr);
  if (st != LM_OK) {
    unlink(tmp_so);
    unlink(tmp_log);
    goto done;
  }
  if (!run_ok(&rr)) {
    unlink(tmp_so);
    lm_sb msg = {0}, output = {0};
    lm_sb_printf(&msg, "cannot compile %s (", src);
    describe_exit(&msg, &rr, cc->timeout_s);
    read_file_into(&output, tmp_log);
    int kept = rename(tmp_log, log) == 0;
    if (!kept) unlink(tmp_log);
    lm_sb_printf(&msg, "; full log %s; compiler %s):\n", kept ? log : "not kept", cc->describe);
    char *out_text = lm_sb_take(&output);
    lm_sb_puts(&msg, out_text ? out_text : "(the compiler's output could not be read)");
    lm_free(out_text);
    char *m = lm_sb_take(&msg);
    st = lm_fail(LM_ERR_COMPILE, "%s", m ? m : "a kernel failed to compile (out of memory)");
    lm_free(m);
    goto done;
  }
  unlink(tmp_log);
  if ((st = lm_cc_seal_file(&cc->secret, tmp_so, so)) != LM_OK) goto done;
  if ((st = lm_cc_lib_load(&cc->secret, so, out)) != LM_OK) {
    if (st == LM_ERR_CORRUPT) st = LM_ERR_COMPILE; /* fresh from the compiler, yet it does not load */
    goto done;
  }
  if (why[0]) {
    atomic_fetch_add(&rebuild_count, 1);
    notice("lumen: rebuilt the cached kernel %s: %s", so, why);
  }
done:
  words_free(&extra);
  lm_free(so);
  lm_free(src);
  lm_free(log);
  lm_free(tmp_so);
  lm_free(tmp_log);
  return st;
}

void *lm_cc_sym(lm_cc_lib *lib, const char *name) {
  if (!lib || !name) {
    lm_fail(LM_ERR_INVALID, "lm_cc_sym: NULL library or name");
    return NULL;
  }
  dlerror();
  void *p = dlsym(lib->obj->handle, name);
  if (!p) lm_fail(LM_ERR_INVALID, "symbol '%s' not found in %s", name, lib->path);
  return p;
}

const char *lm_cc_lib_path(const lm_cc_lib *lib) { return lib ? lib->path : ""; }

void lm_cc_lib_close(lm_cc_lib *lib) {
  if (!lib) return;
  pthread_mutex_lock(&loaded_mu);
  loaded_obj *o = lib->obj;
  if (--o->refs == 0) {
    loaded_obj **pp = &loaded_list;
    while (*pp != o) pp = &(*pp)->next;
    *pp = o->next;
    dlclose(o->handle);
    /* If the loader keeps the object anyway, keep its descriptor too: closed, the number (and so
     * the name the loader knows the object by) could come to mean another file. */
    char name[64];
    snprintf(name, sizeof name, "/proc/self/fd/%d", o->fd);
    void *still = dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (still)
      dlclose(still);
    else
      close(o->fd);
    lm_free(o);
  }
  pthread_mutex_unlock(&loaded_mu);
  lm_free(lib->path);
  lm_free(lib);
}
