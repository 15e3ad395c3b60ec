/* compiler/search/term.c — the kernel term language (term.h): interning of pieces and
 * attributes, the per-class analysis, converting a loop-IR kernel into a term, and the text
 * form of extracted terms (what the tuning cache stores). */
#include "search/term.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sk_op_names[SK_COUNT] = {
    "nop", "seq", "loop", "store", "kernel", "const", "load", "rand", "select", "log2",
    "exp2", "sin", "sqrt", "recip", "add",  "mul",   "mod",  "lt",   "red",
};

/* ---------------------------------------------------------------- interning */

static uint64_t rec_hash(const void *p, size_t n) { return lm_hash_bytes(p, n, 0x51ED270B27ull); }

uint32_t sk_lookup(const sk_tab *t, const void *rec) {
  if (!t->hcap) return UINT32_MAX;
  size_t mask = t->hcap - 1, i = (size_t)rec_hash(rec, t->rsize) & mask;
  for (;;) {
    uint32_t e = t->ht[i];
    if (!e) return UINT32_MAX;
    if (!memcmp(t->rec + (size_t)(e - 1) * t->rsize, rec, t->rsize)) return e - 1;
    i = (i + 1) & mask;
  }
}

uint32_t sk_intern(sk_tab *t, const void *rec) {
  uint32_t id = sk_lookup(t, rec);
  if (id != UINT32_MAX) return id;
  if ((t->n + 1) * 2 > t->hcap) {
    size_t nc = t->hcap ? t->hcap * 2 : 64;
    uint32_t *h = lm_calloc(nc, sizeof *h);
    if (!h) return UINT32_MAX;
    for (size_t i = 0; i < t->n; i++) {
      size_t j = (size_t)rec_hash(t->rec + i * t->rsize, t->rsize) & (nc - 1);
      while (h[j]) j = (j + 1) & (nc - 1);
      h[j] = (uint32_t)i + 1;
    }
    lm_free(t->ht);
    t->ht = h;
    t->hcap = nc;
  }
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 32;
    unsigned char *r = lm_realloc(t->rec, nc * t->rsize);
    if (!r) return UINT32_MAX;
    t->rec = r;
    t->cap = nc;
  }
  memcpy(t->rec + t->n * t->rsize, rec, t->rsize);
  size_t j = (size_t)rec_hash(rec, t->rsize) & (t->hcap - 1);
  while (t->ht[j]) j = (j + 1) & (t->hcap - 1);
  t->ht[j] = (uint32_t)t->n + 1;
  return (uint32_t)t->n++;
}

static void tab_free(sk_tab *t) {
  lm_free(t->rec);
  lm_free(t->ht);
  memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- variables and pieces */

static uint64_t vbit(uint32_t v) { return 1ull << (v & 63); }

static uint64_t expr_vars(const lm_exprs *x, lm_expr e) {
  if (!e) return 0;
  const lm_xnode *nd = &x->nodes[e];
  switch (nd->op) {
  case LM_X_CONST:
  case LM_X_SYM: return 0;
  case LM_X_VAR: return vbit((uint32_t)nd->v);
  default: return expr_vars(x, nd->a) | expr_vars(x, nd->b);
  }
}

lm_expr sk_split_outer_extent(lm_sk *s, uint32_t a, uint32_t b) {
  int64_t e = sk_piece_const(s, a);
  if (e >= 0) return lm_x_const(s->x, (e + b - 1) / b);
  lm_expr E = sk_piece_of(s, a)->extent;
  return lm_x_simplify(s->x, lm_x_div(s->x, lm_x_add(s->x, E, lm_x_const(s->x, (int64_t)b - 1)), lm_x_const(s->x, b)), NULL);
}

uint32_t sk_piece_new(lm_sk *s, uint32_t type, uint32_t a, uint32_t b) {
  sk_piece p;
  memset(&p, 0, sizeof p);
  p.type = type;
  p.a = a;
  p.b = b;
  switch (type) {
  case SKP_ORIG: p.extent = s->var_ext[a]; break;
  case SKP_OUT: /* a ragged split (b does not divide e, or e is symbolic): ceil(e / b), the emitter guards the rest */
    if (b < 1) return UINT32_MAX;
    p.extent = sk_split_outer_extent(s, a, b);
    break;
  case SKP_IN: p.extent = lm_x_const(s->x, b); break;
  case SKP_MERGE: p.extent = lm_x_simplify(s->x, lm_x_mul(s->x, sk_piece_of(s, a)->extent, sk_piece_of(s, b)->extent), NULL); break;
  case SKP_GROUP: p.extent = sk_piece_of(s, a)->extent; break;
  default: return UINT32_MAX;
  }
  return sk_intern(&s->pieces, &p);
}

uint64_t sk_piece_vars(const lm_sk *s, uint32_t p) {
  const sk_piece *q = sk_piece_of(s, p);
  switch (q->type) {
  case SKP_ORIG: return vbit(q->a);
  case SKP_OUT:
  case SKP_IN: return sk_piece_vars(s, q->a);
  default: return sk_piece_vars(s, q->a) | sk_piece_vars(s, q->b);
  }
}

int64_t sk_piece_const(const lm_sk *s, uint32_t p) {
  const lm_xnode *n = lm_x_node(s->x, sk_piece_of(s, p)->extent);
  return n->op == LM_X_CONST ? n->v : -1;
}

int sk_piece_depth(const lm_sk *s, uint32_t p) {
  const sk_piece *q = sk_piece_of(s, p);
  switch (q->type) {
  case SKP_ORIG: return 0;
  case SKP_OUT:
  case SKP_IN: return 1 + sk_piece_depth(s, q->a);
  default: {
    int a = sk_piece_depth(s, q->a), b = sk_piece_depth(s, q->b);
    return a > b ? a : b;
  }
  }
}

uint32_t sk_loopattr_new(lm_sk *s, uint32_t piece, uint32_t kind) {
  sk_loopattr a = {piece, kind};
  return sk_intern(&s->loops, &a);
}

uint32_t sk_access_new(lm_sk *s, const sk_access *a) {
  sk_access c;
  memset(&c, 0, sizeof c);
  c.buf = a->buf;
  c.stream = a->stream;
  c.idx = a->idx;
  c.valid = a->valid;
  c.step = a->step;
  uint32_t id = sk_intern(&s->access, &c);
  if (id == UINT32_MAX) return id;
  if (id >= s->acc_vars_cap) {
    size_t nc = s->acc_vars_cap ? s->acc_vars_cap * 2 : 64;
    while (nc <= id) nc *= 2;
    uint64_t *v = lm_realloc(s->acc_vars, nc * sizeof *v);
    if (!v) return UINT32_MAX;
    s->acc_vars = v;
    s->acc_vars_cap = nc;
  }
  s->acc_vars[id] = expr_vars(s->x, c.idx) | expr_vars(s->x, c.valid) | expr_vars(s->x, c.step);
  return id;
}

uint32_t sk_red_new(lm_sk *s, const sk_redattr *r) {
  sk_redattr c;
  memset(&c, 0, sizeof c);
  c.op = r->op;
  c.var = r->var;
  c.lanes = r->lanes ? r->lanes : 1;
  c.nj = r->nj;
  c.swap = r->swap;
  for (uint32_t i = 0; i < r->nj && i < 2; i++) c.joint[i] = r->joint[i];
  return sk_intern(&s->reds, &c);
}

/* ---------------------------------------------------------------- analysis */

static void bits_set(uint64_t *b, uint32_t buf) { b[(buf >> 6) & 3] |= 1ull << (buf & 63); }

static void an_make(void *ctx, lm_egraph *g, const lm_enode *n, void *out) {
  lm_sk *s = ctx;
  sk_data *d = out;
  const sk_data *c[LM_EG_MAXC] = {0};
  for (int i = 0; i < n->n; i++) c[i] = lm_eg_data(g, n->c[i]);
  d->kind = sk_is_effect(n->op) ? 1 : 2;
  for (int i = 0; i < n->n; i++) {
    d->vars |= c[i]->vars;
    d->has_red |= c[i]->has_red;
    for (int k = 0; k < 4; k++) d->rd[k] |= c[i]->rd[k], d->wr[k] |= c[i]->wr[k];
  }
  switch (n->op) {
  case SK_LOOP:
    if (!s->wide) d->vars &= ~sk_piece_vars(s, sk_loop_of(s, n->attr)->piece);
    break;
  case SK_STORE:
    d->vars |= s->acc_vars[n->attr];
    bits_set(d->wr, sk_access_of(s, n->attr)->buf);
    break;
  case SK_LOAD:
    d->vars |= s->acc_vars[n->attr];
    bits_set(d->rd, sk_access_of(s, n->attr)->buf);
    break;
  case SK_RAND:
  case SK_SELECT: d->vars |= s->acc_vars[n->attr]; break;
  case SK_RED:
    d->has_red = 1;
    if (!s->wide) d->vars &= ~vbit(sk_red_of(s, n->attr)->var);
    break;
  default: break;
  }
  if (s->wide) d->vars = ~0ull;
}

static int an_join(void *ctx, void *into, const void *from) {
  (void)ctx;
  sk_data *a = into;
  const sk_data *b = from;
  sk_data o = *a;
  a->kind |= b->kind;
  a->has_red |= b->has_red;
  a->vars |= b->vars;
  for (int k = 0; k < 4; k++) a->rd[k] |= b->rd[k], a->wr[k] |= b->wr[k];
  return memcmp(&o, a, sizeof o) != 0;
}

lm_status sk_init(lm_sk *s, lm_plan *plan) {
  memset(s, 0, sizeof *s);
  s->plan = plan;
  s->x = &plan->g->x;
  s->access.rsize = sizeof(sk_access);
  s->loops.rsize = sizeof(sk_loopattr);
  s->reds.rsize = sizeof(sk_redattr);
  s->pieces.rsize = sizeof(sk_piece);
  s->rounding = 1;
  lm_eg_analysis an = {sizeof(sk_data), an_make, an_join, s};
  s->eg = lm_eg_new(&an);
  return s->eg ? LM_OK : LM_ERR_NOMEM;
}

void sk_free(lm_sk *s) {
  lm_eg_free(s->eg);
  tab_free(&s->access);
  tab_free(&s->loops);
  tab_free(&s->reds);
  tab_free(&s->pieces);
  lm_free(s->var_ext);
  lm_free(s->acc_vars);
  memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- kernel -> term */

typedef struct inb {
  lm_sk *s;
  const lm_kernel *k;
  uint32_t base;
  uint32_t kernel;
  uint32_t *memo; /* per statement: its class */
  lm_expr *map;   /* loop k -> VAR(base + k) */
  int bad;
} inb;

static void in_fail(inb *b, const char *why) {
  if (!b->bad) snprintf(b->s->why, sizeof b->s->why, "%s", why);
  b->bad = 1;
}

static lm_expr in_x(inb *b, lm_expr e) {
  if (!e || !b->base) return e;
  return lm_x_subst(b->s->x, e, b->map, (int)b->k->nloops);
}

static uint32_t add0(inb *b, uint16_t op, uint32_t attr) {
  lm_enode n = {.op = op, .n = 0, .attr = attr};
  uint32_t c = lm_eg_add(b->s->eg, &n);
  if (c == LM_EG_NONE) in_fail(b, "out of memory");
  return c;
}
static uint32_t add1(inb *b, uint16_t op, uint32_t attr, uint32_t a) {
  lm_enode n = {.op = op, .n = 1, .attr = attr, .c = {a}};
  uint32_t c = b->bad ? LM_EG_NONE : lm_eg_add(b->s->eg, &n);
  if (c == LM_EG_NONE) in_fail(b, "out of memory");
  return c;
}
static uint32_t add2(inb *b, uint16_t op, uint32_t attr, uint32_t a, uint32_t c2) {
  lm_enode n = {.op = op, .n = 2, .attr = attr, .c = {a, c2}};
  uint32_t c = b->bad ? LM_EG_NONE : lm_eg_add(b->s->eg, &n);
  if (c == LM_EG_NONE) in_fail(b, "out of memory");
  return c;
}

static int inside(const lm_kernel *k, int32_t loop, int32_t anc) {
  for (; loop >= 0; loop = k->loops[loop].parent)
    if (loop == anc) return 1;
  return 0;
}

static uint32_t in_value(inb *b, uint32_t id);

/* Does statement s read statement id as an operand? */
static int stmt_reads(const lm_stmt *s, uint32_t id) {
  switch (s->op) {
  case LM_S_LOG2:
  case LM_S_EXP2:
  case LM_S_SIN:
  case LM_S_SQRT:
  case LM_S_RECIP:
  case LM_S_SELECT:
  case LM_S_STORE: return s->a == id;
  case LM_S_ADD:
  case LM_S_MUL:
  case LM_S_MOD:
  case LM_S_LT:
  case LM_S_MAX: return s->a == id || s->b == id;
  case LM_S_ACC_SUM:
  case LM_S_ACC_MAX: return s->b == id;
  default: return 0;
  }
}

static uint32_t in_reduction(inb *b, uint32_t acc) {
  const lm_kernel *k = b->k;
  const lm_stmt *a = &k->stmts[acc];
  uint32_t up = UINT32_MAX;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if ((s->op == LM_S_ACC_SUM || s->op == LM_S_ACC_MAX) && s->a == acc) {
      if (up != UINT32_MAX) return in_fail(b, "an accumulator with two updates"), LM_EG_NONE;
      up = (uint32_t)i;
    }
  }
  if (up == UINT32_MAX) return in_fail(b, "an accumulator without an update"), LM_EG_NONE;
  const lm_stmt *u = &k->stmts[up];
  int sum = u->op == LM_S_ACC_SUM;
  if (sum ? (a->f != 0.0f || signbit(a->f)) : !(isinf(a->f) && a->f < 0))
    return in_fail(b, "an accumulator with an unusual initial value"), LM_EG_NONE;
  int32_t L = u->loop;
  if (L < 0 || k->loops[L].kind != LM_L_SERIAL || k->loops[L].parent != a->loop)
    return in_fail(b, "a reduction that is not a serial loop beside its accumulator"), LM_EG_NONE;
  for (size_t i = 0; i < k->nstmts; i++) /* nothing reads a partial value */
    if (i != up && stmt_reads(&k->stmts[i], acc) && inside(k, k->stmts[i].loop, L))
      return in_fail(b, "a partial reduction is read"), LM_EG_NONE;
  uint32_t body = in_value(b, u->b);
  sk_redattr r = {.op = sum ? SK_RED_SUM : SK_RED_MAX, .var = b->base + (uint32_t)L, .lanes = 1};
  uint32_t ra = sk_red_new(b->s, &r);
  if (ra == UINT32_MAX) return in_fail(b, "out of memory"), LM_EG_NONE;
  return add1(b, SK_RED, ra, body);
}

static uint32_t in_value(inb *b, uint32_t id) {
  if (b->bad) return LM_EG_NONE;
  if (id >= b->k->nstmts) return in_fail(b, "operand out of range"), LM_EG_NONE;
  if (b->memo[id] != LM_EG_NONE) return b->memo[id];
  const lm_stmt *s = &b->k->stmts[id];
  uint32_t c = LM_EG_NONE;
  sk_access acc;
  memset(&acc, 0, sizeof acc);
  switch (s->op) {
  case LM_S_CONST: {
    uint32_t bits;
    memcpy(&bits, &s->f, sizeof bits);
    c = add0(b, SK_CONST, bits);
    break;
  }
  case LM_S_LOAD:
    if (s->local) return in_fail(b, "a local array"), LM_EG_NONE;
    acc.buf = s->buf;
    acc.idx = in_x(b, s->idx);
    acc.valid = in_x(b, s->valid);
    c = add0(b, SK_LOAD, sk_access_new(b->s, &acc));
    break;
  case LM_S_RAND:
    acc.stream = s->stream;
    acc.idx = in_x(b, s->idx);
    acc.step = in_x(b, s->step);
    c = add0(b, SK_RAND, sk_access_new(b->s, &acc));
    break;
  case LM_S_SELECT: {
    uint32_t v = in_value(b, s->a);
    acc.valid = in_x(b, s->valid);
    c = add1(b, SK_SELECT, sk_access_new(b->s, &acc), v);
    break;
  }
  case LM_S_LOG2:
  case LM_S_EXP2:
  case LM_S_SIN:
  case LM_S_SQRT:
  case LM_S_RECIP: c = add1(b, (uint16_t)(SK_LOG2 + (s->op - LM_S_LOG2)), 0, in_value(b, s->a)); break;
  case LM_S_ADD:
  case LM_S_MUL:
  case LM_S_MOD:
  case LM_S_LT: {
    uint32_t x = in_value(b, s->a), y = in_value(b, s->b);
    c = add2(b, (uint16_t)(SK_ADD + (s->op - LM_S_ADD)), 0, x, y);
    break;
  }
  case LM_S_ACC: c = in_reduction(b, id); break;
  default: return in_fail(b, "a statement without a value used as one"), LM_EG_NONE;
  }
  if (!b->bad) b->memo[id] = c;
  return c;
}

static int has_store(const lm_kernel *k, int32_t loop) {
  const lm_block *bl = &k->loops[loop].body;
  for (size_t i = 0; i < bl->n; i++) {
    if (bl->items[i].is_loop ? has_store(k, (int32_t)bl->items[i].id)
                             : k->stmts[bl->items[i].id].op == LM_S_STORE)
      return 1;
    if (bl->items[i].is_loop && k->loops[bl->items[i].id].kind == LM_L_PARALLEL) return 1;
  }
  return 0;
}

static uint32_t seq_of(inb *b, const uint32_t *e, size_t n) {
  if (n == 0) return add0(b, SK_NOP, 0);
  uint32_t r = e[n - 1];
  for (size_t i = n - 1; i-- > 0;) r = add2(b, SK_SEQ, 0, e[i], r);
  return r;
}

static uint32_t in_block(inb *b, int32_t loop) {
  const lm_kernel *k = b->k;
  const lm_block *bl = loop < 0 ? &k->root : &k->loops[loop].body;
  uint32_t *eff = lm_calloc(bl->n + 1, sizeof *eff);
  size_t ne = 0;
  if (!eff) return in_fail(b, "out of memory"), LM_EG_NONE;
  for (size_t i = 0; i < bl->n && !b->bad; i++) {
    lm_item it = bl->items[i];
    if (it.is_loop) {
      const lm_loop *l = &k->loops[it.id];
      if (l->kind != LM_L_PARALLEL) {
        if (has_store(k, (int32_t)it.id)) in_fail(b, "a serial loop with effects");
        continue;
      }
      uint32_t body = in_block(b, (int32_t)it.id);
      uint32_t piece = sk_piece_new(b->s, SKP_ORIG, b->base + it.id, 0);
      uint32_t la = piece == UINT32_MAX ? UINT32_MAX : sk_loopattr_new(b->s, piece, SK_PAR);
      if (la == UINT32_MAX) in_fail(b, "out of memory");
      else eff[ne++] = add1(b, SK_LOOP, la, body);
    } else {
      const lm_stmt *s = &k->stmts[it.id];
      if (s->op != LM_S_STORE) continue;
      if (s->local) {
        in_fail(b, "a local array");
        break;
      }
      sk_access acc;
      memset(&acc, 0, sizeof acc);
      acc.buf = s->buf;
      acc.idx = in_x(b, s->idx);
      acc.valid = in_x(b, s->valid);
      uint32_t v = in_value(b, s->a);
      uint32_t aid = sk_access_new(b->s, &acc);
      if (aid == UINT32_MAX) in_fail(b, "out of memory");
      else eff[ne++] = add1(b, SK_STORE, aid, v);
    }
  }
  uint32_t r = b->bad ? LM_EG_NONE : seq_of(b, eff, ne);
  lm_free(eff);
  return r;
}

uint32_t sk_add_kernel(lm_sk *s, uint32_t kernel, uint32_t var_base) {
  const lm_kernel *k = &s->plan->kernels[kernel];
  s->why[0] = 0;
  if (k->nlocals) {
    snprintf(s->why, sizeof s->why, "a local array");
    return LM_EG_NONE;
  }
  size_t need = var_base + k->nloops;
  if (!LM_GROW(s->var_ext, s->varcap, need + 1)) return LM_EG_NONE;
  for (size_t i = s->nvars; i < need; i++) s->var_ext[i] = lm_x_const(s->x, 1);
  for (size_t l = 0; l < k->nloops; l++) s->var_ext[var_base + l] = k->loops[l].extent;
  if (need > s->nvars) s->nvars = need;
  s->wide = s->nvars > 64;
  inb b = {.s = s, .k = k, .base = var_base, .kernel = kernel};
  b.memo = lm_malloc((k->nstmts + 1) * sizeof *b.memo);
  b.map = lm_calloc(k->nloops + 1, sizeof *b.map);
  if (!b.memo || !b.map) {
    lm_free(b.memo);
    lm_free(b.map);
    return LM_EG_NONE;
  }
  for (size_t i = 0; i <= k->nstmts; i++) b.memo[i] = LM_EG_NONE;
  for (size_t l = 0; l < k->nloops; l++) b.map[l] = lm_x_var(s->x, (int)(var_base + l));
  uint32_t body = in_block(&b, -1);
  uint32_t r = b.bad ? LM_EG_NONE : add1(&b, SK_KERNEL, kernel, body);
  lm_free(b.memo);
  lm_free(b.map);
  return b.bad ? LM_EG_NONE : r;
}

/* ---------------------------------------------------------------- terms */

void sk_term_free(sk_term *t) {
  lm_free(t->n);
  lm_free(t->src);
  memset(t, 0, sizeof *t);
}

uint32_t sk_term_push(sk_term *t, const lm_enode *n, uint32_t src) {
  if (t->count == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 64;
    lm_enode *a = lm_realloc(t->n, nc * sizeof *a);
    if (a) t->n = a;
    uint32_t *s = lm_realloc(t->src, nc * sizeof *s);
    if (s) t->src = s;
    if (!a || !s) return UINT32_MAX;
    t->cap = nc;
  }
  t->n[t->count] = *n;
  t->src[t->count] = src;
  return (uint32_t)t->count++;
}

/* Text form, one node per token group: "op:attr:c0,c1,c2;" with attr written out for pieces,
 * loops and reductions (pieces recursively: o<var>, O(<p>,<f>), I(<p>,<f>), M(<p>,<p>), G(<p>,<p>)). */
static void print_piece(const lm_sk *s, uint32_t p, lm_sb *sb) {
  const sk_piece *q = sk_piece_of(s, p);
  switch (q->type) {
  case SKP_ORIG: lm_sb_printf(sb, "o%u", q->a); return;
  case SKP_OUT:
  case SKP_IN:
    lm_sb_puts(sb, q->type == SKP_OUT ? "O(" : "I(");
    print_piece(s, q->a, sb);
    lm_sb_printf(sb, ",%u)", q->b);
    return;
  default:
    lm_sb_puts(sb, q->type == SKP_MERGE ? "M(" : "G(");
    print_piece(s, q->a, sb);
    lm_sb_puts(sb, ",");
    print_piece(s, q->b, sb);
    lm_sb_puts(sb, ")");
  }
}

char *sk_term_print(const lm_sk *s, const sk_term *t) {
  lm_sb sb = {0};
  lm_sb_printf(&sb, "r%u;", t->root);
  for (size_t i = 0; i < t->count; i++) {
    const lm_enode *n = &t->n[i];
    lm_sb_printf(&sb, "%s:", sk_op_names[n->op]);
    if (n->op == SK_LOOP) {
      const sk_loopattr *la = sk_loop_of(s, n->attr);
      lm_sb_printf(&sb, "%u/", la->kind);
      print_piece(s, la->piece, &sb);
    } else if (n->op == SK_RED) {
      const sk_redattr *r = sk_red_of(s, n->attr);
      lm_sb_printf(&sb, "%u/%u/%u/%u/%u", r->op, r->var, r->lanes, r->nj, r->swap);
      for (uint32_t j = 0; j < r->nj; j++) {
        lm_sb_puts(&sb, "/");
        print_piece(s, r->joint[j], &sb);
      }
    } else lm_sb_printf(&sb, "%u", n->attr);
    for (int c = 0; c < n->n; c++) lm_sb_printf(&sb, "%c%u", c ? ',' : ':', n->c[c]);
    lm_sb_puts(&sb, ";");
  }
  return lm_sb_take(&sb);
}

typedef struct rd {
  const char *p;
  int bad;
} rd;

static uint32_t rd_uint(rd *r) {
  if (*r->p < '0' || *r->p > '9') {
    r->bad = 1;
    return 0;
  }
  char *end;
  unsigned long v = strtoul(r->p, &end, 10);
  r->p = end;
  if (v > UINT32_MAX) r->bad = 1;
  return (uint32_t)v;
}

static int rd_ch(rd *r, char c) {
  if (*r->p != c) {
    r->bad = 1;
    return 0;
  }
  r->p++;
  return 1;
}

static uint32_t rd_piece(lm_sk *s, rd *r, int depth) {
  if (depth > 16 || r->bad) return r->bad = 1, 0;
  char c = *r->p++;
  if (c == 'o') {
    uint32_t v = rd_uint(r);
    if (r->bad || v >= s->nvars) return r->bad = 1, 0;
    return sk_piece_new(s, SKP_ORIG, v, 0);
  }
  if (c != 'O' && c != 'I' && c != 'M' && c != 'G') return r->bad = 1, 0;
  rd_ch(r, '(');
  uint32_t a = rd_piece(s, r, depth + 1), b;
  rd_ch(r, ',');
  if (c == 'O' || c == 'I') b = rd_uint(r);
  else b = rd_piece(s, r, depth + 1);
  rd_ch(r, ')');
  if (r->bad || a == UINT32_MAX || b == UINT32_MAX || ((c == 'O' || c == 'I') && (b < 2 || b > 1024)))
    return r->bad = 1, 0;
  uint32_t p = sk_piece_new(s, c == 'O' ? SKP_OUT : c == 'I' ? SKP_IN : c == 'M' ? SKP_MERGE : SKP_GROUP, a, b);
  if (p == UINT32_MAX) r->bad = 1;
  return p;
}

lm_status sk_term_parse(lm_sk *s, const char *text, sk_term *out) {
  memset(out, 0, sizeof *out);
  rd r = {text, 0};
  rd_ch(&r, 'r');
  uint32_t root = rd_uint(&r);
  rd_ch(&r, ';');
  while (!r.bad && *r.p) {
    int op = -1;
    for (int i = 0; i < SK_COUNT; i++) {
      size_t l = strlen(sk_op_names[i]);
      if (!strncmp(r.p, sk_op_names[i], l) && r.p[l] == ':') {
        op = i;
        r.p += l + 1;
        break;
      }
    }
    if (op < 0) {
      r.bad = 1;
      break;
    }
    lm_enode n;
    memset(&n, 0, sizeof n);
    n.op = (uint16_t)op;
    if (op == SK_LOOP) {
      uint32_t kind = rd_uint(&r);
      rd_ch(&r, '/');
      uint32_t p = rd_piece(s, &r, 0);
      if (kind >= SK_KIND_COUNT) r.bad = 1;
      if (!r.bad) n.attr = sk_loopattr_new(s, p, kind);
    } else if (op == SK_RED) {
      sk_redattr ra;
      memset(&ra, 0, sizeof ra);
      ra.op = rd_uint(&r);
      rd_ch(&r, '/');
      ra.var = rd_uint(&r);
      rd_ch(&r, '/');
      ra.lanes = rd_uint(&r);
      rd_ch(&r, '/');
      ra.nj = rd_uint(&r);
      rd_ch(&r, '/');
      ra.swap = rd_uint(&r);
      if (ra.nj > 2 || ra.op > SK_RED_MAX || ra.var >= s->nvars || ra.lanes < 1 || ra.lanes > 64) r.bad = 1;
      for (uint32_t j = 0; j < ra.nj && !r.bad; j++) {
        rd_ch(&r, '/');
        ra.joint[j] = rd_piece(s, &r, 0);
      }
      if (!r.bad) n.attr = sk_red_new(s, &ra);
    } else {
      n.attr = rd_uint(&r);
      if ((op == SK_LOAD || op == SK_STORE || op == SK_RAND || op == SK_SELECT) && n.attr >= s->access.n) r.bad = 1;
      if (op == SK_KERNEL && n.attr >= s->plan->nkernels) r.bad = 1;
    }
    static const uint8_t arity[SK_COUNT] = {
        [SK_SEQ] = 2, [SK_LOOP] = 1, [SK_STORE] = 1, [SK_KERNEL] = 1, [SK_SELECT] = 1, [SK_LOG2] = 1, [SK_EXP2] = 1,
        [SK_SIN] = 1, [SK_SQRT] = 1, [SK_RECIP] = 1, [SK_ADD] = 2,    [SK_MUL] = 2,  [SK_MOD] = 2,   [SK_LT] = 2,
        [SK_RED] = 1};
    n.n = arity[op];
    for (int c = 0; c < n.n && !r.bad; c++) {
      rd_ch(&r, c ? ',' : ':');
      n.c[c] = rd_uint(&r);
      if (n.c[c] >= out->count) r.bad = 1; /* children come first */
    }
    rd_ch(&r, ';');
    if (!r.bad && n.attr == UINT32_MAX) r.bad = 1;
    if (!r.bad && sk_term_push(out, &n, LM_EG_NONE) == UINT32_MAX) {
      sk_term_free(out);
      return LM_ERR_NOMEM;
    }
  }
  if (r.bad || root >= out->count) {
    sk_term_free(out);
    return lm_fail(LM_ERR_CORRUPT, "search: malformed term text");
  }
  out->root = root;
  return LM_OK;
}
