/* Prometheus text exposition on HTTP GET /metrics. The page is rendered at
 * the heartbeat (so a scrape costs nothing on the data path) and served by a
 * deliberately small HTTP/1.0-style responder on the loop: one request per
 * connection, 8 KiB request limit, then close. Anything but GET /metrics is
 * 404 (or 405 for other methods). With metrics.token_file every request
 * must carry "Authorization: Bearer <token>" (Prometheus' bearer_token_file),
 * or it gets 401. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "daemon/beamd.h"

#define REQ_MAX 8192

typedef struct conn_s {
  uv_tcp_t tcp;
  uv_write_t wr;
  beamd_t *d;
  char req[REQ_MAX];
  size_t len;
  char *resp;
  int responded;
} conn_t;

static void conn_closed(uv_handle_t *h) {
  conn_t *c = h->data;
  free(c->resp);
  free(c);
}

static void conn_close(conn_t *c) {
  if (!uv_is_closing((uv_handle_t *)&c->tcp))
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void written(uv_write_t *w, int status) {
  (void)status;
  conn_close(w->data);
}

static void respond(conn_t *c, int code, const char *reason, const char *ctype, const char *body,
                    size_t blen) {
  size_t cap = blen + 256;
  c->resp = malloc(cap);
  if (!c->resp) {
    conn_close(c);
    return;
  }
  int n = snprintf(c->resp, cap,
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\n\r\n",
                   code, reason, ctype, blen);
  memcpy(c->resp + n, body, blen);
  uv_buf_t b = uv_buf_init(c->resp, (unsigned)(n + (int)blen));
  c->wr.data = c;
  c->responded = 1;
  if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, written) != 0)
    conn_close(c);
}

/* Compares all of both strings, so the time taken says nothing about how
 * much of a guess was right. */
static int same_secret(const char *a, size_t an, const char *b, size_t bn) {
  unsigned diff = an != bn;
  for (size_t i = 0; i < an; i++)
    diff |= (unsigned char)a[i] ^ (unsigned char)(i < bn ? b[i] : 0);
  return diff == 0;
}

static int authorized(const beamd_t *d, const char *req) {
  if (!d->met.token)
    return 1;
  for (const char *p = strchr(req, '\n'); p; p = strchr(p, '\n')) {
    p++;
    if (strncasecmp(p, "Authorization:", 14))
      continue;
    p += 14;
    while (*p == ' ' || *p == '\t')
      p++;
    if (strncasecmp(p, "Bearer ", 7))
      return 0;
    p += 7;
    size_t n = strcspn(p, "\r\n");
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
      n--;
    return same_secret(p, n, d->met.token, strlen(d->met.token));
  }
  return 0;
}

static void handle_request(conn_t *c) {
  beamd_t *d = c->d;
  atomic_fetch_add(&d->met.requests, 1);
  char method[8] = "", path[256] = "";
  if (!authorized(d, c->req)) {
    atomic_fetch_add(&d->met.denied, 1);
    beam_log_rl(&d->met.rl, LOG_WARNING, "metrics: refused a request without the bearer token");
    const char *b = "unauthorized: send Authorization: Bearer <token>\n";
    respond(c, 401, "Unauthorized\r\nWWW-Authenticate: Bearer realm=\"beamd\"", "text/plain", b,
            strlen(b));
  } else if (sscanf(c->req, "%7s %255s", method, path) != 2) {
    const char *b = "bad request\n";
    respond(c, 400, "Bad Request", "text/plain", b, strlen(b));
  } else if (strcmp(method, "GET") != 0) {
    const char *b = "only GET\n";
    respond(c, 405, "Method Not Allowed", "text/plain", b, strlen(b));
  } else if (strcmp(path, "/metrics") == 0) {
    if (!d->met.text)
      beamd_metrics_render(d);
    respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", d->met.text ? d->met.text : "",
            d->met.len);
  } else {
    const char *b = "not found: try /metrics\n";
    respond(c, 404, "Not Found", "text/plain", b, strlen(b));
  }
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn_t *c = h->data;
  buf->base = c->req + c->len;
  buf->len = REQ_MAX - 1 - c->len;
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  conn_t *c = s->data;
  if (n < 0) {
    conn_close(c);
    return;
  }
  if (c->responded)
    return;
  c->len += (size_t)n;
  c->req[c->len] = 0;
  if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n")) {
    uv_read_stop(s);
    handle_request(c);
  } else if (c->len >= REQ_MAX - 1) {
    uv_read_stop(s);
    const char *b = "request too large\n";
    respond(c, 431, "Request Header Fields Too Large", "text/plain", b, strlen(b));
  }
}

static void on_connection(uv_stream_t *server, int status) {
  beamd_t *d = server->data;
  if (status < 0)
    return;
  conn_t *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->d = d;
  uv_tcp_init(&d->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
      uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb) != 0)
    conn_close(c);
}

/* The first line of the file, without surrounding blanks. */
static int load_token(beamd_t *d, char *err, size_t errlen) {
  const char *path = d->cfg->metrics.token_file;
  FILE *f = fopen(path, "r");
  char buf[512] = "";
  if (!f || !fgets(buf, sizeof buf, f)) {
    snprintf(err, errlen, "metrics.token_file: %s: %s", path, f ? "empty" : strerror(errno));
    if (f)
      fclose(f);
    return -1;
  }
  fclose(f);
  char *p = buf;
  while (*p == ' ' || *p == '\t')
    p++;
  size_t n = strcspn(p, "\r\n");
  while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
    n--;
  p[n] = 0;
  if (n < 16) {
    snprintf(err, errlen, "metrics.token_file: %s: the token is shorter than 16 characters",
             path);
    return -1;
  }
  d->met.token = strdup(p);
  return d->met.token ? 0 : -1;
}

int beamd_metrics_open(beamd_t *d, char *err, size_t errlen) {
  const char *listen = d->cfg->metrics.listen;
  if (!listen[0])
    return 0;
  char host[128];
  const char *colon = strrchr(listen, ':');
  if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host) {
    snprintf(err, errlen, "metrics.listen: expected host:port, got \"%s\"", listen);
    return BEAM_ECONFIG;
  }
  memcpy(host, listen, (size_t)(colon - listen));
  host[colon - listen] = 0;
  int port = atoi(colon + 1);
  struct sockaddr_storage addr;
  int rc = strchr(host, ':') ? uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr)
                             : uv_ip4_addr(host, port, (struct sockaddr_in *)&addr);
  if (rc != 0) {
    snprintf(err, errlen, "metrics.listen: bad address \"%s\": %s", listen, uv_strerror(rc));
    return BEAM_ECONFIG;
  }
  if (d->cfg->metrics.token_file[0] && load_token(d, err, errlen) != 0)
    return BEAM_ECONFIG;
  beam_ratelimit_init(&d->met.rl, 1);
  uv_tcp_init(&d->loop, &d->met.server);
  d->met.server.data = d;
  d->met.open = 1;
  if ((rc = uv_tcp_bind(&d->met.server, (struct sockaddr *)&addr, 0)) != 0 ||
      (rc = uv_listen((uv_stream_t *)&d->met.server, 64, on_connection)) != 0) {
    snprintf(err, errlen, "metrics: cannot listen on %s: %s", listen, uv_strerror(rc));
    return BEAM_EIO;
  }
  return 0;
}

void beamd_metrics_close(beamd_t *d) {
  if (d->met.open && !uv_is_closing((uv_handle_t *)&d->met.server))
    uv_close((uv_handle_t *)&d->met.server, NULL);
  d->met.open = 0;
  free(d->met.text);
  d->met.text = NULL;
  free(d->met.token);
  d->met.token = NULL;
}
