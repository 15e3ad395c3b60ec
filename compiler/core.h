/* compiler/core.h — private plumbing shared by every module: the error funnel
 * (lm_fail sets the thread's last error), always-on assertions, the allocation funnel
 * (with fault injection for tests) and a growable string builder for generated text. */
#ifndef LUMEN_CORE_H
#define LUMEN_CORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "lumen/base.h"

#if defined(__GNUC__)
#define LM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define LM_NORETURN __attribute__((noreturn))
#else
#define LM_PRINTF(a, b)
#define LM_NORETURN
#endif

/* Records `status` with a formatted message as this thread's last error; returns status. */
lm_status lm_fail(lm_status status, const char *fmt, ...) LM_PRINTF(2, 3);
void lm_clear_error(void);

/* Always-on invariant check: prints file:line and the expression, then aborts. Only for
 * broken invariants of lumen itself, never for bad user input. */
LM_NORETURN void lm_assert_fail(const char *file, int line, const char *expr);
#define LM_ASSERT(cond) ((cond) ? (void)0 : lm_assert_fail(__FILE__, __LINE__, #cond))

/* All heap memory goes through these. On failure they return NULL and set LM_ERR_NOMEM. */
void *lm_malloc(size_t bytes);
void *lm_calloc(size_t n, size_t size);
void *lm_realloc(void *p, size_t bytes);
/* `bytes` on a 64-byte boundary (freed by lm_free): the buffers kernels read. malloc's 16 bytes put
 * every other 32-byte vector access across two cache lines, which costs a register tile a tenth
 * of its speed (a 64x64 weight gradient: 20.1 us aligned, 22.7 at 16 bytes past a line). */
#define LM_BUFFER_ALIGN 64
void *lm_malloc_aligned(size_t bytes);
void lm_free(void *p);
char *lm_strdup(const char *s);
/* Test hook: the n-th allocation from now fails (n = 0 disables). */
void lm_alloc_fail_after(long n);

/* Grows a dynamic array: ensures *cap >= need (elements of `size` bytes). */
int lm_grow(void **data, size_t *cap, size_t need, size_t size);
#define LM_GROW(arr, cap, need) lm_grow((void **)&(arr), &(cap), (need), sizeof(*(arr)))

/* Growable string builder. A failed allocation sets `failed` and drops further text. */
typedef struct lm_sb {
  char *s;
  size_t len, cap;
  int failed;
} lm_sb;
void lm_sb_puts(lm_sb *b, const char *s);
void lm_sb_printf(lm_sb *b, const char *fmt, ...) LM_PRINTF(2, 3);
void lm_sb_vprintf(lm_sb *b, const char *fmt, va_list ap);
/* Hands the string over (NULL if an append failed); the builder is reset. */
char *lm_sb_take(lm_sb *b);
void lm_sb_free(lm_sb *b);

uint64_t lm_hash_bytes(const void *data, size_t n, uint64_t h);

/* Strict number text, as settings files, checkpoints and the command line take it: 1 and *out
 * set, or 0. A whole number is decimal digits only (a leading '-' only when lo < 0) within
 * [lo, hi]; a uint64 is digits only, up to 2^64 - 1; a real is finite, not hex, nothing after it. */
int lm_parse_i64(const char *s, long long lo, long long hi, long long *out);
int lm_parse_u64(const char *s, uint64_t *out);
int lm_parse_real(const char *s, double *out);
#define LM_COUNTOF(a) (sizeof(a) / sizeof((a)[0]))

#endif
