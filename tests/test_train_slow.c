/* tests/test_train_slow.c — end to end: PPO with the default settings solves CartPole (mean
 * return of the last 100 episodes >= 475) on the cpu backend within its step budget, through
 * the rltrain binary, which also writes its log, summary and checkpoints; and PPO with MinAtar's
 * network learns Breakout at the PureJaxRL peer's settings within a short budget. */
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

/* Runs `rltrain ARGS --device cpu --quiet --out DIR` in a fresh DIR (dir: its template, filled
 * in) and returns its summary.json (the caller frees it). */
static char *run_rltrain(char *dir, const char *args) {
  char cmd[4096], path[4200];
  cr_assert(mkdtemp(dir));
  snprintf(cmd, sizeof cmd, "'%s/rltrain' %s --device cpu --quiet --out '%s' > '%s/out.txt' 2>&1", LUMEN_BINARY_DIR,
           args, dir, dir);
  int st = system(cmd);
  snprintf(path, sizeof path, "%s/out.txt", dir);
  char *out = slurp(path);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rltrain %s failed:\n%s", args, out ? out : "");
  snprintf(path, sizeof path, "%s/summary.json", dir);
  char *summary = slurp(path);
  cr_assert(summary, "rltrain %s wrote no summary.json", args);
  cr_log_info("%s", summary);
  return strdup(summary);
}

static void remove_dir(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

Test(train_slow, rltrain_cartpole_with_defaults_solves_it_on_cpu, .timeout = LM_TIMEOUT(600)) {
  char dir[] = "/tmp/lumen-run-XXXXXX", path[4200];
  char *summary = run_rltrain(dir, "cartpole");
  cr_assert(strstr(summary, "\"solved\": true"), "CartPole was not solved: %s", summary);
  snprintf(path, sizeof path, "%s/latest.ckpt", dir);
  cr_assert_eq(access(path, R_OK), 0, "no latest.ckpt");
  snprintf(path, sizeof path, "%s/log.csv", dir);
  char *log = slurp(path);
  cr_assert(log && strstr(log, "iteration,env_steps,wall_s"), "log.csv lacks its header");
  free(summary);
  remove_dir(dir);
}

/* The peer's settings (bench/minatar_ppo_vs_purejaxrl.py) over 327,680 env steps, the learning
 * rate annealed over them: seed 1 ends at a mean return of 13.7 (random play scores 0.4; 2M
 * steps reach about 60). The bound, 8, is 20 times random play. */
Test(train_slow, rltrain_minatar_breakout_learns_at_the_peers_settings_on_cpu, .timeout = LM_TIMEOUT(600)) {
  char dir[] = "/tmp/lumen-run-XXXXXX";
  char *summary = run_rltrain(dir, "minatar-breakout --env sticky=0,actions=minimal,time_limit=1000 --seed 1 "
                                   "--total-steps 327680 --no-stop");
  const char *at = strstr(summary, "\"mean_return\": ");
  double mean = -1;
  cr_assert(at && sscanf(at + strlen("\"mean_return\": "), "%lf", &mean) == 1, "no mean_return: %s", summary);
  cr_assert(strstr(summary, "\"env_steps\": 327680"), "not the whole budget: %s", summary);
  cr_assert_geq(mean, 8.0, "Breakout's mean return after 327,680 steps is %g (random play: 0.4): %s", mean, summary);
  free(summary);
  remove_dir(dir);
}
