/* pca: frames/s of the `pca` stage's CPU backend, driven through its stage
 * ops (init, start, process) with a private emitter, beside the rate of the
 * BLAS calls it is built on (cblas_sgemm / cblas_ssyrk at the stage's own
 * shapes) measured in the same run, so the stage can be judged against what
 * the BLAS can do on this machine.
 *
 * Frames are uint16, a mean plus 3 random patterns with random amplitudes
 * plus noise, from a bank of 256 frames made once (the stage copies each
 * frame into its batch, so a bank larger than the cache adds nothing).
 *
 *   pca [--frames N] [--cases 256:8:64,512:16:64,...]   case = side:k:batch
 *
 * Prints one line per case: frames/s, us/frame, the stage's GEMM flops per
 * frame and the GFLOP/s that implies, and the BLAS GFLOP/s at the same
 * shapes. */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/config.h"
#include "pipeline/emit_int.h"
#include "pipeline/stage.h"

#define NBANK 256

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef struct emitter_s {
  beam_frame_t outs[BEAM_STAGE_MAX_OUTS];
  uint64_t puts;
} emitter_t;

static beam_frame_t *em_get(void *ctx, unsigned out) {
  emitter_t *e = ctx;
  return out < BEAM_STAGE_MAX_OUTS && e->outs[out].data ? &e->outs[out] : NULL;
}
static void em_put(void *ctx, beam_frame_t *f) {
  (void)f;
  ((emitter_t *)ctx)->puts++;
}
static void em_drop(void *ctx, beam_frame_t *f) { (void)ctx, (void)f; }

static uint64_t rs = 88172645463325252ull;
static double urand(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return ((rs >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/* Seconds for the three BLAS products of one batch (the calls pca_cpu.c
 * makes: scores, Gram matrix, new components), best of 5. */
static double blas_rate(size_t P, size_t k, size_t b, double *flops) {
  size_t m = k + b + 1;
  float *M = malloc(m * P * sizeof *M), *R = malloc(b * P * sizeof *R), *V = malloc(k * P * sizeof *V);
  float *S = malloc(b * k * sizeof *S), *G = malloc(m * m * sizeof *G), *W = malloc(k * m * sizeof *W);
  if (!M || !R || !V || !S || !G || !W) {
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
  *flops = (2.0 * b * k + (double)m * (m + 1) + 2.0 * k * m) * (double)P;
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    uint64_t t0 = now_ns();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)k, (int)P, 1.0f, R, (int)P, V, (int)P,
                0.0f, S, (int)k);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)m, (int)P, 1.0f, M, (int)P, 0.0f, G, (int)m);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)k, (int)P, (int)m, 1.0f, W, (int)m, M, (int)P,
                0.0f, V, (int)P);
    double t = (double)(now_ns() - t0) * 1e-9;
    best = t < best ? t : best;
  }
  free(M), free(R), free(V), free(S), free(G), free(W);
  return best;
}

static int run_case(uint32_t side, uint32_t k, uint32_t b, size_t nframes) {
  char yaml[256];
  snprintf(yaml, sizeof yaml,
           "{name: p, kind: pca, components: %u, batch: %u, denoised_rate: 0, publish_every: 1000000000}", k, b);
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
  st.ops = kind->cpu;
  st.cfg = cfg;
  snprintf(st.name, sizeof st.name, "p");
  beam_diag_t d = {0};
  uint32_t shape[2] = {side, side};
  beam_indesc_t in = {BEAM_DT_U16, 2, {side, side, 0, 0}};
  beam_series_t *series = beam_series_new(1, BEAM_DT_U16, 2, shape, NULL, 0);
  if (st.ops->init(&st, &d) < 0 || st.ops->start(&st, series, &in, &d) < 0) {
    fprintf(stderr, "pca: %s\n", d.msg);
    return -1;
  }
  emitter_t em;
  memset(&em, 0, sizeof em);
  for (unsigned o = 0; o < st.nouts; o++) {
    size_t nb = beam_dtype_size(st.outs[o].dtype);
    for (uint32_t i = 0; i < st.outs[o].ndim; i++)
      nb *= st.outs[o].shape[i];
    em.outs[o].data = aligned_alloc(64, (nb + 63) & ~(size_t)63);
    em.outs[o].cap = em.outs[o].nbytes = nb;
  }
  beam_emit_t e = {&em, em_get, em_put, em_drop};
  size_t P = (size_t)side * side;
  beam_frame_t *bank = calloc(NBANK, sizeof *bank);
  float *pat = malloc(3 * P * sizeof *pat);
  for (size_t i = 0; i < 3 * P; i++)
    pat[i] = (float)(50 * urand());
  for (int f = 0; f < NBANK; f++) {
    uint16_t *px = malloc(P * sizeof *px);
    double a[3] = {urand(), urand(), urand()};
    for (size_t i = 0; i < P; i++)
      px[i] = (uint16_t)(100 + a[0] * pat[i] + a[1] * pat[P + i] + a[2] * pat[2 * P + i] + 10 * urand());
    bank[f].data = px;
    bank[f].dtype = BEAM_DT_U16;
    bank[f].ndim = 2;
    bank[f].shape[0] = bank[f].shape[1] = side;
    bank[f].nbytes = P * sizeof *px;
    bank[f].frame_id = (uint64_t)f;
  }
  /* One batch to build the first model (that batch is not scored). */
  for (uint32_t i = 0; i < b; i++)
    st.ops->process(&st, &bank[i % NBANK], &e);
  nframes = (nframes + b - 1) / b * b;
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < nframes; i++) {
    if (st.ops->process(&st, &bank[i % NBANK], &e) < 0) {
      fprintf(stderr, "pca: process: %s\n", st.diag.msg);
      return -1;
    }
  }
  double t = (double)(now_ns() - t0) * 1e-9;
  double flops, tb = blas_rate(P, k, b, &flops);
  double fps = (double)nframes / t, per_frame_flops = flops / b;
  printf("%4ux%-4u k=%-2u b=%-3u  %8.0f frames/s  %8.1f us/frame  %6.1f MFLOP/frame  stage %6.1f GFLOP/s  "
         "BLAS alone %6.1f GFLOP/s (%6.0f frames/s)\n",
         side, side, k, b, fps, 1e6 / fps, per_frame_flops * 1e-6, per_frame_flops * fps * 1e-9,
         flops / tb * 1e-9, b / tb);
  st.ops->end(&st, &e);
  st.ops->destroy(&st);
  for (int f = 0; f < NBANK; f++)
    free(bank[f].data);
  free(bank);
  free(pat);
  for (unsigned o = 0; o < BEAM_STAGE_MAX_OUTS; o++)
    free(em.outs[o].data);
  beam_series_unref(&series);
  beam_cnode_free(cfg);
  return 0;
}

int main(int argc, char **argv) {
  size_t frames = 2048;
  const char *cases = "256:8:64,512:16:64";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--frames") == 0 && i + 1 < argc)
      frames = (size_t)strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--cases") == 0 && i + 1 < argc)
      cases = argv[++i];
    else {
      fprintf(stderr, "usage: pca [--frames N] [--cases side:k:batch,...]\n");
      return 2;
    }
  }
  printf("pca stage, CPU backend (OpenBLAS, %d threads); BLAS alone = the batch's sgemm/ssyrk calls\n",
         openblas_get_num_threads());
  char *list = strdup(cases);
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    unsigned side, k, b;
    if (sscanf(tok, "%u:%u:%u", &side, &k, &b) != 3) {
      fprintf(stderr, "pca: bad case \"%s\" (side:k:batch)\n", tok);
      return 2;
    }
    if (run_case(side, k, b, frames) < 0)
      return 1;
  }
  free(list);
  return 0;
}
