/* bench/fit: times the batched fitter on one thread, for bench/fit.py.
 *
 *   fit --in DIR --model NAME --fits N --points T [--per-fit-x] [--reps R]
 *       [--impl cpu|ref|cuda] [--isa auto|sse2|avx2|avx512]
 *   fit --synth --fits N --points T [--u16] [--init given|auto] [--impl ...]
 *       [--mapping auto|thread|warp] [--variant 0|1|2] [--block 32|64|96|128]
 *       [--starts device|host]
 *
 * --synth makes a XANI-shaped damped-cosine batch here (frame-major
 * [point][fit], shared x on [0, 10], noise 0.05; --u16: the same as
 * counts 200 + 100·f + 10·N(0,1)), so a GPU session needs no data files:
 *   fit --synth --fits 4194304 --points 100 --u16 --init given --impl cuda
 * --init given starts from the truth scattered by 2 % (a previous fit's
 * parameters); auto runs the automatic guess (for cuda on the device, or
 * with --starts host by fit_init.c on the host, single-threaded). --variant
 * and --block pick the fit kernel's launch bounds and block size
 * (beam_fit_cuda_run_t); the JSON names the ones that ran.
 * --impl cuda times beam_fit_cuda (context made once, outside the timing)
 * and adds its event times (h2d, kernel, d2h, host guess) of the median
 * run; without CUDA or a device it prints "skipped: no GPU (...)" and
 * exits 0.
 *
 * DIR holds y.f32 (N x T), x.f32 (T, or N x T), optional lo.f64/hi.f64,
 * as tests/tools/fit_run reads them. Each repetition fits the whole batch
 * with beam_fit_cpu_range (workspace allocated once, outside the timing);
 * prints one JSON line: median and every repetition's seconds, fits/s at
 * the median, the median thread CPU time (cpu_s, fits_per_cpu_s: less
 * sensitive to a shared host), the ISA, and the status counts of the last
 * repetition. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <math.h>
#include <stdint.h>

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

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}
static double grand(void) {
  double u = urand() + 1e-300, v = urand();
  return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

/* The XANI-shaped batch: N damped cosines, frame-major, shared x. */
static void synth(size_t N, size_t T, int u16, float **y, uint16_t **y16, float **x, double **p0) {
  static const double tr[5] = {1.0, 0.5, 4.0, 0.8, 0.2};
  *x = malloc(T * 4);
  *p0 = malloc(N * 5 * 8);
  *y = u16 ? NULL : malloc(N * T * 4);
  *y16 = u16 ? malloc(N * T * 2) : NULL;
  for (size_t k = 0; k < T; k++)
    (*x)[k] = (float)(10.0 * (double)k / (double)(T - 1));
  for (size_t i = 0; i < N; i++) {
    double p[5];
    for (int j = 0; j < 5; j++) {
      p[j] = tr[j] * (1 + 0.1 * grand());
      (*p0)[i * 5 + j] = p[j] * (1 + 0.02 * grand());
    }
    if (u16) {
      (*p0)[i * 5 + 0] *= 100, (*p0)[i * 5 + 1] *= 100;
      (*p0)[i * 5 + 4] = 200 + 100 * (*p0)[i * 5 + 4];
    }
    float it = (float)(1 / p[2]), w = (float)(2 * M_PI * p[3]);
    for (size_t k = 0; k < T; k++) {
      float t = (*x)[k], f = expf(-t * it) * ((float)p[0] * cosf(w * t) + (float)p[1] * sinf(w * t)) +
                             (float)p[4];
      float nz = (float)grand();
      if (u16) {
        float v = rintf(200 + 100 * f + 10 * nz);
        (*y16)[k * N + i] = (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
      } else
        (*y)[k * N + i] = f + 0.05f * nz;
    }
  }
}

int main(int argc, char **argv) {
  const char *in = NULL, *model = "dcos", *impl = "cpu";
  size_t N = 0, T = 0;
  int reps = 5, per_fit_x = 0, isa = 0, syn = 0, u16 = 0, given = 0, mapping = 0;
  int variant = 0, block = 0, host_starts = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (!strcmp(argv[i], "--per-fit-x"))
      per_fit_x = 1;
    else if (!strcmp(argv[i], "--synth"))
      syn = 1;
    else if (!strcmp(argv[i], "--u16"))
      u16 = 1;
    else if (!strcmp(argv[i], "--init"))
      given = !strcmp(v, "given"), i++;
    else if (!strcmp(argv[i], "--mapping"))
      mapping = !strcmp(v, "thread") ? 1 : !strcmp(v, "warp") ? 2 : 0, i++;
    else if (!strcmp(argv[i], "--variant"))
      variant = atoi(v), i++;
    else if (!strcmp(argv[i], "--block"))
      block = atoi(v), i++;
    else if (!strcmp(argv[i], "--starts"))
      host_starts = !strcmp(v, "host"), i++;
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
  if (syn)
    model = "dcos";
  int m = beam_fit_model_from_name(model);
  if ((!in && !syn) || m < 0 || !N || !T || reps < 1 || reps > 1000 || (u16 && !syn)) {
    fprintf(stderr, "fit: need --in or --synth, a known --model, --fits, --points (--u16 with --synth)\n");
    return 1;
  }
  int cuda = !strcmp(impl, "cuda"), ref = !strcmp(impl, "ref");
  beam_fit_cuda_t *ctx = NULL;
  beam_diag_t d = {0};
  if (cuda && beam_fit_cuda_create(&ctx, &d) != 0) {
    printf("skipped: no GPU (%s)\n", d.msg);
    return 0;
  }
  int P = beam_fit_model_info(m)->n_params;
  float *y = NULL, *x = NULL;
  uint16_t *y16 = NULL;
  double *lo = NULL, *hi = NULL, *p0 = NULL;
  if (syn) {
    synth(N, T, u16, &y, &y16, &x, &p0);
  } else {
    y = slurp(in, "y.f32", N * T * 4), x = slurp(in, "x.f32", (per_fit_x ? N : 1) * T * 4);
    lo = slurp(in, "lo.f64", (size_t)P * 8), hi = slurp(in, "hi.f64", (size_t)P * 8);
    p0 = slurp(in, "p0.f64", N * (size_t)P * 8);
  }
  if ((!y && !y16) || !x || P <= 0 || (given && !p0)) {
    fprintf(stderr, "fit: cannot read %s/y.f32, x.f32 (or p0.f64) of that size\n", in);
    return 1;
  }
  /* The CPU paths take float: counts are converted once, outside the timing. */
  if (y16 && !cuda) {
    y = malloc(N * T * 4);
    for (size_t q = 0; q < N * T; q++)
      y[q] = y16[q];
  }
  beam_fit_batch_t b = {.model = m, .n_fits = N, .n_points = T, .y = y,
                        .y_fit_stride = syn ? 1 : (ptrdiff_t)T,
                        .y_point_stride = syn ? (ptrdiff_t)N : 1, .x = x,
                        .x_fit_stride = per_fit_x ? (ptrdiff_t)T : 0, .x_point_stride = 1,
                        .p0 = p0, .lo = lo, .hi = hi};
  beam_fit_opts_t o;
  beam_fit_opts_default(&o);
  o.isa = (beam_fit_isa_t)isa;
  o.init = given ? BEAM_FIT_INIT_GIVEN : BEAM_FIT_INIT_AUTO;
  beam_fit_result_t r = {.params = malloc(N * P * 8), .iters = malloc(N * 4),
                         .status = malloc(N)};
  size_t wsz = cuda ? 0 : beam_fit_workspace_size(&b, &o);
  void *ws = cuda ? NULL : malloc(wsz);
  double *sec = malloc(sizeof(double) * reps), *cpu = malloc(sizeof(double) * reps);
  beam_fit_cuda_run_t *runs = calloc((size_t)reps, sizeof *runs);
  for (int k = 0; k < reps; k++) {
    struct timespec t0, t1, c0, c1;
    runs[k].mapping = mapping;
    runs[k].variant = variant;
    runs[k].block = block;
    runs[k].host_starts = host_starts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = cuda  ? beam_fit_cuda(ctx, &b, y16, &o, &r, &runs[k], &d)
             : ref ? beam_fit_ref_range(&b, &o, 0, N, ws, wsz, &r, &d)
                   : beam_fit_cpu_range(&b, &o, 0, N, ws, wsz, &r, &d);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    if (rc) {
      fprintf(stderr, "fit: %s\n", d.msg);
      return 1;
    }
    sec[k] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cpu[k] = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
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
  /* CPU time of this thread: on a shared host it excludes the time the
   * thread waited for a core (the wall time does not). */
  qsort(cpu, reps, sizeof(double), cmp);
  double cmed = reps % 2 ? cpu[reps / 2] : 0.5 * (cpu[reps / 2 - 1] + cpu[reps / 2]);
  /* the CUDA event times of the run whose kernel time is the median */
  double kt[1000];
  for (int k = 0; k < reps; k++)
    kt[k] = runs[k].kernel_s;
  qsort(kt, reps, sizeof(double), cmp);
  const beam_fit_cuda_run_t *mr = &runs[0];
  for (int k = 0; k < reps; k++)
    if (runs[k].kernel_s == kt[reps / 2])
      mr = &runs[k];
  printf("{\"model\": \"%s\", \"fits\": %zu, \"points\": %zu, \"impl\": \"%s\", \"isa\": \"%s\", "
         "\"input\": \"%s\", \"init\": \"%s\", "
         "\"median_s\": %.6g, \"fits_per_s\": %.6g, \"cpu_s\": %.6g, \"fits_per_cpu_s\": %.6g, "
         "\"mean_iters\": %.3f, \"seconds\": [",
         model, N, T, impl,
         cuda ? "cuda" : ref ? "ref" : beam_fit_isa_name(beam_fit_cpu_isa(o.isa)),
         y16 ? "u16" : "f32", given ? "given" : "auto", med, (double)N / med, cmed,
         (double)N / cmed, iters / (double)N);
  for (int k = 0; k < reps; k++)
    printf("%s%.6g", k ? ", " : "", all[k]);
  printf("], \"status\": {");
  for (int s = 0; s < BEAM_FIT_N_STATUS; s++)
    printf("%s\"%s\": %zu", s ? ", " : "", beam_fit_status_name(s), cnt[s]);
  printf("}");
  if (cuda)
    printf(", \"cuda\": {\"mapping\": \"%s\", \"variant\": %d, \"block\": %d, \"starts\": \"%s\", "
           "\"kernel_s\": %.6g, \"h2d_s\": %.6g, \"d2h_s\": %.6g, "
           "\"guess_s\": %.6g, \"kernel_fits_per_s\": %.6g}",
           mr->mapping == 2 ? "warp" : mr->mapping == 1 ? "thread" : "cpu", mr->variant, mr->block,
           mr->starts == 2 ? "device" : mr->starts == 1 ? "host" : "given", mr->kernel_s, mr->h2d_s,
           mr->d2h_s, mr->guess_s, mr->kernel_s > 0 ? (double)N / mr->kernel_s : 0.0);
  printf("}\n");
  beam_fit_cuda_destroy(ctx);
  free(y), free(y16), free(x), free(lo), free(hi), free(p0), free(ws), free(sec), free(cpu), free(runs);
  free(r.params), free(r.iters), free(r.status);
  return 0;
}
