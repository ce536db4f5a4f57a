/* Small n-d arrays loaded from files at stage init: darks, flats, masks,
 * label images, weight stacks.
 *
 * .npy files are read here (little-endian, C order, numeric dtypes). Every
 * other file goes to an HDF5 loader that the daemon registers at start-up
 * (daemon/h5array.c), because pipeline/ may not include hdf5.h. Not for
 * frames: frames arrive over the wire and live in pools (frame.h). */
#ifndef BEAM_ARRAY_H
#define BEAM_ARRAY_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest array a loader accepts (bytes); masks and darks are far smaller. */
#define BEAM_ARRAY_MAX_BYTES ((uint64_t)4 << 30)

typedef struct beam_array_s {
  beam_dtype_t dtype;
  uint32_t ndim;                  /* 1..BEAM_MAX_NDIM */
  uint32_t shape[BEAM_MAX_NDIM];  /* C order, slowest first; unused dims 0 */
  size_t nbytes;                  /* elems x dtype size */
  void *data;                     /* malloc'd, owned by the array */
} beam_array_t;

/* Loads `path` into *out (which is overwritten; free it with
 * beam_array_free). A file starting with the .npy magic is parsed here and
 * `dataset` is ignored; anything else is handed to the registered HDF5
 * loader with `dataset` (e.g. "/data"). Returns 0, or BEAM_EIO (cannot
 * open/read), BEAM_EPROTO (malformed file), BEAM_ENOTSUP (big-endian,
 * Fortran order, non-numeric dtype, no HDF5 loader), BEAM_ELIMIT (too
 * large), BEAM_ENOMEM; d names the file and the problem. On failure *out is
 * empty (data NULL). */
int beam_array_load(const char *path, const char *dataset, beam_array_t *out, beam_diag_t *d);

/* Frees the data and zeroes the array; NULL-safe and idempotent. */
void beam_array_free(beam_array_t *a);

size_t beam_array_elems(const beam_array_t *a);

/* Element i as a double (exact for every dtype except 64-bit integers above
 * 2^53; complex dtypes give the real part). Init-time use only: it
 * switches on the dtype per call. */
double beam_array_get(const beam_array_t *a, size_t i);
/* The same for element i of any buffer of dtype dt (NaN for a dtype
 * without values): the one such switch, for reference loops and set-up,
 * not for per-pixel hot paths. */
double beam_elem_get(const void *data, beam_dtype_t dt, size_t i);

/* "[3, 512, 512]" into buf (for messages); returns buf. */
const char *beam_shape_str(uint32_t ndim, const uint32_t *shape, char *buf, size_t len);

/* The HDF5 side: same contract as beam_array_load for one file. */
typedef int (*beam_h5_loader_fn)(const char *path, const char *dataset, beam_array_t *out,
                                 beam_diag_t *d);
/* Registers (or, with NULL, removes) the HDF5 loader. Call before any stage
 * init; the pointer is read without a lock. */
void beam_array_set_h5_loader(beam_h5_loader_fn fn);

#ifdef __cplusplus
}
#endif
#endif
