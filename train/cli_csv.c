/* train/cli_csv.c — rltrain's reader of transitions files (cli_csv.h): split at commas, every
 * field a finite number, the flags 0 or 1, t a step count, a discrete action in range. Kept apart
 * from rltrain.c so tests/fuzz/fuzz_csv.c can link it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_csv.h"

void lm_cli_table_free(lm_cli_table *t) {
  if (t->names)
    for (size_t i = 0; i < t->cols; i++) free(t->names[i]);
  free(t->names);
  free(t->v);
  free(t->line);
  memset(t, 0, sizeof *t);
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
  return s;
}

/* Splits line in place at commas; returns the number of fields (at most cap are stored). */
static size_t split(char *line, char **fields, size_t cap) {
  size_t n = 0;
  for (char *p = line;; n++) {
    char *comma = strchr(p, ',');
    if (comma) *comma = 0;
    if (n < cap) fields[n] = trim(p);
    if (!comma) return n + 1;
    p = comma + 1;
  }
}

int lm_cli_table_read(const char *path, const lm_env_spec *e, lm_cli_table *t) {
  memset(t, 0, sizeof *t);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "rltrain: cannot read '%s': %s\n", path, strerror(errno));
    return 0;
  }
  int ok = lm_cli_table_parse(f, path, e, t, stderr);
  fclose(f);
  return ok;
}

int lm_cli_table_parse(FILE *f, const char *path, const lm_env_spec *e, lm_cli_table *t, FILE *err) {
  memset(t, 0, sizeof *t);
  int S = e->state_size, A = lm_env_action_size(e), O = e->obs_size;
  size_t want = (size_t)(2 + S + A + S + O + 3);
  char *line = NULL;
  size_t cap = 0, rowcap = 0;
  long lineno = 0;
  int ok = 1, have_header = 0;
  char **fields = malloc(want * sizeof *fields);
  if (!fields) ok = 0;
  while (ok && getline(&line, &cap, f) >= 0) {
    lineno++;
    char *l = trim(line);
    if (!*l) continue; /* blank lines are ignored */
    size_t n = split(l, fields, want);
    if (n != want) {
      fprintf(err,
              "rltrain: %s:%ld: %zu columns, but %s needs %zu: episode, t, %d state, %d action, %d next state, %d obs, "
              "reward, terminated, truncated\n",
              path, lineno, n, e->name, want, S, A, S, O);
      ok = 0;
      break;
    }
    if (!have_header) {
      if (strcmp(fields[0], "episode") != 0 || strcmp(fields[1], "t") != 0) {
        fprintf(err, "rltrain: %s:%ld: expected the header line 'episode,t,...', found '%s,%s,...'\n", path, lineno,
                fields[0], fields[1]);
        ok = 0;
        break;
      }
      t->names = calloc(want, sizeof *t->names);
      if (!t->names) {
        ok = 0;
        break;
      }
      t->cols = want;
      for (size_t i = 0; i < want; i++)
        if (!(t->names[i] = strdup(fields[i]))) ok = 0;
      have_header = 1;
      continue;
    }
    if (t->rows == rowcap) {
      rowcap = rowcap ? 2 * rowcap : 1024;
      double *v = realloc(t->v, rowcap * want * sizeof *v);
      long *ln = realloc(t->line, rowcap * sizeof *ln);
      if (v) t->v = v;
      if (ln) t->line = ln;
      if (!v || !ln) {
        fprintf(err, "rltrain: out of memory reading '%s'\n", path);
        ok = 0;
        break;
      }
    }
    double *row = t->v + t->rows * want;
    for (size_t i = 0; i < want && ok; i++) {
      char *end = NULL;
      errno = 0;
      row[i] = strtod(fields[i], &end);
      if (!*fields[i] || *end || !isfinite(row[i])) {
        fprintf(err, "rltrain: %s:%ld: column %zu (%s): '%s' is not a finite number\n", path, lineno, i + 1,
                t->names[i], fields[i]);
        ok = 0;
      }
    }
    if (!ok) break;
    size_t flags = want - 2;
    for (size_t i = flags; i < want && ok; i++)
      if (row[i] != 0 && row[i] != 1) {
        fprintf(err, "rltrain: %s:%ld: column %zu (%s) must be 0 or 1, found '%s'\n", path, lineno, i + 1,
                t->names[i], fields[i]);
        ok = 0;
      }
    if (ok && (row[1] < 0 || row[1] != floor(row[1]))) {
      fprintf(err, "rltrain: %s:%ld: t must be a step count (0, 1, ...), found '%s'\n", path, lineno, fields[1]);
      ok = 0;
    }
    if (ok && e->action.kind == LM_SPACE_DISCRETE) {
      double a = row[2 + S];
      if (a < 0 || a >= e->action.n || a != floor(a)) {
        fprintf(err, "rltrain: %s:%ld: action '%s' is not one of %s's %d actions (0..%d)\n", path, lineno,
                fields[2 + S], e->name, e->action.n, e->action.n - 1);
        ok = 0;
      }
    }
    if (ok) t->line[t->rows++] = lineno;
  }
  if (ok && ferror(f)) {
    fprintf(err, "rltrain: error reading '%s': %s\n", path, strerror(errno));
    ok = 0;
  }
  if (ok && !have_header) {
    fprintf(err, "rltrain: %s: empty file (expected a header line and transitions)\n", path);
    ok = 0;
  }
  if (ok && !t->rows) {
    fprintf(err, "rltrain: %s: no transitions after the header\n", path);
    ok = 0;
  }
  free(fields);
  free(line);
  if (!ok) lm_cli_table_free(t);
  return ok;
}
