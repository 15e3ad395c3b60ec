/* Tests for viz/ (include/lumen/viz.h): the canvas, the viewer, frame capture, the view session
 * and the learning-curve plot.
 * - every registered env's draw list (the env tests' plugin tests/plugins/corridor.c loaded
 *   too), rendered headless, changes pixels, and two distinct states (a reset and 30 steps
 *   later, pushing one way or else the other) render differently; an env without a reference
 *   stepper is stepped through its own graphs on ref (lm_env_stepper);
 * - the live viewer in a real window (the test starts Xvfb when DISPLAY is unset, or skips
 *   without it): `lm_view_run` shows frames until a synthetic q key or SDL_QUIT arrives and
 *   returns cleanly after exactly the frames before it; n and z move and zoom the highlight;
 *   resizing the window resizes the canvas;
 * - no display and no headless: NULL / LM_ERR_UNSUPPORTED with "no display: set DISPLAY or use
 *   --headless", no crash;
 * - headless capture: one PNG grid of the frames, or numbered PNGs that differ as envs move; a
 *   checkpoint (a run directory with latest.ckpt) is viewed with its iteration count;
 * - lm_viewer_show_rollout draws a training rollout's envs and rate-limits itself;
 * - lm_plot_curve: a PNG of LM_PLOT_WIDTH x LM_PLOT_HEIGHT with a dashed line in the threshold
 *   colour whose height follows solved_return, none when it is NaN; columns found by name;
 *   a log without mean_return fails naming it.
 * Built without SDL2, every entry point fails with "built without SDL2". */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core.h" /* lm_clear_error */
#include "lumen/lumen.h"
#include "lumen/viz.h"

#define OK(call)                                                                                   \
  do {                                                                                             \
    lm_status st_ = (call);                                                                        \
    cr_assert_eq(st_, LM_OK, "%s -> %s: %s", #call, lm_status_name(st_), lm_last_error());         \
  } while (0)

#ifdef LUMEN_HAVE_SDL
#include <SDL.h>
#include <SDL_image.h>

/* SDL's video init opens a D-Bus connection (screensaver and input-method support), and
 * libdbus keeps a buffer no pointer reaches after SDL_Quit: not lumen's leak. Read by
 * LeakSanitizer in the sanitizer build; an unused function otherwise. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libdbus-1.so\n"; }

/* ---------------------------------------------------------------- helpers */

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/lumen-viz-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp");
}

static void remove_tmpdir(void) {
  if (!tmpdir[0]) return;
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* Pixels of a canvas that differ from `rgb` (0xRRGGBB). */
static long count_not(lm_canvas *c, uint32_t rgb) {
  int w, h;
  lm_canvas_size(c, &w, &h);
  uint8_t *px = malloc((size_t)w * (size_t)h * 4);
  cr_assert_not_null(px);
  OK(lm_canvas_read_rgba(c, px, (size_t)w * (size_t)h * 4));
  long n = 0;
  for (long i = 0; i < (long)w * h; i++) {
    uint32_t v = (uint32_t)px[4 * i] << 16 | (uint32_t)px[4 * i + 1] << 8 | px[4 * i + 2];
    n += v != rgb;
  }
  free(px);
  return n;
}

static long count_diff(const uint8_t *a, const uint8_t *b, size_t n) {
  long d = 0;
  for (size_t i = 0; i < n; i += 4) d += memcmp(a + i, b + i, 3) != 0;
  return d;
}

/* Loads a PNG as an RGBA32 surface. */
static SDL_Surface *load_png(const char *path) {
  SDL_Surface *s = IMG_Load(path);
  cr_assert_not_null(s, "IMG_Load %s: %s", path, SDL_GetError());
  SDL_Surface *r = SDL_ConvertSurfaceFormat(s, SDL_PIXELFORMAT_RGBA32, 0);
  SDL_FreeSurface(s);
  cr_assert_not_null(r);
  return r;
}

static uint32_t pixel_rgb(SDL_Surface *s, int x, int y) {
  const uint8_t *p = (const uint8_t *)s->pixels + (size_t)y * (size_t)s->pitch + (size_t)x * 4;
  return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}

/* ---------------------------------------------------------------- a display for the window tests */

static pid_t xvfb_pid;

/* Makes sure DISPLAY names an X server: the one given, or an Xvfb started here (-displayfd
 * reports the display it chose, so parallel workers never collide). 0 when neither is possible. */
static int ensure_display(void) {
  const char *d = getenv("DISPLAY");
  if (d && *d) return 1;
  int fds[2];
  if (pipe(fds) != 0) return 0;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", fds[1]);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    execlp("Xvfb", "Xvfb", "-displayfd", fd, "-screen", "0", "1024x768x24", "-nolisten", "tcp", "-terminate",
           (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return 0;
  }
  char buf[32] = "";
  ssize_t got = 0;
  for (ssize_t r; got < (ssize_t)sizeof buf - 1 && (r = read(fds[0], buf + got, sizeof buf - 1 - (size_t)got)) > 0;) {
    got += r;
    if (strchr(buf, '\n')) break;
  }
  close(fds[0]);
  int num = -1;
  if (got <= 0 || sscanf(buf, "%d", &num) != 1) {
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return 0;
  }
  xvfb_pid = pid;
  char disp[32];
  snprintf(disp, sizeof disp, ":%d", num);
  setenv("DISPLAY", disp, 1);
  return 1;
}

static void window_setup(void) {
  unsetenv("SDL_VIDEODRIVER");
  if (!ensure_display()) cr_skip_test("no DISPLAY and no Xvfb to start: the window tests need an X server");
}

static void window_teardown(void) {
  if (xvfb_pid > 0) {
    kill(xvfb_pid, SIGTERM);
    waitpid(xvfb_pid, NULL, 0);
    xvfb_pid = 0;
  }
}

/* ---------------------------------------------------------------- draw lists */

#define TEST_PLUGIN LUMEN_SOURCE_DIR "/tests/plugins/corridor.c"

/* state = `from` stepped `steps` times with one action held: the top of the action space
 * (high) or its bottom; by the reference stepper, or by the env's own graphs on ref (gs) where
 * it has none. */
static void push(const lm_env_spec *env, lm_env_stepper *gs, const float *from, float *state, int steps, int high) {
  size_t S = (size_t)env->state_size, A = (size_t)lm_env_action_size(env);
  float *act = malloc(A * sizeof *act), *next = malloc(S * sizeof *next);
  float *obs = malloc((size_t)env->obs_size * sizeof *obs), r, term;
  cr_assert(act && next && obs);
  for (size_t k = 0; k < A; k++)
    act[k] = env->action.kind == LM_SPACE_DISCRETE ? (high ? (float)(env->action.n - 1) : 0.0f)
                                                   : (high ? env->action.high[k] : env->action.low[k]);
  memcpy(state, from, S * sizeof *state);
  for (int t = 0; t < steps; t++) {
    if (!gs) {
      int done = 0;
      env->ref_step(state, act, &done);
      continue;
    }
    OK(lm_env_stepper_step(gs, 1, state, act, next, obs, &r, &term));
    memcpy(state, next, S * sizeof *state);
  }
  free(act), free(next), free(obs);
}

Test(viz, every_env_draw_list_renders_nonempty_and_differs_between_two_states) {
  const lm_env_spec *plugin = NULL;
  OK(lm_env_load(TEST_PLUGIN, &plugin)); /* so that the loop below draws a plugin env too */
  cr_assert_not_null(plugin);
  for (int e = 0; e < lm_env_count(); e++) {
    const lm_env_spec *env = lm_env_at(e);
    if (!env->draw) {
      cr_log_info("%s has no draw list: the viewer cannot show it", env->name);
      continue;
    }
    size_t S = (size_t)env->state_size;
    lm_backend_t *ref = NULL;
    lm_env_stepper *gs = NULL;
    if (!env->ref_reset) {
      cr_log_info("%s has no reference stepper: its graphs on ref step it", env->name);
      ref = lm_backend_new("ref");
      cr_assert_not_null(ref, "%s", lm_last_error());
      gs = lm_env_stepper_new(env, ref, 1);
      cr_assert_not_null(gs, "%s: %s", env->name, lm_last_error());
    }
    lm_draw_cmd cmds[LM_ENV_MAX_DRAW];
    float *a = malloc(S * sizeof *a), *b = malloc(S * sizeof *b);
    cr_assert(a && b);
    if (gs) OK(lm_env_stepper_reset(gs, 7, 0, a));
    else env->ref_reset(a, 7, 0, 0);
    cr_assert_gt(env->draw(a, cmds, LM_ENV_MAX_DRAW), 0, "%s draws nothing", env->name);
    /* 30 steps with actions pushing one way, or, where that leaves the state as it is (a wall),
     * the other way, so the picture must move */
    push(env, gs, a, b, 30, 1);
    if (!memcmp(a, b, S * sizeof *a)) push(env, gs, a, b, 30, 0);
    int moved = 0;
    for (size_t k = 0; k < S; k++) moved |= a[k] != b[k];
    cr_assert(moved, "%s: 30 steps either way left the state unchanged", env->name);

    lm_viewer *v = lm_viewer_new(env, 1, 320, 240, 1);
    cr_assert_not_null(v, "%s: %s", env->name, lm_last_error());
    size_t bytes = 320 * 240 * 4;
    uint8_t *pa = malloc(bytes), *pb = malloc(bytes);
    OK(lm_viewer_draw(v, a, NULL, NULL));
    long ink = count_not(lm_viewer_canvas(v), 0xfafafa); /* the cell's background */
    OK(lm_canvas_read_rgba(lm_viewer_canvas(v), pa, bytes));
    OK(lm_viewer_draw(v, b, NULL, NULL));
    OK(lm_canvas_read_rgba(lm_viewer_canvas(v), pb, bytes));
    long diff = count_diff(pa, pb, bytes);
    cr_expect_gt(ink, 100, "%s: only %ld pixels drawn", env->name, ink);
    cr_expect_gt(diff, 20, "%s: two distinct states differ in only %ld pixels", env->name, diff);
    free(pa), free(pb), free(a), free(b);
    lm_viewer_free(v);
    lm_env_stepper_free(gs);
    lm_backend_free(ref);
  }
}

Test(viz, captions_and_status_line_add_text) {
  const lm_env_spec *env = lm_env_find("cartpole");
  float s[8] = {0};
  lm_viewer *v = lm_viewer_new(env, 2, 800, 400, 1);
  cr_assert_not_null(v, "%s", lm_last_error());
  OK(lm_viewer_draw(v, s, NULL, NULL));
  size_t bytes = 800 * 400 * 4;
  uint8_t *plain = malloc(bytes), *text = malloc(bytes);
  OK(lm_canvas_read_rgba(lm_viewer_canvas(v), plain, bytes));
  lm_view_cell cells[2] = {{.ret = 12, .step = 12}, {.ret = 3, .step = 3, .episodes = 2, .last_ret = 40}};
  OK(lm_viewer_draw(v, s, cells, "CartPole-v1 | ref | policy: random"));
  OK(lm_canvas_read_rgba(lm_viewer_canvas(v), text, bytes));
  cr_expect_gt(count_diff(plain, text, bytes), 500, "captions and status change the frame");
  /* the status bar is at the bottom: its rows are dark */
  uint8_t *row = text + (size_t)(399 * 800) * 4;
  cr_expect_lt(row[0] + row[1] + row[2], 200);
  free(plain), free(text);
  lm_viewer_free(v);
}

Test(viz, canvas_text_and_shapes_stay_inside_the_clip) {
  lm_canvas *c = lm_canvas_new(100, 50);
  cr_assert_not_null(c);
  lm_canvas_clear(c, 0xffffffff);
  lm_canvas_clip(c, 10, 10, 20, 20);
  lm_canvas_fill_circle(c, 20, 20, 40, 0x000000ff);
  lm_canvas_line(c, 0, 0, 100, 50, 6, 0x000000ff, 1);
  lm_canvas_text(c, 0, 0, 3, 0x000000ff, "MMMMMMMM");
  lm_canvas_clip(c, 0, 0, 0, 0);
  uint8_t px[100 * 50 * 4];
  OK(lm_canvas_read_rgba(c, px, sizeof px));
  long inside = 0, outside = 0;
  for (int y = 0; y < 50; y++)
    for (int x = 0; x < 100; x++) {
      int dark = px[(y * 100 + x) * 4] < 128;
      if (x >= 10 && x < 30 && y >= 10 && y < 30) inside += dark;
      else outside += dark;
    }
  cr_expect_eq(inside, 400, "the clip rectangle is filled: %ld of 400", inside);
  cr_expect_eq(outside, 0, "%ld pixels drawn outside the clip", outside);
  cr_expect_eq(lm_canvas_text_width("abc", 2), 3 * LM_FONT_CELL_W * 2);
  lm_canvas_free(c);
}

/* ---------------------------------------------------------------- no display */

Test(viz, no_display_and_not_headless_fails_with_a_clear_message) {
  unsetenv("DISPLAY");
  unsetenv("WAYLAND_DISPLAY");
  unsetenv("SDL_VIDEODRIVER");
  lm_clear_error();
  lm_viewer *v = lm_viewer_new(lm_env_find("cartpole"), 4, 0, 0, 0);
  cr_assert_null(v);
  cr_expect(strstr(lm_last_error(), "no display: set DISPLAY or use --headless"), "got: %s", lm_last_error());
  lm_view_config cfg = {.source = "pendulum", .device = "ref"};
  lm_view_result res;
  lm_clear_error();
  cr_expect_eq(lm_view_run(&cfg, &res), LM_ERR_UNSUPPORTED);
  cr_expect(strstr(lm_last_error(), "no display: set DISPLAY or use --headless"), "got: %s", lm_last_error());
  cr_expect_eq(res.frames, 0);
  /* headless still works with no display */
  v = lm_viewer_new(lm_env_find("cartpole"), 4, 0, 0, 1);
  cr_expect_not_null(v, "%s", lm_last_error());
  lm_viewer_free(v);
}

/* ---------------------------------------------------------------- the live viewer */

/* SDL drops key events queued before its window first gains keyboard focus (it resets the
 * keyboard then), so synthetic keys wait for the focus, as a person's would. */
typedef struct quit_plan {
  int at;        /* first frame after which the event may be pushed */
  int use_quit;  /* SDL_QUIT instead of the q key */
  int pushed_at; /* frame after which it was pushed (-1: not yet) */
} quit_plan;

static int push_quit(void *ctx, int frame) {
  quit_plan *q = ctx;
  if (frame > 500) return 1; /* the event was never honoured: stop, and fail below */
  if (q->pushed_at >= 0 || frame < q->at || (!SDL_GetKeyboardFocus() && frame < 200)) return 0;
  q->pushed_at = frame;
  SDL_Event e = {0};
  if (q->use_quit) e.type = SDL_QUIT;
  else {
    e.type = SDL_KEYDOWN;
    e.key.state = SDL_PRESSED;
    e.key.keysym.sym = SDLK_q;
    e.key.keysym.scancode = SDL_SCANCODE_Q;
  }
  cr_assert_eq(SDL_PushEvent(&e), 1, "SDL_PushEvent: %s", SDL_GetError());
  return 0;
}

Test(viz, live_viewer_in_a_window_quits_on_a_synthetic_q_key, .init = window_setup, .fini = window_teardown) {
  quit_plan q = {.at = 3, .pushed_at = -1};
  lm_view_config cfg = {.source = "cartpole", .device = "ref", .envs = 4, .seed = 1, .on_frame = push_quit, .ctx = &q};
  lm_view_result res;
  OK(lm_view_run(&cfg, &res));
  cr_expect_geq(q.pushed_at, 3);
  cr_expect_eq(res.frames, q.pushed_at + 1, "q after frame %d: got %d frames", q.pushed_at, res.frames);
  cr_expect_str_eq(res.env, "cartpole");
  cr_expect(strstr(res.policy, "random"), "%s", res.policy);
}

Test(viz, live_viewer_in_a_window_quits_on_sdl_quit, .init = window_setup, .fini = window_teardown) {
  quit_plan q = {.at = 2, .use_quit = 1, .pushed_at = -1};
  lm_view_config cfg = {.source = "acrobot", .device = "ref", .envs = 2, .on_frame = push_quit, .ctx = &q};
  lm_view_result res;
  OK(lm_view_run(&cfg, &res));
  cr_expect_geq(q.pushed_at, 2);
  cr_expect_eq(res.frames, q.pushed_at + 1);
}

/* Polls until an event of `kind` arrives (1) or a second passes (0). An SDL poll batch ends
 * at a sentinel, so a 0 from one poll does not mean the queue is empty for good. */
static int wait_event(lm_viewer *v, lm_view_event_kind kind) {
  lm_view_event ev;
  for (int i = 0; i < 100; i++) {
    while (lm_viewer_poll(v, &ev))
      if (ev.kind == kind) return 1;
    SDL_Delay(10);
  }
  return 0;
}

static SDL_Window *find_window(void) {
  for (Uint32 id = 1; id < 16; id++)
    if (SDL_GetWindowFromID(id)) return SDL_GetWindowFromID(id);
  return NULL;
}

Test(viz, window_keys_move_the_highlight_and_resizing_follows_the_window, .init = window_setup,
     .fini = window_teardown) {
  const lm_env_spec *env = lm_env_find("pendulum");
  lm_viewer *v = lm_viewer_new(env, 3, 480, 360, 0);
  cr_assert_not_null(v, "%s", lm_last_error());
  float s[6] = {0.5f, 0, 1.5f, 0, -2.0f, 0};
  OK(lm_viewer_draw(v, s, NULL, "status"));
  lm_view_event ev;
  for (int i = 0; i < 200 && !SDL_GetKeyboardFocus(); i++) { /* see quit_plan */
    while (lm_viewer_poll(v, &ev)) {}
    SDL_Delay(10);
  }
  SDL_Event e = {.type = SDL_KEYDOWN};
  e.key.keysym.sym = SDLK_n;
  SDL_PushEvent(&e);
  cr_expect(wait_event(v, LM_VIEW_EVENT_NEXT), "n reported");
  cr_expect_eq(lm_viewer_highlight(v), 1);
  e.key.keysym.sym = SDLK_SPACE;
  SDL_PushEvent(&e);
  cr_expect(wait_event(v, LM_VIEW_EVENT_PAUSE), "space reported");
  e.key.keysym.sym = SDLK_z;
  SDL_PushEvent(&e);
  cr_expect(wait_event(v, LM_VIEW_EVENT_ZOOM), "z reported");

  SDL_Window *w = find_window();
  cr_assert_not_null(w);
  SDL_SetWindowSize(w, 640, 400);
  int cw = 0, ch = 0;
  for (int i = 0; i < 200 && (cw != 640 || ch != 400); i++) {
    while (lm_viewer_poll(v, &ev)) {}
    lm_canvas_size(lm_viewer_canvas(v), &cw, &ch);
    SDL_Delay(10);
  }
  cr_expect_eq(cw, 640, "canvas follows the window: %dx%d", cw, ch);
  cr_expect_eq(ch, 400);
  cr_expect_gt(count_not(lm_viewer_canvas(v), 0xfafafa), 1000, "the frame is redrawn after the resize");
  lm_viewer_free(v);
}

/* ---------------------------------------------------------------- headless capture */

Test(viz, headless_capture_writes_a_grid_png_and_numbered_frames_that_change, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  char out[512];
  snprintf(out, sizeof out, "%s/grid.png", tmpdir);
  lm_view_config cfg = {.source = "cartpole", .device = "ref", .envs = 2, .headless = 1, .frames = 3,
                        .out = out, .width = 320, .height = 200, .seed = 3};
  lm_view_result res;
  OK(lm_view_run(&cfg, &res));
  cr_expect_eq(res.frames, 3);
  cr_expect_eq(res.files, 1);
  SDL_Surface *g = load_png(out);
  cr_expect_geq(g->w, 3 * 320, "three frames side by side: %d wide", g->w);
  cr_expect_geq(g->h, 200);
  SDL_FreeSurface(g);

  snprintf(out, sizeof out, "%s/frames/", tmpdir);
  cfg.out = out;
  cfg.every = 10;
  OK(lm_view_run(&cfg, &res));
  cr_expect_eq(res.files, 3);
  char p0[600], p2[600];
  snprintf(p0, sizeof p0, "%sframe_0000.png", out);
  snprintf(p2, sizeof p2, "%sframe_0002.png", out);
  SDL_Surface *a = load_png(p0), *b = load_png(p2);
  cr_assert_eq(a->w, 320);
  cr_assert_eq(a->h, 200);
  long d = 0;
  for (int y = 0; y < 200; y++)
    for (int x = 0; x < 320; x++) d += pixel_rgb(a, x, y) != pixel_rgb(b, x, y);
  cr_expect_gt(d, 50, "20 steps later the frame differs (%ld pixels)", d);
  SDL_FreeSurface(a), SDL_FreeSurface(b);

  cfg.out = "no-extension";
  cr_expect_eq(lm_view_run(&cfg, &res), LM_ERR_INVALID);
  cr_expect(strstr(lm_last_error(), "FILE.png"), "%s", lm_last_error());
  cfg.source = "no-such-env-or-file";
  cr_expect_eq(lm_view_run(&cfg, &res), LM_ERR_INVALID);
  cr_expect(strstr(lm_last_error(), "cartpole"), "names the known envs: %s", lm_last_error());
}

Test(viz, a_checkpoint_run_directory_is_viewed_with_its_weights, .init = make_tmpdir, .fini = remove_tmpdir) {
  const lm_env_spec *env = lm_env_find("cartpole");
  lm_backend_t *b = lm_backend_new("ref");
  cr_assert_not_null(b);
  lm_ppo_config pc = lm_ppo_defaults(env);
  pc.n_envs = 4, pc.horizon = 8, pc.minibatches = 2, pc.epochs = 1, pc.total_steps = 64;
  lm_trainer *t = lm_trainer_new(b, env, &pc);
  cr_assert_not_null(t, "%s", lm_last_error());
  lm_iter_stats st;
  OK(lm_trainer_iterate(t, &st));
  char ckpt[512], out[512];
  snprintf(ckpt, sizeof ckpt, "%s/latest.ckpt", tmpdir);
  OK(lm_trainer_save(t, ckpt));
  lm_trainer_free(t);
  lm_backend_free(b);
  snprintf(out, sizeof out, "%s/view.png", tmpdir);
  lm_view_config cfg = {.source = tmpdir, .device = "ref", .envs = 3, .headless = 1, .frames = 2, .out = out};
  lm_view_result res;
  OK(lm_view_run(&cfg, &res));
  cr_expect_str_eq(res.env, "cartpole");
  cr_expect(strstr(res.policy, "latest.ckpt (iteration 1, 32 env steps)"), "%s", res.policy);
  cr_expect_eq(res.files, 1);
  struct stat sb;
  cr_expect_eq(stat(out, &sb), 0);
}

Test(viz, show_rollout_draws_a_training_rollout_and_rate_limits) {
  const lm_env_spec *env = lm_env_find("acrobot");
  lm_backend_t *b = lm_backend_new("ref");
  lm_policy_config pol = lm_policy_default();
  lm_rollout *r = lm_rollout_new(b, env, &pol, 4, 8, LM_STEPPER_DEVICE);
  cr_assert_not_null(r, "%s", lm_last_error());
  OK(lm_rollout_reset(r, 5));
  OK(lm_rollout_run(r));
  lm_viewer *v = lm_viewer_new(env, 6, 600, 400, 1); /* more cells than envs: the last repeats */
  cr_assert_not_null(v);
  OK(lm_viewer_show_rollout(v, r, "iteration 1"));
  lm_canvas *c = lm_viewer_canvas(v);
  long ink = count_not(c, 0xfafafa);
  cr_expect_gt(ink, 1000);
  /* an immediate second call is skipped: nothing is redrawn */
  lm_canvas_fill_rect(c, 0, 0, 600, 400, 0x000000ff);
  OK(lm_viewer_show_rollout(v, r, "iteration 2"));
  cr_expect_eq(count_not(c, 0x000000), 0, "the rate limit skipped the draw");
  cr_expect(lm_viewer_is_open(v));
  lm_viewer_free(v);
  lm_rollout_free(r);
  lm_backend_free(b);
}

/* ---------------------------------------------------------------- learning curve */

static void write_log(const char *path, int with_return) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  /* columns in another order than the trainer's, plus one it never writes */
  fprintf(f, "sps,iteration,%sloss,extra,env_steps,episodes,entropy\n", with_return ? "mean_return," : "");
  for (int i = 1; i <= 60; i++) {
    double steps = 2048.0 * i, ret = 20 + 460 / (1 + exp(-(steps - 60000) / 12000)) + 10 * sin(i);
    if (with_return) fprintf(f, "50000,%d,%.3f,%.4f,7,%.0f,%d,%.4f\n", i, ret, 50 * exp(-i / 20.0), steps, i % 9 ? 5 : 0,
                             0.69 - 0.003 * i);
    else fprintf(f, "50000,%d,%.4f,7,%.0f,%d,%.4f\n", i, 50 * exp(-i / 20.0), steps, 5, 0.69 - 0.003 * i);
  }
  fclose(f);
}

/* The first row (y) where the threshold colour forms a dashed line, or -1. */
static int threshold_row(SDL_Surface *s) {
  uint32_t want = LM_PLOT_THRESHOLD_RGBA >> 8;
  for (int y = 0; y < s->h; y++) {
    int runs = 0, in = 0;
    for (int x = 0; x < s->w; x++) {
      int hit = pixel_rgb(s, x, y) == want;
      if (hit && !in) runs++;
      in = hit;
    }
    if (runs >= 30) return y; /* ~46 dashes across the panel; text never makes 30 runs */
  }
  return -1;
}

Test(viz, plot_curve_writes_a_png_of_the_expected_size_with_the_threshold_dashed, .init = make_tmpdir,
     .fini = remove_tmpdir) {
  char log[512], png[512];
  snprintf(log, sizeof log, "%s/log.csv", tmpdir);
  snprintf(png, sizeof png, "%s/curve.png", tmpdir);
  write_log(log, 1);
  OK(lm_plot_curve(log, png, "CartPole-v1", 475.0f));
  SDL_Surface *s = load_png(png);
  cr_expect_eq(s->w, LM_PLOT_WIDTH);
  cr_expect_eq(s->h, LM_PLOT_HEIGHT);
  int y475 = threshold_row(s);
  cr_expect_gt(y475, 0, "a dashed line in the threshold colour");
  SDL_FreeSurface(s);

  OK(lm_plot_curve(log, png, "CartPole-v1", 100.0f));
  s = load_png(png);
  int y100 = threshold_row(s);
  cr_expect_gt(y100, y475 + 50, "a lower threshold is drawn lower (475 at row %d, 100 at row %d)", y475, y100);
  SDL_FreeSurface(s);

  OK(lm_plot_curve(log, png, NULL, NAN));
  s = load_png(png);
  cr_expect_eq(threshold_row(s), -1, "no threshold, no dashed line");
  SDL_FreeSurface(s);

  write_log(log, 0);
  cr_expect_eq(lm_plot_curve(log, png, "x", 1.0f), LM_ERR_INVALID);
  cr_expect(strstr(lm_last_error(), "mean_return"), "%s", lm_last_error());
  snprintf(log, sizeof log, "%s/missing.csv", tmpdir);
  cr_expect_eq(lm_plot_curve(log, png, "x", 1.0f), LM_ERR_IO);
}

#else /* built without SDL2 */

Test(viz, without_sdl_every_entry_point_says_built_without_sdl2) {
  lm_clear_error();
  cr_expect_null(lm_viewer_new(lm_env_find("cartpole"), 1, 100, 100, 1));
  cr_expect(strstr(lm_last_error(), "built without SDL2"), "%s", lm_last_error());
  cr_expect_null(lm_canvas_new(10, 10));
  cr_expect_eq(lm_plot_curve("log.csv", "curve.png", "cartpole", 475), LM_ERR_UNSUPPORTED);
  cr_expect(strstr(lm_last_error(), "built without SDL2"), "%s", lm_last_error());
  lm_view_config cfg = {.source = "cartpole", .headless = 1, .out = "x.png"};
  cr_expect_eq(lm_view_run(&cfg, NULL), LM_ERR_UNSUPPORTED);
}

#endif
