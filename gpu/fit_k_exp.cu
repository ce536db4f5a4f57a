/* The fitter's kernels for the g2 decays exp, stretch, stretch_xt, exp2 (gpu/fit_kern.cuh):
 * one translation unit per model family so that nvcc builds them in
 * parallel; gpu/fit_cuda.cu calls beam__fit_family_exp. */
#include "gpu/fit_kern.cuh"

FIT_FAMILY_FN(exp) {
  switch (model) {
    FIT_FAMILY_CASE(BEAM_FIT_EXP)
    FIT_FAMILY_CASE(BEAM_FIT_STRETCH)
    FIT_FAMILY_CASE(BEAM_FIT_STRETCH_XT)
    FIT_FAMILY_CASE(BEAM_FIT_EXP2)
  default:
    return -1;
  }
}
