/* CURVE options of the tools (see curve_opt.h). */
#include "tools/common/curve_opt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/common/cli.h"

static const char *env(const char *name) {
  const char *v = getenv(name);
  return v && v[0] ? v : NULL;
}

void tool_curve_init(tool_curve_t *t) {
  memset(t, 0, sizeof *t);
  t->secret = env("BEAMD_CURVE_SECRET");
  t->server = env("BEAMD_CURVE_SERVER");
  t->allow = env("BEAMD_CURVE_ALLOW");
}

int tool_curve_opt(tool_curve_t *t, int c, const char *arg) {
  switch (c) {
  case TOOL_OPT_CURVE_SECRET: t->secret = arg; return 1;
  case TOOL_OPT_CURVE_SERVER: t->server = arg; return 1;
  case TOOL_OPT_CURVE_ALLOW: t->allow = arg; return 1;
  case TOOL_OPT_INSECURE: t->insecure = 1; return 1;
  default: return 0;
  }
}

static int load(tool_curve_t *t) {
  beam_diag_t wd = {0};
  if (t->loaded)
    return 0;
  if (!t->secret) {
    tool_log("CURVE needs this program's key pair: --curve-secret FILE (make one with "
             "beamd-keygen NAME)");
    return -1;
  }
  if (beam_cert_load(t->secret, &t->own, 1, &wd) != 0) {
    tool_log("--curve-secret: %s", wd.msg);
    return -1;
  }
  if (t->server) {
    beam_cert_t s;
    if (beam_cert_load(t->server, &s, 0, &wd) != 0) {
      tool_log("--curve-server: %s", wd.msg);
      return -1;
    }
    memcpy(t->server_pub, s.public_z85, sizeof t->server_pub);
  }
  t->loaded = 1;
  return 0;
}

int tool_curve_socket(tool_curve_t *t, void *zctx, void *sock, const char *ep, int bind) {
  beam_diag_t wd = {0};
  int tcp = !strncmp(ep, "tcp://", 6);
  if (bind && t->allow && tcp) {
    if (load(t) != 0)
      return -1;
    /* The handler first: a CURVE server with none would refuse everyone. */
    if (!t->zap && !(t->zap = beam_zap_start(zctx, t->allow, &wd))) {
      tool_log("--curve-allow: %s", wd.msg);
      return -1;
    }
    if (beam_curve_server(sock, &t->own, &wd) != 0 ||
        beam_zap_watch(t->zap, sock, ep, &wd) != 0) {
      tool_log("%s: %s", ep, wd.msg);
      return -1;
    }
    return 0;
  }
  if (!bind && t->server && tcp) {
    if (load(t) != 0)
      return -1;
    if (beam_curve_client(sock, &t->own, t->server_pub, &wd) != 0) {
      tool_log("%s: %s", ep, wd.msg);
      return -1;
    }
    return 0;
  }
  if (bind && tcp && !t->insecure && !beam_endpoint_is_loopback(ep)) {
    tool_log("%s can be reached from other hosts without authentication: use --curve-allow DIR "
             "(with --curve-secret FILE), or --insecure for a network whose peers cannot do "
             "CURVE", ep);
    return -1;
  }
  return 0;
}

void tool_curve_fini(tool_curve_t *t) { beam_zap_stop(&t->zap); }
