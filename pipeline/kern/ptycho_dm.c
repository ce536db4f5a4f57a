/* Stage kind `ptycho_dm`: the host logic both backends share (series
 * geometry, frame preparation, staging of views, initial probe, iteration
 * in idle and end, publication); its schema, parameters and series
 * metadata are ptycho_dm_conf.c's. The engine
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

int beam_ptycho_dm_init(beam_stage_t *self, beam_dm_backend_t be, beam_diag_t *d) {
  beam_ptycho_dm_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho_dm: out of memory");
  self->priv = s;
  s->backend = be;
  int rc = beam_ptycho_dm_conf_load(&s->conf, self->cfg, d);
  if (rc < 0)
    return rc;
  self->idle = beam_ptycho_dm_idle;
  return 0;
}

/* Element i of a complex array as (re, im). */
static void cget(const beam_array_t *a, size_t i, double *re, double *im) {
  if (a->dtype == BEAM_DT_C64) {
    *re = ((const float *)a->data)[2 * i], *im = ((const float *)a->data)[2 * i + 1];
  } else {
    *re = ((const double *)a->data)[2 * i], *im = ((const double *)a->data)[2 * i + 1];
  }
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
  beam_ptycho_dm_conf_free(&s->conf);
  free(s);
  self->priv = NULL;
}
