/* CPU vs CUDA for `com`. The device sums S, Sx, Sy per 4096-pixel block
 * and then over blocks, the CPU per row run in four lanes, so:
 *   integer pixels: S, Sx, Sy are integers below 2^53 on both sides, hence
 *     exact; the values (and the maps, computed on the host from them by
 *     the same code) are bit for bit identical;
 *   float pixels: each sum is within 2 n 2^-53 sum |v| (x_max for Sx) of
 *     the exact one on either side; the test allows 1e-12 relative on the
 *     sum and 1e-9 pixels on the centre of mass (data >= 0, n ~ 15k
 *     pixels: the bound is ~3e-12 x 160 pixels), and compares the maps
 *     within 1e-6 x (1 + |value|) (float32 output of doubles that differ
 *     by ~1e-9, the iDPC a linear map of them).
 * A CORRUPT frame gives NaN on both. Skips without a GPU. */
#include "pipeline/kern/com.h"
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

enum { H = 128, W = 160, NY = 4, NX = 5 };

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("com");
  bh_set(c, "cx", "81.5");
  bh_set(c, "cy", "60.25");
  bh_set(c, "r", "70"); /* rows up to 141 pixels: the CPU's 128-pixel chunks and tails */
  bh_set(c, "ri", "3");
  bh_set(c, "scan_shape", "[4, 5]");
  bh_set(c, "scan_rotation", "17");
  bh_set(c, "flip_y", "true");
  bh_set(c, "image_every", "7");
  return c;
}

static void run(beam_dtype_t dt) {
  xpair_t x;
  xpair_new(&x, &beam_com_cpu_ops, &beam_com_cuda_ops, beam_com_params, cfg_of);
  uint32_t shp[2] = {H, W};
  xpair_start(&x, dt, 2, shp);
  int exact = dt != BEAM_DT_F32 && dt != BEAM_DT_F64;
  for (uint64_t fr = 0; fr < NY * NX; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, fr);
    bh_frame_fill(in, 97 * fr + 3, dt == BEAM_DT_U8 ? 255 : 65535);
    if (fr == 6)
      in->flags = BEAM_FLAG_CORRUPT;
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  assert_int_equal(x.cpu->nres, x.gpu->nres);
  size_t nimg = 0;
  for (size_t i = 0; i < x.cpu->nres; i++) {
    const beam_frame_t *c = x.cpu->res[i], *g = x.gpu->res[i];
    assert_int_equal(x.cpu->res_out[i], x.gpu->res_out[i]);
    assert_int_equal(c->flags, g->flags);
    if (exact) {
      size_t bad = bh_bits_differ(c->data, g->data, c->nbytes);
      if (bad)
        fail_msg("result %zu: %zu bytes differ", i, bad);
      nimg += x.cpu->res_out[i] == 1;
      continue;
    }
    if (x.cpu->res_out[i] == 0) {
      const double *a = c->data, *b = g->data;
      if (c->frame_id == 6) {
        for (int k = 0; k < BEAM_COM_NVAL; k++)
          assert_true(isnan(a[k]) && isnan(b[k]));
        continue;
      }
      for (int k = 0; k < BEAM_COM_NVAL; k++) {
        double tol = k == BEAM_COM_SUM ? 1e-12 * fabs(a[k]) : 1e-9;
        if (!(fabs(a[k] - b[k]) <= tol))
          fail_msg("frame %llu value %d: cpu %.17g cuda %.17g (tol %.3g)",
                   (unsigned long long)c->frame_id, k, a[k], b[k], tol);
      }
    } else {
      nimg++;
      const float *a = c->data, *b = g->data;
      for (size_t k = 0; k < c->nbytes / sizeof(float); k++) {
        if (isnan(a[k]) && isnan(b[k]))
          continue;
        double tol = 1e-6 * (1.0 + fabs((double)a[k]));
        if (!(fabs((double)a[k] - b[k]) <= tol))
          fail_msg("maps %zu element %zu: cpu %.9g cuda %.9g", i, k, a[k], b[k]);
      }
    }
  }
  assert_int_equal(nimg, 3); /* 20 frames, every 7: 2 partial + the final */
  const beam_frame_t *fin = bh_last(x.cpu, 1);
  assert_non_null(fin);
  assert_int_equal(fin->flags, BEAM_FLAG_FINAL | BEAM_FLAG_INCOMPLETE); /* frame 6 CORRUPT */
  xpair_free(&x);
}

static void test_u16(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_com_cuda_ops, beam_com_params, cfg_of);
  run(BEAM_DT_U16);
}

static void test_u8(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_com_cuda_ops, beam_com_params, cfg_of);
  run(BEAM_DT_U8);
}

static void test_f32(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_com_cuda_ops, beam_com_params, cfg_of);
  run(BEAM_DT_F32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_u16),
      cmocka_unit_test(test_u8),
      cmocka_unit_test(test_f32),
  };
  return beam_run_tests(tests, NULL, NULL);
}
