/* beamd-replay series metadata: the SERIES_START JSON taken from the file.
 *
 * Reads the NXmx / Eiger paths listed in docs/replay.md, converts values to
 * SI (eV for energy) using each dataset's "units" attribute, and refers to
 * large arrays (pixel mask, scan positions) by file and dataset rather than
 * inlining them; the pixel mask is also read (rp_mask_load) to be sent as
 * the SERIES_START payload. A value that is absent or unreadable is left out, never
 * guessed; nothing here is fatal, because frames without metadata are still
 * worth serving.
 */
#include "tools/beamd-replay/replay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"
#include "daemon/nxmx.h"

#define DET BEAM_NX_DET
#define BEAM BEAM_NX_BEAM

/* A field with unknown units is left out with a warning; one that is not a
 * number is left out quietly, as before metadata was optional. */
static int bad_field(void *ctx, const char *path, int code, const char *units) {
  rp_src_t *s = ctx;
  if (code == BEAM_NX_EUNITS)
    fprintf(stderr, "beamd-replay: warning: file %s dataset %s: unknown units \"%s\"; "
            "left out of the metadata\n", s->path, path, units);
  return 0;
}

/* First element of a numeric dataset, in SI: 1 when found, else 0. */
static int quantity(rp_src_t *s, const char *path, beam_nx_kind_t k, double *out) {
  return beam_nx_get(s->file, path, k, 1, out, bad_field, s) == 1;
}

/* A string dataset (fixed or variable length) into buf. */
static int string_value(rp_src_t *s, const char *path, char *buf, size_t len) {
  buf[0] = '\0';
  if (!beam_h5_exists(s->file, path))
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

static const char *mask_dataset(rp_src_t *s) {
  static const char *masks[] = {DET "pixel_mask", DET "detectorSpecific/pixel_mask"};
  for (size_t i = 0; i < 2; i++)
    if (beam_h5_exists(s->file, masks[i]))
      return masks[i];
  return NULL;
}

/* Largest value an element of dtype dt holds exactly as a mask value:
 * 2^N-1 for an N-bit unsigned type (the DECTRIS all-bits value), 2^(N-1)-1
 * signed; floats hold any uint32 closely enough to stay nonzero. 0 for a
 * dtype a mask cannot be sent in (complex). */
static double mask_max(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return 255.0;
  case BEAM_DT_U16: return 65535.0;
  case BEAM_DT_I8: return 127.0;
  case BEAM_DT_I16: return 32767.0;
  case BEAM_DT_I32: return 2147483647.0;
  case BEAM_DT_U32: case BEAM_DT_U64: case BEAM_DT_I64: case BEAM_DT_F32: case BEAM_DT_F64:
    return 4294967295.0;
  default: return 0.0;
  }
}

static void mask_put(beam_dtype_t dt, void *out, size_t i, double v) {
  switch (dt) {
  case BEAM_DT_U8: ((uint8_t *)out)[i] = (uint8_t)v; break;
  case BEAM_DT_U16: ((uint16_t *)out)[i] = (uint16_t)v; break;
  case BEAM_DT_U32: ((uint32_t *)out)[i] = (uint32_t)v; break;
  case BEAM_DT_U64: ((uint64_t *)out)[i] = (uint64_t)v; break;
  case BEAM_DT_I8: ((int8_t *)out)[i] = (int8_t)v; break;
  case BEAM_DT_I16: ((int16_t *)out)[i] = (int16_t)v; break;
  case BEAM_DT_I32: ((int32_t *)out)[i] = (int32_t)v; break;
  case BEAM_DT_I64: ((int64_t *)out)[i] = (int64_t)v; break;
  case BEAM_DT_F32: ((float *)out)[i] = (float)v; break;
  default: ((double *)out)[i] = v; break;
  }
}

static void *mask_warn(rp_src_t *s, const char *ds, const char *why) {
  fprintf(stderr, "beamd-replay: warning: file %s dataset %s: %s; the pixel mask is not sent "
          "with the series (stages with mask: series refuse it)\n", s->path, ds, why);
  return NULL;
}

void *rp_mask_load(rp_src_t *s, json_t *meta) {
  const char *path = mask_dataset(s);
  if (!path)
    return NULL;
  char why[512];
  double top = mask_max(s->dtype);
  if (top == 0.0)
    return mask_warn(s, path, "a mask cannot be sent in the frames' complex dtype");
  hid_t ds = H5Dopen2(s->file, path, H5P_DEFAULT);
  if (ds < 0)
    return mask_warn(s, path, rp_h5_reason(why, sizeof why));
  hid_t sp = H5Dget_space(ds), t = H5Dget_type(ds);
  H5T_class_t cls = H5Tget_class(t);
  int nd = H5Sget_simple_extent_ndims(sp);
  hsize_t dims[2] = {0, 0};
  if (nd == 2)
    H5Sget_simple_extent_dims(sp, dims, NULL);
  H5Tclose(t);
  H5Sclose(sp);
  size_t n = (size_t)s->h * s->w;
  double *v = NULL;
  void *out = NULL;
  const char *bad = NULL;
  if (cls != H5T_INTEGER && cls != H5T_FLOAT)
    bad = "not numbers";
  else if (nd != 2 || dims[0] != s->h || dims[1] != s->w) {
    snprintf(why, sizeof why, "shape is not the frame shape [%u, %u] (%d dimensions, [%llu, %llu])",
             s->h, s->w, nd, (unsigned long long)dims[0], (unsigned long long)dims[1]);
    bad = why;
  } else if (!(v = malloc(n * sizeof *v)) || !(out = malloc(s->raw_size)))
    bad = "out of memory";
  else if (H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
    bad = rp_h5_reason(why, sizeof why);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  if (bad) {
    free(v);
    free(out);
    return mask_warn(s, path, bad);
  }
  /* Nonzero (NaN included) stays nonzero: a value the frame dtype cannot
   * hold becomes its largest, a negative or fractional one 1. */
  for (size_t i = 0; i < n; i++) {
    double x = v[i];
    x = x == 0.0 ? 0.0 : !(x >= 1.0) ? 1.0 : x > top ? top : floor(x);
    mask_put(s->dtype, out, i, x);
  }
  free(v);
  json_object_set_new(meta, "mask", json_pack("{s:s, s:s, s:[I, I], s:s}", "array", "pixel_mask",
                                              "dtype", beam_dtype_name(s->dtype), "shape",
                                              (json_int_t)s->h, (json_int_t)s->w, "dataset", path));
  return out;
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
  if (quantity(s, DET "frame_time", BEAM_NX_TIME, &v))
    json_object_set_new(m, "frame_time", json_real(v));
  else if (quantity(s, DET "count_time", BEAM_NX_TIME, &v))
    json_object_set_new(m, "frame_time", json_real(v));
  else
    json_object_set_new(m, "frame_time", json_real(0.0)); /* unknown, see PROTOCOL 13.5 */
  if (quantity(s, DET "count_time", BEAM_NX_TIME, &v))
    json_object_set_new(m, "count_time", json_real(v));
  if (beam_nx_energy(s->file, &v, bad_field, s) == 1)
    json_object_set_new(m, "energy", json_real(v));
  if (beam_nx_distance(s->file, &v, bad_field, s) == 1)
    json_object_set_new(m, "distance", json_real(v));
  int hx = quantity(s, DET "x_pixel_size", BEAM_NX_LENGTH, &x);
  int hy = quantity(s, DET "y_pixel_size", BEAM_NX_LENGTH, &y);
  if (hx && (!hy || fabs(x - y) <= 1e-12 * fabs(x)))
    json_object_set_new(m, "pixel_size", json_real(x));
  else if (hx && hy)
    json_object_set_new(m, "pixel_size", json_pack("[ff]", y, x));
  if (quantity(s, DET "beam_center_x", BEAM_NX_PIXELS, &x) &&
      quantity(s, DET "beam_center_y", BEAM_NX_PIXELS, &y))
    json_object_set_new(m, "beam_center", json_pack("[ff]", y, x));
  const char *mask = mask_dataset(s);
  if (mask)
    json_object_set_new(m, "pixel_mask", ref(s->path, mask));
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

/* A string attribute "units" of ds into buf; 1 when found. */
static int units_attr(hid_t ds, char *buf, size_t len) {
  buf[0] = '\0';
  if (H5Aexists(ds, "units") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  hid_t a = H5Aopen(ds, "units", H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : -1;
  if (t >= 0 && H5Tget_class(t) == H5T_STRING) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(t));
    if (H5Tis_variable_str(t) > 0) {
      H5Tset_size(mt, H5T_VARIABLE);
      char *v = NULL;
      if (H5Aread(a, mt, &v) >= 0 && v) {
        snprintf(buf, len, "%s", v);
        H5free_memory(v);
      }
    } else {
      size_t n = H5Tget_size(t);
      char *v = calloc(1, n + 1);
      H5Tset_size(mt, n + 1);
      if (v && H5Aread(a, mt, v) >= 0)
        snprintf(buf, len, "%s", v);
      free(v);
    }
    H5Tclose(mt);
  }
  if (t >= 0)
    H5Tclose(t);
  if (a >= 0)
    H5Aclose(a);
  H5Eclear2(H5E_DEFAULT);
  return buf[0] != '\0';
}

int rp_meta_lists(json_t *m, rp_src_t *s, const char *const *specs, unsigned n,
                  beam_diag_t *d) {
  for (unsigned i = 0; i < n; i++) {
    const char *eq = strchr(specs[i], '=');
    const char *path = eq ? eq + 1 : specs[i];
    char key[256], why[512];
    if (eq)
      snprintf(key, sizeof key, "%.*s", (int)(eq - specs[i]), specs[i]);
    else
      snprintf(key, sizeof key, "%s", strrchr(path, '/') + 1);
    if (!key[0])
      return BEAM_DIAG(d, BEAM_EINVAL, "--meta-list %s: no key (give KEY=DSET)", specs[i]);
    if (!beam_h5_exists(s->file, path))
      return BEAM_DIAG(d, BEAM_EINVAL, "--meta-list: file %s dataset %s: no such dataset",
                       s->path, path);
    hid_t ds = H5Dopen2(s->file, path, H5P_DEFAULT);
    if (ds < 0)
      return BEAM_DIAG(d, BEAM_EIO, "--meta-list: file %s dataset %s: cannot open: %s", s->path,
                       path, rp_h5_reason(why, sizeof why));
    hid_t sp = H5Dget_space(ds), t = H5Dget_type(ds);
    H5T_class_t cls = H5Tget_class(t);
    int nd = H5Sget_simple_extent_ndims(sp);
    hsize_t dims[1] = {0};
    if (nd == 1)
      H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Tclose(t);
    H5Sclose(sp);
    int rc = 0;
    double *v = NULL;
    if (cls != H5T_INTEGER && cls != H5T_FLOAT)
      rc = BEAM_DIAG(d, BEAM_ESHAPE, "--meta-list: file %s dataset %s: not numbers", s->path, path);
    else if (nd != 1 || dims[0] != s->nframes)
      rc = BEAM_DIAG(d, BEAM_ESHAPE, "--meta-list: file %s dataset %s: expected one value per "
                     "frame, %llu values (1-D); it has %d dimensions, %llu values", s->path, path,
                     (unsigned long long)s->nframes, nd, (unsigned long long)dims[0]);
    else if (!(v = malloc(s->nframes * sizeof *v)))
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "--meta-list %s", specs[i]);
    else if (H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
      rc = BEAM_DIAG(d, BEAM_EIO, "--meta-list: file %s dataset %s: %s", s->path, path,
                     rp_h5_reason(why, sizeof why));
    char units[64];
    int have_units = rc == 0 && units_attr(ds, units, sizeof units);
    H5Dclose(ds);
    json_t *a = rc == 0 ? json_array() : NULL;
    if (rc == 0 && !a)
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "--meta-list %s", specs[i]);
    /* JSON has no NaN or Inf: such a frame gets null (no value). */
    for (uint64_t k = 0; rc == 0 && k < s->nframes; k++)
      if (json_array_append_new(a, isfinite(v[k]) ? json_real(v[k]) : json_null()) < 0)
        rc = BEAM_DIAG(d, BEAM_ENOMEM, "--meta-list %s", specs[i]);
    free(v);
    if (rc < 0) {
      json_decref(a);
      return rc;
    }
    json_object_set_new(m, key, a);
    if (have_units) {
      char uk[300];
      snprintf(uk, sizeof uk, "%s_units", key);
      json_object_set_new(m, uk, json_string(units));
    }
  }
  return 0;
}
