/* The fitter's kernels for the two-frequency damped cosine dcos2 (P = 9, the slowest to compile) (gpu/fit_kern.cuh):
 * one translation unit per model family so that nvcc builds them in
 * parallel; gpu/fit_cuda.cu calls beam__fit_family_dcos2. */
#include "gpu/fit_kern.cuh"

FIT_FAMILY_FN(dcos2) {
  switch (model) {
    FIT_FAMILY_CASE(BEAM_FIT_DCOS2)
  default:
    return -1;
  }
}
