/* compiler/search/cache.c — the persistent tuning cache: one text file per device, a line per
 * decision ("<key> <check> <value>", key and check in hex, the check a hash of key and value),
 * later lines winning. Loading skips malformed or corrupt lines; saving re-reads the file (other
 * processes may have added lines), merges this session's entries, writes a temporary file and
 * renames it over the old one, so readers never see a half-written cache. The file is read only
 * from a trusted folder and only if it is ours and not group/world writable (cc.h's rules: a
 * tuning cache another user can write could steer the search); an untrusted one is not read,
 * and skc_load fails, so the caller runs without a cache. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cc.h"
#include "search/search-impl.h"

static uint32_t check_of(uint64_t key, const char *v) { return (uint32_t)lm_hash_bytes(v, strlen(v), key ^ 0xC0FFEEull); }

static int put_entry(sk_cache *c, uint64_t key, const char *value, int fresh) {
  for (size_t i = 0; i < c->n; i++)
    if (c->e[i].key == key) {
      char *v = lm_strdup(value);
      if (!v) return 0;
      lm_free(c->e[i].value);
      c->e[i].value = v;
      if (fresh && i < c->n - c->fresh) { /* move it into the fresh tail */
        sk_cache_entry t = c->e[i];
        memmove(&c->e[i], &c->e[i + 1], (c->n - i - 1) * sizeof *c->e);
        c->e[c->n - 1] = t;
        c->fresh++;
      }
      return 1;
    }
  if (!LM_GROW(c->e, c->cap, c->n + 1)) return 0;
  char *v = lm_strdup(value);
  if (!v) return 0;
  c->e[c->n++] = (sk_cache_entry){key, v};
  if (fresh) c->fresh++;
  return 1;
}

/* Parses a file's lines into c (fresh = 0). */
static lm_status parse_file(sk_cache *c, const char *path, size_t *skipped) {
  int fd;
  lm_status st = lm_cc_file_open(path, &fd);
  if (st != LM_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", lm_last_error());
    return lm_fail(st, "search cache not read: %s", why);
  }
  if (fd < 0) return LM_OK; /* no cache yet */
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return lm_fail(LM_ERR_IO, "search cache %s: %s", path, strerror(errno));
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) >= 0) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
    if (len == 0 || line[0] == '#') continue;
    char *end = NULL;
    unsigned long long key = strtoull(line, &end, 16);
    if (end != line + 16 || *end != ' ') {
      (*skipped)++;
      continue;
    }
    char *p = end + 1;
    unsigned long chk = strtoul(p, &end, 16);
    if (end != p + 8 || *end != ' ' || !end[1]) {
      (*skipped)++;
      continue;
    }
    const char *value = end + 1;
    if (check_of(key, value) != (uint32_t)chk) {
      (*skipped)++;
      continue;
    }
    size_t fresh = c->fresh;
    if (!put_entry(c, key, value, 0)) {
      st = LM_ERR_NOMEM;
      break;
    }
    c->fresh = fresh;
  }
  free(line);
  fclose(f);
  return st;
}

lm_status skc_load(sk_cache *c, const char *path) {
  memset(c, 0, sizeof *c);
  if (!(c->path = lm_strdup(path))) return LM_ERR_NOMEM;
  char *slash = strrchr(c->path, '/');
  lm_status st = LM_OK;
  if (slash && slash != c->path) { /* its folder: created private, or checked */
    *slash = 0;
    st = lm_cc_dir_make(c->path);
    *slash = '/';
  }
  if (st == LM_OK) st = parse_file(c, path, &c->skipped);
  if (st != LM_OK) skc_free(c); /* no cache: nothing read, nothing saved */
  return st;
}

const char *skc_get(const sk_cache *c, uint64_t key) {
  for (size_t i = c->n; i-- > 0;)
    if (c->e[i].key == key) return c->e[i].value;
  return NULL;
}

lm_status skc_put(sk_cache *c, uint64_t key, const char *value) {
  if (strchr(value, '\n')) return lm_fail(LM_ERR_INVALID, "search cache: a value with a newline");
  return put_entry(c, key, value, 1) ? LM_OK : LM_ERR_NOMEM;
}

lm_status skc_save(sk_cache *c) {
  if (!c->path || !c->fresh) return LM_OK;
  sk_cache disk;
  memset(&disk, 0, sizeof disk);
  size_t skipped = 0;
  lm_status st = parse_file(&disk, c->path, &skipped);
  for (size_t i = c->n - c->fresh; i < c->n && st == LM_OK; i++)
    if (!put_entry(&disk, c->e[i].key, c->e[i].value, 0)) st = LM_ERR_NOMEM;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", c->path);
  int fd = st == LM_OK ? mkstemp(tmp) : -1; /* O_EXCL, mode 0600 */
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (fd >= 0 && !f) close(fd), remove(tmp);
  if (st == LM_OK && !f) st = lm_fail(LM_ERR_IO, "search cache %s: %s", tmp, strerror(errno));
  if (f) {
    fprintf(f, "# lumen search tuning cache (%s): key check value\n", LM_SEARCH_VERSION);
    for (size_t i = 0; i < disk.n; i++)
      fprintf(f, "%016llx %08x %s\n", (unsigned long long)disk.e[i].key, check_of(disk.e[i].key, disk.e[i].value),
              disk.e[i].value);
    int bad = ferror(f);
    if (fclose(f) || bad) st = lm_fail(LM_ERR_IO, "search cache %s: write failed", tmp);
    if (st == LM_OK && rename(tmp, c->path)) st = lm_fail(LM_ERR_IO, "search cache %s: %s", c->path, strerror(errno));
    if (st != LM_OK) remove(tmp);
  }
  skc_free(&disk);
  if (st == LM_OK) c->fresh = 0;
  return st;
}

void skc_free(sk_cache *c) {
  for (size_t i = 0; i < c->n; i++) lm_free(c->e[i].value);
  lm_free(c->e);
  lm_free(c->path);
  memset(c, 0, sizeof *c);
}

char *sk_device_id(lm_cc *cc, int threads) {
  char model[256] = "unknown cpu";
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[512];
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "model name", 10)) {
        const char *p = strchr(line, ':');
        if (p) {
          snprintf(model, sizeof model, "%s", p + 1 + (p[1] == ' '));
          model[strcspn(model, "\n")] = 0;
        }
        break;
      }
    fclose(f);
  }
  lm_sb sb = {0};
  lm_sb_printf(&sb, "cpu|%s|%s|threads=%d|%s", model, cc ? lm_cc_describe(cc) : "", threads, LM_SEARCH_VERSION);
  return lm_sb_take(&sb);
}
