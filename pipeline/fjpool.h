/* A small persistent fork-join pool for the CPU backends that split a
 * frame's work over threads (xpcs_multitau, pca, fit, azint): n - 1
 * helper threads created once (stage init), and a call that runs fn(ctx,
 * k) for tasks k = 0..tasks-1 on the caller and the helpers, whoever
 * claims each first, returning when all are done. Made for per-frame
 * phases of about a millisecond, where creating threads or taking a mutex
 * per phase would show: the handoff is a claim word and a done counter
 * (C11 atomics); helpers and the caller spin briefly on them, then sleep
 * on a Linux futex, so an idle stage costs no CPU and a busy one rarely
 * enters the kernel. Because the caller claims tasks too, a phase never
 * waits for a helper that has not been scheduled yet, only for tasks
 * already started: give more tasks than threads to bound that wait.
 *
 * Not a general work queue: one caller at a time (the stage's worker
 * thread), no nesting, no cancellation. Nothing here allocates after
 * beam_fjpool_new. */
#ifndef BEAM_FJPOOL_H
#define BEAM_FJPOOL_H

#include "proto/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_FJPOOL_MAX 64
#define BEAM_FJPOOL_TASKS 65535 /* tasks per run */

typedef struct beam_fjpool_s beam_fjpool_t;
typedef void (*beam_fjpool_fn)(void *ctx, unsigned k);

/* Starts n - 1 helpers (n = 1..BEAM_FJPOOL_MAX; n = 1 starts none and
 * runs every call inline). who prefixes messages. Returns 0 and *out, or
 * BEAM_ENOMEM / BEAM_EINVAL with d filled and *out NULL. */
int beam_fjpool_new(beam_fjpool_t **out, unsigned n, const char *who, beam_diag_t *d);
/* Joins the helpers and frees; NULL-safe; sets *self to NULL. */
void beam_fjpool_destroy(beam_fjpool_t **self);
/* Threads of the pool, the caller included. */
unsigned beam_fjpool_size(const beam_fjpool_t *self);
/* Runs fn(ctx, k) once for each k < tasks (1..BEAM_FJPOOL_TASKS), on
 * any of the pool's threads, and waits for all. Happens-before: what the
 * caller wrote before the call is visible to fn, and what fn wrote is
 * visible after the call returns. */
void beam_fjpool_run(beam_fjpool_t *self, unsigned tasks, beam_fjpool_fn fn, void *ctx);
/* Online CPU cores (at least 1), for `threads: 0`. */
unsigned beam_fjpool_cores(void);

#ifdef __cplusplus
}
#endif
#endif
