/* compiler/search/egraph.h — an e-graph in C after egg's design: flat e-node arrays, a hashcons
 * (open addressing over node ids), union-find with path halving, deferred rebuild (union only
 * queues; lm_eg_rebuild restores congruence and the per-class analysis once per iteration), a
 * pattern matcher with guards, and a rule runner with egg's back-off scheduling and limits.
 * An e-node is (op, attribute id, up to 3 child classes); attributes are interned by the user,
 * so node equality is an integer compare. Nothing here knows what the ops mean. */
#ifndef LUMEN_SEARCH_EGRAPH_H
#define LUMEN_SEARCH_EGRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "lumen/base.h"

#define LM_EG_MAXC 3
#define LM_EG_NONE UINT32_MAX

typedef struct lm_enode {
  uint16_t op;
  uint8_t n; /* children used */
  uint32_t attr;
  uint32_t c[LM_EG_MAXC];
} lm_enode;

typedef struct lm_egraph lm_egraph;

/* Per-class data: make() computes a node's data from its children's (read with lm_eg_data);
 * join() merges `from` into `into` and returns 1 when `into` changed. Both must be monotone. */
typedef struct lm_eg_analysis {
  size_t size;
  void (*make)(void *ctx, lm_egraph *g, const lm_enode *n, void *out);
  int (*join)(void *ctx, void *into, const void *from);
  void *ctx;
} lm_eg_analysis;

typedef struct lm_eg_vec {
  uint32_t *v;
  uint32_t n, cap;
} lm_eg_vec;

struct lm_egraph {
  lm_enode *nodes;   /* every node ever added, by node id */
  uint32_t *node_cls; /* class a node was added to (find() it) */
  int16_t *node_rule; /* rule that created the node (-1: the input term) */
  uint8_t *node_inexact; /* made by a rounding rule, or by any rule from a match holding such a node */
  size_t nnodes, nodecap;
  uint32_t *uf;      /* union-find parent, by class id */
  lm_eg_vec *cnodes; /* per root class: its nodes */
  lm_eg_vec *cparents; /* per root class: nodes that have it as a child (ids; may hold duplicates of content) */
  unsigned char *data; /* per class: analysis data */
  uint8_t *taint;      /* per class: two existing classes merged (directly or through a merged
                          class) by a rule marked LM_RULE_ROUNDING: its members may differ in
                          rounding. (Merging in a node the rule just made taints nothing: that
                          node carries its rule.) */
  uint64_t *merged_by; /* per class: rules (bit r, r < 64) whose unions merged into it */
  size_t nclasses, classcap;
  size_t nroots;     /* live (root) classes */
  uint32_t *tab;     /* hashcons: node id + 1; 0 empty, UINT32_MAX deleted */
  size_t tcap, tcount, ttomb;
  lm_eg_vec pending; /* classes whose parents need repair */
  lm_eg_analysis an;
  unsigned char *scratch; /* one data record */
  int16_t cur_rule;  /* stamped on nodes added now */
  uint8_t cur_taint; /* unions now come from a rounding rule */
  uint8_t cur_inexact; /* nodes added now are inexact */
  size_t apply_start; /* nodes from this id on were made by the rule application under way */
  int failed;        /* an allocation failed: results unreliable */
};

lm_egraph *lm_eg_new(const lm_eg_analysis *an);
void lm_eg_free(lm_egraph *g);
/* Adds a node (children canonicalised first) and returns its class; an equal node already in
 * the hashcons gives that node's class. LM_EG_NONE on allocation failure. */
uint32_t lm_eg_add(lm_egraph *g, const lm_enode *n);
/* The class of an equal node, or LM_EG_NONE; adds nothing. */
uint32_t lm_eg_lookup(lm_egraph *g, const lm_enode *n);
uint32_t lm_eg_find(lm_egraph *g, uint32_t c);
/* Merges two classes; returns 1 when they were different. Congruence waits for rebuild. */
int lm_eg_union(lm_egraph *g, uint32_t a, uint32_t b);
/* Restores the invariants: congruence closure, a canonical hashcons, canonical and
 * deduplicated class node lists, the analysis at its fixed point. Returns unions performed. */
size_t lm_eg_rebuild(lm_egraph *g);
static inline void *lm_eg_data(lm_egraph *g, uint32_t c) { return g->data + (size_t)lm_eg_find(g, c) * g->an.size; }
static inline const lm_enode *lm_eg_node(const lm_egraph *g, uint32_t id) { return &g->nodes[id]; }
/* Checks every invariant after a rebuild; 0 and a reason in why when one fails. */
int lm_eg_check(lm_egraph *g, char *why, size_t cap);

/* ---------------------------------------------------------------- patterns */

/* A pattern node: an op with children (child pattern indices), or a variable (op < 0) that
 * binds a class. attr_any: any attribute; else the node's attribute must equal attr. */
typedef struct lm_pat {
  int16_t op;  /* -1: variable number `var` */
  uint8_t n, var;
  uint8_t attr_any;
  uint32_t attr;
  int8_t c[LM_EG_MAXC];
} lm_pat;

#define LM_PAT_MAXV 8
#define LM_PAT_MAXN 12
typedef struct lm_match {
  uint32_t root;                /* class matched by pattern node 0 */
  uint32_t var[LM_PAT_MAXV];    /* class bound to each variable */
  uint32_t node[LM_PAT_MAXN];   /* node matched by each op pattern node */
} lm_match;

typedef int (*lm_match_fn)(void *ctx, const lm_match *m);
/* Calls fn for every match of pattern pats[0..] rooted at class c (stop early when fn returns 0).
 * Returns 0 when stopped early. */
int lm_eg_ematch(lm_egraph *g, const lm_pat *pats, int npats, uint32_t c, lm_match_fn fn, void *ctx);

/* ---------------------------------------------------------------- rules and the runner */

enum {
  LM_RULE_ROUNDING = 1u << 0, /* results may differ in rounding (the gate uses a looser tolerance) */
  LM_RULE_EXPLOSIVE = 1u << 1, /* back-off applies with a low match limit */
  LM_RULE_GPU = 1u << 2,       /* for kernels of a GPU dialect only */
};

typedef struct lm_rule {
  const char *name;
  unsigned flags;
  const lm_pat *pat; /* NULL: `search` finds matches itself */
  int npat;
  /* 1 when the match may be applied */
  int (*guard)(void *ctx, lm_egraph *g, const lm_match *m);
  /* adds the right side(s) and unions them with m->root; returns unions/additions made */
  int (*apply)(void *ctx, lm_egraph *g, const lm_match *m);
  /* custom search: calls fn on every match */
  void (*search)(void *ctx, lm_egraph *g, lm_match_fn fn, void *fnctx);
} lm_rule;

typedef struct lm_run_limits {
  int iterations;
  size_t nodes;
  double seconds;
  uint32_t match_limit; /* back-off: matches per rule per iteration before a ban */
  int ban_length;       /* iterations */
  const uint8_t *enabled; /* per rule: 0 skips it (NULL: all run) */
  double (*clock)(void *ctx); /* what `seconds` is read on (NULL: lm_search_now) */
  void *clock_ctx;
} lm_run_limits;

typedef enum lm_stop {
  LM_STOP_SATURATED,
  LM_STOP_ITERATIONS,
  LM_STOP_NODES,
  LM_STOP_TIME,
  LM_STOP_NOMEM,
} lm_stop;

typedef struct lm_run_report {
  lm_stop stop;
  int iterations;
  size_t nodes, classes;
  uint32_t *applied; /* per rule: matches applied (caller's array of nrules, may be NULL) */
  uint32_t *banned;  /* per rule: times banned (may be NULL) */
  double seconds;
} lm_run_report;

/* Equality saturation: every round collects the matches of every rule not banned on a clean
 * e-graph, applies them (guards first), then rebuilds. Stops on saturation or a limit. */
void lm_eg_run(lm_egraph *g, const lm_rule *rules, int nrules, void *ctx, const lm_run_limits *lim,
               lm_run_report *rep);

double lm_search_now(void); /* monotonic seconds */

#endif
