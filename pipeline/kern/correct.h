/* Stage kind `correct`: configuration and per-series pixel tables shared by
 * the CPU (pipeline/kern/correct_cpu.c) and CUDA (gpu/correct_cuda.cu)
 * backends.
 *
 *   out = (raw - dark) / flat            in float32, in that order
 *   bad pixel (mask != 0, flat <= 0 or non-finite, dark non-finite,
 *              raw >= saturation, raw == gap value)   -> bad_value
 *   good pixel with out < threshold    -> 0
 * The threshold applies to good pixels only, so a bad_value below the
 * threshold still marks the bad pixels.
 *
 * mask and flat come from files (loaded at init) or, with the value
 * "series", from the series' own "pixel_mask" / "flatfield" arrays
 * (frame.h), looked up at every series start. The series flatfield holds
 * multiplicative factors (raw x flatfield, DECTRIS), so its divisor is the
 * float32 reciprocal, flat = (float)(1 / flatfield): within 2 float32 ulps
 * of raw x flatfield, and exact for powers of two. */
#ifndef BEAM_KERN_CORRECT_H
#define BEAM_KERN_CORRECT_H

#include "pipeline/array.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* gap_value: none, auto (2^N - 1 of an unsigned N-bit input), or a value. */
enum { BEAM_CORRECT_GAP_NONE = 0, BEAM_CORRECT_GAP_AUTO, BEAM_CORRECT_GAP_VALUE };

typedef struct beam_correct_conf_s {
  beam_array_t dark, flat, mask; /* files; data NULL when not configured */
  int flat_series, mask_series;  /* 1: `flat: series` / `mask: series` */
  int gap_mode;                  /* BEAM_CORRECT_GAP_* */
  double gap_value;              /* GAP_VALUE: an integer, |v| <= 2^53 */
  double threshold, saturation;  /* compared in double on both backends */
  float bad_value;
} beam_correct_conf_t;

/* The arrays one series is corrected with, resolved at its start: the
 * configured files or the series' own arrays. Borrowed (from the conf or
 * the series) and used only during start, to build the tables. */
typedef struct beam_correct_src_s {
  const beam_array_t *dark, *flat, *mask; /* NULL when absent */
  int flat_mul; /* flat holds multiplicative factors (the series flatfield) */
  double gap;   /* raw value marking a bad pixel in this series' dtype; NaN = none */
} beam_correct_src_t;

/* Per-pixel tables for one frame shape: dark (0 when absent), flat (the
 * divisor; 1 when absent or bad), bad (1 = bad from mask/flat/dark).
 * Saturation and the gap value depend on the raw value and are tested per
 * frame. */
typedef struct beam_correct_tab_s {
  size_t n;
  float *dark, *flat;
  uint8_t *bad;
  int plain;  /* no dark, flat or mask: the tables are 0, 1 and 0 everywhere */
  double gap; /* from the source: NaN = no gap value */
} beam_correct_tab_t;

/* Reads the parameters and loads dark/flat/mask files (not for keys set to
 * "series"). On failure nothing stays allocated. */
int beam_correct_conf_load(beam_correct_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_correct_conf_free(beam_correct_conf_t *c);

/* The gap value for input dtype dt under c: 65535 / 4294967295 for uint16 /
 * uint32 with auto (NaN for float32), the configured value, or NaN. */
double beam_correct_gap(const beam_correct_conf_t *c, beam_dtype_t dt);

/* Resolves *src for one series: checks the input dtype (uint16, uint32,
 * float32), takes "pixel_mask" / "flatfield" from the series for `series`
 * keys (BEAM_ECONFIG naming the array and header_detail "all" when the
 * series has none; BEAM_ENOTSUP for a complex one), and checks that every
 * array matches the frame shape (BEAM_ESHAPE). */
int beam_correct_src(const beam_correct_conf_t *c, const beam_series_t *series,
                     const beam_indesc_t *in, beam_correct_src_t *src, beam_diag_t *d);

/* start: beam_correct_src, then declares output 0 "frame" (float32, frame
 * shape). */
int beam_correct_start(beam_stage_t *self, const beam_correct_conf_t *c,
                       const beam_series_t *series, const beam_indesc_t *in,
                       beam_correct_src_t *src, beam_diag_t *d);

/* (Re)sizes t for n pixels (allocates only when n grows) and fills it from
 * src. Series start only. */
int beam_correct_tab_build(beam_correct_tab_t *t, const beam_correct_src_t *src, size_t n,
                           beam_diag_t *d);
void beam_correct_tab_free(beam_correct_tab_t *t);

/* The fast CPU loop (tables) and the plain reference (straight from the
 * definition above, reading the arrays element by element and deriving the
 * gap value from c and dt itself). Both are bit-identical by construction:
 * the same float32 operations in the same order. */
void beam_correct_cpu(const beam_correct_tab_t *t, const beam_correct_conf_t *c,
                      beam_dtype_t dt, const void *raw, float *out);
void beam_correct_ref(const beam_correct_conf_t *c, const beam_correct_src_t *src,
                      beam_dtype_t dt, const void *raw, size_t n, float *out);

#ifdef __cplusplus
}
#endif
#endif
