/* beamd-ptycho result file, CXI conventions where they apply (see
 * docs/ptycho.md "Result file"):
 *
 *   /cxi_version                                   150
 *   /entry_1/image_1/data                          (obj_h, obj_w) complex, object mode 0
 *   /entry_1/image_1/object_modes                  (M_O, obj_h, obj_w) when M_O > 1
 *   /entry_1/image_1/{x,y}_pixel_size              object pixel [m]
 *   /entry_1/image_1/origin                        [y, x] of pixel (0, 0) [m]
 *   /entry_1/image_1/probe                         (M_P, n, n) complex
 *   /entry_1/image_1/window_offsets                (N, 2) int32 row, col [object pixels]
 *   /entry_1/instrument_1/source_1/probe           soft link to image_1/probe
 *   /entry_1/instrument_1/source_1/energy          [J] (CXI), attribute energy_ev
 *   /entry_1/instrument_1/detector_1/{distance, x_pixel_size, y_pixel_size} [m]
 *   /entry_1/instrument_1/detector_1/beam_center   [y, x] pixels used for the crop
 *   /entry_1/sample_1/geometry_1/translation       (N, 3) x, y, 0 [m]
 *   /entry_1/process_1/history/{fourier_error, probe_change, object_change, seconds}
 *   /entry_1/process_1/parameters                  one attribute per parameter
 *   /entry_1/process_1 attributes: program, status, iterations, command_line
 * Complex values are compounds {r, i} (h5py's layout), float32 pairs for
 * --precision single and float64 for double.
 */
#include "tools/beamd-ptycho/ptycho.h"

#include <stdlib.h>
#include <string.h>

#define EV_J 1.602176634e-19

typedef struct wr_s {
  hid_t f;
  int failed;
  const char *where;
} wr_t;

static void fail(wr_t *w, const char *where) {
  if (!w->failed)
    w->where = where;
  w->failed = 1;
}

static void attr_str(wr_t *w, hid_t obj, const char *name, const char *val) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, strlen(val) + 1);
  H5Tset_cset(t, H5T_CSET_UTF8);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0 || H5Awrite(a, t, val) < 0)
    fail(w, name);
  if (a >= 0)
    H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
}

static void attr_dbl(wr_t *w, hid_t obj, const char *name, double v) {
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0 || H5Awrite(a, H5T_NATIVE_DOUBLE, &v) < 0)
    fail(w, name);
  if (a >= 0)
    H5Aclose(a);
  H5Sclose(sp);
}

static hid_t group(wr_t *w, const char *path, const char *cls) {
  hid_t g = H5Gcreate2(w->f, path, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) {
    fail(w, path);
    return g;
  }
  if (cls)
    attr_str(w, g, "NX_class", cls);
  H5Gclose(g);
  return 0;
}

static void dataset(wr_t *w, const char *path, hid_t ft, hid_t mt, int nd, const hsize_t *dims,
                    const void *data, const char *units) {
  hid_t sp = nd ? H5Screate_simple(nd, dims, NULL) : H5Screate(H5S_SCALAR);
  hid_t ds = H5Dcreate2(w->f, path, ft, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ds < 0 || H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    fail(w, path);
  if (ds >= 0) {
    if (units)
      attr_str(w, ds, "units", units);
    H5Dclose(ds);
  }
  H5Sclose(sp);
}

static void scalar(wr_t *w, const char *path, double v, const char *units) {
  dataset(w, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, NULL, &v, units);
}

static hid_t complex_type(int dbl) {
  size_t e = dbl ? sizeof(double) : sizeof(float);
  hid_t t = H5Tcreate(H5T_COMPOUND, 2 * e);
  H5Tinsert(t, "r", 0, dbl ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT);
  H5Tinsert(t, "i", e, dbl ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT);
  return t;
}

/* Complex doubles -> the file type of the precision (converted by HDF5). */
static void complex_ds(wr_t *w, const char *path, int nd, const hsize_t *dims,
                       const double *data, int dbl) {
  hid_t ft = complex_type(dbl), mt = complex_type(1);
  dataset(w, path, ft, mt, nd, dims, data, NULL);
  H5Tclose(ft);
  H5Tclose(mt);
}

int pt_result_write(const pt_result_t *r, beam_diag_t *d) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  wr_t w = {.f = H5Fcreate(r->path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)};
  if (w.f < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_DIAG(d, BEAM_EIO, "result %s: cannot create the file", r->path);
  }
  const beam_dm_conf_t *c = r->conf;
  int dbl = c->prec == BEAM_DM_F64;
  int ver = 150;
  dataset(&w, "/cxi_version", H5T_STD_I32LE, H5T_NATIVE_INT, 0, NULL, &ver, NULL);
  group(&w, "/entry_1", "NXentry");
  group(&w, "/entry_1/image_1", "NXdata");
  group(&w, "/entry_1/instrument_1", "NXinstrument");
  group(&w, "/entry_1/instrument_1/source_1", "NXsource");
  group(&w, "/entry_1/instrument_1/detector_1", "NXdetector");
  group(&w, "/entry_1/sample_1", "NXsample");
  group(&w, "/entry_1/sample_1/geometry_1", "NXgeometry");
  group(&w, "/entry_1/process_1", "NXprocess");
  group(&w, "/entry_1/process_1/history", "NXcollection");
  group(&w, "/entry_1/process_1/parameters", "NXparameters");

  hsize_t od[2] = {c->obj_h, c->obj_w};
  complex_ds(&w, "/entry_1/image_1/data", 2, od, r->object, dbl);
  if (c->object_modes > 1) {
    hsize_t om[3] = {c->object_modes, c->obj_h, c->obj_w};
    complex_ds(&w, "/entry_1/image_1/object_modes", 3, om, r->object, dbl);
  }
  hid_t img = H5Gopen2(w.f, "/entry_1/image_1", H5P_DEFAULT);
  if (img >= 0) {
    attr_str(&w, img, "signal", "data");
    H5Gclose(img);
  }
  scalar(&w, "/entry_1/image_1/x_pixel_size", r->geom->pixel_m, "m");
  scalar(&w, "/entry_1/image_1/y_pixel_size", r->geom->pixel_m, "m");
  hsize_t two = 2;
  double org[2] = {r->geom->origin_y, r->geom->origin_x};
  dataset(&w, "/entry_1/image_1/origin", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, &two, org, "m");
  const char *dt = "object", *ds_ = "real";
  hid_t st = H5Tcopy(H5T_C_S1);
  H5Tset_size(st, 7);
  dataset(&w, "/entry_1/image_1/data_type", st, st, 0, NULL, dt, NULL);
  H5Tset_size(st, 5);
  dataset(&w, "/entry_1/image_1/data_space", st, st, 0, NULL, ds_, NULL);
  H5Tclose(st);
  hsize_t pd[3] = {c->probe_modes, c->n, c->n};
  complex_ds(&w, "/entry_1/image_1/probe", 3, pd, r->probe, dbl);
  if (H5Lcreate_soft("/entry_1/image_1/probe", w.f, "/entry_1/instrument_1/source_1/probe",
                     H5P_DEFAULT, H5P_DEFAULT) < 0)
    fail(&w, "source_1/probe link");
  hsize_t wd[2] = {r->nviews, 2};
  dataset(&w, "/entry_1/image_1/window_offsets", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, wd, r->rc,
          "pixel");

  scalar(&w, "/entry_1/instrument_1/source_1/energy", r->energy * EV_J, "J");
  hid_t en = H5Dopen2(w.f, "/entry_1/instrument_1/source_1/energy", H5P_DEFAULT);
  if (en >= 0) {
    attr_dbl(&w, en, "energy_ev", r->energy);
    H5Dclose(en);
  }
  scalar(&w, "/entry_1/instrument_1/detector_1/distance", r->distance, "m");
  scalar(&w, "/entry_1/instrument_1/detector_1/x_pixel_size", r->det_pixel, "m");
  scalar(&w, "/entry_1/instrument_1/detector_1/y_pixel_size", r->det_pixel, "m");
  double bc[2] = {r->cy, r->cx};
  dataset(&w, "/entry_1/instrument_1/detector_1/beam_center", H5T_IEEE_F64LE,
          H5T_NATIVE_DOUBLE, 1, &two, bc, "pixel");

  double *tr = malloc((size_t)r->nviews * 3 * sizeof *tr);
  if (tr) {
    for (uint32_t i = 0; i < r->nviews; i++) {
      tr[3 * i] = r->pos_yx[2 * i + 1];
      tr[3 * i + 1] = r->pos_yx[2 * i];
      tr[3 * i + 2] = 0.0;
    }
    hsize_t td[2] = {r->nviews, 3};
    dataset(&w, "/entry_1/sample_1/geometry_1/translation", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
            2, td, tr, "m");
    free(tr);
  } else {
    fail(&w, "translation (no memory)");
  }

  double *h = malloc(((size_t)r->niter + 1) * sizeof *h);
  static const char *names[4] = {"fourier_error", "probe_change", "object_change", "seconds"};
  for (int k = 0; k < 4 && h; k++) {
    for (uint32_t i = 0; i < r->niter; i++) {
      const beam_dm_metrics_t *m = &r->hist[i];
      h[i] = k == 0 ? m->fourier_error : k == 1 ? m->probe_change
           : k == 2 ? m->object_change : m->seconds;
    }
    char p[96];
    snprintf(p, sizeof p, "/entry_1/process_1/history/%s", names[k]);
    hsize_t hd = r->niter;
    dataset(&w, p, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, &hd, h, k == 3 ? "s" : NULL);
  }
  if (!h)
    fail(&w, "history (no memory)");
  free(h);

  hid_t pr = H5Gopen2(w.f, "/entry_1/process_1", H5P_DEFAULT);
  if (pr >= 0) {
    attr_str(&w, pr, "program", "beamd-ptycho");
    attr_str(&w, pr, "algorithm", "difference map (pipeline/ptycho/dm.h)");
    attr_str(&w, pr, "status", r->status);
    attr_dbl(&w, pr, "iterations", r->niter);
    attr_str(&w, pr, "command_line", r->command_line);
    H5Gclose(pr);
  }
  hid_t pg = H5Gopen2(w.f, "/entry_1/process_1/parameters", H5P_DEFAULT);
  if (pg >= 0) {
    for (size_t i = 0; i < r->nparams; i++) {
      if (r->params[i].is_str)
        attr_str(&w, pg, r->params[i].name, r->params[i].str ? r->params[i].str : "");
      else
        attr_dbl(&w, pg, r->params[i].name, r->params[i].num);
    }
    H5Gclose(pg);
  }
  int rc = 0;
  if (w.failed)
    rc = BEAM_DIAG(d, BEAM_EIO, "result %s: writing %s failed", r->path, w.where);
  if (H5Fclose(w.f) < 0 && rc == 0)
    rc = BEAM_DIAG(d, BEAM_EIO, "result %s: closing the file failed", r->path);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}
