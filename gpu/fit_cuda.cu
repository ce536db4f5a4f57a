/* The batched fitter's CUDA backend (beam_fit_cuda, pipeline/fit.h).
 *
 * One fused kernel per batch, templated on the model, the input type
 * (float32 or uint16 counts) and the mapping:
 *   thread per fit (NL = 1)  for short traces: every point of a pass is a
 *            load whose addresses are consecutive across the warp when the
 *            data are frame-major [point][fit], as detectors deliver them
 *   warp per fit (NL = 32)   for long traces: lane l takes points l, l+32,
 *            ...; the sums are reduced by an xor butterfly, which leaves
 *            bitwise the same sums in every lane, so all 32 lanes run the
 *            same LM control in lock-step with no broadcast and no barrier
 * Either way the fit's whole LM loop runs in registers: model and analytic
 * Jacobian per point in fp32, χ² / Jᵀr / JᵀWJ summed in double (as the CPU
 * path does; H100/H200/A100 run fp64 at half the fp32 rate), the damped
 * Cholesky solve in double. Nothing per point or per iteration goes to
 * global memory and the host waits once per batch.
 *
 * The LM control below is fit_lm.c transcribed for a fixed P (so its
 * arrays stay in registers): same tests, same order, same constants.
 * Non-free parameters are kept in the system as identity rows with a zero
 * right-hand side instead of being compacted out: the Cholesky factor of
 * the others is the same bit for bit (their off-diagonal entries are exact
 * zeros) and every index stays a compile-time constant.
 *
 * Differences from beam_fit_cpu_range (docs/fit.md, "CUDA"):
 *   transcendentals are the SFU intrinsics (__expf, __logf, and __sincosf
 *   after a two-part reduction by 2π) instead of fit_vmath.h's
 *   polynomials; masked points (w = 0) are skipped rather than computed
 *   with weight 0 (as the reference does); the warp mapping sums in a
 *   tree. Automatic starts are made on the device by fit_init.c's method
 *   (gpu/fit_init_cuda.cuh: same grids and selection, equal to rounding),
 *   or with run->host_starts by fit_init.c itself on the host (the same
 *   numbers the CPU path starts from); poly runs the CPU reference (one
 *   exact solve in double, as beam_fit_cpu_range also does). */
#include "gpu/cuda_int.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "gpu/fit_kern.cuh"

/* ---- host side ---- */
/* inputs, results (B_PAR..B_ST, copied back), device-start scratch */
enum { B_Y, B_X, B_W, B_P0, B_PAR, B_ERR, B_COV, B_CHI, B_CHR, B_IT, B_NU, B_ST,
       B_PREP, B_TC, B_TS, B_PW, NBUF };
#define NEV 5 /* h2d | starts | kernel | d2h */

struct beam_fit_cuda_s {
  beam_cuda_ctx_t cx;
  void *d[NBUF];
  size_t cap[NBUF];
  cudaEvent_t ev[NEV];
  void *host;     /* packing and p0 staging, grows */
  size_t host_cap;
  void *ws;       /* CPU workspace: the starts' guess, poly */
  size_t ws_cap;
};

static int grow_host(void **p, size_t *cap, size_t bytes, beam_diag_t *d) {
  if (bytes <= *cap && *p)
    return 0;
  free(*p);
  *p = malloc(bytes ? bytes : 1);
  *cap = *p ? bytes : 0;
  return *p ? 0 : BEAM_DIAG(d, BEAM_ENOMEM, "fit cuda: %zu bytes of host memory", bytes);
}

extern "C" void beam_fit_cuda_destroy(beam_fit_cuda_t *c) {
  if (!c)
    return;
  if (c->cx.stream)
    cudaSetDevice(c->cx.dev);
  for (int k = 0; k < NEV; k++)
    if (c->ev[k])
      cudaEventDestroy(c->ev[k]);
  beam__cuda_ctx_fini(&c->cx);
  for (int k = 0; k < NBUF; k++)
    beam__dbuf_free(&c->d[k], &c->cap[k]);
  free(c->host);
  free(c->ws);
  free(c);
}

/* beam__cuda_ctx_init on device dev instead of 0. */
static int create_(beam_fit_cuda_t *c, int dev, beam_diag_t *d) {
  char why[256] = "";
  int n = beam_gpu_count(why, sizeof why);
  if (n <= 0)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "fit: backend cuda needs a CUDA device: %s", why);
  if (dev < 0 || dev >= n)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: device %d of %d", dev, n);
  c->cx.dev = dev;
  BEAM_CUDA_TRY(d, cudaSetDevice(dev));
  BEAM_CUDA_TRY(d, cudaStreamCreateWithFlags(&c->cx.stream, cudaStreamNonBlocking));
  for (int k = 0; k < NEV; k++)
    BEAM_CUDA_TRY(d, cudaEventCreate(&c->ev[k]));
  return 0;
}

extern "C" int beam_fit_cuda_create_dev(beam_fit_cuda_t **out, int dev, beam_diag_t *d) {
  *out = NULL;
  beam_fit_cuda_t *c = (beam_fit_cuda_t *)calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, "fit cuda: context");
  int rc = create_(c, dev, d);
  if (rc) {
    beam_fit_cuda_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

extern "C" int beam_fit_cuda_create(beam_fit_cuda_t **out, beam_diag_t *d) {
  return beam_fit_cuda_create_dev(out, 0, d);
}

/* Element offsets of the corners of an N x T strided array: [lo, hi]. */
static void span_of(size_t N, size_t T, ptrdiff_t fs, ptrdiff_t ps, ptrdiff_t *lo, ptrdiff_t *hi) {
  ptrdiff_t a = (ptrdiff_t)(N - 1) * fs, b = (ptrdiff_t)(T - 1) * ps;
  *lo = (a < 0 ? a : 0) + (b < 0 ? b : 0);
  *hi = (a > 0 ? a : 0) + (b > 0 ? b : 0);
}

/* Uploads an N x T strided host array of es-byte elements into buffer k:
 * its span when dense (at most twice the elements: both layouts of fit.h,
 * a shared x), else packed frame-major [point][fit] on the host. Sets the
 * device offset and strides the kernel indexes with. */
static int upload(beam_fit_cuda_t *c, int k, const void *h, size_t es, size_t N, size_t T,
                  ptrdiff_t fs, ptrdiff_t ps, ptrdiff_t *o0, ptrdiff_t *ofs, ptrdiff_t *ops,
                  beam_diag_t *d) {
  ptrdiff_t lo, hi;
  span_of(N, T, fs, ps, &lo, &hi);
  size_t span = (size_t)(hi - lo + 1), dense = fs == 0 ? T : N * T;
  if (span <= 2 * dense) {
    int rc = beam__dbuf_reserve(&c->d[k], &c->cap[k], span * es, d);
    if (rc)
      return rc;
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d[k], (const char *)h + lo * (ptrdiff_t)es, span * es,
                                     cudaMemcpyHostToDevice, c->cx.stream));
    *o0 = -lo, *ofs = fs, *ops = ps;
    return 0;
  }
  int rc = grow_host(&c->host, &c->host_cap, dense * es, d);
  if (rc == 0)
    rc = beam__dbuf_reserve(&c->d[k], &c->cap[k], dense * es, d);
  if (rc)
    return rc;
  size_t nf = fs == 0 ? 1 : N;
  for (size_t t = 0; t < T; t++)
    for (size_t i = 0; i < nf; i++)
      memcpy((char *)c->host + (t * nf + i) * es,
             (const char *)h + ((ptrdiff_t)i * fs + (ptrdiff_t)t * ps) * (ptrdiff_t)es, es);
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d[k], c->host, dense * es, cudaMemcpyHostToDevice,
                                   c->cx.stream));
  /* The staging buffer is reused below: this copy must be done first. */
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
  *o0 = 0, *ofs = fs == 0 ? 0 : 1, *ops = (ptrdiff_t)nf;
  return 0;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The automatic starts, as beam_fit_cpu_range computes them: blocks of
 * FIT_L lanes, dead lanes as it fills them, so both paths start from the
 * same numbers. b has float y (the caller converts counts). */
static int host_guess(beam_fit_cuda_t *c, const fit_ctx_t *cx, double *p0, beam_diag_t *d) {
  const beam_fit_batch_t *b = cx->b;
  size_t T = b->n_points, N = b->n_fits;
  int P = cx->P, L = FIT_L;
  size_t nd = T * (size_t)L, scr = beam__fit_guess_scratch(P, T, L);
  int rc = grow_host(&c->ws, &c->ws_cap, sizeof(double) * (3 * nd + scr + FIT_MAXP * L), d);
  if (rc)
    return rc;
  double *xd = (double *)c->ws, *yd = xd + nd, *wd = yd + nd, *pb = wd + nd, *sc = pb + FIT_MAXP * L;
  int shared = b->x_fit_stride == 0;
  for (size_t base = 0; base < N; base += (size_t)L) {
    int live = N - base < (size_t)L ? (int)(N - base) : L;
    for (int l = 0; l < L; l++) {
      int nu = 0;
      if (l < live)
        beam__fit_gather(cx, base + l, L, l, xd, yd, wd, &nu);
      else
        for (size_t k = 0; k < T; k++) {
          xd[k * L + l] = xd[k * L];
          yd[k * L + l] = wd[k * L + l] = 0;
        }
    }
    beam__fit_guess(cx, T, L, shared, xd, yd, wd, pb, sc);
    memcpy(p0 + base * P, pb, sizeof(double) * (size_t)(live * P));
  }
  return 0;
}

/* The family (translation unit gpu/fit_k_*.cu) of each model. */
static fit_family_fn family_of(int model) {
  switch (model) {
  case BEAM_FIT_DCOS:
  case BEAM_FIT_DCOS_T0:
    return beam__fit_family_dcos;
  case BEAM_FIT_DCOS2:
    return beam__fit_family_dcos2;
  case BEAM_FIT_EXP:
  case BEAM_FIT_STRETCH:
  case BEAM_FIT_STRETCH_XT:
  case BEAM_FIT_EXP2:
    return beam__fit_family_exp;
  case BEAM_FIT_GAUSS:
  case BEAM_FIT_LORENTZ:
    return beam__fit_family_peak;
  default:
    return NULL;
  }
}

/* A launcher's CUDA error as a diagnostic (as BEAM_CUDA_LAUNCHED). */
static int launched(int e, const char *what, beam_diag_t *d) {
  if (e == 0)
    return 0;
  if (e < 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: no %s for this model", what);
  cudaError_t ce = (cudaError_t)e;
  return beam_diag_set(d, BEAM_ECUDA, __FILE__, __LINE__, "launch of %s: %s (%s)", what,
                       cudaGetErrorName(ce), cudaGetErrorString(ce));
}

/* The device starts (gpu/fit_init_cuda.cuh): scratch reserved here (the
 * per-fit prep, the shared-x periodogram table for dcos*, the
 * periodogram scratch in chunks of fits), the kernels in the family. */
#define PW_BYTES ((size_t)256 << 20)
#define TAB_BYTES ((size_t)64 << 20)
static int dev_starts(beam_fit_cuda_t *c, int model, int u16, const fit_args_t &a, int shared,
                      beam_diag_t *d) {
  fit_family_fn fam = family_of(model);
  if (!fam)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: no device start for model %d", model);
  int dc = model == BEAM_FIT_DCOS || model == BEAM_FIT_DCOS_T0 || model == BEAM_FIT_DCOS2;
  size_t N = a.N, T = (size_t)a.T;
  start_plan_t sp;
  memset(&sp, 0, sizeof sp);
  sp.n16 = (N + GL - 1) / GL * GL;
  sp.shared = shared;
  sp.p0 = (double *)c->d[B_P0];
  int rc = beam__dbuf_reserve(&c->d[B_PREP], &c->cap[B_PREP], sizeof(double) * FP_N * sp.n16, d);
  if (rc)
    return rc;
  sp.prep = (double *)c->d[B_PREP];
  if (dc) {
    size_t nf = T > 2 ? T - 1 : 1;
    sp.nf = (int)(nf > 2048 ? 2048 : nf);
    size_t tab = sizeof(double) * (size_t)sp.nf * T;
    if (shared && tab <= TAB_BYTES) {
      if ((rc = beam__dbuf_reserve(&c->d[B_TC], &c->cap[B_TC], tab, d)) ||
          (rc = beam__dbuf_reserve(&c->d[B_TS], &c->cap[B_TS], tab, d)))
        return rc;
      sp.tc = (double *)c->d[B_TC], sp.ts = (double *)c->d[B_TS];
    }
    size_t per = sizeof(double) * (size_t)sp.nf;
    sp.chunk = PW_BYTES / per;
    sp.chunk = sp.chunk < 1 ? 1 : sp.chunk > N ? N : sp.chunk;
    if ((rc = beam__dbuf_reserve(&c->d[B_PW], &c->cap[B_PW], per * sp.chunk, d)))
      return rc;
    sp.pw = (double *)c->d[B_PW];
  }
  return launched(fam(1, model, u16, 0, 0, 0, 0, c->cx.stream, a, &sp), "fit start kernels", d);
}

/* One launch of the batch's fit kernel. */
static int launch(int model, int u16, int warp, int variant, unsigned grid, unsigned block,
                  cudaStream_t st, const fit_args_t &a, beam_diag_t *d) {
  fit_family_fn fam = family_of(model);
  if (!fam)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: no kernel for model %d", model);
  return launched(fam(0, model, u16, warp, variant, grid, block, st, a, NULL), "fit_kernel", d);
}
/* Copies one result array back into the caller's (NULL: not wanted). */
#define BACK(k, dst, bytes)                                                                \
  do {                                                                                     \
    if (dst)                                                                               \
      BEAM_CUDA_TRY(d, cudaMemcpyAsync((dst), c->d[k], (bytes), cudaMemcpyDeviceToHost,    \
                                       c->cx.stream));                                     \
  } while (0)

/* p0_out: only the starts (beam_fit_cuda_starts), r unused. */
static int fit_(beam_fit_cuda_t *c, const beam_fit_batch_t *b, const uint16_t *y16,
                const beam_fit_opts_t *o, beam_fit_result_t *r, beam_fit_cuda_run_t *run,
                double *p0_out, beam_diag_t *d) {
  double t0 = now_s();
  beam_fit_batch_t bb = *b;
  if (y16)
    bb.y = (const float *)y16; /* only checked for non-NULL below */
  fit_ctx_t cx;
  int rc = beam__fit_ctx(&cx, &bb, o, d);
  if (rc < 0)
    return rc;
  /* Host starts take the direct periodogram, the algorithm the device
   * runs, so the two agree to rounding; the CPU backend's FFT form picks
   * the same bin but not always the same last bits (fit_init.c). */
  cx.guess_direct = 1;
  if (!p0_out && (!r || !r->params || !r->status))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: params and status results are required");
  if (p0_out && (o->init != BEAM_FIT_INIT_AUTO || b->model == BEAM_FIT_POLY))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: starts are for INIT_AUTO and a nonlinear model");
  size_t N = b->n_fits, T = b->n_points;
  int P = cx.P, warp = run && run->mapping ? run->mapping == 2 : T > 256;
  int host_starts = run && run->host_starts, variant = run ? run->variant : 0;
  unsigned block = run && run->block ? (unsigned)run->block : FT;
  int auto_ = o->init == BEAM_FIT_INIT_AUTO, dev_auto = auto_ && !host_starts;
  if (run)
    memset(run, 0, sizeof *run);
  if (N == 0)
    return 0;
  if (T > (size_t)INT32_MAX / 2)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: n_points %zu too large", T);
  /* Counts as float for the host-side work (starts, poly): exact. */
  float *yf = NULL;
  if (y16 && (b->model == BEAM_FIT_POLY || (auto_ && host_starts))) {
    ptrdiff_t lo, hi;
    span_of(N, T, b->y_fit_stride, b->y_point_stride, &lo, &hi);
    yf = (float *)malloc(sizeof(float) * (size_t)(hi - lo + 1));
    if (!yf)
      return BEAM_DIAG(d, BEAM_ENOMEM, "fit cuda: float copy of the counts");
    for (ptrdiff_t q = lo; q <= hi; q++)
      yf[q - lo] = (float)y16[q];
    bb.y = yf - lo;
  }
  if (b->model == BEAM_FIT_POLY) {
    /* Linear: one exact solve in double on the host, as the CPU path. */
    size_t ws = beam_fit_workspace_size(&bb, o);
    rc = grow_host(&c->ws, &c->ws_cap, ws, d);
    if (rc == 0)
      rc = beam_fit_ref_range(&bb, o, 0, N, c->ws, ws, r, d);
    free(yf);
    if (run)
      run->total_s = now_s() - t0;
    return rc;
  }
  BEAM_CUDA_TRY(d, cudaSetDevice(c->cx.dev));
  fit_args_t a;
  memset(&a, 0, sizeof a);
  /* p0: the caller's, the CPU's automatic guess staged on the host
   * (host_starts), or made on the device after the uploads. */
  double tg = now_s();
  const double *p0 = b->p0;
  if (auto_ && host_starts) {
    fit_ctx_t gx = cx;
    gx.b = &bb;
    rc = grow_host(&c->host, &c->host_cap, sizeof(double) * N * (size_t)P, d);
    if (rc == 0)
      rc = host_guess(c, &gx, (double *)c->host, d);
    if (rc) {
      free(yf);
      return rc;
    }
    p0 = (const double *)c->host;
  }
  free(yf);
  if (run && !dev_auto)
    run->guess_s = now_s() - tg;
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[0], c->cx.stream));
  rc = beam__dbuf_reserve(&c->d[B_P0], &c->cap[B_P0], sizeof(double) * N * (size_t)P, d);
  if (rc)
    return rc;
  if (!dev_auto)
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(c->d[B_P0], p0, sizeof(double) * N * (size_t)P,
                                     cudaMemcpyHostToDevice, c->cx.stream));
  /* The staging buffer (the guessed p0) is reused by the uploads. */
  if (p0 == c->host)
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
  rc = upload(c, B_Y, y16 ? (const void *)y16 : (const void *)b->y, y16 ? 2 : 4, N, T,
              b->y_fit_stride, b->y_point_stride, &a.y0, &a.yfs, &a.yps, d);
  if (rc == 0)
    rc = upload(c, B_X, b->x, 4, N, T, b->x_fit_stride, b->x_point_stride, &a.x0, &a.xfs, &a.xps,
                d);
  if (rc == 0 && b->w)
    rc = upload(c, B_W, b->w, 4, N, T, b->w_fit_stride, b->w_point_stride, &a.w0, &a.wfs, &a.wps,
                d);
  if (rc)
    return rc;
  if (p0_out) {
    for (int j = 0; j < P; j++)
      a.lo[j] = cx.lo[j], a.hi[j] = cx.hi[j];
    a.y = c->d[B_Y];
    a.x = (const float *)c->d[B_X];
    a.w = b->w ? (const float *)c->d[B_W] : NULL;
    a.N = N, a.T = (int)T, a.est = o->estimator;
    if (dev_auto && (rc = dev_starts(c, b->model, y16 != NULL, a, b->x_fit_stride == 0, d)))
      return rc;
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(p0_out, c->d[B_P0], sizeof(double) * N * (size_t)P,
                                     cudaMemcpyDeviceToHost, c->cx.stream));
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(c->cx.stream));
    return 0;
  }
  size_t want[NBUF] = {0};
  want[B_PAR] = want[B_ERR] = sizeof(double) * N * (size_t)P;
  want[B_COV] = want[B_PAR] * (size_t)P;
  want[B_CHI] = want[B_CHR] = sizeof(double) * N;
  want[B_IT] = want[B_NU] = sizeof(int32_t) * N;
  want[B_ST] = N;
  const void *dst[NBUF] = {0};
  dst[B_PAR] = r->params, dst[B_ERR] = r->errors, dst[B_COV] = r->cov, dst[B_CHI] = r->chi2;
  dst[B_CHR] = r->chi2_red, dst[B_IT] = r->iters, dst[B_NU] = r->n_used, dst[B_ST] = r->status;
  for (int k = B_PAR; k <= B_ST; k++)
    if (dst[k] && (rc = beam__dbuf_reserve(&c->d[k], &c->cap[k], want[k], d)))
      return rc;
  a.y = c->d[B_Y];
  a.x = (const float *)c->d[B_X];
  a.w = b->w ? (const float *)c->d[B_W] : NULL;
  a.p0 = (const double *)c->d[B_P0];
  for (int j = 0; j < P; j++)
    a.lo[j] = cx.lo[j], a.hi[j] = cx.hi[j];
  a.N = N;
  a.T = (int)T;
  a.est = o->estimator;
  a.max_iter = o->max_iter;
  a.abs_sigma = o->absolute_sigma;
  a.ftol = o->ftol, a.xtol = o->xtol, a.gtol = o->gtol, a.lambda0 = o->lambda0;
  a.params = (double *)c->d[B_PAR];
  a.errors = r->errors ? (double *)c->d[B_ERR] : NULL;
  a.cov = r->cov ? (double *)c->d[B_COV] : NULL;
  a.chi2 = r->chi2 ? (double *)c->d[B_CHI] : NULL;
  a.chi2_red = r->chi2_red ? (double *)c->d[B_CHR] : NULL;
  a.iters = r->iters ? (int32_t *)c->d[B_IT] : NULL;
  a.n_used = r->n_used ? (int32_t *)c->d[B_NU] : NULL;
  a.status = (uint8_t *)c->d[B_ST];
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[1], c->cx.stream));
  size_t threads = N * (warp ? 32 : 1), grid = (threads + block - 1) / block;
  if (grid > 0x7fffffffu)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: %zu fits exceed one launch", N);
  if (dev_auto && (rc = dev_starts(c, b->model, y16 != NULL, a, b->x_fit_stride == 0, d)))
    return rc;
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[2], c->cx.stream));
  if ((rc = launch(b->model, y16 != NULL, warp, variant, (unsigned)grid, block, c->cx.stream, a,
                   d)))
    return rc;
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[3], c->cx.stream));
  BACK(B_PAR, r->params, want[B_PAR]);
  BACK(B_ERR, r->errors, want[B_ERR]);
  BACK(B_COV, r->cov, want[B_COV]);
  BACK(B_CHI, r->chi2, want[B_CHI]);
  BACK(B_CHR, r->chi2_red, want[B_CHR]);
  BACK(B_IT, r->iters, want[B_IT]);
  BACK(B_NU, r->n_used, want[B_NU]);
  BACK(B_ST, r->status, want[B_ST]);
  BEAM_CUDA_TRY(d, cudaEventRecord(c->ev[4], c->cx.stream));
  BEAM_CUDA_TRY(d, cudaEventSynchronize(c->ev[4]));
  if (run) {
    float ms[NEV - 1];
    for (int k = 0; k < NEV - 1; k++)
      BEAM_CUDA_TRY(d, cudaEventElapsedTime(&ms[k], c->ev[k], c->ev[k + 1]));
    run->mapping = warp ? 2 : 1;
    run->variant = variant;
    run->block = (int)block;
    run->starts = !auto_ ? 0 : host_starts ? 1 : 2;
    run->h2d_s = 1e-3 * ms[0], run->kernel_s = 1e-3 * ms[2], run->d2h_s = 1e-3 * ms[3];
    if (dev_auto)
      run->guess_s = 1e-3 * ms[1];
    run->total_s = now_s() - t0;
  }
  return 0;
}

extern "C" int beam_fit_cuda(beam_fit_cuda_t *c, const beam_fit_batch_t *b, const uint16_t *y16,
                             const beam_fit_opts_t *o, beam_fit_result_t *r,
                             beam_fit_cuda_run_t *run, beam_diag_t *d) {
  if (!c || !b)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: NULL context or batch");
  int mapping = run ? run->mapping : 0;
  if (mapping < 0 || mapping > 2)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: mapping %d is not 0, 1 or 2", mapping);
  if (run && (run->variant < 0 || run->variant >= NVAR))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: variant %d is not 0..%d", run->variant, NVAR - 1);
  if (run && run->block && (run->block < 32 || run->block > FT || run->block % 32))
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: block %d is not 32, 64, 96 or %d", run->block,
                     FT);
  int rc = fit_(c, b, y16, o, r, run, NULL, d);
  if (rc && c->cx.stream)
    cudaStreamSynchronize(c->cx.stream); /* nothing of this call stays queued */
  return rc;
}

extern "C" int beam_fit_cuda_starts(beam_fit_cuda_t *c, const beam_fit_batch_t *b,
                                    const uint16_t *y16, const beam_fit_opts_t *o, int host,
                                    double *p0, beam_diag_t *d) {
  if (!c || !b || !o || !p0)
    return BEAM_DIAG(d, BEAM_EINVAL, "fit cuda: NULL context, batch, options or p0");
  beam_fit_cuda_run_t run;
  memset(&run, 0, sizeof run);
  run.host_starts = host;
  int rc = fit_(c, b, y16, o, NULL, &run, p0, d);
  if (rc && c->cx.stream)
    cudaStreamSynchronize(c->cx.stream);
  return rc;
}
