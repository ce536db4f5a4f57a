/* Stage kind `correct`, CPU backend: hand-computed pixels, the fast loop
 * against the reference loop and against an independent double-precision
 * oracle, input checks at start and file errors at init; series arrays
 * (beam_series_add_array / beam_series_array) and the stage's use of them
 * (mask: series, flat: series), and gap_value. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

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

/* The reference loop's sources for a series of dtype dt and shape shp. */
static void ref_src(const beam_correct_conf_t *conf, const beam_series_t *series, beam_dtype_t dt,
                    uint32_t ndim, const uint32_t *shp, beam_correct_src_t *src) {
  beam_indesc_t in;
  memset(&in, 0, sizeof in);
  in.dtype = dt;
  in.ndim = ndim;
  memcpy(in.shape, shp, ndim * sizeof *shp);
  beam_diag_t d = {0};
  if (beam_correct_src(conf, series, &in, src, &d) != 0)
    fail_msg("beam_correct_src: %s", d.msg);
}

/* Starts h on a real series (bh_start's own series carries no arrays). */
static int start_series(bh_t *h, const beam_series_t *s, beam_diag_t *d) {
  beam_indesc_t in;
  memset(&in, 0, sizeof in);
  in.dtype = s->dtype;
  in.ndim = s->ndim;
  memcpy(in.shape, s->shape, s->ndim * sizeof *s->shape);
  h->st.nouts = 0;
  return h->st.ops->start(&h->st, s, &in, d);
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
  beam_correct_src_t src;
  ref_src(&conf, NULL, dt, 2, shp, &src);
  static float ref[N];
  for (int fr = 0; fr < 3; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, (uint64_t)fr);
    bh_frame_fill(in, 100 + (uint64_t)fr, 65535);
    assert_int_equal(bh_process(h, in), 0);
    const float *o = h->res[h->nres - 1]->data;
    beam_correct_ref(&conf, &src, dt, in->data, N, ref);
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
  beam_correct_src_t src;
  ref_src(&conf, NULL, dt, 2, shp, &src);
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
  beam_correct_ref(&conf, &src, dt, in->data, N, ref);
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

/* ---- series arrays ------------------------------------------------------- */

/* Add, look up, copy semantics, every rejection, the bound, and freeing
 * with the series (the sanitizer build's leak check sees a missed free). */
static void test_series_arrays(void **state) {
  uint32_t shp[2] = {2, 3};
  beam_series_t *s = beam_series_new(5, BEAM_DT_U16, 2, shp, NULL, 0);
  assert_non_null(s);
  assert_int_equal(s->narrays, 0);
  assert_null(beam_series_array(s, "pixel_mask"));
  assert_null(beam_series_array(NULL, "pixel_mask"));
  uint32_t mask[6] = {0, 1, 0, 0, 8, 0};
  assert_int_equal(beam_series_add_array(s, "pixel_mask", BEAM_DT_U32, 2, shp, mask, sizeof mask), 0);
  mask[4] = 99; /* the series holds a copy */
  const beam_series_array_t *a = beam_series_array(s, "pixel_mask");
  assert_non_null(a);
  assert_string_equal(a->name, "pixel_mask");
  assert_int_equal(a->arr.dtype, BEAM_DT_U32);
  assert_int_equal(a->arr.ndim, 2);
  assert_int_equal(a->arr.shape[0], 2);
  assert_int_equal(a->arr.shape[1], 3);
  assert_int_equal(a->arr.nbytes, sizeof mask);
  assert_ptr_not_equal(a->arr.data, mask);
  assert_true(beam_array_get(&a->arr, 1) == 1.0 && beam_array_get(&a->arr, 4) == 8.0);
  assert_null(beam_series_array(s, "pixel_mas"));
  assert_null(beam_series_array(s, "flatfield"));

  /* nbytes must be prod(shape) x dtype size: short, long, wrong dtype. */
  float flat[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_F32, 2, shp, flat, 5 * sizeof(float)), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_F32, 2, shp, flat, 7 * sizeof(float)), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_F64, 2, shp, flat, 6 * sizeof(float)), BEAM_EINVAL);
  assert_null(beam_series_array(s, "flatfield"));
  assert_int_equal(s->narrays, 1);
  /* Names: duplicate, empty, one character too long; the longest fits. */
  assert_int_equal(beam_series_add_array(s, "pixel_mask", BEAM_DT_U32, 2, shp, mask, sizeof mask), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "", BEAM_DT_U32, 2, shp, mask, sizeof mask), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, NULL, BEAM_DT_U32, 2, shp, mask, sizeof mask), BEAM_EINVAL);
  char name[BEAM_SERIES_ARRAY_NAME_MAX + 2];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  assert_int_equal(beam_series_add_array(s, name, BEAM_DT_U32, 2, shp, mask, sizeof mask), BEAM_EINVAL);
  name[BEAM_SERIES_ARRAY_NAME_MAX] = '\0';
  assert_int_equal(beam_series_add_array(s, name, BEAM_DT_U32, 2, shp, mask, sizeof mask), 0);
  assert_non_null(beam_series_array(s, name));
  /* Geometry: ndim 0 or too many, a zero dimension, unknown dtype, no data. */
  uint32_t zero[2] = {2, 0}, big[3] = {65536, 65536, 65536};
  assert_int_equal(beam_series_add_array(s, "x", BEAM_DT_U32, 0, shp, mask, 0), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "x", BEAM_DT_U32, BEAM_MAX_NDIM + 1, shp, mask, sizeof mask), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "x", BEAM_DT_U32, 2, zero, mask, 0), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "x", BEAM_DT_NONE, 2, shp, mask, sizeof mask), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "x", BEAM_DT_U32, 2, shp, NULL, sizeof mask), BEAM_EINVAL);
  assert_int_equal(beam_series_add_array(s, "x", BEAM_DT_U8, 3, big, mask, 0), BEAM_ELIMIT);
  assert_int_equal(s->narrays, 2);
  /* The count-rate table's shape, [N, 2]. */
  uint32_t tshp[2] = {4, 2};
  assert_int_equal(beam_series_add_array(s, "countrate_table", BEAM_DT_F32, 2, tshp, flat, sizeof flat), 0);
  a = beam_series_array(s, "countrate_table");
  assert_non_null(a);
  assert_true(a->arr.shape[0] == 4 && a->arr.shape[1] == 2 && a->arr.nbytes == sizeof flat);
  /* A shared series is immutable. */
  beam_series_t *other = beam_series_ref(s);
  assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_F32, 2, shp, flat, 6 * sizeof(float)), BEAM_ESTATE);
  beam_series_unref(&other);
  assert_null(other);
  /* Bounded count: fill up, then one more is refused. */
  for (unsigned k = s->narrays; k < BEAM_SERIES_MAX_ARRAYS; k++) {
    char nm[16];
    snprintf(nm, sizeof nm, "extra%u", k);
    assert_int_equal(beam_series_add_array(s, nm, BEAM_DT_F32, 1, tshp, flat, 4 * sizeof(float)), 0);
  }
  assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_F32, 2, shp, flat, 6 * sizeof(float)), BEAM_ELIMIT);
  assert_int_equal(s->narrays, BEAM_SERIES_MAX_ARRAYS);
  assert_non_null(beam_series_array(s, "pixel_mask"));
  beam_series_unref(&s);
  assert_null(s);
}

static beam_series_t *series_with(uint64_t id, beam_dtype_t dt, const uint32_t *shp,
                                  const uint32_t *mask, const uint32_t *mshp, const float *ff,
                                  const uint32_t *fshp) {
  beam_series_t *s = beam_series_new(id, dt, 2, shp, NULL, 0);
  assert_non_null(s);
  if (mask)
    assert_int_equal(beam_series_add_array(s, "pixel_mask", BEAM_DT_U32, 2, mshp, mask,
                                           (size_t)mshp[0] * mshp[1] * sizeof *mask), 0);
  if (ff)
    assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_F32, 2, fshp, ff,
                                           (size_t)fshp[0] * fshp[1] * sizeof *ff), 0);
  return s;
}

static void expect_pixels(const float *o, const float *want, int n) {
  for (int i = 0; i < n; i++)
    if (!(o[i] == want[i]))
      fail_msg("pixel %d: got %.9g, want %.9g", i, o[i], want[i]);
}

/* mask: series, flat: series with a dark file, 2 x 3 uint16 frames.
 * Series A:
 *   raw       = 100 200 300 / 400 500 600
 *   dark      =  10  20  30 /  40  50  60        (file)
 *   flatfield =   2 0.5   4 /   0   1  -1        (multiplied; <= 0 -> bad)
 *   mask      =   0   0   0 /   0   2   0        (dead bit -> bad)
 *   -> 180 90 1080 / bad bad bad                  (bad_value -1)
 * Series B: flatfield 1, mask bit 31 on pixel 0 and bit 2 on pixel 2:
 *   -> bad 180 bad / 360 450 540
 * Then series that cannot be corrected are rejected and a good one after
 * them still starts. */
static void test_series_mask_flat(void **state) {
  uint32_t shp[2] = {2, 3}, tall[2] = {3, 2};
  float dark[6] = {10, 20, 30, 40, 50, 60};
  assert_int_equal(bh_write_npy(tmp_path("sd.npy"), "<f4", 2, shp, dark, sizeof dark), 0);
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "dark", tmp_path("sd.npy"));
  bh_set(cfg, "flat", "series");
  bh_set(cfg, "mask", "series");
  bh_set(cfg, "bad_value", "-1");
  bh_t *h = make(cfg, 0, NULL);
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 1);
  uint16_t raw[6] = {100, 200, 300, 400, 500, 600};
  memcpy(in->data, raw, sizeof raw);
  beam_diag_t d = {0};

  float ffa[6] = {2, 0.5f, 4, 0, 1, -1};
  uint32_t ma[6] = {0, 0, 0, 0, 2, 0};
  beam_series_t *s = series_with(1, BEAM_DT_U16, shp, ma, shp, ffa, shp);
  assert_int_equal(start_series(h, s, &d), 0);
  /* The stage keeps tables, not the series' arrays: drop the series before
   * the frames (ASan would see a use after free). */
  beam_series_unref(&s);
  assert_int_equal(bh_process(h, in), 0);
  float want_a[6] = {180, 90, 1080, -1, -1, -1};
  expect_pixels(bh_last(h, 0)->data, want_a, 6);

  float ffb[6] = {1, 1, 1, 1, 1, 1};
  uint32_t mb[6] = {0x80000000u, 0, 4, 0, 0, 0};
  s = series_with(2, BEAM_DT_U16, shp, mb, shp, ffb, shp);
  assert_int_equal(start_series(h, s, &d), 0);
  beam_series_unref(&s);
  assert_int_equal(bh_process(h, in), 0);
  float want_b[6] = {-1, 180, -1, 360, 450, 540};
  expect_pixels(bh_last(h, 0)->data, want_b, 6);

  /* No arrays (header_detail basic): rejected, naming the array. */
  s = series_with(3, BEAM_DT_U16, shp, NULL, NULL, NULL, NULL);
  beam_diag_clear(&d);
  assert_int_equal(start_series(h, s, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "flat: series"));
  assert_non_null(strstr(d.msg, "\"flatfield\""));
  assert_non_null(strstr(d.msg, "header_detail \"all\""));
  beam_series_unref(&s);
  s = series_with(4, BEAM_DT_U16, shp, NULL, NULL, ffa, shp);
  beam_diag_clear(&d);
  assert_int_equal(start_series(h, s, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "mask: series"));
  assert_non_null(strstr(d.msg, "\"pixel_mask\""));
  beam_series_unref(&s);
  /* Arrays of another shape than the frames. */
  s = series_with(5, BEAM_DT_U16, shp, ma, tall, ffa, shp);
  beam_diag_clear(&d);
  assert_int_equal(start_series(h, s, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "mask (from the series) has shape [3, 2] but the frames are [2, 3]"));
  beam_series_unref(&s);
  /* A complex flatfield. */
  s = series_with(6, BEAM_DT_U16, shp, ma, shp, NULL, NULL);
  float cplx[12] = {0};
  assert_int_equal(beam_series_add_array(s, "flatfield", BEAM_DT_C64, 2, shp, cplx, sizeof cplx), 0);
  beam_diag_clear(&d);
  assert_int_equal(start_series(h, s, &d), BEAM_ENOTSUP);
  assert_non_null(strstr(d.msg, "complex"));
  beam_series_unref(&s);

  /* A good series after the rejections. */
  s = series_with(7, BEAM_DT_U16, shp, ma, shp, ffa, shp);
  beam_diag_clear(&d);
  assert_int_equal(start_series(h, s, &d), 0);
  beam_series_unref(&s);
  assert_int_equal(bh_process(h, in), 0);
  expect_pixels(bh_last(h, 0)->data, want_a, 6);
  bh_frame_free(in);
  bh_free(&h);

  /* mask: series alone: no flatfield needed; flat stays off. */
  cfg = bh_stage_cfg("correct");
  bh_set(cfg, "mask", "series");
  h = make(cfg, 0, NULL);
  s = series_with(8, BEAM_DT_U16, shp, ma, shp, NULL, NULL);
  assert_int_equal(start_series(h, s, &d), 0);
  beam_series_unref(&s);
  in = bh_frame_new(BEAM_DT_U16, 2, shp, 2);
  memcpy(in->data, raw, sizeof raw);
  assert_int_equal(bh_process(h, in), 0);
  float want_m[6] = {100, 200, 300, 400, 0, 600};
  expect_pixels(bh_last(h, 0)->data, want_m, 6);
  /* bh_start's series has no arrays. */
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ECONFIG);
  bh_frame_free(in);
  bh_free(&h);
}

/* `series` only where a series can carry the array: dark is a file. */
static void test_series_dark_refused(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "dark", "series");
  bh_t *h = make(cfg, BEAM_ECONFIG, "dark: \"series\" is not supported");
  bh_free(&h);
}

/* One frame through the stage and the reference: returns the stage's
 * output (valid until h is freed) after checking the two agree bitwise. */
static const float *run_one(bh_t *h, const beam_series_t *s, beam_frame_t *in) {
  beam_diag_t d = {0};
  if (start_series(h, s, &d) != 0)
    fail_msg("start: %s", d.msg);
  assert_int_equal(bh_process(h, in), 0);
  const float *o = bh_last(h, 0)->data;
  beam_correct_conf_t conf;
  assert_int_equal(beam_correct_conf_load(&conf, h->cfg, &d), 0);
  beam_correct_src_t src;
  ref_src(&conf, s, s->dtype, s->ndim, s->shape, &src);
  size_t n = beam_frame_elems(in);
  float *ref = calloc(n, sizeof *ref);
  assert_non_null(ref);
  beam_correct_ref(&conf, &src, s->dtype, in->data, n, ref);
  size_t bad = bh_bits_differ(o, ref, n * sizeof *ref);
  free(ref);
  beam_correct_conf_free(&conf);
  if (bad)
    fail_msg("fast loop and reference differ in %zu bytes", bad);
  return o;
}

/* gap_value on each dtype, on the table-free path (no files) and the table
 * path (an all-zero series mask), against hand-written expectations. */
static void gap_case(const char *gap, int with_mask, beam_dtype_t dt, const double *raw,
                     const float *want, int n) {
  uint32_t shp[2] = {1, (uint32_t)n};
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  if (gap)
    bh_set(cfg, "gap_value", gap);
  if (with_mask)
    bh_set(cfg, "mask", "series");
  bh_set(cfg, "bad_value", "-7");
  bh_t *h = make(cfg, 0, NULL);
  uint32_t zeros[8] = {0};
  BEAM_ASSERT(n <= 8);
  beam_series_t *s = series_with(1, dt, shp, with_mask ? zeros : NULL, shp, NULL, NULL);
  beam_frame_t *in = bh_frame_new(dt, 2, shp, 0);
  for (int i = 0; i < n; i++) {
    if (dt == BEAM_DT_U16)
      ((uint16_t *)in->data)[i] = (uint16_t)raw[i];
    else if (dt == BEAM_DT_U32)
      ((uint32_t *)in->data)[i] = (uint32_t)raw[i];
    else
      ((float *)in->data)[i] = (float)raw[i];
  }
  const float *o = run_one(h, s, in);
  for (int i = 0; i < n; i++)
    if (!(o[i] == want[i]))
      fail_msg("gap_value %s, %s, mask %d, pixel %d (raw %.17g): got %.9g, want %.9g",
               gap ? gap : "(default)", beam_dtype_name(dt), with_mask, i, raw[i], o[i], want[i]);
  beam_series_unref(&s);
  bh_frame_free(in);
  bh_free(&h);
}

static void test_gap_value(void **state) {
  for (int m = 0; m < 2; m++) {
    /* auto: 2^N - 1 of the input dtype only. */
    const double r16[4] = {0, 65534, 65535, 7};
    const float w16[4] = {0, 65534, -7, 7};
    gap_case("auto", m, BEAM_DT_U16, r16, w16, 4);
    const double r32[4] = {4294967295.0, 4294967294.0, 65535, 0};
    const float w32[4] = {-7, (float)4294967294u, 65535, 0};
    gap_case("auto", m, BEAM_DT_U32, r32, w32, 4);
    const double rf[3] = {65535, 4294967295.0, 1.5};
    const float wf[3] = {65535, 4294967296.0f, 1.5f};
    gap_case("auto", m, BEAM_DT_F32, rf, wf, 3);
    /* none, and the default (none): 65535 is a value like any other. */
    const float w16n[4] = {0, 65534, 65535, 7};
    gap_case("none", m, BEAM_DT_U16, r16, w16n, 4);
    gap_case(NULL, m, BEAM_DT_U16, r16, w16n, 4);
    /* An integer: equal raw values, on every dtype. */
    const float w16v[4] = {0, 65534, 65535, -7};
    gap_case("7", m, BEAM_DT_U16, r16, w16v, 4);
    const double rfv[4] = {7, 7.5, -1, 6.9999995};
    const float wfv[4] = {-7, 7.5f, -1, 6.9999995f};
    gap_case("7", m, BEAM_DT_F32, rfv, wfv, 4);
    const float wfn[4] = {7, 7.5f, -7, 6.9999995f};
    gap_case("-1", m, BEAM_DT_F32, rfv, wfn, 4);
    /* 2^24 + 1 has no float32: no float input equals it (16777216 is not
     * bad), while a uint32 input compares exactly. */
    const double rbig[3] = {16777216, 16777217, 16777218};
    const float wbigf[3] = {16777216, 16777216, 16777218};
    gap_case("16777217", m, BEAM_DT_F32, rbig, wbigf, 3);
    const float wbigu[3] = {16777216, -7, 16777218};
    gap_case("16777217", m, BEAM_DT_U32, rbig, wbigu, 3);
  }
}

static void test_gap_value_schema(void **state) {
  static const char *bad[] = {"autox", "1.5", "1e3", "", "0x10", "9007199254740993", "7 "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    beam_cnode_t *cfg = bh_stage_cfg("correct");
    bh_set(cfg, "gap_value", bad[i]);
    char msg[512] = "";
    if (bh_validate(cfg, beam_correct_params, msg, sizeof msg) != 1)
      fail_msg("gap_value \"%s\" was accepted", bad[i]);
    if (bad[i][0] && !strstr(msg, "expected auto, none or an integer"))
      fail_msg("gap_value \"%s\": %s", bad[i], msg);
    beam_cnode_free(cfg);
  }
  static const char *good[] = {"auto", "none", "0", "-9007199254740992", "4294967295"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    beam_cnode_t *cfg = bh_stage_cfg("correct");
    bh_set(cfg, "gap_value", good[i]);
    char msg[512] = "";
    if (bh_validate(cfg, beam_correct_params, msg, sizeof msg) != 0)
      fail_msg("gap_value \"%s\": %s", good[i], msg);
    beam_cnode_free(cfg);
  }
}

/* ULP distance of two finite floats of the same sign. */
static uint32_t ulps(float a, float b) {
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  return ia > ib ? (uint32_t)(ia - ib) : (uint32_t)(ib - ia);
}

/* Random series arrays with gap values sprinkled in: the fast loop equals
 * the reference bit for bit on every dtype, and for uint16 with an integer
 * dark both lie within 2 ulps of the oracle (raw - dark) x flatfield in
 * double, with exactly the mask, flatfield and gap pixels bad. */
static void run_random_series(beam_dtype_t dt) {
  enum { H = 43, W = 71, N = H * W };
  uint32_t shp[2] = {H, W};
  static float dark[N], ff[N];
  static uint32_t mask[N];
  uint64_t s = 777;
  for (int i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    dark[i] = (float)(int)(u * 100);
    ff[i] = (float)(0.7 + u * 0.6);
    mask[i] = (s >> 7) % 41 == 0 ? 1u << ((s >> 17) % 32) : 0;
  }
  ff[3] = 0;
  ff[4] = -2;
  ff[5] = NAN;
  assert_int_equal(bh_write_npy(tmp_path("rsd.npy"), "<f4", 2, shp, dark, sizeof dark), 0);
  beam_cnode_t *cfg = bh_stage_cfg("correct");
  bh_set(cfg, "dark", tmp_path("rsd.npy"));
  bh_set(cfg, "flat", "series");
  bh_set(cfg, "mask", "series");
  bh_set(cfg, "gap_value", "auto");
  bh_set(cfg, "threshold", "1.5");
  bh_set(cfg, "bad_value", "nan");
  bh_t *h = make(cfg, 0, NULL);
  beam_series_t *ser = series_with(9, dt, shp, mask, shp, ff, shp);
  beam_frame_t *in = bh_frame_new(dt, 2, shp, 0);
  bh_frame_fill(in, 31, dt == BEAM_DT_U32 ? 4e9 : 65535);
  const double top = dt == BEAM_DT_U32 ? 4294967295.0 : 65535.0;
  for (int i = 0; i < N; i += 97) {
    if (dt == BEAM_DT_U16)
      ((uint16_t *)in->data)[i] = 65535;
    else if (dt == BEAM_DT_U32)
      ((uint32_t *)in->data)[i] = 4294967295u;
    else
      ((float *)in->data)[i] = 65535.0f;
  }
  const float *o = run_one(h, ser, in);
  if (dt == BEAM_DT_U16) {
    const uint16_t *r = in->data;
    size_t ngap = 0;
    for (int i = 0; i < N; i++) {
      int bad = mask[i] != 0 || !(ff[i] > 0) || !isfinite(ff[i]) || r[i] == top;
      ngap += r[i] == top;
      if (bad) {
        if (!isnan(o[i]))
          fail_msg("pixel %d should be bad", i);
        continue;
      }
      double exact = ((double)r[i] - dark[i]) * ff[i];
      float want = (float)exact;
      if ((double)o[i] < 1.5 || exact < 1.5) {
        /* near the threshold the two may fall either side of it */
        if (!(o[i] == 0.0f || fabs(exact - 1.5) < 1e-4))
          fail_msg("pixel %d: got %.9g, want %.9g (threshold)", i, o[i], exact);
        continue;
      }
      if (ulps(o[i], want) > 2)
        fail_msg("pixel %d: got %.9g, oracle %.9g", i, o[i], want);
    }
    assert_true(ngap >= N / 97);
  }
  beam_series_unref(&ser);
  bh_frame_free(in);
  bh_free(&h);
}

static void test_random_series_u16(void **state) { run_random_series(BEAM_DT_U16); }
static void test_random_series_u32(void **state) { run_random_series(BEAM_DT_U32); }
static void test_random_series_f32(void **state) { run_random_series(BEAM_DT_F32); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),   cmocka_unit_test(test_no_files_identity),
      cmocka_unit_test(test_random_u16),      cmocka_unit_test(test_random_u16_float_dark),
      cmocka_unit_test(test_random_u32),      cmocka_unit_test(test_random_f32),
      cmocka_unit_test(test_plain_u16),       cmocka_unit_test(test_plain_f32),
      cmocka_unit_test(test_rejects_dtype),   cmocka_unit_test(test_rejects_shape),
      cmocka_unit_test(test_missing_file),    cmocka_unit_test(test_corrupt_frame),
      cmocka_unit_test(test_series_arrays),   cmocka_unit_test(test_series_mask_flat),
      cmocka_unit_test(test_series_dark_refused), cmocka_unit_test(test_gap_value),
      cmocka_unit_test(test_gap_value_schema), cmocka_unit_test(test_random_series_u16),
      cmocka_unit_test(test_random_series_u32), cmocka_unit_test(test_random_series_f32),
  };
  return beam_run_tests(tests, NULL, NULL);
}
