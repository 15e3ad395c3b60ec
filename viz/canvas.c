/* viz/canvas.c — the canvas every picture of lumen is drawn on: an ARGB SDL surface drawn by
 * our own anti-aliased rasteriser (so a window, a headless capture and a plot are the same pixels):
 * convex polygons by sub-scanline coverage — lines are quads, circles are many-sided polygons —
 * a built-in 5x7 bitmap font (SDL2 has no text and SDL2_ttf is not a dependency), and SDL for
 * the surface and scaling, libpng for PNG output. */
#include <math.h>
#include <string.h>

#include "compiler/core.h"
#include "lumen/viz.h"

#ifdef LUMEN_HAVE_SDL
#include <SDL.h>
#include <errno.h>
#include <fcntl.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct lm_canvas {
  SDL_Surface *surf; /* ARGB8888, always opaque */
  int w, h;
  int cx0, cy0, cx1, cy1; /* clip rectangle, [cx0, cx1) x [cy0, cy1) */
  float *cov;             /* one row of coverage for the polygon filler */
};

/* The classic 5x7 font for ' ' .. '~': five columns per glyph, bit 0 the top row, row 6 the
 * baseline; g j p q y , ; reach below it into row 7. */
static const unsigned char font5x7[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5F, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00}, /*  !" */
    {0x14, 0x7F, 0x14, 0x7F, 0x14}, {0x24, 0x2A, 0x7F, 0x2A, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62}, /* #$% */
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1C, 0x22, 0x41, 0x00}, /* &'( */
    {0x00, 0x41, 0x22, 0x1C, 0x00}, {0x08, 0x2A, 0x1C, 0x2A, 0x08}, {0x08, 0x08, 0x3E, 0x08, 0x08}, /* )*+ */
    {0x00, 0xA0, 0x60, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00}, /* ,-. */
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3E, 0x51, 0x49, 0x45, 0x3E}, {0x00, 0x42, 0x7F, 0x40, 0x00}, /* /01 */
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4B, 0x31}, {0x18, 0x14, 0x12, 0x7F, 0x10}, /* 234 */
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3C, 0x4A, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03}, /* 567 */
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1E}, {0x00, 0x36, 0x36, 0x00, 0x00}, /* 89: */
    {0x00, 0xAC, 0x6C, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14}, /* ;<= */
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, {0x32, 0x49, 0x79, 0x41, 0x3E}, /* >?@ */
    {0x7E, 0x11, 0x11, 0x11, 0x7E}, {0x7F, 0x49, 0x49, 0x49, 0x36}, {0x3E, 0x41, 0x41, 0x41, 0x22}, /* ABC */
    {0x7F, 0x41, 0x41, 0x22, 0x1C}, {0x7F, 0x49, 0x49, 0x49, 0x41}, {0x7F, 0x09, 0x09, 0x09, 0x01}, /* DEF */
    {0x3E, 0x41, 0x49, 0x49, 0x7A}, {0x7F, 0x08, 0x08, 0x08, 0x7F}, {0x00, 0x41, 0x7F, 0x41, 0x00}, /* GHI */
    {0x20, 0x40, 0x41, 0x3F, 0x01}, {0x7F, 0x08, 0x14, 0x22, 0x41}, {0x7F, 0x40, 0x40, 0x40, 0x40}, /* JKL */
    {0x7F, 0x02, 0x0C, 0x02, 0x7F}, {0x7F, 0x04, 0x08, 0x10, 0x7F}, {0x3E, 0x41, 0x41, 0x41, 0x3E}, /* MNO */
    {0x7F, 0x09, 0x09, 0x09, 0x06}, {0x3E, 0x41, 0x51, 0x21, 0x5E}, {0x7F, 0x09, 0x19, 0x29, 0x46}, /* PQR */
    {0x46, 0x49, 0x49, 0x49, 0x31}, {0x01, 0x01, 0x7F, 0x01, 0x01}, {0x3F, 0x40, 0x40, 0x40, 0x3F}, /* STU */
    {0x1F, 0x20, 0x40, 0x20, 0x1F}, {0x3F, 0x40, 0x38, 0x40, 0x3F}, {0x63, 0x14, 0x08, 0x14, 0x63}, /* VWX */
    {0x07, 0x08, 0x70, 0x08, 0x07}, {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7F, 0x41, 0x41, 0x00}, /* YZ[ */
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7F, 0x00}, {0x04, 0x02, 0x01, 0x02, 0x04}, /* \]^ */
    {0x40, 0x40, 0x40, 0x40, 0x40}, {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78}, /* _`a */
    {0x7F, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, {0x38, 0x44, 0x44, 0x48, 0x7F}, /* bcd */
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7E, 0x09, 0x01, 0x02}, {0x18, 0xA4, 0xA4, 0xA4, 0x7C}, /* efg */
    {0x7F, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7D, 0x40, 0x00}, {0x40, 0x80, 0x84, 0x7D, 0x00}, /* hij */
    {0x7F, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7F, 0x40, 0x00}, {0x7C, 0x04, 0x18, 0x04, 0x78}, /* klm */
    {0x7C, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0xFC, 0x24, 0x24, 0x24, 0x18}, /* nop */
    {0x18, 0x24, 0x24, 0x24, 0xFC}, {0x7C, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20}, /* qrs */
    {0x04, 0x3F, 0x44, 0x40, 0x20}, {0x3C, 0x40, 0x40, 0x20, 0x7C}, {0x1C, 0x20, 0x40, 0x20, 0x1C}, /* tuv */
    {0x3C, 0x40, 0x30, 0x40, 0x3C}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x1C, 0xA0, 0xA0, 0xA0, 0x7C}, /* wxy */
    {0x44, 0x64, 0x54, 0x4C, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7F, 0x00, 0x00}, /* z{| */
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x08, 0x04, 0x08, 0x10, 0x08},                                  /* }~ */
};

lm_canvas *lm_canvas_new(int w, int h) {
  if (w < 1 || h < 1 || w > 16384 || h > 16384) {
    lm_fail(LM_ERR_INVALID, "canvas: size %dx%d is not in 1..16384", w, h);
    return NULL;
  }
  lm_canvas *c = lm_calloc(1, sizeof *c);
  if (!c) return NULL;
  c->w = w, c->h = h;
  c->cov = lm_calloc((size_t)w + 2, sizeof *c->cov);
  c->surf = SDL_CreateRGBSurfaceWithFormat(0, w, h, 32, SDL_PIXELFORMAT_ARGB8888);
  if (!c->surf || !c->cov) {
    lm_fail(LM_ERR_NOMEM, "canvas: cannot create a %dx%d surface: %s", w, h, c->surf ? "out of memory" : SDL_GetError());
    lm_canvas_free(c);
    return NULL;
  }
  lm_canvas_clip(c, 0, 0, 0, 0);
  lm_canvas_clear(c, 0xffffffffu);
  return c;
}

void lm_canvas_free(lm_canvas *c) {
  if (!c) return;
  if (c->surf) SDL_FreeSurface(c->surf);
  lm_free(c->cov);
  lm_free(c);
}

void lm_canvas_size(const lm_canvas *c, int *w, int *h) {
  if (w) *w = c->w;
  if (h) *h = c->h;
}

void lm_canvas_clip(lm_canvas *c, int x, int y, int w, int h) {
  if (w <= 0 || h <= 0) x = 0, y = 0, w = c->w, h = c->h;
  c->cx0 = x < 0 ? 0 : x;
  c->cy0 = y < 0 ? 0 : y;
  c->cx1 = x + w > c->w ? c->w : x + w;
  c->cy1 = y + h > c->h ? c->h : y + h;
}

static Uint32 *row_of(lm_canvas *c, int y) { return (Uint32 *)(void *)((Uint8 *)c->surf->pixels + (size_t)y * (size_t)c->surf->pitch); }

static Uint32 argb_of(uint32_t rgba) { return (rgba >> 8) | 0xff000000u; }

/* Blends colour rgba into pixel p with coverage cov in [0, 1]. */
static void blend(Uint32 *p, uint32_t rgba, float cov) {
  int a = (int)(cov * (float)(rgba & 0xff) + 0.5f);
  if (a <= 0) return;
  if (a >= 255) {
    *p = argb_of(rgba);
    return;
  }
  Uint32 d = *p;
  int sr = (int)(rgba >> 24), sg = (int)(rgba >> 16 & 0xff), sb = (int)(rgba >> 8 & 0xff);
  int dr = (int)(d >> 16 & 0xff), dg = (int)(d >> 8 & 0xff), db = (int)(d & 0xff);
  dr = (sr * a + dr * (255 - a) + 127) / 255;
  dg = (sg * a + dg * (255 - a) + 127) / 255;
  db = (sb * a + db * (255 - a) + 127) / 255;
  *p = 0xff000000u | (Uint32)dr << 16 | (Uint32)dg << 8 | (Uint32)db;
}

void lm_canvas_clear(lm_canvas *c, uint32_t rgba) {
  Uint32 v = argb_of(rgba);
  for (int y = 0; y < c->h; y++) {
    Uint32 *r = row_of(c, y);
    for (int x = 0; x < c->w; x++) r[x] = v;
  }
}

/* Length of [a, b) inside [lo, lo + 1). */
static float overlap(float a, float b, float lo) {
  float l = a > lo ? a : lo, h = b < lo + 1 ? b : lo + 1;
  return h > l ? h - l : 0;
}

void lm_canvas_fill_rect(lm_canvas *c, float x0, float y0, float x1, float y1, uint32_t rgba) {
  if (x1 < x0) { float t = x0; x0 = x1; x1 = t; }
  if (y1 < y0) { float t = y0; y0 = y1; y1 = t; }
  int ia = (int)floorf(x0), ib = (int)ceilf(x1), ja = (int)floorf(y0), jb = (int)ceilf(y1);
  if (ia < c->cx0) ia = c->cx0;
  if (ib > c->cx1) ib = c->cx1;
  if (ja < c->cy0) ja = c->cy0;
  if (jb > c->cy1) jb = c->cy1;
  if (ia >= ib) return;
  /* columns ia and ib - 1 may be partly covered; those between are whole */
  Uint32 solid = argb_of(rgba);
  int opaque = (rgba & 0xff) == 0xff;
  for (int j = ja; j < jb; j++) {
    float cy = overlap(y0, y1, (float)j);
    Uint32 *r = row_of(c, j);
    blend(&r[ia], rgba, cy * overlap(x0, x1, (float)ia));
    if (ib - 1 > ia) blend(&r[ib - 1], rgba, cy * overlap(x0, x1, (float)(ib - 1)));
    if (opaque && cy >= 1.0f)
      for (int i = ia + 1; i < ib - 1; i++) r[i] = solid;
    else
      for (int i = ia + 1; i < ib - 1; i++) blend(&r[i], rgba, cy);
  }
}

void lm_canvas_rect(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba) {
  if (width < 1) width = 1;
  lm_canvas_fill_rect(c, x0, y0, x1, y0 + width, rgba);
  lm_canvas_fill_rect(c, x0, y1 - width, x1, y1, rgba);
  lm_canvas_fill_rect(c, x0, y0 + width, x0 + width, y1 - width, rgba);
  lm_canvas_fill_rect(c, x1 - width, y0 + width, x1, y1 - width, rgba);
}

/* A convex polygon, anti-aliased: SUB sub-scanlines per pixel row, each adding the exact
 * horizontal coverage of its span to a row of coverage, which is then blended. */
static void fill_convex(lm_canvas *c, const float *xs, const float *ys, int n, uint32_t rgba) {
  enum { SUB = 5 };
  if (n < 3) return;
  float ymin = ys[0], ymax = ys[0], xmin = xs[0], xmax = xs[0];
  for (int k = 1; k < n; k++) {
    ymin = fminf(ymin, ys[k]), ymax = fmaxf(ymax, ys[k]);
    xmin = fminf(xmin, xs[k]), xmax = fmaxf(xmax, xs[k]);
  }
  if (!isfinite(xmin) || !isfinite(xmax) || !isfinite(ymin) || !isfinite(ymax)) return;
  float fx0 = (float)c->cx0, fx1 = (float)c->cx1;
  int ja = (int)floorf(ymin), jb = (int)ceilf(ymax);
  if (ja < c->cy0) ja = c->cy0;
  if (jb > c->cy1) jb = c->cy1;
  int ia = (int)floorf(fmaxf(xmin, fx0)), ib = (int)ceilf(fminf(xmax, fx1));
  if (ia >= ib) return;
  float *cov = c->cov;
  for (int j = ja; j < jb; j++) {
    int any = 0;
    for (int s = 0; s < SUB; s++) {
      float y = (float)j + ((float)s + 0.5f) / SUB, l = INFINITY, r = -INFINITY;
      for (int k = 0; k < n; k++) {
        float ax = xs[k], ay = ys[k], bx = xs[(k + 1) % n], by = ys[(k + 1) % n];
        if ((ay <= y && y < by) || (by <= y && y < ay)) {
          float x = ax + (y - ay) / (by - ay) * (bx - ax);
          l = fminf(l, x), r = fmaxf(r, x);
        }
      }
      l = fmaxf(l, fx0), r = fminf(r, fx1);
      if (!(r > l)) continue;
      any = 1;
      int il = (int)floorf(l), ir = (int)floorf(r);
      if (il == ir) cov[il] += (r - l) / SUB;
      else {
        cov[il] += ((float)il + 1 - l) / SUB;
        for (int i = il + 1; i < ir; i++) cov[i] += 1.0f / SUB;
        if (ir < c->cx1) cov[ir] += (r - (float)ir) / SUB;
      }
    }
    if (!any) continue;
    Uint32 *row = row_of(c, j);
    for (int i = ia; i < ib; i++) {
      if (cov[i] > 0) blend(&row[i], rgba, fminf(cov[i], 1.0f));
      cov[i] = 0;
    }
  }
}

void lm_canvas_fill_circle(lm_canvas *c, float cx, float cy, float r, uint32_t rgba) {
  enum { MAX_SEG = 256 };
  if (!(r > 0)) return;
  if (r < 0.75f) r = 0.75f;
  int n = (int)(r * 1.6f);
  n = n < 16 ? 16 : n > MAX_SEG ? MAX_SEG : n;
  float xs[MAX_SEG], ys[MAX_SEG];
  for (int i = 0; i < n; i++) {
    double a = 2 * M_PI * i / n;
    xs[i] = cx + r * (float)cos(a), ys[i] = cy + r * (float)sin(a);
  }
  fill_convex(c, xs, ys, n, rgba);
}

void lm_canvas_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba, int round_caps) {
  float dx = x1 - x0, dy = y1 - y0, len = sqrtf(dx * dx + dy * dy);
  if (width < 1) width = 1;
  if (len > 1e-4f) {
    float nx = -dy / len * width / 2, ny = dx / len * width / 2;
    float xs[4] = {x0 + nx, x0 - nx, x1 - nx, x1 + nx}, ys[4] = {y0 + ny, y0 - ny, y1 - ny, y1 + ny};
    fill_convex(c, xs, ys, 4, rgba);
  }
  if (round_caps) {
    lm_canvas_fill_circle(c, x0, y0, width / 2, rgba);
    lm_canvas_fill_circle(c, x1, y1, width / 2, rgba);
  }
}

void lm_canvas_dashed_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, float dash, float gap,
                           uint32_t rgba) {
  float dx = x1 - x0, dy = y1 - y0, len = sqrtf(dx * dx + dy * dy);
  if (len < 1e-3f || dash <= 0) return;
  if (gap < 0) gap = 0;
  for (float s = 0; s < len; s += dash + gap) {
    float e = fminf(s + dash, len);
    lm_canvas_line(c, x0 + dx * s / len, y0 + dy * s / len, x0 + dx * e / len, y0 + dy * e / len, width, rgba, 0);
  }
}

int lm_canvas_text_width(const char *text, int scale) {
  if (scale < 1) scale = 1;
  return text ? (int)strlen(text) * LM_FONT_CELL_W * scale : 0;
}

int lm_canvas_text(lm_canvas *c, float x, float y, int scale, uint32_t rgba, const char *text) {
  if (!text) return 0;
  if (scale < 1) scale = 1;
  float s = (float)scale, cx = x;
  x = roundf(x), y = roundf(y), cx = x; /* glyphs on whole pixels stay crisp */
  for (const unsigned char *p = (const unsigned char *)text; *p; p++, cx += LM_FONT_CELL_W * s) {
    int g = *p >= 32 && *p <= 126 ? *p - 32 : '?' - 32;
    for (int col = 0; col < 5; col++)
      for (int row = 0; row < 8; row++)
        if (font5x7[g][col] >> row & 1) {
          float gx = cx + (float)col * s, gy = y + (float)row * s;
          lm_canvas_fill_rect(c, gx, gy, gx + s, gy + s, rgba);
        }
  }
  return (int)(cx - x);
}

lm_status lm_canvas_blit(lm_canvas *dst, const lm_canvas *src, int x, int y, int w, int h) {
  SDL_Rect r = {x, y, w, h};
  int rc;
  SDL_SetSurfaceBlendMode(src->surf, SDL_BLENDMODE_NONE);
  if (w == src->w && h == src->h) rc = SDL_BlitSurface(src->surf, NULL, dst->surf, &r);
  else {
    rc = SDL_SoftStretchLinear(src->surf, NULL, dst->surf, &r);
    if (rc != 0) rc = SDL_BlitScaled(src->surf, NULL, dst->surf, &r);
  }
  return rc == 0 ? LM_OK : lm_fail(LM_ERR_INVALID, "canvas: blit failed: %s", SDL_GetError());
}

lm_status lm_canvas_read_rgba(lm_canvas *c, uint8_t *dst, size_t cap) {
  if (cap < (size_t)c->w * (size_t)c->h * 4)
    return lm_fail(LM_ERR_INVALID, "canvas: %zu bytes cannot hold %dx%d RGBA pixels", cap, c->w, c->h);
  if (SDL_ConvertPixels(c->w, c->h, c->surf->format->format, c->surf->pixels, c->surf->pitch, SDL_PIXELFORMAT_RGBA32,
                        dst, c->w * 4) != 0)
    return lm_fail(LM_ERR_INVALID, "canvas: reading pixels failed: %s", SDL_GetError());
  return LM_OK;
}

static void png_failed(png_structp png, png_const_charp msg) {
  snprintf(png_get_error_ptr(png), 256, "%s", msg);
  png_longjmp(png, 1);
}

/* libpng directly, not IMG_SavePNG: the canvas is opaque, so RGB; zlib level 1 with the Up
 * filter. IMG_SavePNG's defaults (RGBA, level 6, every filter tried per row) took 40 ms for a
 * 1200x800 curve, the longest thing at the end of a short training run. The file appears whole:
 * written beside the path and renamed over it (a window showing curve.png never reads half). */
lm_status lm_canvas_save_png(lm_canvas *c, const char *path) {
  if (!path || !*path) return lm_fail(LM_ERR_INVALID, "canvas: no PNG path given");
  size_t n = strlen(path);
  char *tmp = lm_malloc(n + 32), why[256] = "";
  unsigned char *row = lm_malloc((size_t)c->w * 3);
  if (!tmp || !row) {
    lm_free(tmp), lm_free(row);
    return lm_fail(LM_ERR_NOMEM, "out of memory writing %s", path);
  }
  static _Atomic unsigned serial;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; attempt++) { /* mode 0666 under the umask */
    snprintf(tmp, n + 32, "%s.%ld.%u.tmp", path, (long)getpid(), serial++);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (!f) {
    int err = errno;
    if (fd >= 0) close(fd), unlink(tmp);
    lm_free(tmp), lm_free(row);
    return lm_fail(LM_ERR_IO, "cannot write %s: %s", path, strerror(err));
  }
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, why, png_failed, NULL);
  png_infop info = png ? png_create_info_struct(png) : NULL;
  int ok = info != NULL;
  if (ok && setjmp(png_jmpbuf(png)) == 0) {
    png_init_io(png, f);
    png_set_compression_level(png, 1);
    png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_UP);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_BASE, PNG_FILTER_TYPE_BASE);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) {
      const uint32_t *px = (const uint32_t *)((const uint8_t *)c->surf->pixels + (size_t)y * (size_t)c->surf->pitch);
      for (int x = 0; x < c->w; x++)
        row[3 * x] = (unsigned char)(px[x] >> 16), row[3 * x + 1] = (unsigned char)(px[x] >> 8),
                row[3 * x + 2] = (unsigned char)px[x];
      png_write_row(png, row);
    }
    png_write_end(png, info);
  } else {
    ok = 0;
  }
  png_destroy_write_struct(&png, &info);
  int err = EIO; /* libpng's own failures say why in `why` */
  if (ok && fflush(f) != 0) ok = 0, err = errno;
  if (fclose(f) != 0 && ok) ok = 0, err = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, err = errno;
  if (!ok) unlink(tmp);
  lm_free(tmp), lm_free(row);
  if (!ok)
    return lm_fail(LM_ERR_IO, "cannot write %s: %s", path, why[0] ? why : strerror(err));
  return LM_OK;
}

/* Internal: the surface under the canvas (for the viewer's window blit). */
SDL_Surface *lm_canvas_surface(lm_canvas *c);
SDL_Surface *lm_canvas_surface(lm_canvas *c) { return c->surf; }

#else /* no SDL2 */

struct lm_canvas {
  int unused;
};

lm_canvas *lm_canvas_new(int w, int h) {
  (void)w, (void)h;
  lm_fail(LM_ERR_UNSUPPORTED, "canvas: built without SDL2 (install libsdl2-dev and libsdl2-image-dev, reconfigure)");
  return NULL;
}
void lm_canvas_free(lm_canvas *c) { (void)c; }
void lm_canvas_size(const lm_canvas *c, int *w, int *h) {
  (void)c;
  if (w) *w = 0;
  if (h) *h = 0;
}
void lm_canvas_clip(lm_canvas *c, int x, int y, int w, int h) { (void)c, (void)x, (void)y, (void)w, (void)h; }
void lm_canvas_clear(lm_canvas *c, uint32_t rgba) { (void)c, (void)rgba; }
void lm_canvas_fill_rect(lm_canvas *c, float x0, float y0, float x1, float y1, uint32_t rgba) {
  (void)c, (void)x0, (void)y0, (void)x1, (void)y1, (void)rgba;
}
void lm_canvas_rect(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba) {
  (void)c, (void)x0, (void)y0, (void)x1, (void)y1, (void)width, (void)rgba;
}
void lm_canvas_fill_circle(lm_canvas *c, float cx, float cy, float r, uint32_t rgba) {
  (void)c, (void)cx, (void)cy, (void)r, (void)rgba;
}
void lm_canvas_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba, int round_caps) {
  (void)c, (void)x0, (void)y0, (void)x1, (void)y1, (void)width, (void)rgba, (void)round_caps;
}
void lm_canvas_dashed_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, float dash, float gap,
                           uint32_t rgba) {
  (void)c, (void)x0, (void)y0, (void)x1, (void)y1, (void)width, (void)dash, (void)gap, (void)rgba;
}
int lm_canvas_text_width(const char *text, int scale) {
  if (scale < 1) scale = 1;
  return text ? (int)strlen(text) * LM_FONT_CELL_W * scale : 0;
}
int lm_canvas_text(lm_canvas *c, float x, float y, int scale, uint32_t rgba, const char *text) {
  (void)c, (void)x, (void)y, (void)rgba;
  return lm_canvas_text_width(text, scale);
}
lm_status lm_canvas_blit(lm_canvas *dst, const lm_canvas *src, int x, int y, int w, int h) {
  (void)dst, (void)src, (void)x, (void)y, (void)w, (void)h;
  return lm_fail(LM_ERR_UNSUPPORTED, "canvas: built without SDL2");
}
lm_status lm_canvas_read_rgba(lm_canvas *c, uint8_t *dst, size_t cap) {
  (void)c, (void)dst, (void)cap;
  return lm_fail(LM_ERR_UNSUPPORTED, "canvas: built without SDL2");
}
lm_status lm_canvas_save_png(lm_canvas *c, const char *path) {
  (void)c, (void)path;
  return lm_fail(LM_ERR_UNSUPPORTED, "canvas: built without SDL2");
}

#endif
