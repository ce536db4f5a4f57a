/* Stage kind `fit`, CPU backend, driven through the stage harness
 * (tests/common/stage_harness.h): what docs/fit.md "The fit stage" says it
 * does, one behaviour per test.
 *
 * source pixels: x from frame_index, frame_time, pos_x/pos_y (flag POS) and
 * a series metadata list, with x_scale/x_offset and range; max_frames,
 * memory refusal at start, INCOMPLETE when the source lost frames or the
 * stage refused some (bad, wrong shape, no x), ABORTED; `every` previews
 * (PARTIAL, bitwise equal to a SERIES_END fit of the same frames, never a
 * frame's POS); results independent of `threads`.
 * source result: x and sigma weights from sibling outputs of the producer
 * (told apart by their pools' topics, as graph.c labels them), masked
 * points (sigma <= 0, NaN, outside range), the curves output.
 *
 * Most pixel tests fit `poly` of degree 1 to exact lines y = p + (p+1)·x,
 * so a wrong x, a frame kept that should not be, or one lost shows as a
 * wrong coefficient; the engine's exact double solve recovers them to
 * float32 rounding of y. Pixel traces are float32 in the stage, so the
 * bound is 1e-4 (y up to ~100, 2^-24 relative). The preview test uses
 * noisy `dcos` traces and compares bits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/fit.h"
#include "pipeline/kern/fit_stage.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/stage_harness.h"

#define H 2
#define W 3
#define NPIX (H * W)
#define TOL 1e-4

static bh_t *make(beam_cnode_t *cfg) {
  return bh_make(cfg, beam_fit_params, &beam_fit_cpu_ops, 0, NULL);
}

/* A pixels stage fitting lines: poly degree 1, lse, one thread. */
static beam_cnode_t *line_cfg(const char *x) {
  beam_cnode_t *cfg = bh_stage_cfg("fit");
  bh_set(cfg, "source", "pixels");
  bh_set(cfg, "model", "poly");
  bh_set(cfg, "degree", "1");
  bh_set(cfg, "threads", "1");
  if (x)
    bh_set(cfg, "x", x);
  return cfg;
}

static void start_ok(bh_t *h) {
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  int rc = bh_start(h, BEAM_DT_F32, 2, shp, &d);
  if (rc != 0)
    fail_msg("start rc %d: %s", rc, d.msg);
  assert_int_equal(h->st.nouts, 4);
  assert_int_equal(h->st.outs[BEAM_FITS_OUT_PARAMS].ndim, 3);
  assert_int_equal(h->st.outs[BEAM_FITS_OUT_PARAMS].shape[0], 2);
  assert_int_equal(h->st.outs[BEAM_FITS_OUT_PARAMS].shape[1], H);
  assert_int_equal(h->st.outs[BEAM_FITS_OUT_PARAMS].shape[2], W);
}

/* Frame fid holding y = p + (p+1)·xu for pixel p (xu: the x the stage
 * should use), or `junk` everywhere when junk is not 0. */
static beam_frame_t *line_frame(uint64_t fid, double xu, float junk) {
  uint32_t shp[2] = {H, W};
  beam_frame_t *f = bh_frame_new(BEAM_DT_F32, 2, shp, fid);
  for (int p = 0; p < NPIX; p++)
    ((float *)f->data)[p] = junk != 0 ? junk : (float)(p + (p + 1) * xu);
  return f;
}

static int send(bh_t *h, beam_frame_t *f) {
  int rc = bh_process(h, f);
  bh_frame_free(f);
  return rc;
}

/* The last params/status hold the lines: c0 = p, c1 = p + 1. */
static void check_lines(bh_t *h) {
  beam_frame_t *pf = bh_last(h, BEAM_FITS_OUT_PARAMS), *sf = bh_last(h, BEAM_FITS_OUT_STATUS);
  assert_non_null(pf);
  assert_non_null(sf);
  const float *c = pf->data;
  const uint8_t *st = sf->data;
  for (int p = 0; p < NPIX; p++) {
    if (st[p] != BEAM_FIT_CONVERGED)
      fail_msg("pixel %d: status %u", p, st[p]);
    if (!(fabs(c[p] - p) <= TOL * (1 + p)) || !(fabs(c[NPIX + p] - (p + 1)) <= TOL * (1 + p)))
      fail_msg("pixel %d: c0 %.7g c1 %.7g, want %d %d", p, c[p], c[NPIX + p], p, p + 1);
  }
}

static uint32_t final_flags(bh_t *h) {
  beam_frame_t *f = bh_last(h, BEAM_FITS_OUT_PARAMS);
  assert_non_null(f);
  assert_true(f->flags & BEAM_FLAG_FINAL);
  /* every output of the end carries the same flags */
  for (unsigned k = 1; k < 4; k++)
    assert_int_equal(bh_last(h, k)->flags, f->flags);
  return f->flags;
}

/* ---- x sources --------------------------------------------------------------------- */

static void test_x_frame_index(void **state) {
  bh_t *h = make(line_cfg("frame_index"));
  start_ok(h);
  for (uint64_t k = 0; k < 6; k++)
    assert_int_equal(send(h, line_frame(k, (double)k, 0)), 0);
  assert_int_equal(h->nres, 0); /* nothing before the end without `every` */
  assert_int_equal(bh_end(h), 0);
  check_lines(h);
  assert_false(final_flags(h) & (BEAM_FLAG_INCOMPLETE | BEAM_FLAG_ABORTED | BEAM_FLAG_PARTIAL));
  bh_free(&h);
}

/* x = frame_id x frame_time, then x_scale and x_offset; and no frame_time
 * in the series is refused at start. */
static void test_x_frame_time_scaled(void **state) {
  beam_cnode_t *cfg = line_cfg("frame_time");
  bh_set(cfg, "x_scale", "1000");
  bh_set(cfg, "x_offset", "-2");
  bh_t *h = make(cfg);
  h->series.frame_time_s = 0.002;
  start_ok(h);
  for (uint64_t k = 0; k < 5; k++)
    assert_int_equal(send(h, line_frame(k, 1000 * (k * 0.002) - 2, 0)), 0);
  assert_int_equal(bh_end(h), 0);
  check_lines(h);
  bh_free(&h);

  h = make(line_cfg("frame_time"));
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  assert_true(bh_start(h, BEAM_DT_F32, 2, shp, &d) < 0);
  assert_non_null(strstr(d.msg, "no frame_time"));
  bh_free(&h);
}

/* x from the frame's scan position: pos_x and pos_y pick pos[0], pos[1];
 * a frame without flag POS has no x: refused, and the maps say INCOMPLETE. */
static void test_x_pos(void **state) {
  for (int axis = 0; axis < 2; axis++) {
    beam_cnode_t *cfg = line_cfg(axis ? "pos_y" : "pos_x");
    bh_set(cfg, "x_scale", "1e6"); /* metres to micrometres */
    bh_t *h = make(cfg);
    start_ok(h);
    for (uint64_t k = 0; k < 6; k++) {
      double x = 1e-6 * (double)(k * k);
      beam_frame_t *f = line_frame(k, (double)(k * k), 0);
      f->flags |= BEAM_FLAG_POS;
      f->pos[axis] = x;
      f->pos[1 - axis] = 7.0; /* the other axis must not be used */
      f->pos[2] = -3.0;
      assert_int_equal(send(h, f), 0);
    }
    beam_frame_t *f = line_frame(6, 0, 1e6f); /* no POS: no x */
    assert_true(send(h, f) < 0);
    assert_non_null(strstr(h->st.diag.msg, "has no x"));
    assert_int_equal(bh_end(h), 0);
    check_lines(h);
    uint32_t fl = final_flags(h);
    assert_true(fl & BEAM_FLAG_INCOMPLETE);
    assert_false(fl & BEAM_FLAG_POS);
    assert_int_equal(atomic_load(&h->st.counters[1].value), 1); /* frames_skipped */
    bh_free(&h);
  }
}

/* x from a series metadata list by frame id (delay), mapped by x_scale and
 * x_offset; a null entry or a frame id past the list has no x; a series
 * without the list is refused at start. */
static void test_x_meta(void **state) {
  beam_cnode_t *cfg = line_cfg("delay");
  bh_set(cfg, "x_scale", "0.5");
  bh_set(cfg, "x_offset", "1");
  bh_t *h = make(cfg);
  static const double delay[] = {-2, 0.5, 3, 4.25, 8, 9.5};
  h->series.meta_json = strdup("{\"frame_time\": 0.1, \"delay\": [-2, 0.5, 3, 4.25, null, 8, 9.5]}");
  start_ok(h);
  for (uint64_t k = 0, i = 0; k < 7; k++) {
    if (k == 4) { /* null: no x */
      assert_true(send(h, line_frame(k, 0, 1e6f)) < 0);
      continue;
    }
    assert_int_equal(send(h, line_frame(k, 0.5 * delay[i++] + 1, 0)), 0);
  }
  assert_true(send(h, line_frame(7, 0, 1e6f)) < 0); /* past the list */
  assert_int_equal(bh_end(h), 0);
  check_lines(h);
  assert_true(final_flags(h) & BEAM_FLAG_INCOMPLETE);
  free(h->series.meta_json);
  h->series.meta_json = strdup("{\"delays\": [1, 2, 3]}");
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  assert_true(bh_start(h, BEAM_DT_F32, 2, shp, &d) < 0);
  assert_non_null(strstr(d.msg, "no list \"delay\""));
  free(h->series.meta_json);
  h->series.meta_json = NULL;
  bh_free(&h);
}

/* range: frames whose mapped x is outside [lo, hi] are not kept, and that
 * is by request: the maps are not INCOMPLETE. */
static void test_range(void **state) {
  beam_cnode_t *cfg = line_cfg(NULL);
  bh_set(cfg, "x_offset", "-3");
  bh_set(cfg, "range", "[0, 4]");
  bh_t *h = make(cfg);
  start_ok(h);
  for (uint64_t k = 0; k < 10; k++) {
    double xu = (double)k - 3;
    int in = xu >= 0 && xu <= 4;
    assert_int_equal(send(h, line_frame(k, xu, in ? 0 : 1e6f)), 0);
  }
  assert_int_equal(bh_end(h), 0);
  check_lines(h);
  assert_false(final_flags(h) & BEAM_FLAG_INCOMPLETE);
  bh_free(&h);
}

/* ---- limits and refused frames ----------------------------------------------------- */

/* max_frames: later frames are refused (ELIMIT) and the maps, from the first
 * max_frames, say INCOMPLETE. */
static void test_max_frames(void **state) {
  beam_cnode_t *cfg = line_cfg(NULL);
  bh_set(cfg, "max_frames", "4");
  bh_t *h = make(cfg);
  start_ok(h);
  for (uint64_t k = 0; k < 4; k++)
    assert_int_equal(send(h, line_frame(k, (double)k, 0)), 0);
  for (uint64_t k = 4; k < 6; k++) {
    assert_int_equal(send(h, line_frame(k, 0, 1e6f)), BEAM_ELIMIT);
    assert_non_null(strstr(h->st.diag.msg, "max_frames 4"));
  }
  assert_int_equal(bh_end(h), 0);
  check_lines(h);
  assert_true(final_flags(h) & BEAM_FLAG_INCOMPLETE);
  bh_free(&h);
}

/* memory: max_frames x pixels x 4 bytes (+ results) above it refuses the
 * series at start, saying what it needed; a smaller frame fits. */
static void test_memory_refusal(void **state) {
  beam_cnode_t *cfg = line_cfg(NULL);
  bh_set(cfg, "max_frames", "100");
  bh_set(cfg, "memory", "64Ki");
  bh_t *h = make(cfg);
  uint32_t big[2] = {16, 16}; /* 100 x 256 x 4 = 102400 bytes */
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, big, &d), BEAM_ELIMIT);
  assert_non_null(strstr(d.msg, "memory 65536 bytes"));
  assert_non_null(strstr(d.msg, "max_frames 100"));
  assert_non_null(strstr(d.msg, "256 pixels"));
  start_ok(h); /* 2 x 3: 2400 bytes */
  bh_free(&h);
}

/* Bad frames (flag BAD or CORRUPT, another shape, short payload) are
 * refused and counted; the maps come from the others and say INCOMPLETE. */
static void test_bad_frames(void **state) {
  bh_t *h = make(line_cfg(NULL));
  start_ok(h);
  uint64_t k = 0;
  for (; k < 3; k++)
    assert_int_equal(send(h, line_frame(k, (double)k, 0)), 0);
  beam_frame_t *f = line_frame(k++, 0, 1e6f);
  f->flags |= BEAM_FLAG_BAD;
  assert_int_equal(send(h, f), BEAM_ESHAPE);
  f = line_frame(k++, 0, 1e6f);
  f->flags |= BEAM_FLAG_CORRUPT;
  assert_int_equal(send(h, f), BEAM_ESHAPE);
  uint32_t other[2] = {W, H + 1};
  f = bh_frame_new(BEAM_DT_F32, 2, other, k++);
  assert_int_equal(send(h, f), BEAM_ESHAPE);
  f = line_frame(k++, 0, 1e6f);
  f->nbytes -= 4;
  assert_int_equal(send(h, f), BEAM_ESHAPE);
  assert_non_null(strstr(h->st.diag.msg, "is bad or does not match"));
  for (; k < 10; k++)
    assert_int_equal(send(h, line_frame(k, (double)k, 0)), 0);
  assert_int_equal(bh_end(h), 0);
  check_lines(h);
  assert_true(final_flags(h) & BEAM_FLAG_INCOMPLETE);
  assert_int_equal(atomic_load(&h->st.counters[1].value), 4);
  bh_free(&h);
}

/* Frames the source lost (end_missing) make the maps INCOMPLETE; a cut
 * series (end_aborted) ABORTED; the next series starts clean. */
static void test_lost_and_aborted(void **state) {
  bh_t *h = make(line_cfg(NULL));
  for (int c = 0; c < 3; c++) {
    start_ok(h);
    for (uint64_t k = 0; k < 5; k++)
      assert_int_equal(send(h, line_frame(k, (double)k, 0)), 0);
    h->st.end_missing = c == 1 ? 3 : 0;
    h->st.end_aborted = c == 2;
    assert_int_equal(bh_end(h), 0);
    check_lines(h);
    uint32_t fl = final_flags(h);
    assert_int_equal(!!(fl & BEAM_FLAG_INCOMPLETE), c == 1);
    assert_int_equal(!!(fl & BEAM_FLAG_ABORTED), c == 2);
    bh_clear(h);
  }
  /* Too few frames for any fit: every pixel TOO_FEW with NaN maps. */
  start_ok(h);
  h->st.end_missing = h->st.end_aborted = 0;
  for (uint64_t k = 0; k < 2; k++)
    assert_int_equal(send(h, line_frame(k, (double)k, 0)), 0);
  assert_int_equal(bh_end(h), 0);
  const uint8_t *st = bh_last(h, BEAM_FITS_OUT_STATUS)->data;
  const float *c = bh_last(h, BEAM_FITS_OUT_PARAMS)->data;
  for (int p = 0; p < NPIX; p++)
    assert_true(st[p] == BEAM_FIT_TOO_FEW && isnan(c[p]));
  bh_free(&h);
}

/* ---- every ------------------------------------------------------------------------- */

#define PW 20 /* pixels: one full block of 16 and a partial one */
#define PT 30 /* frames */

/* Noisy damped cosines, x = frame_index x 0.25. */
static beam_frame_t *dcos_frame(uint64_t k) {
  uint32_t shp[1] = {PW};
  beam_frame_t *f = bh_frame_new(BEAM_DT_F32, 1, shp, k);
  double x = 0.25 * (double)k;
  uint64_t s = 0x1234 + k;
  for (int p = 0; p < PW; p++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double noise = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.2;
    double fr = 0.2 + 0.02 * p, tau = 3.0 + 0.1 * p;
    ((float *)f->data)[p] =
        (float)(10 + exp(-x / tau) * (2 * cos(2 * M_PI * fr * x) + sin(2 * M_PI * fr * x)) + noise);
  }
  return f;
}

static beam_cnode_t *dcos_cfg(const char *every, const char *threads) {
  beam_cnode_t *cfg = bh_stage_cfg("fit");
  bh_set(cfg, "source", "pixels");
  bh_set(cfg, "model", "dcos");
  bh_set(cfg, "x_scale", "0.25");
  bh_set(cfg, "threads", threads);
  if (every)
    bh_set(cfg, "every", every);
  return cfg;
}

static void start1(bh_t *h) {
  uint32_t shp[1] = {PW};
  beam_diag_t d = {0};
  if (bh_start(h, BEAM_DT_F32, 1, shp, &d) != 0)
    fail_msg("start: %s", d.msg);
}

/* The four outputs of emission `e` (0-based, in order) of a stage. */
static beam_frame_t *emitted(bh_t *h, size_t e, unsigned out) {
  assert_true(h->nres >= 4 * (e + 1));
  beam_frame_t *f = h->res[4 * e + out];
  assert_int_equal(h->res_out[4 * e + out], out);
  return f;
}

static void assert_same_maps(bh_t *a, size_t ea, bh_t *b, size_t eb) {
  for (unsigned out = 0; out < 4; out++) {
    beam_frame_t *x = emitted(a, ea, out), *y = emitted(b, eb, out);
    assert_int_equal(x->nbytes, y->nbytes);
    size_t nd = bh_bits_differ(x->data, y->data, x->nbytes);
    if (nd)
      fail_msg("output %u: %zu bytes differ", out, nd);
  }
}

/* every 7: a PARTIAL emission after frames 7, 14, 21, 28 (frame ids 6, 13,
 * ...), none before there are more frames than parameters, and each
 * bitwise equal to the end fit of a stage that saw only those frames. The
 * maps never carry a frame's POS, and the final is FINAL, not PARTIAL. */
static void test_every_previews(void **state) {
  bh_t *h = make(dcos_cfg("7", "2"));
  start1(h);
  for (uint64_t k = 0; k < PT; k++) {
    beam_frame_t *f = dcos_frame(k);
    f->flags |= BEAM_FLAG_POS;
    f->pos[0] = 1.5;
    assert_int_equal(send(h, f), 0);
  }
  assert_int_equal(h->nres, 4 * 4);
  for (size_t e = 0; e < 4; e++)
    for (unsigned out = 0; out < 4; out++) {
      beam_frame_t *f = emitted(h, e, out);
      assert_int_equal(f->frame_id, 7 * (e + 1) - 1);
      assert_true(f->flags & BEAM_FLAG_PARTIAL);
      assert_false(f->flags & (BEAM_FLAG_FINAL | BEAM_FLAG_POS));
      assert_true(f->pos[0] == 0);
    }
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(h->nres, 5 * 4);
  uint32_t fl = final_flags(h);
  assert_false(fl & (BEAM_FLAG_PARTIAL | BEAM_FLAG_POS | BEAM_FLAG_INCOMPLETE));
  const uint8_t *st = bh_last(h, BEAM_FITS_OUT_STATUS)->data;
  for (int p = 0; p < PW; p++)
    assert_int_equal(st[p], BEAM_FIT_CONVERGED);
  for (size_t e = 0; e < 4; e++) {
    bh_t *r = make(dcos_cfg(NULL, "1"));
    start1(r);
    for (uint64_t k = 0; k < 7 * (e + 1); k++)
      assert_int_equal(send(r, dcos_frame(k)), 0);
    assert_int_equal(bh_end(r), 0);
    assert_same_maps(h, e, r, 0);
    bh_free(&r);
  }
  /* every 2 with P = 5: no preview until frame 6 (n > P). */
  bh_t *g = make(dcos_cfg("2", "1"));
  start1(g);
  for (uint64_t k = 0; k < 6; k++) {
    assert_int_equal(send(g, dcos_frame(k)), 0);
    assert_int_equal(g->nres, k < 5 ? 0 : 4);
  }
  bh_free(&g);
  bh_free(&h);
}

/* The maps do not depend on `threads` (ranges of whole 16-fit blocks). */
static void test_threads_bitwise(void **state) {
  bh_t *a = make(dcos_cfg(NULL, "1")), *b = make(dcos_cfg(NULL, "3"));
  start1(a);
  start1(b);
  for (uint64_t k = 0; k < PT; k++) {
    assert_int_equal(send(a, dcos_frame(k)), 0);
    assert_int_equal(send(b, dcos_frame(k)), 0);
  }
  assert_int_equal(bh_end(a), 0);
  assert_int_equal(bh_end(b), 0);
  assert_same_maps(a, 0, b, 0);
  bh_free(&a);
  bh_free(&b);
}

/* ---- source result ------------------------------------------------------------------ */

#define RT 12 /* points per curve */
#define RF 3  /* curves */

/* exp: a·exp(-2x/tau) + d per curve. */
static double rtrue(int i, double x) { return (1.0 + 0.5 * i) * exp(-2 * x / (0.3 + 0.2 * i)) + 1.0; }

static beam_frame_t *rframe(beam_pool_t *pool, uint32_t ndim, const uint32_t *shp, uint64_t fid,
                            uint32_t flags) {
  beam_frame_t *f = bh_frame_new(BEAM_DT_F64, ndim, shp, fid);
  f->pool = pool;
  f->flags = flags;
  return f;
}

/* g2 [lag][curve] with x from `lags` and sigma from `g2_err` (input
 * mt.g2+g2_err+lags): points with sigma 0, negative or NaN, and points
 * outside range, are masked; their y is junk, so including any would move
 * the fit. The curves output is the model at x; the results keep the y
 * frame's identity and its PARTIAL/FINAL. */
static void test_result_x_and_weights(void **state) {
  beam_diag_t d = {0};
  beam_pool_t *pg = beam_pool_new(1, 64, 0, &d), *pe = beam_pool_new(1, 64, 0, &d),
              *px = beam_pool_new(1, 64, 0, &d);
  assert_non_null(pg);
  assert_non_null(pe);
  assert_non_null(px);
  beam_pool_set_label(pg, "mt.g2", NULL);
  beam_pool_set_label(pe, "mt.g2_err", NULL);
  beam_pool_set_label(px, "mt.lags", NULL);
  beam_cnode_t *cfg = bh_stage_cfg("fit");
  bh_set(cfg, "source", "result");
  bh_set(cfg, "input", "mt.g2+g2_err+lags");
  bh_set(cfg, "model", "exp");
  bh_set(cfg, "x", "lags");
  bh_set(cfg, "weights", "g2_err");
  bh_set(cfg, "range", "[0, 2]");
  bh_set(cfg, "threads", "1");
  bh_t *h = make(cfg);
  uint32_t shp[2] = {RT, RF};
  assert_int_equal(bh_start(h, BEAM_DT_F64, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 5);
  assert_int_equal(h->st.outs[BEAM_FITS_OUT_PARAMS].shape[0], RF);
  assert_int_equal(h->st.outs[BEAM_FITS_OUT_PARAMS].shape[1], 3);
  for (int round = 0; round < 2; round++) {
    uint64_t fid = 40 + (uint64_t)round;
    uint32_t fl = round ? BEAM_FLAG_FINAL : BEAM_FLAG_PARTIAL;
    uint32_t one[1] = {RT};
    beam_frame_t *x = rframe(px, 1, one, fid, fl), *y = rframe(pg, 2, shp, fid, fl),
                 *e = rframe(pe, 2, shp, fid, fl);
    double *yv = y->data, *ev = e->data, xv[RT]; /* xv outlives the frame */
    for (int t = 0; t < RT; t++) {
      xv[t] = ((double *)x->data)[t] = t == RT - 1 ? 5.0 : 0.01 * pow(1.6, t); /* last: outside range */
      for (int i = 0; i < RF; i++) {
        yv[t * RF + i] = rtrue(i, xv[t]);
        ev[t * RF + i] = 0.01 * (1 + t);
      }
    }
    yv[(RT - 1) * RF + 0] = 1e3; /* outside range (curve 0) */
    yv[2 * RF + 0] = 50, ev[2 * RF + 0] = 0;   /* sigma 0 */
    yv[3 * RF + 1] = -50, ev[3 * RF + 1] = NAN; /* sigma NaN */
    yv[5 * RF + 2] = 9, ev[5 * RF + 2] = -1;    /* sigma < 0 */
    /* The producer's order: g2, g2_err, lags; nothing until all three. */
    assert_int_equal(send(h, y), 0);
    assert_int_equal(send(h, e), 0);
    assert_int_equal(h->nres, (size_t)round * 5);
    assert_int_equal(send(h, x), 0);
    assert_int_equal(h->nres, (size_t)(round + 1) * 5);
    const double *p = bh_last(h, BEAM_FITS_OUT_PARAMS)->data;
    const double *cv = bh_last(h, BEAM_FITS_OUT_CURVES)->data;
    const uint8_t *st = bh_last(h, BEAM_FITS_OUT_STATUS)->data;
    for (int i = 0; i < RF; i++) {
      double want[3] = {1.0 + 0.5 * i, 0.3 + 0.2 * i, 1.0};
      assert_int_equal(st[i], BEAM_FIT_CONVERGED);
      for (int j = 0; j < 3; j++)
        if (!(fabs(p[i * 3 + j] - want[j]) <= 1e-4 * fabs(want[j])))
          fail_msg("curve %d param %d: %.9g, want %.9g", i, j, p[i * 3 + j], want[j]);
      for (int t = 0; t < RT; t++)
        if (!(fabs(cv[t * RF + i] - rtrue(i, xv[t])) <= 1e-4))
          fail_msg("curve %d point %d (x %g): %.9g, want %.9g", i, t, xv[t], cv[t * RF + i],
                   rtrue(i, xv[t]));
    }
    for (unsigned out = 0; out < 5; out++) {
      beam_frame_t *f = bh_last(h, out);
      assert_int_equal(f->frame_id, fid);
      assert_int_equal(f->flags & (BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL), fl);
    }
  }
  /* end: a result source has fitted every frame already */
  size_t n = h->nres;
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(h->nres, n);
  bh_free(&h);
  beam_pool_close(&pg);
  beam_pool_close(&pe);
  beam_pool_close(&px);
}

/* weights_are: weight takes the output as w itself (w = 0 masks). */
static void test_result_weights_are_weight(void **state) {
  beam_diag_t d = {0};
  beam_pool_t *pg = beam_pool_new(1, 64, 0, &d), *pw = beam_pool_new(1, 64, 0, &d);
  beam_pool_set_label(pg, "mt.g2", NULL);
  beam_pool_set_label(pw, "mt.w", NULL);
  beam_cnode_t *cfg = bh_stage_cfg("fit");
  bh_set(cfg, "source", "result");
  bh_set(cfg, "input", "mt.g2+w");
  bh_set(cfg, "model", "poly");
  bh_set(cfg, "degree", "1");
  bh_set(cfg, "weights", "w");
  bh_set(cfg, "weights_are", "weight");
  bh_set(cfg, "curves", "false");
  bh_t *h = make(cfg);
  uint32_t one[1] = {8};
  assert_int_equal(bh_start(h, BEAM_DT_F64, 1, one, &d), 0);
  assert_int_equal(h->st.nouts, 4); /* no curves */
  beam_frame_t *y = rframe(pg, 1, one, 3, BEAM_FLAG_FINAL), *w = rframe(pw, 1, one, 3, BEAM_FLAG_FINAL);
  for (int t = 0; t < 8; t++) {
    ((double *)y->data)[t] = 2 + 3 * t; /* x = index */
    ((double *)w->data)[t] = t == 4 ? 0 : 1;
  }
  ((double *)y->data)[4] = 1e4;
  assert_int_equal(send(h, y), 0);
  assert_int_equal(send(h, w), 0);
  const double *p = bh_last(h, BEAM_FITS_OUT_PARAMS)->data;
  assert_true(fabs(p[0] - 2) <= 1e-5 && fabs(p[1] - 3) <= 1e-5);
  bh_free(&h);
  beam_pool_close(&pg);
  beam_pool_close(&pw);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_x_frame_index),   cmocka_unit_test(test_x_frame_time_scaled),
      cmocka_unit_test(test_x_pos),           cmocka_unit_test(test_x_meta),
      cmocka_unit_test(test_range),           cmocka_unit_test(test_max_frames),
      cmocka_unit_test(test_memory_refusal),  cmocka_unit_test(test_bad_frames),
      cmocka_unit_test(test_lost_and_aborted), cmocka_unit_test(test_every_previews),
      cmocka_unit_test(test_threads_bitwise), cmocka_unit_test(test_result_x_and_weights),
      cmocka_unit_test(test_result_weights_are_weight),
  };
  return beam_run_tests(tests, NULL, NULL);
}
