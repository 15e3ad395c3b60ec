/* compiler/runtime.c — backends and programs: the backend registry, symbol bindings,
 * host-visible input/output buffers sized from the bindings, and runs. */
#include <stdio.h>
#include <string.h>

#include "backends/backend.h"
#include "lumen/runtime.h"
#include "validate.h"

/* In preference order for "auto": GPUs first, then the cpu, then the interpreter. OpenCL
 * comes last so auto never picks it (PoCL would win over ref when no C compiler works);
 * ask for it by name. */
static const lm_backend_ops *const registry[] = {
    &lm_backend_cuda, &lm_backend_metal, &lm_backend_cpu, &lm_backend_ref, &lm_backend_opencl,
};

struct lm_backend {
  const lm_backend_ops *ops;
  void *ctx;
};

typedef struct buffer {
  void *buf;
  size_t count; /* elements */
  int written;  /* data inputs: written since (re)allocation */
  struct lm_program *owner; /* linked: the buffer belongs to this program's input/output */
  int owner_index, owner_output;
} buffer;

struct lm_program {
  lm_backend_t *b;
  lm_graph_t *g;
  void *exe;
  int64_t *syms;
  uint8_t *bound;
  buffer *in, *out;
  void **in_ptrs, **out_ptrs;
  uint64_t seed, run;
  lm_scan_info scan;
  uint8_t *per_step; /* per input */
  uint64_t unchecked; /* symbols rebound since the bindings last passed (a bit each, as lm_x_syms_used) */
  int checked;        /* a full check has passed: later ones cover what `unchecked` reaches */
  uint64_t *check_masks; /* lm_graph_binding_masks, made at the first partial check */
};

int lm_backend_count(void) { return (int)LM_COUNTOF(registry); }

const char *lm_backend_name_at(int i) {
  return i >= 0 && i < lm_backend_count() ? registry[i]->name : NULL;
}

lm_backend_t *lm_backend_new(const char *name) {
  const lm_backend_ops *ops = NULL;
  for (size_t i = 0; i < LM_COUNTOF(registry); i++)
    if (name && !strcmp(registry[i]->name, name)) ops = registry[i];
  if (!ops) {
    lm_sb known = {0};
    for (size_t i = 0; i < LM_COUNTOF(registry); i++) lm_sb_printf(&known, "%s%s", i ? ", " : "", registry[i]->name);
    lm_fail(LM_ERR_UNSUPPORTED, "unknown backend '%s' (this build has: %s)", name ? name : "(null)",
            known.s ? known.s : "");
    lm_sb_free(&known);
    return NULL;
  }
  lm_backend_t *b = lm_calloc(1, sizeof *b);
  if (!b) return NULL;
  b->ops = ops;
  if (ops->open(&b->ctx) != LM_OK) {
    lm_free(b);
    return NULL;
  }
  return b;
}

const lm_backend_ops *lm_backend_parts(lm_backend_t *b, void **ctx) {
  if (ctx) *ctx = b ? b->ctx : NULL;
  return b ? b->ops : NULL;
}

void lm_backend_free(lm_backend_t *b) {
  if (!b) return;
  b->ops->close(b->ctx);
  lm_free(b);
}

const char *lm_backend_name(const lm_backend_t *b) { return b ? b->ops->name : NULL; }

/* ---------------------------------------------------------------- programs */

static lm_program_t *program_create(lm_backend_t *b, const lm_graph_t *g, const char *T, int reverse,
                                    const char *const *per_step, int n_per_step) {
  if (!b || !g) {
    lm_fail(LM_ERR_INVALID, "lm_program_new: %s is NULL", b ? "graph" : "backend");
    return NULL;
  }
  if (lm_graph_validate(g) != LM_OK) return NULL;
  lm_program_t *p = lm_calloc(1, sizeof *p);
  if (!p) return NULL;
  p->b = b;
  p->g = lm_graph_clone(g);
  if (!p->g) goto fail;
  size_t ni = p->g->ninputs, no = p->g->noutputs;
  p->per_step = lm_calloc(ni + 1, 1);
  if (!p->per_step) goto fail;
  if (T) {
    if (!*T) {
      lm_fail(LM_ERR_INVALID, "scan: empty name for T");
      goto fail;
    }
    int sym = lm_x_symbol(&p->g->x, T, 1);
    if (sym < 0) goto fail;
    for (int i = 0; i < n_per_step; i++) {
      int k = -1;
      for (size_t j = 0; j < ni; j++)
        if (!strcmp(p->g->inputs[j].name, per_step[i])) k = (int)j;
      if (k < 0) {
        lm_fail(LM_ERR_INVALID, "scan: the step graph has no input named '%s'", per_step[i]);
        goto fail;
      }
      if (p->g->inputs[k].role != LM_ROLE_DATA) {
        lm_fail(LM_ERR_INVALID, "scan: per-step input '%s' is %s; only data inputs are fed per step", per_step[i],
                lm_role_name((lm_role)p->g->inputs[k].role));
        goto fail;
      }
      p->per_step[k] = 1;
    }
    p->scan = (lm_scan_info){1, sym, reverse != 0, p->per_step};
  }
  size_t ns = p->g->x.nsyms;
  p->syms = lm_calloc(ns + 1, sizeof *p->syms);
  p->bound = lm_calloc(ns + 1, 1);
  p->in = lm_calloc(ni + 1, sizeof *p->in);
  p->out = lm_calloc(no + 1, sizeof *p->out);
  p->in_ptrs = lm_calloc(ni + 1, sizeof *p->in_ptrs);
  p->out_ptrs = lm_calloc(no + 1, sizeof *p->out_ptrs);
  if (!p->syms || !p->bound || !p->in || !p->out || !p->in_ptrs || !p->out_ptrs) goto fail;
  if (b->ops->prepare(b->ctx, p->g, &p->scan, &p->exe) != LM_OK) goto fail;
  return p;
fail:
  lm_program_free(p);
  return NULL;
}

lm_program_t *lm_program_new(lm_backend_t *b, const lm_graph_t *g) { return program_create(b, g, NULL, 0, NULL, 0); }

lm_program_t *lm_program_new_scan(lm_backend_t *b, const lm_graph_t *step, const char *T, int reverse,
                                  const char *const *per_step, int n_per_step) {
  if (!T) {
    lm_fail(LM_ERR_INVALID, "scan: T is NULL");
    return NULL;
  }
  return program_create(b, step, T, reverse, per_step, n_per_step);
}

static void release(lm_program_t *p, buffer *bf) {
  if (bf->owner) { /* a linked buffer is the owner's: only forget the pointer */
    bf->buf = NULL;
    bf->count = 0;
    return;
  }
  if (bf->buf) p->b->ops->release(p->b->ctx, bf->buf);
  *bf = (buffer){0};
}

void lm_program_free(lm_program_t *p) {
  if (!p) return;
  if (p->g) {
    for (size_t i = 0; p->in && i < p->g->ninputs; i++) release(p, &p->in[i]);
    for (size_t i = 0; p->out && i < p->g->noutputs; i++) release(p, &p->out[i]);
    if (p->exe) p->b->ops->unprepare(p->b->ctx, p->exe);
  }
  lm_graph_free(p->g);
  lm_free(p->syms);
  lm_free(p->bound);
  lm_free(p->check_masks);
  lm_free(p->in);
  lm_free(p->out);
  lm_free(p->in_ptrs);
  lm_free(p->out_ptrs);
  lm_free(p->per_step);
  lm_free(p);
}

void lm_program_set_seed(lm_program_t *p, uint64_t seed) { p->seed = seed; }
void lm_program_set_run(lm_program_t *p, uint64_t run) { p->run = run; }
uint64_t lm_program_run_index(const lm_program_t *p) { return p->run; }

/* The first symbol in e that is not bound, or -1. */
static int unbound_symbol(const lm_program_t *p, lm_expr e) {
  const lm_xnode *n = lm_x_node(&p->g->x, e);
  switch (n->op) {
  case LM_X_CONST:
  case LM_X_VAR: return -1;
  case LM_X_SYM: return p->bound[n->v] ? -1 : (int)n->v;
  default: {
    int k = unbound_symbol(p, n->a);
    return k >= 0 ? k : unbound_symbol(p, n->b);
  }
  }
}

/* What an error names: "input 'x'" (kind and name), or a name alone (kind NULL). Formatted only
 * when there is an error: a program's run checks every buffer, and runs are cheap. */
typedef struct named {
  const char *kind, *name;
} named;
#define NAMED_FMT "%s%s%s%s"
#define NAMED_ARGS(w) (w).kind ? (w).kind : "", (w).kind ? " '" : "", (w).name, (w).kind ? "'" : ""

/* Element count of a shape, or an error naming the unbound symbol. */
/* With steps, the count of a [T, ...] buffer of a scan. */
static lm_status shape_count_steps(lm_program_t *p, const lm_shape *s, named what, int steps, size_t *count) {
  const lm_exprs *x = &p->g->x;
  size_t n = 1;
  if (steps && p->scan.active) {
    if (!p->bound[p->scan.sym_T])
      return lm_fail(LM_ERR_INVALID, NAMED_FMT ": symbol %s (the scan length) is not bound", NAMED_ARGS(what),
                     x->syms[p->scan.sym_T].name);
    n = (size_t)p->syms[p->scan.sym_T];
  }
  for (int i = 0; i < s->rank; i++) {
    int k = unbound_symbol(p, s->dim[i]);
    if (k >= 0) return lm_fail(LM_ERR_INVALID, NAMED_FMT ": symbol %s is not bound", NAMED_ARGS(what), x->syms[k].name);
    int64_t d = lm_x_eval(x, s->dim[i], NULL, p->syms);
    if (d < 0)
      return lm_fail(LM_ERR_INVALID, NAMED_FMT ": dimension %d evaluates to %lld", NAMED_ARGS(what), i, (long long)d);
    n *= (size_t)d;
  }
  *count = n;
  return LM_OK;
}

static int find_input(const lm_graph_t *g, const char *name) {
  for (size_t i = 0; i < g->ninputs; i++)
    if (!strcmp(g->inputs[i].name, name)) return (int)i;
  return -1;
}

static int find_output(const lm_graph_t *g, const char *name) {
  for (size_t i = 0; i < g->noutputs; i++)
    if (!strcmp(g->outputs[i].name, name)) return (int)i;
  return -1;
}

/* Makes sure the buffer matches the current bindings; persistent inputs start at zero. */
static lm_status ensure(lm_program_t *p, buffer *bf, const lm_shape *s, named what, int zero, int steps) {
  size_t count;
  lm_status st = shape_count_steps(p, s, what, steps, &count);
  if (st != LM_OK) return st;
  if (bf->buf && bf->count == count) return LM_OK;
  release(p, bf);
  st = p->b->ops->alloc(p->b->ctx, (count ? count : 1) * sizeof(float), &bf->buf);
  if (st != LM_OK) return st;
  bf->count = count;
  if (zero) st = p->b->ops->fill_zero(p->b->ctx, bf->buf, (count ? count : 1) * sizeof(float));
  return st;
}

static lm_status ensure_input(lm_program_t *p, int i);
static lm_status ensure_output(lm_program_t *p, int i);

/* A linked input takes the owner's current buffer, which must hold as many elements. */
static lm_status resolve_link(lm_program_t *p, int i) {
  buffer *bf = &p->in[i];
  lm_program_t *o = bf->owner;
  lm_status st = bf->owner_output ? ensure_output(o, bf->owner_index) : ensure_input(o, bf->owner_index);
  if (st != LM_OK) return st;
  const buffer *ob = bf->owner_output ? &o->out[bf->owner_index] : &o->in[bf->owner_index];
  size_t count;
  st = shape_count_steps(p, &p->g->nodes[p->g->inputs[i].node].shape, (named){NULL, p->g->inputs[i].name},
                         p->per_step[i], &count);
  if (st != LM_OK) return st;
  if (count != ob->count)
    return lm_fail(LM_ERR_INVALID, "input '%s' is linked to a buffer of %zu elements but needs %zu", p->g->inputs[i].name,
                   ob->count, count);
  bf->buf = ob->buf;
  bf->count = count;
  bf->written = 1;
  return LM_OK;
}

static lm_status ensure_input(lm_program_t *p, int i) {
  const lm_input_info *in = &p->g->inputs[i];
  if (p->in[i].owner) return resolve_link(p, i);
  return ensure(p, &p->in[i], &p->g->nodes[in->node].shape, (named){"input", in->name}, in->role != LM_ROLE_DATA,
                p->per_step[i]);
}

static lm_status ensure_output(lm_program_t *p, int i) {
  return ensure(p, &p->out[i], lm_edge_shape(p->g, p->g->outputs[i].src), (named){"output", p->g->outputs[i].name}, 0, 1);
}

lm_status lm_program_bind(lm_program_t *p, const char *symbol, int64_t value) {
  lm_exprs *x = &p->g->x;
  size_t k = 0;
  while (k < x->nsyms && strcmp(x->syms[k].name, symbol)) k++;
  if (k == x->nsyms) return lm_fail(LM_ERR_INVALID, "bind: the graph has no symbol '%s'", symbol);
  if (value < x->syms[k].least)
    return lm_fail(LM_ERR_INVALID, "bind: %s = %lld is below its least value %lld", symbol, (long long)value,
                   (long long)x->syms[k].least);
  if (p->bound[k] && p->syms[k] == value) return LM_OK;
  p->syms[k] = value;
  p->bound[k] = 1;
  p->unchecked |= 1ull << (k < 63 ? k : 63);
  /* buffers whose size changed are reallocated on next use; data must be rewritten */
  for (size_t i = 0; i < p->g->ninputs; i++) {
    size_t count;
    const lm_shape *s = &p->g->nodes[p->g->inputs[i].node].shape;
    if (p->in[i].buf && (shape_count_steps(p, s, (named){NULL, "input"}, p->per_step[i], &count) != LM_OK || count != p->in[i].count))
      release(p, &p->in[i]);
  }
  lm_clear_error();
  return LM_OK;
}

lm_status lm_program_numel(lm_program_t *p, const char *name, size_t *count) {
  int i = find_input(p->g, name);
  if (i >= 0) return shape_count_steps(p, &p->g->nodes[p->g->inputs[i].node].shape, (named){NULL, name}, p->per_step[i], count);
  if ((i = find_output(p->g, name)) >= 0)
    return shape_count_steps(p, lm_edge_shape(p->g, p->g->outputs[i].src), (named){NULL, name}, 1, count);
  return lm_fail(LM_ERR_INVALID, "the program has no input or output named '%s'", name);
}

lm_status lm_program_write(lm_program_t *p, const char *name, const float *src, size_t count) {
  int i = find_input(p->g, name);
  if (i < 0) return lm_fail(LM_ERR_INVALID, "write: the program has no input named '%s'", name);
  lm_status st = ensure_input(p, i);
  if (st != LM_OK) return st;
  if (count != p->in[i].count)
    return lm_fail(LM_ERR_INVALID, "write: input '%s' holds %zu elements, got %zu", name, p->in[i].count, count);
  st = count ? p->b->ops->write(p->b->ctx, p->in[i].buf, src, count * sizeof(float)) : LM_OK;
  if (st == LM_OK) p->in[i].written = 1;
  return st;
}

lm_status lm_program_read(lm_program_t *p, const char *name, float *dst, size_t count) {
  buffer *bf;
  int i = find_output(p->g, name);
  if (i >= 0) {
    bf = &p->out[i];
    if (!bf->buf) return lm_fail(LM_ERR_INVALID, "read: output '%s' has not been computed yet (run first)", name);
  } else if ((i = find_input(p->g, name)) >= 0) {
    lm_status st = ensure_input(p, i);
    if (st != LM_OK) return st;
    bf = &p->in[i];
    if (p->g->inputs[i].role == LM_ROLE_DATA && !bf->written)
      return lm_fail(LM_ERR_INVALID, "read: data input '%s' was never written", name);
  } else return lm_fail(LM_ERR_INVALID, "read: the program has no input or output named '%s'", name);
  if (count != bf->count)
    return lm_fail(LM_ERR_INVALID, "read: '%s' holds %zu elements, asked for %zu", name, bf->count, count);
  return count ? p->b->ops->read(p->b->ctx, bf->buf, dst, count * sizeof(float)) : LM_OK;
}

lm_status lm_program_buffer(lm_program_t *p, const char *name, lm_buffer_view *out) {
  memset(out, 0, sizeof *out);
  buffer *bf;
  lm_status st;
  int i = find_output(p->g, name);
  if (i >= 0) {
    if ((st = ensure_output(p, i)) != LM_OK) return st;
    bf = &p->out[i];
  } else if ((i = find_input(p->g, name)) >= 0) {
    if ((st = ensure_input(p, i)) != LM_OK) return st;
    bf = &p->in[i];
    bf->written = 1;
  } else return lm_fail(LM_ERR_INVALID, "buffer: the program has no input or output named '%s'", name);
  out->native = bf->buf;
  out->host = p->b->ops->host_memory ? bf->buf : NULL;
  out->count = bf->count;
  return LM_OK;
}

void *lm_backend_queue(lm_backend_t *b) { return b && b->ops->queue ? b->ops->queue(b->ctx) : NULL; }
const char *lm_backend_device_id(lm_backend_t *b) { return b && b->ops->device_id ? b->ops->device_id(b->ctx) : NULL; }

lm_status lm_program_run(lm_program_t *p) {
  lm_status st;
  if (!p->checked || p->unchecked) { /* once per change of the bindings */
    if (p->checked && !p->check_masks) p->check_masks = lm_graph_binding_masks(p->g); /* NULL: walk all */
    const uint64_t *masks = p->checked ? p->check_masks : NULL;
    if ((st = lm_graph_check_bindings_of(p->g, p->syms, p->bound, p->unchecked, masks)) != LM_OK) return st;
    p->checked = 1;
    p->unchecked = 0;
  }
  for (size_t i = 0; i < p->g->ninputs; i++) {
    if ((st = ensure_input(p, (int)i)) != LM_OK) return st;
    if (p->g->inputs[i].role == LM_ROLE_DATA && !p->in[i].written)
      return lm_fail(LM_ERR_INVALID, "run: data input '%s' was not written", p->g->inputs[i].name);
    p->in_ptrs[i] = p->in[i].buf;
  }
  for (size_t i = 0; i < p->g->noutputs; i++) {
    if ((st = ensure_output(p, (int)i)) != LM_OK) return st;
    p->out_ptrs[i] = p->out[i].buf;
  }
  lm_run_args args = {p->syms, p->in_ptrs, p->out_ptrs, p->seed, p->run};
  st = p->b->ops->run(p->b->ctx, p->exe, &args);
  if (st == LM_OK) p->run++;
  return st;
}

lm_status lm_program_get_stats(lm_program_t *p, lm_program_stats *stats) {
  memset(stats, 0, sizeof *stats);
  for (size_t k = 0; k < p->g->x.nsyms; k++)
    if (!p->bound[k]) return lm_fail(LM_ERR_INVALID, "stats: symbol %s is not bound", p->g->x.syms[k].name);
  return p->b->ops->stats ? p->b->ops->stats(p->b->ctx, p->exe, p->syms, stats) : LM_OK;
}

lm_status lm_scan_by_steps(void *ctx, void *exe, const lm_graph_t *g, const lm_scan_info *scan,
                           const lm_run_args *args, lm_step_fn run_step) {
  size_t ni = g->ninputs, no = g->noutputs;
  int64_t T = args->syms[scan->sym_T];
  size_t *in_step = lm_calloc(ni + 1, sizeof *in_step), *out_step = lm_calloc(no + 1, sizeof *out_step);
  void **ins = lm_calloc(ni + 1, sizeof *ins), **outs = lm_calloc(no + 1, sizeof *outs);
  lm_status st = LM_ERR_NOMEM;
  if (!in_step || !out_step || !ins || !outs) goto done;
  for (size_t i = 0; i < ni; i++)
    if (scan->per_step[i]) in_step[i] = (size_t)lm_x_eval(&g->x, lm_shape_numel((lm_graph_t *)g, &g->nodes[g->inputs[i].node].shape), NULL, args->syms);
  for (size_t i = 0; i < no; i++)
    out_step[i] = (size_t)lm_x_eval(&g->x, lm_shape_numel((lm_graph_t *)g, lm_edge_shape(g, g->outputs[i].src)), NULL, args->syms);
  st = LM_OK;
  for (int64_t s = 0; s < T && st == LM_OK; s++) {
    int64_t t = scan->reverse ? T - 1 - s : s;
    for (size_t i = 0; i < ni; i++) ins[i] = (float *)args->inputs[i] + (size_t)t * in_step[i];
    for (size_t i = 0; i < no; i++) outs[i] = (float *)args->outputs[i] + (size_t)t * out_step[i];
    lm_run_args a = {args->syms, ins, outs, args->seed, args->run * (uint64_t)T + (uint64_t)t};
    st = run_step(ctx, exe, &a);
  }
done:
  lm_free(in_step);
  lm_free(out_step);
  lm_free(ins);
  lm_free(outs);
  return st;
}

lm_backend_t *lm_backend_open(const char *name, char *why, size_t why_cap) {
  char note[1024] = "";
  if (name && strcmp(name, "auto")) {
    lm_backend_t *b = lm_backend_new(name);
    if (b && why && why_cap) snprintf(why, why_cap, "%s: requested", name);
    return b;
  }
  for (size_t i = 0; i < LM_COUNTOF(registry); i++) {
    lm_backend_t *b = lm_backend_new(registry[i]->name);
    if (b) {
      if (why && why_cap)
        snprintf(why, why_cap, "%s, the first backend this machine can run%s%s%s", registry[i]->name,
                 note[0] ? " (" : "", note, note[0] ? ")" : "");
      return b;
    }
    size_t used = strlen(note);
    snprintf(note + used, sizeof note - used, "%s%s unavailable: %s", used ? "; " : "", registry[i]->name, lm_last_error());
  }
  lm_fail(LM_ERR_UNSUPPORTED, "no backend could be opened: %s", note);
  return NULL;
}

lm_status lm_program_link(lm_program_t *p, const char *name, lm_program_t *owner, const char *owner_name) {
  int i = find_input(p->g, name);
  if (i < 0) return lm_fail(LM_ERR_INVALID, "link: the program has no input named '%s'", name);
  if (!owner || owner == p) return lm_fail(LM_ERR_INVALID, "link: input '%s' needs another program to link to", name);
  if (owner->b != p->b) return lm_fail(LM_ERR_INVALID, "link: input '%s': the programs use different backends", name);
  int k = find_input(owner->g, owner_name), out = 0;
  if (k < 0 && (k = find_output(owner->g, owner_name)) >= 0) out = 1;
  if (k < 0) return lm_fail(LM_ERR_INVALID, "link: the owner has no input or output named '%s'", owner_name);
  if (out ? owner->out[k].owner != NULL : owner->in[k].owner != NULL)
    return lm_fail(LM_ERR_INVALID, "link: '%s' of the owner is itself linked; link to its owner", owner_name);
  release(p, &p->in[i]);
  p->in[i] = (buffer){.owner = owner, .owner_index = k, .owner_output = out};
  return LM_OK;
}

int lm_program_input_count(const lm_program_t *p) { return (int)p->g->ninputs; }
const char *lm_program_input_name(const lm_program_t *p, int i) {
  return i >= 0 && (size_t)i < p->g->ninputs ? p->g->inputs[i].name : NULL;
}
lm_role lm_program_input_role(const lm_program_t *p, int i) {
  return i >= 0 && (size_t)i < p->g->ninputs ? (lm_role)p->g->inputs[i].role : LM_ROLE_COUNT;
}
