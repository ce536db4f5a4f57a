/* The CUDA side of a CPU-only build (CUDA=0): the same symbols as the .cu files
 * so everything links, with no device, ordinary aligned host memory, and
 * CUDA stage backends whose init fails with BEAM_ENOTSUP and says why.
 * `backend: auto` then falls back to cpu; `backend: cuda` is a start-up
 * error. Compiled only when CUDA=0. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu.h"

#define NO_CUDA "built without CUDA"

int beam_gpu_built(void) { return 0; }

int beam_gpu_count(char *why, size_t why_len) {
  if (why && why_len)
    snprintf(why, why_len, NO_CUDA);
  return 0;
}

void beam_gpu_describe(char *buf, size_t len) { snprintf(buf, len, "none: " NO_CUDA); }

void *beam_host_alloc(size_t bytes, int pinned) {
  (void)pinned; /* nothing to pin for: there is no device */
  size_t rounded = ((bytes ? bytes : 1) + 63) & ~(size_t)63;
  return aligned_alloc(64, rounded);
}

void beam_host_free(void *p, int pinned) {
  (void)pinned;
  free(p);
}

#define STUB_OPS(k)                                                                      \
  static int k##_init(beam_stage_t *self, beam_diag_t *d) {                              \
    return BEAM_DIAG(d, BEAM_ENOTSUP,                                                       \
                     #k ": backend cuda is not available: beamd was " NO_CUDA            \
                     " (rebuild with CUDA=1, or use backend: cpu or auto)");                \
  }                                                                                         \
  static int k##_start(beam_stage_t *self, const beam_series_t *s, const beam_indesc_t *in, \
                          beam_diag_t *d) {                                                 \
    return BEAM_DIAG(d, BEAM_ENOTSUP, #k ": " NO_CUDA);                                  \
  }                                                                                         \
  static int k##_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *e) {   \
    return BEAM_DIAG(&self->diag, BEAM_ENOTSUP, #k ": " NO_CUDA);                        \
  }                                                                                         \
  static int k##_end(beam_stage_t *self, beam_emit_t *e) {                               \
    return BEAM_DIAG(&self->diag, BEAM_ENOTSUP, #k ": " NO_CUDA);                        \
  }                                                                                         \
  static void k##_destroy(beam_stage_t *self) {}                                         \
  const beam_stage_ops_t beam_##k##_cuda_ops = {                                         \
      .kind = #k, .backend = "cuda", .init = k##_init, .start = k##_start,         \
      .process = k##_process, .end = k##_end, .destroy = k##_destroy};

STUB_OPS(correct)
STUB_OPS(roi_sum)
STUB_OPS(bin)
STUB_OPS(preview)
STUB_OPS(xpcs_multitau)
STUB_OPS(xpcs_twotime)
STUB_OPS(pca)
STUB_OPS(ptycho_dm)
STUB_OPS(fit)
STUB_OPS(com)
STUB_OPS(azint)

/* The DM ptychography engine's CUDA backend (pipeline/ptycho/dm_int.h). */
#include "pipeline/ptycho/dm_int.h"

static size_t dm_stub_bytes(const beam_dm_conf_t *c) { return 0; }
static int dm_stub_create(beam_dm_t *e, beam_diag_t *d) {
  return BEAM_DIAG(d, BEAM_ENOTSUP, "ptycho: this beamd was " NO_CUDA
                   " (rebuild with CUDA=1, or use the cpu backend)");
}
const beam_dm_backend_t_ beam_dm_cuda_backend = {"cuda", dm_stub_bytes, dm_stub_create,
                                                 NULL, NULL, NULL, NULL, NULL, NULL, NULL};

int beam_gpu_mem_info(int dev, size_t *free_b, size_t *total_b) {
  (void)dev;
  *free_b = *total_b = 0;
  return BEAM_ENOTSUP;
}

int beam_dm_cuda_fft_seconds(const struct beam_dm_conf_s *c, uint32_t nviews, int iters,
                             double *sec_per_iter, beam_diag_t *d) {
  (void)c, (void)nviews, (void)iters;
  *sec_per_iter = 0;
  return BEAM_DIAG(d, BEAM_ENOTSUP, "ptycho: " NO_CUDA);
}

/* The batched fitter's CUDA backend (pipeline/fit.h). */
#include "pipeline/fit.h"

int beam_fit_cuda_create(beam_fit_cuda_t **c, beam_diag_t *d) {
  *c = NULL;
  return BEAM_DIAG(d, BEAM_ENOTSUP, "fit: backend cuda is not available: beamd was " NO_CUDA
                   " (rebuild with CUDA=1, or use beam_fit_cpu_range)");
}
int beam_fit_cuda_create_dev(beam_fit_cuda_t **c, int dev, beam_diag_t *d) {
  (void)dev;
  return beam_fit_cuda_create(c, d);
}
void beam_fit_cuda_destroy(beam_fit_cuda_t *c) { (void)c; }
int beam_fit_cuda(beam_fit_cuda_t *c, const beam_fit_batch_t *b, const uint16_t *y16,
                  const beam_fit_opts_t *o, beam_fit_result_t *r, beam_fit_cuda_run_t *run,
                  beam_diag_t *d) {
  (void)c, (void)b, (void)y16, (void)o, (void)r, (void)run;
  return BEAM_DIAG(d, BEAM_ENOTSUP, "fit: " NO_CUDA);
}
int beam_fit_cuda_starts(struct beam_fit_cuda_s *c, const struct beam_fit_batch_s *b,
                         const uint16_t *y16, const struct beam_fit_opts_s *o, int host,
                         double *p0, beam_diag_t *d) {
  (void)c, (void)b, (void)y16, (void)o, (void)host, (void)p0;
  return BEAM_DIAG(d, BEAM_ENOTSUP, "fit: " NO_CUDA);
}
