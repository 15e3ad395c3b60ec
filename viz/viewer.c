/* viz/viewer.c — the rollout viewer: a grid of one env's draw lists, world coordinates scaled
 * to each cell keeping their aspect, a caption per cell (episode return and step count), a
 * status line, a highlighted cell (n) that can be shown alone (z); drawn on a canvas that is
 * either copied into a resizable SDL window or kept headless. Also frame capture (a labelled
 * grid of frames in one PNG, or numbered PNGs). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/core.h"
#include "lumen/viz.h"

#ifdef LUMEN_HAVE_SDL
#include <SDL.h>

SDL_Surface *lm_canvas_surface(lm_canvas *c); /* viz/canvas.c */

/* Colours of the frame around the envs. */
enum {
  COL_BACK = 0x2b2d31ff,     /* between cells */
  COL_CELL = 0xfafafaff,     /* a cell's world */
  COL_CAPTION = 0xe4e6ebff,  /* a cell's caption band */
  COL_TEXT = 0x1d1f23ff,
  COL_DIM = 0x5f6670ff,
  COL_HIGHLIGHT = 0xf28c28ff,
  COL_STATUS = 0x1d1f23ff,
  COL_STATUS_TEXT = 0xe8eaedff,
};

struct lm_viewer {
  const lm_env_spec *env;
  int cells, headless, open, video;
  SDL_Window *win;
  lm_canvas *canvas;
  int highlight, zoomed;
  /* the last frame's inputs, to redraw after a resize */
  float *states;
  lm_view_cell *info;
  int have_info, drawn;
  char status[512];
  /* lm_viewer_show_rollout */
  Uint64 last_show;
  float *snap;
  size_t snap_cap;
  /* one env's draw list, grown to what the env asks for */
  lm_draw_cmd *cmds;
  int cmd_cap;
};

static int have_display(void) {
#if defined(__APPLE__) || defined(_WIN32)
  return 1;
#else
  const char *keys[3] = {"DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER"};
  for (int i = 0; i < 3; i++) {
    const char *v = getenv(keys[i]);
    if (v && *v) return 1;
  }
  return 0;
#endif
}

static void default_size(const lm_env_spec *env, int cells, int *w, int *h) {
  int cols = (int)ceil(sqrt((double)cells)), rows = (cells + cols - 1) / cols;
  float ww = env->world[2] - env->world[0], wh = env->world[3] - env->world[1];
  float aspect = ww > 0 && wh > 0 ? ww / wh : 1.0f;
  int cw = 400;
  int ch = (int)((float)cw / aspect) + 24;
  int W = cols * cw, H = rows * ch + 25;
  float shrink = fminf(1.0f, fminf(1400.0f / (float)W, 1000.0f / (float)H));
  *w = (int)((float)W * shrink), *h = (int)((float)H * shrink);
}

lm_viewer *lm_viewer_new(const lm_env_spec *env, int cells, int w, int h, int headless) {
  if (!env || !env->draw) {
    lm_fail(LM_ERR_INVALID, "viewer: no env, or the env has no draw list");
    return NULL;
  }
  if (cells < 1 || cells > LM_VIEW_MAX_CELLS) {
    lm_fail(LM_ERR_INVALID, "viewer: %d envs; the viewer shows 1 to %d", cells, LM_VIEW_MAX_CELLS);
    return NULL;
  }
  if (w <= 0 || h <= 0) default_size(env, cells, &w, &h);
  if (w < 64 || h < 64) {
    lm_fail(LM_ERR_INVALID, "viewer: %dx%d pixels is too small (64x64 at least)", w, h);
    return NULL;
  }
  if (!headless && !have_display()) {
    lm_fail(LM_ERR_UNSUPPORTED, "no display: set DISPLAY or use --headless");
    return NULL;
  }
  lm_viewer *v = lm_calloc(1, sizeof *v);
  if (!v) return NULL;
  v->env = env;
  v->cells = cells;
  v->headless = headless;
  v->open = 1;
  v->states = lm_calloc((size_t)cells * (size_t)env->state_size, sizeof *v->states);
  v->info = lm_calloc((size_t)cells, sizeof *v->info);
  if (!v->states || !v->info) goto fail;
  if (!headless) {
    if (SDL_InitSubSystem(SDL_INIT_VIDEO) != 0) {
      lm_fail(LM_ERR_UNSUPPORTED, "no display: set DISPLAY or use --headless (SDL: %s)", SDL_GetError());
      goto fail;
    }
    v->video = 1;
    /* frames are drawn in software: copy them to the window through X11's own framebuffer
     * (XShm) rather than through an OpenGL texture, which would recreate the window */
    if (!SDL_GetHint(SDL_HINT_FRAMEBUFFER_ACCELERATION)) SDL_SetHint(SDL_HINT_FRAMEBUFFER_ACCELERATION, "0");
    char title[128];
    snprintf(title, sizeof title, "lumen: %s  (space pause, left/right speed, n next, z zoom, r reset, q quit)",
             env->gym_id ? env->gym_id : env->name);
    v->win = SDL_CreateWindow(title, SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED, w, h, SDL_WINDOW_RESIZABLE);
    if (!v->win) {
      lm_fail(LM_ERR_UNSUPPORTED, "no display: cannot open a window (%s); set DISPLAY or use --headless",
              SDL_GetError());
      goto fail;
    }
    SDL_SetWindowMinimumSize(v->win, 64, 64);
    SDL_GetWindowSize(v->win, &w, &h);
    if (!SDL_GetWindowSurface(v->win)) {
      lm_fail(LM_ERR_UNSUPPORTED, "no display: the window has no surface (%s); set DISPLAY or use --headless",
              SDL_GetError());
      goto fail;
    }
  }
  if (!(v->canvas = lm_canvas_new(w, h))) goto fail;
  lm_canvas_clear(v->canvas, COL_BACK);
  return v;
fail: {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", lm_last_error());
  lm_status st = strstr(msg, "no display") ? LM_ERR_UNSUPPORTED : LM_ERR_NOMEM;
  lm_viewer_free(v);
  lm_fail(st, "%s", msg);
  return NULL;
}
}

void lm_viewer_free(lm_viewer *v) {
  if (!v) return;
  lm_canvas_free(v->canvas);
  if (v->win) SDL_DestroyWindow(v->win);
  if (v->video) {
    SDL_QuitSubSystem(SDL_INIT_VIDEO);
    if (!SDL_WasInit(SDL_INIT_EVERYTHING)) SDL_Quit(); /* nothing else uses SDL: release all of it */
  }
  lm_free(v->states);
  lm_free(v->info);
  lm_free(v->snap);
  lm_free(v->cmds);
  lm_free(v);
}

int lm_viewer_cells(const lm_viewer *v) { return v->cells; }
int lm_viewer_highlight(const lm_viewer *v) { return v->highlight; }
lm_canvas *lm_viewer_canvas(lm_viewer *v) { return v->canvas; }
int lm_viewer_is_open(const lm_viewer *v) { return v && v->open; }

void lm_viewer_set_highlight(lm_viewer *v, int cell, int zoomed) {
  v->highlight = ((cell % v->cells) + v->cells) % v->cells;
  v->zoomed = zoomed != 0;
}

/* ---------------------------------------------------------------- drawing */

/* Grid columns that give each cell the largest world scale. */
static int grid_cols(const lm_env_spec *env, int n, float W, float H, float caption) {
  float ww = env->world[2] - env->world[0], wh = env->world[3] - env->world[1];
  int best = 1;
  float best_s = -1;
  for (int cols = 1; cols <= n; cols++) {
    int rows = (n + cols - 1) / cols;
    float s = fminf(W / (float)cols / ww, (H / (float)rows - caption) / wh);
    if (s > best_s * 1.001f) best_s = s, best = cols;
  }
  return best;
}

/* One env's draw list for state in v->cmds: draw() returns how many commands the state needs
 * (it writes at most the capacity given), so a list that did not fit is drawn again into a
 * buffer of that size. Returns how many there are (0 when memory runs out). */
static int draw_list(lm_viewer *v, const float *state) {
  if (!v->cmds) {
    v->cmds = lm_malloc(LM_ENV_MAX_DRAW * sizeof *v->cmds);
    v->cmd_cap = v->cmds ? LM_ENV_MAX_DRAW : 0;
  }
  int n = v->cmd_cap ? v->env->draw(state, v->cmds, v->cmd_cap) : 0;
  if (n > v->cmd_cap && n <= (1 << 20)) {
    lm_draw_cmd *more = lm_malloc((size_t)n * sizeof *more);
    if (!more) return 0;
    lm_free(v->cmds);
    v->cmds = more, v->cmd_cap = n;
    n = v->env->draw(state, v->cmds, v->cmd_cap);
  }
  return n < 0 ? 0 : n < v->cmd_cap ? n : v->cmd_cap;
}

/* One env's draw list inside the rectangle (x, y, w, h). */
static void draw_world(lm_viewer *v, lm_canvas *c, const float *state, float x, float y, float w, float h) {
  const lm_env_spec *env = v->env;
  float xmin = env->world[0], ymin = env->world[1], xmax = env->world[2], ymax = env->world[3];
  float s = fminf(w / (xmax - xmin), h / (ymax - ymin));
  float ox = x + (w - (xmax - xmin) * s) / 2, oy = y + (h - (ymax - ymin) * s) / 2;
  float thin = fmaxf(1.0f, fminf(w, h) / 260.0f);
  int n = draw_list(v, state);
  const lm_draw_cmd *cmds = v->cmds;
#define PX(wx) (ox + ((wx)-xmin) * s)
#define PY(wy) (oy + (ymax - (wy)) * s)
  for (int i = 0; i < n; i++) {
    const lm_draw_cmd *d = &cmds[i];
    switch (d->kind) {
    case LM_DRAW_LINE: {
      float wpx = fmaxf(d->width * s, thin);
      lm_canvas_line(c, PX(d->x0), PY(d->y0), PX(d->x1), PY(d->y1), wpx, d->rgba, wpx >= 3.0f);
      break;
    }
    case LM_DRAW_RECT:
      lm_canvas_fill_rect(c, PX(d->x0), PY(d->y1), PX(d->x1), PY(d->y0), d->rgba);
      break;
    case LM_DRAW_CIRCLE:
      lm_canvas_fill_circle(c, PX(d->x0), PY(d->y0), fmaxf(d->x1 * s, 1.5f), d->rgba);
      break;
    }
  }
#undef PX
#undef PY
}

static void fmt_num(char *buf, size_t cap, float x) {
  if (!isfinite(x)) snprintf(buf, cap, "%s", isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
  else if (fabsf(x) >= 1e5f) snprintf(buf, cap, "%.3g", (double)x);
  else if (fabsf(x) >= 100 || x == floorf(x)) snprintf(buf, cap, "%.0f", (double)x);
  else if (fabsf(x) >= 10) snprintf(buf, cap, "%.1f", (double)x);
  else snprintf(buf, cap, "%.2f", (double)x);
}

/* The longest caption that fits in w pixels. */
static void caption_text(char *buf, size_t cap, int i, const lm_view_cell *info, int scale, float w) {
  char r[32], l[32];
  fmt_num(r, sizeof r, info->ret);
  fmt_num(l, sizeof l, info->last_ret);
  for (int form = info->episodes ? 0 : 3; form < 5; form++) {
    if (form == 0) snprintf(buf, cap, "#%d  return %s  step %d  last %s (%d done)", i + 1, r, info->step, l, info->episodes);
    else if (form == 1) snprintf(buf, cap, "#%d  return %s  step %d  last %s", i + 1, r, info->step, l);
    else if (form == 2) snprintf(buf, cap, "#%d ret %s step %d last %s", i + 1, r, info->step, l);
    else if (form == 3) snprintf(buf, cap, "#%d  return %s  step %d", i + 1, r, info->step);
    else snprintf(buf, cap, "%s t%d", r, info->step);
    if ((float)lm_canvas_text_width(buf, scale) <= w - 8) return;
  }
}

static void render(lm_viewer *v) {
  lm_canvas *c = v->canvas;
  int W, H;
  lm_canvas_size(c, &W, &H);
  int ss = W >= 760 && H >= 400 ? 2 : 1; /* text scale of the status line */
  float status_h = v->status[0] ? (float)(LM_FONT_CELL_H * ss) + 7 : 0;
  float gap = v->cells > 1 && !v->zoomed ? 4.0f : 0.0f;
  lm_canvas_clear(c, COL_BACK);
  int n = v->zoomed ? 1 : v->cells;
  float GW = (float)W - gap, GH = (float)H - status_h - gap;
  int cols = grid_cols(v->env, n, GW, GH, 20), rows = (n + cols - 1) / cols;
  float cw = GW / (float)cols, ch = GH / (float)rows;
  int ts = cw >= 380 && ch >= 200 ? 2 : 1; /* text scale of the captions */
  float caption_h = v->have_info ? (float)(LM_FONT_CELL_H * ts) + 5 : 0;
  for (int k = 0; k < n; k++) {
    int i = v->zoomed ? v->highlight : k;
    float x = gap + (float)(k % cols) * cw, y = gap + (float)(k / cols) * ch;
    float w = cw - gap, h = ch - gap;
    if (w < 4 || h < 4) continue;
    lm_canvas_clip(c, (int)x, (int)y, (int)ceilf(w), (int)ceilf(h));
    lm_canvas_fill_rect(c, x, y, x + w, y + h, COL_CELL);
    if (v->have_info) {
      char cap[160];
      lm_canvas_fill_rect(c, x, y, x + w, y + caption_h, COL_CAPTION);
      caption_text(cap, sizeof cap, i, &v->info[i], ts, w);
      lm_canvas_text(c, x + 4, y + 3, ts, COL_TEXT, cap);
    }
    float pad = 3.0f;
    lm_canvas_clip(c, (int)x, (int)(y + caption_h), (int)ceilf(w), (int)ceilf(h - caption_h));
    draw_world(v, c, v->states + (size_t)i * (size_t)v->env->state_size, x + pad, y + caption_h + pad,
               w - 2 * pad, h - caption_h - 2 * pad);
    lm_canvas_clip(c, 0, 0, 0, 0);
    if (v->cells > 1 && i == v->highlight && !v->headless)
      lm_canvas_rect(c, x, y, x + w, y + h, (float)ts + 1, COL_HIGHLIGHT);
  }
  if (status_h > 0) {
    lm_canvas_fill_rect(c, 0, (float)H - status_h, (float)W, (float)H, COL_STATUS);
    lm_canvas_text(c, 6, (float)H - status_h + 4, ss, COL_STATUS_TEXT, v->status);
  }
}

static lm_status present(lm_viewer *v) {
  if (v->headless || !v->win || !v->open) return LM_OK;
  SDL_Surface *ws = SDL_GetWindowSurface(v->win);
  if (!ws) return lm_fail(LM_ERR_BACKEND, "viewer: the window has no surface: %s", SDL_GetError());
  SDL_Surface *src = lm_canvas_surface(v->canvas);
  SDL_SetSurfaceBlendMode(src, SDL_BLENDMODE_NONE);
  if (SDL_BlitSurface(src, NULL, ws, NULL) != 0 || SDL_UpdateWindowSurface(v->win) != 0)
    return lm_fail(LM_ERR_BACKEND, "viewer: presenting the frame failed: %s", SDL_GetError());
  return LM_OK;
}

lm_status lm_viewer_draw(lm_viewer *v, const float *states, const lm_view_cell *cells, const char *status) {
  if (!v || !states) return lm_fail(LM_ERR_INVALID, "viewer: no viewer or no states to draw");
  memcpy(v->states, states, (size_t)v->cells * (size_t)v->env->state_size * sizeof *states);
  v->have_info = cells != NULL;
  if (cells) memcpy(v->info, cells, (size_t)v->cells * sizeof *cells);
  snprintf(v->status, sizeof v->status, "%s", status ? status : "");
  v->drawn = 1;
  render(v);
  return present(v);
}

lm_status lm_viewer_save_png(lm_viewer *v, const char *path) { return lm_canvas_save_png(v->canvas, path); }

/* ---------------------------------------------------------------- events */

static void follow_window_size(lm_viewer *v) {
  int w, h, cw, ch;
  SDL_GetWindowSize(v->win, &w, &h);
  lm_canvas_size(v->canvas, &cw, &ch);
  if (w < 1 || h < 1 || (w == cw && h == ch)) return;
  lm_canvas *c = lm_canvas_new(w, h);
  if (!c) return; /* keep drawing at the old size */
  lm_canvas_free(v->canvas);
  v->canvas = c;
  if (v->drawn) render(v);
  else lm_canvas_clear(c, COL_BACK);
  present(v);
}

int lm_viewer_poll(lm_viewer *v, lm_view_event *ev) {
  ev->kind = LM_VIEW_EVENT_NONE;
  if (!v || v->headless || !v->video) return 0;
  SDL_Event e;
  while (SDL_PollEvent(&e)) {
    switch (e.type) {
    case SDL_QUIT:
      ev->kind = LM_VIEW_EVENT_QUIT;
      return 1;
    case SDL_WINDOWEVENT:
      if (e.window.event == SDL_WINDOWEVENT_CLOSE) {
        ev->kind = LM_VIEW_EVENT_QUIT;
        return 1;
      }
      if (e.window.event == SDL_WINDOWEVENT_SIZE_CHANGED || e.window.event == SDL_WINDOWEVENT_RESIZED) {
        follow_window_size(v);
        ev->kind = LM_VIEW_EVENT_RESIZE;
        return 1;
      }
      if (e.window.event == SDL_WINDOWEVENT_EXPOSED) present(v);
      break;
    case SDL_KEYDOWN:
      switch (e.key.keysym.sym) {
      case SDLK_q:
      case SDLK_ESCAPE: ev->kind = LM_VIEW_EVENT_QUIT; return 1;
      case SDLK_SPACE: ev->kind = LM_VIEW_EVENT_PAUSE; return 1;
      case SDLK_LEFT: ev->kind = LM_VIEW_EVENT_SLOWER; return 1;
      case SDLK_RIGHT: ev->kind = LM_VIEW_EVENT_FASTER; return 1;
      case SDLK_r: ev->kind = LM_VIEW_EVENT_RESET; return 1;
      case SDLK_n:
        v->highlight = (v->highlight + 1) % v->cells;
        if (v->drawn) render(v), present(v);
        ev->kind = LM_VIEW_EVENT_NEXT;
        return 1;
      case SDLK_z:
      case SDLK_RETURN:
        v->zoomed = !v->zoomed;
        if (v->drawn) render(v), present(v);
        ev->kind = LM_VIEW_EVENT_ZOOM;
        return 1;
      default: break;
      }
      break;
    default: break;
    }
  }
  return 0;
}

/* ---------------------------------------------------------------- training snapshots */

lm_status lm_viewer_show_rollout(lm_viewer *v, lm_rollout *r, const char *status) {
  if (!v || !r) return lm_fail(LM_ERR_INVALID, "viewer: no viewer or no rollout");
  if (!v->open) return LM_OK;
  lm_view_event ev;
  while (lm_viewer_poll(v, &ev))
    if (ev.kind == LM_VIEW_EVENT_QUIT) {
      v->open = 0;
      if (v->win) SDL_HideWindow(v->win);
      return LM_OK;
    }
  /* a frame costs a few milliseconds of one core: at most 10 a second keeps training within a
   * few percent of its speed */
  float fps = v->env->fps > 0 ? fminf(v->env->fps, 10.0f) : 10.0f;
  Uint64 now = SDL_GetPerformanceCounter(), freq = SDL_GetPerformanceFrequency();
  if (v->last_show && (double)(now - v->last_show) < (double)freq / fps) return LM_OK;
  v->last_show = now;
  const char *names[16];
  size_t counts[16], n = 0;
  int k = lm_rollout_state_list(r, names, counts, 16);
  for (int i = 0; i < k; i++)
    if (!strcmp(names[i], "env.state")) n = counts[i] / (size_t)v->env->state_size;
  if (!n) return lm_fail(LM_ERR_INVALID, "viewer: the rollout has no env.state");
  size_t S = (size_t)v->env->state_size, need = n * (S + 2);
  if (need > v->snap_cap) {
    float *p = lm_realloc(v->snap, need * sizeof *p);
    if (!p) return LM_ERR_NOMEM;
    v->snap = p, v->snap_cap = need;
  }
  float *state = v->snap, *ret = state + n * S, *len = ret + n;
  lm_status st = lm_rollout_state_read(r, "env.state", state, n * S);
  if (st == LM_OK) st = lm_rollout_state_read(r, "ep.ret", ret, n);
  if (st == LM_OK) st = lm_rollout_state_read(r, "ep.len", len, n);
  if (st != LM_OK) return st;
  size_t shown = n < (size_t)v->cells ? n : (size_t)v->cells;
  for (size_t i = 0; i < (size_t)v->cells; i++) {
    size_t j = i < shown ? i : shown - 1; /* fewer envs than cells: repeat the last */
    memcpy(v->states + i * S, state + j * S, S * sizeof *state);
    v->info[i] = (lm_view_cell){.ret = ret[j], .step = (int)len[j]};
  }
  v->have_info = 1;
  snprintf(v->status, sizeof v->status, "%s", status ? status : "");
  v->drawn = 1;
  render(v);
  return present(v);
}

/* ---------------------------------------------------------------- capture */

struct lm_capture {
  char *out;
  int dir, frames, fw, fh, cols, rows, added, files, label_h, scale;
  lm_canvas *sheet;
};

static int is_dir(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

lm_capture *lm_capture_new(const char *out, int frames, int frame_w, int frame_h) {
  if (!out || !*out) {
    lm_fail(LM_ERR_INVALID, "capture: no output given (FILE.png or DIR/)");
    return NULL;
  }
  if (frames < 1 || frame_w < 16 || frame_h < 16) {
    lm_fail(LM_ERR_INVALID, "capture: %d frames of %dx%d pixels (need at least 1 of 16x16)", frames, frame_w, frame_h);
    return NULL;
  }
  lm_capture *c = lm_calloc(1, sizeof *c);
  if (!c) return NULL;
  c->frames = frames, c->fw = frame_w, c->fh = frame_h;
  size_t len = strlen(out);
  c->dir = out[len - 1] == '/' || is_dir(out);
  if (!(c->out = lm_strdup(out))) goto fail;
  if (c->dir) {
    while (len > 1 && c->out[len - 1] == '/') c->out[--len] = 0;
    if (mkdir(c->out, 0777) != 0 && errno != EEXIST) {
      lm_fail(LM_ERR_IO, "capture: cannot create directory %s: %s", c->out, strerror(errno));
      goto fail;
    }
    if (!is_dir(c->out)) {
      lm_fail(LM_ERR_IO, "capture: %s exists and is not a directory", c->out);
      goto fail;
    }
    return c;
  }
  const char *dot = strrchr(out, '.');
  if (!dot || strcmp(dot, ".png")) {
    lm_fail(LM_ERR_INVALID, "capture: '%s' is neither FILE.png nor a directory (end it with '/')", out);
    goto fail;
  }
  c->cols = frames < 4 ? frames : 4;
  c->rows = (frames + c->cols - 1) / c->cols;
  c->scale = frame_w >= 480 ? 2 : 1;
  c->label_h = LM_FONT_CELL_H * c->scale + 8;
  int W = c->cols * (frame_w + 6) + 6, H = c->rows * (frame_h + c->label_h + 6) + 6;
  if (!(c->sheet = lm_canvas_new(W, H))) goto fail;
  lm_canvas_clear(c->sheet, COL_BACK);
  return c;
fail:
  lm_capture_free(c);
  return NULL;
}

void lm_capture_free(lm_capture *c) {
  if (!c) return;
  lm_canvas_free(c->sheet);
  lm_free(c->out);
  lm_free(c);
}

int lm_capture_files(const lm_capture *c) { return c ? c->files : 0; }

lm_status lm_capture_add(lm_capture *c, lm_canvas *frame, const char *label) {
  if (c->added >= c->frames) return lm_fail(LM_ERR_INVALID, "capture: already holds its %d frames", c->frames);
  if (c->dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/frame_%04d.png", c->out, c->added);
    lm_status st = lm_canvas_save_png(frame, path);
    if (st != LM_OK) return st;
    c->files++;
    c->added++;
    return LM_OK;
  }
  int col = c->added % c->cols, row = c->added / c->cols;
  int x = 6 + col * (c->fw + 6), y = 6 + row * (c->fh + c->label_h + 6);
  if (label) lm_canvas_text(c->sheet, (float)x + 2, (float)y + 4, c->scale, COL_STATUS_TEXT, label);
  lm_status st = lm_canvas_blit(c->sheet, frame, x, y + c->label_h, c->fw, c->fh);
  if (st == LM_OK) c->added++;
  return st;
}

lm_status lm_capture_finish(lm_capture *c) {
  if (c->dir) return LM_OK;
  if (!c->added) return lm_fail(LM_ERR_INVALID, "capture: no frames to write to %s", c->out);
  lm_status st = lm_canvas_save_png(c->sheet, c->out);
  if (st == LM_OK) c->files++;
  return st;
}

#else /* no SDL2 */

struct lm_viewer {
  int unused;
};
struct lm_capture {
  int unused;
};

#define NO_SDL "built without SDL2: the viewer needs libsdl2-dev and libsdl2-image-dev (then reconfigure)"

lm_viewer *lm_viewer_new(const lm_env_spec *env, int cells, int w, int h, int headless) {
  (void)env, (void)cells, (void)w, (void)h, (void)headless;
  lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
  return NULL;
}
void lm_viewer_free(lm_viewer *v) { (void)v; }
int lm_viewer_cells(const lm_viewer *v) { (void)v; return 0; }
int lm_viewer_highlight(const lm_viewer *v) { (void)v; return 0; }
void lm_viewer_set_highlight(lm_viewer *v, int cell, int zoomed) { (void)v, (void)cell, (void)zoomed; }
lm_canvas *lm_viewer_canvas(lm_viewer *v) { (void)v; return NULL; }
int lm_viewer_is_open(const lm_viewer *v) { (void)v; return 0; }
lm_status lm_viewer_draw(lm_viewer *v, const float *states, const lm_view_cell *cells, const char *status) {
  (void)v, (void)states, (void)cells, (void)status;
  return lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
}
int lm_viewer_poll(lm_viewer *v, lm_view_event *ev) {
  (void)v;
  if (ev) ev->kind = LM_VIEW_EVENT_NONE;
  return 0;
}
lm_status lm_viewer_save_png(lm_viewer *v, const char *path) {
  (void)v, (void)path;
  return lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
}
lm_status lm_viewer_show_rollout(lm_viewer *v, lm_rollout *r, const char *status) {
  (void)v, (void)r, (void)status;
  return lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
}
lm_capture *lm_capture_new(const char *out, int frames, int frame_w, int frame_h) {
  (void)out, (void)frames, (void)frame_w, (void)frame_h;
  lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
  return NULL;
}
void lm_capture_free(lm_capture *c) { (void)c; }
int lm_capture_files(const lm_capture *c) { (void)c; return 0; }
lm_status lm_capture_add(lm_capture *c, lm_canvas *frame, const char *label) {
  (void)c, (void)frame, (void)label;
  return lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
}
lm_status lm_capture_finish(lm_capture *c) {
  (void)c;
  return lm_fail(LM_ERR_UNSUPPORTED, NO_SDL);
}

#endif
