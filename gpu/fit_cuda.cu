/* The batched fitter's CUDA backend (beam_fit_cuda, pipeline/fit.h).
 *
 * One fused kernel per batch, templated on the model, the input type
 * (float32 or uint16 counts) and the mapping:
 *   thread per fit (NL = 1)  for short traces: every point of a pass is a
 *            load whose addresses are consecutive across the warp when the
 *            data are frame-major [point][fit], as detectors deliver them
 *   warp per fit (NL = 32)   for long traces: lane l takes points l, l+32,
 *            ...; the sums are reduced by an xor butterfly, which leaves
 *            bitwise the same sums in every lane, so all 32 lanes run the
 *            same LM control in lock-step with no broadcast and no barrier
 * Either way the fit's whole LM loop runs in registers: model and analytic
 * Jacobian per point in fp32, χ² / Jᵀr / JᵀWJ summed in double (as the CPU
 * path does; H100/H200/A100 run fp64 at half the fp32 rate), the damped
 * Cholesky solve in double. Nothing per point or per iteration goes to
 * global memory and the host waits once per batch.
 *
 * The LM control below is fit_lm.c transcribed for a fixed P (so its
 * arrays stay in registers): same tests, same order, same constants.
 * Non-free parameters are kept in the system as identity rows with a zero
 * right-hand side instead of being compacted out: the Cholesky factor of
 * the others is the same bit for bit (their off-diagonal entries are exact
 * zeros) and every index stays a compile-time constant.
 *
 * Differences from beam_fit_cpu_range (docs/fit.md, "CUDA"):
 *   transcendentals are the SFU intrinsics (__expf, __logf, and __sincosf
 *   after a two-part reduction by 2π) instead of fit_vmath.h's
 *   polynomials; masked points (w = 0) are skipped rather than computed
 *   with weight 0 (as the reference does); the warp mapping sums in a
 *   tree. Automatic starts are made on the device by fit_init.c's method
 *   (gpu/fit_init_cuda.cuh: same grids and selection, equal to rounding),
 *   or with run->host_starts by fit_init.c itself on the host (the same
 *   numbers the CPU path starts from); poly runs the CPU reference (one
 *   exact solve in double, as beam_fit_cpu_range also does). */
#include "gpu/cuda_int.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "pipeline/fit.h"
#include "pipeline/kern/fit_int.h"
}

#define FT 128 /* threads per block, both mappings (the most a launch may ask) */
#define NVAR 2 /* launch-bounds variants of fit_kernel */

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
 * that), 1 caps them at 65536 / (4 FT) = 128 for 4 resident blocks
 * (docs/fit.md "Register pressure"). The bounds come before
 * __global__ so that tests/emu/emulate.py still finds the kernel's name. */
template <int M, typename TY, int NL, int V>
__launch_bounds__(FT, V == 1 ? 4 : 1) __global__ void fit_kernel(const fit_args_t a) {
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

/* ---- host side ---- */
/* inputs, results (B_PAR..B_ST, copied back), device-start scratch */
enum { B_Y, B_X, B_W, B_P0, B_PAR, B_ERR, B_COV, B_CHI, B_CHR, B_IT, B_NU, B_ST,
       B_PREP, B_TC, B_TS, B_PW, NBUF };
#define NEV 5 /* h2d | starts | kernel | d2h */

struct beam_fit_cuda_s {
  beam_cuda_ctx_t cx;
  void *d[NBUF];
  size_t cap[NBUF];
  cudaEvent_t ev[NEV];
  void *host;     /* packing and p0 staging, grows */
  size_t host_cap;
  void *ws;       /* CPU workspace: the starts' guess, poly */
  size_t ws_cap;
};

static int grow_host(void **p, size_t *cap, size_t bytes, beam_diag_t *d) {
  if (bytes <= *cap && *p)
    return 0;
  free(*p);
  *p = malloc(bytes ? bytes : 1);
  *cap = *p ? bytes : 0;
  return *p ? 0 : BEAM_DIAG(d, BEAM_ENOMEM, "fit cuda: %zu bytes of host memory", bytes);
}

extern "C" void beam_fit_cuda_destroy(beam_fit_cuda_t *c) {
  if (!c)
    return;
  if (c->cx.stream)
    cudaSetDevice(c->cx.dev);
  for (int k = 0; k < NEV; k++)
    if (c->ev[k])
      cudaEventDestroy(c->ev[k]);
  beam__cuda_ctx_fini(&c->cx);
  for (int k = 0; k < NBUF; k++)
    beam__dbuf_free(&c->d[k], &c->cap[k]);
  free(c->host);
  free(c->ws);
  free(c);
}

/* beam__cuda_ctx_init on device dev instead of 0. */
static int create_(beam_fit_cuda_t *c, int dev, beam_diag_t *d) {
  char why[256] = "";
  int n = beam_gpu_count(why, sizeof why);
  if (n <= 0)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "fit: backend cuda needs a CUDA device: %s", why);
  if (dev < 0 || dev >= n)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: device %d of %d", dev, n);
  c->cx.dev = dev;
  BEAM_CUDA_TRY(d, cudaSetDevice(dev));
  BEAM_CUDA_TRY(d, cudaStreamCreateWithFlags(&c->cx.stream, cudaStreamNonBlocking));
  for (int k = 0; k < NEV; k++)
    BEAM_CUDA_TRY(d, cudaEventCreate(&c->ev[k]));
  return 0;
}

extern "C" int beam_fit_cuda_create_dev(beam_fit_cuda_t **out, int dev, beam_diag_t *d) {
  *out = NULL;
  beam_fit_cuda_t *c = (beam_fit_cuda_t *)calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, "fit cuda: context");
  int rc = create_(c, dev, d);
  if (rc) {
    beam_fit_cuda_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

extern "C" int beam_fit_cuda_create(beam_fit_cuda_t **out, beam_diag_t *d) {
  return beam_fit_cuda_create_dev(out, 0, d);
}

/* Element offsets of the corners of an N x T strided array: [lo, hi]. */
static void span_of(size_t N, size_t T, ptrdiff_t fs, ptrdiff_t ps, ptrdiff_t *lo, ptrdiff_t *hi) {
  ptrdiff_t a = (ptrdiff_t)(N - 1) * fs, b = (ptrdiff_t)(T - 1) * ps;
  *lo = (a < 0 ? a : 0) + (b < 0 ? b : 0);
  *hi = (a > 0 ? a : 0) + (b > 0 ? b : 0);
}

/* Uploads an N x T strided host array of es-byte elements into buffer k:
 * its span when dense (at most twice the elements: both layouts of fit.h,
 * a shared x), else packed frame-major [point][fit] on the host. Sets the
 * device offset and strides the kernel indexes with. */
static int upload(beam_fit_cuda_t *c, int k, const void *h, size_t es, size_t N, size_t T,
                  ptrdiff_t fs, ptrdiff_t ps, ptrdiff_t *o0, ptrdiff_t *ofs, ptrdiff_t *ops,
                  beam_diag_t *d) {
  ptrdiff_t lo, hi;
  span_of(N, T, fs, ps, &lo, &hi);
  size_t span = (size_t)(hi - lo + 1), dense = fs == 0 ? T : N * T;
  if (span <= 2 * dense) {
    int rc = beam__dbuf_reserve(&c->d[k], &c->cap[k], span * es, d);
    if (rc)
      return rc;
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d[k], (const char *)h + lo * (ptrdiff_t)es, span * es,
                                     cudaMemcpyHostToDevice, c->cx.stream));
    *o0 = -lo, *ofs = fs, *ops = ps;
    return 0;
  }
  int rc = grow_host(&c->host, &c->host_cap, dense * es, d);
  if (rc == 0)
    rc = beam__dbuf_reserve(&c->d[k], &c->cap[k], dense * es, d);
  if (rc)
    return rc;
  size_t nf = fs == 0 ? 1 : N;
  for (size_t t = 0; t < T; t++)
    for (size_t i = 0; i < nf; i++)
      memcpy((char *)c->host + (t * nf + i) * es,
             (const char *)h + ((ptrdiff_t)i * fs + (ptrdiff_t)t * ps) * (ptrdiff_t)es, es);
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d[k], c->host, dense * es, cudaMemcpyHostToDevice,
                                   c->cx.stream));
  /* The staging buffer is reused below: this copy must be done first. */
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
  *o0 = 0, *ofs = fs == 0 ? 0 : 1, *ops = (ptrdiff_t)nf;
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The automatic starts, as beam_fit_cpu_range computes them: blocks of
 * FIT_L lanes, dead lanes as it fills them, so both paths start from the
 * same numbers. b has float y (the caller converts counts). */
static int host_guess(beam_fit_cuda_t *c, const fit_ctx_t *cx, double *p0, beam_diag_t *d) {
  const beam_fit_batch_t *b = cx->b;
  size_t T = b->n_points, N = b->n_fits;
  int P = cx->P, L = FIT_L;
  size_t nd = T * (size_t)L, scr = beam__fit_guess_scratch(P, T, L);
  int rc = grow_host(&c->ws, &c->ws_cap, sizeof(double) * (3 * nd + scr + FIT_MAXP * L), d);
  if (rc)
    return rc;
  double *xd = (double *)c->ws, *yd = xd + nd, *wd = yd + nd, *pb = wd + nd, *sc = pb + FIT_MAXP * L;
  int shared = b->x_fit_stride == 0;
  for (size_t base = 0; base < N; base += (size_t)L) {
    int live = N - base < (size_t)L ? (int)(N - base) : L;
    for (int l = 0; l < L; l++) {
      int nu = 0;
      if (l < live)
        beam__fit_gather(cx, base + l, L, l, xd, yd, wd, &nu);
      else
        for (size_t k = 0; k < T; k++) {
          xd[k * L + l] = xd[k * L];
          yd[k * L + l] = wd[k * L + l] = 0;
        }
    }
    beam__fit_guess(cx, T, L, shared, xd, yd, wd, pb, sc);
    memcpy(p0 + base * P, pb, sizeof(double) * (size_t)(live * P));
  }
  return 0;
}

/* One launch of the batch's kernel (variant: launch bounds, see
 * fit_kernel); -1 for a model without one. */
static int launch(int model, int u16, int warp, int variant, unsigned grid, unsigned block,
                  cudaStream_t st, const fit_args_t &a) {
  switch (((model * 2 + u16) * 2 + warp) * NVAR + variant) {
#define CASE1(M, TY, U, NL, W, V)                                                          \
  case ((M * 2 + U) * 2 + W) * NVAR + V: fit_kernel<M, TY, NL, V><<<grid, block, 0, st>>>(a); return 0;
#define CASEV(M, V)                                                                        \
  CASE1(M, float, 0, 1, 0, V) CASE1(M, float, 0, 32, 1, V)                                 \
  CASE1(M, uint16_t, 1, 1, 0, V) CASE1(M, uint16_t, 1, 32, 1, V)
#define CASES(M) CASEV(M, 0) CASEV(M, 1)
    CASES(BEAM_FIT_DCOS)
    CASES(BEAM_FIT_DCOS_T0)
    CASES(BEAM_FIT_DCOS2)
    CASES(BEAM_FIT_EXP)
    CASES(BEAM_FIT_STRETCH)
    CASES(BEAM_FIT_STRETCH_XT)
    CASES(BEAM_FIT_EXP2)
    CASES(BEAM_FIT_GAUSS)
    CASES(BEAM_FIT_LORENTZ)
#undef CASES
#undef CASEV
#undef CASE1
  default:
    return -1;
  }
}

/* The device starts of one model and input type (fit_init_cuda.cuh):
 * the per-fit prep, the shared-x periodogram table (dcos*), then the
 * starts in chunks that bound the periodogram scratch. */
#define PW_BYTES ((size_t)256 << 20)
#define TAB_BYTES ((size_t)64 << 20)
template <int M, typename TY>
static int dev_starts_t(beam_fit_cuda_t *c, const fit_args_t &a, int shared, beam_diag_t *d) {
  constexpr int dc = M == BEAM_FIT_DCOS || M == BEAM_FIT_DCOS_T0 || M == BEAM_FIT_DCOS2;
  cudaStream_t st = c->cx.stream;
  size_t N = a.N, n16 = (N + GL - 1) / GL * GL, T = (size_t)a.T;
  int rc = beam__dbuf_reserve(&c->d[B_PREP], &c->cap[B_PREP], sizeof(double) * FP_N * n16, d);
  if (rc)
    return rc;
  double *prep = (double *)c->d[B_PREP];
  fit_prep_kernel<M, TY><<<(unsigned)((n16 + FT - 1) / FT), FT, 0, st>>>(a, prep, n16);
  BEAM_CUDA_LAUNCHED(d, "fit_prep_kernel");
  start_args_t s;
  memset(&s, 0, sizeof s);
  s.prep = prep;
  s.shared = shared;
  s.p0 = (double *)c->d[B_P0];
  size_t chunk = N;
  if constexpr (dc) {
    size_t nf = T > 2 ? T - 1 : 1;
    s.nf = (int)(nf > 2048 ? 2048 : nf);
    size_t tab = sizeof(double) * (size_t)s.nf * T;
    if (shared && tab <= TAB_BYTES) {
      if ((rc = beam__dbuf_reserve(&c->d[B_TC], &c->cap[B_TC], tab, d)) ||
          (rc = beam__dbuf_reserve(&c->d[B_TS], &c->cap[B_TS], tab, d)))
        return rc;
      s.tc = (const double *)c->d[B_TC], s.ts = (const double *)c->d[B_TS];
      fit_table_kernel<M><<<(unsigned)((T + FT - 1) / FT), FT, 0, st>>>(
          a, prep, s.nf, (double *)c->d[B_TC], (double *)c->d[B_TS]);
      BEAM_CUDA_LAUNCHED(d, "fit_table_kernel");
    }
    size_t per = sizeof(double) * (size_t)s.nf;
    chunk = PW_BYTES / per;
    chunk = chunk < 1 ? 1 : chunk > N ? N : chunk;
    if ((rc = beam__dbuf_reserve(&c->d[B_PW], &c->cap[B_PW], per * chunk, d)))
      return rc;
    s.pw = (double *)c->d[B_PW];
  }
  for (size_t i0 = 0; i0 < N; i0 += chunk) {
    s.i0 = i0;
    s.n = N - i0 < chunk ? N - i0 : chunk;
    fit_start_kernel<M, TY><<<(unsigned)((s.n + FT - 1) / FT), FT, 0, st>>>(a, s);
    BEAM_CUDA_LAUNCHED(d, "fit_start_kernel");
  }
  return 0;
}

static int dev_starts(beam_fit_cuda_t *c, int model, int u16, const fit_args_t &a, int shared,
                      beam_diag_t *d) {
  switch (model * 2 + u16) {
#define SCASES(M)                                                                          \
  case M * 2 + 0: return dev_starts_t<M, float>(c, a, shared, d);                          \
  case M * 2 + 1: return dev_starts_t<M, uint16_t>(c, a, shared, d);
    SCASES(BEAM_FIT_DCOS)
    SCASES(BEAM_FIT_DCOS_T0)
    SCASES(BEAM_FIT_DCOS2)
    SCASES(BEAM_FIT_EXP)
    SCASES(BEAM_FIT_STRETCH)
    SCASES(BEAM_FIT_STRETCH_XT)
    SCASES(BEAM_FIT_EXP2)
    SCASES(BEAM_FIT_GAUSS)
    SCASES(BEAM_FIT_LORENTZ)
#undef SCASES
  default:
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: no device start for model %d", model);
  }
}

/* Copies one result array back into the caller's (NULL: not wanted). */
#define BACK(k, dst, bytes)                                                                \
  do {                                                                                     \
    if (dst)                                                                               \
      BEAM_CUDA_TRY(d, cudaMemcpyAsync((dst), c->d[k], (bytes), cudaMemcpyDeviceToHost,    \
                                       c->cx.stream));                                     \
  } while (0)

/* p0_out: only the starts (beam_fit_cuda_starts), r unused. */
static int fit_(beam_fit_cuda_t *c, const beam_fit_batch_t *b, const uint16_t *y16,
                const beam_fit_opts_t *o, beam_fit_result_t *r, beam_fit_cuda_run_t *run,
                double *p0_out, beam_diag_t *d) {
  double t0 = now_s();
  beam_fit_batch_t bb = *b;
  if (y16)
    bb.y = (const float *)y16; /* only checked for non-NULL below */
  fit_ctx_t cx;
  int rc = beam__fit_ctx(&cx, &bb, o, d);
  if (rc < 0)
    return rc;
  if (!p0_out && (!r || !r->params || !r->status))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: params and status results are required");
  if (p0_out && (o->init != BEAM_FIT_INIT_AUTO || b->model == BEAM_FIT_POLY))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: starts are for INIT_AUTO and a nonlinear model");
  size_t N = b->n_fits, T = b->n_points;
  int P = cx.P, warp = run && run->mapping ? run->mapping == 2 : T > 256;
  int host_starts = run && run->host_starts, variant = run ? run->variant : 0;
  unsigned block = run && run->block ? (unsigned)run->block : FT;
  int auto_ = o->init == BEAM_FIT_INIT_AUTO, dev_auto = auto_ && !host_starts;
  if (run)
    memset(run, 0, sizeof *run);
  if (N == 0)
    return 0;
  if (T > (size_t)INT32_MAX / 2)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: n_points %zu too large", T);
  /* Counts as float for the host-side work (starts, poly): exact. */
  float *yf = NULL;
  if (y16 && (b->model == BEAM_FIT_POLY || (auto_ && host_starts))) {
    ptrdiff_t lo, hi;
    span_of(N, T, b->y_fit_stride, b->y_point_stride, &lo, &hi);
    yf = (float *)malloc(sizeof(float) * (size_t)(hi - lo + 1));
    if (!yf)
      return BEAM_DIAG(d, BEAM_ENOMEM, "fit cuda: float copy of the counts");
    for (ptrdiff_t q = lo; q <= hi; q++)
      yf[q - lo] = (float)y16[q];
    bb.y = yf - lo;
  }
  if (b->model == BEAM_FIT_POLY) {
    /* Linear: one exact solve in double on the host, as the CPU path. */
    size_t ws = beam_fit_workspace_size(&bb, o);
    rc = grow_host(&c->ws, &c->ws_cap, ws, d);
    if (rc == 0)
      rc = beam_fit_ref_range(&bb, o, 0, N, c->ws, ws, r, d);
    free(yf);
    if (run)
      run->total_s = now_s() - t0;
    return rc;
  }
  BEAM_CUDA_TRY(d, cudaSetDevice(c->cx.dev));
  fit_args_t a;
  memset(&a, 0, sizeof a);
  /* p0: the caller's, the CPU's automatic guess staged on the host
   * (host_starts), or made on the device after the uploads. */
  double tg = now_s();
  const double *p0 = b->p0;
  if (auto_ && host_starts) {
    fit_ctx_t gx = cx;
    gx.b = &bb;
    rc = grow_host(&c->host, &c->host_cap, sizeof(double) * N * (size_t)P, d);
    if (rc == 0)
      rc = host_guess(c, &gx, (double *)c->host, d);
    if (rc) {
      free(yf);
      return rc;
    }
    p0 = (const double *)c->host;
  }
  free(yf);
  if (run && !dev_auto)
    run->guess_s = now_s() - tg;
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[0], c->cx.stream));
  rc = beam__dbuf_reserve(&c->d[B_P0], &c->cap[B_P0], sizeof(double) * N * (size_t)P, d);
  if (rc)
    return rc;
  if (!dev_auto)
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d[B_P0], p0, sizeof(double) * N * (size_t)P,
                                     cudaMemcpyHostToDevice, c->cx.stream));
  /* The staging buffer (the guessed p0) is reused by the uploads. */
  if (p0 == c->host)
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
  rc = upload(c, B_Y, y16 ? (const void *)y16 : (const void *)b->y, y16 ? 2 : 4, N, T,
              b->y_fit_stride, b->y_point_stride, &a.y0, &a.yfs, &a.yps, d);
  if (rc == 0)
    rc = upload(c, B_X, b->x, 4, N, T, b->x_fit_stride, b->x_point_stride, &a.x0, &a.xfs, &a.xps,
                d);
  if (rc == 0 && b->w)
    rc = upload(c, B_W, b->w, 4, N, T, b->w_fit_stride, b->w_point_stride, &a.w0, &a.wfs, &a.wps,
                d);
  if (rc)
    return rc;
  if (p0_out) {
    for (int j = 0; j < P; j++)
      a.lo[j] = cx.lo[j], a.hi[j] = cx.hi[j];
    a.y = c->d[B_Y];
    a.x = (const float *)c->d[B_X];
    a.w = b->w ? (const float *)c->d[B_W] : NULL;
    a.N = N, a.T = (int)T, a.est = o->estimator;
    if (dev_auto && (rc = dev_starts(c, b->model, y16 != NULL, a, b->x_fit_stride == 0, d)))
      return rc;
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(p0_out, c->d[B_P0], sizeof(double) * N * (size_t)P,
                                     cudaMemcpyDeviceToHost, c->cx.stream));
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
    return 0;
  }
  size_t want[NBUF] = {0};
  want[B_PAR] = want[B_ERR] = sizeof(double) * N * (size_t)P;
  want[B_COV] = want[B_PAR] * (size_t)P;
  want[B_CHI] = want[B_CHR] = sizeof(double) * N;
  want[B_IT] = want[B_NU] = sizeof(int32_t) * N;
  want[B_ST] = N;
  const void *dst[NBUF] = {0};
  dst[B_PAR] = r->params, dst[B_ERR] = r->errors, dst[B_COV] = r->cov, dst[B_CHI] = r->chi2;
  dst[B_CHR] = r->chi2_red, dst[B_IT] = r->iters, dst[B_NU] = r->n_used, dst[B_ST] = r->status;
  for (int k = B_PAR; k <= B_ST; k++)
    if (dst[k] && (rc = beam__dbuf_reserve(&c->d[k], &c->cap[k], want[k], d)))
      return rc;
  a.y = c->d[B_Y];
  a.x = (const float *)c->d[B_X];
  a.w = b->w ? (const float *)c->d[B_W] : NULL;
  a.p0 = (const double *)c->d[B_P0];
  for (int j = 0; j < P; j++)
    a.lo[j] = cx.lo[j], a.hi[j] = cx.hi[j];
  a.N = N;
  a.T = (int)T;
  a.est = o->estimator;
  a.max_iter = o->max_iter;
  a.abs_sigma = o->absolute_sigma;
  a.ftol = o->ftol, a.xtol = o->xtol, a.gtol = o->gtol, a.lambda0 = o->lambda0;
  a.params = (double *)c->d[B_PAR];
  a.errors = r->errors ? (double *)c->d[B_ERR] : NULL;
  a.cov = r->cov ? (double *)c->d[B_COV] : NULL;
  a.chi2 = r->chi2 ? (double *)c->d[B_CHI] : NULL;
  a.chi2_red = r->chi2_red ? (double *)c->d[B_CHR] : NULL;
  a.iters = r->iters ? (int32_t *)c->d[B_IT] : NULL;
  a.n_used = r->n_used ? (int32_t *)c->d[B_NU] : NULL;
  a.status = (uint8_t *)c->d[B_ST];
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[1], c->cx.stream));
  size_t threads = N * (warp ? 32 : 1), grid = (threads + block - 1) / block;
  if (grid > 0x7fffffffu)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: %zu fits exceed one launch", N);
  if (dev_auto && (rc = dev_starts(c, b->model, y16 != NULL, a, b->x_fit_stride == 0, d)))
    return rc;
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[2], c->cx.stream));
  if (launch(b->model, y16 != NULL, warp, variant, (unsigned)grid, block, c->cx.stream, a) != 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: no kernel for model %d", (int)b->model);
  BEAM_CUDA_LAUNCHED(d, "fit_kernel");
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[3], c->cx.stream));
  BACK(B_PAR, r->params, want[B_PAR]);
  BACK(B_ERR, r->errors, want[B_ERR]);
  BACK(B_COV, r->cov, want[B_COV]);
  BACK(B_CHI, r->chi2, want[B_CHI]);
  BACK(B_CHR, r->chi2_red, want[B_CHR]);
  BACK(B_IT, r->iters, want[B_IT]);
  BACK(B_NU, r->n_used, want[B_NU]);
  BACK(B_ST, r->status, want[B_ST]);
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[4], c->cx.stream));
  BEAM_CUDA_TRY(d, cudaEventSynchronize(c->ev[4]));
  if (run) {
    float ms[NEV - 1];
    for (int k = 0; k < NEV - 1; k++)
      BEAM_CUDA_TRY(d, cudaEventElapsedTime(&ms[k], c->ev[k], c->ev[k + 1]));
    run->mapping = warp ? 2 : 1;
    run->variant = variant;
    run->block = (int)block;
    run->starts = !auto_ ? 0 : host_starts ? 1 : 2;
    run->h2d_s = 1e-3 * ms[0], run->kernel_s = 1e-3 * ms[2], run->d2h_s = 1e-3 * ms[3];
    if (dev_auto)
      run->guess_s = 1e-3 * ms[1];
    run->total_s = now_s() - t0;
  }
  return 0;
}

extern "C" int beam_fit_cuda(beam_fit_cuda_t *c, const beam_fit_batch_t *b, const uint16_t *y16,
                             const beam_fit_opts_t *o, beam_fit_result_t *r,
                             beam_fit_cuda_run_t *run, beam_diag_t *d) {
  if (!c || !b)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: NULL context or batch");
  int mapping = run ? run->mapping : 0;
  if (mapping < 0 || mapping > 2)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: mapping %d is not 0, 1 or 2", mapping);
  if (run && (run->variant < 0 || run->variant >= NVAR))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: variant %d is not 0..%d", run->variant, NVAR - 1);
  if (run && run->block && (run->block < 32 || run->block > FT || run->block % 32))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: block %d is not 32, 64, 96 or %d", run->block,
                     FT);
  int rc = fit_(c, b, y16, o, r, run, NULL, d);
  if (rc && c->cx.stream)
    cudaStreamSynchronize(c->cx.stream); /* nothing of this call stays queued */
  return rc;
}

extern "C" int beam_fit_cuda_starts(beam_fit_cuda_t *c, const beam_fit_batch_t *b,
                                    const uint16_t *y16, const beam_fit_opts_t *o, int host,
                                    double *p0, beam_diag_t *d) {
  if (!c || !b || !o || !p0)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: NULL context, batch, options or p0");
  beam_fit_cuda_run_t run;
  memset(&run, 0, sizeof run);
  run.host_starts = host;
  int rc = fit_(c, b, y16, o, NULL, &run, p0, d);
  if (rc && c->cx.stream)
    cudaStreamSynchronize(c->cx.stream);
  return rc;
}
