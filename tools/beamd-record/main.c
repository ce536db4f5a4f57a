/* beamd-record: records a beamd result stream to HDF5, one file per series.
 *
 * One SUB (lossy, default) or PULL (--pull, lossless) socket per --connect
 * endpoint, polled together on one thread: the files are written here too,
 * in arrival order. SERIES_START (topic beamd.series) opens a series file,
 * RESULT messages land in it, SERIES_END closes it (renamed from .partial
 * unless the ABORTED flag is set). The file layout and every policy (late
 * subscribers, duplicates, topics after SWMR started, errors) are in
 * docs/recording.md; the files themselves are rfile.c.
 *
 * Exit codes: 0 done (--count/--series reached, a signal, or the timeout of
 * a run without targets), 1 a file could not be written (the data received
 * so far stays in the .partial files, closed properly), 2 bad command line,
 * 3 the timeout came before --count/--series was reached. */
#include "tools/beamd-record/rec.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "daemon/h5util.h"
#include "tools/common/curve_opt.h"

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:5600"
#define MAX_PARTS (2 + BEAM_MAX_PAYLOAD_PARTS + 1)
#define CLOSED_RING 256 /* series finished in this run, whose stragglers are ignored */
#define TICK_MS 100

typedef struct state_s {
  rec_ctx_t ctx;
  rec_counts_t c;
  void *socks[REC_MAX_CONNECT];
  rfile_t *open[REC_MAX_OPEN];
  uint64_t closed[CLOSED_RING];
  unsigned nclosed;
  uint8_t *buf, *scratch;
  size_t cap;
  FILE *stats_f;
  int failed;
} state_t;

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-record [options]\n"
"Records beamd results to HDF5, one file per series (docs/recording.md).\n"
"  --connect ENDPOINT   connect here (repeatable; default " DEFAULT_ENDPOINT ")\n"
"  --pull               PULL (lossless, from beamd's output.push) instead of SUB\n"
"  --dir DIR            directory for the files (default .)\n"
"  --prefix P           file names are DIR/<P>series_<id>.h5 (default none)\n"
"  --mode every|latest  keep every result (default) or only the latest, per topic\n"
"  --latest PREFIX      topics starting with PREFIX keep only the latest (repeatable)\n"
"  --compress none|gzip|bslz4  compression of the data datasets (default none)\n"
"  --swmr-after N       start SWMR mode after N stored results (default 100)\n"
"  --swmr-delay S       ... or S seconds after the file was opened (default 2)\n"
"  --no-swmr            never start SWMR (no live readers)\n"
"  --stats              append beamd.stats documents to DIR/<P>stats.jsonl\n"
"  --count N            exit after N stored results\n"
"  --series N           exit after N complete series\n"
"  --timeout S          exit after S seconds (rc 3 if --count/--series not reached)\n"
"  --hwm N              ZMQ_RCVHWM (default ZeroMQ's 1000; 0 = unlimited)\n"
"  --stats-json         print a JSON summary line at exit\n"
"  --xpcs-layout aps|none  also write XPCS results in the APS-8IDI layout read by\n"
"                       pyXpcsViewer and XPCS-Toolkit (/xpcs, /entry/instrument; default aps)\n"
"  --xpcs-qmap FILE[:/DATASET]  HDF5 label image of the XPCS stage (dataset default\n"
"                       /labels): gives /xpcs/qmap/dynamic_roi_map and mask\n"
TOOL_CURVE_USAGE
"  --help               this text\n"
"  --version            print the version (beamd's) and exit\n");
}

static int parse_secs(const char *opt, const char *s, double lo, double *out) {
  return tool_parse_double(opt, s, lo, 1e7, "seconds", out);
}

enum {
  O_CONNECT = 256, O_PULL, O_DIR, O_PREFIX, O_MODE, O_LATEST, O_COMPRESS, O_SWMR_AFTER,
  O_SWMR_DELAY, O_NO_SWMR, O_STATS, O_COUNT, O_SERIES, O_TIMEOUT, O_HWM, O_STATS_JSON, O_HELP,
  O_XPCS_LAYOUT, O_XPCS_QMAP,
};

static tool_curve_t curve;

static int parse_args(int argc, char **argv, rec_opts_t *o) {
  static const struct option lo[] = {
      {"connect", required_argument, 0, O_CONNECT}, {"pull", no_argument, 0, O_PULL},
      {"dir", required_argument, 0, O_DIR},         {"prefix", required_argument, 0, O_PREFIX},
      {"mode", required_argument, 0, O_MODE},       {"latest", required_argument, 0, O_LATEST},
      {"compress", required_argument, 0, O_COMPRESS},
      {"swmr-after", required_argument, 0, O_SWMR_AFTER},
      {"swmr-delay", required_argument, 0, O_SWMR_DELAY}, {"no-swmr", no_argument, 0, O_NO_SWMR},
      {"stats", no_argument, 0, O_STATS},           {"count", required_argument, 0, O_COUNT},
      {"series", required_argument, 0, O_SERIES},   {"timeout", required_argument, 0, O_TIMEOUT},
      {"hwm", required_argument, 0, O_HWM},         {"stats-json", no_argument, 0, O_STATS_JSON},
      TOOL_CURVE_LONGOPTS,
      {"help", no_argument, 0, O_HELP},
      TOOL_VERSION_LONGOPT,
      {"xpcs-layout", required_argument, 0, O_XPCS_LAYOUT},
      {"xpcs-qmap", required_argument, 0, O_XPCS_QMAP},       {0, 0, 0, 0}};
  int c;
  uint64_t u;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case O_CONNECT:
      if (o->nconnect == REC_MAX_CONNECT) return tool_bad("connect", optarg, "at most 16 endpoints");
      o->connect[o->nconnect++] = optarg;
      break;
    case O_PULL: o->pull = 1; break;
    case O_DIR:
      if (!*optarg || strlen(optarg) > 4000) return tool_bad("dir", optarg, "a path of 1..4000 characters");
      o->dir = optarg;
      break;
    case O_PREFIX:
      if (strchr(optarg, '/') || strlen(optarg) > 128) return tool_bad("prefix", optarg, "no '/', at most 128 characters");
      o->prefix = optarg;
      break;
    case O_MODE:
      if (!strcmp(optarg, "every")) o->latest_default = 0;
      else if (!strcmp(optarg, "latest")) o->latest_default = 1;
      else return tool_bad("mode", optarg, "every or latest");
      break;
    case O_LATEST:
      if (o->nlatest == REC_MAX_LATEST) return tool_bad("latest", optarg, "at most 32 prefixes");
      if (!*optarg || strlen(optarg) > BEAM_TOPIC_MAX) return tool_bad("latest", optarg, "a topic prefix");
      o->latest[o->nlatest++] = optarg;
      break;
    case O_COMPRESS:
      if (!strcmp(optarg, "none")) o->compress = REC_COMP_NONE;
      else if (!strcmp(optarg, "gzip")) o->compress = REC_COMP_GZIP;
      else if (!strcmp(optarg, "bslz4")) o->compress = REC_COMP_BSLZ4;
      else return tool_bad("compress", optarg, "none, gzip or bslz4");
      break;
    case O_SWMR_AFTER: if (tool_parse_u64_max("swmr-after", optarg, UINT64_MAX, &o->swmr_after)) return -1; break;
    case O_SWMR_DELAY: if (parse_secs("swmr-delay", optarg, 0, &o->swmr_delay)) return -1; break;
    case O_NO_SWMR: o->no_swmr = 1; break;
    case O_STATS: o->stats = 1; break;
    case O_COUNT:
      if (tool_parse_u64_max("count", optarg, UINT64_MAX, &o->count)) return -1;
      if (!o->count) return tool_bad("count", optarg, "at least 1");
      break;
    case O_SERIES:
      if (tool_parse_u64_max("series", optarg, UINT64_MAX, &o->nseries)) return -1;
      if (!o->nseries) return tool_bad("series", optarg, "at least 1");
      break;
    case O_TIMEOUT:
      if (parse_secs("timeout", optarg, 0.001, &o->timeout)) return -1;
      break;
    case O_HWM: if (tool_parse_u64_max("hwm", optarg, INT32_MAX, &u)) return -1; o->hwm = (int)u; break;
    case O_STATS_JSON: o->stats_json = 1; break;
    case O_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    case O_XPCS_LAYOUT:
      if (!strcmp(optarg, "aps")) o->xpcs_layout = REC_XPCS_APS;
      else if (!strcmp(optarg, "none")) o->xpcs_layout = REC_XPCS_NONE;
      else return tool_bad("xpcs-layout", optarg, "aps or none");
      break;
    case O_XPCS_QMAP:
      if (!*optarg || strlen(optarg) > 4000) return tool_bad("xpcs-qmap", optarg, "FILE or FILE:/DATASET");
      o->xpcs_qmap = optarg;
      break;
    default:
      if (tool_curve_opt(&curve, c, optarg))
        break;
      return tool_bad_option(argv, 0);
    }
  }
  if (tool_no_operands(argc, argv))
    return -1;
  if (o->nconnect == 0)
    o->connect[o->nconnect++] = DEFAULT_ENDPOINT;
  return 0;
}

/* A file can be created in dir: a real probe (root passes access(W_OK) on
 * read-only mounts). */
static int check_dir(const char *dir) {
  struct stat st;
  if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
    tool_log("error: output directory %s: %s", dir, errno ? strerror(errno) : "not a directory");
    return -1;
  }
  char probe[4100];
  snprintf(probe, sizeof probe, "%s/.beamd-record-XXXXXX", dir);
  int fd = mkstemp(probe);
  if (fd < 0) {
    tool_log("error: cannot create files in %s: %s", dir, strerror(errno));
    return -1;
  }
  close(fd);
  unlink(probe);
  return 0;
}

static rfile_t **find_open(state_t *st, uint64_t sid) {
  for (int i = 0; i < REC_MAX_OPEN; i++)
    if (st->open[i] && st->open[i]->series_id == sid)
      return &st->open[i];
  return NULL;
}

static int closed_before(const state_t *st, uint64_t sid) {
  unsigned n = st->nclosed < CLOSED_RING ? st->nclosed : CLOSED_RING;
  for (unsigned i = 0; i < n; i++)
    if (st->closed[i] == sid)
      return 1;
  return 0;
}

static void remember_closed(state_t *st, uint64_t sid) {
  st->closed[st->nclosed++ % CLOSED_RING] = sid;
}

static void fatal(state_t *st) {
  tool_log("error: %s", st->ctx.err);
  st->c.write_errors++;
  st->failed = 1;
}

static void close_file(state_t *st, rfile_t **slot, int complete, const char *why) {
  if (rfile_close(&st->ctx, slot, complete, why) < 0)
    fatal(st);
}

/* Series already recorded (in this run, or a finished file on disk): its
 * repeated messages (replay resumption) are ignored, not re-recorded. */
static int already_recorded(state_t *st, uint64_t sid) {
  if (closed_before(st, sid))
    return 1;
  char name[4300];
  rec_final_name(st->ctx.o, sid, name, sizeof name);
  if (access(name, F_OK) == 0) {
    tool_log("series %llu is already recorded in %s; its messages are ignored",
            (unsigned long long)sid, name);
    st->c.ignored_series++;
    remember_closed(st, sid);
    return 1;
  }
  return 0;
}

static rfile_t **open_series(state_t *st, uint64_t sid, const beam_msg_t *start) {
  int slot = -1;
  for (int i = 0; i < REC_MAX_OPEN && slot < 0; i++)
    if (!st->open[i])
      slot = i;
  if (slot < 0) {
    /* Many series open at once means their ends were lost: the oldest goes. */
    slot = 0;
    for (int i = 1; i < REC_MAX_OPEN; i++)
      if (st->open[i]->opened_ns < st->open[slot]->opened_ns)
        slot = i;
    remember_closed(st, st->open[slot]->series_id);
    close_file(st, &st->open[slot], 0, "too many series open at once; no SERIES_END seen");
  }
  st->open[slot] = rfile_open(&st->ctx, sid, start ? &start->hdr : NULL, start ? start->meta : NULL,
                              start ? start->meta_len : 0);
  if (!st->open[slot]) {
    fatal(st);
    return NULL;
  }
  return &st->open[slot];
}

static int grow(state_t *st, size_t need) {
  if (need <= st->cap)
    return 0;
  uint8_t *b = realloc(st->buf, need);
  if (!b)
    return -1;
  st->buf = b;
  b = realloc(st->scratch, need);
  if (!b)
    return -1;
  st->scratch = b;
  st->cap = need;
  return 0;
}

static void on_stats(state_t *st, const beam_msg_t *m, const void *data) {
  const rec_opts_t *o = st->ctx.o;
  st->c.stats_docs++;
  if (!o->stats || !data || m->hdr.dtype != BEAM_DT_U8)
    return;
  if (!st->stats_f) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%sstats.jsonl", o->dir, o->prefix);
    st->stats_f = fopen(path, "a");
    if (!st->stats_f) {
      snprintf(st->ctx.err, sizeof st->ctx.err, "%s: %s", path, strerror(errno));
      fatal(st);
      return;
    }
  }
  fwrite(data, 1, (size_t)m->hdr.raw_size, st->stats_f);
  fputc('\n', st->stats_f);
}

static void handle(state_t *st, zmq_msg_t *parts, size_t n, int overflow) {
  beam_part_t bp[MAX_PARTS];
  beam_msg_t m;
  const char *why = NULL;
  st->c.messages++;
  for (size_t i = 0; i < n; i++) {
    bp[i].data = zmq_msg_data(&parts[i]);
    bp[i].size = zmq_msg_size(&parts[i]);
  }
  if (overflow || beam_msg_parse(bp, n, &beam_limits_default, &m, &why) != 0) {
    st->c.malformed++;
    return;
  }
  uint64_t sid = m.hdr.series_id;
  rfile_t **f = find_open(st, sid);
  switch (m.hdr.type) {
  case BEAM_MSG_SERIES_START:
    if (f) {
      st->c.dup_starts++; /* replay resumption re-sends the start */
      if (rfile_set_meta(&st->ctx, *f, &m.hdr, m.meta, m.meta_len) < 0)
        fatal(st);
      return;
    }
    if (already_recorded(st, sid))
      return;
    if (open_series(st, sid, &m))
      st->c.series_started++;
    return;
  case BEAM_MSG_SERIES_END:
    if (!f)
      return;
    remember_closed(st, sid);
    /* at least 1 when the flag came without a readable count */
    uint64_t lost;
    if (m.hdr.flags & BEAM_FLAG_INCOMPLETE)
      (*f)->missing_frames = beam_msg_missing_frames(&m, &lost) && lost > 0 ? lost : 1;
    if (m.hdr.flags & BEAM_FLAG_ABORTED) {
      st->c.series_aborted++;
      close_file(st, f, 0, "SERIES_END with the ABORTED flag");
    } else {
      st->c.series_complete++;
      close_file(st, f, 1, NULL);
    }
    return;
  case BEAM_MSG_RESULT:
    break;
  default:
    return; /* FRAME and others are not results */
  }
  st->c.results++;
  const void *data = NULL;
  if (m.hdr.nparts > 0) {
    if (grow(st, (size_t)m.hdr.raw_size) < 0 || beam_msg_payload(&m, st->buf, st->scratch, &why) != 0) {
      st->c.malformed++;
      return;
    }
    data = st->buf;
  }
  if (m.topic_len == 11 && !memcmp(m.topic, "beamd.stats", 11)) {
    on_stats(st, &m, data);
    return;
  }
  if (!f) {
    if (closed_before(st, sid) || already_recorded(st, sid)) {
      st->c.duplicates++;
      return;
    }
    if (!(f = open_series(st, sid, NULL)))
      return;
  }
  if (rfile_result(&st->ctx, *f, &m, data) < 0)
    fatal(st);
}

static int drain(state_t *st, void *sock) {
  zmq_msg_t parts[MAX_PARTS];
  while (!tool_stop && !st->failed) {
    size_t n;
    int more, overflow = 0;
    zmq_msg_init(&parts[0]);
    if (zmq_msg_recv(&parts[0], sock, ZMQ_DONTWAIT) < 0) {
      int e = errno;
      zmq_msg_close(&parts[0]);
      if (e == EAGAIN || e == EINTR)
        return 0;
      tool_log("error: receive: %s", zmq_strerror(e));
      return -1;
    }
    n = 1;
    more = zmq_msg_more(&parts[0]);
    while (more) {
      zmq_msg_t *p = &parts[n < MAX_PARTS ? n : MAX_PARTS - 1];
      if (n >= MAX_PARTS) {
        overflow = 1;
        zmq_msg_close(p);
      }
      zmq_msg_init(p);
      if (zmq_msg_recv(p, sock, 0) < 0) {
        if (errno == EINTR)
          continue;
        tool_log("error: receive: %s", zmq_strerror(errno));
        zmq_msg_close(p);
        for (size_t i = 0; i < (n < MAX_PARTS ? n : MAX_PARTS - 1); i++)
          zmq_msg_close(&parts[i]);
        return -1;
      }
      more = zmq_msg_more(p);
      if (n < MAX_PARTS)
        n++;
    }
    handle(st, parts, n, overflow);
    for (size_t i = 0; i < n; i++)
      zmq_msg_close(&parts[i]);
  }
  return 0;
}

static int done(const state_t *st, const rec_opts_t *o) {
  if (!o->count && !o->nseries)
    return 0;
  return (!o->count || st->c.written >= o->count) &&
         (!o->nseries || st->c.series_complete >= o->nseries);
}

static void print_stats(const state_t *st, double secs, int timed_out) {
  const rec_counts_t *c = &st->c;
  json_t *j = json_object();
#define PUT(k) json_object_set_new(j, #k, json_integer((json_int_t)c->k))
  PUT(messages); PUT(malformed); PUT(results); PUT(written); PUT(duplicates); PUT(late_topic); PUT(swmr_pauses);
  PUT(mismatched); PUT(late_join); PUT(series_started); PUT(series_complete);
  PUT(series_aborted); PUT(ignored_series); PUT(stats_docs); PUT(dup_starts); PUT(write_errors);
#undef PUT
  json_object_set_new(j, "seconds", json_real(secs));
  json_object_set_new(j, "timed_out", json_boolean(timed_out));
  json_dumpf(j, stdout, JSON_COMPACT);
  fputc('\n', stdout);
  fflush(stdout);
  json_decref(j);
}

int main(int argc, char **argv) {
  rec_opts_t o = {.dir = ".", .prefix = "", .swmr_after = 100, .swmr_delay = 2.0, .hwm = -1};
  tool_cli_init("beamd-record");
  tool_curve_init(&curve);
  int ex = tool_args_exit(parse_args(argc, argv, &o), usage);
  if (ex >= 0)
    return ex;
  /* After a failed H5Fclose (disk full) HDF5 1.10 keeps a half-closed file
   * id that its exit-time cleanup crashes on; the OS closes the fd anyway. */
  H5dont_atexit();
  beam_h5_quiet();
  if (o.compress == REC_COMP_BSLZ4 && H5Zfilter_avail(BEAM_H5_BSLZ4_FILTER) <= 0) {
    H5Eclear2(H5E_DEFAULT);
    tool_log("error: --compress bslz4 needs the HDF5 bitshuffle filter (id 32008), which this "
            "HDF5 cannot load: install hdf5-filter-plugin or set HDF5_PLUGIN_PATH");
    return 1;
  }
  if (check_dir(o.dir) < 0)
    return 1;
  if (o.xpcs_qmap) {
    /* Fail now, not at the end of the first series. */
    char file[4096];
    const char *colon = strrchr(o.xpcs_qmap, ':');
    int n = colon && colon[1] == '/' ? (int)(colon - o.xpcs_qmap) : (int)strlen(o.xpcs_qmap);
    snprintf(file, sizeof file, "%.*s", n, o.xpcs_qmap);
    if (access(file, R_OK) != 0) {
      tool_log("error: --xpcs-qmap %s: %s", file, strerror(errno));
      return 1;
    }
  }

  tool_catch_stop();

  static state_t st;
  st.ctx.o = &o;
  st.ctx.c = &st.c;
  int rc = 1, timed_out = 0;
  uint64_t t0 = beam_now_ns();
  void *zctx = zmq_ctx_new();
  zmq_pollitem_t items[REC_MAX_CONNECT];
  if (!zctx) {
    tool_log("error: cannot create a ZeroMQ context: %s", zmq_strerror(errno));
    goto out;
  }
  for (int i = 0; i < o.nconnect; i++) {
    void *s = st.socks[i] = zmq_socket(zctx, o.pull ? ZMQ_PULL : ZMQ_SUB);
    int zero = 0;
    if (!s) {
      tool_log("error: cannot create a socket: %s", zmq_strerror(errno));
      goto out;
    }
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (o.hwm >= 0)
      zmq_setsockopt(s, ZMQ_RCVHWM, &o.hwm, sizeof o.hwm);
    if (!o.pull)
      zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    if (tool_curve_socket(&curve, zctx, s, o.connect[i], 0) < 0)
      goto out;
    if (zmq_connect(s, o.connect[i]) < 0) {
      tool_log("error: cannot connect %s: %s", o.connect[i], zmq_strerror(errno));
      goto out;
    }
    items[i] = (zmq_pollitem_t){.socket = s, .events = ZMQ_POLLIN};
  }
  uint64_t deadline = o.timeout > 0 ? t0 + (uint64_t)(o.timeout * 1e9) : 0;
  rc = 0;
  while (!tool_stop && !st.failed && !done(&st, &o)) {
    uint64_t now = beam_now_ns();
    if (deadline && now >= deadline) {
      timed_out = 1;
      break;
    }
    long wait = TICK_MS;
    if (deadline && (deadline - now) / 1000000 < (uint64_t)wait)
      wait = (long)((deadline - now) / 1000000) + 1;
    int n = zmq_poll(items, o.nconnect, wait);
    if (n < 0 && errno != EINTR) {
      tool_log("error: poll: %s", zmq_strerror(errno));
      rc = 1;
      break;
    }
    for (int i = 0; i < o.nconnect && n > 0; i++)
      if ((items[i].revents & ZMQ_POLLIN) && drain(&st, st.socks[i]) < 0)
        rc = 1;
    now = beam_now_ns();
    for (int i = 0; i < REC_MAX_OPEN && !st.failed; i++)
      if (st.open[i] && rfile_tick(&st.ctx, st.open[i], now, 0) < 0)
        fatal(&st);
    if (st.stats_f)
      fflush(st.stats_f);
    if (rc)
      break;
  }
  if (st.failed)
    rc = 1;
  else if (rc == 0 && timed_out && (o.count || o.nseries) && !done(&st, &o))
    rc = 3;

out:
  /* Whatever is still open ends here: flushed, closed, left as .partial. */
  for (int i = 0; i < REC_MAX_OPEN; i++)
    if (st.open[i]) {
      const char *why = st.failed ? "write error" : tool_stop ? "recorder stopped by a signal"
                                                           : "recorder exited before SERIES_END";
      if (rfile_close(&st.ctx, &st.open[i], 0, why) < 0) {
        tool_log("error: %s", st.ctx.err);
        rc = 1;
      }
    }
  if (st.stats_f)
    fclose(st.stats_f);
  if (o.stats_json)
    print_stats(&st, (beam_now_ns() - t0) / 1e9, timed_out);
  for (int i = 0; i < o.nconnect; i++)
    if (st.socks[i])
      zmq_close(st.socks[i]);
  tool_curve_fini(&curve);
  if (zctx)
    while (zmq_ctx_term(zctx) < 0 && errno == EINTR)
      ;
  free(st.buf);
  free(st.scratch);
  return rc;
}
