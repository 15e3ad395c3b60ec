/* tests/fuzz/fuzz_cache.c — libFuzzer target for the search's tuning cache file
 * (compiler/search/cache.c): each input is written as the cache file in a private folder (mode
 * 0700, as the trust check wants) and loaded with skc_load. What loads must survive a save: one
 * entry added, skc_save (re-read, merge, temp file, rename), skc_load again — every entry back
 * with its value, the added one too, and no line of the saved file skipped as malformed (the
 * save is skipped when nothing loaded). */
#include "fuzz_util.h"

#include "search/search-impl.h"

static const char *cache;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  cache = fz_path("tuning.txt");
  return 0;
}

static void broken(const char *what, uint64_t key) {
  fprintf(stderr, "fuzz_cache: %s (key %016llx)\n", what, (unsigned long long)key);
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_write(cache, data, size);
  sk_cache c;
  if (skc_load(&c, cache) != LM_OK) return 0;
  for (size_t i = 0; i < c.n; i++) {
    const char *v = skc_get(&c, c.e[i].key);
    if (v != c.e[i].value) broken("skc_get returns another entry than the one loaded", c.e[i].key);
    if (!*v || strchr(v, '\n')) broken("a loaded value is empty or holds a newline", c.e[i].key);
  }
  if (!c.n) { /* nothing loaded: the save below would only prove what a test does */
    skc_free(&c);
    return 0;
  }
  const uint64_t mine = 0x0123456789abcdefull;
  const char *value = "W|1e-06|5e-07|3|0|1f|r0;";
  if (skc_put(&c, mine, value) != LM_OK) {
    skc_free(&c);
    return 0;
  }
  if (skc_save(&c) != LM_OK) broken("skc_save failed", mine);
  sk_cache d;
  if (skc_load(&d, cache) != LM_OK) broken("the saved cache does not load", mine);
  if (d.skipped) broken("the saved cache has malformed lines", mine);
  if (d.n != c.n) broken("the saved cache holds another number of entries", mine);
  for (size_t i = 0; i < c.n; i++) {
    const char *v = skc_get(&d, c.e[i].key);
    if (!v || strcmp(v, c.e[i].value)) broken("an entry did not survive the save", c.e[i].key);
  }
  skc_free(&d);
  skc_free(&c);
  return 0;
}
