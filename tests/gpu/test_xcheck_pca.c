/* CPU vs CUDA for `pca`, plain and `robust`. Not bit-identical: both round
 * float32 GEMMs, in different orders (OpenBLAS vs cuBLAS tiling), and the
 * Gram matrix on the GPU is summed differently. Tolerances, for the
 * synthetic data below (k = 3 = the true rank, so every kept direction is
 * well separated from the noise; P = 4096 or 1024 after binning):
 *   subspace: largest principal angle between the final components < 0.5
 *     deg (the CPU is 0.03 deg from a double batch SVD of the same frames;
 *     rounding differences are far smaller than that gap to the noise);
 *   singular values, explained variance: relative 1e-3;
 *   scores: |s_gpu - s_cpu| <= 1e-3 |s_cpu| + 1e-3 sqrt(P) per frame: a
 *     score is a dot product over P pixels of |x - mu| ~ 1 (Anscombe units)
 *     with a unit vector; a 1e-3 sqrt(P) absolute term covers a rotation of
 *     the components by 1e-3 rad, the relative one the GEMM rounding;
 *   residuals: relative 1e-3; mean: 1e-4 relative + 1e-5;
 *   denoised pixels (mu + V^T a): 1e-3 relative + 1e-2: the same 1e-3 rad
 *     rotation moves a pixel by about k 1e-3 sqrt(P) |V_p| ~ k 1e-3;
 *   sparse pixels (robust): 1e-3 relative + 2e-2: soft thresholding is
 *     1-Lipschitz in e (bounded as the denoised pixels) and in tau (5
 *     sigma ~ 5, relative 1e-3 from the MAD of slightly other values);
 *   same results in the same order with the same frame ids and flags
 *   (ANOMALY included; the robust case's outlier frames must carry it,
 *   which also means both sides left them out of the update), except
 *   denoised/sparse, which are rate-limited by the wall clock and so are
 *   compared where both sides emitted the frame (the first one always).
 * Every case prints the largest errors it saw (as a fraction of the bound).
 * Skips without a GPU (the CUDA init must then refuse cleanly). */
#include <lapacke.h>
#include <stdlib.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/pca.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"

typedef struct pca_case_s {
  const char *name;
  int h, w, nframes;
  int robust;
  int spikes;        /* hot pixels per frame (+500 counts) */
  int outlier_first; /* two frames from here get a strong extra pattern; 0 = none */
} pca_case_t;

static const pca_case_t *cur;

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("pca");
  bh_set(c, "components", "3");
  bh_set(c, "batch", "32");
  bh_set(c, "publish_every", "128");
  /* Wall-clock limited: 1000 Hz is the schema's maximum, so most batches
   * emit one (the first scored frame always). */
  bh_set(c, "denoised_rate", cur->robust ? "1000" : "0");
  bh_set(c, "poisson", "true");
  if (cur->robust)
    bh_set(c, "robust", "true");
  beam_cnode_t *b = bh_map();
  bh_set(b, "factor", "2");
  bh_put(c, "bin", b);
  return c;
}

static uint64_t st = 12345;
static double urand(void) {
  st ^= st << 13;
  st ^= st >> 7;
  st ^= st << 17;
  return ((st >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double max_angle_deg(const float *A, const float *B, int k, int P) {
  double *a = malloc(sizeof(double) * k * P), *b = malloc(sizeof(double) * k * P);
  for (int i = 0; i < k * P; i++)
    a[i] = A[i], b[i] = B[i];
  /* Components are orthonormal to float precision; re-orthonormalise. */
  for (double *m = a; m; m = (m == a ? b : NULL))
    for (int i = 0; i < k; i++) {
      for (int j = 0; j < i; j++) {
        double dd = 0;
        for (int p = 0; p < P; p++)
          dd += m[i * P + p] * m[j * P + p];
        for (int p = 0; p < P; p++)
          m[i * P + p] -= dd * m[j * P + p];
      }
      double n = 0;
      for (int p = 0; p < P; p++)
        n += m[i * P + p] * m[i * P + p];
      for (int p = 0; p < P; p++)
        m[i * P + p] /= sqrt(n);
    }
  double C[9], sv[3], u[1], vt[1], sup[3];
  for (int i = 0; i < k; i++)
    for (int j = 0; j < k; j++) {
      double dd = 0;
      for (int p = 0; p < P; p++)
        dd += a[i * P + p] * b[j * P + p];
      C[i * k + j] = dd;
    }
  assert_int_equal(LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'N', k, k, C, k, sv, u, 1, vt, 1, sup), 0);
  free(a);
  free(b);
  return acos(sv[k - 1] > 1 ? 1 : sv[k - 1]) * 180 / M_PI;
}

/* Largest error seen for one output, as a fraction of its bound. */
typedef struct err_s {
  double frac, abs;
  size_t n;
} err_t;

static void within(err_t *e, const char *what, uint64_t fid, size_t i, double c, double g, double bound) {
  if (isnan(c) && isnan(g))
    return; /* pixels outside the kept set are NaN on both sides */
  double d = fabs(g - c);
  if (!(d <= bound))
    fail_msg("%s frame %llu [%zu]: cpu %.9g cuda %.9g (bound %.3g)", what, (unsigned long long)fid, i, c, g, bound);
  e->frac = d / bound > e->frac ? d / bound : e->frac;
  e->abs = d > e->abs ? d : e->abs;
  e->n++;
}

/* Indices of the results of output `out`, in order. */
static size_t of_out(const bh_t *h, unsigned out, size_t *idx) {
  size_t n = 0;
  for (size_t i = 0; i < h->nres; i++)
    if (h->res_out[i] == out)
      idx[n++] = i;
  return n;
}

static void run_case(const pca_case_t *pc) {
  cur = pc;
  int H = pc->h, W = pc->w, PIX = H * W, P = (H / 2) * (W / 2), k = 3;
  xpair_t x;
  xpair_new(&x, &beam_pca_cpu_ops, &beam_pca_cuda_ops, beam_pca_params, cfg_of);
  uint32_t shp[2] = {(uint32_t)H, (uint32_t)W};
  xpair_start(&x, BEAM_DT_U16, 2, shp);
  /* Poisson counts around a mean image plus 3 blob patterns with random
   * amplitudes (Knuth's sampler is slow; normal approximation, rounded). */
  float *pat = malloc(sizeof(float) * 4 * PIX);
  for (int j = 0; j < 4; j++)
    for (int y = 0; y < H; y++)
      for (int xx = 0; xx < W; xx++) {
        double cy = H * (30 + 35 * j % 100) / 128.0, cx = W * (90 - 25 * j) / 128.0, r2 = 300.0 * H * W / (128 * 128);
        pat[j * PIX + y * W + xx] = (float)(40 * exp(-((y - cy) * (y - cy) + (xx - cx) * (xx - cx)) / r2));
      }
  for (uint64_t fr = 0; fr < (uint64_t)pc->nframes; fr++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, fr);
    double a[4] = {2 * urand(), 2 * urand(), 2 * urand(), 0};
    if (pc->outlier_first && (fr == (uint64_t)pc->outlier_first || fr == (uint64_t)pc->outlier_first + 1))
      a[3] = 10;
    for (int p = 0; p < PIX; p++) {
      double lam = 20;
      for (int j = 0; j < 4; j++)
        lam += a[j] * pat[j * PIX + p];
      double g = sqrt(-2 * log(urand())) * cos(2 * M_PI * urand());
      double v = lam + sqrt(lam) * g;
      ((uint16_t *)in->data)[p] = (uint16_t)(v < 0 ? 0 : v + 0.5);
    }
    for (int sp = 0; sp < pc->spikes; sp++)
      ((uint16_t *)in->data)[(size_t)(urand() * PIX) % (size_t)PIX] += 500;
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  free(pat);
  xpair_end(&x);
  const bh_t *c = x.cpu, *g = x.gpu;
  size_t *ic = malloc(sizeof(size_t) * (c->nres + 1)), *ig = malloc(sizeof(size_t) * (g->nres + 1));
  err_t e[BEAM_PCA_OUT_SPARSE + 1] = {{0}};
  double worst_angle = 0;
  size_t nscores = 0, matched_den = 0;
  for (unsigned out = 0; out <= BEAM_PCA_OUT_SPARSE; out++) {
    size_t nc = of_out(c, out, ic), ng = of_out(g, out, ig);
    int by_id = out == BEAM_PCA_OUT_DENOISED || out == BEAM_PCA_OUT_SPARSE;
    if (!by_id && nc != ng)
      fail_msg("output %u: %zu results from cpu, %zu from cuda", out, nc, ng);
    for (size_t a = 0, b = 0; a < nc && b < ng;) {
      const beam_frame_t *fa = c->res[ic[a]], *fb = g->res[ig[b]];
      if (by_id && fa->frame_id != fb->frame_id) {
        if (fa->frame_id < fb->frame_id)
          a++;
        else
          b++;
        continue;
      }
      assert_int_equal(fa->frame_id, fb->frame_id);
      if (fa->flags != fb->flags)
        fail_msg("output %u frame %llu: flags cpu %#x cuda %#x", out, (unsigned long long)fa->frame_id, fa->flags,
                 fb->flags);
      assert_int_equal(fa->nbytes, fb->nbytes);
      const float *va = fa->data, *vb = fb->data;
      size_t n = fa->nbytes / sizeof(float);
      uint64_t id = fa->frame_id;
      switch (out) {
      case BEAM_PCA_OUT_SCORES:
        for (int j = 0; j < k; j++)
          within(&e[out], "score", id, j, va[j], vb[j], 1e-3 * fabs(va[j]) + 1e-3 * sqrt((double)P));
        nscores++;
        break;
      case BEAM_PCA_OUT_RESIDUAL:
        within(&e[out], "residual", id, 0, va[0], vb[0], 1e-3 * fabs(va[0]));
        break;
      case BEAM_PCA_OUT_DENOISED:
        for (size_t p = 0; p < n; p++)
          within(&e[out], "denoised", id, p, va[p], vb[p], 1e-3 * fabs(va[p]) + 1e-2);
        matched_den++;
        break;
      case BEAM_PCA_OUT_SPARSE:
        for (size_t p = 0; p < n; p++)
          within(&e[out], "sparse", id, p, va[p], vb[p], 1e-3 * fabs(va[p]) + 2e-2);
        break;
      case BEAM_PCA_OUT_COMPONENTS: {
        double ang = max_angle_deg(va, vb, k, P);
        worst_angle = ang > worst_angle ? ang : worst_angle;
        if (!(ang < 0.5))
          fail_msg("components differ by %.3f deg", ang);
        break;
      }
      case BEAM_PCA_OUT_SV:
      case BEAM_PCA_OUT_EVR:
        for (int j = 0; j < k; j++)
          within(&e[out], out == BEAM_PCA_OUT_SV ? "sv" : "evr", id, j, va[j], vb[j], 1e-3 * fabs(va[j]) + 1e-7);
        break;
      case BEAM_PCA_OUT_MEAN:
        for (size_t p = 0; p < n; p++)
          within(&e[out], "mean", id, p, va[p], vb[p], 1e-4 * fabs(va[p]) + 1e-5);
        break;
      }
      if (out == BEAM_PCA_OUT_SCORES && pc->outlier_first &&
          (id == (uint64_t)pc->outlier_first || id == (uint64_t)pc->outlier_first + 1) &&
          !(fa->flags & BEAM_FLAG_ANOMALY))
        fail_msg("outlier frame %llu not flagged ANOMALY: the case does not test rejection", (unsigned long long)id);
      a++, b++;
    }
  }
  printf("# %s: %zu score frames, %zu denoised matched; worst component angle %.2e deg; "
         "max |err| / bound: scores %.2e residual %.2e denoised %.2e sparse %.2e sv %.2e evr %.2e mean %.2e; "
         "max |err|: scores %.2e denoised %.2e sparse %.2e\n",
         pc->name, nscores, matched_den, worst_angle, e[BEAM_PCA_OUT_SCORES].frac, e[BEAM_PCA_OUT_RESIDUAL].frac,
         e[BEAM_PCA_OUT_DENOISED].frac, e[BEAM_PCA_OUT_SPARSE].frac, e[BEAM_PCA_OUT_SV].frac,
         e[BEAM_PCA_OUT_EVR].frac, e[BEAM_PCA_OUT_MEAN].frac, e[BEAM_PCA_OUT_SCORES].abs,
         e[BEAM_PCA_OUT_DENOISED].abs, e[BEAM_PCA_OUT_SPARSE].abs);
  assert_int_equal(nscores, (size_t)pc->nframes - 32);
  if (pc->robust) {
    if (matched_den == 0 || e[BEAM_PCA_OUT_SPARSE].n == 0)
      fail_msg("robust: no denoised/sparse frame compared");
  }
  free(ic);
  free(ig);
  xpair_free(&x);
}

static void skip_without_gpu(void) {
  static const pca_case_t any = {"any", 128, 128, 64, 0, 0, 0};
  cur = &any;
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_pca_cuda_ops, beam_pca_params, cfg_of);
}

static void test_xcheck_pca(void **state) {
  skip_without_gpu();
  static const pca_case_t c = {"plain", 128, 128, 512, 0, 0, 0};
  run_case(&c);
}

/* P = 4096 > BEAM_PCA_NSAMP: the noise scale's subsample is the hashed
 * runs; spikes for the sparse part, two outlier frames in one batch for
 * the rejection (robust_drop on the GPU). */
static void test_xcheck_pca_robust(void **state) {
  skip_without_gpu();
  static const pca_case_t c = {"robust", 128, 128, 320, 1, 40, 200};
  run_case(&c);
}

/* P = 1024 <= BEAM_PCA_NSAMP: every pixel is in the subsample. */
static void test_xcheck_pca_robust_small(void **state) {
  skip_without_gpu();
  static const pca_case_t c = {"robust small", 64, 64, 192, 1, 10, 100};
  run_case(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_xcheck_pca), cmocka_unit_test(test_xcheck_pca_robust),
                                     cmocka_unit_test(test_xcheck_pca_robust_small)};
  return beam_run_tests(tests, NULL, NULL);
}
