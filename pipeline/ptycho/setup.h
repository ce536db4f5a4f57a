/* Ptychography set-up shared by the live stage, beamd-ptycho and beamd-sim:
 * geometry (scan positions to integer object-pixel windows), frame
 * preparation (crop, FFT order, square root, mask) and initial probes.
 * Complex arrays are interleaved (re, im) doubles, C order. */
#ifndef BEAM_PTYCHO_SETUP_H
#define BEAM_PTYCHO_SETUP_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"
#include "pipeline/frame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Object pixel size in metres: lambda z / (n p). lambda from energy_ev
 * (lambda = h c / E = 1.23984198e-6 / E[eV] m). 0 when an input is <= 0. */
double beam_ptycho_wavelength(double energy_ev);
double beam_ptycho_obj_pixel(double energy_ev, double distance_m, double det_pixel_m,
                             uint32_t n);

typedef struct beam_ptycho_geom_s {
  uint32_t n;            /* view side */
  uint32_t obj_h, obj_w; /* object array that holds every window + margin */
  double pixel_m;        /* object pixel size (0 when positions were pixels) */
  double origin_y, origin_x; /* the position (input units) of object pixel (0, 0) */
} beam_ptycho_geom_t;

/* Positions (count x 2: y, x) in metres (pixel_m > 0) or object pixels
 * (pixel_m == 0) -> integer top-left window offsets (count x 2: row, col),
 * the object size (windows + `margin` pixels on each side) and the origin.
 * Rounding is to nearest (PtyPy: round(coord/psize + 1e-5)), the window is
 * centred on the position; the sub-pixel remainders go to frac (count x 2,
 * may be NULL) for a future sub-pixel path. Fails (BEAM_EINVAL, naming the
 * index) on a non-finite position or an object above max_side pixels. */
int beam_ptycho_place(const double *pos, size_t count, double pixel_m, uint32_t n,
                      uint32_t margin, uint32_t max_side, int32_t *rc, double *frac,
                      beam_ptycho_geom_t *g, beam_diag_t *d);

/* The same placement for one more position with a fixed geometry (the live
 * stage, whose object size is fixed at series start); BEAM_EINVAL when the
 * position is not finite or its window falls outside the object. */
int beam_ptycho_place_one(const beam_ptycho_geom_t *g, double y, double x, int32_t *row,
                          int32_t *col, beam_diag_t *d);

/* One detector frame (h x w, dtype u8/u16/u32/i32/f32/f64 as in frame.h)
 * -> n x n amplitudes in FFT order: the n x n window centred on (cy, cx)
 * (the beam centre, pixels, rounded), ifftshifted so the centre lands at
 * [0,0], square-rooted; negative or non-finite counts, pixels outside the
 * frame and pixels with mask != 0 (mask h x w, may be NULL) become -1
 * (masked). Returns the number of valid photons sum (sum of counts kept),
 * or a negative BEAM_E code for a bad dtype. */
double beam_ptycho_prep_frame(const void *frame, beam_dtype_t dtype, uint32_t h, uint32_t w,
                              double cy, double cx, uint32_t n, const uint8_t *mask,
                              float *amp);

/* Initial probes, each normalised so that sum |P|^2 equals `power` (the
 * mean photons per frame, for unitary FFTs), mode 0 first.
 *   from_mean:  P = F^-1[mean amplitude] (amp_mean: n x n, FFT order, < 0
 *               masked -> 0), a flat-phase guess of the focus.
 *   zone_plate: a Fresnel zone plate of diameter zp_diam_m, outer zone
 *               width zp_drn_m, central stop cs_diam_m, at defocus_m from
 *               its focus, on an object-pixel grid of pixel_m, for energy_ev.
 * Extra modes (modes > 1): mode 0 times orthogonal low-order Hermite-like
 * ramps, Gram-Schmidt orthogonalised, with power fractions 1, 0.1, 0.05...
 * of mode 0 before the overall normalisation. out: modes x n x n complex. */
int beam_ptycho_probe_from_mean(const float *amp_mean, uint32_t n, uint32_t modes,
                                double power, double *out, beam_diag_t *d);
int beam_ptycho_probe_zone_plate(uint32_t n, double pixel_m, double energy_ev,
                                 double zp_diam_m, double zp_drn_m, double cs_diam_m,
                                 double defocus_m, uint32_t modes, double power, double *out,
                                 beam_diag_t *d);
/* Adds modes to a given mode-0 probe (in place in out, which holds
 * `modes` x n x n; mode 0 filled by the caller). */
void beam_ptycho_probe_extra_modes(uint32_t n, uint32_t modes, double *out);

/* Remove the global phase and scale between a reconstruction and a truth
 * over a region (rows r0..r1, cols c0..c1 of h x w complex arrays): returns
 * min_c ||c a - b|| / ||b|| (c complex), the error tests and benchmarks
 * quote. */
double beam_ptycho_rel_error(const double *a, const double *b, uint32_t h, uint32_t w,
                             uint32_t r0, uint32_t r1, uint32_t c0, uint32_t c1);

#ifdef __cplusplus
}
#endif
#endif
