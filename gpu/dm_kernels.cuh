/* Kernels of the DM engine's CUDA backend (gpu/dm_cuda.cu, the only file
 * that includes this). Templated on the real type T (float or double) with
 * C = float2 / double2, the layouts of cufftComplex / cufftDoubleComplex.
 *
 * Layouts (all C order):
 *   amp   [view][pixel]                 float, FFT order, < 0 masked
 *   psi   [view][mode][pixel]           mode = j * M_O + k (probe j, object k)
 *   buf   [batch view][mode][pixel]     the FFT buffer of one batch of views
 *   P     [j][pixel], O [k][obj pixel]  obj pixel = row * obj_w + col
 *   vstat [view] = {valid pixels, sum of valid A}  (double2)
 *   errsum[view] = sum_valid (af - A)^2            (double)
 * Pixel p = y * n + x of view v sits on object pixel
 * (pos[2v] + y) * obj_w + pos[2v+1] + x.
 *
 * Per-view kernels run on a 2-D grid: blockIdx.y walks the views (a grid
 * stride, so any count works), x the pixels of one view. A block therefore
 * covers one view only, which is what lets a per-view sum be a block
 * reduction plus one atomicAdd per block. */
#ifndef BEAM_GPU_DM_KERNELS_CUH
#define BEAM_GPU_DM_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#define DM_THREADS 256 /* every kernel's block size; a multiple of 32 */

template <typename T> struct dm_cplx;
template <> struct dm_cplx<float> { typedef float2 type; };
template <> struct dm_cplx<double> { typedef double2 type; };

typedef struct dm_geo_s {
  int n;             /* view side */
  int obj_w;         /* object row length */
  size_t npx;        /* n * n */
  size_t opx;        /* obj_h * obj_w */
  int mp, mo, m;     /* probe modes, object modes, m = mp * mo */
} dm_geo_t;

template <typename C> __device__ __forceinline__ C cmul(C a, C b) {
  C r;
  r.x = a.x * b.x - a.y * b.y;
  r.y = a.x * b.y + a.y * b.x;
  return r;
}
/* conj(a) * b */
template <typename C> __device__ __forceinline__ C cmulc(C a, C b) {
  C r;
  r.x = a.x * b.x + a.y * b.y;
  r.y = a.x * b.y - a.y * b.x;
  return r;
}
template <typename C> __device__ __forceinline__ C cmake(decltype(C().x) re, decltype(C().x) im) {
  C r;
  r.x = re;
  r.y = im;
  return r;
}

/* 32-bit division: p < n^2 <= 8192^2 (dm.c's bound), and a 64-bit divide
 * costs several times more in the innermost index of every kernel. */
__device__ __forceinline__ size_t dm_owin(const dm_geo_t &g, const int32_t *__restrict__ pos, size_t v,
                                          size_t p) {
  unsigned pp = (unsigned)p, nn = (unsigned)g.n, y = pp / nn, x = pp - y * nn;
  return ((size_t)pos[2 * v] + y) * (size_t)g.obj_w + (size_t)pos[2 * v + 1] + x;
}

/* Sum over the block; the result is valid in thread 0. Every thread of the
 * block must call it (it synchronises), and it may be called in a loop. */
__device__ __forceinline__ double dm_block_sum(double v) {
  __shared__ double sh[DM_THREADS / 32];
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_down_sync(0xffffffffu, v, o);
  __syncthreads(); /* the previous call's readers are done with sh */
  if ((threadIdx.x & 31) == 0)
    sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
      v += __shfl_down_sync(0xffffffffu, v, o);
  }
  return v;
}

/* Max over the block (values >= 0; NaN is dropped by fmax, the metrics
 * catch it instead); valid in thread 0; same rules as dm_block_sum. */
__device__ __forceinline__ double dm_block_max(double v) {
  __shared__ double sh[DM_THREADS / 32];
  for (int o = 16; o > 0; o >>= 1)
    v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0)
    sh[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
      v = fmax(v, __shfl_down_sync(0xffffffffu, v, o));
  }
  return v;
}

/* What step 1 does to view v (dm.h): no photons -> psi = phi; power bound
 * on and within it -> Phi' = Phi, i.e. X = 2 phi - psi with no FFT
 * back; otherwise the full modulus constraint. */
enum { DM_VIEW_EMPTY = 0, DM_VIEW_WITHIN = 1, DM_VIEW_FULL = 2 };

__device__ __forceinline__ int dm_view_kind(double2 st, double errsum, int relax, double pbound,
                                            double *err) {
  if (!(st.y > 0.0))
    return DM_VIEW_EMPTY;
  *err = errsum / st.x;
  if (relax && !(*err > pbound))
    return DM_VIEW_WITHIN;
  return DM_VIEW_FULL;
}

/* ---- exit waves ------------------------------------------------------------ */

/* psi of views [v0, v0 + nv) = P_j W_v O_k. */
template <typename T>
__global__ void dm_init_psi_kernel(dm_geo_t g, const typename dm_cplx<T>::type *__restrict__ P,
                                   const typename dm_cplx<T>::type *__restrict__ O,
                                   const int32_t *__restrict__ pos, typename dm_cplx<T>::type *__restrict__ psi,
                                   size_t v0, size_t nv) {
  for (size_t bv = blockIdx.y; bv < nv; bv += gridDim.y) {
    size_t v = v0 + bv;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < g.npx; p += (size_t)gridDim.x * blockDim.x) {
      size_t ow = dm_owin(g, pos, v, p);
      for (int j = 0; j < g.mp; j++)
        for (int k = 0; k < g.mo; k++)
          psi[(v * g.m + j * g.mo + k) * g.npx + p] = cmul(P[j * g.npx + p], O[k * g.opx + ow]);
    }
  }
}

/* buf = 2 phi - psi for the batch of views [v0, v0 + nb). */
template <typename T>
__global__ void dm_form_kernel(dm_geo_t g, const typename dm_cplx<T>::type *__restrict__ P,
                               const typename dm_cplx<T>::type *__restrict__ O, const int32_t *__restrict__ pos,
                               const typename dm_cplx<T>::type *__restrict__ psi,
                               typename dm_cplx<T>::type *__restrict__ buf, size_t v0, size_t nb) {
  typedef typename dm_cplx<T>::type C;
  for (size_t bv = blockIdx.y; bv < nb; bv += gridDim.y) {
    size_t v = v0 + bv;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < g.npx; p += (size_t)gridDim.x * blockDim.x) {
      size_t ow = dm_owin(g, pos, v, p);
      for (int j = 0; j < g.mp; j++) {
        C pj = P[j * g.npx + p];
        for (int k = 0; k < g.mo; k++) {
          int md = j * g.mo + k;
          C phi = cmul(pj, O[k * g.opx + ow]);
          C s = psi[(v * g.m + md) * g.npx + p];
          buf[(bv * g.m + md) * g.npx + p] = cmake<C>(2 * phi.x - s.x, 2 * phi.y - s.y);
        }
      }
    }
  }
}

/* Unnormalised |FFT|^2 summed over the modes of pixel p of batch view bv. */
template <typename T>
__device__ __forceinline__ T dm_mode_power(const dm_geo_t &g, const typename dm_cplx<T>::type *__restrict__ buf,
                                           size_t bv, size_t p) {
  T s = 0;
  for (int md = 0; md < g.m; md++) {
    typename dm_cplx<T>::type b = buf[(bv * g.m + md) * g.npx + p];
    s += b.x * b.x + b.y * b.y;
  }
  return s;
}

/* errsum[v] += sum_valid (af - A)^2 for photon views of the batch; buf
 * holds the unnormalised forward FFT, so af = sqrt(sum |buf|^2) / n. Runs
 * before the modulus kernel only when the power bound is on (that kernel
 * needs each view's complete error); otherwise the modulus kernel sums it
 * itself and this pass over buf is saved. */
template <typename T>
__global__ void dm_err_kernel(dm_geo_t g, const typename dm_cplx<T>::type *__restrict__ buf,
                              const float *__restrict__ amp, const double2 *__restrict__ vstat, double *errsum,
                              size_t v0, size_t nb, T inv_n) {
  for (size_t bv = blockIdx.y; bv < nb; bv += gridDim.y) {
    size_t v = v0 + bv;
    if (!(vstat[v].y > 0.0))
      continue; /* uniform over the block: v depends on blockIdx only */
    double acc = 0;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < g.npx; p += (size_t)gridDim.x * blockDim.x) {
      T a = amp[v * g.npx + p];
      if (a >= 0) {
        T af = sqrt(dm_mode_power<T>(g, buf, bv, p)) * inv_n;
        double dv = (double)af - (double)a;
        acc += dv * dv;
      }
    }
    acc = dm_block_sum(acc);
    if (threadIdx.x == 0 && acc != 0.0)
      atomicAdd(&errsum[v], acc);
  }
}

/* The multi-mode modulus constraint on the unnormalised spectrum of each
 * photon view of the batch, with the unitary scalings folded in: buf
 * becomes fac * buf / n^2, so the unnormalised inverse FFT yields
 * F^-1[Phi'] directly (Phi = buf / n, F^-1 = IFFT / n). Masked pixels keep
 * Phi (fac = 1). Views left alone (no photons, within the bound) are not
 * touched: the update kernel does not read their buf. With sum_err the
 * kernel also accumulates errsum (power bound off). */
template <typename T>
__global__ void dm_modulus_kernel(dm_geo_t g, typename dm_cplx<T>::type *__restrict__ buf,
                                  const float *__restrict__ amp, const double2 *__restrict__ vstat, double *errsum,
                                  size_t v0, size_t nb, T inv_n, T inv_n2, T eps, int relax, double pbound,
                                  int sum_err) {
  typedef typename dm_cplx<T>::type C;
  for (size_t bv = blockIdx.y; bv < nb; bv += gridDim.y) {
    size_t v = v0 + bv;
    double err = 0;
    int kind = dm_view_kind(vstat[v], sum_err ? 0.0 : errsum[v], relax, pbound, &err);
    if (kind != DM_VIEW_FULL)
      continue; /* uniform over the block */
    T shrink = relax ? (T)sqrt(pbound / err) : (T)0;
    double acc = 0;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < g.npx; p += (size_t)gridDim.x * blockDim.x) {
      T a = amp[v * g.npx + p];
      T fac = inv_n2;
      if (a >= 0) {
        T af = sqrt(dm_mode_power<T>(g, buf, bv, p)) * inv_n;
        T fdev = af - a;
        if (sum_err)
          acc += (double)fdev * (double)fdev;
        fac = (relax ? a + fdev * shrink : a) / (af + eps) * inv_n2;
      }
      for (int md = 0; md < g.m; md++) {
        C *b = &buf[(bv * g.m + md) * g.npx + p];
        C x = *b;
        *b = cmake<C>(x.x * fac, x.y * fac);
      }
    }
    if (sum_err) {
      acc = dm_block_sum(acc);
      if (threadIdx.x == 0 && acc != 0.0)
        atomicAdd(&errsum[v], acc);
    }
  }
}

/* psi update of the batch, after the inverse FFT (buf = X = F^-1[Phi'] for
 * FULL views; X = 2 phi - psi for WITHIN ones): psi = cpsi psi + b X + a phi
 * (dm.h, beam_dm_update_coefs). DM keeps the form psi += b (X - phi), as the
 * CPU backend does, so the two round alike. EMPTY: psi = phi. */
template <typename T>
__global__ void dm_update_kernel(dm_geo_t g, const typename dm_cplx<T>::type *__restrict__ P,
                                 const typename dm_cplx<T>::type *__restrict__ O, const int32_t *__restrict__ pos,
                                 typename dm_cplx<T>::type *__restrict__ psi,
                                 const typename dm_cplx<T>::type *__restrict__ buf,
                                 const double2 *__restrict__ vstat, const double *__restrict__ errsum, size_t v0,
                                 size_t nb, T a, T b, T cpsi, int dm, int relax, double pbound) {
  typedef typename dm_cplx<T>::type C;
  for (size_t bv = blockIdx.y; bv < nb; bv += gridDim.y) {
    size_t v = v0 + bv;
    double err = 0;
    int kind = dm_view_kind(vstat[v], errsum[v], relax, pbound, &err);
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < g.npx; p += (size_t)gridDim.x * blockDim.x) {
      size_t ow = dm_owin(g, pos, v, p);
      for (int j = 0; j < g.mp; j++) {
        C pj = P[j * g.npx + p];
        for (int k = 0; k < g.mo; k++) {
          int md = j * g.mo + k;
          C phi = cmul(pj, O[k * g.opx + ow]);
          C *ps = &psi[(v * g.m + md) * g.npx + p];
          C s = *ps;
          if (kind == DM_VIEW_FULL) {
            C f = buf[(bv * g.m + md) * g.npx + p];
            if (dm)
              s = cmake<C>(s.x + b * (f.x - phi.x), s.y + b * (f.y - phi.y));
            else
              s = cmake<C>(cpsi * s.x + b * f.x + a * phi.x, cpsi * s.y + b * f.y + a * phi.y);
          } else if (kind == DM_VIEW_WITHIN) {
            if (dm)
              s = cmake<C>(s.x + b * (phi.x - s.x), s.y + b * (phi.y - s.y));
            else
              s = cmake<C>(cpsi * s.x + b * (2 * phi.x - s.x) + a * phi.x,
                           cpsi * s.y + b * (2 * phi.y - s.y) + a * phi.y);
          } else {
            s = phi;
          }
          *ps = s;
        }
      }
    }
  }
}

/* ---- object and probe ------------------------------------------------------ */

/* Object accumulation, one thread per (view, view pixel):
 *   onum_k[W_v p] += sum_j conj(P_j[p]) psi_vjk[p],  oden[W_v p] += sum_j |P_j[p]|^2
 * Scatter with atomicAdd rather than a gather per object pixel: a gather
 * needs the list of views covering each object pixel (a spatial index
 * rebuilt whenever views arrive, arbitrary positions), while the scatter
 * needs nothing, every view runs in parallel (no serial loop over views),
 * neighbouring threads hit neighbouring addresses of one object row, and
 * with ~70% overlap an object pixel sees only ~10 views, so contention is
 * low. The price is a summation order that varies from run to run (last
 * bits; the cross-check tolerances allow for it). */
template <typename T>
__global__ void dm_obj_acc_kernel(dm_geo_t g, const typename dm_cplx<T>::type *__restrict__ P,
                                  const int32_t *__restrict__ pos, const typename dm_cplx<T>::type *__restrict__ psi,
                                  T *onum, T *oden, size_t nv) {
  typedef typename dm_cplx<T>::type C;
  for (size_t v = blockIdx.y; v < nv; v += gridDim.y) {
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < g.npx; p += (size_t)gridDim.x * blockDim.x) {
      size_t ow = dm_owin(g, pos, v, p);
      T den = 0;
      for (int j = 0; j < g.mp; j++) {
        C pj = P[j * g.npx + p];
        den += pj.x * pj.x + pj.y * pj.y;
      }
      atomicAdd(&oden[ow], den);
      for (int k = 0; k < g.mo; k++) {
        C num = cmake<C>(0, 0);
        for (int j = 0; j < g.mp; j++) {
          C t = cmulc(P[j * g.npx + p], psi[(v * g.m + j * g.mo + k) * g.npx + p]);
          num.x += t.x;
          num.y += t.y;
        }
        atomicAdd(&onum[2 * (k * g.opx + ow)], num.x);
        atomicAdd(&onum[2 * (k * g.opx + ow) + 1], num.y);
      }
    }
  }
}

/* Probe accumulation, a parallel reduction over views: thread (j, p) of
 * view chunk blockIdx.y sums its chunk in registers
 *   pnum_j[p] += sum_vk psi_vjk[p] conj(O_k[W_v p]),  pden[p] += sum_vk |O_k[W_v p]|^2
 * and adds the partial with one atomicAdd per chunk. Chunks keep the GPU
 * full (n^2 M_P threads alone are too few) while the atomics stay ~chunks
 * per probe pixel. Reads of psi are coalesced (consecutive p). */
template <typename T>
__global__ void dm_probe_acc_kernel(dm_geo_t g, const typename dm_cplx<T>::type *__restrict__ O,
                                    const int32_t *__restrict__ pos, const typename dm_cplx<T>::type *__restrict__ psi,
                                    T *pnum, T *pden, size_t nv, size_t chunk) {
  typedef typename dm_cplx<T>::type C;
  size_t v0 = blockIdx.y * chunk, v1 = v0 + chunk < nv ? v0 + chunk : nv;
  size_t total = (size_t)g.mp * g.npx;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    unsigned ii = (unsigned)i, np32 = (unsigned)g.npx; /* < 16 * 8192^2 < 2^32 */
    int j = (int)(ii / np32);
    size_t p = ii - (unsigned)j * np32;
    C num = cmake<C>(0, 0);
    T den = 0;
    for (size_t v = v0; v < v1; v++) {
      size_t ow = dm_owin(g, pos, v, p);
      for (int k = 0; k < g.mo; k++) {
        C o = O[k * g.opx + ow];
        C t = cmulc(o, psi[(v * g.m + j * g.mo + k) * g.npx + p]);
        num.x += t.x;
        num.y += t.y;
        den += o.x * o.x + o.y * o.y;
      }
    }
    atomicAdd(&pnum[2 * i], num.x);
    atomicAdd(&pnum[2 * i + 1], num.y);
    if (j == 0)
      atomicAdd(&pden[p], den);
  }
}

/* X = (num + a X) / (den + a) with a = reg * (*dmax); pixels whose
 * denominator is 0 (no coverage, reg 0) keep their value. For the probe,
 * support_n2 > 0 then zeroes pixels with pi r^2 >= support_n2 (r from the
 * array centre (n/2, n/2), PtyPy's grid). count = modes * plane. */
template <typename T>
__global__ void dm_divide_kernel(typename dm_cplx<T>::type *__restrict__ X, const T *__restrict__ num,
                                 const T *__restrict__ den, const double *__restrict__ dmax, double reg, size_t plane,
                                 size_t count, int n, double support_n2) {
  typedef typename dm_cplx<T>::type C;
  T a = (T)(reg * *dmax);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    size_t q = i % plane;
    T dd = den[q] + a;
    C x = X[i];
    if (dd > 0)
      x = cmake<C>((num[2 * i] + a * x.x) / dd, (num[2 * i + 1] + a * x.y) / dd);
    if (support_n2 > 0) {
      double y = (double)(q / (size_t)n) - (double)(n / 2), xx = (double)(q % (size_t)n) - (double)(n / 2);
      if (M_PI * (y * y + xx * xx) >= support_n2)
        x = cmake<C>(0, 0);
    }
    X[i] = x;
  }
}

/* ---- reductions (two stages: per-block partials, then one block) ----------- */

template <typename T> __global__ void dm_max_partial_kernel(const T *__restrict__ x, size_t count, double *part) {
  double m = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    m = fmax(m, (double)x[i]);
  m = dm_block_max(m);
  if (threadIdx.x == 0)
    part[blockIdx.x] = m;
}

__global__ void dm_sum_partial_kernel(const double *__restrict__ x, size_t count, double *part) {
  double s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    s += x[i];
  s = dm_block_sum(s);
  if (threadIdx.x == 0)
    part[blockIdx.x] = s;
}

/* part[2b] = sum |a - prev|^2, part[2b + 1] = sum |a|^2 over count complex. */
template <typename T>
__global__ void dm_change_partial_kernel(const typename dm_cplx<T>::type *__restrict__ a,
                                         const typename dm_cplx<T>::type *__restrict__ prev, size_t count,
                                         double *part) {
  double s = 0, t = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
    double dx = (double)a[i].x - (double)prev[i].x, dy = (double)a[i].y - (double)prev[i].y;
    s += dx * dx + dy * dy;
    t += (double)a[i].x * a[i].x + (double)a[i].y * a[i].y;
  }
  s = dm_block_sum(s);
  t = dm_block_sum(t);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = s;
    part[2 * blockIdx.x + 1] = t;
  }
}

/* One block: out[c] = sum (or max) over b < nblk of part[b * ncol + c]. */
__global__ void dm_finish_kernel(const double *__restrict__ part, int nblk, int ncol, int is_max, double *out) {
  for (int c = 0; c < ncol; c++) {
    double s = 0;
    for (int b = threadIdx.x; b < nblk; b += blockDim.x)
      s = is_max ? fmax(s, part[b * ncol + c]) : s + part[b * ncol + c];
    s = is_max ? dm_block_max(s) : dm_block_sum(s);
    if (threadIdx.x == 0)
      out[c] = s;
  }
}

template <typename T> __global__ void dm_fill_kernel(typename dm_cplx<T>::type *x, size_t count, T re, T im) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
    x[i] = cmake<typename dm_cplx<T>::type>(re, im);
}

#endif
