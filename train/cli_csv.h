/* train/cli_csv.h — transitions files (the format of shared/golden/) as rltrain check reads
 * them: a header line, then one row per step of episode, t, state, action, next state, obs,
 * reward, terminated, truncated. CLI code: errors are printed, "FILE:LINE: ...". */
#ifndef LUMEN_CLI_CSV_H
#define LUMEN_CLI_CSV_H

#include <stdio.h>

#include "lumen/env.h"

typedef struct lm_cli_table {
  size_t rows, cols;
  double *v;    /* rows x cols */
  long *line;   /* line number of each row */
  char **names; /* header */
} lm_cli_table;

/* Reads the transitions file at path for env e into t: 1, or 0 after printing why to stderr. */
int lm_cli_table_read(const char *path, const lm_env_spec *e, lm_cli_table *t);
/* The same from an open stream (named `path` in messages), printing to err: 1, or 0 with t empty. */
int lm_cli_table_parse(FILE *in, const char *path, const lm_env_spec *e, lm_cli_table *t, FILE *err);
void lm_cli_table_free(lm_cli_table *t);

#endif
