/* Stage kind `bin`: schema, and the host-side setup both backends share
 * (parameters, crop checks against the frame, output declaration). */
#include "pipeline/kern/bin.h"

#include <string.h>

#include "pipeline/array.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

const beam_param_t beam_bin_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"crop", BEAM_P_INT_LIST, NULL, 0, 0, 1e9, NULL, NULL,
     "[y0, x0, height, width] in pixels before binning; default the whole frame", NULL},
    {"factor", BEAM_P_INT, "2", 0, 1, 256, NULL, NULL, "n: sum or mean over n x n blocks; a partial edge block is dropped", NULL},
    {"mode", BEAM_P_ENUM, "sum", 0, 0, 0, "sum|mean", NULL, "sum or mean over each block (float32 out)", NULL},
    BEAM_PARAM_END};

int beam_bin_conf_load(beam_bin_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  int64_t n = beam_cfg_int(cfg, "factor", 2);
  if (n < 1 || n > 256)
    return BEAM_DIAG(d, BEAM_ECONFIG, "bin: factor %lld outside 1..256", (long long)n);
  c->n = (uint32_t)n;
  const char *mode = beam_cfg_str(cfg, "mode");
  if (mode && strcmp(mode, "mean") != 0 && strcmp(mode, "sum") != 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, "bin: mode must be sum or mean, got \"%s\"", mode);
  c->mean = mode && strcmp(mode, "mean") == 0;
  const beam_cnode_t *crop = beam_cfg_get(cfg, "crop");
  if (crop) {
    if (beam_cfg_len(crop) != 4)
      return BEAM_DIAG(d, BEAM_ECONFIG, "bin: crop needs 4 integers [y0, x0, height, width], got %zu",
                       beam_cfg_len(crop));
    double v[4];
    for (int i = 0; i < 4; i++) {
      v[i] = beam__cfg_item_num(beam_cfg_at(crop, (size_t)i));
      if (!(v[i] >= 0 && v[i] <= 1e9) || v[i] != (double)(int64_t)v[i])
        return BEAM_DIAG(d, BEAM_ECONFIG, "bin: crop[%d] must be an integer in 0..1e9", i);
    }
    if (v[2] < 1 || v[3] < 1)
      return BEAM_DIAG(d, BEAM_ECONFIG, "bin: crop height and width must be at least 1");
    c->crop_set = 1;
    c->y0 = (uint32_t)v[0];
    c->x0 = (uint32_t)v[1];
    c->h = (uint32_t)v[2];
    c->w = (uint32_t)v[3];
  }
  return 0;
}

int beam_bin_start(beam_stage_t *self, const beam_bin_conf_t *c, const beam_indesc_t *in,
                   beam_bin_geom_t *g, beam_diag_t *d) {
  char fs[64];
  if (!beam__dtype_real(in->dtype))
    return BEAM_DIAG(d, BEAM_ESHAPE, "bin: input dtype %s is not supported (integers, float32, float64)",
                     beam_dtype_name(in->dtype));
  if (in->ndim != 2)
    return BEAM_DIAG(d, BEAM_ESHAPE, "bin: frames must be 2-D, got %s",
                     beam_shape_str(in->ndim, in->shape, fs, sizeof fs));
  beam_shape_str(in->ndim, in->shape, fs, sizeof fs);
  uint32_t H = in->shape[0], W = in->shape[1];
  uint32_t y0 = 0, x0 = 0, h = H, w = W;
  if (c->crop_set) {
    y0 = c->y0, x0 = c->x0, h = c->h, w = c->w;
    if ((uint64_t)y0 + h > H || (uint64_t)x0 + w > W)
      return BEAM_DIAG(d, BEAM_ESHAPE,
                       "bin: crop [y0=%u, x0=%u, h=%u, w=%u] does not fit in the %s frame", y0, x0,
                       h, w, fs);
  }
  if (h < c->n || w < c->n)
    return BEAM_DIAG(d, BEAM_ESHAPE, "bin: the %ux%u region is smaller than one %ux%u block", h, w,
                     c->n, c->n);
  memset(g, 0, sizeof *g);
  g->dtype = in->dtype;
  g->in_h = H, g->in_w = W, g->y0 = y0, g->x0 = x0;
  g->n = c->n;
  g->out_h = h / c->n;
  g->out_w = w / c->n;
  g->mean = c->mean;
  uint32_t shape[2] = {g->out_h, g->out_w};
  self->nouts = 1;
  beam__declare(&self->outs[0], "frame", BEAM_DT_F32, 2, shape, c->mean ? "counts/pixel" : "counts", 1);
  return 0;
}
