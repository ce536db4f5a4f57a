/* What stages take from the series instead of from their own config, with
 * the value "series" (correct's mask/flat, roi_sum's mask and centre, the
 * XPCS ROIs' mask and centre): the series' named arrays (frame.h) and the
 * beam centre of its metadata (PROTOCOL.md 7.1, "beam_center": [y, x]).
 *
 * One convention for all of them: what a config asks the series for must
 * be there when the series starts. A series without it is refused at its
 * start (BEAM_ECONFIG naming the stage kind, the key and what is missing),
 * never run with the mask or centre silently left out. Internal to the
 * kernels, like kern_int.h. */
#ifndef BEAM_KERN_FROM_SERIES_H
#define BEAM_KERN_FROM_SERIES_H

#include "pipeline/array.h"
#include "pipeline/frame.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The value of a key that takes its array or centre from the series. */
#define BEAM_FROM_SERIES "series"

/* The series' real-valued array `name`, for config key `key` of stage kind
 * `who`: *out borrows it (valid while the caller holds the series). Returns
 * 0, BEAM_ECONFIG when series is NULL or carries no such array (a DECTRIS
 * detector sends its arrays only with header_detail "all"), BEAM_ENOTSUP
 * when it holds complex numbers. */
int beam__series_real_array(const beam_series_t *series, const char *who, const char *key,
                            const char *name, const beam_array_t **out, beam_diag_t *d);

/* The beam centre in pixels from the series metadata's "beam_center"
 * [y, x], for key `key` of `who`: 0 with *x, *y set, or BEAM_ECONFIG when
 * the metadata has none (or it is not two finite numbers). */
int beam__series_beam_center(const beam_series_t *series, const char *who, const char *key,
                             double *x, double *y, beam_diag_t *d);

/* The raster scan's shape from the series metadata's "scan_shape"
 * [ny, nx] (what beamd-sim's 4D-STEM pattern and detectors that know the
 * scan send): 1 with *ny, *nx set, 0 when the metadata has none, < 0 when
 * it is not two integers 1..1e6. */
int beam__series_scan_shape(const beam_series_t *series, uint32_t *ny, uint32_t *nx);

#ifdef __cplusplus
}
#endif
#endif
