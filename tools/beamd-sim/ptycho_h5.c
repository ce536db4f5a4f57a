/* beamd-sim --write-h5: the ptycho scan as an NXmx-style file in the
 * layout beamd-replay serves (docs/replay.md) and beamd-ptycho reads,
 * plus the truth for tests (docs/ptycho.md "Simulated scans"):
 *
 *   /entry/data/data                        (N, H, W) frames, --dtype, chunk = 1 frame
 *   /entry/sample/positions                 (N, 2) x, y  [m]
 *   /entry/instrument/beam/incident_energy  [eV]
 *   /entry/instrument/detector/{detector_distance, x_pixel_size, y_pixel_size} [m],
 *                              {beam_center_x, beam_center_y} [pixel], frame_time [s]
 *   /entry/truth/object      (obj_h, obj_w) complex128; attrs pixel_size [m],
 *                            origin [y, x] (m, position of pixel (0, 0))
 *   /entry/truth/probe       (M, n, n) complex128, sum |P|^2 = photons
 *   /entry/truth/window_offsets (N, 2) int32 (row, col) top-left in object pixels
 *   /entry/truth attributes: the simulation parameters
 */
#include "tools/beamd-sim/ptycho_int.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"

typedef struct wr_s {
  hid_t f;
  int failed;
} wr_t;

/* The writers below record the first failure in w and go on, so one
 * message at the end covers the metadata and truth. */
static void check(wr_t *w, int64_t rc) { /* an int or an hid_t */
  if (rc < 0)
    w->failed = 1;
}

static hid_t group(wr_t *w, const char *path, const char *nx_class) {
  hid_t g = beam_h5_group(w->f, path, nx_class);
  check(w, g);
  return g;
}

/* An array dataset written from memory type mt; returns it open (or -1). */
static hid_t array(wr_t *w, const char *path, hid_t ft, hid_t mt, int nd, const hsize_t *dims,
                   const void *data) {
  hid_t ds = beam_h5_dataset(w->f, path, ft, mt, nd, dims, data, NULL);
  check(w, ds);
  return ds;
}

hid_t sim_h5_file_type(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return H5T_STD_U8LE;
  case BEAM_DT_U16: return H5T_STD_U16LE;
  case BEAM_DT_U32: return H5T_STD_U32LE;
  default: return H5T_IEEE_F32LE;
  }
}

hid_t sim_h5_mem_type(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return H5T_NATIVE_UINT8;
  case BEAM_DT_U16: return H5T_NATIVE_UINT16;
  case BEAM_DT_U32: return H5T_NATIVE_UINT32;
  default: return H5T_NATIVE_FLOAT;
  }
}

static int frames(wr_t *w, sim_ptycho_t *s, beam_diag_t *d) {
  hsize_t dims[3] = {s->count, s->h, s->w}, chunk[3] = {1, s->h, s->w};
  hid_t sp = H5Screate_simple(3, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 3, chunk);
  hid_t ds = H5Dcreate2(w->f, "/entry/data/data", sim_h5_file_type(s->dtype), sp, H5P_DEFAULT, dcpl,
                        H5P_DEFAULT);
  H5Pclose(dcpl);
  size_t bytes = (size_t)s->h * s->w * beam_dtype_size(s->dtype);
  void *buf = malloc(bytes);
  hsize_t one[3] = {1, s->h, s->w};
  hid_t ms = H5Screate_simple(3, one, NULL);
  int rc = 0;
  if (ds < 0 || !buf) {
    rc = BEAM_DIAG(d, ds < 0 ? BEAM_EIO : BEAM_ENOMEM, "creating /entry/data/data");
  } else {
    for (uint32_t k = 0; k < s->count && rc == 0; k++) {
      double pos[3];
      sim_ptycho_render(s, k, buf, pos);
      hsize_t off[3] = {k, 0, 0};
      H5Sselect_hyperslab(sp, H5S_SELECT_SET, off, NULL, one, NULL);
      if (H5Dwrite(ds, sim_h5_mem_type(s->dtype), ms, sp, H5P_DEFAULT, buf) < 0)
        rc = BEAM_DIAG(d, BEAM_EIO, "writing frame %u", k);
    }
  }
  free(buf);
  H5Sclose(ms);
  H5Sclose(sp);
  if (ds >= 0)
    H5Dclose(ds);
  return rc;
}

static void truth(wr_t *w, sim_ptycho_t *s) {
  hid_t g = group(w, "/entry/truth", "NXcollection");
  if (g < 0)
    return;
  hid_t ct = beam_h5_type(BEAM_DT_C128); /* h5py's complex128 {r, i} */
  hsize_t od[2] = {s->geom.obj_h, s->geom.obj_w};
  hid_t ds = array(w, "/entry/truth/object", ct, ct, 2, od, s->object);
  if (ds >= 0) {
    double org[2] = {s->geom.origin_y, s->geom.origin_x};
    check(w, beam_h5_attr_f64(ds, "pixel_size", s->geom.pixel_m));
    check(w, beam_h5_attr_f64s(ds, "origin", org, 2));
    check(w, beam_h5_attr_str(ds, "origin_units", "m"));
    H5Dclose(ds);
  }
  hsize_t pd[3] = {s->modes, s->n, s->n};
  ds = array(w, "/entry/truth/probe", ct, ct, 3, pd, s->probe);
  if (ds >= 0) {
    check(w, beam_h5_attr_f64(ds, "pixel_size", s->geom.pixel_m));
    H5Dclose(ds);
  }
  H5Tclose(ct);
  hsize_t wd[2] = {s->count, 2};
  ds = array(w, "/entry/truth/window_offsets", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, wd, s->rc);
  if (ds >= 0)
    H5Dclose(ds);
  check(w, beam_h5_attr_str(g, "object_source", s->object_src));
  check(w, beam_h5_attr_str(g, "noise", s->poisson ? "poisson" : "none"));
  check(w, beam_h5_attr_str(g, "scan", s->raster ? "raster" : "fermat"));
  check(w, beam_h5_attr_u64(g, "seed", s->seed));
  check(w, beam_h5_attr_u64(g, "n", s->n));
  check(w, beam_h5_attr_u64(g, "probe_modes", s->modes));
  check(w, beam_h5_attr_f64(g, "photons", s->photons));
  check(w, beam_h5_attr_f64(g, "scan_step", s->step));
  check(w, beam_h5_attr_f64(g, "scan_jitter", s->jitter));
  /* diameter, outer zone, stop, defocus [m] */
  check(w, beam_h5_attr_f64s(g, "zone_plate", s->zp, 4));
  check(w, beam_h5_attr_u64(g, "saturated_pixels", s->saturated));
  H5Gclose(g);
}

int sim_ptycho_write_h5(sim_ptycho_t *s, const sim_opts_t *o, const char *path,
                        beam_diag_t *d) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  wr_t w = {.f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)};
  if (w.f < 0)
    return BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: cannot create the file", path);
  static const char *groups[][2] = {
      {"/entry", "NXentry"}, {"/entry/data", "NXdata"}, {"/entry/instrument", "NXinstrument"},
      {"/entry/instrument/detector", "NXdetector"}, {"/entry/instrument/beam", "NXbeam"},
      {"/entry/sample", "NXsample"},
  };
  for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
    hid_t g = group(&w, groups[i][0], groups[i][1]);
    if (g >= 0) {
      if (i == 0)
        check(&w, beam_h5_attr_str(g, "definition", "NXmx"));
      H5Gclose(g);
    }
  }
  int rc = frames(&w, s, d);
  if (rc == 0) {
    hsize_t pd[2] = {s->count, 2};
    hid_t ds = beam_h5_dataset(w.f, "/entry/sample/positions", H5T_IEEE_F64LE,
                               H5T_NATIVE_DOUBLE, 2, pd, s->pos_xy, "m");
    check(&w, ds);
    if (ds >= 0) {
      check(&w, beam_h5_attr_str(ds, "axes", "x,y"));
      H5Dclose(ds);
    }
    static const char *det = "/entry/instrument/detector/";
    const struct { const char *name; double v; const char *units; } sc[] = {
        {"detector_distance", s->distance, "m"}, {"x_pixel_size", s->pixel, "m"},
        {"y_pixel_size", s->pixel, "m"},         {"beam_center_x", s->cx, "pixel"},
        {"beam_center_y", s->cy, "pixel"},       {"frame_time", sim_frame_time(o), "s"},
    };
    check(&w, beam_h5_scalar_f64(w.f, "/entry/instrument/beam/incident_energy", s->energy,
                                 "eV"));
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
      char p[128];
      snprintf(p, sizeof p, "%s%s", det, sc[i].name);
      check(&w, beam_h5_scalar_f64(w.f, p, sc[i].v, sc[i].units));
    }
    truth(&w, s);
    if (w.failed)
      rc = BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: writing metadata or truth failed", path);
  }
  if (H5Fclose(w.f) < 0 && rc == 0)
    rc = BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: closing the file failed", path);
  if (rc == 0 && s->saturated)
    fprintf(stderr, "beamd-sim: warning: %llu pixels clamped at the %s maximum\n",
            (unsigned long long)s->saturated, beam_dtype_name(s->dtype));
  return rc;
}
