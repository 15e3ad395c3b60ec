/* tests/fuzz/fuzz_graph.c — libFuzzer target for the graph text form (compiler/text.c): parses
 * arbitrary bytes, validates, dumps, and checks that the dump parses back to the same dump and
 * the same verdict; a graph that validates also has its clone, its symbol bindings and every
 * edge's index math exercised (docs/GRAPH_TEXT.md). Seeds: tests/fuzz/corpus/graph/, with the
 * dictionary tests/fuzz/graph.dict. (Moved here from tests/fuzz_parse.c.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph-impl.h"
#include "validate.h"

static void fail(const char *what, const char *a, const char *b) {
  fprintf(stderr, "fuzz_parse: %s\n--- first\n%s\n--- second\n%s\n", what, a ? a : "(null)", b ? b : "(null)");
  abort();
}

static void exercise_edge(lm_graph_t *g, lm_edge e, const int64_t *syms) {
  const lm_shape *s = lm_edge_shape(g, e);
  lm_expr idx[LM_MAX_RANK], flat, valid;
  int64_t zero[LM_MAX_RANK] = {0};
  for (int i = 0; i < s->rank; i++) idx[i] = lm_x_var(&g->x, i);
  lm_xctx ctx = {.extent = s->dim, .nvars = s->rank};
  lm_edge_index(g, e, idx, &ctx, &flat, &valid);
  if (syms && flat && valid) {
    int nonempty = 1;
    for (int i = 0; i < s->rank; i++) nonempty &= lm_x_eval(&g->x, s->dim[i], NULL, syms) > 0;
    if (nonempty && lm_x_eval(&g->x, valid, zero, syms)) (void)lm_x_eval(&g->x, flat, zero, syms);
  }
}

static void exercise_valid(lm_graph_t *g, const char *dump) {
  lm_graph_t *c = lm_graph_clone(g);
  if (c) {
    char *d = lm_graph_dump(c);
    if (d && strcmp(d, dump)) fail("clone dumps differently", dump, d);
    free(d);
    lm_graph_free(c);
  }
  size_t n = g->x.nsyms;
  int64_t *val = calloc(n + 1, sizeof *val);
  uint8_t *bound = calloc(n + 1, 1);
  if (!val || !bound) abort();
  int small = 1;
  for (size_t s = 0; s < n; s++) {
    int64_t least = g->x.syms[s].least;
    val[s] = (least > 3 ? least : 3) + (int64_t)(s % 3);
    bound[s] = 1;
    small &= val[s] < 1000; /* keeps lm_x_eval clear of int64 overflow */
  }
  int fits = small && lm_graph_check_bindings(g, val, bound) == LM_OK;
  for (uint32_t i = 1; i < g->nnodes; i++)
    for (int k = 0; k < g->nodes[i].nsrc; k++) exercise_edge(g, g->nodes[i].src[k], fits ? val : NULL);
  for (size_t k = 0; k < g->noutputs; k++) exercise_edge(g, g->outputs[k].src, fits ? val : NULL);
  free(val);
  free(bound);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = 0;
  lm_graph_t *g = lm_graph_parse(text);
  free(text);
  if (!g) return 0;
  lm_status st = lm_graph_validate(g);
  char *d1 = lm_graph_dump(g);
  if (!d1) abort();
  lm_graph_t *h = lm_graph_parse(d1);
  if (!h) fail(lm_last_error(), d1, NULL);
  char *d2 = lm_graph_dump(h);
  if (!d2 || strcmp(d1, d2)) fail("dump -> parse -> dump differs", d1, d2);
  lm_status st2 = lm_graph_validate(h);
  if (st2 != st) fail("the parsed dump validates differently", d1, lm_last_error());
  if (st == LM_OK) exercise_valid(g, d1);
  free(d1);
  free(d2);
  lm_graph_free(h);
  lm_graph_free(g);
  return 0;
}
