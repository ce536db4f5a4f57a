/* Helpers shared by the stage kinds in pipeline/kern/ and their CUDA twins
 * in gpu/: dtype dispatch, list-valued config items, emitted-frame sizing.
 * Internal: nothing outside the kernels includes it. */
#ifndef BEAM_KERN_INT_H
#define BEAM_KERN_INT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Real numeric dtypes (every kind here rejects complex input). */
static inline int beam__dtype_real(beam_dtype_t dt) {
  return dt >= BEAM_DT_U8 && dt <= BEAM_DT_F64;
}

/* Expands M(ctype, BEAM_DT_x) once per real dtype, as switch cases. */
#define BEAM__REAL_DTYPES(M)                                                   \
  M(uint8_t, BEAM_DT_U8) M(uint16_t, BEAM_DT_U16) M(uint32_t, BEAM_DT_U32)    \
  M(uint64_t, BEAM_DT_U64) M(int8_t, BEAM_DT_I8) M(int16_t, BEAM_DT_I16)       \
  M(int32_t, BEAM_DT_I32) M(int64_t, BEAM_DT_I64) M(float, BEAM_DT_F32)        \
  M(double, BEAM_DT_F64)

/* A numeric list item (INT_LIST / FLOAT_LIST) as a double: the validator
 * fills fval for both; an unvalidated node falls back to its text. */
static inline double beam__cfg_item_num(const beam_cnode_t *n) {
  if (!n || n->kind != BEAM_CN_SCALAR)
    return NAN;
  if (n->typed)
    return n->fval;
  char *end;
  double v = n->scalar ? strtod(n->scalar, &end) : NAN;
  return n->scalar && end != n->scalar && *end == '\0' ? v : NAN;
}

/* Bytes of a frame's payload from its dtype and shape. */
static inline size_t beam__frame_bytes(const beam_frame_t *f) {
  return beam_geom_bytes(f->dtype, f->ndim, f->shape);
}

/* Checks that a frame handed to process matches what start accepted;
 * the graph guarantees it, but a short payload must never be read past. */
static inline int beam__frame_matches(beam_stage_t *self, const beam_frame_t *in,
                                      beam_dtype_t dt, uint32_t ndim, const uint32_t *shape) {
  int ok = in->dtype == dt && in->ndim == ndim;
  for (uint32_t i = 0; ok && i < ndim; i++)
    ok = in->shape[i] == shape[i];
  if (ok && in->nbytes < beam__frame_bytes(in))
    ok = 0;
  if (!ok)
    return BEAM_DIAG(&self->diag, BEAM_ESHAPE,
                     "stage \"%s\": frame %llu does not match the series (dtype %s, ndim %u, %zu bytes)",
                     self->name, (unsigned long long)in->frame_id, beam_dtype_name(in->dtype),
                     in->ndim, in->nbytes);
  return 0;
}

/* Fills one output declaration; the last two axes are named y and x. */
static inline void beam__declare(beam_outdesc_t *o, const char *name, beam_dtype_t dt,
                                 uint32_t ndim, const uint32_t *shape, const char *units,
                                 int per_frame) {
  memset(o, 0, sizeof *o);
  snprintf(o->name, sizeof o->name, "%s", name);
  o->dtype = dt;
  o->ndim = ndim;
  for (uint32_t i = 0; i < ndim && i < BEAM_MAX_NDIM; i++) {
    o->shape[i] = shape[i];
    o->axes[i] = i + 2 == ndim ? "y" : i + 1 == ndim ? "x" : "";
  }
  o->units = units;
  o->per_frame = per_frame;
}

#ifdef __cplusplus
}
#endif
#endif
