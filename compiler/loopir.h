/* compiler/loopir.h — the loop IR and the executable plan.
 * A kernel is a tree: a nest of parallel loops (its domain), and inside, blocks of scalar
 * statements and further loops (serial reduction loops, later tiles, unrolls, time loops).
 * Statements form an SSA DAG; each lives in the block of the shallowest loop where its
 * operands exist (loop-invariant code is hoisted by construction). Index and validity
 * expressions are lm_expr over loop variables (VAR k = loop k of the kernel) and symbols,
 * kept outside the statement DAG. A plan is the ordered list of kernels plus the buffers
 * they use and the copies that apply assigns. */
#ifndef LUMEN_LOOPIR_H
#define LUMEN_LOOPIR_H

#include "graph-impl.h"

typedef enum lm_sop {
  LM_S_CONST, /* f */
  LM_S_LOAD,  /* buf[idx] where valid, else 0 (local: the kernel's local array buf) */
  LM_S_RAND,  /* Philox uniform of (seed, stream, element idx, run + step) */
  LM_S_LOG2,
  LM_S_EXP2,
  LM_S_SIN,
  LM_S_SQRT,
  LM_S_RECIP,
  LM_S_ADD,
  LM_S_MUL,
  LM_S_MOD,
  LM_S_LT,
  LM_S_MAX,     /* fmax(a, b) */
  LM_S_SELECT,  /* valid ? a : 0 (padding around a computed value) */
  LM_S_ACC,     /* accumulator declared before its loop: 0 (sum) or -inf (max) in f */
  LM_S_ACC_SUM, /* acc a += b */
  LM_S_ACC_MAX, /* acc a = fmax(acc a, b) */
  LM_S_STORE,   /* buf[idx] = a */
  LM_S_BARRIER, /* work-group barrier (GPU work-group schedules): shared arrays written before
                 * it are visible to every thread of the group after it */
  LM_S_WARP_SUM, /* the sum of a over the 32 threads of the calling warp, halving by shuffles
                  * (16, 8, 4, 2, 1 lanes apart), valid in the warp's first thread (CUDA only) */
  LM_S_WARP_MAX, /* the same with fmax */
  LM_S_INDEX,    /* (float)idx: an index expression's value as a float, exact below 2^24 (compiler/columns.c:
                  * a chain of picks that sums to it, lm_arange's binary digits) */
  LM_S_COUNT
} lm_sop;

typedef struct lm_stmt {
  uint8_t op;   /* lm_sop */
  int32_t loop; /* enclosing loop, -1 = the kernel's root block */
  uint32_t a, b; /* operand statements */
  uint32_t buf;  /* plan buffer (or local array) of LOAD / STORE */
  uint8_t local; /* LOAD / STORE: buf names one of the kernel's local arrays */
  lm_expr idx, valid;
  lm_expr step;  /* RAND: added to the run counter (0 = none), e.g. a scan's time step */
  float f;
  uint32_t stream;
} lm_stmt;

typedef enum lm_loopkind {
  LM_L_PARALLEL, /* part of the domain: iterations independent (threads, GPU grid) */
  LM_L_SERIAL,   /* in order, e.g. a reduction */
  LM_L_LANES,    /* SIMD lanes (compiler/lanes.c): independent iterations of a short constant
                  * loop the C compiler must vectorise, not unroll */
  LM_L_SPARSE,   /* the lanes i < extent whose element i of local array `mask` is not 0, in
                  * order, one at a time (compiler/lazy.c): a value only those lanes use */
  LM_L_VECTOR,   /* C dialect: eight iterations at a time in vector registers (lm_v8), the
                  * search's vector variant (compiler/search/vec.c): a constant extent that 8
                  * divides, no loop inside, every load and store of its variable at stride 1
                  * (lm_vector_loop_check); other dialects run it as a plain serial loop */
  LM_L_COUNT
} lm_loopkind;

/* An item of a block: a statement, or a loop (whose body is its own block). */
typedef struct lm_item {
  uint8_t is_loop;
  uint32_t id;
} lm_item;

typedef struct lm_block {
  lm_item *items;
  size_t n, cap;
} lm_block;

typedef struct lm_loop {
  lm_expr extent; /* over symbols only */
  uint8_t kind;   /* lm_loopkind */
  uint8_t point;  /* a serial loop over independent points: a parallel loop the interchange moved */
  uint32_t mask;  /* LM_L_SPARSE: the local array that selects its lanes */
  lm_expr stop;   /* 0, or where a serial loop ends sooner than its extent, over the enclosing
                   * loops' variables too, at most the extent everywhere: a half of the rows
                   * (compiler/partial.c; the C dialect's cpu plans only) */
  lm_expr when;   /* 0, or a serial loop of extent 1 (its variable unused) that runs only where
                   * this expression of the enclosing loops' variables is not 0: a member of a
                   * stacked kernel (lm_schedule_stack) */
  int32_t parent; /* -1 = root */
  lm_block body;
} lm_loop;

typedef struct lm_kernel {
  char name[32];
  uint32_t anchor; /* the graph node (or 0 for an output/assign edge) it computes */
  lm_loop *loops;  /* loop k binds variable k */
  size_t nloops, loopcap;
  lm_stmt *stmts;
  size_t nstmts, stmtcap;
  lm_block root;
  int npar;        /* loops 0..npar-1 are the parallel domain, nested in that order */
  uint32_t *bufs;  /* plan buffers the kernel touches, ascending */
  size_t nbufs, bufcap;
  int64_t *locals; /* per local array: element count (private to each thread of the kernel) */
  size_t nlocals, localcap;
  /* GPU work-group schedule (compiler/gpu.c; GPU dialects only): group > 0 makes loop npar-1
   * the thread loop (extent `group`, one iteration per thread of a work-group) and loops
   * 0..npar-2 the grid of work-groups. Local array i is shared by the work-group's threads
   * when i < nshared and shared[i]. Every thread reaches every barrier. */
  int32_t group;
  uint8_t *shared;
  size_t nshared, sharedcap;
  uint8_t fixed; /* the search measured this schedule on the device: later passes leave it */
  uint8_t measured; /* the cpu search timed this kernel's body as it is: the jam leaves it, while
                     * the epilogue, the merge and the join may still put it beside its neighbours
                     * (as they do the default's kernels it is compared with) */
  uint8_t contract; /* C dialect: the compiler may fuse a*b + c into one FMA (rounds once, not
                     * twice as the reference does): the search's vector variant, gated with
                     * the tolerance of rules that change rounding */
  uint8_t finite;   /* its graph promises finite values (lm_graph_promise_finite): arithmetic
                     * selects print as selects (render.c) */
  uint8_t fast_exp; /* C dialect: exp2 as lm_exp2_c's inline polynomial, not libmvec's expf
                     * (a fused scan of a graph that allows contraction: its kernel keeps its
                     * own separate roundings, compile.c) */
} lm_kernel;

typedef enum lm_bufkind {
  LM_BUF_INPUT,  /* the program's input buffer `index` */
  LM_BUF_OUTPUT, /* the program's output buffer `index` */
  LM_BUF_TEMP,   /* an intermediate: placed in the arena by the memory planner */
  LM_BUF_COUNT
} lm_bufkind;

typedef struct lm_pbuf {
  uint8_t kind;   /* lm_bufkind */
  uint32_t index; /* input or output number */
  uint32_t node;  /* the graph node whose values it holds (0 for edge anchors) */
  lm_expr numel;  /* element count over symbols */
  int first, last; /* kernels that write it first and read it last (liveness) */
} lm_pbuf;

/* After every kernel: dst (a state/parameter input buffer) = src. */
typedef struct lm_copy {
  uint32_t dst, src;
  lm_expr numel;
} lm_copy;

typedef struct lm_plan {
  lm_graph_t *g; /* not owned; expressions live in g->x */
  lm_pbuf *bufs;
  size_t nbufs, bufcap;
  lm_kernel *kernels; /* launch order */
  size_t nkernels, kernelcap;
  lm_copy *copies;
  size_t ncopies, copycap;
} lm_plan;

/* The default schedule: elementwise chains fuse into their consumers, reductions fuse
 * into their single consumer when that recomputes nothing, everything else is a kernel. */
lm_status lm_lower(lm_graph_t *g, lm_plan **out);
void lm_plan_free(lm_plan *p);
/* Recomputes every buffer's first and last kernel. */
void lm_plan_liveness(lm_plan *p);
/* A scan of an env-local step plan as one kernel: a parallel loop over envs (the extent of
 * every step kernel's outer loop), a serial time loop inside, the step's kernels in order
 * in its body, carried state and per-env intermediates in local arrays (registers) where
 * their per-env size is a constant. LM_ERR_UNSUPPORTED (no message) when the step is not
 * env-local: some kernel reads another env's values, or has no env loop. */
lm_status lm_scan_fuse(const lm_plan *step, int sym_T, int reverse, const uint8_t *per_step, lm_plan **out);
/* The cpu's SIMD schedule of a fused scan kernel (compiler/lanes.c): `lanes` envs per
 * iteration of its parallel loop, a loop over the lanes innermost around every straight-line
 * run of the step, per-env arrays lane-minor. Returns the kernels changed (0 when lanes < 2). */
int lm_scan_lanes(lm_plan *p, int lanes);
/* Lazy draws in a kernel in lane form (compiler/lazy.c): a per-lane value computed from RAND
 * by + and * that the kernel uses only multiplied by a per-lane flag (and then + 0), as an
 * env's auto-reset uses its fresh state, is computed only for the lanes whose flag is not 0,
 * in an LM_L_SPARSE loop; bit-identical results. Returns how many values it made lazy. */
int lm_lanes_lazy(lm_kernel *k, lm_exprs *x);
/* The end-of-step copies of a kernel in lane form's carried state dropped where the step can
 * store the new state in place (compiler/inplace.c); bit-identical. Returns how many, -1 when
 * memory ran out. */
int lm_lanes_inplace(lm_kernel *k, lm_exprs *x);
/* Short serial loops of constant extent around a lane loop, such as the columns of a stacked
 * state, unrolled into that lane loop (compiler/columns.c); bit-identical. Returns how many,
 * -1 when memory ran out. */
int lm_lanes_columns(lm_kernel *k, lm_exprs *x);
/* Long column loops split where their tests of the column change (compiler/columns.c):
 * how many were split, -1 out of memory. */
int lm_lanes_split(lm_kernel *k, lm_exprs *x);
/* Sums of picked constants that equal an index expression at every point of their loop (an
 * lm_arange's binary digits) replaced by one LM_S_INDEX (compiler/columns.c); the same values.
 * Returns how many, -1 when memory ran out. */
int lm_lanes_index(lm_kernel *k, lm_exprs *x);
/* A kernel of a graph that promises finite values (lm_graph_promise_finite): x * 0 as 0, x + 0
 * as x, constants combined, stores of what was just read from the same local element dropped
 * (compiler/columns.c); the same values up to zeros' signs. Returns how many rounds and stores
 * changed something, -1 when memory ran out. */
int lm_fold_finite(lm_kernel *k, lm_exprs *x);
/* Moves the innermost parallel loop of sum-reduction kernels inside the reductions where
 * that makes the loop vectorise (bitwise-identical results); returns the kernels changed.
 * stage (the C dialect only): a strided read-only operand indexed by that loop and the
 * reduction alone is copied into a transposed local array once per call, so it qualifies. */
int lm_schedule_interchange(lm_plan *plan, int stage);
/* Fuses kernels over the same parallel domain that do not depend on each other (up to `back`
 * apart, past kernels independent of the later one) into one kernel with several stores;
 * returns how many merged, -1 when memory ran out. */
int lm_schedule_merge(lm_plan *plan, int back);
/* How far back (kernels) a merge or an epilogue may move a kernel up, past kernels it is
 * independent of. A fused scan's step merges only with the kernel before it: the lanes pass
 * jams the step's layers as the adjacent merges leave them. */
enum { LM_MERGE_BACK = 16 };
/* Consecutive kernels the cpu runs on one thread anyway (little work, or no parallel domain)
 * become one kernel without a parallel domain; returns how many joined, -1 when memory ran out. */
int lm_schedule_join(lm_plan *plan);
/* An elementwise kernel that reads what an earlier kernel stores, point for point, runs in that
 * kernel after the store; returns how many moved, -1 when memory ran out. */
int lm_schedule_epilogue(lm_plan *plan);
/* The outer parallel loop of kernels that hold loops, run `f` points at a time with every
 * statement inside copied per point side by side (unroll and jam, compiler/jam.c); the same
 * bits. f = 0: LM_JAM, or more where the points' accumulators leave room in the registers.
 * Returns the kernels changed, -1 when memory ran out. */
enum { LM_JAM = 4 };
int lm_schedule_jam(lm_plan *plan, int f);
/* A kernel over the same outer parallel loops as an earlier one, reading what that kernel
 * stores only at the point that stores it (or nothing it stores), runs inside it, after it at
 * each point (a chain of layers over one block of rows); returns how many moved, -1 when memory
 * ran out. */
int lm_schedule_chain(lm_plan *plan);
/* Independent kernels of different domains become one whose domain is theirs end to end, each
 * point running its own kernel's body under a test of where it lies (horizontal fusion: a PPO
 * update's weight gradients of several shapes, a loss's scalar sums); returns how many went
 * into another, -1 when memory ran out. */
int lm_schedule_stack(lm_plan *plan);
/* A kernel whose every store is a sum over the batch's rows (a weight gradient's), in a graph
 * that allows reassociation, runs twice its domain: each half sums half the rows into its own
 * part of the buffers, and later kernels read the parts' sum (compiler/partial.c). Returns the
 * kernels changed, -1 when memory ran out. */
int lm_schedule_partial(lm_plan *plan);
/* An assign's copy after the last kernel dropped where the one kernel computing its value can
 * store it into the assigned input itself, each element after its own reads of the old value
 * (an optimiser's updates); the same values. Returns how many (compiler/lower.c). */
int lm_plan_assign_in_place(lm_plan *p);
/* Readable text of every kernel (for tests and bug reports). */
void lm_plan_dump(const lm_plan *p, lm_sb *sb);

/* ---- building blocks used by the lowering and by search rewrites ---- */
lm_kernel *lm_plan_add_kernel(lm_plan *p, const char *name);
int32_t lm_kernel_add_loop(lm_kernel *k, int32_t parent, lm_expr extent, lm_loopkind kind);
/* Like lm_kernel_add_loop, but placed before the child loop `before` of parent's block. */
int32_t lm_kernel_add_loop_before(lm_kernel *k, int32_t parent, int32_t before, lm_expr extent, lm_loopkind kind);
/* Appends a statement to the block of `loop`, before the item that holds `before_loop`
 * (a child loop that is still open), or at the end when before_loop < 0. */
uint32_t lm_kernel_add_stmt(lm_kernel *k, const lm_stmt *s, int32_t before_loop);
/* Inserts item it at position at of block b; 0 when memory ran out. */
int lm_block_insert(lm_block *b, size_t at, lm_item it);
/* The position of the item (a loop when is_loop, else a statement) id in block b, or b->n. */
size_t lm_block_find(const lm_block *b, int is_loop, uint32_t id);
int lm_kernel_use_buf(lm_kernel *k, uint32_t buf);
int lm_loop_depth(const lm_kernel *k, int32_t loop);
/* Does a STORE of the kernel write plan buffer buf? */
int lm_kernel_writes_buf(const lm_kernel *k, uint32_t buf);
/* Adds a local array of n floats (shared: by the work-group); its number, or UINT32_MAX. */
uint32_t lm_kernel_add_local(lm_kernel *k, int64_t n, int shared);
/* Frees what the kernel owns and zeroes it (NULL or a zeroed kernel: nothing to do). */
void lm_kernel_free(lm_kernel *k);
/* Which operand statements op reads: LM_OPND_A | LM_OPND_B (for ACC_SUM/ACC_MAX, a is the
 * accumulator it updates and b the value). */
enum { LM_OPND_A = 1, LM_OPND_B = 2 };
int lm_sop_operands(uint8_t op);

#endif
