/* beamd-sub: subscribes to beamd result streams and prints, saves or counts.
 *
 * One SUB or PULL socket per --connect endpoint (so sequence gaps are
 * tracked per sender), polled together. Every message is parsed with
 * beam_msg_parse and its payload decoded with beam_msg_payload; messages
 * that fail are counted and reported, never fatal. Output formats are in
 * report.c, file output in daemon/npy_write.c and h5out.c, usage in docs/tools.md.
 * Exit codes: 0 done (--count/--ends reached, or the timeout or a signal
 * ended a run without them), 1 runtime error, 2 bad command line, 3 the
 * timeout or a signal came before --count/--ends was reached.
 */
#include "tools/common/curve_opt.h"
#include "tools/beamd-sub/sub.h"
#include "daemon/npy_write.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/sig.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zmq.h>

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:5600"
#define SUB_MAX_PARTS (2 + BEAM_MAX_PAYLOAD_PARTS + 1) /* topic, header, payload, meta */
#define SUB_STARTED_RING 64 /* series starts remembered per connection */
#define SUB_MAX_FILE_ERRORS 10 /* file errors printed before going quiet */

typedef struct conn_s {
  void *sock;
  const char *endpoint;
  int have_seq;
  uint64_t last_seq;
  uint64_t started[SUB_STARTED_RING];
  unsigned nstarted;
} conn_t;

typedef struct sub_state_s {
  const sub_opts_t *o;
  conn_t conn[SUB_MAX_CONNECT];
  uint8_t *buf, *scratch; /* decoded payload, bitshuffle scratch; grow only */
  size_t cap;
  json_t *by_type, *by_topic;
  uint64_t messages, malformed, orphans, filtered, gaps, seq_resets;
  uint64_t reported; /* counted toward --count */
  uint64_t ends;
  uint64_t file_errors;
  sub_h5_t *h5;
} sub_state_t;

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-sub [options]\n"
"Subscribes to beamd streams and prints, saves or counts the messages.\n"
"  --connect ENDPOINT  connect here (repeatable; default " DEFAULT_ENDPOINT ")\n"
"  --socket sub|pull   socket type (default sub)\n"
"  --topic PREFIX      topic prefix to receive (repeatable; default all)\n"
"  --count N           exit after N data messages (RESULT; FRAME with --all-types)\n"
"  --ends N            exit after N SERIES_END messages\n"
"  --timeout S         exit after S seconds (rc 3 if --count/--ends not reached)\n"
"  --hwm N             ZMQ_RCVHWM (default: ZeroMQ's 1000; 0 = unlimited)\n"
"  --print             one line per message\n"
"  --json              one JSON object per message (values up to 4096 elements)\n"
"  --all-types         also report and count FRAME messages\n"
"  --save DIR          write each RESULT (and FRAME with --all-types) as\n"
"                      DIR/<topic or type>/<series>_<frame>.npy\n"
"  --save-h5 FILE      append arrays to FILE, one dataset per topic\n"
"  --stats             print a JSON summary line at exit\n"
TOOL_CURVE_USAGE
"  --help              this text\n"
"  --version           print the version (beamd's) and exit\n");
}

enum {
  OPT_CONNECT = 256, OPT_SOCKET, OPT_TOPIC, OPT_COUNT, OPT_ENDS, OPT_TIMEOUT,
  OPT_HWM, OPT_PRINT, OPT_JSON, OPT_ALL, OPT_SAVE, OPT_SAVE_H5, OPT_STATS, OPT_HELP,
};

static const struct option long_opts[] = {
  {"connect", required_argument, 0, OPT_CONNECT},
  {"socket", required_argument, 0, OPT_SOCKET},
  {"topic", required_argument, 0, OPT_TOPIC},
  {"count", required_argument, 0, OPT_COUNT},
  {"ends", required_argument, 0, OPT_ENDS},
  {"timeout", required_argument, 0, OPT_TIMEOUT},
  {"hwm", required_argument, 0, OPT_HWM},
  {"print", no_argument, 0, OPT_PRINT},
  {"json", no_argument, 0, OPT_JSON},
  {"all-types", no_argument, 0, OPT_ALL},
  {"save", required_argument, 0, OPT_SAVE},
  {"save-h5", required_argument, 0, OPT_SAVE_H5},
  {"stats", no_argument, 0, OPT_STATS},
  TOOL_CURVE_LONGOPTS,
  {"help", no_argument, 0, OPT_HELP},
  TOOL_VERSION_LONGOPT,
  {0, 0, 0, 0},
};

static tool_curve_t curve;

static int parse_args(int argc, char **argv, sub_opts_t *o) {
  int c;
  uint64_t u;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    switch (c) {
    case OPT_CONNECT:
      if (o->nconnect == SUB_MAX_CONNECT)
        return tool_bad("connect", optarg, "too many endpoints (max 16)");
      o->connect[o->nconnect++] = optarg;
      break;
    case OPT_SOCKET:
      if (!strcmp(optarg, "sub")) o->sock_type = ZMQ_SUB;
      else if (!strcmp(optarg, "pull")) o->sock_type = ZMQ_PULL;
      else return tool_bad("socket", optarg, "sub or pull");
      break;
    case OPT_TOPIC:
      if (o->ntopics == SUB_MAX_TOPICS)
        return tool_bad("topic", optarg, "too many topics (max 32)");
      if (strlen(optarg) > BEAM_TOPIC_MAX)
        return tool_bad("topic", optarg, "longer than a topic can be");
      o->topics[o->ntopics++] = optarg;
      break;
    case OPT_COUNT:
      if (tool_parse_u64_max("count", optarg, UINT64_MAX, &o->count)) return -1;
      if (!o->count) return tool_bad("count", optarg, "must be at least 1");
      break;
    case OPT_ENDS:
      if (tool_parse_u64_max("ends", optarg, UINT64_MAX, &o->ends)) return -1;
      if (!o->ends) return tool_bad("ends", optarg, "must be at least 1");
      break;
    case OPT_TIMEOUT:
      /* > 0: the smallest positive double is the lowest value allowed. */
      if (tool_parse_double("timeout", optarg, DBL_TRUE_MIN, 1e7, "seconds, > 0", &o->timeout))
        return -1;
      break;
    case OPT_HWM:
      if (tool_parse_u64_max("hwm", optarg, INT32_MAX, &u)) return -1;
      o->hwm = (int)u;
      break;
    case OPT_PRINT: o->print = 1; break;
    case OPT_JSON: o->json = 1; break;
    case OPT_ALL: o->all_types = 1; break;
    case OPT_SAVE: o->save_dir = optarg; break;
    case OPT_SAVE_H5: o->save_h5 = optarg; break;
    case OPT_STATS: o->stats = 1; break;
    case OPT_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    default:
      if (tool_curve_opt(&curve, c, optarg))
        break;
      return tool_bad_option(argv, 0);
    }
  }
  if (tool_no_operands(argc, argv))
    return -1;
  if (o->print && o->json) {
    fprintf(stderr, "beamd-sub: --print and --json are exclusive\n");
    return -1;
  }
  if (o->nconnect == 0)
    o->connect[o->nconnect++] = DEFAULT_ENDPOINT;
  return 0;
}

static int topic_wanted(const sub_opts_t *o, const beam_msg_t *m) {
  if (o->ntopics == 0)
    return 1;
  for (int i = 0; i < o->ntopics; i++) {
    size_t n = strlen(o->topics[i]);
    if (n == 0 || (m->topic && m->topic_len >= n && !memcmp(m->topic, o->topics[i], n)))
      return 1;
  }
  return 0;
}

static void bump(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  if (v)
    json_integer_set(v, json_integer_value(v) + 1);
  else
    json_object_set_new(obj, key, json_integer(1));
}

static int series_started(const conn_t *c, uint64_t sid) {
  unsigned n = c->nstarted < SUB_STARTED_RING ? c->nstarted : SUB_STARTED_RING;
  for (unsigned i = 0; i < n; i++)
    if (c->started[i] == sid)
      return 1;
  return 0;
}

/* Gaps are counted only when every message of the sender reaches us: a
 * topic filter removes numbers on purpose. */
static void track_seq(sub_state_t *st, conn_t *c, uint64_t seq) {
  if (st->o->ntopics == 0 && c->have_seq) {
    if (seq > c->last_seq + 1)
      st->gaps += seq - c->last_seq - 1;
    else if (seq <= c->last_seq)
      st->seq_resets++; /* PROTOCOL.md section 6: the sender restarted */
  }
  c->have_seq = 1;
  c->last_seq = seq;
}

static int grow(sub_state_t *st, size_t need) {
  if (need <= st->cap)
    return 0;
  uint8_t *b = realloc(st->buf, need), *s;
  if (!b)
    return -1;
  st->buf = b;
  s = realloc(st->scratch, need);
  if (!s)
    return -1;
  st->scratch = s;
  st->cap = need;
  return 0;
}

static void file_error(sub_state_t *st, const beam_diag_t *d) {
  if (++st->file_errors <= SUB_MAX_FILE_ERRORS)
    fprintf(stderr, "beamd-sub: %s\n", d->msg);
  if (st->file_errors == SUB_MAX_FILE_ERRORS)
    fprintf(stderr, "beamd-sub: further file errors are only counted\n");
}

static void save(sub_state_t *st, const beam_msg_t *m, const void *data) {
  char name[BEAM_TOPIC_MAX + 8];
  beam_diag_t d;
  sub_out_name(m, name, sizeof name);
  if (st->o->save_dir && m->hdr.ndim) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", st->o->save_dir, name);
    if (mkdir(path, 0777) < 0 && errno != EEXIST) {
      beam_diag_clear(&d);
      BEAM_DIAG(&d, BEAM_EIO, "%s: %s", path, strerror(errno));
      file_error(st, &d);
    } else {
      snprintf(path, sizeof path, "%s/%s/%llu_%llu.npy", st->o->save_dir, name,
               (unsigned long long)m->hdr.series_id, (unsigned long long)m->hdr.frame_id);
      beam_diag_clear(&d);
      if (beam_npy_write(path, (beam_dtype_t)m->hdr.dtype, m->hdr.ndim, m->hdr.shape, data,
                         (size_t)m->hdr.raw_size, &d) < 0)
        file_error(st, &d);
    }
  }
  if (st->h5) {
    beam_diag_clear(&d);
    if (sub_h5_append(st->h5, name, m, data, &d) < 0)
      file_error(st, &d);
  }
}

/* Handles one complete multipart message. */
static void handle(sub_state_t *st, conn_t *c, zmq_msg_t *parts, size_t n, int overflow) {
  const sub_opts_t *o = st->o;
  beam_part_t bp[SUB_MAX_PARTS];
  beam_msg_t m;
  const char *why = NULL;
  st->messages++;
  for (size_t i = 0; i < n; i++) {
    bp[i].data = zmq_msg_data(&parts[i]);
    bp[i].size = zmq_msg_size(&parts[i]);
  }
  if (overflow || beam_msg_parse(bp, n, &beam_limits_default, &m, &why) != 0) {
    st->malformed++;
    if (o->print || o->json)
      sub_report_malformed(overflow ? "more parts than any valid message has" : why, n, o->json);
    return;
  }
  if (!topic_wanted(o, &m)) {
    st->filtered++;
    return;
  }
  const void *data = NULL;
  if (m.hdr.nparts > 0) {
    if (grow(st, (size_t)m.hdr.raw_size) < 0) {
      fprintf(stderr, "beamd-sub: out of memory for a %llu-byte payload\n",
              (unsigned long long)m.hdr.raw_size);
      st->malformed++;
      return;
    }
    if (beam_msg_payload(&m, st->buf, st->scratch, &why) != 0) {
      st->malformed++;
      if (o->print || o->json)
        sub_report_malformed(why, n, o->json);
      return;
    }
    data = st->buf;
  }
  unsigned type = m.hdr.type;
  int orphan = type == BEAM_MSG_FRAME && !series_started(c, m.hdr.series_id);
  if (orphan)
    st->orphans++;
  track_seq(st, c, m.hdr.seq);
  if (type == BEAM_MSG_SERIES_START)
    c->started[c->nstarted++ % SUB_STARTED_RING] = m.hdr.series_id;
  bump(st->by_type, beam_msg_type_name(type));
  char topic[BEAM_TOPIC_MAX + 1];
  snprintf(topic, sizeof topic, "%.*s", (int)m.topic_len, m.topic ? m.topic : "");
  bump(st->by_topic, m.topic ? topic : "(none)");
  if (type == BEAM_MSG_SERIES_END)
    st->ends++;

  int is_data = type == BEAM_MSG_RESULT || (type == BEAM_MSG_FRAME && o->all_types);
  if (type == BEAM_MSG_FRAME && !o->all_types)
    return;
  sub_vstats_t vs;
  if (data)
    sub_vstats(data, (beam_dtype_t)m.hdr.dtype, beam_hdr_nelems(&m.hdr), &vs);
  if (o->print || o->json)
    sub_report(&m, data, data ? &vs : NULL, orphan, o->json);
  if (is_data && data && !sub_is_stats_doc(&m))
    save(st, &m, data);
  if (is_data && !orphan)
    st->reported++;
}

static int done(const sub_state_t *st) {
  const sub_opts_t *o = st->o;
  if (!o->count && !o->ends)
    return 0;
  return (!o->count || st->reported >= o->count) && (!o->ends || st->ends >= o->ends);
}

/* Receives everything queued on one socket. Returns 0 or -1 on a socket
 * error other than EAGAIN/EINTR. */
static int drain(sub_state_t *st, conn_t *c) {
  zmq_msg_t parts[SUB_MAX_PARTS];
  while (!done(st) && !tool_stop) {
    size_t n = 0;
    int more = 0, overflow = 0;
    zmq_msg_init(&parts[0]);
    if (zmq_msg_recv(&parts[0], c->sock, ZMQ_DONTWAIT) < 0) {
      int e = errno;
      zmq_msg_close(&parts[0]);
      if (e == EAGAIN || e == EINTR)
        return 0;
      fprintf(stderr, "beamd-sub: receive from %s: %s\n", c->endpoint, zmq_strerror(e));
      return -1;
    }
    n = 1;
    more = zmq_msg_more(&parts[0]);
    /* The rest of a multipart message is already here (all-or-nothing). */
    while (more) {
      zmq_msg_t *p = &parts[n < SUB_MAX_PARTS ? n : SUB_MAX_PARTS - 1];
      if (n >= SUB_MAX_PARTS) {
        overflow = 1;
        zmq_msg_close(p); /* keep the last slot for draining the excess */
      }
      zmq_msg_init(p);
      if (zmq_msg_recv(p, c->sock, 0) < 0) {
        if (errno == EINTR)
          continue;
        fprintf(stderr, "beamd-sub: receive from %s: %s\n", c->endpoint, zmq_strerror(errno));
        zmq_msg_close(p);
        for (size_t i = 0; i < (n < SUB_MAX_PARTS ? n : SUB_MAX_PARTS - 1); i++)
          zmq_msg_close(&parts[i]);
        return -1;
      }
      more = zmq_msg_more(p);
      if (n < SUB_MAX_PARTS)
        n++;
    }
    handle(st, c, parts, n, overflow);
    for (size_t i = 0; i < n; i++)
      zmq_msg_close(&parts[i]);
  }
  return 0;
}

static void print_summary(const sub_state_t *st, double secs, int timed_out) {
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string("SUMMARY"));
  json_object_set_new(o, "messages", json_integer((json_int_t)st->messages));
  json_object_set_new(o, "reported", json_integer((json_int_t)st->reported));
  json_object_set(o, "by_type", st->by_type);
  json_object_set(o, "by_topic", st->by_topic);
  json_object_set_new(o, "gaps", st->o->ntopics ? json_null() : json_integer((json_int_t)st->gaps));
  json_object_set_new(o, "seq_resets", json_integer((json_int_t)st->seq_resets));
  json_object_set_new(o, "malformed", json_integer((json_int_t)st->malformed));
  json_object_set_new(o, "orphans", json_integer((json_int_t)st->orphans));
  json_object_set_new(o, "filtered", json_integer((json_int_t)st->filtered));
  json_object_set_new(o, "file_errors", json_integer((json_int_t)st->file_errors));
  json_object_set_new(o, "seconds", json_real(secs));
  json_object_set_new(o, "timed_out", json_boolean(timed_out));
  json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(9));
  fputc('\n', stdout);
  fflush(stdout);
  json_decref(o);
}

static int open_sockets(sub_state_t *st, void *ctx) {
  const sub_opts_t *o = st->o;
  for (int i = 0; i < o->nconnect; i++) {
    conn_t *c = &st->conn[i];
    c->endpoint = o->connect[i];
    c->sock = zmq_socket(ctx, o->sock_type);
    if (!c->sock) {
      fprintf(stderr, "beamd-sub: cannot create socket: %s\n", zmq_strerror(errno));
      return -1;
    }
    int zero = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (o->hwm >= 0 && zmq_setsockopt(c->sock, ZMQ_RCVHWM, &o->hwm, sizeof o->hwm) < 0) {
      fprintf(stderr, "beamd-sub: ZMQ_RCVHWM %d: %s\n", o->hwm, zmq_strerror(errno));
      return -1;
    }
    if (o->sock_type == ZMQ_SUB) {
      if (o->ntopics == 0) {
        zmq_setsockopt(c->sock, ZMQ_SUBSCRIBE, "", 0);
      } else {
        for (int t = 0; t < o->ntopics; t++)
          zmq_setsockopt(c->sock, ZMQ_SUBSCRIBE, o->topics[t], strlen(o->topics[t]));
      }
    }
    if (tool_curve_socket(&curve, ctx, c->sock, c->endpoint, 0) < 0)
      return -1;
    if (zmq_connect(c->sock, c->endpoint) < 0) {
      fprintf(stderr, "beamd-sub: cannot connect %s: %s\n", c->endpoint, zmq_strerror(errno));
      return -1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  sub_opts_t o = {.sock_type = ZMQ_SUB, .hwm = -1};
  tool_cli_init("beamd-sub");
  tool_curve_init(&curve);
  int ex = tool_args_exit(parse_args(argc, argv, &o), usage);
  if (ex >= 0)
    return ex;
  tool_catch_stop();

  sub_state_t st;
  memset(&st, 0, sizeof st);
  st.o = &o;
  st.by_type = json_object();
  st.by_topic = json_object();
  int rc = 1, timed_out = 0;
  uint64_t t0 = beam_now_ns();
  void *ctx = zmq_ctx_new();
  if (!ctx) {
    fprintf(stderr, "beamd-sub: cannot create ZeroMQ context: %s\n", zmq_strerror(errno));
    goto out;
  }
  if (o.save_dir && mkdir(o.save_dir, 0777) < 0 && errno != EEXIST) {
    fprintf(stderr, "beamd-sub: %s: %s\n", o.save_dir, strerror(errno));
    goto out;
  }
  if (o.save_h5) {
    beam_diag_t d;
    beam_diag_clear(&d);
    if (sub_h5_open(&st.h5, o.save_h5, &d) < 0) {
      fprintf(stderr, "beamd-sub: %s\n", d.msg);
      goto out;
    }
  }
  if (open_sockets(&st, ctx) < 0)
    goto out;

  zmq_pollitem_t items[SUB_MAX_CONNECT];
  for (int i = 0; i < o.nconnect; i++)
    items[i] = (zmq_pollitem_t){.socket = st.conn[i].sock, .events = ZMQ_POLLIN};
  uint64_t deadline = o.timeout > 0 ? t0 + (uint64_t)(o.timeout * 1e9) : 0;
  rc = 0;
  while (!done(&st) && !tool_stop) {
    long wait_ms = -1;
    if (deadline) {
      uint64_t now = beam_now_ns();
      if (now >= deadline) {
        timed_out = 1;
        break;
      }
      wait_ms = (long)((deadline - now + 999999) / 1000000);
    }
    int n = zmq_poll(items, o.nconnect, wait_ms);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      fprintf(stderr, "beamd-sub: poll: %s\n", zmq_strerror(errno));
      rc = 1;
      break;
    }
    for (int i = 0; i < o.nconnect && n > 0; i++)
      if ((items[i].revents & ZMQ_POLLIN) && drain(&st, &st.conn[i]) < 0)
        rc = 1;
    if (rc)
      break;
  }
  if (rc == 0 && (o.count || o.ends) && !done(&st))
    rc = 3;
  if (o.stats)
    print_summary(&st, (beam_now_ns() - t0) / 1e9, timed_out);

out:
  for (int i = 0; i < o.nconnect; i++)
    if (st.conn[i].sock)
      zmq_close(st.conn[i].sock);
  tool_curve_fini(&curve);
  if (ctx)
    while (zmq_ctx_term(ctx) < 0 && errno == EINTR)
      ;
  sub_h5_close(&st.h5);
  json_decref(st.by_type);
  json_decref(st.by_topic);
  free(st.buf);
  free(st.scratch);
  return rc;
}
