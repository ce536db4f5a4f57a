/* Stage kind `fit`, CUDA backend: the batch of fit_stage.c (both sources,
 * the same buffers, emission and flags as fit_stage_cpu.c) fitted by one
 * beam_fit_cuda call (gpu/fit_cuda.cu: a fused kernel, thread or warp per
 * fit, automatic starts on the device). Host code only: no kernel here.
 *
 * What differs from the CPU backend is only the engine's arithmetic
 * (docs/fit.md "CUDA": fp32 SFU transcendentals, masked points skipped,
 * the device's starts): results agree with the CPU's within the engine's
 * cross-check tolerances, not bit for bit. `threads` is a CPU key and is
 * ignored here. The context (stream, device buffers that only grow) is
 * made at init, so the per-series and per-batch paths allocate only when
 * a batch outgrows the last one. */
#include "gpu/cuda_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/fit_stage.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define WHO "fit"

typedef struct cuda_s {
  beam_fits_t s;
  beam_fit_cuda_t *ctx;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *c = (cuda_t *)self->priv;
  if (!c)
    return;
  beam_fit_cuda_destroy(c->ctx);
  beam_fits_free(&c->s);
  free(c);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *c = (cuda_t *)calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": out of memory");
  self->priv = c;
  int rc = beam_fits_conf_load(&c->s.conf, self->cfg, d);
  if (rc < 0)
    return rc;
  /* BEAM_ENOTSUP with "needs a CUDA device: ..." when there is none */
  if ((rc = beam_fit_cuda_create(&c->ctx, d)) < 0)
    return rc;
  self->ncounters = 2;
  self->counters[0].name = "fits";
  self->counters[1].name = "frames_skipped";
  return 0;
}

static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *c = (cuda_t *)self->priv;
  int rc = beam_fits_start(self, &c->s, series, in, d);
  if (rc < 0)
    return rc;
  /* The longest batch this series can make must be a valid one. */
  beam_fit_batch_t b;
  size_t keep = c->s.n;
  c->s.n = c->s.T;
  beam_fits_batch(&c->s, &b);
  c->s.n = keep;
  beam_diag_t sub;
  beam_diag_clear(&sub);
  if (beam_fit_check(&b, &c->s.conf.opts, &sub) <= 0)
    return BEAM_DIAG(d, BEAM_EINVAL, WHO ": %s", sub.msg[0] ? sub.msg : "invalid batch");
  return 0;
}

/* Fits what is held now; statuses, params, errors, chi2_red in c->s. */
static int fit_now(beam_stage_t *self, cuda_t *c) {
  beam_fits_t *s = &c->s;
  beam_fit_batch_t b;
  beam_fits_batch(s, &b);
  beam_fit_result_t r;
  memset(&r, 0, sizeof r);
  r.params = s->params, r.errors = s->errors, r.chi2_red = s->chi2_red;
  r.status = s->status, r.iters = s->iters;
  uint64_t t0 = beam_now_ns();
  if (s->n <= (size_t)s->conf.P) {
    /* Too few points for any fit: say so per fit rather than fail (as
     * the CPU backend does). */
    for (size_t i = 0; i < s->n_fits; i++) {
      s->status[i] = BEAM_FIT_TOO_FEW, s->chi2_red[i] = NAN, s->iters[i] = 0;
      for (int j = 0; j < s->conf.P; j++)
        s->params[i * (size_t)s->conf.P + j] = s->errors[i * (size_t)s->conf.P + j] = NAN;
    }
  } else {
    beam_fit_cuda_run_t run;
    memset(&run, 0, sizeof run);
    beam_diag_t d;
    beam_diag_clear(&d);
    int rc = beam_fit_cuda(c->ctx, &b, NULL, &s->conf.opts, &r, &run, &d);
    if (rc < 0)
      return BEAM_DIAG(&self->diag, rc, WHO ": %s", d.msg);
  }
  s->seconds_last = (double)(beam_now_ns() - t0) * 1e-9;
  atomic_fetch_add(&self->counters[0].value, s->n_fits);
  return 0;
}

static int fit_cb(beam_stage_t *self, void *c) { return fit_now(self, (cuda_t *)c); }

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *c = (cuda_t *)self->priv;
  return beam_fits_process(self, &c->s, in, emit, fit_cb, c);
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *c = (cuda_t *)self->priv;
  return beam_fits_end(self, &c->s, emit, fit_cb, c);
}

extern "C" const beam_stage_ops_t beam_fit_cuda_ops = {
    .kind = WHO, .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
