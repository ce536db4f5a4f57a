/* Stage kind `xpcs_twotime`, CPU backend: a hand-computed case, then every
 * mode (full, band, window with a wrapped ring) and both precisions against
 * a plain C reference of scikit-beam's definition written with direct
 * double loops (C = <I1 I2>_p / (<I1>_p <I2>_p), NaN rows and columns for
 * bad frames and, per ROI, for zero-photon frames), g2 and its errors as
 * one_time_from_two_time computes them from that reference, partial
 * results, and the memory-limit, max_frames and shape errors. */
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

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_twotime.h"
#include "tests/common/stage_harness.h"

static char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 256, "%s/%s", bh_tmpdir(), name);
  return p;
}

static beam_cnode_t *cfg_labels(const char *file, const char *mode, int width) {
  beam_cnode_t *cfg = bh_stage_cfg("xpcs_twotime"), *rois = bh_map();
  bh_set(rois, "file", file);
  bh_put(cfg, "rois", rois);
  bh_set(cfg, "mode", mode);
  char s[32];
  snprintf(s, sizeof s, "%d", width);
  bh_set(cfg, "width", s);
  return cfg;
}

static bh_t *make(beam_cnode_t *cfg) {
  return bh_make(cfg, beam_xpcs_twotime_params, &beam_xpcs_twotime_cpu_ops, 0, NULL);
}

/* NaN must match NaN; otherwise |got - want| <= rtol |want|. */
static void close_to(double got, double want, double rtol, const char *what, size_t i) {
  if (isnan(want) && isnan(got))
    return;
  if (!(fabs(got - want) <= rtol * fabs(want)))
    fail_msg("%s[%zu]: got %.17g, want %.17g", what, i, got, want);
}

static double cell(const beam_frame_t *f, size_t k) {
  return f->dtype == BEAM_DT_F32 ? (double)((const float *)f->data)[k] : ((const double *)f->data)[k];
}

/* 2x2 frames, labels [[0, 5], [5, 9]]: ROI 5 = pixels 1, 2; ROI 9 = pixel 3.
 * Frames [0,1,2,3], [0,2,1,1], [0,1,1,2]. ROI 5 values (1,2), (2,1), (1,1):
 * C(0,0) = C(1,1) = ((1+4)/2) / 1.5^2 = 10/9, C(0,1) = ((2+2)/2) / 1.5^2 = 8/9,
 * C(0,2) = C(1,2) = ((1+2)/2) / (1.5 x 1) = 1, C(2,2) = 1. ROI 9 (one
 * pixel): C = 1 everywhere. */
static void test_hand_computed(void **state) {
  uint16_t lab[4] = {0, 5, 5, 9};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("lab.npy"), "<u2", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("lab.npy"), "full", 1);
  bh_set(cfg, "errors", "true");
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  h->series.frame_time_s = 0.5;
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  uint16_t v[3][4] = {{0, 1, 2, 3}, {0, 2, 1, 1}, {0, 1, 1, 2}};
  for (int k = 0; k < 3; k++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, sh, (uint64_t)k);
    memcpy(f->data, v[k], sizeof v[k]);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(h->nres, 0);
  assert_int_equal(bh_end(h), 0);
  beam_frame_t *c2 = bh_last(h, BEAM_X2T_OUT_C2), *g2 = bh_last(h, BEAM_X2T_OUT_G2), *lags = bh_last(h, BEAM_X2T_OUT_LAGS);
  assert_non_null(c2);
  assert_true(c2->flags & BEAM_FLAG_FINAL);
  assert_int_equal(c2->ndim, 3);
  assert_int_equal(c2->shape[0], 2);
  assert_int_equal(c2->shape[1], 3);
  assert_int_equal(c2->shape[2], 3);
  const double c5[9] = {10.0 / 9, 8.0 / 9, 1, 8.0 / 9, 10.0 / 9, 1, 1, 1, 1};
  for (size_t i = 0; i < 9; i++) {
    close_to(cell(c2, i), c5[i], 1e-15, "c2 roi 5", i);
    close_to(cell(c2, 9 + i), 1.0, 1e-15, "c2 roi 9", i);
  }
  /* g2 lag 0 = mean(10/9, 10/9, 1), lag 1 = mean(8/9, 1), lag 2 = 1 */
  double wg[3] = {(20.0 / 9 + 1) / 3, (8.0 / 9 + 1) / 2, 1};
  assert_int_equal(g2->shape[0], 3);
  assert_int_equal(g2->shape[1], 2);
  for (size_t k = 0; k < 3; k++) {
    close_to(((double *)g2->data)[k * 2], wg[k], 1e-15, "g2", k);
    close_to(((double *)g2->data)[k * 2 + 1], 1.0, 1e-15, "g2 roi 9", k);
    assert_true(((double *)lags->data)[k] == 0.5 * (double)k);
  }
  /* lag 1 error: nanstd(8/9, 1) / sqrt(2) = (1/18) / sqrt 2 */
  close_to(((double *)bh_last(h, BEAM_X2T_OUT_G2ERR)->data)[2], (1.0 / 18) / sqrt(2.0), 1e-13, "err", 1);
  assert_string_equal(h->st.outs[0].labels_json, "[5,9]");
  bh_free(&h);
}

/* ---- reference ------------------------------------------------------------ */

/* C[r][i][j] over all N frames, plainly. frames[N][npix], lab[p] = ROI or -1. */
static double *reference(const double *frames, const int *bad, size_t N, size_t npix, const int *lab, size_t R) {
  double *C = malloc(R * N * N * sizeof *C);
  for (size_t r = 0; r < R; r++)
    for (size_t i = 0; i < N; i++)
      for (size_t j = 0; j < N; j++) {
        double num = 0, a = 0, b = 0, np = 0;
        for (size_t p = 0; p < npix; p++)
          if (lab[p] == (int)r) {
            num += frames[i * npix + p] * frames[j * npix + p];
            a += frames[i * npix + p];
            b += frames[j * npix + p];
            np++;
          }
        double v = (num / np) / ((a / np) * (b / np));
        C[(r * N + i) * N + j] = bad[i] || bad[j] || a == 0 || b == 0 ? NAN : v;
      }
  return C;
}

/* g2 and err of diagonal k of the n x n block of C starting at frame s. */
static void ref_g2(const double *C, size_t N, size_t r, size_t s, size_t n, size_t k, double *g, double *e) {
  double sum = 0, cnt = 0;
  for (size_t t = 0; t + k < n; t++) {
    double v = C[(r * N + s + t) * N + s + t + k];
    if (!isnan(v))
      sum += v, cnt++;
  }
  double m = sum / cnt, ss = 0;
  for (size_t t = 0; t + k < n; t++) {
    double v = C[(r * N + s + t) * N + s + t + k];
    if (!isnan(v))
      ss += (v - m) * (v - m);
  }
  *g = cnt ? m : NAN;
  *e = cnt ? sqrt(ss / cnt) / sqrt((double)(n - k)) : NAN;
}

enum { H = 12, W = 10, NPIX = H * W };

typedef struct run_s {
  const char *mode;
  int width;
  beam_dtype_t dt;
  const char *precision;
  size_t N;
  double rtol;
  unsigned publish_every;
  unsigned publish_rows; /* 0: no c2_rows blocks */
} run_t;

/* ---- publish_rows: the c2_rows blocks, collected and stitched ------------- */

typedef struct blocks_s {
  double *S;       /* stitched: full/window [R][N][N] by frame index, band [R][N][W]; NaN = unset */
  uint8_t *set;    /* cells written by some block */
  size_t N, Wd, next, count, nfinal;
} blocks_t;

static unsigned out_named(const bh_t *h, const char *name) {
  for (unsigned o = 0; o < h->st.nouts; o++)
    if (strcmp(h->st.outs[o].name, name) == 0)
      return o;
  fail_msg("no output %s", name);
  return 0;
}

/* The results from index *seen on: every c2_rows followed by its
 * c2_rows_at; each block must start where the last ended, come when its
 * last frame (frames_now) arrived, and match the reference C (all frames,
 * as a cell depends only on its two frames). */
static void take_blocks(bh_t *h, const run_t *rc, size_t *seen, blocks_t *B, size_t frames_now, int at_end) {
  unsigned orow = out_named(h, "c2_rows"), oat = out_named(h, "c2_rows_at");
  int band = strcmp(rc->mode, "band") == 0, win = strcmp(rc->mode, "window") == 0;
  const size_t R = 4, N = B->N;
  for (size_t i = *seen; i < h->nres; i++) {
    if (h->res_out[i] != orow)
      continue;
    beam_frame_t *f = h->res[i], *a = i + 1 < h->nres && h->res_out[i + 1] == oat ? h->res[i + 1] : NULL;
    assert_non_null(a); /* c2_rows_at right after its block */
    const int64_t *at = a->data;
    size_t row0 = (size_t)at[BEAM_X2T_AT_ROW0], n = (size_t)at[BEAM_X2T_AT_ROWS],
           col0 = (size_t)at[BEAM_X2T_AT_COL0], cols = f->shape[2];
    assert_int_equal(row0, B->next);
    assert_int_equal(f->shape[0], R);
    assert_int_equal(f->shape[1], n);
    assert_int_equal(at[BEAM_X2T_AT_FRAMES], (int64_t)frames_now);
    assert_int_equal(f->flags & a->flags & (BEAM_FLAG_FINAL | BEAM_FLAG_PARTIAL),
                     at_end ? BEAM_FLAG_FINAL : BEAM_FLAG_PARTIAL);
    if (at_end) {
      B->nfinal++;
      assert_true(n <= rc->publish_rows && row0 + n == frames_now);
    } else {
      assert_int_equal(n, rc->publish_rows);
      assert_int_equal(row0 + n, frames_now); /* sent as its last frame arrived */
    }
    if (band)
      assert_true(col0 == 0 && cols == B->Wd);
    else if (win)
      assert_true(col0 == (row0 + n > B->Wd ? row0 + n - B->Wd : 0) && cols == row0 + n - col0);
    else
      assert_true(col0 == 0 && cols == row0 + n);
    for (size_t r = 0; r < R; r++)
      for (size_t t = 0; t < n; t++)
        for (size_t j = 0; j < cols; j++) {
          double v = cell(f, (r * n + t) * cols + j);
          size_t k = band ? (r * N + row0 + t) * B->Wd + j : (r * N + row0 + t) * N + col0 + j;
          B->S[k] = v, B->set[k] = 1;
          if (!band) { /* the mirror cell, by symmetry */
            size_t m = (r * N + col0 + j) * N + row0 + t;
            if (!B->set[m])
              B->S[m] = v, B->set[m] = 1;
          }
        }
    B->next = row0 + n;
    B->count++;
  }
  *seen = h->nres;
}

/* The stitched blocks against the reference and the FINAL c2. */
static void check_blocks(bh_t *h, const run_t *rc, const blocks_t *B, const double *C) {
  int band = strcmp(rc->mode, "band") == 0, win = strcmp(rc->mode, "window") == 0;
  const size_t R = 4, N = B->N, Wd = B->Wd;
  assert_int_equal(B->next, N);
  assert_int_equal(B->nfinal, N % rc->publish_rows ? 1 : 0);
  assert_int_equal(B->count, (N + rc->publish_rows - 1) / rc->publish_rows);
  beam_frame_t *c2 = bh_last(h, BEAM_X2T_OUT_C2);
  size_t n = c2->shape[1], cols = c2->shape[2], s = win ? N - n : 0;
  for (size_t r = 0; r < R; r++)
    for (size_t t = 0; t < n; t++)
      for (size_t j = 0; j < cols; j++) {
        size_t k = band ? (r * N + t) * Wd + j : (r * N + s + t) * N + s + j;
        double want = band ? (j > t ? NAN : C[(r * N + t - j) * N + t]) : C[(r * N + s + t) * N + s + j];
        if (!B->set[k])
          fail_msg("%s: cell [%zu, %zu, %zu] of the final c2 is in no block", rc->mode, r, t, j);
        close_to(B->S[k], want, rc->rtol, "stitched vs reference", k);
        close_to(B->S[k], cell(c2, (r * n + t) * cols + j), rc->rtol, "stitched vs final c2", k);
      }
}


/* Labels with gaps (2, 7, 8, 40); frames with BAD, CORRUPT, a zero-photon
 * frame in ROI 7, and for float input a NaN pixel; results compared with
 * the reference after each partial publish and at the end. */
static void check_result(bh_t *h, const run_t *rc, const double *frames, const int *bad, size_t N, const int *idx,
                         const char *when) {
  const size_t R = 4;
  int win = strcmp(rc->mode, "window") == 0, band = strcmp(rc->mode, "band") == 0;
  size_t n = win && N > (size_t)rc->width ? (size_t)rc->width : N, s = N - n, Wd = (size_t)rc->width;
  double *C = reference(frames, bad, N, NPIX, idx, R);
  beam_frame_t *c2 = bh_last(h, BEAM_X2T_OUT_C2), *g2 = bh_last(h, BEAM_X2T_OUT_G2), *er = bh_last(h, BEAM_X2T_OUT_G2ERR),
               *info = bh_last(h, BEAM_X2T_OUT_INFO);
  assert_non_null(c2);
  assert_int_equal(c2->dtype, strcmp(rc->precision, "float32") == 0 ? BEAM_DT_F32 : BEAM_DT_F64);
  assert_int_equal(c2->shape[0], R);
  assert_int_equal(c2->shape[1], n);
  assert_int_equal(c2->shape[2], band ? Wd : n);
  char what[64];
  snprintf(what, sizeof what, "%s c2 (%s)", when, rc->mode);
  size_t finite = 0, cells = 0;
  for (size_t r = 0; r < R; r++)
    for (size_t t = 0; t < n; t++)
      for (size_t j = 0; j < c2->shape[2] && (!band || j <= t); j++, cells++)
        finite += isfinite(cell(c2, (r * n + t) * c2->shape[2] + j));
  /* NaN is only for bad and dark frames (and band cells before t = 0) */
  if (!(finite >= cells / 2))
    fail_msg("%s: only %zu of %zu cells are finite", what, finite, cells);
  for (size_t r = 0; r < R; r++)
    for (size_t t = 0; t < n; t++)
      for (size_t j = 0; j < c2->shape[2]; j++) {
        double want = band ? (j > t ? NAN : C[(r * N + t - j) * N + t]) : C[(r * N + s + t) * N + s + j];
        size_t k = (r * n + t) * c2->shape[2] + j;
        close_to(cell(c2, k), want, rc->rtol, what, k);
      }
  size_t K = band && Wd < n ? Wd : n;
  assert_int_equal(g2->shape[0], K);
  finite = 0;
  for (size_t k = 0; k < K * R; k++)
    finite += isfinite(((double *)g2->data)[k]);
  if (!(finite >= K * R / 2))
    fail_msg("%s: only %zu of %zu g2 values are finite", what, finite, K * R);
  for (size_t r = 0; r < R; r++)
    for (size_t k = 0; k < K; k++) {
      double g, e;
      ref_g2(C, N, r, s, n, k, &g, &e);
      close_to(((double *)g2->data)[k * R + r], g, rc->rtol, "g2", k * R + r);
      close_to(((double *)er->data)[k * R + r], e, rc->rtol * 100, "g2_err", k * R + r);
    }
  int64_t *in = info->data, nbad = 0, dark = 0;
  for (size_t t = s; t < N; t++) {
    nbad += bad[t];
    for (size_t r = 0; r < R && !bad[t]; r++) {
      double a = 0;
      for (size_t p = 0; p < NPIX; p++)
        a += idx[p] == (int)r ? frames[t * NPIX + p] : 0;
      dark += a == 0;
    }
  }
  assert_int_equal(in[BEAM_X2T_INFO_FRAMES], (int64_t)N);
  assert_int_equal(in[BEAM_X2T_INFO_ROWS], (int64_t)n);
  assert_int_equal(in[BEAM_X2T_INFO_DARK], dark);
  assert_int_equal(in[BEAM_X2T_INFO_FIRST], (int64_t)s);
  assert_int_equal(in[BEAM_X2T_INFO_DROPPED], 0);
  if (!win) {
    int64_t all = 0;
    for (size_t t = 0; t < N; t++)
      all += bad[t];
    assert_int_equal(in[BEAM_X2T_INFO_BAD], all);
  }
  free(C);
}

static void run_random(const run_t *rc) {
  int32_t lab[NPIX];
  int idx[NPIX];
  const int32_t vals[5] = {0, 2, 7, 8, 40};
  uint64_t seed = 4321;
  for (int p = 0; p < NPIX; p++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((seed >> 33) % 5);
    if (p < 4)
      k = p + 1;
    lab[p] = vals[k];
    idx[p] = k - 1;
  }
  uint32_t sh[2] = {H, W};
  assert_int_equal(bh_write_npy(tmp_path("rlab.npy"), "<i4", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("rlab.npy"), rc->mode, rc->width);
  bh_set(cfg, "precision", rc->precision);
  bh_set(cfg, "errors", "true");
  char s[32];
  snprintf(s, sizeof s, "%u", rc->publish_every);
  bh_set(cfg, "publish_every", s);
  if (rc->publish_rows) {
    snprintf(s, sizeof s, "%u", rc->publish_rows);
    bh_set(cfg, "publish_rows", s);
  }
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, rc->dt, 2, sh, &d), 0);
  size_t N = rc->N;
  double *frames = calloc(N * NPIX, sizeof *frames);
  int *bad = calloc(N, sizeof *bad);
  size_t npartial = 0, seen = 0;
  blocks_t B = {0};
  B.N = N, B.Wd = (size_t)rc->width;
  size_t scells = 4 * N * (strcmp(rc->mode, "band") == 0 ? B.Wd : N);
  if (rc->publish_rows) {
    B.S = malloc(scells * sizeof *B.S);
    B.set = calloc(scells, 1);
  }
  for (size_t k = 0; k < N; k++) {
    beam_frame_t *f = bh_frame_new(rc->dt, 2, sh, k);
    bh_frame_fill(f, 1000 + k, rc->dt == BEAM_DT_F32 ? 7.5 : 9);
    if (k == 6) /* no photon in ROI 7 (column 1): NaN only there */
      for (int p = 0; p < NPIX; p++)
        if (idx[p] == 1) {
          if (rc->dt == BEAM_DT_F32)
            ((float *)f->data)[p] = 0;
          else
            ((uint16_t *)f->data)[p] = 0;
        }
    for (int p = 0; p < NPIX; p++)
      frames[k * NPIX + p] = rc->dt == BEAM_DT_F32 ? ((float *)f->data)[p] : ((uint16_t *)f->data)[p];
    if (k % 11 == 5)
      f->flags |= BEAM_FLAG_BAD, bad[k] = 1;
    if (k == 17)
      f->flags |= BEAM_FLAG_CORRUPT, f->nbytes = 0, bad[k] = 1; /* no payload: never read */
    if (k == 20 && rc->dt == BEAM_DT_F32) {
      ((float *)f->data)[0] = NAN; /* pixel 0 is in ROI 2: the frame is bad */
      bad[k] = 1;
    }
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
    if (rc->publish_rows)
      take_blocks(h, rc, &seen, &B, k + 1, 0);
    if (rc->publish_every && (k + 1) % rc->publish_every == 0) {
      npartial++;
      assert_true(bh_last(h, BEAM_X2T_OUT_C2)->flags & BEAM_FLAG_PARTIAL);
      check_result(h, rc, frames, bad, k + 1, idx, "partial");
      bh_clear(h);
      seen = 0;
    }
  }
  assert_int_equal(bh_end(h), 0);
  assert_true(bh_last(h, BEAM_X2T_OUT_C2)->flags & BEAM_FLAG_FINAL);
  check_result(h, rc, frames, bad, N, idx, "final");
  if (rc->publish_rows) {
    take_blocks(h, rc, &seen, &B, N, 1);
    double *C = reference(frames, bad, N, NPIX, idx, 4);
    check_blocks(h, rc, &B, C);
    free(C), free(B.S), free(B.set);
  }
  assert_int_equal(npartial, rc->publish_every ? N / rc->publish_every : 0);
  assert_string_equal(h->st.outs[0].labels_json, "[2,7,8,40]");
  free(frames), free(bad);
  bh_free(&h);
}

static void test_full_u16(void **state) {
  run_t r = {"full", 1, BEAM_DT_U16, "float64", 45, 1e-12, 13, 0};
  run_random(&r);
}
static void test_full_f32_precision32(void **state) {
  run_t r = {"full", 1, BEAM_DT_F32, "float32", 33, 2e-5, 0, 0};
  run_random(&r);
}
static void test_band_u16(void **state) {
  run_t r = {"band", 7, BEAM_DT_U16, "float64", 150, 1e-12, 40, 0}; /* several GEMM blocks of 64 rows */
  run_random(&r);
}
static void test_band_wide(void **state) {
  run_t r = {"band", 50, BEAM_DT_F32, "float64", 30, 1e-12, 0, 0}; /* W > T */
  run_random(&r);
}
static void test_window_u16(void **state) {
  run_t r = {"window", 16, BEAM_DT_U16, "float64", 41, 1e-12, 10, 0}; /* partials before and after the wrap */
  run_random(&r);
}
static void test_window_f32(void **state) {
  run_t r = {"window", 9, BEAM_DT_F32, "float32", 27, 2e-5, 0, 0};
  run_random(&r);
}

/* publish_rows: blocks sent as their last frame arrives, stitched, equal
 * the reference and the FINAL c2 (which they leave unchanged: run_random
 * checks it as before). Trailing blocks at the end, partial results in
 * between, band blocks crossing GEMM blocks, window blocks across the
 * ring's wrap (rows and columns in two pieces). */
static void test_rows_full(void **state) {
  run_t r = {"full", 1, BEAM_DT_U16, "float64", 45, 1e-12, 13, 4}; /* 11 blocks + 1 row at the end */
  run_random(&r);
  run_t r2 = {"full", 1, BEAM_DT_F32, "float32", 33, 2e-5, 0, 11}; /* no trailing block */
  run_random(&r2);
}
static void test_rows_band(void **state) {
  run_t r = {"band", 7, BEAM_DT_U16, "float64", 150, 1e-12, 40, 70}; /* 2 blocks + 10 rows */
  run_random(&r);
  run_t r2 = {"band", 50, BEAM_DT_F32, "float64", 30, 1e-12, 0, 3}; /* W > T */
  run_random(&r2);
}
static void test_rows_window(void **state) {
  run_t r = {"window", 16, BEAM_DT_U16, "float64", 41, 1e-12, 10, 5}; /* wraps at 16, 32 */
  run_random(&r);
  run_t r2 = {"window", 9, BEAM_DT_F32, "float32", 27, 2e-5, 0, 9}; /* N = W */
  run_random(&r2);
}

/* ---- multi-tau levels (num_bufs, num_levels) ------------------------------- */

/* Closed form, num_bufs 2, num_levels 3, 9 frames of 3 pixels, labels
 * [1, 1, 2]. ROI 1 alternates (2, 0), (0, 2): level 0 C = 2 at lag 0 and
 * 0 at lag 1; level-1 and level-2 frames are uniform, C = 1, at lags 2
 * (level 1, i = 1) and 4 (level 2, i = 1). ROI 2 is one pixel, C = 1 in
 * every written cell. Cells of no pair (lags 3, 5..8, and frame 8, outside
 * every complete level-1 block, at lag 2) are 0. */
static void test_levels_closed_form(void **state) {
  uint8_t lab[3] = {1, 1, 2};
  uint32_t sh[2] = {1, 3};
  assert_int_equal(bh_write_npy(tmp_path("lv.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("lv.npy"), "full", 1);
  bh_set(cfg, "num_bufs", "2");
  bh_set(cfg, "num_levels", "3");
  bh_set(cfg, "errors", "true");
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  h->series.frame_time_s = 0.25;
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  enum { N = 9 };
  for (int k = 0; k < N; k++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, sh, (uint64_t)k);
    uint16_t v[3] = {(uint16_t)(k % 2 ? 0 : 2), (uint16_t)(k % 2 ? 2 : 0), (uint16_t)(k + 1)};
    memcpy(f->data, v, sizeof v);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(bh_end(h), 0);
  beam_frame_t *c2 = bh_last(h, BEAM_X2T_OUT_C2), *g2 = bh_last(h, BEAM_X2T_OUT_G2),
               *lags = bh_last(h, BEAM_X2T_OUT_LAGS), *er = bh_last(h, BEAM_X2T_OUT_G2ERR);
  assert_int_equal(c2->shape[1], N);
  assert_int_equal(c2->shape[2], N);
  for (int t1 = 0; t1 < N; t1++)
    for (int t2 = 0; t2 < N; t2++) {
      int k = abs(t1 - t2), hi = t1 > t2 ? t1 : t2;
      int lvl = k < 2 ? 0 : (k == 2 && hi < 8) ? 1 : (k == 4 && hi < 8) ? 2 : -1;
      double w1 = lvl < 0 ? 0 : lvl == 0 ? (k == 0 ? 2 : 0) : 1, w2 = lvl < 0 ? 0 : 1;
      assert_true(cell(c2, (size_t)(t1 * N + t2)) == w1);
      assert_true(cell(c2, (size_t)(N * N + t1 * N + t2)) == w2);
    }
  /* lags 0, 1 (level 0), 2 (level 1), 4 (level 2) */
  const double wl[4] = {0, 1, 2, 4}, wg[4] = {2, 0, 1, 1};
  assert_int_equal(g2->shape[0], 4);
  assert_int_equal(lags->shape[0], 4);
  for (int j = 0; j < 4; j++) {
    assert_true(((double *)lags->data)[j] == 0.25 * wl[j]);
    assert_true(((double *)g2->data)[j * 2] == wg[j]);
    assert_true(((double *)g2->data)[j * 2 + 1] == 1);
    assert_true(((double *)er->data)[j * 2] == 0);
  }
  bh_free(&h);
}

/* scikit-beam's two_time_corr as its loop writes it, plainly: level-L
 * frames are means of 2^L frames (NaN when one is bad), each with a mean
 * time (1-based) tk = k 2^L + (2^L + 1) / 2; a pair at lag i puts its C at
 * int(tk - 1 + s), int(tk - 1 - i 2^L + s) for s = 1 - 2^(L-1) .. 2^(L-1)
 * (level 0: the cell (t, t - i) only); then the lower triangle is
 * mirrored. Cells of no pair stay 0. */
static double *reference_levels(const double *frames, const int *bad, size_t N, size_t npix, const int *lab,
                                size_t R, size_t nb, unsigned NL) {
  double *C = calloc(R * N * N, sizeof *C), *m = malloc(N * npix * sizeof *m);
  for (unsigned L = 0; L < NL; L++) {
    size_t B = (size_t)1 << L, nL = N / B;
    for (size_t k = 0; k < nL; k++)
      for (size_t p = 0; p < npix; p++) {
        double s = 0;
        for (size_t t = k * B; t < (k + 1) * B; t++)
          s += bad[t] ? NAN : frames[t * npix + p];
        m[k * npix + p] = s / (double)B;
      }
    for (size_t k = 0; k < nL; k++)
      for (size_t i = L ? nb / 2 : 0; i < nb && i <= k; i++)
        for (size_t r = 0; r < R; r++) {
          double num = 0, a = 0, b = 0;
          for (size_t p = 0; p < npix; p++)
            if (lab[p] == (int)r) {
              num += m[(k - i) * npix + p] * m[k * npix + p];
              a += m[(k - i) * npix + p];
              b += m[k * npix + p];
            }
          double np = 0;
          for (size_t p = 0; p < npix; p++)
            np += lab[p] == (int)r;
          double v = num / (a * b) * np, tk = (double)(k * B) + (double)(B + 1) / 2;
          double t1 = tk - 1, t2 = t1 - (double)(i * B);
          long ns = L ? 1L << (L - 1) : 0;
          for (long s = L ? 1 - ns : 0; s <= (L ? ns : 0); s++)
            C[(r * N + (size_t)(t1 + (double)s)) * N + (size_t)(t2 + (double)s)] = v;
        }
  }
  for (size_t r = 0; r < R; r++)
    for (size_t i = 0; i < N; i++)
      for (size_t j = 0; j < i; j++)
        C[(r * N + j) * N + i] = C[(r * N + i) * N + j];
  free(m);
  return C;
}

typedef struct lrun_s {
  beam_dtype_t dt;
  const char *precision;
  size_t N, nb;
  unsigned NL, publish_every;
  double rtol;
} lrun_t;

static void check_levels(bh_t *h, const lrun_t *rc, const double *frames, const int *bad, size_t N, const int *idx) {
  const size_t R = 4, nb = rc->nb;
  double *C = reference_levels(frames, bad, N, NPIX, idx, R, nb, rc->NL);
  beam_frame_t *c2 = bh_last(h, BEAM_X2T_OUT_C2), *g2 = bh_last(h, BEAM_X2T_OUT_G2),
               *er = bh_last(h, BEAM_X2T_OUT_G2ERR), *lags = bh_last(h, BEAM_X2T_OUT_LAGS);
  assert_int_equal(c2->shape[1], N);
  assert_int_equal(c2->shape[2], N);
  size_t zeros = 0, hi = 0;
  for (size_t k = 0; k < R * N * N; k++) {
    close_to(cell(c2, k), C[k], rc->rtol, "levels c2", k);
    zeros += C[k] == 0;
    hi += C[k] != 0 && (size_t)labs((long)(k % N) - (long)(k / N % N)) >= nb;
  }
  assert_true(zeros > 0 && (rc->NL == 1 || hi > 0)); /* both kinds of cells are there */
  /* the lag list: 0..nb-1, then i 2^L, i = nb/2..nb-1, each with a pair */
  size_t K = 0;
  for (unsigned L = 0; L < rc->NL; L++)
    for (size_t i = L ? nb / 2 : 0; i < nb && i < (N >> L); i++, K++) {
      size_t k = i << L, end = (N >> L) << L;
      assert_true(K < g2->shape[0]);
      assert_true(((double *)lags->data)[K] == (double)k);
      for (size_t r = 0; r < R; r++) {
        double s = 0, ss = 0, cnt = 0;
        for (size_t t = 0; t + k < end; t++) {
          double v = C[(r * N + t + k) * N + t];
          if (!isnan(v))
            s += v, cnt++;
        }
        double mean = s / cnt;
        for (size_t t = 0; t + k < end; t++) {
          double v = C[(r * N + t + k) * N + t];
          if (!isnan(v))
            ss += (v - mean) * (v - mean);
        }
        close_to(((double *)g2->data)[K * R + r], cnt ? mean : NAN, rc->rtol, "levels g2", K * R + r);
        close_to(((double *)er->data)[K * R + r], cnt ? sqrt(ss / cnt) / sqrt((double)(end - k)) : NAN,
                 rc->rtol * 100, "levels g2_err", K * R + r);
      }
    }
  assert_int_equal(g2->shape[0], K);
  free(C);
}

static void run_levels(const lrun_t *rc) {
  int32_t lab[NPIX];
  int idx[NPIX];
  const int32_t vals[5] = {0, 2, 7, 8, 40};
  uint64_t seed = 99;
  for (int p = 0; p < NPIX; p++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int k = p < 4 ? p + 1 : (int)((seed >> 33) % 5);
    lab[p] = vals[k];
    idx[p] = k - 1;
  }
  uint32_t sh[2] = {H, W};
  assert_int_equal(bh_write_npy(tmp_path("llab.npy"), "<i4", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("llab.npy"), "full", 1);
  char s[32];
  bh_set(cfg, "precision", rc->precision);
  bh_set(cfg, "errors", "true");
  snprintf(s, sizeof s, "%zu", rc->nb);
  bh_set(cfg, "num_bufs", s);
  snprintf(s, sizeof s, "%u", rc->NL);
  bh_set(cfg, "num_levels", s);
  snprintf(s, sizeof s, "%u", rc->publish_every);
  bh_set(cfg, "publish_every", s);
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, rc->dt, 2, sh, &d), 0);
  size_t N = rc->N, npartial = 0;
  double *frames = calloc(N * NPIX, sizeof *frames);
  int *bad = calloc(N, sizeof *bad);
  for (size_t k = 0; k < N; k++) {
    beam_frame_t *f = bh_frame_new(rc->dt, 2, sh, k);
    bh_frame_fill(f, 500 + k, rc->dt == BEAM_DT_F32 ? 7.5 : 9);
    if (k == 6 || k == 7) /* no photon in ROI 7 in a whole level-1 frame: NaN there */
      for (int p = 0; p < NPIX; p++)
        if (idx[p] == 1) {
          if (rc->dt == BEAM_DT_F32)
            ((float *)f->data)[p] = 0;
          else
            ((uint16_t *)f->data)[p] = 0;
        }
    for (int p = 0; p < NPIX; p++)
      frames[k * NPIX + p] = rc->dt == BEAM_DT_F32 ? ((float *)f->data)[p] : ((uint16_t *)f->data)[p];
    if (k == 13)
      f->flags |= BEAM_FLAG_BAD, bad[k] = 1;
    if (k == 29 && rc->dt == BEAM_DT_F32) {
      ((float *)f->data)[0] = NAN; /* pixel 0 is in ROI 2: the frame is bad */
      bad[k] = 1;
    }
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
    if (rc->publish_every && (k + 1) % rc->publish_every == 0) {
      npartial++;
      check_levels(h, rc, frames, bad, k + 1, idx);
      bh_clear(h);
    }
  }
  assert_int_equal(bh_end(h), 0);
  assert_true(bh_last(h, BEAM_X2T_OUT_C2)->flags & BEAM_FLAG_FINAL);
  check_levels(h, rc, frames, bad, N, idx);
  assert_int_equal(npartial, rc->publish_every ? N / rc->publish_every : 0);
  free(frames), free(bad);
  bh_free(&h);
}

static void test_levels_u16(void **state) {
  lrun_t r = {BEAM_DT_U16, "float64", 45, 4, 3, 13, 1e-12}; /* partials at 13, 26, 39 */
  run_levels(&r);
  lrun_t r2 = {BEAM_DT_U16, "float64", 45, 8, 4, 0, 1e-12}; /* level 3 has 5 frames: lag 32 only */
  run_levels(&r2);
  lrun_t r3 = {BEAM_DT_U16, "float64", 20, 2, 1, 0, 1e-12}; /* one level, |t1 - t2| < 2 */
  run_levels(&r3);
}

static void test_levels_f32(void **state) {
  lrun_t r = {BEAM_DT_F32, "float32", 37, 6, 2, 0, 2e-5};
  run_levels(&r);
  lrun_t r2 = {BEAM_DT_F32, "float64", 40, 16, 3, 0, 1e-12}; /* num_bufs > frames at level 0 */
  run_levels(&r2);
}

/* scikit-beam's constraints and the combinations beamd does not do. */
static void test_levels_config(void **state) {
  uint8_t lab[4] = {1, 0, 2, 2};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("lc.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  char msg[512];
  beam_cnode_t *cfg = cfg_labels(tmp_path("lc.npy"), "full", 1);
  bh_set(cfg, "num_bufs", "5");
  assert_true(bh_validate(cfg, beam_xpcs_twotime_params, msg, sizeof msg) > 0);
  assert_non_null(strstr(msg, "num_bufs must be even"));
  beam_cnode_free(cfg);
  cfg = cfg_labels(tmp_path("lc.npy"), "full", 1);
  bh_set(cfg, "num_levels", "0");
  assert_true(bh_validate(cfg, beam_xpcs_twotime_params, msg, sizeof msg) > 0);
  beam_cnode_free(cfg);
  cfg = cfg_labels(tmp_path("lc.npy"), "full", 1);
  bh_set(cfg, "num_levels", "17");
  assert_true(bh_validate(cfg, beam_xpcs_twotime_params, msg, sizeof msg) > 0);
  beam_cnode_free(cfg);
  struct {
    const char *mode, *nb, *nl, *rows, *want;
  } bad[] = {
      {"full", "0", "3", NULL, "num_levels 3 needs num_bufs"},
      {"band", "8", "2", NULL, "need mode full"},
      {"window", "8", "1", NULL, "need mode full"},
      {"full", "8", "2", "4", "publish_rows cannot be combined"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    cfg = cfg_labels(tmp_path("lc.npy"), bad[k].mode, 8);
    bh_set(cfg, "num_bufs", bad[k].nb);
    bh_set(cfg, "num_levels", bad[k].nl);
    if (bad[k].rows)
      bh_set(cfg, "publish_rows", bad[k].rows);
    assert_int_equal(bh_validate(cfg, beam_xpcs_twotime_params, NULL, 0), 0);
    bh_t *h = NULL;
    beam_diag_t d = {0};
    assert_int_equal(bh_new(&h, &beam_xpcs_twotime_cpu_ops, cfg, &d), BEAM_ECONFIG);
    if (!strstr(d.msg, bad[k].want))
      fail_msg("case %zu: message %s", k, d.msg);
    bh_free(&h);
  }
}

/* ---- limits and errors ----------------------------------------------------- */

static void test_memory_limits(void **state) {
  uint8_t lab[16];
  for (int i = 0; i < 16; i++)
    lab[i] = (uint8_t)(1 + i % 4);
  uint32_t sh[2] = {4, 4};
  assert_int_equal(bh_write_npy(tmp_path("m.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  /* init: one ROI's 20000^2 float64 c2 = 3 GiB > 1Gi */
  beam_cnode_t *cfg = cfg_labels(tmp_path("m.npy"), "full", 1);
  bh_set(cfg, "max_frames", "20000");
  bh_set(cfg, "memory_limit", "1Gi");
  assert_int_equal(bh_validate(cfg, beam_xpcs_twotime_params, NULL, 0), 0);
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(bh_new(&h, &beam_xpcs_twotime_cpu_ops, cfg, &d), BEAM_ECONFIG);
  if (!strstr(d.msg, "memory_limit") || !strstr(d.msg, "max_frames^2"))
    fail_msg("message: %s", d.msg);
  bh_free(&h);
  /* band makes the same request fit */
  cfg = cfg_labels(tmp_path("m.npy"), "band", 100);
  bh_set(cfg, "max_frames", "20000");
  bh_set(cfg, "memory_limit", "1Gi");
  h = make(cfg);
  bh_free(&h);
  /* start: 4 ROIs x 8000^2 x 8 B = 1.9 GiB, one ROI alone fits */
  cfg = cfg_labels(tmp_path("m.npy"), "full", 1);
  bh_set(cfg, "max_frames", "8000");
  bh_set(cfg, "memory_limit", "1Gi");
  h = make(cfg);
  memset(&d, 0, sizeof d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), BEAM_ELIMIT);
  if (!strstr(d.msg, "4 ROIs") || !strstr(d.msg, "memory_limit"))
    fail_msg("message: %s", d.msg);
  /* ... but a series that announces 100 frames fits */
  h->series.nframes = 100;
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  assert_int_equal(h->st.outs[BEAM_X2T_OUT_C2].shape[1], 100);
  /* one announcing more than max_frames is refused */
  h->series.nframes = 9000;
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), BEAM_ELIMIT);
  assert_non_null(strstr(d.msg, "announces 9000 frames"));
  bh_free(&h);
}

/* Frames beyond max_frames are dropped with an error and counted; the
 * result covers the frames kept. */
static void test_max_frames_drop(void **state) {
  uint8_t lab[4] = {1, 1, 2, 2};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("d.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("d.npy"), "band", 2);
  bh_set(cfg, "max_frames", "5");
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, sh, &d), 0);
  for (uint64_t k = 0; k < 7; k++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U8, 2, sh, k);
    bh_frame_fill(f, k, 5);
    ((uint8_t *)f->data)[0] = ((uint8_t *)f->data)[3] = 1;
    int rc = bh_process(h, f);
    assert_int_equal(rc, k < 5 ? 0 : BEAM_ELIMIT);
    if (k >= 5)
      assert_non_null(strstr(h->st.diag.msg, "beyond the 5 frames"));
    bh_frame_free(f);
  }
  assert_int_equal(bh_end(h), 0);
  int64_t *info = bh_last(h, BEAM_X2T_OUT_INFO)->data;
  assert_int_equal(info[BEAM_X2T_INFO_FRAMES], 7);
  assert_int_equal(info[BEAM_X2T_INFO_DROPPED], 2);
  assert_int_equal(info[BEAM_X2T_INFO_ROWS], 5);
  assert_int_equal(bh_last(h, BEAM_X2T_OUT_C2)->shape[1], 5);
  assert_int_equal(bh_last(h, BEAM_X2T_OUT_C2)->shape[2], 2);
  bh_free(&h);
}

/* An empty series publishes info only; bad config values are refused. */
static void test_empty_and_errors(void **state) {
  uint8_t lab[4] = {1, 0, 2, 2};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("e.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  bh_t *h = make(cfg_labels(tmp_path("e.npy"), "window", 4));
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(h->nres, 1);
  assert_int_equal(h->res_out[0], BEAM_X2T_OUT_INFO);
  uint32_t bad_sh[2] = {3, 2};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, bad_sh, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "label image is [2, 2]"));
  assert_int_equal(bh_start(h, BEAM_DT_C64, 2, sh, &d), BEAM_ESHAPE);
  bh_free(&h);
  char msg[512];
  beam_cnode_t *cfg = cfg_labels(tmp_path("e.npy"), "diagonal", 4);
  assert_true(bh_validate(cfg, beam_xpcs_twotime_params, msg, sizeof msg) > 0);
  assert_non_null(strstr(msg, "full|band|window"));
  beam_cnode_free(cfg);
  cfg = cfg_labels(tmp_path("e.npy"), "band", 0);
  assert_true(bh_validate(cfg, beam_xpcs_twotime_params, msg, sizeof msg) > 0);
  beam_cnode_free(cfg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed),   cmocka_unit_test(test_full_u16),
      cmocka_unit_test(test_full_f32_precision32), cmocka_unit_test(test_band_u16),
      cmocka_unit_test(test_band_wide),       cmocka_unit_test(test_window_u16),
      cmocka_unit_test(test_window_f32),      cmocka_unit_test(test_memory_limits),
      cmocka_unit_test(test_max_frames_drop), cmocka_unit_test(test_empty_and_errors),
      cmocka_unit_test(test_rows_full),       cmocka_unit_test(test_rows_band),
      cmocka_unit_test(test_rows_window),     cmocka_unit_test(test_levels_closed_form),
      cmocka_unit_test(test_levels_u16),      cmocka_unit_test(test_levels_f32),
      cmocka_unit_test(test_levels_config),
  };
  return beam_run_tests(tests, NULL, NULL);
}
