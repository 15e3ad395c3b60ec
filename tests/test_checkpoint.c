/* tests/test_checkpoint.c — checkpoints as an attacker or a broken disk would write them. The
 * checksum is FNV-1a, which anyone can recompute, so every crafted file here carries a valid
 * one: what must refuse it is the reader's own range checks. Each case is built by the test
 * from a real checkpoint; none may crash, hang, allocate wildly or load. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/core.h"
#include "lumen/lumen.h"
#include "support/timeout.h"

typedef struct blob {
  unsigned char *p;
  size_t n;
} blob;

static lm_backend_t *B;
static lm_trainer *T;
static char dir[64];
static blob good;

static blob read_all(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  blob b = {malloc((size_t)n + 1), (size_t)n};
  cr_assert_eq(fread(b.p, 1, b.n, f), b.n);
  fclose(f);
  return b;
}

static void write_all(const char *path, const blob *b) {
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  cr_assert_eq(fwrite(b->p, 1, b->n, f), b->n);
  fclose(f);
}

static void setup(void) {
  B = lm_backend_new("cpu");
  cr_assert(B, "%s", lm_last_error());
  lm_ppo_config c = lm_ppo_defaults(lm_env_find("cartpole"));
  c.n_envs = 8;
  c.horizon = 16;
  c.minibatches = 2;
  c.epochs = 1;
  T = lm_trainer_new(B, lm_env_find("cartpole"), &c);
  cr_assert(T, "%s", lm_last_error());
  lm_iter_stats s;
  cr_assert_eq(lm_trainer_iterate(T, &s), LM_OK, "%s", lm_last_error());
  snprintf(dir, sizeof dir, "/tmp/lumen-ckpt-XXXXXX");
  cr_assert(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof path, "%s/good.ckpt", dir);
  cr_assert_eq(lm_trainer_save(T, path), LM_OK, "%s", lm_last_error());
  good = read_all(path);
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
  free(good.p);
  lm_trainer_free(T);
  lm_backend_free(B);
}

/* A copy of the good checkpoint with header line `key = ...` replaced by `key = value` (or the
 * first array's floats replaced by `fill`), its header length and checksum made valid again. */
static blob craft(const char *key, const char *value, int fill_nan) {
  uint32_t hlen;
  memcpy(&hlen, good.p + 12, 4);
  const char *head = (const char *)good.p + 16;
  char *h = malloc(hlen + 256);
  size_t hn = 0, k = key ? strlen(key) : 0;
  int found = !key;
  for (size_t at = 0; at < hlen;) {
    const char *e = memchr(head + at, '\n', hlen - at);
    size_t len = e ? (size_t)(e - (head + at)) + 1 : hlen - at;
    if (key && !strncmp(head + at, key, k) && !strncmp(head + at + k, " = ", 3)) {
      hn += (size_t)sprintf(h + hn, "%s = %s\n", key, value);
      found = 1;
    } else {
      memcpy(h + hn, head + at, len);
      hn += len;
    }
    at += len;
  }
  cr_assert(found, "no header line %s", key ? key : "(none)");
  size_t rest = good.n - 16 - hlen - 8; /* arrays, without the checksum */
  blob b = {malloc(16 + hn + rest + 8), 16 + hn + rest + 8};
  memcpy(b.p, good.p, 12);
  uint32_t nh = (uint32_t)hn;
  memcpy(b.p + 12, &nh, 4);
  memcpy(b.p + 16, h, hn);
  memcpy(b.p + 16 + hn, good.p + 16 + hlen, rest);
  free(h);
  if (fill_nan) { /* count(4) len(2) name(len) n(8) floats */
    unsigned char *a = b.p + 16 + hn + 4;
    uint16_t len;
    memcpy(&len, a, 2);
    uint64_t cnt;
    memcpy(&cnt, a + 2 + len, 8);
    float nan = NAN;
    for (uint64_t i = 0; i < cnt; i++) memcpy(a + 2 + len + 8 + 4 * i, &nan, 4);
  }
  uint64_t sum = lm_hash_bytes(b.p, b.n - 8, 0);
  memcpy(b.p + b.n - 8, &sum, 8);
  return b;
}

/* Writes the crafted file and checks that peek and load both refuse it with `status` and a
 * message holding `says`. */
static void refused(const blob *b, lm_status status, const char *says, const char *what) {
  char path[128];
  snprintf(path, sizeof path, "%s/crafted.ckpt", dir);
  write_all(path, b);
  char env[64];
  lm_ppo_config cfg;
  lm_status st = lm_checkpoint_peek(path, env, sizeof env, &cfg);
  if (st == LM_OK) { /* the header may be fine: then the load must refuse */
    cr_assert_eq(lm_ppo_config_check(&cfg), LM_OK, "%s: peek accepted a config out of range", what);
  } else {
    cr_assert_eq(st, status, "%s: peek gave %d: %s", what, (int)st, lm_last_error());
    cr_assert(strstr(lm_last_error(), says), "%s: peek said '%s', not '%s'", what, lm_last_error(), says);
  }
  st = lm_trainer_load(T, path);
  cr_assert_eq(st, status, "%s: load gave %d: %s", what, (int)st, lm_last_error());
  cr_assert(strstr(lm_last_error(), says), "%s: load said '%s', not '%s'", what, lm_last_error(), says);
}

TestSuite(checkpoint, .init = setup, .fini = teardown, .timeout = LM_TIMEOUT(60));

Test(checkpoint, the_unchanged_crafting_loads) {
  blob b = craft(NULL, NULL, 0);
  char path[128];
  snprintf(path, sizeof path, "%s/same.ckpt", dir);
  write_all(path, &b);
  cr_assert_eq(lm_trainer_load(T, path), LM_OK, "%s", lm_last_error());
  free(b.p);
}

Test(checkpoint, header_values_out_of_range_are_refused_before_anything_is_allocated) {
  const struct {
    const char *key, *value, *says;
  } cases[] = {
      {"envs", "4294967296", "envs"},        {"steps", "4294967296", "steps"},     {"envs", "1000000000", "envs"},
      {"envs", "0", "envs"},                 {"envs", "-8", "envs"},               {"envs", "2.7", "envs"},
      {"envs", "0x8", "envs"},               {"envs", "8junk", "envs"},            {"envs", "", "envs"},
      {"minibatches", "3", "minibatches"},   {"epochs", "0", "epochs"},            {"lr", "nan", "lr"},
      {"lr", "inf", "lr"},                   {"lr", "-1", "lr"},                   {"gamma", "1.5", "gamma"},
      {"total_steps", "0", "total_steps"},   {"hidden", "64,0", "hidden"},         {"hidden", "64,", "hidden"},
      {"hidden", "1,2,3,4,5", "hidden"},     {"hidden", "100000", "hidden"},       {"activation", "gelu", "activation"},
      {"stepper", "gpu", "stepper"},         {"seed", "-1", "seed"},               {"seed", "99999999999999999999", "seed"},
      {"iteration", "-5", "counters"},       {"env_steps", "-128", "counters"},    {"iteration", "7", "env_steps"},
      {"env_steps", "999", "env_steps"},     {"shuffle", "x", "counters"},         {"rollout_run", "-1", "counters"},
      {"iteration", "9223372036854775807", "counters"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    blob b = craft(cases[i].key, cases[i].value, 0);
    char what[96];
    snprintf(what, sizeof what, "%s = '%s'", cases[i].key, cases[i].value);
    refused(&b, LM_ERR_CORRUPT, cases[i].says, what);
    free(b.p);
  }
}

Test(checkpoint, non_finite_weights_are_refused_with_the_array_named) {
  blob b = craft(NULL, NULL, 1);
  uint16_t len;
  memcpy(&len, b.p + 16 + *(uint32_t *)(void *)(good.p + 12) + 4, 2);
  char name[64] = {0};
  memcpy(name, b.p + 16 + *(uint32_t *)(void *)(good.p + 12) + 6, len);
  refused(&b, LM_ERR_CORRUPT, name, "NaN weights");
  cr_assert(strstr(lm_last_error(), "non-finite"), "%s", lm_last_error());
  free(b.p);
}

Test(checkpoint, devices_fifos_directories_and_empty_paths_are_refused_without_reading) {
  lm_ppo_config cfg;
  char env[64];
  const char *paths[] = {"/dev/zero", "/dev/null", "/tmp", ""};
  for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
    lm_status st = lm_trainer_load(T, paths[i]);
    cr_assert(st == LM_ERR_CORRUPT || st == LM_ERR_INVALID, "%s: %d: %s", paths[i], (int)st, lm_last_error());
    cr_assert_neq(lm_checkpoint_peek(paths[i], env, sizeof env, &cfg), LM_OK, "%s", paths[i]);
  }
  char fifo[128];
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);
  cr_assert_eq(mkfifo(fifo, 0600), 0, "%s", strerror(errno));
  cr_assert_eq(lm_trainer_load(T, fifo), LM_ERR_CORRUPT, "%s", lm_last_error()); /* would block reading */
  cr_assert(strstr(lm_last_error(), "regular file"), "%s", lm_last_error());
}

Test(checkpoint, a_huge_or_foreign_file_is_refused_by_its_size_or_magic_before_it_is_read) {
  char path[128];
  snprintf(path, sizeof path, "%s/huge.ckpt", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, good.p, 64), 64); /* the right magic, then a hole */
  cr_assert_eq(ftruncate(fd, (off_t)1 << 35), 0, "%s", strerror(errno)); /* 32 GiB, sparse */
  close(fd);
  cr_assert_eq(lm_trainer_load(T, path), LM_ERR_CORRUPT, "%s", lm_last_error());
  cr_assert(strstr(lm_last_error(), "over the limit"), "%s", lm_last_error());
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  cr_assert_eq(write(fd, "NOTLUMEN", 8), 8);
  cr_assert_eq(ftruncate(fd, (off_t)1 << 33), 0); /* 8 GiB: more than this test may allocate */
  close(fd);
  cr_assert_eq(lm_trainer_load(T, path), LM_ERR_CORRUPT, "%s", lm_last_error());
  cr_assert(strstr(lm_last_error(), "not a lumen checkpoint"), "%s", lm_last_error());
}

/* ================================================================ checkpoints off the training thread */

/* lm_checkpointer_save writes the bytes lm_trainer_save writes, to every path, in order; a later
 * save (after more training) replaces them, and each loads. */
Test(checkpoint, the_checkpointer_writes_each_path_with_lm_trainer_saves_bytes) {
  char a[128], b[128];
  snprintf(a, sizeof a, "%s/step.ckpt", dir);
  snprintf(b, sizeof b, "%s/latest.ckpt", dir);
  lm_checkpointer *w = lm_checkpointer_new();
  cr_assert(w);
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){a, b}, 2), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_checkpointer_finish(w), LM_OK, "%s", lm_last_error());
  for (int i = 0; i < 2; i++) {
    blob got = read_all(i ? b : a);
    cr_assert(got.n == good.n && !memcmp(got.p, good.p, good.n), "%s differs from lm_trainer_save's bytes", i ? b : a);
    free(got.p);
  }
  lm_iter_stats s;
  cr_assert_eq(lm_trainer_iterate(T, &s), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){a, b}, 2), LM_OK, "%s", lm_last_error());
  lm_checkpointer_free(w); /* finishes the write */
  blob got = read_all(b);
  cr_assert(got.n != good.n || memcmp(got.p, good.p, good.n), "the second save did not replace the first");
  free(got.p);
  cr_assert_eq(lm_trainer_load(T, a), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_trainer_iterations(T), 2);
  DIR *d = opendir(dir);
  cr_assert(d);
  for (struct dirent *e; (e = readdir(d));)
    cr_assert(!strstr(e->d_name, ".tmp."), "a temp file is left: %s", e->d_name);
  closedir(d);
}

/* A path that cannot be written (a non-empty directory in its place): the paths before it in
 * that save are removed, and the failure, naming the path, comes back from the next save (which
 * then writes nothing) or from finish. */
Test(checkpoint, a_checkpointer_write_that_fails_removes_the_saves_earlier_files_and_says_so_later) {
  char a[128], bad[128], c[128], cmd[400];
  snprintf(a, sizeof a, "%s/step.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/latest.ckpt", dir);
  snprintf(c, sizeof c, "%s/next.ckpt", dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && touch '%s/x'", bad, bad);
  cr_assert_eq(system(cmd), 0);
  lm_checkpointer *w = lm_checkpointer_new();
  cr_assert(w);
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){a, bad}, 2), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){c}, 1), LM_ERR_IO);
  cr_assert(strstr(lm_last_error(), "latest.ckpt"), "%s", lm_last_error());
  cr_assert_neq(access(a, F_OK), 0, "step.ckpt is left though latest.ckpt was not written");
  cr_assert_neq(access(c, F_OK), 0, "the save after a failure wrote");
  cr_assert_eq(lm_checkpointer_finish(w), LM_OK, "a failure is told once");
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){a, bad}, 2), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_checkpointer_finish(w), LM_ERR_IO);
  cr_assert(strstr(lm_last_error(), "latest.ckpt"), "%s", lm_last_error());
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){c}, 1), LM_OK, "%s", lm_last_error());
  lm_checkpointer_free(w);
  cr_assert_eq(lm_trainer_load(T, c), LM_OK, "%s", lm_last_error());
}

Test(checkpoint, a_checkpointer_refuses_missing_or_empty_arguments_with_a_message) {
  char a[128];
  snprintf(a, sizeof a, "%s/x.ckpt", dir);
  lm_checkpointer *w = lm_checkpointer_new();
  cr_assert(w);
  const char *const empty[] = {a, ""};
  cr_assert_eq(lm_checkpointer_save(NULL, T, (const char *const[]){a}, 1), LM_ERR_INVALID);
  cr_assert_eq(lm_checkpointer_save(w, NULL, (const char *const[]){a}, 1), LM_ERR_INVALID);
  cr_assert_eq(lm_checkpointer_save(w, T, NULL, 1), LM_ERR_INVALID);
  cr_assert_eq(lm_checkpointer_save(w, T, (const char *const[]){a}, 0), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "lm_checkpointer_save"), "%s", lm_last_error());
  cr_assert_eq(lm_checkpointer_save(w, T, empty, 2), LM_ERR_INVALID);
  cr_assert(strstr(lm_last_error(), "path 1 is empty"), "%s", lm_last_error());
  cr_assert_neq(access(a, F_OK), 0, "a refused save wrote");
  cr_assert_eq(lm_checkpointer_finish(NULL), LM_ERR_INVALID);
  lm_checkpointer_free(w);
  lm_checkpointer_free(NULL);
}
