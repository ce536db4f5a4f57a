/* Stage kind `roi_sum`, CUDA backend.
 *
 * Two kernels per frame, both deterministic (fixed work split, fixed
 * reduction tree, no atomics), so a frame always gives the same sums:
 *   roi_partial: grid (nblk, nroi), 256 threads. Block b of ROI r takes the
 *     b-th contiguous chunk of r's sorted index list; thread t sums elements
 *     t, t+256, ... of that chunk in double (pixel x weight may contract to
 *     an FMA), then a shared-memory tree halves 256 -> 1 into
 *     partial[r][b]. nblk is fixed per series from the longest list (about
 *     4096 pixels per block, 1..256 blocks).
 *   roi_final: one thread per ROI adds its nblk partials in order.
 * It always takes the index lists (start with use_runs = 0); the CPU sums
 * unit-weight ROIs as runs instead, in another order. Integer pixels with
 * unit weights sum exactly on both while every partial sum is an integer
 * below 2^53 (the CPU's run sums are integers for <= 32-bit pixels), so
 * the results are equal; otherwise both chains of roundings are short (GPU
 * ~30 deep, CPU ~len/8 + runs per ROI) and they agree well within
 * 1e-12 x sum |pixel x weight| (the cross-check's bound). */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/roi_sum.h"

#define RS_THREADS 256
#define RS_PER_BLOCK 4096
#define RS_MAX_BLOCKS 256

template <typename T, bool W>
__global__ void roi_partial(const T *__restrict__ px, const uint64_t *__restrict__ off,
                            const uint32_t *__restrict__ idx, const double *__restrict__ w,
                            unsigned nblk, double *__restrict__ partial) {
  __shared__ double sh[RS_THREADS];
  const unsigned r = blockIdx.y, b = blockIdx.x, t = threadIdx.x;
  const uint64_t start = off[r], len = off[r + 1] - start;
  const uint64_t chunk = (len + nblk - 1) / nblk;
  const uint64_t lo = start + min((uint64_t)b * chunk, len);
  const uint64_t hi = start + min((uint64_t)(b + 1) * chunk, len);
  double s = 0.0;
  for (uint64_t k = lo + t; k < hi; k += RS_THREADS)
    s += W ? (double)px[idx[k]] * w[k] : (double)px[idx[k]];
  sh[t] = s;
  __syncthreads();
  for (unsigned h = RS_THREADS / 2; h > 0; h >>= 1) {
    if (t < h)
      sh[t] += sh[t + h];
    __syncthreads();
  }
  if (t == 0)
    partial[(size_t)r * nblk + b] = sh[0];
}

__global__ void roi_final(const double *__restrict__ partial, unsigned nblk, unsigned nroi,
                          double *__restrict__ sums) {
  unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= nroi)
    return;
  double s = 0.0;
  for (unsigned b = 0; b < nblk; b++)
    s += partial[(size_t)r * nblk + b];
  sums[r] = s;
}

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_roi_host_t h;
  size_t frame_bytes;
  unsigned nblk;
  void *d_frame, *d_off, *d_idx, *d_w, *d_partial, *d_sums;
  size_t c_frame, c_off, c_idx, c_w, c_partial, c_sums;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  beam__cuda_ctx_fini(&s->cx);
  beam__dbuf_free(&s->d_frame, &s->c_frame);
  beam__dbuf_free(&s->d_off, &s->c_off);
  beam__dbuf_free(&s->d_idx, &s->c_idx);
  beam__dbuf_free(&s->d_w, &s->c_w);
  beam__dbuf_free(&s->d_partial, &s->c_partial);
  beam__dbuf_free(&s->d_sums, &s->c_sums);
  beam_roi_host_free(&s->h);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
  self->priv = s;
  int rc = beam__cuda_ctx_init(&s->cx, "roi_sum", d);
  if (rc < 0)
    return rc;
  return beam_roi_host_init(&s->h, self->cfg, d);
}


static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  int rc = beam_roi_host_start(self, &s->h, series, in, 0, d);
  if (rc < 0)
    return rc;
  const beam_roi_lists_t *l = &s->h.lists;
  uint64_t maxlen = 0;
  for (size_t r = 0; r < l->nroi; r++)
    if (l->off[r + 1] - l->off[r] > maxlen)
      maxlen = l->off[r + 1] - l->off[r];
  uint64_t nb = (maxlen + RS_PER_BLOCK - 1) / RS_PER_BLOCK;
  s->nblk = (unsigned)(nb < 1 ? 1 : nb > RS_MAX_BLOCKS ? RS_MAX_BLOCKS : nb);
  s->frame_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_frame, &s->c_frame, s->frame_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_off, &s->c_off, (l->nroi + 1) * sizeof(uint64_t), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_idx, &s->c_idx, l->total * sizeof(uint32_t), d)) < 0 ||
      (l->w && (rc = beam__dbuf_reserve(&s->d_w, &s->c_w, l->total * sizeof(double), d)) < 0) ||
      (rc = beam__dbuf_reserve(&s->d_partial, &s->c_partial, l->nroi * s->nblk * sizeof(double), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_sums, &s->c_sums, l->nroi * sizeof(double), d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpy(s->d_off, l->off, (l->nroi + 1) * sizeof(uint64_t), cudaMemcpyHostToDevice));
  BEAM_CUDA_TRY(d, cudaMemcpy(s->d_idx, l->idx, l->total * sizeof(uint32_t), cudaMemcpyHostToDevice));
  if (l->w)
    BEAM_CUDA_TRY(d, cudaMemcpy(s->d_w, l->w, l->total * sizeof(double), cudaMemcpyHostToDevice));
  return 0;
}

template <typename T>
static void launch(cuda_t *s, const beam_roi_lists_t *l) {
  dim3 grid(s->nblk, (unsigned)l->nroi);
  const T *px = (const T *)s->d_frame;
  const uint64_t *off = (const uint64_t *)s->d_off;
  const uint32_t *idx = (const uint32_t *)s->d_idx;
  double *partial = (double *)s->d_partial;
  if (l->w)
    roi_partial<T, true><<<grid, RS_THREADS, 0, s->cx.stream>>>(px, off, idx, (const double *)s->d_w,
                                                                s->nblk, partial);
  else
    roi_partial<T, false><<<grid, RS_THREADS, 0, s->cx.stream>>>(px, off, idx, NULL, s->nblk, partial);
}

static int run(cuda_t *s, const beam_frame_t *in, beam_frame_t *f, beam_diag_t *d) {
  const beam_roi_lists_t *l = &s->h.lists;
  cudaStream_t st = s->cx.stream;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_frame, in->data, s->frame_bytes, cudaMemcpyHostToDevice, st));
  switch (in->dtype) {
#define RS_LAUNCH(T, DT) case DT: launch<T>(s, l); break;
    BEAM__REAL_DTYPES(RS_LAUNCH)
#undef RS_LAUNCH
  default:
    return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: dtype %s", beam_dtype_name(in->dtype));
  }
  BEAM_CUDA_LAUNCHED(d, "roi_partial");
  unsigned nroi = (unsigned)l->nroi;
  roi_final<<<(nroi + 127) / 128, 128, 0, st>>>((const double *)s->d_partial, s->nblk, nroi,
                                                 (double *)s->d_sums);
  BEAM_CUDA_LAUNCHED(d, "roi_final");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(f->data, s->d_sums, nroi * sizeof(double), cudaMemcpyDeviceToHost, st));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
  return 0;
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_roi_host_corrupt(&s->h, emit);
  int rc = beam__frame_matches(self, in, s->h.in.dtype, s->h.in.ndim, s->h.in.shape);
  if (rc < 0)
    return rc;
  if ((rc = beam__cuda_ctx_use(&s->cx, &self->diag)) < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  if ((rc = run(s, in, f, &self->diag)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_roi_host_record(&s->h, in->frame_id, (const double *)f->data);
  beam_emit_put(emit, f);
  return beam_roi_host_image(&s->h, emit, 0);
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  return beam_roi_host_image(&s->h, emit, 1);
}

extern "C" const beam_stage_ops_t beam_roi_sum_cuda_ops = {
    .kind = "roi_sum", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
