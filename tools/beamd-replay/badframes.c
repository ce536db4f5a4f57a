/* beamd-replay: frames to serve flagged BAD (PROTOCOL.md flag 0), from a
 * list on the command line (--bad-frames 3,7,10-20) and/or a dataset of
 * the file (--bad-dataset /entry/data/bad: one number per file frame,
 * nonzero = bad, as a detector's per-frame quality flag). Indices are
 * dataset indices, as --first/--last and the frame ids of a replay are.
 * Stages treat a BAD frame as absent: XPCS skips its pairs, the fit and
 * ptychography stages leave it out. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"
#include "tools/beamd-replay/replay.h"

static int parse_list(const char *list, uint8_t *bad, uint64_t n, beam_diag_t *d) {
  const char *p = list;
  while (*p) {
    char *e;
    errno = 0;
    unsigned long long a = strtoull(p, &e, 10), b = a;
    if (e == p || errno)
      return BEAM_DIAG(d, BEAM_EINVAL, "--bad-frames %s: expected frame indices like 3,7,10-20 "
                       "at \"%s\"", list, p);
    if (*e == '-') {
      const char *q = e + 1;
      b = strtoull(q, &e, 10);
      if (e == q || errno || b < a)
        return BEAM_DIAG(d, BEAM_EINVAL, "--bad-frames %s: a range is FIRST-LAST with FIRST <= "
                         "LAST, at \"%s\"", list, p);
    }
    if (b >= n)
      return BEAM_DIAG(d, BEAM_EINVAL, "--bad-frames %s: frame %llu is past the file's last "
                       "frame %llu", list, b, (unsigned long long)(n - 1));
    for (unsigned long long k = a; k <= b; k++)
      bad[k] = 1;
    if (*e == ',')
      e++;
    else if (*e)
      return BEAM_DIAG(d, BEAM_EINVAL, "--bad-frames %s: expected ',' at \"%s\"", list, e);
    p = e;
  }
  return 0;
}

static int read_dataset(rp_src_t *s, const char *path, uint8_t *bad, beam_diag_t *d) {
  char why[512];
  if (!beam_h5_exists(s->file, path))
    return BEAM_DIAG(d, BEAM_EINVAL, "--bad-dataset: file %s dataset %s: no such dataset",
                     s->path, path);
  hid_t ds = H5Dopen2(s->file, path, H5P_DEFAULT);
  if (ds < 0)
    return BEAM_DIAG(d, BEAM_EIO, "--bad-dataset: file %s dataset %s: cannot open: %s", s->path,
                     path, rp_h5_reason(why, sizeof why));
  hid_t sp = H5Dget_space(ds), t = H5Dget_type(ds);
  H5T_class_t cls = H5Tget_class(t);
  hsize_t dims[1] = {0};
  int ok = H5Sget_simple_extent_ndims(sp) == 1 && H5Sget_simple_extent_dims(sp, dims, NULL) == 1;
  int rc = 0;
  if (!ok || (cls != H5T_INTEGER && cls != H5T_FLOAT && cls != H5T_ENUM)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "--bad-dataset: file %s dataset %s: expected a 1-D numeric "
                   "(or h5py bool) dataset, one value per frame", s->path, path);
  } else if (dims[0] != s->nframes) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "--bad-dataset: file %s dataset %s: %llu values for %llu "
                   "frames", s->path, path, (unsigned long long)dims[0],
                   (unsigned long long)s->nframes);
  } else {
    double *v = malloc((size_t)dims[0] * sizeof *v);
    /* HDF5 has no enum -> number conversion: h5py's bool (an enum over
     * int8) is read as a native enum of one byte per value. */
    hid_t mt = cls == H5T_ENUM ? H5Tget_native_type(t, H5T_DIR_ASCEND) : H5Tcopy(H5T_NATIVE_DOUBLE);
    int small = cls == H5T_ENUM && H5Tget_size(mt) == 1;
    if (!v)
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "--bad-dataset: out of memory");
    else if (cls == H5T_ENUM && !small)
      rc = BEAM_DIAG(d, BEAM_EINVAL, "--bad-dataset: file %s dataset %s: an enum other than "
                     "h5py's bool", s->path, path);
    else if (H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
      rc = BEAM_DIAG(d, BEAM_EIO, "--bad-dataset: file %s dataset %s: cannot read: %s", s->path,
                     path, rp_h5_reason(why, sizeof why));
    for (hsize_t i = 0; rc == 0 && i < dims[0]; i++)
      bad[i] |= small ? ((const uint8_t *)v)[i] != 0 : v[i] != 0; /* NaN counts as bad */
    H5Tclose(mt);
    free(v);
  }
  H5Tclose(t);
  H5Sclose(sp);
  H5Dclose(ds);
  return rc;
}

int rp_bad_frames(rp_src_t *s, const char *list, const char *dataset, uint8_t **out,
                  uint64_t *nbad, beam_diag_t *d) {
  *out = NULL;
  *nbad = 0;
  if (!list && !dataset)
    return 0;
  uint8_t *bad = calloc(s->nframes ? s->nframes : 1, 1);
  if (!bad)
    return BEAM_DIAG(d, BEAM_ENOMEM, "bad-frame table");
  int rc = list ? parse_list(list, bad, s->nframes, d) : 0;
  if (rc == 0 && dataset)
    rc = read_dataset(s, dataset, bad, d);
  if (rc < 0) {
    free(bad);
    return rc;
  }
  for (uint64_t i = 0; i < s->nframes; i++)
    *nbad += bad[i];
  *out = bad;
  return 0;
}
