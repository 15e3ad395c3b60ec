/* compiler/cc.h — the system C compiler as a kernel builder for the cpu backend: picks a working
 * compiler and flags once per process, compiles generated C into a shared object cached on disk
 * (keyed by source, compiler identity and flags), and dlopens it. Never prints or exits. */
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

/* Compiles `source` into <cache>/<key>.so unless that file exists already (a cache hit runs no
 * compiler), then dlopens it (RTLD_NOW | RTLD_LOCAL). key = 128-bit hash of (source, compiler
 * command and version string, flags, host CPU model and feature flags). The source is kept as
 * <cache>/<key>.c. Files appear atomically (temp name + rename), so concurrent processes building
 * the same source are safe. On failure: LM_ERR_COMPILE, the message names the kept source and
 * holds the compiler's output (the full log is also kept as <cache>/<key>.log). Thread-safe. */
lm_status lm_cc_build(lm_cc *cc, const char *source, lm_cc_lib **out);
/* The address of `name` in `lib`, or NULL (with lm_fail) if it is missing. */
void *lm_cc_sym(lm_cc_lib *lib, const char *name);
/* The path of the loaded .so. */
const char *lm_cc_lib_path(const lm_cc_lib *lib);
void lm_cc_lib_close(lm_cc_lib *lib);

/* The cache directory the environment selects now: $LUMEN_CACHE_DIR, else $XDG_CACHE_HOME/lumen,
 * else $HOME/.cache/lumen, else /tmp/lumen-cache-<uid>. The string is thread-local and valid until
 * the next call on this thread. lm_cc_open resolves it once (a relative path against the working
 * directory) and creates it (mkdir -p, mode 0700). */
const char *lm_cc_cache_dir(void);

/* How many compiler processes this process has run (probes and builds): tests use it to tell a
 * cache hit from a compile. */
int64_t lm_cc_compile_count(void);

#endif
