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

/* The automatic starts (INIT_AUTO) beam_fit_cuda would fit from, into
 * p0 (n_fits x n_params, host memory): made on the device (host = 0,
 * gpu/fit_init_cuda.cuh) or by fit_init.c on the host (host = 1, what
 * beam_fit_cpu_range starts from). For the cross-check of the two, and
 * for tools that want a start without a fit. Nonlinear models only
 * (BEAM_EINVAL for poly or INIT_GIVEN); BEAM_ENOTSUP without CUDA. */
struct beam_fit_cuda_s;
/* beam_fit_cuda_create on device dev (0 .. beam_gpu_count() - 1): one
 * context per device, e.g. dev = local MPI rank mod devices. */
int beam_fit_cuda_create_dev(struct beam_fit_cuda_s **c, int dev, beam_diag_t *d);
struct beam_fit_batch_s;
struct beam_fit_opts_s;
int beam_fit_cuda_starts(struct beam_fit_cuda_s *c, const struct beam_fit_batch_s *b,
                         const uint16_t *y16, const struct beam_fit_opts_s *o, int host,
                         double *p0, beam_diag_t *d);

#ifdef __cplusplus
}
#endif
#endif
