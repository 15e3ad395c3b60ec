/* compiler/expr.h — integer index expressions: hash-consed nodes over loop variables,
 * symbols and constants, and the deterministic canonicaliser that simplifies the index
 * and validity expressions generated from shape trackers. Division and modulo are floor
 * operations with positive divisors; LT and AND yield 0 or 1. */
#ifndef LUMEN_EXPR_H
#define LUMEN_EXPR_H

#include <stdint.h>

#include "core.h"

typedef uint32_t lm_expr; /* 0 = none */

typedef enum lm_xop {
  LM_X_CONST, /* v */
  LM_X_VAR,   /* loop variable number v */
  LM_X_SYM,   /* symbol number v */
  LM_X_ADD,
  LM_X_MUL,
  LM_X_DIV, /* floor(a / b), b > 0 */
  LM_X_MOD, /* a - b*floor(a / b), b > 0 */
  LM_X_LT,  /* a < b */
  LM_X_AND, /* a && b over 0/1 values */
  LM_X_COUNT
} lm_xop;

typedef struct lm_xnode {
  uint8_t op;
  lm_expr a, b;
  int64_t v;
} lm_xnode;

typedef struct lm_xsym {
  char *name;
  int64_t least;
  int64_t hint; /* the value it is expected to take (lm_sym_hint), 0 when none */
} lm_xsym;

typedef struct lm_exprs {
  lm_xnode *nodes; /* nodes[0] unused */
  size_t n, cap;
  uint32_t *table; /* hashcons: open addressing over node ids */
  size_t tcap;
  lm_xsym *syms;
  size_t nsyms, symcap;
  struct lm_xmemo *memo; /* simplification results keyed by (expr, context) */
  size_t memocap, nmemo;
  int failed; /* an allocation failed: results are unreliable */
} lm_exprs;

void lm_exprs_init(lm_exprs *x);
void lm_exprs_free(lm_exprs *x);
int lm_exprs_copy(lm_exprs *dst, const lm_exprs *src);

lm_expr lm_x_const(lm_exprs *x, int64_t v);
lm_expr lm_x_var(lm_exprs *x, int index);
/* Finds or adds a symbol; returns its number, or -1 on allocation failure. */
int lm_x_symbol(lm_exprs *x, const char *name, int64_t least);
lm_expr lm_x_sym(lm_exprs *x, int symbol);
/* Constructors fold constants and trivial identities only; lm_x_simplify canonicalises. */
lm_expr lm_x_add(lm_exprs *x, lm_expr a, lm_expr b);
lm_expr lm_x_sub(lm_exprs *x, lm_expr a, lm_expr b);
lm_expr lm_x_mul(lm_exprs *x, lm_expr a, lm_expr b);
lm_expr lm_x_div(lm_exprs *x, lm_expr a, lm_expr b);
lm_expr lm_x_mod(lm_exprs *x, lm_expr a, lm_expr b);
lm_expr lm_x_lt(lm_exprs *x, lm_expr a, lm_expr b);
lm_expr lm_x_and(lm_exprs *x, lm_expr a, lm_expr b);

static inline const lm_xnode *lm_x_node(const lm_exprs *x, lm_expr e) { return &x->nodes[e]; }
static inline int lm_x_is_const(const lm_exprs *x, lm_expr e, int64_t v) {
  return x->nodes[e].op == LM_X_CONST && x->nodes[e].v == v;
}

/* A bound known where an expression is evaluated: lo <= e <= hi (a guard's conjunct). */
typedef struct lm_xfact {
  lm_expr e;
  int64_t lo, hi;
} lm_xfact;

/* Loop variable i ranges over [0, extent[i]); the facts hold too (none: NULL, 0). */
typedef struct lm_xctx {
  const lm_expr *extent;
  int nvars;
  const lm_xfact *facts;
  int nfacts;
} lm_xctx;

/* Canonical form: a sum of monomials in a fixed order with constants folded, floor
 * division/modulo split over multiples of the divisor and removed where range analysis
 * proves them trivial. Deterministic: the same input gives the same node. */
lm_expr lm_x_simplify(lm_exprs *x, lm_expr e, const lm_xctx *ctx);
/* e simplified where guard holds: the guard's bounds on affine terms (c < t, t < c and their
 * conjunctions) join the range analysis, so floor division and modulo that the guard makes
 * trivial vanish (a padded window's index: (y + ky - 1) * W + ... mod H*W is itself inside
 * the image). The result equals e only where guard is true. */
lm_expr lm_x_simplify_guarded(lm_exprs *x, lm_expr e, lm_expr guard, const lm_xctx *ctx);
/* The guard's bounds on affine terms as facts (at most LM_X_GUARD_FACTS), a side the guard
 * leaves open taken from the loops' extents: what may be assumed where a guarded access
 * happens. Returns how many. */
enum { LM_X_GUARD_FACTS = 8 };
int lm_x_guard_facts(lm_exprs *x, lm_expr guard, const lm_xctx *ctx, lm_xfact f[LM_X_GUARD_FACTS]);
/* 1 when a - b is provably >= 0 (respectively > 0, == 0) for every binding. */
int lm_x_prove_ge(lm_exprs *x, lm_expr a, lm_expr b, const lm_xctx *ctx);
int lm_x_prove_gt(lm_exprs *x, lm_expr a, lm_expr b, const lm_xctx *ctx);
int lm_x_prove_eq(lm_exprs *x, lm_expr a, lm_expr b);
/* Floor divisions and modulos in e, per occurrence; with var >= 0 only those whose operand names
 * that loop variable. Their constant divisors are appended to d (when not NULL; up to 8 in all,
 * *nd counting them). */
int lm_x_divmods(const lm_exprs *x, lm_expr e, int var, int64_t *d, int *nd);
/* The loop variables that occur in e, a bit each (variables beyond 63 are not tracked). */
uint64_t lm_x_vars_used(const lm_exprs *x, lm_expr e);
/* The symbols that occur in e, a bit each; bit 63 stands for every symbol from 63 on. */
uint64_t lm_x_syms_used(const lm_exprs *x, lm_expr e);
/* 1 when a and b (n values each) agree on every symbol of mask (bit 63: on all from 63 on). */
static inline int lm_x_syms_agree(uint64_t mask, const int64_t *a, const int64_t *b, size_t n) {
  for (size_t s = 0; s < n; s++)
    if (mask >> (s < 63 ? s : 63) & 1 && a[s] != b[s]) return 0;
  return 1;
}

/* e with every variable v < nmap that has map[v] != 0 replaced by map[v] (not simplified). */
lm_expr lm_x_subst(lm_exprs *x, lm_expr e, const lm_expr *map, int nmap);
/* How e changes when variable var (< nvars) steps by one: 1 with the step in *d when that is a
 * constant (0: e does not name var), else 0 (the step depends on where, or memory ran out). */
int lm_x_step(lm_exprs *x, lm_expr e, int var, int nvars, int64_t *d);

int64_t lm_x_eval(const lm_exprs *x, lm_expr e, const int64_t *vars, const int64_t *syms);
/* C-like text; loop variables print as `var_prefix` followed by their number. */
void lm_x_print(const lm_exprs *x, lm_expr e, lm_sb *sb, const char *var_prefix);

#endif
