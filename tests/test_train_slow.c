/* tests/test_train_slow.c — end to end: PPO with the default settings solves CartPole (mean
 * return of the last 100 episodes >= 475) on the cpu backend within its step budget, through
 * the rltrain binary, which also writes its log, summary and checkpoints. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "support/timeout.h"

#ifndef LUMEN_BINARY_DIR
#define LUMEN_BINARY_DIR LUMEN_SOURCE_DIR "/build"
#endif

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

Test(train_slow, rltrain_cartpole_with_defaults_solves_it_on_cpu, .timeout = LM_TIMEOUT(600)) {
  char dir[] = "/tmp/lumen-run-XXXXXX", cmd[4096], path[4200];
  cr_assert(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "'%s/rltrain' cartpole --device cpu --quiet --out '%s' > '%s/out.txt' 2>&1", LUMEN_BINARY_DIR,
           dir, dir);
  int st = system(cmd);
  snprintf(path, sizeof path, "%s/out.txt", dir);
  char *out = slurp(path);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rltrain failed:\n%s", out ? out : "");
  snprintf(path, sizeof path, "%s/summary.json", dir);
  char *summary = slurp(path);
  cr_assert(summary, "no summary.json");
  cr_log_info("%s", summary);
  cr_assert(strstr(summary, "\"solved\": true"), "CartPole was not solved: %s", summary);
  snprintf(path, sizeof path, "%s/latest.ckpt", dir);
  cr_assert_eq(access(path, R_OK), 0, "no latest.ckpt");
  snprintf(path, sizeof path, "%s/log.csv", dir);
  char *log = slurp(path);
  cr_assert(log && strstr(log, "iteration,env_steps,wall_s"), "log.csv lacks its header");
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
