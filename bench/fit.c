/* bench/fit: times the batched fitter on one thread, for bench/fit.py.
 *
 *   fit --in DIR --model NAME --fits N --points T [--per-fit-x] [--reps R]
 *       [--impl cpu|ref] [--isa auto|sse2|avx2|avx512]
 *
 * DIR holds y.f32 (N x T), x.f32 (T, or N x T), optional lo.f64/hi.f64,
 * as tests/tools/fit_run reads them. Each repetition fits the whole batch
 * with beam_fit_cpu_range (workspace allocated once, outside the timing);
 * prints one JSON line: median and every repetition's seconds, fits/s at
 * the median, the ISA, and the status counts of the last repetition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/fit.h"

static void *slurp(const char *dir, const char *name, size_t want) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  void *b = malloc(want);
  size_t got = fread(b, 1, want, f);
  fclose(f);
  if (got != want) {
    free(b);
    return NULL;
  }
  return b;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  const char *in = NULL, *model = "dcos", *impl = "cpu";
  size_t N = 0, T = 0;
  int reps = 5, per_fit_x = 0, isa = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(argv[i], "--per-fit-x"))
      per_fit_x = 1;
    else if (!strcmp(argv[i], "--in"))
      in = v, i++;
    else if (!strcmp(argv[i], "--model"))
      model = v, i++;
    else if (!strcmp(argv[i], "--impl"))
      impl = v, i++;
    else if (!strcmp(argv[i], "--fits"))
      N = strtoull(v, NULL, 10), i++;
    else if (!strcmp(argv[i], "--points"))
      T = strtoull(v, NULL, 10), i++;
    else if (!strcmp(argv[i], "--reps"))
      reps = atoi(v), i++;
    else if (!strcmp(argv[i], "--isa"))
      isa = !strcmp(v, "sse2") ? 1 : !strcmp(v, "avx2") ? 2 : !strcmp(v, "avx512") ? 3 : 0, i++;
    else {
      fprintf(stderr, "fit: bad option %s\n", argv[i]);
      return 1;
    }
  }
  int m = beam_fit_model_from_name(model);
  if (!in || m < 0 || !N || !T || reps < 1 || reps > 1000) {
    fprintf(stderr, "fit: need --in, a known --model, --fits, --points\n");
    return 1;
  }
  int P = beam_fit_model_info(m)->n_params;
  float *y = slurp(in, "y.f32", N * T * 4), *x = slurp(in, "x.f32", (per_fit_x ? N : 1) * T * 4);
  double *lo = slurp(in, "lo.f64", (size_t)P * 8), *hi = slurp(in, "hi.f64", (size_t)P * 8);
  if (!y || !x || P <= 0) {
    fprintf(stderr, "fit: cannot read %s/y.f32 or x.f32 of that size\n", in);
    return 1;
  }
  beam_fit_batch_t b = {.model = m, .n_fits = N, .n_points = T, .y = y,
                        .y_fit_stride = (ptrdiff_t)T, .y_point_stride = 1, .x = x,
                        .x_fit_stride = per_fit_x ? (ptrdiff_t)T : 0, .x_point_stride = 1,
                        .lo = lo, .hi = hi};
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  o.isa = (beam_fit_isa_t)isa;
  beam_fit_result_t r = {.params = malloc(N * P * 8), .iters = malloc(N * 4),
                         .status = malloc(N)};
  size_t wsz = beam_fit_workspace_size(&b, &o);
  void *ws = malloc(wsz);
  double *sec = malloc(sizeof(double) * reps);
  beam_diag_t d = {0};
  int ref = !strcmp(impl, "ref");
  for (int k = 0; k < reps; k++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ref ? beam_fit_ref_range(&b, &o, 0, N, ws, wsz, &r, &d)
                 : beam_fit_cpu_range(&b, &o, 0, N, ws, wsz, &r, &d);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc) {
      fprintf(stderr, "fit: %s\n", d.msg);
      return 1;
    }
    sec[k] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  }
  size_t cnt[BEAM_FIT_N_STATUS] = {0};
  double iters = 0;
  for (size_t i = 0; i < N; i++) {
    cnt[r.status[i] < BEAM_FIT_N_STATUS ? r.status[i] : 0]++;
    iters += r.iters[i];
  }
  double all[1000];
  memcpy(all, sec, sizeof(double) * reps);
  qsort(sec, reps, sizeof(double), cmp);
  double med = reps % 2 ? sec[reps / 2] : 0.5 * (sec[reps / 2 - 1] + sec[reps / 2]);
  printf("{\"model\": \"%s\", \"fits\": %zu, \"points\": %zu, \"impl\": \"%s\", \"isa\": \"%s\", "
         "\"median_s\": %.6g, \"fits_per_s\": %.6g, \"mean_iters\": %.3f, \"seconds\": [",
         model, N, T, impl, ref ? "ref" : beam_fit_isa_name(beam_fit_cpu_isa(o.isa)), med,
         (double)N / med, iters / (double)N);
  for (int k = 0; k < reps; k++)
    printf("%s%.6g", k ? ", " : "", all[k]);
  printf("], \"status\": {");
  for (int s = 0; s < BEAM_FIT_N_STATUS; s++)
    printf("%s\"%s\": %zu", s ? ", " : "", beam_fit_status_name(s), cnt[s]);
  printf("}}\n");
  free(y), free(x), free(lo), free(hi), free(ws), free(sec);
  free(r.params), free(r.iters), free(r.status);
  return 0;
}
