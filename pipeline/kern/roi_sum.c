/* Stage kind `roi_sum`: schema, and the host-side setup both backends share
 * (ROI parsing, mask files, the bad-pixel mask and centres taken from the
 * series, pixel runs or per-ROI pixel lists, scan image, outputs). The
 * summation loops live in roi_sum_cpu.c and gpu/roi_sum_cuda.cu. */
#include "pipeline/kern/roi_sum.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/from_series.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

static const beam_param_t roi_geom_params[] = {
    {"name", BEAM_P_STRING, NULL, 1, 0, 0, NULL, NULL, "ROI name (shown by viewers)", NULL},
    {"shape", BEAM_P_ENUM, NULL, 1, 0, 0, "disk|annulus|rect", NULL, "ROI geometry", NULL},
    {"center", BEAM_P_FLOAT_LIST, NULL, 0, -1e9, 1e9, BEAM_FROM_SERIES, NULL,
     "[x, y] in pixels (pixel centres at integers); \"series\": the series metadata's "
     "beam_center; default: the frame centre", NULL},
    {"radius", BEAM_P_FLOAT, NULL, 0, 0, 1e9, NULL, NULL, "disk radius in pixels", NULL},
    {"radii", BEAM_P_FLOAT_LIST, NULL, 0, 0, 1e9, NULL, NULL, "annulus [inner, outer] radii in pixels (inner <= r < outer)", NULL},
    {"rect", BEAM_P_INT_LIST, NULL, 0, 0, 1e9, NULL, NULL, "rectangle [x0, y0, x1, y1], half-open, in pixels", NULL},
    BEAM_PARAM_END};

static const beam_param_t roi_file_params[] = {
    {"file", BEAM_P_INFILE, NULL, 1, 0, 0, NULL, NULL, ".h5 or .npy file with the masks", NULL},
    {"dataset", BEAM_P_STRING, "/masks", 0, 0, 0, NULL, NULL,
     "HDF5 dataset: 2-D label image (label k > 0 -> ROI, ordered by label) or 3-D stack of weight masks", NULL},
    BEAM_PARAM_END};

const beam_param_t beam_roi_sum_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"rois", BEAM_P_MAP_LIST, NULL, 0, 0, 0, NULL, roi_geom_params, "ROIs given by geometry", NULL},
    {"masks", BEAM_P_MAP, NULL, 0, 0, 0, NULL, roi_file_params, "ROIs given by a mask file", NULL},
    {"scan_shape", BEAM_P_INT_LIST, NULL, 0, 1, 1e6, NULL, NULL,
     "[ny, nx]: also build the virtual-detector image of a raster scan (frame id -> pixel); "
     "default: the series metadata's scan_shape, if it has one", NULL},
    {"image_every", BEAM_P_INT, "256", 0, 1, 1e9, NULL, NULL, "publish the scan image every N frames (and at series end)", NULL},
    {"mask", BEAM_P_INFILE, NULL, 0, 0, 0, BEAM_FROM_SERIES, NULL,
     "bad-pixel mask (.h5/.npy, frame shape, nonzero = bad): bad pixels leave every ROI; "
     "\"series\": the series' pixel_mask array", NULL},
    {"mask_dataset", BEAM_P_STRING, "/mask", 0, 0, 0, NULL, NULL, "HDF5 dataset of the mask file", NULL},
    BEAM_PARAM_END};

/* Largest scan image (bytes): it is copied into a result every image_every frames. */
#define IMAGE_MAX_BYTES ((uint64_t)1 << 31)

/* ---- init ----------------------------------------------------------------- */

static int list_nums(const beam_cnode_t *seq, double *v, size_t n) {
  if (beam_cfg_len(seq) != n)
    return -1;
  for (size_t i = 0; i < n; i++) {
    v[i] = beam__cfg_item_num(beam_cfg_at(seq, i));
    if (!isfinite(v[i]))
      return -1;
  }
  return 0;
}

static int parse_roi(const beam_cnode_t *m, size_t i, beam_roi_geom_t *g, beam_diag_t *d) {
  const char *name = beam_cfg_str(m, "name");
  const char *shape = beam_cfg_str(m, "shape");
  if (!name || !*name)
    return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: rois[%zu] has no name", i);
  if (strlen(name) >= sizeof g->name)
    return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI name \"%s\" is longer than %zu characters", name,
                     sizeof g->name - 1);
  snprintf(g->name, sizeof g->name, "%s", name);
  const beam_cnode_t *center = beam_cfg_get(m, "center"), *radius = beam_cfg_get(m, "radius"),
                     *radii = beam_cfg_get(m, "radii"), *rect = beam_cfg_get(m, "rect");
  if (!shape)
    return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\" has no shape", name);
  if (center && center->kind == BEAM_CN_SCALAR && center->scalar &&
      !strcmp(center->scalar, BEAM_FROM_SERIES)) {
    g->center_series = 1;
  } else if (center) {
    double c[2];
    if (list_nums(center, c, 2) < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": center must be [x, y] or series", name);
    g->has_center = 1, g->cx = c[0], g->cy = c[1];
  }
  if (strcmp(shape, "disk") == 0) {
    g->shape = BEAM_ROI_DISK;
    if (!radius)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": a disk needs radius", name);
    if (radii || rect)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": a disk takes center and radius only", name);
    g->r_out = beam_cfg_float(m, "radius", NAN);
    if (!(g->r_out > 0))
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": radius must be > 0", name);
  } else if (strcmp(shape, "annulus") == 0) {
    g->shape = BEAM_ROI_ANNULUS;
    double r[2];
    if (!radii || list_nums(radii, r, 2) < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": an annulus needs radii [inner, outer]", name);
    if (radius || rect)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": an annulus takes center and radii only", name);
    if (!(r[0] >= 0 && r[1] > r[0]))
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": radii need 0 <= inner < outer, got [%g, %g]",
                       name, r[0], r[1]);
    g->r_in = r[0], g->r_out = r[1];
  } else if (strcmp(shape, "rect") == 0) {
    g->shape = BEAM_ROI_RECT;
    double r[4];
    if (!rect || list_nums(rect, r, 4) < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": a rect needs rect [x0, y0, x1, y1]", name);
    if (center || radius || radii)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": a rect takes rect only", name);
    if (!(r[2] > r[0] && r[3] > r[1]))
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": rect needs x1 > x0 and y1 > y0", name);
    g->x0 = (int64_t)r[0], g->y0 = (int64_t)r[1], g->x1 = (int64_t)r[2], g->y1 = (int64_t)r[3];
  } else {
    return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: ROI \"%s\": unknown shape \"%s\"", name, shape);
  }
  return 0;
}

static int64_t label_at(const beam_array_t *a, size_t i) {
  switch (a->dtype) {
  case BEAM_DT_U8: return ((const uint8_t *)a->data)[i];
  case BEAM_DT_U16: return ((const uint16_t *)a->data)[i];
  case BEAM_DT_U32: return ((const uint32_t *)a->data)[i];
  case BEAM_DT_U64: return (int64_t)((const uint64_t *)a->data)[i];
  case BEAM_DT_I8: return ((const int8_t *)a->data)[i];
  case BEAM_DT_I16: return ((const int16_t *)a->data)[i];
  case BEAM_DT_I32: return ((const int32_t *)a->data)[i];
  case BEAM_DT_I64: return ((const int64_t *)a->data)[i];
  default: return 0;
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int is_int_dtype(beam_dtype_t dt) { return dt >= BEAM_DT_U8 && dt <= BEAM_DT_I64; }

static int load_masks(beam_roi_sum_conf_t *c, const beam_cnode_t *m, beam_diag_t *d) {
  const char *file = beam_cfg_str(m, "file");
  const char *ds = beam_cfg_str(m, "dataset");
  beam_diag_t sub = {0};
  int rc = beam_array_load(file, ds ? ds : "/masks", &c->masks, &sub);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "roi_sum: masks: %s", sub.msg);
  beam_array_t *a = &c->masks;
  if (a->ndim == 3) {
    if (!beam__dtype_real(a->dtype))
      return BEAM_DIAG(d, BEAM_ENOTSUP, "roi_sum: %s: weight masks must be real numbers", file);
    c->nroi = a->shape[0];
  } else if (a->ndim == 2) {
    if (!is_int_dtype(a->dtype))
      return BEAM_DIAG(d, BEAM_ENOTSUP,
                       "roi_sum: %s: a 2-D mask must be an integer label image (got %s); give weight masks as a 3-D stack [n, h, w]",
                       file, beam_dtype_name(a->dtype));
    size_t n = beam_array_elems(a), k = 0;
    int64_t *v = malloc(n * sizeof *v);
    if (!v)
      return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
    for (size_t i = 0; i < n; i++) {
      int64_t l = label_at(a, i);
      if (l > 0)
        v[k++] = l;
    }
    qsort(v, k, sizeof *v, cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
      if (u == 0 || v[i] != v[u - 1])
        v[u++] = v[i];
    c->labels = v;
    c->nroi = u;
    if (u == 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: %s: the label image has no label > 0", file);
  } else {
    char s[64];
    return BEAM_DIAG(d, BEAM_ENOTSUP, "roi_sum: %s: masks must be a 2-D label image or a 3-D weight stack, got shape %s",
                     file, beam_shape_str(a->ndim, a->shape, s, sizeof s));
  }
  if (c->nroi > BEAM_ROI_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "roi_sum: %s defines %zu ROIs, at most %u are supported", file,
                     c->nroi, BEAM_ROI_MAX);
  return 0;
}

/* JSON string body with the characters JSON requires escaped. */
static size_t json_escape(char *out, const char *s) {
  size_t o = 0;
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') {
      if (out) out[o] = '\\', out[o + 1] = (char)ch;
      o += 2;
    } else if (ch < 0x20) {
      if (out) snprintf(out + o, 7, "\\u%04x", ch);
      o += 6;
    } else {
      if (out) out[o] = (char)ch;
      o++;
    }
  }
  return o;
}

static int make_labels_json(beam_roi_sum_conf_t *c, beam_diag_t *d) {
  char name[BEAM_NAME_MAX + 32];
  size_t len = 3;
  for (int pass = 0; pass < 2; pass++) {
    size_t o = 0;
    if (pass) {
      c->labels_json = malloc(len);
      if (!c->labels_json)
        return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
      c->labels_json[o] = '[';
    }
    o++;
    for (size_t r = 0; r < c->nroi; r++) {
      if (c->geom)
        snprintf(name, sizeof name, "%s", c->geom[r].name);
      else if (c->labels)
        snprintf(name, sizeof name, "label_%lld", (long long)c->labels[r]);
      else
        snprintf(name, sizeof name, "mask_%zu", r);
      char *out = pass ? c->labels_json : NULL;
      if (r) {
        if (out) out[o] = ',';
        o++;
      }
      if (out) out[o] = '"';
      o++;
      o += json_escape(out ? out + o : NULL, name);
      if (out) out[o] = '"';
      o++;
    }
    if (pass) {
      c->labels_json[o] = ']';
      c->labels_json[o + 1] = '\0';
    }
    len = o + 2;
  }
  return 0;
}

static int init_conf(beam_roi_sum_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  const beam_cnode_t *rois = beam_cfg_get(cfg, "rois"), *masks = beam_cfg_get(cfg, "masks");
  if ((rois != NULL) == (masks != NULL))
    return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: give exactly one of rois (geometry) or masks (file)%s",
                     rois ? ", not both" : "");
  int rc;
  if (rois) {
    c->nroi = beam_cfg_len(rois);
    if (c->nroi == 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: rois is empty");
    if (c->nroi > BEAM_ROI_MAX)
      return BEAM_DIAG(d, BEAM_ELIMIT, "roi_sum: %zu ROIs, at most %u are supported", c->nroi, BEAM_ROI_MAX);
    c->geom = calloc(c->nroi, sizeof *c->geom);
    if (!c->geom)
      return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
    for (size_t i = 0; i < c->nroi; i++) {
      if ((rc = parse_roi(beam_cfg_at(rois, i), i, &c->geom[i], d)) < 0)
        return rc;
      for (size_t j = 0; j < i; j++)
        if (strcmp(c->geom[j].name, c->geom[i].name) == 0)
          return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: two ROIs are named \"%s\"", c->geom[i].name);
    }
  } else if ((rc = load_masks(c, masks, d)) < 0) {
    return rc;
  }
  const beam_cnode_t *scan = beam_cfg_get(cfg, "scan_shape");
  if (scan) {
    double v[2];
    if (list_nums(scan, v, 2) < 0 || !(v[0] >= 1 && v[0] <= 1e6 && v[1] >= 1 && v[1] <= 1e6))
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: scan_shape must be [ny, nx], each 1..1e6");
    c->scan = 1;
    c->scan_ny = (uint32_t)v[0];
    c->scan_nx = (uint32_t)v[1];
    if ((double)c->nroi * c->scan_ny * c->scan_nx * sizeof(float) > (double)IMAGE_MAX_BYTES)
      return BEAM_DIAG(d, BEAM_ELIMIT, "roi_sum: scan image of %zu x %u x %u floats exceeds %llu bytes",
                       c->nroi, c->scan_ny, c->scan_nx, (unsigned long long)IMAGE_MAX_BYTES);
  }
  const char *mask = beam_cfg_str(cfg, "mask");
  if (mask && !strcmp(mask, BEAM_FROM_SERIES)) {
    c->mask_series = 1; /* a file really called "series" is written ./series */
  } else if (mask) {
    beam_diag_t sub = {0};
    const char *ds = beam_cfg_str(cfg, "mask_dataset");
    if ((rc = beam_array_load(mask, ds ? ds : "/mask", &c->mask, &sub)) < 0)
      return BEAM_DIAG(d, rc, "roi_sum: mask: %s", sub.msg);
    if (c->mask.ndim != 2 || !beam__dtype_real(c->mask.dtype))
      return BEAM_DIAG(d, BEAM_ECONFIG, "roi_sum: %s: the mask must be a 2-D real array", mask);
  }
  int64_t every = beam_cfg_int(cfg, "image_every", 256);
  c->image_every = every >= 1 ? (uint64_t)every : 1;
  return make_labels_json(c, d);
}

int beam_roi_host_init(beam_roi_host_t *h, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(h, 0, sizeof *h);
  int rc = init_conf(&h->conf, cfg, d);
  if (rc < 0)
    beam_roi_host_free(h);
  return rc;
}

static void lists_free(beam_roi_lists_t *l) {
  free(l->off);
  free(l->idx);
  free(l->w);
  memset(l, 0, sizeof *l);
}

static void runs_free(beam_roi_runs_t *r) {
  free(r->run);
  free(r->acc);
  memset(r, 0, sizeof *r);
}

void beam_roi_host_free(beam_roi_host_t *h) {
  beam_roi_sum_conf_t *c = &h->conf;
  free(c->geom);
  free(c->labels);
  free(c->labels_json);
  beam_array_free(&c->masks);
  beam_array_free(&c->mask);
  free(c->bad);
  lists_free(&h->lists);
  runs_free(&h->runs);
  free(h->img);
  memset(h, 0, sizeof *h);
}

/* ---- membership ------------------------------------------------------------ */

static size_t label_index(const beam_roi_sum_conf_t *c, int64_t l) {
  size_t lo = 0, hi = c->nroi;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->labels[mid] < l)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < c->nroi && c->labels[lo] == l ? lo : SIZE_MAX;
}

double beam_roi_weight(const beam_roi_sum_conf_t *c, size_t r, uint32_t h, uint32_t w,
                       uint32_t y, uint32_t x) {
  if (c->bad && c->bad[(size_t)y * w + x])
    return 0.0;
  if (c->geom) {
    const beam_roi_geom_t *g = &c->geom[r];
    if (g->shape == BEAM_ROI_RECT)
      return x >= g->x0 && x < g->x1 && y >= g->y0 && y < g->y1 ? 1.0 : 0.0;
    double cx = g->has_center ? g->cx : (w - 1) / 2.0, cy = g->has_center ? g->cy : (h - 1) / 2.0;
    double dx = x - cx, dy = y - cy, d2 = dx * dx + dy * dy;
    if (g->shape == BEAM_ROI_DISK)
      return d2 < g->r_out * g->r_out ? 1.0 : 0.0;
    return d2 >= g->r_in * g->r_in && d2 < g->r_out * g->r_out ? 1.0 : 0.0;
  }
  size_t i = (size_t)y * w + x;
  if (c->labels)
    return label_at(&c->masks, i) == c->labels[r] ? 1.0 : 0.0;
  return beam_array_get(&c->masks, r * (size_t)h * w + i);
}

/* ---- start ------------------------------------------------------------------ */

static int empty_roi(const beam_roi_sum_conf_t *c, size_t r, uint32_t h, uint32_t w, beam_diag_t *d) {
  char name[BEAM_NAME_MAX + 32];
  if (c->geom)
    snprintf(name, sizeof name, "\"%s\"", c->geom[r].name);
  else if (c->labels)
    snprintf(name, sizeof name, "label %lld", (long long)c->labels[r]);
  else
    snprintf(name, sizeof name, "mask %zu", r);
  return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: ROI %s has no pixel inside the %ux%u frame%s", name, h,
                   w, c->bad ? " (after the bad-pixel mask)" : "");
}

/* Adds pixel i of ROI r to the runs. Pixels arrive in raster order per
 * ROI (geometry: one ROI after another; labels: one sweep, one ROI per
 * pixel), so a pixel continues a run only if that run is the last one. */
static int run_add(beam_roi_runs_t *rs, size_t *cap, uint32_t i, uint32_t r) {
  if (rs->n > 0) {
    beam_roi_run_t *t = &rs->run[rs->n - 1];
    if (t->roi == r && (uint64_t)t->start + t->len == i) {
      t->len++;
      return 0;
    }
  }
  if (rs->n == *cap) {
    size_t nc = *cap ? 2 * *cap : 1024;
    beam_roi_run_t *v = realloc(rs->run, nc * sizeof *v);
    if (!v)
      return -1;
    rs->run = v;
    *cap = nc;
  }
  rs->run[rs->n++] = (beam_roi_run_t){i, 1, r};
  return 0;
}

static int cmp_run(const void *a, const void *b) {
  const beam_roi_run_t *x = a, *y = b;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  return (x->roi > y->roi) - (x->roi < y->roi);
}

/* Unit-weight ROIs as runs. Returns 0 when built, 1 when the runs are too
 * short to pay (nothing kept: the caller builds lists), or < 0. */
static int build_runs(beam_roi_host_t *hs, uint32_t h, uint32_t w, beam_diag_t *d) {
  beam_roi_sum_conf_t *c = &hs->conf;
  beam_roi_runs_t *rs = &hs->runs;
  size_t npix = (size_t)h * w, nroi = c->nroi, cap = 0;
  uint64_t total = 0;
  int rc = 0;
  runs_free(rs);
  rs->nroi = nroi;
  uint64_t *cnt = calloc(nroi, sizeof *cnt);
  if (!cnt)
    goto nomem;
  if (c->labels) {
    /* Labels come in long stretches: look each new one up only once. */
    int64_t prev = 0;
    size_t pr = SIZE_MAX;
    for (size_t i = 0; i < npix; i++) {
      int64_t lab = label_at(&c->masks, i);
      if (lab != prev) {
        prev = lab;
        pr = lab > 0 ? label_index(c, lab) : SIZE_MAX;
      }
      if (pr == SIZE_MAX || (c->bad && c->bad[i]))
        continue;
      cnt[pr]++;
      if (run_add(rs, &cap, (uint32_t)i, (uint32_t)pr) < 0)
        goto nomem;
    }
  } else {
    for (size_t r = 0; r < nroi; r++)
      for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++) {
          if (beam_roi_weight(c, r, h, w, y, x) == 0.0)
            continue;
          cnt[r]++;
          if (run_add(rs, &cap, y * w + x, (uint32_t)r) < 0)
            goto nomem;
        }
    if (rs->n > 1) /* none at all when every ROI misses the frame */
      qsort(rs->run, rs->n, sizeof *rs->run, cmp_run);
  }
  for (size_t r = 0; r < nroi && rc == 0; r++) {
    if (cnt[r] == 0)
      rc = empty_roi(c, r, h, w, d);
    total += cnt[r];
  }
  free(cnt);
  cnt = NULL;
  if (rc == 0 && (uint64_t)rs->n * BEAM_ROI_RUN_MIN_MEAN > total)
    rc = 1;
  if (rc == 0 && !(rs->acc = malloc(nroi * sizeof(uint64_t))))
    goto nomem;
  if (rc != 0)
    runs_free(rs);
  return rc;
nomem:
  free(cnt);
  runs_free(rs);
  return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory building pixel runs");
}

static int build_lists(beam_roi_host_t *hs, uint32_t h, uint32_t w, beam_diag_t *d) {
  beam_roi_sum_conf_t *c = &hs->conf;
  beam_roi_lists_t *l = &hs->lists;
  size_t npix = (size_t)h * w, nroi = c->nroi;
  lists_free(l);
  l->nroi = nroi;
  l->off = calloc(nroi + 1, sizeof *l->off);
  if (!l->off)
    return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
  /* Pass 1: pixel count per ROI. Labels in one sweep (there may be
   * thousands of them); geometry and weights ROI by ROI. */
  if (c->labels) {
    for (size_t i = 0; i < npix; i++) {
      int64_t lab = label_at(&c->masks, i);
      size_t r = lab > 0 && !(c->bad && c->bad[i]) ? label_index(c, lab) : SIZE_MAX;
      if (r != SIZE_MAX)
        l->off[r + 1]++;
    }
  } else {
    for (size_t r = 0; r < nroi; r++)
      for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++)
          l->off[r + 1] += beam_roi_weight(c, r, h, w, y, x) != 0.0;
  }
  for (size_t r = 0; r < nroi; r++) {
    if (l->off[r + 1] == 0)
      return empty_roi(c, r, h, w, d);
    l->off[r + 1] += l->off[r];
  }
  l->total = l->off[nroi];
  l->idx = malloc(l->total * sizeof *l->idx);
  int weighted = !c->geom && !c->labels;
  if (weighted)
    l->w = malloc(l->total * sizeof *l->w);
  if (!l->idx || (weighted && !l->w))
    return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: cannot allocate pixel lists (%zu entries)", l->total);
  /* Pass 2: fill in raster order, so each list is increasing. */
  if (c->labels) {
    uint64_t *cur = malloc(nroi * sizeof *cur);
    if (!cur)
      return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
    memcpy(cur, l->off, nroi * sizeof *cur);
    for (size_t i = 0; i < npix; i++) {
      int64_t lab = label_at(&c->masks, i);
      size_t r = lab > 0 && !(c->bad && c->bad[i]) ? label_index(c, lab) : SIZE_MAX;
      if (r != SIZE_MAX)
        l->idx[cur[r]++] = (uint32_t)i;
    }
    free(cur);
  } else {
    for (size_t r = 0; r < nroi; r++) {
      uint64_t k = l->off[r];
      for (uint32_t y = 0; y < h; y++)
        for (uint32_t x = 0; x < w; x++) {
          double wt = beam_roi_weight(c, r, h, w, y, x);
          if (wt == 0.0)
            continue;
          if (weighted)
            l->w[k] = wt;
          l->idx[k++] = y * w + x;
        }
    }
  }
  return 0;
}

/* The per-series part of the configuration: the bad-pixel table from the
 * mask file or the series' pixel_mask, and the centres taken from the
 * series. The series' arrays are read here and not kept. */
static int resolve_series(beam_roi_sum_conf_t *c, const beam_series_t *series, uint32_t h,
                          uint32_t w, beam_diag_t *d) {
  free(c->bad);
  c->bad = NULL;
  int rc;
  for (size_t r = 0; c->geom && r < c->nroi; r++) {
    beam_roi_geom_t *g = &c->geom[r];
    if (!g->center_series)
      continue;
    char key[BEAM_NAME_MAX + 32];
    snprintf(key, sizeof key, "ROI \"%s\": center", g->name);
    if ((rc = beam__series_beam_center(series, "roi_sum", key, &g->cx, &g->cy, d)) < 0)
      return rc;
    g->has_center = 1;
  }
  const beam_array_t *m = c->mask.data ? &c->mask : NULL;
  if (c->mask_series && (rc = beam__series_real_array(series, "roi_sum", "mask", "pixel_mask", &m, d)) < 0)
    return rc;
  if (!m)
    return 0;
  if (m->ndim != 2 || m->shape[0] != h || m->shape[1] != w) {
    char ms[64], fs[64];
    uint32_t fshape[2] = {h, w};
    return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: the mask%s is %s but the frames are %s",
                     c->mask_series ? " (from the series)" : "",
                     beam_shape_str(m->ndim, m->shape, ms, sizeof ms),
                     beam_shape_str(2, fshape, fs, sizeof fs));
  }
  size_t n = (size_t)h * w;
  if (!(c->bad = malloc(n)))
    return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: cannot allocate the %zu-pixel mask table", n);
  for (size_t i = 0; i < n; i++)
    c->bad[i] = beam_array_get(m, i) != 0.0;
  return 0;
}

int beam_roi_host_start(beam_stage_t *self, beam_roi_host_t *hs, const beam_series_t *series,
                        const beam_indesc_t *in, int use_runs, beam_diag_t *d) {
  beam_roi_sum_conf_t *c = &hs->conf;
  char fs[64], ms[64];
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2 || in->shape[0] == 0 || in->shape[1] == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: frames must be 2-D and non-empty, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  uint32_t h = in->shape[0], w = in->shape[1];
  if ((uint64_t)h * w > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "roi_sum: %ux%u frames have too many pixels", h, w);
  if (!c->geom) {
    const beam_array_t *a = &c->masks;
    uint32_t mh = a->shape[a->ndim - 2], mw = a->shape[a->ndim - 1];
    if (mh != h || mw != w)
      return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: masks have shape %s but the frames are %s",
                       beam_shape_str(a->ndim, a->shape, ms, sizeof ms),
                       beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  }
  /* Neither layout survives a failed start, so nothing half-built is
   * ever summed. */
  lists_free(&hs->lists);
  runs_free(&hs->runs);
  int rc = resolve_series(c, series, h, w, d);
  if (rc < 0)
    return rc;
  rc = use_runs && (c->geom || c->labels) ? build_runs(hs, h, w, d) : 1;
  if (rc == 1)
    rc = build_lists(hs, h, w, d);
  if (rc < 0) {
    lists_free(&hs->lists);
    runs_free(&hs->runs);
    return rc;
  }
  uint32_t nshape[1] = {(uint32_t)c->nroi};
  self->nouts = 1;
  beam__declare(&self->outs[0], "sums", BEAM_DT_F64, 1, nshape, "counts", 1);
  self->outs[0].axes[0] = "roi";
  self->outs[0].labels_json = c->labels_json;
  hs->scan = c->scan, hs->scan_ny = c->scan_ny, hs->scan_nx = c->scan_nx;
  if (!hs->scan) {
    rc = beam__series_scan_shape(series, &hs->scan_ny, &hs->scan_nx);
    if (rc < 0)
      return BEAM_DIAG(d, BEAM_ESHAPE, "roi_sum: the series metadata's scan_shape is not [ny, nx] "
                       "(integers 1..1e6)");
    hs->scan = rc;
    if (hs->scan && (double)c->nroi * hs->scan_ny * hs->scan_nx * sizeof(float) > (double)IMAGE_MAX_BYTES)
      return BEAM_DIAG(d, BEAM_ELIMIT, "roi_sum: %zu ROIs x the series' %u x %u scan exceed the %llu-byte "
                       "image limit", c->nroi, hs->scan_ny, hs->scan_nx, (unsigned long long)IMAGE_MAX_BYTES);
  }
  if (hs->scan) {
    size_t n = c->nroi * (size_t)hs->scan_ny * hs->scan_nx;
    if (n > hs->img_cap) {
      free(hs->img);
      hs->img = malloc(n * sizeof *hs->img);
      hs->img_cap = hs->img ? n : 0;
      if (!hs->img)
        return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: cannot allocate the %zu-pixel scan image", n);
    }
    for (size_t i = 0; i < n; i++)
      hs->img[i] = NAN;
    uint32_t ishape[3] = {(uint32_t)c->nroi, hs->scan_ny, hs->scan_nx};
    beam__declare(&self->outs[1], "image", BEAM_DT_F32, 3, ishape, "counts", 0);
    self->outs[1].axes[0] = "roi";
    self->outs[1].labels_json = c->labels_json;
    self->outs[1].slots = 4;
    self->nouts = 2;
  }
  hs->in = *in;
  hs->nframes = 0;
  return 0;
}

/* ---- per frame ----------------------------------------------------------------- */

void beam_roi_host_record(beam_roi_host_t *h, uint64_t frame_id, const double *sums) {
  const beam_roi_sum_conf_t *c = &h->conf;
  h->nframes++;
  if (!h->scan)
    return;
  size_t npix = (size_t)h->scan_ny * h->scan_nx, p = (size_t)(frame_id % npix);
  for (size_t r = 0; r < c->nroi; r++)
    h->img[r * npix + p] = (float)sums[r];
}

int beam_roi_host_image(beam_roi_host_t *h, beam_emit_t *emit, int final) {
  const beam_roi_sum_conf_t *c = &h->conf;
  if (!h->scan || (!final && h->nframes % c->image_every != 0))
    return 0;
  beam_frame_t *f = beam_emit_get(emit, 1);
  if (!f)
    return 0;
  memcpy(f->data, h->img, c->nroi * (size_t)h->scan_ny * h->scan_nx * sizeof(float));
  f->flags = final ? BEAM_FLAG_FINAL : BEAM_FLAG_PARTIAL;
  beam_emit_put(emit, f);
  return 0;
}

int beam_roi_host_corrupt(beam_roi_host_t *h, beam_emit_t *emit) {
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  double *s = f->data;
  for (size_t r = 0; r < h->conf.nroi; r++)
    s[r] = NAN;
  beam_roi_host_record(h, f->frame_id, s);
  beam_emit_put(emit, f);
  return beam_roi_host_image(h, emit, 0);
}
