/* CPU vs CUDA for `xpcs_multitau`. Integer frames are correlated in exact
 * integer arithmetic on both backends, so every result (g2, lags, info,
 * g_num, ip, if; partial and final) must be bit-identical. Float frames
 * are summed in different orders: element-wise |gpu - cpu| <= 1e-12 |cpu|.
 * Bad frames (BAD flag, a CORRUPT frame, a NaN pixel in float input) are
 * included. Skips without a device (after checking the clean refusal).
 * normalization per_pixel is checked the same way (g2_err included). */
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_multitau.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

enum { H = 96, W = 128, N = 150 };
static char lpath[256];
static int per_pixel;

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("xpcs_multitau"), *rois = bh_map();
  bh_set(rois, "file", lpath);
  bh_put(c, "rois", rois);
  bh_set(c, "levels", "5");
  bh_set(c, "buffers", "8");
  bh_set(c, "publish_every", "40");
  bh_set(c, "intensities", "true");
  if (per_pixel)
    bh_set(c, "normalization", "per_pixel");
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

static void run(beam_dtype_t dt) {
  write_labels();
  xpair_t x;
  xpair_new(&x, &beam_xpcs_multitau_cpu_ops, &beam_xpcs_multitau_cuda_ops, beam_xpcs_multitau_params, cfg_of);
  uint32_t shp[2] = {H, W};
  xpair_start(&x, dt, 2, shp);
  for (uint64_t k = 0; k < N; k++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, k);
    bh_frame_fill(in, 77 + k, dt == BEAM_DT_F32 ? 20.0 : 3000.0);
    if (k % 17 == 3)
      in->flags |= BEAM_FLAG_BAD;
    if (k == 50) {
      in->flags |= BEAM_FLAG_CORRUPT;
      in->nbytes = 0;
    }
    if (k == 77 && dt == BEAM_DT_F32)
      ((float *)in->data)[40 * W + 70] = NAN; /* inside an ROI */
    if (k == 30 || k == 31)
      in->missing_before = k == 30 ? 3 : 1; /* frames lost before these: absent */
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  if (dt != BEAM_DT_F32) {
    xpair_expect_identical(&x);
  } else {
    assert_int_equal(x.cpu->nres, x.gpu->nres);
    for (size_t i = 0; i < x.cpu->nres; i++) {
      const beam_frame_t *c = x.cpu->res[i], *g = x.gpu->res[i];
      assert_int_equal(x.cpu->res_out[i], x.gpu->res_out[i]);
      assert_int_equal(c->nbytes, g->nbytes);
      assert_int_equal(c->flags, g->flags);
      if (x.cpu->res_out[i] == BEAM_XMT_OUT_INFO) {
        assert_memory_equal(c->data, g->data, c->nbytes);
        continue;
      }
      const double *a = c->data, *b = g->data;
      for (size_t k = 0; k < c->nbytes / sizeof(double); k++)
        if (!(fabs(a[k] - b[k]) <= 1e-12 * fabs(a[k])))
          fail_msg("result %zu element %zu: cpu %.17g cuda %.17g", i, k, a[k], b[k]);
    }
  }
  /* the run produced real rows, not an empty truncation */
  const int64_t *info = NULL;
  for (size_t i = 0; i < x.cpu->nres; i++)
    if (x.cpu->res_out[i] == BEAM_XMT_OUT_INFO)
      info = x.cpu->res[i]->data;
  assert_non_null(info);
  assert_true(info[BEAM_XMT_INFO_ROWS] > 8);
  xpair_free(&x);
}

static void test_u16(void **state) {
  if (!bh_gpu_available()) {
    write_labels();
    xcheck_expect_no_device(&beam_xpcs_multitau_cuda_ops, beam_xpcs_multitau_params, cfg_of);
  }
  run(BEAM_DT_U16);
}

static void test_i32(void **state) {
  if (!bh_gpu_available())
    skip();
  run(BEAM_DT_I32);
}

static void test_f32(void **state) {
  if (!bh_gpu_available())
    skip();
  run(BEAM_DT_F32);
}

static void test_per_pixel_u16(void **state) {
  if (!bh_gpu_available())
    skip();
  per_pixel = 1;
  run(BEAM_DT_U16);
  per_pixel = 0;
}

static void test_per_pixel_f32(void **state) {
  if (!bh_gpu_available())
    skip();
  per_pixel = 1;
  run(BEAM_DT_F32);
  per_pixel = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_u16),
      cmocka_unit_test(test_i32),
      cmocka_unit_test(test_f32),
      cmocka_unit_test(test_per_pixel_u16),
      cmocka_unit_test(test_per_pixel_f32),
  };
  return beam_run_tests(tests, NULL, NULL);
}
