/* CPU vs CUDA for `roi_sum`. The GPU sums per-block partials in double and
 * then adds the partials, an order different from the CPU's, so:
 *   integer pixels, unit weights: exact (every partial sum is an integer
 *     below 2^53);
 *   float pixels or weight masks: |gpu - cpu| <= 1e-12 x sum |pixel x weight|.
 * The scan image is float32 of those sums and is checked the same way
 * after rounding (exact, or within one float32 ulp). Skips without a GPU. */
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/roi_sum.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

enum { H = 256, W = 256 };
static char wpath[256], mpath[256];
static int use_weights, use_mask;

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("roi_sum");
  if (use_weights) {
    beam_cnode_t *m = bh_map();
    bh_set(m, "file", wpath);
    bh_put(c, "masks", m);
  } else {
    beam_cnode_t *rois = bh_seq(), *r = bh_map();
    bh_set(r, "name", "bf");
    bh_set(r, "shape", "disk");
    bh_set(r, "radius", "20");
    bh_push(rois, r);
    r = bh_map();
    bh_set(r, "name", "adf");
    bh_set(r, "shape", "annulus");
    bh_set(r, "radii", "[40, 120]");
    bh_push(rois, r);
    r = bh_map();
    bh_set(r, "name", "corner");
    bh_set(r, "shape", "rect");
    bh_set(r, "rect", "[0, 0, 3, 2]");
    bh_push(rois, r);
    bh_put(c, "rois", rois);
  }
  if (use_mask)
    bh_set(c, "mask", mpath);
  bh_set(c, "scan_shape", "[4, 5]");
  bh_set(c, "image_every", "7");
  return c;
}

static double abs_mass(const beam_frame_t *in, size_t i) {
  (void)i;
  size_t n = beam_frame_elems(in);
  double s = 0;
  for (size_t k = 0; k < n; k++) {
    double v = in->dtype == BEAM_DT_F32 ? ((float *)in->data)[k]
               : in->dtype == BEAM_DT_F64 ? ((double *)in->data)[k]
                                           : (double)((uint16_t *)in->data)[k];
    s += fabs(v);
  }
  return s;
}

static void run(beam_dtype_t dt, int weights) {
  use_weights = weights;
  xpair_t x;
  xpair_new(&x, &beam_roi_sum_cpu_ops, &beam_roi_sum_cuda_ops, beam_roi_sum_params, cfg_of);
  uint32_t shp[2] = {H, W};
  xpair_start(&x, dt, 2, shp);
  double wmax = weights ? 2.0 : 1.0;
  for (uint64_t fr = 0; fr < 23; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, fr);
    bh_frame_fill(in, 31 * fr + 5, 65535);
    if (fr == 9)
      in->flags = BEAM_FLAG_CORRUPT;
    xpair_process(&x, in);
    const beam_frame_t *c = x.cpu->res[x.cpu->nres - 1], *g = x.gpu->res[x.gpu->nres - 1];
    if (x.cpu->res_out[x.cpu->nres - 1] == 1) { /* an image came last; sums are before it */
      c = x.cpu->res[x.cpu->nres - 2];
      g = x.gpu->res[x.gpu->nres - 2];
    }
    size_t nroi = c->shape[0];
    double exact = (dt == BEAM_DT_U16 && !weights);
    double mass = abs_mass(in, 0) * wmax;
    for (size_t r = 0; r < nroi; r++) {
      double a = ((double *)c->data)[r], b = ((double *)g->data)[r];
      if (fr == 9) {
        assert_true(isnan(a) && isnan(b));
        continue;
      }
      double tol = exact ? 0.0 : 1e-12 * mass;
      if (!(fabs(a - b) <= tol))
        fail_msg("frame %llu roi %zu: cpu %.17g cuda %.17g (tol %.3g)", (unsigned long long)fr, r, a, b, tol);
    }
    bh_frame_free(in);
  }
  xpair_end(&x);
  assert_int_equal(x.cpu->nres, x.gpu->nres);
  /* images: 23 frames, every 7 -> 3 partial + 1 final */
  size_t nimg = 0;
  for (size_t i = 0; i < x.cpu->nres; i++) {
    if (x.cpu->res_out[i] != 1)
      continue;
    nimg++;
    assert_int_equal(x.gpu->res_out[i], 1);
    assert_int_equal(x.cpu->res[i]->flags, x.gpu->res[i]->flags);
    const float *a = x.cpu->res[i]->data, *b = x.gpu->res[i]->data;
    size_t n = x.cpu->res[i]->nbytes / sizeof(float);
    for (size_t k = 0; k < n; k++) {
      if (isnan(a[k]) && isnan(b[k]))
        continue;
      double tol = (dt == BEAM_DT_U16 && !weights) ? 0.0 : fabs((double)a[k]) * 1.2e-7;
      if (!(fabs((double)a[k] - b[k]) <= tol))
        fail_msg("image %zu pixel %zu: cpu %.9g cuda %.9g", i, k, a[k], b[k]);
    }
  }
  assert_int_equal(nimg, 4);
  xpair_free(&x);
}

static void test_geometry_u16(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_roi_sum_cuda_ops, beam_roi_sum_params, cfg_of);
  run(BEAM_DT_U16, 0);
}

static void test_geometry_f32(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_roi_sum_cuda_ops, beam_roi_sum_params, cfg_of);
  run(BEAM_DT_F32, 0);
}

static void test_weights_f64(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_roi_sum_cuda_ops, beam_roi_sum_params, cfg_of);
  static float w[3 * H * W];
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    w[i] = (i * 2654435761u) % 7 == 0 ? 0.0f : (float)((i * 40503u) % 1000) / 500.0f;
  uint32_t shp3[3] = {3, H, W};
  snprintf(wpath, sizeof wpath, "%s/w.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(wpath, "<f4", 3, shp3, w, sizeof w), 0);
  run(BEAM_DT_F64, 1);
}

/* A bad-pixel mask (what mask: series resolves to as well): the host
 * leaves its pixels out of the index lists both backends sum. */
static void test_masked_u16(void **state) {
  static uint8_t m[H * W];
  for (size_t i = 0; i < sizeof m; i++)
    m[i] = (i * 2654435761u) % 19 == 0 || i % W == 128; /* dead pixels and a gap column */
  uint32_t shp[2] = {H, W};
  snprintf(mpath, sizeof mpath, "%s/m.npy", bh_tmpdir());
  assert_int_equal(bh_write_npy(mpath, "|u1", 2, shp, m, sizeof m), 0);
  use_mask = 1;
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_roi_sum_cuda_ops, beam_roi_sum_params, cfg_of);
  run(BEAM_DT_U16, 0);
  use_mask = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_geometry_u16),
      cmocka_unit_test(test_geometry_f32),
      cmocka_unit_test(test_weights_f64),
      cmocka_unit_test(test_masked_u16),
  };
  return beam_run_tests(tests, NULL, NULL);
}
