/* Stage kind `ptycho_dm`: its schema, the loading of its parameters and
 * files (probe, object, mask), and the series metadata it reads (scan
 * positions, beam centre). The stage itself: ptycho_dm.c. */
#include "pipeline/kern/ptycho_dm.h"

#include <math.h>
#include <string.h>

#include <jansson.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

static const char *beta_valid(const beam_cnode_t *v) {
  return v->fval > 0 && v->fval <= 1 ? NULL : "beta must be in (0, 1]";
}
static const char *two_valid(const beam_cnode_t *v) {
  return v->n == 2 ? NULL : "expected two numbers [y, x]";
}
static const char *four_valid(const beam_cnode_t *v) {
  return v->n == 4 ? NULL : "expected four numbers [y0, x0, y1, x1]";
}

static const beam_param_t probe_params[] = {
    {"init", BEAM_P_ENUM, "mean", 0, 0, 0, "mean|file|zone_plate", NULL,
     "initial probe: mean (inverse FFT of the first frames' mean amplitude), file, or zone_plate", NULL},
    {"file", BEAM_P_INFILE, NULL, 0, 0, 0, NULL, NULL,
     "init file: complex .npy or .h5 probe [n, n] or [modes, n, n]", NULL},
    {"dataset", BEAM_P_STRING, "/probe", 0, 0, 0, NULL, NULL, "HDF5 dataset of the probe file", NULL},
    {"zp_diameter", BEAM_P_FLOAT, "0", 0, 0, 1, NULL, NULL, "zone plate diameter, m", NULL},
    {"zp_outer_zone", BEAM_P_FLOAT, "0", 0, 0, 1, NULL, NULL, "zone plate outer zone width, m", NULL},
    {"central_stop", BEAM_P_FLOAT, "0", 0, 0, 1, NULL, NULL, "central stop diameter, m", NULL},
    {"defocus", BEAM_P_FLOAT, "0", 0, -1, 1, NULL, NULL, "distance of the sample from the focus, m", NULL},
    BEAM_PARAM_END};

static const beam_param_t object_params[] = {
    {"init", BEAM_P_ENUM, "flat", 0, 0, 0, "flat|file", NULL, "initial object: flat (1) or file", NULL},
    {"file", BEAM_P_INFILE, NULL, 0, 0, 0, NULL, NULL,
     "init file: complex .npy or .h5 object of the series' object shape", NULL},
    {"dataset", BEAM_P_STRING, "/object", 0, 0, 0, NULL, NULL, "HDF5 dataset of the object file", NULL},
    BEAM_PARAM_END};

static const beam_param_t mask_params[] = {
    {"file", BEAM_P_INFILE, NULL, 1, 0, 0, NULL, NULL, ".h5 or .npy file, the frames' shape: nonzero = masked", NULL},
    {"dataset", BEAM_P_STRING, "/mask", 0, 0, 0, NULL, NULL, "HDF5 dataset of the mask", NULL},
    BEAM_PARAM_END};

const beam_param_t beam_ptycho_dm_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"n", BEAM_P_INT, "128", 0, 8, 4096, NULL, NULL, "view side in detector pixels (the frames are cropped to n x n)", NULL},
    {"center", BEAM_P_FLOAT_LIST, NULL, 0, -1e6, 1e6, NULL, NULL,
     "[y, x] beam centre in detector pixels; default the metadata's beam_center, else automatic", two_valid},
    {"auto_frames", BEAM_P_INT, "8", 0, 1, 1024, NULL, NULL,
     "automatic centre: centre of mass of the sum of this many first frames", NULL},
    {"max_frames", BEAM_P_INT, "4096", 0, 1, 10000000, NULL, NULL, "views preallocated per series; later frames are rejected", NULL},
    {"min_frames", BEAM_P_INT, "16", 0, 1, 10000000, NULL, NULL, "views needed before iterating", NULL},
    {"iterations", BEAM_P_INT, "200", 0, 1, 1000000, NULL, NULL, "DM iterations per series in total", NULL},
    {"final_iterations", BEAM_P_INT, "50", 0, 0, 1000000, NULL, NULL,
     "of those, kept for after the series end (every view in)", NULL},
    {"probe_modes", BEAM_P_INT, "1", 0, 1, BEAM_DM_MAX_PROBE_MODES, NULL, NULL, "incoherent probe modes", NULL},
    {"object_modes", BEAM_P_INT, "1", 0, 1, BEAM_DM_MAX_OBJECT_MODES, NULL, NULL, "object modes", NULL},
    {"algorithm", BEAM_P_ENUM, "raar", 0, 0, 0, "dm|raar", NULL,
     "exit-wave update: raar, or dm (drifts on noisy data, pipeline/ptycho/dm.h)", NULL},
    {"beta", BEAM_P_FLOAT, "0.8", 0, 0, 1, NULL, NULL, "relaxation in (0, 1]; dm with 1 is Thibault's DM", beta_valid},
    {"obj_reg", BEAM_P_FLOAT, "1e-3", 0, 0, 1, NULL, NULL, "object regulariser, relative", NULL},
    {"probe_reg", BEAM_P_FLOAT, "1e-3", 0, 0, 1, NULL, NULL, "probe regulariser, relative", NULL},
    {"probe_update_start", BEAM_P_INT, "2", 0, 0, 1000000, NULL, NULL, "first iteration updating the probe", NULL},
    {"inner_passes", BEAM_P_INT, "1", 0, 1, 100, NULL, NULL, "object/probe passes per iteration", NULL},
    {"fourier_relax", BEAM_P_FLOAT, "0.05", 0, 0, 1, NULL, NULL, "PtyPy fourier_relax_factor; 0 = off", NULL},
    {"probe_support", BEAM_P_FLOAT, "0", 0, 0, 1, NULL, NULL, "probe support, fraction of n^2; 0 = off", NULL},
    {"precision", BEAM_P_ENUM, "single", 0, 0, 0, "single|double", NULL, "engine arithmetic", NULL},
    {"probe", BEAM_P_MAP, NULL, 0, 0, 0, NULL, probe_params, "initial probe", NULL},
    {"object", BEAM_P_MAP, NULL, 0, 0, 0, NULL, object_params, "initial object", NULL},
    {"positions", BEAM_P_ENUM, "frame", 0, 0, 0, "frame|metadata", NULL,
     "scan positions from each frame's pos, or from the series metadata scan.positions", NULL},
    {"units", BEAM_P_ENUM, "m", 0, 0, 0, "m|pixels", NULL, "units of the positions: metres or object pixels", NULL},
    {"energy", BEAM_P_FLOAT, "0", 0, 0, 1e9, NULL, NULL, "photon energy, eV; 0 = from the series", NULL},
    {"distance", BEAM_P_FLOAT, "0", 0, 0, 1e6, NULL, NULL, "sample-detector distance, m; 0 = from the series", NULL},
    {"pixel_size", BEAM_P_FLOAT, "0", 0, 0, 1, NULL, NULL, "detector pixel, m; 0 = from the series", NULL},
    {"scan_extent", BEAM_P_FLOAT_LIST, NULL, 0, -1e9, 1e9, NULL, NULL,
     "[y0, x0, y1, x1]: box of the scan positions when the metadata has none", four_valid},
    {"margin", BEAM_P_INT, "8", 0, 0, 4096, NULL, NULL, "object pixels around the scanned area", NULL},
    {"publish_every", BEAM_P_INT, "10", 0, 0, 1000000, NULL, NULL, "partial results every N iterations; 0 = off", NULL},
    {"publish_interval", BEAM_P_DURATION, "2s", 0, 0, 3600, NULL, NULL, "partial results at least this often; 0 = off", NULL},
    {"diverge_factor", BEAM_P_FLOAT, "1000", 0, 1, 1e12, NULL, NULL,
     "stop when the Fourier error exceeds its minimum by this factor", NULL},
    {"max_memory", BEAM_P_SIZE, "0", 0, 0, 1099511627776.0, NULL, NULL,
     "engine memory allowed (beam_dm_bytes); 0 = 3/4 of RAM (cpu) or the device's (cuda)", NULL},
    {"threads", BEAM_P_INT, "0", 0, 0, 1024, NULL, NULL, "CPU engine threads; 0 = all cores", NULL},
    {"mask", BEAM_P_MAP, NULL, 0, 0, 0, NULL, mask_params, "detector pixels left out", NULL},
    BEAM_PARAM_END};

/* ---- init ----------------------------------------------------------------- */

void beam_ptycho_dm_conf_free(beam_ptycho_dm_conf_t *c) {
  beam_array_free(&c->probe_file);
  beam_array_free(&c->object_file);
  beam_array_free(&c->mask);
}

static int is_complex(beam_dtype_t dt) { return dt == BEAM_DT_C64 || dt == BEAM_DT_C128; }


static int load_complex(const char *what, const beam_cnode_t *m, const char *defds, beam_array_t *a,
                        beam_diag_t *d) {
  const char *file = beam_cfg_str(m, "file"), *ds = beam_cfg_str(m, "dataset");
  if (!file)
    return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: %s.init is file but %s.file is not set", what, what);
  beam_diag_t sub = {0};
  int rc = beam_array_load(file, ds ? ds : defds, a, &sub);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "ptycho_dm: %s: %s", what, sub.msg);
  if (!is_complex(a->dtype) || a->ndim < 2 || a->ndim > 3) {
    char sh[64];
    beam_shape_str(a->ndim, a->shape, sh, sizeof sh);
    int r = BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: %s file %s: expected a complex [h, w] or [modes, h, w] "
                      "array, got %s %s", what, file, beam_dtype_name(a->dtype), sh);
    beam_array_free(a);
    return r;
  }
  return 0;
}

int beam_ptycho_dm_conf_load(beam_ptycho_dm_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  c->n = (uint32_t)beam_cfg_int(cfg, "n", 128);
  if (c->n < 8 || c->n > 4096 || c->n % 2)
    return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: n %u must be even and in 8..4096 (the FFT order puts "
                     "the beam centre at n/2)", c->n);
  const beam_cnode_t *ctr = beam_cfg_get(cfg, "center");
  if (ctr) {
    if (beam_cfg_len(ctr) != 2)
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: center must be [y, x]");
    c->have_center = 1;
    c->cy = beam__cfg_item_num(beam_cfg_at(ctr, 0));
    c->cx = beam__cfg_item_num(beam_cfg_at(ctr, 1));
  }
  c->auto_frames = (uint32_t)beam_cfg_int(cfg, "auto_frames", 8);
  c->max_frames = (uint32_t)beam_cfg_int(cfg, "max_frames", 4096);
  c->min_frames = (uint32_t)beam_cfg_int(cfg, "min_frames", 16);
  c->iterations = (uint32_t)beam_cfg_int(cfg, "iterations", 200);
  c->final_iterations = (uint32_t)beam_cfg_int(cfg, "final_iterations", 50);
  if (c->min_frames > c->max_frames)
    return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: min_frames (%u) exceeds max_frames (%u)", c->min_frames,
                     c->max_frames);
  if (c->final_iterations > c->iterations)
    return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: final_iterations (%u) exceeds iterations (%u)",
                     c->final_iterations, c->iterations);
  beam_dm_conf_t *m = &c->dm;
  beam_dm_conf_default(m);
  const char *prec = beam_cfg_str(cfg, "precision");
  m->prec = prec && !strcmp(prec, "double") ? BEAM_DM_F64 : BEAM_DM_F32;
  m->probe_modes = (uint32_t)beam_cfg_int(cfg, "probe_modes", 1);
  m->object_modes = (uint32_t)beam_cfg_int(cfg, "object_modes", 1);
  const char *alg = beam_cfg_str(cfg, "algorithm");
  m->algorithm = alg && !strcmp(alg, "dm") ? BEAM_DM_ALG_DM : BEAM_DM_ALG_RAAR;
  m->beta = beam_cfg_float(cfg, "beta", 0.8);
  m->obj_reg = beam_cfg_float(cfg, "obj_reg", 1e-3);
  m->probe_reg = beam_cfg_float(cfg, "probe_reg", 1e-3);
  m->probe_update_start = (uint32_t)beam_cfg_int(cfg, "probe_update_start", 2);
  m->inner_passes = (uint32_t)beam_cfg_int(cfg, "inner_passes", 1);
  m->fourier_relax = beam_cfg_float(cfg, "fourier_relax", 0.05);
  m->probe_support = beam_cfg_float(cfg, "probe_support", 0);
  m->threads = (int)beam_cfg_int(cfg, "threads", 0);
  if (!(m->beta > 0 && m->beta <= 1))
    return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: beta %g outside (0, 1]", m->beta);
  if (m->probe_modes < 1 || m->probe_modes > BEAM_DM_MAX_PROBE_MODES || m->object_modes < 1 ||
      m->object_modes > BEAM_DM_MAX_OBJECT_MODES)
    return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: probe_modes must be in 1..%d and object_modes in 1..%d",
                     BEAM_DM_MAX_PROBE_MODES, BEAM_DM_MAX_OBJECT_MODES);
  const char *pos = beam_cfg_str(cfg, "positions"), *units = beam_cfg_str(cfg, "units");
  c->positions_meta = pos && !strcmp(pos, "metadata");
  c->units_pixels = units && !strcmp(units, "pixels");
  c->energy_ev = beam_cfg_float(cfg, "energy", 0);
  c->distance_m = beam_cfg_float(cfg, "distance", 0);
  c->pixel_size_m = beam_cfg_float(cfg, "pixel_size", 0);
  const beam_cnode_t *ext = beam_cfg_get(cfg, "scan_extent");
  if (ext) {
    if (beam_cfg_len(ext) != 4)
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: scan_extent must be [y0, x0, y1, x1]");
    c->have_extent = 1;
    for (int i = 0; i < 4; i++)
      c->extent[i] = beam__cfg_item_num(beam_cfg_at(ext, (size_t)i));
  }
  c->margin = (uint32_t)beam_cfg_int(cfg, "margin", 8);
  c->publish_every = (uint32_t)beam_cfg_int(cfg, "publish_every", 10);
  c->publish_interval = beam_cfg_float(cfg, "publish_interval", 2);
  c->diverge_factor = beam_cfg_float(cfg, "diverge_factor", 1000);
  c->max_memory = (uint64_t)beam_cfg_int(cfg, "max_memory", 0);

  const beam_cnode_t *pr = beam_cfg_get(cfg, "probe");
  const char *pinit = pr ? beam_cfg_str(pr, "init") : NULL;
  int rc;
  if (pinit && !strcmp(pinit, "file")) {
    c->probe_init = BEAM_PTYCHO_PROBE_FILE;
    if ((rc = load_complex("probe", pr, "/probe", &c->probe_file, d)) < 0)
      return rc;
    const beam_array_t *a = &c->probe_file;
    uint32_t h = a->shape[a->ndim - 2], w = a->shape[a->ndim - 1];
    uint32_t modes = a->ndim == 3 ? a->shape[0] : 1;
    if (h != c->n || w != c->n || modes < 1 || modes > m->probe_modes)
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: the probe file holds %u mode(s) of %ux%u; expected 1..%u "
                       "(probe_modes) of %ux%u (n)", modes, h, w, m->probe_modes, c->n, c->n);
  } else if (pinit && !strcmp(pinit, "zone_plate")) {
    c->probe_init = BEAM_PTYCHO_PROBE_ZONE_PLATE;
    c->zp_diam = beam_cfg_float(pr, "zp_diameter", 0);
    c->zp_drn = beam_cfg_float(pr, "zp_outer_zone", 0);
    c->zp_cs = beam_cfg_float(pr, "central_stop", 0);
    c->zp_defocus = beam_cfg_float(pr, "defocus", 0);
    if (!(c->zp_diam > 0) || !(c->zp_drn > 0))
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: probe.init zone_plate needs probe.zp_diameter and "
                       "probe.zp_outer_zone (m)");
    if (!(c->zp_cs < c->zp_diam))
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: probe.central_stop (%g m) must be smaller than "
                       "probe.zp_diameter (%g m)", c->zp_cs, c->zp_diam);
    if (c->units_pixels)
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: probe.init zone_plate needs positions in metres (units: m): "
                       "the zone plate is drawn on the object's metric pixel grid");
  }
  const beam_cnode_t *ob = beam_cfg_get(cfg, "object");
  const char *oinit = ob ? beam_cfg_str(ob, "init") : NULL;
  if (oinit && !strcmp(oinit, "file")) {
    if ((rc = load_complex("object", ob, "/object", &c->object_file, d)) < 0)
      return rc;
    const beam_array_t *a = &c->object_file;
    uint32_t modes = a->ndim == 3 ? a->shape[0] : 1;
    if (modes != m->object_modes)
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: the object file holds %u mode(s); object_modes is %u",
                       modes, m->object_modes);
  }
  const beam_cnode_t *mask = beam_cfg_get(cfg, "mask");
  if (mask) {
    const char *file = beam_cfg_str(mask, "file"), *ds = beam_cfg_str(mask, "dataset");
    beam_diag_t sub = {0};
    if (!file)
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: mask needs file");
    if ((rc = beam_array_load(file, ds ? ds : "/mask", &c->mask, &sub)) < 0)
      return BEAM_DIAG(d, rc, "ptycho_dm: mask: %s", sub.msg);
    if (c->mask.ndim != 2 || !beam__dtype_real(c->mask.dtype))
      return BEAM_DIAG(d, BEAM_ECONFIG, "ptycho_dm: %s: the mask must be a 2-D real array", file);
  }
  return 0;
}

/* ---- series metadata -------------------------------------------------------- */

int beam_ptycho_dm_parse_meta(const char *text, double **pos, size_t *count, int *have_bc,
                              double bc[2], beam_diag_t *d) {
  *pos = NULL, *count = 0, *have_bc = 0;
  if (!text)
    return 0;
  json_error_t err;
  json_t *root = json_loads(text, 0, &err);
  if (!root || !json_is_object(root)) {
    json_decref(root);
    return 0; /* not ours to judge: ingest accepted it */
  }
  int rc = 0;
  json_t *b = json_object_get(root, "beam_center");
  if (json_is_array(b) && json_array_size(b) == 2 && json_is_number(json_array_get(b, 0)) &&
      json_is_number(json_array_get(b, 1))) {
    bc[0] = json_number_value(json_array_get(b, 0));
    bc[1] = json_number_value(json_array_get(b, 1));
    *have_bc = 1;
  }
  json_t *scan = json_object_get(root, "scan");
  json_t *p = json_is_object(scan) ? json_object_get(scan, "positions") : NULL;
  if (p) {
    size_t n = json_is_array(p) ? json_array_size(p) : 0;
    if (!json_is_array(p)) {
      rc = BEAM_DIAG(d, BEAM_EPROTO, "metadata scan.positions is not a list of [x, y]");
      goto out;
    }
    double *v = malloc((n ? n : 1) * 2 * sizeof *v);
    if (!v) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "out of memory for %zu scan positions", n);
      goto out;
    }
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_array_get(p, i);
      if (!json_is_array(e) || json_array_size(e) < 2 || !json_is_number(json_array_get(e, 0)) ||
          !json_is_number(json_array_get(e, 1))) {
        free(v);
        rc = BEAM_DIAG(d, BEAM_EPROTO, "metadata scan.positions[%zu] is not [x, y] numbers", i);
        goto out;
      }
      /* The wire order is (x, y); the engine's (y, x). */
      v[2 * i] = json_number_value(json_array_get(e, 1));
      v[2 * i + 1] = json_number_value(json_array_get(e, 0));
    }
    *pos = v, *count = n;
  }
out:
  json_decref(root);
  return rc;
}

