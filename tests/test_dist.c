/* tests/test_dist.c — data parallelism without a launcher: a rollout that is part of a larger
 * batch collects exactly the rows of the whole batch's rollout (every random stream keyed by the
 * global env index: resets, actions, sticky actions; device and host steppers), rltrain outside
 * mpirun is the one-process trainer, and the MPI and NCCL loaders say what is missing. The runs
 * under mpirun are tests/mpi/ (cmake/mpi.cmake). */
#define _DEFAULT_SOURCE
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lumen/lumen.h"
#include "support/check.h"

#define RLTRAIN LUMEN_BINARY_DIR "/rltrain"

static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"};

static void no_launcher(void) {
  for (size_t i = 0; i < sizeof launcher_vars / sizeof *launcher_vars; i++) unsetenv(launcher_vars[i]);
}

static lm_backend_t *cpu(void) {
  lm_backend_t *b = lm_backend_new("cpu");
  cr_assert(b, "cpu backend: %s", lm_last_error());
  return b;
}

/* The trajectory and env state of a rollout after `runs` runs, as one array per name. */
static const char *const traj[] = {"obs", "action", "logp", "value", "reward", "terminated", "truncated", "final_obs"};
enum { NTRAJ = sizeof traj / sizeof *traj };

static lm_rollout *make(lm_backend_t *b, const lm_env_spec *env, const lm_policy_config *pc, int64_t n, int64_t T,
                        lm_stepper stepper, int64_t first, int64_t all) {
  lm_rollout *r = lm_rollout_new_part(b, env, pc, n, T, stepper, first, all);
  cr_assert(r, "rollout %lld of %lld from %lld: %s", (long long)n, (long long)all, (long long)first, lm_last_error());
  /* the same weights in every rollout: the policy's orthogonal init from one seed */
  lm_program_t *p = stepper == LM_STEPPER_HOST ? lm_rollout_policy_program(r) : lm_rollout_program(r);
  cr_assert_eq(lm_policy_init(lm_rollout_policy(r), p, 7), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_rollout_reset(r, 1234), LM_OK, "%s", lm_last_error());
  for (int k = 0; k < 3; k++) cr_assert_eq(lm_rollout_run(r), LM_OK, "%s", lm_last_error());
  return r;
}

/* Rows [first, first + n) of the whole batch's [T, all, w] array equal the part's [T, n, w]. */
/* tol 0: bit for bit; else a relative tolerance. */
static void same_rows(lm_rollout *whole, lm_rollout *part, const char *name, int64_t T, int64_t all, int64_t first,
                      int64_t n, int per_step, double tol) {
  size_t cw = 0, cp = 0;
  lm_program_t *pw = lm_rollout_program(whole), *pp = lm_rollout_program(part);
  cr_assert_eq(lm_program_numel(pw, name, &cw), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_numel(pp, name, &cp), LM_OK, "%s", lm_last_error());
  size_t steps = per_step ? (size_t)T : 1, w = cw / steps / (size_t)all;
  cr_assert_eq(cp, steps * (size_t)n * w, "%s: %zu elements in the part", name, cp);
  float *a = check_floats(cw), *p = check_floats(cp);
  check_poison(a, cw);
  check_poison(p, cp);
  cr_assert_eq(lm_program_read(pw, name, a, cw), LM_OK, "%s", lm_last_error());
  cr_assert_eq(lm_program_read(pp, name, p, cp), LM_OK, "%s", lm_last_error());
  for (size_t t = 0; t < steps; t++) {
    char what[96];
    snprintf(what, sizeof what, "%s, step %zu, envs %lld..", name, t, (long long)first);
    const float *got = p + t * (size_t)n * w, *want = a + (t * (size_t)all + (size_t)first) * w;
    if (tol == 0) check_same_bits(what, got, want, (size_t)n * w);
    else
      for (size_t i = 0; i < (size_t)n * w; i++) {
        double d = fabs((double)got[i] - want[i]), m = fabs((double)want[i]) > 1 ? fabs((double)want[i]) : 1;
        cr_assert(d <= tol * m, "%s: element %zu is %a, the whole batch's %a (tolerance %g)", what, i, (double)got[i],
                  (double)want[i], tol);
      }
  }
  free(a);
  free(p);
}

static void parts_of_equal_whole(const char *env_name, const char *params, lm_stepper stepper, double tol, int64_t all,
                                 int64_t n) {
  const lm_env_spec *env = lm_env_find(env_name);
  cr_assert(env);
  if (params) cr_assert_eq(lm_env_configure(env, params, &env), LM_OK, "%s", lm_last_error());
  lm_ppo_config c = lm_ppo_defaults(env);
  lm_backend_t *b = cpu();
  const int64_t T = 24;
  lm_rollout *whole = make(b, env, &c.policy, all, T, stepper, 0, all);
  double ew = 0, rw = 0, lw = 0, eparts = 0, rparts = 0, lparts = 0;
  for (int64_t first = 0; first < all; first += n) {
    lm_rollout *part = make(b, env, &c.policy, n, T, stepper, first, all);
    for (int i = 0; i < NTRAJ - 1; i++) same_rows(whole, part, traj[i], T, all, first, n, 1, tol);
    same_rows(whole, part, lm_rollout_final_obs_name(env, T), T, all, first, n, !lm_rollout_truncates_once(env, T), tol);
    if (stepper == LM_STEPPER_DEVICE) same_rows(whole, part, "env.state", T, all, first, n, 0, tol);
    double e, r, l;
    cr_assert_eq(lm_rollout_take_sums(part, &e, &r, &l), LM_OK, "%s", lm_last_error());
    eparts += e, rparts += r, lparts += l;
    lm_rollout_free(part);
  }
  cr_assert_eq(lm_rollout_take_sums(whole, &ew, &rw, &lw), LM_OK, "%s", lm_last_error());
  cr_assert(ew > 0, "%s: no episode ended in %lld steps of %lld envs", env_name, (long long)(3 * T), (long long)all);
  cr_assert(eparts == ew && rparts == rw && lparts == lw, "%s: episodes %g/%g, returns %g/%g, lengths %g/%g", env_name,
            eparts, ew, rparts, rw, lparts, lw);
  lm_rollout_free(whole);
  lm_backend_free(b);
}

static void parts_equal_whole(const char *env_name, const char *params, lm_stepper stepper, double tol) {
  parts_of_equal_whole(env_name, params, stepper, tol, 12, 4);
}

Test(dist, a_device_rollout_part_draws_the_rows_of_the_whole_batch) {
  parts_equal_whole("cartpole", NULL, LM_STEPPER_DEVICE, 0);
}

/* A batch of 4 envs runs one env at a time on the cpu (compiler/backends/cpu.c, SINGLE_ENVS),
 * and so do its parts of 2, bit for bit (a part of 4 of 12 runs the blocks, as the 12 do). */
Test(dist, parts_of_a_small_batch_run_the_form_the_whole_batch_runs) {
  parts_of_equal_whole("cartpole", NULL, LM_STEPPER_DEVICE, 0, 4, 2);
}

Test(dist, the_part_keys_sticky_actions_by_the_global_env_too) {
  parts_equal_whole("cartpole", "sticky=0.25", LM_STEPPER_DEVICE, 0);
}

/* Not bit for bit: the cpu backend's pendulum kernels for 12 envs and for 4 round a sine or cosine
 * 1 ulp apart (two one-process runs of 12 and 4 envs differ so too); a stream keyed wrongly would
 * give other states and actions altogether. */
Test(dist, a_gaussian_policy_part_samples_the_rows_of_the_whole_batch) {
  parts_equal_whole("pendulum", "time_limit=20", LM_STEPPER_DEVICE, 1e-4);
}

Test(dist, a_host_stepped_part_resets_and_samples_the_rows_of_the_whole_batch) {
  parts_equal_whole("cartpole", "sticky=0.25", LM_STEPPER_HOST, 0);
}

Test(dist, a_part_outside_its_batch_is_refused_naming_the_envs) {
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_ppo_config c = lm_ppo_defaults(env);
  lm_backend_t *b = cpu();
  cr_assert_null(lm_rollout_new_part(b, env, &c.policy, 4, 8, LM_STEPPER_DEVICE, 6, 8));
  cr_assert(strstr(lm_last_error(), "envs 6 .. 9 are not within a batch of 8 envs"), "%s", lm_last_error());
  lm_backend_free(b);
}

Test(dist, only_a_launcher_makes_a_process_a_rank) {
  no_launcher();
  cr_assert_eq(lm_dist_launched(), 0);
  for (size_t i = 0; i < sizeof launcher_vars / sizeof *launcher_vars; i++) {
    setenv(launcher_vars[i], "2", 1);
    cr_assert_eq(lm_dist_launched(), 1, "%s", launcher_vars[i]);
    unsetenv(launcher_vars[i]);
  }
}

Test(dist, a_missing_mpi_library_is_named) {
  setenv("LUMEN_MPI_LIB", "/nonexistent/libmpi.so.40", 1);
  cr_assert_null(lm_dist_open(10));
  cr_assert(strstr(lm_last_error(), "no MPI library loads") && strstr(lm_last_error(), "/nonexistent/libmpi.so.40"),
            "%s", lm_last_error());
  setenv("LUMEN_MPI_LIB", "libm.so.6", 1); /* loads, and is no MPI */
  cr_assert_null(lm_dist_open(10));
  cr_assert(strstr(lm_last_error(), "libm.so.6 lacks MPI_"), "%s", lm_last_error());
  cr_assert_null(lm_dist_open(0));
  cr_assert(strstr(lm_last_error(), "timeout must be > 0"), "%s", lm_last_error());
}

Test(dist, nccl_needs_mpi_to_bootstrap) {
  cr_assert_null(lm_nccl_open(NULL, 0));
  cr_assert(strstr(lm_last_error(), "needs MPI"), "%s", lm_last_error());
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  s[n] = 0;
  *len = (size_t)n;
  return s;
}

Test(dist, rltrain_outside_mpirun_is_the_one_process_trainer_and_says_nothing_of_mpi) {
  no_launcher();
  char dir[] = "/tmp/lumen-dist-XXXXXX";
  cr_assert(mkdtemp(dir));
  char cmd[1024], out[600], ck[600];
  snprintf(out, sizeof out, "%s/out.txt", dir);
  snprintf(cmd, sizeof cmd,
           "LUMEN_THREADS=1 " RLTRAIN " cartpole --envs 8 --steps 32 --minibatches 2 --epochs 2 --total-steps 768 "
           "--out %s/run --quiet --dist-timeout 5 > %s 2>&1",
           dir, out);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  size_t n;
  char *text = slurp(out, &n);
  cr_assert(!strstr(text, "rank") && !strstr(text, "MPI") && !strstr(text, "mpi"), "rltrain said: %s", text);
  free(text);
  /* the same three iterations through the library's one-process trainer */
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_ppo_config c = lm_ppo_defaults(env);
  c.n_envs = 8, c.horizon = 32, c.minibatches = 2, c.epochs = 2, c.total_steps = 768;
  lm_backend_t *b = cpu();
  lm_trainer *t = lm_trainer_new(b, env, &c);
  cr_assert(t, "%s", lm_last_error());
  lm_iter_stats s;
  for (int i = 0; i < 3; i++) cr_assert_eq(lm_trainer_iterate(t, &s), LM_OK, "%s", lm_last_error());
  snprintf(ck, sizeof ck, "%s/lib.ckpt", dir);
  cr_assert_eq(lm_trainer_save(t, ck), LM_OK, "%s", lm_last_error());
  size_t na, nb;
  snprintf(out, sizeof out, "%s/run/latest.ckpt", dir);
  char *a = slurp(out, &na), *bb = slurp(ck, &nb);
  cr_assert(na == nb && !memcmp(a, bb, na), "rltrain's checkpoint (%zu bytes) differs from the trainer's (%zu)", na, nb);
  free(a), free(bb);
  lm_trainer_free(t);
  lm_backend_free(b);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

Test(dist, a_bad_collective_timeout_is_refused_naming_the_option) {
  no_launcher();
  char cmd[512];
  snprintf(cmd, sizeof cmd, RLTRAIN " cartpole --dist-timeout -1 --total-steps 64 --out /tmp/lumen-dist-never > /dev/null 2>&1");
  int rc = system(cmd);
  cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "exit status %d", rc);
}
