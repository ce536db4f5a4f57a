/* beamd-sim frame bank: the pixels every pattern is built from.
 *
 * Random patterns are generated once at start-up into a bank a few frames
 * larger than one frame; frame k is a window into it at a pseudo-random
 * element offset. That keeps the send rate independent of the random
 * generator and lets raw frames go out zero-copy. The counter pattern uses
 * the same trick: a ramp 0..65535 repeated, so the window at offset
 * (frame_id mod 65536) is exactly (frame_id + i) mod 65536. Not for
 * statistics work: windows of the same bank overlap, so frames are not
 * independent samples (the xpcs pattern, in xpcs.c, is the one made for
 * statistics: it renders every frame, as pca.c does).
 */
#include "tools/beamd-sim/sim.h"
#include "tools/beamd-sim/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BANK_TARGET_BYTES (32u << 20) /* bank size we aim for */
#define BANK_MAX_FRAMES 256u
#define BANK_MIN_FRAMES 2u
#define STEM_SCAN_STEP_M 1e-9 /* scan step of the simulated raster */

const char *sim_pattern_name(sim_pattern_t p) {
  switch (p) {
  case SIM_PAT_POISSON: return "poisson";
  case SIM_PAT_FLAT: return "flat";
  case SIM_PAT_COUNTER: return "counter";
  case SIM_PAT_STEM: return "stem";
  case SIM_PAT_XPCS: return "xpcs";
  case SIM_PAT_PCA: return "pca";
  case SIM_PAT_PTYCHO: return "ptycho";
  case SIM_PAT_PUMPPROBE: return "pumpprobe";
  }
  return "unknown";
}

/* Poisson sampler: inversion over a precomputed CDF for small means (the
 * detector case: a few counts per pixel, so the search is short), normal
 * approximation above POIS_TABLE_MEAN where inversion gets long. */
#define POIS_TABLE_MEAN 64.0
#define POIS_TABLE_MAX 256

typedef struct pois_s {
  double mean;
  double cdf[POIS_TABLE_MAX];
  int n;
} pois_t;

static void pois_init(pois_t *p, double mean) {
  p->mean = mean;
  p->n = 0;
  if (!(mean <= POIS_TABLE_MEAN))
    return;
  double pk = exp(-mean), acc = 0.0;
  for (int k = 0; k < POIS_TABLE_MAX; k++) {
    acc += pk;
    p->cdf[k] = acc;
    p->n = k + 1;
    if (acc >= 1.0 - 1e-15 && k > mean)
      break;
    pk *= mean / (double)(k + 1);
  }
  p->cdf[p->n - 1] = 1.0; /* absorb the rounding tail */
}

static double pois_draw(const pois_t *p, sim_rng_t *r) {
  if (p->mean <= 0.0)
    return 0.0;
  if (p->n > 0) {
    double u = sim_rng_uniform(r);
    int k = 0;
    while (k < p->n - 1 && u >= p->cdf[k])
      k++;
    return (double)k;
  }
  /* Box-Muller; one of the pair is discarded, which is fine at start-up. */
  double u1 = sim_rng_uniform(r), u2 = sim_rng_uniform(r);
  double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
  double v = floor(p->mean + sqrt(p->mean) * z + 0.5);
  return v < 0.0 ? 0.0 : v;
}

static double dtype_max(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return 255.0;
  case BEAM_DT_U16: return 65535.0;
  case BEAM_DT_U32: return 4294967295.0;
  default: return 3.4e38;
  }
}

/* Stores a non-negative count; integers are clamped to the dtype range the
 * way a saturating detector counter would be. */
static void store(uint8_t *base, beam_dtype_t dt, size_t i, double v) {
  double mx = dtype_max(dt);
  if (v > mx)
    v = mx;
  switch (dt) {
  case BEAM_DT_U8: ((uint8_t *)base)[i] = (uint8_t)v; break;
  case BEAM_DT_U16: ((uint16_t *)base)[i] = (uint16_t)v; break;
  case BEAM_DT_U32: ((uint32_t *)base)[i] = (uint32_t)v; break;
  default: ((float *)base)[i] = (float)v; break;
  }
}

static size_t bank_frames(size_t frame_bytes) {
  size_t b = BANK_TARGET_BYTES / (frame_bytes ? frame_bytes : 1);
  if (b > BANK_MAX_FRAMES)
    b = BANK_MAX_FRAMES;
  if (b < BANK_MIN_FRAMES)
    b = BANK_MIN_FRAMES;
  return b;
}

static int stem_init(sim_bank_t *self, const sim_opts_t *o, beam_diag_t *d) {
  uint64_t n = o->frames ? o->frames : 64u * 64u; /* forever: wrap a 64x64 raster */
  uint64_t nx = (uint64_t)ceil(sqrt((double)n));
  if (nx == 0)
    nx = 1;
  self->scan_nx = (uint32_t)nx;
  self->scan_ny = (uint32_t)((n + nx - 1) / nx);
  uint32_t m = self->h < self->w ? self->h : self->w;
  int r = (int)(m / 8u);
  if (r < 1)
    r = 1;
  size_t cap = (size_t)(2 * r + 1) * (size_t)(2 * r + 1);
  self->disk_dy = malloc(cap * sizeof *self->disk_dy);
  self->disk_dx = malloc(cap * sizeof *self->disk_dx);
  if (!self->disk_dy || !self->disk_dx)
    return BEAM_DIAG(d, BEAM_ENOMEM, "stem disk table (%zu entries)", cap);
  self->ndisk = 0;
  for (int dy = -r; dy <= r; dy++)
    for (int dx = -r; dx <= r; dx++)
      if (dy * dy + dx * dx <= r * r) {
        self->disk_dy[self->ndisk] = dy;
        self->disk_dx[self->ndisk] = dx;
        self->ndisk++;
      }
  /* The bright-field disk is some tens of times the background per pixel. */
  self->disk_peak = 40.0 * (o->mean > 1.0 ? o->mean : 1.0);
  return 0;
}

int sim_bank_init(sim_bank_t *self, const sim_opts_t *o, beam_diag_t *d) {
  memset(self, 0, sizeof *self);
  self->pattern = o->pattern;
  self->dtype = o->dtype;
  self->esize = beam_dtype_size(o->dtype);
  self->h = o->h;
  self->w = o->w;
  self->npix = (size_t)o->h * o->w;
  self->seed = o->seed;
  size_t frame_bytes = self->npix * self->esize;
  size_t b = 0;

  switch (o->pattern) {
  case SIM_PAT_FLAT:
    self->nelems = self->npix;
    self->nwin = 1;
    break;
  case SIM_PAT_COUNTER:
    self->nelems = self->npix + 65535u;
    self->nwin = 65536u;
    break;
  case SIM_PAT_XPCS: /* rendered per frame; one zero frame for malformed messages */
  case SIM_PAT_PCA:
  case SIM_PAT_PTYCHO:
  case SIM_PAT_PUMPPROBE:
    self->nelems = self->npix;
    self->nwin = 1;
    break;
  case SIM_PAT_POISSON:
  case SIM_PAT_STEM:
    b = bank_frames(frame_bytes);
    self->nelems = (b + 1) * self->npix;
    self->nwin = b * self->npix + 1;
    break;
  }
  self->data = malloc(self->nelems * self->esize);
  if (!self->data)
    return BEAM_DIAG(d, BEAM_ENOMEM, "frame bank of %zu bytes",
                     self->nelems * self->esize);
  if (o->pattern == SIM_PAT_XPCS) {
    memset(self->data, 0, self->nelems * self->esize);
    return sim_xpcs_new(&self->xpcs, o, d);
  }
  if (o->pattern == SIM_PAT_PCA) {
    memset(self->data, 0, self->nelems * self->esize);
    return sim_pca_new(&self->pca, o, d);
  }
  if (o->pattern == SIM_PAT_PTYCHO) {
    memset(self->data, 0, self->nelems * self->esize);
    return sim_ptycho_new(&self->ptycho, o, d);
  }
  if (o->pattern == SIM_PAT_PUMPPROBE) {
    memset(self->data, 0, self->nelems * self->esize);
    return sim_pp_new(&self->pp, o, d);
  }

  if (o->pattern == SIM_PAT_FLAT) {
    double v = o->dtype == BEAM_DT_F32 ? o->mean : floor(o->mean + 0.5);
    for (size_t i = 0; i < self->nelems; i++)
      store(self->data, o->dtype, i, v);
  } else if (o->pattern == SIM_PAT_COUNTER) {
    /* uint8 wraps rather than saturates, so it stays (frame_id + i) mod 256. */
    size_t mask = o->dtype == BEAM_DT_U8 ? 0xffu : 0xffffu;
    for (size_t i = 0; i < self->nelems; i++)
      store(self->data, o->dtype, i, (double)(i & mask));
  } else {
    sim_rng_t r;
    pois_t p;
    sim_rng_seed(&r, o->seed);
    pois_init(&p, o->mean);
    for (size_t i = 0; i < self->nelems; i++)
      store(self->data, o->dtype, i, pois_draw(&p, &r));
  }
  if (o->pattern == SIM_PAT_STEM)
    return stem_init(self, o, d);
  return 0;
}

int sim_bank_is_static(const sim_bank_t *self) {
  return self->pattern != SIM_PAT_STEM && self->pattern != SIM_PAT_XPCS &&
         self->pattern != SIM_PAT_PCA && self->pattern != SIM_PAT_PTYCHO &&
         self->pattern != SIM_PAT_PUMPPROBE;
}

static size_t window_offset(const sim_bank_t *self, uint64_t frame_id) {
  switch (self->pattern) {
  case SIM_PAT_FLAT: return 0;
  case SIM_PAT_COUNTER: return (size_t)(frame_id & 0xffffu);
  default: {
    uint64_t x = self->seed ^ (frame_id * 0x2545f4914f6cdd1dull);
    return (size_t)(sim_splitmix64(&x) % self->nwin);
  }
  }
}

static void stem_render(const sim_bank_t *self, uint64_t frame_id, void *dst,
                        double pos[3]) {
  uint64_t k = frame_id % ((uint64_t)self->scan_nx * self->scan_ny);
  uint32_t ix = (uint32_t)(k % self->scan_nx), iy = (uint32_t)(k / self->scan_nx);
  memcpy(dst, self->data + window_offset(self, frame_id) * self->esize,
         self->npix * self->esize);
  /* A crystal-like lattice modulates the transmitted intensity, and a slowly
   * varying field deflects the disk by a few pixels (what DPC measures). */
  double lat = cos(2.0 * M_PI * ix / 8.0) * cos(2.0 * M_PI * iy / 8.0);
  double inten = floor(self->disk_peak * (0.55 + 0.45 * lat) + 0.5);
  int sy = (int)lround(2.0 * sin(2.0 * M_PI * ix / (double)self->scan_nx));
  int sx = (int)lround(2.0 * cos(2.0 * M_PI * iy / (double)self->scan_ny));
  int cy = (int)(self->h / 2) + sy, cx = (int)(self->w / 2) + sx;
  uint8_t *out = dst;
  for (size_t j = 0; j < self->ndisk; j++) {
    int y = cy + self->disk_dy[j], x = cx + self->disk_dx[j];
    if (y < 0 || x < 0 || (uint32_t)y >= self->h || (uint32_t)x >= self->w)
      continue;
    size_t i = (size_t)y * self->w + (size_t)x;
    double v;
    switch (self->dtype) {
    case BEAM_DT_U8: v = ((uint8_t *)out)[i]; break;
    case BEAM_DT_U16: v = ((uint16_t *)out)[i]; break;
    case BEAM_DT_U32: v = ((uint32_t *)out)[i]; break;
    default: v = ((float *)out)[i]; break;
    }
    store(out, self->dtype, i, v + inten);
  }
  pos[0] = ix * STEM_SCAN_STEP_M;
  pos[1] = iy * STEM_SCAN_STEP_M;
  pos[2] = 0.0;
}

const void *sim_bank_frame(sim_bank_t *self, uint64_t frame_id, void *dst,
                           double pos[3], int *has_pos) {
  *has_pos = 0;
  if (self->pattern == SIM_PAT_STEM) {
    stem_render(self, frame_id, dst, pos);
    *has_pos = 1;
    return dst;
  }
  if (self->pattern == SIM_PAT_XPCS) {
    sim_xpcs_render(self->xpcs, frame_id, dst);
    return dst;
  }
  if (self->pattern == SIM_PAT_PCA) {
    sim_pca_render(self->pca, frame_id, dst);
    return dst;
  }
  if (self->pattern == SIM_PAT_PUMPPROBE) {
    sim_pp_render(self->pp, 0, frame_id, dst);
    return dst;
  }
  if (self->pattern == SIM_PAT_PTYCHO) {
    sim_ptycho_render(self->ptycho, frame_id, dst, pos);
    *has_pos = 1;
    return dst;
  }
  return self->data + window_offset(self, frame_id) * self->esize;
}

void sim_bank_destroy(sim_bank_t *self) {
  if (!self)
    return;
  free(self->data);
  free(self->disk_dy);
  free(self->disk_dx);
  sim_xpcs_destroy(&self->xpcs);
  sim_pca_destroy(&self->pca);
  sim_ptycho_destroy(&self->ptycho);
  sim_pp_destroy(&self->pp);
  memset(self, 0, sizeof *self);
}
