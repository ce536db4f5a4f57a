/* The synthetic fitting cases shared by the engine's unit tests
 * (tests/unit/test_kern_fit.c) and the CUDA cross-check
 * (tests/gpu/test_xcheck_fit.c): a seeded generator, each model's true
 * parameters, its x grid and its noise level. Header-only: each test is
 * its own program. */
#ifndef BEAM_TESTS_FIT_CASES_H
#define BEAM_TESTS_FIT_CASES_H

#include <math.h>
#include <stdint.h>

#include "pipeline/fit.h"

static uint64_t rng_s = 88172645463325252ull;
static double urand(void) {
  rng_s ^= rng_s << 13, rng_s ^= rng_s >> 7, rng_s ^= rng_s << 17;
  return (double)(rng_s >> 11) / 9007199254740992.0;
}
static double grand(void) {
  double u = urand() + 1e-300, v = urand();
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static const double truth[BEAM_FIT_N_MODELS][9] = {
    [BEAM_FIT_DCOS] = {1.0, 0.5, 4.0, 0.8, 0.2},
    [BEAM_FIT_DCOS_T0] = {1.0, 0.5, 4.0, 0.8, 0.2, 1.0},
    [BEAM_FIT_DCOS2] = {1.0, 0.3, 5.0, 0.7, 0.5, -0.2, 3.0, 1.9, 0.1},
    [BEAM_FIT_EXP] = {0.3, 0.5, 1.0},
    [BEAM_FIT_STRETCH] = {0.3, 0.5, 0.8, 1.0},
    [BEAM_FIT_STRETCH_XT] = {0.3, 0.5, 1.3, 1.0},
    [BEAM_FIT_EXP2] = {0.2, 0.05, 0.15, 5.0, 1.0},
    [BEAM_FIT_GAUSS] = {2.0, 0.3, 0.7, 0.5, 0.1},
    [BEAM_FIT_LORENTZ] = {2.0, -0.4, 0.5, 0.5, 0.1},
    [BEAM_FIT_POLY] = {0.5, -1.0, 0.3, 2.0},
};
static double xat(int m, int k, int T) {
  if (m >= BEAM_FIT_EXP && m <= BEAM_FIT_EXP2)
    return 1e-3 * pow(1e4, (double)k / (T - 1));
  if (m == BEAM_FIT_GAUSS || m == BEAM_FIT_LORENTZ || m == BEAM_FIT_POLY)
    return -5 + 10.0 * k / (T - 1);
  return (m == BEAM_FIT_DCOS_T0 ? -2 : 0) + 10.0 * k / (T - 1);
}
static double noise_of(int m) {
  return m >= BEAM_FIT_EXP && m <= BEAM_FIT_EXP2 ? 0.003 : 0.03;
}

#endif
