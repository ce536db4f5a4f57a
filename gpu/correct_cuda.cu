/* Stage kind `correct`, CUDA backend.
 *
 * Kernel correct: grid-stride loop, 256 threads per block, one pixel per
 * iteration. Per pixel it does exactly what the CPU loop does, in the same
 * order, with explicitly rounded float32 operations (__fsub_rn, __fdiv_rn:
 * IEEE division whatever -prec-div or fast-math says) and the threshold and
 * saturation compares in double, so its output is bit-identical to the CPU
 * backend's; so is the gap-value test, (double)raw == gap (NaN: none). The
 * per-pixel tables (dark, flat, bad) are built on the host by correct.c at
 * every series start, from the files or the series' own arrays, and
 * uploaded then. */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/correct.h"
#include "pipeline/kern/kinds.h"

template <typename T>
__global__ void correct_kernel(const T *__restrict__ raw, const float *__restrict__ dk,
                               const float *__restrict__ fl, const uint8_t *__restrict__ bad,
                               float *__restrict__ out, size_t n, double thr, double sat,
                               double gap, float badv) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    T r = raw[i];
    float o = __fdiv_rn(__fsub_rn((float)r, dk[i]), fl[i]);
    if ((double)o < thr)
      o = 0.0f;
    out[i] = (bad[i] || (double)r >= sat || (double)r == gap) ? badv : o;
  }
}

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_correct_conf_t conf;
  beam_indesc_t in;
  size_t n, in_bytes;
  double gap; /* this series' gap value (NaN = none), from the host tables */
  void *d_raw, *d_dark, *d_flat, *d_bad, *d_out;
  size_t c_raw, c_dark, c_flat, c_bad, c_out;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  beam__cuda_ctx_fini(&s->cx);
  beam__dbuf_free(&s->d_raw, &s->c_raw);
  beam__dbuf_free(&s->d_dark, &s->c_dark);
  beam__dbuf_free(&s->d_flat, &s->c_flat);
  beam__dbuf_free(&s->d_bad, &s->c_bad);
  beam__dbuf_free(&s->d_out, &s->c_out);
  beam_correct_conf_free(&s->conf);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "correct: out of memory");
  self->priv = s;
  int rc = beam__cuda_ctx_init(&s->cx, "correct", d);
  if (rc < 0)
    return rc;
  return beam_correct_conf_load(&s->conf, self->cfg, d);
}


static int upload_tables(cuda_t *s, const beam_correct_src_t *src, beam_diag_t *d) {
  beam_correct_tab_t t;
  memset(&t, 0, sizeof t);
  int rc = beam_correct_tab_build(&t, src, s->n, d);
  if (rc < 0)
    return rc;
  s->gap = t.gap;
  cudaError_t e = cudaMemcpy(s->d_dark, t.dark, s->n * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy(s->d_flat, t.flat, s->n * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess)
    e = cudaMemcpy(s->d_bad, t.bad, s->n, cudaMemcpyHostToDevice);
  beam_correct_tab_free(&t);
  BEAM_CUDA_TRY(d, e);
  return 0;
}

static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  /* src borrows the series' arrays for `series` keys: used only to build
   * this series' tables below. */
  beam_correct_src_t src;
  int rc = beam_correct_start(self, &s->conf, series, in, &src, d);
  if (rc < 0)
    return rc;
  s->in = *in;
  s->n = 1;
  for (uint32_t i = 0; i < in->ndim; i++)
    s->n *= in->shape[i];
  s->in_bytes = s->n * beam_dtype_size(in->dtype);
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_raw, &s->c_raw, s->in_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_dark, &s->c_dark, s->n * sizeof(float), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_flat, &s->c_flat, s->n * sizeof(float), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_bad, &s->c_bad, s->n, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_out, &s->c_out, s->n * sizeof(float), d)) < 0)
    return rc;
  return upload_tables(s, &src, d);
}

static int run(cuda_t *s, const beam_frame_t *in, beam_frame_t *f, beam_diag_t *d) {
  cudaStream_t st = s->cx.stream;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_raw, in->data, s->in_bytes, cudaMemcpyHostToDevice, st));
  const unsigned threads = 256, grid = beam__grid_for(s->n, threads);
  const float *dk = (const float *)s->d_dark, *fl = (const float *)s->d_flat;
  const uint8_t *bad = (const uint8_t *)s->d_bad;
  float *out = (float *)s->d_out;
  const beam_correct_conf_t *c = &s->conf;
  switch (in->dtype) {
  case BEAM_DT_U16:
    correct_kernel<uint16_t><<<grid, threads, 0, st>>>((const uint16_t *)s->d_raw, dk, fl, bad, out,
                                                       s->n, c->threshold, c->saturation, s->gap, c->bad_value);
    break;
  case BEAM_DT_U32:
    correct_kernel<uint32_t><<<grid, threads, 0, st>>>((const uint32_t *)s->d_raw, dk, fl, bad, out,
                                                       s->n, c->threshold, c->saturation, s->gap, c->bad_value);
    break;
  case BEAM_DT_F32:
    correct_kernel<float><<<grid, threads, 0, st>>>((const float *)s->d_raw, dk, fl, bad, out, s->n,
                                                    c->threshold, c->saturation, s->gap, c->bad_value);
    break;
  default:
    return BEAM_DIAG(d, BEAM_ESHAPE, "correct: dtype %s", beam_dtype_name(in->dtype));
  }
  BEAM_CUDA_LAUNCHED(d, "correct_kernel");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(f->data, s->d_out, s->n * sizeof(float), cudaMemcpyDeviceToHost, st));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
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
    for (size_t i = 0; i < s->n; i++)
      o[i] = NAN;
  } else if ((rc = run(s, in, f, &self->diag)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_emit_put(emit, f);
  return 0;
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) { return 0; }

extern "C" const beam_stage_ops_t beam_correct_cuda_ops = {
    .kind = "correct", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
