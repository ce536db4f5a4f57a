/* Stage kind `pca`, CUDA backend: the batch update of pipeline/kern/pca.h
 * with cuBLAS, the (k + b + 1)^2 eigenproblem on the host (beam_pca_core,
 * LAPACKE), everything P-sized on the device.
 *
 * Per frame: copy the raw frame up, bin it (beam__cuda_bin2d, bin.h order),
 * gather the kept pixels (Anscombe when poisson) into row k + nb of M and
 * count non-finite ones; the count comes back (one sync) so the frame is
 * rejected before it can reach the model.
 * Per batch (cuBLAS is column-major: a row-major r x c matrix is its
 * c x r transpose with leading dimension c):
 *   R = X - mu;  S^T = V R^T (Sgemm T,N);  R^T -= V^T S^T (Sgemm N,N)
 *   residual norms, M rows (s V, X - mu_b, correction), mu update: kernels
 *   G = M M^T (Ssyrk, lower in column-major = upper row-major), to the host
 *   V^T = M^T W^T (Sgemm N,N) with W from the host.
 * S, the residuals, G and the row sums come back per batch (a few KB);
 * V and mu only when the model is published. Results agree with the CPU
 * backend to float32 GEMM rounding in another order, not bit for bit
 * (tests/gpu/test_xcheck_pca.c states the tolerances).
 *
 * robust (pca.h): the CPU backend's steps on the device. R = X - mu,
 * A0 = V R^T; per step S = A0 - V E^T (Sgemm), E = V^T S^T (Sgemm,
 * beta 0), the subsample of e = X - mu - E per frame to the host for the
 * noise scale (beam_pca_sigma_of, the same function as the CPU's), then
 * E = soft(X - mu - E, tau) (soft_kernel); finally S = A0 - V E^T,
 * X -= E (X now holds y), and the residuals of y as in the plain path.
 * The first batch is split against the per-pixel median (median_kernel,
 * the same selection as the host's, so the same value). Frames left out
 * of the update are removed by moving the later rows of M up. */
#include "gpu/cuda_int.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/pca.h"

#define THREADS 256

__global__ void gather_kernel(const float *__restrict__ img, const uint32_t *__restrict__ keep, size_t P,
                              int poisson, float *__restrict__ row, unsigned *__restrict__ bad) {
  unsigned nbad = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < P; i += (size_t)gridDim.x * blockDim.x) {
    float x = img[keep[i]];
    nbad += !isfinite(x);
    row[i] = poisson ? 2.0f * sqrtf((x > 0 ? x : 0.0f) + 0.375f) : x;
  }
  if (nbad)
    atomicAdd(bad, nbad);
}

/* R[j, p] = X[j, p] - mu[p] over nb rows. */
__global__ void sub_mean_kernel(const float *__restrict__ X, const float *__restrict__ mu, size_t P, size_t nb,
                                float *__restrict__ R) {
  size_t n = P * nb;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    R[i] = X[i] - mu[i % P];
}

/* One block per row: out[row] = sum (square ? x^2 : x) in double. */
__global__ void row_reduce_kernel(const float *__restrict__ A, size_t P, int square, double *__restrict__ out) {
  __shared__ double sh[THREADS];
  const float *a = A + (size_t)blockIdx.x * P;
  double s = 0;
  for (size_t i = threadIdx.x; i < P; i += blockDim.x) {
    double v = a[i];
    s += square ? v * v : v;
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w)
      sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    out[blockIdx.x] = sh[0];
}

typedef struct sv_s {
  float s[BEAM_PCA_KMAX];
} sv_t;

/* Rows 0..k-1 of M: s_i V_i. */
__global__ void top_rows_kernel(const float *__restrict__ V, sv_t s, size_t P, size_t k, float *__restrict__ M) {
  size_t n = P * k;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    M[i] = s.s[i / P] * V[i];
}

/* Per pixel: batch mean, rows centred in place, the correction row from the
 * old mean, then the new mean. */
__global__ void center_kernel(float *__restrict__ X, size_t P, size_t nb, float *__restrict__ mu,
                              float *__restrict__ corr, double cf, double wn, double wb) {
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x) {
    float m = 0;
    for (size_t j = 0; j < nb; j++)
      m += X[j * P + p];
    m *= 1.0f / (float)nb;
    for (size_t j = 0; j < nb; j++)
      X[j * P + p] -= m;
    double old = mu[p];
    corr[p] = (float)(cf * (old - (double)m));
    mu[p] = (float)(wn * old + wb * m);
  }
}

/* ---- robust -------------------------------------------------------------------- */

/* out[j, i] = X[j, p] - c[p] - (E ? E[j, p] : 0) at subsample pixel i
 * (pca.h's beam_pca_samp_idx, written out: that one is host code). */
__global__ void samp_kernel(const float *__restrict__ X, const float *__restrict__ c, const float *__restrict__ E,
                            size_t P, size_t nb, size_t ns, float *__restrict__ out) {
  size_t n = nb * ns, seg = P / (BEAM_PCA_NSAMP / BEAM_PCA_SAMP_RUN);
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    size_t j = t / ns, i = t % ns, r = i / BEAM_PCA_SAMP_RUN;
    size_t p = P <= BEAM_PCA_NSAMP
                   ? i
                   : r * seg + (size_t)((uint32_t)(r * 2654435761u) % (uint32_t)(seg - BEAM_PCA_SAMP_RUN + 1)) +
                         i % BEAM_PCA_SAMP_RUN;
    size_t q = j * P + p;
    out[t] = X[q] - c[p] - (E ? E[q] : 0.0f);
  }
}

/* E[j, p] = soft(X[j, p] - c[p] - (sub ? E[j, p] : 0), tau[j]): each
 * element read and written by one thread, so in place is safe. */
__global__ void soft_kernel(const float *__restrict__ X, const float *__restrict__ c, float *E, int sub, size_t P,
                            size_t nb, const float *__restrict__ tau) {
  size_t n = nb * P;
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x) {
    float e = X[t] - c[t % P] - (sub ? E[t] : 0.0f);
    float a = fabsf(e) - tau[t / P];
    E[t] = a > 0 ? copysignf(a, e) : 0.0f;
  }
}

/* X -= E over nb rows: y = x - s. */
__global__ void sub_kernel(float *__restrict__ X, const float *__restrict__ E, size_t n) {
  for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
    X[t] -= E[t];
}

/* Per pixel: the median of the nb rows of X at p, selected in place in
 * column p of W (a b x P scratch; rows j * P + p, so neighbouring threads
 * touch neighbouring words). Wirth's selection and the even-n rule of
 * beam_pca_median: the same order statistic, so the same float. */
__global__ void median_kernel(const float *__restrict__ X, size_t P, size_t nb, float *W, float *__restrict__ med) {
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < P; p += (size_t)gridDim.x * blockDim.x) {
    float *v = W + p;
    for (size_t j = 0; j < nb; j++)
      v[j * P] = X[j * P + p];
    long l = 0, m = (long)nb - 1, k = (long)(nb / 2);
    while (l < m) {
      float x = v[k * P];
      long i = l, j = m;
      do {
        while (v[i * P] < x)
          i++;
        while (x < v[j * P])
          j--;
        if (i <= j) {
          float t = v[i * P];
          v[i * P] = v[j * P], v[j * P] = t;
          i++, j--;
        }
      } while (i <= j);
      if (j < k)
        l = i;
      if (k < i)
        m = j;
    }
    float hi = v[k * P];
    if (nb % 2) {
      med[p] = hi;
    } else {
      float lo = v[0];
      for (long i = 1; i < k; i++)
        lo = v[i * P] > lo ? v[i * P] : lo;
      med[p] = 0.5f * (lo + hi);
    }
  }
}

/* ---- stage ------------------------------------------------------------------ */

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  cublasHandle_t blas;
  beam_pca_host_t h;
  void *d_in;
  size_t d_in_cap;
  float *d_img, *d_M, *d_R, *d_V, *d_mu, *d_S, *d_G, *d_W, *d_den;
  float *d_E, *d_A0, *d_tau, *d_samp, *d_med; /* robust only */
  uint32_t *d_keep;
  unsigned *d_bad;
  double *d_red; /* row sums / norms, m doubles */
  size_t in_bytes;
} cuda_t;

static void free_dev(cuda_t *s) {
  void **p[] = {(void **)&s->d_img, (void **)&s->d_M, (void **)&s->d_R, (void **)&s->d_V, (void **)&s->d_mu,
                (void **)&s->d_S,   (void **)&s->d_G, (void **)&s->d_W, (void **)&s->d_den, (void **)&s->d_keep,
                (void **)&s->d_bad, (void **)&s->d_red,  (void **)&s->d_E, (void **)&s->d_A0, (void **)&s->d_tau,
                (void **)&s->d_samp, (void **)&s->d_med};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
    if (*p[i])
      cudaFree(*p[i]);
    *p[i] = NULL;
  }
}

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  if (s->cx.stream)
    cudaStreamSynchronize(s->cx.stream);
  free_dev(s);
  beam__dbuf_free(&s->d_in, &s->d_in_cap);
  if (s->blas)
    cublasDestroy(s->blas);
  beam__cuda_ctx_fini(&s->cx);
  beam_pca_host_free(&s->h);
  beam_pca_conf_free(&s->h.conf);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "pca: out of memory");
  self->priv = s;
  int rc = beam_pca_conf_load(&s->h.conf, self->cfg, d);
  if (rc < 0)
    return rc;
  if ((rc = beam__cuda_ctx_init(&s->cx, "pca", d)) < 0)
    return rc;
  BEAM_CUBLAS_TRY(d, cublasCreate(&s->blas));
  BEAM_CUBLAS_TRY(d, cublasSetStream(s->blas, s->cx.stream));
  return 0;
}


#define DALLOC(ptr, n) BEAM_CUDA_TRY(d, cudaMalloc((void **)&(ptr), (n) * sizeof *(ptr)))

static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  beam_pca_host_t *h = &s->h;
  int rc = beam_pca_host_start(self, h, in, 0, d);
  if (rc < 0)
    return rc;
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  free_dev(s);
  size_t P = h->P, k = h->conf.k, b = h->conf.b, m = h->m, npix = (size_t)h->oh * h->ow;
  s->in_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  if ((rc = beam__dbuf_reserve(&s->d_in, &s->d_in_cap, s->in_bytes, d)) < 0)
    return rc;
  DALLOC(s->d_img, npix);
  DALLOC(s->d_M, m * P);
  DALLOC(s->d_R, b * P);
  DALLOC(s->d_V, k * P);
  DALLOC(s->d_mu, P);
  DALLOC(s->d_S, b * k);
  DALLOC(s->d_G, m * m);
  DALLOC(s->d_W, k * m);
  DALLOC(s->d_den, P);
  DALLOC(s->d_keep, P);
  DALLOC(s->d_bad, 1);
  DALLOC(s->d_red, m);
  if (h->conf.robust) {
    DALLOC(s->d_E, b * P);
    DALLOC(s->d_A0, b * k);
    DALLOC(s->d_tau, b);
    DALLOC(s->d_samp, b * (size_t)BEAM_PCA_NSAMP);
    DALLOC(s->d_med, P);
  }
  BEAM_CUDA_TRY(d, cudaMemcpy(s->d_keep, h->keep, P * sizeof *h->keep, cudaMemcpyHostToDevice));
  BEAM_CUDA_TRY(d, cudaMemset(s->d_V, 0, k * P * sizeof(float)));
  BEAM_CUDA_TRY(d, cudaMemset(s->d_mu, 0, P * sizeof(float)));
  return 0;
}

/* Low-rank frame j of the batch just scored: X_j - R_j. */
typedef struct den_ctx_s {
  cuda_t *s;
  int rc;
} den_ctx_t;

__global__ void diff_kernel(const float *__restrict__ x, const float *__restrict__ r, size_t P, float *__restrict__ o) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < P; i += (size_t)gridDim.x * blockDim.x)
    o[i] = x[i] - r[i];
}

static int denoise_(cuda_t *s, uint32_t j, float *out, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  size_t P = h->P;
  diff_kernel<<<beam__grid_for(P, THREADS), THREADS, 0, s->cx.stream>>>(
      s->d_M + ((size_t)h->conf.k + j) * P, s->d_R + (size_t)j * P, P, s->d_den);
  BEAM_CUDA_LAUNCHED(d, "diff_kernel");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(out, s->d_den, P * sizeof(float), cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  return 0;
}

/* Row j of a per-frame image (denoised or sparse) through fn. The emitter
 * cannot fail: on an error the image is NaN and the error is reported. */
static void row_or_nan(den_ctx_t *c, int (*fn)(cuda_t *, uint32_t, float *, beam_diag_t *), uint32_t j,
                       float *out) {
  beam_diag_t d;
  memset(&d, 0, sizeof d);
  int rc = fn(c->s, j, out, &d);
  if (rc < 0) {
    for (size_t i = 0; i < c->s->h.P; i++)
      out[i] = NAN;
    c->rc = rc;
  }
}

static void denoise_row(void *ctx, uint32_t j, float *out) { row_or_nan((den_ctx_t *)ctx, denoise_, j, out); }

/* d_R holds x - mu per row and d_S the scores: R -= V^T S^T, then the
 * scores and each row's residual norm / sqrt(P) to the host. */
static int residuals(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  int P = (int)h->P, k = (int)h->conf.k, nb = (int)h->nb;
  const float one = 1.0f, minus = -1.0f;
  BEAM_CUBLAS_TRY(d, cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, P, nb, k, &minus, s->d_V, P, s->d_S, k, &one,
                                 s->d_R, P));
  row_reduce_kernel<<<nb, THREADS, 0, s->cx.stream>>>(s->d_R, (size_t)P, 1, s->d_red);
  BEAM_CUDA_LAUNCHED(d, "row_reduce_kernel");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->S, s->d_S, (size_t)nb * k * sizeof(float), cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->G, s->d_red, (size_t)nb * sizeof(double), cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  double isp = 1.0 / sqrt((double)P);
  for (int j = 0; j < nb; j++)
    h->res[j] = (float)(sqrt(h->G[j]) * isp);
  return 0;
}

static int score(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  int P = (int)h->P, k = (int)h->conf.k, nb = (int)h->nb;
  const float one = 1.0f, zero = 0.0f;
  sub_mean_kernel<<<beam__grid_for((size_t)P * nb, THREADS), THREADS, 0, s->cx.stream>>>(
      s->d_M + (size_t)k * P, s->d_mu, (size_t)P, (size_t)nb, s->d_R);
  BEAM_CUDA_LAUNCHED(d, "sub_mean_kernel");
  BEAM_CUBLAS_TRY(d, cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, k, nb, P, &one, s->d_V, P, s->d_R, P, &zero,
                                 s->d_S, k));
  return residuals(s, d);
}

static int update(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  const beam_pca_conf_t *c = &h->conf;
  size_t P = h->P, k = c->k, nb = h->nb, mrows = k + nb + 1, m = h->m;
  if (h->have_model) {
    h->n_seen *= c->forget;
    h->scatter *= c->forget * c->forget;
    for (size_t i = 0; i < k; i++)
      h->s[i] *= c->forget;
  }
  sv_t sv;
  for (size_t i = 0; i < BEAM_PCA_KMAX; i++)
    sv.s[i] = i < k ? (float)h->s[i] : 0.0f;
  top_rows_kernel<<<beam__grid_for(P * k, THREADS), THREADS, 0, s->cx.stream>>>(s->d_V, sv, P, k, s->d_M);
  BEAM_CUDA_LAUNCHED(d, "top_rows_kernel");
  double n = h->n_seen, cf = sqrt(n * (double)nb / (n + (double)nb));
  double wn = n / (n + (double)nb), wb = (double)nb / (n + (double)nb);
  center_kernel<<<beam__grid_for(P, THREADS), THREADS, 0, s->cx.stream>>>(s->d_M + k * P, P, nb, s->d_mu,
                                                                           s->d_M + (k + nb) * P, cf, wn, wb);
  BEAM_CUDA_LAUNCHED(d, "center_kernel");
  /* Row sums (sign convention) and the scatter of rows k.. (new energy). */
  row_reduce_kernel<<<(unsigned)mrows, THREADS, 0, s->cx.stream>>>(s->d_M, P, 0, s->d_red);
  BEAM_CUDA_LAUNCHED(d, "row_reduce_kernel");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->rowsum, s->d_red, mrows * sizeof(double), cudaMemcpyDeviceToHost, s->cx.stream));
  const float one = 1.0f, zero = 0.0f;
  BEAM_CUBLAS_TRY(d, cublasSsyrk(s->blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, (int)mrows, (int)P, &one, s->d_M,
                                 (int)P, &zero, s->d_G, (int)m));
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->Gf, s->d_G, m * m * sizeof(float), cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  /* The diagonal of G past the first k rows is the new energy |X - mu_b|^2
   * + |correction|^2: the scatter increment. */
  double ss = 0;
  for (size_t r = k; r < mrows; r++)
    ss += h->Gf[r * m + r];
  h->scatter += ss;
  int rc = beam_pca_core(h, (uint32_t)mrows, d);
  if (rc < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_W, h->W, k * m * sizeof(float), cudaMemcpyHostToDevice, s->cx.stream));
  BEAM_CUBLAS_TRY(d, cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)P, (int)k, (int)mrows, &one, s->d_M,
                                 (int)P, s->d_W, (int)m, &zero, s->d_V, (int)P));
  /* W is host memory read by the async copy above: wait before the next
   * batch can overwrite it. */
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  h->n_seen = n + (double)nb;
  h->have_model = 1;
  return 0;
}

/* tau_j = lambda sigma_j from the subsample of e = X - c - E (E may be
 * NULL) of every frame: gathered on the device, the MAD on the host. */
static int robust_tau(cuda_t *s, const float *c, const float *E, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  size_t P = h->P, nb = h->nb, ns = beam_pca_samp_n(P);
  samp_kernel<<<beam__grid_for(nb * ns, THREADS), THREADS, 0, s->cx.stream>>>(s->d_M + (size_t)h->conf.k * P, c, E,
                                                                              P, nb, ns, s->d_samp);
  BEAM_CUDA_LAUNCHED(d, "samp_kernel");
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->samp, s->d_samp, nb * ns * sizeof(float), cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  for (size_t j = 0; j < nb; j++)
    h->tau[j] = (float)h->conf.robust_lambda * beam_pca_sigma_of(h->samp + j * ns, ns);
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_tau, h->tau, nb * sizeof(float), cudaMemcpyHostToDevice, s->cx.stream));
  /* h->tau is read by the async copy: the next write is a batch later,
   * after this stream's syncs. */
  return 0;
}

/* S = A0 - V E^T: the scores of x - s. */
static int robust_scores(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  int P = (int)h->P, k = (int)h->conf.k, nb = (int)h->nb;
  const float one = 1.0f, minus = -1.0f;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_S, s->d_A0, (size_t)nb * k * sizeof(float), cudaMemcpyDeviceToDevice,
                                   s->cx.stream));
  BEAM_CUBLAS_TRY(d, cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, k, nb, P, &minus, s->d_V, P, s->d_E, P, &one,
                                 s->d_S, k));
  return 0;
}

/* The split of pca.h against the model, then the scores and residuals of
 * y (the plain score()'s outputs, for y instead of x). */
static int robust_score(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  int P = (int)h->P, k = (int)h->conf.k, nb = (int)h->nb, rc;
  const float one = 1.0f, zero = 0.0f;
  float *X = s->d_M + (size_t)k * P;
  unsigned gn = beam__grid_for((size_t)P * nb, THREADS);
  sub_mean_kernel<<<gn, THREADS, 0, s->cx.stream>>>(X, s->d_mu, (size_t)P, (size_t)nb, s->d_R);
  BEAM_CUDA_LAUNCHED(d, "sub_mean_kernel");
  BEAM_CUBLAS_TRY(d, cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, k, nb, P, &one, s->d_V, P, s->d_R, P, &zero,
                                 s->d_A0, k));
  for (uint32_t t = 0; t < h->conf.robust_iters; t++) {
    if (t == 0)
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_S, s->d_A0, (size_t)nb * k * sizeof(float), cudaMemcpyDeviceToDevice,
                                       s->cx.stream));
    else if ((rc = robust_scores(s, d)) < 0)
      return rc;
    BEAM_CUBLAS_TRY(d, cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, P, nb, k, &one, s->d_V, P, s->d_S, k, &zero,
                                   s->d_E, P));
    if ((rc = robust_tau(s, s->d_mu, s->d_E, d)) < 0)
      return rc;
    soft_kernel<<<gn, THREADS, 0, s->cx.stream>>>(X, s->d_mu, s->d_E, 1, (size_t)P, (size_t)nb, s->d_tau);
    BEAM_CUDA_LAUNCHED(d, "soft_kernel");
  }
  if ((rc = robust_scores(s, d)) < 0)
    return rc;
  sub_kernel<<<gn, THREADS, 0, s->cx.stream>>>(X, s->d_E, (size_t)P * nb);
  BEAM_CUDA_LAUNCHED(d, "sub_kernel");
  /* Residuals of y: R = y - mu - V^T S^T. */
  sub_mean_kernel<<<gn, THREADS, 0, s->cx.stream>>>(X, s->d_mu, (size_t)P, (size_t)nb, s->d_R);
  BEAM_CUDA_LAUNCHED(d, "sub_mean_kernel");
  return residuals(s, d);
}

/* The first batch: one split against the per-pixel median (no model). */
static int robust_first(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  size_t P = h->P, nb = h->nb;
  float *X = s->d_M + (size_t)h->conf.k * P;
  median_kernel<<<beam__grid_for(P, THREADS), THREADS, 0, s->cx.stream>>>(X, P, nb, s->d_E, s->d_med);
  BEAM_CUDA_LAUNCHED(d, "median_kernel");
  int rc = robust_tau(s, s->d_med, NULL, d);
  if (rc < 0)
    return rc;
  unsigned gn = beam__grid_for(P * nb, THREADS);
  soft_kernel<<<gn, THREADS, 0, s->cx.stream>>>(X, s->d_med, s->d_E, 0, P, nb, s->d_tau);
  BEAM_CUDA_LAUNCHED(d, "soft_kernel");
  sub_kernel<<<gn, THREADS, 0, s->cx.stream>>>(X, s->d_E, P * nb);
  BEAM_CUDA_LAUNCHED(d, "sub_kernel");
  return 0;
}

/* Rows marked in h->rej leave the batch (later rows of M moved up). */
static int robust_drop(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  size_t P = h->P;
  float *X = s->d_M + (size_t)h->conf.k * P;
  uint32_t w = 0;
  for (uint32_t j = 0; j < h->nb; j++) {
    if (h->rej[j])
      continue;
    if (w != j)
      BEAM_CUDA_TRY(d, cudaMemcpyAsync(X + (size_t)w * P, X + (size_t)j * P, P * sizeof(float),
                                       cudaMemcpyDeviceToDevice, s->cx.stream));
    w++;
  }
  h->nb = w;
  return 0;
}

static int sparse_(cuda_t *s, uint32_t j, float *out, beam_diag_t *d) {
  size_t P = s->h.P;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(out, s->d_E + (size_t)j * P, P * sizeof(float), cudaMemcpyDeviceToHost,
                                   s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  return 0;
}

static void sparse_row(void *ctx, uint32_t j, float *out) { row_or_nan((den_ctx_t *)ctx, sparse_, j, out); }

static int pull_model(cuda_t *s, beam_diag_t *d) {
  beam_pca_host_t *h = &s->h;
  if (!h->have_model)
    return 0;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->V, s->d_V, (size_t)h->conf.k * h->P * sizeof(float), cudaMemcpyDeviceToHost,
                                   s->cx.stream));
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(h->mu, s->d_mu, h->P * sizeof(float), cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  return 0;
}

static int batch(beam_stage_t *self, cuda_t *s, beam_emit_t *emit) {
  beam_pca_host_t *h = &s->h;
  int rc;
  if (h->nb == 0)
    return 0;
  int robust = h->conf.robust;
  if (robust && !h->have_model && (rc = robust_first(s, &self->diag)) < 0)
    return rc;
  if (h->have_model) {
    if ((rc = robust ? robust_score(s, &self->diag) : score(s, &self->diag)) < 0)
      return rc;
    den_ctx_t dc = {s, 0};
    beam_pca_emit_batch(h, emit, denoise_row, robust ? sparse_row : NULL, &dc);
    if (dc.rc < 0)
      return BEAM_DIAG(&self->diag, dc.rc, "pca: copying a denoised or sparse frame from the GPU failed");
    if (robust && beam_pca_rejects(h) > 0 && (rc = robust_drop(s, &self->diag)) < 0)
      return rc;
  }
  rc = h->nb > 0 ? update(s, &self->diag) : 0;
  h->nb = 0;
  if (rc < 0)
    return rc;
  uint64_t mark = h->nframes / h->conf.publish_every;
  if (mark != h->pub_mark) {
    h->pub_mark = mark;
    if ((rc = pull_model(s, &self->diag)) < 0)
      return rc;
    beam_pca_emit_model(h, emit, BEAM_FLAG_PARTIAL);
  }
  return 0;
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  beam_pca_host_t *h = &s->h;
  beam_diag_t *d = &self->diag;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return 0;
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0 || (rc = beam__cuda_ctx_use(&s->cx, d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_in, in->data, s->in_bytes, cudaMemcpyHostToDevice, s->cx.stream));
  if ((rc = beam__cuda_bin2d(&h->geom, s->d_in, s->d_img, s->cx.stream, d)) < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemsetAsync(s->d_bad, 0, sizeof(unsigned), s->cx.stream));
  float *row = s->d_M + ((size_t)h->conf.k + h->nb) * h->P;
  gather_kernel<<<beam__grid_for(h->P, THREADS), THREADS, 0, s->cx.stream>>>(s->d_img, s->d_keep, h->P,
                                                                              h->conf.poisson, row, s->d_bad);
  BEAM_CUDA_LAUNCHED(d, "gather_kernel");
  unsigned bad = 0;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(&bad, s->d_bad, sizeof bad, cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  if (bad) {
    h->nreject++;
    return BEAM_DIAG(d, BEAM_EINVAL, "pca \"%s\": frame %llu has %u non-finite pixels; left out of the model",
                     self->name, (unsigned long long)in->frame_id, bad);
  }
  beam_frame_copy_ident(&h->ident[h->nb], in);
  h->nb++;
  h->nframes++;
  if (h->nb == h->conf.b)
    return batch(self, s, emit);
  return 0;
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  int rc = beam__cuda_ctx_use(&s->cx, &self->diag);
  if (rc < 0)
    return rc;
  rc = batch(self, s, emit);
  int rc2 = pull_model(s, &self->diag);
  if (rc2 == 0)
    beam_pca_emit_model(&s->h, emit, BEAM_FLAG_FINAL);
  return rc < 0 ? rc : rc2;
}

extern "C" const beam_stage_ops_t beam_pca_cuda_ops = {
    .kind = "pca", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
