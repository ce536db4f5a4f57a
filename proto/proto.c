/* beamd wire protocol v1: header encode/decode, multipart split, names.
 *
 * Pure functions over caller-owned bytes (see proto/proto.h and
 * proto/PROTOCOL.md). Every rejection names its reason with a static string
 * so a daemon can count and log it without formatting on the hot path.
 * Payload decompression lives in proto/codec.c, not here.
 */
#include "proto/proto.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "proto/err.h"
#include "proto/json_scan.h"

const beam_limits_t beam_limits_default = {
    .max_raw_bytes = (uint64_t)1 << 30,
    .max_dim = 65536,
    .max_meta_bytes = 16u << 20,
};

/* ---- little-endian field access (the wire is LE on every host) ---- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
         ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) {
  return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32);
}
static void wr16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void wr32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wrf64(uint8_t *p, double d) {
  uint64_t v;
  memcpy(&v, &d, sizeof v);
  wr64(p, v);
}
static double rdf64(const uint8_t *p) {
  uint64_t v = rd64(p);
  double d;
  memcpy(&d, &v, sizeof d);
  return d;
}

/* ---- names ---- */

static const struct {
  const char *name;
  size_t size;
} dtypes[BEAM_DT_COUNT_] = {
    [BEAM_DT_NONE] = {"none", 0},       [BEAM_DT_U8] = {"uint8", 1},
    [BEAM_DT_U16] = {"uint16", 2},      [BEAM_DT_U32] = {"uint32", 4},
    [BEAM_DT_U64] = {"uint64", 8},      [BEAM_DT_I8] = {"int8", 1},
    [BEAM_DT_I16] = {"int16", 2},       [BEAM_DT_I32] = {"int32", 4},
    [BEAM_DT_I64] = {"int64", 8},       [BEAM_DT_F32] = {"float32", 4},
    [BEAM_DT_F64] = {"float64", 8},     [BEAM_DT_C64] = {"complex64", 8},
    [BEAM_DT_C128] = {"complex128", 16},
};

size_t beam_dtype_size(beam_dtype_t dt) {
  return ((unsigned)dt < BEAM_DT_COUNT_) ? dtypes[dt].size : 0;
}

size_t beam_geom_bytes(beam_dtype_t dt, uint32_t ndim, const uint32_t *shape) {
  size_t n = beam_dtype_size(dt);
  for (uint32_t i = 0; i < ndim; i++)
    n *= shape[i];
  return n;
}

const char *beam_dtype_name(beam_dtype_t dt) {
  return ((unsigned)dt < BEAM_DT_COUNT_) ? dtypes[dt].name : "unknown";
}

beam_dtype_t beam_dtype_from_name(const char *name) {
  if (!name) return BEAM_DT_NONE;
  for (unsigned i = 1; i < BEAM_DT_COUNT_; i++)
    if (strcmp(name, dtypes[i].name) == 0) return (beam_dtype_t)i;
  return BEAM_DT_NONE;
}

const char *beam_msg_type_name(unsigned type) {
  switch (type) {
  case BEAM_MSG_SERIES_START: return "SERIES_START";
  case BEAM_MSG_FRAME: return "FRAME";
  case BEAM_MSG_SERIES_END: return "SERIES_END";
  case BEAM_MSG_RESULT: return "RESULT";
  default: return "UNKNOWN";
  }
}

const char *beam_codec_name(beam_codec_t c) {
  switch (c) {
  case BEAM_CODEC_RAW: return "raw";
  case BEAM_CODEC_LZ4: return "lz4";
  case BEAM_CODEC_BSLZ4: return "bslz4";
  case BEAM_CODEC_LZ4_BLOCK: return "lz4_block";
  case BEAM_CODEC_BSZSTD: return "bszstd";
  default: return "unknown";
  }
}

uint64_t beam_hdr_nelems(const beam_hdr_t *h) {
  if (!h || h->ndim == 0 || h->ndim > BEAM_MAX_NDIM) return 0;
  uint64_t n = 1;
  for (unsigned i = 0; i < h->ndim; i++) {
    /* Saturate instead of wrapping: callers compare against limits. */
    if (h->shape[i] != 0 && n > UINT64_MAX / h->shape[i]) return UINT64_MAX;
    n *= h->shape[i];
  }
  return n;
}

int beam_topic_valid(const char *t, size_t len) {
  if (!t || len == 0 || len > BEAM_TOPIC_MAX) return 0;
  for (size_t i = 0; i < len; i++) {
    char c = t[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '.' || c == '-'))
      return 0;
  }
  return 1;
}

/* ---- header ---- */

int beam_hdr_encode(const beam_hdr_t *h, uint8_t *out, size_t cap) {
  if (!h || !out || cap < BEAM_HDR_SIZE_V1) return BEAM_EINVAL;
  memset(out, 0, BEAM_HDR_SIZE_V1);
  out[0] = BEAM_MAGIC0;
  out[1] = BEAM_MAGIC1;
  out[2] = BEAM_MAGIC2;
  out[3] = BEAM_MAGIC3;
  out[4] = BEAM_PROTO_MAJOR;
  out[5] = BEAM_PROTO_MINOR;
  wr16(out + 6, BEAM_HDR_SIZE_V1);
  wr16(out + 8, h->type);
  wr32(out + 12, h->flags);
  wr64(out + 16, h->series_id);
  wr64(out + 24, h->frame_id);
  wr64(out + 32, h->seq);
  wr64(out + 40, h->t_acq_ns);
  wr64(out + 48, h->t_send_ns);
  out[56] = h->dtype;
  out[57] = h->ndim;
  out[58] = h->codec;
  out[59] = h->nparts;
  wr32(out + 60, h->stage_id);
  for (int i = 0; i < BEAM_MAX_NDIM; i++) wr32(out + 64 + 4 * i, h->shape[i]);
  wr64(out + 80, h->raw_size);
  wr64(out + 88, h->payload_size);
  for (int i = 0; i < 3; i++) wrf64(out + 96 + 8 * i, h->pos[i]);
  wr32(out + 120, h->meta_size);
  return (int)BEAM_HDR_SIZE_V1;
}

static int reject(const char **why, const char *reason) {
  if (why) *why = reason;
  return BEAM_EPROTO;
}

/* Static strings so a rejection never formats; the version table covers the
 * majors anyone is likely to meet, the rest share one message. */
static const char *major_reason(unsigned major) {
  static const char *const r[] = {
      "unsupported major version 0", NULL,
      "unsupported major version 2", "unsupported major version 3",
      "unsupported major version 4", "unsupported major version 5",
  };
  if (major < sizeof r / sizeof r[0] && r[major]) return r[major];
  return "unsupported major version (> 5)";
}

static const char *const shape_zero[BEAM_MAX_NDIM] = {
    "shape[0] = 0", "shape[1] = 0", "shape[2] = 0", "shape[3] = 0"};
static const char *const shape_big[BEAM_MAX_NDIM] = {
    "shape[0] > max_dim limit", "shape[1] > max_dim limit",
    "shape[2] > max_dim limit", "shape[3] > max_dim limit"};
static const char *const shape_unused[BEAM_MAX_NDIM] = {
    "shape[0] set beyond ndim", "shape[1] set beyond ndim",
    "shape[2] set beyond ndim", "shape[3] set beyond ndim"};

/* Geometry: shape, dtype and raw_size. The shape product is checked against
 * the byte limit step by step, so no product can overflow before the limit
 * stops it. */
static int check_geometry(const beam_hdr_t *h, const beam_limits_t *lim,
                          const char **why) {
  if (h->dtype >= BEAM_DT_COUNT_) return reject(why, "unknown dtype");
  if (h->ndim > BEAM_MAX_NDIM) return reject(why, "ndim > 4");
  for (unsigned i = h->ndim; i < BEAM_MAX_NDIM; i++)
    if (h->shape[i] != 0) return reject(why, shape_unused[i]);
  if (h->ndim == 0) {
    if (h->raw_size != 0) return reject(why, "raw_size set but ndim is 0");
    return 0;
  }
  if (h->dtype == BEAM_DT_NONE) return reject(why, "dtype none with ndim > 0");
  for (unsigned i = 0; i < h->ndim; i++) {
    if (h->shape[i] == 0) return reject(why, shape_zero[i]);
    if (h->shape[i] > lim->max_dim) return reject(why, shape_big[i]);
  }
  uint64_t bytes = beam_dtype_size((beam_dtype_t)h->dtype);
  for (unsigned i = 0; i < h->ndim; i++) {
    if (bytes > lim->max_raw_bytes / h->shape[i])
      return reject(why, "frame too large (limit max_raw_bytes)");
    bytes *= h->shape[i];
  }
  /* Series messages may leave raw_size at 0 while shape describes the frames. */
  int series = h->type == BEAM_MSG_SERIES_START || h->type == BEAM_MSG_SERIES_END;
  if (h->raw_size != bytes && !(series && h->raw_size == 0))
    return reject(why, "raw_size does not match shape x dtype");
  return 0;
}

static int check_payload(const beam_hdr_t *h, const char **why) {
  if (h->codec >= BEAM_CODEC_WIRE_COUNT_) return reject(why, "unknown codec");
  if (h->nparts > BEAM_MAX_PAYLOAD_PARTS)
    return reject(why, "nparts > 16 payload parts");
  if (h->nparts == 0) {
    int may_be_empty = h->type == BEAM_MSG_SERIES_START ||
                       h->type == BEAM_MSG_SERIES_END ||
                       (h->type == BEAM_MSG_FRAME && (h->flags & BEAM_FLAG_CORRUPT));
    if (!may_be_empty) return reject(why, "message type requires a payload");
    if (h->payload_size != 0) return reject(why, "payload_size set but nparts is 0");
    return 0;
  }
  if (h->raw_size == 0) return reject(why, "payload parts without an array");
  if (h->codec == BEAM_CODEC_RAW) {
    if (h->payload_size != h->raw_size)
      return reject(why, "raw codec: payload_size != raw_size");
    return 0;
  }
  if (h->nparts != 1) return reject(why, "compressed payload must be one part");
  size_t es = beam_dtype_size((beam_dtype_t)h->dtype);
  size_t bound = beam_codec_bound((beam_codec_t)h->codec, (size_t)h->raw_size, es);
  if (h->payload_size < 12) return reject(why, "compressed payload_size < 12");
  if (bound == 0 || h->payload_size > bound)
    return reject(why, "compressed payload_size exceeds the codec bound");
  return 0;
}

int beam_hdr_decode(const void *buf, size_t len, const beam_limits_t *lim,
                    beam_hdr_t *out, const char **why) {
  if (!lim) lim = &beam_limits_default;
  if (!buf || !out) return reject(why, "NULL header buffer");
  const uint8_t *p = buf;
  if (len < 8) return reject(why, "header part too short");
  if (p[0] != BEAM_MAGIC0 || p[1] != BEAM_MAGIC1 || p[2] != BEAM_MAGIC2 ||
      p[3] != BEAM_MAGIC3)
    return reject(why, "bad magic");
  if (p[4] != BEAM_PROTO_MAJOR) return reject(why, major_reason(p[4]));
  uint16_t hsz = rd16(p + 6);
  if (hsz < BEAM_HDR_SIZE_V1) return reject(why, "hdr_size < 128");
  if (hsz > BEAM_HDR_SIZE_MAX) return reject(why, "hdr_size > 4096");
  if (len != hsz) return reject(why, "header part length != hdr_size");

  beam_hdr_t h;
  memset(&h, 0, sizeof h);
  h.major = p[4];
  h.minor = p[5];
  h.hdr_size = hsz;
  h.type = rd16(p + 8);
  h.flags = rd32(p + 12);
  h.series_id = rd64(p + 16);
  h.frame_id = rd64(p + 24);
  h.seq = rd64(p + 32);
  h.t_acq_ns = rd64(p + 40);
  h.t_send_ns = rd64(p + 48);
  h.dtype = p[56];
  h.ndim = p[57];
  h.codec = p[58];
  h.nparts = p[59];
  h.stage_id = rd32(p + 60);
  for (int i = 0; i < BEAM_MAX_NDIM; i++) h.shape[i] = rd32(p + 64 + 4 * i);
  h.raw_size = rd64(p + 80);
  h.payload_size = rd64(p + 88);
  for (int i = 0; i < 3; i++) h.pos[i] = rdf64(p + 96 + 8 * i);
  h.meta_size = rd32(p + 120);
  /* Bytes 128..hsz belong to newer minors and are skipped. */

  if (h.type < BEAM_MSG_SERIES_START || h.type > BEAM_MSG_RESULT)
    return reject(why, "unknown message type");
  int rc = check_geometry(&h, lim, why);
  if (rc) return rc;
  rc = check_payload(&h, why);
  if (rc) return rc;
  if (h.flags & BEAM_FLAG_META) {
    if (h.meta_size == 0) return reject(why, "metadata flag set but meta_size is 0");
    if (h.meta_size > lim->max_meta_bytes)
      return reject(why, "metadata too large (limit max_meta_bytes)");
  } else if (h.meta_size != 0) {
    return reject(why, "meta_size set without metadata flag");
  }
  if ((h.flags & BEAM_FLAG_POS) &&
      !(isfinite(h.pos[0]) && isfinite(h.pos[1]) && isfinite(h.pos[2])))
    return reject(why, "scan position is not finite");
  *out = h;
  return 0;
}

/* ---- multipart ---- */

int beam_msg_parse(const beam_part_t *parts, size_t nparts,
                   const beam_limits_t *lim, beam_msg_t *out, const char **why) {
  if (!out) return reject(why, "NULL message");
  if (!parts || nparts == 0) return reject(why, "empty message");
  for (size_t i = 0; i < nparts; i++)
    if (!parts[i].data && parts[i].size) return reject(why, "part with NULL data");

  beam_msg_t m;
  memset(&m, 0, sizeof m);
  size_t at = 0;
  const uint8_t *first = parts[0].data;
  if (parts[0].size == 0) return reject(why, "empty first part");
  if (first[0] != BEAM_MAGIC0) {
    if (parts[0].size > BEAM_TOPIC_MAX) return reject(why, "topic longer than 64 bytes");
    if (!beam_topic_valid(parts[0].data, parts[0].size))
      return reject(why, "topic contains invalid characters");
    m.topic = parts[0].data;
    m.topic_len = parts[0].size;
    at = 1;
    if (nparts < 2) return reject(why, "topic without a header part");
  }
  int rc = beam_hdr_decode(parts[at].data, parts[at].size, lim, &m.hdr, why);
  if (rc) return rc;
  at++;
  if (m.hdr.type == BEAM_MSG_RESULT && !m.topic)
    return reject(why, "RESULT message without a topic");

  int has_meta = (m.hdr.flags & BEAM_FLAG_META) != 0;
  size_t have = nparts - at, want = (size_t)m.hdr.nparts + (size_t)has_meta;
  if (have != want) {
    if (has_meta && have == m.hdr.nparts)
      return reject(why, "metadata flag set but no metadata part");
    return reject(why, have < want ? "fewer parts than the header declares"
                                   : "more parts than the header declares");
  }
  uint64_t sum = 0;
  for (unsigned i = 0; i < m.hdr.nparts; i++) {
    const beam_part_t *pp = &parts[at + i];
    if (pp->size > m.hdr.payload_size - sum) return reject(why, "payload size mismatch");
    sum += pp->size;
    m.payload[i] = *pp;
  }
  if (sum != m.hdr.payload_size) return reject(why, "payload size mismatch");
  m.npayload = m.hdr.nparts;
  at += m.hdr.nparts;
  if (has_meta) {
    if (parts[at].size != m.hdr.meta_size)
      return reject(why, "metadata part size != meta_size");
    m.meta = parts[at].data;
    m.meta_len = parts[at].size;
  }
  *out = m;
  return 0;
}

int beam_meta_with_missing(const char *obj, uint64_t n, char *buf, size_t cap) {
  size_t len = obj ? strlen(obj) : 2;
  while (obj && len && (obj[len - 1] == ' ' || obj[len - 1] == '\n' || obj[len - 1] == '\t'))
    len--;
  if (obj && (len < 2 || obj[0] != '{' || obj[len - 1] != '}'))
    return -1;
  int empty = !obj || len == 2;
  int k = snprintf(buf, cap, "%.*s%s\"missing_frames\":%llu}", obj ? (int)(len - 1) : 1,
                   obj ? obj : "{", empty ? "" : ",", (unsigned long long)n);
  return k > 0 && (size_t)k < cap ? k : -1;
}

void beam_hdr_set_seq(uint8_t *hdr, uint64_t seq) {
  for (int i = 0; i < 8; i++) /* offset 32, little-endian (beam_hdr_encode) */
    hdr[32 + i] = (uint8_t)(seq >> (8 * i));
}

int beam_msg_missing_frames(const beam_msg_t *msg, uint64_t *n) {
  beam_js_t o, v;
  return (msg->hdr.flags & BEAM_FLAG_INCOMPLETE) && msg->meta &&
         beam_js_object(msg->meta, msg->meta_len, &o) == 0 &&
         beam_js_get(o, "missing_frames", &v) == 1 && beam_js_u64(v, n) == 0;
}
