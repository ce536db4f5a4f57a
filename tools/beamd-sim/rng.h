/* beamd-sim random numbers: splitmix64 (seeding, hashing) and xoshiro256**
 * (scalar draws), shared by the frame bank and the XPCS generator. The
 * XPCS field update has its own vectorisable lanes in xpcs.c. Not for
 * cryptography; reproducible for a given seed on every platform.
 */
#ifndef BEAMD_SIM_RNG_H
#define BEAMD_SIM_RNG_H

#include <stdint.h>

static inline uint64_t sim_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef struct sim_rng_s {
  uint64_t s[4];
} sim_rng_t;

static inline uint64_t sim_rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoshiro256**: fast and good enough for shot noise. */
static inline uint64_t sim_rng_next(sim_rng_t *r) {
  uint64_t *s = r->s;
  uint64_t result = sim_rotl64(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = sim_rotl64(s[3], 45);
  return result;
}

static inline double sim_rng_uniform(sim_rng_t *r) { /* [0, 1) with 53 bits */
  return (double)(sim_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static inline void sim_rng_seed(sim_rng_t *r, uint64_t seed) {
  for (int i = 0; i < 4; i++)
    r->s[i] = sim_splitmix64(&seed);
}

#endif
