/* CPU vs CUDA for `correct`: bit-identical by construction (same float32
 * operations in the same order, explicitly rounded on the device), so the
 * tolerance is exact. Files, then the series' own arrays (mask: series,
 * flat: series) with gap_value auto and an integer gap value, over several
 * series so the per-series tables are rebuilt. Skips without a GPU. */
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

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

/* The dark, flat and mask files both tests read: a group setup, so that
 * either test runs alone (tests/run-unit.sh runs each in its own process). */
static int write_files(void **state) {
  (void)state;
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
  if (bh_write_npy(dark_p, "<f4", 2, shp, dark, sizeof dark) ||
      bh_write_npy(flat_p, "<f4", 2, shp, flat, sizeof flat) ||
      bh_write_npy(mask_p, "|u1", 2, shp, mask, sizeof mask))
    return -1;
  return 0;
}

static void test_xcheck_correct(void **state) {
  uint32_t shp[2] = {H, W};
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

/* ---- series arrays and gap values ---------------------------------------- */

static const char *gap_text = "auto";

static beam_cnode_t *cfg_series(void) {
  beam_cnode_t *c = bh_stage_cfg("correct");
  bh_set(c, "dark", dark_p);
  bh_set(c, "flat", "series");
  bh_set(c, "mask", "series");
  bh_set(c, "gap_value", gap_text);
  bh_set(c, "threshold", "1.5");
  bh_set(c, "bad_value", "-3");
  return c;
}

/* Both sides start on the same series (bh_start's own carries no arrays). */
static void start_both(xpair_t *x, const beam_series_t *s) {
  bh_t *hs[2] = {x->cpu, x->gpu};
  for (int k = 0; k < 2; k++) {
    beam_indesc_t in;
    memset(&in, 0, sizeof in);
    in.dtype = s->dtype;
    in.ndim = s->ndim;
    memcpy(in.shape, s->shape, s->ndim * sizeof *s->shape);
    beam_diag_t d = {0};
    hs[k]->st.nouts = 0;
    if (hs[k]->st.ops->start(&hs[k]->st, s, &in, &d) != 0)
      fail_msg("%s start: %s", k ? "cuda" : "cpu", d.msg);
  }
}

static beam_series_t *make_series(uint64_t id, beam_dtype_t dt, const uint32_t *shp, uint64_t seed) {
  static float ff[N];
  static uint32_t mask[N];
  uint64_t s = seed;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    ff[i] = (float)(0.6 + 0.9 * u);
    mask[i] = (s >> 9) % 89 == 0 ? 1u << ((s >> 19) % 32) : 0;
  }
  ff[5] = 0;
  ff[6] = -1;
  beam_series_t *ser = beam_series_new(id, dt, 2, shp, NULL, 0);
  assert_non_null(ser);
  assert_int_equal(beam_series_add_array(ser, "pixel_mask", BEAM_DT_U32, 2, shp, mask, sizeof mask), 0);
  assert_int_equal(beam_series_add_array(ser, "flatfield", BEAM_DT_F32, 2, shp, ff, sizeof ff), 0);
  return ser;
}

static void test_xcheck_correct_series(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_correct_cuda_ops, beam_correct_params, cfg_series);
  uint32_t shp[2] = {H, W};
  static const char *gaps[] = {"auto", "1000", "none"};
  static const beam_dtype_t dts[] = {BEAM_DT_U16, BEAM_DT_U32, BEAM_DT_F32};
  for (size_t g = 0; g < 3; g++) {
    gap_text = gaps[g];
    xpair_t x;
    xpair_new(&x, &beam_correct_cpu_ops, &beam_correct_cuda_ops, beam_correct_params, cfg_series);
    /* One stage pair over every dtype: each series start rebuilds (and for
     * uint32 grows) the tables from that series' arrays. */
    for (size_t k = 0; k < 3; k++) {
      beam_series_t *ser = make_series(10 * g + k, dts[k], shp, 500 + 7 * k);
      start_both(&x, ser);
      beam_series_unref(&ser); /* the stages keep tables, not the arrays */
      for (uint64_t fr = 0; fr < 3; fr++) {
        beam_frame_t *in = bh_frame_new(dts[k], 2, shp, fr);
        bh_frame_fill(in, 77 * k + fr, dts[k] == BEAM_DT_U32 ? 4e9 : 65535);
        /* gap candidates: the dtype's top value and the integer 1000 */
        for (size_t i = fr; i < (size_t)N; i += 131) {
          int top = (i / 131) % 2 == 0;
          if (dts[k] == BEAM_DT_U16)
            ((uint16_t *)in->data)[i] = top ? 65535 : 1000;
          else if (dts[k] == BEAM_DT_U32)
            ((uint32_t *)in->data)[i] = top ? 4294967295u : 1000;
          else
            ((float *)in->data)[i] = top ? 65535.0f : 1000.0f;
        }
        xpair_process(&x, in);
        bh_frame_free(in);
      }
    }
    xpair_end(&x);
    xpair_expect_identical(&x);
    xpair_free(&x);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_xcheck_correct),
                                     cmocka_unit_test(test_xcheck_correct_series)};
  return beam_run_tests(tests, write_files, NULL);
}
