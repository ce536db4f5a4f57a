/* beamd-sim ptycho internals shared by ptycho.c (model, rendering) and
 * ptycho_h5.c (the scan file writer). */
#ifndef BEAMD_SIM_PTYCHO_INT_H
#define BEAMD_SIM_PTYCHO_INT_H

#include <fftw3.h>

#include "pipeline/ptycho/setup.h"
#include "tools/beamd-sim/pois.h"
#include "tools/beamd-sim/sim.h"

struct sim_ptycho_s {
  uint32_t n, h, w;          /* pattern side, frame shape */
  uint32_t cy, cx;           /* beam centre in the frame (pixels) */
  beam_dtype_t dtype;
  uint64_t seed;
  uint32_t count;            /* scan points */
  double *pos_xy;            /* count x 2 (x, y), metres: what is published */
  int32_t *rc;               /* count x 2 (row, col) window offsets */
  beam_ptycho_geom_t geom;   /* object grid; origin in metres */
  double *object;            /* obj_h x obj_w complex (re, im) */
  uint32_t modes;
  double *probe;             /* modes x n x n complex */
  double photons;
  int poisson;
  fftw_complex *buf;         /* n x n work array, FFT in place */
  fftw_plan plan;
  double *inten;             /* n x n, FFT order */
  sim_pois_tab_t ptab;
  uint64_t saturated;        /* integer pixels clamped at the dtype maximum */
  const char *object_src;    /* "builtin" or the file */
  double energy, distance, pixel; /* eV, m, m (detector pixel) */
  int raster;
  double step, jitter;
  double zp[4];              /* diameter, outer zone, stop, defocus (m) */
};

#endif
