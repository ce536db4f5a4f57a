/* beamd-sim PCA pattern: frames with a known low-rank structure.
 *
 * Model (docs/tools.md states it for users): frame t of a series is
 *   lambda_t = mu + sum_i c_{t,i} B_i  (+ an outlier blob on listed frames)
 * with B_i (i < k) orthonormal DCT-II images (low spatial orders, the
 * constant one left out) and c_{t,i} independent normals of standard
 * deviation strengths[i], so the population covariance has eigenvalues
 * strengths[i]^2 along B_i and the frames' true subspace is span(B).
 * From --pca-drift-at on, B_i is replaced by cos(a) B_i + sin(a) C_i, with
 * C the next k DCT images: every principal angle between the two
 * subspaces is then exactly a. The counts are Poisson(max(lambda, 0)) or
 * lambda + N(0, sigma^2), and a fraction of pixels per frame get a hot
 * spike added. Every frame is drawn from its own stream (seed, series
 * position, frame id), so a frame does not depend on the ones sent
 * before it.
 *
 * Speed: the basis, mean image and outlier blob are made once; a frame
 * costs k scaled float adds per pixel, one noise draw per pixel and the
 * store.
 */
#include "tools/beamd-sim/sim.h"
#include "tools/beamd-sim/pois.h"
#include "tools/beamd-sim/rng.h"
#include "daemon/npy_write.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define OUTLIER_POOL_FOREVER 1000u /* --frames 0: outliers among the first frames */
#define OUTLIER_PEAK_X 10.0        /* outlier blob peak, times the mean level */
#define SPIKE_X 50.0               /* hot-pixel spike, times the mean level */

struct sim_pca_s {
  uint32_t h, w, k;
  size_t npix;
  beam_dtype_t dtype;
  double mean, level; /* level: max(mean, 1), the scale of spikes and outliers */
  double strengths[SIM_PCA_MAX_K];
  uint32_t modes[2 * SIM_PCA_MAX_K][2]; /* (p, q) DCT orders: B first, then C */
  float *mu;        /* npix */
  float *basis;     /* k * npix */
  float *drifted;   /* k * npix, or NULL without drift */
  uint64_t drift_at;
  double drift_angle; /* degrees */
  double sigma;       /* < 0: Poisson */
  size_t nspike;
  double spike_frac;
  uint64_t *outliers; /* sorted frame ids */
  size_t nout;
  float *blob;        /* (2R+1)^2 outlier template, peak OUTLIER_PEAK_X * level */
  int blob_r;
  double blob_sigma;
  float *lam;         /* npix scratch: the frame before storing */
  sim_pois_tab_t ptab;
  uint64_t seed, nseries;
};

static double normal(sim_rng_t *r) {
  /* Box-Muller, one of the pair: only k draws per frame. */
  double u1 = sim_rng_uniform(r), u2 = sim_rng_uniform(r);
  return sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
}

/* Low-order (p, q) pairs, (0, 0) excluded, by p + q then p. */
static void pick_modes(sim_pca_t *self, uint32_t n) {
  uint32_t got = 0;
  for (uint32_t s = 1; got < n; s++)
    for (uint32_t p = 0; p <= s && got < n; p++) {
      uint32_t q = s - p;
      if (p < self->h && q < self->w) {
        self->modes[got][0] = p;
        self->modes[got][1] = q;
        got++;
      }
    }
}

/* Unit-norm DCT-II image of orders (p, q); images of different orders are
 * exactly orthogonal on the pixel grid. */
static void dct_image(const sim_pca_t *self, uint32_t p, uint32_t q, float *out) {
  double ss = 0.0;
  for (uint32_t y = 0; y < self->h; y++)
    for (uint32_t x = 0; x < self->w; x++) {
      double v = cos(M_PI * (y + 0.5) * p / self->h) * cos(M_PI * (x + 0.5) * q / self->w);
      ss += v * v;
    }
  double sc = 1.0 / sqrt(ss);
  for (uint32_t y = 0; y < self->h; y++)
    for (uint32_t x = 0; x < self->w; x++)
      out[(size_t)y * self->w + x] =
          (float)(sc * cos(M_PI * (y + 0.5) * p / self->h) * cos(M_PI * (x + 0.5) * q / self->w));
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

void sim_pca_destroy(sim_pca_t **pself) {
  if (!pself || !*pself)
    return;
  sim_pca_t *self = *pself;
  free(self->mu);
  free(self->basis);
  free(self->drifted);
  free(self->outliers);
  free(self->blob);
  free(self->lam);
  free(self);
  *pself = NULL;
}

int sim_pca_new(sim_pca_t **out, const sim_opts_t *o, beam_diag_t *d) {
  *out = NULL;
  sim_pca_t *self = calloc(1, sizeof *self);
  if (!self)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca generator");
  int rc;
  self->h = o->h;
  self->w = o->w;
  self->npix = (size_t)o->h * o->w;
  self->dtype = o->dtype;
  self->mean = o->mean;
  self->level = o->mean > 1.0 ? o->mean : 1.0;
  self->seed = o->seed;
  self->k = o->pca_k;
  self->sigma = o->pca_sigma;
  self->spike_frac = o->pca_spikes;
  self->nspike = (size_t)llround(o->pca_spikes * (double)self->npix);
  self->drift_at = o->pca_drift_at;
  self->drift_angle = o->pca_drift_angle;
  int drift = o->pca_drift_at != SIM_PCA_NO_DRIFT;
  uint32_t nmodes = self->k * (drift ? 2u : 1u);
  if (self->k < 1 || self->k > SIM_PCA_MAX_K) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "pca: k = %u components, must be 1..%d", self->k,
                   SIM_PCA_MAX_K);
    goto fail;
  }
  if ((uint64_t)nmodes + 1 > self->npix) {
    rc = BEAM_DIAG(d, BEAM_EINVAL,
                   "pca: %u basis images%s do not fit a %ux%u frame (at most %zu)", nmodes,
                   drift ? " (k before and k after the drift)" : "", o->h, o->w,
                   self->npix - 1);
    goto fail;
  }
  for (uint32_t i = 0; i < self->k; i++)
    self->strengths[i] = o->pca_strengths_set ? o->pca_strengths[i]
                                              : o->pca_strengths[i] * sqrt((double)self->npix);
  self->mu = malloc(self->npix * sizeof *self->mu);
  self->basis = malloc((size_t)self->k * self->npix * sizeof *self->basis);
  self->drifted = drift ? malloc((size_t)self->k * self->npix * sizeof *self->drifted) : NULL;
  self->lam = malloc(self->npix * sizeof *self->lam);
  if (!self->mu || !self->basis || (drift && !self->drifted) || !self->lam) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "pca basis: %u images of %ux%u", nmodes, o->h, o->w);
    goto fail;
  }
  pick_modes(self, nmodes);
  for (uint32_t i = 0; i < self->k; i++)
    dct_image(self, self->modes[i][0], self->modes[i][1], self->basis + (size_t)i * self->npix);
  if (drift) {
    double a = self->drift_angle * M_PI / 180.0, ca = cos(a), sa = sin(a);
    for (uint32_t i = 0; i < self->k; i++) {
      float *dst = self->drifted + (size_t)i * self->npix;
      const float *b = self->basis + (size_t)i * self->npix;
      dct_image(self, self->modes[self->k + i][0], self->modes[self->k + i][1], dst);
      for (size_t j = 0; j < self->npix; j++)
        dst[j] = (float)(ca * b[j] + sa * dst[j]);
    }
  }
  /* A smooth, non-flat mean: a flat one would be a DCT (0, 0) image and
   * hide nothing, this one shows up as a structured mean frame. */
  double cy = (o->h - 1) / 2.0, cx = (o->w - 1) / 2.0;
  double ms = (o->h < o->w ? o->h : o->w) / 4.0;
  for (uint32_t y = 0; y < o->h; y++)
    for (uint32_t x = 0; x < o->w; x++) {
      double r2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
      self->mu[(size_t)y * o->w + x] = (float)(o->mean * (0.75 + 0.5 * exp(-r2 / (2 * ms * ms))));
    }
  /* Outlier frames and their blob. */
  self->nout = o->pca_outliers;
  if (self->nout) {
    uint64_t pool = o->frames ? o->frames : OUTLIER_POOL_FOREVER;
    if (self->nout > pool / 2) {
      rc = BEAM_DIAG(d, BEAM_EINVAL, "pca: %zu outlier frames in a pool of %llu frames "
                     "(at most half may be outliers)", self->nout, (unsigned long long)pool);
      goto fail;
    }
    self->outliers = malloc(self->nout * sizeof *self->outliers);
    if (!self->outliers) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "pca outlier list");
      goto fail;
    }
    sim_rng_t r;
    sim_rng_seed(&r, o->seed ^ 0x6f75746c69657273ull);
    for (size_t n = 0; n < self->nout;) {
      uint64_t id = sim_rng_next(&r) % pool;
      size_t j = 0;
      while (j < n && self->outliers[j] != id)
        j++;
      if (j == n)
        self->outliers[n++] = id;
    }
    qsort(self->outliers, self->nout, sizeof *self->outliers, cmp_u64);
    self->blob_sigma = (o->h < o->w ? o->h : o->w) / 16.0;
    if (self->blob_sigma < 1.0)
      self->blob_sigma = 1.0;
    self->blob_r = (int)ceil(3.0 * self->blob_sigma);
    size_t side = (size_t)(2 * self->blob_r + 1);
    self->blob = malloc(side * side * sizeof *self->blob);
    if (!self->blob) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "pca outlier blob");
      goto fail;
    }
    for (int dy = -self->blob_r; dy <= self->blob_r; dy++)
      for (int dx = -self->blob_r; dx <= self->blob_r; dx++)
        self->blob[(size_t)(dy + self->blob_r) * side + (size_t)(dx + self->blob_r)] =
            (float)(OUTLIER_PEAK_X * self->level *
                    exp(-(dy * dy + dx * dx) / (2.0 * self->blob_sigma * self->blob_sigma)));
  }
  sim_pois_tab_init(&self->ptab);
  *out = self;
  return 0;
fail:
  sim_pca_destroy(&self);
  return rc;
}

void sim_pca_series_start(sim_pca_t *self) { self->nseries++; }

static int is_outlier(const sim_pca_t *self, uint64_t id) {
  size_t lo = 0, hi = self->nout;
  while (lo < hi) {
    size_t m = (lo + hi) / 2;
    if (self->outliers[m] < id)
      lo = m + 1;
    else
      hi = m;
  }
  return lo < self->nout && self->outliers[lo] == id;
}

static void add_blob(sim_pca_t *self, sim_rng_t *r) {
  int cy = (int)(sim_rng_next(r) % self->h), cx = (int)(sim_rng_next(r) % self->w);
  size_t side = (size_t)(2 * self->blob_r + 1);
  for (int dy = -self->blob_r; dy <= self->blob_r; dy++) {
    int y = cy + dy;
    if (y < 0 || (uint32_t)y >= self->h)
      continue;
    for (int dx = -self->blob_r; dx <= self->blob_r; dx++) {
      int x = cx + dx;
      if (x < 0 || (uint32_t)x >= self->w)
        continue;
      self->lam[(size_t)y * self->w + (size_t)x] +=
          self->blob[(size_t)(dy + self->blob_r) * side + (size_t)(dx + self->blob_r)];
    }
  }
}

static void axpy(float *restrict y, const float *restrict x, float a, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] += a * x[i];
}

static void store_frame(const sim_pca_t *self, void *dst) {
  const float *v = self->lam;
  size_t n = self->npix;
  switch (self->dtype) {
  case BEAM_DT_U8:
    for (size_t i = 0; i < n; i++)
      ((uint8_t *)dst)[i] = (uint8_t)(v[i] > 255.0f ? 255.0f : v[i] > 0.0f ? v[i] : 0.0f);
    break;
  case BEAM_DT_U16:
    for (size_t i = 0; i < n; i++)
      ((uint16_t *)dst)[i] = (uint16_t)(v[i] > 65535.0f ? 65535.0f : v[i] > 0.0f ? v[i] : 0.0f);
    break;
  case BEAM_DT_U32:
    for (size_t i = 0; i < n; i++)
      ((uint32_t *)dst)[i] =
          (uint32_t)(v[i] > 4294967040.0f ? 4294967040.0f : v[i] > 0.0f ? v[i] : 0.0f);
    break;
  default: memcpy(dst, v, n * sizeof *v); break;
  }
}

void sim_pca_render(sim_pca_t *self, uint64_t frame_id, void *dst) {
  sim_rng_t r;
  uint64_t x = self->seed ^ (0xd1342543de82ef95ull * self->nseries);
  x ^= sim_splitmix64(&x) + frame_id * 0x9e3779b97f4a7c15ull;
  sim_rng_seed(&r, sim_splitmix64(&x));
  const float *b = frame_id >= self->drift_at ? self->drifted : self->basis;
  float *lam = self->lam;
  memcpy(lam, self->mu, self->npix * sizeof *lam);
  for (uint32_t i = 0; i < self->k; i++)
    axpy(lam, b + (size_t)i * self->npix, (float)(self->strengths[i] * normal(&r)), self->npix);
  if (self->nout && is_outlier(self, frame_id))
    add_blob(self, &r);
  int integer = self->dtype != BEAM_DT_F32;
  if (self->sigma < 0) {
    for (size_t i = 0; i < self->npix; i++) {
      double l = lam[i];
      lam[i] = (float)sim_pois(l, l < SIM_PTRS_MIN_MEAN ? exp(-l) : 0.0, &self->ptab, &r);
    }
  } else if (self->sigma > 0) {
    for (size_t i = 0; i < self->npix; i += 2) {
      double u1 = sim_rng_uniform(&r), u2 = sim_rng_uniform(&r);
      double m = self->sigma * sqrt(-2.0 * log(1.0 - u1));
      lam[i] += (float)(m * cos(2.0 * M_PI * u2));
      if (i + 1 < self->npix)
        lam[i + 1] += (float)(m * sin(2.0 * M_PI * u2));
    }
  }
  if (integer && self->sigma >= 0)
    for (size_t i = 0; i < self->npix; i++)
      lam[i] = floorf(lam[i] + 0.5f);
  float spike = (float)(SPIKE_X * self->level);
  for (size_t s = 0; s < self->nspike; s++)
    lam[sim_rng_next(&r) % self->npix] += spike;
  store_frame(self, dst);
}

json_t *sim_pca_meta(const sim_pca_t *self, const char *basis_file) {
  json_t *st = json_array(), *outl = json_array(), *modes = json_array();
  for (uint32_t i = 0; i < self->k; i++)
    json_array_append_new(st, json_real(self->strengths[i]));
  for (size_t i = 0; i < self->nout; i++)
    json_array_append_new(outl, json_integer((json_int_t)self->outliers[i]));
  uint32_t nm = self->k * (self->drifted ? 2u : 1u);
  for (uint32_t i = 0; i < nm; i++)
    json_array_append_new(modes, json_pack("[ii]", (int)self->modes[i][0],
                                           (int)self->modes[i][1]));
  json_t *m = json_pack(
      "{s:i,s:o,s:o,s:o,s:s,s:s,s:f,s:f,s:i,s:f,s:f,s:f,s:s}", "k", (int)self->k, "strengths",
      st, "outlier_frames", outl, "dct_modes", modes, "noise",
      self->sigma < 0 ? "poisson" : "gaussian", "mean_image",
      "mean * (0.75 + 0.5 * exp(-((y - (H-1)/2)^2 + (x - (W-1)/2)^2) / (2 * (min(H,W)/4)^2)))",
      "mean", self->mean, "spike_fraction", self->spike_frac, "spikes_per_frame",
      (int)self->nspike, "spike_height", SPIKE_X * self->level, "outlier_peak",
      OUTLIER_PEAK_X * self->level, "outlier_sigma", self->blob_sigma, "model",
      "lambda = mean_image + sum_i c_i B_i, c_i ~ N(0, strengths[i]^2), B_i orthonormal "
      "DCT-II images of orders dct_modes[i]; from drift_at on B_i -> cos(a) B_i + "
      "sin(a) C_i with C_i the images of dct_modes[k + i]");
  if (!m)
    return NULL;
  json_object_set_new(m, "noise_sigma", json_real(self->sigma < 0 ? 0.0 : self->sigma));
  if (self->drifted) {
    json_object_set_new(m, "drift_at", json_integer((json_int_t)self->drift_at));
    json_object_set_new(m, "drift_angle_deg", json_real(self->drift_angle));
  } else {
    json_object_set_new(m, "drift_at", json_null());
  }
  json_object_set_new(m, "basis_file", basis_file ? json_string(basis_file) : json_null());
  return m;
}

int sim_pca_write_basis(const sim_pca_t *self, const char *path, beam_diag_t *d) {
  size_t one = (size_t)self->k * self->npix;
  if (!self->drifted) {
    uint32_t shape[3] = {self->k, self->h, self->w};
    return beam_npy_write(path, BEAM_DT_F32, 3, shape, self->basis, one * sizeof(float), d);
  }
  float *both = malloc(2 * one * sizeof *both);
  if (!both)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca basis file buffer");
  memcpy(both, self->basis, one * sizeof *both);
  memcpy(both + one, self->drifted, one * sizeof *both);
  uint32_t shape[4] = {2, self->k, self->h, self->w};
  int rc = beam_npy_write(path, BEAM_DT_F32, 4, shape, both, 2 * one * sizeof *both, d);
  free(both);
  return rc;
}
