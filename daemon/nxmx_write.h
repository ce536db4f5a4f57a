/* The NXmx part of a file the record stage writes: the detector metadata
 * of the series, with units, where an NXmx reader looks for it, so that
 * beamd-replay of beamd's own recording hands the daemon the same series
 * metadata a replay of the detector's file would (daemon/nxmx.c and
 * tools/beamd-replay/h5meta.c read exactly these paths; docs/recording.md
 * lists them). */
#ifndef BEAM_NXMX_WRITE_H
#define BEAM_NXMX_WRITE_H

#include <hdf5.h>

#include "pipeline/frame.h"

/* Under /entry of `file` (which must exist): definition "NXmx";
 * instrument (NXinstrument) / detector (NXdetector): description,
 * detector_distance [m], x_pixel_size, y_pixel_size [m], beam_center_x,
 * beam_center_y [pixel], count_time, frame_time [s], pixel_mask (uint32,
 * nonzero = bad), saturation_value, bit_depth_readout, data (a hard link
 * to /entry/data/data, when that exists); instrument / beam
 * (NXbeam): incident_energy [eV] and incident_wavelength [angstrom]. Each
 * field only when the series says it (metadata keys of PROTOCOL.md 7.1,
 * the "pixel_mask" series array, DECTRIS' own keys under "dectris"); an
 * unknown value is left out, never written as 0. dtype: the frames', for
 * bit_depth_readout when the detector did not say. Returns 0, or -1 with
 * the reason on the HDF5 error stack. */
int beam_nx_write_series(hid_t file, const beam_series_t *series, beam_dtype_t dtype);

#endif
