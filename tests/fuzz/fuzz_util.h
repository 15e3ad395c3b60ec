/* tests/fuzz/fuzz_util.h — what the libFuzzer harnesses share: a private folder made once per
 * process (mode 0700, under $TMPDIR; removed at a normal exit) and files in it rewritten with
 * each input, for readers that take a path. Header-only: each harness is one executable. */
#ifndef LUMEN_FUZZ_UTIL_H
#define LUMEN_FUZZ_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { FZ_MAX_FILES = 8 };
static char fz_dir[512];
static char fz_files[FZ_MAX_FILES][600];
static int fz_nfiles;

/* Setup failures are the harness's own: say why and stop (libFuzzer reports the abort). */
static inline void fz_die(const char *what, const char *why) {
  fprintf(stderr, "fuzz harness setup: %s: %s\n", what, why ? why : "(no message)");
  abort();
}

static inline void fz_cleanup(void) {
  for (int i = 0; i < fz_nfiles; i++) unlink(fz_files[i]);
  if (fz_dir[0]) rmdir(fz_dir);
}

/* The folder, made on the first call. */
static inline const char *fz_dir_get(void) {
  if (fz_dir[0]) return fz_dir;
  const char *tmp = getenv("TMPDIR"); /* else memory (/dev/shm): ext4 flushes a file rewritten in place */
  if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(fz_dir, sizeof fz_dir, "%s/lumen-fuzz-XXXXXX", tmp);
  if (!mkdtemp(fz_dir)) fz_die("mkdtemp", strerror(errno));
  if (chmod(fz_dir, 0700) != 0) fz_die("chmod", strerror(errno));
  atexit(fz_cleanup);
  return fz_dir;
}

/* dir/name, remembered for removal at exit. */
static inline const char *fz_path(const char *name) {
  if (fz_nfiles == FZ_MAX_FILES) fz_die("fz_path", "too many files");
  char *p = fz_files[fz_nfiles++];
  snprintf(p, sizeof fz_files[0], "%s/%s", fz_dir_get(), name);
  return p;
}

/* Replaces the contents of path with data (mode 0600): written over, then cut to size (no
 * O_TRUNC, whose truncation to zero makes ext4 flush the file at close). */
static inline void fz_write(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) fz_die(path, strerror(errno));
  const unsigned char *p = data;
  size_t left = n;
  off_t at = 0;
  while (left) {
    ssize_t w = pwrite(fd, p, left, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fz_die(path, strerror(errno));
    p += w, at += w;
    left -= (size_t)w;
  }
  if (ftruncate(fd, (off_t)n) != 0 || close(fd) != 0) fz_die(path, strerror(errno));
}

#endif
