/* The Karabo bridge output (output.karabo, docs/karabo.md): beamd's
 * results served in European XFEL's Karabo bridge protocol 2.2, so OnDA/OM,
 * karabo-bridge-py and karabo-bridge-cpp clients read them.
 *
 * Three patterns. rep: a client's REQ sends the ASCII bytes `next` and gets
 * one message holding the latest result of every topic that has one waiting
 * (each topic once: a result replaced before anyone asked for it is counted
 * as dropped); with nothing waiting the request stays pending (the loop
 * goes on) and the next result answers it. pub and push: each result goes
 * out as its own message when it comes, or is dropped (counted) when the
 * socket cannot take it.
 *
 * It never holds a frame past beamd_karabo_result: every payload is a copy
 * counted against output.karabo.buffer (the waiting copies and the ones
 * queued inside ZeroMQ), like the PUB's pub_buffer, so a client that does
 * not read costs memory within that bound and never a stage's slot.
 *
 * Naming: source = source_prefix + topic ("beamd/vd.sums"); the array's
 * path is "image.data" for results of two or more dimensions (OM and the
 * bridge's detector sources use it) and "data" for the rest; the source's
 * msgpack data carries beamd.series_id, beamd.frame_id, beamd.flags and
 * beamd.topic. timestamp.tid is the result's frame id. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>
#include <zmq.h>

#include "daemon/beamd.h"
#include "proto/karabo.h"

#define SLOTS 64 /* topics with a result waiting (rep) */
#define SOURCE_MAX (BEAM_TOPIC_MAX + 64)

enum { PAT_REP = 0, PAT_PUB = 1, PAT_PUSH = 2 }; /* the pattern enum's order */

const beam_param_t beamd_karabo_out_params[] = {
    {"endpoint", BEAM_P_ENDPOINT, "", 0, 0, 0, NULL, NULL,
     "Karabo bridge 2.2 server endpoint (bound), for example tcp://127.0.0.1:5610; \"\" = off",
     NULL},
    {"pattern", BEAM_P_ENUM, "rep", 0, 0, 0, "rep|pub|push", NULL,
     "rep: answers each REQ `next` with the latest result of every topic (a request with "
     "nothing waiting is answered by the next result); pub or push: every result as it comes",
     NULL},
    {"hwm", BEAM_P_INT, "4", 0, 0, 10000000, NULL, NULL,
     "send high-water mark (messages); 0 = no limit", NULL},
    {"buffer", BEAM_P_SIZE, "256Mi", 0, 0, 1099511627776.0, NULL, NULL,
     "bytes of result copies the output may hold (waiting for a request, or queued in "
     "ZeroMQ); beyond it results are dropped for this output (counted), never held", NULL},
    {"topics", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "serve only results whose topic starts with this prefix (for example \"corr.\"); "
     "\"\" = every result", NULL},
    {"source_prefix", BEAM_P_STRING, "beamd/", 0, 0, 0, NULL, NULL,
     "a result's Karabo source name is this prefix followed by its topic", NULL},
    BEAM_PARAM_END};

/* A result's copy, waiting for a request or queued in ZeroMQ. */
typedef struct copy_s {
  struct beamd_kout_s *k;
  size_t n;
} copy_t;

typedef struct slot_s {
  char source[SOURCE_MAX];
  char topic[BEAM_TOPIC_MAX + 1];
  copy_t *copy; /* NULL: nothing waiting */
  uint64_t series_id, frame_id, t_ns;
  uint32_t flags;
  beam_dtype_t dtype;
  unsigned ndim;
  uint32_t shape[BEAM_MAX_NDIM];
} slot_t;

struct beamd_kout_s {
  beamd_t *d;
  beamd_zsock_t zs;
  int pattern;
  int pending; /* rep: a `next` waits for a result */
  size_t budget;
  atomic_size_t held;
  char endpoint[BEAM_ENDPOINT_MAX];
  char topics[BEAM_TOPIC_MAX + 1];
  char source_prefix[64];
  slot_t slot[SLOTS];
  unsigned nslots;
  msgpack_sbuffer sb;
  msgpack_sbuffer err; /* the error source pair that closes a cut reply */
  size_t err_hlen;
  atomic_uint_fast64_t messages, results, bytes, dropped, requests, bad_requests, reply_errors;
};

/* Tests: BEAMD_FAULT_KARABO_REPLY=N makes the Nth allocation of a reply's
 * part fail (once), so a test can see the reply stay whole. Unset, it
 * costs one compare. */
static unsigned long fail_at, fail_seen;
static int k_fail_alloc(void) { return fail_at && ++fail_seen == fail_at; }

/* Every endpoint this file reads, in one place (CURVE settings will join
 * them here). */
/* Either form of the endpoint (pipeline/cfg.h); its CURVE settings in sec. */
static const char *endpoint_of(const beam_cnode_t *conf, beam_ep_sec_t *sec) {
  beam_cfg_endpoint_t ep;
  beam_cfg_endpoint(beam_cfg_get(conf, "endpoint"), &ep);
  if (sec)
    beam_ep_sec_from_node(beam_cfg_get(conf, "endpoint"), sec);
  return ep.address ? ep.address : "";
}

static const beam_cnode_t *conf_of(const beam_config_t *c) {
  return beam_cfg_get(beam_cfg_get(c->root, "output"), "karabo");
}

/* ---- copies within the budget ---------------------------------------------------- */

static void copy_free(void *data, void *hint) {
  (void)data;
  copy_t *c = hint;
  atomic_fetch_sub(&c->k->held, c->n);
  free(c);
}

static copy_t *copy_new(struct beamd_kout_s *k, const beam_frame_t *f) {
  size_t n = f->nbytes;
  if (atomic_fetch_add(&k->held, n) + n > k->budget) {
    atomic_fetch_sub(&k->held, n);
    return NULL;
  }
  copy_t *c = malloc(sizeof *c + (n ? n : 1));
  if (!c) {
    atomic_fetch_sub(&k->held, n);
    return NULL;
  }
  c->k = k;
  c->n = n;
  if (n)
    memcpy(c + 1, f->data, n);
  return c;
}

/* ---- messages ------------------------------------------------------------------- */

static void slot_fill(struct beamd_kout_s *k, slot_t *s, const beam_frame_t *f, const char *topic) {
  snprintf(s->topic, sizeof s->topic, "%s", topic);
  snprintf(s->source, sizeof s->source, "%s%s", k->source_prefix, topic);
  s->series_id = f->series_id;
  s->frame_id = f->frame_id;
  s->t_ns = f->t_acq_ns ? f->t_acq_ns : beam_realtime_ns();
  s->flags = f->flags;
  s->dtype = f->dtype;
  s->ndim = f->ndim;
  memcpy(s->shape, f->shape, sizeof s->shape);
}

static int send_buf(void *sock, const void *p, size_t n, int more) {
  return zmq_send(sock, p, n, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0 ? -1 : 0;
}

/* A source's three header parts into k->sb: [0, hl) the source header,
 * [hl, ml) its map, [ml, size) the array header. 0 or -1 (out of memory). */
static int pack_source(struct beamd_kout_s *k, const slot_t *s, size_t *hl, size_t *ml) {
  msgpack_packer pk;
  msgpack_sbuffer_clear(&k->sb);
  msgpack_packer_init(&pk, &k->sb, msgpack_sbuffer_write);
  beam_kb_time_t t = beam_kb_time_from_ns(s->t_ns);
  int rc = beam_kb_pack_source_header(&pk, s->source, t, s->frame_id);
  *hl = k->sb.size;
  /* The non-array keys; flattened Karabo names. */
  rc |= msgpack_pack_map(&pk, 4);
  rc |= beam_kb_pack_str(&pk, "beamd.series_id");
  rc |= msgpack_pack_uint64(&pk, s->series_id);
  rc |= beam_kb_pack_str(&pk, "beamd.frame_id");
  rc |= msgpack_pack_uint64(&pk, s->frame_id);
  rc |= beam_kb_pack_str(&pk, "beamd.flags");
  rc |= msgpack_pack_uint32(&pk, s->flags);
  rc |= beam_kb_pack_str(&pk, "beamd.topic");
  rc |= beam_kb_pack_str(&pk, s->topic);
  *ml = k->sb.size;
  rc |= beam_kb_pack_array_header(&pk, s->source, s->ndim >= 2 ? "image.data" : "data", s->dtype,
                                  s->ndim, s->shape);
  return rc ? -1 : 0;
}

/* pub / push: one source as its own message; the copy goes to ZeroMQ
 * (freed by it, even on failure). Only the first part can fail (EAGAIN:
 * dropped); the rest of a multipart message cannot block. 0 or -1. */
static int send_source(struct beamd_kout_s *k, slot_t *s) {
  void *sock = k->zs.sock;
  size_t hlen, mlen;
  int rc = pack_source(k, s, &hlen, &mlen);
  copy_t *c = s->copy;
  s->copy = NULL;
  size_t n = c->n; /* c may be freed by ZeroMQ's I/O thread once sent */
  zmq_msg_t zm;
  zmq_msg_init_data(&zm, c + 1, c->n, copy_free, c);
  if (rc || send_buf(sock, k->sb.data, hlen, 1) < 0) {
    zmq_msg_close(&zm);
    return -1;
  }
  send_buf(sock, k->sb.data + hlen, mlen - hlen, 1);
  send_buf(sock, k->sb.data + mlen, k->sb.size - mlen, 1);
  if (zmq_msg_send(&zm, sock, 0) < 0)
    zmq_msg_close(&zm);
  atomic_fetch_add(&k->bytes, k->sb.size + n);
  return 0;
}

static int by_source(const void *a, const void *b) {
  const slot_t *x = *(const slot_t *const *)a, *y = *(const slot_t *const *)b;
  return strcmp(x->source, y->source);
}

/* rep: everything waiting, one source per topic, sorted by source name
 * (as the bridge sends them).
 *
 * A REQ client waits for exactly one complete reply: a reply cut off after
 * some of its parts would leave the message unterminated inside ZeroMQ
 * (never delivered, and the next reply's parts appended to it), wedging
 * that client for good. So every part is built first (headers packed and
 * copied into their own zmq messages: the allocations that can fail) and
 * nothing is sent unless all of them exist; when one cannot be made the
 * results are dropped (counted) and the reply is the bridge's own error
 * form, one part. Past the first part a send cannot block; should one fail
 * anyway, the message is closed with a static error source (no allocation
 * here) so the client still gets a whole, even-length 2.2 message. */
#define REPLY_PARTS (4 * SLOTS)

/* {source: beamd/error, content: msgpack, metadata: {source, timestamp.tid
 * 0, ...}} and {error: "..."}: what closes a reply whose sending failed. */
static const char err_source[] = "beamd/error";

static int pack_error_pair(struct beamd_kout_s *k) {
  msgpack_packer pk;
  msgpack_sbuffer_init(&k->err);
  msgpack_packer_init(&pk, &k->err, msgpack_sbuffer_write);
  int rc = beam_kb_pack_source_header(&pk, err_source, (beam_kb_time_t){0, 0}, 0);
  k->err_hlen = k->err.size;
  rc |= msgpack_pack_map(&pk, 1);
  rc |= beam_kb_pack_str(&pk, "error");
  rc |= beam_kb_pack_str(&pk, "beamd: reply cut short; its results are dropped");
  return rc ? BEAM_ENOMEM : 0;
}

static void send_error_pair(struct beamd_kout_s *k) {
  zmq_msg_t h, m;
  zmq_msg_init_data(&h, k->err.data, k->err_hlen, NULL, NULL); /* constant: no allocation */
  zmq_msg_init_data(&m, k->err.data + k->err_hlen, k->err.size - k->err_hlen, NULL, NULL);
  if (zmq_msg_send(&h, k->zs.sock, ZMQ_SNDMORE) < 0)
    zmq_msg_close(&h);
  if (zmq_msg_send(&m, k->zs.sock, 0) < 0)
    zmq_msg_close(&m);
}

/* A copy of n bytes of sb at off into m; 0 or -1 (out of memory). */
static int part_of(zmq_msg_t *m, const msgpack_sbuffer *sb, size_t off, size_t n) {
  if (k_fail_alloc()) /* tests: see beamd_karabo_fail_next */
    return -1;
  if (zmq_msg_init_size(m, n) < 0)
    return -1;
  memcpy(zmq_msg_data(m), sb->data + off, n);
  return 0;
}

static void serve(struct beamd_kout_s *k) {
  slot_t *w[SLOTS];
  unsigned n = 0;
  for (unsigned i = 0; i < k->nslots; i++)
    if (k->slot[i].copy)
      w[n++] = &k->slot[i];
  if (!n)
    return;
  qsort(w, n, sizeof w[0], by_source);
  static zmq_msg_t parts[REPLY_PARTS]; /* the loop thread's alone */
  size_t np = 0;
  uint64_t hdr_bytes = 0, arr_bytes = 0;
  int ok = 1;
  for (unsigned i = 0; i < n && ok; i++) {
    size_t hl, ml;
    ok = pack_source(k, w[i], &hl, &ml) == 0 && part_of(&parts[np], &k->sb, 0, hl) == 0;
    np += ok;
    ok = ok && part_of(&parts[np], &k->sb, hl, ml - hl) == 0;
    np += ok;
    ok = ok && part_of(&parts[np], &k->sb, ml, k->sb.size - ml) == 0;
    np += ok;
    if (ok) {
      copy_t *c = w[i]->copy;
      w[i]->copy = NULL;
      hdr_bytes += k->sb.size;
      arr_bytes += c->n; /* c may be freed by ZeroMQ's I/O thread once sent */
      zmq_msg_init_data(&parts[np++], c + 1, c->n, copy_free, c);
    }
  }
  if (!ok) { /* nothing went: one whole error reply instead */
    for (size_t j = 0; j < np; j++)
      zmq_msg_close(&parts[j]); /* frees the copies already taken */
    for (unsigned i = 0; i < n; i++)
      if (w[i]->copy) {
        copy_free(NULL, w[i]->copy);
        w[i]->copy = NULL;
      }
    atomic_fetch_add(&k->dropped, n);
    atomic_fetch_add(&k->reply_errors, 1);
    static const char oom[] = "Error: out of memory building the reply";
    zmq_send(k->zs.sock, oom, sizeof oom - 1, ZMQ_DONTWAIT);
    k->pending = 0;
    atomic_fetch_add(&k->messages, 1);
    return;
  }
  size_t sent = 0;
  for (; sent < np; sent++)
    if (zmq_msg_send(&parts[sent], k->zs.sock,
                     ZMQ_DONTWAIT | (sent + 1 < np ? ZMQ_SNDMORE : 0)) < 0)
      break;
  if (sent == 0 && errno == EAGAIN) { /* REP still owes it: the next result tries again */
    for (size_t j = 0; j < np; j++)
      zmq_msg_close(&parts[j]);
    atomic_fetch_add(&k->dropped, n);
    return;
  }
  if (sent < np) { /* cut short: what is left is dropped, the message closed */
    for (size_t j = sent; j < np; j++)
      zmq_msg_close(&parts[j]);
    if (sent > 0)
      send_error_pair(k);
    atomic_fetch_add(&k->dropped, n);
    atomic_fetch_add(&k->reply_errors, 1);
    k->pending = 0;
    atomic_fetch_add(&k->messages, 1);
    return;
  }
  k->pending = 0;
  atomic_fetch_add(&k->bytes, hdr_bytes + arr_bytes);
  atomic_fetch_add(&k->messages, 1);
  atomic_fetch_add(&k->results, n);
}

static void bad_request(struct beamd_kout_s *k, const zmq_msg_t *req) {
  char out[160];
  size_t n = zmq_msg_size(req), max = sizeof out - 21;
  memcpy(out, "Error: bad request ", 19);
  if (n > max)
    n = max;
  memcpy(out + 19, zmq_msg_data((zmq_msg_t *)req), n);
  atomic_fetch_add(&k->bad_requests, 1);
  zmq_send(k->zs.sock, out, 19 + n, ZMQ_DONTWAIT);
}

/* rep: requests until EAGAIN (ZMQ_FD is edge-triggered); one left pending
 * blocks nothing but this socket, whose REP state waits for our reply. */
static void on_event(beamd_zsock_t *zs) {
  struct beamd_kout_s *k = (struct beamd_kout_s *)((char *)zs - offsetof(struct beamd_kout_s, zs));
  while (k->pattern == PAT_REP && !k->pending) {
    zmq_msg_t req;
    zmq_msg_init(&req);
    if (zmq_msg_recv(&req, zs->sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&req);
      break;
    }
    int more = zmq_msg_more(&req), ok = !more && zmq_msg_size(&req) == 4 &&
                                        memcmp(zmq_msg_data(&req), "next", 4) == 0;
    while (more) { /* a multipart request is a bad one: read it all first */
      zmq_msg_t rest;
      zmq_msg_init(&rest);
      more = zmq_msg_recv(&rest, zs->sock, 0) >= 0 && zmq_msg_more(&rest);
      zmq_msg_close(&rest);
    }
    if (ok) {
      atomic_fetch_add(&k->requests, 1);
      k->pending = 1;
      serve(k);
    } else {
      bad_request(k, &req);
    }
    zmq_msg_close(&req);
  }
  /* Processes the commands ZeroMQ holds so ZMQ_FD stops signalling. */
  beamd_zsock_events(zs);
}

/* ---- the daemon's calls --------------------------------------------------------- */

int beamd_karabo_open(beamd_t *d, char *err, size_t errlen) {
  const beam_cnode_t *conf = conf_of(d->cfg);
  beam_ep_sec_t sec;
  const char *ep = endpoint_of(conf, &sec);
  if (!ep[0])
    return 0;
  struct beamd_kout_s *k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(err, errlen, "output.karabo: out of memory");
    return BEAM_ENOMEM;
  }
  d->kout = k;
  k->d = d;
  k->pattern = (int)beam_cfg_int(conf, "pattern", PAT_REP);
  k->budget = (size_t)beam_cfg_int(conf, "buffer", 256 << 20);
  const char *t = beam_cfg_str(conf, "topics"), *sp = beam_cfg_str(conf, "source_prefix");
  snprintf(k->endpoint, sizeof k->endpoint, "%s", ep);
  snprintf(k->topics, sizeof k->topics, "%s", t ? t : "");
  snprintf(k->source_prefix, sizeof k->source_prefix, "%s", sp ? sp : "beamd/");
  msgpack_sbuffer_init(&k->sb);
  if (pack_error_pair(k) < 0) {
    snprintf(err, errlen, "output.karabo: out of memory");
    return BEAM_ENOMEM;
  }
  const char *fault = getenv("BEAMD_FAULT_KARABO_REPLY");
  fail_at = fault ? strtoul(fault, NULL, 10) : 0;
  fail_seen = 0;
  static const int types[] = {ZMQ_REP, ZMQ_PUB, ZMQ_PUSH};
  beamd_zopts_t o = {.sndhwm = (int)beam_cfg_int(conf, "hwm", 4), .sec = &sec,
                     .what = "output.karabo.endpoint"};
  char zerr[512];
  if (beamd_zsock_open(d, &k->zs, types[k->pattern], ep, 1, &o, on_event, zerr, sizeof zerr) < 0) {
    snprintf(err, errlen, "output.karabo.endpoint: %s", zerr);
    return BEAM_EIO;
  }
  return 0;
}

static slot_t *slot_for(struct beamd_kout_s *k, const char *topic) {
  for (unsigned i = 0; i < k->nslots; i++)
    if (strcmp(k->slot[i].topic, topic) == 0)
      return &k->slot[i];
  if (k->nslots < SLOTS) {
    slot_t *s = &k->slot[k->nslots++];
    memset(s, 0, sizeof *s);
    snprintf(s->topic, sizeof s->topic, "%s", topic);
    return s;
  }
  return NULL;
}

void beamd_karabo_result(beamd_t *d, const beam_frame_t *f) {
  struct beamd_kout_s *k = d->kout;
  if (!k || !k->zs.open)
    return;
  const char *topic = beam_pool_topic(f->pool);
  if (!topic || strncmp(topic, k->topics, strlen(k->topics)) != 0 ||
      !beam_dtype_size(f->dtype))
    return;
  if (k->pattern != PAT_REP) {
    slot_t s = {0};
    slot_fill(k, &s, f, topic);
    if (!(s.copy = copy_new(k, f)) || send_source(k, &s) != 0) {
      atomic_fetch_add(&k->dropped, 1);
      return;
    }
    atomic_fetch_add(&k->messages, 1);
    atomic_fetch_add(&k->results, 1);
    return;
  }
  slot_t *s = slot_for(k, topic);
  if (!s) {
    atomic_fetch_add(&k->dropped, 1);
    return;
  }
  if (s->copy) { /* the older one was never asked for */
    copy_free(NULL, s->copy);
    s->copy = NULL;
    atomic_fetch_add(&k->dropped, 1);
  }
  if (!(s->copy = copy_new(k, f))) {
    atomic_fetch_add(&k->dropped, 1);
    return;
  }
  slot_fill(k, s, f, topic);
  if (k->pending)
    serve(k);
}

void beamd_karabo_unwatch(beamd_t *d) {
  if (d->kout)
    beamd_zsock_unwatch(&d->kout->zs);
}

void beamd_karabo_close(beamd_t *d, int linger_ms) {
  struct beamd_kout_s *k = d->kout;
  if (!k)
    return;
  for (unsigned i = 0; i < k->nslots; i++)
    if (k->slot[i].copy)
      copy_free(NULL, k->slot[i].copy);
  beamd_zsock_close(&k->zs, linger_ms);
  msgpack_sbuffer_destroy(&k->sb);
  msgpack_sbuffer_destroy(&k->err);
  /* Copies still inside ZeroMQ count down k->held from its I/O threads
   * until zmq_ctx_term: k lives until beamd_fini frees it after that. */
  d->kout_garbage = k;
  d->kout = NULL;
}

void beamd_karabo_stats(beamd_t *d, json_t *outs) {
  struct beamd_kout_s *k = d->kout;
  if (!k || !k->zs.open)
    return;
  static const char *const pats[] = {"rep", "pub", "push"};
  unsigned waiting = 0;
  for (unsigned i = 0; i < k->nslots; i++)
    waiting += k->slot[i].copy != NULL;
  json_t *j = json_object();
  json_object_set_new(j, "endpoint", json_string(k->endpoint));
  json_object_set_new(j, "pattern", json_string(pats[k->pattern]));
  json_object_set_new(j, "messages", json_integer((json_int_t)atomic_load(&k->messages)));
  json_object_set_new(j, "served", json_integer((json_int_t)atomic_load(&k->results)));
  json_object_set_new(j, "bytes", json_integer((json_int_t)atomic_load(&k->bytes)));
  json_object_set_new(j, "dropped", json_integer((json_int_t)atomic_load(&k->dropped)));
  json_object_set_new(j, "requests", json_integer((json_int_t)atomic_load(&k->requests)));
  json_object_set_new(j, "bad_requests", json_integer((json_int_t)atomic_load(&k->bad_requests)));
  json_object_set_new(j, "reply_errors", json_integer((json_int_t)atomic_load(&k->reply_errors)));
  json_object_set_new(j, "waiting", json_integer(waiting));
  json_object_set_new(j, "pending", json_boolean(k->pending));
  json_object_set_new(j, "held_bytes", json_integer((json_int_t)atomic_load(&k->held)));
  json_object_set_new(outs, "karabo", j);
}

void beamd_karabo_counters(beamd_t *d, uint64_t *served, uint64_t *dropped) {
  struct beamd_kout_s *k = d->kout;
  *served = k ? atomic_load(&k->results) : 0;
  *dropped = k ? atomic_load(&k->dropped) : 0;
}

int beamd_karabo_same(const beam_config_t *a, const beam_config_t *b) {
  char *x = beam_cfg_dump(conf_of(a)), *y = beam_cfg_dump(conf_of(b));
  int same = (!x && !y) || (x && y && strcmp(x, y) == 0);
  free(x);
  free(y);
  return same;
}
