/* viz/canvas.c — the canvas every picture of lumen is drawn on: an ARGB surface drawn by SDL's
 * software renderer (so a window, a headless capture and a plot render the same pixels), with
 * lines as quads, circles as triangle fans, a built-in 5x7 bitmap font (SDL2 has no text and
 * SDL2_ttf is not a dependency) and PNG output through SDL2_image. */
#include <math.h>
#include <string.h>

#include "compiler/core.h"
#include "lumen/viz.h"

#ifdef LUMEN_HAVE_SDL
#include <SDL.h>
#include <SDL_image.h>

struct lm_canvas {
  SDL_Surface *surf;
  SDL_Renderer *ren;
  int w, h;
};

/* The classic 5x7 font for ' ' .. '~': five columns per glyph, bit 0 the top row. */
static const unsigned char font5x7[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5F, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00}, /*  !" */
    {0x14, 0x7F, 0x14, 0x7F, 0x14}, {0x24, 0x2A, 0x7F, 0x2A, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62}, /* #$% */
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1C, 0x22, 0x41, 0x00}, /* &'( */
    {0x00, 0x41, 0x22, 0x1C, 0x00}, {0x08, 0x2A, 0x1C, 0x2A, 0x08}, {0x08, 0x08, 0x3E, 0x08, 0x08}, /* )*+ */
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00}, /* ,-. */
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3E, 0x51, 0x49, 0x45, 0x3E}, {0x00, 0x42, 0x7F, 0x40, 0x00}, /* /01 */
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4B, 0x31}, {0x18, 0x14, 0x12, 0x7F, 0x10}, /* 234 */
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3C, 0x4A, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03}, /* 567 */
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1E}, {0x00, 0x36, 0x36, 0x00, 0x00}, /* 89: */
    {0x00, 0x56, 0x36, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14}, /* ;<= */
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
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7E, 0x09, 0x01, 0x02}, {0x0C, 0x52, 0x52, 0x52, 0x3E}, /* efg */
    {0x7F, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7D, 0x40, 0x00}, {0x20, 0x40, 0x44, 0x3D, 0x00}, /* hij */
    {0x7F, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7F, 0x40, 0x00}, {0x7C, 0x04, 0x18, 0x04, 0x78}, /* klm */
    {0x7C, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0x7C, 0x14, 0x14, 0x14, 0x08}, /* nop */
    {0x08, 0x14, 0x14, 0x18, 0x7C}, {0x7C, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20}, /* qrs */
    {0x04, 0x3F, 0x44, 0x40, 0x20}, {0x3C, 0x40, 0x40, 0x20, 0x7C}, {0x1C, 0x20, 0x40, 0x20, 0x1C}, /* tuv */
    {0x3C, 0x40, 0x30, 0x40, 0x3C}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x0C, 0x50, 0x50, 0x50, 0x3C}, /* wxy */
    {0x44, 0x64, 0x54, 0x4C, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7F, 0x00, 0x00}, /* z{| */
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x08, 0x04, 0x08, 0x10, 0x08},                                  /* }~ */
};

static SDL_Color color_of(uint32_t rgba) {
  return (SDL_Color){(Uint8)(rgba >> 24), (Uint8)(rgba >> 16), (Uint8)(rgba >> 8), (Uint8)rgba};
}

static void set_color(lm_canvas *c, uint32_t rgba) {
  SDL_Color k = color_of(rgba);
  SDL_SetRenderDrawColor(c->ren, k.r, k.g, k.b, k.a);
}

lm_canvas *lm_canvas_new(int w, int h) {
  if (w < 1 || h < 1 || w > 16384 || h > 16384) {
    lm_fail(LM_ERR_INVALID, "canvas: size %dx%d is not in 1..16384", w, h);
    return NULL;
  }
  lm_canvas *c = lm_calloc(1, sizeof *c);
  if (!c) return NULL;
  c->w = w, c->h = h;
  c->surf = SDL_CreateRGBSurfaceWithFormat(0, w, h, 32, SDL_PIXELFORMAT_ARGB8888);
  if (c->surf) c->ren = SDL_CreateSoftwareRenderer(c->surf);
  if (!c->ren) {
    lm_fail(LM_ERR_NOMEM, "canvas: cannot create a %dx%d software surface: %s", w, h, SDL_GetError());
    lm_canvas_free(c);
    return NULL;
  }
  SDL_SetRenderDrawBlendMode(c->ren, SDL_BLENDMODE_BLEND);
  lm_canvas_clear(c, 0xffffffffu);
  return c;
}

void lm_canvas_free(lm_canvas *c) {
  if (!c) return;
  if (c->ren) SDL_DestroyRenderer(c->ren);
  if (c->surf) SDL_FreeSurface(c->surf);
  lm_free(c);
}

void lm_canvas_size(const lm_canvas *c, int *w, int *h) {
  if (w) *w = c->w;
  if (h) *h = c->h;
}

void lm_canvas_clip(lm_canvas *c, int x, int y, int w, int h) {
  if (w <= 0 || h <= 0) SDL_RenderSetClipRect(c->ren, NULL);
  else SDL_RenderSetClipRect(c->ren, &(SDL_Rect){x, y, w, h});
}

void lm_canvas_clear(lm_canvas *c, uint32_t rgba) {
  SDL_RenderSetClipRect(c->ren, NULL);
  set_color(c, rgba);
  SDL_SetRenderDrawBlendMode(c->ren, SDL_BLENDMODE_NONE);
  SDL_RenderClear(c->ren);
  SDL_SetRenderDrawBlendMode(c->ren, SDL_BLENDMODE_BLEND);
}

void lm_canvas_fill_rect(lm_canvas *c, float x0, float y0, float x1, float y1, uint32_t rgba) {
  if (x1 < x0) { float t = x0; x0 = x1; x1 = t; }
  if (y1 < y0) { float t = y0; y0 = y1; y1 = t; }
  set_color(c, rgba);
  SDL_RenderFillRectF(c->ren, &(SDL_FRect){x0, y0, fmaxf(x1 - x0, 1.0f), fmaxf(y1 - y0, 1.0f)});
}

void lm_canvas_rect(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba) {
  if (width < 1) width = 1;
  lm_canvas_fill_rect(c, x0, y0, x1, y0 + width, rgba);
  lm_canvas_fill_rect(c, x0, y1 - width, x1, y1, rgba);
  lm_canvas_fill_rect(c, x0, y0 + width, x0 + width, y1 - width, rgba);
  lm_canvas_fill_rect(c, x1 - width, y0 + width, x1, y1 - width, rgba);
}

void lm_canvas_fill_circle(lm_canvas *c, float cx, float cy, float r, uint32_t rgba) {
  enum { MAX_SEG = 96 };
  if (!(r > 0)) return;
  if (r < 1.0f) r = 1.0f;
  int n = (int)(r * 0.8f);
  n = n < 12 ? 12 : n > MAX_SEG ? MAX_SEG : n;
  SDL_Vertex v[MAX_SEG + 1];
  int idx[3 * MAX_SEG];
  SDL_Color k = color_of(rgba);
  v[0] = (SDL_Vertex){{cx, cy}, k, {0, 0}};
  for (int i = 0; i < n; i++) {
    double a = 2 * M_PI * i / n;
    v[i + 1] = (SDL_Vertex){{cx + r * (float)cos(a), cy + r * (float)sin(a)}, k, {0, 0}};
    idx[3 * i] = 0, idx[3 * i + 1] = 1 + i, idx[3 * i + 2] = 1 + (i + 1) % n;
  }
  SDL_RenderGeometry(c->ren, NULL, v, n + 1, idx, 3 * n);
}

void lm_canvas_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba, int round_caps) {
  float dx = x1 - x0, dy = y1 - y0, len = sqrtf(dx * dx + dy * dy);
  if (width < 1.75f || len < 1e-3f) {
    set_color(c, rgba);
    if (width < 1.75f) {
      SDL_RenderDrawLineF(c->ren, x0, y0, x1, y1);
      return;
    }
  } else {
    float nx = -dy / len * width / 2, ny = dx / len * width / 2;
    SDL_Color k = color_of(rgba);
    SDL_Vertex v[4] = {{{x0 + nx, y0 + ny}, k, {0, 0}},
                       {{x0 - nx, y0 - ny}, k, {0, 0}},
                       {{x1 - nx, y1 - ny}, k, {0, 0}},
                       {{x1 + nx, y1 + ny}, k, {0, 0}}};
    int idx[6] = {0, 1, 2, 0, 2, 3};
    SDL_RenderGeometry(c->ren, NULL, v, 4, idx, 6);
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
  enum { BATCH = 512 };
  if (!text) return 0;
  if (scale < 1) scale = 1;
  SDL_FRect px[BATCH];
  int n = 0;
  float s = (float)scale, cx = x;
  set_color(c, rgba);
  for (const unsigned char *p = (const unsigned char *)text; *p; p++, cx += LM_FONT_CELL_W * s) {
    int g = *p >= 32 && *p <= 126 ? *p - 32 : '?' - 32;
    for (int col = 0; col < 5; col++)
      for (int row = 0; row < 7; row++) {
        if (!(font5x7[g][col] >> row & 1)) continue;
        px[n++] = (SDL_FRect){cx + (float)col * s, y + (float)row * s, s, s};
        if (n == BATCH) {
          SDL_RenderFillRectsF(c->ren, px, n);
          n = 0;
        }
      }
  }
  if (n) SDL_RenderFillRectsF(c->ren, px, n);
  return (int)(cx - x);
}

lm_status lm_canvas_blit(lm_canvas *dst, const lm_canvas *src, int x, int y, int w, int h) {
  SDL_RenderFlush(src->ren);
  SDL_RenderFlush(dst->ren);
  SDL_Rect r = {x, y, w, h};
  int rc;
  if (w == src->w && h == src->h) {
    SDL_SetSurfaceBlendMode(src->surf, SDL_BLENDMODE_NONE);
    rc = SDL_BlitSurface(src->surf, NULL, dst->surf, &r);
  } else {
    rc = SDL_SoftStretchLinear(src->surf, NULL, dst->surf, &r);
    if (rc != 0) {
      SDL_SetSurfaceBlendMode(src->surf, SDL_BLENDMODE_NONE);
      rc = SDL_BlitScaled(src->surf, NULL, dst->surf, &r);
    }
  }
  return rc == 0 ? LM_OK : lm_fail(LM_ERR_INVALID, "canvas: blit failed: %s", SDL_GetError());
}

lm_status lm_canvas_read_rgba(lm_canvas *c, uint8_t *dst, size_t cap) {
  if (cap < (size_t)c->w * (size_t)c->h * 4)
    return lm_fail(LM_ERR_INVALID, "canvas: %zu bytes cannot hold %dx%d RGBA pixels", cap, c->w, c->h);
  SDL_RenderFlush(c->ren);
  if (SDL_ConvertPixels(c->w, c->h, c->surf->format->format, c->surf->pixels, c->surf->pitch, SDL_PIXELFORMAT_RGBA32,
                        dst, c->w * 4) != 0)
    return lm_fail(LM_ERR_INVALID, "canvas: reading pixels failed: %s", SDL_GetError());
  return LM_OK;
}

lm_status lm_canvas_save_png(lm_canvas *c, const char *path) {
  if (!path || !*path) return lm_fail(LM_ERR_INVALID, "canvas: no PNG path given");
  SDL_RenderFlush(c->ren);
  if (IMG_SavePNG(c->surf, path) != 0) return lm_fail(LM_ERR_IO, "cannot write %s: %s", path, SDL_GetError());
  return LM_OK;
}

/* Internal: the surface under the canvas (for the viewer's window blit). */
SDL_Surface *lm_canvas_surface(lm_canvas *c);
SDL_Surface *lm_canvas_surface(lm_canvas *c) {
  SDL_RenderFlush(c->ren);
  return c->surf;
}

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
