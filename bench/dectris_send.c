/* dectris_send: the C sender, the plain receiver and the decoder loop of
 * the DECTRIS benchmark (bench/run.py, figure "dectris"). Written in C so
 * that neither end is the bottleneck it is supposed to measure.
 *
 *   dectris_send send --endpoint EP [--bind] --stream 1|2 --shape 4m|16m|HxW
 *                     [--mean M] [--seconds S | --frames N] [--series ID]
 *                     [--bank K] [--bank-file F] [--slots N] [--hwm N]
 *                     [--timeout S] [--hold S]
 *       PUSH (lossless: blocks when the peer is full) one series as a
 *       DECTRIS detector sends it: SIMPLON stream v1 (dheader + config,
 *       then dimage, dimage_d, blob, dconfig per image, dseries_end) or v2
 *       (CBOR start, image, end; one part each), header_detail basic. The
 *       K bank frames (uint16 Poisson counts of mean M, default 1) are
 *       bslz4-encoded once at start. v1 blobs go out zero-copy from the
 *       bank; only the dimage part (frame number, series) is written per
 *       frame. v2 images are whole CBOR messages in N slots (default
 *       hwm + 4, at least K) sent zero-copy, and only their 8-byte image_id
 *       is patched per frame, once ZeroMQ has released the slot (it
 *       rarely has not: the wait is counted). nimages / number_of_images
 *       is N with --frames, else 0 (not known in advance). --bank-file F
 *       keeps the encoded bank in F for the next process with the same
 *       shape, mean and K (made and written there when F does not hold
 *       it). After the end message it prints its JSON line and, with
 *       --hold S, stays connected until SIGTERM/SIGINT or S seconds: over
 *       ipc a PUSH that closes while its peer is still reading loses its
 *       last message (the end), linger or not, so the driver stops it
 *       once the receiver has seen the end.
 *   dectris_send recv --endpoint EP [--bind] [--hwm N] [--timeout S] [--store F]
 *       PULL; counts image messages (by the v1 htype / v2 type, nothing
 *       decoded) until the end message, and reports the rate between the
 *       first and the last image: raw ZeroMQ carrying the same messages.
 *       With --store F it also write()s every part of each image message
 *       to the file F, on the receiving thread: the least any recorder
 *       must do, the yardstick of what this machine can store.
 *   dectris_send decode --shape S [--mean M] [--bank K] [--bank-file F]
 *                       [--reps R] [--min-seconds T]
 *       beam_codec_decode of the bank's blobs in a loop on one thread: the
 *       decoder's rate alone for the same frames (median of R runs of at
 *       least T seconds each).
 *
 * Each mode prints one JSON object on stdout; diagnostics go to stderr.
 * Not a general tool: it exists to produce repeatable figures. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "bench/bench_zmq.h"

#include "bench/dectris_bench.h"

#define MAX_PARTS 16

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

typedef struct opts_s {
  const char *endpoint;
  int bind, stream;
  uint32_t h, w;
  double mean, seconds, timeout_s, min_seconds, hold_s;
  const char *bank_file, *store;
  uint64_t frames, series;
  unsigned bank, slots, reps;
  int hwm;
} opts_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: dectris_send send --endpoint EP [--bind] --stream 1|2 --shape 4m|16m|HxW\n"
          "                         [--mean M] [--seconds S | --frames N] [--series ID]\n"
          "                         [--bank K] [--bank-file F] [--slots N] [--hwm N]\n"
          "                         [--timeout S] [--hold S]\n"
          "       dectris_send recv --endpoint EP [--bind] [--hwm N] [--timeout S] [--store F]\n"
          "       dectris_send decode --shape S [--mean M] [--bank K] [--bank-file F]\n"
          "                           [--reps R] [--min-seconds T]\n");
}

static int open_sock(void *ctx, int type, const opts_t *o, void **out) {
  return bench_open_sock(ctx, type, o->endpoint, o->bind, o->hwm, "dectris_send", out);
}

/* ---- send ------------------------------------------------------------------ */

/* A v2 image message, owned here, lent to ZeroMQ while inflight > 0. */
typedef struct slot_s {
  dxb_cbor_t msg;
  size_t id_off;
  atomic_int inflight;
} slot_t;

static void slot_release(void *data, void *hint) {
  (void)data;
  atomic_fetch_sub((atomic_int *)hint, 1);
}

static int send_copy(void *s, const void *p, size_t n, int more) {
  return zmq_send(s, p, n, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

static int do_send(const opts_t *o) {
  if (!o->h || !o->w || (o->stream != 1 && o->stream != 2)) {
    fprintf(stderr, "dectris_send send: --shape and --stream 1|2 are required\n");
    return 2;
  }
  dxb_bank_t bank;
  const unsigned k = o->bank ? o->bank : 4;
  int loaded;
  if (dxb_bank_get(&bank, o->bank_file, o->h, o->w, o->mean, k, &loaded) < 0) {
    fprintf(stderr, "dectris_send send: cannot build a bank of %u %ux%u frames\n", k, o->h, o->w);
    return 1;
  }
  const uint64_t nimages = o->frames; /* 0 with --seconds: not known in advance */
  /* v1: part 2 per bank frame; v2: whole messages in slots. */
  char (*dimage_d)[160] = calloc(k, sizeof *dimage_d);
  unsigned nslots = 0;
  slot_t *slots = NULL;
  int rc = dimage_d ? 0 : 1;
  for (unsigned i = 0; rc == 0 && i < k; i++)
    dxb_v1_dimage_d(dimage_d[i], sizeof dimage_d[i], o->h, o->w, bank.len[i]);
  if (rc == 0 && o->stream == 2) {
    nslots = o->slots ? o->slots : (unsigned)(o->hwm > 0 ? o->hwm : 1000) + 4;
    if (nslots < k)
      nslots = k;
    if (!(slots = calloc(nslots, sizeof *slots)))
      rc = 1;
    for (unsigned i = 0; rc == 0 && i < nslots; i++) {
      dxb_v2_image(&slots[i].msg, o->series, 0, o->h, o->w, bank.blob[i % k], bank.len[i % k],
                   NULL, &slots[i].id_off);
      atomic_init(&slots[i].inflight, 0);
      if (slots[i].msg.oom)
        rc = 1;
    }
    if (rc)
      fprintf(stderr, "dectris_send send: out of memory for %u message slots\n", nslots);
  }
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (rc == 0 && open_sock(ctx, ZMQ_PUSH, o, &s) < 0)
    rc = 1;
  int tmo = (int)(o->timeout_s * 1000);
  if (s)
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &tmo, sizeof tmo);

  uint64_t sent = 0, msg_bytes = 0, blob_bytes = 0, waits = 0, t0 = 0, t0_real = 0, t1 = 0;
  double frame_time = 0.001;
  /* The start message. */
  if (rc == 0 && o->stream == 1) {
    char *hd = dxb_v1_dheader(o->series, "basic");
    char *cfg = dxb_v1_config(o->h, o->w, nimages, frame_time);
    if (!hd || !cfg || send_copy(s, hd, strlen(hd), 1) < 0 || send_copy(s, cfg, strlen(cfg), 0) < 0)
      rc = 1;
    free(hd);
    free(cfg);
  } else if (rc == 0) {
    dxb_cbor_t st = {0};
    dxb_v2_start(&st, o->series, o->h, o->w, nimages, frame_time, NULL, NULL, NULL);
    if (st.oom || send_copy(s, st.buf, st.len, 0) < 0)
      rc = 1;
    free(st.buf);
  }
  if (rc) {
    fprintf(stderr, "dectris_send send: start message: %s\n", zmq_strerror(errno));
    goto out;
  }
  t0 = bench_now_ns(CLOCK_MONOTONIC);
  t0_real = bench_now_ns(CLOCK_REALTIME);
  const uint64_t t_end = t0 + (uint64_t)(o->seconds * 1e9);
  for (uint64_t i = 0;; i++) {
    if (o->frames ? i >= o->frames : bench_now_ns(CLOCK_MONOTONIC) >= t_end)
      break;
    unsigned b = (unsigned)(i % k);
    if (o->stream == 1) {
      char p1[192], p4[160];
      int n1 = dxb_v1_dimage(p1, sizeof p1, o->series, i, bank.hash[b]);
      int n4 = dxb_v1_dconfig(p4, sizeof p4, i);
      zmq_msg_t m;
      /* ffn NULL: the bank outlives the context, ZeroMQ may keep pointers. */
      zmq_msg_init_data(&m, bank.blob[b], bank.len[b], NULL, NULL);
      size_t n2 = strlen(dimage_d[b]);
      if (send_copy(s, p1, (size_t)n1, 1) < 0 || send_copy(s, dimage_d[b], n2, 1) < 0 ||
          zmq_msg_send(&m, s, ZMQ_SNDMORE) < 0 || send_copy(s, p4, (size_t)n4, 0) < 0) {
        zmq_msg_close(&m);
        fprintf(stderr, "dectris_send send: image %" PRIu64 ": %s\n", i, zmq_strerror(errno));
        rc = 1;
        goto out;
      }
      msg_bytes += (uint64_t)n1 + n2 + bank.len[b] + (uint64_t)n4;
    } else {
      slot_t *sl = &slots[i % nslots];
      if (atomic_load(&sl->inflight) != 0) {
        waits++;
        while (atomic_load(&sl->inflight) != 0)
          sched_yield();
      }
      dxb_be(sl->msg.buf + sl->id_off, i, 8);
      atomic_fetch_add(&sl->inflight, 1);
      zmq_msg_t m;
      zmq_msg_init_data(&m, sl->msg.buf, sl->msg.len, slot_release, &sl->inflight);
      if (zmq_msg_send(&m, s, 0) < 0) {
        zmq_msg_close(&m); /* releases: the slot is free again */
        fprintf(stderr, "dectris_send send: image %" PRIu64 ": %s\n", i, zmq_strerror(errno));
        rc = 1;
        goto out;
      }
      msg_bytes += sl->msg.len;
    }
    blob_bytes += bank.len[b];
    sent++;
  }
  t1 = bench_now_ns(CLOCK_MONOTONIC);
  if (o->stream == 1) {
    char e[96];
    int n = dxb_v1_end(e, sizeof e, o->series);
    rc = send_copy(s, e, (size_t)n, 0) < 0;
  } else {
    dxb_cbor_t e = {0};
    dxb_v2_end(&e, o->series);
    rc = e.oom || send_copy(s, e.buf, e.len, 0) < 0;
    free(e.buf);
  }
  if (rc)
    fprintf(stderr, "dectris_send send: end message: %s\n", zmq_strerror(errno));
  double el = (double)(t1 - t0) * 1e-9;
  /* CLOCK_MONOTONIC is system-wide: the driver sets t0 against the
   * receiver's last arrival; t0_real_ns against a file's mtime. */
  printf("{\"mode\":\"send\",\"stream\":%d,\"shape\":[%u,%u],\"frames\":%" PRIu64
         ",\"msg_bytes\":%" PRIu64 ",\"blob_bytes\":%" PRIu64 ",\"raw_frame_bytes\":%zu"
         ",\"bank\":%u,\"slots\":%u,\"slot_waits\":%" PRIu64 ",\"mean\":%g,\"ratio\":%.4f"
         ",\"bank_s\":%.3f,\"bank_loaded\":%s,\"elapsed_s\":%.6f,\"fps\":%.3f,\"gbps\":%.4f"
         ",\"t0_mono_ns\":%" PRIu64 ",\"t0_real_ns\":%" PRIu64 ",\"t1_mono_ns\":%" PRIu64 "}\n",
         o->stream, o->h, o->w, sent, msg_bytes, blob_bytes, bank.raw_bytes, k, nslots, waits,
         o->mean, dxb_bank_ratio(&bank), bank.encode_s, loaded ? "true" : "false", el,
         el > 0 ? (double)sent / el : 0.0,
         el > 0 ? (double)blob_bytes / el / 1e9 : 0.0, t0, t0_real, t1);
out:
  if (s) {
    /* Stay connected until the driver has seen the end (SIGTERM, SIGINT
     * or --hold seconds): over ipc, a PUSH that closes while the peer's
     * queue is full loses its last message even with a linger (seen
     * here with libzmq 4.3.4). */
    fflush(stdout);
    if (rc == 0 && o->hold_s > 0) {
      const uint64_t until = bench_now_ns(CLOCK_MONOTONIC) + (uint64_t)(o->hold_s * 1e9);
      struct timespec tick = {0, 10000000};
      while (!g_stop && bench_now_ns(CLOCK_MONOTONIC) < until)
        nanosleep(&tick, NULL);
    }
    /* Linger so the last images and the end reach the peer. */
    int linger = tmo;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(s);
  }
  zmq_ctx_term(ctx); /* every lent slot and blob is released by now */
  for (unsigned i = 0; slots && i < nslots; i++)
    free(slots[i].msg.buf);
  free(slots);
  free(dimage_d);
  dxb_bank_free(&bank);
  return rc;
}

/* ---- recv ------------------------------------------------------------------ */

enum { K_OTHER, K_START, K_IMAGE, K_END };

/* The kind of a message from its first part's first bytes, no parse: v2
 * "type" is the first key (d9 d9 f7, map head, "type", then the value),
 * v1 the htype of part 1. */
static int kind_of(const uint8_t *p, size_t n) {
  if (n >= 3 && p[0] == 0xd9 && p[1] == 0xd9 && p[2] == 0xf7) {
    size_t m = n < 24 ? n : 24;
    if (memmem(p, m, "\x65image", 6))
      return K_IMAGE;
    if (memmem(p, m, "\x63" "end", 4))
      return K_END;
    if (memmem(p, m, "\x65start", 6))
      return K_START;
    return K_OTHER;
  }
  if (memmem(p, n, "\"dimage-", 8))
    return K_IMAGE;
  if (memmem(p, n, "\"dseries_end", 12))
    return K_END;
  if (memmem(p, n, "\"dheader-", 9))
    return K_START;
  return K_OTHER;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

static int do_recv(const opts_t *o) {
  void *ctx = zmq_ctx_new(), *s = NULL;
  if (open_sock(ctx, ZMQ_PULL, o, &s) < 0)
    return 1;
  int tmo = (int)(o->timeout_s * 1000);
  zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
  int fd = -1;
  if (o->store && (fd = open(o->store, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0) {
    fprintf(stderr, "dectris_send recv: %s: %s\n", o->store, strerror(errno));
    return 1;
  }
  uint64_t messages = 0, counted = 0, bytes = 0, starts = 0, other = 0;
  uint64_t t_first = 0, t_last = 0;
  int ended = 0, timed_out = 0;
  zmq_msg_t parts[MAX_PARTS];
  while (!ended) {
    int n = 0, more = 1, kind = K_OTHER;
    size_t mb = 0;
    while (more) {
      zmq_msg_t *p = &parts[n < MAX_PARTS ? n : MAX_PARTS - 1];
      if (n >= MAX_PARTS)
        zmq_msg_close(p);
      zmq_msg_init(p);
      if (zmq_msg_recv(p, s, 0) < 0) {
        if (errno == EAGAIN)
          timed_out = 1;
        else
          fprintf(stderr, "dectris_send recv: %s\n", zmq_strerror(errno));
        zmq_msg_close(p);
        for (int i = 0; i < n && i < MAX_PARTS; i++)
          zmq_msg_close(&parts[i]);
        goto done;
      }
      if (n == 0)
        kind = kind_of(zmq_msg_data(p), zmq_msg_size(p));
      mb += zmq_msg_size(p);
      more = zmq_msg_more(p);
      n++;
    }
    uint64_t t = bench_now_ns(CLOCK_MONOTONIC);
    messages++;
    if (kind == K_IMAGE) {
      for (int i = 0; fd >= 0 && i < n && i < MAX_PARTS; i++)
        if (write_all(fd, zmq_msg_data(&parts[i]), zmq_msg_size(&parts[i])) < 0) {
          fprintf(stderr, "dectris_send recv: %s: %s\n", o->store, strerror(errno));
          return 1;
        }
      if (!counted)
        t_first = t;
      t_last = t;
      counted++;
      bytes += mb;
    } else if (kind == K_END) {
      ended = 1;
    } else if (kind == K_START) {
      starts++;
    } else {
      other++;
    }
    for (int i = 0; i < n && i < MAX_PARTS; i++)
      zmq_msg_close(&parts[i]);
  }
done:;
  double el = counted > 1 ? (double)(t_last - t_first) * 1e-9 : 0;
  double fps = el > 0 ? (double)(counted - 1) / el : 0;
  printf("{\"mode\":\"recv\",\"messages\":%" PRIu64 ",\"counted\":%" PRIu64 ",\"bytes\":%" PRIu64
         ",\"starts\":%" PRIu64 ",\"other\":%" PRIu64 ",\"elapsed_s\":%.6f,\"fps\":%.3f"
         ",\"gbps\":%.4f,\"t_first_mono_ns\":%" PRIu64 ",\"t_last_mono_ns\":%" PRIu64
         ",\"series_end\":%s,\"timed_out\":%s}\n",
         messages, counted, bytes, starts, other, el, fps,
         el > 0 && counted ? (double)bytes / (double)counted * fps / 1e9 : 0.0, t_first, t_last,
         ended ? "true" : "false", timed_out ? "true" : "false");
  if (fd >= 0)
    close(fd);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return ended ? 0 : 3;
}

/* ---- decode ---------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int do_decode(const opts_t *o) {
  if (!o->h || !o->w) {
    fprintf(stderr, "dectris_send decode: --shape is required\n");
    return 2;
  }
  dxb_bank_t bank;
  const unsigned k = o->bank ? o->bank : 4, reps = o->reps ? o->reps : 5;
  int loaded;
  if (dxb_bank_get(&bank, o->bank_file, o->h, o->w, o->mean, k, &loaded) < 0) {
    fprintf(stderr, "dectris_send decode: cannot build a bank of %u %ux%u frames\n", k, o->h, o->w);
    return 1;
  }
  void *dst = aligned_alloc(64, (bank.raw_bytes + 63) & ~(size_t)63);
  void *scratch = aligned_alloc(64, (bank.raw_bytes + 63) & ~(size_t)63);
  double *us = calloc(reps, sizeof *us);
  if (!dst || !scratch || !us) {
    fprintf(stderr, "dectris_send decode: out of memory\n");
    return 1;
  }
  double enc = 0;
  for (unsigned i = 0; i < k; i++)
    enc += (double)bank.len[i];
  enc /= k;
  int rc = 0;
  uint64_t total = 0;
  for (unsigned r = 0; r < reps && rc == 0; r++) {
    uint64_t n = 0, t0 = bench_now_ns(CLOCK_MONOTONIC), t = t0;
    do {
      const char *why = NULL;
      unsigned b = (unsigned)(n % k);
      if (beam_codec_decode(BEAM_CODEC_BSLZ4, bank.blob[b], bank.len[b], dst, bank.raw_bytes, 2,
                            scratch, &why) < 0) {
        fprintf(stderr, "dectris_send decode: %s\n", why ? why : "?");
        rc = 1;
        break;
      }
      n++;
      t = bench_now_ns(CLOCK_MONOTONIC);
    } while (n < k || (double)(t - t0) * 1e-9 < o->min_seconds);
    us[r] = (double)(t - t0) / 1e3 / (double)n;
    total += n;
  }
  if (rc == 0) {
    qsort(us, reps, sizeof *us, cmp_d);
    double med = reps % 2 ? us[reps / 2] : (us[reps / 2 - 1] + us[reps / 2]) / 2;
    printf("{\"mode\":\"decode\",\"codec\":\"bslz4\",\"shape\":[%u,%u],\"mean\":%g,\"bank\":%u"
           ",\"ratio\":%.4f,\"raw_frame_bytes\":%zu,\"blob_bytes\":%.0f,\"reps\":%u"
           ",\"decodes\":%" PRIu64 ",\"us_per_frame\":%.1f,\"us_min\":%.1f,\"us_max\":%.1f"
           ",\"fps\":%.2f,\"decoded_gbps\":%.4f,\"compressed_gbps\":%.4f}\n",
           o->h, o->w, o->mean, k, dxb_bank_ratio(&bank), bank.raw_bytes, enc, reps, total, med,
           us[0], us[reps - 1], 1e6 / med, (double)bank.raw_bytes / med / 1e3, enc / med / 1e3);
  }
  free(dst);
  free(scratch);
  free(us);
  dxb_bank_free(&bank);
  return rc;
}

/* ---- main ------------------------------------------------------------------ */

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *mode = argv[1];
  opts_t o = {.seconds = 2, .series = 1, .timeout_s = 30, .mean = 1.0, .min_seconds = 0.3};
  static const struct option lo[] = {
      {"endpoint", required_argument, 0, 'e'}, {"bind", no_argument, 0, 'b'},
      {"stream", required_argument, 0, 'v'},   {"shape", required_argument, 0, 's'},
      {"mean", required_argument, 0, 'm'},     {"seconds", required_argument, 0, 'S'},
      {"frames", required_argument, 0, 'n'},   {"series", required_argument, 0, 'i'},
      {"bank", required_argument, 0, 'k'},     {"slots", required_argument, 0, 'l'},
      {"hwm", required_argument, 0, 'H'},      {"timeout", required_argument, 0, 'T'},
      {"reps", required_argument, 0, 'r'},     {"min-seconds", required_argument, 0, 'M'},
      {"hold", required_argument, 0, 'o'},     {"bank-file", required_argument, 0, 'f'},
      {"store", required_argument, 0, 'w'},    {0, 0, 0, 0}};
  int c;
  optind = 2;
  while ((c = getopt_long(argc, argv, "e:bv:s:m:S:n:i:k:l:H:T:r:M:o:f:w:", lo, NULL)) != -1) {
    uint64_t u;
    int bad = 0;
    switch (c) {
    case 'e': o.endpoint = optarg; break;
    case 'b': o.bind = 1; break;
    case 'v': bad = parse_u64(optarg, &u) || (u != 1 && u != 2); o.stream = (int)u; break;
    case 's': bad = dxb_parse_shape(optarg, &o.h, &o.w); break;
    case 'm': bad = parse_pos_double(optarg, &o.mean) || o.mean <= 0 || o.mean > 30; break;
    case 'S': bad = parse_pos_double(optarg, &o.seconds); break;
    case 'n': bad = parse_u64(optarg, &o.frames); break;
    case 'i': bad = parse_u64(optarg, &o.series) || !o.series; break;
    case 'k': bad = parse_u64(optarg, &u) || !u || u > 256; o.bank = (unsigned)u; break;
    case 'l': bad = parse_u64(optarg, &u) || !u || u > 4096; o.slots = (unsigned)u; break;
    case 'H': bad = parse_u64(optarg, &u) || u > 1000000; o.hwm = (int)u; break;
    case 'T': bad = parse_pos_double(optarg, &o.timeout_s) || o.timeout_s <= 0; break;
    case 'r': bad = parse_u64(optarg, &u) || !u || u > 1000; o.reps = (unsigned)u; break;
    case 'M': bad = parse_pos_double(optarg, &o.min_seconds); break;
    case 'o': bad = parse_pos_double(optarg, &o.hold_s); break;
    case 'f': o.bank_file = optarg; break;
    case 'w': o.store = optarg; break;
    default: usage(stderr); return 2;
    }
    if (bad) {
      const char *name = "?";
      for (const struct option *p = lo; p->name; p++)
        if (p->val == c)
          name = p->name;
      fprintf(stderr, "dectris_send: bad value for --%s: \"%s\"\n", name, optarg);
      return 2;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "dectris_send: unexpected argument \"%s\"\n", argv[optind]);
    return 2;
  }
  if (!strcmp(mode, "decode"))
    return do_decode(&o);
  if (!o.endpoint) {
    fprintf(stderr, "dectris_send: --endpoint is required\n");
    return 2;
  }
  if (!strcmp(mode, "send")) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    return do_send(&o);
  }
  if (!strcmp(mode, "recv"))
    return do_recv(&o);
  fprintf(stderr, "dectris_send: unknown mode \"%s\" (send, recv, decode)\n", mode);
  usage(stderr);
  return 2;
}
