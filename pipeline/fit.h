/* Batched nonlinear least squares: many small independent fits of one model
 * (Levenberg–Marquardt, analytic Jacobians, box bounds, LSE or Poisson MLE).
 *
 * For per-pixel damped-cosine maps and per-q g2 curves: up to
 * BEAM_FIT_MAX_PARAMS parameters, a few thousand points, one shared x or
 * one x per fit. Two CPU implementations share the description below:
 *   beam_fit_ref_range   plain reference, one fit at a time, all in double;
 *                        the oracle the fast path is tested against
 *   beam_fit_cpu_range   SIMD-batched: 16 fits per instruction stream,
 *                        fp32 per point, normal equations summed in double,
 *                        ISA (SSE2 / AVX2+FMA / AVX-512) chosen at run time
 * Both fit the index range [i0, i1) of a batch, so a caller (the fit stage,
 * a CUDA backend's host fallback) splits the batch over its own threads.
 * Neither allocates: the caller passes a workspace of
 * beam_fit_workspace_size() bytes per concurrent call.
 *
 * Not here: threads, data conversion (y is float32), the stage.
 * The CUDA backend (beam_fit_cuda, end of this file) is defined in
 * gpu/fit_cuda.cu, and in gpu/stubs.c (BEAM_ENOTSUP) for CPU-only builds.
 * Method, bounds, estimators, statuses and accuracy: docs/fit.md. */
#ifndef BEAM_FIT_H
#define BEAM_FIT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_FIT_MAX_PARAMS 16

/* Models; x is t (time), delay or position. Parameter order as listed. */
typedef enum beam_fit_model_e {
  /* e^(-t/tau)·(a·cos 2πft + b·sin 2πft) + c                 a b tau f c
   * = A·e^(-t/tau)·cos(2πft + φ) + c with A = hypot(a,b), φ = atan2(-b,a):
   * linear in a, b, c, so the phase cannot wrap and A cannot flip sign. */
  BEAM_FIT_DCOS = 0,
  /* the same in u = max(t - t0, 0): flat at a + c below t0  a b tau f c t0 */
  BEAM_FIT_DCOS_T0,
  /* two damped cosines and one offset        a1 b1 tau1 f1 a2 b2 tau2 f2 c */
  BEAM_FIT_DCOS2,
  /* g2, pyXpcsViewer single: a·exp(-2x/tau) + d                  a tau d */
  BEAM_FIT_EXP,
  /* g2, pyXpcsViewer stretched: a·exp(-2·(x/tau)^beta) + d  a tau beta d */
  BEAM_FIT_STRETCH,
  /* g2, XPCS-Toolkit stretched: a·exp(-(2x/tau)^beta) + d   a tau beta d
   * (equal to BEAM_FIT_STRETCH only at beta = 1) */
  BEAM_FIT_STRETCH_XT,
  /* a1·exp(-2x/tau1) + a2·exp(-2x/tau2) + d           a1 tau1 a2 tau2 d */
  BEAM_FIT_EXP2,
  /* A·exp(-(x-mu)²/(2·sigma²)) + c0 + c1·x                A mu sigma c0 c1 */
  BEAM_FIT_GAUSS,
  /* A / (1 + ((x-mu)/gamma)²) + c0 + c1·x  (gamma = HWHM) A mu gamma c0 c1 */
  BEAM_FIT_LORENTZ,
  /* c0 + c1·x + ... + c_n·x^n, n = batch.poly_degree; exact linear solve */
  BEAM_FIT_POLY,
  BEAM_FIT_N_MODELS
} beam_fit_model_t;

typedef struct beam_fit_model_info_s {
  const char *name;               /* config name: "dcos", "stretch", ... */
  int n_params;                   /* 0 for POLY (degree + 1) */
  int linear;                     /* 1: solved exactly in one step */
  const char *param_names[BEAM_FIT_MAX_PARAMS];
} beam_fit_model_info_t;

/* NULL for an unknown model. */
const beam_fit_model_info_t *beam_fit_model_info(beam_fit_model_t m);
/* The model named name, or -1. */
int beam_fit_model_from_name(const char *name);

typedef enum beam_fit_estimator_e {
  BEAM_FIT_LSE = 0,     /* χ² = Σ w (y - f)², w given or 1 */
  BEAM_FIT_LSE_POISSON, /* w = 1 / max(y, 1) */
  BEAM_FIT_MLE          /* Poisson deviance 2Σ(f - y) - 2Σ_{y>0} y ln(f/y) */
} beam_fit_estimator_t;

typedef enum beam_fit_init_e {
  BEAM_FIT_INIT_AUTO = 0, /* per-trace guess from the data (docs/fit.md) */
  BEAM_FIT_INIT_GIVEN     /* batch.p0 (a caller's guess or a previous fit) */
} beam_fit_init_t;

/* Forces the SIMD level of beam_fit_cpu_range (tests, benchmarks);
 * AUTO picks the best the CPU supports, and a level the CPU lacks falls
 * back to the best it has. */
typedef enum beam_fit_isa_e {
  BEAM_FIT_ISA_AUTO = 0,
  BEAM_FIT_ISA_SSE2,
  BEAM_FIT_ISA_AVX2,
  BEAM_FIT_ISA_AVX512
} beam_fit_isa_t;

/* Per-fit outcome (result status[i]). */
typedef enum beam_fit_status_e {
  BEAM_FIT_CONVERGED = 0, /* a stop test passed */
  BEAM_FIT_BOUND,         /* converged with a parameter on its bound */
  BEAM_FIT_MAX_ITER,      /* max_iter passes without a stop test */
  BEAM_FIT_SINGULAR,      /* JᵀWJ not positive definite: errors NaN */
  BEAM_FIT_BAD_INPUT,     /* non-finite x/y/w, w < 0, y < 0 for MLE,
                             constant y, or a non-finite start */
  BEAM_FIT_TOO_FEW,       /* points with w > 0 <= number of parameters */
  BEAM_FIT_N_STATUS
} beam_fit_status_t;

/* "converged", "bound", ... */
const char *beam_fit_status_name(int status);

/* One batch: n_fits fits of n_points each. Arrays are borrowed for the
 * call. Strides are in elements, so both layouts work without a copy:
 * fit-major [fit][point] (fit_stride = n_points, point_stride = 1) and
 * frame-major [point][fit] (fit_stride = 1, point_stride = n_fits). */
typedef struct beam_fit_batch_s {
  beam_fit_model_t model;
  int poly_degree;      /* POLY only, 0..BEAM_FIT_MAX_PARAMS-1 */
  size_t n_fits, n_points;
  const float *y;
  ptrdiff_t y_fit_stride, y_point_stride;
  const float *x;       /* x_fit_stride 0: one x shared by every fit */
  ptrdiff_t x_fit_stride, x_point_stride;
  const float *w;       /* LSE weights 1/σ², or NULL; w = 0 masks a point */
  ptrdiff_t w_fit_stride, w_point_stride;
  const double *p0;     /* INIT_GIVEN: n_fits x n_params (row per fit) */
  const double *lo, *hi;/* n_params bounds shared by all fits; NULL or
                           ±INFINITY: unbounded */
} beam_fit_batch_t;

typedef struct beam_fit_opts_s {
  beam_fit_estimator_t estimator;
  beam_fit_init_t init;
  beam_fit_isa_t isa;
  int max_iter;         /* passes over the data after the first; 100 */
  double ftol;          /* relative χ² decrease; 1e-6 */
  double xtol;          /* relative (Marquardt-scaled) step; 1e-6 */
  double gtol;          /* max |cos(J_i, r)|; 1e-8 */
  double lambda0;       /* initial damping, relative to diag(JᵀWJ); 1e-3 */
  int absolute_sigma;   /* LSE: 1 = errors from (JᵀWJ)⁻¹ unscaled
                           (curve_fit absolute_sigma=True); 0 = scaled by
                           χ²/(N-P), curve_fit's default */
} beam_fit_opts_t;

void beam_fit_opts_default(beam_fit_opts_t *o);

/* Results, indexed by the fit's index in the batch (i0..i1-1 written).
 * params is required; any other array may be NULL. */
typedef struct beam_fit_result_s {
  double *params;       /* n_fits x n_params */
  double *errors;       /* n_fits x n_params: sqrt(diag(cov)), NaN if none */
  double *cov;          /* n_fits x n_params x n_params */
  double *chi2;         /* χ² (LSE) or deviance (MLE) */
  double *chi2_red;     /* chi2 / (N - P) */
  int32_t *iters;
  int32_t *n_used;      /* points with w > 0 */
  uint8_t *status;      /* beam_fit_status_t */
} beam_fit_result_t;

/* Checks the batch and options (model, sizes, strides given, bounds
 * lo <= hi, p0 for INIT_GIVEN) and returns the number of parameters, or
 * BEAM_EINVAL with the reason in d. */
int beam_fit_check(const beam_fit_batch_t *b, const beam_fit_opts_t *o, beam_diag_t *d);

/* Bytes of workspace one call of either range function needs (the same
 * figure for both); 0 when the batch is invalid. */
size_t beam_fit_workspace_size(const beam_fit_batch_t *b, const beam_fit_opts_t *o);

/* Fits [i0, i1) of b into r. ws: ws_bytes >= beam_fit_workspace_size(),
 * any alignment, owned by the caller, not kept. Returns 0 (every fit has
 * a status, whatever its data), or BEAM_EINVAL for an invalid batch,
 * range or workspace. Thread-safe for disjoint ranges and workspaces. */
int beam_fit_cpu_range(const beam_fit_batch_t *b, const beam_fit_opts_t *o, size_t i0,
                       size_t i1, void *ws, size_t ws_bytes, beam_fit_result_t *r,
                       beam_diag_t *d);
int beam_fit_ref_range(const beam_fit_batch_t *b, const beam_fit_opts_t *o, size_t i0,
                       size_t i1, void *ws, size_t ws_bytes, beam_fit_result_t *r,
                       beam_diag_t *d);

/* The SIMD level beam_fit_cpu_range runs for o->isa on this CPU. */
beam_fit_isa_t beam_fit_cpu_isa(beam_fit_isa_t want);
const char *beam_fit_isa_name(beam_fit_isa_t isa);

/* ---- CUDA backend (gpu/fit_cuda.cu; gpu/stubs.c without CUDA) ----
 * One fused kernel per batch: a thread (short traces) or a warp (long
 * ones) runs a fit's whole LM loop on the device, the Jacobian never
 * leaves registers, the host waits once per batch. Same statuses and
 * results as beam_fit_cpu_range within the tolerances of docs/fit.md. */
typedef struct beam_fit_cuda_s beam_fit_cuda_t;

/* How a call ran (all optional to read). */
typedef struct beam_fit_cuda_run_s {
  int mapping;      /* in: 0 auto (thread per fit for n_points <= 256, else
                       a warp per fit), 1 thread, 2 warp; out: the one run
                       (0 for poly, which runs the CPU reference) */
  int host_starts;  /* in: 1 = INIT_AUTO starts on the host (fit_init.c,
                       single-threaded: the fallback), 0 = on the device
                       (gpu/fit_init_cuda.cuh, the default) */
  int variant;      /* in: fit kernel launch bounds, 0 none (up to 255
                       registers), 1 __launch_bounds__(128, 4) (<= 128),
                       2 __launch_bounds__(128, 3) (<= 168); out: the one
                       run */
  int block;        /* in: threads per block, 0 = 128, else 32, 64 or 96;
                       out: the one run */
  int starts;       /* out: 0 given p0, 1 host starts, 2 device starts */
  double guess_s;   /* out: time of the automatic starts (INIT_AUTO): host
                       seconds, or device seconds (events) of the device's */
  double h2d_s, kernel_s, d2h_s, total_s; /* out: seconds (events) */
} beam_fit_cuda_run_t;

/* A context: device 0, a stream and device buffers that only grow, so
 * repeated batches allocate nothing. BEAM_ENOTSUP (with the reason in d)
 * without CUDA or without a device. */
int beam_fit_cuda_create(beam_fit_cuda_t **c, beam_diag_t *d);
void beam_fit_cuda_destroy(beam_fit_cuda_t *c);

/* Fits the whole batch [0, n_fits) into r, like beam_fit_cpu_range.
 * y16: NULL, or uint16 counts used instead of b->y (same strides; b->y
 * may then be NULL): they travel and stay uint16 on the device. Strided
 * inputs are copied as their span when it is dense (both layouts of
 * fit.h), else packed frame-major on the host first. INIT_AUTO starts
 * are computed on the device (fit_init.c's guess per fit, same grids and
 * selection), or on the host with run->host_starts (fit_init.c itself).
 * run may be NULL. Returns 0, BEAM_EINVAL, or BEAM_ECUDA / BEAM_ENOMEM
 * with the failing call in d. One call at a time per context. */
int beam_fit_cuda(beam_fit_cuda_t *c, const beam_fit_batch_t *b, const uint16_t *y16,
                  const beam_fit_opts_t *o, beam_fit_result_t *r, beam_fit_cuda_run_t *run,
                  beam_diag_t *d);

#ifdef __cplusplus
}
#endif
#endif
