/* The device services and CUDA stage backends the pipeline uses, declared
 * here so pipeline/ depends on nothing above it; gpu/ defines them (the
 * CUDA build) and so does gpu/stubs.c (the CPU-only build: no device, host
 * memory is ordinary memory, and every CUDA ops table's init fails with
 * BEAM_ENOTSUP and a message saying the build has no CUDA). Plain C, no
 * CUDA types. */
#ifndef BEAM_DEVICE_H
#define BEAM_DEVICE_H

#include <stddef.h>

#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this binary was built with CUDA. */
int beam_gpu_built(void);
/* Number of usable CUDA devices (0 without CUDA or without a device); never
 * fails loudly: the reason for 0 is written to why (may be NULL). */
int beam_gpu_count(char *why, size_t why_len);
/* "NVIDIA H200 (sm_90, 139 GiB)" or "none: <reason>". */
void beam_gpu_describe(char *buf, size_t len);

/* Page-locked host memory when pinned and a device is present, else
 * 64-byte aligned ordinary memory. Free with the same pinned value. */
void *beam_host_alloc(size_t bytes, int pinned);
void beam_host_free(void *p, int pinned);

/* Free and total memory of device dev (cudaMemGetInfo): 0, or < 0 with
 * no device / no CUDA (both set to 0 then). */
int beam_gpu_mem_info(int dev, size_t *free_b, size_t *total_b);

/* CUDA backends of the stage kinds (stubs without CUDA). */
extern const beam_stage_ops_t beam_correct_cuda_ops;
extern const beam_stage_ops_t beam_roi_sum_cuda_ops;
extern const beam_stage_ops_t beam_bin_cuda_ops;
extern const beam_stage_ops_t beam_preview_cuda_ops;
extern const beam_stage_ops_t beam_xpcs_multitau_cuda_ops;
extern const beam_stage_ops_t beam_xpcs_twotime_cuda_ops;
extern const beam_stage_ops_t beam_pca_cuda_ops;
extern const beam_stage_ops_t beam_ptycho_dm_cuda_ops;
extern const beam_stage_ops_t beam_fit_cuda_ops;
extern const beam_stage_ops_t beam_com_cuda_ops;
extern const beam_stage_ops_t beam_azint_cuda_ops;

#ifdef __cplusplus
}
#endif
#endif
