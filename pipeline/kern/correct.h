/* Stage kind `correct`: configuration and per-series pixel tables shared by
 * the CPU (pipeline/kern/correct_cpu.c) and CUDA (gpu/correct_cuda.cu)
 * backends.
 *
 *   out = (raw - dark) / flat            in float32, in that order
 *   bad pixel (mask != 0, flat <= 0 or non-finite, dark non-finite,
 *              raw >= saturation)      -> bad_value
 *   good pixel with out < threshold    -> 0
 * The threshold applies to good pixels only, so a bad_value below the
 * threshold still marks the bad pixels. */
#ifndef BEAM_KERN_CORRECT_H
#define BEAM_KERN_CORRECT_H

#include "pipeline/array.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct beam_correct_conf_s {
  beam_array_t dark, flat, mask; /* data NULL when not configured */
  double threshold, saturation;  /* compared in double on both backends */
  float bad_value;
} beam_correct_conf_t;

/* Per-pixel tables for one frame shape: dark (0 when absent), flat (1 when
 * absent or bad), bad (1 = bad from mask/flat/dark). Saturation depends on
 * the raw value and is tested per frame. */
typedef struct beam_correct_tab_s {
  size_t n;
  float *dark, *flat;
  uint8_t *bad;
  int plain; /* no dark, flat or mask: the tables are 0, 1 and 0 everywhere */
} beam_correct_tab_t;

/* Reads the parameters and loads dark/flat/mask files. On failure nothing
 * stays allocated. */
int beam_correct_conf_load(beam_correct_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_correct_conf_free(beam_correct_conf_t *c);

/* start: checks dtype (uint16, uint32, float32) and that every file matches
 * the frame shape, then declares output 0 "frame" (float32, frame shape). */
int beam_correct_start(beam_stage_t *self, const beam_correct_conf_t *c,
                       const beam_indesc_t *in, beam_diag_t *d);

/* (Re)sizes t for n pixels (allocates only when n grows) and fills it. */
int beam_correct_tab_build(beam_correct_tab_t *t, const beam_correct_conf_t *c, size_t n,
                           beam_diag_t *d);
void beam_correct_tab_free(beam_correct_tab_t *t);

/* The fast CPU loop (tables) and the plain reference (straight from the
 * definition above, reading the loaded arrays element by element). Both are
 * bit-identical by construction: the same float32 operations in the same
 * order. */
void beam_correct_cpu(const beam_correct_tab_t *t, const beam_correct_conf_t *c,
                      beam_dtype_t dt, const void *raw, float *out);
void beam_correct_ref(const beam_correct_conf_t *c, beam_dtype_t dt, const void *raw,
                      size_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif
