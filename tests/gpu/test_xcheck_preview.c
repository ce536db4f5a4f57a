/* CPU vs CUDA for `preview`: the same gate decisions (shared code) and the
 * same pixels (the bit-identical bin mean kernel), including the FINAL
 * frame at series end. Skips without a GPU. */
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("preview");
  bh_set(c, "rate", "10");
  bh_set(c, "max_size", "256");
  return c;
}

static void test_xcheck_preview(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_preview_cuda_ops, beam_preview_params, cfg_of);
  uint32_t shp[2] = {1030, 777}; /* factor 5 -> 206 x 155 */
  xpair_t x;
  xpair_new(&x, &beam_preview_cpu_ops, &beam_preview_cuda_ops, beam_preview_params, cfg_of);
  xpair_start(&x, BEAM_DT_U32, 2, shp);
  for (uint64_t fr = 0; fr < 12; fr++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_U32, 2, shp, fr);
    bh_frame_fill(in, fr, 1e6);
    in->t_recv_ns = 1000000000ull + fr * 30000000ull; /* 33 Hz in, 10 Hz out */
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  assert_true(x.cpu->nres >= 4);
  assert_true(x.cpu->res[x.cpu->nres - 1]->flags & BEAM_FLAG_FINAL);
  xpair_expect_identical(&x);
  xpair_free(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_xcheck_preview)};
  return beam_run_tests(tests, NULL, NULL);
}
