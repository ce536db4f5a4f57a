/* The stage graph: stages from the config, a worker thread each, bounded
 * queues between them (or, for a light stage, its upstream's thread and a
 * call: stage key thread), and hooks back to the daemon for results.
 *
 * Threading: the daemon's loop thread calls beam_graph_series_start/
 * frame/series_end (ingest) and never blocks in them: it asks
 * beam_graph_room() first. Workers call the hooks from their own threads;
 * the daemon's hooks only enqueue and wake the loop (uv_async_send).
 *
 * Ordering: each stage sees START, its frames and END of a series in
 * ingest order, so each stage's output is ordered. on_series_done fires
 * after every stage has finished END of that series and after all their
 * results were handed to on_result. */
#ifndef BEAM_GRAPH_H
#define BEAM_GRAPH_H

#include "pipeline/cfg.h"
#include "pipeline/frame.h"
#include "pipeline/hist.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct beam_graph_s beam_graph_t;

typedef struct beam_graph_hooks_s {
  void *ctx;
  /* A result to publish; the callee owns one reference. */
  void (*on_result)(void *ctx, beam_frame_t *f);
  /* Every stage finished the series (normally or aborted). The callee owns
   * one series reference. */
  void (*on_series_done)(void *ctx, beam_series_t *s, int aborted);
  /* A queue slot or an input slot became free (ingest may resume). */
  void (*on_room)(void *ctx);
  /* A stage rejected a frame or series: message for a rate-limited log. */
  void (*on_error)(void *ctx, const char *stage, uint64_t series_id,
                   uint64_t frame_id, const char *msg);
  /* Informational messages at graph build (backend choices): syslog level. */
  void (*on_log)(void *ctx, int level, const char *msg);
  /* The last worker exited after beam_graph_shutdown. */
  void (*on_finished)(void *ctx);
} beam_graph_hooks_t;

/* A stage as the config describes it (validated). */
typedef struct beam_stage_spec_s {
  const char *name, *kind, *input, *backend;
  const char *thread; /* "auto" (NULL), "own" or "upstream": see stage key thread */
  int publish;
  unsigned queue;
  const beam_cnode_t *node;
  /* Tests and embedders may supply a kind that is not in the registry;
   * NULL looks `kind` up with beam_stage_kind_find. */
  const beam_stage_kind_t *kind_def;
} beam_stage_spec_t;

typedef struct beam_graph_params_s {
  unsigned pool_frames;  /* input slots */
  size_t frame_bytes;    /* input slot size */
  int pinned;
  /* pinned only if a stage's backend resolved to cuda (pool.pinned auto):
   * a graph of CPU stages then keeps frames zero-copy and lazily decoded. */
  int pin_auto;
  size_t slot_user_bytes; /* per input slot scratch for the ingest (0 = none) */
  int prefault;           /* write the input pool once now (resident at once) */
  unsigned decode_threads; /* decode encoded input frames ahead of the stages (decode_pool.h) */
  /* thread auto: the largest output a light consumer reads on its
   * upstream's thread; 0 = what stays in cache (beam_cache_resident). */
  size_t inline_max_bytes;
} beam_graph_params_t;

/* Builds the graph: resolves backends (auto -> cuda when a GPU is present),
 * runs every stage's init, allocates the input pool, starts the workers.
 * On any failure nothing is left running and d says which stage and why. */
int beam_graph_new(beam_graph_t **out, const beam_stage_spec_t *specs, size_t n,
                   const beam_graph_params_t *gp, const beam_graph_hooks_t *hooks,
                   beam_diag_t *d);

/* Begins a drain without blocking: an open series is ended as aborted (so
 * stages emit final results), then every worker finishes what is queued and
 * exits. on_finished fires (from a worker) when the last one has exited.
 * The caller must keep consuming results meanwhile: workers may wait for
 * output slots that only the publisher frees. */
void beam_graph_shutdown(beam_graph_t *g);
/* 1 when every worker has exited after beam_graph_shutdown. */
int beam_graph_finished(beam_graph_t *g);
/* Joins the workers (shutting down first if needed, which blocks: call it
 * after beam_graph_finished, or when nothing downstream can hold slots),
 * destroys the stages. Frames still referenced elsewhere keep their pools
 * alive. NULL-safe; NULLs the caller's pointer. */
void beam_graph_destroy(beam_graph_t **g);

/* Ingest (loop thread only). room() is true when an input slot is free and
 * every stage fed by "frames" has queue space, so frame() will not block. */
int beam_graph_room(beam_graph_t *g);
beam_frame_t *beam_graph_input_slot(beam_graph_t *g); /* NULL when none free */
/* 1 when input slots are page-locked for DMA (then ingest copies into them
 * rather than borrowing the ZeroMQ buffer). */
int beam_graph_input_pinned(const beam_graph_t *g);
/* Whether input frames kept encoded (lazy decode) should keep their wire
 * bytes after decoding (frame.h keep_encoded): a stage fed "frames" can
 * store them as they are, beside other stages fed "frames". */
int beam_graph_keeps_encoded(const beam_graph_t *g);
/* Input frames the decode pool decoded before a stage needed them. */
unsigned long long beam_graph_decoded_ahead(beam_graph_t *g);
void beam_graph_series_start(beam_graph_t *g, beam_series_t *s); /* takes a ref */
void beam_graph_frame(beam_graph_t *g, beam_frame_t *f);         /* takes the ref */
/* Between beam_graph_batch(g, 1) and beam_graph_batch(g, 0) the frames
 * given wake the stages once per few frames instead of every frame; the
 * end wakes them for the rest. For the frames of one message of many
 * (a replay reply). Loop thread only. */
void beam_graph_batch(beam_graph_t *g, int on);
void beam_graph_series_end(beam_graph_t *g, uint64_t series_id, int aborted);
/* How many frames frame() can take now without blocking (0 = none). */
unsigned beam_graph_room_count(beam_graph_t *g);
/* Asks for one on_room call once at least n input slots are free (n <= 1:
 * at the next released slot or queue place), although there is some room
 * now: a caller that waits for more, to ask a replay server for a fuller
 * batch. The call may come with less room than n when queue places, not
 * slots, are short; the caller counts again. */
void beam_graph_want_room(beam_graph_t *g, unsigned n);
/* Every input frame with ingest_idx < the returned value has been processed
 * by every stage, with its results handed to on_result. fed_next is the
 * ingest_idx the next input frame will get. Loop thread only. */
uint64_t beam_graph_watermark(beam_graph_t *g, uint64_t fed_next);
/* No frame is queued or being processed and no series is open. */
int beam_graph_idle(beam_graph_t *g);
int beam_graph_series_open(beam_graph_t *g);

/* Statistics snapshot, for stats/metrics (any thread; counters are atomics). */
typedef struct beam_stage_stats_s {
  const char *name, *kind, *backend;
  uint64_t frames_in, frames_out, results, rejected, errors, series;
  unsigned queue_depth, queue_cap;
  double busy_s; /* time inside process/end */
  /* The stage whose thread runs this one in the current series (thread:
   * upstream or auto), or NULL: its own. */
  const char *runs_on;
  /* Frames whose output this stage never wrote: its consumer took them
   * by tile fusion, range by range (stage.h map / reduce_mapped). */
  uint64_t fused;
  const beam_hist_t *latency; /* process time per frame */
  unsigned ncounters;         /* the stage's own counters (beam_stage_t.counters) */
  const char *counter_names[BEAM_STAGE_MAX_COUNTERS];
  uint64_t counters[BEAM_STAGE_MAX_COUNTERS];
} beam_stage_stats_t;

size_t beam_graph_nstages(const beam_graph_t *g);
void beam_graph_stage_stats(const beam_graph_t *g, size_t i, beam_stage_stats_t *out);
unsigned beam_graph_input_free(beam_graph_t *g);
unsigned beam_graph_input_slots(beam_graph_t *g);

#ifdef __cplusplus
}
#endif
#endif
