/* Stage kind `com`, CPU backend: the centre of mass of a known disc at a
 * known (integer, then sub-pixel) shift; NaN for an empty frame and a
 * CORRUPT one; the run sums against the plain reference on random data of
 * every dtype with a ring and a mask (file and series); the maps on
 * fields with a known answer (a linear ramp: constant divergence, no
 * curl; a rotation: constant curl; the gradient of a periodic potential:
 * iDPC gives it back; scan_rotation and flip_y as LiberTEM applies them);
 * the scan shape from the series metadata; FINAL/INCOMPLETE flags; every
 * configuration and start error. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/com.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/stage_harness.h"

static bh_t *make(beam_cnode_t *cfg, int expect_rc, const char *expect_msg) {
  return bh_make(cfg, beam_com_params, &beam_com_cpu_ops, expect_rc, expect_msg);
}

/* A uniform disc of radius rd and value v centred on (x0, y0) (integers),
 * moved by (dx, dy) in [0, 1) by bilinear splatting: each pixel's value
 * goes to the four pixels around its new place with weights that keep the
 * total and move the first moments by exactly (dx, dy). */
static void splat_disc(float *f, int H, int W, int x0, int y0, double rd, double v, double dx,
                       double dy) {
  memset(f, 0, (size_t)H * W * sizeof *f);
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      if ((x - x0) * (x - x0) + (y - y0) * (y - y0) > rd * rd)
        continue;
      f[y * W + x] += (float)(v * (1 - dx) * (1 - dy));
      f[y * W + x + 1] += (float)(v * dx * (1 - dy));
      f[(y + 1) * W + x] += (float)(v * (1 - dx) * dy);
      f[(y + 1) * W + x + 1] += (float)(v * dx * dy);
    }
}

static void test_known_disc(void **state) {
  enum { H = 64, W = 72 };
  beam_cnode_t *cfg = bh_stage_cfg("com");
  bh_set(cfg, "cx", "30");
  bh_set(cfg, "cy", "32");
  bh_set(cfg, "r", "20");
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 1); /* no scan shape: no maps */
  assert_string_equal(h->st.outs[0].name, "com");
  assert_int_equal(h->st.outs[0].shape[0], BEAM_COM_NVAL);
  /* A disc of radius 6 (value 100) at (33, 30): shift (+3, -2), exact. */
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  uint16_t *p = in->data;
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++)
      p[y * W + x] = (x - 33) * (x - 33) + (y - 30) * (y - 30) <= 36 ? 100 : 0;
  p[0] = 5000; /* outside the r = 20 disc: must not count */
  assert_int_equal(bh_process(h, in), 0);
  const double *v = bh_last(h, 0)->data;
  assert_true(v[BEAM_COM_X] == 33.0 && v[BEAM_COM_Y] == 30.0);
  assert_true(v[BEAM_COM_SHIFT_X] == 3.0 && v[BEAM_COM_SHIFT_Y] == -2.0);
  assert_true(v[BEAM_COM_SUM] == 100.0 * 113); /* 113 lattice points with d2 <= 36 */
  bh_frame_free(in);

  /* Sub-pixel: the same disc splatted by (0.25, 0.75) in float32. */
  assert_int_equal(bh_start(h, BEAM_DT_F32, 2, shp, &d), 0);
  in = bh_frame_new(BEAM_DT_F32, 2, shp, 1);
  splat_disc(in->data, H, W, 33, 30, 6, 100, 0.25, 0.75);
  assert_int_equal(bh_process(h, in), 0);
  v = bh_last(h, 0)->data;
  if (!(fabs(v[BEAM_COM_SHIFT_X] - 3.25) <= 1e-6) || !(fabs(v[BEAM_COM_SHIFT_Y] + 1.25) <= 1e-6))
    fail_msg("sub-pixel shift %.9g %.9g, want 3.25 -1.25", v[BEAM_COM_SHIFT_X], v[BEAM_COM_SHIFT_Y]);
  bh_frame_free(in);
  bh_free(&h);
}

static void test_empty_and_corrupt(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("com");
  bh_set(cfg, "r", "5");
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {16, 16};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U8, 2, shp, 0);
  ((uint8_t *)in->data)[0] = 200; /* outside the disc only */
  assert_int_equal(bh_process(h, in), 0);
  const double *v = bh_last(h, 0)->data;
  for (int k = 0; k < BEAM_COM_SUM; k++)
    assert_true(isnan(v[k]));
  assert_true(v[BEAM_COM_SUM] == 0.0);
  in->flags = BEAM_FLAG_CORRUPT;
  assert_int_equal(bh_process(h, in), 0);
  v = bh_last(h, 0)->data;
  for (int k = 0; k < BEAM_COM_NVAL; k++)
    assert_true(isnan(v[k]));
  bh_frame_free(in);
  bh_free(&h);
}

/* Membership written again from the documentation. */
static int inside(int x, int y, double cx, double cy, double r, double ri, const uint8_t *bad, int W) {
  double d2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
  return d2 <= r * r && !(ri > 0 && d2 <= ri * ri) && !(bad && bad[y * W + x]);
}

static void run_random(beam_dtype_t dt, int series_mask) {
  enum { H = 61, W = 77 };
  static uint8_t bad[H * W];
  static uint32_t pm[H * W];
  for (int i = 0; i < H * W; i++) {
    bad[i] = (i * 2654435761u) % 13 == 0;
    pm[i] = bad[i] ? 2u : 0u; /* DECTRIS "dead" bit */
  }
  uint32_t shp[2] = {H, W};
  char path[300];
  beam_cnode_t *cfg = bh_stage_cfg("com");
  bh_set(cfg, "cx", "40.5");
  bh_set(cfg, "cy", "28.25");
  bh_set(cfg, "r", "25.5");
  bh_set(cfg, "ri", "4");
  if (series_mask) {
    bh_set(cfg, "mask", "series");
  } else {
    snprintf(path, sizeof path, "%s/bad.npy", bh_tmpdir());
    assert_int_equal(bh_write_npy(path, "|u1", 2, shp, bad, sizeof bad), 0);
    bh_set(cfg, "mask", path);
  }
  bh_t *h = make(cfg, 0, NULL);
  if (series_mask) {
    beam_series_array_t *sa = &h->series.arrays[0];
    snprintf(sa->name, sizeof sa->name, "pixel_mask");
    sa->arr.dtype = BEAM_DT_U32;
    sa->arr.ndim = 2;
    sa->arr.shape[0] = H, sa->arr.shape[1] = W;
    sa->arr.data = pm;
    h->series.narrays = 1;
  }
  beam_diag_t d = {0};
  if (bh_start(h, dt, 2, shp, &d) != 0)
    fail_msg("start: %s", d.msg);
  h->series.narrays = 0; /* the stage kept a copy, not the array */
  beam_com_host_t *host = h->st.priv;
  for (int fr = 0; fr < 3; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, (uint64_t)fr);
    bh_frame_fill(in, 11 + (uint64_t)fr, dt == BEAM_DT_U8 || dt == BEAM_DT_I8 ? 100 : 60000);
    assert_int_equal(bh_process(h, in), 0);
    const double *v = bh_last(h, 0)->data;
    double ref[3], ind[3] = {0, 0, 0}, mag = 0;
    beam_com_sums_ref(host, dt, in->data, ref);
    for (int y = 0; y < H; y++)
      for (int x = 0; x < W; x++) {
        if (!inside(x, y, 40.5, 28.25, 25.5, 4, bad, W))
          continue;
        double px;
        switch (dt) {
        case BEAM_DT_U8: px = ((uint8_t *)in->data)[y * W + x]; break;
        case BEAM_DT_I8: px = ((int8_t *)in->data)[y * W + x]; break;
        case BEAM_DT_U16: px = ((uint16_t *)in->data)[y * W + x]; break;
        case BEAM_DT_U32: px = ((uint32_t *)in->data)[y * W + x]; break;
        case BEAM_DT_F64: px = ((double *)in->data)[y * W + x]; break;
        default: px = ((float *)in->data)[y * W + x]; break;
        }
        ind[0] += px, ind[1] += px * x, ind[2] += px * y, mag += fabs(px);
      }
    int exact = dt != BEAM_DT_F32 && dt != BEAM_DT_F64;
    double want_x = ind[1] / ind[0], want_y = ind[2] / ind[0];
    double tol = exact ? 0.0 : 1e-12 * mag * W / fabs(ind[0]);
    if (!(fabs(v[BEAM_COM_X] - want_x) <= tol) || !(fabs(v[BEAM_COM_Y] - want_y) <= tol) ||
        !(fabs(ref[1] / ref[0] - want_x) <= tol) || !(fabs(ref[2] / ref[0] - want_y) <= tol))
      fail_msg("%s frame %d: com (%.17g, %.17g), ref (%.17g, %.17g), independent (%.17g, %.17g)",
               beam_dtype_name(dt), fr, v[0], v[1], ref[1] / ref[0], ref[2] / ref[0], want_x, want_y);
    assert_true(fabs(v[BEAM_COM_SHIFT_X] - (v[BEAM_COM_X] - 40.5)) == 0.0);
    bh_frame_free(in);
  }
  bh_free(&h);
}

static void test_random_u8(void **state) { run_random(BEAM_DT_U8, 0); }
static void test_random_i8(void **state) { run_random(BEAM_DT_I8, 1); }
static void test_random_u16(void **state) { run_random(BEAM_DT_U16, 1); }
static void test_random_u32(void **state) { run_random(BEAM_DT_U32, 0); }
static void test_random_f32(void **state) { run_random(BEAM_DT_F32, 0); }
static void test_random_f64(void **state) { run_random(BEAM_DT_F64, 1); }

/* Runs longer than the 128-pixel integer chunks (full chunks and a tail)
 * at the largest pixel values: exactly the reference. */
static void run_long_rows(beam_dtype_t dt) {
  enum { H = 9, W = 300 };
  beam_cnode_t *cfg = bh_stage_cfg("com");
  bh_set(cfg, "ri", "20");
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, shp, &d), 0);
  beam_com_host_t *host = h->st.priv;
  beam_frame_t *in = bh_frame_new(dt, 2, shp, 0);
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 0)
      bh_frame_fill(in, 5, dt == BEAM_DT_U8 ? 255 : 65535);
    else
      for (size_t i = 0; i < (size_t)H * W; i++) { /* every pixel at its maximum */
        if (dt == BEAM_DT_U8)
          ((uint8_t *)in->data)[i] = 255;
        else
          ((uint16_t *)in->data)[i] = 65535;
      }
    double a[3], b[3];
    beam_com_sums_cpu(host, dt, in->data, a);
    beam_com_sums_ref(host, dt, in->data, b);
    for (int k = 0; k < 3; k++)
      if (a[k] != b[k])
        fail_msg("%s pass %d sum %d: fast %.17g ref %.17g", beam_dtype_name(dt), pass, k, a[k], b[k]);
  }
  bh_frame_free(in);
  bh_free(&h);
}

static void test_long_rows_u8(void **state) { run_long_rows(BEAM_DT_U8); }
static void test_long_rows_u16(void **state) { run_long_rows(BEAM_DT_U16); }

/* A started stage with a ny x nx scan whose shift buffers the test fills. */
static bh_t *maps_stage(uint32_t ny, uint32_t nx, const char *rot, const char *flip, beam_com_host_t **host) {
  beam_cnode_t *cfg = bh_stage_cfg("com");
  char s[64];
  snprintf(s, sizeof s, "[%u, %u]", ny, nx);
  bh_set(cfg, "scan_shape", s);
  bh_set(cfg, "scan_rotation", rot);
  bh_set(cfg, "flip_y", flip);
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {8, 8};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 2);
  assert_string_equal(h->st.outs[1].name, "maps");
  assert_int_equal(h->st.outs[1].shape[0], BEAM_COM_NMAPS);
  assert_int_equal(h->st.outs[1].shape[1], ny);
  assert_int_equal(h->st.outs[1].shape[2], nx);
  *host = h->st.priv;
  return h;
}

static void expect_near(const float *a, size_t n, double want, double tol, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!(fabs(a[i] - want) <= tol))
      fail_msg("%s[%zu] = %.9g, want %.9g", what, i, a[i], want);
}

static void test_maps_ramp_and_rotation(void **state) {
  enum { NY = 5, NX = 7, N = NY * NX };
  beam_com_host_t *c;
  bh_t *h = maps_stage(NY, NX, "0", "false", &c);
  static float out[BEAM_COM_NMAPS * N];
  /* shift_x = 0.3 ix - 0.1 iy, shift_y = 0.5 iy + 0.2 ix: divergence 0.8,
   * curl d(sy)/dx - d(sx)/dy = 0.2 + 0.1, exact with any stencil. */
  for (int iy = 0; iy < NY; iy++)
    for (int ix = 0; ix < NX; ix++) {
      c->sx[iy * NX + ix] = 0.3 * ix - 0.1 * iy;
      c->sy[iy * NX + ix] = 0.5 * iy + 0.2 * ix;
    }
  beam_com_compute_maps(c, out);
  expect_near(out + BEAM_COM_M_DIV * N, N, 0.8, 1e-6, "divergence");
  expect_near(out + BEAM_COM_M_CURL * N, N, 0.3, 1e-6, "curl");
  assert_true(fabs(out[BEAM_COM_M_FIELD_X * N + 8] - (0.3 * 1 - 0.1 * 1)) <= 1e-7);
  assert_true(fabs(out[BEAM_COM_M_MAG * N + 8] - hypot(0.2, 0.7)) <= 1e-7);
  bh_free(&h);

  /* scan_rotation 90, flip_y: y' = -sy; field_y = sx, field_x = -y' = sy
   * (LiberTEM: y = cos y' + sin x, x = -sin y' + cos x). */
  h = maps_stage(NY, NX, "90", "true", &c);
  for (int i = 0; i < N; i++)
    c->sx[i] = 1.5, c->sy[i] = -0.25;
  c->sx[3] = NAN; /* a position not scanned: NaN there, its neighbours' stencils too */
  c->sy[3] = NAN;
  beam_com_compute_maps(c, out);
  for (int i = 0; i < N; i++) {
    if (i == 3) {
      assert_true(isnan(out[BEAM_COM_M_FIELD_X * N + i]) && isnan(out[BEAM_COM_M_IDPC * N + i]));
      continue;
    }
    assert_true(fabs(out[BEAM_COM_M_FIELD_Y * N + i] - 1.5) <= 1e-6);
    assert_true(fabs(out[BEAM_COM_M_FIELD_X * N + i] + 0.25) <= 1e-6);
    if (i != 2 && i != 4 && i != 10)
      assert_true(fabs(out[BEAM_COM_M_DIV * N + i]) <= 1e-6);
  }
  assert_true(isnan(out[BEAM_COM_M_DIV * N + 2]) && isnan(out[BEAM_COM_M_DIV * N + 10]));
  bh_free(&h);
}

static void test_maps_idpc(void **state) {
  enum { NY = 16, NX = 24, N = NY * NX };
  beam_com_host_t *c;
  bh_t *h = maps_stage(NY, NX, "0", "false", &c);
  static float out[BEAM_COM_NMAPS * N];
  /* phi = cos(2 pi 2 ix / NX) + 0.5 sin(2 pi (ix / NX + 3 iy / NY)): the
   * field is its exact gradient, so iDPC returns phi (its mean is 0). */
  double phi[N];
  for (int iy = 0; iy < NY; iy++)
    for (int ix = 0; ix < NX; ix++) {
      double a = 2 * M_PI * 2 * ix / NX, b = 2 * M_PI * ((double)ix / NX + 3.0 * iy / NY);
      int i = iy * NX + ix;
      phi[i] = cos(a) + 0.5 * sin(b);
      c->sx[i] = -sin(a) * 2 * M_PI * 2 / NX + 0.5 * cos(b) * 2 * M_PI / NX;
      c->sy[i] = 0.5 * cos(b) * 2 * M_PI * 3 / NY;
    }
  beam_com_compute_maps(c, out);
  for (int i = 0; i < N; i++)
    if (!(fabs(out[BEAM_COM_M_IDPC * N + i] - phi[i]) <= 1e-5))
      fail_msg("idpc[%d] = %.9g, want %.9g", i, out[BEAM_COM_M_IDPC * N + i], phi[i]);
  bh_free(&h);
}

/* Scan shape from the series metadata; FINAL | INCOMPLETE when positions
 * were never scanned, FINAL alone when all were, PARTIAL every N frames. */
static void test_scan_from_series(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("com");
  bh_set(cfg, "image_every", "4");
  bh_set(cfg, "idpc", "false");
  bh_t *h = make(cfg, 0, NULL);
  static char meta[] = "{\"detector\": \"beamd-sim\", \"scan_shape\": [2, 3]}";
  h->series.meta_json = meta;
  h->series.meta_len = strlen(meta);
  uint32_t shp[2] = {9, 9};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 2);
  assert_int_equal(h->st.outs[1].shape[0], BEAM_COM_NMAPS - 1);
  assert_int_equal(h->st.outs[1].shape[1], 2);
  assert_int_equal(h->st.outs[1].shape[2], 3);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  for (int fr = 0; fr < 5; fr++) {
    in->frame_id = (uint64_t)fr;
    ((uint16_t *)in->data)[fr] = 7; /* along row 0: x = fr */
    assert_int_equal(bh_process(h, in), 0);
  }
  const beam_frame_t *m = bh_last(h, 1);
  assert_non_null(m);
  assert_int_equal(m->flags, BEAM_FLAG_PARTIAL);
  assert_int_equal(bh_end(h), 0);
  m = bh_last(h, 1);
  assert_int_equal(m->flags, BEAM_FLAG_FINAL | BEAM_FLAG_INCOMPLETE);
  const float *fx = m->data;
  /* frame 1: one pixel of 7 at x = 1 plus frame 0's at x = 0: com x = 0.5,
   * reference 4: shift -3.5 at position (0, 1). */
  assert_true(fx[1] == -3.5f);
  assert_true(isnan(fx[5])); /* position 5 never scanned */
  /* A full series: FINAL alone. */
  bh_clear(h);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  for (int fr = 0; fr < 6; fr++) {
    in->frame_id = (uint64_t)fr;
    assert_int_equal(bh_process(h, in), 0);
  }
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(bh_last(h, 1)->flags, BEAM_FLAG_FINAL);
  /* Lost frames: INCOMPLETE even when every position came. */
  h->st.end_missing = 2;
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(bh_last(h, 1)->flags, BEAM_FLAG_FINAL | BEAM_FLAG_INCOMPLETE);
  h->st.end_missing = 0;
  /* Bad metadata is refused at start. */
  static char bad[] = "{\"scan_shape\": [0, 3]}";
  h->series.meta_json = bad;
  h->series.meta_len = strlen(bad);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "scan_shape"));
  h->series.meta_json = NULL;
  h->series.meta_len = 0;
  bh_frame_free(in);
  bh_free(&h);
}

static void test_config_errors(void **state) {
  static const struct {
    const char *k1, *v1, *k2, *v2, *msg;
  } cases[] = {
      {"r", "0", NULL, NULL, "r must be > 0"},
      {"r", "5", "ri", "5", "ri must be >= 0 and < r"},
      {"cx", "3", NULL, NULL, "give both cx and cy"},
      {"mask", "/nonexistent/m.npy", NULL, NULL, "com: mask:"},
      {"scan_shape", "[5000, 5000]", NULL, NULL, "exceeds"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    beam_cnode_t *cfg = bh_stage_cfg("com");
    bh_set(cfg, cases[i].k1, cases[i].v1);
    if (cases[i].k2)
      bh_set(cfg, cases[i].k2, cases[i].v2);
    beam_cfg_errs_t errs = {0};
    /* The mask case must reach the stage: skip the loader's file check. */
    assert_int_equal(beam_cfg_validate_flags(cfg, beam_com_params, "stage", &errs, BEAM_CFG_NO_FILE_CHECK), 0);
    beam_cfg_errs_free(&errs);
    bh_t *h;
    beam_diag_t d = {0};
    int rc = bh_new(&h, &beam_com_cpu_ops, cfg, &d);
    if (rc >= 0 || !strstr(d.msg, cases[i].msg))
      fail_msg("case %zu: rc %d, \"%s\"", i, rc, d.msg);
    bh_free(&h);
  }
  /* The schema refuses these before the stage sees them. */
  static const char *const bad[][2] = {
      {"scan_shape", "[0, 4]"}, {"r", "-1"}, {"scan_rotation", "400"}, {"flip_y", "maybe"},
      {"image_every", "0"},     {"rr", "3"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    beam_cnode_t *cfg = bh_stage_cfg("com");
    bh_set(cfg, bad[i][0], bad[i][1]);
    char msg[256];
    if (bh_validate(cfg, beam_com_params, msg, sizeof msg) == 0)
      fail_msg("%s: %s validated", bad[i][0], bad[i][1]);
    beam_cnode_free(cfg);
  }
}

static void test_start_errors(void **state) {
  uint32_t shp[2] = {16, 16}, shp3[3] = {2, 16, 16}, small[2] = {8, 8};
  beam_diag_t d = {0};
  beam_cnode_t *cfg = bh_stage_cfg("com");
  bh_set(cfg, "cx", "100");
  bh_set(cfg, "cy", "100");
  bh_set(cfg, "r", "3");
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "no pixel"));
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 3, shp3, &d), BEAM_ESHAPE);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_C64, 2, shp, &d), BEAM_ESHAPE);
  bh_free(&h);

  cfg = bh_stage_cfg("com");
  bh_set(cfg, "mask", "series");
  h = make(cfg, 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "pixel_mask"));
  bh_free(&h);

  static uint8_t m[64];
  char path[300];
  snprintf(path, sizeof path, "%s/m8.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(path, "|u1", 2, small, m, sizeof m), 0);
  cfg = bh_stage_cfg("com");
  bh_set(cfg, "mask", path);
  h = make(cfg, 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "mask has shape [8, 8]"));
  /* A frame that does not match the series is refused, not read. */
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, small, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  assert_int_equal(bh_process(h, in), BEAM_ESHAPE);
  bh_frame_free(in);
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_disc),     cmocka_unit_test(test_empty_and_corrupt),
      cmocka_unit_test(test_random_u8),      cmocka_unit_test(test_random_i8),
      cmocka_unit_test(test_random_u16),     cmocka_unit_test(test_random_u32),
      cmocka_unit_test(test_random_f32),     cmocka_unit_test(test_random_f64),
      cmocka_unit_test(test_long_rows_u8),   cmocka_unit_test(test_long_rows_u16),
      cmocka_unit_test(test_maps_ramp_and_rotation), cmocka_unit_test(test_maps_idpc),
      cmocka_unit_test(test_scan_from_series), cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_start_errors),
  };
  return beam_run_tests(tests, NULL, NULL);
}
