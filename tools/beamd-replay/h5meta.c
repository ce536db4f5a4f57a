/* beamd-replay series metadata: the SERIES_START JSON taken from the file.
 *
 * Reads the NXmx / Eiger paths listed in docs/replay.md, converts values to
 * SI (eV for energy) using each dataset's "units" attribute, and refers to
 * large arrays (pixel mask, scan positions) by file and dataset rather than
 * inlining them. A value that is absent or unreadable is left out, never
 * guessed; nothing here is fatal, because frames without metadata are still
 * worth serving.
 */
#include "tools/beamd-replay/replay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DET "/entry/instrument/detector/"
#define BEAM "/entry/instrument/beam/"
#define HC_EV_M 1.239841984332e-6 /* h*c in eV*m: E[eV] = HC / lambda[m] */

typedef enum { Q_LENGTH, Q_TIME, Q_ENERGY, Q_PIXELS } qkind_t;

static int exists(hid_t f, const char *path) {
  /* Every path here is under /entry/instrument; test the parents first
   * because H5Lexists fails on a missing intermediate group. */
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *c = buf + 1; *c; c++) {
    if (*c != '/')
      continue;
    *c = '\0';
    htri_t e = H5Lexists(f, buf, H5P_DEFAULT);
    *c = '/';
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return 0;
    }
  }
  htri_t e = H5Lexists(f, buf, H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  return e > 0;
}

/* Multiplier from `units` to the SI unit of the kind (eV for energy);
 * 0 when unknown. Empty units take the NXmx default of the field. */
static double scale(qkind_t k, const char *u, double dflt) {
  static const struct { qkind_t k; const char *name; double f; } t[] = {
      {Q_LENGTH, "m", 1}, {Q_LENGTH, "mm", 1e-3}, {Q_LENGTH, "cm", 1e-2},
      {Q_LENGTH, "um", 1e-6}, {Q_LENGTH, "\xc2\xb5m", 1e-6}, {Q_LENGTH, "micron", 1e-6},
      {Q_LENGTH, "nm", 1e-9}, {Q_LENGTH, "angstrom", 1e-10}, {Q_LENGTH, "Angstrom", 1e-10},
      {Q_LENGTH, "A", 1e-10}, {Q_LENGTH, "\xc3\x85", 1e-10},
      {Q_TIME, "s", 1}, {Q_TIME, "ms", 1e-3}, {Q_TIME, "us", 1e-6}, {Q_TIME, "\xc2\xb5s", 1e-6},
      {Q_TIME, "ns", 1e-9},
      {Q_ENERGY, "eV", 1}, {Q_ENERGY, "keV", 1e3}, {Q_ENERGY, "MeV", 1e6},
      {Q_PIXELS, "pixel", 1}, {Q_PIXELS, "pixels", 1}, {Q_PIXELS, "px", 1},
  };
  if (!u[0])
    return dflt;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].k == k && !strcmp(u, t[i].name))
      return t[i].f;
  return 0;
}

/* First element of a numeric dataset, in SI. Returns 1 when found, 0 when
 * absent or unusable (a warning says why when it exists but is odd). */
static int quantity(rp_src_t *s, const char *path, qkind_t k, double dflt, double *out) {
  if (!exists(s->file, path))
    return 0;
  hid_t ds = H5Dopen2(s->file, path, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  int ok = 0;
  hid_t sp = H5Dget_space(ds);
  hid_t t = H5Dget_type(ds);
  H5T_class_t cls = H5Tget_class(t);
  hssize_t np = H5Sget_simple_extent_npoints(sp);
  char units[32];
  rp_h5_units(ds, units, sizeof units);
  double f = scale(k, units, dflt);
  if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && np >= 1 && f != 0) {
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
      *out = v * f;
      ok = 1;
    }
    H5Sclose(ms);
  } else if (f == 0) {
    fprintf(stderr, "beamd-replay: warning: file %s dataset %s: unknown units \"%s\"; "
            "left out of the metadata\n", s->path, path, units);
  }
  H5Tclose(t);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  return ok;
}

/* A string dataset (fixed or variable length) into buf. */
static int string_value(rp_src_t *s, const char *path, char *buf, size_t len) {
  buf[0] = '\0';
  if (!exists(s->file, path))
    return 0;
  hid_t ds = H5Dopen2(s->file, path, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  hid_t t = H5Dget_type(ds);
  hid_t sp = H5Dget_space(ds);
  if (H5Tget_class(t) == H5T_STRING && H5Sget_simple_extent_npoints(sp) == 1) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(t)); /* h5py writes UTF-8; no cset conversion */
    if (H5Tis_variable_str(t) > 0) {
      H5Tset_size(mt, H5T_VARIABLE);
      char *v = NULL;
      if (H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) >= 0 && v) {
        snprintf(buf, len, "%s", v);
        H5free_memory(v);
      }
    } else {
      size_t n = H5Tget_size(t);
      char *v = calloc(1, n + 1);
      H5Tset_size(mt, n + 1);
      if (v && H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0)
        snprintf(buf, len, "%s", v);
      free(v);
    }
    H5Tclose(mt);
  }
  H5Sclose(sp);
  H5Tclose(t);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  return buf[0] != '\0';
}

static json_t *ref(const char *file, const char *dataset) {
  return json_pack("{s:s, s:s}", "file", file, "dataset", dataset);
}

json_t *rp_meta_build(rp_src_t *s) {
  json_t *m = json_object();
  if (!m)
    return NULL;
  char name[256];
  double v, x, y;
  if (!string_value(s, DET "description", name, sizeof name) &&
      !string_value(s, DET "detector_name", name, sizeof name))
    snprintf(name, sizeof name, "unknown");
  json_object_set_new(m, "detector", json_string(name));
  if (quantity(s, DET "frame_time", Q_TIME, 1, &v))
    json_object_set_new(m, "frame_time", json_real(v));
  else if (quantity(s, DET "count_time", Q_TIME, 1, &v))
    json_object_set_new(m, "frame_time", json_real(v));
  else
    json_object_set_new(m, "frame_time", json_real(0.0)); /* unknown, see PROTOCOL 13.5 */
  if (quantity(s, DET "count_time", Q_TIME, 1, &v))
    json_object_set_new(m, "count_time", json_real(v));
  if (quantity(s, BEAM "incident_energy", Q_ENERGY, 1, &v) ||
      quantity(s, DET "detectorSpecific/photon_energy", Q_ENERGY, 1, &v)) {
    json_object_set_new(m, "energy", json_real(v));
  } else if (quantity(s, BEAM "incident_wavelength", Q_LENGTH, 1e-10, &v) && v > 0) {
    json_object_set_new(m, "energy", json_real(HC_EV_M / v));
  }
  if (quantity(s, DET "detector_distance", Q_LENGTH, 1, &v) ||
      quantity(s, DET "distance", Q_LENGTH, 1, &v))
    json_object_set_new(m, "distance", json_real(v));
  int hx = quantity(s, DET "x_pixel_size", Q_LENGTH, 1, &x);
  int hy = quantity(s, DET "y_pixel_size", Q_LENGTH, 1, &y);
  if (hx && (!hy || fabs(x - y) <= 1e-12 * fabs(x)))
    json_object_set_new(m, "pixel_size", json_real(x));
  else if (hx && hy)
    json_object_set_new(m, "pixel_size", json_pack("[ff]", y, x));
  if (quantity(s, DET "beam_center_x", Q_PIXELS, 1, &x) &&
      quantity(s, DET "beam_center_y", Q_PIXELS, 1, &y))
    json_object_set_new(m, "beam_center", json_pack("[ff]", y, x));
  static const char *masks[] = {DET "pixel_mask", DET "detectorSpecific/pixel_mask"};
  for (size_t i = 0; i < 2; i++) {
    if (exists(s->file, masks[i])) {
      json_object_set_new(m, "pixel_mask", ref(s->path, masks[i]));
      break;
    }
  }
  if (s->pos) {
    json_t *r = ref(s->path, s->pos_dataset);
    json_object_set_new(r, "units", json_string(s->pos_units));
    json_object_set_new(r, "per_frame", json_true());
    json_object_set_new(m, "scan_positions", r);
  }
  json_t *src = json_pack("{s:s, s:s, s:s}", "file", s->path, "dataset", s->dataset,
                          "file_id", s->file_id);
  if (src && s->is_master) {
    json_t *a = json_array();
    for (size_t i = 0; i < s->nparts; i++)
      json_array_append_new(a, json_pack("{s:s, s:s, s:I, s:b}", "file", s->parts[i].file,
                                         "dataset", s->parts[i].dataset, "frames",
                                         (json_int_t)s->parts[i].nframes, "readable",
                                         s->parts[i].dset >= 0));
    json_object_set_new(src, "data_files", a);
  }
  json_object_set_new(m, "source", src);
  return m;
}
