/* The subscriptions and the per-topic latest-result store.
 *
 * One SUB socket per --sub endpoint, all topics, on the loop through the
 * socket's ZMQ_FD. That descriptor only signals edges, so every wake-up
 * drains until ZMQ_EVENTS says nothing is left; a batch limit hands the
 * loop back to the browsers now and then (an idle handle resumes). A
 * subscriber that falls behind loses messages at beamd's PUB high-water
 * mark, never slowing beamd; the losses show as sequence gaps here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/beamd-view/view.h"
#include "pipeline/frame.h"
#include "tools/common/curve_opt.h"

static void drain_all(view_t *v);

static void on_sub_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_all(h->data);
}

static void on_drain_idle(uv_idle_t *h) {
  view_t *v = h->data;
  uv_idle_stop(h);
  v->drain_pending = 0;
  drain_all(v);
}

static view_topic_t *topic_get(view_t *v, const char *name, size_t len, int sub) {
  for (int i = 0; i < v->ntopics; i++) {
    view_topic_t *t = v->topics[i];
    if (strlen(t->name) == len && !memcmp(t->name, name, len))
      return t;
  }
  if (v->ntopics == VIEW_MAX_TOPICS) {
    v->topics_overflow++;
    return NULL;
  }
  view_topic_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  memcpy(t->name, name, len);
  t->name[len] = 0;
  t->sub = sub;
  v->topics[v->ntopics++] = t;
  return t;
}

static void topic_clear_parts(view_topic_t *t) {
  for (size_t i = 0; i < t->nparts; i++)
    zmq_msg_close(&t->parts[i]);
  t->nparts = 0;
  t->ok = 0;
}

/* 1 when the bytes make a topic a browser can be told about. */
static int topic_name_ok(const void *p, size_t n) {
  return n >= 1 && n <= BEAM_TOPIC_MAX && beam_topic_valid(p, n);
}

static void track_seq(view_sub_t *s, uint64_t seq) {
  if (s->have_seq) {
    if (seq > s->last_seq + 1)
      s->gaps += seq - s->last_seq - 1;
    else if (seq <= s->last_seq)
      s->seq_resets++; /* PROTOCOL.md section 6: the sender restarted */
  }
  s->have_seq = 1;
  s->last_seq = seq;
}

/* Takes ownership of parts[0..n) (moved into the store or closed). */
static void store(view_t *v, int si, zmq_msg_t *parts, size_t n, int overflow) {
  view_sub_t *s = &v->subs[si];
  uint64_t now = beam_now_ns();
  s->messages++;
  s->last_ns = now;
  v->total++;
  const void *p0 = zmq_msg_data(&parts[0]);
  size_t n0 = zmq_msg_size(&parts[0]);
  view_topic_t *t = NULL;
  if (n >= 2 && topic_name_ok(p0, n0))
    t = topic_get(v, p0, n0, si);
  if (!t) {
    /* No topic to list it under (detector frames, garbage): counted only. */
    v->untopical++;
    s->malformed += overflow;
    for (size_t i = 0; i < n; i++)
      zmq_msg_close(&parts[i]);
    return;
  }
  int fresh = t->count == 0;
  topic_clear_parts(t);
  for (size_t i = 0; i < n; i++) {
    zmq_msg_init(&t->parts[i]);
    zmq_msg_move(&t->parts[i], &parts[i]);
    zmq_msg_close(&parts[i]);
  }
  t->nparts = n;
  /* Parsed after the move: small ZeroMQ messages keep their bytes inside
   * zmq_msg_t, so pointers taken before the move would dangle. */
  beam_part_t bp[VIEW_MAX_PARTS];
  for (size_t i = 0; i < n; i++) {
    bp[i].data = zmq_msg_data(&t->parts[i]);
    bp[i].size = zmq_msg_size(&t->parts[i]);
  }
  const char *why = NULL;
  if (overflow) {
    snprintf(t->why, sizeof t->why, "more parts than any valid message has");
  } else if (beam_msg_parse(bp, n, &beam_limits_default, &t->msg, &why) != 0) {
    snprintf(t->why, sizeof t->why, "%s", why ? why : "does not parse");
  } else {
    t->ok = 1;
    t->why[0] = 0;
    track_seq(s, t->msg.hdr.seq);
  }
  if (!t->ok) {
    t->invalid++;
    s->malformed++;
  }
  /* A result descriptor names stage and output; other metadata (series
   * metadata on beamd.series, errors) is not a descriptor. */
  if (t->ok && t->msg.meta && t->msg.hdr.type == BEAM_MSG_RESULT) {
    json_t *d = json_loadb(t->msg.meta, t->msg.meta_len, 0, NULL);
    if (d && json_is_object(d) && json_object_get(d, "stage") && json_object_get(d, "output")) {
      json_decref(t->desc);
      t->desc = d;
    } else {
      json_decref(d);
    }
  }
  t->t_rx_ns = beam_realtime_ns();
  t->ver++;
  t->count++;
  for (size_t i = 0; i < n; i++)
    t->bytes += zmq_msg_size(&t->parts[i]);
  if (fresh)
    t->first_ns = now;
  if (t->last_ns && now > t->last_ns) {
    double inst = 1e9 / (double)(now - t->last_ns);
    t->rate = t->rate > 0 ? 0.8 * t->rate + 0.2 * inst : inst;
  }
  t->last_ns = now;
  if (fresh)
    view_store_publish_topics(v);
}

/* Receives one whole multipart message from s; 1 when one was taken, 0 when
 * none was waiting, -1 on a socket error. */
static int recv_one(view_t *v, int si) {
  view_sub_t *s = &v->subs[si];
  zmq_msg_t parts[VIEW_MAX_PARTS];
  size_t n = 0;
  int overflow = 0;
  zmq_msg_init(&parts[0]);
  if (zmq_msg_recv(&parts[0], s->sock, ZMQ_DONTWAIT) < 0) {
    int e = errno;
    zmq_msg_close(&parts[0]);
    if (e == EAGAIN || e == EINTR)
      return 0;
    fprintf(stderr, "beamd-view: receive from %s: %s\n", s->endpoint, zmq_strerror(e));
    return -1;
  }
  n = 1;
  int more = zmq_msg_more(&parts[0]);
  while (more) { /* the rest is already here: ZeroMQ delivers all parts or none */
    zmq_msg_t extra, *p = n < VIEW_MAX_PARTS ? &parts[n] : &extra;
    zmq_msg_init(p);
    if (zmq_msg_recv(p, s->sock, 0) < 0) {
      if (errno == EINTR) {
        zmq_msg_close(p);
        continue;
      }
      zmq_msg_close(p);
      for (size_t i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
      return -1;
    }
    more = zmq_msg_more(p);
    if (p == &extra) {
      overflow = 1;
      zmq_msg_close(p);
    } else {
      n++;
    }
  }
  store(v, si, parts, n, overflow);
  return 1;
}

static void drain_all(view_t *v) {
  if (v->stopping)
    return;
  int budget = VIEW_DRAIN_BATCH, got = 0, left = 0;
  for (int i = 0; i < v->o->nsub; i++) {
    view_sub_t *s = &v->subs[i];
    for (;;) {
      int ev = 0;
      size_t len = sizeof ev;
      if (zmq_getsockopt(s->sock, ZMQ_EVENTS, &ev, &len) < 0 || !(ev & ZMQ_POLLIN))
        break;
      if (budget == 0) {
        left = 1;
        break;
      }
      int r = recv_one(v, i);
      if (r <= 0)
        break;
      budget--;
      got++;
    }
  }
  if (left && !v->drain_pending) {
    v->drain_pending = 1;
    uv_idle_start(&v->drain_idle, on_drain_idle);
  }
  if (got)
    view_ws_kick(v);
}

view_msg_t *view_topic_disp(view_t *v, view_topic_t *t) {
  if (t->disp && t->disp_ver == t->ver)
    return t->disp;
  view_msg_unref(&t->disp);
  if (!t->nparts)
    return NULL;
  if (!t->ok) {
    t->disp = view_disp_raw(t->name, t->parts, t->nparts, t->why, t->t_rx_ns);
  } else {
    const void *data = NULL;
    const char *why = NULL;
    const beam_msg_t *m = &t->msg;
    if (m->hdr.nparts > 0 && m->hdr.raw_size > 0) {
      size_t need = (size_t)m->hdr.raw_size;
      if (need > v->cap) {
        uint8_t *b = realloc(v->buf, need), *s2;
        if (b)
          v->buf = b;
        s2 = b ? realloc(v->scratch, need) : NULL;
        if (s2)
          v->scratch = s2;
        if (!b || !s2) {
          t->disp = view_disp_raw(t->name, t->parts, t->nparts, "out of memory for the payload",
                                  t->t_rx_ns);
          t->disp_ver = t->ver;
          return t->disp;
        }
        v->cap = need;
      }
      if (beam_msg_payload(m, v->buf, v->scratch, &why) != 0) {
        t->disp = view_disp_raw(t->name, t->parts, t->nparts, why, t->t_rx_ns);
        t->disp_ver = t->ver;
        return t->disp;
      }
      data = v->buf;
    }
    t->disp = view_disp_build(v->o, t->name, m, data, t->desc, t->t_rx_ns);
  }
  t->disp_ver = t->ver;
  return t->disp;
}

/* What the topic list says about one topic: what it is, how often it comes,
 * how long ago the last one came, and why it is raw if it is. */
static json_t *topic_json(const view_topic_t *t, uint64_t now) {
  json_t *o = json_object();
  json_object_set_new(o, "topic", json_string(t->name));
  json_object_set_new(o, "count", json_integer((json_int_t)t->count));
  json_object_set_new(o, "invalid", json_integer((json_int_t)t->invalid));
  json_object_set_new(o, "bytes", json_integer((json_int_t)t->bytes));
  double age = t->last_ns ? (double)(now - t->last_ns) * 1e-9 : -1;
  /* A rate is only current while messages keep coming. */
  double rate = t->rate;
  if (t->last_ns && rate > 0 && age > 2.0 / rate)
    rate = 1.0 / age;
  json_object_set_new(o, "rate", json_real(rate));
  json_object_set_new(o, "age_s", json_real(age));
  /* beamd's own topics (stats, series) carry no descriptor by design. */
  int own = !strncmp(t->name, "beamd.", 6);
  json_object_set_new(o, "raw", json_boolean(!t->ok || (!t->desc && !own)));
  json_object_set_new(o, "ok", json_boolean(t->ok));
  if (!t->ok)
    json_object_set_new(o, "why", json_string(t->why));
  if (t->ok) {
    const beam_hdr_t *h = &t->msg.hdr;
    json_object_set_new(o, "msg_type", json_string(beam_msg_type_name(h->type)));
    json_object_set_new(o, "dtype", json_string(beam_dtype_name((beam_dtype_t)h->dtype)));
    json_t *sh = json_array();
    for (unsigned i = 0; i < h->ndim; i++)
      json_array_append_new(sh, json_integer(h->shape[i]));
    json_object_set_new(o, "shape", sh);
    json_object_set_new(o, "series_id", json_integer((json_int_t)h->series_id));
    json_object_set_new(o, "frame_id", json_integer((json_int_t)h->frame_id));
  }
  json_object_set(o, "desc", t->desc ? t->desc : json_null());
  return o;
}

void view_store_publish_topics(view_t *v) {
  uint64_t now = beam_now_ns();
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string("topics"));
  json_object_set_new(o, "t_tx_ns", json_integer((json_int_t)beam_realtime_ns()));
  json_object_set_new(o, "uptime_s", json_real((double)(now - v->started_ns) * 1e-9));
  json_t *a = json_array();
  for (int i = 0; i < v->ntopics; i++)
    json_array_append_new(a, topic_json(v->topics[i], now));
  json_object_set_new(o, "topics", a);
  json_t *subs = json_array();
  for (int i = 0; i < v->o->nsub; i++) {
    const view_sub_t *s = &v->subs[i];
    json_t *j = json_object();
    json_object_set_new(j, "endpoint", json_string(s->endpoint));
    json_object_set_new(j, "messages", json_integer((json_int_t)s->messages));
    json_object_set_new(j, "malformed", json_integer((json_int_t)s->malformed));
    json_object_set_new(j, "gaps", json_integer((json_int_t)s->gaps));
    json_object_set_new(j, "seq_resets", json_integer((json_int_t)s->seq_resets));
    json_object_set_new(j, "age_s", s->last_ns ? json_real((double)(now - s->last_ns) * 1e-9)
                                               : json_null());
    json_array_append_new(subs, j);
  }
  json_object_set_new(o, "subs", subs);
  json_object_set_new(o, "messages", json_integer((json_int_t)v->total));
  json_object_set_new(o, "untopical", json_integer((json_int_t)v->untopical));
  json_object_set_new(o, "topics_overflow", json_integer((json_int_t)v->topics_overflow));
  json_object_set_new(o, "clients", json_integer(view_ws_clients(v)));
  uint64_t rt, rh, ro;
  view_ws_refused(v, &rt, &rh, &ro);
  json_object_set_new(o, "refused", json_pack("{s:I, s:I, s:I}", "token", (json_int_t)rt, "host",
                                              (json_int_t)rh, "origin", (json_int_t)ro));
  json_object_set_new(o, "max_rate", json_real(v->o->max_rate));
  view_msg_t *m = view_msg_new(o, NULL, 0);
  json_decref(o);
  if (m) {
    view_msg_unref(&v->topics_msg);
    v->topics_msg = m;
    v->topics_ver++;
    view_ws_kick(v);
  }
}

static void on_tick(uv_timer_t *h) { view_store_publish_topics(h->data); }

int view_store_open(view_t *v, char *err, size_t errlen) {
  uv_idle_init(v->loop, &v->drain_idle);
  v->drain_idle.data = v;
  uv_timer_init(v->loop, &v->tick);
  v->tick.data = v;
  for (int i = 0; i < v->o->nsub; i++) {
    view_sub_t *s = &v->subs[i];
    s->endpoint = v->o->sub[i];
    s->sock = zmq_socket(v->zctx, ZMQ_SUB);
    if (!s->sock) {
      snprintf(err, errlen, "cannot create a SUB socket: %s", zmq_strerror(errno));
      return -1;
    }
    int zero = 0, hwm = v->o->hwm;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, "", 0);
    if (tool_curve_socket(v->curve, v->zctx, s->sock, s->endpoint, 0) < 0) {
      snprintf(err, errlen, "--sub %s: CURVE settings refused (above)", s->endpoint);
      return -1;
    }
    if (zmq_connect(s->sock, s->endpoint) < 0) {
      snprintf(err, errlen, "--sub %s: %s", s->endpoint, zmq_strerror(errno));
      return -1;
    }
    int fd;
    size_t len = sizeof fd;
    if (zmq_getsockopt(s->sock, ZMQ_FD, &fd, &len) < 0) {
      snprintf(err, errlen, "--sub %s: ZMQ_FD: %s", s->endpoint, zmq_strerror(errno));
      return -1;
    }
    uv_poll_init(v->loop, &s->poll, fd);
    s->polling = 1;
    s->poll.data = v;
    uv_poll_start(&s->poll, UV_READABLE, on_sub_readable);
  }
  uv_timer_start(&v->tick, on_tick, 0, 1000);
  return 0;
}

void view_store_close(view_t *v) {
  if (!v->tick.data)
    return; /* never opened */
  uv_timer_stop(&v->tick);
  uv_close((uv_handle_t *)&v->tick, NULL);
  uv_idle_stop(&v->drain_idle);
  uv_close((uv_handle_t *)&v->drain_idle, NULL);
  for (int i = 0; i < v->o->nsub; i++) {
    view_sub_t *s = &v->subs[i];
    if (!s->sock)
      continue;
    if (s->polling) {
      uv_poll_stop(&s->poll);
      uv_close((uv_handle_t *)&s->poll, NULL);
      s->polling = 0;
    }
  }
  v->tick.data = NULL;
}

void view_store_free(view_t *v) {
  for (int i = 0; i < v->o->nsub; i++)
    if (v->subs[i].sock)
      zmq_close(v->subs[i].sock);
  for (int i = 0; i < v->ntopics; i++) {
    view_topic_t *t = v->topics[i];
    topic_clear_parts(t);
    json_decref(t->desc);
    view_msg_unref(&t->disp);
    free(t);
  }
  v->ntopics = 0;
  view_msg_unref(&v->topics_msg);
  view_msg_unref(&v->status_msg);
  free(v->buf);
  free(v->scratch);
}
