/* CPU vs CUDA for `pca`. Not bit-identical: both round float32 GEMMs, in
 * different orders (OpenBLAS vs cuBLAS tiling), and the Gram matrix on the
 * GPU is summed differently. Tolerances, for the synthetic data below
 * (P = 4096 after binning, k = 3 = the true rank, so every kept
 * direction is well separated from the noise):
 *   subspace: largest principal angle between the final components < 0.5
 *     deg (the CPU is 0.03 deg from a double batch SVD of the same frames;
 *     rounding differences are far smaller than that gap to the noise);
 *   singular values, explained variance: relative 1e-3;
 *   scores: |s_gpu - s_cpu| <= 1e-3 |s_cpu| + 1e-3 sqrt(P) per frame: a
 *     score is a dot product over P pixels of |x - mu| ~ 1 (Anscombe units)
 *     with a unit vector; a 1e-3 sqrt(P) absolute term covers a rotation of
 *     the components by 1e-3 rad, the relative one the GEMM rounding;
 *   residuals: relative 1e-3; same results, order, frame ids and flags.
 * Skips without a GPU (the CUDA init must then refuse cleanly). */
#include <lapacke.h>
#include <stdlib.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/pca.h"
#include "tests/gpu/xcheck.h"

#define H 128
#define W 128
#define PIX (H * W)

static beam_cnode_t *cfg_of(void) {
  beam_cnode_t *c = bh_stage_cfg("pca");
  bh_set(c, "components", "3");
  bh_set(c, "batch", "32");
  bh_set(c, "publish_every", "128");
  bh_set(c, "denoised_rate", "0");
  bh_set(c, "poisson", "true");
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

static void test_xcheck_pca(void **state) {
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_pca_cuda_ops, beam_pca_params, cfg_of);
  xpair_t x;
  xpair_new(&x, &beam_pca_cpu_ops, &beam_pca_cuda_ops, beam_pca_params, cfg_of);
  uint32_t shp[2] = {H, W};
  xpair_start(&x, BEAM_DT_U16, 2, shp);
  /* Poisson counts around a mean image plus 3 blob patterns with random
   * amplitudes (Knuth's sampler is slow; normal approximation, rounded). */
  static float pat[3][PIX];
  for (int j = 0; j < 3; j++)
    for (int y = 0; y < H; y++)
      for (int xx = 0; xx < W; xx++) {
        double cy = 30 + 35 * j, cx = 90 - 25 * j;
        pat[j][y * W + xx] = (float)(40 * exp(-((y - cy) * (y - cy) + (xx - cx) * (xx - cx)) / 300.0));
      }
  for (uint64_t fr = 0; fr < 512; fr++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, fr);
    double a[3];
    for (int j = 0; j < 3; j++)
      a[j] = 2 * urand();
    for (int p = 0; p < PIX; p++) {
      double lam = 20 + a[0] * pat[0][p] + a[1] * pat[1][p] + a[2] * pat[2][p];
      double g = sqrt(-2 * log(urand())) * cos(2 * M_PI * urand());
      double v = lam + sqrt(lam) * g;
      ((uint16_t *)in->data)[p] = (uint16_t)(v < 0 ? 0 : v + 0.5);
    }
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  const bh_t *c = x.cpu, *g = x.gpu;
  assert_int_equal(c->nres, g->nres);
  int P = (H / 2) * (W / 2), k = 3, checked_scores = 0;
  double worst_angle = 0;
  for (size_t i = 0; i < c->nres; i++) {
    const beam_frame_t *a = c->res[i], *b = g->res[i];
    assert_int_equal(c->res_out[i], g->res_out[i]);
    assert_int_equal(a->frame_id, b->frame_id);
    assert_int_equal(a->flags, b->flags);
    const float *fa = a->data, *fb = b->data;
    switch (c->res_out[i]) {
    case BEAM_PCA_OUT_SCORES: {
      for (int j = 0; j < k; j++)
        if (!(fabs(fa[j] - fb[j]) <= 1e-3 * fabs(fa[j]) + 1e-3 * sqrt((double)P)))
          fail_msg("frame %llu score %d: cpu %g cuda %g", (unsigned long long)a->frame_id, j, fa[j], fb[j]);
      checked_scores++;
      break;
    }
    case BEAM_PCA_OUT_RESIDUAL:
      if (!(fabs(fa[0] - fb[0]) <= 1e-3 * fabs(fa[0])))
        fail_msg("frame %llu residual: cpu %g cuda %g", (unsigned long long)a->frame_id, fa[0], fb[0]);
      break;
    case BEAM_PCA_OUT_COMPONENTS: {
      double ang = max_angle_deg(fa, fb, k, P);
      worst_angle = ang > worst_angle ? ang : worst_angle;
      if (!(ang < 0.5))
        fail_msg("components differ by %.3f deg", ang);
      break;
    }
    case BEAM_PCA_OUT_SV:
    case BEAM_PCA_OUT_EVR:
      for (int j = 0; j < k; j++)
        if (!(fabs(fa[j] - fb[j]) <= 1e-3 * fabs(fa[j]) + 1e-7))
          fail_msg("output %u [%d]: cpu %g cuda %g", c->res_out[i], j, fa[j], fb[j]);
      break;
    case BEAM_PCA_OUT_MEAN:
      for (int p = 0; p < P; p++)
        if (!(fabs(fa[p] - fb[p]) <= 1e-4 * fabs(fa[p]) + 1e-5))
          fail_msg("mean pixel %d: cpu %g cuda %g", p, fa[p], fb[p]);
      break;
    default:
      break;
    }
  }
  printf("# %d score frames compared; worst component angle %.4f deg\n", checked_scores, worst_angle);
  assert_int_equal(checked_scores, 512 - 32);
  xpair_free(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_xcheck_pca)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
