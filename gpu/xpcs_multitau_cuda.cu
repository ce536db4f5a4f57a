/* Stage kind `xpcs_multitau`, CUDA backend. The host keeps the control
 * state of xpcs_multitau.h (frame counts per level, bad flags, pair
 * counts) exactly as the CPU backend does; the device keeps the data: the
 * level rings [levels][nb][P], the per-slot ROI sums and the G/IP/IF
 * accumulators, which come back to the host only to publish.
 *
 * Per input frame, on the stage's stream:
 *   copy the frame H2D; xmt_gather (grid-stride over the P ROI pixels)
 *   writes level-0 slot s; xmt_roisum (one block per ROI, 256 threads,
 *   shared-memory tree) writes its ROI sums; for float input those R sums
 *   come back (one small D2H and a sync) so a NaN marks the frame bad as
 *   on the CPU; then for each level that completes a pair of frames,
 *   xmt_combine adds them into the next level, and xmt_pairs, grid
 *   (R, lag channels), one block per (ROI, lag), reduces the dot product
 *   of the two frames over the ROI in a fixed tree and adds it (and the
 *   two ROI sums) into that (row, ROI) accumulator. One block owns each
 *   accumulator and launches are ordered, so no atomics are needed.
 * Integer input: int64 level sums, 128-bit products and sums, so every
 * result is the exact integer the CPU gets: bit-identical output. Float
 * input: double, summed in another order than the CPU: equal to round-off.
 *
 * normalization per_pixel: xmt_pix, grid (pixel blocks, lag channels),
 * one thread per (row, pixel) accumulator, adds each pair into the
 * per-pixel sums in the CPU's pair order (no reduction: integers are
 * bit-identical; floats agree to round-off, as nvcc contracts the
 * multiply-add to an FMA). For integer input xmt_roimax records each level
 * frame's per-ROI max |pixel| and block (0, j) of xmt_pix adds the pair's
 * bound to its row and flags the first row past INT64_MAX; the flag comes
 * back with the sums at publish, which then fails as the CPU does. */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/xpcs_multitau.h"

#define XT 256

template <typename T, typename LV>
__global__ void xmt_gather(const T *__restrict__ px, const uint32_t *__restrict__ idx, size_t P,
                           LV *__restrict__ out) {
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x)
    out[p] = (LV)px[idx[p]];
}

template <typename LV>
__global__ void xmt_combine(const LV *__restrict__ a, const LV *__restrict__ b, LV *__restrict__ o, size_t P) {
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x)
    o[p] = a[p] + b[p];
}

template <typename AC>
__device__ AC block_sum(AC v) {
  __shared__ AC sh[XT];
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned h = XT / 2; h > 0; h >>= 1) {
    if (t < h)
      sh[t] += sh[t + h];
    __syncthreads();
  }
  return sh[0];
}

/* Block r: the sum of ROI r's pixels of one level frame. */
template <typename LV, typename AC>
__global__ void xmt_roisum(const LV *__restrict__ v, const uint64_t *__restrict__ off, AC *__restrict__ sums) {
  unsigned r = blockIdx.x;
  AC s = 0;
  for (uint64_t k = off[r] + threadIdx.x; k < off[r + 1]; k += XT)
    s += (AC)v[k];
  AC tot = block_sum<AC>(s);
  if (threadIdx.x == 0)
    sums[r] = tot;
}

/* Block (r, j): lag channel i = imin + j of level L, whose newest frame
 * (number n, slot s) pairs with slot o = (n - 1 - i) % nb. */
template <typename LV, typename AC>
__global__ void xmt_pairs(const LV *__restrict__ lvl, const AC *__restrict__ lsum,
                          const uint8_t *__restrict__ bad, const uint64_t *__restrict__ off, size_t P,
                          unsigned R, unsigned nb, unsigned long long n, unsigned imin, size_t row0,
                          AC *__restrict__ G, AC *__restrict__ IP, AC *__restrict__ IF) {
  unsigned r = blockIdx.x, i = imin + blockIdx.y;
  unsigned s = (unsigned)((n - 1) % nb), o = (unsigned)((n - 1 - i) % nb);
  if (bad[s] || bad[o])
    return; /* uniform per block: no thread reaches the barrier */
  const LV *xs = lvl + (size_t)s * P, *xo = lvl + (size_t)o * P;
  AC acc = 0;
  for (uint64_t k = off[r] + threadIdx.x; k < off[r + 1]; k += XT)
    acc += (AC)xo[k] * (AC)xs[k];
  AC tot = block_sum<AC>(acc);
  if (threadIdx.x == 0) {
    size_t t = (row0 + i) * R + r;
    G[t] += tot;
    IP[t] += lsum[(size_t)o * R + r];
    IF[t] += lsum[(size_t)s * R + r];
  }
}

/* Block r: max |pixel| of ROI r of one integer level frame. */
__global__ void xmt_roimax(const long long *__restrict__ v, const uint64_t *__restrict__ off,
                           unsigned long long *__restrict__ mx) {
  __shared__ unsigned long long sh[XT];
  unsigned r = blockIdx.x, t = threadIdx.x;
  unsigned long long m = 0;
  for (uint64_t k = off[r] + t; k < off[r + 1]; k += XT) {
    long long a = v[k];
    unsigned long long u = a < 0 ? 0ull - (unsigned long long)a : (unsigned long long)a;
    m = u > m ? u : m;
  }
  sh[t] = m;
  __syncthreads();
  for (unsigned h = XT / 2; h > 0; h >>= 1) {
    if (t < h && sh[t + h] > sh[t])
      sh[t] = sh[t + h];
    __syncthreads();
  }
  if (t == 0)
    mx[r] = sh[0];
}

/* per_pixel, block (b, j): lag channel i = imin + j of level L, pixels
 * grid-strided; row (row0 + i)'s per-pixel sums. lmax == NULL: float. */
template <typename LV>
__global__ void xmt_pix(const LV *__restrict__ lvl, const uint8_t *__restrict__ bad,
                        const unsigned long long *__restrict__ lmax, size_t P, unsigned R, unsigned nb,
                        unsigned long long n, unsigned imin, size_t row0, LV *__restrict__ G,
                        LV *__restrict__ IP, LV *__restrict__ IF, beam_i128 *__restrict__ bnd,
                        unsigned long long *__restrict__ ovf) {
  unsigned i = imin + blockIdx.y;
  unsigned s = (unsigned)((n - 1) % nb), o = (unsigned)((n - 1 - i) % nb);
  if (bad[s] || bad[o])
    return;
  size_t t = row0 + i;
  if (lmax && blockIdx.x == 0 && threadIdx.x == 0) {
    unsigned long long ms = 0, mo = 0;
    for (unsigned r = 0; r < R; r++) {
      ms = lmax[(size_t)s * R + r] > ms ? lmax[(size_t)s * R + r] : ms;
      mo = lmax[(size_t)o * R + r] > mo ? lmax[(size_t)o * R + r] : mo;
    }
    beam_i128 *b = bnd + 2 * t;
    b[0] += (beam_i128)mo * ms;
    b[1] += mo > ms ? mo : ms;
    if (b[0] > (beam_i128)INT64_MAX || b[1] > (beam_i128)INT64_MAX)
      atomicMin(ovf, (unsigned long long)t);
  }
  const LV *xs = lvl + (size_t)s * P, *xo = lvl + (size_t)o * P;
  LV *g = G + t * P, *ip = IP + t * P, *fu = IF + t * P;
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x) {
    g[p] += xo[p] * xs[p];
    ip[p] += xo[p];
    fu[p] += xs[p];
  }
}

__global__ void xmt_set(uint8_t *p, uint8_t v) { *p = v; }

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_xmt_t x;
  size_t frame_bytes;
  void *d_frame, *d_idx, *d_off, *d_lvl, *d_lsum, *d_bad, *d_G, *d_IP, *d_IF;
  size_t c_frame, c_idx, c_off, c_lvl, c_lsum, c_bad, c_G, c_IP, c_IF;
  /* per_pixel */
  void *d_pG, *d_pIP, *d_pIF, *d_lmax, *d_bnd, *d_ovf;
  size_t c_pG, c_pIP, c_pIF, c_lmax, c_bnd, c_ovf;
  cudaEvent_t copied; /* the frame's host-to-device copy is done */
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *c = (cuda_t *)self->priv;
  if (!c)
    return;
  if (c->copied)
    cudaEventDestroy(c->copied);
  beam__cuda_ctx_fini(&c->cx);
  beam__dbuf_free(&c->d_frame, &c->c_frame);
  beam__dbuf_free(&c->d_idx, &c->c_idx);
  beam__dbuf_free(&c->d_off, &c->c_off);
  beam__dbuf_free(&c->d_lvl, &c->c_lvl);
  beam__dbuf_free(&c->d_lsum, &c->c_lsum);
  beam__dbuf_free(&c->d_bad, &c->c_bad);
  beam__dbuf_free(&c->d_G, &c->c_G);
  beam__dbuf_free(&c->d_IP, &c->c_IP);
  beam__dbuf_free(&c->d_IF, &c->c_IF);
  beam__dbuf_free(&c->d_pG, &c->c_pG);
  beam__dbuf_free(&c->d_pIP, &c->c_pIP);
  beam__dbuf_free(&c->d_pIF, &c->c_pIF);
  beam__dbuf_free(&c->d_lmax, &c->c_lmax);
  beam__dbuf_free(&c->d_bnd, &c->c_bnd);
  beam__dbuf_free(&c->d_ovf, &c->c_ovf);
  beam_xmt_free(&c->x);
  free(c);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, "xpcs_multitau: out of memory");
  self->priv = c;
  int rc = beam__cuda_ctx_init(&c->cx, "xpcs_multitau", d);
  if (rc < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaEventCreateWithFlags(&c->copied, cudaEventDisableTiming));
  return beam_xmt_init(&c->x, self->cfg, d);
}


static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *c = (cuda_t *)self->priv;
  beam_xmt_t *x = &c->x;
  int rc = beam_xmt_start(self, x, series, in, d);
  if (rc < 0)
    return rc;
  size_t L = x->conf.levels, nb = x->conf.nb, as = beam_xmt_acc_size(x), acc = x->nlags * x->R * as;
  c->frame_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  if ((rc = beam__cuda_ctx_use(&c->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_frame, &c->c_frame, c->frame_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_idx, &c->c_idx, x->P * sizeof(uint32_t), d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_off, &c->c_off, (x->R + 1) * sizeof(uint64_t), d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_lvl, &c->c_lvl, L * nb * x->P * beam_xmt_lvl_size(x), d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_lsum, &c->c_lsum, L * nb * x->R * as, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_bad, &c->c_bad, L * nb, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_G, &c->c_G, acc, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_IP, &c->c_IP, acc, d)) < 0 ||
      (rc = beam__dbuf_reserve(&c->d_IF, &c->c_IF, acc, d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpy(c->d_idx, x->rois.idx, x->P * sizeof(uint32_t), cudaMemcpyHostToDevice));
  BEAM_CUDA_TRY(d, cudaMemcpy(c->d_off, x->rois.off, (x->R + 1) * sizeof(uint64_t), cudaMemcpyHostToDevice));
  BEAM_CUDA_TRY(d, cudaMemset(c->d_bad, 0, L * nb));
  BEAM_CUDA_TRY(d, cudaMemset(c->d_G, 0, acc));
  BEAM_CUDA_TRY(d, cudaMemset(c->d_IP, 0, acc));
  BEAM_CUDA_TRY(d, cudaMemset(c->d_IF, 0, acc));
  if (x->conf.per_pixel) {
    size_t pix = x->nlags * x->P * beam_xmt_lvl_size(x);
    if ((rc = beam__dbuf_reserve(&c->d_pG, &c->c_pG, pix, d)) < 0 ||
        (rc = beam__dbuf_reserve(&c->d_pIP, &c->c_pIP, pix, d)) < 0 ||
        (rc = beam__dbuf_reserve(&c->d_pIF, &c->c_pIF, pix, d)) < 0 ||
        (rc = beam__dbuf_reserve(&c->d_lmax, &c->c_lmax, L * nb * x->R * sizeof(unsigned long long), d)) < 0 ||
        (rc = beam__dbuf_reserve(&c->d_bnd, &c->c_bnd, 2 * x->nlags * sizeof(beam_i128), d)) < 0 ||
        (rc = beam__dbuf_reserve(&c->d_ovf, &c->c_ovf, sizeof(unsigned long long), d)) < 0)
      return rc;
    BEAM_CUDA_TRY(d, cudaMemset(c->d_pG, 0, pix));
    BEAM_CUDA_TRY(d, cudaMemset(c->d_pIP, 0, pix));
    BEAM_CUDA_TRY(d, cudaMemset(c->d_pIF, 0, pix));
    BEAM_CUDA_TRY(d, cudaMemset(c->d_lmax, 0, L * nb * x->R * sizeof(unsigned long long)));
    BEAM_CUDA_TRY(d, cudaMemset(c->d_bnd, 0, 2 * x->nlags * sizeof(beam_i128)));
    BEAM_CUDA_TRY(d, cudaMemset(c->d_ovf, 0xff, sizeof(unsigned long long))); /* none */
  }
  return 0;
}

template <typename LV, typename AC>
static int pairs(cuda_t *c, unsigned L, beam_diag_t *d) {
  beam_xmt_t *x = &c->x;
  size_t nb = x->conf.nb, n = x->nlev[L], s = (n - 1) % nb;
  unsigned imin = L ? (unsigned)nb / 2 : 0, imax = (unsigned)(n < nb ? n : nb);
  const uint8_t *bad = x->bad + (size_t)L * nb;
  if (bad[s] || imax <= imin)
    return 0;
  for (unsigned i = imin; i < imax; i++)
    if (!bad[(n - 1 - i) % nb])
      x->npairs[beam_xmt_row(x, L, i)]++;
  if (x->conf.per_pixel) {
    dim3 pg(beam__grid_for(x->P, XT), imax - imin);
    xmt_pix<LV><<<pg, XT, 0, c->cx.stream>>>(
        (const LV *)c->d_lvl + (size_t)L * nb * x->P, (const uint8_t *)c->d_bad + (size_t)L * nb,
        x->exact ? (const unsigned long long *)c->d_lmax + (size_t)L * nb * x->R : NULL, x->P,
        (unsigned)x->R, (unsigned)nb, (unsigned long long)n, imin, beam_xmt_row(x, L, 0), (LV *)c->d_pG,
        (LV *)c->d_pIP, (LV *)c->d_pIF, (beam_i128 *)c->d_bnd, (unsigned long long *)c->d_ovf);
    BEAM_CUDA_LAUNCHED(d, "xmt_pix");
    return 0;
  }
  dim3 grid((unsigned)x->R, imax - imin);
  xmt_pairs<LV, AC><<<grid, XT, 0, c->cx.stream>>>(
      (const LV *)c->d_lvl + (size_t)L * nb * x->P, (const AC *)c->d_lsum + (size_t)L * nb * x->R,
      (const uint8_t *)c->d_bad + (size_t)L * nb, (const uint64_t *)c->d_off, x->P, (unsigned)x->R,
      (unsigned)nb, (unsigned long long)n, imin, beam_xmt_row(x, L, 0), (AC *)c->d_G, (AC *)c->d_IP,
      (AC *)c->d_IF);
  BEAM_CUDA_LAUNCHED(d, "xmt_pairs");
  return 0;
}

static int set_bad(cuda_t *c, size_t k, int bad, beam_diag_t *d) {
  c->x.bad[k] = (uint8_t)bad;
  xmt_set<<<1, 1, 0, c->cx.stream>>>((uint8_t *)c->d_bad + k, (uint8_t)bad);
  BEAM_CUDA_LAUNCHED(d, "xmt_set");
  return 0;
}

/* per_pixel, integer input: max |pixel| per ROI of the level frame in
 * slot k (levels x nb flat). */
template <typename LV>
static int roimax(cuda_t *c, const LV *v, size_t k, beam_diag_t *d) {
  if (!c->x.conf.per_pixel || !c->x.exact)
    return 0;
  xmt_roimax<<<(unsigned)c->x.R, XT, 0, c->cx.stream>>>((const long long *)v, (const uint64_t *)c->d_off,
                                                        (unsigned long long *)c->d_lmax + k * c->x.R);
  BEAM_CUDA_LAUNCHED(d, "xmt_roimax");
  return 0;
}

template <typename LV, typename AC>
static int push(cuda_t *c, const beam_frame_t *in, int bad, beam_diag_t *d) {
  beam_xmt_t *x = &c->x;
  size_t nb = x->conf.nb, P = x->P, R = x->R;
  cudaStream_t st = c->cx.stream;
  unsigned grid = beam__grid_for(P, XT);
  LV *lvl = (LV *)c->d_lvl;
  AC *lsum = (AC *)c->d_lsum;
  size_t s = x->nlev[0] % nb;
  int rc;
  if (!bad) {
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d_frame, in->data, c->frame_bytes, cudaMemcpyHostToDevice, st));
    BEAM_CUDA_TRY(d, cudaEventRecord(c->copied, st));
    switch (in->dtype) {
#define XG(T, DT)                                                                              \
  case DT:                                                                                     \
    xmt_gather<T, LV><<<grid, XT, 0, st>>>((const T *)c->d_frame, (const uint32_t *)c->d_idx, P, \
                                            lvl + s * P);                                     \
    break;
      BEAM__REAL_DTYPES(XG)
#undef XG
    default:
      return BEAM_DIAG(d, BEAM_ESHAPE, "xpcs_multitau: dtype %s", beam_dtype_name(in->dtype));
    }
    BEAM_CUDA_LAUNCHED(d, "xmt_gather");
    /* The input slot is pinned and goes back to the pool when process
     * returns, so its copy must be complete by then; only the copy is
     * waited for, the kernels run on. */
    BEAM_CUDA_TRY(d, cudaEventSynchronize(c->copied));
    xmt_roisum<LV, AC><<<(unsigned)R, XT, 0, st>>>(lvl + s * P, (const uint64_t *)c->d_off, lsum + s * R);
    BEAM_CUDA_LAUNCHED(d, "xmt_roisum");
    if ((rc = roimax<LV>(c, lvl + s * P, s, d)) < 0)
      return rc;
    if (!x->exact) {
      /* a NaN pixel makes the frame bad for every ROI (scikit-beam) */
      double *h = (double *)x->lsum + s * R;
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(h, lsum + s * R, R * sizeof(double), cudaMemcpyDeviceToHost, st));
      BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
      for (size_t r = 0; r < R && !bad; r++)
        bad = isnan(h[r]);
    }
  }
  if ((rc = set_bad(c, s, bad, d)) < 0)
    return rc;
  x->nframes++;
  x->nbad += bad != 0;
  x->nlev[0]++;
  if ((rc = pairs<LV, AC>(c, 0, d)) < 0)
    return rc;
  for (unsigned L = 0; L + 1 < x->conf.levels && x->nlev[L] % 2 == 0; L++) {
    size_t n = x->nlev[L], a = (n - 2) % nb, b = (n - 1) % nb, o = x->nlev[L + 1] % nb;
    const uint8_t *bl = x->bad + (size_t)L * nb;
    int bd = bl[a] || bl[b];
    if (!bd) {
      LV *base = lvl + (size_t)L * nb * P, *dst = lvl + ((size_t)(L + 1) * nb + o) * P;
      xmt_combine<LV><<<grid, XT, 0, st>>>(base + a * P, base + b * P, dst, P);
      BEAM_CUDA_LAUNCHED(d, "xmt_combine");
      xmt_roisum<LV, AC><<<(unsigned)R, XT, 0, st>>>(dst, (const uint64_t *)c->d_off,
                                                     lsum + ((size_t)(L + 1) * nb + o) * R);
      BEAM_CUDA_LAUNCHED(d, "xmt_roisum");
      if ((rc = roimax<LV>(c, dst, (L + 1) * nb + o, d)) < 0)
        return rc;
    }
    if ((rc = set_bad(c, (size_t)(L + 1) * nb + o, bd, d)) < 0)
      return rc;
    x->nlev[L + 1]++;
    if ((rc = pairs<LV, AC>(c, L + 1, d)) < 0)
      return rc;
  }
  return 0;
}

static int publish(cuda_t *c, beam_emit_t *emit, uint32_t flag, beam_diag_t *d) {
  beam_xmt_t *x = &c->x;
  size_t acc = x->nlags * x->R * beam_xmt_acc_size(x);
  cudaStream_t st = c->cx.stream;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(x->G, c->d_G, acc, cudaMemcpyDeviceToHost, st));
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(x->IP, c->d_IP, acc, cudaMemcpyDeviceToHost, st));
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(x->IF, c->d_IF, acc, cudaMemcpyDeviceToHost, st));
  unsigned long long ovf = ~0ull;
  if (x->conf.per_pixel) {
    size_t pix = x->nlags * x->P * beam_xmt_lvl_size(x);
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(x->pG, c->d_pG, pix, cudaMemcpyDeviceToHost, st));
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(x->pIP, c->d_pIP, pix, cudaMemcpyDeviceToHost, st));
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(x->pIF, c->d_pIF, pix, cudaMemcpyDeviceToHost, st));
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(&ovf, c->d_ovf, sizeof ovf, cudaMemcpyDeviceToHost, st));
  }
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
  if (ovf != ~0ull && x->ovf_row < 0)
    x->ovf_row = (int64_t)ovf;
  int rc = beam_xmt_check(x, d);
  if (rc < 0)
    return rc;
  return beam_xmt_publish(x, emit, flag);
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *c = (cuda_t *)self->priv;
  beam_xmt_t *x = &c->x;
  int bad = beam_xmt_flag_bad(in->flags), rc;
  if (!(in->flags & BEAM_FLAG_CORRUPT) &&
      (rc = beam__frame_matches(self, in, x->in.dtype, x->in.ndim, x->in.shape)) < 0)
    return rc;
  if ((rc = beam__cuda_ctx_use(&c->cx, &self->diag)) < 0)
    return rc;
  /* Frames lost before this one: bad frames (xpcs_multitau_cpu.c). */
  rc = 0;
  for (uint32_t k = 0; k < in->missing_before && rc >= 0; k++)
    rc = x->exact ? push<long long, beam_i128>(c, in, 1, &self->diag)
                  : push<double, double>(c, in, 1, &self->diag);
  if (rc >= 0)
    rc = x->exact ? push<long long, beam_i128>(c, in, bad, &self->diag)
                  : push<double, double>(c, in, bad, &self->diag);
  if (rc < 0)
    return rc;
  if (x->conf.publish_every && x->nframes % x->conf.publish_every == 0)
    return publish(c, emit, BEAM_FLAG_PARTIAL, &self->diag);
  return 0;
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *c = (cuda_t *)self->priv;
  int rc = beam__cuda_ctx_use(&c->cx, &self->diag);
  if (rc < 0)
    return rc;
  return publish(c, emit, BEAM_FLAG_FINAL, &self->diag);
}

extern "C" const beam_stage_ops_t beam_xpcs_multitau_cuda_ops = {
    .kind = "xpcs_multitau", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
