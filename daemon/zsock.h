/* ZeroMQ sockets on the libuv loop (zsock.c): a socket and the uv_poll on
 * its ZMQ_FD. Loop thread only, as every ZeroMQ socket in beamd. */
#ifndef BEAMD_ZSOCK_H
#define BEAMD_ZSOCK_H

#include <stddef.h>

#include <uv.h>

typedef struct beamd_s beamd_t;

/* A ZeroMQ socket watched by the loop. ZMQ_FD is edge-triggered: callers
 * drain until EAGAIN on every wake-up. */
typedef struct beamd_zsock_s {
  void *sock;
  uv_poll_t poll;
  int polling;
  int open;
  int unwatched; /* uv_poll handle closed (the socket may still be open) */
  beamd_t *d;
  void (*on_event)(struct beamd_zsock_s *zs);
} beamd_zsock_t;

typedef struct beam_ep_sec_s beam_ep_sec_t;

/* Options set before bind/connect (0 = ZeroMQ default). */
typedef struct beamd_zopts_s {
  int rcvhwm, sndhwm;
  int immediate; /* PUSH: queue only to completed connections */
  const beam_ep_sec_t *sec; /* CURVE or plaintext (NULL: plaintext) */
  const char *what;         /* the config key, for messages ("control.endpoint") */
} beamd_zopts_t;

int beamd_zsock_open(beamd_t *d, beamd_zsock_t *zs, int type, const char *endpoint, int bind,
                     const beamd_zopts_t *o, void (*on_event)(beamd_zsock_t *), char *err,
                     size_t errlen);
/* Stops watching (closes the uv_poll handle) but keeps the socket. */
void beamd_zsock_unwatch(beamd_zsock_t *zs);
void beamd_zsock_close(beamd_zsock_t *zs, int linger_ms);
int beamd_zsock_events(beamd_zsock_t *zs); /* ZMQ_EVENTS: ZMQ_POLLIN | ZMQ_POLLOUT */
/* CURVE options for sock by sec: server with d's key when bound (and only
 * with the ZAP handler running), client with sec->server_key otherwise. */
int beamd_curve_apply(beamd_t *d, void *sock, const beam_ep_sec_t *sec, int bind,
                      const char *what, char *err, size_t errlen);

#endif
