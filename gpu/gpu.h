/* The C face of the CUDA side beyond what pipeline/device.h declares for
 * the pipeline (device services, the stage kinds' CUDA ops): the engine
 * entry points tools and benchmarks call. Plain C (no CUDA types); in a
 * CPU-only build gpu/stubs.c provides the same symbols. */
#ifndef BEAM_GPU_H
#define BEAM_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"
#include "pipeline/device.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The FFT floor of the DM engine's CUDA backend (gpu/dm_cuda.cu): seconds
 * per iteration of only its forward + inverse batched FFTs over nviews
 * views with conf c's shape, batching and precision (mean of iters
 * iterations after one warm-up). BEAM_ENOTSUP without CUDA or device. */
struct beam_dm_conf_s;
int beam_dm_cuda_fft_seconds(const struct beam_dm_conf_s *c, uint32_t nviews, int iters,
                             double *sec_per_iter, beam_diag_t *d);

#ifdef __cplusplus
}
#endif
#endif
