/* Internal: how the DM engine's front end (dm.c) talks to a backend
 * (dm_cpu.c, gpu/ptycho_dm_cuda.cu). Only those files include this.
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
