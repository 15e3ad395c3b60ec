/* tests/test_resume_slow.c — exact resume under kill -9: a CartPole run killed at random
 * moments (checkpoints every iteration, so many kills land in the middle of writing one) and
 * resumed each time ends exactly where the uninterrupted run ends: the same latest.ckpt byte
 * for byte (weights, optimiser state, env state, counters, the last episodes), the same
 * log.csv apart from its two wall-clock columns, the "solved" stop at the same iteration, and
 * no temporary file left behind. Kills are placed by the run's progress (rows of its log), so
 * what the test does and checks does not depend on the machine's speed. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/timeout.h"

#ifndef LUMEN_BINARY_DIR
#define LUMEN_BINARY_DIR LUMEN_SOURCE_DIR "/build"
#endif

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  rewind(f);
  char *buf = malloc((size_t)len + 1);
  *n = fread(buf, 1, (size_t)len, f);
  buf[*n] = 0;
  fclose(f);
  return buf;
}

/* Starts rltrain cartpole into dir (resuming when `resume`); returns its pid. */
static pid_t start(const char *dir, int resume) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    char out[4200];
    snprintf(out, sizeof out, "%s/out.txt", dir);
    FILE *f = freopen(out, "a", stdout);
    if (!f || !freopen(out, "a", stderr)) _exit(99);
    execl(LUMEN_BINARY_DIR "/rltrain", "rltrain", "cartpole", "--device", "cpu", "--quiet", "--seed", "7",
          "--checkpoint-every", "1", resume ? "--resume" : "--out", dir, (char *)NULL);
    _exit(98);
  }
  return pid;
}

static int finish(pid_t pid) {
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* log.csv without wall_s (column 3) and sps (column 14): what a rerun must reproduce */
static char *log_without_clocks(const char *dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/log.csv", dir);
  size_t n = 0;
  char *text = slurp(path, &n);
  cr_assert(text, "no %s", path);
  char *out = malloc(n + 1), *o = out;
  for (char *line = text; *line;) {
    char *e = strchr(line, '\n');
    size_t len = e ? (size_t)(e - line) : strlen(line);
    int col = 1;
    for (size_t i = 0; i < len; i++) {
      if (line[i] == ',') col++;
      if (col != 3 && col != 14 && !(line[i] == ',' && (col == 3 || col == 14))) *o++ = line[i];
    }
    *o++ = '\n';
    line += len + (e ? 1 : 0);
  }
  *o = 0;
  free(text);
  return out;
}

/* Data rows of a log.csv so far (0 when it is not there yet). */
static long log_rows(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  long n = 0;
  int c, prev = '\n';
  while ((c = fgetc(f)) != EOF) {
    if (c == '\n') n++;
    prev = c;
  }
  (void)prev;
  fclose(f);
  return n > 0 ? n - 1 : 0;
}

static int temps_left(const char *dir) {
  int n = 0;
  const char *sub[] = {"", "/checkpoints"};
  for (int s = 0; s < 2; s++) {
    char d[4200];
    snprintf(d, sizeof d, "%s%s", dir, sub[s]);
    DIR *h = opendir(d);
    if (!h) continue;
    struct dirent *e;
    while ((e = readdir(h))) n += strstr(e->d_name, ".tmp") != NULL;
    closedir(h);
  }
  return n;
}

Test(resume_slow, a_run_killed_at_random_moments_resumes_to_the_same_end, .timeout = LM_TIMEOUT(600)) {
  char a[] = "/tmp/lumen-whole-XXXXXX", b[] = "/tmp/lumen-killed-XXXXXX";
  cr_assert(mkdtemp(a) && mkdtemp(b));
  int rc = finish(start(a, 0));
  cr_assert_eq(rc, 0, "the uninterrupted run failed (%d)", rc);
  /* the killed run: each round waits until the log holds a chosen iteration (1 to 3 past what
   * it held at the start), then kills at once or a few milliseconds later, while the run writes
   * that iteration's checkpoints or starts the next one. Kills are placed by progress, not by
   * time, so how many land does not depend on the machine's speed. */
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  int kills = 0, resumes = 0, done = 0;
  char logp[4300], latest[4300];
  snprintf(logp, sizeof logp, "%s/log.csv", b);
  snprintf(latest, sizeof latest, "%s/latest.ckpt", b);
  for (int round = 0; round < 200 && !done; round++) {
    int resume = access(latest, F_OK) == 0;
    resumes += resume;
    long have = log_rows(logp);
    pid_t pid = start(b, resume);
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    long target = have + 1 + (long)(rng % 3);
    long delay_us = (long)((rng >> 8) % 4) * 1500; /* 0, 1.5, 3 or 4.5 ms after the row */
    int st = 0, waiting = kills < 10;             /* after ten kills the run may finish */
    pid_t got = 0;
    while (!(got = waitpid(pid, &st, WNOHANG)) && !(waiting && log_rows(logp) >= target)) usleep(500);
    if (!got) {
      if (delay_us) usleep((useconds_t)delay_us);
      kill(pid, SIGKILL);
      got = waitpid(pid, &st, 0);
      if (WIFSIGNALED(st)) {
        kills++;
        continue;
      }
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "round %d: rltrain exited %d", round,
              WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    done = 1;
  }
  cr_assert(done, "the killed run never finished");
  cr_log_info("%d kills, %d resumes", kills, resumes);
  cr_assert_eq(kills, 10, "only %d kills landed before the run finished", kills);
  char pa[4300], pb[4300];
  snprintf(pa, sizeof pa, "%s/latest.ckpt", a);
  snprintf(pb, sizeof pb, "%s/latest.ckpt", b);
  size_t na = 0, nb = 0;
  char *ca = slurp(pa, &na), *cb = slurp(pb, &nb);
  cr_assert(ca && cb);
  cr_assert(na == nb && !memcmp(ca, cb, na), "the final checkpoints differ (%zu and %zu bytes)", na, nb);
  char *la = log_without_clocks(a), *lb = log_without_clocks(b);
  cr_assert_str_eq(lb, la, "log.csv differs from the uninterrupted run's");
  snprintf(pa, sizeof pa, "%s/summary.json", a);
  snprintf(pb, sizeof pb, "%s/summary.json", b);
  char *sa = slurp(pa, &na), *sb = slurp(pb, &nb);
  cr_assert(sa && sb);
  cr_assert_eq(strstr(sa, "\"solved\": true") != NULL, strstr(sb, "\"solved\": true") != NULL, "%s\n%s", sa, sb);
  cr_assert_eq(temps_left(b), 0, "temporary files left in %s", b);
  free(ca), free(cb), free(la), free(lb), free(sa), free(sb);
  char cmd[8700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", a, b);
  cr_assert_eq(system(cmd), 0);
}
