/* Stage kind `azint`: azimuthal integration of each frame to I(q) or I(2θ)
 * and, optionally, a cake I(χ, q), with pyFAI's geometry and its "ng"
 * CSR integrators as the specification (docs/azint.md). Shared by
 * azint_cpu.c and gpu/azint_cuda.cu.
 *
 * Geometry (azint_geom.c) is pyFAI's PONI convention: pixel (i, j) centre
 * at p1 = (i + 0.5) pixel1 - poni1 (slow axis), p2 = (j + 0.5) pixel2 -
 * poni2, p3 = dist, rotated by R = R3 R2 R1 (pyFAI.geometry
 * rotation_matrix); 2θ = atan2(sqrt(t1² + t2²), t3), χ = atan2(t1, t2),
 * q = 4π/λ sin(θ) in nm⁻¹.
 *
 * At series start the frame shape is known: every pixel becomes a row
 * entry of a sparse bin x pixel matrix (CSR, pixels increasing within a
 * row), built exactly as pyFAI's SplitBBoxIntegrator (splitBBox_common,
 * 2022): "none" puts a pixel whole into the bin of its centre, "bbox"
 * spreads it over the bins its bounding box [c - d, c + d] covers in
 * proportion to the overlap. A frame is then one pass over the matrix:
 *   signal  S_b = Σ c·x,   variance V_b = Σ c²·max(x, 1) (poisson),
 *   norm    N_b = Σ c·(solid angle · polarisation),  count C_b = Σ c
 * over the valid pixels x of bin b (not masked, finite, not dummy), and
 *   I = S / N,  sigma = sqrt(V) / N  (empty bins, C = 0: the dummy value,
 *   else 0, as pyFAI). */
#ifndef BEAM_KERN_AZINT_H
#define BEAM_KERN_AZINT_H

#include "pipeline/array.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_AZINT_MAX_BINS (1u << 20) /* npt and npt_azim x npt */
#define BEAM_AZINT_MAX_THREADS 64
/* Matrix entries per series (8 bytes each, 2 GiB at most): bbox splitting into very many bins can spread
 * each pixel over thousands of them. A 4 Mpx frame into a few thousand
 * bins takes 2-3 entries per pixel. */
#define BEAM_AZINT_MAX_NNZ ((uint64_t)1 << 28)

typedef enum beam_azint_unit_e {
  BEAM_AZINT_Q_NM = 0, /* q_nm^-1 */
  BEAM_AZINT_Q_A,      /* q_A^-1 */
  BEAM_AZINT_2TH_DEG,  /* 2th_deg */
} beam_azint_unit_t;

/* PONI geometry, SI units (metres, radians). */
typedef struct beam_azint_geom_s {
  double dist, poni1, poni2, rot1, rot2, rot3, wavelength, pixel1, pixel2;
} beam_azint_geom_t;

typedef struct beam_azint_conf_s {
  beam_azint_geom_t g;
  beam_azint_unit_t unit;
  uint32_t npt, npt_azim;
  int has_rrange, has_arange;
  double rrange[2]; /* in `unit` */
  double arange[2]; /* degrees */
  int split_bbox;
  int solid_angle;
  int has_pol;
  double pol;
  int poisson;
  int has_dummy;
  double dummy, delta_dummy;
  unsigned threads;
  beam_array_t mask; /* file; data NULL when none */
  int mask_series;   /* `mask: series` */
} beam_azint_conf_t;

/* Sparse bin x pixel matrix: row b holds idx[ptr[b] .. ptr[b+1]) with
 * coefficients w (float32, as pyFAI's data_t). */
typedef struct beam_azint_csr_s {
  uint32_t nrows;
  uint64_t nnz;
  uint64_t *ptr;
  uint32_t *idx;
  float *w;
} beam_azint_csr_t;

/* Per-series tables: the 1-D and cake matrices, the per-pixel
 * normalisation (solid angle x polarisation, float32), the bin centres. */
typedef struct beam_azint_tab_s {
  uint32_t h, w;
  beam_azint_csr_t r1, r2; /* r2.nrows == 0 without a cake; rows chi-major */
  float *norm;
  /* Per row of r1 / r2: Σ c·norm and Σ c over every entry, in row order
   * (2 x nrows: norm sums, then counts), the frame-independent half of
   * the sums when no pixel of the row is invalid in a frame. */
  double *pre1, *pre2;
  double *radial;          /* npt centres, in `unit` */
  double *chi;             /* npt_azim centres, degrees */
  /* The cake's axes as the descriptor's labels, {axis: {origin, step,
   * units}} (bins are uniform), so viewers can draw them in q and chi. */
  char axes_json[256];
} beam_azint_tab_t;

/* Per-bin sums of one matrix (accumulators; double like pyFAI's acc_t). */
typedef struct beam_azint_sums_s {
  double *sig, *var, *norm, *count;
} beam_azint_sums_t;

/* ---- geometry (azint_geom.c) ---- */

/* Lab-frame position (t1, t2, t3) of detector point (p1, p2) relative to
 * the PONI, metres. */
void beam_azint_lab(const beam_azint_geom_t *g, double p1, double p2, double t[3]);
/* 2θ (rad) and χ (rad, in [-π, π]) of detector point (p1, p2). */
void beam_azint_tth_chi(const beam_azint_geom_t *g, double p1, double p2, double *tth, double *chi);
/* The radial coordinate in the integrator's internal unit: 2θ in radians
 * for 2th_deg, q in nm⁻¹ for both q units. */
double beam_azint_radial(const beam_azint_geom_t *g, beam_azint_unit_t u, double tth);
/* Internal -> output unit factor (pyFAI unit.scale): 180/π, 1, 0.1. */
double beam_azint_scale(beam_azint_unit_t u);
/* Solid angle relative to the PONI pixel, cos³ of the incidence angle
 * (pyFAI 0.21 diffSolidAngle: dist / |(p1, p2, dist)|, tilts ignored). */
double beam_azint_solid_angle(const beam_azint_geom_t *g, double p1, double p2);
/* pyFAI's polarisation array: ½(1 + cos²2θ - f cos(2χ)(1 - cos²2θ)). */
double beam_azint_polarization(double tth, double chi, double f);
/* Parses a pyFAI .poni file (version 1: PixelSize1/2; version 2: the
 * Detector_config JSON's pixel1/pixel2). Returns 0 or BEAM_ECONFIG /
 * BEAM_EIO with d naming the file and the missing or bad key. */
int beam_azint_poni_load(const char *path, beam_azint_geom_t *g, beam_diag_t *d);

/* ---- host side (azint.c) ---- */

int beam_azint_conf_load(beam_azint_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_azint_conf_free(beam_azint_conf_t *c);

/* Builds t for h x w frames (mask: the configured file, the series'
 * pixel_mask, or NULL): geometry per pixel, boundaries, both matrices.
 * Frees and rebuilds whatever t held. Series start only. */
int beam_azint_tab_build(beam_azint_tab_t *t, const beam_azint_conf_t *c, uint32_t h, uint32_t w,
                         const beam_array_t *mask, beam_diag_t *d);
void beam_azint_tab_free(beam_azint_tab_t *t);

/* Validates the input (2-D real frames, mask shape), resolves the mask,
 * builds t and declares the outputs: intensity, sigma (poisson only), count,
 * radial (once per series), and with a cake: cake, cake_sigma (poisson),
 * cake_count, chi (once). Output indices are in beam_azint_out_t. */
int beam_azint_start(beam_stage_t *self, const beam_azint_conf_t *c, beam_azint_tab_t *t,
                     const beam_series_t *series, const beam_indesc_t *in, beam_diag_t *d);

typedef struct beam_azint_outs_s {
  int I, sigma, count, radial, cake, cake_sigma, cake_count, chi; /* -1: not declared */
} beam_azint_outs_t;
void beam_azint_outs(const beam_azint_conf_t *c, beam_azint_outs_t *o);

/* Sums of rows [r0, r1) of m over frame px (dtype dt): the plain loop,
 * one double accumulator per quantity, pixels in row order (pyFAI's
 * CsrIntegrator.integrate_ng order). Both backends' definition. */
void beam_azint_csr_apply(const beam_azint_csr_t *m, const beam_azint_conf_t *c, const float *norm,
                          beam_dtype_t dt, const void *px, uint32_t r0, uint32_t r1,
                          beam_azint_sums_t *s);
/* The CPU backend's loop (azint_cpu.c): per row, signal and variance from
 * the frame, normalisation and count from pre (beam_azint_tab_t.pre1/2)
 * unless the row meets an invalid pixel, which then goes through
 * beam_azint_csr_apply. Bit-identical to beam_azint_csr_apply (same
 * terms, same order). */
void beam_azint_csr_apply_fast(const beam_azint_csr_t *m, const beam_azint_conf_t *c,
                               const float *norm, const double *pre, beam_dtype_t dt,
                               const void *px, uint32_t r0, uint32_t r1, beam_azint_sums_t *s);
/* I, sigma, count of nb bins into the emitted frames (any may be NULL). */
void beam_azint_finish(const beam_azint_conf_t *c, const beam_azint_sums_t *s, uint32_t nb,
                       double *I, double *sigma, double *count);
/* Emits the result frames of one frame from the sums of both matrices
 * (s2 ignored without a cake); radial/chi go out with the series' first
 * frame. first is set to 0 afterwards. */
int beam_azint_emit(beam_stage_t *self, const beam_azint_conf_t *c, const beam_azint_tab_t *t,
                    const beam_azint_sums_t *s1, const beam_azint_sums_t *s2, int *first,
                    beam_emit_t *emit);
/* NaN results for a frame without pixels (CORRUPT). */
int beam_azint_emit_corrupt(beam_stage_t *self, const beam_azint_conf_t *c, const beam_azint_tab_t *t,
                            int *first, beam_emit_t *emit);

#ifdef __cplusplus
}
#endif
#endif
