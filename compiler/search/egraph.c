/* compiler/search/egraph.c — the e-graph engine (egraph.h): node arena, hashcons, union-find,
 * egg's deferred rebuild with analysis propagation, the invariant checker, e-matching and the
 * back-off rule runner. */
#include "search/egraph.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core.h"

double lm_search_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- small vectors */

static int vec_push(lm_egraph *g, lm_eg_vec *v, uint32_t x) {
  if (v->n == v->cap) {
    uint32_t nc = v->cap ? v->cap * 2 : 4;
    uint32_t *p = lm_realloc(v->v, (size_t)nc * sizeof *p);
    if (!p) {
      g->failed = 1;
      return 0;
    }
    v->v = p;
    v->cap = nc;
  }
  v->v[v->n++] = x;
  return 1;
}

static int vec_append(lm_egraph *g, lm_eg_vec *into, lm_eg_vec *from) {
  for (uint32_t i = 0; i < from->n; i++)
    if (!vec_push(g, into, from->v[i])) return 0;
  lm_free(from->v);
  memset(from, 0, sizeof *from);
  return 1;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static void vec_sort_unique(lm_eg_vec *v) {
  if (v->n < 2) return;
  qsort(v->v, v->n, sizeof *v->v, cmp_u32);
  uint32_t k = 1;
  for (uint32_t i = 1; i < v->n; i++)
    if (v->v[i] != v->v[k - 1]) v->v[k++] = v->v[i];
  v->n = k;
}

/* ---------------------------------------------------------------- union-find */

uint32_t lm_eg_find(lm_egraph *g, uint32_t c) {
  while (g->uf[c] != c) {
    g->uf[c] = g->uf[g->uf[c]]; /* path halving */
    c = g->uf[c];
  }
  return c;
}

/* ---------------------------------------------------------------- hashcons */

static uint64_t node_hash(const lm_enode *n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n->op << 40) ^ ((uint64_t)n->n << 56) ^ n->attr;
  h *= 0xBF58476D1CE4E5B9ull;
  for (int i = 0; i < n->n; i++) {
    h ^= n->c[i] + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
    h *= 0x94D049BB133111EBull;
  }
  return h ^ (h >> 31);
}

static int node_eq(const lm_enode *a, const lm_enode *b) {
  if (a->op != b->op || a->n != b->n || a->attr != b->attr) return 0;
  for (int i = 0; i < a->n; i++)
    if (a->c[i] != b->c[i]) return 0;
  return 1;
}

#define TOMB UINT32_MAX

static uint32_t hc_find(const lm_egraph *g, const lm_enode *n) {
  if (!g->tcap) return LM_EG_NONE;
  size_t mask = g->tcap - 1, i = (size_t)node_hash(n) & mask;
  for (;;) {
    uint32_t e = g->tab[i];
    if (e == 0) return LM_EG_NONE;
    if (e != TOMB && node_eq(&g->nodes[e - 1], n)) return e - 1;
    i = (i + 1) & mask;
  }
}

static int hc_grow(lm_egraph *g) {
  size_t nc = g->tcap ? g->tcap : 64;
  while ((g->tcount + 1) * 2 > nc) nc *= 2;
  uint32_t *t = lm_calloc(nc, sizeof *t);
  if (!t) {
    g->failed = 1;
    return 0;
  }
  for (size_t i = 0; i < g->tcap; i++) {
    uint32_t e = g->tab[i];
    if (e == 0 || e == TOMB) continue;
    size_t j = (size_t)node_hash(&g->nodes[e - 1]) & (nc - 1);
    while (t[j]) j = (j + 1) & (nc - 1);
    t[j] = e;
  }
  lm_free(g->tab);
  g->tab = t;
  g->tcap = nc;
  g->ttomb = 0;
  return 1;
}

static int hc_insert(lm_egraph *g, uint32_t id) {
  if ((g->tcount + g->ttomb + 1) * 2 > g->tcap && !hc_grow(g)) return 0;
  size_t mask = g->tcap - 1, i = (size_t)node_hash(&g->nodes[id]) & mask;
  while (g->tab[i] != 0 && g->tab[i] != TOMB) i = (i + 1) & mask;
  if (g->tab[i] == TOMB) g->ttomb--;
  g->tab[i] = id + 1;
  g->tcount++;
  return 1;
}

static void hc_remove(lm_egraph *g, uint32_t id) {
  if (!g->tcap) return;
  size_t mask = g->tcap - 1, i = (size_t)node_hash(&g->nodes[id]) & mask;
  for (;;) {
    uint32_t e = g->tab[i];
    if (e == 0) return;
    if (e == id + 1) {
      g->tab[i] = TOMB;
      g->tcount--;
      g->ttomb++;
      return;
    }
    i = (i + 1) & mask;
  }
}

/* ---------------------------------------------------------------- life cycle */

lm_egraph *lm_eg_new(const lm_eg_analysis *an) {
  lm_egraph *g = lm_calloc(1, sizeof *g);
  if (!g) return NULL;
  if (an) g->an = *an;
  if (!g->an.size) g->an.size = 1;
  g->scratch = lm_calloc(1, g->an.size);
  g->cur_rule = -1;
  if (!g->scratch) {
    lm_free(g);
    return NULL;
  }
  return g;
}

void lm_eg_free(lm_egraph *g) {
  if (!g) return;
  for (size_t i = 0; i < g->nclasses; i++) {
    lm_free(g->cnodes[i].v);
    lm_free(g->cparents[i].v);
  }
  lm_free(g->nodes);
  lm_free(g->node_cls);
  lm_free(g->node_rule);
  lm_free(g->node_inexact);
  lm_free(g->uf);
  lm_free(g->cnodes);
  lm_free(g->cparents);
  lm_free(g->data);
  lm_free(g->taint);
  lm_free(g->merged_by);
  lm_free(g->tab);
  lm_free(g->pending.v);
  lm_free(g->scratch);
  lm_free(g);
}

static void canon(lm_egraph *g, lm_enode *n) {
  for (int i = 0; i < n->n; i++) n->c[i] = lm_eg_find(g, n->c[i]);
}

uint32_t lm_eg_lookup(lm_egraph *g, const lm_enode *n) {
  lm_enode k = *n;
  for (int i = k.n; i < LM_EG_MAXC; i++) k.c[i] = 0;
  canon(g, &k);
  uint32_t id = hc_find(g, &k);
  return id == LM_EG_NONE ? id : lm_eg_find(g, g->node_cls[id]);
}

static void make(lm_egraph *g, const lm_enode *n, void *out) {
  memset(out, 0, g->an.size);
  if (g->an.make) g->an.make(g->an.ctx, g, n, out);
}

uint32_t lm_eg_add(lm_egraph *g, const lm_enode *n) {
  if (g->failed) return LM_EG_NONE;
  lm_enode k = *n;
  for (int i = k.n; i < LM_EG_MAXC; i++) k.c[i] = 0;
  canon(g, &k);
  uint32_t id = hc_find(g, &k);
  if (id != LM_EG_NONE) return lm_eg_find(g, g->node_cls[id]);
  if (g->nnodes == g->nodecap) {
    size_t nc = g->nodecap ? g->nodecap * 2 : 256;
    lm_enode *a = lm_realloc(g->nodes, nc * sizeof *a);
    if (a) g->nodes = a;
    uint32_t *b = lm_realloc(g->node_cls, nc * sizeof *b);
    if (b) g->node_cls = b;
    int16_t *r = lm_realloc(g->node_rule, nc * sizeof *r);
    if (r) g->node_rule = r;
    uint8_t *ix = lm_realloc(g->node_inexact, nc);
    if (ix) g->node_inexact = ix;
    if (!a || !b || !r || !ix) return g->failed = 1, LM_EG_NONE;
    g->nodecap = nc;
  }
  if (g->nclasses == g->classcap) {
    size_t nc = g->classcap ? g->classcap * 2 : 256;
    uint32_t *u = lm_realloc(g->uf, nc * sizeof *u);
    if (u) g->uf = u;
    lm_eg_vec *cn = lm_realloc(g->cnodes, nc * sizeof *cn);
    if (cn) g->cnodes = cn;
    lm_eg_vec *cp = lm_realloc(g->cparents, nc * sizeof *cp);
    if (cp) g->cparents = cp;
    unsigned char *d = lm_realloc(g->data, nc * g->an.size);
    if (d) g->data = d;
    uint8_t *t = lm_realloc(g->taint, nc);
    if (t) g->taint = t;
    uint64_t *mb = lm_realloc(g->merged_by, nc * sizeof *mb);
    if (mb) g->merged_by = mb;
    if (!u || !cn || !cp || !d || !t || !mb) return g->failed = 1, LM_EG_NONE;
    g->classcap = nc;
  }
  id = (uint32_t)g->nnodes++;
  uint32_t c = (uint32_t)g->nclasses++;
  g->nodes[id] = k;
  g->node_cls[id] = c;
  g->node_rule[id] = g->cur_rule;
  g->node_inexact[id] = g->cur_inexact;
  g->uf[c] = c;
  g->taint[c] = 0;
  g->merged_by[c] = 0;
  memset(&g->cnodes[c], 0, sizeof g->cnodes[c]);
  memset(&g->cparents[c], 0, sizeof g->cparents[c]);
  g->nroots++;
  vec_push(g, &g->cnodes[c], id);
  for (int i = 0; i < k.n; i++) vec_push(g, &g->cparents[k.c[i]], id);
  make(g, &k, g->data + (size_t)c * g->an.size);
  if (!hc_insert(g, id)) return LM_EG_NONE;
  return g->failed ? LM_EG_NONE : c;
}

int lm_eg_union(lm_egraph *g, uint32_t a, uint32_t b) {
  a = lm_eg_find(g, a);
  b = lm_eg_find(g, b);
  if (a == b) return 0;
  /* the class with more nodes and parents stays the root */
  if (g->cnodes[a].n + g->cparents[a].n < g->cnodes[b].n + g->cparents[b].n) {
    uint32_t t = a;
    a = b;
    b = t;
  }
  int fresh = 0; /* a side made entirely by the rule application under way */
  if (g->cur_taint)
    for (int side = 0; side < 2 && !fresh; side++) {
      const lm_eg_vec *v = &g->cnodes[side ? b : a];
      fresh = 1;
      for (uint32_t i = 0; i < v->n && fresh; i++) fresh = v->v[i] >= g->apply_start;
    }
  g->uf[b] = a;
  g->nroots--;
  g->taint[a] |= g->taint[b] | (g->cur_taint && !fresh);
  g->merged_by[a] |= g->merged_by[b] | (g->cur_rule >= 0 && g->cur_rule < 64 ? 1ull << g->cur_rule : 0);
  vec_append(g, &g->cnodes[a], &g->cnodes[b]);
  vec_append(g, &g->cparents[a], &g->cparents[b]);
  if (g->an.join) g->an.join(g->an.ctx, g->data + (size_t)a * g->an.size, g->data + (size_t)b * g->an.size);
  vec_push(g, &g->pending, a);
  return 1;
}

/* ---------------------------------------------------------------- rebuild */

static size_t repair(lm_egraph *g, uint32_t c, lm_eg_vec *tmp) {
  size_t unions = 0;
  tmp->n = 0;
  for (uint32_t i = 0; i < g->cparents[c].n; i++) vec_push(g, tmp, g->cparents[c].v[i]);
  vec_sort_unique(tmp);
  for (uint32_t i = 0; i < tmp->n; i++) {
    uint32_t p = tmp->v[i];
    hc_remove(g, p);
    canon(g, &g->nodes[p]);
  }
  for (uint32_t i = 0; i < tmp->n; i++) {
    uint32_t p = tmp->v[i];
    uint32_t q = hc_find(g, &g->nodes[p]);
    if (q == LM_EG_NONE) hc_insert(g, p);
    else unions += (size_t)lm_eg_union(g, g->node_cls[p], g->node_cls[q]);
  }
  /* analysis: parents' data may grow with this class's */
  if (g->an.join)
    for (uint32_t i = 0; i < tmp->n; i++) {
      uint32_t p = tmp->v[i], pc = lm_eg_find(g, g->node_cls[p]);
      make(g, &g->nodes[p], g->scratch);
      if (g->an.join(g->an.ctx, g->data + (size_t)pc * g->an.size, g->scratch)) vec_push(g, &g->pending, pc);
    }
  uint32_t r = lm_eg_find(g, c);
  vec_sort_unique(&g->cparents[r]);
  return unions;
}

size_t lm_eg_rebuild(lm_egraph *g) {
  size_t unions = 0;
  lm_eg_vec todo = {0}, tmp = {0};
  while (g->pending.n && !g->failed) {
    lm_free(todo.v);
    todo = g->pending;
    memset(&g->pending, 0, sizeof g->pending);
    for (uint32_t i = 0; i < todo.n; i++) todo.v[i] = lm_eg_find(g, todo.v[i]);
    vec_sort_unique(&todo);
    for (uint32_t i = 0; i < todo.n; i++) unions += repair(g, lm_eg_find(g, todo.v[i]), &tmp);
  }
  lm_free(todo.v);
  lm_free(tmp.v);
  /* class node lists: one node per distinct content, the one the hashcons holds */
  for (size_t c = 0; c < g->nclasses; c++) {
    if (g->uf[c] != c) continue;
    lm_eg_vec *v = &g->cnodes[c];
    for (uint32_t i = 0; i < v->n; i++) {
      uint32_t h = hc_find(g, &g->nodes[v->v[i]]);
      if (h != LM_EG_NONE) v->v[i] = h;
    }
    vec_sort_unique(v);
  }
  return unions;
}

/* ---------------------------------------------------------------- invariants */

#include <stdio.h>

int lm_eg_check(lm_egraph *g, char *why, size_t cap) {
#define BAD(...) return snprintf(why, cap, __VA_ARGS__), 0
  if (g->pending.n) BAD("pending repairs: rebuild not called");
  size_t roots = 0;
  unsigned char *seen = lm_calloc(g->nnodes + 1, 1);
  if (!seen) BAD("out of memory");
  for (size_t c = 0; c < g->nclasses; c++) {
    uint32_t r = lm_eg_find(g, (uint32_t)c);
    if (g->uf[r] != r) {
      lm_free(seen);
      BAD("class %zu: find gives %u, which is not a root", c, r);
    }
    if (r != c) continue;
    roots++;
    const lm_eg_vec *v = &g->cnodes[c];
    if (!v->n) {
      lm_free(seen);
      BAD("root class %zu has no nodes", c);
    }
    for (uint32_t i = 0; i < v->n; i++) {
      uint32_t id = v->v[i];
      const lm_enode *n = &g->nodes[id];
      if (lm_eg_find(g, g->node_cls[id]) != c) {
        lm_free(seen);
        BAD("node %u listed in class %zu belongs to %u", id, c, lm_eg_find(g, g->node_cls[id]));
      }
      for (int k = 0; k < n->n; k++) {
        if (g->uf[n->c[k]] != n->c[k]) {
          lm_free(seen);
          BAD("node %u: child %d (class %u) not canonical", id, k, n->c[k]);
        }
        const lm_eg_vec *pv = &g->cparents[n->c[k]];
        int found = 0;
        for (uint32_t j = 0; j < pv->n && !found; j++) found = pv->v[j] == id;
        if (!found) {
          lm_free(seen);
          BAD("node %u missing from the parents of its child class %u", id, n->c[k]);
        }
      }
      if (hc_find(g, n) != id) {
        lm_free(seen);
        BAD("hashcons does not map node %u of class %zu to itself", id, c);
      }
      if (seen[id]) {
        lm_free(seen);
        BAD("node %u listed twice", id);
      }
      seen[id] = 1;
      if (g->an.join) { /* analysis at its fixed point */
        make(g, n, g->scratch);
        unsigned char *cp = lm_malloc(g->an.size);
        if (cp) {
          memcpy(cp, g->data + c * g->an.size, g->an.size);
          int ch = g->an.join(g->an.ctx, cp, g->scratch);
          lm_free(cp);
          if (ch) {
            lm_free(seen);
            BAD("analysis of class %zu is not at its fixed point (node %u)", c, id);
          }
        }
      }
    }
  }
  /* every hashcons entry is a listed node; no content appears twice (congruence) */
  size_t entries = 0;
  for (size_t i = 0; i < g->tcap; i++) {
    uint32_t e = g->tab[i];
    if (e == 0 || e == TOMB) continue;
    entries++;
    if (!seen[e - 1]) {
      lm_free(seen);
      BAD("hashcons holds node %u, which no class lists", e - 1);
    }
  }
  lm_free(seen);
  if (entries != g->tcount) BAD("hashcons count %zu, entries %zu", g->tcount, entries);
  if (roots != g->nroots) BAD("%zu roots counted, %zu recorded", roots, g->nroots);
  return 1;
#undef BAD
}

/* ---------------------------------------------------------------- e-matching */

typedef struct todo_item {
  int8_t pat;
  uint32_t cls;
} todo_item;

static int match_rec(lm_egraph *g, const lm_pat *pats, todo_item *todo, int ntodo, lm_match *m, lm_match_fn fn,
                     void *ctx) {
  if (ntodo == 0) return fn(ctx, m);
  todo_item t = todo[ntodo - 1];
  const lm_pat *p = &pats[t.pat];
  uint32_t c = lm_eg_find(g, t.cls);
  if (p->op < 0) {
    uint32_t *slot = &m->var[p->var];
    if (*slot != LM_EG_NONE) return lm_eg_find(g, *slot) == c ? match_rec(g, pats, todo, ntodo - 1, m, fn, ctx) : 1;
    *slot = c;
    int r = match_rec(g, pats, todo, ntodo - 1, m, fn, ctx);
    *slot = LM_EG_NONE;
    return r;
  }
  const lm_eg_vec *v = &g->cnodes[c];
  for (uint32_t i = 0; i < v->n; i++) {
    uint32_t id = v->v[i];
    const lm_enode *n = &g->nodes[id];
    if (n->op != (uint16_t)p->op || n->n != p->n || (!p->attr_any && n->attr != p->attr)) continue;
    todo_item sub[LM_PAT_MAXN * LM_EG_MAXC + 1];
    int ns = ntodo - 1;
    if (ns + p->n > (int)LM_COUNTOF(sub)) continue;
    memcpy(sub, todo, (size_t)ns * sizeof *sub);
    for (int k = 0; k < p->n; k++) sub[ns++] = (todo_item){p->c[k], n->c[k]};
    m->node[t.pat] = id;
    if (!match_rec(g, pats, sub, ns, m, fn, ctx)) return 0;
  }
  return 1;
}

int lm_eg_ematch(lm_egraph *g, const lm_pat *pats, int npats, uint32_t c, lm_match_fn fn, void *ctx) {
  (void)npats;
  lm_match m;
  memset(&m, 0, sizeof m);
  for (int i = 0; i < LM_PAT_MAXV; i++) m.var[i] = LM_EG_NONE;
  m.root = lm_eg_find(g, c);
  todo_item todo[1] = {{0, m.root}};
  return match_rec(g, pats, todo, 1, &m, fn, ctx);
}

/* ---------------------------------------------------------------- the runner */

typedef struct mbuf {
  lm_match *m;
  int16_t *rule;
  size_t n, cap;
  size_t this_rule;
  uint32_t limit;
  int overflow;
  int rule_idx;
  double deadline;
} mbuf;

static int collect(void *ctx, const lm_match *m) {
  mbuf *b = ctx;
  if (b->this_rule >= b->limit) {
    b->overflow = 1;
    return 0;
  }
  if (b->n == b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 256;
    lm_match *a = lm_realloc(b->m, nc * sizeof *a);
    if (a) b->m = a;
    int16_t *r = lm_realloc(b->rule, nc * sizeof *r);
    if (r) b->rule = r;
    if (!a || !r) return 0;
    b->cap = nc;
  }
  b->m[b->n] = *m;
  b->rule[b->n] = (int16_t)b->rule_idx;
  b->n++;
  b->this_rule++;
  return 1;
}

static double run_clock(const lm_run_limits *lim) {
  return lim->clock ? lim->clock(lim->clock_ctx) : lm_search_now();
}

void lm_eg_run(lm_egraph *g, const lm_rule *rules, int nrules, void *ctx, const lm_run_limits *lim,
               lm_run_report *rep) {
  double t0 = run_clock(lim), w0 = lm_search_now();
  int *ban_until = lm_calloc((size_t)nrules + 1, sizeof *ban_until);
  int *times_banned = lm_calloc((size_t)nrules + 1, sizeof *times_banned);
  mbuf mb = {0};
  rep->stop = LM_STOP_SATURATED;
  rep->iterations = 0;
  if (!ban_until || !times_banned) {
    rep->stop = LM_STOP_NOMEM;
    goto done;
  }
  lm_eg_rebuild(g);
  for (int it = 0;; it++) {
    if (it >= lim->iterations) {
      rep->stop = LM_STOP_ITERATIONS;
      break;
    }
    if (g->nnodes >= lim->nodes) {
      rep->stop = LM_STOP_NODES;
      break;
    }
    if (run_clock(lim) - t0 > lim->seconds) {
      rep->stop = LM_STOP_TIME;
      break;
    }
    size_t nodes0 = g->nnodes, roots0 = g->nroots;
    mb.n = 0;
    int any_banned = 0;
    for (int r = 0; r < nrules; r++) {
      if (lim->enabled && !lim->enabled[r]) continue;
      if (ban_until[r] > it) {
        any_banned = 1;
        continue;
      }
      mb.this_rule = 0;
      mb.overflow = 0;
      mb.rule_idx = r;
      size_t start = mb.n;
      uint32_t shift = (uint32_t)(times_banned[r] < 8 ? times_banned[r] : 8);
      uint32_t base = lim->match_limit ? lim->match_limit : 1000;
      if (rules[r].flags & LM_RULE_EXPLOSIVE) base = base / 4 ? base / 4 : 1;
      mb.limit = base << shift;
      if (rules[r].search) rules[r].search(ctx, g, collect, &mb);
      else
        for (size_t c = 0; c < g->nclasses && !mb.overflow; c++)
          if (g->uf[c] == c && !lm_eg_ematch(g, rules[r].pat, rules[r].npat, (uint32_t)c, collect, &mb) && !mb.overflow)
            break;
      if (mb.overflow) { /* too many matches: ban the rule for a while, exponentially longer each time */
        mb.n = start;
        ban_until[r] = it + ((lim->ban_length ? lim->ban_length : 2) << shift);
        times_banned[r]++;
        if (rep->banned) rep->banned[r]++;
        any_banned = 1;
      }
    }
    for (size_t i = 0; i < mb.n && !g->failed; i++) {
      const lm_rule *r = &rules[mb.rule[i]];
      if (r->guard && !r->guard(ctx, g, &mb.m[i])) continue;
      g->cur_rule = mb.rule[i];
      g->cur_taint = (r->flags & LM_RULE_ROUNDING) != 0;
      g->cur_inexact = g->cur_taint;
      for (int k = 0; k < LM_PAT_MAXN && !g->cur_inexact; k++) /* derived from an inexact node */
        if (mb.m[i].node[k] < g->nnodes) g->cur_inexact = g->node_inexact[mb.m[i].node[k]];
      g->apply_start = g->nnodes;
      int made = r->apply(ctx, g, &mb.m[i]);
      g->cur_rule = -1;
      g->cur_taint = 0;
      g->cur_inexact = 0;
      if (made && rep->applied) rep->applied[mb.rule[i]]++;
      if ((i & 255) == 255 && (g->nnodes >= lim->nodes || run_clock(lim) - t0 > lim->seconds)) break;
    }
    lm_eg_rebuild(g);
    rep->iterations = it + 1;
    if (g->failed) {
      rep->stop = LM_STOP_NOMEM;
      break;
    }
    if (g->nnodes == nodes0 && g->nroots == roots0) {
      if (!any_banned) {
        rep->stop = LM_STOP_SATURATED;
        break;
      }
      for (int r = 0; r < nrules; r++) ban_until[r] = 0; /* nothing else to do: let banned rules run */
    }
  }
done:
  rep->nodes = g->nnodes;
  rep->classes = g->nroots;
  rep->seconds = lm_search_now() - w0;
  lm_free(mb.m);
  lm_free(mb.rule);
  lm_free(ban_until);
  lm_free(times_banned);
}
