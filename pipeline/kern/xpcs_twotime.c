/* Stage kind `xpcs_twotime`: schema, per-series state shared by the CPU and
 * CUDA backends, the frame buffer, the memory budget, and turning the
 * backends' numerator products into c2 (normalised, symmetrised, banded or
 * windowed), g2 from the diagonals, and published results. See
 * xpcs_twotime.h for the definitions. */
#include "pipeline/kern/xpcs_twotime.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

static const char *even_bufs(const beam_cnode_t *v) {
  return v->ival % 2 != 0 ? "num_bufs must be even (scikit-beam refuses an odd num_bufs)" : NULL;
}

const beam_param_t beam_xpcs_twotime_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"rois", BEAM_P_MAP, NULL, 1, 0, 0, NULL, beam_xpcs_rois_params,
     "ROIs: a label image file, or rings around a centre", NULL},
    {"mode", BEAM_P_ENUM, "full", 0, 0, 0, "full|band|window", NULL,
     "full: [R, T, T]; band: |t1 - t2| < width as [R, T, width]; window: the last width frames", NULL},
    {"width", BEAM_P_INT, "100", 0, 1, BEAM_X2T_MAX_FRAMES, NULL, NULL,
     "band width or window length, in frames (ignored by mode full)", NULL},
    {"max_frames", BEAM_P_INT, "2000", 0, 1, BEAM_X2T_MAX_FRAMES, NULL, NULL,
     "full and band: frames kept per series; later frames are dropped (counted)", NULL},
    {"memory_limit", BEAM_P_SIZE, "2Gi", 0, 1048576.0, 1099511627776.0, NULL, NULL,
     "host bytes for the frame buffer, the c2 result and scratch; more is an error at init or series start",
     NULL},
    {"precision", BEAM_P_ENUM, "float64", 0, 0, 0, "float64|float32", NULL,
     "frame buffer, products and c2 in float64 or float32 (integer counts exact below 2^24)", NULL},
    {"errors", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "also publish g2_err, the standard error of each g2 diagonal mean", NULL},
    {"publish_every", BEAM_P_INT, "0", 0, 0, 1e9, NULL, NULL,
     "publish partial results over the frames so far every N frames (0 = at series end only)", NULL},
    {"publish_rows", BEAM_P_INT, "0", 0, 0, BEAM_X2T_MAX_FRAMES, NULL, NULL,
     "publish each block of N completed rows of c2 as output c2_rows while the series runs (0 = off)", NULL},
    {"num_levels", BEAM_P_INT, "1", 0, 1, BEAM_X2T_MAX_LEVELS, NULL, NULL,
     "scikit-beam's num_levels (mode full, with num_bufs): level L pairs means of 2^L frames; 1 = frames only",
     NULL},
    {"num_bufs", BEAM_P_INT, "0", 0, 0, BEAM_X2T_MAX_FRAMES, NULL, NULL,
     "scikit-beam's num_bufs, even (mode full): lags 0..num_bufs-1 at level 0 and i 2^L, i = num_bufs/2.."
     "num_bufs-1, at level L; cells of no such pair are 0. 0 = every pair (one level)",
     even_bufs},
    BEAM_PARAM_END};

#define WHO "xpcs_twotime"

void beam_x2t_free(beam_x2t_t *x) {
  if (!x)
    return;
  beam_xpcs_rois_free(&x->rois);
  free(x->buf);
  free(x->sum);
  free(x->bad);
  free(x->scratch);
  free(x->lv);
  free(x->lsum);
  free(x->lbad);
  memset(x, 0, sizeof *x);
}

static double gib(double b) { return b / 1073741824.0; }

/* Elements of one ROI's c2 (declared), of the scratch, and the band block. */
static size_t band_blk(size_t w) { return w < 64 ? 64 : w > 1024 ? 1024 : w; }

static double c2_cells(const beam_x2t_conf_t *c, size_t tdecl) {
  switch (c->mode) {
  case BEAM_X2T_FULL: return (double)tdecl * (double)tdecl;
  case BEAM_X2T_BAND: return (double)tdecl * (double)c->width;
  default: return (double)c->width * (double)c->width;
  }
}

static double scratch_cells(const beam_x2t_conf_t *c) {
  size_t b = band_blk(c->width);
  return c->mode == BEAM_X2T_BAND ? (double)b * (double)(b + c->width - 1)
         : c->mode == BEAM_X2T_WINDOW ? (double)c->width * (double)c->width
                                      : 0;
}

double beam_x2t_bytes(const beam_x2t_t *x, size_t P, size_t R, size_t tdecl) {
  const beam_x2t_conf_t *c = &x->conf;
  double es = (double)beam_x2t_esize(x);
  double cap = c->mode == BEAM_X2T_WINDOW ? (double)c->width : (double)tdecl;
  double lags = c->mode == BEAM_X2T_FULL ? (double)tdecl : (double)c->width;
  /* publish_rows: two c2_rows slots of up to N rows of the widest block */
  double nr = (double)(c->publish_rows < cap ? c->publish_rows : (size_t)cap);
  double blocks = 2 * (double)R * nr * (c->mode == BEAM_X2T_FULL ? (double)tdecl : (double)c->width) * es;
  double ring = c->levels > 1 ? (double)c->nb * ((double)P * 8 + (double)R * 8 + 1) : 0;
  return cap * (double)P * es + cap * (double)R * 8 + cap + (double)R * c2_cells(c, tdecl) * es +
         scratch_cells(c) * es + 4 * (c->errors ? 3 : 2) * lags * (double)R * 8 + blocks + ring;
}

/* g2 lags with a pair among T frames: the multi-tau lag list's prefix
 * (a level-L lag i needs (i + 1) 2^L frames, more than any lag below it). */
static size_t mt_lags(const beam_x2t_conf_t *c, size_t T) {
  size_t K = T < c->nb ? T : c->nb, h = c->nb / 2;
  for (unsigned L = 1; L < c->levels; L++) {
    size_t n = T >> L;
    K += n > h ? (n < c->nb ? n : c->nb) - h : 0;
  }
  return K;
}

void beam_x2t_lag(const beam_x2t_t *x, size_t k, unsigned *level, size_t *i) {
  size_t nb = x->conf.nb, h = nb / 2;
  if (nb == 0 || k < nb) {
    *level = 0, *i = k;
    return;
  }
  *level = 1 + (unsigned)((k - nb) / h);
  *i = h + (k - nb) % h;
}

/* num_bufs / num_levels against each other and the other keys: the
 * message and the node to point at, or 0. scikit-beam refuses an odd
 * num_bufs; the rest are what beamd does not combine. */
static int levels_conflict(const beam_cnode_t *cfg, char *msg, size_t len, const beam_cnode_t **at) {
  int64_t nl = beam_cfg_int(cfg, "num_levels", 1), nb = beam_cfg_int(cfg, "num_bufs", 0);
  int64_t pr = beam_cfg_int(cfg, "publish_rows", 0);
  const char *mode = beam_cfg_str(cfg, "mode");
  const beam_cnode_t *n_nl = beam_cfg_get(cfg, "num_levels"), *n_nb = beam_cfg_get(cfg, "num_bufs");
  *at = n_nb ? n_nb : cfg;
  /* the validator has checked the ranges; a tree built by hand may not be */
  if (nl < 1 || nl > BEAM_X2T_MAX_LEVELS) {
    *at = n_nl ? n_nl : cfg;
    snprintf(msg, len, WHO ": num_levels must be 1..%u, got %lld", BEAM_X2T_MAX_LEVELS, (long long)nl);
  } else if (nb < 0 || nb > BEAM_X2T_MAX_FRAMES || nb % 2) {
    snprintf(msg, len, WHO ": num_bufs must be even, 0..%u, got %lld", BEAM_X2T_MAX_FRAMES, (long long)nb);
  } else if (nl > 1 && nb == 0) {
    *at = n_nl ? n_nl : cfg;
    snprintf(msg, len, WHO ": num_levels %lld needs num_bufs (scikit-beam's buffers per level, even, >= 2)",
             (long long)nl);
  } else if (nb && mode && strcmp(mode, "full") != 0) {
    snprintf(msg, len, WHO ": num_bufs and num_levels need mode full (mode band is num_bufs = width at one level, "
             "without the zeros)");
  } else if (nb && pr) {
    /* a level-L cell is final only when its 2^L-frame block is complete */
    snprintf(msg, len, WHO ": publish_rows cannot be combined with num_bufs / num_levels");
  } else {
    return 0;
  }
  return 1;
}

int beam_xpcs_twotime_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs) {
  const beam_cnode_t *at;
  char msg[256];
  if (!levels_conflict(cfg, msg, sizeof msg, &at))
    return 0;
  beam_cfg_err(errs, at, "%s", msg);
  return 1;
}

int beam_x2t_init(beam_x2t_t *x, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(x, 0, sizeof *x);
  beam_x2t_conf_t *c = &x->conf;
  const char *mode = beam_cfg_str(cfg, "mode"), *prec = beam_cfg_str(cfg, "precision");
  c->mode = !mode || strcmp(mode, "full") == 0 ? BEAM_X2T_FULL
            : strcmp(mode, "band") == 0        ? BEAM_X2T_BAND
            : strcmp(mode, "window") == 0      ? BEAM_X2T_WINDOW
                                               : (beam_x2t_mode_t)-1;
  if ((int)c->mode < 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": mode must be full, band or window, got \"%s\"", mode);
  if (prec && strcmp(prec, "float64") != 0 && strcmp(prec, "float32") != 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": precision must be float64 or float32, got \"%s\"", prec);
  c->f32 = prec && strcmp(prec, "float32") == 0;
  int64_t w = beam_cfg_int(cfg, "width", 100), mf = beam_cfg_int(cfg, "max_frames", 2000);
  int64_t lim = beam_cfg_int(cfg, "memory_limit", (int64_t)2 << 30), pe = beam_cfg_int(cfg, "publish_every", 0);
  int64_t pr = beam_cfg_int(cfg, "publish_rows", 0);
  /* The validator has checked these; a tree built by hand may not be. */
  if (w < 1 || w > BEAM_X2T_MAX_FRAMES || mf < 1 || mf > BEAM_X2T_MAX_FRAMES)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": width and max_frames must be 1..%u, got %lld and %lld",
                     BEAM_X2T_MAX_FRAMES, (long long)w, (long long)mf);
  if (lim <= 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": memory_limit must be positive");
  c->width = (size_t)w;
  c->max_frames = (size_t)mf;
  c->memory_limit = (uint64_t)lim;
  c->errors = beam_cfg_bool(cfg, "errors", 0);
  c->publish_every = pe > 0 ? (uint64_t)pe : 0;
  if (pr < 0 || pr > BEAM_X2T_MAX_FRAMES)
    return BEAM_DIAG(d, BEAM_ECONFIG, WHO ": publish_rows must be 0..%u, got %lld", BEAM_X2T_MAX_FRAMES,
                     (long long)pr);
  /* a block's rows must all be in the ring when its last frame arrives */
  if (c->mode == BEAM_X2T_WINDOW && (size_t)pr > c->width)
    return BEAM_DIAG(d, BEAM_ECONFIG,
                     WHO ": publish_rows %lld is more than width %zu: in mode window a block's first rows would "
                     "have left the ring when it completes",
                     (long long)pr, c->width);
  c->publish_rows = (size_t)pr;
  const beam_cnode_t *at;
  char msg[256];
  if (levels_conflict(cfg, msg, sizeof msg, &at))
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s", msg);
  int64_t nl = beam_cfg_int(cfg, "num_levels", 1), nb = beam_cfg_int(cfg, "num_bufs", 0);
  c->nb = (size_t)nb;
  c->levels = (unsigned)nl;
  /* One ROI's result alone must fit: caught here, before any series. */
  double one = c2_cells(c, c->max_frames) * (double)beam_x2t_esize(x);
  if (one > (double)c->memory_limit)
    return BEAM_DIAG(d, BEAM_ECONFIG,
                     WHO ": one ROI's c2 (%s) needs %.3g GiB, more than memory_limit %.3g GiB; lower %s, "
                     "use mode band or window, precision float32, or raise memory_limit",
                     c->mode == BEAM_X2T_FULL   ? "max_frames^2"
                     : c->mode == BEAM_X2T_BAND ? "max_frames x width"
                                                : "width^2",
                     gib(one), gib((double)c->memory_limit), c->mode == BEAM_X2T_WINDOW ? "width" : "max_frames");
  return beam_xpcs_rois_init(&x->rois, beam_cfg_get(cfg, "rois"), WHO, d);
}

static void declare(beam_outdesc_t *o, const char *name, beam_dtype_t dt, uint32_t ndim, const uint32_t *shape,
                    const char *units, unsigned slots) {
  beam__declare(o, name, dt, ndim, shape, units, 0);
  o->slots = slots;
}

int beam_x2t_start(beam_stage_t *self, beam_x2t_t *x, const beam_series_t *s, const beam_indesc_t *in,
                   beam_diag_t *d) {
  char fs[64];
  const beam_x2t_conf_t *c = &x->conf;
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2 || in->shape[0] == 0 || in->shape[1] == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, WHO ": frames must be 2-D and non-empty, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  size_t tdecl = c->mode == BEAM_X2T_WINDOW ? c->width : c->max_frames;
  if (c->mode != BEAM_X2T_WINDOW && s && s->nframes > 0) {
    if (s->nframes > c->max_frames)
      return BEAM_DIAG(d, BEAM_ELIMIT,
                       WHO ": the series announces %llu frames, max_frames is %zu (mode %s keeps every frame)",
                       (unsigned long long)s->nframes, c->max_frames, c->mode == BEAM_X2T_FULL ? "full" : "band");
    tdecl = (size_t)s->nframes; /* a smaller result slot */
  }
  int rc = beam_xpcs_rois_start(&x->rois, in->shape[0], in->shape[1], s, WHO, d);
  if (rc < 0)
    return rc;
  size_t P = x->rois.total, R = x->rois.nroi;
  double need = beam_x2t_bytes(x, P, R, tdecl);
  if (need > (double)c->memory_limit)
    return BEAM_DIAG(d, BEAM_ELIMIT,
                     WHO ": %zu ROIs, %zu pixels, %zu frames need %.3g GiB (frames %.3g GiB, c2 %.3g GiB), more "
                     "than memory_limit %.3g GiB",
                     R, P, tdecl, gib(need),
                     gib((double)(c->mode == BEAM_X2T_WINDOW ? c->width : tdecl) * (double)P *
                         (double)beam_x2t_esize(x)),
                     gib((double)R * c2_cells(c, tdecl) * (double)beam_x2t_esize(x)), gib((double)c->memory_limit));
  x->in = *in;
  x->P = P;
  x->R = R;
  x->tdecl = tdecl;
  x->cap = c->mode == BEAM_X2T_WINDOW ? c->width : tdecl;
  x->blk = band_blk(c->width);
  free(x->buf), free(x->sum), free(x->bad), free(x->scratch), free(x->lv), free(x->lsum), free(x->lbad);
  x->lv = x->lsum = NULL, x->lbad = NULL;
  size_t es = beam_x2t_esize(x), sc = (size_t)scratch_cells(c);
  x->buf = malloc(x->cap * P * es);
  x->sum = calloc(x->cap * R, sizeof *x->sum);
  x->bad = calloc(x->cap, 1);
  x->scratch = sc ? malloc(sc * es) : NULL;
  if (c->levels > 1) {
    x->lv = malloc(c->nb * P * sizeof *x->lv);
    x->lsum = malloc(c->nb * R * sizeof *x->lsum);
    x->lbad = malloc(c->nb);
  }
  int lfail = c->levels > 1 && (!x->lv || !x->lsum || !x->lbad);
  if (!x->buf || !x->sum || !x->bad || (sc && !x->scratch) || lfail)
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %.3g GiB for %zu frames x %zu pixels", gib(need),
                     x->cap, P);
  /* touch every page now: first-touch faults of a buffer this size would
   * otherwise land on the per-frame path */
  memset(x->buf, 0, x->cap * P * es);
  x->rows = x->head = x->rows_done = 0;
  x->nframes = x->nbad = x->ndropped = 0;
  x->lag_scale = s && s->frame_time_s > 0 ? s->frame_time_s : 1.0;

  beam_dtype_t dt = c->f32 ? BEAM_DT_F32 : BEAM_DT_F64;
  size_t lags = c->nb ? mt_lags(c, tdecl) : c->mode == BEAM_X2T_FULL ? tdecl : c->width;
  uint32_t sc2[3] = {(uint32_t)R, (uint32_t)(c->mode == BEAM_X2T_WINDOW ? c->width : tdecl),
                     (uint32_t)(c->mode == BEAM_X2T_FULL ? tdecl : c->width)};
  uint32_t sg[2] = {(uint32_t)lags, (uint32_t)R}, sl[1] = {(uint32_t)lags}, si[1] = {BEAM_X2T_INFO_N};
  /* c2 can be most of memory_limit: one slot, reused once the publisher
   * has sent it. */
  declare(&self->outs[BEAM_X2T_OUT_C2], "c2", dt, 3, sc2, "", 1);
  self->outs[BEAM_X2T_OUT_C2].axes[0] = "roi";
  self->outs[BEAM_X2T_OUT_C2].axes[1] = "t1";
  self->outs[BEAM_X2T_OUT_C2].axes[2] = c->mode == BEAM_X2T_BAND ? "lag" : "t2";
  declare(&self->outs[BEAM_X2T_OUT_G2], "g2", BEAM_DT_F64, 2, sg, "", 4);
  declare(&self->outs[BEAM_X2T_OUT_LAGS], "lags", BEAM_DT_F64, 1, sl, s && s->frame_time_s > 0 ? "s" : "frames", 4);
  declare(&self->outs[BEAM_X2T_OUT_INFO], "info", BEAM_DT_I64, 1, si, "", 4);
  self->outs[BEAM_X2T_OUT_INFO].axes[0] = "field";
  self->outs[BEAM_X2T_OUT_INFO].labels_json =
      "[\"frames\",\"bad_frames\",\"dropped\",\"rows\",\"dark\",\"first_frame\"]";
  self->outs[BEAM_X2T_OUT_LAGS].axes[0] = "lag";
  self->nouts = 4;
  if (c->errors) {
    declare(&self->outs[BEAM_X2T_OUT_G2ERR], "g2_err", BEAM_DT_F64, 2, sg, "", 4);
    self->nouts = 5;
  }
  for (unsigned o = BEAM_X2T_OUT_C2; o < self->nouts; o++) {
    if (o == BEAM_X2T_OUT_LAGS || o == BEAM_X2T_OUT_INFO)
      continue;
    if (o != BEAM_X2T_OUT_C2) {
      self->outs[o].axes[0] = "lag";
      self->outs[o].axes[1] = "roi";
    }
    self->outs[o].labels_json = x->rois.labels_json;
  }
  if (c->publish_rows) {
    size_t cap = x->cap, nr = c->publish_rows < cap ? c->publish_rows : cap;
    uint32_t sr[3] = {(uint32_t)R, (uint32_t)nr, (uint32_t)(c->mode == BEAM_X2T_FULL ? tdecl : c->width)},
             sa[1] = {BEAM_X2T_AT_N};
    beam_outdesc_t *o = &self->outs[self->nouts];
    x->out_rows = self->nouts;
    /* two slots: the next block is computed while one is being sent */
    declare(o, "c2_rows", dt, 3, sr, "", 2);
    o->axes[0] = "roi";
    o->axes[1] = "t1";
    o->axes[2] = c->mode == BEAM_X2T_BAND ? "lag" : "t2";
    o->labels_json = x->rois.labels_json;
    declare(o + 1, "c2_rows_at", BEAM_DT_I64, 1, sa, "", 4);
    o[1].axes[0] = "field";
    o[1].labels_json = "[\"row0\",\"rows\",\"col0\",\"frames\"]";
    self->nouts += 2;
  }
  return 0;
}

/* ---- per frame ---------------------------------------------------------- */

#define GATHER_CASE(T, DT)                                                     \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    for (size_t r = 0; r < R; r++) {                                           \
      double s = 0;                                                            \
      if (x->conf.f32) {                                                       \
        float *restrict o = (float *)row;                                      \
        for (size_t p = off[r]; p < off[r + 1]; p++)                           \
          s += (o[p] = (float)px[idx[p]]);                                     \
      } else {                                                                 \
        double *restrict o = (double *)row;                                    \
        for (size_t p = off[r]; p < off[r + 1]; p++)                           \
          s += (o[p] = (double)px[idx[p]]);                                    \
      }                                                                        \
      sums[r] = s;                                                             \
      nan |= isnan(s);                                                         \
    }                                                                          \
    break;                                                                     \
  }

/* Gathers into buffer row `slot`; returns 1 when a ROI pixel is NaN. */
static int gather(beam_x2t_t *x, const void *frame, size_t slot) {
  const uint32_t *restrict idx = x->rois.idx;
  const uint64_t *off = x->rois.off;
  size_t R = x->R;
  void *row = (char *)x->buf + slot * x->P * beam_x2t_esize(x);
  double *sums = x->sum + slot * R;
  int nan = 0;
  switch (x->in.dtype) {
    BEAM__REAL_DTYPES(GATHER_CASE)
  default: BEAM_ASSERT(!"xpcs_twotime: dtype not accepted at start");
  }
  return nan;
}

int beam_x2t_push(beam_x2t_t *x, const void *frame, int bad, beam_diag_t *d) {
  size_t slot;
  x->nframes++;
  if (x->conf.mode == BEAM_X2T_WINDOW) {
    slot = x->head;
    x->head = (x->head + 1) % x->cap;
    if (x->rows < x->cap)
      x->rows++;
  } else {
    if (x->rows >= x->cap) {
      x->ndropped++;
      return BEAM_DIAG(d, BEAM_ELIMIT, WHO ": frame %llu is beyond the %zu frames this series keeps (max_frames "
                       "or the announced count); dropped",
                       (unsigned long long)(x->nframes - 1), x->cap);
    }
    slot = x->rows++;
  }
  if (!bad)
    bad = gather(x, frame, slot);
  if (bad) {
    /* a zero row keeps the products finite; its cells become NaN */
    memset((char *)x->buf + slot * x->P * beam_x2t_esize(x), 0, x->P * beam_x2t_esize(x));
    memset(x->sum + slot * x->R, 0, x->R * sizeof *x->sum);
  }
  x->bad[slot] = (uint8_t)(bad != 0);
  x->nbad += bad != 0;
  return 0;
}

/* ---- c2 and g2 ------------------------------------------------------------ */

static inline double rd(int f32, const void *p, size_t k) {
  return f32 ? (double)((const float *)p)[k] : ((const double *)p)[k];
}

static inline void wr(int f32, void *p, size_t k, double v) {
  if (f32)
    ((float *)p)[k] = (float)v;
  else
    ((double *)p)[k] = v;
}

/* C of buffer rows i, j in ROI r from the raw product. */
static inline double norm1(const beam_x2t_t *x, size_t r, double np, double raw, size_t i, size_t j) {
  if (x->bad[i] || x->bad[j])
    return NAN;
  double den = x->sum[i * x->R + r] * x->sum[j * x->R + r];
  return den == 0 ? NAN : raw * np / den;
}

void beam_x2t_c2_shape(const beam_x2t_t *x, uint32_t shape[3]) {
  shape[0] = (uint32_t)x->R;
  shape[1] = (uint32_t)x->rows;
  shape[2] = (uint32_t)(x->conf.mode == BEAM_X2T_BAND ? x->conf.width : x->rows);
}

size_t beam_x2t_nlags(const beam_x2t_t *x) {
  if (x->conf.nb)
    return mt_lags(&x->conf, x->rows);
  return x->conf.mode == BEAM_X2T_BAND && x->conf.width < x->rows ? x->conf.width : x->rows;
}

/* Band rows [ta, tb) of ROI r into o (row ta first, W columns), by GEMM
 * blocks of at most x->blk rows: rows t0..t0+m-1 against the frames
 * t0+1-W .. t0+m-1 they reach. */
static int band_rows(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, size_t r, size_t ta, size_t tb, void *o,
                     beam_diag_t *d) {
  size_t W = x->conf.width;
  int f32 = x->conf.f32, rc;
  double np = (double)(x->rois.off[r + 1] - x->rois.off[r]);
  for (size_t t0 = ta; t0 < tb; t0 += x->blk) {
    size_t m = tb - t0 < x->blk ? tb - t0 : x->blk, c0 = t0 + 1 >= W ? t0 + 1 - W : 0, k = t0 + m - c0;
    if ((rc = b->gemm(ctx, x, r, t0, m, c0, k, x->scratch, k, d)) < 0)
      return rc;
    for (size_t i = 0; i < m; i++) {
      size_t t = t0 + i;
      for (size_t l = 0; l < W; l++)
        wr(f32, o, (t - ta) * W + l,
           l > t ? NAN : norm1(x, r, np, rd(f32, x->scratch, i * k + (t - l - c0)), t, t - l));
    }
  }
  return 0;
}

/* ---- multi-tau levels (num_bufs) ------------------------------------------ */

/* Level-L frame k into ring slot k % nb: the sum of frames k 2^L ..
 * (k+1) 2^L - 1, in double (exact for integer counts below 2^53). */
static void level_frame(beam_x2t_t *x, unsigned L, size_t k) {
  size_t P = x->P, R = x->R, B = (size_t)1 << L, s = k % x->conf.nb, t0 = k * B;
  double *restrict o = x->lv + s * P, *os = x->lsum + s * R;
  int f32 = x->conf.f32;
  uint8_t bad = 0;
  memset(o, 0, P * sizeof *o);
  memset(os, 0, R * sizeof *os);
  for (size_t t = t0; t < t0 + B; t++) {
    bad |= x->bad[t];
    if (f32) {
      const float *restrict in = (const float *)x->buf + t * P;
      for (size_t p = 0; p < P; p++)
        o[p] += in[p];
    } else {
      const double *restrict in = (const double *)x->buf + t * P;
      for (size_t p = 0; p < P; p++)
        o[p] += in[p];
    }
    for (size_t r = 0; r < R; r++)
      os[r] += x->sum[t * R + r];
  }
  x->lbad[s] = bad;
}

/* The level >= 1 cells of c2 (full layout, n x n per ROI), as scikit-beam's
 * _two_time_process writes them: a level-L frame's mean time is a
 * half-integer, and the pair's value fills the 2^L cells around it on its
 * diagonal (then mirrored, as two_time_state_to_results does). Sums in
 * place of means: the ratio is the same, 2^-2L cancels. */
static void level_cells(beam_x2t_t *x, void *c2) {
  size_t n = x->rows, nb = x->conf.nb, P = x->P, R = x->R, es = beam_x2t_esize(x);
  int f32 = x->conf.f32;
  for (unsigned L = 1; L < x->conf.levels; L++) {
    size_t B = (size_t)1 << L, nL = n >> L;
    for (size_t k = 0; k < nL; k++) {
      level_frame(x, L, k);
      const double *restrict cur = x->lv + (k % nb) * P;
      for (size_t i = nb / 2; i < nb && i <= k; i++) {
        size_t ps = (k - i) % nb;
        const double *restrict past = x->lv + ps * P;
        int bad = x->lbad[k % nb] || x->lbad[ps];
        for (size_t r = 0; r < R; r++) {
          size_t a = x->rois.off[r], e = x->rois.off[r + 1];
          double num = 0, den = x->lsum[(k % nb) * R + r] * x->lsum[ps * R + r];
          for (size_t p = a; p < e; p++)
            num += cur[p] * past[p];
          /* scikit-beam's order, tmp / (pi fi) * Np: with integer counts the
           * sums are exact, so this is its value to the bit */
          double v = bad || den == 0 ? NAN : num / den * (double)(e - a);
          void *o = (char *)c2 + r * n * n * es;
          for (size_t m = 0; m < B; m++) {
            size_t t1 = k * B + m, t2 = (k - i) * B + m;
            wr(f32, o, t1 * n + t2, v);
            wr(f32, o, t2 * n + t1, v);
          }
        }
      }
    }
  }
}

/* Level 0 keeps |t1 - t2| < nb: the cells beyond are no pair's, 0. */
static void level0_band(const beam_x2t_t *x, void *c2) {
  size_t n = x->rows, nb = x->conf.nb, es = beam_x2t_esize(x);
  int f32 = x->conf.f32;
  for (size_t r = 0; r < x->R; r++) {
    void *o = (char *)c2 + r * n * n * es;
    for (size_t i = nb; i < n; i++)
      for (size_t j = 0; j + nb <= i; j++) {
        wr(f32, o, i * n + j, 0);
        wr(f32, o, j * n + i, 0);
      }
  }
}

int beam_x2t_compute(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, void *c2, beam_diag_t *d) {
  size_t n = x->rows, W = x->conf.width, es = beam_x2t_esize(x);
  int f32 = x->conf.f32, rc;
  if (n == 0)
    return 0;
  if ((rc = b->prepare(ctx, x, d)) < 0)
    return rc;
  /* window: time order starts at the oldest ring slot */
  size_t first = x->conf.mode == BEAM_X2T_WINDOW && n == x->cap ? x->head : 0;
  for (size_t r = 0; r < x->R; r++) {
    double np = (double)(x->rois.off[r + 1] - x->rois.off[r]);
    if (x->conf.mode == BEAM_X2T_FULL) {
      void *o = (char *)c2 + r * n * n * es;
      if ((rc = b->syrk(ctx, x, r, n, o, n, d)) < 0)
        return rc;
      /* lower triangle read before its mirror cell is written */
      for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j <= i; j++) {
          double v = norm1(x, r, np, rd(f32, o, i * n + j), i, j);
          wr(f32, o, i * n + j, v);
          wr(f32, o, j * n + i, v);
        }
    } else if (x->conf.mode == BEAM_X2T_WINDOW) {
      void *o = (char *)c2 + r * n * n * es;
      if ((rc = b->syrk(ctx, x, r, n, x->scratch, n, d)) < 0)
        return rc;
      for (size_t i = 0; i < n; i++) {
        size_t ri = (first + i) % n;
        for (size_t j = 0; j < n; j++) {
          size_t rj = (first + j) % n, hi = ri > rj ? ri : rj, lo = ri > rj ? rj : ri;
          wr(f32, o, i * n + j, norm1(x, r, np, rd(f32, x->scratch, hi * n + lo), ri, rj));
        }
      }
    } else if ((rc = band_rows(x, b, ctx, r, 0, n, (char *)c2 + r * n * W * es, d)) < 0) {
      return rc;
    }
  }
  if (x->conf.nb) {
    level0_band(x, c2);
    level_cells(x, c2);
  }
  return 0;
}

/* ---- row blocks (publish_rows) ---------------------------------------------- */

int beam_x2t_rows(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, size_t t0, size_t n, void *out, size_t *cols,
                  size_t *col0, beam_diag_t *d) {
  size_t W = x->conf.width, es = beam_x2t_esize(x), R = x->R, c0 = 0, nc;
  int f32 = x->conf.f32, rc;
  beam_x2t_mode_t mode = x->conf.mode;
  if (mode == BEAM_X2T_WINDOW) {
    /* frames c0 .. t0+n-1 are in the ring; the block's rows among them */
    c0 = t0 + n > W ? t0 + n - W : 0;
    BEAM_ASSERT(t0 >= c0 && t0 + n <= x->nframes);
  } else {
    BEAM_ASSERT(t0 + n <= x->rows);
  }
  nc = mode == BEAM_X2T_FULL ? t0 + n : mode == BEAM_X2T_BAND ? W : t0 + n - c0;
  *cols = nc, *col0 = c0;
  for (size_t r = 0; r < R; r++) {
    double np = (double)(x->rois.off[r + 1] - x->rois.off[r]);
    void *o = (char *)out + r * n * nc * es;
    if (mode == BEAM_X2T_BAND) {
      if ((rc = band_rows(x, b, ctx, r, t0, t0 + n, o, d)) < 0)
        return rc;
      continue;
    }
    if (mode == BEAM_X2T_FULL) {
      if ((rc = b->gemm(ctx, x, r, t0, n, 0, nc, o, nc, d)) < 0)
        return rc;
      for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < nc; j++)
          wr(f32, o, i * nc + j, norm1(x, r, np, rd(f32, o, i * nc + j), t0 + i, j));
      continue;
    }
    /* window: rows and columns are ring slots (frame % W), each range in
     * at most two contiguous pieces */
    size_t W0 = x->cap;
    for (size_t i = 0; i < n;) {
      size_t si = (t0 + i) % W0, mi = n - i < W0 - si ? n - i : W0 - si;
      for (size_t j = 0; j < nc;) {
        size_t sj = (c0 + j) % W0, mj = nc - j < W0 - sj ? nc - j : W0 - sj;
        if ((rc = b->gemm(ctx, x, r, si, mi, sj, mj, (char *)x->scratch + (i * nc + j) * es, nc, d)) < 0)
          return rc;
        j += mj;
      }
      i += mi;
    }
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < nc; j++)
        wr(f32, o, i * nc + j,
           norm1(x, r, np, rd(f32, x->scratch, i * nc + j), (t0 + i) % W0, (c0 + j) % W0));
  }
  return 0;
}

/* Rows [rows_done, rows_done + n) as one c2_rows block and its c2_rows_at. */
static int emit_block(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, beam_emit_t *emit, size_t n,
                      uint32_t flag, beam_diag_t *d) {
  size_t t0 = x->rows_done, cols, col0;
  beam_frame_t *f = beam_emit_get(emit, x->out_rows);
  if (!f)
    return 0; /* shutting down */
  int rc = b->prepare(ctx, x, d);
  if (rc == 0)
    rc = beam_x2t_rows(x, b, ctx, t0, n, f->data, &cols, &col0, d);
  if (rc < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  f->shape[0] = (uint32_t)x->R;
  f->shape[1] = (uint32_t)n;
  f->shape[2] = (uint32_t)cols;
  f->flags = flag;
  beam_emit_put(emit, f);
  x->rows_done = t0 + n;
  if (!(f = beam_emit_get(emit, x->out_rows + 1)))
    return 0;
  int64_t *at = f->data;
  at[BEAM_X2T_AT_ROW0] = (int64_t)t0;
  at[BEAM_X2T_AT_ROWS] = (int64_t)n;
  at[BEAM_X2T_AT_COL0] = (int64_t)col0;
  at[BEAM_X2T_AT_FRAMES] = (int64_t)x->nframes;
  f->flags = flag;
  beam_emit_put(emit, f);
  return 0;
}

/* Rows held and not yet sent in a block: full and band count buffer rows
 * (frames beyond the capacity never become rows), window counts frames. */
static size_t rows_pending(const beam_x2t_t *x) {
  size_t held = x->conf.mode == BEAM_X2T_WINDOW ? (size_t)x->nframes : x->rows;
  return held - x->rows_done;
}

int beam_x2t_publish_rows(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, beam_emit_t *emit, beam_diag_t *d) {
  size_t N = x->conf.publish_rows;
  int rc = 0;
  while (N && rc == 0 && rows_pending(x) >= N)
    rc = emit_block(x, b, ctx, emit, N, BEAM_FLAG_PARTIAL, d);
  return rc;
}

void beam_x2t_g2(const beam_x2t_t *x, const void *c2, double *g2, double *err) {
  size_t n = x->rows, R = x->R, K = beam_x2t_nlags(x), es = beam_x2t_esize(x);
  int band = x->conf.mode == BEAM_X2T_BAND, f32 = x->conf.f32;
  size_t cols = band ? x->conf.width : n;
  for (size_t r = 0; r < R; r++) {
    const void *o = (const char *)c2 + r * n * cols * es;
    for (size_t j = 0; j < K; j++) {
      /* diagonal k: C(t, t + k), t < end - k; band stores it at [t + k][k].
       * With nb, lag j is k = i 2^L and its cells end with the last
       * complete level-L frame. */
      unsigned L;
      size_t i;
      beam_x2t_lag(x, j, &L, &i);
      size_t k = i << L, end = (n >> L) << L, cnt = 0;
      double s = 0;
      for (size_t t = 0; t + k < end; t++) {
        double v = rd(f32, o, band ? (t + k) * cols + k : t * cols + t + k);
        if (!isnan(v))
          s += v, cnt++;
      }
      double mean = cnt ? s / (double)cnt : NAN;
      g2[j * R + r] = mean;
      if (!err)
        continue;
      double ss = 0;
      for (size_t t = 0; t + k < end; t++) {
        double v = rd(f32, o, band ? (t + k) * cols + k : t * cols + t + k);
        if (!isnan(v))
          ss += (v - mean) * (v - mean);
      }
      /* scikit-beam: nanstd / sqrt(len(diagonal)), NaN cells included in len */
      err[j * R + r] = cnt ? sqrt(ss / (double)cnt) / sqrt((double)(end - k)) : NAN;
    }
  }
}

static int64_t dark_count(const beam_x2t_t *x) {
  int64_t n = 0;
  for (size_t i = 0; i < x->rows; i++)
    for (size_t r = 0; r < x->R && !x->bad[i]; r++)
      n += x->sum[i * x->R + r] == 0;
  return n;
}

int beam_x2t_publish(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, beam_emit_t *emit, uint32_t flag,
                     beam_diag_t *d) {
  if ((flag & BEAM_FLAG_FINAL) && x->conf.publish_rows && rows_pending(x) > 0) {
    int rc = emit_block(x, b, ctx, emit, rows_pending(x), flag, d);
    if (rc < 0)
      return rc;
  }
  if (x->rows > 0) {
    size_t K = beam_x2t_nlags(x), R = x->R;
    beam_frame_t *c2 = beam_emit_get(emit, BEAM_X2T_OUT_C2);
    if (!c2)
      return 0;
    int rc = beam_x2t_compute(x, b, ctx, c2->data, d);
    if (rc < 0) {
      beam_emit_drop(emit, c2);
      return rc;
    }
    beam_frame_t *g2 = beam_emit_get(emit, BEAM_X2T_OUT_G2);
    beam_frame_t *err = x->conf.errors && g2 ? beam_emit_get(emit, BEAM_X2T_OUT_G2ERR) : NULL;
    if (!g2 || (x->conf.errors && !err)) {
      beam_emit_drop(emit, c2);
      if (g2)
        beam_emit_drop(emit, g2);
      return 0; /* shutting down */
    }
    beam_x2t_g2(x, c2->data, g2->data, err ? err->data : NULL);
    beam_x2t_c2_shape(x, c2->shape);
    c2->flags = flag;
    beam_emit_put(emit, c2);
    g2->shape[0] = (uint32_t)K;
    g2->shape[1] = (uint32_t)R;
    g2->flags = flag;
    beam_emit_put(emit, g2);
    if (err) {
      err->shape[0] = (uint32_t)K;
      err->shape[1] = (uint32_t)R;
      err->flags = flag;
      beam_emit_put(emit, err);
    }
    beam_frame_t *lg = beam_emit_get(emit, BEAM_X2T_OUT_LAGS);
    if (!lg)
      return 0;
    for (size_t k = 0; k < K; k++) {
      unsigned L;
      size_t i;
      beam_x2t_lag(x, k, &L, &i);
      ((double *)lg->data)[k] = (double)(i << L) * x->lag_scale;
    }
    lg->shape[0] = (uint32_t)K;
    lg->flags = flag;
    beam_emit_put(emit, lg);
  }
  /* info last: a consumer that sees it has the rest of this publish */
  beam_frame_t *f = beam_emit_get(emit, BEAM_X2T_OUT_INFO);
  if (!f)
    return 0;
  int64_t *info = f->data;
  info[BEAM_X2T_INFO_FRAMES] = (int64_t)x->nframes;
  info[BEAM_X2T_INFO_BAD] = (int64_t)x->nbad;
  info[BEAM_X2T_INFO_DROPPED] = (int64_t)x->ndropped;
  info[BEAM_X2T_INFO_ROWS] = (int64_t)x->rows;
  info[BEAM_X2T_INFO_DARK] = dark_count(x);
  info[BEAM_X2T_INFO_FIRST] = x->conf.mode == BEAM_X2T_WINDOW ? (int64_t)(x->nframes - x->rows) : 0;
  f->flags = flag;
  beam_emit_put(emit, f);
  return 0;
}
