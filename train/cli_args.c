/* train/cli_args.c — rltrain's option values, parsed strictly: an integer is an integer (no
 * fraction, no hex, no trailing text, no silent wrap), a seed is a whole uint64, a number is
 * finite and in its range, a path is not empty. Every refusal names the option and what it wants,
 * and every bad input exits with LM_CLI_USAGE (2). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "compiler/core.h"
#include "lumen/train.h"

int lm_cli_int(const char *opt, const char *text, long long lo, long long hi, long long *out) {
  if (lm_parse_i64(text, lo, hi, out)) return 1;
  fprintf(stderr, "rltrain: %s needs a whole number in %lld..%lld, got '%s'\n", opt, lo, hi, text ? text : "");
  return 0;
}

int lm_cli_u64(const char *opt, const char *text, uint64_t *out) {
  if (lm_parse_u64(text, out)) return 1;
  fprintf(stderr, "rltrain: %s needs a whole number in 0..18446744073709551615, got '%s'\n", opt, text ? text : "");
  return 0;
}

int lm_cli_real(const char *opt, const char *text, double lo, double hi, double *out) {
  double v;
  if (lm_parse_real(text, &v) && v >= lo && v <= hi) {
    *out = v;
    return 1;
  }
  fprintf(stderr, "rltrain: %s needs a number in [%g, %g], got '%s'\n", opt, lo, hi, text ? text : "");
  return 0;
}

int lm_cli_setting(const char *opt, const char *key, const char *text, double *out) {
  double lo, hi;
  int kind = lm_ppo_limit(key, &lo, &hi);
  LM_ASSERT(kind);
  if (kind == 1) return lm_cli_real(opt, text, lo, hi, out);
  long long v;
  if (!lm_cli_int(opt, text, (long long)lo, (long long)hi, &v)) return 0;
  *out = (double)v;
  return 1;
}

int lm_cli_path(const char *opt, const char *text) {
  if (text && *text) return 1;
  fprintf(stderr, "rltrain: %s needs a path, got an empty one\n", opt);
  return 0;
}

int lm_cli_exit(lm_status st) {
  if (st == LM_OK) return 0;
  return st == LM_ERR_INVALID || st == LM_ERR_CORRUPT ? LM_CLI_USAGE : LM_CLI_FAILED;
}
