/* envs/validate.c — the env contract, checked where an env meets lumen (lm_env_validate):
 * the spec's fields are sane and its graphs have the shapes lumen relies on, on a trial build
 * over a few envs. Every refusal names the env, the field and, for a graph, both shapes; a
 * graph that failed inside (a bad broadcast, a node of another graph) reports its own first
 * error too. envs/registry.c admits only envs that pass. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "lumen/env.h"

enum { TRIAL_ENVS = 3 };

static void shape_text(lm_tensor t, char *buf, size_t cap) {
  if (!lm_tensor_ok(t)) {
    snprintf(buf, cap, "an invalid tensor");
    return;
  }
  size_t len = (size_t)snprintf(buf, cap, "[");
  for (int a = 0; a < lm_rank(t) && len < cap; a++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", a ? ", " : "", (long long)lm_dim_of(t, a));
  if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* t is [n] (cols == 0) or [n, cols], of graph g. */
static lm_status expect_shape(const lm_env_spec *e, lm_graph_t *g, lm_tensor t, int cols, const char *what) {
  char got[96], want[64];
  if (cols) snprintf(want, sizeof want, "[%d, %d]", TRIAL_ENVS, cols);
  else snprintf(want, sizeof want, "[%d]", TRIAL_ENVS);
  if (lm_tensor_ok(t) && t.g != g)
    return lm_fail(LM_ERR_INVALID, "env %s: %s is a node of another graph (build it in the graph passed in)", e->name,
                   what);
  shape_text(t, got, sizeof got);
  int ok = lm_tensor_ok(t) && lm_rank(t) == (cols ? 2 : 1) && lm_dim_of(t, 0) == TRIAL_ENVS &&
           (!cols || lm_dim_of(t, 1) == cols);
  if (ok) return LM_OK;
  if (!lm_tensor_ok(t) && lm_graph_validate(g) != LM_OK) {
    char first[768];
    snprintf(first, sizeof first, "%s", lm_last_error());
    return lm_fail(LM_ERR_INVALID, "env %s: %s is an invalid tensor, expected %s; its first error: %s", e->name, what,
                   want, first);
  }
  return lm_fail(LM_ERR_INVALID, "env %s: %s is %s, expected %s", e->name, what, got, want);
}

static lm_status check_fields(const lm_env_spec *e) {
  if (!e) return lm_fail(LM_ERR_INVALID, "env: no spec (NULL)");
  if (!e->name || !*e->name) return lm_fail(LM_ERR_INVALID, "env: the spec has no name");
  for (const char *p = e->name; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
      return lm_fail(LM_ERR_INVALID, "env '%s': a name holds letters, digits, '_' and '-' only", e->name);
  const char *missing = !e->reset ? "reset" : !e->step ? "step" : !e->observe ? "observe" : NULL;
  if (missing) return lm_fail(LM_ERR_INVALID, "env %s: the %s graph callback is NULL", e->name, missing);
  int refs = !!e->ref_reset + !!e->ref_step + !!e->ref_observe;
  if (refs != 0 && refs != 3)
    return lm_fail(LM_ERR_INVALID, "env %s: a reference stepper needs ref_reset, ref_step and ref_observe (%s is NULL)",
                   e->name, !e->ref_reset ? "ref_reset" : !e->ref_step ? "ref_step" : "ref_observe");
  if (e->state_size < 1 || e->state_size > LM_ENV_SIZE_LIMIT)
    return lm_fail(LM_ERR_INVALID, "env %s: state_size = %d, expected 1 to %d", e->name, e->state_size,
                   LM_ENV_SIZE_LIMIT);
  if (e->obs_size < 1 || e->obs_size > LM_ENV_SIZE_LIMIT)
    return lm_fail(LM_ERR_INVALID, "env %s: obs_size = %d, expected 1 to %d", e->name, e->obs_size, LM_ENV_SIZE_LIMIT);
  if (e->obs_rank < 0 || e->obs_rank > LM_MAX_RANK)
    return lm_fail(LM_ERR_INVALID, "env %s: obs_rank = %d, expected 0 (a vector) to %d", e->name, e->obs_rank, LM_MAX_RANK);
  if (e->obs_rank) {
    long long n = 1;
    char shape[128] = "";
    for (int k = 0; k < e->obs_rank; k++) {
      n *= e->obs_shape[k] > 0 ? e->obs_shape[k] : 0;
      snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%d", k ? " x " : "", e->obs_shape[k]);
      if (n > LM_ENV_SIZE_LIMIT) n = -1;
      if (n <= 0) break;
    }
    if (n != e->obs_size)
      return lm_fail(LM_ERR_INVALID, "env %s: obs_shape %s does not hold obs_size = %d elements", e->name, shape,
                     e->obs_size);
  }
  if (!e->obs_low != !e->obs_high)
    return lm_fail(LM_ERR_INVALID, "env %s: obs_%s is set and obs_%s is NULL (give both bounds, or neither: unbounded)",
                   e->name, e->obs_low ? "low" : "high", e->obs_low ? "high" : "low");
  if (e->action.kind == LM_SPACE_DISCRETE) {
    if (e->action.n < 2 || e->action.n > LM_ENV_SIZE_LIMIT)
      return lm_fail(LM_ERR_INVALID, "env %s: a discrete action space of %d actions, expected 2 to %d", e->name,
                     e->action.n, LM_ENV_SIZE_LIMIT);
  } else if (e->action.kind == LM_SPACE_BOX) {
    if (e->action.n < 1 || e->action.n > LM_ENV_SIZE_LIMIT)
      return lm_fail(LM_ERR_INVALID, "env %s: a box action space of %d dimensions, expected 1 to %d", e->name,
                     e->action.n, LM_ENV_SIZE_LIMIT);
    if (!e->action.low || !e->action.high)
      return lm_fail(LM_ERR_INVALID, "env %s: a box action space needs action.low and action.high (%s is NULL)", e->name,
                     !e->action.low ? "low" : "high");
    for (int k = 0; k < e->action.n; k++)
      if (!isfinite(e->action.low[k]) || !isfinite(e->action.high[k]) || !(e->action.low[k] < e->action.high[k]))
        return lm_fail(LM_ERR_INVALID, "env %s: action bounds [%g, %g] of dimension %d are not finite with low < high",
                       e->name, (double)e->action.low[k], (double)e->action.high[k], k);
  } else
    return lm_fail(LM_ERR_INVALID, "env %s: action.kind %d is neither LM_SPACE_DISCRETE nor LM_SPACE_BOX", e->name,
                   (int)e->action.kind);
  if (e->time_limit < 1)
    return lm_fail(LM_ERR_INVALID, "env %s: time_limit = %d, expected at least 1 step", e->name, e->time_limit);
  if (!isfinite(e->solved_return)) return lm_fail(LM_ERR_INVALID, "env %s: solved_return is not finite", e->name);
  const float tol[4] = {e->check_rtol, e->check_atol, e->reward_rtol, e->reward_atol};
  for (int k = 0; k < 4; k++)
    if (!(tol[k] >= 0) || !isfinite(tol[k]))
      return lm_fail(LM_ERR_INVALID, "env %s: the check tolerances must be finite and >= 0", e->name);
  return LM_OK;
}

/* The graphs on a trial build over TRIAL_ENVS envs: reset [N, S]; step's state [N, S], reward
 * [N], terminated [N]; observe [N, O]. */
static lm_status check_graphs(const lm_env_spec *e) {
  lm_graph_t *g = lm_graph_new();
  if (!g) return LM_ERR_NOMEM;
  lm_status st;
  int A = lm_env_action_size(e);
  lm_dim sd[2] = {TRIAL_ENVS, e->state_size}, ad[2] = {TRIAL_ENVS, A};
  lm_tensor s = lm_input(g, "state", LM_ROLE_STATE, 2, sd);
  lm_tensor a = e->action.kind == LM_SPACE_DISCRETE ? lm_input(g, "action", LM_ROLE_DATA, 1, ad)
                                                    : lm_input(g, "action", LM_ROLE_DATA, 2, ad);
  if ((st = expect_shape(e, g, e->reset(g, TRIAL_ENVS), e->state_size, "the reset graph's state")) != LM_OK) goto done;
  lm_env_step_out out;
  memset(&out, 0, sizeof out);
  e->step(g, s, a, &out);
  if ((st = expect_shape(e, g, out.state, e->state_size, "step's state")) != LM_OK) goto done;
  if ((st = expect_shape(e, g, out.reward, 0, "step's reward")) != LM_OK) goto done;
  if ((st = expect_shape(e, g, out.terminated, 0, "step's terminated")) != LM_OK) goto done;
  if ((st = expect_shape(e, g, e->observe(g, s), e->obs_size, "the observation")) != LM_OK) goto done;
  if (lm_graph_validate(g) != LM_OK) {
    char first[768];
    snprintf(first, sizeof first, "%s", lm_last_error());
    st = lm_fail(LM_ERR_INVALID, "env %s: its graphs do not validate: %s", e->name, first);
  }
done:
  lm_graph_free(g);
  return st;
}

/* The observation bounds, read only once the observe graph has shown obs_size is the width the
 * env means (the arrays hold obs_size floats each). */
static lm_status check_bounds(const lm_env_spec *e) {
  for (int k = 0; e->obs_low && k < e->obs_size; k++)
    if (!(e->obs_low[k] <= e->obs_high[k]))
      return lm_fail(LM_ERR_INVALID, "env %s: observation bounds [%g, %g] of element %d are not low <= high", e->name,
                     (double)e->obs_low[k], (double)e->obs_high[k], k);
  return LM_OK;
}

lm_status lm_env_check_params(const lm_env_spec *env); /* envs/params.c */

lm_status lm_env_validate(const lm_env_spec *e) {
  lm_status st = check_fields(e);
  if (st == LM_OK) st = lm_env_check_params(e);
  if (st == LM_OK) st = check_graphs(e);
  return st != LM_OK ? st : check_bounds(e);
}
