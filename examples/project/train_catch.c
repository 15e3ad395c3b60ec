/* examples/project/train_catch.c — training your own env from your own program, through lumen's C
 * API and nothing else: catch.c (compiled into this program) is registered with lm_env_register,
 * then PPO runs on the cpu backend until the mean return of the last 100 episodes reaches the
 * env's threshold, and the final weights go to a checkpoint that `rltrain eval` can read.
 * Usage: train_catch [CHECKPOINT] (default catch.ckpt). */
#include <stdio.h>

#include <lumen/lumen.h>

const lm_env_spec *lm_env_plugin_v1(void); /* catch.c's LM_ENV_PLUGIN(...) */

int main(int argc, char **argv) {
  const char *ckpt = argc > 1 ? argv[1] : "catch.ckpt";
  const lm_env_spec *env = lm_env_plugin_v1();
  if (lm_env_register(env) != LM_OK) {
    fprintf(stderr, "train_catch: %s\n", lm_last_error());
    return 1;
  }
  lm_backend_t *b = lm_backend_new("cpu");
  lm_ppo_config cfg;
  lm_trainer *t = NULL;
  if (!b || lm_ppo_defaults_for(env, &cfg) != LM_OK || !(t = lm_trainer_new(b, env, &cfg))) {
    fprintf(stderr, "train_catch: %s\n", lm_last_error());
    lm_backend_free(b);
    return 1;
  }
  lm_iter_stats s = {0};
  int solved = 0;
  while (!solved && lm_trainer_iterations(t) < lm_trainer_total_iterations(t)) {
    if (lm_trainer_iterate(t, &s) != LM_OK) {
      fprintf(stderr, "train_catch: %s\n", lm_last_error());
      break;
    }
    solved = s.recent_episodes >= LM_RECENT_EPISODES && s.recent_return >= env->solved_return;
  }
  int rc = lm_trainer_save(t, ckpt) == LM_OK ? 0 : 1;
  printf("%s: %lld env steps, mean return of the last %.0f episodes %.2f (%s); %s %s\n", env->name,
         (long long)lm_trainer_env_steps(t), s.recent_episodes, s.recent_return, solved ? "solved" : "not solved",
         rc ? "could not write" : "wrote", ckpt);
  if (rc) fprintf(stderr, "train_catch: %s\n", lm_last_error());
  lm_trainer_free(t);
  lm_backend_free(b);
  return rc;
}
