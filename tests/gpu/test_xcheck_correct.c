/* CPU vs CUDA for `correct`: bit-identical by construction (same float32
 * operations in the same order, explicitly rounded on the device), so the
 * tolerance is exact. Skips without a GPU. */
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"

enum { H = 257, W = 509, N = H * W };
static char dark_p[256], flat_p[256], mask_p[256];

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("correct");
  bh_set(c, "dark", dark_p);
  bh_set(c, "flat", flat_p);
  bh_set(c, "mask", mask_p);
  bh_set(c, "threshold", "2.5");
  bh_set(c, "saturation", "50000");
  bh_set(c, "bad_value", "nan");
  return c;
}

static void test_xcheck_correct(void **state) {
  static float dark[N], flat[N];
  static uint8_t mask[N];
  uint64_t s = 99;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    dark[i] = (float)(u * 200.3);
    flat[i] = (float)(0.2 + 1.7 * u);
    mask[i] = (s >> 9) % 97 == 0;
  }
  flat[3] = 0;
  uint32_t shp[2] = {H, W};
  snprintf(dark_p, sizeof dark_p, "%s/d.npy", bh_tmpdir());
  snprintf(flat_p, sizeof flat_p, "%s/f.npy", bh_tmpdir());
  snprintf(mask_p, sizeof mask_p, "%s/m.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(dark_p, "<f4", 2, shp, dark, sizeof dark), 0);
  assert_int_equal(bh_write_npy(flat_p, "<f4", 2, shp, flat, sizeof flat), 0);
  assert_int_equal(bh_write_npy(mask_p, "|u1", 2, shp, mask, sizeof mask), 0);
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_correct_cuda_ops, beam_correct_params, cfg_of);
  static const beam_dtype_t dts[] = {BEAM_DT_U16, BEAM_DT_U32, BEAM_DT_F32};
  for (size_t k = 0; k < 3; k++) {
    xpair_t x;
    xpair_new(&x, &beam_correct_cpu_ops, &beam_correct_cuda_ops, beam_correct_params, cfg_of);
    xpair_start(&x, dts[k], 2, shp);
    for (uint64_t fr = 0; fr < 4; fr++) {
      beam_frame_t *in = bh_frame_new(dts[k], 2, shp, fr);
      bh_frame_fill(in, 1000 * k + fr, dts[k] == BEAM_DT_U32 ? 4e9 : 65535);
      if (fr == 2)
        in->flags = BEAM_FLAG_CORRUPT;
      xpair_process(&x, in);
      bh_frame_free(in);
    }
    xpair_end(&x);
    xpair_expect_identical(&x);
    xpair_free(&x);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_xcheck_correct)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
