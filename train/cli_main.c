/* train/cli_main.c — rltrain's command line as a library function (lm_rltrain, lumen/lumen.h;
 * train/rltrain.c is its main): trains PPO on an env (train/cli_train.c), evaluates
 * checkpoints, lists the registered environments, checks an env's graph and reference stepper
 * against a transitions file (`check`), and records such a file from the reference stepper.
 * Exit codes (train/cli.h): 0 success, 1 the work failed (a check found errors over tolerance, a
 * device or a compile failed, a file could not be written), 2 bad input (an option or its value,
 * or an input file that is malformed, corrupt or for something else). */
#include <lumen/env.h>
#include <lumen/lumen.h>

#include "cli.h"
#include "cli_csv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_usage(FILE *out) {
  fputs("usage: rltrain COMMAND [ARGS]\n"
        "\n"
        "commands:\n"
        "  list [PLUGIN.c ...]       list the environments of this build (and of the env files\n"
        "                            given): observation size, action space and time limit\n"
        "  check ENV FILE.csv [--device ref|cpu|auto]\n"
        "                            replay every transition of FILE.csv, one step each, through\n"
        "                            ENV's graph (compiled on the device; default auto) and its\n"
        "                            scalar reference stepper; print the max absolute and relative\n"
        "                            error per column; exit 1 if any exceeds the tolerance\n"
        "  record ENV FILE.csv [--episodes K] [--seed S]\n"
        "                            write K episodes (default 10) of ENV's reference stepper under\n"
        "                            uniform random actions (seed S, default 0) to FILE.csv\n"
        "  ENV [options]             train PPO on ENV (rltrain ENV --help lists the options)\n"
        "\n"
        "Wherever a command takes ENV it also takes an env file: path/to/myenv.c (one C file ending\n"
        "with LM_ENV_PLUGIN(spec), compiled against lumen's headers and cached) or libmyenv.so.\n"
        "  eval CKPT [--episodes N]  mean return of a checkpoint's greedy and sampled policy\n"
        "  view CKPT|RUN_DIR|ENV [--headless --out FILE.png|DIR/]\n"
        "                            watch a policy in a window, or capture frames (view --help)\n"
        "  plot RUN_DIR|LOG.csv      learning curve -> RUN_DIR/curve.png\n"
        "  compile ENV --target cuda|opencl|metal|c [--arch sm_90]\n"
        "                            build every kernel of ENV's training iteration for a target\n"
        "                            (no device needed for cuda), with registers and spills\n"
        "  compile --passes          list the compiler's passes: dialects, precondition, switch\n"
        "  tune ENV [--budget S] [training options]\n"
        "                            search the schedules of ENV's training kernels (S seconds a\n"
        "                            program, default 60) into the tuning cache, which rltrain ENV\n"
        "                            then applies; times both schedules side by side (tune --help)\n"
        "  --version                 print the lumen version\n"
        "  help                      show this help (also -h, --help)\n"
        "\n"
        "Exit status: 0 success; 1 the work failed (a check over tolerance, a device or a compile\n"
        "failed, a file could not be written); 2 bad input: an unknown option, a value out of range\n"
        "or not a whole number where one is needed, an empty path, or an input file (checkpoint,\n"
        "transitions) that is malformed, corrupt or for another env.\n"
        "\n"
        "Transition files (the format of shared/golden/*.csv), one row per step:\n"
        "  episode,t,<state before>,<action>,<state after>,<obs after>,reward,terminated,truncated\n"
        "\n"
        "Tolerances of check (per env; docs/ENVS.md lists them): a state or obs column passes when\n"
        "every row has |got - want| <= atol + rtol * |want|, the reward when |got - want| <=\n"
        "reward_atol + reward_rtol * |want| (0 and 0 for envs with integer rewards: exact), and\n"
        "terminated must match on every row. truncated must follow the time limit: 1 exactly where\n"
        "t + 1 == limit and the step did not terminate. The relative error printed is\n"
        "|got - want| / max(|want|, 1e-3).\n",
        out);
}

/* ---------------------------------------------------------------- list */

static void space_text(const lm_space *s, char *buf, size_t cap) {
  if (s->kind == LM_SPACE_DISCRETE) {
    snprintf(buf, cap, "discrete(%d)", s->n);
    return;
  }
  size_t len = (size_t)snprintf(buf, cap, "box(%d) in ", s->n);
  for (int k = 0; k < s->n && len < cap; k++)
    len += (size_t)snprintf(buf + len, cap - len, "%s[%g, %g]", k ? " x " : "", (double)s->low[k], (double)s->high[k]);
}

static int cmd_list(void) {
  printf("%-24s %-26s %4s  %-28s %6s\n", "env", "gym id", "obs", "action", "limit");
  for (int i = 0; i < lm_env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    char act[160];
    space_text(&e->action, act, sizeof act);
    printf("%-24s %-26s %4d  %-28s %6d\n", e->name, e->gym_id ? e->gym_id : "-", e->obs_size, act, e->time_limit);
  }
  return 0;
}

/* ---------------------------------------------------------------- check */
/* (transitions files are read by train/cli_csv.c) */

typedef struct colerr {
  double abs, rel;  /* max |got - want|, max |got - want| / max(|want|, 1e-3) */
  size_t bad;       /* rows over tolerance */
  size_t worst_row; /* row of the worst excess over tolerance */
  double worst;     /* largest |got - want| - tolerance */
} colerr;

static void colerr_add(colerr *c, double got, double want, double rtol, double atol, size_t row) {
  double d = fabs(got - want);
  if (isnan(got)) d = INFINITY;
  double rel = d / fmax(fabs(want), 1e-3);
  if (d > c->abs) c->abs = d;
  if (rel > c->rel) c->rel = rel;
  double over = d - (atol + rtol * fabs(want));
  if (over > 0) {
    if (!c->bad || over > c->worst) c->worst = over, c->worst_row = row;
    c->bad++;
  }
}

/* Runs the env graph's step + observe for every row as one batch of N envs on b. */
static int graph_step(const lm_env_spec *e, lm_backend_t *b, const lm_cli_table *t, float *next, float *obs,
                      float *reward, float *term) {
  int S = e->state_size, A = lm_env_action_size(e);
  size_t N = t->rows;
  float *sv = malloc(N * (size_t)S * sizeof *sv), *av = malloc(N * (size_t)A * sizeof *av);
  int ok = sv && av;
  for (size_t r = 0; ok && r < N; r++) {
    const double *row = t->v + r * t->cols;
    for (int k = 0; k < S; k++) sv[r * (size_t)S + (size_t)k] = (float)row[2 + k];
    for (int k = 0; k < A; k++) av[r * (size_t)A + (size_t)k] = (float)row[2 + S + k];
  }
  if (!ok) fprintf(stderr, "rltrain: out of memory\n");
  else if (lm_env_step_batch(e, b, N, sv, av, next, obs, reward, term) != LM_OK) {
    fprintf(stderr, "rltrain: running %s's graph on %s failed: %s\n", e->name, lm_backend_name(b), lm_last_error());
    ok = 0;
  }
  free(sv);
  free(av);
  return ok;
}

/* The reset graph against ref_reset: 64 envs under two seeds and runs, bit for bit (the same
 * draws give the same states). Prints a line; 1 when they differ. */
static int check_resets(const lm_env_spec *e, const char *device) {
  enum { N = 64 };
  char why[512] = "";
  lm_backend_t *b = lm_backend_open(device, why, sizeof why);
  lm_env_stepper *st = b ? lm_env_stepper_new(e, b, N) : NULL;
  int bad = -1;
  size_t worst_env = 0;
  float *g = st ? malloc((size_t)N * (size_t)e->state_size * sizeof *g) : NULL;
  float *r = g ? malloc((size_t)e->state_size * sizeof *r) : NULL;
  if (r) {
    bad = 0;
    const uint64_t seeds[2][2] = {{0, 0}, {12345, 7}};
    for (int q = 0; q < 2 && bad >= 0; q++) {
      if (lm_env_stepper_reset(st, seeds[q][0], seeds[q][1], g) != LM_OK) {
        bad = -1;
        break;
      }
      for (size_t i = 0; i < N; i++) {
        e->ref_reset(r, seeds[q][0], i, seeds[q][1]);
        if (memcmp(r, g + i * (size_t)e->state_size, (size_t)e->state_size * sizeof *r) && !bad++) worst_env = i;
      }
    }
  }
  if (bad < 0) printf("%-14s cannot run the reset graph: %s  FAIL\n", "reset", lm_last_error());
  else if (bad) printf("%-14s graph and ref_reset differ on %d of %d envs (first: env %zu)  FAIL\n", "reset", bad, 2 * N,
                       worst_env);
  else printf("%-14s graph and ref_reset agree bit for bit on %d envs  ok\n", "reset", 2 * N);
  free(r);
  free(g);
  lm_env_stepper_free(st);
  lm_backend_free(b);
  return bad != 0;
}

static int cmd_check(const lm_env_spec *e, const char *path, const char *device) {
  char why[512] = "";
  lm_backend_t *b = lm_backend_open(device, why, sizeof why);
  if (!b) {
    fprintf(stderr, "rltrain: cannot open device '%s': %s\n", device, lm_last_error());
    return 2;
  }
  lm_cli_table t;
  if (!lm_cli_table_read(path, e, &t)) {
    lm_backend_free(b);
    return 2;
  }
  int S = e->state_size, A = lm_env_action_size(e), O = e->obs_size;
  size_t N = t.rows;
  size_t c_next = (size_t)(2 + S + A), c_obs = c_next + (size_t)S, c_rew = c_obs + (size_t)O;
  printf("rltrain check: %s (%s), %zu transitions from %s\n", e->name, e->gym_id ? e->gym_id : "no gym id", N, path);
  printf("graph on %s\n", why[0] ? why : lm_backend_name(b));
  float *next = malloc(N * (size_t)S * sizeof *next), *obs = malloc(N * (size_t)O * sizeof *obs);
  float *rew = malloc(N * sizeof *rew), *term = malloc(N * sizeof *term);
  int ran = next && obs && rew && term;
  if (!ran) fprintf(stderr, "rltrain: out of memory\n");
  else ran = graph_step(e, b, &t, next, obs, rew, term);
  lm_backend_free(b);
  if (!ran) {
    free(next), free(obs), free(rew), free(term), lm_cli_table_free(&t);
    return 2;
  }
  size_t ncheck = (size_t)(S + O + 1);
  colerr *gr = calloc(ncheck, sizeof *gr), *rf = calloc(ncheck, sizeof *rf);
  float *s = malloc((size_t)(S + A + O) * sizeof *s), *a = s ? s + S : NULL, *o = s ? a + A : NULL;
  size_t term_graph = 0, term_ref = 0, trunc_bad = 0, first_term_graph = 0, first_term_ref = 0, first_trunc = 0;
  size_t bad01 = 0, first_bad01 = 0; /* the graph's terminated must be exactly 0 or 1 */
  int has_ref = e->ref_step != NULL;
  for (size_t r = 0; gr && rf && s && r < N; r++) {
    const double *row = t.v + r * t.cols;
    for (int k = 0; k < S; k++) s[k] = (float)row[2 + k];
    for (int k = 0; k < A; k++) a[k] = (float)row[2 + S + k];
    int ref_term = 0;
    float ref_rew = 0;
    if (has_ref) {
      ref_rew = e->ref_step(s, a, &ref_term);
      e->ref_observe(s, o);
    } else { /* no reference stepper: its columns agree by construction (they are not printed) */
      for (int k = 0; k < S; k++) s[k] = (float)row[c_next + (size_t)k];
      for (int k = 0; k < O; k++) o[k] = (float)row[c_obs + (size_t)k];
      ref_rew = (float)row[c_rew];
      ref_term = row[c_rew + 1] != 0;
    }
    if (term[r] != 0 && term[r] != 1 && !bad01++) first_bad01 = r;
    for (int k = 0; k < S; k++) {
      double want = row[c_next + (size_t)k];
      colerr_add(&gr[k], next[r * (size_t)S + (size_t)k], want, e->check_rtol, e->check_atol, r);
      colerr_add(&rf[k], s[k], want, e->check_rtol, e->check_atol, r);
    }
    for (int k = 0; k < O; k++) {
      double want = row[c_obs + (size_t)k];
      colerr_add(&gr[S + k], obs[r * (size_t)O + (size_t)k], want, e->check_rtol, e->check_atol, r);
      colerr_add(&rf[S + k], o[k], want, e->check_rtol, e->check_atol, r);
    }
    double want_r = row[c_rew];
    colerr_add(&gr[S + O], rew[r], want_r, e->reward_rtol, e->reward_atol, r);
    colerr_add(&rf[S + O], ref_rew, want_r, e->reward_rtol, e->reward_atol, r);
    int file_term = row[c_rew + 1] != 0, file_trunc = row[c_rew + 2] != 0;
    if ((term[r] != 0) != file_term && !term_graph++) first_term_graph = r;
    if ((ref_term != 0) != file_term && !term_ref++) first_term_ref = r;
    int want_trunc = row[1] + 1 >= e->time_limit && !file_term;
    if (want_trunc != file_trunc && !trunc_bad++) first_trunc = r;
  }
  free(s);
  if (!gr || !rf || !s) {
    fprintf(stderr, "rltrain: out of memory\n");
    free(gr), free(rf), free(next), free(obs), free(rew), free(term), lm_cli_table_free(&t);
    return 2;
  }
  printf("tolerance: state and obs |got - want| <= %g + %g |want|; reward ", (double)e->check_atol,
         (double)e->check_rtol);
  if (e->reward_atol == 0 && e->reward_rtol == 0) printf("exact\n");
  else printf("|got - want| <= %g + %g |want|\n", (double)e->reward_atol, (double)e->reward_rtol);
  if (!has_ref) printf("%s has no reference stepper: the graph alone is checked against the file\n", e->name);
  printf("%-14s %12s %12s %12s %12s  %s\n", "column", "graph abs", "graph rel", "ref abs", "ref rel", "result");
  int fail = 0;
  for (size_t i = 0; i < ncheck; i++) {
    size_t col = i < (size_t)S ? c_next + i : i < (size_t)(S + O) ? c_obs + (i - (size_t)S) : c_rew;
    char res[256] = "ok";
    if (gr[i].bad || rf[i].bad) {
      fail = 1;
      const colerr *w = gr[i].bad ? &gr[i] : &rf[i];
      snprintf(res, sizeof res, "FAIL: graph %zu, ref %zu rows over; worst on line %ld (%s)", gr[i].bad, rf[i].bad,
               t.line[w->worst_row], gr[i].bad ? "graph" : "ref");
    }
    printf("%-14s %12.3e %12.3e %12.3e %12.3e  %s\n", t.names[col], gr[i].abs, gr[i].rel, rf[i].abs, rf[i].rel, res);
  }
  printf("%-14s graph differs on %zu rows, ref on %zu rows", t.names[c_rew + 1], term_graph, term_ref);
  if (term_graph) printf(" (first: graph on line %ld)", t.line[first_term_graph]);
  if (term_ref) printf(" (first: ref on line %ld)", t.line[first_term_ref]);
  printf("  %s\n", term_graph || term_ref ? "FAIL" : "ok");
  printf("%-14s ", t.names[c_rew + 2]);
  if (trunc_bad)
    printf("%zu rows disagree with the time limit %d (first on line %ld)  FAIL\n", trunc_bad, e->time_limit,
           t.line[first_trunc]);
  else printf("follows the time limit %d on every row  ok\n", e->time_limit);
  if (bad01)
    printf("%-14s the graph gave %g on line %ld (and %zu rows in all): terminated must be 0 or 1  FAIL\n",
           t.names[c_rew + 1], (double)term[first_bad01], t.line[first_bad01], bad01);
  int reset_bad = has_ref ? check_resets(e, device) : 0;
  fail |= term_graph || term_ref || trunc_bad || bad01 || reset_bad;
  printf("%s\n", fail ? "FAIL: errors over tolerance (see docs/ENVS.md for the tolerances)" : "PASS");
  free(gr), free(rf), free(next), free(obs), free(rew), free(term);
  lm_cli_table_free(&t);
  return fail ? 1 : 0;
}

/* ---------------------------------------------------------------- record */

static int cmd_record(const lm_env_spec *e, const char *path, long episodes, unsigned long long seed) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "rltrain: cannot write '%s': %s\n", path, strerror(errno));
    return 2;
  }
  int S = e->state_size, A = lm_env_action_size(e), O = e->obs_size;
  fprintf(f, "episode,t");
  for (int k = 0; k < S; k++) fprintf(f, ",s%d", k);
  for (int k = 0; k < A; k++) fprintf(f, ",a%d", k);
  for (int k = 0; k < S; k++) fprintf(f, ",next_s%d", k);
  for (int k = 0; k < O; k++) fprintf(f, ",obs%d", k);
  fprintf(f, ",reward,terminated,truncated\n");
  size_t rows = 0;
  /* an env without a reference stepper is recorded from its graphs (on the ref backend) */
  lm_backend_t *gb = NULL;
  lm_env_stepper *gs = NULL;
  float *starts = NULL;
  if (!e->ref_step) {
    char why[256];
    gb = lm_backend_open("ref", why, sizeof why);
    gs = gb ? lm_env_stepper_new(e, gb, (size_t)episodes) : NULL;
    starts = gs ? malloc((size_t)episodes * (size_t)S * sizeof *starts) : NULL;
    if (!starts || lm_env_stepper_reset(gs, seed, 0, starts) != LM_OK) {
      fprintf(stderr, "rltrain: %s has no reference stepper, and its graphs cannot run: %s\n", e->name, lm_last_error());
      free(starts), lm_env_stepper_free(gs), lm_backend_free(gb), fclose(f);
      return 1;
    }
  }
  float *s = malloc((size_t)(2 * S + A + O) * sizeof *s), *a = s ? s + S : NULL, *o = s ? a + A : NULL;
  float *next = s ? o + O : NULL;
  if (!s) {
    fprintf(stderr, "rltrain: out of memory\n");
    free(starts), lm_env_stepper_free(gs), lm_backend_free(gb), fclose(f);
    return 1;
  }
  for (long ep = 0; ep < episodes; ep++) {
    if (gs) memcpy(s, starts + (size_t)ep * (size_t)S, (size_t)S * sizeof *s);
    else e->ref_reset(s, seed, (uint64_t)ep, 0);
    for (int t = 0; t < e->time_limit; t++) {
      lm_env_ref_random_action(e, seed, (uint64_t)ep, (uint64_t)t, a);
      fprintf(f, "%ld,%d", ep, t);
      for (int k = 0; k < S; k++) fprintf(f, ",%.17g", (double)s[k]);
      for (int k = 0; k < A; k++) fprintf(f, ",%.17g", (double)a[k]);
      int term = 0;
      float r;
      if (gs) {
        float done;
        if (lm_env_stepper_step(gs, 1, s, a, next, o, &r, &done) != LM_OK) {
          fprintf(stderr, "rltrain: %s: %s\n", e->name, lm_last_error());
          free(s), free(starts), lm_env_stepper_free(gs), lm_backend_free(gb), fclose(f);
          return 1;
        }
        memcpy(s, next, (size_t)S * sizeof *s);
        term = done != 0;
      } else {
        r = e->ref_step(s, a, &term);
        e->ref_observe(s, o);
      }
      int trunc = !term && t + 1 >= e->time_limit;
      for (int k = 0; k < S; k++) fprintf(f, ",%.17g", (double)s[k]);
      for (int k = 0; k < O; k++) fprintf(f, ",%.17g", (double)o[k]);
      fprintf(f, ",%.17g,%d,%d\n", (double)r, term, trunc);
      rows++;
      if (term || trunc) break;
    }
  }
  free(s);
  free(starts);
  lm_env_stepper_free(gs);
  lm_backend_free(gb);
  if (ferror(f) | (fclose(f) != 0)) {
    fprintf(stderr, "rltrain: error writing '%s': %s\n", path, strerror(errno));
    return 1;
  }
  printf("rltrain record: %zu transitions of %ld %s episodes (seed %llu) written to %s\n", rows, episodes, e->name,
         seed, path);
  return 0;
}

/* ---------------------------------------------------------------- main */

/* An env by name, or from a plugin file (path/to/myenv.c or libmyenv.so: compiled or loaded). */
static const lm_env_spec *find_env(const char *name) {
  const lm_env_spec *e = NULL;
  if (lm_env_resolve(name, &e) != LM_OK) {
    fprintf(stderr, "rltrain: %s%s\n", lm_last_error(), lm_env_is_path(name) ? "" : " (see 'rltrain list')");
    return NULL;
  }
  return e;
}

int lm_rltrain(int argc, char **argv) {
  if (argc < 2 || !argv) {
    print_usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help") || !strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
    print_usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "--version")) {
    printf("lumen %s\n", lm_version());
    return 0;
  }
  if (!strcmp(cmd, "list")) { /* rltrain list [PLUGIN...]: the plugins join the list */
    for (int i = 2; i < argc; i++) {
      if (!lm_env_is_path(argv[i])) {
        fprintf(stderr, "rltrain: 'list' takes env files (path/to/myenv.c or .so), got '%s' (see 'rltrain help')\n",
                argv[i]);
        return 2;
      }
      if (!find_env(argv[i])) return 2;
    }
    return cmd_list();
  }
  if (!strcmp(cmd, "check") || !strcmp(cmd, "record")) {
    int check = !strcmp(cmd, "check");
    const char *pos[2] = {NULL, NULL};
    const char *device = "auto";
    long long episodes = 10;
    uint64_t seed = 0;
    int npos = 0;
    for (int i = 2; i < argc; i++) {
      const char *a = argv[i];
      const char *val = i + 1 < argc ? argv[i + 1] : NULL;
      if (check && !strcmp(a, "--device")) {
        if (!val) return fprintf(stderr, "rltrain: --device needs a value (ref, cpu or auto)\n"), 2;
        device = val, i++;
      } else if (!check && !strcmp(a, "--episodes")) {
        if (!val) return fprintf(stderr, "rltrain: --episodes needs a value\n"), 2;
        if (!lm_cli_int("--episodes", val, 1, 100000000, &episodes)) return 2;
        i++;
      } else if (!check && !strcmp(a, "--seed")) {
        if (!val) return fprintf(stderr, "rltrain: --seed needs a value\n"), 2;
        if (!lm_cli_u64("--seed", val, &seed)) return 2;
        i++;
      } else if (a[0] == '-' && a[1]) {
        fprintf(stderr, "rltrain: unknown option '%s' for '%s' (see 'rltrain help')\n", a, cmd);
        return 2;
      } else if (npos < 2) {
        pos[npos++] = a;
      } else {
        fprintf(stderr, "rltrain: '%s' takes ENV and FILE.csv, got also '%s' (see 'rltrain help')\n", cmd, a);
        return 2;
      }
    }
    if (npos < 2) {
      fprintf(stderr, "rltrain: usage: rltrain %s ENV FILE.csv %s\n", cmd,
              check ? "[--device ref|cpu|auto]" : "[--episodes K] [--seed S]");
      return 2;
    }
    const lm_env_spec *e = find_env(pos[0]);
    if (!e) return 2;
    if (!lm_cli_path("FILE.csv", pos[1])) return 2;
    return check ? cmd_check(e, pos[1], device) : cmd_record(e, pos[1], (long)episodes, (unsigned long long)seed);
  }
  if (cmd[0] == '-') {
    fprintf(stderr, "rltrain: unknown option '%s' (see 'rltrain help')\n", cmd);
    return 2;
  }
  if (!strcmp(cmd, "eval")) return lm_cli_eval(argc - 2, argv + 2);
  if (!strcmp(cmd, "view")) return lm_cli_view(argc - 2, argv + 2);
  if (!strcmp(cmd, "compile")) return lm_cli_compile(argc - 2, argv + 2);
  if (!strcmp(cmd, "plot")) return lm_cli_plot(argc - 2, argv + 2);
  if (!strcmp(cmd, "tune")) return lm_cli_tune(argc - 2, argv + 2);
  const lm_env_spec *e = find_env(cmd);
  if (!e) return 2;
  return lm_cli_train(e->name, argc - 2, argv + 2);
}
