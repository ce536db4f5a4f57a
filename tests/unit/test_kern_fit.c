/* The batched fitter (pipeline/fit.h): the vector math against libm at
 * its stated accuracy, every model's analytic Jacobian against central
 * differences, the SIMD path at each ISA the CPU has against the plain
 * reference (parameters within 2 % of their errors, errors within 0.1 %,
 * same statuses), every status, bounds, NaN isolation between lanes, and
 * argument errors. SciPy agreement is tests/integration/test_fit_engine.py. */
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

#include "pipeline/fit.h"
#include "pipeline/kern/fit_int.h"
#include "pipeline/kern/fit_vmath.h"
#include "tests/common/fit_cases.h"


static void test_vmath(void **st) {
  (void)st;
  double worst = 0;
  for (int i = 0; i <= 200000; i++) {
    float x = -87.0f + 175.0f * (float)i / 200000;
    double r = exp((double)x), e = fabs(fit_expf(x) - r) / r;
    worst = e > worst ? e : worst;
  }
  assert_true(worst <= 3e-7);
  assert_true(fit_expf(-100.0f) == 0.0f && isnan(fit_expf(NAN)));
  worst = 0;
  for (int i = 1; i <= 200000; i++) {
    float x = expf(-40.0f + 80.0f * (float)i / 200000);
    double r = log((double)x), e = fabs(fit_logf(x) - r) / (fabs(r) > 1 ? fabs(r) : 1);
    worst = e > worst ? e : worst;
  }
  assert_true(worst <= 2e-7);
  assert_true(isinf(fit_logf(0.0f)) && isnan(fit_logf(-1.0f)) && isnan(fit_logf(NAN)));
  worst = 0;
  for (int i = 0; i <= 400000; i++) {
    float x = -1e4f + 2e4f * (float)i / 400000, s, c;
    fit_sincosf(x, &s, &c);
    double es = fabs(s - sin((double)x)), ec = fabs(c - cos((double)x));
    worst = es > worst ? es : worst;
    worst = ec > worst ? ec : worst;
  }
  assert_true(worst <= 6e-7);
}


static void test_jacobians(void **st) {
  (void)st;
  for (int m = 0; m < BEAM_FIT_N_MODELS; m++) {
    int P = m == BEAM_FIT_POLY ? 4 : beam_fit_model_info(m)->n_params;
    for (int k = 1; k < 50; k++) {
      double x = xat(m, k, 50) + 1e-3, J[FIT_MAXP], Jd[FIT_MAXP], p[FIT_MAXP];
      memcpy(p, truth[m], sizeof(double) * P);
      beam__fit_eval(m, P, p, x, J);
      for (int j = 0; j < P; j++) {
        double h = 1e-6 * (fabs(p[j]) + 1e-3), pp[FIT_MAXP];
        memcpy(pp, p, sizeof pp);
        pp[j] = p[j] + h;
        double fp = beam__fit_eval(m, P, pp, x, Jd);
        pp[j] = p[j] - h;
        double fm = beam__fit_eval(m, P, pp, x, Jd);
        double num = (fp - fm) / (2 * h);
        if (!(fabs(num - J[j]) <= 1e-5 * (fabs(J[j]) + 1e-3)))
          fail_msg("model %s param %d x=%g: analytic %g numeric %g", beam_fit_model_info(m)->name,
                   j, x, J[j], num);
      }
    }
  }
}

typedef struct batch_s {
  beam_fit_batch_t b;
  float *x, *y;
  double *p0;
  beam_fit_result_t r;
  void *ws;
  size_t wsz;
} batch_t;

static batch_t *make_batch(int m, size_t N, size_t T, double noise) {
  batch_t *t = calloc(1, sizeof *t);
  int P = m == BEAM_FIT_POLY ? 4 : beam_fit_model_info(m)->n_params;
  t->x = malloc(T * 4);
  t->y = malloc(N * T * 4);
  for (size_t k = 0; k < T; k++)
    t->x[k] = (float)xat(m, (int)k, (int)T);
  for (size_t i = 0; i < N; i++) {
    double p[FIT_MAXP], J[FIT_MAXP];
    for (int j = 0; j < P; j++)
      p[j] = truth[m][j] * (1 + 0.05 * grand());
    for (size_t k = 0; k < T; k++)
      t->y[i * T + k] = (float)(beam__fit_eval(m, P, p, t->x[k], J) + noise * grand());
  }
  t->b = (beam_fit_batch_t){.model = m, .poly_degree = 3, .n_fits = N, .n_points = T,
                            .y = t->y, .y_fit_stride = (ptrdiff_t)T, .y_point_stride = 1,
                            .x = t->x, .x_point_stride = 1};
  t->r.params = calloc(N * P, 8);
  t->r.errors = calloc(N * P, 8);
  t->r.chi2 = calloc(N, 8);
  t->r.iters = calloc(N, 4);
  t->r.status = calloc(N, 1);
  return t;
}

static void free_batch(batch_t *t) {
  free(t->x), free(t->y), free(t->p0), free(t->ws);
  free(t->r.params), free(t->r.errors), free(t->r.chi2), free(t->r.iters), free(t->r.status);
  free(t);
}

static void run(batch_t *t, const beam_fit_opts_t *o, int ref) {
  size_t need = beam_fit_workspace_size(&t->b, o);
  assert_true(need > 0);
  if (need > t->wsz) {
    free(t->ws);
    t->ws = malloc(need);
    t->wsz = need;
  }
  beam_diag_t d = {0};
  int rc = ref ? beam_fit_ref_range(&t->b, o, 0, t->b.n_fits, t->ws, t->wsz, &t->r, &d)
               : beam_fit_cpu_range(&t->b, o, 0, t->b.n_fits, t->ws, t->wsz, &t->r, &d);
  if (rc)
    fail_msg("fit: %s", d.msg);
}

/* Copies the results of one run (params, errors, status) for comparison. */
static void snap(const batch_t *t, int P, double *p, double *e, uint8_t *s) {
  memcpy(p, t->r.params, t->b.n_fits * P * 8);
  memcpy(e, t->r.errors, t->b.n_fits * P * 8);
  memcpy(s, t->r.status, t->b.n_fits);
}

static void test_simd_vs_reference(void **st) {
  (void)st;
  enum { N = 37, T = 100 };
  for (int m = 0; m < BEAM_FIT_N_MODELS; m++) {
    int P = m == BEAM_FIT_POLY ? 4 : beam_fit_model_info(m)->n_params;
    batch_t *t = make_batch(m, N, T, noise_of(m));
    beam_fit_opts_t o;
    beam_fit_opts_default(&o);
    if (m == BEAM_FIT_DCOS_T0) { /* a guess needs t0 bounded (docs/fit.md) */
      static double lo[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.8};
      static double hi[6] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, 1.2};
      t->b.lo = lo, t->b.hi = hi;
    }
    static double rp[N * FIT_MAXP], re[N * FIT_MAXP];
    static uint8_t rs[N];
    run(t, &o, 1);
    snap(t, P, rp, re, rs);
    int top = beam_fit_cpu_isa(BEAM_FIT_ISA_AUTO);
    for (int isa = BEAM_FIT_ISA_SSE2; isa <= top; isa++) {
      o.isa = isa;
      run(t, &o, 0);
      for (size_t i = 0; i < N; i++) {
        if (rs[i] != t->r.status[i])
          fail_msg("%s %s fit %zu: status %d vs reference %d", beam_fit_model_info(m)->name,
                   beam_fit_isa_name(isa), i, t->r.status[i], rs[i]);
        for (int j = 0; j < P; j++) {
          double dp = fabs(t->r.params[i * P + j] - rp[i * P + j]), er = re[i * P + j];
          double de = fabs(t->r.errors[i * P + j] - er);
          if (!(dp <= 0.02 * er) || !(de <= 1e-3 * er))
            fail_msg("%s %s fit %zu param %d: %.9g vs %.9g (err %.3g vs %.3g)",
                     beam_fit_model_info(m)->name, beam_fit_isa_name(isa), i, j,
                     t->r.params[i * P + j], rp[i * P + j], t->r.errors[i * P + j], er);
        }
      }
    }
    free_batch(t);
  }
}

/* The automatic dcos/dcos2 start: the FFT periodogram (uniform x) picks
 * the same start as the direct sums it replaces, to rounding (same
 * frequency bin and decay rate, frequency within 1e-7 relative); a
 * non-uniform x keeps the direct sums (bitwise the same start as forcing
 * them); and one lane alone (the reference) starts bitwise where the same
 * fit starts in a 16-lane block (the SIMD path). */
static void guess_block(fit_ctx_t *c, size_t i0, size_t T, int nl, int direct, double *p0,
                        double *xd, double *yd, double *wd, double *scr) {
  int nu;
  for (int l = 0; l < nl; l++) {
    if (i0 + l < c->b->n_fits)
      beam__fit_gather(c, i0 + l, nl, l, xd, yd, wd, &nu);
    else
      for (size_t k = 0; k < T; k++) {
        xd[k * nl + l] = xd[k * nl];
        yd[k * nl + l] = wd[k * nl + l] = 0;
      }
  }
  c->guess_direct = direct;
  beam__fit_guess(c, T, nl, c->b->x_fit_stride == 0, xd, yd, wd, p0, scr);
}

static void test_guess_fft_vs_direct(void **st) {
  (void)st;
  enum { N = 37 };
  static const size_t Ts[] = {64, 100, 333, 1000};
  int models[] = {BEAM_FIT_DCOS, BEAM_FIT_DCOS2};
  for (int mi = 0; mi < 2; mi++)
    for (int ti = 0; ti < 4; ti++)
      for (int jit = 0; jit < 2; jit++) {
        int m = models[mi];
        size_t T = Ts[ti];
        batch_t *t = make_batch(m, N, T, noise_of(m));
        if (jit) /* a non-uniform grid: the direct sums stay */
          for (size_t k = 1; k + 1 < T; k++)
            t->x[k] += (float)(0.3 * 10.0 / (T - 1) * sin((double)k));
        beam_fit_opts_t o;
        beam_fit_opts_default(&o);
        fit_ctx_t c;
        assert_int_equal(beam__fit_ctx(&c, &t->b, &o, NULL), 0);
        int P = c.P;
        double *xd = malloc(T * FIT_L * 8), *yd = malloc(T * FIT_L * 8), *wd = malloc(T * FIT_L * 8);
        double *scr = malloc(beam__fit_guess_scratch(P, T, FIT_L) * 8);
        double pf[FIT_L * FIT_MAXP], pd[FIT_L * FIT_MAXP], p1[FIT_MAXP];
        int ndiff = 0; /* uniform x: the FFT ran, so some bits differ */
        for (size_t i0 = 0; i0 < N; i0 += FIT_L) {
          guess_block(&c, i0, T, FIT_L, 0, pf, xd, yd, wd, scr);
          guess_block(&c, i0, T, FIT_L, 1, pd, xd, yd, wd, scr);
          for (int l = 0; l < FIT_L && i0 + l < N; l++) {
            double *a = pf + l * P, *b = pd + l * P;
            if (jit) {
              if (memcmp(a, b, sizeof(double) * P))
                fail_msg("%s T=%zu non-uniform fit %zu: start differs from the direct one",
                         beam_fit_model_info(m)->name, T, i0 + l);
            } else
              for (int j = 0; j < P; j++) {
                ndiff += a[j] != b[j];
                int fj = j == 3 || (m == BEAM_FIT_DCOS2 && j == 7);
                int tj = j == 2 || (m == BEAM_FIT_DCOS2 && j == 6);
                double bound = fj ? 1e-7 * fabs(b[j]) : 1e-5 * (fabs(b[j]) + 1);
                if (tj ? a[j] != b[j] : !(fabs(a[j] - b[j]) <= bound))
                  fail_msg("%s T=%zu fit %zu param %d: FFT start %.12g, direct %.12g",
                           beam_fit_model_info(m)->name, T, i0 + l, j, a[j], b[j]);
              }
            /* the reference's single lane starts where the block's lane does */
            guess_block(&c, i0 + l, T, 1, 0, p1, xd, yd, wd, scr);
            if (memcmp(p1, a, sizeof(double) * P))
              fail_msg("%s T=%zu fit %zu: one-lane start differs from the block's",
                       beam_fit_model_info(m)->name, T, i0 + l);
          }
        }
        if (!jit && !(ndiff > 0))
          fail_msg("%s T=%zu: the FFT periodogram did not run", beam_fit_model_info(m)->name, T);
        free(xd), free(yd), free(wd), free(scr);
        free_batch(t);
      }
}

/* dcos_t0's start (the change-point scan) per lane: alone (the reference)
 * bitwise where it is inside a 16-lane block, whatever its neighbours
 * (the last block of 37 has 11 dead lanes). */
static void test_guess_t0_lanes(void **st) {
  (void)st;
  enum { N = 37, T = 100 };
  batch_t *t = make_batch(BEAM_FIT_DCOS_T0, N, T, noise_of(BEAM_FIT_DCOS_T0));
  static double lo[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.8};
  static double hi[6] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, 1.2};
  for (int bounded = 0; bounded < 2; bounded++) {
    t->b.lo = bounded ? lo : NULL, t->b.hi = bounded ? hi : NULL;
    beam_fit_opts_t o;
    beam_fit_opts_default(&o);
    fit_ctx_t c;
    assert_int_equal(beam__fit_ctx(&c, &t->b, &o, NULL), 0);
    int P = c.P;
    double *xd = malloc(T * FIT_L * 8), *yd = malloc(T * FIT_L * 8), *wd = malloc(T * FIT_L * 8);
    double *scr = malloc(beam__fit_guess_scratch(P, T, FIT_L) * 8);
    double pb[FIT_L * FIT_MAXP], p1[FIT_MAXP];
    for (size_t i0 = 0; i0 < N; i0 += FIT_L) {
      guess_block(&c, i0, T, FIT_L, 0, pb, xd, yd, wd, scr);
      for (int l = 0; l < FIT_L && i0 + l < N; l++) {
        guess_block(&c, i0 + l, T, 1, 0, p1, xd, yd, wd, scr);
        if (memcmp(p1, pb + l * P, sizeof(double) * P))
          fail_msg("dcos_t0 %s fit %zu: one-lane start t0 %.9g differs from the block's %.9g",
                   bounded ? "bounded" : "unbounded", i0 + l, p1[5], pb[l * P + 5]);
      }
    }
    free(xd), free(yd), free(wd), free(scr);
  }
  free_batch(t);
}

static void test_statuses_and_isolation(void **st) {
  (void)st;
  enum { N = 40, T = 100, P = 5 };
  batch_t *t = make_batch(BEAM_FIT_DCOS, N, T, 0.05);
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  static double p1[N * P], e1[N * P];
  static uint8_t s1[N];
  for (int ref = 0; ref < 2; ref++) {
    run(t, &o, ref);
    snap(t, P, p1, e1, s1);
    float keep[T];
    memcpy(keep, t->y, sizeof keep);
    t->y[0 * T + 5] = NAN;             /* fit 0: bad input */
    for (int k = 0; k < T; k++)        /* fit 17: constant: bad input */
      t->y[17 * T + k] = 2.0f;
    t->y[33 * T + 99] = INFINITY;      /* fit 33: bad input */
    run(t, &o, ref);
    assert_int_equal(t->r.status[0], BEAM_FIT_BAD_INPUT);
    assert_int_equal(t->r.status[17], BEAM_FIT_BAD_INPUT);
    assert_int_equal(t->r.status[33], BEAM_FIT_BAD_INPUT);
    assert_true(isnan(t->r.params[0]) && isnan(t->r.errors[17 * P]));
    for (size_t i = 0; i < N; i++)
      if (i != 0 && i != 17 && i != 33) {
        assert_memory_equal(t->r.params + i * P, p1 + i * P, P * 8);
        assert_memory_equal(t->r.errors + i * P, e1 + i * P, P * 8);
        assert_int_equal(t->r.status[i], s1[i]);
      }
    free_batch(t);
    t = make_batch(BEAM_FIT_DCOS, N, T, 0.05);
    (void)keep;
  }
  /* too few: weights leave 5 points for 5 parameters */
  float *w = malloc(N * T * 4);
  for (int i = 0; i < N * T; i++)
    w[i] = (i % T) < 5 || i >= T ? 1.0f : 0.0f;
  t->b.w = w, t->b.w_fit_stride = T, t->b.w_point_stride = 1;
  for (int ref = 0; ref < 2; ref++) {
    run(t, &o, ref);
    assert_int_equal(t->r.status[0], BEAM_FIT_TOO_FEW);
    assert_int_equal(t->r.status[1], BEAM_FIT_CONVERGED);
  }
  t->b.w = NULL;
  /* max_iter */
  o.max_iter = 1;
  for (int ref = 0; ref < 2; ref++) {
    run(t, &o, ref);
    for (size_t i = 0; i < N; i++)
      assert_int_equal(t->r.status[i], BEAM_FIT_MAX_ITER);
  }
  o.max_iter = 100;
  /* singular: no amplitude, so tau and f do nothing */
  t->p0 = malloc(N * P * 8);
  for (size_t i = 0; i < N; i++) {
    double p[P] = {0, 0, 4, 0.8, 0.2};
    memcpy(t->p0 + i * P, p, sizeof p);
  }
  t->b.p0 = t->p0;
  o.init = BEAM_FIT_INIT_GIVEN;
  for (int ref = 0; ref < 2; ref++) {
    run(t, &o, ref);
    for (size_t i = 0; i < N; i++)
      assert_int_equal(t->r.status[i], BEAM_FIT_SINGULAR);
  }
  /* bound: f capped below the truth (0.8 ± 5 %) */
  o.init = BEAM_FIT_INIT_AUTO;
  double lo[P] = {-INFINITY, -INFINITY, 0.1, 0.0, -INFINITY};
  double hi[P] = {INFINITY, INFINITY, 100, 0.7, INFINITY};
  t->b.lo = lo, t->b.hi = hi;
  for (int ref = 0; ref < 2; ref++) {
    run(t, &o, ref);
    for (size_t i = 0; i < N; i++) {
      assert_int_equal(t->r.status[i], BEAM_FIT_BOUND);
      assert_true(t->r.params[i * P + 3] == 0.7);
      for (int j = 0; j < P; j++)
        assert_true(t->r.params[i * P + j] >= lo[j] && t->r.params[i * P + j] <= hi[j]);
    }
  }
  free(w);
  free_batch(t);
}

static void test_bad_arguments(void **st) {
  (void)st;
  batch_t *t = make_batch(BEAM_FIT_EXP, 4, 20, 0.01);
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  beam_diag_t d = {0};
  char ws[64];
  assert_int_equal(beam_fit_cpu_range(&t->b, &o, 0, 4, ws, sizeof ws, &t->r, &d), BEAM_EINVAL);
  assert_non_null(strstr(d.msg, "workspace"));
  t->b.model = (beam_fit_model_t)99;
  assert_int_equal(beam_fit_check(&t->b, &o, NULL), BEAM_EINVAL);
  assert_int_equal(beam_fit_workspace_size(&t->b, &o), 0);
  t->b.model = BEAM_FIT_EXP;
  double lo[3] = {1, 0, 0}, hi[3] = {0, 1, 1};
  t->b.lo = lo, t->b.hi = hi;
  assert_int_equal(beam_fit_check(&t->b, &o, NULL), BEAM_EINVAL);
  t->b.lo = t->b.hi = NULL;
  o.init = BEAM_FIT_INIT_GIVEN;
  assert_int_equal(beam_fit_check(&t->b, &o, NULL), BEAM_EINVAL);
  o.init = BEAM_FIT_INIT_AUTO;
  assert_int_equal(beam_fit_check(&t->b, &o, NULL), 3);
  run(t, &o, 0);
  d.msg[0] = 0, d.code = 0;
  assert_int_equal(beam_fit_cpu_range(&t->b, &o, 3, 5, t->ws, t->wsz, &t->r, &d), BEAM_EINVAL);
  assert_int_equal(beam_fit_model_from_name("stretch_xt"), BEAM_FIT_STRETCH_XT);
  assert_string_equal(beam_fit_status_name(BEAM_FIT_TOO_FEW), "too_few");
  free_batch(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vmath),
      cmocka_unit_test(test_jacobians),
      cmocka_unit_test(test_simd_vs_reference),
      cmocka_unit_test(test_guess_fft_vs_direct),
      cmocka_unit_test(test_guess_t0_lanes),
      cmocka_unit_test(test_statuses_and_isolation),
      cmocka_unit_test(test_bad_arguments),
  };
  return beam_run_tests(tests, NULL, NULL);
}
