/* Stage kind `pca`, CPU backend: the batch update of pca.h with OpenBLAS
 * GEMMs (cblas_sgemm, cblas_ssyrk) and LAPACKE (pca.c), and the stage ops.
 *
 * Per batch of b frames of P pixels, k components, m = k + b + 1:
 *   score   S = X V^T - 1 (V mu)^T (sgemm b x k x P), residuals from S
 *   core    G = M M^T (ssyrk m x m x P), dsyevd on the host
 *   update  V = W M (sgemm k x P x m)
 * about (2 b k + m^2 + 2 k m) P flops and two more passes over X (centring).
 * Frames are binned (bin.h, float out; skipped without crop or binning),
 * masked and transformed into their row of M as they arrive, and their
 * pixel sums and |x - mu|^2 taken while the row is in cache, so the batch
 * reads X as few times as possible: the stage is memory-bound at these
 * sizes (bench/pca.c).
 *
 * robust (pca.h): the split x = y + s runs over the whole batch with the
 * same GEMM shapes, A = X V^T - 1 (V mu)^T once, then per step
 * A_t = A - S V^T (b x k x P) and E = A_t V (b x P x k), the noise scale
 * from a subsample of e = x - mu - E, and one fused pass s = soft(e, tau)
 * per frame; the sparse parts live in E
 * (b x P more floats), y = x - s overwrites the batch rows of M. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/pca.h"

typedef struct cpu_s {
  beam_pca_host_t h;
  int direct;  /* no crop, no binning: gather straight from the input */
  double *c2;  /* b: |x_j - mu|^2 against the model the batch is scored with */
  float *Gv;   /* k x k: V V^T */
  float *vmu;  /* k: V mu */
  float *E;    /* robust: b x P, the sparse parts of the batch */
  float *A0;   /* robust: b x k, X V^T - 1 (V mu)^T */
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

/* S = (X - mu) V^T as X V^T - 1 (V mu)^T, so X is read once by one GEMM and
 * no centred copy is written. Residual |x - mu - S V|^2 expanded with
 * S = V (x - mu): |x - mu|^2 - 2 |S|^2 + S^T (V V^T) S, exact in algebra
 * (V need not be exactly orthonormal). In float the loss is about
 * 1e-7 |x - mu|^2 / residual^2 relative: irrelevant unless the residual is
 * below 1e-3 of the frame's deviation (noise-free data), where it is
 * clamped at 0. |x - mu|^2 was summed in double as each frame arrived. */
static void score_prep(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k;
  cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)k, (int)P, 1.0f, h->V, (int)P, h->mu, 1, 0.0f, c->vmu, 1);
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)k, (int)P, 1.0f, h->V, (int)P, 0.0f, c->Gv, (int)k);
}

/* Residuals from S (minus V mu first when sub_vmu) and c2. */
static void residuals(cpu_t *c, int sub_vmu) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k, nb = h->nb;
  double isp = 1.0 / sqrt((double)P);
  for (size_t j = 0; j < nb; j++) {
    float *sj = h->S + j * k;
    double s2 = 0, q = 0;
    for (size_t i = 0; i < k; i++) {
      if (sub_vmu)
        sj[i] -= c->vmu[i];
      s2 += (double)sj[i] * sj[i];
    }
    for (size_t i = 0; i < k; i++)
      for (size_t l = 0; l < k; l++) {
        float g = i <= l ? c->Gv[i * k + l] : c->Gv[l * k + i];
        q += (double)sj[i] * g * sj[l];
      }
    double r2 = c->c2[j] - 2 * s2 + q;
    h->res[j] = (float)(r2 > 0 ? sqrt(r2) * isp : 0.0);
  }
}

static void score(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  size_t P = h->P, k = h->conf.k, nb = h->nb;
  const float *X = h->M + k * P;
  score_prep(c);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)k, (int)P, 1.0f, X, (int)P, h->V, (int)P,
              0.0f, h->S, (int)k);
  residuals(c, 1);
}

/* x[p] = x[p] - m[p] over P pixels, returning the sum and the sum of
 * squares of the result in double. Eight independent lanes, written out,
 * so the compiler vectorises without reassociating a reduction (which it
 * may not do to floating point): measured 3x on the centring pass. */
#define LANES 8
static void sub_sums(float *restrict x, const float *restrict m, size_t P, int write, double *sum,
                     double *sq) {
  double a[LANES] = {0}, q[LANES] = {0};
  size_t p = 0;
  for (; p + LANES <= P; p += LANES)
    for (int l = 0; l < LANES; l++) {
      float v = x[p + l] - m[p + l];
      if (write)
        x[p + l] = v;
      a[l] += v;
      q[l] += (double)v * v;
    }
  double s = 0, t = 0;
  for (int l = 0; l < LANES; l++)
    s += a[l], t += q[l];
  for (; p < P; p++) {
    float v = x[p] - m[p];
    if (write)
      x[p] = v;
    s += v;
    t += (double)v * v;
  }
  *sum = s;
  *sq = t;
}

/* ---- robust split (pca.h) --------------------------------------------------- */

/* soft(e, t) = sign(e) max(|e| - t, 0); written branch-free so it vectorises. */
static inline float soft(float e, float t) {
  float a = fabsf(e) - t;
  return a > 0 ? copysignf(a, e) : 0.0f;
}

#define CHUNK 1024 /* pixels: a chunk of a row stays in L1 between the passes over it */

/* The split x = y + s of every frame of the batch against the current
 * model (or, before the first model, the batch's per-pixel median), then
 * y into the rows of M, the batch sums of y into mub and |y - mu|^2 into
 * c2. With a model, h->S ends as the scores of y.
 *
 * Per step one GEMM, E = S V (the low-rank part's deviation from mu), and
 * one pass per frame that soft-thresholds e = x - mu - E into s (kept in
 * E) and, while each chunk is in L1, subtracts s_p V_p from the frame's
 * scores for every nonzero s_p: S = A0 - s V^T without a GEMM, since s is
 * sparse (all of it only for a glitch frame, where this costs a GEMV).
 * The last step also writes y = x - s and its sums in the same pass. */
static void robust_split(cpu_t *c) {
  beam_pca_host_t *h = &c->h;
  const beam_pca_conf_t *cf = &h->conf;
  size_t P = h->P, k = cf->k, nb = h->nb, ns = beam_pca_samp_n(P);
  float *X = h->M + k * P, *E = c->E;
  const float *mu = h->mu, *V = h->V;
  float lam = (float)cf->robust_lambda;
  memset(h->mub, 0, P * sizeof *h->mub);
  if (h->have_model) {
    score_prep(c);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)k, (int)P, 1.0f, X, (int)P, V, (int)P,
                0.0f, c->A0, (int)k);
    for (size_t j = 0; j < nb; j++)
      for (size_t i = 0; i < k; i++)
        c->A0[j * k + i] -= c->vmu[i];
    memcpy(h->S, c->A0, nb * k * sizeof *h->S);
    for (uint32_t t = 0; t < cf->robust_iters; t++) {
      int last = t + 1 == cf->robust_iters;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)P, (int)k, 1.0f, h->S, (int)k, V,
                  (int)P, 0.0f, E, (int)P);
      for (size_t j = 0; j < nb; j++) {
        float *x = X + j * P, *e = E + j * P, *sj = h->S + j * k;
        /* The noise scale from this step's residual: the first step's still
         * carries every spike's leak through the projection (V^T V x_spike,
         * spread over all pixels), which would inflate it. */
        if (P <= BEAM_PCA_NSAMP) {
          for (size_t p = 0; p < P; p++)
            h->samp[p] = x[p] - mu[p] - e[p];
        } else {
          for (size_t r = 0, i = 0; i < ns; r++) {
            size_t p0 = beam_pca_samp_run0(P, r);
            for (size_t q = 0; q < BEAM_PCA_SAMP_RUN; q++, i++)
              h->samp[i] = x[p0 + q] - mu[p0 + q] - e[p0 + q];
          }
        }
        float tj = lam * beam_pca_sigma_of(h->samp, ns);
        h->tau[j] = tj;
        memcpy(sj, c->A0 + j * k, k * sizeof *sj);
        double c2 = 0;
        for (size_t p0 = 0; p0 < P; p0 += CHUNK) {
          size_t p1 = p0 + CHUNK < P ? p0 + CHUNK : P;
          int nz = 0;
          for (size_t p = p0; p < p1; p++) {
            e[p] = soft(x[p] - mu[p] - e[p], tj);
            nz |= e[p] != 0.0f;
          }
          /* Most of a chunk holds no sparse pixel: look at it in blocks of
           * 64 without a branch per pixel, and pixel by pixel only where a
           * block has one. */
          for (size_t q0 = p0; nz && q0 < p1; q0 += 64) {
            size_t q1 = q0 + 64 < p1 ? q0 + 64 : p1;
            int any = 0;
            for (size_t p = q0; p < q1; p++)
              any |= e[p] != 0.0f;
            for (size_t p = q0; any && p < q1; p++)
              if (e[p] != 0.0f)
                for (size_t i = 0; i < k; i++)
                  sj[i] -= e[p] * V[i * P + p];
          }
          if (last) {
            for (size_t p = p0; p < p1; p++) {
              x[p] -= e[p];
              h->mub[p] += x[p];
            }
            double sum, sq;
            sub_sums(x + p0, mu + p0, p1 - p0, 0, &sum, &sq);
            c2 += sq;
          }
        }
        if (last)
          c->c2[j] = c2;
      }
    }
    return;
  }
  /* No model yet: a rank-0 model centred on the per-pixel median, which a
   * spike in fewer than half of the batch's frames cannot move. */
  for (size_t p = 0; p < P; p++) {
    for (size_t j = 0; j < nb; j++)
      h->colb[j] = X[j * P + p];
    h->ctr[p] = beam_pca_median(h->colb, nb);
  }
  for (size_t j = 0; j < nb; j++) {
    float *x = X + j * P, *e = E + j * P;
    for (size_t p = 0; p < P; p++)
      e[p] = x[p] - h->ctr[p];
    float tj = h->tau[j] = lam * beam_pca_sigma(P, e, h->samp);
    for (size_t p = 0; p < P; p++) {
      e[p] = soft(e[p], tj);
      x[p] -= e[p];
      h->mub[p] += x[p];
    }
    /* c2 is not used: the first batch is not scored. */
  }
}

/* Frames marked in h->rej leave the batch before the update: their y out
 * of the batch sums, the later rows moved up (the sparse parts and
 * identities are not needed any more: the batch was emitted). */
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
    if (w != j)
      memcpy(X + (size_t)w * P, X + (size_t)j * P, P * sizeof *X);
    w++;
  }
  h->nb = w;
}

static int update(beam_pca_host_t *h, beam_diag_t *d) {
  const beam_pca_conf_t *c = &h->conf;
  size_t P = h->P, k = c->k, nb = h->nb, mrows = k + nb + 1;
  float *M = h->M, *X = M + k * P, *corr = M + (k + nb) * P;
  if (h->have_model) {
    h->n_seen *= c->forget;
    h->scatter *= c->forget * c->forget;
    for (size_t i = 0; i < k; i++)
      h->s[i] *= c->forget;
  }
  memset(h->rowsum, 0, mrows * sizeof *h->rowsum);
  /* Rows 0..k-1: diag(s) V (zero before the first batch). */
  for (size_t i = 0; i < k; i++) {
    float si = (float)h->s[i], *row = M + i * P;
    const float *v = h->V + i * P;
    for (size_t p = 0; p < P; p++)
      row[p] = si * v[p];
    double rs = 0; /* k x P per batch: not worth lanes */
    for (size_t p = 0; p < P; p++)
      rs += v[p];
    h->rowsum[i] = si * rs;
  }
  /* h->mub holds the batch's pixel sums, added as the frames arrived. */
  float inb = 1.0f / (float)nb;
  for (size_t p = 0; p < P; p++)
    h->mub[p] *= inb;
  double ss = 0;
  for (size_t j = 0; j < nb; j++) {
    double a;
    sub_sums(X + j * P, h->mub, P, 1, &h->rowsum[k + j], &a);
    ss += a;
  }
  double n = h->n_seen, cf = sqrt(n * (double)nb / (n + (double)nb));
  double rs = 0, a = 0;
  for (size_t p = 0; p < P; p++) {
    float v = (float)(cf * ((double)h->mu[p] - h->mub[p]));
    corr[p] = v;
    rs += v;
    a += (double)v * v;
  }
  h->rowsum[k + nb] = rs;
  h->scatter += ss + a;
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)mrows, (int)P, 1.0f, M, (int)P, 0.0f, h->Gf,
              (int)h->m);
  int rc = beam_pca_core(h, (uint32_t)mrows, d);
  if (rc < 0)
    return rc;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)k, (int)P, (int)mrows, 1.0f, h->W, (int)h->m,
              M, (int)P, 0.0f, h->V, (int)P);
  double wn = n / (n + (double)nb), wb = (double)nb / (n + (double)nb);
  for (size_t p = 0; p < P; p++) {
    h->mu[p] = (float)(wn * h->mu[p] + wb * h->mub[p]);
    h->mub[p] = 0;
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
      residuals(c, 0);
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
    rc = update(h, &self->diag);
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

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *s = self->priv;
  if (!s)
    return;
  beam_pca_host_free(&s->h);
  beam_pca_conf_free(&s->h.conf);
  free(s->c2);
  free(s->Gv);
  free(s->vmu);
  free(s->E);
  free(s->A0);
  free(s);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: out of memory");
  self->priv = s;
  int rc = beam_pca_conf_load(&s->h.conf, self->cfg, d);
  if (rc < 0)
    cpu_destroy(self);
  return rc;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *s = self->priv;
  int rc = beam_pca_host_start(self, &s->h, in, 1, d);
  if (rc < 0)
    return rc;
  size_t k = s->h.conf.k, b = s->h.conf.b;
  free(s->c2);
  free(s->Gv);
  free(s->vmu);
  free(s->E);
  free(s->A0);
  s->E = s->A0 = NULL;
  s->c2 = calloc(b, sizeof *s->c2);
  s->Gv = calloc(k * k, sizeof *s->Gv);
  s->vmu = calloc(k, sizeof *s->vmu);
  if (!s->c2 || !s->Gv || !s->vmu)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: out of memory");
  if (s->h.conf.robust && (!(s->E = malloc(b * s->h.P * sizeof *s->E)) || !(s->A0 = calloc(b * k, sizeof *s->A0))))
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: robust: cannot allocate the %zu x %zu sparse batch", b, s->h.P);
  const beam_bin_geom_t *g = &s->h.geom;
  s->direct = g->n == 1 && g->y0 == 0 && g->x0 == 0 && g->out_h == g->in_h && g->out_w == g->in_w;
  return 0;
}

/* Pixels straight from the input (no crop or binning): the same values
 * beam_bin2d_cpu with n = 1 gives (one rounding to float), one pass fewer. */
static size_t gather_direct(const beam_pca_host_t *h, beam_dtype_t dt, const void *in, float *restrict row) {
  size_t bad = 0, P = h->P;
  const uint32_t *keep = h->keep;
  int poisson = h->conf.poisson;
  switch (dt) {
#define GATHER_CASE(T, DT)                                                     \
  case DT: {                                                                   \
    const T *px = in;                                                          \
    for (size_t i = 0; i < P; i++) {                                           \
      float x = (float)(double)px[keep[i]];                                    \
      bad += !isfinite(x);                                                     \
      row[i] = poisson ? 2.0f * sqrtf((x > 0 ? x : 0.0f) + 0.375f) : x;        \
    }                                                                          \
    break;                                                                     \
  }
    BEAM__REAL_DTYPES(GATHER_CASE)
#undef GATHER_CASE
  default: BEAM_ASSERT(!"pca: dtype not accepted at start");
  }
  return bad;
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *c = self->priv;
  beam_pca_host_t *h = &c->h;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return 0; /* no pixels: nothing to learn or score */
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0)
    return rc;
  float *row = h->M + ((size_t)h->conf.k + h->nb) * h->P;
  size_t bad;
  if (c->direct) {
    bad = gather_direct(h, in->dtype, in->data, row);
  } else {
    beam_bin2d_cpu(&h->geom, in->data, h->img, h->acc);
    bad = beam_pca_gather(h, h->img, row);
  }
  if (bad) {
    h->nreject++;
    return BEAM_DIAG(&self->diag, BEAM_EINVAL,
                     "pca \"%s\": frame %llu has %zu non-finite pixels; left out of the model",
                     self->name, (unsigned long long)in->frame_id, bad);
  }
  /* While the row is in cache: the batch sums and |x - mu|^2 for scoring
   * (robust: of y = x - s, known only once the batch is split). */
  if (!h->conf.robust) {
    double sum;
    sub_sums(row, h->mu, h->P, 0, &sum, &c->c2[h->nb]);
    for (size_t p = 0; p < h->P; p++)
      h->mub[p] += row[p];
  }
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
    "pca", "cpu", cpu_init, cpu_start, cpu_process, cpu_end, cpu_destroy,
};
