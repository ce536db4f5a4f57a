/* Stage kind `record`: writes the frames it receives to HDF5, one file per
 * series, in the layout beamd-replay reads back (/entry/data/data, N x frame
 * shape). It lives in daemon/ because pipeline/ may not use HDF5; the daemon
 * registers it at start-up. The file layout is documented in
 * docs/recording.md, the keys in etc/beamd.yaml. */
#ifndef BEAM_STAGE_RECORD_H
#define BEAM_STAGE_RECORD_H

#include "pipeline/stage.h"

extern const beam_param_t beam_record_params[];
extern const beam_stage_ops_t beam_record_cpu_ops;
extern const beam_stage_kind_t beam_record_kind;

/* Adds `record` to the stage kinds (beam_stage_kind_register). Call once at
 * start-up before any configuration is loaded; calling it again is
 * harmless. */
void beam_record_stage_register(void);

#endif
