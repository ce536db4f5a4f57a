/* beamd-sub HDF5 output (--save-h5): appends each array to a per-name dataset.
 *
 * Dataset "/<name>" has shape (rows, *shape), unlimited rows, one row per
 * chunk, and the first descriptor JSON seen as string attribute
 * "descriptor"; "/<name>:ids" is (rows, 2) uint64 of (series_id, frame_id).
 * ':' cannot occur in a topic, so the ids can never collide with a topic.
 * An existing file is appended to, and existing datasets are extended when
 * their dtype and row shape match. Not a recorder: no compression and no
 * ordering guarantees beyond arrival order.
 */
#include "tools/beamd-sub/sub.h"

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define H5_MAX_DSETS 256

typedef struct h5_dset_s {
  char name[BEAM_TOPIC_MAX + 8];
  hid_t data, ids, ftype;
  unsigned ndim; /* row dims + 1 */
  hsize_t dims[BEAM_MAX_NDIM + 1];
  uint8_t dtype;
} h5_dset_t;

struct sub_h5_s {
  hid_t file;
  hid_t c64, c128; /* h5py-compatible complex compounds */
  h5_dset_t ds[H5_MAX_DSETS];
  int nds;
};

static hid_t complex_type(hid_t part, size_t psize) {
  hid_t t = H5Tcreate(H5T_COMPOUND, 2 * psize);
  H5Tinsert(t, "r", 0, part);
  H5Tinsert(t, "i", psize, part);
  return t;
}

int sub_h5_open(sub_h5_t **out, const char *path, beam_diag_t *d) {
  *out = NULL;
  sub_h5_t *self = calloc(1, sizeof *self);
  if (!self)
    return BEAM_DIAG(d, BEAM_ENOMEM, "HDF5 writer state");
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* we report errors ourselves */
  if (access(path, F_OK) == 0)
    self->file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  else
    self->file = H5Fcreate(path, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
  if (self->file < 0) {
    free(self);
    return BEAM_DIAG(d, BEAM_EIO, "%s: cannot open or create HDF5 file", path);
  }
  self->c64 = complex_type(H5T_IEEE_F32LE, 4);
  self->c128 = complex_type(H5T_IEEE_F64LE, 8);
  *out = self;
  return 0;
}

static hid_t file_type(const sub_h5_t *self, uint8_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return H5T_STD_U8LE;
  case BEAM_DT_U16: return H5T_STD_U16LE;
  case BEAM_DT_U32: return H5T_STD_U32LE;
  case BEAM_DT_U64: return H5T_STD_U64LE;
  case BEAM_DT_I8: return H5T_STD_I8LE;
  case BEAM_DT_I16: return H5T_STD_I16LE;
  case BEAM_DT_I32: return H5T_STD_I32LE;
  case BEAM_DT_I64: return H5T_STD_I64LE;
  case BEAM_DT_F32: return H5T_IEEE_F32LE;
  case BEAM_DT_F64: return H5T_IEEE_F64LE;
  case BEAM_DT_C64: return self->c64;
  case BEAM_DT_C128: return self->c128;
  default: return -1;
  }
}

static int set_descriptor(hid_t dset, const beam_msg_t *m) {
  if (!m->meta || H5Aexists(dset, "descriptor") > 0)
    return 0;
  hid_t st = H5Tcopy(H5T_C_S1);
  H5Tset_size(st, m->meta_len ? m->meta_len : 1);
  H5Tset_cset(st, H5T_CSET_UTF8);
  hid_t sp = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(dset, "descriptor", st, sp, H5P_DEFAULT, H5P_DEFAULT);
  int rc = a >= 0 && H5Awrite(a, st, m->meta) >= 0 ? 0 : -1;
  if (a >= 0)
    H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(st);
  return rc;
}

static hid_t create_ext(hid_t file, const char *name, hid_t type, unsigned ndim,
                        const hsize_t *row) {
  hsize_t dims[BEAM_MAX_NDIM + 1] = {0}, maxd[BEAM_MAX_NDIM + 1], chunk[BEAM_MAX_NDIM + 1];
  maxd[0] = H5S_UNLIMITED;
  chunk[0] = 1;
  for (unsigned i = 1; i < ndim; i++)
    dims[i] = maxd[i] = chunk[i] = row[i - 1];
  hid_t sp = H5Screate_simple((int)ndim, dims, maxd);
  hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(pl, (int)ndim, chunk);
  hid_t ds = H5Dcreate2(file, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
  H5Pclose(pl);
  H5Sclose(sp);
  return ds;
}

/* Opens or creates the dataset pair for this name and message geometry. */
static h5_dset_t *get_dset(sub_h5_t *self, const char *name, const beam_hdr_t *h,
                           beam_diag_t *d) {
  for (int i = 0; i < self->nds; i++)
    if (!strcmp(self->ds[i].name, name))
      return &self->ds[i];
  if (self->nds == H5_MAX_DSETS) {
    BEAM_DIAG(d, BEAM_ELIMIT, "more than %d datasets in one HDF5 file", H5_MAX_DSETS);
    return NULL;
  }
  h5_dset_t *ds = &self->ds[self->nds];
  memset(ds, 0, sizeof *ds);
  snprintf(ds->name, sizeof ds->name, "%s", name);
  ds->ftype = file_type(self, h->dtype);
  ds->dtype = h->dtype;
  ds->ndim = h->ndim + 1u;
  hsize_t row[BEAM_MAX_NDIM];
  for (unsigned i = 0; i < h->ndim; i++)
    row[i] = h->shape[i];
  char idname[sizeof ds->name + 8];
  snprintf(idname, sizeof idname, "%s:ids", name);
  hsize_t idrow[1] = {2};

  if (H5Lexists(self->file, name, H5P_DEFAULT) > 0) {
    ds->data = H5Dopen2(self->file, name, H5P_DEFAULT);
    ds->ids = H5Dopen2(self->file, idname, H5P_DEFAULT);
    hid_t sp = ds->data >= 0 ? H5Dget_space(ds->data) : -1;
    hid_t t = ds->data >= 0 ? H5Dget_type(ds->data) : -1;
    int nd = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    int ok = ds->ids >= 0 && nd == (int)ds->ndim && t >= 0 && H5Tequal(t, ds->ftype) > 0;
    if (ok) {
      H5Sget_simple_extent_dims(sp, ds->dims, NULL);
      for (unsigned i = 1; i < ds->ndim; i++)
        ok = ok && ds->dims[i] == row[i - 1];
    }
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    if (!ok) {
      if (ds->data >= 0) H5Dclose(ds->data);
      if (ds->ids >= 0) H5Dclose(ds->ids);
      BEAM_DIAG(d, BEAM_ESHAPE, "dataset %s exists with another dtype or shape (or no %s)",
                name, idname);
      return NULL;
    }
  } else {
    ds->data = create_ext(self->file, name, ds->ftype, ds->ndim, row);
    ds->ids = ds->data >= 0 ? create_ext(self->file, idname, H5T_STD_U64LE, 2, idrow) : -1;
    if (ds->data < 0 || ds->ids < 0) {
      if (ds->data >= 0) H5Dclose(ds->data);
      BEAM_DIAG(d, BEAM_EIO, "cannot create dataset %s", name);
      return NULL;
    }
    ds->dims[0] = 0;
    for (unsigned i = 1; i < ds->ndim; i++)
      ds->dims[i] = row[i - 1];
    hid_t sp = H5Screate(H5S_SCALAR), st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, strlen(name));
    hid_t a = H5Acreate2(ds->data, "name", st, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
      H5Awrite(a, st, name);
      H5Aclose(a);
    }
    H5Tclose(st);
    H5Sclose(sp);
  }
  self->nds++;
  return ds;
}

/* Appends one row of `type` to dset (whose dims are in/out). */
static int append_row(hid_t dset, hsize_t *dims, unsigned ndim, hid_t type, const void *buf) {
  hsize_t nd[BEAM_MAX_NDIM + 1], start[BEAM_MAX_NDIM + 1] = {0}, count[BEAM_MAX_NDIM + 1];
  memcpy(nd, dims, ndim * sizeof *nd);
  nd[0]++;
  if (H5Dset_extent(dset, nd) < 0)
    return -1;
  start[0] = dims[0];
  count[0] = 1;
  for (unsigned i = 1; i < ndim; i++)
    count[i] = dims[i];
  hid_t fs = H5Dget_space(dset);
  hid_t ms = H5Screate_simple((int)ndim, count, NULL);
  int rc = -1;
  if (fs >= 0 && ms >= 0 &&
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
      H5Dwrite(dset, type, ms, fs, H5P_DEFAULT, buf) >= 0)
    rc = 0;
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  if (rc == 0)
    dims[0]++;
  return rc;
}

int sub_h5_append(sub_h5_t *self, const char *name, const beam_msg_t *m,
                  const void *data, beam_diag_t *d) {
  const beam_hdr_t *h = &m->hdr;
  if (h->ndim == 0 || !data)
    return 0; /* nothing array-shaped to store */
  if (file_type(self, h->dtype) < 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: dtype %u cannot be stored", name, h->dtype);
  h5_dset_t *ds = get_dset(self, name, h, d);
  if (!ds)
    return d->code;
  int same = ds->dtype == h->dtype && ds->ndim == h->ndim + 1u;
  for (unsigned i = 1; same && i < ds->ndim; i++)
    same = ds->dims[i] == h->shape[i - 1];
  if (!same)
    return BEAM_DIAG(d, BEAM_ESHAPE, "%s: series %llu frame %llu has another dtype or shape "
                     "than the dataset; not stored", name, (unsigned long long)h->series_id,
                     (unsigned long long)h->frame_id);
  hsize_t idims[2] = {ds->dims[0], 2};
  uint64_t ids[2] = {h->series_id, h->frame_id};
  if (append_row(ds->data, ds->dims, ds->ndim, ds->ftype, data) < 0 ||
      append_row(ds->ids, idims, 2, H5T_NATIVE_UINT64, ids) < 0)
    return BEAM_DIAG(d, BEAM_EIO, "%s: HDF5 write failed", name);
  if (set_descriptor(ds->data, m) < 0)
    return BEAM_DIAG(d, BEAM_EIO, "%s: cannot write descriptor attribute", name);
  return 0;
}

void sub_h5_close(sub_h5_t **pself) {
  sub_h5_t *self = pself ? *pself : NULL;
  if (!self)
    return;
  for (int i = 0; i < self->nds; i++) {
    H5Dclose(self->ds[i].data);
    H5Dclose(self->ds[i].ids);
  }
  H5Tclose(self->c64);
  H5Tclose(self->c128);
  H5Fclose(self->file);
  free(self);
  *pself = NULL;
}
