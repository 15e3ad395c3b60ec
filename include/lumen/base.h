/* lumen/base.h — status codes, the last-error message, version.
 * Library functions never print or exit: they return a status (or NULL / an invalid
 * handle) and leave a message naming the problem in lm_last_error(). */
#ifndef LUMEN_BASE_H
#define LUMEN_BASE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lm_status {
  LM_OK = 0,
  LM_ERR_INVALID,     /* bad argument or malformed graph */
  LM_ERR_NOMEM,       /* an allocation failed */
  LM_ERR_IO,          /* a file could not be read or written */
  LM_ERR_UNSUPPORTED, /* the backend or build lacks a capability */
  LM_ERR_BACKEND,     /* a device or driver call failed */
  LM_ERR_COMPILE,     /* a kernel failed to compile (message holds the log) */
  LM_ERR_CORRUPT,     /* a file failed its format or checksum check */
  LM_STATUS_COUNT
} lm_status;

/* The message of the most recent failure on this thread ("" if none). */
const char *lm_last_error(void);
const char *lm_status_name(lm_status s);
const char *lm_version(void);

#ifdef __cplusplus
}
#endif
#endif
