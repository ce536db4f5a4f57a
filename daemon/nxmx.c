/* NXmx geometry readers (see nxmx.h). Units are matched exactly, as
 * written by the detector vendors' and h5py writers we know; anything else
 * is reported rather than guessed. */
#include "daemon/nxmx.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"

double beam_nx_unit_scale(beam_nx_kind_t k, const char *u, double dflt) {
  static const struct { beam_nx_kind_t k; const char *name; double f; } t[] = {
      {BEAM_NX_LENGTH, "m", 1}, {BEAM_NX_LENGTH, "meter", 1}, {BEAM_NX_LENGTH, "metre", 1},
      {BEAM_NX_LENGTH, "mm", 1e-3}, {BEAM_NX_LENGTH, "cm", 1e-2}, {BEAM_NX_LENGTH, "um", 1e-6},
      {BEAM_NX_LENGTH, "\xc2\xb5m", 1e-6}, {BEAM_NX_LENGTH, "micron", 1e-6},
      {BEAM_NX_LENGTH, "microns", 1e-6}, {BEAM_NX_LENGTH, "nm", 1e-9},
      {BEAM_NX_LENGTH, "pm", 1e-12}, {BEAM_NX_LENGTH, "angstrom", 1e-10},
      {BEAM_NX_LENGTH, "Angstrom", 1e-10}, {BEAM_NX_LENGTH, "A", 1e-10},
      {BEAM_NX_LENGTH, "\xc3\x85", 1e-10},
      {BEAM_NX_TIME, "s", 1}, {BEAM_NX_TIME, "ms", 1e-3}, {BEAM_NX_TIME, "us", 1e-6},
      {BEAM_NX_TIME, "\xc2\xb5s", 1e-6}, {BEAM_NX_TIME, "ns", 1e-9},
      {BEAM_NX_ENERGY, "eV", 1}, {BEAM_NX_ENERGY, "keV", 1e3}, {BEAM_NX_ENERGY, "MeV", 1e6},
      {BEAM_NX_PIXELS, "pixel", 1}, {BEAM_NX_PIXELS, "pixels", 1}, {BEAM_NX_PIXELS, "px", 1},
  };
  if (!u[0])
    return dflt;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].k == k && !strcmp(u, t[i].name))
      return t[i].f;
  return 0;
}

int beam_nx_units(hid_t obj, char *buf, size_t len) {
  buf[0] = '\0';
  if (H5Aexists(obj, "units") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return -1;
  }
  hid_t a = H5Aopen(obj, "units", H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : -1;
  int rc = -1;
  if (t >= 0 && H5Tget_class(t) == H5T_STRING) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(t)); /* h5py writes UTF-8; no cset conversion */
    if (H5Tis_variable_str(t) > 0) {
      H5Tset_size(mt, H5T_VARIABLE);
      char *v = NULL;
      if (H5Aread(a, mt, &v) >= 0 && v) {
        snprintf(buf, len, "%s", v);
        H5free_memory(v);
        rc = 0;
      }
    } else {
      size_t n = H5Tget_size(t);
      char *v = calloc(1, n + 1);
      H5Tset_size(mt, n + 1);
      if (v && H5Aread(a, mt, v) >= 0) {
        snprintf(buf, len, "%s", v);
        rc = 0;
      }
      free(v);
    }
    H5Tclose(mt);
  }
  if (t >= 0)
    H5Tclose(t);
  if (a >= 0)
    H5Aclose(a);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}

/* 1 found, 0 absent, BEAM_NX_E* with the units in u. Only the first element
 * is read (a hyperslab of one), so a per-frame array costs nothing. */
static int quantity(hid_t f, const char *path, beam_nx_kind_t k, double dflt, double *out,
                    char *u, size_t ul) {
  u[0] = '\0';
  if (!beam_h5_exists(f, path))
    return 0;
  hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  beam_nx_units(ds, u, ul);
  double scale = beam_nx_unit_scale(k, u, dflt);
  hid_t sp = H5Dget_space(ds);
  hid_t t = H5Dget_type(ds);
  H5T_class_t cls = H5Tget_class(t);
  hssize_t np = H5Sget_simple_extent_npoints(sp);
  int rc = BEAM_NX_EVALUE;
  if (scale == 0) {
    rc = BEAM_NX_EUNITS;
  } else if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && np >= 1) {
    hsize_t one = 1;
    hid_t ms = H5Screate_simple(1, &one, NULL);
    double v = NAN;
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd > 0) {
      hsize_t start[8] = {0}, cnt[8];
      for (int i = 0; i < nd && i < 8; i++)
        cnt[i] = 1;
      H5Sselect_hyperslab(sp, H5S_SELECT_SET, start, NULL, cnt, NULL);
    }
    if (H5Dread(ds, H5T_NATIVE_DOUBLE, ms, sp, H5P_DEFAULT, &v) >= 0 && isfinite(v)) {
      *out = v * scale;
      rc = 1;
    }
    H5Sclose(ms);
  }
  H5Tclose(t);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}

int beam_nx_get(hid_t f, const char *path, beam_nx_kind_t k, double dflt, double *out,
                beam_nx_bad_cb cb, void *ctx) {
  char u[32];
  int q = quantity(f, path, k, dflt, out, u, sizeof u);
  return q < 0 ? cb(ctx, path, q, u) : q;
}

int beam_nx_energy(hid_t f, double *ev, beam_nx_bad_cb cb, void *ctx) {
  int q = beam_nx_get(f, BEAM_NX_BEAM "incident_energy", BEAM_NX_ENERGY, 1, ev, cb, ctx);
  if (q == 0)
    q = beam_nx_get(f, BEAM_NX_DET "detectorSpecific/photon_energy", BEAM_NX_ENERGY, 1, ev, cb,
                    ctx);
  if (q != 0)
    return q;
  double wl;
  q = beam_nx_get(f, BEAM_NX_BEAM "incident_wavelength", BEAM_NX_LENGTH, 1e-10, &wl, cb, ctx);
  if (q == 1 && !(wl > 0))
    return 0;
  if (q == 1)
    *ev = BEAM_NX_HC_EV_M / wl;
  return q;
}

int beam_nx_distance(hid_t f, double *m, beam_nx_bad_cb cb, void *ctx) {
  int q = beam_nx_get(f, BEAM_NX_DET "detector_distance", BEAM_NX_LENGTH, 1, m, cb, ctx);
  return q == 0 ? beam_nx_get(f, BEAM_NX_DET "distance", BEAM_NX_LENGTH, 1, m, cb, ctx) : q;
}

beam_nx_pos_rc_t beam_nx_positions(hid_t f, uint64_t nframes, int at_least, beam_nx_pos_t *p,
                                   const char *(*reason)(char *buf, size_t len)) {
  memset(p, 0, sizeof *p);
  if (!beam_h5_exists(f, BEAM_NX_POSITIONS))
    return BEAM_NX_POS_ABSENT;
  hid_t ds = H5Dopen2(f, BEAM_NX_POSITIONS, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_NX_POS_OPEN;
  }
  hid_t sp = H5Dget_space(ds);
  hsize_t dims[2] = {0, 0};
  p->rank = H5Sget_simple_extent_ndims(sp);
  if (p->rank == 2)
    H5Sget_simple_extent_dims(sp, dims, NULL);
  p->n = dims[0];
  p->cols = (unsigned)dims[1];
  beam_nx_units(ds, p->units, sizeof p->units);
  double scale = beam_nx_unit_scale(BEAM_NX_LENGTH, p->units, 1.0);
  beam_nx_pos_rc_t rc = BEAM_NX_POS_OK;
  if (p->rank != 2 || (dims[1] != 2 && dims[1] != 3))
    rc = BEAM_NX_POS_SHAPE;
  else if (at_least ? dims[0] < nframes : dims[0] != nframes)
    rc = BEAM_NX_POS_COUNT;
  else if (scale == 0)
    rc = BEAM_NX_POS_UNITS;
  else if (!(p->xyz = malloc(dims[0] * dims[1] * sizeof *p->xyz)))
    rc = BEAM_NX_POS_NOMEM;
  else if (H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, p->xyz) < 0) {
    rc = BEAM_NX_POS_READ;
    if (reason)
      reason(p->why, sizeof p->why);
    else
      snprintf(p->why, sizeof p->why, "read failed");
  } else {
    for (size_t i = 0; i < dims[0] * dims[1]; i++)
      p->xyz[i] *= scale;
  }
  if (rc != BEAM_NX_POS_OK) {
    free(p->xyz);
    p->xyz = NULL;
  }
  H5Sclose(sp);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}
