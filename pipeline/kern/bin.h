/* Stage kind `bin` (crop, then n x n block sum or mean) and the 2-D block
 * reduction it shares with `preview`. CPU loops in bin_cpu.c, CUDA in
 * gpu/bin_cuda.cu.
 *
 * Summation order, the same on every backend so results are bit-identical:
 * each output pixel is a double accumulator, rows of the block outer, columns
 * inner, starting from +0.0; mean divides that double by n*n once; the
 * result is rounded to float32 once. */
#ifndef BEAM_KERN_BIN_H
#define BEAM_KERN_BIN_H

#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct beam_bin_conf_s {
  int crop_set;
  uint32_t y0, x0, h, w; /* crop when crop_set */
  uint32_t n;
  int mean;
} beam_bin_conf_t;

/* One frame's block reduction: input row-major in_h x in_w of dtype, the
 * window starting at (y0, x0), out_h x out_w blocks of n x n. */
typedef struct beam_bin_geom_s {
  beam_dtype_t dtype;
  uint32_t in_h, in_w, y0, x0, out_h, out_w, n;
  int mean;
} beam_bin_geom_t;

int beam_bin_conf_load(beam_bin_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);

/* start for `bin`: 2-D real input, crop inside the frame, at least one block;
 * fills g and declares output 0 "frame" (float32 [out_h, out_w]). */
int beam_bin_start(beam_stage_t *self, const beam_bin_conf_t *c, const beam_indesc_t *in,
                   beam_bin_geom_t *g, beam_diag_t *d);

/* Fast loop: accumulates rows of blocks in acc (out_w doubles, caller's
 * scratch, so nothing is allocated per frame). */
void beam_bin2d_cpu(const beam_bin_geom_t *g, const void *in, float *out, double *acc);
/* Plain reference: four nested loops, element access through a switch. */
void beam_bin2d_ref(const beam_bin_geom_t *g, const void *in, float *out);

#ifdef __cplusplus
}
#endif
#endif
