/* Stage kind `com`: schema, and the host-side work both backends share
 * (parameters, mask, the runs of pixels inside the disc, scan bookkeeping,
 * and the scan maps: field, magnitude, divergence, curl, iDPC). Only the
 * per-frame sums differ between backends (com_cpu.c, gpu/com_cuda.cu). */
#include "pipeline/kern/com.h"
#include "pipeline/kern/from_series.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define FROM_SERIES "series"
/* Largest scan (positions), 4096 x 4096: the maps (24 bytes a position)
 * are a result every image_every frames, with 4 output slots, and the
 * iDPC needs two complex planes (32 bytes a position) besides. */
#define SCAN_MAX ((uint64_t)1 << 24)

const beam_param_t beam_com_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"cx", BEAM_P_FLOAT, NULL, 0, -1e9, 1e9, NULL, NULL,
     "disc centre and reference x in pixels (pixel centres at integers); default: (w - 1) / 2", NULL},
    {"cy", BEAM_P_FLOAT, NULL, 0, -1e9, 1e9, NULL, NULL,
     "disc centre and reference y in pixels; default: (h - 1) / 2", NULL},
    {"r", BEAM_P_FLOAT, NULL, 0, 0, 1e9, NULL, NULL,
     "disc radius in pixels (d <= r counts); default: the whole frame", NULL},
    {"ri", BEAM_P_FLOAT, "0", 0, 0, 1e9, NULL, NULL,
     "inner radius in pixels: d <= ri is left out (a ring); 0 = none", NULL},
    {"mask", BEAM_P_INFILE, NULL, 0, 0, 0, FROM_SERIES, NULL,
     "bad-pixel mask (.h5 or .npy, nonzero = left out); \"series\": the series' pixel_mask array", NULL},
    {"mask_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 mask file", NULL},
    {"scan_shape", BEAM_P_INT_LIST, NULL, 0, 1, 1e6, NULL, NULL,
     "[ny, nx] of the raster scan (frame id -> position); default: the series metadata's scan_shape", NULL},
    {"scan_rotation", BEAM_P_FLOAT, "0", 0, -360, 360, NULL, NULL,
     "degrees the shift is rotated by to scan axes (LiberTEM's scan_rotation)", NULL},
    {"flip_y", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL, "negate the detector y shift first (LiberTEM's flip_y)", NULL},
    {"idpc", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL, "add the integrated DPC potential to the maps", NULL},
    {"image_every", BEAM_P_INT, "256", 0, 1, 1e9, NULL, NULL,
     "publish the scan maps every N frames (and at series end)", NULL},
    BEAM_PARAM_END};

static const char COM_LABELS[] = "[\"x\",\"y\",\"shift_x\",\"shift_y\",\"sum\"]";
static const char MAP_LABELS[] = "[\"field_x\",\"field_y\",\"magnitude\",\"divergence\",\"curl\",\"idpc\"]";
static const char MAP_LABELS_NO_IDPC[] = "[\"field_x\",\"field_y\",\"magnitude\",\"divergence\",\"curl\"]";

/* ---- init ------------------------------------------------------------------ */

static int parse_scan(const beam_cnode_t *scan, uint32_t *ny, uint32_t *nx) {
  if (beam_cfg_len(scan) != 2)
    return -1;
  double v[2];
  for (size_t i = 0; i < 2; i++)
    v[i] = beam__cfg_item_num(beam_cfg_at(scan, i));
  if (!(v[0] >= 1 && v[0] <= 1e6 && v[1] >= 1 && v[1] <= 1e6))
    return -1;
  *ny = (uint32_t)v[0], *nx = (uint32_t)v[1];
  return 0;
}

static int init_conf(beam_com_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  const beam_cnode_t *cx = beam_cfg_get(cfg, "cx"), *cy = beam_cfg_get(cfg, "cy");
  if ((cx != NULL) != (cy != NULL))
    return BEAM_DIAG(d, BEAM_ECONFIG, "com: give both cx and cy, or neither (the frame centre)");
  if (cx) {
    c->has_center = 1;
    c->cx = beam_cfg_float(cfg, "cx", NAN);
    c->cy = beam_cfg_float(cfg, "cy", NAN);
    if (!isfinite(c->cx) || !isfinite(c->cy))
      return BEAM_DIAG(d, BEAM_ECONFIG, "com: cx and cy must be numbers");
  }
  c->r = beam_cfg_get(cfg, "r") ? beam_cfg_float(cfg, "r", NAN) : INFINITY;
  c->ri = beam_cfg_float(cfg, "ri", 0.0);
  if (!(c->r > 0))
    return BEAM_DIAG(d, BEAM_ECONFIG, "com: r must be > 0");
  if (!(c->ri >= 0 && c->ri < c->r))
    return BEAM_DIAG(d, BEAM_ECONFIG, "com: ri must be >= 0 and < r, got ri %g, r %g", c->ri, c->r);
  const beam_cnode_t *scan = beam_cfg_get(cfg, "scan_shape");
  if (scan) {
    if (parse_scan(scan, &c->scan_ny, &c->scan_nx) < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "com: scan_shape must be [ny, nx], each 1..1e6");
    if ((uint64_t)c->scan_ny * c->scan_nx > SCAN_MAX)
      return BEAM_DIAG(d, BEAM_ELIMIT, "com: a %u x %u scan exceeds %llu positions", c->scan_ny,
                       c->scan_nx, (unsigned long long)SCAN_MAX);
    c->scan_cfg = 1;
  }
  c->rot_deg = beam_cfg_float(cfg, "scan_rotation", 0.0);
  c->flip_y = beam_cfg_bool(cfg, "flip_y", 0);
  c->idpc = beam_cfg_bool(cfg, "idpc", 1);
  int64_t every = beam_cfg_int(cfg, "image_every", 256);
  c->image_every = every >= 1 ? (uint64_t)every : 1;
  const char *mask = beam_cfg_str(cfg, "mask");
  if (mask && !strcmp(mask, FROM_SERIES)) {
    c->mask_series = 1;
  } else if (mask) {
    const char *ds = beam_cfg_str(cfg, "mask_dataset");
    beam_diag_t sub = {0};
    int rc = beam_array_load(mask, ds ? ds : "/data", &c->mask, &sub);
    if (rc < 0)
      return BEAM_DIAG(d, rc, "com: mask: %s", sub.msg);
    if (!beam__dtype_real(c->mask.dtype) || c->mask.ndim != 2)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "com: mask %s must be a 2-D real image (nonzero = bad pixel)", mask);
  }
  return 0;
}

int beam_com_host_init(beam_com_host_t *h, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(h, 0, sizeof *h);
  int rc = init_conf(&h->conf, cfg, d);
  if (rc < 0)
    beam_com_host_free(h);
  return rc;
}

static void scan_free(beam_com_host_t *h) {
  if (h->p_fa) fftw_destroy_plan(h->p_fa);
  if (h->p_fb) fftw_destroy_plan(h->p_fb);
  if (h->p_inv) fftw_destroy_plan(h->p_inv);
  fftw_free(h->fa);
  fftw_free(h->fb);
  fftw_free(h->rbuf);
  h->rbuf = NULL;
  free(h->sx);
  free(h->sy);
  free(h->fx);
  free(h->fy);
  free(h->seen);
  h->p_fa = h->p_fb = h->p_inv = NULL;
  h->fa = h->fb = NULL;
  h->sx = h->sy = h->fx = h->fy = NULL;
  h->seen = NULL;
  h->scan_cap = 0;
  h->scan = 0;
}

void beam_com_host_free(beam_com_host_t *h) {
  beam_array_free(&h->conf.mask);
  free(h->run);
  free(h->idx);
  free(h->bad);
  scan_free(h);
  memset(h, 0, sizeof *h);
}

/* ---- start ------------------------------------------------------------------- */

int beam_com_inside(const beam_com_host_t *h, uint32_t y, uint32_t x) {
  const beam_com_conf_t *c = &h->conf;
  double dx = x - h->cx, dy = y - h->cy, d2 = dx * dx + dy * dy;
  if (!(d2 <= c->r * c->r))
    return 0;
  if (c->ri > 0 && d2 <= c->ri * c->ri)
    return 0;
  return !h->bad || !h->bad[(size_t)y * h->in.shape[1] + x];
}

static int build_runs(beam_com_host_t *h, int want_idx, beam_diag_t *d) {
  uint32_t hh = h->in.shape[0], w = h->in.shape[1];
  h->nrun = 0;
  h->npix = 0;
  for (uint32_t y = 0; y < hh; y++)
    for (uint32_t x = 0; x < w; x++) {
      if (!beam_com_inside(h, y, x))
        continue;
      h->npix++;
      beam_com_run_t *t = h->nrun ? &h->run[h->nrun - 1] : NULL;
      if (t && t->y == y && t->x0 + t->len == x) {
        t->len++;
        continue;
      }
      if (h->nrun == h->run_cap) {
        size_t nc = h->run_cap ? 2 * h->run_cap : 256;
        beam_com_run_t *v = realloc(h->run, nc * sizeof *v);
        if (!v)
          return BEAM_DIAG(d, BEAM_ENOMEM, "com: out of memory building pixel runs");
        h->run = v;
        h->run_cap = nc;
      }
      h->run[h->nrun++] = (beam_com_run_t){y, x, 1};
    }
  if (h->npix == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, "com: no pixel of the %ux%u frame is inside the disc "
                     "(centre %g, %g, r %g, ri %g) and unmasked", hh, w, h->cx, h->cy, h->conf.r,
                     h->conf.ri);
  free(h->idx);
  h->idx = NULL;
  if (want_idx) {
    h->idx = malloc(h->npix * sizeof *h->idx);
    if (!h->idx)
      return BEAM_DIAG(d, BEAM_ENOMEM, "com: out of memory (%llu pixel indices)",
                       (unsigned long long)h->npix);
    uint64_t k = 0;
    for (size_t i = 0; i < h->nrun; i++)
      for (uint32_t j = 0; j < h->run[i].len; j++)
        h->idx[k++] = h->run[i].y * w + h->run[i].x0 + j;
  }
  return 0;
}

static pthread_once_t fftw_once = PTHREAD_ONCE_INIT;
static void fftw_init_once(void) { fftw_make_planner_thread_safe(); }

static int scan_start(beam_com_host_t *h, const beam_series_t *series, beam_diag_t *d) {
  const beam_com_conf_t *c = &h->conf;
  uint32_t ny = c->scan_ny, nx = c->scan_nx;
  h->scan = c->scan_cfg;
  if (!h->scan) {
    int rc = beam__series_scan_shape(series, &ny, &nx);
    if (rc < 0)
      return BEAM_DIAG(d, BEAM_ESHAPE, "com: the series metadata's scan_shape is not [ny, nx] "
                       "(integers 1..1e6)");
    h->scan = rc;
    if (h->scan && (uint64_t)ny * nx > SCAN_MAX)
      return BEAM_DIAG(d, BEAM_ELIMIT, "com: the series' %u x %u scan exceeds %llu positions", ny,
                       nx, (unsigned long long)SCAN_MAX);
  }
  if (!h->scan)
    return 0;
  size_t n = (size_t)ny * nx;
  if (n > h->scan_cap || ny != h->ny || nx != h->nx || (c->idpc && !h->p_inv)) {
    scan_free(h);
    h->sx = malloc(n * sizeof *h->sx);
    h->sy = malloc(n * sizeof *h->sy);
    h->fx = malloc(n * sizeof *h->fx);
    h->fy = malloc(n * sizeof *h->fy);
    h->seen = malloc(n);
    if (c->idpc) {
      size_t nh = (size_t)ny * (nx / 2 + 1);
      h->fa = fftw_alloc_complex(nh);
      h->fb = fftw_alloc_complex(nh);
      h->rbuf = fftw_alloc_real(n);
    }
    if (!h->sx || !h->sy || !h->fx || !h->fy || !h->seen ||
        (c->idpc && (!h->fa || !h->fb || !h->rbuf))) {
      scan_free(h);
      return BEAM_DIAG(d, BEAM_ENOMEM, "com: cannot allocate the %u x %u scan buffers", ny, nx);
    }
    if (c->idpc) {
      pthread_once(&fftw_once, fftw_init_once);
      /* The fields are real: half spectra (r2c / c2r), half the work of
       * complex transforms. ESTIMATE plans touch no data and cost nothing
       * at start; MEASURE would take seconds for large scans. */
      h->p_fa = fftw_plan_dft_r2c_2d((int)ny, (int)nx, h->rbuf, h->fa, FFTW_ESTIMATE);
      h->p_fb = fftw_plan_dft_r2c_2d((int)ny, (int)nx, h->rbuf, h->fb, FFTW_ESTIMATE);
      h->p_inv = fftw_plan_dft_c2r_2d((int)ny, (int)nx, h->fa, h->rbuf, FFTW_ESTIMATE);
      if (!h->p_fa || !h->p_fb || !h->p_inv) {
        scan_free(h);
        return BEAM_DIAG(d, BEAM_ENOMEM, "com: FFTW could not plan a %u x %u transform", ny, nx);
      }
    }
    h->scan_cap = n;
    h->scan = 1;
  }
  h->ny = ny, h->nx = nx;
  for (size_t i = 0; i < n; i++)
    h->sx[i] = h->sy[i] = NAN;
  memset(h->seen, 0, n);
  h->nseen = 0;
  return 0;
}

static int same_shape(const beam_array_t *a, const beam_indesc_t *in) {
  return a->ndim == 2 && a->shape[0] == in->shape[0] && a->shape[1] == in->shape[1];
}

int beam_com_host_start(beam_stage_t *self, beam_com_host_t *h, const beam_series_t *series,
                        const beam_indesc_t *in, int want_idx, beam_diag_t *d) {
  const beam_com_conf_t *c = &h->conf;
  char fs[64], ms[64];
  h->scan = 0; /* nothing of the last series' scan survives a failed start */
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, "com: input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2 || in->shape[0] == 0 || in->shape[1] == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, "com: frames must be 2-D and non-empty, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  if ((uint64_t)in->shape[0] * in->shape[1] > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "com: %ux%u frames have too many pixels", in->shape[0], in->shape[1]);
  h->in = *in;
  const beam_array_t *mask = c->mask.data ? &c->mask : NULL;
  if (c->mask_series) {
    int rc = beam__series_real_array(series, "com", "mask", "pixel_mask", &mask, d);
    if (rc < 0)
      return rc;
  }
  if (mask && !same_shape(mask, in))
    return BEAM_DIAG(d, BEAM_ESHAPE, "com: mask%s has shape %s but the frames are %s",
                     c->mask_series ? " (from the series)" : "",
                     beam_shape_str(mask->ndim, mask->shape, ms, sizeof ms),
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  /* A copy: the series' array is not ours to keep past start. */
  free(h->bad);
  h->bad = NULL;
  if (mask) {
    size_t n = (size_t)in->shape[0] * in->shape[1];
    if (!(h->bad = malloc(n)))
      return BEAM_DIAG(d, BEAM_ENOMEM, "com: out of memory (mask of %zu pixels)", n);
    for (size_t i = 0; i < n; i++)
      h->bad[i] = beam_array_get(mask, i) != 0.0;
  }
  h->cx = c->has_center ? c->cx : (in->shape[1] - 1) / 2.0;
  h->cy = c->has_center ? c->cy : (in->shape[0] - 1) / 2.0;
  int rc = build_runs(h, want_idx, d);
  if (rc == 0)
    rc = scan_start(h, series, d);
  if (rc < 0) {
    h->nrun = 0;
    return rc;
  }
  uint32_t nshape[1] = {BEAM_COM_NVAL};
  self->nouts = 1;
  beam__declare(&self->outs[0], "com", BEAM_DT_F64, 1, nshape, "pixels", 1);
  self->outs[0].axes[0] = "value";
  self->outs[0].labels_json = COM_LABELS;
  if (h->scan) {
    h->nmaps = c->idpc ? BEAM_COM_NMAPS : BEAM_COM_NMAPS - 1;
    uint32_t ishape[3] = {h->nmaps, h->ny, h->nx};
    beam__declare(&self->outs[1], "maps", BEAM_DT_F32, 3, ishape, "pixels", 0);
    self->outs[1].axes[0] = "map";
    self->outs[1].labels_json = c->idpc ? MAP_LABELS : MAP_LABELS_NO_IDPC;
    self->outs[1].slots = 4;
    self->nouts = 2;
  }
  h->nframes = 0;
  h->ncorrupt = 0;
  return 0;
}

/* ---- per frame -------------------------------------------------------------- */

void beam_com_finish(const beam_com_host_t *h, const double s[3], double *out) {
  double x = s[0] != 0.0 ? s[1] / s[0] : NAN, y = s[0] != 0.0 ? s[2] / s[0] : NAN;
  out[BEAM_COM_X] = x;
  out[BEAM_COM_Y] = y;
  out[BEAM_COM_SHIFT_X] = x - h->cx;
  out[BEAM_COM_SHIFT_Y] = y - h->cy;
  out[BEAM_COM_SUM] = s[0];
}

void beam_com_host_record(beam_com_host_t *h, uint64_t frame_id, const double *out) {
  h->nframes++;
  if (!h->scan)
    return;
  size_t p = (size_t)(frame_id % ((uint64_t)h->ny * h->nx));
  h->sx[p] = out[BEAM_COM_SHIFT_X];
  h->sy[p] = out[BEAM_COM_SHIFT_Y];
  if (!h->seen[p]) {
    h->seen[p] = 1;
    h->nseen++;
  }
}

/* np.gradient along one axis of a row-major ny x nx array: stride 1 (x)
 * or nx (y), n points along it. */
static double grad_at(const double *f, size_t i, size_t k, size_t n, size_t stride) {
  if (n < 2)
    return 0.0;
  if (k == 0)
    return f[i + stride] - f[i];
  if (k == n - 1)
    return f[i] - f[i - stride];
  return (f[i + stride] - f[i - stride]) * 0.5;
}

/* The numerator's kx (ky) is taken as 0 on the Nyquist column (row) of an
 * even size: there +-1/2 are one frequency, and numpy's
 * Re(ifft2(...)) with fftfreq's -1/2 keeps exactly the Hermitian part,
 * in which that term cancels; the denominator keeps the full k^2. Half
 * spectra then give numpy's result (to rounding). */
static void idpc(beam_com_host_t *h, float *out) {
  size_t ny = h->ny, nx = h->nx, n = ny * nx, nxh = nx / 2 + 1;
  for (size_t i = 0; i < n; i++)
    h->rbuf[i] = isfinite(h->fx[i]) ? h->fx[i] : 0.0;
  fftw_execute(h->p_fa);
  for (size_t i = 0; i < n; i++)
    h->rbuf[i] = isfinite(h->fy[i]) ? h->fy[i] : 0.0;
  fftw_execute(h->p_fb);
  /* phi^ = (kx Fx + ky Fy) / (2 pi i k^2) = -i (kx Fx + ky Fy) / (2 pi k^2);
   * the 1/n of the inverse transform folded in. */
  for (size_t iy = 0; iy < ny; iy++) {
    double ky = (iy < (ny + 1) / 2 ? (double)iy : (double)iy - (double)ny) / (double)ny;
    double kyn = ny % 2 == 0 && iy == ny / 2 ? 0.0 : ky;
    for (size_t ix = 0; ix < nxh; ix++) {
      double kx = (ix < (nx + 1) / 2 ? (double)ix : (double)ix - (double)nx) / (double)nx;
      double kxn = nx % 2 == 0 && ix == nx / 2 ? 0.0 : kx;
      size_t i = iy * nxh + ix;
      double k2 = kx * kx + ky * ky;
      if (k2 == 0.0) {
        h->fa[i][0] = h->fa[i][1] = 0.0;
        continue;
      }
      double re = kxn * h->fa[i][0] + kyn * h->fb[i][0], im = kxn * h->fa[i][1] + kyn * h->fb[i][1];
      double s = 1.0 / (2.0 * M_PI * k2 * (double)n);
      h->fa[i][0] = im * s;
      h->fa[i][1] = -re * s;
    }
  }
  fftw_execute(h->p_inv);
  for (size_t i = 0; i < n; i++)
    out[i] = isfinite(h->fx[i]) && isfinite(h->fy[i]) ? (float)h->rbuf[i] : NAN;
}

void beam_com_compute_maps(beam_com_host_t *h, float *out) {
  const beam_com_conf_t *c = &h->conf;
  size_t ny = h->ny, nx = h->nx, n = ny * nx;
  double t = c->rot_deg * (M_PI / 180.0), ct = cos(t), st = sin(t);
  for (size_t i = 0; i < n; i++) {
    double yp = c->flip_y ? -h->sy[i] : h->sy[i];
    h->fy[i] = ct * yp + st * h->sx[i];
    h->fx[i] = -st * yp + ct * h->sx[i];
  }
  float *fx = out + BEAM_COM_M_FIELD_X * n, *fy = out + BEAM_COM_M_FIELD_Y * n,
        *mag = out + BEAM_COM_M_MAG * n, *div = out + BEAM_COM_M_DIV * n,
        *curl = out + BEAM_COM_M_CURL * n;
  for (size_t iy = 0; iy < ny; iy++)
    for (size_t ix = 0; ix < nx; ix++) {
      size_t i = iy * nx + ix;
      fx[i] = (float)h->fx[i];
      fy[i] = (float)h->fy[i];
      mag[i] = (float)sqrt(h->fx[i] * h->fx[i] + h->fy[i] * h->fy[i]);
      double dfy_dy = grad_at(h->fy, i, iy, ny, nx), dfx_dx = grad_at(h->fx, i, ix, nx, 1);
      double dfy_dx = grad_at(h->fy, i, ix, nx, 1), dfx_dy = grad_at(h->fx, i, iy, ny, nx);
      div[i] = (float)(dfy_dy + dfx_dx);
      curl[i] = (float)(dfy_dx - dfx_dy);
    }
  if (c->idpc)
    idpc(h, out + BEAM_COM_M_IDPC * n);
}

int beam_com_host_maps(beam_stage_t *self, beam_com_host_t *h, beam_emit_t *emit, int final) {
  if (!h->scan || (!final && h->nframes % h->conf.image_every != 0))
    return 0;
  beam_frame_t *f = beam_emit_get(emit, 1);
  if (!f)
    return 0;
  beam_com_compute_maps(h, f->data);
  uint32_t fl = BEAM_FLAG_PARTIAL;
  if (final) {
    fl = BEAM_FLAG_FINAL;
    if (h->nseen < (uint64_t)h->ny * h->nx || h->ncorrupt || self->end_missing)
      fl |= BEAM_FLAG_INCOMPLETE;
    if (self->end_aborted)
      fl |= BEAM_FLAG_ABORTED;
  }
  f->flags = fl;
  beam_emit_put(emit, f);
  return 0;
}

int beam_com_host_corrupt(beam_stage_t *self, beam_com_host_t *h, beam_emit_t *emit) {
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  double *v = f->data;
  for (int i = 0; i < BEAM_COM_NVAL; i++)
    v[i] = NAN;
  h->ncorrupt++;
  beam_com_host_record(h, f->frame_id, v);
  beam_emit_put(emit, f);
  return beam_com_host_maps(self, h, emit, 0);
}
