/* The DM engine's front end (see dm.h): conf validation, backend choice,
 * argument checks, counters and iteration timing. The arithmetic lives in
 * the backends (dm_cpu.c, gpu/dm_cuda.cu) behind dm_int.h. */
#include "pipeline/ptycho/dm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


#include "pipeline/frame.h"
#include "pipeline/ptycho/dm_int.h"

/* Bounds that catch unit mistakes (a byte count passed as n) before they
 * turn into a huge allocation. */
#define DM_MAX_N 8192u
#define DM_MAX_OBJ_SIDE 65536u
#define DM_MAX_INNER 100u
#define DM_MAX_THREADS 1024

void beam_dm_conf_default(beam_dm_conf_t *c) {
  memset(c, 0, sizeof *c);
  c->prec = BEAM_DM_F32;
  c->probe_modes = 1;
  c->object_modes = 1;
  c->beta = 1.0;
  c->obj_reg = 1e-3;
  c->probe_reg = 1e-3;
  c->probe_update_start = 2;
  c->inner_passes = 1;
}

static int check_conf(const beam_dm_conf_t *c, beam_diag_t *d) {
#define BAD(...) return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: " __VA_ARGS__)
  if (c->prec != BEAM_DM_F32 && c->prec != BEAM_DM_F64)
    BAD("conf.prec = %d: must be BEAM_DM_F32 (0) or BEAM_DM_F64 (1)", (int)c->prec);
  if (c->n < 2 || c->n > DM_MAX_N)
    BAD("conf.n = %u: the view side must be in [2, %u]", c->n, DM_MAX_N);
  if (c->max_views < 1)
    BAD("conf.max_views = 0: must be >= 1");
  if (c->obj_h < c->n || c->obj_h > DM_MAX_OBJ_SIDE)
    BAD("conf.obj_h = %u: must be in [n = %u, %u]", c->obj_h, c->n, DM_MAX_OBJ_SIDE);
  if (c->obj_w < c->n || c->obj_w > DM_MAX_OBJ_SIDE)
    BAD("conf.obj_w = %u: must be in [n = %u, %u]", c->obj_w, c->n, DM_MAX_OBJ_SIDE);
  if (c->probe_modes < 1 || c->probe_modes > BEAM_DM_MAX_PROBE_MODES)
    BAD("conf.probe_modes = %u: must be in [1, %d]", c->probe_modes, BEAM_DM_MAX_PROBE_MODES);
  if (c->object_modes < 1 || c->object_modes > BEAM_DM_MAX_OBJECT_MODES)
    BAD("conf.object_modes = %u: must be in [1, %d]", c->object_modes,
        BEAM_DM_MAX_OBJECT_MODES);
  if (!(c->beta > 0.0 && c->beta <= 1.0))
    BAD("conf.beta = %g: must be in (0, 1]", c->beta);
  if (c->algorithm != BEAM_DM_ALG_DM && c->algorithm != BEAM_DM_ALG_RAAR)
    BAD("conf.algorithm = %d: must be BEAM_DM_ALG_DM (0) or BEAM_DM_ALG_RAAR (1)",
        (int)c->algorithm);
  if (!(c->obj_reg >= 0.0 && isfinite(c->obj_reg)))
    BAD("conf.obj_reg = %g: must be finite and >= 0", c->obj_reg);
  if (!(c->probe_reg >= 0.0 && isfinite(c->probe_reg)))
    BAD("conf.probe_reg = %g: must be finite and >= 0", c->probe_reg);
  if (c->inner_passes < 1 || c->inner_passes > DM_MAX_INNER)
    BAD("conf.inner_passes = %u: must be in [1, %u]", c->inner_passes, DM_MAX_INNER);
  if (!(c->fourier_relax >= 0.0 && isfinite(c->fourier_relax)))
    BAD("conf.fourier_relax = %g: must be finite and >= 0 (0 = off)", c->fourier_relax);
  if (!(c->probe_support >= 0.0 && isfinite(c->probe_support)))
    BAD("conf.probe_support = %g: must be finite and >= 0 (0 = off)", c->probe_support);
  if (c->threads < 0 || c->threads > DM_MAX_THREADS)
    BAD("conf.threads = %d: must be in [0, %d] (0 = all cores)", c->threads, DM_MAX_THREADS);
  if (c->device < 0)
    BAD("conf.device = %d: must be >= 0", c->device);
#undef BAD
  return 0;
}

size_t beam_dm_bytes(const beam_dm_conf_t *c) {
  /* The host (CPU backend) figure; the CUDA backend checks its own device
   * footprint against free device memory at create. */
  if (check_conf(c, NULL) < 0)
    return 0;
  return beam_dm_cpu_backend.bytes(c);
}

int beam_dm_create(beam_dm_t **out, const beam_dm_conf_t *c, beam_dm_backend_t be,
                   beam_diag_t *d) {
  BEAM_ASSERT(out && c);
  *out = NULL;
  int rc = check_conf(c, d);
  if (rc < 0)
    return rc;
  const beam_dm_backend_t_ *ops;
  if (be == BEAM_DM_CPU)
    ops = &beam_dm_cpu_backend;
  else if (be == BEAM_DM_CUDA)
    ops = &beam_dm_cuda_backend;
  else
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: backend %d: must be BEAM_DM_CPU or BEAM_DM_CUDA",
                     (int)be);
  beam_dm_t *e = calloc(1, sizeof *e);
  if (!e)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: out of memory for the engine");
  e->conf = *c;
  e->be = ops;
  rc = ops->create(e, d);
  if (rc < 0) {
    free(e);
    return rc;
  }
  *out = e;
  return 0;
}

void beam_dm_destroy(beam_dm_t **pe) {
  if (!pe || !*pe)
    return;
  beam_dm_t *e = *pe;
  if (e->be && e->be->destroy)
    e->be->destroy(e);
  free(e);
  *pe = NULL;
}

const beam_dm_conf_t *beam_dm_conf(const beam_dm_t *e) { return &e->conf; }

static int all_finite(const double *v, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!isfinite(v[i]))
      return 0;
  return 1;
}

int beam_dm_set_probe(beam_dm_t *e, const double *probe, beam_diag_t *d) {
  BEAM_ASSERT(e && probe);
  size_t count = (size_t)e->conf.probe_modes * e->conf.n * e->conf.n * 2;
  if (!all_finite(probe, count))
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: set_probe: the probe has non-finite values");
  return e->be->set_probe(e, probe, d);
}

int beam_dm_set_object(beam_dm_t *e, const double *obj, beam_diag_t *d) {
  BEAM_ASSERT(e && obj);
  size_t count = (size_t)e->conf.object_modes * e->conf.obj_h * e->conf.obj_w * 2;
  if (!all_finite(obj, count))
    return BEAM_DIAG(d, BEAM_EINVAL, "ptycho: set_object: the object has non-finite values");
  return e->be->set_object(e, obj, d);
}

int beam_dm_get_probe(beam_dm_t *e, double *probe, beam_diag_t *d) {
  BEAM_ASSERT(e && probe);
  return e->be->get_probe(e, probe, d);
}

int beam_dm_get_object(beam_dm_t *e, double *obj, beam_diag_t *d) {
  BEAM_ASSERT(e && obj);
  return e->be->get_object(e, obj, d);
}

int beam_dm_add_views(beam_dm_t *e, uint32_t count, const float *amp, const int32_t *pos,
                      beam_diag_t *d) {
  BEAM_ASSERT(e);
  if (count == 0)
    return 0;
  BEAM_ASSERT(amp && pos);
  const beam_dm_conf_t *c = &e->conf;
  if (count > c->max_views - e->nviews)
    return BEAM_DIAG(d, BEAM_ELIMIT,
                     "ptycho: add_views: %u views + %u held exceed max_views = %u", count,
                     e->nviews, c->max_views);
  size_t npx = (size_t)c->n * c->n;
  for (uint32_t v = 0; v < count; v++) {
    int64_t r = pos[2 * v], col = pos[2 * v + 1];
    if (r < 0 || col < 0 || r + c->n > c->obj_h || col + c->n > c->obj_w)
      return BEAM_DIAG(d, BEAM_EINVAL,
                       "ptycho: add_views: view %u (of this call) at (row %lld, col %lld): its "
                       "%u x %u window is outside the %u x %u object",
                       v, (long long)r, (long long)col, c->n, c->n, c->obj_h, c->obj_w);
    const float *a = amp + v * npx;
    for (size_t p = 0; p < npx; p++)
      if (!isfinite(a[p]))
        return BEAM_DIAG(d, BEAM_EINVAL,
                         "ptycho: add_views: view %u (of this call) pixel %zu is not finite "
                         "(mark masked pixels with a negative amplitude)",
                         v, p);
  }
  int rc = e->be->add_views(e, e->nviews, count, amp, pos, d);
  if (rc < 0)
    return rc;
  e->nviews += count;
  return 0;
}

uint32_t beam_dm_nviews(const beam_dm_t *e) { return e->nviews; }
uint32_t beam_dm_iterations(const beam_dm_t *e) { return e->iterations; }

static double now_s(void) { return 1e-9 * (double)beam_now_ns(); }

int beam_dm_iterate(beam_dm_t *e, beam_dm_metrics_t *m, beam_diag_t *d) {
  BEAM_ASSERT(e);
  beam_dm_metrics_t local;
  if (!m)
    m = &local;
  memset(m, 0, sizeof *m);
  if (e->nviews == 0)
    return BEAM_DIAG(d, BEAM_ESTATE, "ptycho: iterate: no views added");
  m->iteration = e->iterations;
  int update_probe = e->iterations >= e->conf.probe_update_start;
  double t0 = now_s();
  int rc = e->be->iterate(e, update_probe, m, d);
  m->seconds = now_s() - t0;
  if (rc < 0)
    return rc;
  if (!update_probe)
    m->probe_change = 0.0;
  e->iterations++;
  return 0;
}

void beam_dm_reset(beam_dm_t *e) {
  BEAM_ASSERT(e);
  e->nviews = 0;
  e->iterations = 0;
}

void beam_dm_set_reducer(beam_dm_t *e, beam_dm_reduce_fn fn, void *ctx) {
  BEAM_ASSERT(e);
  e->reduce = fn;
  e->reduce_ctx = ctx;
}

int beam_dm_diverged(const beam_dm_metrics_t *hist, size_t n, double factor) {
  double best = INFINITY;
  for (size_t i = 0; i < n; i++) {
    const beam_dm_metrics_t *m = &hist[i];
    if (!isfinite(m->fourier_error) || !isfinite(m->probe_change) ||
        !isfinite(m->object_change))
      return 1;
    if (i >= 5 && m->fourier_error > factor * best)
      return 1;
    if (m->fourier_error < best)
      best = m->fourier_error;
  }
  return 0;
}
