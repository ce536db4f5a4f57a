/* Stage kind `xpcs_twotime`, CUDA backend: the numerator products through
 * cuBLAS. The host keeps everything of xpcs_twotime.h as the CPU backend
 * does (the frame buffer gathered per frame, ROI sums, bad flags) and
 * does the O(T^2) normalisation and g2; the device does the O(T^2 P)
 * products. At each publish the buffer rows held are copied H2D once,
 * then per ROI cublas?syrk (full, window) or per row block cublas?gemm
 * (band) writes into a device result buffer that is copied back into the
 * host result.
 *
 * Layout: the host buffer is row-major [rows][P]; cuBLAS is column-major,
 * so the same bytes are X^T (P x rows, leading dimension P), and ROI r is
 * the P_r x rows block starting at row off[r]. X_r X_r^T is then
 * syrk(OP_T) of that block; its column-major upper triangle is the
 * row-major lower triangle the shared code reads. Device memory: the
 * buffer (rows x P) plus one ROI's result (T x T, W x W, or a band block).
 * Products sum in cuBLAS's order: equal to the CPU's to round-off.
 *
 * Multi-tau levels (num_bufs, num_levels): the device does level 0 (the
 * same syrk over every pair; the shared code zeroes |t1 - t2| >= num_bufs);
 * the level >= 1 block sums and their pairs (nb/2 per level-L frame, so at
 * most T nb P / 2 multiply-adds over all levels against T^2 P / 2 for level
 * 0) are host loops in xpcs_twotime.c, the CPU backend's own code, so those
 * cells are the CPU's to the bit. */
#include "gpu/cuda_int.h"

#include "pipeline/kern/xpcs_twotime.h"

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  cublasHandle_t blas;
  beam_x2t_t x;
  void *d_buf, *d_out;
  size_t c_buf, c_out;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *c = (cuda_t *)self->priv;
  if (!c)
    return;
  if (c->blas)
    cublasDestroy(c->blas);
  beam__cuda_ctx_fini(&c->cx);
  beam__dbuf_free(&c->d_buf, &c->c_buf);
  beam__dbuf_free(&c->d_out, &c->c_out);
  beam_x2t_free(&c->x);
  free(c);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, "xpcs_twotime: out of memory");
  self->priv = c;
  int rc = beam__cuda_ctx_init(&c->cx, "xpcs_twotime", d);
  if (rc < 0)
    return rc;
  BEAM_CUBLAS_TRY(d, cublasCreate(&c->blas));
  BEAM_CUBLAS_TRY(d, cublasSetStream(c->blas, c->cx.stream));
  return beam_x2t_init(&c->x, self->cfg, d);
}


static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)self->priv;
  beam_x2t_t *x = &c->x;
  int rc = beam_x2t_start(self, x, series, in, d);
  if (rc < 0)
    return rc;
  size_t es = beam_x2t_esize(x), W = x->conf.width;
  size_t out = x->conf.mode == BEAM_X2T_FULL   ? x->tdecl * x->tdecl
               : x->conf.mode == BEAM_X2T_BAND ? x->blk * (x->blk + W - 1)
                                               : W * W;
  if ((rc = beam__cuda_ctx_use(&c->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_buf, &c->c_buf, x->cap * x->P * es, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_out, &c->c_out, out * es, d)) < 0)
    return rc;
  return 0;
}

static int cu_prepare(void *ctx, const beam_x2t_t *x, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)ctx;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d_buf, x->buf, x->rows * x->P * beam_x2t_esize(x), cudaMemcpyHostToDevice,
                                   c->cx.stream));
  return 0;
}

/* Device result [m][k] (leading dimension k) into host out (ldo). */
static int fetch(cuda_t *c, const beam_x2t_t *x, size_t m, size_t k, void *out, size_t ldo, beam_diag_t *d) {
  size_t es = beam_x2t_esize(x);
  BEAM_CUDA_TRY(d, cudaMemcpy2DAsync(out, ldo * es, c->d_out, k * es, k * es, m, cudaMemcpyDeviceToHost,
                                     c->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
  return 0;
}

static int cu_syrk(void *ctx, const beam_x2t_t *x, size_t r, size_t n, void *out, size_t ldo, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)ctx;
  size_t o = x->rois.off[r];
  int k = (int)(x->rois.off[r + 1] - o), nn = (int)n, lda = (int)x->P;
  if (x->conf.f32) {
    const float one = 1, zero = 0;
    BEAM_CUBLAS_TRY(d, cublasSsyrk(c->blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, nn, k, &one,
                                   (const float *)c->d_buf + o, lda, &zero, (float *)c->d_out, nn));
  } else {
    const double one = 1, zero = 0;
    BEAM_CUBLAS_TRY(d, cublasDsyrk(c->blas, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_T, nn, k, &one,
                                   (const double *)c->d_buf + o, lda, &zero, (double *)c->d_out, nn));
  }
  return fetch(c, x, n, n, out, ldo, d);
}

static int cu_gemm(void *ctx, const beam_x2t_t *x, size_t r, size_t a, size_t m, size_t b, size_t k, void *out,
                   size_t ldo, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)ctx;
  size_t o = x->rois.off[r], P = x->P;
  int np = (int)(x->rois.off[r + 1] - o), lda = (int)P;
  /* column-major out^T (k x m) = X_b^T' X_a: element (j, i) = X[b+j] . X[a+i] */
  if (x->conf.f32) {
    const float one = 1, zero = 0;
    BEAM_CUBLAS_TRY(d, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)k, (int)m, np, &one,
                                   (const float *)c->d_buf + b * P + o, lda, (const float *)c->d_buf + a * P + o,
                                   lda, &zero, (float *)c->d_out, (int)k));
  } else {
    const double one = 1, zero = 0;
    BEAM_CUBLAS_TRY(d, cublasDgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)k, (int)m, np, &one,
                                   (const double *)c->d_buf + b * P + o, lda, (const double *)c->d_buf + a * P + o,
                                   lda, &zero, (double *)c->d_out, (int)k));
  }
  return fetch(c, x, m, k, out, ldo, d);
}

static const beam_x2t_blas_t blas_cuda = {cu_prepare, cu_syrk, cu_gemm};

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *c = (cuda_t *)self->priv;
  beam_x2t_t *x = &c->x;
  int bad = beam_x2t_flag_bad(in->flags), rc;
  if (!(in->flags & BEAM_FLAG_CORRUPT) &&
      (rc = beam__frame_matches(self, in, x->in.dtype, x->in.ndim, x->in.shape)) < 0)
    return rc;
  for (uint32_t k = 0; k < in->missing_before; k++) /* lost frames: bad */
    if ((rc = beam_x2t_push(x, NULL, 1, &self->diag)) < 0)
      return rc;
  if ((rc = beam_x2t_push(x, bad ? NULL : in->data, bad, &self->diag)) < 0)
    return rc;
  int rows = x->conf.publish_rows && x->nframes % x->conf.publish_rows == 0;
  int every = x->conf.publish_every && x->nframes % x->conf.publish_every == 0;
  if (!rows && !every)
    return 0;
  if ((rc = beam__cuda_ctx_use(&c->cx, &self->diag)) < 0)
    return rc;
  /* a row block uploads the buffer once (prepare), as a publish does */
  if (rows && (rc = beam_x2t_publish_rows(x, &blas_cuda, c, emit, &self->diag)) < 0)
    return rc;
  if (every)
    return beam_x2t_publish(x, &blas_cuda, c, emit, BEAM_FLAG_PARTIAL, &self->diag);
  return 0;
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *c = (cuda_t *)self->priv;
  int rc = beam__cuda_ctx_use(&c->cx, &self->diag);
  if (rc < 0)
    return rc;
  return beam_x2t_publish(&c->x, &blas_cuda, c, emit, BEAM_FLAG_FINAL, &self->diag);
}

extern "C" const beam_stage_ops_t beam_xpcs_twotime_cuda_ops = {
    .kind = "xpcs_twotime", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
