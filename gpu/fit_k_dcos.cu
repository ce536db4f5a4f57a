/* The fitter's kernels for damped cosines dcos and dcos_t0 (gpu/fit_kern.cuh):
 * one translation unit per model family so that nvcc builds them in
 * parallel; gpu/fit_cuda.cu calls beam__fit_family_dcos. */
#include "gpu/fit_kern.cuh"

FIT_FAMILY_FN(dcos) {
  switch (model) {
    FIT_FAMILY_CASE(BEAM_FIT_DCOS)
    FIT_FAMILY_CASE(BEAM_FIT_DCOS_T0)
  default:
    return -1;
  }
}
