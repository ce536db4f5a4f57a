/* beamd-sub reporting: array summaries and the per-message output lines.
 *
 * --json writes one JSON object per message (the format tests parse; keys
 * are listed in docs/tools.md), --print one human-readable line. Both are
 * flushed per message so a pipe reader sees each message as it arrives.
 */
#include "tools/beamd-sub/sub.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static int dt_is_int(beam_dtype_t dt) { return dt >= BEAM_DT_U8 && dt <= BEAM_DT_I64; }
static int dt_is_complex(beam_dtype_t dt) { return dt == BEAM_DT_C64 || dt == BEAM_DT_C128; }
static int dt_is_unsigned(beam_dtype_t dt) { return dt >= BEAM_DT_U8 && dt <= BEAM_DT_U64; }

/* Payloads are little-endian and may sit at any offset inside a ZeroMQ
 * message copy, so elements are read with memcpy (compiled to plain loads). */
#define RD_FN(name, T)                                    \
  static T name(const void *p, uint64_t i) {              \
    T v;                                                  \
    memcpy(&v, (const char *)p + (size_t)i * sizeof v, sizeof v); \
    return v;                                             \
  }
RD_FN(rd_u8, uint8_t)
RD_FN(rd_u16, uint16_t)
RD_FN(rd_u32, uint32_t)
RD_FN(rd_u64, uint64_t)
RD_FN(rd_i8, int8_t)
RD_FN(rd_i16, int16_t)
RD_FN(rd_i32, int32_t)
RD_FN(rd_i64, int64_t)
RD_FN(rd_f32, float)
RD_FN(rd_f64, double)

static int64_t get_i(const void *p, beam_dtype_t dt, uint64_t i) {
  switch (dt) {
  case BEAM_DT_U8: return rd_u8(p, i);
  case BEAM_DT_U16: return rd_u16(p, i);
  case BEAM_DT_U32: return rd_u32(p, i);
  case BEAM_DT_U64: return (int64_t)rd_u64(p, i); /* callers reinterpret */
  case BEAM_DT_I8: return rd_i8(p, i);
  case BEAM_DT_I16: return rd_i16(p, i);
  case BEAM_DT_I32: return rd_i32(p, i);
  case BEAM_DT_I64: return rd_i64(p, i);
  default: return 0;
  }
}

/* Real part (or the value) and imaginary part of element i. */
static double get_d(const void *p, beam_dtype_t dt, uint64_t i, double *im) {
  *im = 0.0;
  switch (dt) {
  case BEAM_DT_F32: return rd_f32(p, i);
  case BEAM_DT_F64: return rd_f64(p, i);
  case BEAM_DT_C64: *im = rd_f32(p, 2 * i + 1); return rd_f32(p, 2 * i);
  case BEAM_DT_C128: *im = rd_f64(p, 2 * i + 1); return rd_f64(p, 2 * i);
  case BEAM_DT_U64: return (double)(uint64_t)get_i(p, dt, i);
  default: return (double)get_i(p, dt, i);
  }
}

void sub_vstats(const void *data, beam_dtype_t dt, uint64_t n, sub_vstats_t *o) {
  memset(o, 0, sizeof *o);
  o->n = n;
  o->is_int = dt_is_int(dt);
  o->is_complex = dt_is_complex(dt);
  o->min = INFINITY;
  o->max = -INFINITY;
  uint64_t nfin = 0;
  double acc = 0.0;
  for (uint64_t i = 0; i < n; i++) {
    double im, v = get_d(data, dt, i, &im);
    if (o->is_int) {
      if (dt == BEAM_DT_U64)
        o->isum += (__int128)(uint64_t)get_i(data, dt, i);
      else
        o->isum += get_i(data, dt, i);
    } else {
      o->dsum += v;
      o->dsum_im += im;
    }
    if (o->is_complex)
      v = hypot(v, im);
    if (!isfinite(v)) {
      o->nonfinite++;
      continue;
    }
    if (v < o->min) o->min = v;
    if (v > o->max) o->max = v;
    acc += v;
    nfin++;
  }
  o->mean = nfin ? acc / (double)nfin : NAN;
}

static json_t *jreal(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *jint128(__int128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX)
    return json_integer((json_int_t)v);
  return json_real((double)v);
}

static json_t *jvalue(const void *p, beam_dtype_t dt, uint64_t i) {
  if (dt_is_int(dt)) {
    int64_t v = get_i(p, dt, i);
    if (dt == BEAM_DT_U64 && v < 0)
      return json_real((double)(uint64_t)v);
    return json_integer((json_int_t)v);
  }
  double im, re = get_d(p, dt, i, &im);
  if (dt_is_complex(dt))
    return json_pack("[oo]", jreal(re), jreal(im));
  return jreal(re);
}

void sub_out_name(const beam_msg_t *m, char *buf, size_t cap) {
  if (m->topic) {
    size_t n = m->topic_len;
    const char *pre = m->topic[0] == '.' ? "_" : "";
    snprintf(buf, cap, "%s%.*s", pre, (int)n, m->topic);
    return;
  }
  const char *t = beam_msg_type_name(m->hdr.type);
  size_t i = 0;
  for (; t[i] && i + 1 < cap; i++)
    buf[i] = (char)tolower((unsigned char)t[i]);
  buf[i] = '\0';
}

int sub_is_stats_doc(const beam_msg_t *m) {
  static const char t[] = "beamd.stats";
  return m->topic && m->topic_len == sizeof t - 1 && !memcmp(m->topic, t, sizeof t - 1) &&
         m->hdr.dtype == BEAM_DT_U8 && m->hdr.ndim == 1;
}

static void report_json(const beam_msg_t *m, const void *data, const sub_vstats_t *vs,
                        int orphan) {
  const beam_hdr_t *h = &m->hdr;
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string(beam_msg_type_name(h->type)));
  json_object_set_new(o, "topic", m->topic ? json_stringn(m->topic, m->topic_len) : json_null());
  json_object_set_new(o, "series", json_integer((json_int_t)h->series_id));
  json_object_set_new(o, "frame", json_integer((json_int_t)h->frame_id));
  json_object_set_new(o, "seq", json_integer((json_int_t)h->seq));
  json_object_set_new(o, "flags", json_integer(h->flags));
  json_object_set_new(o, "stage_id", json_integer(h->stage_id));
  json_object_set_new(o, "t_acq_ns", json_integer((json_int_t)h->t_acq_ns));
  json_object_set_new(o, "t_send_ns", json_integer((json_int_t)h->t_send_ns));
  json_object_set_new(o, "dtype", json_string(beam_dtype_name((beam_dtype_t)h->dtype)));
  json_t *shape = json_array();
  for (unsigned i = 0; i < h->ndim; i++)
    json_array_append_new(shape, json_integer(h->shape[i]));
  json_object_set_new(o, "shape", shape);
  json_object_set_new(o, "codec", json_string(beam_codec_name((beam_codec_t)h->codec)));
  json_object_set_new(o, "payload_size", json_integer((json_int_t)h->payload_size));
  if (h->flags & BEAM_FLAG_POS)
    json_object_set_new(o, "pos", json_pack("[ooo]", jreal(h->pos[0]), jreal(h->pos[1]),
                                            jreal(h->pos[2])));
  if (orphan)
    json_object_set_new(o, "orphan", json_true());
  if (data && vs) {
    beam_dtype_t dt = (beam_dtype_t)h->dtype;
    json_object_set_new(o, "nelems", json_integer((json_int_t)vs->n));
    json_object_set_new(o, "min", jreal(vs->min));
    json_object_set_new(o, "max", jreal(vs->max));
    json_object_set_new(o, "mean", jreal(vs->mean));
    if (vs->is_int)
      json_object_set_new(o, "sum", jint128(vs->isum));
    else if (vs->is_complex)
      json_object_set_new(o, "sum", json_pack("[oo]", jreal(vs->dsum), jreal(vs->dsum_im)));
    else
      json_object_set_new(o, "sum", jreal(vs->dsum));
    if (vs->nonfinite)
      json_object_set_new(o, "nonfinite", json_integer((json_int_t)vs->nonfinite));
    if (sub_is_stats_doc(m)) {
      json_error_t err;
      json_t *doc = json_loadb(data, (size_t)vs->n, 0, &err);
      if (doc)
        json_object_set_new(o, "doc", doc);
      else
        json_object_set_new(o, "doc_error", json_string(err.text));
    } else if (vs->n <= SUB_JSON_VALUES_MAX) {
      json_t *vals = json_array();
      for (uint64_t i = 0; i < vs->n; i++)
        json_array_append_new(vals, jvalue(data, dt, i));
      json_object_set_new(o, "values", vals);
    }
  }
  if (m->meta) {
    json_error_t err;
    json_t *meta = json_loadb(m->meta, m->meta_len, JSON_DECODE_ANY, &err);
    if (meta)
      json_object_set_new(o, "meta", meta);
    else
      json_object_set_new(o, "meta_error", json_string(err.text));
  }
  json_dumpf(o, stdout, JSON_COMPACT | JSON_REAL_PRECISION(17));
  fputc('\n', stdout);
  json_decref(o);
}

static void print_value(const void *p, beam_dtype_t dt, uint64_t i) {
  if (dt_is_int(dt)) {
    int64_t v = get_i(p, dt, i);
    if (dt_is_unsigned(dt))
      printf("%llu", (unsigned long long)(uint64_t)v);
    else
      printf("%lld", (long long)v);
    return;
  }
  double im, re = get_d(p, dt, i, &im);
  if (dt_is_complex(dt))
    printf("%.6g%+.6gj", re, im);
  else
    printf("%.6g", re);
}

static void report_line(const beam_msg_t *m, const void *data, const sub_vstats_t *vs,
                        int orphan) {
  const beam_hdr_t *h = &m->hdr;
  printf("%s", beam_msg_type_name(h->type));
  if (m->topic)
    printf(" %.*s", (int)m->topic_len, m->topic);
  printf(" series=%llu frame=%llu seq=%llu", (unsigned long long)h->series_id,
         (unsigned long long)h->frame_id, (unsigned long long)h->seq);
  if (h->ndim) {
    printf(" %s[", beam_dtype_name((beam_dtype_t)h->dtype));
    for (unsigned i = 0; i < h->ndim; i++)
      printf(i ? "x%u" : "%u", h->shape[i]);
    printf("] %s", beam_codec_name((beam_codec_t)h->codec));
  }
  if (h->flags)
    printf(" flags=0x%x", h->flags);
  if (orphan)
    printf(" ORPHAN");
  if (data && vs) {
    beam_dtype_t dt = (beam_dtype_t)h->dtype;
    if (sub_is_stats_doc(m)) {
      printf(" doc=%.*s", (int)vs->n, (const char *)data);
    } else if (vs->n <= SUB_PRINT_VALUES_MAX) {
      printf(" values=[");
      for (uint64_t i = 0; i < vs->n; i++) {
        if (i)
          putchar(' ');
        print_value(data, dt, i);
      }
      putchar(']');
    } else {
      printf(" min=%.6g mean=%.6g max=%.6g", vs->min, vs->mean, vs->max);
    }
    if (vs->nonfinite)
      printf(" nonfinite=%llu", (unsigned long long)vs->nonfinite);
  }
  if (m->meta)
    printf(" meta=%.*s", (int)m->meta_len, m->meta);
  putchar('\n');
}

void sub_report(const beam_msg_t *m, const void *data, const sub_vstats_t *vs,
                int orphan, int json) {
  if (json)
    report_json(m, data, vs, orphan);
  else
    report_line(m, data, vs, orphan);
  fflush(stdout);
}

void sub_report_malformed(const char *why, size_t nparts, int json) {
  if (json) {
    json_t *o = json_pack("{s:s,s:s,s:I}", "type", "MALFORMED", "why", why ? why : "?",
                          "nparts", (json_int_t)nparts);
    json_dumpf(o, stdout, JSON_COMPACT);
    fputc('\n', stdout);
    json_decref(o);
  } else {
    printf("MALFORMED nparts=%zu why=%s\n", nparts, why ? why : "?");
  }
  fflush(stdout);
}
