/* Stage kind `correct`: schema, and the host-side setup both backends share
 * (parameters, dark/flat/mask files or series arrays, per-pixel tables,
 * output declaration). The pixel loops live in correct_cpu.c and
 * gpu/correct_cuda.cu. */
#include "pipeline/kern/correct.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/kern/from_series.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define FROM_SERIES BEAM_FROM_SERIES
#define GAP_INT_MAX (1LL << 53) /* every integer up to 2^53 is exact in double */

/* "auto", "none", or an integer within +-2^53; *v gets the integer. */
static int parse_gap(const char *s, int *mode, double *v) {
  if (!strcmp(s, "none")) {
    *mode = BEAM_CORRECT_GAP_NONE;
    return 0;
  }
  if (!strcmp(s, "auto")) {
    *mode = BEAM_CORRECT_GAP_AUTO;
    return 0;
  }
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (!s[0] || *end || errno || x > GAP_INT_MAX || x < -GAP_INT_MAX)
    return -1;
  *mode = BEAM_CORRECT_GAP_VALUE;
  *v = (double)x;
  return 0;
}

static const char *gap_valid(const beam_cnode_t *v) {
  int mode;
  double x;
  if (v->kind != BEAM_CN_SCALAR || !v->scalar || parse_gap(v->scalar, &mode, &x) < 0)
    return "expected auto, none or an integer (-2^53..2^53)";
  return NULL;
}

const beam_param_t beam_correct_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"dark", BEAM_P_INFILE, NULL, 0, 0, 0, NULL, NULL,
     "dark (pedestal) image to subtract, .h5 or .npy, same shape as the frames", NULL},
    {"dark_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 dark file", NULL},
    {"flat", BEAM_P_INFILE, NULL, 0, 0, 0, FROM_SERIES, NULL,
     "flat-field image; corrected = (raw - dark) / flat, flat <= 0 marks the pixel bad; "
     "\"series\": the series' flatfield array (multiplied: raw x flatfield)", NULL},
    {"flat_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 flat file", NULL},
    {"mask", BEAM_P_INFILE, NULL, 0, 0, 0, FROM_SERIES, NULL,
     "bad-pixel mask: nonzero = bad pixel; \"series\": the series' pixel_mask array", NULL},
    {"mask_dataset", BEAM_P_STRING, "/data", 0, 0, 0, NULL, NULL, "dataset path inside an HDF5 mask file", NULL},
    {"threshold", BEAM_P_FLOAT, "-inf", 0, -1e300, 1e300, NULL, NULL,
     "corrected values below this become 0 (counts; bad pixels keep bad_value); -inf = off", NULL},
    {"saturation", BEAM_P_FLOAT, "inf", 0, -1e300, 1e300, NULL, NULL,
     "raw values at or above this are treated as bad pixels (counts); inf = off", NULL},
    {"gap_value", BEAM_P_STRING, "none", 0, 0, 0, NULL, NULL,
     "raw value marking gap/dead pixels, treated as bad: auto = 2^N-1 of an unsigned N-bit "
     "input (EIGER), none, or an integer", gap_valid},
    {"bad_value", BEAM_P_FLOAT, "0", 0, -1e300, 1e300, NULL, NULL, "value written to bad pixels (nan allowed)", NULL},
    BEAM_PARAM_END};

/* Loads the file named by `key`, if any. For `series` (where allowed,
 * from_series != NULL) it sets *from_series and loads nothing; a file
 * really called "series" is written ./series. */
static int load_opt(const beam_cnode_t *cfg, const char *key, const char *dskey, beam_array_t *a,
                    int *from_series, beam_diag_t *d) {
  const char *path = beam_cfg_str(cfg, key);
  if (!path)
    return 0;
  if (!strcmp(path, FROM_SERIES)) {
    if (!from_series)
      return BEAM_DIAG(d, BEAM_ECONFIG, "%s: \"series\" is not supported for this key (series carry "
                       "no %s array); write ./series for a file of that name", key, key);
    *from_series = 1;
    return 0;
  }
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
  const char *gap = beam_cfg_str(cfg, "gap_value");
  if (gap && parse_gap(gap, &c->gap_mode, &c->gap_value) < 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, "gap_value: \"%s\" is not auto, none or an integer", gap);
  int rc;
  if ((rc = load_opt(cfg, "dark", "dark_dataset", &c->dark, NULL, d)) < 0 ||
      (rc = load_opt(cfg, "flat", "flat_dataset", &c->flat, &c->flat_series, d)) < 0 ||
      (rc = load_opt(cfg, "mask", "mask_dataset", &c->mask, &c->mask_series, d)) < 0) {
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

double beam_correct_gap(const beam_correct_conf_t *c, beam_dtype_t dt) {
  switch (c->gap_mode) {
  case BEAM_CORRECT_GAP_AUTO:
    /* EIGER writes 2^N - 1 into gap, dead and masked pixels (and into
     * saturated ones in some modes); a float32 input has no such value. */
    if (dt == BEAM_DT_U16)
      return 65535.0;
    if (dt == BEAM_DT_U32)
      return 4294967295.0;
    return NAN;
  case BEAM_CORRECT_GAP_VALUE: return c->gap_value;
  default: return NAN;
  }
}

int beam_correct_src(const beam_correct_conf_t *c, const beam_series_t *series,
                     const beam_indesc_t *in, beam_correct_src_t *src, beam_diag_t *d) {
  memset(src, 0, sizeof *src);
  if (in->dtype != BEAM_DT_U16 && in->dtype != BEAM_DT_U32 && in->dtype != BEAM_DT_F32)
    return BEAM_DIAG(d, BEAM_ESHAPE, "correct: input dtype %s is not supported (uint16, uint32 or float32)",
                     beam_dtype_name(in->dtype));
  if (in->ndim < 1 || in->ndim > BEAM_MAX_NDIM)
    return BEAM_DIAG(d, BEAM_ESHAPE, "correct: input has %u dimensions", in->ndim);
  int rc;
  src->dark = c->dark.data ? &c->dark : NULL;
  src->flat = c->flat.data ? &c->flat : NULL;
  src->mask = c->mask.data ? &c->mask : NULL;
  if (c->flat_series) {
    if ((rc = beam__series_real_array(series, "correct", "flat", "flatfield", &src->flat, d)) < 0)
      return rc;
    src->flat_mul = 1;
  }
  if (c->mask_series &&
      (rc = beam__series_real_array(series, "correct", "mask", "pixel_mask", &src->mask, d)) < 0)
    return rc;
  src->gap = beam_correct_gap(c, in->dtype);
  char fs[64], as[64];
  beam_shape_str(in->ndim, in->shape, fs, sizeof fs);
  static const char *names[3] = {"dark", "flat", "mask"};
  const int from_series[3] = {0, c->flat_series, c->mask_series};
  const beam_array_t *arrs[3] = {src->dark, src->flat, src->mask};
  for (int i = 0; i < 3; i++)
    if (arrs[i] && !same_shape(arrs[i], in))
      return BEAM_DIAG(d, BEAM_ESHAPE, "correct: %s%s has shape %s but the frames are %s", names[i],
                       from_series[i] ? " (from the series)" : "",
                       beam_shape_str(arrs[i]->ndim, arrs[i]->shape, as, sizeof as), fs);
  return 0;
}

int beam_correct_start(beam_stage_t *self, const beam_correct_conf_t *c,
                       const beam_series_t *series, const beam_indesc_t *in,
                       beam_correct_src_t *src, beam_diag_t *d) {
  int rc = beam_correct_src(c, series, in, src, d);
  if (rc < 0)
    return rc;
  self->nouts = 1;
  beam__declare(&self->outs[0], "frame", BEAM_DT_F32, in->ndim, in->shape, "counts", 1);
  return 0;
}

int beam_correct_tab_build(beam_correct_tab_t *t, const beam_correct_src_t *src, size_t n,
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
  t->plain = !src->dark && !src->flat && !src->mask;
  t->gap = src->gap;
  for (size_t i = 0; i < n; i++) {
    float dk = src->dark ? (float)beam_array_get(src->dark, i) : 0.0f;
    float fl = 1.0f;
    if (src->flat)
      fl = src->flat_mul ? (float)(1.0 / beam_array_get(src->flat, i))
                         : (float)beam_array_get(src->flat, i);
    int bad = (src->mask && beam_array_get(src->mask, i) != 0.0) || !isfinite(dk) ||
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
