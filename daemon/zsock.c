/* ZeroMQ sockets on the libuv loop: uv_poll on ZMQ_FD. The FD only says
 * "something changed" (edge-triggered), so owners read or write until
 * EAGAIN and re-check ZMQ_EVENTS themselves. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"

static void poll_cb(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  beamd_zsock_t *zs = h->data;
  if (zs->open && zs->on_event)
    zs->on_event(zs);
}

int beamd_zsock_open(beamd_t *d, beamd_zsock_t *zs, int type, const char *endpoint, int bind,
                     const beamd_zopts_t *o, void (*on_event)(beamd_zsock_t *), char *err,
                     size_t errlen) {
  memset(zs, 0, sizeof *zs);
  zs->d = d;
  zs->on_event = on_event;
  zs->sock = zmq_socket(d->zctx, type);
  if (!zs->sock) {
    snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
    return BEAM_EIO;
  }
  int zero = 0;
  zmq_setsockopt(zs->sock, ZMQ_LINGER, &zero, sizeof zero);
  if (o && o->rcvhwm > 0)
    zmq_setsockopt(zs->sock, ZMQ_RCVHWM, &o->rcvhwm, sizeof o->rcvhwm);
  if (o && o->sndhwm > 0)
    zmq_setsockopt(zs->sock, ZMQ_SNDHWM, &o->sndhwm, sizeof o->sndhwm);
  if (o && o->immediate)
    zmq_setsockopt(zs->sock, ZMQ_IMMEDIATE, &o->immediate, sizeof o->immediate);
  if (type == ZMQ_SUB)
    zmq_setsockopt(zs->sock, ZMQ_SUBSCRIBE, "", 0);
  const char *what = o && o->what ? o->what : endpoint;
  if (o && o->sec && o->sec->curve && beamd_curve_apply(d, zs->sock, o->sec, bind, what, err,
                                                        errlen) != 0) {
    zmq_close(zs->sock);
    zs->sock = NULL;
    return BEAM_ECONFIG;
  }
  int rc = bind ? zmq_bind(zs->sock, endpoint) : zmq_connect(zs->sock, endpoint);
  if (rc != 0) {
    snprintf(err, errlen, "cannot %s %s: %s", bind ? "bind" : "connect to", endpoint,
             zmq_strerror(errno));
    zmq_close(zs->sock);
    zs->sock = NULL;
    return BEAM_EIO;
  }
  beam_diag_t wd = {0};
  if (o && o->sec && o->sec->curve && bind && beam_zap_watch(d->zap, zs->sock, what, &wd) != 0) {
    snprintf(err, errlen, "%s", wd.msg);
    zmq_close(zs->sock);
    zs->sock = NULL;
    return BEAM_EIO;
  }
  int fd;
  size_t fdlen = sizeof fd;
  zmq_getsockopt(zs->sock, ZMQ_FD, &fd, &fdlen);
  uv_poll_init(&d->loop, &zs->poll, fd);
  zs->poll.data = zs;
  uv_poll_start(&zs->poll, UV_READABLE, poll_cb);
  zs->polling = 1;
  zs->open = 1;
  return 0;
}

int beamd_curve_apply(beamd_t *d, void *sock, const beam_ep_sec_t *sec, int bind,
                      const char *what, char *err, size_t errlen) {
  beam_diag_t wd = {0};
  if (!d->curve_ready) {
    snprintf(err, errlen, "%s: curve: true but beamd has no CURVE key loaded", what);
    return -1;
  }
  if (bind) {
    /* Fail closed even if the handler were gone: the domain is enforced. */
    if (!d->zap) {
      snprintf(err, errlen, "%s: no ZAP handler running; refusing to bind a CURVE server", what);
      return -1;
    }
    if (beam_curve_server(sock, &d->cert, &wd) == 0)
      return 0;
  } else {
    beam_cert_t server;
    if (beam_cert_load(sec->server_key, &server, 0, &wd) == 0 &&
        beam_curve_client(sock, &d->cert, server.public_z85, &wd) == 0)
      return 0;
  }
  snprintf(err, errlen, "%s: %s", what, wd.msg);
  return -1;
}

int beamd_zsock_events(beamd_zsock_t *zs) {
  int ev = 0;
  size_t len = sizeof ev;
  if (!zs->open || zmq_getsockopt(zs->sock, ZMQ_EVENTS, &ev, &len) != 0)
    return 0;
  return ev;
}

void beamd_zsock_unwatch(beamd_zsock_t *zs) {
  if (!zs->sock || zs->unwatched)
    return;
  zs->unwatched = 1;
  zs->polling = 0;
  uv_poll_stop(&zs->poll);
  uv_close((uv_handle_t *)&zs->poll, NULL);
}

void beamd_zsock_close(beamd_zsock_t *zs, int linger_ms) {
  if (!zs->sock)
    return;
  beamd_zsock_unwatch(zs);
  zs->open = 0;
  zmq_setsockopt(zs->sock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
  zmq_close(zs->sock);
  zs->sock = NULL;
}
