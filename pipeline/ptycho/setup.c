/* Ptychography set-up (see setup.h): geometry, frame preparation, initial
 * probes and the reconstruction error. One-off work: FFTW_ESTIMATE plans. */
#include "pipeline/ptycho/setup.h"

#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Positions beyond this many object pixels are unit mistakes, and would
 * overflow the int32 window offsets. */
#define MAX_COORD 1e8

double beam_ptycho_wavelength(double energy_ev) {
  return energy_ev > 0 ? 1.23984198e-6 / energy_ev : 0.0;
}

double beam_ptycho_obj_pixel(double energy_ev, double distance_m, double det_pixel_m,
                             uint32_t n) {
  if (!(energy_ev > 0) || !(distance_m > 0) || !(det_pixel_m > 0) || n == 0)
    return 0.0;
  return beam_ptycho_wavelength(energy_ev) * distance_m / ((double)n * det_pixel_m);
}

/* PtyPy's rounding: round(coord / psize + 1e-5), half away from zero. */
static double round_pos(double v) { return floor(v + 1e-5 + 0.5); }

int beam_ptycho_place(const double *pos, size_t count, double pixel_m, uint32_t n,
                      uint32_t margin, uint32_t max_side, int32_t *rc, double *frac,
                      beam_ptycho_geom_t *g, beam_diag_t *d) {
  if (count == 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: no positions to place");
  if (n == 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: view side n = 0");
  if (!(pixel_m >= 0) || !isfinite(pixel_m))
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: object pixel size %g m: must be >= 0", pixel_m);
  const double scale = pixel_m > 0 ? 1.0 / pixel_m : 1.0;
  double lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
  for (size_t i = 0; i < count; i++)
    for (int a = 0; a < 2; a++) {
      double v = pos[2 * i + a] * scale;
      if (!isfinite(v) || fabs(v) > MAX_COORD)
        return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: position %zu (%s = %g) is not finite or out "
                         "of range (%g object pixels)", i, a ? "x" : "y", pos[2 * i + a], v);
      double r = round_pos(v);
      lo[a] = r < lo[a] ? r : lo[a];
      hi[a] = r > hi[a] ? r : hi[a];
    }
  const double half = (double)(n / 2);
  double side[2];
  for (int a = 0; a < 2; a++) {
    side[a] = hi[a] - lo[a] + (double)n + 2.0 * margin;
    if (side[a] > (double)max_side)
      return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: the scan needs a %s of %.0f object pixels "
                       "(positions span %.0f, view %u, margin %u), above the limit %u",
                       a ? "width" : "height", side[a], hi[a] - lo[a], n, margin, max_side);
  }
  /* Object pixel index of a coordinate v (pixels): v - base, base the
   * coordinate of object pixel 0; the window of v starts n/2 before. */
  double base[2] = {lo[0] - half - margin, lo[1] - half - margin};
  for (size_t i = 0; i < count; i++)
    for (int a = 0; a < 2; a++) {
      double v = pos[2 * i + a] * scale, r = round_pos(v);
      rc[2 * i + a] = (int32_t)(r - half - base[a]);
      if (frac)
        frac[2 * i + a] = v - r;
    }
  g->n = n;
  g->obj_h = (uint32_t)side[0];
  g->obj_w = (uint32_t)side[1];
  g->pixel_m = pixel_m;
  g->origin_y = base[0] / scale;
  g->origin_x = base[1] / scale;
  return 0;
}

int beam_ptycho_place_one(const beam_ptycho_geom_t *g, double y, double x, int32_t *row,
                          int32_t *col, beam_diag_t *d) {
  const double scale = g->pixel_m > 0 ? 1.0 / g->pixel_m : 1.0, half = (double)(g->n / 2);
  double vy = (y - g->origin_y) * scale, vx = (x - g->origin_x) * scale;
  if (!isfinite(vy) || !isfinite(vx) || fabs(vy) > MAX_COORD || fabs(vx) > MAX_COORD)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: position (y %g, x %g) is not finite or out of "
                     "range", y, x);
  double r = round_pos(vy) - half, c = round_pos(vx) - half;
  if (r < 0 || c < 0 || r + g->n > g->obj_h || c + g->n > g->obj_w)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: position (y %g, x %g): its %u x %u window at "
                     "(row %.0f, col %.0f) falls outside the %u x %u object",
                     y, x, g->n, g->n, r, c, g->obj_h, g->obj_w);
  *row = (int32_t)r;
  *col = (int32_t)c;
  return 0;
}

double beam_ptycho_prep_frame(const void *frame, beam_dtype_t dtype, uint32_t h, uint32_t w,
                              double cy, double cx, uint32_t n, const uint8_t *mask,
                              float *amp) {
  switch (dtype) {
  case BEAM_DT_U8: case BEAM_DT_U16: case BEAM_DT_U32: case BEAM_DT_U64:
  case BEAM_DT_I8: case BEAM_DT_I16: case BEAM_DT_I32: case BEAM_DT_I64:
  case BEAM_DT_F32: case BEAM_DT_F64:
    break;
  default:
    return BEAM_ESHAPE;
  }
  if (!isfinite(cy) || !isfinite(cx))
    return BEAM_EINVAL;
  const int64_t half = n / 2;
  const int64_t top = (int64_t)floor(cy + 0.5) - half, left = (int64_t)floor(cx + 0.5) - half;
  double photons = 0.0;
  for (int64_t u = 0; u < n; u++) {
    /* ifftshift: window row u goes to row (u - n/2) mod n, so the centre
     * lands at [0, 0]. */
    size_t orow = (size_t)((u - half + n) % n);
    int64_t fy = top + u;
    for (int64_t v = 0; v < n; v++) {
      size_t ocol = (size_t)((v - half + n) % n);
      int64_t fx = left + v;
      float out = -1.0f;
      if (fy >= 0 && fy < h && fx >= 0 && fx < w) {
        size_t p = (size_t)fy * w + (size_t)fx;
        double val = beam_elem_get(frame, dtype, p);
        if ((!mask || !mask[p]) && isfinite(val) && val >= 0) {
          out = (float)sqrt(val);
          photons += val;
        }
      }
      amp[orow * n + ocol] = out;
    }
  }
  return photons;
}

static pthread_once_t fftw_once = PTHREAD_ONCE_INIT;
static void fftw_init_once(void) { fftw_make_planner_thread_safe(); }

/* In-place unitary 2-D FFT of an n x n complex array (dir: FFTW_FORWARD or
 * FFTW_BACKWARD). The engines may plan on other threads at the same time. */
static int fft2(double *a, uint32_t n, int dir) {
  pthread_once(&fftw_once, fftw_init_once);
  fftw_plan p = fftw_plan_dft_2d((int)n, (int)n, (fftw_complex *)a, (fftw_complex *)a, dir,
                                 FFTW_ESTIMATE);
  if (!p)
    return -1;
  fftw_execute(p);
  fftw_destroy_plan(p);
  double s = 1.0 / (double)n;
  for (size_t q = 0; q < (size_t)n * n * 2; q++)
    a[q] *= s;
  return 0;
}

/* Moves the [0, 0] element of an n x n complex array to (n/2, n/2). */
static void fftshift(double *a, uint32_t n, double *tmp) {
  const size_t h = n / 2;
  for (size_t y = 0; y < n; y++)
    for (size_t x = 0; x < n; x++) {
      size_t o = (((y + h) % n) * n + (x + h) % n) * 2;
      tmp[o] = a[(y * n + x) * 2];
      tmp[o + 1] = a[(y * n + x) * 2 + 1];
    }
  memcpy(a, tmp, (size_t)n * n * 2 * sizeof(double));
}

static double power_of(const double *a, size_t count) {
  double s = 0.0;
  for (size_t q = 0; q < count * 2; q++)
    s += a[q] * a[q];
  return s;
}

/* Scales modes x n x n so that the total power is `power`. */
static int normalise(double *out, uint32_t n, uint32_t modes, double power, beam_diag_t *d) {
  size_t count = (size_t)modes * n * n;
  double p = power_of(out, count);
  if (!(p > 0) || !isfinite(p))
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: the initial probe is zero everywhere");
  double s = sqrt(power / p);
  for (size_t q = 0; q < count * 2; q++)
    out[q] *= s;
  return 0;
}

static int check_probe_args(uint32_t n, uint32_t modes, double power, beam_diag_t *d) {
  if (n < 2)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: probe side n = %u: must be >= 2", n);
  if (modes < 1 || modes > 16)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: probe modes = %u: must be in [1, 16]", modes);
  if (!(power > 0) || !isfinite(power))
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: probe power %g: must be > 0", power);
  return 0;
}

int beam_ptycho_probe_from_mean(const float *amp_mean, uint32_t n, uint32_t modes,
                                double power, double *out, beam_diag_t *d) {
  int rc = check_probe_args(n, modes, power, d);
  if (rc < 0)
    return rc;
  const size_t npx = (size_t)n * n;
  double *tmp = malloc(npx * 2 * sizeof(double));
  if (!tmp)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: out of memory for the probe");
  memset(out, 0, (size_t)modes * npx * 2 * sizeof(double));
  for (size_t p = 0; p < npx; p++)
    out[2 * p] = amp_mean[p] > 0 && isfinite(amp_mean[p]) ? amp_mean[p] : 0.0;
  if (fft2(out, n, FFTW_BACKWARD) < 0) {
    free(tmp);
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: FFTW could not plan a %u x %u FFT", n, n);
  }
  fftshift(out, n, tmp); /* the focus sits at the window centre */
  free(tmp);
  beam_ptycho_probe_extra_modes(n, modes, out);
  return normalise(out, n, modes, power, d);
}

int beam_ptycho_probe_zone_plate(uint32_t n, double pixel_m, double energy_ev,
                                 double zp_diam_m, double zp_drn_m, double cs_diam_m,
                                 double defocus_m, uint32_t modes, double power, double *out,
                                 beam_diag_t *d) {
  int rc = check_probe_args(n, modes, power, d);
  if (rc < 0)
    return rc;
  if (!(pixel_m > 0) || !(energy_ev > 0) || !(zp_diam_m > 0) || !(zp_drn_m > 0) ||
      !(cs_diam_m >= 0) || !(cs_diam_m < zp_diam_m) || !isfinite(defocus_m))
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: zone plate: pixel %g m, energy %g eV, diameter "
                     "%g m, outer zone %g m must be > 0, the central stop %g m in [0, diameter)"
                     ", the defocus %g m finite", pixel_m, energy_ev, zp_diam_m, zp_drn_m,
                     cs_diam_m, defocus_m);
  const double lambda = beam_ptycho_wavelength(energy_ev);
  const double focal = zp_diam_m * zp_drn_m / lambda;
  /* The focal-plane field is the Fourier transform of the pupil: spatial
   * frequency f maps to the zone-plate radius rho = lambda focal |f|. The
   * defocus is the paraxial transfer function exp(-i pi lambda z |f|^2).
   * A pupil wider than the grid's bandwidth is cut at the Nyquist edge. */
  const size_t npx = (size_t)n * n;
  const double df = 1.0 / ((double)n * pixel_m);
  memset(out, 0, (size_t)modes * npx * 2 * sizeof(double));
  size_t inside = 0;
  for (size_t y = 0; y < n; y++)
    for (size_t x = 0; x < n; x++) {
      double fy = ((double)y < n / 2.0 ? (double)y : (double)y - n) * df;
      double fx = ((double)x < n / 2.0 ? (double)x : (double)x - n) * df;
      double f2 = fy * fy + fx * fx, rho = lambda * focal * sqrt(f2);
      if (rho > zp_diam_m / 2 || rho < cs_diam_m / 2)
        continue;
      double ph = -M_PI * lambda * defocus_m * f2;
      out[(y * n + x) * 2] = cos(ph);
      out[(y * n + x) * 2 + 1] = sin(ph);
      inside++;
    }
  if (inside == 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: zone plate: the pupil falls between the grid's "
                     "frequencies (frequency step %g 1/m, focal length %g m)", df, focal);
  double *tmp = malloc(npx * 2 * sizeof(double));
  if (!tmp)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: out of memory for the probe");
  if (fft2(out, n, FFTW_BACKWARD) < 0) {
    free(tmp);
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: FFTW could not plan a %u x %u FFT", n, n);
  }
  fftshift(out, n, tmp);
  free(tmp);
  beam_ptycho_probe_extra_modes(n, modes, out);
  return normalise(out, n, modes, power, d);
}

/* Probabilists' Hermite polynomial He_k(t), k <= 5. */
static double hermite(int k, double t) {
  switch (k) {
  case 0: return 1.0;
  case 1: return t;
  case 2: return t * t - 1.0;
  case 3: return t * t * t - 3.0 * t;
  case 4: return t * t * t * t - 6.0 * t * t + 3.0;
  default: return t * t * t * t * t - 10.0 * t * t * t + 15.0 * t;
  }
}

void beam_ptycho_probe_extra_modes(uint32_t n, uint32_t modes, double *out) {
  if (modes < 2)
    return;
  const size_t npx = (size_t)n * n;
  const double *m0 = out;
  double p0 = power_of(m0, npx);
  memset(out + npx * 2, 0, (size_t)(modes - 1) * npx * 2 * sizeof(double));
  if (!(p0 > 0))
    return;
  /* Centre and width of mode 0's intensity, so the ramps live on the beam. */
  double sy = 0, sx = 0, syy = 0, sxx = 0;
  for (size_t y = 0; y < n; y++)
    for (size_t x = 0; x < n; x++) {
      double w = m0[(y * n + x) * 2] * m0[(y * n + x) * 2] +
                 m0[(y * n + x) * 2 + 1] * m0[(y * n + x) * 2 + 1];
      sy += w * y;
      sx += w * x;
      syy += w * (double)y * y;
      sxx += w * (double)x * x;
    }
  double my = sy / p0, mx = sx / p0;
  double wy = sqrt(fmax(syy / p0 - my * my, 0.25)), wx = sqrt(fmax(sxx / p0 - mx * mx, 0.25));
  /* Orders (ky, kx) by total degree: (0,1) (1,0) (1,1) (0,2) (2,0) ... */
  int order[16][2], no = 0;
  for (int deg = 1; deg <= 5 && no < 16; deg++)
    for (int ky = 0; ky <= deg && no < 16; ky++)
      if (deg - ky <= 5) {
        order[no][0] = ky;
        order[no][1] = deg - ky;
        no++;
      }
  for (uint32_t m = 1; m < modes; m++) {
    double *pm = out + (size_t)m * npx * 2;
    int ky = order[(m - 1) % no][0], kx = order[(m - 1) % no][1];
    for (size_t y = 0; y < n; y++)
      for (size_t x = 0; x < n; x++) {
        double r = hermite(ky, (y - my) / wy) * hermite(kx, (x - mx) / wx);
        pm[(y * n + x) * 2] = m0[(y * n + x) * 2] * r;
        pm[(y * n + x) * 2 + 1] = m0[(y * n + x) * 2 + 1] * r;
      }
    /* Gram-Schmidt against every earlier mode (complex inner product). */
    for (uint32_t q = 0; q < m; q++) {
      const double *pq = out + (size_t)q * npx * 2;
      double re = 0, im = 0, nq = power_of(pq, npx);
      if (!(nq > 0))
        continue;
      for (size_t p = 0; p < npx; p++) { /* <pq, pm> = sum conj(pq) pm */
        re += pq[2 * p] * pm[2 * p] + pq[2 * p + 1] * pm[2 * p + 1];
        im += pq[2 * p] * pm[2 * p + 1] - pq[2 * p + 1] * pm[2 * p];
      }
      re /= nq;
      im /= nq;
      for (size_t p = 0; p < npx; p++) {
        pm[2 * p] -= re * pq[2 * p] - im * pq[2 * p + 1];
        pm[2 * p + 1] -= re * pq[2 * p + 1] + im * pq[2 * p];
      }
    }
    /* Power fractions 0.1, 0.05, 0.033... of mode 0. */
    double pw = power_of(pm, npx), target = p0 * 0.1 / (double)m;
    double s = pw > 0 ? sqrt(target / pw) : 0.0;
    for (size_t q = 0; q < npx * 2; q++)
      pm[q] *= s;
  }
}

double beam_ptycho_rel_error(const double *a, const double *b, uint32_t h, uint32_t w,
                             uint32_t r0, uint32_t r1, uint32_t c0, uint32_t c1) {
  /* Rows [r0, r1), cols [c0, c1), clamped to the array. c = <a, b> / <a, a>
   * minimises ||c a - b||. */
  if (r1 > h)
    r1 = h;
  if (c1 > w)
    c1 = w;
  double abr = 0, abi = 0, aa = 0, bb = 0;
  for (size_t y = r0; y < r1; y++)
    for (size_t x = c0; x < c1; x++) {
      size_t p = (y * w + x) * 2;
      double ar = a[p], ai = a[p + 1], br = b[p], bi = b[p + 1];
      abr += ar * br + ai * bi; /* conj(a) b */
      abi += ar * bi - ai * br;
      aa += ar * ar + ai * ai;
      bb += br * br + bi * bi;
    }
  if (!(bb > 0))
    return NAN;
  double cr = aa > 0 ? abr / aa : 0, ci = aa > 0 ? abi / aa : 0, res = 0;
  for (size_t y = r0; y < r1; y++)
    for (size_t x = c0; x < c1; x++) {
      size_t p = (y * w + x) * 2;
      double ar = a[p], ai = a[p + 1];
      double dr = cr * ar - ci * ai - b[p], di = cr * ai + ci * ar - b[p + 1];
      res += dr * dr + di * di;
    }
  return sqrt(res / bb);
}
