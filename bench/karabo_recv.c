/* karabo_recv: the Karabo bridge client of the Karabo benchmark
 * (bench/karabo.py): what OnDA/OM or karabo-bridge-py does with a bridge,
 * minus the analysis, in C so that it is not the bottleneck.
 *
 *   karabo_recv --endpoint EP [--bind] --pattern req|pull [--seconds S]
 *               [--messages N] [--hwm N] [--timeout S]
 *       req: sends `next` and reads the reply, again and again (a REQ has
 *       one request in flight, as the bridge clients do); pull: reads. Every
 *       message is decoded with proto/karabo.c (beam_kb_parse: headers,
 *       shapes, sizes) and its sources and array bytes counted. Stops S
 *       seconds after the first message (or after N messages) and reports
 *       messages/s, sources/s and GB/s of array bytes between the first and
 *       the last message.
 *
 * Prints one JSON object on stdout; diagnostics go to stderr. */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "bench/bench_zmq.h"

#include "proto/karabo.h"

#define MAX_PARTS (2 * (BEAM_KB_MAX_SOURCES + BEAM_KB_MAX_ARRAYS))

static void usage(FILE *f) {
  fprintf(f, "usage: karabo_recv --endpoint EP [--bind] --pattern req|pull [--seconds S]\n"
             "                   [--messages N] [--hwm N] [--timeout S]\n");
}

int main(int argc, char **argv) {
  const char *ep = NULL, *pattern = NULL;
  int bind = 0, hwm = 4;
  double seconds = 0, timeout_s = 20;
  uint64_t max_msgs = 0, u;
  static const struct option lo[] = {
      {"endpoint", 1, 0, 'e'}, {"bind", 0, 0, 'b'},    {"pattern", 1, 0, 'p'},
      {"seconds", 1, 0, 't'},  {"messages", 1, 0, 'n'}, {"hwm", 1, 0, 'H'},
      {"timeout", 1, 0, 'T'},  {"help", 0, 0, '?'},    {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case 'e': ep = optarg; break;
    case 'b': bind = 1; break;
    case 'p': pattern = optarg; break;
    case 't':
      if (parse_pos_double(optarg, &seconds) < 0)
        return 2;
      break;
    case 'n':
      if (parse_u64(optarg, &max_msgs) < 0)
        return 2;
      break;
    case 'H':
      if (parse_u64(optarg, &u) < 0)
        return 2;
      hwm = (int)u;
      break;
    case 'T':
      if (parse_pos_double(optarg, &timeout_s) < 0)
        return 2;
      break;
    default: usage(c == '?' ? stdout : stderr); return c == '?' ? 0 : 2;
    }
  }
  if (!ep || !pattern || (strcmp(pattern, "req") && strcmp(pattern, "pull")) ||
      (!seconds && !max_msgs)) {
    usage(stderr);
    return 2;
  }
  int req = strcmp(pattern, "req") == 0;
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (bench_open_sock(ctx, req ? ZMQ_REQ : ZMQ_PULL, ep, bind, hwm, "karabo_recv", &s) < 0)
    return 1;
  int tmo = (int)(timeout_s * 1000);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  static zmq_msg_t parts[MAX_PARTS];
  static beam_part_t bp[MAX_PARTS];
  static beam_kb_msg_t msg;
  uint64_t msgs = 0, sources = 0, arr_bytes = 0, bytes = 0, bad = 0, t0 = 0, t_last = 0;
  int rc = 0;
  for (;;) {
    if (t0 && ((seconds && bench_now_ns(CLOCK_MONOTONIC) - t0 >= (uint64_t)(seconds * 1e9)) ||
               (max_msgs && msgs >= max_msgs)))
      break;
    if (req && zmq_send(s, "next", 4, 0) < 0) {
      fprintf(stderr, "karabo_recv: send: %s\n", zmq_strerror(errno));
      rc = 1;
      break;
    }
    size_t n = 0;
    int more = 1, err = 0;
    while (more) {
      zmq_msg_t *p = &parts[n < MAX_PARTS ? n : MAX_PARTS - 1];
      if (n >= MAX_PARTS)
        zmq_msg_close(p);
      zmq_msg_init(p);
      if (zmq_msg_recv(p, s, 0) < 0) {
        err = errno;
        zmq_msg_close(p);
        break;
      }
      more = zmq_msg_more(p);
      if (n < MAX_PARTS)
        n++;
    }
    if (err) {
      fprintf(stderr, "karabo_recv: no message within %g s: %s\n", timeout_s, zmq_strerror(err));
      rc = msgs ? 0 : 1; /* a sender that stopped after its last train ends the run */
      for (size_t i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
      break;
    }
    uint64_t now = bench_now_ns(CLOCK_MONOTONIC);
    if (!t0)
      t0 = now;
    t_last = now;
    for (size_t i = 0; i < n; i++) {
      bp[i] = (beam_part_t){zmq_msg_data(&parts[i]), zmq_msg_size(&parts[i]), NULL};
      bytes += bp[i].size;
    }
    const char *why = NULL;
    if (beam_kb_parse(bp, n, &msg, &why) == 0) {
      sources += msg.nsources;
      for (unsigned i = 0; i < msg.narrays; i++)
        arr_bytes += msg.arr[i].size;
    } else {
      bad++;
    }
    msgs++;
    for (size_t i = 0; i < n; i++)
      zmq_msg_close(&parts[i]);
  }
  /* The first message starts the clock: count what came after it. */
  double span = t_last > t0 ? (double)(t_last - t0) * 1e-9 : 0;
  double k = msgs > 1 ? (double)(msgs - 1) / (double)msgs : 0;
  printf("{\"pattern\":\"%s\",\"messages\":%llu,\"sources\":%llu,\"array_bytes\":%llu,"
         "\"bytes\":%llu,\"bad\":%llu,\"span_s\":%.6f,\"mps\":%.3f,\"sps\":%.3f,\"gbps\":%.4f}\n",
         pattern, (unsigned long long)msgs, (unsigned long long)sources,
         (unsigned long long)arr_bytes, (unsigned long long)bytes, (unsigned long long)bad, span,
         span > 0 ? k * (double)msgs / span : 0.0, span > 0 ? k * (double)sources / span : 0.0,
         span > 0 ? k * (double)arr_bytes / span / 1e9 : 0.0);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return rc;
}
