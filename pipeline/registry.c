/* Registry of stage kinds: one line per kind, CPU and CUDA ops side by side
 * (the CUDA ones are stubs in CPU-only builds). */
#include <string.h>

#include "pipeline/device.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/stage.h"

static const beam_stage_kind_t k_correct = {
    "correct", "dark subtraction, flat field, bad-pixel mask, threshold -> float32",
    beam_correct_params, &beam_correct_cpu_ops, &beam_correct_cuda_ops, NULL};
static const beam_stage_kind_t k_roi_sum = {
    "roi_sum", "per frame, the sum of the pixels under each of N masks (virtual detectors)",
    beam_roi_sum_params, &beam_roi_sum_cpu_ops, &beam_roi_sum_cuda_ops, NULL};
static const beam_stage_kind_t k_bin = {
    "bin", "crop and n x n binning", beam_bin_params, &beam_bin_cpu_ops, &beam_bin_cuda_ops, NULL};
static const beam_stage_kind_t k_preview = {
    "preview", "decimated frames at a bounded rate for viewers", beam_preview_params,
    &beam_preview_cpu_ops, &beam_preview_cuda_ops, NULL};
static const beam_stage_kind_t k_xpcs_multitau = {
    "xpcs_multitau", "XPCS multi-tau g2 per ROI, streaming (scikit-beam semantics)",
    beam_xpcs_multitau_params, &beam_xpcs_multitau_cpu_ops, &beam_xpcs_multitau_cuda_ops, NULL};
static const beam_stage_kind_t k_xpcs_twotime = {
    "xpcs_twotime", "XPCS two-time correlation C(t1, t2) per ROI and g2 from its diagonals (scikit-beam)",
    beam_xpcs_twotime_params, &beam_xpcs_twotime_cpu_ops, &beam_xpcs_twotime_cuda_ops, beam_xpcs_twotime_check};
static const beam_stage_kind_t k_pca = {
    "pca", "streaming PCA (incremental SVD): scores, anomaly residual, components",
    beam_pca_params, &beam_pca_cpu_ops, &beam_pca_cuda_ops, NULL};
static const beam_stage_kind_t k_ptycho_dm = {
    "ptycho_dm", "live difference-map ptychography: object, probe and error while the scan runs",
    beam_ptycho_dm_params, &beam_ptycho_dm_cpu_ops, &beam_ptycho_dm_cuda_ops, NULL};
/* CPU (fit_stage_cpu.c) and CUDA (gpu/fit_stage_cuda.cu, beam_fit_cuda). */
static const beam_stage_kind_t k_fit = {
    "fit", "batched Levenberg-Marquardt: per-pixel maps over a series, or the curves of a result",
    beam_fit_params, &beam_fit_cpu_ops, &beam_fit_cuda_ops, beam_fit_stage_check};
static const beam_stage_kind_t k_com = {
    "com", "4D-STEM centre of mass per frame; DPC maps (shift, divergence, curl, iDPC) over the scan",
    beam_com_params, &beam_com_cpu_ops, &beam_com_cuda_ops, NULL};

static const beam_stage_kind_t k_azint = {
    "azint", "azimuthal integration to I(q) or I(2theta) and a cake, pyFAI geometry and CSR integrators",
    beam_azint_params, &beam_azint_cpu_ops, &beam_azint_cuda_ops, beam_azint_check};

/* Built-in kinds first; kinds that need libraries pipeline/ must not use
 * (HDF5 for `record`) are registered by the daemon at start-up. */
#define MAX_KINDS 32
static const beam_stage_kind_t *kinds[MAX_KINDS + 1] = {&k_correct, &k_roi_sum, &k_bin, &k_preview, &k_xpcs_multitau, &k_xpcs_twotime, &k_pca, &k_ptycho_dm, &k_fit, &k_com, &k_azint, NULL};

const beam_stage_kind_t *const *beam_stage_kinds(void) { return kinds; }

int beam_stage_kind_register(const beam_stage_kind_t *k) {
  size_t n = 0;
  while (kinds[n]) {
    if (kinds[n] == k)
      return 0; /* registering twice is harmless */
    if (strcmp(kinds[n]->kind, k->kind) == 0)
      return BEAM_EINVAL;
    n++;
  }
  if (n >= MAX_KINDS)
    return BEAM_ELIMIT;
  kinds[n] = k;
  kinds[n + 1] = NULL;
  return 0;
}

const beam_stage_kind_t *beam_stage_kind_find(const char *kind) {
  for (size_t i = 0; kind && kinds[i]; i++)
    if (strcmp(kinds[i]->kind, kind) == 0)
      return kinds[i];
  return NULL;
}

const char *beam_stage_name_valid(const beam_cnode_t *v) {
  if (!v->scalar || !beam_topic_valid(v->scalar, strlen(v->scalar)) || strchr(v->scalar, '.'))
    return "stage names are 1-64 characters of a-z, 0-9, _ and - (no dots)";
  if (strcmp(v->scalar, "frames") == 0 || strcmp(v->scalar, "beamd") == 0)
    return "\"frames\" and \"beamd\" are reserved names";
  return NULL;
}
