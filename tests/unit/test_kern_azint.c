/* Stage kind `azint`, CPU backend: geometry of an untilted detector against
 * the analytic 2θ = atan(r / dist), χ and q; the rotation convention on a
 * case worked by hand; CSR column sums (every unmasked pixel distributes
 * exactly weight 1 with both splitting modes); a flat frame integrating
 * to its value; threads not changing a bit; .poni files v1 and v2; and
 * configuration errors. pyFAI itself is the oracle of
 * tests/integration/test_azint.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/azint.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/stage_harness.h"

static const char *poni1 = "0.0032", *solid = "false", *npt = "40";

static beam_cnode_t *base_cfg(const char *split, const char *npt_azim) {
  beam_cnode_t *c = bh_stage_cfg("azint");
  bh_set(c, "dist", "0.1");
  bh_set(c, "poni1", poni1);
  bh_set(c, "poni2", "0.0040");
  bh_set(c, "wavelength", "1e-10");
  bh_set(c, "pixel1", "1e-4");
  bh_set(c, "pixel2", "1e-4");
  bh_set(c, "npt", npt);
  bh_set(c, "npt_azim", npt_azim);
  bh_set(c, "split", split);
  bh_set(c, "solid_angle", solid);
  return c;
}

static void test_untilted_geometry(void **state) {
  beam_azint_geom_t g = {.dist = 0.2, .wavelength = 1e-10, .pixel1 = 1e-4, .pixel2 = 1e-4};
  const double pts[][2] = {{0, 0}, {0.01, 0}, {0, 0.03}, {-0.02, 0.05}, {0.1, -0.1}};
  for (size_t i = 0; i < sizeof pts / sizeof *pts; i++) {
    double p1 = pts[i][0], p2 = pts[i][1], tth, chi;
    beam_azint_tth_chi(&g, p1, p2, &tth, &chi);
    double want = atan(hypot(p1, p2) / g.dist);
    assert_true(fabs(tth - want) <= 1e-15);
    if (p1 != 0 || p2 != 0)
      assert_true(fabs(chi - atan2(p1, p2)) <= 1e-15);
    double q = beam_azint_radial(&g, BEAM_AZINT_Q_NM, tth);
    assert_true(fabs(q - 4 * M_PI / 0.1 * sin(want / 2)) <= 1e-12 * (q + 1));
    double cosa = g.dist / sqrt(g.dist * g.dist + p1 * p1 + p2 * p2);
    assert_true(fabs(beam_azint_solid_angle(&g, p1, p2) - cosa * cosa * cosa) <= 1e-15);
  }
  assert_true(fabs(beam_azint_scale(BEAM_AZINT_2TH_DEG) - 180 / M_PI) <= 1e-15);
  /* f = 0: (1 + cos²2θ) / 2; f = 1 at χ = 0 (horizontal): cos²2θ */
  assert_true(fabs(beam_azint_polarization(0.5, 1.0, 0.0) - 0.5 * (1 + cos(0.5) * cos(0.5))) <= 1e-15);
  assert_true(fabs(beam_azint_polarization(0.5, 0.0, 1.0) - cos(0.5) * cos(0.5)) <= 1e-15);
}

/* rot1 alone turns the detector about the slow axis: a point at the PONI
 * (0, 0) then sits at 2θ = |rot1|; rot3 alone only rotates χ. */
static void test_rotations(void **state) {
  beam_azint_geom_t g = {.dist = 0.1, .rot1 = 0.2, .wavelength = 1e-10, .pixel1 = 1e-4, .pixel2 = 1e-4};
  double tth, chi;
  beam_azint_tth_chi(&g, 0, 0, &tth, &chi);
  assert_true(fabs(tth - 0.2) <= 1e-14);
  beam_azint_geom_t h = {.dist = 0.1, .rot3 = 0.3, .wavelength = 1e-10, .pixel1 = 1e-4, .pixel2 = 1e-4};
  double t0, c0, t1, c1;
  beam_azint_tth_chi(&g, 0.01, 0.02, &t0, &c0);
  g.rot1 = 0;
  beam_azint_tth_chi(&g, 0.01, 0.02, &t0, &c0);
  beam_azint_tth_chi(&h, 0.01, 0.02, &t1, &c1);
  assert_true(fabs(t0 - t1) <= 1e-14);
  double dc = remainder(c1 - c0, 2 * M_PI);
  assert_true(fabs(fabs(dc) - 0.3) <= 1e-12);
}

static void check_colsums(const beam_azint_csr_t *m, size_t npix, const uint8_t *bad) {
  double *col = calloc(npix, sizeof *col);
  for (uint32_t r = 0; r < m->nrows; r++) {
    for (uint64_t j = m->ptr[r]; j < m->ptr[r + 1]; j++) {
      assert_true(m->idx[j] < npix);
      if (j > m->ptr[r])
        assert_true(m->idx[j] > m->idx[j - 1]); /* increasing within a row */
      col[m->idx[j]] += m->w[j];
    }
  }
  for (size_t k = 0; k < npix; k++) {
    double want = bad[k] ? 0.0 : 1.0;
    if (!(fabs(col[k] - want) <= 1e-5))
      fail_msg("pixel %zu: weight %.9g, want %g", k, col[k], want);
  }
  free(col);
}

static void test_csr_column_sums(void **state) {
  const char *splits[] = {"none", "bbox"};
  enum { H = 64, W = 80 };
  static uint8_t bad[H * W];
  for (size_t k = 0; k < H * W; k++)
    bad[k] = k % 17 == 0;
  uint32_t shp[2] = {H, W};
  char path[256];
  snprintf(path, sizeof path, "%s/m.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(path, "|u1", 2, shp, bad, sizeof bad), 0);
  /* The PONI off the detector: no pixel box reaches q = 0, where pyFAI's
   * clipping at the lower edge would give the first bin more than the
   * box's overlap (a quirk kept for fidelity, docs/azint.md). */
  poni1 = "-0.002";
  for (int s = 0; s < 2; s++) {
    beam_cnode_t *c = base_cfg(splits[s], "8");
    bh_set(c, "rot1", "0.05");
    bh_set(c, "rot3", "0.5");
    bh_set(c, "mask", path);
    assert_int_equal(bh_validate(c, beam_azint_params, NULL, 0), 0);
    beam_azint_conf_t conf;
    beam_azint_tab_t t = {0};
    beam_diag_t d = {0};
    assert_int_equal(beam_azint_conf_load(&conf, c, &d), 0);
    assert_int_equal(beam_azint_tab_build(&t, &conf, H, W, &conf.mask, &d), 0);
    /* automatic ranges hold every unmasked pixel whole, in 1-D and cake */
    check_colsums(&t.r1, H * W, bad);
    check_colsums(&t.r2, H * W, bad);
    assert_int_equal(t.r2.nrows, 8 * 40);
    beam_azint_tab_free(&t);
    beam_azint_conf_free(&conf);
    beam_cnode_free(c);
  }
  poni1 = "0.0032";
}

static bh_t *started(beam_cnode_t *c, beam_dtype_t dt, uint32_t h, uint32_t w) {
  bh_t *b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  beam_diag_t d = {0};
  uint32_t shp[2] = {h, w};
  if (bh_start(b, dt, 2, shp, &d) != 0)
    fail_msg("start: %s", d.msg);
  return b;
}

/* A flat frame, no solid angle or polarisation: every bin with pixels
 * integrates to the value, whatever the splitting (I = Σc·v / Σc). */
static void test_flat_frame(void **state) {
  const char *splits[] = {"none", "bbox"};
  for (int s = 0; s < 2; s++) {
    beam_cnode_t *c = base_cfg(splits[s], "6");
    bh_set(c, "error_model", "poisson");
    bh_t *b = started(c, BEAM_DT_F32, 48, 64);
    uint32_t shp[2] = {48, 64};
    beam_frame_t *f = bh_frame_new(BEAM_DT_F32, 2, shp, 0);
    for (size_t k = 0; k < 48 * 64; k++)
      ((float *)f->data)[k] = 7.0f;
    assert_int_equal(bh_process(b, f), 0);
    /* outputs: intensity, sigma, count, radial, cake, cake_sigma, cake_count, chi */
    const double *I = bh_last(b, 0)->data, *sg = bh_last(b, 1)->data, *cnt = bh_last(b, 2)->data;
    const double *radial = bh_last(b, 3)->data, *cake = bh_last(b, 4)->data;
    double total = 0;
    for (int k = 0; k < 40; k++) {
      total += cnt[k];
      if (cnt[k] > 0) {
        assert_true(fabs(I[k] - 7.0) <= 1e-12);
        /* sigma = sqrt(Σc² v) / Σc */
        assert_true(sg[k] > 0 && sg[k] <= sqrt(7.0 / cnt[k]) * (1 + 1e-9));
      } else {
        assert_true(I[k] == 0.0);
      }
      if (k)
        assert_true(radial[k] > radial[k - 1]);
    }
    assert_true(fabs(total - 48 * 64) <= 1e-3);
    for (int k = 0; k < 6 * 40; k++)
      assert_true(cake[k] == 0.0 || fabs(cake[k] - 7.0) <= 1e-12);
    bh_frame_free(f);
    bh_free(&b);
  }
}

static void test_threads_identical(void **state) {
  bh_t *b[2];
  const char *th[2] = {"1", "3"};
  uint32_t shp[2] = {50, 70};
  solid = "true";
  for (int i = 0; i < 2; i++) {
    beam_cnode_t *c = base_cfg("bbox", "5");
    bh_set(c, "threads", th[i]);
    bh_set(c, "polarization_factor", "0.8");
    b[i] = started(c, BEAM_DT_U16, 50, 70);
  }
  solid = "false";
  for (uint64_t fr = 0; fr < 3; fr++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, shp, fr);
    bh_frame_fill(f, fr + 1, 1000);
    assert_int_equal(bh_process(b[0], f), 0);
    assert_int_equal(bh_process(b[1], f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(b[0]->nres, b[1]->nres);
  for (size_t i = 0; i < b[0]->nres; i++)
    assert_int_equal(bh_bits_differ(b[0]->res[i]->data, b[1]->res[i]->data, b[0]->res[i]->nbytes), 0);
  bh_free(&b[0]);
  bh_free(&b[1]);
}

/* The CPU backend's loop (norm and count precomputed, rows with an
 * invalid pixel redone) against the plain reference, bit for bit, on
 * float frames with NaN, inf and dummy pixels, and integer ones. */
static void test_fast_equals_reference(void **state) {
  enum { H = 40, W = 56 };
  const beam_dtype_t dts[3] = {BEAM_DT_F32, BEAM_DT_U16, BEAM_DT_I32};
  for (int withd = 0; withd < 2; withd++) {
    beam_cnode_t *c = base_cfg("bbox", "6");
    bh_set(c, "polarization_factor", "0.5");
    if (withd)
      bh_set(c, "dummy", "3");
    assert_int_equal(bh_validate(c, beam_azint_params, NULL, 0), 0);
    beam_azint_conf_t conf;
    beam_azint_tab_t t = {0};
    beam_diag_t d = {0};
    assert_int_equal(beam_azint_conf_load(&conf, c, &d), 0);
    assert_int_equal(beam_azint_tab_build(&t, &conf, H, W, NULL, &d), 0);
    for (int k = 0; k < 3; k++) {
      uint32_t shp[2] = {H, W};
      beam_frame_t *f = bh_frame_new(dts[k], 2, shp, 0);
      bh_frame_fill(f, 5 + k, 20);
      if (dts[k] == BEAM_DT_F32) {
        ((float *)f->data)[7] = NAN;
        ((float *)f->data)[300] = INFINITY;
        ((float *)f->data)[901] = 3.0f;
      }
      const beam_azint_csr_t *m[2] = {&t.r1, &t.r2};
      const double *pre[2] = {t.pre1, t.pre2};
      for (int q = 0; q < 2; q++) {
        size_t n = m[q]->nrows;
        double *buf = calloc(8 * n, sizeof *buf);
        beam_azint_sums_t a = {buf, buf + n, buf + 2 * n, buf + 3 * n};
        beam_azint_sums_t b = {buf + 4 * n, buf + 5 * n, buf + 6 * n, buf + 7 * n};
        beam_azint_csr_apply(m[q], &conf, t.norm, dts[k], f->data, 0, (uint32_t)n, &a);
        beam_azint_csr_apply_fast(m[q], &conf, t.norm, pre[q], dts[k], f->data, 0, (uint32_t)n, &b);
        assert_int_equal(bh_bits_differ(buf, buf + 4 * n, 4 * n * sizeof *buf), 0);
        free(buf);
      }
      bh_frame_free(f);
    }
    beam_azint_tab_free(&t);
    beam_azint_conf_free(&conf);
    beam_cnode_free(c);
  }
}

/* mask: series takes the series' pixel_mask (DECTRIS: uint32, nonzero =
 * bad) and gives what the same mask from a file gives. */
static void test_series_mask(void **state) {
  enum { H = 30, W = 40 };
  static uint32_t m32[H * W];
  static uint8_t m8[H * W];
  for (size_t k = 0; k < H * W; k++)
    m8[k] = (uint8_t)(m32[k] = (k % 7 == 0) ? 4u : 0u);
  uint32_t shp[2] = {H, W};
  char path[256];
  snprintf(path, sizeof path, "%s/sm.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(path, "|u1", 2, shp, m8, sizeof m8), 0);
  beam_cnode_t *c = base_cfg("bbox", "0");
  bh_set(c, "mask", "series");
  bh_t *a = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  beam_series_array_t *sa = &a->series.arrays[0];
  snprintf(sa->name, sizeof sa->name, "pixel_mask");
  sa->arr = (beam_array_t){.dtype = BEAM_DT_U32, .ndim = 2, .shape = {H, W}, .nbytes = sizeof m32,
                           .data = m32};
  a->series.narrays = 1;
  beam_diag_t d = {0};
  assert_int_equal(bh_start(a, BEAM_DT_U16, 2, shp, &d), 0);
  c = base_cfg("bbox", "0");
  bh_set(c, "mask", path);
  bh_t *b = started(c, BEAM_DT_U16, H, W);
  beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  bh_frame_fill(f, 9, 100);
  assert_int_equal(bh_process(a, f), 0);
  assert_int_equal(bh_process(b, f), 0);
  assert_int_equal(a->nres, b->nres);
  for (size_t i = 0; i < a->nres; i++)
    assert_int_equal(bh_bits_differ(a->res[i]->data, b->res[i]->data, a->res[i]->nbytes), 0);
  double total = 0; /* output 1 is count (no sigma without poisson) */
  for (int k = 0; k < 40; k++)
    total += ((const double *)bh_last(a, 1)->data)[k];
  size_t good = 0;
  for (size_t k = 0; k < H * W; k++)
    good += m8[k] == 0;
  assert_true(fabs(total - (double)good) <= 1e-3);
  a->series.narrays = 0; /* the array is this test's */
  bh_frame_free(f);
  bh_free(&a);
  bh_free(&b);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_poni_files(void **state) {
  char p[256];
  beam_azint_geom_t g;
  beam_diag_t d = {0};
  snprintf(p, sizeof p, "%s/v2.poni", bh_tmpdir());
  write_file(p, "# Nota: C-Order, 1 refers to the Y axis, 2 to the X axis \n"
                "poni_version: 2\nDetector: Detector\n"
                "Detector_config: {\"pixel1\": 0.000172, \"pixel2\": 0.00015, \"max_shape\": [96, 128]}\n"
                "Distance: 0.12\nPoni1: 0.0066\nPoni2: 0.0105\nRot1: 0.05\nRot2: -0.03\nRot3: 0.4\n"
                "Wavelength: 1e-10\n");
  assert_int_equal(beam_azint_poni_load(p, &g, &d), 0);
  assert_true(g.pixel1 == 0.000172 && g.pixel2 == 0.00015 && g.dist == 0.12 && g.rot2 == -0.03 &&
              g.wavelength == 1e-10 && g.poni2 == 0.0105);
  snprintf(p, sizeof p, "%s/v1.poni", bh_tmpdir());
  write_file(p, "PixelSize1: 7.5e-05\nPixelSize2: 7.5e-05\nDistance: 0.3\nPoni1: 0.1\nPoni2: 0.1\n"
                "Rot1: 0\nRot2: 0\nRot3: 0\nWavelength: 1.0332e-10\n");
  assert_int_equal(beam_azint_poni_load(p, &g, &d), 0);
  assert_true(g.pixel1 == 7.5e-05 && g.dist == 0.3);
  snprintf(p, sizeof p, "%s/bad.poni", bh_tmpdir());
  write_file(p, "Distance: 0.3\nPoni1: x\n");
  assert_int_equal(beam_azint_poni_load(p, &g, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "Poni1 is not a number"));
  write_file(p, "Distance: 0.3\nPoni1: 0.1\nPoni2: 0.1\nRot1: 0\nRot2: 0\nRot3: 0\nWavelength: 1e-10\n");
  beam_diag_clear(&d);
  assert_int_equal(beam_azint_poni_load(p, &g, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "pixel size"));
  /* beside a poni file, geometry keys are refused (by the schema check
   * with file:line:col in a real config, and by init) */
  beam_cnode_t *c = bh_stage_cfg("azint");
  snprintf(p, sizeof p, "%s/v2.poni", bh_tmpdir());
  bh_set(c, "poni", p);
  bh_set(c, "dist", "0.1");
  bh_set(c, "npt", "10");
  beam_cfg_errs_t e = {0};
  assert_int_equal(bh_validate(c, beam_azint_params, NULL, 0), 0);
  assert_int_equal(beam_azint_check(c, &e), 1);
  beam_cfg_errs_free(&e);
  bh_t *b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, BEAM_ECONFIG, "dist and poni are exclusive");
  bh_free(&b);
}

static void test_bad_config(void **state) {
  beam_cnode_t *c = base_cfg("bbox", "0");
  beam_cnode_t *c2 = bh_stage_cfg("azint");
  bh_set(c2, "npt", "10");
  bh_set(c2, "dist", "0.1");
  beam_cfg_errs_t e = {0};
  assert_int_equal(bh_validate(c2, beam_azint_params, NULL, 0), 0);
  assert_int_equal(beam_azint_check(c2, &e), 5); /* poni1 poni2 wavelength pixel1 pixel2 */
  beam_cfg_errs_free(&e);
  bh_t *b = bh_make(c2, beam_azint_params, &beam_azint_cpu_ops, BEAM_ECONFIG, "required without a poni file");
  bh_free(&b);
  bh_set(c, "radial_range", "[2, 1]");
  b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, BEAM_ECONFIG, "radial_range must be");
  bh_free(&b);
  /* shape errors at start: 3-D frames, a mask of the wrong shape */
  c = base_cfg("none", "0");
  b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  beam_diag_t d = {0};
  uint32_t s3[3] = {2, 8, 8};
  assert_int_equal(bh_start(b, BEAM_DT_U16, 3, s3, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "2-D"));
  bh_free(&b);
  static uint8_t m[16];
  uint32_t ms[2] = {4, 4};
  char path[256];
  snprintf(path, sizeof path, "%s/small.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(path, "|u1", 2, ms, m, sizeof m), 0);
  c = base_cfg("none", "0");
  bh_set(c, "mask", path);
  b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  uint32_t s2[2] = {8, 8};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(b, BEAM_DT_U16, 2, s2, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "mask has shape"));
  bh_free(&b);
  /* every pixel masked: nothing to bin */
  static uint8_t all[64];
  memset(all, 1, sizeof all);
  uint32_t as[2] = {8, 8};
  snprintf(path, sizeof path, "%s/all.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(path, "|u1", 2, as, all, sizeof all), 0);
  c = base_cfg("bbox", "4");
  bh_set(c, "mask", path);
  b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(b, BEAM_DT_U16, 2, s2, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "every pixel"));
  bh_free(&b);
  /* bbox into a million bins: each pixel spans thousands, more entries
   * than BEAM_AZINT_MAX_NNZ; refused at start, before any allocation */
  npt = "1048576";
  c = base_cfg("bbox", "0");
  npt = "40";
  b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  beam_diag_clear(&d);
  uint32_t big[2] = {512, 512};
  int rc = bh_start(b, BEAM_DT_U16, 2, big, &d);
  assert_int_equal(rc, BEAM_ELIMIT);
  assert_non_null(strstr(d.msg, "matrix entries"));
  bh_free(&b);
  /* mask: series without a pixel_mask in the series */
  c = base_cfg("none", "0");
  bh_set(c, "mask", "series");
  b = bh_make(c, beam_azint_params, &beam_azint_cpu_ops, 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(b, BEAM_DT_U16, 2, s2, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "pixel_mask"));
  bh_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_untilted_geometry), cmocka_unit_test(test_rotations),
      cmocka_unit_test(test_csr_column_sums),   cmocka_unit_test(test_flat_frame),
      cmocka_unit_test(test_threads_identical), cmocka_unit_test(test_poni_files),
      cmocka_unit_test(test_fast_equals_reference), cmocka_unit_test(test_series_mask),
      cmocka_unit_test(test_bad_config),
  };
  return beam_run_tests(tests, NULL, NULL);
}
