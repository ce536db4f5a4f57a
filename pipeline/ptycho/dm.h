/* The difference-map (DM) ptychography engine: one algorithm, two backends
 * (CPU with FFTW, CUDA with cuFFT), used by the live stage `ptycho_dm` and
 * by `beamd-ptycho`. ../shared/notes/ptycho-dm.md describes the reference
 * codes; docs/ptycho.md states what this engine does. In short:
 *
 * Views i (n x n amplitudes A_i, FFT order), probe modes j < M_P, object
 * modes k < M_O, exit waves psi_ijk (state), W_i the n x n object window at
 * integer offset (row_i, col_i), F the unitary 2-D FFT (norm="ortho").
 *
 * One iteration:
 *   1. exit-wave step, every view:
 *        phi = P_j W_i O_k;  Phi = F[2 phi - psi];  af = sqrt(sum_jk |Phi|^2)
 *        valid pixels (A >= 0):
 *          fourier_relax == 0:  Phi' = Phi * A / (af + eps)
 *          fourier_relax  > 0:  PtyPy's power bound: fdev = af - A,
 *              err_i = sum_valid fdev^2 / n_valid,
 *              pbound = 0.25 fourier_relax^2 max_i(sum_valid A_i^2) / n^2;
 *              err_i > pbound: Phi' = Phi (A + fdev sqrt(pbound/err_i)) / (af + eps)
 *              else:           Phi' = Phi           (no FFT back needed)
 *        masked pixels (A < 0): Phi' = Phi (unconstrained)
 *        psi <- psi + b F^-1[Phi'] + a phi - (a + b) psi
 *          algorithm DM:   a = -beta, b = beta, i.e. psi + beta (F^-1[Phi'] - phi)
 *                          (the NSLS-II form; beta = 1 is Thibault's DM);
 *          algorithm RAAR: a = 1 - 2 beta, b = beta (Luke 2005, PtyPy's
 *                          projection_update_generalized with (1-2b, b, 2)).
 *        DM has no fixed point on noisy (inconsistent) data and its exit
 *        waves drift: on simulated Poisson data at 1e5-1e6 photons per
 *        frame the object error falls for ~10 iterations and then grows
 *        without bound (docs/ptycho.md). RAAR with beta ~0.8 settles near
 *        the solution on the same data at the same cost per iteration.
 *      Views with no photons (sum_valid A = 0) carry no information: their
 *      exit waves are set to phi (psi <- phi) and they are left out of the
 *      Fourier error.
 *   2. inner_passes times:
 *        O_k = (sum_ij W_i^T[conj(P_j) psi_ijk] + a_O O_k) / (sum_ij W_i^T|P_j|^2 + a_O)
 *        a_O = obj_reg * max_x(sum_ij W_i^T|P_j|^2)
 *      and, from iteration probe_update_start on (0-based), with the new O:
 *        P_j = (sum_ik psi_ijk conj(W_i O_k) + a_P P_j) / (sum_ik |W_i O_k|^2 + a_P)
 *        a_P = probe_reg * max_x(sum_ik |W_i O_k|^2)
 *      then, when probe_support > 0, P_j = 0 where pi r^2 >= probe_support n^2
 *      (r from the array centre, PtyPy's convention).
 *   The regularisers are relative (dimensionless fractions of the largest
 *   denominator), so they mean the same at any photon count; the a O and
 *   a P terms are inertia: poorly covered pixels keep their value instead of
 *   decaying to zero.
 *
 * Metrics per iteration (double, whatever the precision):
 *   fourier_error = sum_i sum_valid (af - A)^2 / sum_i sum_valid A^2, from
 *     the FFT of step 1 (2 phi - psi; at the fixed point psi = phi), so it
 *     costs no extra FFT;
 *   probe_change  = ||P - P_prev|| / ||P||, object_change likewise (all modes).
 *
 * Distributed use (MPI): each rank adds its own views; set_reducer installs
 * a sum over ranks that the engine calls on host buffers, in this order, on
 * every rank: object numerator+denominator, probe numerator+denominator (when
 * the probe is updated), then the metric sums. Every rank then computes the
 * same O and P.
 *
 * Threading: one engine is used by one thread at a time. */
#ifndef BEAM_PTYCHO_DM_H
#define BEAM_PTYCHO_DM_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_DM_MAX_PROBE_MODES 16
#define BEAM_DM_MAX_OBJECT_MODES 4

typedef enum { BEAM_DM_F32 = 0, BEAM_DM_F64 = 1 } beam_dm_prec_t;
typedef enum { BEAM_DM_CPU = 0, BEAM_DM_CUDA = 1 } beam_dm_backend_t;
typedef enum { BEAM_DM_ALG_DM = 0, BEAM_DM_ALG_RAAR = 1 } beam_dm_alg_t;

typedef struct beam_dm_conf_s {
  beam_dm_prec_t prec;
  uint32_t n;              /* view side (pixels); views are n x n */
  uint32_t max_views;      /* capacity, allocated at create */
  uint32_t obj_h, obj_w;   /* object array (object pixels) */
  uint32_t probe_modes;    /* M_P, 1..BEAM_DM_MAX_PROBE_MODES */
  uint32_t object_modes;   /* M_O, 1..BEAM_DM_MAX_OBJECT_MODES */
  double beta;             /* relaxation, (0, 1]; DM with 1 = Thibault's DM */
  double obj_reg;          /* relative, >= 0 (see above); typical 1e-3 */
  double probe_reg;        /* relative, >= 0; typical 1e-3 */
  uint32_t probe_update_start; /* first iteration (0-based) updating P */
  uint32_t inner_passes;   /* object/probe passes per iteration, >= 1 */
  double fourier_relax;    /* PtyPy fourier_relax_factor; 0 = off */
  double probe_support;    /* fraction of n^2; 0 = off */
  int threads;             /* CPU threads; 0 = all online cores */
  int device;              /* CUDA device index */
  beam_dm_alg_t algorithm; /* exit-wave update: DM (default) or RAAR */
} beam_dm_conf_t;

/* Defaults: f32, beta 1, obj_reg probe_reg 1e-3, probe_update_start 2,
 * inner_passes 1, fourier_relax 0, probe_support 0, threads 0, device 0,
 * one mode each. n, max_views, obj_h, obj_w are left 0 (must be set). */
void beam_dm_conf_default(beam_dm_conf_t *c);

typedef struct beam_dm_metrics_s {
  uint32_t iteration;   /* 0-based index of the iteration just done */
  double fourier_error;
  double probe_change;  /* 0 when the probe was not updated */
  double object_change;
  double seconds;       /* wall time of the iteration */
} beam_dm_metrics_t;

/* Sums nreal values of buf (float when prec is F32 and the buffer is an
 * engine buffer, double for the metric sums: is_double says which) across
 * ranks, in place. Returns 0 or < 0 (the iteration then fails). */
typedef int (*beam_dm_reduce_fn)(void *ctx, void *buf, size_t nreal, int is_double);

typedef struct beam_dm_s beam_dm_t;

/* Allocates everything for max_views (device memory for CUDA); the probe
 * starts at 0 and the object at 1 (flat) until set. Errors: BEAM_EINVAL for
 * a bad conf (message names the field), BEAM_ENOMEM / BEAM_ELIMIT when the
 * views do not fit (message gives the bytes needed and available),
 * BEAM_ENOTSUP for CUDA in a build or machine without it. */
int beam_dm_create(beam_dm_t **out, const beam_dm_conf_t *c, beam_dm_backend_t be,
                   beam_diag_t *d);
void beam_dm_destroy(beam_dm_t **e);
const beam_dm_conf_t *beam_dm_conf(const beam_dm_t *e);

/* Bytes the engine allocates for conf c (views, exit waves, object, probe,
 * accumulators, FFT work), so callers can refuse a scan before creating. */
size_t beam_dm_bytes(const beam_dm_conf_t *c);

/* Probe: M_P x n x n complex, interleaved (re, im) doubles, C order.
 * Object: M_O x obj_h x obj_w likewise. set_* may be called at any time;
 * exit waves of existing views are not changed. */
int beam_dm_set_probe(beam_dm_t *e, const double *probe, beam_diag_t *d);
int beam_dm_set_object(beam_dm_t *e, const double *obj, beam_diag_t *d);
int beam_dm_get_probe(beam_dm_t *e, double *probe, beam_diag_t *d);
int beam_dm_get_object(beam_dm_t *e, double *obj, beam_diag_t *d);

/* Adds count views: amp is count x n x n floats, amplitudes in FFT order
 * (beam_dm_prep_frame), A < 0 marks a masked pixel; pos is count x 2
 * (row, col) top-left window offsets in object pixels, each window inside
 * the object. Their exit waves start as P_j W_i O_k with the current probe
 * and object. BEAM_ELIMIT when max_views would be exceeded, BEAM_EINVAL for
 * a window outside the object (nothing added then). */
int beam_dm_add_views(beam_dm_t *e, uint32_t count, const float *amp, const int32_t *pos,
                      beam_diag_t *d);
uint32_t beam_dm_nviews(const beam_dm_t *e);
/* Iterations done since create or reset. */
uint32_t beam_dm_iterations(const beam_dm_t *e);

/* One DM iteration over every view added so far. BEAM_ESTATE without
 * views. Divergence is the caller's call, from the metrics
 * (beam_dm_diverged). */
int beam_dm_iterate(beam_dm_t *e, beam_dm_metrics_t *m, beam_diag_t *d);

/* Forget every view and the iteration count (a new scan); probe and object
 * keep their values until set again. */
void beam_dm_reset(beam_dm_t *e);

void beam_dm_set_reducer(beam_dm_t *e, beam_dm_reduce_fn fn, void *ctx);

/* 1 when the history says the reconstruction diverged: a non-finite
 * metric, or a Fourier error more than `factor` times its minimum so far
 * after at least 5 iterations. */
int beam_dm_diverged(const beam_dm_metrics_t *hist, size_t n, double factor);

#ifdef __cplusplus
}
#endif
#endif
