/* Stage kind `ptycho_dm`, CPU backend, driven through the stage harness on
 * a tiny simulated scan built here: a known complex object (smooth
 * amplitude and phase) and probe (Gaussian with a quadratic phase), exit
 * waves P W_i O, unitary FFT (FFTW), intensities scaled to ~1e5 photons
 * per frame, written fftshifted around the beam centre of 48 x 48 float32
 * frames. Positions are object pixels (units: pixels) on a jittered
 * raster so no raster ambiguity hides in the result.
 *
 * Checked: config errors, series refusals (small frames, memory, unknown
 * extent, missing energy), counted rejections (no position, NaN position,
 * outside the extent, beyond max_frames), the idle protocol (nothing before
 * min_frames, one iteration per call, stop at iterations - final_iterations),
 * partial and final results with their shapes and flags, convergence to the
 * truth, a fresh second series, a cut-short end and a shutdown (interrupt),
 * the automatic centre with positions from the metadata, divergence, and
 * an empty series.
 *
 * The figures quoted in test_reconstruct can be reproduced with
 * PTY_ITS=<iterations> (>= 60), PTY_TRUEPROBE=1 (start from the true
 * probe), PTY_NOPU=1 (with it: never update the probe), PTY_DBG=1 (print
 * the error history). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <complex.h>
#include <fftw3.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/ptycho_dm.h"
#include "tests/common/stage_harness.h"

#define N 32          /* view side */
#define FS 48         /* frame side */
#define CY 24         /* beam centre in the frames */
#define GRID 7        /* GRID x GRID scan */
#define STEP 5        /* object pixels between positions */
#define NV (GRID * GRID)

typedef struct scan_s {
  double py[NV], px[NV];  /* positions (object pixels) */
  float frames[NV][FS * FS];
  double ymin, ymax, xmin, xmax;
} scan_t;

static scan_t g_scan;

/* The truth at an integer coordinate: amplitude 0.6..1, phase +-1 rad. */
static double complex truth(double y, double x) {
  double a = 0.8 + 0.2 * sin(0.21 * y) * cos(0.17 * x);
  double ph = 1.0 * sin(0.13 * x + 0.3) * cos(0.11 * y - 0.2);
  return a * cexp(I * ph);
}

static double complex probe_at(int u, int v) {
  double dy = u - N / 2.0, dx = v - N / 2.0, r2 = dy * dy + dx * dx;
  return exp(-r2 / (2 * 5.0 * 5.0)) * cexp(I * 0.02 * r2);
}

static void scan_init(scan_t *s) {
  static int done;
  if (done)
    return;
  done = 1;
  fftw_complex *buf = fftw_malloc(sizeof(fftw_complex) * N * N);
  fftw_plan p = fftw_plan_dft_2d(N, N, buf, buf, FFTW_FORWARD, FFTW_ESTIMATE);
  uint64_t r = 12345;
  s->ymin = s->xmin = 1e9, s->ymax = s->xmax = -1e9;
  for (int i = 0; i < NV; i++) {
    /* jitter -1..1 pixel, deterministic */
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    int jy = (int)((r >> 33) % 3) - 1;
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    int jx = (int)((r >> 33) % 3) - 1;
    s->py[i] = 20 + (i / GRID) * STEP + jy;
    s->px[i] = 20 + (i % GRID) * STEP + jx;
    s->ymin = fmin(s->ymin, s->py[i]), s->ymax = fmax(s->ymax, s->py[i]);
    s->xmin = fmin(s->xmin, s->px[i]), s->xmax = fmax(s->xmax, s->px[i]);
    for (int u = 0; u < N; u++)
      for (int v = 0; v < N; v++) {
        double complex e = probe_at(u, v) * truth(s->py[i] - N / 2 + u, s->px[i] - N / 2 + v);
        buf[u * N + v] = e; /* complex.h first: fftw_complex is double complex */
      }
    fftw_execute(p);
    memset(s->frames[i], 0, sizeof s->frames[i]);
    /* unitary FFT, then 1e3 x: ~1e5 photons per frame; FFT index k
     * goes to frame row CY - N/2 + (k + N/2) mod N (fftshift). */
    for (int k = 0; k < N; k++)
      for (int l = 0; l < N; l++) {
        double re = creal(buf[k * N + l]) / N, im = cimag(buf[k * N + l]) / N;
        int fy = CY - N / 2 + (k + N / 2) % N, fx = CY - N / 2 + (l + N / 2) % N;
        s->frames[i][fy * FS + fx] = (float)(1e3 * (re * re + im * im));
      }
  }
  fftw_destroy_plan(p);
  fftw_free(buf);
}

static beam_frame_t *frame_of(int i, uint64_t fid) {
  uint32_t shape[2] = {FS, FS};
  beam_frame_t *f = bh_frame_new(BEAM_DT_F32, 2, shape, fid);
  memcpy(f->data, g_scan.frames[i], sizeof g_scan.frames[i]);
  f->flags |= BEAM_FLAG_POS;
  f->pos[0] = g_scan.px[i]; /* wire order x, y */
  f->pos[1] = g_scan.py[i];
  return f;
}

/* A config for the scan: pixels, centre given, extent from the scan,
 * plain DM (fourier_relax 0: the power bound would stop refining noise-free
 * views once they are within it, 0.042 instead of 0.024 here);
 * kv: extra "key", "value" pairs (NULL-terminated) replacing these. */
static beam_cnode_t *scan_cfg_kv(int iterations, int final_iterations, const char *const *kv) {
  beam_cnode_t *c = bh_stage_cfg("ptycho_dm");
  char ext[128], it[32], fit[32];
  snprintf(ext, sizeof ext, "[%g, %g, %g, %g]", g_scan.ymin, g_scan.xmin, g_scan.ymax, g_scan.xmax);
  snprintf(it, sizeof it, "%d", iterations);
  snprintf(fit, sizeof fit, "%d", final_iterations);
  const char *base[] = {"n", "32", "center", "[24, 24]", "units", "pixels", "scan_extent", ext,
                        "margin", "2", "min_frames", "16", "max_frames", "64", "iterations", it,
                        "final_iterations", fit, "publish_every", "10", "publish_interval", "0",
                        "threads", "1", "fourier_relax", "0", NULL};
  for (size_t i = 0; base[i]; i += 2) {
    int over = 0;
    for (size_t j = 0; kv && kv[j]; j += 2)
      over |= !strcmp(kv[j], base[i]);
    if (!over)
      bh_set(c, base[i], base[i + 1]);
  }
  for (size_t j = 0; kv && kv[j]; j += 2)
    bh_set(c, kv[j], kv[j + 1]);
  return c;
}

static beam_cnode_t *scan_cfg(int iterations, int final_iterations) {
  return scan_cfg_kv(iterations, final_iterations, NULL);
}

static int setup(void **state) {
  scan_init(&g_scan);
  return 0;
}

static bh_t *make(beam_cnode_t *c) { return bh_make(c, beam_ptycho_dm_params, &beam_ptycho_dm_cpu_ops, 0, NULL); }

static void start_ok(bh_t *h) {
  uint32_t shape[2] = {FS, FS};
  beam_diag_t d = {0};
  int rc = bh_start(h, BEAM_DT_F32, 2, shape, &d);
  if (rc != 0)
    fail_msg("start: %s", d.msg);
}

static size_t count_out(bh_t *h, unsigned out, uint32_t flag) {
  size_t k = 0;
  for (size_t i = 0; i < h->nres; i++)
    if (h->res_out[i] == out && (h->res[i]->flags & flag))
      k++;
  return k;
}

/* ---- config -------------------------------------------------------------------- */

static void expect_init(const char *key, const char *val, const char *msg) {
  beam_cnode_t *c = bh_stage_cfg("ptycho_dm");
  bh_set(c, key, val);
  bh_t *h = bh_make(c, beam_ptycho_dm_params, &beam_ptycho_dm_cpu_ops, BEAM_ECONFIG, msg);
  bh_free(&h);
}

static void expect_invalid(const char *key, const char *val, const char *msg) {
  beam_cnode_t *c = bh_stage_cfg("ptycho_dm");
  bh_set(c, key, val);
  char m[512] = "";
  assert_int_not_equal(bh_validate(c, beam_ptycho_dm_params, m, sizeof m), 0);
  if (!strstr(m, msg))
    fail_msg("\"%s\" lacks \"%s\"", m, msg);
  beam_cnode_free(c);
}

static void test_config_errors(void **state) {
  expect_init("n", "33", "must be even");
  expect_init("min_frames", "5000", "exceeds max_frames");
  expect_init("final_iterations", "500", "exceeds iterations");
  expect_invalid("beta", "0", "beta must be in (0, 1]");
  expect_invalid("center", "[1, 2, 3]", "[y, x]");
  expect_invalid("scan_extent", "[1, 2]", "[y0, x0, y1, x1]");
  expect_invalid("precision", "half", "single|double");
  expect_invalid("n", "4", "minimum");
  {
    beam_cnode_t *c = bh_stage_cfg("ptycho_dm"), *p = bh_map();
    bh_set(p, "init", "file");
    bh_put(c, "probe", p);
    bh_t *h = bh_make(c, beam_ptycho_dm_params, &beam_ptycho_dm_cpu_ops, BEAM_ECONFIG, "probe.file is not set");
    bh_free(&h);
  }
  {
    beam_cnode_t *c = bh_stage_cfg("ptycho_dm"), *p = bh_map();
    bh_set(p, "init", "zone_plate");
    bh_put(c, "probe", p);
    bh_t *h = bh_make(c, beam_ptycho_dm_params, &beam_ptycho_dm_cpu_ops, BEAM_ECONFIG, "zp_diameter");
    bh_free(&h);
  }
  {
    beam_cnode_t *c = bh_stage_cfg("ptycho_dm"), *m = bh_map();
    bh_set(m, "file", "/nonexistent/mask.npy");
    bh_put(c, "mask", m);
    char msg[512];
    assert_int_equal(bh_validate(c, beam_ptycho_dm_params, msg, sizeof msg), 0);
    bh_t *h;
    beam_diag_t d = {0};
    assert_true(bh_new(&h, &beam_ptycho_dm_cpu_ops, c, &d) < 0);
    assert_non_null(strstr(d.msg, "/nonexistent/mask.npy"));
    bh_free(&h);
  }
}

/* ---- series refusals ------------------------------------------------------------- */

static void expect_refused(bh_t *h, uint32_t side, int rc_want, const char *msg) {
  uint32_t shape[2] = {side, side};
  beam_diag_t d = {0};
  int rc = bh_start(h, BEAM_DT_F32, 2, shape, &d);
  if (rc != rc_want || !strstr(d.msg, msg))
    fail_msg("start rc %d \"%s\", want %d with \"%s\"", rc, d.msg, rc_want, msg);
}

static void test_start_refusals(void **state) {
  bh_t *h = make(scan_cfg(20, 5));
  expect_refused(h, 24, BEAM_ESHAPE, "smaller than the view side n = 32");
  {
    uint32_t shape[3] = {2, FS, FS};
    beam_diag_t d = {0};
    assert_int_equal(bh_start(h, BEAM_DT_F32, 3, shape, &d), BEAM_ESHAPE);
    assert_int_equal(bh_start(h, BEAM_DT_C64, 2, shape + 1, &d), BEAM_ESHAPE);
  }
  bh_free(&h);

  /* A million 32 x 32 views cannot fit in 1 MiB. */
  static const char *const big[] = {"max_frames", "1000000", "max_memory", "1Mi", NULL};
  h = make(scan_cfg_kv(20, 5, big));
  expect_refused(h, FS, BEAM_ELIMIT, "more than the 0.001 GiB allowed (max_memory)");
  bh_free(&h);

  /* Neither metadata positions nor scan_extent: the object size is unknown. */
  beam_cnode_t *c = bh_stage_cfg("ptycho_dm");
  bh_set(c, "n", "32");
  bh_set(c, "units", "pixels");
  h = make(c);
  expect_refused(h, FS, BEAM_EINVAL, "scan_extent is not set");
  bh_free(&h);

  /* Metres without the energy. */
  c = bh_stage_cfg("ptycho_dm");
  bh_set(c, "n", "32");
  bh_set(c, "scan_extent", "[0, 0, 1e-6, 1e-6]");
  h = make(c);
  h->series.distance_m = 2, h->series.pixel_size_m = 75e-6;
  expect_refused(h, FS, BEAM_EINVAL, "no energy");
  /* With it the series starts; the object pixel is lambda z / (n p). */
  h->series.energy_ev = 8000;
  start_ok(h);
  const beam_ptycho_dm_t *s = h->st.priv;
  double lam = 1.23984198e-6 / 8000;
  assert_true(fabs(s->pixel_m - lam * 2 / (32 * 75e-6)) < 1e-15);
  bh_free(&h);

  /* positions: metadata without scan.positions. */
  static const char *const meta[] = {"positions", "metadata", NULL};
  h = make(scan_cfg_kv(20, 5, meta));
  expect_refused(h, FS, BEAM_EINVAL, "no scan.positions");
  bh_free(&h);
}

/* ---- rejections ---------------------------------------------------------------------- */

static void test_rejections(void **state) {
  static const char *const kv[] = {"max_frames", "20", NULL};
  bh_t *h = make(scan_cfg_kv(20, 5, kv));
  start_ok(h);
  beam_frame_t *f = frame_of(0, 0);
  f->flags &= ~(uint32_t)BEAM_FLAG_POS;
  assert_int_equal(bh_process(h, f), BEAM_EINVAL);
  assert_non_null(strstr(h->st.diag.msg, "no scan position"));
  f->flags |= BEAM_FLAG_POS;
  f->pos[1] = NAN;
  assert_int_equal(bh_process(h, f), BEAM_EINVAL);
  assert_non_null(strstr(h->st.diag.msg, "not finite"));
  f->pos[1] = g_scan.ymax + 40; /* beyond the extent and its margin */
  assert_int_equal(bh_process(h, f), BEAM_EINVAL);
  assert_non_null(strstr(h->st.diag.msg, "outside"));
  f->flags |= BEAM_FLAG_BAD;
  f->pos[1] = g_scan.py[0];
  assert_int_equal(bh_process(h, f), BEAM_EINVAL);
  bh_frame_free(f);
  /* 25 good frames: 20 kept, 5 rejected as beyond max_frames. */
  int lim = 0;
  for (int i = 0; i < 25; i++) {
    f = frame_of(i, (uint64_t)i);
    int rc = bh_process(h, f);
    if (rc == BEAM_ELIMIT) {
      lim++;
      assert_non_null(strstr(h->st.diag.msg, "more than max_frames = 20"));
    } else {
      assert_int_equal(rc, 0);
    }
    bh_frame_free(f);
  }
  assert_int_equal(lim, 5);
  const beam_ptycho_dm_t *s = h->st.priv;
  assert_int_equal(s->accepted, 20);
  assert_int_equal(s->rejected, 4 + 5);
  bh_free(&h);
}

/* ---- reconstruction ------------------------------------------------------------------ */

/* The truth on the reconstruction's grid (labels: origin + index). */
static void truth_grid(const beam_ptycho_dm_t *s, double *t) {
  for (uint32_t r = 0; r < s->geom.obj_h; r++)
    for (uint32_t q = 0; q < s->geom.obj_w; q++) {
      double complex v = truth(s->geom.origin_y + r, s->geom.origin_x + q);
      t[2 * ((size_t)r * s->geom.obj_w + q)] = creal(v);
      t[2 * ((size_t)r * s->geom.obj_w + q) + 1] = cimag(v);
    }
}

/* Relative error of an emitted complex64 object against the truth over
 * the well-lit area (the rows/cols between the first and last positions:
 * every pixel there lies within 8 pixels of a position, inside the
 * probe's bright part, 1/e radius 7). Ptychography cannot tell a linear
 * phase ramp on the object from the opposite ramp on the probe (P O
 * changes by a constant phase per view), so the best-fit ramp of
 * a conj(t) is removed before beam_ptycho_rel_error removes the global
 * phase and scale. */
static double object_error(const beam_ptycho_dm_t *s, const beam_frame_t *f) {
  size_t w = s->geom.obj_w, np = (size_t)s->geom.obj_h * w;
  double *a = malloc(np * 2 * sizeof *a), *t = malloc(np * 2 * sizeof *t);
  const float *o = f->data;
  truth_grid(s, t);
  uint32_t r0 = (uint32_t)(g_scan.ymin - s->geom.origin_y), r1 = (uint32_t)(g_scan.ymax - s->geom.origin_y);
  uint32_t c0 = (uint32_t)(g_scan.xmin - s->geom.origin_x), c1 = (uint32_t)(g_scan.xmax - s->geom.origin_x);
  double complex gy = 0, gx = 0;
  for (uint32_t r = r0; r < r1; r++)
    for (uint32_t c = c0; c < c1; c++) {
#define Z(rr, cc) ((o[2 * ((rr) * w + (cc))] + I * o[2 * ((rr) * w + (cc)) + 1]) * \
                   conj(t[2 * ((rr) * w + (cc))] + I * t[2 * ((rr) * w + (cc)) + 1]))
      gy += Z(r + 1, c) * conj(Z(r, c));
      gx += Z(r, c + 1) * conj(Z(r, c));
#undef Z
    }
  double ky = carg(gy), kx = carg(gx);
  for (size_t r = 0; r < s->geom.obj_h; r++)
    for (size_t c = 0; c < w; c++) {
      double complex v = (o[2 * (r * w + c)] + I * o[2 * (r * w + c) + 1]) * cexp(-I * (ky * r + kx * c));
      a[2 * (r * w + c)] = creal(v), a[2 * (r * w + c) + 1] = cimag(v);
    }
  double e = beam_ptycho_rel_error(a, t, s->geom.obj_h, s->geom.obj_w, r0, r1, c0, c1);
  free(a);
  free(t);
  return e;
}

/* Feeds the scan as the graph would with an always-empty queue: idle
 * after every frame (it may decline), then idle until it says done. */
static int feed(bh_t *h, int nframes, uint32_t *idle_calls) {
  int iters = 0;
  for (int i = 0; i < nframes; i++) {
    beam_frame_t *f = frame_of(i, (uint64_t)i);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
    int rc = h->st.idle(&h->st, &h->emit);
    assert_true(rc >= 0);
    (*idle_calls)++;
    const beam_ptycho_dm_t *s = h->st.priv;
    if (i + 1 < 16)
      assert_int_equal(s->nhist, 0); /* nothing before min_frames */
    iters += rc;
  }
  while (h->st.idle(&h->st, &h->emit) == 1)
    (*idle_calls)++;
  return iters;
}

static void test_reconstruct(void **state) {
  int its = getenv("PTY_ITS") ? atoi(getenv("PTY_ITS")) : 150;
  beam_cnode_t *cc = scan_cfg(its, 50);
  if (getenv("PTY_TRUEPROBE")) {
    static double pr[2 * N * N];
    for (int u = 0; u < N; u++)
      for (int v = 0; v < N; v++)
        pr[2 * (u * N + v)] = creal(probe_at(u, v)) * 31.6, pr[2 * (u * N + v) + 1] = cimag(probe_at(u, v)) * 31.6;
    char path[512];
    snprintf(path, sizeof path, "%s/probe.npy", bh_tmpdir());
    uint32_t sh[2] = {N, N};
    bh_write_npy(path, "<c16", 2, sh, pr, sizeof pr);
    beam_cnode_t *pm = bh_map();
    bh_set(pm, "init", "file");
    bh_set(pm, "file", path);
    bh_put(cc, "probe", pm);
    if (getenv("PTY_NOPU"))
      bh_set(cc, "probe_update_start", "100000");
  }
  bh_t *h = make(cc);
  start_ok(h);
  const beam_ptycho_dm_t *s = h->st.priv;
  uint32_t calls = 0;
  feed(h, NV, &calls);
  /* The open series used its budget and stopped: 150 - 50. */
  assert_int_equal(s->nhist, its - 50);
  assert_int_equal(h->st.idle(&h->st, &h->emit), 0);
  size_t partial_obj = count_out(h, BEAM_PTYCHO_OUT_OBJECT, BEAM_FLAG_PARTIAL);
  assert_int_equal(partial_obj, (its - 50) / 10); /* every 10 iterations */
  assert_int_equal(count_out(h, BEAM_PTYCHO_OUT_PROBE, BEAM_FLAG_PARTIAL), (its - 50) / 10);
  assert_int_equal(count_out(h, BEAM_PTYCHO_OUT_ERROR, BEAM_FLAG_PARTIAL), (its - 50) / 10);
  beam_frame_t *pe = bh_last(h, BEAM_PTYCHO_OUT_ERROR);
  assert_int_equal(pe->shape[0], its - 50);
  assert_int_equal(pe->shape[1], 4);
  double err_partial = object_error(s, bh_last(h, BEAM_PTYCHO_OUT_OBJECT));

  assert_int_equal(bh_end(h), 0);
  beam_frame_t *o = bh_last(h, BEAM_PTYCHO_OUT_OBJECT), *p = bh_last(h, BEAM_PTYCHO_OUT_PROBE),
               *e = bh_last(h, BEAM_PTYCHO_OUT_ERROR);
  assert_true(o->flags & BEAM_FLAG_FINAL);
  assert_false(o->flags & (BEAM_FLAG_PARTIAL | BEAM_FLAG_ABORTED));
  assert_true(p->flags & BEAM_FLAG_FINAL);
  assert_true(e->flags & BEAM_FLAG_FINAL);
  assert_int_equal(o->dtype, BEAM_DT_C64);
  assert_int_equal(o->ndim, 2);
  assert_int_equal(o->shape[0], s->geom.obj_h);
  assert_int_equal(o->shape[1], s->geom.obj_w);
  /* span 30 +- jitter, + n + 2 margin */
  assert_true(s->geom.obj_h >= 30 + 32 + 4 - 2 && s->geom.obj_h <= 30 + 32 + 4 + 2);
  assert_int_equal(p->ndim, 3);
  assert_int_equal(p->shape[0], 1);
  assert_int_equal(p->shape[1], N);
  assert_int_equal(e->shape[0], its);
  const double *eh = e->data;
  for (int i = 0; i < its; i++)
    assert_int_equal((int)eh[4 * i], i);
  if (getenv("PTY_DBG"))
    for (int i = 0; i < its; i += its / 20)
      print_message("it %d: %.4g %.4g %.4g\n", i, eh[4 * i + 1], eh[4 * i + 2], eh[4 * i + 3]);
  double fe0 = eh[1], fe1 = eh[4 * (its - 1) + 1];
  double err = object_error(s, o);
  print_message("fourier error %.3g -> %.3g; object error %.4f after %d (partial), %.4f after %d\n", fe0,
                fe1, err_partial, its - 50, err, its);
  /* The flat start's error, the yardstick. */
  beam_frame_t *flat = bh_frame_new(BEAM_DT_C64, 2, o->shape, 0);
  for (size_t i = 0; i < (size_t)o->shape[0] * o->shape[1]; i++)
    ((float *)flat->data)[2 * i] = 1;
  double err0 = object_error(s, flat);
  bh_frame_free(flat);
  print_message("object error of the flat start %.4f\n", err0);
  /* Noise-free data, known positions, probe retrieved from the mean
   * amplitude: measured 0.026 after 100 iterations, 0.024 after 150, 0.019
   * after 400 (0.0004 with the true probe held fixed, so the remainder is
   * the probe's slow convergence, not the geometry). The Fourier error is
   * the engine's, taken from 2 P_O psi - psi, which at a DM fixed point
   * is not 0: it halves here (0.047 -> 0.023) rather than vanishing. */
  assert_true(err < 0.05);
  assert_true(err < err0 / 5);
  assert_true(fe1 < fe0 / 1.5);
  assert_true(err <= err_partial * 1.05);
  /* The descriptor labels carry the grid. */
  assert_non_null(strstr(h->st.outs[BEAM_PTYCHO_OUT_OBJECT].labels_json, "\"origin\""));

  /* A second series starts afresh: iteration count, history, outputs. */
  bh_clear(h);
  start_ok(h);
  assert_int_equal(s->nhist, 0);
  for (int i = 0; i < 20; i++) {
    beam_frame_t *f = frame_of(i, (uint64_t)i);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(h->st.idle(&h->st, &h->emit), 1);
  assert_int_equal(s->nhist, 1);
  assert_int_equal(beam_dm_nviews(s->eng), 20);
  /* Cut short: an aborted series publishes what exists, FINAL | ABORTED,
   * without iterating further. */
  h->st.end_aborted = 1;
  assert_int_equal(bh_end(h), 0);
  h->st.end_aborted = 0;
  o = bh_last(h, BEAM_PTYCHO_OUT_OBJECT);
  e = bh_last(h, BEAM_PTYCHO_OUT_ERROR);
  assert_true((o->flags & (BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED)) == (BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED));
  assert_int_equal(e->shape[0], 1);
  assert_int_equal(s->nhist, 1);
  bh_free(&h);
}

/* Shutdown during end: interrupt stops the loop at once. */
static void test_interrupt(void **state) {
  bh_t *h = make(scan_cfg(1000, 1000));
  start_ok(h);
  for (int i = 0; i < 20; i++) {
    beam_frame_t *f = frame_of(i, (uint64_t)i);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  /* final_iterations == iterations: nothing while open. */
  assert_int_equal(h->st.idle(&h->st, &h->emit), 0);
  atomic_store(&h->st.interrupt, 1);
  assert_int_equal(bh_end(h), 0);
  const beam_ptycho_dm_t *s = h->st.priv;
  assert_int_equal(s->nhist, 0);
  beam_frame_t *o = bh_last(h, BEAM_PTYCHO_OUT_OBJECT);
  assert_non_null(o);
  assert_true(o->flags & BEAM_FLAG_ABORTED);
  bh_free(&h);
}

/* Automatic centre (centre of mass of the first frames) and positions
 * from the metadata, by frame id; a frame id beyond the list is rejected. */
static void test_auto_center_meta_positions(void **state) {
  beam_cnode_t *c = bh_stage_cfg("ptycho_dm");
  bh_set(c, "n", "32");
  bh_set(c, "units", "pixels");
  bh_set(c, "positions", "metadata");
  bh_set(c, "margin", "2");
  bh_set(c, "min_frames", "16");
  bh_set(c, "auto_frames", "8");
  bh_set(c, "iterations", "30");
  bh_set(c, "final_iterations", "0");
  bh_set(c, "publish_every", "0");
  bh_set(c, "publish_interval", "0");
  bh_set(c, "threads", "1");
  bh_t *h = make(c);
  char *meta = malloc(64 * NV + 64), *w = meta;
  w += sprintf(w, "{\"detector\": \"sim\", \"scan\": {\"positions\": [");
  for (int i = 0; i < NV; i++)
    w += sprintf(w, "%s[%g, %g]", i ? ", " : "", g_scan.px[i], g_scan.py[i]);
  sprintf(w, "]}}");
  h->series.meta_json = meta;
  start_ok(h);
  const beam_ptycho_dm_t *s = h->st.priv;
  assert_false(s->have_center);
  for (int i = 0; i < NV; i++) {
    beam_frame_t *f = frame_of(i, (uint64_t)i);
    f->flags &= ~(uint32_t)BEAM_FLAG_POS; /* ignored: positions come from the metadata */
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  beam_frame_t *f = frame_of(0, NV);
  assert_int_equal(bh_process(h, f), BEAM_EINVAL);
  assert_non_null(strstr(h->st.diag.msg, "no scan position"));
  bh_frame_free(f);
  assert_true(s->have_center);
  print_message("automatic centre (%.2f, %.2f), true (24, 24) up to the object's tilt\n", s->cy, s->cx);
  assert_true(fabs(s->cy - CY) < 1.0 && fabs(s->cx - CY) < 1.0);
  while (h->st.idle(&h->st, &h->emit) == 1)
    ;
  assert_int_equal(bh_end(h), 0);
  beam_frame_t *e = bh_last(h, BEAM_PTYCHO_OUT_ERROR);
  assert_int_equal(e->shape[0], 30);
  double err = object_error(s, bh_last(h, BEAM_PTYCHO_OUT_OBJECT));
  print_message("object error after 30 iterations: %.4f\n", err);
  assert_true(err < 0.1);
  h->series.meta_json = NULL;
  free(meta);
  bh_free(&h);
}

/* Divergence: with diverge_factor 1 any rise of the Fourier error above
 * its minimum (after 5 iterations) counts, and on 40 views of this scan
 * it rises once the probe updates start (measured: 0.055 -> 0.091 at
 * iteration 5; deterministic with one thread). idle then fails with the reason, the stage stops iterating and
 * ignores the rest of the series, and end publishes FINAL | ABORTED. */
static void test_divergence_stops(void **state) {
  static const char *const kv[] = {"diverge_factor", "1", NULL};
  bh_t *h = make(scan_cfg_kv(400, 0, kv));
  start_ok(h);
  const beam_ptycho_dm_t *s = h->st.priv;
  for (int i = 0; i < 40; i++) {
    beam_frame_t *f = frame_of(i, (uint64_t)i);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  int rc;
  while ((rc = h->st.idle(&h->st, &h->emit)) == 1)
    ;
  assert_int_equal(rc, BEAM_ESTATE);
  assert_non_null(strstr(h->st.diag.msg, "diverged at iteration"));
  print_message("%s\n", h->st.diag.msg);
  uint32_t at = s->nhist;
  assert_true(at > 5 && at < 400);
  assert_int_equal(h->st.idle(&h->st, &h->emit), 0);
  beam_frame_t *f = frame_of(45, 45);
  assert_int_equal(bh_process(h, f), 0); /* ignored, counted */
  bh_frame_free(f);
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(s->nhist, at);
  beam_frame_t *o = bh_last(h, BEAM_PTYCHO_OUT_OBJECT), *e = bh_last(h, BEAM_PTYCHO_OUT_ERROR);
  assert_true((o->flags & (BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED)) == (BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED));
  assert_int_equal(e->shape[0], at);
  /* The next series starts afresh. */
  bh_clear(h);
  start_ok(h);
  assert_int_equal(s->nhist, 0);
  assert_false(s->failed);
  bh_free(&h);
}

/* No usable frame: end reports it and publishes nothing. */
static void test_empty_series(void **state) {
  bh_t *h = make(scan_cfg(20, 5));
  start_ok(h);
  assert_int_equal(h->st.idle(&h->st, &h->emit), 0);
  assert_int_equal(bh_end(h), BEAM_ESTATE);
  assert_non_null(strstr(h->st.diag.msg, "no usable frame"));
  assert_int_equal(h->nres, 0);
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_start_refusals),
      cmocka_unit_test(test_rejections),
      cmocka_unit_test(test_reconstruct),
      cmocka_unit_test(test_interrupt),
      cmocka_unit_test(test_auto_center_meta_positions),
      cmocka_unit_test(test_divergence_stops),
      cmocka_unit_test(test_empty_series),
  };
  return beam_run_tests(tests, setup, NULL);
}
