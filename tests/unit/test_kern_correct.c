/* Stage kind `correct`, CPU backend: hand-computed pixels, the fast loop
 * against the reference loop and against an independent double-precision
 * oracle, input checks at start and file errors at init. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/h5array.h"
#include "pipeline/kern/correct.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/stage_harness.h"

static char *tmp_path(const char *name) {
  static char buf[8][256];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, 256, "%s/%s", bh_tmpdir(), name);
  return p;
}

static bh_t *make(beam_cnode_t *cfg, int expect_rc, const char *expect_msg) {
  return bh_make(cfg, beam_correct_params, &beam_correct_cpu_ops, expect_rc, expect_msg);
}

/* 2 x 3 frame, every rule once:
 *   raw   = 100 200 300 / 400 65535 50
 *   dark  =  10  20  30 /  40    50 60
 *   flat  =   1   4 0.5 /   0     1  1     (flat 0 -> bad)
 *   mask  =   0   0   0 /   0     0  1     (mask -> bad)
 *   saturation 60000 (65535 -> bad), threshold 50: (200-20)/4 = 45 -> 0
 *   bad_value -1 (below the threshold, yet kept: thresholds skip bad pixels) */
static void test_hand_computed(void **state) {
  uint32_t shp[2] = {2, 3};
  float dark[6] = {10, 20, 30, 40, 50, 60}, flat[6] = {1, 4, 0.5f, 0, 1, 1};
  uint8_t mask[6] = {0, 0, 0, 0, 0, 1};
  assert_int_equal(bh_write_npy(tmp_path("d.npy"), "<f4", 2, shp, dark, sizeof dark), 0);
  assert_int_equal(bh_write_npy(tmp_path("f.npy"), "<f4", 2, shp, flat, sizeof flat), 0);
  assert_int_equal(bh_write_npy(tmp_path("m.npy"), "|u1", 2, shp, mask, sizeof mask), 0);
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "dark", tmp_path("d.npy"));
  bh_set(cfg, "flat", tmp_path("f.npy"));
  bh_set(cfg, "mask", tmp_path("m.npy"));
  bh_set(cfg, "saturation", "60000");
  bh_set(cfg, "threshold", "50");
  bh_set(cfg, "bad_value", "-1");
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 1);
  assert_string_equal(h->st.outs[0].name, "frame");
  assert_int_equal(h->st.outs[0].dtype, BEAM_DT_F32);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 7);
  uint16_t raw[6] = {100, 200, 300, 400, 65535, 50};
  memcpy(in->data, raw, sizeof raw);
  in->flags = BEAM_FLAG_BAD;
  assert_int_equal(bh_process(h, in), 0);
  assert_int_equal(h->nres, 1);
  const float *o = h->res[0]->data;
  float want[6] = {90.0f, 0.0f, 540.0f, -1.0f, -1.0f, -1.0f};
  for (int i = 0; i < 6; i++)
    if (!(o[i] == want[i]))
      fail_msg("pixel %d: got %g, want %g", i, o[i], want[i]);
  assert_int_equal(h->res[0]->frame_id, 7);
  assert_true(h->res[0]->flags & BEAM_FLAG_BAD); /* passed through */
  assert_int_equal(h->res[0]->nbytes, 6 * sizeof(float));
  bh_frame_free(in);
  bh_free(&h);
}

/* No files: out = raw exactly, NaN bad_value through the schema. */
static void test_no_files_identity(void **state) {
  uint32_t shp[2] = {4, 5};
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "saturation", "1000");
  bh_set(cfg, "bad_value", "nan");
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U32, 2, shp, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U32, 2, shp, 1);
  bh_frame_fill(in, 3, 2000);
  assert_int_equal(bh_process(h, in), 0);
  const uint32_t *r = in->data;
  const float *o = h->res[0]->data;
  for (int i = 0; i < 20; i++) {
    if (r[i] >= 1000)
      assert_true(isnan(o[i]));
    else
      assert_true(o[i] == (float)r[i]);
  }
  bh_frame_free(in);
  bh_free(&h);
}

/* Random data: the fast loop equals the reference loop bit for bit, and for
 * uint16 input with an integer dark it also equals an independent oracle,
 * (float)(((double)raw - dark) / flat). Why exact: a uint16 is exact in
 * float32, raw - dark is an integer below 2^24 so the float subtraction is
 * exact, and the one float division is correctly rounded; computing the
 * quotient in double and rounding it once to float gives the same correctly
 * rounded value (53 >= 2 x 24 + 2 bits makes the double rounding harmless). */
static void run_random(beam_dtype_t dt, int integer_dark) {
  enum { H = 61, W = 97, N = H * W };
  uint32_t shp[2] = {H, W};
  static float dark[N], flat[N];
  static uint8_t mask[N];
  uint64_t s = 12345;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    dark[i] = integer_dark ? (float)(int)(u * 300) : (float)(u * 300.7);
    flat[i] = (float)(0.5 + u * 1.3);
    mask[i] = (s >> 7) % 53 == 0;
  }
  flat[5] = -1.0f;
  flat[6] = NAN;
  dark[7] = INFINITY;
  assert_int_equal(bh_write_npy(tmp_path("rd.npy"), "<f4", 2, shp, dark, sizeof dark), 0);
  assert_int_equal(bh_write_npy(tmp_path("rf.npy"), "<f4", 2, shp, flat, sizeof flat), 0);
  assert_int_equal(bh_write_npy(tmp_path("rm.npy"), "|b1", 2, shp, mask, sizeof mask), 0);
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "dark", tmp_path("rd.npy"));
  bh_set(cfg, "flat", tmp_path("rf.npy"));
  bh_set(cfg, "mask", tmp_path("rm.npy"));
  bh_set(cfg, "threshold", "3.5");
  bh_set(cfg, "saturation", "60000");
  bh_set(cfg, "bad_value", "nan");
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, shp, &d), 0);
  beam_correct_conf_t conf;
  assert_int_equal(beam_correct_conf_load(&conf, h->cfg, &d), 0);
  static float ref[N];
  for (int fr = 0; fr < 3; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, (uint64_t)fr);
    bh_frame_fill(in, 100 + (uint64_t)fr, 65535);
    assert_int_equal(bh_process(h, in), 0);
    const float *o = h->res[h->nres - 1]->data;
    beam_correct_ref(&conf, dt, in->data, N, ref);
    assert_int_equal(bh_bits_differ(o, ref, sizeof ref), 0);
    if (dt == BEAM_DT_U16 && integer_dark) {
      const uint16_t *r = in->data;
      size_t nbad = 0;
      for (int i = 0; i < N; i++) {
        int bad = mask[i] || !(flat[i] > 0) || !isfinite(flat[i]) || !isfinite(dark[i]) || r[i] >= 60000;
        if (bad) {
          nbad++;
          if (!isnan(o[i]))
            fail_msg("pixel %d should be bad", i);
          continue;
        }
        float want = (float)(((double)r[i] - dark[i]) / flat[i]);
        if ((double)want < 3.5)
          want = 0.0f;
        if (!(o[i] == want))
          fail_msg("pixel %d: got %.9g, want %.9g", i, o[i], want);
      }
      assert_true(nbad > 3);
    }
    bh_frame_free(in);
  }
  beam_correct_conf_free(&conf);
  bh_free(&h);
}

static void test_random_u16(void **state) { run_random(BEAM_DT_U16, 1); }
static void test_random_u16_float_dark(void **state) { run_random(BEAM_DT_U16, 0); }
static void test_random_u32(void **state) { run_random(BEAM_DT_U32, 0); }
static void test_random_f32(void **state) { run_random(BEAM_DT_F32, 0); }

/* No dark, flat or mask: the table-free fast path must give the reference
 * loop's bits, including values right at the threshold and saturation. */
static void run_plain(beam_dtype_t dt) {
  enum { H = 37, W = 53, N = H * W };
  uint32_t shp[2] = {H, W};
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "threshold", "3.5");
  bh_set(cfg, "saturation", "60000");
  bh_set(cfg, "bad_value", "-1");
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, shp, &d), 0);
  beam_correct_conf_t conf;
  assert_int_equal(beam_correct_conf_load(&conf, h->cfg, &d), 0);
  static float ref[N];
  beam_frame_t *in = bh_frame_new(dt, 2, shp, 0);
  bh_frame_fill(in, 7, 65535);
  if (dt == BEAM_DT_U16) {
    uint16_t *r = in->data;
    r[0] = 3; r[1] = 4; r[2] = 59999; r[3] = 60000; r[4] = 65535;
  } else {
    float *r = in->data;
    r[0] = 3.4999998f; r[1] = 3.5f; r[2] = 59999.996f; r[3] = 60000.0f; r[4] = -0.0f;
  }
  assert_int_equal(bh_process(h, in), 0);
  const float *o = h->res[h->nres - 1]->data;
  beam_correct_ref(&conf, dt, in->data, N, ref);
  assert_int_equal(bh_bits_differ(o, ref, sizeof ref), 0);
  assert_true(o[0] == 0.0f && o[3] == -1.0f);
  bh_frame_free(in);
  beam_correct_conf_free(&conf);
  bh_free(&h);
}

static void test_plain_u16(void **state) { run_plain(BEAM_DT_U16); }
static void test_plain_f32(void **state) { run_plain(BEAM_DT_F32); }

static void test_rejects_dtype(void **state) {
  uint32_t shp[2] = {4, 4};
  bh_t *h = make(bh_stage_cfg("correct"), 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_I16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "int16"));
  assert_non_null(strstr(d.msg, "uint16, uint32 or float32"));
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_F64, 2, shp, &d), BEAM_ESHAPE);
  /* A later good series still starts. */
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  bh_free(&h);
}

static void test_rejects_shape(void **state) {
  uint32_t fshape[2] = {4, 4};
  float flat[16];
  for (int i = 0; i < 16; i++)
    flat[i] = 1;
  assert_int_equal(bh_write_npy(tmp_path("f44.npy"), "<f4", 2, fshape, flat, sizeof flat), 0);
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "flat", tmp_path("f44.npy"));
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  uint32_t shp[2] = {4, 5};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "flat has shape [4, 4] but the frames are [4, 5]"));
  bh_free(&h);
}

static void test_missing_file(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "dark", "/nonexistent/dark.npy");
  bh_t *h = make(cfg, BEAM_EIO, "/nonexistent/dark.npy");
  bh_free(&h);
  /* An HDF5 path with a missing dataset names both. */
  beam_h5array_register();
  uint32_t shp[2] = {2, 2};
  float v[4] = {1, 2, 3, 4};
  assert_int_equal(bh_write_npy(tmp_path("ok.npy"), "<f4", 2, shp, v, sizeof v), 0);
  cfg = bh_stage_cfg("correct");
  bh_set(cfg, "mask", tmp_path("nothere.h5"));
  h = make(cfg, BEAM_EIO, "nothere.h5");
  bh_free(&h);
}

static void test_corrupt_frame(void **state) {
  uint32_t shp[2] = {3, 3};
  bh_t *h = make(bh_stage_cfg("correct"), 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 4);
  in->flags = BEAM_FLAG_CORRUPT;
  in->nbytes = 0;
  assert_int_equal(bh_process(h, in), 0);
  assert_int_equal(h->nres, 1);
  assert_true(h->res[0]->flags & BEAM_FLAG_CORRUPT);
  for (int i = 0; i < 9; i++)
    assert_true(isnan(((float *)h->res[0]->data)[i]));
  /* A short payload without the flag is rejected, not read past. */
  in->flags = 0;
  in->nbytes = 4;
  assert_int_equal(bh_process(h, in), BEAM_ESHAPE);
  assert_int_equal(h->nres, 1);
  bh_frame_free(in);
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),   cmocka_unit_test(test_no_files_identity),
      cmocka_unit_test(test_random_u16),      cmocka_unit_test(test_random_u16_float_dark),
      cmocka_unit_test(test_random_u32),      cmocka_unit_test(test_random_f32),
      cmocka_unit_test(test_plain_u16),       cmocka_unit_test(test_plain_f32),
      cmocka_unit_test(test_rejects_dtype),   cmocka_unit_test(test_rejects_shape),
      cmocka_unit_test(test_missing_file),    cmocka_unit_test(test_corrupt_frame),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
