/* tests/fuzz/fuzz_csv.c — libFuzzer target for transitions files (train/cli_csv.c, what
 * `rltrain check` reads): each input is parsed for every registered env (most refuse it at the
 * header's column count), messages going to /dev/null. A table that is accepted must hold what
 * the reader promises: the env's column count, rows with line numbers, every value finite, the
 * flags 0 or 1, t a whole step count, a discrete action in range. */
#define _GNU_SOURCE /* fmemopen on older C libraries */
#include "fuzz_util.h"

#include <math.h>

#include "cli_csv.h"
#include "lumen/lumen.h"

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (!(devnull = fopen("/dev/null", "w"))) fz_die("/dev/null", strerror(errno));
  return 0;
}

static void broken(const lm_env_spec *e, const char *what, size_t row) {
  fprintf(stderr, "fuzz_csv: %s accepted a table whose row %zu %s\n", e->name, row, what);
  abort();
}

static void check_table(const lm_env_spec *e, const lm_cli_table *t) {
  int S = e->state_size, A = lm_env_action_size(e), O = e->obs_size;
  size_t want = (size_t)(2 + S + A + S + O + 3);
  if (t->cols != want || !t->rows || !t->names) broken(e, "(none: the shape is wrong)", 0);
  for (size_t r = 0; r < t->rows; r++) {
    const double *v = t->v + r * want;
    if (t->line[r] < 2 || (r && t->line[r] <= t->line[r - 1])) broken(e, "has a bad line number", r);
    for (size_t i = 0; i < want; i++)
      if (!isfinite(v[i])) broken(e, "holds a non-finite value", r);
    for (size_t i = want - 2; i < want; i++)
      if (v[i] != 0 && v[i] != 1) broken(e, "has a flag that is not 0 or 1", r);
    if (v[1] < 0 || v[1] != floor(v[1])) broken(e, "has a t that is not a step count", r);
    if (e->action.kind == LM_SPACE_DISCRETE) {
      double a = v[2 + S];
      if (a < 0 || a >= e->action.n || a != floor(a)) broken(e, "has an action out of range", r);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0; /* fmemopen refuses an empty buffer on some C libraries */
  for (int i = 0; i < lm_env_count(); i++) {
    const lm_env_spec *e = lm_env_at(i);
    FILE *f = fmemopen((void *)(uintptr_t)data, size, "r");
    if (!f) return 0;
    lm_cli_table t;
    if (lm_cli_table_parse(f, "fuzz.csv", e, &t, devnull)) {
      check_table(e, &t);
      lm_cli_table_free(&t);
    }
    fclose(f);
  }
  return 0;
}
