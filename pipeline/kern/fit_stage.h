/* Stage kind `fit`: batched Levenberg–Marquardt (pipeline/fit.h) inside the
 * graph. Shared by the CPU backend (fit_stage_cpu.c) and a future CUDA one:
 * schema, configuration, per-series buffers, and result emission.
 *
 * Two sources:
 *   result  each published frame of an upstream result is a batch of curves
 *           (points along `axis`, one fit per position of the other axis):
 *           the g2 [lag][roi] of xpcs_multitau, say. x and weights may come
 *           from sibling outputs of the same upstream stage, subscribed with
 *           `input: g2.g2+g2_err+lags` (graph.c: one consumer, several
 *           outputs of one producer, in the order that producer emits them).
 *   pixels  every pixel's trace over the frames of a series is kept in a
 *           frame-major buffer [frame][pixel], with one x per frame; the
 *           pixels are fitted at SERIES_END (and every `every` frames for a
 *           preview). Frame-major is the layout frames arrive in and the
 *           fastest one for the engine too: its SIMD gather reads the 16
 *           lanes of a block as 16 contiguous floats per point, where a
 *           pixel-major buffer would cost a strided read per lane and a
 *           transpose per frame. The engine takes the strides, so nothing
 *           is transposed.
 * Docs: docs/fit.md "The fit stage". */
#ifndef BEAM_KERN_FIT_STAGE_H
#define BEAM_KERN_FIT_STAGE_H

#include "pipeline/fit.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_FITS_MAX_THREADS 64
#define BEAM_FITS_MAX_IN 4 /* outputs one `input:` may list with '+' */

typedef enum { BEAM_FITS_RESULT = 0, BEAM_FITS_PIXELS } beam_fits_source_t;

/* Where the x of a point comes from. */
typedef enum {
  BEAM_FITS_X_INDEX = 0, /* pixels: the frame id; result: the point index */
  BEAM_FITS_X_TIME,      /* pixels: frame_index x the series frame_time */
  BEAM_FITS_X_POS,       /* pixels: the frame's pos[x_pos_axis] (flag POS) */
  BEAM_FITS_X_META,      /* pixels: series metadata list x_key[frame_id] */
  BEAM_FITS_X_OUTPUT     /* result: a sibling output of the upstream stage */
} beam_fits_x_t;

enum { BEAM_FITS_OUT_PARAMS = 0, BEAM_FITS_OUT_ERRORS, BEAM_FITS_OUT_CHI2, BEAM_FITS_OUT_STATUS,
       BEAM_FITS_OUT_CURVES, BEAM_FITS_NOUTS };

typedef struct beam_fits_conf_s {
  beam_fits_source_t source;
  beam_fit_model_t model;
  int P, degree;
  beam_fit_opts_t opts;
  double lo[BEAM_FIT_MAX_PARAMS], hi[BEAM_FIT_MAX_PARAMS];
  double p0[BEAM_FIT_MAX_PARAMS];
  int have_p0;              /* `initial` given: every fit starts there */
  beam_fits_x_t x;
  char x_key[BEAM_NAME_MAX]; /* META: metadata key; OUTPUT: output name */
  int x_pos_axis;
  double x_scale, x_offset;
  double range_lo, range_hi; /* x window of the points used */
  /* result only */
  unsigned axis;
  char in_names[BEAM_FITS_MAX_IN][BEAM_NAME_MAX]; /* outputs after the dot; [0] = y */
  unsigned n_in;
  char w_name[BEAM_NAME_MAX]; /* weights output, "" = none */
  int w_sigma;                /* the weights output holds sigma: w = 1/sigma^2 */
  int curves;
  /* pixels only */
  uint64_t every, max_frames, memory;
  unsigned threads;
  char labels[512];           /* JSON list of the parameter names */
} beam_fits_conf_t;

/* The model-dependent checks (parameter names in bounds/initial, ...),
 * for the config loader: errors go to errs at file:line:col. */
int beam_fit_stage_check(const beam_cnode_t *cfg, beam_cfg_errs_t *errs);
/* Reads and checks the validated config; messages about a key name the
 * place it was written (file:line:col). */
int beam_fits_conf_load(beam_fits_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);

/* Per-series state of one stage. */
typedef struct beam_fits_s {
  beam_fits_conf_t conf;
  size_t n_fits, T;          /* fits, point capacity */
  /* pixels: y[frame][pixel] (T = max_frames rows), x[frame];
   * result: y, w as the input frame, x[T] */
  float *y, *x, *w;
  size_t n;                  /* pixels: frames kept; result: points of the batch */
  uint64_t nbad, nseen;      /* pixels: frames skipped (bad / no x), frames seen */
  uint64_t nover;            /* pixels: frames beyond max_frames */
  double frame_time;         /* pixels, x frame_time: the series' */
  double *p0;                /* initial given: n_fits x P */
  const double *meta_x;      /* META: parsed list (owned), meta_nx long */
  size_t meta_nx;
  /* result: which parts of the current group arrived (frame_id) */
  uint64_t got_fid[BEAM_FITS_MAX_IN];
  int got[BEAM_FITS_MAX_IN];
  uint32_t in_rows, x_rows, w_rows; /* points of the last curves, x, weights */
  beam_frame_t ident;        /* identity of the y frame, for the results */
  /* results */
  double *params, *errors, *chi2_red;
  uint8_t *status;
  int32_t *iters;
  uint32_t oshape[BEAM_MAX_NDIM]; /* pixels: image shape; result: [n_fits] */
  uint32_t ondim;
  double seconds_last;       /* wall time of the last batch */
} beam_fits_t;

void beam_fits_free(beam_fits_t *s);
/* Validates the input and sizes every buffer (pixels: checks max_frames x
 * pixels x 4 bytes against `memory`), declares the outputs. */
int beam_fits_start(beam_stage_t *self, beam_fits_t *s, const beam_series_t *series,
                    const beam_indesc_t *in, beam_diag_t *d);
/* Accumulates one input frame. Returns 1 when a batch is ready to fit
 * (result: the group is complete; pixels: an `every` preview is due), 0
 * when not, < 0 for a frame refused (self->diag says why). */
int beam_fits_take(beam_stage_t *self, beam_fits_t *s, const beam_frame_t *in);
/* The batch over what is held now (n points). */
void beam_fits_batch(const beam_fits_t *s, beam_fit_batch_t *b);
/* Emits params, errors, chi2, status (and curves) with flags. */
void beam_fits_emit(beam_fits_t *s, beam_emit_t *emit, uint32_t flags);
/* A backend's fit of the batch the stage holds (CPU threads, or the CUDA
 * engine); backend is its own state. */
typedef int (*beam_fits_fit_fn)(beam_stage_t *self, void *backend);
/* process and end of every backend: take the frame, fit when a batch is
 * complete (a result frame, a pixels preview, the series end) and publish
 * with the same flags: a result source keeps the input's
 * PARTIAL/FINAL/ABORTED, a pixels preview is PARTIAL, the end FINAL with
 * INCOMPLETE when frames were lost (end_missing) or refused here (bad, no
 * x, beyond max_frames) and ABORTED for a cut series. */
int beam_fits_process(beam_stage_t *self, beam_fits_t *s, const beam_frame_t *in,
                      beam_emit_t *emit, beam_fits_fit_fn fit, void *backend);
int beam_fits_end(beam_stage_t *self, beam_fits_t *s, beam_emit_t *emit, beam_fits_fit_fn fit,
                  void *backend);

#ifdef __cplusplus
}
#endif
#endif
