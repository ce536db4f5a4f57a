/* ROI definitions for the XPCS stage kinds (xpcs_multitau, xpcs_twotime):
 * which detector pixels belong to which ROI, as a compact
 * pixel list sorted by ROI so per-frame work streams one small array.
 *
 * Two sources, exactly one per stage:
 *   file   an integer label image (.h5 or .npy); 0 (and negatives) = unused.
 *          The distinct labels present become ROIs 1..R in increasing
 *          order (gaps allowed: labels 3, 7, 10 -> columns 0, 1, 2), as
 *          scikit-beam's label remapping does.
 *   rings  a centre [x, y] (pixel centres at integers) and either radii
 *          edges in pixels or q edges in 1/Angstrom; ring k is
 *          edge[k] <= value < edge[k+1], label k + 1. q needs the photon
 *          energy (eV), sample-detector distance (m) and pixel size (m),
 *          from the config or else the series metadata:
 *          q = 4 pi / lambda * sin(atan(r * pixel / distance) / 2),
 *          lambda [A] = 12398.419843 / energy [eV].
 * The centre may be "series": the series metadata's beam_center [y, x]
 * (from_series.h; a series without one is refused at its start).
 * A bad-pixel mask (nonzero = bad) removes pixels from every ROI: scikit-
 * beam marks a whole frame bad for one NaN pixel, so permanently bad
 * pixels must leave the labels instead (its issue #431). The mask is a file
 * or "series": the series' pixel_mask array (the DECTRIS detector's gap,
 * dead, cold and hot pixels), looked up at every start as correct does.
 *
 * Errors at start (the frame shape is known only then): label image or
 * mask shape differs from the frames, an ROI without pixels (named by its
 * label), a ring entirely outside the detector. Not for computing
 * anything per frame: see xpcs_multitau.h. */
#ifndef BEAM_KERN_XPCS_ROIS_H
#define BEAM_KERN_XPCS_ROIS_H

#include "pipeline/array.h"
#include "pipeline/frame.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_XPCS_ROI_MAX 65535u

/* The `rois:` sub-map schema, shared by the XPCS kinds. */
extern const beam_param_t beam_xpcs_rois_params[];

typedef struct beam_xpcs_rois_s {
  /* From init. */
  beam_array_t labels_img; /* file: the label image */
  beam_array_t mask;       /* optional bad-pixel mask file; data NULL if none */
  int mask_series;         /* `mask: series`: the series' pixel_mask, at start */
  int center_series;       /* `center: series`: the metadata's beam_center, at start */
  int rings;               /* 1: ring geometry */
  int q_edges;             /* rings given as q (1/A), else radii (pixels) */
  double cx, cy;           /* with center_series: the last series' */
  double *edges;           /* rings: nedges increasing values */
  size_t nedges;
  double energy_ev, distance_m, pixel_m; /* config values, 0 = from series */
  /* From start. */
  size_t nroi;
  int64_t *label;      /* [nroi] label value of each ROI, increasing */
  uint64_t *off;       /* [nroi + 1] ROI r's pixels are idx[off[r]..off[r+1]) */
  uint32_t *idx;       /* [total] raster indices, increasing within an ROI */
  size_t total;
  char *labels_json;   /* "[3,7,10]" for output descriptors */
} beam_xpcs_rois_t;

/* Parses the `rois` map (cfg may be NULL: error) and loads the files.
 * who prefixes messages (the kind). On failure nothing stays allocated. */
int beam_xpcs_rois_init(beam_xpcs_rois_t *r, const beam_cnode_t *cfg, const char *who,
                        beam_diag_t *d);
/* Builds the pixel lists for h x w frames; series (may be NULL) supplies
 * energy, distance and pixel size the config left out, and the mask and
 * centre the config sets to "series" (BEAM_ECONFIG when it lacks them). */
int beam_xpcs_rois_start(beam_xpcs_rois_t *r, uint32_t h, uint32_t w,
                         const beam_series_t *series, const char *who, beam_diag_t *d);
/* Frees everything; NULL-safe, idempotent. */
void beam_xpcs_rois_free(beam_xpcs_rois_t *r);

#ifdef __cplusplus
}
#endif
#endif
