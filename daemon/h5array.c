/* HDF5 arrays for stage init (darks, flats, masks): the loader registered
 * with pipeline/array.c.
 *
 * HDF5 prints its error stack to stderr by default; a daemon must not, so
 * automatic printing is switched off for the duration of a load and the
 * innermost message (the most specific one, e.g. "No such file or
 * directory") is copied into the diagnostic instead. Not thread-safe with
 * respect to other HDF5 users in the process: stage init runs on the graph
 * build thread, and the HDF5 writer has its own thread only after that. */
#include "daemon/h5array.h"

#include <hdf5.h>
#include <string.h>

typedef struct h5err_s {
  char msg[512];
} h5err_t;

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *ctx) {
  h5err_t *he = ctx;
  if (e->desc && e->desc[0])
    snprintf(he->msg, sizeof he->msg, "%s (in %s)", e->desc, e->func_name ? e->func_name : "?");
  (void)n;
  return 0;
}

/* Innermost message of the current error stack, then clears it. */
static const char *h5_reason(h5err_t *he) {
  he->msg[0] = '\0';
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, he);
  H5Eclear2(H5E_DEFAULT);
  if (!he->msg[0])
    snprintf(he->msg, sizeof he->msg, "no HDF5 error detail");
  return he->msg;
}

/* Maps the file type onto a beam dtype and the memory type to read it with.
 * *mem is a type the caller closes. */
static int pick_type(hid_t ftype, beam_dtype_t *dt, hid_t *mem) {
  H5T_class_t cls = H5Tget_class(ftype);
  hid_t base = -1, orig = ftype;
  int is_enum = cls == H5T_ENUM;
  if (is_enum) {
    /* h5py stores bool as an enum over int8. HDF5 has no enum -> integer
     * conversion, so it is read as a native enum and its bytes are taken as
     * the base integer. */
    base = H5Tget_super(ftype);
    if (base < 0)
      return -1;
    ftype = base;
    cls = H5Tget_class(ftype);
  }
  int rc = 0;
  if (cls == H5T_INTEGER) {
    size_t sz = H5Tget_size(ftype);
    int sgn = H5Tget_sign(ftype) == H5T_SGN_2;
    switch (sz) {
    case 1: *dt = sgn ? BEAM_DT_I8 : BEAM_DT_U8; *mem = sgn ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8; break;
    case 2: *dt = sgn ? BEAM_DT_I16 : BEAM_DT_U16; *mem = sgn ? H5T_NATIVE_INT16 : H5T_NATIVE_UINT16; break;
    case 4: *dt = sgn ? BEAM_DT_I32 : BEAM_DT_U32; *mem = sgn ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT32; break;
    case 8: *dt = sgn ? BEAM_DT_I64 : BEAM_DT_U64; *mem = sgn ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64; break;
    default: rc = -1;
    }
  } else if (cls == H5T_FLOAT) {
    size_t sz = H5Tget_size(ftype);
    /* float16 and other short floats widen to float32; long double narrows to float64. */
    if (sz <= 4) {
      *dt = BEAM_DT_F32;
      *mem = H5T_NATIVE_FLOAT;
    } else {
      *dt = BEAM_DT_F64;
      *mem = H5T_NATIVE_DOUBLE;
    }
  } else {
    rc = -1;
  }
  if (rc == 0)
    *mem = is_enum ? H5Tget_native_type(orig, H5T_DIR_ASCEND) : H5Tcopy(*mem);
  if (base >= 0)
    H5Tclose(base);
  return rc == 0 && *mem >= 0 ? 0 : -1;
}

static int load(const char *path, const char *dataset, beam_array_t *out, beam_diag_t *d) {
  h5err_t he;
  hid_t f = -1, ds = -1, sp = -1, ft = -1, mt = -1;
  int rc = 0;
  f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    rc = BEAM_DIAG(d, BEAM_EIO, "%s: cannot open as HDF5: %s", path, h5_reason(&he));
    goto out;
  }
  ds = H5Dopen2(f, dataset, H5P_DEFAULT);
  if (ds < 0) {
    rc = BEAM_DIAG(d, BEAM_EIO, "%s: cannot open dataset \"%s\": %s", path, dataset, h5_reason(&he));
    goto out;
  }
  sp = H5Dget_space(ds);
  ft = H5Dget_type(ds);
  if (sp < 0 || ft < 0) {
    rc = BEAM_DIAG(d, BEAM_EIO, "%s:%s: cannot read dataspace or type: %s", path, dataset, h5_reason(&he));
    goto out;
  }
  int nd = H5Sget_simple_extent_ndims(sp);
  if (nd < 1 || nd > BEAM_MAX_NDIM) {
    rc = BEAM_DIAG(d, BEAM_ENOTSUP, "%s:%s: has %d dimensions, 1..%d are supported", path, dataset,
                   nd, BEAM_MAX_NDIM);
    goto out;
  }
  hsize_t dims[BEAM_MAX_NDIM];
  H5Sget_simple_extent_dims(sp, dims, NULL);
  if (pick_type(ft, &out->dtype, &mt) < 0) {
    H5Eclear2(H5E_DEFAULT);
    rc = BEAM_DIAG(d, BEAM_ENOTSUP, "%s:%s: element type is not an integer or float (strings and compounds are not supported)",
                   path, dataset);
    goto out;
  }
  uint64_t bytes = beam_dtype_size(out->dtype);
  for (int i = 0; i < nd; i++) {
    if (dims[i] == 0) {
      rc = BEAM_DIAG(d, BEAM_EPROTO, "%s:%s: dataset is empty", path, dataset);
      goto out;
    }
    if (dims[i] > UINT32_MAX || bytes > BEAM_ARRAY_MAX_BYTES / dims[i]) {
      rc = BEAM_DIAG(d, BEAM_ELIMIT, "%s:%s: dataset larger than %llu bytes", path, dataset,
                     (unsigned long long)BEAM_ARRAY_MAX_BYTES);
      goto out;
    }
    bytes *= dims[i];
    out->shape[i] = (uint32_t)dims[i];
  }
  out->ndim = (uint32_t)nd;
  out->nbytes = (size_t)bytes;
  out->data = malloc(out->nbytes);
  if (!out->data) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "%s:%s: cannot allocate %zu bytes", path, dataset, out->nbytes);
    goto out;
  }
  if (H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->data) < 0)
    rc = BEAM_DIAG(d, BEAM_EIO, "%s:%s: read failed: %s", path, dataset, h5_reason(&he));
out:
  if (mt >= 0) H5Tclose(mt);
  if (ft >= 0) H5Tclose(ft);
  if (sp >= 0) H5Sclose(sp);
  if (ds >= 0) H5Dclose(ds);
  if (f >= 0) H5Fclose(f);
  return rc;
}

int beam_h5array_load(const char *path, const char *dataset, beam_array_t *out, beam_diag_t *d) {
  memset(out, 0, sizeof *out);
  if (!dataset || !*dataset)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: no dataset path given", path);
  H5E_auto2_t old_fn = NULL;
  void *old_data = NULL;
  H5Eget_auto2(H5E_DEFAULT, &old_fn, &old_data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  int rc = load(path, dataset, out, d);
  H5Eset_auto2(H5E_DEFAULT, old_fn, old_data);
  if (rc < 0)
    beam_array_free(out);
  return rc;
}

void beam_h5array_register(void) { beam_array_set_h5_loader(beam_h5array_load); }
