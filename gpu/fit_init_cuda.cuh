/* Device-side automatic starts (INIT_AUTO) for gpu/fit_cuda.cu: the guesses
 * of pipeline/kern/fit_init.c, one thread per fit, in double like the CPU.
 * Included by fit_cuda.cu only (after fit_args_t and load_y).
 *
 * fit_init.c is the specification; every step below names the CPU step it
 * mirrors, with the same grid, candidates, tie rules and selection:
 *   dcos*   periodogram on (j+1)·df, j < nf, peak below the points'
 *           Nyquist, parabola; dcos2 the highest separated peak; t0 (dcos_t0)
 *           8 + 8 candidates; decay 0 and 7 rates; exact linear solve each;
 *           dcos_t0 then the change-point scan and refinement (refine_t0)
 *   exp*    rate 2/τ on a factor-2 grid, parabola in log rate, exact a, d
 *   peaks   μ at the largest residual from a line, width grid, exact A, c
 *
 * Where the CPU's answer depends on a fit's neighbours, the device does the
 * same: the CPU guesses blocks of FIT_L = 16 lanes (fits 16·b .. 16·b+15),
 * and for a shared x the periodogram of every lane of a block uses the
 * frequency step and t0 of the block's first lane with data (`lref`), and
 * the exp rate grid is as long as the longest any lane of the block needs.
 * fit_prep_kernel writes each fit's own values (FP_* below); the start
 * kernels read their block's from there.
 *
 * Differences from the CPU (the starts agree to rounding, see
 * tests/gpu/test_xcheck_fit.c for the tolerance):
 *   - the periodogram's cos/sin for a shared x come from a table made once
 *     per batch with the CPU's recurrence over frequencies (re-seeded
 *     exactly every 32, in double); a fit whose block has another step or
 *     t0 than the table (masked points) and per-fit x use direct cos/sin
 *     in double (the CPU rotates there too: ≤ ~1e-14 apart);
 *   - the oscillation columns of dcos and dcos2 use CUDA's sincosf instead
 *     of fit_vmath.h's polynomial (both fp32, a few ulp apart); dcos_t0
 *     uses the polynomials (dv_expf, dv_sincosf: the CPU's bits), since
 *     its change-point refinement chooses between residuals that close;
 *   - FMA contraction and device exp/log rounding (≤ 1 ulp in double).
 * A near-tie between two periodogram bins or two rate candidates can
 * therefore pick the other one; LM then refines both to the same fit.
 *
 * Mirroring a change of fit_init.c: each model's guess is one __device__
 * function (dstart_dcos, dstart_exp, dstart_peak), written as the CPU's
 * guess_dcos / guess_exp / guess_peak for one lane. The dcos_t0 start in
 * particular is dstart_dcos (t0 candidates: the block marked "t0
 * candidates") and t0_change_point (refine_t0); a per-fit quantity that is computed once before the search
 * (like the initial t0) goes into fit_prep_kernel's FP_T0. */

#define GL FIT_L  /* lanes of the CPU's guess block */
#define FP_N 4    /* doubles per fit in the prep buffer */
#define FP_DF 0   /* dcos: own frequency step 1/(2 span of u) */
#define FP_T0 1   /* dcos_t0: own initial t0 (the periodogram's) */
#define FP_ON 2   /* 1 if the fit has weight past t0 (CPU: sw > 0) */
#define FP_NR 3   /* exp: rate candidates this fit needs (before the block max) */
#define NRATE_D 8 /* fit_init.c NRATE */
#define TPER 32   /* fit_init.c: the recurrence is re-seeded every 32 steps */

typedef struct start_args_s {
  const double *prep; /* N rounded up to GL, FP_N each */
  const double *tc, *ts; /* shared-x table [j][k] (NULL: none), made for
                            the first block's lref (table_key) */
  double *pw;           /* periodogram scratch [j][fit - i0] */
  size_t i0, n;         /* this launch's fits [i0, i0 + n) */
  int nf, shared;
  double *p0;           /* N x P */
} start_args_t;

/* Point k of fit i as beam__fit_gather leaves it (double; dead: a lane
 * with no weight, as the gather zeroes a failing fit). */
template <typename TY>
__device__ __forceinline__ void gpt(const fit_args_t &a, ptrdiff_t i, int k, int dead, double &x,
                                    double &y, double &w) {
  double xv = a.x[a.x0 + i * a.xfs + (ptrdiff_t)k * a.xps];
  double yv = (double)load_y<TY>(a, a.y0 + i * a.yfs + (ptrdiff_t)k * a.yps);
  double wv = a.w ? (double)a.w[a.w0 + i * a.wfs + (ptrdiff_t)k * a.wps] : 1;
  if (a.est == BEAM_FIT_LSE_POISSON)
    wv = isfinite(yv) ? 1 / (yv > 1 ? yv : 1) : NAN;
  int ok = wv > 0 && isfinite(xv) && isfinite(yv) && !dead;
  x = isfinite(xv) ? xv : 0;
  y = ok ? yv : 0;
  w = ok ? wv : 0;
}

/* beam__fit_gather's verdict on fit i: -1 (fits) or its status. */
template <typename TY> __device__ int gstatus(const fit_args_t &a, ptrdiff_t i, int P, int lin) {
  int bad = 0, n = 0;
  double ymin = INFINITY, ymax = -INFINITY;
  for (int k = 0; k < a.T; k++) {
    double xv = a.x[a.x0 + i * a.xfs + (ptrdiff_t)k * a.xps];
    double yv = (double)load_y<TY>(a, a.y0 + i * a.yfs + (ptrdiff_t)k * a.yps);
    double wv = a.w ? (double)a.w[a.w0 + i * a.wfs + (ptrdiff_t)k * a.wps] : 1;
    if (a.est == BEAM_FIT_LSE_POISSON)
      wv = isfinite(yv) ? 1 / (yv > 1 ? yv : 1) : NAN;
    if (!(wv >= 0) || !isfinite(wv))
      bad = 1;
    else if (wv > 0) {
      if (!isfinite(xv) || !isfinite(yv) || (a.est == BEAM_FIT_MLE && yv < 0))
        bad = 1;
      n++;
      ymin = yv < ymin ? yv : ymin;
      ymax = yv > ymax ? yv : ymax;
    }
  }
  if (bad)
    return BEAM_FIT_BAD_INPUT;
  if (n <= P)
    return BEAM_FIT_TOO_FEW;
  if (!lin && ymin == ymax)
    return BEAM_FIT_BAD_INPUT;
  return -1;
}

/* lane_range: [min, max] of v(x) over points with w > 0, (0, 1) if none. */
__device__ __forceinline__ void range_fix(double &mn, double &mx) {
  if (!(mn <= mx))
    mn = 0, mx = 1;
}

/* Per fit (i < N rounded up to GL; i >= N is a dead lane): the values its
 * block-mates may need (FP_*), as guess_dcos / guess_exp compute them for
 * their own lane before the block-wide step. */
template <int M, typename TY> __global__ void fit_prep_kernel(const fit_args_t a, double *prep, size_t n16) {
  constexpr int P = model_p<M>::P;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n16)
    return;
  ptrdiff_t ii = (ptrdiff_t)i;
  int dead = i >= a.N || gstatus<TY>(a, ii, P, 0) >= 0;
  double *o = prep + i * FP_N;
  o[0] = o[1] = o[2] = o[3] = 0;
  if constexpr (M == BEAM_FIT_DCOS || M == BEAM_FIT_DCOS_T0 || M == BEAM_FIT_DCOS2) {
    const int t0m = M == BEAM_FIT_DCOS_T0;
    double mn = INFINITY, mx = -INFINITY, x, y, w;
    if (!dead)
      for (int k = 0; k < a.T; k++) {
        gpt<TY>(a, ii, k, 0, x, y, w);
        if (w > 0)
          mn = x < mn ? x : mn, mx = x > mx ? x : mx;
      }
    range_fix(mn, mx);
    double t0 = t0m ? (isfinite(a.hi[5]) ? a.hi[5] : 0.5 * (mn + mx)) : 0, sw = 0;
    double umn = INFINITY, umx = -INFINITY;
    if (!dead)
      for (int k = 0; k < a.T; k++) {
        gpt<TY>(a, ii, k, 0, x, y, w);
        int on = !t0m || x > t0;
        double u = t0m ? (x > t0 ? x - t0 : 0) : x;
        sw += on ? w : 0;
        if (w > 0)
          umn = u < umn ? u : umn, umx = u > umx ? u : umx;
      }
    range_fix(umn, umx);
    double span = umx - umn;
    o[FP_DF] = span > 0 ? 1 / (2 * span) : 1;
    o[FP_T0] = t0;
    o[FP_ON] = sw > 0;
  } else if constexpr (M == BEAM_FIT_EXP || M == BEAM_FIT_STRETCH || M == BEAM_FIT_STRETCH_XT ||
                       M == BEAM_FIT_EXP2) {
    double mn = INFINITY, mx = -INFINITY, gmn = INFINITY, gmx = -INFINITY, x, y, w;
    if (!dead)
      for (int k = 0; k < a.T; k++) {
        gpt<TY>(a, ii, k, 0, x, y, w);
        double u = x > 0 ? x : INFINITY;
        if (w > 0) {
          mn = u < mn ? u : mn, mx = u > mx ? u : mx;
          gmn = x < gmn ? x : gmn, gmx = x > gmx ? x : gmx;
        }
      }
    range_fix(mn, mx);
    range_fix(gmn, gmx);
    double xmin = isfinite(mn) && mn > 0 ? mn : 1, xmax = gmx > xmin ? gmx : xmin;
    double g0 = 1 / (4 * xmax);
    /* (the CPU's (int) cast; a denormal x cannot reach an int overflow) */
    double lr = ceil(log2((8 / xmin) / g0));
    o[FP_NR] = lr < 1000 ? lr + 1 : 1001;
  }
}

/* The shared-x periodogram table: tc/ts[j*T + k] = cos/sin(2π(j+1)·df·u_k)
 * for the key (df, t0) of the first block's lref, by periodogram()'s
 * shared recurrence (exact every TPER frequencies). Thread per point. */
__device__ __forceinline__ void table_key(const double *prep, size_t g, double &df, double &t0) {
  int lref = 0;
  while (lref + 1 < GL && !(prep[(g + lref) * FP_N + FP_ON] > 0))
    lref++;
  df = prep[(g + lref) * FP_N + FP_DF];
  t0 = prep[(g + lref) * FP_N + FP_T0];
}

template <int M>
__global__ void fit_table_kernel(const fit_args_t a, const double *prep, int nf, double *tc,
                                 double *ts) {
  int k = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= a.T)
    return;
  double df, t0;
  table_key(prep, 0, df, t0);
  double xv = a.x[a.x0 + (ptrdiff_t)k * a.xps];
  xv = isfinite(xv) ? xv : 0;
  double t = M == BEAM_FIT_DCOS_T0 ? (xv > t0 ? xv - t0 : 0) : xv, sc = 0, ss = 0, zr = 0, zi = 0;
  for (int j = 0; j < nf; j++) {
    double f = (double)(j + 1) * df;
    if (j % TPER == 0) {
      sc = cos(2 * M_PI * f * t), ss = sin(2 * M_PI * f * t);
      zr = cos(2 * M_PI * df * t), zi = sin(2 * M_PI * df * t);
    } else {
      double c0 = sc, s0 = ss;
      sc = c0 * zr - s0 * zi;
      ss = s0 * zr + c0 * zi;
    }
    tc[(size_t)j * a.T + k] = sc;
    ts[(size_t)j * a.T + k] = ss;
  }
}

/* ---- the exact linear step (lin_acc + lin_solve) for one lane ---- */
template <int NC> struct lin_t {
  static constexpr int NH = NC * (NC + 1) / 2, NA = NH + NC + 1;
  double acc[NA];
  __device__ void zero() {
#pragma unroll
    for (int q = 0; q < NA; q++)
      acc[q] = 0;
  }
  /* lin_acc_body's sums for one point, in its order */
  __device__ __forceinline__ void add(const double *B, double y, double w) {
    int idx = 0;
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
      for (int d = c; d < NC; d++, idx++)
        acc[idx] += w * B[c] * B[d];
#pragma unroll
    for (int c = 0; c < NC; c++)
      acc[NH + c] += w * y * B[c];
    acc[NH + NC] += w * y * y;
  }
  /* lin_solve: β and the residual sum of squares (+inf if singular) */
  __device__ double solve(double *beta) const {
    double A[NC * NC], r[NC];
    int idx = 0;
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
      for (int d = c; d < NC; d++, idx++)
        A[c * NC + d] = A[d * NC + c] = acc[idx];
#pragma unroll
    for (int c = 0; c < NC; c++) {
      r[c] = acc[NH + c];
      A[c * NC + c] *= 1 + 1e-12;
    }
    double s = INFINITY;
    if (chol<NC>(A) == 0) {
      chol_apply<NC>(A, r, beta);
      s = acc[NH + NC];
#pragma unroll
      for (int c = 0; c < NC; c++)
        s -= beta[c] * acc[NH + c];
    } else
#pragma unroll
      for (int c = 0; c < NC; c++)
        beta[c] = 0;
    return isfinite(s) ? s : INFINITY;
  }
};

/* fit_init.c vertex() */
__device__ __forceinline__ double vertex_d(double a, double b, double c) {
  double den = a - 2 * b + c;
  if (!(fabs(den) > 0) || !isfinite(den))
    return 0;
  double d = 0.5 * (a - c) / den;
  return d > 0.5 ? 0.5 : d < -0.5 ? -0.5 : d;
}

/* Final clamp of beam__fit_guess: a non-finite start becomes 1. */
template <int P> __device__ __forceinline__ void put_start(const start_args_t &s, size_t i, const double *p) {
#pragma unroll
  for (int j = 0; j < P; j++)
    s.p0[i * P + j] = isfinite(p[j]) ? p[j] : 1;
}

/* fit_vmath.h's fit_expf and fit_sincosf, operation for operation with
 * round-to-nearest intrinsics (no FMA contraction): bitwise the CPU's
 * values. dcos_t0's change-point refinement compares residuals a few
 * 1e-7 apart, the size of the difference between these polynomials and
 * CUDA's expf/sincosf, so it needs the CPU's basis to make the CPU's
 * choices. */
__device__ __forceinline__ float dv_rint(float x) {
  const float m = 12582912.0f;
  return __fsub_rn(__fadd_rn(x, m), m);
}
__device__ __forceinline__ float dv_expf(float x) {
  float xc = x < 88.3762626647949f ? x : 88.3762626647949f;
  xc = xc > -87.3f ? xc : -87.3f;
  float n = dv_rint(__fmul_rn(xc, 1.44269504088896341f));
  float r = __fsub_rn(xc, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float r2 = __fmul_rn(r, r);
  float p = 1.9875691500E-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507E-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073E-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894E-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459E-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201E-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(p, r2), r), 1.0f);
  int32_t si = (int32_t)((uint32_t)((int32_t)n + 127) << 23);
  float s;
  memcpy(&s, &si, 4);
  float v = __fmul_rn(p, s);
  v = x < -87.3f ? 0.0f : v;
  return x != x ? x : v;
}
__device__ __forceinline__ void dv_sincosf(float x, float *s, float *c) {
  float j = dv_rint(__fmul_rn(x, 0.636619772367581343f));
  float r = __fsub_rn(x, __fmul_rn(j, 1.5703125f));
  r = __fsub_rn(r, __fmul_rn(j, 4.837512969970703125e-4f));
  r = __fsub_rn(r, __fmul_rn(j, 7.54978995489188216e-8f));
  float r2 = __fmul_rn(r, r);
  float sp = -1.9515295891E-4f;
  sp = __fadd_rn(__fmul_rn(sp, r2), 8.3321608736E-3f);
  sp = __fsub_rn(__fmul_rn(sp, r2), 1.6666654611E-1f);
  float sv = __fadd_rn(r, __fmul_rn(__fmul_rn(r, r2), sp));
  float cp = 2.443315711809948E-5f;
  cp = __fsub_rn(__fmul_rn(cp, r2), 1.388731625493765E-3f);
  cp = __fadd_rn(__fmul_rn(cp, r2), 4.166664568298827E-2f);
  float cv = __fadd_rn(__fsub_rn(1.0f, __fmul_rn(0.5f, r2)), __fmul_rn(__fmul_rn(r2, r2), cp));
  float jq = j < 1073741824.0f && j > -1073741824.0f ? j : 0.0f;
  int32_t q = (int32_t)jq & 3;
  float ss = (q & 1) ? cv : sv, cc = (q & 1) ? sv : cv;
  ss = (q & 2) ? -ss : ss;
  cc = ((q + 1) & 2) ? -cc : cc;
  *s = ss;
  *c = cc;
}

/* ---- dcos_t0's change-point start (fit_init.c refine_t0) for one lane ---- */

/* eval_t0: ss and (a, b, c) at (t0, f, g), basis e^(-g u)·cos 2πfu,
 * e^(-g u)·sin 2πfu, 1 at u = max(x - t0, 0) in fp32 as basis_t0_body
 * computes it (dv_expf, dv_sincosf: the same bits). */
template <typename TY>
__device__ double t0_eval(const fit_args_t &a, ptrdiff_t ii, int dead, double t0, double f,
                          double g, double *beta) {
  const float wf = (float)(2 * M_PI * f), gf = (float)-g;
  lin_t<3> L;
  L.zero();
  double x, y, w;
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    double d = x - t0, B[3];
    float u = (float)(d > 0 ? d : 0), sv, cv, ev = dv_expf(__fmul_rn(gf, u));
    dv_sincosf(__fmul_rn(wf, u), &sv, &cv);
    B[0] = (double)__fmul_rn(ev, cv);
    B[1] = (double)__fmul_rn(ev, sv);
    B[2] = 1;
    L.add(B, y, w);
  }
  return L.solve(beta);
}

/* refine1: one 3-point step of *v, which is one of t0, f, g: ss at
 * v - st, v + st (mul: v / st, v·st); v moves to the better end when an
 * end beats cur, else to the parabola vertex (mul: in log v) unless its
 * ss is not below cur. cur and bcur follow v. */
template <typename TY>
__device__ void t0_refine1(const fit_args_t &a, ptrdiff_t ii, int dead, double &t0, double &f,
                           double &g, double *v, double st, int mul, double &cur, double *bcur) {
  double v0 = *v, vm = mul ? v0 / st : v0 - st, vp = mul ? v0 * st : v0 + st, bt[3];
  *v = vm;
  double sm = t0_eval<TY>(a, ii, dead, t0, f, g, bt);
  *v = vp;
  double sp = t0_eval<TY>(a, ii, dead, t0, f, g, bt);
  if (!(cur <= sm && cur <= sp))
    *v = sm < sp ? vm : vp;
  else {
    double d = vertex_d(sm, cur, sp);
    *v = mul ? v0 * pow(st, d) : __dadd_rn(v0, d * st);
  }
  double c0 = cur, b0[3] = {bcur[0], bcur[1], bcur[2]};
  cur = t0_eval<TY>(a, ii, dead, t0, f, g, bcur);
  if (!(cur <= c0)) {
    *v = v0, cur = c0;
#pragma unroll
    for (int c = 0; c < 3; c++)
      bcur[c] = b0[c];
  }
}

#define T0_SCAN_MAX 48 /* fit_init.c */
/* refine_t0 for one lane: (f, g) at t0, the change-point scan, its two
 * deepest separated minima refined in (t0, g, f); the lower wins. df:
 * the periodogram's step (the block's lref for a shared x), cstep the
 * search's fine t0 step, [xmn, xmx] the own x range. */
template <typename TY>
__device__ void t0_change_point(const fit_args_t &a, ptrdiff_t ii, int dead, double df,
                                double cstep, double xmn, double xmx, double &f, double &g,
                                double &t0, double &best, double *bbest) {
  double cur, bcur[3], bts[3];
  if (!(g > 0))
    g = 2 * df / 8 / 4; /* no decay won: start the rate search low */
  cur = t0_eval<TY>(a, ii, dead, t0, f, g, bcur);
  for (int round = 0; round < 2; round++) {
    t0_refine1<TY>(a, ii, dead, t0, f, g, &g, round ? M_SQRT2 : 2, 1, cur, bcur);
    t0_refine1<TY>(a, ii, dead, t0, f, g, &f, df / (round ? 8 : 4), 0, cur, bcur);
  }
  /* the scan: nc equal steps over the bounds (unbounded: t0 ± 2 cstep) */
  const int fin = isfinite(a.lo[5]) && isfinite(a.hi[5]);
  double lo = fin ? a.lo[5] : t0 - 2 * cstep, hi = fin ? a.hi[5] : t0 + 2 * cstep;
  double hs = 0.5 * (xmx - xmn) / (double)(a.T > 1 ? a.T - 1 : 1);
  double ncd = ceil((hi - lo) / hs) + 1; /* the CPU's fmin(ncd, 48): NaN gives 48 */
  int nc = hs > 0 ? (int)(ncd < T0_SCAN_MAX ? ncd : T0_SCAN_MAX) : 2;
  nc = nc > 2 ? nc : 2;
  double step = (hi - lo) / (nc - 1), scan[T0_SCAN_MAX];
  for (int ct = 0; ct < nc; ct++)
    scan[ct] = t0_eval<TY>(a, ii, dead, __dadd_rn(lo, ct * step), f, g, bts);
  /* c1 the deepest, c2 the deepest local minimum >= 2 steps from it */
  int c1 = 0, c2 = -1;
  for (int ct = 1; ct < nc; ct++)
    if (scan[ct] < scan[c1])
      c1 = ct;
  for (int ct = 0; ct < nc; ct++) {
    double v = scan[ct];
    int sep = ct + 2 <= c1 || ct >= c1 + 2;
    int pk = (ct == 0 || v <= scan[ct - 1]) && (ct + 1 == nc || v <= scan[ct + 1]);
    if (sep && pk && (c2 < 0 || v < scan[c2]))
      c2 = ct;
  }
  const double f0 = f, g0 = g;
  /* (no c2: the CPU refines c1 twice, the same numbers, and keeps the first) */
  for (int cand = 0; cand < (c2 >= 0 ? 2 : 1); cand++) {
    double tt = __dadd_rn(lo, (cand ? c2 : c1) * step), fk = f0, gk = g0, sst;
    sst = t0_eval<TY>(a, ii, dead, tt, fk, gk, bts);
    for (int round = 0; round < 3; round++) {
      /* the CPU's pow(2, 1/2^r), bit for bit: sqrt is correctly rounded
       * and glibc's pow gives the same bits; CUDA's pow is not exact */
      double gst = round == 0 ? 2.0 : round == 1 ? sqrt(2.0) : sqrt(sqrt(2.0));
      t0_refine1<TY>(a, ii, dead, tt, fk, gk, &tt, step / (2 << round), 0, sst, bts);
      t0_refine1<TY>(a, ii, dead, tt, fk, gk, &gk, gst, 1, sst, bts);
      t0_refine1<TY>(a, ii, dead, tt, fk, gk, &fk, df / (4 << round), 0, sst, bts);
    }
    if (cand == 0 || sst < cur) {
      cur = sst, t0 = tt, f = fk, g = gk;
#pragma unroll
      for (int c = 0; c < 3; c++)
        bcur[c] = bts[c];
    }
  }
  if (cur < INFINITY) {
    best = cur;
#pragma unroll
    for (int c = 0; c < 3; c++)
      bbest[c] = bcur[c];
  }
}

/* guess_dcos for one lane (fit i); see fit_init.c for the why of each step. */
template <int M, typename TY>
__device__ void dstart_dcos(const fit_args_t &a, const start_args_t &s, size_t i, int dead) {
  constexpr int P = model_p<M>::P, two = M == BEAM_FIT_DCOS2, t0m = M == BEAM_FIT_DCOS_T0;
  constexpr int NC = two ? 5 : 3;
  ptrdiff_t ii = (ptrdiff_t)i;
  const double *me = s.prep + i * FP_N;
  double t0own = me[FP_T0], x, y, w;
  /* ybar, sw, non over the points past the own initial t0 */
  double ybar = 0, sw = 0;
  int non = 0;
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    int on = !t0m || x > t0own;
    ybar += on ? w * y : 0;
    sw += on ? w : 0;
    non += on && w > 0;
  }
  ybar = sw > 0 ? ybar / sw : 0;
  /* the periodogram's step and t0: the block's lref for a shared x */
  double df = me[FP_DF], t0p = t0own, kdf = 0, kt0 = 0;
  if (s.shared)
    table_key(s.prep, i - i % GL, df, t0p);
  if (s.tc)
    table_key(s.prep, 0, kdf, kt0);
  const int table = s.tc && df == kdf && (!t0m || t0p == kt0);
  const int nf = s.nf;
  double *pw = s.pw + (i - s.i0);
  for (int j = 0; j < nf; j++) {
    double re = 0, im = 0, f = (double)(j + 1) * df;
    for (int k = 0; k < a.T; k++) {
      gpt<TY>(a, ii, k, dead, x, y, w);
      int on = w > 0 && (!t0m || x > t0own);
      double yc = on ? y - ybar : 0, c, sn;
      if (table) {
        c = s.tc[(size_t)j * a.T + k], sn = s.ts[(size_t)j * a.T + k];
      } else {
        /* the lref's u (shared x) or the own u: x past t0 */
        double t = t0m ? (x > t0p ? x - t0p : 0) : x;
        sincos(2 * M_PI * f * t, &sn, &c);
      }
      re += yc * c;
      im += yc * sn;
    }
    pw[(size_t)j * s.n] = re * re + im * im;
  }
#define PW(j) pw[(size_t)(j) * s.n]
  /* peak below the Nyquist of the points used; dcos2: the highest
   * separated one */
  int nfl = non > 2 ? non - 1 : 1, j1 = 0, j2 = nf;
  nfl = nfl < nf ? nfl : nf;
  for (int j = 1; j < nfl; j++)
    if (PW(j) > PW(j1))
      j1 = j;
  if (two)
    for (int j = 0; j < nfl; j++) {
      int sep = j + 3 <= j1 || j >= j1 + 3;
      int peak = (j == 0 || PW(j) >= PW(j - 1)) && (j + 1 == nfl || PW(j) >= PW(j + 1));
      if (sep && peak && (j2 == nf || PW(j) > PW(j2)))
        j2 = j;
    }
  int jj[2] = {j1, j2 < nf ? j2 : (j1 + 4 < nf ? j1 + 4 : j1 / 2)};
  double fo[2];
#pragma unroll
  for (int q = 0; q < 2; q++) {
    int j = jj[q];
    double d = j > 0 && j + 1 < nf ? vertex_d(PW(j - 1), PW(j), PW(j + 1)) : 0;
    fo[q] = ((double)j + 1 + d) * df;
  }
#undef PW
  /* x range of the own points (the t0 search's default span) */
  double xmn = INFINITY, xmx = -INFINITY;
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    if (w > 0)
      xmn = x < xmn ? x : xmn, xmx = x > xmx ? x : xmx;
  }
  range_fix(xmn, xmx);
  /* t0 candidates (dcos_t0): 8 over the bounds if finite, else over the
   * first half of the x range, then 8 finer ones around the best */
  const int nt0 = t0m ? 8 : 1;
  const int fin = t0m && isfinite(a.lo[5]) && isfinite(a.hi[5]);
  double bbase = fin ? a.lo[5] : xmn;
  double bstep = fin ? (a.hi[5] - a.lo[5]) / (nt0 - 1 + (nt0 == 1)) : 0.5 * (xmx - xmn) / 7;
  double best = INFINITY, bg = 0, bt0 = t0own, bbest[NC], beta[NC];
#pragma unroll
  for (int c = 0; c < NC; c++)
    bbest[c] = 0;
  const double span = 1 / (2 * df);
  for (int ct = 0; ct < (t0m ? 2 * nt0 : 1); ct++) {
    if (ct == nt0)
      bbase = bt0 - bstep, bstep *= 2.0 / 7;
    double t0c = t0m ? bbase + (ct % nt0) * bstep : 0;
    /* decay: rate 0 (r = -1), then e = exp(-u/(8 span)) to the 4^r */
    for (int r = -1; r < NRATE_D - 1; r++) {
      lin_t<NC> L;
      L.zero();
      for (int k = 0; k < a.T; k++) {
        gpt<TY>(a, ii, k, dead, x, y, w);
        double u = t0m ? (x > t0c ? x - t0c : 0) : x;
        double e = exp(-u / (8 * span));
        for (int q = 1; q <= r; q++)
          e *= e * e * e;
        double ev = r < 0 ? 1 : e, B[NC];
        float sv, cv;
        /* dcos_t0: fit_vmath.h's sincos, as the CPU (its search's pick
         * seeds the change-point refinement below) */
        if constexpr (t0m)
          dv_sincosf((float)(2 * M_PI * fo[0] * u), &sv, &cv);
        else
          sincosf((float)(2 * M_PI * fo[0] * u), &sv, &cv);
        B[0] = ev * (double)cv;
        B[1] = ev * (double)sv;
        if constexpr (two) {
          sincosf((float)(2 * M_PI * fo[1] * u), &sv, &cv);
          B[2] = ev * (double)cv;
          B[3] = ev * (double)sv;
        }
        B[NC - 1] = 1;
        L.add(B, y, w);
      }
      double ss = L.solve(beta);
      if (ss < best) {
        best = ss;
        bg = r < 0 ? 0 : ldexp(2 * df / 8, 2 * r);
        bt0 = t0c;
#pragma unroll
        for (int c = 0; c < NC; c++)
          bbest[c] = beta[c];
      }
    }
  }
  double f1 = fo[0];
  if constexpr (t0m) /* refine_t0: the change point */
    t0_change_point<TY>(a, ii, dead, df, bstep, xmn, xmx, f1, bg, bt0, best, bbest);
  double tau = bg > 0 ? 1 / bg : 100 * span, p[P];
  int ok = isfinite(best);
  p[0] = ok ? bbest[0] : 1;
  p[1] = ok ? bbest[1] : 0;
  p[2] = tau;
  p[3] = f1;
  if constexpr (two) {
    p[4] = ok ? bbest[2] : 1;
    p[5] = ok ? bbest[3] : 0;
    p[6] = tau;
    p[7] = fo[1];
    p[8] = ok ? bbest[4] : ybar;
  } else {
    p[4] = ok ? bbest[2] : ybar;
    if constexpr (t0m)
      p[5] = bt0;
  }
  put_start<P>(s, i, p);
}

/* guess_exp for one lane. */
template <int M, typename TY>
__device__ void dstart_exp(const fit_args_t &a, const start_args_t &s, size_t i, int dead) {
  constexpr int P = model_p<M>::P, two = M == BEAM_FIT_EXP2, NC = two ? 3 : 2;
  ptrdiff_t ii = (ptrdiff_t)i;
  double mn = INFINITY, mx = -INFINITY, gmn = INFINITY, gmx = -INFINITY, x, y, w;
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    double u = x > 0 ? x : INFINITY;
    if (w > 0) {
      mn = u < mn ? u : mn, mx = u > mx ? u : mx;
      gmn = x < gmn ? x : gmn, gmx = x > gmx ? x : gmx;
    }
  }
  range_fix(mn, mx);
  range_fix(gmn, gmx);
  double xmin = isfinite(mn) && mn > 0 ? mn : 1, xmax = gmx > xmin ? gmx : xmin;
  double g0 = 1 / (4 * xmax);
  /* the grid is as long as the block's longest (CPU: one nr per block) */
  size_t g = i - i % GL;
  int nr = 2;
  for (int l = 0; l < GL; l++) {
    int r = (int)s.prep[(g + l) * FP_N + FP_NR];
    nr = r > nr ? r : nr;
  }
  if (nr > NRATE_D + 48)
    nr = NRATE_D + 48;
  /* ss per rate, streamed: the first minimum and its neighbours */
  int b = 0, want = 0;
  double prev = INFINITY, bv = INFINITY, bl = INFINITY, br = INFINITY, beta[NC];
  for (int r = 0; r < nr; r++) {
    lin_t<2> L;
    L.zero();
    for (int k = 0; k < a.T; k++) {
      gpt<TY>(a, ii, k, dead, x, y, w);
      double e = exp(-g0 * x), B[2];
      for (int q = 1; q <= r; q++)
        e *= e;
      B[0] = e, B[1] = 1;
      L.add(B, y, w);
    }
    double ss = L.solve(beta);
    if (want)
      br = ss, want = 0;
    if (r == 0 || ss < bv)
      b = r, bv = ss, bl = prev, want = 1;
    prev = ss;
  }
  double d = b > 0 && b + 1 < nr ? vertex_d(bl, bv, br) : 0;
  double gs = g0 * exp2(b + d);
  lin_t<NC> L;
  L.zero();
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    double B[NC];
    if constexpr (two) {
      B[0] = exp(-gs * 3 * x);
      B[1] = exp(-gs / 3 * x);
    } else
      B[0] = exp(-gs * x);
    B[NC - 1] = 1;
    L.add(B, y, w);
  }
  double ss = L.solve(beta), tau = 2 / gs, p[P];
  int ok = isfinite(ss);
  if constexpr (two) {
    p[0] = ok ? beta[0] : 1, p[1] = tau / 3, p[2] = ok ? beta[1] : 1, p[3] = 3 * tau;
    p[4] = ok ? beta[2] : 0;
  } else if constexpr (M == BEAM_FIT_EXP) {
    p[0] = ok ? beta[0] : 1, p[1] = tau, p[2] = ok ? beta[1] : 0;
  } else {
    p[0] = ok ? beta[0] : 1, p[1] = tau, p[2] = 1, p[3] = ok ? beta[1] : 0;
  }
  put_start<P>(s, i, p);
}

/* guess_peak for one lane. */
template <int M, typename TY>
__device__ void dstart_peak(const fit_args_t &a, const start_args_t &s, size_t i, int dead) {
  constexpr int P = model_p<M>::P, lor = M == BEAM_FIT_LORENTZ;
  ptrdiff_t ii = (ptrdiff_t)i;
  double mn = INFINITY, mx = -INFINITY, x, y, w, lb[2], beta[3], bbest[3] = {0, 0, 0};
  lin_t<2> L;
  L.zero();
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    if (w > 0)
      mn = x < mn ? x : mn, mx = x > mx ? x : mx;
    double B[2] = {1, x};
    L.add(B, y, w);
  }
  range_fix(mn, mx);
  L.solve(lb);
  double rmax = -1, mu = 0.5 * (mn + mx);
  for (int k = 0; k < a.T; k++) {
    gpt<TY>(a, ii, k, dead, x, y, w);
    double r = fabs(y - lb[0] - lb[1] * x);
    if (w > 0 && r > rmax)
      rmax = r, mu = x;
  }
  int nw = 2 * (int)ceil(log2((double)a.T + 1)) + 2;
  if (nw > 40)
    nw = 40;
  double best = INFINITY, bw = mx - mn;
  for (int r = 0; r < nw; r++) {
    lin_t<3> L3;
    L3.zero();
    double wd = (mx - mn + 1e-300) * 0.5 * exp2(-0.5 * r);
    for (int k = 0; k < a.T; k++) {
      gpt<TY>(a, ii, k, dead, x, y, w);
      double z = (x - mu) / wd, B[3];
      B[0] = lor ? 1 / (1 + z * z) : exp(-0.5 * z * z);
      B[1] = 1;
      B[2] = x;
      L3.add(B, y, w);
    }
    double ss = L3.solve(beta);
    if (ss < best) {
      best = ss;
      bw = (mx - mn) * 0.5 * exp2(-0.5 * r);
#pragma unroll
      for (int c = 0; c < 3; c++)
        bbest[c] = beta[c];
    }
  }
  double p[P];
  int ok = isfinite(best);
  p[0] = ok ? bbest[0] : 1;
  p[1] = mu;
  p[2] = bw > 0 ? bw : 1;
  p[3] = ok ? bbest[1] : 0;
  p[4] = ok ? bbest[2] : 0;
  put_start<P>(s, i, p);
}

/* Thread per fit of [i0, i0 + n): its start into p0. A fit the gather
 * fails is guessed as the CPU guesses it (a lane with no weight); the fit
 * kernel then reports its status without using the start. */
template <int M, typename TY> __global__ void fit_start_kernel(const fit_args_t a, const start_args_t s) {
  constexpr int P = model_p<M>::P;
  size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= s.n)
    return;
  size_t i = s.i0 + t;
  int dead = gstatus<TY>(a, (ptrdiff_t)i, P, 0) >= 0;
  if constexpr (M == BEAM_FIT_DCOS || M == BEAM_FIT_DCOS_T0 || M == BEAM_FIT_DCOS2)
    dstart_dcos<M, TY>(a, s, i, dead);
  else if constexpr (M == BEAM_FIT_GAUSS || M == BEAM_FIT_LORENTZ)
    dstart_peak<M, TY>(a, s, i, dead);
  else
    dstart_exp<M, TY>(a, s, i, dead);
}
