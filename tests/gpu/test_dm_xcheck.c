/* CPU vs CUDA DM engine (pipeline/ptycho/dm.h) on the same small problems:
 * 81 views of 32 x 32 on a jittered raster (~70% overlap) of a 120 x 120
 * phase-and-amplitude object; amplitudes (whole photons) from a known
 * probe (1 to 3 modes) and object by a plain DFT; a masked beam stop plus
 * 1% scattered masked pixels; one view with no photons. Two cases install
 * a reducer that maps every sum x to 2 x + 1e-3 (doubling alone would be
 * invisible: the updates are ratios), so a buffer not copied back or laid
 * out differently shows, and check that both engines call it with the same
 * sizes in the same order (the order dm.h states). Each case runs
 * both engines for ITERS iterations from the same start (probe updates from
 * iteration 2, so both branches run) and compares, with `!(diff <= bound)`
 * so NaN fails:
 *   fourier_error per iteration       |g - c| <= tol |c|
 *   object_change, probe_change       |g - c| <= 2 tol (absolute: a change
 *     is ||X - X_prev|| / ||X||; perturbing X and X_prev by a relative tol
 *     each moves it by at most about 2 tol)
 *   final probe, norm-wise            ||g - c|| / ||c|| <= tol
 *   final object, norm-wise           ||g - c|| / ||c|| <= tol_obj
 * f64: tol = tol_obj = 1e-10. f32: tol = 1e-4, tol_obj = 2e-3.
 * Why: FFTW vs cuFFT and atomics summing in another order differ in the
 * last bits, and DM amplifies such differences. Measured on this problem
 * with the CPU engine alone (f32 run vs f64 run, i.e. a float-epsilon
 * perturbation, 10 iterations): fourier_error 6e-7 relative, changes 3e-6,
 * probe 1e-5, object 2.4e-4 (a ~3000-fold amplification, mostly at the
 * scan's edge pixels that the probe barely lights, where O = num / (den +
 * a) with den ~ a). Scaled to double epsilon that is < 1e-12, so 1e-10
 * leaves 100x; the f32 bounds leave 8-10x. With fourier_relax on, a view
 * whose error sits within rounding of the power bound could take the other
 * branch in f32; that is far below a percent here, and the data are fixed.
 * Without a GPU the CUDA engine must refuse at create (ENOTSUP, a message
 * saying why) and the test skips. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "pipeline/ptycho/dm.h"
#include "tests/common/stage_harness.h"

#define N 32
#define GRID 9
#define STEP 10
#define OBJ 120
#define NV (GRID * GRID)
#define EMPTY_VIEW 40
#define ITERS 10
#define MAXM 3

typedef struct prob_s {
  float amp[MAXM][NV * N * N]; /* amp[m - 1]: data of the first m true modes */
  int32_t pos[NV * 2];
  double probe[MAXM * N * N * 2]; /* initial guess, MAXM modes */
  double obj2[2 * OBJ * OBJ * 2]; /* initial object for 2 object modes */
} prob_t;

static prob_t *prob;

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double urand(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}

/* Unitary 2-D DFT of an n x n complex array (interleaved), in place. */
static void dft2(double *a) {
  static double tw[N * 2];
  for (int k = 0; k < N; k++) {
    tw[2 * k] = cos(-2 * M_PI * k / N);
    tw[2 * k + 1] = sin(-2 * M_PI * k / N);
  }
  double tmp[N * 2];
  for (int pass = 0; pass < 2; pass++)
    for (int r = 0; r < N; r++) {
      /* pass 0: rows (stride 1), pass 1: columns (stride N) */
      size_t base = pass ? (size_t)r : (size_t)r * N, stride = pass ? N : 1;
      for (int u = 0; u < N; u++) {
        double sr = 0, si = 0;
        for (int x = 0; x < N; x++) {
          const double *v = a + 2 * (base + x * stride), *w = tw + 2 * ((u * x) % N);
          sr += v[0] * w[0] - v[1] * w[1];
          si += v[0] * w[1] + v[1] * w[0];
        }
        tmp[2 * u] = sr / sqrt((double)N);
        tmp[2 * u + 1] = si / sqrt((double)N);
      }
      for (int u = 0; u < N; u++) {
        a[2 * (base + u * stride)] = tmp[2 * u];
        a[2 * (base + u * stride) + 1] = tmp[2 * u + 1];
      }
    }
}

/* Probe mode j: a soft-edged disk of radius w (a focusing optic's pupil:
 * its diffraction pattern spreads over the detector) with a curved phase;
 * modes > 0 are weaker and carry a ramp so they differ from mode 0. */
static void probe_mode(double *p, int j, double w, double curv) {
  double h = N / 2.0;
  for (int y = 0; y < N; y++)
    for (int x = 0; x < N; x++) {
      double dy = y - h, dx = x - h, r2 = dy * dy + dx * dx;
      double a = 10.0 / (1.0 + exp(sqrt(r2) - w)), ph = curv * r2;
      if (j == 1)
        a *= 0.3 * dx / w;
      else if (j == 2)
        a *= 0.2 * dy / w;
      p[2 * (y * N + x)] = a * cos(ph);
      p[2 * (y * N + x) + 1] = a * sin(ph);
    }
}

static int setup(void **state) {
  prob = calloc(1, sizeof *prob);
  assert_non_null(prob);
  /* true object: amplitude 0.6..1 and phase -1..1 rad with structure */
  double *obj = malloc(sizeof(double) * OBJ * OBJ * 2);
  assert_non_null(obj);
  for (int y = 0; y < OBJ; y++)
    for (int x = 0; x < OBJ; x++) {
      double a = 0.8 + 0.2 * sin(0.21 * x) * cos(0.13 * y);
      double ph = sin(0.09 * x + 0.05 * y) + 0.5 * (((x / 12) + (y / 12)) % 2) - 0.25;
      obj[2 * (y * OBJ + x)] = a * cos(ph);
      obj[2 * (y * OBJ + x) + 1] = a * sin(ph);
    }
  double truth[MAXM][N * N * 2];
  for (int j = 0; j < MAXM; j++)
    probe_mode(truth[j], j, 8.0, 0.01);
  for (int v = 0; v < NV; v++) {
    int r = 4 + STEP * (v / GRID) + (int)(urand() * 5) - 2;
    int c = 4 + STEP * (v % GRID) + (int)(urand() * 5) - 2;
    prob->pos[2 * v] = r;
    prob->pos[2 * v + 1] = c;
    double inten[MAXM][N * N];
    for (int j = 0; j < MAXM; j++) {
      double ex[N * N * 2];
      for (int y = 0; y < N; y++)
        for (int x = 0; x < N; x++) {
          const double *P = truth[j] + 2 * (y * N + x), *O = obj + 2 * ((r + y) * OBJ + c + x);
          ex[2 * (y * N + x)] = P[0] * O[0] - P[1] * O[1];
          ex[2 * (y * N + x) + 1] = P[0] * O[1] + P[1] * O[0];
        }
      dft2(ex);
      for (int p = 0; p < N * N; p++)
        inten[j][p] = (j ? inten[j - 1][p] : 0.0) + ex[2 * p] * ex[2 * p] + ex[2 * p + 1] * ex[2 * p + 1];
    }
    for (int p = 0; p < N * N; p++) {
      int y = p / N, x = p % N, fy = y < N / 2 ? y : N - y, fx = x < N / 2 ? x : N - x;
      int stop = fy <= 1 && fx <= 1; /* beam stop at zero frequency (FFT order) */
      int masked = stop || urand() < 0.01;
      for (int j = 0; j < MAXM; j++) /* whole photons: weak pixels are exactly 0 */
        prob->amp[j][(size_t)v * N * N + p] = masked ? -1.0f
                                              : v == EMPTY_VIEW ? 0.0f
                                                                : (float)sqrt(floor(inten[j][p] + 0.5));
    }
  }
  /* start: a wider spot, flatter phase; weak extra modes */
  for (int j = 0; j < MAXM; j++) {
    probe_mode(prob->probe + (size_t)j * N * N * 2, j, 9.0, 0.0);
    if (j > 0)
      for (int q = 0; q < N * N * 2; q++)
        prob->probe[(size_t)j * N * N * 2 + q] *= 0.5;
  }
  for (int k = 0; k < 2; k++)
    for (int q = 0; q < OBJ * OBJ; q++) {
      prob->obj2[(size_t)k * OBJ * OBJ * 2 + 2 * q] = k ? 0.3 : 1.0;
      prob->obj2[(size_t)k * OBJ * OBJ * 2 + 2 * q + 1] = k ? 0.1 : 0.0;
    }
  free(obj);
  *state = prob;
  return 0;
}

static int teardown(void **state) {
  free(prob);
  return 0;
}

typedef struct case_s {
  const char *name;
  beam_dm_prec_t prec;
  uint32_t probe_modes, object_modes, inner_passes;
  double beta, fourier_relax, probe_support;
  int reducer; /* 1: install reduce_affine */
  beam_dm_alg_t algorithm;
} case_t;

/* A reducer that changes every sum, x -> 2 x + 1e-3, and logs each call so
 * the two engines can be checked to reduce the same buffers in the same
 * order. */
#define MAX_CALLS 64
typedef struct rlog_s {
  size_t n;
  size_t nreal[MAX_CALLS];
  int is_double[MAX_CALLS];
} rlog_t;

static int reduce_affine(void *ctx, void *buf, size_t nreal, int is_double) {
  rlog_t *l = ctx;
  if (l->n < MAX_CALLS) {
    l->nreal[l->n] = nreal;
    l->is_double[l->n] = is_double;
  }
  l->n++;
  for (size_t i = 0; i < nreal; i++)
    if (is_double)
      ((double *)buf)[i] = 2 * ((double *)buf)[i] + 1e-3;
    else
      ((float *)buf)[i] = 2 * ((float *)buf)[i] + 1e-3f;
  return 0;
}

static beam_dm_conf_t conf_of(const case_t *k) {
  beam_dm_conf_t c;
  beam_dm_conf_default(&c);
  c.prec = k->prec;
  c.n = N;
  c.max_views = NV + 7; /* capacity above the count: only views held count */
  c.obj_h = c.obj_w = OBJ;
  c.probe_modes = k->probe_modes;
  c.object_modes = k->object_modes;
  c.inner_passes = k->inner_passes;
  c.beta = k->beta;
  c.fourier_relax = k->fourier_relax;
  c.probe_support = k->probe_support;
  c.algorithm = k->algorithm;
  c.threads = 2;
  return c;
}

static beam_dm_t *engine(const case_t *k, beam_dm_backend_t be) {
  beam_dm_conf_t c = conf_of(k);
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  if (beam_dm_create(&e, &c, be, &d) != 0)
    fail_msg("%s: create %s: %s", k->name, be == BEAM_DM_CUDA ? "cuda" : "cpu", d.msg);
  if (beam_dm_set_probe(e, prob->probe, &d) != 0 || beam_dm_set_object(e, prob->obj2, &d) != 0)
    fail_msg("%s: set: %s", k->name, d.msg);
  /* two calls, so the second starts at view 50 */
  const float *amp = prob->amp[k->probe_modes - 1];
  if (beam_dm_add_views(e, 50, amp, prob->pos, &d) != 0 ||
      beam_dm_add_views(e, NV - 50, amp + (size_t)50 * N * N, prob->pos + 100, &d) != 0)
    fail_msg("%s: add_views: %s", k->name, d.msg);
  return e;
}

/* ||g - c|| / ||c|| over count complex values */
static double rel_norm(const double *g, const double *c, size_t count) {
  double dn = 0, cn = 0;
  for (size_t q = 0; q < 2 * count; q++) {
    dn += (g[q] - c[q]) * (g[q] - c[q]);
    cn += c[q] * c[q];
  }
  return sqrt(dn) / sqrt(cn);
}

static void run_case(const case_t *k) {
  double tol = k->prec == BEAM_DM_F64 ? 1e-10 : 1e-4;
  double tol_obj = k->prec == BEAM_DM_F64 ? 1e-10 : 2e-3;
  beam_dm_t *cpu = engine(k, BEAM_DM_CPU), *gpu = engine(k, BEAM_DM_CUDA);
  beam_diag_t d = {0};
  rlog_t lc = {0}, lg = {0};
  if (k->reducer) {
    beam_dm_set_reducer(cpu, reduce_affine, &lc);
    beam_dm_set_reducer(gpu, reduce_affine, &lg);
  }
  for (int it = 0; it < ITERS; it++) {
    beam_dm_metrics_t mc, mg;
    if (beam_dm_iterate(cpu, &mc, &d) != 0)
      fail_msg("%s: cpu iterate %d: %s", k->name, it, d.msg);
    if (beam_dm_iterate(gpu, &mg, &d) != 0)
      fail_msg("%s: cuda iterate %d: %s", k->name, it, d.msg);
    double fe = fabs(mg.fourier_error - mc.fourier_error);
    double oc = fabs(mg.object_change - mc.object_change);
    double pc = fabs(mg.probe_change - mc.probe_change);
    if (!(fe <= tol * fabs(mc.fourier_error)) || !(oc <= 2 * tol) || !(pc <= 2 * tol))
      fail_msg("%s: iteration %d metrics differ: fourier_error cpu %.17g cuda %.17g; object_change "
               "%.17g / %.17g; probe_change %.17g / %.17g (tol %g)",
               k->name, it, mc.fourier_error, mg.fourier_error, mc.object_change, mg.object_change,
               mc.probe_change, mg.probe_change, tol);
    if (!(mc.fourier_error > 0) || (it >= 2 && !(mc.probe_change > 0)))
      fail_msg("%s: iteration %d: the problem does not exercise the engine (fourier_error %g, "
               "probe_change %g)", k->name, it, mc.fourier_error, mc.probe_change);
  }
  if (k->reducer) {
    /* per iteration: object, probe (from iteration 2), metric sums */
    assert_int_equal(lc.n, ITERS * (k->inner_passes + 1) + (ITERS - 2) * k->inner_passes);
    assert_int_equal(lg.n, lc.n);
    for (size_t i = 0; i < lc.n && i < MAX_CALLS; i++)
      if (lg.nreal[i] != lc.nreal[i] || lg.is_double[i] != lc.is_double[i])
        fail_msg("%s: reducer call %zu: cpu (%zu reals, double %d), cuda (%zu, %d)", k->name, i,
                 lc.nreal[i], lc.is_double[i], lg.nreal[i], lg.is_double[i]);
  }
  size_t np = (size_t)k->probe_modes * N * N, no = (size_t)k->object_modes * OBJ * OBJ;
  double *pc = malloc(np * 2 * sizeof(double)), *pg = malloc(np * 2 * sizeof(double));
  double *oc = malloc(no * 2 * sizeof(double)), *og = malloc(no * 2 * sizeof(double));
  assert_true(pc && pg && oc && og);
  assert_int_equal(beam_dm_get_probe(cpu, pc, &d), 0);
  assert_int_equal(beam_dm_get_probe(gpu, pg, &d), 0);
  assert_int_equal(beam_dm_get_object(cpu, oc, &d), 0);
  assert_int_equal(beam_dm_get_object(gpu, og, &d), 0);
  double ep = rel_norm(pg, pc, np), eo = rel_norm(og, oc, no);
  fprintf(stderr, "# %s: probe %.3g (tol %g), object %.3g (tol %g) relative\n", k->name, ep, tol,
          eo, tol_obj);
  if (!(ep <= tol) || !(eo <= tol_obj))
    fail_msg("%s: after %d iterations probe differs by %.3g (tol %g), object by %.3g (tol %g)",
             k->name, ITERS, ep, tol, eo, tol_obj);
  free(pc);
  free(pg);
  free(oc);
  free(og);
  beam_dm_destroy(&cpu);
  beam_dm_destroy(&gpu);
}

/* fourier_relax 1 (not PtyPy's 0.05) puts the power bound where some views
 * are within it and others not, so both branches of dm.h's power bound
 * run (checked: breaking either branch of the CUDA backend fails here). */
static const case_t cases[] = {
    {"f64 1 mode", BEAM_DM_F64, 1, 1, 1, 1.0, 0.0, 0.0, 0, BEAM_DM_ALG_DM},
    {"f64 3 modes relax support", BEAM_DM_F64, 3, 1, 2, 0.9, 1.0, 0.7, 0, BEAM_DM_ALG_DM},
    {"f64 2 probe x 2 object modes, reducer", BEAM_DM_F64, 2, 2, 1, 1.0, 0.0, 0.0, 1, BEAM_DM_ALG_DM},
    {"f32 1 mode relax", BEAM_DM_F32, 1, 1, 1, 1.0, 1.0, 0.0, 0, BEAM_DM_ALG_DM},
    {"f32 3 modes, reducer", BEAM_DM_F32, 3, 1, 2, 0.9, 0.0, 0.7, 1, BEAM_DM_ALG_DM},
    {"f64 raar relax", BEAM_DM_F64, 1, 1, 1, 0.8, 1.0, 0.0, 0, BEAM_DM_ALG_RAAR},
    {"f32 raar 2 modes", BEAM_DM_F32, 2, 1, 1, 0.75, 0.0, 0.0, 0, BEAM_DM_ALG_RAAR},
};

/* Without a device: create refuses with ENOTSUP and says why. */
static void expect_no_device(void) {
  beam_dm_conf_t c = conf_of(&cases[0]);
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  int rc = beam_dm_create(&e, &c, BEAM_DM_CUDA, &d);
  if (rc != BEAM_ENOTSUP || e != NULL ||
      !(strstr(d.msg, "without CUDA") || strstr(d.msg, "needs a CUDA device")))
    fail_msg("cuda create without a device: rc %d, \"%s\"", rc, d.msg);
  skip();
}

static void test_dm_xcheck(void **state) {
  if (!bh_gpu_available())
    expect_no_device();
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_case(&cases[i]);
}

/* The CUDA engine's footprint check: a request far beyond any device must
 * fail at create with ELIMIT and the bytes, not at a later cudaMalloc. */
static void test_dm_cuda_too_big(void **state) {
  if (!bh_gpu_available())
    expect_no_device();
  beam_dm_conf_t c = conf_of(&cases[0]);
  c.n = 1024;
  c.max_views = 200000; /* 1.6 TB of f32 exit waves */
  c.obj_h = c.obj_w = 4096;
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  int rc = beam_dm_create(&e, &c, BEAM_DM_CUDA, &d);
  if (rc != BEAM_ELIMIT || e != NULL || !strstr(d.msg, "MiB"))
    fail_msg("oversized cuda create: rc %d, \"%s\"", rc, d.msg);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_dm_xcheck),
                                     cmocka_unit_test(test_dm_cuda_too_big)};
  return beam_run_tests(tests, setup, teardown);
}
