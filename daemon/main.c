/* beamd: the processing daemon's entry point. Parses arguments, loads and
 * validates the configuration (or the built-in default), starts the daemon
 * and runs its loop until a drain completes. Never daemonises itself: under
 * systemd it is Type=notify. */
#include <getopt.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "daemon/beamd.h"
#include "pipeline/device.h"
#include "daemon/h5array.h"
#include "daemon/stage_list.h"
#include "daemon/stage_record.h"
#include "pipeline/array.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: beamd [-c FILE] [options]\n"
          "  -c, --config FILE          configuration (default: the built-in default config)\n"
          "      --check-config FILE    validate FILE, print it normalised, exit 0 (valid) or 1\n"
          "  -q, --quiet                with --check-config: print only errors (for ExecStartPre)\n"
          "      --print-default-config print the built-in default configuration and exit\n"
          "      --list-stages          every stage kind with its keys (type, default, range)\n"
          "      --describe-stage KIND  one stage kind with every key it takes\n"
          "  -l, --log-level LEVEL      override log.level (err, warning, notice, info, debug)\n"
          "  -V, --version              print version and build features\n"
          "  -h, --help                 this help\n"
          "Signals: SIGTERM/SIGINT drain and exit, SIGHUP reloads the config file.\n"
          "Control: beamd-ctl status|stats|reload|stop (control.endpoint).\n");
}

static int print_errors(const beam_cfg_errs_t *errs) {
  for (size_t i = 0; i < errs->n; i++)
    fprintf(stderr, "%s\n", errs->msgs[i]);
  fprintf(stderr, "%zu error%s\n", errs->n, errs->n == 1 ? "" : "s");
  return 1;
}

static int check_config(const char *path, int quiet) {
  beam_cfg_errs_t errs = {0};
  beam_config_t *cfg = NULL;
  int rc = beam_config_load_file(path, &cfg, &errs);
  if (rc < 0) {
    print_errors(&errs);
    beam_cfg_errs_free(&errs);
    return 1;
  }
  if (!quiet) {
    char *dump = beam_cfg_dump(cfg->root);
    printf("%s", dump ? dump : "");
    free(dump);
    fprintf(stderr, "%s: configuration is valid (%zu stages)\n", path, cfg->nstages);
  }
  beam_config_free(&cfg);
  beam_cfg_errs_free(&errs);
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"config", required_argument, 0, 'c'},       {"check-config", required_argument, 0, 'k'},
      {"print-default-config", no_argument, 0, 'p'}, {"log-level", required_argument, 0, 'l'},
      {"version", no_argument, 0, 'V'},            {"help", no_argument, 0, 'h'},
      {"quiet", no_argument, 0, 'q'},
      {"list-stages", no_argument, 0, 'L'}, {"describe-stage", required_argument, 0, 'D'},
      {0, 0, 0, 0}};
  const char *cfg_path = NULL, *level = NULL, *check = NULL;
  int c, quiet = 0;
  beam_log_init("beamd");
  /* ZeroMQ allocates every received frame; above glibc's default mmap
   * threshold each one is a fresh mmap whose pages fault in while the
   * kernel copies into them, then a munmap. Keeping frame-sized blocks on
   * the heap lets them be reused (measured: half the page faults). */
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  /* Frames are allocated by ZeroMQ's I/O thread and freed by stage
   * workers: with per-thread arenas the I/O thread's 64 MiB heaps were
   * unmapped and faulted in again (replay of 2048x2048 frames: 231k faults
   * for 256 frames, 70 frames/s; one arena: 3-6x faster). */
  mallopt(M_ARENA_MAX, 1);
  beam_h5array_register();
  beam_record_stage_register();
  while ((c = getopt_long(argc, argv, "c:l:Vhq", opts, NULL)) != -1) {
    switch (c) {
    case 'c': cfg_path = optarg; break;
    case 'k': check = optarg; break;
    case 'q': quiet = 1; break;
    case 'p': fputs(beam_config_default_yaml(), stdout); return 0;
    /* After beam_record_stage_register above, so `record` is listed. */
    case 'L': beamd_stage_list(stdout); return 0;
    case 'D': return beamd_stage_describe(stdout, stderr, optarg);
    case 'l': level = optarg; break;
    case 'V': {
      char gpu[256];
      beam_gpu_describe(gpu, sizeof gpu);
      printf("beamd %s (protocol v%d.%d, CUDA %s, gpu: %s)\n", BEAMD_VERSION, BEAM_PROTO_MAJOR,
             BEAM_PROTO_MINOR, beam_gpu_built() ? "built" : "not built", gpu);
      return 0;
    }
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "beamd: unexpected argument \"%s\"\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (check)
    return check_config(check, quiet);
  beam_cfg_errs_t errs = {0};
  beam_config_t *cfg = NULL;
  int rc = cfg_path ? beam_config_load_file(cfg_path, &cfg, &errs)
                    : beam_config_load_string(beam_config_default_yaml(),
                                              strlen(beam_config_default_yaml()), "<built-in>", &cfg, &errs);
  if (rc < 0) {
    print_errors(&errs);
    beam_cfg_errs_free(&errs);
    fprintf(stderr, "beamd: configuration refused, not starting\n");
    return 1;
  }
  beam_cfg_errs_free(&errs);
  if (level) {
    int lv = beam_log_level_from_name(level);
    if (lv < 0) {
      fprintf(stderr, "beamd: unknown log level \"%s\"\n", level);
      beam_config_free(&cfg);
      return 2;
    }
    cfg->log.level = lv;
  }
  static beamd_t d;
  char err[1024] = "";
  if (beamd_init(&d, cfg, cfg_path, err, sizeof err) < 0) {
    BEAM_LOG(LOG_ERR, "start-up failed: %s", err);
    beamd_fini(&d);
    return 1;
  }
  rc = beamd_run(&d);
  beamd_fini(&d);
  return rc;
}
