/* Source dectris: a DECTRIS detector's stream, SIMPLON stream v1 (JSON
 * multipart, EIGER) or v2 (one CBOR message per event, EIGER2, PSI
 * Jungfraujoch), over a PULL connected to the detector's PUSH, or over one
 * PULL per socket of an image stream split over several (Jungfraujoch's
 * writers), merged back into image-id order here. Lossless: when beamd is
 * full it stops reading and the detector's send queue fills.
 *
 * This file reads the sockets and decodes each message (proto/dectris*.c:
 * pure, borrowed); dectris_series.c holds the series it feeds. A message
 * that does not decode is counted with its reason and dropped; the
 * messages around it go on. */
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"
#include "daemon/dectris_series.h"
#include "proto/dectris.h"

#define MAX_STREAMS 16

static int endpoint_given(const beam_cnode_t *v) {
  beam_cfg_endpoint_t ep;
  return beam_cfg_endpoint(v, &ep) == 0 && ep.address[0];
}

static const char *endpoints_valid(const beam_cnode_t *v) {
  if (v->n + 1 > MAX_STREAMS)
    return "at most 15 further endpoints";
  for (size_t i = 0; i < v->n; i++)
    if (!endpoint_given(v->items[i]))
      return "an endpoint cannot be \"\"";
  return NULL;
}

/* In the order of the format enum's choices. */
enum { FMT_AUTO = 0, FMT_V1 = 1, FMT_V2 = 2 };

const beam_param_t beamd_dectris_params[] = {
    {"format", BEAM_P_ENUM, "auto", 0, 0, 0, "auto|v1|v2", NULL,
     "stream format: v1 = SIMPLON legacy JSON (stream format legacy), v2 = CBOR (format cbor, "
     "also Jungfraujoch); auto = told by each message's first bytes", NULL},
    {"channel", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "v2 with several thresholds: the channel the pipeline receives (for example threshold_2); "
     "\"\" = the first one the start message lists", NULL},
    {"verify_hash", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "v1: check each image's md5 against its dimage hash (costs a pass over the blob; some "
     "detector firmware sends hashes that do not match)", NULL},
    {"endpoints", BEAM_P_ENDPOINT_LIST, "[]", 0, 0, 0, NULL, NULL,
     "further PUSH sockets of one image stream split over several (Jungfraujoch writers): "
     "beamd reads endpoint and each of these and merges the images by image id", endpoints_valid},
    {"merge_wait", BEAM_P_DURATION, "200ms", 0, 0.001, 60, NULL, NULL,
     "with endpoints: how long an image waits for a lower image id from another socket "
     "before it is taken anyway (the ids skipped count as missing)", NULL},
    BEAM_PARAM_END};

/* One socket of the stream. With several (a split image stream), each
 * socket's images come in order but interleave with the others': an image
 * ahead of the next id waits here (its socket not read meanwhile) until
 * the lower ids came from the other sockets, every other live socket has
 * an image waiting too, or merge_wait ran out. */
typedef struct stream_s {
  beamd_zread_t zr;
  struct dsrc_s *src;
  int held;                 /* an image waits in hparts */
  zmq_msg_t hparts[BEAMD_ZREAD_MAX_PARTS];
  size_t hn;
  uint64_t held_id, held_ns;
  int ended;                /* its end of the open series came */
  int drained;
  beam_ep_sec_t sec;        /* the socket keeps pointers to these */
  char what[40];
} stream_t;

typedef struct dsrc_s {
  beamd_t *d;
  beamd_dxs_t ser;        /* the series (dectris_series.c) */
  stream_t st[MAX_STREAMS];
  unsigned nst;
  uv_timer_t merge_timer;
  int timer_on, force_one, end_pending, drain_pending;
  uint64_t merge_wait_ns, end_id;
  int format;
  beam_dx_msg_t msg;      /* decoded message (large: kept off the stack) */
  uint64_t v1_messages, v2_messages, other, merge_held, merge_timeouts;
} dsrc_t;

static void warn(dsrc_t *s, const char *what, const char *why) {
  beam_log_rl(&s->d->in.rl, LOG_WARNING, "input: dectris: %s: %s", what, why);
}

/* ---- messages ------------------------------------------------------------------------ */

/* Decodes one message into s->msg: its stream version, or 0 when it was
 * counted and dropped. */
static int decode(dsrc_t *s, const beam_part_t *parts, size_t n) {
  beamd_t *d = s->d;
  int v = s->format == FMT_AUTO ? beam_dx_detect(parts, n) : s->format;
  const char *why = NULL;
  int rc;
  if (v == 1) {
    s->v1_messages++;
    rc = beam_dx1_parse(parts, n, &s->msg, &why);
  } else if (v == 2) {
    s->v2_messages++;
    rc = n == 1 ? beam_dx2_parse(parts[0].data, parts[0].size, &s->msg, &why) : BEAM_EPROTO;
    if (n != 1)
      why = "dectris v2: a message of more than one part";
  } else {
    beamd_ingest_malformed(d, "dectris message", "neither a JSON (v1) nor a CBOR (v2) message");
    return 0;
  }
  if (rc < 0) {
    if (rc == BEAM_ENOTSUP)
      s->ser.unsupported++;
    else if (rc == BEAM_ESHAPE)
      s->ser.size_mismatch++;
    else
      atomic_fetch_add(&d->in.malformed, 1);
    warn(s, "message dropped", why ? why : "?");
    return 0;
  }
  return v;
}

/* ---- several sockets: merging by image id ------------------------------------------------ */

static void merge_arm(dsrc_t *s);

/* The held image of stream k goes in (decoded again: its parts moved since). */
static void release_held(dsrc_t *s, stream_t *k) {
  beam_part_t bp[BEAMD_ZREAD_MAX_PARTS];
  beamd_zmsg_owner_t zo[BEAMD_ZREAD_MAX_PARTS];
  for (size_t i = 0; i < k->hn; i++) {
    beamd_zmsg_owner_init(&zo[i], &k->hparts[i]);
    bp[i] = (beam_part_t){zmq_msg_data(&k->hparts[i]), zmq_msg_size(&k->hparts[i]), &zo[i].base};
  }
  if (decode(s, bp, k->hn) && s->msg.kind == BEAM_DX_IMAGE)
    beamd_dxs_image(&s->ser, &s->msg.image, bp, k->hn, beam_now_ns());
  for (size_t i = 0; i < k->hn; i++)
    zmq_msg_close(&k->hparts[i]);
  k->held = 0;
  k->hn = 0;
  beamd_zread_hold(&k->zr, 0);
}

static stream_t *lowest_held(dsrc_t *s) {
  stream_t *lo = NULL;
  for (unsigned i = 0; i < s->nst; i++)
    if (s->st[i].held && (!lo || s->st[i].held_id < lo->held_id))
      lo = &s->st[i];
  return lo;
}

/* Lets in every held image that is next; the lowest one even across a gap
 * when every live socket has one waiting, when merge_wait ran out
 * (force_one), or when every socket has ended the series or drained. Only
 * while the graph has room (lossless: resume comes back here). When
 * nothing is held any more, a series end or a drain waiting for that
 * completes. */
static void merge_progress(dsrc_t *s) {
  beamd_t *d = s->d;
  int all_ended = 1, all_drained = 1;
  for (unsigned i = 0; i < s->nst; i++) {
    all_ended &= s->st[i].ended;
    all_drained &= s->st[i].drained;
  }
  for (stream_t *lo; (lo = lowest_held(s));) {
    int all_wait = 1;
    for (unsigned i = 0; i < s->nst; i++)
      all_wait &= s->st[i].held || s->st[i].ended;
    if (lo->held_id > s->ser.next_frame && !all_wait && !all_ended && !s->drain_pending &&
        !s->force_one)
      break;
    if (!beamd_ingest_room(d)) {
      beamd_ingest_pause(d); /* the graph calls resume, which comes back here */
      break;
    }
    s->force_one = 0;
    release_held(s, lo);
  }
  s->force_one = 0;
  if (!lowest_held(s)) {
    if (all_ended && s->end_pending) {
      s->end_pending = 0;
      for (unsigned i = 0; i < s->nst; i++)
        s->st[i].ended = 0;
      s->ser.ends += s->nst - 1; /* one end per socket, one series end */
      beamd_dxs_end(&s->ser, s->end_id);
    }
    if (all_drained && s->drain_pending) {
      s->drain_pending = 0;
      beamd_input_drained(d);
    }
  }
  merge_arm(s);
}

static void merge_timer_cb(uv_timer_t *t) {
  dsrc_t *s = t->data;
  stream_t *lo = lowest_held(s);
  if (lo && beam_now_ns() - lo->held_ns >= s->merge_wait_ns) {
    s->merge_timeouts++;
    s->force_one = 1;
    merge_progress(s);
  }
}

static void merge_arm(dsrc_t *s) {
  int any = lowest_held(s) != NULL;
  if (any && !s->timer_on) {
    uint64_t ms = s->merge_wait_ns / 2000000 + 1;
    uv_timer_start(&s->merge_timer, merge_timer_cb, ms, ms);
  } else if (!any && s->timer_on) {
    uv_timer_stop(&s->merge_timer);
  }
  s->timer_on = any;
}

/* An image of stream k that is ahead of the next id: keep it back. */
static void hold(dsrc_t *s, stream_t *k, beamd_zread_t *zr, size_t n) {
  for (size_t i = 0; i < n; i++) {
    zmq_msg_init(&k->hparts[i]);
    zmq_msg_move(&k->hparts[i], &zr->parts[i]);
  }
  k->hn = n;
  k->held = 1;
  k->held_id = s->msg.image.image_id;
  k->held_ns = beam_now_ns();
  s->merge_held++;
  beamd_zread_hold(zr, 1);
  merge_progress(s);
}

static void stream_end(dsrc_t *s, stream_t *k, uint64_t series_id) {
  if (!s->ser.have_start || series_id != s->ser.series_id) {
    beamd_dxs_end(&s->ser, series_id); /* counts it */
    return;
  }
  k->ended = 1;
  s->end_pending = 1;
  s->end_id = series_id;
  merge_progress(s); /* the series ends with its last socket's end */
}

static void handle(beamd_zread_t *zr, const beam_part_t *parts, size_t n, uint64_t t_recv) {
  stream_t *k = zr->ctx;
  dsrc_t *s = k->src;
  beamd_t *d = s->d;
  atomic_fetch_add(&d->in.messages, 1);
  int v = decode(s, parts, n);
  if (!v)
    return;
  switch (s->msg.kind) {
  case BEAM_DX_START:
    if (beamd_dxs_start(&s->ser, &s->msg.start, v)) {
      /* A split stream's sockets each end the series; a new one forgets
       * ends that were waiting for the others. */
      for (unsigned i = 0; i < s->nst; i++)
        s->st[i].ended = 0;
      s->end_pending = 0;
    }
    break;
  case BEAM_DX_IMAGE:
    if (s->nst > 1 && s->ser.have_start && s->msg.image.series_id == s->ser.series_id &&
        s->msg.image.image_id > s->ser.next_frame && !s->drain_pending && !k->held) {
      hold(s, k, zr, n);
    } else {
      beamd_dxs_image(&s->ser, &s->msg.image, parts, n, t_recv);
      if (s->nst > 1)
        merge_progress(s);
    }
    break;
  case BEAM_DX_END:
    if (s->nst > 1)
      stream_end(s, k, s->msg.end_series_id);
    else
      beamd_dxs_end(&s->ser, s->msg.end_series_id);
    break;
  default:
    s->other++;
    beam_log_rl(&d->in.rl, LOG_INFO, "input: dectris: \"%s\" message skipped", s->msg.other_type);
  }
}

/* ---- the source ------------------------------------------------------------------------ */

/* Draining: everything received goes in, held images too (lossless to
 * the end), and the drain is complete when every socket is empty. */
static void stream_drained(beamd_zread_t *zr) {
  stream_t *k = zr->ctx;
  k->drained = 1;
  merge_progress(k->src);
}

static int dsrc_open(beamd_t *d, void **state, const beam_cnode_t *conf, char *err,
                     size_t errlen) {
  dsrc_t *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "input: out of memory");
    return BEAM_ENOMEM;
  }
  *state = s;
  s->d = d;
  uv_timer_init(&d->loop, &s->merge_timer);
  s->merge_timer.data = s;
  s->ser.d = d;
  s->format = (int)beam_cfg_int(conf, "format", FMT_AUTO);
  s->ser.verify_hash = beam_cfg_bool(conf, "verify_hash", 0);
  s->merge_wait_ns = (uint64_t)(beam_cfg_float(conf, "merge_wait", 0.2) * 1e9);
  const char *ch = beam_cfg_str(conf, "channel");
  snprintf(s->ser.channel, sizeof s->ser.channel, "%s", ch ? ch : "");
  const beam_cnode_t *more = beam_cfg_get(conf, "endpoints");
  s->nst = 1 + (unsigned)beam_cfg_len(more);
  int rc = 0;
  for (unsigned i = 0; i < s->nst && rc == 0; i++) {
    stream_t *k = &s->st[i];
    k->src = s;
    k->zr.ctx = k;
    k->zr.handle = handle;
    k->zr.drained = stream_drained;
    beam_cfg_endpoint_t ep = {.address = d->cfg->input.endpoint};
    if (i) {
      beam_cfg_endpoint(beam_cfg_at(more, i - 1), &ep);
      beam_ep_sec_from_node(beam_cfg_at(more, i - 1), &k->sec);
    } else {
      k->sec = d->cfg->input.endpoint_sec;
    }
    snprintf(k->what, sizeof k->what, i ? "input.dectris.endpoints[%u]" : "input.endpoint",
             i - 1);
    rc = beamd_zread_open(d, &k->zr, ZMQ_PULL, ep.address, &k->sec, k->what, d->cfg->input.bind,
                          d->cfg->input.hwm, 1, err, errlen);
  }
  return rc;
}

static void dsrc_resume(beamd_t *d, void *st) {
  (void)d;
  dsrc_t *s = st;
  if (s->nst > 1)
    merge_progress(s);
  for (unsigned i = 0; i < s->nst; i++)
    beamd_zread_read(&s->st[i].zr);
}

/* The detector counts what ZeroMQ took as delivered: read it all. */
static int dsrc_drain(beamd_t *d, void *st) {
  (void)d;
  dsrc_t *s = st;
  if (s->nst == 1)
    return beamd_zread_drain(&s->st[0].zr);
  s->drain_pending = 1;
  merge_progress(s); /* held images first, in order */
  for (unsigned i = 0; i < s->nst; i++) {
    s->st[i].drained = !s->st[i].zr.zs.open;
    beamd_zread_hold(&s->st[i].zr, 0);
  }
  for (unsigned i = 0; i < s->nst; i++)
    if (!s->st[i].drained)
      beamd_zread_drain(&s->st[i].zr);
  merge_progress(s);
  return 1;
}

static void dsrc_stop(beamd_t *d, void *st) {
  (void)d;
  dsrc_t *s = st;
  for (unsigned i = 0; i < s->nst; i++)
    beamd_zread_stop(&s->st[i].zr);
  uv_timer_stop(&s->merge_timer);
}

static void dsrc_close(beamd_t *d, void *st) {
  dsrc_t *s = st;
  if (!s)
    return;
  beamd_dxs_fini(&s->ser);
  for (unsigned i = 0; i < s->nst; i++) {
    stream_t *k = &s->st[i];
    for (size_t j = 0; k->held && j < k->hn; j++)
      zmq_msg_close(&k->hparts[j]);
    k->held = 0;
    if (k->zr.d)
      beamd_zread_close(&k->zr);
  }
  if (!uv_is_closing((uv_handle_t *)&s->merge_timer))
    uv_close((uv_handle_t *)&s->merge_timer, NULL);
  d->src_garbage = s; /* freed once the loop closed the readers' handles */
}

static void dsrc_stats(beamd_t *d, void *st, json_t *obj) {
  (void)d;
  dsrc_t *s = st;
  json_t *o = json_object();
  json_object_set_new(o, "v1_messages", json_integer((json_int_t)s->v1_messages));
  json_object_set_new(o, "v2_messages", json_integer((json_int_t)s->v2_messages));
  json_object_set_new(o, "other", json_integer((json_int_t)s->other));
  beamd_dxs_stats(&s->ser, o);
  json_object_set_new(o, "sockets", json_integer(s->nst));
  json_object_set_new(o, "merge_held", json_integer((json_int_t)s->merge_held));
  json_object_set_new(o, "merge_timeouts", json_integer((json_int_t)s->merge_timeouts));
  json_object_set_new(obj, "dectris", o);
}

const beamd_source_ops_t beamd_src_dectris = {
    .mode = "dectris",
    .lossless = 1,
    .params = beamd_dectris_params,
    .open = dsrc_open,
    .resume = dsrc_resume,
    .drain = dsrc_drain,
    .stop = dsrc_stop,
    .close = dsrc_close,
    .stats = dsrc_stats,
};
