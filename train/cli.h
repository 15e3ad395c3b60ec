/* train/cli.h — rltrain's subcommands (in the library, behind lm_rltrain: the one part of it that
 * prints, being the command line). Each takes the arguments after its own name, prints
 * to stdout/stderr (the rest of the library never does) and returns the exit code: 0 on
 * success, LM_CLI_FAILED (1) on a failure of the work itself (a device, a compile, a check over
 * tolerance, a file that cannot be written), LM_CLI_USAGE (2) on bad input: an option, a value,
 * or an input file that is malformed, corrupt or does not fit. */
#ifndef LUMEN_CLI_H
#define LUMEN_CLI_H

#include <stdint.h>

#include "lumen/base.h"

enum { LM_CLI_FAILED = 1, LM_CLI_USAGE = 2 };

int lm_cli_train(const char *env, int argc, char **argv);   /* rltrain ENV [options] */
int lm_cli_eval(int argc, char **argv);                     /* rltrain eval CKPT */
int lm_cli_compile(int argc, char **argv);                  /* rltrain compile ENV --target T */
int lm_cli_view(int argc, char **argv);                     /* rltrain view CKPT|ENV */
int lm_cli_plot(int argc, char **argv);                     /* rltrain plot RUN_DIR|LOG.csv */
int lm_cli_tune(int argc, char **argv);                     /* rltrain tune ENV [--budget S] */


/* Option values (train/cli_args.c): 1 and *out set, or 0 after printing what `opt` wants. */
int lm_cli_int(const char *opt, const char *text, long long lo, long long hi, long long *out);
int lm_cli_u64(const char *opt, const char *text, uint64_t *out);
int lm_cli_real(const char *opt, const char *text, double lo, double hi, double *out);
/* A PPO setting by its checkpoint name, in lm_ppo_limit's range (an integer where it is one). */
int lm_cli_setting(const char *opt, const char *key, const char *text, double *out);
int lm_cli_path(const char *opt, const char *text); /* not empty */
/* The exit code for a library failure: LM_CLI_USAGE for LM_ERR_INVALID and LM_ERR_CORRUPT (the
 * input was wrong), LM_CLI_FAILED otherwise. */
int lm_cli_exit(lm_status st);

#endif
