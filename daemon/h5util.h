/* Small HDF5 helpers shared by the writers (the `record` stage in
 * daemon/stage_record.c and the beamd-record tool): HDF5 error stacks turned
 * into one clear message, beam dtypes mapped onto HDF5 file types, and
 * attributes written the way h5py reads them back naturally (variable-length
 * UTF-8 strings, numpy-bool enums, JSON metadata flattened into attributes).
 *
 * It also holds the few readers the HDF5 tools (beamd-replay, beamd-ptycho,
 * beamd-sim) share: path tests, picking the frames dataset, complex arrays.
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

/* A 1-D float64 attribute of n values (a scalar one when n is 1). */
int beam_h5_attr_f64s(hid_t obj, const char *name, const double *v, size_t n);

/* Creates group `path` under loc with an NX_class attribute (none when
 * nx_class is NULL). Returns the open group, or -1. */
hid_t beam_h5_group(hid_t loc, const char *path, const char *nx_class);

/* Creates dataset `path` of file type ft (scalar when nd is 0), writes data
 * from memory type mt and, when units is not NULL, a "units" attribute.
 * Returns the open dataset, or -1 (nothing is left open). */
hid_t beam_h5_dataset(hid_t loc, const char *path, hid_t ft, hid_t mt, int nd,
                      const hsize_t *dims, const void *data, const char *units);

/* A scalar float64 dataset with a "units" attribute (none when NULL),
 * closed again. Returns 0 or -1. */
int beam_h5_scalar_f64(hid_t loc, const char *path, double v, const char *units);

/* ---- readers ---- */

/* Stored size of the chunk of dset at `off` (the coordinates of its first
 * element): 1 with *n set, 0 when the chunk was never written, -1 with the
 * HDF5 reason in why (may be NULL). Leaves the error stack clear.
 *
 * HDF5 1.10's H5Dget_chunk_info_by_coord walks the chunk index from the
 * start until it meets the chunk, so it costs time in proportion to the
 * chunk's position (12 us at frame 2,000 and 170 us at frame 16,000 here);
 * H5Dget_chunk_storage_size looks it up in the index (about 1 us anywhere)
 * but fails alike for a chunk never written and for a broken index, so the
 * walk is left for those. */
int beam_h5_chunk_size(hid_t dset, const hsize_t *off, hsize_t *n, char *why, size_t wl);

/* Writes rows row0 .. row0+k-1 of the extendible dataset ds, growing it to
 * (row0 + k, *ext), from buf of k rows of shape (ndim 0: a 1-D dataset of
 * scalars); where shape is smaller than ext the rest of each row keeps the
 * fill value. -1 with HDF5's error stack kept (it says why). */
int beam_h5_append_rows(hid_t ds, uint64_t row0, uint64_t k, hid_t memtype, const void *buf,
                        unsigned ndim, const hsize_t *ext, const uint32_t *shape);

/* Whether `path` names a link under loc. H5Lexists fails (rather than
 * answering 0) when an intermediate group is missing, so each parent is
 * tested in turn. Leaves the error stack clear. */
int beam_h5_exists(hid_t loc, const char *path);

/* Splits "FILE[:/dataset]" in place: returns the dataset part (after the
 * last ':' that is followed by '/') and cuts spec there, or NULL. */
const char *beam_h5_split_spec(char *spec);

/* How a dataset's values read as complex numbers: 2 for a two-member
 * compound (h5py's complex {r, i}), 1 for integers or floats (real values),
 * 0 for anything else. */
int beam_h5_cplx_kind(hid_t ds);

/* Reads all of ds (beam_h5_cplx_kind > 0) as interleaved (re, im) doubles
 * into out, 2 x npoints values; real values get im = 0. Returns 0, or -1
 * with the reason on the HDF5 error stack. */
int beam_h5_read_cplx(hid_t ds, double *out);

/* The datasets of a file, for picking the frames when nothing names them. */
typedef struct beam_h5_dsets_s {
  const char *skip; /* in: a path prefix (no leading '/') to leave out, or NULL */
  char first3d[512]; /* out: "/path" of the first 3-D dataset in name order */
  int n3d, n;        /* out: 3-D datasets, all datasets */
  char list[1024];   /* out: "name (shape)" of the first 12, comma separated */
} beam_h5_dsets_t;
void beam_h5_find_dsets(hid_t f, beam_h5_dsets_t *r);

/* Names ("data_NNNNNN") of the /entry/data/data_ + six digits links, as
 * Eiger and NXmx masters name their data files, in name order. *names is
 * NULL and *n 0 when there are none; free with beam_h5_names_free. Out of
 * memory stops the listing early (the names so far are kept). */
void beam_h5_data_links(hid_t f, char ***names, size_t *n);
void beam_h5_names_free(char **names, size_t n);

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
