/* beamd-sim pattern `pumpprobe`: a laser-pump / X-ray-probe delay scan.
 * Frame k is taken at delay d_k (ps), evenly spaced over [delay_min,
 * delay_max] in frame order and listed in the series metadata as "delay".
 * Each pixel p counts Poisson(lambda_p(d)) with, for u = max(d - t0, 0),
 *   lambda = c + exp(-u/tau)·(a·cos 2πfu + b·sin 2πfu)
 *          = c + A·exp(-u/tau)·cos(2πfu + phi),  a = A cos phi, b = -A sin phi,
 * flat at c + a before time zero t0: the `dcos_t0` model of pipeline/fit.h,
 * and `dcos` in u once t0 is known. The maps vary smoothly and are known:
 *   f   = f_min + (f_max - f_min)·x/(W-1)            (1/ps, along x)
 *   tau = tau_min + (tau_max - tau_min)·y/(H-1)      (ps, along y)
 *   A   = amp·mean·(0.6 + 0.4·cos(π·r/r_max))         (r from the centre)
 *   phi = 2π·(x + y)/(W + H) - π/2
 *   c   = mean
 * --pp-truth FILE writes them as float32 [5][H][W] in the order a, b, tau,
 * f, c (the engine's parameter order); the metadata names the file.
 * --write-h5 FILE writes the series to a file instead (pumpprobe_h5.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/npy_write.h"
#include "tools/beamd-sim/pois.h"
#include "tools/beamd-sim/rng.h"
#include "tools/beamd-sim/sim.h"

struct sim_pp_s {
  uint32_t h, w;
  size_t npix;
  beam_dtype_t dtype;
  uint64_t seed, frames;
  double t0, dmin, dmax, mean;
  float *truth; /* [5][npix]: a b tau f c */
  sim_pois_tab_t ptab;
};

int sim_pp_new(sim_pp_t **out, const sim_opts_t *o, beam_diag_t *d) {
  *out = NULL;
  if (o->frames < 2)
    return BEAM_DIAG(d, BEAM_EINVAL, "pumpprobe: --frames must be at least 2 (one delay each)");
  sim_pp_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pumpprobe state");
  s->h = o->h, s->w = o->w, s->npix = (size_t)o->h * o->w, s->dtype = o->dtype;
  s->seed = o->seed, s->frames = o->frames;
  s->t0 = o->pp_t0, s->dmin = o->pp_dmin, s->dmax = o->pp_dmax, s->mean = o->mean;
  if (!(s->truth = malloc(5 * s->npix * sizeof *s->truth))) {
    free(s);
    return BEAM_DIAG(d, BEAM_ENOMEM, "pumpprobe truth maps");
  }
  sim_pois_tab_init(&s->ptab);
  double cy = (s->h - 1) / 2.0, cx = (s->w - 1) / 2.0, rmax = hypot(cy, cx) + 1e-9;
  for (uint32_t y = 0; y < s->h; y++)
    for (uint32_t x = 0; x < s->w; x++) {
      size_t p = (size_t)y * s->w + x;
      double f = o->pp_fmin + (o->pp_fmax - o->pp_fmin) * (s->w > 1 ? x / (s->w - 1.0) : 0);
      double tau = o->pp_taumin + (o->pp_taumax - o->pp_taumin) * (s->h > 1 ? y / (s->h - 1.0) : 0);
      double A = o->pp_amp * s->mean * (0.6 + 0.4 * cos(M_PI * hypot(y - cy, x - cx) / rmax));
      double phi = 2 * M_PI * (x + y) / (double)(s->w + s->h) - M_PI / 2;
      s->truth[0 * s->npix + p] = (float)(A * cos(phi));
      s->truth[1 * s->npix + p] = (float)(-A * sin(phi));
      s->truth[2 * s->npix + p] = (float)tau;
      s->truth[3 * s->npix + p] = (float)f;
      s->truth[4 * s->npix + p] = (float)s->mean;
    }
  *out = s;
  return 0;
}

double sim_pp_delay(const sim_pp_t *s, uint64_t frame_id) {
  uint64_t k = frame_id % s->frames;
  return s->dmin + (s->dmax - s->dmin) * (double)k / (double)(s->frames - 1);
}

void sim_pp_render(sim_pp_t *s, uint64_t series_id, uint64_t frame_id, void *dst) {
  sim_rng_t r;
  uint64_t x = s->seed * 0x9E3779B97F4A7C15ull ^ (series_id << 32) ^ frame_id;
  sim_rng_seed(&r, sim_splitmix64(&x));
  double u = sim_pp_delay(s, frame_id) - s->t0;
  u = u > 0 ? u : 0;
  const float *a = s->truth, *b = a + s->npix, *tau = b + s->npix, *f = tau + s->npix,
              *c = f + s->npix;
  for (size_t p = 0; p < s->npix; p++) {
    double th = 2 * M_PI * f[p] * u;
    double lam = c[p] + exp(-u / tau[p]) * (a[p] * cos(th) + b[p] * sin(th));
    double v = sim_pois(lam, lam < SIM_PTRS_MIN_MEAN ? exp(-lam) : 0.0, &s->ptab, &r);
    switch (s->dtype) {
    case BEAM_DT_U8: ((uint8_t *)dst)[p] = (uint8_t)(v > 255 ? 255 : v); break;
    case BEAM_DT_U16: ((uint16_t *)dst)[p] = (uint16_t)(v > 65535 ? 65535 : v); break;
    case BEAM_DT_U32: ((uint32_t *)dst)[p] = (uint32_t)v; break;
    default: ((float *)dst)[p] = (float)v; break;
    }
  }
}

json_t *sim_pp_meta(const sim_pp_t *s, const sim_opts_t *o) {
  json_t *dl = json_array();
  for (uint64_t k = 0; k < s->frames; k++)
    json_array_append_new(dl, json_real(sim_pp_delay(s, k)));
  json_t *m = json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:s,s:s,s:s}", "t0", s->t0,
                        "delay_min", s->dmin, "delay_max", s->dmax, "f_min", o->pp_fmin,
                        "f_max", o->pp_fmax, "tau_min", o->pp_taumin, "tau_max", o->pp_taumax,
                        "amplitude", o->pp_amp, "mean", s->mean, "units", "delay, t0, tau: ps; f: 1/ps",
                        "model",
                        "lambda = c + exp(-u/tau)(a cos 2 pi f u + b sin 2 pi f u), u = max(delay - t0, 0); "
                        "Poisson counts",
                        "truth_params", "a b tau f c");
  if (!m) {
    json_decref(dl);
    return NULL;
  }
  json_object_set_new(m, "truth_file", o->pp_truth_file ? json_string(o->pp_truth_file) : json_null());
  json_object_set_new(m, "delays", dl);
  return m;
}

int sim_pp_write_truth(const sim_pp_t *s, const char *path, beam_diag_t *d) {
  uint32_t shape[3] = {5, s->h, s->w};
  return beam_npy_write(path, BEAM_DT_F32, 3, shape, s->truth, 5 * s->npix * sizeof(float), d);
}

const float *sim_pp_truth(const sim_pp_t *s) { return s->truth; }

void sim_pp_destroy(sim_pp_t **self) {
  if (!self || !*self)
    return;
  free((*self)->truth);
  free(*self);
  *self = NULL;
}
