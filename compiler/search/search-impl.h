/* compiler/search/search-impl.h — what the search's files share: extraction (extract.c),
 * measurement on the cpu (measure.c), the tuning cache (cache.c). */
#ifndef LUMEN_SEARCH_IMPL_H
#define LUMEN_SEARCH_IMPL_H

#include "cc.h"
#include "memplan.h"
#include "pool.h"
#include "search/search.h"
#include "search/term.h"

/* ---- extraction (extract.c) */
uint64_t sk_rand(uint64_t *state);
/* Greedy costs and choices, per class (arrays of eg->nclasses). */
void sk_greedy(lm_sk *s, double *cost, uint32_t *best);
/* A term rooted at class root. rng NULL: greedy. force: a node per class to take (with
 * probability keep when rng is set: mutation), LM_EG_NONE entries choose. genome (may be NULL)
 * receives the node taken per class. LM_ERR_INVALID when no acyclic term was found. */
lm_status sk_extract(lm_sk *s, uint32_t root, const uint32_t *best, const uint32_t *force, uint64_t *rng,
                     double keep, uint32_t *genome, sk_term *out);
/* A random genome that takes loops of `kind` where a class offers one (80% of the time): how
 * rare mappings (SK_GROUP) get drawn at all. */
lm_status sk_extract_preferring(lm_sk *s, uint32_t root, const uint32_t *best, uint64_t *rng, int kind,
                                uint32_t *genome, sk_term *out);
/* Seed `which` (0, 1, ...) of the register tiles the `tile` rule built, as a force map (a node per
 * class, LM_EG_NONE elsewhere): the tile's loops and the joint reductions over it; array
 * accumulators, columns along the stores' unit stride, column panels (packable) and 4x16 or 6x16 first. 0 when there is
 * no such seed. Random genomes rarely assemble a tile (four loop choices and a reduction form must
 * agree). */
int sk_tile_seed(lm_sk *s, int which, uint32_t *force);
/* The genetic search's operators; genomes are arrays of eg->nclasses (node per class,
 * LM_EG_NONE where the term does not reach). Both take a parent's node only where it fits its
 * context (a joint reduction under loops over its pieces) and repair cycles with the greedy node.
 * Mutation: the parent's choices except `nredraw` classes it took a node in (two thirds of the
 * draws among effect or reduction classes) drawn again in context, never the parent's node;
 * classes the parent did not reach are drawn as a random genome draws them.
 * Crossover: per class the node of parent a or b (a coin where both reached the class, else the
 * one that did); where that node does not fit, the other parent's; else the greedy node. */
lm_status sk_mutate(lm_sk *s, uint32_t root, const uint32_t *best, const uint32_t *parent, int nredraw,
                    uint64_t *rng, uint32_t *genome, sk_term *out);
lm_status sk_crossover(lm_sk *s, uint32_t root, const uint32_t *best, const uint32_t *a, const uint32_t *b,
                       uint64_t *rng, uint32_t *genome, sk_term *out);
/* Classes reachable from root (into classes, which may be NULL) and the number of terms (capped). */
double sk_space(lm_sk *s, uint32_t root, uint32_t *classes, size_t *n);
uint64_t sk_term_rules(const lm_sk *s, const sk_term *t, int *rounding);

/* ---- packing (pack.c) */
/* Copies each read-only operand a serial loop reads alike in every iteration (256..16384 floats
 * over the serial loops inside it) into a local array before the loop, the loads reading the
 * copy; the number of operands packed (0: the kernel is unchanged), -1 when memory ran out. */
int sk_pack_kernel(const lm_plan *p, lm_kernel *k);

/* ---- the vector variant (vec.c) */
/* Makes every serial loop that qualifies (lm_vector_loop_check) an LM_L_VECTOR loop and lets the
 * kernel contract a*b + c into FMAs (k->contract); the number of loops (0: the kernel is
 * unchanged), -1 when memory ran out. */
int sk_vec_kernel(const lm_plan *p, lm_kernel *k);

/* ---- measurement (measure.c) */
typedef void (*sk_kernel_fn)(float *const *B, const int64_t *S, const uint64_t *R, int64_t start, int64_t end);

/* Host buffers for every plan buffer under concrete symbols, inputs random; with a device
 * (search.h), a device buffer beside each, kept in step: host writes (fill, poison, the
 * interpreter: skb_touch) go up before the next launch that uses them, what a launch stores
 * comes down when skb_pull asks for it. */
typedef struct sk_bench {
  const lm_plan *plan;
  const int64_t *syms;
  size_t nbufs;
  float **bufs;
  size_t *count;
  lm_pool *pool;
  uint64_t seed;
  const lm_search_device *dev; /* NULL: the cpu (kernels are sk_kernel_fn) */
  void **dbufs, *dS, *dR;
  uint8_t *host_new, *dev_new;
  lm_status dev_status;        /* the first device error (launches after it do nothing) */
} sk_bench;

lm_status skb_open(sk_bench *b, const lm_plan *plan, const int64_t *syms, lm_pool *pool, const lm_search_device *dev,
                   uint64_t seed);
void skb_close(sk_bench *b);
/* Refills every buffer with fresh random values (inputs away from zero). */
void skb_fill(sk_bench *b, uint64_t seed);
/* The host copies of the buffers flagged in w (a byte per plan buffer; NULL: all) changed. */
void skb_touch(sk_bench *b, const uint8_t *w);
/* The host copies of the buffers flagged in w (NULL: all) brought up to date. */
void skb_pull(sk_bench *b, const uint8_t *w);
/* One launch of a compiled kernel as its backend launches it: on the cpu, chunks of loop 0 on
 * the pool (fn is an sk_kernel_fn); on a device, fn is the backend's entry (asynchronous). */
void skb_launch(sk_bench *b, const lm_kernel *k, void *fn);
/* A kernel's launch under the bench's sizes: loop 0's extent, the parallel domain's work, and on
 * the cpu the backend's cut (lm_cpu_cut_of). Computed once for a kernel launched many times. */
typedef struct skb_shape {
  int64_t n, work;
  lm_cpu_cut cut;
} skb_shape;
skb_shape skb_shape_of(const sk_bench *b, const lm_kernel *k);
void skb_launch_shaped(sk_bench *b, const lm_kernel *k, void *fn, const skb_shape *s);
/* Waits for the device (nothing on the cpu). */
void skb_sync(sk_bench *b);
/* Minimum seconds per launch over several timed batches; stops early (returning what it has)
 * once a batch shows the kernel is slower than `cutoff` seconds. */
double skb_time(sk_bench *b, const lm_kernel *k, void *fn, double cutoff, double max_s);
/* Elementwise |a - b| <= rtol*|b| + atol*max|b|; NaN must match NaN. Returns the worst
 * normalised error (0 when equal; > 1 fails), or INFINITY on a NaN/inf mismatch. */
double skb_compare(const float *a, const float *b, size_t n, double rtol, double atol);
/* Static estimate of a kernel's cost (for ranking candidates before timing). */
double sk_estimate(const lm_plan *p, const lm_kernel *k, const int64_t *syms);
/* Canonical text of a kernel: loops and statements with buffers numbered by first use (the
 * same computation on other buffers gives the same text). */
char *sk_kernel_text(const lm_plan *p, const lm_kernel *k);

/* ---- tuning cache (cache.c) */
typedef struct sk_cache_entry {
  uint64_t key;
  char *value;
} sk_cache_entry;

typedef struct sk_cache {
  char *path;
  sk_cache_entry *e;
  size_t n, cap;
  size_t fresh;   /* entries added this session (from index n - fresh) */
  size_t skipped; /* malformed lines seen on load */
} sk_cache;

/* Loads path (a missing file is an empty cache); malformed lines are skipped and counted. */
lm_status skc_load(sk_cache *c, const char *path);
const char *skc_get(const sk_cache *c, uint64_t key);
lm_status skc_put(sk_cache *c, uint64_t key, const char *value);
/* Merges this session's entries into the file: re-read, append, write a temp file, rename. */
lm_status skc_save(sk_cache *c);
void skc_free(sk_cache *c);
/* Identity of this machine for cache keys: CPU model, compiler and flags, thread count. */
char *sk_device_id(lm_cc *cc, int threads);

/* ---- what the kernel stage did, kernel by kernel (search.c; for tests and tools) */
enum { SK_CS_UNTESTED, SK_CS_OK, SK_CS_WRONG, SK_CS_NOBUILD, SK_CS_SLOW }; /* a candidate's status */

typedef struct sk_trace_cand {
  uint64_t hash;  /* of its rendered C source */
  int status;     /* SK_CS_*: OK and SLOW were checked against the reference and timed */
  int generation; /* 0: the first batch (greedy, random or exhaustive; the default schedule) */
  int rounding;
  double time;    /* seconds per launch (timed ones) */
  char op[48];    /* how its genome was made: "default", "greedy", "random", "exhaustive",
                     "mutation(c3)", "crossover(c3,c7)", "crossover(c3,c7)+mutation" */
} sk_trace_cand;

typedef struct sk_trace_kernel {
  char name[32];
  double space;     /* terms in the reachable space (capped at 1e12) */
  int generations;  /* generations timed, the first included (1: no genetic search) */
  int genetic;      /* the space was large enough for the genetic search */
  char stop[64];    /* why the genetic search stopped */
  int winner;       /* index into c (0: the default schedule) */
  sk_trace_cand *c; /* every candidate compiled: c[0] the default schedule */
  size_t nc;
} sk_trace_kernel;

typedef struct sk_trace {
  sk_trace_kernel *k;
  size_t n, cap;
} sk_trace;

/* lm_search_plan, recording every searched kernel's candidates into tr (zeroed first). */
lm_status sk_search_plan_traced(lm_plan *plan, const int64_t *syms, const lm_search_options *o, lm_search_report *r,
                                sk_trace *tr);
void sk_trace_free(sk_trace *tr);

/* The genetic search's generation limit: $LUMEN_SEARCH_GENERATIONS (0: no genetic search),
 * default SK_GA_GENERATIONS; it also stops after SK_GA_STALL generations without a 1% gain. */
#define SK_GA_GENERATIONS 12
#define SK_GA_STALL 3
/* register-tile seeds tried per kernel in generation 0 (each twice: greedy and random elsewhere) */
#define SK_TILE_SEEDS 6

/* The value a search times an unbound symbol at: its hint (lm_sym_hint), else dflt or its least
 * value, whichever is larger. */
static inline int64_t sk_sym_value(const lm_xsym *s, int64_t dflt) {
  return s->hint ? s->hint : dflt > s->least ? dflt : s->least;
}

/* part of every cache key: bumped when the rules, extraction or variants change what a search would decide */
#define LM_SEARCH_VERSION "lumen-search-6"

#endif
