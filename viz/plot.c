/* viz/plot.c — the learning curve of a training run: reads log.csv (columns found by name in
 * its header row) and draws mean episode return vs env steps (raw and smoothed, the env's
 * solved threshold dashed) above a loss panel and an entropy panel, with "nice" ticks, on a
 * canvas saved as PNG. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/core.h"
#include "lumen/viz.h"

#ifdef LUMEN_HAVE_SDL

enum {
  COL_BG = 0xffffffffu,
  COL_PANEL = 0xfbfbfcffu,
  COL_GRID = 0xe3e5e8ffu,
  COL_AXIS = 0x50555cffu,
  COL_TEXT = 0x1d1f23ffu,
  COL_DIM = 0x6b7280ffu,
  COL_RAW = 0x1f77b455u,
  COL_SMOOTH = 0x1f77b4ffu,
  COL_LOSS = 0xd62728ffu,
  COL_ENTROPY = 0x9467bdffu,
};

/* ---------------------------------------------------------------- the log */

typedef struct series {
  double *x, *y;
  size_t n;
} series;

typedef struct logdata {
  size_t rows;
  double *steps, *ret, *loss, *entropy, *episodes; /* NULL when the column is absent */
} logdata;

static void logdata_free(logdata *d) {
  lm_free(d->steps), lm_free(d->ret), lm_free(d->loss), lm_free(d->entropy), lm_free(d->episodes);
  memset(d, 0, sizeof *d);
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
  return s;
}

static size_t split(char *line, char **f, size_t cap) {
  size_t n = 0;
  for (char *p = line;; n++) {
    char *comma = strchr(p, ',');
    if (comma) *comma = 0;
    if (n < cap) f[n] = trim(p);
    if (!comma) return n + 1;
    p = comma + 1;
  }
}

static double parse_num(const char *s) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  return *s && !*end ? v : NAN;
}

static lm_status read_log(const char *path, logdata *d) {
  enum { MAXF = 64, NCOL = 6 };
  memset(d, 0, sizeof *d);
  FILE *f = fopen(path, "r");
  if (!f) return lm_fail(LM_ERR_IO, "plot: cannot read %s: %s", path, strerror(errno));
  struct stat sb; /* a device (/dev/zero, /dev/full) or a FIFO would be read for ever */
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    fclose(f);
    return lm_fail(LM_ERR_INVALID, "plot: %s is not a regular file", path);
  }
  static const char *const want[NCOL] = {"env_steps", "iteration", "mean_return", "loss", "entropy", "episodes"};
  int col[NCOL];
  for (int k = 0; k < NCOL; k++) col[k] = -1;
  char *line = NULL, *fields[MAXF];
  size_t lcap = 0, cap = 0, nhead = 0;
  long lineno = 0;
  double *cols[NCOL] = {0};
  lm_status st = LM_OK;
  while (getline(&line, &lcap, f) >= 0) {
    lineno++;
    char *l = trim(line);
    if (!*l || *l == '#') continue;
    size_t n = split(l, fields, MAXF);
    if (!nhead) {
      nhead = n > MAXF ? MAXF : n;
      for (size_t i = 0; i < nhead; i++)
        for (int k = 0; k < NCOL; k++)
          if (col[k] < 0 && !strcmp(fields[i], want[k])) col[k] = (int)i;
      if (col[2] < 0 || (col[0] < 0 && col[1] < 0)) {
        st = lm_fail(LM_ERR_INVALID,
                     "plot: %s:%ld: the header row needs columns mean_return and env_steps (or iteration); found '%s...'",
                     path, lineno, fields[0]);
        break;
      }
      continue;
    }
    if (n != nhead) continue; /* a row being written as we read, or damaged: skip it */
    if (d->rows == cap) {
      cap = cap ? 2 * cap : 256;
      for (int k = 0; k < NCOL && st == LM_OK; k++)
        if (col[k] >= 0) {
          double *p = lm_realloc(cols[k], cap * sizeof *p);
          if (!p) st = LM_ERR_NOMEM;
          else cols[k] = p;
        }
      if (st != LM_OK) break;
    }
    for (int k = 0; k < NCOL; k++)
      if (col[k] >= 0) cols[k][d->rows] = parse_num(fields[col[k]]);
    d->rows++;
  }
  if (st == LM_OK && !nhead) st = lm_fail(LM_ERR_INVALID, "plot: %s is empty (expected a header row)", path);
  free(line);
  fclose(f);
  d->steps = col[0] >= 0 ? cols[0] : cols[1];
  if (col[0] >= 0) lm_free(cols[1]);
  d->ret = cols[2], d->loss = cols[3], d->entropy = cols[4], d->episodes = cols[5];
  if (st != LM_OK) logdata_free(d);
  return st;
}

/* ---------------------------------------------------------------- axes */

typedef struct panel {
  float x0, y0, x1, y1;   /* pixels */
  double xlo, xhi, ylo, yhi;
} panel;

static float px(const panel *p, double x) { return p->x0 + (float)((x - p->xlo) / (p->xhi - p->xlo)) * (p->x1 - p->x0); }
static float py(const panel *p, double y) { return p->y1 - (float)((y - p->ylo) / (p->yhi - p->ylo)) * (p->y1 - p->y0); }

/* A 1, 2 or 5 times a power of ten near range / target. */
static double nice_step(double range, int target) {
  double raw = range / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
  return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

static void fmt_tick(char *buf, size_t cap, double v, double step, int si) {
  if (fabs(v) < step * 1e-6) v = 0;
  double a = fabs(v);
  if (si && a >= 1e6) snprintf(buf, cap, "%gM", round(v / step) * step / 1e6);
  else if (si && a >= 1e3) snprintf(buf, cap, "%gk", round(v / step) * step / 1e3);
  else {
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (a >= 1e5 || (a > 0 && a < 1e-4)) snprintf(buf, cap, "%.2g", v);
    else snprintf(buf, cap, "%.*f", dec, v);
  }
}

/* Range of the finite values of y (and of extra, when finite); a flat range is widened. */
static void value_range(const double *y, size_t n, double extra, double *lo, double *hi) {
  double a = INFINITY, b = -INFINITY;
  for (size_t i = 0; i < n; i++)
    if (isfinite(y[i])) a = fmin(a, y[i]), b = fmax(b, y[i]);
  if (isfinite(extra)) a = fmin(a, extra), b = fmax(b, extra);
  if (!isfinite(a)) a = 0, b = 1;
  if (b - a < 1e-9 * fmax(1, fabs(a))) {
    double w = fmax(fabs(a) * 0.1, 1e-3);
    a -= w, b += w;
  } else {
    double pad = (b - a) * 0.05;
    a -= pad, b += pad;
  }
  *lo = a, *hi = b;
}

static void draw_axes(lm_canvas *c, panel *p, const char *title, int ts) {
  lm_canvas_fill_rect(c, p->x0, p->y0, p->x1, p->y1, COL_PANEL);
  char buf[64];
  /* ticks at whole multiples of a 1-2-5 step inside the (padded) range */
  double ys = nice_step(p->yhi - p->ylo, (p->y1 - p->y0) > 300 ? 6 : 4);
  for (double v = ceil(p->ylo / ys - 1e-9) * ys; v <= p->yhi + ys * 1e-6; v += ys) {
    float y = floorf(py(p, v)) + 0.5f;
    lm_canvas_line(c, p->x0, y, p->x1, y, 1, COL_GRID, 0);
    fmt_tick(buf, sizeof buf, v, ys, 0);
    int w = lm_canvas_text_width(buf, ts);
    lm_canvas_text(c, p->x0 - 8 - (float)w, y - (float)(LM_FONT_CELL_H * ts) / 2 + 1, ts, COL_TEXT, buf);
  }
  double xs = nice_step(p->xhi - p->xlo, (p->x1 - p->x0) > 700 ? 8 : 5);
  for (double v = ceil(p->xlo / xs - 1e-9) * xs; v <= p->xhi + xs * 1e-6; v += xs) {
    float x = floorf(px(p, v)) + 0.5f;
    lm_canvas_line(c, x, p->y0, x, p->y1, 1, COL_GRID, 0);
    lm_canvas_line(c, x, p->y1, x, p->y1 + 5, 1, COL_AXIS, 0);
    fmt_tick(buf, sizeof buf, v, xs, 1);
    int w = lm_canvas_text_width(buf, ts);
    lm_canvas_text(c, x - (float)w / 2, p->y1 + 9, ts, COL_TEXT, buf);
  }
  lm_canvas_rect(c, p->x0 - 1, p->y0 - 1, p->x1 + 1, p->y1 + 1, 1, COL_AXIS);
  lm_canvas_text(c, p->x0, p->y0 - (float)(LM_FONT_CELL_H * ts) - 6, ts, COL_TEXT, title);
}

static void draw_series(lm_canvas *c, const panel *p, const double *x, const double *y, size_t n, float width,
                        uint32_t rgba) {
  lm_canvas_clip(c, (int)p->x0, (int)p->y0, (int)(p->x1 - p->x0) + 1, (int)(p->y1 - p->y0) + 1);
  int have = 0;
  float lx = 0, ly = 0;
  size_t points = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i]) || !isfinite(y[i])) continue; /* missing: join its neighbours */
    float X = px(p, x[i]), Y = py(p, y[i]);
    if (have) lm_canvas_line(c, lx, ly, X, Y, width, rgba, width >= 3);
    lx = X, ly = Y, have = 1, points++;
  }
  if (points == 1) lm_canvas_fill_circle(c, lx, ly, fmaxf(width, 3), rgba);
  lm_canvas_clip(c, 0, 0, 0, 0);
}

/* Centred moving average over finite values, window 2h+1. */
static void smooth(const double *y, double *out, size_t n, size_t h) {
  for (size_t i = 0; i < n; i++) {
    double s = 0;
    size_t k = 0;
    size_t a = i >= h ? i - h : 0, b = i + h < n ? i + h : n - 1;
    for (size_t j = a; j <= b; j++)
      if (isfinite(y[j])) s += y[j], k++;
    out[i] = k && isfinite(y[i]) ? s / (double)k : NAN;
  }
}

static void fmt_value(char *buf, size_t cap, double v) {
  if (!isfinite(v)) snprintf(buf, cap, "-");
  else if (fabs(v) >= 1e6) snprintf(buf, cap, "%.3gM", v / 1e6);
  else if (fabs(v) >= 1e4) snprintf(buf, cap, "%.3gk", v / 1e3);
  else if (v == floor(v)) snprintf(buf, cap, "%.0f", v);
  else if (fabs(v) >= 100) snprintf(buf, cap, "%.1f", v);
  else snprintf(buf, cap, "%.3g", v);
}

static void small_panel(lm_canvas *c, panel *p, const char *name, const double *x, const double *y, size_t n,
                        uint32_t rgba, int ts) {
  if (!y) {
    p->xlo = 0, p->xhi = 1, p->ylo = 0, p->yhi = 1;
    draw_axes(c, p, name, ts);
    lm_canvas_text(c, p->x0 + 12, p->y0 + 12, ts, COL_DIM, "not in the log");
    return;
  }
  value_range(y, n, NAN, &p->ylo, &p->yhi);
  draw_axes(c, p, name, ts);
  draw_series(c, p, x, y, n, 2.5f, rgba);
}

lm_status lm_plot_curve(const char *log_csv, const char *out_png, const char *env_name, float solved_return) {
  if (!log_csv || !out_png) return lm_fail(LM_ERR_INVALID, "plot: need a log.csv path and a PNG path");
  logdata d;
  lm_status st = read_log(log_csv, &d);
  if (st != LM_OK) return st;
  size_t n = d.rows;
  double *ret = lm_calloc(n ? 2 * n : 1, sizeof *ret);
  lm_canvas *c = ret ? lm_canvas_new(LM_PLOT_WIDTH, LM_PLOT_HEIGHT) : NULL;
  if (!c) {
    st = ret ? LM_ERR_UNSUPPORTED : LM_ERR_NOMEM;
    lm_free(ret);
    logdata_free(&d);
    return st;
  }
  double *sm = ret + n;
  /* iterations that finished no episode have no mean return */
  size_t finite = 0, last = 0;
  double best = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    ret[i] = d.episodes && !(d.episodes[i] > 0) ? NAN : d.ret[i];
    if (isfinite(ret[i]) && isfinite(d.steps[i])) finite++, last = i, best = fmax(best, ret[i]);
  }
  size_t h = finite / 40;
  smooth(ret, sm, n, h);

  const int ts = 2;
  float line_h = (float)(LM_FONT_CELL_H * ts);
  lm_canvas_clear(c, COL_BG);
  char title[256], sub[256], a[32], b[32], e[32];
  float solved = solved_return;
  snprintf(title, sizeof title, "%s: mean episode return vs env steps", env_name && *env_name ? env_name : "training");
  lm_canvas_text(c, 24, 14, 3, COL_TEXT, title);
  if (finite) {
    fmt_value(a, sizeof a, d.steps[last]);
    fmt_value(b, sizeof b, ret[last]);
    fmt_value(e, sizeof e, best);
    snprintf(sub, sizeof sub, "%zu iterations, %s env steps | last %s | best %s", n, a, b, e);
  } else snprintf(sub, sizeof sub, "%zu iterations | no finished episodes yet", n);
  if (isfinite(solved)) {
    fmt_value(a, sizeof a, solved);
    size_t len = strlen(sub);
    snprintf(sub + len, sizeof sub - len, " | solved at %s%s", a,
             finite && sm[last] >= solved ? " (reached)" : "");
  }
  lm_canvas_text(c, 24, 14 + 3 * LM_FONT_CELL_H + 8, ts, COL_DIM, sub);

  /* x range shared by the panels */
  double xlo = INFINITY, xhi = -INFINITY;
  for (size_t i = 0; i < n; i++)
    if (isfinite(d.steps[i])) xlo = fmin(xlo, d.steps[i]), xhi = fmax(xhi, d.steps[i]);
  if (!isfinite(xlo)) xlo = 0, xhi = 1;
  if (xlo > 0 && xlo < 0.25 * xhi) xlo = 0;
  if (xhi - xlo < 1e-9) xhi = xlo + 1;

  panel top = {110, 110, LM_PLOT_WIDTH - 30, 470, xlo, xhi, 0, 1};
  value_range(ret, n, solved, &top.ylo, &top.yhi);
  draw_axes(c, &top, "mean episode return", ts);
  lm_canvas_text(c, (top.x0 + top.x1) / 2 - (float)lm_canvas_text_width("env steps", ts) / 2, top.y1 + 12 + line_h, ts,
                 COL_DIM, "env steps");
  if (isfinite(solved)) {
    float y = py(&top, solved);
    lm_canvas_dashed_line(c, top.x0, y, top.x1, y, 3, 14, 9, LM_PLOT_THRESHOLD_RGBA);
  }
  draw_series(c, &top, d.steps, ret, n, 2.0f, COL_RAW);
  draw_series(c, &top, d.steps, sm, n, 3.5f, COL_SMOOTH);
  if (isfinite(solved)) { /* its label */
    float y = py(&top, solved);
    char lab[64];
    fmt_value(a, sizeof a, solved);
    snprintf(lab, sizeof lab, "solved: %s", a);
    float w = (float)lm_canvas_text_width(lab, ts);
    /* at the left end, where a rising curve is still low; below the line when it is at the top */
    float ly = y - line_h - 8 < top.y0 + 2 ? y + 8 : y - line_h - 8;
    lm_canvas_fill_rect(c, top.x0 + 6, ly - 3, top.x0 + w + 16, ly + line_h + 2, 0xffffffc0u);
    lm_canvas_text(c, top.x0 + 11, ly, ts, LM_PLOT_THRESHOLD_RGBA, lab);
  }
  if (!finite) lm_canvas_text(c, top.x0 + 16, top.y0 + 16, ts, COL_DIM, "no finished episodes yet");
  /* legend */
  char smooth_lab[64];
  if (h) snprintf(smooth_lab, sizeof smooth_lab, "smoothed (%zu iterations)", 2 * h + 1);
  else snprintf(smooth_lab, sizeof smooth_lab, "mean return");
  /* legend at the bottom right, where a rising curve rarely is */
  float legend_w = 46 + (float)lm_canvas_text_width(smooth_lab, ts), legend_h = (h ? 2 : 1) * (line_h + 8);
  float lx = top.x1 - legend_w - 16, ly = top.y1 - legend_h - 8;
  lm_canvas_fill_rect(c, lx - 8, ly - 6, lx + legend_w + 8, ly + legend_h, 0xffffffd8u);
  lm_canvas_line(c, lx, ly + line_h / 2, lx + 36, ly + line_h / 2, 3.5f, COL_SMOOTH, 0);
  lm_canvas_text(c, lx + 46, ly, ts, COL_TEXT, smooth_lab);
  if (h) {
    ly += line_h + 8;
    lm_canvas_line(c, lx, ly + line_h / 2, lx + 36, ly + line_h / 2, 2, COL_RAW, 0);
    lm_canvas_text(c, lx + 46, ly, ts, COL_TEXT, "per iteration");
  }

  float half = (LM_PLOT_WIDTH - 110 - 30 - 120) / 2.0f;
  panel loss = {110, 580, 110 + half, LM_PLOT_HEIGHT - 50, xlo, xhi, 0, 1};
  panel ent = {loss.x1 + 120, 580, LM_PLOT_WIDTH - 30, LM_PLOT_HEIGHT - 50, xlo, xhi, 0, 1};
  small_panel(c, &loss, "loss", d.steps, d.loss, n, COL_LOSS, ts);
  small_panel(c, &ent, "entropy", d.steps, d.entropy, n, COL_ENTROPY, ts);

  st = lm_canvas_save_png(c, out_png);
  lm_canvas_free(c);
  lm_free(ret);
  logdata_free(&d);
  return st;
}

#else /* no SDL2 */

lm_status lm_plot_curve(const char *log_csv, const char *out_png, const char *env_name, float solved_return) {
  (void)log_csv, (void)out_png, (void)env_name, (void)solved_return;
  return lm_fail(LM_ERR_UNSUPPORTED, "plot: built without SDL2: learning curves need libsdl2-dev and libsdl2-image-dev "
                                     "(then reconfigure)");
}

#endif
