/* train/cli.h — rltrain's subcommands. Each takes the arguments after its own name, prints
 * to stdout/stderr (the library never does) and returns the process exit code: 0 on
 * success, 1 on a failure of the work itself, 2 on bad usage. */
#ifndef LUMEN_CLI_H
#define LUMEN_CLI_H

int lm_cli_train(const char *env, int argc, char **argv);   /* rltrain ENV [options] */
int lm_cli_eval(int argc, char **argv);                     /* rltrain eval CKPT */
int lm_cli_compile(int argc, char **argv);                  /* rltrain compile ENV --target T */
int lm_cli_view(int argc, char **argv);                     /* rltrain view CKPT|ENV */
int lm_cli_plot(int argc, char **argv);                     /* rltrain plot RUN_DIR|LOG.csv */

#endif
