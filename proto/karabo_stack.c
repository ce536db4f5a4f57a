/* Per-module Karabo sources stacked into one frame (karabo_stack.h). */
#include "proto/karabo_stack.h"

#include <fnmatch.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

int beam_kb_is_pattern(const char *s) { return s && strpbrk(s, "*?[") != NULL; }

long beam_kb_module_number(const char *pattern, const char *name, size_t n) {
  char buf[512];
  if (!pattern || n >= sizeof buf)
    return -1;
  memcpy(buf, name, n);
  buf[n] = 0;
  if (fnmatch(pattern, buf, 0) != 0)
    return -1;
  size_t at = strcspn(pattern, "*?[");
  if (at >= n || buf[at] < '0' || buf[at] > '9')
    return -1;
  long v = 0;
  for (size_t i = at; i < n && buf[i] >= '0' && buf[i] <= '9'; i++) {
    v = v * 10 + (buf[i] - '0');
    if (v > 999999)
      return -1;
  }
  return v;
}

/* (melems, pulses) -> pulse-major, modules apart, in tiles so reads and
 * writes both stream (reading the module once per pulse would not). Within
 * a tile each pulse's run is written contiguously: the pulses' outputs are
 * a power of two apart (2 MiB for an AGIPD pulse), so writing one element
 * of each in turn puts every line in the same cache set and thrashes it
 * (0.33 GB/s against several GB/s this way). One loop per element size: a
 * memcpy of a run-time size per element is a call per pixel, one of a
 * constant size a plain (unaligned-safe) move. */
#define TRANSPOSE(T) \
  do { \
    const uint8_t *s_ = in; \
    uint8_t *o_ = out; \
    size_t fe_ = melems * modules, off_ = (size_t)mod * melems; \
    for (size_t i0 = 0; i0 < melems; i0 += TILE) \
      for (size_t j0 = 0; j0 < pulses; j0 += TILE) { \
        size_t i1 = i0 + TILE < melems ? i0 + TILE : melems; \
        size_t j1 = j0 + TILE < pulses ? j0 + TILE : pulses; \
        for (size_t j = j0; j < j1; j++) \
          for (size_t i = i0; i < i1; i++) { \
            T v_; /* a part's bytes may sit at any address: no aligned load */ \
            memcpy(&v_, s_ + (i * pulses + j) * sizeof v_, sizeof v_); \
            memcpy(o_ + (j * fe_ + off_ + i) * sizeof v_, &v_, sizeof v_); \
          } \
      } \
  } while (0)

void beam_kb_stack_module(void *out, const void *in, size_t pulses, size_t melems, size_t es,
                          unsigned modules, unsigned mod, int pulse_last) {
  enum { TILE = 32 };
  uint8_t *o = out;
  const uint8_t *src = in;
  size_t mbytes = melems * es, fbytes = mbytes * modules;
  if (!pulse_last || pulses == 1) {
    for (size_t p = 0; p < pulses; p++)
      memcpy(o + p * fbytes + mod * mbytes, src + p * mbytes, mbytes);
    return;
  }
  switch (es) {
  case 1: TRANSPOSE(uint8_t); return;
  case 2: TRANSPOSE(uint16_t); return;
  case 4: TRANSPOSE(uint32_t); return;
  case 8: TRANSPOSE(uint64_t); return;
  default: break;
  }
  for (size_t i0 = 0; i0 < melems; i0 += TILE)
    for (size_t j0 = 0; j0 < pulses; j0 += TILE) {
      size_t i1 = i0 + TILE < melems ? i0 + TILE : melems, j1 = j0 + TILE < pulses ? j0 + TILE : pulses;
      for (size_t i = i0; i < i1; i++)
        for (size_t j = j0; j < j1; j++)
          memcpy(o + j * fbytes + mod * mbytes + i * es, src + (i * pulses + j) * es, es);
    }
}
#undef TRANSPOSE

/* The fill value as one element of dt. */
static size_t fill_elem(beam_dtype_t dt, double fill, uint8_t el[16]) {
  size_t es = beam_dtype_size(dt);
  int isnan_ = isnan(fill);
  double r = isnan_ ? 0 : nearbyint(fill);
#define CLAMPED(T, lo, hi) \
  do { \
    T v = r <= (double)(lo) ? (lo) : r >= (double)(hi) ? (hi) : (T)r; \
    memcpy(el, &v, sizeof v); \
  } while (0)
  switch (dt) {
  case BEAM_DT_U8: CLAMPED(uint8_t, 0, UINT8_MAX); break;
  case BEAM_DT_U16: CLAMPED(uint16_t, 0, UINT16_MAX); break;
  case BEAM_DT_U32: CLAMPED(uint32_t, 0, UINT32_MAX); break;
  case BEAM_DT_U64: CLAMPED(uint64_t, 0, UINT64_MAX); break;
  case BEAM_DT_I8: CLAMPED(int8_t, INT8_MIN, INT8_MAX); break;
  case BEAM_DT_I16: CLAMPED(int16_t, INT16_MIN, INT16_MAX); break;
  case BEAM_DT_I32: CLAMPED(int32_t, INT32_MIN, INT32_MAX); break;
  case BEAM_DT_I64: CLAMPED(int64_t, INT64_MIN, INT64_MAX); break;
  case BEAM_DT_F32:
  case BEAM_DT_C64: {
    float v = (float)fill;
    memcpy(el, &v, 4);
    memcpy(el + 4, &v, 4);
    break;
  }
  case BEAM_DT_F64:
  case BEAM_DT_C128:
    memcpy(el, &fill, 8);
    memcpy(el + 8, &fill, 8);
    break;
  default: return 0;
  }
#undef CLAMPED
  return es;
}

void beam_kb_stack_fill(void *out, size_t pulses, size_t melems, beam_dtype_t dt,
                        unsigned modules, unsigned mod, double fill) {
  uint8_t el[16], *o = out;
  size_t es = fill_elem(dt, fill, el);
  if (!es)
    return;
  size_t mbytes = melems * es, fbytes = mbytes * modules;
  uint8_t *first = o + mod * mbytes;
  /* One module image of fill, then copied to the other pulses. */
  int zero = 1;
  for (size_t k = 0; k < es; k++)
    zero &= el[k] == 0;
  if (zero)
    memset(first, 0, mbytes);
  else
    for (size_t i = 0; i < melems; i++)
      memcpy(first + i * es, el, es);
  for (size_t p = 1; p < pulses; p++)
    memcpy(o + p * fbytes + mod * mbytes, first, mbytes);
}
