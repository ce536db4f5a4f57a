/* Stage kind `roi_sum`, CPU backend: hand-computed disk/annulus/rect sums,
 * the index-list loop against the reference loop and against an
 * independent double sum on random data, label images, weight stacks, the
 * scan image, CORRUPT frames, and every configuration or shape error. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/roi_sum.h"
#include "tests/common/stage_harness.h"

static char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 256, "%s/%s", bh_tmpdir(), name);
  return p;
}

static beam_cnode_t *roi(const char *name, const char *shape) {
  beam_cnode_t *m = bh_map();
  bh_set(m, "name", name);
  bh_set(m, "shape", shape);
  return m;
}

static bh_t *make(beam_cnode_t *cfg, int expect_rc, const char *expect_msg) {
  char msg[512];
  if (bh_validate(cfg, beam_roi_sum_params, msg, sizeof msg) != 0)
    fail_msg("validate: %s", msg);
  bh_t *h;
  beam_diag_t d = {0};
  int rc = bh_new(&h, &beam_roi_sum_cpu_ops, cfg, &d);
  if (rc != expect_rc)
    fail_msg("init rc %d (%s), want %d", rc, d.msg, expect_rc);
  if (expect_msg && !strstr(d.msg, expect_msg))
    fail_msg("message \"%s\" lacks \"%s\"", d.msg, expect_msg);
  return h;
}

/* bf, adf and r on a 5x5 frame whose pixel (x, y) holds x + 10 y.
 * Centre (2, 2). Disk r 1.5: d2 in {0, 1, 2}, the 3x3 block: 9 x 22 = 198.
 * Annulus [1.5, 2.5): d2 = 4 (4 pixels: 2, 20, 24, 42 = 88) and d2 = 5
 * (8 pixels: 1, 3, 41, 43, 10, 30, 14, 34 = 176): 264. Rect [0, 0, 2, 1]:
 * pixels (0, 0) and (1, 0): 1. */
static beam_cnode_t *three_rois(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m;
  m = roi("bf", "disk");
  bh_set(m, "radius", "1.5");
  bh_push(rois, m);
  m = roi("adf", "annulus");
  bh_set(m, "radii", "[1.5, 2.5]");
  bh_push(rois, m);
  m = roi("r", "rect");
  bh_set(m, "rect", "[0, 0, 2, 1]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  return cfg;
}

static void test_hand_computed(void **state) {
  bh_t *h = make(three_rois(), 0, NULL);
  uint32_t shp[2] = {5, 5};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 1);
  assert_string_equal(h->st.outs[0].name, "sums");
  assert_int_equal(h->st.outs[0].dtype, BEAM_DT_F64);
  assert_int_equal(h->st.outs[0].shape[0], 3);
  assert_string_equal(h->st.outs[0].axes[0], "roi");
  assert_string_equal(h->st.outs[0].labels_json, "[\"bf\",\"adf\",\"r\"]");
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  for (int y = 0; y < 5; y++)
    for (int x = 0; x < 5; x++)
      ((uint16_t *)in->data)[y * 5 + x] = (uint16_t)(x + 10 * y);
  assert_int_equal(bh_process(h, in), 0);
  assert_int_equal(h->nres, 1);
  const double *s = h->res[0]->data;
  assert_true(s[0] == 198.0);
  assert_true(s[1] == 264.0);
  assert_true(s[2] == 1.0);
  bh_frame_free(in);
  bh_free(&h);
}

/* Independent membership for the random test (same formulas as the
 * documentation, written again here). */
static double indep_sum(const double *px, int H, int W, double cx, double cy, double rin, double rout) {
  double s = 0;
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      double d2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
      if (d2 >= rin * rin && d2 < rout * rout)
        s += px[y * W + x];
    }
  return s;
}

static void run_random(beam_dtype_t dt) {
  enum { H = 67, W = 80 };
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m;
  m = roi("bf", "disk");
  bh_set(m, "radius", "9.3");
  bh_push(rois, m);
  m = roi("adf", "annulus");
  bh_set(m, "radii", "[12, 30.5]");
  bh_set(m, "center", "[41.25, 30.5]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, shp, &d), 0);
  beam_roi_host_t *host = h->st.priv;
  static double px[H * W];
  for (int fr = 0; fr < 4; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, (uint64_t)fr);
    bh_frame_fill(in, 77 + (uint64_t)fr, 60000);
    for (int i = 0; i < H * W; i++)
      px[i] = dt == BEAM_DT_U16 ? ((uint16_t *)in->data)[i] : ((float *)in->data)[i];
    assert_int_equal(bh_process(h, in), 0);
    const double *s = h->res[h->nres - 1]->data;
    double ref[2];
    beam_roi_sum_ref(&host->conf, dt, H, W, in->data, ref);
    double want[2] = {indep_sum(px, H, W, (W - 1) / 2.0, (H - 1) / 2.0, 0, 9.3),
                      indep_sum(px, H, W, 41.25, 30.5, 12, 30.5)};
    for (int r = 0; r < 2; r++) {
      double mag = indep_sum(px, H, W, 0, 0, 0, 1e9); /* >= sum |x| over the ROI */
      double tol = dt == BEAM_DT_U16 ? 0.0 : 1e-12 * mag;
      if (!(fabs(s[r] - ref[r]) <= tol) || !(fabs(s[r] - want[r]) <= tol))
        fail_msg("frame %d roi %d: fast %.17g ref %.17g independent %.17g", fr, r, s[r], ref[r], want[r]);
      assert_true(want[r] > 0);
    }
    bh_frame_free(in);
  }
  bh_free(&h);
}

static void test_random_u16(void **state) { run_random(BEAM_DT_U16); }
static void test_random_f32(void **state) { run_random(BEAM_DT_F32); }

static void test_labels(void **state) {
  uint32_t shp[2] = {3, 4};
  int32_t lab[12] = {0, 3, 3, 7, 7, 0, -2, 3, 0, 0, 7, 7};
  assert_int_equal(bh_write_npy(tmp_path("lab.npy"), "<i4", 2, shp, lab, sizeof lab), 0);
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *mk = bh_map();
  bh_set(mk, "file", tmp_path("lab.npy"));
  bh_put(cfg, "masks", mk);
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_F64, 2, shp, &d), 0);
  assert_string_equal(h->st.outs[0].labels_json, "[\"label_3\",\"label_7\"]");
  beam_frame_t *in = bh_frame_new(BEAM_DT_F64, 2, shp, 0);
  for (int i = 0; i < 12; i++)
    ((double *)in->data)[i] = 1 << i;
  assert_int_equal(bh_process(h, in), 0);
  const double *s = h->res[0]->data;
  assert_true(s[0] == 2 + 4 + 128);
  assert_true(s[1] == 8 + 16 + 1024 + 2048);
  bh_frame_free(in);
  bh_free(&h);
}

static void test_weights(void **state) {
  uint32_t shp3[3] = {2, 2, 3}, shp[2] = {2, 3};
  float w[12] = {1, 0, 0.5f, 0, 0, 0, /* mask 0 */ 0, 0, 0, 2, 2, -1 /* mask 1 */};
  assert_int_equal(bh_write_npy(tmp_path("w.npy"), "<f4", 3, shp3, w, sizeof w), 0);
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *mk = bh_map();
  bh_set(mk, "file", tmp_path("w.npy"));
  bh_put(cfg, "masks", mk);
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_I32, 2, shp, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_I32, 2, shp, 0);
  int32_t v[6] = {10, 20, 30, 40, 50, 60};
  memcpy(in->data, v, sizeof v);
  assert_int_equal(bh_process(h, in), 0);
  const double *s = h->res[0]->data;
  assert_true(s[0] == 10 + 15);
  assert_true(s[1] == 80 + 100 - 60);
  /* Mask shape must match the frame. */
  uint32_t other[2] = {3, 2};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_I32, 2, other, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "masks have shape [2, 2, 3] but the frames are [3, 2]"));
  bh_frame_free(in);
  bh_free(&h);
}

/* scan_shape [2, 3], image_every 4, 7 frames: a PARTIAL image after frame
 * 4, a FINAL one at end; frame k lands in pixel k mod 6. */
static void test_scan_image(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m = roi("all", "rect");
  bh_set(m, "rect", "[0, 0, 2, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_set(cfg, "scan_shape", "[2, 3]");
  bh_set(cfg, "image_every", "4");
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {2, 2};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 2);
  assert_string_equal(h->st.outs[1].name, "image");
  assert_int_equal(h->st.outs[1].shape[1], 2);
  assert_int_equal(h->st.outs[1].shape[2], 3);
  for (uint64_t k = 0; k < 7; k++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_U8, 2, shp, k);
    memset(in->data, (int)k + 1, 4); /* sum = 4 (k + 1) */
    if (k == 2)
      in->flags = BEAM_FLAG_CORRUPT;
    assert_int_equal(bh_process(h, in), 0);
    bh_frame_free(in);
  }
  assert_int_equal(bh_end(h), 0);
  /* 7 sums + partial image after the 4th frame + final image */
  assert_int_equal(h->nres, 9);
  assert_int_equal(h->res_out[4], 1);
  assert_true(h->res[4]->flags & BEAM_FLAG_PARTIAL);
  const float *p = h->res[4]->data;
  assert_true(p[0] == 4 && p[1] == 8 && isnan(p[2]) && p[3] == 16 && isnan(p[4]) && isnan(p[5]));
  assert_true(isnan(((double *)h->res[2]->data)[0])); /* CORRUPT -> NaN sum */
  assert_true(h->res[2]->flags & BEAM_FLAG_CORRUPT);
  assert_int_equal(h->res_out[8], 1);
  assert_true(h->res[8]->flags & BEAM_FLAG_FINAL);
  const float *f = h->res[8]->data;
  assert_true(f[0] == 28 && f[1] == 8 && isnan(f[2]) && f[3] == 16 && f[4] == 20 && f[5] == 24);
  bh_free(&h);
}

static void test_config_errors(void **state) {
  /* neither */
  bh_t *h = make(bh_stage_cfg("roi_sum"), BEAM_ECONFIG, "exactly one of rois");
  bh_free(&h);
  /* both */
  beam_cnode_t *cfg = three_rois(), *mk = bh_map();
  bh_set(mk, "file", "/nonexistent.npy");
  bh_put(cfg, "masks", mk);
  h = make(cfg, BEAM_ECONFIG, "not both");
  bh_free(&h);
  /* missing mask file */
  cfg = bh_stage_cfg("roi_sum");
  mk = bh_map();
  bh_set(mk, "file", "/nonexistent/masks.h5");
  bh_put(cfg, "masks", mk);
  h = make(cfg, BEAM_EIO, "/nonexistent/masks.h5");
  bh_free(&h);
  /* annulus radii reversed; disk without radius; duplicate names */
  cfg = bh_stage_cfg("roi_sum");
  beam_cnode_t *rois = bh_seq(), *m = roi("a", "annulus");
  bh_set(m, "radii", "[5, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  h = make(cfg, BEAM_ECONFIG, "inner < outer");
  bh_free(&h);
  cfg = bh_stage_cfg("roi_sum");
  rois = bh_seq();
  bh_push(rois, roi("d", "disk"));
  bh_put(cfg, "rois", rois);
  h = make(cfg, BEAM_ECONFIG, "needs radius");
  bh_free(&h);
  cfg = bh_stage_cfg("roi_sum");
  rois = bh_seq();
  m = roi("x", "rect");
  bh_set(m, "rect", "[0, 0, 1, 1]");
  bh_push(rois, m);
  m = roi("x", "rect");
  bh_set(m, "rect", "[1, 1, 2, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  h = make(cfg, BEAM_ECONFIG, "two ROIs are named \"x\"");
  bh_free(&h);
  /* a 2-D float mask is not a label image */
  uint32_t shp[2] = {2, 2};
  float fm[4] = {0, 1, 1, 0};
  assert_int_equal(bh_write_npy(tmp_path("fm.npy"), "<f4", 2, shp, fm, sizeof fm), 0);
  cfg = bh_stage_cfg("roi_sum");
  mk = bh_map();
  bh_set(mk, "file", tmp_path("fm.npy"));
  bh_put(cfg, "masks", mk);
  h = make(cfg, BEAM_ENOTSUP, "integer label image");
  bh_free(&h);
}

static void test_start_errors(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m = roi("far", "rect");
  bh_set(m, "rect", "[100, 100, 110, 110]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {16, 16};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "ROI \"far\" has no pixel inside the 16x16 frame"));
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_C64, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "complex64"));
  uint32_t shp3[3] = {2, 16, 16};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 3, shp3, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "2-D"));
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed), cmocka_unit_test(test_random_u16),
      cmocka_unit_test(test_random_f32),    cmocka_unit_test(test_labels),
      cmocka_unit_test(test_weights),       cmocka_unit_test(test_scan_image),
      cmocka_unit_test(test_config_errors), cmocka_unit_test(test_start_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
