/* NXmx geometry read from an HDF5 file, in SI (eV for energy): the fields
 * and fallbacks docs/replay.md and docs/ptycho.md list (energy, detector
 * distance, pixel size, beam centre, scan positions), each converted with
 * its dataset's "units" attribute. Used by beamd-replay (where a bad field
 * is a warning and is left out) and beamd-ptycho (where it is an error), so
 * what a bad field means is the caller's: readers report it through a
 * callback and go on or stop as that says. */
#ifndef BEAM_NXMX_H
#define BEAM_NXMX_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

#define BEAM_NX_DET "/entry/instrument/detector/"
#define BEAM_NX_BEAM "/entry/instrument/beam/"
#define BEAM_NX_POSITIONS "/entry/sample/positions"
#define BEAM_NX_HC_EV_M 1.239841984332e-6 /* h*c in eV*m: E[eV] = HC / lambda[m] */

typedef enum { BEAM_NX_LENGTH, BEAM_NX_TIME, BEAM_NX_ENERGY, BEAM_NX_PIXELS } beam_nx_kind_t;

/* Problems with a field that exists (returned by the readers, passed to
 * the callback). */
#define BEAM_NX_EUNITS (-1) /* its units are not ones of its kind */
#define BEAM_NX_EVALUE (-2) /* not a finite number (or not numeric, or empty) */

/* Multiplier from `units` to the SI unit of kind k (eV for energy); dflt
 * for empty units (the field's NXmx default), 0 when unknown. */
double beam_nx_unit_scale(beam_nx_kind_t k, const char *units, double dflt);

/* The "units" attribute of obj into buf (fixed or variable length string);
 * "" and -1 when absent or not a string. Leaves the error stack clear. */
int beam_nx_units(hid_t obj, char *buf, size_t len);

/* Called for a field that exists but is unusable: code is BEAM_NX_EUNITS or
 * BEAM_NX_EVALUE, units what the file says. Return 0 to treat the field as
 * absent and go on, or a negative code to stop reading with it. */
typedef int (*beam_nx_bad_cb)(void *ctx, const char *path, int code, const char *units);

/* First element of numeric dataset `path`, in SI. Returns 1 (value in
 * *out), 0 absent (or bad, when cb returned 0), or cb's negative code. */
int beam_nx_get(hid_t f, const char *path, beam_nx_kind_t k, double dflt, double *out,
                beam_nx_bad_cb cb, void *ctx);

/* Photon energy [eV]: beam/incident_energy, detectorSpecific/photon_energy,
 * else from beam/incident_wavelength (default units angstrom) when > 0.
 * Returns as beam_nx_get. */
int beam_nx_energy(hid_t f, double *ev, beam_nx_bad_cb cb, void *ctx);

/* Sample-detector distance [m]: detector/detector_distance, else
 * detector/distance. Returns as beam_nx_get. */
int beam_nx_distance(hid_t f, double *m, beam_nx_bad_cb cb, void *ctx);

/* /entry/sample/positions: (N, 2|3) x, y[, z] with a length unit (m when
 * none). The checks run in this order, and the first that fails is the
 * result: shape, count (N must equal nframes, or be at least nframes when
 * at_least is set), units, memory, read. A read failure's reason is taken
 * from the HDF5 error stack by `reason` (may be NULL) into p->why. */
typedef struct beam_nx_pos_s {
  double *xyz;    /* N x cols values in metres (caller frees) */
  uint64_t n;     /* N */
  int rank;       /* rank of the dataset */
  unsigned cols;  /* 2 or 3 */
  char units[32]; /* as the file says ("" when none) */
  char why[256];  /* BEAM_NX_POS_READ: the reason, from `reason` when given */
} beam_nx_pos_t;

typedef enum {
  BEAM_NX_POS_OK = 0,
  BEAM_NX_POS_ABSENT,
  BEAM_NX_POS_OPEN,  /* exists but cannot be opened */
  BEAM_NX_POS_SHAPE, /* not (N, 2|3) */
  BEAM_NX_POS_COUNT, /* N does not fit nframes */
  BEAM_NX_POS_UNITS, /* unknown length units */
  BEAM_NX_POS_NOMEM,
  BEAM_NX_POS_READ, /* the reason is left on the HDF5 error stack */
} beam_nx_pos_rc_t;

beam_nx_pos_rc_t beam_nx_positions(hid_t f, uint64_t nframes, int at_least, beam_nx_pos_t *p,
                                   const char *(*reason)(char *buf, size_t len));

#endif
