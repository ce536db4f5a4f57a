/* Stage kind `bin`, CPU backend: hand-computed sums and means, crop, the
 * row-accumulator loop against the four-loop reference for every dtype
 * (bit-identical: same double summation order), and rejected shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/bin.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/stage_harness.h"

static bh_t *make(beam_cnode_t *cfg, int expect_rc, const char *expect_msg) {
  return bh_make(cfg, beam_bin_params, &beam_bin_cpu_ops, expect_rc, expect_msg);
}

static beam_frame_t *ramp(uint32_t H, uint32_t W) {
  uint32_t shp[2] = {H, W};
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 3);
  for (uint32_t i = 0; i < H * W; i++)
    ((uint16_t *)in->data)[i] = (uint16_t)i;
  return in;
}

/* 4x5 ramp 0..19, factor 2: blocks {0,1,5,6} = 12, {2,3,7,8} = 20,
 * {10,11,15,16} = 52, {12,13,17,18} = 60; column 4 is a partial block. */
static void test_sum_and_mean(void **state) {
  for (int mean = 0; mean < 2; mean++) {
    beam_cnode_t *cfg = bh_stage_cfg("bin");
    bh_set(cfg, "mode", mean ? "mean" : "sum");
    bh_t *h = make(cfg, 0, NULL);
    beam_frame_t *in = ramp(4, 5);
    beam_diag_t d = {0};
    assert_int_equal(bh_start(h, BEAM_DT_U16, 2, in->shape, &d), 0);
    assert_int_equal(h->st.outs[0].shape[0], 2);
    assert_int_equal(h->st.outs[0].shape[1], 2);
    in->flags = BEAM_FLAG_BAD;
    assert_int_equal(bh_process(h, in), 0);
    const float *o = h->res[0]->data;
    float want[4] = {12, 20, 52, 60};
    for (int i = 0; i < 4; i++)
      assert_true(o[i] == (mean ? want[i] / 4 : want[i]));
    assert_true(h->res[0]->flags & BEAM_FLAG_BAD);
    assert_int_equal(h->res[0]->frame_id, 3);
    bh_frame_free(in);
    bh_free(&h);
  }
}

/* crop [y0 1, x0 1, h 3, w 4] of the 4x5 ramp, factor 2 -> 1x2:
 * {6,7,11,12} = 36, {8,9,13,14} = 44. */
static void test_crop(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("bin");
  bh_set(cfg, "crop", "[1, 1, 3, 4]");
  bh_t *h = make(cfg, 0, NULL);
  beam_frame_t *in = ramp(4, 5);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, in->shape, &d), 0);
  assert_int_equal(bh_process(h, in), 0);
  const float *o = h->res[0]->data;
  assert_int_equal(h->res[0]->shape[0], 1);
  assert_int_equal(h->res[0]->shape[1], 2);
  assert_true(o[0] == 36 && o[1] == 44);
  bh_frame_free(in);
  bh_free(&h);
}

static void test_random_all_dtypes(void **state) {
  static const beam_dtype_t dts[] = {BEAM_DT_U8,  BEAM_DT_U16, BEAM_DT_U32, BEAM_DT_U64, BEAM_DT_I8,
                                     BEAM_DT_I16, BEAM_DT_I32, BEAM_DT_I64, BEAM_DT_F32, BEAM_DT_F64};
  uint32_t shp[2] = {53, 71};
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    for (int mean = 0; mean < 2; mean++) {
      beam_cnode_t *cfg = bh_stage_cfg("bin");
      bh_set(cfg, "factor", "3");
      bh_set(cfg, "crop", "[2, 1, 50, 68]");
      bh_set(cfg, "mode", mean ? "mean" : "sum");
      bh_t *h = make(cfg, 0, NULL);
      beam_diag_t d = {0};
      assert_int_equal(bh_start(h, dts[k], 2, shp, &d), 0);
      beam_bin_geom_t g = {dts[k], 53, 71, 2, 1, 16, 22, 3, mean};
      beam_frame_t *in = bh_frame_new(dts[k], 2, shp, 0);
      double maxv = dts[k] == BEAM_DT_U8 || dts[k] == BEAM_DT_I8 ? 100 : 1e6;
      bh_frame_fill(in, 9 + k, maxv);
      assert_int_equal(bh_process(h, in), 0);
      static float ref[16 * 22];
      beam_bin2d_ref(&g, in->data, ref);
      assert_int_equal(h->res[0]->nbytes, sizeof ref);
      if (bh_bits_differ(h->res[0]->data, ref, sizeof ref) != 0)
        fail_msg("dtype %s mean %d differs from the reference", beam_dtype_name(dts[k]), mean);
      bh_frame_free(in);
      bh_free(&h);
    }
  }
}

static void test_rejects(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("bin");
  bh_set(cfg, "crop", "[10, 0, 8, 8]");
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  uint32_t shp[2] = {16, 16};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "does not fit in the [16, 16] frame"));
  uint32_t big[2] = {18, 16};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, big, &d), 0);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_C128, 2, big, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "complex128"));
  uint32_t s3[3] = {1, 18, 16};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 3, s3, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "2-D"));
  bh_free(&h);

  cfg = bh_stage_cfg("bin");
  bh_set(cfg, "factor", "8");
  h = make(cfg, 0, NULL);
  uint32_t small[2] = {4, 100};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, small, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "smaller than one 8x8 block"));
  bh_free(&h);

  cfg = bh_stage_cfg("bin");
  bh_set(cfg, "crop", "[1, 2, 3]");
  h = make(cfg, BEAM_ECONFIG, "crop needs 4 integers");
  bh_free(&h);
}

static void test_corrupt(void **state) {
  bh_t *h = make(bh_stage_cfg("bin"), 0, NULL);
  beam_frame_t *in = ramp(4, 4);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, in->shape, &d), 0);
  in->flags = BEAM_FLAG_CORRUPT;
  in->nbytes = 0;
  assert_int_equal(bh_process(h, in), 0);
  assert_true(h->res[0]->flags & BEAM_FLAG_CORRUPT);
  assert_true(isnan(((float *)h->res[0]->data)[3]));
  bh_frame_free(in);
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sum_and_mean), cmocka_unit_test(test_crop),
      cmocka_unit_test(test_random_all_dtypes), cmocka_unit_test(test_rejects),
      cmocka_unit_test(test_corrupt),
  };
  return beam_run_tests(tests, NULL, NULL);
}
