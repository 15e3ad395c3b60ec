/* train/cli_train.c — `rltrain ENV [options]` (PPO training with progress, log.csv,
 * summary.json, checkpoints and --resume) and `rltrain eval CKPT` (greedy and sampled
 * returns). These print; the library they drive does not. Under mpirun every rank runs this
 * (lumen/dist.h): rank 0 alone prints and writes the run directory, and a rank that fails ends the
 * job on every rank. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cc.h"
#include "cli.h"
#include "lumen/lumen.h"
#include "lumen/viz.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void train_usage(FILE *out) {
  fputs("usage: rltrain ENV [options]   (train PPO on ENV; `rltrain list` shows the envs)\n"
        "\n"
        "  --device D          auto (default), cpu, ref, or another backend of this build\n"
        "  --envs N            parallel envs (default: tuned per env)\n"
        "  --steps T           steps per env per iteration (the horizon)\n"
        "  --total-steps S     env-step budget (training stops there)\n"
        "  --seed S            random seed (default 1)\n"
        "  --lr X              Adam learning rate (annealed linearly to 0; --no-anneal keeps it)\n"
        "  --out DIR           run directory (default runs/ENV-<time>)\n"
        "  --resume DIR        continue the run in DIR from DIR/latest.ckpt\n"
        "  --stepper device|host  env stepped by the compiled graph (default) or by the scalar\n"
        "                      reference on the host, with the policy on the device\n"
        "  --gamma X --gae-lambda X --epochs K --minibatches K --clip X --ent-coef X\n"
        "  --vf-coef X --max-grad-norm X --hidden 64,64 --activation tanh|relu --shared\n"
        "  --policy mlp|cnn    cnn: a 3x3 convolution of 16 filters (relu) before the hidden\n"
        "                      layers, the default for image observations (MinAtar's network)\n"
        "  --no-stop           keep training after the env's threshold is reached\n"
        "  --exact             the policy's graphs round every product as the reference does (the same\n"
        "                      bits on every backend); by default the update's, the bootstrap's and a\n"
        "                      stepwise rollout's cpu kernels may fuse a*b + c into FMAs and\n"
        "                      flush subnormals to zero, and the cpu kernels (a fused rollout's\n"
        "                      too) may take exp2 from an inline polynomial (within 6e-7 of it)\n"
        "  --view              watch the current policy in a window while training (q closes it)\n"
        "  --checkpoint-every K  iterations between checkpoints, exactly (default: every 10, but at\n"
        "                      least 0.25 s apart; the last iteration's is always written)\n"
        "  --search-budget S   seconds of schedule search per program, candidates timed on the\n"
        "                      device (cpu, opencl, cuda); winners are cached, so a rerun does\n"
        "                      no search. Without it the tuning cache's decisions for these\n"
        "                      kernels apply (`rltrain tune ENV` fills it); 0: the default\n"
        "                      schedule, the cache ignored\n"
        "  --quiet             no per-iteration output\n"
        "  --dist-timeout S    under mpirun: seconds a rank waits for the others in a collective\n"
        "                      before it names the ranks it has not heard from and ends the job\n"
        "                      (default 120, or LUMEN_DIST_TIMEOUT); --envs is per rank\n"
        "  --config FILE       settings as key = value lines (the names in DIR/settings.txt:\n"
        "                      envs, steps, lr, hidden, ...); options beside it override it\n"
        "  --env K=V,...       env parameters, for every env: time_limit=STEPS, and for\n"
        "                      discrete actions sticky=P (a step repeats the env's last action\n"
        "                      with probability P) and actions=full|SET (a set the env names,\n"
        "                      e.g. minimal); recorded in the run and its checkpoints\n"
        "\n"
        "Writes DIR/log.csv, DIR/curve.png, DIR/summary.json, DIR/checkpoints/step-<n>.ckpt and\n"
        "DIR/latest.ckpt.\n"
        "Stops when the mean return of the last 100 episodes reaches the env's threshold\n"
        "(unless --no-stop) or when the step budget is spent.\n",
        out);
}

static int bad(const char *fmt, const char *a) {
  fprintf(stderr, "rltrain: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, " (see rltrain %s --help)\n", "ENV");
  return 2;
}

static int mkdirs(const char *path) {
  char buf[4400];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(buf, 0777) && errno != EEXIST) return 0;
      *p = '/';
    }
  return !mkdir(buf, 0777) || errno == EEXIST;
}

/* A --config file's text (a regular file of at most 64 KiB), or NULL after saying why. */
static char *read_config(const char *path) {
  FILE *f = fopen(path, "r");
  struct stat sb;
  if (!f || fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > 65536) {
    fprintf(stderr, "rltrain: --config %s: %s\n", path,
            !f ? strerror(errno) : !S_ISREG(sb.st_mode) ? "not a regular file" : "over 64 KiB");
    if (f) fclose(f);
    return NULL;
  }
  char *text = malloc((size_t)sb.st_size + 1);
  size_t n = text ? fread(text, 1, (size_t)sb.st_size, f) : 0;
  fclose(f);
  if (!text) return NULL;
  text[n] = 0;
  if (strlen(text) != n) {
    fprintf(stderr, "rltrain: --config %s: holds a NUL byte\n", path);
    free(text);
    return NULL;
  }
  return text;
}

/* curve.png redrawn while training goes on: a drawing reads the whole log.csv, so it costs more as
 * the run goes on (0.33 s at 5k rows, 33 s at 500k); on a thread of its own the training thread
 * never waits for it. One drawing at a time; the run's end joins it and draws the last one. */
typedef struct plotter {
  pthread_t thread;
  int running;         /* a drawing thread to join */
  atomic_int done;     /* it has finished */
  const char *log, *png, *env;
  float solved;
  double cost;         /* seconds the last drawing took */
} plotter;

static void *plot_main(void *arg) {
  plotter *p = arg;
  double t0 = now();
  lm_plot_curve(p->log, p->png, p->env, p->solved); /* a failure leaves the last curve: the end says why */
  p->cost = now() - t0;
  atomic_store(&p->done, 1);
  return NULL;
}

/* Joins a finished (or, with wait, any) drawing; 1 when none is running after. */
static int plot_join(plotter *p, int wait) {
  if (p->running && (wait || atomic_load(&p->done))) {
    pthread_join(p->thread, NULL);
    p->running = 0;
  }
  return !p->running;
}

/* Starts a drawing; 0 when no thread could be had (nothing is drawn then). */
static int plot_start(plotter *p) {
  atomic_store(&p->done, 0);
  p->running = pthread_create(&p->thread, NULL, plot_main, p) == 0;
  return p->running;
}

/* Removes the temporary files a killed run left in dir (checkpoints are written as
 * NAME.tmp.<pid> and renamed; a kill between the two leaves one for ever). */
static void remove_stale_temps(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[4400];
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".ckpt.tmp.")) {
      snprintf(path, sizeof path, "%.4000s/%.255s", dir, e->d_name);
      remove(path);
    }
  closedir(d);
}

/* Ends writing the temp file f (ok: every write so far succeeded): flushed to disk and renamed
 * over path, or removed; 1 when path now holds it (errno tells why not). */
static int commit_temp(FILE *f, int ok, const char *tmp, const char *path) {
  ok &= fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path) != 0) {
    int err = errno;
    remove(tmp);
    errno = err;
    return 0;
  }
  return 1;
}

/* On --resume: log.csv keeps its header and the rows of iterations up to the checkpoint's (a
 * killed run logged some past it, and they are run again), rewritten through a temp file. */
static int truncate_log(const char *path, int64_t upto) {
  FILE *in = fopen(path, "r");
  if (!in) return errno == ENOENT ? 1 : 0;
  char tmp[4400];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = fopen(tmp, "w");
  if (!out) {
    fclose(in);
    return 0;
  }
  char line[4096];
  int first = 1, ok = 1;
  while (fgets(line, sizeof line, in)) {
    char *end;
    long long it = strtoll(line, &end, 10);
    if (first || (end != line && *end == ',' && it <= upto)) ok &= fputs(line, out) >= 0;
    first = 0;
  }
  ok &= !ferror(in);
  fclose(in);
  return commit_temp(out, ok, tmp, path);
}

/* DIR/settings.txt: everything a run was resolved to (env, device, stop rule, checkpoint
 * interval and every PPO setting, defaults included), written at its start; --resume reads the
 * run-level ones back (the PPO settings come from the checkpoint itself). */
#define CHECKPOINT_SPACING_S 0.25 /* seconds between default checkpoints (why: where `spacing` is set) */

static int write_run_settings(const char *path, const lm_env_spec *env, const lm_ppo_config *cfg, int stop,
                              long every, double spacing, const char *device) {
  char text[2048], tmp[4400];
  lm_ppo_config_print(cfg, text, sizeof text);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return 0;
  int ok = fprintf(f, "env = %s\n", env->name) > 0;
  if (env->params && env->params[0]) ok &= fprintf(f, "env_params = %s\n", env->params) > 0;
  ok &= fprintf(f, "device = %s\nstop = %d\ncheckpoint_every = %ld\ncheckpoint_spacing_s = %g\n%s", device, stop, every,
                spacing, text) > 0;
  return commit_temp(f, ok, tmp, path);
}

/* stop and checkpoint_every from a settings.txt (1 with them set; 1 leaving them if there is no
 * file; 0 when the file is there but they are missing or malformed), and checkpoint_spacing_s
 * where it is there (runs before it had none: 0). */
static int read_run_settings(const char *path, long *stop, long *every, double *spacing) {
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT;
  char line[512];
  int have = 0;
  while (fgets(line, sizeof line, f)) {
    long v;
    char rest;
    if (sscanf(line, "stop = %ld%c", &v, &rest) == 2 && rest == '\n' && (v == 0 || v == 1)) *stop = v, have |= 1;
    if (sscanf(line, "checkpoint_every = %ld%c", &v, &rest) == 2 && rest == '\n' && v >= 1 && v <= 1000000000)
      *every = v, have |= 2;
    double d;
    if (sscanf(line, "checkpoint_spacing_s = %lf%c", &d, &rest) == 2 && rest == '\n' && d >= 0 && d <= 3600)
      *spacing = d;
  }
  fclose(f);
  return have == 3;
}

static int parse_hidden(const char *text, lm_policy_config *p) {
  p->layers = 0;
  const char *s = text;
  while (*s && p->layers < LM_POLICY_MAX_LAYERS) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 1 || v > 4096) return 0;
    p->hidden[p->layers++] = (int)v;
    s = end;
    if (*s == ',') s++;
    else if (*s) return 0;
  }
  return p->layers > 0 && !*s;
}

/* The value of setting `key` in a config's printed form ("" when absent). */
static void setting_text(const lm_ppo_config *c, const char *key, char *buf, size_t cap) {
  char text[2048];
  lm_ppo_config_print(c, text, sizeof text);
  size_t k = strlen(key);
  buf[0] = 0;
  for (const char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l))
    if (!strncmp(l, key, k) && !strncmp(l + k, " = ", 3)) {
      const char *v = l + k + 3, *e = strchr(v, '\n');
      size_t n = e ? (size_t)(e - v) : strlen(v);
      snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), v);
      return;
    }
}

/* --resume continues a run with the settings in its checkpoint: options that set anything but
 * the step budget to another value than the run's are refused, each named. 1 when any is. */
static int resume_conflicts(const lm_ppo_config *want, const lm_ppo_config *saved, const char *const *given,
                            int ngiven, const char *run) {
  int bad = 0;
  for (int g = 0; g < ngiven; g++) {
    if (!strcmp(given[g], "total_steps")) continue;
    char a[256], b[256];
    setting_text(want, given[g], a, sizeof a);
    setting_text(saved, given[g], b, sizeof b);
    if (!strcmp(a, b)) continue;
    if (!bad) fprintf(stderr, "rltrain: --resume %s continues that run with its own settings; these options differ:\n", run);
    fprintf(stderr, "  %s = %s on the command line, %s in the run\n", given[g], a, b);
    bad = 1;
  }
  if (bad) fprintf(stderr, "rltrain: drop them (only --total-steps may change on --resume), or start a new run\n");
  return bad;
}

/* `rltrain tune`'s own options */
typedef struct tune_opts {
  const char *budget; /* seconds of search per program */
  int keep;           /* 0: --no-keep */
} tune_opts;
static int tune_main(const lm_env_spec *env, const lm_ppo_config *cfg, const char *device, const tune_opts *tune);

/* tune: NULL to train, else tune with those options instead */
static int train_main(const char *env_name, int argc, char **argv, lm_dist_t *d, const tune_opts *tune) {
  int K = lm_dist_size(d), rank = lm_dist_rank(d), lead = rank == 0;
  /* the tuning cache's decisions apply unless the user says otherwise (--search-budget, the
   * variable itself): read when each program compiles (lumen/search.h, cache_only) */
  setenv("LUMEN_SEARCH_CACHE_ONLY", "1", 0);
  const lm_env_spec *env = lm_env_find(env_name);
  if (!env) {
    fprintf(stderr, "rltrain: %s (see 'rltrain list')\n", lm_last_error());
    return 2;
  }
  const char *env_params = NULL; /* --env key=value,... (lm_env_configure), wherever it stands */
  for (int i = 0; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--env")) env_params = argv[i + 1];
  if (env_params && lm_env_configure(env, env_params, &env) != LM_OK) {
    fprintf(stderr, "rltrain: --env %s: %s\n", env_params, lm_last_error());
    return LM_CLI_USAGE;
  }
  lm_ppo_config cfg;
  if (lm_ppo_defaults_for(env, &cfg) != LM_OK) {
    fprintf(stderr, "rltrain: %s\n", lm_last_error());
    return LM_CLI_USAGE;
  }
  const char *device = "auto", *out = NULL, *resume = NULL;
  int stop = 1, quiet = 0, view = 0;
  long every = 10;
  int every_given = 0;
  const char *given[64]; /* the settings the command line sets, by checkpoint name (for --resume) */
  int ngiven = 0;
#define GIVEN(key) (given[ngiven < 64 ? ngiven++ : 63] = (key))
  /* --config FILE first, wherever it stands: the options given beside it override it */
  for (int i = 0; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--config")) {
      if (!lm_cli_path("--config", argv[i + 1])) return LM_CLI_USAGE;
      char *text = read_config(argv[i + 1]);
      if (!text) return LM_CLI_USAGE;
      int n = 32;
      lm_status st = lm_ppo_config_apply(&cfg, text, argv[i + 1], given + ngiven, &n);
      free(text);
      if (st != LM_OK) {
        fprintf(stderr, "rltrain: %s\n", lm_last_error());
        return LM_CLI_USAGE;
      }
      ngiven += n;
    }
  for (int i = 0; i < argc; i++) {
    const char *o = argv[i];
    double v;
    if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
      train_usage(stdout);
      return 0;
    }
    if (!strcmp(o, "--no-stop")) { stop = 0; GIVEN("stop"); continue; }
    if (!strcmp(o, "--view")) { view = 1; continue; }
    if (!strcmp(o, "--quiet")) { quiet = 1; continue; }
    if (!strcmp(o, "--no-anneal")) { cfg.anneal_lr = 0; GIVEN("anneal_lr"); continue; }
    if (!strcmp(o, "--shared")) { cfg.policy.shared = 1; GIVEN("shared"); continue; }
    if (!strcmp(o, "--exact")) { cfg.exact = 1; GIVEN("exact"); continue; }
    if (o[0] != '-' || !o[1]) return bad("unexpected argument '%s' (options start with --)", o);
    if (i + 1 >= argc) return bad("option %s needs a value", o);
    const char *a = argv[++i];
    /* a numeric setting: the option, its name in checkpoints, and where it goes */
    static const struct {
      const char *opt, *key;
    } num[] = {{"--envs", "envs"},        {"--steps", "steps"},         {"--total-steps", "total_steps"},
               {"--lr", "lr"},            {"--gamma", "gamma"},         {"--gae-lambda", "gae_lambda"},
               {"--epochs", "epochs"},    {"--minibatches", "minibatches"}, {"--clip", "clip_coef"},
               {"--ent-coef", "ent_coef"}, {"--vf-coef", "vf_coef"},    {"--max-grad-norm", "max_grad_norm"}};
    size_t k = 0;
    while (k < sizeof num / sizeof *num && strcmp(o, num[k].opt)) k++;
    if (k < sizeof num / sizeof *num) {
      if (!lm_cli_setting(o, num[k].key, a, &v)) return LM_CLI_USAGE;
      switch (k) {
      case 0: cfg.n_envs = (int64_t)v; break;
      case 1: cfg.horizon = (int64_t)v; break;
      case 2: cfg.total_steps = (int64_t)v; break;
      case 3: cfg.lr = (float)v; break;
      case 4: cfg.gamma = (float)v; break;
      case 5: cfg.gae_lambda = (float)v; break;
      case 6: cfg.epochs = (int)v; break;
      case 7: cfg.minibatches = (int)v; break;
      case 8: cfg.clip_coef = (float)v; break;
      case 9: cfg.ent_coef = (float)v; break;
      case 10: cfg.vf_coef = (float)v; break;
      default: cfg.max_grad_norm = (float)v; break;
      }
      GIVEN(num[k].key);
      continue;
    }
    if (!strcmp(o, "--config") || !strcmp(o, "--env") || !strcmp(o, "--dist-timeout")) continue; /* applied above */
    if (!strcmp(o, "--device")) device = a;
    else if (!strcmp(o, "--out")) {
      if (!lm_cli_path(o, a)) return LM_CLI_USAGE;
      out = a;
    } else if (!strcmp(o, "--resume")) {
      if (!lm_cli_path(o, a)) return LM_CLI_USAGE;
      resume = a;
    } else if (!strcmp(o, "--stepper")) {
      GIVEN("stepper");
      if (!strcmp(a, "device")) cfg.stepper = LM_STEPPER_DEVICE;
      else if (!strcmp(a, "host")) cfg.stepper = LM_STEPPER_HOST;
      else return bad("--stepper is device or host, not '%s'", a);
    } else if (!strcmp(o, "--hidden")) {
      GIVEN("hidden");
      if (!parse_hidden(a, &cfg.policy)) return bad("--hidden wants widths like 64,64 (1-4 layers), not '%s'", a);
    } else if (!strcmp(o, "--policy")) {
      GIVEN("conv");
      if (!strcmp(a, "mlp")) cfg.policy.conv = 0;
      else if (!strcmp(a, "cnn")) cfg.policy.conv = 16;
      else return bad("--policy is mlp or cnn (a 3x3 convolution of 16 filters first, for images), not '%s'", a);
    } else if (!strcmp(o, "--activation")) {
      GIVEN("activation");
      if (!strcmp(a, "tanh")) cfg.policy.activation = LM_ACT_TANH;
      else if (!strcmp(a, "relu")) cfg.policy.activation = LM_ACT_RELU;
      else return bad("--activation is tanh or relu, not '%s'", a);
    } else if (!strcmp(o, "--seed")) {
      if (!lm_cli_u64(o, a, &cfg.seed)) return LM_CLI_USAGE;
      GIVEN("seed");
    } else if (!strcmp(o, "--checkpoint-every")) {
      long long e;
      if (!lm_cli_int(o, a, 1, 1000000000, &e)) return LM_CLI_USAGE;
      every = (long)e;
      every_given = 1;
      GIVEN("checkpoint_every");
    } else if (!strcmp(o, "--search-budget") && !tune) {
      if (!lm_cli_real(o, a, 0, 86400, &v)) return LM_CLI_USAGE;
      setenv("LUMEN_SEARCH_BUDGET", a, 1); /* read when the backend compiles */
      if (v == 0) setenv("LUMEN_SEARCH_CACHE_ONLY", "0", 1);
    }
    else return bad("unknown option %s", o);
  }
#undef GIVEN
  if (!lead) quiet = 1, view = 0; /* rank 0 speaks for the run */
  if (!resume && lm_ppo_config_check(&cfg) != LM_OK) {
    fprintf(stderr, "rltrain: %s (see rltrain %s --help)\n", lm_last_error(), env->name);
    return LM_CLI_USAGE;
  }
  if (tune) {
    if (resume || out) return bad("%s: 'rltrain tune' writes no run (it takes the training settings only)",
                                  resume ? "--resume" : "--out");
    return tune_main(env, &cfg, device, tune);
  }
  char dir[4096], path[4200];
  /* By default a checkpoint every 10 iterations, but not within CHECKPOINT_SPACING_S of the last:
   * a checkpoint costs the training about 1.4 ms (reading the state, its checksum, two files
   * written and synced beside the training threads), and CartPole's iterations take about 1.3
   * ms (lumen's defaults, 2-core Xeon): every 10 iterations cost 10% of the run (753k against
   * 837k env steps/s without checkpoints). --checkpoint-every K asks for every K exactly, and so
   * does a run over several ranks (a checkpoint is collective: no rank may decide it by its own
   * clock). */
  double spacing = every_given || K > 1 ? 0 : CHECKPOINT_SPACING_S;
  if (resume) {
    snprintf(path, sizeof path, "%s/latest.ckpt", resume);
    char name[64];
    lm_ppo_config saved;
    lm_status pst = lm_checkpoint_peek(path, name, sizeof name, &saved);
    if (pst != LM_OK) {
      fprintf(stderr, "rltrain: cannot resume: %s\n", lm_last_error());
      return LM_CLI_USAGE; /* the input is missing or unreadable */
    }
    if (strcmp(name, env->name)) {
      fprintf(stderr, "rltrain: cannot resume: %s was trained on %s, not %s\n", resume, name, env->name);
      return LM_CLI_USAGE;
    }
    /* the run's env parameters; --env may only repeat them */
    const lm_env_spec *run_env;
    lm_ppo_config unused;
    if (lm_checkpoint_env(path, &run_env, &unused) != LM_OK) {
      fprintf(stderr, "rltrain: cannot resume: %s\n", lm_last_error());
      return LM_CLI_USAGE;
    }
    const char *given_p = env->params ? env->params : "", *run_p = run_env->params ? run_env->params : "";
    if (env_params && strcmp(given_p, run_p)) {
      fprintf(stderr, "rltrain: --resume %s: --env '%s' on the command line, '%s' in the run (drop --env)\n", resume,
              given_p, run_p);
      return LM_CLI_USAGE;
    }
    env = run_env;
    if (saved.n_envs % K) {
      fprintf(stderr, "rltrain: cannot resume: %s holds %lld envs, which %d ranks cannot share evenly (use a number "
                      "of ranks that divides %lld)\n", resume, (long long)saved.n_envs, K, (long long)saved.n_envs);
      return LM_CLI_USAGE;
    }
    saved.n_envs /= K; /* the checkpoint holds the whole run's envs; --envs is per rank */
    /* the run's own settings; the command line may set only the step budget */
    if (resume_conflicts(&cfg, &saved, given, ngiven, resume)) return LM_CLI_USAGE;
    int64_t total = cfg.total_steps;
    int raise = 0;
    for (int g = 0; g < ngiven; g++) raise |= !strcmp(given[g], "total_steps");
    cfg = saved;
    if (raise && total != cfg.total_steps) {
      if (!quiet)
        printf("rltrain: resuming %s with a step budget of %lld (the run had %lld)\n", resume, (long long)total,
               (long long)cfg.total_steps);
      cfg.total_steps = total;
    }
    snprintf(dir, sizeof dir, "%s", resume);
    /* the run's own stop rule and checkpoint interval (settings.txt; runs before it had the defaults) */
    long run_stop = 1, run_every = 10;
    double run_spacing = 0;
    snprintf(path, sizeof path, "%s/settings.txt", dir);
    if (!read_run_settings(path, &run_stop, &run_every, &run_spacing)) {
      fprintf(stderr, "rltrain: cannot resume: %s is malformed\n", path);
      return LM_CLI_USAGE;
    }
    int differ = 0;
    for (int g = 0; g < ngiven; g++) {
      long mine = !strcmp(given[g], "stop") ? stop : !strcmp(given[g], "checkpoint_every") ? every : -1;
      long theirs = !strcmp(given[g], "stop") ? run_stop : run_every;
      if (mine >= 0 && mine != theirs) {
        fprintf(stderr, "rltrain: --resume %s: %s = %ld on the command line, %ld in the run\n", resume, given[g], mine,
                theirs);
        differ = 1;
      }
    }
    if (differ) return LM_CLI_USAGE;
    stop = (int)run_stop;
    every = run_every;
    spacing = every_given || K > 1 ? 0 : run_spacing;
  } else if (out) snprintf(dir, sizeof dir, "%s", out);
  else {
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(dir, sizeof dir, "runs/%s-%s", env->name, stamp);
  }
  if (K > 1) { /* rank 0's run directory for every rank (their clocks may read another second) */
    char *all = malloc((size_t)K * sizeof dir);
    lm_status dst = all ? lm_dist_allgather(d, dir, sizeof dir, all, "run directory") : LM_ERR_NOMEM;
    if (dst == LM_OK) memcpy(dir, all, sizeof dir);
    free(all);
    if (dst != LM_OK) {
      fprintf(stderr, "rltrain: %s\n", lm_last_error());
      return 1;
    }
  }
  char why[1024];
  lm_backend_t *b = lm_backend_open(device, why, sizeof why);
  if (!b) {
    fprintf(stderr, "rltrain: no device: %s\n", lm_last_error());
    return 1;
  }
  snprintf(path, sizeof path, "%s/checkpoints", dir); /* only once there is a device to train on */
  if (lead && !mkdirs(path)) {
    fprintf(stderr, "rltrain: cannot create %s: %s\n", path, strerror(errno));
    lm_backend_free(b);
    return 1;
  }
  if (!resume && lead) {
    lm_ppo_config whole = cfg;
    whole.n_envs *= K; /* the run's, as its checkpoints hold it */
    snprintf(path, sizeof path, "%s/settings.txt", dir);
    if (!write_run_settings(path, env, &whole, stop, every, spacing, device)) {
      fprintf(stderr, "rltrain: cannot write %s: %s\n", path, strerror(errno));
      lm_backend_free(b);
      return 1;
    }
  }
  double t_start = now();
  lm_trainer *t = lm_trainer_new_dist(b, env, &cfg, d);
  if (!t) {
    fprintf(stderr, "rltrain: %s\n", lm_last_error());
    lm_backend_free(b);
    return 1;
  }
  if (K > 1) { /* every rank built its programs: a rank that could not says so to all */
    lm_status ast = lm_dist_agree(d, 1, NULL);
    if (ast != LM_OK) {
      fprintf(stderr, "rltrain: %s\n", lm_last_error());
      lm_trainer_free(t);
      lm_backend_free(b);
      return 1;
    }
  }
  if (resume) {
    snprintf(path, sizeof path, "%s/latest.ckpt", dir);
    lm_status lst = lm_trainer_load(t, path);
    if (lst != LM_OK) {
      fprintf(stderr, "rltrain: cannot resume: %s\n", lm_last_error());
      lm_trainer_free(t);
      lm_backend_free(b);
      return lm_cli_exit(lst);
    }
  }
  double t_ready = now();
  int tty = isatty(STDOUT_FILENO);
  if (!quiet) {
    printf("rltrain %s on %s (%s); %lld envs x %lld steps per iteration, %lld iterations; compiled in %.2fs\n",
           env->gym_id ? env->gym_id : env->name, lm_backend_name(b), why, (long long)(cfg.n_envs * K),
           (long long)cfg.horizon, (long long)lm_trainer_total_iterations(t), t_ready - t_start);
    if (K > 1)
      printf("data-parallel over %d ranks of %lld envs each (%s; %s); collective timeout %g s\n", K,
             (long long)cfg.n_envs, lm_dist_library(d), lm_trainer_exchange(t), lm_dist_timeout(d));
    printf("kernels per iteration: %d; run directory: %s\n", lm_trainer_kernels_per_iteration(t), dir);
  }
  if (lead) {
    remove_stale_temps(dir);
    snprintf(path, sizeof path, "%s/checkpoints", dir);
    remove_stale_temps(path);
  }
  snprintf(path, sizeof path, "%s/log.csv", dir);
  if (lead && resume && !truncate_log(path, lm_trainer_iterations(t))) {
    fprintf(stderr, "rltrain: cannot rewrite %s to the checkpoint's iteration: %s\n", path, strerror(errno));
    lm_trainer_free(t);
    lm_backend_free(b);
    return 1;
  }
  struct stat lsb;
  int have_log = resume && stat(path, &lsb) == 0 && lsb.st_size > 0;
  FILE *log = fopen(lead ? path : "/dev/null", have_log || !lead ? "a" : "w"); /* rank 0 writes the log */
  if (!log) {
    fprintf(stderr, "rltrain: cannot write %s: %s\n", path, strerror(errno));
    lm_trainer_free(t);
    lm_backend_free(b);
    return 1;
  }
  int log_bad = 0; /* a write to log.csv failed (disk full, ...) */
  if (!have_log)
    log_bad |= fputs("iteration,env_steps,wall_s,episodes,mean_return,mean_length,loss,pg_loss,v_loss,entropy,"
                     "approx_kl,clipfrac,lr,sps\n", log) < 0;
  lm_viewer *viewer = NULL;
  if (view) {
    viewer = lm_viewer_new(env, 4, 960, 600, 0);
    if (!viewer) fprintf(stderr, "rltrain: --view: %s; training goes on without the window\n", lm_last_error());
  }
  char curve[4200], logpath[4200];
  double curve_at = now() + 1; /* the next redraw of curve.png (see the loop) */
  plotter plot = {.log = logpath, .png = curve, .env = env->gym_id, .solved = env->solved_return};
  snprintf(curve, sizeof curve, "%s/curve.png", dir);
  snprintf(logpath, sizeof logpath, "%s/log.csv", dir);
  int rc = 0, solved = 0;
  lm_checkpointer *ckpt = lm_checkpointer_new();
  if (!ckpt) {
    fprintf(stderr, "rltrain: out of memory\n");
    rc = 1;
  }
  double mean100 = lm_recent_mean(lm_trainer_recent(t), NULL), have = 0, saved_at = now();
  lm_recent_mean(lm_trainer_recent(t), &have);
  int64_t iters = lm_trainer_total_iterations(t);
  while (!rc && lm_trainer_iterations(t) < iters) {
    lm_iter_stats s;
    if (lm_trainer_iterate(t, &s) != LM_OK) {
      fprintf(stderr, "\nrltrain: iteration %lld failed: %s\n", (long long)lm_trainer_iterations(t) + 1, lm_last_error());
      rc = 1;
      break;
    }
    mean100 = s.recent_return;
    have = s.recent_episodes;
    double wall = now() - t_ready, sps = (double)(cfg.n_envs * K * cfg.horizon) / (s.rollout_s + s.update_s);
    log_bad |= fprintf(log, "%lld,%lld,%.3f,%.0f,%.4f,%.2f,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.1f\n",
                       (long long)s.iteration, (long long)s.env_steps, wall, s.episodes, s.mean_return, s.mean_length,
                       (double)s.loss, (double)s.pg_loss, (double)s.v_loss, (double)s.entropy, (double)s.approx_kl,
                       (double)s.clipfrac, (double)s.lr, sps) < 0;
    log_bad |= fflush(log) != 0;
    if (log_bad) {
      fprintf(stderr, "\nrltrain: writing %s failed: %s\n", logpath, strerror(errno));
      rc = 1;
      break;
    }
    solved = have >= LM_RECENT_EPISODES && mean100 >= env->solved_return;
    if (!quiet) {
      if (tty) {
        int width = 30, filled = (int)(width * (double)s.iteration / (double)iters);
        printf("\r[%.*s%*s] %5.1f%% %9lld steps %8.0f steps/s return %8.2f (last 100: %8.2f)  ", filled,
               "##############################", width - filled, "", 100.0 * (double)s.iteration / (double)iters,
               (long long)s.env_steps, (double)s.env_steps / (wall > 0 ? wall : 1), s.mean_return, mean100);
        fflush(stdout);
      } else
        printf("iter %lld steps %lld return %.2f last100 %.2f len %.1f loss %.4f entropy %.3f kl %.4f clipfrac %.3f "
               "steps/s %.0f\n",
               (long long)s.iteration, (long long)s.env_steps, s.mean_return, mean100, s.mean_length, (double)s.loss,
               (double)s.entropy, (double)s.approx_kl, (double)s.clipfrac, sps);
    }
    if (viewer) {
      char status[256];
      snprintf(status, sizeof status, "%s  %s  iteration %lld  return %.1f", env->name, lm_backend_name(b),
               (long long)s.iteration, mean100);
      if (lm_viewer_show_rollout(viewer, lm_trainer_rollout(t), status) != LM_OK) {
        lm_viewer_free(viewer);
        viewer = NULL;
      }
    }
    /* curve.png is drawn from the whole log on its own thread (plotter, above), again when 50
     * times the last drawing's cost (at least a second) has passed since it ended, so that it
     * takes under 2% of the machine; the run's end draws it too (below) */
    if (lead && plot.running && plot_join(&plot, 0)) curve_at = now() + (50 * plot.cost > 1 ? 50 * plot.cost : 1);
    if (lead && !plot.running && now() >= curve_at && !plot_start(&plot)) curve_at = now() + 1;
    int last = solved && stop;
    if ((s.iteration % every == 0 && now() - saved_at >= spacing) || last || lm_trainer_iterations(t) == iters) {
      saved_at = now();
      snprintf(path, sizeof path, "%s/checkpoints/step-%lld.ckpt", dir, (long long)s.env_steps);
      char latest[4200];
      snprintf(latest, sizeof latest, "%s/latest.ckpt", dir);
      /* step-N first, latest last: when latest cannot be written, step-N goes too, so no
       * step-N.ckpt is ever newer than latest.ckpt; the files are written while training goes
       * on (a failure is told at the next checkpoint or at the end) */
      lm_status cst = lm_checkpointer_save(ckpt, t, (const char *const[]){path, latest}, 2);
      if (cst != LM_OK) {
        fprintf(stderr, "\nrltrain: checkpoint failed: %s\n", lm_last_error());
        rc = 1;
        break;
      }
    }
    if (last) break;
  }
  if (ckpt && lm_checkpointer_finish(ckpt) != LM_OK && !rc) {
    fprintf(stderr, "\nrltrain: checkpoint failed: %s\n", lm_last_error());
    rc = 1;
  }
  lm_checkpointer_free(ckpt);
  if (fclose(log) != 0 && !rc) {
    fprintf(stderr, "rltrain: writing %s failed: %s\n", logpath, strerror(errno));
    rc = 1;
  }
  double wall = now() - t_ready;
  if (viewer) lm_viewer_free(viewer);
  plot_join(&plot, 1);
  if (lead && lm_plot_curve(logpath, curve, env->gym_id, env->solved_return) != LM_OK && !quiet)
    fprintf(stderr, "rltrain: no curve.png: %s\n", lm_last_error());
  if (!quiet && tty) printf("\n");
  snprintf(path, sizeof path, "%s/summary.json", dir);
  FILE *js = lead ? fopen(path, "w") : NULL;
  int js_bad = lead && !js;
  if (js) {
    js_bad |= fprintf(js,
            "{\"env\": \"%s\", \"device\": \"%s\", \"env_steps\": %lld, \"wall_s\": %.3f, \"mean_return\": %.4f, "
            "\"episodes_in_mean\": %.0f, \"solved\": %s, \"threshold\": %.4g, \"stepper\": \"%s\", \"seed\": %llu}\n",
            env->name, lm_backend_name(b), (long long)lm_trainer_env_steps(t), wall, mean100, have,
            solved ? "true" : "false", (double)env->solved_return, cfg.stepper == LM_STEPPER_HOST ? "host" : "device",
            (unsigned long long)cfg.seed) < 0;
    js_bad |= fclose(js) != 0;
  }
  if (js_bad) {
    fprintf(stderr, "rltrain: writing %s failed: %s\n", path, strerror(errno));
    rc = 1;
  }
  if (!quiet)
    printf("%s: %lld env steps in %.1fs (%.0f steps/s); mean return of the last %.0f episodes %.2f (threshold %g)%s\n",
           solved ? "solved" : "done", (long long)lm_trainer_env_steps(t), wall,
           (double)lm_trainer_env_steps(t) / (wall > 0 ? wall : 1), have, mean100, (double)env->solved_return,
           solved ? "" : ": not reached");
  lm_trainer_free(t);
  lm_backend_free(b);
  return rc;
}

/* Under mpirun (lumen/dist.h) every rank trains its part; outside it, one process, as ever. A rank
 * that fails ends the job on every rank, after saying why. */
int lm_cli_train(const char *env_name, int argc, char **argv) {
  double timeout = 120;
  const char *given = getenv("LUMEN_DIST_TIMEOUT"), *from = "LUMEN_DIST_TIMEOUT";
  for (int i = 0; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--dist-timeout")) given = argv[i + 1], from = "--dist-timeout";
  if (given && *given && !lm_cli_real(from, given, 0.001, 1e6, &timeout)) return LM_CLI_USAGE;
  if (!lm_dist_launched()) return train_main(env_name, argc, argv, NULL, NULL);
  lm_dist_t *d = lm_dist_open(timeout);
  if (!d) {
    fprintf(stderr, "rltrain: %s\n", lm_last_error());
    return 1;
  }
  int rc = train_main(env_name, argc, argv, d, NULL);
  if (rc != 0 && lm_dist_size(d) > 1) {
    fprintf(stderr, "rltrain: rank %d of %d stops (exit status %d, the reason above); ending the job on every rank\n",
            lm_dist_rank(d), lm_dist_size(d), rc);
    lm_dist_abort(d, rc);
  }
  lm_dist_close(d);
  return rc;
}

/* ---------------------------------------------------------------- tune */

static void tune_usage(FILE *out) {
  fputs("usage: rltrain tune ENV [--budget S] [--no-keep] [training options]\n"
        "\n"
        "Searches the schedules of the kernels of ENV's training programs at these settings (the\n"
        "bootstrap, GAE and the minibatch update; the fused rollout is shaped by its own passes) for\n"
        "up to S seconds a program (default 60), on the device --device picks, and keeps every\n"
        "decision in the tuning cache. Then times training iterations with the searched kernels and\n"
        "with the default schedule, side by side, and prints both. The decisions stay in the cache\n"
        "only if the searched kernels trained faster (a lower median of 9 samples, and faster in 7\n"
        "of the 9 alternating pairs; else the cache is put back as it was): then\n"
        "`rltrain ENV` with the same settings (the sizes key the cache) runs them; --search-budget 0\n"
        "runs the default schedule. --no-keep puts the cache back whatever the times (a measurement\n"
        "only). Takes rltrain's training options (see rltrain ENV --help) except --out, --resume\n"
        "and --search-budget; writes no run.\n",
        out);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Samples of each schedule, taken in alternating pairs; the searched kernels are kept when their
 * median is lower and they won at least TUNE_WINS of the pairs (by chance alone, with equal
 * schedules, 7 of 9 or more comes up 9% of the time): single MinAtar runs move 20% with the
 * machine's load, and a median of 9 alone kept a plan that was 1% slower as often as not. */
enum { TUNE_ROUNDS = 9, TUNE_WINS = 7, TUNE_MAX_FILES = 64 };

/* The tuning cache's files (search-*.txt, one per device) in a cache directory, read whole. */
typedef struct tune_file {
  char name[256];
  char *data;
  size_t n;
} tune_file;

static int is_tuning_file(const char *name) {
  size_t n = strlen(name);
  return !strncmp(name, "search-", 7) && n > 11 && !strcmp(name + n - 4, ".txt") && n < 256;
}

/* Reads every tuning cache file of dir into fs (at most TUNE_MAX_FILES); their count, -1 when one
 * could not be read. */
static int tune_snapshot(const char *dir, tune_file *fs) {
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : -1;
  int n = 0, ok = 1;
  for (struct dirent *e; ok && (e = readdir(d));) {
    if (!is_tuning_file(e->d_name)) continue;
    if (n == TUNE_MAX_FILES) {
      ok = 0;
      break;
    }
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    tune_file *t = &fs[n];
    snprintf(t->name, sizeof t->name, "%s", e->d_name);
    t->data = NULL, t->n = 0;
    if (!f) {
      ok = 0;
      break;
    }
    for (size_t cap = 0;;) {
      if (t->n == cap) {
        char *g = realloc(t->data, cap = cap ? 2 * cap : 65536);
        if (!g) break;
        t->data = g;
      }
      size_t r = fread(t->data + t->n, 1, cap - t->n, f);
      t->n += r;
      if (r == 0) break;
    }
    ok = !ferror(f) && t->data;
    fclose(f);
    n++;
  }
  closedir(d);
  if (!ok) {
    for (int i = 0; i < n; i++) free(fs[i].data);
    return -1;
  }
  return n;
}

/* Puts dir's tuning cache files back as fs holds them: each rewritten (a temporary file, then
 * renamed over it), the files made since removed. 1 when all went back. */
static int tune_restore(const char *dir, const tune_file *fs, int n) {
  int ok = 1;
  DIR *d = opendir(dir);
  if (d) {
    for (struct dirent *e; (e = readdir(d));) {
      if (!is_tuning_file(e->d_name)) continue;
      int kept = 0;
      for (int i = 0; i < n && !kept; i++) kept = !strcmp(fs[i].name, e->d_name);
      char path[4400];
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      if (!kept && remove(path) != 0) ok = 0;
    }
    closedir(d);
  }
  for (int i = 0; i < n; i++) {
    char path[4400], tmp[4500];
    snprintf(path, sizeof path, "%s/%s", dir, fs[i].name);
    snprintf(tmp, sizeof tmp, "%s.tune-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    int w = f && fwrite(fs[i].data, 1, fs[i].n, f) == fs[i].n;
    if (f && fclose(f) != 0) w = 0;
    if (!w || rename(tmp, path) != 0) {
      remove(tmp);
      ok = 0;
    }
  }
  return ok;
}

/* Seconds of `reps` iterations of t; < 0 when one failed (said). */
static double time_iterations(lm_trainer *t, int reps) {
  lm_iter_stats s;
  double t0 = now();
  for (int r = 0; r < reps; r++)
    if (lm_trainer_iterate(t, &s) != LM_OK) {
      fprintf(stderr, "rltrain: %s\n", lm_last_error());
      return -1;
    }
  return now() - t0;
}

static int tune_main(const lm_env_spec *env, const lm_ppo_config *cfg, const char *device, const tune_opts *tune) {
  const char *budget = tune->budget;
  int keep = tune->keep;
  char why[1024];
  lm_backend_t *b = lm_backend_open(device, why, sizeof why);
  if (!b) {
    fprintf(stderr, "rltrain: no device: %s\n", lm_last_error());
    return 1;
  }
  printf("rltrain tune %s: %s\nsearching each training program for up to %s s ...\n", env->name, why, budget);
  fflush(stdout);
  /* the cache as it was, put back if the searched kernels do not train faster */
  char cache_dir[4096];
  snprintf(cache_dir, sizeof cache_dir, "%s", lm_cc_cache_dir());
  tune_file *before = calloc(TUNE_MAX_FILES, sizeof *before);
  int nbefore = before ? tune_snapshot(cache_dir, before) : -1;
  if (nbefore < 0) {
    fprintf(stderr, "rltrain: cannot read the tuning cache in %s (%s)\n", cache_dir,
            before ? "more files than expected, or one unreadable" : "out of memory");
    free(before);
    lm_backend_free(b);
    return 1;
  }
  setenv("LUMEN_SEARCH_BUDGET", budget, 1); /* read as each program compiles */
  setenv("LUMEN_SEARCH_CACHE_ONLY", "0", 1);
  double t0 = now();
  lm_trainer *tuned = lm_trainer_new(b, env, cfg);
  double search_s = now() - t0;
  setenv("LUMEN_SEARCH_BUDGET", "0", 1); /* the default schedule, the cache ignored */
  lm_trainer *plain = tuned ? lm_trainer_new(b, env, cfg) : NULL;
  unsetenv("LUMEN_SEARCH_BUDGET");
  int rc = 1;
  if (!tuned || !plain) {
    fprintf(stderr, "rltrain: %s\n", lm_last_error());
    goto done;
  }
  printf("searched in %.1f s\n", search_s);
  /* one iteration each first (first-run work), then enough per sample for ~50 ms */
  double w1 = time_iterations(tuned, 1), w2 = w1 < 0 ? -1 : time_iterations(plain, 1);
  if (w1 < 0 || w2 < 0) goto done;
  double one = w1 > w2 ? w1 : w2;
  int reps = one > 0.05 ? 1 : one > 0 ? (int)(0.05 / one) + 1 : 100;
  double ts[TUNE_ROUNDS], tp[TUNE_ROUNDS];
  for (int r = 0; r < TUNE_ROUNDS; r++) { /* alternating, so that both see the same load */
    double a = r % 2 ? time_iterations(plain, reps) : time_iterations(tuned, reps);
    double c = r % 2 ? time_iterations(tuned, reps) : time_iterations(plain, reps);
    if (a < 0 || c < 0) goto done;
    ts[r] = (r % 2 ? c : a) / reps;
    tp[r] = (r % 2 ? a : c) / reps;
  }
  int wins = 0;
  for (int r = 0; r < TUNE_ROUNDS; r++) wins += ts[r] < tp[r];
  qsort(ts, TUNE_ROUNDS, sizeof *ts, cmp_double);
  qsort(tp, TUNE_ROUNDS, sizeof *tp, cmp_double);
  double ms = 1e3 * ts[TUNE_ROUNDS / 2], mp = 1e3 * tp[TUNE_ROUNDS / 2];
  printf("one training iteration (median of %d samples of %d, alternating): searched %.3f ms, default %.3f ms: "
         "%.2fx; faster in %d of %d pairs\n", TUNE_ROUNDS, reps, ms, mp, mp / ms, wins, TUNE_ROUNDS);
  if (keep && ms < mp && wins >= TUNE_WINS) {
    printf("kept in the tuning cache (%s): rltrain %s with these settings runs the searched kernels "
           "(--search-budget 0: the default schedule)\n", cache_dir, env->name);
    rc = 0;
  } else if (tune_restore(cache_dir, before, nbefore)) {
    printf("%s: the tuning cache (%s) is as it was, and rltrain %s keeps the default schedule\n",
           keep ? "not faster" : "--no-keep", cache_dir, env->name);
    rc = 0;
  } else
    fprintf(stderr, "rltrain: the searched kernels are not faster, and the tuning cache in %s could not be put "
                    "back as it was (%s): train with --search-budget 0\n", cache_dir, strerror(errno));
done:
  lm_trainer_free(plain);
  lm_trainer_free(tuned);
  lm_backend_free(b);
  for (int i = 0; i < nbefore; i++) free(before[i].data);
  free(before);
  return rc;
}

int lm_cli_tune(int argc, char **argv) {
  if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
    tune_usage(stdout);
    return 0;
  }
  if (argc < 1 || argv[0][0] == '-') {
    tune_usage(stderr);
    return LM_CLI_USAGE;
  }
  if (lm_dist_launched()) {
    fprintf(stderr, "rltrain: tune runs in one process (not under mpirun): the tuning cache is per machine\n");
    return LM_CLI_USAGE;
  }
  tune_opts t = {"60", 1};
  char **rest = malloc((size_t)argc * sizeof *rest);
  if (!rest) return LM_CLI_FAILED;
  int n = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--budget")) {
      double v;
      if (i + 1 >= argc) {
        free(rest);
        return bad("option %s needs a value", "--budget");
      }
      if (!lm_cli_real("--budget", argv[i + 1], 0.001, 86400, &v)) {
        free(rest);
        return LM_CLI_USAGE;
      }
      t.budget = argv[++i];
    } else if (!strcmp(argv[i], "--no-keep")) t.keep = 0;
    else rest[n++] = argv[i];
  }
  int rc = train_main(argv[0], n, rest, NULL, &t);
  free(rest);
  return rc;
}

/* ---------------------------------------------------------------- eval */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *s) { return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0; }

/* Episodes with the policy on the device (obs in, logits or mean out) and the env stepped by
 * the reference stepper; greedy takes the argmax or the mean, sampled draws from the policy. */
/* Episode ep starts where ref_reset(seed + 7, ep, 0) puts it; an env without a reference stepper
 * is stepped through its graphs (gs, whose reset row ep is the same state). */
static int evaluate(const lm_env_spec *env, lm_env_stepper *gs, lm_program_t *prog, const lm_policy *pol,
                    int episodes, int greedy, uint64_t seed, double *mean_out) {
  float *starts = NULL;
  uint64_t rs = seed;
  double total = 0;
  int disc = env->action.kind == LM_SPACE_DISCRETE, n = env->action.n, S = env->state_size;
  /* one env's state, next state, obs, action, the head's output and the log-stds */
  size_t nbuf = 2 * (size_t)S + (size_t)env->obs_size + 3 * (size_t)n;
  float *state = malloc(nbuf * sizeof *state);
  if (!state) return 0;
  float *next = state + S, *obs = next + S, *act = obs + env->obs_size, *out = act + n, *ls = out + n;
  float last = 0; /* the env's last action (sticky actions) */
  if (gs) {
    starts = malloc((size_t)episodes * (size_t)S * sizeof *starts);
    if (!starts || lm_env_stepper_reset(gs, seed + 7, 0, starts) != LM_OK) {
      free(starts), free(state);
      return 0;
    }
  }
  for (int ep = 0; ep < episodes; ep++) {
    if (gs) memcpy(state, starts + (size_t)ep * (size_t)S, (size_t)S * sizeof *state);
    else env->ref_reset(state, seed + 7, (uint64_t)ep, 0);
    if (gs ? lm_env_stepper_observe(gs, 1, state, obs) != LM_OK : (env->ref_observe(state, obs), 0)) goto fail;
    double ret = 0;
    for (int t = 0; t < env->time_limit; t++) {
      if (lm_program_write(prog, "obs", obs, (size_t)env->obs_size) || lm_program_run(prog) ||
          lm_program_read(prog, "head", out, (size_t)n))
        goto fail;
      if (disc) {
        int best = 0;
        if (greedy)
          for (int k = 1; k < n; k++) best = out[k] > out[best] ? k : best;
        else {
          double mx = out[0], z = 0, u = rng_uniform(&rs), c = 0;
          for (int k = 1; k < n; k++) mx = out[k] > mx ? out[k] : mx;
          for (int k = 0; k < n; k++) z += exp(out[k] - mx);
          for (best = 0; best < n - 1; best++) {
            c += exp(out[best] - mx) / z;
            if (u < c) break;
          }
        }
        act[0] = lm_env_ref_action(env, (float)best, &last, env->sticky > 0 ? (float)rng_uniform(&rs) : 1.0f); /* --env's wrappers */
      } else {
        if (lm_program_read(prog, "pi.log_std", ls, (size_t)n)) goto fail;
        for (int k = 0; k < n; k++) {
          double z = sqrt(-2 * log(rng_uniform(&rs))) * cos(2 * M_PI * rng_uniform(&rs));
          act[k] = greedy ? out[k] : (float)(out[k] + exp(ls[k]) * z);
        }
      }
      int term = 0;
      if (gs) {
        float r, done;
        if (lm_env_stepper_step(gs, 1, state, act, next, obs, &r, &done) != LM_OK) goto fail;
        memcpy(state, next, (size_t)S * sizeof *state);
        ret += r;
        term = done != 0;
      } else {
        ret += env->ref_step(state, act, &term);
        env->ref_observe(state, obs);
      }
      if (term) break;
    }
    total += ret;
  }
  free(starts), free(state);
  (void)pol;
  *mean_out = total / episodes;
  return 1;
fail:
  free(starts), free(state);
  return 0;
}

int lm_cli_eval(int argc, char **argv) {
  const char *ckpt = NULL, *device = "auto";
  int episodes = 20;
  uint64_t seed = 12345;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      puts("usage: rltrain eval CKPT|RUN_DIR [--episodes N] [--seed S] [--device D]\n"
           "  mean return of the checkpoint's policy over N episodes (default 20), greedy (argmax or\n"
           "  mean action) and sampled, with the env stepped by its reference stepper");
      return 0;
    }
    if (argv[i][0] != '-' && !ckpt) ckpt = argv[i];
    else if (i + 1 < argc && !strcmp(argv[i], "--episodes")) {
      long long e;
      if (!lm_cli_int("--episodes", argv[++i], 1, 1000000, &e)) return LM_CLI_USAGE;
      episodes = (int)e;
    } else if (i + 1 < argc && !strcmp(argv[i], "--seed")) {
      if (!lm_cli_u64("--seed", argv[++i], &seed)) return LM_CLI_USAGE;
    } else if (i + 1 < argc && !strcmp(argv[i], "--device")) device = argv[++i];
    else {
      fprintf(stderr, "rltrain eval: unknown argument '%s' (see rltrain eval --help)\n", argv[i]);
      return 2;
    }
  }
  if (!ckpt || !*ckpt) {
    fprintf(stderr, "rltrain eval: which checkpoint? (rltrain eval CKPT)\n");
    return LM_CLI_USAGE;
  }
  char path[4200];
  struct stat sb;
  if (!stat(ckpt, &sb) && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/latest.ckpt", ckpt);
  else snprintf(path, sizeof path, "%s", ckpt);
  lm_ppo_config cfg;
  const lm_env_spec *env; /* by name, or from the plugin file the checkpoint names */
  if (lm_checkpoint_env(path, &env, &cfg) != LM_OK) {
    fprintf(stderr, "rltrain eval: %s\n", lm_last_error());
    return LM_CLI_USAGE; /* the input is missing, unreadable or for an env that cannot be found */
  }
  char why[1024];
  lm_backend_t *b = env ? lm_backend_open(device, why, sizeof why) : NULL;
  if (!b) {
    fprintf(stderr, "rltrain eval: %s\n", lm_last_error());
    return 1;
  }
  /* restore the weights through a trainer, then read them into a one-env policy program */
  lm_trainer *t = lm_trainer_new(b, env, &cfg);
  int rc = 1;
  lm_graph_t *g = lm_graph_new();
  lm_program_t *p = NULL;
  lm_env_stepper *gs = NULL; /* the env's graphs, when it has no reference stepper */
  lm_policy pol;
  if (!t || !g) goto done;
  lm_status lst = lm_trainer_load(t, path);
  if (lst != LM_OK) {
    rc = lm_cli_exit(lst);
    goto done;
  }
  lm_dim one = 1;
  lm_tensor obs = lm_input(g, "obs", LM_ROLE_DATA, 2, (lm_dim[]){one, env->obs_size});
  lm_policy_out po;
  if (lm_policy_build(g, &cfg.policy, env, &pol) || lm_policy_forward(&pol, obs, &po)) goto done;
  if (lm_output(env->action.kind == LM_SPACE_DISCRETE ? po.logits : po.mean, "head")) goto done;
  if (!(p = lm_program_new(b, g))) goto done;
  lm_program_t *src = lm_rollout_program(lm_trainer_rollout(t));
  if (cfg.stepper == LM_STEPPER_HOST) src = lm_rollout_policy_program(lm_trainer_rollout(t));
  for (int i = 0; i < pol.nparams; i++) {
    size_t n = lm_policy_param_size(&pol, i);
    float *buf = malloc(n * sizeof *buf);
    int fail = !buf || lm_program_read(src, pol.name[i], buf, n) || lm_program_write(p, pol.name[i], buf, n);
    free(buf);
    if (fail) goto done;
  }
  double greedy, sampled;
  if (!env->ref_step && !(gs = lm_env_stepper_new(env, b, (size_t)episodes))) goto done;
  if (!evaluate(env, gs, p, &pol, episodes, 1, seed, &greedy) || !evaluate(env, gs, p, &pol, episodes, 0, seed, &sampled))
    goto done;
  printf("%s: %d episodes on %s: greedy mean return %.2f, sampled mean return %.2f (threshold %g)\n", env->name,
         episodes, lm_backend_name(b), greedy, sampled, (double)env->solved_return);
  rc = 0;
done:
  if (rc) fprintf(stderr, "rltrain eval: %s\n", lm_last_error());
  lm_env_stepper_free(gs);
  lm_program_free(p);
  lm_graph_free(g);
  lm_trainer_free(t);
  lm_backend_free(b);
  return rc;
}
