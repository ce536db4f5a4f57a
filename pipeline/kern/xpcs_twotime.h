/* Stage kind `xpcs_twotime`: the two-time correlation C(q, t1, t2) per ROI
 * with scikit-beam's definition (two_time_corr, one level or, with
 * num_bufs, its multi-tau levels below; docs/xpcs.md has the normative text) and the one-time g2 taken from its
 * diagonals (one_time_from_two_time). Shared by xpcs_twotime_cpu.c and
 * gpu/xpcs_twotime_cuda.cu: schema, per-series state, the per-frame
 * gather into the frame buffer, the memory budget, normalisation, band
 * and window layouts, g2 and publishing. The numerator products (the
 * O(T^2 P) part) are the backends' job, through beam_x2t_blas_t.
 *
 * Per ROI r with Np pixels and ROI sums s_t = sum_p I_t[p]:
 *   C(t1, t2) = (sum_p I_t1[p] I_t2[p]) Np / (s_t1 s_t2)
 *             = <I_t1 I_t2>_p / (<I_t1>_p <I_t2>_p).
 * Frames are buffered, ROI pixels only, as one [rows, P] matrix (columns
 * sorted by ROI, so ROI r is the column block off[r]..off[r+1] with
 * leading dimension P) in float64 or float32 (`precision`). The numerator
 * of ROI r is X_r X_r^T: SYRK for a square block, GEMM for band blocks.
 *
 * Cells that cannot be computed are NaN, and only those cells: a bad frame
 * (flag BAD or CORRUPT, or a NaN pixel in an ROI: the whole frame, as
 * scikit-beam does) gives NaN rows and columns in every ROI; a frame with
 * zero photons in ROI r (s_t == 0, so C would be 0/0) gives a NaN row and
 * column in that ROI only, counted in info. g2 is the nanmean of each
 * diagonal, so neither reaches it.
 *
 * Modes (memory is bounded by configuration and checked at start):
 *   full    c2 [R, T, T], every frame of the series (T <= max_frames).
 *   band    c2 [R, T, W], c2[r, t, k] = C(t - k, t) for k < W (NaN where
 *           t - k < 0): the |t1 - t2| < W band, as scikit-beam's
 *           num_bufs = W fills it, stored without the zeros.
 *   window  c2 [R, n, n] over the last n = min(frames, W) frames (a ring
 *           of W frames), in time order; info says which frame is first.
 * Everything is computed when it is published: at series end (FINAL) and,
 * with publish_every, every N frames over the frames so far (PARTIAL).
 *
 * Row blocks (publish_rows N): cell C(t1, t2) depends on frames t1 and t2
 * only, so it is final once the later of them has arrived. Rows t1 in
 * [r0, r0 + N) are published, as output c2_rows, as soon as frame
 * r0 + N - 1 (counted from 0 in the series) is held, with every column
 * that is final then:
 *   full    [R, n, r0 + n]: columns t2 = 0 .. r0 + n - 1 (the other cells
 *           of those rows are C(t2, t1) of later blocks, by symmetry);
 *   band    [R, n, W]: the same rows of c2 (lag k = t1 - t2);
 *   window  [R, n, m]: columns t2 = c0 .. r0 + n - 1, c0 = max(0,
 *           r0 + n - W), the frames in the ring then; so N <= W.
 * The rows left at series end (fewer than N) go out as a last block with
 * the FINAL results; blocks sent while the series runs carry PARTIAL. Each
 * block is followed by c2_rows_at, int64 [row0, rows, col0, frames]: its
 * first row and column (frame indices; col0 = 0, lag 0, in band mode) and
 * the frames received when it was sent. The FINAL c2 is unchanged.
 *
 * Multi-tau (num_bufs nb > 0, num_levels NL; mode full only): the cells
 * scikit-beam's two_time_corr(labels, images, T, nb, NL) writes, all
 * others 0 as its np.zeros result. Level 0: |t1 - t2| < nb. Level L >= 1
 * pairs block means of 2^L frames (frame k = frames k 2^L .. (k+1) 2^L - 1,
 * complete blocks only) at lags i = nb/2 .. nb-1 (in level-L frames, i <= k):
 * C of the pair (k - i, k) goes to the 2^L cells (k 2^L + m, (k-i) 2^L + m),
 * m < 2^L, and their mirrors. A level-L frame is bad if one of its frames
 * is; its ROI sums are the sums of its frames' (so integer counts stay
 * exact). Level 0 is the backend's product; levels >= 1 are host loops here
 * (their pairs cost nb/2 P per level-L frame, against T P per frame for
 * level 0). g2 has one lag per multi-tau lag i 2^L with a pair so far, the
 * mean over the cells written on that diagonal. */
#ifndef BEAM_KERN_XPCS_TWOTIME_H
#define BEAM_KERN_XPCS_TWOTIME_H

#include "pipeline/kern/xpcs_rois.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_X2T_MAX_FRAMES 65536u /* the wire's largest axis */

typedef enum { BEAM_X2T_FULL = 0, BEAM_X2T_BAND, BEAM_X2T_WINDOW } beam_x2t_mode_t;

/* Outputs, in declaration order (output 0 feeds downstream stages). */
enum { BEAM_X2T_OUT_C2 = 0, BEAM_X2T_OUT_G2, BEAM_X2T_OUT_LAGS, BEAM_X2T_OUT_INFO, BEAM_X2T_OUT_G2ERR };
/* The "info" output, int64 [BEAM_X2T_INFO_N]. */
enum { BEAM_X2T_INFO_FRAMES = 0, BEAM_X2T_INFO_BAD, BEAM_X2T_INFO_DROPPED, BEAM_X2T_INFO_ROWS,
       BEAM_X2T_INFO_DARK, BEAM_X2T_INFO_FIRST, BEAM_X2T_INFO_N };

typedef struct beam_x2t_conf_s {
  beam_x2t_mode_t mode;
  size_t width;          /* band width / window length W */
  size_t max_frames;     /* full, band: frames kept per series */
  uint64_t memory_limit; /* bytes: frame buffer + c2 result + scratch */
  int f32;               /* precision float32 (else float64) */
  int errors;            /* also publish g2_err */
  uint64_t publish_every;
  size_t publish_rows;   /* rows per c2_rows block, 0 = off */
  size_t nb;             /* scikit-beam's num_bufs; 0 = every pair (one level) */
  unsigned levels;       /* scikit-beam's num_levels */
} beam_x2t_conf_t;

#define BEAM_X2T_MAX_LEVELS 16u /* a level-16 frame is 2^16 frames, the longest series */

/* The "c2_rows_at" output, int64 [BEAM_X2T_AT_N]. */
enum { BEAM_X2T_AT_ROW0 = 0, BEAM_X2T_AT_ROWS, BEAM_X2T_AT_COL0, BEAM_X2T_AT_FRAMES, BEAM_X2T_AT_N };

typedef struct beam_x2t_s {
  beam_x2t_conf_t conf;
  beam_xpcs_rois_t rois;
  /* Per series, sized at start. */
  beam_indesc_t in;
  size_t P, R;
  size_t cap;        /* buffer rows: T capacity (full, band) or W (window) */
  size_t tdecl;      /* full, band: the T the c2 output is declared for */
  void *buf;         /* [cap][P] float or double */
  double *sum;       /* [cap][R] ROI sums of each buffered row */
  uint8_t *bad;      /* [cap] */
  size_t rows;       /* rows held (window: min(frames, W)) */
  size_t head;       /* window: ring slot of the next frame */
  size_t blk;        /* band: rows per GEMM block */
  void *scratch;     /* band: [blk][blk + W - 1]; window: [W][W] */
  double lag_scale;  /* seconds per frame, or 1 */
  uint64_t nframes, nbad, ndropped;
  size_t rows_done;  /* publish_rows: rows published in c2_rows blocks */
  unsigned out_rows; /* index of the c2_rows output (c2_rows_at follows) */
  /* levels > 1: ring of the last nb level-L frames (sums of 2^L frames) */
  double *lv;        /* [nb][P] */
  double *lsum;      /* [nb][R] */
  uint8_t *lbad;     /* [nb] */
} beam_x2t_t;

/* The numerator products of one publish, done by a backend. Row indices
 * are buffer rows; r selects ROI r's columns. prepare runs once per
 * publish before any product (the CUDA backend uploads the buffer). */
typedef struct beam_x2t_blas_s {
  int (*prepare)(void *ctx, const beam_x2t_t *x, beam_diag_t *d);
  /* out[i * ldo + j], j <= i < n: X_r[i] . X_r[j] (lower triangle). */
  int (*syrk)(void *ctx, const beam_x2t_t *x, size_t r, size_t n, void *out, size_t ldo, beam_diag_t *d);
  /* out[i * ldo + j], i < m, j < k: X_r[a + i] . X_r[b + j]. */
  int (*gemm)(void *ctx, const beam_x2t_t *x, size_t r, size_t a, size_t m, size_t b, size_t k, void *out,
              size_t ldo, beam_diag_t *d);
} beam_x2t_blas_t;

/* init: parameters, ROI files, and the memory checks that need no frame
 * (one ROI's c2 alone over memory_limit is a config error). On failure
 * nothing stays allocated. */
int beam_x2t_init(beam_x2t_t *x, const beam_cnode_t *cfg, beam_diag_t *d);
/* start: 2-D real frames; builds the ROI lists, checks the memory budget
 * (BEAM_ELIMIT with the figures when over), sizes and zeroes the state,
 * declares the outputs. */
int beam_x2t_start(beam_stage_t *self, beam_x2t_t *x, const beam_series_t *s, const beam_indesc_t *in,
                   beam_diag_t *d);
void beam_x2t_free(beam_x2t_t *x);
/* Host bytes a series needs (what start compares with memory_limit). */
double beam_x2t_bytes(const beam_x2t_t *x, size_t P, size_t R, size_t tdecl);

static inline size_t beam_x2t_esize(const beam_x2t_t *x) { return x->conf.f32 ? sizeof(float) : sizeof(double); }

/* One input frame: gathers the ROI pixels into the next buffer row with
 * their ROI sums (frame NULL or bad: a zero row marked bad). Returns
 * BEAM_ELIMIT, with a message, for a frame beyond max_frames (counted as
 * dropped). Never allocates. */
int beam_x2t_push(beam_x2t_t *x, const void *frame, int bad, beam_diag_t *d);

/* c2 of the rows held so far into c2 (the output layout of the mode, rows
 * and columns as beam_x2t_c2_shape says), computing products through b. */
int beam_x2t_compute(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, void *c2, beam_diag_t *d);
/* Shape of c2 for the rows held: [R, rows, rows] or [R, rows, W]. */
void beam_x2t_c2_shape(const beam_x2t_t *x, uint32_t shape[3]);
/* Number of g2 lags for the rows held. */
size_t beam_x2t_nlags(const beam_x2t_t *x);
/* g2 lag k as (level, channel): lag i 2^level frames (nb = 0: level 0, i = k). */
void beam_x2t_lag(const beam_x2t_t *x, size_t k, unsigned *level, size_t *i);
/* g2[k * R + r] (and err, may be NULL) from c2: nanmean of diagonal k,
 * err = nanstd / sqrt(cells on the diagonal) (scikit-beam); with nb, of
 * the cells written on the diagonal of lag k. */
void beam_x2t_g2(const beam_x2t_t *x, const void *c2, double *g2, double *err);

/* Computes and emits c2, g2, lags, info (g2_err) with flag FINAL or
 * PARTIAL. With no frame held only info goes out (no zero-length arrays).
 * FINAL with publish_rows first sends the rows no block has sent yet. */
int beam_x2t_publish(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, beam_emit_t *emit, uint32_t flag,
                     beam_diag_t *d);

/* publish_rows: after each frame, emits the c2_rows blocks (and their
 * c2_rows_at) that this frame completed, flag PARTIAL. 0 or < 0. */
int beam_x2t_publish_rows(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, beam_emit_t *emit, beam_diag_t *d);
/* Rows [t0, t0 + n) of c2 in the c2_rows layout into out (R x n x cols,
 * cols and the first column's frame index in *cols, *col0): the block of
 * frames that are held now (window: t0 >= frames - W). For the bench and
 * the tests; beam_x2t_publish_rows calls it. */
int beam_x2t_rows(beam_x2t_t *x, const beam_x2t_blas_t *b, void *ctx, size_t t0, size_t n, void *out,
                  size_t *cols, size_t *col0, beam_diag_t *d);

static inline int beam_x2t_flag_bad(uint32_t flags) { return (flags & (BEAM_FLAG_BAD | BEAM_FLAG_CORRUPT)) != 0; }

/* The CPU products (OpenBLAS); exposed for the bench and the GPU check. */
extern const beam_x2t_blas_t beam_x2t_blas_cpu;

#ifdef __cplusplus
}
#endif
#endif
