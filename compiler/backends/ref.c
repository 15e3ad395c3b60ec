/* compiler/backends/ref.c — the reference interpreter: unfused, one primitive at a time,
 * every read through the edge's index and validity expressions (evaluated per element, or once
 * per run into a table where they step evenly: ref_edge). It is the oracle every other backend
 * is tested against, so it favours obviousness over speed. */
#include <math.h>
#include <string.h>

#include "backend.h"
#include "lumen/rand.h"

/* An edge's read over its domain's vars. Along a var where the flat index steps by a constant
 * and the validity does not change (an env's axis, most often: any view but one that divides or
 * wraps that axis), a read is the read at that var's 0 plus the step times the var; the other
 * vars' combinations are evaluated once per run of the graph into a table (ref_tab), and a node
 * is computed a row (its last axis) at a time. Evaluating both expressions per element took 78%
 * of MinAtar Space Invaders' time here; with the tables its random play runs about 10x faster
 * (1e4 env steps/s: test_minatar_ref_slow.c). */
typedef struct ref_edge {
  lm_expr flat, valid;
  int rank;
  uint32_t stepped;         /* bit i: var i is stepped, step[i] its step */
  int64_t step[LM_MAX_RANK];
} ref_edge;

/* An edge's reads over a domain of these dims: the table over the vars that are not stepped
 * (row-major over them; flat -1 where not valid), or none (n = 0) when it would be too large,
 * where every read evaluates its expressions. */
typedef struct ref_tab {
  const ref_edge *e;
  int64_t *flat, stride[LM_MAX_RANK], n;
} ref_tab;

enum { TAB_MAX = 1 << 20 };

typedef struct ref_exe {
  lm_graph_t *g;
  uint32_t *order;
  size_t norder;
  ref_edge (*edges)[2];  /* per node, per source */
  ref_edge *out_edges;   /* per output */
  ref_edge *assign_edges;
  lm_scan_info scan;
  uint8_t *per_step;
} ref_exe;

static lm_status ref_open(void **ctx) {
  *ctx = NULL;
  return LM_OK;
}
static void ref_close(void *ctx) { (void)ctx; }

static lm_status ref_alloc(void *ctx, size_t bytes, void **buf) {
  (void)ctx;
  *buf = lm_malloc(bytes);
  return *buf ? LM_OK : LM_ERR_NOMEM;
}
static void ref_release(void *ctx, void *buf) {
  (void)ctx;
  lm_free(buf);
}
static lm_status ref_write(void *ctx, void *buf, const void *src, size_t bytes) {
  (void)ctx;
  memcpy(buf, src, bytes);
  return LM_OK;
}
static lm_status ref_read(void *ctx, const void *buf, void *dst, size_t bytes) {
  (void)ctx;
  memcpy(dst, buf, bytes);
  return LM_OK;
}
static lm_status ref_zero(void *ctx, void *buf, size_t bytes) {
  (void)ctx;
  memset(buf, 0, bytes);
  return LM_OK;
}

/* Index expressions of an edge read over a domain of `rank` vars with these extents. */
static ref_edge edge_exprs(lm_graph_t *g, lm_edge e) {
  const lm_shape *s = lm_edge_shape(g, e);
  lm_expr idx[LM_MAX_RANK];
  for (int i = 0; i < s->rank; i++) idx[i] = lm_x_var(&g->x, i);
  lm_xctx ctx = {.extent = s->dim, .nvars = s->rank};
  ref_edge r = {.rank = s->rank};
  lm_edge_index(g, e, idx, &ctx, &r.flat, &r.valid);
  for (int i = 0; i < s->rank; i++) {
    int64_t dv;
    if (lm_x_step(&g->x, r.flat, i, s->rank, &r.step[i]) && lm_x_step(&g->x, r.valid, i, s->rank, &dv) && !dv)
      r.stepped |= 1u << i;
  }
  return r;
}

static void ref_unprepare(void *ctx, void *p) {
  (void)ctx;
  ref_exe *x = p;
  if (!x) return;
  lm_free(x->order);
  lm_free(x->edges);
  lm_free(x->out_edges);
  lm_free(x->assign_edges);
  lm_free(x->per_step);
  lm_free(x);
}

static lm_status ref_prepare(void *ctx, lm_graph_t *g, const lm_scan_info *scan, void **out) {
  ref_exe *x = lm_calloc(1, sizeof *x);
  if (!x) return LM_ERR_NOMEM;
  x->g = g;
  if (scan->active) {
    x->scan = *scan;
    x->per_step = lm_calloc(g->ninputs + 1, 1);
    if (!x->per_step) {
      ref_unprepare(ctx, x);
      return LM_ERR_NOMEM;
    }
    memcpy(x->per_step, scan->per_step, g->ninputs);
    x->scan.per_step = x->per_step;
  }
  x->order = lm_graph_topo_order(g, &x->norder);
  x->edges = lm_calloc(g->nnodes, sizeof *x->edges);
  x->out_edges = lm_calloc(g->noutputs + 1, sizeof *x->out_edges);
  x->assign_edges = lm_calloc(g->nassigns + 1, sizeof *x->assign_edges);
  if (!x->order || !x->edges || !x->out_edges || !x->assign_edges) {
    ref_unprepare(ctx, x);
    return LM_ERR_NOMEM;
  }
  for (size_t i = 1; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nsrc; k++) x->edges[i][k] = edge_exprs(g, g->nodes[i].src[k]);
  for (size_t i = 0; i < g->noutputs; i++) x->out_edges[i] = edge_exprs(g, g->outputs[i].src);
  for (size_t i = 0; i < g->nassigns; i++) x->assign_edges[i] = edge_exprs(g, g->assigns[i].src);
  if (g->x.failed) {
    ref_unprepare(ctx, x);
    return lm_fail(LM_ERR_NOMEM, "out of memory building index expressions");
  }
  *out = x;
  return LM_OK;
}

static size_t numel(const lm_graph_t *g, const lm_shape *s, const int64_t *syms, int64_t *dims) {
  size_t n = 1;
  for (int i = 0; i < s->rank; i++) {
    dims[i] = lm_x_eval(&g->x, s->dim[i], NULL, syms);
    n *= (size_t)dims[i];
  }
  return n;
}

/* Advances a row-major multi-index; returns 0 after the last one. */
static int next_index(int64_t *idx, const int64_t *dims, int rank) {
  for (int i = rank - 1; i >= 0; i--) {
    if (++idx[i] < dims[i]) return 1;
    idx[i] = 0;
  }
  return 0;
}

/* The table of edge e over a domain of dims: each combination of the vars that are not stepped,
 * the stepped ones at 0. 0 when memory ran out. */
static int tab_make(const lm_graph_t *g, const ref_edge *e, const int64_t *dims, const int64_t *syms, ref_tab *t) {
  int64_t idx[LM_MAX_RANK] = {0}, n = 1;
  *t = (ref_tab){.e = e};
  for (int i = e->rank - 1; i >= 0; i--)
    if (!(e->stepped >> i & 1)) {
      t->stride[i] = n;
      if ((n *= dims[i]) > TAB_MAX) return 1; /* no table: evaluated per read */
    }
  if (!n) return 1;
  if (!(t->flat = lm_malloc((size_t)n * sizeof *t->flat))) return 0;
  for (int64_t k = 0; k < n; k++) {
    for (int i = 0; i < e->rank; i++) idx[i] = e->stepped >> i & 1 ? 0 : k / t->stride[i] % dims[i];
    t->flat[k] = lm_x_eval(&g->x, e->valid, idx, syms) ? lm_x_eval(&g->x, e->flat, idx, syms) : -1;
  }
  t->n = n;
  return 1;
}

static float read_edge(const lm_graph_t *g, const ref_tab *t, const float *src, const int64_t *idx,
                       const int64_t *syms) {
  const ref_edge *e = t->e;
  if (!t->n) {
    if (!lm_x_eval(&g->x, e->valid, idx, syms)) return 0.0f;
    return src[lm_x_eval(&g->x, e->flat, idx, syms)];
  }
  int64_t k = 0, step = 0;
  for (int i = 0; i < e->rank; i++)
    if (e->stepped >> i & 1) step += e->step[i] * idx[i];
    else k += t->stride[i] * idx[i];
  return t->flat[k] < 0 ? 0.0f : src[t->flat[k] + step];
}

/* The reads of edge t at idx along the last axis (idx's last index 0, left so): w values. */
static void read_row(const lm_graph_t *g, const ref_tab *t, const float *src, int64_t *idx, int rank, size_t w,
                     const int64_t *syms, float *dst) {
  const ref_edge *e = t->e;
  int last = rank - 1;
  if (!t->n || !rank) {
    for (size_t j = 0; j < w; j++) {
      if (rank) idx[last] = (int64_t)j;
      dst[j] = read_edge(g, t, src, idx, syms);
    }
    if (rank) idx[last] = 0;
    return;
  }
  int64_t k = 0, step = 0, dk = 0, ds = 0;
  for (int i = 0; i < last; i++)
    if (e->stepped >> i & 1) step += e->step[i] * idx[i];
    else k += t->stride[i] * idx[i];
  if (e->stepped >> last & 1) ds = e->step[last];
  else dk = t->stride[last];
  for (size_t j = 0; j < w; j++) {
    int64_t f = t->flat[k + (int64_t)j * dk];
    dst[j] = f < 0 ? 0.0f : src[f + step + (int64_t)j * ds];
  }
}

/* Gathers an edge (with its view) into a contiguous array of the viewed shape; 0 when memory ran
 * out. */
static int gather(const lm_graph_t *g, lm_edge e, const ref_edge *re, float *const *vals, float *dst,
                  const int64_t *syms) {
  const lm_shape *s = lm_edge_shape(g, e);
  int64_t dims[LM_MAX_RANK], idx[LM_MAX_RANK] = {0};
  size_t n = numel(g, s, syms, dims);
  ref_tab t;
  if (!n) return 1;
  if (!tab_make(g, re, dims, syms, &t)) return 0;
  size_t k = 0;
  do dst[k++] = read_edge(g, &t, vals[e.node], idx, syms);
  while (next_index(idx, dims, s->rank));
  lm_free(t.flat);
  return 1;
}

static float apply1(lm_op op, float a) {
  switch (op) {
  case LM_OP_LOG2: return log2f(a);
  case LM_OP_EXP2: return exp2f(a);
  case LM_OP_SIN: return sinf(a);
  case LM_OP_SQRT: return sqrtf(a);
  case LM_OP_RECIP: return 1.0f / a;
  case LM_OP_CONTIGUOUS: return a;
  default: LM_ASSERT(!"not a unary op"); return 0;
  }
}

static float apply2(lm_op op, float a, float b) {
  switch (op) {
  case LM_OP_ADD: return a + b;
  case LM_OP_MUL: return a * b;
  case LM_OP_MOD: return fmodf(a, b);
  case LM_OP_LESS_THAN: return a < b ? 1.0f : 0.0f;
  default: LM_ASSERT(!"not a binary op"); return 0;
  }
}

/* A graph that promises finite values (lm_graph_promise_finite): the first value that is not,
 * named, since compiled kernels may then print its selects as selects and differ here. */
static lm_status check_finite(const lm_graph_t *g, uint32_t id, const float *v, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!isfinite(v[i])) {
      const lm_node *n = &g->nodes[id];
      const char *what = n->op == LM_OP_INPUT ? g->inputs[n->input].name : lm_op_table[n->op].name;
      return lm_fail(LM_ERR_INVALID,
                     "a graph that promises finite values (lm_graph_promise_finite) %s %g at element %zu of "
                     "node %u (%s)", n->op == LM_OP_INPUT ? "was given" : "computed", (double)v[i], i, id, what);
    }
  return LM_OK;
}

static lm_status ref_step(void *ctx, void *p, const lm_run_args *args) {
  (void)ctx;
  ref_exe *x = p;
  lm_graph_t *g = x->g;
  const int64_t *syms = args->syms;
  lm_status st = LM_OK;
  float **vals = lm_calloc(g->nnodes, sizeof *vals);
  float **pending = lm_calloc(g->nassigns + 1, sizeof *pending);
  if (!vals || !pending) {
    st = LM_ERR_NOMEM;
    goto done;
  }
  for (size_t oi = 0; oi < x->norder; oi++) {
    uint32_t id = x->order[oi];
    const lm_node *n = &g->nodes[id];
    int64_t dims[LM_MAX_RANK], idx[LM_MAX_RANK] = {0};
    size_t count = numel(g, &n->shape, syms, dims);
    if (n->op == LM_OP_INPUT) {
      vals[id] = args->inputs[n->input];
      if (g->finite && (st = check_finite(g, id, vals[id], count)) != LM_OK) goto done;
      continue;
    }
    float *out = lm_malloc((count ? count : 1) * sizeof *out);
    if (!out) {
      st = LM_ERR_NOMEM;
      goto done;
    }
    vals[id] = out;
    lm_op op = (lm_op)n->op;
    switch (op) {
    case LM_OP_CONST: out[0] = n->value; break;
    case LM_OP_RAND: lm_rand_fill_uniform(args->seed, n->stream, args->run, 0, out, count); break;
    case LM_OP_SUM_REDUCE:
    case LM_OP_MAX_REDUCE: {
      const lm_shape *ss = lm_edge_shape(g, n->src[0]);
      int64_t sdims[LM_MAX_RANK], sidx[LM_MAX_RANK] = {0};
      size_t scount = numel(g, ss, syms, sdims);
      for (size_t i = 0; i < count; i++) out[i] = op == LM_OP_SUM_REDUCE ? 0.0f : -INFINITY;
      if (!scount) break;
      ref_tab t;
      if (!tab_make(g, &x->edges[id][0], sdims, syms, &t)) {
        st = LM_ERR_NOMEM;
        goto done;
      }
      do {
        float v = read_edge(g, &t, vals[n->src[0].node], sidx, syms);
        size_t o = 0;
        for (int a = 0; a < ss->rank; a++)
          if (a != n->axis) o = o * (size_t)sdims[a] + (size_t)sidx[a];
        out[o] = op == LM_OP_SUM_REDUCE ? out[o] + v : fmaxf(out[o], v);
      } while (next_index(sidx, sdims, ss->rank));
      lm_free(t.flat);
      break;
    }
    default: {
      if (!count) break;
      ref_tab t[2] = {0};
      if (!tab_make(g, &x->edges[id][0], dims, syms, &t[0]) ||
          (n->nsrc > 1 && !tab_make(g, &x->edges[id][1], dims, syms, &t[1]))) {
        lm_free(t[0].flat);
        st = LM_ERR_NOMEM;
        goto done;
      }
      int r = n->shape.rank;
      size_t w = r ? (size_t)dims[r - 1] : 1; /* row by row along the last axis */
      float *row = lm_malloc(2 * w * sizeof *row);
      if (!row) {
        lm_free(t[0].flat), lm_free(t[1].flat);
        st = LM_ERR_NOMEM;
        goto done;
      }
      for (size_t i = 0; i < count; i += w) {
        read_row(g, &t[0], vals[n->src[0].node], idx, r, w, syms, row);
        if (n->nsrc == 1)
          for (size_t j = 0; j < w; j++) out[i + j] = apply1(op, row[j]);
        else {
          read_row(g, &t[1], vals[n->src[1].node], idx, r, w, syms, row + w);
          for (size_t j = 0; j < w; j++) out[i + j] = apply2(op, row[j], row[w + j]);
        }
        if (r) idx[r - 1] = dims[r - 1] - 1;
        next_index(idx, dims, r); /* the next row's first element */
      }
      lm_free(row);
      lm_free(t[0].flat);
      lm_free(t[1].flat);
    }
    }
    if (g->finite && (st = check_finite(g, id, out, op == LM_OP_CONST ? 1 : count)) != LM_OK) goto done;
  }
  for (size_t i = 0; i < g->noutputs; i++)
    if (!gather(g, g->outputs[i].src, &x->out_edges[i], vals, args->outputs[i], syms)) {
      st = LM_ERR_NOMEM;
      goto done;
    }
  for (size_t i = 0; i < g->nassigns; i++) {
    int64_t dims[LM_MAX_RANK];
    size_t count = numel(g, &g->nodes[g->assigns[i].target].shape, syms, dims);
    if (!(pending[i] = lm_malloc((count ? count : 1) * sizeof(float)))) {
      st = LM_ERR_NOMEM;
      goto done;
    }
    if (!gather(g, g->assigns[i].src, &x->assign_edges[i], vals, pending[i], syms)) {
      st = LM_ERR_NOMEM;
      goto done;
    }
  }
  for (size_t i = 0; i < g->nassigns; i++) {
    const lm_node *t = &g->nodes[g->assigns[i].target];
    int64_t dims[LM_MAX_RANK];
    memcpy(args->inputs[t->input], pending[i], numel(g, &t->shape, syms, dims) * sizeof(float));
  }
done:
  if (vals)
    for (size_t i = 1; i < g->nnodes; i++)
      if (g->nodes[i].op != LM_OP_INPUT) lm_free(vals[i]);
  if (pending)
    for (size_t i = 0; i < g->nassigns; i++) lm_free(pending[i]);
  lm_free(vals);
  lm_free(pending);
  return st;
}

static lm_status ref_run(void *ctx, void *p, const lm_run_args *args) {
  ref_exe *x = p;
  return x->scan.active ? lm_scan_by_steps(ctx, p, x->g, &x->scan, args, ref_step) : ref_step(ctx, p, args);
}

static lm_status ref_sync(void *ctx) {
  (void)ctx;
  return LM_OK;
}

const lm_backend_ops lm_backend_ref = {
    .name = "ref",
    .description = "reference interpreter (unfused, primitive by primitive)",
    .open = ref_open,
    .close = ref_close,
    .alloc = ref_alloc,
    .release = ref_release,
    .write = ref_write,
    .read = ref_read,
    .fill_zero = ref_zero,
    .host_memory = 1,
    .prepare = ref_prepare,
    .unprepare = ref_unprepare,
    .run = ref_run,
    .sync = ref_sync,
};
