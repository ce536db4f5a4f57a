/* beamd-record: the APS-8IDI ("nexus") XPCS layout, written beside the
 * generic /results groups so pyXpcsViewer and XPCS-Toolkit open the file.
 *
 * While a series runs, results of stages whose descriptor says kind
 * xpcs_multitau or xpcs_twotime are kept in memory (the latest of each
 * output, a FINAL result never replaced by a later partial one). When the
 * series file is closed, rfile.c reopens it without SWMR for the final
 * attributes and calls xpcs_write(), which adds /xpcs, /entry/instrument and
 * /entry/start_time. Writing at the end is what makes this work with SWMR:
 * HDF5 cannot create datasets once SWMR has begun. Paths, shapes, units and
 * where each comes from are documented in docs/recording.md; datasets the
 * readers require but beamd does not compute are NaN-filled and listed in
 * /xpcs@beamd_unavailable, so a reader opens the file and a person can still
 * tell measured from missing. Not a general NeXus writer. */
#include "tools/beamd-record/rec.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/h5util.h"

#define XS_MAX 8 /* xpcs stages per series file */
#define MAX_MISSING 32

enum { K_G2, K_ERR, K_LAGS, K_INFO, K_C2, K_N };
static const char *const k_out[K_N] = {"g2", "g2_err", "lags", "info", "c2"};

typedef struct karr_s {
  double *v; /* converted to double on receipt */
  uint32_t ndim, shape[3];
  size_t n;
  int final;
  int band; /* c2 of xpcs_twotime's band mode: [R, T, lag], not [R, T, T] */
  char units[32];
} karr_t;

typedef struct xstage_s {
  char name[BEAM_TOPIC_MAX + 1];
  int twotime;
  int64_t *labels;
  size_t nlabels;
  karr_t k[K_N];
} xstage_t;

struct rxpcs_s {
  xstage_t st[XS_MAX];
  int n;
  char *meta; /* SERIES_START JSON (may be NULL) */
  uint32_t h, w;
  time_t opened;
};

static int real_dtype(beam_dtype_t dt) {
  return dt >= BEAM_DT_U8 && dt <= BEAM_DT_F64;
}

static double elem(const void *p, beam_dtype_t dt, size_t i) {
  switch (dt) {
  case BEAM_DT_U8: return ((const uint8_t *)p)[i];
  case BEAM_DT_U16: return ((const uint16_t *)p)[i];
  case BEAM_DT_U32: return ((const uint32_t *)p)[i];
  case BEAM_DT_U64: return (double)((const uint64_t *)p)[i];
  case BEAM_DT_I8: return ((const int8_t *)p)[i];
  case BEAM_DT_I16: return ((const int16_t *)p)[i];
  case BEAM_DT_I32: return ((const int32_t *)p)[i];
  case BEAM_DT_I64: return (double)((const int64_t *)p)[i];
  case BEAM_DT_F32: return ((const float *)p)[i];
  default: return ((const double *)p)[i];
  }
}

rxpcs_t *xpcs_new(void) {
  rxpcs_t *x = calloc(1, sizeof *x);
  if (x)
    x->opened = time(NULL);
  return x;
}

void xpcs_free(rxpcs_t **px) {
  rxpcs_t *x = *px;
  *px = NULL;
  if (!x)
    return;
  for (int i = 0; i < x->n; i++) {
    free(x->st[i].labels);
    for (int k = 0; k < K_N; k++)
      free(x->st[i].k[k].v);
  }
  free(x->meta);
  free(x);
}

int xpcs_series(rxpcs_t *x, const beam_hdr_t *start, const char *meta, size_t len) {
  if (start && start->ndim == 2) {
    x->h = start->shape[0];
    x->w = start->shape[1];
  }
  if (meta) {
    char *m = malloc(len + 1);
    if (!m)
      return -1;
    memcpy(m, meta, len);
    m[len] = '\0';
    free(x->meta);
    x->meta = m;
  }
  return 0;
}

static xstage_t *stage_of(rxpcs_t *x, const char *name, size_t len) {
  for (int i = 0; i < x->n; i++)
    if (strlen(x->st[i].name) == len && !memcmp(x->st[i].name, name, len))
      return &x->st[i];
  return NULL;
}

/* A descriptor of an xpcs kind registers its stage; labels come with it. */
static void learn_desc(rxpcs_t *x, const char *stage, size_t slen, const char *meta, size_t mlen) {
  /* Most results are not XPCS ones and may carry their descriptor every
   * time: do not parse JSON for them. */
  const xstage_t *known = stage_of(x, stage, slen);
  if ((known && known->labels) || !memmem(meta, mlen, "\"xpcs_", 6))
    return;
  json_t *d = json_loadb(meta, mlen, 0, NULL);
  const char *kind = json_string_value(json_object_get(d, "kind"));
  int tt = kind && !strcmp(kind, "xpcs_twotime");
  if (!kind || (!tt && strcmp(kind, "xpcs_multitau"))) {
    json_decref(d);
    return;
  }
  xstage_t *s = stage_of(x, stage, slen);
  if (!s) {
    if (x->n == XS_MAX) {
      json_decref(d);
      return;
    }
    s = &x->st[x->n++];
    snprintf(s->name, sizeof s->name, "%.*s", (int)slen, stage);
    s->twotime = tt;
  }
  json_t *lab = json_object_get(d, "labels");
  if (!s->labels && json_is_array(lab) && json_array_size(lab) > 0) {
    size_t n = json_array_size(lab), i;
    int64_t *v = malloc(n * sizeof *v);
    json_t *e;
    int ok = v != NULL;
    json_array_foreach(lab, i, e) if (ok) {
      ok = json_is_integer(e);
      v[i] = ok ? (int64_t)json_integer_value(e) : 0;
    }
    if (ok) {
      s->labels = v;
      s->nlabels = n;
    } else {
      free(v);
    }
  }
  json_decref(d);
}

int xpcs_note(rxpcs_t *x, const beam_msg_t *m, const void *data) {
  const char *dot = memchr(m->topic, '.', m->topic_len);
  if (!dot)
    return 0;
  size_t slen = (size_t)(dot - m->topic), olen = m->topic_len - slen - 1;
  if (m->meta)
    learn_desc(x, m->topic, slen, m->meta, m->meta_len);
  xstage_t *s = stage_of(x, m->topic, slen);
  if (!s || !data || !real_dtype((beam_dtype_t)m->hdr.dtype) || m->hdr.ndim < 1 || m->hdr.ndim > 3)
    return 0;
  int k;
  for (k = 0; k < K_N; k++)
    if (strlen(k_out[k]) == olen && !memcmp(k_out[k], dot + 1, olen))
      break;
  if (k == K_N)
    return 0;
  karr_t *a = &s->k[k];
  int fin = (m->hdr.flags & BEAM_FLAG_FINAL) != 0;
  if (a->final && !fin)
    return 0; /* a partial arriving after the final (replay) changes nothing */
  size_t n = 1;
  for (unsigned i = 0; i < m->hdr.ndim; i++)
    n *= m->hdr.shape[i];
  if (n > a->n) {
    double *v = realloc(a->v, n * sizeof *v);
    if (!v)
      return -1;
    a->v = v;
  }
  for (size_t i = 0; i < n; i++)
    a->v[i] = elem(data, (beam_dtype_t)m->hdr.dtype, i);
  a->n = n;
  a->ndim = m->hdr.ndim;
  for (unsigned i = 0; i < a->ndim; i++)
    a->shape[i] = m->hdr.shape[i];
  a->final = fin;
  if (m->meta) {
    json_t *d = json_loadb(m->meta, m->meta_len, 0, NULL);
    const char *u = json_string_value(json_object_get(d, "units"));
    if (u)
      snprintf(a->units, sizeof a->units, "%s", u);
    const char *ax2 = json_string_value(json_array_get(json_object_get(d, "axes"), 2));
    a->band = ax2 && !strcmp(ax2, "lag");
    json_decref(d);
  }
  return 0;
}

/* ---- writing ----------------------------------------------------------- */

typedef struct wctx_s {
  hid_t file;
  const char *missing[MAX_MISSING];
  int nmissing;
  const char *err; /* what failed */
} wctx_t;

/* Opens or creates every group along an absolute path; returns the last. */
static hid_t group_path(hid_t file, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1;; p++) {
    int end = *p == '\0';
    if (*p == '/' || end) {
      *p = '\0';
      if (H5Lexists(file, buf, H5P_DEFAULT) <= 0) {
        hid_t g = H5Gcreate2(file, buf, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0)
          return -1;
        if (end)
          return g;
        H5Gclose(g);
      } else if (end) {
        return H5Gopen2(file, buf, H5P_DEFAULT);
      }
      if (end)
        break;
      *p = '/';
    }
  }
  return -1;
}

/* Creates (replacing) dataset `path` (absolute; parents created) of file
 * type ftype from memory of type mtype; nd 0 = scalar. */
static int put(wctx_t *w, const char *path, hid_t ftype, hid_t mtype, int nd, const hsize_t *dims,
               const void *buf, const char *units) {
  char parent[256];
  snprintf(parent, sizeof parent, "%s", path);
  char *slash = strrchr(parent, '/');
  *slash = '\0';
  hid_t g = group_path(w->file, parent);
  if (g < 0) {
    w->err = path;
    return -1;
  }
  if (H5Lexists(g, slash + 1, H5P_DEFAULT) > 0)
    H5Ldelete(g, slash + 1, H5P_DEFAULT);
  hid_t sp = nd ? H5Screate_simple(nd, dims, NULL) : H5Screate(H5S_SCALAR);
  hid_t ds = sp >= 0 ? H5Dcreate2(g, slash + 1, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
  int rc = ds >= 0 && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0 ? 0 : -1;
  if (rc == 0 && units)
    rc = beam_h5_attr_str(ds, "units", units);
  if (ds >= 0) H5Dclose(ds);
  if (sp >= 0) H5Sclose(sp);
  H5Gclose(g);
  if (rc < 0)
    w->err = path;
  return rc;
}

static int put_f64(wctx_t *w, const char *path, int nd, const hsize_t *dims, const double *v,
                   const char *units) {
  return put(w, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, nd, dims, v, units);
}

static int put_i64(wctx_t *w, const char *path, int nd, const hsize_t *dims, const int64_t *v) {
  return put(w, path, H5T_STD_I64LE, H5T_NATIVE_INT64, nd, dims, v, NULL);
}

static int put_scalar(wctx_t *w, const char *path, double v, const char *units) {
  return put_f64(w, path, 0, NULL, &v, units);
}

/* A required dataset beamd has no value for: NaN of the right shape. */
static int put_nan(wctx_t *w, const char *path, int nd, const hsize_t *dims, const char *units) {
  size_t n = 1;
  for (int i = 0; i < nd; i++)
    n *= dims[i];
  double *v = malloc((n ? n : 1) * sizeof *v);
  if (!v) {
    w->err = "out of memory";
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    v[i] = NAN;
  int rc = put_f64(w, path, nd, dims, v, units);
  free(v);
  if (rc == 0 && w->nmissing < MAX_MISSING)
    w->missing[w->nmissing++] = path;
  return rc;
}

/* Fixed-length byte strings: the readers call .decode() on each element. */
static int put_strs(wctx_t *w, const char *path, const char *const *s, size_t n) {
  size_t len = 1;
  for (size_t i = 0; i < n; i++)
    if (strlen(s[i]) + 1 > len)
      len = strlen(s[i]) + 1;
  char *buf = calloc(n, len);
  hid_t t = H5Tcopy(H5T_C_S1);
  int rc = -1;
  if (buf && t >= 0 && H5Tset_size(t, len) >= 0 && H5Tset_strpad(t, H5T_STR_NULLPAD) >= 0) {
    for (size_t i = 0; i < n; i++)
      memcpy(buf + i * len, s[i], strlen(s[i]));
    hsize_t d = n;
    rc = put(w, path, t, t, 1, &d, buf, NULL);
  }
  if (t >= 0) H5Tclose(t);
  free(buf);
  if (rc < 0)
    w->err = path;
  return rc;
}

static int put_str(wctx_t *w, const char *path, const char *s) {
  hid_t t = H5Tcopy(H5T_C_S1);
  int rc = -1;
  if (t >= 0 && H5Tset_size(t, strlen(s) + 1) >= 0)
    rc = put(w, path, t, t, 0, NULL, s, NULL);
  if (t >= 0) H5Tclose(t);
  if (rc < 0)
    w->err = path;
  return rc;
}

/* A number of the series metadata: key, or key[0] of an array. */
static double meta_num(json_t *m, const char *key, int *ok) {
  json_t *v = json_object_get(m, key);
  if (json_is_array(v))
    v = json_array_get(v, 0);
  *ok = json_is_number(v);
  return *ok ? json_number_value(v) : NAN;
}

/* The label image of --xpcs-qmap, [h][w] int32; NULL (logged) when it
 * cannot be read or does not match the frames. */
static int32_t *read_qmap(const char *spec, uint32_t h, uint32_t w, const char *path) {
  char file[4096];
  const char *ds = "/labels";
  const char *colon = strrchr(spec, ':');
  if (colon && colon[1] == '/') {
    snprintf(file, sizeof file, "%.*s", (int)(colon - spec), spec);
    ds = colon + 1;
  } else {
    snprintf(file, sizeof file, "%s", spec);
  }
  hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = f >= 0 ? H5Dopen2(f, ds, H5P_DEFAULT) : -1;
  hid_t sp = d >= 0 ? H5Dget_space(d) : -1;
  hsize_t dims[2] = {0, 0};
  int32_t *v = NULL;
  if (sp < 0) {
    char why[256];
    tool_log("%s: --xpcs-qmap %s:%s cannot be read (%s): no q-map written", path, file, ds,
            beam_h5_reason(why, sizeof why, NULL));
  } else if (H5Sget_simple_extent_ndims(sp) != 2 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0 ||
             dims[0] != h || dims[1] != w) {
    tool_log("%s: --xpcs-qmap %s:%s is %llux%llu (2-D expected), the frames %ux%u: no q-map written",
            path, file, ds, (unsigned long long)dims[0], (unsigned long long)dims[1], h, w);
  } else if ((v = malloc((size_t)h * w * sizeof *v)) &&
             H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
    tool_log("%s: --xpcs-qmap %s:%s: read failed: no q-map written", path, file, ds);
    free(v);
    v = NULL;
  }
  H5Eclear2(H5E_DEFAULT);
  if (sp >= 0) H5Sclose(sp);
  if (d >= 0) H5Dclose(d);
  if (f >= 0) H5Fclose(f);
  return v;
}

/* /xpcs/qmap: one dynamic and one static partition, both the ROIs, named by
 * their label values (beamd knows labels, not the q of each ROI). */
static int write_qmap(wctx_t *w, const rec_ctx_t *ctx, const rxpcs_t *x, const xstage_t *s,
                      size_t R, const int64_t *labels, json_t *meta, const char *path) {
  int rc = 0, ok;
  hsize_t dR = R, two = 2;
  double *vl = malloc(R * sizeof *vl);
  int64_t *idx = malloc(R * sizeof *idx), npts[2] = {(int64_t)R, 1};
  double zero = 0;
  hsize_t one = 1;
  if (!vl || !idx) {
    free(vl), free(idx);
    w->err = "out of memory";
    return -1;
  }
  for (size_t r = 0; r < R; r++) {
    vl[r] = (double)labels[r];
    idx[r] = (int64_t)r;
  }
  static const char *const names[] = {"roi", "none"}, *const units[] = {"label", ""};
  rc |= put_f64(w, "/xpcs/qmap/dynamic_v_list_dim0", 1, &dR, vl, NULL);
  rc |= put_f64(w, "/xpcs/qmap/static_v_list_dim0", 1, &dR, vl, NULL);
  rc |= put_f64(w, "/xpcs/qmap/dynamic_v_list_dim1", 1, &one, &zero, NULL);
  rc |= put_f64(w, "/xpcs/qmap/static_v_list_dim1", 1, &one, &zero, NULL);
  rc |= put_i64(w, "/xpcs/qmap/dynamic_index_mapping", 1, &dR, idx);
  rc |= put_i64(w, "/xpcs/qmap/static_index_mapping", 1, &dR, idx);
  rc |= put_i64(w, "/xpcs/qmap/dynamic_num_pts", 1, &two, npts);
  rc |= put_i64(w, "/xpcs/qmap/static_num_pts", 1, &two, npts);
  rc |= put_strs(w, "/xpcs/qmap/map_names", names, 2);
  rc |= put_strs(w, "/xpcs/qmap/map_units", units, 2);
  free(vl);
  free(idx);
  /* Geometry: beam centre [x, y] in pixels, distance and pixel size in the
   * same length unit (the readers use only their ratio). */
  double bcx = NAN, bcy = NAN;
  json_t *c = json_object_get(meta, "beam_center");
  if (!c)
    c = json_object_get(meta, "center");
  if (json_is_array(c) && json_array_size(c) == 2 && json_is_number(json_array_get(c, 0)) &&
      json_is_number(json_array_get(c, 1))) {
    bcx = json_number_value(json_array_get(c, 0));
    bcy = json_number_value(json_array_get(c, 1));
    rc |= put_scalar(w, "/xpcs/qmap/beam_center_x", bcx, "pixel");
    rc |= put_scalar(w, "/xpcs/qmap/beam_center_y", bcy, "pixel");
  } else {
    rc |= put_nan(w, "/xpcs/qmap/beam_center_x", 0, NULL, "pixel");
    rc |= put_nan(w, "/xpcs/qmap/beam_center_y", 0, NULL, "pixel");
  }
  double dist = meta_num(meta, "distance", &ok);
  rc |= ok ? put_scalar(w, "/xpcs/qmap/detector_distance", dist, "m")
           : put_nan(w, "/xpcs/qmap/detector_distance", 0, NULL, "m");
  double pix = meta_num(meta, "pixel_size", &ok);
  rc |= ok ? put_scalar(w, "/xpcs/qmap/pixel_size", pix, "m")
           : put_nan(w, "/xpcs/qmap/pixel_size", 0, NULL, "m");
  /* The maps need the label image, which only the stage config names. */
  int32_t *lab = ctx->o->xpcs_qmap && x->h ? read_qmap(ctx->o->xpcs_qmap, x->h, x->w, path) : NULL;
  if (lab) {
    size_t np = (size_t)x->h * x->w;
    uint8_t *mask = malloc(np);
    if (!mask) {
      free(lab);
      w->err = "out of memory";
      return -1;
    }
    /* APS numbering: pixel value k+1 belongs to column k of normalized_g2,
     * 0 to none. */
    for (size_t p = 0; p < np; p++) {
      int32_t v = 0;
      for (size_t r = 0; r < R && lab[p] > 0; r++)
        if (labels[r] == lab[p]) {
          v = (int32_t)r + 1;
          break;
        }
      lab[p] = v;
      mask[p] = v > 0;
    }
    hsize_t d2[2] = {x->h, x->w};
    rc |= put(w, "/xpcs/qmap/dynamic_roi_map", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, d2, lab, NULL);
    rc |= put(w, "/xpcs/qmap/static_roi_map", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, d2, lab, NULL);
    rc |= put(w, "/xpcs/qmap/mask", H5T_STD_U8LE, H5T_NATIVE_UINT8, 2, d2, mask, NULL);
    free(mask);
    free(lab);
  } else if (w->nmissing + 3 <= MAX_MISSING) {
    /* Not written at all: a zero map would claim "no pixel in any ROI". */
    w->missing[w->nmissing++] = "/xpcs/qmap/dynamic_roi_map";
    w->missing[w->nmissing++] = "/xpcs/qmap/static_roi_map";
    w->missing[w->nmissing++] = "/xpcs/qmap/mask";
  }
  hid_t q = group_path(w->file, "/xpcs/qmap");
  if (q < 0)
    return -1;
  char hash[BEAM_TOPIC_MAX + 96];
  snprintf(hash, sizeof hash, "beamd:%s:frames=%ux%u:%s", s->name, x->h, x->w,
           ctx->o->xpcs_qmap ? ctx->o->xpcs_qmap : "no-qmap");
  rc |= beam_h5_attr_str(q, "hash", hash);
  H5Gclose(q);
  return rc ? -1 : 0;
}

/* /entry: what the readers need to open the file, from SERIES_START. */
static int write_entry(wctx_t *w, const rxpcs_t *x, json_t *meta, double frame_time) {
  int rc = 0, ok;
  hid_t g = group_path(w->file, "/entry/instrument/bluesky/metadata");
  if (g < 0)
    return -1;
  if (x->meta)
    rc |= beam_h5_attr_str(g, "beamd_series_json", x->meta);
  H5Gclose(g);
  double e = meta_num(meta, "energy", &ok);
  rc |= ok ? put_scalar(w, "/entry/instrument/incident_beam/incident_energy", e / 1000.0, "keV")
           : put_nan(w, "/entry/instrument/incident_beam/incident_energy", 0, NULL, "keV");
  rc |= isfinite(frame_time) ? put_scalar(w, "/entry/instrument/detector_1/frame_time", frame_time, "s")
                             : put_nan(w, "/entry/instrument/detector_1/frame_time", 0, NULL, "s");
  double ct = meta_num(meta, "count_time", &ok);
  rc |= ok ? put_scalar(w, "/entry/instrument/detector_1/count_time", ct, "s")
           : put_nan(w, "/entry/instrument/detector_1/count_time", 0, NULL, "s");
  json_t *ps = json_object_get(meta, "pixel_size");
  double py = NAN, px = NAN;
  if (json_is_number(ps))
    py = px = json_number_value(ps);
  else if (json_is_array(ps) && json_array_size(ps) == 2) /* [y, x] like frame shapes */
    py = json_number_value(json_array_get(ps, 0)), px = json_number_value(json_array_get(ps, 1));
  rc |= isfinite(px) ? put_scalar(w, "/entry/instrument/detector_1/x_pixel_size", px, "m")
                     : put_nan(w, "/entry/instrument/detector_1/x_pixel_size", 0, NULL, "m");
  rc |= isfinite(py) ? put_scalar(w, "/entry/instrument/detector_1/y_pixel_size", py, "m")
                     : put_nan(w, "/entry/instrument/detector_1/y_pixel_size", 0, NULL, "m");
  double d = meta_num(meta, "distance", &ok);
  if (ok)
    rc |= put_scalar(w, "/entry/instrument/detector_1/distance", d, "m");
  const char *st = json_string_value(json_object_get(meta, "start_time"));
  char iso[32];
  if (!st) {
    struct tm tmv;
    gmtime_r(&x->opened, &tmv);
    strftime(iso, sizeof iso, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    st = iso;
  }
  rc |= put_str(w, "/entry/start_time", st);
  return rc ? -1 : 0;
}

/* Lags in frames (the readers multiply delay_list by frame_time). */
static double *lags_frames(const karr_t *l, double frame_time) {
  double *v = malloc((l->n ? l->n : 1) * sizeof *v);
  if (!v)
    return NULL;
  int secs = !strcmp(l->units, "s");
  for (size_t i = 0; i < l->n; i++)
    v[i] = secs ? l->v[i] / frame_time : l->v[i];
  return v;
}

static int write_multitau(wctx_t *w, const xstage_t *s, double frame_time, size_t *R_out) {
  const karr_t *g = &s->k[K_G2], *l = &s->k[K_LAGS], *e = &s->k[K_ERR];
  size_t rows = g->shape[0], R = g->ndim == 2 ? g->shape[1] : 1;
  if (l->n != rows) {
    tool_log("xpcs stage %s: lags (%zu) and g2 rows (%zu) disagree; APS layout not written", s->name,
            l->n, rows);
    return 1;
  }
  double *lf = lags_frames(l, frame_time);
  if (!lf) {
    w->err = "out of memory";
    return -1;
  }
  /* APS delay lists start at lag 1: lag 0 (scikit-beam's first row) has
   * no place on their log-scale axes, so it stays in /results only. */
  size_t skip = rows > 0 && lf[0] == 0.0 ? 1 : 0;
  hsize_t d2[2] = {rows - skip, R}, d1 = rows - skip;
  int rc = 0;
  rc |= put_f64(w, "/xpcs/multitau/normalized_g2", 2, d2, g->v + skip * R, NULL);
  if (e->v && e->n == g->n)
    rc |= put_f64(w, "/xpcs/multitau/normalized_g2_err", 2, d2, e->v + skip * R, NULL);
  else
    rc |= put_nan(w, "/xpcs/multitau/normalized_g2_err", 2, d2, NULL);
  rc |= put_f64(w, "/xpcs/multitau/delay_list", 1, &d1, lf + skip, "frames");
  free(lf);
  int64_t one = 1;
  rc |= put_i64(w, "/xpcs/multitau/config/stride_frame", 0, NULL, &one);
  rc |= put_i64(w, "/xpcs/multitau/config/avg_frame", 0, NULL, &one);
  *R_out = R;
  return rc ? -1 : 0;
}

static int write_twotime(wctx_t *w, const xstage_t *s, double frame_time, size_t *R_out) {
  const karr_t *c = &s->k[K_C2], *g = &s->k[K_G2], *l = &s->k[K_LAGS];
  if (c->ndim != 3 || c->shape[1] != c->shape[2] || c->band) {
    tool_log("xpcs stage %s: c2 is not [R, T, T] (band mode?); APS two-time layout not written",
            s->name);
    return 1;
  }
  size_t R = c->shape[0], T = c->shape[1];
  double *half = malloc(T * T * sizeof *half);
  int64_t *bins = malloc(R * sizeof *bins);
  int rc = 0;
  if (!half || !bins) {
    free(half), free(bins);
    w->err = "out of memory";
    return -1;
  }
  /* The readers rebuild c2 as half + half^T with the diagonal halved, so
   * the upper triangle and diagonal are stored, the lower one zeroed. */
  for (size_t r = 0; r < R && rc == 0; r++) {
    const double *m = c->v + r * T * T;
    for (size_t i = 0; i < T; i++)
      for (size_t j = 0; j < T; j++)
        half[i * T + j] = j >= i ? m[i * T + j] : 0.0;
    char path[64];
    snprintf(path, sizeof path, "/xpcs/twotime/correlation_map/c2_%05zu", r + 1);
    hsize_t d2[2] = {T, T};
    rc |= put_f64(w, path, 2, d2, half, NULL);
    bins[r] = (int64_t)r + 1;
  }
  free(half);
  hsize_t dR = R;
  rc |= put_i64(w, "/xpcs/twotime/processed_bins", 1, &dR, bins);
  free(bins);
  int64_t one = 1;
  rc |= put_i64(w, "/xpcs/twotime/config/stride_frame", 0, NULL, &one);
  rc |= put_i64(w, "/xpcs/twotime/config/avg_frame", 0, NULL, &one);
  if (g->v && g->ndim == 2 && g->shape[1] == R) {
    hsize_t d2[2] = {g->shape[0], R}, d3[3] = {g->shape[0], 1, R};
    rc |= put_f64(w, "/xpcs/twotime/normalized_g2", 2, d2, g->v, NULL);
    rc |= put_nan(w, "/xpcs/twotime/normalized_g2_segments", 3, d3, NULL);
    if (l->v && l->n == g->shape[0]) {
      double *lf = lags_frames(l, frame_time);
      hsize_t d1 = l->n;
      rc |= lf ? put_f64(w, "/xpcs/twotime/delay_list", 1, &d1, lf, "frames") : -1;
      free(lf);
    }
  } else if (w->nmissing < MAX_MISSING) {
    w->missing[w->nmissing++] = "/xpcs/twotime/normalized_g2";
  }
  *R_out = R;
  return rc ? -1 : 0;
}

int xpcs_write(rec_ctx_t *ctx, rxpcs_t *x, hid_t file, const char *path) {
  if (!x || ctx->o->xpcs_layout == REC_XPCS_NONE)
    return 0;
  const xstage_t *s = NULL;
  for (int i = 0; i < x->n && !s; i++) {
    const xstage_t *c = &x->st[i];
    if (c->twotime ? c->k[K_C2].v != NULL : c->k[K_G2].v && c->k[K_LAGS].v)
      s = c;
  }
  if (!s)
    return 0;
  for (int i = 0; i < x->n; i++)
    if (&x->st[i] != s)
      tool_log("%s: APS layout holds one XPCS analysis: %s is written, %s only under /results", path,
              s->name, x->st[i].name);
  wctx_t w = {.file = file};
  json_t *meta = x->meta ? json_loads(x->meta, 0, NULL) : NULL;
  int ok;
  double ft = meta_num(meta, "frame_time", &ok);
  if (!(ft > 0))
    ft = NAN;
  if (s->k[K_LAGS].v && !strcmp(s->k[K_LAGS].units, "s") && !isfinite(ft)) {
    tool_log("%s: lags are in seconds but the series has no frame_time; APS layout not written", path);
    json_decref(meta);
    return 0;
  }
  size_t R = 0;
  int rc = s->twotime ? write_twotime(&w, s, ft, &R) : write_multitau(&w, s, ft, &R);
  if (rc == 1) { /* inconsistent results: logged, nothing to write */
    json_decref(meta);
    return 0;
  }
  int64_t *labels = NULL;
  if (rc == 0) {
    labels = malloc(R * sizeof *labels);
    if (!labels) {
      rc = -1;
    } else {
      /* Without a descriptor (late subscriber) the ROIs are numbered 1..R. */
      for (size_t r = 0; r < R; r++)
        labels[r] = s->labels && s->nlabels == R ? s->labels[r] : (int64_t)r + 1;
    }
  }
  if (rc == 0)
    rc = write_qmap(&w, ctx, x, s, R, labels, meta, path);
  free(labels);
  if (rc == 0)
    rc = write_entry(&w, x, meta, ft);
  if (rc == 0) {
    /* Required by the readers, not computed by beamd. */
    hsize_t d2[2] = {1, R}, dt[2] = {2, 1};
    const karr_t *info = &s->k[K_INFO];
    size_t nf = info->v && info->n >= 1 && info->v[0] >= 1 ? (size_t)info->v[0] : 1;
    dt[1] = nf;
    rc |= put_nan(&w, "/xpcs/temporal_mean/scattering_1d", 2, d2, NULL);
    rc |= put_nan(&w, "/xpcs/temporal_mean/scattering_1d_segments", 2, d2, NULL);
    rc |= put_nan(&w, "/xpcs/spatial_mean/intensity_vs_time", 2, dt, NULL);
    if (w.nmissing < MAX_MISSING)
      w.missing[w.nmissing++] = "/xpcs/temporal_mean/scattering_2d";
  }
  hid_t g = rc == 0 ? group_path(file, "/xpcs") : -1;
  if (g >= 0) {
    rc |= beam_h5_attr_str(g, "writer", "beamd-record");
    rc |= beam_h5_attr_str(g, "layout", "APS-8IDI nexus (pyXpcsViewer, XPCS-Toolkit)");
    rc |= beam_h5_attr_str(g, "source_stage", s->name);
    rc |= beam_h5_attr_str(g, "analysis", s->twotime ? "xpcs_twotime" : "xpcs_multitau");
    rc |= beam_h5_attr_bool(g, "final", s->k[s->twotime ? K_C2 : K_G2].final);
    rc |= beam_h5_attr_strs(g, "beamd_unavailable", w.missing, (size_t)w.nmissing);
    H5Gclose(g);
  } else {
    rc = -1;
  }
  json_decref(meta);
  if (rc < 0) {
    char why[512];
    beam_h5_reason(why, sizeof why, NULL);
    snprintf(ctx->err, sizeof ctx->err, "%s: APS XPCS layout: %s: %s", path, w.err ? w.err : "/xpcs", why);
    return -1;
  }
  return 0;
}
