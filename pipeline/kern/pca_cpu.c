/* Stage kind `pca`, CPU backend: the batch update of pca.h with OpenBLAS
 * GEMMs (cblas_sgemm, cblas_ssyrk) and LAPACKE (pca.c), and the stage ops.
 *
 * Frames are binned (bin.h, float out; skipped without crop or binning),
 * masked, transformed and centred on the model's mean mu into their row of
 * M as they arrive, with |x - mu|^2, the row's sum and the batch's pixel
 * sums taken in the same pass while the row is in cache. Per batch of b
 * frames of P pixels, k components, m = k + b rows of M:
 *   score   Gv = V V^T (ssyrk k x k x P), S = (X - mu) V^T (sgemm b x k x P),
 *           residuals from S, Gv and |x - mu|^2
 *   core    G = M M^T (ssyrk m x m x P), recentred on the host (update),
 *           dsyevd (pca.c)
 *   update  V = W M (sgemm k x P x m)
 * about (k^2 + 2 b k + m^2 + 2 k m) P flops, and X is read by the GEMMs
 * only: no centring pass (update). The stage is memory-bound at these
 * sizes (bench/pca.c).
 *
 * robust (pca.h): the split x = y + s runs over the whole batch, A0 =
 * (X - mu) V^T once, then per step the noise scales from a subsample and,
 * chunk by chunk of pixels, E = S V (sgemm b x chunk x k) and one fused
 * pass s = soft(x - mu - E, tau) per frame that also updates the frame's
 * scores from the nonzeros of s (robust_split); the last step keeps s in
 * c->E (b x P more floats) and writes y - mu over the batch rows of M.
 * The split runs on a pool of as many threads as OpenBLAS has
 * (fjpool.h): the noise scales a task per frame, A0 and each step's
 * chunks shared out among the threads, each making its own chunks' GEMMs
 * with OpenBLAS on one thread and the pass over them; the stage's other
 * BLAS calls run on its own thread, threaded by OpenBLAS. Frames arrive
 * converted and centred in one pass (gather_centre). */
#include <cblas.h>
#include "proto/clones.h"
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/pca.h"
#include "pipeline/fjpool.h"


typedef struct cpu_s {
  beam_pca_host_t h;
  int direct;  /* no crop, no binning: gather straight from the input */
  int all;     /* no pixel masked: keep[i] == i */
  double *c2;  /* b: |x_j - mu|^2 against the model the batch is scored with */
  double *xs;  /* b: sum over pixels of x_j - mu */
  float *Gv;   /* k x k: V V^T */
  float *gd;   /* P: g d, when the batch is recentred explicitly (update) */
  float *E;    /* robust: b x P, the sparse parts of the batch */
  float *A0;   /* robust: b x k, (X - mu) V^T */
  float *Ec;   /* robust: a b x RCHUNK scratch per pool thread, S V for a chunk of pixels */
  float *Sn;   /* robust: b x k, the next step's scores */
  float *Snc;  /* robust: per chunk, b x k: the chunk's share of the next scores, less A0 */
  double *xsc, *c2c; /* robust: per chunk, b: the chunk's share of xs and c2 (last step) */
  float *Vs;   /* robust: k x NSAMP, V at the noise subsample */
  float *Es;   /* robust: b x NSAMP, S V there */
  float *sv;   /* robust: NSAMP, one frame's subsample */
  beam_fjpool_t *pool; /* robust: the chunks of the split */
  _Atomic size_t rnext; /* robust: the next chunk to claim */
  int rlast;            /* robust: the split's last step */
  int ra0;              /* robust: the chunks' shares of A0 (in c->Snc) instead of a step */
} cpu_t;

/* Low-rank frame j of the batch just scored: mu + S_j V (the model that
 * scored it; rate-bounded, so a plain loop). */
static void denoise_row(void *ctx, uint32_t j, float *out) {
  beam_pca_host_t *h = ctx;
  size_t P = h->P, k = h->conf.k;
  const float *sj = h->S + (size_t)j * k;
  memcpy(out, h->mu, P * sizeof *out);
  for (size_t i = 0; i < k; i++) {
    const float *v = h->V + i * P;
    float a = sj[i];
    for (size_t p = 0; p < P; p++)
      out[p] += a * v[p];
  }
}

/* Residual |x - mu - S V|^2 expanded with S = V (x - mu): |x - mu|^2 -
 * 2 |S|^2 + S^T (V V^T) S, exact in algebra (V need not be exactly
 * orthonormal), so no b x P residual is formed. In float the loss is about
 * 1e-7 |x - mu|^2 / residual^2 relative: irrelevant unless the residual is
 * below 1e-3 of the frame's deviation (noise-free data), where it is
 * clamped at 0. |x - mu|^2 was summed in double as each frame arrived. */
static void residuals(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k, nb = h->nb;
  double isp = 1.0 / sqrt((double)P);
  for (size_t j = 0; j < nb; j++) {
    float *sj = h->S + j * k;
    double s2 = 0, q = 0;
    for (size_t i = 0; i < k; i++)
      s2 += (double)sj[i] * sj[i];
    for (size_t i = 0; i < k; i++)
      for (size_t l = 0; l < k; l++) {
        float g = i <= l ? c->Gv[i * k + l] : c->Gv[l * k + i];
        q += (double)sj[i] * g * sj[l];
      }
    double r2 = c->c2[j] - 2 * s2 + q;
    h->res[j] = (float)(r2 > 0 ? sqrt(r2) * isp : 0.0);
  }
}

/* The rows of M hold x - mu (centred on the model as they arrived): the
 * scores are one GEMM, S = (X - mu) V^T. */
static void score(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k, nb = h->nb;
  const float *X = h->M + k * P;
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)k, (int)P, 1.0f, h->V, (int)P, 0.0f, c->Gv, (int)k);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)k, (int)P, 1.0f, X, (int)P, h->V, (int)P,
              0.0f, h->S, (int)k);
  residuals(c);
}

/* x[p] = x[p] - m[p] (m NULL: 0) over n pixels (write: stored back), acc[p]
 * += the result (acc not NULL), adding its sum and sum of squares in double
 * to *sum and *sq. Eight independent lanes, written out, so the compiler
 * vectorises without reassociating a reduction (which it may not do to
 * floating point): measured 3x on the centring pass. Inline, so each call
 * with constant flags is its own loop. */
#define LANES 8
static inline void sub_sums(float *restrict x, const float *restrict m, size_t n, int write,
                            float *restrict acc, double *sum, double *sq) {
  double a[LANES] = {0}, q[LANES] = {0};
  size_t p = 0;
  for (; p + LANES <= n; p += LANES)
    for (int l = 0; l < LANES; l++) {
      float v = m ? x[p + l] - m[p + l] : x[p + l];
      if (write)
        x[p + l] = v;
      if (acc)
        acc[p + l] += v;
      a[l] += v;
      q[l] += (double)v * v;
    }
  double s = 0, t = 0;
  for (int l = 0; l < LANES; l++)
    s += a[l], t += q[l];
  for (; p < n; p++) {
    float v = m ? x[p] - m[p] : x[p];
    if (write)
      x[p] = v;
    if (acc)
      acc[p] += v;
    s += v;
    t += (double)v * v;
  }
  *sum += s;
  *sq += t;
}

/* ---- robust split (pca.h) --------------------------------------------------- */

/* soft(e, t) = sign(e) max(|e| - t, 0); written branch-free so it vectorises. */
static inline float soft(float e, float t) {
  float a = fabsf(e) - t;
  return a > 0 ? copysignf(a, e) : 0.0f;
}

/* Pixels per chunk of the robust split: E of a chunk of the batch (b x
 * RCHUNK, 2 MiB at b = 64) stays in cache between its GEMM and the pass
 * over it, and each GEMM still has enough to do (2 b k RCHUNK flops) that
 * the calls cost little. */
#define RCHUNK BEAM_PCA_RCHUNK
/* Pixels per block of the sparse-pixel search (see rpass). */
#define RBLK 64

/* sub_sums(x, s, n, 1, acc, sum, sq) of the robust split's last step,
 * the same arithmetic in the same order, written as one small loop per
 * step without sub_sums's optional operands: gcc 12 vectorises the float
 * to double sums of the AVX2 clone in this form (vcvtps2pd), and leaves
 * them scalar in sub_sums's. */
BEAM_TARGET_CLONES("avx2", "default") static void y_sums(float *restrict x, const float *restrict s,
                                                                     size_t n, float *restrict acc, double *sum,
                                                                     double *sq) {
  double a[LANES] = {0}, q[LANES] = {0};
  size_t p = 0;
  for (; p + LANES <= n; p += LANES) {
    float v[LANES];
    for (int l = 0; l < LANES; l++)
      v[l] = x[p + l] - s[p + l];
    for (int l = 0; l < LANES; l++) {
      x[p + l] = v[l];
      acc[p + l] += v[l];
    }
    for (int l = 0; l < LANES; l++) {
      double d = v[l];
      a[l] += d;
      q[l] += d * d;
    }
  }
  double t = 0, u = 0;
  for (int l = 0; l < LANES; l++)
    t += a[l], u += q[l];
  for (; p < n; p++) {
    float v = x[p] - s[p];
    x[p] = v;
    acc[p] += v;
    t += v;
    u += (double)v * v;
  }
  *sum += t;
  *sq += u;
}

/* The pass over chunk ci = [p0, p0 + n) of the batch, every frame in
 * order. Ec holds S V there (leading dimension ld); s = soft(x - mu - S V,
 * tau) (written over Ec on the last step); each nonzero s_p takes s_p V_p
 * off the frame's share of the next scores from this chunk (row of
 * c->Snc); on the last step y - mu = x - mu - s is written over x, with
 * its sums (the chunk's c->xsc and c->c2c, and h->mub, whose pixels no
 * other chunk touches). Built for AVX2 as well as the baseline: the same
 * operations in the same order (no contraction in ISO C mode), so both
 * give the same bits. */
BEAM_TARGET_CLONES("avx2", "default") static void rpass(cpu_t *c, size_t ci, size_t p0, size_t n,
                                                                    size_t ld, float *Ec) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k, nb = h->nb;
  const float *V = h->V + p0;
  float *X = h->M + k * P + p0, *mub = h->mub + p0, *dS = c->Snc + ci * nb * k;
  double *xs = c->xsc + ci * nb, *c2 = c->c2c + ci * nb;
  memset(dS, 0, nb * k * sizeof *dS);
  for (size_t j = 0; j < nb; j++) {
    float *restrict x = X + j * P, *restrict e = Ec + j * ld, *restrict sj = dS + j * k, tj = h->tau[j];
    /* Most blocks hold no sparse pixel: soft-threshold a block without a
     * branch per pixel, then look pixel by pixel only where it had one.
     * Only the last step keeps s; the others recompute it in the blocks
     * that have one, which saves a store per pixel. */
    for (size_t b0 = 0; b0 < n; b0 += RBLK) {
      size_t b1 = b0 + RBLK < n ? b0 + RBLK : n;
      int any = 0;
      if (c->rlast)
        for (size_t p = b0; p < b1; p++) {
          float v = soft(x[p] - e[p], tj);
          e[p] = v;
          any |= v != 0.0f;
        }
      else /* soft(d, t) != 0 exactly where its |d| - t > 0 */
        for (size_t p = b0; p < b1; p++)
          any |= fabsf(x[p] - e[p]) - tj > 0;
      for (size_t p = b0; any && p < b1; p++) {
        float v = c->rlast ? e[p] : soft(x[p] - e[p], tj);
        if (v != 0.0f)
          for (size_t i = 0; i < k; i++)
            sj[i] -= v * V[i * P + p];
      }
    }
    if (c->rlast) {
      xs[j] = c2[j] = 0;
      y_sums(x, e, n, mub, &xs[j], &c2[j]);
    }
  }
}

/* A pool task: chunks claimed one at a time until none is left, each its
 * E = S V (a GEMM on this thread, into this task's scratch, or on the last
 * step into c->E) and then its pass, while E is still in cache. A task is
 * a thread's share, not a fixed piece of the work: which thread runs a
 * chunk changes nothing in the result, since each chunk's sums have their
 * own rows, added in chunk order after the run. */
static void rchunks(void *ctx, unsigned slot) {
  cpu_t *c = ctx;
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k, nb = h->nb, nch = (P + RCHUNK - 1) / RCHUNK;
  float *scratch = c->Ec + (size_t)slot * h->conf.b * RCHUNK;
  for (size_t ci; (ci = atomic_fetch_add_explicit(&c->rnext, 1, memory_order_relaxed)) < nch;) {
    size_t p0 = ci * RCHUNK, w = p0 + RCHUNK < P ? RCHUNK : P - p0, ld = c->rlast ? P : w;
    if (c->ra0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)k, (int)w, 1.0f, h->M + k * P + p0,
                  (int)P, h->V + p0, (int)P, 0.0f, c->Snc + ci * nb * k, (int)k);
      continue;
    }
    /* The last step keeps s in E, for the sparse output. */
    float *Ec = c->rlast ? c->E + p0 : scratch;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)w, (int)k, 1.0f, h->S, (int)k,
                h->V + p0, (int)P, 0.0f, Ec, (int)ld);
    rpass(c, ci, p0, w, ld, Ec);
  }
}

/* Noise scale of frame j (a task per frame): from its subsample, x - mu -
 * S V there (c->Es holds S V; overwritten). */
static void rsigma(void *ctx, unsigned j) {
  cpu_t *c = ctx;
  beam_pca_host_t *h = &c->h;
  size_t ns = beam_pca_samp_n(h->P);
  float *v = c->Es + (size_t)j * ns;
  const float *xs = h->samp + (size_t)j * ns;
  for (size_t i = 0; i < ns; i++)
    v[i] = xs[i] - v[i];
  h->tau[j] = (float)h->conf.robust_lambda * beam_pca_sigma_of(v, ns);
}

/* Frame j's subsample of x - mu for the noise scale, taken as the frame
 * arrives, while its row is still in cache (from the whole batch at the
 * split, the reads missed the cache: 4 % of the robust stage at 256^2). */
static void robust_samp(cpu_t *c, size_t j) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, ns = beam_pca_samp_n(P);
  const float *x = h->M + (h->conf.k + j) * P;
  float *xs = h->samp + j * ns;
  for (size_t i = 0; i < ns; i++)
    xs[i] = x[beam_pca_samp_idx(P, i)];
}

/* The split x = y + s of every frame of the batch against the current
 * model (or, before the first model, the batch's per-pixel median); the
 * rows of M hold x - mu on entry and y - mu on return, mub their sums, c2
 * and xs each row's sum of squares and sum. With a model, h->S ends as the
 * scores of y.
 *
 * Per step, first the noise scale of every frame from its subsample (that
 * of X gathered as the frames arrived, of V once per batch, E at those
 * pixels by one small GEMM; a task per frame on the pool), then the batch
 * chunk by chunk of pixels, the chunks shared out among the pool's threads
 * (rchunks): E = S V for the chunk (a GEMM into the thread's scratch, which
 * stays in cache) and one pass (rpass) that soft-thresholds e = x - mu - E
 * into s and subtracts s_p V_p from the frame's next scores for every
 * nonzero s_p: S' = A0 - s V^T without a GEMM, since s is sparse (all of
 * it only for a glitch frame, where this costs a GEMV). X is read once per
 * step and E never leaves the cache; the last step writes E (s, for the
 * sparse output) and y - mu = x - mu - s with its sums in the same pass.
 *
 * Each pool thread makes its own chunks' GEMMs, OpenBLAS on one thread
 * for the steps: with OpenBLAS threading each chunk's GEMM on the caller
 * and the pool running the passes between them, the two sets of threads
 * took turns on the cores, and the pool's helpers were asleep again
 * after every GEMM (a third of the stage's time at 256^2, 2 cores). The
 * count is process-wide: it is lowered only from above 1, and put back
 * to what it was, so a stage that finds it at 1 (another split running)
 * leaves it alone; its chunk GEMMs then may be threaded, which costs
 * time, not correctness. A0 is made the same way, chunk by chunk on the
 * pool (each chunk's b x k share in c->Snc, added in chunk order): as one
 * call threaded by OpenBLAS it took twice as long (3 ms a batch at 256^2).
 * V V^T (k x k) stays one threaded call. */
static void robust_split(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  const beam_pca_conf_t *cf = &h->conf;
  size_t P = h->P, k = cf->k, nb = h->nb, ns = beam_pca_samp_n(P);
  float *X = h->M + k * P, *E = c->E;
  const float *V = h->V;
  float lam = (float)cf->robust_lambda;
  memset(h->mub, 0, P * sizeof *h->mub);
  if (h->have_model) {
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)k, (int)P, 1.0f, V, (int)P, 0.0f, c->Gv, (int)k);
    size_t nch = (P + RCHUNK - 1) / RCHUNK;
    int nt = openblas_get_num_threads();
    if (nt > 1)
      openblas_set_num_threads(1);
    c->ra0 = 1;
    atomic_store_explicit(&c->rnext, 0, memory_order_relaxed);
    beam_fjpool_run(c->pool, beam_fjpool_size(c->pool), rchunks, c);
    c->ra0 = 0;
    memcpy(c->A0, c->Snc, nb * k * sizeof *c->A0);
    for (size_t ci = 1; ci < nch; ci++)
      for (size_t q = 0; q < nb * k; q++)
        c->A0[q] += c->Snc[ci * nb * k + q];
    memcpy(h->S, c->A0, nb * k * sizeof *h->S);
    for (size_t i = 0; i < ns; i++) {
      size_t p = beam_pca_samp_idx(P, i);
      for (size_t l = 0; l < k; l++)
        c->Vs[l * ns + i] = V[l * P + p];
    }
    for (uint32_t t = 0; t < cf->robust_iters; t++) {
      int last = t + 1 == cf->robust_iters;
      /* The noise scale from this step's residual: the first step's still
       * carries every spike's leak through the projection (V^T V x_spike,
       * spread over all pixels), which would inflate it. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)ns, (int)k, 1.0f, h->S, (int)k,
                  c->Vs, (int)ns, 0.0f, c->Es, (int)ns);
      beam_fjpool_run(c->pool, (unsigned)nb, rsigma, c);
      if (last)
        for (size_t j = 0; j < nb; j++)
          c->c2[j] = c->xs[j] = 0;
      c->rlast = last;
      atomic_store_explicit(&c->rnext, 0, memory_order_relaxed);
      beam_fjpool_run(c->pool, beam_fjpool_size(c->pool), rchunks, c);
      memcpy(c->Sn, c->A0, nb * k * sizeof *c->Sn);
      for (size_t ci = 0; ci < nch; ci++) {
        const float *d = c->Snc + ci * nb * k;
        for (size_t q = 0; q < nb * k; q++)
          c->Sn[q] += d[q];
        for (size_t j = 0; last && j < nb; j++)
          c->xs[j] += c->xsc[ci * nb + j], c->c2[j] += c->c2c[ci * nb + j];
      }
      memcpy(h->S, c->Sn, nb * k * sizeof *h->S);
    }
    if (nt > 1)
      openblas_set_num_threads(nt);
    return;
  }
  /* No model yet: a rank-0 model centred on the per-pixel median, which a
   * spike in fewer than half of the batch's frames cannot move; the
   * columns gathered 16 pixels (a cache line of each row) at a time. */
  for (size_t p0 = 0; p0 < P; p0 += 16) {
    size_t w = p0 + 16 < P ? 16 : P - p0;
    for (size_t j = 0; j < nb; j++)
      for (size_t q = 0; q < w; q++)
        h->colb[q * nb + j] = X[j * P + p0 + q];
    for (size_t q = 0; q < w; q++)
      h->ctr[p0 + q] = beam_pca_median(h->colb + q * nb, nb);
  }
  for (size_t j = 0; j < nb; j++) {
    float *x = X + j * P, *e = E + j * P;
    for (size_t p = 0; p < P; p++)
      e[p] = x[p] - h->ctr[p];
    float tj = h->tau[j] = lam * beam_pca_sigma(P, e, c->sv);
    for (size_t p = 0; p < P; p++)
      e[p] = soft(e[p], tj);
    c->c2[j] = c->xs[j] = 0;
    sub_sums(x, e, P, 1, h->mub, &c->xs[j], &c->c2[j]);
  }
}

/* Frames marked in h->rej leave the batch before the update: their rows
 * out of the batch sums, the later rows (and their sums) moved up (the
 * sparse parts and identities are not needed any more: the batch was
 * emitted). */
static void robust_drop(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k;
  float *X = h->M + k * P;
  uint32_t w = 0;
  for (uint32_t j = 0; j < h->nb; j++) {
    if (h->rej[j]) {
      const float *x = X + (size_t)j * P;
      for (size_t p = 0; p < P; p++)
        h->mub[p] -= x[p];
      continue;
    }
    if (w != j) {
      memcpy(X + (size_t)w * P, X + (size_t)j * P, P * sizeof *X);
      c->c2[w] = c->c2[j], c->xs[w] = c->xs[j];
    }
    w++;
  }
  h->nb = w;
}

/* G <- L G L^T over the mr x mr upper triangle (leading dimension ld), L
 * the identity except on rows x0 .. mr-1, where L = I - a 1 1^T: in double,
 * from the float Gram matrix, back to float. */
static void gram_shift(float *G, size_t ld, size_t mr, size_t x0, double a, double *R) {
#define GSYM(i, j) (double)((i) <= (j) ? G[(i) * ld + (j)] : G[(j) * ld + (i)])
  double T = 0;
  for (size_t i = 0; i < mr; i++) {
    double r = 0;
    for (size_t j = x0; j < mr; j++)
      r += GSYM(i, j);
    R[i] = r;
  }
  for (size_t i = x0; i < mr; i++)
    T += R[i];
  for (size_t i = 0; i < mr; i++)
    for (size_t j = i < x0 ? x0 : i; j < mr; j++) {
      double g = GSYM(i, j) - a * R[i];
      if (i >= x0)
        g += -a * R[j] + a * a * T;
      G[i * ld + j] = (float)g;
    }
#undef GSYM
}

/* The update of pca.h step 3 without the centring pass over the batch.
 * The rows of M hold x_j - mu (mu: the model's mean, which they were
 * centred on as they arrived); with d their mean and n the (forgotten)
 * frame count, the rows x_j - mu - g d, g = 1 - sqrt(n / (n + b)), have
 * the scatter of pca.h's [X - mu_b ; sqrt(n b / (n + b)) (mu - mu_b)]:
 * sum (x - mu)(x - mu)^T - (2g - g^2) b d d^T, and 2g - g^2 = b / (n + b).
 * That shift is L = I - (g / b) 1 1^T on the batch rows, applied to the
 * Gram matrix (G' = L G L^T, m x m, on the host) and folded into the
 * weights (V = (W L) M), so M is read by the two GEMMs only. Where the
 * shift is more than half the batch's scatter about mu (the first batch,
 * whose mu is 0; a jump of the data), L G L^T would cancel digits, and the
 * rows are recentred in place instead (one pass, as before). */
static int update(cpu_t *c, beam_diag_t *d) {
  beam_pca_host_t *h = &c->h;
  const beam_pca_conf_t *cf = &h->conf;
  size_t P = h->P, k = cf->k, nb = h->nb, mr = k + nb, m = h->m;
  float *M = h->M, *X = M + k * P, *dv = h->mub;
  if (h->have_model) {
    h->n_seen *= cf->forget;
    h->scatter *= cf->forget * cf->forget;
    for (size_t i = 0; i < k; i++)
      h->s[i] *= cf->forget;
  }
  /* Rows 0..k-1: diag(s) V (zero before the first batch) and their sums. */
  for (size_t i = 0; i < k; i++) {
    float si = (float)h->s[i], *row = M + i * P;
    const float *v = h->V + i * P;
    double a[LANES] = {0}, rs = 0;
    size_t p = 0;
    for (; p + LANES <= P; p += LANES)
      for (int l = 0; l < LANES; l++) {
        row[p + l] = si * v[p + l];
        a[l] += v[p + l];
      }
    for (int l = 0; l < LANES; l++)
      rs += a[l];
    for (; p < P; p++) {
      row[p] = si * v[p];
      rs += v[p];
    }
    h->rowsum[i] = si * rs;
  }
  /* mub holds the batch's sums of x - mu: d = their mean. */
  float inb = 1.0f / (float)nb;
  double dd = 0, sc2 = 0;
  for (size_t p = 0; p < P; p++) {
    dv[p] *= inb;
    dd += (double)dv[p] * dv[p];
  }
  for (size_t j = 0; j < nb; j++)
    sc2 += c->c2[j];
  double n = h->n_seen, g = 1.0 - sqrt(n / (n + (double)nb)), shift = (double)nb * nb / (n + nb) * dd;
  int recentre = shift > 0.5 * sc2;
  double a = recentre ? 0.0 : g / (double)nb;
  if (recentre) {
    for (size_t p = 0; p < P; p++)
      c->gd[p] = (float)(g * dv[p]);
    double ss = 0;
    for (size_t j = 0; j < nb; j++) {
      h->rowsum[k + j] = 0;
      sub_sums(X + j * P, c->gd, P, 1, NULL, &h->rowsum[k + j], &ss);
    }
    h->scatter += ss;
  } else {
    for (size_t j = 0; j < nb; j++)
      h->rowsum[k + j] = c->xs[j];
    h->scatter += sc2 - shift;
  }
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)mr, (int)P, 1.0f, M, (int)P, 0.0f, h->Gf, (int)m);
  if (a != 0) {
    gram_shift(h->Gf, m, mr, k, a, h->w); /* w: scratch until the eigensolver */
    double t = 0;
    for (size_t j = k; j < mr; j++)
      t += h->rowsum[j];
    for (size_t j = k; j < mr; j++)
      h->rowsum[j] -= a * t;
  }
  int rc = beam_pca_core(h, (uint32_t)mr, d);
  if (rc < 0)
    return rc;
  if (a != 0)
    for (size_t i = 0; i < k; i++) {
      float *wr = h->W + i * m;
      double t = 0;
      for (size_t j = k; j < mr; j++)
        t += wr[j];
      for (size_t j = k; j < mr; j++)
        wr[j] = (float)(wr[j] - a * t);
    }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)k, (int)P, (int)mr, 1.0f, h->W, (int)m, M, (int)P,
              0.0f, h->V, (int)P);
  /* mu + b / (n + b) d = (n mu + b mu_b) / (n + b). */
  double wb = (double)nb / (n + (double)nb);
  for (size_t p = 0; p < P; p++) {
    h->mu[p] = (float)(h->mu[p] + wb * dv[p]);
    dv[p] = 0;
  }
  h->n_seen = n + (double)nb;
  h->have_model = 1;
  return 0;
}

/* Scores and emits the batch against the model so far, then folds it in. */
static void sparse_row(void *ctx, uint32_t j, float *out) {
  cpu_t *c = ctx;
  memcpy(out, c->E + (size_t)j * c->h.P, c->h.P * sizeof *out);
}

static void denoise_row_c(void *ctx, uint32_t j, float *out) { denoise_row(&((cpu_t *)ctx)->h, j, out); }

static int batch(beam_stage_t *self, cpu_t *c, beam_emit_t *emit) {
  beam_pca_host_t *h = &c->h;
  if (h->nb == 0)
    return 0;
  int robust = h->conf.robust;
  if (robust)
    robust_split(c);
  if (h->have_model) {
    if (robust) {
      residuals(c);
      beam_pca_emit_batch(h, emit, denoise_row_c, sparse_row, c);
    } else {
      score(c);
      beam_pca_emit_batch(h, emit, denoise_row, NULL, h);
    }
  }
  int rc = 0;
  if (robust && h->have_model && beam_pca_rejects(h) > 0)
    robust_drop(c);
  if (h->nb > 0)
    rc = update(c, &self->diag);
  else
    memset(h->mub, 0, h->P * sizeof *h->mub);
  h->nb = 0;
  if (rc < 0)
    return rc;
  uint64_t mark = h->nframes / h->conf.publish_every;
  if (mark != h->pub_mark) {
    h->pub_mark = mark;
    beam_pca_emit_model(h, emit, BEAM_FLAG_PARTIAL);
  }
  return 0;
}

/* ---- stage ops ------------------------------------------------------------ */

/* The per-series buffers, freed and cleared (a new series sizes them again). */
static void free_buffers(cpu_t *s) {
  free(s->c2);
  free(s->xs);
  free(s->Gv);
  free(s->gd);
  free(s->E);
  free(s->A0);
  free(s->Sn);
  free(s->Vs);
  free(s->Es);
  free(s->Ec);
  free(s->Snc);
  free(s->xsc);
  free(s->c2c);
  free(s->sv);
  s->c2 = s->xs = NULL;
  s->Gv = s->gd = NULL;
  s->E = s->A0 = s->Sn = s->Vs = s->Es = s->Ec = s->Snc = s->sv = NULL;
  s->xsc = s->c2c = NULL;
}

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *s = self->priv;
  if (!s)
    return;
  beam_pca_host_free(&s->h);
  beam_pca_conf_free(&s->h.conf);
  free_buffers(s);
  beam_fjpool_destroy(&s->pool);
  free(s);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: out of memory");
  self->priv = s;
  return beam_pca_conf_load(&s->h.conf, self->cfg, d);
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *s = self->priv;
  int rc = beam_pca_host_start(self, &s->h, in, 1, d);
  if (rc < 0)
    return rc;
  size_t k = s->h.conf.k, b = s->h.conf.b;
  free_buffers(s);
  s->c2 = calloc(b, sizeof *s->c2);
  s->xs = calloc(b, sizeof *s->xs);
  s->Gv = calloc(k * k, sizeof *s->Gv);
  s->gd = calloc(s->h.P, sizeof *s->gd);
  if (!s->c2 || !s->xs || !s->Gv || !s->gd)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: out of memory");
  /* The robust split runs on as many threads as OpenBLAS would use
   * (OPENBLAS_NUM_THREADS, else every core), each with its own scratch. */
  if (s->h.conf.robust && !s->pool) {
    int nt = openblas_get_num_threads();
    unsigned cores = beam_fjpool_cores(), n = nt < 1 ? 1 : (unsigned)nt;
    n = n > cores ? cores : n;
    n = n > BEAM_FJPOOL_MAX ? BEAM_FJPOOL_MAX : n;
    if ((rc = beam_fjpool_new(&s->pool, n, "pca", d)) < 0)
      return rc;
  }
  size_t ns = BEAM_PCA_NSAMP, nch = (s->h.P + RCHUNK - 1) / RCHUNK;
  if (s->h.conf.robust &&
      (!(s->E = malloc(b * s->h.P * sizeof *s->E)) || !(s->A0 = calloc(b * k, sizeof *s->A0)) ||
       !(s->Sn = calloc(b * k, sizeof *s->Sn)) || !(s->Vs = calloc(k * ns, sizeof *s->Vs)) ||
       !(s->Es = calloc(b * ns, sizeof *s->Es)) ||
       !(s->Ec = calloc(beam_fjpool_size(s->pool) * b * RCHUNK, sizeof *s->Ec)) ||
       !(s->Snc = calloc(nch * b * k, sizeof *s->Snc)) || !(s->xsc = calloc(nch * b, sizeof *s->xsc)) ||
       !(s->c2c = calloc(nch * b, sizeof *s->c2c)) || !(s->sv = calloc(ns, sizeof *s->sv))))
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: robust: cannot allocate the %zu x %zu sparse batch", b, s->h.P);
  const beam_bin_geom_t *g = &s->h.geom;
  s->direct = g->n == 1 && g->y0 == 0 && g->x0 == 0 && g->out_h == g->in_h && g->out_w == g->in_w;
  s->all = s->h.P == (size_t)g->out_h * g->out_w;
  return 0;
}

/* Pixels straight from the input (no crop or binning): the same values
 * beam_bin2d_cpu with n = 1 gives (one rounding to float), one pass fewer. */
static size_t gather_direct(const cpu_t *c, beam_dtype_t dt, const void *in, float *restrict row, size_t i0,
                            size_t i1) {
  const beam_pca_host_t *h = &c->h;
  size_t bad = 0;
  const uint32_t *keep = h->keep;
  int poisson = h->conf.poisson;
  /* Without a mask the index is the position: a loop the compiler
   * vectorises (the conversion and the finite count), 5x the indexed one. */
#define GATHER_LOOP(T, IDX)                                                    \
  for (size_t i = i0; i < i1; i++) {                                           \
    float x = (float)(double)px[IDX];                                          \
    bad += !isfinite(x);                                                       \
    row[i] = x;                                                                \
  }                                                                            \
  if (poisson)                                                                 \
    for (size_t i = i0; i < i1; i++)                                           \
      row[i] = 2.0f * sqrtf((row[i] > 0 ? row[i] : 0.0f) + 0.375f);
#define GATHER_CASE(T, DT)                                                     \
  case DT: {                                                                   \
    const T *restrict px = in;                                                 \
    if (c->all) {                                                              \
      GATHER_LOOP(T, i)                                                        \
    } else {                                                                   \
      GATHER_LOOP(T, keep[i])                                                  \
    }                                                                          \
    break;                                                                     \
  }
  switch (dt) {
    BEAM__REAL_DTYPES(GATHER_CASE)
#undef GATHER_CASE
#undef GATHER_LOOP
  default: BEAM_ASSERT(!"pca: dtype not accepted at start");
  }
  return bad;
}

/* Robust without the Anscombe transform: pixels straight from the input
 * and centred on the model's mean in one pass, row = x - mu with x as
 * gather_direct converts it, so the same bits as gather_direct followed by
 * centre_in. Measured on 256^2 uint16 frames from a bank larger than the
 * cache: the two passes 63-104 us per frame, this one 18-22 us (baseline
 * SSE2 build) and 12-16 us (AVX2 clone). Returns the non-finite count. */
BEAM_TARGET_CLONES("avx2", "default") static size_t gather_centre(const cpu_t *c, beam_dtype_t dt,
                                                                              const void *in,
                                                                              float *restrict row) {
  const beam_pca_host_t *h = &c->h;
  const uint32_t *keep = h->keep;
  const float *restrict mu = h->mu;
  size_t P = h->P, bad = 0;
#define GC_LOOP(IDX)                                                           \
  for (size_t i = 0; i < P; i++) {                                             \
    float x = (float)(double)px[IDX];                                          \
    bad += !isfinite(x);                                                       \
    row[i] = x - mu[i];                                                        \
  }
#define GC_CASE(T, DT)                                                         \
  case DT: {                                                                   \
    const T *restrict px = in;                                                 \
    if (c->all) {                                                              \
      GC_LOOP(i)                                                               \
    } else {                                                                   \
      GC_LOOP(keep[i])                                                         \
    }                                                                          \
    break;                                                                     \
  }
  switch (dt) {
    BEAM__REAL_DTYPES(GC_CASE)
#undef GC_CASE
#undef GC_LOOP
  default: BEAM_ASSERT(!"pca: dtype not accepted at start");
  }
  return bad;
}

/* Pixels p0 .. p1 of the batch's newest row centred on the model as the
 * frame arrives (update, score), with the row's sums while they are in
 * cache (robust: those of y - mu, known only once the batch is split). */
#define CHUNK 1024
static void centre_in(cpu_t *c, float *row, size_t p0, size_t p1) {
  beam_pca_host_t *h = &c->h;
  if (h->conf.robust)
    for (size_t p = p0; p < p1; p++)
      row[p] -= h->mu[p];
  else
    sub_sums(row + p0, h->mu + p0, p1 - p0, 1, h->mub + p0, &c->xs[h->nb], &c->c2[h->nb]);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *c = self->priv;
  beam_pca_host_t *h = &c->h;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return 0; /* no pixels: nothing to learn or score */
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0)
    return rc;
  size_t P = h->P, bad = 0;
  float *row = h->M + ((size_t)h->conf.k + h->nb) * P;
  c->c2[h->nb] = c->xs[h->nb] = 0;
  if (c->direct && h->conf.robust && !h->conf.poisson) {
    bad = gather_centre(c, in->dtype, in->data, row);
  } else if (c->direct && in->dtype != BEAM_DT_F32 && in->dtype != BEAM_DT_F64) {
    /* Integers are finite: converted and centred a chunk at a time, in L1. */
    for (size_t p0 = 0; p0 < P; p0 += CHUNK) {
      size_t p1 = p0 + CHUNK < P ? p0 + CHUNK : P;
      gather_direct(c, in->dtype, in->data, row, p0, p1);
      centre_in(c, row, p0, p1);
    }
  } else {
    if (c->direct) {
      bad = gather_direct(c, in->dtype, in->data, row, 0, P);
    } else {
      beam_bin2d_cpu(&h->geom, in->data, h->img, h->acc);
      bad = beam_pca_gather(h, h->img, row);
    }
    if (!bad)
      centre_in(c, row, 0, P);
  }
  if (bad) {
    h->nreject++;
    return BEAM_DIAG(&self->diag, BEAM_EINVAL,
                     "pca \"%s\": frame %llu has %zu non-finite pixels; left out of the model",
                     self->name, (unsigned long long)in->frame_id, bad);
  }
  if (h->conf.robust)
    robust_samp(c, h->nb);
  beam_frame_copy_ident(&h->ident[h->nb], in);
  h->nb++;
  h->nframes++;
  if (h->nb == h->conf.b)
    return batch(self, c, emit);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  cpu_t *c = self->priv;
  beam_pca_host_t *h = &c->h;
  int rc = batch(self, c, emit);
  beam_pca_emit_model(h, emit, BEAM_FLAG_FINAL);
  return rc;
}

const beam_stage_ops_t beam_pca_cpu_ops = {
    .kind = "pca", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
