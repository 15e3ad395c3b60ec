/* The long statistics runs of the env suite (label slow): 4096 envs x 1000 steps of random actions
 * with auto-reset, graph on ref and cpu against the reference stepper, for every env. The machinery
 * and its tolerances live in test_envs.c, included here with its always-on tests compiled out. */
#define LUMEN_ENVS_SLOW 1
#include "test_envs.c"
