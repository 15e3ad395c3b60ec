/* Tests for the trust rules of lumen's on-disk caches (compiler/cc.c, cc.h): a cache directory
 * that another user could write (group/world-writable, owned by another uid, a symbolic link) is
 * refused with a message naming it; the /tmp fallback another user created first is left alone
 * and a private substitute used; a cached object that is planted, truncated, lacks its symbol or
 * carries another file's seal is never loaded but rebuilt, and the kernel computes the right
 * result; the key file is private, and an unsafe one refuses the directory; sealed files
 * (the CUBIN cache's format) fail on any change; an untrusted tuning cache is not read.
 * Each test gets its own cache dir under a fresh /tmp/lumen-test-trust-XXXXXX; the tests run as
 * root where they chown to uid 65534 (skipped otherwise). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc.h"
#include "core.h"
#include "search/search-impl.h"

#define OTHER_UID 65534 /* nobody */

static char root[256];
static char cache[512];

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    unlink(dir);
    return;
  }
  struct dirent *e;
  char path[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
      remove_tree(path);
    else
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* The real /tmp/lumen-cache-<uid>, set aside while a fallback test runs (and a lock, since
 * Criterion runs tests side by side and they share that path). */
static char fallback[128], fallback_saved[160];
static int fallback_lock = -1;

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/lumen-test-trust-XXXXXX");
  cr_assert(mkdtemp(root));
  snprintf(cache, sizeof cache, "%s/cache", root);
  setenv("LUMEN_CACHE_DIR", cache, 1);
}

static void teardown(void) {
  remove_tree(root);
  if (fallback_lock >= 0) {
    remove_tree(fallback);
    if (fallback_saved[0]) rename(fallback_saved, fallback);
    close(fallback_lock); /* releases the lock */
  }
}

TestSuite(cache_trust, .init = setup, .fini = teardown);

static const char add_source[] =
    "void k0_add(float *restrict o, const float *restrict a, const float *restrict b, int n) {\n"
    "  for (int i = 0; i < n; i++) o[i] = a[i] + b[i];\n"
    "}\n";

/* Builds add_source with `cc` and checks k0_add computes a + b (outputs poisoned first). */
static void build_and_check_add(lm_cc *cc, char *so_path, size_t cap) {
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, add_source, &lib), LM_OK, "%s", lm_last_error());
  void (*fn)(float *, const float *, const float *, int);
  *(void **)&fn = lm_cc_sym(lib, "k0_add");
  cr_assert(fn, "%s", lm_last_error());
  float a[37], b[37], o[37];
  for (int i = 0; i < 37; i++) a[i] = 0.5f + (float)i, b[i] = 2.25f * (float)(i + 1), o[i] = -777.f;
  fn(o, a, b, 37);
  for (int i = 0; i < 37; i++) cr_assert_eq(o[i], a[i] + b[i], "o[%d] = %g", i, (double)o[i]);
  if (so_path) snprintf(so_path, cap, "%s", lm_cc_lib_path(lib));
  lm_cc_lib_close(lib);
}

static lm_cc *open_cc(void) {
  lm_cc *cc = NULL;
  cr_assert_eq(lm_cc_open(&cc), LM_OK, "%s", lm_last_error());
  return cc;
}

/* Compiles `text` with the system compiler into the shared object `out`. */
static void compile_so(const char *text, const char *out) {
  char src[600], cmd[2000];
  snprintf(src, sizeof src, "%s/planted.c", root);
  FILE *f = fopen(src, "w");
  cr_assert(f);
  fputs(text, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cc -shared -fPIC -o '%s' '%s'", out, src);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static size_t file_size(const char *path) {
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0, "%s", path);
  return (size_t)sb.st_size;
}

/* Replaces `path` with the first `n` bytes of `from` (n = 0: all of it). */
static void replace_with(const char *path, const char *from, size_t n) {
  FILE *in = fopen(from, "rb");
  cr_assert(in, "%s", from);
  static char buf[1 << 22];
  size_t got = fread(buf, 1, sizeof buf, in);
  fclose(in);
  if (n && n < got) got = n;
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.replacing", path);
  FILE *out = fopen(tmp, "wb");
  cr_assert(out);
  cr_assert_eq(fwrite(buf, 1, got, out), got);
  cr_assert_eq(fclose(out), 0);
  cr_assert_eq(chmod(tmp, 0600), 0);
  cr_assert_eq(rename(tmp, path), 0);
}

static int exists(const char *path) {
  struct stat sb;
  return lstat(path, &sb) == 0;
}

static void need_root(void) {
  if (geteuid() != 0) cr_skip_test("chown to another uid needs root");
}

/* ---- SipHash ---------------------------------------------------------------------------------- */

Test(cache_trust, siphash24_matches_the_reference_vectors) {
  uint8_t key[16], msg[15];
  for (int i = 0; i < 16; i++) key[i] = (uint8_t)i;
  for (int i = 0; i < 15; i++) msg[i] = (uint8_t)i;
  /* the SipHash paper's example (15 bytes) and the reference vectors.h entry for "" */
  cr_assert_eq(lm_siphash24(key, msg, 15), 0xa129ca6149be45e5ull);
  cr_assert_eq(lm_siphash24(key, msg, 0), 0x726fdb47dd0e0e31ull);
  key[3] ^= 1;
  cr_assert_neq(lm_siphash24(key, msg, 15), 0xa129ca6149be45e5ull, "the key matters");
}

/* ---- the directory ---------------------------------------------------------------------------- */

static void expect_refused(const char *dir, const char *what) {
  lm_cc *cc = (lm_cc *)1;
  lm_status st = lm_cc_open(&cc);
  cr_assert_neq(st, LM_OK, "an unsafe cache dir (%s) was accepted", what);
  cr_assert_null(cc);
  const char *msg = lm_last_error();
  cr_assert(strstr(msg, dir), "the message names the directory %s: %s", dir, msg);
  cr_assert(strstr(msg, "LUMEN_CACHE_DIR"), "the message says how to fix it: %s", msg);
}

Test(cache_trust, a_group_or_world_writable_cache_dir_is_refused_with_its_name) {
  static const mode_t modes[] = {0777, 0770, 0702};
  for (size_t i = 0; i < LM_COUNTOF(modes); i++) {
    remove_tree(cache);
    cr_assert_eq(mkdir(cache, 0700), 0);
    cr_assert_eq(chmod(cache, modes[i]), 0);
    char want[16];
    snprintf(want, sizeof want, "%04o", (unsigned)modes[i]);
    expect_refused(cache, want);
    cr_assert(strstr(lm_last_error(), want), "the message gives the mode %s: %s", want, lm_last_error());
    cr_assert(strstr(lm_last_error(), "chmod"), "%s", lm_last_error());
    char key[600];
    snprintf(key, sizeof key, "%s/mac-key", cache);
    cr_assert(!exists(key), "nothing is written into a refused directory");
  }
  /* the same directory made private again is used */
  cr_assert_eq(chmod(cache, 0700), 0);
  lm_cc *cc = open_cc();
  build_and_check_add(cc, NULL, 0);
  lm_cc_close(cc);
}

Test(cache_trust, a_cache_dir_owned_by_another_uid_is_refused) {
  need_root();
  cr_assert_eq(mkdir(cache, 0700), 0);
  cr_assert_eq(chown(cache, OTHER_UID, OTHER_UID), 0);
  expect_refused(cache, "owned by uid 65534");
  cr_assert(strstr(lm_last_error(), "uid 65534"), "%s", lm_last_error());
}

Test(cache_trust, a_symlink_in_place_of_the_cache_dir_is_refused) {
  char real[600];
  snprintf(real, sizeof real, "%s/real", root);
  cr_assert_eq(mkdir(real, 0700), 0);
  cr_assert_eq(symlink(real, cache), 0);
  expect_refused(cache, "a symbolic link");
  cr_assert(strstr(lm_last_error(), "symbolic link"), "%s", lm_last_error());
  char slash[700]; /* lstat("link/") would follow the link */
  snprintf(slash, sizeof slash, "%s/", cache);
  setenv("LUMEN_CACHE_DIR", slash, 1);
  expect_refused(cache, "a symbolic link, with a trailing slash");
  /* a link below a created component is refused too: LUMEN_CACHE_DIR=<link>/sub is fine only
   * because the link is an existing parent; the final component itself must be real */
  char sub[700];
  snprintf(sub, sizeof sub, "%s/sub", cache);
  setenv("LUMEN_CACHE_DIR", sub, 1);
  lm_cc *cc = open_cc();
  lm_cc_close(cc);
}

Test(cache_trust, missing_components_are_created_private_and_checked) {
  char deep[700];
  snprintf(deep, sizeof deep, "%s/a/b/c", root);
  setenv("LUMEN_CACHE_DIR", deep, 1);
  lm_cc *cc = open_cc();
  const char *parts[] = {"a", "a/b", "a/b/c"};
  for (size_t i = 0; i < LM_COUNTOF(parts); i++) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", root, parts[i]);
    struct stat sb;
    cr_assert_eq(lstat(p, &sb), 0);
    cr_assert(S_ISDIR(sb.st_mode));
    cr_assert_eq(sb.st_mode & 077, 0, "%s has mode %o", p, (unsigned)sb.st_mode & 0777);
    cr_assert_eq(sb.st_uid, geteuid());
  }
  lm_cc_close(cc);
}

/* ---- the /tmp fallback ------------------------------------------------------------------------ */

/* Takes the lock on the shared fallback path, sets the real one aside, and selects the fallback
 * (no LUMEN_CACHE_DIR, XDG_CACHE_HOME or HOME). */
static void use_fallback(void) {
  fallback_lock = open("/tmp/lumen-test-cache-trust.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  cr_assert_geq(fallback_lock, 0);
  cr_assert_eq(flock(fallback_lock, LOCK_EX), 0);
  snprintf(fallback, sizeof fallback, "/tmp/lumen-cache-%lu", (unsigned long)getuid());
  if (exists(fallback)) {
    snprintf(fallback_saved, sizeof fallback_saved, "%s.set-aside-%ld", fallback, (long)getpid());
    cr_assert_eq(rename(fallback, fallback_saved), 0);
  }
  unsetenv("LUMEN_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  cr_assert_str_eq(lm_cc_cache_dir(), fallback);
}

/* The number of entries in dir (without . and ..). */
static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert(d, "%s", dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* Pre-creates the fallback with `mode`, owned by `uid`, holding a planted object under the name
 * lumen would give add_source's kernel; lumen must leave it alone and still work. */
static void check_foreign_fallback(mode_t mode, uid_t uid) {
  /* learn the kernel's file name from a build in a private cache first */
  char good[1100];
  lm_cc *cc = open_cc();
  build_and_check_add(cc, good, sizeof good);
  lm_cc_close(cc);
  use_fallback();
  cr_assert_eq(mkdir(fallback, 0700), 0);
  char planted[1100], marker[600];
  snprintf(planted, sizeof planted, "%s/%s", fallback, strrchr(good, '/') + 1);
  snprintf(marker, sizeof marker, "%s/marker", root);
  char text[1500];
  snprintf(text, sizeof text,
           "#include <stdio.h>\n"
           "__attribute__((constructor)) static void evil(void) { FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f); }\n"
           "void k0_add(float *o, const float *a, const float *b, int n) { for (int i = 0; i < n; i++) o[i] = 999.f; }\n",
           marker);
  compile_so(text, planted);
  cr_assert_eq(chmod(fallback, mode), 0);
  cr_assert_eq(chown(fallback, uid, uid), 0);
  cr_assert_eq(chown(planted, uid, uid), 0);

  cc = open_cc();
  const char *used = lm_cc_cache_dir();
  cr_assert_str_neq(used, fallback, "the foreign fallback was used");
  cr_assert(!strncmp(used, fallback, strlen(fallback)) && used[strlen(fallback)] == '-',
            "a private substitute next to it: %s", used);
  struct stat sb;
  cr_assert_eq(lstat(used, &sb), 0);
  cr_assert(S_ISDIR(sb.st_mode) && (sb.st_mode & 077) == 0 && sb.st_uid == geteuid());
  cr_assert(strstr(lm_cc_notice(), fallback) && strstr(lm_cc_notice(), used), "notice: %s", lm_cc_notice());
  char path[1100];
  build_and_check_add(cc, path, sizeof path);
  cr_assert(!strncmp(path, used, strlen(used)), "%s", path);
  lm_cc_close(cc);
  cr_assert(!exists(marker), "the planted object ran");
  cr_assert_eq(count_entries(fallback), 1, "the foreign fallback's files are not touched");
  remove_tree(used);
}

Test(cache_trust, a_world_writable_tmp_fallback_is_not_used) { check_foreign_fallback(0777, geteuid()); }

Test(cache_trust, a_tmp_fallback_owned_by_another_uid_is_not_used) {
  need_root();
  check_foreign_fallback(0700, OTHER_UID);
}

Test(cache_trust, a_missing_tmp_fallback_is_created_private_and_used) {
  use_fallback();
  lm_cc *cc = open_cc();
  cr_assert_str_eq(lm_cc_cache_dir(), fallback);
  char path[1100];
  build_and_check_add(cc, path, sizeof path);
  cr_assert(!strncmp(path, fallback, strlen(fallback)) && path[strlen(fallback)] == '/', "%s", path);
  struct stat sb;
  cr_assert_eq(lstat(fallback, &sb), 0);
  cr_assert_eq(sb.st_mode & 077, 0);
  lm_cc_close(cc);
}

/* ---- cached objects --------------------------------------------------------------------------- */

Test(cache_trust, a_planted_shared_object_is_not_run_and_is_rebuilt) {
  lm_cc *cc = open_cc();
  char so[1100];
  build_and_check_add(cc, so, sizeof so);
  char evil[600], marker[600], text[1500];
  snprintf(evil, sizeof evil, "%s/evil.so", root);
  snprintf(marker, sizeof marker, "%s/marker", root);
  snprintf(text, sizeof text,
           "#include <stdio.h>\n"
           "__attribute__((constructor)) static void evil(void) { FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f); }\n"
           "void k0_add(float *o, const float *a, const float *b, int n) { for (int i = 0; i < n; i++) o[i] = 999.f; }\n",
           marker);
  compile_so(text, evil);
  replace_with(so, evil, 0);
  int64_t builds = lm_cc_compile_count(), rebuilds = lm_cc_rebuild_count();
  build_and_check_add(cc, NULL, 0); /* checks the sum: the planted k0_add writes 999 */
  cr_assert(!exists(marker), "the planted object's constructor ran");
  cr_assert_eq(lm_cc_compile_count(), builds + 1, "rebuilt");
  cr_assert_eq(lm_cc_rebuild_count(), rebuilds + 1);
  cr_assert(strstr(lm_cc_notice(), so), "the notice names the object: %s", lm_cc_notice());
  /* and the rebuilt object is a plain cache hit afterwards */
  build_and_check_add(cc, NULL, 0);
  cr_assert_eq(lm_cc_compile_count(), builds + 1);
  lm_cc_close(cc);
}

Test(cache_trust, a_truncated_cached_object_is_rebuilt_without_a_crash) {
  lm_cc *cc = open_cc();
  char so[1100], whole[1200];
  build_and_check_add(cc, so, sizeof so);
  snprintf(whole, sizeof whole, "%s/whole.so", root);
  replace_with(whole, so, 0);
  size_t sizes[] = {1000, 5000, file_size(whole) / 2, file_size(whole) - 1};
  for (size_t i = 0; i < LM_COUNTOF(sizes); i++) {
    replace_with(so, whole, sizes[i]);
    cr_assert_eq(file_size(so), sizes[i]);
    int64_t builds = lm_cc_compile_count(), rebuilds = lm_cc_rebuild_count();
    build_and_check_add(cc, NULL, 0);
    cr_assert_eq(lm_cc_compile_count(), builds + 1, "size %zu: rebuilt", sizes[i]);
    cr_assert_eq(lm_cc_rebuild_count(), rebuilds + 1);
    cr_assert(strstr(lm_cc_notice(), "short") || strstr(lm_cc_notice(), "seal"), "%s", lm_cc_notice());
  }
  lm_cc_close(cc);
}

Test(cache_trust, a_valid_object_without_the_symbol_is_rebuilt) {
  lm_cc *cc = open_cc();
  char so[1100], other[600];
  build_and_check_add(cc, so, sizeof so);
  snprintf(other, sizeof other, "%s/other.so", root);
  compile_so("int k0_something_else(void) { return 1; }\n", other);
  replace_with(so, other, 0);
  int64_t rebuilds = lm_cc_rebuild_count();
  build_and_check_add(cc, NULL, 0);
  cr_assert_eq(lm_cc_rebuild_count(), rebuilds + 1);
  lm_cc_close(cc);
}

Test(cache_trust, an_object_sealed_for_another_kernel_is_rebuilt) {
  lm_cc *cc = open_cc();
  lm_cc_lib *lib = NULL;
  cr_assert_eq(lm_cc_build(cc, "int k0_other(void) { return 5; }\n", &lib), LM_OK, "%s", lm_last_error());
  char other[1100], so[1100];
  snprintf(other, sizeof other, "%s", lm_cc_lib_path(lib));
  lm_cc_lib_close(lib);
  build_and_check_add(cc, so, sizeof so);
  replace_with(so, other, 0); /* a genuine lumen object, sealed under another name */
  int64_t rebuilds = lm_cc_rebuild_count();
  build_and_check_add(cc, NULL, 0);
  cr_assert_eq(lm_cc_rebuild_count(), rebuilds + 1);
  cr_assert(strstr(lm_cc_notice(), "another file"), "%s", lm_cc_notice());
  lm_cc_close(cc);
}

Test(cache_trust, a_cached_object_writable_by_others_is_rebuilt) {
  lm_cc *cc = open_cc();
  char so[1100];
  build_and_check_add(cc, so, sizeof so);
  cr_assert_eq(chmod(so, 0666), 0);
  int64_t rebuilds = lm_cc_rebuild_count();
  build_and_check_add(cc, NULL, 0);
  cr_assert_eq(lm_cc_rebuild_count(), rebuilds + 1);
  struct stat sb;
  cr_assert_eq(stat(so, &sb), 0);
  cr_assert_eq(sb.st_mode & 022, 0, "the rebuilt object is private again");
  lm_cc_close(cc);
}

/* ---- the key file ----------------------------------------------------------------------------- */

Test(cache_trust, the_key_file_is_32_private_bytes_of_ours) {
  lm_cc *cc = open_cc();
  char key[600];
  snprintf(key, sizeof key, "%s/mac-key", cache);
  struct stat sb;
  cr_assert_eq(lstat(key, &sb), 0);
  cr_assert(S_ISREG(sb.st_mode));
  cr_assert_eq(sb.st_mode & 0777, 0600, "mode %o", (unsigned)sb.st_mode & 0777);
  cr_assert_eq(sb.st_uid, geteuid());
  cr_assert_eq(sb.st_size, 32);
  lm_cc_close(cc);
}

Test(cache_trust, a_key_file_readable_by_others_refuses_the_dir_until_removed) {
  lm_cc *cc = open_cc();
  char so[1100];
  build_and_check_add(cc, so, sizeof so);
  lm_cc_close(cc);
  char key[600];
  snprintf(key, sizeof key, "%s/mac-key", cache);
  cr_assert_eq(chmod(key, 0644), 0);
  lm_cc *bad = (lm_cc *)1;
  cr_assert_neq(lm_cc_open(&bad), LM_OK, "a key others can read was used");
  cr_assert(strstr(lm_last_error(), key) && strstr(lm_last_error(), "0644"), "%s", lm_last_error());
  cr_assert(strstr(lm_last_error(), "remove"), "%s", lm_last_error());
  /* removed: a new key, and the object sealed with the old one is rebuilt */
  cr_assert_eq(unlink(key), 0);
  cc = open_cc();
  int64_t rebuilds = lm_cc_rebuild_count();
  build_and_check_add(cc, NULL, 0);
  cr_assert_eq(lm_cc_rebuild_count(), rebuilds + 1);
  cr_assert(strstr(lm_cc_notice(), "does not match"), "%s", lm_cc_notice());
  lm_cc_close(cc);
}

Test(cache_trust, a_symlinked_or_foreign_key_file_refuses_the_dir) {
  lm_cc *cc = open_cc();
  lm_cc_close(cc);
  char key[600], copy[600];
  snprintf(key, sizeof key, "%s/mac-key", cache);
  snprintf(copy, sizeof copy, "%s/key-copy", root);
  replace_with(copy, key, 0); /* 32 bytes, 0600, ours: only the link is wrong */
  cr_assert_eq(unlink(key), 0);
  cr_assert_eq(symlink(copy, key), 0);
  lm_cc *bad = (lm_cc *)1;
  cr_assert_neq(lm_cc_open(&bad), LM_OK, "a symlinked key was followed");
  cr_assert(strstr(lm_last_error(), key), "%s", lm_last_error());
  if (geteuid() != 0) return;
  cr_assert_eq(unlink(key), 0);
  replace_with(key, copy, 0);
  cr_assert_eq(chown(key, OTHER_UID, OTHER_UID), 0);
  cr_assert_neq(lm_cc_open(&bad), LM_OK, "a key of another uid was used");
  cr_assert(strstr(lm_last_error(), "uid 65534"), "%s", lm_last_error());
}

/* ---- sealed files (the CUBIN and msl caches use the same calls) ------------------------------- */

Test(cache_trust, a_sealed_file_reads_back_and_fails_on_any_change) {
  char *dir = NULL;
  lm_cc_secret secret;
  cr_assert_eq(lm_cc_cache_open_dir(&dir, &secret), LM_OK, "%s", lm_last_error());
  char path[800], moved[800];
  snprintf(path, sizeof path, "%s/0123.cubin", dir);
  snprintf(moved, sizeof moved, "%s/4567.cubin", dir);
  static const char payload[] = "\x7f" "ELF pretend cubin bytes";
  cr_assert_eq(lm_cc_sealed_write(&secret, path, payload, sizeof payload), LM_OK, "%s", lm_last_error());
  char *data = NULL;
  size_t n = 0;
  cr_assert_eq(lm_cc_sealed_read(&secret, path, &data, &n), LM_OK, "%s", lm_last_error());
  cr_assert_eq(n, sizeof payload);
  cr_assert(!memcmp(data, payload, n));
  lm_free(data);
  /* every single flipped byte is caught */
  size_t size = file_size(path);
  char orig[800];
  snprintf(orig, sizeof orig, "%s/orig", root);
  replace_with(orig, path, 0);
  for (size_t i = 0; i < size; i++) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, (long)i, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)i, SEEK_SET);
    fputc(c ^ 0x20, f);
    fclose(f);
    cr_assert_eq(lm_cc_sealed_read(&secret, path, NULL, NULL), LM_ERR_CORRUPT, "byte %zu", i);
    replace_with(path, orig, 0);
  }
  /* truncated, another key, another name, writable by others, missing */
  replace_with(path, orig, size - 1);
  cr_assert_eq(lm_cc_sealed_read(&secret, path, NULL, NULL), LM_ERR_CORRUPT);
  replace_with(path, orig, 0);
  lm_cc_secret other = secret;
  other.bytes[31] ^= 1;
  cr_assert_eq(lm_cc_sealed_read(&other, path, NULL, NULL), LM_ERR_CORRUPT);
  replace_with(moved, orig, 0);
  cr_assert_eq(lm_cc_sealed_read(&secret, moved, NULL, NULL), LM_ERR_CORRUPT);
  cr_assert(strstr(lm_last_error(), "another file"), "%s", lm_last_error());
  cr_assert_eq(chmod(path, 0622), 0);
  cr_assert_eq(lm_cc_sealed_read(&secret, path, NULL, NULL), LM_ERR_CORRUPT);
  cr_assert_eq(chmod(path, 0600), 0);
  cr_assert_eq(lm_cc_sealed_read(&secret, path, NULL, NULL), LM_OK, "%s", lm_last_error());
  unlink(path);
  cr_assert_eq(lm_cc_sealed_read(&secret, path, NULL, NULL), LM_ERR_IO);
  lm_free(dir);
}

/* ---- the tuning cache ------------------------------------------------------------------------- */

static void tuning_cache_write(const char *path) {
  sk_cache c;
  cr_assert_eq(skc_load(&c, path), LM_OK, "%s", lm_last_error());
  cr_assert_eq(skc_put(&c, 0x1234, "tile=4x16"), LM_OK);
  cr_assert_eq(skc_save(&c), LM_OK, "%s", lm_last_error());
  skc_free(&c);
}

/* 1 if skc_load read the entry tuning_cache_write left. */
static int tuning_cache_reads(const char *path) {
  sk_cache c;
  int found = skc_load(&c, path) == LM_OK && skc_get(&c, 0x1234) && !strcmp(skc_get(&c, 0x1234), "tile=4x16");
  skc_free(&c);
  return found;
}

Test(cache_trust, an_untrusted_tuning_cache_is_not_read) {
  cr_assert_eq(mkdir(cache, 0700), 0);
  char path[700];
  snprintf(path, sizeof path, "%s/search-0123456789abcdef.txt", cache);
  tuning_cache_write(path);
  cr_assert(tuning_cache_reads(path), "the private cache is read: %s", lm_last_error());
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_assert_eq(sb.st_mode & 077, 0, "saved private (mode %o)", (unsigned)sb.st_mode & 0777);

  cr_assert_eq(chmod(path, 0666), 0);
  cr_assert(!tuning_cache_reads(path), "a world-writable tuning cache was read");
  cr_assert(strstr(lm_last_error(), path), "%s", lm_last_error());
  cr_assert_eq(chmod(path, 0600), 0);
  cr_assert(tuning_cache_reads(path));

  char link[800];
  snprintf(link, sizeof link, "%s/search-link.txt", cache);
  cr_assert_eq(symlink(path, link), 0);
  cr_assert(!tuning_cache_reads(link), "a symlinked tuning cache was read");

  cr_assert_eq(chmod(cache, 0777), 0);
  cr_assert(!tuning_cache_reads(path), "a tuning cache in a world-writable folder was read");
  cr_assert_eq(chmod(cache, 0700), 0);

  if (geteuid() != 0) return;
  cr_assert_eq(chown(path, OTHER_UID, OTHER_UID), 0);
  cr_assert(!tuning_cache_reads(path), "a tuning cache of another uid was read");
  cr_assert(strstr(lm_last_error(), "uid 65534"), "%s", lm_last_error());
}

/* Objects are loaded as /proc/self/fd/<n>: a descriptor number freed by one object and reused by
 * the next must never hand back the first (the loader matches names before files). */
Test(cache_trust, a_reused_descriptor_number_never_loads_the_wrong_object) {
  lm_cc *cc = open_cc();
  lm_cc_lib *a1 = NULL, *a2 = NULL, *b = NULL;
  cr_assert_eq(lm_cc_build(cc, "int k0_which(void) { return 1; }\n", &a1), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_cc_build(cc, "int k0_which(void) { return 1; }\n", &a2), LM_OK, "%s", lm_last_error());
  lm_cc_lib_close(a1); /* the object stays loaded through a2 */
  cr_assert_eq(lm_cc_build(cc, "int k0_which(void) { return 2; }\n", &b), LM_OK, "%s", lm_last_error());
  int (*fa)(void), (*fb)(void);
  *(void **)&fa = lm_cc_sym(a2, "k0_which");
  *(void **)&fb = lm_cc_sym(b, "k0_which");
  cr_assert(fa && fb);
  cr_assert_eq(fa(), 1);
  cr_assert_eq(fb(), 2, "the second object's name was taken for the first");
  lm_cc_lib_close(a2);
  lm_cc_lib_close(b);
  lm_cc_close(cc);
}
