/* beamd-view: live web viewer of beamd result streams.
 *
 * Subscribes to one or more result streams (--sub), polls the control
 * endpoint (--control), and serves a single-page application plus a
 * WebSocket feed of the newest result per topic to browsers (view.h has
 * the design, docs/viewer.md the usage and the message format).
 * Exit codes: 0 after SIGINT/SIGTERM, 1 runtime error, 2 bad command line. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/beamd-view/view.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/curve_opt.h"

#define DEFAULT_SUB "tcp://127.0.0.1:5600"
#define DEFAULT_CONTROL "tcp://127.0.0.1:5601"
#define DEFAULT_PORT 8600

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-view [options]\n"
"Serves a live web view of beamd results on http://BIND:PORT/.\n"
"  --sub ENDPOINT      result stream to subscribe to (repeatable;\n"
"                      default " DEFAULT_SUB ")\n"
"  --control ENDPOINT  beamd control endpoint polled for the pipeline status\n"
"                      (default " DEFAULT_CONTROL "; 'none' to disable)\n"
"  --bind ADDR         address to serve on (default 127.0.0.1; any other\n"
"                      address needs a token)\n"
"  --port N            TCP port (default %d)\n"
"  --token TOKEN       access token (8..128 of [A-Za-z0-9._~-]); also read\n"
"                      from $BEAMD_VIEW_TOKEN, which keeps it off the process list\n"
"  --max-rate HZ       results per second per topic per browser (default 20)\n"
"  --max-side N        images are downsampled to at most N pixels a side\n"
"                      (default 1024)\n"
"  --downsample mean|max  how blocks are reduced (default mean)\n"
"  --status-period S   seconds between control polls (default 1)\n"
"  --hwm N             ZMQ_RCVHWM of the subscriptions (default 100)\n"
"  --assets DIR        the page's files (default: installed share/beamd-view/www,\n"
"                      else the source tree's tools/beamd-view/www)\n"
"  --verbose           log connections and every refused request\n"
TOOL_CURVE_USAGE
"  --help              this text\n"
"  --version           print the version (beamd's) and exit\n", DEFAULT_PORT);
}

enum {
  OPT_SUB = 256, OPT_CONTROL, OPT_BIND, OPT_PORT, OPT_TOKEN, OPT_MAX_RATE, OPT_MAX_SIDE,
  OPT_DOWNSAMPLE, OPT_STATUS_PERIOD, OPT_HWM, OPT_ASSETS, OPT_VERBOSE, OPT_HELP,
};

static const struct option long_opts[] = {
  {"sub", required_argument, 0, OPT_SUB},
  {"control", required_argument, 0, OPT_CONTROL},
  {"bind", required_argument, 0, OPT_BIND},
  {"port", required_argument, 0, OPT_PORT},
  {"token", required_argument, 0, OPT_TOKEN},
  {"max-rate", required_argument, 0, OPT_MAX_RATE},
  {"max-side", required_argument, 0, OPT_MAX_SIDE},
  {"downsample", required_argument, 0, OPT_DOWNSAMPLE},
  {"status-period", required_argument, 0, OPT_STATUS_PERIOD},
  {"hwm", required_argument, 0, OPT_HWM},
  {"assets", required_argument, 0, OPT_ASSETS},
  {"verbose", no_argument, 0, OPT_VERBOSE},
  TOOL_CURVE_LONGOPTS,
  {"help", no_argument, 0, OPT_HELP},
  TOOL_VERSION_LONGOPT,
  {0, 0, 0, 0},
};

static int token_valid(const char *t) {
  size_t n = strlen(t);
  if (n < 8 || n > 128)
    return 0;
  return strspn(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-") == n;
}

static int is_loopback(const char *a) {
  return !strncmp(a, "127.", 4) || !strcmp(a, "::1") || !strcmp(a, "localhost");
}

static tool_curve_t curve;

static int parse_args(int argc, char **argv, view_opts_t *o) {
  int c;
  uint64_t u;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    switch (c) {
    case OPT_SUB:
      if (o->nsub == VIEW_MAX_SUB)
        return tool_bad("sub", optarg, "too many endpoints (max 16)");
      o->sub[o->nsub++] = optarg;
      break;
    case OPT_CONTROL: o->control = strcmp(optarg, "none") ? optarg : NULL; break;
    case OPT_BIND:
      if (!*optarg)
        return tool_bad("bind", optarg, "an address is needed");
      o->bind = optarg;
      break;
    case OPT_PORT:
      if (tool_parse_u64("port", optarg, 1, 65535, &u)) return -1;
      o->port = (int)u;
      break;
    case OPT_TOKEN:
      if (!token_valid(optarg))
        return tool_bad("token", "...", "8..128 characters of [A-Za-z0-9._~-]");
      o->token = optarg;
      break;
    case OPT_MAX_RATE:
      if (tool_parse_double("max-rate", optarg, 0.1, 1000, NULL, &o->max_rate)) return -1;
      break;
    case OPT_MAX_SIDE:
      if (tool_parse_u64("max-side", optarg, 16, 16384, &u)) return -1;
      o->max_side = (unsigned)u;
      break;
    case OPT_DOWNSAMPLE:
      if (!strcmp(optarg, "mean")) o->ds_max = 0;
      else if (!strcmp(optarg, "max")) o->ds_max = 1;
      else return tool_bad("downsample", optarg, "mean or max");
      break;
    case OPT_STATUS_PERIOD:
      if (tool_parse_double("status-period", optarg, 0.05, 3600, NULL, &o->ctl_period)) return -1;
      break;
    case OPT_HWM:
      if (tool_parse_u64_max("hwm", optarg, INT32_MAX, &u)) return -1;
      o->hwm = (int)u;
      break;
    case OPT_ASSETS: o->assets = optarg; break;
    case OPT_VERBOSE: o->verbose = 1; break;
    case OPT_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    default:
      if (tool_curve_opt(&curve, c, optarg))
        break;
      return tool_bad_option(argv, 1);
    }
  }
  if (tool_no_operands(argc, argv))
    return -1;
  if (!o->token) {
    const char *e = getenv("BEAMD_VIEW_TOKEN");
    if (e && *e) {
      if (!token_valid(e))
        return tool_bad("token", "$BEAMD_VIEW_TOKEN", "8..128 characters of [A-Za-z0-9._~-]");
      o->token = e;
    }
  }
  if (!is_loopback(o->bind) && !o->token) {
    tool_log("--bind %s serves beyond this host: give --token (or $BEAMD_VIEW_TOKEN)", o->bind);
    return -1;
  }
  if (o->nsub == 0)
    o->sub[o->nsub++] = DEFAULT_SUB;
  return 0;
}

static int has_index(const char *dir) {
  char p[PATH_MAX * 2 + 16];
  int n = snprintf(p, sizeof p, "%s/index.html", dir);
  return n > 0 && (size_t)n < sizeof p && access(p, R_OK) == 0;
}

/* --assets, $BEAMD_VIEW_ASSETS, then next to the binary: the installed
 * PREFIX/share/beamd-view/www, else the source tree a build directory sits
 * in (build/ or build/<name>/). */
static int find_assets(view_opts_t *o, char *out, size_t cap) {
  const char *given = o->assets ? o->assets : getenv("BEAMD_VIEW_ASSETS");
  if (given && *given) {
    if (!realpath(given, out) || !has_index(out)) {
      tool_log("--assets %s: no readable index.html there", given);
      return -1;
    }
    o->assets = out;
    return 0;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
      *slash = 0;
    static const char *rel[] = {"../share/beamd-view/www", "../tools/beamd-view/www",
                                "../../tools/beamd-view/www", "../../../tools/beamd-view/www"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
      char p[PATH_MAX * 2];
      snprintf(p, sizeof p, "%s/%s", exe, rel[i]);
      if (has_index(p) && realpath(p, out)) {
        o->assets = out;
        return 0;
      }
    }
  }
  tool_log("cannot find the page's files (index.html): give --assets DIR");
  return -1;
}

static uv_signal_t sig_int, sig_term;

static void on_signal(uv_signal_t *h, int signum) {
  view_t *v = h->data;
  if (v->stopping)
    return;
  tool_log("signal %d: stopping", signum);
  v->stopping = 1;
  view_ws_close(v);
  view_store_close(v);
  view_ctl_close(v);
  uv_signal_stop(&sig_int);
  uv_signal_stop(&sig_term);
  uv_close((uv_handle_t *)&sig_int, NULL);
  uv_close((uv_handle_t *)&sig_term, NULL);
}

int main(int argc, char **argv) {
  view_opts_t o = {.bind = "127.0.0.1", .port = DEFAULT_PORT, .control = DEFAULT_CONTROL,
                   .max_rate = 20, .max_side = 1024, .ctl_period = 1.0, .hwm = 100};
  tool_cli_init("beamd-view");
  tool_curve_init(&curve);
  int ex = tool_args_exit(parse_args(argc, argv, &o), usage);
  if (ex >= 0)
    return ex;
  char assets[PATH_MAX];
  if (find_assets(&o, assets, sizeof assets) < 0)
    return 2;
  signal(SIGPIPE, SIG_IGN);
  /* Every result allocates display buffers of up to a few MiB. glibc would
   * map and unmap each one, and the page faults of touching fresh pages
   * were most of the viewer's CPU (perf); kept on the heap they are reused. */
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);

  view_t v;
  memset(&v, 0, sizeof v);
  v.o = &o;
  v.curve = &curve;
  v.started_ns = beam_now_ns();
  uv_loop_t loop;
  uv_loop_init(&loop);
  v.loop = &loop;
  int rc = 1;
  char err[512] = "";
  v.zctx = zmq_ctx_new();
  if (!v.zctx) {
    tool_log("cannot create a ZeroMQ context: %s", zmq_strerror(errno));
    return 1;
  }
  uv_signal_init(&loop, &sig_int);
  uv_signal_init(&loop, &sig_term);
  sig_int.data = sig_term.data = &v;
  uv_signal_start(&sig_int, on_signal, SIGINT);
  uv_signal_start(&sig_term, on_signal, SIGTERM);
  if (view_ws_open(&v, err, sizeof err) < 0 || view_store_open(&v, err, sizeof err) < 0 ||
      view_ctl_open(&v, err, sizeof err) < 0) {
    tool_log("%s", err);
    v.stopping = 1;
    view_ws_close(&v);
    view_store_close(&v);
    view_ctl_close(&v);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&sig_term, NULL);
  } else {
    char subs[1024] = "";
    for (int i = 0; i < o.nsub; i++)
      snprintf(subs + strlen(subs), sizeof subs - strlen(subs), "%s%s", i ? ", " : "", o.sub[i]);
    tool_log("serving http://%s:%d/ (files %s); results from %s; status from %s%s", o.bind, o.port,
             o.assets, subs, o.control ? o.control : "(none)", o.token ? "; token required" : "");
    rc = 0;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  /* Whatever lws still held is released by a second destroy and turn. */
  view_ws_free(&v);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0)
    tool_log("note: the event loop still had open handles at exit");
  view_store_free(&v);
  view_ctl_free(&v);
  tool_curve_fini(&curve);
  while (zmq_ctx_term(v.zctx) < 0 && errno == EINTR)
    ;
  return rc;
}
