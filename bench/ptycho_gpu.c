/* ptycho_gpu: the DM engine's CUDA backend at the seed paper's scale.
 *
 *   ptycho_gpu [--views 10000] [--iters 50] [--sizes 188,192] [--modes 1,5]
 *              [--prec f32,f64] [--json FILE]
 *
 * Synthetic data, made once per view size on the host (FFTW, all cores):
 * a known phase-and-amplitude object and a soft-edged disk probe with a
 * curved phase, views on a square raster with 70% overlap (step 0.3 n),
 * amplitudes sqrt(whole photons) of |F(P O)|^2 (~1e6 photons per view).
 * Each case (size x modes x precision) creates a CUDA engine for exactly
 * the views, sets a disk probe guess and a flat object, adds the views and
 * times `iters` DM iterations (probe updates from iteration 2, defaults
 * otherwise). It then times the engine's FFTs alone (same batching, same
 * plans: forward + inverse per iteration) for the floor.
 *
 * Device memory: free memory before create minus the least free memory
 * seen after create and after the iterations (cudaMemGetInfo; other users
 * of the device would show up in it). One line per case:
 *   ptycho_gpu n=188 views=10000 modes=1 prec=f32 iters=50 total_s=...
 *   s_per_iter=... fft_s_per_iter=... fft_share=... dev_mib=...
 *   fourier_error_first=... fourier_error_last=...
 * and the same as JSON (one object per case) with --json. Without a
 * device it prints "skipped: no GPU (...)" and exits 0. */
#include <fftw3.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_stage.h"
#include "gpu/gpu.h"
#include "pipeline/ptycho/dm.h"

#define MAX_LIST 8

static int parse_list(const char *s, long *out, int max) {
  int k = 0;
  while (*s && k < max) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || v <= 0)
      return -1;
    out[k++] = v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      return -1;
  }
  return k;
}

/* The probe, mode 0: soft-edged disk of radius n/5, quadratic phase. */
static void disk_probe(uint32_t n, double radius, double curv, double amp, double *p) {
  double h = n / 2.0;
  for (uint32_t y = 0; y < n; y++)
    for (uint32_t x = 0; x < n; x++) {
      double dy = y - h, dx = x - h, r2 = dy * dy + dx * dx;
      double a = amp / (1.0 + exp(sqrt(r2) - radius)), ph = curv * r2;
      p[2 * ((size_t)y * n + x)] = a * cos(ph);
      p[2 * ((size_t)y * n + x) + 1] = a * sin(ph);
    }
}

typedef struct data_s {
  uint32_t n, nv, obj;
  float *amp;   /* nv x n x n */
  int32_t *pos; /* nv x 2 */
} data_t;

typedef struct gen_s {
  const data_t *dt;
  const double *probe; /* n x n complex */
  const double *objv;  /* obj x obj complex */
  fftwf_plan plan;
  uint32_t v0, v1;
} gen_t;

static void *gen_thread(void *arg) {
  gen_t *g = arg;
  const data_t *dt = g->dt;
  size_t n = dt->n, npx = n * n;
  fftwf_complex *b = fftwf_malloc(npx * sizeof *b);
  if (!b)
    return (void *)1;
  for (uint32_t v = g->v0; v < g->v1; v++) {
    size_t r = (size_t)dt->pos[2 * v], c = (size_t)dt->pos[2 * v + 1];
    for (size_t y = 0; y < n; y++)
      for (size_t x = 0; x < n; x++) {
        const double *P = g->probe + 2 * (y * n + x), *O = g->objv + 2 * ((r + y) * dt->obj + c + x);
        b[y * n + x][0] = (float)(P[0] * O[0] - P[1] * O[1]);
        b[y * n + x][1] = (float)(P[0] * O[1] + P[1] * O[0]);
      }
    fftwf_execute_dft(g->plan, b, b); /* new-array execute: thread-safe */
    float *a = dt->amp + (size_t)v * npx;
    for (size_t p = 0; p < npx; p++) {
      double i = ((double)b[p][0] * b[p][0] + (double)b[p][1] * b[p][1]) / (double)npx; /* unitary */
      a[p] = (float)sqrt(floor(i + 0.5));
    }
  }
  fftwf_free(b);
  return NULL;
}

static int make_data(data_t *dt, uint32_t n, uint32_t nv) {
  uint32_t grid = (uint32_t)ceil(sqrt((double)nv)), step = (uint32_t)lround(0.3 * n), margin = 4;
  dt->n = n;
  dt->nv = nv;
  dt->obj = (grid - 1) * step + n + 2 * margin;
  size_t npx = (size_t)n * n, osz = (size_t)dt->obj * dt->obj;
  dt->amp = malloc((size_t)nv * npx * sizeof(float));
  dt->pos = malloc((size_t)nv * 2 * sizeof(int32_t));
  double *objv = malloc(osz * 2 * sizeof(double)), *probe = malloc(npx * 2 * sizeof(double));
  if (!dt->amp || !dt->pos || !objv || !probe) {
    free(objv);
    free(probe);
    return -1;
  }
  for (uint32_t v = 0; v < nv; v++) {
    dt->pos[2 * v] = (int32_t)(margin + step * (v / grid));
    dt->pos[2 * v + 1] = (int32_t)(margin + step * (v % grid));
  }
  for (size_t y = 0; y < dt->obj; y++)
    for (size_t x = 0; x < dt->obj; x++) {
      double a = 0.8 + 0.2 * sin(0.021 * x) * cos(0.013 * y);
      double ph = sin(0.009 * x + 0.005 * y) + 0.5 * (double)(((x / 40) + (y / 40)) % 2) - 0.25;
      objv[2 * (y * dt->obj + x)] = a * cos(ph);
      objv[2 * (y * dt->obj + x) + 1] = a * sin(ph);
    }
  /* amplitude: ~1e6 photons per view over the disk */
  double radius = n / 5.0, amp = sqrt(1e6 / (M_PI * radius * radius));
  disk_probe(n, radius, 2.0 / (n * n), amp, probe);
  fftwf_complex *pb = fftwf_malloc(npx * sizeof *pb);
  fftwf_plan plan = fftwf_plan_dft_2d((int)n, (int)n, pb, pb, FFTW_FORWARD, FFTW_ESTIMATE);
  fftwf_free(pb);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu;
  pthread_t th[64];
  gen_t g[64];
  int rc = 0;
  for (int t = 0; t < nt; t++) {
    g[t] = (gen_t){dt, probe, objv, plan, (uint32_t)((uint64_t)nv * t / nt), (uint32_t)((uint64_t)nv * (t + 1) / nt)};
    if (pthread_create(&th[t], NULL, gen_thread, &g[t]) != 0) {
      gen_thread(&g[t]);
      th[t] = 0;
    }
  }
  for (int t = 0; t < nt; t++) {
    void *ret = NULL;
    if (th[t])
      pthread_join(th[t], &ret);
    if (ret)
      rc = -1;
  }
  fftwf_destroy_plan(plan);
  free(objv);
  free(probe);
  return rc;
}

static void free_data(data_t *dt) {
  free(dt->amp);
  free(dt->pos);
  memset(dt, 0, sizeof *dt);
}

typedef struct result_s {
  uint32_t n, nv, modes, iters;
  const char *prec;
  double total_s, s_per_iter, fft_s_per_iter, dev_mib, fe_first, fe_last;
} result_t;

static int run_case(const data_t *dt, uint32_t modes, beam_dm_prec_t prec, uint32_t iters, result_t *r) {
  beam_dm_conf_t c;
  beam_dm_conf_default(&c);
  c.prec = prec;
  c.n = dt->n;
  c.max_views = dt->nv;
  c.obj_h = c.obj_w = dt->obj;
  c.probe_modes = modes;
  beam_diag_t d = {0};
  size_t npx = (size_t)dt->n * dt->n;
  double *probe = calloc((size_t)modes * npx * 2, sizeof(double));
  if (!probe)
    return -1;
  /* guess: a wider disk, flat phase; extra modes 10% copies with a ramp */
  double radius = dt->n / 5.0, amp = sqrt(1e6 / (M_PI * radius * radius));
  disk_probe(dt->n, 1.1 * radius, 0.0, amp, probe);
  for (uint32_t j = 1; j < modes; j++)
    for (size_t p = 0; p < npx; p++) {
      double w = 0.1 * cos(M_PI * j * (double)(p % dt->n) / dt->n);
      probe[2 * (j * npx + p)] = w * probe[2 * p];
      probe[2 * (j * npx + p) + 1] = w * probe[2 * p + 1];
    }
  size_t free0 = 0, total = 0, free1 = 0;
  beam_gpu_mem_info(0, &free0, &total);
  beam_dm_t *e = NULL;
  int rc = beam_dm_create(&e, &c, BEAM_DM_CUDA, &d);
  if (rc == 0)
    rc = beam_dm_set_probe(e, probe, &d);
  free(probe);
  if (rc == 0)
    rc = beam_dm_add_views(e, dt->nv, dt->amp, dt->pos, &d);
  if (rc < 0) {
    fprintf(stderr, "ptycho_gpu: n %u modes %u %s: %s\n", dt->n, modes, prec == BEAM_DM_F64 ? "f64" : "f32",
            d.msg);
    beam_dm_destroy(&e);
    return -1;
  }
  beam_gpu_mem_info(0, &free1, &total);
  size_t least = free1;
  double t0 = bench_now_s();
  for (uint32_t it = 0; it < iters; it++) {
    beam_dm_metrics_t m;
    if (beam_dm_iterate(e, &m, &d) < 0) {
      fprintf(stderr, "ptycho_gpu: iterate %u: %s\n", it, d.msg);
      beam_dm_destroy(&e);
      return -1;
    }
    if (it == 0)
      r->fe_first = m.fourier_error;
    r->fe_last = m.fourier_error;
  }
  r->total_s = bench_now_s() - t0; /* iterate returns after its metrics copy: the device is idle */
  beam_gpu_mem_info(0, &free1, &total);
  if (free1 < least)
    least = free1;
  beam_dm_destroy(&e);
  r->n = dt->n;
  r->nv = dt->nv;
  r->modes = modes;
  r->iters = iters;
  r->prec = prec == BEAM_DM_F64 ? "f64" : "f32";
  r->s_per_iter = iters ? r->total_s / iters : 0;
  r->dev_mib = free0 > least ? (double)(free0 - least) / (1024.0 * 1024.0) : 0;
  if (beam_dm_cuda_fft_seconds(&c, dt->nv, iters < 10 ? iters : 10, &r->fft_s_per_iter, &d) < 0) {
    fprintf(stderr, "ptycho_gpu: fft floor: %s\n", d.msg);
    return -1;
  }
  return 0;
}

static void usage(void) {
  fprintf(stderr, "usage: ptycho_gpu [--views N] [--iters K] [--sizes 188,192] [--modes 1,5] "
                  "[--prec f32,f64] [--json FILE]\n");
}

int main(int argc, char **argv) {
  long views = 10000, iters = 50, sizes[MAX_LIST] = {188, 192}, modes[MAX_LIST] = {1, 5};
  int nsizes = 2, nmodes = 2, precs[2] = {BEAM_DM_F32, BEAM_DM_F64}, nprec = 2;
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      usage();
      return 2;
    }
    i++;
    if (!strcmp(a, "--views"))
      views = atol(v);
    else if (!strcmp(a, "--iters"))
      iters = atol(v);
    else if (!strcmp(a, "--sizes"))
      nsizes = parse_list(v, sizes, MAX_LIST);
    else if (!strcmp(a, "--modes"))
      nmodes = parse_list(v, modes, MAX_LIST);
    else if (!strcmp(a, "--json"))
      json = v;
    else if (!strcmp(a, "--prec")) {
      nprec = 0;
      if (strstr(v, "f32"))
        precs[nprec++] = BEAM_DM_F32;
      if (strstr(v, "f64"))
        precs[nprec++] = BEAM_DM_F64;
    } else {
      usage();
      return 2;
    }
  }
  if (views < 1 || views > 10000000 || iters < 1 || nsizes < 1 || nmodes < 1 || nprec < 1) {
    usage();
    return 2;
  }
  for (int k = 0; k < nmodes; k++)
    if (modes[k] > BEAM_DM_MAX_PROBE_MODES) {
      fprintf(stderr, "ptycho_gpu: --modes: at most %d\n", BEAM_DM_MAX_PROBE_MODES);
      return 2;
    }
  char why[256] = "";
  if (beam_gpu_count(why, sizeof why) == 0) {
    printf("skipped: no GPU (%s)\n", why);
    return 0;
  }
  char desc[256];
  beam_gpu_describe(desc, sizeof desc);
  printf("# ptycho_gpu: %s; %ld views, %ld DM iterations per case\n", desc, views, iters);
  FILE *jf = NULL;
  if (json && !(jf = fopen(json, "w"))) {
    perror(json);
    return 1;
  }
  if (jf)
    fprintf(jf, "{\"device\": \"%s\", \"cases\": [", desc);
  int failed = 0, first = 1;
  for (int s = 0; s < nsizes; s++) {
    data_t dt;
    double t0 = bench_now_s();
    if (make_data(&dt, (uint32_t)sizes[s], (uint32_t)views) < 0) {
      fprintf(stderr, "ptycho_gpu: out of host memory for %ld views of %ld^2\n", views, sizes[s]);
      free_data(&dt);
      failed = 1;
      continue;
    }
    printf("# n=%ld: object %u x %u, data made in %.1f s\n", sizes[s], dt.obj, dt.obj, bench_now_s() - t0);
    for (int k = 0; k < nmodes; k++)
      for (int p = 0; p < nprec; p++) {
        result_t r;
        memset(&r, 0, sizeof r);
        if (run_case(&dt, (uint32_t)modes[k], (beam_dm_prec_t)precs[p], (uint32_t)iters, &r) < 0) {
          failed = 1;
          continue;
        }
        printf("ptycho_gpu n=%u views=%u modes=%u prec=%s iters=%u total_s=%.3f s_per_iter=%.5f "
               "fft_s_per_iter=%.5f fft_share=%.2f dev_mib=%.0f fourier_error_first=%.4g "
               "fourier_error_last=%.4g\n",
               r.n, r.nv, r.modes, r.prec, r.iters, r.total_s, r.s_per_iter, r.fft_s_per_iter,
               r.s_per_iter > 0 ? r.fft_s_per_iter / r.s_per_iter : 0.0, r.dev_mib, r.fe_first, r.fe_last);
        fflush(stdout);
        if (jf) {
          fprintf(jf,
                  "%s\n {\"n\": %u, \"views\": %u, \"modes\": %u, \"prec\": \"%s\", \"iters\": %u, "
                  "\"total_s\": %.6f, \"s_per_iter\": %.6f, \"fft_s_per_iter\": %.6f, \"dev_mib\": %.1f, "
                  "\"fourier_error_first\": %.6g, \"fourier_error_last\": %.6g}",
                  first ? "" : ",", r.n, r.nv, r.modes, r.prec, r.iters, r.total_s, r.s_per_iter,
                  r.fft_s_per_iter, r.dev_mib, r.fe_first, r.fe_last);
          first = 0;
        }
      }
    free_data(&dt);
  }
  if (jf) {
    fprintf(jf, "\n], \"failed\": %s}\n", failed ? "true" : "false");
    fclose(jf);
  }
  return failed;
}
