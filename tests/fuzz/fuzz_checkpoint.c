/* tests/fuzz/fuzz_checkpoint.c — libFuzzer target for checkpoint files (train/checkpoint.c):
 * each input is written to a file and read by lm_checkpoint_peek and by lm_trainer_load into a
 * trainer made once (ref backend, cartpole, 8 envs x 16 steps, one hidden layer of 8: the
 * shape of the seeds in tests/fuzz/corpus/checkpoint/). A read that succeeds must leave what
 * the reader promises: a config within lm_ppo_config_check, counters that agree. Built with
 * FUZZ_FIX_CHECKSUM (fuzz_checkpoint_body.c), the input's last 8 bytes are first replaced by the
 * FNV-1a checksum of the rest, so the mutations reach the header and the arrays.
 * LUMEN_FUZZ_WRITE_SEEDS=DIR: write the seed corpus to DIR and exit. */
#include "fuzz_util.h"

#include "compiler/core.h"
#include "lumen/lumen.h"

static lm_backend_t *B;
static lm_trainer *T;
static const char *input;

static lm_ppo_config fuzz_config(const lm_env_spec *env) {
  lm_ppo_config c = lm_ppo_defaults(env);
  c.n_envs = 8;
  c.horizon = 16;
  c.minibatches = 2;
  c.epochs = 1;
  c.policy.layers = 1;
  c.policy.hidden[0] = 8;
  return c;
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) fz_die(path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  rewind(f);
  unsigned char *p = malloc((size_t)len + 1);
  if (!p || fread(p, 1, (size_t)len, f) != (size_t)len) fz_die(path, "read");
  fclose(f);
  *n = (size_t)len;
  return p;
}

static void fix_checksum(unsigned char *p, size_t n) {
  uint64_t sum = lm_hash_bytes(p, n - 8, 0);
  memcpy(p + n - 8, &sum, 8);
}

/* The good checkpoint with header line `key = old` replaced by `key = value`, the header length
 * and the checksum made valid again. */
static void write_variant(const char *dir, const char *name, const unsigned char *good, size_t n, const char *key,
                          const char *value) {
  uint32_t hlen;
  memcpy(&hlen, good + 12, 4);
  char *head = malloc(hlen + 1);
  memcpy(head, good + 16, hlen);
  head[hlen] = 0;
  char want[64];
  snprintf(want, sizeof want, "\n%s = ", key);
  char *at = strncmp(head, want + 1, strlen(want + 1)) ? strstr(head, want) : head - 1;
  if (!at) fz_die("seed variant: no such key", key);
  at += strlen(want);
  char *eol = strchr(at, '\n');
  size_t cap = n + strlen(value) + 1;
  unsigned char *out = malloc(cap);
  size_t k = 0, pre = (size_t)(at - head);
  memcpy(out, good, 16);
  k = 16;
  memcpy(out + k, head, pre), k += pre;
  memcpy(out + k, value, strlen(value)), k += strlen(value);
  size_t post = hlen - (size_t)(eol - head);
  memcpy(out + k, eol, post), k += post;
  uint32_t nh = (uint32_t)(k - 16);
  memcpy(out + 12, &nh, 4);
  memcpy(out + k, good + 16 + hlen, n - 16 - hlen), k += n - 16 - hlen;
  fix_checksum(out, k);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  fz_write(path, out, k);
  free(out);
  free(head);
}

static void write_seeds(const char *dir) {
  char path[1024];
  snprintf(path, sizeof path, "%s/fresh.ckpt", dir); /* iteration 0 */
  if (lm_trainer_save(T, path) != LM_OK) fz_die("save", lm_last_error());
  lm_iter_stats s;
  for (int i = 0; i < 3; i++) /* a few finished episodes for "recent" */
    if (lm_trainer_iterate(T, &s) != LM_OK) fz_die("iterate", lm_last_error());
  snprintf(path, sizeof path, "%s/good.ckpt", dir);
  if (lm_trainer_save(T, path) != LM_OK) fz_die("save", lm_last_error());
  size_t n;
  unsigned char *good = read_file(path, &n);
  write_variant(dir, "other-env.ckpt", good, n, "env", "acrobot");
  write_variant(dir, "recent-bad.ckpt", good, n, "recent", "2 1:20 0:5");
  write_variant(dir, "hidden-2.ckpt", good, n, "hidden", "8,8");
  write_variant(dir, "steps-off.ckpt", good, n, "env_steps", "385");
  snprintf(path, sizeof path, "%s/truncated.ckpt", dir);
  fz_write(path, good, n / 2);
  free(good);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const lm_env_spec *env = lm_env_find("cartpole");
  if (!env) fz_die("lm_env_find", "no cartpole");
  if (!(B = lm_backend_new("ref"))) fz_die("lm_backend_new", lm_last_error());
  lm_ppo_config c = fuzz_config(env);
  if (!(T = lm_trainer_new(B, env, &c))) fz_die("lm_trainer_new", lm_last_error());
  const char *seeds = getenv("LUMEN_FUZZ_WRITE_SEEDS");
  if (seeds && *seeds) {
    write_seeds(seeds);
    exit(0);
  }
  input = fz_path("input.ckpt");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#ifdef FUZZ_FIX_CHECKSUM
  if (size < 8) return 0;
  unsigned char *copy = malloc(size);
  if (!copy) return 0;
  memcpy(copy, data, size);
  fix_checksum(copy, size);
  fz_write(input, copy, size);
  free(copy);
#else
  fz_write(input, data, size);
#endif
  char env[64];
  lm_ppo_config cfg;
  if (lm_checkpoint_peek(input, env, sizeof env, &cfg) == LM_OK && lm_ppo_config_check(&cfg) != LM_OK) {
    fprintf(stderr, "peek accepted a config lm_ppo_config_check refuses: %s\n", lm_last_error());
    abort();
  }
  if (lm_trainer_load(T, input) == LM_OK) {
    const lm_ppo_config *mine = lm_trainer_config(T);
    if (lm_trainer_env_steps(T) != lm_trainer_iterations(T) * mine->n_envs * mine->horizon) {
      fprintf(stderr, "a loaded checkpoint's counters disagree\n");
      abort();
    }
  }
  return 0;
}
