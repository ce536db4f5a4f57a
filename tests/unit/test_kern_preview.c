/* Stage kind `preview`, CPU backend: the decimation factor, the rate gate
 * with injected receive times, the final frame at series end, and rejected
 * inputs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/preview.h"
#include "tests/common/stage_harness.h"

#define S 1000000000ull

static bh_t *make(const char *rate, const char *max_size) {
  beam_cnode_t *cfg = bh_stage_cfg("preview");
  if (rate)
    bh_set(cfg, "rate", rate);
  if (max_size)
    bh_set(cfg, "max_size", max_size);
  char msg[512];
  if (bh_validate(cfg, beam_preview_params, msg, sizeof msg) != 0)
    fail_msg("validate: %s", msg);
  bh_t *h;
  beam_diag_t d = {0};
  if (bh_new(&h, &beam_preview_cpu_ops, cfg, &d) != 0)
    fail_msg("init: %s", d.msg);
  return h;
}

/* 100 x 300 with max_size 64: f = max(ceil(100/64), ceil(300/64)) = 5 ->
 * 20 x 60, the block mean. */
static void test_factor(void **state) {
  bh_t *h = make(NULL, "64");
  uint32_t shp[2] = {100, 300};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_F32, 2, shp, &d), 0);
  assert_int_equal(h->st.outs[0].shape[0], 20);
  assert_int_equal(h->st.outs[0].shape[1], 60);
  beam_frame_t *in = bh_frame_new(BEAM_DT_F32, 2, shp, 0);
  bh_frame_fill(in, 5, 1000);
  in->t_recv_ns = 1;
  assert_int_equal(bh_process(h, in), 0);
  assert_int_equal(h->nres, 1);
  beam_bin_geom_t g = {BEAM_DT_F32, 100, 300, 0, 0, 20, 60, 5, 1};
  static float ref[20 * 60];
  beam_bin2d_ref(&g, in->data, ref);
  assert_int_equal(bh_bits_differ(h->res[0]->data, ref, sizeof ref), 0);
  /* a frame that fits is not decimated */
  uint32_t fits[2] = {64, 17};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, fits, &d), 0);
  assert_int_equal(h->st.outs[0].shape[0], 64);
  assert_int_equal(h->st.outs[0].shape[1], 17);
  bh_frame_free(in);
  bh_free(&h);
}

static void feed(bh_t *h, uint64_t id, uint64_t t) {
  uint32_t shp[2] = {4, 4};
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, id);
  memset(in->data, (int)id, in->nbytes);
  in->t_recv_ns = t;
  assert_int_equal(bh_process(h, in), 0);
  bh_frame_free(in);
}

/* rate 2 Hz: 0.5 s apart at least. */
static void test_rate(void **state) {
  bh_t *h = make("2", NULL);
  uint32_t shp[2] = {4, 4};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  feed(h, 1, 10 * S);            /* first: emitted */
  feed(h, 2, 10 * S + S / 5);    /* held */
  feed(h, 3, 10 * S + S / 2);    /* 0.5 s: emitted */
  feed(h, 4, 10 * S + 6 * S / 10); /* held */
  feed(h, 5, 10 * S + 7 * S / 10); /* held, the last one */
  assert_int_equal(h->nres, 2);
  assert_int_equal(h->res[0]->frame_id, 1);
  assert_int_equal(h->res[1]->frame_id, 3);
  assert_false(h->res[1]->flags & BEAM_FLAG_FINAL);
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(h->nres, 3);
  assert_int_equal(h->res[2]->frame_id, 5);
  assert_true(h->res[2]->flags & BEAM_FLAG_FINAL);
  assert_int_equal(h->res[2]->t_recv_ns, 10 * S + 7 * S / 10);
  /* pixels of frame 5: every uint16 is 0x0505 */
  assert_true(((float *)h->res[2]->data)[0] == (float)0x0505);
  bh_clear(h);

  /* New series: the gate resets (an earlier clock value is still "first"),
   * and when the last frame was emitted, end adds nothing. */
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  feed(h, 1, 1 * S);
  feed(h, 2, 2 * S);
  assert_int_equal(h->nres, 2);
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(h->nres, 2);
  bh_free(&h);
}

static void test_rejects(void **state) {
  bh_t *h = make(NULL, NULL);
  beam_diag_t d = {0};
  uint32_t shp[2] = {4, 4}, s1[1] = {16};
  assert_int_equal(bh_start(h, BEAM_DT_C64, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "complex64"));
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 1, s1, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "2-D"));
  /* 16 x 100000 with max 1024: factor 98 leaves 0 rows */
  uint32_t thin[2] = {16, 100000};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, thin, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "too elongated"));
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_factor),
      cmocka_unit_test(test_rate),
      cmocka_unit_test(test_rejects),
  };
  return beam_run_tests(tests, NULL, NULL);
}
