/* beamd-sim Poisson sampler for per-pixel means that change every frame
 * (the xpcs and pca patterns): inversion for small means, PTRS above.
 * The frame bank's sampler in bank.c is a different one, built for one
 * fixed mean over a whole buffer.
 */
#ifndef BEAMD_SIM_POIS_H
#define BEAMD_SIM_POIS_H

#include <math.h>

#include "tools/beamd-sim/rng.h"

#define SIM_PTRS_MIN_MEAN 10.0
#define SIM_INV_MAX 64
#define SIM_LFACT_MAX 1024

/* Tables that take divisions and lgamma off the per-pixel path:
 * inv[k] = 1/k (the inversion search), lfact[k] = ln k! (PTRS's
 * acceptance test, reached by about a third of the draws). */
typedef struct sim_pois_tab_s {
  double inv[SIM_INV_MAX];
  double lfact[SIM_LFACT_MAX];
} sim_pois_tab_t;

static inline void sim_pois_tab_init(sim_pois_tab_t *t) {
  t->inv[0] = 0.0;
  for (unsigned k = 1; k < SIM_INV_MAX; k++)
    t->inv[k] = 1.0 / k;
  for (unsigned k = 0; k < SIM_LFACT_MAX; k++)
    t->lfact[k] = lgamma(k + 1.0);
}

/* Poisson(lam): inversion for small means (a short search from
 * emlam = exp(-lam), which callers may compute vectorised), PTRS (Hoermann
 * 1993, "The transformed rejection method for generating Poisson random
 * variables") above, the same split numpy uses. Exact up to the error of
 * emlam. lam <= 0 or NaN gives 0. */
static inline double sim_pois(double lam, double emlam, const sim_pois_tab_t *t,
                              sim_rng_t *r) {
  if (!(lam > 0.0))
    return 0.0;
  if (lam < SIM_PTRS_MIN_MEAN) {
    double u = sim_rng_uniform(r), p = emlam, c = p;
    unsigned k = 0;
    /* P(k >= SIM_INV_MAX) < 1e-30 here; the bound only guards against u
     * rounding above the cumulative sum. */
    while (u > c && k < SIM_INV_MAX - 1) {
      k++;
      p *= lam * t->inv[k];
      c += p;
    }
    return (double)k;
  }
  double slam = sqrt(lam);
  double b = 0.931 + 2.53 * slam, a = -0.059 + 0.02483 * b;
  double invalpha = 1.1239 + 1.1328 / (b - 3.4), vr = 0.9277 - 3.6224 / (b - 2.0);
  for (;;) {
    double U = sim_rng_uniform(r) - 0.5, V = sim_rng_uniform(r);
    double us = 0.5 - fabs(U);
    double k = floor((2.0 * a / us + b) * U + lam + 0.43);
    if (us >= 0.07 && V <= vr)
      return k;
    if (k < 0.0 || (us < 0.013 && V > us))
      continue;
    /* One log of the product instead of numpy's three: this branch is
     * taken by about a third of the draws at lam ~ 100. */
    double lf = k < SIM_LFACT_MAX ? t->lfact[(unsigned)k] : lgamma(k + 1.0);
    if (log(V * invalpha / (a / (us * us) + b)) <= -lam + k * log(lam) - lf)
      return k;
  }
}

#endif
