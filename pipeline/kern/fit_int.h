/* Internals of the batched fitter (pipeline/fit.h), shared by the plain
 * reference (fit_lm.c), the SIMD path (fit_cpu.c), the models
 * (fit_models.c) and the initial guesses (fit_init.c). Not for use outside
 * pipeline/kern/fit_*.c and their unit test.
 *
 * Data of a block of nl fits lives in lane-minor arrays a[k*nl + l]
 * (k = point, l = lane): loops over lanes are innermost, so they vectorise
 * without reductions. The reference uses nl = 1. */
#ifndef BEAM_KERN_FIT_INT_H
#define BEAM_KERN_FIT_INT_H

#include <stddef.h>

#include "pipeline/fit.h"

#define FIT_MAXP BEAM_FIT_MAX_PARAMS
#define FIT_NH(P) ((P) * ((P) + 1) / 2)
/* Accumulator rows of one pass: χ², Jᵀr (P), upper JᵀWJ (P(P+1)/2). */
#define FIT_NACC(P) (1 + (P) + FIT_NH(P))
/* Lanes of the SIMD block: one zmm of floats, two ymm. */
#define FIT_L 16

/* One fit's Levenberg–Marquardt state; everything in double. */
typedef struct fit_lm_s {
  int P, est, linear;
  double p[FIT_MAXP], pt[FIT_MAXP];   /* accepted point, trial point */
  double g[FIT_MAXP];                 /* Jᵀ W r at p */
  double H[FIT_MAXP * FIT_MAXP];      /* JᵀWJ at p, full square */
  double D[FIT_MAXP];                 /* Marquardt diagonal: running max of H_ii */
  double chi2, lambda, nu;
  int iter, started, n_used;
} fit_lm_t;

/* Bounds resolved for the batch (±INFINITY where none). */
typedef struct fit_ctx_s {
  const beam_fit_batch_t *b;
  const beam_fit_opts_t *o;
  int P;
  double lo[FIT_MAXP], hi[FIT_MAXP];
  /* Test knob (0 from beam__fit_ctx): 1 makes the dcos guess use the
   * direct periodogram even where the FFT one applies (fit_init.c). */
  int guess_direct;
} fit_ctx_t;

int beam__fit_ctx(fit_ctx_t *c, const beam_fit_batch_t *b, const beam_fit_opts_t *o,
                  beam_diag_t *d);

/* ---- models (fit_models.c) ---- */
/* f(x; p) and ∂f/∂p_j into J, in double: the reference's model. */
double beam__fit_eval(beam_fit_model_t m, int P, const double *p, double x, double *J);

/* ---- data (fit_init.c) ---- */
/* Copies fit i into lane l of x, y, w (each T*nl, lane-minor) with the
 * estimator's weights (0 for masked points), and checks it. Returns -1
 * when the fit can run, else its status (BAD_INPUT, TOO_FEW); *n_used
 * gets the points with w > 0. A failing lane is zeroed (w = 0), so it
 * computes harmless numbers beside its neighbours. */
int beam__fit_gather(const fit_ctx_t *c, size_t i, int nl, int l, double *x, double *y,
                     double *w, int *n_used);

/* Doubles of scratch beam__fit_guess needs for nl lanes of T points. */
size_t beam__fit_guess_scratch(int P, size_t T, int nl);
/* Automatic start for the nl lanes of a block (lane-minor x, y, w as
 * gathered); p0[l*P + j]. shared_x: every lane has the same x (faster
 * periodogram). Lanes with all w = 0 get a harmless finite start. */
void beam__fit_guess(const fit_ctx_t *c, size_t T, int nl, int shared_x, const double *x,
                     const double *y, const double *w, double *p0, double *scratch);

/* ---- LM control (fit_lm.c), shared by both paths ---- */
void beam__fit_lm_start(fit_lm_t *s, const fit_ctx_t *c, const double *p0, int n_used);
/* Takes the pass at s->pt: χ² acc[0], Jᵀr acc[1..P], packed JᵀWJ after it,
 * element j at acc[j*stride]. Returns -1 when another pass at the new
 * s->pt is wanted, else the final status. */
int beam__fit_lm_next(fit_lm_t *s, const fit_ctx_t *c, const double *acc, ptrdiff_t stride);
/* Writes fit i's results (errors from s->H at s->p). */
void beam__fit_lm_finish(const fit_lm_t *s, const fit_ctx_t *c, int status, size_t i,
                         beam_fit_result_t *r);
/* Results of a fit that never ran (BAD_INPUT, TOO_FEW): NaN numbers. */
void beam__fit_fail(const fit_ctx_t *c, int status, size_t i, int n_used,
                    beam_fit_result_t *r);

/* Bytes of workspace beam_fit_ref_range needs. */
size_t beam__fit_ref_ws(int P, size_t T);

/* Cholesky solve of the n x n SPD matrix A (row-major, destroyed) for b
 * into x; -1 when A is not positive definite. */
int beam__fit_chol_solve(int n, double *A, const double *b, double *x);

#include <math.h>
/* The factor and the substitutions of beam__fit_chol_solve, inline so
 * that a caller with a constant n gets them unrolled (the same operations
 * in the same order: the same bits). A's lower triangle becomes L. */
static inline __attribute__((always_inline)) int beam__fit_chol_factor(int n, double *A) {
  for (int j = 0; j < n; j++) {
    double s = A[j * n + j];
    for (int k = 0; k < j; k++)
      s -= A[j * n + k] * A[j * n + k];
    /* Relative pivot floor: an exactly dependent column rounds to ~ε·s. */
    if (!(s > 1e-13 * fabs(A[j * n + j])) || !(s > 0))
      return -1;
    double r = sqrt(s);
    A[j * n + j] = r;
    for (int i = j + 1; i < n; i++) {
      double t = A[i * n + j];
      for (int k = 0; k < j; k++)
        t -= A[i * n + k] * A[j * n + k];
      A[i * n + j] = t / r;
    }
  }
  return 0;
}
/* x = (L Lᵀ)⁻¹ b for the factor of beam__fit_chol_factor. */
static inline __attribute__((always_inline)) void beam__fit_chol_subst(int n, const double *A,
                                                                        const double *b,
                                                                        double *x) {
  for (int i = 0; i < n; i++) { /* L z = b */
    double t = b[i];
    for (int k = 0; k < i; k++)
      t -= A[i * n + k] * x[k];
    x[i] = t / A[i * n + i];
  }
  for (int i = n - 1; i >= 0; i--) { /* Lᵀ x = z */
    double t = x[i];
    for (int k = i + 1; k < n; k++)
      t -= A[k * n + i] * x[k];
    x[i] = t / A[i * n + i];
  }
}
#endif
