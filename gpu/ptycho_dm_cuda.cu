/* Stage kind `ptycho_dm`, CUDA backend: the shared host logic of
 * pipeline/kern/ptycho_dm.c on the DM engine's CUDA backend (cuFFT; the
 * engine's kernels are in gpu/dm_cuda.cu). No kernels here: views,
 * exit waves, object and probe live on the device inside the engine, and
 * this stage only moves prepared views in and results out. */
#include "gpu/gpu.h"
#include "pipeline/kern/ptycho_dm.h"

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  /* Fail at start-up, not at the first series (when the engine is made):
   * `backend: cuda` without a device is a configuration error. */
  char why[256] = "";
  if (beam_gpu_count(why, sizeof why) <= 0)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "ptycho_dm: backend cuda: no usable GPU: %s", why);
  return beam_ptycho_dm_init(self, BEAM_DM_CUDA, d);
}

extern "C" const beam_stage_ops_t beam_ptycho_dm_cuda_ops = {
    .kind = "ptycho_dm", .backend = "cuda",
    .init = cu_init, .start = beam_ptycho_dm_start, .process = beam_ptycho_dm_process, .end = beam_ptycho_dm_end, .destroy = beam_ptycho_dm_destroy,
};
