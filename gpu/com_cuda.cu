/* Stage kind `com`, CUDA backend: the per-frame sums S, Sx, Sy on the
 * device; the centre of mass from them (beam_com_finish) and the scan
 * maps (beam_com_compute_maps) on the host, shared with the CPU backend.
 *
 * Why the maps stay on the host: they are recomputed every image_every
 * frames (default 256) from the whole scan's shifts, an O(ny nx) stencil
 * and three real FFTs per publication, while the device work is
 * O(frames x disc pixels); for a 256 x 256 scan that is about 1 ms of host
 * time per 256 frames (measured 0.8 ms), far below the frames' own
 * transfer. Keeping them in
 * com.c also means both backends publish maps from one implementation,
 * and the device needs no cuFFT plan or scan-sized buffers.
 *
 * Two kernels per frame, deterministic (fixed work split and reduction
 * tree, no atomics):
 *   com_partial: nblk blocks of 256 threads over the sorted flat index
 *     list of the pixels inside (start with want_idx). Block b takes the
 *     b-th contiguous chunk; thread t sums elements t, t+256, ... of it in
 *     double (v, v x, v y), then a shared-memory tree halves 256 -> 1 into
 *     partial[b][0..3). nblk = ceil(pixels / 4096), 1..256.
 *   com_final: one thread adds the nblk partials in order.
 * Integer pixels: every partial sum is an integer, exact below 2^53, so
 * the sums equal the CPU's bit for bit; floats differ only by summation
 * order (tests/gpu/test_xcheck_com.c states the bound). */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/com.h"
#include "pipeline/kern/kinds.h"

#define CM_THREADS 256
#define CM_PER_BLOCK 4096
#define CM_MAX_BLOCKS 256

template <typename T>
__global__ void com_partial(const T *__restrict__ px, const uint32_t *__restrict__ idx,
                            uint64_t n, uint32_t w, unsigned nblk, double *__restrict__ partial) {
  __shared__ double sh[3][CM_THREADS];
  const unsigned b = blockIdx.x, t = threadIdx.x;
  const uint64_t chunk = (n + nblk - 1) / nblk;
  const uint64_t lo = min((uint64_t)b * chunk, n), hi = min((uint64_t)(b + 1) * chunk, n);
  double s = 0.0, sx = 0.0, sy = 0.0;
  for (uint64_t k = lo + t; k < hi; k += CM_THREADS) {
    uint32_t i = idx[k];
    double v = (double)px[i];
    s += v;
    sx += v * (double)(i % w);
    sy += v * (double)(i / w);
  }
  sh[0][t] = s;
  sh[1][t] = sx;
  sh[2][t] = sy;
  __syncthreads();
  for (unsigned hh = CM_THREADS / 2; hh > 0; hh >>= 1) {
    if (t < hh) {
      sh[0][t] += sh[0][t + hh];
      sh[1][t] += sh[1][t + hh];
      sh[2][t] += sh[2][t + hh];
    }
    __syncthreads();
  }
  if (t == 0) {
    partial[(size_t)b * 3] = sh[0][0];
    partial[(size_t)b * 3 + 1] = sh[1][0];
    partial[(size_t)b * 3 + 2] = sh[2][0];
  }
}

__global__ void com_final(const double *__restrict__ partial, unsigned nblk, double *__restrict__ sums) {
  if (blockIdx.x != 0 || threadIdx.x != 0)
    return;
  double s = 0.0, sx = 0.0, sy = 0.0;
  for (unsigned b = 0; b < nblk; b++) {
    s += partial[(size_t)b * 3];
    sx += partial[(size_t)b * 3 + 1];
    sy += partial[(size_t)b * 3 + 2];
  }
  sums[0] = s;
  sums[1] = sx;
  sums[2] = sy;
}

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_com_host_t h;
  size_t frame_bytes;
  unsigned nblk;
  void *d_frame, *d_idx, *d_partial, *d_sums;
  size_t c_frame, c_idx, c_partial, c_sums;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  beam__cuda_ctx_fini(&s->cx);
  beam__dbuf_free(&s->d_frame, &s->c_frame);
  beam__dbuf_free(&s->d_idx, &s->c_idx);
  beam__dbuf_free(&s->d_partial, &s->c_partial);
  beam__dbuf_free(&s->d_sums, &s->c_sums);
  beam_com_host_free(&s->h);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "com: out of memory");
  self->priv = s;
  int rc = beam__cuda_ctx_init(&s->cx, "com", d);
  if (rc < 0)
    return rc;
  return beam_com_host_init(&s->h, self->cfg, d);
}


static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  int rc = beam_com_host_start(self, &s->h, series, in, 1, d);
  if (rc < 0)
    return rc;
  uint64_t nb = (s->h.npix + CM_PER_BLOCK - 1) / CM_PER_BLOCK;
  s->nblk = (unsigned)(nb < 1 ? 1 : nb > CM_MAX_BLOCKS ? CM_MAX_BLOCKS : nb);
  s->frame_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_frame, &s->c_frame, s->frame_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_idx, &s->c_idx, s->h.npix * sizeof(uint32_t), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_partial, &s->c_partial, (size_t)s->nblk * 3 * sizeof(double), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_sums, &s->c_sums, 3 * sizeof(double), d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpy(s->d_idx, s->h.idx, s->h.npix * sizeof(uint32_t), cudaMemcpyHostToDevice));
  return 0;
}

static int run(cuda_t *s, const beam_frame_t *in, double sums[3], beam_diag_t *d) {
  cudaStream_t st = s->cx.stream;
  const uint32_t *idx = (const uint32_t *)s->d_idx;
  uint32_t w = s->h.in.shape[1];
  double *partial = (double *)s->d_partial;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_frame, in->data, s->frame_bytes, cudaMemcpyHostToDevice, st));
  switch (in->dtype) {
#define CM_LAUNCH(T, DT)                                                                       \
  case DT:                                                                                     \
    com_partial<T><<<s->nblk, CM_THREADS, 0, st>>>((const T *)s->d_frame, idx, s->h.npix, w,   \
                                                   s->nblk, partial);                          \
    break;
    BEAM__REAL_DTYPES(CM_LAUNCH)
#undef CM_LAUNCH
  default:
    return BEAM_DIAG(d, BEAM_ESHAPE, "com: dtype %s", beam_dtype_name(in->dtype));
  }
  BEAM_CUDA_LAUNCHED(d, "com_partial");
  com_final<<<1, 1, 0, st>>>(partial, s->nblk, (double *)s->d_sums);
  BEAM_CUDA_LAUNCHED(d, "com_final");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(sums, s->d_sums, 3 * sizeof(double), cudaMemcpyDeviceToHost, st));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
  return 0;
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_com_host_corrupt(self, &s->h, emit);
  int rc = beam__frame_matches(self, in, s->h.in.dtype, s->h.in.ndim, s->h.in.shape);
  if (rc < 0)
    return rc;
  if ((rc = beam__cuda_ctx_use(&s->cx, &self->diag)) < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  double sums[3];
  if ((rc = run(s, in, sums, &self->diag)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_com_finish(&s->h, sums, (double *)f->data);
  beam_com_host_record(&s->h, in->frame_id, (const double *)f->data);
  beam_emit_put(emit, f);
  return beam_com_host_maps(self, &s->h, emit, 0);
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  return beam_com_host_maps(self, &s->h, emit, 1);
}

extern "C" const beam_stage_ops_t beam_com_cuda_ops = {
    .kind = "com", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
