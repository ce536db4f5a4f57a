/* Stage kind `preview`: schema, and the host-side logic both backends share
 * (decimation factor, rate gate, final-frame identity). */
#include "pipeline/kern/preview.h"

#include <math.h>
#include <string.h>

#include "pipeline/array.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

const beam_param_t beam_preview_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"rate", BEAM_P_FLOAT, "5", 0, 0.001, 1000, NULL, NULL, "at most this many previews per second (Hz)", NULL},
    {"max_size", BEAM_P_INT, "1024", 0, 16, 65536, NULL, NULL,
     "largest side of a preview in pixels: frames are block-averaged by the smallest integer factor that fits", NULL},
    BEAM_PARAM_END};

int beam_preview_conf_load(beam_preview_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  c->rate = beam_cfg_float(cfg, "rate", 5.0);
  int64_t m = beam_cfg_int(cfg, "max_size", 1024);
  if (!(c->rate >= 0.001 && c->rate <= 1000))
    return BEAM_DIAG(d, BEAM_ECONFIG, "preview: rate %g outside 0.001..1000 Hz", c->rate);
  if (m < 16 || m > 65536)
    return BEAM_DIAG(d, BEAM_ECONFIG, "preview: max_size %lld outside 16..65536", (long long)m);
  c->max_size = (uint32_t)m;
  c->period_ns = (uint64_t)llround(1e9 / c->rate);
  return 0;
}

int beam_preview_start(beam_stage_t *self, const beam_preview_conf_t *c, const beam_indesc_t *in,
                       beam_bin_geom_t *g, beam_diag_t *d) {
  char fs[64];
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, "preview: input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2 || in->shape[0] == 0 || in->shape[1] == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, "preview: frames must be 2-D and non-empty, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  uint32_t H = in->shape[0], W = in->shape[1], m = c->max_size;
  uint32_t fy = (H + m - 1) / m, fx = (W + m - 1) / m;
  memset(g, 0, sizeof *g);
  g->dtype = in->dtype;
  g->in_h = H, g->in_w = W;
  g->n = fy > fx ? fy : fx;
  g->out_h = H / g->n;
  g->out_w = W / g->n;
  g->mean = 1;
  if (g->out_h == 0 || g->out_w == 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, "preview: a %s frame is too elongated to fit %u pixels a side",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs), m);
  uint32_t shape[2] = {g->out_h, g->out_w};
  self->nouts = 1;
  beam__declare(&self->outs[0], "frame", BEAM_DT_F32, 2, shape, "counts/pixel", 0);
  return 0;
}

void beam_preview_gate_reset(beam_preview_gate_t *gt, uint64_t period_ns) {
  memset(gt, 0, sizeof *gt);
  gt->period_ns = period_ns;
}

int beam_preview_gate(beam_preview_gate_t *gt, const beam_frame_t *in) {
  uint64_t t = in->t_recv_ns ? in->t_recv_ns : beam_now_ns();
  if (!gt->emitted_any || (t >= gt->last_emit_ns && t - gt->last_emit_ns >= gt->period_ns)) {
    gt->emitted_any = 1;
    gt->last_emit_ns = t;
    gt->pending = 0;
    return 1;
  }
  beam_frame_copy_ident(&gt->last, in);
  gt->pending = 1;
  return 0;
}

void beam_preview_final_ident(const beam_preview_gate_t *gt, beam_frame_t *f) {
  beam_frame_copy_ident(f, &gt->last);
  f->flags = (f->flags & ~(uint32_t)BEAM_FLAG_META) | BEAM_FLAG_FINAL;
}
