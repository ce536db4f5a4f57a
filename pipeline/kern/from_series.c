/* Arrays and beam centre taken from the series (see from_series.h). */
#include "pipeline/kern/from_series.h"

#include <math.h>

#include <jansson.h>

static unsigned long long sid(const beam_series_t *s) {
  return s ? (unsigned long long)s->series_id : 0ull;
}

int beam__series_real_array(const beam_series_t *series, const char *who, const char *key,
                            const char *name, const beam_array_t **out, beam_diag_t *d) {
  const beam_series_array_t *sa = beam_series_array(series, name);
  if (!sa)
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s: %s: series, but series %llu carries no \"%s\" "
                     "array (a DECTRIS detector sends it only with header_detail \"all\")",
                     who, key, sid(series), name);
  if (sa->arr.dtype == BEAM_DT_C64 || sa->arr.dtype == BEAM_DT_C128)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: %s: the series' \"%s\" array holds complex numbers",
                     who, key, name);
  *out = &sa->arr;
  return 0;
}

int beam__series_beam_center(const beam_series_t *series, const char *who, const char *key,
                             double *x, double *y, beam_diag_t *d) {
  json_t *root = series && series->meta_json ? json_loadb(series->meta_json, series->meta_len, 0, NULL)
                                             : NULL;
  json_t *b = json_is_object(root) ? json_object_get(root, "beam_center") : NULL;
  double v[2] = {NAN, NAN};
  if (json_is_array(b) && json_array_size(b) == 2)
    for (size_t i = 0; i < 2; i++)
      if (json_is_number(json_array_get(b, i)))
        v[i] = json_number_value(json_array_get(b, i));
  json_decref(root);
  if (!isfinite(v[0]) || !isfinite(v[1]))
    return BEAM_DIAG(d, BEAM_ECONFIG, "%s: %s: series, but the metadata of series %llu has no "
                     "beam_center [y, x] (two numbers, pixels)", who, key, sid(series));
  *y = v[0];
  *x = v[1];
  return 0;
}

int beam__series_scan_shape(const beam_series_t *s, uint32_t *ny, uint32_t *nx) {
  if (!s || !s->meta_json)
    return 0;
  json_t *root = json_loadb(s->meta_json, s->meta_len, 0, NULL);
  json_t *v = json_is_object(root) ? json_object_get(root, "scan_shape") : NULL;
  int rc = 0;
  if (v) {
    rc = -1;
    if (json_is_array(v) && json_array_size(v) == 2 && json_is_integer(json_array_get(v, 0)) &&
        json_is_integer(json_array_get(v, 1))) {
      json_int_t a = json_integer_value(json_array_get(v, 0)), b = json_integer_value(json_array_get(v, 1));
      if (a >= 1 && a <= 1000000 && b >= 1 && b <= 1000000) {
        *ny = (uint32_t)a, *nx = (uint32_t)b;
        rc = 1;
      }
    }
  }
  json_decref(root);
  return rc;
}
