/* The input side: one ZeroMQ socket (SUB for live, PULL for lossless),
 * message decoding into input pool slots, series tracking, gap counting.
 *
 * Flow control is where the two modes differ. Lossless (pull): when the
 * graph has no room we stop reading, ZeroMQ's queues fill and the sender
 * blocks; reading resumes when a slot or queue place frees up. Live: we keep
 * reading and drop frames we have no room for (counted as dropped_busy), so
 * the newest frames keep flowing; frames ZeroMQ dropped before us show up as
 * sequence gaps. Series messages are never dropped in either mode.
 *
 * Every malformed message is counted, logged (rate-limited) with the reason
 * and dropped; the messages around it are processed normally. */
#include <errno.h>
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"

#define MAX_PARTS (BEAM_MAX_PAYLOAD_PARTS + 3)
/* Messages handled per wake-up before yielding to the rest of the loop. */
#define BATCH 256

static void ingest_read(beamd_t *d);

static void on_input_event(beamd_zsock_t *zs) { ingest_read(zs->d); }

static void more_cb(uv_idle_t *h) { ingest_read(h->data); }

static void set_more(beamd_ingest_t *in, int on) {
  if (on && !in->more_on)
    uv_idle_start(&in->more, more_cb);
  else if (!on && in->more_on)
    uv_idle_stop(&in->more);
  in->more_on = on;
}

int beamd_ingest_open(beamd_t *d, char *err, size_t errlen) {
  beamd_ingest_t *in = &d->in;
  const beam_config_t *c = d->cfg;
  in->scratch_len = c->pool.frame_bytes;
  in->scratch = malloc(in->scratch_len ? in->scratch_len : 1);
  if (!in->scratch) {
    snprintf(err, errlen, "input: cannot allocate %llu bytes of decode scratch",
             (unsigned long long)in->scratch_len);
    return BEAM_ENOMEM;
  }
  beam_ratelimit_init(&in->rl, c->log.rate_limit);
  int type;
  switch (c->input.mode) {
  case BEAM_IN_LIVE: type = ZMQ_SUB; break;
  case BEAM_IN_PULL: type = ZMQ_PULL; break;
  default: return beamd_replay_open(d, err, errlen);
  }
  beamd_zopts_t o = {.rcvhwm = c->input.hwm};
  char zerr[512];
  int rc = beamd_zsock_open(d, &in->zs, type, c->input.endpoint, c->input.bind, &o,
                            on_input_event, zerr, sizeof zerr);
  if (rc < 0) {
    snprintf(err, errlen, "input: %s", zerr);
    return rc;
  }
  return 0;
}

static int lossless(const beamd_t *d) { return d->cfg->input.mode != BEAM_IN_LIVE; }

static void bad(beamd_t *d, const char *what, const beam_hdr_t *h, const char *why) {
  beamd_ingest_t *in = &d->in;
  if (h)
    beam_log_rl(&in->rl, LOG_WARNING, "input: %s (series %llu frame %llu seq %llu): %s", what,
                (unsigned long long)h->series_id, (unsigned long long)h->frame_id,
                (unsigned long long)h->seq, why);
  else
    beam_log_rl(&in->rl, LOG_WARNING, "input: %s: %s", what, why);
}

static void track_seq(beamd_ingest_t *in, uint64_t seq) {
  if (in->have_seq) {
    if (seq > in->last_seq + 1) {
      atomic_fetch_add(&in->gaps, 1);
      atomic_fetch_add(&in->lost, seq - in->last_seq - 1);
    } else if (seq <= in->last_seq) {
      /* The sender restarted (or a second sender appeared): re-base. */
      atomic_fetch_add(&in->seq_resets, 1);
    }
  }
  in->have_seq = 1;
  in->last_seq = seq;
}

static int same_geometry(const beam_series_t *s, const beam_hdr_t *h) {
  if (s->dtype != h->dtype || s->ndim != h->ndim)
    return 0;
  for (unsigned i = 0; i < h->ndim; i++)
    if (s->shape[i] != h->shape[i])
      return 0;
  return 1;
}

static void end_series(beamd_t *d, int aborted) {
  beamd_ingest_t *in = &d->in;
  if (!in->series)
    return;
  beam_graph_series_end(d->graph, in->series->series_id, aborted);
  if (aborted)
    atomic_fetch_add(&in->series_aborted, 1);
  beam_series_unref(&in->series);
  beamd_graph_for_start(d); /* a reload waiting for this boundary goes live now */
}

static void on_series_start(beamd_t *d, const beam_msg_t *m) {
  beamd_ingest_t *in = &d->in;
  const beam_hdr_t *h = &m->hdr;
  if (in->series) {
    bad(d, "SERIES_START while a series is open", h, "previous series ended as aborted");
    end_series(d, 1);
  }
  /* A reload waiting for a series boundary is swapped in here. */
  beam_graph_t *g = beamd_graph_for_start(d);
  beam_series_t *s = beam_series_new(h->series_id, (beam_dtype_t)h->dtype, h->ndim, h->shape,
                                     m->meta, m->meta ? m->meta_len : 0);
  if (!s) {
    bad(d, "SERIES_START", h, "out of memory");
    return;
  }
  atomic_fetch_add(&in->series_started, 1);
  in->series = beam_series_ref(s);
  beamd_publish_series(d, s, BEAM_MSG_SERIES_START, 0);
  beam_graph_series_start(g, s); /* takes the creation ref */
  BEAM_LOG(LOG_INFO, "series %llu started: %s %ux%u%s", (unsigned long long)h->series_id,
           beam_dtype_name((beam_dtype_t)h->dtype), h->ndim > 0 ? h->shape[h->ndim > 1 ? h->ndim - 2 : 0] : 0,
           h->ndim > 0 ? h->shape[h->ndim - 1] : 0, m->meta ? "" : " (no metadata)");
}

static void on_series_end(beamd_t *d, const beam_msg_t *m) {
  beamd_ingest_t *in = &d->in;
  if (!in->series || in->series->series_id != m->hdr.series_id) {
    atomic_fetch_add(&in->unknown_series, 1);
    bad(d, "SERIES_END for a series that is not open", &m->hdr, "dropped");
    return;
  }
  end_series(d, (m->hdr.flags & BEAM_FLAG_ABORTED) != 0);
}

static void release_zmsg(beam_frame_t *f, void *ctx) {
  (void)ctx;
  zmq_msg_close((zmq_msg_t *)f->user);
}

/* Keeps the buffer holding payload part 0 as frame f's data, without a
 * copy: the file it lies in (replay reading in place, filemap.h), a landing
 * slot the replay server read it into (landing.c), or the
 * ZeroMQ message it arrived in, which the slot keeps until its last
 * reference goes. Returns 1 when f took it. */
static int keep_buffer(beamd_t *d, const beam_msg_t *m, beam_frame_t *f) {
  beamd_ingest_t *in = &d->in;
  if (in->cur_fmap && !in->cur_fmap_taken &&
      beam_fmap_base(in->cur_fmap) + in->cur_fmap_off == m->payload[0].data) {
    beam_fmap_lend(in->cur_fmap, in->cur_fmap_off, f);
    in->cur_fmap_taken = 1;
    return 1;
  }
  if (in->cur_land && !in->cur_land_taken &&
      beamd_landing_ptr(in->cur_land, in->cur_land_idx) == m->payload[0].data) {
    beamd_landing_lend(in->cur_land, in->cur_land_idx, f);
    in->cur_land_taken = 1;
    return 1;
  }
  zmq_msg_t *z = in->cur_zparts;
  for (size_t k = 0; z && f->user && k < in->cur_nz; k++)
    if (zmq_msg_data(&z[k]) == m->payload[0].data) {
      zmq_msg_t *keep = f->user;
      zmq_msg_init(keep);
      zmq_msg_move(keep, &z[k]);
      f->data = zmq_msg_data(keep);
      f->release = release_zmsg;
      f->release_ctx = NULL;
      return 1;
    }
  return 0;
}

/* Zero copy for a raw single-part payload. Not for pinned pools (CUDA
 * copies from page-locked memory faster than the copy costs), and only for
 * buffers aligned for every dtype's loads. */
static int borrow_payload(beamd_t *d, const beam_msg_t *m, beam_frame_t *f) {
  if (m->hdr.codec != BEAM_CODEC_RAW || m->npayload != 1 || beam_graph_input_pinned(d->graph) ||
      ((uintptr_t)m->payload[0].data & 7u))
    return 0;
  return keep_buffer(d, m, f);
}

/* Lazy decode: an lz4 or bslz4 payload stays encoded where it arrived
 * (kept as above) and is decoded by the first stage that reads the frame,
 * on that stage's thread (beam_frame_decode), so the loop thread, which
 * owns every socket, never decompresses. Not for pinned pools (CUDA
 * stages want the pixels in page-locked memory, decoded here as before).
 * The framing is checked by the decoder; a bad payload reaches the stages
 * as a CORRUPT frame and is reported as a stage error. */
static int borrow_encoded(beamd_t *d, const beam_msg_t *m, beam_frame_t *f) {
  if ((m->hdr.codec != BEAM_CODEC_LZ4 && m->hdr.codec != BEAM_CODEC_BSLZ4) || m->npayload != 1 ||
      beam_graph_input_pinned(d->graph) || !keep_buffer(d, m, f))
    return 0;
  f->codec = m->hdr.codec;
  f->enc_size = m->payload[0].size;
  f->keep_encoded = (uint8_t)beam_graph_keeps_encoded(d->graph);
  atomic_store(&f->dec_state, BEAM_DEC_PENDING);
  return 1;
}

static void on_frame(beamd_t *d, const beam_msg_t *m, uint64_t t_recv) {
  beamd_ingest_t *in = &d->in;
  const beam_hdr_t *h = &m->hdr;
  if (!in->series || in->series->series_id != h->series_id) {
    atomic_fetch_add(&in->unknown_series, 1);
    bad(d, "frame for a series that never started", h, "dropped");
    return;
  }
  int corrupt = (h->flags & BEAM_FLAG_CORRUPT) != 0;
  if (!corrupt && !same_geometry(in->series, h)) {
    atomic_fetch_add(&in->shape_mismatch, 1);
    bad(d, "frame geometry differs from its series", h, "dropped");
    return;
  }
  if (h->raw_size > d->cfg->pool.frame_bytes) {
    atomic_fetch_add(&in->too_large, 1);
    bad(d, "frame larger than pool.frame_bytes", h, "dropped (raise pool.frame_bytes)");
    return;
  }
  /* Live mode reads even when the graph is full (lossless modes pause
   * before reading): such frames are dropped here, counted, and never
   * wait on a stage queue, which would block the loop. */
  beam_frame_t *f = beam_graph_room(d->graph) ? beam_graph_input_slot(d->graph) : NULL;
  if (!f) {
    atomic_fetch_add(&in->dropped_busy, 1);
    return;
  }
  const char *why = NULL;
  if (corrupt) {
    f->nbytes = 0;
    atomic_fetch_add(&in->corrupt, 1);
  } else if (borrow_payload(d, m, f) || borrow_encoded(d, m, f)) {
    f->nbytes = h->raw_size;
  } else if (beam_msg_payload(m, f->data, in->scratch, &why) < 0) {
    atomic_fetch_add(&in->malformed, 1);
    bad(d, "undecodable payload", h, why ? why : "?");
    beam_frame_unref(f);
    return;
  } else {
    f->nbytes = h->raw_size;
  }
  f->series_id = h->series_id;
  f->frame_id = h->frame_id;
  f->seq = h->seq;
  f->ingest_idx = in->fed_next++;
  f->t_acq_ns = h->t_acq_ns;
  f->t_recv_ns = t_recv;
  f->flags = h->flags & ~(uint32_t)BEAM_FLAG_META;
  f->dtype = (beam_dtype_t)h->dtype;
  f->ndim = h->ndim;
  memcpy(f->shape, h->shape, sizeof f->shape);
  memcpy(f->pos, h->pos, sizeof f->pos);
  atomic_fetch_add(&in->frames, 1);
  atomic_fetch_add(&in->bytes, h->payload_size);
  beam_graph_frame(d->graph, f);
}

/* Receives one multipart message into parts; returns the part count, 0 on
 * EAGAIN, or -1 when the message had too many parts (drained and dropped). */
static int recv_parts(void *sock, zmq_msg_t *parts) {
  int n = 0, more = 1, overflow = 0;
  while (more) {
    zmq_msg_t *p = &parts[n < MAX_PARTS ? n : MAX_PARTS - 1];
    if (n >= MAX_PARTS) {
      overflow = 1;
      zmq_msg_close(p);
    }
    zmq_msg_init(p);
    if (zmq_msg_recv(p, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(p);
      return 0; /* only the first part can EAGAIN: multipart delivery is atomic */
    }
    more = zmq_msg_more(p);
    if (n < MAX_PARTS)
      n++;
  }
  if (overflow) {
    for (int i = 0; i < n; i++)
      zmq_msg_close(&parts[i]);
    return -1;
  }
  return n;
}

static void handle(beamd_t *d, zmq_msg_t *zparts, int n) {
  beam_part_t parts[MAX_PARTS];
  for (int i = 0; i < n; i++) {
    parts[i].data = zmq_msg_data(&zparts[i]);
    parts[i].size = zmq_msg_size(&zparts[i]);
  }
  d->in.cur_zparts = zparts;
  d->in.cur_nz = (size_t)n;
  beamd_ingest_handle(d, parts, (size_t)n);
  d->in.cur_zparts = NULL;
  d->in.cur_nz = 0;
}

void beamd_ingest_handle(beamd_t *d, const beam_part_t *parts, size_t n) {
  beamd_ingest_t *in = &d->in;
  uint64_t t_recv = beam_now_ns();
  beam_limits_t lim = beam_limits_default;
  const char *why = NULL;
  beam_msg_t m;
  atomic_fetch_add(&in->messages, 1);
  if (beam_msg_parse(parts, n, &lim, &m, &why) < 0) {
    atomic_fetch_add(&in->malformed, 1);
    bad(d, "malformed message", NULL, why ? why : "?");
    return;
  }
  track_seq(in, m.hdr.seq);
  switch (m.hdr.type) {
  case BEAM_MSG_SERIES_START: on_series_start(d, &m); break;
  case BEAM_MSG_FRAME: on_frame(d, &m, t_recv); break;
  case BEAM_MSG_SERIES_END: on_series_end(d, &m); break;
  default:
    atomic_fetch_add(&in->unexpected, 1);
    bad(d, "unexpected message type on the input", &m.hdr, beam_msg_type_name(m.hdr.type));
  }
}

static void pause_input(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  if (!in->paused) {
    in->paused = 1;
    in->paused_since = beam_now_ns();
  }
}

/* Returning without a receive would leave ZMQ_FD readable while commands
 * (a peer leaving, say) wait in the socket, and the loop would spin on it:
 * ZMQ_EVENTS processes them. Whoever reads next reads until EAGAIN. */
static void settle(beamd_ingest_t *in) {
  if (in->zs.open && !in->zs.unwatched)
    beamd_zsock_events(&in->zs);
}

static void ingest_burst(beamd_t *d);

/* The frames of one burst wake a stage once per few frames (as a replay
 * reply's do), and all of them at the burst's end. */
static void ingest_read(beamd_t *d) {
  beam_graph_batch(d->graph, 1);
  ingest_burst(d);
  beam_graph_batch(d->graph, 0);
}

static void ingest_burst(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  int draining = d->state == BEAMD_DRAINING && in->drain_read;
  if (!in->zs.open || in->stopped || (d->state != BEAMD_RUNNING && !draining)) {
    set_more(in, 0);
    settle(in);
    return;
  }
  zmq_msg_t parts[MAX_PARTS];
  for (int i = 0; i < BATCH; i++) {
    if (lossless(d) && !beam_graph_room(d->graph)) {
      /* The graph calls back (beamd_ingest_resume) when room appears. */
      pause_input(d);
      set_more(in, 0);
      settle(in);
      return;
    }
    int n = recv_parts(in->zs.sock, parts);
    if (n == 0) {
      set_more(in, 0);
      if (draining)
        beamd_input_drained(d); /* everything delivered to us is in the graph */
      return;
    }
    if (n < 0) {
      atomic_fetch_add(&in->messages, 1);
      atomic_fetch_add(&in->malformed, 1);
      bad(d, "malformed message", NULL, "too many parts");
      continue;
    }
    handle(d, parts, n);
    for (int k = 0; k < n; k++)
      zmq_msg_close(&parts[k]);
  }
  /* More may be queued; ZMQ_FD will not fire again for it, so come back
   * on the next loop iteration after other handles had their turn. */
  set_more(in, 1);
}

void beamd_ingest_resume(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  if (in->paused) {
    in->paused = 0;
    in->paused_ns += beam_now_ns() - in->paused_since;
  }
  if (d->cfg->input.mode == BEAM_IN_REPLAY)
    beamd_replay_pump(d);
  else
    ingest_read(d);
}

void beamd_ingest_pause(beamd_t *d) { pause_input(d); }

void beamd_ingest_stop(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  in->stopped = 1;
  set_more(in, 0);
  if (in->zs.open && in->zs.polling) {
    uv_poll_stop(&in->zs.poll);
    in->zs.polling = 0;
  }
  /* An open series is ended as aborted by beam_graph_shutdown; forget it
   * here so a late SERIES_END is not matched against it. */
  beam_series_unref(&in->series);
}

void beamd_ingest_close(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  beamd_replay_close(d);
  beamd_zsock_close(&in->zs, 0);
  if (!uv_is_closing((uv_handle_t *)&in->more))
    uv_close((uv_handle_t *)&in->more, NULL);
  beam_series_unref(&in->series);
  free(in->scratch);
  in->scratch = NULL;
}
