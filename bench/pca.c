/* pca: frames/s of the `pca` stage's CPU backend, driven through its stage
 * ops (init, start, process) with a private emitter, beside the rate of the
 * BLAS calls it is built on (cblas_sgemm / cblas_ssyrk at the stage's own
 * shapes) measured in the same run, so the stage can be judged against what
 * the BLAS can do on this machine.
 *
 * Frames are uint16, a mean plus 3 random patterns with random amplitudes
 * plus noise and, for the robust runs, 0.1 % hot pixels, from a bank of at
 * most 256 frames (and 256 MiB) made once (the stage copies each frame
 * into its batch, so a bank larger than the cache adds nothing).
 *
 *   pca [--frames N] [--cases 256:8:64,512:16:64,2048:32:64] [--robust off|on|both]
 *       [--threads N]
 *
 * A case is side:k:batch[:frames]; frames (timed, rounded up to whole
 * batches, after one untimed batch that builds the first model) defaults
 * to --frames, or 1 batch for frames of 2048^2 and more (whose BLAS-alone
 * figure is then the best of 3 runs, not of 5: one run let a moment of load
 * on a shared machine set the yardstick). --threads calls
 * openblas_set_num_threads (process-wide, as OPENBLAS_NUM_THREADS).
 *
 * Prints one line per case and mode: frames/s, us/frame (wall, and the
 * CPU time of all the process's threads per frame), the stage's GEMM
 * flops per frame and the GFLOP/s that implies, the same BLAS calls alone
 * at the same shapes (GFLOP/s and the frames/s they would allow), and the
 * ratio stage / BLAS alone.
 *
 * --backend cuda (or --cuda) runs the same cases through the stage's CUDA
 * backend (beam_pca_cuda_ops) instead, with the frame bank in pinned host
 * memory as the daemon's frame pool is when a CUDA stage runs: each frame
 * is copied up per process call, as in the daemon. Frames default to
 * --frames for every size (no 1-batch shortcut), the timed pass is
 * repeated --reps times (default 3) and the median is printed, and the
 * line ends with the input rate in GB/s (the H2D copy of the uint16
 * frames) and backend=cuda instead of the CPU BLAS comparison, which says
 * nothing about a GPU. The CUDA backend synchronises once per frame (the
 * non-finite count) and per batch, so the work is done when the loop
 * ends. Without a device it prints "skipped: no GPU (<reason>)" and exits
 * 0. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/config.h"
#include "gpu/gpu.h"
#include "bench/bench_stage.h"
#include "pipeline/kern/pca.h"
#include "pipeline/emit_int.h"
#include "pipeline/stage.h"

#define NBANK 256

static uint64_t rs = 88172645463325252ull;
static double urand(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return ((rs >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Seconds for the BLAS products of one batch, best of reps: the calls
 * pca_cpu.c makes, at their shapes: V V^T and the scores (ssyrk k x k x P,
 * sgemm b x k x P), the Gram matrix of the m = k + b rows of M (ssyrk) and
 * the new components (sgemm k x P x m), and with robust, at each of the
 * T = iters steps, E = S V at the noise subsample (sgemm b x NSAMP x k) and
 * over the batch (b x P x k). With robust the scores and every E product
 * are timed both ways, as one call each and in the stage's chunks of
 * BEAM_PCA_RCHUNK pixels (E into a scratch of one chunk except on the last
 * step, the scores summed over chunks), and the faster kept: the
 * yardstick is the best this BLAS does for the same products, so the
 * stage's choice of chunking is never credited to it. (One call is faster
 * at 256^2, the chunks at 512^2.) */
static double blas_rate(size_t P, size_t k, size_t b, int iters, int reps, double *flops) {
  size_t m = k + b, ns = P < BEAM_PCA_NSAMP ? P : BEAM_PCA_NSAMP;
  float *M = malloc(m * P * sizeof *M), *R = malloc(b * P * sizeof *R), *V = malloc(k * P * sizeof *V);
  float *S = malloc(b * k * sizeof *S), *G = malloc(m * m * sizeof *G), *W = malloc(k * m * sizeof *W);
  float *Gv = malloc(k * k * sizeof *Gv), *Vs = malloc(k * ns * sizeof *Vs), *Es = malloc(b * ns * sizeof *Es);
  float *Ec = calloc(b * BEAM_PCA_RCHUNK, sizeof *Ec);
  if (!M || !R || !V || !S || !G || !W || !Gv || !Vs || !Es || !Ec) {
    fprintf(stderr, "pca: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < m * P; i++)
    M[i] = (float)urand();
  for (size_t i = 0; i < b * P; i++)
    R[i] = (float)urand();
  for (size_t i = 0; i < k * P; i++)
    V[i] = (float)urand();
  for (size_t i = 0; i < k * m; i++)
    W[i] = (float)urand();
  for (size_t i = 0; i < k * ns; i++)
    Vs[i] = (float)urand();
  *flops = ((double)k * (k + 1) + 2.0 * b * k + (double)m * (m + 1) + 2.0 * k * m + iters * 2.0 * b * k) * (double)P +
           iters * 2.0 * b * k * (double)ns;
  double best = 1e30;
  for (int rep = 0; rep < 2 * reps; rep++) {
    const int chunked = rep & 1;
    uint64_t t0 = bench_now_ns();
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)k, (int)P, 1.0f, V, (int)P, 0.0f, Gv, (int)k);
    if (!chunked || !iters)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)k, (int)P, 1.0f, R, (int)P, V,
                  (int)P, 0.0f, S, (int)k);
    for (size_t p0 = 0; chunked && iters && p0 < P; p0 += BEAM_PCA_RCHUNK) {
      size_t w = p0 + BEAM_PCA_RCHUNK < P ? BEAM_PCA_RCHUNK : P - p0;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)k, (int)w, 1.0f, R + p0, (int)P,
                  V + p0, (int)P, p0 ? 1.0f : 0.0f, S, (int)k);
    }
    for (int t = 0; t < iters; t++) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)ns, (int)k, 1.0f, S, (int)k, Vs,
                  (int)ns, 0.0f, Es, (int)ns);
      if (!chunked)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)P, (int)k, 1.0f, S, (int)k, V,
                    (int)P, 0.0f, R, (int)P);
      for (size_t p0 = 0; chunked && p0 < P; p0 += BEAM_PCA_RCHUNK) {
        size_t w = p0 + BEAM_PCA_RCHUNK < P ? BEAM_PCA_RCHUNK : P - p0;
        int last = t + 1 == iters;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)w, (int)k, 1.0f, S, (int)k, V + p0,
                    (int)P, 0.0f, last ? R + p0 : Ec, last ? (int)P : (int)w);
      }
    }
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)m, (int)P, 1.0f, M, (int)P, 0.0f, G, (int)m);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)k, (int)P, (int)m, 1.0f, W, (int)m, M, (int)P,
                0.0f, V, (int)P);
    double t = (double)(bench_now_ns() - t0) * 1e-9;
    best = t < best ? t : best;
  }
  free(M), free(R), free(V), free(S), free(G), free(W), free(Gv), free(Vs), free(Es), free(Ec);
  return best;
}

#define ITERS 3 /* robust_iterations, the default */

static int use_cuda; /* --backend cuda */
static int cuda_reps = 3;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void free_case(beam_frame_t *bank, int nbank, bench_emitter_t *em, beam_series_t **series, beam_cnode_t *cfg) {
  for (int f = 0; f < nbank; f++)
    if (use_cuda)
      beam_host_free(bank[f].data, 1);
    else
      free(bank[f].data);
  free(bank);
  bench_emitter_free(em);
  beam_series_unref(series);
  beam_cnode_free(cfg);
}

/* The timed part of a case on the CUDA backend: cuda_reps passes of
 * nframes (whole batches), median frames/s. */
static int run_cuda(beam_stage_t *st, beam_emit_t *e, beam_frame_t *bank, int nbank, uint32_t side, uint32_t k,
                    uint32_t b, size_t nframes, int robust, beam_cnode_t *cfg, beam_series_t *series,
                    bench_emitter_t *em) {
  double t[16], tc[16];
  int reps = cuda_reps, rc = 0;
  for (int r = 0; r < reps && rc == 0; r++) {
    uint64_t t0 = bench_now_ns(), c0 = bench_cpu_ns();
    for (size_t i = 0; i < nframes; i++) {
      if (st->ops->process(st, &bank[i % nbank], e) < 0) {
        fprintf(stderr, "pca: process (cuda): %s\n", st->diag.msg);
        rc = -1;
        break;
      }
    }
    t[r] = (double)(bench_now_ns() - t0) * 1e-9;
    tc[r] = (double)(bench_cpu_ns() - c0) * 1e-9;
  }
  if (rc == 0 && st->ops->end(st, e) < 0) {
    fprintf(stderr, "pca: end (cuda): %s\n", st->diag.msg);
    rc = -1;
  }
  st->ops->destroy(st);
  if (rc == 0) {
    double ts[16];
    memcpy(ts, t, sizeof ts);
    qsort(ts, (size_t)reps, sizeof *ts, cmp_double);
    double tm = ts[reps / 2], tcm = 0;
    for (int r = 0; r < reps; r++)
      if (t[r] == tm)
        tcm = tc[r];
    size_t P = (size_t)side * side, m = k + b + 1;
    int iters = robust ? ITERS : 0;
    /* the formula the CPU line used before the CPU dropped the (k + b + 1)-th
     * row of M: the CUDA backend keeps that row */
    double flops = (2.0 * b * k + (double)m * (m + 1) + 2.0 * k * m + iters * 2.0 * b * k) * (double)P;
    double fps = (double)nframes / tm, per_frame_flops = flops / b;
    printf("%4ux%-4u k=%-2u b=%-3u %-6s %5zu fr  %8.1f frames/s  %9.1f us/frame (cpu %9.1f)  %7.1f MFLOP/frame  "
           "stage %6.1f GFLOP/s  input %6.2f GB/s  median of %d (%.1f..%.1f frames/s)  backend=cuda\n",
           side, side, k, b, robust ? "robust" : "plain", nframes, fps, 1e6 / fps, 1e6 * tcm / (double)nframes,
           per_frame_flops * 1e-6, per_frame_flops * fps * 1e-9, fps * (double)P * sizeof(uint16_t) * 1e-9, reps,
           (double)nframes / ts[reps - 1], (double)nframes / ts[0]);
    fflush(stdout);
  }
  free_case(bank, nbank, em, &series, cfg);
  return rc;
}

static int run_case(uint32_t side, uint32_t k, uint32_t b, size_t nframes, int robust) {
  char yaml[256];
  snprintf(yaml, sizeof yaml,
           "{name: p, kind: pca, components: %u, batch: %u, denoised_rate: 0, publish_every: 1000000000, "
           "robust: %s, robust_iterations: %d}",
           k, b, robust ? "true" : "false", ITERS);
  beam_cfg_errs_t errs = {0};
  beam_cnode_t *cfg = beam_yaml_parse(yaml, strlen(yaml), "<bench>", &errs);
  const beam_stage_kind_t *kind = beam_stage_kind_find("pca");
  if (!cfg || !kind || beam_cfg_validate(cfg, kind->params, "bench", &errs) > 0) {
    fprintf(stderr, "pca: bad config: %s\n", errs.n ? errs.msgs[0] : "(parse)");
    return -1;
  }
  beam_cfg_errs_free(&errs);
  beam_stage_t st;
  memset(&st, 0, sizeof st);
  st.ops = use_cuda ? kind->cuda : kind->cpu;
  st.cfg = cfg;
  snprintf(st.name, sizeof st.name, "p");
  beam_diag_t d = {0};
  uint32_t shape[2] = {side, side};
  beam_indesc_t in = {BEAM_DT_U16, 2, {side, side, 0, 0}};
  beam_series_t *series = beam_series_new(1, BEAM_DT_U16, 2, shape, NULL, 0);
  if (st.ops->init(&st, &d) < 0 || st.ops->start(&st, series, &in, &d) < 0) {
    fprintf(stderr, "pca: %s\n", d.msg);
    st.ops->destroy(&st);
    return -1;
  }
  bench_emitter_t em;
  if (bench_emitter_init(&em, &st) < 0) {
    fprintf(stderr, "pca: out of memory for the outputs\n");
    st.ops->destroy(&st);
    return -1;
  }
  beam_emit_t e = bench_emit(&em);
  size_t P = (size_t)side * side;
  int nbank = NBANK;
  while (nbank > 8 && (size_t)nbank * P * sizeof(uint16_t) > ((size_t)256 << 20))
    nbank /= 2;
  beam_frame_t *bank = calloc(nbank, sizeof *bank);
  float *pat = malloc(3 * P * sizeof *pat);
  for (size_t i = 0; i < 3 * P; i++)
    pat[i] = (float)(50 * urand());
  for (int f = 0; f < nbank; f++) {
    uint16_t *px = use_cuda ? beam_host_alloc(P * sizeof *px, 1) : malloc(P * sizeof *px);
    if (!px) {
      fprintf(stderr, "pca: out of %s memory for the frame bank\n", use_cuda ? "pinned" : "host");
      return -1;
    }
    double a[3] = {urand(), urand(), urand()};
    for (size_t i = 0; i < P; i++)
      px[i] = (uint16_t)(100 + a[0] * pat[i] + a[1] * pat[P + i] + a[2] * pat[2 * P + i] + 10 * urand() +
                         (robust && urand() < 1e-3 ? 5000 : 0));
    bank[f].data = px;
    bank[f].dtype = BEAM_DT_U16;
    bank[f].ndim = 2;
    bank[f].shape[0] = bank[f].shape[1] = side;
    bank[f].nbytes = P * sizeof *px;
    bank[f].frame_id = (uint64_t)f;
  }
  /* One batch to build the first model (that batch is not scored). */
  for (uint32_t i = 0; i < b; i++)
    st.ops->process(&st, &bank[i % nbank], &e);
  nframes = (nframes + b - 1) / b * b;
  if (use_cuda) {
    free(pat);
    return run_cuda(&st, &e, bank, nbank, side, k, b, nframes, robust, cfg, series, &em);
  }
  uint64_t t0 = bench_now_ns(), c0 = bench_cpu_ns();
  for (size_t i = 0; i < nframes; i++) {
    if (st.ops->process(&st, &bank[i % nbank], &e) < 0) {
      fprintf(stderr, "pca: process: %s\n", st.diag.msg);
      return -1;
    }
  }
  double t = (double)(bench_now_ns() - t0) * 1e-9, tc = (double)(bench_cpu_ns() - c0) * 1e-9;
  /* The stage's buffers go before the BLAS-alone run allocates its own. */
  st.ops->end(&st, &e);
  st.ops->destroy(&st);
  double flops, tb = blas_rate(P, k, b, robust ? ITERS : 0, P >= ((size_t)1 << 22) ? 3 : 5, &flops);
  double fps = (double)nframes / t, per_frame_flops = flops / b;
  printf("%4ux%-4u k=%-2u b=%-3u %-6s %5zu fr  %8.1f frames/s  %9.1f us/frame (cpu %9.1f)  %7.1f MFLOP/frame  "
         "stage %6.1f GFLOP/s  BLAS alone %6.1f GFLOP/s (%8.1f frames/s)  ratio %.2f\n",
         side, side, k, b, robust ? "robust" : "plain", nframes, fps, 1e6 / fps, 1e6 * tc / (double)nframes,
         per_frame_flops * 1e-6,
         per_frame_flops * fps * 1e-9, flops / tb * 1e-9, b / tb, fps * tb / b);
  fflush(stdout);
  for (int f = 0; f < nbank; f++)
    free(bank[f].data);
  free(bank);
  free(pat);
  bench_emitter_free(&em);
  beam_series_unref(&series);
  beam_cnode_free(cfg);
  return 0;
}

int main(int argc, char **argv) {
  size_t frames = 1024;
  const char *cases = "256:8:64,512:16:64,2048:32:64";
  int modes = 3; /* bit 0 plain, bit 1 robust */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--frames") == 0 && i + 1 < argc)
      frames = (size_t)strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc)
      cases = argv[++i];
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      openblas_set_num_threads(atoi(argv[++i]));
    else if (strcmp(argv[i], "--robust") == 0 && i + 1 < argc) {
      const char *m = argv[++i];
      modes = strcmp(m, "off") == 0 ? 1 : strcmp(m, "on") == 0 ? 2 : strcmp(m, "both") == 0 ? 3 : 0;
      if (!modes) {
        fprintf(stderr, "pca: --robust off|on|both\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      const char *bk = argv[++i];
      if (strcmp(bk, "cpu") != 0 && strcmp(bk, "cuda") != 0) {
        fprintf(stderr, "pca: --backend cpu|cuda\n");
        return 2;
      }
      use_cuda = strcmp(bk, "cuda") == 0;
    } else if (strcmp(argv[i], "--cuda") == 0)
      use_cuda = 1;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      cuda_reps = atoi(argv[++i]);
      if (cuda_reps < 1 || cuda_reps > 16) {
        fprintf(stderr, "pca: --reps 1..16\n");
        return 2;
      }
    } else {
      fprintf(stderr, "usage: pca [--frames N] [--cases side:k:batch[:frames],...] [--robust off|on|both] "
                      "[--threads N] [--backend cpu|cuda] [--reps N]\n");
      return 2;
    }
  }
  if (use_cuda) {
    char why[256] = "", dev[256];
    if (beam_gpu_count(why, sizeof why) == 0) {
      printf("skipped: no GPU (%s)\n", why);
      return 0;
    }
    beam_gpu_describe(dev, sizeof dev);
    printf("pca stage, CUDA backend on %s; frames from pinned host memory, copied up per frame; "
           "input = uint16 frame bytes per second\n",
           dev);
  } else {
    printf("pca stage, CPU backend (OpenBLAS, %d threads); BLAS alone = the batch's sgemm/ssyrk calls "
           "(robust: + %d x sgemm b x P x k, whole or in chunks, the faster, and b x NSAMP x k); "
           "ratio = stage / BLAS alone\n",
           openblas_get_num_threads(), ITERS);
  }
  char *list = strdup(cases);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    unsigned side, k, b;
    unsigned long long nf = 0;
    int got = sscanf(tok, "%u:%u:%u:%llu", &side, &k, &b, &nf);
    if (got < 3) {
      fprintf(stderr, "pca: bad case \"%s\" (side:k:batch[:frames])\n", tok);
      return 2;
    }
    size_t n = got == 4 ? (size_t)nf : frames;
    if (got < 4 && !use_cuda && (size_t)side * side >= ((size_t)1 << 22))
      n = b; /* the CPU needs seconds per batch at this size */
    for (int r = 0; r < 2; r++)
      if ((modes >> r & 1) && run_case(side, k, b, n, r) < 0)
        return 1;
  }
  free(list);
  return 0;
}
