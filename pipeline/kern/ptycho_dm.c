/* Stage kind `ptycho_dm`: schema, parameter loading and the host logic both
 * backends share (series geometry, frame preparation, staging of views,
 * initial probe, iteration in idle and end, publication). The engine
 * (pipeline/ptycho/dm.h) does the numerical work on the backend chosen by
 * ptycho_dm_cpu.c or gpu/ptycho_dm_cuda.cu. */
#include "pipeline/kern/ptycho_dm.h"

#include <math.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

/* Views held before they go to the engine: the probe (init: mean) is made
 * from the first min(min_frames, STAGE_MAX) views, before any view enters
 * the engine, because a view's exit wave starts as P W O with the probe of
 * the moment it is added. After that the buffer only batches the adds. */
#define STAGE_MIN 64u
#define STAGE_MAX 1024u
/* Largest object side accepted from a scan's extent (pixels). */
#define OBJ_SIDE_MAX 65536u

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

static void conf_free(beam_ptycho_dm_conf_t *c) {
  beam_array_free(&c->probe_file);
  beam_array_free(&c->object_file);
  beam_array_free(&c->mask);
}

static int is_complex(beam_dtype_t dt) { return dt == BEAM_DT_C64 || dt == BEAM_DT_C128; }

/* Element i of a complex array as (re, im). */
static void cget(const beam_array_t *a, size_t i, double *re, double *im) {
  if (a->dtype == BEAM_DT_C64) {
    *re = ((const float *)a->data)[2 * i], *im = ((const float *)a->data)[2 * i + 1];
  } else {
    *re = ((const double *)a->data)[2 * i], *im = ((const double *)a->data)[2 * i + 1];
  }
}

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

static int conf_load(beam_ptycho_dm_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
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

int beam_ptycho_dm_init(beam_stage_t *self, beam_dm_backend_t be, beam_diag_t *d) {
  beam_ptycho_dm_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho_dm: out of memory");
  self->priv = s;
  s->backend = be;
  int rc = conf_load(&s->conf, self->cfg, d);
  if (rc < 0) {
    beam_ptycho_dm_destroy(self);
    return rc;
  }
  self->idle = beam_ptycho_dm_idle;
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

/* ---- start ------------------------------------------------------------------- */

static void series_free(beam_ptycho_dm_t *s) {
  free(s->meta_pos);
  free(s->mask8);
  free(s->cbuf);
  free(s->cpos);
  free(s->csum);
  free(s->amp);
  free(s->pos);
  free(s->amp_sum);
  free(s->amp_cnt);
  free(s->amp_mean);
  free(s->obj_h);
  free(s->probe_h);
  free(s->hist);
  s->meta_pos = NULL, s->mask8 = NULL, s->cbuf = NULL, s->cpos = NULL, s->csum = NULL;
  s->amp = NULL, s->pos = NULL, s->amp_sum = NULL, s->amp_cnt = NULL, s->amp_mean = NULL;
  s->obj_h = NULL, s->probe_h = NULL, s->hist = NULL;
  s->nmeta = 0, s->ncbuf = 0, s->cbuf_cap = 0, s->nstage = 0, s->stage_cap = 0;
  s->photons = 0, s->nphot = 0, s->probe_set = 0, s->nhist = 0, s->it_pub = 0;
  s->failed = 0, s->series_open = 0, s->accepted = 0, s->rejected = 0, s->have_center = 0;
}

static int frame_dtype_ok(beam_dtype_t dt) {
  return dt == BEAM_DT_U8 || dt == BEAM_DT_U16 || dt == BEAM_DT_U32 || dt == BEAM_DT_I32 ||
         dt == BEAM_DT_F32 || dt == BEAM_DT_F64;
}

static uint64_t auto_memory(beam_dm_backend_t be) {
  if (be == BEAM_DM_CUDA)
    return 0; /* the engine checks the device's free memory at create */
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || psz <= 0)
    return 0;
  return (uint64_t)pages * (uint64_t)psz / 4 * 3;
}

/* Geometry: from every position in the metadata when it lists them (the
 * object then holds exactly the scan), else from scan_extent. A frame's
 * own position is placed on that fixed grid (place_one) and rejected when
 * its window falls outside. */
static int geometry(beam_stage_t *self, beam_ptycho_dm_t *s, beam_diag_t *d) {
  const beam_ptycho_dm_conf_t *c = &s->conf;
  beam_diag_t sub = {0};
  int rc;
  if (s->meta_pos) {
    int32_t *rcs = malloc(s->nmeta * 2 * sizeof *rcs);
    if (!rcs)
      return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho_dm \"%s\": out of memory", self->name);
    rc = beam_ptycho_place(s->meta_pos, s->nmeta, s->pixel_m, c->n, c->margin, OBJ_SIDE_MAX, rcs, NULL,
                           &s->geom, &sub);
    free(rcs);
    if (rc < 0)
      return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": metadata scan.positions: %s", self->name, sub.msg);
    return 0;
  }
  if (c->positions_meta)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho_dm \"%s\": positions: metadata, but the series metadata has no "
                     "scan.positions", self->name);
  if (!c->have_extent)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho_dm \"%s\": the object size is unknown: the series metadata has no "
                     "scan.positions and scan_extent is not set", self->name);
  double corners[4] = {c->extent[0], c->extent[1], c->extent[2], c->extent[3]};
  int32_t rcs[4];
  rc = beam_ptycho_place(corners, 2, s->pixel_m, c->n, c->margin, OBJ_SIDE_MAX, rcs, NULL, &s->geom, &sub);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": scan_extent: %s", self->name, sub.msg);
  return 0;
}

static int engine_fits(const beam_dm_t *e, const beam_dm_conf_t *c) {
  const beam_dm_conf_t *o = beam_dm_conf(e);
  return o->n == c->n && o->max_views == c->max_views && o->obj_h == c->obj_h && o->obj_w == c->obj_w &&
         o->probe_modes == c->probe_modes && o->object_modes == c->object_modes && o->prec == c->prec;
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

int beam_ptycho_dm_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                         beam_diag_t *d) {
  beam_ptycho_dm_t *s = self->priv;
  const beam_ptycho_dm_conf_t *c = &s->conf;
  uint32_t n = c->n;
  char sh[64];
  series_free(s);
  if (in->ndim != 2 || !frame_dtype_ok(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, "ptycho_dm \"%s\": frames must be 2-D uint8, uint16, uint32, int32, "
                     "float32 or float64; got %s %s", self->name, beam_dtype_name(in->dtype),
                     beam_shape_str(in->ndim, in->shape, sh, sizeof sh));
  s->fh = in->shape[0], s->fw = in->shape[1], s->fdt = in->dtype;
  if (s->fh < n || s->fw < n)
    return BEAM_DIAG(d, BEAM_ESHAPE, "ptycho_dm \"%s\": the %ux%u frames are smaller than the view side "
                     "n = %u", self->name, s->fh, s->fw, n);
  const beam_array_t *mk = &c->mask;
  if (mk->data && (mk->shape[0] != s->fh || mk->shape[1] != s->fw))
    return BEAM_DIAG(d, BEAM_ESHAPE, "ptycho_dm \"%s\": the mask is %ux%u but the frames are %ux%u",
                     self->name, mk->shape[0], mk->shape[1], s->fh, s->fw);
  int have_bc = 0;
  double bc[2] = {0, 0};
  beam_diag_t sub = {0};
  int rc = beam_ptycho_dm_parse_meta(series->meta_json, &s->meta_pos, &s->nmeta, &have_bc, bc, &sub);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": %s", self->name, sub.msg);

  /* Geometry: object pixel = lambda z / (n p), unless positions are pixels. */
  double E = c->energy_ev > 0 ? c->energy_ev : series->energy_ev;
  double z = c->distance_m > 0 ? c->distance_m : series->distance_m;
  double p = c->pixel_size_m > 0 ? c->pixel_size_m : series->pixel_size_m;
  s->pixel_m = 0;
  if (!c->units_pixels) { /* (a zone-plate probe needs metres: checked at init) */
    const char *miss = !(E > 0) ? "energy" : !(z > 0) ? "distance" : !(p > 0) ? "pixel_size" : NULL;
    if (miss)
      return BEAM_DIAG(d, BEAM_EINVAL, "ptycho_dm \"%s\": no %s: positions in metres need energy, distance "
                       "and pixel_size (series metadata or the stage's overrides)", self->name, miss);
    s->pixel_m = beam_ptycho_obj_pixel(E, z, p, n);
  }
  s->energy_ev = E;
  if ((rc = geometry(self, s, d)) < 0)
    return rc;

  /* Engine: one per stage, reused while the geometry holds. */
  beam_dm_conf_t ec = c->dm;
  ec.n = n;
  ec.max_views = c->max_frames;
  ec.obj_h = s->geom.obj_h, ec.obj_w = s->geom.obj_w;
  uint64_t need = beam_dm_bytes(&ec);
  uint64_t limit = c->max_memory ? c->max_memory : auto_memory(s->backend);
  if (limit && need > limit)
    return BEAM_DIAG(d, BEAM_ELIMIT, "ptycho_dm \"%s\": %u views of %ux%u with a %ux%u object need %.3f GiB, "
                     "more than the %.3f GiB allowed (max_memory); lower max_frames or n",
                     self->name, c->max_frames, n, n, ec.obj_h, ec.obj_w, gib(need), gib(limit));
  if (s->eng && engine_fits(s->eng, &ec)) {
    beam_dm_reset(s->eng);
  } else {
    beam_dm_destroy(&s->eng);
    sub = (beam_diag_t){0};
    if ((rc = beam_dm_create(&s->eng, &ec, s->backend, &sub)) < 0) {
      beam_dm_destroy(&s->eng);
      return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": %s", self->name, sub.msg);
    }
  }

  /* Per-series buffers. */
  size_t nn = (size_t)n * n, mo = c->dm.object_modes, mp = c->dm.probe_modes;
  size_t objn = mo * s->geom.obj_h * s->geom.obj_w;
  s->stage_cap = c->min_frames > STAGE_MIN ? c->min_frames : STAGE_MIN;
  if (s->stage_cap > STAGE_MAX)
    s->stage_cap = STAGE_MAX;
  if (s->stage_cap > c->max_frames)
    s->stage_cap = c->max_frames;
  if (!(s->amp = malloc(s->stage_cap * nn * sizeof *s->amp)) ||
      !(s->pos = malloc(s->stage_cap * 2 * sizeof *s->pos)) ||
      !(s->amp_sum = calloc(nn, sizeof *s->amp_sum)) || !(s->amp_cnt = calloc(nn, sizeof *s->amp_cnt)) ||
      !(s->amp_mean = malloc(nn * sizeof *s->amp_mean)) ||
      !(s->obj_h = malloc(objn * 2 * sizeof *s->obj_h)) ||
      !(s->probe_h = calloc(mp * nn * 2, sizeof *s->probe_h)) ||
      !(s->hist = calloc(c->iterations, sizeof *s->hist)))
    goto nomem;
  if (mk->data) {
    if (!(s->mask8 = malloc((size_t)s->fh * s->fw)))
      goto nomem;
    for (size_t i = 0; i < (size_t)s->fh * s->fw; i++)
      s->mask8[i] = beam_array_get(mk, i) != 0.0;
  }
  if (c->have_center) {
    s->have_center = 1, s->cy = c->cy, s->cx = c->cx;
  } else if (have_bc) {
    s->have_center = 1, s->cy = bc[0], s->cx = bc[1];
  } else {
    uint32_t cap = c->auto_frames;
    if (cap > c->min_frames)
      cap = c->min_frames; /* iteration must not wait for the centre */
    s->cbuf_cap = cap;
    size_t fp = (size_t)s->fh * s->fw;
    if (!(s->cbuf = malloc(cap * fp * sizeof *s->cbuf)) || !(s->cpos = malloc(cap * 2 * sizeof *s->cpos)) ||
        !(s->csum = calloc(fp, sizeof *s->csum)))
      goto nomem;
  }

  /* Initial object: flat or the file's (which must fit this scan). */
  const beam_array_t *of = &c->object_file;
  if (of->data) {
    uint32_t oh = of->shape[of->ndim - 2], ow = of->shape[of->ndim - 1];
    if (oh != s->geom.obj_h || ow != s->geom.obj_w)
      return BEAM_DIAG(d, BEAM_ESHAPE, "ptycho_dm \"%s\": the object file is %ux%u but this scan's object is "
                       "%ux%u (positions, n, margin)", self->name, oh, ow, s->geom.obj_h, s->geom.obj_w);
    for (size_t i = 0; i < objn; i++)
      cget(of, i, &s->obj_h[2 * i], &s->obj_h[2 * i + 1]);
  } else {
    for (size_t i = 0; i < objn; i++)
      s->obj_h[2 * i] = 1, s->obj_h[2 * i + 1] = 0;
  }
  sub = (beam_diag_t){0};
  if ((rc = beam_dm_set_object(s->eng, s->obj_h, &sub)) < 0)
    return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": %s", self->name, sub.msg);

  /* Outputs. */
  beam_outdesc_t *o = self->outs;
  uint32_t oshape[3] = {(uint32_t)mo, s->geom.obj_h, s->geom.obj_w};
  if (mo == 1)
    beam__declare(&o[BEAM_PTYCHO_OUT_OBJECT], "object", BEAM_DT_C64, 2, oshape + 1, "", 0);
  else
    beam__declare(&o[BEAM_PTYCHO_OUT_OBJECT], "object", BEAM_DT_C64, 3, oshape, "", 0);
  o[BEAM_PTYCHO_OUT_OBJECT].slots = 2;
  if (mo > 1)
    o[BEAM_PTYCHO_OUT_OBJECT].axes[0] = "mode";
  const char *u = s->pixel_m > 0 ? "m" : "px";
  double step = s->pixel_m > 0 ? s->pixel_m : 1.0;
  snprintf(s->labels, sizeof s->labels,
           "{\"y\": {\"origin\": %.17g, \"step\": %.17g, \"units\": \"%s\"}, "
           "\"x\": {\"origin\": %.17g, \"step\": %.17g, \"units\": \"%s\"}}",
           s->geom.origin_y, step, u, s->geom.origin_x, step, u);
  o[BEAM_PTYCHO_OUT_OBJECT].labels_json = s->labels;
  uint32_t pshape[3] = {(uint32_t)mp, n, n};
  beam__declare(&o[BEAM_PTYCHO_OUT_PROBE], "probe", BEAM_DT_C64, 3, pshape, "sqrt(counts)", 0);
  o[BEAM_PTYCHO_OUT_PROBE].axes[0] = "mode";
  o[BEAM_PTYCHO_OUT_PROBE].slots = 2;
  uint32_t eshape[2] = {c->iterations, BEAM_PTYCHO_ERR_COLS};
  beam__declare(&o[BEAM_PTYCHO_OUT_ERROR], "error", BEAM_DT_F64, 2, eshape, "", 0);
  o[BEAM_PTYCHO_OUT_ERROR].axes[0] = "iteration";
  o[BEAM_PTYCHO_OUT_ERROR].axes[1] = "metric";
  o[BEAM_PTYCHO_OUT_ERROR].labels_json =
      "{\"metric\": [\"iteration\", \"fourier_error\", \"probe_change\", \"object_change\"]}";
  o[BEAM_PTYCHO_OUT_ERROR].slots = 2;
  self->nouts = BEAM_PTYCHO_NOUTS;
  s->t_pub_ns = beam_now_ns();
  s->series_open = 1;
  return 0;
nomem:
  series_free(s);
  return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho_dm \"%s\": cannot allocate the series buffers", self->name);
}

/* ---- frames -------------------------------------------------------------------- */

/* Prepares one frame into the next staging slot. The mean amplitude and
 * photon count feed the initial probe until it is made. */
static int stage_view(beam_stage_t *self, beam_ptycho_dm_t *s, const void *data, beam_dtype_t dt,
                      int32_t row, int32_t col, uint64_t fid) {
  uint32_t n = s->conf.n;
  size_t nn = (size_t)n * n;
  float *a = s->amp + s->nstage * nn;
  double ph = beam_ptycho_prep_frame(data, dt, s->fh, s->fw, s->cy, s->cx, n, s->mask8, a);
  if (ph < 0)
    return BEAM_DIAG(&self->diag, (int)ph, "ptycho_dm \"%s\": frame %llu: cannot prepare a %s frame", self->name,
                     (unsigned long long)fid, beam_dtype_name(dt));
  s->pos[2 * s->nstage] = row, s->pos[2 * s->nstage + 1] = col;
  s->nstage++;
  if (!s->probe_set) {
    s->photons += ph, s->nphot++;
    for (size_t i = 0; i < nn; i++)
      if (a[i] >= 0)
        s->amp_sum[i] += a[i], s->amp_cnt[i]++;
  }
  return 0;
}

static int make_probe(beam_stage_t *self, beam_ptycho_dm_t *s, beam_diag_t *d) {
  const beam_ptycho_dm_conf_t *c = &s->conf;
  uint32_t n = c->n, mp = c->dm.probe_modes;
  size_t nn = (size_t)n * n;
  double power = s->nphot ? s->photons / (double)s->nphot : 1.0;
  beam_diag_t sub = {0};
  int rc = 0;
  switch (c->probe_init) {
  case BEAM_PTYCHO_PROBE_MEAN:
    for (size_t i = 0; i < nn; i++)
      s->amp_mean[i] = s->amp_cnt[i] ? (float)(s->amp_sum[i] / s->amp_cnt[i]) : -1.0f;
    rc = beam_ptycho_probe_from_mean(s->amp_mean, n, mp, power, s->probe_h, &sub);
    break;
  case BEAM_PTYCHO_PROBE_FILE: {
    /* The file's modes as given; missing ones made from its mode 0 as for
     * the other inits (extra_modes rewrites modes 1.., so the file's are
     * copied again after it). */
    const beam_array_t *a = &c->probe_file;
    uint32_t fm = a->ndim == 3 ? a->shape[0] : 1;
    for (size_t i = 0; i < fm * nn; i++)
      cget(a, i, &s->probe_h[2 * i], &s->probe_h[2 * i + 1]);
    if (fm < mp) {
      beam_ptycho_probe_extra_modes(n, mp, s->probe_h);
      for (size_t i = 0; i < fm * nn; i++)
        cget(a, i, &s->probe_h[2 * i], &s->probe_h[2 * i + 1]);
    }
    break;
  }
  case BEAM_PTYCHO_PROBE_ZONE_PLATE:
    rc = beam_ptycho_probe_zone_plate(n, s->pixel_m, s->energy_ev, c->zp_diam, c->zp_drn, c->zp_cs,
                                      c->zp_defocus, mp, power, s->probe_h, &sub);
    break;
  }
  if (rc >= 0)
    rc = beam_dm_set_probe(s->eng, s->probe_h, &sub);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": initial probe: %s", self->name, sub.msg);
  s->probe_set = 1;
  return 0;
}

/* Staged views into the engine. Before the probe exists they wait (up to
 * min_frames, or the buffer's size) unless force is set. */
static int flush(beam_stage_t *self, beam_ptycho_dm_t *s, int force, beam_diag_t *d) {
  if (!s->nstage)
    return 0;
  if (!s->probe_set) {
    if (!force && s->nstage < s->conf.min_frames && s->nstage < s->stage_cap)
      return 0;
    int rc = make_probe(self, s, d);
    if (rc < 0) {
      s->failed = 1;
      return rc;
    }
  }
  beam_diag_t sub = {0};
  int rc = beam_dm_add_views(s->eng, s->nstage, s->amp, s->pos, &sub);
  s->nstage = 0;
  if (rc < 0) {
    s->failed = 1;
    return BEAM_DIAG(d, rc, "ptycho_dm \"%s\": adding views: %s", self->name, sub.msg);
  }
  return 0;
}

/* Automatic centre: the centre of mass of the held frames' sum (finite,
 * positive, unmasked pixels), then the held frames are prepared with it. */
static int finish_center(beam_stage_t *self, beam_ptycho_dm_t *s) {
  double m = 0, my = 0, mx = 0;
  for (uint32_t y = 0; y < s->fh; y++)
    for (uint32_t x = 0; x < s->fw; x++) {
      size_t i = (size_t)y * s->fw + x;
      double v = s->csum[i];
      if (!(v > 0) || !isfinite(v) || (s->mask8 && s->mask8[i]))
        continue;
      m += v, my += v * y, mx += v * x;
    }
  /* No photons at all: the frame centre is as good a guess as any. */
  s->cy = m > 0 ? my / m : s->fh / 2.0;
  s->cx = m > 0 ? mx / m : s->fw / 2.0;
  s->have_center = 1;
  size_t fp = (size_t)s->fh * s->fw;
  for (uint32_t k = 0; k < s->ncbuf; k++) {
    if (s->nstage == s->stage_cap) {
      int rc = flush(self, s, 0, &self->diag);
      if (rc < 0)
        return rc;
    }
    int rc = stage_view(self, s, s->cbuf + k * fp, BEAM_DT_F32, s->cpos[2 * k], s->cpos[2 * k + 1], k);
    if (rc < 0)
      return rc;
  }
  s->ncbuf = 0;
  return 0;
}

/* Held raw frame for the automatic centre, as float (exact for counts
 * below 2^24). */
#define HOLD(T, DT)                                                   \
  case DT: {                                                          \
    const T *src = data;                                              \
    for (size_t i = 0; i < fp; i++) {                                 \
      dst[i] = (float)src[i];                                         \
      if (isfinite(dst[i]) && dst[i] > 0)                             \
        s->csum[i] += dst[i];                                         \
    }                                                                 \
    break;                                                            \
  }

static void hold_frame(beam_ptycho_dm_t *s, const void *data, beam_dtype_t dt, int32_t row, int32_t col) {
  size_t fp = (size_t)s->fh * s->fw;
  float *dst = s->cbuf + s->ncbuf * fp;
  switch (dt) {
    HOLD(uint8_t, BEAM_DT_U8)
    HOLD(uint16_t, BEAM_DT_U16)
    HOLD(uint32_t, BEAM_DT_U32)
    HOLD(int32_t, BEAM_DT_I32)
    HOLD(float, BEAM_DT_F32)
    HOLD(double, BEAM_DT_F64)
  default:
    break;
  }
  s->cpos[2 * s->ncbuf] = row, s->cpos[2 * s->ncbuf + 1] = col;
  s->ncbuf++;
}

int beam_ptycho_dm_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_ptycho_dm_t *s = self->priv;
  const beam_ptycho_dm_conf_t *c = &s->conf;
  unsigned long long fid = (unsigned long long)in->frame_id;
  uint32_t shape[2] = {s->fh, s->fw};
  (void)emit;
  int rc = beam__frame_matches(self, in, s->fdt, 2, shape);
  if (rc < 0)
    return rc;
  if (s->failed) {
    /* The reconstruction of this series stopped (reported once); the rest
     * of its frames are counted, not logged again. */
    s->rejected++;
    return 0;
  }
  if (in->flags & (BEAM_FLAG_BAD | BEAM_FLAG_CORRUPT)) {
    s->rejected++;
    return BEAM_DIAG(&self->diag, BEAM_EINVAL, "ptycho_dm \"%s\": frame %llu is flagged %s; left out",
                     self->name, fid, in->flags & BEAM_FLAG_CORRUPT ? "CORRUPT" : "BAD");
  }
  if (s->accepted >= c->max_frames) {
    s->rejected++;
    return BEAM_DIAG(&self->diag, BEAM_ELIMIT,
                     "ptycho_dm \"%s\": frame %llu: the series has more than max_frames = %u frames; left out "
                     "(%llu rejected so far)", self->name, fid, c->max_frames, (unsigned long long)s->rejected);
  }
  int32_t row, col;
  if (c->positions_meta) {
    if (in->frame_id >= s->nmeta) {
      s->rejected++;
      return BEAM_DIAG(&self->diag, BEAM_EINVAL, "ptycho_dm \"%s\": frame %llu has no scan position: the "
                       "metadata lists %zu", self->name, fid, s->nmeta);
    }
    double y = s->meta_pos[2 * in->frame_id], x = s->meta_pos[2 * in->frame_id + 1];
    beam_diag_t sub = {0};
    if (beam_ptycho_place_one(&s->geom, y, x, &row, &col, &sub) < 0) {
      s->rejected++;
      return BEAM_DIAG(&self->diag, BEAM_EINVAL, "ptycho_dm \"%s\": frame %llu: %s", self->name, fid, sub.msg);
    }
  } else {
    if (!(in->flags & BEAM_FLAG_POS)) {
      s->rejected++;
      return BEAM_DIAG(&self->diag, BEAM_EINVAL, "ptycho_dm \"%s\": frame %llu carries no scan position (flag "
                       "POS unset); left out", self->name, fid);
    }
    double y = in->pos[1], x = in->pos[0]; /* wire order (x, y, z) */
    if (!isfinite(y) || !isfinite(x)) {
      s->rejected++;
      return BEAM_DIAG(&self->diag, BEAM_EINVAL, "ptycho_dm \"%s\": frame %llu: scan position (%g, %g) is not "
                       "finite; left out", self->name, fid, x, y);
    }
    beam_diag_t sub = {0};
    if (beam_ptycho_place_one(&s->geom, y, x, &row, &col, &sub) < 0) {
      s->rejected++;
      return BEAM_DIAG(&self->diag, BEAM_EINVAL, "ptycho_dm \"%s\": frame %llu: %s (outside the object this "
                       "series' scan extent gave); left out", self->name, fid, sub.msg);
    }
  }
  s->accepted++;
  if (!s->have_center) {
    hold_frame(s, in->data, in->dtype, row, col);
    return s->ncbuf == s->cbuf_cap ? finish_center(self, s) : 0;
  }
  if ((rc = stage_view(self, s, in->data, in->dtype, row, col, in->frame_id)) < 0)
    return rc;
  return s->nstage == s->stage_cap ? flush(self, s, 0, &self->diag) : 0;
}

/* ---- iterations and results ------------------------------------------------------ */

static void set_flags(beam_frame_t *f, uint32_t flags) {
  f->flags = (f->flags & ~(uint32_t)(BEAM_FLAG_META | BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL |
                                     BEAM_FLAG_POS | BEAM_FLAG_ABORTED)) | flags;
}

static void to_c64(float *dst, const double *src, size_t ncomplex) {
  for (size_t i = 0; i < 2 * ncomplex; i++)
    dst[i] = (float)src[i];
}

/* Object, probe and the error history so far. Returns < 0 only when the
 * engine could not hand the arrays back. */
static int publish(beam_stage_t *self, beam_ptycho_dm_t *s, beam_emit_t *emit, uint32_t flags) {
  const beam_ptycho_dm_conf_t *c = &s->conf;
  size_t nn = (size_t)c->n * c->n;
  size_t objn = (size_t)c->dm.object_modes * s->geom.obj_h * s->geom.obj_w;
  beam_diag_t sub = {0};
  beam_frame_t *f;
  s->it_pub = s->nhist;
  s->t_pub_ns = beam_now_ns();
  if (s->probe_set) {
    if (beam_dm_get_object(s->eng, s->obj_h, &sub) < 0 || beam_dm_get_probe(s->eng, s->probe_h, &sub) < 0)
      return BEAM_DIAG(&self->diag, sub.code ? sub.code : BEAM_EINVAL, "ptycho_dm \"%s\": reading the result: %s",
                       self->name, sub.msg);
    if ((f = beam_emit_get(emit, BEAM_PTYCHO_OUT_OBJECT))) {
      to_c64(f->data, s->obj_h, objn);
      set_flags(f, flags);
      beam_emit_put(emit, f);
    }
    if ((f = beam_emit_get(emit, BEAM_PTYCHO_OUT_PROBE))) {
      to_c64(f->data, s->probe_h, (size_t)c->dm.probe_modes * nn);
      set_flags(f, flags);
      beam_emit_put(emit, f);
    }
  }
  if (s->nhist && (f = beam_emit_get(emit, BEAM_PTYCHO_OUT_ERROR))) {
    double *e = f->data;
    for (uint32_t i = 0; i < s->nhist; i++) {
      e[4 * i] = s->hist[i].iteration;
      e[4 * i + 1] = s->hist[i].fourier_error;
      e[4 * i + 2] = s->hist[i].probe_change;
      e[4 * i + 3] = s->hist[i].object_change;
    }
    f->shape[0] = s->nhist;
    set_flags(f, flags);
    beam_emit_put(emit, f);
  }
  return 0;
}

/* One iteration, its metrics, the divergence check and any publication
 * due. */
static int iterate_once(beam_stage_t *self, beam_ptycho_dm_t *s, beam_emit_t *emit) {
  const beam_ptycho_dm_conf_t *c = &s->conf;
  beam_dm_metrics_t m;
  beam_diag_t sub = {0};
  int rc = beam_dm_iterate(s->eng, &m, &sub);
  if (rc < 0) {
    s->failed = 1;
    return BEAM_DIAG(&self->diag, rc, "ptycho_dm \"%s\": iteration %u failed: %s; reconstruction stopped until "
                     "the next series", self->name, s->nhist, sub.msg);
  }
  s->hist[s->nhist++] = m;
  if (beam_dm_diverged(s->hist, s->nhist, c->diverge_factor)) {
    double mn = INFINITY;
    for (uint32_t i = 0; i < s->nhist; i++)
      if (s->hist[i].fourier_error < mn)
        mn = s->hist[i].fourier_error;
    s->failed = 1;
    return BEAM_DIAG(&self->diag, BEAM_ESTATE,
                     "ptycho_dm \"%s\": the reconstruction diverged at iteration %u (Fourier error %g, minimum "
                     "%g, diverge_factor %g); stopped until the next series", self->name, m.iteration,
                     m.fourier_error, mn, c->diverge_factor);
  }
  uint64_t now = beam_now_ns();
  int due = (c->publish_every && s->nhist - s->it_pub >= c->publish_every) ||
            (c->publish_interval > 0 && (double)(now - s->t_pub_ns) * 1e-9 >= c->publish_interval);
  return due ? publish(self, s, emit, BEAM_FLAG_PARTIAL) : 0;
}

int beam_ptycho_dm_idle(beam_stage_t *self, beam_emit_t *emit) {
  beam_ptycho_dm_t *s = self->priv;
  const beam_ptycho_dm_conf_t *c = &s->conf;
  if (!s->series_open || s->failed || !s->have_center || !s->eng)
    return 0;
  if (beam_dm_nviews(s->eng) + s->nstage < c->min_frames)
    return 0;
  int rc = flush(self, s, 1, &self->diag);
  if (rc < 0)
    return rc;
  /* The last final_iterations wait for the series end, when every view is
   * in: a fast engine must not spend the budget on the first views. */
  uint32_t budget = c->iterations - c->final_iterations;
  if (s->nhist >= budget)
    return 0;
  if ((rc = iterate_once(self, s, emit)) < 0)
    return rc;
  return s->nhist < budget ? 1 : 0;
}

int beam_ptycho_dm_end(beam_stage_t *self, beam_emit_t *emit) {
  beam_ptycho_dm_t *s = self->priv;
  const beam_ptycho_dm_conf_t *c = &s->conf;
  if (!s->series_open)
    return 0;
  s->series_open = 0;
  int rc = 0;
  if (s->failed) {
    /* Divergence or an engine error was reported when it happened; the
     * history shows how it went. */
    return publish(self, s, emit, BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED);
  }
  if (!s->have_center && s->ncbuf && (rc = finish_center(self, s)) < 0)
    return rc;
  if (s->eng && (rc = flush(self, s, 1, &self->diag)) < 0)
    return rc;
  if (!s->eng || beam_dm_nviews(s->eng) == 0)
    return BEAM_DIAG(&self->diag, BEAM_ESTATE, "ptycho_dm \"%s\": the series had no usable frame (%llu "
                     "rejected): nothing to reconstruct", self->name, (unsigned long long)s->rejected);
  int cut = self->end_aborted;
  while (!cut && s->nhist < c->iterations) {
    if (atomic_load(&self->interrupt)) {
      cut = 1;
      break;
    }
    if ((rc = iterate_once(self, s, emit)) < 0) {
      publish(self, s, emit, BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED);
      return rc;
    }
  }
  return publish(self, s, emit, BEAM_FLAG_FINAL | (cut ? BEAM_FLAG_ABORTED : 0));
}

void beam_ptycho_dm_destroy(beam_stage_t *self) {
  beam_ptycho_dm_t *s = self->priv;
  if (!s)
    return;
  series_free(s);
  beam_dm_destroy(&s->eng);
  conf_free(&s->conf);
  free(s);
  self->priv = NULL;
}
