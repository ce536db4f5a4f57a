/* Stage kind `correct`: schema, and the host-side setup both backends share
 * (parameters, dark/flat/mask files, per-pixel tables, output declaration).
 * The pixel loops live in correct_cpu.c and gpu/correct_cuda.cu. */
#include "pipeline/kern/correct.h"

#include <math.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

const beam_param_t beam_correct_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"dark", BEAM_P_PATH, NULL, 0, 0, 0, NULL, NULL,
     "dark (pedestal) image to subtract, .h5 or .npy, same shape as the frames", NULL},
    {"dark_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 dark file", NULL},
    {"flat", BEAM_P_PATH, NULL, 0, 0, 0, NULL, NULL,
     "flat-field image; corrected = (raw - dark) / flat, flat <= 0 marks the pixel bad", NULL},
    {"flat_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 flat file", NULL},
    {"mask", BEAM_P_PATH, NULL, 0, 0, 0, NULL, NULL, "bad-pixel mask: nonzero = bad pixel", NULL},
    {"mask_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 mask file", NULL},
    {"threshold", BEAM_P_FLOAT, "-inf", 0, -1e300, 1e300, NULL, NULL,
     "corrected values below this become 0 (counts; bad pixels keep bad_value); -inf = off", NULL},
    {"saturation", BEAM_P_FLOAT, "inf", 0, -1e300, 1e300, NULL, NULL,
     "raw values at or above this are treated as bad pixels (counts); inf = off", NULL},
    {"bad_value", BEAM_P_FLOAT, "0", 0, -1e300, 1e300, NULL, NULL, "value written to bad pixels (nan allowed)", NULL},
    BEAM_PARAM_END};

static int load_opt(const beam_cnode_t *cfg, const char *key, const char *dskey, beam_array_t *a,
                    beam_diag_t *d) {
  const char *path = beam_cfg_str(cfg, key);
  if (!path)
    return 0;
  const char *ds = beam_cfg_str(cfg, dskey);
  beam_diag_t sub = {0};
  int rc = beam_array_load(path, ds ? ds : "/data", a, &sub);
  if (rc < 0)
    return BEAM_DIAG(d, rc, "%s: %s", key, sub.msg);
  if (a->dtype == BEAM_DT_C64 || a->dtype == BEAM_DT_C128) {
    beam_array_free(a);
    return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: %s holds complex numbers; a real image is needed", key, path);
  }
  return 0;
}

int beam_correct_conf_load(beam_correct_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  c->threshold = beam_cfg_float(cfg, "threshold", -INFINITY);
  c->saturation = beam_cfg_float(cfg, "saturation", INFINITY);
  c->bad_value = (float)beam_cfg_float(cfg, "bad_value", 0.0);
  int rc;
  if ((rc = load_opt(cfg, "dark", "dark_dataset", &c->dark, d)) < 0 ||
      (rc = load_opt(cfg, "flat", "flat_dataset", &c->flat, d)) < 0 ||
      (rc = load_opt(cfg, "mask", "mask_dataset", &c->mask, d)) < 0) {
    beam_correct_conf_free(c);
    return rc;
  }
  return 0;
}

void beam_correct_conf_free(beam_correct_conf_t *c) {
  beam_array_free(&c->dark);
  beam_array_free(&c->flat);
  beam_array_free(&c->mask);
}

static int same_shape(const beam_array_t *a, const beam_indesc_t *in) {
  if (a->ndim != in->ndim)
    return 0;
  for (uint32_t i = 0; i < a->ndim; i++)
    if (a->shape[i] != in->shape[i])
      return 0;
  return 1;
}

int beam_correct_start(beam_stage_t *self, const beam_correct_conf_t *c,
                       const beam_indesc_t *in, beam_diag_t *d) {
  if (in->dtype != BEAM_DT_U16 && in->dtype != BEAM_DT_U32 && in->dtype != BEAM_DT_F32)
    return BEAM_DIAG(d, BEAM_ESHAPE, "correct: input dtype %s is not supported (uint16, uint32 or float32)",
                     beam_dtype_name(in->dtype));
  if (in->ndim < 1 || in->ndim > BEAM_MAX_NDIM)
    return BEAM_DIAG(d, BEAM_ESHAPE, "correct: input has %u dimensions", in->ndim);
  char fs[64], as[64];
  beam_shape_str(in->ndim, in->shape, fs, sizeof fs);
  static const char *names[3] = {"dark", "flat", "mask"};
  const beam_array_t *arrs[3] = {&c->dark, &c->flat, &c->mask};
  for (int i = 0; i < 3; i++)
    if (arrs[i]->data && !same_shape(arrs[i], in))
      return BEAM_DIAG(d, BEAM_ESHAPE, "correct: %s has shape %s but the frames are %s", names[i],
                       beam_shape_str(arrs[i]->ndim, arrs[i]->shape, as, sizeof as), fs);
  self->nouts = 1;
  beam__declare(&self->outs[0], "frame", BEAM_DT_F32, in->ndim, in->shape, "counts", 1);
  return 0;
}

int beam_correct_tab_build(beam_correct_tab_t *t, const beam_correct_conf_t *c, size_t n,
                           beam_diag_t *d) {
  if (n > t->n || !t->dark) {
    beam_correct_tab_free(t);
    t->dark = malloc(n * sizeof *t->dark);
    t->flat = malloc(n * sizeof *t->flat);
    t->bad = malloc(n);
    if (!t->dark || !t->flat || !t->bad) {
      beam_correct_tab_free(t);
      return BEAM_DIAG(d, BEAM_ENOMEM, "correct: cannot allocate tables for %zu pixels", n);
    }
  }
  t->n = n;
  t->plain = !c->dark.data && !c->flat.data && !c->mask.data;
  for (size_t i = 0; i < n; i++) {
    float dk = c->dark.data ? (float)beam_array_get(&c->dark, i) : 0.0f;
    float fl = c->flat.data ? (float)beam_array_get(&c->flat, i) : 1.0f;
    int bad = (c->mask.data && beam_array_get(&c->mask, i) != 0.0) || !isfinite(dk) ||
              !isfinite(fl) || !(fl > 0.0f);
    t->dark[i] = bad ? 0.0f : dk;
    t->flat[i] = bad ? 1.0f : fl;
    t->bad[i] = (uint8_t)bad;
  }
  return 0;
}

void beam_correct_tab_free(beam_correct_tab_t *t) {
  free(t->dark);
  free(t->flat);
  free(t->bad);
  memset(t, 0, sizeof *t);
}
