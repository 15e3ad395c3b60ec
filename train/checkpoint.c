/* train/checkpoint.c — checkpoint files: a versioned header with the env, the config and
 * the counters as text, then named float arrays (weights, optimiser state, env state and
 * episode counters), then an FNV-1a checksum of everything before it. Written to a temp
 * file and renamed, so a crash never leaves a half-written checkpoint. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/core.h"
#include "lumen/train.h"

enum { CKPT_VERSION = 1, MAX_ARRAYS = 128 };
static const char magic[8] = {'L', 'U', 'M', 'E', 'N', 'C', 'K', 'P'};

/* Internal access the trainer grants the checkpoint code. */
lm_program_t *lm_trainer_update_program(lm_trainer *t);
void lm_trainer_counters(lm_trainer *t, int64_t **iter, int64_t **steps, uint64_t **shuffle);
const lm_env_spec *lm_trainer_env(const lm_trainer *t);

typedef struct array {
  char name[64];
  size_t count;
  int rollout; /* lives in the rollout (else the update program) */
} array;

static int list_arrays(lm_trainer *t, array *a) {
  int n = 0;
  lm_program_t *u = lm_trainer_update_program(t);
  for (int i = 0; i < lm_program_input_count(u) && n < MAX_ARRAYS; i++) {
    lm_role r = lm_program_input_role(u, i);
    if (r != LM_ROLE_PARAM && r != LM_ROLE_STATE) continue;
    snprintf(a[n].name, sizeof a[n].name, "%s", lm_program_input_name(u, i));
    if (lm_program_numel(u, a[n].name, &a[n].count) != LM_OK) return -1;
    a[n++].rollout = 0;
  }
  const char *names[16];
  size_t counts[16];
  int k = lm_rollout_state_list(lm_trainer_rollout(t), names, counts, 16);
  for (int i = 0; i < k && n < MAX_ARRAYS; i++, n++) {
    snprintf(a[n].name, sizeof a[n].name, "%s", names[i]);
    a[n].count = counts[i];
    a[n].rollout = 1;
  }
  return n;
}

static void put(lm_sb *b, const void *data, size_t n) {
  /* the string builder holds binary too: append byte by byte through a growing buffer */
  if (b->failed || !LM_GROW(b->s, b->cap, b->len + n + 1)) {
    b->failed = 1;
    return;
  }
  memcpy(b->s + b->len, data, n);
  b->len += n;
}

lm_status lm_trainer_save(lm_trainer *t, const char *path) {
  array a[MAX_ARRAYS];
  int n = list_arrays(t, a);
  if (n < 0) return LM_ERR_INVALID;
  int64_t *iter, *steps;
  uint64_t *shuffle;
  lm_trainer_counters(t, &iter, &steps, &shuffle);
  char cfgtext[2048];
  lm_ppo_config_print(lm_trainer_config(t), cfgtext, sizeof cfgtext);
  lm_sb head = {0};
  lm_sb_printf(&head, "env = %s\n%siteration = %lld\nenv_steps = %lld\nshuffle = %llu\nrollout_run = %llu\n",
               lm_trainer_env(t)->name, cfgtext, (long long)*iter, (long long)*steps, (unsigned long long)*shuffle,
               (unsigned long long)lm_rollout_run_index(lm_trainer_rollout(t)));
  lm_sb out = {0};
  uint32_t version = CKPT_VERSION, hlen = (uint32_t)head.len, count = (uint32_t)n;
  put(&out, magic, 8);
  put(&out, &version, 4);
  put(&out, &hlen, 4);
  put(&out, head.s, head.len);
  put(&out, &count, 4);
  lm_sb_free(&head);
  lm_status st = LM_OK;
  for (int i = 0; i < n && st == LM_OK; i++) {
    uint16_t len = (uint16_t)strlen(a[i].name);
    uint64_t c = a[i].count;
    float *buf = lm_malloc((a[i].count ? a[i].count : 1) * sizeof *buf);
    if (!buf) {
      st = LM_ERR_NOMEM;
      break;
    }
    st = a[i].rollout ? lm_rollout_state_read(lm_trainer_rollout(t), a[i].name, buf, a[i].count)
                      : lm_program_read(lm_trainer_update_program(t), a[i].name, buf, a[i].count);
    put(&out, &len, 2);
    put(&out, a[i].name, len);
    put(&out, &c, 8);
    put(&out, buf, a[i].count * sizeof *buf);
    lm_free(buf);
  }
  uint64_t sum = lm_hash_bytes(out.s, out.len, 0);
  put(&out, &sum, 8);
  if (st == LM_OK && out.failed) st = LM_ERR_NOMEM;
  if (st == LM_OK) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) st = lm_fail(LM_ERR_IO, "checkpoint: cannot write %s: %s", tmp, strerror(errno));
    else {
      int bad = fwrite(out.s, 1, out.len, f) != out.len;
      bad |= fflush(f) != 0;
      bad |= fsync(fileno(f)) != 0;
      bad |= fclose(f) != 0;
      if (bad || rename(tmp, path) != 0) {
        st = lm_fail(LM_ERR_IO, "checkpoint: writing %s failed: %s", path, strerror(errno));
        remove(tmp);
      }
    }
  }
  lm_sb_free(&out);
  return st;
}

typedef struct reader {
  const unsigned char *p;
  size_t n, at;
} reader;

static int take(reader *r, void *dst, size_t n) {
  if (r->n - r->at < n) return 0;
  memcpy(dst, r->p + r->at, n);
  r->at += n;
  return 1;
}

static lm_status slurp(const char *path, unsigned char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return lm_fail(LM_ERR_IO, "checkpoint: cannot open %s: %s", path, strerror(errno));
  lm_sb b = {0};
  unsigned char chunk[65536];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) put(&b, chunk, got);
  int err = ferror(f);
  fclose(f);
  if (err || b.failed) {
    lm_sb_free(&b);
    return lm_fail(LM_ERR_IO, "checkpoint: cannot read %s", path);
  }
  *data = (unsigned char *)b.s;
  *len = b.len;
  return LM_OK;
}

/* Checks magic, version and checksum; leaves the reader at the header text. */
static lm_status open_checked(const char *path, unsigned char **data, reader *r, char **head) {
  size_t len = 0;
  lm_status st = slurp(path, data, &len);
  if (st != LM_OK) return st;
  *r = (reader){*data, len, 0};
  char m[8];
  uint32_t version = 0, hlen = 0;
  uint64_t sum;
  if (len < 8 + 4 + 4 + 8 || !take(r, m, 8) || memcmp(m, magic, 8))
    return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: not a lumen checkpoint", path);
  memcpy(&sum, *data + len - 8, 8);
  if (lm_hash_bytes(*data, len - 8, 0) != sum)
    return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: checksum mismatch (the file is corrupt or truncated)", path);
  r->n = len - 8;
  if (!take(r, &version, 4) || version != CKPT_VERSION)
    return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: format version %u, this build reads %u", path, version, CKPT_VERSION);
  if (!take(r, &hlen, 4) || r->n - r->at < hlen) return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: bad header", path);
  *head = lm_malloc((size_t)hlen + 1);
  if (!*head) return LM_ERR_NOMEM;
  take(r, *head, hlen);
  (*head)[hlen] = 0;
  return LM_OK;
}

static const char *field(const char *head, const char *key, char *buf, size_t cap) {
  size_t k = strlen(key);
  for (const char *line = head; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    if (!strncmp(line, key, k) && !strncmp(line + k, " = ", 3)) {
      const char *v = line + k + 3, *e = strchr(v, '\n');
      size_t n = e ? (size_t)(e - v) : strlen(v);
      if (n >= cap) n = cap - 1;
      memcpy(buf, v, n);
      buf[n] = 0;
      return buf;
    }
  }
  return NULL;
}

static int parse_config(const char *head, lm_ppo_config *c) {
  char v[256];
  *c = lm_ppo_defaults(NULL);
#define GETI(key, dst)                                                                                                 \
  if (!field(head, key, v, sizeof v)) return 0;                                                                        \
  dst = strtoll(v, NULL, 10)
#define GETF(key, dst)                                                                                                 \
  if (!field(head, key, v, sizeof v)) return 0;                                                                        \
  dst = strtof(v, NULL)
  GETI("envs", c->n_envs);
  GETI("steps", c->horizon);
  GETI("total_steps", c->total_steps);
  if (!field(head, "seed", v, sizeof v)) return 0;
  c->seed = strtoull(v, NULL, 10);
  GETF("lr", c->lr);
  GETI("anneal_lr", c->anneal_lr);
  GETF("gamma", c->gamma);
  GETF("gae_lambda", c->gae_lambda);
  GETI("epochs", c->epochs);
  GETI("minibatches", c->minibatches);
  GETF("clip_coef", c->clip_coef);
  GETI("clip_vloss", c->clip_vloss);
  GETF("ent_coef", c->ent_coef);
  GETF("vf_coef", c->vf_coef);
  GETF("max_grad_norm", c->max_grad_norm);
  GETI("norm_adv", c->norm_adv);
  GETI("shared", c->policy.shared);
#undef GETI
#undef GETF
  if (!field(head, "hidden", v, sizeof v)) return 0;
  c->policy.layers = 0;
  for (char *s = v; *s && c->policy.layers < LM_POLICY_MAX_LAYERS;) {
    c->policy.hidden[c->policy.layers++] = (int)strtol(s, &s, 10);
    if (*s == ',') s++;
    else break;
  }
  if (!field(head, "activation", v, sizeof v)) return 0;
  c->policy.activation = !strcmp(v, "relu") ? LM_ACT_RELU : LM_ACT_TANH;
  if (!field(head, "stepper", v, sizeof v)) return 0;
  c->stepper = !strcmp(v, "host") ? LM_STEPPER_HOST : LM_STEPPER_DEVICE;
  return 1;
}

lm_status lm_checkpoint_peek(const char *path, char *env_name, size_t cap, lm_ppo_config *cfg) {
  unsigned char *data = NULL;
  char *head = NULL;
  reader r;
  lm_status st = open_checked(path, &data, &r, &head);
  if (st == LM_OK && (!field(head, "env", env_name, cap) || !parse_config(head, cfg)))
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks the env or the config", path);
  lm_free(head);
  lm_free(data);
  return st;
}

lm_status lm_trainer_load(lm_trainer *t, const char *path) {
  unsigned char *data = NULL;
  char *head = NULL, v[256];
  reader r;
  lm_status st = open_checked(path, &data, &r, &head);
  lm_ppo_config c;
  if (st != LM_OK) goto done;
  if (!field(head, "env", v, sizeof v) || !parse_config(head, &c)) {
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks the env or the config", path);
    goto done;
  }
  const lm_ppo_config *mine = lm_trainer_config(t);
  if (strcmp(v, lm_trainer_env(t)->name)) {
    st = lm_fail(LM_ERR_INVALID, "checkpoint %s is for env %s, not %s", path, v, lm_trainer_env(t)->name);
    goto done;
  }
  if (c.n_envs != mine->n_envs || c.horizon != mine->horizon || c.policy.layers != mine->policy.layers ||
      memcmp(c.policy.hidden, mine->policy.hidden, sizeof c.policy.hidden) || c.policy.shared != mine->policy.shared ||
      c.stepper != mine->stepper) {
    st = lm_fail(LM_ERR_INVALID, "checkpoint %s has another shape (envs, steps, policy or stepper) than this trainer", path);
    goto done;
  }
  array a[MAX_ARRAYS];
  int n = list_arrays(t, a);
  uint32_t count = 0;
  if (n < 0 || !take(&r, &count, 4) || (int)count != n) {
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: holds %u arrays, the trainer has %d", path, count, n);
    goto done;
  }
  for (int i = 0; i < n && st == LM_OK; i++) {
    uint16_t len;
    char name[64];
    uint64_t cnt;
    if (!take(&r, &len, 2) || len >= sizeof name || !take(&r, name, len)) {
      st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: bad array name", path);
      break;
    }
    name[len] = 0;
    if (strcmp(name, a[i].name) || !take(&r, &cnt, 8) || cnt != a[i].count || r.n - r.at < cnt * sizeof(float)) {
      st = lm_fail(LM_ERR_INVALID, "checkpoint %s: array %s does not match the trainer's %s (%zu elements)", path, name,
                   a[i].name, a[i].count);
      break;
    }
    const float *src = (const float *)(const void *)(r.p + r.at); /* may be unaligned: copy */
    float *buf = lm_malloc((cnt ? cnt : 1) * sizeof *buf);
    if (!buf) {
      st = LM_ERR_NOMEM;
      break;
    }
    memcpy(buf, src, cnt * sizeof *buf);
    r.at += cnt * sizeof *buf;
    st = a[i].rollout ? lm_rollout_state_write(lm_trainer_rollout(t), name, buf, cnt)
                      : lm_program_write(lm_trainer_update_program(t), name, buf, cnt);
    lm_free(buf);
  }
  if (st != LM_OK) goto done;
  int64_t *iter, *steps;
  uint64_t *shuffle;
  lm_trainer_counters(t, &iter, &steps, &shuffle);
  if (!field(head, "iteration", v, sizeof v)) goto bad;
  *iter = strtoll(v, NULL, 10);
  if (!field(head, "env_steps", v, sizeof v)) goto bad;
  *steps = strtoll(v, NULL, 10);
  if (!field(head, "shuffle", v, sizeof v)) goto bad;
  *shuffle = strtoull(v, NULL, 10);
  if (!field(head, "rollout_run", v, sizeof v)) goto bad;
  lm_rollout_set_seed(lm_trainer_rollout(t), mine->seed);
  lm_rollout_set_run_index(lm_trainer_rollout(t), strtoull(v, NULL, 10));
  goto done;
bad:
  st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks the counters", path);
done:
  lm_free(head);
  lm_free(data);
  return st;
}
