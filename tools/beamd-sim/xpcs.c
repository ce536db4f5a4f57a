/* beamd-sim XPCS pattern: speckle movies whose g2 per q ring is known.
 *
 * Model (docs/tools.md states it for users): every pixel carries M
 * independent complex Gaussian fields ("modes") that follow an AR(1)
 * process E_t = rho_r E_{t-1} + sqrt(1 - rho_r^2) eta_t, with eta_t complex
 * standard normal (E|eta|^2 = 1) and rho_r = exp(-rate_r * frame_time) for
 * the pixel's ring r. The intensity I_t = mean / M * sum_m |E_t,m|^2 is
 * stationary from frame 0 (frame 0 draws E from the stationary law), so
 * g2(k) - 1 = beta * exp(-2 rate_r k frame_time) with beta = 1 / M, and the
 * counts are Poisson(I_t). Rings are equal-width annuli up to the largest
 * inscribed circle; pixels outside them are always 0 counts (label 0).
 *
 * Speed: the field update is the cost (one complex normal per pixel, mode
 * and frame), so it runs over fixed blocks of XB pixels with float32 state,
 * NLANE interleaved xoshiro128+ streams and polynomial log/sin/cos/exp
 * and Newton sqrt (libm's would not vectorise without -ffast-math), all
 * plain loops with a compile-time trip count that gcc vectorises even at
 * the tools' -O2. Poisson sampling stays scalar (pois.h). Not a physics
 * simulation of a sample: it is a test signal with an exact, documented
 * answer.
 */
#include "tools/beamd-sim/sim.h"
#include "tools/beamd-sim/rng.h"
#include "tools/beamd-sim/pois.h"
#include "daemon/npy_write.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define XB 256u   /* pixels per block; a multiple of every vector width */
#define NLANE 8u  /* interleaved generator streams: one AVX2 vector of u32 */
#define MIN_RATE_DT 1e-6 /* below this, float32 rho cannot resolve the rate */

struct sim_xpcs_s {
  uint32_t h, w, nrings, modes;
  size_t npix, npad;        /* npad: npix rounded up to XB */
  beam_dtype_t dtype;
  double dt, mean, cy, cx, rmax;
  double *rate;             /* nrings, the rates actually simulated */
  uint32_t *ring_npix;      /* nrings */
  uint16_t *label;          /* npix: 0 outside, r + 1 in ring r */
  float *a, *b, *scale;     /* npad: rho, sqrt(1 - rho^2), mean / M (0 outside) */
  float *re, *im;           /* modes * npad field state */
  float *inten;             /* XB: intensity of the current block */
  float *emlam;             /* XB: exp(-intensity) */
  sim_pois_tab_t ptab;
  uint32_t lane[4][NLANE];  /* xoshiro128+ states, one column per stream */
  sim_rng_t prng;           /* Poisson draws */
  uint64_t seed, nseries;
  int started;
};

/* ---- vectorisable building blocks ------------------------------------- */

/* xoshiro128+ on NLANE streams, 2*XB outputs. The + scrambler leaves the
 * lowest bits weak, so callers use only the top 24 of each word. */
static void lanes_fill(uint32_t st[4][NLANE], uint32_t *restrict out) {
  uint32_t s0[NLANE], s1[NLANE], s2[NLANE], s3[NLANE];
  memcpy(s0, st[0], sizeof s0);
  memcpy(s1, st[1], sizeof s1);
  memcpy(s2, st[2], sizeof s2);
  memcpy(s3, st[3], sizeof s3);
  for (unsigned j = 0; j < 2 * XB; j += NLANE)
    for (unsigned l = 0; l < NLANE; l++) {
      out[j + l] = s0[l] + s3[l];
      uint32_t t = s1[l] << 9;
      s2[l] ^= s0[l];
      s3[l] ^= s1[l];
      s1[l] ^= s2[l];
      s0[l] ^= s3[l];
      s2[l] ^= t;
      s3[l] = (s3[l] << 11) | (s3[l] >> 21);
    }
  memcpy(st[0], s0, sizeof s0);
  memcpy(st[1], s1, sizeof s1);
  memcpy(st[2], s2, sizeof s2);
  memcpy(st[3], s3, sizeof s3);
}

typedef union {
  float f;
  uint32_t u;
} f32bits_t;

/* ln(u) for normal positive floats, |error| < 1e-7 absolute: exponent plus
 * the atanh series of the mantissa folded into [sqrt(1/2), sqrt(2)), where
 * t <= 0.172 and the first omitted term is below 3e-9. libm's logf would
 * not vectorise here. */
static inline float fast_logf(float u) {
  f32bits_t v = {.f = u};
  uint32_t mant = v.u & 0x7fffffu;
  /* 1 when the mantissa is >= sqrt(2) (0x3504f3), found by a carry rather
   * than a compare so the loop has no control flow for the vectoriser. */
  uint32_t big = (mant + (0x800000u - 0x3504f3u)) >> 23;
  float e = (float)((int32_t)(v.u >> 23) - 127 + (int32_t)big);
  v.u = mant | ((127u - big) << 23);
  float m = v.f;
  float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
  float p = 1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9))));
  return e * 0.69314718f + 2.0f * t * p;
}

/* sqrt for x >= 0: three Newton steps on the bit-trick estimate of
 * 1/sqrt(x) (3.4 % -> 2e-3 -> 5e-6 -> float rounding), times x. sqrtf itself does not vectorise at -O2
 * because of its errno path. */
static inline float fast_sqrtf(float x) {
  f32bits_t v = {.f = x};
  v.u = 0x5f375a86u - (v.u >> 1); /* 1/sqrt(x) estimate */
  float y = v.f;
  y = y * (1.5f - 0.5f * x * y * y);
  y = y * (1.5f - 0.5f * x * y * y);
  y = y * (1.5f - 0.5f * x * y * y);
  return x * y; /* x = 0 gives 0: y stays finite */
}

/* XB complex standard normals (E|z|^2 = 1) from 2*XB random words:
 * |z|^2 = -ln(u) is Exp(1) and the phase is uniform. The phase is drawn in
 * [0, pi/2) (22 bits) and the two top bits flip the signs of the real and
 * imaginary parts, which maps it uniformly onto the whole circle. */
static void cnormal_block(const uint32_t *restrict bits, float *restrict zr,
                          float *restrict zi) {
  for (unsigned i = 0; i < XB; i++) {
    uint32_t ua = bits[i], ub = bits[XB + i];
    float u = ((float)(int32_t)(ua >> 8) + 0.5f) * 0x1p-24f; /* (0, 1) */
    float mag = fast_sqrtf(-fast_logf(u));
    /* x = phase - pi/4 in [-pi/4, pi/4): Taylor terms to x^9 / x^10 leave
     * errors below 2e-9. */
    float x = (float)(int32_t)((ub >> 8) & 0x3fffffu) * (1.57079633f * 0x1p-22f) - 0.78539816f;
    float x2 = x * x;
    float sx = x * (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 +
                                                                     x2 * (1.0f / 362880)))));
    float cx = 1.0f + x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 +
                                                                       x2 * (-1.0f / 3628800)))));
    float c = (cx - sx) * 0.70710678f, s = (cx + sx) * 0.70710678f;
    float sgc = 1.0f - 2.0f * (float)(int32_t)(ub >> 31);
    float sgs = 1.0f - 2.0f * (float)(int32_t)((ub >> 30) & 1u);
    zr[i] = mag * c * sgc;
    zi[i] = mag * s * sgs;
  }
}

/* exp(-x) for x >= 0, relative error < 3e-7; x is capped at 80 (exp(-80)
 * is far below anything the Poisson inversion can tell from 0). The cap is
 * an integer min on the bit pattern (monotonic for x >= 0), which gcc
 * vectorises where a float min would need -ffast-math. */
static inline float fast_expm(float x) {
  f32bits_t v = {.f = x};
  uint32_t cap = 0x42a00000u; /* 80.0f */
  v.u = v.u < cap ? v.u : cap;
  float t = v.f * -1.44269504f + 127.0f; /* log2 of the result, plus 127: in [11, 127] */
  int32_t k = (int32_t)t;                /* floor, since t > 0 */
  float g = t - (float)k - 0.5f;         /* 2^(g + 0.5) with |g| <= 0.5 */
  float y = g * 0.69314718f;
  float p = 1.0f + y * (1.0f + y * (0.5f + y * (1.0f / 6 + y * (1.0f / 24 + y * (1.0f / 120 +
                                                                               y * (1.0f / 720))))));
  f32bits_t s = {.u = (uint32_t)k << 23}; /* 2^(k - 127): k is the biased exponent */
  return p * 1.41421356f * s.f;
}

static void expm_block(const float *restrict x, float *restrict out) {
  for (unsigned i = 0; i < XB; i++)
    out[i] = fast_expm(x[i]);
}

static void ar_step(const float *restrict a, const float *restrict b, float *restrict re,
                    float *restrict im, const float *restrict zr, const float *restrict zi) {
  for (unsigned i = 0; i < XB; i++) {
    re[i] = a[i] * re[i] + b[i] * zr[i];
    im[i] = a[i] * im[i] + b[i] * zi[i];
  }
}

static void intensity_add(float *restrict acc, const float *restrict re,
                          const float *restrict im) {
  for (unsigned i = 0; i < XB; i++)
    acc[i] += re[i] * re[i] + im[i] * im[i];
}

static void intensity_scale(float *restrict acc, const float *restrict scale) {
  for (unsigned i = 0; i < XB; i++)
    acc[i] *= scale[i];
}

static void store_counts(void *dst, beam_dtype_t dt, size_t i, double v) {
  switch (dt) {
  case BEAM_DT_U8: ((uint8_t *)dst)[i] = (uint8_t)(v > 255.0 ? 255.0 : v); break;
  case BEAM_DT_U16: ((uint16_t *)dst)[i] = (uint16_t)(v > 65535.0 ? 65535.0 : v); break;
  case BEAM_DT_U32: ((uint32_t *)dst)[i] = (uint32_t)(v > 4294967295.0 ? 4294967295.0 : v); break;
  default: ((float *)dst)[i] = (float)v; break;
  }
}

/* ---- set-up --------------------------------------------------------------- */

static double ring_edge(const sim_xpcs_t *self, uint32_t k) {
  return self->rmax * (double)k / (double)self->nrings;
}

/* Label of a pixel by the documented rule r_in <= d < r_out, with the same
 * double arithmetic a reader of the metadata would use. */
static uint16_t pixel_label(const sim_xpcs_t *self, uint32_t y, uint32_t x) {
  double dy = (double)y - self->cy, dx = (double)x - self->cx;
  double d = sqrt(dx * dx + dy * dy);
  if (!(d < self->rmax))
    return 0;
  long r = (long)(d * self->nrings / self->rmax);
  if (r >= (long)self->nrings)
    r = (long)self->nrings - 1;
  while (r > 0 && d < ring_edge(self, (uint32_t)r))
    r--;
  while (r + 1 < (long)self->nrings && d >= ring_edge(self, (uint32_t)r + 1))
    r++;
  return (uint16_t)(r + 1);
}

void sim_xpcs_destroy(sim_xpcs_t **pself) {
  if (!pself || !*pself)
    return;
  sim_xpcs_t *self = *pself;
  free(self->rate);
  free(self->ring_npix);
  free(self->label);
  free(self->a);
  free(self->b);
  free(self->scale);
  free(self->re);
  free(self->im);
  free(self->inten);
  free(self->emlam);
  free(self);
  *pself = NULL;
}

int sim_xpcs_new(sim_xpcs_t **out, const sim_opts_t *o, beam_diag_t *d) {
  *out = NULL;
  sim_xpcs_t *self = calloc(1, sizeof *self);
  if (!self)
    return BEAM_DIAG(d, BEAM_ENOMEM, "xpcs generator");
  self->h = o->h;
  self->w = o->w;
  self->nrings = o->xpcs_rings;
  self->modes = o->xpcs_modes;
  self->npix = (size_t)o->h * o->w;
  self->npad = (self->npix + XB - 1) / XB * XB;
  self->dtype = o->dtype;
  self->dt = sim_frame_time(o);
  self->mean = o->mean;
  self->seed = o->seed;
  self->cy = (o->h - 1) / 2.0;
  self->cx = (o->w - 1) / 2.0;
  self->rmax = (o->h < o->w ? o->h : o->w) / 2.0;
  int rc;
  if (!(self->rmax / self->nrings >= 1.0)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL,
                   "--xpcs-rings %u: rings would be thinner than one pixel (the largest "
                   "inscribed circle of a %ux%u frame has radius %g; use at most %u rings)",
                   self->nrings, o->h, o->w, self->rmax, (unsigned)floor(self->rmax));
    goto fail;
  }
  if (!(o->xpcs_rate_min * self->dt >= MIN_RATE_DT)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL,
                   "--xpcs-rate-min %g with frame time %g s: rate * frame_time must be at "
                   "least %g for float32 fields to resolve it", o->xpcs_rate_min, self->dt,
                   MIN_RATE_DT);
    goto fail;
  }
  self->rate = calloc(self->nrings, sizeof *self->rate);
  self->ring_npix = calloc(self->nrings, sizeof *self->ring_npix);
  self->label = malloc(self->npix * sizeof *self->label);
  self->a = calloc(self->npad, sizeof *self->a);
  self->b = calloc(self->npad, sizeof *self->b);
  self->scale = calloc(self->npad, sizeof *self->scale);
  self->re = calloc(self->npad * self->modes, sizeof *self->re);
  self->im = calloc(self->npad * self->modes, sizeof *self->im);
  self->inten = calloc(XB, sizeof *self->inten);
  self->emlam = calloc(XB, sizeof *self->emlam);
  if (!self->rate || !self->ring_npix || !self->label || !self->a || !self->b ||
      !self->scale || !self->re || !self->im || !self->inten || !self->emlam) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "xpcs state for %ux%u pixels x %u modes", o->h, o->w,
                   self->modes);
    goto fail;
  }
  float rho[65536 / 64]; /* per ring; nrings <= rmax <= max_dim / 2 */
  float sig[65536 / 64];
  if (self->nrings > sizeof rho / sizeof rho[0]) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "--xpcs-rings %u: at most %zu", self->nrings,
                   sizeof rho / sizeof rho[0]);
    goto fail;
  }
  for (uint32_t r = 0; r < self->nrings; r++) {
    double f = self->nrings > 1 ? (double)r / (self->nrings - 1) : 0.0;
    double want = o->xpcs_rate_min * pow(o->xpcs_rate_max / o->xpcs_rate_min, f);
    rho[r] = (float)exp(-want * self->dt);
    /* sigma from the rounded rho keeps the variance exactly stationary; the
     * metadata reports the rate that rounded rho really has. */
    sig[r] = (float)sqrt(1.0 - (double)rho[r] * (double)rho[r]);
    self->rate[r] = rho[r] > 0.0f ? -log((double)rho[r]) / self->dt : INFINITY;
  }
  sim_pois_tab_init(&self->ptab);
  float sc = (float)(o->mean / self->modes);
  for (uint32_t y = 0; y < self->h; y++)
    for (uint32_t x = 0; x < self->w; x++) {
      size_t i = (size_t)y * self->w + x;
      uint16_t l = pixel_label(self, y, x);
      self->label[i] = l;
      if (l) {
        self->a[i] = rho[l - 1];
        self->b[i] = sig[l - 1];
        self->scale[i] = sc;
        self->ring_npix[l - 1]++;
      }
    }
  *out = self;
  return 0;
fail:
  sim_xpcs_destroy(&self);
  return rc;
}

/* Series s (counted from 0 in this run) uses its own streams, so a seed
 * gives the same movie for every series position on every run. */
static void restart(sim_xpcs_t *self) {
  uint64_t x = self->seed ^ (0xd1342543de82ef95ull * (self->nseries + 1));
  for (unsigned l = 0; l < NLANE; l++) {
    for (unsigned k = 0; k < 4; k++)
      self->lane[k][l] = (uint32_t)(sim_splitmix64(&x) >> 32);
    if (!(self->lane[0][l] | self->lane[1][l] | self->lane[2][l] | self->lane[3][l]))
      self->lane[0][l] = 1; /* the all-zero state is a fixed point */
  }
  sim_rng_seed(&self->prng, sim_splitmix64(&x));
  self->nseries++;
  self->started = 1;
}

void sim_xpcs_render(sim_xpcs_t *self, uint64_t frame_id, void *dst) {
  uint32_t bits[2 * XB];
  float zr[XB], zi[XB];
  int fresh = frame_id == 0 || !self->started;
  if (fresh)
    restart(self);
  for (size_t blk = 0; blk < self->npad; blk += XB) {
    float *acc = self->inten;
    memset(acc, 0, XB * sizeof *acc);
    for (uint32_t m = 0; m < self->modes; m++) {
      float *re = self->re + (size_t)m * self->npad + blk;
      float *im = self->im + (size_t)m * self->npad + blk;
      lanes_fill(self->lane, bits);
      cnormal_block(bits, zr, zi);
      if (fresh) { /* stationary start: E_0 is itself complex standard normal */
        memcpy(re, zr, sizeof zr);
        memcpy(im, zi, sizeof zi);
      } else {
        ar_step(self->a + blk, self->b + blk, re, im, zr, zi);
      }
      intensity_add(acc, re, im);
    }
    intensity_scale(acc, self->scale + blk);
    expm_block(acc, self->emlam);
    size_t n = self->npix - blk < XB ? self->npix - blk : XB;
    for (size_t i = 0; i < n; i++)
      store_counts(dst, self->dtype, blk + i,
                   sim_pois((double)acc[i], (double)self->emlam[i], &self->ptab,
                            &self->prng));
  }
}

json_t *sim_xpcs_meta(const sim_xpcs_t *self) {
  json_t *rings = json_array();
  for (uint32_t r = 0; r < self->nrings; r++)
    json_array_append_new(rings, json_pack("{s:i,s:f,s:f,s:f,s:i}", "label", (int)(r + 1),
                                           "r_in", ring_edge(self, r), "r_out",
                                           ring_edge(self, r + 1), "rate", self->rate[r],
                                           "npix", (int)self->ring_npix[r]));
  return json_pack(
      "{s:o,s:f,s:i,s:f,s:[ff],s:f,s:s,s:s,s:s}", "rings", rings, "beta", 1.0 / self->modes,
      "modes", (int)self->modes, "frame_time", self->dt, "center", self->cy, self->cx, "mean",
      self->mean, "center_order", "yx",
      "label_rule", "pixel (y, x) is in ring r (label r + 1) when r_in <= hypot(y - center[0], "
                    "x - center[1]) < r_out; label 0 pixels are always 0 counts",
      "g2", "intensity: g2(k) - 1 = beta * exp(-2 * rate * k * frame_time); Poisson counts: "
            "the same for k >= 1, and beta + 1/mean at k = 0");
}

int sim_xpcs_write_labels(const sim_xpcs_t *self, const char *path, beam_diag_t *d) {
  uint32_t shape[2] = {self->h, self->w};
  return beam_npy_write(path, BEAM_DT_U16, 2, shape, self->label,
                        self->npix * sizeof *self->label, d);
}
