/* Stage kind `xpcs_multitau`: schema, per-series state shared by the CPU
 * and CUDA backends, the lag list, truncation and publishing. The level
 * and pair arithmetic is in xpcs_multitau_cpu.c and
 * gpu/xpcs_multitau_cuda.cu. */
#include "pipeline/kern/xpcs_multitau.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

static const char *even_buffers(const beam_cnode_t *v) {
  return v->ival % 2 != 0 ? "buffers must be even (scikit-beam's num_bufs)" : NULL;
}

const beam_param_t beam_xpcs_multitau_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"rois", BEAM_P_MAP, NULL, 1, 0, 0, NULL, beam_xpcs_rois_params,
     "ROIs: a label image file, or rings around a centre", NULL},
    {"levels", BEAM_P_INT, "8", 0, 1, BEAM_XMT_MAX_LEVELS, NULL, NULL,
     "number of multi-tau levels (level L averages 2^L frames)", NULL},
    {"buffers", BEAM_P_INT, "8", 0, 2, 1024, NULL, NULL,
     "buffers per level, even: lag channels 0..buffers-1 at level 0", even_buffers},
    {"publish_every", BEAM_P_INT, "1000", 0, 0, 1e9, NULL, NULL,
     "publish partial results every N frames (0 = at series end only)", NULL},
    {"intensities", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "also publish G, IP and IF as outputs g_num, ip, if (numerator, past and future intensities)", NULL},
    {"intensity_rows", BEAM_P_ENUM, "g2", 0, 0, 0, "g2|pairs", NULL,
     "rows of g_num, ip, if (with intensities): g2, the rows g2 has (cut at the first zero past "
     "intensity of any ROI); pairs, every lag with pairs so far, so a dark ROI leaves its neighbours' "
     "G, IP and IF (and lags) published", NULL},
    {"normalization", BEAM_P_ENUM, "roi", 0, 0, 0, "roi|per_pixel", NULL,
     "roi: G/(IP IF) of ROI means (scikit-beam); per_pixel: per-pixel G/(IP IF) averaged over the ROI, "
     "with standard errors as output g2_err (the per-pixel statistic of APS boost_corr's errors)", NULL},
    {"threads", BEAM_P_INT, "1", 0, 0, BEAM_XMT_MAX_THREADS, NULL, NULL,
     "cpu backend: threads sharing each frame's work over pixel tiles (0 = one per online core, at most 16)",
     NULL},
    BEAM_PARAM_END};

#define WHO "xpcs_multitau"

void beam_xmt_free(beam_xmt_t *x) {
  if (!x)
    return;
  beam_xpcs_rois_free(&x->rois);
  free(x->lag_steps);
  free(x->lvl);
  free(x->lsum);
  free(x->bad);
  free(x->nlev);
  free(x->chunk);
  free(x->G);
  free(x->IP);
  free(x->IF);
  free(x->npairs);
  free(x->pG);
  free(x->pIP);
  free(x->pIF);
  free(x->lmax);
  free(x->bnd);
  memset(x, 0, sizeof *x);
}

int beam_xmt_init(beam_xmt_t *x, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(x, 0, sizeof *x);
  int64_t nb = beam_cfg_int(cfg, "buffers", 8), lv = beam_cfg_int(cfg, "levels", 8);
  /* The validator has checked these; a tree built by hand may not be. */
  if (nb < 2 || nb > 1024 || nb % 2)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": buffers must be even, 2..1024, got %lld", (long long)nb);
  if (lv < 1 || lv > BEAM_XMT_MAX_LEVELS)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": levels must be 1..%d, got %lld", BEAM_XMT_MAX_LEVELS, (long long)lv);
  x->conf.nb = (unsigned)nb;
  x->conf.levels = (unsigned)lv;
  int64_t pe = beam_cfg_int(cfg, "publish_every", 1000);
  x->conf.publish_every = pe > 0 ? (uint64_t)pe : 0;
  x->conf.with_sums = beam_cfg_bool(cfg, "intensities", 0);
  const char *irows = beam_cfg_str(cfg, "intensity_rows");
  x->conf.sum_rows_pairs = irows && strcmp(irows, "pairs") == 0;
  if (x->conf.sum_rows_pairs && !x->conf.with_sums)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": intensity_rows: pairs needs intensities: true");
  const char *norm = beam_cfg_str(cfg, "normalization");
  if (norm && strcmp(norm, "roi") != 0 && strcmp(norm, "per_pixel") != 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": normalization must be roi or per_pixel, got \"%s\"", norm);
  x->conf.per_pixel = norm && strcmp(norm, "per_pixel") == 0;
  int64_t th = beam_cfg_int(cfg, "threads", 1);
  if (th < 0 || th > BEAM_XMT_MAX_THREADS)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": threads must be 0..%d, got %lld", BEAM_XMT_MAX_THREADS, (long long)th);
  x->conf.threads = (unsigned)th;
  return beam_xpcs_rois_init(&x->rois, beam_cfg_get(cfg, "rois"), WHO, d);
}

static int exact_dtype(beam_dtype_t dt) {
  return dt == BEAM_DT_U8 || dt == BEAM_DT_U16 || dt == BEAM_DT_U32 || dt == BEAM_DT_I8 ||
         dt == BEAM_DT_I16 || dt == BEAM_DT_I32;
}

/* Largest |pixel| of an exact dtype. */
static double dtype_mag(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return 255.0;
  case BEAM_DT_U16: return 65535.0;
  case BEAM_DT_U32: return 4294967295.0;
  case BEAM_DT_I8: return 128.0;
  case BEAM_DT_I16: return 32768.0;
  case BEAM_DT_I32: return 2147483648.0;
  default: return INFINITY;
  }
}

void beam_xmt_reset(beam_xmt_t *x) {
  size_t L = x->conf.levels, nb = x->conf.nb;
  memset(x->bad, 0, L * nb);
  memset(x->nlev, 0, L * sizeof *x->nlev);
  memset(x->G, 0, x->nlags * x->R * beam_xmt_acc_size(x));
  memset(x->IP, 0, x->nlags * x->R * beam_xmt_acc_size(x));
  memset(x->IF, 0, x->nlags * x->R * beam_xmt_acc_size(x));
  memset(x->npairs, 0, x->nlags * sizeof *x->npairs);
  x->nframes = x->nbad = 0;
  x->ovf_row = -1;
  if (x->conf.per_pixel) {
    size_t n = x->nlags * x->P * beam_xmt_lvl_size(x);
    memset(x->pG, 0, n);
    memset(x->pIP, 0, n);
    memset(x->pIF, 0, n);
    memset(x->lmax, 0, L * nb * sizeof *x->lmax);
    memset(x->bnd, 0, 2 * x->nlags * sizeof *x->bnd);
  }
}

static void declare(beam_outdesc_t *o, const char *name, beam_dtype_t dt, uint32_t ndim,
                    const uint32_t *shape, const char *units) {
  beam__declare(o, name, dt, ndim, shape, units, 0);
  o->slots = 4;
}

int beam_xmt_start(beam_stage_t *self, beam_xmt_t *x, const beam_series_t *s, const beam_indesc_t *in,
                   beam_diag_t *d) {
  char fs[64];
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2 || in->shape[0] == 0 || in->shape[1] == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": frames must be 2-D and non-empty, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  int rc = beam_xpcs_rois_start(&x->rois, in->shape[0], in->shape[1], s, WHO, d);
  if (rc < 0)
    return rc;
  size_t L = x->conf.levels, nb = x->conf.nb;
  x->in = *in;
  x->exact = exact_dtype(in->dtype);
  x->P = x->rois.total;
  x->R = x->rois.nroi;
  x->nlags = (L + 1) * nb / 2;
  free(x->lag_steps), free(x->lvl), free(x->lsum), free(x->bad), free(x->nlev), free(x->chunk);
  free(x->G), free(x->IP), free(x->IF), free(x->npairs);
  free(x->pG), free(x->pIP), free(x->pIF), free(x->lmax), free(x->bnd);
  x->pG = x->pIP = x->pIF = NULL, x->lmax = NULL, x->bnd = NULL;
  size_t ls = beam_xmt_lvl_size(x), as = beam_xmt_acc_size(x);
  x->lag_steps = malloc(x->nlags * sizeof *x->lag_steps);
  x->lvl = malloc(L * nb * x->P * ls);
  x->lsum = calloc(L * nb * x->R, as);
  x->bad = calloc(L * nb, 1);
  x->nlev = calloc(L, sizeof *x->nlev);
  x->chunk = calloc(L, sizeof *x->chunk);
  x->G = calloc(x->nlags * x->R, as);
  x->IP = calloc(x->nlags * x->R, as);
  x->IF = calloc(x->nlags * x->R, as);
  x->npairs = calloc(x->nlags, sizeof *x->npairs);
  if (!x->lag_steps || !x->lvl || !x->lsum || !x->bad || !x->nlev || !x->chunk || !x->G || !x->IP ||
      !x->IF || !x->npairs)
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %zu levels x %zu buffers x %zu pixels", L, nb, x->P);
  if (x->conf.per_pixel) {
    size_t n = x->nlags * x->P * ls;
    x->pG = malloc(n), x->pIP = malloc(n), x->pIF = malloc(n); /* zeroed (touched) by reset */
    x->lmax = calloc(L * nb, sizeof *x->lmax);
    x->bnd = calloc(2 * x->nlags, sizeof *x->bnd);
    if (!x->pG || !x->pIP || !x->pIF || !x->lmax || !x->bnd)
      return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": per_pixel: cannot allocate 3 x %zu lags x %zu pixels x %zu bytes",
                       x->nlags, x->P, ls);
  }
  /* skbeam.core.utils.multi_tau_lags */
  for (size_t i = 0; i < nb; i++)
    x->lag_steps[i] = (int64_t)i;
  for (size_t lev = 1; lev < L; lev++)
    for (size_t j = 0; j < nb / 2; j++)
      x->lag_steps[lev * nb / 2 + nb / 2 + j] = (int64_t)((nb / 2 + j) << lev);
  for (size_t lev = 0; lev < L; lev++) {
    /* |level sum| <= m = mag 2^lev; chunk products sum below 2^63. */
    double m = dtype_mag(in->dtype) * ldexp(1.0, (int)lev), m2 = m * m;
    double c = m2 > 0 ? floor(9.2e18 / m2) : 0;
    x->chunk[lev] = !x->exact || c < 1 ? 0 : c > 1e9 ? (size_t)1e9 : (size_t)c;
  }
  x->lag_scale = s && s->frame_time_s > 0 ? s->frame_time_s : 1.0;
  beam_xmt_reset(x);

  uint32_t sh2[2] = {(uint32_t)x->nlags, (uint32_t)x->R}, sh1[1] = {(uint32_t)x->nlags},
           shi[1] = {BEAM_XMT_INFO_N};
  declare(&self->outs[BEAM_XMT_OUT_G2], "g2", BEAM_DT_F64, 2, sh2, "");
  declare(&self->outs[BEAM_XMT_OUT_LAGS], "lags", BEAM_DT_F64, 1, sh1, s && s->frame_time_s > 0 ? "s" : "frames");
  declare(&self->outs[BEAM_XMT_OUT_INFO], "info", BEAM_DT_I64, 1, shi, "");
  self->outs[BEAM_XMT_OUT_INFO].axes[0] = "field";
  self->outs[BEAM_XMT_OUT_INFO].labels_json =
      "[\"frames\",\"bad_frames\",\"rows\",\"nlags\",\"dark_label\",\"dark_row\"]";
  self->outs[BEAM_XMT_OUT_LAGS].axes[0] = "lag";
  self->nouts = 3;
  if (x->conf.with_sums) {
    declare(&self->outs[BEAM_XMT_OUT_G], "g_num", BEAM_DT_F64, 2, sh2, "counts^2");
    declare(&self->outs[BEAM_XMT_OUT_IP], "ip", BEAM_DT_F64, 2, sh2, "counts");
    declare(&self->outs[BEAM_XMT_OUT_IF], "if", BEAM_DT_F64, 2, sh2, "counts");
    self->nouts = 6;
  }
  x->out_err = self->nouts;
  if (x->conf.per_pixel) {
    declare(&self->outs[x->out_err], "g2_err", BEAM_DT_F64, 2, sh2, "");
    self->nouts++;
  }
  for (unsigned o = 0; o < self->nouts; o++) {
    if (o == BEAM_XMT_OUT_LAGS || o == BEAM_XMT_OUT_INFO)
      continue;
    self->outs[o].axes[0] = "lag";
    self->outs[o].axes[1] = "roi";
    self->outs[o].labels_json = x->rois.labels_json;
  }
  return 0;
}

static double acc_d(const beam_xmt_t *x, const void *a, size_t k) {
  return x->exact ? (double)((const beam_i128 *)a)[k] : ((const double *)a)[k];
}

static int acc_zero(const beam_xmt_t *x, const void *a, size_t k) {
  return x->exact ? ((const beam_i128 *)a)[k] == 0 : ((const double *)a)[k] == 0.0;
}

size_t beam_xmt_rows(const beam_xmt_t *x, int64_t *dark_label) {
  *dark_label = -1;
  for (size_t t = 0; t < x->nlags; t++)
    for (size_t r = 0; r < x->R; r++)
      if (acc_zero(x, x->IP, t * x->R + r)) {
        if (x->npairs[t] > 0)
          *dark_label = x->rois.label[r];
        return t;
      }
  return x->nlags;
}

static void set_rows(beam_frame_t *f, size_t rows, size_t cols) {
  f->shape[0] = (uint32_t)rows;
  f->nbytes = rows * (cols ? cols : 1) * sizeof(double);
}

/* per_pixel: the per-ROI sums are the sums of the per-pixel ones. */
static void fold_pixels(beam_xmt_t *x) {
  const uint64_t *off = x->rois.off;
  for (size_t t = 0; t < x->nlags; t++)
    for (size_t r = 0; r < x->R; r++) {
      size_t a = t * x->P + off[r], b = t * x->P + off[r + 1], k = t * x->R + r;
      if (x->exact) {
        const int64_t *g = x->pG, *ip = x->pIP, *fu = x->pIF;
        beam_i128 sg = 0, sp = 0, sf = 0;
        for (size_t p = a; p < b; p++)
          sg += g[p], sp += ip[p], sf += fu[p];
        ((beam_i128 *)x->G)[k] = sg, ((beam_i128 *)x->IP)[k] = sp, ((beam_i128 *)x->IF)[k] = sf;
      } else {
        const double *g = x->pG, *ip = x->pIP, *fu = x->pIF;
        double sg = 0, sp = 0, sf = 0;
        for (size_t p = a; p < b; p++)
          sg += g[p], sp += ip[p], sf += fu[p];
        ((double *)x->G)[k] = sg, ((double *)x->IP)[k] = sp, ((double *)x->IF)[k] = sf;
      }
    }
}

static double pix_d(const beam_xmt_t *x, const void *a, size_t k) {
  return x->exact ? (double)((const int64_t *)a)[k] : ((const double *)a)[k];
}

/* per_pixel g2 of ROI r on row t: mean over the pixels with nonzero past
 * and future intensity of g2_p = pG n / (pIP pIF), and std/sqrt(count)
 * (population std, numpy's default); NaN when no pixel qualifies. */
static void pixel_g2(const beam_xmt_t *x, size_t t, size_t r, double *mean, double *err) {
  size_t a = t * x->P + x->rois.off[r], b = t * x->P + x->rois.off[r + 1];
  double n = (double)x->npairs[t], s = 0, cnt = 0;
  for (size_t p = a; p < b; p++) {
    double ip = pix_d(x, x->pIP, p), fu = pix_d(x, x->pIF, p);
    if (ip != 0 && fu != 0)
      s += pix_d(x, x->pG, p) * n / (ip * fu), cnt++;
  }
  double m = s / cnt, v = 0; /* two passes: no cancellation in the variance */
  for (size_t p = a; p < b; p++) {
    double ip = pix_d(x, x->pIP, p), fu = pix_d(x, x->pIF, p);
    if (ip != 0 && fu != 0) {
      double dv = pix_d(x, x->pG, p) * n / (ip * fu) - m;
      v += dv * dv;
    }
  }
  *mean = cnt > 0 ? m : NAN;
  *err = cnt > 0 ? sqrt(v / cnt) / sqrt(cnt) : NAN;
}

/* g2 (and g2_err for per_pixel) of the first rows rows; < 0 when the
 * graph is shutting down. */
static int publish_g2(beam_xmt_t *x, beam_emit_t *emit, uint32_t flag, size_t rows) {
  size_t R = x->R;
  beam_frame_t *f;
  if (!(f = beam_emit_get(emit, BEAM_XMT_OUT_G2)))
    return -1;
  double *g2 = f->data;
  if (x->conf.per_pixel) {
    beam_frame_t *fe = beam_emit_get(emit, x->out_err);
    if (!fe) {
      beam_emit_drop(emit, f);
      return -1;
    }
    double *ge = fe->data;
    for (size_t t = 0; t < rows; t++)
      for (size_t r = 0; r < R; r++)
        pixel_g2(x, t, r, &g2[t * R + r], &ge[t * R + r]);
    /* g2 first, then g2_err through the common tail below */
    set_rows(f, rows, R);
    f->flags = flag;
    beam_emit_put(emit, f);
    f = fe;
  } else {
    for (size_t t = 0; t < rows; t++)
      for (size_t r = 0; r < R; r++) {
        size_t k = t * R + r;
        double np = (double)x->npairs[t] * (double)(x->rois.off[r + 1] - x->rois.off[r]);
        g2[k] = acc_d(x, x->G, k) * np / (acc_d(x, x->IP, k) * acc_d(x, x->IF, k));
      }
  }
  set_rows(f, rows, R);
  f->flags = flag;
  beam_emit_put(emit, f);
  return 0;
}

int beam_xmt_publish(beam_xmt_t *x, beam_emit_t *emit, uint32_t flag) {
  int64_t dark;
  if (x->conf.per_pixel)
    fold_pixels(x);
  size_t rows = beam_xmt_rows(x, &dark), R = x->R;
  /* Rows of g_num/ip/if and lags: g2's, or every leading lag with pairs. */
  size_t srows = rows;
  if (x->conf.sum_rows_pairs)
    while (srows < x->nlags && x->npairs[srows] > 0)
      srows++;
  beam_frame_t *f = beam_emit_get(emit, BEAM_XMT_OUT_INFO);
  if (!f)
    return 0;
  int64_t *info = f->data;
  info[BEAM_XMT_INFO_FRAMES] = (int64_t)x->nframes;
  info[BEAM_XMT_INFO_BAD] = (int64_t)x->nbad;
  info[BEAM_XMT_INFO_ROWS] = (int64_t)rows;
  info[BEAM_XMT_INFO_NLAGS] = (int64_t)x->nlags;
  info[BEAM_XMT_INFO_DARK_LABEL] = dark;
  info[BEAM_XMT_INFO_DARK_ROW] = rows < x->nlags ? (int64_t)rows : -1;
  f->flags = flag;
  beam_emit_put(emit, f);
  /* A zero-length array cannot go on the wire (PROTOCOL.md: no zero
   * dimension): with no row to show, info alone says so. */
  if (srows == 0)
    return 0;
  if (rows > 0 && publish_g2(x, emit, flag, rows) < 0)
    return 0;
  if (!(f = beam_emit_get(emit, BEAM_XMT_OUT_LAGS)))
    return 0;
  double *lg = f->data;
  for (size_t t = 0; t < srows; t++)
    lg[t] = (double)x->lag_steps[t] * x->lag_scale;
  set_rows(f, srows, 0);
  f->flags = flag;
  beam_emit_put(emit, f);
  if (!x->conf.with_sums)
    return 0;
  for (unsigned o = BEAM_XMT_OUT_G; o <= BEAM_XMT_OUT_IF; o++) {
    if (!(f = beam_emit_get(emit, o)))
      return 0;
    const void *a = o == BEAM_XMT_OUT_G ? x->G : o == BEAM_XMT_OUT_IP ? x->IP : x->IF;
    double *v = f->data;
    for (size_t t = 0; t < srows; t++) {
      int lev = (int)beam_xmt_level_of(x, t);
      for (size_t r = 0; r < R; r++) {
        size_t k = t * R + r;
        double den = (double)x->npairs[t] * (double)(x->rois.off[r + 1] - x->rois.off[r]);
        /* level sums carry 2^L per factor */
        v[k] = ldexp(acc_d(x, a, k) / den, o == BEAM_XMT_OUT_G ? -2 * lev : -lev);
      }
    }
    set_rows(f, srows, R);
    f->flags = flag;
    beam_emit_put(emit, f);
  }
  return 0;
}

int beam_xmt_check(const beam_xmt_t *x, beam_diag_t *d) {
  if (x->ovf_row < 0)
    return 0;
  return BEAM_DIAG(d, BEAM_ELIMIT,
                   WHO ": normalization per_pixel: the int64 per-pixel sums of lag %lld (row %lld) could "
                   "overflow after %llu frames; results for this series are withdrawn (use fewer levels, "
                   "shorter series or normalization roi)",
                   (long long)x->lag_steps[x->ovf_row], (long long)x->ovf_row, (unsigned long long)x->nframes);
}
