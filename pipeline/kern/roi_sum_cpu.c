/* Stage kind `roi_sum`, CPU backend: the index-list sums, the plain
 * reference, and the stage ops.
 *
 * The fast loop gathers each ROI's pixels through its sorted index list
 * into four double accumulators (combined (s0 + s1) + (s2 + s3)), which
 * hides the add latency; the reference visits every pixel in raster order
 * with one accumulator. For integer pixels and unit weights every partial
 * sum is an integer below 2^53, so the two agree exactly; otherwise they
 * differ only by rounding (bounded by 1e-12 x sum |pixel x weight| at these
 * sizes). */
#include <math.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/roi_sum.h"

#define SUM_CASE(T, DT)                                                        \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    for (size_t r = 0; r < l->nroi; r++) {                                     \
      const uint32_t *restrict ix = l->idx + l->off[r];                        \
      size_t n = (size_t)(l->off[r + 1] - l->off[r]), k = 0;                   \
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                   \
      if (!l->w) {                                                             \
        for (; k + 4 <= n; k += 4) {                                           \
          s0 += (double)px[ix[k]];                                             \
          s1 += (double)px[ix[k + 1]];                                         \
          s2 += (double)px[ix[k + 2]];                                         \
          s3 += (double)px[ix[k + 3]];                                         \
        }                                                                      \
        for (; k < n; k++)                                                     \
          s0 += (double)px[ix[k]];                                             \
      } else {                                                                 \
        const double *restrict w = l->w + l->off[r];                           \
        for (; k + 4 <= n; k += 4) {                                           \
          s0 += (double)px[ix[k]] * w[k];                                      \
          s1 += (double)px[ix[k + 1]] * w[k + 1];                              \
          s2 += (double)px[ix[k + 2]] * w[k + 2];                              \
          s3 += (double)px[ix[k + 3]] * w[k + 3];                              \
        }                                                                      \
        for (; k < n; k++)                                                     \
          s0 += (double)px[ix[k]] * w[k];                                      \
      }                                                                        \
      sums[r] = (s0 + s1) + (s2 + s3);                                         \
    }                                                                          \
    break;                                                                     \
  }

void beam_roi_sum_cpu(const beam_roi_lists_t *l, beam_dtype_t dt, const void *frame, double *sums) {
  switch (dt) {
    BEAM__REAL_DTYPES(SUM_CASE)
  default: BEAM_ASSERT(!"roi_sum: dtype not accepted at start");
  }
}

static double px_at(beam_dtype_t dt, const void *frame, size_t i) {
  switch (dt) {
#define PX_CASE(T, DT) case DT: return (double)((const T *)frame)[i];
    BEAM__REAL_DTYPES(PX_CASE)
#undef PX_CASE
  default: BEAM_ASSERT(!"roi_sum: dtype not accepted at start"); return 0;
  }
}

void beam_roi_sum_ref(const beam_roi_sum_conf_t *c, beam_dtype_t dt, uint32_t h, uint32_t w,
                      const void *frame, double *sums) {
  for (size_t r = 0; r < c->nroi; r++) {
    double s = 0.0;
    for (uint32_t y = 0; y < h; y++)
      for (uint32_t x = 0; x < w; x++) {
        double wt = beam_roi_weight(c, r, h, w, y, x);
        if (wt != 0.0)
          s += px_at(dt, frame, (size_t)y * w + x) * wt;
      }
    sums[r] = s;
  }
}

/* ---- stage ops ------------------------------------------------------------ */

static void cpu_destroy(beam_stage_t *self) {
  beam_roi_host_t *h = self->priv;
  if (!h)
    return;
  beam_roi_host_free(h);
  free(h);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  beam_roi_host_t *h = calloc(1, sizeof *h);
  if (!h)
    return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
  self->priv = h;
  int rc = beam_roi_host_init(h, self->cfg, d);
  if (rc < 0)
    cpu_destroy(self);
  return rc;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  return beam_roi_host_start(self, self->priv, in, d);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_roi_host_t *h = self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_roi_host_corrupt(h, emit);
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  beam_roi_sum_cpu(&h->lists, in->dtype, in->data, f->data);
  beam_roi_host_record(h, in->frame_id, f->data);
  beam_emit_put(emit, f);
  return beam_roi_host_image(h, emit, 0);
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  return beam_roi_host_image(self->priv, emit, 1);
}

const beam_stage_ops_t beam_roi_sum_cpu_ops = {
    "roi_sum", "cpu", cpu_init, cpu_start, cpu_process, cpu_end, cpu_destroy,
};
