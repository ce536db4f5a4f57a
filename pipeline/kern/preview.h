/* Stage kind `preview`: decimated frames for viewers, at most `rate` per
 * second. Shared by preview_cpu.c and gpu/preview_cuda.cu.
 *
 * Frames are block-averaged by the smallest integer factor f that brings
 * both sides to max_size or less (f = max(ceil(h/max), ceil(w/max)), edge
 * blocks dropped, the `bin` mean kernel). A frame passes the rate gate when
 * it is the first of the series or at least 1/rate seconds (by t_recv_ns,
 * the monotonic receive time, else the clock) after the last one emitted.
 * Frames the gate holds back are copied aside, so at series end the last
 * frame seen can still be emitted (flagged FINAL) when it was not. CORRUPT
 * frames carry no pixels and are not previewed. */
#ifndef BEAM_KERN_PREVIEW_H
#define BEAM_KERN_PREVIEW_H

#include "pipeline/kern/bin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct beam_preview_conf_s {
  double rate;
  uint32_t max_size;
  uint64_t period_ns;
} beam_preview_conf_t;

typedef struct beam_preview_gate_s {
  uint64_t period_ns, last_emit_ns;
  int emitted_any;
  int pending;         /* the last frame seen was held back and is in the side copy */
  beam_frame_t last;   /* identity of that frame (no pixels) */
} beam_preview_gate_t;

int beam_preview_conf_load(beam_preview_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);

/* start: 2-D real input; fills g (mean, factor) and declares output 0
 * "frame" (float32 [h/f, w/f], not one per input frame). */
int beam_preview_start(beam_stage_t *self, const beam_preview_conf_t *c, const beam_indesc_t *in,
                       beam_bin_geom_t *g, beam_diag_t *d);

void beam_preview_gate_reset(beam_preview_gate_t *gt, uint64_t period_ns);
/* 1 when `in` is to be emitted now (and records it), 0 when it is held back
 * (and records its identity as pending: the caller copies its pixels). */
int beam_preview_gate(beam_preview_gate_t *gt, const beam_frame_t *in);
/* After beam_emit_get at series end: gives f the held-back frame's identity
 * and the FINAL flag. */
void beam_preview_final_ident(const beam_preview_gate_t *gt, beam_frame_t *f);

#ifdef __cplusplus
}
#endif
#endif
