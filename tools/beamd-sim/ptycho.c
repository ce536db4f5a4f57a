/* beamd-sim ptycho pattern: far-field ptychography with a known answer.
 *
 * Model (docs/ptycho.md "Simulated scans"): object O on the grid of
 * beam_ptycho_place (object pixel lambda z / (n p)), probe modes P_j from
 * beam_ptycho_probe_zone_plate with sum_j ||P_j||^2 = --photons, scan
 * points in metres, and for scan point k with window offset (r_k, c_k):
 *     I_k = sum_j |F[P_j . O[r_k : r_k + n, c_k : c_k + n]]|^2
 * with F the unitary FFT, fftshifted and centred on the beam centre
 * (H/2, W/2) of the frame; pixels outside the n x n pattern are 0. The
 * windows use the same placement (rounding) as beamd-ptycho and the live
 * stage, so a noise-free scan is exactly consistent with the engine's
 * integer-shift model and a reconstruction can reach the truth.
 * Everything is a function of --seed: object blobs, raster jitter, and the
 * Poisson stream of each frame (seeded by frame id, so frames render in
 * any order).
 */
#include "tools/beamd-sim/ptycho_int.h"
#include "tools/beamd-sim/rng.h"

#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"

#define GOLDEN_ANGLE 2.39996322972865332 /* pi (3 - sqrt 5) */
#define BLOBS 14
#define MAX_OBJ_SIDE 16384u

void sim_ptycho_defaults(sim_opts_t *o) {
  o->pty_n = 0;
  o->pty_energy = 8000.0;
  o->pty_distance = 2.0;
  o->pty_pixel = 75e-6;
  o->pty_photons = 1e6;
  o->pty_poisson = 0;
  o->pty_raster = 0;
  o->pty_step = 0.25e-6;
  o->pty_jitter = 0.1;
  o->pty_probe_modes = 1;
  o->pty_zp_diam = 100e-6;
  o->pty_zp_drn = 130e-9;
  o->pty_zp_cs = 40e-6;
  o->pty_defocus = 1.1e-3;
  o->pty_object_file = NULL;
  o->write_h5 = NULL;
}

int sim_ptycho_opt(int code, const char *arg, sim_opts_t *o) {
  uint64_t u;
  switch (code) {
  case SIM_PTY_N:
    if (tool_parse_u64("ptycho-n", arg, 8, 4096, &u)) return -1;
    o->pty_n = (uint32_t)u;
    return 0;
  case SIM_PTY_ENERGY: return tool_parse_double("energy", arg, 1, 1e7, "eV in 1..1e7", &o->pty_energy);
  case SIM_PTY_DISTANCE: return tool_parse_double("distance", arg, 1e-4, 1e3, "metres in 1e-4..1e3", &o->pty_distance);
  case SIM_PTY_PIXEL: return tool_parse_double("pixel-size", arg, 1e-8, 1e-2, "metres in 1e-8..1e-2", &o->pty_pixel);
  case SIM_PTY_PHOTONS: return tool_parse_double("photons", arg, 1e-3, 1e15, "photons per frame in 1e-3..1e15", &o->pty_photons);
  case SIM_PTY_NOISE:
    if (!strcmp(arg, "poisson")) o->pty_poisson = 1;
    else if (!strcmp(arg, "none")) o->pty_poisson = 0;
    else return tool_bad("noise", arg, "poisson or none");
    return 0;
  case SIM_PTY_SCAN:
    if (!strcmp(arg, "fermat")) o->pty_raster = 0;
    else if (!strcmp(arg, "raster")) o->pty_raster = 1;
    else return tool_bad("scan", arg, "fermat or raster");
    return 0;
  case SIM_PTY_STEP: return tool_parse_double("scan-step", arg, 1e-12, 1, "metres in 1e-12..1", &o->pty_step);
  case SIM_PTY_JITTER: return tool_parse_double("scan-jitter", arg, 0, 0.5, "a fraction of the step in 0..0.5", &o->pty_jitter);
  case SIM_PTY_MODES:
    if (tool_parse_u64("probe-modes", arg, 1, 16, &u)) return -1;
    o->pty_probe_modes = (uint32_t)u;
    return 0;
  case SIM_PTY_ZP_DIAM: return tool_parse_double("zp-diameter", arg, 1e-7, 1e-1, "metres", &o->pty_zp_diam);
  case SIM_PTY_ZP_DRN: return tool_parse_double("zp-outer-zone", arg, 1e-10, 1e-4, "metres", &o->pty_zp_drn);
  case SIM_PTY_ZP_CS: return tool_parse_double("zp-stop", arg, 0, 1e-1, "metres", &o->pty_zp_cs);
  case SIM_PTY_DEFOCUS: return tool_parse_double("defocus", arg, -1, 1, "metres in -1..1", &o->pty_defocus);
  case SIM_PTY_OBJECT:
    if (!*arg) return tool_bad("ptycho-object", arg, "expected FILE.h5[:/dataset]");
    o->pty_object_file = arg;
    return 0;
  case SIM_PTY_WRITE_H5:
    if (!*arg) return tool_bad("write-h5", arg, "expected a path");
    o->write_h5 = arg;
    return 0;
  }
  return tool_bad("ptycho option", arg, "unknown");
}

int sim_ptycho_check(sim_opts_t *o) {
  if (!o->pty_n)
    o->pty_n = o->shape_set ? (o->h < o->w ? o->h : o->w) : 64;
  if (!o->shape_set)
    o->h = o->w = o->pty_n;
  if (o->pty_n > o->h || o->pty_n > o->w) {
    tool_log("--ptycho-n %u does not fit a %ux%u frame", o->pty_n, o->h, o->w);
    return -1;
  }
  if (o->pty_n % 2) {
    tool_log("--ptycho-n %u: must be even (the beam centre is pixel n/2)", o->pty_n);
    return -1;
  }
  if (o->frames == 0 || o->frames > (1u << 24)) {
    tool_log("--pattern ptycho: --frames is the number of scan points, 1..%u", 1u << 24);
    return -1;
  }
  if (o->pty_zp_cs >= o->pty_zp_diam) {
    tool_log("--zp-stop %g m is not smaller than --zp-diameter %g m", o->pty_zp_cs,
             o->pty_zp_diam);
    return -1;
  }
  return 0;
}

/* ---- scan ------------------------------------------------------------------ */

/* Fermat spiral (Huang et al., Opt. Express 22, 12634 (2014)): r_k = c sqrt k,
 * theta_k = k x golden angle; each point owns an area pi c^2, so the mean
 * spacing is about 1.8 c. Raster: a centred nx x ny grid of `step`, row
 * major, each point moved by up to +-jitter x step on each axis (a plain
 * raster has the periodic ambiguity of ptychography's "raster grid
 * pathology"). */
static void make_scan(sim_ptycho_t *s, const sim_opts_t *o) {
  sim_rng_t r;
  sim_rng_seed(&r, o->seed ^ 0x5ca9u);
  uint32_t nx = (uint32_t)ceil(sqrt((double)s->count));
  uint32_t ny = (s->count + nx - 1) / nx;
  for (uint32_t k = 0; k < s->count; k++) {
    double x, y;
    if (!o->pty_raster) {
      double rad = o->pty_step * sqrt((double)k), th = k * GOLDEN_ANGLE;
      x = rad * cos(th);
      y = rad * sin(th);
    } else {
      uint32_t ix = k % nx, iy = k / nx;
      x = (ix - (nx - 1) / 2.0) * o->pty_step;
      y = (iy - (ny - 1) / 2.0) * o->pty_step;
      x += o->pty_jitter * o->pty_step * (2.0 * sim_rng_uniform(&r) - 1.0);
      y += o->pty_jitter * o->pty_step * (2.0 * sim_rng_uniform(&r) - 1.0);
    }
    s->pos_xy[2 * k] = x;
    s->pos_xy[2 * k + 1] = y;
  }
}

/* ---- object ---------------------------------------------------------------- */

/* The built-in object: amplitude 0.9 - 0.4 x "blobs" (random Gaussian
 * blobs, from the seed) in [0.5, 0.9], phase 0.8 pi x ("rings" - 0.5)
 * (concentric cosine rings modulated by a 3-fold angular term) within
 * +-0.4 pi, so the phase never wraps and errors are easy to read. Both
 * vary over several object pixels: smooth, but with detail at every
 * scale the scan resolves. */
static void builtin_object(sim_ptycho_t *s) {
  uint32_t H = s->geom.obj_h, W = s->geom.obj_w;
  double L = H < W ? H : W;
  double by[BLOBS], bx[BLOBS], bs[BLOBS], ba[BLOBS];
  sim_rng_t r;
  sim_rng_seed(&r, s->seed ^ 0x0b1ec7u);
  for (int b = 0; b < BLOBS; b++) {
    by[b] = sim_rng_uniform(&r) * H;
    bx[b] = sim_rng_uniform(&r) * W;
    bs[b] = (0.03 + 0.06 * sim_rng_uniform(&r)) * L;
    ba[b] = 0.4 + 0.6 * sim_rng_uniform(&r);
  }
  for (uint32_t y = 0; y < H; y++) {
    for (uint32_t x = 0; x < W; x++) {
      double blobs = 0.0;
      for (int b = 0; b < BLOBS; b++) {
        double dy = y - by[b], dx = x - bx[b];
        blobs += ba[b] * exp(-(dy * dy + dx * dx) / (2.0 * bs[b] * bs[b]));
      }
      if (blobs > 1.0)
        blobs = 1.0;
      double dy = y - H / 2.0, dx = x - W / 2.0;
      double rr = sqrt(dy * dy + dx * dx), th = atan2(dy, dx);
      double rings = 0.5 + 0.5 * cos(2.0 * M_PI * rr / (0.11 * L) + 0.8 * cos(3.0 * th));
      double amp = 0.9 - 0.4 * blobs, ph = 0.8 * M_PI * (rings - 0.5);
      double *o = s->object + 2 * ((size_t)y * W + x);
      o[0] = amp * cos(ph);
      o[1] = amp * sin(ph);
    }
  }
}

/* A 2-D dataset from FILE[:/dataset]: complex (compound of two floats, as
 * h5py writes) or real (an amplitude, phase 0); the centre obj_h x obj_w
 * of it is used pixel for pixel. Without a dataset name the first of
 * /entry/truth/object, /entry_1/image_1/data is taken. */
static int file_object(sim_ptycho_t *s, const char *spec, beam_diag_t *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s", spec);
  const char *dset = beam_h5_split_spec(path);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0)
    return BEAM_DIAG(d, BEAM_EIO, "--ptycho-object %s: cannot open as HDF5", path);
  static const char *cands[] = {"/entry/truth/object", "/entry_1/image_1/data"};
  hid_t ds = -1;
  if (dset) {
    ds = H5Dopen2(f, dset, H5P_DEFAULT);
  } else {
    for (size_t i = 0; i < 2 && ds < 0; i++) {
      ds = H5Dopen2(f, cands[i], H5P_DEFAULT); /* fails quietly when absent */
      if (ds >= 0)
        dset = cands[i];
    }
  }
  H5Eclear2(H5E_DEFAULT);
  int rc = 0;
  hid_t sp = -1;
  double *tmp = NULL;
  if (ds < 0) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "--ptycho-object %s: no dataset %s", path,
                   dset ? dset : "/entry/truth/object or /entry_1/image_1/data");
    goto out;
  }
  sp = H5Dget_space(ds);
  hsize_t dims[2];
  if (H5Sget_simple_extent_ndims(sp) != 2 || !beam_h5_cplx_kind(ds)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "--ptycho-object %s dataset %s: expected a 2-D complex or "
                   "real array", path, dset);
    goto out;
  }
  H5Sget_simple_extent_dims(sp, dims, NULL);
  if (dims[0] < s->geom.obj_h || dims[1] < s->geom.obj_w) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "--ptycho-object %s dataset %s: %llux%llu is smaller than "
                   "the %ux%u object this scan needs", path, dset, (unsigned long long)dims[0],
                   (unsigned long long)dims[1], s->geom.obj_h, s->geom.obj_w);
    goto out;
  }
  size_t np = (size_t)(dims[0] * dims[1]);
  tmp = malloc(np * 2 * sizeof *tmp);
  if (!tmp) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "object file buffer");
    goto out;
  }
  if (beam_h5_read_cplx(ds, tmp) < 0) {
    rc = BEAM_DIAG(d, BEAM_EIO, "--ptycho-object %s dataset %s: read failed", path, dset);
    goto out;
  }
  size_t r0 = (size_t)(dims[0] - s->geom.obj_h) / 2, c0 = (size_t)(dims[1] - s->geom.obj_w) / 2;
  for (uint32_t y = 0; y < s->geom.obj_h; y++)
    for (uint32_t x = 0; x < s->geom.obj_w; x++) {
      size_t si = (r0 + y) * dims[1] + c0 + x, di = (size_t)y * s->geom.obj_w + x;
      s->object[2 * di] = tmp[2 * si];
      s->object[2 * di + 1] = tmp[2 * si + 1];
      if (!isfinite(s->object[2 * di]) || !isfinite(s->object[2 * di + 1])) {
        rc = BEAM_DIAG(d, BEAM_EINVAL, "--ptycho-object %s dataset %s: non-finite value at "
                       "(%zu, %zu)", path, dset, r0 + y, c0 + x);
        goto out;
      }
    }
out:
  free(tmp);
  if (sp >= 0) H5Sclose(sp);
  if (ds >= 0) H5Dclose(ds);
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}

/* ---- set-up ---------------------------------------------------------------- */

int sim_ptycho_new(sim_ptycho_t **out, const sim_opts_t *o, beam_diag_t *d) {
  *out = NULL;
  sim_ptycho_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho state");
  *out = s;
  s->n = o->pty_n;
  s->h = o->h;
  s->w = o->w;
  s->cy = o->h / 2;
  s->cx = o->w / 2;
  s->dtype = o->dtype;
  s->seed = o->seed;
  s->count = (uint32_t)o->frames;
  s->modes = o->pty_probe_modes;
  s->photons = o->pty_photons;
  s->poisson = o->pty_poisson;
  s->object_src = o->pty_object_file ? o->pty_object_file : "builtin";
  s->energy = o->pty_energy;
  s->distance = o->pty_distance;
  s->pixel = o->pty_pixel;
  s->raster = o->pty_raster;
  s->step = o->pty_step;
  s->jitter = o->pty_jitter;
  s->zp[0] = o->pty_zp_diam;
  s->zp[1] = o->pty_zp_drn;
  s->zp[2] = o->pty_zp_cs;
  s->zp[3] = o->pty_defocus;
  size_t nn = (size_t)s->n * s->n;
  s->pos_xy = malloc((size_t)s->count * 2 * sizeof *s->pos_xy);
  s->rc = malloc((size_t)s->count * 2 * sizeof *s->rc);
  double *yx = malloc((size_t)s->count * 2 * sizeof *yx);
  s->probe = malloc(nn * 2 * s->modes * sizeof *s->probe);
  s->inten = malloc(nn * sizeof *s->inten);
  s->buf = fftw_malloc(nn * sizeof *s->buf);
  if (!s->pos_xy || !s->rc || !yx || !s->probe || !s->inten || !s->buf) {
    free(yx);
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho scan of %u points", s->count);
  }
  make_scan(s, o);
  for (uint32_t k = 0; k < s->count; k++) {
    yx[2 * k] = s->pos_xy[2 * k + 1];
    yx[2 * k + 1] = s->pos_xy[2 * k];
  }
  double px = beam_ptycho_obj_pixel(o->pty_energy, o->pty_distance, o->pty_pixel, s->n);
  int rc = beam_ptycho_place(yx, s->count, px, s->n, 0, MAX_OBJ_SIDE, s->rc, NULL, &s->geom, d);
  free(yx);
  if (rc < 0)
    return rc;
  s->object = malloc((size_t)s->geom.obj_h * s->geom.obj_w * 2 * sizeof *s->object);
  if (!s->object)
    return BEAM_DIAG(d, BEAM_ENOMEM, "object of %ux%u", s->geom.obj_h, s->geom.obj_w);
  if (o->pty_object_file)
    rc = file_object(s, o->pty_object_file, d);
  else
    builtin_object(s);
  if (rc < 0)
    return rc;
  rc = beam_ptycho_probe_zone_plate(s->n, px, o->pty_energy, o->pty_zp_diam, o->pty_zp_drn,
                                    o->pty_zp_cs, o->pty_defocus, s->modes, s->photons,
                                    s->probe, d);
  if (rc < 0)
    return rc;
  s->plan = fftw_plan_dft_2d((int)s->n, (int)s->n, s->buf, s->buf, FFTW_FORWARD, FFTW_ESTIMATE);
  if (!s->plan)
    return BEAM_DIAG(d, BEAM_ENOMEM, "FFTW plan %ux%u", s->n, s->n);
  sim_pois_tab_init(&s->ptab);
  return 0;
}

void sim_ptycho_destroy(sim_ptycho_t **self) {
  sim_ptycho_t *s = self ? *self : NULL;
  if (!s)
    return;
  if (s->plan)
    fftw_destroy_plan(s->plan);
  fftw_free(s->buf);
  free(s->pos_xy);
  free(s->rc);
  free(s->object);
  free(s->probe);
  free(s->inten);
  free(s);
  *self = NULL;
}

/* ---- rendering ------------------------------------------------------------- */

/* Noise-free intensities of scan point k, FFT order, in s->inten. */
static void intensities(sim_ptycho_t *s, uint32_t k) {
  uint32_t n = s->n, W = s->geom.obj_w;
  size_t nn = (size_t)n * n;
  double norm = 1.0 / ((double)n * n); /* |F/n|^2: the unitary FFT */
  const int32_t r0 = s->rc[2 * k], c0 = s->rc[2 * k + 1];
  memset(s->inten, 0, nn * sizeof *s->inten);
  for (uint32_t j = 0; j < s->modes; j++) {
    const double *p = s->probe + 2 * nn * j;
    for (uint32_t y = 0; y < n; y++) {
      const double *ob = s->object + 2 * ((size_t)(r0 + (int32_t)y) * W + (size_t)c0);
      for (uint32_t x = 0; x < n; x++) {
        size_t i = (size_t)y * n + x;
        double pr = p[2 * i], pi = p[2 * i + 1], or_ = ob[2 * x], oi = ob[2 * x + 1];
        s->buf[i][0] = pr * or_ - pi * oi;
        s->buf[i][1] = pr * oi + pi * or_;
      }
    }
    fftw_execute(s->plan);
    for (size_t i = 0; i < nn; i++)
      s->inten[i] += (s->buf[i][0] * s->buf[i][0] + s->buf[i][1] * s->buf[i][1]) * norm;
  }
}

static double dtype_max(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return 255.0;
  case BEAM_DT_U16: return 65535.0;
  case BEAM_DT_U32: return 4294967295.0;
  default: return 3.4e38;
  }
}

void sim_ptycho_render(sim_ptycho_t *s, uint64_t frame_id, void *dst, double pos[3]) {
  uint32_t k = (uint32_t)(frame_id % s->count), n = s->n;
  intensities(s, k);
  size_t esize = beam_dtype_size(s->dtype);
  memset(dst, 0, (size_t)s->h * s->w * esize);
  sim_rng_t r;
  uint64_t x = s->seed ^ (frame_id * 0x9e3779b97f4a7c15ull) ^ 0x9015u;
  sim_rng_seed(&r, sim_splitmix64(&x));
  double mx = dtype_max(s->dtype);
  int integer = s->dtype != BEAM_DT_F32;
  /* Frame pixel (cy - n/2 + u', cx - n/2 + v') holds FFT index
   * ((u' + n/2) mod n, (v' + n/2) mod n): the fftshift. */
  for (uint32_t u = 0; u < n; u++) {
    uint32_t fu = (u + n / 2) % n;
    size_t row = (size_t)(s->cy - n / 2 + u) * s->w + (s->cx - n / 2);
    for (uint32_t v = 0; v < n; v++) {
      double lam = s->inten[(size_t)fu * n + (v + n / 2) % n];
      double val = s->poisson ? sim_pois(lam, exp(-lam), &s->ptab, &r)
                              : integer ? floor(lam + 0.5) : lam;
      if (val > mx) {
        val = mx;
        s->saturated++;
      }
      size_t i = row + v;
      switch (s->dtype) {
      case BEAM_DT_U8: ((uint8_t *)dst)[i] = (uint8_t)val; break;
      case BEAM_DT_U16: ((uint16_t *)dst)[i] = (uint16_t)val; break;
      case BEAM_DT_U32: ((uint32_t *)dst)[i] = (uint32_t)val; break;
      default: ((float *)dst)[i] = (float)val; break;
      }
    }
  }
  pos[0] = s->pos_xy[2 * k];
  pos[1] = s->pos_xy[2 * k + 1];
  pos[2] = 0.0;
}

int sim_ptycho_meta(const sim_ptycho_t *s, json_t *m) {
  json_t *pl = json_array();
  json_t *p = json_object();
  if (!pl || !p) {
    json_decref(pl);
    json_decref(p);
    return -1;
  }
  for (uint32_t k = 0; k < s->count; k++)
    json_array_append_new(pl, json_pack("[ff]", s->pos_xy[2 * k], s->pos_xy[2 * k + 1]));
  /* PROTOCOL.md 7.1 keys; the positions go both per frame (pos, flag POS)
   * and here, so a consumer can size its object at SERIES_START. */
  json_object_set_new(m, "energy", json_real(s->energy));
  json_object_set_new(m, "distance", json_real(s->distance));
  json_object_set_new(m, "pixel_size", json_real(s->pixel));
  json_object_set_new(m, "beam_center", json_pack("[ii]", (int)s->cy, (int)s->cx));
  json_object_set_new(m, "scan", json_pack("{s:o}", "positions", pl));
  json_object_set_new(p, "n", json_integer(s->n));
  json_object_set_new(p, "object_pixel", json_real(s->geom.pixel_m));
  json_object_set_new(p, "object_shape", json_pack("[ii]", (int)s->geom.obj_h, (int)s->geom.obj_w));
  json_object_set_new(p, "object_origin", json_pack("[ff]", s->geom.origin_y, s->geom.origin_x));
  json_object_set_new(p, "object", json_string(s->object_src));
  json_object_set_new(p, "probe_modes", json_integer(s->modes));
  json_object_set_new(p, "photons", json_real(s->photons));
  json_object_set_new(p, "noise", json_string(s->poisson ? "poisson" : "none"));
  json_object_set_new(p, "scan", json_string(s->raster ? "raster" : "fermat"));
  json_object_set_new(p, "scan_step", json_real(s->step));
  json_object_set_new(p, "zone_plate", json_pack("{s:f, s:f, s:f, s:f}", "diameter", s->zp[0],
                                                 "outer_zone", s->zp[1], "stop", s->zp[2],
                                                 "defocus", s->zp[3]));
  json_object_set_new(m, "ptycho", p);
  return 0;
}
