/* tests/test_plugin.c — envs from outside the tree, through the rltrain binary as a user runs
 * it: examples/project/catch.c (graphs only, no reference stepper) is listed, recorded, checked,
 * trained and evaluated from another directory by its file name; a prebuilt .so loads too; a
 * checkpoint whose plugin changed or went away says so; a file without LM_ENV_PLUGIN, one that
 * does not compile (the message names the file and line), a spec with a reward of shape [N, 1]
 * and a graph whose terminated is not 0/1 are each refused with a message naming the problem.
 * tests/plugins/catch_pixels.c (Catch observed as its 50-pixel board, graphs only) goes through
 * every command; test_plugin_slow.c (this file with LUMEN_PLUGIN_SLOW) trains it with lumen's
 * defaults until it is solved. */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/timeout.h"

#define RLTRAIN LUMEN_BINARY_DIR "/rltrain"
#define CATCH LUMEN_SOURCE_DIR "/examples/project/catch.c"
#define PIXELS LUMEN_SOURCE_DIR "/tests/plugins/catch_pixels.c" /* obs: 50 floats, graphs only */

static char dir[] = "/tmp/lumen-plugin-XXXXXX";
static char out[16384];

static void setup(void) { cr_assert(mkdtemp(dir)); }
static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* Runs a shell command line in dir (stderr into stdout); its exit status. */
static int sh(const char *fmt, ...) {
  char line[4096], cmd[4400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "cd '%s' && ( %s ) 2>&1", dir, line);
  FILE *f = popen(cmd, "r");
  cr_assert(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  while (fgetc(f) != EOF) {
  }
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#ifndef LUMEN_PLUGIN_SLOW
/* a copy of catch.c with `from` replaced by `to` (NULL: as it is) at dir/name */
static void variant(const char *name, const char *from, const char *to) {
  FILE *f = fopen(CATCH, "r");
  cr_assert(f);
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *o = fopen(path, "w");
  cr_assert(o);
  char *at = from ? strstr(text, from) : NULL;
  if (from) cr_assert(at, "catch.c lacks '%s'", from);
  if (at) {
    fwrite(text, 1, (size_t)(at - text), o);
    fputs(to, o);
    fputs(at + strlen(from), o);
  } else fputs(text, o);
  fclose(o);
}
#endif

TestSuite(plugin, .init = setup, .fini = teardown, .timeout = LM_TIMEOUT(300));

#ifdef LUMEN_PLUGIN_SLOW
/* A new user's env: graphs only, an observation of 50 floats, no training settings of its own. */
Test(plugin, an_env_file_with_a_wide_observation_trains_until_solved_with_the_defaults, .timeout = LM_TIMEOUT(600)) {
  cr_assert_eq(sh("'%s' '%s' --device cpu --quiet --out run", RLTRAIN, PIXELS), 0, "%s", out);
  cr_assert_eq(sh("cat run/summary.json"), 0, "%s", out);
  cr_log_info("%s", out);
  cr_assert(strstr(out, "\"env\": \"catch-pixels\"") && strstr(out, "\"solved\": true"), "%s", out);
  cr_assert_eq(sh("'%s' eval run --episodes 20", RLTRAIN), 0, "%s", out);
  cr_assert(strstr(out, "greedy mean return"), "%s", out);
}
#else
Test(plugin, an_env_file_with_a_50_float_observation_goes_through_every_command) {
  cr_assert_eq(sh("'%s' list '%s'", RLTRAIN, PIXELS), 0, "%s", out);
  cr_assert(strstr(out, "catch-pixels") && strstr(out, " 50 "), "%s", out);
  cr_assert_eq(sh("'%s' record '%s' pixels.csv --episodes 4 --seed 9", RLTRAIN, PIXELS), 0, "%s", out);
  cr_assert_eq(sh("head -1 pixels.csv | tr ',' '\\n' | grep -c '^obs'"), 0, "%s", out);
  cr_assert_eq(atoi(out), 50, "the transitions file has %s obs columns", out);
  cr_assert_eq(sh("'%s' check '%s' pixels.csv --device cpu", RLTRAIN, PIXELS), 0, "%s", out);
  cr_assert(strstr(out, "obs49") && strstr(out, "PASS"), "%s", out);
  cr_assert_eq(sh("'%s' '%s' --device cpu --quiet --total-steps 4096 --out run", RLTRAIN, PIXELS), 0, "%s", out);
  cr_assert_eq(sh("'%s' eval run --episodes 3", RLTRAIN), 0, "%s", out);
  cr_assert(strstr(out, "catch-pixels: 3 episodes"), "%s", out);
  cr_assert_eq(sh("'%s' view run --headless --out frames/", RLTRAIN), 0, "%s", out);
  cr_assert_eq(sh("ls frames | grep -c png"), 0, "%s", out);
  cr_assert_gt(atoi(out), 0, "no frames written");
}

Test(plugin, a_graph_only_env_file_is_listed_recorded_checked_trained_and_evaluated_elsewhere) {
  cr_assert_eq(sh("'%s' list '%s'", RLTRAIN, CATCH), 0, "%s", out);
  cr_assert(strstr(out, "catch") && strstr(out, "bsuite/catch") && strstr(out, "cartpole"), "%s", out);
  cr_assert_eq(sh("'%s' record '%s' catch.csv --episodes 6 --seed 3", RLTRAIN, CATCH), 0, "%s", out);
  cr_assert_eq(sh("'%s' check '%s' catch.csv --device cpu", RLTRAIN, CATCH), 0, "%s", out);
  cr_assert(strstr(out, "no reference stepper") && strstr(out, "PASS"), "%s", out);
  cr_assert_eq(sh("'%s' '%s' --device cpu --quiet --total-steps 8192 --out run", RLTRAIN, CATCH), 0, "%s", out);
  cr_assert_eq(sh("mkdir -p elsewhere && cd elsewhere && '%s' eval ../run --episodes 5", RLTRAIN), 0, "%s", out);
  cr_assert(strstr(out, "catch: 5 episodes"), "%s", out);
  cr_assert_eq(sh("'%s' '%s' --device cpu --quiet --resume run --total-steps 12288", RLTRAIN, CATCH), 0, "%s", out);
  cr_assert_eq(sh("'%s' compile '%s' --target c", RLTRAIN, CATCH), 0, "%s", out);
}

Test(plugin, a_checkpoint_says_when_its_plugin_changed_or_is_gone) {
  variant("mine.c", NULL, NULL);
  cr_assert_eq(sh("'%s' mine.c --device cpu --quiet --total-steps 4096 --out run", RLTRAIN), 0, "%s", out);
  cr_assert_eq(sh("'%s' eval run --episodes 2", RLTRAIN), 0, "%s", out);
  cr_assert_eq(sh("echo '/* edited */' >> mine.c && '%s' eval run --episodes 2", RLTRAIN), 2, "%s", out);
  cr_assert(strstr(out, "mine.c") && strstr(out, "changed"), "%s", out);
  cr_assert_eq(sh("rm mine.c && '%s' eval run --episodes 2", RLTRAIN), 2, "%s", out);
  cr_assert(strstr(out, "mine.c") && strstr(out, "not there"), "%s", out);
}

Test(plugin, a_prebuilt_shared_object_loads) {
  cr_assert_eq(sh("cc -std=c11 -O1 -shared -fPIC -I'%s/include' '%s' -o libcatch.so", LUMEN_SOURCE_DIR, CATCH), 0,
               "%s", out);
  cr_assert_eq(sh("'%s' list ./libcatch.so", RLTRAIN), 0, "%s", out);
  cr_assert(strstr(out, "catch"), "%s", out);
}

Test(plugin, broken_env_files_are_refused_naming_the_problem) {
  variant("noplugin.c", "LM_ENV_PLUGIN(catch_env)", "const lm_env_spec *unused = &catch_env;");
  cr_assert_eq(sh("'%s' list noplugin.c", RLTRAIN), 2, "%s", out);
  cr_assert(strstr(out, "LM_ENV_PLUGIN"), "%s", out);
  variant("typo.c", "lm_env_col(s, 0), by", "lm_env_coll(s, 0), by");
  cr_assert_eq(sh("'%s' list typo.c", RLTRAIN), 2, "%s", out);
  cr_assert(strstr(out, "typo.c:") && strstr(out, "lm_env_coll"), "the compiler's message does not name the file:\n%s",
            out);
  cr_assert_eq(sh("sed -e 's/  out->reward = lm_mul(done, lm_sub(lm_mul(hit, lm_const(g, 2.0f)), lm_const(g, 1.0f)));/"
                  "  out->reward = lm_unsqueeze(lm_mul(done, lm_sub(lm_mul(hit, lm_const(g, 2.0f)), lm_const(g, "
                  "1.0f))), 1);/' '%s' > rewardcol.c && '%s' list rewardcol.c",
                  CATCH, RLTRAIN),
               2, "%s", out);
  cr_assert(strstr(out, "catch") && strstr(out, "reward") && strstr(out, "[3, 1]") && strstr(out, "expected [3]"), "%s",
            out);
  cr_assert_eq(sh("sed -e 's/  out->terminated = done;/  out->terminated = lm_mul(done, lm_const(g, 2.0f));/' '%s' > "
                  "twos.c && '%s' record twos.c twos.csv --episodes 2 && '%s' check twos.c twos.csv --device cpu",
                  CATCH, RLTRAIN, RLTRAIN),
               1, "%s", out);
  cr_assert(strstr(out, "terminated must be 0 or 1") && strstr(out, "FAIL"), "%s", out);
  variant("oldabi.c", "LM_ENV_PLUGIN(catch_env)", /* as a plugin built against another env.h */
          "__attribute__((visibility(\"default\"))) const lm_env_spec *lm_env_plugin_v1(void) { return &catch_env; }\n"
          "__attribute__((visibility(\"default\"))) int lm_env_plugin_abi(void) { return 0x10100; }\n");
  cr_assert_eq(sh("cc -std=c11 -shared -fPIC -I'%s/include' oldabi.c -o liboldabi.so && '%s' list ./liboldabi.so",
                  LUMEN_SOURCE_DIR, RLTRAIN),
               2, "%s", out);
  cr_assert(strstr(out, "liboldabi.so") && strstr(out, "another lumen's env.h") && strstr(out, "0x10100"), "%s", out);
  cr_assert_eq(sh("'%s' list nosuchfile.c", RLTRAIN), 2, "%s", out);
  cr_assert(strstr(out, "nosuchfile.c"), "%s", out);
}
#endif /* LUMEN_PLUGIN_SLOW */
