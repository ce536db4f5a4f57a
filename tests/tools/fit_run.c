/* fit_run: runs the batched fitter on raw files, for the integration tests
 * (tests/integration/test_fit_engine.py) and by hand.
 *
 *   fit_run --in DIR --out DIR --model NAME --fits N --points T [options]
 *
 * DIR (in) holds little-endian raw arrays:
 *   y.f32    N x T (fit-major)
 *   x.f32    T (shared), or N x T with --per-fit-x
 *   w.f32    N x T weights (optional; LSE only)
 *   p0.f64   N x P starts (with --init given)
 *   lo.f64, hi.f64   P bounds each (optional)
 * DIR (out) receives params.f64, errors.f64 (N x P), cov.f64 (N x P x P),
 * chi2.f64, chi2_red.f64, iters.i32, n_used.i32, status.u8.
 *
 * Options: --impl cpu|ref --estimator lse|poisson|mle --isa auto|sse2|avx2|avx512
 *   --init auto|given --degree D (poly) --max-iter K --ftol F --xtol F --gtol F
 *   --absolute-sigma --layout fit|point (point: y and w transposed to
 *   [T][N] and passed with strides) --chunk C (fit in ranges of C)
 * Prints "isa=<name> seconds=<wall time of the fit calls>". Exit status 0,
 * or 1 with the engine's message on stderr. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/fit.h"

static void *read_file(const char *dir, const char *name, size_t want, int optional) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (!optional)
      fprintf(stderr, "fit_run: %s: %s\n", path, strerror(errno));
    return NULL;
  }
  void *buf = malloc(want ? want : 1);
  size_t got = buf ? fread(buf, 1, want, f) : 0;
  int extra = fgetc(f) != EOF;
  fclose(f);
  if (got != want || extra) {
    fprintf(stderr, "fit_run: %s: expected %zu bytes\n", path, want);
    free(buf);
    return NULL;
  }
  return buf;
}

static int write_file(const char *dir, const char *name, const void *buf, size_t len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len) {
    fprintf(stderr, "fit_run: %s: %s\n", path, strerror(errno));
    if (f)
      fclose(f);
    return -1;
  }
  return fclose(f) == 0 ? 0 : -1;
}

static int pick(const char *v, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (strcmp(v, names[i]) == 0)
      return i;
  return -1;
}

int main(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *model = NULL, *impl = "cpu";
  size_t N = 0, T = 0, chunk = 0;
  int per_fit_x = 0, point_layout = 0;
  beam_fit_batch_t b;
  beam_fit_opts_t o;
  memset(&b, 0, sizeof b);
  beam_fit_opts_default(&o);
  static const char *const est[] = {"lse", "poisson", "mle"};
  static const char *const isa[] = {"auto", "sse2", "avx2", "avx512"};
  static const char *const init[] = {"auto", "given"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int used = 1;
    if (!strcmp(a, "--per-fit-x"))
      per_fit_x = 1, used = 0;
    else if (!strcmp(a, "--absolute-sigma"))
      o.absolute_sigma = 1, used = 0;
    else if (!v)
      used = -1;
    else if (!strcmp(a, "--in"))
      in = v;
    else if (!strcmp(a, "--out"))
      out = v;
    else if (!strcmp(a, "--model"))
      model = v;
    else if (!strcmp(a, "--impl"))
      impl = v;
    else if (!strcmp(a, "--fits"))
      N = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--points"))
      T = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--chunk"))
      chunk = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--degree"))
      b.poly_degree = atoi(v);
    else if (!strcmp(a, "--max-iter"))
      o.max_iter = atoi(v);
    else if (!strcmp(a, "--ftol"))
      o.ftol = strtod(v, NULL);
    else if (!strcmp(a, "--xtol"))
      o.xtol = strtod(v, NULL);
    else if (!strcmp(a, "--gtol"))
      o.gtol = strtod(v, NULL);
    else if (!strcmp(a, "--estimator") && pick(v, est, 3) >= 0)
      o.estimator = (beam_fit_estimator_t)pick(v, est, 3);
    else if (!strcmp(a, "--isa") && pick(v, isa, 4) >= 0)
      o.isa = (beam_fit_isa_t)pick(v, isa, 4);
    else if (!strcmp(a, "--init") && pick(v, init, 2) >= 0)
      o.init = (beam_fit_init_t)pick(v, init, 2);
    else if (!strcmp(a, "--layout") && (!strcmp(v, "fit") || !strcmp(v, "point")))
      point_layout = !strcmp(v, "point");
    else
      used = -1;
    if (used < 0) {
      fprintf(stderr, "fit_run: bad option %s (see the file header)\n", a);
      return 1;
    }
    i += used;
  }
  int m = model ? beam_fit_model_from_name(model) : -1;
  if (!in || !out || m < 0 || !N || !T) {
    fprintf(stderr, "fit_run: need --in, --out, a known --model, --fits, --points\n");
    return 1;
  }
  b.model = (beam_fit_model_t)m;
  b.n_fits = N;
  b.n_points = T;
  int P = beam_fit_model_info(b.model)->n_params;
  if (b.model == BEAM_FIT_POLY)
    P = b.poly_degree + 1;
  if (P <= 0 || P > BEAM_FIT_MAX_PARAMS) {
    fprintf(stderr, "fit_run: bad degree\n");
    return 1;
  }
  float *y = read_file(in, "y.f32", N * T * 4, 0);
  float *x = read_file(in, "x.f32", (per_fit_x ? N : 1) * T * 4, 0);
  float *w = read_file(in, "w.f32", N * T * 4, 1);
  double *p0 = read_file(in, "p0.f64", N * P * 8, 1);
  double *lo = read_file(in, "lo.f64", P * 8, 1), *hi = read_file(in, "hi.f64", P * 8, 1);
  if (!y || !x)
    return 1;
  if (point_layout) { /* [T][N], as frames arrive */
    float *yt = malloc(N * T * 4), *wt = w ? malloc(N * T * 4) : NULL;
    for (size_t i = 0; i < N; i++)
      for (size_t k = 0; k < T; k++) {
        yt[k * N + i] = y[i * T + k];
        if (w)
          wt[k * N + i] = w[i * T + k];
      }
    free(y), free(w);
    y = yt, w = wt;
    b.y_fit_stride = b.w_fit_stride = 1;
    b.y_point_stride = b.w_point_stride = (ptrdiff_t)N;
  } else {
    b.y_fit_stride = b.w_fit_stride = (ptrdiff_t)T;
    b.y_point_stride = b.w_point_stride = 1;
  }
  b.y = y, b.w = w, b.x = x, b.p0 = p0, b.lo = lo, b.hi = hi;
  b.x_fit_stride = per_fit_x ? (ptrdiff_t)T : 0;
  b.x_point_stride = 1;
  beam_fit_result_t r = {
      .params = malloc(N * P * 8), .errors = malloc(N * P * 8), .cov = malloc(N * P * P * 8),
      .chi2 = malloc(N * 8), .chi2_red = malloc(N * 8), .iters = malloc(N * 4),
      .n_used = malloc(N * 4), .status = malloc(N)};
  beam_diag_t d = {0};
  size_t wsz = beam_fit_workspace_size(&b, &o);
  if (!wsz) {
    beam_fit_check(&b, &o, &d);
    fprintf(stderr, "fit_run: %s\n", d.msg);
    return 1;
  }
  void *ws = malloc(wsz);
  int ref = !strcmp(impl, "ref");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = 0;
  for (size_t i0 = 0; i0 < N && rc == 0; i0 += chunk ? chunk : N) {
    size_t i1 = chunk && i0 + chunk < N ? i0 + chunk : N;
    rc = ref ? beam_fit_ref_range(&b, &o, i0, i1, ws, wsz, &r, &d)
             : beam_fit_cpu_range(&b, &o, i0, i1, ws, wsz, &r, &d);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc) {
    fprintf(stderr, "fit_run: %s\n", d.msg);
    return 1;
  }
  printf("isa=%s seconds=%.6f\n", ref ? "ref" : beam_fit_isa_name(beam_fit_cpu_isa(o.isa)),
         (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  if (write_file(out, "params.f64", r.params, N * P * 8) ||
      write_file(out, "errors.f64", r.errors, N * P * 8) ||
      write_file(out, "cov.f64", r.cov, N * P * P * 8) ||
      write_file(out, "chi2.f64", r.chi2, N * 8) ||
      write_file(out, "chi2_red.f64", r.chi2_red, N * 8) ||
      write_file(out, "iters.i32", r.iters, N * 4) ||
      write_file(out, "n_used.i32", r.n_used, N * 4) ||
      write_file(out, "status.u8", r.status, N))
    return 1;
  free(ws), free(y), free(x), free(w), free(p0), free(lo), free(hi);
  free(r.params), free(r.errors), free(r.cov), free(r.chi2), free(r.chi2_red);
  free(r.iters), free(r.n_used), free(r.status);
  return 0;
}
