/* CPU vs CUDA for `bin` and `preview`'s kernel: bit-identical by
 * construction (double accumulation in the same order, one rounding to
 * float), so the tolerance is exact. Skips without a GPU. */
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

static const char *mode = "sum";

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("bin");
  bh_set(c, "crop", "[3, 5, 500, 700]");
  bh_set(c, "factor", "3");
  bh_set(c, "mode", mode);
  return c;
}

static void test_xcheck_bin(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_bin_cuda_ops, beam_bin_params, cfg_of);
  static const beam_dtype_t dts[] = {BEAM_DT_U8,  BEAM_DT_U16, BEAM_DT_U32, BEAM_DT_U64, BEAM_DT_I8,
                                     BEAM_DT_I16, BEAM_DT_I32, BEAM_DT_I64, BEAM_DT_F32, BEAM_DT_F64};
  uint32_t shp[2] = {511, 719};
  for (int m = 0; m < 2; m++) {
    mode = m ? "mean" : "sum";
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
      xpair_t x;
      xpair_new(&x, &beam_bin_cpu_ops, &beam_bin_cuda_ops, beam_bin_params, cfg_of);
      xpair_start(&x, dts[k], 2, shp);
      for (uint64_t fr = 0; fr < 3; fr++) {
        beam_frame_t *in = bh_frame_new(dts[k], 2, shp, fr);
        bh_frame_fill(in, 7 * k + fr, dts[k] == BEAM_DT_U8 || dts[k] == BEAM_DT_I8 ? 100 : 1e9);
        xpair_process(&x, in);
        bh_frame_free(in);
      }
      xpair_expect_identical(&x);
      xpair_free(&x);
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_xcheck_bin)};
  return beam_run_tests(tests, NULL, NULL);
}
