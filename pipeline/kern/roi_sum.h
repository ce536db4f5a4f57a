/* Stage kind `roi_sum`: per frame, the weighted sum of the pixels inside
 * each of N regions (virtual detectors: bright-field disk, annular dark
 * field, label images, weight masks), and optionally the virtual images of
 * a raster scan. Shared by roi_sum_cpu.c and gpu/roi_sum_cuda.cu.
 *
 * Membership (beam_roi_weight is the definition): pixel (x, y), centre
 * (cx, cy) defaulting to ((w-1)/2, (h-1)/2), d2 = (x-cx)^2 + (y-cy)^2 in
 * double: disk d2 < r^2; annulus r_in^2 <= d2 < r_out^2; rect x0 <= x < x1,
 * y0 <= y < y1; label image: pixel label == the ROI's label; weight stack:
 * the ROI's plane value (0 = outside). A pixel the bad-pixel mask marks
 * (nonzero; a file, or "series": the series' pixel_mask) is in no ROI.
 * A centre may be "series": the series metadata's beam_center [y, x]
 * (from_series.h). A series lacking either is refused at its start.
 *
 * At start the ROIs become what the backend sums fastest: for the CPU,
 * unit-weight ROIs (geometry, label images) become runs of contiguous
 * pixels, all ROIs merged in raster order so one pass streams the frame;
 * weight stacks (and ROIs too fragmented for runs to pay) become per-ROI
 * sorted index lists, with weights for a stack. The CUDA backend always takes
 * the index lists. */
#ifndef BEAM_KERN_ROI_SUM_H
#define BEAM_KERN_ROI_SUM_H

#include "pipeline/array.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_ROI_MAX 65535u /* also the CUDA grid.y limit the kernel uses */

typedef enum beam_roi_shape_e {
  BEAM_ROI_DISK = 1,
  BEAM_ROI_ANNULUS,
  BEAM_ROI_RECT,
} beam_roi_shape_t;

typedef struct beam_roi_geom_s {
  char name[BEAM_NAME_MAX];
  beam_roi_shape_t shape;
  int has_center;
  int center_series;    /* `center: series`: cx, cy set at each start */
  double cx, cy;        /* when has_center */
  double r_in, r_out;   /* disk: r_out only */
  int64_t x0, y0, x1, y1;
} beam_roi_geom_t;

typedef struct beam_roi_sum_conf_s {
  size_t nroi;
  beam_roi_geom_t *geom; /* `rois`: nroi entries; NULL with `masks` */
  beam_array_t masks;    /* `masks`: the file (2-D labels or 3-D weights) */
  int64_t *labels;       /* 2-D label image: the nroi labels, increasing */
  char *labels_json;     /* ["name", ...] for the output descriptor */
  beam_array_t mask;     /* `mask` file; data NULL when none */
  int mask_series;       /* `mask: series`: the series' pixel_mask */
  uint8_t *bad;          /* from start: [h * w] 1 = bad pixel, in no ROI; NULL = no mask */
  int scan;              /* scan_shape given */
  uint32_t scan_ny, scan_nx;
  uint64_t image_every;
} beam_roi_sum_conf_t;

/* ROI r's pixels are idx[off[r] .. off[r+1]), increasing; w is NULL when
 * every weight is 1, else parallel to idx. */
typedef struct beam_roi_lists_s {
  size_t nroi, total;
  uint64_t *off;
  uint32_t *idx;
  double *w;
} beam_roi_lists_t;

/* `len` consecutive flat pixels from `start` (a run may continue onto the
 * next row), all inside ROI `roi`, weight 1. */
typedef struct beam_roi_run_s {
  uint32_t start, len, roi;
} beam_roi_run_t;

/* Runs of every ROI sorted by (start, roi), so summing them in order reads
 * the frame front to back; where ROIs overlap, their runs re-read pixels
 * that are still in cache. acc is per-frame scratch: nroi 8-byte
 * accumulators (uint64, int64 or double, by dtype). */
typedef struct beam_roi_runs_s {
  size_t nroi, n;
  beam_roi_run_t *run;
  void *acc;
} beam_roi_runs_t;

/* ROIs whose runs average fewer pixels than this (fragmented label
 * images, rings one pixel wide) are summed through index lists instead:
 * around this length the two cost the same (measured: roi_sum_cpu.c). */
#define BEAM_ROI_RUN_MIN_MEAN 6

/* Host-side state common to both backends. After start exactly one of
 * lists (lists.off != NULL) and runs (runs.run != NULL) is built. */
typedef struct beam_roi_host_s {
  beam_roi_sum_conf_t conf;
  beam_roi_lists_t lists;
  beam_roi_runs_t runs;
  beam_indesc_t in;
  int scan;         /* this series builds the scan image: scan_shape of the
                     * config, else of the series metadata */
  uint32_t scan_ny, scan_nx;
  float *img;       /* scan image [nroi, ny, nx], NaN where not yet scanned */
  size_t img_cap;   /* floats */
  uint64_t nframes; /* frames seen this series */
} beam_roi_host_t;

/* init: parses rois/masks (exactly one), loads the masks file and the
 * bad-pixel mask file (not for `mask: series`), scan_shape.
 * On failure nothing stays allocated. */
int beam_roi_host_init(beam_roi_host_t *h, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_roi_host_free(beam_roi_host_t *h);

/* start: takes the mask and centres the config asks the series for
 * (series may be NULL: then none can be), 2-D real frames, masks and
 * mask shape = frame shape, every ROI non-empty (after the mask);
 * builds runs (use_runs != 0, unit weights, and runs that average at
 * least BEAM_ROI_RUN_MIN_MEAN pixels) or else index lists, resets the
 * scan image, declares "sums" (float64 [N]) and, with scan_shape,
 * "image" (float32 [N, ny, nx]). */
int beam_roi_host_start(beam_stage_t *self, beam_roi_host_t *h, const beam_series_t *series,
                        const beam_indesc_t *in, int use_runs, beam_diag_t *d);

/* After a frame's sums are in `sums` (the emitted frame, not yet put):
 * records them in the scan image. Then, after putting the sums, call
 * beam_roi_host_image to publish the image when it is due. */
void beam_roi_host_record(beam_roi_host_t *h, uint64_t frame_id, const double *sums);
int beam_roi_host_image(beam_roi_host_t *h, beam_emit_t *emit, int final);
/* Emits NaN sums for a frame without pixels (CORRUPT) and records them. */
int beam_roi_host_corrupt(beam_roi_host_t *h, beam_emit_t *emit);

/* The definition of membership: weight of pixel (y, x) in ROI r of an
 * h x w frame (0 outside). */
double beam_roi_weight(const beam_roi_sum_conf_t *c, size_t r, uint32_t h, uint32_t w,
                       uint32_t y, uint32_t x);

/* Fast CPU sums, and the plain reference (every pixel, beam_roi_weight,
 * one double accumulator in raster order) they are tested against.
 *
 * beam_roi_sum_runs: per run, a contiguous loop the compiler vectorises.
 * beam_roi_sum_lists: gathers through the index lists (weights or not).
 * beam_roi_sum_cpu: whichever of the two start built for h.
 *
 * Agreement with the reference, n = pixels in the ROI, S = sum over it of
 * |pixel x weight|:
 *   8/16/32-bit integers, unit weights: summed in 64-bit integers (cannot
 *     overflow), then rounded once to double. Equal to the reference
 *     whenever S < 2^53 (then both are exact); above that the fast sum is
 *     the correctly rounded exact sum and the reference is not.
 *   64-bit integers, unit weights: double, exact and equal while S < 2^53.
 *   floats or weights: double in another order; both are within
 *     (n - 1) 2^-53 S of the exact sum (recursive-summation bound), so
 *     |fast - ref| <= 2 n 2^-53 S; in practice far less. */
void beam_roi_sum_runs(beam_roi_runs_t *r, beam_dtype_t dt, const void *frame, double *sums);
/* The same sums of a float32 frame that is never whole in memory: produce
 * fills each range of it that the runs read (tile fusion, stage.h), and
 * the sums equal beam_roi_sum_runs's bit for bit. < 0: produce's error. */
int beam_roi_sum_runs_mapped(beam_roi_runs_t *r, beam_produce_fn produce, void *ctx, double *sums);
void beam_roi_sum_lists(const beam_roi_lists_t *l, beam_dtype_t dt, const void *frame, double *sums);
void beam_roi_sum_cpu(beam_roi_host_t *h, beam_dtype_t dt, const void *frame, double *sums);
void beam_roi_sum_ref(const beam_roi_sum_conf_t *c, beam_dtype_t dt, uint32_t h, uint32_t w,
                      const void *frame, double *sums);

#ifdef __cplusplus
}
#endif
#endif
