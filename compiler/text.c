/* compiler/text.c — the graph's text form: lm_graph_dump writes it, lm_graph_parse reads it
 * back (parse(dump(g)) dumps identically). Line oriented, one statement a line:
 *
 *   lumen-graph 1                        header, first statement; the version is 1
 *   error invalid "message"              a recorded construction error (or: error nomem)
 *   sym N 1                              a symbol and its least value, declared before use
 *   %1 = input obs data [N,4]            name (bare, or "quoted" with \\ \" \n \t \xHH), role
 *   %2 = const 0.5                       shortest decimal that reads back exactly; inf, -inf,
 *                                        nan, nan:0x7fc00001 (other NaN bit patterns)
 *   %3 = rand stream=0 [N,4]
 *   %4 = add %1 %2|expand 0 4|expand 0 N sources are edges: a node and its views
 *   %5 = sum_reduce %4 axis=1
 *   output y %5|permute 1 0
 *   assign %1 %4                         target (an input node, no views) takes the value
 *
 * An edge is %ID followed by views from the node outward, each "|kind args": permute P...,
 * expand AXIS DIM, slice AXIS START END, pad AXIS BEFORE AFTER, reshape [DIM,...],
 * affine_mod AXIS A B. A DIM is an integer expression without spaces over numbers, declared
 * symbols, + - * / % and parentheses (/ and % are floor operations). '#' starts a comment
 * where a statement or argument could start. Node ids are any positive integers, mapped to
 * arena ids in order of definition; references may point forward, so a text can describe a
 * cycle (lm_graph_validate reports it). Leaves carry their shapes; every other shape is
 * derived from the sources once the whole text is read. See docs/GRAPH_TEXT.md. */
#include "validate.h"

#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  TEXT_VERSION = 1,
  DIM_MAX_NEST = 64,   /* parentheses and unary minus nested in one dimension */
  DIM_MAX_ATOMS = 512, /* numbers and symbols in one dimension */
  DIM_MAX_TREE = 96,   /* operations on the longest path of one dimension */
};

/* ---------------------------------------------------------------- shared helpers */

static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_ident(int c) { return is_alpha(c) || is_digit(c); }
static int is_word(int c) { return is_ident(c) || c == '-'; }
static int is_space(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }
/* Characters of a name written without quotes. */
static int is_bare(int c) { return is_ident(c) || c == '.' || c == ':' || c == '/' || c == '@' || c == '+' || c == '-'; }

static uint32_t float_bits(float v) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

static float bits_float(uint32_t b) {
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}

#define CANONICAL_NAN 0x7fc00000u

/* Reads a float token written by write_float (or any plain decimal): inf, -inf, nan,
 * nan:0xXXXXXXXX, or [+-]digits[.digits][e[+-]digits]. Independent of the C locale. */
static int read_float(const char *tok, size_t len, float *out) {
  char buf[80];
  if (len == 3 && !memcmp(tok, "nan", 3)) return *out = bits_float(CANONICAL_NAN), 1;
  if (len == 3 && !memcmp(tok, "inf", 3)) return *out = bits_float(0x7f800000u), 1;
  if (len == 4 && !memcmp(tok, "-inf", 4)) return *out = bits_float(0xff800000u), 1;
  if (len == 14 && !memcmp(tok, "nan:0x", 6)) {
    uint32_t b = 0;
    for (size_t i = 6; i < len; i++) {
      int c = tok[i], d = is_digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return 0;
      b = b << 4 | (uint32_t)d;
    }
    if ((b & 0x7f800000u) != 0x7f800000u || !(b & 0x007fffffu)) return 0; /* not a NaN */
    return *out = bits_float(b), 1;
  }
  /* plain decimal: check the shape, then let strtof round it with the radix of the locale */
  size_t i = 0, digits = 0;
  if (i < len && (tok[i] == '+' || tok[i] == '-')) i++;
  while (i < len && is_digit(tok[i])) i++, digits++;
  size_t dot = len;
  if (i < len && tok[i] == '.') {
    dot = i++;
    while (i < len && is_digit(tok[i])) i++, digits++;
  }
  if (!digits) return 0;
  if (i < len && (tok[i] == 'e' || tok[i] == 'E')) {
    i++;
    if (i < len && (tok[i] == '+' || tok[i] == '-')) i++;
    size_t e0 = i;
    while (i < len && is_digit(tok[i])) i++;
    if (i == e0) return 0;
  }
  if (i != len) return 0;
  const char *radix = localeconv()->decimal_point;
  size_t rl = radix && *radix ? strlen(radix) : 1;
  if (len + rl >= sizeof buf) return 0;
  size_t k = 0;
  for (size_t j = 0; j < len; j++) {
    if (j == dot && radix && *radix) {
      memcpy(buf + k, radix, rl);
      k += rl;
    } else buf[k++] = tok[j];
  }
  buf[k] = 0;
  char *end;
  errno = 0;
  float v = strtof(buf, &end);
  if (end != buf + k) return 0;
  if ((float_bits(v) & 0x7fffffffu) == 0x7f800000u) return 0; /* a finite literal out of range */
  *out = v;
  return 1;
}

/* The shortest decimal that reads back to the same bits; inf/nan as read_float reads them. */
static void write_float(lm_sb *sb, float v) {
  uint32_t b = float_bits(v);
  if ((b & 0x7f800000u) == 0x7f800000u) {
    if (b & 0x007fffffu) {
      if (b == CANONICAL_NAN) lm_sb_puts(sb, "nan");
      else lm_sb_printf(sb, "nan:0x%08x", (unsigned)b);
    } else lm_sb_puts(sb, b >> 31 ? "-inf" : "inf");
    return;
  }
  const char *radix = localeconv()->decimal_point;
  char buf[64], out[64];
  for (int prec = 1; prec <= 9; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
    /* undo a locale's radix so the text is the same everywhere */
    size_t k = 0, rl = radix && *radix ? strlen(radix) : 0;
    for (const char *s = buf; *s && k + 1 < sizeof out;) {
      if (rl && !strncmp(s, radix, rl)) {
        out[k++] = '.';
        s += rl;
      } else out[k++] = *s++;
    }
    out[k] = 0;
    float back;
    if ((read_float(out, k, &back) && float_bits(back) == b) || prec == 9) {
      lm_sb_puts(sb, out);
      return;
    }
  }
}

static int name_is_bare(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (!is_bare((unsigned char)*s)) return 0;
  return 1;
}

static void write_quoted(lm_sb *sb, const char *s) {
  lm_sb_puts(sb, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') lm_sb_printf(sb, "\\%c", *p);
    else if (*p == '\n') lm_sb_puts(sb, "\\n");
    else if (*p == '\t') lm_sb_puts(sb, "\\t");
    else if (*p < 0x20 || *p >= 0x7f) lm_sb_printf(sb, "\\x%02x", *p);
    else lm_sb_printf(sb, "%c", *p);
  }
  lm_sb_puts(sb, "\"");
}

static void write_name(lm_sb *sb, const char *s) {
  if (!s) s = "";
  if (name_is_bare(s)) lm_sb_puts(sb, s);
  else write_quoted(sb, s);
}

/* ---------------------------------------------------------------- dump */

/* A dimension without spaces, so that it is one token; "?" when e is not a dimension. */
static void write_dim(lm_sb *sb, const lm_graph_t *g, lm_expr e) {
  if (!lm_expr_is_dim(&g->x, e)) {
    lm_sb_puts(sb, "?");
    return;
  }
  lm_sb tmp = {0};
  lm_x_print(&g->x, e, &tmp, "i");
  if (tmp.failed) sb->failed = 1;
  for (size_t i = 0; i < tmp.len; i++)
    if (tmp.s[i] != ' ') lm_sb_printf(sb, "%c", tmp.s[i]);
  lm_sb_free(&tmp);
}

static void write_shape(lm_sb *sb, const lm_graph_t *g, const lm_shape *s) {
  lm_sb_puts(sb, "[");
  for (int i = 0; i < s->rank && i < LM_MAX_RANK; i++) {
    if (i) lm_sb_puts(sb, ",");
    write_dim(sb, g, s->dim[i]);
  }
  lm_sb_puts(sb, "]");
}

static void write_edge(lm_sb *sb, const lm_graph_t *g, lm_edge e) {
  lm_sb_printf(sb, "%%%u", e.node);
  /* the chain runs from the top view down to the node: print it base first */
  uint32_t chain[256];
  size_t len = 0;
  for (uint32_t vi = e.view; vi && vi < g->nviews; vi = g->views[vi].parent) {
    if (len == LM_COUNTOF(chain) || g->views[vi].parent >= vi) { /* too long or malformed */
      lm_sb_puts(sb, "|?");
      break;
    }
    chain[len++] = vi;
  }
  while (len--) {
    const lm_view *v = &g->views[chain[len]];
    lm_sb_printf(sb, "|%s", lm_view_kind_name(v->kind));
    switch (v->kind) {
    case LM_V_PERMUTE:
      for (int j = 0; j < v->shape.rank && j < LM_MAX_RANK; j++) lm_sb_printf(sb, " %d", v->perm[j]);
      break;
    case LM_V_EXPAND:
      lm_sb_printf(sb, " %d ", v->axis);
      write_dim(sb, g, v->p0);
      break;
    case LM_V_SLICE:
    case LM_V_PAD:
    case LM_V_AFFINE_MOD:
      lm_sb_printf(sb, " %d ", v->axis);
      write_dim(sb, g, v->p0);
      lm_sb_puts(sb, " ");
      write_dim(sb, g, v->p1);
      break;
    case LM_V_RESHAPE:
      lm_sb_puts(sb, " ");
      write_shape(sb, g, &v->shape);
      break;
    default: break;
    }
  }
}

char *lm_graph_dump(const lm_graph_t *g) {
  if (!g) {
    lm_fail(LM_ERR_INVALID, "dump: no graph");
    return NULL;
  }
  lm_sb sb = {0};
  lm_sb_printf(&sb, "lumen-graph %d\n", TEXT_VERSION);
  if (g->err) {
    lm_sb_puts(&sb, g->err == LM_ERR_NOMEM ? "error nomem" : "error invalid");
    if (g->errmsg) {
      lm_sb_puts(&sb, " ");
      write_quoted(&sb, g->errmsg);
    }
    lm_sb_puts(&sb, "\n");
  }
  for (size_t s = 0; s < g->x.nsyms; s++)
    lm_sb_printf(&sb, "sym %s %lld\n", g->x.syms[s].name, (long long)g->x.syms[s].least);
  for (uint32_t i = 1; i < g->nnodes; i++) {
    const lm_node *n = &g->nodes[i];
    lm_sb_printf(&sb, "%%%u = %s", i, lm_op_name((lm_op)n->op));
    switch (n->op) {
    case LM_OP_INPUT:
      if (n->input < g->ninputs) {
        lm_sb_puts(&sb, " ");
        write_name(&sb, g->inputs[n->input].name);
        lm_sb_printf(&sb, " %s ", lm_role_name((lm_role)g->inputs[n->input].role));
      } else lm_sb_puts(&sb, " ? ? ");
      write_shape(&sb, g, &n->shape);
      break;
    case LM_OP_CONST:
      lm_sb_puts(&sb, " ");
      write_float(&sb, n->value);
      break;
    case LM_OP_RAND:
      lm_sb_printf(&sb, " stream=%u ", n->stream);
      write_shape(&sb, g, &n->shape);
      break;
    default:
      for (int k = 0; k < n->nsrc && k < 2; k++) {
        lm_sb_puts(&sb, " ");
        write_edge(&sb, g, n->src[k]);
      }
      if (n->op < LM_OP_COUNT && lm_op_table[n->op].reduce) lm_sb_printf(&sb, " axis=%d", n->axis);
      break;
    }
    lm_sb_puts(&sb, "\n");
  }
  for (size_t k = 0; k < g->noutputs; k++) {
    lm_sb_puts(&sb, "output ");
    write_name(&sb, g->outputs[k].name);
    lm_sb_puts(&sb, " ");
    write_edge(&sb, g, g->outputs[k].src);
    lm_sb_puts(&sb, "\n");
  }
  for (size_t k = 0; k < g->nassigns; k++) {
    lm_sb_printf(&sb, "assign %%%u ", g->assigns[k].target);
    write_edge(&sb, g, g->assigns[k].src);
    lm_sb_puts(&sb, "\n");
  }
  char *s = lm_sb_take(&sb);
  if (!s) lm_fail(LM_ERR_NOMEM, "dump: out of memory");
  return s;
}

/* ---------------------------------------------------------------- parse */

enum { REF_SRC, REF_OUTPUT, REF_TARGET, REF_ASSIGN };

typedef struct tref {   /* a node reference, resolved once every line is read */
  uint8_t where, slot;  /* REF_*, source slot */
  uint32_t idx;         /* node, output or assign index */
  uint64_t tid;         /* the id as written */
  int line;
} tref;

typedef struct tslot {
  uint64_t tid; /* 0: empty */
  uint32_t node;
  int line;
} tslot;

typedef struct parser {
  lm_graph_t *g;
  const char *p; /* cursor in the current line (NUL-terminated copy) */
  int line;
  int failed;
  int have_header;
  int atoms; /* budget of the dimension being read */
  tslot *map;
  size_t mapcap, mapn;
  tref *refs;
  size_t nrefs, refcap;
  char *str; /* scratch for quoted strings */
  size_t strcap;
  uint32_t *chain;
  size_t chaincap;
} parser;

/* A printable snippet of the text at s, for messages. */
static const char *snip(const char *s, char *buf, size_t cap) {
  size_t k = 0;
  for (; *s && !is_space((unsigned char)*s) && k + 4 < cap && k < 24; s++)
    buf[k++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
  if (*s && !is_space((unsigned char)*s)) buf[k++] = '.', buf[k++] = '.', buf[k++] = '.';
  buf[k] = 0;
  if (!k) snprintf(buf, cap, "%s", *s ? "whitespace" : "end of line");
  return buf;
}

static int perr(parser *P, const char *fmt, ...) LM_PRINTF(2, 3);
static int perr(parser *P, const char *fmt, ...) {
  if (P->failed) return 0;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  lm_fail(LM_ERR_INVALID, "line %d: %s", P->line, msg);
  P->failed = LM_ERR_INVALID;
  return 0;
}

static int pnomem(parser *P) {
  if (!P->failed) lm_fail(LM_ERR_NOMEM, "line %d: out of memory", P->line);
  P->failed = LM_ERR_NOMEM;
  return 0;
}

static void skip_ws(parser *P) {
  while (is_space((unsigned char)*P->p)) P->p++;
}

/* Requires at least one space, then skips any more. */
static int need_ws(parser *P, const char *what) {
  char b[40];
  if (!is_space((unsigned char)*P->p)) {
    if (!*P->p || *P->p == '#') return perr(P, "expected %s, found end of line", what);
    return perr(P, "expected a space before %s, found '%s'", what, snip(P->p, b, sizeof b));
  }
  skip_ws(P);
  if (!*P->p || *P->p == '#') return perr(P, "expected %s, found end of line", what);
  return 1;
}

static int end_stmt(parser *P) {
  char b[40];
  skip_ws(P);
  if (*P->p && *P->p != '#') return perr(P, "unexpected '%s' at end of statement", snip(P->p, b, sizeof b));
  return 1;
}

/* A word of letters, digits, '_' and '-'; returns its length (0: none). */
static size_t word(parser *P, const char **start) {
  *start = P->p;
  while (is_word((unsigned char)*P->p)) P->p++;
  return (size_t)(P->p - *start);
}

static int word_is(const char *w, size_t n, const char *lit) { return strlen(lit) == n && !memcmp(w, lit, n); }

/* Scans [-]digits as an int64: 1 and *end past it; 0 without digits; -1 when out of range. */
static int scan_int(const char *s, int64_t *out, const char **end) {
  int neg = *s == '-';
  if (neg) s++;
  if (!is_digit((unsigned char)*s)) return 0;
  uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; is_digit((unsigned char)*s); s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (limit - d) / 10) return -1;
    v = v * 10 + d;
  }
  *out = neg ? (int64_t)(0 - v) : (int64_t)v; /* 0 - v wraps to INT64_MIN for 2^63 */
  *end = s;
  return 1;
}

/* An integer in [lo, hi] standing alone; `what` names it in messages. */
static int read_int(parser *P, int64_t lo, int64_t hi, const char *what, int64_t *out) {
  char b[40];
  const char *s;
  int64_t iv;
  int r = scan_int(P->p, &iv, &s);
  if (r == 0) return perr(P, "expected %s, found '%s'", what, snip(P->p, b, sizeof b));
  if (r < 0) return perr(P, "%s '%s' is out of range", what, snip(P->p, b, sizeof b));
  if (iv < lo || iv > hi) return perr(P, "%s %lld is outside %lld..%lld", what, (long long)iv, (long long)lo, (long long)hi);
  if (is_word((unsigned char)*s) || *s == '.') return perr(P, "%s '%s' is not an integer", what, snip(P->p, b, sizeof b));
  P->p = s;
  *out = iv;
  return 1;
}

/* "%ID": a positive node id. */
static int read_ref(parser *P, uint64_t *tid) {
  char b[40];
  if (*P->p != '%') return perr(P, "expected a node reference %%ID, found '%s'", snip(P->p, b, sizeof b));
  const char *s = P->p + 1;
  if (!is_digit((unsigned char)*s)) return perr(P, "bad node id '%s'", snip(P->p, b, sizeof b));
  uint64_t v = 0;
  for (; is_digit((unsigned char)*s); s++) {
    if (v > (UINT64_MAX - 9) / 10) return perr(P, "node id '%s' is too large", snip(P->p, b, sizeof b));
    v = v * 10 + (uint64_t)(*s - '0');
  }
  if (v == 0) return perr(P, "node ids are positive, found %%0");
  if (is_word((unsigned char)*s)) return perr(P, "bad node id '%s'", snip(P->p, b, sizeof b));
  P->p = s;
  *tid = v;
  return 1;
}

/* ---- the id map: written ids -> arena ids */

static size_t map_find(const parser *P, uint64_t tid) {
  size_t h = (size_t)((tid * 0x9e3779b97f4a7c15ull) >> 17) & (P->mapcap - 1);
  while (P->map[h].tid && P->map[h].tid != tid) h = (h + 1) & (P->mapcap - 1);
  return h;
}

static int map_put(parser *P, uint64_t tid, uint32_t node) {
  if ((P->mapn + 1) * 2 > P->mapcap) {
    size_t cap = P->mapcap ? P->mapcap * 2 : 64;
    tslot *old = P->map;
    size_t oldcap = P->mapcap;
    P->map = lm_calloc(cap, sizeof *P->map);
    if (!P->map) return P->map = old, pnomem(P);
    P->mapcap = cap;
    for (size_t i = 0; i < oldcap; i++)
      if (old[i].tid) P->map[map_find(P, old[i].tid)] = old[i];
    lm_free(old);
  }
  size_t h = map_find(P, tid);
  if (P->map[h].tid)
    return perr(P, "duplicate node id %%%llu (first defined on line %d)", (unsigned long long)tid, P->map[h].line);
  P->map[h] = (tslot){tid, node, P->line};
  P->mapn++;
  return 1;
}

static int add_ref(parser *P, uint8_t where, uint32_t idx, uint8_t slot, uint64_t tid) {
  if (!LM_GROW(P->refs, P->refcap, P->nrefs + 1)) return pnomem(P);
  P->refs[P->nrefs++] = (tref){where, slot, idx, tid, P->line};
  return 1;
}

/* ---- names and strings */

/* A bare name or a "quoted string"; the result lives in P->str until the next call. */
static int read_name(parser *P, const char *what) {
  char b[40];
  size_t n = 0;
  if (*P->p == '"') {
    const char *s = P->p + 1;
    for (;; s++) {
      int c = (unsigned char)*s;
      if (!c) return perr(P, "unterminated string in %s", what);
      if (c == '"') break;
      if (c == '\\') {
        c = (unsigned char)*++s;
        if (c == 'n') c = '\n';
        else if (c == 't') c = '\t';
        else if (c == 'x') {
          int v = 0;
          for (int k = 0; k < 2; k++) {
            int h = (unsigned char)*++s;
            int d = is_digit(h) ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return perr(P, "bad \\x escape in %s", what);
            v = v * 16 + d;
          }
          if (!v) return perr(P, "\\x00 is not allowed in %s", what);
          c = v;
        } else if (c != '"' && c != '\\') return perr(P, "bad escape '\\%c' in %s", c >= 0x20 && c < 0x7f ? c : '?', what);
      }
      if (!LM_GROW(P->str, P->strcap, n + 2)) return pnomem(P);
      P->str[n++] = (char)c;
    }
    P->p = s + 1;
  } else {
    const char *s = P->p;
    while (is_bare((unsigned char)*s)) s++;
    n = (size_t)(s - P->p);
    if (!n) return perr(P, "expected %s, found '%s'", what, snip(P->p, b, sizeof b));
    if (!LM_GROW(P->str, P->strcap, n + 1)) return pnomem(P);
    memcpy(P->str, P->p, n);
    P->p = s;
  }
  if (!LM_GROW(P->str, P->strcap, n + 1)) return pnomem(P);
  P->str[n] = 0;
  return 1;
}

/* ---- dimensions: recursive descent, then canonicalised
 * Operators are left-associative and subtraction is a + b*(-1), which makes the parser the
 * exact inverse of lm_x_print: a dimension the canonicaliser cannot reduce to a polynomial
 * still reads back as the same expression. Depth and size are bounded, so that the
 * canonicaliser's recursion stays shallow, and the stored (canonical) form must fit the
 * same bounds, so that every dump reads back. */

typedef struct dimx {
  lm_expr e;
  int depth; /* of the tree as written (an upper bound once constants fold) */
} dimx;

static dimx dim_sum(parser *P, int nest);

static dimx dim_fail(void) { return (dimx){0, 0}; }

static dimx dim_node(parser *P, lm_expr e, int depth) {
  if (!e) return pnomem(P), dim_fail();
  if (depth > DIM_MAX_TREE) return perr(P, "dimension is deeper than %d operations", DIM_MAX_TREE), dim_fail();
  return (dimx){e, depth};
}

static int max_i(int a, int b) { return a > b ? a : b; }

static dimx dim_atom(parser *P, int nest) {
  lm_exprs *x = &P->g->x;
  char b[40];
  if (nest > DIM_MAX_NEST) return perr(P, "dimension nests deeper than %d", DIM_MAX_NEST), dim_fail();
  if (++P->atoms > DIM_MAX_ATOMS) return perr(P, "dimension has more than %d terms", DIM_MAX_ATOMS), dim_fail();
  int c = (unsigned char)*P->p;
  if (c == '(') {
    P->p++;
    dimx e = dim_sum(P, nest + 1);
    if (!e.e) return e;
    if (*P->p != ')') return perr(P, "bad dimension: expected ')', found '%s'", snip(P->p, b, sizeof b)), dim_fail();
    P->p++;
    return e;
  }
  if (c == '-' && !is_digit((unsigned char)P->p[1])) {
    P->p++;
    dimx a = dim_atom(P, nest + 1);
    return a.e ? dim_node(P, lm_x_mul(x, lm_x_const(x, -1), a.e), a.depth + 1) : a;
  }
  if (c == '-' || is_digit(c)) { /* a literal: any int64, so that every folded constant reads back */
    int64_t v;
    const char *end;
    if (scan_int(P->p, &v, &end) < 0) return perr(P, "bad dimension: '%s' is out of range", snip(P->p, b, sizeof b)), dim_fail();
    if (is_alpha((unsigned char)*end)) return perr(P, "bad dimension: '%s'", snip(P->p, b, sizeof b)), dim_fail();
    P->p = end;
    return dim_node(P, lm_x_const(x, v), 1);
  }
  if (is_alpha(c)) {
    const char *s = P->p;
    while (is_ident((unsigned char)*P->p)) P->p++;
    size_t n = (size_t)(P->p - s);
    for (size_t k = 0; k < x->nsyms; k++)
      if (strlen(x->syms[k].name) == n && !memcmp(x->syms[k].name, s, n)) return dim_node(P, lm_x_sym(x, (int)k), 1);
    return perr(P, "bad dimension: unknown symbol '%.*s'", (int)(n < 32 ? n : 32), s), dim_fail();
  }
  return perr(P, "bad dimension: expected a number, a symbol or '(', found '%s'", snip(P->p, b, sizeof b)), dim_fail();
}

static dimx dim_term(parser *P, int nest) {
  lm_exprs *x = &P->g->x;
  dimx a = dim_atom(P, nest);
  while (a.e && (*P->p == '*' || *P->p == '/' || *P->p == '%')) {
    char op = *P->p++;
    dimx b = dim_atom(P, nest);
    if (!b.e) return b;
    lm_expr e = op == '*' ? lm_x_mul(x, a.e, b.e) : op == '/' ? lm_x_div(x, a.e, b.e) : lm_x_mod(x, a.e, b.e);
    a = dim_node(P, e, max_i(a.depth, b.depth) + 1);
  }
  return a;
}

static dimx dim_sum(parser *P, int nest) {
  lm_exprs *x = &P->g->x;
  dimx a = dim_term(P, nest);
  while (a.e && (*P->p == '+' || *P->p == '-')) {
    char op = *P->p++;
    dimx b = dim_term(P, nest);
    if (!b.e) return b;
    if (op == '-') b = dim_node(P, lm_x_mul(x, b.e, lm_x_const(x, -1)), b.depth + 1);
    if (!b.e) return b;
    a = dim_node(P, lm_x_add(x, a.e, b.e), max_i(a.depth, b.depth) + 1);
  }
  return a;
}

/* Whether e, written out as a tree, is at most `depth` deep and has at most *budget nodes. */
static int dim_fits(const lm_exprs *x, lm_expr e, int depth, int *budget) {
  if (depth <= 0 || --*budget < 0) return 0;
  const lm_xnode *nd = &x->nodes[e];
  if (nd->op == LM_X_CONST || nd->op == LM_X_SYM || nd->op == LM_X_VAR) return 1;
  return dim_fits(x, nd->a, depth - 1, budget) && dim_fits(x, nd->b, depth - 1, budget);
}

static lm_expr read_dim(parser *P) {
  P->atoms = 0;
  dimx d = dim_sum(P, 0);
  if (!d.e) return 0;
  char b[40];
  int c = (unsigned char)*P->p;
  if (c && !is_space(c) && c != ',' && c != ']' && c != '|' && c != '#')
    return perr(P, "bad dimension: unexpected '%s'", snip(P->p, b, sizeof b)), 0;
  lm_expr e = lm_x_simplify(&P->g->x, d.e, NULL);
  if (!e) return pnomem(P), 0;
  int budget = DIM_MAX_ATOMS;
  if (!dim_fits(&P->g->x, e, DIM_MAX_TREE / 2, &budget)) return perr(P, "bad dimension: its canonical form is too large"), 0;
  return e;
}

static int read_shape(parser *P, lm_shape *s) {
  char b[40];
  *s = (lm_shape){0};
  if (*P->p != '[') return perr(P, "expected a shape [d,...], found '%s'", snip(P->p, b, sizeof b));
  P->p++;
  if (*P->p == ']') return P->p++, 1;
  for (;;) {
    if (s->rank == LM_MAX_RANK) return perr(P, "bad dims: rank exceeds %d", LM_MAX_RANK);
    if (!(s->dim[s->rank++] = read_dim(P))) return 0;
    if (*P->p == ']') return P->p++, 1;
    if (*P->p != ',') return perr(P, "bad dims: expected ',' or ']', found '%s'", snip(P->p, b, sizeof b));
    P->p++;
  }
}

/* ---- edges: %ID|view|view... */

static int read_view(parser *P, uint32_t parent, uint32_t *out) {
  const char *w;
  char b[40];
  size_t n = word(P, &w);
  lm_view v = {.parent = parent, .kind = LM_V_COUNT};
  for (unsigned k = 0; k < LM_V_COUNT; k++)
    if (word_is(w, n, lm_view_kind_name(k))) v.kind = (uint8_t)k;
  if (v.kind == LM_V_COUNT) {
    P->p = w;
    return perr(P, "unknown view '%s'", snip(w, b, sizeof b));
  }
  int64_t axis = 0;
  if (v.kind == LM_V_PERMUTE) {
    for (;;) {
      const char *save = P->p;
      skip_ws(P);
      if (!(is_digit((unsigned char)*P->p) || (*P->p == '-' && is_digit((unsigned char)P->p[1])))) {
        P->p = save;
        break;
      }
      if (save == P->p) return perr(P, "expected a space before a permute entry");
      if (v.shape.rank == LM_MAX_RANK) return perr(P, "permute lists more than %d axes", LM_MAX_RANK);
      if (!read_int(P, -128, 127, "permute entry", &axis)) return 0;
      v.perm[v.shape.rank++] = (int8_t)axis;
    }
  } else if (v.kind == LM_V_RESHAPE) {
    if (!need_ws(P, "a shape") || !read_shape(P, &v.shape)) return 0;
  } else {
    if (!need_ws(P, "an axis") || !read_int(P, -128, 127, "axis", &axis)) return 0;
    v.axis = (int8_t)axis;
    if (!need_ws(P, "a dimension") || !(v.p0 = read_dim(P))) return 0;
    if (v.kind != LM_V_EXPAND && (!need_ws(P, "a dimension") || !(v.p1 = read_dim(P)))) return 0;
  }
  if (!(*out = lm_graph_push_view(P->g, &v))) return pnomem(P);
  return 1;
}

static int read_edge(parser *P, uint8_t where, uint32_t idx, uint8_t slot, lm_edge *e) {
  uint64_t tid;
  if (!read_ref(P, &tid) || !add_ref(P, where, idx, slot, tid)) return 0;
  *e = (lm_edge){0, 0};
  for (;;) {
    const char *save = P->p;
    skip_ws(P);
    if (*P->p != '|') {
      P->p = save;
      return 1;
    }
    P->p++;
    skip_ws(P);
    if (!read_view(P, e->view, &e->view)) return 0;
  }
}

/* ---- statements */

static int stmt_node(parser *P) {
  lm_graph_t *g = P->g;
  uint64_t tid;
  const char *w;
  char b[40];
  if (!read_ref(P, &tid)) return 0;
  skip_ws(P);
  if (*P->p != '=') return perr(P, "expected '=' after %%%llu", (unsigned long long)tid);
  P->p++;
  skip_ws(P);
  size_t n = word(P, &w);
  lm_node nd = {.op = LM_OP_COUNT};
  for (unsigned k = 0; k < LM_OP_COUNT; k++)
    if (word_is(w, n, lm_op_table[k].name)) nd.op = (uint8_t)k;
  if (!n) return perr(P, "expected an op after '=', found '%s'", snip(P->p, b, sizeof b));
  if (nd.op == LM_OP_COUNT) return perr(P, "unknown op '%s'", snip(w, b, sizeof b));
  uint32_t id = (uint32_t)g->nnodes; /* the id the node will get */
  if (g->nnodes >= UINT32_MAX - 1) return perr(P, "too many nodes");
  int64_t v;
  int role = -1;
  char *name = NULL;
  switch (nd.op) {
  case LM_OP_INPUT: {
    if (!need_ws(P, "an input name") || !read_name(P, "an input name")) return 0;
    if (!need_ws(P, "a role")) return 0;
    size_t rn = word(P, &w);
    for (int k = 0; k < LM_ROLE_COUNT; k++)
      if (word_is(w, rn, lm_role_name((lm_role)k))) role = k;
    if (role < 0) return perr(P, "bad role '%s' (data, param or state)", snip(w, b, sizeof b));
    if (!need_ws(P, "a shape") || !read_shape(P, &nd.shape)) return 0;
    nd.input = (uint32_t)g->ninputs;
    break;
  }
  case LM_OP_CONST: {
    if (!need_ws(P, "a value")) return 0;
    const char *s = P->p;
    while (*P->p && !is_space((unsigned char)*P->p) && *P->p != '#') P->p++;
    if (!read_float(s, (size_t)(P->p - s), &nd.value)) return P->p = s, perr(P, "bad constant '%s'", snip(s, b, sizeof b));
    break;
  }
  case LM_OP_RAND:
    if (!need_ws(P, "stream=N")) return 0;
    if (strncmp(P->p, "stream=", 7)) return perr(P, "expected stream=N, found '%s'", snip(P->p, b, sizeof b));
    P->p += 7;
    if (!read_int(P, 0, UINT32_MAX, "stream", &v)) return 0;
    nd.stream = (uint32_t)v;
    if (!need_ws(P, "a shape") || !read_shape(P, &nd.shape)) return 0;
    break;
  default:
    nd.nsrc = (uint8_t)lm_op_table[nd.op].arity;
    for (int k = 0; k < nd.nsrc; k++) {
      skip_ws(P);
      if (!*P->p || *P->p == '#' || *P->p != '%')
        return perr(P, "%s takes %d source%s, found %s", lm_op_table[nd.op].name, nd.nsrc, nd.nsrc == 1 ? "" : "s",
                    *P->p && *P->p != '#' ? snip(P->p, b, sizeof b) : "end of line");
      if (!read_edge(P, REF_SRC, id, (uint8_t)k, &nd.src[k])) return 0;
    }
    if (lm_op_table[nd.op].reduce) {
      if (!need_ws(P, "axis=N")) return 0;
      if (strncmp(P->p, "axis=", 5)) return perr(P, "expected axis=N, found '%s'", snip(P->p, b, sizeof b));
      P->p += 5;
      if (!read_int(P, -128, 127, "axis", &v)) return 0;
      nd.axis = (int8_t)v;
    }
    break;
  }
  if (!end_stmt(P) || !map_put(P, tid, id)) return 0;
  if (nd.op == LM_OP_INPUT) {
    if (!(name = lm_strdup(P->str)) || !LM_GROW(g->inputs, g->inputcap, g->ninputs + 1)) return lm_free(name), pnomem(P);
  }
  if (lm_graph_push_node(g, &nd) != id) return lm_free(name), pnomem(P);
  if (nd.op == LM_OP_INPUT) g->inputs[g->ninputs++] = (lm_input_info){name, (uint8_t)role, id};
  if (nd.op == LM_OP_RAND && nd.stream >= g->next_stream && nd.stream < UINT32_MAX) g->next_stream = nd.stream + 1;
  return 1;
}

static int stmt_sym(parser *P) {
  lm_exprs *x = &P->g->x;
  const char *s;
  char b[40];
  int64_t least;
  if (!need_ws(P, "a symbol name")) return 0;
  s = P->p;
  if (!is_alpha((unsigned char)*P->p)) return perr(P, "bad symbol name '%s'", snip(P->p, b, sizeof b));
  while (is_ident((unsigned char)*P->p)) P->p++;
  size_t n = (size_t)(P->p - s);
  if (n > 64) return perr(P, "symbol name longer than 64 characters");
  char name[72];
  memcpy(name, s, n);
  name[n] = 0;
  if (!need_ws(P, "a least value") || !read_int(P, INT64_MIN, INT64_MAX, "least value", &least) || !end_stmt(P))
    return 0;
  for (size_t k = 0; k < x->nsyms; k++)
    if (!strcmp(x->syms[k].name, name)) return perr(P, "symbol '%s' declared twice", name);
  if (lm_x_symbol(x, name, least) < 0) return pnomem(P);
  return 1;
}

static int stmt_output(parser *P) {
  lm_graph_t *g = P->g;
  lm_edge e;
  if (!need_ws(P, "an output name") || !read_name(P, "an output name")) return 0;
  char *name = lm_strdup(P->str);
  if (!name) return pnomem(P);
  if (!need_ws(P, "a node reference") || !read_edge(P, REF_OUTPUT, (uint32_t)g->noutputs, 0, &e) || !end_stmt(P))
    return lm_free(name), 0;
  if (!LM_GROW(g->outputs, g->outputcap, g->noutputs + 1)) return lm_free(name), pnomem(P);
  g->outputs[g->noutputs++] = (lm_output_info){name, e};
  return 1;
}

static int stmt_assign(parser *P) {
  lm_graph_t *g = P->g;
  uint64_t tid;
  lm_edge e;
  uint32_t idx = (uint32_t)g->nassigns;
  if (!need_ws(P, "a target") || !read_ref(P, &tid) || !add_ref(P, REF_TARGET, idx, 0, tid)) return 0;
  const char *save = P->p;
  skip_ws(P);
  if (*P->p == '|') return perr(P, "an assign target is an input node, without views");
  P->p = save;
  if (!need_ws(P, "a value") || !read_edge(P, REF_ASSIGN, idx, 0, &e) || !end_stmt(P)) return 0;
  if (!LM_GROW(g->assigns, g->assigncap, g->nassigns + 1)) return pnomem(P);
  g->assigns[g->nassigns++] = (lm_assign_info){0, e};
  return 1;
}

static int stmt_error(parser *P) {
  lm_graph_t *g = P->g;
  const char *w;
  char b[40];
  if (g->err) return perr(P, "a second error statement");
  if (!need_ws(P, "invalid or nomem")) return 0;
  size_t n = word(P, &w);
  lm_status st = word_is(w, n, "invalid") ? LM_ERR_INVALID : word_is(w, n, "nomem") ? LM_ERR_NOMEM : LM_OK;
  if (!st) return perr(P, "bad error kind '%s' (invalid or nomem)", snip(w, b, sizeof b));
  char *msg = NULL;
  skip_ws(P);
  if (*P->p == '"') {
    if (!read_name(P, "an error message")) return 0;
    if (!(msg = lm_strdup(P->str))) return pnomem(P);
  }
  if (!end_stmt(P)) return lm_free(msg), 0;
  g->err = st;
  g->errmsg = msg;
  return 1;
}

static int statement(parser *P) {
  const char *w;
  char b[40];
  skip_ws(P);
  if (!*P->p || *P->p == '#') return 1;
  if (!P->have_header) {
    size_t n = word(P, &w);
    int64_t version;
    if (!word_is(w, n, "lumen-graph")) return P->p = w, perr(P, "missing header: expected 'lumen-graph %d', found '%s'", TEXT_VERSION, snip(w, b, sizeof b));
    if (!need_ws(P, "a version") || !read_int(P, 0, INT32_MAX, "version", &version)) return 0;
    if (version != TEXT_VERSION) return perr(P, "unsupported version %lld (this lumen reads %d)", (long long)version, TEXT_VERSION);
    P->have_header = 1;
    return end_stmt(P);
  }
  if (*P->p == '%') return stmt_node(P);
  size_t n = word(P, &w);
  if (word_is(w, n, "sym")) return stmt_sym(P);
  if (word_is(w, n, "output")) return stmt_output(P);
  if (word_is(w, n, "assign")) return stmt_assign(P);
  if (word_is(w, n, "error")) return stmt_error(P);
  if (word_is(w, n, "lumen-graph")) return perr(P, "a second header");
  return perr(P, "unknown statement '%s'", snip(w, b, sizeof b));
}

/* ---- after the last line: references, then shapes */

static int resolve(parser *P) {
  lm_graph_t *g = P->g;
  for (size_t k = 0; k < P->nrefs; k++) {
    const tref *r = &P->refs[k];
    uint32_t id = 0;
    if (P->mapcap) {
      size_t h = map_find(P, r->tid);
      if (P->map[h].tid) id = P->map[h].node;
    }
    if (!id) {
      P->line = r->line;
      return perr(P, "unknown node %%%llu", (unsigned long long)r->tid);
    }
    switch (r->where) {
    case REF_SRC: g->nodes[r->idx].src[r->slot].node = id; break;
    case REF_OUTPUT: g->outputs[r->idx].src.node = id; break;
    case REF_TARGET: g->assigns[r->idx].target = id; break;
    default: g->assigns[r->idx].src.node = id; break;
    }
  }
  return 1;
}

/* Gives an edge's views the shapes they make of the node's shape. A view that cannot apply
 * gets a placeholder (its input's shape, or zeros for a permute); the validator says why. */
static int derive_edge(parser *P, lm_edge e) {
  lm_graph_t *g = P->g;
  size_t len = 0;
  for (uint32_t vi = e.view; vi; vi = g->views[vi].parent) {
    if (!LM_GROW(P->chain, P->chaincap, len + 1)) return pnomem(P);
    P->chain[len++] = vi;
  }
  const lm_shape *in = &g->nodes[e.node].shape;
  while (len--) {
    lm_view *v = &g->views[P->chain[len]];
    lm_shape out;
    if (lm_view_shape(g, v, in, &out, NULL, 0)) v->shape = out;
    else if (v->kind == LM_V_PERMUTE)
      for (int j = 0; j < v->shape.rank; j++) v->shape.dim[j] = lm_x_const(&g->x, 0);
    else if (v->kind != LM_V_RESHAPE) v->shape = *in;
    in = &v->shape;
  }
  return g->x.failed ? pnomem(P) : 1;
}

static int derive_node(parser *P, uint32_t id) {
  lm_graph_t *g = P->g;
  lm_node *n = &g->nodes[id];
  for (int k = 0; k < n->nsrc; k++)
    if (!derive_edge(P, n->src[k])) return 0;
  if (!n->nsrc) return 1;
  const lm_shape *s = lm_edge_shape(g, n->src[0]);
  n->shape = *s;
  if (lm_op_table[n->op].reduce && n->axis >= 0 && n->axis < s->rank) {
    n->shape.rank = s->rank - 1;
    for (int k = n->axis; k < n->shape.rank; k++) n->shape.dim[k] = s->dim[k + 1];
  }
  return 1;
}

static int derive_shapes(parser *P) {
  lm_graph_t *g = P->g;
  size_t count = 0;
  uint32_t *order = lm_graph_topo_order(g, &count);
  if (!order) {
    if (!strstr(lm_last_error(), "cycle")) return pnomem(P);
    lm_clear_error(); /* a cycle: shapes in text order, for the validator to reject */
  }
  int fine = 1;
  for (size_t k = 0; fine && k < (order ? count : g->nnodes - 1); k++) fine = derive_node(P, order ? order[k] : (uint32_t)k + 1);
  lm_free(order);
  for (size_t k = 0; fine && k < g->noutputs; k++) fine = derive_edge(P, g->outputs[k].src);
  for (size_t k = 0; fine && k < g->nassigns; k++) fine = derive_edge(P, g->assigns[k].src);
  return fine;
}

lm_graph_t *lm_graph_parse(const char *text) {
  if (!text) {
    lm_fail(LM_ERR_INVALID, "parse: no text");
    return NULL;
  }
  parser P = {.g = lm_graph_new(), .line = 0};
  if (!P.g) return NULL;
  char *buf = NULL;
  size_t cap = 0;
  for (const char *s = text; !P.failed && *s;) {
    const char *nl = strchr(s, '\n');
    size_t n = nl ? (size_t)(nl - s) : strlen(s);
    P.line++;
    if (!LM_GROW(buf, cap, n + 1)) {
      pnomem(&P);
      break;
    }
    memcpy(buf, s, n);
    buf[n] = 0;
    P.p = buf;
    statement(&P);
    s = nl ? nl + 1 : s + n;
  }
  if (!P.failed && !P.have_header) {
    P.line = P.line ? P.line : 1;
    perr(&P, "missing header 'lumen-graph %d'", TEXT_VERSION);
  }
  if (!P.failed && resolve(&P)) derive_shapes(&P);
  lm_free(buf);
  lm_free(P.map);
  lm_free(P.refs);
  lm_free(P.str);
  lm_free(P.chain);
  if (P.failed) {
    lm_graph_free(P.g);
    return NULL;
  }
  return P.g;
}
