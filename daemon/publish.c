/* The output side: a PUB for viewers (lossy: ZeroMQ drops for a slow
 * subscriber, the pipeline never waits) and an optional PUSH for lossless
 * consumers (a recorder, the next daemon). Messages that the PUSH cannot
 * take yet wait in order in a backlog; each holds its frame, so a stuck
 * consumer fills the stage pools and backpressure reaches the input.
 *
 * Result pixels are sent zero-copy: the ZeroMQ message points into the
 * frame slot and its free callback (which may run on a ZeroMQ I/O thread)
 * drops the frame reference. */
#include <errno.h>
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"

typedef struct omsg_s {
  char topic[BEAM_TOPIC_MAX + 1];
  uint8_t hdr[BEAM_HDR_SIZE_V1];
  beam_frame_t *frame; /* payload; in the backlog one ref is held */
  char *meta;          /* borrowed when sent at once; an owned copy in the backlog */
  size_t meta_len;
} omsg_t;



#define SMALL_COPY 16384u /* bytes: lossless payloads copied (output.push_copy_buffer) */

static void frame_free(void *data, void *hint) {
  (void)data;
  beam_frame_unref(hint);
}

static void omsg_release(omsg_t *m) {
  if (m->frame)
    beam_frame_unref(m->frame);
  free(m->meta);
  m->frame = NULL;
  m->meta = NULL;
}

/* PUB payloads are copies counted against output.pub_buffer: a message
 * queued for a subscriber that does not read must not hold a stage's
 * output slot (that would stall the pipeline for one slow viewer), and
 * the copies must not grow without bound either. */
typedef struct pubcopy_s {
  beamd_out_t *o;
  size_t n;
} pubcopy_t;

static void pubcopy_free(void *data, void *hint) {
  pubcopy_t *pc = hint;
  atomic_fetch_sub(&pc->o->copy_bytes, pc->n);
  (void)data;
  free(pc);
}

/* A copy of f's payload counted against o's budget of copies queued inside
 * ZeroMQ. Returns 0, or 1 when the budget is spent or memory is short. */
static int copy_msg(beamd_out_t *o, beam_frame_t *f, zmq_msg_t *zm) {
  size_t n = f->nbytes;
  if (atomic_fetch_add(&o->copy_bytes, n) + n > o->copy_budget) {
    atomic_fetch_sub(&o->copy_bytes, n);
    return 1;
  }
  pubcopy_t *pc = malloc(sizeof *pc + n);
  if (!pc) {
    atomic_fetch_sub(&o->copy_bytes, n);
    return 1;
  }
  pc->o = o;
  pc->n = n;
  if (n)
    memcpy(pc + 1, f->data, n);
  zmq_msg_init_data(zm, pc + 1, n, pubcopy_free, pc);
  return 0;
}

/* The payload part: a budgeted copy for the PUB, and for lossless outputs
 * zero copy (the frame is held until sent, which is the backpressure).
 * Returns 0, or 1 when the PUB budget is spent (nothing queued).
 *
 * A small lossless payload (a ROI sum, a g2 row, PCA scores) is copied
 * too, within its own budget: held zero-copy, its last unref falls to
 * ZeroMQ's I/O thread, a pool lock and a cross-thread wake-up per result,
 * and a stage with a few output slots waits on the consumer's socket. */
static int payload_msg(beamd_out_t *o, beam_frame_t *f, zmq_msg_t *zm) {
  if (!o->lossless)
    return copy_msg(o, f, zm);
  if (f->nbytes <= SMALL_COPY && copy_msg(o, f, zm) == 0)
    return 0;
  beam_frame_ref(f, 1);
  zmq_msg_init_data(zm, f->data, f->nbytes, frame_free, f);
  return 0;
}

/* 0 sent (frame ref consumed by ZeroMQ), 1 would block or no PUB budget
 * (nothing sent, m untouched), < 0 error (nothing sent). */
static int omsg_send(beamd_out_t *o, omsg_t *m) {
  void *sock = o->zs.sock;
  int more = ZMQ_SNDMORE;
  int last_hdr = !m->frame && !m->meta;
  zmq_msg_t zm;
  if (m->frame && payload_msg(o, m->frame, &zm) != 0)
    return 1;
  if (zmq_send(sock, m->topic, strlen(m->topic), ZMQ_DONTWAIT | more) < 0) {
    if (m->frame)
      zmq_msg_close(&zm); /* releases the copy or the frame reference */
    return errno == EAGAIN ? 1 : -1;
  }
  /* After the first part the rest of a multipart message cannot block. */
  zmq_send(sock, m->hdr, sizeof m->hdr, last_hdr ? 0 : ZMQ_SNDMORE);
  if (m->frame)
    zmq_msg_send(&zm, sock, m->meta ? ZMQ_SNDMORE : 0);
  if (m->meta)
    zmq_send(sock, m->meta, m->meta_len, 0);
  return 0;
}

/* ZMQ_FD stays readable until ZeroMQ has processed the socket's pending
 * commands (a peer connecting or leaving, a pipe with room again), which
 * only a send, a receive or ZMQ_EVENTS does. A handler that did none of
 * them would leave it readable, and the loop would spin a core for as long
 * as that lasts. */
static void on_push_event(beamd_zsock_t *zs) {
  beamd_publish_flush(zs->d);
  /* Room may have come with the commands ZMQ_EVENTS just processed: the
   * FD will not say so again. */
  while ((beamd_zsock_events(zs) & ZMQ_POLLOUT) && zs->d->push.pending.count) {
    size_t before = zs->d->push.pending.count;
    beamd_publish_flush(zs->d);
    if (zs->d->push.pending.count == before)
      break;
  }
}
static void on_pub_event(beamd_zsock_t *zs) { beamd_zsock_events(zs); }

void beamd_publish_budgets(beamd_t *d) {
  d->pub.copy_budget = d->cfg->output.pub_buffer;
  d->push.copy_budget = d->cfg->output.push_copy_buffer;
}

int beamd_publish_open(beamd_t *d, char *err, size_t errlen) {
  const beam_config_t *c = d->cfg;
  char zerr[512];
  d->pub.name = "publish";
  d->push.name = "push";
  d->push.lossless = 1;
  beam_fifo_init(&d->push.pending, sizeof(omsg_t));
  beamd_publish_budgets(d);
  if (c->output.publish[0]) {
    beamd_zopts_t o = {.sndhwm = c->output.hwm, .sec = &c->output.publish_sec,
                       .what = "output.publish"};
    if (beamd_zsock_open(d, &d->pub.zs, ZMQ_PUB, c->output.publish, 1, &o, on_pub_event, zerr,
                         sizeof zerr) < 0) {
      snprintf(err, errlen, "output.publish: %s", zerr);
      return BEAM_EIO;
    }
  }
  if (c->output.push[0]) {
    beamd_zopts_t o = {.sndhwm = c->output.push_hwm, .immediate = 1, .sec = &c->output.push_sec,
                       .what = "output.push"};
    if (beamd_zsock_open(d, &d->push.zs, ZMQ_PUSH, c->output.push, 1, &o, on_push_event, zerr,
                         sizeof zerr) < 0) {
      snprintf(err, errlen, "output.push: %s", zerr);
      return BEAM_EIO;
    }
  }
  return beamd_karabo_open(d, err, errlen);
}

static void out_send(beamd_t *d, beamd_out_t *o, omsg_t *m) {
  /* Each endpoint numbers its own messages so receivers can count gaps. */
  uint64_t seq = o->seq++;
  beam_hdr_set_seq(m->hdr, seq);
  size_t bytes = sizeof m->hdr + (m->frame ? m->frame->nbytes : 0) + m->meta_len;
  if (!o->lossless) {
    if (omsg_send(o, m) == 0) {
      atomic_fetch_add(&o->messages, 1);
      atomic_fetch_add(&o->bytes, bytes);
    } else {
      atomic_fetch_add(&o->dropped, 1);
    }
    return;
  }
  beam_fifo_t *q = &o->pending;
  if (o->discard) {
    /* Draining past output.drain_timeout with no consumer: count, drop. */
    if (omsg_send(o, m) != 0)
      atomic_fetch_add(&o->dropped, 1);
    return;
  }
  if (q->count == 0) {
    int rc = omsg_send(o, m);
    if (rc == 0) {
      atomic_fetch_add(&o->messages, 1);
      atomic_fetch_add(&o->bytes, bytes);
      return;
    }
    if (rc < 0) {
      atomic_fetch_add(&o->dropped, 1);
      return;
    }
    o->blocked_since = o->progress_ns = beam_now_ns();
  }
  /* Keep it (with its own references) until the consumer takes it. */
  omsg_t keep = *m;
  if (keep.frame)
    beam_frame_ref(keep.frame, 1);
  if (keep.meta) {
    keep.meta = malloc(m->meta_len);
    if (keep.meta)
      memcpy(keep.meta, m->meta, m->meta_len);
  }
  if ((m->meta && !keep.meta) || beam_fifo_push(q, &keep) < 0) {
    omsg_release(&keep);
    atomic_fetch_add(&o->dropped, 1);
    BEAM_LOG(LOG_ERR, "output.push: out of memory, a message was dropped");
  }
}

void beamd_publish_flush(beamd_t *d) {
  beamd_out_t *o = &d->push;
  if (!o->zs.open)
    return;
  omsg_t *m;
  while ((m = beam_fifo_front(&o->pending))) {
    if (omsg_send(o, m) != 0)
      return;
    o->progress_ns = beam_now_ns();
    atomic_fetch_add(&o->messages, 1);
    atomic_fetch_add(&o->bytes, sizeof m->hdr + (m->frame ? m->frame->nbytes : 0) + m->meta_len);
    omsg_release(m);
    beam_fifo_pop(&o->pending, NULL);
  }
  if (o->blocked_since) {
    o->blocked_ns += beam_now_ns() - o->blocked_since;
    o->blocked_since = 0;
  }
}

void beamd_publish_discard(beamd_t *d) {
  beamd_out_t *o = &d->push;
  o->discard = 1;
  omsg_t m;
  while (beam_fifo_pop(&o->pending, &m)) {
    omsg_release(&m);
    atomic_fetch_add(&o->dropped, 1);
  }
}

int beamd_publish_backlog(beamd_t *d) { return (int)d->push.pending.count; }

double beamd_publish_stall(beamd_t *d, uint64_t now) {
  beamd_out_t *o = &d->push;
  if (!o->zs.open || o->discard || o->pending.count == 0) {
    if (o->stall_reported)
      BEAM_LOG(LOG_NOTICE, "output.push (%s): a consumer takes messages again",
               d->cfg->output.push);
    o->stall_reported = 0;
    return 0;
  }
  double s = (double)(now - o->progress_ns) * 1e-9;
  if (s < BEAMD_STALL_LOG_S)
    return 0;
  /* Lossless by design: held messages hold frames, and the input waits. */
  if (!o->stall_reported || (double)(now - o->stall_logged_ns) * 1e-9 >= BEAMD_STALL_REPEAT_S) {
    BEAM_LOG(LOG_WARNING,
             "output.push (%s): no consumer has taken a message for %.0f s; %zu results "
             "wait and the pipeline is held (lossless output: connect a consumer, or "
             "stop with a drain timeout to drop them)",
             d->cfg->output.push, s, o->pending.count);
    o->stall_logged_ns = now;
    o->stall_reported = 1;
  }
  return s;
}

static void send_all(beamd_t *d, omsg_t *m) {
  if (d->pub.zs.open)
    out_send(d, &d->pub, m);
  if (d->push.zs.open)
    out_send(d, &d->push, m);
}

static int want_desc(beamd_t *d, const beam_frame_t *f, uint64_t now) {
  beamd_desc_seen_t *slot = NULL, *oldest = &d->desc_seen[0];
  for (int i = 0; i < BEAMD_DESC_SLOTS; i++) {
    beamd_desc_seen_t *s = &d->desc_seen[i];
    if (s->pool == f->pool && s->series_id == f->series_id) {
      slot = s;
      break;
    }
    if (s->last_ns < oldest->last_ns)
      oldest = s;
  }
  if (slot && now - slot->last_ns < 1000000000ull && !(f->flags & BEAM_FLAG_FINAL))
    return 0;
  if (!slot) {
    slot = oldest;
    slot->pool = f->pool;
    slot->series_id = f->series_id;
  }
  slot->last_ns = now;
  return 1;
}

void beamd_publish_result(beamd_t *d, beam_frame_t *f) {
  uint64_t now = beam_now_ns();
  const char *desc = beam_pool_desc(f->pool);
  omsg_t m = {0};
  snprintf(m.topic, sizeof m.topic, "%s", beam_pool_topic(f->pool));
  /* A result of a series that has lost frames is marked INCOMPLETE and
   * says how many in its metadata: the descriptor goes with every such
   * result, with "missing_frames" added. */
  int lossy = d->loss_frames && f->series_id == d->loss_series_id;
  char lossbuf[8192];
  if (lossy) {
    /* f may be shared with stages reading it: the flag goes in the header. */
    if (desc && beam_meta_with_missing(desc, d->loss_frames, lossbuf, sizeof lossbuf) > 0)
      desc = lossbuf;
  }
  int with_desc = desc && (want_desc(d, f, now) || lossy);
  beam_hdr_t h = {0};
  h.type = BEAM_MSG_RESULT;
  h.flags = (f->flags & ~(uint32_t)BEAM_FLAG_META) | (with_desc ? BEAM_FLAG_META : 0u) |
            (lossy ? BEAM_FLAG_INCOMPLETE : 0u);
  h.series_id = f->series_id;
  h.frame_id = f->frame_id;
  h.t_acq_ns = f->t_acq_ns;
  h.t_send_ns = beam_realtime_ns();
  h.dtype = (uint8_t)f->dtype;
  h.ndim = (uint8_t)f->ndim;
  memcpy(h.shape, f->shape, sizeof h.shape);
  h.codec = BEAM_CODEC_RAW;
  h.nparts = 1;
  h.raw_size = f->nbytes;
  h.payload_size = f->nbytes;
  memcpy(h.pos, f->pos, sizeof h.pos);
  if (with_desc) {
    m.meta = (char *)desc;
    m.meta_len = strlen(desc);
    h.meta_size = (uint32_t)m.meta_len;
  }
  beam_hdr_encode(&h, m.hdr, sizeof m.hdr);
  /* m.meta borrows the pool's descriptor: out_send copies what it keeps. */
  m.frame = f;
  send_all(d, &m);
  beamd_karabo_result(d, f);
  atomic_fetch_add(&d->pub.results, 1);
  if (f->t_recv_ns)
    beam_hist_add(&d->e2e, now - f->t_recv_ns);
  beam_frame_unref(f);
}

void beamd_publish_series(beamd_t *d, const beam_series_t *s, int type, int aborted) {
  if (!d->cfg->output.publish_frames_meta)
    return;
  omsg_t m = {0};
  snprintf(m.topic, sizeof m.topic, "beamd.series");
  beam_hdr_t h = {0};
  h.type = (uint16_t)type;
  h.series_id = s->series_id;
  h.t_send_ns = beam_realtime_ns();
  h.dtype = (uint8_t)s->dtype;
  h.ndim = (uint8_t)s->ndim;
  memcpy(h.shape, s->shape, sizeof h.shape);
  h.raw_size = 0;
  h.flags = aborted ? BEAM_FLAG_ABORTED : 0;
  char endmeta[64];
  if (type == BEAM_MSG_SERIES_END && s->missing_frames) {
    h.flags |= BEAM_FLAG_INCOMPLETE;
    /* How many: the metadata part of an INCOMPLETE SERIES_END. */
    m.meta_len = (size_t)beam_meta_with_missing(NULL, s->missing_frames, endmeta, sizeof endmeta);
    m.meta = endmeta;
    h.flags |= BEAM_FLAG_META;
    h.meta_size = (uint32_t)m.meta_len;
  }
  if (type == BEAM_MSG_SERIES_START) {
    /* raw_size describes the series' frames; no payload part follows. */
    h.raw_size = beam_geom_bytes(s->dtype, s->ndim, s->shape);
  }
  if (type == BEAM_MSG_SERIES_START && s->meta_json) {
    m.meta = s->meta_json;
    m.meta_len = s->meta_len;
    h.flags |= BEAM_FLAG_META;
    h.meta_size = (uint32_t)s->meta_len;
  }
  beam_hdr_encode(&h, m.hdr, sizeof m.hdr);
  send_all(d, &m);
}

void beamd_publish_stats(beamd_t *d, const char *json) {
  /* PROTOCOL.md: a RESULT whose payload is the JSON as 1-D uint8, no
   * metadata part. For viewers only: the lossless PUSH carries results. */
  if (!d->pub.zs.open)
    return;
  size_t len = strlen(json);
  beam_hdr_t h = {0};
  h.type = BEAM_MSG_RESULT;
  h.t_send_ns = beam_realtime_ns();
  h.seq = d->pub.seq++;
  h.dtype = BEAM_DT_U8;
  h.ndim = 1;
  h.shape[0] = (uint32_t)len;
  h.codec = BEAM_CODEC_RAW;
  h.nparts = 1;
  h.raw_size = h.payload_size = len;
  uint8_t hdr[BEAM_HDR_SIZE_V1];
  beam_hdr_encode(&h, hdr, sizeof hdr);
  void *s = d->pub.zs.sock;
  if (zmq_send(s, "beamd.stats", 11, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
    atomic_fetch_add(&d->pub.dropped, 1);
    return;
  }
  zmq_send(s, hdr, sizeof hdr, ZMQ_SNDMORE);
  zmq_send(s, json, len, 0);
  atomic_fetch_add(&d->pub.messages, 1);
  atomic_fetch_add(&d->pub.bytes, sizeof hdr + len);
}

void beamd_publish_unwatch(beamd_t *d) {
  beamd_zsock_unwatch(&d->pub.zs);
  beamd_zsock_unwatch(&d->push.zs);
  beamd_karabo_unwatch(d);
}

void beamd_publish_close(beamd_t *d, int linger_ms) {
  omsg_t m;
  while (beam_fifo_pop(&d->push.pending, &m))
    omsg_release(&m);
  beam_fifo_free(&d->push.pending);
  beamd_zsock_close(&d->pub.zs, linger_ms);
  beamd_zsock_close(&d->push.zs, linger_ms);
  beamd_karabo_close(d, linger_ms);
}
