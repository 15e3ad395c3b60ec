/* compiler/cc.h — the system C compiler as a kernel builder for the cpu backend: picks a working
 * compiler and flags once per process, compiles generated C into a shared object cached on disk
 * (keyed by source, compiler identity and flags), and dlopens it. It also owns the trust rules of
 * the cache directory, which nvrtc.c, msl_check.c and search/cache.c share (see "the trusted
 * cache" below). Never prints or exits. */
#ifndef LUMEN_CC_H
#define LUMEN_CC_H

#include <stdint.h>

#include "lumen/base.h"

/* A chosen, working compiler with its flags. */
typedef struct lm_cc lm_cc;
/* A dlopen'd shared object built by lm_cc_build. */
typedef struct lm_cc_lib lm_cc_lib;

/* Picks the compiler: $LUMEN_CC if set (whitespace-separated words, e.g. "clang -O2"; no quoting),
 * else the first of clang, gcc, cc that works. "Works" means a probe program (a libm loop, so
 * libmvec linking is exercised) compiles with the flags into a .so that dlopens and runs; each
 * (compiler, flags) pair is probed once per process. Flags: $LUMEN_CFLAGS if set, else the best
 * default for the compiler's family (see cc.c); -fPIC -shared are always added. The compile
 * time-out is $LUMEN_CC_TIMEOUT seconds (default 120). Fails (LM_ERR_UNSUPPORTED) with a message
 * naming every compiler tried and why; the caller then falls back to the ref backend. */
lm_status lm_cc_open(lm_cc **out);
void lm_cc_close(lm_cc *cc);
/* e.g. "clang (Debian Clang 14.0.6) -std=c11 -O3 -march=native ..."; valid until lm_cc_close. */
const char *lm_cc_describe(const lm_cc *cc);

/* Compiles `source` into <cache>/<key>.so unless a sealed copy is there already (a cache hit runs
 * no compiler), then dlopens it (RTLD_NOW | RTLD_LOCAL) through lm_cc_lib_load. A cached object
 * that is missing, fails its seal (planted, truncated, modified, not ours) or does not load is
 * rebuilt: a rebuild of a file that was there counts in lm_cc_rebuild_count and leaves a notice. key = 128-bit hash of (source, compiler
 * command and version string, flags, host CPU model and feature flags). The source is kept as
 * <cache>/<key>.c. Files appear atomically (temp name + rename), so concurrent processes building
 * the same source are safe. On failure: LM_ERR_COMPILE, the message names the kept source and
 * holds the compiler's output (the full log is also kept as <cache>/<key>.log). Thread-safe. */
lm_status lm_cc_build(lm_cc *cc, const char *source, lm_cc_lib **out);
/* lm_cc_build with extra compiler flags before the source (space-separated, e.g. "-I/usr/include";
 * no spaces inside one flag), part of the cache key: how env plugins are built. */
lm_status lm_cc_build_ex(lm_cc *cc, const char *source, const char *extra_flags, lm_cc_lib **out);
/* The address of `name` in `lib`, or NULL (with lm_fail) if it is missing. */
void *lm_cc_sym(lm_cc_lib *lib, const char *name);
/* The path of the loaded .so. */
const char *lm_cc_lib_path(const lm_cc_lib *lib);
void lm_cc_lib_close(lm_cc_lib *lib);

/* The cache directory the environment selects now: $LUMEN_CACHE_DIR, else $XDG_CACHE_HOME/lumen,
 * else $HOME/.cache/lumen, else /tmp/lumen-cache-<uid> (or, once lm_cc_cache_open_dir refused
 * that one in this process, its private substitute). The string is thread-local and valid until
 * the next call on this thread. lm_cc_open resolves it with lm_cc_cache_open_dir. */
const char *lm_cc_cache_dir(void);

/* ---- the trusted cache ---------------------------------------------------------------------
 * A cache directory is used only if it is a real directory (not a symbolic link) owned by this
 * process's effective uid and not writable by group or others (what ssh asks of ~/.ssh).
 * Missing components are created with mode 0700 and checked. An unsafe directory is an error
 * naming it, its owner and mode, and the fix; it is never used. The one exception is the /tmp
 * fallback (no HOME): when /tmp/lumen-cache-<uid> is unsafe, this process uses a fresh private
 * mkdtemp directory /tmp/lumen-cache-<uid>-XXXXXX instead (it starts empty; a notice says so).
 * The directory holds `mac-key`: 32 random bytes, mode 0600, ours. Every object lumen loads from
 * the cache (kernel .so, msl .so, CUBIN and its log) is sealed with it: the file is
 * payload || "LMSEAL1\n" || its own file name (64 bytes, NUL-padded) || a 128-bit tag, the tag
 * being SipHash-2-4 under each half of the key over everything before it. A key file that is
 * not a regular file of 32 bytes, ours, with no group/other access, makes the directory refused
 * (the message says to remove it: lumen then makes a new one and rebuilds what it loads). */
typedef struct lm_cc_secret {
  uint8_t bytes[32];
} lm_cc_secret;

/* The trusted cache directory (absolute, created, checked) and its key: *dir is lm_malloc'd. */
lm_status lm_cc_cache_open_dir(char **dir, lm_cc_secret *secret);
/* mkdir -p (mode 0700 for what it creates) and the trust check above, for `dir` and for every
 * component it created; used for subfolders (nvrtc/, msl/) and the tuning cache's folder. */
lm_status lm_cc_dir_make(const char *dir);
/* Opens `path` for reading if it is a regular file (O_NOFOLLOW: not a link), owned by us and not
 * writable by group or others. A missing file is LM_OK with *fd = -1; any other problem is
 * LM_ERR_CORRUPT (or LM_ERR_IO) with a message and *fd = -1. */
lm_status lm_cc_file_open(const char *path, int *fd);
/* Reads a sealed file (opened as lm_cc_file_open does) and checks its seal for its own name.
 * LM_ERR_IO: missing; LM_ERR_CORRUPT: there but not to be trusted (the message says why).
 * On success, *data (if data) is the payload, NUL-terminated, lm_malloc'd, *n its size. */
lm_status lm_cc_sealed_read(const lm_cc_secret *secret, const char *path, char **data, size_t *n);
/* Writes payload || seal to `path` atomically (temporary file, mode 0600, then rename). */
lm_status lm_cc_sealed_write(const lm_cc_secret *secret, const char *path, const void *data,
                             size_t n);
/* Seals the file a compiler wrote at `tmp` (ours, regular) for `path`, writes it there
 * atomically, and removes `tmp`. */
lm_status lm_cc_seal_file(const lm_cc_secret *secret, const char *tmp, const char *path);
/* dlopens a sealed object: open (as lm_cc_file_open), read and check the seal from that
 * descriptor, then dlopen("/proc/self/fd/N") so the loader maps the very inode that was checked
 * (no window for a swap). The descriptor stays open while the object is loaded, so its name
 * cannot come to mean another file. Errors as lm_cc_sealed_read, plus LM_ERR_CORRUPT for an
 * object that does not load. Free with lm_cc_lib_close. */
lm_status lm_cc_lib_load(const lm_cc_secret *secret, const char *path, lm_cc_lib **out);

/* SipHash-2-4 (Aumasson and Bernstein), the 64-bit output, under a 16-byte key. */
uint64_t lm_siphash24(const uint8_t key[16], const void *data, size_t n);

/* How many cached objects this process found untrustworthy and rebuilt. */
int64_t lm_cc_rebuild_count(void);
/* The last notice the cache left ("" if none): a rebuild and why, or the /tmp substitute. The
 * library never prints it; a command-line tool may. Thread-local copy, valid until the next call. */
const char *lm_cc_notice(void);

/* How many compiler processes this process has run (probes and builds): tests use it to tell a
 * cache hit from a compile. */
int64_t lm_cc_compile_count(void);

#endif
