/* Stage kind `ptycho_dm`, CPU backend: the shared host logic of
 * ptycho_dm.c on the DM engine's CPU backend (FFTW, OpenMP threads:
 * `threads`). Nothing numerical lives here; the engine has it. */
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/ptycho_dm.h"

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  return beam_ptycho_dm_init(self, BEAM_DM_CPU, d);
}

const beam_stage_ops_t beam_ptycho_dm_cpu_ops = {
    .kind = "ptycho_dm", .backend = "cpu",
    .init = cpu_init, .start = beam_ptycho_dm_start, .process = beam_ptycho_dm_process, .end = beam_ptycho_dm_end, .destroy = beam_ptycho_dm_destroy,
};
