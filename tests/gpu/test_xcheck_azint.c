/* CPU vs CUDA for `azint`. Both apply the same host-built CSR matrices
 * with double accumulators; the CPU adds each row's terms in one chain,
 * the device in 32 strided lane chains joined by a shuffle tree (and may
 * contract to FMA), so every published value (intensity, sigma, count,
 * cake) must agree within 1e-12 relative: the frames here are
 * non-negative, so every sum is of non-negative terms and rounding cannot
 * be amplified by cancellation. The axes (radial, chi) come from the host
 * tables and must be identical. Corrupt frames give NaN on both. Skips
 * without a GPU. */
#include "pipeline/kern/azint.h"
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

enum { H = 64, W = 80 };
static char mpath[256];
static const char *split = "bbox";

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("azint");
  bh_set(c, "dist", "0.1");
  bh_set(c, "poni1", "0.004");
  bh_set(c, "poni2", "0.0065");
  bh_set(c, "rot1", "0.04");
  bh_set(c, "rot2", "-0.02");
  bh_set(c, "rot3", "0.3");
  bh_set(c, "wavelength", "1e-10");
  bh_set(c, "pixel1", "1e-4");
  bh_set(c, "pixel2", "1.2e-4");
  bh_set(c, "npt", "50");
  bh_set(c, "npt_azim", "12");
  bh_set(c, "split", split);
  bh_set(c, "polarization_factor", "0.9");
  bh_set(c, "error_model", "poisson");
  bh_set(c, "dummy", "65535");
  bh_set(c, "mask", mpath);
  return c;
}

static void run(beam_dtype_t dt) {
  static uint8_t m[H * W];
  for (size_t i = 0; i < H * W; i++)
    m[i] = (i * 2654435761u) % 31 == 0;
  uint32_t shp[2] = {H, W};
  snprintf(mpath, sizeof mpath, "%s/mask.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(mpath, "|u1", 2, shp, m, sizeof m), 0);
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_azint_cuda_ops, beam_azint_params, cfg_of);
  xpair_t x;
  xpair_new(&x, &beam_azint_cpu_ops, &beam_azint_cuda_ops, beam_azint_params, cfg_of);
  xpair_start(&x, dt, 2, shp);
  for (uint64_t fr = 0; fr < 6; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, fr);
    bh_frame_fill(in, 17 * fr + 3, 5000);
    if (fr == 4)
      in->flags = BEAM_FLAG_CORRUPT;
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  assert_int_equal(x.cpu->nres, x.gpu->nres);
  assert_true(x.cpu->nres > 0);
  for (size_t i = 0; i < x.cpu->nres; i++) {
    const beam_frame_t *c = x.cpu->res[i], *g = x.gpu->res[i];
    assert_int_equal(x.cpu->res_out[i], x.gpu->res_out[i]);
    assert_int_equal(c->frame_id, g->frame_id);
    assert_int_equal(c->nbytes, g->nbytes);
    const double *a = c->data, *b = g->data;
    for (size_t k = 0; k < c->nbytes / sizeof(double); k++) {
      if (isnan(a[k]) && isnan(b[k]))
        continue;
      double tol = 1e-12 * fabs(a[k]);
      if (!(fabs(a[k] - b[k]) <= tol))
        fail_msg("result %zu (output %u, frame %llu) bin %zu: cpu %.17g cuda %.17g",
                 i, x.cpu->res_out[i], (unsigned long long)c->frame_id, k, a[k], b[k]);
    }
  }
  xpair_free(&x);
}

static void test_bbox_u16(void **state) {
  split = "bbox";
  run(BEAM_DT_U16);
}

static void test_none_f32(void **state) {
  split = "none";
  run(BEAM_DT_F32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bbox_u16),
      cmocka_unit_test(test_none_f32),
  };
  return beam_run_tests(tests, NULL, NULL);
}
