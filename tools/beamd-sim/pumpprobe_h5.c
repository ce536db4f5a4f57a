/* beamd-sim --pattern pumpprobe --write-h5 FILE: the delay scan as an HDF5
 * file in the layout beamd-replay serves (docs/replay.md) and beamd-fit
 * reads (docs/fit.md "beamd-fit"), with the truth beside the frames:
 *
 *   /entry/data/data     (N, H, W) Poisson counts, --dtype, chunk = 1 frame,
 *                        the same frames a streamed series has (series id 0's
 *                        stream, as the socket path uses)
 *   /entry/data/delay    (N,) float64, units "ps": the delay of each frame
 *   /entry/data          NXdata, signal "data", axes ["delay", ".", "."]
 *   /entry/instrument/detector/frame_time  [s]
 *   /entry/truth/params  (5, H, W) float32, the --pp-truth maps: a b tau f c;
 *                        attrs parameters, model, units
 *   /entry/truth         attrs: the simulation parameters (t0, delay_min,
 *                        delay_max, f_min, f_max, tau_min, tau_max,
 *                        amplitude, mean, seed)
 *
 * Not for the other patterns (ptycho has its own writer, ptycho_h5.c). The
 * frames are stored raw; --codec applies to the socket only. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"
#include "tools/beamd-sim/sim.h"

/* Every frame, one chunk each, rendered into one reused buffer. */
static int frames(hid_t f, sim_pp_t *s, const sim_opts_t *o, beam_diag_t *d) {
  hsize_t dims[3] = {o->frames, o->h, o->w}, one[3] = {1, o->h, o->w};
  hid_t sp = H5Screate_simple(3, dims, NULL);
  hid_t ms = H5Screate_simple(3, one, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 3, one);
  hid_t ds = H5Dcreate2(f, "/entry/data/data", sim_h5_file_type(o->dtype), sp, H5P_DEFAULT, dcpl,
                        H5P_DEFAULT);
  H5Pclose(dcpl);
  void *buf = malloc((size_t)o->h * o->w * beam_dtype_size(o->dtype));
  int rc = 0;
  if (ds < 0 || !buf) {
    rc = BEAM_DIAG(d, ds < 0 ? BEAM_EIO : BEAM_ENOMEM, "--write-h5: creating /entry/data/data");
  } else {
    for (uint64_t k = 0; k < o->frames && rc == 0; k++) {
      sim_pp_render(s, 0, k, buf);
      hsize_t off[3] = {k, 0, 0};
      H5Sselect_hyperslab(sp, H5S_SELECT_SET, off, NULL, one, NULL);
      if (H5Dwrite(ds, sim_h5_mem_type(o->dtype), ms, sp, H5P_DEFAULT, buf) < 0)
        rc = BEAM_DIAG(d, BEAM_EIO, "--write-h5: writing frame %llu", (unsigned long long)k);
    }
  }
  free(buf);
  H5Sclose(ms);
  H5Sclose(sp);
  if (ds >= 0)
    H5Dclose(ds);
  return rc;
}

int sim_pp_write_h5(sim_pp_t *s, const sim_opts_t *o, const char *path, beam_diag_t *d) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    return BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: cannot create the file", path);
  int bad = 0; /* the first failing metadata write; one message covers them */
  static const char *groups[][2] = {
      {"/entry", "NXentry"}, {"/entry/data", "NXdata"}, {"/entry/instrument", "NXinstrument"},
      {"/entry/instrument/detector", "NXdetector"}, {"/entry/truth", "NXcollection"},
  };
  hid_t g[5];
  for (size_t i = 0; i < 5; i++)
    bad |= (g[i] = beam_h5_group(f, groups[i][0], groups[i][1])) < 0;
  int rc = bad ? BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: creating the groups failed", path)
               : frames(f, s, o, d);
  if (rc == 0) {
    static const char *axes[3] = {"delay", ".", "."};
    bad |= beam_h5_attr_str(g[0], "definition", "NXmx") < 0;
    bad |= beam_h5_attr_str(g[1], "signal", "data") < 0;
    bad |= beam_h5_attr_strs(g[1], "axes", axes, 3) < 0;
    double *dl = malloc(o->frames * sizeof *dl);
    if (!dl) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "--write-h5: delays");
    } else {
      for (uint64_t k = 0; k < o->frames; k++)
        dl[k] = sim_pp_delay(s, k);
      hsize_t n = o->frames;
      hid_t ds = beam_h5_dataset(f, "/entry/data/delay", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, &n,
                                 dl, "ps");
      bad |= ds < 0;
      if (ds >= 0)
        H5Dclose(ds);
      free(dl);
    }
    bad |= beam_h5_scalar_f64(f, "/entry/instrument/detector/frame_time", sim_frame_time(o),
                              "s") < 0;
    hsize_t td[3] = {5, o->h, o->w};
    hid_t ds = beam_h5_dataset(f, "/entry/truth/params", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, td,
                               sim_pp_truth(s), NULL);
    bad |= ds < 0;
    if (ds >= 0) {
      static const char *names[5] = {"a", "b", "tau", "f", "c"};
      bad |= beam_h5_attr_strs(ds, "parameters", names, 5) < 0;
      bad |= beam_h5_attr_str(ds, "units", "a, b, c: counts; tau: ps; f: 1/ps") < 0;
      bad |= beam_h5_attr_str(ds, "model",
                              "lambda = c + exp(-u/tau)(a cos 2 pi f u + b sin 2 pi f u), "
                              "u = max(delay - t0, 0); Poisson counts") < 0;
      H5Dclose(ds);
    }
    const struct { const char *name; double v; } at[] = {
        {"t0", o->pp_t0},         {"delay_min", o->pp_dmin}, {"delay_max", o->pp_dmax},
        {"f_min", o->pp_fmin},    {"f_max", o->pp_fmax},     {"tau_min", o->pp_taumin},
        {"tau_max", o->pp_taumax}, {"amplitude", o->pp_amp}, {"mean", o->mean},
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
      bad |= beam_h5_attr_f64(g[4], at[i].name, at[i].v) < 0;
    bad |= beam_h5_attr_u64(g[4], "seed", o->seed) < 0;
    bad |= beam_h5_attr_str(g[4], "units", "delay, t0, tau: ps; f: 1/ps") < 0;
    if (rc == 0 && bad)
      rc = BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: writing the delays, metadata or truth failed",
                     path);
  }
  for (size_t i = 0; i < 5; i++)
    if (g[i] >= 0)
      H5Gclose(g[i]);
  if (H5Fclose(f) < 0 && rc == 0)
    rc = BEAM_DIAG(d, BEAM_EIO, "--write-h5 %s: closing the file failed", path);
  return rc;
}
