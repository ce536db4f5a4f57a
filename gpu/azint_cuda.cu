/* Stage kind `azint`, CUDA backend: the CSR matrices of azint.c (built on
 * the host at series start, copied once) applied per frame on the device.
 *
 * Kernel azint_rows: one warp per bin (row), 4 warps a block, grid over
 * the rows. Lane l sums entries l, l + 32, ... of its row with double
 * accumulators (signal, variance, normalisation, count, exactly the terms
 * of the CPU reference beam_azint_csr_apply), then a shuffle tree adds
 * the 32 lane sums. Rows are long (a 4 Mpx frame into 1000 bins: ~4500
 * entries each) and few, so a thread per row would leave most of the GPU
 * idle; a warp per row keeps 32 loads in flight per row. The order of
 * the additions differs from the CPU's single chain (and nvcc may
 * contract to FMA), so the cross-check allows 1e-12 relative; every term
 * is non-negative for non-negative pixels, so there is no cancellation to
 * amplify that. Fixed split, fixed tree, no atomics: deterministic. Only
 * the frame goes up and the 4 x bins sums come down each frame; I, sigma
 * and count are then formed on the host by the shared beam_azint_emit. */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/azint.h"
#include "pipeline/kern/kinds.h"

#define AZ_THREADS 128

struct az_kparams {
  int has_dummy;
  double dummy, delta_dummy;
};

template <typename T>
__global__ void azint_rows(const T *__restrict__ px, const uint64_t *__restrict__ ptr,
                           const uint32_t *__restrict__ idx, const float *__restrict__ w,
                           const float *__restrict__ norm, uint32_t nrows, az_kparams kp,
                           double *__restrict__ out /* 4 x nrows: sig, var, norm, count */) {
  /* One warp per row; the row index is the same for all 32 lanes, so the
   * whole warp takes the early return together and the shuffles below
   * always see 32 active lanes. */
  const uint32_t r = (blockIdx.x * blockDim.x + threadIdx.x) / 32u, lane = threadIdx.x % 32u;
  if (r >= nrows)
    return;
  double sig = 0, var = 0, nrm = 0, cnt = 0;
  for (uint64_t j = ptr[r] + lane; j < ptr[r + 1]; j += 32) {
    uint32_t k = idx[j];
    double v = (double)px[k], cf = (double)w[j];
    if (!isfinite(v) ||
        (kp.has_dummy && (kp.delta_dummy == 0 ? v == kp.dummy : fabs(v - kp.dummy) <= kp.delta_dummy)))
      continue;
    sig += cf * v;
    var += cf * cf * (v > 1.0 ? v : 1.0);
    nrm += cf * (double)norm[k];
    cnt += cf;
  }
  for (unsigned o = 16; o > 0; o >>= 1) {
    sig += __shfl_down_sync(0xffffffffu, sig, o);
    var += __shfl_down_sync(0xffffffffu, var, o);
    nrm += __shfl_down_sync(0xffffffffu, nrm, o);
    cnt += __shfl_down_sync(0xffffffffu, cnt, o);
  }
  if (lane == 0) {
    out[r] = sig;
    out[nrows + r] = var;
    out[2 * (size_t)nrows + r] = nrm;
    out[3 * (size_t)nrows + r] = cnt;
  }
}

typedef struct dcsr_s {
  void *ptr, *idx, *w;
  size_t c_ptr, c_idx, c_w;
} dcsr_t;

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_azint_conf_t c;
  beam_azint_tab_t t;
  beam_indesc_t in;
  int first;
  size_t frame_bytes;
  dcsr_t m1, m2;
  void *d_frame, *d_norm, *d_out;
  size_t c_frame, c_norm, c_out;
  double *h_out; /* 4 x (rows1 + rows2) */
  size_t h_cap;
} cuda_t;

static void dcsr_free(dcsr_t *m) {
  beam__dbuf_free(&m->ptr, &m->c_ptr);
  beam__dbuf_free(&m->idx, &m->c_idx);
  beam__dbuf_free(&m->w, &m->c_w);
}

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  beam__cuda_ctx_fini(&s->cx);
  dcsr_free(&s->m1);
  dcsr_free(&s->m2);
  beam__dbuf_free(&s->d_frame, &s->c_frame);
  beam__dbuf_free(&s->d_norm, &s->c_norm);
  beam__dbuf_free(&s->d_out, &s->c_out);
  free(s->h_out);
  beam_azint_tab_free(&s->t);
  beam_azint_conf_free(&s->c);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "azint: out of memory");
  self->priv = s;
  int rc = beam__cuda_ctx_init(&s->cx, "azint", d);
  if (rc < 0)
    return rc;
  return beam_azint_conf_load(&s->c, self->cfg, d);
}


static int upload(dcsr_t *dm, const beam_azint_csr_t *m, beam_diag_t *d) {
  int rc;
  size_t nnz = m->nnz ? m->nnz : 1;
  if ((rc = beam__dbuf_reserve(&dm->ptr, &dm->c_ptr, ((size_t)m->nrows + 1) * sizeof(uint64_t), d)) < 0 ||
      (rc = beam__dbuf_reserve(&dm->idx, &dm->c_idx, nnz * sizeof(uint32_t), d)) < 0 ||
      (rc = beam__dbuf_reserve(&dm->w, &dm->c_w, nnz * sizeof(float), d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpy(dm->ptr, m->ptr, ((size_t)m->nrows + 1) * sizeof(uint64_t), cudaMemcpyHostToDevice));
  if (m->nnz) {
    BEAM_CUDA_TRY(d, cudaMemcpy(dm->idx, m->idx, m->nnz * sizeof(uint32_t), cudaMemcpyHostToDevice));
    BEAM_CUDA_TRY(d, cudaMemcpy(dm->w, m->w, m->nnz * sizeof(float), cudaMemcpyHostToDevice));
  }
  return 0;
}

static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  int rc = beam_azint_start(self, &s->c, &s->t, series, in, d);
  if (rc < 0)
    return rc;
  size_t npix = (size_t)in->shape[0] * in->shape[1];
  size_t rows = (size_t)s->t.r1.nrows + s->t.r2.nrows;
  s->frame_bytes = npix * beam_dtype_size(in->dtype);
  if (4 * rows > s->h_cap) {
    free(s->h_out);
    s->h_out = (double *)malloc(4 * rows * sizeof(double));
    s->h_cap = s->h_out ? 4 * rows : 0;
    if (!s->h_out)
      return BEAM_DIAG(d, BEAM_ENOMEM, "azint: out of memory");
  }
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_frame, &s->c_frame, s->frame_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_norm, &s->c_norm, npix * sizeof(float), d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_out, &s->c_out, 4 * rows * sizeof(double), d)) < 0 ||
      (rc = upload(&s->m1, &s->t.r1, d)) < 0 ||
      (s->t.r2.nrows && (rc = upload(&s->m2, &s->t.r2, d)) < 0))
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpy(s->d_norm, s->t.norm, npix * sizeof(float), cudaMemcpyHostToDevice));
  s->in = *in;
  s->first = 1;
  return 0;
}

template <typename T>
static void launch(cuda_t *s, const dcsr_t *m, uint32_t nrows, double *out) {
  az_kparams kp = {s->c.has_dummy, s->c.dummy, s->c.delta_dummy};
  unsigned rows_per_block = AZ_THREADS / 32;
  unsigned grid = (nrows + rows_per_block - 1) / rows_per_block;
  azint_rows<T><<<grid ? grid : 1, AZ_THREADS, 0, s->cx.stream>>>(
      (const T *)s->d_frame, (const uint64_t *)m->ptr, (const uint32_t *)m->idx,
      (const float *)m->w, (const float *)s->d_norm, nrows, kp, out);
}

static int run(cuda_t *s, const beam_frame_t *in, beam_diag_t *d) {
  cudaStream_t st = s->cx.stream;
  uint32_t n1 = s->t.r1.nrows, n2 = s->t.r2.nrows;
  double *o1 = (double *)s->d_out, *o2 = o1 + 4 * (size_t)n1;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_frame, in->data, s->frame_bytes, cudaMemcpyHostToDevice, st));
  for (int q = 0; q < 2; q++) {
    uint32_t n = q ? n2 : n1;
    if (!n)
      continue;
    const dcsr_t *m = q ? &s->m2 : &s->m1;
    double *o = q ? o2 : o1;
    switch (in->dtype) {
#define AZ_LAUNCH(T, DT) case DT: launch<T>(s, m, n, o); break;
      BEAM__REAL_DTYPES(AZ_LAUNCH)
#undef AZ_LAUNCH
    default:
      return BEAM_DIAG(d, BEAM_ESHAPE, "azint: dtype %s", beam_dtype_name(in->dtype));
    }
    BEAM_CUDA_LAUNCHED(d, "azint_rows");
  }
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->h_out, s->d_out, 4 * ((size_t)n1 + n2) * sizeof(double),
                                   cudaMemcpyDeviceToHost, st));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
  return 0;
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_azint_emit_corrupt(self, &s->c, &s->t, &s->first, emit);
  int rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape);
  if (rc < 0)
    return rc;
  if ((rc = beam__cuda_ctx_use(&s->cx, &self->diag)) < 0 || (rc = run(s, in, &self->diag)) < 0)
    return rc;
  size_t n1 = s->t.r1.nrows, n2 = s->t.r2.nrows;
  double *p = s->h_out, *p2 = p + 4 * n1;
  beam_azint_sums_t s1 = {p, p + n1, p + 2 * n1, p + 3 * n1};
  beam_azint_sums_t s2 = {p2, p2 + n2, p2 + 2 * n2, p2 + 3 * n2};
  return beam_azint_emit(self, &s->c, &s->t, &s1, &s2, &s->first, emit);
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) { return 0; }

extern "C" const beam_stage_ops_t beam_azint_cuda_ops = {
    .kind = "azint", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
