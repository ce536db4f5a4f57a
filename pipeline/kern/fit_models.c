/* Fit models: the table of names and parameters, the reference model
 * functions in double (value and analytic Jacobian at one point), and the
 * checks of a batch. The SIMD path has its own fp32 copies of these
 * formulas (fit_cpu.c); the unit test holds the two together, and the
 * Jacobians here against central differences. */
#include <math.h>
#include <string.h>

#include "pipeline/kern/fit_int.h"

static const beam_fit_model_info_t models[BEAM_FIT_N_MODELS] = {
    [BEAM_FIT_DCOS] = {"dcos", 5, 0, {"a", "b", "tau", "f", "c"}},
    [BEAM_FIT_DCOS_T0] = {"dcos_t0", 6, 0, {"a", "b", "tau", "f", "c", "t0"}},
    [BEAM_FIT_DCOS2] = {"dcos2", 9, 0,
                        {"a1", "b1", "tau1", "f1", "a2", "b2", "tau2", "f2", "c"}},
    [BEAM_FIT_EXP] = {"exp", 3, 0, {"a", "tau", "d"}},
    [BEAM_FIT_STRETCH] = {"stretch", 4, 0, {"a", "tau", "beta", "d"}},
    [BEAM_FIT_STRETCH_XT] = {"stretch_xt", 4, 0, {"a", "tau", "beta", "d"}},
    [BEAM_FIT_EXP2] = {"exp2", 5, 0, {"a1", "tau1", "a2", "tau2", "d"}},
    [BEAM_FIT_GAUSS] = {"gauss", 5, 0, {"A", "mu", "sigma", "c0", "c1"}},
    [BEAM_FIT_LORENTZ] = {"lorentz", 5, 0, {"A", "mu", "gamma", "c0", "c1"}},
    [BEAM_FIT_POLY] = {"poly", 0, 1, {"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8",
                                      "c9", "c10", "c11", "c12", "c13", "c14", "c15"}},
};

const beam_fit_model_info_t *beam_fit_model_info(beam_fit_model_t m) {
  return (unsigned)m < BEAM_FIT_N_MODELS ? &models[m] : NULL;
}

int beam_fit_model_from_name(const char *name) {
  for (int m = 0; name && m < BEAM_FIT_N_MODELS; m++)
    if (strcmp(models[m].name, name) == 0)
      return m;
  return -1;
}

const char *beam_fit_status_name(int s) {
  static const char *const n[BEAM_FIT_N_STATUS] = {"converged", "bound",     "max_iter",
                                                   "singular",  "bad_input", "too_few"};
  return s >= 0 && s < BEAM_FIT_N_STATUS ? n[s] : "unknown";
}

void beam_fit_opts_default(beam_fit_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->estimator = BEAM_FIT_LSE;
  o->init = BEAM_FIT_INIT_AUTO;
  o->isa = BEAM_FIT_ISA_AUTO;
  o->max_iter = 100;
  /* fp32 points make χ² good to ~1e-7 relative: tighter stops only spin. */
  o->ftol = 1e-6;
  o->xtol = 1e-6;
  o->gtol = 1e-8;
  o->lambda0 = 1e-3;
}

int beam_fit_check(const beam_fit_batch_t *b, const beam_fit_opts_t *o, beam_diag_t *d) {
  if (!b || !o)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: NULL batch or options");
  const beam_fit_model_info_t *mi = beam_fit_model_info(b->model);
  if (!mi)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: unknown model %d", (int)b->model);
  int P = mi->n_params;
  if (b->model == BEAM_FIT_POLY) {
    if (b->poly_degree < 0 || b->poly_degree >= FIT_MAXP)
      return BEAM_DIAG(d, BEAM_EINVAL, "fit: poly_degree %d outside 0..%d", b->poly_degree,
                       FIT_MAXP - 1);
    P = b->poly_degree + 1;
  }
  if (!b->y || !b->x)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: x and y are required");
  if (b->n_points == 0 || b->n_points > (1u << 24))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: n_points %zu outside 1..2^24", b->n_points);
  if (o->estimator < BEAM_FIT_LSE || o->estimator > BEAM_FIT_MLE)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: unknown estimator %d", (int)o->estimator);
  if (o->estimator != BEAM_FIT_LSE && b->w)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: weights are given but the estimator sets its own");
  if (o->init == BEAM_FIT_INIT_GIVEN && !b->p0)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: init GIVEN without p0");
  if (o->init != BEAM_FIT_INIT_GIVEN && o->init != BEAM_FIT_INIT_AUTO)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: unknown init %d", (int)o->init);
  if (o->max_iter < 1 || !(o->ftol >= 0) || !(o->xtol >= 0) || !(o->gtol >= 0) ||
      !(o->lambda0 > 0) || !isfinite(o->lambda0))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit: max_iter >= 1, tolerances >= 0, lambda0 > 0");
  for (int j = 0; j < P; j++) {
    double lo = b->lo ? b->lo[j] : -INFINITY, hi = b->hi ? b->hi[j] : INFINITY;
    if (!(lo <= hi) || lo == INFINITY || hi == -INFINITY)
      return BEAM_DIAG(d, BEAM_EINVAL, "fit: bounds of %s: need lo <= hi (got %g, %g)",
                       mi->param_names[j], lo, hi);
  }
  return P;
}

int beam__fit_ctx(fit_ctx_t *c, const beam_fit_batch_t *b, const beam_fit_opts_t *o,
                  beam_diag_t *d) {
  int P = beam_fit_check(b, o, d);
  if (P < 0)
    return P;
  c->b = b;
  c->o = o;
  c->P = P;
  c->guess_direct = 0;
  for (int j = 0; j < P; j++) {
    c->lo[j] = b->lo ? b->lo[j] : -INFINITY;
    c->hi[j] = b->hi ? b->hi[j] : INFINITY;
  }
  return 0;
}

/* One damped cosine e^(-u/tau)(a cos ωu + b sin ωu), ω = 2πf, into J[0..3]
 * (a b tau f); *dfdu gets ∂/∂u (for t0). */
static double dcos1(const double *p, double u, double *J, double *dfdu) {
  double a = p[0], b = p[1], tau = p[2], w = 2 * M_PI * p[3];
  double e = exp(-u / tau), co = cos(w * u), si = sin(w * u);
  double osc = a * co + b * si, dosc = -a * si + b * co; /* ∂osc/∂(ωu) */
  J[0] = e * co;
  J[1] = e * si;
  J[2] = e * osc * u / (tau * tau);
  J[3] = e * dosc * 2 * M_PI * u;
  if (dfdu)
    *dfdu = e * (-osc / tau + dosc * w);
  return e * osc;
}

double beam__fit_eval(beam_fit_model_t m, int P, const double *p, double x, double *J) {
  switch (m) {
  case BEAM_FIT_DCOS: {
    J[4] = 1;
    return dcos1(p, x, J, NULL) + p[4];
  }
  case BEAM_FIT_DCOS_T0: {
    /* Below t0 the trace is the value at t0: continuous, with a kink. */
    double u = x > p[5] ? x - p[5] : 0, dfdu;
    double f = dcos1(p, u, J, &dfdu) + p[4];
    J[4] = 1;
    J[5] = x > p[5] ? -dfdu : 0;
    return f;
  }
  case BEAM_FIT_DCOS2: {
    double f = dcos1(p, x, J, NULL) + dcos1(p + 4, x, J + 4, NULL) + p[8];
    J[8] = 1;
    return f;
  }
  case BEAM_FIT_EXP: {
    double e = exp(-2 * x / p[1]);
    J[0] = e;
    J[1] = p[0] * e * 2 * x / (p[1] * p[1]);
    J[2] = 1;
    return p[0] * e + p[2];
  }
  case BEAM_FIT_STRETCH:
  case BEAM_FIT_STRETCH_XT: {
    /* pyXpcsViewer: exp(-2 z^β), z = x/τ; XPCS-Toolkit: exp(-z^β), z = 2x/τ. */
    double k = m == BEAM_FIT_STRETCH ? 2 : 1;
    double z = (m == BEAM_FIT_STRETCH ? x : 2 * x) / p[1];
    double lz = z > 0 ? log(z) : 0, zb = z > 0 ? exp(p[2] * lz) : 0;
    double e = exp(-k * zb);
    J[0] = e;
    J[1] = p[0] * e * k * zb * p[2] / p[1];
    J[2] = -p[0] * e * k * zb * lz;
    J[3] = 1;
    return p[0] * e + p[3];
  }
  case BEAM_FIT_EXP2: {
    double e1 = exp(-2 * x / p[1]), e2 = exp(-2 * x / p[3]);
    J[0] = e1;
    J[1] = p[0] * e1 * 2 * x / (p[1] * p[1]);
    J[2] = e2;
    J[3] = p[2] * e2 * 2 * x / (p[3] * p[3]);
    J[4] = 1;
    return p[0] * e1 + p[2] * e2 + p[4];
  }
  case BEAM_FIT_GAUSS: {
    double z = (x - p[1]) / p[2], g = exp(-0.5 * z * z);
    J[0] = g;
    J[1] = p[0] * g * z / p[2];
    J[2] = p[0] * g * z * z / p[2];
    J[3] = 1;
    J[4] = x;
    return p[0] * g + p[3] + p[4] * x;
  }
  case BEAM_FIT_LORENTZ: {
    double z = (x - p[1]) / p[2], L = 1 / (1 + z * z);
    J[0] = L;
    J[1] = p[0] * 2 * z * L * L / p[2];
    J[2] = p[0] * 2 * z * z * L * L / p[2];
    J[3] = 1;
    J[4] = x;
    return p[0] * L + p[3] + p[4] * x;
  }
  case BEAM_FIT_POLY: {
    double f = 0, xk = 1;
    for (int j = 0; j < P; j++) {
      J[j] = xk;
      f += p[j] * xk;
      xk *= x;
    }
    return f;
  }
  default:
    return NAN;
  }
}
