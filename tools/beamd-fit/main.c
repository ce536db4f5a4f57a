/* beamd-fit: per-pixel fits of every pixel trace of a scan file, on one
 * process or distributed with MPI (docs/fit.md "beamd-fit").
 *
 *   beamd-fit SCAN.h5 -o MAPS.h5 --model damped_cosine --x /entry/data/delay
 *   mpirun -n K beamd-fit SCAN.h5 -o MAPS.h5 ...
 *
 * Rank r reads and decodes only its chunk-aligned block of frames; rounds
 * of MPI_Alltoallv turn frames into pixel tiles (a tile x all frames per
 * rank per round); each rank fits its tile; rank 0 gathers the round's
 * results and writes them (serial HDF5). The maps do not depend on K or
 * on the threads: every fit sees the same trace and the engine's lanes
 * never mix.
 *
 * Exit codes: 0 done, 1 bad input or runtime error, 2 bad command line,
 * 130 interrupted (the maps file is left with the tiles written so far).
 */
#include "tools/beamd-fit/bfit.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/sig.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_INTERRUPTED 130
#define MAX_SPECS 64

static bf_mpi_t M;

static void usage(FILE *f) {
  fprintf(f,
"usage: beamd-fit SCAN.h5 -o MAPS.h5 --model NAME [options]\n"
"       mpirun -n K beamd-fit SCAN.h5 -o MAPS.h5 --model NAME [options]\n"
"Fits every pixel trace (one value per frame) of a scan; docs/fit.md.\n"
"input (the layouts beamd-replay reads: NXmx master + data files, or a 3-D dataset):\n"
"  --dataset PATH         frames dataset (default /entry/data/data, data_NNNNNN\n"
"                         links, or the only 3-D dataset)\n"
"  --x DSET|FILE:DSET     x (delay, time) per frame, 1-D, one value per frame\n"
"  --x-step S [--x-start X0]   uniform x = X0 + k S instead (default 0 + k)\n"
"  --mask DSET|FILE:DSET  frame-shaped mask, nonzero = not fitted (NXmx pixel_mask)\n"
"  --roi Y0:Y1,X0:X1      fit only this rectangle (half-open, pixels)\n"
"model:\n"
"  --model NAME           dcos (damped_cosine), dcos_t0, dcos2, exp, stretch,\n"
"                         stretch_xt, exp2, gauss, lorentz, poly\n"
"  --degree D             poly degree (default 2)\n"
"  --estimator wls|poisson|mle   unit-weight LSQ, Poisson weights 1/max(y,1), or\n"
"                         Poisson maximum likelihood (default wls)\n"
"  --bound NAME=LO:HI     box bound of a parameter (LO or HI may be empty = none)\n"
"  --fix NAME=V           hold a parameter at V\n"
"  --p0 NAME=V[,NAME=V]   initial values, every parameter (default: a per-trace\n"
"                         guess from the data)\n"
"  --max-iter N --ftol F --xtol F --gtol F --absolute-sigma   engine options\n"
"  --isa auto|sse2|avx2|avx512\n"
"run:\n"
"  --backend cpu|cuda|auto  (default cpu; cuda: the CUDA engine, device = local\n"
"                         rank mod devices; auto: cuda where this rank sees a\n"
"                         device, else cpu)\n"
"  --cuda-starts device|host  INIT_AUTO starts on the device (default) or by the\n"
"                         CPU's code on the host (slow; for comparison)\n"
"  --threads T            fit threads per rank (default: cores / local ranks)\n"
"  --tile PX              pixels per tile (default: about 32 MiB of float32 traces)\n"
"  --progress             progress lines even when stderr is no terminal\n"
"  --quiet                no progress and no summary\n"
"  -o, --output FILE      the maps (layout: docs/fit.md)\n"
"  --help                 this text\n"
"  --version              print the version (beamd's) and exit\n");
}

enum {
  O_DATASET = 256, O_X, O_XSTEP, O_XSTART, O_MASK, O_ROI, O_MODEL, O_DEGREE, O_EST, O_BOUND,
  O_FIX, O_P0, O_MAXIT, O_FTOL, O_XTOL, O_GTOL, O_ABS, O_ISA, O_BACKEND, O_CUDA_STARTS, O_THREADS, O_TILE,
  O_PROGRESS, O_QUIET, O_HELP,
};

static const struct option long_opts[] = {
  {"output", required_argument, 0, 'o'}, {"dataset", required_argument, 0, O_DATASET},
  {"x", required_argument, 0, O_X}, {"x-step", required_argument, 0, O_XSTEP},
  {"x-start", required_argument, 0, O_XSTART}, {"mask", required_argument, 0, O_MASK},
  {"roi", required_argument, 0, O_ROI}, {"model", required_argument, 0, O_MODEL},
  {"degree", required_argument, 0, O_DEGREE}, {"estimator", required_argument, 0, O_EST},
  {"bound", required_argument, 0, O_BOUND}, {"fix", required_argument, 0, O_FIX},
  {"p0", required_argument, 0, O_P0}, {"max-iter", required_argument, 0, O_MAXIT},
  {"ftol", required_argument, 0, O_FTOL}, {"xtol", required_argument, 0, O_XTOL},
  {"gtol", required_argument, 0, O_GTOL}, {"absolute-sigma", no_argument, 0, O_ABS},
  {"isa", required_argument, 0, O_ISA}, {"backend", required_argument, 0, O_BACKEND},
  {"cuda-starts", required_argument, 0, O_CUDA_STARTS},
  {"threads", required_argument, 0, O_THREADS}, {"tile", required_argument, 0, O_TILE},
  {"progress", no_argument, 0, O_PROGRESS}, {"quiet", no_argument, 0, O_QUIET},
  {"help", no_argument, 0, O_HELP},
  TOOL_VERSION_LONGOPT, {0, 0, 0, 0},
};

/* Names the issue and the other tools use, besides the engine's own. */
static const char *const alias[][2] = {
  {"damped_cosine", "dcos"}, {"damped_cosine_t0", "dcos_t0"}, {"damped_cosine2", "dcos2"},
  {"exponential", "exp"}, {"stretched", "stretch"}, {"gaussian", "gauss"},
  {"lorentzian", "lorentz"}, {"polynomial", "poly"},
};

static int parse_model(const char *v, bf_opts_t *o) {
  const char *n = v;
  for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
    if (!strcmp(v, alias[i][0]))
      n = alias[i][1];
  int m = beam_fit_model_from_name(n);
  if (m < 0) {
    char list[512] = "";
    for (int k = 0; k < BEAM_FIT_N_MODELS; k++) {
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, "%s%s", k ? ", " : "",
               beam_fit_model_info((beam_fit_model_t)k)->name);
    }
    char why[600];
    snprintf(why, sizeof why, "unknown model; known: %s, damped_cosine", list);
    return tool_bad("model", v, why);
  }
  o->batch.model = (beam_fit_model_t)m;
  return 0;
}

static int param_index(const bf_opts_t *o, const char *name, size_t len) {
  const beam_fit_model_info_t *mi = beam_fit_model_info(o->batch.model);
  for (int k = 0; k < o->np; k++)
    if (strlen(mi->param_names[k]) == len && !strncmp(mi->param_names[k], name, len))
      return k;
  return -1;
}

static int bad_param(const char *opt, const char *v, const bf_opts_t *o) {
  const beam_fit_model_info_t *mi = beam_fit_model_info(o->batch.model);
  char why[300];
  size_t l = (size_t)snprintf(why, sizeof why, "no such parameter of %s; it has", mi->name);
  for (int k = 0; k < o->np && l < sizeof why; k++)
    l += (size_t)snprintf(why + l, sizeof why - l, " %s", mi->param_names[k]);
  return tool_bad(opt, v, why);
}

static int num(const char *s, size_t n, double dflt, double *out) {
  char b[64];
  if (n == 0) {
    *out = dflt;
    return 0;
  }
  if (n >= sizeof b)
    return -1;
  memcpy(b, s, n);
  b[n] = 0;
  char *e;
  *out = strtod(b, &e);
  return *e || e == b || isnan(*out) ? -1 : 0;
}

/* --bound NAME=LO:HI, --fix NAME=V, --p0 NAME=V,...: after the model. */
static int apply_specs(bf_opts_t *o, const char *const *bounds, int nb, const char *const *fixes,
                       int nf, const char *const *p0s, int np0) {
  int P = o->np;
  for (int k = 0; k < P; k++)
    o->lo[k] = -INFINITY, o->hi[k] = INFINITY;
  for (int i = 0; i < nb; i++) {
    const char *v = bounds[i], *eq = strchr(v, '='), *colon = eq ? strchr(eq, ':') : NULL;
    if (!eq || !colon)
      return tool_bad("bound", v, "NAME=LO:HI");
    int k = param_index(o, v, (size_t)(eq - v));
    if (k < 0)
      return bad_param("bound", v, o);
    double lo, hi;
    if (num(eq + 1, (size_t)(colon - eq - 1), -INFINITY, &lo) ||
        num(colon + 1, strlen(colon + 1), INFINITY, &hi) || lo > hi)
      return tool_bad("bound", v, "NAME=LO:HI with numbers LO <= HI (either may be empty)");
    o->lo[k] = lo, o->hi[k] = hi;
    o->have_bounds = 1;
  }
  for (int i = 0; i < nf; i++) {
    const char *v = fixes[i], *eq = strchr(v, '=');
    double x;
    if (!eq)
      return tool_bad("fix", v, "NAME=VALUE");
    int k = param_index(o, v, (size_t)(eq - v));
    if (k < 0)
      return bad_param("fix", v, o);
    if (num(eq + 1, strlen(eq + 1), NAN, &x) || !isfinite(x))
      return tool_bad("fix", v, "NAME=VALUE with a finite number");
    o->lo[k] = o->hi[k] = x;
    o->have_bounds = 1;
  }
  if (np0) {
    int seen[BEAM_FIT_MAX_PARAMS] = {0};
    for (int i = 0; i < np0; i++) {
      for (const char *s = p0s[i]; *s;) {
        const char *end = strchr(s, ','), *eq = strchr(s, '=');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        if (!eq || eq > s + n)
          return tool_bad("p0", p0s[i], "NAME=VALUE[,NAME=VALUE...]");
        int k = param_index(o, s, (size_t)(eq - s));
        if (k < 0)
          return bad_param("p0", p0s[i], o);
        if (num(eq + 1, (size_t)(s + n - eq - 1), NAN, &o->p0[k]) || !isfinite(o->p0[k]))
          return tool_bad("p0", p0s[i], "NAME=VALUE with finite numbers");
        seen[k] = 1;
        s += n + (end ? 1 : 0);
      }
    }
    const beam_fit_model_info_t *mi = beam_fit_model_info(o->batch.model);
    for (int k = 0; k < P; k++)
      if (!seen[k]) {
        char why[128];
        snprintf(why, sizeof why, "every parameter needs a value; %s has none", mi->param_names[k]);
        return tool_bad("p0", p0s[0], why);
      }
    o->fit.init = BEAM_FIT_INIT_GIVEN;
  }
  /* A fixed parameter that also starts elsewhere is clamped by the
   * engine; an explicit p0 outside a bound is more likely a typo. */
  return 0;
}

static int parse_roi(const char *s, bf_opts_t *o) {
  unsigned a, b, c, e;
  int n = 0;
  if (sscanf(s, "%u:%u,%u:%u%n", &a, &b, &c, &e, &n) != 4 || s[n] || a >= b || c >= e)
    return tool_bad("roi", s, "Y0:Y1,X0:X1 with Y0 < Y1 and X0 < X1");
  o->roi[0] = a, o->roi[1] = b, o->roi[2] = c, o->roi[3] = e;
  o->have_roi = 1;
  return 0;
}

/* 0, 1 for --help, -1 after printing why. */
static int parse_args(int argc, char **argv, bf_opts_t *o) {
  const char *bounds[MAX_SPECS], *fixes[MAX_SPECS], *p0s[MAX_SPECS];
  int nb = 0, nf = 0, np0 = 0, have_model = 0, have_step = 0;
  uint64_t u;
  double v;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "o:", long_opts, NULL)) != -1) {
    switch (c) {
    case 'o': o->output = optarg; break;
    case O_DATASET: o->dataset = optarg; break;
    case O_X: o->x_dataset = optarg; break;
    case O_XSTEP:
      if (tool_parse_double("x-step", optarg, -1e300, 1e300, NULL, &o->x_step)) return -1;
      if (o->x_step == 0) return tool_bad("x-step", optarg, "must not be 0");
      have_step = 1;
      break;
    case O_XSTART: if (tool_parse_double("x-start", optarg, -1e300, 1e300, NULL, &o->x_start)) return -1; break;
    case O_MASK: o->mask = optarg; break;
    case O_ROI: if (parse_roi(optarg, o)) return -1; break;
    case O_MODEL: if (parse_model(optarg, o)) return -1; have_model = 1; break;
    case O_DEGREE:
      if (tool_parse_u64("degree", optarg, 0, BEAM_FIT_MAX_PARAMS - 1, &u)) return -1;
      o->batch.poly_degree = (int)u;
      break;
    case O_EST:
      if (!strcmp(optarg, "wls") || !strcmp(optarg, "lse")) o->fit.estimator = BEAM_FIT_LSE;
      else if (!strcmp(optarg, "poisson")) o->fit.estimator = BEAM_FIT_LSE_POISSON;
      else if (!strcmp(optarg, "mle")) o->fit.estimator = BEAM_FIT_MLE;
      else return tool_bad("estimator", optarg, "wls, poisson or mle");
      break;
    case O_BOUND: if (nb == MAX_SPECS) return tool_bad("bound", optarg, "too many"); bounds[nb++] = optarg; break;
    case O_FIX: if (nf == MAX_SPECS) return tool_bad("fix", optarg, "too many"); fixes[nf++] = optarg; break;
    case O_P0: if (np0 == MAX_SPECS) return tool_bad("p0", optarg, "too many"); p0s[np0++] = optarg; break;
    case O_MAXIT: if (tool_parse_u64("max-iter", optarg, 1, 1000000, &u)) return -1; o->fit.max_iter = (int)u; break;
    case O_FTOL: if (tool_parse_double("ftol", optarg, 0, 1, NULL, &o->fit.ftol)) return -1; break;
    case O_XTOL: if (tool_parse_double("xtol", optarg, 0, 1, NULL, &o->fit.xtol)) return -1; break;
    case O_GTOL: if (tool_parse_double("gtol", optarg, 0, 1, NULL, &o->fit.gtol)) return -1; break;
    case O_ABS: o->fit.absolute_sigma = 1; break;
    case O_ISA:
      if (!strcmp(optarg, "auto")) o->fit.isa = BEAM_FIT_ISA_AUTO;
      else if (!strcmp(optarg, "sse2")) o->fit.isa = BEAM_FIT_ISA_SSE2;
      else if (!strcmp(optarg, "avx2")) o->fit.isa = BEAM_FIT_ISA_AVX2;
      else if (!strcmp(optarg, "avx512")) o->fit.isa = BEAM_FIT_ISA_AVX512;
      else return tool_bad("isa", optarg, "auto, sse2, avx2 or avx512");
      break;
    case O_BACKEND:
      if (!strcmp(optarg, "cpu")) o->backend = BF_CPU;
      else if (!strcmp(optarg, "cuda")) o->backend = BF_CUDA;
      else if (!strcmp(optarg, "auto")) o->backend = BF_AUTO;
      else return tool_bad("backend", optarg, "cpu, cuda or auto");
      break;
    case O_CUDA_STARTS:
      if (!strcmp(optarg, "device")) o->cuda_starts_host = 0;
      else if (!strcmp(optarg, "host")) o->cuda_starts_host = 1;
      else return tool_bad("cuda-starts", optarg, "device or host");
      break;
    case O_THREADS: if (tool_parse_u64("threads", optarg, 1, 256, &u)) return -1; o->threads = (uint32_t)u; break;
    case O_TILE: if (tool_parse_u64("tile", optarg, 1, 1u << 30, &u)) return -1; o->tile = u; break;
    case O_PROGRESS: o->progress = 1; break;
    case O_QUIET: o->quiet = 1; break;
    case O_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    default: return tool_bad_option(argv, 1);
    }
  }
  (void)v;
  if (optind < argc)
    o->input = argv[optind++];
  if (optind < argc) {
    tool_log("unexpected argument '%s' (one SCAN.h5)", argv[optind]);
    return -1;
  }
  if (!o->input || !o->output) {
    tool_log("need SCAN.h5 and -o MAPS.h5");
    return -1;
  }
  if (!have_model) {
    tool_log("need --model (dcos, damped_cosine, exp, stretch, gauss, ...)");
    return -1;
  }
  if (o->x_dataset && have_step) {
    tool_log("--x and --x-step exclude each other");
    return -1;
  }
  if (!have_step)
    o->x_step = 1;
  const beam_fit_model_info_t *mi = beam_fit_model_info(o->batch.model);
  o->np = o->batch.model == BEAM_FIT_POLY ? o->batch.poly_degree + 1 : mi->n_params;
  return apply_specs(o, bounds, nb, fixes, nf, p0s, np0);
}

static int all_ok(int rc) {
  int bad = rc < 0, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, M.comm);
  return !any;
}

/* A problem every rank meets alike (file, metadata): rank 0 says it. */
static void err_global(const beam_diag_t *d) {
  if (M.rank == 0)
    tool_log("%s", d->msg);
}

/* A problem of this rank's own frames or fits. */
static void err_local(const beam_diag_t *d) {
  if (d->code == 0)
    return;
  if (M.size > 1)
    tool_log("rank %d: %s", M.rank, d->msg);
  else
    tool_log("%s", d->msg);
}

static char *join_args(int argc, char **argv) {
  size_t n = 1;
  for (int i = 0; i < argc; i++)
    n += strlen(argv[i]) + 1;
  char *s = malloc(n);
  if (!s)
    return NULL;
  s[0] = 0;
  for (int i = 0; i < argc; i++) {
    strcat(s, argv[i]);
    if (i + 1 < argc)
      strcat(s, " ");
  }
  return s;
}

static void fmt_time(double s, char *buf, size_t n) {
  if (!(s >= 0) || s > 1e7)
    snprintf(buf, n, "--:--");
  else if (s >= 3600)
    snprintf(buf, n, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
  else
    snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

typedef struct prog_s {
  int on, tty;
  uint64_t t0, last;
} prog_t;

static void progress(prog_t *p, uint64_t done, uint64_t total, int last) {
  if (!p->on || M.rank != 0)
    return;
  uint64_t now = beam_now_ns();
  if (!last && now - p->last < (p->tty ? 200000000ull : 1000000000ull))
    return;
  p->last = now;
  double el = (double)(now - p->t0) / 1e9, rate = el > 0 ? (double)done / el : 0;
  char left[32], spent[32];
  fmt_time(rate > 0 ? (double)(total - done) / rate : -1, left, sizeof left);
  fmt_time(el, spent, sizeof spent);
  fprintf(stderr, "%sbeamd-fit: %llu/%llu pixels (%.0f%%)  %.0f fits/s  %s elapsed  %s left%s",
          p->tty ? "\r\033[K" : "", (unsigned long long)done, (unsigned long long)total,
          total ? 100.0 * (double)done / (double)total : 100.0, rate, spent, left,
          p->tty && !last ? "" : "\n");
}

static int finish(int code) {
  MPI_Finalize();
  return code;
}

/* Pixels per tile: ~32 MiB of float32 traces per rank and round, so the
 * engine gets large batches and memory stays bounded, but no more than a
 * K-th of the pixels, so that every rank has work; a multiple of 16, the
 * engine's block. The maps do not depend on it (lanes never mix). */
static uint64_t default_tile(uint64_t T, uint64_t npix, int size) {
  uint64_t t = (32ull << 20) / (4 * (T ? T : 1));
  t = t < 1024 ? 1024 : t > (1u << 18) ? (1u << 18) : t;
  t -= t % 16;
  uint64_t share = (npix + (uint64_t)size - 1) / (uint64_t)size;
  uint64_t cap = (share + 15) / 16 * 16;
  return t < cap ? t : cap;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  M.comm = MPI_COMM_WORLD;
  MPI_Comm_rank(M.comm, &M.rank);
  MPI_Comm_size(M.comm, &M.size);
  MPI_Comm local;
  MPI_Comm_split_type(M.comm, MPI_COMM_TYPE_SHARED, M.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &M.local_rank);
  MPI_Comm_size(local, &M.local_size);
  MPI_Comm_free(&local);
  tool_cli_init("beamd-fit");
  uint64_t t_start = beam_now_ns();

  bf_opts_t o;
  memset(&o, 0, sizeof o);
  beam_fit_opts_default(&o.fit);
  o.batch.poly_degree = 2;
  /* Only rank 0 talks about the command line; every rank parses it. */
  FILE *devnull = NULL;
  int saved = -1;
  if (M.rank != 0) {
    devnull = fopen("/dev/null", "w");
    saved = dup(2);
    if (devnull)
      dup2(fileno(devnull), 2);
  }
  int ex = tool_args_exit(parse_args(argc, argv, &o), usage);
  if (M.rank != 0 && saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
  if (devnull)
    fclose(devnull);
  if (ex >= 0)
    return finish(ex);
  const char *nocuda = bf_backend_unavailable(o.backend);
  if (nocuda) {
    /* every rank checks its own node; one line per rank that cannot */
    if (M.rank == 0 || M.local_rank == 0)
      tool_log("--backend cuda: %s%s", M.size > 1 && M.rank ? "(a rank on another node) " : "",
               nocuda);
    return finish(1);
  }
  char why[256];
  int was_auto = o.backend == BF_AUTO;
  bf_backend_resolve(&o, M.local_rank, why, sizeof why);
  if (was_auto && M.local_rank == 0 && !o.quiet)
    tool_log("--backend auto -> %s%s%s%s", o.backend == BF_CUDA ? "cuda" : "cpu",
             o.backend == BF_CPU ? " (" : "", o.backend == BF_CPU ? why : "",
             o.backend == BF_CPU ? ")" : "");
  if (!o.threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long t = (cores > 0 ? cores : 1) / (M.local_size > 0 ? M.local_size : 1);
    o.threads = (uint32_t)(t > 0 ? t : 1);
  }
  if (o.have_bounds) {
    o.batch.lo = o.lo;
    o.batch.hi = o.hi;
  }
  tool_catch_stop();

  beam_diag_t d;
  beam_diag_clear(&d);
  bf_input_t in;
  bf_xchg_t x;
  bf_solver_t sv;
  bf_maps_t maps;
  memset(&in, 0, sizeof in);
  memset(&x, 0, sizeof x);
  memset(&sv, 0, sizeof sv);
  memset(&maps, 0, sizeof maps);
  maps.file = -1;
  double *res = NULL, *all = NULL;
  int *rcounts = NULL, *rdispl = NULL;
  char *cmdline = join_args(argc, argv);
  int code = 1;
  uint64_t counts[BEAM_FIT_N_STATUS] = {0};

  int rc = bf_input_open(&in, &o, &d);
  if (!all_ok(rc)) {
    err_global(&d);
    goto out;
  }
  uint64_t tile = o.tile ? o.tile : default_tile(in.T, in.npix, M.size);
  uint64_t f0, f1;
  bf_input_range(&in, M.rank, M.size, &f0, &f1);
  rc = bf_solver_init(&sv, &o, in.T, tile, &d);
  if (!all_ok(rc)) {
    err_global(&d);
    goto out;
  }
  double mem = bf_mem_estimate(in.npix, in.T, f1 - f0, in.esize, tile, M.size, o.np,
                               (int)o.threads, sv.ws_bytes);
  uint64_t t_read = beam_now_ns();
  rc = bf_input_read(&in, f0, f1, &d);
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  t_read = beam_now_ns() - t_read;
  rc = bf_xchg_init(&x, &in, tile, &M, &d);
  const int S = BF_STRIDE(o.np);
  if (rc == 0 && (double)tile * S > (double)INT_MAX)
    rc = BEAM_DIAG(&d, BEAM_ELIMIT, "--tile %llu: a tile's results exceed an MPI count",
                   (unsigned long long)tile);
  if (rc == 0 && !(res = malloc(tile * S * sizeof *res)))
    rc = BEAM_DIAG(&d, BEAM_ENOMEM, "tile results");
  if (rc == 0 && M.rank == 0) {
    all = malloc((size_t)M.size * tile * S * sizeof *all);
    rcounts = calloc((size_t)M.size * 2, sizeof(int));
    rdispl = rcounts ? rcounts + M.size : NULL;
    if (!all || !rcounts)
      rc = BEAM_DIAG(&d, BEAM_ENOMEM, "gather buffers");
    else
      rc = bf_maps_create(&maps, o.output, &o, &in, &M, (int)o.threads, tile, sv.isa, cmdline,
                          &d);
  }
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  prog_t pg = {!o.quiet && (isatty(2) || o.progress), isatty(2), beam_now_ns(), 0};
  uint64_t t_fit = beam_now_ns(), solve_ns = 0;
  int stopped = 0;
  for (uint64_t r = 0; r < x.rounds; r++) {
    uint64_t a, b;
    rc = bf_xchg_round(&x, &in, r, M.comm, &a, &b, &d);
    if (rc == 0) {
      uint64_t s0 = beam_now_ns();
      rc = bf_solve(&sv, &o, in.x, in.T, x.recv, b - a, res, &d);
      solve_ns += beam_now_ns() - s0;
    }
    int flags[2] = {rc < 0, tool_stop != 0};
    MPI_Allreduce(MPI_IN_PLACE, flags, 2, MPI_INT, MPI_MAX, M.comm);
    if (flags[0]) {
      err_local(&d);
      goto out;
    }
    for (uint64_t i = 0; i < b - a; i++)
      counts[(int)res[i * S + 2 * o.np + 4] % BEAM_FIT_N_STATUS]++;
    int n = (int)((b - a) * (uint64_t)S);
    if (M.rank == 0) {
      for (int j = 0; j < M.size; j++) {
        uint64_t t = r * (uint64_t)M.size + (uint64_t)j, ja = t * tile < in.npix ? t * tile : in.npix;
        uint64_t jb = ja + tile < in.npix ? ja + tile : in.npix;
        rcounts[j] = (int)((jb - ja) * (uint64_t)S);
        rdispl[j] = (int)((uint64_t)j * tile * (uint64_t)S);
      }
    }
    MPI_Gatherv(res, n, MPI_DOUBLE, all, rcounts, rdispl, MPI_DOUBLE, 0, M.comm);
    if (M.rank == 0) {
      for (int j = 0; j < M.size && rc == 0; j++) {
        uint64_t t = r * (uint64_t)M.size + (uint64_t)j, ja = t * tile < in.npix ? t * tile : in.npix;
        uint64_t jb = ja + tile < in.npix ? ja + tile : in.npix;
        rc = bf_maps_write(&maps, &in, o.np, ja, jb, all + (size_t)rdispl[j], &d);
      }
    }
    if (!all_ok(rc)) {
      err_local(&d);
      goto out;
    }
    uint64_t done = (r + 1) * (uint64_t)M.size * tile;
    progress(&pg, done < in.npix ? done : in.npix, in.npix, r + 1 == x.rounds);
    if (flags[1]) {
      stopped = 1;
      break;
    }
  }
  double fit_s = (double)(beam_now_ns() - t_fit) / 1e9;
  double total_s = (double)(beam_now_ns() - t_start) / 1e9;
  MPI_Allreduce(MPI_IN_PLACE, counts, BEAM_FIT_N_STATUS, MPI_UINT64_T, MPI_SUM, M.comm);
  double solve_s = (double)solve_ns / 1e9, solve_max = 0, read_s = (double)t_read / 1e9, read_max;
  MPI_Reduce(&solve_s, &solve_max, 1, MPI_DOUBLE, MPI_MAX, 0, M.comm);
  MPI_Reduce(&read_s, &read_max, 1, MPI_DOUBLE, MPI_MAX, 0, M.comm);
  double mem_max = 0;
  MPI_Reduce(&mem, &mem_max, 1, MPI_DOUBLE, MPI_MAX, 0, M.comm);
  if (M.rank == 0) {
    rc = bf_maps_close(&maps, total_s, &d);
    if (rc < 0) {
      err_local(&d);
      goto out;
    }
  }
  if (M.rank == 0 && !o.quiet) {
    tool_log("%llu pixels x %llu frames, %s, %d rank%s x %u thread%s (%s): read %.2f s, "
             "fit+exchange+write %.2f s (fits %.2f s), %.0f fits/s; ~%.0f MiB per rank",
             (unsigned long long)in.npix, (unsigned long long)in.T,
             beam_fit_model_info(o.batch.model)->name, M.size, M.size > 1 ? "s" : "", o.threads,
             o.threads > 1 ? "s" : "", sv.isa, read_max, fit_s, solve_max,
             fit_s > 0 ? (double)in.npix / fit_s : 0, mem_max / 1048576.0);
    char line[512];
    size_t l = 0;
    for (int s = 0; s < BEAM_FIT_N_STATUS; s++)
      if (counts[s])
        l += (size_t)snprintf(line + l, sizeof line - l, " %s %llu", beam_fit_status_name(s),
                              (unsigned long long)counts[s]);
    tool_log("status:%s", line);
  }
  code = stopped ? EXIT_INTERRUPTED : 0;
out:
  if (M.rank == 0 && maps.file >= 0)
    bf_maps_close(&maps, -1, NULL);
  bf_solver_free(&sv);
  bf_xchg_free(&x);
  bf_input_close(&in);
  free(res);
  free(all);
  free(rcounts);
  free(cmdline);
  return finish(code);
}
