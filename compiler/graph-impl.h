/* compiler/graph-impl.h — the graph's private layout: the node arena, the view arena
 * (shape trackers chained to their base), inputs with roles, outputs, assigns, and the
 * graph's integer expressions (dimensions and index math). Backends and passes include
 * this; users only see the opaque handles of lumen/graph.h. */
#ifndef LUMEN_GRAPH_IMPL_H
#define LUMEN_GRAPH_IMPL_H

#include "lumen/graph.h"

#include "core.h"
#include "expr.h"

typedef struct lm_shape {
  int rank;
  lm_expr dim[LM_MAX_RANK];
} lm_shape;

typedef enum lm_vkind {
  LM_V_PERMUTE,    /* out axis j reads in axis perm[j] */
  LM_V_EXPAND,     /* a new axis `axis` of extent p0 */
  LM_V_SLICE,      /* axis keeps [p0, p1) */
  LM_V_PAD,        /* axis gets p0 zeros before, p1 after */
  LM_V_RESHAPE,    /* row-major reinterpretation */
  LM_V_AFFINE_MOD, /* axis index i reads (p0*i + p1) mod extent */
  LM_V_COUNT
} lm_vkind;

/* One step of a shape tracker. Chains end at parent 0: the node's contiguous layout. */
typedef struct lm_view {
  uint32_t parent;
  uint8_t kind;
  int8_t axis;
  int8_t perm[LM_MAX_RANK];
  lm_expr p0, p1;
  lm_shape shape; /* shape seen through this view */
} lm_view;

typedef struct lm_edge {
  uint32_t node, view;
} lm_edge;

typedef struct lm_node {
  uint8_t op;   /* lm_op */
  uint8_t nsrc; /* 0, 1 or 2 */
  int8_t axis;  /* reductions */
  uint8_t nograd; /* autograd does not differentiate through this node (lm_detach) */
  lm_edge src[2];
  lm_shape shape; /* every op writes a contiguous result of this shape */
  float value;    /* CONST */
  uint32_t stream; /* RAND */
  uint32_t input;  /* INPUT: index into inputs */
} lm_node;

typedef struct lm_input_info {
  char *name;
  uint8_t role; /* lm_role */
  uint32_t node;
} lm_input_info;

typedef struct lm_output_info {
  char *name;
  lm_edge src;
} lm_output_info;

typedef struct lm_assign_info {
  uint32_t target; /* an INPUT node with role STATE or PARAM */
  lm_edge src;
} lm_assign_info;

struct lm_graph {
  lm_node *nodes; /* nodes[0] unused: node 0 means invalid */
  size_t nnodes, nodecap;
  lm_view *views; /* views[0] unused: view 0 is the identity */
  size_t nviews, viewcap;
  lm_input_info *inputs;
  size_t ninputs, inputcap;
  lm_output_info *outputs;
  size_t noutputs, outputcap;
  lm_assign_info *assigns;
  size_t nassigns, assigncap;
  lm_exprs x;
  uint32_t next_stream;
  uint8_t contract; /* lm_graph_set_contraction */
  uint8_t finite;   /* lm_graph_promise_finite */
  lm_status err; /* first construction error, LM_OK if none */
  char *errmsg;
};

/* Per-op facts. Every table is indexed by lm_op and sized LM_OP_COUNT. */
typedef struct lm_op_info {
  const char *name;
  int arity;        /* number of sources */
  int elementwise;  /* output index i reads source index i */
  int reduce;       /* SUM_REDUCE / MAX_REDUCE */
} lm_op_info;
extern const lm_op_info lm_op_table[LM_OP_COUNT];

/* Records the graph's first error (message prefixed with the node, if any). */
void lm_graph_error(lm_graph_t *g, uint32_t node, const char *fmt, ...) LM_PRINTF(3, 4);
uint32_t lm_graph_push_node(lm_graph_t *g, const lm_node *n);
uint32_t lm_graph_push_view(lm_graph_t *g, const lm_view *v);

/* Shape of a node seen through a view (view 0: the node's own shape). */
const lm_shape *lm_edge_shape(const lm_graph_t *g, lm_edge e);
static inline lm_edge lm_edge_of(lm_tensor t) { return (lm_edge){t.node, t.view}; }

/* Index math of an edge: given an index expression for every axis of the viewed shape,
 * yields the flat row-major index into the source node's buffer and the validity
 * (0 where padding reads a zero). Both are simplified with ctx. */
void lm_edge_index(lm_graph_t *g, lm_edge e, const lm_expr *idx, const lm_xctx *ctx, lm_expr *flat,
                   lm_expr *valid);
/* The same as a multi-index into the source node (rank of the node's shape). */
void lm_edge_index_nd(lm_graph_t *g, lm_edge e, const lm_expr *idx, const lm_xctx *ctx, lm_expr *src_idx,
                      lm_expr *valid);
/* Flat row-major offset of idx within shape. */
lm_expr lm_shape_flat(lm_graph_t *g, const lm_shape *s, const lm_expr *idx);
lm_expr lm_shape_numel(lm_graph_t *g, const lm_shape *s);
/* "[N,4]" */
void lm_shape_print(const lm_graph_t *g, const lm_shape *s, lm_sb *sb);

/* lm_dim <-> lm_expr */
lm_expr lm_dim_expr(lm_graph_t *g, lm_dim d);
lm_dim lm_expr_dim(const lm_graph_t *g, lm_expr e);

/* Deep copy (programs keep their own graph). */
lm_graph_t *lm_graph_clone(const lm_graph_t *g);
/* Nodes in an order where sources come first; NULL and an error on a cycle. Caller frees. */
uint32_t *lm_graph_topo_order(const lm_graph_t *g, size_t *count);

#endif
