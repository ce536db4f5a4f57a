/* beamd-sim: a synthetic detector that streams frames to beamd.
 *
 * Parses the command line, opens one PUB or PUSH socket and runs the send
 * loop: SERIES_START, FRAMEs paced on absolute deadlines, SERIES_END, for
 * each series, with optional malformed messages spread over the run. The
 * pixel patterns live in bank.c (xpcs speckle in xpcs.c, the pca pattern
 * in pca.c, pumpprobe in pumpprobe.c) and the wire
 * encoding in tx.c; --protocol dectris1|dectris2 hands the run to the
 * DECTRIS stream emitters in dectris.c instead, and --write-h5 to the
 * file writers (ptycho_h5.c, pumpprobe_h5.c). Usage is in
 * docs/tools.md and --help. Exit codes: 0 done, 1 runtime error (bind,
 * send), 2 bad command line.
 */
#include "tools/beamd-sim/sim.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "tools/common/curve_opt.h"

#define DEFAULT_ENDPOINT "tcp://127.0.0.1:5500"
#define PUB_LINGER_MS 2000  /* PUB: give queued frames time to leave */
#define PUSH_LINGER_MS 10000 /* PUSH: lossless, but never hang forever on a dead peer */
#define FOREVER_MALFORMED_EVERY 100u

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-sim [options]\n"
"Synthetic detector: sends SERIES_START / FRAME / SERIES_END (beamd wire v1),\n"
"or a DECTRIS SIMPLON stream v1/v2 (--protocol).\n"
"  --bind ENDPOINT        bind here (default " DEFAULT_ENDPOINT ")\n"
"  --connect ENDPOINT     connect instead of binding\n"
"  --socket pub|push      socket type (default pub)\n"
"  --shape HxW            frame shape (default 512x512)\n"
"  --dtype T              uint8|uint16|uint32|float32 (default uint16)\n"
"  --rate HZ              frames per second, 0 = as fast as possible (default 0)\n"
"  --frames N             frames per series, 0 = one series forever (default 1000)\n"
"  --series K             number of series (default 1)\n"
"  --series-id ID         first series id (default 1)\n"
"  --codec C              raw|lz4|bslz4 (default raw)\n"
"  --pattern P            poisson|flat|counter|stem|xpcs|pca|ptycho|pumpprobe\n"
"                         (default poisson)\n"
"  --mean M               poisson/stem background mean, flat value, xpcs mean\n"
"                         counts per pixel and frame, pca mean level\n"
"                         (default 2.0; pca 100)\n"
"  --seed S               random seed (default 1)\n"
"  --wait-subscribers S   PUB: seconds to wait after bind/connect (default 0.5)\n"
"  --hwm N                ZMQ_SNDHWM (default: ZeroMQ's 1000)\n"
"  --malformed N          inject N malformed messages spread over the run\n"
"  --frame-time S         metadata frame_time (default 1/rate, or 0.001)\n"
"  --xpcs-rings N         xpcs: equal-width q rings (default 8)\n"
"  --xpcs-rate-min G      xpcs: rate of the innermost ring, 1/s (default 1)\n"
"  --xpcs-rate-max G      xpcs: rate of the outermost ring, 1/s (default 100)\n"
"  --xpcs-modes M         xpcs: coherent modes per pixel, beta = 1/M (default 1)\n"
"  --label-file PATH      xpcs: write the ring labels (uint16 .npy) at start-up\n"
"  --pca-strengths S,...  pca: std of each component's coefficient along its\n"
"                         unit-norm basis image; k = the count (1..32)\n"
"                         (default: 8,4,2 times sqrt(H*W))\n"
"  --pca-noise N          pca: poisson or gaussian:SIGMA (default poisson)\n"
"  --pca-spikes F         pca: fraction of pixels per frame with a hot spike\n"
"                         of 50 x mean (default 0)\n"
"  --pca-outliers N       pca: frames with a bright blob, ids in the metadata\n"
"  --pca-drift-at F       pca: from frame F on, the rotated basis\n"
"  --pca-drift-angle DEG  pca: principal angle of that rotation (default 90)\n"
"  --pca-basis-file PATH  pca: write the basis (float32 .npy) at start-up\n"
"  pumpprobe (docs/tools.md; --frames = delays, --mean = background counts):\n"
"  --pp-t0 PS             time zero (default 0.5)\n"
"  --pp-delay-min/--pp-delay-max PS   delay range, one per frame (default -1, 9)\n"
"  --pp-f-min/--pp-f-max F            frequency map along x, 1/ps (default 0.3, 0.6)\n"
"  --pp-tau-min/--pp-tau-max PS       damping map along y (default 2, 6)\n"
"  --pp-amplitude A       amplitude / mean at the centre (default 0.5)\n"
"  --pp-truth FILE        write the truth maps, float32 .npy [5][H][W]: a b tau f c\n"
"  --write-h5 FILE        write the series as HDF5 instead of sending it: frames,\n"
"                         /entry/data/delay (ps), truth /entry/truth/params\n"
"  ptycho (docs/ptycho.md; --frames = scan points, --shape defaults to n x n):\n"
"  --ptycho-n N           diffraction pattern side, even (default min(H,W) or 64)\n"
"  --energy EV            photon energy (default 8000)\n"
"  --distance M           sample-detector distance (default 2.0)\n"
"  --pixel-size M         detector pixel (default 75e-6)\n"
"  --photons N            photons per frame through |O| = 1 (default 1e6)\n"
"  --noise none|poisson   shot noise (default none)\n"
"  --scan fermat|raster   Fermat spiral r = STEP sqrt(k), or jittered raster\n"
"  --scan-step M          spiral constant / raster step (default 0.25e-6)\n"
"  --scan-jitter F        raster jitter, fraction of the step (default 0.1)\n"
"  --probe-modes M        incoherent probe modes (fly-scan blur; default 1)\n"
"  --zp-diameter M        zone plate diameter (default 100e-6)\n"
"  --zp-outer-zone M      outer zone width (default 130e-9)\n"
"  --zp-stop M            central stop diameter (default 40e-6)\n"
"  --defocus M            sample distance from the focus (default 1.1e-3)\n"
"  --ptycho-object F[:/D] object from HDF5 (complex or real 2-D; centre used)\n"
"  --write-h5 FILE        write the scan as an NXmx file with the truth, no socket\n"
"                         (also pumpprobe, above)\n"
"  DECTRIS streams (docs/tools.md; a bound PUSH, one series per --series):\n"
"  --protocol P           beamd|dectris1|dectris2 (default beamd); dectris1\n"
"                         binds tcp://127.0.0.1:9999, dectris2 :31001 by default\n"
"  --header-detail D      none|basic|all (default basic)\n"
"  --encoding E           raw|lz4|bslz4|bszstd (default bslz4; bszstd v2 only)\n"
"  --header-appendix TEXT v1: extra header part; v2: start user_data\n"
"  --image-appendix TEXT  v1: extra image part; v2: image user_data\n"
"  --channels N           v2: 1 or 2 (threshold_1, threshold_2; default 1)\n"
"  --jfj                  v2: Jungfraujoch flavour (extra start keys, calibration)\n"
"  --fault LIST           comma-separated faults, each once per series: v1\n"
"                         nonjson,truncated,image-before-header,stale,gap,size,\n"
"                         encoding,dtype,hash; v2 nosig,typenotfirst,nesting,\n"
"                         dims,short,algorithm,gap,stale\n"
"  --meta KEY=VALUE       extra series metadata (repeatable; numbers and JSON\n"
"                         arrays/objects are parsed, anything else is a string)\n"
"  --quiet                no progress messages on stderr\n"
"  --stats-json           print one JSON line of totals on stdout at exit\n"
TOOL_CURVE_USAGE
"  --help                 this text\n"
"  --version              print the version (beamd's) and exit\n");
}

static int parse_shape(const char *s, sim_opts_t *o) {
  char *end;
  errno = 0;
  unsigned long h = strtoul(s, &end, 10);
  if (errno || end == s || (*end != 'x' && *end != 'X'))
    return tool_bad("shape", s, "expected HxW, e.g. 512x512");
  const char *ws = end + 1;
  unsigned long w = strtoul(ws, &end, 10);
  if (errno || end == ws || *end || *s == '-' || *ws == '-')
    return tool_bad("shape", s, "expected HxW, e.g. 512x512");
  if (h < 1 || w < 1 || h > beam_limits_default.max_dim || w > beam_limits_default.max_dim)
    return tool_bad("shape", s, "each axis must be 1..max_dim of the protocol limits");
  o->h = (uint32_t)h;
  o->w = (uint32_t)w;
  return 0;
}

static int parse_meta(const char *s, sim_opts_t *o) {
  const char *eq = strchr(s, '=');
  if (!eq || eq == s)
    return tool_bad("meta", s, "expected KEY=VALUE");
  char key[256];
  size_t kl = (size_t)(eq - s);
  if (kl >= sizeof key)
    return tool_bad("meta", s, "key too long");
  memcpy(key, s, kl);
  key[kl] = '\0';
  const char *val = eq + 1;
  json_t *v = json_loads(val, JSON_DECODE_ANY, NULL);
  if (v && !json_is_number(v) && !json_is_array(v) && !json_is_object(v)) {
    json_decref(v);
    v = NULL;
  }
  if (!v)
    v = json_string(val);
  if (!v)
    return tool_bad("meta", s, "value is not valid UTF-8");
  if (!o->meta)
    o->meta = json_object();
  json_object_set_new(o->meta, key, v);
  return 0;
}

enum {
  OPT_BIND = 256, OPT_CONNECT, OPT_SOCKET, OPT_SHAPE, OPT_DTYPE, OPT_RATE,
  OPT_FRAMES, OPT_SERIES, OPT_SERIES_ID, OPT_CODEC, OPT_PATTERN, OPT_MEAN,
  OPT_SEED, OPT_WAIT, OPT_HWM, OPT_MALFORMED, OPT_FRAME_TIME, OPT_META,
  OPT_QUIET, OPT_STATS, OPT_HELP, OPT_XRINGS, OPT_XRMIN, OPT_XRMAX, OPT_XMODES,
  OPT_LABEL_FILE, OPT_PSTR, OPT_PNOISE, OPT_PSPIKES, OPT_POUT, OPT_PDRIFT, OPT_PANGLE,
  OPT_PBASIS, OPT_PPT0, OPT_PPDMIN, OPT_PPDMAX, OPT_PPFMIN, OPT_PPFMAX, OPT_PPTMIN, OPT_PPTMAX,
  OPT_PPAMP, OPT_PPTRUTH,
};

static const struct option long_opts[] = {
  {"bind", required_argument, 0, OPT_BIND},
  {"connect", required_argument, 0, OPT_CONNECT},
  {"socket", required_argument, 0, OPT_SOCKET},
  {"shape", required_argument, 0, OPT_SHAPE},
  {"dtype", required_argument, 0, OPT_DTYPE},
  {"rate", required_argument, 0, OPT_RATE},
  {"frames", required_argument, 0, OPT_FRAMES},
  {"series", required_argument, 0, OPT_SERIES},
  {"series-id", required_argument, 0, OPT_SERIES_ID},
  {"codec", required_argument, 0, OPT_CODEC},
  {"pattern", required_argument, 0, OPT_PATTERN},
  {"mean", required_argument, 0, OPT_MEAN},
  {"seed", required_argument, 0, OPT_SEED},
  {"wait-subscribers", required_argument, 0, OPT_WAIT},
  {"hwm", required_argument, 0, OPT_HWM},
  {"malformed", required_argument, 0, OPT_MALFORMED},
  {"frame-time", required_argument, 0, OPT_FRAME_TIME},
  {"meta", required_argument, 0, OPT_META},
  {"quiet", no_argument, 0, OPT_QUIET},
  {"stats-json", no_argument, 0, OPT_STATS},
  TOOL_CURVE_LONGOPTS,
  {"help", no_argument, 0, OPT_HELP},
  TOOL_VERSION_LONGOPT,
  {"xpcs-rings", required_argument, 0, OPT_XRINGS},
  {"xpcs-rate-min", required_argument, 0, OPT_XRMIN},
  {"xpcs-rate-max", required_argument, 0, OPT_XRMAX},
  {"xpcs-modes", required_argument, 0, OPT_XMODES},
  {"label-file", required_argument, 0, OPT_LABEL_FILE},
  {"pca-strengths", required_argument, 0, OPT_PSTR},
  {"pca-noise", required_argument, 0, OPT_PNOISE},
  {"pca-spikes", required_argument, 0, OPT_PSPIKES},
  {"pca-outliers", required_argument, 0, OPT_POUT},
  {"pca-drift-at", required_argument, 0, OPT_PDRIFT},
  {"pca-drift-angle", required_argument, 0, OPT_PANGLE},
  {"pca-basis-file", required_argument, 0, OPT_PBASIS},
  {"pp-t0", required_argument, 0, OPT_PPT0},
  {"pp-delay-min", required_argument, 0, OPT_PPDMIN},
  {"pp-delay-max", required_argument, 0, OPT_PPDMAX},
  {"pp-f-min", required_argument, 0, OPT_PPFMIN},
  {"pp-f-max", required_argument, 0, OPT_PPFMAX},
  {"pp-tau-min", required_argument, 0, OPT_PPTMIN},
  {"pp-tau-max", required_argument, 0, OPT_PPTMAX},
  {"pp-amplitude", required_argument, 0, OPT_PPAMP},
  {"pp-truth", required_argument, 0, OPT_PPTRUTH},
  SIM_PTYCHO_LONG_OPTS
  SIM_DECTRIS_LONG_OPTS
  {0, 0, 0, 0},
};

/* "s1,s2,..." into o->pca_strengths, k = the count. */
static int parse_strengths(const char *s, sim_opts_t *o) {
  uint32_t k = 0;
  const char *p = s;
  for (;;) {
    char *end;
    errno = 0;
    double v = strtod(p, &end);
    if (end == p || errno || !(v >= 0.0 && v <= 1e12) || (*end && *end != ','))
      return tool_bad("pca-strengths", s, "expected comma-separated numbers in 0..1e12");
    if (k == SIM_PCA_MAX_K)
      return tool_bad("pca-strengths", s, "at most 32 components");
    o->pca_strengths[k++] = v;
    if (!*end)
      break;
    p = end + 1;
  }
  o->pca_k = k;
  o->pca_strengths_set = 1;
  return 0;
}

static int parse_pca_noise(const char *s, sim_opts_t *o) {
  if (!strcmp(s, "poisson")) {
    o->pca_sigma = -1.0;
    return 0;
  }
  if (strncmp(s, "gaussian:", 9))
    return tool_bad("pca-noise", s, "poisson or gaussian:SIGMA");
  return tool_parse_double("pca-noise", s + 9, 0, 1e9, "gaussian:SIGMA with SIGMA in 0..1e9",
                           &o->pca_sigma);
}

/* --write-h5: the ptycho scan or the pump-probe series as a file, no
 * socket. Exit code 0 or 1. */
static int sim_write_file(const sim_opts_t *o) {
  beam_diag_t d;
  beam_diag_clear(&d);
  sim_ptycho_t *p = NULL;
  sim_pp_t *pp = NULL;
  int rc;
  if (o->pattern == SIM_PAT_PUMPPROBE) {
    rc = sim_pp_new(&pp, o, &d);
    if (rc == 0 && o->pp_truth_file)
      rc = sim_pp_write_truth(pp, o->pp_truth_file, &d);
    if (rc == 0)
      rc = sim_pp_write_h5(pp, o, o->write_h5, &d);
  } else {
    rc = sim_ptycho_new(&p, o, &d);
    if (rc == 0)
      rc = sim_ptycho_write_h5(p, o, o->write_h5, &d);
  }
  if (rc < 0)
    fprintf(stderr, "beamd-sim: %s\n", d.msg);
  else if (!o->quiet)
    fprintf(stderr, "beamd-sim: wrote %s (%llu frames)\n", o->write_h5,
            (unsigned long long)o->frames);
  sim_ptycho_destroy(&p);
  sim_pp_destroy(&pp);
  json_decref(o->meta);
  return rc < 0 ? 1 : 0;
}

/* Returns 0, 1 for --help, or -1 after printing why. */
static tool_curve_t curve;

static int parse_args(int argc, char **argv, sim_opts_t *o) {
  int have_bind = 0, have_connect = 0, have_socket = 0, have_codec = 0, c;
  const char *xpcs_opt = NULL; /* an xpcs-only option seen, for the error */
  const char *pca_opt = NULL;  /* a pca-only option seen */
  const char *pty_opt = NULL;  /* a ptycho-only option seen */
  const char *pp_opt = NULL;   /* a pumpprobe-only option seen */
  uint64_t u;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    switch (c) {
    case OPT_BIND: o->endpoint = optarg; have_bind = 1; break;
    case OPT_CONNECT: o->endpoint = optarg; have_connect = 1; break;
    case OPT_SOCKET:
      have_socket = 1;
      if (!strcmp(optarg, "pub")) o->sock_type = ZMQ_PUB;
      else if (!strcmp(optarg, "push")) o->sock_type = ZMQ_PUSH;
      else return tool_bad("socket", optarg, "pub or push");
      break;
    case OPT_SHAPE: if (parse_shape(optarg, o)) return -1; o->shape_set = 1; break;
    case OPT_DTYPE:
      o->dtype = beam_dtype_from_name(optarg);
      if (o->dtype != BEAM_DT_U8 && o->dtype != BEAM_DT_U16 &&
          o->dtype != BEAM_DT_U32 && o->dtype != BEAM_DT_F32)
        return tool_bad("dtype", optarg, "uint8, uint16, uint32 or float32");
      break;
    case OPT_RATE: if (tool_parse_double("rate", optarg, 0, 1e9, NULL, &o->rate)) return -1; break;
    case OPT_FRAMES: if (tool_parse_u64("frames", optarg, 0, UINT64_MAX / 2, &o->frames)) return -1; break;
    case OPT_SERIES: if (tool_parse_u64("series", optarg, 1, 1u << 30, &o->nseries)) return -1; break;
    case OPT_SERIES_ID:
      if (tool_parse_u64("series-id", optarg, 0, (uint64_t)INT64_MAX / 2, &o->series_id0)) return -1;
      break;
    case OPT_CODEC:
      have_codec = 1;
      if (!strcmp(optarg, "raw")) o->codec = BEAM_CODEC_RAW;
      else if (!strcmp(optarg, "lz4")) o->codec = BEAM_CODEC_LZ4;
      else if (!strcmp(optarg, "bslz4")) o->codec = BEAM_CODEC_BSLZ4;
      else return tool_bad("codec", optarg, "raw, lz4 or bslz4");
      break;
    case OPT_PATTERN:
      if (!strcmp(optarg, "poisson")) o->pattern = SIM_PAT_POISSON;
      else if (!strcmp(optarg, "flat")) o->pattern = SIM_PAT_FLAT;
      else if (!strcmp(optarg, "counter")) o->pattern = SIM_PAT_COUNTER;
      else if (!strcmp(optarg, "stem")) o->pattern = SIM_PAT_STEM;
      else if (!strcmp(optarg, "xpcs")) o->pattern = SIM_PAT_XPCS;
      else if (!strcmp(optarg, "pca")) o->pattern = SIM_PAT_PCA;
      else if (!strcmp(optarg, "ptycho")) o->pattern = SIM_PAT_PTYCHO;
      else if (!strcmp(optarg, "pumpprobe")) o->pattern = SIM_PAT_PUMPPROBE;
      else return tool_bad("pattern", optarg, "poisson, flat, counter, stem, xpcs, pca, ptycho or pumpprobe");
      break;
    case OPT_MEAN:
      if (tool_parse_double("mean", optarg, 0, 1e9, NULL, &o->mean)) return -1;
      o->mean_set = 1;
      break;
    case OPT_SEED: if (tool_parse_u64("seed", optarg, 0, UINT64_MAX, &o->seed)) return -1; break;
    case OPT_WAIT: if (tool_parse_double("wait-subscribers", optarg, 0, 3600, NULL, &o->wait_subs)) return -1; break;
    case OPT_HWM:
      if (tool_parse_u64("hwm", optarg, 0, INT32_MAX, &u)) return -1;
      o->hwm = (int)u;
      break;
    case OPT_MALFORMED: if (tool_parse_u64("malformed", optarg, 0, 1u << 30, &o->malformed)) return -1; break;
    case OPT_FRAME_TIME: if (tool_parse_double("frame-time", optarg, 0, 1e6, NULL, &o->frame_time)) return -1; break;
    case OPT_META: if (parse_meta(optarg, o)) return -1; break;
    case OPT_QUIET: o->quiet = 1; break;
    case OPT_STATS: o->stats_json = 1; break;
    case OPT_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    case OPT_XRINGS:
      if (tool_parse_u64("xpcs-rings", optarg, 1, 1024, &u)) return -1;
      o->xpcs_rings = (uint32_t)u;
      xpcs_opt = "--xpcs-rings";
      break;
    case OPT_XMODES:
      if (tool_parse_u64("xpcs-modes", optarg, 1, 64, &u)) return -1;
      o->xpcs_modes = (uint32_t)u;
      xpcs_opt = "--xpcs-modes";
      break;
    case OPT_XRMIN:
      if (tool_parse_double("xpcs-rate-min", optarg, 1e-9, 1e9, NULL, &o->xpcs_rate_min)) return -1;
      xpcs_opt = "--xpcs-rate-min";
      break;
    case OPT_XRMAX:
      if (tool_parse_double("xpcs-rate-max", optarg, 1e-9, 1e9, NULL, &o->xpcs_rate_max)) return -1;
      xpcs_opt = "--xpcs-rate-max";
      break;
    case OPT_LABEL_FILE:
      if (!*optarg) return tool_bad("label-file", optarg, "expected a path");
      o->label_file = optarg;
      xpcs_opt = "--label-file";
      break;
    case OPT_PSTR: if (parse_strengths(optarg, o)) return -1; pca_opt = "--pca-strengths"; break;
    case OPT_PNOISE: if (parse_pca_noise(optarg, o)) return -1; pca_opt = "--pca-noise"; break;
    case OPT_PSPIKES:
      if (tool_parse_double("pca-spikes", optarg, 0, 1, NULL, &o->pca_spikes)) return -1;
      pca_opt = "--pca-spikes";
      break;
    case OPT_POUT:
      if (tool_parse_u64("pca-outliers", optarg, 0, 1u << 20, &o->pca_outliers)) return -1;
      pca_opt = "--pca-outliers";
      break;
    case OPT_PDRIFT:
      if (tool_parse_u64("pca-drift-at", optarg, 0, UINT64_MAX - 1, &o->pca_drift_at)) return -1;
      pca_opt = "--pca-drift-at";
      break;
    case OPT_PANGLE:
      if (tool_parse_double("pca-drift-angle", optarg, 0, 90, NULL, &o->pca_drift_angle)) return -1;
      pca_opt = "--pca-drift-angle";
      break;
    case OPT_PPT0: case OPT_PPDMIN: case OPT_PPDMAX: case OPT_PPFMIN: case OPT_PPFMAX:
    case OPT_PPTMIN: case OPT_PPTMAX: case OPT_PPAMP: {
      double *dst = c == OPT_PPT0 ? &o->pp_t0 : c == OPT_PPDMIN ? &o->pp_dmin
                  : c == OPT_PPDMAX ? &o->pp_dmax : c == OPT_PPFMIN ? &o->pp_fmin
                  : c == OPT_PPFMAX ? &o->pp_fmax : c == OPT_PPTMIN ? &o->pp_taumin
                  : c == OPT_PPTMAX ? &o->pp_taumax : &o->pp_amp;
      double lo = c == OPT_PPTMIN || c == OPT_PPTMAX ? 1e-9 : c >= OPT_PPFMIN && c <= OPT_PPFMAX ? 0 : -1e9;
      if (tool_parse_double("pp-*", optarg, lo, 1e9, NULL, dst)) return -1;
      pp_opt = "--pp-*";
      break;
    }
    case OPT_PPTRUTH:
      if (!*optarg) return tool_bad("pp-truth", optarg, "expected a path");
      o->pp_truth_file = optarg;
      pp_opt = "--pp-truth";
      break;
    case OPT_PBASIS:
      if (!*optarg) return tool_bad("pca-basis-file", optarg, "expected a path");
      o->pca_basis_file = optarg;
      pca_opt = "--pca-basis-file";
      break;
    default:
      if (c >= SIM_PTY_OPT_BASE && c < SIM_PTY_OPT_END) {
        if (sim_ptycho_opt(c, optarg, o))
          return -1;
        if (c != SIM_PTY_WRITE_H5) /* ptycho and pumpprobe both write files */
          pty_opt = argv[optind - 1];
        break;
      }
      if (c >= SIM_DX_OPT_BASE && c < SIM_DX_OPT_END) {
        if (sim_dectris_opt(c, optarg, o))
          return -1;
        break;
      }
      if (tool_curve_opt(&curve, c, optarg))
        break;
      return tool_bad_option(argv, 1);
    }
  }
  if (tool_no_operands(argc, argv))
    return -1;
  if (have_bind && have_connect) {
    fprintf(stderr, "beamd-sim: --bind and --connect are exclusive\n");
    return -1;
  }
  o->bind = !have_connect;
  if (sim_dectris_check(o, have_bind, have_connect, have_socket, have_codec))
    return -1;
  if (xpcs_opt && o->pattern != SIM_PAT_XPCS) {
    fprintf(stderr, "beamd-sim: %s applies to --pattern xpcs only\n", xpcs_opt);
    return -1;
  }
  if (pp_opt && o->pattern != SIM_PAT_PUMPPROBE) {
    fprintf(stderr, "beamd-sim: %s applies to --pattern pumpprobe only\n", pp_opt);
    return -1;
  }
  if (o->pattern == SIM_PAT_PUMPPROBE && !(o->pp_dmin < o->pp_dmax)) {
    fprintf(stderr, "beamd-sim: --pp-delay-min must be below --pp-delay-max\n");
    return -1;
  }
  if (pca_opt && o->pattern != SIM_PAT_PCA) {
    fprintf(stderr, "beamd-sim: %s applies to --pattern pca only\n", pca_opt);
    return -1;
  }
  if (o->write_h5 && o->pattern != SIM_PAT_PTYCHO && o->pattern != SIM_PAT_PUMPPROBE) {
    fprintf(stderr, "beamd-sim: --write-h5 applies to --pattern ptycho or pumpprobe only\n");
    return -1;
  }
  if (o->write_h5 && o->pattern == SIM_PAT_PUMPPROBE && o->frames < 2) {
    fprintf(stderr, "beamd-sim: --write-h5: --frames must be at least 2 (one delay each)\n");
    return -1;
  }
  if (pty_opt && o->pattern != SIM_PAT_PTYCHO) {
    fprintf(stderr, "beamd-sim: %s applies to --pattern ptycho only\n", pty_opt);
    return -1;
  }
  if (o->pattern == SIM_PAT_PTYCHO && sim_ptycho_check(o))
    return -1;
  if (o->pca_drift_angle != 90.0 && o->pca_drift_at == SIM_PCA_NO_DRIFT) {
    fprintf(stderr, "beamd-sim: --pca-drift-angle needs --pca-drift-at\n");
    return -1;
  }
  if (o->pattern == SIM_PAT_PCA) {
    if (!o->mean_set)
      o->mean = 100.0;
    /* pca.c checks these again; here they get the command-line exit code. */
    uint64_t nb = (uint64_t)o->pca_k * (o->pca_drift_at != SIM_PCA_NO_DRIFT ? 2u : 1u);
    if (nb + 1 > (uint64_t)o->h * o->w) {
      fprintf(stderr, "beamd-sim: %llu basis images do not fit a %ux%u frame\n",
              (unsigned long long)nb, o->h, o->w);
      return -1;
    }
    uint64_t pool = o->frames ? o->frames : 1000u;
    if (o->pca_outliers > pool / 2) {
      fprintf(stderr, "beamd-sim: --pca-outliers %llu: at most half of the %llu frames\n",
              (unsigned long long)o->pca_outliers, (unsigned long long)pool);
      return -1;
    }
  }
  if (o->pattern == SIM_PAT_XPCS) {
    /* xpcs.c checks these again; here they get the command-line exit code. */
    double rmax = (o->h < o->w ? o->h : o->w) / 2.0;
    if (!(o->xpcs_rate_min <= o->xpcs_rate_max)) {
      fprintf(stderr, "beamd-sim: --xpcs-rate-min %g is above --xpcs-rate-max %g\n",
              o->xpcs_rate_min, o->xpcs_rate_max);
      return -1;
    }
    if (!(rmax / o->xpcs_rings >= 1.0)) {
      fprintf(stderr, "beamd-sim: --xpcs-rings %u: rings would be thinner than one pixel "
              "(a %ux%u frame allows at most %u)\n", o->xpcs_rings, o->h, o->w,
              (unsigned)floor(rmax));
      return -1;
    }
    if (!(o->xpcs_rate_min * sim_frame_time(o) >= 1e-6)) {
      fprintf(stderr, "beamd-sim: --xpcs-rate-min %g x frame time %g s is below 1e-6, "
              "which float32 fields cannot resolve\n", o->xpcs_rate_min, sim_frame_time(o));
      return -1;
    }
  }
  if (o->frames == 0 && o->nseries != 1) {
    fprintf(stderr, "beamd-sim: --frames 0 runs one series forever; --series must be 1\n");
    return -1;
  }
  size_t esize = beam_dtype_size(o->dtype);
  if ((uint64_t)o->h * o->w * esize > beam_limits_default.max_raw_bytes) {
    fprintf(stderr, "beamd-sim: a %ux%u %s frame exceeds the protocol limit of %llu bytes\n",
            o->h, o->w, beam_dtype_name(o->dtype),
            (unsigned long long)beam_limits_default.max_raw_bytes);
    return -1;
  }
  return 0;
}

/* Global frame index before which malformed message i is sent: evenly
 * spread over a finite run, one every FOREVER_MALFORMED_EVERY otherwise. */
static uint64_t malformed_slot(const sim_opts_t *o, uint64_t i) {
  if (o->frames == 0)
    return (i + 1) * FOREVER_MALFORMED_EVERY;
  unsigned __int128 total = (unsigned __int128)o->frames * o->nseries;
  return (uint64_t)(total * (i + 1) / (o->malformed + 1));
}

static void sleep_until(uint64_t deadline_ns) {
  struct timespec ts = {(time_t)(deadline_ns / 1000000000ull),
                        (long)(deadline_ns % 1000000000ull)};
  while (!tool_stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

/* The send loop. Returns 0, or -1 with d set (d->code == 0 when a signal
 * interrupted a blocking send, which is not an error). */
static int run(sim_tx_t *tx, const sim_opts_t *o, beam_diag_t *d) {
  uint64_t g = 0, next_mal = 0, t0 = 0;
  for (uint64_t s = 0; s < o->nseries && !tool_stop; s++) {
    uint64_t sid = o->series_id0 + s;
    if (sim_tx_series_start(tx, sid, d) < 0)
      return -1;
    uint64_t f = 0;
    for (; (o->frames == 0 || f < o->frames) && !tool_stop; f++, g++) {
      if (o->rate > 0) {
        if (!t0)
          t0 = beam_now_ns();
        /* Absolute deadlines: a late frame does not delay the ones after it,
         * so the long-run rate is exact. */
        sleep_until(t0 + (uint64_t)((double)g * 1e9 / o->rate));
        if (tool_stop)
          break;
      }
      while (next_mal < o->malformed && malformed_slot(o, next_mal) <= g) {
        if (sim_tx_malformed(tx, next_mal, sid, d) < 0)
          return -1;
        next_mal++;
      }
      if (sim_tx_frame(tx, sid, f, d) < 0)
        return -1;
    }
    if (sim_tx_series_end(tx, sid, f, tool_stop != 0, d) < 0)
      return -1;
  }
  return 0;
}

static void print_stats(const sim_tx_t *tx) {
  const sim_stats_t *st = &tx->st;
  double secs = st->t_last_ns > st->t_first_ns ? (st->t_last_ns - st->t_first_ns) / 1e9 : 0.0;
  /* Inter-frame rate: N frames paced at R Hz span (N-1)/R seconds. */
  double fspan = (st->t_last_frame_ns - st->t_first_frame_ns) / 1e9;
  double rate = st->frames_sent >= 2 && fspan > 0 ? (st->frames_sent - 1) / fspan : 0.0;
  printf("{\"frames_sent\":%llu,\"series\":%llu,\"bytes\":%llu,\"seconds\":%.6f,"
         "\"rate\":%.3f,\"malformed_sent\":%llu}\n",
         (unsigned long long)st->frames_sent, (unsigned long long)st->series,
         (unsigned long long)st->bytes, secs, rate, (unsigned long long)st->malformed_sent);
  fflush(stdout);
}

int main(int argc, char **argv) {
  sim_opts_t o = {
      .endpoint = DEFAULT_ENDPOINT, .bind = 1, .sock_type = ZMQ_PUB, .h = 512, .w = 512,
      .dtype = BEAM_DT_U16, .rate = 0, .frames = 1000, .nseries = 1, .series_id0 = 1,
      .codec = BEAM_CODEC_RAW, .pattern = SIM_PAT_POISSON, .mean = 2.0, .seed = 1,
      .wait_subs = 0.5, .hwm = -1, .frame_time = -1, .xpcs_rings = 8, .xpcs_modes = 1,
      .xpcs_rate_min = 1.0, .xpcs_rate_max = 100.0,
      .pca_k = 3, .pca_strengths = {8.0, 4.0, 2.0}, .pca_sigma = -1.0,
      .pca_drift_at = SIM_PCA_NO_DRIFT, .pca_drift_angle = 90.0,
      .pp_t0 = 0.5, .pp_dmin = -1.0, .pp_dmax = 9.0, .pp_fmin = 0.3, .pp_fmax = 0.6,
      .pp_taumin = 2.0, .pp_taumax = 6.0, .pp_amp = 0.5,
  };
  tool_cli_init("beamd-sim");
  tool_curve_init(&curve);
  sim_ptycho_defaults(&o);
  sim_dectris_defaults(&o);
  int ex = tool_args_exit(parse_args(argc, argv, &o), usage);
  if (ex >= 0) {
    json_decref(o.meta);
    return ex;
  }
  tool_catch_stop(); /* blocking sends see EINTR and the flag */
  if (o.write_h5)
    return sim_write_file(&o);

  beam_diag_t d;
  beam_diag_clear(&d);
  sim_bank_t bank;
  sim_tx_t tx;
  memset(&bank, 0, sizeof bank);
  memset(&tx, 0, sizeof tx);
  int rc = 1;
  void *ctx = zmq_ctx_new();
  void *sock = ctx ? zmq_socket(ctx, o.sock_type) : NULL;
  if (!sock) {
    fprintf(stderr, "beamd-sim: cannot create ZeroMQ socket: %s\n", zmq_strerror(errno));
    if (ctx)
      zmq_ctx_term(ctx);
    json_decref(o.meta);
    return 1;
  }
  if (o.hwm >= 0 && zmq_setsockopt(sock, ZMQ_SNDHWM, &o.hwm, sizeof o.hwm) < 0) {
    fprintf(stderr, "beamd-sim: ZMQ_SNDHWM %d: %s\n", o.hwm, zmq_strerror(errno));
    goto out;
  }
  if (tool_curve_socket(&curve, ctx, sock, o.endpoint, o.bind) < 0)
    goto out;
  if ((o.bind ? zmq_bind(sock, o.endpoint) : zmq_connect(sock, o.endpoint)) < 0) {
    fprintf(stderr, "beamd-sim: cannot %s %s: %s\n", o.bind ? "bind" : "connect",
            o.endpoint, zmq_strerror(errno));
    goto out;
  }
  /* A PUB drops everything sent before subscribers have connected; the wait
   * starts at the bind so the bank generation below overlaps with it. */
  uint64_t wait_until = beam_now_ns() + (uint64_t)(o.wait_subs * 1e9);
  /* The bank is made after the bind, so a taken port fails fast. */
  if (sim_bank_init(&bank, &o, &d) < 0 || sim_tx_init(&tx, sock, &o, &bank, &d) < 0) {
    fprintf(stderr, "beamd-sim: %s\n", d.msg);
    goto out;
  }
  if (o.label_file && sim_xpcs_write_labels(bank.xpcs, o.label_file, &d) < 0) {
    fprintf(stderr, "beamd-sim: label file: %s\n", d.msg);
    goto out;
  }
  if (o.pp_truth_file && sim_pp_write_truth(bank.pp, o.pp_truth_file, &d) < 0) {
    fprintf(stderr, "beamd-sim: %s\n", d.msg);
    goto out;
  }
  if (o.pca_basis_file && sim_pca_write_basis(bank.pca, o.pca_basis_file, &d) < 0) {
    fprintf(stderr, "beamd-sim: basis file: %s\n", d.msg);
    goto out;
  }
  if (!o.quiet && o.protocol != SIM_PROTO_BEAMD) {
    sim_dectris_describe(&o);
  } else if (!o.quiet) {
    fprintf(stderr, "beamd-sim: %s %s (%s), %ux%u %s %s %s, %llu series x ",
            o.bind ? "bound" : "connected", o.endpoint, o.sock_type == ZMQ_PUB ? "pub" : "push",
            o.h, o.w, beam_dtype_name(o.dtype), beam_codec_name(o.codec),
            sim_pattern_name(o.pattern), (unsigned long long)o.nseries);
    if (o.frames)
      fprintf(stderr, "%llu frames", (unsigned long long)o.frames);
    else
      fprintf(stderr, "forever");
    if (o.rate > 0)
      fprintf(stderr, " at %g Hz\n", o.rate);
    else
      fprintf(stderr, " unpaced\n");
  }
  if (o.sock_type == ZMQ_PUB && o.wait_subs > 0)
    sleep_until(wait_until);
  int sent = o.protocol == SIM_PROTO_BEAMD ? run(&tx, &o, &d)
                                            : sim_dectris_run(sock, &o, &bank, &tx.st, &d);
  if (sent < 0 && d.code != 0) {
    fprintf(stderr, "beamd-sim: %s\n", d.msg);
  } else {
    rc = 0;
    if (!o.quiet)
      fprintf(stderr, "beamd-sim: sent %llu frames in %llu series (%llu malformed)%s\n",
              (unsigned long long)tx.st.frames_sent, (unsigned long long)tx.st.series,
              (unsigned long long)tx.st.malformed_sent, tool_stop ? ", interrupted" : "");
  }
  if (o.stats_json)
    print_stats(&tx);

out:;
  int linger = tool_stop ? 0 : o.sock_type == ZMQ_PUB ? PUB_LINGER_MS : PUSH_LINGER_MS;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_close(sock);
  /* Waits for the linger: the bank, sent zero-copy, must outlive it. */
  tool_curve_fini(&curve);
  while (zmq_ctx_term(ctx) < 0 && errno == EINTR)
    ;
  sim_tx_destroy(&tx);
  sim_bank_destroy(&bank);
  json_decref(o.meta);
  return rc;
}
