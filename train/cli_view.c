/* train/cli_view.c — `rltrain view` (a checkpoint's policy, or a random one, acting in a grid of
 * envs: live in a window, or captured headless to PNG) and `rltrain plot` (a run's learning
 * curve). Both parse arguments, call lumen/viz.h and print; the library prints nothing. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lumen/train.h"
#include "lumen/viz.h"
#include "cli.h"

static void view_usage(FILE *out) {
  fputs("usage: rltrain view CKPT|RUN_DIR|ENV [options]\n"
        "  Shows a policy acting in a grid of envs, stepped on the device by the compiled rollout.\n"
        "  CKPT is a checkpoint file, RUN_DIR a directory holding latest.ckpt; ENV (see 'rltrain list')\n"
        "  shows a random policy.\n"
        "options:\n"
        "  --device NAME     backend: auto (default), cuda, cpu, ref, ...\n"
        "  --envs K          envs shown, 1..64 (default 4)\n"
        "  --seed S          seed of resets and action sampling (default 0)\n"
        "  --size WxH        window size, or one captured frame's size (default: fits the grid)\n"
        "  --headless        no window: capture frames to --out\n"
        "  --frames N        headless: frames captured (default 8)\n"
        "  --every K         headless: env steps between captured frames (default 4)\n"
        "  --out PATH        headless: FILE.png (a grid of the frames) or DIR/ (DIR/frame_0000.png ...)\n"
        "keys (live): space pause, left/right slower/faster, n highlight the next env, z (or Enter)\n"
        "  show the highlighted env alone / the grid again, r reset every env, q or Esc quit\n",
        out);
}

static void plot_usage(FILE *out) {
  fputs("usage: rltrain plot RUN_DIR|LOG.csv [--out FILE.png] [--env ENV]\n"
        "  Draws the learning curve of a training log: mean return vs env steps with the env's solved\n"
        "  threshold, loss and entropy. RUN_DIR reads RUN_DIR/log.csv and writes RUN_DIR/curve.png;\n"
        "  the env comes from RUN_DIR/latest.ckpt unless --env names it.\n",
        out);
}

/* Live: the keys, once the window shows its first frame. */
static int print_keys_once(void *ctx, int frame) {
  (void)ctx;
  if (frame == 0) {
    printf("rltrain view: keys: space pause, left/right slower/faster, n next env, z zoom, r reset, q quit\n");
    fflush(stdout);
  }
  return 0;
}

int lm_cli_view(int argc, char **argv) {
  lm_view_config cfg = {0};
  long long v;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      view_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--headless")) {
      cfg.headless = 1;
    } else if (!strcmp(a, "--device") || !strcmp(a, "--out")) {
      if (!val) return fprintf(stderr, "rltrain: %s needs a value (see 'rltrain view --help')\n", a), 2;
      *(a[2] == 'd' ? &cfg.device : &cfg.out) = val;
      i++;
    } else if (!strcmp(a, "--envs")) {
      if (!lm_cli_int(a, val, 1, LM_VIEW_MAX_CELLS, &v)) return 2;
      cfg.envs = (int)v, i++;
    } else if (!strcmp(a, "--seed")) {
      if (!lm_cli_u64(a, val, &cfg.seed)) return 2;
      i++;
    } else if (!strcmp(a, "--frames")) {
      if (!lm_cli_int(a, val, 1, 100000, &v)) return 2;
      cfg.frames = (int)v, i++;
    } else if (!strcmp(a, "--every")) {
      if (!lm_cli_int(a, val, 1, 1000000, &v)) return 2;
      cfg.every = (int)v, i++;
    } else if (!strcmp(a, "--size")) {
      int w = 0, h = 0;
      char x = 0, rest = 0;
      if (!val || sscanf(val, "%d%c%d%c", &w, &x, &h, &rest) != 3 || (x != 'x' && x != 'X') || w < 64 || h < 64 ||
          w > 8192 || h > 8192)
        return fprintf(stderr, "rltrain: --size needs WxH (64..8192 each), got '%s'\n", val ? val : ""), 2;
      cfg.width = w, cfg.height = h, i++;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "rltrain: unknown option '%s' for 'view' (see 'rltrain view --help')\n", a);
      return 2;
    } else if (!cfg.source) {
      cfg.source = a;
    } else {
      fprintf(stderr, "rltrain: 'view' takes one CKPT, RUN_DIR or ENV, got also '%s'\n", a);
      return 2;
    }
  }
  if (!cfg.source) {
    view_usage(stderr);
    return 2;
  }
  if (cfg.headless && !cfg.out) {
    fprintf(stderr, "rltrain: --headless needs --out FILE.png (a grid of frames) or --out DIR/ (numbered frames)\n");
    return 2;
  }
  if (!cfg.headless && (cfg.out || cfg.frames || cfg.every)) {
    fprintf(stderr, "rltrain: --out, --frames and --every capture frames: add --headless\n");
    return 2;
  }
  if (!cfg.headless) cfg.on_frame = print_keys_once;
  lm_view_result res;
  lm_status st = lm_view_run(&cfg, &res);
  if (st != LM_OK) {
    fprintf(stderr, "rltrain: view: %s\n", lm_last_error());
    return lm_cli_exit(st);
  }
  printf("rltrain view: %s on %s, policy %s: %d frames", res.env, res.device, res.policy, res.frames);
  if (cfg.headless) printf(", %d PNG file%s in %s", res.files, res.files == 1 ? "" : "s", cfg.out);
  printf("\n");
  return 0;
}

int lm_cli_plot(int argc, char **argv) {
  const char *src = NULL, *out = NULL, *env_name = NULL;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      plot_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--out") || !strcmp(a, "--env")) {
      if (!val) return fprintf(stderr, "rltrain: %s needs a value (see 'rltrain plot --help')\n", a), 2;
      *(a[2] == 'o' ? &out : &env_name) = val;
      i++;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "rltrain: unknown option '%s' for 'plot' (see 'rltrain plot --help')\n", a);
      return 2;
    } else if (!src) {
      src = a;
    } else {
      fprintf(stderr, "rltrain: 'plot' takes one RUN_DIR or LOG.csv, got also '%s'\n", a);
      return 2;
    }
  }
  if (!src) {
    plot_usage(stderr);
    return 2;
  }
  struct stat sb;
  char log[4096], png[4096], ckpt[4096], name[128] = "";
  if (stat(src, &sb) != 0) {
    fprintf(stderr, "rltrain: plot: cannot read '%s': %s\n", src, strerror(errno));
    return 1;
  }
  int dir = S_ISDIR(sb.st_mode);
  const char *slash = src[strlen(src) - 1] == '/' ? "" : "/";
  if (dir) snprintf(log, sizeof log, "%s%slog.csv", src, slash);
  else snprintf(log, sizeof log, "%s", src);
  if (out) snprintf(png, sizeof png, "%s", out);
  else if (dir) snprintf(png, sizeof png, "%s%scurve.png", src, slash);
  else {
    const char *base = strrchr(log, '/');
    size_t keep = base ? (size_t)(base - log + 1) : 0;
    snprintf(png, sizeof png, "%.*scurve.png", (int)keep, log);
  }
  /* the env: --env, else the run's checkpoint (beside the log) */
  if (!env_name) {
    const char *base = strrchr(log, '/');
    size_t keep = base ? (size_t)(base - log + 1) : 0;
    snprintf(ckpt, sizeof ckpt, "%.*slatest.ckpt", (int)keep, log);
    lm_ppo_config pc;
    if (stat(ckpt, &sb) == 0 && lm_checkpoint_peek(ckpt, name, sizeof name, &pc) == LM_OK) env_name = name;
  }
  float solved = NAN;
  const lm_env_spec *env = NULL;
  if (env_name) {
    if (!(env = lm_env_find(env_name))) {
      fprintf(stderr, "rltrain: %s\n", lm_last_error());
      return 2;
    }
    solved = env->solved_return;
  }
  if (lm_plot_curve(log, png, env ? (env->gym_id ? env->gym_id : env->name) : NULL, solved) != LM_OK) {
    fprintf(stderr, "rltrain: %s\n", lm_last_error());
    return 1;
  }
  printf("rltrain plot: %s -> %s", log, png);
  if (env) printf(" (%s, solved at %g)", env->name, (double)solved);
  printf("\n");
  return 0;
}
