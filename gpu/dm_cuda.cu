/* The DM engine's CUDA backend (pipeline/ptycho/dm.h states the algorithm,
 * dm_int.h the backend contract; dm_cpu.c is the reference it must match).
 * Kernels are in gpu/dm_kernels.cuh.
 *
 * Everything is resident on the device for max_views, allocated at create
 * after a check against cudaMemGetInfo: amplitudes (float), exit waves,
 * probe, object, their previous values (for the change metrics), the
 * object and probe numerator/denominator accumulators, one FFT batch
 * buffer and the cuFFT work area. One iteration:
 *
 *   for each batch of B views (B bounded so the batch buffer is <= 256 MiB):
 *     form      buf = 2 P O - psi                        (one kernel)
 *     FFT       forward, unnormalised, B * M_P * M_O transforms (one plan)
 *     [err      per-view sum of (af - A)^2: only with the power bound on,
 *               which needs each view's total before the constraint]
 *     modulus   multi-mode constraint, scaling 1/n^2 folded in (and the
 *               error sum when the power bound is off)
 *     IFFT      inverse, unnormalised
 *     update    psi from buf, phi (recomputed from P, O) and psi
 *   inner_passes x: object accumulate (atomics) -> [reducer] -> max of the
 *     denominator -> divide; probe likewise from probe_update_start on.
 *   metrics: per-view error sums, change norms reduced on the device, one
 *     copy of 7 doubles to the host.
 *
 * The last batch of an iteration uses a second plan for the remainder,
 * rebuilt only when the view count changes; both plans share one work area
 * (cufftSetAutoAllocation off) so memory stays bounded. Everything runs on
 * one non-blocking stream; host copies are cudaMemcpyAsync on that stream
 * followed by a synchronise (a plain cudaMemcpy would run on the legacy
 * stream, which does not order with a non-blocking one).
 *
 * Each public call selects conf.device first: the engine may be driven
 * from different threads (one at a time). */
#include "gpu/cuda_int.h"

#include <new>

extern "C" {
#include "pipeline/ptycho/dm_int.h"
}

#include "gpu/dm_kernels.cuh"

#define WORK_CAP ((size_t)256 << 20) /* bytes of one FFT batch buffer */
#define RED_BLOCKS 256               /* blocks of the first reduction stage */
#define STAGE_BYTES ((size_t)4 << 20) /* pinned staging for set/get in f32 */
/* Fraction of a target thread count per probe pixel: see probe_chunk. */
#define PROBE_THREADS_TARGET ((size_t)1 << 21)

enum { MET_ERR = 0, MET_DO, MET_O, MET_DP, MET_P, MET_OMAX, MET_PMAX, MET_COUNT };

static const char *prec_name(beam_dm_prec_t p) { return p == BEAM_DM_F64 ? "f64" : "f32"; }

static size_t cplx_size(const beam_dm_conf_t *c) { return c->prec == BEAM_DM_F64 ? 16 : 8; }

/* Views per FFT batch: the batch buffer stays under WORK_CAP, the cuFFT
 * batch count fits an int. */
static size_t batch_views(const beam_dm_conf_t *c) {
  size_t per_view = (size_t)c->probe_modes * c->object_modes * c->n * c->n * cplx_size(c);
  size_t b = WORK_CAP / per_view;
  size_t mmax = (size_t)0x7fffffff / ((size_t)c->probe_modes * c->object_modes);
  if (b > mmax)
    b = mmax;
  if (b < 1)
    b = 1;
  if (b > c->max_views)
    b = c->max_views;
  return b;
}

/* Device bytes without the cuFFT work area. */
static size_t core_bytes(const beam_dm_conf_t *c) {
  size_t cs = cplx_size(c), rs = cs / 2;
  size_t npx = (size_t)c->n * c->n, opx = (size_t)c->obj_h * c->obj_w;
  size_t m = (size_t)c->probe_modes * c->object_modes;
  size_t per_view = npx * sizeof(float) + m * npx * cs + 2 * sizeof(int32_t) + sizeof(double2) + sizeof(double);
  size_t probe = 2 * c->probe_modes * npx * cs + (2 * c->probe_modes + 1) * npx * rs;
  size_t object = 2 * c->object_modes * opx * cs + (2 * c->object_modes + 1) * opx * rs;
  size_t work = batch_views(c) * m * npx * cs;
  return (size_t)c->max_views * per_view + probe + object + work + (2 * RED_BLOCKS + MET_COUNT) * sizeof(double);
}

/* The cuFFT work area is not known without a device; assume one more batch
 * buffer (cuFFT needs at most about that for these sizes). */
static size_t dm_cuda_bytes(const beam_dm_conf_t *c) {
  return core_bytes(c) + batch_views(c) * c->probe_modes * c->object_modes * c->n * c->n * cplx_size(c);
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

static inline unsigned grid_x(size_t n) { return beam__grid_for(n, DM_THREADS); }
static inline unsigned grid_y(size_t n) { return (unsigned)(n == 0 ? 1 : n > 65535 ? 65535 : n); }

static cufftResult fft_exec(cufftHandle h, float2 *b, int dir) { return cufftExecC2C(h, b, b, dir); }
static cufftResult fft_exec(cufftHandle h, double2 *b, int dir) { return cufftExecZ2Z(h, b, b, dir); }

struct dm_impl {
  virtual ~dm_impl() {}
  virtual int create(beam_diag_t *d) = 0;
  virtual int set_probe(const double *v, beam_diag_t *d) = 0;
  virtual int set_object(const double *v, beam_diag_t *d) = 0;
  virtual int get_probe(double *v, beam_diag_t *d) = 0;
  virtual int get_object(double *v, beam_diag_t *d) = 0;
  virtual int add_views(uint32_t first, uint32_t count, const float *amp, const int32_t *pos, beam_diag_t *d) = 0;
  virtual int iterate(int update_probe, beam_dm_metrics_t *m, beam_diag_t *d) = 0;
};

template <typename T> struct dm_eng : dm_impl {
  typedef typename dm_cplx<T>::type C;

  beam_dm_t *e;
  beam_dm_conf_t c;
  dm_geo_t g;
  int dev = -1;
  cudaStream_t st = NULL;
  size_t B = 0;                  /* views per full batch */
  cufftHandle plan_full = 0, plan_rem = 0;
  int have_full = 0, have_rem = 0;
  size_t rem_views = 0;          /* batch size plan_rem was made for */
  void *fft_work = NULL;
  size_t fft_work_bytes = 0;

  float *d_amp = NULL;
  int32_t *d_pos = NULL;
  double2 *d_vstat = NULL;
  double *d_errsum = NULL;
  C *d_psi = NULL, *d_buf = NULL;
  C *d_P = NULL, *d_Pprev = NULL, *d_O = NULL, *d_Oprev = NULL;
  T *d_oacc = NULL, *d_pacc = NULL; /* numerator (complex) then denominator, contiguous */
  double *d_part = NULL, *d_met = NULL;

  /* Host side: per-view sums (the power bound and the error denominator
   * come from them), staging for f32 conversion, reducer buffer. */
  double *h_sumA2 = NULL;
  double *h_sumA = NULL;
  double *h_met = NULL;           /* pinned, MET_COUNT */
  void *h_stage = NULL;           /* pinned, STAGE_BYTES */
  T *h_red = NULL;                /* pinned, made at the first reduced iteration */
  size_t h_red_count = 0;

  explicit dm_eng(beam_dm_t *eng) : e(eng), c(eng->conf) {
    g.n = (int)c.n;
    g.obj_w = (int)c.obj_w;
    g.npx = (size_t)c.n * c.n;
    g.opx = (size_t)c.obj_h * c.obj_w;
    g.mp = (int)c.probe_modes;
    g.mo = (int)c.object_modes;
    g.m = g.mp * g.mo;
  }

  ~dm_eng() {
    if (dev >= 0)
      cudaSetDevice(dev);
    if (st)
      cudaStreamSynchronize(st);
    if (have_full)
      cufftDestroy(plan_full);
    if (have_rem)
      cufftDestroy(plan_rem);
    void *dp[] = {fft_work, d_amp, d_pos, d_vstat, d_errsum, d_psi, d_buf, d_P, d_Pprev,
                  d_O,      d_Oprev, d_oacc, d_pacc, d_part, d_met};
    for (size_t i = 0; i < sizeof dp / sizeof dp[0]; i++)
      if (dp[i])
        cudaFree(dp[i]);
    void *hp[] = {h_met, h_stage, h_red};
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
      if (hp[i])
        cudaFreeHost(hp[i]);
    free(h_sumA2);
    free(h_sumA);
    if (st)
      cudaStreamDestroy(st);
  }

  int make_plan(cufftHandle *h, int *have, size_t views, size_t *ws, beam_diag_t *d) {
    int dims[2] = {(int)c.n, (int)c.n};
    BEAM_CUFFT_TRY(d, cufftCreate(h));
    *have = 1;
    BEAM_CUFFT_TRY(d, cufftSetAutoAllocation(*h, 0));
    cufftType type = sizeof(T) == 8 ? CUFFT_Z2Z : CUFFT_C2C;
    BEAM_CUFFT_TRY(d, cufftMakePlanMany(*h, 2, dims, NULL, 1, 0, NULL, 1, 0, type, (int)(views * g.m), ws));
    BEAM_CUFFT_TRY(d, cufftSetStream(*h, st));
    return 0;
  }

#define DALLOC(ptr, count) BEAM_CUDA_TRY(d, cudaMalloc((void **)&(ptr), (size_t)(count) * sizeof *(ptr)))

  int create(beam_diag_t *d) override {
    char why[256] = "";
    int ndev = beam_gpu_count(why, sizeof why);
    if (ndev == 0)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "ptycho: backend cuda needs a CUDA device: %s", why);
    if (c.device >= ndev)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "ptycho: conf.device = %d but only %d CUDA device%s visible", c.device,
                       ndev, ndev == 1 ? " is" : "s are");
    dev = c.device;
    BEAM_CUDA_TRY(d, cudaSetDevice(dev));
    BEAM_CUDA_TRY(d, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    B = batch_views(&c);
    size_t ws = 0;
    int rc = make_plan(&plan_full, &have_full, B, &ws, d);
    if (rc < 0)
      return rc;
    size_t need = core_bytes(&c) + ws, free_b = 0, total_b = 0;
    BEAM_CUDA_TRY(d, cudaMemGetInfo(&free_b, &total_b));
    if (need > free_b)
      return BEAM_DIAG(d, BEAM_ELIMIT,
                       "ptycho: cuda: %u views of %u x %u (%u x %u probe x object modes, %s) and a %u x %u object "
                       "need %.1f MiB of device memory; %.1f MiB of %.1f MiB are free on device %d",
                       c.max_views, c.n, c.n, c.probe_modes, c.object_modes, prec_name(c.prec), c.obj_h, c.obj_w,
                       mib(need), mib(free_b), mib(total_b), dev);
    fft_work_bytes = ws;
    BEAM_CUDA_TRY(d, cudaMalloc(&fft_work, ws ? ws : 1));
    BEAM_CUFFT_TRY(d, cufftSetWorkArea(plan_full, fft_work));

    size_t nv = c.max_views;
    DALLOC(d_amp, nv * g.npx);
    DALLOC(d_pos, 2 * nv);
    DALLOC(d_vstat, nv);
    DALLOC(d_errsum, nv);
    DALLOC(d_psi, nv * g.m * g.npx);
    DALLOC(d_buf, B * g.m * g.npx);
    DALLOC(d_P, (size_t)g.mp * g.npx);
    DALLOC(d_Pprev, (size_t)g.mp * g.npx);
    DALLOC(d_O, (size_t)g.mo * g.opx);
    DALLOC(d_Oprev, (size_t)g.mo * g.opx);
    DALLOC(d_oacc, (2 * (size_t)g.mo + 1) * g.opx);
    DALLOC(d_pacc, (2 * (size_t)g.mp + 1) * g.npx);
    DALLOC(d_part, 2 * RED_BLOCKS);
    DALLOC(d_met, MET_COUNT);
    BEAM_CUDA_TRY(d, cudaHostAlloc((void **)&h_met, MET_COUNT * sizeof(double), cudaHostAllocDefault));
    BEAM_CUDA_TRY(d, cudaHostAlloc(&h_stage, STAGE_BYTES, cudaHostAllocDefault));
    h_sumA2 = (double *)calloc(nv, sizeof(double));
    h_sumA = (double *)calloc(nv, sizeof(double));
    if (!h_sumA2 || !h_sumA)
      return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: cuda: out of host memory for %u view sums", c.max_views);

    /* dm.h: the probe starts at 0, the object at 1. */
    BEAM_CUDA_TRY(d, cudaMemsetAsync(d_P, 0, (size_t)g.mp * g.npx * sizeof(C), st));
    dm_fill_kernel<T><<<grid_x((size_t)g.mo * g.opx), DM_THREADS, 0, st>>>(d_O, (size_t)g.mo * g.opx, (T)1, (T)0);
    BEAM_CUDA_LAUNCHED(d, "dm_fill_kernel");
    BEAM_CUDA_TRY(d, cudaMemsetAsync(d_met, 0, MET_COUNT * sizeof(double), st));
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
    return 0;
  }

  /* Host interleaved doubles -> device C (count complex values). f64 is the
   * same layout and goes straight; f32 is converted through the pinned
   * stage in pieces. */
  int upload(C *dst, const double *src, size_t count, beam_diag_t *d) {
    BEAM_CUDA_TRY(d, cudaSetDevice(dev));
    if (sizeof(T) == sizeof(double)) {
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(dst, src, count * sizeof(C), cudaMemcpyHostToDevice, st));
      BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
      return 0;
    }
    size_t per = STAGE_BYTES / sizeof(C);
    C *h = (C *)h_stage;
    for (size_t i0 = 0; i0 < count; i0 += per) {
      size_t k = count - i0 < per ? count - i0 : per;
      for (size_t i = 0; i < k; i++) {
        h[i].x = (T)src[2 * (i0 + i)];
        h[i].y = (T)src[2 * (i0 + i) + 1];
      }
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(dst + i0, h, k * sizeof(C), cudaMemcpyHostToDevice, st));
      BEAM_CUDA_TRY(d, cudaStreamSynchronize(st)); /* h is reused by the next piece */
    }
    return 0;
  }

  int download(double *dst, const C *src, size_t count, beam_diag_t *d) {
    BEAM_CUDA_TRY(d, cudaSetDevice(dev));
    if (sizeof(T) == sizeof(double)) {
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(dst, src, count * sizeof(C), cudaMemcpyDeviceToHost, st));
      BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
      return 0;
    }
    size_t per = STAGE_BYTES / sizeof(C);
    C *h = (C *)h_stage;
    for (size_t i0 = 0; i0 < count; i0 += per) {
      size_t k = count - i0 < per ? count - i0 : per;
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(h, src + i0, k * sizeof(C), cudaMemcpyDeviceToHost, st));
      BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
      for (size_t i = 0; i < k; i++) {
        dst[2 * (i0 + i)] = (double)h[i].x;
        dst[2 * (i0 + i) + 1] = (double)h[i].y;
      }
    }
    return 0;
  }

  int set_probe(const double *v, beam_diag_t *d) override { return upload(d_P, v, (size_t)g.mp * g.npx, d); }
  int set_object(const double *v, beam_diag_t *d) override { return upload(d_O, v, (size_t)g.mo * g.opx, d); }
  int get_probe(double *v, beam_diag_t *d) override { return download(v, d_P, (size_t)g.mp * g.npx, d); }
  int get_object(double *v, beam_diag_t *d) override { return download(v, d_O, (size_t)g.mo * g.opx, d); }

  int add_views(uint32_t first, uint32_t count, const float *amp, const int32_t *pos, beam_diag_t *d) override {
    BEAM_CUDA_TRY(d, cudaSetDevice(dev));
    /* Per-view sums over valid pixels, on the host where the data already
     * are: valid count and sum A (device, for the view kind), sum A^2
     * (host, for the power bound and the error denominator). */
    double2 *vs = (double2 *)malloc((size_t)count * sizeof(double2));
    if (!vs)
      return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: cuda: add_views: out of host memory");
    for (uint32_t v = 0; v < count; v++) {
      const float *a = amp + (size_t)v * g.npx;
      double nvalid = 0, s = 0, s2 = 0;
      for (size_t p = 0; p < g.npx; p++)
        if (a[p] >= 0) {
          nvalid += 1;
          s += a[p];
          s2 += (double)a[p] * a[p];
        }
      vs[v].x = nvalid;
      vs[v].y = s;
      h_sumA[first + v] = s;
      h_sumA2[first + v] = s2;
    }
    cudaError_t ce = cudaMemcpyAsync(d_vstat + first, vs, (size_t)count * sizeof(double2), cudaMemcpyHostToDevice, st);
    if (ce == cudaSuccess)
      ce = cudaStreamSynchronize(st);
    free(vs);
    if (ce != cudaSuccess)
      return BEAM_DIAG(d, BEAM_ECUDA, "ptycho: cuda: add_views: copy of the view sums: %s (%s)", cudaGetErrorName(ce),
                       cudaGetErrorString(ce));
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(d_amp + (size_t)first * g.npx, amp, (size_t)count * g.npx * sizeof(float),
                                     cudaMemcpyHostToDevice, st));
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(d_pos + 2 * (size_t)first, pos, 2 * (size_t)count * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, st));
    dim3 grid(grid_x(g.npx), grid_y(count));
    dm_init_psi_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_P, d_O, d_pos, d_psi, first, count);
    BEAM_CUDA_LAUNCHED(d, "dm_init_psi_kernel");
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
    return 0;
  }

  /* The plan for a last batch of `views` views (shares the work area). */
  int rem_plan(size_t views, beam_diag_t *d) {
    if (have_rem && rem_views == views)
      return 0;
    if (have_rem) {
      BEAM_CUFFT_TRY(d, cufftDestroy(plan_rem));
      have_rem = 0;
    }
    size_t ws = 0;
    int rc = make_plan(&plan_rem, &have_rem, views, &ws, d);
    if (rc < 0)
      return rc;
    if (ws > fft_work_bytes) {
      /* Not expected (fewer transforms than the full plan); grow if so. */
      BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
      BEAM_CUDA_TRY(d, cudaFree(fft_work));
      fft_work = NULL;
      fft_work_bytes = 0;
      BEAM_CUDA_TRY(d, cudaMalloc(&fft_work, ws));
      fft_work_bytes = ws;
      BEAM_CUFFT_TRY(d, cufftSetWorkArea(plan_full, fft_work));
    }
    BEAM_CUFFT_TRY(d, cufftSetWorkArea(plan_rem, fft_work));
    rem_views = views;
    return 0;
  }

  /* out[0] = max of x[0..count), on the device. */
  int dev_max(const T *x, size_t count, double *out, beam_diag_t *d) {
    unsigned nb = grid_x(count) < RED_BLOCKS ? grid_x(count) : RED_BLOCKS;
    dm_max_partial_kernel<T><<<nb, DM_THREADS, 0, st>>>(x, count, d_part);
    BEAM_CUDA_LAUNCHED(d, "dm_max_partial_kernel");
    dm_finish_kernel<<<1, DM_THREADS, 0, st>>>(d_part, (int)nb, 1, 1, out);
    BEAM_CUDA_LAUNCHED(d, "dm_finish_kernel (max)");
    return 0;
  }

  /* out[0] = sum |a - prev|^2, out[1] = sum |a|^2. */
  int dev_change(const C *a, const C *prev, size_t count, double *out, beam_diag_t *d) {
    unsigned nb = grid_x(count) < RED_BLOCKS ? grid_x(count) : RED_BLOCKS;
    dm_change_partial_kernel<T><<<nb, DM_THREADS, 0, st>>>(a, prev, count, d_part);
    BEAM_CUDA_LAUNCHED(d, "dm_change_partial_kernel");
    dm_finish_kernel<<<1, DM_THREADS, 0, st>>>(d_part, (int)nb, 2, 0, out);
    BEAM_CUDA_LAUNCHED(d, "dm_finish_kernel (change)");
    return 0;
  }

  /* The engine's reducer on one accumulator (device -> pinned host ->
   * reducer -> device). */
  int reduce_acc(T *dacc, size_t count, const char *what, beam_diag_t *d) {
    if (count > h_red_count) {
      if (h_red)
        BEAM_CUDA_TRY(d, cudaFreeHost(h_red));
      h_red = NULL;
      h_red_count = 0;
      size_t want = (2 * (size_t)g.mo + 1) * g.opx;
      size_t pw = (2 * (size_t)g.mp + 1) * g.npx;
      if (pw > want)
        want = pw;
      BEAM_CUDA_TRY(d, cudaHostAlloc((void **)&h_red, want * sizeof(T), cudaHostAllocDefault));
      h_red_count = want;
    }
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(h_red, dacc, count * sizeof(T), cudaMemcpyDeviceToHost, st));
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));
    int rc = e->reduce(e->reduce_ctx, h_red, count, sizeof(T) == sizeof(double));
    if (rc < 0)
      return BEAM_DIAG(d, rc, "ptycho: cuda: the reducer failed (%d) on the %s accumulators", rc, what);
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(dacc, h_red, count * sizeof(T), cudaMemcpyHostToDevice, st));
    return 0;
  }

  int object_pass(size_t nv, beam_diag_t *d) {
    size_t n_acc = (2 * (size_t)g.mo + 1) * g.opx;
    T *onum = d_oacc, *oden = d_oacc + 2 * (size_t)g.mo * g.opx;
    BEAM_CUDA_TRY(d, cudaMemsetAsync(d_oacc, 0, n_acc * sizeof(T), st));
    dim3 grid(grid_x(g.npx), grid_y(nv));
    dm_obj_acc_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_P, d_pos, d_psi, onum, oden, nv);
    BEAM_CUDA_LAUNCHED(d, "dm_obj_acc_kernel");
    int rc;
    if (e->reduce && (rc = reduce_acc(d_oacc, n_acc, "object", d)) < 0)
      return rc;
    if ((rc = dev_max(oden, g.opx, d_met + MET_OMAX, d)) < 0)
      return rc;
    dm_divide_kernel<T><<<grid_x((size_t)g.mo * g.opx), DM_THREADS, 0, st>>>(
        d_O, onum, oden, d_met + MET_OMAX, c.obj_reg, g.opx, (size_t)g.mo * g.opx, g.n, 0.0);
    BEAM_CUDA_LAUNCHED(d, "dm_divide_kernel (object)");
    return 0;
  }

  /* View chunk of the probe reduction: enough (j, p, chunk) threads to fill
   * the device, at least one view per chunk. */
  size_t probe_chunk(size_t nv) const {
    size_t per = (size_t)g.mp * g.npx;
    size_t chunks = (PROBE_THREADS_TARGET + per - 1) / per;
    if (chunks > nv)
      chunks = nv;
    if (chunks > 65535)
      chunks = 65535;
    if (chunks < 1)
      chunks = 1;
    return (nv + chunks - 1) / chunks;
  }

  int probe_pass(size_t nv, beam_diag_t *d) {
    size_t n_acc = (2 * (size_t)g.mp + 1) * g.npx;
    T *pnum = d_pacc, *pden = d_pacc + 2 * (size_t)g.mp * g.npx;
    BEAM_CUDA_TRY(d, cudaMemsetAsync(d_pacc, 0, n_acc * sizeof(T), st));
    size_t chunk = probe_chunk(nv);
    dim3 grid(grid_x((size_t)g.mp * g.npx), (unsigned)((nv + chunk - 1) / chunk));
    dm_probe_acc_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_O, d_pos, d_psi, pnum, pden, nv, chunk);
    BEAM_CUDA_LAUNCHED(d, "dm_probe_acc_kernel");
    int rc;
    if (e->reduce && (rc = reduce_acc(d_pacc, n_acc, "probe", d)) < 0)
      return rc;
    if ((rc = dev_max(pden, g.npx, d_met + MET_PMAX, d)) < 0)
      return rc;
    double support = c.probe_support > 0 ? c.probe_support * (double)g.npx : 0.0;
    dm_divide_kernel<T><<<grid_x((size_t)g.mp * g.npx), DM_THREADS, 0, st>>>(
        d_P, pnum, pden, d_met + MET_PMAX, c.probe_reg, g.npx, (size_t)g.mp * g.npx, g.n, support);
    BEAM_CUDA_LAUNCHED(d, "dm_divide_kernel (probe)");
    return 0;
  }

  int iterate(int update_probe, beam_dm_metrics_t *m, beam_diag_t *d) override {
    BEAM_CUDA_TRY(d, cudaSetDevice(dev));
    size_t nv = e->nviews;
    size_t npr = (size_t)g.mp * g.npx, nob = (size_t)g.mo * g.opx;

    /* Power bound (dm.h): 0.25 relax^2 max_i(sum_valid A_i^2) / n^2; the
     * error denominator sum_i sum_valid A_i^2 over photon views. */
    double maxA2 = 0, den = 0;
    for (size_t v = 0; v < nv; v++) {
      if (h_sumA2[v] > maxA2)
        maxA2 = h_sumA2[v];
      if (h_sumA[v] > 0)
        den += h_sumA2[v];
    }
    int relax = c.fourier_relax > 0;
    double pbound = 0.25 * c.fourier_relax * c.fourier_relax * maxA2 / (double)g.npx;
    T inv_n = (T)(1.0 / c.n), inv_n2 = (T)(1.0 / (double)g.npx), eps = (T)BEAM_DM_EPS;
    double ca, cb, cp;
    beam_dm_update_coefs(&c, &ca, &cb, &cp);
    const int dm = c.algorithm == BEAM_DM_ALG_DM;

    BEAM_CUDA_TRY(d, cudaMemcpyAsync(d_Oprev, d_O, nob * sizeof(C), cudaMemcpyDeviceToDevice, st));
    if (update_probe)
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(d_Pprev, d_P, npr * sizeof(C), cudaMemcpyDeviceToDevice, st));
    BEAM_CUDA_TRY(d, cudaMemsetAsync(d_errsum, 0, nv * sizeof(double), st));

    /* 1. exit waves, batch by batch */
    for (size_t v0 = 0; v0 < nv; v0 += B) {
      size_t nb = nv - v0 < B ? nv - v0 : B;
      cufftHandle plan = plan_full;
      if (nb != B) {
        int rc = rem_plan(nb, d);
        if (rc < 0)
          return rc;
        plan = plan_rem;
      }
      dim3 grid(grid_x(g.npx), grid_y(nb));
      dm_form_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_P, d_O, d_pos, d_psi, d_buf, v0, nb);
      BEAM_CUDA_LAUNCHED(d, "dm_form_kernel");
      BEAM_CUFFT_TRY(d, fft_exec(plan, d_buf, CUFFT_FORWARD));
      if (relax) {
        dm_err_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_buf, d_amp, d_vstat, d_errsum, v0, nb, inv_n);
        BEAM_CUDA_LAUNCHED(d, "dm_err_kernel");
      }
      dm_modulus_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_buf, d_amp, d_vstat, d_errsum, v0, nb, inv_n, inv_n2,
                                                         eps, relax, pbound, !relax);
      BEAM_CUDA_LAUNCHED(d, "dm_modulus_kernel");
      BEAM_CUFFT_TRY(d, fft_exec(plan, d_buf, CUFFT_INVERSE));
      dm_update_kernel<T><<<grid, DM_THREADS, 0, st>>>(g, d_P, d_O, d_pos, d_psi, d_buf, d_vstat, d_errsum, v0, nb,
                                                        (T)ca, (T)cb, (T)cp, dm, relax, pbound);
      BEAM_CUDA_LAUNCHED(d, "dm_update_kernel");
    }

    /* 2. object and probe */
    for (uint32_t pass = 0; pass < c.inner_passes; pass++) {
      int rc = object_pass(nv, d);
      if (rc < 0)
        return rc;
      if (update_probe && (rc = probe_pass(nv, d)) < 0)
        return rc;
    }

    /* metrics: one small copy */
    {
      unsigned nb = grid_x(nv) < RED_BLOCKS ? grid_x(nv) : RED_BLOCKS;
      dm_sum_partial_kernel<<<nb, DM_THREADS, 0, st>>>(d_errsum, nv, d_part);
      BEAM_CUDA_LAUNCHED(d, "dm_sum_partial_kernel");
      dm_finish_kernel<<<1, DM_THREADS, 0, st>>>(d_part, (int)nb, 1, 0, d_met + MET_ERR);
      BEAM_CUDA_LAUNCHED(d, "dm_finish_kernel (error)");
    }
    int rc = dev_change(d_O, d_Oprev, nob, d_met + MET_DO, d);
    if (rc < 0)
      return rc;
    if (update_probe && (rc = dev_change(d_P, d_Pprev, npr, d_met + MET_DP, d)) < 0)
      return rc;
    BEAM_CUDA_TRY(d, cudaMemcpyAsync(h_met, d_met, MET_COUNT * sizeof(double), cudaMemcpyDeviceToHost, st));
    BEAM_CUDA_TRY(d, cudaStreamSynchronize(st));

    double sums[2] = {h_met[MET_ERR], den};
    if (e->reduce) {
      rc = e->reduce(e->reduce_ctx, sums, 2, 1);
      if (rc < 0)
        return BEAM_DIAG(d, rc, "ptycho: cuda: the reducer failed (%d) on the metric sums", rc);
    }
    m->fourier_error = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    m->object_change = h_met[MET_O] > 0 ? sqrt(h_met[MET_DO] / h_met[MET_O]) : 0.0;
    m->probe_change = update_probe && h_met[MET_P] > 0 ? sqrt(h_met[MET_DP] / h_met[MET_P]) : 0.0;
    return 0;
  }
};

/* ---- backend table ------------------------------------------------------------ */

static int cu_create(beam_dm_t *e, beam_diag_t *d) {
  dm_impl *impl;
  if (e->conf.prec == BEAM_DM_F64)
    impl = new (std::nothrow) dm_eng<double>(e);
  else
    impl = new (std::nothrow) dm_eng<float>(e);
  if (!impl)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: cuda: out of host memory for the engine");
  int rc = impl->create(d);
  if (rc < 0) {
    delete impl; /* dm.c frees e without calling destroy after a failed create */
    return rc;
  }
  e->impl = impl;
  return 0;
}

static void cu_destroy(beam_dm_t *e) {
  delete (dm_impl *)e->impl;
  e->impl = NULL;
}

static int cu_set_probe(beam_dm_t *e, const double *v, beam_diag_t *d) {
  return ((dm_impl *)e->impl)->set_probe(v, d);
}
static int cu_set_object(beam_dm_t *e, const double *v, beam_diag_t *d) {
  return ((dm_impl *)e->impl)->set_object(v, d);
}
static int cu_get_probe(beam_dm_t *e, double *v, beam_diag_t *d) { return ((dm_impl *)e->impl)->get_probe(v, d); }
static int cu_get_object(beam_dm_t *e, double *v, beam_diag_t *d) {
  return ((dm_impl *)e->impl)->get_object(v, d);
}
static int cu_add_views(beam_dm_t *e, uint32_t first, uint32_t count, const float *amp, const int32_t *pos,
                        beam_diag_t *d) {
  return ((dm_impl *)e->impl)->add_views(first, count, amp, pos, d);
}
static int cu_iterate(beam_dm_t *e, int update_probe, beam_dm_metrics_t *m, beam_diag_t *d) {
  return ((dm_impl *)e->impl)->iterate(update_probe, m, d);
}

extern "C" const beam_dm_backend_t_ beam_dm_cuda_backend = {
    "cuda",       dm_cuda_bytes,  cu_create,    cu_destroy, cu_set_probe, cu_set_object,
    cu_get_probe, cu_get_object, cu_add_views, cu_iterate};

/* ---- FFT floor (bench/ptycho_gpu.c) ------------------------------------------- */

/* Scratch state of beam_dm_cuda_fft_seconds, freed on every path. */
struct fft_floor {
  int have_full = 0, have_rem = 0;
  cufftHandle full = 0, rem = 0;
  void *buf = NULL, *work = NULL;
  cudaEvent_t t0 = NULL, t1 = NULL;
  cudaStream_t st = NULL;
  ~fft_floor() {
    if (st)
      cudaStreamSynchronize(st);
    if (have_full)
      cufftDestroy(full);
    if (have_rem)
      cufftDestroy(rem);
    if (buf)
      cudaFree(buf);
    if (work)
      cudaFree(work);
    if (t0)
      cudaEventDestroy(t0);
    if (t1)
      cudaEventDestroy(t1);
    if (st)
      cudaStreamDestroy(st);
  }
};

template <typename T>
static int fft_floor_run(const beam_dm_conf_t *c, uint32_t nviews, int iters, double *sec, beam_diag_t *d) {
  typedef typename dm_cplx<T>::type C;
  fft_floor f;
  size_t m = (size_t)c->probe_modes * c->object_modes, npx = (size_t)c->n * c->n;
  size_t B = batch_views(c), rem = nviews % B;
  int dims[2] = {(int)c->n, (int)c->n};
  cufftType type = sizeof(T) == 8 ? CUFFT_Z2Z : CUFFT_C2C;
  size_t ws_full = 0, ws_rem = 0;
  BEAM_CUDA_TRY(d, cudaSetDevice(c->device));
  BEAM_CUDA_TRY(d, cudaStreamCreateWithFlags(&f.st, cudaStreamNonBlocking));
  BEAM_CUFFT_TRY(d, cufftCreate(&f.full));
  f.have_full = 1;
  BEAM_CUFFT_TRY(d, cufftSetAutoAllocation(f.full, 0));
  BEAM_CUFFT_TRY(d, cufftMakePlanMany(f.full, 2, dims, NULL, 1, 0, NULL, 1, 0, type, (int)(B * m), &ws_full));
  BEAM_CUFFT_TRY(d, cufftSetStream(f.full, f.st));
  if (rem) {
    BEAM_CUFFT_TRY(d, cufftCreate(&f.rem));
    f.have_rem = 1;
    BEAM_CUFFT_TRY(d, cufftSetAutoAllocation(f.rem, 0));
    BEAM_CUFFT_TRY(d, cufftMakePlanMany(f.rem, 2, dims, NULL, 1, 0, NULL, 1, 0, type, (int)(rem * m), &ws_rem));
    BEAM_CUFFT_TRY(d, cufftSetStream(f.rem, f.st));
  }
  size_t ws = ws_full > ws_rem ? ws_full : ws_rem;
  BEAM_CUDA_TRY(d, cudaMalloc(&f.work, ws ? ws : 1));
  BEAM_CUFFT_TRY(d, cufftSetWorkArea(f.full, f.work));
  if (rem)
    BEAM_CUFFT_TRY(d, cufftSetWorkArea(f.rem, f.work));
  BEAM_CUDA_TRY(d, cudaMalloc(&f.buf, B * m * npx * sizeof(C)));
  BEAM_CUDA_TRY(d, cudaMemsetAsync(f.buf, 0, B * m * npx * sizeof(C), f.st));
  BEAM_CUDA_TRY(d, cudaEventCreate(&f.t0));
  BEAM_CUDA_TRY(d, cudaEventCreate(&f.t1));
  C *b = (C *)f.buf;
  for (int it = -1; it < iters; it++) { /* iteration -1: warm-up, not timed */
    if (it == 0)
      BEAM_CUDA_TRY(d, cudaEventRecord(f.t0, f.st));
    for (size_t v0 = 0; v0 < nviews; v0 += B) {
      cufftHandle h = nviews - v0 < B ? f.rem : f.full;
      BEAM_CUFFT_TRY(d, fft_exec(h, b, CUFFT_FORWARD));
      BEAM_CUFFT_TRY(d, fft_exec(h, b, CUFFT_INVERSE));
    }
  }
  BEAM_CUDA_TRY(d, cudaEventRecord(f.t1, f.st));
  BEAM_CUDA_TRY(d, cudaEventSynchronize(f.t1));
  float ms = 0;
  BEAM_CUDA_TRY(d, cudaEventElapsedTime(&ms, f.t0, f.t1));
  *sec = iters > 0 ? (double)ms * 1e-3 / iters : 0.0;
  return 0;
}

extern "C" int beam_dm_cuda_fft_seconds(const struct beam_dm_conf_s *c, uint32_t nviews, int iters,
                                        double *sec_per_iter, beam_diag_t *d) {
  *sec_per_iter = 0;
  char why[256] = "";
  if (beam_gpu_count(why, sizeof why) <= c->device)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "ptycho: no CUDA device %d: %s", c->device, why);
  if (nviews == 0 || c->n == 0 || c->max_views == 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: fft floor: nviews, n and max_views must be > 0");
  return c->prec == BEAM_DM_F64 ? fft_floor_run<double>(c, nviews, iters, sec_per_iter, d)
                                : fft_floor_run<float>(c, nviews, iters, sec_per_iter, d);
}
