/* The HTTP + WebSocket side, libwebsockets on the viewer's own libuv loop.
 *
 * One protocol serves both: plain HTTP requests go to the static-file
 * mount (the page), upgrades become browser sessions. With a token, every
 * request and every upgrade must carry it (query "token=", cookie, or
 * "Authorization: Bearer"), else it gets 403 and nothing else; a page
 * loaded with the token in its URL gets it back as a cookie so that its
 * scripts and styles load too.
 *
 * Without a token (loopback only) the listener being unreachable from other
 * hosts is not enough: any page the scientist's browser opens could
 * connect to ws://127.0.0.1:PORT and read results, and a name rebound to
 * 127.0.0.1 (DNS rebinding) could load the page itself under a foreign
 * origin. So every request's Host must be a loopback name with our port,
 * and an upgrade's Origin, when a browser sends one, must be our own page's
 * origin; anything else gets 403 and is counted. Non-browser clients send
 * no Origin and pass.
 *
 * Coalescing: a session remembers, per topic, the version it sent last and
 * when. On writable it sends, in this order, the hello, the newest status,
 * the newest topic list, then the next topic (round robin) whose version
 * moved on and whose per-topic interval (1 / max rate) has passed; the
 * versions in between are skipped and counted. Large messages go out in
 * chunks, one per writable callback, so one slow browser never makes the
 * loop wait and holds exactly one message (a reference, no copy) in flight.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libwebsockets.h>

#include "tools/beamd-view/view.h"
#include "pipeline/frame.h"

/* Small enough that the kernel usually takes a whole chunk, so lws rarely
 * has to buffer (copy) a remainder; measured: 256 KiB chunks cost about a
 * third more CPU in copies. */
#define WS_CHUNK (64 * 1024)
#define WS_RX_MAX 8192 /* a browser's request message, at most */
#define WS_MAX_SUBS 64

typedef struct pss_s {
  struct pss_s *next;
  struct lws *wsi;
  int is_ws;
  int hello_sent;
  uint64_t topics_sent, status_sent;
  uint64_t sent_ver[VIEW_MAX_TOPICS];
  uint64_t last_tx_ns[VIEW_MAX_TOPICS];
  int8_t want[VIEW_MAX_TOPICS]; /* -1 not decided yet */
  char *subs[WS_MAX_SUBS];
  int nsubs, sub_all;
  double rate; /* this browser's limit, <= the server's */
  /* Credit (optional, asked for by the page): results in flight before the
   * browser says it consumed them. Without it a browser that reads its
   * socket eagerly but draws slowly would queue results inside itself,
   * where latest-wins cannot reach them. */
  int windowed; /* the window (0: no flow control) */
  int64_t credit;
  view_msg_t *cur;
  size_t off;
  unsigned char *chunk; /* LWS_PRE + WS_CHUNK */
  unsigned rr;
  uint64_t sent, coalesced;
  char *rx;
  size_t rxlen;
} pss_t;

struct view_ws_s {
  view_t *v;
  struct lws_context *ctx;
  struct lws_protocols protocols[2];
  struct lws_http_mount mount;
  pss_t *clients;
  int nclients;
  char cookie_name[64];
  uint64_t rejected;        /* token missing or wrong */
  uint64_t refused_host;    /* loopback mode: a Host that is not ours */
  uint64_t refused_origin;  /* loopback mode: an upgrade from a foreign page */
  /* Loopback mode: the Host values (and, with "http://" before them, the
   * Origin values) that name this viewer; "" ends the list. */
  char names[5][80];
};

static view_ws_t *ws_of(struct lws *wsi) {
  return lws_context_user(lws_get_context(wsi));
}

/* ---- token ------------------------------------------------------------------ */

static int same(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  unsigned char d = (unsigned char)(la != lb);
  for (size_t i = 0; i < lb; i++) /* time depends on the expected length only */
    d |= (unsigned char)(a[i < la ? i : 0] ^ b[i]);
  return d == 0;
}

/* The value of cookie `name` in a Cookie header, copied to out. */
static int cookie_value(const char *hdr, const char *name, char *out, size_t cap) {
  size_t nl = strlen(name);
  const char *p = hdr;
  while (p && *p) {
    while (*p == ' ' || *p == ';')
      p++;
    if (!strncmp(p, name, nl) && p[nl] == '=') {
      p += nl + 1;
      size_t n = strcspn(p, ";");
      if (n >= cap)
        return -1;
      memcpy(out, p, n);
      out[n] = 0;
      return 0;
    }
    p = strchr(p, ';');
  }
  return -1;
}

static int token_ok(view_ws_t *w, struct lws *wsi) {
  const char *tok = w->v->o->token;
  if (!tok)
    return 1;
  char buf[512];
  const char *q = lws_get_urlarg_by_name(wsi, "token=", buf, sizeof buf);
  if (q && same(q, tok))
    return 1;
  if (lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION) > 0 &&
      !strncmp(buf, "Bearer ", 7) && same(buf + 7, tok))
    return 1;
  char val[256];
  if (lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_COOKIE) > 0 &&
      !cookie_value(buf, w->cookie_name, val, sizeof val) && same(val, tok))
    return 1;
  return 0;
}

static int forbid(view_ws_t *w, struct lws *wsi) {
  w->rejected++;
  if (w->v->o->verbose) {
    char peer[64] = "";
    lws_get_peer_simple(wsi, peer, sizeof peer);
    fprintf(stderr, "beamd-view: 403 for %s (missing or wrong token)\n", peer);
  }
  lws_return_http_status(wsi, HTTP_STATUS_FORBIDDEN, NULL);
  return -1;
}

/* ---- loopback: Host and Origin ------------------------------------------------------ */

#define REFUSALS_LOGGED 10 /* then counted only: a hostile page may retry in a loop */

static void add_name(view_ws_t *w, int *k, const char *host, int port) {
  if (*k >= (int)(sizeof w->names / sizeof w->names[0]))
    return;
  int ipv6 = strchr(host, ':') != NULL;
  snprintf(w->names[(*k)++], sizeof w->names[0], "%s%s%s:%d", ipv6 ? "[" : "", host,
           ipv6 ? "]" : "", port);
}

static void names_init(view_ws_t *w) {
  int k = 0, port = w->v->o->port;
  add_name(w, &k, "127.0.0.1", port);
  add_name(w, &k, "localhost", port);
  add_name(w, &k, "::1", port);
  const char *b = w->v->o->bind; /* e.g. 127.0.0.2: the page is loaded by that name */
  if (strcmp(b, "127.0.0.1") && strcmp(b, "localhost") && strcmp(b, "::1"))
    add_name(w, &k, b, port);
}

/* Host header values name a host case-insensitively; a browser leaves out
 * the port only when it is 80. */
static int is_our_name(view_ws_t *w, const char *v) {
  for (size_t i = 0; i < sizeof w->names / sizeof w->names[0] && w->names[i][0]; i++) {
    const char *n = w->names[i];
    if (!strcasecmp(v, n))
      return 1;
    size_t hl = strlen(n) - strlen(strrchr(n, ':'));
    if (w->v->o->port == 80 && strlen(v) == hl && !strncasecmp(v, n, hl))
      return 1;
  }
  return 0;
}

static int refuse(view_ws_t *w, struct lws *wsi, uint64_t *counter, const char *what,
                  const char *value) {
  ++*counter;
  uint64_t n = w->refused_host + w->refused_origin;
  if (w->v->o->verbose || n <= REFUSALS_LOGGED) {
    char peer[64] = "";
    lws_get_peer_simple(wsi, peer, sizeof peer);
    fprintf(stderr, "beamd-view: 403 for %s: %s \"%.100s\" is not this viewer's%s\n", peer,
            what, value,
            n == REFUSALS_LOGGED && !w->v->o->verbose ? " (further refusals are counted only)"
                                                      : "");
  }
  lws_return_http_status(wsi, HTTP_STATUS_FORBIDDEN, NULL);
  return -1;
}

/* 0 to go on; -1 when refused (the 403 is sent). Token mode: the token
 * is the check, any Host or Origin may carry it. */
static int origin_ok(view_ws_t *w, struct lws *wsi, int upgrade) {
  if (w->v->o->token)
    return 0;
  char buf[256];
  int n = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HOST);
  if (n <= 0 || !is_our_name(w, buf))
    return refuse(w, wsi, &w->refused_host, "Host", n > 0 ? buf : "");
  if (upgrade && lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) > 0) {
    n = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_ORIGIN);
    if (n <= 7 || strncasecmp(buf, "http://", 7) || !is_our_name(w, buf + 7))
      return refuse(w, wsi, &w->refused_origin, "Origin", n > 0 ? buf : "(too long)");
  }
  return 0;
}

/* ---- static files ------------------------------------------------------------------ */

static const char *mime_of(const char *name) {
  const char *dot = strrchr(name, '.');
  static const char *map[][2] = {{".html", "text/html; charset=utf-8"},
                                 {".js", "text/javascript; charset=utf-8"},
                                 {".css", "text/css; charset=utf-8"},
                                 {".png", "image/png"},
                                 {".svg", "image/svg+xml"},
                                 {".ico", "image/x-icon"}};
  for (size_t i = 0; dot && i < sizeof map / sizeof map[0]; i++)
    if (!strcmp(dot, map[i][0]))
      return map[i][1];
  return NULL;
}

static int http_done(struct lws *wsi, int rc) {
  if (rc < 0 || (rc > 0 && lws_http_transaction_completed(wsi)))
    return -1;
  return 0;
}

/* Files of the assets directory, flat, by plain names only (no path can
 * leave it). With a token the reply sets it as a cookie, so the page's own
 * requests (scripts, styles, the WebSocket) carry it without it being
 * written into them. */
static int serve_file(view_ws_t *w, struct lws *wsi, const char *uri) {
  while (*uri == '/')
    uri++;
  const char *name = *uri ? uri : "index.html";
  const char *mime = mime_of(name);
  size_t n = strlen(name);
  if (!mime || n > 64 || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_.-") != n ||
      name[0] == '.')
    return http_done(wsi, lws_return_http_status(wsi, HTTP_STATUS_NOT_FOUND, NULL));
  char path[PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/%s", w->v->o->assets, name);
  unsigned char hdr[LWS_PRE + 512], *p = hdr + LWS_PRE, *end = hdr + sizeof hdr;
  if (w->v->o->token) {
    char c[300];
    int k = snprintf(c, sizeof c, "%s=%s; Path=/; HttpOnly; SameSite=Strict", w->cookie_name,
                     w->v->o->token);
    if (k < 0 || (size_t)k >= sizeof c ||
        lws_add_http_header_by_name(wsi, (const unsigned char *)"set-cookie:",
                                    (const unsigned char *)c, k, &p, end))
      return -1;
  }
  int rc = lws_serve_http_file(wsi, path, mime, (const char *)hdr + LWS_PRE,
                               (int)(p - (hdr + LWS_PRE)));
  return http_done(wsi, rc);
}

/* ---- sessions ------------------------------------------------------------------- */

static void subs_clear(pss_t *p) {
  for (int i = 0; i < p->nsubs; i++)
    free(p->subs[i]);
  p->nsubs = 0;
  memset(p->want, -1, sizeof p->want);
}

static int wanted(pss_t *p, int i, const char *name) {
  if (p->want[i] < 0) {
    int w = p->sub_all;
    for (int k = 0; !w && k < p->nsubs; k++) {
      size_t n = strlen(p->subs[k]);
      /* "g2." is a prefix, "g2.g2" a topic; both match as prefixes, as
       * ZeroMQ subscriptions do. */
      w = !strncmp(name, p->subs[k], n);
    }
    /* The daemon's own documents always go: they drive the status view. */
    if (!strncmp(name, "beamd.", 6))
      w = 1;
    p->want[i] = (int8_t)w;
  }
  return p->want[i];
}

/* A browser's request: {"subscribe": ["topic or prefix", ...] | "*"},
 * {"max_rate": x}, {"window": k} (at most k results unacknowledged,
 * 1..64), {"ack": n} (n results consumed). Unknown keys are ignored, and
 * so is a bad request: nothing a browser sends can hurt the viewer. */
static void on_request(view_t *v, pss_t *p, const char *s, size_t n) {
  json_t *j = json_loadb(s, n, 0, NULL);
  if (!j || !json_is_object(j)) {
    json_decref(j);
    return;
  }
  json_t *sub = json_object_get(j, "subscribe");
  if (sub) {
    subs_clear(p);
    p->sub_all = json_is_string(sub) && !strcmp(json_string_value(sub), "*");
    size_t i;
    json_t *e;
    json_array_foreach(sub, i, e) {
      const char *str = json_string_value(e);
      if (str && p->nsubs < WS_MAX_SUBS && strlen(str) <= BEAM_TOPIC_MAX &&
          (p->subs[p->nsubs] = strdup(str)))
        p->nsubs++;
    }
    /* A newly wanted topic is sent at once, even if it did not change. */
    for (int t = 0; t < v->ntopics; t++)
      if (wanted(p, t, v->topics[t]->name) && p->sent_ver[t] == v->topics[t]->ver &&
          v->topics[t]->ver)
        p->sent_ver[t] = 0;
  }
  json_t *win = json_object_get(j, "window"), *ack = json_object_get(j, "ack");
  if (json_is_integer(win) && json_integer_value(win) >= 1 && json_integer_value(win) <= 64) {
    p->windowed = (int)json_integer_value(win);
    p->credit = p->windowed;
  }
  /* Credit never exceeds the window, whatever a browser acknowledges. */
  if (p->windowed && json_is_integer(ack) && json_integer_value(ack) > 0) {
    json_int_t c = p->credit + json_integer_value(ack);
    p->credit = c < p->windowed ? c : p->windowed;
  }
  json_t *r = json_object_get(j, "max_rate");
  if (json_is_number(r)) {
    double x = json_number_value(r);
    p->rate = x > 0 && x < v->o->max_rate ? x : v->o->max_rate;
  }
  json_decref(j);
}

static view_msg_t *hello(view_t *v) {
  json_t *o = json_pack("{s:s, s:s, s:f, s:i, s:s, s:b}", "type", "hello", "server",
                        "beamd-view", "max_rate", v->o->max_rate, "max_side", (int)v->o->max_side,
                        "downsample", v->o->ds_max ? "max" : "mean", "control",
                        v->o->control != NULL);
  json_object_set_new(o, "t_tx_ns", json_integer((json_int_t)beam_realtime_ns()));
  json_t *subs = json_array();
  for (int i = 0; i < v->o->nsub; i++)
    json_array_append_new(subs, json_string(v->o->sub[i]));
  json_object_set_new(o, "subs", subs);
  view_msg_t *m = view_msg_new(o, NULL, 0);
  json_decref(o);
  return m;
}

/* The next message for this session, or NULL; *wait_us says when a
 * rate-limited topic becomes due (0: nothing waiting). */
static view_msg_t *next_msg(view_t *v, pss_t *p, int64_t *wait_us) {
  *wait_us = 0;
  if (!p->hello_sent) {
    p->hello_sent = 1;
    view_msg_t *m = hello(v);
    if (m)
      return m;
  }
  if (v->status_msg && p->status_sent != v->status_ver) {
    p->status_sent = v->status_ver;
    return view_msg_ref(v->status_msg);
  }
  if (v->topics_msg && p->topics_sent != v->topics_ver) {
    p->topics_sent = v->topics_ver;
    return view_msg_ref(v->topics_msg);
  }
  if (p->windowed && p->credit <= 0)
    return NULL; /* the next ack asks for writable again */
  uint64_t now = beam_now_ns(), interval = (uint64_t)(1e9 / p->rate), soonest = 0;
  int n = v->ntopics;
  for (int k = 0; k < n; k++) {
    int i = (int)((p->rr + (unsigned)k) % (unsigned)n);
    view_topic_t *t = v->topics[i];
    if (t->ver == p->sent_ver[i] || !wanted(p, i, t->name))
      continue;
    uint64_t due = p->last_tx_ns[i] + interval;
    if (p->last_tx_ns[i] && now < due) {
      if (!soonest || due < soonest)
        soonest = due;
      continue;
    }
    view_msg_t *m = view_topic_disp(v, t);
    if (p->sent_ver[i] && t->ver > p->sent_ver[i] + 1)
      p->coalesced += t->ver - p->sent_ver[i] - 1;
    p->sent_ver[i] = t->ver;
    if (!m)
      continue;
    p->last_tx_ns[i] = now;
    p->rr = (unsigned)i + 1;
    p->credit--;
    return view_msg_ref(m);
  }
  if (soonest)
    *wait_us = (int64_t)((soonest - now) / 1000) + 1;
  return NULL;
}

static int on_writable(view_t *v, pss_t *p, struct lws *wsi) {
  if (!p->cur) {
    int64_t wait_us;
    p->cur = next_msg(v, p, &wait_us);
    p->off = 0;
    if (!p->cur) {
      if (wait_us > 0)
        lws_set_timer_usecs(wsi, wait_us);
      return 0;
    }
  }
  size_t left = p->cur->len - p->off, n = left < WS_CHUNK ? left : WS_CHUNK;
  int first = p->off == 0, last = n == left;
  /* lws writes the frame header into the LWS_PRE bytes before the data, so
   * a chunk from the middle of a shared message must be copied first. */
  unsigned char *src;
  if (first) {
    src = p->cur->buf + LWS_PRE;
  } else {
    memcpy(p->chunk + LWS_PRE, p->cur->buf + LWS_PRE + p->off, n);
    src = p->chunk + LWS_PRE;
  }
  int flags = lws_write_ws_flags(LWS_WRITE_BINARY, first, last);
  if (lws_write(wsi, src, n, (enum lws_write_protocol)flags) < (int)n)
    return -1;
  p->off += n;
  if (last) {
    view_msg_unref(&p->cur);
    p->sent++;
  }
  /* More of this message, or maybe another one: ask again. */
  lws_callback_on_writable(wsi);
  return 0;
}

static void session_free(view_ws_t *w, pss_t *p) {
  if (!p->is_ws)
    return;
  for (pss_t **pp = &w->clients; *pp; pp = &(*pp)->next)
    if (*pp == p) {
      *pp = p->next;
      w->nclients--;
      break;
    }
  view_msg_unref(&p->cur);
  subs_clear(p);
  free(p->chunk);
  free(p->rx);
  p->is_ws = 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len) {
  view_ws_t *w = ws_of(wsi);
  pss_t *p = user;
  switch (reason) {
  case LWS_CALLBACK_FILTER_HTTP_CONNECTION:
    if (!token_ok(w, wsi))
      return forbid(w, wsi);
    if (origin_ok(w, wsi, 0) < 0)
      return -1;
    break;
  case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
    if (!token_ok(w, wsi))
      return forbid(w, wsi);
    if (origin_ok(w, wsi, 1) < 0)
      return -1;
    break;
  case LWS_CALLBACK_HTTP:
    return serve_file(w, wsi, in);
  case LWS_CALLBACK_ESTABLISHED:
    memset(p, 0, sizeof *p);
    p->wsi = wsi;
    p->is_ws = 1;
    p->rate = w->v->o->max_rate;
    p->sub_all = 1;
    memset(p->want, -1, sizeof p->want);
    p->chunk = malloc(LWS_PRE + WS_CHUNK);
    if (!p->chunk)
      return -1;
    p->next = w->clients;
    w->clients = p;
    w->nclients++;
    lws_callback_on_writable(wsi);
    break;
  case LWS_CALLBACK_SERVER_WRITEABLE:
    if (w->v->stopping)
      return -1;
    return on_writable(w->v, p, wsi);
  case LWS_CALLBACK_TIMER:
    lws_callback_on_writable(wsi);
    break;
  case LWS_CALLBACK_RECEIVE:
    if (p->rxlen + len > WS_RX_MAX)
      return -1; /* no request of ours is that long */
    if (!p->rx && !(p->rx = malloc(WS_RX_MAX)))
      return -1;
    memcpy(p->rx + p->rxlen, in, len);
    p->rxlen += len;
    if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
      on_request(w->v, p, p->rx, p->rxlen);
      p->rxlen = 0;
      lws_callback_on_writable(wsi);
    }
    break;
  case LWS_CALLBACK_CLOSED:
    session_free(w, p);
    break;
  default:
    break;
  }
  return lws_callback_http_dummy(wsi, reason, user, in, len);
}

/* ---- public --------------------------------------------------------------------- */

void view_ws_kick(view_t *v) {
  view_ws_t *w = v->ws;
  if (!w || !w->ctx)
    return;
  for (pss_t *p = w->clients; p; p = p->next)
    if (!p->cur) /* a session in mid-message asks by itself */
      lws_callback_on_writable(p->wsi);
}

int view_ws_clients(const view_t *v) { return v->ws ? v->ws->nclients : 0; }

void view_ws_refused(const view_t *v, uint64_t *token, uint64_t *host, uint64_t *origin) {
  const view_ws_t *w = v->ws;
  *token = w ? w->rejected : 0;
  *host = w ? w->refused_host : 0;
  *origin = w ? w->refused_origin : 0;
}

static void lws_log(int level, const char *line) {
  (void)level;
  fprintf(stderr, "beamd-view: lws: %s", line);
}

int view_ws_open(view_t *v, char *err, size_t errlen) {
  view_ws_t *w = calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  w->v = v;
  v->ws = w;
  snprintf(w->cookie_name, sizeof w->cookie_name, "beamd_view_token_%d", v->o->port);
  names_init(w);
  lws_set_log_level(v->o->verbose ? LLL_ERR | LLL_WARN | LLL_NOTICE : LLL_ERR, lws_log);

  w->protocols[0] = (struct lws_protocols){
      .name = "beamd-view",
      .callback = callback,
      .per_session_data_size = sizeof(pss_t),
      .rx_buffer_size = 0,
  };
  w->mount.mountpoint = "/";
  w->mount.mountpoint_len = 1;
  w->mount.origin = "beamd-view"; /* the protocol whose LWS_CALLBACK_HTTP serves */
  w->mount.origin_protocol = LWSMPRO_CALLBACK;

  struct lws_context_creation_info info;
  memset(&info, 0, sizeof info);
  void *loops[1] = {v->loop};
  info.port = v->o->port;
  info.iface = v->o->bind;
  info.protocols = w->protocols;
  info.mounts = &w->mount;
  info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_VALIDATE_UTF8;
  if (!strchr(v->o->bind, ':'))
    info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
  info.foreign_loops = loops;
  info.pcontext = &w->ctx;
  info.user = w;
  info.vhost_name = "beamd-view";
  info.server_string = "beamd-view";
  w->ctx = lws_create_context(&info);
  if (!w->ctx) {
    snprintf(err, errlen, "cannot serve on %s port %d (in use, or not an address of this host?)",
             v->o->bind, v->o->port);
    return -1;
  }
  return 0;
}

void view_ws_close(view_t *v) {
  view_ws_t *w = v->ws;
  if (w && w->ctx)
    lws_context_destroy(w->ctx); /* sets w->ctx to NULL through pcontext */
}

void view_ws_free(view_t *v) {
  view_ws_t *w = v->ws;
  if (!w)
    return;
  if (w->ctx)
    lws_context_destroy(w->ctx);
  free(w);
  v->ws = NULL;
}
