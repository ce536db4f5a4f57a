/* Stage kind `preview`, CUDA backend: the shared rate gate (preview.c)
 * around the `bin` mean kernel (beam__cuda_bin2d, bit-identical to the CPU
 * loop). Only frames that pass the gate go to the device; held-back frames
 * are copied aside on the host, and the last one is uploaded and decimated
 * at series end if it was never shown. */
#include "gpu/cuda_int.h"

#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/preview.h"

typedef struct cuda_s {
  beam_cuda_ctx_t cx;
  beam_preview_conf_t conf;
  beam_bin_geom_t geom;
  beam_preview_gate_t gate;
  beam_indesc_t in;
  size_t in_bytes, out_bytes;
  void *last; /* host side copy of the last held-back frame */
  size_t last_cap;
  void *d_in, *d_out;
  size_t c_in, c_out;
} cuda_t;

static void cu_destroy(beam_stage_t *self) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s)
    return;
  beam__cuda_ctx_fini(&s->cx);
  beam__dbuf_free(&s->d_in, &s->c_in);
  beam__dbuf_free(&s->d_out, &s->c_out);
  free(s->last);
  free(s);
  self->priv = NULL;
}

static int cu_init(beam_stage_t *self, beam_diag_t *d) {
  cuda_t *s = (cuda_t *)calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "preview: out of memory");
  self->priv = s;
  int rc = beam_preview_conf_load(&s->conf, self->cfg, d);
  if (rc < 0)
    return rc;
  return beam__cuda_ctx_init(&s->cx, "preview", d);
}


static int cu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                    beam_diag_t *d) {
  cuda_t *s = (cuda_t *)self->priv;
  int rc = beam_preview_start(self, &s->conf, in, &s->geom, d);
  if (rc < 0)
    return rc;
  s->in = *in;
  s->in_bytes = (size_t)in->shape[0] * in->shape[1] * beam_dtype_size(in->dtype);
  s->out_bytes = (size_t)s->geom.out_h * s->geom.out_w * sizeof(float);
  if (s->in_bytes > s->last_cap) {
    free(s->last);
    s->last = malloc(s->in_bytes);
    s->last_cap = s->last ? s->in_bytes : 0;
    if (!s->last)
      return BEAM_DIAG(d, BEAM_ENOMEM, "preview: cannot allocate %zu bytes", s->in_bytes);
  }
  if ((rc = beam__cuda_ctx_use(&s->cx, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_in, &s->c_in, s->in_bytes, d)) < 0 ||
      (rc = beam__dbuf_reserve(&s->d_out, &s->c_out, s->out_bytes, d)) < 0)
    return rc;
  beam_preview_gate_reset(&s->gate, s->conf.period_ns);
  return 0;
}

static int run(cuda_t *s, const void *src, beam_frame_t *f, beam_diag_t *d) {
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(s->d_in, src, s->in_bytes, cudaMemcpyHostToDevice, s->cx.stream));
  int rc = beam__cuda_bin2d(&s->geom, s->d_in, (float *)s->d_out, s->cx.stream, d);
  if (rc < 0)
    return rc;
  BEAM_CUDA_TRY(d, cudaMemcpyAsync(f->data, s->d_out, s->out_bytes, cudaMemcpyDeviceToHost, s->cx.stream));
  BEAM_CUDA_TRY(d, cudaStreamSynchronize(s->cx.stream));
  return 0;
}

static int cu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return 0;
  int rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape);
  if (rc < 0)
    return rc;
  if (!beam_preview_gate(&s->gate, in)) {
    memcpy(s->last, in->data, s->in_bytes);
    return 0;
  }
  if ((rc = beam__cuda_ctx_use(&s->cx, &self->diag)) < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  if ((rc = run(s, in->data, f, &self->diag)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_emit_put(emit, f);
  return 0;
}

static int cu_end(beam_stage_t *self, beam_emit_t *emit) {
  cuda_t *s = (cuda_t *)self->priv;
  if (!s->gate.pending)
    return 0;
  s->gate.pending = 0;
  int rc = beam__cuda_ctx_use(&s->cx, &self->diag);
  if (rc < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  beam_preview_final_ident(&s->gate, f);
  if ((rc = run(s, s->last, f, &self->diag)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_emit_put(emit, f);
  return 0;
}

extern "C" const beam_stage_ops_t beam_preview_cuda_ops = {
    .kind = "preview", .backend = "cuda",
    .init = cu_init, .start = cu_start, .process = cu_process, .end = cu_end, .destroy = cu_destroy,
};
