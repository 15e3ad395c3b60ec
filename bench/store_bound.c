/* bench/store_bound.c — how many env steps per second a machine can hand out observations at
 * all: T threads store N x F floats a step into one buffer (a vec env's own), a barrier between
 * steps, and nothing else. An upper bound for any vec env that returns float observations of F
 * values per env (MinAtar: 400), whatever computes them; bench/py_vec_bench.py prints it beside
 * lumen's and gymnax's rates.
 *
 *   build/store_bound [N [F [T [STEPS]]]]    (defaults 4096 400 2 400; prints one line of JSON)
 *
 * The best of 5 runs of STEPS steps counts (a count, not a time, bounds the work). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_THREADS = 64, RUNS = 5 };

typedef struct job {
  float *part;
  size_t n;
  long steps;
  pthread_barrier_t *bar;
} job;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *fill(void *arg) {
  const job *j = arg;
  for (long s = 0; s < j->steps; s++) { /* memset: the C library's fastest stores, whatever the flags */
    memset(j->part, (int)(s & 0x7f), j->n * sizeof *j->part);
    pthread_barrier_wait(j->bar);
  }
  return NULL;
}

static long arg(int argc, char **argv, int i, long def, long lo, long hi) {
  if (argc <= i) return def;
  char *end;
  long v = strtol(argv[i], &end, 10);
  if (*end || v < lo || v > hi) {
    fprintf(stderr, "store_bound: argument %d is '%s', expected a whole number in %ld .. %ld\n", i, argv[i], lo, hi);
    exit(2);
  }
  return v;
}

int main(int argc, char **argv) {
  const long n = arg(argc, argv, 1, 4096, 1, 1L << 24), f = arg(argc, argv, 2, 400, 1, 1L << 16);
  const long threads = arg(argc, argv, 3, 2, 1, MAX_THREADS), steps = arg(argc, argv, 4, 400, 1, 1L << 20);
  const size_t total = (size_t)n * (size_t)f;
  float *buf = malloc(total * sizeof *buf);
  if (!buf) {
    fprintf(stderr, "store_bound: out of memory for %zu floats\n", total);
    return 1;
  }
  memset(buf, 0, total * sizeof *buf); /* first touch outside the timing */
  job jobs[MAX_THREADS];
  pthread_t tid[MAX_THREADS];
  double best = 1e30;
  for (int r = 0; r < RUNS; r++) {
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (long t = 0; t < threads; t++) {
      size_t lo = total * (size_t)t / (size_t)threads, hi = total * (size_t)(t + 1) / (size_t)threads;
      jobs[t] = (job){buf + lo, hi - lo, steps, &bar};
    }
    double t0 = now();
    for (long t = 1; t < threads; t++)
      if (pthread_create(&tid[t], NULL, fill, &jobs[t])) {
        fprintf(stderr, "store_bound: cannot start thread %ld\n", t);
        return 1;
      }
    fill(&jobs[0]);
    for (long t = 1; t < threads; t++) pthread_join(tid[t], NULL);
    double dt = now() - t0;
    if (dt < best) best = dt;
    pthread_barrier_destroy(&bar);
  }
  printf("{\"envs\": %ld, \"floats\": %ld, \"threads\": %ld, \"sps\": %.6e, \"gb_per_s\": %.3f}\n", n, f, threads,
         (double)n * (double)steps / best, (double)total * sizeof(float) * (double)steps / best / 1e9);
  free(buf);
  return 0;
}
