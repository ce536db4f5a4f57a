/* Allocation fault injection (issue: "the N-th allocation fails, swept over
 * every init path"). For every stage kind's CPU backend, and for the
 * daemon's start-up, each allocation of the path is made to fail in turn
 * (tests/common/failalloc.c, linked with --wrap): N = 1, 2, ... until the
 * path completes without reaching the N-th allocation. Each failure must
 * be clean: an error code with a message, destroy (or beamd_fini) runs
 * without a crash, and under ASan (CI) nothing leaks. The daemon must
 * also leave nothing running: its thread count returns to what it was.
 *
 * Paths: stage init + start (the per-series buffers) + one frame + end,
 * the same as a series through the graph; beamd_init (config already
 * loaded: loading is its own, fuzzed, path) with a graph of several kinds
 * on ipc endpoints. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/beamd.h"
#include "daemon/config.h"
#include "daemon/stage_record.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/failalloc.h"
#include "tests/common/stage_harness.h"

#define MAX_SWEEP 20000 /* allocations on one path; a path with more is a test bug */

typedef struct kind_s {
  const char *kind;
  const beam_stage_ops_t *ops;
  const beam_param_t *params;
  const char *const *kv; /* key, value pairs of the stage config */
  beam_dtype_t dt;
  uint32_t h, w;
  int pos; /* frames carry a scan position */
} kind_t;

static char labels_p[256], rec_dir[256];

static int setup(void **state) {
  (void)state;
  enum { H = 32, W = 32 };
  static uint16_t lab[H * W];
  for (int i = 0; i < H * W; i++)
    lab[i] = (uint16_t)(i % 5);
  uint32_t shp[2] = {H, W};
  snprintf(labels_p, sizeof labels_p, "%s/labels.npy", bh_tmpdir());
  snprintf(rec_dir, sizeof rec_dir, "%s", bh_tmpdir());
  return bh_write_npy(labels_p, "<u2", 2, shp, lab, sizeof lab);
}

static beam_cnode_t *cfg_of(const kind_t *k) {
  beam_cnode_t *c = bh_stage_cfg(k->kind);
  bh_set_kv(c, k->kv, labels_p, rec_dir);
  char msg[512];
  if (bh_validate(c, k->params, msg, sizeof msg))
    fail_msg("%s config: %s", k->kind, msg);
  return c;
}

/* One series through the stage with the n-th allocation failing (n = 0:
 * none). Returns 1 when the injected failure was reached. */
static int one_path(const kind_t *k, long n, long *allocs) {
  beam_cnode_t *cfg = cfg_of(k);
  bh_t *h = bh_alloc(k->ops, cfg);
  uint32_t shp[2] = {k->h, k->w};
  beam_frame_t *f = bh_frame_new(k->dt, 2, shp, 0);
  bh_frame_fill(f, 7, 100);
  if (k->pos) {
    f->flags |= BEAM_FLAG_POS;
    f->pos[0] = f->pos[1] = 0;
  }
  beam_diag_t d = {0};
  failalloc_arm(n);
  int rc = bh_series(h, f, 1, &d);
  int hit = failalloc_hit();
  *allocs = failalloc_count();
  failalloc_arm(0);
  if (hit) {
    /* A failed allocation may surface as an error, or be absorbed where
     * the stage can go on without it (a dropped result is counted); it
     * must never crash, and an error must say what failed. */
    if (rc < 0 && !d.msg[0])
      fail_msg("%s: allocation %ld failed: rc %d without a message", k->kind, n, rc);
  } else if (rc < 0) {
    fail_msg("%s: rc %d (%s) with no injected failure", k->kind, rc, d.msg);
  }
  bh_frame_free(f);
  bh_free(&h);
  return hit;
}

static void sweep(const kind_t *k) {
  long total = 0;
  one_path(k, 0, &total);
  assert_true(total > 0);
  long n = 1;
  for (; n <= MAX_SWEEP; n++) {
    long seen;
    if (!one_path(k, n, &seen))
      break;
  }
  if (n > MAX_SWEEP)
    fail_msg("%s: more than %d allocations", k->kind, MAX_SWEEP);
  printf("# %-14s %5ld allocations on init/start/frame/end, each failed in turn\n", k->kind,
         n - 1);
}

#define KV(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_stage_kinds(void **state) {
  (void)state;
  const kind_t kinds[] = {
      {"correct", &beam_correct_cpu_ops, beam_correct_params, KV("threshold", "1"), BEAM_DT_U16,
       32, 32, 0},
      {"bin", &beam_bin_cpu_ops, beam_bin_params, KV("factor", "2"), BEAM_DT_U16, 32, 32, 0},
      {"roi_sum", &beam_roi_sum_cpu_ops, beam_roi_sum_params,
       KV("rois", "@rect"), BEAM_DT_U16, 32, 32, 0},
      {"preview", &beam_preview_cpu_ops, beam_preview_params, KV("max_size", "16"), BEAM_DT_U16, 32,
       32, 0},
      {"xpcs_multitau", &beam_xpcs_multitau_cpu_ops, beam_xpcs_multitau_params,
       KV("rois", "@labels", "threads", "2"), BEAM_DT_U16, 32, 32, 0},
      {"xpcs_twotime", &beam_xpcs_twotime_cpu_ops, beam_xpcs_twotime_params,
       KV("rois", "@labels", "max_frames", "16"), BEAM_DT_U16, 32, 32, 0},
      {"pca", &beam_pca_cpu_ops, beam_pca_params, KV("components", "2"), BEAM_DT_U16, 32, 32, 0},
      {"azint", &beam_azint_cpu_ops, beam_azint_params,
       KV("dist", "0.1", "poni1", "0.0016", "poni2", "0.0016", "wavelength", "1e-10", "pixel1", "1e-4",
          "pixel2", "1e-4", "npt", "16", "npt_azim", "4", "threads", "2"), BEAM_DT_U16, 32, 32, 0},
      {"fit", &beam_fit_cpu_ops, beam_fit_params,
       KV("source", "pixels", "model", "poly", "degree", "1", "max_frames", "8", "threads", "2"),
       BEAM_DT_U16, 32, 32, 0},
      {"ptycho_dm", &beam_ptycho_dm_cpu_ops, beam_ptycho_dm_params,
       KV("n", "32", "center", "[16, 16]", "units", "pixels", "scan_extent", "[0, 0, 4, 4]",
          "min_frames", "1", "max_frames", "8", "iterations", "2", "final_iterations", "1",
          "threads", "1"),
       BEAM_DT_U16, 32, 32, 1},
      {"com", &beam_com_cpu_ops, beam_com_params,
       KV("r", "8", "scan_shape", "[2, 2]", "image_every", "2"), BEAM_DT_U16, 32, 32, 0},
      {"record", &beam_record_cpu_ops, beam_record_params, KV("dir", "@dir"), BEAM_DT_U16, 32,
       32, 0},
  };
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
    sweep(&kinds[i]);
}

static void *idle_thread(void *arg) { return arg; }

static int threads_now(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Threads:", 8))
      n = atoi(line + 8);
  if (f)
    fclose(f);
  return n;
}

static void test_daemon_start_up(void **state) {
  (void)state;
  char yaml[2048];
  const char *t = bh_tmpdir();
  snprintf(yaml, sizeof yaml,
           "input: {mode: pull, endpoint: \"ipc://%s/in\"}\n"
           "output: {publish: \"ipc://%s/pub\", push: \"ipc://%s/push\"}\n"
           "control: {endpoint: \"ipc://%s/ctl\"}\n"
           "metrics: {listen: \"\"}\n"
           "pool: {frames: 8, frame_bytes: 64Ki}\n"
           "log: {level: crit}\n"
           "stages:\n"
           "  - {name: corr, kind: correct, backend: cpu, threshold: 1}\n"
           "  - {name: vd, kind: roi_sum, input: corr, backend: cpu,\n"
           "     rois: [{name: a, shape: rect, rect: [0, 0, 8, 8]}]}\n"
           "  - {name: g2, kind: xpcs_multitau, backend: cpu, rois: {file: \"%s\"}}\n"
           "  - {name: prev, kind: preview, input: corr, backend: cpu}\n",
           t, t, t, t, labels_p);
  /* A sanitizer runtime may start a thread of its own at the process's
   * first pthread_create (ThreadSanitizer does): have it happen before the
   * baseline. */
  pthread_t warm;
  if (pthread_create(&warm, NULL, idle_thread, NULL) == 0)
    pthread_join(warm, NULL);
  int base = threads_now();
  long n = 1, total = 0;
  for (; n <= MAX_SWEEP; n++) {
    beam_cfg_errs_t errs = {0};
    beam_config_t *cfg = NULL;
    if (beam_config_load_string(yaml, strlen(yaml), "sweep.yaml", &cfg, &errs) != 0)
      fail_msg("config: %s", errs.n ? errs.msgs[0] : "?");
    beam_cfg_errs_free(&errs);
    static beamd_t d;
    memset(&d, 0, sizeof d);
    char err[1024] = "";
    failalloc_arm(n);
    int rc = beamd_init(&d, cfg, "sweep.yaml", err, sizeof err);
    int hit = failalloc_hit();
    total = failalloc_count();
    failalloc_arm(0);
    if (hit && rc == 0) {
      /* absorbed (a log line that could not be formatted, say): fine */
    } else if (hit && !err[0]) {
      fail_msg("beamd_init: allocation %ld failed: rc %d without a message", n, rc);
    } else if (!hit && rc < 0) {
      fail_msg("beamd_init failed with no injected failure: %s", err);
    }
    beamd_fini(&d);
    if (threads_now() != base)
      fail_msg("beamd_init with allocation %ld failing left %d threads running (had %d)", n,
               threads_now(), base);
    if (!hit)
      break;
  }
  if (n > MAX_SWEEP)
    fail_msg("beamd_init: more than %d allocations", MAX_SWEEP);
  printf("# beamd_init     %5ld allocations, each failed in turn (%ld on the full path)\n",
         n - 1, total);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stage_kinds),
      cmocka_unit_test(test_daemon_start_up),
  };
  return beam_run_tests(tests, setup, NULL);
}
