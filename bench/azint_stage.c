/* Benchmark driver for stage kind `azint` (bench/azint.py runs it): the CPU
 * stage through its ops, no graph or socket, on H x W uint16 frames
 * (default 2167 x 2070, 4.5 Mpx) with the geometry and settings bench/azint.py
 * gives pyFAI. Prints the CSR build time (series start) and the median
 * frames/s of --reps runs of --frames frames each, one line of JSON.
 *
 *   azint_stage [--h H] [--w W] [--npt N] [--split none|bbox] [--threads T]
 *               [--frames F] [--reps R] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_stage.h"
#include "daemon/config.h"
#include "pipeline/cfg.h"
#include "pipeline/emit_int.h"
#include "pipeline/kern/azint.h"
#include "pipeline/stage.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  unsigned H = 2167, W = 2070, npt = 1000, threads = 1, frames = 10, reps = 3;
  const char *split = "bbox";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--h")) H = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--w")) W = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--npt")) npt = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--frames")) frames = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--reps")) reps = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--split")) split = argv[i + 1];
    else {
      fprintf(stderr, "azint_stage: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (reps < 1 || reps > 64 || frames < 1 || !H || !W) {
    fprintf(stderr, "azint_stage: bad --reps/--frames/--h/--w\n");
    return 2;
  }
  /* Pilatus-like 172 um pixels, PONI near the centre, slightly tilted:
   * the same numbers bench/azint.py gives pyFAI. */
  char yaml[512];
  snprintf(yaml, sizeof yaml,
           "{name: b, kind: azint, dist: 0.3, poni1: %.9g, poni2: %.9g, rot1: 0.01, rot2: 0.02, "
           "rot3: 0, wavelength: 1.0e-10, pixel1: 0.000172, pixel2: 0.000172, npt: %u, "
           "split: %s, polarization_factor: 0.99, error_model: poisson, threads: %u}",
           0.45 * H * 172e-6, 0.52 * W * 172e-6, npt, split, threads);
  beam_cfg_errs_t errs = {0};
  beam_cnode_t *cfg = beam_yaml_parse(yaml, strlen(yaml), "<bench>", &errs);
  const beam_stage_kind_t *k = beam_stage_kind_find("azint");
  if (!cfg || !k || beam_cfg_validate(cfg, k->params, "bench", &errs) > 0) {
    fprintf(stderr, "azint_stage: bad config %s: %s\n", yaml, errs.n ? errs.msgs[0] : "");
    return 1;
  }
  beam_stage_t st;
  memset(&st, 0, sizeof st);
  st.ops = k->cpu;
  st.cfg = cfg;
  snprintf(st.name, sizeof st.name, "b");
  beam_diag_t d = {0};
  uint32_t shape[2] = {H, W};
  beam_series_t *series = beam_series_new(1, BEAM_DT_U16, 2, shape, NULL, 0);
  beam_indesc_t in = {BEAM_DT_U16, 2, {H, W, 0, 0}};
  double t0 = bench_now_s();
  if (st.ops->init(&st, &d) < 0 || st.ops->start(&st, series, &in, &d) < 0) {
    fprintf(stderr, "azint_stage: %s\n", d.msg);
    st.ops->destroy(&st);
    return 1;
  }
  double build_s = bench_now_s() - t0;
  bench_emitter_t em;
  if (bench_emitter_init(&em, &st) < 0)
    return 1;
  beam_emit_t e = bench_emit(&em);
  enum { BANK = 2 };
  beam_frame_t f[BANK];
  uint64_t seed = 7;
  for (int b = 0; b < BANK; b++) {
    memset(&f[b], 0, sizeof f[b]);
    f[b].dtype = BEAM_DT_U16, f[b].ndim = 2, f[b].shape[0] = H, f[b].shape[1] = W;
    f[b].nbytes = f[b].cap = (size_t)H * W * 2;
    f[b].data = malloc(f[b].nbytes);
    if (!f[b].data)
      return 1;
    uint16_t *v = f[b].data;
    for (size_t p = 0; p < (size_t)H * W; p++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      v[p] = (uint16_t)(100 + (seed >> 54));
    }
  }
  double fps[64];
  for (unsigned r = 0; r < reps; r++) {
    double a = bench_now_s();
    for (unsigned i = 0; i < frames; i++) {
      f[i % BANK].frame_id = i;
      if (st.ops->process(&st, &f[i % BANK], &e) < 0) {
        fprintf(stderr, "azint_stage: process: %s\n", st.diag.msg);
        return 1;
      }
    }
    fps[r] = frames / (bench_now_s() - a);
  }
  qsort(fps, reps, sizeof *fps, cmp_d);
  printf("{\"h\": %u, \"w\": %u, \"npt\": %u, \"split\": \"%s\", \"threads\": %u, \"frames\": %u, "
         "\"reps\": %u, \"build_s\": %.3f, \"fps_median\": %.3f, \"fps_all\": [",
         H, W, npt, split, threads, frames, reps, build_s, fps[reps / 2]);
  for (unsigned r = 0; r < reps; r++)
    printf("%s%.3f", r ? ", " : "", fps[r]);
  printf("]}\n");
  st.ops->destroy(&st);
  for (int b = 0; b < BANK; b++)
    free(f[b].data);
  bench_emitter_free(&em);
  beam_series_unref(&series);
  beam_cnode_free(cfg);
  beam_cfg_errs_free(&errs);
  return 0;
}
