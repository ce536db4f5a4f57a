/* Pipeline status from beamd's control endpoint (daemon/control.c).
 *
 * Every period: REQ "status", then "stats"; the two replies become one
 * {"type":"status"} message for the browsers. A REQ socket that lost its
 * reply can never send again, so a reply that does not come within the
 * timeout closes the socket and the next poll starts on a fresh one; the
 * browsers are told the endpoint does not answer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/beamd-view/view.h"
#include "pipeline/frame.h"
#include "tools/common/curve_opt.h"

#define CTL_TIMEOUT_NS 2000000000ull

enum { CTL_IDLE, CTL_WAIT_STATUS, CTL_WAIT_STATS };

struct view_ctl_s {
  view_t *v;
  void *sock;
  uv_poll_t poll;
  int polling, closing; /* poll handle started / close not yet completed */
  uv_timer_t timer;
  uint64_t next_poll;   /* monotonic ns */
  int state;
  uint64_t deadline;
  json_t *status;       /* reply to "status" of the poll in progress */
  uint64_t last_ok_ns;  /* monotonic; 0 never */
  uint64_t polls, failures;
};

static void ctl_check(view_ctl_t *c);

static void on_ctl_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  ctl_check(h->data);
}

static void publish(view_ctl_t *c, json_t *stats, const char *error) {
  view_t *v = c->v;
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string("status"));
  json_object_set_new(o, "endpoint", json_string(v->o->control));
  json_object_set_new(o, "ok", json_boolean(error == NULL));
  if (error)
    json_object_set_new(o, "error", json_string(error));
  json_object_set_new(o, "t_tx_ns", json_integer((json_int_t)beam_realtime_ns()));
  double age = (double)(beam_now_ns() - c->last_ok_ns) * 1e-9;
  json_object_set_new(o, "last_ok_age_s", c->last_ok_ns ? json_real(age) : json_null());
  if (!error) {
    json_object_set(o, "status", c->status ? c->status : json_null());
    json_object_set(o, "stats", stats ? stats : json_null());
  }
  view_msg_t *m = view_msg_new(o, NULL, 0);
  json_decref(o);
  if (m) {
    view_msg_unref(&v->status_msg);
    v->status_msg = m;
    v->status_ver++;
    view_ws_kick(v);
  }
}

/* The poll handle must be fully closed before a new one can reuse its
 * memory: a fresh socket gets its handle only after this callback. */
static void on_poll_closed(uv_handle_t *h) { ((view_ctl_t *)h->data)->closing = 0; }

static void sock_close(view_ctl_t *c) {
  if (c->polling) {
    uv_poll_stop(&c->poll);
    c->closing = 1;
    uv_close((uv_handle_t *)&c->poll, on_poll_closed);
    c->polling = 0;
  }
  /* The poll handle is closed in the loop's next turn; the socket (and its
   * descriptor) may go now because the handle was stopped first. */
  if (c->sock)
    zmq_close(c->sock);
  c->sock = NULL;
  c->state = CTL_IDLE;
}

static int sock_open(view_ctl_t *c) {
  view_t *v = c->v;
  if (c->closing)
    return -1;
  c->sock = zmq_socket(v->zctx, ZMQ_REQ);
  if (!c->sock)
    return -1;
  int zero = 0, fd;
  size_t len = sizeof fd;
  zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
  if (tool_curve_socket(v->curve, v->zctx, c->sock, v->o->control, 0) < 0 ||
      zmq_connect(c->sock, v->o->control) < 0 || zmq_getsockopt(c->sock, ZMQ_FD, &fd, &len) < 0) {
    zmq_close(c->sock);
    c->sock = NULL;
    return -1;
  }
  uv_poll_init(v->loop, &c->poll, fd);
  c->poll.data = c;
  c->polling = 1;
  uv_poll_start(&c->poll, UV_READABLE, on_ctl_readable);
  return 0;
}

static int send_cmd(view_ctl_t *c, const char *cmd, int next_state) {
  if (zmq_send(c->sock, cmd, strlen(cmd), ZMQ_DONTWAIT) < 0)
    return -1;
  c->state = next_state;
  c->deadline = beam_now_ns() + CTL_TIMEOUT_NS;
  return 0;
}

static void fail(view_ctl_t *c, const char *why) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s: %s", c->v->o->control, why);
  c->failures++;
  json_decref(c->status);
  c->status = NULL;
  sock_close(c);
  publish(c, NULL, msg);
}

/* Takes whatever reply is waiting and moves the exchange on. */
static void ctl_check(view_ctl_t *c) {
  while (c->sock && c->state != CTL_IDLE) {
    int ev = 0;
    size_t len = sizeof ev;
    if (zmq_getsockopt(c->sock, ZMQ_EVENTS, &ev, &len) < 0 || !(ev & ZMQ_POLLIN))
      return;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      return;
    }
    json_t *j = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, NULL);
    int more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    if (!j || !json_is_object(j) || more) {
      json_decref(j);
      fail(c, "reply is not one JSON object");
      return;
    }
    if (c->state == CTL_WAIT_STATUS) {
      json_decref(c->status);
      c->status = j;
      if (send_cmd(c, "stats", CTL_WAIT_STATS) < 0)
        fail(c, "cannot send \"stats\"");
    } else {
      c->last_ok_ns = beam_now_ns();
      c->state = CTL_IDLE;
      publish(c, j, NULL);
      json_decref(j);
    }
  }
}

static void on_timer(uv_timer_t *h) {
  view_ctl_t *c = h->data;
  if (c->state != CTL_IDLE) {
    if (beam_now_ns() < c->deadline) {
      ctl_check(c);
      return;
    }
    fail(c, "no reply within 2 s (is beamd running?)");
    return;
  }
  uint64_t now = beam_now_ns();
  if (now < c->next_poll)
    return;
  if (!c->sock && sock_open(c) < 0)
    return; /* the old handle is still closing; next tick */
  c->next_poll = now + (uint64_t)(c->v->o->ctl_period * 1e9);
  c->polls++;
  if (send_cmd(c, "status", CTL_WAIT_STATUS) < 0) {
    fail(c, "cannot send \"status\"");
    return;
  }
  ctl_check(c);
}

int view_ctl_open(view_t *v, char *err, size_t errlen) {
  if (!v->o->control)
    return 0;
  view_ctl_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  c->v = v;
  v->ctl = c;
  if (sock_open(c) < 0) {
    snprintf(err, errlen, "--control %s: %s", v->o->control, zmq_strerror(errno));
    return -1;
  }
  uv_timer_init(v->loop, &c->timer);
  c->timer.data = c;
  uint64_t ms = (uint64_t)(v->o->ctl_period * 1000.0);
  /* Checks for replies four times a period, polls once a period. */
  uv_timer_start(&c->timer, on_timer, 0, ms / 4 ? ms / 4 : 1);
  return 0;
}

void view_ctl_close(view_t *v) {
  view_ctl_t *c = v->ctl;
  if (!c)
    return;
  if (c->timer.data) {
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, NULL);
    c->timer.data = NULL;
  }
  if (c->polling) {
    uv_poll_stop(&c->poll);
    c->closing = 1;
    uv_close((uv_handle_t *)&c->poll, on_poll_closed);
    c->polling = 0;
  }
}

void view_ctl_free(view_t *v) {
  view_ctl_t *c = v->ctl;
  if (!c)
    return;
  if (c->sock)
    zmq_close(c->sock);
  json_decref(c->status);
  free(c);
  v->ctl = NULL;
}
