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

#include "daemon/h5util.h"

#define EV_J 1.602176634e-19

typedef struct wr_s {
  hid_t f;
  int failed;
  const char *where;
} wr_t;

/* Records the first failure (rc < 0, an int or an hid_t) and where it
 * happened; writing goes on, and one message at the end names it. */
static void check(wr_t *w, int64_t rc, const char *where) {
  if (rc >= 0)
    return;
  if (!w->failed)
    w->where = where;
  w->failed = 1;
}

static void group(wr_t *w, const char *path, const char *cls) {
  hid_t g = beam_h5_group(w->f, path, cls);
  check(w, g, path);
  if (g >= 0)
    H5Gclose(g);
}

static void dataset(wr_t *w, const char *path, hid_t ft, hid_t mt, int nd, const hsize_t *dims,
                    const void *data, const char *units) {
  hid_t ds = beam_h5_dataset(w->f, path, ft, mt, nd, dims, data, units);
  check(w, ds, path);
  if (ds >= 0)
    H5Dclose(ds);
}

static void scalar(wr_t *w, const char *path, double v, const char *units) {
  check(w, beam_h5_scalar_f64(w->f, path, v, units), path);
}

/* Complex doubles -> the file type of the precision (converted by HDF5),
 * h5py's compound {r, i}. */
static void complex_ds(wr_t *w, const char *path, int nd, const hsize_t *dims,
                       const double *data, int dbl) {
  hid_t ft = beam_h5_type(dbl ? BEAM_DT_C128 : BEAM_DT_C64), mt = beam_h5_type(BEAM_DT_C128);
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
    check(&w, beam_h5_attr_str(img, "signal", "data"), "signal");
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
    check(&w, -1, "source_1/probe link");
  hsize_t wd[2] = {r->nviews, 2};
  dataset(&w, "/entry_1/image_1/window_offsets", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, wd, r->rc,
          "pixel");

  scalar(&w, "/entry_1/instrument_1/source_1/energy", r->energy * EV_J, "J");
  hid_t en = H5Dopen2(w.f, "/entry_1/instrument_1/source_1/energy", H5P_DEFAULT);
  if (en >= 0) {
    check(&w, beam_h5_attr_f64(en, "energy_ev", r->energy), "energy_ev");
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
    check(&w, -1, "translation (no memory)");
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
    check(&w, -1, "history (no memory)");
  free(h);

  hid_t pr = H5Gopen2(w.f, "/entry_1/process_1", H5P_DEFAULT);
  if (pr >= 0) {
    check(&w, beam_h5_attr_str(pr, "program", "beamd-ptycho"), "program");
    check(&w, beam_h5_attr_str(pr, "algorithm", "difference map (pipeline/ptycho/dm.h)"),
          "algorithm");
    check(&w, beam_h5_attr_str(pr, "status", r->status), "status");
    check(&w, beam_h5_attr_f64(pr, "iterations", r->niter), "iterations");
    check(&w, beam_h5_attr_str(pr, "command_line", r->command_line), "command_line");
    H5Gclose(pr);
  }
  hid_t pg = H5Gopen2(w.f, "/entry_1/process_1/parameters", H5P_DEFAULT);
  if (pg >= 0) {
    for (size_t i = 0; i < r->nparams; i++) {
      const pt_param_t *p = &r->params[i];
      check(&w, p->is_str ? beam_h5_attr_str(pg, p->name, p->str ? p->str : "")
                          : beam_h5_attr_f64(pg, p->name, p->num), p->name);
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
