/* beamd-record: one HDF5 file per series (layout in docs/recording.md).
 *
 * A file is created as NAME.partial with libver "latest" (SWMR needs it),
 * gets a group per topic the first time that topic shows up, and enters
 * SWMR mode (H5Fstart_swmr_write) once --swmr-after results were stored or
 * --swmr-delay seconds passed, whichever comes first. HDF5 1.10 cannot create
 * groups, datasets or attributes in SWMR mode, so a topic (or a descriptor,
 * or series metadata) first seen after that pauses SWMR: the file is
 * flushed, closed and reopened without SWMR, the new objects are created,
 * and the next tick starts SWMR again. Nothing is refused; a reader must
 * reopen the file to see the new topic (as for any object SWMR adds).
 * Everything that needs attributes at the end (complete, counters) is
 * written after the SWMR session is closed, by reopening the file without
 * SWMR. */
#include "tools/beamd-record/rec.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/h5util.h"

#define FLUSH_NS 1000000000ull /* readers see data at least this often */

static int fail(rec_ctx_t *ctx, const char *path, const char *what) {
  char why[512];
  beam_h5_reason(why, sizeof why, NULL);
  snprintf(ctx->err, sizeof ctx->err, "%s: %s: %s", path, what, why);
  return -1;
}

static int swmr_pause(rec_ctx_t *ctx, rfile_t *f, const char *why);

void rec_final_name(const rec_opts_t *o, uint64_t series_id, char *buf, size_t cap) {
  snprintf(buf, cap, "%.4000s/%.128sseries_%llu.h5", o->dir, o->prefix, (unsigned long long)series_id);
}

static hid_t fapl_latest(void) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0)
    H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  return fapl;
}

/* Series metadata into /series: the frame geometry of SERIES_START and the
 * JSON members flattened (h5util.h says how); the JSON text itself too. */
static int write_meta(hid_t file, const beam_hdr_t *start, const char *meta, size_t len) {
  hid_t g = H5Lexists(file, "/series", H5P_DEFAULT) > 0
                ? H5Gopen2(file, "/series", H5P_DEFAULT)
                : H5Gcreate2(file, "/series", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0)
    return -1;
  int rc = 0;
  rc |= beam_h5_attr_bool(g, "metadata_missing", start == NULL);
  if (start && start->ndim) {
    uint64_t shape[BEAM_MAX_NDIM];
    for (unsigned i = 0; i < start->ndim; i++)
      shape[i] = start->shape[i];
    rc |= beam_h5_attr_str(g, "frame_dtype", beam_dtype_name((beam_dtype_t)start->dtype));
    rc |= beam_h5_attr_u64s(g, "frame_shape", shape, start->ndim);
  }
  if (meta) {
    char msg[256];
    rc |= beam_h5_attr_strn(g, "metadata_json", meta, len);
    if (beam_h5_attrs_from_json(g, meta, len, 1, msg, sizeof msg) < 0) {
      H5Eclear2(H5E_DEFAULT);
      tool_log("series %llu: %s; kept verbatim in /series metadata_json",
              (unsigned long long)(start ? start->series_id : 0), msg);
    }
  }
  H5Gclose(g);
  return rc ? -1 : 0;
}

rfile_t *rfile_open(rec_ctx_t *ctx, uint64_t series_id, const beam_hdr_t *start, const char *meta,
                    size_t meta_len) {
  const rec_opts_t *o = ctx->o;
  rfile_t *f = calloc(1, sizeof *f);
  if (!f) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory");
    return NULL;
  }
  f->series_id = series_id;
  if (!(f->xpcs = xpcs_new()) || xpcs_series(f->xpcs, start, meta, meta_len) < 0) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory");
    xpcs_free(&f->xpcs);
    free(f);
    return NULL;
  }
  rec_final_name(o, series_id, f->final_path, sizeof f->final_path);
  snprintf(f->path, sizeof f->path, "%.4300s.partial", f->final_path);
  if (access(f->path, F_OK) == 0) {
    /* A run that died mid-series: keep its data, under another name. */
    char aside[4500];
    for (unsigned n = 1;; n++) {
      snprintf(aside, sizeof aside, "%s.%u", f->path, n);
      if (access(aside, F_OK) != 0)
        break;
    }
    if (rename(f->path, aside) == 0)
      tool_log("%s existed (an earlier run did not finish it); moved to %s", f->path, aside);
  }
  hid_t fapl = fapl_latest();
  f->file = H5Fcreate(f->path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (f->file < 0) {
    fail(ctx, f->path, "cannot create the file");
    xpcs_free(&f->xpcs);
    free(f);
    return NULL;
  }
  hid_t e = H5Gcreate2(f->file, "/entry", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  hid_t r = H5Gcreate2(f->file, "/results", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  int rc = e >= 0 && r >= 0 ? 0 : -1;
  if (rc == 0) {
    static const char *comp[] = {"none", "gzip", "bslz4"};
    rc |= beam_h5_attr_str(e, "NX_class", "NXentry");
    rc |= beam_h5_attr_str(e, "writer", "beamd-record");
    rc |= beam_h5_attr_u64(e, "series_id", series_id);
    rc |= beam_h5_attr_bool(e, "complete", 0);
    rc |= beam_h5_attr_str(e, "compression", comp[o->compress]);
    rc |= write_meta(f->file, start, meta, meta_len);
  }
  if (r >= 0) H5Gclose(r);
  if (e >= 0) H5Gclose(e);
  if (rc < 0) {
    fail(ctx, f->path, "cannot write the file header");
    H5Fclose(f->file);
    xpcs_free(&f->xpcs);
    free(f);
    return NULL;
  }
  f->have_meta = start != NULL;
  f->opened_ns = f->last_flush_ns = beam_now_ns();
  if (!start) {
    ctx->c->late_join++;
    tool_log("series %llu: results before its SERIES_START (joined late?): recording to %s "
            "without series metadata", (unsigned long long)series_id, f->path);
  }
  return f;
}

int rfile_set_meta(rec_ctx_t *ctx, rfile_t *f, const beam_hdr_t *start, const char *meta,
                   size_t meta_len) {
  if (f->have_meta)
    return 0;
  /* The APS layout is written at close, without SWMR: it can use it. */
  if (xpcs_series(f->xpcs, start, meta, meta_len) < 0) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory");
    return -1;
  }
  if (f->swmr && swmr_pause(ctx, f, "the series metadata (SERIES_START came late)") < 0)
    return -1;
  if (write_meta(f->file, start, meta, meta_len) < 0)
    return fail(ctx, f->path, "cannot write series metadata");
  f->have_meta = 1;
  return 0;
}

static void topic_close(rtopic_t *t) {
  if (t->mtype > 0)
    H5Tclose(t->mtype);
  t->mtype = -1;
  hid_t *h[] = {&t->data, &t->fid, &t->tacq, &t->flg, &t->shp, &t->grp};
  for (size_t i = 0; i < sizeof h / sizeof *h; i++)
    if (*h[i] > 0) {
      if (H5Iget_type(*h[i]) == H5I_GROUP)
        H5Gclose(*h[i]);
      else
        H5Dclose(*h[i]);
      *h[i] = -1;
    }
}

static hid_t topic_reopen_one(hid_t grp, const char *name) {
  return H5Lexists(grp, name, H5P_DEFAULT) > 0 ? H5Dopen2(grp, name, H5P_DEFAULT) : -1;
}

static int write_pending(rec_ctx_t *ctx, rfile_t *f);

/* Ends SWMR so that objects can be created: HDF5 ends a SWMR session only
 * by closing the file. Reopened with file locking off, as final_attrs
 * does, because a SWMR reader may hold the file. rfile_tick starts SWMR
 * again (its condition still holds). -1 (ctx->err) when the file cannot be
 * reopened: what was written stays in the .partial. */
static int swmr_pause(rec_ctx_t *ctx, rfile_t *f, const char *why) {
  if (write_pending(ctx, f) < 0)
    return -1;
  for (int i = 0; i < f->ntopics; i++)
    topic_close(f->topics[i]);
  herr_t closed = H5Fclose(f->file);
  f->file = -1;
  if (closed < 0) {
    f->failed = 1;
    return fail(ctx, f->path, "closing the file to add objects after SWMR began failed");
  }
  hid_t fapl = fapl_latest();
  if (fapl >= 0)
    H5Pset_file_locking(fapl, 0, 1);
  f->file = H5Fopen(f->path, H5F_ACC_RDWR, fapl);
  if (fapl >= 0)
    H5Pclose(fapl);
  if (f->file < 0) {
    f->failed = 1;
    return fail(ctx, f->path, "cannot reopen the file to add objects after SWMR began");
  }
  int rc = 0;
  for (int i = 0; i < f->ntopics && rc == 0; i++) {
    rtopic_t *t = f->topics[i];
    char path[BEAM_TOPIC_MAX + 16];
    snprintf(path, sizeof path, "/results/%s", t->name);
    t->grp = H5Gopen2(f->file, path, H5P_DEFAULT);
    t->data = t->grp >= 0 ? topic_reopen_one(t->grp, "data") : -1;
    t->fid = t->data >= 0 ? topic_reopen_one(t->grp, "frame_id") : -1;
    t->tacq = t->fid >= 0 ? topic_reopen_one(t->grp, "t_acq_ns") : -1;
    t->flg = t->tacq >= 0 ? topic_reopen_one(t->grp, "flags") : -1;
    if (t->flg >= 0 && t->ndim)
      t->shp = topic_reopen_one(t->grp, "shape");
    t->mtype = t->data >= 0 ? H5Dget_type(t->data) : -1;
    rc = t->flg >= 0 && t->mtype >= 0 && (!t->ndim || t->shp >= 0) ? 0 : -1;
  }
  if (rc < 0) {
    f->failed = 1;
    return fail(ctx, f->path, "cannot reopen the datasets of a topic after pausing SWMR");
  }
  f->swmr = 0;
  f->swmr_pauses++;
  ctx->c->swmr_pauses++;
  tool_log("%s: SWMR paused to add %s; readers reopen the file to see it", f->path, why);
  return 0;
}

static int topic_latest(const rec_opts_t *o, const char *name) {
  for (int i = 0; i < o->nlatest; i++)
    if (!strncmp(name, o->latest[i], strlen(o->latest[i])))
      return 1;
  return o->latest_default;
}

/* The chunk of a result axis of bound maxd whose first result is row long:
 * the whole bound, or the first result's extent when there is none. */
static hsize_t axis_chunk(hsize_t maxd, hsize_t row) {
  hsize_t c = maxd != H5S_UNLIMITED ? maxd : row;
  return c ? c : 1; /* HDF5 refuses a chunk of 0 */
}

/* rowmax: the bound of each result dimension (NULL: row itself, a fixed
 * shape). A chunk holds one result of the bound (of the first shape where
 * the bound is unlimited), so a growing result never spans many chunks.
 * Floating-point data is filled with NaN, so the padding of a result
 * smaller than the extent cannot pass for data. */
static hid_t make_ds(hid_t loc, const char *name, hid_t type, int latest, unsigned nrow,
                     const uint32_t *row, const hsize_t *rowmax, hsize_t chunk0, int comp) {
  hsize_t dims[BEAM_MAX_NDIM + 1], maxd[BEAM_MAX_NDIM + 1], chunk[BEAM_MAX_NDIM + 1];
  int nd = 0;
  if (!latest) {
    dims[0] = 0;
    maxd[0] = H5S_UNLIMITED;
    chunk[0] = chunk0;
    nd = 1;
  }
  for (unsigned i = 0; i < nrow; i++, nd++) {
    dims[nd] = row[i];
    maxd[nd] = rowmax ? rowmax[i] : row[i];
    chunk[nd] = axis_chunk(maxd[nd], row[i]);
  }
  hid_t sp = nd ? H5Screate_simple(nd, dims, maxd) : H5Screate(H5S_SCALAR);
  hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
  int ok = sp >= 0 && pl >= 0;
  if (ok && nd)
    ok = H5Pset_chunk(pl, nd, chunk) >= 0;
  if (ok && nd && H5Tget_class(type) == H5T_FLOAT) {
    const double nan = NAN;
    ok = H5Pset_fill_value(pl, H5T_NATIVE_DOUBLE, &nan) >= 0;
  }
  if (ok && comp == REC_COMP_GZIP)
    ok = H5Pset_shuffle(pl) >= 0 && H5Pset_deflate(pl, 4) >= 0;
  if (ok && comp == REC_COMP_BSLZ4) {
    const unsigned cd[2] = {0, 2}; /* default block size, LZ4 */
    ok = H5Pset_filter(pl, BEAM_H5_BSLZ4_FILTER, H5Z_FLAG_MANDATORY, 2, cd) >= 0;
  }
  hid_t ds = ok ? H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT) : -1;
  if (pl >= 0) H5Pclose(pl);
  if (sp >= 0) H5Sclose(sp);
  return ds;
}

/* Descriptor members as attributes of `data`. */
static int write_desc(hid_t data, const beam_msg_t *m) {
  int rc = 0;
  char dbuf[64];
  snprintf(dbuf, sizeof dbuf, "%s", beam_dtype_name((beam_dtype_t)m->hdr.dtype));
  rc |= beam_h5_attr_str(data, "dtype", dbuf);
  if (!m->meta)
    return rc | beam_h5_attr_bool(data, "descriptor_missing", 1);
  rc |= beam_h5_attr_bool(data, "descriptor_missing", 0);
  rc |= beam_h5_attr_strn(data, "descriptor_json", m->meta, m->meta_len);
  json_t *d = json_loadb(m->meta, m->meta_len, 0, NULL);
  if (!json_is_object(d)) {
    json_decref(d);
    return rc;
  }
  static const char *strs[] = {"stage", "output", "units", "kind"};
  for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
    json_t *v = json_object_get(d, strs[i]);
    if (json_is_string(v))
      rc |= beam_h5_attr_str(data, strs[i], json_string_value(v));
  }
  json_t *axes = json_object_get(d, "axes");
  if (json_is_array(axes)) {
    const char *a[BEAM_MAX_NDIM];
    size_t n = 0, i;
    json_t *v;
    json_array_foreach(axes, i, v) if (n < BEAM_MAX_NDIM) a[n++] = json_is_string(v) ? json_string_value(v) : "";
    rc |= beam_h5_attr_strs(data, "axes", a, n);
  }
  json_t *shape = json_object_get(d, "shape");
  if (json_is_array(shape) && json_array_size(shape) <= BEAM_MAX_NDIM) {
    uint64_t s[BEAM_MAX_NDIM];
    size_t n = 0, i;
    json_t *v;
    json_array_foreach(shape, i, v) s[n++] = (uint64_t)json_integer_value(v);
    if (n)
      rc |= beam_h5_attr_u64s(data, "shape", s, n);
  }
  json_t *pf = json_object_get(d, "per_frame");
  if (json_is_boolean(pf))
    rc |= beam_h5_attr_bool(data, "per_frame", json_is_true(pf));
  json_t *labels = json_object_get(d, "labels");
  if (labels) {
    char *s = json_dumps(labels, JSON_COMPACT | JSON_ENCODE_ANY);
    rc |= s ? beam_h5_attr_str(data, "labels", s) : -1;
    free(s);
  }
  json_decref(d);
  return rc;
}

/* The descriptor's declared shape as the bound of each dimension, when it
 * has the result's rank and holds the first result; H5S_UNLIMITED
 * otherwise (no descriptor yet: nothing says how large results get). */
static void result_bounds(const beam_msg_t *m, rtopic_t *t) {
  for (unsigned i = 0; i < t->ndim; i++)
    t->maxd[i] = H5S_UNLIMITED;
  json_t *d = m->meta ? json_loadb(m->meta, m->meta_len, 0, NULL) : NULL;
  json_t *shape = json_object_get(d, "shape");
  int ok = json_is_array(shape) && json_array_size(shape) == t->ndim;
  for (unsigned i = 0; ok && i < t->ndim; i++) {
    json_t *v = json_array_get(shape, i);
    ok = json_is_integer(v) && json_integer_value(v) >= (json_int_t)t->shape[i];
  }
  for (unsigned i = 0; ok && i < t->ndim; i++)
    t->maxd[i] = (hsize_t)json_integer_value(json_array_get(shape, i));
  json_decref(d);
}

static rtopic_t *topic_find(rfile_t *f, const char *name) {
  for (int i = 0; i < f->ntopics; i++)
    if (!strcmp(f->topics[i]->name, name))
      return f->topics[i];
  return NULL;
}

/* A topic's group and datasets, created from its first result. */
static rtopic_t *topic_new(rec_ctx_t *ctx, rfile_t *f, const char *name, const beam_msg_t *m) {
  if (f->ntopics == REC_MAX_TOPICS) {
    snprintf(ctx->err, sizeof ctx->err, "%s: more than %d topics in one series", f->path, REC_MAX_TOPICS);
    return NULL;
  }
  rtopic_t *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory");
    return NULL;
  }
  snprintf(t->name, sizeof t->name, "%s", name);
  t->grp = t->data = t->fid = t->tacq = t->flg = t->shp = t->mtype = -1;
  if (f->swmr) {
    char why[BEAM_TOPIC_MAX + 16];
    snprintf(why, sizeof why, "topic %s", name);
    if (swmr_pause(ctx, f, why) < 0) {
      free(t);
      return NULL;
    }
  }
  /* Also when an earlier pause is still in effect (several new topics
   * between two ticks): a reader that opened the file during SWMR lacks it. */
  if (f->swmr_began) {
    t->late = 1;
    ctx->c->late_topic++;
  }
  f->topics[f->ntopics++] = t;
  const beam_hdr_t *h = &m->hdr;
  t->latest = topic_latest(ctx->o, name);
  t->dtype = (beam_dtype_t)h->dtype;
  t->ndim = h->ndim;
  memcpy(t->shape, h->shape, sizeof t->shape);
  result_bounds(m, t);
  for (unsigned i = 0; i < t->ndim; i++) {
    t->ext[i] = t->ext_file[i] = t->shape[i];
    t->chunk[i] = axis_chunk(t->maxd[i], t->shape[i]); /* as make_ds chooses them */
  }
  t->direct = !t->latest && t->ndim && ctx->o->compress == REC_COMP_NONE;
  char path[BEAM_TOPIC_MAX + 16];
  snprintf(path, sizeof path, "/results/%s", name);
  hid_t type = t->ndim ? beam_h5_type(t->dtype) : H5Tcopy(H5T_STD_U8LE); /* no array: ids only */
  t->grp = H5Gcreate2(f->file, path, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (t->grp >= 0 && type >= 0)
    t->data = make_ds(t->grp, "data", type, t->latest, t->ndim, t->shape, t->maxd, 1,
                      t->ndim ? ctx->o->compress : REC_COMP_NONE);
  if (t->data >= 0)
    t->mtype = H5Dget_type(t->data);
  if (t->mtype >= 0)
    t->fid = make_ds(t->grp, "frame_id", H5T_STD_U64LE, t->latest, 0, NULL, NULL, 1024, REC_COMP_NONE);
  if (t->fid >= 0)
    t->tacq = make_ds(t->grp, "t_acq_ns", H5T_STD_U64LE, t->latest, 0, NULL, NULL, 1024, REC_COMP_NONE);
  if (t->tacq >= 0)
    t->flg = make_ds(t->grp, "flags", H5T_STD_U32LE, t->latest, 0, NULL, NULL, 1024, REC_COMP_NONE);
  /* Created with the topic because SWMR forbids adding it later, when a
   * result of another shape arrives. */
  const uint32_t rank = t->ndim;
  if (t->flg >= 0 && t->ndim)
    t->shp = make_ds(t->grp, "shape", H5T_STD_U32LE, t->latest, 1, &rank, NULL, 1024, REC_COMP_NONE);
  if (type >= 0)
    H5Tclose(type);
  int rc = t->flg >= 0 && (!t->ndim || t->shp >= 0) ? 0 : -1;
  if (rc == 0) {
    rc |= beam_h5_attr_str(t->grp, "topic", name);
    rc |= beam_h5_attr_str(t->grp, "mode", t->latest ? "latest" : "every");
    rc |= write_desc(t->data, m);
  }
  if (rc < 0) {
    fail(ctx, f->path, "cannot create the datasets of a topic");
    return NULL;
  }
  t->have_desc = m->meta != NULL;
  return t;
}

/* k rows of data of one shape after the topic's nfile rows. A row that
 * fills its chunk goes in with H5Dwrite_chunk, which skips the selection and
 * the chunk cache: most of HDF5's cost per row, a chunk per row. */
static int put_data(rtopic_t *t, uint32_t k, const uint32_t *shape, const void *data) {
  int direct = t->direct;
  size_t row_bytes = H5Tget_size(t->mtype);
  for (unsigned i = 0; i < t->ndim; i++) {
    direct &= shape[i] == t->chunk[i];
    row_bytes *= shape[i];
  }
  if (!direct)
    return beam_h5_append_rows(t->data, t->nfile, k, t->mtype, data, t->ndim, t->ext, shape);
  hsize_t dims[BEAM_MAX_NDIM + 1] = {t->nfile + k}, off[BEAM_MAX_NDIM + 1] = {0};
  for (unsigned i = 0; i < t->ndim; i++)
    dims[i + 1] = t->ext[i];
  if (H5Dset_extent(t->data, dims) < 0)
    return -1;
  for (uint32_t j = 0; j < k; j++) {
    off[0] = t->nfile + j;
    if (H5Dwrite_chunk(t->data, H5P_DEFAULT, 0, off, row_bytes, (const uint8_t *)data + j * row_bytes) < 0)
      return -1;
  }
  return 0;
}

/* k rows of one shape after the topic's nfile rows, into all of its
 * datasets. On failure the error (naming the file) goes to ctx->err when
 * report is set, and the extents go back to nfile rows (best effort), so
 * that the rows already in the file keep the same count in every dataset
 * instead of a block of fill values without frame ids. */
static int topic_put(rec_ctx_t *ctx, rfile_t *f, rtopic_t *t, uint32_t k, const uint32_t *shape,
                     const void *data, const uint32_t *shp, const uint64_t *fid,
                     const uint64_t *tacq, const uint32_t *flg, int report) {
  const hsize_t rank = t->ndim;
  int rc = put_data(t, k, shape, data) >= 0 &&
                   (!t->ndim || beam_h5_append_rows(t->shp, t->nfile, k, H5T_NATIVE_UINT32, shp, 1, &rank,
                                            &t->ndim) >= 0) &&
                   beam_h5_append_rows(t->fid, t->nfile, k, H5T_NATIVE_UINT64, fid, 0, NULL, NULL) >= 0 &&
                   beam_h5_append_rows(t->tacq, t->nfile, k, H5T_NATIVE_UINT64, tacq, 0, NULL, NULL) >= 0 &&
                   beam_h5_append_rows(t->flg, t->nfile, k, H5T_NATIVE_UINT32, flg, 0, NULL, NULL) >= 0
               ? 0
               : -1;
  if (rc == 0) {
    t->nfile += k;
    memcpy(t->ext_file, t->ext, sizeof t->ext);
    return 0;
  }
  if (report)
    fail(ctx, f->path, "write failed");
  hsize_t d[BEAM_MAX_NDIM + 1] = {t->nfile}, d2[2] = {t->nfile, rank};
  for (unsigned i = 0; i < t->ndim; i++)
    d[i + 1] = t->ext_file[i];
  H5Dset_extent(t->data, d);
  if (t->ndim)
    H5Dset_extent(t->shp, d2);
  H5Dset_extent(t->fid, d);
  H5Dset_extent(t->tacq, d);
  H5Dset_extent(t->flg, d);
  H5Eclear2(H5E_DEFAULT);
  f->failed = 1;
  return -1;
}

/* The topic's pending rows into the file. When that fails they are lost:
 * the counters of stored rows drop by as many. */
static int block_write(rec_ctx_t *ctx, rfile_t *f, rtopic_t *t, int report) {
  rblock_t *b = t->blk;
  if (!b || !b->k)
    return 0;
  uint32_t k = b->k;
  b->k = 0;
  if (topic_put(ctx, f, t, k, b->shape, b->data, b->shp, b->fid, b->tacq, b->flg, report) == 0)
    return 0;
  t->n -= k;
  f->written -= k;
  ctx->c->written -= k;
  return -1;
}

/* Every topic's pending rows into the file; the first failure is the error
 * reported, the other topics are still tried (their rows may fit). */
static int write_pending(rec_ctx_t *ctx, rfile_t *f) {
  int rc = 0;
  for (int i = 0; i < f->ntopics; i++)
    if (block_write(ctx, f, f->topics[i], rc == 0) < 0)
      rc = -1;
  return rc;
}

/* Room for a block of need bytes in t's buffer, within the file's bound on
 * block memory: past it, every topic's rows are written out and their
 * buffers freed (only a file with several topics of large rows gets there;
 * their blocks are then smaller, which costs little for large rows). */
static int block_room(rec_ctx_t *ctx, rfile_t *f, rtopic_t *t, size_t need) {
  rblock_t *b = t->blk;
  if (need <= b->cap)
    return 0;
  if (f->block_bytes - b->cap + need > REC_FILE_BLOCKS) {
    if (write_pending(ctx, f) < 0)
      return -1;
    for (int i = 0; i < f->ntopics; i++) {
      rblock_t *o = f->topics[i]->blk;
      if (o) {
        free(o->data);
        o->data = NULL;
        f->block_bytes -= o->cap;
        o->cap = 0;
      }
    }
  }
  uint8_t *p = realloc(b->data, need);
  if (!p) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory for a block of rows");
    return -1;
  }
  b->data = p;
  f->block_bytes += need - b->cap;
  b->cap = need;
  return 0;
}

/* One accepted row of an "every" topic: into its block (written out when
 * full), or straight into the file when one row is above the block's bound
 * (HDF5's per-call cost is small beside such a row, and it is not copied). */
static int topic_append(rec_ctx_t *ctx, rfile_t *f, rtopic_t *t, const beam_hdr_t *h,
                        const void *data) {
  static const uint8_t none = 0; /* ndim 0 results have no pixels: the row is still recorded (ids) */
  const uint32_t flags = h->flags;
  size_t row_bytes = H5Tget_size(t->mtype);
  for (unsigned i = 0; i < t->ndim; i++)
    row_bytes *= h->shape[i];
  if (!t->ndim)
    data = &none;
  rblock_t *b = t->blk;
  if (!b && !(b = t->blk = calloc(1, sizeof *b))) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory for a block of rows");
    return -1;
  }
  /* The extent of the block's rows is the one before this row's. */
  if (b->k && memcmp(b->shape, h->shape, t->ndim * sizeof *h->shape) != 0 &&
      block_write(ctx, f, t, 1) < 0)
    return -1;
  for (unsigned i = 0; i < t->ndim; i++)
    if (h->shape[i] > t->ext[i])
      t->ext[i] = h->shape[i];
  if (row_bytes > REC_BLOCK_BYTES) {
    if (topic_put(ctx, f, t, 1, h->shape, data, h->shape, &h->frame_id, &h->t_acq_ns, &flags, 1) < 0)
      return -1;
    t->n++;
    f->written++;
    ctx->c->written++;
    return 0;
  }
  size_t rows = REC_BLOCK_BYTES / (row_bytes ? row_bytes : 1);
  if (rows > REC_BLOCK_ROWS)
    rows = REC_BLOCK_ROWS;
  if (!b->k) {
    if (block_room(ctx, f, t, row_bytes ? rows * row_bytes : 1) < 0)
      return -1;
    memcpy(b->shape, h->shape, sizeof b->shape);
  }
  uint32_t k = b->k;
  memcpy(b->data + k * row_bytes, data, row_bytes);
  memcpy(b->shp + k * t->ndim, h->shape, t->ndim * sizeof *h->shape);
  b->fid[k] = h->frame_id;
  b->tacq[k] = h->t_acq_ns;
  b->flg[k] = flags;
  b->k = k + 1;
  /* Counted as stored from here on: a failing write loses the row with its
   * block, and block_write uncounts them. */
  t->n++;
  f->written++;
  ctx->c->written++;
  return b->k == rows ? block_write(ctx, f, t, 1) : 0;
}

int rfile_result(rec_ctx_t *ctx, rfile_t *f, const beam_msg_t *m, const void *data) {
  const beam_hdr_t *h = &m->hdr;
  char name[BEAM_TOPIC_MAX + 1];
  snprintf(name, sizeof name, "%.*s", (int)m->topic_len, m->topic);
  if (ctx->o->xpcs_layout == REC_XPCS_APS && xpcs_note(f->xpcs, m, data) < 0) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory for XPCS results");
    return -1;
  }
  rtopic_t *t = topic_find(f, name);
  if (!t && !(t = topic_new(ctx, f, name, m)))
    return -1;
  /* A result may be smaller or larger than the first (a g2 gains lag rows
   * as the series goes on), within the declared bounds; its dtype and rank
   * are those of the topic. */
  int same = h->dtype == t->dtype && h->ndim == t->ndim, reshaped = 0;
  for (unsigned i = 0; same && i < t->ndim; i++) {
    same = t->maxd[i] == H5S_UNLIMITED || h->shape[i] <= t->maxd[i];
    reshaped |= h->shape[i] != t->shape[i];
  }
  if (!same || (t->ndim && !data)) {
    if (t->mismatched++ < 3)
      tool_log("%s: topic %s frame %llu has another dtype or rank than its first result, or a "
               "dimension above its descriptor's shape; not stored",
              f->path, name, (unsigned long long)h->frame_id);
    ctx->c->mismatched++;
    return 0;
  }
  int fin = (h->flags & BEAM_FLAG_FINAL) != 0;
  int added = idset_add(fin ? &t->seen_final : &t->seen, h->frame_id);
  if (added < 0) {
    snprintf(ctx->err, sizeof ctx->err, "out of memory for the duplicate set");
    return -1;
  }
  if (added == 0) {
    t->dups++;
    ctx->c->duplicates++;
    return 0;
  }
  if (!t->have_desc && m->meta) {
    if (f->swmr) {
      char why[BEAM_TOPIC_MAX + 32];
      snprintf(why, sizeof why, "the descriptor of %s", name);
      if (swmr_pause(ctx, f, why) < 0)
        return -1;
    }
    if (write_desc(t->data, m) < 0)
      return fail(ctx, f->path, "cannot write a descriptor");
    t->have_desc = 1;
  }
  f->dirty = 1;
  if (!t->latest) {
    if (topic_append(ctx, f, t, h, data) < 0)
      return -1;
    t->reshaped += reshaped;
    return 0;
  }
  /* The extent follows the latest result exactly. */
  uint32_t flags = h->flags;
  hsize_t ext[BEAM_MAX_NDIM];
  for (unsigned i = 0; i < t->ndim; i++)
    ext[i] = h->shape[i];
  int rc = (!t->ndim || H5Dset_extent(t->data, ext) >= 0) &&
                   (!t->ndim || H5Dwrite(t->data, t->mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0) &&
                   (!t->ndim || H5Dwrite(t->shp, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                         h->shape) >= 0) &&
                   H5Dwrite(t->fid, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &h->frame_id) >= 0 &&
                   H5Dwrite(t->tacq, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &h->t_acq_ns) >= 0 &&
                   H5Dwrite(t->flg, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, &flags) >= 0
               ? 0
               : -1;
  if (rc < 0) {
    f->failed = 1;
    return fail(ctx, f->path, "write failed");
  }
  t->reshaped += reshaped;
  t->n++;
  f->written++;
  ctx->c->written++;
  return 0;
}

int rfile_tick(rec_ctx_t *ctx, rfile_t *f, uint64_t now, int force_flush) {
  const rec_opts_t *o = ctx->o;
  if (!f->swmr && !o->no_swmr &&
      (f->written >= o->swmr_after || now - f->opened_ns >= (uint64_t)(o->swmr_delay * 1e9))) {
    /* Readers that open the file as SWMR begins see every row so far. */
    if (write_pending(ctx, f) < 0)
      return -1;
    if (H5Fstart_swmr_write(f->file) < 0) {
      f->failed = 1;
      return fail(ctx, f->path, "cannot start SWMR mode");
    }
    f->swmr = f->swmr_began = 1;
    f->dirty = 0; /* starting SWMR flushes the file */
    f->last_flush_ns = now;
  }
  if (f->dirty && (force_flush || now - f->last_flush_ns >= FLUSH_NS)) {
    if (write_pending(ctx, f) < 0)
      return -1;
    if (H5Fflush(f->file, H5F_SCOPE_GLOBAL) < 0) {
      f->failed = 1;
      return fail(ctx, f->path, "flush failed");
    }
    f->dirty = 0;
    f->last_flush_ns = now;
  }
  return 0;
}

/* The end-of-series attributes and the APS XPCS layout, written with SWMR
 * over. -2: the XPCS layout failed (ctx->err says why). */
static int final_attrs(rec_ctx_t *ctx, rfile_t *f, int complete, const char *why) {
  hid_t fapl = fapl_latest();
  /* A SWMR reader may still hold the file (and its lock): the series is
   * over and no dataset changes any more, only /entry's attributes do. */
  if (fapl >= 0)
    H5Pset_file_locking(fapl, 0, 1);
  hid_t file = H5Fopen(f->path, H5F_ACC_RDWR, fapl);
  hid_t es = file < 0 ? H5Eget_current_stack() : -1;
  H5Pclose(fapl);
  if (file < 0) {
    H5Eset_current_stack(es);
    return -1;
  }
  int rc = 0;
  hid_t e = H5Gopen2(file, "/entry", H5P_DEFAULT);
  if (e >= 0) {
    rc |= beam_h5_attr_bool(e, "complete", complete);
    rc |= beam_h5_attr_u64(e, "results_written", f->written);
    if (f->missing_frames)
      rc |= beam_h5_attr_u64(e, "missing_frames", f->missing_frames);
    if (why)
      rc |= beam_h5_attr_str(e, "incomplete_reason", why);
    H5Gclose(e);
  } else {
    rc = -1;
  }
  for (int i = 0; i < f->ntopics && rc == 0; i++) {
    rtopic_t *t = f->topics[i];
    char path[BEAM_TOPIC_MAX + 16];
    snprintf(path, sizeof path, "/results/%s", t->name);
    hid_t g = H5Gopen2(file, path, H5P_DEFAULT);
    if (g < 0) {
      rc = -1;
      break;
    }
    rc |= beam_h5_attr_u64(g, "results", t->n);
    rc |= beam_h5_attr_u64(g, "duplicates_skipped", t->dups);
    rc |= beam_h5_attr_u64(g, "mismatched_skipped", t->mismatched);
    rc |= beam_h5_attr_u64(g, "reshaped", t->reshaped);
    H5Gclose(g);
  }
  /* Topics that came after SWMR began are named in the file: a reader
   * that held it open during the series did not see them. */
  int nlate = 0;
  const char *late[REC_MAX_TOPICS];
  for (int i = 0; i < f->ntopics; i++)
    if (f->topics[i]->late)
      late[nlate++] = f->topics[i]->name;
  if (nlate && rc == 0 && (e = H5Gopen2(file, "/entry", H5P_DEFAULT)) >= 0) {
    rc |= beam_h5_attr_strs(e, "topics_added_after_swmr", late, (size_t)nlate);
    rc |= beam_h5_attr_u64(e, "swmr_pauses", f->swmr_pauses);
    H5Gclose(e);
  }
  if (rc == 0 && xpcs_write(ctx, f->xpcs, file, f->path) < 0)
    rc = -2;
  if (H5Fclose(file) < 0 && rc == 0)
    rc = -1;
  return rc;
}

int rfile_close(rec_ctx_t *ctx, rfile_t **pf, int complete, const char *why) {
  rfile_t *f = *pf;
  *pf = NULL;
  if (!f)
    return 0;
  /* Rows still in blocks go out on every way a file ends, a failed one too:
   * what was received is kept as far as the disk takes it. */
  int rc = write_pending(ctx, f);
  for (int i = 0; i < f->ntopics; i++)
    topic_close(f->topics[i]);
  /* f->file is -1 when a SWMR pause could not reopen it (already reported). */
  if (f->file >= 0 && H5Fclose(f->file) < 0 && rc == 0)
    rc = fail(ctx, f->path, "closing the file failed");
  /* After a write error the file keeps complete=false from its creation:
   * reopening it for writing on a full disk could leave it unreadable. */
  int fa = rc == 0 && !f->failed ? final_attrs(ctx, f, complete, why) : 0;
  if (fa == -2)
    rc = -1;
  else if (fa < 0)
    rc = fail(ctx, f->path, "cannot write the final attributes");
  if (rc == 0 && complete && !f->failed) {
    if (rename(f->path, f->final_path) < 0) {
      snprintf(ctx->err, sizeof ctx->err, "rename %s -> %s: %s", f->path, f->final_path, strerror(errno));
      rc = -1;
    }
  }
  if (rc == 0 && !complete)
    tool_log("series %llu incomplete (%s): left as %s", (unsigned long long)f->series_id,
            why ? why : "no reason", f->path);
  for (int i = 0; i < f->ntopics; i++) {
    if (f->topics[i]->blk)
      free(f->topics[i]->blk->data);
    free(f->topics[i]->blk);
    idset_free(&f->topics[i]->seen);
    idset_free(&f->topics[i]->seen_final);
    free(f->topics[i]);
  }
  xpcs_free(&f->xpcs);
  free(f);
  return rc;
}
