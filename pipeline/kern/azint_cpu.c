/* Stage kind `azint`, CPU backend: the CSR product of azint.c applied per
 * frame, its rows shared among `threads` through the fork-join pool of
 * xpcs_pool.c. Each row is summed by exactly one thread in the reference
 * order (beam_azint_csr_apply), so the result does not depend on the
 * thread count. Nothing is allocated per frame: the sums live in the
 * stage and are sized at series start. */
#include <math.h>
#include <string.h>

#include "pipeline/kern/azint.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_pool.h"

/* Tasks per thread and per frame: rows differ in length (outer rings
 * hold more pixels), so a few tasks each keep the threads even. */
#define TASKS_PER_THREAD 8

typedef struct cpu_s {
  beam_azint_conf_t c;
  beam_azint_tab_t t;
  beam_azint_sums_t s1, s2;
  double *buf;
  beam_xpcs_pool_t *pool;
  beam_indesc_t in;
  int first;
  /* the frame being integrated, for the pool tasks */
  const void *px;
  beam_dtype_t dt;
  unsigned ntasks;
} cpu_t;

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *s = self->priv;
  if (!s)
    return;
  beam_xpcs_pool_destroy(&s->pool);
  beam_azint_tab_free(&s->t);
  beam_azint_conf_free(&s->c);
  free(s->buf);
  free(s);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "azint: out of memory");
  self->priv = s;
  int rc = beam_azint_conf_load(&s->c, self->cfg, d);
  if (rc == 0) {
    unsigned n = s->c.threads ? s->c.threads : beam_xpcs_pool_cores();
    if (n > BEAM_AZINT_MAX_THREADS)
      n = BEAM_AZINT_MAX_THREADS;
    rc = beam_xpcs_pool_new(&s->pool, n, "azint", d);
  }
  if (rc < 0)
    cpu_destroy(self);
  return rc;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *s = self->priv;
  int rc = beam_azint_start(self, &s->c, &s->t, series, in, d);
  if (rc < 0)
    return rc;
  size_t n1 = s->t.r1.nrows, n2 = s->t.r2.nrows;
  free(s->buf);
  s->buf = malloc(4 * (n1 + n2) * sizeof(double));
  if (!s->buf)
    return BEAM_DIAG(d, BEAM_ENOMEM, "azint: out of memory");
  double *p = s->buf;
  s->s1 = (beam_azint_sums_t){p, p + n1, p + 2 * n1, p + 3 * n1};
  p += 4 * n1;
  s->s2 = (beam_azint_sums_t){p, p + n2, p + 2 * n2, p + 3 * n2};
  unsigned th = beam_xpcs_pool_size(s->pool);
  s->ntasks = th == 1 ? 1 : th * TASKS_PER_THREAD;
  s->in = *in;
  s->first = 1;
  return 0;
}

/* Task k of ntasks: the k-th slice of the 1-D rows and of the cake rows. */
static void task(void *ctx, unsigned k) {
  cpu_t *s = ctx;
  const beam_azint_csr_t *m[2] = {&s->t.r1, &s->t.r2};
  beam_azint_sums_t *out[2] = {&s->s1, &s->s2};
  for (int q = 0; q < 2; q++) {
    uint64_t n = m[q]->nrows;
    uint32_t r0 = (uint32_t)(n * k / s->ntasks), r1 = (uint32_t)(n * (k + 1) / s->ntasks);
    if (r1 > r0)
      beam_azint_csr_apply(m[q], &s->c, s->t.norm, s->dt, s->px, r0, r1, out[q]);
  }
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *s = self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_azint_emit_corrupt(self, &s->c, &s->t, &s->first, emit);
  int rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape);
  if (rc < 0)
    return rc;
  s->px = in->data;
  s->dt = in->dtype;
  beam_xpcs_pool_run(s->pool, s->ntasks, task, s);
  s->px = NULL;
  return beam_azint_emit(self, &s->c, &s->t, &s->s1, &s->s2, &s->first, emit);
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) { return 0; }

const beam_stage_ops_t beam_azint_cpu_ops = {
    .kind = "azint", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
