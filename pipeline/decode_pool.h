/* Threads that decode compressed input frames ahead of the stages.
 *
 * Lazy decode (frame.h) decodes a frame on the first stage thread that
 * reads it: one thread per frame, and a stage that has little else to do
 * (roi_sum, a recorder) is then bound by the decoder. A decode pool takes
 * each frame that enters the graph still encoded and decodes it on one of
 * its threads, in arrival order, so several frames decode at once while
 * the stages consume them in order. Whoever reaches a frame first decodes
 * it (beam_frame_decode's compare-exchange); a stage that finds it being
 * decoded waits for that decode, never repeats it. */
#ifndef BEAM_DECODE_POOL_H
#define BEAM_DECODE_POOL_H

#include <stddef.h>

#include "proto/err.h"
#include "pipeline/frame.h"

typedef struct beam_decode_pool_s beam_decode_pool_t;

/* nthreads >= 1 threads, a queue of cap frames, scratch of scratch_bytes
 * (the largest decoded frame) per thread. */
beam_decode_pool_t *beam_decode_pool_new(unsigned nthreads, unsigned cap, size_t scratch_bytes,
                                         beam_diag_t *d);
/* Hands over one reference to f, which is decoded if still encoded when a
 * thread gets to it. With the queue full, f is left to the stages. */
void beam_decode_pool_push(beam_decode_pool_t *p, beam_frame_t *f);
/* Stops the threads (a decode under way finishes) and drops the frames
 * still queued. */
void beam_decode_pool_free(beam_decode_pool_t **p);
/* Frames decoded by the pool's threads so far. */
unsigned long long beam_decode_pool_decoded(beam_decode_pool_t *p);

#endif
