/* CPU vs CUDA for the batched fitter (beam_fit_cpu_range vs beam_fit_cuda,
 * pipeline/fit.h). Both start from the same automatic guess (the CUDA path
 * computes it with the CPU's code) or the same p0, so they differ only in
 * the per-point arithmetic: fp32 models with other transcendentals (the
 * SFU intrinsics on a GPU, libm on the host emulation, fit_vmath.h on the
 * CPU), FMA contraction and the order of the double sums. Per fit:
 *   status and points used      equal
 *   parameters                  |gpu - cpu| <= 5 % of the CPU's standard
 *                               error + 2e-5·(|p| + 0.01) (the second term:
 *                               on clean data the errors are at fp32's
 *                               rounding floor, where the two disagree
 *                               by the model's rounding, ~1e-6 relative)
 *   errors, covariance          within 2 % / 5 % of σ_j σ_k, after taking out
 *                               the χ²/(N-P) factor of scaled LSE errors
 *   χ²                          within 1e-4 relative (+ a floor: χ² 1e-9,
 *                               fp32 rounding over 100 points)
 *   failed fits                 NaN numbers on both sides
 * Every model (poly runs the CPU reference on both), noisy and clean,
 * both layouts, per-fit x, both mappings (thread and warp per fit),
 * bounds, LSE / Poisson-weighted LSE / MLE on uint16 counts, given starts,
 * and bad traces (NaN, constant, too few, negative weight, negative data
 * for MLE, a non-finite start). Skips without a device (after checking
 * that the CUDA path refuses cleanly). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu.h"
#include "pipeline/fit.h"
#include "pipeline/kern/fit_int.h"
#include "tests/common/fit_cases.h"
#include "tests/common/stage_harness.h"
#include "pipeline/kern/kinds.h"
#include "tests/gpu/xcheck.h"
#include "tests/common/runner.h"


static int n_params(int m) { return m == BEAM_FIT_POLY ? 4 : beam_fit_model_info(m)->n_params; }

static const double t0_lo[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.8};
static const double t0_hi[6] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, 1.2};

typedef struct res_s {
  double *params, *errors, *cov, *chi2, *chi2_red;
  int32_t *iters, *n_used;
  uint8_t *status;
  beam_fit_result_t r;
} res_t;

static void res_new(res_t *s, size_t N, int P) {
  s->params = malloc(N * P * 8), s->errors = malloc(N * P * 8), s->cov = malloc(N * P * P * 8);
  s->chi2 = malloc(N * 8), s->chi2_red = malloc(N * 8);
  s->iters = malloc(N * 4), s->n_used = malloc(N * 4), s->status = malloc(N);
  memset(s->status, 0xee, N);
  s->r = (beam_fit_result_t){s->params, s->errors, s->cov, s->chi2, s->chi2_red,
                             s->iters, s->n_used, s->status};
}
static void res_free(res_t *s) {
  free(s->params), free(s->errors), free(s->cov), free(s->chi2), free(s->chi2_red);
  free(s->iters), free(s->n_used), free(s->status);
}

static beam_fit_cuda_t *ctx;

static int q_bad_frame(int k) { return k == 13; } /* a corrupt frame: skipped by both */

static int close_to(double g, double c, double tol) {
  if (isnan(c))
    return isnan(g);
  return fabs(g - c) <= tol;
}

/* Fits b on both paths (y16: the counts the CUDA path gets; b->y holds
 * the same values as float for the CPU) and compares fit by fit. */
static void xcheck(const char *what, const beam_fit_batch_t *b, const uint16_t *y16,
                   const beam_fit_opts_t *o, int mapping) {
  int P = beam_fit_check(b, o, NULL);
  assert_true(P > 0);
  size_t N = b->n_fits;
  res_t c, g;
  res_new(&c, N, P);
  res_new(&g, N, P);
  size_t wsz = beam_fit_workspace_size(b, o);
  void *ws = malloc(wsz);
  beam_diag_t d = {0};
  if (beam_fit_cpu_range(b, o, 0, N, ws, wsz, &c.r, &d) != 0)
    fail_msg("%s: cpu: %s", what, d.msg);
  beam_fit_cuda_run_t run = {.mapping = mapping};
  beam_fit_batch_t bg = *b;
  if (y16)
    bg.y = NULL;
  if (beam_fit_cuda(ctx, &bg, y16, o, &g.r, &run, &d) != 0)
    fail_msg("%s: cuda: %s", what, d.msg);
  if (b->model != BEAM_FIT_POLY)
    assert_int_equal(run.mapping, mapping ? mapping : b->n_points > 256 ? 2 : 1);
  int ok = 0, maxdit = 0, nkink = 0;
  double worst = 0;
  for (size_t i = 0; i < N; i++) {
    if (g.status[i] != c.status[i] || g.n_used[i] != c.n_used[i])
      fail_msg("%s fit %zu: cuda status %s (%d used), cpu %s (%d used)", what, i,
               beam_fit_status_name(g.status[i]), g.n_used[i], beam_fit_status_name(c.status[i]),
               c.n_used[i]);
    ok += c.status[i] <= BEAM_FIT_MAX_ITER;
    int di = abs(g.iters[i] - c.iters[i]);
    maxdit = di > maxdit ? di : maxdit;
    /* Scaled errors carry χ²/(N-P), which on clean data is fp32 rounding
     * and differs between the two: compare the H⁻¹ part (and χ² alone). */
    int scaled = o->estimator != BEAM_FIT_MLE && !o->absolute_sigma && c.chi2_red[i] > 0 &&
                 g.chi2_red[i] > 0;
    double sc = scaled ? sqrt(c.chi2_red[i]) : 1, sg = scaled ? sqrt(g.chi2_red[i]) : 1;
    /* dcos_t0 converged with t0 on a sample (a minimum at the kink there):
     * that point's ∂f/∂t0 is 0 on one side and not on the other, and the
     * two paths' t0 differ in the 7th digit, so their H (errors, cov) may
     * legitimately differ by that point's share. Parameters and χ² are
     * still compared. */
    int kink = 0;
    if (b->model == BEAM_FIT_DCOS_T0)
      for (size_t k = 0; k < b->n_points; k++) {
        double xv = b->x[(ptrdiff_t)i * b->x_fit_stride + (ptrdiff_t)k * b->x_point_stride];
        kink |= fabs(xv - c.params[i * P + 5]) <= 1e-5 * (fabs(xv) + 1);
      }
    nkink += kink;
    for (int j = 0; j < P; j++) {
      double cp = c.params[i * P + j], gp = g.params[i * P + j], ce = c.errors[i * P + j];
      double ge = g.errors[i * P + j] / sg * sc, fl = 2e-5 * (fabs(cp) + 0.01);
      double tp = (isfinite(ce) ? 0.05 * ce : 0) + fl;
      if (!close_to(gp, cp, tp) || (!kink && !close_to(ge, ce, 0.02 * ce + fl)))
        fail_msg("%s fit %zu (%s) param %s: cuda %.9g ± %.4g, cpu %.9g ± %.4g", what, i,
                 beam_fit_status_name(c.status[i]), beam_fit_model_info(b->model)->param_names[j],
                 gp, ge, cp, ce);
      if (isfinite(ce) && ce > 0)
        worst = fmax(worst, fabs(gp - cp) / ce);
    }
    double cc = c.chi2[i];
    if (!close_to(g.chi2[i], cc, 1e-4 * fabs(cc) + 1e-9) ||
        !close_to(g.chi2_red[i], c.chi2_red[i], 1e-4 * fabs(c.chi2_red[i]) + 1e-9))
      fail_msg("%s fit %zu: chi2 cuda %.9g cpu %.9g", what, i, g.chi2[i], cc);
    for (int j = 0; j < P * P && !kink; j++) {
      double cv = c.cov[i * P * P + j], gv = g.cov[i * P * P + j] / (sg * sg) * (sc * sc);
      double sd = sqrt(fabs(c.cov[i * P * P + (j / P) * (P + 1)] * c.cov[i * P * P + (j % P) * (P + 1)]));
      if (!close_to(gv, cv, 0.05 * sd + 1e-12))
        fail_msg("%s fit %zu: cov[%d] cuda %.6g cpu %.6g", what, i, j, gv, cv);
    }
  }
  print_message("%-34s %4zu fits x %4zu pts, %3d fitted, mapping %d: worst |dp| %.3f sigma, "
                "max |d iters| %d%s\n", what, N, b->n_points, ok, run.mapping, worst, maxdit,
                nkink ? " (t0 on a sample: errors not compared for those)" : "");
  free(ws);
  res_free(&c);
  res_free(&g);
}

/* N fits of model m at 5 % scatter around the truth, T points on xat,
 * fit-major or frame-major, shared or per-fit x. */
typedef struct gen_s {
  float *x, *y;
  double *p0;
  beam_fit_batch_t b;
} gen_t;

static void gen(gen_t *t, int m, size_t N, size_t T, double noise, int frame_major, int per_fit_x) {
  int P = n_params(m);
  size_t nx = per_fit_x ? N * T : T;
  t->x = malloc(nx * 4), t->y = malloc(N * T * 4), t->p0 = malloc(N * P * 8);
  for (size_t q = 0; q < nx; q++) /* per-fit x: each fit's grid shifted a little */
    t->x[q] = (float)(xat(m, (int)(q % T), (int)T) * (per_fit_x ? 1 + 0.01 * (double)(q / T % 7) : 1));
  ptrdiff_t yfs = frame_major ? 1 : (ptrdiff_t)T, yps = frame_major ? (ptrdiff_t)N : 1;
  for (size_t i = 0; i < N; i++) {
    double p[FIT_MAXP], J[FIT_MAXP];
    for (int j = 0; j < P; j++) {
      p[j] = truth[m][j] * (1 + 0.05 * grand());
      t->p0[i * P + j] = p[j] * (1 + 0.02 * grand());
    }
    for (size_t k = 0; k < T; k++) {
      double xv = t->x[per_fit_x ? i * T + k : k];
      t->y[(ptrdiff_t)i * yfs + (ptrdiff_t)k * yps] =
          (float)(beam__fit_eval(m, P, p, xv, J) + noise * grand());
    }
  }
  t->b = (beam_fit_batch_t){.model = m, .poly_degree = 3, .n_fits = N, .n_points = T,
                            .y = t->y, .y_fit_stride = yfs, .y_point_stride = yps,
                            .x = t->x, .x_fit_stride = per_fit_x ? (ptrdiff_t)T : 0,
                            .x_point_stride = 1};
  if (m == BEAM_FIT_DCOS_T0) /* the guess needs t0 bounded (docs/fit.md) */
    t->b.lo = t0_lo, t->b.hi = t0_hi;
}
static void gen_free(gen_t *t) { free(t->x), free(t->y), free(t->p0); }

static int setup(void **st) {
  (void)st;
  if (!bh_gpu_available())
    return 0;
  beam_diag_t d = {0};
  if (beam_fit_cuda_create(&ctx, &d) != 0) {
    fprintf(stderr, "fit cuda: %s\n", d.msg);
    return -1;
  }
  return 0;
}
static int teardown(void **st) {
  (void)st;
  beam_fit_cuda_destroy(ctx);
  ctx = NULL;
  return 0;
}

/* Without a device the CUDA path refuses at create with ENOTSUP and says why. */
static void need_device(void) {
  if (ctx)
    return;
  beam_fit_cuda_t *c = (beam_fit_cuda_t *)1;
  beam_diag_t d = {0};
  int rc = beam_fit_cuda_create(&c, &d);
  if (rc != BEAM_ENOTSUP || c != NULL ||
      !(strstr(d.msg, "without CUDA") || strstr(d.msg, "needs a CUDA device")))
    fail_msg("fit cuda without a device: rc %d, \"%s\"", rc, d.msg);
  beam_fit_cuda_destroy(NULL);
  skip();
}

static void test_models(void **st) {
  (void)st;
  need_device();
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  char what[64];
  for (int m = 0; m < BEAM_FIT_N_MODELS; m++)
    for (int clean = 0; clean < 2; clean++) {
      gen_t t;
      gen(&t, m, 37, 100, clean ? 0 : noise_of(m), clean, 0);
      snprintf(what, sizeof what, "%s %s%s", beam_fit_model_info(m)->name,
               clean ? "clean" : "noisy", clean ? " frame-major" : "");
      xcheck(what, &t.b, NULL, &o, 0);
      gen_free(&t);
    }
}

static void test_warp_mapping(void **st) {
  (void)st;
  need_device();
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  static const int ms[] = {BEAM_FIT_DCOS, BEAM_FIT_DCOS2, BEAM_FIT_STRETCH, BEAM_FIT_GAUSS};
  char what[64];
  for (size_t q = 0; q < sizeof ms / sizeof *ms; q++) {
    gen_t t;
    gen(&t, ms[q], 9, 300, noise_of(ms[q]), q % 2, 0);
    snprintf(what, sizeof what, "%s T=300 warp (auto)", beam_fit_model_info(ms[q])->name);
    xcheck(what, &t.b, NULL, &o, 0);
    gen_free(&t);
  }
  /* forced either way across the threshold, per-fit x, given starts */
  gen_t t;
  gen(&t, BEAM_FIT_DCOS, 11, 100, 0.03, 0, 1);
  o.init = BEAM_FIT_INIT_GIVEN;
  t.b.p0 = t.p0;
  xcheck("dcos T=100 warp, per-fit x, p0", &t.b, NULL, &o, 2);
  xcheck("dcos T=100 thread, per-fit x, p0", &t.b, NULL, &o, 1);
  gen_free(&t);
}

static void test_bounds(void **st) {
  (void)st;
  need_device();
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  gen_t t;
  gen(&t, BEAM_FIT_DCOS, 37, 100, 0.03, 1, 0);
  /* f capped below the truth (0.8 ± 5 %): bound */
  double lo[5] = {-INFINITY, -INFINITY, 0.1, 0.0, -INFINITY};
  double hi[5] = {INFINITY, INFINITY, 100, 0.7, INFINITY};
  t.b.lo = lo, t.b.hi = hi;
  xcheck("dcos f <= 0.7 (bound)", &t.b, NULL, &o, 0);
  /* a fixed parameter (lo = hi) */
  lo[4] = hi[4] = 0.2, hi[3] = INFINITY;
  xcheck("dcos c fixed", &t.b, NULL, &o, 0);
  gen_free(&t);
  gen(&t, BEAM_FIT_STRETCH, 37, 127, 0.003, 0, 0);
  double glo[4] = {0.0, 1e-6, 0.2, 0.9}, ghi[4] = {1.0, 10.0, 0.75, 1.1};
  t.b.lo = glo, t.b.hi = ghi;
  xcheck("stretch beta <= 0.75", &t.b, NULL, &o, 0);
  gen_free(&t);
}

/* Photon counts as uint16 on the device, the same values as float on the CPU. */
static void test_counts(void **st) {
  (void)st;
  need_device();
  enum { N = 37, T = 100, P = 5 };
  static const double tr[P] = {30, 15, 4, 0.8, 100};
  float *x = malloc(T * 4), *y = malloc(N * T * 4);
  uint16_t *y16 = malloc(N * T * 2);
  for (int k = 0; k < T; k++)
    x[k] = (float)(10.0 * k / (T - 1));
  for (int i = 0; i < N; i++) {
    double p[P], J[FIT_MAXP];
    for (int j = 0; j < P; j++)
      p[j] = tr[j] * (1 + 0.05 * grand());
    for (int k = 0; k < T; k++) {
      double f = beam__fit_eval(BEAM_FIT_DCOS, P, p, x[k], J), v = rint(f + sqrt(f) * grand());
      y16[k * N + i] = (uint16_t)(v < 0 ? 0 : v); /* frame-major, as frames arrive */
      y[k * N + i] = y16[k * N + i];
    }
  }
  beam_fit_batch_t b = {.model = BEAM_FIT_DCOS, .n_fits = N, .n_points = T, .y = y,
                        .y_fit_stride = 1, .y_point_stride = N, .x = x, .x_point_stride = 1};
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  o.estimator = BEAM_FIT_MLE;
  xcheck("dcos u16 MLE", &b, y16, &o, 0);
  xcheck("dcos u16 MLE warp", &b, y16, &o, 2);
  o.estimator = BEAM_FIT_LSE_POISSON;
  xcheck("dcos u16 LSE Poisson", &b, y16, &o, 0);
  o.estimator = BEAM_FIT_LSE;
  o.absolute_sigma = 1;
  xcheck("dcos u16 LSE absolute_sigma", &b, y16, &o, 0);
  free(x), free(y), free(y16);
}

static void test_bad_traces(void **st) {
  (void)st;
  need_device();
  enum { N = 20, T = 100, P = 5 };
  gen_t t;
  gen(&t, BEAM_FIT_DCOS, N, T, 0.03, 0, 0);
  float *w = malloc(N * T * 4);
  for (int q = 0; q < N * T; q++)
    w[q] = 1.0f / (0.03f * 0.03f);
  t.y[1 * T + 40] = NAN;                  /* NaN on a used point: bad_input */
  for (int k = 0; k < T; k++)             /* constant: bad_input */
    t.y[2 * T + k] = 0.25f;
  for (int k = 0; k < T; k++)             /* 13 spread points left: fits */
    w[3 * T + k] = k % 8 ? 0 : w[3 * T + k];
  for (int k = P; k < T; k++)             /* P points left: too_few */
    w[4 * T + k] = 0;
  w[5 * T + 7] = -1;                      /* negative weight: bad_input */
  t.y[6 * T + 9] = NAN, w[6 * T + 9] = 0; /* masked NaN: fits */
  t.y[7 * T + 3] = INFINITY;              /* bad_input */
  for (int k = 0; k < T; k += 2)          /* every other point masked: fits */
    w[8 * T + k] = 0;
  t.b.w = w, t.b.w_fit_stride = T, t.b.w_point_stride = 1;
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  xcheck("dcos bad traces, weights", &t.b, NULL, &o, 0);
  xcheck("dcos bad traces, weights, warp", &t.b, NULL, &o, 2);
  o.init = BEAM_FIT_INIT_GIVEN;
  t.b.p0 = t.p0;
  t.p0[10 * P + 2] = NAN; /* a non-finite start: bad_input */
  xcheck("dcos bad traces, p0", &t.b, NULL, &o, 0);
  /* MLE: a negative count is bad_input; a short trace too_few */
  t.b.w = NULL;
  o.init = BEAM_FIT_INIT_AUTO;
  o.estimator = BEAM_FIT_MLE;
  for (int i = 0; i < N; i++)
    for (int k = 0; k < T; k++)
      t.y[i * T + k] = i == 12 && k == 5 ? -1.0f : 3.0f + 2.0f * t.y[i * T + k];
  xcheck("dcos MLE with a negative value", &t.b, NULL, &o, 0);
  gen_free(&t);
  free(w);
  gen(&t, BEAM_FIT_EXP, 5, 3, 0.003, 0, 0); /* 3 points, 3 params: too_few */
  o.estimator = BEAM_FIT_LSE;
  xcheck("exp T=3", &t.b, NULL, &o, 0);
  gen_free(&t);
}

/* Device starts (gpu/fit_init_cuda.cuh) against fit_init.c's on the host
 * (beam_fit_cuda_starts, host = 1: the numbers beam_fit_cpu_range starts
 * from). Same grids and selection, so equal to rounding: per parameter
 * |dev - host| <= 1e-6·(|host| + s_j), s_j the parameter's typical size
 * (the largest |host| of that parameter in the batch), and no fit may pick
 * another periodogram bin or rate (that would be ~1e-2 apart). */
static void starts_check(const char *what, const beam_fit_batch_t *b, const uint16_t *y16,
                         const beam_fit_opts_t *o) {
  int P = beam_fit_check(b, o, NULL);
  assert_true(P > 0);
  size_t N = b->n_fits;
  double *h = malloc(N * P * 8), *g = malloc(N * P * 8), sc[FIT_MAXP] = {0}, worst = 0;
  beam_diag_t d = {0};
  beam_fit_batch_t bg = *b;
  if (y16)
    bg.y = NULL;
  if (beam_fit_cuda_starts(ctx, &bg, y16, o, 1, h, &d) != 0)
    fail_msg("%s: host starts: %s", what, d.msg);
  if (beam_fit_cuda_starts(ctx, &bg, y16, o, 0, g, &d) != 0)
    fail_msg("%s: device starts: %s", what, d.msg);
  for (size_t q = 0; q < N * P; q++)
    sc[q % P] = fmax(sc[q % P], fabs(h[q]));
  for (size_t i = 0; i < N; i++)
    for (int j = 0; j < P; j++) {
      double hv = h[i * P + j], gv = g[i * P + j], tol = 1e-6 * (fabs(hv) + sc[j]);
      if (!(fabs(gv - hv) <= tol))
        fail_msg("%s fit %zu start %s: device %.12g host %.12g", what, i,
                 beam_fit_model_info(b->model)->param_names[j], gv, hv);
      worst = fmax(worst, fabs(gv - hv) / (fabs(hv) + sc[j]));
    }
  print_message("%-34s %4zu fits x %4zu pts: starts agree, worst %.2e relative\n", what, N,
                b->n_points, worst);
  free(h), free(g);
}

static void test_starts(void **st) {
  (void)st;
  need_device();
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  char what[64];
  for (int m = 0; m < BEAM_FIT_N_MODELS; m++) {
    if (m == BEAM_FIT_POLY)
      continue;
    for (int v = 0; v < 3; v++) { /* noisy fit-major, clean frame-major, per-fit x */
      gen_t t;
      gen(&t, m, 37, 100, v == 1 ? 0 : noise_of(m), v == 1, v == 2);
      snprintf(what, sizeof what, "starts %s %s", beam_fit_model_info(m)->name,
               v == 0 ? "noisy" : v == 1 ? "clean frame-major" : "per-fit x");
      starts_check(what, &t.b, NULL, &o);
      gen_free(&t);
    }
  }
  /* long traces (the T = 1000 periodogram), and masks: a block whose
   * first lane with data differs from the first block's (the periodogram
   * leaves the shared table), dcos_t0 with t0 unbounded above */
  static const int ms[] = {BEAM_FIT_DCOS, BEAM_FIT_DCOS_T0, BEAM_FIT_DCOS2, BEAM_FIT_STRETCH};
  for (size_t q = 0; q < sizeof ms / sizeof *ms; q++) {
    gen_t t;
    gen(&t, ms[q], 21, q == 0 ? 1000 : 300, noise_of(ms[q]), 1, 0);
    size_t N = t.b.n_fits, T = t.b.n_points;
    float *w = malloc(N * T * 4);
    for (size_t k = 0; k < N * T; k++)
      w[k] = 1;
    for (size_t k = 0; k < T; k++) {
      w[k * N + 16] = 0;                     /* fit 16: no data, lref of block 1 is 17 */
      w[k * N + 17] = k < T / 3 ? 0 : 1.0f;  /* a shorter span: another frequency step */
      w[k * N + 3] = k % 3 ? 1.0f : 0;       /* every third point masked */
    }
    t.b.w = w, t.b.w_fit_stride = 1, t.b.w_point_stride = (ptrdiff_t)N;
    snprintf(what, sizeof what, "starts %s T=%zu masks", beam_fit_model_info(ms[q])->name, T);
    starts_check(what, &t.b, NULL, &o);
    if (ms[q] == BEAM_FIT_DCOS_T0) {
      static const double lo6[6] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, 0.8};
      static const double hi6[6] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
      t.b.lo = lo6, t.b.hi = hi6;
      starts_check("starts dcos_t0 t0 >= 0.8 only", &t.b, NULL, &o);
    }
    free(w);
    gen_free(&t);
  }
  /* counts on the device (uint16), Poisson weights and MLE */
  enum { N = 37, T = 100 };
  gen_t t;
  gen(&t, BEAM_FIT_DCOS, N, T, 0, 1, 0);
  uint16_t *y16 = malloc(N * T * 2);
  for (int q = 0; q < N * T; q++) {
    double v = rint(50 + 20 * t.y[q] + 3 * grand());
    y16[q] = (uint16_t)(v < 0 ? 0 : v);
    t.y[q] = y16[q];
  }
  o.estimator = BEAM_FIT_LSE_POISSON;
  starts_check("starts dcos u16 LSE Poisson", &t.b, y16, &o);
  o.estimator = BEAM_FIT_MLE;
  starts_check("starts dcos u16 MLE", &t.b, y16, &o);
  free(y16);
  gen_free(&t);
}

/* Device starts, then fits: the same final fits as the CPU's within the
 * tolerances above, for the launch variants and block sizes too. */
static void test_variants(void **st) {
  (void)st;
  need_device();
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  gen_t t;
  gen(&t, BEAM_FIT_DCOS, 37, 100, 0.03, 1, 0);
  for (int v = 0; v < 3; v++)
    for (int blk = 32; blk <= 128; blk *= 2) {
      beam_fit_cuda_run_t run = {.variant = v, .block = blk};
      size_t N = t.b.n_fits;
      res_t g;
      res_new(&g, N, 5);
      beam_diag_t d = {0};
      assert_int_equal(beam_fit_cuda(ctx, &t.b, NULL, &o, &g.r, &run, &d), 0);
      assert_int_equal(run.variant, v);
      assert_int_equal(run.block, blk);
      assert_int_equal(run.starts, 2);
      res_free(&g);
    }
  xcheck("dcos noisy, device starts", &t.b, NULL, &o, 0);
  beam_fit_cuda_run_t bad = {.block = 48};
  res_t g;
  res_new(&g, t.b.n_fits, 5);
  beam_diag_t d = {0};
  assert_int_equal(beam_fit_cuda(ctx, &t.b, NULL, &o, &g.r, &bad, &d), BEAM_EINVAL);
  bad = (beam_fit_cuda_run_t){.variant = 3};
  assert_int_equal(beam_fit_cuda(ctx, &t.b, NULL, &o, &g.r, &bad, &d), BEAM_EINVAL);
  res_free(&g);
  gen_free(&t);
}

/* ---- the stage `fit`: CPU backend vs CUDA backend, same frames ---- */
static int stage_src_result;

static beam_cnode_t *stage_cfg(void) {
  beam_cnode_t *c = bh_stage_cfg("fit");
  if (stage_src_result) {
    bh_set(c, "source", "result");
    bh_set(c, "model", "exp");
    bh_set(c, "x", "index");
  } else {
    bh_set(c, "model", "dcos");
    bh_set(c, "max_frames", "100");
    bh_set(c, "every", "60");
  }
  return c;
}

/* params (out 0) and errors (out 1) of one emission, CPU vs CUDA: the
 * engine's tolerances (5 % of σ + 2e-5 relative; σ within 2 %), status
 * (out 3) equal. f32: pixel maps [P][h][w]; else f64 [fit][P]. */
static void stage_compare(const xpair_t *x, size_t i0, int P) {
  const beam_frame_t *cp = x->cpu->res[i0], *gp = x->gpu->res[i0];
  const beam_frame_t *ce = x->cpu->res[i0 + 1], *ge = x->gpu->res[i0 + 1];
  const beam_frame_t *cs = x->cpu->res[i0 + 3], *gs = x->gpu->res[i0 + 3];
  assert_int_equal(x->cpu->res_out[i0], 0);
  assert_int_equal(x->cpu->res_out[i0 + 3], 3);
  assert_int_equal(cp->flags, gp->flags);
  assert_int_equal(cp->nbytes, gp->nbytes);
  assert_int_equal(cs->nbytes, gs->nbytes);
  int f32 = cp->dtype == BEAM_DT_F32;
  size_t n = cp->nbytes / (f32 ? 4 : 8), nfit = n / (size_t)P;
  for (size_t k = 0; k < n; k++) {
    size_t fit = f32 ? k % nfit : k / (size_t)P;
    double a = f32 ? ((float *)cp->data)[k] : ((double *)cp->data)[k];
    double b = f32 ? ((float *)gp->data)[k] : ((double *)gp->data)[k];
    double ea = f32 ? ((float *)ce->data)[k] : ((double *)ce->data)[k];
    double eb = f32 ? ((float *)ge->data)[k] : ((double *)ge->data)[k];
    assert_int_equal(((uint8_t *)cs->data)[fit], ((uint8_t *)gs->data)[fit]);
    double fl = 2e-5 * (fabs(a) + 0.01) + (f32 ? 2e-7 * fabs(a) : 0);
    if (!close_to(b, a, (isfinite(ea) ? 0.05 * ea : 0) + fl) || !close_to(eb, ea, 0.02 * ea + fl))
      fail_msg("stage result %zu element %zu (fit %zu): cuda %.9g ± %.3g, cpu %.9g ± %.3g", i0, k,
               fit, b, eb, a, ea);
  }
}

static void test_stage_pixels(void **st) {
  (void)st;
  stage_src_result = 0;
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_fit_cuda_ops, beam_fit_params, stage_cfg);
  enum { H = 6, W = 8, T = 80 };
  xpair_t x;
  xpair_new(&x, &beam_fit_cpu_ops, &beam_fit_cuda_ops, beam_fit_params, stage_cfg);
  uint32_t shp[2] = {H, W};
  xpair_start(&x, BEAM_DT_F32, 2, shp);
  double tp[H * W][5];
  for (int q = 0; q < H * W; q++) {
    static const double tr[5] = {2.0, 1.0, 30.0, 0.06, 5.0};
    for (int j = 0; j < 5; j++)
      tp[q][j] = tr[j] * (1 + 0.1 * grand());
  }
  for (int k = 0; k < T; k++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_F32, 2, shp, (uint64_t)k);
    for (int q = 0; q < H * W; q++) {
      double J[FIT_MAXP];
      ((float *)in->data)[q] =
          (float)(beam__fit_eval(BEAM_FIT_DCOS, 5, tp[q], (double)k, J) + 0.05 * grand());
    }
    if (q_bad_frame(k)) { /* refused by both, counted INCOMPLETE at the end */
      in->flags |= BEAM_FLAG_CORRUPT;
      assert_true(bh_process(x.cpu, in) < 0);
      assert_true(bh_process(x.gpu, in) < 0);
    } else
      xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  /* a PARTIAL preview at 60 frames and the FINAL maps: 2 x 4 outputs */
  assert_int_equal(x.cpu->nres, x.gpu->nres);
  assert_int_equal(x.cpu->nres, 8);
  stage_compare(&x, 0, 5);
  stage_compare(&x, 4, 5);
  print_message("stage fit pixels %dx%d x %d frames: cpu and cuda backends agree\n", H, W, T);
  xpair_free(&x);
}

static void test_stage_result(void **st) {
  (void)st;
  stage_src_result = 1;
  if (!bh_gpu_available())
    xcheck_expect_no_device(&beam_fit_cuda_ops, beam_fit_params, stage_cfg);
  enum { T = 50, NF = 21 };
  xpair_t x;
  xpair_new(&x, &beam_fit_cpu_ops, &beam_fit_cuda_ops, beam_fit_params, stage_cfg);
  uint32_t shp[2] = {T, NF};
  xpair_start(&x, BEAM_DT_F64, 2, shp);
  for (uint64_t fr = 0; fr < 3; fr++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_F64, 2, shp, fr);
    for (int i = 0; i < NF; i++) {
      double p[3] = {0.3 * (1 + 0.1 * grand()), 8.0 * (1 + 0.2 * grand()), 1.0}, J[FIT_MAXP];
      for (int k = 0; k < T; k++)
        ((double *)in->data)[k * NF + i] = beam__fit_eval(BEAM_FIT_EXP, 3, p, k, J) + 0.002 * grand();
    }
    xpair_process(&x, in);
    bh_frame_free(in);
  }
  xpair_end(&x);
  assert_int_equal(x.cpu->nres, x.gpu->nres);
  for (size_t i = 0; i + 3 < x.cpu->nres; i++)
    if (x.cpu->res_out[i] == 0)
      stage_compare(&x, i, 3);
  print_message("stage fit result %d curves x %d points x 3 frames: backends agree\n", NF, T);
  xpair_free(&x);
}

static void test_args(void **st) {
  (void)st;
  need_device();
  gen_t t;
  gen(&t, BEAM_FIT_EXP, 4, 50, 0.003, 0, 0);
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  res_t g;
  res_new(&g, 4, 3);
  beam_diag_t d = {0};
  beam_fit_cuda_run_t run = {.mapping = 3};
  assert_int_equal(beam_fit_cuda(ctx, &t.b, NULL, &o, &g.r, &run, &d), BEAM_EINVAL);
  t.b.model = (beam_fit_model_t)99;
  assert_int_equal(beam_fit_cuda(ctx, &t.b, NULL, &o, &g.r, NULL, &d), BEAM_EINVAL);
  t.b.model = BEAM_FIT_EXP;
  g.r.status = NULL;
  assert_int_equal(beam_fit_cuda(ctx, &t.b, NULL, &o, &g.r, NULL, &d), BEAM_EINVAL);
  res_free(&g);
  gen_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_models),     cmocka_unit_test(test_warp_mapping),
      cmocka_unit_test(test_bounds),     cmocka_unit_test(test_counts),
      cmocka_unit_test(test_bad_traces), cmocka_unit_test(test_args),
      cmocka_unit_test(test_starts),     cmocka_unit_test(test_variants),
      cmocka_unit_test(test_stage_pixels), cmocka_unit_test(test_stage_result),
  };
  return beam_run_tests(tests, setup, teardown);
}
