/* CUDA device discovery, pinned host memory and the per-stage context
 * (device + stream) the CUDA backends share. Built only with CUDA=1;
 * gpu/stubs.c stands in for it otherwise.
 *
 * Detection never fails loudly but always says why it found nothing
 * (driver missing, no device, CUDA_VISIBLE_DEVICES empty), because a GPU
 * node that silently runs on CPU is the failure nobody notices. */
#include "gpu/cuda_int.h"

#include <stdio.h>
#include <string.h>

extern "C" int beam_gpu_built(void) { return 1; }

extern "C" int beam_gpu_count(char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky-free error so later calls are not confused */
    if (why && why_len)
      snprintf(why, why_len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
  }
  if (n == 0 && why && why_len)
    snprintf(why, why_len, "no CUDA device visible (check CUDA_VISIBLE_DEVICES and the driver)");
  return n;
}

extern "C" void beam_gpu_describe(char *buf, size_t len) {
  char why[256] = "";
  int n = beam_gpu_count(why, sizeof why);
  if (n == 0) {
    snprintf(buf, len, "none: %s", why);
    return;
  }
  cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, 0);
  if (e != cudaSuccess) {
    snprintf(buf, len, "none: cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    return;
  }
  int o = snprintf(buf, len, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
                   (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
  if (n > 1 && o > 0 && (size_t)o < len)
    snprintf(buf + o, len - (size_t)o, " and %d more device%s", n - 1, n > 2 ? "s" : "");
}

extern "C" void *beam_host_alloc(size_t bytes, int pinned) {
  if (bytes == 0)
    bytes = 1;
  if (pinned && beam_gpu_count(NULL, 0) > 0) {
    void *p = NULL;
    /* Portable: any stage's stream on any device may copy from it. */
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      return NULL;
    }
    return p;
  }
  size_t rounded = (bytes + 63) & ~(size_t)63;
  return aligned_alloc(64, rounded);
}

extern "C" void beam_host_free(void *p, int pinned) {
  if (!p)
    return;
  if (pinned) {
    /* Pinned was asked for, but without a device the memory is ordinary:
     * ask the runtime which kind this pointer is. */
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeHost) {
      cudaFreeHost(p);
      return;
    }
    cudaGetLastError();
  }
  free(p);
}

extern "C" int beam_gpu_mem_info(int dev, size_t *free_b, size_t *total_b) {
  *free_b = *total_b = 0;
  int cur = 0;
  if (beam_gpu_count(NULL, 0) <= dev || cudaGetDevice(&cur) != cudaSuccess || cudaSetDevice(dev) != cudaSuccess) {
    cudaGetLastError();
    return BEAM_ENOTSUP;
  }
  cudaError_t e = cudaMemGetInfo(free_b, total_b);
  cudaSetDevice(cur);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *free_b = *total_b = 0;
    return BEAM_ECUDA;
  }
  return 0;
}

const char *beam__cufft_name(cufftResult r) {
  switch (r) {
  case CUFFT_SUCCESS: return "CUFFT_SUCCESS";
  case CUFFT_INVALID_PLAN: return "CUFFT_INVALID_PLAN";
  case CUFFT_ALLOC_FAILED: return "CUFFT_ALLOC_FAILED";
  case CUFFT_INVALID_TYPE: return "CUFFT_INVALID_TYPE";
  case CUFFT_INVALID_VALUE: return "CUFFT_INVALID_VALUE";
  case CUFFT_INTERNAL_ERROR: return "CUFFT_INTERNAL_ERROR";
  case CUFFT_EXEC_FAILED: return "CUFFT_EXEC_FAILED";
  case CUFFT_SETUP_FAILED: return "CUFFT_SETUP_FAILED";
  case CUFFT_INVALID_SIZE: return "CUFFT_INVALID_SIZE";
  case CUFFT_UNALIGNED_DATA: return "CUFFT_UNALIGNED_DATA";
  case CUFFT_INVALID_DEVICE: return "CUFFT_INVALID_DEVICE";
  case CUFFT_NO_WORKSPACE: return "CUFFT_NO_WORKSPACE";
  case CUFFT_NOT_IMPLEMENTED: return "CUFFT_NOT_IMPLEMENTED";
  case CUFFT_NOT_SUPPORTED: return "CUFFT_NOT_SUPPORTED";
  case CUFFT_MISSING_DEPENDENCY: return "CUFFT_MISSING_DEPENDENCY";
  case CUFFT_NVRTC_FAILURE: return "CUFFT_NVRTC_FAILURE";
  case CUFFT_NVJITLINK_FAILURE: return "CUFFT_NVJITLINK_FAILURE";
  case CUFFT_NVSHMEM_FAILURE: return "CUFFT_NVSHMEM_FAILURE";
  default: return "CUFFT_UNKNOWN_ERROR";
  }
}

int beam__cuda_ctx_init(beam_cuda_ctx_t *c, const char *kind, beam_diag_t *d) {
  c->dev = 0;
  c->stream = NULL;
  char why[256] = "";
  if (beam_gpu_count(why, sizeof why) == 0)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: backend cuda needs a CUDA device: %s", kind, why);
  BEAM_CUDA_TRY(d, cudaSetDevice(c->dev));
  BEAM_CUDA_TRY(d, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  return 0;
}

int beam__cuda_ctx_use(const beam_cuda_ctx_t *c, beam_diag_t *d) {
  BEAM_CUDA_TRY(d, cudaSetDevice(c->dev));
  return 0;
}

void beam__cuda_ctx_fini(beam_cuda_ctx_t *c) {
  if (c->stream) {
    cudaSetDevice(c->dev);
    cudaStreamSynchronize(c->stream);
    cudaStreamDestroy(c->stream);
    c->stream = NULL;
  }
}

int beam__dbuf_reserve(void **p, size_t *cap, size_t bytes, beam_diag_t *d) {
  if (bytes <= *cap && *p)
    return 0;
  beam__dbuf_free(p, cap);
  BEAM_CUDA_TRY(d, cudaMalloc(p, bytes ? bytes : 1));
  *cap = bytes;
  return 0;
}

void beam__dbuf_free(void **p, size_t *cap) {
  if (*p)
    cudaFree(*p);
  *p = NULL;
  *cap = 0;
}
