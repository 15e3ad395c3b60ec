/* viz/session.c — `rltrain view` as a library call: resolves a checkpoint, run directory or env
 * name, builds a rollout of N = cells envs with T = 1 (one compiled scan launch per env step),
 * copies a checkpoint's policy weights into it (or keeps zero weights: a random policy), and
 * either shows it live at the env's frame rate with the viewer's keys or captures frames. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/core.h"
#include "lumen/train.h"
#include "lumen/viz.h"

#ifdef LUMEN_HAVE_SDL
#include <SDL.h>

typedef struct session {
  const lm_env_spec *env;
  lm_backend_t *b;
  lm_rollout *ro;
  int n;
  float *state, *ret, *len, *reward, *term, *trunc;
  lm_view_cell *cells;
  long long steps; /* env steps taken by each env since the start */
} session;

/* Copies the policy parameters of the trainer's rollout (linked to its update program) into ro. */
static lm_status copy_weights(lm_trainer *t, lm_rollout *ro) {
  lm_rollout *tr = lm_trainer_rollout(t);
  lm_program_t *src = lm_rollout_policy_program(tr) ? lm_rollout_policy_program(tr) : lm_rollout_program(tr);
  const lm_policy *p = lm_rollout_policy(ro);
  lm_status st = LM_OK;
  for (int i = 0; i < p->nparams && st == LM_OK; i++) {
    size_t n = lm_policy_param_size(p, i);
    float *buf = lm_malloc((n ? n : 1) * sizeof *buf);
    if (!buf) return LM_ERR_NOMEM;
    st = lm_program_read(src, p->name[i], buf, n);
    if (st == LM_OK) st = lm_program_write(lm_rollout_program(ro), p->name[i], buf, n);
    lm_free(buf);
  }
  return st;
}

/* One env step of every env (one rollout launch), then the episode bookkeeping of the cells. */
static lm_status step_once(session *s) {
  lm_program_t *p = lm_rollout_program(s->ro);
  size_t n = (size_t)s->n;
  lm_status st = lm_rollout_run(s->ro);
  if (st == LM_OK) st = lm_program_read(p, "env.state", s->state, n * (size_t)s->env->state_size);
  if (st == LM_OK) st = lm_program_read(p, "ep.ret", s->ret, n);
  if (st == LM_OK) st = lm_program_read(p, "ep.len", s->len, n);
  if (st == LM_OK) st = lm_program_read(p, "reward", s->reward, n);
  if (st == LM_OK) st = lm_program_read(p, "terminated", s->term, n);
  if (st == LM_OK) st = lm_program_read(p, "truncated", s->trunc, n);
  if (st != LM_OK) return st;
  for (size_t e = 0; e < n; e++) {
    lm_view_cell *c = &s->cells[e];
    if (s->term[e] != 0 || s->trunc[e] != 0) {
      c->last_ret = c->ret + s->reward[e];
      c->episodes++;
    }
    c->ret = s->ret[e];
    c->step = (int)s->len[e];
  }
  s->steps++;
  return LM_OK;
}

static lm_status restart(session *s, uint64_t seed) {
  lm_status st = lm_rollout_reset(s->ro, seed);
  if (st == LM_OK)
    st = lm_program_read(lm_rollout_program(s->ro), "env.state", s->state, (size_t)s->n * (size_t)s->env->state_size);
  memset(s->cells, 0, (size_t)s->n * sizeof *s->cells);
  s->steps = 0;
  return st;
}

/* Resolves cfg->source into a checkpoint path (ckpt[0] != 0) or an env. */
static lm_status resolve(const char *source, char *ckpt, size_t cap, const lm_env_spec **env) {
  struct stat sb;
  ckpt[0] = 0;
  *env = NULL;
  size_t sl = strlen(source);
  int plugin_file = (sl > 2 && !strcmp(source + sl - 2, ".c")) || (sl > 3 && !strcmp(source + sl - 3, ".so"));
  if (!plugin_file && stat(source, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) {
      snprintf(ckpt, cap, "%s%slatest.ckpt", source, source[strlen(source) - 1] == '/' ? "" : "/");
      if (stat(ckpt, &sb) != 0)
        return lm_fail(LM_ERR_IO, "run directory %s holds no latest.ckpt (train into it with --out, or name a checkpoint)",
                       source);
    } else snprintf(ckpt, cap, "%s", source);
    return LM_OK;
  }
  int err = errno;
  const lm_env_spec *e = NULL;
  if (lm_env_resolve(source, &e) == LM_OK) { /* an env by name, or an env file */
    *env = e;
    return LM_OK;
  }
  if (lm_env_is_path(source)) return LM_ERR_INVALID; /* the plugin's own message */
  char known[1024];
  snprintf(known, sizeof known, "%s", lm_last_error());
  const char *list = strstr(known, "(this build has");
  if (err != ENOENT)
    return lm_fail(LM_ERR_INVALID, "'%s' is not an env name %s, and cannot be read as a checkpoint: %s", source,
                   list ? list : "", strerror(err));
  return lm_fail(LM_ERR_INVALID, "'%s' is not a checkpoint file, a run directory or an env name %s", source,
                 list ? list : "");
}

static void fmt_status(char *buf, size_t cap, const session *s, const char *policy, const char *device, double speed,
                       int paused) {
  snprintf(buf, cap, "%s | %s | policy: %s | %.4g fps (x%.3g)%s",
           s->env->gym_id ? s->env->gym_id : s->env->name, device, policy, (double)s->env->fps * speed, speed,
           paused ? " | PAUSED" : "");
}

static double now_s(void) { return (double)SDL_GetPerformanceCounter() / (double)SDL_GetPerformanceFrequency(); }

static lm_status run_live(session *s, lm_viewer *v, const lm_view_config *cfg, const char *policy, const char *device,
                          lm_view_result *res) {
  double speed = 1.0, acc = 0, last = now_s();
  int paused = 0, resets = 0;
  lm_status st = LM_OK;
  char status[2048];
  for (int frame = 0;; frame++) {
    lm_view_event ev;
    int quit = 0;
    while (lm_viewer_poll(v, &ev)) {
      if (ev.kind == LM_VIEW_EVENT_QUIT) quit = 1;
      else if (ev.kind == LM_VIEW_EVENT_PAUSE) paused = !paused;
      else if (ev.kind == LM_VIEW_EVENT_SLOWER) speed = fmax(speed / 2, 1.0 / 16);
      else if (ev.kind == LM_VIEW_EVENT_FASTER) speed = fmin(speed * 2, 64.0);
      else if (ev.kind == LM_VIEW_EVENT_RESET && (st = restart(s, cfg->seed + (uint64_t)++resets)) != LM_OK) return st;
    }
    if (quit) break;
    double rate = (double)s->env->fps * speed, t = now_s();
    double frame_dt = paused ? 1.0 / 30 : 1.0 / fmin(rate, 60.0);
    if (!paused) {
      acc += (t - last) * rate;
      if (frame == 0) acc = 0;
      /* at most four frames' worth of steps per frame: a device slower than real time (the ref
       * interpreter under a sanitizer on a busy machine) drops the debt instead of spending
       * ever longer frames catching up, so the window keeps answering and a frame's cost is
       * bounded by a count, not by how busy the machine is */
      int most = (int)ceil(rate * frame_dt * 4), due = (int)acc;
      if (due > most) due = most, acc = 0;
      acc -= due;
      for (int k = 0; k < due && st == LM_OK; k++) st = step_once(s);
      if (st != LM_OK) return st;
    }
    last = t;
    fmt_status(status, sizeof status, s, policy, device, speed, paused);
    if ((st = lm_viewer_draw(v, s->state, s->cells, status)) != LM_OK) return st;
    res->frames++;
    if (cfg->on_frame && cfg->on_frame(cfg->ctx, frame)) break;
    double left = frame_dt - (now_s() - t);
    if (left > 0.001) SDL_Delay((Uint32)(left * 1000));
  }
  return LM_OK;
}

static lm_status run_headless(session *s, lm_viewer *v, lm_capture *cap, const lm_view_config *cfg, const char *policy,
                              const char *device, lm_view_result *res) {
  int frames = cfg->frames > 0 ? cfg->frames : 8, every = cfg->every > 0 ? cfg->every : 4;
  char status[2048], label[64];
  lm_status st = LM_OK;
  for (int f = 0; f < frames && st == LM_OK; f++) {
    for (int k = 0; f > 0 && k < every && st == LM_OK; k++) st = step_once(s);
    if (st != LM_OK) break;
    snprintf(status, sizeof status, "%s | %s | policy: %s | step %lld", s->env->gym_id ? s->env->gym_id : s->env->name,
             device, policy, s->steps);
    snprintf(label, sizeof label, "frame %d  step %lld  (%.2f s)", f, s->steps,
             s->env->fps > 0 ? (double)s->steps / (double)s->env->fps : 0.0);
    st = lm_viewer_draw(v, s->state, s->cells, status);
    if (st == LM_OK) st = lm_capture_add(cap, lm_viewer_canvas(v), label);
    if (st == LM_OK) res->frames++;
  }
  if (st == LM_OK) st = lm_capture_finish(cap);
  res->files = lm_capture_files(cap);
  return st;
}

lm_status lm_view_run(const lm_view_config *cfg, lm_view_result *res) {
  lm_view_result scratch;
  if (!res) res = &scratch;
  memset(res, 0, sizeof *res);
  if (!cfg || !cfg->source || !*cfg->source)
    return lm_fail(LM_ERR_INVALID, "view: name a checkpoint, a run directory or an env");
  int n = cfg->envs > 0 ? cfg->envs : 4;
  if (n > LM_VIEW_MAX_CELLS) return lm_fail(LM_ERR_INVALID, "view: %d envs; at most %d", n, LM_VIEW_MAX_CELLS);
  if (cfg->headless && (!cfg->out || !*cfg->out))
    return lm_fail(LM_ERR_INVALID, "view: --headless needs --out FILE.png (a grid of frames) or --out DIR/");
  if (cfg->frames < 0 || cfg->every < 0 || cfg->width < 0 || cfg->height < 0)
    return lm_fail(LM_ERR_INVALID, "view: frames, every, width and height must not be negative");
  char ckpt[4096], policy[512];
  const lm_env_spec *env;
  lm_ppo_config pcfg;
  lm_status st = resolve(cfg->source, ckpt, sizeof ckpt, &env);
  if (st != LM_OK) return st;
  if (ckpt[0] && (st = lm_checkpoint_env(ckpt, &env, &pcfg)) != LM_OK) return st; /* a plugin's is loaded again */
  snprintf(res->env, sizeof res->env, "%s", env->name);

  /* open the viewer first: no display fails before anything compiles */
  session s = {.env = env, .n = n};
  lm_capture *cap = NULL;
  lm_trainer *t = NULL;
  lm_viewer *v = lm_viewer_new(env, n, cfg->width, cfg->height, cfg->headless);
  if (!v) return strstr(lm_last_error(), "no display") || strstr(lm_last_error(), "without SDL2") ? LM_ERR_UNSUPPORTED
                                                                                              : LM_ERR_INVALID;
  if (cfg->headless) {
    int w, h;
    lm_canvas_size(lm_viewer_canvas(v), &w, &h);
    if (!(cap = lm_capture_new(cfg->out, cfg->frames > 0 ? cfg->frames : 8, w, h))) {
      st = LM_ERR_INVALID;
      goto done;
    }
  }
  char why[512] = "";
  const char *device = cfg->device && *cfg->device ? cfg->device : "auto";
  if (!(s.b = lm_backend_open(device, why, sizeof why))) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", lm_last_error());
    st = lm_fail(LM_ERR_BACKEND, "cannot open device '%s': %s", device, msg);
    goto done;
  }
  snprintf(res->device, sizeof res->device, "%s", why[0] ? why : lm_backend_name(s.b));
  size_t N = (size_t)n, S = (size_t)env->state_size;
  s.state = lm_calloc(N * (S + 5), sizeof(float));
  s.cells = lm_calloc(N, sizeof *s.cells);
  if (!s.state || !s.cells) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  s.ret = s.state + N * S, s.len = s.ret + N, s.reward = s.len + N, s.term = s.reward + N, s.trunc = s.term + N;
  lm_policy_config pol = ckpt[0] ? pcfg.policy : lm_policy_default();
  if (!(s.ro = lm_rollout_new(s.b, env, &pol, n, 1, LM_STEPPER_DEVICE))) {
    st = LM_ERR_INVALID;
    goto done;
  }
  if (ckpt[0]) {
    /* the trainer knows the checkpoint's layout: build it with the checkpoint's config, load,
     * and take its weights */
    if (!(t = lm_trainer_new(s.b, env, &pcfg))) {
      char msg[2048];
      snprintf(msg, sizeof msg, "%s", lm_last_error());
      st = lm_fail(LM_ERR_INVALID, "rebuilding the trainer of %s: %s", ckpt, msg);
      goto done;
    }
    if ((st = lm_trainer_load(t, ckpt)) != LM_OK || (st = copy_weights(t, s.ro)) != LM_OK) goto done;
    snprintf(policy, sizeof policy, "%.440s (iteration %lld, %lld env steps)", ckpt, (long long)lm_trainer_iterations(t),
             (long long)lm_trainer_env_steps(t));
    snprintf(res->policy, sizeof res->policy, "%s", policy);
    snprintf(policy, sizeof policy, "%.511s", ckpt);
    lm_trainer_free(t);
    t = NULL;
  } else {
    snprintf(policy, sizeof policy, "random");
    snprintf(res->policy, sizeof res->policy, "random (zero weights: %s)",
             env->action.kind == LM_SPACE_DISCRETE ? "uniform over the actions" : "N(0, 1) actions, clipped");
  }
  if ((st = restart(&s, cfg->seed)) != LM_OK) goto done;
  st = cfg->headless ? run_headless(&s, v, cap, cfg, policy, lm_backend_name(s.b), res)
                     : run_live(&s, v, cfg, policy, lm_backend_name(s.b), res);
done:
  if (st != LM_OK) {
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", lm_last_error());
    lm_fail(st, "%s", msg);
  }
  lm_trainer_free(t);
  lm_rollout_free(s.ro);
  lm_backend_free(s.b);
  lm_free(s.state);
  lm_free(s.cells);
  lm_capture_free(cap);
  lm_viewer_free(v);
  return st;
}

#else /* no SDL2 */

lm_status lm_view_run(const lm_view_config *cfg, lm_view_result *res) {
  (void)cfg;
  if (res) memset(res, 0, sizeof *res);
  return lm_fail(LM_ERR_UNSUPPORTED, "built without SDL2: the viewer needs libsdl2-dev and libsdl2-image-dev (then "
                                     "reconfigure)");
}

#endif
