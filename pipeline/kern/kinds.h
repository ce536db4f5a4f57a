/* The stage kinds of this build: their parameter schemas and CPU ops.
 * pipeline/registry.c lists them; pipeline/device.h declares the CUDA ops. */
#ifndef BEAM_KINDS_H
#define BEAM_KINDS_H

#include "pipeline/stage.h"

extern const beam_param_t beam_correct_params[];
extern const beam_stage_ops_t beam_correct_cpu_ops;
extern const beam_param_t beam_roi_sum_params[];
extern const beam_stage_ops_t beam_roi_sum_cpu_ops;
extern const beam_param_t beam_bin_params[];
extern const beam_stage_ops_t beam_bin_cpu_ops;
extern const beam_param_t beam_preview_params[];
extern const beam_stage_ops_t beam_preview_cpu_ops;
extern const beam_param_t beam_xpcs_multitau_params[];
extern const beam_stage_ops_t beam_xpcs_multitau_cpu_ops;
extern const beam_param_t beam_xpcs_twotime_params[];
extern const beam_stage_ops_t beam_xpcs_twotime_cpu_ops;
int beam_xpcs_twotime_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs);
extern const beam_param_t beam_pca_params[];
extern const beam_stage_ops_t beam_pca_cpu_ops;
extern const beam_param_t beam_ptycho_dm_params[];
extern const beam_stage_ops_t beam_ptycho_dm_cpu_ops;
extern const beam_param_t beam_com_params[];
extern const beam_stage_ops_t beam_com_cpu_ops;

extern const beam_param_t beam_azint_params[];
extern const beam_stage_ops_t beam_azint_cpu_ops;
int beam_azint_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs);

extern const beam_param_t beam_fit_params[];
extern const beam_stage_ops_t beam_fit_cpu_ops;
int beam_fit_stage_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs);

#endif
