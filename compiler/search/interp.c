/* compiler/search/interp.c — the reference interpreter of loop-IR kernels: walks a kernel's
 * blocks and evaluates its statements with the same float operations, in the same order, as the
 * code the C renderer prints (so an exact rewrite matches it bit for bit, up to libmvec's SIMD
 * math in vectorised loops). The search checks candidates against it, and the tests check every
 * rule with it. */
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

static void run_block(ip *s, int32_t loop) {
  const lm_block *b = loop < 0 ? &s->k->root : &s->k->loops[loop].body;
  for (size_t i = 0; i < b->n && !s->bad; i++) {
    lm_item it = b->items[i];
    if (!it.is_loop) {
      exec(s, it.id);
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
  ip s = {.p = p, .k = k, .x = &p->g->x, .bufs = bufs, .count = count, .syms = syms, .seed = seed, .run = run};
  s.vars = lm_calloc(k->nloops + 1, sizeof *s.vars);
  s.val = lm_calloc(k->nstmts + 1, sizeof *s.val);
  s.loc = lm_calloc(k->nlocals + 1, sizeof *s.loc);
  lm_status st = LM_OK;
  if (!s.vars || !s.val || !s.loc) st = LM_ERR_NOMEM;
  for (size_t i = 0; i < k->nlocals && st == LM_OK; i++)
    if (!(s.loc[i] = lm_calloc((size_t)(k->locals[i] > 0 ? k->locals[i] : 1), sizeof(float)))) st = LM_ERR_NOMEM;
  if (st == LM_OK) {
    run_block(&s, -1);
    if (s.bad) st = lm_fail(LM_ERR_INVALID, "interpret: kernel %.32s indexes outside a buffer", k->name);
  }
  for (size_t i = 0; s.loc && i < k->nlocals; i++) lm_free(s.loc[i]);
  lm_free(s.loc);
  lm_free(s.vars);
  lm_free(s.val);
  return st;
}
