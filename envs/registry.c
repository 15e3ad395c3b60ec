/* envs/registry.c — the envs compiled into this build: adding an env is its file plus one line
 * in `registry` below. Lookup by name or Gymnasium id, case-insensitive. */
#include <ctype.h>

#include "core.h"
#include "lumen/env.h"

extern const lm_env_spec lm_env_cartpole, lm_env_pendulum, lm_env_mountaincar, lm_env_mountaincar_continuous,
    lm_env_acrobot, lm_env_pointmass;

static const lm_env_spec *const registry[] = {
    &lm_env_cartpole,
    &lm_env_pendulum,
    &lm_env_mountaincar,
    &lm_env_mountaincar_continuous,
    &lm_env_acrobot,
    &lm_env_pointmass, /* examples/pointmass.c */
};

int lm_env_count(void) { return (int)LM_COUNTOF(registry); }

const lm_env_spec *lm_env_at(int i) { return i >= 0 && i < lm_env_count() ? registry[i] : NULL; }

static int same_text(const char *a, const char *b) {
  for (; *a && *b; a++, b++)
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
  return *a == *b;
}

const lm_env_spec *lm_env_find(const char *name) {
  if (!name || !*name) {
    lm_fail(LM_ERR_INVALID, "lm_env_find: no environment name given");
    return NULL;
  }
  for (int i = 0; i < lm_env_count(); i++)
    if (same_text(name, registry[i]->name) || (registry[i]->gym_id && same_text(name, registry[i]->gym_id)))
      return registry[i];
  lm_sb known = {0};
  for (int i = 0; i < lm_env_count(); i++) lm_sb_printf(&known, "%s%s", i ? ", " : "", registry[i]->name);
  lm_fail(LM_ERR_INVALID, "unknown environment '%s' (this build has: %s)", name, known.s ? known.s : "");
  lm_sb_free(&known);
  return NULL;
}
