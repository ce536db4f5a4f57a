/* The CPU backend of the DM engine (FFTW + OpenMP). Everything is allocated
 * and every FFT planned at create, for max_views; iterate allocates
 * nothing. The arithmetic is in dm_cpu_impl.h, instantiated here for float
 * and double. */
#include <fftw3.h>
#include "proto/clones.h"
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/cache.h"
#include "pipeline/ptycho/dm_int.h"

#define MAX_THREADS 1024

/* The hot per-pixel loops get AVX2 and AVX-512 versions picked at run time
 * (the build targets baseline x86-64, FFTW picks its own SIMD the same way).
 * Not inlined: the clone is chosen per call. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define CLONES __attribute__((noinline)) BEAM_TARGET_CLONES("arch=x86-64-v4", "arch=x86-64-v3", "default")
#else
#define CLONES __attribute__((noinline))
#endif

typedef struct cpu_s {
  int nt;          /* threads */
  unsigned fftw_flags;
  float *amp;      /* max_views x n x n, FFT order, < 0 masked */
  int32_t *pos;    /* max_views x 2 */
  double *view_a2; /* sum_valid A^2 per view */
  double *view_photons;   /* sum_valid A per view (0: no photons) */
  uint32_t *view_nvalid;  /* valid pixels per view */
  double *view_err, *view_a2used; /* per-iteration metric terms */
  void *psi;              /* max_views x M_P x M_O x n x n complex */
  void *probe, *probe_prev; /* M_P x n x n complex */
  void *obj, *obj_prev;     /* M_O x H x W complex */
  void *onum;               /* M_O x H x W complex, then H x W real (one reduce) */
  void *pnum;               /* M_P x n x n complex, then n x n real */
  void *pint;               /* n x n real: sum_j |P_j|^2 */
  void *tbuf[MAX_THREADS], *tphi[MAX_THREADS], *taf[MAX_THREADS]; /* per thread */
  void *plan_fwd, *plan_inv;
} cpu_t;

#define R float
#define SUF(x) x##_f32
#define FFTW_(x) fftwf_##x
#define SQRT_ sqrtf
#define IMASK int32_t
#include "pipeline/ptycho/dm_cpu_impl.h"
#undef R
#undef SUF
#undef FFTW_
#undef SQRT_
#undef IMASK

#define R double
#define SUF(x) x##_f64
#define FFTW_(x) fftw_##x
#define SQRT_ sqrt
#define IMASK int64_t
#include "pipeline/ptycho/dm_cpu_impl.h"
#undef R
#undef SUF
#undef FFTW_
#undef SQRT_
#undef IMASK

static pthread_once_t fftw_once = PTHREAD_ONCE_INIT;
static void fftw_init_once(void) {
  /* Other engines (the live stage, the tool, tests) may plan from other
   * threads at the same time. */
  fftw_make_planner_thread_safe();
  fftwf_make_planner_thread_safe();
}

static int nthreads(const beam_dm_conf_t *c) {
  int nt = c->threads > 0 ? c->threads : omp_get_num_procs();
  if (nt < 1)
    nt = 1;
  if (nt > MAX_THREADS)
    nt = MAX_THREADS;
  return nt;
}

static size_t real_size(const beam_dm_conf_t *c) {
  return c->prec == BEAM_DM_F64 ? sizeof(double) : sizeof(float);
}

/* Every allocation create makes, in bytes (see cpu_create); SIZE_MAX when
 * the exit waves alone would not fit in a size_t (the only product of the
 * validated conf that can overflow). */
static size_t cpu_bytes(const beam_dm_conf_t *c) {
  const size_t r = real_size(c), npx = (size_t)c->n * c->n, V = c->max_views;
  const size_t M = (size_t)c->probe_modes * c->object_modes;
  const size_t HW = (size_t)c->obj_h * c->obj_w, nt = (size_t)nthreads(c);
  if ((double)V * (double)M * (double)npx * 2.0 * (double)r > 0x1p60)
    return SIZE_MAX;
  size_t b = 0;
  b += V * npx * sizeof(float) + V * 2 * sizeof(int32_t);
  b += V * (4 * sizeof(double) + sizeof(uint32_t));
  b += V * M * npx * 2 * r;                             /* psi */
  b += 2 * (size_t)c->probe_modes * npx * 2 * r;        /* probe, prev */
  b += 2 * (size_t)c->object_modes * HW * 2 * r;        /* object, prev */
  b += ((size_t)c->object_modes * HW * 2 + HW) * r;     /* object num + den */
  b += ((size_t)c->probe_modes * npx * 2 + npx) * r;    /* probe num + den */
  b += npx * r;                                         /* pint */
  b += nt * (2 * M * npx * 2 + 3 * npx + c->n) * r;     /* thread buffers */
  return b;
}

static void cpu_destroy(beam_dm_t *e) {
  cpu_t *s = e->impl;
  if (!s)
    return;
  if (e->conf.prec == BEAM_DM_F64)
    free_plans_f64(s);
  else
    free_plans_f32(s);
  for (int t = 0; t < MAX_THREADS; t++) {
    fftw_free(s->tbuf[t]);
    fftw_free(s->tphi[t]);
    fftw_free(s->taf[t]);
  }
  free(s->amp);
  free(s->pos);
  free(s->view_a2);
  free(s->view_photons);
  free(s->view_nvalid);
  free(s->view_err);
  free(s->view_a2used);
  fftw_free(s->psi);
  fftw_free(s->probe);
  fftw_free(s->probe_prev);
  fftw_free(s->obj);
  fftw_free(s->obj_prev);
  fftw_free(s->onum);
  fftw_free(s->pnum);
  fftw_free(s->pint);
  free(s);
  e->impl = NULL;
}

static int cpu_create(beam_dm_t *e, beam_diag_t *d) {
  const beam_dm_conf_t *c = &e->conf;
  pthread_once(&fftw_once, fftw_init_once);
  size_t need = cpu_bytes(c), avail = beam_mem_available();
  if (need == SIZE_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT,
                     "ptycho: %u views of %u x %u (%u x %u modes) need more than 2^60 bytes",
                     c->max_views, c->n, c->n, c->probe_modes, c->object_modes);
  if (avail && need > avail)
    return BEAM_DIAG(d, BEAM_ELIMIT,
                     "ptycho: %u views of %u x %u (%u x %u modes) need %zu bytes, %zu available",
                     c->max_views, c->n, c->n, c->probe_modes, c->object_modes, need, avail);
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: out of memory");
  e->impl = s;
  s->nt = nthreads(c);
  /* FFTW_MEASURE: the plans are made once per engine and reused for every
   * view of every iteration; wisdom makes later engines of the same shape
   * cheap to create. */
  s->fftw_flags = FFTW_MEASURE;
  const size_t r = real_size(c), npx = (size_t)c->n * c->n, V = c->max_views;
  const size_t M = (size_t)c->probe_modes * c->object_modes;
  const size_t HW = (size_t)c->obj_h * c->obj_w;
  int ok = 1;
#define ALLOC(p, bytes, fn) ok = ok && ((p) = fn(bytes)) != NULL
  ALLOC(s->amp, V * npx * sizeof(float), malloc);
  ALLOC(s->pos, V * 2 * sizeof(int32_t), malloc);
  ALLOC(s->view_a2, V * sizeof(double), malloc);
  ALLOC(s->view_photons, V * sizeof(double), malloc);
  ALLOC(s->view_nvalid, V * sizeof(uint32_t), malloc);
  ALLOC(s->view_err, V * sizeof(double), malloc);
  ALLOC(s->view_a2used, V * sizeof(double), malloc);
  ALLOC(s->psi, V * M * npx * 2 * r, fftw_malloc);
  ALLOC(s->probe, c->probe_modes * npx * 2 * r, fftw_malloc);
  ALLOC(s->probe_prev, c->probe_modes * npx * 2 * r, fftw_malloc);
  ALLOC(s->obj, c->object_modes * HW * 2 * r, fftw_malloc);
  ALLOC(s->obj_prev, c->object_modes * HW * 2 * r, fftw_malloc);
  ALLOC(s->onum, (c->object_modes * HW * 2 + HW) * r, fftw_malloc);
  ALLOC(s->pnum, (c->probe_modes * npx * 2 + npx) * r, fftw_malloc);
  ALLOC(s->pint, npx * r, fftw_malloc);
  for (int t = 0; t < s->nt; t++) {
    /* Separate allocations: every buffer has fftw_malloc's alignment, so
     * the plan made on thread 0's buffer runs on all of them. */
    ALLOC(s->tbuf[t], M * npx * 2 * r, fftw_malloc);
    ALLOC(s->tphi[t], M * npx * 2 * r, fftw_malloc);
    ALLOC(s->taf[t], (3 * npx + c->n) * r, fftw_malloc);
  }
#undef ALLOC
  if (!ok) {
    cpu_destroy(e);
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: out of memory allocating %zu bytes for %u views",
                     need, c->max_views);
  }
  int prc = c->prec == BEAM_DM_F64 ? make_plans_f64(s, c) : make_plans_f32(s, c);
  if (prc < 0) {
    cpu_destroy(e);
    return BEAM_DIAG(d, BEAM_ENOMEM, "ptycho: FFTW could not plan %zu FFTs of %u x %u", M,
                     c->n, c->n);
  }
  /* The probe starts at 0 and the object at 1 (dm.h). */
  memset(s->probe, 0, c->probe_modes * npx * 2 * r);
  for (size_t q = 0; q < c->object_modes * HW; q++) {
    if (c->prec == BEAM_DM_F64) {
      ((double *)s->obj)[2 * q] = 1.0;
      ((double *)s->obj)[2 * q + 1] = 0.0;
    } else {
      ((float *)s->obj)[2 * q] = 1.0f;
      ((float *)s->obj)[2 * q + 1] = 0.0f;
    }
  }
  return 0;
}

static int cpu_set_probe(beam_dm_t *e, const double *probe, beam_diag_t *d) {
  cpu_t *s = e->impl;
  size_t nreal = (size_t)e->conf.probe_modes * e->conf.n * e->conf.n * 2;
  if (e->conf.prec == BEAM_DM_F64)
    from_double_f64(s->probe, probe, nreal);
  else
    from_double_f32(s->probe, probe, nreal);
  return 0;
}

static int cpu_set_object(beam_dm_t *e, const double *obj, beam_diag_t *d) {
  cpu_t *s = e->impl;
  size_t nreal = (size_t)e->conf.object_modes * e->conf.obj_h * e->conf.obj_w * 2;
  if (e->conf.prec == BEAM_DM_F64)
    from_double_f64(s->obj, obj, nreal);
  else
    from_double_f32(s->obj, obj, nreal);
  return 0;
}

static int cpu_get_probe(beam_dm_t *e, double *probe, beam_diag_t *d) {
  cpu_t *s = e->impl;
  size_t nreal = (size_t)e->conf.probe_modes * e->conf.n * e->conf.n * 2;
  if (e->conf.prec == BEAM_DM_F64)
    to_double_f64(probe, s->probe, nreal);
  else
    to_double_f32(probe, s->probe, nreal);
  return 0;
}

static int cpu_get_object(beam_dm_t *e, double *obj, beam_diag_t *d) {
  cpu_t *s = e->impl;
  size_t nreal = (size_t)e->conf.object_modes * e->conf.obj_h * e->conf.obj_w * 2;
  if (e->conf.prec == BEAM_DM_F64)
    to_double_f64(obj, s->obj, nreal);
  else
    to_double_f32(obj, s->obj, nreal);
  return 0;
}

static int cpu_add_views(beam_dm_t *e, uint32_t first, uint32_t count, const float *amp,
                         const int32_t *pos, beam_diag_t *d) {
  cpu_t *s = e->impl;
  const size_t npx = (size_t)e->conf.n * e->conf.n;
  memcpy(s->amp + first * npx, amp, count * npx * sizeof(float));
  memcpy(s->pos + 2 * (size_t)first, pos, count * 2 * sizeof(int32_t));
  for (uint32_t v = first; v < first + count; v++) {
    const float *a = s->amp + v * npx;
    double a1 = 0.0, a2 = 0.0;
    uint32_t nvalid = 0;
    for (size_t p = 0; p < npx; p++)
      if (a[p] >= 0.0f) {
        a1 += a[p];
        a2 += (double)a[p] * a[p];
        nvalid++;
      }
    s->view_photons[v] = a1;
    s->view_a2[v] = a2;
    s->view_nvalid[v] = nvalid;
  }
  if (e->conf.prec == BEAM_DM_F64)
    init_views_f64(e, s, first, count);
  else
    init_views_f32(e, s, first, count);
  return 0;
}

static int cpu_iterate(beam_dm_t *e, int update_probe, beam_dm_metrics_t *m, beam_diag_t *d) {
  return e->conf.prec == BEAM_DM_F64 ? iterate_f64(e, update_probe, m, d)
                                     : iterate_f32(e, update_probe, m, d);
}

const beam_dm_backend_t_ beam_dm_cpu_backend = {
    "cpu",          cpu_bytes,     cpu_create,     cpu_destroy,   cpu_set_probe, cpu_set_object,
    cpu_get_probe,  cpu_get_object, cpu_add_views, cpu_iterate,
};
