/* Stage kind `bin`, CPU backend: the block-reduction loops (fast and
 * reference; `preview` uses them too) and the stage ops.
 *
 * The fast loop walks the input row by row, so every input byte is read
 * once in memory order, and keeps one double per output column; the per
 * pixel summation order is still block row outer, column inner (bin.h). */
#include <math.h>
#include <string.h>

#include "pipeline/kern/bin.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define BIN_FAST(T, DT)                                                        \
  case DT:                                                                     \
    for (uint32_t oy = 0; oy < g->out_h; oy++) {                               \
      for (uint32_t ox = 0; ox < g->out_w; ox++)                               \
        acc[ox] = 0.0;                                                         \
      for (uint32_t dy = 0; dy < n; dy++) {                                    \
        const T *restrict row =                                                \
            (const T *)in + ((size_t)g->y0 + (size_t)oy * n + dy) * g->in_w + g->x0; \
        for (uint32_t ox = 0; ox < g->out_w; ox++) {                           \
          const T *p = row + (size_t)ox * n;                                   \
          double s = acc[ox];                                                  \
          for (uint32_t dx = 0; dx < n; dx++)                                  \
            s += (double)p[dx];                                                \
          acc[ox] = s;                                                         \
        }                                                                      \
      }                                                                        \
      float *o = out + (size_t)oy * g->out_w;                                  \
      for (uint32_t ox = 0; ox < g->out_w; ox++)                               \
        o[ox] = (float)(g->mean ? acc[ox] / nn : acc[ox]);                     \
    }                                                                          \
    break;

void beam_bin2d_cpu(const beam_bin_geom_t *g, const void *in, float *restrict out,
                    double *restrict acc) {
  const uint32_t n = g->n;
  const double nn = (double)n * n;
  switch (g->dtype) {
    BEAM__REAL_DTYPES(BIN_FAST)
  default: BEAM_ASSERT(!"bin: dtype not accepted at start");
  }
}

static double px(beam_dtype_t dt, const void *in, size_t i) {
  switch (dt) {
#define PX_CASE(T, DT) case DT: return (double)((const T *)in)[i];
    BEAM__REAL_DTYPES(PX_CASE)
#undef PX_CASE
  default: BEAM_ASSERT(!"bin: dtype not accepted at start"); return 0;
  }
}

void beam_bin2d_ref(const beam_bin_geom_t *g, const void *in, float *out) {
  for (uint32_t oy = 0; oy < g->out_h; oy++)
    for (uint32_t ox = 0; ox < g->out_w; ox++) {
      double s = 0.0;
      for (uint32_t dy = 0; dy < g->n; dy++)
        for (uint32_t dx = 0; dx < g->n; dx++) {
          size_t y = (size_t)g->y0 + (size_t)oy * g->n + dy;
          size_t x = (size_t)g->x0 + (size_t)ox * g->n + dx;
          s += px(g->dtype, in, y * g->in_w + x);
        }
      out[(size_t)oy * g->out_w + ox] = (float)(g->mean ? s / ((double)g->n * g->n) : s);
    }
}

/* ---- stage ops ------------------------------------------------------------ */

typedef struct cpu_s {
  beam_bin_conf_t conf;
  beam_bin_geom_t geom;
  beam_indesc_t in;
  double *acc;
  size_t acc_cap;
} cpu_t;

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *s = self->priv;
  if (!s)
    return;
  free(s->acc);
  free(s);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "bin: out of memory");
  self->priv = s;
  return beam_bin_conf_load(&s->conf, self->cfg, d);
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *s = self->priv;
  int rc = beam_bin_start(self, &s->conf, in, &s->geom, d);
  if (rc < 0)
    return rc;
  if (s->geom.out_w > s->acc_cap) {
    free(s->acc);
    s->acc = malloc(s->geom.out_w * sizeof *s->acc);
    s->acc_cap = s->acc ? s->geom.out_w : 0;
    if (!s->acc)
      return BEAM_DIAG(d, BEAM_ENOMEM, "bin: out of memory");
  }
  s->in = *in;
  return 0;
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *s = self->priv;
  int corrupt = (in->flags & BEAM_FLAG_CORRUPT) != 0;
  int rc;
  if (!corrupt && (rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape)) < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  if (corrupt) {
    float *o = f->data;
    for (size_t i = 0; i < (size_t)s->geom.out_h * s->geom.out_w; i++)
      o[i] = NAN;
  } else {
    beam_bin2d_cpu(&s->geom, in->data, f->data, s->acc);
  }
  beam_emit_put(emit, f);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) { return 0; }

const beam_stage_ops_t beam_bin_cpu_ops = {
    .kind = "bin", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
