/* The CPU DM backend's arithmetic for one precision; dm_cpu.c includes this
 * twice, with R = float / double, SUF(x) naming the functions, FFTW_(x)
 * the fftwf_ / fftw_ API, SQRT_ the square root and IMASK an integer type
 * as wide as R. Complex arrays are interleaved (re, im) R.
 *
 * Structure (see dm.h for the algorithm):
 *   - exit-wave step: one pass per view, views spread over the threads; each
 *     thread owns an M x n x n buffer (M = M_P M_O) and FFTs all modes of a
 *     view with one batched plan (fftw new-array execute, thread-safe).
 *   - object and probe accumulation: each thread owns a band of rows of the
 *     accumulator (object rows, probe rows) and walks every view in order,
 *     so there are no races and every pixel sums its views in the same
 *     order whatever the thread count (threads 1 and 2 agree bit for bit,
 *     up to the FFT plans FFTW picks).
 * Nothing is allocated here: dm_cpu.c allocates everything at create. */

/* Exit-wave step of view i on thread buffers (tid). pbound < 0: no
 * fourier_relax. Returns the view's sum_valid (af - A)^2 in *err and
 * sum_valid A^2 in *a2 (both 0 for a view without photons). */
CLONES static void SUF(ew_view)(cpu_t *s, const beam_dm_conf_t *c, uint32_t i, int tid, double pbound,
                         double *err, double *a2) {
  const size_t n = c->n, npx = n * n, W = c->obj_w;
  const uint32_t MP = c->probe_modes, MO = c->object_modes, M = MP * MO;
  double ca, cb, cp;
  beam_dm_update_coefs(c, &ca, &cb, &cp);
  const R a = (R)ca, b = (R)cb, cpsi = (R)cp;
  const int dm = c->algorithm == BEAM_DM_ALG_DM;
  R *restrict buf = (R *)s->tbuf[tid];
  R *restrict phi = (R *)s->tphi[tid];
  R *restrict fac = (R *)s->taf[tid];
  R *restrict psi = (R *)s->psi + (size_t)i * M * npx * 2;
  const R *probe = (const R *)s->probe, *obj = (const R *)s->obj;
  const float *restrict amp = s->amp + (size_t)i * npx;
  const size_t r0 = (size_t)s->pos[2 * i], c0 = (size_t)s->pos[2 * i + 1];
  const int empty = s->view_photons[i] == 0.0;
  *err = 0.0;
  *a2 = 0.0;

  for (uint32_t j = 0; j < MP; j++)
    for (uint32_t k = 0; k < MO; k++) {
      size_t m = (size_t)j * MO + k;
      const R *restrict P = probe + (size_t)j * npx * 2;
      const R *O = obj + (size_t)k * c->obj_h * W * 2;
      R *restrict ph = phi + m * npx * 2, *restrict b = buf + m * npx * 2;
      R *restrict ps = psi + m * npx * 2;
      for (size_t y = 0; y < n; y++) {
        const R *restrict Or = O + ((r0 + y) * W + c0) * 2;
        const R *restrict Pr = P + y * n * 2;
        R *restrict phr = ph + y * n * 2, *restrict br = b + y * n * 2;
        R *restrict psr = ps + y * n * 2;
        for (size_t x = 0; x < n; x++) {
          R pr = Pr[2 * x], pim = Pr[2 * x + 1], orr = Or[2 * x], oi = Or[2 * x + 1];
          R fr = pr * orr - pim * oi, fi = pr * oi + pim * orr;
          phr[2 * x] = fr;
          phr[2 * x + 1] = fi;
          if (empty) { /* no photons, no information: psi <- phi */
            psr[2 * x] = fr;
            psr[2 * x + 1] = fi;
          } else {
            br[2 * x] = 2 * fr - psr[2 * x];
            br[2 * x + 1] = 2 * fi - psr[2 * x + 1];
          }
        }
      }
    }
  if (empty)
    return;

  FFTW_(execute_dft)((FFTW_(plan))s->plan_fwd, (FFTW_(complex) *)buf, (FFTW_(complex) *)buf);

  /* FFTW is unnormalised: the unitary Phi is buf / n. The loops below are
   * branch-free so they vectorise; f2 holds each pixel's factor twice (re,
   * im) so the scaling is a plain element-wise product. */
  const R inv_n = (R)(1.0 / (double)n), inv_n2 = (R)(1.0 / ((double)n * (double)n));
  const R eps = (R)BEAM_DM_EPS;
  R *restrict sq = fac, *restrict f2 = fac + npx, *restrict Ar = fac + 3 * npx;
  const int relax = pbound >= 0.0;
  double e = 0.0;
  /* Row by row, so |Phi|^2, the factor and the scaling of a row's modes
   * stay in L1 (one pass over buf instead of three). */
  for (size_t y = 0; y < n; y++) {
    R *restrict sr = sq + y * n, *restrict fr = f2 + y * n * 2;
    const float *restrict ar = amp + y * n;
    {
      const R *restrict b = buf + y * n * 2;
      for (size_t x = 0; x < n; x++)
        sr[x] = b[2 * x] * b[2 * x] + b[2 * x + 1] * b[2 * x + 1];
    }
    for (uint32_t m = 1; m < M; m++) {
      const R *restrict b = buf + ((size_t)m * npx + y * n) * 2;
      for (size_t x = 0; x < n; x++)
        sr[x] += b[2 * x] * b[2 * x] + b[2 * x + 1] * b[2 * x + 1];
    }
    /* The amplitudes in R first: a loop mixing float loads with double
     * arithmetic does not vectorise. */
    for (size_t x = 0; x < n; x++)
      Ar[x] = (R)ar[x];
    /* per-row partial sums in R, then double: vectorisable and accurate */
    R er = 0;
    for (size_t x = 0; x < n; x++) {
      R af = SQRT_(sr[x]) * inv_n, A = Ar[x], fd = af - A, fd2 = fd * fd;
      /* the factor without fourier_relax; inv_n2 folds the unitary scale
       * of both FFTs into one multiply. Computed for every pixel, then
       * selected, so the loop has no branch. */
      R q = A / (af + eps) * inv_n2;
      IMASK ok = A >= 0; /* an integer as wide as R, so the loop vectorises */
      er += fd2 * (R)ok; /* exact: x 1 or x 0 */
      R f = ok ? q : inv_n2;
      sr[x] = af;
      Ar[x] = f;
    }
    for (size_t x = 0; x < n; x++) {
      R f = Ar[x];
      fr[2 * x] = f;
      fr[2 * x + 1] = f;
    }
    e += (double)er;
    if (!relax)
      for (uint32_t m = 0; m < M; m++) {
        R *restrict b = buf + ((size_t)m * npx + y * n) * 2;
        for (size_t x = 0; x < 2 * n; x++)
          b[x] *= fr[x];
      }
  }
  *err = e;
  *a2 = s->view_a2[i];

  if (relax) {
    double err_i = e / (double)s->view_nvalid[i];
    if (!(err_i > pbound)) {
      /* Within the bound: Phi' = Phi, so F^-1[Phi'] = 2 phi - psi and the
       * update needs no inverse FFT: DM psi + beta (phi - psi); RAAR's
       * coefficients make it exactly phi. */
      if (dm)
        for (size_t q = 0; q < (size_t)M * npx * 2; q++)
          psi[q] += b * (phi[q] - psi[q]);
      else
        for (size_t q = 0; q < (size_t)M * npx * 2; q++)
          psi[q] = cpsi * psi[q] + b * (2 * phi[q] - psi[q]) + a * phi[q];
      return;
    }
    const R rn = (R)sqrt(pbound / err_i);
    for (size_t p = 0; p < npx; p++) {
      R A = (R)amp[p], af = sq[p];
      R q = (A + (af - A) * rn) / (af + eps) * inv_n2;
      R f = A >= 0 ? q : inv_n2;
      f2[2 * p] = f;
      f2[2 * p + 1] = f;
    }
    for (uint32_t m = 0; m < M; m++) {
      R *restrict b = buf + (size_t)m * npx * 2;
      for (size_t q = 0; q < npx * 2; q++)
        b[q] *= f2[q];
    }
  }

  FFTW_(execute_dft)((FFTW_(plan))s->plan_inv, (FFTW_(complex) *)buf, (FFTW_(complex) *)buf);

  if (dm) /* kept in this form so DM's rounding does not depend on RAAR */
    for (size_t q = 0; q < (size_t)M * npx * 2; q++)
      psi[q] += b * (buf[q] - phi[q]);
  else
    for (size_t q = 0; q < (size_t)M * npx * 2; q++)
      psi[q] = cpsi * psi[q] + b * buf[q] + a * phi[q];
}

/* Row band [lo, hi) of `rows` for thread t of nt. */
static inline void SUF(band)(size_t rows, int t, int nt, size_t *lo, size_t *hi) {
  *lo = rows * (size_t)t / (size_t)nt;
  *hi = rows * (size_t)(t + 1) / (size_t)nt;
}

static int SUF(reduce)(beam_dm_t *e, void *buf, size_t nreal, int is_double, const char *what,
                       beam_diag_t *d) {
  if (!e->reduce)
    return 0;
  int rc = e->reduce(e->reduce_ctx, buf, nreal, is_double);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "ptycho: the reducer failed on the %s (%d)", what, rc);
  return 0;
}

/* (num + a x) / (den + a) over count pixels of each of `modes` arrays,
 * a = reg * max(den); pixels with den + a == 0 keep their value. */
static void SUF(divide)(R *x, const R *num, const R *den, size_t count, uint32_t modes,
                        double reg, int nt) {
  R mx = 0;
  for (size_t p = 0; p < count; p++)
    mx = den[p] > mx ? den[p] : mx;
  const R a = (R)(reg * (double)mx);
  for (uint32_t m = 0; m < modes; m++) {
    R *restrict xm = x + (size_t)m * count * 2;
    const R *restrict nm = num + (size_t)m * count * 2;
    for (size_t p = 0; p < count; p++) {
      R dd = den[p] + a;
      if (dd > 0) {
        xm[2 * p] = (nm[2 * p] + a * xm[2 * p]) / dd;
        xm[2 * p + 1] = (nm[2 * p + 1] + a * xm[2 * p + 1]) / dd;
      }
    }
  }
}

/* Object numerator and denominator, rows [lo, hi) (one thread's band). */
CLONES static void SUF(obj_band)(cpu_t *s, const beam_dm_conf_t *c, uint32_t nv, size_t lo,
                                 size_t hi) {
  const size_t n = c->n, npx = n * n, H = c->obj_h, W = c->obj_w, HW = H * W;
  const uint32_t MP = c->probe_modes, MO = c->object_modes, M = MP * MO;
  R *num = (R *)s->onum, *den = num + (size_t)MO * HW * 2;
  const R *pint = (const R *)s->pint, *probe = (const R *)s->probe;
  for (uint32_t k = 0; k < MO; k++)
    memset(num + ((size_t)k * HW + lo * W) * 2, 0, (hi - lo) * W * 2 * sizeof(R));
  memset(den + lo * W, 0, (hi - lo) * W * sizeof(R));
  for (uint32_t i = 0; i < nv; i++) {
    size_t pr = (size_t)s->pos[2 * i], pc = (size_t)s->pos[2 * i + 1];
    size_t y0 = pr > lo ? pr : lo, y1 = pr + n < hi ? pr + n : hi;
    if (y0 >= y1)
      continue;
    const R *psi = (const R *)s->psi + (size_t)i * M * npx * 2;
    for (size_t y = y0; y < y1; y++) {
      size_t yy = y - pr;
      R *restrict dr = den + y * W + pc;
      const R *restrict ir = pint + yy * n;
      for (size_t x = 0; x < n; x++)
        dr[x] += ir[x];
      for (uint32_t k = 0; k < MO; k++) {
        R *restrict nr = num + ((size_t)k * HW + y * W + pc) * 2;
        for (uint32_t j = 0; j < MP; j++) {
          const R *restrict P = probe + ((size_t)j * npx + yy * n) * 2;
          const R *restrict ps = psi + (((size_t)j * MO + k) * npx + yy * n) * 2;
          for (size_t x = 0; x < n; x++) {
            R a = P[2 * x], b = P[2 * x + 1], u = ps[2 * x], v = ps[2 * x + 1];
            nr[2 * x] += a * u + b * v; /* conj(P) psi */
            nr[2 * x + 1] += a * v - b * u;
          }
        }
      }
    }
  }
}

/* Probe numerator and denominator, probe rows [lo, hi). */
CLONES static void SUF(probe_band)(cpu_t *s, const beam_dm_conf_t *c, uint32_t nv, size_t lo,
                                   size_t hi) {
  const size_t n = c->n, npx = n * n, W = c->obj_w, HW = (size_t)c->obj_h * W;
  const uint32_t MP = c->probe_modes, MO = c->object_modes, M = MP * MO;
  R *num = (R *)s->pnum, *den = num + (size_t)MP * npx * 2;
  const R *obj = (const R *)s->obj;
  for (uint32_t j = 0; j < MP; j++)
    memset(num + ((size_t)j * npx + lo * n) * 2, 0, (hi - lo) * n * 2 * sizeof(R));
  memset(den + lo * n, 0, (hi - lo) * n * sizeof(R));
  for (uint32_t i = 0; i < nv; i++) {
    size_t pr = (size_t)s->pos[2 * i], pc = (size_t)s->pos[2 * i + 1];
    const R *psi = (const R *)s->psi + (size_t)i * M * npx * 2;
    for (size_t y = lo; y < hi; y++) {
      R *restrict dr = den + y * n;
      for (uint32_t k = 0; k < MO; k++) {
        const R *restrict O = obj + ((size_t)k * HW + (pr + y) * W + pc) * 2;
        for (size_t x = 0; x < n; x++)
          dr[x] += O[2 * x] * O[2 * x] + O[2 * x + 1] * O[2 * x + 1];
        for (uint32_t j = 0; j < MP; j++) {
          R *restrict nr = num + ((size_t)j * npx + y * n) * 2;
          const R *restrict ps = psi + (((size_t)j * MO + k) * npx + y * n) * 2;
          for (size_t x = 0; x < n; x++) {
            R a = O[2 * x], b = O[2 * x + 1], u = ps[2 * x], v = ps[2 * x + 1];
            nr[2 * x] += u * a + v * b; /* psi conj(O) */
            nr[2 * x + 1] += v * a - u * b;
          }
        }
      }
    }
  }
}

static int SUF(update_object)(beam_dm_t *e, cpu_t *s, beam_diag_t *d) {
  const beam_dm_conf_t *c = &e->conf;
  const size_t n = c->n, npx = n * n, H = c->obj_h, W = c->obj_w, HW = H * W;
  const uint32_t MP = c->probe_modes, MO = c->object_modes;
  const int nt = s->nt;
  const uint32_t nv = e->nviews;
  R *num = (R *)s->onum, *den = num + (size_t)MO * HW * 2;
  R *pint = (R *)s->pint;
  const R *probe = (const R *)s->probe;

  /* Small serial steps: on a shared machine every parallel region costs a
   * barrier that waits for the slowest (possibly descheduled) thread. */
  for (size_t p = 0; p < npx; p++) {
    R sum = 0;
    for (uint32_t j = 0; j < MP; j++) {
      R a = probe[((size_t)j * npx + p) * 2], b = probe[((size_t)j * npx + p) * 2 + 1];
      sum += a * a + b * b;
    }
    pint[p] = sum;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), tn = omp_get_num_threads();
    size_t lo, hi;
    SUF(band)(H, t, tn, &lo, &hi);
    SUF(obj_band)(s, c, nv, lo, hi);
  }
  int rc = SUF(reduce)(e, num, (size_t)MO * HW * 2 + HW, c->prec == BEAM_DM_F64,
                       "object numerator and denominator", d);
  if (rc < 0)
    return rc;
  SUF(divide)((R *)s->obj, num, den, HW, MO, c->obj_reg, nt);
  return 0;
}

static int SUF(update_probe)(beam_dm_t *e, cpu_t *s, beam_diag_t *d) {
  const beam_dm_conf_t *c = &e->conf;
  const size_t n = c->n, npx = n * n;
  const uint32_t MP = c->probe_modes;
  const int nt = s->nt;
  const uint32_t nv = e->nviews;
  R *num = (R *)s->pnum, *den = num + (size_t)MP * npx * 2;

#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), tn = omp_get_num_threads();
    size_t lo, hi;
    SUF(band)(n, t, tn, &lo, &hi);
    SUF(probe_band)(s, c, nv, lo, hi);
  }
  int rc = SUF(reduce)(e, num, (size_t)MP * npx * 2 + npx, c->prec == BEAM_DM_F64,
                       "probe numerator and denominator", d);
  if (rc < 0)
    return rc;
  R *P = (R *)s->probe;
  SUF(divide)(P, num, den, npx, MP, c->probe_reg, nt);
  if (c->probe_support > 0) {
    /* PtyPy's support: keep pi r^2 < support n^2, r from pixel (n/2, n/2). */
    const double lim = c->probe_support * (double)n * (double)n, h = (double)(n / 2);
    for (size_t y = 0; y < n; y++)
      for (size_t x = 0; x < n; x++) {
        double dy = (double)y - h, dx = (double)x - h;
        if (M_PI * (dy * dy + dx * dx) >= lim)
          for (uint32_t j = 0; j < MP; j++) {
            P[((size_t)j * npx + y * n + x) * 2] = 0;
            P[((size_t)j * npx + y * n + x) * 2 + 1] = 0;
          }
      }
  }
  return 0;
}

/* ||a - b|| / ||a|| over count complex values (0 when a is 0). */
static double SUF(change)(const R *a, const R *b, size_t count, int nt) {
  double dn = 0.0, an = 0.0;
  for (size_t q = 0; q < count * 2; q++) {
    double x = a[q], y = b[q];
    dn += (x - y) * (x - y);
    an += x * x;
  }
  return an > 0.0 ? sqrt(dn / an) : 0.0;
}

static int SUF(iterate)(beam_dm_t *e, int update_probe, beam_dm_metrics_t *m, beam_diag_t *d) {
  cpu_t *s = e->impl;
  const beam_dm_conf_t *c = &e->conf;
  const size_t n = c->n, npx = n * n;
  const size_t osz = (size_t)c->object_modes * c->obj_h * c->obj_w;
  const size_t psz = (size_t)c->probe_modes * npx;
  const uint32_t nv = e->nviews;
  const int nt = s->nt;

  double pbound = -1.0;
  if (c->fourier_relax > 0) {
    /* Views of this process only: under MPI each rank uses its own max
     * (a sum reducer cannot form a max; see docs/ptycho.md). */
    double mx = 0.0;
    for (uint32_t i = 0; i < nv; i++)
      mx = s->view_a2[i] > mx ? s->view_a2[i] : mx;
    pbound = 0.25 * c->fourier_relax * c->fourier_relax * mx / ((double)npx);
  }

#pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (uint32_t i = 0; i < nv; i++)
      SUF(ew_view)(s, c, i, tid, pbound, &s->view_err[i], &s->view_a2used[i]);
  }

  memcpy(s->obj_prev, s->obj, osz * 2 * sizeof(R));
  if (update_probe)
    memcpy(s->probe_prev, s->probe, psz * 2 * sizeof(R));
  for (uint32_t pass = 0; pass < c->inner_passes; pass++) {
    int rc = SUF(update_object)(e, s, d);
    if (rc < 0)
      return rc;
    if (update_probe && (rc = SUF(update_probe)(e, s, d)) < 0)
      return rc;
  }

  double sums[2] = {0.0, 0.0};
  for (uint32_t i = 0; i < nv; i++) { /* in view order: deterministic */
    sums[0] += s->view_err[i];
    sums[1] += s->view_a2used[i];
  }
  int rc = SUF(reduce)(e, sums, 2, 1, "metric sums", d);
  if (rc < 0)
    return rc;
  m->fourier_error = sums[1] > 0.0 ? sums[0] / sums[1] : 0.0;
  m->object_change = SUF(change)((const R *)s->obj, (const R *)s->obj_prev, osz, nt);
  m->probe_change =
      update_probe ? SUF(change)((const R *)s->probe, (const R *)s->probe_prev, psz, nt) : 0.0;
  return 0;
}

/* Exit waves of views [first, first + count) start as P_j W_i O_k. */
static void SUF(init_views)(beam_dm_t *e, cpu_t *s, uint32_t first, uint32_t count) {
  const beam_dm_conf_t *c = &e->conf;
  const size_t n = c->n, npx = n * n, W = c->obj_w, HW = (size_t)c->obj_h * W;
  const uint32_t MP = c->probe_modes, MO = c->object_modes, M = MP * MO;
  const R *probe = (const R *)s->probe, *obj = (const R *)s->obj;
#pragma omp parallel for num_threads(s->nt) schedule(static)
  for (uint32_t v = first; v < first + count; v++) {
    R *psi = (R *)s->psi + (size_t)v * M * npx * 2;
    size_t r0 = (size_t)s->pos[2 * v], c0 = (size_t)s->pos[2 * v + 1];
    for (uint32_t j = 0; j < MP; j++)
      for (uint32_t k = 0; k < MO; k++) {
        R *ps = psi + ((size_t)j * MO + k) * npx * 2;
        const R *P = probe + (size_t)j * npx * 2;
        for (size_t y = 0; y < n; y++) {
          const R *O = obj + ((size_t)k * HW + (r0 + y) * W + c0) * 2;
          for (size_t x = 0; x < n; x++) {
            R pr = P[(y * n + x) * 2], pi = P[(y * n + x) * 2 + 1];
            R orr = O[2 * x], oi = O[2 * x + 1];
            ps[(y * n + x) * 2] = pr * orr - pi * oi;
            ps[(y * n + x) * 2 + 1] = pr * oi + pi * orr;
          }
        }
      }
  }
}

static void SUF(from_double)(void *dst, const double *src, size_t nreal) {
  R *o = dst;
  for (size_t q = 0; q < nreal; q++)
    o[q] = (R)src[q];
}

static void SUF(to_double)(double *dst, const void *src, size_t nreal) {
  const R *in = src;
  for (size_t q = 0; q < nreal; q++)
    dst[q] = (double)in[q];
}

static int SUF(make_plans)(cpu_t *s, const beam_dm_conf_t *c) {
  int dims[2] = {(int)c->n, (int)c->n};
  int M = (int)(c->probe_modes * c->object_modes), dist = (int)(c->n * c->n);
  FFTW_(complex) *b = (FFTW_(complex) *)s->tbuf[0];
  s->plan_fwd = FFTW_(plan_many_dft)(2, dims, M, b, NULL, 1, dist, b, NULL, 1, dist,
                                     FFTW_FORWARD, s->fftw_flags);
  s->plan_inv = FFTW_(plan_many_dft)(2, dims, M, b, NULL, 1, dist, b, NULL, 1, dist,
                                     FFTW_BACKWARD, s->fftw_flags);
  return s->plan_fwd && s->plan_inv ? 0 : -1;
}

static void SUF(free_plans)(cpu_t *s) {
  if (s->plan_fwd)
    FFTW_(destroy_plan)((FFTW_(plan))s->plan_fwd);
  if (s->plan_inv)
    FFTW_(destroy_plan)((FFTW_(plan))s->plan_inv);
  s->plan_fwd = s->plan_inv = NULL;
}
