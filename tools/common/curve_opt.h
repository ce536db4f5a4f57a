/* CURVE on the tools' sockets: the same options in every tool.
 *
 *   --curve-secret FILE  this program's key pair (a NAME_secret certificate;
 *                        default $BEAMD_CURVE_SECRET)
 *   --curve-server FILE  connecting: the server's public certificate, which
 *                        turns CURVE on (default $BEAMD_CURVE_SERVER)
 *   --curve-allow DIR    binding: serve CURVE and let in the client keys in
 *                        DIR (default $BEAMD_CURVE_ALLOW)
 *   --insecure           bind a non-loopback tcp:// address in plaintext
 *
 * As in the daemon, a bound tcp:// endpoint other hosts can reach needs
 * CURVE or --insecure; a connection uses CURVE when a server key is given. */
#ifndef BEAMD_TOOLS_COMMON_CURVE_OPT_H
#define BEAMD_TOOLS_COMMON_CURVE_OPT_H

#include <getopt.h>

#include "daemon/curve.h"

enum {
  TOOL_OPT_CURVE_SECRET = 0x7c00,
  TOOL_OPT_CURVE_SERVER,
  TOOL_OPT_CURVE_ALLOW,
  TOOL_OPT_INSECURE,
};

#define TOOL_CURVE_LONGOPTS                                                \
  {"curve-secret", required_argument, 0, TOOL_OPT_CURVE_SECRET},           \
      {"curve-server", required_argument, 0, TOOL_OPT_CURVE_SERVER},       \
      {"curve-allow", required_argument, 0, TOOL_OPT_CURVE_ALLOW},         \
      {"insecure", no_argument, 0, TOOL_OPT_INSECURE}

#define TOOL_CURVE_USAGE                                                             \
  "  --curve-secret FILE this program's CURVE key pair (NAME_secret from\n"           \
  "                      beamd-keygen; default $BEAMD_CURVE_SECRET)\n"                \
  "  --curve-server FILE connect with CURVE to the server with this public\n"        \
  "                      certificate (default $BEAMD_CURVE_SERVER)\n"                 \
  "  --curve-allow DIR   bind with CURVE, letting in the client keys in DIR\n"        \
  "                      (default $BEAMD_CURVE_ALLOW)\n"                              \
  "  --insecure          allow binding a non-loopback tcp:// address in plaintext\n"

typedef struct tool_curve_s {
  const char *secret, *server, *allow;
  int insecure;
  int loaded;
  beam_cert_t own;
  char server_pub[BEAM_Z85_KEY];
  beam_zap_t *zap;
} tool_curve_t;

/* Fills the defaults from the environment. */
void tool_curve_init(tool_curve_t *t);
/* 1 when c was one of the CURVE options (taken), 0 otherwise. */
int tool_curve_opt(tool_curve_t *t, int c, const char *arg);
/* Before bind/connect of sock to ep: applies CURVE as the options say, or
 * refuses a plaintext bind other hosts could reach. Prints the reason and
 * returns -1 on failure. */
int tool_curve_socket(tool_curve_t *t, void *zctx, void *sock, const char *ep, int bind);
/* Call before zmq_ctx_term. */
void tool_curve_fini(tool_curve_t *t);

#endif
