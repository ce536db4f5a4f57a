/* Internal: how the DM engine's front end (dm.c) talks to a backend
 * (dm_cpu.c, gpu/dm_cuda.cu). Only those files include this.
 *
 * dm.c validates the conf, keeps the counters (nviews, iterations), checks
 * the arguments of every public call (capacity, windows inside the object)
 * and times iterate; a backend only does the work. Backends see the same
 * interleaved-double host arrays as the public API. */
#ifndef BEAM_PTYCHO_DM_INT_H
#define BEAM_PTYCHO_DM_INT_H

#include "pipeline/ptycho/dm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exit-wave update psi <- psi + b X + a phi - (a + b) psi (dm.h) as
 * three coefficients: psi <- cpsi psi + b X + a phi. For DM cpsi is 1. */
static inline void beam_dm_update_coefs(const beam_dm_conf_t *c, double *a, double *b,
                                        double *cpsi) {
  *b = c->beta;
  *a = c->algorithm == BEAM_DM_ALG_RAAR ? 1.0 - 2.0 * c->beta : -c->beta;
  *cpsi = 1.0 - (*a + *b);
}

/* The eps of dm.h's modulus step, Phi' = Phi (A ...) / (af + eps), in
 * amplitude units (PtyPy's value): both backends use it. */
#define BEAM_DM_EPS 1e-10

typedef struct beam_dm_backend_s {
  const char *name; /* "cpu", "cuda" */
  size_t (*bytes)(const beam_dm_conf_t *c);
  int (*create)(beam_dm_t *e, beam_diag_t *d);   /* sets e->impl */
  void (*destroy)(beam_dm_t *e);
  int (*set_probe)(beam_dm_t *e, const double *probe, beam_diag_t *d);
  int (*set_object)(beam_dm_t *e, const double *obj, beam_diag_t *d);
  int (*get_probe)(beam_dm_t *e, double *probe, beam_diag_t *d);
  int (*get_object)(beam_dm_t *e, double *obj, beam_diag_t *d);
  /* views [first, first + count) of amp/pos: already checked */
  int (*add_views)(beam_dm_t *e, uint32_t first, uint32_t count, const float *amp,
                   const int32_t *pos, beam_diag_t *d);
  /* m->iteration is set; fill the errors. update_probe per the conf. */
  int (*iterate)(beam_dm_t *e, int update_probe, beam_dm_metrics_t *m, beam_diag_t *d);
} beam_dm_backend_t_;

struct beam_dm_s {
  beam_dm_conf_t conf;
  const beam_dm_backend_t_ *be;
  void *impl;
  uint32_t nviews;
  uint32_t iterations;
  beam_dm_reduce_fn reduce; /* NULL: single process */
  void *reduce_ctx;
};

extern const beam_dm_backend_t_ beam_dm_cpu_backend;
/* In CPU-only builds gpu/stubs.c defines it with create failing
 * BEAM_ENOTSUP ("built without CUDA"). */
extern const beam_dm_backend_t_ beam_dm_cuda_backend;

#ifdef __cplusplus
}
#endif
#endif
