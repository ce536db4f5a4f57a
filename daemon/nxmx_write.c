/* NXmx fields from a series' metadata (see nxmx_write.h). Values come in
 * SI from the series (PROTOCOL.md 7.1) and are written in the units the
 * NXmx definition names, each with its "units" attribute, so a reader that
 * converts by units (ours, DIALS, the DECTRIS tools) reads them back
 * exactly. */
#include "daemon/nxmx_write.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "daemon/h5util.h"
#include "daemon/nxmx.h"

#define HC_EV_ANGSTROM (BEAM_NX_HC_EV_M * 1e10)

/* A scalar fixed-length UTF-8 string dataset, as NeXus writers store
 * `definition` and `description`. */
static int str_dataset(hid_t loc, const char *path, const char *v) {
  hid_t t = H5Tcopy(H5T_C_S1);
  int rc = t >= 0 && H5Tset_size(t, strlen(v) + 1) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0 &&
                   H5Tset_strpad(t, H5T_STR_NULLTERM) >= 0
               ? 0
               : -1;
  hid_t ds = rc == 0 ? beam_h5_dataset(loc, path, t, t, 0, NULL, v, NULL) : -1;
  if (t >= 0)
    H5Tclose(t);
  if (ds < 0)
    return -1;
  H5Dclose(ds);
  return 0;
}

static int num_dataset(hid_t loc, const char *path, double v, const char *units) {
  return isfinite(v) ? beam_h5_scalar_f64(loc, path, v, units) : 0;
}

static int int_dataset(hid_t loc, const char *path, int64_t v) {
  hid_t ds = beam_h5_dataset(loc, path, H5T_STD_I64LE, H5T_NATIVE_INT64, 0, NULL, &v, NULL);
  if (ds < 0)
    return -1;
  H5Dclose(ds);
  return 0;
}

/* A finite number under key, else NaN. */
static double num(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_number(v) && isfinite(json_number_value(v)) ? json_number_value(v) : NAN;
}

/* v[0..n) from a number (every element) or a list of n numbers; 1 found. */
static int nums(const json_t *o, const char *key, double *v, size_t n) {
  json_t *a = json_object_get(o, key);
  if (json_is_number(a)) {
    for (size_t i = 0; i < n; i++)
      v[i] = json_number_value(a);
  } else if (json_is_array(a) && json_array_size(a) == n) {
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_array_get(a, i);
      if (!json_is_number(e))
        return 0;
      v[i] = json_number_value(e);
    }
  } else {
    return 0;
  }
  for (size_t i = 0; i < n; i++)
    if (!isfinite(v[i]))
      return 0;
  return 1;
}

/* The series' pixel mask as uint32, the frame shape's dataset NXmx names:
 * DECTRIS sends it as uint32 already; another dtype is converted value by
 * value (anything nonzero stays nonzero). */
static int write_mask(hid_t det, const beam_series_t *series) {
  const beam_series_array_t *sa = beam_series_array(series, "pixel_mask");
  if (!sa || sa->arr.dtype == BEAM_DT_C64 || sa->arr.dtype == BEAM_DT_C128)
    return 0;
  const beam_array_t *a = &sa->arr;
  size_t n = beam_array_elems(a);
  uint32_t *conv = NULL;
  const void *data = a->data;
  if (a->dtype != BEAM_DT_U32) {
    if (!(conv = malloc((n ? n : 1) * sizeof *conv)))
      return -1;
    for (size_t i = 0; i < n; i++) {
      double v = beam_array_get(a, i);
      conv[i] = v == 0 ? 0u : v >= 1 && v < 4294967296.0 ? (uint32_t)v : 1u;
    }
    data = conv;
  }
  hsize_t dims[BEAM_MAX_NDIM];
  for (uint32_t i = 0; i < a->ndim; i++)
    dims[i] = a->shape[i];
  hid_t ds = beam_h5_dataset(det, "pixel_mask", H5T_STD_U32LE, H5T_NATIVE_UINT32, (int)a->ndim,
                             dims, data, NULL);
  free(conv);
  if (ds < 0)
    return -1;
  H5Dclose(ds);
  return 0;
}

static int bits_of(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: case BEAM_DT_I8: return 8;
  case BEAM_DT_U16: case BEAM_DT_I16: return 16;
  case BEAM_DT_U32: case BEAM_DT_I32: return 32;
  case BEAM_DT_U64: case BEAM_DT_I64: return 64;
  default: return 0;
  }
}

static int write_detector(hid_t det, const beam_series_t *series, const json_t *m,
                          beam_dtype_t dtype) {
  int rc = 0;
  json_t *name = json_object_get(m, "detector");
  if (json_is_string(name) && json_string_value(name)[0])
    rc |= str_dataset(det, "description", json_string_value(name));
  double dist = series->distance_m > 0 ? series->distance_m : num(m, "distance");
  rc |= num_dataset(det, "detector_distance", dist > 0 ? dist : NAN, "m");
  double px[2]; /* [y, x] */
  if (nums(m, "pixel_size", px, 2) && px[0] > 0 && px[1] > 0) {
    rc |= num_dataset(det, "x_pixel_size", px[1], "m");
    rc |= num_dataset(det, "y_pixel_size", px[0], "m");
  }
  double bc[2]; /* [y, x] */
  json_t *bcj = json_object_get(m, "beam_center");
  if (json_is_array(bcj) && nums(m, "beam_center", bc, 2)) {
    rc |= num_dataset(det, "beam_center_x", bc[1], "pixel");
    rc |= num_dataset(det, "beam_center_y", bc[0], "pixel");
  }
  double ct = num(m, "count_time");
  rc |= num_dataset(det, "count_time", ct > 0 ? ct : NAN, "s");
  rc |= num_dataset(det, "frame_time", series->frame_time_s > 0 ? series->frame_time_s : NAN, "s");
  const json_t *dx = json_object_get(m, "dectris");
  json_t *sat = json_object_get(dx, "saturation_value");
  if (json_is_integer(sat))
    rc |= int_dataset(det, "saturation_value", json_integer_value(sat));
  json_t *bits = json_object_get(json_object_get(dx, "config"), "bit_depth_readout");
  if (json_is_integer(bits))
    rc |= int_dataset(det, "bit_depth_readout", json_integer_value(bits));
  else if (bits_of(dtype))
    rc |= int_dataset(det, "bit_depth_readout", bits_of(dtype));
  rc |= write_mask(det, series);
  return rc ? -1 : 0;
}

int beam_nx_write_series(hid_t file, const beam_series_t *series, beam_dtype_t dtype) {
  json_t *m = series->meta_json ? json_loadb(series->meta_json, series->meta_len, 0, NULL) : NULL;
  if (!json_is_object(m)) { /* none or malformed: the frame time and arrays still say something */
    json_decref(m);
    m = json_object();
  }
  int rc = str_dataset(file, "/entry/definition", "NXmx");
  hid_t ins = rc == 0 ? beam_h5_group(file, "/entry/instrument", "NXinstrument") : -1;
  hid_t det = ins >= 0 ? beam_h5_group(ins, "detector", "NXdetector") : -1;
  hid_t beam = det >= 0 ? beam_h5_group(ins, "beam", "NXbeam") : -1;
  rc = beam >= 0 ? write_detector(det, series, m, dtype) : -1;
  /* NeXus keeps the frames in the detector group and links them into
   * NXdata; ours are created in NXdata (what replay readers open), so the
   * detector gets the link. One object: readers that walk the file by
   * object (beamd-replay's search for the 3-D dataset) see it once. */
  if (rc == 0 && beam_h5_exists(file, "/entry/data/data") &&
      H5Lcreate_hard(file, "/entry/data/data", det, "data", H5P_DEFAULT, H5P_DEFAULT) < 0)
    rc = -1;
  if (rc == 0) {
    double ev = series->energy_ev > 0 ? series->energy_ev : num(m, "energy");
    double wl = num(m, "wavelength"); /* angstrom (the DECTRIS key) */
    if (!(ev > 0) && wl > 0)
      ev = HC_EV_ANGSTROM / wl;
    if (ev > 0) {
      rc |= num_dataset(beam, "incident_energy", ev, "eV");
      rc |= num_dataset(beam, "incident_wavelength", HC_EV_ANGSTROM / ev, "angstrom");
    }
  }
  hid_t es = rc < 0 ? H5Eget_current_stack() : -1; /* closing would clear the reason */
  if (beam >= 0) H5Gclose(beam);
  if (det >= 0) H5Gclose(det);
  if (ins >= 0) H5Gclose(ins);
  if (es >= 0)
    H5Eset_current_stack(es);
  json_decref(m);
  return rc ? -1 : 0;
}
