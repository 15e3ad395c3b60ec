/* envs/params.c — env parameters (lm_env_configure): a configured env is a copy of the spec with
 * its time limit, sticky-action probability or action set changed, for every env alike; the vec
 * env (envs/vec.c) and the reference-stepper paths (lm_env_ref_action) apply the action
 * wrappers, so an env's own graphs always see the env's own actions. Configured copies are
 * interned for the life of the process, like registered envs and plugins. */
#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "lumen/env.h"

enum { MAX_CONFIGURED = 256, MAX_SET = 1024, TEXT_CAP = 512 };

typedef struct configured {
  lm_env_spec spec;
  char params[TEXT_CAP];
  int map[];
} configured;

static configured *made[MAX_CONFIGURED];
static int nmade;
static pthread_mutex_t made_mu = PTHREAD_MUTEX_INITIALIZER;

const lm_env_spec *lm_env_base(const lm_env_spec *env) { return env && env->base ? env->base : env; }

/* The set `name` of env's action_sets ("minimal = 0 1 3; moves = 1 3") into map; its size, or
 * -1 after a message (a set that is not there lists the sets there are). name NULL: checks
 * every set, 0 when they are all well formed. */
static int find_set(const lm_env_spec *env, const char *name, int *map) {
  const char *p = env->action_sets ? env->action_sets : "";
  char names[256] = "full";
  size_t nlen = strlen(names);
  while (*p) {
    while (isspace((unsigned char)*p) || *p == ';') p++;
    if (!*p) break;
    const char *k0 = p;
    while (*p && *p != '=' && *p != ';' && !isspace((unsigned char)*p)) p++;
    size_t klen = (size_t)(p - k0);
    while (isspace((unsigned char)*p)) p++;
    if (*p != '=' || !klen)
      return lm_fail(LM_ERR_INVALID, "env %s: action_sets '%s' is not 'name = actions; ...'", env->name,
                     env->action_sets),
             -1;
    p++;
    int n = 0;
    for (;;) {
      while (*p == ' ' || *p == '\t') p++;
      if (!*p || *p == ';') break;
      char *end;
      long a = strtol(p, &end, 10);
      if (end == p || a < 0 || a >= env->action.n || n == MAX_SET)
        return lm_fail(LM_ERR_INVALID, "env %s: action set '%.*s' holds '%.8s', not an action in 0..%d", env->name,
                       (int)klen, k0, p, env->action.n - 1),
               -1;
      if (map) map[n] = (int)a;
      n++;
      p = end;
    }
    if (n < 2)
      return lm_fail(LM_ERR_INVALID, "env %s: action set '%.*s' needs 2 actions or more", env->name, (int)klen, k0), -1;
    if (name && strlen(name) == klen && !strncmp(name, k0, klen)) return n;
    if (nlen + klen + 3 < sizeof names) nlen += (size_t)snprintf(names + nlen, sizeof names - nlen, ", %.*s", (int)klen, k0);
  }
  if (!name) return 0;
  return lm_fail(LM_ERR_INVALID, "env %s: no action set '%s' (there are: %s)", env->name, name, names), -1;
}

lm_status lm_env_check_params(const lm_env_spec *env) {
  if (!(env->sticky >= 0 && env->sticky < 1))
    return lm_fail(LM_ERR_INVALID, "env %s: sticky = %g, expected a probability in [0, 1)", env->name,
                   (double)env->sticky);
  if (env->action.kind != LM_SPACE_DISCRETE && (env->sticky != 0 || env->action_sets))
    return lm_fail(LM_ERR_INVALID, "env %s: sticky actions and action sets need a discrete action space", env->name);
  if (env->base) return LM_OK; /* configured from an env that passed */
  if (env->action_map || env->params)
    return lm_fail(LM_ERR_INVALID, "env %s: action_map and params are set by lm_env_configure, not by the env",
                   env->name);
  return find_set(env, NULL, NULL) < 0 ? LM_ERR_INVALID : LM_OK;
}

lm_status lm_env_configure(const lm_env_spec *env, const char *text, const lm_env_spec **out) {
  if (!env || !out) return lm_fail(LM_ERR_INVALID, "lm_env_configure: %s is NULL", !env ? "env" : "out");
  *out = NULL;
  if (env->base) env = env->base; /* parameters always start from the env's own */
  if (!text || !*text) {
    *out = env;
    return LM_OK;
  }
  int limit = env->time_limit;
  double sticky = env->sticky;
  char set[64] = "full";
  int have_limit = 0, have_sticky = 0, have_set = 0;
  for (const char *p = text; *p;) {
    while (*p == ',' || isspace((unsigned char)*p)) p++;
    if (!*p) break;
    const char *item = p;
    while (*p && *p != ',') p++;
    char kv[160];
    size_t len = (size_t)(p - item);
    while (len && isspace((unsigned char)item[len - 1])) len--;
    if (len >= sizeof kv) return lm_fail(LM_ERR_INVALID, "env %s: the parameter '%.40s...' is too long", env->name, item);
    memcpy(kv, item, len);
    kv[len] = 0;
    char *eq = strchr(kv, '=');
    if (!eq)
      return lm_fail(LM_ERR_INVALID, "env %s: parameter '%s' is not key=value (keys: time_limit, sticky, actions)",
                     env->name, kv);
    *eq = 0;
    char *key = kv, *val = eq + 1;
    while (isspace((unsigned char)*val)) val++;
    for (char *e = eq; e > key && isspace((unsigned char)e[-1]); e--) e[-1] = 0;
    int discrete = env->action.kind == LM_SPACE_DISCRETE;
    if (!strcmp(key, "time_limit")) {
      long long v;
      if (!lm_parse_i64(val, 1, 1000000000, &v))
        return lm_fail(LM_ERR_INVALID, "env %s: time_limit = '%s': expected a whole number of steps in 1..1000000000",
                       env->name, val);
      limit = (int)v, have_limit = 1;
    } else if (!strcmp(key, "sticky")) {
      double v;
      if (!lm_parse_real(val, &v) || !(v >= 0 && v < 1))
        return lm_fail(LM_ERR_INVALID, "env %s: sticky = '%s': expected a probability in [0, 1)", env->name, val);
      if (!discrete && v != 0)
        return lm_fail(LM_ERR_INVALID, "env %s: sticky actions need a discrete action space", env->name);
      sticky = v, have_sticky = 1;
    } else if (!strcmp(key, "actions")) {
      if (!discrete) return lm_fail(LM_ERR_INVALID, "env %s: action sets need a discrete action space", env->name);
      if (strcmp(val, "full") && find_set(env, val, NULL) < 0) return LM_ERR_INVALID;
      snprintf(set, sizeof set, "%s", val);
      have_set = 1;
    } else
      return lm_fail(LM_ERR_INVALID, "env %s: no parameter '%s' (there are: time_limit, sticky, actions)", env->name,
                     key);
  }
  /* the canonical text: the keys that differ from the env's own, in a fixed order */
  char canon[TEXT_CAP] = "";
  size_t n = 0;
  if (have_limit && limit != env->time_limit)
    n += (size_t)snprintf(canon + n, sizeof canon - n, "time_limit=%d", limit);
  if (have_sticky && (float)sticky != env->sticky)
    n += (size_t)snprintf(canon + n, sizeof canon - n, "%ssticky=%.9g", n ? "," : "", sticky);
  if (have_set && strcmp(set, "full")) n += (size_t)snprintf(canon + n, sizeof canon - n, "%sactions=%s", n ? "," : "", set);
  if (!n) {
    *out = env;
    return LM_OK;
  }
  pthread_mutex_lock(&made_mu);
  for (int i = 0; i < nmade; i++)
    if (made[i]->spec.base == env && !strcmp(made[i]->params, canon)) {
      *out = &made[i]->spec;
      pthread_mutex_unlock(&made_mu);
      return LM_OK;
    }
  lm_status st = LM_OK;
  int nset = strcmp(set, "full") ? find_set(env, set, NULL) : 0;
  configured *c = nmade < MAX_CONFIGURED ? calloc(1, sizeof *c + (size_t)(nset > 0 ? nset : 1) * sizeof(int)) : NULL;
  if (!c)
    st = nmade < MAX_CONFIGURED ? LM_ERR_NOMEM
                                : lm_fail(LM_ERR_INVALID, "more than %d configured envs in one process", MAX_CONFIGURED);
  if (st == LM_OK) {
    c->spec = *env;
    snprintf(c->params, sizeof c->params, "%s", canon);
    c->spec.params = c->params;
    c->spec.base = env;
    c->spec.time_limit = limit;
    c->spec.sticky = (float)sticky;
    if (nset > 0) {
      find_set(env, set, c->map);
      c->spec.action_map = c->map;
      c->spec.env_actions = env->action.n;
      c->spec.action.n = nset;
    }
    made[nmade++] = c;
    *out = &c->spec;
  }
  pthread_mutex_unlock(&made_mu);
  return st;
}

float lm_env_ref_action(const lm_env_spec *env, float a, float *last, float u) {
  if (env->action.kind != LM_SPACE_DISCRETE) return a;
  if (env->action_map) {
    int k = (int)a;
    a = (float)env->action_map[k < 0 ? 0 : k >= env->action.n ? env->action.n - 1 : k];
  }
  if (env->sticky > 0 && u < env->sticky) a = *last;
  *last = a;
  return a;
}
