/* compiler/search/term.h — the search's representation of loop-IR kernels, private to
 * compiler/search. A kernel becomes a term of effects and values:
 *   effects: NOP, SEQ(a, b), LOOP[piece, kind](body), STORE[access](value), KERNEL[k](body)
 *   values:  CONST[f], LOAD[access], RAND[access], SELECT[access](v), the ALU ops of lm_sop,
 *            RED[op, k, lanes, joint](body) — a reduction over logical variable k.
 * Loop iterations of effect loops are independent (the lowering's parallel domain, and every
 * rewrite keeps that), so a loop's kind (threads, serial, unrolled) is a pure scheduling choice.
 * Index expressions are lm_expr over *logical* variables (the original kernel's loop variables,
 * offset per kernel in a plan) and never change in the e-graph: a loop iterates a *piece* — a
 * whole variable, the outer or inner part of a split, two merged pieces, or a group of pieces
 * iterated together (fused loops) — and converting a term back to a kernel computes each logical
 * variable from its pieces' counters (v = outer*f + inner, p = m / ext(q), q = m % ext(q)) and
 * substitutes it into the expressions, outside the e-graph. A RED with lanes f sums into f
 * interleaved partial accumulators (a vectorisable split-K that changes rounding); a RED with a
 * joint piece is computed for all iterations of the loop over that piece at once, reduction loop
 * outside, into a local array (matmul's i-k-j order: the same summation order per element). */
#ifndef LUMEN_SEARCH_TERM_H
#define LUMEN_SEARCH_TERM_H

#include "loopir.h"
#include "search/egraph.h"

typedef enum sk_op {
  SK_NOP,
  SK_SEQ,
  SK_LOOP,
  SK_STORE,
  SK_KERNEL,
  SK_CONST,
  SK_LOAD,
  SK_RAND,
  SK_SELECT,
  SK_LOG2,
  SK_EXP2,
  SK_SIN,
  SK_SQRT,
  SK_RECIP,
  SK_ADD,
  SK_MUL,
  SK_MOD,
  SK_LT,
  SK_RED,
  SK_COUNT
} sk_op;

extern const char *const sk_op_names[SK_COUNT];
static inline int sk_is_effect(int op) { return op <= SK_KERNEL; }

/* SK_GROUP (GPU dialects): the loop's iterations are the threads of one work-group; it must be
 * the innermost loop of the kernel's parallel domain, whose outer loops are then the grid.
 * SK_GROUP_STAGED: the same, and every read-only load in its body that all the group's threads
 * make alike (its index uses the grid's variables and enclosing reductions' only) reads a copy
 * the threads first load into shared memory together (then a barrier). */
typedef enum sk_kind { SK_PAR, SK_SER, SK_UNROLL, SK_GROUP, SK_GROUP_STAGED, SK_KIND_COUNT } sk_kind;

typedef enum sk_ptype { SKP_ORIG, SKP_OUT, SKP_IN, SKP_MERGE, SKP_GROUP } sk_ptype;

typedef struct sk_piece {
  uint32_t type; /* sk_ptype */
  uint32_t a, b; /* ORIG: a = variable; OUT/IN: a = piece, b = factor (OUT: ceil(extent / b)
                  * iterations; where b does not divide, a ragged split the emitter guards);
                  * MERGE/GROUP: pieces (MERGE: a outer) */
  lm_expr extent;
} sk_piece;

typedef struct sk_loopattr {
  uint32_t piece, kind;
} sk_loopattr;

typedef struct sk_access {
  uint32_t buf, stream;
  lm_expr idx, valid, step;
} sk_access;

enum { SK_RED_SUM, SK_RED_MAX };
typedef struct sk_redattr {
  uint32_t op, var, lanes, nj, swap;
  uint32_t joint[2];
} sk_redattr;

/* An interning table of fixed-size records (zeroed padding), ids from 0. */
typedef struct sk_tab {
  unsigned char *rec;
  size_t rsize, n, cap;
  uint32_t *ht;
  size_t hcap;
} sk_tab;

/* Per-class analysis. */
typedef struct sk_data {
  uint8_t kind;    /* 1 effect, 2 value */
  uint8_t has_red;
  uint64_t vars;   /* free logical variables, bit v % 64 (all ones when unknown) */
  uint64_t rd[4], wr[4]; /* plan buffers read / written, bit b % 256 */
} sk_data;

typedef struct lm_sk {
  lm_plan *plan;
  lm_exprs *x;
  lm_egraph *eg;
  sk_tab access, loops, reds, pieces;
  lm_expr *var_ext; /* per logical variable */
  size_t nvars, varcap;
  uint64_t *acc_vars; /* per access: free variables of its expressions */
  size_t acc_vars_cap;
  int wide;           /* more than 64 logical variables: variable sets are unknown */
  int rounding;       /* rules that change rounding may run */
  int gpu;            /* rules for GPU dialects (work-group mapping) may run */
  int stage;          /* SK_STAGE_* rule set */
  char why[200];      /* why a kernel could not be converted */
} lm_sk;

enum { SK_STAGE_KERNEL, SK_STAGE_PLAN };

lm_status sk_init(lm_sk *s, lm_plan *plan);
void sk_free(lm_sk *s);
uint32_t sk_intern(sk_tab *t, const void *rec);   /* UINT32_MAX on OOM */
uint32_t sk_lookup(const sk_tab *t, const void *rec); /* UINT32_MAX when absent */
static inline const void *sk_rec(const sk_tab *t, uint32_t id) { return t->rec + (size_t)id * t->rsize; }
static inline const sk_piece *sk_piece_of(const lm_sk *s, uint32_t p) { return sk_rec(&s->pieces, p); }
static inline const sk_access *sk_access_of(const lm_sk *s, uint32_t a) { return sk_rec(&s->access, a); }
static inline const sk_loopattr *sk_loop_of(const lm_sk *s, uint32_t a) { return sk_rec(&s->loops, a); }
static inline const sk_redattr *sk_red_of(const lm_sk *s, uint32_t a) { return sk_rec(&s->reds, a); }
uint32_t sk_piece_new(lm_sk *s, uint32_t type, uint32_t a, uint32_t b);
uint32_t sk_loopattr_new(lm_sk *s, uint32_t piece, uint32_t kind);
uint32_t sk_access_new(lm_sk *s, const sk_access *a);
uint32_t sk_red_new(lm_sk *s, const sk_redattr *r);
/* Logical variables a piece binds (bit v % 64). */
uint64_t sk_piece_vars(const lm_sk *s, uint32_t p);
/* ceil(extent of piece a / b): the extent of the outer part of a split of a by b (a ragged one
 * where b does not divide it or it is symbolic). */
lm_expr sk_split_outer_extent(lm_sk *s, uint32_t a, uint32_t b);
/* Constant extent of a piece, or -1. */
int64_t sk_piece_const(const lm_sk *s, uint32_t p);
int sk_piece_depth(const lm_sk *s, uint32_t p); /* splits above the whole variables */

/* A kernel of the plan as a term in s->eg: the class of its KERNEL node, or LM_EG_NONE when the
 * kernel uses what the representation lacks (local arrays, serial effect loops...; s->why says).
 * Variables are numbered var_base + loop. */
uint32_t sk_add_kernel(lm_sk *s, uint32_t kernel, uint32_t var_base);

/* ---------------------------------------------------------------- extracted terms */

/* A term DAG: nodes whose children are indices of earlier nodes. */
typedef struct sk_term {
  lm_enode *n;
  uint32_t *src;  /* e-graph node each came from (LM_EG_NONE: parsed) */
  size_t count, cap;
  uint32_t root;
} sk_term;

void sk_term_free(sk_term *t);
uint32_t sk_term_push(sk_term *t, const lm_enode *n, uint32_t src);
/* Serialises a term (compact text; access, variable and kernel ids refer to the conversion of
 * the same kernel, which is deterministic). Parsing interns the pieces and attributes it names. */
char *sk_term_print(const lm_sk *s, const sk_term *t);
lm_status sk_term_parse(lm_sk *s, const char *text, sk_term *out);

/* Emits the kernel of a KERNEL (or effect) term node into `out` (zeroed first; name and anchor
 * from `like`). LM_ERR_INVALID with s->why when the term cannot be scheduled as chosen. */
lm_status sk_emit_kernel(lm_sk *s, const sk_term *t, uint32_t node, const lm_kernel *like, lm_kernel *out);
/* A deep copy of a kernel. */
lm_status sk_kernel_copy(const lm_kernel *src, lm_kernel *dst);

/* ---------------------------------------------------------------- the reference interpreter */

/* Runs kernel k of plan p on host buffers (bufs[i] = plan buffer i holding count[i] floats), as
 * the C renderer's code would (same float operations in the same order, scalar libm). An index
 * outside its buffer or local array is LM_ERR_INVALID. */
lm_status sk_interpret(const lm_plan *p, const lm_kernel *k, float *const *bufs, const size_t *count,
                       const int64_t *syms, uint64_t seed, uint64_t run);

/* ---------------------------------------------------------------- rules */

/* The rule table: SK_STAGE_KERNEL rules then SK_STAGE_PLAN rules. */
const lm_rule *sk_rules(int *count);
int sk_rule_stage_ok(const lm_sk *s, int rule);

#endif
