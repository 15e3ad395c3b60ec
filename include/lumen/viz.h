/* lumen/viz.h — seeing it: a software-rendered canvas (lines with width, rects, circles, a
 * built-in 5x7 bitmap font, PNG through SDL2_image), the rollout viewer (a grid of envs drawn
 * from their draw lists, each with its episode return and step count, under a status line; in
 * a window or headless), frame capture (a grid of frames in one PNG, or numbered PNGs), the
 * `rltrain view` session (rollouts stepped on the device, random or checkpoint policy) and the
 * learning-curve plot of a training log. Built without SDL2, every function fails with
 * LM_ERR_UNSUPPORTED ("built without SDL2"). See docs/VIEWER.md. */
#ifndef LUMEN_VIZ_H
#define LUMEN_VIZ_H

#include "lumen/base.h"
#include "lumen/env.h"
#include "lumen/rollout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- canvas */
/* An RGBA image drawn by SDL's software renderer: coordinates in pixels, (0, 0) top left,
 * colours 0xRRGGBBAA (alpha blends). */
typedef struct lm_canvas lm_canvas;

lm_canvas *lm_canvas_new(int w, int h);
void lm_canvas_free(lm_canvas *c);
void lm_canvas_size(const lm_canvas *c, int *w, int *h);
void lm_canvas_clear(lm_canvas *c, uint32_t rgba);
/* A line `width` pixels wide (a quad; at least one pixel), with round ends when round_caps. */
void lm_canvas_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba, int round_caps);
/* A line of dashes `dash` pixels long with gaps of `gap`. */
void lm_canvas_dashed_line(lm_canvas *c, float x0, float y0, float x1, float y1, float width, float dash, float gap,
                           uint32_t rgba);
void lm_canvas_fill_rect(lm_canvas *c, float x0, float y0, float x1, float y1, uint32_t rgba);
/* An outline `width` pixels wide, inside the rectangle. */
void lm_canvas_rect(lm_canvas *c, float x0, float y0, float x1, float y1, float width, uint32_t rgba);
void lm_canvas_fill_circle(lm_canvas *c, float cx, float cy, float r, uint32_t rgba);
/* Restricts drawing to a rectangle (w or h <= 0: the whole canvas). */
void lm_canvas_clip(lm_canvas *c, int x, int y, int w, int h);

/* Text in the built-in 5x7 font (descenders reach an eighth row), each glyph cell 6 x 9 pixels
 * times `scale` (an integer >= 1);
 * (x, y) is the top left of the first cell. Printable ASCII; other bytes draw as '?'.
 * Returns the width drawn. */
#define LM_FONT_CELL_W 6
#define LM_FONT_CELL_H 9
int lm_canvas_text(lm_canvas *c, float x, float y, int scale, uint32_t rgba, const char *text);
int lm_canvas_text_width(const char *text, int scale);

/* Copies src scaled into the rectangle (x, y, w, h) of dst. */
lm_status lm_canvas_blit(lm_canvas *dst, const lm_canvas *src, int x, int y, int w, int h);
/* The pixels as RGBA bytes, row-major, top row first (cap >= 4*w*h). */
lm_status lm_canvas_read_rgba(lm_canvas *c, uint8_t *dst, size_t cap);
lm_status lm_canvas_save_png(lm_canvas *c, const char *path);

/* ---------------------------------------------------------------- viewer */
/* One env of the grid: its running episode and what it has finished. */
typedef struct lm_view_cell {
  float ret;       /* return of the running episode so far */
  int step;        /* steps taken in the running episode */
  int episodes;    /* episodes finished in this cell (0: last_ret is not shown) */
  float last_ret;  /* return of the last finished episode */
} lm_view_cell;

typedef enum lm_view_event_kind {
  LM_VIEW_EVENT_NONE,
  LM_VIEW_EVENT_QUIT,   /* q, Esc or the window closed */
  LM_VIEW_EVENT_PAUSE,  /* space */
  LM_VIEW_EVENT_SLOWER, /* left arrow */
  LM_VIEW_EVENT_FASTER, /* right arrow */
  LM_VIEW_EVENT_NEXT,   /* n: the viewer has moved its highlight to the next cell */
  LM_VIEW_EVENT_ZOOM,   /* z or Enter: the viewer has toggled showing the highlighted cell alone */
  LM_VIEW_EVENT_RESET,  /* r */
  LM_VIEW_EVENT_RESIZE, /* the window changed size (the viewer has followed it) */
} lm_view_event_kind;

typedef struct lm_view_event {
  lm_view_event_kind kind;
} lm_view_event;

typedef struct lm_viewer lm_viewer;

/* A viewer of `cells` envs of one kind (1..LM_VIEW_MAX_CELLS) in a grid, w x h pixels (0:
 * a size that suits the grid). headless: draws into an image only, needs no display. Otherwise
 * opens a resizable window; with no display (DISPLAY, WAYLAND_DISPLAY and SDL_VIDEODRIVER all
 * unset, or SDL failing to open one) it returns NULL with LM_ERR_UNSUPPORTED and "no display:
 * set DISPLAY or use --headless". */
#define LM_VIEW_MAX_CELLS 64
lm_viewer *lm_viewer_new(const lm_env_spec *env, int cells, int w, int h, int headless);
void lm_viewer_free(lm_viewer *v);
int lm_viewer_cells(const lm_viewer *v);
/* Draws a frame: cell i shows env state states[i * state_size ...] with its caption from
 * cells[i] (NULL: no captions), and the status line at the bottom (NULL: none). In a window
 * the frame appears at once. */
lm_status lm_viewer_draw(lm_viewer *v, const float *states, const lm_view_cell *cells, const char *status);
/* The next pending input event (returns 0 when there is none; headless: always 0). n, z, Enter
 * and window resizes are handled by the viewer itself and still reported. */
int lm_viewer_poll(lm_viewer *v, lm_view_event *ev);
/* Highlighted cell (n cycles it) and whether it is shown alone (z). */
int lm_viewer_highlight(const lm_viewer *v);
void lm_viewer_set_highlight(lm_viewer *v, int cell, int zoomed);
/* The canvas holding the last frame (its size follows the window). */
lm_canvas *lm_viewer_canvas(lm_viewer *v);
lm_status lm_viewer_save_png(lm_viewer *v, const char *path);

/* For `rltrain ENV --view`: call once per training iteration. Rate-limited to the env's fps
 * and at most 10 frames a second (a frame costs a few milliseconds of one core): between
 * frames it only handles pending window events and returns, without touching the device. Otherwise it reads env.state, ep.ret and ep.len of the first cells envs of the
 * rollout (a few hundred floats), handles pending events and draws. After q, Esc or a closed
 * window it hides the window and does nothing more: lm_viewer_is_open says so. */
lm_status lm_viewer_show_rollout(lm_viewer *v, lm_rollout *r, const char *status);
int lm_viewer_is_open(const lm_viewer *v);

/* ---------------------------------------------------------------- capture */
/* out ends in '/' or names an existing directory: every frame goes to out/frame_NNNN.png
 * (the directory is created). Otherwise out is one PNG: a grid of the frames, each scaled to
 * frame_w x frame_h and labelled, written by lm_capture_finish. */
typedef struct lm_capture lm_capture;
lm_capture *lm_capture_new(const char *out, int frames, int frame_w, int frame_h);
void lm_capture_free(lm_capture *c);
lm_status lm_capture_add(lm_capture *c, lm_canvas *frame, const char *label);
lm_status lm_capture_finish(lm_capture *c);
/* PNG files written so far. */
int lm_capture_files(const lm_capture *c);

/* ---------------------------------------------------------------- the view session */
typedef struct lm_view_config {
  const char *source;  /* a checkpoint file, a run directory holding latest.ckpt, or an env name */
  const char *device;  /* backend name or "auto" (NULL: auto) */
  int envs;            /* envs shown, 1..LM_VIEW_MAX_CELLS (0: 4) */
  uint64_t seed;       /* resets and action sampling */
  int headless;        /* capture `frames` frames to `out` instead of opening a window */
  int frames;          /* headless: frames captured (0: 8) */
  int every;           /* headless: env steps between captured frames (0: 4) */
  const char *out;     /* headless: FILE.png (a grid of frames) or DIR/ (numbered PNGs) */
  int width, height;   /* window, or one captured frame, in pixels (0: suits the grid) */
  /* live: called after every frame shown, with its index; nonzero stops the session */
  int (*on_frame)(void *ctx, int frame);
  void *ctx;
} lm_view_config;

typedef struct lm_view_result {
  char env[64];
  char device[512];  /* the backend and why it was picked */
  char policy[512];  /* "random (...)" or the checkpoint with its iteration and env steps */
  int frames;        /* frames shown or captured */
  int files;         /* PNG files written */
} lm_view_result;

/* Runs `rltrain view`: N = envs rollouts stepped on the device by the compiled rollout scan
 * (T = 1 per env step), with the checkpoint's weights or zero weights (uniform over discrete
 * actions, N(0, 1) before clipping for boxes). Live: at the env's fps until q, Esc or a
 * closed window (space pause, left/right slower/faster, n next cell, z zoom, r reset).
 * Headless: captures frames to cfg->out. */
lm_status lm_view_run(const lm_view_config *cfg, lm_view_result *res);

/* ---------------------------------------------------------------- learning curve */
/* The plot's size, and the colour of the solved-return threshold (a dashed line). */
#define LM_PLOT_WIDTH 1200
#define LM_PLOT_HEIGHT 800
#define LM_PLOT_THRESHOLD_RGBA 0x2ca02cffu

/* Reads a training log (a header row, columns found by name: env_steps, mean_return, loss and
 * entropy are used; episodes, when present, skips iterations that finished no episode) and
 * draws mean return vs env steps (raw and smoothed, the solved_return threshold dashed unless
 * it is NaN) above a loss panel and an entropy panel, with ticks and labels. */
lm_status lm_plot_curve(const char *log_csv, const char *out_png, const char *env_name, float solved_return);

#ifdef __cplusplus
}
#endif
#endif
