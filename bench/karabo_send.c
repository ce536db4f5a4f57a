/* karabo_send: the Karabo bridge server of the Karabo benchmark (bench/karabo.py,
 * figure "karabo"). Written in C so that it is not the bottleneck it is
 * supposed to measure.
 *
 *   karabo_send --endpoint EP [--connect] --pattern rep|push --shape D0xD1x...
 *               [--dtype uint16|float32] [--source NAME] [--path P]
 *               [--trains N | --seconds S] [--tid T] [--hwm N] [--timeout S]
 *               [--hold S]
 *       Protocol 2.2 trains of one source (the source's msgpack header and
 *       map, then one array header and its raw bytes) as a bridge sends
 *       them; the array (AGIPD-like: 16x512x128x32 uint16, the online
 *       layout) comes from one buffer filled once and goes out zero-copy,
 *       so a train costs its two small headers, packed with proto/karabo.c's
 *       encoder, and the transport. rep answers each `next` with the next
 *       train; after the last it waits for one more request (the client has
 *       then taken the last train whole: beamd's REQ input asks again only
 *       once a train is fed) and reports the rate from the first request to
 *       that one. push sends them blocking (lossless) and reports the rate
 *       from the first to the last send; --hold keeps it connected after
 *       (until SIGTERM) so the tail is not lost.
 *
 * Prints one JSON object on stdout; diagnostics go to stderr. Not a general
 * tool: it exists to produce repeatable figures. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <msgpack.h>
#include <zmq.h>

#include "bench/bench_zmq.h"

#include "proto/karabo.h"

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

typedef struct opts_s {
  const char *endpoint, *source, *path;
  int connect, push, hwm;
  beam_dtype_t dtype;
  unsigned ndim;
  uint32_t shape[BEAM_KB_MAX_NDIM];
  uint64_t trains, tid;
  double seconds, timeout_s, hold_s;
} opts_t;

static void usage(FILE *f) {
  fprintf(f, "usage: karabo_send --endpoint EP [--connect] --pattern rep|push --shape D0xD1x...\n"
             "                   [--dtype uint16|float32] [--source NAME] [--path P]\n"
             "                   [--trains N | --seconds S] [--tid T] [--hwm N] [--timeout S]\n"
             "                   [--hold S]\n");
}

static int parse_shape(const char *s, opts_t *o) {
  o->ndim = 0;
  while (*s && o->ndim < BEAM_KB_MAX_NDIM) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || !v || v > UINT32_MAX)
      return -1;
    o->shape[o->ndim++] = (uint32_t)v;
    s = *end == 'x' ? end + 1 : end;
    if (*end && *end != 'x')
      return -1;
  }
  return o->ndim && !*s ? 0 : -1;
}

/* One train's header parts, packed into sb: [0, a) source header, [a, b)
 * its map, [b, size) the array header. */
static int pack_train(msgpack_sbuffer *sb, const opts_t *o, uint64_t tid, size_t *a, size_t *b) {
  msgpack_packer pk;
  msgpack_sbuffer_clear(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  beam_kb_time_t t = beam_kb_time_from_ns(bench_now_ns(CLOCK_REALTIME));
  int rc = beam_kb_pack_source_header(&pk, o->source, t, tid);
  *a = sb->size;
  rc |= msgpack_pack_map(&pk, 2);
  rc |= beam_kb_pack_str(&pk, "header.trainId");
  rc |= msgpack_pack_uint64(&pk, tid);
  rc |= beam_kb_pack_str(&pk, "detector.name");
  rc |= beam_kb_pack_str(&pk, "karabo_send");
  *b = sb->size;
  rc |= beam_kb_pack_array_header(&pk, o->source, o->path, o->dtype, o->ndim, o->shape);
  return rc ? -1 : 0;
}

static int send_train(void *s, msgpack_sbuffer *sb, const opts_t *o, uint64_t tid,
                      const void *data, size_t n) {
  size_t a, b;
  if (pack_train(sb, o, tid, &a, &b) < 0)
    return -1;
  if (zmq_send(s, sb->data, a, ZMQ_SNDMORE) < 0 ||
      zmq_send(s, sb->data + a, b - a, ZMQ_SNDMORE) < 0 ||
      zmq_send(s, sb->data + b, sb->size - b, ZMQ_SNDMORE) < 0)
    return -1;
  zmq_msg_t m;
  zmq_msg_init_data(&m, (void *)data, n, NULL, NULL); /* the buffer outlives every send */
  if (zmq_msg_send(&m, s, 0) < 0) {
    zmq_msg_close(&m);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  opts_t o = {.source = "SPB_DET_AGIPD1M-1/DET/detector", .path = "image.data",
              .dtype = BEAM_DT_U16, .tid = 1000000, .timeout_s = 20, .hwm = 4};
  const char *pattern = NULL;
  static const struct option lo[] = {
      {"endpoint", 1, 0, 'e'}, {"connect", 0, 0, 'c'}, {"pattern", 1, 0, 'p'},
      {"shape", 1, 0, 's'},    {"dtype", 1, 0, 'd'},   {"source", 1, 0, 'S'},
      {"path", 1, 0, 'P'},     {"trains", 1, 0, 'n'},  {"seconds", 1, 0, 't'},
      {"tid", 1, 0, 'i'},      {"hwm", 1, 0, 'H'},     {"timeout", 1, 0, 'T'},
      {"hold", 1, 0, 'h'},     {"help", 0, 0, '?'},    {0, 0, 0, 0}};
  int c;
  uint64_t u;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'e': o.endpoint = optarg; break;
    case 'c': o.connect = 1; break;
    case 'p': pattern = optarg; break;
    case 's':
      if (parse_shape(optarg, &o) < 0) {
        fprintf(stderr, "karabo_send: bad --shape %s\n", optarg);
        return 2;
      }
      break;
    case 'd': o.dtype = beam_dtype_from_name(optarg); break;
    case 'S': o.source = optarg; break;
    case 'P': o.path = optarg; break;
    case 'n':
      if (parse_u64(optarg, &o.trains) < 0)
        return 2;
      break;
    case 't':
      if (parse_pos_double(optarg, &o.seconds) < 0)
        return 2;
      break;
    case 'i':
      if (parse_u64(optarg, &o.tid) < 0)
        return 2;
      break;
    case 'H':
      if (parse_u64(optarg, &u) < 0)
        return 2;
      o.hwm = (int)u;
      break;
    case 'T':
      if (parse_pos_double(optarg, &o.timeout_s) < 0)
        return 2;
      break;
    case 'h':
      if (parse_pos_double(optarg, &o.hold_s) < 0)
        return 2;
      break;
    default: usage(c == '?' ? stdout : stderr); return c == '?' ? 0 : 2;
    }
  }
  if (!o.endpoint || !pattern || !o.ndim || !beam_dtype_size(o.dtype) ||
      (strcmp(pattern, "rep") && strcmp(pattern, "push")) || (!o.trains && !o.seconds)) {
    usage(stderr);
    return 2;
  }
  o.push = strcmp(pattern, "push") == 0;
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  size_t n = beam_dtype_size(o.dtype);
  for (unsigned i = 0; i < o.ndim; i++)
    n *= o.shape[i];
  uint16_t *data = malloc(n + 2);
  if (!data) {
    fprintf(stderr, "karabo_send: cannot allocate a %zu-byte train\n", n);
    return 1;
  }
  uint32_t x = 12345; /* not zero pages: they would flatter memory traffic */
  for (size_t i = 0; i < n / 2; i++) {
    x = x * 1664525u + 1013904223u;
    data[i] = (uint16_t)((x >> 20) & 0xfff);
  }
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (bench_open_sock(ctx, o.push ? ZMQ_PUSH : ZMQ_REP, o.endpoint, !o.connect, o.hwm,
                      "karabo_send", &s) < 0)
    return 1;
  int tmo = (int)(o.timeout_s * 1000);
  zmq_setsockopt(s, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  uint64_t sent = 0, t0 = 0, t_end = 0, requests = 0, bad = 0, deadline = 0;
  int rc = 0;
  char req[64];
  while (!g_stop) {
    int more = o.trains ? sent < o.trains : (!t0 || bench_now_ns(CLOCK_MONOTONIC) < deadline);
    if (!o.push) {
      int r = zmq_recv(s, req, sizeof req, 0);
      if (r < 0) {
        fprintf(stderr, "karabo_send: no request within %g s: %s\n", o.timeout_s,
                zmq_strerror(errno));
        rc = 1;
        break;
      }
      uint64_t now = bench_now_ns(CLOCK_MONOTONIC);
      requests++;
      if (!t0) {
        t0 = now;
        deadline = t0 + (uint64_t)(o.seconds * 1e9);
      }
      if (r != 4 || memcmp(req, "next", 4) != 0) {
        bad++;
        zmq_send(s, "Error: bad request", 18, 0);
        continue;
      }
      if (!more) { /* the request after the last train: the client took it whole */
        t_end = now;
        break;
      }
    } else if (!more) {
      t_end = bench_now_ns(CLOCK_MONOTONIC);
      break;
    } else if (!t0) {
      t0 = bench_now_ns(CLOCK_MONOTONIC);
      deadline = t0 + (uint64_t)(o.seconds * 1e9);
    }
    if (send_train(s, &sb, &o, o.tid + sent, data, n) < 0) {
      fprintf(stderr, "karabo_send: send: %s\n", zmq_strerror(errno));
      rc = 1;
      break;
    }
    sent++;
  }
  double span = t_end > t0 ? (double)(t_end - t0) * 1e-9 : 0;
  size_t hdr = sb.size;
  printf("{\"pattern\":\"%s\",\"trains\":%llu,\"train_bytes\":%zu,\"header_bytes\":%zu,"
         "\"requests\":%llu,\"bad_requests\":%llu,\"span_s\":%.6f,\"tps\":%.3f,\"gbps\":%.4f,"
         "\"ok\":%s}\n",
         pattern, (unsigned long long)sent, n, hdr, (unsigned long long)requests,
         (unsigned long long)bad, span, span > 0 ? (double)sent / span : 0.0,
         span > 0 ? (double)sent * (double)n / span / 1e9 : 0.0, rc ? "false" : "true");
  fflush(stdout);
  for (uint64_t t1 = bench_now_ns(CLOCK_MONOTONIC);
       !g_stop && o.push && bench_now_ns(CLOCK_MONOTONIC) - t1 < (uint64_t)(o.hold_s * 1e9);)
    nanosleep(&(struct timespec){0, 20000000}, NULL);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(s);
  zmq_ctx_term(ctx);
  msgpack_sbuffer_destroy(&sb);
  free(data);
  return rc;
}
