/* Stage kind `pca`: schema, parameter loading, and the host-side pieces both
 * backends share (geometry and buffers at start, preprocessing of one binned
 * frame, the small eigenproblem of the incremental SVD, result emission). The
 * large products live in pca_cpu.c (OpenBLAS) and gpu/pca_cuda.cu (cuBLAS). */
#include "pipeline/kern/pca.h"

#include <lapacke.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

static const char *forget_valid(const beam_cnode_t *v) {
  return v->fval > 0 && v->fval <= 1 ? NULL : "forget must be in (0, 1]";
}

static const beam_param_t pca_bin_params[] = {
    {"crop", BEAM_P_INT_LIST, NULL, 0, 0, 1e9, NULL, NULL,
     "[y0, x0, height, width] in pixels before binning; default the whole frame", NULL},
    {"factor", BEAM_P_INT, "1", 0, 1, 256, NULL, NULL,
     "n: sum over n x n blocks before the decomposition; a partial edge block is dropped", NULL},
    BEAM_PARAM_END};

static const beam_param_t pca_mask_params[] = {
    {"file", BEAM_P_INFILE, NULL, 1, 0, 0, NULL, NULL,
     ".h5 or .npy file, the frames' shape: nonzero = pixel left out", NULL},
    {"dataset", BEAM_P_STRING, "/mask", 0, 0, 0, NULL, NULL, "HDF5 dataset of the mask", NULL},
    BEAM_PARAM_END};

const beam_param_t beam_pca_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"components", BEAM_P_INT, "8", 0, 1, BEAM_PCA_KMAX, NULL, NULL,
     "k: number of principal components kept (at most batch and the pixel count)", NULL},
    {"batch", BEAM_P_INT, "64", 0, 1, BEAM_PCA_BMAX, NULL, NULL,
     "b: frames per incremental update; per-frame results come b frames late", NULL},
    {"forget", BEAM_P_FLOAT, "1", 0, 0, 1, NULL, NULL,
     "forgetting factor f in (0, 1]: singular values and frame count scaled by f before each batch",
     forget_valid},
    {"warmup", BEAM_P_INT, "0", 0, 0, 1e12, NULL, NULL,
     "frames of a series without per-frame results (at least one batch: the model scores a frame "
     "only after earlier frames built it)", NULL},
    {"bin", BEAM_P_MAP, NULL, 0, 0, 0, NULL, pca_bin_params, "crop and n x n sum binning before the decomposition", NULL},
    {"mask", BEAM_P_MAP, NULL, 0, 0, 0, NULL, pca_mask_params, "pixels left out of the decomposition", NULL},
    {"poisson", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "Anscombe variance-stabilising transform 2 sqrt(x + 3/8) (x < 0 taken as 0) before the decomposition", NULL},
    {"anomaly_threshold", BEAM_P_FLOAT, "6", 0, 0, 1e9, NULL, NULL,
     "flag a frame ANOMALY when (residual - median) / (1.4826 MAD) over the last 256 residuals exceeds this; 0 = off", NULL},
    {"anomaly_abs", BEAM_P_FLOAT, "0", 0, 0, 1e12, NULL, NULL,
     "also flag a frame when its residual exceeds this absolute value; 0 = off", NULL},
    {"denoised_rate", BEAM_P_FLOAT, "1", 0, 0, 1000, NULL, NULL,
     "Hz: at most this many low-rank (denoised) frames per second; 0 = none", NULL},
    {"publish_every", BEAM_P_INT, "1000", 0, 1, 1e12, NULL, NULL,
     "publish components, mean, singular values and explained variance every N frames (and at series end)", NULL},
    {"robust", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "split each frame into low-rank + sparse parts before the update (ORPCA-style soft threshold) so "
     "spikes stay out of the model; adds the `sparse` output", NULL},
    {"robust_lambda", BEAM_P_FLOAT, "5", 0, 0.5, 1000, NULL, NULL,
     "robust: soft threshold in units of each frame's robust noise sigma (1.4826 MAD of its residual)", NULL},
    {"robust_iterations", BEAM_P_INT, "3", 0, 1, 50, NULL, NULL,
     "robust: alternating steps (project, soft-threshold) per batch", NULL},
    {"robust_reject", BEAM_P_FLOAT, "6", 0, 0, 1e9, NULL, NULL,
     "robust: frames whose robust residual z exceeds this are left out of the update (unless more "
     "than half of the batch does); 0 = never", NULL},
    BEAM_PARAM_END};

/* ---- init ----------------------------------------------------------------- */

void beam_pca_conf_free(beam_pca_conf_t *c) { beam_array_free(&c->mask); }

int beam_pca_conf_load(beam_pca_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  int64_t k = beam_cfg_int(cfg, "components", 8), b = beam_cfg_int(cfg, "batch", 64);
  if (k < 1 || k > BEAM_PCA_KMAX)
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: components %lld outside 1..%d", (long long)k, BEAM_PCA_KMAX);
  if (b < 1 || b > BEAM_PCA_BMAX)
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: batch %lld outside 1..%d", (long long)b, BEAM_PCA_BMAX);
  if (k > b)
    return BEAM_DIAG(d, BEAM_ECONFIG,
                     "pca: components (%lld) must not exceed batch (%lld): one batch must span the "
                     "first model", (long long)k, (long long)b);
  c->k = (uint32_t)k, c->b = (uint32_t)b;
  c->forget = beam_cfg_float(cfg, "forget", 1.0);
  if (!(c->forget > 0 && c->forget <= 1))
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: forget %g outside (0, 1]", c->forget);
  int64_t wu = beam_cfg_int(cfg, "warmup", 0);
  c->warmup = wu < (int64_t)b ? (uint64_t)b : (uint64_t)wu;
  c->poisson = beam_cfg_bool(cfg, "poisson", 0);
  c->anomaly_threshold = beam_cfg_float(cfg, "anomaly_threshold", 6);
  c->anomaly_abs = beam_cfg_float(cfg, "anomaly_abs", 0);
  c->denoised_rate = beam_cfg_float(cfg, "denoised_rate", 1);
  int64_t pe = beam_cfg_int(cfg, "publish_every", 1000);
  c->publish_every = pe < 1 ? 1 : (uint64_t)pe;
  if (!(c->anomaly_threshold >= 0) || !(c->anomaly_abs >= 0) || !(c->denoised_rate >= 0))
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: anomaly_threshold, anomaly_abs and denoised_rate must be >= 0");
  c->robust = beam_cfg_bool(cfg, "robust", 0);
  c->robust_lambda = beam_cfg_float(cfg, "robust_lambda", 5);
  int64_t it = beam_cfg_int(cfg, "robust_iterations", 3);
  c->robust_reject = beam_cfg_float(cfg, "robust_reject", 6);
  if (!(c->robust_lambda >= 0.5 && c->robust_lambda <= 1000))
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: robust_lambda %g outside 0.5..1000", c->robust_lambda);
  if (it < 1 || it > 50)
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: robust_iterations %lld outside 1..50", (long long)it);
  if (!(c->robust_reject >= 0))
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: robust_reject must be >= 0");
  c->robust_iters = (uint32_t)it;
  const beam_cnode_t *bin = beam_cfg_get(cfg, "bin");
  if (bin) {
    beam_diag_t sub = {0};
    /* The same crop/factor rules as the `bin` stage; mode absent = sum. */
    if (beam_bin_conf_load(&c->bin, bin, &sub) < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "pca: %s", sub.msg);
    if (!beam_cfg_get(bin, "factor"))
      c->bin.n = 1;
  } else {
    c->bin.n = 1;
  }
  const beam_cnode_t *mask = beam_cfg_get(cfg, "mask");
  if (mask) {
    const char *file = beam_cfg_str(mask, "file"), *ds = beam_cfg_str(mask, "dataset");
    beam_diag_t sub = {0};
    if (!file)
      return BEAM_DIAG(d, BEAM_ECONFIG, "pca: mask needs file");
    int rc = beam_array_load(file, ds ? ds : "/mask", &c->mask, &sub);
    if (rc < 0)
      return BEAM_DIAG(d, rc, "pca: mask: %s", sub.msg);
    if (c->mask.ndim != 2 || !beam__dtype_real(c->mask.dtype)) {
      beam_array_free(&c->mask);
      return BEAM_DIAG(d, BEAM_ECONFIG, "pca: %s: the mask must be a 2-D real array", file);
    }
  }
  return 0;
}

/* ---- start ------------------------------------------------------------------ */

void beam_pca_host_free(beam_pca_host_t *h) {
  free(h->keep);
  free(h->mu);
  free(h->V);
  free(h->M);
  free(h->S);
  free(h->res);
  free(h->ident);
  free(h->Gf);
  free(h->G);
  free(h->w);
  free(h->rowsum);
  free(h->W);
  free(h->work);
  free(h->iwork);
  free(h->img);
  free(h->acc);
  free(h->mub);
  free(h->zb);
  free(h->rej);
  free(h->tau);
  free(h->samp);
  free(h->ctr);
  free(h->colb);
  beam_pca_conf_t c = h->conf;
  memset(h, 0, sizeof *h);
  h->conf = c;
}

int beam_pca_host_start(beam_stage_t *self, beam_pca_host_t *h, const beam_indesc_t *in,
                        int host_bufs, beam_diag_t *d) {
  beam_pca_conf_t *c = &h->conf;
  char fs[64], ms[64];
  beam_pca_host_free(h);
  beam_diag_t sub = {0};
  /* beam_bin_start checks dtype, 2-D, crop inside the frame; it declares
   * a "frame" output that is replaced below. */
  if (beam_bin_start(self, &c->bin, in, &h->geom, &sub) < 0)
    return BEAM_DIAG(d, sub.code, "pca: %s", sub.msg);
  h->in = *in;
  h->oh = h->geom.out_h, h->ow = h->geom.out_w;
  size_t npix = (size_t)h->oh * h->ow;
  if (npix > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "pca: %ux%u frames have too many pixels", h->oh, h->ow);
  const beam_array_t *mk = &c->mask;
  if (mk->data && (mk->shape[0] != in->shape[0] || mk->shape[1] != in->shape[1]))
    return BEAM_DIAG(d, BEAM_ESHAPE, "pca: the mask has shape %s but the frames are %s",
                     beam_shape_str(mk->ndim, mk->shape, ms, sizeof ms),
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  size_t k = c->k, b = c->b, m = k + b + 1;
  h->m = (uint32_t)m;
  size_t P = 0;
  if (!(h->keep = malloc(npix * sizeof *h->keep)))
    goto nomem;
  /* A binned pixel stays only when every input pixel of its block is good. */
  uint32_t n = h->geom.n;
  for (uint32_t oy = 0; oy < h->oh; oy++)
    for (uint32_t ox = 0; ox < h->ow; ox++) {
      int good = 1;
      for (uint32_t dy = 0; mk->data && good && dy < n; dy++)
        for (uint32_t dx = 0; good && dx < n; dx++) {
          size_t y = h->geom.y0 + (size_t)oy * n + dy, x = h->geom.x0 + (size_t)ox * n + dx;
          good = beam_array_get(mk, y * in->shape[1] + x) == 0.0;
        }
      if (good)
        h->keep[P++] = oy * h->ow + ox;
    }
  h->P = P;
  if (P == 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, "pca: the mask leaves no pixel of the %ux%u (binned) frame", h->oh, h->ow);
  if (P < k)
    return BEAM_DIAG(d, BEAM_ESHAPE, "pca: components (%zu) exceed the %zu pixels left after crop, bin and mask",
                     k, P);
  if (!(h->ident = calloc(b, sizeof *h->ident)) || !(h->S = calloc(b * k, sizeof *h->S)) ||
      !(h->res = calloc(b, sizeof *h->res)) || !(h->Gf = calloc(m * m, sizeof *h->Gf)) ||
      !(h->G = calloc(m * m, sizeof *h->G)) || !(h->w = calloc(m, sizeof *h->w)) ||
      !(h->rowsum = calloc(m, sizeof *h->rowsum)) || !(h->W = calloc(k * m, sizeof *h->W)) ||
      !(h->img = calloc(npix, sizeof *h->img)) || !(h->acc = calloc(h->ow, sizeof *h->acc)) ||
      !(h->mu = calloc(P, sizeof *h->mu)) || !(h->V = calloc(k * P, sizeof *h->V)))
    goto nomem;
  if (host_bufs && (!(h->M = calloc(m * P, sizeof *h->M)) || !(h->mub = calloc(P, sizeof *h->mub))))
    goto nomem;
  if (c->robust && (!(h->zb = calloc(b, sizeof *h->zb)) || !(h->rej = calloc(b, sizeof *h->rej)) ||
                    !(h->tau = calloc(b, sizeof *h->tau)) ||
                    !(h->samp = calloc((size_t)BEAM_PCA_NSAMP * b, sizeof *h->samp)) ||
                    (host_bufs && (!(h->ctr = calloc(P, sizeof *h->ctr)) || !(h->colb = calloc(16 * b, sizeof *h->colb))))))
    goto nomem;
  /* dsyevd workspace for the largest problem, queried once. */
  double wq;
  lapack_int iwq;
  lapack_int info = LAPACKE_dsyevd_work(LAPACK_ROW_MAJOR, 'V', 'U', (lapack_int)m, h->G,
                                        (lapack_int)m, h->w, &wq, -1, &iwq, -1);
  if (info != 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "pca: dsyevd workspace query failed (info %d)", (int)info);
  h->lwork = (size_t)wq + 1, h->liwork = (size_t)iwq + 1;
  if (!(h->work = malloc(h->lwork * sizeof *h->work)) || !(h->iwork = malloc(h->liwork * sizeof *h->iwork)))
    goto nomem;

  uint32_t ks[1] = {c->k}, one[1] = {1}, img[2] = {h->oh, h->ow}, comp[3] = {c->k, h->oh, h->ow};
  const char *u = c->poisson ? "sqrt(counts)" : "counts";
  beam_outdesc_t *o = self->outs;
  beam__declare(&o[BEAM_PCA_OUT_SCORES], "scores", BEAM_DT_F32, 1, ks, u, 1);
  o[BEAM_PCA_OUT_SCORES].axes[0] = "component";
  beam__declare(&o[BEAM_PCA_OUT_RESIDUAL], "residual", BEAM_DT_F32, 1, one, u, 1);
  o[BEAM_PCA_OUT_RESIDUAL].axes[0] = "";
  beam__declare(&o[BEAM_PCA_OUT_DENOISED], "denoised", BEAM_DT_F32, 2, img, u, 0);
  o[BEAM_PCA_OUT_DENOISED].slots = 4;
  beam__declare(&o[BEAM_PCA_OUT_COMPONENTS], "components", BEAM_DT_F32, 3, comp, "", 0);
  o[BEAM_PCA_OUT_COMPONENTS].axes[0] = "component";
  o[BEAM_PCA_OUT_COMPONENTS].slots = 2;
  beam__declare(&o[BEAM_PCA_OUT_MEAN], "mean", BEAM_DT_F32, 2, img, u, 0);
  o[BEAM_PCA_OUT_MEAN].slots = 2;
  beam__declare(&o[BEAM_PCA_OUT_SV], "singular_values", BEAM_DT_F32, 1, ks, u, 0);
  o[BEAM_PCA_OUT_SV].axes[0] = "component";
  beam__declare(&o[BEAM_PCA_OUT_EVR], "explained_variance", BEAM_DT_F32, 1, ks, "", 0);
  o[BEAM_PCA_OUT_EVR].axes[0] = "component";
  self->nouts = BEAM_PCA_NOUTS - 1;
  if (c->robust) {
    beam__declare(&o[BEAM_PCA_OUT_SPARSE], "sparse", BEAM_DT_F32, 2, img, u, 0);
    o[BEAM_PCA_OUT_SPARSE].slots = 4;
    self->nouts = BEAM_PCA_NOUTS;
  }
  return 0;
nomem:
  beam_pca_host_free(h);
  return BEAM_DIAG(d, BEAM_ENOMEM, "pca: cannot allocate the buffers for %zu pixels, k %zu, batch %zu",
                   P, k, b);
}

/* ---- per frame ------------------------------------------------------------- */

size_t beam_pca_gather(const beam_pca_host_t *h, const float *img, float *restrict row) {
  size_t bad = 0;
  const uint32_t *keep = h->keep;
  if (h->conf.poisson) {
    for (size_t i = 0; i < h->P; i++) {
      float x = img[keep[i]];
      bad += !isfinite(x);
      row[i] = 2.0f * sqrtf((x > 0 ? x : 0.0f) + 0.375f);
    }
  } else {
    for (size_t i = 0; i < h->P; i++) {
      float x = img[keep[i]];
      bad += !isfinite(x);
      row[i] = x;
    }
  }
  return bad;
}

/* ---- the small eigenproblem ---------------------------------------------------- */

int beam_pca_core(beam_pca_host_t *h, uint32_t mrows, beam_diag_t *d) {
  size_t m = h->m, k = h->conf.k, n = mrows;
  for (size_t i = 0; i < n; i++)
    for (size_t j = i; j < n; j++)
      h->G[i * m + j] = (double)h->Gf[i * m + j];
  lapack_int info = LAPACKE_dsyevd_work(LAPACK_ROW_MAJOR, 'V', 'U', (lapack_int)n, h->G, (lapack_int)m,
                                        h->w, h->work, (lapack_int)h->lwork, h->iwork, (lapack_int)h->liwork);
  if (info != 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "pca: eigendecomposition of the %zux%zu core failed (info %d)", n, n,
                     (int)info);
  /* Eigenvalues ascending; eigenvector j is column j of G (row-major).
   * G was summed in float: eigenvalues below ~1e-6 of the largest are at
   * the level of that rounding, and U^T M / s would amplify the noise, so
   * such directions are dropped (zero rows: they score 0). */
  double lmax = h->w[n - 1] > 0 ? h->w[n - 1] : 0;
  for (size_t i = 0; i < k; i++) {
    float *wr = h->W + i * m;
    memset(wr, 0, m * sizeof *wr);
    h->s[i] = 0;
    if (i >= n)
      continue;
    size_t col = n - 1 - i;
    double l = h->w[col];
    if (!(l > 1e-6 * lmax) || !(l > 0))
      continue;
    double s = sqrt(l), dot = 0;
    for (size_t r = 0; r < n; r++)
      dot += h->G[r * m + col] * h->rowsum[r];
    double sg = dot < 0 ? -1.0 : 1.0;
    h->s[i] = s;
    for (size_t r = 0; r < n; r++)
      wr[r] = (float)(sg * h->G[r * m + col] / s);
  }
  return 0;
}

/* ---- results ---------------------------------------------------------------- */

static void scatter(const beam_pca_host_t *h, const float *v, float *o);

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median and robust scale (1.4826 MAD) of the residual window, once per
 * batch (the window is the same for every frame of the batch). */
static void window_stats(beam_pca_host_t *h) {
  size_t n = h->nwin;
  h->wmed = NAN, h->wscale = NAN;
  if (n < 8)
    return;
  memcpy(h->wsort, h->win, n * sizeof *h->wsort);
  qsort(h->wsort, n, sizeof *h->wsort, cmp_dbl);
  double med = n % 2 ? h->wsort[n / 2] : 0.5 * (h->wsort[n / 2 - 1] + h->wsort[n / 2]);
  for (size_t i = 0; i < n; i++)
    h->wsort[i] = fabs(h->win[i] - med);
  qsort(h->wsort, n, sizeof *h->wsort, cmp_dbl);
  double mad = n % 2 ? h->wsort[n / 2] : 0.5 * (h->wsort[n / 2 - 1] + h->wsort[n / 2]);
  h->wmed = med, h->wscale = 1.4826 * mad;
}

double beam_pca_robust_z(const beam_pca_host_t *h, double r) {
  if (!(h->wscale >= 0))
    return NAN;
  /* A window of identical residuals (noise-free data) has MAD 0: any
   * excess is then infinitely many MADs, and none is 0. */
  double e = r - h->wmed;
  return e == 0 ? 0.0 : h->wscale > 0 ? e / h->wscale : (e > 0 ? INFINITY : -INFINITY);
}

void beam_pca_emit_batch(beam_pca_host_t *h, beam_emit_t *emit,
                         void (*denoise_row)(void *ctx, uint32_t j, float *out),
                         void (*sparse_row)(void *ctx, uint32_t j, float *out), void *ctx) {
  const beam_pca_conf_t *c = &h->conf;
  size_t k = c->k;
  /* The window takes the whole batch first, so the batch is judged with
   * itself included: a burst of outliers cannot hide behind a window that
   * has not seen it, and the median/MAD shrug off a few. */
  for (uint32_t j = 0; j < h->nb; j++) {
    h->win[h->wpos] = h->res[j];
    h->wpos = (h->wpos + 1) % BEAM_PCA_WIN;
    if (h->nwin < BEAM_PCA_WIN)
      h->nwin++;
  }
  window_stats(h);
  if (h->zb)
    for (uint32_t j = 0; j < h->nb; j++)
      h->zb[j] = beam_pca_robust_z(h, h->res[j]);
  uint64_t first = h->nframes - h->nb; /* series index of row 0 */
  for (uint32_t j = 0; j < h->nb; j++) {
    if (first + j < c->warmup)
      continue;
    double r = h->res[j];
    int anom = (c->anomaly_abs > 0 && r > c->anomaly_abs);
    if (c->anomaly_threshold > 0) {
      double z = beam_pca_robust_z(h, r);
      anom |= z > c->anomaly_threshold;
    }
    beam_frame_t *f = beam_emit_get(emit, BEAM_PCA_OUT_SCORES);
    if (!f)
      return;
    beam_frame_copy_ident(f, &h->ident[j]);
    f->flags &= ~(uint32_t)BEAM_FLAG_META;
    if (anom)
      f->flags |= BEAM_FLAG_ANOMALY;
    memcpy(f->data, h->S + j * k, k * sizeof(float));
    uint32_t flags = f->flags;
    beam_emit_put(emit, f);
    if (!(f = beam_emit_get(emit, BEAM_PCA_OUT_RESIDUAL)))
      return;
    beam_frame_copy_ident(f, &h->ident[j]);
    f->flags = flags;
    ((float *)f->data)[0] = (float)r;
    beam_emit_put(emit, f);
    if (c->denoised_rate > 0 && denoise_row) {
      uint64_t now = beam_now_ns();
      if (!h->denoised_any || (double)(now - h->t_denoised_ns) >= 1e9 / c->denoised_rate) {
        if (!(f = beam_emit_get(emit, BEAM_PCA_OUT_DENOISED)))
          return;
        beam_frame_copy_ident(f, &h->ident[j]);
        f->flags = flags;
        float *o = f->data;
        denoise_row(ctx, j, h->img);
        size_t npix = (size_t)h->oh * h->ow;
        for (size_t i = 0; i < npix; i++)
          o[i] = NAN;
        for (size_t i = 0; i < h->P; i++)
          o[h->keep[i]] = h->img[i];
        beam_emit_put(emit, f);
        if (sparse_row && (f = beam_emit_get(emit, BEAM_PCA_OUT_SPARSE))) {
          beam_frame_copy_ident(f, &h->ident[j]);
          f->flags = flags;
          sparse_row(ctx, j, h->img);
          scatter(h, h->img, f->data);
          beam_emit_put(emit, f);
        }
        h->t_denoised_ns = now;
        h->denoised_any = 1;
      }
    }
  }
}

/* Kept pixels back onto the image grid; masked pixels are NaN. */
static void scatter(const beam_pca_host_t *h, const float *v, float *o) {
  size_t npix = (size_t)h->oh * h->ow;
  for (size_t i = 0; i < npix; i++)
    o[i] = NAN;
  for (size_t i = 0; i < h->P; i++)
    o[h->keep[i]] = v[i];
}

void beam_pca_emit_model(beam_pca_host_t *h, beam_emit_t *emit, uint32_t flags) {
  if (!h->have_model)
    return;
  size_t k = h->conf.k, npix = (size_t)h->oh * h->ow;
  beam_frame_t *f;
  if ((f = beam_emit_get(emit, BEAM_PCA_OUT_COMPONENTS))) {
    for (size_t i = 0; i < k; i++)
      scatter(h, h->V + i * h->P, (float *)f->data + i * npix);
    f->flags = (f->flags & ~(uint32_t)(BEAM_FLAG_META | BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL)) | flags;
    beam_emit_put(emit, f);
  }
  if ((f = beam_emit_get(emit, BEAM_PCA_OUT_MEAN))) {
    scatter(h, h->mu, f->data);
    f->flags = (f->flags & ~(uint32_t)(BEAM_FLAG_META | BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL)) | flags;
    beam_emit_put(emit, f);
  }
  if ((f = beam_emit_get(emit, BEAM_PCA_OUT_SV))) {
    for (size_t i = 0; i < k; i++)
      ((float *)f->data)[i] = (float)h->s[i];
    f->flags = (f->flags & ~(uint32_t)(BEAM_FLAG_META | BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL)) | flags;
    beam_emit_put(emit, f);
  }
  if ((f = beam_emit_get(emit, BEAM_PCA_OUT_EVR))) {
    for (size_t i = 0; i < k; i++)
      ((float *)f->data)[i] = h->scatter > 0 ? (float)(h->s[i] * h->s[i] / h->scatter) : 0.0f;
    f->flags = (f->flags & ~(uint32_t)(BEAM_FLAG_META | BEAM_FLAG_PARTIAL | BEAM_FLAG_FINAL)) | flags;
    beam_emit_put(emit, f);
  }
}

/* ---- robust ------------------------------------------------------------------ */

/* The k-th smallest of v[0..n) and, in *below, the largest of the k below
 * it (-inf when k == 0), v left as it was. Quickselect (Hoare 1961) with a
 * median-of-3 pivot, partitioning out of place into two scratch halves
 * without a branch per value (both ends are written, one index moves):
 * about 2.5 n steps that do not wait on a mispredicted branch, 3x Wirth's
 * in-place selection on the 2048-value noise samples (bench/pca robust).
 * n <= BEAM_PCA_NSAMP. */
#define SEL_SMALL 32
static float select_kth(const float *v, size_t n, size_t k, float *below) {
  float buf[2][BEAM_PCA_NSAMP];
  const float *src = v;
  float *dst = buf[0], *spare = buf[1];
  float lo = -INFINITY;
  while (n > SEL_SMALL) {
    float a = src[0], b = src[n / 2], c = src[n - 1];
    float mn = a < b ? a : b, mx = a < b ? b : a;
    float pv = mx < c ? mx : (mn < c ? c : mn);
    if (isnan(pv)) /* no order to select by (the stage keeps NaN out) */
      return *below = NAN;
    size_t nl = 0, nr = n;
    for (size_t i = 0; i < n; i++) {
      float t = src[i];
      int lt = t < pv;
      dst[nl] = t;
      dst[nr - 1] = t;
      nl += lt;
      nr -= !lt;
    }
    if (nl == 0) {
      /* pv is the smallest value: set its copies aside. */
      size_t ne = 0;
      for (size_t i = 0; i < n; i++) {
        float t = src[i];
        dst[ne] = t;
        ne += t != pv;
      }
      size_t neq = n - ne;
      if (k < neq) {
        *below = k > 0 ? pv : lo;
        return pv;
      }
      lo = pv;
      k -= neq;
      n = ne;
    } else if (k < nl) {
      n = nl;
    } else {
      for (size_t i = 0; i < nl; i++)
        lo = dst[i] > lo ? dst[i] : lo;
      memmove(dst, dst + nl, (n - nl) * sizeof *dst);
      k -= nl;
      n -= nl;
    }
    src = dst;
    dst = spare;
    spare = (float *)src;
  }
  float t[SEL_SMALL];
  memcpy(t, src, n * sizeof *t);
  for (size_t i = 1; i < n; i++) { /* insertion sort */
    float x = t[i];
    size_t j = i;
    for (; j > 0 && t[j - 1] > x; j--)
      t[j] = t[j - 1];
    t[j] = x;
  }
  if (k > 0 && t[k - 1] > lo)
    lo = t[k - 1];
  *below = lo;
  return t[k];
}

float beam_pca_median(float *v, size_t n) {
  BEAM_ASSERT(n >= 1 && n <= BEAM_PCA_NSAMP);
  float lo, hi = select_kth(v, n, n / 2, &lo);
  if (n % 2)
    return hi;
  /* The other middle: the largest of the lower half. */
  return 0.5f * (lo + hi);
}

float beam_pca_sigma_of(float *v, size_t n) {
  if (n == 0)
    return 0.0f;
  float med = beam_pca_median(v, n);
  double mean_abs = 0;
  for (size_t i = 0; i < n; i++) {
    v[i] = fabsf(v[i] - med);
    mean_abs += v[i];
  }
  float mad = beam_pca_median(v, n);
  if (mad > 0)
    return 1.4826f * mad;
  /* More than half the sampled residuals equal (noise-free pixels, a
   * constant region): the mean absolute deviation still sees the rest; 0
   * only when every sampled pixel sits on the median. */
  return (float)(1.2533 * mean_abs / (double)n);
}

float beam_pca_sigma(size_t P, const float *e, float *scratch) {
  size_t n = beam_pca_samp_n(P);
  for (size_t i = 0; i < n; i++)
    scratch[i] = e[beam_pca_samp_idx(P, i)];
  return beam_pca_sigma_of(scratch, n);
}

uint32_t beam_pca_rejects(beam_pca_host_t *h) {
  const beam_pca_conf_t *c = &h->conf;
  uint32_t n = 0;
  for (uint32_t j = 0; j < h->nb; j++) {
    h->rej[j] = c->robust_reject > 0 && h->zb[j] > c->robust_reject;
    n += h->rej[j];
  }
  /* A glitch is rare; most of a batch far off the model is the data
   * changing, which the model must follow. */
  if (2 * n > h->nb) {
    memset(h->rej, 0, h->nb);
    n = 0;
  }
  h->nrejected += n;
  return n;
}
