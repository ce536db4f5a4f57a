/* Stage kind `pca`, CPU backend, robust mode on frames large enough that
 * the split (pca_cpu.c robust_split) runs in more than one chunk of pixels
 * (RCHUNK = 8192 there; 97 x 96 = 9312 pixels: one whole chunk and a part)
 * and takes its noise scale from a subsample (more than BEAM_PCA_NSAMP
 * pixels), with its passes spread over the stage's thread pool:
 *   - the scores and residuals of a batch against a plain double-precision
 *     loop of the split as pca.h states it, from the model the stage
 *     published before that batch;
 *   - the same bits from a pool of 1 thread and of 2 (the work is split
 *     into fixed frame groups, not by thread count).
 * The statistical behaviour of robust mode (spikes kept out of the model,
 * glitch frames left out) is tested in test_kern_pca.c on smaller frames. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/pca.h"
#include "pipeline/fjpool.h"
#include "tests/common/stage_harness.h"

#define FH 97
#define FW 400 /* 5 chunks of BEAM_PCA_RCHUNK: the order partial sums are added in matters */
#define NP (FH * FW)
#define K 3
#define B 16
#define NFR (4 * B)
#define ITERS 3
#define LAMBDA 5.0
#define SPIKE 300.0

static uint64_t rng;
static double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double grand(void) { return sqrt(-2 * log(urand())) * cos(2 * M_PI * urand()); }

/* Frame i: a smooth mean, three random patterns with random amplitudes
 * (sd 40, 25, 15 over patterns of unit-variance pixels / 10), unit noise,
 * and SPIKE on 0.5 % of the pixels. The same frames for every run. */
static float frames[NFR][NP];
static void make_frames(void) {
  static double pat[3][NP];
  rng = 0x243F6A8885A308D3ull;
  for (int j = 0; j < 3; j++)
    for (int p = 0; p < NP; p++)
      pat[j][p] = grand() / 10;
  const double sd[3] = {40, 25, 15};
  for (int i = 0; i < NFR; i++) {
    double a[3];
    for (int j = 0; j < 3; j++)
      a[j] = sd[j] * grand();
    for (int p = 0; p < NP; p++) {
      double v = 200 + 30 * sin(p * 0.003) + grand();
      for (int j = 0; j < 3; j++)
        v += a[j] * pat[j][p];
      if (urand() < 0.005)
        v += SPIKE;
      frames[i][p] = (float)(v > 0 ? v : 0);
    }
  }
}

/* Runs the robust stage over the frames (dtype U16: rounded, or F32) with
 * a pool of pool_threads (the stage sizes its pool by the BLAS thread
 * count at start); the BLAS itself runs on 1 thread while frames are
 * processed, so only the pool differs between runs. */
static bh_t *run(unsigned pool_threads, beam_dtype_t dt) {
  beam_cnode_t *cfg = bh_stage_cfg("pca");
  bh_set(cfg, "components", "3");
  bh_set(cfg, "batch", "16");
  bh_set(cfg, "denoised_rate", "0"); /* rate-limited by the clock: not repeatable */
  bh_set(cfg, "publish_every", "16");
  bh_set(cfg, "robust", "true");
  bh_t *h = bh_make(cfg, beam_pca_params, &beam_pca_cpu_ops, 0, NULL);
  uint32_t shp[2] = {FH, FW};
  beam_diag_t d = {0};
  openblas_set_num_threads((int)pool_threads);
  assert_int_equal(bh_start(h, dt, 2, shp, &d), 0);
  openblas_set_num_threads(1);
  for (int i = 0; i < NFR; i++) {
    beam_frame_t *f = bh_frame_new(dt, 2, shp, (uint64_t)i);
    for (int p = 0; p < NP; p++)
      if (dt == BEAM_DT_U16)
        ((uint16_t *)f->data)[p] = (uint16_t)lrintf(frames[i][p]);
      else
        ((float *)f->data)[p] = frames[i][p];
    assert_int_equal(bh_process(h, f), 0);
    bh_frame_free(f);
  }
  assert_int_equal(bh_end(h), 0);
  return h;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_d(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* pca.h's split of one frame x against the model (mu, V), in double:
 * scores of y = x - s into S, residual |y - mu - V^T S| / sqrt(P). */
static void ref_split(const float *x, const float *mu, const float *V, double *S, double *res) {
  static double c[NP], e[NP], smp[BEAM_PCA_NSAMP];
  double A0[K];
  size_t ns = beam_pca_samp_n(NP);
  for (int p = 0; p < NP; p++)
    c[p] = (double)x[p] - mu[p];
  for (int i = 0; i < K; i++) {
    A0[i] = 0;
    for (int p = 0; p < NP; p++)
      A0[i] += (double)V[i * NP + p] * c[p];
    S[i] = A0[i];
  }
  for (int t = 0; t < ITERS; t++) {
    for (int p = 0; p < NP; p++) {
      e[p] = c[p];
      for (int i = 0; i < K; i++)
        e[p] -= S[i] * V[i * NP + p];
    }
    for (size_t i = 0; i < ns; i++)
      smp[i] = e[beam_pca_samp_idx(NP, i)];
    double med = median_d(smp, ns), mabs = 0;
    for (size_t i = 0; i < ns; i++) {
      smp[i] = fabs(smp[i] - med);
      mabs += smp[i];
    }
    double mad = median_d(smp, ns), tau = LAMBDA * (mad > 0 ? 1.4826 * mad : 1.2533 * mabs / (double)ns);
    for (int i = 0; i < K; i++)
      S[i] = A0[i];
    for (int p = 0; p < NP; p++) {
      double a = fabs(e[p]) - tau, s = a > 0 ? copysign(a, e[p]) : 0.0;
      e[p] = s; /* now s_p */
      for (int i = 0; i < K; i++)
        S[i] -= s * V[i * NP + p];
    }
  }
  double r2 = 0;
  for (int p = 0; p < NP; p++) {
    double y = c[p] - e[p];
    for (int i = 0; i < K; i++)
      y -= S[i] * V[i * NP + p];
    r2 += y * y;
  }
  *res = sqrt(r2 / NP);
}

/* The n-th result of output `out` (0-based), or NULL. */
static const beam_frame_t *nth(const bh_t *h, unsigned out, int n) {
  for (size_t i = 0; i < h->nres; i++)
    if (h->res_out[i] == out && n-- == 0)
      return h->res[i];
  return NULL;
}

/* Batch 3 (frames 32..47) against ref_split from the model published after
 * batch 2 (the second components and mean results: publish_every = b).
 * Float against double: the scores (about 40 in size) agree to 1e-5 of
 * their size plus the float rounding of A0 (P terms of about 1); 5e-3
 * absolute allows 20x that. Leaving out the sparse correction moves a
 * score by about sqrt(45 spikes) 300 / sqrt(P) = 20, a chunk left out by
 * the same order. */
static void test_split_matches_reference(void **state) {
  bh_t *h = run(2, BEAM_DT_F32);
  const beam_frame_t *comp = nth(h, BEAM_PCA_OUT_COMPONENTS, 1), *mean = nth(h, BEAM_PCA_OUT_MEAN, 1);
  assert_non_null(comp);
  assert_non_null(mean);
  double worst_s = 0, worst_r = 0, moved = 0;
  int nchk = 0;
  for (size_t i = 0; i < h->nres; i++) {
    const beam_frame_t *f = h->res[i];
    if (h->res_out[i] != BEAM_PCA_OUT_SCORES || f->frame_id < 2 * B || f->frame_id >= 3 * B)
      continue;
    double S[K], r;
    ref_split(frames[f->frame_id], mean->data, comp->data, S, &r);
    const float *got = f->data;
    for (int k = 0; k < K; k++) {
      double d = fabs(got[k] - S[k]);
      worst_s = !(d <= worst_s) ? d : worst_s;
    }
    const beam_frame_t *rf = NULL;
    for (size_t j = 0; j < h->nres && !rf; j++)
      if (h->res_out[j] == BEAM_PCA_OUT_RESIDUAL && h->res[j]->frame_id == f->frame_id)
        rf = h->res[j];
    assert_non_null(rf);
    double dr = fabs(((const float *)rf->data)[0] - r) / r;
    worst_r = !(dr <= worst_r) ? dr : worst_r;
    /* how far the split moved the scores: the check has teeth */
    double a0 = 0;
    for (int p = 0; p < NP; p++)
      a0 += (double)((const float *)comp->data)[p] * ((double)frames[f->frame_id][p] - ((const float *)mean->data)[p]);
    moved = fmax(moved, fabs(a0 - S[0]));
    nchk++;
  }
  printf("# %d frames of batch 3 vs the double split: scores within %.2e, residuals within %.2e (relative); "
         "the split moved score 0 by up to %.1f\n",
         nchk, worst_s, worst_r, moved);
  assert_int_equal(nchk, B);
  assert_true(worst_s <= 5e-3);
  assert_true(worst_r <= 1e-4);
  assert_true(moved > 1.0);
  bh_free(&h);
}

/* Every result (scores, residuals, flags, and the models published after
 * each batch) bit for bit the same from a pool of 1 thread and of 2. */
static void test_pool_size_same_bits(void **state) {
  if (beam_fjpool_cores() < 2) {
    printf("# one core: the pool cannot have 2 threads\n");
    skip();
  }
  bh_t *a = run(1, BEAM_DT_U16), *b = run(2, BEAM_DT_U16);
  assert_int_equal(a->nres, b->nres);
  size_t nmodel = 0;
  for (size_t i = 0; i < a->nres; i++) {
    assert_int_equal(a->res_out[i], b->res_out[i]);
    assert_int_equal(a->res[i]->frame_id, b->res[i]->frame_id);
    assert_int_equal(a->res[i]->flags, b->res[i]->flags);
    assert_int_equal(a->res[i]->nbytes, b->res[i]->nbytes);
    assert_int_equal(bh_bits_differ(a->res[i]->data, b->res[i]->data, a->res[i]->nbytes), 0);
    nmodel += a->res_out[i] == BEAM_PCA_OUT_COMPONENTS;
  }
  printf("# %zu results the same on 1 and 2 threads (%zu models)\n", a->nres, nmodel);
  assert_true(nmodel >= 3);
  bh_free(&a);
  bh_free(&b);
}

int main(void) {
  make_frames();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_matches_reference),
      cmocka_unit_test(test_pool_size_same_bits),
  };
  return beam_run_tests(tests, NULL, NULL);
}
