/* Stage kind `preview`, CPU backend: the rate gate from preview.c around the
 * `bin` mean loop from bin_cpu.c. Held-back frames are copied aside (one
 * memcpy, cheaper than decimating a frame nobody may see) so the last one
 * can be emitted at series end. */
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/preview.h"

typedef struct cpu_s {
  beam_preview_conf_t conf;
  beam_bin_geom_t geom;
  beam_preview_gate_t gate;
  beam_indesc_t in;
  size_t frame_bytes;
  void *last;          /* side copy of the last held-back frame */
  size_t last_cap;
  double *acc;
  size_t acc_cap;
} cpu_t;

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *s = self->priv;
  if (!s)
    return;
  free(s->last);
  free(s->acc);
  free(s);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "preview: out of memory");
  self->priv = s;
  return beam_preview_conf_load(&s->conf, self->cfg, d);
}

static int grow(void **p, size_t *cap, size_t bytes) {
  if (bytes <= *cap)
    return 0;
  free(*p);
  *p = malloc(bytes);
  *cap = *p ? bytes : 0;
  return *p ? 0 : -1;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *s = self->priv;
  int rc = beam_preview_start(self, &s->conf, in, &s->geom, d);
  if (rc < 0)
    return rc;
  s->frame_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  if (grow(&s->last, &s->last_cap, s->frame_bytes) < 0 ||
      grow((void **)&s->acc, &s->acc_cap, s->geom.out_w * sizeof(double)) < 0)
    return BEAM_DIAG(d, BEAM_ENOMEM, "preview: cannot allocate %zu bytes", s->frame_bytes);
  s->in = *in;
  beam_preview_gate_reset(&s->gate, s->conf.period_ns);
  return 0;
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *s = self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return 0;
  int rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape);
  if (rc < 0)
    return rc;
  if (!beam_preview_gate(&s->gate, in)) {
    memcpy(s->last, in->data, s->frame_bytes);
    return 0;
  }
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  beam_bin2d_cpu(&s->geom, in->data, f->data, s->acc);
  beam_emit_put(emit, f);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  cpu_t *s = self->priv;
  if (!s->gate.pending)
    return 0;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  beam_preview_final_ident(&s->gate, f);
  beam_bin2d_cpu(&s->geom, s->last, f->data, s->acc);
  s->gate.pending = 0;
  beam_emit_put(emit, f);
  return 0;
}

const beam_stage_ops_t beam_preview_cpu_ops = {
    .kind = "preview", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
