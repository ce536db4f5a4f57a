/* beamd-ctl: command-line client of beamd's control endpoint (ZeroMQ REQ).
 * Sends one command, prints the JSON reply, exits 0 when the reply says
 * ok (or is a status/stats object), 1 when beamd answered an error, 3 when
 * beamd did not answer within the timeout. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <zmq.h>

#include "pipeline/cfg.h"
#include "tools/common/cli.h"
#include "tools/common/curve_opt.h"

#define EP_EXPECTED "expected tcp://HOST:PORT, HOST:PORT or ipc://PATH"

/* A bare HOST:PORT means tcp://HOST:PORT; the rest is checked by the
 * daemon's own endpoint rules (beam_cfg_endpoint_why) so that what the
 * config accepts, beamd-ctl accepts. inproc:// cannot reach another
 * process, and "" (a disabled endpoint in the config) reaches nothing. */
static int control_endpoint(const char *arg, char *out, size_t outlen) {
  const char *why = NULL;
  if (!arg[0])
    why = "empty";
  else if (!strncmp(arg, "inproc://", 9))
    why = "inproc:// only reaches the same process";
  else if ((size_t)snprintf(out, outlen, "%s%s", strstr(arg, "://") ? "" : "tcp://", arg) >= outlen)
    why = "too long";
  else
    why = beam_cfg_endpoint_why(out);
  if (why) {
    fprintf(stderr, "beamd-ctl: bad endpoint \"%s\": " EP_EXPECTED " (%s)\n", arg, why);
    return -1;
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: beamd-ctl [-e ENDPOINT] [-t SECONDS] [--pretty] status|stats|reload|stop|ping\n"
             "  -e, --endpoint EP   control endpoint: tcp://HOST:PORT, HOST:PORT (= tcp://)\n"
             "                      or ipc://PATH (default tcp://127.0.0.1:5601, or\n"
             "                      $BEAMD_CONTROL)\n"
             "  -t, --timeout S     seconds to wait for the reply (default 5)\n"
             "  -p, --pretty        indent the JSON reply\n" TOOL_CURVE_USAGE
             "  -h, --help          this text\n" TOOL_VERSION_USAGE);
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"endpoint", required_argument, 0, 'e'},
                                       {"timeout", required_argument, 0, 't'},
                                       {"pretty", no_argument, 0, 'p'},
                                       TOOL_CURVE_LONGOPTS,
                                       {"help", no_argument, 0, 'h'},
                                       TOOL_VERSION_LONGOPT,
                                       {0, 0, 0, 0}};
  const char *ep = getenv("BEAMD_CONTROL") ? getenv("BEAMD_CONTROL") : "tcp://127.0.0.1:5601";
  double timeout = 5;
  int pretty = 0, c;
  tool_cli_init("beamd-ctl");
  tool_curve_t curve;
  tool_curve_init(&curve);
  while ((c = getopt_long(argc, argv, "e:t:ph", opts, NULL)) != -1) {
    switch (c) {
    case 'e': ep = optarg; break;
    case 't': timeout = atof(optarg); break;
    case 'p': pretty = 1; break;
    case 'h': usage(stdout); return 0;
    case TOOL_OPT_VERSION: tool_print_version(); return 0;
    default:
      if (tool_curve_opt(&curve, c, optarg))
        break;
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[optind];
  char epbuf[512];
  if (control_endpoint(ep, epbuf, sizeof epbuf) != 0)
    return 2;
  ep = epbuf;
  void *ctx = zmq_ctx_new();
  void *s = zmq_socket(ctx, ZMQ_REQ);
  int ms = (int)(timeout * 1000), zero = 0;
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &ms, sizeof ms);
  zmq_setsockopt(s, ZMQ_SNDTIMEO, &ms, sizeof ms);
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  if (tool_curve_socket(&curve, ctx, s, ep, 0) != 0)
    return 2;
  if (zmq_connect(s, ep) != 0) {
    fprintf(stderr, "beamd-ctl: cannot connect to %s: %s\n", ep, zmq_strerror(errno));
    return 2;
  }
  if (zmq_send(s, cmd, strlen(cmd), 0) < 0) {
    fprintf(stderr, "beamd-ctl: %s: send failed: %s\n", ep, zmq_strerror(errno));
    return 3;
  }
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, s, 0) < 0) {
    fprintf(stderr, "beamd-ctl: no reply from %s within %.1f s (is beamd running?)\n", ep, timeout);
    zmq_close(s);
    zmq_ctx_term(ctx);
    return 3;
  }
  json_error_t je;
  json_t *j = json_loadb(zmq_msg_data(&m), zmq_msg_size(&m), 0, &je);
  int rc = 0;
  if (!j) {
    fwrite(zmq_msg_data(&m), 1, zmq_msg_size(&m), stdout);
    putchar('\n');
  } else {
    char *out = json_dumps(j, pretty ? JSON_INDENT(2) : JSON_COMPACT);
    puts(out ? out : "");
    free(out);
    json_t *ok = json_object_get(j, "ok");
    if (json_is_false(ok))
      rc = 1;
    json_decref(j);
  }
  zmq_msg_close(&m);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return rc;
}
