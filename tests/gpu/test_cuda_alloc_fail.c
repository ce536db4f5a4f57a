/* Device-allocation fault injection for every CUDA stage backend, on the
 * host emulation (tests/emu): the n-th cudaMalloc/cudaHostAlloc of a
 * stage's init/start/frame/end path fails, n = 1, 2, ... until the path
 * no longer reaches it. Each failure must end in an error with a message
 * (or be absorbed), destroy must not crash, and no device buffer, pinned
 * buffer, FFT plan, cuBLAS handle or stream may be left alive. The CPU
 * side (malloc) is swept by tests/unit/test_alloc_fail.c. On a real GPU or
 * without the emulation the test skips: it needs the emulation's counter. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "pipeline/device.h"
#include "pipeline/kern/kinds.h"
#include "tests/common/stage_harness.h"
#include "tests/common/runner.h"

/* Defined by tests/emu/emu_rt.cc; weak so the test links (and skips)
 * everywhere else. */
void emu_alloc_fail_arm(long n) __attribute__((weak));
int emu_alloc_fail_hit(void) __attribute__((weak));
long emu_live_objects(void) __attribute__((weak));

#define MAX_SWEEP 2000

typedef struct kind_s {
  const char *kind;
  const beam_stage_ops_t *ops;
  const beam_param_t *params;
  const char *const *kv;
  int pos;
  int frames; /* frames of the series (0: 1) */
} kind_t;

static char labels_p[256];

static int setup(void **state) {
  (void)state;
  enum { H = 32, W = 32 };
  static uint16_t lab[H * W];
  for (int i = 0; i < H * W; i++)
    lab[i] = (uint16_t)(i % 5);
  uint32_t shp[2] = {H, W};
  snprintf(labels_p, sizeof labels_p, "%s/labels.npy", bh_tmpdir());
  return bh_write_npy(labels_p, "<u2", 2, shp, lab, sizeof lab);
}

static beam_cnode_t *cfg_of(const kind_t *k) {
  beam_cnode_t *c = bh_stage_cfg(k->kind);
  bh_set(c, "backend", "cuda");
  bh_set_kv(c, k->kv, labels_p, "");
  char msg[512];
  if (bh_validate(c, k->params, msg, sizeof msg))
    fail_msg("%s config: %s", k->kind, msg);
  return c;
}

static int one_path(const kind_t *k, long n, long base) {
  bh_t *h = bh_alloc(k->ops, cfg_of(k));
  uint32_t shp[2] = {32, 32};
  beam_frame_t *f = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  bh_frame_fill(f, 7, 100);
  if (k->pos)
    f->flags |= BEAM_FLAG_POS;
  beam_diag_t d = {0};
  emu_alloc_fail_arm(n);
  int rc = bh_series(h, f, k->frames ? k->frames : 1, &d);
  int hit = emu_alloc_fail_hit();
  emu_alloc_fail_arm(0);
  if (hit && rc < 0 && !d.msg[0])
    fail_msg("%s cuda: device allocation %ld failed: rc %d without a message", k->kind, n, rc);
  if (!hit && rc < 0)
    fail_msg("%s cuda: rc %d (%s) with no injected failure", k->kind, rc, d.msg);
  bh_frame_free(f);
  bh_free(&h);
  if (emu_live_objects() != base)
    fail_msg("%s cuda: device allocation %ld failing left %ld device objects alive", k->kind, n,
             emu_live_objects() - base);
  return hit;
}

#define KV(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_cuda_stage_kinds(void **state) {
  (void)state;
  if (!emu_alloc_fail_arm || !emu_live_objects) {
    printf("# skipped: needs the host emulation (make CUDA=0 check-gpu-emu)\n");
    skip();
  }
  const kind_t kinds[] = {
      {"correct", &beam_correct_cuda_ops, beam_correct_params, KV("threshold", "1"), 0, 0},
      {"bin", &beam_bin_cuda_ops, beam_bin_params, KV("factor", "2"), 0, 0},
      {"roi_sum", &beam_roi_sum_cuda_ops, beam_roi_sum_params, KV("rois", "@rect"), 0, 0},
      {"preview", &beam_preview_cuda_ops, beam_preview_params, KV("max_size", "16"), 0, 0},
      {"xpcs_multitau", &beam_xpcs_multitau_cuda_ops, beam_xpcs_multitau_params,
       KV("rois", "@labels"), 0, 0},
      {"xpcs_twotime", &beam_xpcs_twotime_cuda_ops, beam_xpcs_twotime_params,
       KV("rois", "@labels", "max_frames", "16"), 0, 0},
      {"pca", &beam_pca_cuda_ops, beam_pca_params, KV("components", "2"), 0, 0},
      {"com", &beam_com_cuda_ops, beam_com_params, KV("r", "8", "scan_shape", "[2, 2]"), 0, 4},
      {"fit", &beam_fit_cuda_ops, beam_fit_params,
       KV("source", "pixels", "model", "exp", "max_frames", "8"), 0, 8},
      {"ptycho_dm", &beam_ptycho_dm_cuda_ops, beam_ptycho_dm_params,
       KV("n", "32", "center", "[16, 16]", "units", "pixels", "scan_extent", "[0, 0, 4, 4]",
          "min_frames", "1", "max_frames", "8", "iterations", "2", "final_iterations", "1"),
       1, 0},
  };
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    long base = emu_live_objects(), n = 1;
    for (; n <= MAX_SWEEP && one_path(&kinds[i], n, base); n++)
      ;
    if (n > MAX_SWEEP)
      fail_msg("%s cuda: more than %d device allocations", kinds[i].kind, MAX_SWEEP);
    if (n == 1)
      fail_msg("%s cuda: no device allocation on its path (is it the CUDA backend?)",
               kinds[i].kind);
    printf("# %-14s %4ld device allocations on init/start/frame/end, each failed in turn\n",
           kinds[i].kind, n - 1);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_cuda_stage_kinds)};
  return beam_run_tests(tests, setup, NULL);
}
