/* Levenberg–Marquardt control for one fit, and the plain reference
 * (beam_fit_ref_range): one fit at a time, model and sums in double.
 *
 * The control (accept/reject, damping, bounds, stop tests, errors) is
 * shared with the SIMD path, which runs it per lane on its fp32 sums; so
 * the reference differs from the fast path only in the per-point
 * arithmetic. The method (docs/fit.md):
 *   step     (H + λ·diag(D)) Δ = g, H = JᵀWJ, g = JᵀW r, D_j = max over
 *            iterations of H_jj (Marquardt's scale-invariant diagonal)
 *   gain     ρ = (χ² - χ²(p+Δ)) / (2Δᵀg - ΔᵀHΔ), the drop the quadratic
 *            model predicts for the (possibly clamped) step
 *   damping  Nielsen: accept when ρ > 0, λ *= max(1/3, 1-(2ρ-1)³), ν = 2;
 *            else λ *= ν, ν *= 2 (H. B. Nielsen, IMM-REP-1999-05)
 *   bounds   projection with an active set: a parameter on a bound whose
 *            gradient points outward leaves the system for that step; the
 *            others' step is solved without it and clamped to the box
 *   stop     relative χ² drop <= ftol, scaled step <= xtol·|p|_D, every
 *            |g_j| / sqrt(H_jj χ²) <= gtol, or max_iter passes. */
#include <math.h>
#include <string.h>

#include "pipeline/kern/fit_int.h"

/* The Cholesky routines with n a constant for the usual sizes, so the
 * loops unroll and the independent divisions overlap; the same operations
 * in the same order as for a run-time n (the same bits). */
#define CHOL_SIZES(X) X(3) X(4) X(5) X(6) X(9)
static int chol_factor(int n, double *A) {
  switch (n) {
#define F_(k)                                                                                \
  case k:                                                                                    \
    return beam__fit_chol_factor(k, A);
    CHOL_SIZES(F_)
#undef F_
  default:
    return beam__fit_chol_factor(n, A);
  }
}
static void chol_subst(int n, const double *A, const double *b, double *x) {
  switch (n) {
#define S_(k)                                                                                \
  case k:                                                                                    \
    beam__fit_chol_subst(k, A, b, x);                                                        \
    return;
    CHOL_SIZES(S_)
#undef S_
  default:
    beam__fit_chol_subst(n, A, b, x);
  }
}
/* All P columns of (L Lᵀ)⁻¹ into cov (scaled), column by column as P
 * chol_subst calls would compute them. */
static void chol_inverse(int n, const double *A, double scale, double *cov) {
  double e[FIT_MAXP], col[FIT_MAXP];
  for (int k = 0; k < n; k++) {
    for (int j = 0; j < n; j++)
      e[j] = j == k;
    chol_subst(n, A, e, col);
    for (int j = 0; j < n; j++)
      cov[j * n + k] = col[j] * scale;
  }
}

int beam__fit_chol_solve(int n, double *A, const double *b, double *x) {
  if (chol_factor(n, A) != 0)
    return -1;
  chol_subst(n, A, b, x);
  return 0;
}

static double clampd(double v, double lo, double hi) {
  return v < lo ? lo : v > hi ? hi : v;
}

void beam__fit_lm_start(fit_lm_t *s, const fit_ctx_t *c, const double *p0, int n_used) {
  memset(s, 0, sizeof *s);
  s->P = c->P;
  s->est = c->o->estimator;
  s->linear = beam_fit_model_info(c->b->model)->linear;
  s->n_used = n_used;
  for (int j = 0; j < c->P; j++)
    s->p[j] = s->pt[j] = clampd(p0[j], c->lo[j], c->hi[j]);
}

static void take(fit_lm_t *s, const double *acc, ptrdiff_t st) {
  int P = s->P, idx = 1 + P;
  s->chi2 = acc[0];
  memcpy(s->p, s->pt, sizeof(double) * (size_t)P);
  for (int j = 0; j < P; j++)
    s->g[j] = acc[(1 + j) * st];
  for (int j = 0; j < P; j++)
    for (int k = j; k < P; k++, idx++)
      s->H[j * P + k] = s->H[k * P + j] = acc[idx * st];
  for (int j = 0; j < P; j++)
    if (s->H[j * P + j] > s->D[j])
      s->D[j] = s->H[j * P + j];
}

static int fixed(const fit_ctx_t *c, int j) { return c->lo[j] == c->hi[j]; }

static int converged(const fit_lm_t *s, const fit_ctx_t *c) {
  for (int j = 0; j < s->P; j++)
    if (!fixed(c, j) && (s->p[j] == c->lo[j] || s->p[j] == c->hi[j]))
      return BEAM_FIT_BOUND;
  return BEAM_FIT_CONVERGED;
}

/* A free parameter may move: not fixed, and not on a bound it is pushed
 * through (g is the direction in which χ² falls). */
static int is_free(const fit_lm_t *s, const fit_ctx_t *c, int j) {
  if (fixed(c, j))
    return 0;
  if (s->p[j] <= c->lo[j] && s->g[j] < 0)
    return 0;
  if (s->p[j] >= c->hi[j] && s->g[j] > 0)
    return 0;
  return 1;
}

static int grad_small(const fit_lm_t *s, const fit_ctx_t *c) {
  if (!(s->chi2 > 0))
    return 1; /* an exact fit */
  for (int j = 0; j < s->P; j++) {
    double h = s->H[j * s->P + j];
    if (is_free(s, c, j) && h > 0 && !(fabs(s->g[j]) <= c->o->gtol * sqrt(h * s->chi2)))
      return 0;
  }
  return 1;
}

static int step_small(const fit_lm_t *s, const fit_ctx_t *c, const double *dp) {
  double n2 = 0, p2 = 0;
  for (int j = 0; j < s->P; j++) {
    n2 += s->D[j] * dp[j] * dp[j];
    p2 += s->D[j] * s->p[j] * s->p[j];
  }
  return sqrt(n2) <= c->o->xtol * (sqrt(p2) + c->o->xtol);
}

/* Solves for the next trial point; -1 when there is one, else a status. */
static int propose(fit_lm_t *s, const fit_ctx_t *c) {
  int P = s->P, idx[FIT_MAXP], n = 0;
  for (int j = 0; j < P; j++)
    if (is_free(s, c, j))
      idx[n++] = j;
  if (n == 0)
    return converged(s, c);
  double A[FIT_MAXP * FIT_MAXP], b[FIT_MAXP], d[FIT_MAXP];
  for (int tries = 0;; tries++) {
    for (int i = 0; i < n; i++) {
      for (int k = 0; k < n; k++)
        A[i * n + k] = s->H[idx[i] * P + idx[k]];
      A[i * n + i] += s->lambda * s->D[idx[i]];
      b[i] = s->g[idx[i]];
    }
    if (beam__fit_chol_solve(n, A, b, d) == 0)
      break;
    /* A linear model has no damping to raise: its H is singular. */
    if (s->linear || tries == 8)
      return BEAM_FIT_SINGULAR;
    s->lambda = s->lambda > 0 ? s->lambda * s->nu : 1e-6;
    s->nu *= 2;
  }
  memcpy(s->pt, s->p, sizeof(double) * (size_t)P);
  int moved = 0;
  for (int i = 0; i < n; i++) {
    int j = idx[i];
    s->pt[j] = clampd(s->p[j] + d[i], c->lo[j], c->hi[j]);
    moved |= s->pt[j] != s->p[j];
  }
  return moved ? -1 : converged(s, c);
}

int beam__fit_lm_next(fit_lm_t *s, const fit_ctx_t *c, const double *acc, ptrdiff_t st) {
  const beam_fit_opts_t *o = c->o;
  int P = s->P;
  double chi2t = acc[0];
  if (!s->started) {
    if (!isfinite(chi2t))
      return BEAM_FIT_BAD_INPUT; /* the start itself is not evaluable */
    take(s, acc, st);
    s->started = 1;
    s->lambda = s->linear ? 0 : o->lambda0;
    s->nu = 2;
    if (grad_small(s, c))
      return converged(s, c);
    return propose(s, c);
  }
  s->iter++;
  double dp[FIT_MAXP], pred = 0;
  for (int j = 0; j < P; j++)
    dp[j] = s->pt[j] - s->p[j];
  for (int j = 0; j < P; j++) {
    double hd = 0;
    for (int k = 0; k < P; k++)
      hd += s->H[j * P + k] * dp[k];
    pred += dp[j] * (2 * s->g[j] - hd);
  }
  double actual = s->chi2 - chi2t; /* NaN when chi2t is */
  if (actual > 0) {
    double rho = pred > 0 ? actual / pred : 1, old = s->chi2, t = 2 * rho - 1;
    double f = 1 - t * t * t;
    s->lambda *= f > 1.0 / 3 ? f : 1.0 / 3;
    s->nu = 2;
    take(s, acc, st);
    if (s->linear || actual <= o->ftol * old || step_small(s, c, dp) || grad_small(s, c))
      return converged(s, c);
  } else {
    if (s->linear)
      return converged(s, c); /* the exact step cannot improve on p */
    if (step_small(s, c, dp))
      return converged(s, c); /* no smaller step can still lower χ² */
    s->lambda *= s->nu;
    s->nu *= 2;
    if (!(s->lambda < 1e30))
      return converged(s, c);
  }
  if (s->iter >= o->max_iter)
    return BEAM_FIT_MAX_ITER;
  return propose(s, c);
}

void beam__fit_fail(const fit_ctx_t *c, int status, size_t i, int n_used,
                    beam_fit_result_t *r) {
  int P = c->P;
  for (int j = 0; j < P; j++) {
    r->params[i * P + j] = NAN;
    if (r->errors)
      r->errors[i * P + j] = NAN;
  }
  if (r->cov)
    for (int j = 0; j < P * P; j++)
      r->cov[i * P * P + j] = NAN;
  if (r->chi2)
    r->chi2[i] = NAN;
  if (r->chi2_red)
    r->chi2_red[i] = NAN;
  if (r->iters)
    r->iters[i] = 0;
  if (r->n_used)
    r->n_used[i] = n_used;
  if (r->status)
    r->status[i] = (uint8_t)status;
}

void beam__fit_lm_finish(const fit_lm_t *s, const fit_ctx_t *c, int status, size_t i,
                         beam_fit_result_t *r) {
  int P = s->P, dof = s->n_used - P;
  if (status == BEAM_FIT_BAD_INPUT || !s->started) {
    beam__fit_fail(c, status, i, s->n_used, r);
    return;
  }
  double cov[FIT_MAXP * FIT_MAXP], A[FIT_MAXP * FIT_MAXP];
  /* curve_fit: pcov = inv(JᵀWJ) · χ²/(N-P) unless absolute_sigma; the
   * Poisson deviance's curvature is already the Fisher information. */
  double scale = s->est != BEAM_FIT_MLE && !c->o->absolute_sigma ? s->chi2 / dof : 1;
  /* One factorisation, P substitutions (the numbers of P separate
   * solves, bit for bit). */
  memcpy(A, s->H, sizeof(double) * (size_t)(P * P));
  int sing = chol_factor(P, A) != 0;
  if (!sing)
    chol_inverse(P, A, scale, cov);
  if (sing) {
    status = BEAM_FIT_SINGULAR;
    for (int j = 0; j < P * P; j++)
      cov[j] = NAN;
  }
  for (int j = 0; j < P; j++) {
    r->params[i * P + j] = s->p[j];
    if (r->errors)
      r->errors[i * P + j] = cov[j * P + j] >= 0 ? sqrt(cov[j * P + j]) : NAN;
  }
  if (r->cov)
    memcpy(r->cov + i * P * P, cov, sizeof(double) * (size_t)(P * P));
  if (r->chi2)
    r->chi2[i] = s->chi2;
  if (r->chi2_red)
    r->chi2_red[i] = s->chi2 / dof;
  if (r->iters)
    r->iters[i] = s->iter;
  if (r->n_used)
    r->n_used[i] = s->n_used;
  if (r->status)
    r->status[i] = (uint8_t)status;
}

/* The reference pass: χ², Jᵀr and JᵀWJ at s->pt, in double. */
static void ref_pass(const fit_ctx_t *c, const fit_lm_t *s, size_t T, const double *x,
                     const double *y, const double *w, double *acc) {
  int P = c->P, mle = c->o->estimator == BEAM_FIT_MLE;
  double J[FIT_MAXP];
  memset(acc, 0, sizeof(double) * FIT_NACC(P));
  for (size_t k = 0; k < T; k++) {
    if (!(w[k] > 0))
      continue;
    double f = beam__fit_eval(c->b->model, P, s->pt, x[k], J), wk = w[k], r = y[k] - f;
    if (mle) {
      /* Gpufit's MLE deviance; Fisher scoring: H = Σ J Jᵀ / f. */
      if (!(f > 0)) {
        acc[0] = INFINITY;
        return;
      }
      acc[0] += y[k] > 0 ? 2 * (f - y[k]) - 2 * y[k] * log(f / y[k]) : 2 * f;
      wk = 1 / f;
    } else {
      acc[0] += wk * r * r;
    }
    for (int j = 0; j < P; j++)
      acc[1 + j] += J[j] * wk * r;
    int idx = 1 + P;
    for (int j = 0; j < P; j++)
      for (int m = j; m < P; m++)
        acc[idx++] += wk * J[j] * J[m];
  }
  if (!isfinite(acc[0]))
    acc[0] = INFINITY; /* NaN would read as "worse" too, but say it */
}

/* Workspace of the reference: x, y, w of one fit and the guess scratch. */
size_t beam__fit_ref_ws(int P, size_t T) {
  return sizeof(double) * (3 * T + beam__fit_guess_scratch(P, T, 1) + FIT_NACC(FIT_MAXP) + 8);
}

int beam_fit_ref_range(const beam_fit_batch_t *b, const beam_fit_opts_t *o, size_t i0,
                       size_t i1, void *ws, size_t ws_bytes, beam_fit_result_t *r,
                       beam_diag_t *d) {
  fit_ctx_t c;
  int rc = beam__fit_ctx(&c, b, o, d);
  if (rc < 0)
    return rc;
  size_t T = b->n_points;
  if (!r || !r->params || i0 > i1 || i1 > b->n_fits)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: bad range [%zu, %zu) of %zu or no results", i0, i1,
                     b->n_fits);
  if (!ws || ws_bytes < beam__fit_ref_ws(c.P, T))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: workspace of %zu bytes, need %zu", ws_bytes,
                     beam__fit_ref_ws(c.P, T));
  double *x = ws, *y = x + T, *w = y + T, *acc = w + T, *scr = acc + FIT_NACC(FIT_MAXP);
  fit_lm_t s;
  for (size_t i = i0; i < i1; i++) {
    int n_used;
    int st = beam__fit_gather(&c, i, 1, 0, x, y, w, &n_used);
    if (st >= 0) {
      beam__fit_fail(&c, st, i, n_used, r);
      continue;
    }
    double p0[FIT_MAXP];
    if (o->init == BEAM_FIT_INIT_GIVEN)
      memcpy(p0, b->p0 + i * c.P, sizeof(double) * (size_t)c.P);
    else
      beam__fit_guess(&c, T, 1, 1, x, y, w, p0, scr);
    beam__fit_lm_start(&s, &c, p0, n_used);
    do {
      ref_pass(&c, &s, T, x, y, w, acc);
      st = beam__fit_lm_next(&s, &c, acc, 1);
    } while (st < 0);
    beam__fit_lm_finish(&s, &c, st, i, r);
  }
  return 0;
}
