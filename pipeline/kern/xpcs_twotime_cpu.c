/* Stage kind `xpcs_twotime`, CPU backend: the numerator products through
 * OpenBLAS (cblas_?syrk for the square blocks of full and window mode,
 * cblas_?gemm for band blocks) on the [rows, P] frame buffer, ROI r being
 * the column block off[r]..off[r+1] with leading dimension P, so no copy
 * per ROI. OpenBLAS threads the products over the node's cores; the rest
 * (gather per frame, normalisation, g2) is xpcs_twotime.c, single
 * threaded. Products sum in BLAS order: float64 agrees with the plain
 * loops of the unit test to ~1e-15 relative, float32 to ~1e-6. */
#include <cblas.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_twotime.h"

static int cpu_prepare(void *ctx, const beam_x2t_t *x, beam_diag_t *d) { return 0; }

static int cpu_syrk(void *ctx, const beam_x2t_t *x, size_t r, size_t n, void *out, size_t ldo, beam_diag_t *d) {
  size_t a = x->rois.off[r], k = x->rois.off[r + 1] - a;
  if (x->conf.f32)
    cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, (blasint)n, (blasint)k, 1.0f, (const float *)x->buf + a,
                (blasint)x->P, 0.0f, out, (blasint)ldo);
  else
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (blasint)n, (blasint)k, 1.0, (const double *)x->buf + a,
                (blasint)x->P, 0.0, out, (blasint)ldo);
  return 0;
}

static int cpu_gemm(void *ctx, const beam_x2t_t *x, size_t r, size_t a, size_t m, size_t b, size_t k, void *out,
                    size_t ldo, beam_diag_t *d) {
  size_t o = x->rois.off[r], np = x->rois.off[r + 1] - o, P = x->P;
  if (x->conf.f32)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)k, (blasint)np, 1.0f,
                (const float *)x->buf + a * P + o, (blasint)P, (const float *)x->buf + b * P + o, (blasint)P, 0.0f,
                out, (blasint)ldo);
  else
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)m, (blasint)k, (blasint)np, 1.0,
                (const double *)x->buf + a * P + o, (blasint)P, (const double *)x->buf + b * P + o, (blasint)P, 0.0,
                out, (blasint)ldo);
  return 0;
}

const beam_x2t_blas_t beam_x2t_blas_cpu = {cpu_prepare, cpu_syrk, cpu_gemm};

/* ---- stage ops ------------------------------------------------------------ */

static void cpu_destroy(beam_stage_t *self) {
  beam_x2t_t *x = self->priv;
  if (!x)
    return;
  beam_x2t_free(x);
  free(x);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  beam_x2t_t *x = calloc(1, sizeof *x);
  if (!x)
    return BEAM_DIAG(d, BEAM_ENOMEM, "xpcs_twotime: out of memory");
  self->priv = x;
  return beam_x2t_init(x, self->cfg, d);
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in, beam_diag_t *d) {
  return beam_x2t_start(self, self->priv, series, in, d);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_x2t_t *x = self->priv;
  int bad = beam_x2t_flag_bad(in->flags), rc;
  if (!(in->flags & BEAM_FLAG_CORRUPT) && (rc = beam__frame_matches(self, in, x->in.dtype, x->in.ndim, x->in.shape)) < 0)
    return rc;
  /* Frames lost before this one: bad frames, NaN row and column. */
  for (uint32_t k = 0; k < in->missing_before; k++)
    if ((rc = beam_x2t_push(x, NULL, 1, &self->diag)) < 0)
      return rc;
  if ((rc = beam_x2t_push(x, bad ? NULL : in->data, bad, &self->diag)) < 0)
    return rc;
  if ((rc = beam_x2t_publish_rows(x, &beam_x2t_blas_cpu, NULL, emit, &self->diag)) < 0)
    return rc;
  if (x->conf.publish_every && x->nframes % x->conf.publish_every == 0)
    return beam_x2t_publish(x, &beam_x2t_blas_cpu, NULL, emit, BEAM_FLAG_PARTIAL, &self->diag);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  return beam_x2t_publish(self->priv, &beam_x2t_blas_cpu, NULL, emit, BEAM_FLAG_FINAL, &self->diag);
}

const beam_stage_ops_t beam_xpcs_twotime_cpu_ops = {
    .kind = "xpcs_twotime", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
