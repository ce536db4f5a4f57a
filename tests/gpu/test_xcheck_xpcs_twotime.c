/* CPU vs CUDA for `xpcs_twotime`: the same frames (uint16 counts with BAD,
 * CORRUPT and a zero-photon frame; float32 with a NaN pixel) through both
 * backends in every mode and both precisions, with partial results, and
 * with multi-tau levels (num_bufs, num_levels) in mode full. The
 * products are summed in different orders (OpenBLAS vs cuBLAS), so values
 * agree element-wise to |gpu - cpu| <= rtol |cpu| (1e-12 float64, 1e-3
 * float32); NaN cells must sit at the same places, info is identical.
 * Skips without a device (after checking the clean refusal). */
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_twotime.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

enum { H = 96, W = 128 };
static char lpath[256];
static const char *g_mode = "full", *g_prec = "float64", *g_nb = "0", *g_nl = "1";
static int g_exact; /* integer counts in float64: sums exact in any order */

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("xpcs_twotime"), *rois = bh_map();
  bh_set(rois, "file", lpath);
  bh_put(c, "rois", rois);
  bh_set(c, "mode", g_mode);
  bh_set(c, "width", "70");
  bh_set(c, "precision", g_prec);
  bh_set(c, "errors", "true");
  bh_set(c, "publish_every", "90");
  bh_set(c, "num_bufs", g_nb);
  bh_set(c, "num_levels", g_nl);
  return c;
}

static void write_labels(void) {
  static int32_t lab[H * W];
  uint32_t sh[2] = {H, W};
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      double r = hypot(x - 60.0, y - 40.0);
      lab[y * W + x] = r < 5 ? 0 : r < 60 ? 2 + 3 * (int)(r / 6) : 0; /* gapped labels */
    }
  snprintf(lpath, sizeof lpath, "%s/labels.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(lpath, "<i4", 2, sh, lab, sizeof lab), 0);
}

static void compare(const xpair_t *x, double rtol) {
  assert_int_equal(x->cpu->nres, x->gpu->nres);
  for (size_t i = 0; i < x->cpu->nres; i++) {
    const beam_frame_t *c = x->cpu->res[i], *g = x->gpu->res[i];
    assert_int_equal(x->cpu->res_out[i], x->gpu->res_out[i]);
    assert_int_equal(c->nbytes, g->nbytes);
    assert_int_equal(c->flags, g->flags);
    assert_int_equal(c->dtype, g->dtype);
    if (c->dtype == BEAM_DT_I64) {
      assert_memory_equal(c->data, g->data, c->nbytes);
      continue;
    }
    size_t n = c->nbytes / beam_dtype_size(c->dtype), finite = 0;
    for (size_t k = 0; k < n; k++) {
      double a = c->dtype == BEAM_DT_F32 ? ((const float *)c->data)[k] : ((const double *)c->data)[k];
      double b = g->dtype == BEAM_DT_F32 ? ((const float *)g->data)[k] : ((const double *)g->data)[k];
      if (isnan(a) && isnan(b))
        continue;
      finite++;
      if (!(fabs(a - b) <= rtol * fabs(a)))
        fail_msg("result %zu (output %u) element %zu: cpu %.17g cuda %.17g", i, x->cpu->res_out[i], k, a, b);
    }
    assert_true(finite > n / 4);
  }
}

static void run(beam_dtype_t dt, const char *mode, const char *prec) {
  g_mode = mode, g_prec = prec;
  write_labels();
  xpair_t x;
  xpair_new(&x, &beam_xpcs_twotime_cpu_ops, &beam_xpcs_twotime_cuda_ops, beam_xpcs_twotime_params, cfg_of);
  uint32_t shp[2] = {H, W};
  xpair_start(&x, dt, 2, shp);
  for (uint64_t k = 0; k < 200; k++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, k);
    bh_frame_fill(in, 77 + k, dt == BEAM_DT_F32 ? 20.0 : 30.0);
    if (k % 17 == 3)
      in->flags |= BEAM_FLAG_BAD;
    if (k == 50) {
      in->flags |= BEAM_FLAG_CORRUPT;
      in->nbytes = 0;
    }
    if (k == 60 && dt == BEAM_DT_U16)
      memset(in->data, 0, (size_t)H * W * 2); /* zero photons in every ROI */
    if (k == 77 && dt == BEAM_DT_F32)
      ((float *)in->data)[40 * W + 70] = NAN; /* inside an ROI */
    if (k == 30 || k == 31)
      in->missing_before = k == 30 ? 3 : 1; /* frames lost before these: absent */
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  /* float32: products agree to ~1e-5; g2_err, a spread of such values,
   * to ~1e-4 of itself */
  compare(&x, g_exact ? 0 : strcmp(prec, "float32") == 0 ? 1e-3 : 1e-12);
  xpair_free(&x);
}

/* Multi-tau levels: level 0 is the backend's products, levels >= 1 are
 * shared host code. uint16 counts in float64: every sum is an exact
 * integer whatever the order, so the backends agree to the bit (rtol 0). */
static void run_levels(beam_dtype_t dt, const char *prec, const char *nb, const char *nl) {
  g_nb = nb, g_nl = nl, g_exact = dt == BEAM_DT_U16 && strcmp(prec, "float64") == 0;
  run(dt, "full", prec);
  g_nb = "0", g_nl = "1", g_exact = 0;
}

static void test_levels_u16(void **state) {
  if (!bh_gpu_available())
    skip();
  run_levels(BEAM_DT_U16, "float64", "8", "4");
}

static void test_levels_f32_precision32(void **state) {
  if (!bh_gpu_available())
    skip();
  run_levels(BEAM_DT_F32, "float32", "16", "3");
}

static void test_full_u16(void **state) {
  if (!bh_gpu_available()) {
    write_labels();
    xcheck_expect_no_device(&beam_xpcs_twotime_cuda_ops, beam_xpcs_twotime_params, cfg_of);
  }
  run(BEAM_DT_U16, "full", "float64");
}

static void test_band_u16(void **state) {
  if (!bh_gpu_available())
    skip();
  run(BEAM_DT_U16, "band", "float64");
}

static void test_window_f32(void **state) {
  if (!bh_gpu_available())
    skip();
  run(BEAM_DT_F32, "window", "float32");
}

static void test_full_f32_precision32(void **state) {
  if (!bh_gpu_available())
    skip();
  run(BEAM_DT_F32, "full", "float32");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_u16),
      cmocka_unit_test(test_band_u16),
      cmocka_unit_test(test_window_f32),
      cmocka_unit_test(test_full_f32_precision32),
      cmocka_unit_test(test_levels_u16),
      cmocka_unit_test(test_levels_f32_precision32),
  };
  return beam_run_tests(tests, NULL, NULL);
}
