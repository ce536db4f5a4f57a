/* beam_emit_* dispatch through the emitter's callbacks (see emit_int.h), so
 * stages are the same code under the graph and under the test harness. */
#include "pipeline/emit_int.h"

beam_frame_t *beam_emit_get(beam_emit_t *e, unsigned out) { return e->get(e->ctx, out); }
void beam_emit_put(beam_emit_t *e, beam_frame_t *f) { e->put(e->ctx, f); }
void beam_emit_drop(beam_emit_t *e, beam_frame_t *f) { e->drop(e->ctx, f); }
