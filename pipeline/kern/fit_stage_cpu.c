/* Stage kind `fit`, CPU backend: the batch of fit_stage.c split over the
 * stage's threads with beam_fit_cpu_range. Ranges are whole blocks of 16
 * fits (the engine's SIMD width), so every fit runs in the same lane
 * company whatever the thread count: results do not depend on `threads`.
 * Tasks are 4 per thread (a fork-join pool, fjpool.h, made at init),
 * each with its own workspace, because dcos fits differ in iterations and
 * equal ranges would leave threads waiting on the slowest. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/fit_stage.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/fjpool.h"

#define WHO "fit"
#define TASKS_PER_THREAD 4

typedef struct cpu_s {
  beam_fits_t s;
  beam_fjpool_t *pool;
  unsigned ntasks;
  void *ws;          /* ntasks x ws_bytes */
  size_t ws_bytes;   /* per task, for max points */
  /* one run */
  beam_fit_batch_t b;
  beam_fit_result_t r;
  size_t per_task;   /* fits per task, a multiple of 16 */
  atomic_int failed;
  beam_diag_t fail;
} cpu_t;

static void destroy(beam_stage_t *self) {
  cpu_t *c = self->priv;
  if (!c)
    return;
  beam_fjpool_destroy(&c->pool);
  beam_fits_free(&c->s);
  free(c->ws);
  free(c);
  self->priv = NULL;
}

static int init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *c = calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": out of memory");
  self->priv = c;
  int rc = beam_fits_conf_load(&c->s.conf, self->cfg, d);
  if (rc < 0)
    return rc;
  unsigned n = c->s.conf.threads ? c->s.conf.threads : beam_fjpool_cores();
  if (n > BEAM_FITS_MAX_THREADS)
    n = BEAM_FITS_MAX_THREADS;
  if ((rc = beam_fjpool_new(&c->pool, n, WHO, d)) < 0)
    return rc;
  self->ncounters = 2;
  self->counters[0].name = "fits";
  self->counters[1].name = "frames_skipped";
  return 0;
}

static int start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                 beam_diag_t *d) {
  cpu_t *c = self->priv;
  int rc = beam_fits_start(self, &c->s, series, in, d);
  if (rc < 0)
    return rc;
  /* Workspace for the longest batch this series can make. */
  beam_fit_batch_t b;
  size_t keep = c->s.n;
  c->s.n = c->s.T;
  beam_fits_batch(&c->s, &b);
  c->s.n = keep;
  size_t ws = beam_fit_workspace_size(&b, &c->s.conf.opts);
  if (ws == 0) {
    beam_diag_t sub = {0};
    beam_fit_check(&b, &c->s.conf.opts, &sub);
    return BEAM_DIAG(d, BEAM_EINVAL, WHO ": %s", sub.msg[0] ? sub.msg : "invalid batch");
  }
  size_t blocks = (c->s.n_fits + 15) / 16;
  unsigned nt = beam_fjpool_size(c->pool) * TASKS_PER_THREAD;
  if (nt > blocks)
    nt = (unsigned)blocks;
  if (nt != c->ntasks || ws > c->ws_bytes) {
    free(c->ws);
    c->ws = malloc((size_t)nt * ws);
    c->ntasks = c->ws ? nt : 0, c->ws_bytes = c->ws ? ws : 0;
    if (!c->ws)
      return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %u x %zu bytes of fit workspace", nt, ws);
  }
  return 0;
}

static void run_task(void *ctx, unsigned k) {
  cpu_t *c = ctx;
  size_t i0 = (size_t)k * c->per_task, i1 = i0 + c->per_task;
  if (i1 > c->b.n_fits)
    i1 = c->b.n_fits;
  if (i0 >= i1)
    return;
  beam_diag_t d = {0};
  if (beam_fit_cpu_range(&c->b, &c->s.conf.opts, i0, i1, (char *)c->ws + (size_t)k * c->ws_bytes,
                         c->ws_bytes, &c->r, &d) < 0 &&
      atomic_exchange(&c->failed, 1) == 0)
    c->fail = d;
}

/* Fits what is held now; statuses, params, errors, chi2_red in c->s. */
static int fit_now(beam_stage_t *self, cpu_t *c) {
  beam_fits_t *s = &c->s;
  beam_fits_batch(s, &c->b);
  memset(&c->r, 0, sizeof c->r);
  c->r.params = s->params, c->r.errors = s->errors, c->r.chi2_red = s->chi2_red;
  c->r.status = s->status, c->r.iters = s->iters;
  size_t blocks = (s->n_fits + 15) / 16;
  c->per_task = (blocks + c->ntasks - 1) / c->ntasks * 16;
  atomic_store(&c->failed, 0);
  uint64_t t0 = beam_now_ns();
  if (s->n <= (size_t)s->conf.P) {
    /* Too few points for any fit: say so per fit rather than fail. */
    for (size_t i = 0; i < s->n_fits; i++) {
      s->status[i] = BEAM_FIT_TOO_FEW, s->chi2_red[i] = NAN, s->iters[i] = 0;
      for (int j = 0; j < s->conf.P; j++)
        s->params[i * (size_t)s->conf.P + j] = s->errors[i * (size_t)s->conf.P + j] = NAN;
    }
  } else {
    beam_fjpool_run(c->pool, c->ntasks, run_task, c);
  }
  s->seconds_last = (double)(beam_now_ns() - t0) * 1e-9;
  if (atomic_load(&c->failed))
    return BEAM_DIAG(&self->diag, c->fail.code ? c->fail.code : BEAM_EINVAL, WHO ": %s", c->fail.msg);
  atomic_fetch_add(&self->counters[0].value, s->n_fits);
  return 0;
}

static int fit_cb(beam_stage_t *self, void *c) { return fit_now(self, c); }

static int process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *c = self->priv;
  return beam_fits_process(self, &c->s, in, emit, fit_cb, c);
}

static int end(beam_stage_t *self, beam_emit_t *emit) {
  cpu_t *c = self->priv;
  return beam_fits_end(self, &c->s, emit, fit_cb, c);
}

const beam_stage_ops_t beam_fit_cpu_ops = {
    .kind = WHO, .backend = "cpu",
    .init = init, .start = start, .process = process, .end = end, .destroy = destroy,
};
