/* The ingest core (input.h): message -> series tracking -> frame -> graph.
 * No sockets and no modes here; the sources (src_*.c) own those and call in.
 *
 * Flow control is where sources differ. Lossless ones check room before
 * each read and pause (the graph calls back when a slot frees up); live
 * ones keep reading, and frames with no room are dropped here (counted as
 * dropped_busy) so the newest keep flowing. Series boundaries are never
 * dropped.
 *
 * Every malformed message is counted, logged (rate-limited) with the reason
 * and dropped; the messages around it are processed normally. */
#include <string.h>

#include "daemon/beamd.h"

static void bad(beamd_t *d, const char *what, const beam_hdr_t *h, const char *why) {
  beamd_ingest_t *in = &d->in;
  if (h)
    beam_log_rl(&in->rl, LOG_WARNING, "input: %s (series %llu frame %llu seq %llu): %s", what,
                (unsigned long long)h->series_id, (unsigned long long)h->frame_id,
                (unsigned long long)h->seq, why);
  else
    beam_log_rl(&in->rl, LOG_WARNING, "input: %s: %s", what, why);
}

/* n frames of the open series will not reach the graph (dropped here or
 * lost on the way): the series says so at its end, and every result of it
 * published from now on is INCOMPLETE (publish.c). */
static void series_lost(beamd_t *d, uint64_t n) {
  if (!d->in.series || !n)
    return;
  d->in.series->missing_frames += n;
  d->in.missing_pending += n;
  d->loss_series_id = d->in.series->series_id;
  d->loss_frames = d->in.series->missing_frames;
}

/* ---- results as frames (input.result_topic) ----------------------------------
 *
 * A daemon chained after another takes the RESULTs of one topic (one per
 * frame, frame_id = the frame's, as a per-frame stage such as correct
 * publishes them) as the frames of each series; results of other topics
 * are skipped and counted (other_topics). The upstream's SERIES_START and
 * SERIES_END are the series boundaries; its start carries the geometry of
 * the upstream's input, so the series starts here with the first result's
 * geometry instead (or the start's, when the series ends without one).
 *
 * Losses: frames that never arrive show up as frame-id gaps (the sequence
 * numbers of an upstream that restarted start again and say nothing), and
 * at the end as results short of the announced nframes; the upstream's own
 * losses come as "missing_frames" on its INCOMPLETE results and end. The
 * series has lost max(gaps, upstream's) frames (the upstream's are gaps
 * here too), plus what this daemon drops itself. */

static int result_mode(const beamd_t *d) { return d->cfg->input.result_topic[0] != 0; }
static void res_series_start(beamd_t *d, beam_series_t *s);

static void res_reset(beamd_ingest_t *in) {
  in->res_have_id = 0;
  in->res_arrived = in->res_next_id = in->res_gap = in->res_up = in->res_counted = 0;
}

static void res_account(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  uint64_t n = in->res_gap > in->res_up ? in->res_gap : in->res_up;
  if (in->series && n > in->res_counted) {
    series_lost(d, n - in->res_counted);
    in->res_counted = n;
  }
}

static void res_gap_add(beamd_t *d, uint64_t n) {
  atomic_fetch_add(&d->in.missing, n);
  d->in.res_gap += n;
}

/* An INCOMPLETE result or end of the upstream: its "missing_frames" is
 * the count so far of that series. */
static void res_upstream(beamd_t *d, const beam_msg_t *m) {
  beamd_ingest_t *in = &d->in;
  uint64_t n;
  if (!beam_msg_missing_frames(m, &n))
    return;
  if (n > in->res_up) {
    atomic_fetch_add(&in->upstream_missing, n - in->res_up);
    in->res_up = n;
  }
  res_account(d);
}

/* The series ends: results short of nframes never came. */
static void res_end(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  uint64_t nf = in->series->nframes;
  if (nf > in->res_arrived && nf - in->res_arrived > in->res_gap)
    res_gap_add(d, nf - in->res_arrived - in->res_gap);
  res_account(d);
  res_reset(in);
}

static void track_seq(beamd_t *d, uint64_t seq) {
  beamd_ingest_t *in = &d->in;
  if (in->have_seq) {
    if (seq > in->last_seq + 1) {
      atomic_fetch_add(&in->gaps, 1);
      atomic_fetch_add(&in->lost, seq - in->last_seq - 1);
      /* Messages lost in transport: with a series open, frames of it. With
       * results as frames they may be results of any topic: the frame-id
       * gaps count them instead. */
      if (!result_mode(d))
        series_lost(d, seq - in->last_seq - 1);
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
  if (result_mode(d))
    res_end(d);
  beam_graph_series_end(d->graph, in->series->series_id, aborted);
  if (aborted)
    atomic_fetch_add(&in->series_aborted, 1);
  beam_series_unref(&in->series);
  beamd_graph_for_start(d); /* a reload waiting for this boundary goes live now */
}

void beamd_ingest_series_start(beamd_t *d, beam_series_t *s) {
  beamd_ingest_t *in = &d->in;
  if (in->series) {
    beam_log_rl(&in->rl, LOG_WARNING, "input: series %llu started while series %llu was open: "
                "that one ended as aborted", (unsigned long long)s->series_id,
                (unsigned long long)in->series->series_id);
    end_series(d, 1);
  }
  /* A reload waiting for a series boundary is swapped in here. */
  beam_graph_t *g = beamd_graph_for_start(d);
  atomic_fetch_add(&in->series_started, 1);
  in->missing_pending = 0; /* losses count for the series they happen in */
  in->series = beam_series_ref(s);
  beamd_publish_series(d, s, BEAM_MSG_SERIES_START, 0);
  BEAM_LOG(LOG_INFO, "series %llu started: %s %ux%u%s", (unsigned long long)s->series_id,
           beam_dtype_name(s->dtype), s->ndim > 0 ? s->shape[s->ndim > 1 ? s->ndim - 2 : 0] : 0,
           s->ndim > 0 ? s->shape[s->ndim - 1] : 0, s->meta_json ? "" : " (no metadata)");
  beam_graph_series_start(g, s); /* takes the creation ref */
}

int beamd_ingest_series_end(beamd_t *d, uint64_t series_id, int aborted) {
  beamd_ingest_t *in = &d->in;
  if (!in->series || in->series->series_id != series_id) {
    atomic_fetch_add(&in->unknown_series, 1);
    beam_log_rl(&in->rl, LOG_WARNING, "input: end of series %llu, which is not open: dropped",
                (unsigned long long)series_id);
    return -1;
  }
  end_series(d, aborted);
  return 0;
}

const beam_series_t *beamd_ingest_series(const beamd_t *d) { return d->in.series; }

void beamd_ingest_missing(beamd_t *d, uint64_t n) {
  atomic_fetch_add(&d->in.missing, n);
  series_lost(d, n);
}

void beamd_ingest_malformed(beamd_t *d, const char *what, const char *why) {
  atomic_fetch_add(&d->in.malformed, 1);
  bad(d, what, NULL, why);
}

static void on_series_start(beamd_t *d, const beam_msg_t *m, const beam_series_array_t *arr) {
  const beam_hdr_t *h = &m->hdr;
  beam_series_t *s = beam_series_new(h->series_id, (beam_dtype_t)h->dtype, h->ndim, h->shape,
                                     m->meta, m->meta ? m->meta_len : 0);
  if (!s) {
    bad(d, "SERIES_START", h, "out of memory");
    return;
  }
  if (arr && beam_series_add_array(s, arr->name, arr->arr.dtype, arr->arr.ndim, arr->arr.shape,
                                   arr->arr.data, arr->arr.nbytes) < 0)
    beam_log_rl(&d->in.rl, LOG_WARNING, "input: series %llu: its \"%s\" array is not kept "
                "(size or memory)", (unsigned long long)h->series_id, arr->name);
  if (result_mode(d))
    res_series_start(d, s); /* takes the creation ref */
  else
    beamd_ingest_series_start(d, s);
}

/* Results as frames: pending series i starts now, with geometry g (that
 * result's header) or, when NULL, the upstream's SERIES_START's; the ones
 * started before it got no result and start (and end) first. */
static void res_start_pending(beamd_t *d, unsigned i, const beam_hdr_t *g) {
  beamd_ingest_t *in = &d->in;
  for (unsigned k = 0; k <= i; k++) {
    beam_series_t *p = in->res_pending[k];
    const beam_hdr_t *gk = k == i ? g : NULL;
    beam_series_t *s = gk ? beam_series_new(p->series_id, (beam_dtype_t)gk->dtype, gk->ndim,
                                            gk->shape, p->meta_json, p->meta_len)
                          : beam_series_ref(p);
    if (!s)
      bad(d, "SERIES_START", gk, "out of memory");
    else
      beamd_ingest_series_start(d, s); /* an open series ends (aborted) first */
    res_reset(in);
    beam_series_unref(&p);
  }
  in->res_npending -= i + 1;
  memmove(in->res_pending, in->res_pending + i + 1, in->res_npending * sizeof in->res_pending[0]);
}

/* The pending series of that id, or -1. */
static int res_find_pending(const beamd_ingest_t *in, uint64_t series_id) {
  for (unsigned k = 0; k < in->res_npending; k++)
    if (in->res_pending[k]->series_id == series_id)
      return (int)k;
  return -1;
}

void beamd__ingest_forget_pending(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  for (unsigned k = 0; k < in->res_npending; k++)
    beam_series_unref(&in->res_pending[k]);
  in->res_npending = 0;
}

/* A daemon publishes a SERIES_START when the series enters its pipeline
 * and the SERIES_END when the pipeline is done with it, so the next start
 * may come before the last results and the end of the series before it.
 * The open series therefore stays open until its end, or until the first
 * result of a later one (then its end was lost: the upstream restarted). */
static void res_series_start(beamd_t *d, beam_series_t *s) {
  beamd_ingest_t *in = &d->in;
  unsigned cap = sizeof in->res_pending / sizeof in->res_pending[0];
  if (in->res_npending == cap)
    res_start_pending(d, 0, NULL); /* the oldest got no result: it starts (and ends) */
  in->res_pending[in->res_npending++] = s;
}

static void on_series_end(beamd_t *d, const beam_msg_t *m) {
  beamd_ingest_t *in = &d->in;
  if (result_mode(d)) {
    int k = res_find_pending(in, m->hdr.series_id);
    if (k >= 0)
      res_start_pending(d, (unsigned)k, NULL);
    if (in->series && in->series->series_id == m->hdr.series_id)
      res_upstream(d, m);
  }
  beamd_ingest_series_end(d, m->hdr.series_id, (m->hdr.flags & BEAM_FLAG_ABORTED) != 0);
}

/* A RESULT on an input with input.result_topic: of that topic, a frame of
 * the series. */
static void on_result(beamd_t *d, const beam_msg_t *m, uint64_t t_recv) {
  beamd_ingest_t *in = &d->in;
  const char *t = d->cfg->input.result_topic;
  if (!m->topic || m->topic_len != strlen(t) || memcmp(m->topic, t, m->topic_len)) {
    atomic_fetch_add(&in->other_topics, 1);
    return;
  }
  const beam_hdr_t *h = &m->hdr;
  int k = res_find_pending(in, h->series_id);
  if (k >= 0)
    res_start_pending(d, (unsigned)k, h);
  if (in->series && in->series->series_id == h->series_id) {
    uint64_t fid = h->frame_id;
    if (!in->res_have_id || fid >= in->res_next_id) {
      if (in->res_have_id && fid > in->res_next_id)
        res_gap_add(d, fid - in->res_next_id);
      in->res_have_id = 1;
      in->res_next_id = fid + 1;
      in->res_arrived++;
    }
    res_account(d);
    res_upstream(d, m);
  }
  /* The result's identity and array as a frame's; the flags that only
   * results have go (this daemon sets its own on what it publishes). */
  beam_msg_t f = *m;
  f.topic = NULL;
  f.topic_len = 0;
  f.hdr.type = BEAM_MSG_FRAME;
  f.hdr.stage_id = 0;
  f.hdr.flags &= ~(uint32_t)(BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL | BEAM_FLAG_ABORTED |
                             BEAM_FLAG_INCOMPLETE | BEAM_FLAG_META);
  f.meta = NULL;
  f.meta_len = 0;
  beamd_ingest_frame(d, &f, t_recv);
}

/* Keeps the buffer holding payload part 0 as frame f's data, without a
 * copy, through the part's owner (input.h): the ZeroMQ message it arrived
 * in, a landing slot, a mapped file. Returns 1 when f took it. */
static int keep_buffer(const beam_msg_t *m, beam_frame_t *f) {
  beam_owner_t *o = m->payload[0].owner;
  return o && !o->taken && o->lend(o, m->payload[0].data, f);
}

/* Zero copy for a raw single-part payload. Not for pinned pools (CUDA
 * copies from page-locked memory faster than the copy costs), and only for
 * buffers aligned for every dtype's loads. */
static int borrow_payload(beamd_t *d, const beam_msg_t *m, beam_frame_t *f) {
  if (m->hdr.codec != BEAM_CODEC_RAW || m->npayload != 1 || beam_graph_input_pinned(d->graph) ||
      ((uintptr_t)m->payload[0].data & 7u))
    return 0;
  return keep_buffer(m, f);
}

/* Lazy decode: an lz4 or bslz4 payload stays encoded where it arrived
 * (kept as above) and is decoded by the first stage that reads the frame,
 * on that stage's thread (beam_frame_decode), so the loop thread, which
 * owns every socket, never decompresses. Not for pinned pools (CUDA
 * stages want the pixels in page-locked memory, decoded here as before).
 * The framing is checked by the decoder; a bad payload reaches the stages
 * as a CORRUPT frame and is reported as a stage error. */
static int borrow_encoded(beamd_t *d, const beam_msg_t *m, beam_frame_t *f) {
  if (m->hdr.codec == BEAM_CODEC_RAW || m->npayload != 1 || beam_graph_input_pinned(d->graph) ||
      !keep_buffer(m, f))
    return 0;
  f->codec = m->hdr.codec;
  f->enc_size = m->payload[0].size;
  f->keep_encoded = (uint8_t)beam_graph_keeps_encoded(d->graph);
  atomic_store(&f->dec_state, BEAM_DEC_PENDING);
  return 1;
}

int beamd_ingest_frame(beamd_t *d, const beam_msg_t *m, uint64_t t_recv) {
  beamd_ingest_t *in = &d->in;
  const beam_hdr_t *h = &m->hdr;
  if (!in->series || in->series->series_id != h->series_id) {
    atomic_fetch_add(&in->unknown_series, 1);
    bad(d, "frame for a series that never started", h, "dropped");
    return 0;
  }
  int corrupt = (h->flags & BEAM_FLAG_CORRUPT) != 0;
  if (!corrupt && !same_geometry(in->series, h)) {
    atomic_fetch_add(&in->shape_mismatch, 1);
    bad(d, "frame geometry differs from its series", h, "dropped");
    series_lost(d, 1);
    return 0;
  }
  if (h->raw_size > d->cfg->pool.frame_bytes) {
    atomic_fetch_add(&in->too_large, 1);
    bad(d, "frame larger than pool.frame_bytes", h, "dropped (raise pool.frame_bytes)");
    series_lost(d, 1);
    return 0;
  }
  /* Live mode reads even when the graph is full (lossless modes pause
   * before reading): such frames are dropped here, counted, and never
   * wait on a stage queue, which would block the loop. */
  beam_frame_t *f = beam_graph_room(d->graph) ? beam_graph_input_slot(d->graph) : NULL;
  if (!f) {
    atomic_fetch_add(&in->dropped_busy, 1);
    series_lost(d, 1);
    return 0;
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
    series_lost(d, 1);
    return 0;
  } else {
    f->nbytes = h->raw_size;
  }
  f->series_id = h->series_id;
  f->frame_id = h->frame_id;
  f->missing_before = (uint32_t)(in->missing_pending > UINT32_MAX ? UINT32_MAX : in->missing_pending);
  in->missing_pending = 0;
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
  return 1;
}

void beamd_ingest_parts(beamd_t *d, const beam_part_t *parts, size_t n) {
  beamd_ingest_parts_array(d, parts, n, NULL);
}

void beamd_ingest_parts_array(beamd_t *d, const beam_part_t *parts, size_t n,
                              const beam_series_array_t *arr) {
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
  track_seq(d, m.hdr.seq);
  switch (m.hdr.type) {
  case BEAM_MSG_SERIES_START: on_series_start(d, &m, arr); break;
  case BEAM_MSG_FRAME: beamd_ingest_frame(d, &m, t_recv); break;
  case BEAM_MSG_SERIES_END: on_series_end(d, &m); break;
  case BEAM_MSG_RESULT: /* frames only with input.result_topic */
    if (result_mode(d)) {
      on_result(d, &m, t_recv);
      break;
    }
    /* fall through */
  default:
    atomic_fetch_add(&in->unexpected, 1);
    bad(d, "unexpected message type on the input", &m.hdr, beam_msg_type_name(m.hdr.type));
  }
}

void beamd_ingest_pause(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  if (!in->paused) {
    in->paused = 1;
    in->paused_since = beam_now_ns();
  }
}

int beamd_ingest_room(beamd_t *d) { return beam_graph_room(d->graph); }
