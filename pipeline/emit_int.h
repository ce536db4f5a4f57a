/* Internal: how beam_emit_t is made. The graph builds one per stage call;
 * unit tests build their own to drive a stage's ops without a graph
 * (tests/common/stage_harness.c). Stages never include this. */
#ifndef BEAM_EMIT_INT_H
#define BEAM_EMIT_INT_H

#include "pipeline/stage.h"

struct beam_emit_s {
  void *ctx;
  beam_frame_t *(*get)(void *ctx, unsigned out);
  void (*put)(void *ctx, beam_frame_t *f);
  void (*drop)(void *ctx, beam_frame_t *f);
};

#endif
