/* The ZeroMQ reader that push-style sources share (input.h): beamd's own
 * live and pull inputs, and the DECTRIS detector stream.
 *
 * ZMQ_FD is edge-triggered, so every wake-up reads until EAGAIN; a bounded
 * batch per wake-up keeps the loop fair, and an idle handle comes back for
 * the rest. A lossless reader looks for room in the graph before each
 * message: without it, it stops reading, ZeroMQ's queues fill and the
 * sender blocks, and the graph's room callback resumes it. A live one
 * keeps reading and lets the ingest core drop what has no room.
 *
 * Each received part gets its own owner, so the source can make a payload
 * (or a blob anywhere inside a part) a frame's storage without a copy. */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"

/* Messages handled per wake-up before yielding to the rest of the loop. */
#define BATCH 256
#define MAX_PARTS BEAMD_ZREAD_MAX_PARTS

static void on_event(beamd_zsock_t *zs);

static void more_cb(uv_idle_t *h) { beamd_zread_read(h->data); }

static void set_more(beamd_zread_t *zr, int on) {
  if (on && !zr->more_on)
    uv_idle_start(&zr->more, more_cb);
  else if (!on && zr->more_on)
    uv_idle_stop(&zr->more);
  zr->more_on = on;
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

/* Returning without a receive would leave ZMQ_FD readable while commands
 * (a peer leaving, say) wait in the socket, and the loop would spin on it:
 * ZMQ_EVENTS processes them. Whoever reads next reads until EAGAIN. */
static void settle(beamd_zread_t *zr) {
  if (zr->zs.open && !zr->zs.unwatched)
    beamd_zsock_events(&zr->zs);
}

static void burst(beamd_zread_t *zr) {
  beamd_t *d = zr->d;
  int draining = d->state == BEAMD_DRAINING && d->in.drain_read;
  if (!zr->zs.open || zr->stopped || (d->state != BEAMD_RUNNING && !draining)) {
    set_more(zr, 0);
    settle(zr);
    return;
  }
  beam_part_t bp[MAX_PARTS];
  for (int i = 0; i < BATCH; i++) {
    if (zr->hold) {
      set_more(zr, 0);
      settle(zr);
      return;
    }
    if (zr->lossless && !beamd_ingest_room(d)) {
      beamd_ingest_pause(d); /* the graph calls back (resume) when room appears */
      set_more(zr, 0);
      settle(zr);
      return;
    }
    int n = recv_parts(zr->zs.sock, zr->parts);
    if (n == 0) {
      set_more(zr, 0);
      if (draining) /* everything delivered to us is in the graph */
        zr->drained ? zr->drained(zr) : beamd_input_drained(d);
      return;
    }
    if (n < 0) {
      atomic_fetch_add(&d->in.messages, 1);
      beamd_ingest_malformed(d, "malformed message", "too many parts");
      continue;
    }
    uint64_t t_recv = beam_now_ns();
    for (int k = 0; k < n; k++) {
      beamd_zmsg_owner_init(&zr->owners[k], &zr->parts[k]);
      bp[k].data = zmq_msg_data(&zr->parts[k]);
      bp[k].size = zmq_msg_size(&zr->parts[k]);
      bp[k].owner = &zr->owners[k].base;
    }
    zr->handle(zr, bp, (size_t)n, t_recv);
    for (int k = 0; k < n; k++)
      zmq_msg_close(&zr->parts[k]);
    /* A drain the handler finished (or a stop) ends the burst. */
    if (zr->stopped || d->in.stopped)
      break;
  }
  /* More may be queued; ZMQ_FD will not fire again for it, so come back
   * on the next loop iteration after other handles had their turn. */
  set_more(zr, !zr->stopped && !d->in.stopped);
}

/* The frames of one burst wake a stage once per few frames (as a replay
 * reply's do), and all of them at the burst's end. */
void beamd_zread_read(beamd_zread_t *zr) {
  beam_graph_batch(zr->d->graph, 1);
  burst(zr);
  beam_graph_batch(zr->d->graph, 0);
}

static void on_event(beamd_zsock_t *zs) {
  beamd_zread_read((beamd_zread_t *)((char *)zs - offsetof(beamd_zread_t, zs)));
}

int beamd_zread_open(beamd_t *d, beamd_zread_t *zr, int type, const char *endpoint,
                     const beam_ep_sec_t *sec, const char *what, int bind, int hwm, int lossless,
                     char *err, size_t errlen) {
  zr->d = d;
  zr->lossless = lossless;
  uv_idle_init(&d->loop, &zr->more);
  zr->more.data = zr;
  beamd_zopts_t o = {.rcvhwm = hwm, .sec = sec, .what = what};
  char zerr[512];
  int rc = beamd_zsock_open(d, &zr->zs, type, endpoint, bind, &o, on_event, zerr, sizeof zerr);
  if (rc < 0)
    snprintf(err, errlen, "input: %s", zerr);
  return rc;
}

int beamd_zread_drain(beamd_zread_t *zr) {
  if (!zr->lossless || !zr->zs.open)
    return 0;
  beamd_zread_read(zr);
  return 1;
}

void beamd_zread_stop(beamd_zread_t *zr) {
  zr->stopped = 1;
  set_more(zr, 0);
  if (zr->zs.open && zr->zs.polling) {
    uv_poll_stop(&zr->zs.poll);
    zr->zs.polling = 0;
  }
}

void beamd_zread_hold(beamd_zread_t *zr, int on) {
  zr->hold = on;
  if (!on && !zr->stopped)
    set_more(zr, 1); /* not now: this may run inside another socket's handler */
}

void beamd_zread_close(beamd_zread_t *zr) {
  beamd_zsock_close(&zr->zs, 0);
  if (zr->d && !uv_is_closing((uv_handle_t *)&zr->more))
    uv_close((uv_handle_t *)&zr->more, NULL);
}
