/* ptycho: seconds per DM iteration of the CPU engine, beside the time of
 * its FFTs alone measured in the same run, so the engine can be judged
 * against what FFTW can do here.
 *
 *   ptycho [--iters K] [--threads T] [--cases 400:128:1:f32,1000:128:3:f32,...]
 *                                             case = views:n:probe_modes:prec
 *          [--json FILE]
 *
 * Each case: a synthetic scan (a square grid of views 16 pixels apart over a
 * random-phase object, a Gaussian probe, random amplitudes; the values do
 * not change the work), probe updated every iteration, one warm-up
 * iteration then the median of K. The FFT-only figure is a forward plus an
 * inverse batched FFT of every view's modes, on one buffer per thread, with
 * a plan made the way the engine makes its plans (plan_many_dft, FFTW_MEASURE)
 * and the same number of threads: the floor for the exit-wave step. The two
 * alternate (iteration, FFT pass, iteration, ...) and the ratio printed is
 * the median of the per-pair ratios, which a shared machine's changing
 * load disturbs less than a ratio of two separate medians. */
#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_stage.h"
#include "pipeline/ptycho/dm.h"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
  int f64;
  void *fwd, *inv, *buf;
  uint32_t views;
} fft_job_t;

static void *fft_worker(void *arg) {
  fft_job_t *j = arg;
  for (uint32_t v = 0; v < j->views; v++) {
    if (j->f64) {
      fftw_execute_dft(j->fwd, j->buf, j->buf);
      fftw_execute_dft(j->inv, j->buf, j->buf);
    } else {
      fftwf_execute_dft(j->fwd, j->buf, j->buf);
      fftwf_execute_dft(j->inv, j->buf, j->buf);
    }
  }
  return NULL;
}

/* The FFT-only figure: plans and one buffer per thread, made once. */
typedef struct {
  int nt, f64;
  size_t bytes;
  void *fwd, *inv;
  fft_job_t jobs[64];
} fft_only_t;

static void fft_only_init(fft_only_t *f, uint32_t views, uint32_t n, uint32_t M, int f64,
                          int nt) {
  int dims[2] = {(int)n, (int)n}, dist = (int)(n * n);
  f->nt = nt > 64 ? 64 : nt;
  f->f64 = f64;
  f->bytes = (size_t)M * n * n * (f64 ? sizeof(fftw_complex) : sizeof(fftwf_complex));
  for (int t = 0; t < f->nt; t++) {
    f->jobs[t].f64 = f64;
    f->jobs[t].buf = f64 ? (void *)fftw_malloc(f->bytes) : (void *)fftwf_malloc(f->bytes);
    f->jobs[t].views = views / (uint32_t)f->nt + ((uint32_t)t < views % (uint32_t)f->nt);
  }
  void *b = f->jobs[0].buf;
  if (f64) {
    f->fwd = fftw_plan_many_dft(2, dims, (int)M, b, NULL, 1, dist, b, NULL, 1, dist,
                                FFTW_FORWARD, FFTW_MEASURE);
    f->inv = fftw_plan_many_dft(2, dims, (int)M, b, NULL, 1, dist, b, NULL, 1, dist,
                                FFTW_BACKWARD, FFTW_MEASURE);
  } else {
    f->fwd = fftwf_plan_many_dft(2, dims, (int)M, b, NULL, 1, dist, b, NULL, 1, dist,
                                 FFTW_FORWARD, FFTW_MEASURE);
    f->inv = fftwf_plan_many_dft(2, dims, (int)M, b, NULL, 1, dist, b, NULL, 1, dist,
                                 FFTW_BACKWARD, FFTW_MEASURE);
  }
  for (int t = 0; t < f->nt; t++) {
    memset(f->jobs[t].buf, 0, f->bytes);
    f->jobs[t].fwd = f->fwd;
    f->jobs[t].inv = f->inv;
  }
}

/* Seconds for the forward + inverse FFTs of every view's modes. */
static double fft_only_run(fft_only_t *f) {
  pthread_t th[64];
  double t0 = bench_now_s();
  for (int t = 1; t < f->nt; t++)
    pthread_create(&th[t], NULL, fft_worker, &f->jobs[t]);
  fft_worker(&f->jobs[0]);
  for (int t = 1; t < f->nt; t++)
    pthread_join(th[t], NULL);
  return bench_now_s() - t0;
}

static void fft_only_free(fft_only_t *f) {
  if (f->f64) {
    fftw_destroy_plan(f->fwd);
    fftw_destroy_plan(f->inv);
  } else {
    fftwf_destroy_plan(f->fwd);
    fftwf_destroy_plan(f->inv);
  }
  for (int t = 0; t < f->nt; t++)
    f->f64 ? fftw_free(f->jobs[t].buf) : fftwf_free(f->jobs[t].buf);
}

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
  uint32_t views, n, modes;
  int f64;
  double s_iter, s_fft, ratio, s_create, create_bytes;
} result_t;

static int run_case(result_t *r, int iters, int nt) {
  const uint32_t n = r->n, npx = n * n, step = 16;
  uint32_t side = (uint32_t)ceil(sqrt((double)r->views));
  beam_dm_conf_t c;
  beam_dm_conf_default(&c);
  c.prec = r->f64 ? BEAM_DM_F64 : BEAM_DM_F32;
  c.n = n;
  c.max_views = r->views;
  c.obj_h = c.obj_w = n + (side - 1) * step + 2;
  c.probe_modes = r->modes;
  c.probe_update_start = 0;
  c.threads = nt;
  float *amp = malloc(sizeof(float) * npx * r->views);
  int32_t *pos = malloc(sizeof(int32_t) * 2 * r->views);
  double *probe = malloc(sizeof(double) * 2 * npx * r->modes);
  double *obj = malloc(sizeof(double) * 2 * c.obj_h * c.obj_w);
  for (size_t q = 0; q < (size_t)npx * r->views; q++)
    amp[q] = (float)(10.0 * urand());
  for (uint32_t v = 0; v < r->views; v++) {
    pos[2 * v] = (int32_t)((v / side) * step + (uint32_t)(2 * urand()));
    pos[2 * v + 1] = (int32_t)((v % side) * step + (uint32_t)(2 * urand()));
  }
  for (uint32_t m = 0; m < r->modes; m++)
    for (uint32_t y = 0; y < n; y++)
      for (uint32_t x = 0; x < n; x++) {
        double dy = (double)y - n / 2.0, dx = (double)x - n / 2.0;
        double g = exp(-(dy * dy + dx * dx) / (2.0 * (n / 6.0) * (n / 6.0))) / (1.0 + m);
        probe[2 * ((size_t)m * npx + y * n + x)] = g * cos(0.01 * (dx * dx + dy * dy) + m * dx);
        probe[2 * ((size_t)m * npx + y * n + x) + 1] = g * sin(0.01 * (dx * dx + dy * dy) + m * dx);
      }
  for (size_t q = 0; q < (size_t)c.obj_h * c.obj_w; q++) {
    double ph = urand() - 0.5;
    obj[2 * q] = cos(ph);
    obj[2 * q + 1] = sin(ph);
  }
  beam_dm_t *e = NULL;
  beam_diag_t d = {0};
  double t0 = bench_now_s();
  int rc = beam_dm_create(&e, &c, BEAM_DM_CPU, &d);
  r->s_create = bench_now_s() - t0;
  r->create_bytes = (double)beam_dm_bytes(&c);
  if (rc == 0)
    rc = beam_dm_set_probe(e, probe, &d);
  if (rc == 0)
    rc = beam_dm_set_object(e, obj, &d);
  if (rc == 0)
    rc = beam_dm_add_views(e, r->views, amp, pos, &d);
  /* Iterations and FFT-only passes alternate, so a change in the load of a
   * shared machine hits both; the ratio is the median of the pairs. */
  double times[64], ffts[64], ratios[64];
  if (iters > 63)
    iters = 63;
  fft_only_t fo;
  if (rc == 0)
    fft_only_init(&fo, r->views, n, r->modes, r->f64, nt);
  for (int it = 0; rc == 0 && it <= iters; it++) {
    beam_dm_metrics_t m;
    rc = beam_dm_iterate(e, &m, &d);
    double tf = fft_only_run(&fo);
    if (it > 0) {
      times[it - 1] = m.seconds;
      ffts[it - 1] = tf;
      ratios[it - 1] = m.seconds / tf;
    }
  }
  if (rc == 0)
    fft_only_free(&fo);
  if (rc < 0)
    fprintf(stderr, "ptycho: %s: %s\n", beam_err_name(rc), d.msg);
  beam_dm_destroy(&e);
  free(amp);
  free(pos);
  free(probe);
  free(obj);
  if (rc < 0)
    return rc;
  r->s_iter = median(times, iters);
  r->s_fft = median(ffts, iters);
  r->ratio = median(ratios, iters);
  return 0;
}

int main(int argc, char **argv) {
  int iters = 5, nt = 2;
  const char *cases = "400:128:1:f32,400:128:1:f64,1000:128:3:f32";
  const char *json = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--iters"))
      iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads"))
      nt = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--cases"))
      cases = argv[i + 1];
    else if (!strcmp(argv[i], "--json"))
      json = argv[i + 1];
    else {
      fprintf(stderr, "usage: ptycho [--iters K] [--threads T] [--cases V:N:M:PREC,...] "
                      "[--json FILE]\n");
      return 2;
    }
  }
  if (iters < 1 || nt < 1) {
    fprintf(stderr, "ptycho: --iters and --threads must be >= 1\n");
    return 2;
  }
  result_t res[16];
  int nres = 0;
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", cases);
  printf("DM iteration, CPU engine, %d threads (median of %d iterations after 1 warm-up)\n", nt,
         iters);
  printf("  %6s %5s %5s %4s %10s %10s %7s %9s\n", "views", "n", "modes", "prec", "s/iter",
         "FFT-only s", "ratio", "MiB");
  for (char *tok = strtok(buf, ","); tok && nres < 16; tok = strtok(NULL, ",")) {
    result_t *r = &res[nres];
    char prec[8] = "f32";
    memset(r, 0, sizeof *r);
    if (sscanf(tok, "%u:%u:%u:%7s", &r->views, &r->n, &r->modes, prec) < 3) {
      fprintf(stderr, "ptycho: bad case \"%s\" (views:n:modes:prec)\n", tok);
      return 2;
    }
    r->f64 = !strcmp(prec, "f64");
    if (run_case(r, iters, nt) < 0)
      return 1;
    printf("  %6u %5u %5u %4s %10.4f %10.4f %7.2f %9.0f\n", r->views, r->n, r->modes,
           r->f64 ? "f64" : "f32", r->s_iter, r->s_fft, r->ratio,
           r->create_bytes / 1048576.0);
    fflush(stdout);
    nres++;
  }
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) {
      perror(json);
      return 1;
    }
    fprintf(f, "{\"threads\": %d, \"iters\": %d, \"results\": [", nt, iters);
    for (int i = 0; i < nres; i++)
      fprintf(f, "%s{\"views\": %u, \"n\": %u, \"modes\": %u, \"prec\": \"%s\", "
                 "\"s_per_iter\": %.6g, \"fft_only_s\": %.6g, \"ratio\": %.4g, "
                 "\"bytes\": %.0f, \"create_s\": %.4g}",
              i ? ", " : "", res[i].views, res[i].n, res[i].modes, res[i].f64 ? "f64" : "f32",
              res[i].s_iter, res[i].s_fft, res[i].ratio, res[i].create_bytes,
              res[i].s_create);
    fprintf(f, "]}\n");
    fclose(f);
  }
  return 0;
}
