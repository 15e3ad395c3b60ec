/* envs/registry.c — the envs of this process: those compiled into the build (a file each plus
 * one line in `registry` below), then those a program adds at run time with lm_env_register
 * (each checked by lm_env_validate first). Lookup by name or Gymnasium id, case-insensitive. */
#include <ctype.h>
#include <pthread.h>

#include "core.h"
#include "lumen/env.h"

extern const lm_env_spec lm_env_cartpole, lm_env_pendulum, lm_env_mountaincar, lm_env_mountaincar_continuous,
    lm_env_acrobot, lm_env_pointmass, lm_env_minatar_breakout, lm_env_minatar_space_invaders;

static const lm_env_spec *const registry[] = {
    &lm_env_cartpole,
    &lm_env_pendulum,
    &lm_env_mountaincar,
    &lm_env_mountaincar_continuous,
    &lm_env_acrobot,
    &lm_env_pointmass, /* examples/pointmass.c */
    &lm_env_minatar_breakout,
    &lm_env_minatar_space_invaders,
};

enum { MAX_ADDED = 64 };
static const lm_env_spec *added[MAX_ADDED];
static int nadded;
static pthread_mutex_t added_mu = PTHREAD_MUTEX_INITIALIZER;

int lm_env_count(void) {
  pthread_mutex_lock(&added_mu);
  int n = (int)LM_COUNTOF(registry) + nadded;
  pthread_mutex_unlock(&added_mu);
  return n;
}

const lm_env_spec *lm_env_at(int i) {
  int built = (int)LM_COUNTOF(registry);
  if (i >= 0 && i < built) return registry[i];
  pthread_mutex_lock(&added_mu);
  const lm_env_spec *e = i >= built && i < built + nadded ? added[i - built] : NULL;
  pthread_mutex_unlock(&added_mu);
  return e;
}

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
  for (int i = 0; i < lm_env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    if (e && (same_text(name, e->name) || (e->gym_id && same_text(name, e->gym_id)))) return e;
  }
  lm_sb known = {0};
  for (int i = 0; i < lm_env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    if (e) lm_sb_printf(&known, "%s%s", i ? ", " : "", e->name);
  }
  lm_fail(LM_ERR_INVALID, "unknown environment '%s' (this build has: %s)", name, known.s ? known.s : "");
  lm_sb_free(&known);
  return NULL;
}

lm_status lm_env_register(const lm_env_spec *e) {
  lm_status st = lm_env_validate(e);
  if (st != LM_OK) return st;
  pthread_mutex_lock(&added_mu);
  int built = (int)LM_COUNTOF(registry), there = 0;
  for (int i = 0; i < built + nadded && st == LM_OK; i++) {
    const lm_env_spec *o = i < built ? registry[i] : added[i - built];
    if (o == e) there = 1; /* the same spec again: already registered */
    else if (same_text(o->name, e->name) || (e->gym_id && o->gym_id && same_text(o->gym_id, e->gym_id)))
      st = lm_fail(LM_ERR_INVALID, "env %s: an env named %s is registered already", e->name, o->name);
  }
  if (st == LM_OK && !there) {
    if (nadded >= MAX_ADDED) st = lm_fail(LM_ERR_INVALID, "env %s: %d envs are registered already", e->name, MAX_ADDED);
    else added[nadded++] = e;
  }
  pthread_mutex_unlock(&added_mu);
  return st;
}
