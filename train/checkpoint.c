/* train/checkpoint.c — checkpoint files: a versioned header with the env, the config and
 * the counters as text, then named float arrays (weights, optimiser state, env state and
 * episode counters), then an FNV-1a checksum of everything before it: a check against
 * corruption and truncation, not a signature (anyone can recompute it), so every field read is
 * range-checked as if the file were crafted. Written to a temp file and renamed, so a crash
 * never leaves a half-written checkpoint. A data-parallel run's checkpoint is the whole run's: the
 * env count of all ranks, every env's state in rank order (gathered from the ranks, written by rank
 * 0), so it resumes at any number of ranks that divides the env count. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/core.h"
#include "lumen/train.h"

enum { CKPT_VERSION = 2, MAX_ARRAYS = 128 }; /* 2: the last episodes (recent) */
#define CKPT_MAX_BYTES ((uint64_t)1 << 34) /* 16 GiB: four 4096-wide layers with Adam fit many times over */
static const char magic[8] = {'L', 'U', 'M', 'E', 'N', 'C', 'K', 'P'};

/* Internal access the trainer grants the checkpoint code. */
lm_program_t *lm_trainer_update_program(lm_trainer *t);
lm_program_t *lm_trainer_adam_program(lm_trainer *t);
void lm_trainer_counters(lm_trainer *t, int64_t **iter, int64_t **steps, uint64_t **shuffle);
const lm_env_spec *lm_trainer_env(const lm_trainer *t);
lm_recent *lm_trainer_recent_mut(lm_trainer *t);

typedef struct array {
  char name[64];
  size_t count;          /* this rank's */
  lm_program_t *prog;    /* the program holding it, NULL: the rollout */
  int per_env;           /* a row per env: the file holds every rank's rows, count * ranks */
} array;

/* The weights and optimiser state, in the order the one-graph update declares them (the split
 * update declares the same names in the same order across its two programs), then the rollout's. */
static int list_arrays(lm_trainer *t, array *a) {
  int n = 0;
  lm_program_t *progs[2] = {lm_trainer_update_program(t), lm_trainer_adam_program(t)};
  for (int q = 0; q < 2 && progs[q]; q++) {
    lm_program_t *u = progs[q];
    for (int i = 0; i < lm_program_input_count(u) && n < MAX_ARRAYS; i++) {
      lm_role r = lm_program_input_role(u, i);
      if (r != LM_ROLE_PARAM && r != LM_ROLE_STATE) continue;
      if (q == 1 && r == LM_ROLE_PARAM) continue; /* the gradient graph's, linked */
      snprintf(a[n].name, sizeof a[n].name, "%s", lm_program_input_name(u, i));
      if (lm_program_numel(u, a[n].name, &a[n].count) != LM_OK) return -1;
      a[n].prog = u;
      a[n++].per_env = 0;
    }
  }
  const char *names[16];
  size_t counts[16];
  int k = lm_rollout_state_list(lm_trainer_rollout(t), names, counts, 16);
  for (int i = 0; i < k && n < MAX_ARRAYS; i++, n++) {
    snprintf(a[n].name, sizeof a[n].name, "%s", names[i]);
    a[n].count = counts[i];
    a[n].prog = NULL;
    a[n].per_env = lm_rollout_state_per_env(names[i]);
  }
  return n;
}

static int ranks_of(lm_trainer *t) { return lm_dist_size(lm_trainer_dist(t)); }

static void put(lm_sb *b, const void *data, size_t n) {
  /* the string builder holds binary too: append byte by byte through a growing buffer */
  if (b->failed || !LM_GROW(b->s, b->cap, b->len + n + 1)) {
    b->failed = 1;
    return;
  }
  memcpy(b->s + b->len, data, n);
  b->len += n;
}

/* The checkpoint's bytes (every rank takes part: a data-parallel run's gathers every rank's
 * envs); on rank 0 *out holds them, on the others it is freed. */
static lm_status serialize(lm_trainer *t, lm_sb *out_sb) {
  array a[MAX_ARRAYS];
  int n = list_arrays(t, a);
  if (n < 0) return LM_ERR_INVALID;
  int64_t *iter, *steps;
  uint64_t *shuffle;
  lm_trainer_counters(t, &iter, &steps, &shuffle);
  char cfgtext[2048];
  lm_dist_t *dist = lm_trainer_dist(t);
  int K = ranks_of(t), rank = lm_dist_rank(dist);
  lm_ppo_config whole = *lm_trainer_config(t);
  whole.n_envs *= K; /* the run's envs, all ranks' */
  lm_ppo_config_print(&whole, cfgtext, sizeof cfgtext);
  lm_sb head = {0};
  lm_sb_printf(&head, "env = %s\n%siteration = %lld\nenv_steps = %lld\nshuffle = %llu\nrollout_run = %llu\n",
               lm_trainer_env(t)->name, cfgtext, (long long)*iter, (long long)*steps, (unsigned long long)*shuffle,
               (unsigned long long)lm_rollout_run_index(lm_trainer_rollout(t)));
  char origin[4096], ohash[32];
  if (lm_env_origin(lm_trainer_env(t), origin, sizeof origin, ohash, sizeof ohash)) /* a plugin: where it is */
    lm_sb_printf(&head, "env_source = %s\nenv_hash = %s\n", origin, ohash);
  const char *params = lm_trainer_env(t)->params;
  if (params && *params) lm_sb_printf(&head, "env_params = %s\n", params); /* lm_env_configure */
  const lm_recent *rc = lm_trainer_recent(t); /* "recent = n c:s ..." with every double exact */
  lm_sb_printf(&head, "recent = %zu", rc->n);
  for (size_t i = 0; i < rc->n; i++) lm_sb_printf(&head, " %.17g:%.17g", rc->count[i], rc->sum[i]);
  lm_sb_printf(&head, "\n");
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
    int whole_rows = a[i].per_env && K > 1;
    uint64_t c = whole_rows ? a[i].count * (uint64_t)K : a[i].count;
    float *buf = lm_malloc((a[i].count ? a[i].count : 1) * sizeof *buf), *all = NULL;
    if (!buf) {
      st = LM_ERR_NOMEM;
      break;
    }
    st = !a[i].prog ? lm_rollout_state_read(lm_trainer_rollout(t), a[i].name, buf, a[i].count)
                    : lm_program_read(a[i].prog, a[i].name, buf, a[i].count);
    if (whole_rows && st == LM_OK) { /* every rank's rows, in rank order (every rank takes part) */
      if (!(all = lm_malloc((size_t)c * sizeof *all))) st = LM_ERR_NOMEM;
      else st = lm_dist_allgather(dist, buf, a[i].count * sizeof *buf, all, "checkpoint");
    }
    put(&out, &len, 2);
    put(&out, a[i].name, len);
    put(&out, &c, 8);
    put(&out, all ? all : buf, (size_t)c * sizeof *buf);
    lm_free(all);
    lm_free(buf);
  }
  uint64_t sum = lm_hash_bytes(out.s, out.len, 0);
  put(&out, &sum, 8);
  if (st == LM_OK && out.failed) st = LM_ERR_NOMEM;
  if (st != LM_OK || rank != 0) lm_sb_free(&out); /* one file for the run: rank 0's */
  *out_sb = out;
  return st;
}

/* bytes to path through a temp file, flushed to disk and renamed: a crash leaves the old file or
 * the new one, never half of it */
static lm_status write_file(const char *path, const void *bytes, size_t n) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return lm_fail(LM_ERR_IO, "checkpoint: cannot write %s: %s", tmp, strerror(errno));
  int bad = fwrite(bytes, 1, n, f) != n;
  bad |= fflush(f) != 0;
  bad |= fsync(fileno(f)) != 0;
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    lm_status st = lm_fail(LM_ERR_IO, "checkpoint: writing %s failed: %s", path, strerror(errno));
    remove(tmp);
    return st;
  }
  return LM_OK;
}

lm_status lm_trainer_save(lm_trainer *t, const char *path) {
  lm_sb out = {0};
  lm_status st = serialize(t, &out);
  if (st == LM_OK && out.s) st = write_file(path, out.s, out.len);
  lm_sb_free(&out);
  return st;
}

/* ---------------------------------------------------------------- checkpoints off the training thread
 *
 * A checkpoint of CartPole's default run is about 110 KB; writing it twice (step-N, latest),
 * each through a temp file and fsync, took 1.8 ms on the training thread, 7% of a default
 * `rltrain cartpole` (a checkpoint every 10 iterations of 2.5 ms). The state is still read on
 * the training thread (consistent, and collective under MPI); only the file writes move to a
 * thread, one save at a time: a save first waits for the one before it. */
struct lm_checkpointer {
  pthread_t thread;
  int running;       /* a write thread to join */
  lm_sb bytes;       /* the save being written */
  char **paths;      /* and where, in order */
  int npaths;
  lm_status st;      /* how the last writes went, and why not */
  char why[1024];
};

static void free_paths(lm_checkpointer *w) {
  for (int i = 0; i < w->npaths; i++) lm_free(w->paths[i]);
  lm_free(w->paths);
  w->paths = NULL;
  w->npaths = 0;
}

static void *write_main(void *arg) {
  lm_checkpointer *w = arg;
  lm_status st = LM_OK;
  int i = 0;
  for (; i < w->npaths && st == LM_OK; i++) st = write_file(w->paths[i], w->bytes.s, w->bytes.len);
  if (st != LM_OK) { /* the paths before the one that failed go too: none is newer than the last */
    snprintf(w->why, sizeof w->why, "%s", lm_last_error());
    for (int j = 0; j + 1 < i; j++) remove(w->paths[j]);
  }
  w->st = st;
  return NULL;
}

lm_checkpointer *lm_checkpointer_new(void) { return lm_calloc(1, sizeof(lm_checkpointer)); }

lm_status lm_checkpointer_finish(lm_checkpointer *w) {
  if (!w) return lm_fail(LM_ERR_INVALID, "lm_checkpointer_finish: NULL");
  if (w->running) {
    pthread_join(w->thread, NULL);
    w->running = 0;
  }
  lm_sb_free(&w->bytes);
  free_paths(w);
  lm_status st = w->st;
  w->st = LM_OK;
  return st == LM_OK ? LM_OK : lm_fail(st, "%s", w->why);
}

lm_status lm_checkpointer_save(lm_checkpointer *w, lm_trainer *t, const char *const *paths, int npaths) {
  if (!w || !t || !paths || npaths < 1) return lm_fail(LM_ERR_INVALID, "lm_checkpointer_save: no checkpointer, trainer or paths");
  for (int i = 0; i < npaths; i++)
    if (!paths[i] || !*paths[i]) return lm_fail(LM_ERR_INVALID, "lm_checkpointer_save: path %d is empty", i);
  lm_status st = lm_checkpointer_finish(w); /* the save before: written, or why not */
  if (st != LM_OK) return st;
  if ((st = serialize(t, &w->bytes)) != LM_OK || !w->bytes.s) return st; /* ranks but 0: nothing to write */
  if (!(w->paths = lm_calloc((size_t)npaths, sizeof *w->paths))) st = LM_ERR_NOMEM;
  for (int i = 0; st == LM_OK && i < npaths; i++, w->npaths++)
    if (!(w->paths[i] = lm_strdup(paths[i]))) st = LM_ERR_NOMEM;
  if (st == LM_OK && pthread_create(&w->thread, NULL, write_main, w) != 0) {
    write_main(w); /* no thread to be had: written here */
    st = lm_checkpointer_finish(w);
  } else if (st == LM_OK)
    w->running = 1;
  else {
    lm_sb_free(&w->bytes);
    free_paths(w);
  }
  return st == LM_ERR_NOMEM ? lm_fail(st, "checkpoint: out of memory") : st;
}

void lm_checkpointer_free(lm_checkpointer *w) {
  if (!w) return;
  lm_checkpointer_finish(w);
  lm_free(w);
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

/* Reads a whole checkpoint, trusting nothing about the path: it must be a regular file (not a
 * FIFO, a device such as /dev/zero, or a directory), start with the magic (checked before the
 * rest is read) and be at most CKPT_MAX_BYTES; the read stops at the size fstat gave. */
static lm_status slurp(const char *path, unsigned char **data, size_t *len) {
  if (!path || !*path) return lm_fail(LM_ERR_INVALID, "checkpoint: an empty path");
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return lm_fail(LM_ERR_IO, "checkpoint: cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  lm_status st = LM_OK;
  unsigned char *buf = NULL;
  if (fstat(fd, &sb) != 0) st = lm_fail(LM_ERR_IO, "checkpoint: cannot stat %s: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: not a lumen checkpoint (not a regular file)", path);
  else if (sb.st_size < (off_t)(8 + 4 + 4 + 4 + 8))
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: not a lumen checkpoint (%lld bytes)", path, (long long)sb.st_size);
  else if ((uint64_t)sb.st_size > CKPT_MAX_BYTES)
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: %lld bytes, over the limit of %llu", path, (long long)sb.st_size,
                 (unsigned long long)CKPT_MAX_BYTES);
  if (st != LM_OK) goto done;
  size_t n = (size_t)sb.st_size, got = 0;
  char m[8];
  ssize_t r = pread(fd, m, sizeof m, 0);
  if (r != (ssize_t)sizeof m || memcmp(m, magic, sizeof m)) {
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: not a lumen checkpoint", path);
    goto done;
  }
  if (!(buf = lm_malloc(n))) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  while (got < n) { /* at most n bytes, and an end of file or an error stops it */
    r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  if (got != n) st = lm_fail(LM_ERR_IO, "checkpoint %s: read %zu of %zu bytes", path, got, n);
done:
  close(fd);
  if (st != LM_OK) {
    lm_free(buf);
    return st;
  }
  *data = buf;
  *len = n;
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

/* The config in a header: every setting present, each read by lm_ppo_config_apply (the reader
 * of settings files, with the command line's checks), then lm_ppo_config_check over the whole. */
static lm_status parse_config(const char *path, const char *head, lm_ppo_config *c) {
  static const char *const keys[] = {"envs",        "steps",     "total_steps", "seed",     "lr",
                                     "anneal_lr",   "gamma",     "gae_lambda",  "epochs",   "minibatches",
                                     "clip_coef",   "clip_vloss", "ent_coef",   "vf_coef",  "max_grad_norm",
                                     "norm_adv",    "shared",    "hidden",      "activation", "stepper"};
  char v[256], line[320], origin[4200], why[1024];
  *c = lm_ppo_defaults(NULL);
  snprintf(origin, sizeof origin, "checkpoint %s", path);
  for (size_t k = 0; k < LM_COUNTOF(keys); k++) {
    if (!field(head, keys[k], v, sizeof v))
      return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks %s", path, keys[k]);
    snprintf(line, sizeof line, "%s = %s", keys[k], v);
    if (lm_ppo_config_apply(c, line, origin, NULL, NULL) != LM_OK) {
      snprintf(why, sizeof why, "%s", lm_last_error());
      return lm_fail(LM_ERR_CORRUPT, "%s", why);
    }
  }
  /* written since the convolutional policy (absent: none) and since contraction (absent: the
   * run trained with the reference's rounding) */
  static const char *const later[][2] = {{"conv", "0"}, {"exact", "1"}};
  for (size_t k = 0; k < LM_COUNTOF(later); k++) {
    snprintf(line, sizeof line, "%s = %s", later[k][0], field(head, later[k][0], v, sizeof v) ? v : later[k][1]);
    if (lm_ppo_config_apply(c, line, origin, NULL, NULL) != LM_OK) {
      snprintf(why, sizeof why, "%s", lm_last_error());
      return lm_fail(LM_ERR_CORRUPT, "%s", why);
    }
  }
  if (lm_ppo_config_check(c) != LM_OK) {
    snprintf(why, sizeof why, "%s", lm_last_error());
    return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: %s", path, why);
  }
  return LM_OK;
}

/* "recent = n c:s c:s ..." (lm_recent): n entries, each count finite and > 0, each sum finite. */
static lm_status parse_recent(const char *path, const char *head, lm_recent *r) {
  size_t k = strlen("recent = ");
  const char *line = NULL;
  for (const char *l = head; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (!strncmp(l, "recent = ", k)) {
      line = l + k;
      break;
    }
  if (!line) return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks recent (the last episodes)", path);
  char *end;
  errno = 0;
  unsigned long long n = strtoull(line, &end, 10);
  if (end == line || errno || n > LM_RECENT_MAX)
    return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: recent holds a bad count", path);
  r->n = 0;
  for (const char *p = end; r->n < n; r->n++) {
    double c = strtod(p, &end);
    if (end == p || *end != ':' || !isfinite(c) || !(c > 0)) break;
    p = end + 1;
    double sum = strtod(p, &end);
    if (end == p || !isfinite(sum) || (*end != ' ' && *end != '\n' && *end)) break;
    r->count[r->n] = c;
    r->sum[r->n] = sum;
    p = end;
  }
  if (r->n != n) return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: recent entry %zu is not count:sum", path, r->n);
  return LM_OK;
}

lm_status lm_checkpoint_peek(const char *path, char *env_name, size_t cap, lm_ppo_config *cfg) {
  unsigned char *data = NULL;
  char *head = NULL;
  reader r;
  lm_status st = open_checked(path, &data, &r, &head);
  if (st == LM_OK && !field(head, "env", env_name, cap))
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks the env", path);
  if (st == LM_OK) st = parse_config(path, head, cfg);
  lm_free(head);
  lm_free(data);
  return st;
}

/* The env a checkpoint names: by name, or loaded again from its plugin (which must hold the same
 * bytes). */
static lm_status checkpoint_base_env(const char *path, const char *name, const char *head, const lm_env_spec **env) {
  lm_status st;
  char src[4096], hash[64];
  if ((*env = lm_env_find(name))) return LM_OK;
  int from_plugin = field(head, "env_source", src, sizeof src) && field(head, "env_hash", hash, sizeof hash);
  if (!from_plugin)
    return lm_fail(LM_ERR_INVALID, "checkpoint %s is for env '%s', which this program lacks (a plugin? name its file "
                                   "instead of the env)", path, name);
  if (access(src, R_OK) != 0)
    return lm_fail(LM_ERR_INVALID, "checkpoint %s is for env '%s' from the plugin %s, which is not there any more: "
                                   "put it back, or load it first (rltrain %s ...)", path, name, src, src);
  const lm_env_spec *e;
  if ((st = lm_env_load(src, &e)) != LM_OK) return st;
  char now[64] = "";
  lm_env_origin(e, NULL, 0, now, sizeof now);
  if (strcmp(now, hash))
    return lm_fail(LM_ERR_INVALID, "checkpoint %s is for env '%s' from %s with hash %s, but the file now has hash %s "
                                   "(it changed since the run)", path, name, src, hash, now);
  if (strcmp(e->name, name))
    return lm_fail(LM_ERR_INVALID, "checkpoint %s is for env '%s', but its plugin %s now defines '%s'", path, name, src,
                   e->name);
  *env = e;
  return LM_OK;
}

/* ... then with the parameters the run had (lm_env_configure). */
lm_status lm_checkpoint_env(const char *path, const lm_env_spec **env, lm_ppo_config *cfg) {
  char name[128], params[600] = "";
  *env = NULL;
  lm_status st = lm_checkpoint_peek(path, name, sizeof name, cfg);
  if (st != LM_OK) return st;
  unsigned char *data = NULL;
  char *head = NULL;
  reader r;
  if ((st = open_checked(path, &data, &r, &head)) != LM_OK) return st;
  const lm_env_spec *base = NULL;
  st = checkpoint_base_env(path, name, head, &base);
  int have_params = field(head, "env_params", params, sizeof params) != NULL;
  lm_free(head);
  lm_free(data);
  if (st != LM_OK) return st;
  if (have_params && (st = lm_env_configure(base, params, env)) != LM_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", lm_last_error());
    return lm_fail(LM_ERR_CORRUPT, "checkpoint %s: its env parameters '%s' do not apply: %s", path, params, why);
  }
  if (!have_params) *env = base;
  return LM_OK;
}

lm_status lm_trainer_load(lm_trainer *t, const char *path) {
  unsigned char *data = NULL;
  char *head = NULL, v[256];
  reader r;
  lm_status st = open_checked(path, &data, &r, &head);
  lm_ppo_config c;
  if (st != LM_OK) goto done;
  if (!field(head, "env", v, sizeof v)) {
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the header lacks the env", path);
    goto done;
  }
  if ((st = parse_config(path, head, &c)) != LM_OK) goto done;
  const lm_ppo_config *mine = lm_trainer_config(t);
  int K = ranks_of(t), rank = lm_dist_rank(lm_trainer_dist(t));
  if (K > 1 && c.n_envs != mine->n_envs * K) { /* one process: the shape check below says it */
    st = lm_fail(LM_ERR_INVALID, "checkpoint %s holds %lld envs, this run %d x %lld: resume with a number of ranks "
                                 "that divides %lld", path, (long long)c.n_envs, K, (long long)mine->n_envs,
                 (long long)c.n_envs);
    goto done;
  }
  if (K > 1) c.n_envs = mine->n_envs; /* this rank's part */
  if (strcmp(v, lm_trainer_env(t)->name)) {
    st = lm_fail(LM_ERR_INVALID, "checkpoint %s is for env %s, not %s", path, v, lm_trainer_env(t)->name);
    goto done;
  }
  const char *params = lm_trainer_env(t)->params ? lm_trainer_env(t)->params : "";
  if (!field(head, "env_params", v, sizeof v)) v[0] = 0;
  if (strcmp(v, params)) {
    st = lm_fail(LM_ERR_INVALID, "checkpoint %s is for %s with env parameters '%s', this trainer's are '%s'", path,
                 lm_trainer_env(t)->name, v, params);
    goto done;
  }
  if (c.n_envs != mine->n_envs || c.horizon != mine->horizon || c.policy.layers != mine->policy.layers ||
      memcmp(c.policy.hidden, mine->policy.hidden, sizeof c.policy.hidden) || c.policy.shared != mine->policy.shared ||
      c.policy.conv != mine->policy.conv ||
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
    uint64_t want = a[i].per_env ? a[i].count * (uint64_t)K : a[i].count;
    if (strcmp(name, a[i].name) || !take(&r, &cnt, 8) || cnt != want || r.n - r.at < cnt * sizeof(float)) {
      st = lm_fail(LM_ERR_INVALID, "checkpoint %s: array %s does not match the trainer's %s (%llu elements)", path, name,
                   a[i].name, (unsigned long long)want);
      break;
    }
    /* this rank's rows of a per-env array; may be unaligned: copy */
    const float *src = (const float *)(const void *)(r.p + r.at + (a[i].per_env ? (size_t)rank * a[i].count * sizeof(float) : 0));
    r.at += cnt * sizeof(float);
    cnt = a[i].count;
    float *buf = lm_malloc((cnt ? cnt : 1) * sizeof *buf);
    if (!buf) {
      st = LM_ERR_NOMEM;
      break;
    }
    memcpy(buf, src, cnt * sizeof *buf);
    for (uint64_t e = 0; e < cnt; e++)
      if (!isfinite(buf[e])) {
        st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: array %s holds a non-finite value (%g at element %llu)", path,
                     name, (double)buf[e], (unsigned long long)e);
        break;
      }
    if (st != LM_OK) {
      lm_free(buf);
      break;
    }
    st = !a[i].prog ? lm_rollout_state_write(lm_trainer_rollout(t), name, buf, cnt)
                    : lm_program_write(a[i].prog, name, buf, cnt);
    lm_free(buf);
  }
  if (st != LM_OK) goto done;
  int64_t *iter, *steps;
  uint64_t *shuffle;
  lm_trainer_counters(t, &iter, &steps, &shuffle);
  long long it, es;
  uint64_t sh, run;
  if (!field(head, "iteration", v, sizeof v) || !lm_parse_i64(v, 0, (long long)1 << 50, &it)) goto bad;
  if (!field(head, "env_steps", v, sizeof v) || !lm_parse_i64(v, 0, (long long)1 << 62, &es)) goto bad;
  long long rows = (long long)(c.n_envs * K * c.horizon); /* the run's; at most 2^28 x ranks */
  if (it > ((long long)1 << 62) / rows || es != it * rows) { /* each iteration steps every env `steps` times */
    st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: env_steps = %lld does not match %lld iterations of %lld envs x %lld steps",
                 path, es, it, (long long)c.n_envs * K, (long long)c.horizon);
    goto done;
  }
  if (!field(head, "shuffle", v, sizeof v) || !lm_parse_u64(v, &sh)) goto bad;
  if (!field(head, "rollout_run", v, sizeof v) || !lm_parse_u64(v, &run)) goto bad;
  lm_recent rec = {.n = 0};
  if ((st = parse_recent(path, head, &rec)) != LM_OK) goto done;
  *iter = it;
  *steps = es;
  *shuffle = sh;
  *lm_trainer_recent_mut(t) = rec;
  lm_rollout_set_seed(lm_trainer_rollout(t), mine->seed);
  lm_rollout_set_run_index(lm_trainer_rollout(t), run);
  goto done;
bad:
  st = lm_fail(LM_ERR_CORRUPT, "checkpoint %s: the counters (iteration, env_steps, shuffle, rollout_run) are missing or "
                               "out of range", path);
done:
  lm_free(head);
  lm_free(data);
  return st;
}
