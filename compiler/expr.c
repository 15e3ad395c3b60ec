/* compiler/expr.c — hash-consed index expressions and their canonicaliser.
 * Canonical form is a polynomial: a sum of terms coef * (sorted product of atoms), where
 * atoms are variables, symbols and canonical DIV/MOD/LT/AND nodes. Range analysis over
 * polynomials in the symbols (each symbol >= its least value) decides when floor
 * division and modulo are trivial. */
#include "expr.h"

#include <string.h>

/* ---------------------------------------------------------------- hashcons */

static uint64_t xhash(uint8_t op, lm_expr a, lm_expr b, int64_t v) {
  uint64_t h = 0x9e3779b97f4a7c15ull * (op + 1u);
  h ^= (uint64_t)a * 0xff51afd7ed558ccdull;
  h ^= (uint64_t)b * 0xc4ceb9fe1a85ec53ull + (h << 6) + (h >> 2);
  h ^= (uint64_t)v * 0x2545f4914f6cdd1dull;
  return h ^ (h >> 29);
}

void lm_exprs_init(lm_exprs *x) { memset(x, 0, sizeof *x); }

typedef struct lm_xmemo {
  uint64_t ctx, ctx2;
  lm_expr e, result;
  uint32_t kind; /* 0 = empty slot, 1 = simplify, 2 = simplify_atom */
} lm_xmemo;

/* A context's key: two independent 64-bit hashes of its extents (a false match needs both
 * to collide at once). */
typedef struct xkey {
  uint64_t h, k;
} xkey;

static xkey ctx_hash(const lm_xctx *ctx) {
  if (!ctx) return (xkey){0x51ed270b27a4b1c5ull, 0};
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)ctx->nvars, k = 0xc2b2ae3d27d4eb4full + (uint64_t)ctx->nvars;
  for (int i = 0; i < ctx->nvars; i++) {
    h = (h ^ ctx->extent[i]) * 0x100000001b3ull + (h >> 31);
    k = (k + ctx->extent[i] * 0xff51afd7ed558ccdull) ^ (k >> 29);
    k *= 0xc4ceb9fe1a85ec53ull;
  }
  for (int i = 0; i < ctx->nfacts; i++) {
    const lm_xfact *f = &ctx->facts[i];
    h = (h ^ f->e ^ ((uint64_t)f->lo << 20) ^ ((uint64_t)f->hi << 40)) * 0x100000001b3ull + (h >> 31);
    k = (k + (f->e + 7 * (uint64_t)f->lo + 31 * (uint64_t)f->hi) * 0xff51afd7ed558ccdull) ^ (k >> 29);
    k *= 0xc4ceb9fe1a85ec53ull;
  }
  return (xkey){h, k};
}

static lm_expr memo_get(const lm_exprs *x, uint32_t kind, lm_expr e, xkey key) {
  if (!x->memocap) return 0;
  uint64_t ch = key.h;
  size_t h = (size_t)((e * 0x9e3779b97f4a7c15ull) ^ ch ^ kind) & (x->memocap - 1);
  for (; x->memo[h].kind; h = (h + 1) & (x->memocap - 1))
    if (x->memo[h].kind == kind && x->memo[h].e == e && x->memo[h].ctx == ch && x->memo[h].ctx2 == key.k)
      return x->memo[h].result;
  return 0;
}

static void memo_put(lm_exprs *x, uint32_t kind, lm_expr e, xkey key, lm_expr result) {
  uint64_t ch = key.h;
  if (!result) return;
  if ((x->nmemo + 1) * 2 > x->memocap) {
    size_t cap = x->memocap ? x->memocap * 2 : 1024;
    lm_xmemo *m = lm_calloc(cap, sizeof *m);
    if (!m) return; /* the cache is an optimisation only */
    for (size_t i = 0; i < x->memocap; i++) {
      if (!x->memo[i].kind) continue;
      size_t h = (size_t)((x->memo[i].e * 0x9e3779b97f4a7c15ull) ^ x->memo[i].ctx ^ x->memo[i].kind) & (cap - 1);
      while (m[h].kind) h = (h + 1) & (cap - 1);
      m[h] = x->memo[i];
    }
    lm_free(x->memo);
    x->memo = m;
    x->memocap = cap;
  }
  size_t h = (size_t)((e * 0x9e3779b97f4a7c15ull) ^ ch ^ kind) & (x->memocap - 1);
  while (x->memo[h].kind) h = (h + 1) & (x->memocap - 1);
  x->memo[h] = (lm_xmemo){ch, key.k, e, result, kind};
  x->nmemo++;
}

void lm_exprs_free(lm_exprs *x) {
  lm_free(x->memo);
  for (size_t i = 0; i < x->nsyms; i++) lm_free(x->syms[i].name);
  lm_free(x->syms);
  lm_free(x->nodes);
  lm_free(x->table);
  memset(x, 0, sizeof *x);
}

static int rehash(lm_exprs *x, size_t tcap) {
  uint32_t *t = lm_calloc(tcap, sizeof *t);
  if (!t) return 0;
  for (size_t i = 1; i < x->n; i++) {
    const lm_xnode *nd = &x->nodes[i];
    size_t h = (size_t)xhash(nd->op, nd->a, nd->b, nd->v) & (tcap - 1);
    while (t[h]) h = (h + 1) & (tcap - 1);
    t[h] = (uint32_t)i;
  }
  lm_free(x->table);
  x->table = t;
  x->tcap = tcap;
  return 1;
}

int lm_exprs_copy(lm_exprs *dst, const lm_exprs *src) {
  lm_exprs_init(dst);
  if (src->n) {
    dst->nodes = lm_malloc(src->n * sizeof *dst->nodes);
    if (!dst->nodes) return 0;
    memcpy(dst->nodes, src->nodes, src->n * sizeof *dst->nodes);
    dst->n = dst->cap = src->n;
    if (!rehash(dst, src->tcap)) return lm_exprs_free(dst), 0;
  }
  for (size_t i = 0; i < src->nsyms; i++) {
    int k = lm_x_symbol(dst, src->syms[i].name, src->syms[i].least);
    if (k < 0) return lm_exprs_free(dst), 0;
    dst->syms[k].hint = src->syms[i].hint;
  }
  return 1;
}

static lm_expr intern(lm_exprs *x, uint8_t op, lm_expr a, lm_expr b, int64_t v) {
  if (x->failed) return 0;
  if (!x->n) x->n = 1; /* id 0 means none */
  if ((x->n + 1) * 2 > x->tcap && !rehash(x, x->tcap ? x->tcap * 2 : 256)) goto oom;
  size_t h = (size_t)xhash(op, a, b, v) & (x->tcap - 1);
  for (; x->table[h]; h = (h + 1) & (x->tcap - 1)) {
    const lm_xnode *nd = &x->nodes[x->table[h]];
    if (nd->op == op && nd->a == a && nd->b == b && nd->v == v) return x->table[h];
  }
  if (!LM_GROW(x->nodes, x->cap, x->n + 1)) goto oom;
  x->nodes[x->n] = (lm_xnode){op, a, b, v};
  x->table[h] = (uint32_t)x->n;
  return (lm_expr)x->n++;
oom:
  x->failed = 1;
  return 0;
}

lm_expr lm_x_const(lm_exprs *x, int64_t v) { return intern(x, LM_X_CONST, 0, 0, v); }
lm_expr lm_x_var(lm_exprs *x, int index) { return intern(x, LM_X_VAR, 0, 0, index); }
lm_expr lm_x_sym(lm_exprs *x, int symbol) { return intern(x, LM_X_SYM, 0, 0, symbol); }

int lm_x_symbol(lm_exprs *x, const char *name, int64_t least) {
  for (size_t i = 0; i < x->nsyms; i++)
    if (!strcmp(x->syms[i].name, name)) return (int)i;
  if (!LM_GROW(x->syms, x->symcap, x->nsyms + 1)) return -1;
  char *copy = lm_strdup(name);
  if (!copy) return -1;
  x->syms[x->nsyms] = (lm_xsym){copy, least, 0};
  return (int)x->nsyms++;
}

static int is_c(const lm_exprs *x, lm_expr e) { return e && x->nodes[e].op == LM_X_CONST; }
static int64_t cv(const lm_exprs *x, lm_expr e) { return x->nodes[e].v; }

static int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static int64_t floormod(int64_t a, int64_t b) { return a - b * floordiv(a, b); }

lm_expr lm_x_add(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  int64_t r;
  if (is_c(x, a) && is_c(x, b) && !__builtin_add_overflow(cv(x, a), cv(x, b), &r)) return lm_x_const(x, r);
  if (lm_x_is_const(x, a, 0)) return b;
  if (lm_x_is_const(x, b, 0)) return a;
  return intern(x, LM_X_ADD, a, b, 0);
}

lm_expr lm_x_mul(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  int64_t r;
  if (is_c(x, a) && is_c(x, b) && !__builtin_mul_overflow(cv(x, a), cv(x, b), &r)) return lm_x_const(x, r);
  if (lm_x_is_const(x, a, 0) || lm_x_is_const(x, b, 0)) return lm_x_const(x, 0);
  if (lm_x_is_const(x, a, 1)) return b;
  if (lm_x_is_const(x, b, 1)) return a;
  return intern(x, LM_X_MUL, a, b, 0);
}

lm_expr lm_x_sub(lm_exprs *x, lm_expr a, lm_expr b) {
  return lm_x_add(x, a, lm_x_mul(x, lm_x_const(x, -1), b));
}

lm_expr lm_x_div(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  if (is_c(x, a) && is_c(x, b) && cv(x, b) > 0) return lm_x_const(x, floordiv(cv(x, a), cv(x, b)));
  if (lm_x_is_const(x, b, 1)) return a;
  return intern(x, LM_X_DIV, a, b, 0);
}

lm_expr lm_x_mod(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  if (is_c(x, a) && is_c(x, b) && cv(x, b) > 0) return lm_x_const(x, floormod(cv(x, a), cv(x, b)));
  if (lm_x_is_const(x, b, 1)) return lm_x_const(x, 0);
  return intern(x, LM_X_MOD, a, b, 0);
}

lm_expr lm_x_lt(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  if (is_c(x, a) && is_c(x, b)) return lm_x_const(x, cv(x, a) < cv(x, b));
  return intern(x, LM_X_LT, a, b, 0);
}

lm_expr lm_x_and(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  if (lm_x_is_const(x, a, 0) || lm_x_is_const(x, b, 0)) return lm_x_const(x, 0);
  if (lm_x_is_const(x, a, 1)) return b;
  if (lm_x_is_const(x, b, 1) || a == b) return a;
  return intern(x, LM_X_AND, a, b, 0);
}

/* ---------------------------------------------------------------- polynomials */

enum { MAXDEG = 8, MAXTERMS = 32 };

typedef struct term {
  int64_t c;
  int n;
  lm_expr f[MAXDEG]; /* sorted by atom_cmp */
} term;

typedef struct poly {
  int n, bad; /* bad: too large to represent; callers fall back to the input */
  term t[MAXTERMS];
} poly;

static int atom_rank(uint8_t op) {
  switch (op) {
  case LM_X_VAR: return 0;
  case LM_X_SYM: return 1;
  default: return 2;
  }
}

/* Structural order, independent of the order in which nodes were interned. */
static int struct_cmp(const lm_exprs *x, lm_expr a, lm_expr b) {
  if (a == b) return 0;
  const lm_xnode *na = &x->nodes[a], *nb = &x->nodes[b];
  if (na->op != nb->op) return na->op < nb->op ? -1 : 1;
  if (na->op <= LM_X_SYM) return na->v < nb->v ? -1 : na->v > nb->v;
  int c = struct_cmp(x, na->a, nb->a);
  return c ? c : struct_cmp(x, na->b, nb->b);
}

static int atom_cmp(const lm_exprs *x, lm_expr a, lm_expr b) {
  const lm_xnode *na = &x->nodes[a], *nb = &x->nodes[b];
  int ra = atom_rank(na->op), rb = atom_rank(nb->op);
  if (ra != rb) return ra < rb ? -1 : 1;
  if (ra < 2) return na->v < nb->v ? -1 : na->v > nb->v;
  return struct_cmp(x, a, b);
}

static int mono_cmp(const lm_exprs *x, const term *a, const term *b) {
  for (int i = 0; i < a->n && i < b->n; i++) {
    int c = atom_cmp(x, a->f[i], b->f[i]);
    if (c) return c;
  }
  /* constants (degree 0) sort last */
  if (a->n != b->n) return a->n == 0 ? 1 : b->n == 0 ? -1 : (a->n < b->n ? -1 : 1);
  return 0;
}

static void poly_addterm(const lm_exprs *x, poly *p, const term *t) {
  if (t->c == 0 || p->bad) return;
  int lo = 0, hi = p->n;
  while (lo < hi) { /* binary search in the sorted term list */
    int mid = (lo + hi) / 2, c = mono_cmp(x, &p->t[mid], t);
    if (c == 0) {
      if (__builtin_add_overflow(p->t[mid].c, t->c, &p->t[mid].c)) {
        p->bad = 1;
        return;
      }
      if (p->t[mid].c == 0) {
        memmove(&p->t[mid], &p->t[mid + 1], (size_t)(p->n - mid - 1) * sizeof(term));
        p->n--;
      }
      return;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  if (p->n == MAXTERMS) {
    p->bad = 1;
    return;
  }
  memmove(&p->t[lo + 1], &p->t[lo], (size_t)(p->n - lo) * sizeof(term));
  p->t[lo] = *t;
  p->n++;
}

static void poly_const(poly *p, int64_t c) {
  p->n = 0;
  p->bad = 0;
  if (c) p->t[p->n++] = (term){.c = c};
}

static void poly_atom(poly *p, lm_expr a) {
  p->n = 1;
  p->bad = 0;
  p->t[0] = (term){.c = 1, .n = 1, .f = {a}};
}

static void poly_add(const lm_exprs *x, poly *p, const poly *q, int64_t scale) {
  p->bad |= q->bad;
  for (int i = 0; i < q->n; i++) {
    term t = q->t[i];
    if (__builtin_mul_overflow(t.c, scale, &t.c)) {
      p->bad = 1;
      return;
    }
    poly_addterm(x, p, &t);
  }
}

static int term_mul(const lm_exprs *x, const term *a, const term *b, term *out) {
  if (a->n + b->n > MAXDEG || __builtin_mul_overflow(a->c, b->c, &out->c)) return 0;
  out->n = 0;
  int i = 0, j = 0;
  while (i < a->n || j < b->n) {
    if (j >= b->n || (i < a->n && atom_cmp(x, a->f[i], b->f[j]) <= 0)) out->f[out->n++] = a->f[i++];
    else out->f[out->n++] = b->f[j++];
  }
  return 1;
}

static void poly_mul(const lm_exprs *x, const poly *a, const poly *b, poly *out) {
  poly_const(out, 0);
  out->bad = a->bad | b->bad;
  for (int i = 0; i < a->n && !out->bad; i++)
    for (int j = 0; j < b->n && !out->bad; j++) {
      term t;
      if (!term_mul(x, &a->t[i], &b->t[j], &t)) out->bad = 1;
      else poly_addterm(x, out, &t);
    }
}

static int poly_is_const(const poly *p, int64_t *c) {
  if (p->bad || p->n > 1 || (p->n == 1 && p->t[0].n)) return 0;
  *c = p->n ? p->t[0].c : 0;
  return 1;
}

static lm_expr poly_expr(lm_exprs *x, const poly *p) {
  lm_expr sum = 0;
  for (int i = 0; i < p->n; i++) {
    const term *t = &p->t[i];
    lm_expr m = 0;
    for (int k = 0; k < t->n; k++) m = m ? intern(x, LM_X_MUL, m, t->f[k], 0) : t->f[k];
    if (!m) m = lm_x_const(x, t->c);
    else if (t->c != 1) m = intern(x, LM_X_MUL, m, lm_x_const(x, t->c), 0);
    sum = sum ? intern(x, LM_X_ADD, sum, m, 0) : m;
  }
  return sum ? sum : lm_x_const(x, 0);
}

/* ---------------------------------------------------------------- range analysis */

/* p >= 0 for every binding: substitute s = least + u (u >= 0) for every symbol and require
 * every coefficient to be >= 0. Only polynomials over symbols qualify. */
static int poly_nonneg(lm_exprs *x, const poly *p) {
  if (p->bad) return 0;
  poly acc, tp, f, tmp;
  poly_const(&acc, 0);
  for (int i = 0; i < p->n; i++) {
    const term *t = &p->t[i];
    poly_const(&tp, t->c);
    for (int k = 0; k < t->n; k++) {
      const lm_xnode *nd = &x->nodes[t->f[k]];
      if (nd->op != LM_X_SYM) return 0;
      poly_const(&f, x->syms[nd->v].least);
      term u = {.c = 1, .n = 1, .f = {t->f[k]}};
      poly_addterm(x, &f, &u);
      poly_mul(x, &tp, &f, &tmp);
      tp = tmp;
    }
    poly_add(x, &acc, &tp, 1);
  }
  if (acc.bad) return 0;
  for (int i = 0; i < acc.n; i++)
    if (acc.t[i].c < 0) return 0;
  return 1;
}

static void poly_of(lm_exprs *x, lm_expr e, const lm_xctx *ctx, poly *out);

typedef struct range {
  int ok;
  poly lo, hi;
} range;

static void range_of_poly(lm_exprs *x, const poly *p, const lm_xctx *ctx, range *r);

/* Bounds of one atom; ok = 0 when unknown. */
static void range_of_atom(lm_exprs *x, lm_expr a, const lm_xctx *ctx, range *r) {
  const lm_xnode *nd = &x->nodes[a];
  r->ok = 1;
  switch (nd->op) {
  case LM_X_VAR:
    if (!ctx || nd->v >= ctx->nvars || !ctx->extent[nd->v]) {
      r->ok = 0;
      return;
    }
    poly_const(&r->lo, 0);
    poly_of(x, ctx->extent[nd->v], ctx, &r->hi);
    {
      poly one;
      poly_const(&one, -1);
      poly_add(x, &r->hi, &one, 1);
    }
    return;
  case LM_X_SYM:
    poly_atom(&r->lo, a);
    poly_atom(&r->hi, a);
    return;
  case LM_X_LT:
  case LM_X_AND:
    poly_const(&r->lo, 0);
    poly_const(&r->hi, 1);
    return;
  case LM_X_MOD:
    poly_const(&r->lo, 0);
    poly_of(x, nd->b, ctx, &r->hi);
    {
      poly one;
      poly_const(&one, -1);
      poly_add(x, &r->hi, &one, 1);
    }
    return;
  case LM_X_DIV: {
    range ra;
    poly pa, pb, q;
    poly_of(x, nd->a, ctx, &pa);
    range_of_poly(x, &pa, ctx, &ra);
    if (!ra.ok || !poly_nonneg(x, &ra.lo)) {
      r->ok = 0;
      return;
    }
    poly_const(&r->lo, 0);
    /* hi: (hi_a + 1) / b - 1 when b divides hi_a + 1 as a constant, else hi_a */
    poly_of(x, nd->b, ctx, &pb);
    q = ra.hi;
    poly one;
    poly_const(&one, 1);
    poly_add(x, &q, &one, 1);
    int64_t d;
    r->hi = ra.hi;
    if (poly_is_const(&pb, &d) && d > 0) {
      int divisible = !q.bad;
      for (int i = 0; i < q.n; i++) divisible &= q.t[i].c % d == 0;
      if (divisible) {
        for (int i = 0; i < q.n; i++) q.t[i].c /= d;
        poly_add(x, &q, &one, -1);
        r->hi = q;
      }
    } else if (!pb.bad && pb.n == 1 && pb.t[0].c == 1 && pb.t[0].n > 0) {
      /* divide every term of hi_a + 1 by the monomial b, if each contains it */
      poly out;
      poly_const(&out, 0);
      int divisible = !q.bad;
      for (int i = 0; i < q.n && divisible; i++) {
        term t = q.t[i];
        for (int k = 0; k < pb.t[0].n && divisible; k++) {
          int at = -1;
          for (int j = 0; j < t.n; j++)
            if (t.f[j] == pb.t[0].f[k]) at = j;
          if (at < 0) divisible = 0;
          else {
            memmove(&t.f[at], &t.f[at + 1], (size_t)(t.n - at - 1) * sizeof(lm_expr));
            t.n--;
          }
        }
        if (divisible) poly_addterm(x, &out, &t);
      }
      if (divisible) {
        poly_add(x, &out, &one, -1);
        r->hi = out;
      }
    }
    return;
  }
  default:
    r->ok = 0;
    return;
  }
}

static void range_of_poly(lm_exprs *x, const poly *p, const lm_xctx *ctx, range *r) {
  poly_const(&r->lo, 0);
  poly_const(&r->hi, 0);
  r->ok = !p->bad;
  for (int i = 0; i < p->n && r->ok; i++) {
    const term *t = &p->t[i];
    poly lo, hi, tmp;
    poly_const(&lo, 1);
    poly_const(&hi, 1);
    for (int k = 0; k < t->n; k++) {
      range fr;
      range_of_atom(x, t->f[k], ctx, &fr);
      if (!fr.ok || !poly_nonneg(x, &fr.lo)) {
        r->ok = 0;
        return;
      }
      poly_mul(x, &lo, &fr.lo, &tmp);
      lo = tmp;
      poly_mul(x, &hi, &fr.hi, &tmp);
      hi = tmp;
    }
    if (t->c >= 0) {
      poly_add(x, &r->lo, &lo, t->c);
      poly_add(x, &r->hi, &hi, t->c);
    } else {
      poly_add(x, &r->lo, &hi, t->c);
      poly_add(x, &r->hi, &lo, t->c);
    }
  }
  if (r->lo.bad || r->hi.bad) r->ok = 0;
}

/* The range of p through the facts: p = sum k_f * e_f + rest, each e_f in [lo_f, hi_f] (k_f
 * from the coefficient, in p, of e_f's first monomial), rest over the loop variables. */
static void range_with_facts(lm_exprs *x, const poly *p, const lm_xctx *ctx, range *r) {
  poly rest = *p;
  int64_t lo = 0, hi = 0;
  int used = 0;
  lm_xctx plain = *ctx; /* (the facts' own atoms are simplified without them: no recursion) */
  plain.facts = NULL, plain.nfacts = 0;
  for (int i = 0; i < ctx->nfacts; i++) {
    const lm_xfact *f = &ctx->facts[i];
    poly pf;
    poly_of(x, f->e, &plain, &pf);
    if (pf.bad || !pf.n || !pf.t[0].n) continue;
    int64_t k = 0;
    for (int j = 0; j < rest.n; j++)
      if (!mono_cmp(x, &rest.t[j], &pf.t[0])) k = rest.t[j].c % pf.t[0].c ? 0 : rest.t[j].c / pf.t[0].c;
    int64_t a, b;
    if (!k || __builtin_mul_overflow(k, f->lo, &a) || __builtin_mul_overflow(k, f->hi, &b) ||
        __builtin_add_overflow(lo, k > 0 ? a : b, &lo) || __builtin_add_overflow(hi, k > 0 ? b : a, &hi))
      continue;
    poly_add(x, &rest, &pf, -k);
    used = 1;
  }
  range_of_poly(x, &rest, &plain, r);
  r->ok &= used && !rest.bad;
  poly c;
  poly_const(&c, lo);
  poly_add(x, &r->lo, &c, 1);
  poly_const(&c, hi);
  poly_add(x, &r->hi, &c, 1);
  if (r->lo.bad || r->hi.bad) r->ok = 0;
}

/* Constant bounds of p over every binding, the facts' and the loops' extents' joined: 1 when
 * both are found. */
static int poly_bounds(lm_exprs *x, const poly *p, const lm_xctx *ctx, int64_t *lo, int64_t *hi) {
  range r;
  range_of_poly(x, p, ctx, &r);
  int ok = r.ok && poly_is_const(&r.lo, lo) && poly_is_const(&r.hi, hi);
  if (ctx && ctx->nfacts) {
    int64_t flo, fhi;
    range_with_facts(x, p, ctx, &r);
    if (r.ok && poly_is_const(&r.lo, &flo) && poly_is_const(&r.hi, &fhi)) {
      *lo = ok && *lo > flo ? *lo : flo;
      *hi = ok && *hi < fhi ? *hi : fhi;
      ok = 1;
    }
  }
  return ok;
}

/* 0 <= p < d for every binding (d a polynomial over symbols). */
static int poly_within(lm_exprs *x, const poly *p, const poly *d, const lm_xctx *ctx) {
  range r;
  range_of_poly(x, p, ctx, &r);
  if ((!r.ok || !poly_nonneg(x, &r.lo)) && ctx && ctx->nfacts) range_with_facts(x, p, ctx, &r);
  if (!r.ok || !poly_nonneg(x, &r.lo)) return 0;
  poly gap = *d, one;
  poly_add(x, &gap, &r.hi, -1);
  poly_const(&one, -1);
  poly_add(x, &gap, &one, 1); /* d - hi - 1 >= 0 */
  return poly_nonneg(x, &gap);
}

/* ---------------------------------------------------------------- canonicaliser */

static lm_expr simplify_atom(lm_exprs *x, lm_expr e, const lm_xctx *ctx);

static void poly_of(lm_exprs *x, lm_expr e, const lm_xctx *ctx, poly *out) {
  const lm_xnode nd = x->nodes[e];
  switch (nd.op) {
  case LM_X_CONST: poly_const(out, nd.v); return;
  case LM_X_VAR:
  case LM_X_SYM: poly_atom(out, e); return;
  case LM_X_ADD: {
    poly b;
    poly_of(x, nd.a, ctx, out);
    poly_of(x, nd.b, ctx, &b);
    poly_add(x, out, &b, 1);
    return;
  }
  case LM_X_MUL: {
    poly a, b;
    poly_of(x, nd.a, ctx, &a);
    poly_of(x, nd.b, ctx, &b);
    poly_mul(x, &a, &b, out);
    return;
  }
  default: {
    lm_expr s = simplify_atom(x, e, ctx);
    uint8_t op = x->nodes[s].op;
    if (!s) {
      poly_const(out, 0);
      out->bad = 1;
    } else if (op == LM_X_DIV || op == LM_X_MOD || op == LM_X_LT || op == LM_X_AND) poly_atom(out, s);
    else poly_of(x, s, ctx, out);
  }
  }
}

static int split_by(const lm_exprs *x, const poly *p, const poly *d, poly *q, poly *r);

/* Does the divisor d (a polynomial of one term) divide m (an expression) exactly? */
static int divides(lm_exprs *x, const poly *d, lm_expr m, const lm_xctx *ctx) {
  poly pm, q, r;
  poly_of(x, m, ctx, &pm);
  return !pm.bad && split_by(x, &pm, d, &q, &r) && r.n == 0 && q.n > 0;
}

/* d*(z/d) + y%d = z, where z is y itself or y % m for a multiple m of d (the canonical form of
 * z % d is then y % d): folds the pair a reshape round trip leaves behind, and the row/column
 * pair of a flattened buffer read at a shuffled row z = (a*i + b) % m. */
static void recombine(lm_exprs *x, poly *p, const lm_xctx *ctx) {
  for (int changed = 1; changed && !p->bad;) {
    changed = 0;
    for (int i = 0; i < p->n && !changed; i++) {
      const term *tb = &p->t[i];
      if (tb->n != 1 || x->nodes[tb->f[0]].op != LM_X_MOD) continue;
      const lm_xnode md = x->nodes[tb->f[0]];
      poly pd;
      poly_of(x, md.b, ctx, &pd);
      if (pd.bad || pd.n != 1) continue;
      /* the candidates for z: y, and every y % m among the numerators of the sum's divisions by d */
      lm_expr zs[1 + MAXTERMS];
      int nz = 0;
      zs[nz++] = md.a;
      for (int j = 0; j < p->n && nz < (int)LM_COUNTOF(zs); j++)
        for (int k = 0; k < p->t[j].n && nz < (int)LM_COUNTOF(zs); k++) {
          const lm_xnode *f = &x->nodes[p->t[j].f[k]];
          if (f->op != LM_X_DIV || f->b != md.b || x->nodes[f->a].op != LM_X_MOD) continue;
          const lm_xnode *z = &x->nodes[f->a];
          if (z->a == md.a && divides(x, &pd, z->b, ctx)) zs[nz++] = f->a;
        }
      for (int zi = 0; zi < nz && !changed; zi++) {
        lm_expr dv = intern(x, LM_X_DIV, zs[zi], md.b, 0);
        poly want, z;
        term a = {.c = 1, .n = 1, .f = {dv}};
        poly pa1 = {.n = 1, .t = {a}};
        poly_mul(x, &pa1, &pd, &want);
        if (want.bad || want.n != 1) continue;
        for (int j = 0; j < p->n; j++) {
          int64_t wc;
          if (j == i || mono_cmp(x, &p->t[j], &want.t[0]) ||
              __builtin_mul_overflow(tb->c, want.t[0].c, &wc) || p->t[j].c != wc)
            continue;
          int64_t c = tb->c;
          term rm1 = p->t[i], rm2 = p->t[j];
          rm1.c = -rm1.c;
          rm2.c = -rm2.c;
          poly_addterm(x, p, &rm1);
          poly_addterm(x, p, &rm2);
          poly_of(x, zs[zi], ctx, &z);
          poly_add(x, p, &z, c);
          changed = 1;
          break;
        }
      }
    }
  }
}

/* Splits p into q*d + r where d is c*m (c > 0, m a monomial): a term goes to q when its
 * coefficient is a multiple of c and its monomial contains m. */
static int split_by(const lm_exprs *x, const poly *p, const poly *d, poly *q, poly *r) {
  poly_const(q, 0);
  poly_const(r, 0);
  if (d->bad || d->n != 1 || d->t[0].c <= 0) return 0;
  const term *dt = &d->t[0];
  for (int i = 0; i < p->n; i++) {
    term t = p->t[i];
    int ok = t.c % dt->c == 0;
    for (int k = 0; k < dt->n && ok; k++) {
      int at = -1;
      for (int j = 0; j < t.n && at < 0; j++)
        if (t.f[j] == dt->f[k]) at = j;
      if (at < 0) ok = 0;
      else {
        memmove(&t.f[at], &t.f[at + 1], (size_t)(t.n - at - 1) * sizeof(lm_expr));
        t.n--;
      }
    }
    if (ok) {
      t.c /= dt->c;
      poly_addterm(x, q, &t);
    } else poly_addterm(x, r, &p->t[i]);
  }
  return !q->bad && !r->bad;
}

/* For a constant divisor d: each coefficient c of the remainder r written as q_c*d + r_c (q_c*t
 * moves into the quotient q), with r_c in [0, d) or, failing that, in (-d/2, d/2]; kept when the
 * new remainder lies in [0, d), so (t + 13 j) % 12 is t + j where t + j < 12 (the rows of a
 * window view, lm_window: each row of L + 1 read as a row of L). */
static void reduce_mod(lm_exprs *x, int64_t d, poly *q, poly *r, const lm_xctx *ctx) {
  poly pd;
  poly_const(&pd, d);
  for (int balanced = 0; balanced < 2; balanced++) {
    poly q2 = *q, r2;
    poly_const(&r2, 0);
    int moved = 0;
    for (int i = 0; i < r->n; i++) {
      term t = r->t[i];
      int64_t rc = floormod(t.c, d);
      if (balanced && rc > d / 2) rc -= d;
      int64_t qc = (t.c - rc) / d;
      if (qc) {
        term tq = t;
        tq.c = qc;
        poly_addterm(x, &q2, &tq);
        moved = 1;
      }
      if (rc) {
        t.c = rc;
        poly_addterm(x, &r2, &t);
      }
    }
    if (moved && !q2.bad && !r2.bad && poly_within(x, &r2, &pd, ctx)) {
      *q = q2, *r = r2;
      return;
    }
  }
}

/* c*inner + r as a canonical expression (a modulo rebuilt from the smaller one), 0 when a poly overflowed. */
static lm_expr times_plus(lm_exprs *x, lm_expr inner, int64_t c, const poly *r, const lm_xctx *ctx) {
  poly out, pi;
  poly_of(x, inner, ctx, &pi);
  poly_const(&out, 0);
  poly_add(x, &out, &pi, c);
  poly_add(x, &out, r, 1);
  return out.bad ? 0 : poly_expr(x, &out);
}

static lm_expr simplify_divmod(lm_exprs *x, uint8_t op, lm_expr a, lm_expr b, const lm_xctx *ctx) {
  poly pa, pb, q, r;
  lm_expr sa = lm_x_simplify(x, a, ctx), sb = lm_x_simplify(x, b, ctx);
  if (!sa || !sb) return 0;
  poly_of(x, sa, ctx, &pa);
  recombine(x, &pa, ctx);
  poly_of(x, sb, ctx, &pb);
  int64_t ca, cb;
  if (poly_is_const(&pb, &cb) && cb <= 0) return intern(x, op, sa, sb, 0); /* invalid: leave */
  if (poly_is_const(&pa, &ca) && poly_is_const(&pb, &cb))
    return lm_x_const(x, op == LM_X_DIV ? floordiv(ca, cb) : floormod(ca, cb));
  if (pa.bad || pb.bad) return intern(x, op, sa, sb, 0);
  /* (y / d1) / d2 = y / (d1*d2) */
  if (op == LM_X_DIV && pa.n == 1 && pa.t[0].c == 1 && pa.t[0].n == 1 &&
      x->nodes[pa.t[0].f[0]].op == LM_X_DIV) {
    const lm_xnode inner = x->nodes[pa.t[0].f[0]];
    return simplify_divmod(x, LM_X_DIV, inner.a, lm_x_mul(x, inner.b, sb), ctx);
  }
  /* (y % (k*d)) % d = y % d */
  if (op == LM_X_MOD && pa.n == 1 && pa.t[0].c == 1 && pa.t[0].n == 1 &&
      x->nodes[pa.t[0].f[0]].op == LM_X_MOD) {
    const lm_xnode inner = x->nodes[pa.t[0].f[0]];
    poly pd, q2, r2;
    poly_of(x, inner.b, ctx, &pd);
    if (split_by(x, &pd, &pb, &q2, &r2) && r2.n == 0)
      return simplify_divmod(x, LM_X_MOD, inner.a, sb, ctx);
  }
  /* floor((c*y + r) / (c*m)) = floor(y / m) and (c*y + r) % (c*m) = c*(y % m) + r when the
   * divisor's constant factor c divides every other coefficient and 0 <= r < c: column r of a row
   * y of a flattened [.., m, c] buffer (c*y + r is its flat index) */
  if (pb.n == 1 && pb.t[0].c > 1 && pb.t[0].n > 0) {
    int64_t c = pb.t[0].c;
    poly y, rr, pc, pm = pb;
    poly_const(&y, 0);
    poly_const(&rr, 0);
    for (int i = 0; i < pa.n; i++) {
      term t = pa.t[i];
      if (t.c % c == 0) {
        t.c /= c;
        poly_addterm(x, &y, &t);
      } else poly_addterm(x, &rr, &t);
    }
    poly_const(&pc, c);
    pm.t[0].c = 1;
    if (!y.bad && !rr.bad && poly_within(x, &rr, &pc, ctx)) {
      lm_expr inner = simplify_divmod(x, op, poly_expr(x, &y), poly_expr(x, &pm), ctx);
      if (!inner || op == LM_X_DIV) return inner;
      if ((inner = times_plus(x, inner, c, &rr, ctx))) return inner;
    }
  }
  /* the same with a constant divisor d: g = gcd(d, every variable term's coefficient) plays c,
   * floor((g*y + r) / d) = floor(y / (d/g)) for 0 <= r < g (a jammed copy 4*i + 1 of a tap
   * index: (4*i + 1) / 12 is i / 3, as for the copy 4*i) */
  if (poly_is_const(&pb, &cb) && cb > 1 && pa.n > 0) {
    int64_t g = cb;
    for (int i = 0; i < pa.n && g > 1; i++)
      if (pa.t[i].n > 0)
        for (int64_t v = pa.t[i].c < 0 ? -pa.t[i].c : pa.t[i].c, t; v; t = g % v, g = v, v = t) {}
    if (g > 1 && g < cb) {
      poly y, rr, pg;
      poly_const(&y, 0);
      poly_const(&rr, 0);
      for (int i = 0; i < pa.n; i++) {
        term t = pa.t[i];
        if (t.n > 0) {
          t.c /= g;
          poly_addterm(x, &y, &t);
        } else poly_addterm(x, &rr, &t);
      }
      poly_const(&pg, g);
      if (!y.bad && !rr.bad && (!rr.n || poly_within(x, &rr, &pg, ctx))) {
        lm_expr inner = simplify_divmod(x, op, poly_expr(x, &y), lm_x_const(x, cb / g), ctx);
        if (!inner || op == LM_X_DIV) return inner;
        if ((inner = times_plus(x, inner, g, &rr, ctx))) return inner;
      }
    }
  }
  /* floor((c*y + r) / d) = floor((y + k) / (d/c)) and (c*y + r) % d = c*((y + k) % (d/c)) +
   * r - k*c for a coefficient c dividing d, when the other terms r lie in [k*c, (k+1)*c) (a
   * guard's facts count): a padded map's cell read back through the map's flat index, inside the
   * pad (40*i + 4*j + l - 44) / 80 with 4*j + l - 44 in [-40, -1] is (i - 1) / 2 */
  if (poly_is_const(&pb, &cb) && cb > 1)
    for (int i = 0; i < pa.n; i++) {
      int64_t c = pa.t[i].c, lo = 0, hi = 0;
      if (pa.t[i].n == 0 || c <= 1 || cb % c) continue;
      poly y, rr, k;
      poly_const(&y, 0);
      poly_const(&rr, 0);
      for (int j = 0; j < pa.n; j++) {
        term t = pa.t[j];
        if (t.n > 0 && t.c % c == 0) {
          t.c /= c;
          poly_addterm(x, &y, &t);
        } else poly_addterm(x, &rr, &t);
      }
      if (y.bad || rr.bad || !rr.n || !poly_bounds(x, &rr, ctx, &lo, &hi) || floordiv(lo, c) != floordiv(hi, c))
        continue;
      poly_const(&k, floordiv(lo, c));
      poly_add(x, &y, &k, 1);
      poly_add(x, &rr, &k, -c);
      lm_expr inner = y.bad || rr.bad ? 0 : simplify_divmod(x, op, poly_expr(x, &y), lm_x_const(x, cb / c), ctx);
      if (!inner) continue;
      if (op == LM_X_DIV) return inner;
      if ((inner = times_plus(x, inner, c, &rr, ctx))) return inner;
    }
  if (!split_by(x, &pa, &pb, &q, &r)) {
    q.n = 0;
    r = pa;
  }
  int64_t d;
  if (poly_is_const(&pb, &d) && d > 1 && !poly_within(x, &r, &pb, ctx)) reduce_mod(x, d, &q, &r, ctx);
  lm_expr rest;
  if (poly_within(x, &r, &pb, ctx)) rest = op == LM_X_DIV ? lm_x_const(x, 0) : poly_expr(x, &r);
  else if (r.n == 0) rest = lm_x_const(x, 0);
  else rest = intern(x, op, poly_expr(x, &r), sb, 0);
  if (op == LM_X_MOD) return rest;
  /* floor((q*d + r) / d) = q + floor(r / d) for integer q */
  poly sum;
  if (x->nodes[rest].op == LM_X_DIV) poly_atom(&sum, rest); /* already canonical */
  else poly_const(&sum, 0);
  poly_add(x, &sum, &q, 1);
  return sum.bad ? intern(x, op, sa, sb, 0) : poly_expr(x, &sum);
}

static lm_expr simplify_atom_raw(lm_exprs *x, lm_expr e, const lm_xctx *ctx);

static lm_expr simplify_atom(lm_exprs *x, lm_expr e, const lm_xctx *ctx) {
  xkey ch = ctx_hash(ctx);
  lm_expr r = memo_get(x, 2, e, ch);
  if (!r) memo_put(x, 2, e, ch, r = simplify_atom_raw(x, e, ctx));
  return r;
}

static lm_expr simplify_atom_raw(lm_exprs *x, lm_expr e, const lm_xctx *ctx) {
  const lm_xnode nd = x->nodes[e];
  switch (nd.op) {
  case LM_X_DIV:
  case LM_X_MOD: return simplify_divmod(x, nd.op, nd.a, nd.b, ctx);
  case LM_X_LT: {
    lm_expr a = lm_x_simplify(x, nd.a, ctx), b = lm_x_simplify(x, nd.b, ctx);
    if (!a || !b) return 0;
    if (lm_x_prove_gt(x, b, a, ctx)) return lm_x_const(x, 1);
    if (lm_x_prove_ge(x, a, b, ctx)) return lm_x_const(x, 0);
    return lm_x_lt(x, a, b);
  }
  case LM_X_AND: {
    lm_expr a = lm_x_simplify(x, nd.a, ctx), b = lm_x_simplify(x, nd.b, ctx);
    if (struct_cmp(x, a, b) > 0) {
      lm_expr t = a;
      a = b;
      b = t;
    }
    return lm_x_and(x, a, b);
  }
  default: return e;
  }
}

lm_expr lm_x_simplify(lm_exprs *x, lm_expr e, const lm_xctx *ctx) {
  if (!e || x->failed) return 0;
  xkey ch = ctx_hash(ctx);
  lm_expr r = memo_get(x, 1, e, ch);
  if (r) return r;
  poly p;
  poly_of(x, e, ctx, &p);
  recombine(x, &p, ctx);
  r = p.bad ? e : poly_expr(x, &p);
  memo_put(x, 1, e, ch, r);
  return r;
}

/* Bounds from guard's conjuncts c < t and t < c, merged per t. */
static int guard_facts(lm_exprs *x, lm_expr g, const lm_xctx *ctx, lm_xfact *f, int n, int cap) {
  const lm_xnode nd = x->nodes[g];
  if (nd.op == LM_X_AND) return guard_facts(x, nd.b, ctx, f, guard_facts(x, nd.a, ctx, f, n, cap), cap);
  if (nd.op != LM_X_LT || (!is_c(x, nd.a) && !is_c(x, nd.b)) || (is_c(x, nd.a) && is_c(x, nd.b))) return n;
  lm_expr t = lm_x_simplify(x, is_c(x, nd.a) ? nd.b : nd.a, ctx);
  int64_t lo = is_c(x, nd.a) ? cv(x, nd.a) + 1 : INT64_MIN, hi = is_c(x, nd.b) ? cv(x, nd.b) - 1 : INT64_MAX;
  for (int i = 0; i < n; i++)
    if (f[i].e == t) {
      if (lo > f[i].lo) f[i].lo = lo;
      if (hi < f[i].hi) f[i].hi = hi;
      return n;
    }
  if (!t || n == cap) return n;
  f[n] = (lm_xfact){t, lo, hi};
  return n + 1;
}

int lm_x_guard_facts(lm_exprs *x, lm_expr guard, const lm_xctx *ctx, lm_xfact f[LM_X_GUARD_FACTS]) {
  int n = guard && ctx ? guard_facts(x, guard, ctx, f, 0, LM_X_GUARD_FACTS) : 0, m = 0;
  for (int i = 0; i < n; i++) {
    if (f[i].lo == INT64_MIN || f[i].hi == INT64_MAX) { /* the other side from the loops' extents */
      poly p;
      range r;
      int64_t lo, hi;
      poly_of(x, f[i].e, ctx, &p);
      if (p.bad) continue;
      range_of_poly(x, &p, ctx, &r);
      if (!r.ok) continue;
      if (f[i].lo == INT64_MIN && poly_is_const(&r.lo, &lo)) f[i].lo = lo;
      if (f[i].hi == INT64_MAX && poly_is_const(&r.hi, &hi)) f[i].hi = hi;
    }
    if (f[i].lo != INT64_MIN && f[i].hi != INT64_MAX) f[m++] = f[i]; /* two-sided bounds only */
  }
  return m;
}

lm_expr lm_x_simplify_guarded(lm_exprs *x, lm_expr e, lm_expr guard, const lm_xctx *ctx) {
  lm_xfact f[LM_X_GUARD_FACTS];
  int m = lm_x_guard_facts(x, guard, ctx, f);
  if (!m) return lm_x_simplify(x, e, ctx);
  lm_xctx c = *ctx;
  c.facts = f, c.nfacts = m;
  return lm_x_simplify(x, e, &c);
}

static int prove_diff_nonneg(lm_exprs *x, lm_expr a, lm_expr b, int64_t margin, const lm_xctx *ctx) {
  poly pa, pb;
  range r;
  poly_of(x, a, ctx, &pa);
  poly_of(x, b, ctx, &pb);
  poly_add(x, &pa, &pb, -1);
  if (margin) {
    poly m;
    poly_const(&m, -margin);
    poly_add(x, &pa, &m, 1);
  }
  if (pa.bad) return 0;
  range_of_poly(x, &pa, ctx, &r);
  if ((!r.ok || !poly_nonneg(x, &r.lo)) && ctx && ctx->nfacts) range_with_facts(x, &pa, ctx, &r);
  return r.ok && poly_nonneg(x, &r.lo);
}

int lm_x_prove_ge(lm_exprs *x, lm_expr a, lm_expr b, const lm_xctx *ctx) {
  return a && b && prove_diff_nonneg(x, a, b, 0, ctx);
}
int lm_x_prove_gt(lm_exprs *x, lm_expr a, lm_expr b, const lm_xctx *ctx) {
  return a && b && prove_diff_nonneg(x, a, b, 1, ctx);
}
int lm_x_prove_eq(lm_exprs *x, lm_expr a, lm_expr b) {
  if (!a || !b) return 0;
  if (a == b) return 1;
  return lm_x_simplify(x, a, NULL) == lm_x_simplify(x, b, NULL);
}

int lm_x_divmods(const lm_exprs *x, lm_expr e, int var, int64_t *d, int *nd) {
  const lm_xnode *n = &x->nodes[e];
  if (n->op == LM_X_CONST || n->op == LM_X_VAR || n->op == LM_X_SYM) return 0;
  int here = 0;
  if ((n->op == LM_X_DIV || n->op == LM_X_MOD) && (var < 0 || (var < 64 && (lm_x_vars_used(x, n->a) >> var) & 1))) {
    here = 1;
    if (d && is_c(x, n->b) && *nd < 8) d[(*nd)++] = cv(x, n->b);
  }
  return here + lm_x_divmods(x, n->a, var, d, nd) + lm_x_divmods(x, n->b, var, d, nd);
}

uint64_t lm_x_vars_used(const lm_exprs *x, lm_expr e) {
  if (!e) return 0;
  const lm_xnode *nd = &x->nodes[e];
  switch (nd->op) {
  case LM_X_CONST:
  case LM_X_SYM: return 0;
  case LM_X_VAR: return nd->v < 64 ? 1ull << nd->v : 0;
  default: return lm_x_vars_used(x, nd->a) | lm_x_vars_used(x, nd->b);
  }
}

uint64_t lm_x_syms_used(const lm_exprs *x, lm_expr e) {
  if (!e) return 0;
  const lm_xnode *nd = &x->nodes[e];
  switch (nd->op) {
  case LM_X_CONST:
  case LM_X_VAR: return 0;
  case LM_X_SYM: return 1ull << (nd->v < 63 ? nd->v : 63);
  default: return lm_x_syms_used(x, nd->a) | lm_x_syms_used(x, nd->b);
  }
}

int64_t lm_x_eval(const lm_exprs *x, lm_expr e, const int64_t *vars, const int64_t *syms) {
  const lm_xnode *nd = &x->nodes[e];
  switch (nd->op) {
  case LM_X_CONST: return nd->v;
  case LM_X_VAR: return vars[nd->v];
  case LM_X_SYM: return syms[nd->v];
  default: break;
  }
  int64_t a = lm_x_eval(x, nd->a, vars, syms);
  if (nd->op == LM_X_AND && !a) return 0;
  int64_t b = lm_x_eval(x, nd->b, vars, syms);
  switch (nd->op) {
  case LM_X_ADD: return a + b;
  case LM_X_MUL: return a * b;
  case LM_X_DIV: return b > 0 ? floordiv(a, b) : 0;
  case LM_X_MOD: return b > 0 ? floormod(a, b) : 0;
  case LM_X_LT: return a < b;
  case LM_X_AND: return b != 0;
  default: LM_ASSERT(!"bad expression op"); return 0;
  }
}

static int prec(uint8_t op) {
  switch (op) {
  case LM_X_AND: return 1;
  case LM_X_LT: return 2;
  case LM_X_ADD: return 3;
  case LM_X_MUL:
  case LM_X_DIV:
  case LM_X_MOD: return 4;
  default: return 5;
  }
}

static void print_rec(const lm_exprs *x, lm_expr e, lm_sb *sb, const char *vp, int outer) {
  const lm_xnode *nd = &x->nodes[e];
  switch (nd->op) {
  case LM_X_CONST: lm_sb_printf(sb, nd->v < 0 && outer > 3 ? "(%lld)" : "%lld", (long long)nd->v); return;
  case LM_X_VAR: lm_sb_printf(sb, "%s%lld", vp, (long long)nd->v); return;
  case LM_X_SYM: lm_sb_puts(sb, x->syms[nd->v].name); return;
  default: break;
  }
  static const char *const sym[LM_X_COUNT] = {[LM_X_ADD] = " + ", [LM_X_MUL] = "*", [LM_X_DIV] = "/",
                                              [LM_X_MOD] = "%", [LM_X_LT] = " < ", [LM_X_AND] = " && "};
  int p = prec(nd->op);
  int paren = p < outer;
  if (paren) lm_sb_puts(sb, "(");
  /* a + (-1)*b prints as a - b */
  if (nd->op == LM_X_ADD && x->nodes[nd->b].op == LM_X_MUL && is_c(x, x->nodes[nd->b].b) &&
      cv(x, x->nodes[nd->b].b) == -1) {
    print_rec(x, nd->a, sb, vp, p);
    lm_sb_puts(sb, " - ");
    print_rec(x, x->nodes[nd->b].a, sb, vp, p + 1);
  } else {
    print_rec(x, nd->a, sb, vp, p);
    lm_sb_puts(sb, sym[nd->op]);
    print_rec(x, nd->b, sb, vp, p + 1);
  }
  if (paren) lm_sb_puts(sb, ")");
}

void lm_x_print(const lm_exprs *x, lm_expr e, lm_sb *sb, const char *var_prefix) {
  if (!e) {
    lm_sb_puts(sb, "<none>");
    return;
  }
  print_rec(x, e, sb, var_prefix, 0);
}

int lm_x_step(lm_exprs *x, lm_expr e, int var, int nvars, int64_t *d) {
  if (var < 0 || var >= nvars) return 0;
  lm_expr *map = lm_calloc((size_t)nvars, sizeof *map); /* 0: the variable stays */
  if (!map) return 0;
  map[var] = lm_x_add(x, lm_x_var(x, var), lm_x_const(x, 1));
  lm_expr diff = map[var] ? lm_x_simplify(x, lm_x_sub(x, lm_x_subst(x, e, map, nvars), e), NULL) : 0;
  lm_free(map);
  if (!diff || x->nodes[diff].op != LM_X_CONST) return 0;
  *d = x->nodes[diff].v;
  return 1;
}

lm_expr lm_x_subst(lm_exprs *x, lm_expr e, const lm_expr *map, int nmap) {
  if (!e) return 0;
  const lm_xnode nd = x->nodes[e];
  switch (nd.op) {
  case LM_X_CONST:
  case LM_X_SYM: return e;
  case LM_X_VAR: return nd.v < nmap && map[nd.v] ? map[nd.v] : e;
  default: break;
  }
  lm_expr a = lm_x_subst(x, nd.a, map, nmap), b = lm_x_subst(x, nd.b, map, nmap);
  switch (nd.op) {
  case LM_X_ADD: return lm_x_add(x, a, b);
  case LM_X_MUL: return lm_x_mul(x, a, b);
  case LM_X_DIV: return lm_x_div(x, a, b);
  case LM_X_MOD: return lm_x_mod(x, a, b);
  case LM_X_LT: return lm_x_lt(x, a, b);
  default: return lm_x_and(x, a, b);
  }
}
