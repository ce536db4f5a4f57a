/* Stage kind `azint`: schema, cross-key check, and the host-side setup both
 * backends share (geometry per pixel, pyFAI's bin boundaries, the CSR
 * matrices, output declarations, result emission). The per-frame product
 * is beam_azint_csr_apply here (the reference) and its parallel use in
 * azint_cpu.c / the kernel in gpu/azint_cuda.cu. */
#include "pipeline/kern/azint.h"
#include "pipeline/kern/from_series.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define WHO "azint"

const beam_param_t beam_azint_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"poni", BEAM_P_INFILE, NULL, 0, 0, 0, NULL, NULL,
     "pyFAI .poni file (version 1 or 2) with the geometry and pixel size; excludes the geometry keys", NULL},
    {"dist", BEAM_P_FLOAT, NULL, 0, 1e-6, 1e3, NULL, NULL, "sample-detector distance (m) to the PONI", NULL},
    {"poni1", BEAM_P_FLOAT, NULL, 0, -1e3, 1e3, NULL, NULL, "PONI along the slow (y) axis from the first pixel's edge (m)", NULL},
    {"poni2", BEAM_P_FLOAT, NULL, 0, -1e3, 1e3, NULL, NULL, "PONI along the fast (x) axis (m)", NULL},
    {"rot1", BEAM_P_FLOAT, "0", 0, -7, 7, NULL, NULL, "detector rotation 1 (rad), pyFAI convention", NULL},
    {"rot2", BEAM_P_FLOAT, "0", 0, -7, 7, NULL, NULL, "detector rotation 2 (rad)", NULL},
    {"rot3", BEAM_P_FLOAT, "0", 0, -7, 7, NULL, NULL, "detector rotation 3 (rad)", NULL},
    {"wavelength", BEAM_P_FLOAT, NULL, 0, 1e-14, 1e-6, NULL, NULL, "X-ray wavelength (m)", NULL},
    {"pixel1", BEAM_P_FLOAT, NULL, 0, 1e-9, 1, NULL, NULL, "pixel size along the slow (y) axis (m)", NULL},
    {"pixel2", BEAM_P_FLOAT, NULL, 0, 1e-9, 1, NULL, NULL, "pixel size along the fast (x) axis (m)", NULL},
    {"unit", BEAM_P_ENUM, "q_nm^-1", 0, 0, 0, "q_nm^-1|q_A^-1|2th_deg", NULL, "radial unit (pyFAI's names)", NULL},
    {"npt", BEAM_P_INT, NULL, 1, 1, 1048576, NULL, NULL, "radial bins", NULL},
    {"radial_range", BEAM_P_FLOAT_LIST, NULL, 0, -1e9, 1e9, NULL, NULL,
     "[min, max] in `unit`; default: the extent of the unmasked pixels", NULL},
    {"npt_azim", BEAM_P_INT, "0", 0, 0, 65536, NULL, NULL, "azimuthal bins of the cake; 0 = no cake", NULL},
    {"azimuth_range", BEAM_P_FLOAT_LIST, NULL, 0, -180, 180, NULL, NULL,
     "[min, max] of chi in degrees; default: the extent of the pixels (cake) or all (1-D)", NULL},
    {"split", BEAM_P_ENUM, "bbox", 0, 0, 0, "none|bbox", NULL,
     "pixel splitting: none (whole pixel in the bin of its centre) or bbox (pyFAI bounding box)", NULL},
    {"mask", BEAM_P_INFILE, NULL, 0, 0, 0, "series", NULL,
     "bad-pixel mask, .h5 or .npy, nonzero = bad; \"series\": the series' pixel_mask array", NULL},
    {"mask_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 mask file", NULL},
    {"polarization_factor", BEAM_P_FLOAT, NULL, 0, -1, 1, NULL, NULL,
     "pyFAI polarization_factor (-1..1, 0 = unpolarised); default: no polarisation correction", NULL},
    {"solid_angle", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL, "divide by the pixels' relative solid angle", NULL},
    {"error_model", BEAM_P_ENUM, "none", 0, 0, 0, "none|poisson", NULL,
     "poisson: variance = max(counts, 1), publishes sigma", NULL},
    {"dummy", BEAM_P_FLOAT, NULL, 0, -1e300, 1e300, NULL, NULL,
     "pixel value marking a bad pixel (also the value of empty bins); default: none", NULL},
    {"delta_dummy", BEAM_P_FLOAT, "0", 0, 0, 1e300, NULL, NULL, "|value - dummy| <= delta_dummy is bad (0: exact)", NULL},
    {"threads", BEAM_P_INT, "1", 0, 0, BEAM_AZINT_MAX_THREADS, NULL, NULL,
     "cpu backend: threads sharing each frame's bins (0 = one per online core)", NULL},
    BEAM_PARAM_END};

static const char *const geom_keys[] = {"dist", "poni1", "poni2", "rot1", "rot2", "rot3",
                                        "wavelength", "pixel1", "pixel2"};
/* Keys without a default that a geometry without a .poni file needs. */
static const char *const geom_required[] = {"dist", "poni1", "poni2", "wavelength", "pixel1", "pixel2"};

/* A synthetic default node has line 0; only keys the user wrote count. */
static int given(const beam_cnode_t *cfg, const char *key) {
  const beam_cnode_t *n = beam_cfg_get(cfg, key);
  return n && n->line > 0;
}

static int range_ok(const beam_cnode_t *seq) {
  if (!seq || beam_cfg_len(seq) != 2)
    return 0;
  double a = beam__cfg_item_num(beam_cfg_at(seq, 0)), b = beam__cfg_item_num(beam_cfg_at(seq, 1));
  return a < b;
}

int beam_azint_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs) {
  int n = 0;
  if (beam_cfg_get(cfg, "poni")) {
    for (size_t k = 0; k < sizeof geom_keys / sizeof *geom_keys; k++)
      if (given(cfg, geom_keys[k])) {
        beam_cfg_err(errs, beam_cfg_get(cfg, geom_keys[k]),
                     "stage azint: %s and poni are exclusive (the .poni file holds the geometry)",
                     geom_keys[k]);
        n++;
      }
  } else {
    for (size_t k = 0; k < sizeof geom_required / sizeof *geom_required; k++)
      if (!beam_cfg_get(cfg, geom_required[k])) {
        beam_cfg_err(errs, cfg, "stage azint: %s is required without a poni file", geom_required[k]);
        n++;
      }
  }
  static const char *const ranges[] = {"radial_range", "azimuth_range"};
  for (int k = 0; k < 2; k++) {
    const beam_cnode_t *r = beam_cfg_get(cfg, ranges[k]);
    if (r && !range_ok(r)) {
      beam_cfg_err(errs, r, "stage azint: %s must be [min, max] with min < max", ranges[k]);
      n++;
    }
  }
  return n;
}

/* ---- init ------------------------------------------------------------------- */

int beam_azint_conf_load(beam_azint_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  const char *poni = beam_cfg_str(cfg, "poni");
  int rc;
  if (poni) {
    for (size_t k = 0; k < sizeof geom_keys / sizeof *geom_keys; k++)
      if (given(cfg, geom_keys[k]))
        return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": %s and poni are exclusive", geom_keys[k]);
    if ((rc = beam_azint_poni_load(poni, &c->g, d)) < 0)
      return rc;
  } else {
    for (size_t k = 0; k < sizeof geom_required / sizeof *geom_required; k++)
      if (!beam_cfg_get(cfg, geom_required[k]))
        return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": %s is required without a poni file", geom_required[k]);
    double *dst[] = {&c->g.dist, &c->g.poni1, &c->g.poni2, &c->g.rot1, &c->g.rot2, &c->g.rot3,
                     &c->g.wavelength, &c->g.pixel1, &c->g.pixel2};
    for (size_t k = 0; k < sizeof geom_keys / sizeof *geom_keys; k++)
      *dst[k] = beam_cfg_float(cfg, geom_keys[k], 0.0);
  }
  if (!(c->g.dist > 0) || !(c->g.wavelength > 0) || !(c->g.pixel1 > 0) || !(c->g.pixel2 > 0))
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": dist, wavelength and pixel sizes must be > 0 "
                     "(dist %g, wavelength %g, pixel1 %g, pixel2 %g)",
                     c->g.dist, c->g.wavelength, c->g.pixel1, c->g.pixel2);
  const char *u = beam_cfg_str(cfg, "unit");
  c->unit = !u || !strcmp(u, "q_nm^-1") ? BEAM_AZINT_Q_NM : !strcmp(u, "q_A^-1") ? BEAM_AZINT_Q_A
                                                                                  : BEAM_AZINT_2TH_DEG;
  int64_t npt = beam_cfg_int(cfg, "npt", 0), na = beam_cfg_int(cfg, "npt_azim", 0);
  if (npt < 1 || npt > BEAM_AZINT_MAX_BINS || na < 0 || (uint64_t)na * (uint64_t)npt > BEAM_AZINT_MAX_BINS)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": npt %lld x npt_azim %lld: at most %u bins", (long long)npt,
                     (long long)na, BEAM_AZINT_MAX_BINS);
  c->npt = (uint32_t)npt;
  c->npt_azim = (uint32_t)na;
  const beam_cnode_t *rr = beam_cfg_get(cfg, "radial_range"), *ar = beam_cfg_get(cfg, "azimuth_range");
  if (rr) {
    if (!range_ok(rr))
      return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": radial_range must be [min, max] with min < max");
    c->has_rrange = 1;
    c->rrange[0] = beam__cfg_item_num(beam_cfg_at(rr, 0));
    c->rrange[1] = beam__cfg_item_num(beam_cfg_at(rr, 1));
  }
  if (ar) {
    if (!range_ok(ar))
      return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": azimuth_range must be [min, max] with min < max");
    c->has_arange = 1;
    c->arange[0] = beam__cfg_item_num(beam_cfg_at(ar, 0));
    c->arange[1] = beam__cfg_item_num(beam_cfg_at(ar, 1));
    if (!(c->arange[0] >= -180 && c->arange[1] <= 180))
      return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": azimuth_range must lie within [-180, 180] degrees");
  }
  const char *split = beam_cfg_str(cfg, "split");
  c->split_bbox = !split || !strcmp(split, "bbox");
  c->solid_angle = beam_cfg_bool(cfg, "solid_angle", 1);
  if (beam_cfg_get(cfg, "polarization_factor")) {
    c->has_pol = 1;
    c->pol = beam_cfg_float(cfg, "polarization_factor", 0.0);
  }
  const char *em = beam_cfg_str(cfg, "error_model");
  c->poisson = em && !strcmp(em, "poisson");
  if (beam_cfg_get(cfg, "dummy")) {
    c->has_dummy = 1;
    c->dummy = beam_cfg_float(cfg, "dummy", 0.0);
  }
  c->delta_dummy = beam_cfg_float(cfg, "delta_dummy", 0.0);
  int64_t th = beam_cfg_int(cfg, "threads", 1);
  if (th < 0 || th > BEAM_AZINT_MAX_THREADS)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": threads must be 0..%d", BEAM_AZINT_MAX_THREADS);
  c->threads = (unsigned)th;
  const char *mask = beam_cfg_str(cfg, "mask");
  if (mask && !strcmp(mask, "series")) {
    c->mask_series = 1;
  } else if (mask) {
    const char *ds = beam_cfg_str(cfg, "mask_dataset");
    beam_diag_t sub = {0};
    if ((rc = beam_array_load(mask, ds ? ds : "/data", &c->mask, &sub)) < 0)
      return BEAM_DIAG(d, rc, WHO ": mask: %s", sub.msg);
    if (c->mask.dtype == BEAM_DT_C64 || c->mask.dtype == BEAM_DT_C128) {
      beam_array_free(&c->mask);
      return BEAM_DIAG(d, BEAM_ENOTSUP, WHO ": mask: %s holds complex numbers", mask);
    }
  }
  return 0;
}

void beam_azint_conf_free(beam_azint_conf_t *c) { beam_array_free(&c->mask); }

/* ---- the matrices ------------------------------------------------------------- */

/* pyFAI's calc_upper_bound: the largest position, nudged up by one float32
 * epsilon so that it falls inside the last bin. */
static double upper_bound(double x) {
  const double eps32 = 1.0 + 1.1920928955078125e-07;
  return x > 0 ? x * eps32 : x / eps32;
}

/* Per-pixel positions: centre c0 (radial, internal unit), c1 (chi, rad),
 * and with bbox the half-widths d0, d1 (max centre-corner distance). */
typedef struct pix_s {
  double *c0, *d0, *c1, *d1;
} pix_t;

static void pix_free(pix_t *p) {
  free(p->c0), free(p->d0), free(p->c1), free(p->d1);
  memset(p, 0, sizeof *p);
}

static double chi_dist(double a, double b) {
  double x = fabs(a - b);
  return x > M_PI ? 2.0 * M_PI - x : x;
}

/* Pixel centre relative to the PONI as pyFAI 0.21 computes it: its arrays
 * come from numpy.fromfunction(..., dtype=float32), so the detector
 * position (i + 0.5) pixel1 and its difference with poni1 are float32
 * operations (numpy 1.x casting); the rotations are then double. Doing
 * the same keeps the bin boundaries within double rounding of pyFAI's. */
static void center_pos(const beam_azint_geom_t *g, uint32_t y, uint32_t x, double *p1, double *p2) {
  float a = (float)y + 0.5f, b = (float)x + 0.5f;
  float P1 = a * (float)g->pixel1, P2 = b * (float)g->pixel2;
  *p1 = (float)(P1 - (float)g->poni1);
  *p2 = (float)(P2 - (float)g->poni2);
}

static int pix_build(pix_t *p, const beam_azint_conf_t *c, uint32_t h, uint32_t w, float *norm) {
  const beam_azint_geom_t *g = &c->g;
  size_t n = (size_t)h * w;
  p->c0 = malloc(n * sizeof(double));
  p->c1 = malloc(n * sizeof(double));
  if (c->split_bbox) {
    p->d0 = malloc(n * sizeof(double));
    p->d1 = malloc(n * sizeof(double));
  }
  /* One row of corners at a time: (w + 1) radial and chi values, top and
   * bottom edge of the pixel row. */
  double *cr = malloc(2 * (size_t)(w + 1) * sizeof(double)), *cc = malloc(2 * (size_t)(w + 1) * sizeof(double));
  if (!p->c0 || !p->c1 || (c->split_bbox && (!p->d0 || !p->d1)) || !cr || !cc) {
    free(cr), free(cc);
    pix_free(p);
    return -1;
  }
  for (uint32_t i = 0; i <= h; i++) {
    double *r = cr + (size_t)(i & 1) * (w + 1), *ch = cc + (size_t)(i & 1) * (w + 1);
    if (c->split_bbox)
      for (uint32_t j = 0; j <= w; j++) {
        double tth, chi;
        /* pyFAI's detector corners are float32 (get_pixel_corners) */
        double q1 = (float)((float)i * (float)g->pixel1), q2 = (float)((float)j * (float)g->pixel2);
        beam_azint_tth_chi(g, q1 - g->poni1, q2 - g->poni2, &tth, &chi);
        /* pyFAI's corner_array is float32: the box half-widths come from
         * rounded corners, which moves the automatic range by ~1e-7. */
        r[j] = (float)beam_azint_radial(g, c->unit, tth);
        ch[j] = (float)chi;
      }
    if (i == 0)
      continue;
    uint32_t y = i - 1;
    const double *rt = cr + (size_t)(y & 1) * (w + 1), *ct = cc + (size_t)(y & 1) * (w + 1);
    for (uint32_t x = 0; x < w; x++) {
      size_t k = (size_t)y * w + x;
      double p1, p2;
      center_pos(g, y, x, &p1, &p2);
      double tth, chi;
      beam_azint_tth_chi(g, p1, p2, &tth, &chi);
      double c0 = beam_azint_radial(g, c->unit, tth);
      p->c0[k] = c0;
      p->c1[k] = chi;
      double nv = 1.0;
      if (c->solid_angle)
        nv *= (float)beam_azint_solid_angle(g, p1, p2);
      if (c->has_pol)
        nv *= (float)beam_azint_polarization(tth, chi, c->pol);
      norm[k] = (float)nv;
      if (!c->split_bbox)
        continue;
      /* corners (y, x), (y, x+1) on the top edge, (y+1, x), (y+1, x+1) below */
      double cr4[4] = {rt[x], rt[x + 1], r[x], r[x + 1]}, cc4[4] = {ct[x], ct[x + 1], ch[x], ch[x + 1]};
      double d0 = 0, d1 = 0;
      for (int q = 0; q < 4; q++) {
        double a = fabs(cr4[q] - c0), b = chi_dist(cc4[q], chi);
        d0 = a > d0 ? a : d0;
        d1 = b > d1 ? b : d1;
      }
      p->d0[k] = d0;
      p->d1[k] = d1;
    }
  }
  free(cr), free(cc);
  return 0;
}

typedef struct bounds_s {
  double min0, max0, delta0; /* radial, internal unit */
  int check1;                /* 1-D: azimuth_range given */
  double min1, maxin1, delta1;
} bounds_t;

static int masked(const beam_array_t *m, size_t k) { return m && beam_array_get(m, k) != 0.0; }

/* pyFAI calc_boundaries + SplitBBoxIntegrator.__init__ (2022). */
static void calc_bounds(const beam_azint_conf_t *c, const pix_t *p, size_t n, const uint8_t *bad,
                        int cake, bounds_t *b) {
  double min0 = INFINITY, max0 = -INFINITY, min1 = INFINITY, max1 = -INFINITY;
  for (size_t k = 0; k < n; k++) {
    if (bad[k])
      continue;
    double d0 = p->d0 ? p->d0[k] : 0, d1 = p->d1 ? p->d1[k] : 0;
    if (p->c0[k] + d0 > max0) max0 = p->c0[k] + d0;
    if (p->c0[k] - d0 < min0) min0 = p->c0[k] - d0;
    if (p->c1[k] + d1 > max1) max1 = p->c1[k] + d1;
    if (p->c1[k] - d1 < min1) min1 = p->c1[k] - d1;
  }
  if (!(min0 <= max0)) /* every pixel masked */
    min0 = max0 = min1 = max1 = 0;
  min0 = fmax(0.0, min0);
  max0 = fmax(0.0, max0);
  /* pyFAI clips chi to ±π as a float32 constant (3.14159274) */
  max1 = fmin(max1, (double)(float)M_PI);
  min1 = fmax(min1, -(double)(float)M_PI);
  double s = beam_azint_scale(c->unit);
  if (c->has_rrange)
    min0 = c->rrange[0] / s, max0 = c->rrange[1] / s;
  if (c->has_arange)
    min1 = c->arange[0] * M_PI / 180.0, max1 = c->arange[1] * M_PI / 180.0;
  b->min0 = min0;
  b->max0 = upper_bound(max0);
  b->delta0 = (b->max0 - b->min0) / c->npt;
  b->check1 = !cake && c->has_arange;
  b->min1 = min1;
  b->maxin1 = max1;
  b->delta1 = cake ? (upper_bound(max1) - min1) / c->npt_azim : 0;
}

/* The entries of one pixel, (row, coefficient), by pyFAI's calc_lut_1d /
 * calc_lut_2d (including their handling of the clipped end bins). Calls
 * put(ctx, row, coef) for each. */
typedef void (*put_fn)(void *ctx, uint32_t row, double coef);

/* pyFAI's <Py_ssize_t> cast (truncation toward zero), clamped so that a
 * pixel far outside a narrow radial_range cannot overflow the cast. */
static int64_t trunc_bin(double f) {
  if (!(f > -1e15))
    return -(int64_t)1e15;
  return f < 1e15 ? (int64_t)f : (int64_t)1e15;
}

static void entries_1d(const bounds_t *b, uint32_t bins, double c0, double d0, double c1, double d1,
                       put_fn put, void *ctx) {
  if (b->check1 && ((c1 + d1 < b->min1) || (c1 - d1 > b->maxin1)))
    return;
  double f0 = (c0 - d0 - b->min0) / b->delta0, f1 = (c0 + d0 - b->min0) / b->delta0;
  int64_t lo = trunc_bin(f0), hi = trunc_bin(f1);
  if (hi < 0 || lo >= (int64_t)bins)
    return;
  if (hi > (int64_t)bins - 1) hi = bins - 1;
  if (lo < 0) lo = 0;
  if (lo == hi) {
    put(ctx, (uint32_t)lo, 1.0);
    return;
  }
  double inv = 1.0 / (f1 - f0);
  put(ctx, (uint32_t)lo, inv * ((double)(lo + 1) - f0));
  put(ctx, (uint32_t)hi, inv * (f1 - (double)hi));
  for (int64_t k = lo + 1; k < hi; k++)
    put(ctx, (uint32_t)k, inv);
}

/* Row of cake bin (radial i, azimuthal j): j * npt + i (chi-major, the
 * cake's [npt_azim, npt] layout; pyFAI stores i * npt_azim + j and
 * transposes at the end). */
static void entries_2d(const bounds_t *b, uint32_t n0, uint32_t n1, double c0, double d0,
                       double c1, double d1, put_fn put, void *ctx) {
  double f0a = (c0 - d0 - b->min0) / b->delta0, f0b = (c0 + d0 - b->min0) / b->delta0;
  double f1a = (c1 - d1 - b->min1) / b->delta1, f1b = (c1 + d1 - b->min1) / b->delta1;
  int64_t i0 = trunc_bin(f0a), i1 = trunc_bin(f0b), j0 = trunc_bin(f1a), j1 = trunc_bin(f1b);
  if (i1 < 0 || i0 >= (int64_t)n0 || j1 < 0 || j0 >= (int64_t)n1)
    return;
  if (i1 > (int64_t)n0 - 1) i1 = n0 - 1;
  if (i0 < 0) i0 = 0;
  if (j1 > (int64_t)n1 - 1) j1 = n1 - 1;
  if (j0 < 0) j0 = 0;
#define ROW(i, j) ((uint32_t)((j) * (int64_t)n0 + (i)))
  if (i0 == i1) {
    if (j0 == j1) {
      put(ctx, ROW(i0, j0), 1.0);
      return;
    }
    double down = (double)(j0 + 1) - f1a, up = f1b - (double)j1, inv = 1.0 / (f1b - f1a);
    put(ctx, ROW(i0, j0), inv * down);
    put(ctx, ROW(i0, j1), inv * up);
    for (int64_t j = j0 + 1; j < j1; j++)
      put(ctx, ROW(i0, j), inv);
    return;
  }
  double left = (double)(i0 + 1) - f0a, right = f0b - (double)i1;
  if (j0 == j1) {
    double inv = 1.0 / (f0b - f0a);
    put(ctx, ROW(i0, j0), inv * left);
    put(ctx, ROW(i1, j0), inv * right);
    for (int64_t i = i0 + 1; i < i1; i++)
      put(ctx, ROW(i, j0), inv);
    return;
  }
  double down = (double)(j0 + 1) - f1a, up = f1b - (double)j1;
  double inv = 1.0 / ((f0b - f0a) * (f1b - f1a));
  put(ctx, ROW(i0, j0), inv * left * down);
  put(ctx, ROW(i0, j1), inv * left * up);
  put(ctx, ROW(i1, j0), inv * right * down);
  put(ctx, ROW(i1, j1), inv * right * up);
  for (int64_t i = i0 + 1; i < i1; i++) {
    put(ctx, ROW(i, j0), inv * down);
    for (int64_t j = j0 + 1; j < j1; j++)
      put(ctx, ROW(i, j), inv);
    put(ctx, ROW(i, j1), inv * up);
  }
  for (int64_t j = j0 + 1; j < j1; j++) {
    put(ctx, ROW(i0, j), inv * left);
    put(ctx, ROW(i1, j), inv * right);
  }
#undef ROW
}

/* Two passes over the pixels: count per row, then fill (pixel order, so
 * each row's pixels increase, as pyFAI's SparseBuilder keeps them). */
typedef struct fill_s {
  beam_azint_csr_t *m;
  uint64_t *cur;
  uint32_t pixel;
  int counting;
} fill_t;

static void put_entry(void *ctx, uint32_t row, double coef) {
  fill_t *f = ctx;
  if (f->counting) {
    f->m->ptr[row + 1]++;
    return;
  }
  uint64_t k = f->cur[row]++;
  f->m->idx[k] = f->pixel;
  f->m->w[k] = (float)coef;
}

static void csr_free(beam_azint_csr_t *m) {
  free(m->ptr), free(m->idx), free(m->w);
  memset(m, 0, sizeof *m);
}

static int csr_build(beam_azint_csr_t *m, const beam_azint_conf_t *c, const pix_t *p, size_t n,
                     const uint8_t *bad, int cake, const bounds_t *b) {
  uint32_t rows = cake ? c->npt * c->npt_azim : c->npt;
  m->nrows = rows;
  m->ptr = calloc((size_t)rows + 1, sizeof *m->ptr);
  if (!m->ptr)
    return -1;
  fill_t f = {m, NULL, 0, 1};
  for (int pass = 0; pass < 2; pass++) {
    for (size_t k = 0; k < n; k++) {
      if (bad[k])
        continue;
      f.pixel = (uint32_t)k;
      double d0 = p->d0 ? p->d0[k] : 0, d1 = p->d1 ? p->d1[k] : 0;
      if (cake)
        entries_2d(b, c->npt, c->npt_azim, p->c0[k], d0, p->c1[k], d1, put_entry, &f);
      else
        entries_1d(b, c->npt, p->c0[k], d0, p->c1[k], d1, put_entry, &f);
    }
    if (pass == 1)
      break;
    for (uint32_t r = 0; r < rows; r++)
      m->ptr[r + 1] += m->ptr[r];
    m->nnz = m->ptr[rows];
    if (m->nnz > BEAM_AZINT_MAX_NNZ)
      return 1;
    m->idx = malloc((m->nnz ? m->nnz : 1) * sizeof *m->idx);
    m->w = malloc((m->nnz ? m->nnz : 1) * sizeof *m->w);
    f.cur = malloc(((size_t)rows + 1) * sizeof *f.cur);
    if (!m->idx || !m->w || !f.cur) {
      free(f.cur);
      return -1;
    }
    memcpy(f.cur, m->ptr, (size_t)rows * sizeof *f.cur);
    f.counting = 0;
  }
  free(f.cur);
  return 0;
}

/* Σ c·norm and Σ c per row, in the reference's order and arithmetic. */
static double *pre_sums(const beam_azint_csr_t *m, const float *norm) {
  double *pre = malloc(2 * ((size_t)m->nrows ? m->nrows : 1) * sizeof *pre);
  if (!pre)
    return NULL;
  for (uint32_t r = 0; r < m->nrows; r++) {
    double nrm = 0, cnt = 0;
    for (uint64_t j = m->ptr[r]; j < m->ptr[r + 1]; j++) {
      double cf = (double)m->w[j];
      nrm += cf * (double)norm[m->idx[j]];
      cnt += cf;
    }
    pre[r] = nrm;
    pre[m->nrows + r] = cnt;
  }
  return pre;
}

void beam_azint_tab_free(beam_azint_tab_t *t) {
  csr_free(&t->r1);
  csr_free(&t->r2);
  free(t->pre1), free(t->pre2);
  free(t->norm), free(t->radial), free(t->chi);
  memset(t, 0, sizeof *t);
}

int beam_azint_tab_build(beam_azint_tab_t *t, const beam_azint_conf_t *c, uint32_t h, uint32_t w,
                         const beam_array_t *mask, beam_diag_t *d) {
  beam_azint_tab_free(t);
  size_t n = (size_t)h * w;
  int rc = 0;
  pix_t p = {0};
  uint8_t *bad = calloc(n ? n : 1, 1);
  t->h = h, t->w = w;
  t->norm = malloc(n * sizeof *t->norm);
  t->radial = malloc(c->npt * sizeof *t->radial);
  t->chi = malloc((c->npt_azim ? c->npt_azim : 1) * sizeof *t->chi);
  if (!bad || !t->norm || !t->radial || !t->chi || pix_build(&p, c, h, w, t->norm) < 0)
    goto nomem;
  for (size_t k = 0; k < n; k++)
    bad[k] = (uint8_t)masked(mask, k);
  bounds_t b1, b2;
  calc_bounds(c, &p, n, bad, 0, &b1);
  if (!(b1.delta0 > 0)) {
    rc = BEAM_DIAG(d, BEAM_ESHAPE, WHO ": every pixel of the %ux%u frame is masked, or the unmasked "
                   "ones span no radial range", h, w);
    goto fail;
  }
  if ((rc = csr_build(&t->r1, c, &p, n, bad, 0, &b1)) != 0)
    goto built;
  double s = beam_azint_scale(c->unit);
  for (uint32_t i = 0; i < c->npt; i++)
    t->radial[i] = (b1.min0 + (i + 0.5) * b1.delta0) * s;
  if (c->npt_azim) {
    calc_bounds(c, &p, n, bad, 1, &b2);
    if (!(b2.delta1 > 0)) {
      rc = BEAM_DIAG(d, BEAM_ESHAPE, WHO ": the unmasked pixels span no azimuthal range");
      goto fail;
    }
    if ((rc = csr_build(&t->r2, c, &p, n, bad, 1, &b2)) != 0)
      goto built;
    for (uint32_t j = 0; j < c->npt_azim; j++)
      t->chi[j] = (b2.min1 + (j + 0.5) * b2.delta1) * 180.0 / M_PI;
  }
  if (!(t->pre1 = pre_sums(&t->r1, t->norm)) || (c->npt_azim && !(t->pre2 = pre_sums(&t->r2, t->norm))))
    goto nomem;
  pix_free(&p);
  free(bad);
  return 0;
built: /* csr_build: < 0 out of memory, 1 too many entries */
  if (rc > 0) {
    rc = BEAM_DIAG(d, BEAM_ELIMIT, WHO ": the %ux%u frame would need more than %llu matrix entries "
                   "(fewer bins, or split: none)", h, w, (unsigned long long)BEAM_AZINT_MAX_NNZ);
    goto fail;
  }
nomem:
  rc = BEAM_DIAG(d, BEAM_ENOMEM, WHO ": out of memory building the %ux%u pixel tables", h, w);
fail:
  pix_free(&p);
  free(bad);
  beam_azint_tab_free(t);
  return rc;
}

/* ---- outputs ------------------------------------------------------------------ */

void beam_azint_outs(const beam_azint_conf_t *c, beam_azint_outs_t *o) {
  int k = 0;
  o->I = k++;
  o->sigma = c->poisson ? k++ : -1;
  o->count = k++;
  o->radial = k++;
  o->cake = c->npt_azim ? k++ : -1;
  o->cake_sigma = c->npt_azim && c->poisson ? k++ : -1;
  o->cake_count = c->npt_azim ? k++ : -1;
  o->chi = c->npt_azim ? k++ : -1;
}

static const char *unit_name(beam_azint_unit_t u) {
  return u == BEAM_AZINT_2TH_DEG ? "2th_deg" : u == BEAM_AZINT_Q_A ? "q_A^-1" : "q_nm^-1";
}

int beam_azint_start(beam_stage_t *self, const beam_azint_conf_t *c, beam_azint_tab_t *t,
                     const beam_series_t *series, const beam_indesc_t *in, beam_diag_t *d) {
  char fs[64], ms[64];
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2 || in->shape[0] == 0 || in->shape[1] == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": frames must be 2-D and non-empty, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  uint32_t h = in->shape[0], w = in->shape[1];
  if ((uint64_t)h * w > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, WHO ": %ux%u frames have too many pixels", h, w);
  const beam_array_t *mask = c->mask.data ? &c->mask : NULL;
  if (c->mask_series) {
    int mrc = beam__series_real_array(series, WHO, "mask", "pixel_mask", &mask, d);
    if (mrc < 0)
      return mrc;
  }
  if (mask && (mask->ndim != 2 || mask->shape[0] != h || mask->shape[1] != w))
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": mask%s has shape %s but the frames are %s",
                     c->mask_series ? " (from the series)" : "",
                     beam_shape_str(mask->ndim, mask->shape, ms, sizeof ms),
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  int rc = beam_azint_tab_build(t, c, h, w, mask, d);
  if (rc < 0)
    return rc;
  beam_azint_outs_t o;
  beam_azint_outs(c, &o);
  uint32_t s1[1] = {c->npt}, s2[2] = {c->npt_azim, c->npt}, sc[1] = {c->npt_azim};
  self->nouts = 0;
  beam__declare(&self->outs[o.I], "intensity", BEAM_DT_F64, 1, s1, "counts", 1);
  if (o.sigma >= 0)
    beam__declare(&self->outs[o.sigma], "sigma", BEAM_DT_F64, 1, s1, "counts", 1);
  beam__declare(&self->outs[o.count], "count", BEAM_DT_F64, 1, s1, "pixels", 1);
  beam__declare(&self->outs[o.radial], "radial", BEAM_DT_F64, 1, s1, unit_name(c->unit), 0);
  self->outs[o.radial].slots = 2;
  if (o.cake >= 0) {
    beam__declare(&self->outs[o.cake], "cake", BEAM_DT_F64, 2, s2, "counts", 1);
    if (o.cake_sigma >= 0)
      beam__declare(&self->outs[o.cake_sigma], "cake_sigma", BEAM_DT_F64, 2, s2, "counts", 1);
    beam__declare(&self->outs[o.cake_count], "cake_count", BEAM_DT_F64, 2, s2, "pixels", 1);
    beam__declare(&self->outs[o.chi], "chi", BEAM_DT_F64, 1, sc, "deg", 0);
    self->outs[o.chi].slots = 2;
    double dr = c->npt > 1 ? t->radial[1] - t->radial[0] : 0, dc = c->npt_azim > 1 ? t->chi[1] - t->chi[0] : 0;
    int k = snprintf(t->axes_json, sizeof t->axes_json,
                     "{\"chi\": {\"origin\": %.17g, \"step\": %.17g, \"units\": \"deg\"}, "
                     "\"radial\": {\"origin\": %.17g, \"step\": %.17g, \"units\": \"%s\"}}",
                     t->chi[0], dc, t->radial[0], dr, unit_name(c->unit));
    const char *axes = k > 0 && (size_t)k < sizeof t->axes_json && dr > 0 && dc > 0 ? t->axes_json : NULL;
    self->outs[o.cake].labels_json = axes;
    if (o.cake_sigma >= 0)
      self->outs[o.cake_sigma].labels_json = axes;
    self->outs[o.cake_count].labels_json = axes;
  }
  int last = o.chi >= 0 ? o.chi : o.radial;
  for (int k = 0; k <= last; k++) {
    beam_outdesc_t *od = &self->outs[k];
    if (od->ndim == 1)
      od->axes[0] = k == o.chi ? "chi" : "radial";
    else
      od->axes[0] = "chi", od->axes[1] = "radial";
  }
  self->nouts = (unsigned)last + 1;
  return 0;
}

/* ---- per frame ----------------------------------------------------------------- */

#define APPLY_CASE(T, DT)                                                              \
  case DT: {                                                                           \
    const T *restrict x = px;                                                          \
    for (uint32_t r = r0; r < r1; r++) {                                               \
      double sig = 0, var = 0, nrm = 0, cnt = 0;                                       \
      for (uint64_t j = m->ptr[r]; j < m->ptr[r + 1]; j++) {                           \
        double v = (double)x[m->idx[j]], cf = (double)m->w[j];                         \
        if (!isfinite(v) ||                                                            \
            (c->has_dummy && (c->delta_dummy == 0 ? v == c->dummy                      \
                                                  : fabs(v - c->dummy) <= c->delta_dummy))) \
          continue;                                                                    \
        sig += cf * v;                                                                 \
        var += cf * cf * (v > 1.0 ? v : 1.0);                                          \
        nrm += cf * (double)norm[m->idx[j]];                                           \
        cnt += cf;                                                                     \
      }                                                                                \
      s->sig[r] = sig, s->var[r] = var, s->norm[r] = nrm, s->count[r] = cnt;           \
    }                                                                                  \
    break;                                                                             \
  }

void beam_azint_csr_apply(const beam_azint_csr_t *m, const beam_azint_conf_t *c, const float *norm,
                          beam_dtype_t dt, const void *px, uint32_t r0, uint32_t r1,
                          beam_azint_sums_t *s) {
  switch (dt) {
    BEAM__REAL_DTYPES(APPLY_CASE)
  default: BEAM_ASSERT(!"azint: dtype not accepted at start");
  }
}

void beam_azint_finish(const beam_azint_conf_t *c, const beam_azint_sums_t *s, uint32_t nb,
                       double *I, double *sigma, double *count) {
  double empty = c->has_dummy ? c->dummy : 0.0;
  for (uint32_t b = 0; b < nb; b++) {
    int ok = s->count[b] > 0.0;
    if (I)
      I[b] = ok ? s->sig[b] / s->norm[b] : empty;
    if (sigma)
      sigma[b] = ok ? sqrt(s->var[b]) / s->norm[b] : empty;
    if (count)
      count[b] = s->count[b];
  }
}

static int emit_axes(beam_emit_t *emit, const beam_azint_conf_t *c, const beam_azint_tab_t *t,
                     const beam_azint_outs_t *o) {
  beam_frame_t *f = beam_emit_get(emit, (unsigned)o->radial);
  if (!f)
    return 0;
  memcpy(f->data, t->radial, c->npt * sizeof(double));
  beam_emit_put(emit, f);
  if (o->chi >= 0 && (f = beam_emit_get(emit, (unsigned)o->chi))) {
    memcpy(f->data, t->chi, c->npt_azim * sizeof(double));
    beam_emit_put(emit, f);
  }
  return 0;
}

/* One result of nb doubles into output k from fill(); NULL sums: NaN. */
static void emit_one(beam_emit_t *emit, int k, const beam_azint_conf_t *c, const beam_azint_sums_t *s,
                     uint32_t nb, int what) {
  if (k < 0)
    return;
  beam_frame_t *f = beam_emit_get(emit, (unsigned)k);
  if (!f)
    return;
  double *v = f->data;
  if (!s)
    for (uint32_t b = 0; b < nb; b++)
      v[b] = NAN;
  else
    beam_azint_finish(c, s, nb, what == 0 ? v : NULL, what == 1 ? v : NULL, what == 2 ? v : NULL);
  beam_emit_put(emit, f);
}

int beam_azint_emit(beam_stage_t *self, const beam_azint_conf_t *c, const beam_azint_tab_t *t,
                    const beam_azint_sums_t *s1, const beam_azint_sums_t *s2, int *first,
                    beam_emit_t *emit) {
  beam_azint_outs_t o;
  beam_azint_outs(c, &o);
  if (*first) {
    emit_axes(emit, c, t, &o);
    *first = 0;
  }
  emit_one(emit, o.I, c, s1, c->npt, 0);
  emit_one(emit, o.sigma, c, s1, c->npt, 1);
  emit_one(emit, o.count, c, s1, c->npt, 2);
  uint32_t n2 = c->npt * c->npt_azim;
  emit_one(emit, o.cake, c, s2, n2, 0);
  emit_one(emit, o.cake_sigma, c, s2, n2, 1);
  emit_one(emit, o.cake_count, c, s2, n2, 2);
  return 0;
}

int beam_azint_emit_corrupt(beam_stage_t *self, const beam_azint_conf_t *c, const beam_azint_tab_t *t,
                            int *first, beam_emit_t *emit) {
  return beam_azint_emit(self, c, t, NULL, NULL, first, emit);
}
