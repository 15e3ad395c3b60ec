/* examples/project/catch_cli.c — rltrain with your own env built in: catch.c (compiled into this
 * program) is registered, and the rest of the command line goes to lm_rltrain, so every rltrain
 * command knows the env by name:
 *   catch_cli catch --total-steps 100000 --out run     train it
 *   catch_cli eval run                                  evaluate the checkpoint
 *   catch_cli list                                      catch among lumen's own envs */
#include <stdio.h>

#include <lumen/lumen.h>

const lm_env_spec *lm_env_plugin_v1(void); /* catch.c's LM_ENV_PLUGIN(...) */

int main(int argc, char **argv) {
  if (lm_env_register(lm_env_plugin_v1()) != LM_OK) {
    fprintf(stderr, "catch_cli: %s\n", lm_last_error());
    return 2;
  }
  return lm_rltrain(argc, argv);
}
