/* compiler/search/interp.c — the reference interpreter of loop-IR kernels: walks a kernel's
 * blocks and evaluates its statements with the same float operations, in the same order, as the
 * code the C renderer prints (so an exact rewrite matches it bit for bit, up to libmvec's SIMD
 * math in vectorised loops). The search checks candidates against it, and the tests check every
 * rule with it. A work-group schedule (k->group) runs its thread loop in lockstep: each
 * statement for every thread of the group before the next (loop extents are uniform: over
 * symbols only), each thread with its own values and private arrays, shared arrays once per
 * group: what barriers guarantee, so a race-free kernel computes what it computes on a GPU;
 * warp reductions combine 32 threads by the shuffle tree CUDA runs (16, 8, 4, 2, 1 apart). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lumen/rand.h"
#include "search/term.h"

typedef struct ip {
  const lm_plan *p;
  const lm_kernel *k;
  const lm_exprs *x;
  float *const *bufs;
  const size_t *count;
  const int64_t *syms;
  uint64_t seed, run;
  int64_t *vars;
  float *val;
  float **loc;
  /* lockstep (work-group schedules): per thread its values and private arrays */
  int32_t tloop;   /* the thread loop, -1: none */
  int64_t nthr;
  float *tval;     /* nthr x nstmts */
  float **tloc;    /* nthr x nlocals (shared arrays: the same pointer for every thread) */
  int bad;
} ip;

static int64_t ev(ip *s, lm_expr e) { return lm_x_eval(s->x, e, s->vars, s->syms); }

static float *slot(ip *s, const lm_stmt *st, int64_t i) {
  if (st->local) {
    if (st->buf >= s->k->nlocals || i < 0 || i >= s->k->locals[st->buf]) return s->bad = 1, NULL;
    return &s->loc[st->buf][i];
  }
  if (st->buf >= s->p->nbufs || i < 0 || (s->count && (size_t)i >= s->count[st->buf])) return s->bad = 1, NULL;
  return &s->bufs[st->buf][i];
}

static void exec(ip *s, uint32_t id) {
  const lm_stmt *st = &s->k->stmts[id];
  float *v = s->val, a = v[st->a], b = v[st->b];
  switch (st->op) {
  case LM_S_CONST:
  case LM_S_ACC: v[id] = st->f; return;
  case LM_S_LOAD:
    if (st->valid && !ev(s, st->valid)) v[id] = 0.0f;
    else {
      float *p = slot(s, st, ev(s, st->idx));
      v[id] = p ? *p : 0.0f;
    }
    return;
  case LM_S_RAND:
    v[id] = lm_rand_uniform(s->seed, st->stream, (uint64_t)ev(s, st->idx),
                            s->run + (st->step ? (uint64_t)ev(s, st->step) : 0));
    return;
  case LM_S_LOG2: v[id] = log2f(a); return;
  case LM_S_EXP2: v[id] = exp2f(a); return;
  case LM_S_SIN: v[id] = sinf(a); return;
  case LM_S_SQRT: v[id] = sqrtf(a); return;
  case LM_S_RECIP: v[id] = 1.0f / a; return;
  case LM_S_ADD: v[id] = a + b; return;
  case LM_S_MUL: v[id] = a * b; return;
  case LM_S_MOD: v[id] = fmodf(a, b); return;
  case LM_S_LT: v[id] = a < b ? 1.0f : 0.0f; return;
  case LM_S_MAX: v[id] = fmaxf(a, b); return;
  case LM_S_SELECT: v[id] = (!st->valid || ev(s, st->valid)) ? a : 0.0f; return;
  case LM_S_ACC_SUM: v[st->a] = a + b; return;
  case LM_S_ACC_MAX: v[st->a] = fmaxf(a, b); return;
  case LM_S_STORE:
    if (!st->valid || ev(s, st->valid)) {
      float *p = slot(s, st, ev(s, st->idx));
      if (p) *p = a;
    }
    return;
  default: s->bad = 1; return;
  }
}

static void thread(ip *s, int64_t t) {
  s->vars[s->tloop] = t;
  s->val = s->tval + (size_t)t * s->k->nstmts;
  s->loc = s->tloc + (size_t)t * s->k->nlocals;
}

/* A warp reduction, for every warp of the group at once: lane t takes op(v[t], v[t + o]) (its
 * own value when t + o leaves the warp) for o = 16, 8, 4, 2, 1, as __shfl_down_sync does. */
static void warp_reduce(ip *s, uint32_t id) {
  const lm_stmt *st = &s->k->stmts[id];
  size_t ns = s->k->nstmts;
  for (int64_t w0 = 0; w0 < s->nthr; w0 += 32) {
    float v[32];
    int64_t n = s->nthr - w0 < 32 ? s->nthr - w0 : 32;
    for (int64_t l = 0; l < 32; l++) v[l] = l < n ? s->tval[(size_t)(w0 + l) * ns + st->a] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      float u[32];
      for (int l = 0; l < 32; l++) {
        float other = l + o < 32 ? v[l + o] : v[l];
        u[l] = st->op == LM_S_WARP_SUM ? v[l] + other : fmaxf(v[l], other);
      }
      memcpy(v, u, sizeof v);
    }
    for (int64_t l = 0; l < n; l++) s->tval[(size_t)(w0 + l) * ns + id] = v[l];
  }
}

/* The thread loop's body in lockstep. */
static void run_simt(ip *s, int32_t loop) {
  const lm_block *b = &s->k->loops[loop].body;
  for (size_t i = 0; i < b->n && !s->bad; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      int64_t n = ev(s, s->k->loops[it.id].extent); /* over symbols: every thread's */
      for (int64_t j = 0; j < n && !s->bad; j++) {
        for (int64_t t = 0; t < s->nthr; t++) thread(s, t), s->vars[it.id] = j;
        run_simt(s, (int32_t)it.id);
      }
      continue;
    }
    uint8_t op = s->k->stmts[it.id].op;
    if (op == LM_S_BARRIER) continue; /* lockstep: every thread is there */
    if (op == LM_S_WARP_SUM || op == LM_S_WARP_MAX) {
      warp_reduce(s, it.id);
      continue;
    }
    for (int64_t t = 0; t < s->nthr && !s->bad; t++) {
      thread(s, t);
      exec(s, it.id);
    }
  }
}

static void run_block(ip *s, int32_t loop) {
  const lm_block *b = loop < 0 ? &s->k->root : &s->k->loops[loop].body;
  for (size_t i = 0; i < b->n && !s->bad; i++) {
    lm_item it = b->items[i];
    if (!it.is_loop) {
      exec(s, it.id);
      continue;
    }
    if ((int32_t)it.id == s->tloop) { /* a work-group: its threads start from the values so far */
      float *val = s->val, **loc = s->loc;
      for (int64_t t = 0; t < s->nthr; t++) memcpy(s->tval + (size_t)t * s->k->nstmts, val, s->k->nstmts * sizeof *val);
      run_simt(s, (int32_t)it.id);
      s->val = val, s->loc = loc;
      continue;
    }
    int64_t n = ev(s, s->k->loops[it.id].extent);
    for (int64_t j = 0; j < n && !s->bad; j++) {
      s->vars[it.id] = j;
      run_block(s, (int32_t)it.id);
    }
  }
}

lm_status sk_interpret(const lm_plan *p, const lm_kernel *k, float *const *bufs, const size_t *count,
                       const int64_t *syms, uint64_t seed, uint64_t run) {
  ip s = {.p = p, .k = k, .x = &p->g->x, .bufs = bufs, .count = count, .syms = syms, .seed = seed, .run = run,
          .tloop = -1};
  s.vars = lm_calloc(k->nloops + 1, sizeof *s.vars);
  s.val = lm_calloc(k->nstmts + 1, sizeof *s.val);
  s.loc = lm_calloc(k->nlocals + 1, sizeof *s.loc);
  lm_status st = LM_OK;
  if (!s.vars || !s.val || !s.loc) st = LM_ERR_NOMEM;
  for (size_t i = 0; i < k->nlocals && st == LM_OK; i++)
    if (!(s.loc[i] = lm_calloc((size_t)(k->locals[i] > 0 ? k->locals[i] : 1), sizeof(float)))) st = LM_ERR_NOMEM;
  if (st == LM_OK && k->group > 0 && k->npar >= 1) { /* per thread: values, and private copies of the locals */
    s.tloop = k->npar - 1;
    s.nthr = k->group;
    s.tval = lm_calloc((size_t)s.nthr * k->nstmts + 1, sizeof *s.tval);
    s.tloc = lm_calloc((size_t)s.nthr * k->nlocals + 1, sizeof *s.tloc);
    if (!s.tval || !s.tloc) st = LM_ERR_NOMEM;
    for (int64_t t = 0; t < s.nthr && st == LM_OK; t++)
      for (size_t i = 0; i < k->nlocals && st == LM_OK; i++) {
        int shared = i < k->nshared && k->shared[i];
        float **at = &s.tloc[(size_t)t * k->nlocals + i];
        if (shared) *at = s.loc[i];
        else if (!(*at = lm_calloc((size_t)(k->locals[i] > 0 ? k->locals[i] : 1), sizeof(float)))) st = LM_ERR_NOMEM;
      }
  }
  if (st == LM_OK) {
    run_block(&s, -1);
    if (s.bad) st = lm_fail(LM_ERR_INVALID, "interpret: kernel %.32s indexes outside a buffer", k->name);
  }
  for (int64_t t = 0; s.tloc && t < s.nthr; t++)
    for (size_t i = 0; i < k->nlocals; i++)
      if (!(i < k->nshared && k->shared[i])) lm_free(s.tloc[(size_t)t * k->nlocals + i]);
  lm_free(s.tloc);
  lm_free(s.tval);
  for (size_t i = 0; s.loc && i < k->nlocals; i++) lm_free(s.loc[i]);
  lm_free(s.loc);
  lm_free(s.vars);
  lm_free(s.val);
  return st;
}
