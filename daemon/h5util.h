/* Small HDF5 helpers shared by the writers (the `record` stage in
 * daemon/stage_record.c and the beamd-record tool): HDF5 error stacks turned
 * into one clear message, beam dtypes mapped onto HDF5 file types, and
 * attributes written the way h5py reads them back naturally (variable-length
 * UTF-8 strings, numpy-bool enums, JSON metadata flattened into attributes).
 *
 * Not a general HDF5 wrapper: each function does one thing the writers need.
 * HDF5 error stacks are per thread in the thread-safe library Debian ships, so
 * every thread that calls HDF5 must call beam_h5_quiet() once itself. */
#ifndef BEAM_H5UTIL_H
#define BEAM_H5UTIL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define BEAM_H5_BSLZ4_FILTER 32008 /* bitshuffle + LZ4, HDF5 registered filter id */

/* Turns automatic error-stack printing off for the calling thread. */
void beam_h5_quiet(void);

/* The most specific message of the calling thread's HDF5 error stack,
 * written to buf, then clears the stack. A system error (errno text inside
 * the driver's message, e.g. "No space left on device") is preferred over
 * HDF5's own wording because that is what an operator can act on. *errno_out
 * (may be NULL) receives the errno found in the message, or 0. */
const char *beam_h5_reason(char *buf, size_t cap, int *errno_out);

/* A new HDF5 file type for a beam dtype (complex as h5py's {r, i} compound);
 * the caller closes it. -1 for BEAM_DT_NONE or unknown codes. */
hid_t beam_h5_type(beam_dtype_t dt);

/* Attribute writers: create (or replace) attribute `name` on obj. Return 0
 * or -1 (the reason is on the HDF5 error stack). */
int beam_h5_attr_str(hid_t obj, const char *name, const char *val);
int beam_h5_attr_strn(hid_t obj, const char *name, const char *val, size_t len);
int beam_h5_attr_strs(hid_t obj, const char *name, const char *const *vals, size_t n);
int beam_h5_attr_i64(hid_t obj, const char *name, int64_t v);
int beam_h5_attr_u64(hid_t obj, const char *name, uint64_t v);
int beam_h5_attr_f64(hid_t obj, const char *name, double v);
int beam_h5_attr_bool(hid_t obj, const char *name, int v);
int beam_h5_attr_u64s(hid_t obj, const char *name, const uint64_t *v, size_t n);

/* Writes the members of a JSON object as attributes of obj:
 *   string -> string, integer -> int64, real -> float64, bool -> bool,
 *   array of numbers -> 1-D int64 or float64 array, array of strings ->
 *   string array, anything else (objects, null, mixed or nested arrays) ->
 *   its compact JSON text as a string.
 * Members whose name would collide with an attribute already written by the
 * caller are skipped when skip_existing is set. Returns the number of
 * attributes written, or -1 when json is not an object (msg says why). */
int beam_h5_attrs_from_json(hid_t obj, const char *json, size_t len, int skip_existing,
                            char *msg, size_t cap);

#endif
