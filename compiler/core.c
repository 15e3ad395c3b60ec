/* compiler/core.c — the error funnel, allocation funnel, string builder and strict number text. */
#include "core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[4096];
static _Thread_local long fail_countdown;

lm_status lm_fail(lm_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

void lm_clear_error(void) { last_error[0] = 0; }
const char *lm_last_error(void) { return last_error; }

const char *lm_status_name(lm_status s) {
  static const char *const names[] = {"ok", "invalid", "out of memory", "i/o error", "unsupported",
                                      "backend error", "compile error", "corrupt"};
  _Static_assert(sizeof names / sizeof names[0] == LM_STATUS_COUNT, "status names");
  return (unsigned)s < LM_STATUS_COUNT ? names[s] : "unknown status";
}

const char *lm_version(void) { return "0.1.0"; }

void lm_assert_fail(const char *file, int line, const char *expr) {
  fprintf(stderr, "lumen: internal error at %s:%d: assertion failed: %s\n", file, line, expr);
  fflush(stderr);
  abort();
}

void lm_alloc_fail_after(long n) { fail_countdown = n; }

static int injected_failure(void) {
  if (fail_countdown <= 0) return 0;
  return --fail_countdown == 0;
}

void *lm_malloc(size_t bytes) {
  void *p = injected_failure() ? NULL : malloc(bytes ? bytes : 1);
  if (!p) lm_fail(LM_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
  return p;
}

void *lm_calloc(size_t n, size_t size) {
  void *p = injected_failure() ? NULL : calloc(n ? n : 1, size ? size : 1);
  if (!p) lm_fail(LM_ERR_NOMEM, "out of memory allocating %zu x %zu bytes", n, size);
  return p;
}

void *lm_realloc(void *p, size_t bytes) {
  void *q = injected_failure() ? NULL : realloc(p, bytes ? bytes : 1);
  if (!q) lm_fail(LM_ERR_NOMEM, "out of memory growing a buffer to %zu bytes", bytes);
  return q;
}

void *lm_malloc_aligned(size_t bytes) {
  size_t n = (bytes ? bytes : 1) + (LM_BUFFER_ALIGN - 1);
  n -= n % LM_BUFFER_ALIGN; /* aligned_alloc wants a multiple of the alignment */
  void *p = injected_failure() || n < bytes ? NULL : aligned_alloc(LM_BUFFER_ALIGN, n);
  if (!p) lm_fail(LM_ERR_NOMEM, "out of memory allocating %zu bytes", bytes);
  return p;
}

void lm_free(void *p) { free(p); }

char *lm_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = lm_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int lm_grow(void **data, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return 1;
  size_t c = *cap ? *cap : 8;
  while (c < need) c *= 2;
  void *p = lm_realloc(*data, c * size);
  if (!p) return 0;
  memset((char *)p + *cap * size, 0, (c - *cap) * size);
  *data = p;
  *cap = c;
  return 1;
}

void lm_sb_vprintf(lm_sb *b, const char *fmt, va_list ap) {
  if (b->failed) return;
  va_list aq;
  va_copy(aq, ap);
  int n = vsnprintf(NULL, 0, fmt, aq);
  va_end(aq);
  if (n < 0 || !LM_GROW(b->s, b->cap, b->len + (size_t)n + 1)) {
    b->failed = 1;
    return;
  }
  vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void lm_sb_printf(lm_sb *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lm_sb_vprintf(b, fmt, ap);
  va_end(ap);
}

void lm_sb_puts(lm_sb *b, const char *s) { lm_sb_printf(b, "%s", s); }

char *lm_sb_take(lm_sb *b) {
  char *s = NULL;
  if (!b->failed) {
    if (!b->s) lm_sb_puts(b, "");
    s = b->s;
    b->s = NULL;
  }
  lm_sb_free(b);
  return s;
}

void lm_sb_free(lm_sb *b) {
  lm_free(b->s);
  *b = (lm_sb){0};
}

uint64_t lm_hash_bytes(const void *data, size_t n, uint64_t h) {
  const unsigned char *p = data;
  if (!h) h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static int digits_only(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

int lm_parse_i64(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !digits_only(s + (*s == '-' && lo < 0))) return 0;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

int lm_parse_u64(const char *s, uint64_t *out) {
  if (!s || !digits_only(s)) return 0;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno) return 0;
  *out = v;
  return 1;
}

int lm_parse_real(const char *s, double *out) {
  if (!s || !*s || strpbrk(s, "xX")) return 0;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno || !isfinite(v)) return 0;
  *out = v;
  return 1;
}
