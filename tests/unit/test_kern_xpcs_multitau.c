/* Stage kind `xpcs_multitau`, CPU backend: a hand-computed 2x2 case, the
 * lag list, a plain C implementation of scikit-beam's closed form (level
 * means as doubles, NaN for bad frames) on random integer and float data
 * with bad and CORRUPT frames, truncation and the dark-ROI report, partial
 * results, ring and q geometry, and the configuration and shape errors.
 * normalization per_pixel: a plain C version of the APS convention (per
 * pixel G/(IP IF) from level means, mean and std/sqrt(n) over the ROI) on
 * the same data, and the int64 overflow guard. */
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
#include "pipeline/kern/xpcs_multitau.h"
#include "tests/common/stage_harness.h"

static char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 256, "%s/%s", bh_tmpdir(), name);
  return p;
}

static beam_cnode_t *cfg_labels(const char *file, int levels, int nb) {
  beam_cnode_t *cfg = bh_stage_cfg("xpcs_multitau"), *rois = bh_map();
  bh_set(rois, "file", file);
  bh_put(cfg, "rois", rois);
  char s[32];
  snprintf(s, sizeof s, "%d", levels);
  bh_set(cfg, "levels", s);
  snprintf(s, sizeof s, "%d", nb);
  bh_set(cfg, "buffers", s);
  return cfg;
}

static bh_t *make(beam_cnode_t *cfg) {
  return bh_make(cfg, beam_xpcs_multitau_params, &beam_xpcs_multitau_cpu_ops, 0, NULL);
}

static size_t count(bh_t *h, unsigned out, uint32_t flag) {
  size_t n = 0;
  for (size_t i = 0; i < h->nres; i++)
    n += h->res_out[i] == out && (h->res[i]->flags & flag);
  return n;
}

static void close_to(double got, double want, double rtol, const char *what, size_t i) {
  double diff = fabs(got - want);
  if (!(diff <= rtol * fabs(want)))
    fail_msg("%s[%zu]: got %.17g, want %.17g", what, i, got, want);
}

/* 2x2 frames, labels [[0, 5], [5, 9]]: ROI 5 = pixels 1, 2; ROI 9 = pixel
 * 3. levels 1, buffers 2: lags 0 and 1. Frames (flat): [0,1,2,3],
 * [0,2,1,1], [0,1,1,2].
 * ROI 5 pixel values (1,2), (2,1), (1,1); ROI 9: 3, 1, 2.
 * lag 0, 3 pairs: ROI 5 G = (2.5 + 2.5 + 1)/3 = 2, IP = IF = (1.5+1.5+1)/3
 *   = 4/3, g2 = 2 / (16/9) = 9/8. ROI 9: G = (9+1+4)/3 = 14/3, IP = IF = 2,
 *   g2 = 7/6.
 * lag 1, 2 pairs: ROI 5 G = (2 + 1.5)/2 = 1.75, IP = 1.5, IF = 1.25,
 *   g2 = 14/15. ROI 9: G = (3 + 2)/2 = 2.5, IP = 2, IF = 1.5, g2 = 5/6. */
static void test_hand_computed(void **state) {
  uint16_t lab[4] = {0, 5, 5, 9};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("lab.npy"), "<u2", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("lab.npy"), 1, 2);
  bh_set(cfg, "intensities", "true");
  bh_set(cfg, "publish_every", "0");
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
  assert_int_equal(h->nres, 0); /* publish_every 0: nothing before the end */
  assert_int_equal(bh_end(h), 0);
  beam_frame_t *g2 = bh_last(h, BEAM_XMT_OUT_G2), *lags = bh_last(h, BEAM_XMT_OUT_LAGS),
               *info = bh_last(h, BEAM_XMT_OUT_INFO);
  assert_non_null(g2);
  assert_true(g2->flags & BEAM_FLAG_FINAL);
  assert_int_equal(g2->shape[0], 2);
  assert_int_equal(g2->shape[1], 2);
  double want[4] = {9.0 / 8, 7.0 / 6, 14.0 / 15, 5.0 / 6};
  for (size_t i = 0; i < 4; i++)
    close_to(((double *)g2->data)[i], want[i], 1e-15, "g2", i);
  double wG[4] = {2, 14.0 / 3, 1.75, 2.5}, wIP[4] = {4.0 / 3, 2, 1.5, 2}, wIF[4] = {4.0 / 3, 2, 1.25, 1.5};
  for (size_t i = 0; i < 4; i++) {
    close_to(((double *)bh_last(h, BEAM_XMT_OUT_G)->data)[i], wG[i], 1e-15, "G", i);
    close_to(((double *)bh_last(h, BEAM_XMT_OUT_IP)->data)[i], wIP[i], 1e-15, "IP", i);
    close_to(((double *)bh_last(h, BEAM_XMT_OUT_IF)->data)[i], wIF[i], 1e-15, "IF", i);
  }
  assert_int_equal(lags->shape[0], 2);
  assert_true(((double *)lags->data)[0] == 0.0 && ((double *)lags->data)[1] == 0.5);
  int64_t *in = info->data;
  assert_int_equal(in[BEAM_XMT_INFO_FRAMES], 3);
  assert_int_equal(in[BEAM_XMT_INFO_ROWS], 2);
  assert_int_equal(in[BEAM_XMT_INFO_NLAGS], 2);
  assert_int_equal(in[BEAM_XMT_INFO_DARK_LABEL], -1);
  assert_int_equal(in[BEAM_XMT_INFO_DARK_ROW], -1);
  assert_string_equal(h->st.outs[0].labels_json, "[5,9]");
  bh_free(&h);
}

/* ---- reference: scikit-beam's closed form, plainly ---------------------- */

typedef struct ref_s {
  size_t nlags, rows;
  double *g2, *G, *IP, *IF;
  int64_t *lag;
} ref_t;

/* frames[N][npix] as doubles, bad[N]; lab[npix] ROI index or -1. */
static void reference(const double *frames, const int *bad, size_t N, size_t npix, const int *lab,
                      size_t R, unsigned levels, unsigned nb, ref_t *o) {
  o->nlags = (size_t)(levels + 1) * nb / 2;
  o->g2 = calloc(o->nlags * R, sizeof(double));
  o->G = calloc(o->nlags * R, sizeof(double));
  o->IP = calloc(o->nlags * R, sizeof(double));
  o->IF = calloc(o->nlags * R, sizeof(double));
  o->lag = calloc(o->nlags, sizeof(int64_t));
  size_t *np = calloc(R, sizeof *np);
  for (size_t p = 0; p < npix; p++)
    if (lab[p] >= 0)
      np[lab[p]]++;
  o->rows = o->nlags;
  for (unsigned L = 0; L < levels; L++) {
    size_t nL = N >> L, blk = (size_t)1 << L;
    double *x = calloc(nL * npix + 1, sizeof *x);
    for (size_t k = 0; k < nL; k++)
      for (size_t p = 0; p < npix; p++) {
        double s = 0;
        for (size_t j = 0; j < blk; j++)
          s += bad[k * blk + j] ? NAN : frames[(k * blk + j) * npix + p];
        x[k * npix + p] = s / (double)blk;
      }
    for (unsigned i = L ? nb / 2 : 0; i < nb; i++) {
      size_t t = (size_t)L * nb / 2 + i;
      o->lag[t] = (int64_t)i << L;
      double npairs = 0;
      double *G = o->G + t * R, *IP = o->IP + t * R, *IF = o->IF + t * R;
      for (size_t k = 0; k + i < nL; k++) {
        if (isnan(x[k * npix]) || isnan(x[(k + i) * npix]))
          continue; /* every pixel of a bad frame is NaN */
        npairs++;
        double *g = calloc(R, sizeof *g), *a = calloc(R, sizeof *a), *b = calloc(R, sizeof *b);
        for (size_t p = 0; p < npix; p++)
          if (lab[p] >= 0) {
            g[lab[p]] += x[k * npix + p] * x[(k + i) * npix + p];
            a[lab[p]] += x[k * npix + p];
            b[lab[p]] += x[(k + i) * npix + p];
          }
        for (size_t r = 0; r < R; r++) {
          G[r] += g[r] / (double)np[r];
          IP[r] += a[r] / (double)np[r];
          IF[r] += b[r] / (double)np[r];
        }
        free(g), free(a), free(b);
      }
      for (size_t r = 0; r < R; r++) {
        if (npairs > 0)
          G[r] /= npairs, IP[r] /= npairs, IF[r] /= npairs;
        o->g2[t * R + r] = G[r] / (IP[r] * IF[r]);
        if (IP[r] == 0 && t < o->rows)
          o->rows = t;
      }
    }
    free(x);
  }
  free(np);
}

static void ref_free(ref_t *o) { free(o->g2), free(o->G), free(o->IP), free(o->IF), free(o->lag); }

/* 12x10 frames, labels with gaps (2, 7, 8, 40), N frames, some BAD and one
 * CORRUPT; dtype u16 (exact path) or f32 (double path). */
/* spike: every 5th frame has one pixel above 32767 and every 7th is
 * bright (17000..21403: two of them in one level-3 block pass 32767): the CPU
 * backend's int16 and int64 slots, pairs of each and of both kinds. */
static void run_random(beam_dtype_t dt, unsigned levels, unsigned nb, size_t N, double rtol, int spike,
                       int banded) {
  enum { H = 12, W = 10 };
  uint32_t sh[2] = {H, W};
  int32_t lab[H * W];
  int idx[H * W];
  const int32_t vals[5] = {0, 2, 7, 8, 40};
  uint64_t seed = 12345;
  for (int p = 0; p < H * W; p++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((seed >> 33) % 5);
    if (p < 4)
      k = p + 1; /* every label present */
    if (banded) /* row bands, column 0 unused: long pixel runs (run gather) */
      k = p % W == 0 ? 0 : 1 + (p / W) % 4;
    lab[p] = vals[k];
    idx[p] = k - 1;
  }
  assert_int_equal(bh_write_npy(tmp_path("rlab.npy"), "<i4", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("rlab.npy"), (int)levels, (int)nb);
  bh_set(cfg, "intensities", "true");
  bh_set(cfg, "publish_every", "7");
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, sh, &d), 0);
  size_t runs = beam_xmt_cpu_gather_runs(&h->st);
  assert_true(banded ? runs == 12 : runs == 0); /* which gather runs */
  double *frames = calloc(N * H * W, sizeof *frames);
  int *bad = calloc(N, sizeof *bad);
  size_t npartial = 0;
  for (size_t k = 0; k < N; k++) {
    beam_frame_t *f = bh_frame_new(dt, 2, sh, k);
    bh_frame_fill(f, 1000 + k, dt == BEAM_DT_U16 ? 9 : 7.5);
    if (spike && dt == BEAM_DT_U16) {
      uint16_t *v = f->data;
      if (k % 7 == 3 || k == 9 || k == 14)
        for (int p = 0; p < H * W; p++)
          v[p] = (uint16_t)(17000 + 37 * p);
      if (k % 5 == 2)
        v[(k * 13) % (H * W)] = (uint16_t)(40000 + k);
    }
    for (int p = 0; p < H * W; p++)
      frames[k * H * W + p] = dt == BEAM_DT_U16 ? ((uint16_t *)f->data)[p] : ((float *)f->data)[p];
    if (k % 11 == 5) {
      f->flags |= BEAM_FLAG_BAD;
      bad[k] = 1;
    }
    if (k == 17) {
      f->flags |= BEAM_FLAG_CORRUPT;
      f->nbytes = 0; /* no payload: must not be read */
      bad[k] = 1;
    }
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
    if ((k + 1) % 7 == 0) {
      npartial++;
      /* the partial result equals the closed form over the frames so far */
      ref_t o;
      reference(frames, bad, k + 1, H * W, idx, 4, levels, nb, &o);
      beam_frame_t *info = bh_last(h, BEAM_XMT_OUT_INFO);
      assert_non_null(info);
      assert_true(info->flags & BEAM_FLAG_PARTIAL);
      assert_int_equal(((int64_t *)info->data)[BEAM_XMT_INFO_ROWS], (int64_t)o.rows);
      assert_int_equal(((int64_t *)info->data)[BEAM_XMT_INFO_FRAMES], (int64_t)(k + 1));
      if (o.rows) {
        beam_frame_t *g2 = bh_last(h, BEAM_XMT_OUT_G2);
        assert_int_equal(g2->shape[0], o.rows);
        for (size_t i = 0; i < o.rows * 4; i++)
          close_to(((double *)g2->data)[i], o.g2[i], rtol, "partial g2", i);
      }
      ref_free(&o);
      bh_clear(h);
    }
  }
  assert_int_equal(bh_end(h), 0);
  assert_int_equal(npartial, N / 7);
  ref_t o;
  reference(frames, bad, N, H * W, idx, 4, levels, nb, &o);
  beam_frame_t *g2 = bh_last(h, BEAM_XMT_OUT_G2), *lags = bh_last(h, BEAM_XMT_OUT_LAGS),
               *info = bh_last(h, BEAM_XMT_OUT_INFO);
  assert_true(g2->flags & BEAM_FLAG_FINAL);
  assert_true(o.rows > nb); /* enough frames to reach level 1 at least */
  assert_int_equal(g2->shape[0], o.rows);
  assert_int_equal(lags->shape[0], o.rows);
  for (size_t t = 0; t < o.rows; t++)
    assert_true(((double *)lags->data)[t] == (double)o.lag[t]);
  for (size_t i = 0; i < o.rows * 4; i++) {
    close_to(((double *)g2->data)[i], o.g2[i], rtol, "g2", i);
    close_to(((double *)bh_last(h, BEAM_XMT_OUT_G)->data)[i], o.G[i], rtol, "G", i);
    close_to(((double *)bh_last(h, BEAM_XMT_OUT_IP)->data)[i], o.IP[i], rtol, "IP", i);
    close_to(((double *)bh_last(h, BEAM_XMT_OUT_IF)->data)[i], o.IF[i], rtol, "IF", i);
  }
  int nb_bad = 0;
  for (size_t k = 0; k < N; k++)
    nb_bad += bad[k];
  assert_int_equal(((int64_t *)info->data)[BEAM_XMT_INFO_BAD], nb_bad);
  assert_int_equal(count(h, BEAM_XMT_OUT_G2, BEAM_FLAG_FINAL), 1);
  assert_string_equal(h->st.outs[0].labels_json, "[2,7,8,40]");
  ref_free(&o);
  free(frames), free(bad);
  bh_free(&h);
}

static void test_reference_u16(void **state) { run_random(BEAM_DT_U16, 4, 4, 61, 1e-13, 0, 0); }
static void test_reference_u16_wide(void **state) {
  run_random(BEAM_DT_U16, 5, 4, 70, 1e-13, 1, 0);
  run_random(BEAM_DT_U16, 5, 4, 70, 1e-13, 1, 1);
}
static void test_reference_f32(void **state) { run_random(BEAM_DT_F32, 3, 6, 50, 1e-12, 0, 0); }

/* per_pixel reference: level means as doubles; per pixel and row, G, IP,
 * IF over the good pairs; g2_p = G / (IP IF) for pixels with IP, IF != 0;
 * per ROI the mean and std (ddof 0) / sqrt(count). Rows as for roi mode. */
static void reference_pp(const double *frames, const int *bad, size_t N, size_t npix, const int *lab,
                         size_t R, unsigned levels, unsigned nb, double *g2, double *err) {
  size_t nlags = (size_t)(levels + 1) * nb / 2;
  for (unsigned L = 0; L < levels; L++) {
    size_t nL = N >> L, blk = (size_t)1 << L;
    double *x = calloc(nL * npix + 1, sizeof *x);
    for (size_t k = 0; k < nL; k++)
      for (size_t p = 0; p < npix; p++) {
        double s = 0;
        for (size_t j = 0; j < blk; j++)
          s += bad[k * blk + j] ? NAN : frames[(k * blk + j) * npix + p];
        x[k * npix + p] = s / (double)blk;
      }
    for (unsigned i = L ? nb / 2 : 0; i < nb; i++) {
      size_t t = (size_t)L * nb / 2 + i;
      for (size_t r = 0; r < R; r++) {
        double sum = 0, sq = 0, cnt = 0;
        for (int pass = 0; pass < 2; pass++)
          for (size_t p = 0; p < npix; p++) {
            if (lab[p] != (int)r)
              continue;
            double G = 0, IP = 0, IF = 0, n = 0;
            for (size_t k = 0; k + i < nL; k++) {
              double a = x[k * npix + p], b = x[(k + i) * npix + p];
              if (isnan(a) || isnan(b))
                continue;
              G += a * b, IP += a, IF += b, n++;
            }
            if (IP == 0 || IF == 0)
              continue;
            double g = (G / n) / ((IP / n) * (IF / n));
            if (pass == 0)
              sum += g, cnt++;
            else
              sq += (g - sum / cnt) * (g - sum / cnt);
          }
        g2[t * R + r] = sum / cnt;
        err[t * R + r] = sqrt(sq / cnt) / sqrt(cnt);
      }
    }
    free(x);
  }
  (void)nlags;
}

/* Sparse random data (many zero pixels, so the IP/IF != 0 rule matters),
 * bad and CORRUPT frames, partial results; g2 and g2_err vs reference_pp,
 * g_num/ip/if still the ROI-mode values, rows as in roi mode. */
static void run_random_pp(beam_dtype_t dt, unsigned levels, unsigned nb, size_t N, double rtol) {
  enum { H = 12, W = 10 };
  uint32_t sh[2] = {H, W};
  int32_t lab[H * W];
  int idx[H * W];
  const int32_t vals[4] = {0, 4, 9, 11};
  uint64_t seed = 777;
  for (int p = 0; p < H * W; p++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((seed >> 33) % 4);
    if (p < 3)
      k = p + 1;
    lab[p] = vals[k];
    idx[p] = k - 1;
  }
  assert_int_equal(bh_write_npy(tmp_path("pplab.npy"), "<i4", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path("pplab.npy"), (int)levels, (int)nb);
  bh_set(cfg, "intensities", "true");
  bh_set(cfg, "publish_every", "9");
  bh_set(cfg, "normalization", "per_pixel");
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, sh, &d), 0);
  assert_int_equal(h->st.nouts, 7);
  assert_string_equal(h->st.outs[6].name, "g2_err");
  size_t R = 3, nlags = (size_t)(levels + 1) * nb / 2;
  double *frames = calloc(N * H * W, sizeof *frames), *g2 = calloc(nlags * R, sizeof *g2),
         *err = calloc(nlags * R, sizeof *err);
  int *bad = calloc(N, sizeof *bad);
  size_t nerr = 0;
  for (size_t k = 0; k < N; k++) {
    beam_frame_t *f = bh_frame_new(dt, 2, sh, k);
    bh_frame_fill(f, 50 + k, dt == BEAM_DT_U16 ? 4 : 3.5);
    for (int p = 0; p < H * W; p++) {
      /* about half the pixels zero: exercises the IP/IF != 0 rule */
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      int zero = (seed >> 40) % 2 == 0;
      if (dt == BEAM_DT_U16) {
        uint16_t *v = f->data;
        v[p] = zero ? 0 : v[p];
        frames[k * H * W + p] = v[p];
      } else {
        float *v = f->data;
        v[p] = zero ? 0.f : v[p];
        frames[k * H * W + p] = v[p];
      }
    }
    if (k % 13 == 4) {
      f->flags |= BEAM_FLAG_BAD;
      bad[k] = 1;
    }
    if (k == 20) {
      f->flags |= BEAM_FLAG_CORRUPT;
      f->nbytes = 0;
      bad[k] = 1;
    }
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
    if ((k + 1) % 9 == 0 || k + 1 == N) {
      if (k + 1 == N)
        assert_int_equal(bh_end(h), 0);
      ref_t o;
      reference(frames, bad, k + 1, H * W, idx, R, levels, nb, &o);
      reference_pp(frames, bad, k + 1, H * W, idx, R, levels, nb, g2, err);
      int64_t *info = bh_last(h, BEAM_XMT_OUT_INFO)->data;
      assert_int_equal(info[BEAM_XMT_INFO_ROWS], (int64_t)o.rows);
      if (o.rows) {
        beam_frame_t *fg = bh_last(h, BEAM_XMT_OUT_G2), *fe = bh_last(h, 6);
        assert_non_null(fe);
        assert_int_equal(fe->shape[0], o.rows);
        for (size_t i = 0; i < o.rows * R; i++) {
          close_to(((double *)fg->data)[i], g2[i], rtol, "pp g2", i);
          /* err is a difference of near-equal terms: compare to the g2 scale */
          double de = fabs(((double *)fe->data)[i] - err[i]);
          if (!(de <= rtol * g2[i]))
            fail_msg("pp g2_err[%zu]: got %.17g, want %.17g", i, ((double *)fe->data)[i], err[i]);
          nerr += err[i] > 0;
          close_to(((double *)bh_last(h, BEAM_XMT_OUT_G)->data)[i], o.G[i], rtol, "pp G", i);
          close_to(((double *)bh_last(h, BEAM_XMT_OUT_IP)->data)[i], o.IP[i], rtol, "pp IP", i);
        }
        if (k + 1 == N)
          assert_true(o.rows > nb && nerr > o.rows); /* the errors are not all zero */
      }
      ref_free(&o);
      if (k + 1 < N)
        bh_clear(h);
    }
  }
  free(frames), free(bad), free(g2), free(err);
  bh_free(&h);
}

static void test_per_pixel_u16(void **state) { run_random_pp(BEAM_DT_U16, 4, 4, 70, 1e-12); }
static void test_per_pixel_f32(void **state) { run_random_pp(BEAM_DT_F32, 3, 6, 55, 1e-12); }

/* per_pixel, u32 near full scale at level 3: sums of 8 frames ~2^35,
 * products ~2^70 cannot be held in int64: the stage refuses to go on
 * (BEAM_ELIMIT, message names the lag) instead of publishing a wrapped
 * sum (here at the first lag-0 pair: 4e9^2 > 2^63). Small counts in
 * the same dtype never do. */
static void test_per_pixel_overflow(void **state) {
  uint8_t lab[4] = {1, 1, 2, 2};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("ov.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  for (int big = 0; big < 2; big++) {
    beam_cnode_t *cfg = cfg_labels(tmp_path("ov.npy"), 4, 2);
    bh_set(cfg, "normalization", "per_pixel");
    bh_t *h = make(cfg);
    beam_diag_t d = {0};
    assert_int_equal(bh_start(h, BEAM_DT_U32, 2, sh, &d), 0);
    int rc = 0;
    uint64_t k;
    for (k = 0; k < 64 && rc == 0; k++) {
      beam_frame_t *f = bh_frame_new(BEAM_DT_U32, 2, sh, k);
      for (int p = 0; p < 4; p++)
        ((uint32_t *)f->data)[p] = big ? 4000000000u - (uint32_t)p : 3u + (uint32_t)p;
      rc = bh_process(h, f);
      bh_frame_free(f);
    }
    if (big) {
      assert_int_equal(rc, BEAM_ELIMIT);
      assert_non_null(strstr(h->st.diag.msg, "overflow"));
      assert_int_equal(bh_end(h), BEAM_ELIMIT);
    } else {
      assert_int_equal(rc, 0);
      assert_int_equal(bh_end(h), 0);
      assert_non_null(bh_last(h, 3)); /* g2_err follows info without intensities */
      assert_string_equal(h->st.outs[3].name, "g2_err");
    }
    bh_free(&h);
  }
}

/* ---- threads: tiles over pixels -------------------------------------------- */

/* 160x256 frames (40960 pixels, 10+ blocks of 4096, so with threads 2 and
 * 3 tiles cut through ROIs): label 4 on the upper half, 9 and 13 mixed at
 * random below (banded: rows alternate, so the run gather), label 2 a
 * handful of pixels. u16: frames 3, 10, 17, ... bright (> 32767 summed)
 * on the lower rows only, and one pixel above 32767 every 5th frame: int16
 * tiles next to int64 tiles of the same level frame. f32: BAD flags and a
 * NaN pixel in frame 11 (found only when the tiles fold) and one in frame
 * 30. Returns the final g2, G, IP, IF (and g2_err) and the partial g2s as
 * one array; threads 1 against the closed form. */
typedef struct tres_s {
  double *v;
  size_t n;
  int64_t info[BEAM_XMT_INFO_N];
} tres_t;

static void append(tres_t *o, const beam_frame_t *f) {
  size_t n = f->nbytes / sizeof(double);
  o->v = realloc(o->v, (o->n + n) * sizeof(double));
  memcpy(o->v + o->n, f->data, n * sizeof(double));
  o->n += n;
}

static void run_threads(beam_dtype_t dt, int per_pixel, int banded, int threads, tres_t *o, int check_ref) {
  enum { H = 160, W = 256, N = 44, LV = 4, NB = 4 };
  uint32_t sh[2] = {H, W};
  static int32_t lab[H * W];
  static int idx[H * W];
  uint64_t seed = 99;
  for (int p = 0; p < H * W; p++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int y = p / W, k;
    if (p % 97 == 5)
      k = 0; /* label 2: a few scattered pixels */
    else if (y < H / 2)
      k = 1;
    else
      k = banded ? 2 + y % 2 : 2 + (int)((seed >> 33) % 2);
    if (p % 31 == 7)
      k = -1; /* unused pixels */
    lab[p] = k < 0 ? 0 : (int32_t[]){2, 4, 9, 13}[k];
    idx[p] = k;
  }
  char path[64];
  snprintf(path, sizeof path, "tlab%d.npy", banded);
  assert_int_equal(bh_write_npy(tmp_path(path), "<i4", 2, sh, lab, sizeof lab), 0);
  beam_cnode_t *cfg = cfg_labels(tmp_path(path), LV, NB);
  char th[16];
  snprintf(th, sizeof th, "%d", threads);
  bh_set(cfg, "threads", th);
  bh_set(cfg, "intensities", "true");
  bh_set(cfg, "publish_every", "13");
  if (per_pixel)
    bh_set(cfg, "normalization", "per_pixel");
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, sh, &d), 0);
  assert_true(banded ? beam_xmt_cpu_gather_runs(&h->st) > 0 || dt != BEAM_DT_U16 || per_pixel : 1);
  double *frames = check_ref ? calloc((size_t)N * H * W, sizeof *frames) : NULL;
  int bad[N] = {0};
  memset(o, 0, sizeof *o);
  for (size_t k = 0; k < N; k++) {
    beam_frame_t *f = bh_frame_new(dt, 2, sh, k);
    bh_frame_fill(f, 7000 + k, dt == BEAM_DT_U16 ? 12 : 9.5);
    for (int p = 0; p < H * W; p++) {
      if (dt == BEAM_DT_U16) {
        uint16_t *v = f->data;
        if (k % 7 == 3 && p / W >= H / 2)
          v[p] = (uint16_t)(17000 + p % 4000);
        if (k % 5 == 2 && p == (int)(k * 4099) % (H * W))
          v[p] = 40000;
      } else if ((k == 11 && p == 23456) || (k == 30 && p == 101)) {
        ((float *)f->data)[p] = NAN;
        bad[k] = 1;
      }
      if (frames)
        frames[k * H * W + p] = dt == BEAM_DT_U16 ? ((uint16_t *)f->data)[p] : ((float *)f->data)[p];
    }
    if (k % 9 == 6) {
      f->flags |= BEAM_FLAG_BAD;
      bad[k] = 1;
    }
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
    if ((k + 1) % 13 == 0) {
      beam_frame_t *g = bh_last(h, BEAM_XMT_OUT_G2);
      if (g)
        append(o, g);
      bh_clear(h);
    }
  }
  assert_int_equal(bh_end(h), 0);
  unsigned outs[5] = {BEAM_XMT_OUT_G2, BEAM_XMT_OUT_G, BEAM_XMT_OUT_IP, BEAM_XMT_OUT_IF, 6};
  for (int i = 0; i < (per_pixel ? 5 : 4); i++) {
    beam_frame_t *g = bh_last(h, outs[i]);
    assert_non_null(g);
    append(o, g);
  }
  memcpy(o->info, bh_last(h, BEAM_XMT_OUT_INFO)->data, sizeof o->info);
  int nbad = 0;
  for (int k = 0; k < N; k++)
    nbad += bad[k];
  assert_int_equal(o->info[BEAM_XMT_INFO_BAD], nbad);
  assert_true(o->info[BEAM_XMT_INFO_ROWS] > NB);
  if (check_ref) {
    size_t R = 4, rows = (size_t)o->info[BEAM_XMT_INFO_ROWS];
    ref_t rf;
    reference(frames, bad, N, H * W, idx, R, LV, NB, &rf);
    assert_int_equal(rows, rf.rows);
    const double *g2 = bh_last(h, BEAM_XMT_OUT_G2)->data, *G = bh_last(h, BEAM_XMT_OUT_G)->data;
    if (per_pixel) {
      size_t nl = (size_t)(LV + 1) * NB / 2;
      double *pg = calloc(nl * R, sizeof *pg), *pe = calloc(nl * R, sizeof *pe);
      reference_pp(frames, bad, N, H * W, idx, R, LV, NB, pg, pe);
      for (size_t i = 0; i < rows * R; i++)
        close_to(g2[i], pg[i], 1e-12, "threads pp g2", i);
      free(pg), free(pe);
    } else {
      for (size_t i = 0; i < rows * R; i++)
        close_to(g2[i], rf.g2[i], 1e-12, "threads g2", i);
    }
    for (size_t i = 0; i < rows * R; i++)
      close_to(G[i], rf.G[i], 1e-12, "threads G", i);
    ref_free(&rf);
    free(frames);
  }
  bh_free(&h);
}

/* threads 1, 2, 3 give the same bits: integer sums are exact, and float
 * sums are taken per fixed block in a fixed order whatever the tiling. */
static void threads_case(beam_dtype_t dt, int per_pixel, int banded) {
  tres_t one, more;
  run_threads(dt, per_pixel, banded, 1, &one, 1);
  for (int th = 2; th <= 3; th++) {
    run_threads(dt, per_pixel, banded, th, &more, 0);
    assert_int_equal(more.n, one.n);
    assert_memory_equal(more.info, one.info, sizeof one.info);
    for (size_t i = 0; i < one.n; i++)
      if (memcmp(&more.v[i], &one.v[i], sizeof(double)) != 0)
        fail_msg("threads %d: value %zu is %.17g, threads 1 gave %.17g", th, i, more.v[i], one.v[i]);
    free(more.v);
  }
  free(one.v);
}

static void test_threads_u16(void **state) {
  threads_case(BEAM_DT_U16, 0, 0);
  threads_case(BEAM_DT_U16, 0, 1);
}
static void test_threads_f32(void **state) { threads_case(BEAM_DT_F32, 0, 1); }
static void test_threads_per_pixel(void **state) {
  threads_case(BEAM_DT_U16, 1, 0);
  threads_case(BEAM_DT_F32, 1, 1);
}

/* per_pixel zero-intensity convention (docs/xpcs.md): a pixel whose past or
 * future intensity is zero on a row is left out of that row's mean and
 * std; an ROI with no pixel left is NaN (g2 and g2_err) though its ROI
 * sums are not zero. 2x2 frames, levels 1, buffers 4, 6 frames:
 *   ROI 1 = pixel 0 (always 0) and pixel 1 (D = 1 2 3 1 2 3);
 *   ROI 2 = pixel 2 (B: 5 in the last frame only), pixel 3 (C: 4 in the
 *   first only).
 * lag 0 (6 pairs): D: G 28, IP = IF = 12, g2 = 28 * 6 / 144 = 7/6; pixel
 *   0 left out (else the mean would be 7/12, as with boost_corr's g2_p =
 *   0); B: 25 * 6 / 25 = 6, C: 16 * 6 / 16 = 6: mean 6, err 0.
 * lag 1 (5 pairs): D: G 19, IP 9, IF 11, g2 = 95/99; B has no past and C
 *   no future intensity: ROI 2 is NaN, while its ROI sums IP 4, IF 5 keep
 *   the row (no truncation). Lags 2, 3 alike. threads 1 and 2 agree. */
static void test_per_pixel_zero_pixels(void **state) {
  uint8_t lab[4] = {1, 1, 2, 2};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("zp.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  const uint16_t D[6] = {1, 2, 3, 1, 2, 3};
  for (int th = 1; th <= 2; th++) {
    beam_cnode_t *cfg = cfg_labels(tmp_path("zp.npy"), 1, 4);
    bh_set(cfg, "normalization", "per_pixel");
    bh_set(cfg, "publish_every", "0");
    bh_set(cfg, "threads", th == 1 ? "1" : "2");
    bh_t *h = make(cfg);
    beam_diag_t d = {0};
    assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
    for (uint64_t k = 0; k < 6; k++) {
      beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, sh, k);
      uint16_t *v = f->data;
      v[0] = 0, v[1] = D[k], v[2] = k == 5 ? 5 : 0, v[3] = k == 0 ? 4 : 0;
      assert_int_equal(bh_process(h, f), 0);
      bh_frame_free(f);
    }
    assert_int_equal(bh_end(h), 0);
    int64_t *info = bh_last(h, BEAM_XMT_OUT_INFO)->data;
    assert_int_equal(info[BEAM_XMT_INFO_ROWS], 4);
    const double *g2 = bh_last(h, BEAM_XMT_OUT_G2)->data, *er = bh_last(h, 3)->data;
    close_to(g2[0], 7.0 / 6, 1e-15, "zero g2 lag 0 roi 1", 0);
    close_to(g2[1], 6.0, 1e-15, "zero g2 lag 0 roi 2", 1);
    close_to(g2[2], 95.0 / 99, 1e-15, "zero g2 lag 1 roi 1", 2);
    assert_true(er[0] == 0 && er[1] == 0 && er[2] == 0);
    for (size_t t = 1; t < 4; t++)
      assert_true(isnan(g2[t * 2 + 1]) && isnan(er[t * 2 + 1]));
    bh_free(&h);
  }
}

/* levels 4, buffers 8: scikit-beam's example list. */
static void test_lag_list(void **state) {
  uint8_t lab[4] = {1, 1, 1, 1};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("one.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  bh_t *h = make(cfg_labels(tmp_path("one.npy"), 4, 8));
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, sh, &d), 0);
  for (uint64_t k = 0; k < 64; k++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U8, 2, sh, k);
    bh_frame_fill(f, k, 5);
    ((uint8_t *)f->data)[0] = 1; /* never a dark frame */
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(bh_end(h), 0);
  const double want[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56};
  beam_frame_t *lags = bh_last(h, BEAM_XMT_OUT_LAGS);
  assert_int_equal(lags->shape[0], 20);
  for (size_t t = 0; t < 20; t++)
    assert_true(((double *)lags->data)[t] == want[t]);
  assert_string_equal(h->st.outs[BEAM_XMT_OUT_LAGS].units, "frames");
  bh_free(&h);
  /* 63 frames: level 3 has 7 frames, so lag 56 (i = 7) has no pair yet */
  h = make(cfg_labels(tmp_path("one.npy"), 4, 8));
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, sh, &d), 0);
  for (uint64_t k = 0; k < 63; k++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U8, 2, sh, k);
    ((uint8_t *)f->data)[0] = 1;
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(bh_end(h), 0);
  int64_t *info = bh_last(h, BEAM_XMT_OUT_INFO)->data;
  assert_int_equal(info[BEAM_XMT_INFO_ROWS], 19);
  assert_int_equal(info[BEAM_XMT_INFO_DARK_LABEL], -1); /* no pair, not a dark ROI */
  assert_int_equal(info[BEAM_XMT_INFO_DARK_ROW], 19);
  bh_free(&h);
}

/* A dark ROI (label 4, zero photons) empties the output for every ROI and
 * info names it; g2 is then not emitted (no zero-length arrays). */
static void test_dark_roi(void **state) {
  uint8_t lab[6] = {1, 1, 4, 4, 2, 2};
  uint32_t sh[2] = {2, 3};
  assert_int_equal(bh_write_npy(tmp_path("dark.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  bh_t *h = make(cfg_labels(tmp_path("dark.npy"), 2, 2));
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  for (uint64_t k = 0; k < 8; k++) {
    beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, sh, k);
    uint16_t *v = f->data;
    v[0] = v[1] = v[4] = v[5] = (uint16_t)(k + 1);
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(bh_end(h), 0);
  int64_t *info = bh_last(h, BEAM_XMT_OUT_INFO)->data;
  assert_int_equal(info[BEAM_XMT_INFO_ROWS], 0);
  assert_int_equal(info[BEAM_XMT_INFO_DARK_LABEL], 4);
  assert_int_equal(info[BEAM_XMT_INFO_DARK_ROW], 0);
  assert_null(bh_last(h, BEAM_XMT_OUT_G2));
  bh_free(&h);
}

/* Rings in pixels and in q give the expected pixel counts. */
static void test_rings(void **state) {
  uint32_t sh[2] = {20, 30};
  beam_cnode_t *cfg = bh_stage_cfg("xpcs_multitau"), *rois = bh_map();
  bh_set(rois, "center", "[14.5, 9.0]");
  bh_set(rois, "radii", "[0, 3, 6.5]");
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg);
  beam_xmt_t *x = h->st.priv;
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  size_t want[2] = {0, 0};
  for (int y = 0; y < 20; y++)
    for (int xx = 0; xx < 30; xx++) {
      double r = hypot(xx - 14.5, y - 9.0);
      want[0] += r < 3;
      want[1] += r >= 3 && r < 6.5;
    }
  assert_int_equal(x->R, 2);
  assert_int_equal(x->rois.off[1], want[0]);
  assert_int_equal(x->rois.off[2] - x->rois.off[1], want[1]);
  assert_string_equal(h->st.outs[0].labels_json, "[1,2]");
  bh_free(&h);

  /* q: 8 keV, 2 m, 75 um pixels, from the series metadata */
  cfg = bh_stage_cfg("xpcs_multitau");
  rois = bh_map();
  bh_set(rois, "center", "[0, 0]");
  bh_set(rois, "q", "[0.0005, 0.003, 0.006]");
  bh_put(cfg, "rois", rois);
  h = make(cfg);
  x = h->st.priv;
  int rc = bh_start(h, BEAM_DT_U16, 2, sh, &d);
  assert_int_equal(rc, BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "energy"));
  h->series.energy_ev = 8000, h->series.distance_m = 2, h->series.pixel_size_m = 75e-6;
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, sh, &d), 0);
  double lam = 12398.419843320026 / 8000;
  size_t wq[2] = {0, 0};
  for (int y = 0; y < 20; y++)
    for (int xx = 0; xx < 30; xx++) {
      double q = 4 * M_PI / lam * sin(atan(hypot(xx, y) * 75e-6 / 2) / 2);
      wq[0] += q >= 0.0005 && q < 0.003;
      wq[1] += q >= 0.003 && q < 0.006;
    }
  assert_true(wq[0] > 0 && wq[1] > 0);
  assert_int_equal(x->rois.off[1], wq[0]);
  assert_int_equal(x->rois.off[2] - x->rois.off[1], wq[1]);
  bh_free(&h);
}

/* center: series and mask: series: the same pixel lists as the centre typed
 * in with the masked pixels left out; q geometry from the series as well.
 * A series without them is refused at its start. */
static int start_on(bh_t *h, const beam_series_t *s, beam_diag_t *d) {
  beam_indesc_t in;
  memset(&in, 0, sizeof in);
  in.dtype = s->dtype;
  in.ndim = s->ndim;
  memcpy(in.shape, s->shape, sizeof in.shape);
  h->st.nouts = 0;
  return h->st.ops->start(&h->st, s, &in, d);
}

static void test_rings_from_series(void **state) {
  uint32_t sh[2] = {20, 30};
  const char *meta = "{\"detector\":\"t\",\"energy\":8000,\"distance\":2,\"pixel_size\":7.5e-5,"
                     "\"beam_center\":[9.0,14.5]}";
  beam_series_t *s = beam_series_new(9, BEAM_DT_U16, 2, sh, meta, strlen(meta));
  static uint32_t mask[20 * 30];
  for (size_t i = 0; i < 20 * 30; i++)
    if (i % 7 == 3 || i / 30 == 9) /* scattered dead pixels and a gap row through the centre */
      mask[i] = 1;
  assert_int_equal(beam_series_add_array(s, "pixel_mask", BEAM_DT_U32, 2, sh, mask, sizeof mask), 0);
  const char *q = "[0.0005, 0.0015, 0.0025]";
  beam_diag_t d = {0};
  beam_cnode_t *cfg = bh_stage_cfg("xpcs_multitau"), *rois = bh_map();
  bh_set(rois, "center", "[14.5, 9.0]");
  bh_set(rois, "q", q);
  bh_put(cfg, "rois", rois);
  bh_t *typed = make(cfg);
  if (start_on(typed, s, &d) != 0)
    fail_msg("start: %s", d.msg);
  cfg = bh_stage_cfg("xpcs_multitau");
  rois = bh_map();
  bh_set(rois, "center", "series");
  bh_set(rois, "q", q);
  bh_set(rois, "mask", "series");
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg);
  assert_int_equal(start_on(h, s, &d), 0);
  const beam_xpcs_rois_t *a = &((beam_xmt_t *)typed->st.priv)->rois, *b = &((beam_xmt_t *)h->st.priv)->rois;
  assert_true(b->cx == 14.5 && b->cy == 9.0);
  assert_int_equal(a->nroi, 2);
  assert_int_equal(b->nroi, 2);
  for (size_t r = 0; r < 2; r++) {
    size_t k = b->off[r];
    for (size_t j = a->off[r]; j < a->off[r + 1]; j++)
      if (!mask[a->idx[j]]) {
        assert_true(k < b->off[r + 1]);
        assert_int_equal(b->idx[k++], a->idx[j]);
      }
    assert_int_equal(k, b->off[r + 1]);
  }
  assert_true(b->total < a->total);
  bh_free(&typed);
  /* Refused at start: no pixel_mask, no beam_center. */
  beam_series_t *bare = beam_series_new(10, BEAM_DT_U16, 2, sh, meta, strlen(meta));
  beam_diag_clear(&d);
  assert_int_equal(start_on(h, bare, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "xpcs_multitau: rois.mask: series, but series 10 carries no \"pixel_mask\""));
  beam_series_unref(&bare);
  const char *nobc = "{\"detector\":\"t\",\"energy\":8000,\"distance\":2,\"pixel_size\":7.5e-5}";
  bare = beam_series_new(11, BEAM_DT_U16, 2, sh, nobc, strlen(nobc));
  assert_int_equal(beam_series_add_array(bare, "pixel_mask", BEAM_DT_U32, 2, sh, mask, sizeof mask), 0);
  beam_diag_clear(&d);
  assert_int_equal(start_on(h, bare, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "xpcs_multitau: rois.center: series, but the metadata of series 11 has no beam_center"));
  beam_series_unref(&bare);
  /* A mask of another shape. */
  uint32_t other[2] = {30, 20};
  bare = beam_series_new(12, BEAM_DT_U16, 2, sh, meta, strlen(meta));
  assert_int_equal(beam_series_add_array(bare, "pixel_mask", BEAM_DT_U32, 2, other, mask, sizeof mask), 0);
  beam_diag_clear(&d);
  assert_int_equal(start_on(h, bare, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "the mask (from the series) is [30, 20] but the frames are [20, 30]"));
  beam_series_unref(&bare);
  bh_free(&h);
  beam_series_unref(&s);
}

static void expect_start_error(beam_cnode_t *cfg, uint32_t h0, uint32_t w0, int rc_want, const char *msg) {
  bh_t *h = make(cfg);
  beam_diag_t d = {0};
  uint32_t sh[2] = {h0, w0};
  int rc = bh_start(h, BEAM_DT_U16, 2, sh, &d);
  if (rc != rc_want || !strstr(d.msg, msg))
    fail_msg("start rc %d \"%s\", want %d with \"%s\"", rc, d.msg, rc_want, msg);
  bh_free(&h);
}

static void test_errors(void **state) {
  char msg[512];
  /* odd buffers: a config error at load */
  beam_cnode_t *cfg = cfg_labels("/nonexistent.npy", 2, 5);
  assert_true(bh_validate(cfg, beam_xpcs_multitau_params, msg, sizeof msg) > 0);
  assert_non_null(strstr(msg, "even"));
  beam_cnode_free(cfg);
  /* shape mismatch */
  uint8_t lab[4] = {1, 0, 2, 2};
  uint32_t sh[2] = {2, 2};
  assert_int_equal(bh_write_npy(tmp_path("e.npy"), "|u1", 2, sh, lab, sizeof lab), 0);
  expect_start_error(cfg_labels(tmp_path("e.npy"), 2, 2), 3, 2, BEAM_ESHAPE, "label image is [2, 2]");
  /* an ROI emptied by the bad-pixel mask */
  uint8_t m[4] = {1, 0, 0, 0};
  assert_int_equal(bh_write_npy(tmp_path("m.npy"), "|u1", 2, sh, m, sizeof m), 0);
  cfg = cfg_labels(tmp_path("e.npy"), 2, 2);
  bh_set((beam_cnode_t *)beam_cfg_get(cfg, "rois"), "mask", tmp_path("m.npy"));
  expect_start_error(cfg, 2, 2, BEAM_ESHAPE, "label 1 has no pixel");
  /* a ring outside the detector */
  cfg = bh_stage_cfg("xpcs_multitau");
  beam_cnode_t *rois = bh_map();
  bh_set(rois, "center", "[1, 1]");
  bh_set(rois, "radii", "[0, 2, 50, 60]");
  bh_put(cfg, "rois", rois);
  expect_start_error(cfg, 10, 10, BEAM_ESHAPE, "ring 3 [50, 60) px is outside the 10x10 detector");
  /* a narrow ring between pixel distances: no pixel */
  cfg = bh_stage_cfg("xpcs_multitau");
  rois = bh_map();
  bh_set(rois, "center", "[0, 0]");
  bh_set(rois, "radii", "[0, 1.1, 1.2]");
  bh_put(cfg, "rois", rois);
  expect_start_error(cfg, 10, 10, BEAM_ESHAPE, "label 2 has no pixel");
  /* file and rings together; missing file */
  cfg = cfg_labels(tmp_path("e.npy"), 2, 2);
  bh_set((beam_cnode_t *)beam_cfg_get(cfg, "rois"), "center", "[1, 1]");
  assert_int_equal(bh_validate(cfg, beam_xpcs_multitau_params, msg, sizeof msg), 0);
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(bh_new(&h, &beam_xpcs_multitau_cpu_ops, cfg, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "not both"));
  bh_free(&h);
  cfg = cfg_labels("/nonexistent/lab.npy", 2, 2);
  assert_int_equal(bh_validate(cfg, beam_xpcs_multitau_params, msg, sizeof msg), 0);
  memset(&d, 0, sizeof d);
  assert_true(bh_new(&h, &beam_xpcs_multitau_cpu_ops, cfg, &d) < 0);
  if (!strstr(d.msg, "rois.file"))
    fail_msg("message \"%s\" lacks rois.file", d.msg);
  bh_free(&h);
  /* complex frames are refused at start */
  h = make(cfg_labels(tmp_path("e.npy"), 2, 2));
  assert_int_equal(bh_start(h, BEAM_DT_C64, 2, sh, &d), BEAM_ESHAPE);
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed), cmocka_unit_test(test_reference_u16),
      cmocka_unit_test(test_reference_f32), cmocka_unit_test(test_lag_list),
      cmocka_unit_test(test_reference_u16_wide),
      cmocka_unit_test(test_dark_roi),      cmocka_unit_test(test_rings),
      cmocka_unit_test(test_rings_from_series),
      cmocka_unit_test(test_errors),        cmocka_unit_test(test_per_pixel_u16),
      cmocka_unit_test(test_per_pixel_f32), cmocka_unit_test(test_per_pixel_overflow),
      cmocka_unit_test(test_threads_u16),   cmocka_unit_test(test_threads_f32),
      cmocka_unit_test(test_threads_per_pixel), cmocka_unit_test(test_per_pixel_zero_pixels),
  };
  return beam_run_tests(tests, NULL, NULL);
}
