/* beamd-view internals: the live web viewer of beamd result streams.
 *
 * One thread, one libuv loop: the ZeroMQ SUB sockets (store.c), the control
 * poller (ctl.c) and libwebsockets (ws.c, joined to the same loop as a
 * foreign loop) all run on it, so ZeroMQ sockets are touched by one thread
 * only and nothing needs a lock.
 *
 * Data flow (latest wins): every result received replaces the stored one of
 * its topic and bumps the topic's version. Nothing is converted then; a
 * display form (disp.c: float32, downsampled, complex split) is built only
 * when a browser is ready to take that topic, from the newest message, and
 * shared by every browser that wants the same version. Each browser has its
 * own "sent version" per topic and a per-topic rate limit, so a slow browser
 * holds at most one message in flight and skips the versions it missed.
 *
 * Wire format to the browser (docs/viewer.md): every WebSocket message is
 * binary: u32 LE n, n bytes of JSON header, zero padding to a multiple of
 * 4, then the payload (float32 LE values, or nothing).
 */
#ifndef BEAMD_VIEW_H
#define BEAMD_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>
#include <zmq.h>

#include "proto/proto.h"

#define VIEW_MAX_SUB 16
#define VIEW_MAX_TOPICS 256
#define VIEW_MAX_PARTS (2 + BEAM_MAX_PAYLOAD_PARTS + 1) /* topic, header, payload, meta */
#define VIEW_DRAIN_BATCH 256 /* messages per loop turn before yielding to the browsers */

typedef struct view_opts_s {
  const char *sub[VIEW_MAX_SUB];
  int nsub;
  const char *control; /* NULL: no pipeline status */
  const char *bind;
  int port;
  const char *token; /* NULL: no token (only allowed on loopback) */
  double max_rate;   /* results per second per topic per browser */
  unsigned max_side; /* display images are downsampled to at most this side */
  int ds_max;        /* 1: downsample by block maximum, 0: block mean */
  const char *assets;
  double ctl_period; /* seconds between control polls */
  int hwm;
  int verbose;
} view_opts_t;

/* A ready-to-send WebSocket message, immutable once built and shared by
 * reference between browsers (single-threaded counts). */
typedef struct view_msg_s {
  int refs;
  size_t len;         /* message bytes, after the LWS_PRE head room */
  unsigned char *buf; /* LWS_PRE + len bytes */
} view_msg_t;

view_msg_t *view_msg_new(json_t *hdr, const void *payload, size_t payload_len);
/* A message whose payload the caller fills: returns it with the header
 * written and *payload pointing at payload_len writable bytes. */
view_msg_t *view_msg_alloc(json_t *hdr, size_t payload_len, void **payload);
view_msg_t *view_msg_ref(view_msg_t *m);
void view_msg_unref(view_msg_t **m);

typedef struct view_topic_s {
  char name[BEAM_TOPIC_MAX + 1];
  int sub;             /* index of the endpoint it came from */
  uint64_t ver;        /* +1 per message stored */
  uint64_t count, bytes, invalid;
  uint64_t first_ns, last_ns; /* monotonic */
  double rate;         /* results/s, smoothed */
  zmq_msg_t parts[VIEW_MAX_PARTS];
  size_t nparts;
  int ok;              /* parts parse as a beam message */
  beam_msg_t msg;      /* pointers into parts when ok */
  char why[160];       /* why it does not parse */
  uint64_t t_rx_ns;    /* realtime, when the viewer received it */
  json_t *desc;        /* latest result descriptor seen, or NULL */
  view_msg_t *disp;    /* display form of version disp_ver */
  uint64_t disp_ver;
} view_topic_t;

typedef struct view_sub_s {
  void *sock;
  const char *endpoint;
  uv_poll_t poll;
  int have_seq;
  uint64_t last_seq, gaps, seq_resets, messages, malformed;
  uint64_t last_ns;
  int polling; /* poll handle initialised */
} view_sub_t;

typedef struct view_ctl_s view_ctl_t;
typedef struct view_ws_s view_ws_t;

typedef struct view_s {
  const view_opts_t *o;
  uv_loop_t *loop;
  void *zctx;
  struct tool_curve_s *curve; /* CURVE to the daemon (tools/common/curve_opt.h) */
  view_sub_t subs[VIEW_MAX_SUB];
  view_topic_t *topics[VIEW_MAX_TOPICS];
  int ntopics;
  uint64_t topics_overflow, untopical, total;
  uint64_t started_ns;
  uv_idle_t drain_idle; /* resumes draining after a full batch */
  int drain_pending;
  uv_timer_t tick;      /* 1 Hz: topic list, rates */
  uint8_t *buf, *scratch; /* decoded payload, bitshuffle scratch; grow only */
  size_t cap;
  view_msg_t *topics_msg; /* latest topic list */
  uint64_t topics_ver;
  view_msg_t *status_msg; /* latest pipeline status */
  uint64_t status_ver;
  view_ctl_t *ctl;
  view_ws_t *ws;
  int stopping;
} view_t;

/* store.c */
int view_store_open(view_t *v, char *err, size_t errlen);
void view_store_close(view_t *v);
/* After the loop has closed the handles: sockets and memory. */
void view_store_free(view_t *v);
/* Rebuilds the topic list message (called once a second and when a topic
 * appears). */
void view_store_publish_topics(view_t *v);
/* The display message of a topic's newest version, built on first use. */
view_msg_t *view_topic_disp(view_t *v, view_topic_t *t);

/* disp.c: the display form of a decoded message (see docs/viewer.md). */
view_msg_t *view_disp_build(const view_opts_t *o, const char *topic, const beam_msg_t *m,
                            const void *data, json_t *desc, uint64_t t_rx_ns);
/* "raw" form of a message that did not parse: reason, part sizes, and the
 * first bytes in hex. */
view_msg_t *view_disp_raw(const char *topic, zmq_msg_t *parts, size_t nparts, const char *why,
                          uint64_t t_rx_ns);
/* Block mean or max of a float32 h x w image over fy x fx blocks (edge
 * blocks are smaller); out is ceil(h/fy) x ceil(w/fx). NaN and Inf are
 * skipped; a block without a finite value gives NaN. */
void view_downsample(const float *in, uint32_t h, uint32_t w, uint32_t fy, uint32_t fx,
                     int use_max, float *out);

/* ctl.c: polls the control endpoint and sets v->status_msg. */
int view_ctl_open(view_t *v, char *err, size_t errlen);
void view_ctl_close(view_t *v);
void view_ctl_free(view_t *v); /* after the loop closed the handles */

/* ws.c: HTTP + WebSocket server on the loop. */
int view_ws_open(view_t *v, char *err, size_t errlen);
/* Something new to send (a result, the topic list, the status). */
void view_ws_kick(view_t *v);
void view_ws_close(view_t *v);
void view_ws_free(view_t *v); /* after the loop ran out */
int view_ws_clients(const view_t *v);
/* Requests refused so far: wrong or missing token; (loopback mode) a Host,
 * or an upgrade's Origin, that does not name this viewer. */
void view_ws_refused(const view_t *v, uint64_t *token, uint64_t *host, uint64_t *origin);

#endif
