/* Device-side automatic starts (INIT_AUTO) for gpu/fit_cuda.cu: the guesses
 * of pipeline/kern/fit_init.c, one thread per fit, in double like the CPU.
 * Included by fit_cuda.cu only (after fit_args_t and load_y).
 *
 * fit_init.c is the specification; every step below names the CPU step it
 * mirrors, with the same grid, candidates, tie rules and selection:
 *   dcos*   periodogram on (j+1)·df, j < nf, peak below the points'
 *           Nyquist, parabola; dcos2 the highest separated peak; t0 (dcos_t0)
 *           8 + 8 candidates; decay 0 and 7 rates; exact linear solve each
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
 *   - the oscillation columns use CUDA's sincosf instead of fit_vmath.h's
 *     polynomial (both fp32, a few ulp apart);
 *   - FMA contraction and device exp/log rounding (≤ 1 ulp in double).
 * A near-tie between two periodogram bins or two rate candidates can
 * therefore pick the other one; LM then refines both to the same fit.
 *
 * Mirroring a change of fit_init.c: each model's guess is one __device__
 * function (dstart_dcos, dstart_exp, dstart_peak), written as the CPU's
 * guess_dcos / guess_exp / guess_peak for one lane. The dcos_t0 start in
 * particular is dstart_dcos (t0 candidates: the block marked "t0
 * candidates"); a per-fit quantity that is computed once before the search
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
  double tau = bg > 0 ? 1 / bg : 100 * span, p[P];
  int ok = isfinite(best);
  p[0] = ok ? bbest[0] : 1;
  p[1] = ok ? bbest[1] : 0;
  p[2] = tau;
  p[3] = fo[0];
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
