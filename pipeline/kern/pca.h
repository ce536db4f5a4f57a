/* Stage kind `pca`: streaming PCA of frames by incremental SVD with a
 * running mean (Ross et al. 2008, "Incremental learning for robust visual
 * tracking"; the same update as scikit-learn's IncrementalPCA), shared by
 * pca_cpu.c and gpu/pca_cuda.cu.
 *
 * Frames are preprocessed (crop and n x n sum binning with bin.h, a pixel
 * mask that drops pixels, optionally the Anscombe transform 2 sqrt(x + 3/8))
 * into a vector of P kept pixels and collected into batches of b. When a
 * batch is full (or the series ends):
 *   1. score the batch against the model of all earlier frames:
 *      C = X - mu, S = C V^T (b x k), R = C - S V, residual = |R_j| / sqrt(P);
 *   2. forget: s *= f, n *= f (and the total scatter by f^2, like s^2);
 *   3. M = [diag(s) V ; X - mu_b ; sqrt(n b / (n + b)) (mu - mu_b)]
 *      ((k + b + 1) x P); G = M M^T; G = U L U^T (host, double);
 *      s_i = sqrt(l_i), V_i = U_i^T M / s_i for the k largest l_i;
 *      mu = (n mu + b mu_b) / (n + b), n += b.
 * Step 3 never forms a P x P matrix; the scoring and both products are
 * GEMMs over the batch (the CPU backend gets the same scatter from rows
 * centred on mu, without a pass that centres them on mu_b: pca_cpu.c
 * update). Frames are therefore scored (and their results
 * emitted) once their batch is complete: b frames of latency, and the
 * first `warmup` (at least b) frames of a series get no per-frame result.
 *
 * Sign of each component: chosen so that U_i . (M 1) >= 0, i.e. the
 * component's pixel sum has the sign of the data's; deterministic on
 * every backend up to rounding of a sum that is rarely near 0.
 *
 * `robust` (low-rank + sparse, after ORPCA, Feng, Xu, Yan 2013, in a
 * batched form): before step 1, each frame x of the batch is split as
 * x = y + s against the model (mu, V) of the earlier frames by T
 * (`robust_iterations`) alternating steps, s_0 = 0:
 *      a_t = V (x - s_t - mu) = A0 - s_t V^T         (A0 = V (x - mu): one GEMM)
 *      e_t = x - mu - V^T a_t                       (b x P x k GEMM)
 *      s_{t+1} = soft(e_t, tau_j),  soft(e, t) = sign(e) max(|e| - t, 0)
 * with tau_j = robust_lambda * sigma_j, sigma_j = 1.4826 MAD of e_t over a
 * subsample of at most BEAM_PCA_NSAMP pixels of frame j (runs of 16
 * spread over the frame, beam_pca_samp_idx; 1.2533 x the mean absolute
 * deviation when the MAD is 0), taken again at every step: e_0 still
 * holds each spike's leak through the projection. Then y = x - s_T
 * replaces x everywhere: scores a = V (y - mu), residual |y - mu - V^T a|,
 * the update's M and batch mean. The first batch of a series has no model:
 * it is split once against the per-pixel median of the batch (e_0 =
 * x - median). After scoring, a frame whose robust z (as the ANOMALY flag
 * uses it) exceeds `robust_reject` is left out of the update, unless more
 * than half of the batch does (a change of regime is learnt, not refused).
 * The CPU and CUDA backends run the same steps (the CPU takes s_t V^T from
 * the nonzeros of s_t, the CUDA backend by a GEMM). */
#ifndef BEAM_KERN_PCA_H
#define BEAM_KERN_PCA_H

#include "pipeline/array.h"
#include "pipeline/kern/bin.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_PCA_KMAX 32
#define BEAM_PCA_BMAX 1024
#define BEAM_PCA_WIN 256 /* residuals kept for the running median / MAD */

/* Output indices (declaration order). */
enum {
  BEAM_PCA_OUT_SCORES = 0,
  BEAM_PCA_OUT_RESIDUAL,
  BEAM_PCA_OUT_DENOISED,
  BEAM_PCA_OUT_COMPONENTS,
  BEAM_PCA_OUT_MEAN,
  BEAM_PCA_OUT_SV,
  BEAM_PCA_OUT_EVR,
  BEAM_PCA_OUT_SPARSE, /* declared only with robust */
  BEAM_PCA_NOUTS
};

#define BEAM_PCA_NSAMP 2048 /* pixels per frame for the robust noise scale */
/* CPU backend: pixels per chunk of the robust split's E = S V (pca_cpu.c);
 * bench/pca.c times the same calls. */
#define BEAM_PCA_RCHUNK 8192

typedef struct beam_pca_conf_s {
  uint32_t k, b;
  double forget;
  uint64_t warmup;
  beam_bin_conf_t bin; /* factor 1 and no crop when `bin` is absent */
  beam_array_t mask;   /* data NULL when not configured; != 0 = excluded */
  int poisson;
  double anomaly_threshold; /* robust z (median / 1.4826 MAD); 0 = off */
  double anomaly_abs;       /* absolute residual; 0 = off */
  double denoised_rate;     /* Hz; 0 = never */
  uint64_t publish_every;
  int robust;
  double robust_lambda;    /* soft threshold in units of the frame's noise sigma */
  uint32_t robust_iters;   /* T */
  double robust_reject;    /* robust z above which a frame skips the update; 0 = never */
} beam_pca_conf_t;

/* Host state of one stage. Matrices are row-major float; M holds the batch
 * frames in rows k .. k+b-1 as they arrive. */
typedef struct beam_pca_host_s {
  beam_pca_conf_t conf;
  beam_indesc_t in;
  beam_bin_geom_t geom;
  uint32_t oh, ow; /* preprocessed image shape */
  size_t P;        /* kept pixels */
  uint32_t *keep;  /* P indices into the oh x ow image */
  uint32_t m;      /* k + b + 1 */
  /* model */
  float *mu, *V;          /* P, k x P */
  double s[BEAM_PCA_KMAX];
  double n_seen, scatter; /* (forgotten) frame count and total scatter */
  int have_model;
  /* batch */
  float *M, *S, *res;     /* m x P, b x k, b */
  beam_frame_t *ident;    /* b identities (no pixels) */
  uint32_t nb;
  /* small problem, host side */
  float *Gf;    /* m x m from the GEMM */
  double *G, *w, *rowsum;
  float *W;     /* k x m: V_new = W M */
  double *work; /* dsyevd workspace */
  int *iwork;
  size_t lwork, liwork;
  /* scratch */
  float *img;  /* oh x ow */
  double *acc; /* bin scratch, ow */
  float *mub;  /* P: batch mean (CPU: the sums while the batch fills) */
  /* counters */
  uint64_t nframes, nreject;
  uint64_t t_denoised_ns, pub_mark;
  int denoised_any;
  double win[BEAM_PCA_WIN], wsort[BEAM_PCA_WIN];
  size_t nwin, wpos;
  double wmed, wscale; /* of the window, per batch */
  /* robust (allocated only with conf.robust) */
  double *zb;      /* b: robust z of each frame of the batch (emit_batch) */
  uint8_t *rej;    /* b: 1 = left out of the update */
  float *tau;      /* b: soft threshold of each frame */
  float *samp;     /* BEAM_PCA_NSAMP: scratch for the MAD */
  float *ctr;      /* P: the first batch's per-pixel median (CPU) */
  float *colb;     /* 16 x b: the columns of 16 pixels, for their medians (CPU) */
  uint64_t nrejected; /* frames left out of the update, this series */
} beam_pca_host_t;

/* init: parameters, mask file; k <= b checked. Nothing stays allocated on
 * failure. */
int beam_pca_conf_load(beam_pca_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_pca_conf_free(beam_pca_conf_t *c);

/* start: geometry (crop, bin, mask shape), k <= P, host buffers (host_bufs:
 * 0 for a backend that keeps M, R, V on the device), outputs declared,
 * model reset. */
int beam_pca_host_start(beam_stage_t *self, beam_pca_host_t *h, const beam_indesc_t *in,
                        int host_bufs, beam_diag_t *d);
void beam_pca_host_free(beam_pca_host_t *h);

/* Preprocessing after binning: img (oh x ow floats) -> row of P kept
 * pixels (Anscombe when poisson). Returns the number of non-finite kept
 * pixels (the frame is then rejected). */
size_t beam_pca_gather(const beam_pca_host_t *h, const float *img, float *row);

/* The small eigenproblem: h->Gf (the upper triangle of the mrows x mrows
 * Gram matrix M M^T, leading dimension m) and h->rowsum (M 1) -> h->s (k),
 * h->W (k x m, row i = U_i^T / s_i over the first mrows columns, zero for
 * negligible eigenvalues). Uses only preallocated workspace. */
int beam_pca_core(beam_pca_host_t *h, uint32_t mrows, beam_diag_t *d);

/* After a batch has been scored (h->S, h->res filled for nb rows), emit the
 * per-frame results: scores and residual (ANOMALY flag where due), and
 * denoised when the rate allows; denoise_row(ctx, j, out) writes frame j's
 * low-rank image (P kept pixels) into out, sparse_row (robust only, else
 * NULL) its sparse part, emitted with the denoised frame. Fills h->zb
 * when robust. */
void beam_pca_emit_batch(beam_pca_host_t *h, beam_emit_t *emit,
                         void (*denoise_row)(void *ctx, uint32_t j, float *out),
                         void (*sparse_row)(void *ctx, uint32_t j, float *out), void *ctx);

/* Robust noise scale of one residual row of P pixels (see the header):
 * 1.4826 MAD over the subsample, else 1.2533 x the mean absolute
 * deviation, else 0. scratch: BEAM_PCA_NSAMP floats. */
float beam_pca_sigma(size_t P, const float *e, float *scratch);

/* The same from a subsample already gathered (n <= BEAM_PCA_NSAMP values,
 * overwritten): for a backend that gathers on the device. */
float beam_pca_sigma_of(float *v, size_t n);

/* Subsample pixel i (0 <= i < n) of a row of P: n = min(P, NSAMP); every
 * pixel when P <= NSAMP, else one run of 16 neighbouring pixels (a cache
 * line) in each of NSAMP / 16 equal segments of the row, at a position in
 * the segment that a multiplicative hash of the segment number picks
 * (stratified: the whole detector is seen, and the runs do not all fall in
 * the same image columns when the segment is a whole number of rows). */
#define BEAM_PCA_SAMP_RUN 16
static inline size_t beam_pca_samp_n(size_t P) { return P < BEAM_PCA_NSAMP ? P : BEAM_PCA_NSAMP; }
static inline size_t beam_pca_samp_run0(size_t P, size_t r) {
  size_t seg = P / (BEAM_PCA_NSAMP / BEAM_PCA_SAMP_RUN);
  return r * seg + (size_t)((uint32_t)(r * 2654435761u) % (uint32_t)(seg - BEAM_PCA_SAMP_RUN + 1));
}
static inline size_t beam_pca_samp_idx(size_t P, size_t i) {
  if (P <= BEAM_PCA_NSAMP)
    return i;
  return beam_pca_samp_run0(P, i / BEAM_PCA_SAMP_RUN) + i % BEAM_PCA_SAMP_RUN;
}

/* Median of v[0..n) (left as it is), 1 <= n <= BEAM_PCA_NSAMP. */
float beam_pca_median(float *v, size_t n);

/* Robust mode, after emit_batch: marks in h->rej the frames to leave out
 * of the update (robust z > robust_reject, unless more than half of the nb
 * frames are) and returns how many. */
uint32_t beam_pca_rejects(beam_pca_host_t *h);

/* components, mean, singular values, explained variance ratio (the model
 * on the host: h->V, h->mu). flags: PARTIAL or FINAL. */
void beam_pca_emit_model(beam_pca_host_t *h, beam_emit_t *emit, uint32_t flags);

/* Robust z of residual r: (r - median) / (1.4826 MAD) of the residual
 * window as of the last emitted batch (NaN while it holds fewer than 8). */
double beam_pca_robust_z(const beam_pca_host_t *h, double r);

#ifdef __cplusplus
}
#endif
#endif
