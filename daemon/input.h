/* The input side as sources.
 *
 * A source is one kind of input (input.mode): it owns its sockets and
 * timers on the loop thread, reads or asks for messages, and hands what it
 * got to the ingest core below, which knows nothing of sockets or modes:
 * series tracking, geometry checks, the input pool, the graph. Adding a
 * detector protocol means adding one source file (src_<mode>.c) and its
 * line in input.c's registry.
 *
 * Sources: live and pull (beamd protocol over SUB and PULL, src_zmq.c),
 * replay (REQ/DEALER to beamd-replay, src_replay.c), dectris (DECTRIS
 * SIMPLON stream v1 and v2 and Jungfraujoch over PULL, src_dectris.c).
 *
 * Buffers: a payload part (beam_part_t) carries its owner, which knows how
 * to keep the buffer the bytes lie in (a ZeroMQ message, a landing slot, a
 * mapped file) as a frame's storage without a copy. proto/ only carries
 * the pointer; the owners are defined here. */
#ifndef BEAMD_INPUT_H
#define BEAMD_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <zmq.h>

#include <uv.h>

#include "daemon/zsock.h"
#include "pipeline/cfg.h"
#include "pipeline/frame.h"
#include "proto/proto.h"

typedef struct beamd_s beamd_t;

/* ---- buffer owners ---------------------------------------------------------- */

/* lend makes the bytes at `data` (which lie in this owner's buffer) frame
 * f's payload storage without a copy, and returns 1; 0 when it cannot (the
 * buffer is lent already, or data is not in it). The frame's last unref
 * gives the buffer back. Loop thread only. */
struct beam_owner_s {
  int (*lend)(beam_owner_t *self, const void *data, beam_frame_t *f);
  int taken; /* set by lend: a frame holds the buffer now */
};

/* A received ZeroMQ message part: lending moves it into the frame's slot
 * (the slot keeps a zmq_msg_t in f->user), leaving msg empty. */
typedef struct beamd_zmsg_owner_s {
  beam_owner_t base;
  zmq_msg_t *msg;
} beamd_zmsg_owner_t;
void beamd_zmsg_owner_init(beamd_zmsg_owner_t *o, zmq_msg_t *msg);

/* ---- a ZeroMQ reader for push-style sources (zread.c) ------------------------ */

#define BEAMD_ZREAD_MAX_PARTS (BEAM_MAX_PAYLOAD_PARTS + 3)

/* One socket read until EAGAIN on each wake-up, in bounded batches (an idle
 * handle comes back for the rest), pausing before each message while a
 * lossless source has no room. Each message's parts reach `handle` with
 * their owners set; the parts are closed after it returns (a lent part is
 * empty by then). Sources embed it in their state. */
typedef struct beamd_zread_s beamd_zread_t;
struct beamd_zread_s {
  beamd_t *d;
  beamd_zsock_t zs;
  uv_idle_t more;
  int more_on, lossless, stopped;
  int hold; /* the source holds a message of this socket: read no further (beamd_zread_hold) */
  void (*handle)(beamd_zread_t *zr, const beam_part_t *parts, size_t n, uint64_t t_recv);
  /* Draining: this socket is empty. NULL: the drain is complete
   * (beamd_input_drained); a source with several sockets counts them. */
  void (*drained)(beamd_zread_t *zr);
  void *ctx; /* the source's */
  zmq_msg_t parts[BEAMD_ZREAD_MAX_PARTS];
  beamd_zmsg_owner_t owners[BEAMD_ZREAD_MAX_PARTS];
};
/* type ZMQ_SUB or ZMQ_PULL; hwm 0 = ZeroMQ's default. */
int beamd_zread_open(beamd_t *d, beamd_zread_t *zr, int type, const char *endpoint,
                     const beam_ep_sec_t *sec, const char *what, int bind, int hwm, int lossless,
                     char *err, size_t errlen);
void beamd_zread_read(beamd_zread_t *zr);    /* a wake-up, or room came back */
int beamd_zread_drain(beamd_zread_t *zr);    /* the drain op's answer (input.h) */
void beamd_zread_stop(beamd_zread_t *zr);
/* on: stop reading after the message being handled (the source keeps one
 * back); off: read again, from the next loop iteration. */
void beamd_zread_hold(beamd_zread_t *zr, int on);
/* Closes the socket and the idle handle; zr must stay allocated until the
 * loop ran the handle's close (sources park their state in src_garbage). */
void beamd_zread_close(beamd_zread_t *zr);

/* ---- sources ---------------------------------------------------------------- */

typedef struct beamd_source_ops_s {
  const char *mode;           /* the input.mode value */
  int lossless;               /* pauses when the graph is full instead of dropping */
  const beam_param_t *params; /* its sub-table input.<mode>, NULL when it has none */
  /* Opens sockets and timers; conf is the validated input.<mode> map (or
   * the input map itself when params is NULL). Returns 0 or < 0 with err.
   * On failure close is still called. */
  int (*open)(beamd_t *d, void **state, const beam_cnode_t *conf, char *err, size_t errlen);
  /* Room appeared in the graph: read (or ask for) more. */
  void (*resume)(beamd_t *d, void *state);
  /* Draining. Returns 1 when the source reads what its sockets already
   * hold and calls beamd_input_drained when that is in the graph (lossless
   * push inputs: the sender counted those messages as delivered), 0 when
   * it simply stops (live drops; replay asks again after a restart). */
  int (*drain)(beamd_t *d, void *state);
  /* No more reads from now on; sockets stay open until close. */
  void (*stop)(beamd_t *d, void *state);
  void (*close)(beamd_t *d, void *state); /* frees state; NULL-safe */
  /* Adds the source's own counters to the input stats object. */
  void (*stats)(beamd_t *d, void *state, json_t *o);
  /* Optional: frames served so far and expected in all (0: unknown), for
   * /metrics (replay progress). */
  void (*progress)(const void *state, uint64_t *done, uint64_t *expected);
} beamd_source_ops_t;

extern const beamd_source_ops_t beamd_src_live, beamd_src_pull, beamd_src_replay,
    beamd_src_dectris, beamd_src_karabo;
extern const beam_param_t beamd_replay_params[], beamd_dectris_params[], beamd_karabo_params[];

/* The input section's schema (common keys, then one sub-table per source
 * that has one) and the source of each input.mode, in the enum's order. */
extern const beam_param_t beamd_input_params[];
const beamd_source_ops_t *beamd_source_find(unsigned mode);

/* ---- the ingest core: what sources call -------------------------------------- */

/* A beamd protocol message (parts as received, each payload part with its
 * owner or NULL): parse, track sequence numbers, dispatch. */
void beamd_ingest_parts(beamd_t *d, const beam_part_t *parts, size_t n);
/* The same, and when the message is a SERIES_START (not a result as a
 * frame), arr (NULL: none) is attached to its series before it starts:
 * an array the source took from the message itself (the replay input's
 * pixel mask, src_replay.c). Copied; the caller keeps arr. */
void beamd_ingest_parts_array(beamd_t *d, const beam_part_t *parts, size_t n,
                              const beam_series_array_t *arr);
/* A series begins: s carries geometry and metadata (and series arrays);
 * takes the creation reference. An open series is ended as aborted first. */
void beamd_ingest_series_start(beamd_t *d, beam_series_t *s);
/* The open series ends (aborted: cut short). Returns 0, or -1 when no
 * series of that id is open (counted as unknown_series). */
int beamd_ingest_series_end(beamd_t *d, uint64_t series_id, int aborted);
/* One frame described by a beamd header (geometry, codec, ids, flags)
 * with its payload parts, into the graph. t_recv: beam_now_ns() when the
 * source received it. Returns 1 when a frame entered the graph, 0 when it
 * was dropped (counted with its reason). */
int beamd_ingest_frame(beamd_t *d, const beam_msg_t *m, uint64_t t_recv);
/* n frames of the open series will never come (the source saw a gap in
 * its frame numbers, or an end short of the announced count): counted
 * (input.missing) and the series' end is published INCOMPLETE. */
void beamd_ingest_missing(beamd_t *d, uint64_t n);
/* input.result_topic: drops the series started upstream that got no
 * result yet (stop, close). */
void beamd__ingest_forget_pending(beamd_t *d);
/* The open series, NULL when none (borrowed). */
const beam_series_t *beamd_ingest_series(const beamd_t *d);
/* Lossless sources: room in the graph for one more frame? When 0, the
 * graph calls back (source resume) once room appears. */
int beamd_ingest_room(beamd_t *d);
/* Lossless sources waiting for room (stats: paused, paused_s). */
void beamd_ingest_pause(beamd_t *d);
/* Counts a message the source could not use, with a rate-limited log line. */
void beamd_ingest_malformed(beamd_t *d, const char *what, const char *why);
/* A drain the source accepted (drain returned 1) is complete. */
void beamd_input_drained(beamd_t *d);
/* The source has nothing more to give and the operator asked beamd to
 * exit then (replay's exit_on_eof). */
void beamd_input_eof(beamd_t *d, const char *why);

#endif
