/* The fitter's kernels for the peaks gauss and lorentz (gpu/fit_kern.cuh):
 * one translation unit per model family so that nvcc builds them in
 * parallel; gpu/fit_cuda.cu calls beam__fit_family_peak. */
#include "gpu/fit_kern.cuh"

FIT_FAMILY_FN(peak) {
  switch (model) {
    FIT_FAMILY_CASE(BEAM_FIT_GAUSS)
    FIT_FAMILY_CASE(BEAM_FIT_LORENTZ)
  default:
    return -1;
  }
}
