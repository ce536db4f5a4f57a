/* .npy writer shared by the daemon and the tools (beamd-sub saves received
 * arrays, beamd-sim writes its XPCS ring label image).
 *
 * Writes numpy format 1.0 (NEP 1), little-endian, C order, for the wire
 * dtypes of proto/proto.h. It is not a reader and does not handle
 * structured dtypes or Fortran order.
 */
#ifndef BEAMD_NPY_WRITE_H
#define BEAMD_NPY_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"
#include "proto/proto.h"

#define BEAM_NPY_MAX_NDIM 8

/* Writes `nbytes` bytes of `data` (the array, C order, host byte order,
 * which is little-endian on every platform beamd builds for) as an .npy
 * file at `path` with dtype `dt` and shape shape[0..ndim-1]; the file is
 * created or truncated. nbytes must equal the product of the shape times
 * the dtype size. Borrows everything. Returns 0, BEAM_EINVAL (dtype with no
 * .npy form, ndim over BEAM_NPY_MAX_NDIM, size mismatch) or BEAM_EIO, with
 * the path in d. */
int beam_npy_write(const char *path, beam_dtype_t dt, unsigned ndim,
                   const uint32_t *shape, const void *data, size_t nbytes,
                   beam_diag_t *d);

#endif
