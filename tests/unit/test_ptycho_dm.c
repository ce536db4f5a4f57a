/* The DM engine's front end, CPU backend and set-up helpers: conf and
 * argument errors, frame preparation, placement, fixed points, zero-photon
 * views, the reducer's calls, divergence, initial probes, and the engine
 * against a plain loop-and-naive-DFT reference (below) on a small case.
 * tests/integration/test_ptycho_engine.py checks against numpy. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <complex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/ptycho/dm.h"
#include "pipeline/ptycho/setup.h"

typedef double complex cplx;

static beam_dm_conf_t base_conf(uint32_t n, uint32_t H, uint32_t W, uint32_t views) {
  beam_dm_conf_t c;
  beam_dm_conf_default(&c);
  c.n = n;
  c.obj_h = H;
  c.obj_w = W;
  c.max_views = views;
  c.threads = 2;
  return c;
}

/* ---- conf validation ------------------------------------------------- */

static void expect_bad(const beam_dm_conf_t *c, const char *field) {
  beam_dm_t *e = (beam_dm_t *)1;
  beam_diag_t d = {0};
  assert_int_equal(beam_dm_create(&e, c, BEAM_DM_CPU, &d), BEAM_EINVAL);
  assert_null(e);
  if (!strstr(d.msg, field))
    fail_msg("message \"%s\" does not name %s", d.msg, field);
  assert_int_equal(beam_dm_bytes(c), 0);
}

static void test_conf_validation(void **state) {
  beam_dm_conf_t c = base_conf(8, 16, 16, 4), b;
  assert_true(beam_dm_bytes(&c) > 0);
#define BAD(stmt, field) \
  b = c;                 \
  stmt;                  \
  expect_bad(&b, field)
  BAD(b.prec = 7, "conf.prec");
  BAD(b.n = 0, "conf.n");
  BAD(b.max_views = 0, "conf.max_views");
  BAD(b.obj_h = 7, "conf.obj_h");
  BAD(b.obj_w = 0, "conf.obj_w");
  BAD(b.probe_modes = 0, "conf.probe_modes");
  BAD(b.probe_modes = BEAM_DM_MAX_PROBE_MODES + 1, "conf.probe_modes");
  BAD(b.object_modes = BEAM_DM_MAX_OBJECT_MODES + 1, "conf.object_modes");
  BAD(b.beta = 0, "conf.beta");
  BAD(b.beta = 1.5, "conf.beta");
  BAD(b.beta = NAN, "conf.beta");
  BAD(b.obj_reg = -1e-3, "conf.obj_reg");
  BAD(b.probe_reg = NAN, "conf.probe_reg");
  BAD(b.inner_passes = 0, "conf.inner_passes");
  BAD(b.fourier_relax = -0.1, "conf.fourier_relax");
  BAD(b.probe_support = INFINITY, "conf.probe_support");
  BAD(b.threads = -1, "conf.threads");
  BAD(b.device = -1, "conf.device");
#undef BAD
  beam_dm_conf_default(&b);
  assert_int_equal(b.prec, BEAM_DM_F32);
  assert_true(b.beta == 1.0 && b.obj_reg == 1e-3 && b.probe_reg == 1e-3);
  assert_int_equal(b.probe_update_start, 2);
  assert_int_equal(b.inner_passes, 1);
  assert_int_equal(b.probe_modes, 1);
  assert_int_equal(b.object_modes, 1);
  assert_int_equal(b.n, 0);
  /* views that do not fit: the bytes needed and available, nothing made */
  for (int huge = 0; huge < 2; huge++) {
    beam_dm_t *e = (beam_dm_t *)1;
    beam_diag_t d = {0};
    b = base_conf(4096, 4096, 4096, huge ? 4000000000u : 100000u);
    assert_int_equal(beam_dm_create(&e, &b, BEAM_DM_CPU, &d), BEAM_ELIMIT);
    assert_null(e);
    if (!strstr(d.msg, "bytes"))
      fail_msg("message \"%s\" does not give the bytes", d.msg);
    assert_true(beam_dm_bytes(&b) > ((size_t)1 << 40));
  }
#if !BEAM_CUDA
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CUDA, &d), BEAM_ENOTSUP);
  assert_null(e);
  assert_non_null(strstr(d.msg, "without CUDA"));
#endif
}

/* ---- argument checks ------------------------------------------------- */

static void test_capacity_and_windows(void **state) {
  const uint32_t n = 8;
  beam_dm_conf_t c = base_conf(n, 20, 24, 3);
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
  float amp[4 * 64];
  for (int i = 0; i < 4 * 64; i++)
    amp[i] = 1.0f;
  beam_dm_metrics_t m;
  assert_int_equal(beam_dm_iterate(e, &m, &d), BEAM_ESTATE);
  assert_non_null(strstr(d.msg, "no views"));

  int32_t outside[4] = {0, 0, 13, 16}; /* second: rows 13..20 > 20 */
  beam_diag_clear(&d);
  assert_int_equal(beam_dm_add_views(e, 2, amp, outside, &d), BEAM_EINVAL);
  assert_non_null(strstr(d.msg, "view 1"));
  assert_int_equal(beam_dm_nviews(e), 0); /* nothing added */
  int32_t neg[2] = {0, -1};
  beam_diag_clear(&d);
  assert_int_equal(beam_dm_add_views(e, 1, amp, neg, &d), BEAM_EINVAL);

  amp[5] = NAN;
  int32_t ok[8] = {0, 0, 12, 16, 4, 4, 2, 2};
  beam_diag_clear(&d);
  assert_int_equal(beam_dm_add_views(e, 1, amp, ok, &d), BEAM_EINVAL);
  assert_non_null(strstr(d.msg, "not finite"));
  amp[5] = -1.0f;

  assert_int_equal(beam_dm_add_views(e, 2, amp, ok, &d), 0);
  assert_int_equal(beam_dm_nviews(e), 2);
  beam_diag_clear(&d);
  assert_int_equal(beam_dm_add_views(e, 2, amp, ok + 4, &d), BEAM_ELIMIT);
  assert_non_null(strstr(d.msg, "max_views"));
  assert_int_equal(beam_dm_nviews(e), 2);
  assert_int_equal(beam_dm_add_views(e, 1, amp, ok + 4, &d), 0);
  assert_int_equal(beam_dm_nviews(e), 3);

  double *probe = calloc(n * n * 2, sizeof(double));
  probe[0] = NAN;
  beam_diag_clear(&d);
  assert_int_equal(beam_dm_set_probe(e, probe, &d), BEAM_EINVAL);
  free(probe);

  assert_int_equal(beam_dm_iterate(e, &m, &d), 0);
  assert_int_equal(m.iteration, 0);
  assert_int_equal(beam_dm_iterations(e), 1);
  beam_dm_reset(e);
  assert_int_equal(beam_dm_nviews(e), 0);
  assert_int_equal(beam_dm_iterations(e), 0);
  assert_int_equal(beam_dm_add_views(e, 3, amp, ok, &d), 0);
  beam_dm_destroy(&e);
  assert_null(e);
  beam_dm_destroy(&e); /* NULL-safe */
}

/* ---- a plain reference: loops and a naive DFT ------------------------- */

/* Unitary 2-D DFT of n x n (sign -1 forward, +1 inverse), O(n^4). */
static void dft2(const cplx *in, cplx *out, int n, int sign) {
  for (int u = 0; u < n; u++)
    for (int v = 0; v < n; v++) {
      cplx s = 0;
      for (int y = 0; y < n; y++)
        for (int x = 0; x < n; x++)
          s += in[y * n + x] * cexp(sign * 2.0 * M_PI * I * ((double)u * y + (double)v * x) / n);
      out[u * n + v] = s / n;
    }
}

typedef struct {
  int n, H, W, MP, nv;
  const float *amp;
  const int32_t *pos;
  cplx *P, *O, *psi; /* MP x n x n, H x W, nv x MP x n x n (M_O = 1) */
  double beta, oreg, preg, relax;
} ref_t;

/* One iteration of dm.h with plain loops (M_O = 1, probe updated). */
static double ref_iterate(ref_t *r) {
  const int n = r->n, npx = n * n, MP = r->MP, W = r->W;
  cplx *phi = malloc(sizeof(cplx) * MP * npx), *Phi = malloc(sizeof(cplx) * MP * npx);
  cplx *tmp = malloc(sizeof(cplx) * npx);
  double *af = malloc(sizeof(double) * npx);
  double errs = 0, a2s = 0, mx = 0;
  for (int i = 0; i < r->nv; i++) {
    double s = 0;
    for (int p = 0; p < npx; p++)
      if (r->amp[i * npx + p] >= 0)
        s += (double)r->amp[i * npx + p] * r->amp[i * npx + p];
    mx = s > mx ? s : mx;
  }
  double pbound = 0.25 * r->relax * r->relax * mx / npx;
  for (int i = 0; i < r->nv; i++) {
    const float *A = r->amp + i * npx;
    int r0 = r->pos[2 * i], c0 = r->pos[2 * i + 1];
    cplx *psi = r->psi + (size_t)i * MP * npx;
    for (int j = 0; j < MP; j++) {
      for (int y = 0; y < n; y++)
        for (int x = 0; x < n; x++)
          phi[j * npx + y * n + x] = r->P[j * npx + y * n + x] * r->O[(r0 + y) * W + c0 + x];
      for (int p = 0; p < npx; p++)
        tmp[p] = 2 * phi[j * npx + p] - psi[j * npx + p];
      dft2(tmp, Phi + j * npx, n, -1);
    }
    double e = 0, a2 = 0;
    int nval = 0;
    for (int p = 0; p < npx; p++) {
      double s = 0;
      for (int j = 0; j < MP; j++)
        s += creal(Phi[j * npx + p] * conj(Phi[j * npx + p]));
      af[p] = sqrt(s);
      if (A[p] >= 0) {
        e += (af[p] - A[p]) * (af[p] - A[p]);
        a2 += (double)A[p] * A[p];
        nval++;
      }
    }
    errs += e;
    a2s += a2;
    double renorm = 0;
    int skip = 0;
    if (r->relax > 0) {
      if (e / nval > pbound)
        renorm = sqrt(pbound / (e / nval));
      else
        skip = 1;
    }
    for (int j = 0; j < MP; j++) {
      for (int p = 0; p < npx; p++) {
        double f = A[p] < 0 || skip ? 1.0 : (A[p] + (af[p] - A[p]) * renorm) / (af[p] + 1e-10);
        Phi[j * npx + p] *= f;
      }
      dft2(Phi + j * npx, tmp, n, +1);
      for (int p = 0; p < npx; p++)
        psi[j * npx + p] += r->beta * (tmp[p] - phi[j * npx + p]);
    }
  }
  /* object */
  cplx *num = calloc((size_t)r->H * W, sizeof(cplx));
  double *den = calloc((size_t)r->H * W, sizeof(double)), dmax = 0;
  for (int i = 0; i < r->nv; i++)
    for (int j = 0; j < MP; j++)
      for (int y = 0; y < n; y++)
        for (int x = 0; x < n; x++) {
          int q = (r->pos[2 * i] + y) * W + r->pos[2 * i + 1] + x;
          cplx P = r->P[j * npx + y * n + x];
          num[q] += conj(P) * r->psi[((size_t)i * MP + j) * npx + y * n + x];
          den[q] += creal(P * conj(P));
        }
  for (int q = 0; q < r->H * W; q++)
    dmax = den[q] > dmax ? den[q] : dmax;
  for (int q = 0; q < r->H * W; q++)
    if (den[q] + r->oreg * dmax > 0)
      r->O[q] = (num[q] + r->oreg * dmax * r->O[q]) / (den[q] + r->oreg * dmax);
  /* probe, with the new object */
  cplx *pn = calloc((size_t)MP * npx, sizeof(cplx));
  double *pd = calloc(npx, sizeof(double)), pmax = 0;
  for (int i = 0; i < r->nv; i++)
    for (int y = 0; y < n; y++)
      for (int x = 0; x < n; x++) {
        cplx o = r->O[(r->pos[2 * i] + y) * W + r->pos[2 * i + 1] + x];
        pd[y * n + x] += creal(o * conj(o));
        for (int j = 0; j < MP; j++)
          pn[j * npx + y * n + x] += r->psi[((size_t)i * MP + j) * npx + y * n + x] * conj(o);
      }
  for (int p = 0; p < npx; p++)
    pmax = pd[p] > pmax ? pd[p] : pmax;
  for (int j = 0; j < MP; j++)
    for (int p = 0; p < npx; p++)
      r->P[j * npx + p] = (pn[j * npx + p] + r->preg * pmax * r->P[j * npx + p]) /
                          (pd[p] + r->preg * pmax);
  free(phi);
  free(Phi);
  free(tmp);
  free(af);
  free(num);
  free(den);
  free(pn);
  free(pd);
  return errs / a2s;
}

static double urand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return ((*s >> 8) & 0xffff) / 65536.0;
}

/* A small random problem, M_O = 1: amplitudes of a random object and probe,
 * a masked block, a start away from the answer. */
static void small_problem(int n, int H, int W, int MP, int nv, float *amp, int32_t *pos,
                          cplx *P0, cplx *O0, unsigned seed) {
  int npx = n * n;
  cplx *Pt = malloc(sizeof(cplx) * MP * npx), *Ot = malloc(sizeof(cplx) * H * W);
  cplx *ex = malloc(sizeof(cplx) * npx), *F = malloc(sizeof(cplx) * npx);
  for (int j = 0; j < MP; j++)
    for (int y = 0; y < n; y++)
      for (int x = 0; x < n; x++) {
        double g = exp(-((y - n / 2) * (y - n / 2) + (x - n / 2) * (x - n / 2)) / 6.0);
        Pt[j * npx + y * n + x] = 10 * g * cexp(I * 0.3 * (x + j * y)) / (1 + j);
        P0[j * npx + y * n + x] = Pt[j * npx + y * n + x] * (0.8 + 0.1 * j);
      }
  for (int q = 0; q < H * W; q++) {
    Ot[q] = (0.7 + 0.3 * urand(&seed)) * cexp(I * (urand(&seed) - 0.5));
    O0[q] = 1.0;
  }
  for (int i = 0; i < nv; i++) {
    pos[2 * i] = (int32_t)(urand(&seed) * (H - n + 1));
    pos[2 * i + 1] = (int32_t)(urand(&seed) * (W - n + 1));
    for (int p = 0; p < npx; p++)
      amp[i * npx + p] = 0;
    for (int j = 0; j < MP; j++) {
      for (int y = 0; y < n; y++)
        for (int x = 0; x < n; x++)
          ex[y * n + x] = Pt[j * npx + y * n + x] * Ot[(pos[2 * i] + y) * W + pos[2 * i + 1] + x];
      dft2(ex, F, n, -1);
      for (int p = 0; p < npx; p++)
        amp[i * npx + p] += (float)creal(F[p] * conj(F[p]));
    }
    for (int p = 0; p < npx; p++)
      amp[i * npx + p] = sqrtf(amp[i * npx + p]);
  }
  amp[1] = amp[2] = amp[n + 1] = -1.0f; /* masked */
  free(Pt);
  free(Ot);
  free(ex);
  free(F);
}

static void test_against_plain_reference(void **state) {
  const int n = 8, H = 14, W = 13, MP = 2, nv = 5, npx = n * n;
  float amp[5 * 64];
  int32_t pos[10];
  cplx P[2 * 64], O[14 * 13];
  small_problem(n, H, W, MP, nv, amp, pos, P, O, 7u);
  for (int relax = 0; relax < 2; relax++) {
    beam_dm_conf_t c = base_conf(n, H, W, nv);
    c.prec = BEAM_DM_F64;
    c.probe_modes = MP;
    c.probe_update_start = 0;
    c.beta = 0.9;
    c.obj_reg = 2e-3;
    c.probe_reg = 5e-3;
    c.fourier_relax = relax ? 0.05 : 0;
    beam_dm_t *e = NULL;
    beam_diag_t d = {0};
    assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
    assert_int_equal(beam_dm_set_probe(e, (const double *)P, &d), 0);
    assert_int_equal(beam_dm_set_object(e, (const double *)O, &d), 0);
    assert_int_equal(beam_dm_add_views(e, nv, amp, pos, &d), 0);
    ref_t r = {n, H, W, MP, nv, amp, pos, NULL, NULL, NULL, 0.9, 2e-3, 5e-3, c.fourier_relax};
    r.P = malloc(sizeof P);
    r.O = malloc(sizeof O);
    r.psi = malloc(sizeof(cplx) * nv * MP * npx);
    memcpy(r.P, P, sizeof P);
    memcpy(r.O, O, sizeof O);
    for (int i = 0; i < nv; i++)
      for (int j = 0; j < MP; j++)
        for (int y = 0; y < n; y++)
          for (int x = 0; x < n; x++)
            r.psi[((size_t)i * MP + j) * npx + y * n + x] =
                P[j * npx + y * n + x] * O[(pos[2 * i] + y) * W + pos[2 * i + 1] + x];
    cplx gotP[2 * 64], gotO[14 * 13];
    for (int it = 0; it < 4; it++) {
      beam_dm_metrics_t m;
      assert_int_equal(beam_dm_iterate(e, &m, &d), 0);
      double fe = ref_iterate(&r);
      if (!(fabs(m.fourier_error - fe) <= 1e-10 * fe))
        fail_msg("relax %d it %d: fourier error %.17g vs reference %.17g", relax, it,
                 m.fourier_error, fe);
    }
    assert_int_equal(beam_dm_get_probe(e, (double *)gotP, &d), 0);
    assert_int_equal(beam_dm_get_object(e, (double *)gotO, &d), 0);
    double dp = 0, np_ = 0, dob = 0, no = 0;
    for (int p = 0; p < MP * npx; p++) {
      dp += cabs(gotP[p] - r.P[p]) * cabs(gotP[p] - r.P[p]);
      np_ += cabs(r.P[p]) * cabs(r.P[p]);
    }
    for (int q = 0; q < H * W; q++) {
      dob += cabs(gotO[q] - r.O[q]) * cabs(gotO[q] - r.O[q]);
      no += cabs(r.O[q]) * cabs(r.O[q]);
    }
    if (!(sqrt(dp / np_) <= 1e-10 && sqrt(dob / no) <= 1e-10))
      fail_msg("relax %d: probe %.3g object %.3g relative difference", relax, sqrt(dp / np_),
               sqrt(dob / no));
    free(r.P);
    free(r.O);
    free(r.psi);
    beam_dm_destroy(&e);
  }
}

/* ---- fixed point and zero-photon views -------------------------------- */

/* A view whose data is |F(P W O)| with the true P and O is a fixed point:
 * the exit wave is not changed, nor the object, and the Fourier error is 0. */
static void test_fixed_point(void **state) {
  const int n = 8, npx = n * n;
  cplx P[64], O[64], F[64], ex[64];
  unsigned s = 3;
  for (int p = 0; p < npx; p++) {
    P[p] = (1 + urand(&s)) * cexp(I * urand(&s));
    O[p] = (0.5 + urand(&s)) * cexp(I * 2 * urand(&s));
    ex[p] = P[p] * O[p];
  }
  dft2(ex, F, n, -1);
  float amp[64];
  for (int p = 0; p < npx; p++)
    amp[p] = (float)cabs(F[p]);
  for (int prec = 0; prec < 2; prec++) {
    beam_dm_conf_t c = base_conf(n, n, n, 1);
    c.prec = prec ? BEAM_DM_F64 : BEAM_DM_F32;
    c.probe_update_start = 1;
    beam_dm_t *e = NULL;
    beam_diag_t d = {0};
    assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
    assert_int_equal(beam_dm_set_probe(e, (double *)P, &d), 0);
    /* amp is float: the fixed point is that of the rounded data, so the
     * object is the one whose |F(P O)| the float data are. */
    assert_int_equal(beam_dm_set_object(e, (double *)O, &d), 0);
    int32_t pos[2] = {0, 0};
    assert_int_equal(beam_dm_add_views(e, 1, amp, pos, &d), 0);
    double tol = prec ? 1e-7 : 1e-5; /* float data: |F| rounded to 6e-8 */
    for (int it = 0; it < 3; it++) {
      beam_dm_metrics_t m;
      assert_int_equal(beam_dm_iterate(e, &m, &d), 0);
      if (!(m.fourier_error <= tol * tol && m.object_change <= tol && m.probe_change <= tol))
        fail_msg("prec %d it %d: fourier %.3g object change %.3g probe change %.3g", prec, it,
                 m.fourier_error, m.object_change, m.probe_change);
      assert_true(it >= 1 || m.probe_change == 0.0);
    }
    cplx got[64];
    assert_int_equal(beam_dm_get_object(e, (double *)got, &d), 0);
    for (int p = 0; p < npx; p++)
      assert_true(cabs(got[p] - O[p]) <= 10 * tol * cabs(O[p]));
    beam_dm_destroy(&e);
  }
}

/* A view without photons carries no information: it leaves the object as
 * it is (psi <- phi, so conj(P) psi / |P|^2 = O) and stays out of the
 * Fourier error. */
static void test_zero_photon_view(void **state) {
  const int n = 8, H = 14, W = 13, MP = 1, nv = 5, npx = n * n;
  float amp[6 * 64];
  int32_t pos[12];
  cplx P[64], O[14 * 13];
  small_problem(n, H, W, MP, nv, amp, pos, P, O, 11u);
  for (int mode = 0; mode < 2; mode++) {
    float empty[64];
    for (int p = 0; p < npx; p++)
      empty[p] = mode ? -1.0f : 0.0f; /* all zero counts, or all masked */
    empty[3] = mode ? 0.0f : -1.0f;
    double fe[2];
    for (int with = 0; with < 2; with++) {
      beam_dm_conf_t c = base_conf(n, H, W, nv + 1);
      c.prec = BEAM_DM_F64;
      beam_dm_t *e = NULL;
      beam_diag_t d = {0};
      assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
      assert_int_equal(beam_dm_set_probe(e, (double *)P, &d), 0);
      assert_int_equal(beam_dm_add_views(e, nv, amp, pos, &d), 0);
      int32_t zp[2] = {3, 2};
      if (with)
        assert_int_equal(beam_dm_add_views(e, 1, empty, zp, &d), 0);
      beam_dm_metrics_t m;
      assert_int_equal(beam_dm_iterate(e, &m, &d), 0);
      fe[with] = m.fourier_error;
      beam_dm_destroy(&e);
    }
    assert_true(fe[0] > 0 && fe[0] == fe[1]);
  }
  /* Alone, an empty view changes nothing: object kept, error 0. */
  beam_dm_conf_t c = base_conf(n, n, n, 1);
  c.prec = BEAM_DM_F64;
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
  cplx O8[64];
  for (int p = 0; p < npx; p++)
    O8[p] = 0.5 + 0.25 * I * p / npx;
  assert_int_equal(beam_dm_set_probe(e, (double *)P, &d), 0);
  assert_int_equal(beam_dm_set_object(e, (double *)O8, &d), 0);
  float zero[64] = {0};
  int32_t z[2] = {0, 0};
  assert_int_equal(beam_dm_add_views(e, 1, zero, z, &d), 0);
  beam_dm_metrics_t m;
  for (int it = 0; it < 3; it++) {
    assert_int_equal(beam_dm_iterate(e, &m, &d), 0);
    assert_true(m.fourier_error == 0.0);
    assert_true(m.object_change <= 1e-14);
  }
  beam_dm_destroy(&e);
}

/* ---- the reducer ------------------------------------------------------ */

typedef struct {
  int calls;
  size_t nreal[32];
  int is_double[32];
  int fail_at; /* call index that fails, -1: none */
  int times2;  /* multiply by 2 (two identical ranks) */
} red_t;

static int reducer(void *ctx, void *buf, size_t nreal, int is_double) {
  red_t *r = ctx;
  if (r->calls < 32) {
    r->nreal[r->calls] = nreal;
    r->is_double[r->calls] = is_double;
  }
  if (r->calls++ == r->fail_at)
    return BEAM_EIO;
  if (r->times2)
    for (size_t q = 0; q < nreal; q++) {
      if (is_double)
        ((double *)buf)[q] *= 2;
      else
        ((float *)buf)[q] *= 2;
    }
  return 0;
}

static void test_reducer_order(void **state) {
  const int n = 8, H = 14, W = 13, MP = 2, nv = 5, npx = n * n;
  float amp[5 * 64];
  int32_t pos[10];
  cplx P[2 * 64], O[14 * 13];
  small_problem(n, H, W, MP, nv, amp, pos, P, O, 5u);
  const size_t onr = (size_t)H * W * 2 + (size_t)H * W, pnr = (size_t)MP * npx * 2 + npx;
  cplx outP[2][2 * 64], outO[2][14 * 13];
  double fe[2];
  for (int times2 = 0; times2 < 2; times2++) {
    beam_dm_conf_t c = base_conf(n, H, W, nv);
    c.probe_modes = MP;
    c.probe_update_start = 1;
    c.inner_passes = 2;
    beam_dm_t *e = NULL;
    beam_diag_t d = {0};
    assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
    assert_int_equal(beam_dm_set_probe(e, (double *)P, &d), 0);
    assert_int_equal(beam_dm_add_views(e, nv, amp, pos, &d), 0);
    red_t r = {0};
    r.fail_at = -1;
    r.times2 = times2;
    beam_dm_set_reducer(e, reducer, &r);
    beam_dm_metrics_t m;
    assert_int_equal(beam_dm_iterate(e, &m, &d), 0); /* object only */
    assert_int_equal(r.calls, 3);
    assert_int_equal(r.nreal[0], onr);
    assert_int_equal(r.nreal[1], onr);
    assert_int_equal(r.nreal[2], 2);
    assert_true(!r.is_double[0] && !r.is_double[1] && r.is_double[2]); /* f32 engine */
    assert_int_equal(beam_dm_iterate(e, &m, &d), 0); /* object, probe, twice */
    assert_int_equal(r.calls, 8);
    size_t want[5] = {onr, pnr, onr, pnr, 2};
    for (int k = 0; k < 5; k++)
      assert_int_equal(r.nreal[3 + k], want[k]);
    fe[times2] = m.fourier_error;
    assert_int_equal(beam_dm_get_probe(e, (double *)outP[times2], &d), 0);
    assert_int_equal(beam_dm_get_object(e, (double *)outO[times2], &d), 0);

    /* a failing reducer fails the iteration, which then does not count */
    r.fail_at = r.calls + 1;
    beam_diag_clear(&d);
    assert_int_equal(beam_dm_iterate(e, &m, &d), BEAM_EIO);
    assert_non_null(strstr(d.msg, "probe"));
    assert_int_equal(beam_dm_iterations(e), 2);
    beam_dm_destroy(&e);
  }
  /* Doubling every sum (two identical ranks) gives the same result: the
   * regularisers are relative, and x2 is exact. */
  assert_true(fe[0] == fe[1]);
  assert_memory_equal(outP[0], outP[1], sizeof outP[0]);
  assert_memory_equal(outO[0], outO[1], sizeof outO[0]);
}

/* ---- probe support ---------------------------------------------------- */

static void test_probe_support(void **state) {
  const int n = 8, H = 14, W = 13, nv = 5, npx = n * n;
  float amp[5 * 64];
  int32_t pos[10];
  cplx P[64], O[14 * 13];
  small_problem(n, H, W, 1, nv, amp, pos, P, O, 9u);
  beam_dm_conf_t c = base_conf(n, H, W, nv);
  c.probe_update_start = 0;
  c.probe_support = 0.3;
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_dm_create(&e, &c, BEAM_DM_CPU, &d), 0);
  assert_int_equal(beam_dm_set_probe(e, (double *)P, &d), 0);
  assert_int_equal(beam_dm_add_views(e, nv, amp, pos, &d), 0);
  beam_dm_metrics_t m;
  assert_int_equal(beam_dm_iterate(e, &m, &d), 0);
  cplx got[64];
  assert_int_equal(beam_dm_get_probe(e, (double *)got, &d), 0);
  int inside = 0;
  for (int y = 0; y < n; y++)
    for (int x = 0; x < n; x++) {
      double r2 = (y - n / 2) * (y - n / 2) + (x - n / 2) * (x - n / 2);
      if (M_PI * r2 >= 0.3 * npx)
        assert_true(got[y * n + x] == 0);
      else
        inside += got[y * n + x] != 0;
    }
  assert_true(inside > 10);
  beam_dm_destroy(&e);
}

/* ---- diverged --------------------------------------------------------- */

static void test_diverged(void **state) {
  beam_dm_metrics_t h[10];
  memset(h, 0, sizeof h);
  for (int i = 0; i < 10; i++)
    h[i].fourier_error = 1.0 / (i + 1);
  assert_int_equal(beam_dm_diverged(h, 10, 10.0), 0);
  assert_int_equal(beam_dm_diverged(h, 0, 10.0), 0);
  h[7].fourier_error = 2.0; /* 16 x the minimum 1/7 */
  assert_int_equal(beam_dm_diverged(h, 10, 10.0), 1);
  assert_int_equal(beam_dm_diverged(h, 10, 20.0), 0);
  h[7].fourier_error = 0.1;
  h[3].fourier_error = 100.0; /* early: not judged before 5 iterations */
  assert_int_equal(beam_dm_diverged(h, 10, 10.0), 0);
  h[9].object_change = NAN;
  assert_int_equal(beam_dm_diverged(h, 10, 10.0), 1);
  assert_int_equal(beam_dm_diverged(h, 9, 10.0), 0);
  h[0].fourier_error = INFINITY;
  assert_int_equal(beam_dm_diverged(h, 1, 10.0), 1);
}

/* ---- set-up: frames, placement, probes, error ------------------------- */

static void test_prep_frame(void **state) {
  /* 6 x 7 u16 ramp v = 10 r + c; n = 4 centred on (3, 3): window rows 1..4,
   * cols 1..4; FFT order puts window (2, 2) = frame (3, 3) at [0, 0]. */
  uint16_t f[42];
  for (int r = 0; r < 6; r++)
    for (int c = 0; c < 7; c++)
      f[r * 7 + c] = (uint16_t)(10 * r + c);
  uint8_t mask[42] = {0};
  mask[2 * 7 + 3] = 1; /* frame (2, 3) = window (1, 2) -> out (3, 0) */
  float amp[16];
  double s = beam_ptycho_prep_frame(f, BEAM_DT_U16, 6, 7, 3.2, 2.8, 4, mask, amp);
  double want = 0;
  for (int u = 0; u < 4; u++)
    for (int v = 0; v < 4; v++) {
      int fr = 1 + u, fc = 1 + v, orow = (u + 2) % 4, ocol = (v + 2) % 4;
      float a = amp[orow * 4 + ocol];
      if (fr == 2 && fc == 3) {
        assert_true(a == -1.0f);
        continue;
      }
      assert_float_equal(a, sqrt(10.0 * fr + fc), 1e-6);
      want += 10 * fr + fc;
    }
  assert_float_equal(amp[0], sqrt(33.0), 1e-6);
  assert_float_equal(s, want, 1e-9);

  /* near the edge: outside pixels masked; negative and NaN counts masked */
  float fl[42];
  for (int i = 0; i < 42; i++)
    fl[i] = 4.0f;
  fl[0] = -2.0f;
  fl[1] = NAN;
  s = beam_ptycho_prep_frame(fl, BEAM_DT_F32, 6, 7, 0.0, 0.0, 4, NULL, amp);
  /* window rows -2..1, cols -2..1: valid frame pixels (0..1, 0..1) less two */
  int valid = 0;
  for (int p = 0; p < 16; p++)
    valid += amp[p] >= 0;
  assert_int_equal(valid, 2);
  assert_float_equal(s, 8.0, 1e-12);
  assert_true(amp[0] == -1.0f); /* frame (0, 0): negative */
  assert_float_equal(amp[1 * 4 + 1], 2.0, 1e-6); /* frame (1, 1) = window (3, 3) */
  int32_t i32[42];
  for (int i = 0; i < 42; i++)
    i32[i] = i % 3 - 1;
  s = beam_ptycho_prep_frame(i32, BEAM_DT_I32, 6, 7, 3, 3, 4, NULL, amp);
  assert_true(s >= 0);
  for (int p = 0; p < 16; p++)
    assert_true(amp[p] == -1.0f || amp[p] == 0.0f || amp[p] == 1.0f);
  assert_true(beam_ptycho_prep_frame(f, BEAM_DT_C64, 6, 7, 3, 3, 4, NULL, amp) < 0);
}

static void test_place(void **state) {
  double pos[8] = {2.49, 10.0, 2.5, -0.5, 7.0, 3.2, -1.51, 0.0};
  int32_t rc[8];
  double frac[8];
  beam_ptycho_geom_t g;
  beam_diag_t d = {0};
  assert_int_equal(beam_ptycho_place(pos, 4, 0.0, 8, 2, 1000, rc, frac, &g, &d), 0);
  /* rounded y: 2, 3, 7, -2 -> min -2; rounded x: 10, 0, 3, 0 -> min 0.
   * row = ry - (-2) + margin, col = rx - 0 + margin. */
  int32_t want[8] = {6, 12, 7, 2, 11, 5, 2, 2};
  assert_memory_equal(rc, want, sizeof want);
  assert_int_equal(g.obj_h, 7 - (-2) + 8 + 4);
  assert_int_equal(g.obj_w, 10 + 8 + 4);
  assert_float_equal(frac[0], 0.49, 1e-12);
  assert_float_equal(frac[2], -0.5, 1e-12);
  assert_float_equal(frac[6], 0.49, 1e-12);
  /* place_one agrees with place */
  for (int i = 0; i < 4; i++) {
    int32_t r, c;
    assert_int_equal(beam_ptycho_place_one(&g, pos[2 * i], pos[2 * i + 1], &r, &c, &d), 0);
    assert_int_equal(r, rc[2 * i]);
    assert_int_equal(c, rc[2 * i + 1]);
  }
  int32_t r, c;
  beam_diag_clear(&d);
  assert_int_equal(beam_ptycho_place_one(&g, -10.0, 0.0, &r, &c, &d), BEAM_EINVAL);
  assert_non_null(strstr(d.msg, "outside"));
  /* metres */
  double pm[4] = {0.0, 0.0, 1e-6, -2e-6};
  assert_int_equal(beam_ptycho_place(pm, 2, 1e-7, 8, 0, 1000, rc, NULL, &g, &d), 0);
  assert_int_equal(rc[2] - rc[0], 10);
  assert_int_equal(rc[1] - rc[3], 20);
  assert_float_equal(g.pixel_m, 1e-7, 0);
  /* errors name the index */
  pos[5] = NAN;
  beam_diag_clear(&d);
  assert_int_equal(beam_ptycho_place(pos, 4, 0.0, 8, 2, 1000, rc, frac, &g, &d), BEAM_EINVAL);
  assert_non_null(strstr(d.msg, "position 2"));
  pos[5] = 3.2;
  beam_diag_clear(&d);
  assert_int_equal(beam_ptycho_place(pos, 4, 0.0, 8, 2, 20, rc, frac, &g, &d), BEAM_EINVAL);
  assert_non_null(strstr(d.msg, "limit 20"));
}

static double cpower(const double *a, size_t count) {
  double s = 0;
  for (size_t q = 0; q < 2 * count; q++)
    s += a[q] * a[q];
  return s;
}

static void test_probes(void **state) {
  const uint32_t n = 32, npx = n * n, M = 3;
  double *out = malloc(sizeof(double) * 2 * npx * M);
  float mean[32 * 32];
  for (uint32_t y = 0; y < n; y++)
    for (uint32_t x = 0; x < n; x++) {
      int fy = y < n / 2 ? (int)y : (int)y - (int)n, fx = x < n / 2 ? (int)x : (int)x - (int)n;
      mean[y * n + x] = fy * fy + fx * fx < 36 ? 5.0f : 0.0f; /* a pupil, FFT order */
    }
  mean[5] = -1.0f;
  beam_diag_t d = {0};
  assert_int_equal(beam_ptycho_probe_from_mean(mean, n, M, 1e6, out, &d), 0);
  assert_float_equal(cpower(out, npx * M), 1e6, 1e-3);
  /* a real symmetric pupil -> the focus peaks at the centre */
  double peak = 0;
  uint32_t at = 0;
  for (uint32_t p = 0; p < npx; p++) {
    double v = out[2 * p] * out[2 * p] + out[2 * p + 1] * out[2 * p + 1];
    if (v > peak) {
      peak = v;
      at = p;
    }
  }
  assert_int_equal(at, (n / 2) * n + n / 2);
  /* modes orthogonal, power fractions 1 : 0.1 : 0.05 */
  double p0 = cpower(out, npx), p1 = cpower(out + 2 * npx, npx), p2 = cpower(out + 4 * npx, npx);
  assert_float_equal(p1 / p0, 0.1, 1e-9);
  assert_float_equal(p2 / p0, 0.05, 1e-9);
  for (uint32_t a = 0; a < M; a++)
    for (uint32_t b = a + 1; b < M; b++) {
      double re = 0, im = 0;
      const double *x = out + 2 * npx * a, *y = out + 2 * npx * b;
      for (uint32_t p = 0; p < npx; p++) {
        re += x[2 * p] * y[2 * p] + x[2 * p + 1] * y[2 * p + 1];
        im += x[2 * p] * y[2 * p + 1] - x[2 * p + 1] * y[2 * p];
      }
      assert_true(hypot(re, im) <= 1e-9 * sqrt(cpower(x, npx) * cpower(y, npx)));
    }
  /* zone plate: 8.8 keV, 160 um, 30 nm zones, 60 um stop, 20 nm pixels */
  assert_int_equal(beam_ptycho_probe_zone_plate(n, 20e-9, 8800, 160e-6, 30e-9, 60e-6, 50e-6, 1,
                                                2e5, out, &d),
                   0);
  assert_float_equal(cpower(out, npx), 2e5, 1e-6);
  beam_diag_clear(&d);
  assert_int_equal(beam_ptycho_probe_zone_plate(n, 20e-9, 8800, 160e-6, 30e-9, 200e-6, 0, 1,
                                                2e5, out, &d),
                   BEAM_EINVAL);
  beam_diag_clear(&d);
  assert_int_equal(beam_ptycho_probe_from_mean(mean, n, 0, 1e6, out, &d), BEAM_EINVAL);
  free(out);
  assert_float_equal(beam_ptycho_wavelength(12398.4198), 1e-10, 1e-18);
  assert_float_equal(beam_ptycho_obj_pixel(12398.4198, 2.0, 75e-6, 128), 1e-10 * 2 / (128 * 75e-6),
                     1e-20);
  assert_true(beam_ptycho_obj_pixel(0, 2, 75e-6, 128) == 0);
}

static void test_rel_error(void **state) {
  double a[2 * 12], b[2 * 12];
  for (int p = 0; p < 12; p++) {
    b[2 * p] = cos(p);
    b[2 * p + 1] = sin(0.5 * p);
    /* a = b / (2 e^{i 0.7}) */
    cplx z = (b[2 * p] + I * b[2 * p + 1]) / (2 * cexp(0.7 * I));
    a[2 * p] = creal(z);
    a[2 * p + 1] = cimag(z);
  }
  assert_true(beam_ptycho_rel_error(a, b, 3, 4, 0, 3, 0, 4) <= 1e-14);
  a[2 * 5] += 1.0; /* a pixel outside rows [0, 1) */
  assert_true(beam_ptycho_rel_error(a, b, 3, 4, 0, 1, 0, 4) <= 1e-14);
  assert_true(beam_ptycho_rel_error(a, b, 3, 4, 0, 3, 0, 4) > 0.05);
  memset(a, 0, sizeof a);
  assert_float_equal(beam_ptycho_rel_error(a, b, 3, 4, 0, 3, 0, 4), 1.0, 1e-14);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_conf_validation),  cmocka_unit_test(test_capacity_and_windows),
      cmocka_unit_test(test_against_plain_reference), cmocka_unit_test(test_fixed_point),
      cmocka_unit_test(test_zero_photon_view), cmocka_unit_test(test_reducer_order),
      cmocka_unit_test(test_probe_support),    cmocka_unit_test(test_diverged),
      cmocka_unit_test(test_prep_frame),       cmocka_unit_test(test_place),
      cmocka_unit_test(test_probes),           cmocka_unit_test(test_rel_error),
  };
  return beam_run_tests(tests, NULL, NULL);
}
