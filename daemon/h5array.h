/* The HDF5 half of the array loader (pipeline/array.h): pipeline/ cannot
 * include hdf5.h, so the daemon (and the tests) register this one. */
#ifndef BEAM_H5ARRAY_H
#define BEAM_H5ARRAY_H

#include "pipeline/array.h"

/* Reads dataset `dataset` of HDF5 file `path` into *out: any integer, float
 * or enum (h5py bool) type, converted to the closest beam dtype (float16 ->
 * float32). Errors name the file and dataset and carry the innermost HDF5
 * error message; the HDF5 error stack is never printed. */
int beam_h5array_load(const char *path, const char *dataset, beam_array_t *out, beam_diag_t *d);

/* beam_array_set_h5_loader(beam_h5array_load). */
void beam_h5array_register(void);

#endif
