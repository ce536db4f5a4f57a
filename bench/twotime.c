/* twotime: CPU time of the `xpcs_twotime` stage for T frames x one ROI of
 * about P pixels, beside the BLAS rate of the same shapes measured in the
 * same run on the same buffer, so the figure says how close the stage is
 * to the machine's GEMM speed.
 *
 * The stage is driven through its ops (init, start, process per frame,
 * end) with a private emitter, as bench/kernels.c does; the ROI is a disk
 * in a square uint16 frame. Then, on the stage's own frame buffer:
 * cblas_?syrk of [T, P] (T^2 P flops: the stage's product in mode full)
 * and cblas_?gemm [T, P] x [P, T] (2 T^2 P flops).
 *
 * With --rows N the stage also publishes c2 row blocks of N rows while
 * the frames arrive (publish_rows): the process time then includes them,
 * and their total is printed beside the final products.
 *
 *   twotime [--frames T] [--pixels P] [--float32] [--rows N] [--backend cpu|cuda]
 *
 * --backend cuda (or --cuda) drives the stage's CUDA backend
 * (beam_xpcs_twotime_cuda_ops) instead: process still gathers on the
 * host (that backend's design), end copies the buffer up once and runs
 * the products with cuBLAS. The CPU BLAS comparison is left out (it says
 * nothing about the GPU, and at T = 10^4 it would take minutes); the
 * table gives the end time with the H2D bytes it moves. One run (end is
 * one-shot per series). Without a device it prints "skipped: no GPU
 * (<reason>)" and exits 0.
 *
 * Prints one table. Memory: T x P x 8 bytes (plus R T^2 x 8 for c2); the
 * same again on the device with --backend cuda. */
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/config.h"
#include "gpu/gpu.h"
#include "bench/bench_stage.h"
#include "pipeline/emit_int.h"
#include "pipeline/kern/xpcs_twotime.h"
#include "pipeline/stage.h"



int main(int argc, char **argv) {
  size_t T = 2000, P = 50000;
  size_t rows = 0;
  int f32 = 0, use_cuda = 0;
  static const struct option lo[] = {{"frames", 1, 0, 't'}, {"pixels", 1, 0, 'p'}, {"float32", 0, 0, 'f'},
                                     {"rows", 1, 0, 'r'},   {"backend", 1, 0, 'b'}, {"cuda", 0, 0, 'c'},
                                     {0, 0, 0, 0}};
  for (int c; (c = getopt_long(argc, argv, "t:p:fr:", lo, NULL)) != -1;) {
    if (c == 't')
      T = strtoull(optarg, NULL, 10);
    else if (c == 'p')
      P = strtoull(optarg, NULL, 10);
    else if (c == 'f')
      f32 = 1;
    else if (c == 'r')
      rows = strtoull(optarg, NULL, 10);
    else if (c == 'c' || (c == 'b' && strcmp(optarg, "cuda") == 0))
      use_cuda = 1;
    else if (c == 'b' && strcmp(optarg, "cpu") == 0)
      use_cuda = 0;
    else {
      fprintf(stderr, "usage: twotime [--frames T] [--pixels P] [--float32] [--rows N] [--backend cpu|cuda]\n");
      return 2;
    }
  }
  if (T < 2 || T > BEAM_X2T_MAX_FRAMES || P < 1 || P > 100000000 || rows > T) {
    fprintf(stderr, "twotime: frames must be 2..%u, pixels 1..1e8, rows 0..frames\n", BEAM_X2T_MAX_FRAMES);
    return 2;
  }
  char dev[256] = "";
  if (use_cuda) {
    char why[256] = "";
    if (beam_gpu_count(why, sizeof why) == 0) {
      printf("skipped: no GPU (%s)\n", why);
      return 0;
    }
    beam_gpu_describe(dev, sizeof dev);
  }
  /* a disk of about P pixels, centred in a square frame */
  double rad = sqrt((double)P / M_PI);
  uint32_t side = (uint32_t)(2 * rad + 4);
  char yaml[512];
  snprintf(yaml, sizeof yaml,
           "{name: tt, kind: xpcs_twotime, backend: %s, mode: full, max_frames: %zu, memory_limit: 1024Gi, "
           "precision: %s, publish_rows: %zu, rois: {center: [%.1f, %.1f], radii: [0, %.6f]}}",
           use_cuda ? "cuda" : "cpu", T, f32 ? "float32" : "float64", rows, side / 2.0, side / 2.0, rad);
  beam_cfg_errs_t errs = {0};
  beam_cnode_t *cfg = beam_yaml_parse(yaml, strlen(yaml), "<twotime>", &errs);
  const beam_stage_kind_t *k = beam_stage_kind_find("xpcs_twotime");
  if (!cfg || !k || beam_cfg_validate(cfg, k->params, "bench stage", &errs) > 0) {
    fprintf(stderr, "twotime: config: %s\n", errs.n ? errs.msgs[0] : "no xpcs_twotime kind");
    return 1;
  }
  beam_stage_t st;
  memset(&st, 0, sizeof st);
  st.ops = use_cuda ? k->cuda : k->cpu;
  st.cfg = cfg;
  snprintf(st.name, sizeof st.name, "tt");
  beam_diag_t d = {0};
  uint32_t shape[2] = {side, side};
  beam_series_t *series = beam_series_new(1, BEAM_DT_U16, 2, shape, NULL, 0);
  beam_indesc_t in = {BEAM_DT_U16, 2, {side, side, 0, 0}};
  if (st.ops->init(&st, &d) < 0 || !series || st.ops->start(&st, series, &in, &d) < 0) {
    fprintf(stderr, "twotime: %s\n", d.msg);
    st.ops->destroy(&st);
    return 1;
  }
  bench_emitter_t em;
  if (bench_emitter_init(&em, &st) < 0) {
    fprintf(stderr, "twotime: out of memory for the outputs\n");
    return 1;
  }
  beam_emit_t e = bench_emit(&em);
  /* the CUDA backend's priv is its own struct: the ROI size comes from
   * the stage's ROI builder on the same config instead */
  beam_x2t_t *x = use_cuda ? NULL : st.priv;
  size_t Pr = 0;
  if (use_cuda) {
    beam_xpcs_rois_t rois;
    memset(&rois, 0, sizeof rois);
    if (beam_xpcs_rois_init(&rois, beam_cfg_get(cfg, "rois"), "twotime", &d) < 0 ||
        beam_xpcs_rois_start(&rois, side, side, series, "twotime", &d) < 0) {
      fprintf(stderr, "twotime: rois: %s\n", d.msg);
      return 1;
    }
    Pr = rois.total;
    beam_xpcs_rois_free(&rois);
  } else
    Pr = x->P;
  /* frames: a few counts per pixel, varying per frame */
  size_t npix = (size_t)side * side;
  uint16_t *img = malloc(npix * sizeof *img);
  beam_frame_t fr;
  memset(&fr, 0, sizeof fr);
  fr.dtype = BEAM_DT_U16, fr.ndim = 2, fr.shape[0] = side, fr.shape[1] = side;
  fr.data = img, fr.nbytes = npix * sizeof *img;
  uint64_t seed = 42;
  double t_frames = 0;
  for (size_t t = 0; t < T; t++) {
    for (size_t p = 0; p < npix; p++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      img[p] = (uint16_t)(seed >> 61);
    }
    fr.frame_id = t;
    double a = bench_now_s();
    if (st.ops->process(&st, &fr, &e) < 0) {
      fprintf(stderr, "twotime: process: %s\n", st.diag.msg);
      return 1;
    }
    t_frames += bench_now_s() - a;
  }
  double a = bench_now_s();
  if (st.ops->end(&st, &e) < 0) {
    fprintf(stderr, "twotime: end: %s\n", st.diag.msg);
    return 1;
  }
  double t_end = bench_now_s() - a;
  double n = (double)T, flops_syrk = n * n * (double)Pr, flops_gemm = 2 * n * n * (double)Pr;
  if (use_cuda) {
    double h2d = n * (double)Pr * (f32 ? 4 : 8);
    printf("xpcs_twotime full, %s, T = %zu frames, one ROI of %zu pixels (%ux%u uint16 frames), backend=cuda on %s\n",
           f32 ? "float32" : "float64", T, Pr, side, side, dev);
    if (rows)
      printf("  %-34s %9.3f s  (%zu blocks of %zu rows)\n", "stage process (gather, row blocks)", t_frames,
             (T + rows - 1) / rows, rows);
    else
      printf("  %-34s %9.3f s  (%.1f us/frame)\n", "stage process (gather, all frames)", t_frames,
             1e6 * t_frames / n);
    printf("  %-34s %9.3f s  (%.1f GFLOP/s as syrk; H2D %.2f GB, c2 %.2f GB back)\n",
           "stage end (H2D, products, c2, g2)", t_end, flops_syrk / t_end * 1e-9, h2d * 1e-9,
           n * n * (f32 ? 4 : 8) * 1e-9);
    printf("  backend=cuda end_s=%.3f process_s=%.3f T=%zu P=%zu prec=%s\n", t_end, t_frames, T, Pr,
           f32 ? "float32" : "float64");
    free(img);
    st.ops->destroy(&st);
    bench_emitter_free(&em);
    beam_series_unref(&series);
    beam_cnode_free(cfg);
    beam_cfg_errs_free(&errs);
    return 0;
  }
  /* the same products on the same buffer, straight to BLAS */
  void *c = malloc(T * T * (f32 ? 4 : 8));
  a = bench_now_s();
  if (f32)
    cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, (blasint)T, (blasint)Pr, 1, x->buf, (blasint)x->P, 0, c,
                (blasint)T);
  else
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, (blasint)T, (blasint)Pr, 1, x->buf, (blasint)x->P, 0, c,
                (blasint)T);
  double t_syrk = bench_now_s() - a;
  a = bench_now_s();
  if (f32)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)T, (blasint)T, (blasint)Pr, 1, x->buf, (blasint)x->P,
                x->buf, (blasint)x->P, 0, c, (blasint)T);
  else
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)T, (blasint)T, (blasint)Pr, 1, x->buf, (blasint)x->P,
                x->buf, (blasint)x->P, 0, c, (blasint)T);
  double t_gemm = bench_now_s() - a;
  printf("xpcs_twotime full, %s, T = %zu frames, one ROI of %zu pixels (%ux%u uint16 frames)\n",
         f32 ? "float32" : "float64", T, Pr, side, side);
  if (rows)
    printf("  %-34s %9.3f s  (%zu blocks of %zu rows)\n", "stage process (gather, row blocks)", t_frames,
           (T + rows - 1) / rows, rows);
  else
    printf("  %-34s %9.3f s  (%.1f us/frame)\n", "stage process (gather, all frames)", t_frames, 1e6 * t_frames / n);
  printf("  %-34s %9.3f s  (%.1f GFLOP/s as syrk)\n", "stage end (products, c2, g2)", t_end, flops_syrk / t_end * 1e-9);
  printf("  %-34s %9.3f s  (%.1f GFLOP/s)\n", "cblas syrk [T,P] same buffer", t_syrk, flops_syrk / t_syrk * 1e-9);
  printf("  %-34s %9.3f s  (%.1f GFLOP/s)\n", "cblas gemm [T,P]x[P,T]", t_gemm, flops_gemm / t_gemm * 1e-9);
  printf("  stage end / syrk = %.2f\n", t_end / t_syrk);
  free(c);
  free(img);
  st.ops->destroy(&st);
  bench_emitter_free(&em);
  beam_series_unref(&series);
  beam_cnode_free(cfg);
  beam_cfg_errs_free(&errs);
  return 0;
}
