/* Stage kind `xpcs_multitau`: streaming multi-tau g2 with scikit-beam's
 * semantics (skbeam.core.correlation.lazy_one_time; the normative note is
 * docs/xpcs.md). Shared by xpcs_multitau_cpu.c and gpu/xpcs_multitau_cuda.cu:
 * schema, per-series state, lag list, and turning the accumulators into
 * published results. The per-frame arithmetic lives in the backends.
 *
 * State, per series (sized at start, never on the per-frame path):
 *   level L (0..levels-1) keeps a ring of `buffers` frames over the ROI
 *   pixels only (compact, sorted by ROI); a level-L frame is the SUM of 2^L
 *   input frames (scikit-beam keeps the mean: the 2^L factors cancel in g2
 *   and are divided out of G, IP, IF when published). Integer input (8 to
 *   32 bits) is kept as int64 sums and accumulated in 128-bit integers, so
 *   everything is exact until the final division; other input (floats,
 *   64-bit integers) in double.
 *   Per lag row t and ROI r: Gs = sum over pairs of sum_p x_k[p] x_{k+i}[p],
 *   IPs = sum of sum_p x_k[p], IFs = sum of sum_p x_{k+i}[p], and the pair
 *   count n[t] (shared by all ROIs; pairs touching a bad frame are skipped).
 *   Then, with Np pixels in r and level L:
 *     G = Gs / (n Np 4^L), IP = IPs / (n Np 2^L), IF = IFs / (n Np 2^L),
 *     g2 = G / (IP IF) = Gs n Np / (IPs IFs).
 * Output rows stop before the first row where any ROI has IPs == 0
 * (scikit-beam's g_max).
 *
 * normalization: per_pixel (per-pixel g2, the statistic of APS codes'
 * errors; docs/xpcs.md compares conventions) keeps
 * the same level rings but accumulates per PIXEL instead of per ROI:
 * pG[t][p] = sum over pairs of x_k[p] x_{k+i}[p], pIP, pIF likewise (int64
 * for integer input, double otherwise). Publishing folds them into the
 * per-ROI G/IP/IF above (same truncation and intensities as roi mode) and
 * computes per pixel g2_p = pG n / (pIP pIF), then per ROI the mean over
 * the pixels with pIP, pIF != 0 and its standard error (population std /
 * sqrt(count)). The int64 sums stay exact while the running bound
 * sum over pairs of max|x_k| max|x_{k+i}| (and of max|x|) fits in int64;
 * both backends track it per row from the per-slot maxima and fail the
 * series with BEAM_ELIMIT (never a silent wrap) when it would not. */
#ifndef BEAM_KERN_XPCS_MULTITAU_H
#define BEAM_KERN_XPCS_MULTITAU_H

#include "pipeline/kern/xpcs_rois.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

__extension__ typedef __int128 beam_i128;

#define BEAM_XMT_MAX_LEVELS 31 /* 2^30 x 32-bit counts still fit int64 */

/* Outputs, in declaration order (output 0 feeds downstream stages). */
enum { BEAM_XMT_OUT_G2 = 0, BEAM_XMT_OUT_LAGS, BEAM_XMT_OUT_INFO, BEAM_XMT_OUT_G,
       BEAM_XMT_OUT_IP, BEAM_XMT_OUT_IF };
/* per_pixel mode adds "g2_err" after the others: output 3 without
 * intensities, 6 with them (beam_xmt_t.out_err). */
/* The "info" output, int64 [BEAM_XMT_INFO_N]. */
enum { BEAM_XMT_INFO_FRAMES = 0, BEAM_XMT_INFO_BAD, BEAM_XMT_INFO_ROWS, BEAM_XMT_INFO_NLAGS,
       BEAM_XMT_INFO_DARK_LABEL, BEAM_XMT_INFO_DARK_ROW, BEAM_XMT_INFO_N };

typedef struct beam_xmt_conf_s {
  unsigned levels, nb;
  uint64_t publish_every; /* 0 = at series end only */
  int with_sums;          /* also publish G, IP, IF */
  int sum_rows_pairs;     /* intensity_rows: pairs (their rows past g2's cut) */
  int per_pixel;          /* normalization: per_pixel (APS) instead of roi */
  unsigned threads;       /* CPU: threads over pixel tiles (0 = online cores,
                           * at most BEAM_XMT_AUTO_THREADS); CUDA ignores it */
} beam_xmt_conf_t;

#define BEAM_XMT_MAX_THREADS 64  /* the schema's bound (BEAM_FJPOOL_MAX) */
#define BEAM_XMT_AUTO_THREADS 16 /* threads: 0 takes at most this many cores */

typedef struct beam_xmt_s {
  beam_xmt_conf_t conf;
  beam_xpcs_rois_t rois;
  /* Per series. */
  beam_indesc_t in;
  int exact;            /* integer input: int64 level sums, i128 accumulators */
  size_t P, R, nlags;
  int64_t *lag_steps;   /* [nlags] scikit-beam's lag_steps */
  double lag_scale;     /* seconds per frame, or 1 (lags in frames) */
  void *lvl;            /* [levels][nb][P] int64_t or double */
  void *lsum;           /* [levels][nb][R] per-slot ROI sums: beam_i128 or double */
  uint8_t *bad;         /* [levels][nb] slot holds a bad frame */
  uint64_t *nlev;       /* [levels] frames received per level */
  size_t *chunk;        /* [levels] exact dot: int64 partial sums of this many
                         * products cannot overflow; 0 = 128-bit per product */
  void *G, *IP, *IF;    /* [nlags][R] beam_i128 or double */
  uint64_t *npairs;     /* [nlags] */
  uint64_t nframes, nbad;
  /* per_pixel mode only (NULL otherwise). */
  void *pG, *pIP, *pIF; /* [nlags][P] int64_t (exact) or double */
  uint64_t *lmax;       /* [levels][nb] max |pixel| of each slot (exact,
                         * per_pixel) */
  beam_i128 *bnd;       /* [nlags][2] overflow bounds: products, values */
  int64_t ovf_row;      /* first row whose bound passed INT64_MAX, or -1 */
  unsigned out_err;     /* index of the g2_err output */
} beam_xmt_t;

/* The schema, beam_xpcs_multitau_params, is declared in kinds.h. */

/* init: parameters and ROI files. On failure nothing stays allocated. */
int beam_xmt_init(beam_xmt_t *x, const beam_cnode_t *cfg, beam_diag_t *d);
/* start: 2-D real frames; builds the ROI lists, sizes and zeroes the state,
 * declares the outputs. */
int beam_xmt_start(beam_stage_t *self, beam_xmt_t *x, const beam_series_t *s,
                   const beam_indesc_t *in, beam_diag_t *d);
void beam_xmt_free(beam_xmt_t *x);

/* Row of (level L, channel i); level of row t. */
static inline size_t beam_xmt_row(const beam_xmt_t *x, unsigned L, unsigned i) {
  return (size_t)L * (x->conf.nb / 2) + i;
}
static inline unsigned beam_xmt_level_of(const beam_xmt_t *x, size_t t) {
  return t < x->conf.nb ? 0u : (unsigned)(t / (x->conf.nb / 2) - 1);
}

/* Element sizes of the level sums and accumulators for this series. */
static inline size_t beam_xmt_lvl_size(const beam_xmt_t *x) { return x->exact ? sizeof(int64_t) : sizeof(double); }
static inline size_t beam_xmt_acc_size(const beam_xmt_t *x) { return x->exact ? sizeof(beam_i128) : sizeof(double); }

/* Is the ROI-gathered frame bad? (flags BAD/CORRUPT; NaN handled by the
 * backends through the ROI sums). */
static inline int beam_xmt_flag_bad(uint32_t flags) {
  return (flags & (BEAM_FLAG_BAD | BEAM_FLAG_CORRUPT)) != 0;
}

/* Truncation: the number of rows to publish (scikit-beam's g_max), and
 * where it stopped: *dark_label = label of the first ROI with IPs == 0 on
 * row g_max when that row has pairs (a dark ROI), else -1. */
size_t beam_xmt_rows(const beam_xmt_t *x, int64_t *dark_label);

/* Emits g2, lags, info (and G, IP, IF) from the host accumulators
 * x->G/IP/IF/npairs; flags BEAM_FLAG_FINAL or BEAM_FLAG_PARTIAL. The CUDA
 * backend copies its device accumulators into them first. */
int beam_xmt_publish(beam_xmt_t *x, beam_emit_t *emit, uint32_t flag);

/* CPU backend, one input frame (frame NULL when bad): gather, levels,
 * pairs, over the stage's pixel tiles and threads. x must be the state of
 * a stage made with beam_xpcs_multitau_cpu_ops (self->priv). Returns 0, or
 * BEAM_ELIMIT once a per_pixel int64 bound was passed (x->ovf_row). */
int beam_xmt_push_cpu(beam_xmt_t *x, const void *frame, int bad);
/* How the CPU backend (self made with beam_xpcs_multitau_cpu_ops, after
 * start) gathers ROI pixels: the number of raster runs it copies, or 0
 * when it reads one index per pixel. For tests. */
size_t beam_xmt_cpu_gather_runs(const beam_stage_t *self);

/* per_pixel: adds (max_o, max_s) of one pair to row t's bound; returns 0,
 * or -1 (and sets ovf_row) when an int64 sum could overflow. */
static inline int beam_xmt_bound(beam_xmt_t *x, size_t t, uint64_t mo, uint64_t ms) {
  beam_i128 *b = x->bnd + 2 * t;
  b[0] += (beam_i128)mo * ms;
  b[1] += mo > ms ? mo : ms;
  if (b[0] > INT64_MAX || b[1] > INT64_MAX) {
    if (x->ovf_row < 0)
      x->ovf_row = (int64_t)t;
    return -1;
  }
  return 0;
}

/* 0, or BEAM_ELIMIT with the message when a per_pixel bound was passed. */
int beam_xmt_check(const beam_xmt_t *x, beam_diag_t *d);

/* Resets the per-series counters and accumulators (start). */
void beam_xmt_reset(beam_xmt_t *x);

#ifdef __cplusplus
}
#endif
#endif
