/* The control endpoint: a ZeroMQ REP socket (loopback by default) taking
 * one-word commands and answering JSON. beamd-ctl is its client.
 *
 *   ping    {"ok":true}
 *   status  who and what is running
 *   stats   every counter (see stats.c)
 *   reload  validate and build the new graph; errors come back listed, and
 *           the old graph keeps running when there are any
 *   stop    drain and exit (as SIGTERM)
 *
 * REP requires one reply per request, which holds because every command is
 * answered before the next recv. */
#include <errno.h>
#include <string.h>

#include <jansson.h>
#include <zmq.h>

#include "daemon/beamd.h"

static char *error_reply(const char *msg) {
  json_t *o = json_pack("{s:b, s:s}", "ok", 0, "error", msg);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

static char *reload_reply(beamd_t *d) {
  beam_cfg_errs_t errs = {0};
  char err[1024] = "";
  int rc = beamd_reload(d, &errs, err, sizeof err);
  json_t *o = json_object();
  json_object_set_new(o, "ok", json_boolean(rc == 0));
  if (rc < 0) {
    json_t *a = json_array();
    for (size_t i = 0; i < errs.n; i++)
      json_array_append_new(a, json_string(errs.msgs[i]));
    if (errs.n == 0)
      json_array_append_new(a, json_string(err));
    json_object_set_new(o, "errors", a);
  } else {
    json_object_set_new(o, "message", json_string(err));
  }
  beam_cfg_errs_free(&errs);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

static char *dispatch(beamd_t *d, const char *cmd) {
  if (strcmp(cmd, "ping") == 0)
    return strdup("{\"ok\":true}");
  if (strcmp(cmd, "status") == 0)
    return beamd_status_json(d);
  if (strcmp(cmd, "stats") == 0)
    return beamd_stats_json(d, 0);
  if (strcmp(cmd, "reload") == 0)
    return reload_reply(d);
  if (strcmp(cmd, "stop") == 0) {
    beamd_drain(d, "stop requested on the control socket");
    return strdup("{\"ok\":true,\"state\":\"draining\"}");
  }
  return error_reply("unknown command (ping, status, stats, reload, stop)");
}

static void on_control_event(beamd_zsock_t *zs) {
  beamd_t *d = zs->d;
  while (zs->open && (beamd_zsock_events(zs) & ZMQ_POLLIN)) {
    char cmd[64], who[BEAM_KEY_NAME + 16];
    zmq_msg_t req;
    zmq_msg_init(&req);
    int n = zmq_msg_recv(&req, zs->sock, ZMQ_DONTWAIT);
    if (n < 0) {
      zmq_msg_close(&req);
      return;
    }
    /* The key's name from the allow-list; plaintext is loopback only. */
    const char *peer = beam_curve_peer(&req);
    snprintf(who, sizeof who, "%s%s", peer[0] ? "key " : "", peer[0] ? peer : "a local client");
    if (n > 0)
      memcpy(cmd, zmq_msg_data(&req), (size_t)n < sizeof cmd - 1 ? (size_t)n : sizeof cmd - 1);
    int more = zmq_msg_more(&req);
    zmq_msg_close(&req);
    char *reply;
    if (more) {
      /* Discard the rest: a request is exactly one part. */
      while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, zs->sock, 0);
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
      }
      reply = error_reply("a request is one message part");
    } else if (n >= (int)sizeof cmd) {
      reply = error_reply("command too long");
    } else {
      cmd[n] = 0;
      while (n > 0 && (cmd[n - 1] == '\n' || cmd[n - 1] == ' '))
        cmd[--n] = 0;
      /* What changes the daemon is always logged with who asked. */
      int acts = !strcmp(cmd, "reload") || !strcmp(cmd, "stop");
      BEAM_LOG(acts ? LOG_NOTICE : LOG_DEBUG, "control: %.63s from %s", cmd, who);
      reply = dispatch(d, cmd);
    }
    if (!reply)
      reply = strdup("{\"ok\":false,\"error\":\"out of memory\"}");
    zmq_send(zs->sock, reply, reply ? strlen(reply) : 0, 0);
    free(reply);
  }
}

int beamd_control_open(beamd_t *d, char *err, size_t errlen) {
  if (!d->cfg->control.endpoint[0])
    return 0;
  char zerr[512];
  beamd_zopts_t o = {.sec = &d->cfg->control.endpoint_sec, .what = "control.endpoint"};
  if (beamd_zsock_open(d, &d->ctl, ZMQ_REP, d->cfg->control.endpoint, 1, &o, on_control_event,
                       zerr, sizeof zerr) < 0) {
    snprintf(err, errlen, "control: %s", zerr);
    return BEAM_EIO;
  }
  return 0;
}

void beamd_control_close(beamd_t *d) { beamd_zsock_close(&d->ctl, 0); }
