/* Internal to the CUDA sources in gpu/: error macros, the per-stage CUDA context and the
 * kernels one stage borrows from another. Only .cu files include this (it
 * pulls in the CUDA headers); everything else sees gpu/gpu.h.
 *
 * Errors never exit: BEAM_CUDA_TRY / BEAM_CUFFT_TRY / BEAM_CUBLAS_TRY record
 * the failing call, the status name and its text in a beam_diag_t and make
 * the enclosing function return -BEAM_ECUDA (BEAM_ECUDA is already
 * negative). Functions using them keep every resource in the stage's priv
 * so that destroy, which the caller runs after a failed init, frees it. */
#ifndef BEAM_CUDA_INT_H
#define BEAM_CUDA_INT_H

/* pipeline/frame.h includes <stdatomic.h>, which GCC 12 does not provide
 * for C++: give it std::atomic<int>, which has the same size and alignment
 * as C's atomic_int on the platforms we build for (checked below). */
#include <atomic>
using std::atomic_int;

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The C headers declare C linkage themselves (extern "C" under
 * __cplusplus), so nvcc's C++ sees the C symbols. */
#include "proto/err.h"
#include "proto/proto.h"
#include "pipeline/cfg.h"
#include "pipeline/frame.h"
#include "pipeline/stage.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cufft.h>

#include "gpu/gpu.h"
#include "pipeline/kern/bin.h"
#include "pipeline/kern/kern_int.h"

static_assert(sizeof(std::atomic<int>) == sizeof(int) && alignof(std::atomic<int>) == alignof(int),
              "beam_frame_t layout would differ between C and CUDA translation units");

#define BEAM_CUDA_TRY(d, call)                                                          \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess)                                                              \
      return beam_diag_set((d), BEAM_ECUDA, __FILE__, __LINE__, "%s: %s (%s)", #call,   \
                           cudaGetErrorName(e_), cudaGetErrorString(e_));               \
  } while (0)

#define BEAM_CUFFT_TRY(d, call)                                                         \
  do {                                                                                  \
    cufftResult e_ = (call);                                                            \
    if (e_ != CUFFT_SUCCESS)                                                            \
      return beam_diag_set((d), BEAM_ECUDA, __FILE__, __LINE__, "%s: %s", #call,        \
                           beam__cufft_name(e_));                                       \
  } while (0)

#define BEAM_CUBLAS_TRY(d, call)                                                        \
  do {                                                                                  \
    cublasStatus_t e_ = (call);                                                         \
    if (e_ != CUBLAS_STATUS_SUCCESS)                                                    \
      return beam_diag_set((d), BEAM_ECUDA, __FILE__, __LINE__, "%s: %s (%s)", #call,   \
                           cublasGetStatusName(e_), cublasGetStatusString(e_));         \
  } while (0)

/* A kernel launch: checks the launch itself (configuration errors);
 * execution errors surface at the next synchronising call. */
#define BEAM_CUDA_LAUNCHED(d, what)                                                     \
  do {                                                                                  \
    cudaError_t e_ = cudaGetLastError();                                                \
    if (e_ != cudaSuccess)                                                              \
      return beam_diag_set((d), BEAM_ECUDA, __FILE__, __LINE__, "launch of %s: %s (%s)", \
                           (what), cudaGetErrorName(e_), cudaGetErrorString(e_));       \
  } while (0)

const char *beam__cufft_name(cufftResult r);

/* The device and stream of one stage instance. */
typedef struct beam_cuda_ctx_s {
  int dev;
  cudaStream_t stream; /* NULL until created */
} beam_cuda_ctx_t;

/* Picks device 0 (fails with BEAM_ENOTSUP and the reason when there is
 * none) and creates a non-blocking stream. `kind` prefixes messages. */
int beam__cuda_ctx_init(beam_cuda_ctx_t *c, const char *kind, beam_diag_t *d);
/* Makes c->dev current on the calling thread (workers are not the thread
 * that ran init). */
int beam__cuda_ctx_use(const beam_cuda_ctx_t *c, beam_diag_t *d);
void beam__cuda_ctx_fini(beam_cuda_ctx_t *c);

/* Device buffer that only grows: *p holds *cap bytes. */
int beam__dbuf_reserve(void **p, size_t *cap, size_t bytes, beam_diag_t *d);
void beam__dbuf_free(void **p, size_t *cap);

/* Block sum/mean of bin.h on the device (gpu/bin_cuda.cu; preview uses it
 * too). d_in holds the whole in_h x in_w frame; enqueued on `stream`. */
int beam__cuda_bin2d(const beam_bin_geom_t *g, const void *d_in, float *d_out, cudaStream_t stream,
                     beam_diag_t *d);

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned beam__grid_for(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  return (unsigned)(b == 0 ? 1 : b > 65535u * 16 ? 65535u * 16 : b);
}

#endif
