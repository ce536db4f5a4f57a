/* Stage kind `com`, CPU backend: the per-frame sums S, Sx, Sy over the
 * runs of pixels inside the disc, the plain reference they are tested
 * against, and the stage ops. The maps are com.c's, shared with CUDA.
 *
 * Per run (one row's stretch of the disc), four independent double lanes
 * of sum v and sum v x, combined (l0 + l1) + (l2 + l3), so the loop
 * pipelines without the compiler reassociating a floating-point chain;
 * Sy gets y x (row sum), one multiply per run. Integer pixels: every
 * partial sum is an integer, exact while below 2^53, so the order does not
 * matter and the result equals the reference's. */
#include <math.h>
#include <string.h>

#include "pipeline/kern/com.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define RUN_CASE(T, DT)                                                        \
  case DT: {                                                                   \
    const T *px = frame;                                                       \
    for (size_t k = 0; k < h->nrun; k++) {                                     \
      const beam_com_run_t *u = &h->run[k];                                    \
      const T *p = px + (size_t)u->y * w + u->x0;                              \
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;   \
      double x = u->x0;                                                        \
      uint32_t i = 0;                                                          \
      for (; i + 4 <= u->len; i += 4, x += 4) {                                \
        double v0 = (double)p[i], v1 = (double)p[i + 1], v2 = (double)p[i + 2], \
               v3 = (double)p[i + 3];                                          \
        a0 += v0, a1 += v1, a2 += v2, a3 += v3;                                \
        b0 += v0 * x, b1 += v1 * (x + 1), b2 += v2 * (x + 2), b3 += v3 * (x + 3); \
      }                                                                        \
      for (; i < u->len; i++, x++) {                                           \
        double v = (double)p[i];                                               \
        a0 += v;                                                               \
        b0 += v * x;                                                           \
      }                                                                        \
      double rs = (a0 + a1) + (a2 + a3);                                       \
      S += rs;                                                                 \
      Sx += (b0 + b1) + (b2 + b3);                                             \
      Sy += rs * (double)u->y;                                                 \
    }                                                                          \
    break;                                                                     \
  }

void beam_com_sums_cpu(const beam_com_host_t *h, beam_dtype_t dt, const void *frame, double s[3]) {
  size_t w = h->in.shape[1];
  double S = 0, Sx = 0, Sy = 0;
  switch (dt) {
    BEAM__REAL_DTYPES(RUN_CASE)
  default: BEAM_ASSERT(!"com: dtype not accepted at start");
  }
  s[0] = S, s[1] = Sx, s[2] = Sy;
}

static double px_at(beam_dtype_t dt, const void *frame, size_t i) {
  switch (dt) {
#define PX_CASE(T, DT) case DT: return (double)((const T *)frame)[i];
    BEAM__REAL_DTYPES(PX_CASE)
#undef PX_CASE
  default: BEAM_ASSERT(!"com: dtype not accepted at start"); return 0;
  }
}

void beam_com_sums_ref(const beam_com_host_t *h, beam_dtype_t dt, const void *frame, double s[3]) {
  uint32_t hh = h->in.shape[0], w = h->in.shape[1];
  double S = 0, Sx = 0, Sy = 0;
  for (uint32_t y = 0; y < hh; y++)
    for (uint32_t x = 0; x < w; x++) {
      if (!beam_com_inside(h, y, x))
        continue;
      double v = px_at(dt, frame, (size_t)y * w + x);
      S += v;
      Sx += v * x;
      Sy += v * y;
    }
  s[0] = S, s[1] = Sx, s[2] = Sy;
}

/* ---- stage ops ------------------------------------------------------------ */

static void cpu_destroy(beam_stage_t *self) {
  beam_com_host_t *h = self->priv;
  if (!h)
    return;
  beam_com_host_free(h);
  free(h);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  beam_com_host_t *h = calloc(1, sizeof *h);
  if (!h)
    return BEAM_DIAG(d, BEAM_ENOMEM, "com: out of memory");
  self->priv = h;
  int rc = beam_com_host_init(h, self->cfg, d);
  if (rc < 0)
    cpu_destroy(self);
  return rc;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  return beam_com_host_start(self, self->priv, series, in, 0, d);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_com_host_t *h = self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_com_host_corrupt(self, h, emit);
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  double s[3];
  beam_com_sums_cpu(h, in->dtype, in->data, s);
  beam_com_finish(h, s, f->data);
  beam_com_host_record(h, in->frame_id, f->data);
  beam_emit_put(emit, f);
  return beam_com_host_maps(self, h, emit, 0);
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  return beam_com_host_maps(self, self->priv, emit, 1);
}

const beam_stage_ops_t beam_com_cpu_ops = {
    .kind = "com", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
