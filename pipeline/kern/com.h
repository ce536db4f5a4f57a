/* Stage kind `com`: per 4D-STEM diffraction frame the centre of mass (COM)
 * of the pixels inside a disc, and over the scan the differential phase
 * contrast (DPC) maps LiberTEM's COM analysis gives: the shift field, its
 * magnitude, divergence and curl, plus the integrated DPC (iDPC) potential.
 * Shared by com_cpu.c and gpu/com_cuda.cu; docs/com.md is the user's view.
 *
 * Definitions (beam_com_inside and beam_com_sums_ref are the reference):
 *   pixel (x, y), pixel centres at integers; reference centre (cx, cy),
 *   default the frame centre ((w-1)/2, (h-1)/2); d2 = (x-cx)^2 + (y-cy)^2.
 *   A pixel counts when d2 <= r^2 (LiberTEM's masks.circular), d2 > ri^2
 *   when ri > 0 (its ring), and the mask (file or the series' pixel_mask)
 *   is 0 there (nonzero = bad pixel, as in `correct`).
 *   S = sum v, Sx = sum v x, Sy = sum v y over those pixels;
 *   com = (Sx / S, Sy / S), shift = com - (cx, cy); S == 0 gives NaN.
 *   The field (LiberTEM's apply_correction): y' = flip_y ? -shift_y : shift_y,
 *   then a rotation by scan_rotation degrees,
 *     field_y =  cos t y' + sin t shift_x,  field_x = -sin t y' + cos t shift_x.
 *   divergence = d field_y / d iy + d field_x / d ix,
 *   curl       = d field_y / d ix - d field_x / d iy (LiberTEM's curl_2d),
 *   with d/d the np.gradient stencil (central inside, one-sided at the
 *   edges, 0 along an axis of length 1) over scan row iy and column ix.
 *   idpc = Re F^-1[(kx F(field_x) + ky F(field_y)) / (2 pi i (kx^2 + ky^2))],
 *   k in cycles per scan step (numpy fftfreq), the k = 0 term 0, and on
 *   an even axis no Nyquist term in the numerator (as numpy's .real): the
 *   potential whose gradient best fits the field (exactly its gradient for
 *   a periodic field); positions not scanned enter as 0 and come out NaN. */
#ifndef BEAM_KERN_COM_H
#define BEAM_KERN_COM_H

#include <fftw3.h>

#include "pipeline/array.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values of the per-frame output "com", float64 [BEAM_COM_NVAL]. */
enum { BEAM_COM_X, BEAM_COM_Y, BEAM_COM_SHIFT_X, BEAM_COM_SHIFT_Y, BEAM_COM_SUM, BEAM_COM_NVAL };
/* Planes of the scan output "maps", float32 [nmaps, ny, nx]; idpc only
 * with `idpc: true`. */
enum { BEAM_COM_M_FIELD_X, BEAM_COM_M_FIELD_Y, BEAM_COM_M_MAG, BEAM_COM_M_DIV, BEAM_COM_M_CURL,
       BEAM_COM_M_IDPC, BEAM_COM_NMAPS };

typedef struct beam_com_conf_s {
  int has_center;
  double cx, cy;
  double r, ri;          /* r = INFINITY: the whole frame; ri = 0: no hole */
  beam_array_t mask;     /* `mask` file (data NULL when none) */
  int mask_series;       /* `mask: series`: the series' pixel_mask */
  int scan_cfg;          /* scan_shape given in the config */
  uint32_t scan_ny, scan_nx;
  double rot_deg;
  int flip_y, idpc;
  uint64_t image_every;
} beam_com_conf_t;

/* `len` pixels of row y from column x0, all inside. */
typedef struct beam_com_run_s {
  uint32_t y, x0, len;
} beam_com_run_t;

typedef struct beam_com_host_s {
  beam_com_conf_t conf;
  beam_indesc_t in;
  double cx, cy;          /* this series' reference centre */
  uint8_t *bad;           /* this series' mask as 0/1 per pixel, or NULL */
  size_t bad_cap;
  beam_com_run_t *run;    /* the pixels inside, row by row */
  size_t nrun, run_cap;
  uint32_t *idx;          /* the same pixels as flat indices (CUDA), or NULL */
  uint64_t npix;          /* pixels inside */
  /* Scan (when a scan shape is known this series). */
  int scan;
  uint32_t ny, nx;
  unsigned nmaps;
  double *sx, *sy;        /* raw shift per position, NaN until scanned */
  double *fx, *fy;        /* field scratch for the maps */
  uint8_t *seen;
  uint64_t nseen;         /* distinct positions scanned */
  uint64_t ncorrupt;      /* CORRUPT frames this series (no pixels: NaN) */
  size_t scan_cap;        /* positions the buffers above hold */
  double *rbuf;           /* iDPC real plane (in and out) */
  fftw_complex *fa, *fb;  /* iDPC half spectra, ny x (nx/2 + 1); plans on these */
  fftw_plan p_fa, p_fb, p_inv;
  uint64_t nframes;       /* frames seen this series */
} beam_com_host_t;

/* init: parses the parameters, loads a mask file. On failure nothing
 * stays allocated. */
int beam_com_host_init(beam_com_host_t *h, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_com_host_free(beam_com_host_t *h);

/* start: 2-D real frames; the mask (file or series) of the frame shape;
 * at least one pixel inside. Builds the runs (and, with want_idx, the
 * flat index list), takes the scan shape from the config or else from
 * the series metadata ("scan_shape": [ny, nx]), sizes the scan buffers
 * and FFT plans, declares "com" and, with a scan shape, "maps". */
int beam_com_host_start(beam_stage_t *self, beam_com_host_t *h, const beam_series_t *series,
                        const beam_indesc_t *in, int want_idx, beam_diag_t *d);

/* The definition of membership for this series' centre and mask. */
int beam_com_inside(const beam_com_host_t *h, uint32_t y, uint32_t x);

/* s[0..3) = S, Sx, Sy. _cpu: over the runs, four lanes per run; _ref:
 * every pixel, beam_com_inside, one double chain in raster order. Both
 * are exact (and so equal) for integer pixels while the sums are
 * integers below 2^53 (e.g. uint16 frames up to 2048 x 2048); floats
 * agree within 2 n 2^-53 sum |v| (x_max for Sx). */
void beam_com_sums_cpu(const beam_com_host_t *h, beam_dtype_t dt, const void *frame, double s[3]);
void beam_com_sums_ref(const beam_com_host_t *h, beam_dtype_t dt, const void *frame, double s[3]);

/* out[BEAM_COM_NVAL] from the sums (one formula for both backends). */
void beam_com_finish(const beam_com_host_t *h, const double s[3], double *out);
/* Records a frame's values at its scan position (frame id mod ny nx). */
void beam_com_host_record(beam_com_host_t *h, uint64_t frame_id, const double *out);
/* Publishes the maps when due (every image_every frames; always when
 * final: FINAL, INCOMPLETE when positions were never scanned or frames
 * were lost, ABORTED when the series was cut short). */
int beam_com_host_maps(beam_stage_t *self, beam_com_host_t *h, beam_emit_t *emit, int final);
/* A frame without pixels (CORRUPT): NaN values, recorded. */
int beam_com_host_corrupt(beam_stage_t *self, beam_com_host_t *h, beam_emit_t *emit);

/* The maps of the current shift buffers into out[nmaps][ny][nx]. */
void beam_com_compute_maps(beam_com_host_t *h, float *out);

#ifdef __cplusplus
}
#endif
#endif
