/* What the ZeroMQ benchmark programs (zthroughput, dectris_send) share:
 * their clock, how they open a socket and read numeric options. Header-only: each bench program
 * is one file with its own main. */
#ifndef BEAM_BENCH_ZMQ_H
#define BEAM_BENCH_ZMQ_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <zmq.h>

static inline uint64_t bench_now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A socket of `type` bound or connected to endpoint, with both HWMs set to
 * hwm when it is > 0. pre (may be NULL) runs on the socket before the bind
 * or connect, which is when security options must be set (CURVE); its
 * non-zero return closes the socket and fails (it printed why). Returns 0,
 * or -1 with the reason on stderr under the program's name. */
static inline int bench_open_sock_pre(void *ctx, int type, const char *endpoint, int bind,
                                      int hwm, const char *prog, void **out,
                                      int (*pre)(void *sock, void *arg), void *arg) {
  void *s = zmq_socket(ctx, type);
  if (!s) {
    fprintf(stderr, "%s: zmq_socket: %s\n", prog, zmq_strerror(errno));
    return -1;
  }
  if (hwm > 0) {
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
  }
  if (pre && pre(s, arg) != 0) {
    zmq_close(s);
    return -1;
  }
  int rc = bind ? zmq_bind(s, endpoint) : zmq_connect(s, endpoint);
  if (rc != 0) {
    fprintf(stderr, "%s: cannot %s %s: %s\n", prog, bind ? "bind" : "connect to", endpoint,
            zmq_strerror(errno));
    zmq_close(s);
    return -1;
  }
  *out = s;
  return 0;
}

static inline int bench_open_sock(void *ctx, int type, const char *endpoint, int bind, int hwm,
                                  const char *prog, void **out) {
  return bench_open_sock_pre(ctx, type, endpoint, bind, hwm, prog, out, NULL, NULL);
}

/* Numeric options: 0, or -1 when s is not a whole unsigned number / a
 * number >= 0. */
static inline int parse_u64(const char *s, uint64_t *v) {
  char *end;
  errno = 0;
  unsigned long long x = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-')
    return -1;
  *v = x;
  return 0;
}

static inline int parse_pos_double(const char *s, double *v) {
  char *end;
  double x = strtod(s, &end);
  if (end == s || *end || !(x >= 0))
    return -1;
  *v = x;
  return 0;
}

#endif
