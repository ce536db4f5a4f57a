/* The fitter's device code (included by the gpu/fit_k_*.cu translation
 * units, one per model family, so that nvcc compiles the families in
 * parallel; gpu/fit_cuda.cu is the host side): the fused LM kernel, the
 * device starts (gpu/fit_init_cuda.cuh) and the launchers of one family.
 * See gpu/fit_cuda.cu for what the kernel does and how it differs from
 * the CPU. */
#ifndef BEAM_GPU_FIT_KERN_CUH
#define BEAM_GPU_FIT_KERN_CUH
#include "gpu/cuda_int.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "pipeline/fit.h"
#include "pipeline/kern/fit_int.h"
}

#define FT 128 /* threads per block, both mappings (the most a launch may ask) */
#define NVAR 3 /* launch-bounds variants of fit_kernel */

/* Everything a kernel reads, by value (one launch per batch). */
typedef struct fit_args_s {
  const void *y;
  const float *x, *w;
  ptrdiff_t y0, yfs, yps, x0, xfs, xps, w0, wfs, wps; /* element offsets and strides */
  const double *p0;                                   /* N x P, always given */
  double lo[FIT_MAXP], hi[FIT_MAXP];
  size_t N;
  int T, est, max_iter, abs_sigma;
  double ftol, xtol, gtol;
  double lambda0;
  double *params, *errors, *cov, *chi2, *chi2_red;
  int32_t *iters, *n_used;
  uint8_t *status;
} fit_args_t;

template <int M> struct model_p {
  static constexpr int P = M == BEAM_FIT_DCOS      ? 5
                           : M == BEAM_FIT_DCOS_T0 ? 6
                           : M == BEAM_FIT_DCOS2   ? 9
                           : M == BEAM_FIT_EXP     ? 3
                           : M == BEAM_FIT_STRETCH || M == BEAM_FIT_STRETCH_XT ? 4
                                                                               : 5;
};

/* ---- reductions over the NL lanes of one fit (identity for NL = 1) ---- */
template <int NL, typename T> __device__ __forceinline__ T lanes_sum(T v) {
  if constexpr (NL > 1)
    for (int m = NL / 2; m > 0; m >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
template <int NL> __device__ __forceinline__ float lanes_min(float v) {
  if constexpr (NL > 1)
    for (int m = NL / 2; m > 0; m >>= 1)
      v = fminf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
template <int NL> __device__ __forceinline__ float lanes_max(float v) {
  if constexpr (NL > 1)
    for (int m = NL / 2; m > 0; m >>= 1)
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

/* ---- per point ---- */
template <typename TY> __device__ __forceinline__ float load_y(const fit_args_t &a, ptrdiff_t q) {
  return (float)((const TY *)a.y)[q];
}

/* x, y and the estimator's weight of point k of fit i, as beam__fit_gather
 * defines them (the weight rounded to float as the SIMD path does). */
template <typename TY>
__device__ __forceinline__ void load_point(const fit_args_t &a, ptrdiff_t i, ptrdiff_t k, float &x,
                                           float &y, float &w) {
  x = a.x[a.x0 + i * a.xfs + k * a.xps];
  y = load_y<TY>(a, a.y0 + i * a.yfs + k * a.yps);
  w = a.w ? a.w[a.w0 + i * a.wfs + k * a.wps] : 1.0f;
  if (a.est == BEAM_FIT_LSE_POISSON)
    w = isfinite(y) ? 1.0f / (y > 1.0f ? y : 1.0f) : NAN;
}

/* sin and cos of v: reduced to [-π, π] by 2π in two parts (Cody–Waite),
 * where __sincosf's absolute error is 2^-21.41; the reduction adds about
 * |v|·1e-15 (the low part's rounding), so |v| up to ~1e4 stays < 1e-6. */
__device__ __forceinline__ void fsincos(float v, float *s, float *c) {
  float j = rintf(v * 0.159154943091895336f);
  float r = fmaf(-j, 6.28318548202514648f, v);
  r = fmaf(-j, -1.74845553146951305e-7f, r);
  __sincosf(r, s, c);
}

#define TWO_PI_F 6.28318530717958648f

/* e^(-u/tau)(a cos ωu + b sin ωu), iq = 1/tau, w = ω: J[0..3], value, ∂/∂u. */
__device__ __forceinline__ float dcos1(float A, float B, float iq, float w, float u, float *J,
                                       float &du) {
  float e = __expf(-u * iq), s, c;
  fsincos(w * u, &s, &c);
  float E = e * c, F = e * s, osc = A * E + B * F;
  float dosc = e * (-A * s + B * c);
  J[0] = E;
  J[1] = F;
  J[2] = osc * u * iq * iq;
  J[3] = dosc * TWO_PI_F * u;
  du = -osc * iq + dosc * w;
  return osc;
}

/* Per trial point: what the CPU's PREP computes once per pass. */
template <int M> __device__ __forceinline__ void prep(const float *p, float *q) {
  if constexpr (M == BEAM_FIT_DCOS || M == BEAM_FIT_DCOS_T0) {
    q[0] = 1.0f / p[2], q[1] = TWO_PI_F * p[3];
  } else if constexpr (M == BEAM_FIT_DCOS2) {
    q[0] = 1.0f / p[2], q[1] = TWO_PI_F * p[3], q[2] = 1.0f / p[6], q[3] = TWO_PI_F * p[7];
  } else if constexpr (M == BEAM_FIT_EXP || M == BEAM_FIT_GAUSS || M == BEAM_FIT_LORENTZ) {
    q[0] = 1.0f / p[M == BEAM_FIT_EXP ? 1 : 2];
  } else if constexpr (M == BEAM_FIT_STRETCH || M == BEAM_FIT_STRETCH_XT) {
    q[0] = logf(p[1]), q[1] = 1.0f / p[1];
  } else if constexpr (M == BEAM_FIT_EXP2) {
    q[0] = 1.0f / p[1], q[1] = 1.0f / p[3];
  }
}

/* f(x) and J: fit_cpu.c's fp32 formulas. */
template <int M>
__device__ __forceinline__ float model(const float *p, const float *q, float x, float *J) {
  if constexpr (M == BEAM_FIT_DCOS) {
    float du, v = dcos1(p[0], p[1], q[0], q[1], x, J, du);
    J[4] = 1.0f;
    return v + p[4];
  } else if constexpr (M == BEAM_FIT_DCOS_T0) {
    float t0 = p[5], u = x > t0 ? x - t0 : 0.0f, du;
    float v = dcos1(p[0], p[1], q[0], q[1], u, J, du);
    J[4] = 1.0f;
    J[5] = x > t0 ? -du : 0.0f;
    return v + p[4];
  } else if constexpr (M == BEAM_FIT_DCOS2) {
    float du, v1 = dcos1(p[0], p[1], q[0], q[1], x, J, du);
    float v2 = dcos1(p[4], p[5], q[2], q[3], x, J + 4, du);
    J[8] = 1.0f;
    return v1 + v2 + p[8];
  } else if constexpr (M == BEAM_FIT_EXP) {
    float e = __expf(-2.0f * x * q[0]);
    J[0] = e;
    J[1] = p[0] * e * 2.0f * x * q[0] * q[0];
    J[2] = 1.0f;
    return p[0] * e + p[2];
  } else if constexpr (M == BEAM_FIT_STRETCH || M == BEAM_FIT_STRETCH_XT) {
    /* z^β = exp(β(ln x - ln τ + K)); x <= 0: z^β = 0 and no β term. */
    const float KEXP = M == BEAM_FIT_STRETCH ? 2.0f : 1.0f;
    const float KLN = M == BEAM_FIT_STRETCH ? 0.0f : 0.693147180559945309f;
    int pos = x > 0.0f;
    float lz = pos ? __logf(x) - q[0] + KLN : 0.0f;
    float zb = pos ? __expf(p[2] * lz) : 0.0f;
    float e = __expf(-KEXP * zb), ae = p[0] * e * KEXP * zb;
    J[0] = e;
    J[1] = ae * p[2] * q[1];
    J[2] = -ae * lz;
    J[3] = 1.0f;
    return p[0] * e + p[3];
  } else if constexpr (M == BEAM_FIT_EXP2) {
    float e1 = __expf(-2.0f * x * q[0]), e2 = __expf(-2.0f * x * q[1]);
    J[0] = e1;
    J[1] = p[0] * e1 * 2.0f * x * q[0] * q[0];
    J[2] = e2;
    J[3] = p[2] * e2 * 2.0f * x * q[1] * q[1];
    J[4] = 1.0f;
    return p[0] * e1 + p[2] * e2 + p[4];
  } else if constexpr (M == BEAM_FIT_GAUSS) {
    float z = (x - p[1]) * q[0], g = __expf(-0.5f * z * z), ag = p[0] * g;
    J[0] = g;
    J[1] = ag * z * q[0];
    J[2] = ag * z * z * q[0];
    J[3] = 1.0f;
    J[4] = x;
    return ag + p[3] + p[4] * x;
  } else { /* LORENTZ */
    float z = (x - p[1]) * q[0], lo = 1.0f / (1.0f + z * z), a2 = 2.0f * p[0] * lo * lo;
    J[0] = lo;
    J[1] = a2 * z * q[0];
    J[2] = a2 * z * z * q[0];
    J[3] = 1.0f;
    J[4] = x;
    return p[0] * lo + p[3] + p[4] * x;
  }
}

/* One pass at pt: acc[0] χ² (or deviance), acc[1..P] Jᵀr, then packed
 * upper JᵀWJ; summed over this lane's points, then over the lanes. */
template <int M, typename TY, int NL>
__device__ void pass(const fit_args_t &a, ptrdiff_t i, unsigned lane, const double *pt,
                     double *acc) {
  constexpr int P = model_p<M>::P, NA = FIT_NACC(P);
  float pf[P], q[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < P; j++)
    pf[j] = (float)pt[j];
  prep<M>(pf, q);
#pragma unroll
  for (int j = 0; j < NA; j++)
    acc[j] = 0;
  int badf = 0;
  const int mle = a.est == BEAM_FIT_MLE;
  for (int k = (int)lane; k < a.T; k += NL) {
    float x, y, w, J[P];
    load_point<TY>(a, i, k, x, y, w);
    if (!(w > 0.0f))
      continue; /* masked: the gather zeroed its weight */
    float f = model<M>(pf, q, x, J), r = y - f, wf;
    double c2;
    if (mle) {
      badf |= !(f > 0.0f);
      float fs = f > 0.0f ? f : 1.0f, ys = y > 0.0f ? y : 1.0f;
      float dv = y > 0.0f ? 2.0f * (f - y) - 2.0f * y * __logf(fs / ys) : 2.0f * f;
      wf = 1.0f / fs;
      c2 = (double)dv;
    } else {
      wf = w;
      c2 = (double)w * (double)r * (double)r;
    }
    double wr = (double)wf * (double)r, dj[P];
    acc[0] += c2;
#pragma unroll
    for (int j = 0; j < P; j++) {
      dj[j] = (double)J[j];
      acc[1 + j] += dj[j] * wr;
    }
    int idx = 1 + P;
#pragma unroll
    for (int j = 0; j < P; j++) {
      double wj = (double)wf * dj[j];
#pragma unroll
      for (int m = j; m < P; m++)
        acc[idx++] += wj * dj[m];
    }
  }
#pragma unroll
  for (int j = 0; j < NA; j++)
    acc[j] = lanes_sum<NL>(acc[j]);
  badf = lanes_sum<NL>(badf);
  if (badf || !isfinite(acc[0]))
    acc[0] = INFINITY;
}

/* ---- LM control: fit_lm.c for a fixed P ---- */
template <int P> struct lm_t {
  double p[P], pt[P], g[P], H[FIT_NH(P)], D[P], chi2, lambda, nu;
  int iter, started;
};

/* Index of H_jk (j <= k) in the packed upper triangle. */
__host__ __device__ constexpr int hix(int P, int j, int k) {
  return j <= k ? j * P - j * (j - 1) / 2 + (k - j) : k * P - k * (k - 1) / 2 + (j - k);
}

__device__ __forceinline__ double clampd(double v, double lo, double hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

/* beam__fit_chol_solve on the full n x n A (lower triangle used). */
template <int P> __device__ int chol(double *A) {
#pragma unroll
  for (int j = 0; j < P; j++) {
    double s = A[j * P + j];
#pragma unroll
    for (int k = 0; k < j; k++)
      s -= A[j * P + k] * A[j * P + k];
    if (!(s > 1e-13 * fabs(A[j * P + j])) || !(s > 0))
      return -1;
    double r = sqrt(s);
    A[j * P + j] = r;
#pragma unroll
    for (int i = j + 1; i < P; i++) {
      double t = A[i * P + j];
#pragma unroll
      for (int k = 0; k < j; k++)
        t -= A[i * P + k] * A[j * P + k];
      A[i * P + j] = t / r;
    }
  }
  return 0;
}

template <int P> __device__ void chol_apply(const double *A, const double *b, double *x) {
#pragma unroll
  for (int i = 0; i < P; i++) {
    double t = b[i];
#pragma unroll
    for (int k = 0; k < i; k++)
      t -= A[i * P + k] * x[k];
    x[i] = t / A[i * P + i];
  }
#pragma unroll
  for (int i = P - 1; i >= 0; i--) {
    double t = x[i];
#pragma unroll
    for (int k = i + 1; k < P; k++)
      t -= A[k * P + i] * x[k];
    x[i] = t / A[i * P + i];
  }
}

#include "gpu/fit_init_cuda.cuh"

template <int P> __device__ void take(lm_t<P> &s, const double *acc) {
  s.chi2 = acc[0];
#pragma unroll
  for (int j = 0; j < P; j++)
    s.p[j] = s.pt[j], s.g[j] = acc[1 + j];
#pragma unroll
  for (int j = 0; j < FIT_NH(P); j++)
    s.H[j] = acc[1 + P + j];
#pragma unroll
  for (int j = 0; j < P; j++) {
    double h = s.H[hix(P, j, j)];
    if (h > s.D[j])
      s.D[j] = h;
  }
}

template <int P> __device__ int converged(const lm_t<P> &s, const fit_args_t &a) {
#pragma unroll
  for (int j = 0; j < P; j++)
    if (a.lo[j] != a.hi[j] && (s.p[j] == a.lo[j] || s.p[j] == a.hi[j]))
      return BEAM_FIT_BOUND;
  return BEAM_FIT_CONVERGED;
}

template <int P> __device__ int is_free(const lm_t<P> &s, const fit_args_t &a, int j) {
  if (a.lo[j] == a.hi[j])
    return 0;
  if (s.p[j] <= a.lo[j] && s.g[j] < 0)
    return 0;
  if (s.p[j] >= a.hi[j] && s.g[j] > 0)
    return 0;
  return 1;
}

template <int P> __device__ int grad_small(const lm_t<P> &s, const fit_args_t &a) {
  if (!(s.chi2 > 0))
    return 1;
#pragma unroll
  for (int j = 0; j < P; j++) {
    double h = s.H[hix(P, j, j)];
    if (is_free(s, a, j) && h > 0 && !(fabs(s.g[j]) <= a.gtol * sqrt(h * s.chi2)))
      return 0;
  }
  return 1;
}

template <int P> __device__ int step_small(const lm_t<P> &s, const fit_args_t &a, const double *dp) {
  double n2 = 0, p2 = 0;
#pragma unroll
  for (int j = 0; j < P; j++) {
    n2 += s.D[j] * dp[j] * dp[j];
    p2 += s.D[j] * s.p[j] * s.p[j];
  }
  return sqrt(n2) <= a.xtol * (sqrt(p2) + a.xtol);
}

template <int P> __device__ int propose(lm_t<P> &s, const fit_args_t &a) {
  int fr[P], n = 0;
#pragma unroll
  for (int j = 0; j < P; j++)
    n += fr[j] = is_free(s, a, j);
  if (n == 0)
    return converged(s, a);
  double A[P * P], b[P], d[P];
  for (int tries = 0;; tries++) {
#pragma unroll
    for (int j = 0; j < P; j++) {
#pragma unroll
      for (int k = 0; k < P; k++)
        A[j * P + k] = fr[j] && fr[k] ? s.H[hix(P, j, k)] : (double)(j == k);
      if (fr[j])
        A[j * P + j] += s.lambda * s.D[j];
      b[j] = fr[j] ? s.g[j] : 0.0;
    }
    if (chol<P>(A) == 0)
      break;
    if (tries == 8)
      return BEAM_FIT_SINGULAR;
    s.lambda = s.lambda > 0 ? s.lambda * s.nu : 1e-6;
    s.nu *= 2;
  }
  chol_apply<P>(A, b, d);
  int moved = 0;
#pragma unroll
  for (int j = 0; j < P; j++) {
    s.pt[j] = fr[j] ? clampd(s.p[j] + d[j], a.lo[j], a.hi[j]) : s.p[j];
    moved |= s.pt[j] != s.p[j];
  }
  return moved ? -1 : converged(s, a);
}

template <int P> __device__ int lm_next(lm_t<P> &s, const fit_args_t &a, const double *acc) {
  double chi2t = acc[0];
  if (!s.started) {
    if (!isfinite(chi2t))
      return BEAM_FIT_BAD_INPUT;
    take(s, acc);
    s.started = 1;
    s.lambda = a.lambda0;
    s.nu = 2;
    if (grad_small(s, a))
      return converged(s, a);
    return propose(s, a);
  }
  s.iter++;
  double dp[P], pred = 0;
#pragma unroll
  for (int j = 0; j < P; j++)
    dp[j] = s.pt[j] - s.p[j];
#pragma unroll
  for (int j = 0; j < P; j++) {
    double hd = 0;
#pragma unroll
    for (int k = 0; k < P; k++)
      hd += s.H[hix(P, j, k)] * dp[k];
    pred += dp[j] * (2 * s.g[j] - hd);
  }
  double actual = s.chi2 - chi2t;
  if (actual > 0) {
    double rho = pred > 0 ? actual / pred : 1, old = s.chi2, t = 2 * rho - 1;
    double f = 1 - t * t * t;
    s.lambda *= f > 1.0 / 3 ? f : 1.0 / 3;
    s.nu = 2;
    take(s, acc);
    if (actual <= a.ftol * old || step_small(s, a, dp) || grad_small(s, a))
      return converged(s, a);
  } else {
    if (step_small(s, a, dp))
      return converged(s, a);
    s.lambda *= s.nu;
    s.nu *= 2;
    if (!(s.lambda < 1e30))
      return converged(s, a);
  }
  if (s.iter >= a.max_iter)
    return BEAM_FIT_MAX_ITER;
  return propose(s, a);
}

/* beam__fit_fail: a fit that never ran. */
template <int P> __device__ void fail(const fit_args_t &a, size_t i, int st, int n_used) {
#pragma unroll
  for (int j = 0; j < P; j++) {
    a.params[i * P + j] = NAN;
    if (a.errors)
      a.errors[i * P + j] = NAN;
  }
  if (a.cov)
    for (int j = 0; j < P * P; j++)
      a.cov[i * P * P + j] = NAN;
  if (a.chi2)
    a.chi2[i] = NAN;
  if (a.chi2_red)
    a.chi2_red[i] = NAN;
  if (a.iters)
    a.iters[i] = 0;
  if (a.n_used)
    a.n_used[i] = n_used;
  a.status[i] = (uint8_t)st;
}

/* beam__fit_lm_finish: cov = H⁻¹·scale from one factorisation. */
template <int P>
__device__ void finish(const fit_args_t &a, const lm_t<P> &s, size_t i, int st, int n_used) {
  if (st == BEAM_FIT_BAD_INPUT || !s.started) {
    fail<P>(a, i, st, n_used);
    return;
  }
  int dof = n_used - P;
  double scale = a.est != BEAM_FIT_MLE && !a.abs_sigma ? s.chi2 / dof : 1;
  double A[P * P];
#pragma unroll
  for (int j = 0; j < P; j++)
#pragma unroll
    for (int k = 0; k < P; k++)
      A[j * P + k] = s.H[hix(P, j, k)];
  int sing = chol<P>(A) != 0;
  if (sing)
    st = BEAM_FIT_SINGULAR;
  /* Column k of H⁻¹ at a time: only its diagonal entry is kept unless
   * the covariance is wanted. */
#pragma unroll 1
  for (int k = 0; k < P; k++) {
    double e[P], col[P];
#pragma unroll
    for (int j = 0; j < P; j++)
      e[j] = j == k;
    if (!sing)
      chol_apply<P>(A, e, col);
#pragma unroll
    for (int j = 0; j < P; j++)
      col[j] = sing ? NAN : col[j] * scale;
    if (a.cov)
#pragma unroll
      for (int j = 0; j < P; j++)
        a.cov[(i * P + j) * P + k] = col[j];
    a.params[i * P + k] = s.p[k];
    if (a.errors) {
      double v = 0;
#pragma unroll
      for (int j = 0; j < P; j++)
        v = j == k ? col[j] : v;
      a.errors[i * P + k] = v >= 0 ? sqrt(v) : NAN;
    }
  }
  if (a.chi2)
    a.chi2[i] = s.chi2;
  if (a.chi2_red)
    a.chi2_red[i] = s.chi2 / dof;
  if (a.iters)
    a.iters[i] = s.iter;
  if (a.n_used)
    a.n_used[i] = n_used;
  a.status[i] = (uint8_t)st;
}

/* The fused kernel: fit i = global thread / NL. A fit's NL lanes are one
 * warp (or one thread), so they leave together and the shuffles see
 * every lane. */
/* V: the launch-bounds variant (beam_fit_cuda_run_t.variant): 0 lets
 * ptxas use up to 255 registers per thread (2 blocks of FT per SM at
 * that), 1 caps them at 65536 / (4 FT) = 128 for 4 resident blocks, 2 at
 * 168 for 3 (docs/fit.md "Register pressure"). The bounds come before
 * __global__ so that tests/emu/emulate.py still finds the kernel's name. */
template <int M, typename TY, int NL, int V>
__launch_bounds__(FT, V == 1 ? 4 : V == 2 ? 3 : 1) __global__ void fit_kernel(const fit_args_t a) {
  constexpr int P = model_p<M>::P, NA = FIT_NACC(P);
  size_t gt = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  size_t i = gt / NL;
  unsigned lane = (unsigned)(gt % NL);
  if (i >= a.N)
    return;
  ptrdiff_t ii = (ptrdiff_t)i;
  /* The checks of beam__fit_gather, over this lane's points. */
  int bad = 0, n = 0;
  float ymin = INFINITY, ymax = -INFINITY;
  for (int k = (int)lane; k < a.T; k += NL) {
    float x, y, w;
    load_point<TY>(a, ii, k, x, y, w);
    if (!(w >= 0.0f) || !isfinite(w))
      bad = 1;
    else if (w > 0.0f) {
      if (!isfinite(x) || !isfinite(y) || (a.est == BEAM_FIT_MLE && y < 0.0f))
        bad = 1;
      n++;
      ymin = fminf(ymin, y);
      ymax = fmaxf(ymax, y);
    }
  }
  bad = lanes_sum<NL>(bad);
  n = lanes_sum<NL>(n);
  ymin = lanes_min<NL>(ymin);
  ymax = lanes_max<NL>(ymax);
  int st = -1;
  if (bad)
    st = BEAM_FIT_BAD_INPUT;
  else if (n <= P)
    st = BEAM_FIT_TOO_FEW;
  else if (ymin == ymax)
    st = BEAM_FIT_BAD_INPUT;
  if (st >= 0) {
    if (lane == 0)
      fail<P>(a, i, st, n);
    return;
  }
  lm_t<P> s;
#pragma unroll
  for (int j = 0; j < P; j++) {
    s.p[j] = s.pt[j] = clampd(a.p0[i * P + j], a.lo[j], a.hi[j]);
    s.g[j] = s.D[j] = 0;
  }
  s.chi2 = s.lambda = s.nu = 0;
  s.iter = s.started = 0;
  double acc[NA];
  do {
    pass<M, TY, NL>(a, ii, lane, s.pt, acc);
    st = lm_next<P>(s, a, acc);
  } while (st < 0);
  if (lane == 0)
    finish<P>(a, s, i, st, n);
}


/* ---- launchers, one family per translation unit ---- */

/* What the host side reserved for the device starts of one batch. */
typedef struct start_plan_s {
  double *prep;          /* n16 x FP_N */
  size_t n16;
  double *tc, *ts;       /* shared-x table, or NULL */
  double *pw;            /* chunk x nf */
  size_t chunk;
  int nf, shared;
  double *p0;            /* N x P, device */
} start_plan_t;

/* op 0: the fit kernel of (model, u16, warp, variant) on grid x block;
 * op 1: the device starts (prep, table, chunks of starts). Returns 0, -1
 * for a model outside this family, or the CUDA error of a launch. */
typedef int (*fit_family_fn)(int op, int model, int u16, int warp, int variant, unsigned grid,
                             unsigned block, cudaStream_t st, const fit_args_t &a,
                             const start_plan_t *sp);
int beam__fit_family_dcos(int, int, int, int, int, unsigned, unsigned, cudaStream_t,
                          const fit_args_t &, const start_plan_t *);
int beam__fit_family_dcos2(int, int, int, int, int, unsigned, unsigned, cudaStream_t,
                           const fit_args_t &, const start_plan_t *);
int beam__fit_family_exp(int, int, int, int, int, unsigned, unsigned, cudaStream_t,
                         const fit_args_t &, const start_plan_t *);
int beam__fit_family_peak(int, int, int, int, int, unsigned, unsigned, cudaStream_t,
                          const fit_args_t &, const start_plan_t *);

template <int M, typename TY>
static int starts_mt(cudaStream_t st, const fit_args_t &a, const start_plan_t *sp) {
  constexpr int dc = M == BEAM_FIT_DCOS || M == BEAM_FIT_DCOS_T0 || M == BEAM_FIT_DCOS2;
  cudaError_t e;
  fit_prep_kernel<M, TY><<<(unsigned)((sp->n16 + FT - 1) / FT), FT, 0, st>>>(a, sp->prep, sp->n16);
  if ((e = cudaGetLastError()) != cudaSuccess)
    return (int)e;
  start_args_t s;
  memset(&s, 0, sizeof s);
  s.prep = sp->prep;
  s.shared = sp->shared;
  s.p0 = sp->p0;
  s.nf = sp->nf;
  if constexpr (dc) {
    if (sp->tc) {
      s.tc = sp->tc, s.ts = sp->ts;
      fit_table_kernel<M><<<(unsigned)((a.T + FT - 1) / FT), FT, 0, st>>>(a, sp->prep, sp->nf,
                                                                         sp->tc, sp->ts);
      if ((e = cudaGetLastError()) != cudaSuccess)
        return (int)e;
    }
    s.pw = sp->pw;
  }
  size_t chunk = dc ? sp->chunk : a.N;
  for (size_t i0 = 0; i0 < a.N; i0 += chunk) {
    s.i0 = i0;
    s.n = a.N - i0 < chunk ? a.N - i0 : chunk;
    fit_start_kernel<M, TY><<<(unsigned)((s.n + FT - 1) / FT), FT, 0, st>>>(a, s);
    if ((e = cudaGetLastError()) != cudaSuccess)
      return (int)e;
  }
  return 0;
}

template <int M>
static int family_m(int op, int u16, int warp, int variant, unsigned grid, unsigned block,
                    cudaStream_t st, const fit_args_t &a, const start_plan_t *sp) {
  if (op == 1)
    return u16 ? starts_mt<M, uint16_t>(st, a, sp) : starts_mt<M, float>(st, a, sp);
  switch ((u16 * 2 + warp) * NVAR + variant) {
#define CASE1(TY, U, NL, W, V)                                                             \
  case (U * 2 + W) * NVAR + V: fit_kernel<M, TY, NL, V><<<grid, block, 0, st>>>(a); break;
#define CASEV(V)                                                                           \
  CASE1(float, 0, 1, 0, V) CASE1(float, 0, 32, 1, V)                                       \
  CASE1(uint16_t, 1, 1, 0, V) CASE1(uint16_t, 1, 32, 1, V)
    CASEV(0)
    CASEV(1)
    CASEV(2)
#undef CASEV
#undef CASE1
  default:
    return -1;
  }
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : (int)e;
}

/* One model's case in a family's entry point (gpu/fit_k_*.cu). */
#define FIT_FAMILY_CASE(M)                                                                   \
  case M:                                                                                    \
    return family_m<M>(op, u16, warp, variant, grid, block, st, a, sp);
#define FIT_FAMILY_FN(name)                                                                  \
  int beam__fit_family_##name(int op, int model, int u16, int warp, int variant,             \
                              unsigned grid, unsigned block, cudaStream_t st,                \
                              const fit_args_t &a, const start_plan_t *sp)
#endif
