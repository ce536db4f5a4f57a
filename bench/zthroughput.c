/* zthroughput: the C sender and receiver of the throughput and latency
 * benchmarks (bench/run.py drives it). Written in C so that neither end is
 * the bottleneck it is supposed to measure.
 *
 *   zthroughput send --endpoint EP [--bind] --shape HxW [--seconds S |
 *                    --frames N] [--rate FPS] [--series ID] [--bank K]
 *       PUSH (lossless: blocks when the peer is full) SERIES_START, frames,
 *       SERIES_END in the beamd wire format. Frames are uint16 raw payloads
 *       taken round-robin from a bank encoded once at start, sent zero-copy,
 *       so the per-frame cost is one 128-byte header. t_acq_ns is stamped
 *       with CLOCK_REALTIME at send time, which is what latency is measured
 *       from. --rate paces against absolute deadlines (no drift).
 *   zthroughput recv --endpoint EP [--bind] [--topic T] [--series ID]
 *                    [--latency] [--skip N] [--timeout S] [--sub] [--passes N]
 *       PULL; counts FRAME messages (raw path) or RESULT messages whose
 *       topic is T (beamd path) until the SERIES_END of the series, and
 *       reports the steady rate between the first and the last counted
 *       message. --latency records now - t_acq_ns for each counted message
 *       and reports exact percentiles. --sub reads a PUB instead (lossy:
 *       the count may fall short of what was sent; frame_id_gaps says how
 *       often). --passes N takes the series ID .. ID+N-1 one after the
 *       other (beamd-replay --loop) and reports each one's count and the
 *       time its SERIES_END arrived.
 *   zthroughput ctl --endpoint EP COMMAND
 *       one REQ/REP exchange with beamd's control socket; prints the reply.
 *
 * Every mode takes the tools' CURVE options (tools/common/curve_opt.h):
 * --curve-secret FILE with --curve-server FILE to connect, with
 * --curve-allow DIR to bind, so the CURVE figure (bench/curve.py) measures
 * the same code and socket options as beamd and its tools use.
 *
 * Each mode prints one JSON object on stdout; diagnostics go to stderr.
 * Not a general tool: it exists to produce repeatable figures. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "bench/bench_zmq.h"

#include "proto/proto.h"
#include "tools/common/cli.h"
#include "tools/common/curve_opt.h"

#define MAX_PARTS (BEAM_MAX_PAYLOAD_PARTS + 3)
#define LAT_MAX 4000000u /* latency samples kept (about 1 h at 1000 frames/s) */
#define PASS_MAX 1024u

typedef struct opts_s {
  const char *endpoint;
  int bind;
  uint32_t h, w;
  double seconds;
  uint64_t frames;
  double rate;
  uint64_t series;
  unsigned bank;
  const char *topic;
  int latency;
  uint64_t skip;
  double timeout_s;
  int hwm;
  int sub;
  uint64_t passes;
} opts_t;

static tool_curve_t curve;

static void usage(FILE *f) {
  fprintf(f,
          "usage: zthroughput send --endpoint EP [--bind] --shape HxW [--seconds S | --frames N]\n"
          "                        [--rate FPS] [--series ID] [--bank K] [--hwm N]\n"
          "       zthroughput recv --endpoint EP [--bind] [--topic T] [--series ID] [--latency]\n"
          "                        [--skip N] [--timeout S] [--hwm N] [--sub] [--passes N]\n"
          "       zthroughput ctl --endpoint EP COMMAND\n"
          "every mode:\n" TOOL_CURVE_USAGE);
}

typedef struct pre_arg_s {
  void *ctx;
  const opts_t *o;
} pre_arg_t;

static int curve_pre(void *sock, void *arg) {
  const pre_arg_t *a = arg;
  return tool_curve_socket(&curve, a->ctx, sock, a->o->endpoint, a->o->bind);
}

static int open_sock(void *ctx, int type, const opts_t *o, void **out) {
  pre_arg_t a = {ctx, o};
  return bench_open_sock_pre(ctx, type, o->endpoint, o->bind, o->hwm, "zthroughput", out,
                             curve_pre, &a);
}

/* The ZAP handler lives in ctx: stopped before the context is. */
static void ctx_done(void *ctx) {
  tool_curve_fini(&curve);
  zmq_ctx_term(ctx);
}

/* ---- send ------------------------------------------------------------------ */

static void hdr_base(beam_hdr_t *h, const opts_t *o, uint16_t type) {
  memset(h, 0, sizeof *h);
  h->type = type;
  h->series_id = o->series;
  h->dtype = BEAM_DT_U16;
  h->ndim = 2;
  h->shape[0] = o->h;
  h->shape[1] = o->w;
  h->codec = BEAM_CODEC_RAW;
}

static int send_hdr_only(void *s, beam_hdr_t *h) {
  uint8_t buf[BEAM_HDR_SIZE_V1];
  h->nparts = 0;
  h->payload_size = 0;
  h->raw_size = 0;
  h->t_send_ns = h->t_acq_ns = bench_now_ns(CLOCK_REALTIME);
  if (beam_hdr_encode(h, buf, sizeof buf) < 0)
    return -1;
  return zmq_send(s, buf, sizeof buf, 0) < 0 ? -1 : 0;
}

/* Pseudo-Poisson-looking counts from a fixed LCG: the content does not
 * matter for raw transfer, but zero pages would flatter memory figures. */
static void fill_frame(uint16_t *px, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1u;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    px[i] = (uint16_t)((x >> 24) & 0x3f);
  }
}

static int do_send(const opts_t *o) {
  if (!o->h || !o->w) {
    fprintf(stderr, "zthroughput send: --shape HxW is required\n");
    return 2;
  }
  const size_t npix = (size_t)o->h * o->w, bytes = npix * sizeof(uint16_t);
  unsigned nbank = o->bank ? o->bank : 8;
  uint16_t **bank = calloc(nbank, sizeof *bank);
  if (!bank)
    return 1;
  for (unsigned i = 0; i < nbank; i++) {
    bank[i] = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!bank[i]) {
      fprintf(stderr, "zthroughput send: cannot allocate a %zu-byte frame bank\n", bytes * nbank);
      return 1;
    }
    fill_frame(bank[i], npix, i + 1);
  }
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (open_sock(ctx, ZMQ_PUSH, o, &s) < 0)
    return 1;
  /* A stuck peer must not hang the benchmark run forever. */
  int tmo = (int)(o->timeout_s * 1000);
  zmq_setsockopt(s, ZMQ_SNDTIMEO, &tmo, sizeof tmo);

  int rc = 0;
  uint64_t seq = 0, sent = 0, payload = 0;
  beam_hdr_t h;
  hdr_base(&h, o, BEAM_MSG_SERIES_START);
  h.seq = seq++;
  if (send_hdr_only(s, &h) < 0) {
    fprintf(stderr, "zthroughput send: SERIES_START: %s\n", zmq_strerror(errno));
    rc = 1;
    goto out;
  }
  const uint64_t t0 = bench_now_ns(CLOCK_MONOTONIC);
  const uint64_t t_end = t0 + (uint64_t)(o->seconds * 1e9);
  const double period = o->rate > 0 ? 1e9 / o->rate : 0;
  uint8_t buf[BEAM_HDR_SIZE_V1];
  for (uint64_t i = 0;; i++) {
    if (o->frames ? i >= o->frames : bench_now_ns(CLOCK_MONOTONIC) >= t_end)
      break;
    if (period > 0) {
      uint64_t due = t0 + (uint64_t)(period * (double)i);
      struct timespec ts = {(time_t)(due / 1000000000ull), (long)(due % 1000000000ull)};
      while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
      }
    }
    hdr_base(&h, o, BEAM_MSG_FRAME);
    h.frame_id = i;
    h.seq = seq++;
    h.nparts = 1;
    h.raw_size = h.payload_size = bytes;
    h.t_acq_ns = h.t_send_ns = bench_now_ns(CLOCK_REALTIME);
    beam_hdr_encode(&h, buf, sizeof buf);
    zmq_msg_t m;
    /* ffn NULL: the bank outlives the context, ZeroMQ may keep pointers. */
    zmq_msg_init_data(&m, bank[i % nbank], bytes, NULL, NULL);
    if (zmq_send(s, buf, sizeof buf, ZMQ_SNDMORE) < 0 || zmq_msg_send(&m, s, 0) < 0) {
      fprintf(stderr, "zthroughput send: frame %" PRIu64 ": %s\n", i, zmq_strerror(errno));
      zmq_msg_close(&m);
      rc = 1;
      goto out;
    }
    sent++;
    payload += bytes;
  }
  const uint64_t t1 = bench_now_ns(CLOCK_MONOTONIC);
  hdr_base(&h, o, BEAM_MSG_SERIES_END);
  h.seq = seq++;
  h.frame_id = sent;
  if (send_hdr_only(s, &h) < 0) {
    fprintf(stderr, "zthroughput send: SERIES_END: %s\n", zmq_strerror(errno));
    rc = 1;
  }
  double el = (double)(t1 - t0) * 1e-9;
  /* CLOCK_MONOTONIC is system-wide: the driver sets t0 against the
   * receiver's last arrival for an end-to-end rate. */
  printf("{\"mode\":\"send\",\"frames\":%" PRIu64 ",\"bytes\":%" PRIu64
         ",\"elapsed_s\":%.6f,\"fps\":%.3f,\"gbps\":%.4f,\"t0_mono_ns\":%" PRIu64
         ",\"t1_mono_ns\":%" PRIu64 "}\n",
         sent, payload, el, el > 0 ? (double)sent / el : 0.0,
         el > 0 ? (double)payload / el / 1e9 : 0.0, t0, t1);
out:
  if (s) {
    /* Linger so the last frames and SERIES_END reach the peer. */
    int linger = tmo;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(s);
  }
  ctx_done(ctx);
  for (unsigned i = 0; i < nbank; i++)
    free(bank[i]);
  free(bank);
  return rc;
}

/* ---- recv ------------------------------------------------------------------ */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static double pct_us(const uint64_t *v, size_t n, double q) {
  if (!n)
    return 0;
  size_t k = (size_t)(q * (double)n + 0.999999);
  if (k < 1)
    k = 1;
  if (k > n)
    k = n;
  return (double)v[k - 1] / 1e3;
}

static int recv_parts(void *s, zmq_msg_t *parts, int *n) {
  int more = 1;
  *n = 0;
  while (more) {
    zmq_msg_t *p = &parts[*n < MAX_PARTS ? *n : MAX_PARTS - 1];
    if (*n >= MAX_PARTS)
      zmq_msg_close(p);
    zmq_msg_init(p);
    if (zmq_msg_recv(p, s, 0) < 0) {
      zmq_msg_close(p);
      for (int i = 0; i < *n && i < MAX_PARTS; i++)
        zmq_msg_close(&parts[i]);
      return -1;
    }
    more = zmq_msg_more(p);
    (*n)++;
  }
  return 0;
}

static int do_recv(const opts_t *o) {
  uint64_t *lat = NULL;
  if (o->latency && !(lat = malloc(LAT_MAX * sizeof *lat))) {
    fprintf(stderr, "zthroughput recv: out of memory\n");
    return 1;
  }
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (open_sock(ctx, o->sub ? ZMQ_SUB : ZMQ_PULL, o, &s) < 0)
    return 1;
  if (o->sub)
    zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0); /* the topic test below picks */
  int tmo = (int)(o->timeout_s * 1000);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  const uint64_t npass = o->passes ? o->passes : 1;
  uint64_t pass_counted[PASS_MAX] = {0}, pass_end[PASS_MAX] = {0}, ends = 0;
  const size_t tlen = o->topic ? strlen(o->topic) : 0;
  uint64_t messages = 0, counted = 0, bytes = 0, malformed = 0, nlat = 0, skipped = 0;
  uint64_t t_first = 0, t_last = 0, gaps = 0, last_fid = 0;
  int ended = 0, timed_out = 0, have_fid = 0;
  zmq_msg_t zp[MAX_PARTS];
  while (!ended) {
    int n;
    if (recv_parts(s, zp, &n) < 0) {
      if (errno == EAGAIN)
        timed_out = 1;
      else
        fprintf(stderr, "zthroughput recv: %s\n", zmq_strerror(errno));
      break;
    }
    uint64_t t_mono = bench_now_ns(CLOCK_MONOTONIC), t_real = bench_now_ns(CLOCK_REALTIME);
    messages++;
    beam_part_t parts[MAX_PARTS];
    int np = n < MAX_PARTS ? n : MAX_PARTS;
    for (int i = 0; i < np; i++) {
      parts[i].data = zmq_msg_data(&zp[i]);
      parts[i].size = zmq_msg_size(&zp[i]);
    }
    beam_msg_t m;
    const char *why = NULL;
    if (n > MAX_PARTS || beam_msg_parse(parts, (size_t)np, &beam_limits_default, &m, &why) < 0) {
      malformed++;
    } else if (o->series &&
               (m.hdr.series_id < o->series || m.hdr.series_id - o->series >= npass)) {
      /* another run's leftovers */
    } else if (m.hdr.type == BEAM_MSG_SERIES_END) {
      uint64_t p = o->series ? m.hdr.series_id - o->series : 0;
      if (p < PASS_MAX && !pass_end[p]) {
        pass_end[p] = t_mono;
        ended = ++ends >= npass;
      }
    } else {
      int want = o->topic ? m.hdr.type == BEAM_MSG_RESULT && m.topic && m.topic_len == tlen &&
                                !memcmp(m.topic, o->topic, tlen)
                          : m.hdr.type == BEAM_MSG_FRAME;
      if (want && skipped < o->skip) {
        skipped++;
      } else if (want) {
        if (!counted)
          t_first = t_mono;
        t_last = t_mono;
        counted++;
        bytes += m.hdr.payload_size;
        uint64_t p = o->series ? m.hdr.series_id - o->series : 0;
        if (p < PASS_MAX)
          pass_counted[p]++;
        if (have_fid && m.hdr.frame_id != last_fid + 1)
          gaps++;
        have_fid = 1;
        last_fid = m.hdr.frame_id;
        if (lat && nlat < LAT_MAX && m.hdr.t_acq_ns)
          lat[nlat++] = t_real > m.hdr.t_acq_ns ? t_real - m.hdr.t_acq_ns : 0;
      }
    }
    for (int i = 0; i < np; i++)
      zmq_msg_close(&zp[i]);
  }
  double el = counted > 1 ? (double)(t_last - t_first) * 1e-9 : 0;
  /* n messages span n-1 inter-arrival gaps; bytes likewise. */
  double fps = el > 0 ? (double)(counted - 1) / el : 0;
  double gbps = el > 0 && counted ? (double)bytes / (double)counted * fps / 1e9 : 0;
  printf("{\"mode\":\"recv\",\"messages\":%" PRIu64 ",\"counted\":%" PRIu64 ",\"bytes\":%" PRIu64
         ",\"malformed\":%" PRIu64 ",\"frame_id_gaps\":%" PRIu64
         ",\"elapsed_s\":%.6f,\"fps\":%.3f,\"gbps\":%.4f,\"t_first_mono_ns\":%" PRIu64
         ",\"t_last_mono_ns\":%" PRIu64 ",\"series_end\":%s,\"timed_out\":%s",
         messages, counted, bytes, malformed, gaps, el, fps, gbps, t_first, t_last,
         ended ? "true" : "false", timed_out ? "true" : "false");
  if (lat) {
    qsort(lat, nlat, sizeof *lat, cmp_u64);
    double sum = 0;
    for (uint64_t i = 0; i < nlat; i++)
      sum += (double)lat[i];
    printf(",\"latency\":{\"count\":%" PRIu64 ",\"skipped\":%" PRIu64
           ",\"min_us\":%.1f,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,"
           "\"p999_us\":%.1f,\"max_us\":%.1f}",
           nlat, skipped, pct_us(lat, nlat, 0), nlat ? sum / (double)nlat / 1e3 : 0.0,
           pct_us(lat, nlat, 0.50), pct_us(lat, nlat, 0.90), pct_us(lat, nlat, 0.99),
           pct_us(lat, nlat, 0.999), nlat ? (double)lat[nlat - 1] / 1e3 : 0.0);
  }
  if (o->passes) {
    printf(",\"passes\":[");
    for (uint64_t p = 0; p < npass && p < PASS_MAX; p++)
      printf("%s{\"series\":%" PRIu64 ",\"counted\":%" PRIu64 ",\"end_mono_ns\":%" PRIu64 "}",
             p ? "," : "", o->series + p, pass_counted[p], pass_end[p]);
    printf("]");
  }
  printf("}\n");
  free(lat);
  zmq_close(s);
  ctx_done(ctx);
  return ended ? 0 : 3;
}

/* ---- ctl ------------------------------------------------------------------- */

static int do_ctl(const opts_t *o, const char *cmd) {
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (open_sock(ctx, ZMQ_REQ, o, &s) < 0)
    return 1;
  int tmo = (int)(o->timeout_s * 1000), zero = 0;
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  int rc = 1;
  if (zmq_send(s, cmd, strlen(cmd), 0) >= 0) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) >= 0) {
      fwrite(zmq_msg_data(&m), 1, zmq_msg_size(&m), stdout);
      fputc('\n', stdout);
      rc = 0;
    } else {
      fprintf(stderr, "zthroughput ctl: no reply from %s: %s\n", o->endpoint, zmq_strerror(errno));
    }
    zmq_msg_close(&m);
  }
  zmq_close(s);
  ctx_done(ctx);
  return rc;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *mode = argv[1];
  opts_t o = {.seconds = 3, .series = 1, .timeout_s = 30};
  tool_cli_init("zthroughput");
  tool_curve_init(&curve);
  static const struct option lo[] = {
      {"endpoint", required_argument, 0, 'e'}, {"bind", no_argument, 0, 'b'},
      {"shape", required_argument, 0, 's'},    {"seconds", required_argument, 0, 'S'},
      {"frames", required_argument, 0, 'n'},   {"rate", required_argument, 0, 'r'},
      {"series", required_argument, 0, 'i'},   {"bank", required_argument, 0, 'k'},
      {"topic", required_argument, 0, 't'},    {"latency", no_argument, 0, 'L'},
      {"skip", required_argument, 0, 'x'},     {"timeout", required_argument, 0, 'T'},
      {"hwm", required_argument, 0, 'H'},      {"sub", no_argument, 0, 'U'},
      {"passes", required_argument, 0, 'P'},   TOOL_CURVE_LONGOPTS,
      {0, 0, 0, 0}};
  int c;
  optind = 2;
  while ((c = getopt_long(argc, argv, "e:bs:S:n:r:i:k:t:Lx:T:H:", lo, NULL)) != -1) {
    uint64_t u;
    int bad = 0;
    if (tool_curve_opt(&curve, c, optarg))
      continue;
    switch (c) {
    case 'e': o.endpoint = optarg; break;
    case 'b': o.bind = 1; break;
    case 's': {
      unsigned hh, ww;
      char tail;
      if (sscanf(optarg, "%ux%u%c", &hh, &ww, &tail) != 2 || !hh || !ww || hh > 65536 || ww > 65536)
        bad = 1;
      o.h = hh, o.w = ww;
      break;
    }
    case 'S': bad = parse_pos_double(optarg, &o.seconds); break;
    case 'n': bad = parse_u64(optarg, &o.frames); break;
    case 'r': bad = parse_pos_double(optarg, &o.rate); break;
    case 'i': bad = parse_u64(optarg, &o.series) || !o.series; break;
    case 'k': bad = parse_u64(optarg, &u) || !u || u > 4096; o.bank = (unsigned)u; break;
    case 't': o.topic = optarg; break;
    case 'L': o.latency = 1; break;
    case 'x': bad = parse_u64(optarg, &o.skip); break;
    case 'T': bad = parse_pos_double(optarg, &o.timeout_s) || o.timeout_s <= 0; break;
    case 'H': bad = parse_u64(optarg, &u) || u > 1000000; o.hwm = (int)u; break;
    case 'U': o.sub = 1; break;
    case 'P': bad = parse_u64(optarg, &o.passes) || !o.passes || o.passes > PASS_MAX; break;
    default: usage(stderr); return 2;
    }
    if (bad) {
      const char *name = "?";
      for (const struct option *p = lo; p->name; p++)
        if (p->val == c)
          name = p->name;
      fprintf(stderr, "zthroughput: bad value for --%s: \"%s\"\n", name, optarg);
      return 2;
    }
  }
  if (!o.endpoint) {
    fprintf(stderr, "zthroughput: --endpoint is required\n");
    return 2;
  }
  if (!strcmp(mode, "send"))
    return do_send(&o);
  if (!strcmp(mode, "recv"))
    return do_recv(&o);
  if (!strcmp(mode, "ctl")) {
    if (optind != argc - 1) {
      fprintf(stderr, "zthroughput ctl: exactly one COMMAND expected\n");
      return 2;
    }
    return do_ctl(&o, argv[optind]);
  }
  fprintf(stderr, "zthroughput: unknown mode \"%s\" (send, recv, ctl)\n", mode);
  usage(stderr);
  return 2;
}
