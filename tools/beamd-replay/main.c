/* beamd-replay: serves the frames of an HDF5 file to beamd over ZeroMQ
 * REQ/REP, losslessly and resumably (proto/PROTOCOL.md section 13).
 *
 * Parses the command line, opens the file (h5src.c, metadata in h5meta.c),
 * binds one REP socket and answers requests (serve.c) until SIGINT or
 * SIGTERM, drawing a one-line progress display when stderr is a terminal.
 * Usage is in docs/replay.md and --help. Exit codes: 0 stopped by a
 * signal, 1 runtime error (file, bind, socket), 2 bad command line.
 */
#include "tools/beamd-replay/replay.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "tools/common/curve_opt.h"

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:5500"
#define PROGRESS_MS 250
#define LINGER_MS 1000

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-replay FILE.h5 [options]\n"
"Serves the frames of an HDF5 file (a 3-D dataset or an NXmx/Eiger master)\n"
"over ZeroMQ REP, as proto/PROTOCOL.md section 13 describes.\n"
"  --bind ENDPOINT      REP endpoint (default " DEFAULT_ENDPOINT ")\n"
"  --dataset PATH       dataset of frames (default: NXmx master links, else\n"
"                       /entry/data/data, else the only 3-D dataset)\n"
"  --first N            first frame served, dataset index (default 0)\n"
"  --last N             last frame served, inclusive (default the last one)\n"
"  --stride S           serve every S-th frame (default 1)\n"
"  --rate HZ            at most HZ frames per second (default 0 = unpaced)\n"
"  --loop               serve the range again and again, a new series each pass\n"
"  --series-id ID       series id of the first pass (default 1)\n"
"  --max-bytes B        most payload bytes in one reply (default 268435456)\n"
"  --no-shm             never put payloads in a consumer's shared memory; every\n"
"                       frame travels inside the reply (section 13.6)\n"
"  --no-map             never let a consumer read chunks in place from the file;\n"
"                       every payload is read here (section 13.8)\n"
"  --meta-list [KEY=]DSET  a 1-D dataset of the file with one number per frame\n"
"                       (e.g. /entry/data/delay) into the series metadata as\n"
"                       KEY: [...] (default KEY: the dataset's name), KEY_units\n"
"                       from its units attribute; repeatable (at most 8)\n"
"  --bad-frames LIST    serve these frames (dataset indices, e.g. 3,7,10-20)\n"
"                       flagged BAD: stages leave them out (XPCS skips their pairs)\n"
"  --bad-dataset DSET   the same from a 1-D dataset of the file, one value per\n"
"                       frame, nonzero (or NaN) = bad; both may be given\n"
"  --quiet              no start-up lines and no progress line\n"
"  --stats-json         print one JSON line of totals on stdout at exit\n"
TOOL_CURVE_USAGE
"  --help               this text\n"
"  --version            print the version (beamd's) and exit\n");
}

enum {
  OPT_BIND = 256, OPT_DATASET, OPT_FIRST, OPT_LAST, OPT_STRIDE, OPT_RATE, OPT_LOOP,
  OPT_SERIES_ID, OPT_MAX_BYTES, OPT_NO_SHM, OPT_NO_MAP, OPT_QUIET, OPT_STATS, OPT_HELP,
  OPT_META_LIST, OPT_BAD_FRAMES, OPT_BAD_DATASET,
};

static const struct option long_opts[] = {
  {"bind", required_argument, 0, OPT_BIND},
  {"dataset", required_argument, 0, OPT_DATASET},
  {"first", required_argument, 0, OPT_FIRST},
  {"last", required_argument, 0, OPT_LAST},
  {"stride", required_argument, 0, OPT_STRIDE},
  {"rate", required_argument, 0, OPT_RATE},
  {"loop", no_argument, 0, OPT_LOOP},
  {"series-id", required_argument, 0, OPT_SERIES_ID},
  {"max-bytes", required_argument, 0, OPT_MAX_BYTES},
  {"no-shm", no_argument, 0, OPT_NO_SHM},
  {"no-map", no_argument, 0, OPT_NO_MAP},
  {"meta-list", required_argument, 0, OPT_META_LIST},
  {"bad-frames", required_argument, 0, OPT_BAD_FRAMES},
  {"bad-dataset", required_argument, 0, OPT_BAD_DATASET},
  {"quiet", no_argument, 0, OPT_QUIET},
  {"stats-json", no_argument, 0, OPT_STATS},
  TOOL_CURVE_LONGOPTS,
  {"help", no_argument, 0, OPT_HELP},
  TOOL_VERSION_LONGOPT,
  {0, 0, 0, 0},
};

/* Returns 0, 1 for --help, or -1 after printing why. */
static tool_curve_t curve;

static int parse_args(int argc, char **argv, rp_opts_t *o) {
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    switch (c) {
    case OPT_BIND: o->endpoint = optarg; break;
    case OPT_DATASET:
      if (optarg[0] != '/')
        return tool_bad("dataset", optarg, "an absolute HDF5 path, e.g. /entry/data/data");
      o->dataset = optarg;
      break;
    case OPT_FIRST: if (tool_parse_u64("first", optarg, 0, (uint64_t)INT64_MAX / 2, &o->first)) return -1; break;
    case OPT_LAST:
      if (tool_parse_u64("last", optarg, 0, (uint64_t)INT64_MAX / 2, &o->last)) return -1;
      o->have_last = 1;
      break;
    case OPT_STRIDE: if (tool_parse_u64("stride", optarg, 1, 1u << 30, &o->stride)) return -1; break;
    case OPT_RATE:
      if (tool_parse_double("rate", optarg, 0, 1e9, "expected frames per second in 0..1e9",
                            &o->rate))
        return -1;
      break;
    case OPT_LOOP: o->loop = 1; break;
    case OPT_SERIES_ID:
      if (tool_parse_u64("series-id", optarg, 0, (uint64_t)INT64_MAX / 2, &o->series_id)) return -1;
      break;
    case OPT_MAX_BYTES:
      if (tool_parse_u64("max-bytes", optarg, 1, 1ull << 40, &o->max_bytes)) return -1;
      break;
    case OPT_NO_SHM: o->no_shm = 1; break;
    case OPT_NO_MAP: o->no_map = 1; break;
    case OPT_META_LIST: {
      const char *eq = strchr(optarg, '=');
      const char *ds = eq ? eq + 1 : optarg;
      if (ds[0] != '/' || (eq && eq == optarg))
        return tool_bad("meta-list", optarg, "[KEY=]DSET with an absolute HDF5 path, e.g. "
                        "delay=/entry/data/delay");
      if (o->n_meta_list == RP_META_LISTS_MAX)
        return tool_bad("meta-list", optarg, "at most 8 lists");
      o->meta_list[o->n_meta_list++] = optarg;
      break;
    }
    case OPT_BAD_FRAMES: o->bad_frames = optarg; break;
    case OPT_BAD_DATASET:
      if (optarg[0] != '/')
        return tool_bad("bad-dataset", optarg, "an absolute HDF5 path, e.g. /entry/data/bad");
      o->bad_dataset = optarg;
      break;
    case OPT_QUIET: o->quiet = 1; break;
    case OPT_STATS: o->stats_json = 1; break;
    case OPT_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    default:
      if (tool_curve_opt(&curve, c, optarg))
        break;
      return tool_bad_option(argv, 1);
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "beamd-replay: no file given\n");
    return -1;
  }
  if (optind + 1 < argc) {
    fprintf(stderr, "beamd-replay: one file only; unexpected argument: %s\n", argv[optind + 1]);
    return -1;
  }
  o->file = argv[optind];
  return 0;
}

/* ---- progress and totals ---------------------------------------------------- */

typedef struct progress_s {
  uint64_t t_ns, frames, bytes; /* at the last draw */
  double rate, mbps;            /* smoothed */
  int drawn;
} progress_t;

static void progress_draw(progress_t *p, const rp_server_t *srv) {
  uint64_t now = beam_now_ns();
  if (p->t_ns && now - p->t_ns < PROGRESS_MS * 1000000ull)
    return;
  if (p->t_ns) {
    double dt = (double)(now - p->t_ns) * 1e-9;
    double r = (double)(srv->st.frames - p->frames) / dt;
    double b = (double)(srv->st.payload_bytes - p->bytes) / dt / 1e6;
    /* Smoothed over about half a second, so the line is readable. */
    p->rate = p->drawn ? 0.5 * p->rate + 0.5 * r : r;
    p->mbps = p->drawn ? 0.5 * p->mbps + 0.5 * b : b;
  }
  p->t_ns = now;
  p->frames = srv->st.frames;
  p->bytes = srv->st.payload_bytes;
  uint64_t T = srv->T, k = srv->last_next;
  uint64_t pass = k / T, in_pass = k % T;
  if (!srv->o->loop && k >= T)
    in_pass = T;
  char eta[32] = "-";
  if (p->rate > 0.5 && in_pass < T)
    snprintf(eta, sizeof eta, "%.0f s", (double)(T - in_pass) / p->rate);
  else if (in_pass >= T)
    snprintf(eta, sizeof eta, "done");
  char passbuf[32] = "";
  if (srv->o->loop)
    snprintf(passbuf, sizeof passbuf, " pass %llu", (unsigned long long)pass + 1);
  fprintf(stderr, "\r\033[Kbeamd-replay: %llu/%llu%s  %.1f fr/s  %.1f MB/s  ETA %s  corrupt %llu",
          (unsigned long long)in_pass, (unsigned long long)T, passbuf, p->rate, p->mbps, eta,
          (unsigned long long)srv->st.corrupt);
  fflush(stderr);
  p->drawn = 1;
}

static void print_stats(const rp_server_t *srv) {
  const rp_stats_t *st = &srv->st;
  double secs = (double)(beam_now_ns() - st->t_start_ns) * 1e-9;
  double fspan = (double)(st->t_last_frame_ns - st->t_first_frame_ns) * 1e-9;
  double rate = st->frames >= 2 && fspan > 0 ? (double)st->frames / fspan : 0.0;
  printf("{\"requests\":%llu,\"bad_requests\":%llu,\"info_requests\":%llu,"
         "\"frames_served\":%llu,\"corrupt_served\":%llu,\"bad_served\":%llu,\"forwarded\":%llu,\"decoded\":%llu,"
         "\"series_started\":%llu,\"series_ended\":%llu,\"payload_bytes\":%llu,\"bytes\":%llu,"
         "\"arena_allocs\":%llu,\"arena_bytes\":%llu,\"shm_frames\":%llu,\"shm_refused\":%llu,"
         "\"map_frames\":%llu,\"map_refused\":%llu,\"seconds\":%.6f,\"rate\":%.3f,\"next\":%llu,\"total\":%llu}\n",
         (unsigned long long)st->requests, (unsigned long long)st->bad_requests,
         (unsigned long long)st->info_requests, (unsigned long long)st->frames,
         (unsigned long long)st->corrupt, (unsigned long long)st->bad,
         (unsigned long long)srv->src->forwarded,
         (unsigned long long)srv->src->decoded, (unsigned long long)st->series_started,
         (unsigned long long)st->series_ended, (unsigned long long)st->payload_bytes,
         (unsigned long long)st->bytes, (unsigned long long)st->arena_allocs,
         (unsigned long long)(srv->arena ? srv->arena->cap : 0),
         (unsigned long long)st->shm_frames, (unsigned long long)st->shm_refused,
         (unsigned long long)st->map_frames, (unsigned long long)st->map_refused, secs, rate,
         (unsigned long long)srv->last_next,
         (unsigned long long)srv->T);
  fflush(stdout);
}

static void print_start(const rp_server_t *srv, const rp_opts_t *o) {
  const rp_src_t *s = srv->src;
  fprintf(stderr, "beamd-replay: %s %s: %llu frames of %ux%u %s; serving %llu (first %llu, "
          "stride %llu)%s on %s\n", s->path, s->dataset, (unsigned long long)s->nframes, s->h,
          s->w, beam_dtype_name(s->dtype), (unsigned long long)srv->T,
          (unsigned long long)o->first, (unsigned long long)o->stride, o->loop ? ", looping" : "",
          o->endpoint);
  if (srv->bad)
    fprintf(stderr, "beamd-replay:   %llu frames of the file flagged BAD (%s%s%s)\n",
            (unsigned long long)srv->nbad, o->bad_frames ? "--bad-frames" : "",
            o->bad_frames && o->bad_dataset ? ", " : "", o->bad_dataset ? o->bad_dataset : "");
  for (size_t i = 0; i < s->nparts; i++)
    fprintf(stderr, "beamd-replay:   %s %s: %llu frames, %s\n", s->parts[i].file,
            s->parts[i].dataset, (unsigned long long)s->parts[i].nframes, s->parts[i].plan);
}

int main(int argc, char **argv) {
  rp_opts_t o = {
      .endpoint = DEFAULT_ENDPOINT, .stride = 1, .series_id = 1,
      .max_bytes = RP_DEFAULT_MAX_BYTES,
  };
  tool_cli_init("beamd-replay");
  tool_curve_init(&curve);
  int ex = tool_args_exit(parse_args(argc, argv, &o), usage);
  if (ex >= 0)
    return ex;
  o.progress = !o.quiet && isatty(STDERR_FILENO);

  tool_catch_stop(); /* blocking calls see EINTR and the flag */

  beam_diag_t d;
  beam_diag_clear(&d);
  rp_src_t src;
  rp_server_t srv;
  memset(&srv, 0, sizeof srv);
  int rc = 1;
  if (rp_src_open(&src, o.file, o.dataset, &d) < 0) {
    fprintf(stderr, "beamd-replay: %s\n", d.msg);
    rp_src_close(&src);
    return 1;
  }
  void *ctx = zmq_ctx_new();
  void *sock = ctx ? zmq_socket(ctx, ZMQ_REP) : NULL;
  if (!sock) {
    fprintf(stderr, "beamd-replay: cannot create ZeroMQ socket: %s\n", zmq_strerror(errno));
    goto out;
  }
  if (rp_server_init(&srv, sock, &src, &o, &d) < 0) {
    fprintf(stderr, "beamd-replay: %s\n", d.msg);
    goto out;
  }
  if (tool_curve_socket(&curve, ctx, sock, o.endpoint, 1) < 0)
    goto out;
  if (zmq_bind(sock, o.endpoint) < 0) {
    fprintf(stderr, "beamd-replay: cannot bind %s: %s\n", o.endpoint, zmq_strerror(errno));
    goto out;
  }
  if (!o.quiet)
    print_start(&srv, &o);
  progress_t prog;
  memset(&prog, 0, sizeof prog);
  rc = 0;
  while (!tool_stop) {
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(&it, 1, PROGRESS_MS);
    if (n < 0 && errno != EINTR) {
      fprintf(stderr, "beamd-replay: poll: %s\n", zmq_strerror(errno));
      rc = 1;
      break;
    }
    int h = 0;
    while (!tool_stop && (h = rp_server_handle(&srv, &tool_stop, &d)) > 0)
      ;
    if (!tool_stop && h < 0) {
      fprintf(stderr, "%sbeamd-replay: %s\n", prog.drawn ? "\n" : "", d.msg);
      rc = 1;
      break;
    }
    if (o.progress)
      progress_draw(&prog, &srv);
  }
  if (prog.drawn)
    fputc('\n', stderr);
  if (!o.quiet)
    fprintf(stderr, "beamd-replay: served %llu frames (%llu corrupt) in %llu requests%s\n",
            (unsigned long long)srv.st.frames, (unsigned long long)srv.st.corrupt,
            (unsigned long long)srv.st.requests, tool_stop ? ", stopped by signal" : "");
  if (o.stats_json)
    print_stats(&srv);

out:
  if (sock) {
    int linger = LINGER_MS;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(sock);
  }
  /* Waits for the linger: the arena, sent zero-copy, is released by
   * ZeroMQ's callbacks, which all run before this returns. */
  tool_curve_fini(&curve);
  if (ctx)
    while (zmq_ctx_term(ctx) < 0 && errno == EINTR)
      ;
  rp_server_destroy(&srv);
  rp_src_close(&src);
  return rc;
}
