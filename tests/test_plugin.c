/* tests/test_plugin.c — envs from outside the tree, through the rltrain binary as a user runs
 * it: examples/project/catch.c (graphs only, no reference stepper) is listed, recorded, checked,
 * trained and evaluated from another directory by its file name; a prebuilt .so loads too; a
 * checkpoint whose plugin changed or went away says so; a file without LM_ENV_PLUGIN, one that
 * does not compile (the message names the file and line), a spec with a reward of shape [N, 1]
 * and a graph whose terminated is not 0/1 are each refused with a message naming the problem. */
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

TestSuite(plugin, .init = setup, .fini = teardown, .timeout = LM_TIMEOUT(300));

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
  cr_assert_eq(sh("'%s' list nosuchfile.c", RLTRAIN), 2, "%s", out);
  cr_assert(strstr(out, "nosuchfile.c"), "%s", out);
}
