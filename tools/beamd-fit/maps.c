/* beamd-fit output: MAPS.h5, written by rank 0 alone.
 *
 * Debian's libhdf5 is the serial build (no H5_HAVE_PARALLEL in
 * H5pubconf.h), so there is no parallel HDF5 to write from every rank:
 * rank 0 gathers each round's tiles and writes them here, a tile at a
 * time, so its memory stays at `size` tiles of results whatever the image.
 * Every dataset is created filled with its "not fitted" value (NaN, -1,
 * status 255), so masked pixels need no writes. */
#include "tools/beamd-fit/bfit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"

#define BF_NOT_FITTED 255

static const char *est_name(beam_fit_estimator_t e) {
  return e == BEAM_FIT_LSE ? "wls" : e == BEAM_FIT_LSE_POISSON ? "poisson" : "mle";
}

/* Fill value of output k of BF_STRIDE(P). */
static double fill_of(int k, int P) {
  return k == 2 * P + 2 ? -1 : k == 2 * P + 3 ? 0 : k == 2 * P + 4 ? BF_NOT_FITTED : NAN;
}

static hid_t make_ds(hid_t g, const char *name, hid_t ft, double fill, uint32_t h, uint32_t w) {
  hsize_t dims[2] = {h, w}, chunk[2];
  /* Chunks of whole rows, about 1 MiB of doubles: a tile's rows land in a
   * few chunks and the default chunk cache holds one. */
  uint64_t rows = 131072 / w ? 131072 / w : 1;
  chunk[0] = rows < h ? rows : h;
  chunk[1] = w;
  hid_t sp = H5Screate_simple(2, dims, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(pl, 2, chunk);
  H5Pset_fill_value(pl, H5T_NATIVE_DOUBLE, &fill);
  H5Pset_fill_time(pl, H5D_FILL_TIME_IFSET);
  hid_t ds = H5Dcreate2(g, name, ft, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
  H5Pclose(pl);
  H5Sclose(sp);
  return ds;
}

int bf_maps_create(bf_maps_t *m, const char *path, const bf_opts_t *o, const bf_input_t *in,
                   const bf_mpi_t *mpi, int threads, uint64_t tile, const char *isa,
                   const char *cmdline, beam_diag_t *d) {
  char why[512];
  memset(m, 0, sizeof *m);
  m->file = -1;
  m->h = in->h;
  m->w = in->w;
  int P = o->np;
  m->nds = BF_STRIDE(P);
  m->row = malloc(in->w * sizeof *m->row);
  if (!m->row)
    return BEAM_DIAG(d, BEAM_ENOMEM, "output row");
  m->file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (m->file < 0)
    return BEAM_DIAG(d, BEAM_EIO, "file %s: cannot create: %s", path,
                     rp_h5_reason(why, sizeof why));
  hid_t g = beam_h5_group(m->file, "/maps", "NXprocess");
  if (g < 0)
    return BEAM_DIAG(d, BEAM_EIO, "file %s: /maps: %s", path, rp_h5_reason(why, sizeof why));
  const beam_fit_model_info_t *mi = beam_fit_model_info(o->batch.model);
  const char *names[BEAM_FIT_MAX_PARAMS];
  int bad = 0;
  for (int k = 0; k < m->nds && !bad; k++) {
    char nm[64];
    hid_t ft = H5T_IEEE_F64LE;
    if (k < P)
      snprintf(nm, sizeof nm, "%s", mi->param_names[k]);
    else if (k < 2 * P)
      snprintf(nm, sizeof nm, "%s_err", mi->param_names[k - P]);
    else {
      static const char *const tail[] = {"chi2", "chi2_red", "iters", "n_used", "status"};
      snprintf(nm, sizeof nm, "%s", tail[k - 2 * P]);
      ft = k == 2 * P + 4 ? H5T_STD_U8LE : k >= 2 * P + 2 ? H5T_STD_I32LE : ft;
    }
    if (k < P)
      names[k] = mi->param_names[k];
    m->ds[k] = make_ds(g, nm, ft, fill_of(k, P), in->h, in->w);
    bad = m->ds[k] < 0;
  }
  hsize_t T = in->T;
  hid_t xd = bad ? -1 : beam_h5_dataset(g, "x", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, &T, in->x,
                                        NULL);
  bad = bad || xd < 0;
  if (xd >= 0)
    H5Dclose(xd);
  static const char *const st[] = {"converged", "bound", "max_iter", "singular", "bad_input",
                                   "too_few"};
  uint64_t shape[2] = {in->h, in->w};
  const beam_fit_opts_t *f = &o->fit;
  if (!bad)
    bad = beam_h5_attr_str(g, "model", mi->name) ||
          beam_h5_attr_strs(g, "parameters", names, (size_t)P) ||
          beam_h5_attr_str(g, "estimator", est_name(f->estimator)) ||
          beam_h5_attr_str(g, "init", f->init == BEAM_FIT_INIT_GIVEN ? "given" : "auto") ||
          beam_h5_attr_i64(g, "max_iter", f->max_iter) || beam_h5_attr_f64(g, "ftol", f->ftol) ||
          beam_h5_attr_f64(g, "xtol", f->xtol) || beam_h5_attr_f64(g, "gtol", f->gtol) ||
          beam_h5_attr_f64(g, "lambda0", f->lambda0) ||
          beam_h5_attr_bool(g, "absolute_sigma", f->absolute_sigma) ||
          beam_h5_attr_f64s(g, "lower_bounds", o->lo, (size_t)P) ||
          beam_h5_attr_f64s(g, "upper_bounds", o->hi, (size_t)P) ||
          (f->init == BEAM_FIT_INIT_GIVEN && beam_h5_attr_f64s(g, "p0", o->p0, (size_t)P)) ||
          (o->batch.model == BEAM_FIT_POLY &&
           beam_h5_attr_i64(g, "poly_degree", o->batch.poly_degree)) ||
          beam_h5_attr_strs(g, "status_names", st, 6) ||
          beam_h5_attr_i64(g, "status_not_fitted", BF_NOT_FITTED) ||
          beam_h5_attr_str(g, "source_file", in->src.path) ||
          beam_h5_attr_str(g, "source_dataset", in->src.dataset) ||
          beam_h5_attr_str(g, "x_source", in->x_what) ||
          beam_h5_attr_u64(g, "frames", in->T) || beam_h5_attr_u64s(g, "frame_shape", shape, 2) ||
          beam_h5_attr_u64(g, "pixels_fitted", in->npix) ||
          beam_h5_attr_str(g, "mask", o->mask ? o->mask : "") ||
          beam_h5_attr_u64s(g, "roi", (const uint64_t[4]){o->have_roi ? o->roi[0] : 0,
                                                          o->have_roi ? o->roi[1] : in->h,
                                                          o->have_roi ? o->roi[2] : 0,
                                                          o->have_roi ? o->roi[3] : in->w}, 4) ||
          beam_h5_attr_i64(g, "ranks", mpi->size) ||
          beam_h5_attr_i64(g, "threads_per_rank", threads) ||
          beam_h5_attr_u64(g, "tile_pixels", tile) ||
          beam_h5_attr_str(g, "backend", o->backend == BF_CUDA ? "cuda" : "cpu") ||
          beam_h5_attr_str(g, "isa", isa) || beam_h5_attr_str(g, "command_line", cmdline) ||
          beam_h5_attr_str(g, "program", "beamd-fit");
  H5Gclose(g);
  if (bad)
    return BEAM_DIAG(d, BEAM_EIO, "file %s: writing /maps: %s", path,
                     rp_h5_reason(why, sizeof why));
  return 0;
}

int bf_maps_write(bf_maps_t *m, const bf_input_t *in, int np, uint64_t a, uint64_t b,
                  const double *res, beam_diag_t *d) {
  char why[512];
  const int S = BF_STRIDE(np);
  const uint32_t *pix = in->pix;
  /* One row segment at a time: from the first to the last selected pixel
   * of that row in the tile, gaps left at their fill value. */
  for (uint64_t k = a; k < b;) {
    uint32_t y = pix[k] / m->w, x0 = pix[k] % m->w;
    uint64_t e = k;
    while (e < b && pix[e] / m->w == y)
      e++;
    uint32_t x1 = pix[e - 1] % m->w + 1;
    hsize_t off[2] = {y, x0}, cnt[2] = {1, x1 - x0};
    hid_t ms = H5Screate_simple(2, cnt, NULL);
    for (int q = 0; q < m->nds; q++) {
      double fill = fill_of(q, np);
      for (uint32_t x = x0; x < x1; x++)
        m->row[x - x0] = fill;
      for (uint64_t i = k; i < e; i++)
        m->row[pix[i] % m->w - x0] = res[(i - a) * S + q];
      hid_t fs = H5Dget_space(m->ds[q]);
      int bad = H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL) < 0 ||
                H5Dwrite(m->ds[q], H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, m->row) < 0;
      H5Sclose(fs);
      if (bad) {
        H5Sclose(ms);
        return BEAM_DIAG(d, BEAM_EIO, "writing the maps (row %u): %s", y,
                         rp_h5_reason(why, sizeof why));
      }
    }
    H5Sclose(ms);
    k = e;
  }
  return 0;
}

int bf_maps_close(bf_maps_t *m, double seconds, beam_diag_t *d) {
  char why[512];
  int bad = 0;
  if (m->file >= 0) {
    hid_t g = H5Gopen2(m->file, "/maps", H5P_DEFAULT);
    if (g >= 0 && seconds >= 0)
      bad |= beam_h5_attr_f64(g, "seconds", seconds);
    if (g >= 0)
      H5Gclose(g);
  }
  for (int k = 0; k < m->nds; k++)
    if (m->ds[k] > 0)
      bad |= H5Dclose(m->ds[k]) < 0;
  if (m->file >= 0)
    bad |= H5Fclose(m->file) < 0;
  free(m->row);
  memset(m, 0, sizeof *m);
  m->file = -1;
  if (bad && d)
    return BEAM_DIAG(d, BEAM_EIO, "closing the maps file: %s", rp_h5_reason(why, sizeof why));
  return 0;
}
