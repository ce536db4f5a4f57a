/* Data gathering and automatic initial guesses for the fitter, shared by
 * the reference and the SIMD path (both start every fit from the same
 * point, so they are compared on the iteration alone).
 *
 * LM refines; it does not search. Each guess therefore fixes the
 * nonlinear parameters by a coarse search and solves the linear ones
 * exactly (weighted least squares) at each candidate:
 *   dcos*      frequency: peak of the periodogram of the mean-removed trace
 *              on a grid of 1/(2·span), refined by a parabola through the
 *              peak; decay rate: the best of 0 and 7 rates 4^m/(8·span);
 *              a, b, c (and a2, b2) exact. dcos2 takes the two highest
 *              separated peaks. t0: the best of 8 candidates spread over
 *              its bounds if finite, else over the first half of x, then
 *              of 8 finer ones around it.
 *   exp*       rate 2/tau on a factor-2 grid from 1/(4·max x) to
 *              8/(min positive x), parabola in log rate; a, d exact;
 *              beta = 1 (both stretched forms equal exp there); exp2 splits
 *              tau by 3 either way and solves a1, a2, d.
 *   peaks      mu at the largest residual from a straight line; width on a
 *              factor-sqrt(2) grid; A, c0, c1 exact.
 *   poly       zeros: the exact step does the rest.
 * Lanes are innermost in every loop, so the SIMD path's 16 lanes
 * vectorise; the reference runs one lane. */
/* As fit_cpu.o is built (Makefile): no FP traps and no errno let the
 * selects in the fp32 basis loops (fit_vmath.h) vectorise. Neither
 * changes a result (no contraction, no reassociation). */
#if defined(__GNUC__) && !defined(__clang__) /* clang (make fuzz) knows no such pragma */
#pragma GCC optimize("no-trapping-math", "no-math-errno")
#endif
#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "pipeline/kern/fit_int.h"
#include "proto/clones.h"
#include "pipeline/kern/fit_vmath.h"

int beam__fit_gather(const fit_ctx_t *c, size_t i, int nl, int l, double *x, double *y,
                     double *w, int *n_used) {
  const beam_fit_batch_t *b = c->b;
  int est = c->o->estimator, bad = 0, n = 0;
  double ymin = INFINITY, ymax = -INFINITY;
  ptrdiff_t ii = (ptrdiff_t)i;
  for (size_t k = 0; k < b->n_points; k++) {
    ptrdiff_t kk = (ptrdiff_t)k;
    double xv = b->x[ii * b->x_fit_stride + kk * b->x_point_stride];
    double yv = b->y[ii * b->y_fit_stride + kk * b->y_point_stride];
    double wv = b->w ? b->w[ii * b->w_fit_stride + kk * b->w_point_stride] : 1;
    if (est == BEAM_FIT_LSE_POISSON)
      wv = isfinite(yv) ? 1 / (yv > 1 ? yv : 1) : NAN;
    if (!(wv >= 0) || !isfinite(wv))
      bad = 1;
    else if (wv > 0) {
      if (!isfinite(xv) || !isfinite(yv) || (est == BEAM_FIT_MLE && yv < 0))
        bad = 1;
      n++;
      ymin = yv < ymin ? yv : ymin;
      ymax = yv > ymax ? yv : ymax;
    }
    int ok = wv > 0 && isfinite(xv) && isfinite(yv);
    x[k * nl + l] = isfinite(xv) ? xv : 0;
    y[k * nl + l] = ok ? yv : 0;
    w[k * nl + l] = ok ? wv : 0;
  }
  *n_used = n;
  int st = -1;
  if (bad)
    st = BEAM_FIT_BAD_INPUT;
  else if (n <= c->P)
    st = BEAM_FIT_TOO_FEW;
  else if (!beam_fit_model_info(b->model)->linear && ymin == ymax)
    st = BEAM_FIT_BAD_INPUT; /* nothing fixes the nonlinear parameters */
  if (st >= 0)
    for (size_t k = 0; k < b->n_points; k++)
      y[k * nl + l] = w[k * nl + l] = 0;
  return st;
}

#define NCOL_MAX 5
#define NRATE 8 /* dcos decay rates: 0 and 1/(8 span)·4^r, r < 7 */

size_t beam__fit_guess_scratch(int P, size_t T, int nl) {
  (void)P;
  /* + 4T + 16: one lane's FFT input (2T - 2) and output (T complex),
   * 64-byte aligned inside the scratch. */
  return (13 * T + 8) * (size_t)nl + 8 * T + 64 * (size_t)nl * (NRATE + 48) + 1024 + 16;
}

/* Normal equations of y on ncol columns B[c] (lane-minor), weighted:
 * acc[(idx)*nl + l] with G packed upper, then Bᵀwy, then Σ w y². */
static inline __attribute__((always_inline)) void lin_acc_body(size_t T, int nl, int ncol,
                                                                double *const *B,
                                                                const double *y,
                                                                const double *w, double *acc) {
  int nh = ncol * (ncol + 1) / 2, na = nh + ncol + 1;
  memset(acc, 0, sizeof(double) * (size_t)(na * nl));
  for (size_t k = 0; k < T; k++) {
    const double *yk = y + k * nl, *wk = w + k * nl;
    int idx = 0;
    for (int a = 0; a < ncol; a++)
      for (int d = a; d < ncol; d++, idx++)
        for (int l = 0; l < nl; l++)
          acc[idx * nl + l] += wk[l] * B[a][k * nl + l] * B[d][k * nl + l];
    for (int a = 0; a < ncol; a++)
      for (int l = 0; l < nl; l++)
        acc[(nh + a) * nl + l] += wk[l] * yk[l] * B[a][k * nl + l];
    for (int l = 0; l < nl; l++)
      acc[(nh + ncol) * nl + l] += wk[l] * yk[l] * yk[l];
  }
}

/* The same for nl = FIT_L (the SIMD path's blocks), summed in a local
 * array: a constant trip count and no aliasing let the lane loops
 * vectorise; the per-lane order of operations, so every bit, is the
 * generic loop's. */
static inline __attribute__((always_inline)) void lin_acc_blk(size_t T, int ncol,
                                                               double *const *B,
                                                               const double *restrict y,
                                                               const double *restrict w,
                                                               double *restrict acc) {
  enum { NL = FIT_L };
  int nh = ncol * (ncol + 1) / 2;
  double a[NCOL_MAX * (NCOL_MAX + 1) / 2 + NCOL_MAX + 1][NL];
  const double *b[NCOL_MAX];
  memset(a, 0, sizeof a);
  for (int c = 0; c < ncol; c++)
    b[c] = B[c];
  for (size_t k = 0; k < T; k++) {
    const double *yk = y + k * NL, *wk = w + k * NL;
    int idx = 0;
    for (int c = 0; c < ncol; c++)
      for (int d = c; d < ncol; d++, idx++)
        for (int l = 0; l < NL; l++)
          a[idx][l] += wk[l] * b[c][k * NL + l] * b[d][k * NL + l];
    for (int c = 0; c < ncol; c++)
      for (int l = 0; l < NL; l++)
        a[nh + c][l] += wk[l] * yk[l] * b[c][k * NL + l];
    for (int l = 0; l < NL; l++)
      a[nh + ncol][l] += wk[l] * yk[l] * yk[l];
  }
  memcpy(acc, a, sizeof(double) * (size_t)((nh + ncol + 1) * NL));
}

/* The build is baseline x86-64; these loops are most of a guess's time. */
#define FIT_CLONES BEAM_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")
#define LIN_ACC_N(n)                                                                         \
  FIT_CLONES static void lin_acc##n(size_t T, int nl, double *const *B, const double *y,     \
                                    const double *w, double *acc) {                          \
    if (nl == FIT_L)                                                                         \
      lin_acc_blk(T, n, B, y, w, acc);                                                       \
    else                                                                                     \
      lin_acc_body(T, nl, n, B, y, w, acc);                                                  \
  }
LIN_ACC_N(2)
LIN_ACC_N(3)
LIN_ACC_N(5)

static void lin_acc(size_t T, int nl, int ncol, double *const *B, const double *y,
                    const double *w, double *acc) {
  if (ncol == 2)
    lin_acc2(T, nl, B, y, w, acc);
  else if (ncol == 3)
    lin_acc3(T, nl, B, y, w, acc);
  else
    lin_acc5(T, nl, B, y, w, acc);
}

/* Per lane: β from the accumulated normal equations, and the residual sum
 * of squares Σwy² - βᵀBᵀwy (+inf when singular). */
static inline __attribute__((always_inline)) void lin_solve_body(int nl, int ncol,
                                                                  const double *acc,
                                                                  double *beta, double *ss) {
  int nh = ncol * (ncol + 1) / 2;
  for (int l = 0; l < nl; l++) {
    double A[NCOL_MAX * NCOL_MAX], r[NCOL_MAX], bt[NCOL_MAX];
    int idx = 0;
    for (int a = 0; a < ncol; a++)
      for (int d = a; d < ncol; d++, idx++)
        A[a * ncol + d] = A[d * ncol + a] = acc[idx * nl + l];
    for (int a = 0; a < ncol; a++) {
      r[a] = acc[(nh + a) * nl + l];
      A[a * ncol + a] *= 1 + 1e-12; /* a dead column must not stop the search */
    }
    double s = INFINITY;
    if (beam__fit_chol_factor(ncol, A) == 0) {
      beam__fit_chol_subst(ncol, A, r, bt);
      s = acc[(nh + ncol) * nl + l];
      for (int a = 0; a < ncol; a++)
        s -= bt[a] * acc[(nh + a) * nl + l];
    } else
      for (int a = 0; a < ncol; a++)
        bt[a] = 0;
    for (int a = 0; a < ncol; a++)
      beta[l * ncol + a] = bt[a];
    ss[l] = isfinite(s) ? s : INFINITY;
  }
}
/* ncol is 2, 3 or 5: constant sizes unroll the 3x3 (...) solves. */
static void lin_solve(int nl, int ncol, const double *acc, double *beta, double *ss) {
  if (ncol == 2)
    lin_solve_body(nl, 2, acc, beta, ss);
  else if (ncol == 3)
    lin_solve_body(nl, 3, acc, beta, ss);
  else
    lin_solve_body(nl, 5, acc, beta, ss);
}

/* Parabola vertex through (−1, a), (0, b), (1, c), within [−1/2, 1/2]. */
static double vertex(double a, double b, double c) {
  double den = a - 2 * b + c;
  if (!(fabs(den) > 0) || !isfinite(den))
    return 0;
  double d = 0.5 * (a - c) / den;
  return d > 0.5 ? 0.5 : d < -0.5 ? -0.5 : d;
}

typedef struct scr_s {
  double *u, *yc, *e, *B[NCOL_MAX], *pw, *zr, *zi, *rr, *ri, *acc, *beta, *ss, *lane;
  double *sc, *ss_c, *zsr, *zsi; /* shared-x rotation */
  double *fin, *fout;            /* FFT periodogram, one lane, 64-byte aligned */
} scr_t;

static void carve(scr_t *s, double *p, size_t T, int nl) {
  size_t n = T * (size_t)nl;
  s->u = p, p += n;
  s->yc = p, p += n;
  s->e = p, p += n;
  for (int c = 0; c < NCOL_MAX; c++)
    s->B[c] = p, p += n;
  s->pw = p, p += n;
  s->zr = p, p += n;
  s->zi = p, p += n;
  s->rr = p, p += n;
  s->ri = p, p += n;
  s->sc = p, p += T;
  s->ss_c = p, p += T;
  s->zsr = p, p += T;
  s->zsi = p, p += T;
  p = (double *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
  s->fin = p, p += 2 * T;
  s->fout = p, p += 2 * T;
  s->acc = p, p += 32 * (size_t)nl;
  s->beta = p, p += 8 * (size_t)nl;
  s->lane = p, p += 16 * (size_t)nl;
  s->ss = p; /* (NRATE + 48) x nl */
}

/* Per lane: [min, max] of v over points with w > 0 (0, 1 if none). */
static inline __attribute__((always_inline)) void lane_range(size_t T, int nl, const double *v,
                                                              const double *w, double *mn,
                       double *mx) {
  for (int l = 0; l < nl; l++)
    mn[l] = INFINITY, mx[l] = -INFINITY;
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++)
      if (w[k * nl + l] > 0) {
        double a = v[k * nl + l];
        mn[l] = a < mn[l] ? a : mn[l];
        mx[l] = a > mx[l] ? a : mx[l];
      }
  for (int l = 0; l < nl; l++)
    if (!(mn[l] <= mx[l]))
      mn[l] = 0, mx[l] = 1;
}

/* Periodogram power pw[j*nl+l], j = 0..nf-1 at f = (j+1)·df[l], of yc. */
FIT_CLONES static void periodogram(size_t T, int nl, int shared, int lref, size_t nf, const double *df,
                        scr_t *s) {
  if (shared) {
    /* One rotation per point for all lanes; recomputed exactly every 32
     * frequencies so the recurrence cannot drift. */
    for (size_t j = 0; j < nf; j++) {
      double f = (double)(j + 1) * df[0];
      for (size_t k = 0; k < T; k++) {
        double t = s->u[k * nl + lref];
        if (j % 32 == 0) {
          s->sc[k] = cos(2 * M_PI * f * t), s->ss_c[k] = sin(2 * M_PI * f * t);
          s->zsr[k] = cos(2 * M_PI * df[0] * t), s->zsi[k] = sin(2 * M_PI * df[0] * t);
        } else {
          double c0 = s->sc[k], s0 = s->ss_c[k];
          s->sc[k] = c0 * s->zsr[k] - s0 * s->zsi[k];
          s->ss_c[k] = s0 * s->zsr[k] + c0 * s->zsi[k];
        }
      }
      double *re = s->lane, *im = s->lane + nl;
      for (int l = 0; l < nl; l++)
        re[l] = im[l] = 0;
      for (size_t k = 0; k < T; k++)
        for (int l = 0; l < nl; l++) {
          re[l] += s->yc[k * nl + l] * s->sc[k];
          im[l] += s->yc[k * nl + l] * s->ss_c[k];
        }
      for (int l = 0; l < nl; l++)
        s->pw[j * nl + l] = re[l] * re[l] + im[l] * im[l];
    }
    return;
  }
  for (size_t j = 0; j < nf; j++) {
    double *re = s->lane, *im = s->lane + nl;
    for (int l = 0; l < nl; l++)
      re[l] = im[l] = 0;
    for (size_t k = 0; k < T; k++)
      for (int l = 0; l < nl; l++) {
        size_t q = k * nl + l;
        double t = s->u[q];
        if (j % 32 == 0) {
          double f = (double)(j + 1) * df[l];
          s->zr[q] = cos(2 * M_PI * f * t), s->zi[q] = sin(2 * M_PI * f * t);
          s->rr[q] = cos(2 * M_PI * df[l] * t), s->ri[q] = sin(2 * M_PI * df[l] * t);
        } else {
          double c0 = s->zr[q], s0 = s->zi[q];
          s->zr[q] = c0 * s->rr[q] - s0 * s->ri[q];
          s->zi[q] = s0 * s->rr[q] + c0 * s->ri[q];
        }
        re[l] += s->yc[q] * s->zr[q];
        im[l] += s->yc[q] * s->zi[q];
      }
    for (int l = 0; l < nl; l++)
      s->pw[j * nl + l] = re[l] * re[l] + im[l] * im[l];
  }
}

/* The same periodogram by FFT, for a lane whose points are uniformly
 * spaced with both ends used: then span = (T-1)·h and f_j·t_k =
 * (j+1)·k/(2(T-1)) + a constant per j, so the powers are |Y_{j+1}|² of the
 * length-M = 2(T-1) DFT of yc zero-padded (the constant only turns the
 * phase). Equal to the direct sums to rounding; O(T log T) instead of
 * O(T²). Plans: FFTW_ESTIMATE (deterministic, no measuring), one per M,
 * made once under a mutex and kept for the process; every thread then runs
 * fftw_execute_dft_r2c on its own (workspace) arrays, which FFTW allows.
 * Each lane is one contiguous transform, so the reference (one lane) and
 * the SIMD path (16) get bitwise the same powers. */
#define FIT_FFT_PLANS 64
static struct {
  int M;
  fftw_plan p;
} fft_plans[FIT_FFT_PLANS];
static int fft_nplans;
static pthread_mutex_t fft_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fft_once = PTHREAD_ONCE_INIT;
static void fft_init_once(void) { fftw_make_planner_thread_safe(); }

/* The plan for length M (in and out only give the alignment: FFTW_ESTIMATE
 * does not touch them), or NULL. *tmp: a plan made for this call only
 * (the cache is full), to be destroyed by the caller. */
static fftw_plan fft_plan(int M, double *in, double *out, int *tmp) {
  pthread_once(&fft_once, fft_init_once);
  fftw_plan p = NULL;
  *tmp = 0;
  pthread_mutex_lock(&fft_mu);
  for (int i = 0; i < fft_nplans && !p; i++)
    if (fft_plans[i].M == M)
      p = fft_plans[i].p;
  if (!p) {
    p = fftw_plan_dft_r2c_1d(M, in, (fftw_complex *)out, FFTW_ESTIMATE);
    if (p && fft_nplans < FIT_FFT_PLANS) {
      fft_plans[fft_nplans].M = M;
      fft_plans[fft_nplans++].p = p;
    } else if (p)
      *tmp = 1;
  }
  pthread_mutex_unlock(&fft_mu);
  return p;
}

/* The smallest T for which the FFT periodogram is used (measured,
 * bench/README.md: below it the direct sums over 16 lanes are as fast). */
#define FIT_FFT_MIN_T 48

/* Per lane: 1 when its powers come from the FFT (or it has no data, whose
 * powers are 0 either way), 0 when they need the direct sums. The x grid
 * must be uniform to 4 float32 ulps of its largest |x| (x is float32 data:
 * a rounded uniform grid), and both ends used by the lane whose span set
 * the frequency step (itself, or lref for a shared x), so that this span
 * is the grid's. */
static inline __attribute__((always_inline)) void fft_lanes(size_t T, int nl, int shared,
                                                             int lref, const double *x,
                                                             const double *w, const double *sw,
                                                             int *ok) {
  double x0[FIT_L], h[FIT_L], dev[FIT_L];
  for (int l = 0; l < nl; l++) {
    x0[l] = x[l], h[l] = (x[(T - 1) * nl + l] - x[l]) / (double)(T - 1), dev[l] = 0;
  }
  /* The largest deviation from the line through the ends, per lane (no
   * early exit: the lane loop vectorises). */
  for (size_t k = 1; k + 1 < T; k++)
    for (int l = 0; l < nl; l++) {
      double d = fabs(x[k * nl + l] - (x0[l] + (double)k * h[l]));
      dev[l] = d > dev[l] ? d : dev[l];
    }
  for (int l = 0; l < nl; l++) {
    double x1 = x[(T - 1) * nl + l];
    double tol = 4 * 0x1p-24 * (fabs(x0[l]) > fabs(x1) ? fabs(x0[l]) : fabs(x1));
    int lw = shared ? lref : l;
    ok[l] = !(sw[l] > 0) || /* no data: yc = 0, power 0 by either path */
            (w[lw] > 0 && w[(T - 1) * nl + lw] > 0 && fabs(h[l]) > 0 && dev[l] <= tol);
  }
}

static int periodogram_fft(size_t T, int nl, size_t nf, const int *ok, const double *sw,
                           scr_t *s) {
  int M = (int)(2 * (T - 1)), tmp;
  fftw_plan p = fft_plan(M, s->fin, s->fout, &tmp);
  if (!p)
    return -1;
  for (int l = 0; l < nl; l++) {
    if (!ok[l])
      continue;
    if (!(sw[l] > 0)) {
      for (size_t j = 0; j < nf; j++)
        s->pw[j * nl + l] = 0;
      continue;
    }
    for (size_t k = 0; k < T; k++)
      s->fin[k] = s->yc[k * nl + l];
    for (size_t k = T; k < (size_t)M; k++)
      s->fin[k] = 0;
    fftw_execute_dft_r2c(p, s->fin, (fftw_complex *)s->fout);
    for (size_t j = 0; j < nf; j++) {
      double re = s->fout[2 * (j + 1)], im = s->fout[2 * (j + 1) + 1];
      s->pw[j * nl + l] = re * re + im * im;
    }
  }
  if (tmp) {
    pthread_mutex_lock(&fft_mu);
    fftw_destroy_plan(p);
    pthread_mutex_unlock(&fft_mu);
  }
  return 0;
}

/* cos and sin of 2πf·u per point and lane, in fp32 (fit_vmath.h): a
 * start needs no more, and libm's would be most of the guess's time. */
FIT_CLONES static void osc(size_t T, int nl, const double *u, const double *f, double *co,
                           double *si) {
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++) {
      float sv, cv;
      fit_sincosf((float)(2 * M_PI * f[l] * u[k * nl + l]), &sv, &cv);
      co[k * nl + l] = cv, si[k * nl + l] = sv;
    }
}

/* dcos_t0 at t0[l], f[l], decay rate g[l] per lane: the basis
 * e^(-g u)·cos 2πfu, e^(-g u)·sin 2πfu, 1 at u = max(x - t0, 0), in fp32
 * (fit_vmath.h) like osc. */
static inline __attribute__((always_inline)) void basis_t0_body(
    size_t T, int nl, const double *restrict x, const double *restrict t0,
    const double *restrict f, const double *restrict g, double *restrict B0,
    double *restrict B1, double *restrict B2) {
  float wf[FIT_L], gf[FIT_L], t0f[FIT_L];
  for (int l = 0; l < nl; l++)
    wf[l] = (float)(2 * M_PI * f[l]), gf[l] = (float)-g[l], t0f[l] = (float)t0[l];
  (void)t0f;
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++) {
      size_t q = k * nl + l;
      double d = x[q] - t0[l];
      float u = (float)(d > 0 ? d : 0), sv, cv, ev = fit_expf(gf[l] * u);
      fit_sincosf(wf[l] * u, &sv, &cv);
      B0[q] = ev * cv, B1[q] = ev * sv, B2[q] = 1;
    }
}
/* The SIMD path's blocks are FIT_L lanes: a constant trip count. */
FIT_CLONES static void basis_t0_l(size_t T, const double *x, const double *t0, const double *f,
                                  const double *g, double *B0, double *B1, double *B2) {
  basis_t0_body(T, FIT_L, x, t0, f, g, B0, B1, B2);
}
static void basis_t0(size_t T, int nl, const double *x, const double *t0, const double *f,
                     const double *g, double *B0, double *B1, double *B2) {
  if (nl == FIT_L)
    basis_t0_l(T, x, t0, f, g, B0, B1, B2);
  else
    basis_t0_body(T, nl, x, t0, f, g, B0, B1, B2);
}

/* Residual sum of squares ss[l] and (a, b, c) in beta[l*3..] of the
 * best linear fit at (t0, f, g) per lane. */
static void eval_t0(size_t T, int nl, const double *x, const double *y, const double *w,
                    const double *t0, const double *f, const double *g, scr_t *s, double *beta,
                    double *ss) {
  basis_t0(T, nl, x, t0, f, g, s->B[0], s->B[1], s->B[2]);
  lin_acc(T, nl, 3, s->B, y, w, s->acc);
  lin_solve(nl, 3, s->acc, beta, ss);
}

/* One 3-point step of v[l], which is one of t0, f, g (the others fixed):
 * ss at v - st, v + st (mul: v / st, v·st); then v moves to the better
 * end when an end beats cur (ss at v), else to the parabola vertex
 * (mul: in log v), unless its ss is not below cur (then v stays). cur
 * and bcur get ss and (a, b, c) at the final v. */
static void refine1(size_t T, int nl, const double *x, const double *y, const double *w,
                    const double *t0, double *f, double *g, double *v, const double *st,
                    int mul, double *cur, double *bcur, scr_t *s) {
  double vm[FIT_L], vp[FIT_L], v0[FIT_L], sm[FIT_L], sp[FIT_L], bt[FIT_L * 3];
  for (int l = 0; l < nl; l++) {
    v0[l] = v[l];
    vm[l] = mul ? v[l] / st[l] : v[l] - st[l];
    vp[l] = mul ? v[l] * st[l] : v[l] + st[l];
  }
  for (int side = 0; side < 2; side++) {
    for (int l = 0; l < nl; l++)
      v[l] = side ? vp[l] : vm[l];
    eval_t0(T, nl, x, y, w, t0, f, g, s, bt, side ? sp : sm);
  }
  for (int l = 0; l < nl; l++) {
    double lo = vm[l], hi = vp[l];
    if (!(cur[l] <= sm[l] && cur[l] <= sp[l])) /* an end is best: move there */
      v[l] = sm[l] < sp[l] ? lo : hi;
    else {
      double d = vertex(sm[l], cur[l], sp[l]);
      v[l] = mul ? v0[l] * pow(st[l], d) : v0[l] + d * st[l];
    }
  }
  double c0[FIT_L], b0[FIT_L * 3];
  memcpy(c0, cur, sizeof(double) * (size_t)nl);
  memcpy(b0, bcur, sizeof(double) * 3 * (size_t)nl);
  eval_t0(T, nl, x, y, w, t0, f, g, s, bcur, cur);
  for (int l = 0; l < nl; l++)
    if (!(cur[l] <= c0[l])) { /* a vertex that came out worse: stay */
      v[l] = v0[l], cur[l] = c0[l];
      for (int a = 0; a < 3; a++)
        bcur[l * 3 + a] = b0[l * 3 + a];
    }
}

/* dcos_t0: the change point t0 (docs/fit.md, Initial guesses).
 * Residual as a function of t0 (the other five fitted) has one shallow
 * minimum per sample interval or two near the kink, a few per cent apart,
 * and the coarse f (periodogram) and decay (factor-4 grid) of the search
 * above tilt it towards a neighbouring one, where LM then stays. So, per
 * lane, with ss(t0, f, g) the residual of the continuous two-segment model
 * (flat at a + c before t0, damped cosine after; a, b, c exact, basis in
 * fp32):
 *  1. at the search's (t0, f, g) (g = 1/tau; g = 0 replaced by df/16):
 *     two rounds of "refine g" (×/÷ 2, then √2) and "refine f" (± df/4,
 *     then df/8), each a 3-point step: the best of v - s, v, v + s, or
 *     the parabola vertex (within ±s/2) when the middle is best;
 *  2. scan: t0 on n equal steps over [lo, hi] of t0 (unbounded: the best
 *     ± 2 fine steps of the search), n = max(2, min(48, ceil(width / hs)
 *     + 1)) per lane with hs = half the mean sample spacing (x range /
 *     (T-1) / 2); ss at each, (f, g) of step 1 (lanes with a smaller n
 *     repeat their last candidate: no lane depends on its neighbours);
 *  3. candidates: c1 = the scan's minimum, c2 = the lowest local minimum
 *     (≤ both neighbours) at least 2 steps from c1 (none: c1 again);
 *  4. each candidate from (f, g) of step 1: three rounds r = 0, 1, 2 of
 *     refine t0 (± step/2^(r+1)), refine g (×/÷ 2^(1/2^r)), refine f
 *     (± df/2^(r+2)); the candidate with the lower final ss (c1 on a tie)
 *     gives t0, f, tau = 1/g and a, b, c. */
#define T0_SCAN_MAX 48
#define T0_NCAND 2  /* basins refined after the scan */
#define T0_NROUND 3 /* refinement rounds of (t0, rate, f) in each */
static void refine_t0(const fit_ctx_t *c, size_t T, int nl, const double *x, const double *y,
                      const double *w, const double *df, double *f, double *g, double *t0,
                      const double *cstep, double *best, double *bbest, scr_t *s) {
  double st[FIT_L], cur[FIT_L], bcur[FIT_L * 3], mn[FIT_L], mx[FIT_L], lo[FIT_L], step[FIT_L];
  double tt[FIT_L], bts[FIT_L * 3], sst[FIT_L];
  lane_range(T, nl, x, w, mn, mx);
  for (int l = 0; l < nl; l++)
    if (!(g[l] > 0))
      g[l] = 2 * df[l] / 8 / 4; /* no decay won: start the rate search low */
  eval_t0(T, nl, x, y, w, t0, f, g, s, bcur, cur);
  for (int round = 0; round < 2; round++) {
    for (int l = 0; l < nl; l++)
      st[l] = round ? M_SQRT2 : 2;
    refine1(T, nl, x, y, w, t0, f, g, g, st, 1, cur, bcur, s);
    for (int l = 0; l < nl; l++)
      st[l] = df[l] / (round ? 8 : 4);
    refine1(T, nl, x, y, w, t0, f, g, f, st, 0, cur, bcur, s);
  }
  /* The change-point scan at that (f, rate); the residual of every
   * candidate is kept (scan[ct*nl + l]) to find its two deepest minima. */
  /* Each lane its own count nc[l] (a lane's start must not depend on
   * its neighbours); lanes with fewer repeat their last candidate. */
  int fin = isfinite(c->lo[5]) && isfinite(c->hi[5]), n = 2, nc[FIT_L];
  for (int l = 0; l < nl; l++) {
    double a = fin ? c->lo[5] : t0[l] - 2 * cstep[l];
    double b = fin ? c->hi[5] : t0[l] + 2 * cstep[l];
    double hs = 0.5 * (mx[l] - mn[l]) / (double)(T > 1 ? T - 1 : 1);
    nc[l] = hs > 0 ? (int)fmin(ceil((b - a) / hs) + 1, T0_SCAN_MAX) : 2;
    nc[l] = nc[l] > 2 ? nc[l] : 2;
    n = nc[l] > n ? nc[l] : n;
    lo[l] = a, step[l] = (b - a) / (nc[l] - 1);
  }
  double *scan = s->ss; /* (NRATE + 48) x nl >= T0_SCAN_MAX x nl */
  for (int ct = 0; ct < n; ct++) {
    for (int l = 0; l < nl; l++)
      tt[l] = lo[l] + (ct < nc[l] ? ct : nc[l] - 1) * step[l];
    eval_t0(T, nl, x, y, w, tt, f, g, s, bts, sst);
    for (int l = 0; l < nl; l++)
      scan[ct * nl + l] = sst[l];
  }
  /* Per lane: the deepest local minimum of the scan, and the deepest one
   * at least 3 candidates away from it; each is refined in (rate, f) and
   * the lower residual wins (its basin's own f and rate can reverse the
   * order the scan saw). */
  int c1[FIT_L], c2[FIT_L];
  for (int l = 0; l < nl; l++) {
    int nl_ = nc[l];
    c1[l] = 0, c2[l] = -1;
    for (int ct = 1; ct < nl_; ct++)
      if (scan[ct * nl + l] < scan[c1[l] * nl + l])
        c1[l] = ct;
    for (int ct = 0; ct < nl_; ct++) {
      double v = scan[ct * nl + l];
      int sep = ct + 2 <= c1[l] || ct >= c1[l] + 2;
      int pk = (ct == 0 || v <= scan[(ct - 1) * nl + l]) &&
               (ct + 1 == nl_ || v <= scan[(ct + 1) * nl + l]);
      if (sep && pk && (c2[l] < 0 || v < scan[c2[l] * nl + l]))
        c2[l] = ct;
    }
  }
  double fk[FIT_L], gk[FIT_L], f0[FIT_L], g0[FIT_L];
  for (int l = 0; l < nl; l++)
    f0[l] = f[l], g0[l] = g[l];
  for (int cand = 0; cand < T0_NCAND; cand++) {
    for (int l = 0; l < nl; l++) {
      int ct = cand ? (c2[l] >= 0 ? c2[l] : c1[l]) : c1[l];
      tt[l] = lo[l] + ct * step[l];
      fk[l] = f0[l], gk[l] = g0[l];
    }
    eval_t0(T, nl, x, y, w, tt, fk, gk, s, bts, sst);
    for (int round = 0; round < T0_NROUND; round++) {
      double tv[FIT_L];
      for (int l = 0; l < nl; l++)
        st[l] = step[l] / (2 << round), tv[l] = tt[l];
      refine1(T, nl, x, y, w, tv, fk, gk, tv, st, 0, sst, bts, s);
      for (int l = 0; l < nl; l++)
        tt[l] = tv[l];
      for (int l = 0; l < nl; l++)
        st[l] = pow(2, 1.0 / (1 << round));
      refine1(T, nl, x, y, w, tt, fk, gk, gk, st, 1, sst, bts, s);
      for (int l = 0; l < nl; l++)
        st[l] = df[l] / (4 << round);
      refine1(T, nl, x, y, w, tt, fk, gk, fk, st, 0, sst, bts, s);
    }
    for (int l = 0; l < nl; l++)
      if (cand == 0 || sst[l] < cur[l]) {
        cur[l] = sst[l], t0[l] = tt[l], f[l] = fk[l], g[l] = gk[l];
        for (int a = 0; a < 3; a++)
          bcur[l * 3 + a] = bts[l * 3 + a];
      }
  }
  for (int l = 0; l < nl; l++)
    if (cur[l] < INFINITY) {
      best[l] = cur[l];
      for (int a = 0; a < 3; a++)
        bbest[l * 3 + a] = bcur[l * 3 + a];
    }
}

static inline __attribute__((always_inline)) void guess_dcos_body(
    const fit_ctx_t *c, size_t T, int nl, int shared, const double *x,
                       const double *y, const double *w, double *p0, scr_t *s) {
  int m = c->b->model, P = c->P, two = m == BEAM_FIT_DCOS2, t0m = m == BEAM_FIT_DCOS_T0;
  double *mn = s->lane + 2 * nl, *mx = s->lane + 3 * nl, *df = s->lane + 4 * nl;
  double *f1 = s->lane + 5 * nl, *f2 = s->lane + 6 * nl, *t0 = s->lane + 7 * nl;
  double *ybar = s->lane + 8 * nl, *sw = s->lane + 9 * nl;
  double *best = s->lane + 10 * nl, *bg = s->lane + 11 * nl, *non = s->lane + 15 * nl;
  lane_range(T, nl, x, w, mn, mx);
  for (int l = 0; l < nl; l++) {
    /* The periodogram of dcos_t0 sees only what is surely past t0: a
     * flat stretch would put its step at the lowest frequency. */
    t0[l] = t0m ? (isfinite(c->hi[5]) ? c->hi[5] : 0.5 * (mn[l] + mx[l])) : 0;
    ybar[l] = sw[l] = non[l] = 0;
  }
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++) {
      size_t q = k * nl + l;
      int on = !t0m || x[q] > t0[l];
      s->u[q] = t0m ? (x[q] > t0[l] ? x[q] - t0[l] : 0) : x[q];
      ybar[l] += on ? w[q] * y[q] : 0;
      sw[l] += on ? w[q] : 0;
      non[l] += on && w[q] > 0;
    }
  for (int l = 0; l < nl; l++)
    ybar[l] = sw[l] > 0 ? ybar[l] / sw[l] : 0;
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++) {
      size_t q = k * nl + l;
      /* Points before t0 carry no oscillation. */
      int on = w[q] > 0 && (!t0m || x[q] > t0[l]);
      s->yc[q] = on ? y[q] - ybar[l] : 0;
    }
  lane_range(T, nl, s->u, w, mn, mx);
  /* A shared x is read from a lane with data (a dead lane has none). */
  int lref = 0;
  while (lref + 1 < nl && !(sw[lref] > 0))
    lref++;
  size_t nf = T > 2 ? T - 1 : 1;
  if (nf > 2048)
    nf = 2048;
  for (int l = 0; l < nl; l++) {
    double span = mx[l] - mn[l];
    df[l] = span > 0 ? 1 / (2 * span) : 1;
  }
  if (shared)
    for (int l = 0; l < nl; l++)
      df[l] = df[lref];
  /* FFT where the grid allows it (not dcos_t0: its span starts at t0,
   * off the grid), the direct sums for every other lane. */
  int fok[FIT_L], ndir = 0;
  if (!t0m && !c->guess_direct && T >= FIT_FFT_MIN_T)
    fft_lanes(T, nl, shared, lref, x, w, sw, fok);
  else
    for (int l = 0; l < nl; l++)
      fok[l] = 0;
  for (int l = 0; l < nl; l++)
    ndir += !fok[l];
  if (ndir > 0)
    periodogram(T, nl, shared, lref, nf, df, s);
  /* A plan that cannot be made (never seen) leaves the direct sums. */
  if (ndir < nl && periodogram_fft(T, nl, nf, fok, sw, s) < 0 && ndir == 0)
    periodogram(T, nl, shared, lref, nf, df, s);
  for (int l = 0; l < nl; l++) {
    /* Up to the Nyquist frequency of the points used, (n-1)/(2 span):
     * above it a uniform grid repeats the spectrum. */
    size_t nfl = non[l] > 2 ? (size_t)non[l] - 1 : 1, j1 = 0, j2 = nf;
    nfl = nfl < nf ? nfl : nf;
    for (size_t j = 1; j < nfl; j++)
      if (s->pw[j * nl + l] > s->pw[j1 * nl + l])
        j1 = j;
    if (two)
      for (size_t j = 0; j < nfl; j++) {
        int sep = j + 3 <= j1 || j >= j1 + 3;
        int peak = (j == 0 || s->pw[j * nl + l] >= s->pw[(j - 1) * nl + l]) &&
                   (j + 1 == nfl || s->pw[j * nl + l] >= s->pw[(j + 1) * nl + l]);
        if (sep && peak && (j2 == nf || s->pw[j * nl + l] > s->pw[j2 * nl + l]))
          j2 = j;
      }
    size_t jj[2] = {j1, j2 < nf ? j2 : (j1 + 4 < nf ? j1 + 4 : j1 / 2)};
    double *fo[2] = {f1, f2};
    for (int q = 0; q < 2; q++) {
      size_t j = jj[q];
      double d = j > 0 && j + 1 < nf
                     ? vertex(s->pw[(j - 1) * nl + l], s->pw[j * nl + l], s->pw[(j + 1) * nl + l])
                     : 0;
      fo[q][l] = ((double)j + 1 + d) * df[l];
    }
  }
  /* Decay: rates 0 and g0·4^r (r = 0..NRATE-2), e = exp(-rate·u) by
   * repeated squaring, one exp per point. */
  int ncol = two ? 5 : 3;
  double *bbase = s->lane + 12 * nl, *bstep = s->lane + 13 * nl, *bt0 = s->lane + 14 * nl;
  double *bb = s->beta + 0;             /* nl x ncol */
  double bbest[FIT_L * NCOL_MAX] = {0}; /* nl <= FIT_L */
  /* t0 (auto): the trace only says where it stops being flat through the
   * fit itself, so 8 candidates over the bounds (or the first half of
   * the x range), then 8 around the best, each get the decay search;
   * the frequency does not depend on t0 (a shift only turns the phase). */
  int nt0 = t0m ? 8 : 1;
  lane_range(T, nl, x, w, bbase, bstep);
  for (int l = 0; l < nl; l++) {
    int fin = t0m && isfinite(c->lo[5]) && isfinite(c->hi[5]);
    double span = bstep[l] - bbase[l];
    bbase[l] = fin ? c->lo[5] : bbase[l];
    bstep[l] = fin ? (c->hi[5] - c->lo[5]) / (nt0 - 1 + (nt0 == 1)) : 0.5 * span / 7;
    best[l] = INFINITY, bg[l] = 0, bt0[l] = t0[l];
  }
  for (int ct = 0; ct < (t0m ? 2 * nt0 : 1); ct++) {
    if (ct == nt0) /* second level: 8 finer candidates around the best */
      for (int l = 0; l < nl; l++) {
        bbase[l] = bt0[l] - bstep[l];
        bstep[l] *= 2.0 / 7;
      }
    if (t0m)
      for (size_t k = 0; k < T; k++)
        for (int l = 0; l < nl; l++) {
          size_t q = k * nl + l;
          t0[l] = bbase[l] + (ct % nt0) * bstep[l];
          s->u[q] = x[q] > t0[l] ? x[q] - t0[l] : 0;
        }
    for (size_t k = 0; k < T; k++)
      for (int l = 0; l < nl; l++) {
        size_t q = k * nl + l;
        double span = 1 / (2 * df[l]);
        s->e[q] = exp(-s->u[q] / (8 * span));
      }
    /* The oscillations do not depend on the rate: once per point. */
    osc(T, nl, s->u, f1, s->zr, s->zi);
    if (two)
      osc(T, nl, s->u, f2, s->rr, s->ri);
    for (int r = -1; r < NRATE - 1; r++) {
      for (size_t k = 0; k < T; k++)
        for (int l = 0; l < nl; l++) {
          size_t q = k * nl + l;
          if (r > 0)
            s->e[q] *= s->e[q] * s->e[q] * s->e[q];
          double ev = r < 0 ? 1 : s->e[q];
          s->B[0][q] = ev * s->zr[q];
          s->B[1][q] = ev * s->zi[q];
          if (two) {
            s->B[2][q] = ev * s->rr[q];
            s->B[3][q] = ev * s->ri[q];
          }
          s->B[ncol - 1][q] = 1;
        }
      lin_acc(T, nl, ncol, s->B, y, w, s->acc);
      lin_solve(nl, ncol, s->acc, bb, s->ss);
      for (int l = 0; l < nl; l++)
        if (s->ss[l] < best[l]) {
          best[l] = s->ss[l];
          bg[l] = r < 0 ? 0 : ldexp(2 * df[l] / 8, 2 * r);
          bt0[l] = t0[l];
          for (int a = 0; a < ncol; a++)
            bbest[l * ncol + a] = bb[l * ncol + a];
        }
    }
  }
  for (int l = 0; l < nl; l++)
    t0[l] = bt0[l];
  if (t0m)
    refine_t0(c, T, nl, x, y, w, df, f1, bg, t0, bstep, best, bbest, s);
  for (int l = 0; l < nl; l++) {
    double span = 1 / (2 * df[l]), tau = bg[l] > 0 ? 1 / bg[l] : 100 * span;
    double *p = p0 + l * P, *bl = bbest + l * ncol;
    int ok = isfinite(best[l]);
    p[0] = ok ? bl[0] : 1;
    p[1] = ok ? bl[1] : 0;
    p[2] = tau;
    p[3] = f1[l];
    if (two) {
      p[4] = ok ? bl[2] : 1;
      p[5] = ok ? bl[3] : 0;
      p[6] = tau;
      p[7] = f2[l];
      p[8] = ok ? bl[4] : ybar[l];
    } else
      p[4] = ok ? bl[2] : ybar[l];
    if (t0m)
      p[5] = t0[l];
  }
}

/* A block of the SIMD path (nl = FIT_L, a constant) with its loops
 * compiled for the CPU's ISA (no FP contraction in this file, so every
 * clone computes the same bits), and any other nl (the reference: 1). */
FIT_CLONES static void guess_dcos_l(const fit_ctx_t *c, size_t T, int shared, const double *x,
                                    const double *y, const double *w, double *p0, scr_t *s) {
  guess_dcos_body(c, T, FIT_L, shared, x, y, w, p0, s);
}
static void guess_dcos(const fit_ctx_t *c, size_t T, int nl, int shared, const double *x,
                       const double *y, const double *w, double *p0, scr_t *s) {
  if (nl == FIT_L)
    guess_dcos_l(c, T, shared, x, y, w, p0, s);
  else
    guess_dcos_body(c, T, nl, shared, x, y, w, p0, s);
}

static void guess_exp(const fit_ctx_t *c, size_t T, int nl, const double *x, const double *y,
                      const double *w, double *p0, scr_t *s) {
  int m = c->b->model, P = c->P;
  double *mn = s->lane + 2 * nl, *mx = s->lane + 3 * nl, *g0 = s->lane + 4 * nl;
  double *best = s->lane + 5 * nl, *bi = s->lane + 6 * nl, *gs = s->lane + 7 * nl;
  /* smallest positive x per lane */
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++)
      s->u[k * nl + l] = x[k * nl + l] > 0 ? x[k * nl + l] : INFINITY;
  lane_range(T, nl, s->u, w, mn, mx);
  lane_range(T, nl, x, w, g0, mx);
  int nr = 2;
  for (int l = 0; l < nl; l++) {
    double xmin = isfinite(mn[l]) && mn[l] > 0 ? mn[l] : 1, xmax = mx[l] > xmin ? mx[l] : xmin;
    g0[l] = 1 / (4 * xmax);
    int r = (int)ceil(log2((8 / xmin) / g0[l])) + 1;
    nr = r > nr ? r : nr;
  }
  if (nr > NRATE + 48)
    nr = NRATE + 48;
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++)
      s->e[k * nl + l] = exp(-g0[l] * x[k * nl + l]);
  for (int r = 0; r < nr; r++) {
    for (size_t k = 0; k < T; k++)
      for (int l = 0; l < nl; l++) {
        size_t q = k * nl + l;
        if (r > 0)
          s->e[q] *= s->e[q];
        s->B[0][q] = s->e[q];
        s->B[1][q] = 1;
      }
    lin_acc(T, nl, 2, s->B, y, w, s->acc);
    lin_solve(nl, 2, s->acc, s->beta, s->ss + r * nl);
  }
  for (int l = 0; l < nl; l++) {
    int b = 0;
    for (int r = 1; r < nr; r++)
      if (s->ss[r * nl + l] < s->ss[b * nl + l])
        b = r;
    double d = b > 0 && b + 1 < nr
                   ? vertex(s->ss[(b - 1) * nl + l], s->ss[b * nl + l], s->ss[(b + 1) * nl + l])
                   : 0;
    best[l] = b, bi[l] = d;
    gs[l] = g0[l] * exp2(b + d);
  }
  /* Exact linear parameters at the refined rate(s). */
  int two = m == BEAM_FIT_EXP2, ncol = two ? 3 : 2;
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++) {
      size_t q = k * nl + l;
      if (two) {
        s->B[0][q] = exp(-gs[l] * 3 * x[q]);
        s->B[1][q] = exp(-gs[l] / 3 * x[q]);
      } else
        s->B[0][q] = exp(-gs[l] * x[q]);
      s->B[ncol - 1][q] = 1;
    }
  lin_acc(T, nl, ncol, s->B, y, w, s->acc);
  lin_solve(nl, ncol, s->acc, s->beta, s->ss);
  for (int l = 0; l < nl; l++) {
    double *p = p0 + l * P, *bl = s->beta + l * ncol, tau = 2 / gs[l];
    int ok = isfinite(s->ss[l]);
    if (two) {
      p[0] = ok ? bl[0] : 1, p[1] = tau / 3, p[2] = ok ? bl[1] : 1, p[3] = 3 * tau;
      p[4] = ok ? bl[2] : 0;
    } else if (m == BEAM_FIT_EXP) {
      p[0] = ok ? bl[0] : 1, p[1] = tau, p[2] = ok ? bl[1] : 0;
    } else {
      p[0] = ok ? bl[0] : 1, p[1] = tau, p[2] = 1, p[3] = ok ? bl[1] : 0;
    }
  }
}

static void guess_peak(const fit_ctx_t *c, size_t T, int nl, const double *x, const double *y,
                       const double *w, double *p0, scr_t *s) {
  int lor = c->b->model == BEAM_FIT_LORENTZ, P = c->P;
  double *mn = s->lane + 2 * nl, *mx = s->lane + 3 * nl, *mu = s->lane + 4 * nl;
  double *rmax = s->lane + 5 * nl, *best = s->lane + 6 * nl, *bw = s->lane + 7 * nl;
  double *bbest = s->lane + 8 * nl; /* 3 x nl */
  lane_range(T, nl, x, w, mn, mx);
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++)
      s->B[0][k * nl + l] = 1, s->B[1][k * nl + l] = x[k * nl + l];
  lin_acc(T, nl, 2, s->B, y, w, s->acc);
  lin_solve(nl, 2, s->acc, s->beta, s->ss);
  for (int l = 0; l < nl; l++)
    rmax[l] = -1, mu[l] = 0.5 * (mn[l] + mx[l]);
  for (size_t k = 0; k < T; k++)
    for (int l = 0; l < nl; l++) {
      size_t q = k * nl + l;
      double r = fabs(y[q] - s->beta[l * 2] - s->beta[l * 2 + 1] * x[q]);
      if (w[q] > 0 && r > rmax[l])
        rmax[l] = r, mu[l] = x[q];
    }
  int nw = 2 * (int)ceil(log2((double)T + 1)) + 2;
  if (nw > 40)
    nw = 40;
  for (int l = 0; l < nl; l++)
    best[l] = INFINITY, bw[l] = mx[l] - mn[l];
  for (int r = 0; r < nw; r++) {
    for (size_t k = 0; k < T; k++)
      for (int l = 0; l < nl; l++) {
        size_t q = k * nl + l;
        double wd = (mx[l] - mn[l] + 1e-300) * 0.5 * exp2(-0.5 * r), z = (x[q] - mu[l]) / wd;
        s->B[0][q] = lor ? 1 / (1 + z * z) : exp(-0.5 * z * z);
        s->B[1][q] = 1;
        s->B[2][q] = x[q];
      }
    lin_acc(T, nl, 3, s->B, y, w, s->acc);
    lin_solve(nl, 3, s->acc, s->beta, s->ss);
    for (int l = 0; l < nl; l++)
      if (s->ss[l] < best[l]) {
        best[l] = s->ss[l];
        bw[l] = (mx[l] - mn[l]) * 0.5 * exp2(-0.5 * r);
        for (int a = 0; a < 3; a++)
          bbest[a * nl + l] = s->beta[l * 3 + a];
      }
  }
  for (int l = 0; l < nl; l++) {
    double *p = p0 + l * P;
    int ok = isfinite(best[l]);
    p[0] = ok ? bbest[l] : 1;
    p[1] = mu[l];
    p[2] = bw[l] > 0 ? bw[l] : 1;
    p[3] = ok ? bbest[nl + l] : 0;
    p[4] = ok ? bbest[2 * nl + l] : 0;
  }
}

void beam__fit_guess(const fit_ctx_t *c, size_t T, int nl, int shared_x, const double *x,
                     const double *y, const double *w, double *p0, double *scratch) {
  scr_t s;
  carve(&s, scratch, T, nl);
  switch (c->b->model) {
  case BEAM_FIT_DCOS:
  case BEAM_FIT_DCOS_T0:
  case BEAM_FIT_DCOS2:
    guess_dcos(c, T, nl, shared_x, x, y, w, p0, &s);
    break;
  case BEAM_FIT_EXP:
  case BEAM_FIT_STRETCH:
  case BEAM_FIT_STRETCH_XT:
  case BEAM_FIT_EXP2:
    guess_exp(c, T, nl, x, y, w, p0, &s);
    break;
  case BEAM_FIT_GAUSS:
  case BEAM_FIT_LORENTZ:
    guess_peak(c, T, nl, x, y, w, p0, &s);
    break;
  default:
    for (int l = 0; l < nl; l++)
      for (int j = 0; j < c->P; j++)
        p0[l * c->P + j] = 0;
  }
  /* A start outside the box is clamped by the LM start; a non-finite one
   * (a dead lane) becomes harmless. */
  for (int l = 0; l < nl; l++)
    for (int j = 0; j < c->P; j++)
      if (!isfinite(p0[l * c->P + j]))
        p0[l * c->P + j] = 1;
}
