/* beamd-fit per-tile fitting: beam_fit_cpu_range on disjoint ranges of the
 * tile from `threads` pthreads, each with its own workspace. Each fit is
 * one SIMD lane whose result depends only on its own trace (docs/fit.md),
 * so neither the split over threads nor the tiling changes a single bit
 * of the maps. With --backend cuda each rank fits its tiles with one
 * beam_fit_cuda call on device local_rank mod devices (threads unused);
 * the maps then carry the CUDA engine's rounding (docs/fit.md "CUDA"). */
#include "tools/beamd-fit/bfit.h"

#include "gpu/gpu.h"
#include "pipeline/device.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char *bf_backend_unavailable(bf_backend_t b) {
  static char why[320];
  if (b != BF_CUDA)
    return NULL;
  char w[256] = "";
  if (!beam_gpu_built())
    return "this build has no CUDA (built with CUDA=0); use --backend cpu (or auto)";
  if (beam_gpu_count(w, sizeof w) <= 0) {
    snprintf(why, sizeof why, "no usable CUDA device (%s); use --backend cpu (or auto)", w);
    return why;
  }
  return NULL;
}

bf_backend_t bf_backend_resolve(bf_opts_t *o, int local_rank, char *why, size_t why_len) {
  if (why && why_len)
    why[0] = 0;
  if (o->backend == BF_AUTO) {
    int n = beam_gpu_built() ? beam_gpu_count(why, why_len) : 0;
    if (!beam_gpu_built() && why && why_len)
      snprintf(why, why_len, "built without CUDA");
    o->backend = n > 0 ? BF_CUDA : BF_CPU;
  }
  if (o->backend == BF_CUDA) {
    int n = beam_gpu_count(NULL, 0);
    o->cuda_dev = n > 0 ? local_rank % n : 0;
  }
  return o->backend;
}

int bf_solver_init(bf_solver_t *s, const bf_opts_t *o, uint64_t T, uint64_t tile,
                   beam_diag_t *d) {
  memset(s, 0, sizeof *s);
  s->np = o->np;
  s->threads = (int)o->threads;
  s->cap = tile;
  int P = o->np;
  beam_fit_batch_t b = o->batch;
  b.n_fits = tile;
  b.n_points = T;
  b.y_fit_stride = 1;
  b.y_point_stride = (ptrdiff_t)tile;
  b.x_point_stride = 1;
  static const float dummy = 0;
  b.y = b.x = &dummy; /* only the sizes matter for the workspace */
  double p0dummy[BEAM_FIT_MAX_PARAMS] = {0};
  if (o->fit.init == BEAM_FIT_INIT_GIVEN)
    b.p0 = p0dummy;
  s->ws_bytes = beam_fit_workspace_size(&b, &o->fit);
  if (!s->ws_bytes) {
    beam_fit_check(&b, &o->fit, d);
    return d->code ? d->code : BEAM_DIAG(d, BEAM_EINVAL, "fit options");
  }
  s->ws = calloc((size_t)s->threads, sizeof *s->ws);
  beam_fit_result_t *r = &s->r;
  r->params = malloc(tile * P * sizeof(double));
  r->errors = malloc(tile * P * sizeof(double));
  r->chi2 = malloc(tile * sizeof(double));
  r->chi2_red = malloc(tile * sizeof(double));
  r->iters = malloc(tile * sizeof(int32_t));
  r->n_used = malloc(tile * sizeof(int32_t));
  r->status = malloc(tile);
  if (o->fit.init == BEAM_FIT_INIT_GIVEN && (s->p0rows = malloc(tile * P * sizeof(double))))
    for (uint64_t i = 0; i < tile; i++)
      memcpy(s->p0rows + i * P, o->p0, P * sizeof(double));
  int ok = s->ws && r->params && r->errors && r->chi2 && r->chi2_red && r->iters && r->n_used &&
           r->status && (o->fit.init != BEAM_FIT_INIT_GIVEN || s->p0rows);
  for (int t = 0; ok && t < s->threads; t++)
    ok = (s->ws[t] = malloc(s->ws_bytes)) != NULL;
  if (!ok)
    return BEAM_DIAG(d, BEAM_ENOMEM, "fit results for tiles of %llu pixels",
                     (unsigned long long)tile);
  s->isa = beam_fit_isa_name(beam_fit_cpu_isa(o->fit.isa));
  if (o->backend == BF_CUDA) {
    int rc = beam_fit_cuda_create_dev(&s->cuda, o->cuda_dev, d);
    if (rc < 0)
      return rc;
    snprintf(s->isa_buf, sizeof s->isa_buf, "cuda:%d", o->cuda_dev);
    s->isa = s->isa_buf;
  }
  return 0;
}

typedef struct job_s {
  const beam_fit_batch_t *b;
  const beam_fit_opts_t *o;
  size_t i0, i1;
  void *ws;
  size_t ws_bytes;
  beam_fit_result_t *r;
  beam_diag_t d;
  int rc;
} job_t;

static void *run_job(void *arg) {
  job_t *j = arg;
  beam_diag_clear(&j->d);
  j->rc = j->i1 > j->i0 ? beam_fit_cpu_range(j->b, j->o, j->i0, j->i1, j->ws, j->ws_bytes, j->r,
                                             &j->d)
                        : 0;
  return NULL;
}

int bf_solve(bf_solver_t *s, const bf_opts_t *o, const double *x, uint64_t T, const float *y,
             uint64_t n, double *out, beam_diag_t *d) {
  if (!n)
    return 0;
  if (!s->xf) { /* x is the same for every tile: converted once */
    if (!(s->xf = malloc(T * sizeof *s->xf)))
      return BEAM_DIAG(d, BEAM_ENOMEM, "x");
    for (uint64_t k = 0; k < T; k++)
      s->xf[k] = (float)x[k];
  }
  beam_fit_batch_t b = o->batch;
  b.n_fits = n;
  b.n_points = T;
  b.y = y;
  b.y_fit_stride = 1;
  b.y_point_stride = (ptrdiff_t)n;
  b.x = s->xf;
  b.x_fit_stride = 0;
  b.x_point_stride = 1;
  b.p0 = s->p0rows;
  if (s->cuda) {
    beam_fit_cuda_run_t run;
    memset(&run, 0, sizeof run);
    run.host_starts = o->cuda_starts_host;
    beam_diag_clear(d);
    int rc = beam_fit_cuda(s->cuda, &b, NULL, &o->fit, &s->r, &run, d);
    if (rc < 0)
      return rc;
    goto pack;
  }
  job_t jobs[256];
  pthread_t tid[256];
  int nt = s->threads < 256 ? s->threads : 256;
  /* Ranges of whole 16-lane blocks, so no thread fits a partial block
   * that another could have filled. */
  size_t blocks = (n + 15) / 16;
  for (int t = 0; t < nt; t++) {
    size_t i0 = blocks * (size_t)t / (size_t)nt * 16, i1 = blocks * (size_t)(t + 1) / (size_t)nt * 16;
    jobs[t] = (job_t){&b, &o->fit, i0 < n ? i0 : n, i1 < n ? i1 : n, s->ws[t], s->ws_bytes, &s->r,
                      {0}, 0};
  }
  int started = 0;
  for (int t = 1; t < nt; t++)
    if (pthread_create(&tid[t], NULL, run_job, &jobs[t]) == 0)
      started = t;
    else
      break;
  /* Threads that did not start have their ranges run here. */
  for (int t = started + 1; t < nt; t++)
    run_job(&jobs[t]);
  run_job(&jobs[0]);
  for (int t = 1; t <= started; t++)
    pthread_join(tid[t], NULL);
  for (int t = 0; t < nt; t++)
    if (jobs[t].rc < 0) {
      *d = jobs[t].d;
      return jobs[t].rc;
    }
pack:;
  int P = s->np, S = BF_STRIDE(P);
  const beam_fit_result_t *r = &s->r;
  for (uint64_t i = 0; i < n; i++) {
    double *q = out + i * S;
    memcpy(q, r->params + i * P, P * sizeof(double));
    memcpy(q + P, r->errors + i * P, P * sizeof(double));
    q[2 * P] = r->chi2[i];
    q[2 * P + 1] = r->chi2_red[i];
    q[2 * P + 2] = r->iters[i];
    q[2 * P + 3] = r->n_used[i];
    q[2 * P + 4] = r->status[i];
  }
  return 0;
}

void bf_solver_free(bf_solver_t *s) {
  for (int t = 0; s->ws && t < s->threads; t++)
    free(s->ws[t]);
  free(s->ws);
  free(s->r.params);
  free(s->r.errors);
  free(s->r.chi2);
  free(s->r.chi2_red);
  free(s->r.iters);
  free(s->r.n_used);
  free(s->r.status);
  free(s->p0rows);
  free(s->xf);
  beam_fit_cuda_destroy(s->cuda);
  memset(s, 0, sizeof *s);
}
