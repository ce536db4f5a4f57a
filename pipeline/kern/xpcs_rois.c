/* ROI definitions for the XPCS kinds: the `rois` schema, label images and
 * ring geometry, the bad-pixel mask, and the compact per-ROI pixel lists
 * built at series start. See xpcs_rois.h for the conventions. */
#include "pipeline/kern/xpcs_rois.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/kern/from_series.h"
#include "pipeline/kern/kern_int.h"

const beam_param_t beam_xpcs_rois_params[] = {
    {"file", BEAM_P_INFILE, NULL, 0, 0, 0, NULL, NULL,
     ".h5 or .npy integer label image (0 = unused); give file or center", NULL},
    {"dataset", BEAM_P_STRING, "/labels", 0, 0, 0, NULL, NULL, "HDF5 dataset of the label image", NULL},
    {"center", BEAM_P_FLOAT_LIST, NULL, 0, -1e9, 1e9, BEAM_FROM_SERIES, NULL,
     "rings: beam centre [x, y] in pixels (pixel centres at integers); \"series\": the series "
     "metadata's beam_center", NULL},
    {"radii", BEAM_P_FLOAT_LIST, NULL, 0, 0, 1e9, NULL, NULL,
     "rings: increasing radius edges in pixels; ring k is edge k <= r < edge k+1", NULL},
    {"q", BEAM_P_FLOAT_LIST, NULL, 0, 0, 1e3, NULL, NULL,
     "rings: increasing q edges in 1/Angstrom (needs energy, distance, pixel_size)", NULL},
    {"energy", BEAM_P_FLOAT, NULL, 0, 1, 1e7, NULL, NULL, "photon energy in eV; default: series metadata", NULL},
    {"distance", BEAM_P_FLOAT, NULL, 0, 1e-6, 1e3, NULL, NULL,
     "sample-detector distance in m; default: series metadata", NULL},
    {"pixel_size", BEAM_P_FLOAT, NULL, 0, 1e-9, 1, NULL, NULL, "pixel size in m; default: series metadata", NULL},
    {"mask", BEAM_P_INFILE, NULL, 0, 0, 0, BEAM_FROM_SERIES, NULL,
     "bad-pixel mask (.h5/.npy, nonzero = bad); \"series\": the series' pixel_mask array", NULL},
    {"mask_dataset", BEAM_P_STRING, "/mask", 0, 0, 0, NULL, NULL, "HDF5 dataset of the mask", NULL},
    BEAM_PARAM_END};

static int is_int_dtype(beam_dtype_t dt) { return dt >= BEAM_DT_U8 && dt <= BEAM_DT_I64; }

static int64_t label_at(const beam_array_t *a, size_t i) {
  switch (a->dtype) {
  case BEAM_DT_U8: return ((const uint8_t *)a->data)[i];
  case BEAM_DT_U16: return ((const uint16_t *)a->data)[i];
  case BEAM_DT_U32: return ((const uint32_t *)a->data)[i];
  case BEAM_DT_U64: {
    uint64_t v = ((const uint64_t *)a->data)[i];
    return v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v;
  }
  case BEAM_DT_I8: return ((const int8_t *)a->data)[i];
  case BEAM_DT_I16: return ((const int16_t *)a->data)[i];
  case BEAM_DT_I32: return ((const int32_t *)a->data)[i];
  case BEAM_DT_I64: return ((const int64_t *)a->data)[i];
  default: return 0;
  }
}

void beam_xpcs_rois_free(beam_xpcs_rois_t *r) {
  if (!r)
    return;
  beam_array_free(&r->labels_img);
  beam_array_free(&r->mask);
  free(r->edges);
  free(r->label);
  free(r->off);
  free(r->idx);
  free(r->labels_json);
  memset(r, 0, sizeof *r);
}

static int edges_from(const beam_cnode_t *seq, beam_xpcs_rois_t *r, const char *who, const char *key,
                      beam_diag_t *d) {
  size_t n = beam_cfg_len(seq);
  if (n < 2)
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois.%s needs at least two edges (one ring)", who, key);
  if (n - 1 > BEAM_XPCS_ROI_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "%s: rois.%s defines %zu rings, at most %u", who, key, n - 1,
                     BEAM_XPCS_ROI_MAX);
  r->edges = malloc(n * sizeof *r->edges);
  if (!r->edges)
    return BEAM_DIAG(d, BEAM_ENOMEM, "%s: out of memory", who);
  r->nedges = n;
  for (size_t i = 0; i < n; i++) {
    r->edges[i] = beam__cfg_item_num(beam_cfg_at(seq, i));
    if (!isfinite(r->edges[i]) || r->edges[i] < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois.%s[%zu] must be a number >= 0", who, key, i);
    if (i && !(r->edges[i] > r->edges[i - 1]))
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois.%s must increase strictly (%g then %g)", who, key,
                       r->edges[i - 1], r->edges[i]);
  }
  return 0;
}

static int init_conf(beam_xpcs_rois_t *r, const beam_cnode_t *cfg, const char *who, beam_diag_t *d) {
  if (!cfg)
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois is required (a label file, or center with radii or q)", who);
  const char *file = beam_cfg_str(cfg, "file");
  const beam_cnode_t *center = beam_cfg_get(cfg, "center"), *radii = beam_cfg_get(cfg, "radii"),
                     *q = beam_cfg_get(cfg, "q");
  int rc;
  if (file && (center || radii || q))
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois: give either file (a label image) or rings (center with radii or q), not both", who);
  if (file) {
    beam_diag_t sub = {0};
    const char *ds = beam_cfg_str(cfg, "dataset");
    if ((rc = beam_array_load(file, ds ? ds : "/labels", &r->labels_img, &sub)) < 0)
      return BEAM_DIAG(d, rc, "%s: rois.file: %s", who, sub.msg);
    if (r->labels_img.ndim != 2 || !is_int_dtype(r->labels_img.dtype)) {
      char s[64];
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: %s: the label image must be 2-D integers, got %s %s", who,
                       file, beam_dtype_name(r->labels_img.dtype),
                       beam_shape_str(r->labels_img.ndim, r->labels_img.shape, s, sizeof s));
    }
  } else {
    if (center && center->kind == BEAM_CN_SCALAR && center->scalar &&
        !strcmp(center->scalar, BEAM_FROM_SERIES)) {
      r->center_series = 1;
    } else {
      if (!center || beam_cfg_len(center) != 2)
        return BEAM_DIAG(d, BEAM_ECONFIG,
                         "%s: rois needs file, or center [x, y] (or series) with radii or q", who);
      r->cx = beam__cfg_item_num(beam_cfg_at(center, 0));
      r->cy = beam__cfg_item_num(beam_cfg_at(center, 1));
      if (!isfinite(r->cx) || !isfinite(r->cy))
        return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois.center must be two numbers or series", who);
    }
    if ((radii != NULL) == (q != NULL))
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois: rings need exactly one of radii (pixels) or q (1/A)", who);
    r->rings = 1;
    r->q_edges = q != NULL;
    if ((rc = edges_from(q ? q : radii, r, who, q ? "q" : "radii", d)) < 0)
      return rc;
  }
  r->energy_ev = beam_cfg_float(cfg, "energy", 0);
  r->distance_m = beam_cfg_float(cfg, "distance", 0);
  r->pixel_m = beam_cfg_float(cfg, "pixel_size", 0);
  if (!r->q_edges && (beam_cfg_get(cfg, "energy") || beam_cfg_get(cfg, "distance") ||
                      beam_cfg_get(cfg, "pixel_size")))
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s: rois: energy, distance and pixel_size apply to q rings only", who);
  const char *mask = beam_cfg_str(cfg, "mask");
  if (mask && !strcmp(mask, BEAM_FROM_SERIES)) {
    r->mask_series = 1; /* a file really called "series" is written ./series */
  } else if (mask) {
    beam_diag_t sub = {0};
    const char *ds = beam_cfg_str(cfg, "mask_dataset");
    if ((rc = beam_array_load(mask, ds ? ds : "/mask", &r->mask, &sub)) < 0)
      return BEAM_DIAG(d, rc, "%s: rois.mask: %s", who, sub.msg);
    if (r->mask.ndim != 2 || !beam__dtype_real(r->mask.dtype))
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: %s: the mask must be a 2-D real array", who, mask);
  }
  return 0;
}

int beam_xpcs_rois_init(beam_xpcs_rois_t *r, const beam_cnode_t *cfg, const char *who, beam_diag_t *d) {
  memset(r, 0, sizeof *r);
  int rc = init_conf(r, cfg, who, d);
  if (rc < 0)
    beam_xpcs_rois_free(r);
  return rc;
}

static size_t edge_bin(const double *e, size_t n, double v) {
  if (!(v >= e[0]) || !(v < e[n - 1]))
    return SIZE_MAX;
  size_t lo = 0, hi = n - 1; /* e[lo] <= v < e[hi] */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (v < e[mid])
      hi = mid;
    else
      lo = mid;
  }
  return lo;
}

/* Per pixel: the ROI's position in r->label, or SIZE_MAX. rings: the ring
 * index; file: looked up in the sorted distinct labels. */
static size_t roi_of(const beam_xpcs_rois_t *r, const beam_array_t *mask, size_t i, uint32_t w,
                     double k_q, double pix_over_d) {
  if (mask && beam_array_get(mask, i) != 0)
    return SIZE_MAX;
  if (r->rings) {
    double dx = (double)(i % w) - r->cx, dy = (double)(i / w) - r->cy;
    double v = sqrt(dx * dx + dy * dy);
    if (r->q_edges)
      v = k_q * sin(atan(v * pix_over_d) / 2);
    return edge_bin(r->edges, r->nedges, v);
  }
  int64_t l = label_at(&r->labels_img, i);
  if (l <= 0)
    return SIZE_MAX;
  size_t lo = 0, hi = r->nroi;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->label[mid] < l)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < r->nroi && r->label[lo] == l ? lo : SIZE_MAX;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void start_free(beam_xpcs_rois_t *r) {
  free(r->label);
  free(r->off);
  free(r->idx);
  free(r->labels_json);
  r->label = NULL, r->off = NULL, r->idx = NULL, r->labels_json = NULL;
  r->nroi = r->total = 0;
}

static int build(beam_xpcs_rois_t *r, uint32_t h, uint32_t w, const beam_series_t *s, const char *who,
                 beam_diag_t *d) {
  size_t npix = (size_t)h * w;
  char fs[64], ms[64];
  uint32_t fshape[2] = {h, w};
  if (!r->rings && (r->labels_img.shape[0] != h || r->labels_img.shape[1] != w))
    return BEAM_DIAG(d, BEAM_ESHAPE, "%s: the label image is %s but the frames are %s", who,
                     beam_shape_str(2, r->labels_img.shape, ms, sizeof ms), beam_shape_str(2, fshape, fs, sizeof fs));
  /* The series' arrays and centre are borrowed for this start only: the
   * pixel lists built below are all that is kept. */
  const beam_array_t *mask = r->mask.data ? &r->mask : NULL;
  int rc;
  if (r->mask_series && (rc = beam__series_real_array(s, who, "rois.mask", "pixel_mask", &mask, d)) < 0)
    return rc;
  if (mask && (mask->ndim != 2 || mask->shape[0] != h || mask->shape[1] != w))
    return BEAM_DIAG(d, BEAM_ESHAPE, "%s: the mask%s is %s but the frames are %s", who,
                     r->mask_series ? " (from the series)" : "",
                     beam_shape_str(mask->ndim, mask->shape, ms, sizeof ms),
                     beam_shape_str(2, fshape, fs, sizeof fs));
  if (r->center_series && (rc = beam__series_beam_center(s, who, "rois.center", &r->cx, &r->cy, d)) < 0)
    return rc;
  double k_q = 0, pod = 0, rmax = 0;
  for (int c = 0; c < 4; c++) {
    double dx = (c & 1 ? (double)w - 1 : 0) - r->cx, dy = (c & 2 ? (double)h - 1 : 0) - r->cy;
    rmax = fmax(rmax, sqrt(dx * dx + dy * dy));
  }
  if (r->q_edges) {
    double e = r->energy_ev > 0 ? r->energy_ev : s ? s->energy_ev : 0;
    double dist = r->distance_m > 0 ? r->distance_m : s ? s->distance_m : 0;
    double pix = r->pixel_m > 0 ? r->pixel_m : s ? s->pixel_size_m : 0;
    if (!(e > 0) || !(dist > 0) || !(pix > 0))
      return BEAM_DIAG(d, BEAM_ECONFIG,
                       "%s: q rings need energy, distance and pixel_size (config rois or series metadata); have %g eV, %g m, %g m",
                       who, e, dist, pix);
    k_q = 4 * M_PI / (12398.419843320026 / e);
    pod = pix / dist;
    rmax = k_q * sin(atan(rmax * pod) / 2);
  }
  if (r->rings) {
    r->nroi = r->nedges - 1;
    for (size_t k = 0; k < r->nroi; k++)
      if (r->edges[k] > rmax)
        return BEAM_DIAG(d, BEAM_ESHAPE,
                         "%s: ring %zu [%g, %g) %s is outside the %ux%u detector (largest %s there: %g)", who,
                         k + 1, r->edges[k], r->edges[k + 1], r->q_edges ? "1/A" : "px", h, w,
                         r->q_edges ? "q" : "radius", rmax);
    if (!(r->label = malloc(r->nroi * sizeof *r->label)))
      goto nomem;
    for (size_t k = 0; k < r->nroi; k++)
      r->label[k] = (int64_t)k + 1;
  } else {
    size_t k = 0;
    if (!(r->label = malloc(npix * sizeof *r->label)))
      goto nomem;
    for (size_t i = 0; i < npix; i++) {
      int64_t l = label_at(&r->labels_img, i);
      if (l > 0)
        r->label[k++] = l;
    }
    qsort(r->label, k, sizeof *r->label, cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
      if (u == 0 || r->label[i] != r->label[u - 1])
        r->label[u++] = r->label[i];
    r->nroi = u;
    if (u == 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: the label image has no label > 0", who);
    if (u > BEAM_XPCS_ROI_MAX)
      return BEAM_DIAG(d, BEAM_ELIMIT, "%s: the label image has %zu labels, at most %u", who, u, BEAM_XPCS_ROI_MAX);
  }
  if (!(r->off = calloc(r->nroi + 1, sizeof *r->off)))
    goto nomem;
  for (size_t i = 0; i < npix; i++) {
    size_t k = roi_of(r, mask, i, w, k_q, pod);
    if (k != SIZE_MAX)
      r->off[k + 1]++;
  }
  for (size_t k = 0; k < r->nroi; k++) {
    if (r->off[k + 1] == 0)
      return BEAM_DIAG(d, BEAM_ESHAPE, "%s: ROI with label %lld has no pixel%s", who, (long long)r->label[k],
                       mask ? " (after the bad-pixel mask)" : " in the frame");
    r->off[k + 1] += r->off[k];
  }
  r->total = r->off[r->nroi];
  uint64_t *cur = malloc(r->nroi * sizeof *cur);
  if (!cur || !(r->idx = malloc(r->total * sizeof *r->idx))) {
    free(cur);
    goto nomem;
  }
  memcpy(cur, r->off, r->nroi * sizeof *cur);
  for (size_t i = 0; i < npix; i++) {
    size_t k = roi_of(r, mask, i, w, k_q, pod);
    if (k != SIZE_MAX)
      r->idx[cur[k]++] = (uint32_t)i;
  }
  free(cur);
  size_t cap = r->nroi * 22 + 3;
  if (!(r->labels_json = malloc(cap)))
    goto nomem;
  size_t o = 0;
  r->labels_json[o++] = '[';
  for (size_t k = 0; k < r->nroi; k++)
    o += (size_t)snprintf(r->labels_json + o, cap - o, "%s%lld", k ? "," : "", (long long)r->label[k]);
  snprintf(r->labels_json + o, cap - o, "]");
  return 0;
nomem:
  return BEAM_DIAG(d, BEAM_ENOMEM, "%s: out of memory building the ROI pixel lists", who);
}

int beam_xpcs_rois_start(beam_xpcs_rois_t *r, uint32_t h, uint32_t w, const beam_series_t *s,
                         const char *who, beam_diag_t *d) {
  start_free(r);
  if ((uint64_t)h * w > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "%s: %ux%u frames have too many pixels", who, h, w);
  int rc = build(r, h, w, s, who, d);
  if (rc < 0)
    start_free(r);
  return rc;
}
