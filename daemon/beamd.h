/* The daemon object and its parts, as the loop thread sees them.
 *
 * One libuv loop thread owns every ZeroMQ socket, timer and signal (ZeroMQ
 * sockets are not thread-safe). Stage workers reach the loop only through
 * the result queue (beamd_rq_*) and uv_async_send. This header is internal
 * to daemon/; tools use proto/ and the control protocol instead. */
#ifndef BEAMD_H
#define BEAMD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/config.h"
#include "daemon/curve.h"
#include "daemon/fifo.h"
#include "daemon/filemap.h"
#include "daemon/input.h"
#include "daemon/log.h"
#include "daemon/version.h"
#include "pipeline/graph.h"
#include "pipeline/hist.h"

#define BEAMD_MAX_DRAINING 8

typedef struct beamd_s beamd_t;

/* ---- input (input.h: sources and the ingest core) ------------------------ */
typedef struct beamd_ingest_s {
  const beamd_source_ops_t *src; /* from input.mode */
  void *src_state;               /* the source's own */
  int paused;         /* lossless mode: waiting for room */
  int stopped;        /* draining: no more reads */
  int drain_read;     /* draining, lossless: the source reads what it already holds */
  void *scratch;      /* decode scratch, pool.frame_bytes */
  size_t scratch_len;
  int have_seq;
  uint64_t last_seq;
  beam_series_t *series; /* current series (for shape checks), one ref */
  uint64_t fed_next;     /* ingest_idx of the next accepted frame */
  /* counters (loop thread writes, others read) */
  atomic_uint_fast64_t messages, frames, bytes, malformed, gaps, lost, dropped_busy,
      unknown_series, shape_mismatch, too_large, unexpected, series_started, series_aborted,
      seq_resets, corrupt, missing;
  uint64_t paused_ns, paused_since;
  uint64_t missing_pending; /* lost since the last accepted frame (its missing_before) */
  /* input.result_topic (ingest.c): another daemon's RESULTs as frames. A
   * SERIES_START waits in res_pending for the first result, whose geometry
   * is the frames' (the next start may come first: a few wait); then, for the open series: results of the topic that
   * arrived, the next frame id expected, frames missing by frame-id gaps
   * (and, at the end, short of nframes), the upstream's own count, and how
   * many of max(gap, up) were counted as lost already. */
  beam_series_t *res_pending[4]; /* in order of their starts */
  unsigned res_npending;
  int res_have_id;
  uint64_t res_arrived, res_next_id, res_gap, res_up, res_counted;
  atomic_uint_fast64_t other_topics, upstream_missing;
  beam_ratelimit_t rl;
} beamd_ingest_t;

int beamd_ingest_open(beamd_t *d, char *err, size_t errlen);
void beamd_ingest_resume(beamd_t *d); /* room appeared */
/* Draining: returns 1 when the source reads what it holds first (it calls
 * beamd_input_drained), 0 when input stopped at once. */
int beamd_ingest_drain(beamd_t *d);
void beamd_ingest_stop(beamd_t *d);   /* no more reads */
void beamd_ingest_close(beamd_t *d);
void beamd_ingest_stats(beamd_t *d, void *json_obj); /* the source's own counters */

/* Landing area of the replay input (landing.c, PROTOCOL.md 13.6): a memfd
 * of nslots slots that beamd-replay reads payloads into. */
typedef struct beamd_landing_s beamd_landing_t;
beamd_landing_t *beamd_landing_new(unsigned nslots, size_t slot_bytes, int prefault, char *err,
                                   size_t errlen);
/* Drops the owner's reference; borrowed slots keep the area alive. */
void beamd_landing_close(beamd_landing_t **l);
const char *beamd_landing_path(const beamd_landing_t *l); /* /proc/PID/fd/N */
size_t beamd_landing_size(const beamd_landing_t *l);
size_t beamd_landing_slot_bytes(const beamd_landing_t *l);
uint8_t *beamd_landing_ptr(const beamd_landing_t *l, unsigned idx);
int beamd_landing_take(beamd_landing_t *l, unsigned *idx); /* -1 when none is free */
void beamd_landing_put(beamd_landing_t *l, unsigned idx);  /* any thread */
/* Makes slot idx frame f's payload buffer; f's release puts it back. */
void beamd_landing_lend(beamd_landing_t *l, unsigned idx, beam_frame_t *f);

/* ---- output ------------------------------------------------------------- */
typedef struct beamd_out_s {
  beamd_zsock_t zs;
  const char *name; /* "publish" or "push" */
  int lossless;
  uint64_t seq;
  /* PUSH: messages waiting for a peer, in order (each holds a frame ref). */
  beam_fifo_t pending;
  atomic_uint_fast64_t messages, bytes, dropped, results;
  uint64_t blocked_ns, blocked_since;
  /* PUSH stall report (beamd_publish_stall): when a message last left,
   * when the stall was last logged, and whether one is being reported. */
  uint64_t progress_ns, stall_logged_ns;
  int stall_reported;
  int discard; /* drain timed out: the PUSH no longer holds results */
  atomic_size_t copy_bytes;  /* payload copies queued inside ZeroMQ */
  size_t copy_budget;        /* PUB: output.pub_buffer; PUSH: output.push_copy_buffer */
} beamd_out_t;

/* Descriptor attachment bookkeeping: first result of each output pool (one
 * per stage output per series), then at most once a second. */
#define BEAMD_DESC_SLOTS 128
typedef struct beamd_desc_seen_s {
  const void *pool;
  uint64_t series_id;
  uint64_t last_ns;
} beamd_desc_seen_t;

/* Copy budgets of the outputs from the current configuration (start, reload). */
void beamd_publish_budgets(beamd_t *d);
int beamd_publish_open(beamd_t *d, char *err, size_t errlen);
void beamd_publish_result(beamd_t *d, beam_frame_t *f); /* takes the ref */
void beamd_publish_series(beamd_t *d, const beam_series_t *s, int type, int aborted);
void beamd_publish_stats(beamd_t *d, const char *json);
void beamd_publish_flush(beamd_t *d); /* retry PUSH backlog */
int beamd_publish_backlog(beamd_t *d);
/* Seconds the PUSH has held messages without a consumer taking one (0:
 * not stalled). Logs a stall past BEAMD_STALL_LOG_S, again every
 * BEAMD_STALL_REPEAT_S, and its end; called from the heartbeat. */
double beamd_publish_stall(beamd_t *d, uint64_t now_ns);
#define BEAMD_STALL_LOG_S 5.0
#define BEAMD_STALL_REPEAT_S 30.0
/* Drain ran past output.drain_timeout: drop the PUSH backlog (counted)
 * and stop keeping results for it, so stages blocked on slots finish. */
void beamd_publish_discard(beamd_t *d);
void beamd_publish_unwatch(beamd_t *d);
void beamd_publish_close(beamd_t *d, int linger_ms);

/* The Karabo bridge 2.2 output (karabo_out.c, output.karabo); opened,
 * fed and closed by publish.c. */
int beamd_karabo_open(beamd_t *d, char *err, size_t errlen);
void beamd_karabo_result(beamd_t *d, const beam_frame_t *f); /* borrows f (copies it) */
void beamd_karabo_unwatch(beamd_t *d);
void beamd_karabo_close(beamd_t *d, int linger_ms);
void beamd_karabo_stats(beamd_t *d, json_t *outputs);
void beamd_karabo_counters(beamd_t *d, uint64_t *served, uint64_t *dropped);
int beamd_karabo_same(const beam_config_t *a, const beam_config_t *b); /* reload: same sockets */

/* ---- result queue (workers -> loop) --------------------------------------- */
typedef struct beamd_rq_item_s {
  int kind; /* RQ_RESULT, RQ_SERIES_DONE */
  beam_frame_t *frame;
  beam_series_t *series;
  int aborted;
} beamd_rq_item_t;

typedef struct beamd_rq_s {
  pthread_mutex_t mu;
  beam_fifo_t q; /* of beamd_rq_item_t: bounded by the output slots in flight */
} beamd_rq_t;

/* ---- control and metrics -------------------------------------------------- */
typedef struct beamd_metrics_s {
  uv_tcp_t server;
  int open;
  char *text; /* rendered at each heartbeat */
  size_t len;
  atomic_uint_fast64_t requests;
  atomic_uint_fast64_t denied; /* requests without the bearer token */
  char *token;                 /* metrics.token_file's token; NULL = none asked */
  beam_ratelimit_t rl;
} beamd_metrics_t;

int beamd_control_open(beamd_t *d, char *err, size_t errlen);
void beamd_control_close(beamd_t *d);
int beamd_metrics_open(beamd_t *d, char *err, size_t errlen);
void beamd_metrics_render(beamd_t *d);
void beamd_metrics_close(beamd_t *d);

/* JSON snapshot of every counter (malloc'd string). */
char *beamd_stats_json(beamd_t *d, int pretty);
char *beamd_status_json(beamd_t *d);

/* ---- the daemon ---------------------------------------------------------- */
enum { BEAMD_STARTING, BEAMD_RUNNING, BEAMD_DRAINING, BEAMD_STOPPED };

struct beamd_s {
  uv_loop_t loop;
  void *zctx;
  int state;
  int exit_code;
  beam_config_t *cfg;
  const char *cfg_path; /* NULL: built-in default */
  beam_graph_t *graph;
  beam_graph_t *next_graph;     /* built by a reload, swapped at a series boundary */
  beam_config_t *next_cfg;
  /* Graphs replaced by a reload, finishing their last series; each keeps
   * its config alive because its stages point into it. */
  struct {
    beam_graph_t *graph;
    beam_config_t *cfg;
  } draining[BEAMD_MAX_DRAINING];
  size_t ndraining;
  atomic_int graph_finished;    /* a worker set said it finished */

  beamd_ingest_t in;
  beamd_out_t pub, push;
  struct beamd_kout_s *kout; /* output.karabo, NULL when off */
  void *kout_garbage;        /* closed, freed after zmq_ctx_term */
  beamd_desc_seen_t desc_seen[BEAMD_DESC_SLOTS];
  beamd_zsock_t ctl;
  beamd_metrics_t met;
  /* CURVE: the daemon's key pair and the handler of bound CURVE sockets. */
  beam_cert_t cert;
  int curve_ready;
  beam_zap_t *zap;

  beamd_rq_t rq;
  uv_async_t wake;
  atomic_int room_flag;
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t heartbeat, watchdog, drain_timer;
  uv_check_t check;

  beam_hist_t e2e; /* input received -> result sent */
  void *src_garbage; /* source state whose handles close with the loop (freed by beamd_fini) */
  uint64_t started_ns;
  uint64_t drain_started_ns;
  uint64_t reloads, reload_failures;
  char last_reload_error[1024];
  beam_ratelimit_t stage_rl;
  /* rates, computed at each heartbeat */
  uint64_t last_hb_ns, last_frames, last_results, last_bytes;
  double rate_fps, rate_rps, rate_mbps;
  double push_stalled_s; /* beamd_publish_stall at the last heartbeat */
  /* The latest series that lost frames, and how many so far (loop thread;
   * ingest.c writes, publish.c flags that series' results INCOMPLETE). */
  uint64_t loss_series_id, loss_frames;
};

/* Lifecycle (daemon.c). */
int beamd_init(beamd_t *d, beam_config_t *cfg, const char *cfg_path, char *err, size_t errlen);
int beamd_run(beamd_t *d);
void beamd_fini(beamd_t *d);
/* Reload from cfg_path: returns 0 and schedules the swap, or < 0 with every
 * error in errs (the old graph keeps running). */
int beamd_reload(beamd_t *d, beam_cfg_errs_t *errs, char *err, size_t errlen);
void beamd_drain(beamd_t *d, const char *why);
/* Ingest -> graph, swapping in a reloaded graph at series boundaries. */
beam_graph_t *beamd_graph_for_start(beamd_t *d);
void beamd_wake(beamd_t *d);

extern const beam_graph_hooks_t beamd_graph_hooks_template;

#endif
