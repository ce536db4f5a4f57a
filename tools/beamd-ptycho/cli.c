/* beamd-ptycho's command line: its usage text and the parsing of its
 * options into pt_opts_t (ptycho.h). */
#include "tools/beamd-ptycho/ptycho.h"
#include "tools/common/cli.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pt_usage(FILE *f) {
  fprintf(f,
"usage: beamd-ptycho SCAN.h5 -o RESULT.h5 [options]\n"
"       mpirun -n K beamd-ptycho SCAN.h5 -o RESULT.h5 [options]\n"
"Difference-map ptychography of a scan file (docs/ptycho.md).\n"
"input:\n"
"  --dataset PATH         frames dataset (default /entry/data/data, data_NNNNNN\n"
"                         links, or the only 3-D dataset)\n"
"  --energy EV | --distance M | --pixel-size M   override the file's geometry\n"
"  --n N                  view side, even (default: min(H, W), at most 256)\n"
"  --center Y,X|com       beam centre in pixels (default: the file's, else com)\n"
"  --margin PX            object margin around the scan (default 8)\n"
"initial guesses:\n"
"  --probe mean|zp|FILE[:/dataset]   (default mean: F^-1 of the mean amplitude)\n"
"  --zp-diameter M --zp-outer-zone M --zp-stop M --defocus M   for --probe zp\n"
"  --object flat|FILE[:/dataset]     (default flat)\n"
"engine (pipeline/ptycho/dm.h):\n"
"  --iterations N         (default 100)\n"
"  --algorithm dm|raar    exit-wave update (default raar: DM drifts on noisy data)\n"
"  --beta B               relaxation in (0, 1] (default 0.8; dm 1 = Thibault's DM)\n"
"  --probe-modes M        1..16 (default 1)\n"
"  --object-modes M       1..4 (default 1)\n"
"  --probe-update-start I first iteration updating the probe (default 2)\n"
"  --inner-passes P       object/probe passes per iteration (default 1)\n"
"  --fourier-relax F      PtyPy fourier_relax_factor, 0 = off (default 0)\n"
"  --probe-support F      probe support, fraction of n^2, 0 = off (default 0)\n"
"  --obj-reg R            relative object regulariser (default 1e-3)\n"
"  --probe-reg R          relative probe regulariser (default 1e-3)\n"
"  --precision single|double   (default single)\n"
"  --backend cpu|cuda     (default cpu; cuda: device = local rank)\n"
"  --device D             CUDA device (default: the local MPI rank)\n"
"  --threads T            CPU threads per rank (default: cores / local ranks)\n"
"  --diverge-factor F     stop (exit 3) when the error exceeds F x its minimum\n"
"                         after 5 iterations; 0 = never (default 1000)\n"
"  --max-memory BYTES     per-rank limit (default: MemAvailable / local ranks)\n"
"output:\n"
"  -o, --output FILE      result file (CXI layout, docs/ptycho.md)\n"
"  --png DIR              object amplitude/phase and probe mode amplitudes\n"
"  --progress-every N     plain progress lines when stderr is no terminal\n"
"  --quiet                no progress\n"
"  --help                 this text\n"
"  --version              print the version (beamd's) and exit\n");
}

enum {
  O_DATASET = 256, O_ENERGY, O_DISTANCE, O_PIXEL, O_N, O_CENTER, O_MARGIN, O_PROBE, O_ZPD,
  O_ZPR, O_ZPS, O_DEFOCUS, O_OBJECT, O_ITER, O_BETA, O_ALG, O_PMODES, O_OMODES, O_PSTART, O_INNER,
  O_FRELAX, O_PSUPP, O_OREG, O_PREG, O_PREC, O_BACKEND, O_DEVICE, O_THREADS, O_DIVERGE,
  O_MAXMEM, O_PNG, O_PROGRESS, O_QUIET, O_HELP,
};

static const struct option long_opts[] = {
  {"output", required_argument, 0, 'o'}, {"dataset", required_argument, 0, O_DATASET},
  {"energy", required_argument, 0, O_ENERGY}, {"distance", required_argument, 0, O_DISTANCE},
  {"pixel-size", required_argument, 0, O_PIXEL}, {"n", required_argument, 0, O_N},
  {"center", required_argument, 0, O_CENTER}, {"margin", required_argument, 0, O_MARGIN},
  {"probe", required_argument, 0, O_PROBE}, {"zp-diameter", required_argument, 0, O_ZPD},
  {"zp-outer-zone", required_argument, 0, O_ZPR}, {"zp-stop", required_argument, 0, O_ZPS},
  {"defocus", required_argument, 0, O_DEFOCUS}, {"object", required_argument, 0, O_OBJECT},
  {"iterations", required_argument, 0, O_ITER}, {"beta", required_argument, 0, O_BETA},
  {"algorithm", required_argument, 0, O_ALG},
  {"probe-modes", required_argument, 0, O_PMODES},
  {"object-modes", required_argument, 0, O_OMODES},
  {"probe-update-start", required_argument, 0, O_PSTART},
  {"inner-passes", required_argument, 0, O_INNER},
  {"fourier-relax", required_argument, 0, O_FRELAX},
  {"probe-support", required_argument, 0, O_PSUPP}, {"obj-reg", required_argument, 0, O_OREG},
  {"probe-reg", required_argument, 0, O_PREG}, {"precision", required_argument, 0, O_PREC},
  {"backend", required_argument, 0, O_BACKEND}, {"device", required_argument, 0, O_DEVICE},
  {"threads", required_argument, 0, O_THREADS},
  {"diverge-factor", required_argument, 0, O_DIVERGE},
  {"max-memory", required_argument, 0, O_MAXMEM}, {"png", required_argument, 0, O_PNG},
  {"progress-every", required_argument, 0, O_PROGRESS}, {"quiet", no_argument, 0, O_QUIET},
  {"help", no_argument, 0, O_HELP},
  TOOL_VERSION_LONGOPT, {0, 0, 0, 0},
};

static int parse_center(const char *s, pt_opts_t *o) {
  if (!strcmp(s, "com")) {
    o->center_mode = 1;
    return 0;
  }
  char *end;
  o->cy = strtod(s, &end);
  if (end == s || *end != ',')
    return tool_bad("center", s, "Y,X in pixels, or com");
  const char *xs = end + 1;
  o->cx = strtod(xs, &end);
  if (end == xs || *end || !isfinite(o->cy) || !isfinite(o->cx))
    return tool_bad("center", s, "Y,X in pixels, or com");
  o->center_mode = 2;
  return 0;
}

/* 0, 1 for --help, -1 after printing why (rank 0 prints). */
int pt_parse_args(int argc, char **argv, pt_opts_t *o) {
  uint64_t u;
  double v;
  int c;
  opterr = 0;
  beam_dm_conf_t *k = &o->conf;
  while ((c = getopt_long(argc, argv, "o:", long_opts, NULL)) != -1) {
    switch (c) {
    case 'o': o->output = optarg; break;
    case O_DATASET: o->dataset = optarg; break;
    case O_ENERGY: if (tool_parse_double("energy", optarg, 1, 1e7, "eV in 1..1e7", &o->energy)) return -1; break;
    case O_DISTANCE: if (tool_parse_double("distance", optarg, 1e-6, 1e3, "metres", &o->distance)) return -1; break;
    case O_PIXEL: if (tool_parse_double("pixel-size", optarg, 1e-9, 1e-2, "metres", &o->pixel)) return -1; break;
    case O_N:
      if (tool_parse_u64("n", optarg, 8, 4096, &u)) return -1;
      if (u % 2) return tool_bad("n", optarg, "must be even");
      o->n = (uint32_t)u;
      break;
    case O_CENTER: if (parse_center(optarg, o)) return -1; break;
    case O_MARGIN: if (tool_parse_u64("margin", optarg, 0, 4096, &u)) return -1; o->margin = (uint32_t)u; break;
    case O_PROBE: o->probe_init = optarg; break;
    case O_ZPD: if (tool_parse_double("zp-diameter", optarg, 1e-7, 1e-1, "metres", &o->zp_diam)) return -1; break;
    case O_ZPR: if (tool_parse_double("zp-outer-zone", optarg, 1e-10, 1e-4, "metres", &o->zp_drn)) return -1; break;
    case O_ZPS: if (tool_parse_double("zp-stop", optarg, 0, 1e-1, "metres", &o->zp_cs)) return -1; break;
    case O_DEFOCUS: if (tool_parse_double("defocus", optarg, -1, 1, "metres in -1..1", &o->defocus)) return -1; break;
    case O_OBJECT: o->object_init = optarg; break;
    case O_ITER: if (tool_parse_u64("iterations", optarg, 1, 10000000, &u)) return -1; o->iterations = (uint32_t)u; break;
    case O_BETA: if (tool_parse_double("beta", optarg, 1e-6, 1, "in (0, 1]", &k->beta)) return -1; break;
    case O_ALG:
      if (!strcmp(optarg, "dm")) k->algorithm = BEAM_DM_ALG_DM;
      else if (!strcmp(optarg, "raar")) k->algorithm = BEAM_DM_ALG_RAAR;
      else {
        fprintf(stderr, "beamd-ptycho: --algorithm %s: must be dm or raar\n", optarg);
        return -1;
      }
      break;
    case O_PMODES: if (tool_parse_u64("probe-modes", optarg, 1, BEAM_DM_MAX_PROBE_MODES, &u)) return -1; k->probe_modes = (uint32_t)u; break;
    case O_OMODES: if (tool_parse_u64("object-modes", optarg, 1, BEAM_DM_MAX_OBJECT_MODES, &u)) return -1; k->object_modes = (uint32_t)u; break;
    case O_PSTART: if (tool_parse_u64("probe-update-start", optarg, 0, UINT32_MAX, &u)) return -1; k->probe_update_start = (uint32_t)u; break;
    case O_INNER: if (tool_parse_u64("inner-passes", optarg, 1, 100, &u)) return -1; k->inner_passes = (uint32_t)u; break;
    case O_FRELAX: if (tool_parse_double("fourier-relax", optarg, 0, 10, NULL, &k->fourier_relax)) return -1; break;
    case O_PSUPP: if (tool_parse_double("probe-support", optarg, 0, 10, NULL, &k->probe_support)) return -1; break;
    case O_OREG: if (tool_parse_double("obj-reg", optarg, 0, 1e6, NULL, &k->obj_reg)) return -1; break;
    case O_PREG: if (tool_parse_double("probe-reg", optarg, 0, 1e6, NULL, &k->probe_reg)) return -1; break;
    case O_PREC:
      if (!strcmp(optarg, "single")) k->prec = BEAM_DM_F32;
      else if (!strcmp(optarg, "double")) k->prec = BEAM_DM_F64;
      else return tool_bad("precision", optarg, "single or double");
      break;
    case O_BACKEND:
      if (!strcmp(optarg, "cpu")) o->backend = BEAM_DM_CPU;
      else if (!strcmp(optarg, "cuda")) o->backend = BEAM_DM_CUDA;
      else return tool_bad("backend", optarg, "cpu or cuda");
      break;
    case O_DEVICE: if (tool_parse_u64("device", optarg, 0, 1024, &u)) return -1; k->device = (int)u; o->device_set = 1; break;
    case O_THREADS: if (tool_parse_u64("threads", optarg, 1, 4096, &u)) return -1; k->threads = (int)u; o->threads_set = 1; break;
    case O_DIVERGE:
      if (tool_parse_double("diverge-factor", optarg, 0, 1e300, NULL, &o->diverge)) return -1;
      if (o->diverge > 0 && o->diverge <= 1) return tool_bad("diverge-factor", optarg, "0 (off) or above 1");
      break;
    case O_MAXMEM: if (tool_parse_double("max-memory", optarg, 1, 1e18, "bytes", &v)) return -1; o->max_memory = v; break;
    case O_PNG: o->png_dir = optarg; break;
    case O_PROGRESS: if (tool_parse_u64("progress-every", optarg, 1, UINT32_MAX, &u)) return -1; o->progress_every = (uint32_t)u; break;
    case O_QUIET: o->quiet = 1; break;
    case O_HELP: return 1;
    case TOOL_OPT_VERSION: return TOOL_ARGS_VERSION;
    default: return tool_bad_option(argv, 1);
    }
  }
  if (optind != argc - 1) {
    tool_log(optind >= argc ? "expected one scan file" : "expected one scan file, got '%s' too",
             optind < argc ? argv[optind + 1] : "");
    return -1;
  }
  o->input = argv[optind];
  if (!o->output) {
    tool_log("-o RESULT.h5 is required");
    return -1;
  }
  return 0;
}

