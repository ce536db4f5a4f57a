/* Stage kind `bin`, CUDA backend, and the block-reduction kernel that
 * `preview` borrows (beam__cuda_bin2d).
 *
 * Kernel bin2d: one thread per output pixel, 32 x 8 threads per block,
 * grid ceil(out_w / 32) x ceil(out_h / 8). Each thread sums its n x n block
 * in double, block rows outer, columns inner, from +0.0, with explicit
 * round-to-nearest adds (__dadd_rn, so no contraction or fast-math flag can
 * change it), divides by n*n for the mean (__ddiv_rn) and rounds to float
 * once: the CPU loop's order exactly, so results are bit-identical. */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/kinds.h"

template <typename T>
__global__ void bin2d_kernel(const T *__restrict__ in, uint32_t in_w, uint32_t y0, uint32_t x0,
                             uint32_t out_h, uint32_t out_w, uint32_t n, int mean,
                             float *__restrict__ out) {
  uint32_t ox = blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t oy = blockIdx.y * blockDim.y + threadIdx.y;
  if (ox >= out_w || oy >= out_h)
    return;
  double s = 0.0;
  for (uint32_t dy = 0; dy < n; dy++) {
    const T *row = in + ((size_t)y0 + (size_t)oy * n + dy) * in_w + x0 + (size_t)ox * n;
    for (uint32_t dx = 0; dx < n; dx++)
      s = __dadd_rn(s, (double)row[dx]);
  }
  if (mean)
    s = __ddiv_rn(s, (double)n * n);
  out[(size_t)oy * out_w + ox] = __double2float_rn(s);
}

int beam__cuda_bin2d(const beam_bin_geom_t *g, const void *d_in, float *d_out, cudaStream_t stream,
                     beam_diag_t *d) {
  dim3 block(32, 8);
  dim3 grid((g->out_w + 31) / 32, (g->out_h + 7) / 8);
  switch (g->dtype) {
#define BIN_LAUNCH(T, DT)                                                                     \
  case DT:                                                                                    \
    bin2d_kernel<T><<<grid, block, 0, stream>>>((const T *)d_in, g->in_w, g->y0, g->x0,       \
                                                g->out_h, g->out_w, g->n, g->mean, d_out);    \
    break;
    BEAM__REAL_DTYPES(BIN_LAUNCH)
#undef BIN_LAUNCH
  default:
    return BEAM_DIAG(d, BEAM_ESHAPE, "bin: dtype %s on the GPU", beam_dtype_name(g->dtype));
  }
  BEAM_CUDA_LAUNCHED(d, "bin2d_kernel");
  return 0;
}

/* ---- stage ops ------------------------------------------------------------ */

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_bin_conf_t conf;
  beam_bin_geom_t geom;
  beam_indesc_t in;
  size_t in_bytes, out_bytes;
  void *d_in;
  size_t d_in_cap;
  void *d_out;
  size_t d_out_cap;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  beam__cuda_ctx_fini(&s->cx);
  beam__dbuf_free(&s->d_in, &s->d_in_cap);
  beam__dbuf_free(&s->d_out, &s->d_out_cap);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "bin: out of memory");
  self->priv = s;
  int rc = beam_bin_conf_load(&s->conf, self->cfg, d);
  if (rc < 0)
    return rc;
  return beam__cuda_ctx_init(&s->cx, "bin", d);
}


static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  int rc = beam_bin_start(self, &s->conf, in, &s->geom, d);
  if (rc < 0)
    return rc;
  s->in = *in;
  s->in_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  s->out_bytes = (size_t)s->geom.out_h * s->geom.out_w * sizeof(float);
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_in, &s->d_in_cap, s->in_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_out, &s->d_out_cap, s->out_bytes, d)) < 0)
    return rc;
  return 0;
}

static int run(cuda_t *s, const void *src, beam_frame_t *f, beam_diag_t *d) {
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_in, src, s->in_bytes, cudaMemcpyHostToDevice, s->cx.stream));
  int rc = beam__cuda_bin2d(&s->geom, s->d_in, (float *)s->d_out, s->cx.stream, d);
  if (rc < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(f->data, s->d_out, s->out_bytes, cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  return 0;
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  int corrupt = (in->flags & BEAM_FLAG_CORRUPT) != 0;
  int rc;
  if (!corrupt && (rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape)) < 0)
    return rc;
  if ((rc = beam__cuda_ctx_use(&s->cx, &self->diag)) < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  if (corrupt) {
    float *o = (float *)f->data;
    for (size_t i = 0; i < (size_t)s->geom.out_h * s->geom.out_w; i++)
      o[i] = NAN;
  } else if ((rc = run(s, in->data, f, &self->diag)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_emit_put(emit, f);
  return 0;
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) { return 0; }

extern "C" const beam_stage_ops_t beam_bin_cuda_ops = {
    .kind = "bin", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
