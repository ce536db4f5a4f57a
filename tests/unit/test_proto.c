/* Unit tests for proto/proto.c: the v1 header byte layout, round trips,
 * every rejection reason of beam_hdr_decode and beam_msg_parse, and the
 * golden messages written by tools/python/beamd (tools/gen_golden.py), which
 * pin the C decoder to the Python encoder byte for byte.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/err.h"
#include "proto/proto.h"

/* ---- helpers ---- */

static beam_hdr_t frame_hdr(void) {
  beam_hdr_t h;
  memset(&h, 0, sizeof h);
  h.type = BEAM_MSG_FRAME;
  h.series_id = 42;
  h.frame_id = 7;
  h.seq = 1000;
  h.dtype = BEAM_DT_U16;
  h.ndim = 2;
  h.shape[0] = 4;
  h.shape[1] = 6;
  h.codec = BEAM_CODEC_RAW;
  h.nparts = 1;
  h.raw_size = 4 * 6 * 2;
  h.payload_size = h.raw_size;
  return h;
}

/* Encodes h, decodes it, and returns the reason (NULL when accepted). */
static const char *decode_reason(const beam_hdr_t *h, const beam_limits_t *lim) {
  uint8_t buf[BEAM_HDR_SIZE_V1];
  assert_int_equal(beam_hdr_encode(h, buf, sizeof buf), BEAM_HDR_SIZE_V1);
  beam_hdr_t out;
  const char *why = NULL;
  int rc = beam_hdr_decode(buf, sizeof buf, lim, &out, &why);
  if (rc == 0) return NULL;
  assert_int_equal(rc, BEAM_EPROTO);
  assert_non_null(why);
  return why;
}

#define EXPECT_REJECT(h, lim, reason)                                     \
  do {                                                                    \
    const char *why_ = decode_reason(&(h), (lim));                        \
    if (!why_ || strcmp(why_, (reason)) != 0)                             \
      fail_msg("expected \"%s\", got \"%s\"", (reason), why_ ? why_ : "accepted"); \
  } while (0)

static const char *raw_reason(const uint8_t *buf, size_t len) {
  beam_hdr_t out;
  const char *why = NULL;
  int rc = beam_hdr_decode(buf, len, NULL, &out, &why);
  return rc == 0 ? NULL : why;
}

static void expect_str(const char *got, const char *want) {
  if (!got || strcmp(got, want) != 0) fail_msg("expected \"%s\", got \"%s\"", want, got ? got : "(none)");
}

static uint8_t *load_file(const char *name, size_t *len) {
  const char *dir = getenv("BEAM_GOLDEN_DIR");
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/golden", name);
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("cannot open golden file %s (run from the repo root or set BEAM_GOLDEN_DIR)", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* Splits a .parts file (u32 LE length + bytes per part) into parts. */
static size_t split_parts(const uint8_t *b, size_t len, beam_part_t *parts, size_t max) {
  size_t n = 0, pos = 0;
  while (pos < len) {
    assert_true(len - pos >= 4);
    uint32_t l = (uint32_t)b[pos] | ((uint32_t)b[pos + 1] << 8) | ((uint32_t)b[pos + 2] << 16) |
                 ((uint32_t)b[pos + 3] << 24);
    pos += 4;
    assert_true(l <= len - pos);
    assert_true(n < max);
    parts[n].data = b + pos;
    parts[n].size = l;
    n++;
    pos += l;
  }
  return n;
}

/* ---- header layout and round trip ---- */

static void test_layout(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.flags = 0x12345678u;
  h.t_acq_ns = 0x0102030405060708ull;
  h.t_send_ns = 0x1112131415161718ull;
  h.stage_id = 0xA1B2C3D4u;
  h.pos[0] = 1.5;
  h.meta_size = 0x01020304u;
  h.major = 9; /* ignored: v1 is always written */
  uint8_t b[200];
  memset(b, 0xEE, sizeof b);
  assert_int_equal(beam_hdr_encode(&h, b, sizeof b), 128);
  assert_int_equal(b[128], 0xEE); /* nothing written past the header */
  assert_memory_equal(b, "\x89" "BMD", 4);
  assert_int_equal(b[4], 1);
  assert_int_equal(b[5], 0);
  assert_int_equal(b[6] | (b[7] << 8), 128);
  assert_int_equal(b[8] | (b[9] << 8), BEAM_MSG_FRAME);
  assert_int_equal(b[10] | b[11], 0);
  assert_memory_equal(b + 12, "\x78\x56\x34\x12", 4);
  assert_int_equal(b[16], 42);
  assert_int_equal(b[24], 7);
  assert_int_equal(b[32] | (b[33] << 8), 1000);
  assert_memory_equal(b + 40, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
  assert_int_equal(b[48], 0x18);
  assert_int_equal(b[56], BEAM_DT_U16);
  assert_int_equal(b[57], 2);
  assert_int_equal(b[58], BEAM_CODEC_RAW);
  assert_int_equal(b[59], 1);
  assert_memory_equal(b + 60, "\xD4\xC3\xB2\xA1", 4);
  assert_int_equal(b[64], 4);
  assert_int_equal(b[68], 6);
  assert_int_equal(b[72] | b[76], 0);
  assert_int_equal(b[80], 48);
  assert_int_equal(b[88], 48);
  assert_memory_equal(b + 96, "\x00\x00\x00\x00\x00\x00\xF8\x3F", 8); /* 1.5 LE */
  assert_memory_equal(b + 120, "\x04\x03\x02\x01", 4);
  assert_int_equal(b[124] | b[125] | b[126] | b[127], 0);
}

static void test_roundtrip(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.flags = BEAM_FLAG_POS | BEAM_FLAG_ANOMALY | (1u << 30); /* unknown bit kept */
  h.t_acq_ns = 123456789;
  h.t_send_ns = 987654321;
  h.stage_id = 5;
  h.pos[0] = -1e-6;
  h.pos[1] = 2.5e-3;
  h.pos[2] = 0.0;
  uint8_t b[128];
  assert_int_equal(beam_hdr_encode(&h, b, sizeof b), 128);
  beam_hdr_t o;
  const char *why = NULL;
  assert_int_equal(beam_hdr_decode(b, sizeof b, NULL, &o, &why), 0);
  assert_int_equal(o.major, 1);
  assert_int_equal(o.minor, 0);
  assert_int_equal(o.hdr_size, 128);
  assert_int_equal(o.type, h.type);
  assert_int_equal(o.flags, h.flags);
  assert_int_equal(o.series_id, 42);
  assert_int_equal(o.frame_id, 7);
  assert_int_equal(o.seq, 1000);
  assert_int_equal(o.t_acq_ns, 123456789);
  assert_int_equal(o.t_send_ns, 987654321);
  assert_int_equal(o.stage_id, 5);
  assert_int_equal(o.dtype, BEAM_DT_U16);
  assert_int_equal(o.ndim, 2);
  assert_int_equal(o.shape[0], 4);
  assert_int_equal(o.shape[1], 6);
  assert_int_equal(o.raw_size, 48);
  assert_true(o.pos[0] == -1e-6 && o.pos[1] == 2.5e-3 && o.pos[2] == 0.0);
  assert_int_equal(beam_hdr_encode(&h, b, 127), BEAM_EINVAL);
  assert_int_equal(beam_hdr_encode(NULL, b, 128), BEAM_EINVAL);
}

/* Every dtype and every ndim 1..4 round-trips through the header. */
static void test_roundtrip_dtypes_ndim(void **state) {
  (void)state;
  for (unsigned dt = 1; dt < BEAM_DT_COUNT_; dt++) {
    for (unsigned nd = 1; nd <= 4; nd++) {
      beam_hdr_t h = frame_hdr();
      h.dtype = (uint8_t)dt;
      h.ndim = (uint8_t)nd;
      memset(h.shape, 0, sizeof h.shape);
      uint64_t n = 1;
      for (unsigned i = 0; i < nd; i++) { h.shape[i] = 3 + i; n *= 3 + i; }
      h.raw_size = n * beam_dtype_size((beam_dtype_t)dt);
      h.payload_size = h.raw_size;
      assert_null(decode_reason(&h, NULL));
      assert_int_equal(beam_hdr_nelems(&h), n);
    }
  }
}

/* A newer minor with a longer header: accepted, the extra bytes skipped. */
static void test_longer_header(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  uint8_t b[256];
  memset(b, 0xAB, sizeof b);
  beam_hdr_encode(&h, b, sizeof b);
  b[5] = 3;  /* minor 3 */
  b[6] = 200; /* hdr_size 200 */
  beam_hdr_t o;
  const char *why = NULL;
  assert_int_equal(beam_hdr_decode(b, 200, NULL, &o, &why), 0);
  assert_int_equal(o.minor, 3);
  assert_int_equal(o.hdr_size, 200);
  assert_int_equal(o.raw_size, 48);
  expect_str(raw_reason(b, 128), "header part length != hdr_size");
  expect_str(raw_reason(b, 256), "header part length != hdr_size");
}

/* ---- rejection paths of beam_hdr_decode, one per reason ---- */

static void test_reject_bytes(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  uint8_t b[BEAM_HDR_SIZE_MAX + 8];
  beam_hdr_encode(&h, b, sizeof b);
  expect_str(raw_reason(b, 7), "header part too short");
  expect_str(raw_reason(b, 0), "header part too short");
  uint8_t c[128];
  memcpy(c, b, 128);
  c[1] = 'X';
  expect_str(raw_reason(c, 128), "bad magic");
  memcpy(c, b, 128);
  c[0] = 0x88;
  expect_str(raw_reason(c, 128), "bad magic");
  memcpy(c, b, 128);
  c[4] = 2;
  expect_str(raw_reason(c, 128), "unsupported major version 2");
  c[4] = 0;
  expect_str(raw_reason(c, 128), "unsupported major version 0");
  c[4] = 200;
  expect_str(raw_reason(c, 128), "unsupported major version (> 5)");
  memcpy(c, b, 128);
  c[6] = 127;
  expect_str(raw_reason(c, 128), "hdr_size < 128");
  memcpy(c, b, 128);
  c[6] = 0x01;
  c[7] = 0x10; /* 4097 */
  expect_str(raw_reason(c, 128), "hdr_size > 4096");
  expect_str(raw_reason(b, 100), "header part length != hdr_size");
  expect_str(raw_reason(b, 129), "header part length != hdr_size");
  beam_hdr_t o;
  const char *why = NULL;
  assert_int_equal(beam_hdr_decode(NULL, 128, NULL, &o, &why), BEAM_EPROTO);
  expect_str(why, "NULL header buffer");
}

static void test_reject_type(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.type = 0;
  EXPECT_REJECT(h, NULL, "unknown message type");
  h.type = 5;
  EXPECT_REJECT(h, NULL, "unknown message type");
  h.type = 0xFFFF;
  EXPECT_REJECT(h, NULL, "unknown message type");
}

static void test_reject_geometry(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.dtype = BEAM_DT_COUNT_;
  EXPECT_REJECT(h, NULL, "unknown dtype");
  h = frame_hdr();
  h.ndim = 5;
  EXPECT_REJECT(h, NULL, "ndim > 4");
  h = frame_hdr();
  h.shape[2] = 1;
  EXPECT_REJECT(h, NULL, "shape[2] set beyond ndim");
  h = frame_hdr();
  h.ndim = 3; h.shape[2] = 1; h.shape[3] = 9;
  EXPECT_REJECT(h, NULL, "shape[3] set beyond ndim");
  h = frame_hdr();
  h.dtype = BEAM_DT_NONE;
  EXPECT_REJECT(h, NULL, "dtype none with ndim > 0");
  h = frame_hdr();
  h.shape[0] = 0;
  EXPECT_REJECT(h, NULL, "shape[0] = 0");
  h = frame_hdr();
  h.shape[1] = 0;
  EXPECT_REJECT(h, NULL, "shape[1] = 0");
  h = frame_hdr();
  h.ndim = 4; h.shape[2] = 1; h.shape[3] = 0;
  EXPECT_REJECT(h, NULL, "shape[3] = 0");
  h = frame_hdr();
  h.shape[1] = 65537;
  EXPECT_REJECT(h, NULL, "shape[1] > max_dim limit");
  h = frame_hdr();
  h.shape[0] = 65537;
  EXPECT_REJECT(h, NULL, "shape[0] > max_dim limit");
  h = frame_hdr();
  h.raw_size = 47;
  h.payload_size = 47;
  EXPECT_REJECT(h, NULL, "raw_size does not match shape x dtype");
  h = frame_hdr();
  h.ndim = 0; h.shape[0] = h.shape[1] = 0;
  h.type = BEAM_MSG_SERIES_END;
  h.nparts = 0; h.payload_size = 0; h.raw_size = 8;
  EXPECT_REJECT(h, NULL, "raw_size set but ndim is 0");
}

/* The shape product must be stopped by the limit before it can overflow:
 * 4 x 65536 x 16 bytes is 2^68, far beyond 64 bits. */
static void test_reject_too_large(void **state) {
  (void)state;
  beam_limits_t lim = beam_limits_default;
  lim.max_raw_bytes = UINT64_MAX;
  lim.max_dim = UINT32_MAX;
  beam_hdr_t h = frame_hdr();
  h.dtype = BEAM_DT_C128;
  h.ndim = 4;
  for (int i = 0; i < 4; i++) h.shape[i] = UINT32_MAX;
  h.raw_size = 16; /* what a wrapped product could produce */
  h.payload_size = 16;
  EXPECT_REJECT(h, &lim, "frame too large (limit max_raw_bytes)");
  /* Default limit: 1 GiB. 16384 x 16384 x 4 bytes = 1 GiB is allowed, x8 is not. */
  h = frame_hdr();
  h.dtype = BEAM_DT_F32; h.shape[0] = 16384; h.shape[1] = 16384;
  h.raw_size = h.payload_size = (uint64_t)1 << 30;
  assert_null(decode_reason(&h, NULL));
  h.dtype = BEAM_DT_F64;
  h.raw_size = h.payload_size = (uint64_t)1 << 31;
  EXPECT_REJECT(h, NULL, "frame too large (limit max_raw_bytes)");
  /* A caller limit applies too. */
  lim = beam_limits_default;
  lim.max_raw_bytes = 47;
  h = frame_hdr();
  EXPECT_REJECT(h, &lim, "frame too large (limit max_raw_bytes)");
  lim.max_raw_bytes = 48;
  assert_null(decode_reason(&h, &lim));
  lim.max_dim = 5;
  EXPECT_REJECT(h, &lim, "shape[1] > max_dim limit");
}

static void test_reject_payload(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.codec = BEAM_CODEC_COUNT_;
  EXPECT_REJECT(h, NULL, "unknown codec");
  h = frame_hdr();
  h.nparts = 17;
  EXPECT_REJECT(h, NULL, "nparts > 16 payload parts");
  h = frame_hdr();
  h.nparts = 0; h.payload_size = 0;
  EXPECT_REJECT(h, NULL, "message type requires a payload");
  h.type = BEAM_MSG_RESULT;
  EXPECT_REJECT(h, NULL, "message type requires a payload");
  h.type = BEAM_MSG_FRAME;
  h.flags = BEAM_FLAG_CORRUPT;
  assert_null(decode_reason(&h, NULL));
  h.payload_size = 48;
  EXPECT_REJECT(h, NULL, "payload_size set but nparts is 0");
  h = frame_hdr();
  h.type = BEAM_MSG_SERIES_START;
  h.raw_size = 0; /* geometry only */
  EXPECT_REJECT(h, NULL, "payload parts without an array");
  h = frame_hdr();
  h.payload_size = 47;
  EXPECT_REJECT(h, NULL, "raw codec: payload_size != raw_size");
  h = frame_hdr();
  h.codec = BEAM_CODEC_LZ4;
  h.nparts = 2;
  h.payload_size = 30;
  EXPECT_REJECT(h, NULL, "compressed payload must be one part");
  h.nparts = 1;
  h.payload_size = 11;
  EXPECT_REJECT(h, NULL, "compressed payload_size < 12");
  h.payload_size = beam_codec_bound(BEAM_CODEC_LZ4, 48, 2);
  assert_null(decode_reason(&h, NULL));
  h.payload_size++;
  EXPECT_REJECT(h, NULL, "compressed payload_size exceeds the codec bound");
  h.codec = BEAM_CODEC_BSLZ4;
  h.payload_size = beam_codec_bound(BEAM_CODEC_BSLZ4, 48, 2) + 1;
  EXPECT_REJECT(h, NULL, "compressed payload_size exceeds the codec bound");
}

static void test_reject_meta_pos(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.flags = BEAM_FLAG_META;
  EXPECT_REJECT(h, NULL, "metadata flag set but meta_size is 0");
  h.meta_size = (16u << 20) + 1;
  EXPECT_REJECT(h, NULL, "metadata too large (limit max_meta_bytes)");
  h.meta_size = 16u << 20;
  assert_null(decode_reason(&h, NULL));
  h.flags = 0;
  EXPECT_REJECT(h, NULL, "meta_size set without metadata flag");
  h = frame_hdr();
  h.flags = BEAM_FLAG_POS;
  h.pos[1] = NAN;
  EXPECT_REJECT(h, NULL, "scan position is not finite");
  h.pos[1] = INFINITY;
  EXPECT_REJECT(h, NULL, "scan position is not finite");
  h.flags = 0; /* pos is ignored without the flag */
  assert_null(decode_reason(&h, NULL));
}

/* SERIES_START / SERIES_END may have no payload, with or without geometry. */
static void test_series_messages(void **state) {
  (void)state;
  beam_hdr_t h = frame_hdr();
  h.type = BEAM_MSG_SERIES_START;
  h.nparts = 0; h.payload_size = 0;
  assert_null(decode_reason(&h, NULL)); /* raw_size describes the frames */
  h.raw_size = 0;
  assert_null(decode_reason(&h, NULL)); /* or is 0 */
  h.raw_size = 40;
  EXPECT_REJECT(h, NULL, "raw_size does not match shape x dtype");
  memset(&h, 0, sizeof h);
  h.type = BEAM_MSG_SERIES_END;
  assert_null(decode_reason(&h, NULL));
  h.flags = BEAM_FLAG_ABORTED;
  assert_null(decode_reason(&h, NULL));
  h.type = BEAM_MSG_FRAME;
  EXPECT_REJECT(h, NULL, "message type requires a payload");
  /* SERIES_START may carry a payload (e.g. a mask). */
  h = frame_hdr();
  h.type = BEAM_MSG_SERIES_START;
  assert_null(decode_reason(&h, NULL));
}

/* ---- beam_msg_parse ---- */

typedef struct {
  uint8_t hdr[128];
  uint8_t payload[48];
  const char *meta;
  beam_part_t parts[8];
} msgbuf_t;

static size_t build(msgbuf_t *m, beam_hdr_t h, const char *topic, int meta) {
  size_t n = 0;
  m->meta = "{\"a\":1}";
  if (meta) { h.flags |= BEAM_FLAG_META; h.meta_size = (uint32_t)strlen(m->meta); }
  if (topic) m->parts[n++] = (beam_part_t){topic, strlen(topic), NULL};
  beam_hdr_encode(&h, m->hdr, sizeof m->hdr);
  m->parts[n++] = (beam_part_t){m->hdr, 128, NULL};
  for (unsigned i = 0; i < sizeof m->payload; i++) m->payload[i] = (uint8_t)i;
  if (h.nparts == 1) m->parts[n++] = (beam_part_t){m->payload, 48, NULL};
  if (h.nparts == 2) {
    m->parts[n++] = (beam_part_t){m->payload, 20, NULL};
    m->parts[n++] = (beam_part_t){m->payload + 20, 28, NULL};
  }
  if (meta) m->parts[n++] = (beam_part_t){m->meta, strlen(m->meta), NULL};
  return n;
}

static const char *parse_reason(const beam_part_t *p, size_t n) {
  beam_msg_t msg;
  const char *why = NULL;
  int rc = beam_msg_parse(p, n, NULL, &msg, &why);
  if (rc == 0) return NULL;
  assert_int_equal(rc, BEAM_EPROTO);
  return why;
}

static void test_parse_ok(void **state) {
  (void)state;
  msgbuf_t m;
  beam_hdr_t h = frame_hdr();
  h.nparts = 2;
  size_t n = build(&m, h, "corr.frames", 1);
  beam_msg_t msg;
  const char *why = NULL;
  assert_int_equal(beam_msg_parse(m.parts, n, NULL, &msg, &why), 0);
  assert_int_equal(msg.topic_len, 11);
  assert_memory_equal(msg.topic, "corr.frames", 11);
  assert_int_equal(msg.npayload, 2);
  assert_int_equal(msg.meta_len, 7);
  assert_memory_equal(msg.meta, "{\"a\":1}", 7);
  uint8_t out[48];
  assert_int_equal(beam_msg_payload(&msg, out, NULL, &why), 0);
  assert_memory_equal(out, m.payload, 48);
  /* no topic, no meta */
  n = build(&m, frame_hdr(), NULL, 0);
  assert_int_equal(beam_msg_parse(m.parts, n, NULL, &msg, &why), 0);
  assert_null(msg.topic);
  assert_null(msg.meta);
  assert_int_equal(msg.npayload, 1);
}

static void test_parse_reject(void **state) {
  (void)state;
  msgbuf_t m;
  beam_msg_t msg;
  const char *why = NULL;
  assert_int_equal(beam_msg_parse(NULL, 0, NULL, &msg, &why), BEAM_EPROTO);
  expect_str(why, "empty message");
  size_t n = build(&m, frame_hdr(), "abc", 0);
  assert_int_equal(beam_msg_parse(m.parts, n, NULL, NULL, &why), BEAM_EPROTO);
  expect_str(why, "NULL message");

  beam_part_t p[8];
  memcpy(p, m.parts, sizeof p);
  p[0].size = 0;
  expect_str(parse_reason(p, n), "empty first part");
  memcpy(p, m.parts, sizeof p);
  p[2].data = NULL;
  expect_str(parse_reason(p, n), "part with NULL data");
  p[0] = (beam_part_t){"Caps.topic", 10, NULL};
  memcpy(p + 1, m.parts + 1, sizeof(beam_part_t) * 2);
  expect_str(parse_reason(p, n), "topic contains invalid characters");
  p[0] = (beam_part_t){"a b", 3, NULL};
  expect_str(parse_reason(p, n), "topic contains invalid characters");
  static const char longt[] = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"; /* 65 */
  p[0] = (beam_part_t){longt, 65, NULL};
  expect_str(parse_reason(p, n), "topic longer than 64 bytes");
  p[0] = (beam_part_t){longt, 64, NULL};
  assert_null(parse_reason(p, n));
  expect_str(parse_reason(m.parts, 1), "topic without a header part");
  /* header errors surface unchanged */
  p[0] = m.parts[0];
  p[1] = (beam_part_t){"\x89" "BMX", 4, NULL};
  expect_str(parse_reason(p, 2), "header part too short");

  /* part counts */
  n = build(&m, frame_hdr(), NULL, 0);
  expect_str(parse_reason(m.parts, n - 1), "fewer parts than the header declares");
  memcpy(p, m.parts, sizeof p);
  p[n] = p[n - 1];
  expect_str(parse_reason(p, n + 1), "more parts than the header declares");
  n = build(&m, frame_hdr(), NULL, 1);
  expect_str(parse_reason(m.parts, n - 1), "metadata flag set but no metadata part");
  memcpy(p, m.parts, sizeof p);
  p[n - 1].size = 6;
  expect_str(parse_reason(p, n), "metadata part size != meta_size");

  /* payload sizes */
  beam_hdr_t h = frame_hdr();
  h.nparts = 2;
  n = build(&m, h, NULL, 0);
  memcpy(p, m.parts, sizeof p);
  p[1].size = 21;
  expect_str(parse_reason(p, n), "payload size mismatch");
  p[1].size = 19;
  expect_str(parse_reason(p, n), "payload size mismatch");
  p[1].size = SIZE_MAX; /* must not wrap the running sum */
  expect_str(parse_reason(p, n), "payload size mismatch");

  /* RESULT needs a topic */
  h = frame_hdr();
  h.type = BEAM_MSG_RESULT;
  n = build(&m, h, NULL, 0);
  expect_str(parse_reason(m.parts, n), "RESULT message without a topic");
  n = build(&m, h, "g2.g2", 0);
  assert_null(parse_reason(m.parts, n));
}

static void test_payload_errors(void **state) {
  (void)state;
  msgbuf_t m;
  beam_hdr_t h = frame_hdr();
  h.flags = BEAM_FLAG_CORRUPT;
  h.nparts = 0;
  h.payload_size = 0;
  size_t n = build(&m, h, NULL, 0);
  beam_msg_t msg;
  const char *why = NULL;
  assert_int_equal(beam_msg_parse(m.parts, n, NULL, &msg, &why), 0);
  uint8_t out[48];
  assert_int_equal(beam_msg_payload(&msg, out, NULL, &why), BEAM_EPROTO);
  expect_str(why, "message has no payload");
  assert_int_equal(beam_msg_payload(NULL, out, NULL, &why), BEAM_EINVAL);
}

/* ---- names, topics, limits ---- */

static void test_names(void **state) {
  (void)state;
  static const size_t sizes[] = {0, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8, 8, 16};
  for (unsigned dt = 0; dt < BEAM_DT_COUNT_; dt++) {
    assert_int_equal(beam_dtype_size((beam_dtype_t)dt), sizes[dt]);
    if (dt) assert_int_equal(beam_dtype_from_name(beam_dtype_name((beam_dtype_t)dt)), dt);
  }
  assert_string_equal(beam_dtype_name(BEAM_DT_U16), "uint16");
  assert_string_equal(beam_dtype_name(BEAM_DT_C64), "complex64");
  assert_string_equal(beam_dtype_name(BEAM_DT_COUNT_), "unknown");
  assert_int_equal(beam_dtype_size(BEAM_DT_COUNT_), 0);
  assert_int_equal(beam_dtype_from_name("float16"), BEAM_DT_NONE);
  assert_int_equal(beam_dtype_from_name(NULL), BEAM_DT_NONE);
  assert_string_equal(beam_msg_type_name(BEAM_MSG_SERIES_START), "SERIES_START");
  assert_string_equal(beam_msg_type_name(BEAM_MSG_FRAME), "FRAME");
  assert_string_equal(beam_msg_type_name(BEAM_MSG_SERIES_END), "SERIES_END");
  assert_string_equal(beam_msg_type_name(BEAM_MSG_RESULT), "RESULT");
  assert_string_equal(beam_msg_type_name(99), "UNKNOWN");
  assert_string_equal(beam_codec_name(BEAM_CODEC_RAW), "raw");
  assert_string_equal(beam_codec_name(BEAM_CODEC_LZ4), "lz4");
  assert_string_equal(beam_codec_name(BEAM_CODEC_BSLZ4), "bslz4");
  assert_string_equal(beam_codec_name(BEAM_CODEC_COUNT_), "unknown");
}

static void test_topics_limits(void **state) {
  (void)state;
  assert_true(beam_topic_valid("g2.g2", 5));
  assert_true(beam_topic_valid("beamd.series", 12));
  assert_true(beam_topic_valid("a-b_c.0", 7));
  assert_false(beam_topic_valid("", 0));
  assert_false(beam_topic_valid(NULL, 3));
  assert_false(beam_topic_valid("G2", 2));
  assert_false(beam_topic_valid("a/b", 3));
  assert_false(beam_topic_valid("a\0b", 3));
  char t[66];
  memset(t, 'x', sizeof t);
  assert_true(beam_topic_valid(t, 64));
  assert_false(beam_topic_valid(t, 65));
  assert_int_equal(beam_limits_default.max_raw_bytes, (uint64_t)1 << 30);
  assert_int_equal(beam_limits_default.max_dim, 65536);
  assert_int_equal(beam_limits_default.max_meta_bytes, 16u << 20);
  beam_hdr_t h = frame_hdr();
  assert_int_equal(beam_hdr_nelems(&h), 24);
  h.ndim = 0;
  assert_int_equal(beam_hdr_nelems(&h), 0);
  h.ndim = 4;
  for (int i = 0; i < 4; i++) h.shape[i] = UINT32_MAX;
  assert_int_equal(beam_hdr_nelems(&h), UINT64_MAX); /* saturates */
  assert_int_equal(beam_hdr_nelems(NULL), 0);
}

/* ---- golden messages from tools/gen_golden.py ---- */

typedef struct {
  const char *name, *topic, *raw;
  unsigned type, flags, dtype, ndim, codec, nparts;
  uint32_t shape[4];
  uint64_t frame_id, seq;
  int has_meta;
} golden_msg_t;

static const golden_msg_t goldens[] = {
    {"msg_series_start", NULL, NULL, BEAM_MSG_SERIES_START, BEAM_FLAG_META, BEAM_DT_U16, 3,
     BEAM_CODEC_RAW, 0, {1, 100, 97, 0}, 0, 10, 1},
    {"msg_frame_raw_u16", NULL, "bslz4_u16.raw.bin", BEAM_MSG_FRAME, 0, BEAM_DT_U16, 3,
     BEAM_CODEC_RAW, 2, {1, 100, 97, 0}, 0, 11, 0},
    {"msg_frame_bslz4_u16", NULL, "bslz4_u16.raw.bin", BEAM_MSG_FRAME, BEAM_FLAG_POS,
     BEAM_DT_U16, 3, BEAM_CODEC_BSLZ4, 1, {1, 100, 97, 0}, 1, 12, 0},
    {"msg_frame_corrupt", NULL, NULL, BEAM_MSG_FRAME, BEAM_FLAG_CORRUPT, BEAM_DT_U16, 3,
     BEAM_CODEC_RAW, 0, {1, 100, 97, 0}, 2, 13, 0},
    {"msg_result_lz4_f32", "g2.g2", "lz4_f32.raw.bin", BEAM_MSG_RESULT,
     BEAM_FLAG_META | BEAM_FLAG_FINAL, BEAM_DT_F32, 1, BEAM_CODEC_LZ4, 1, {1000, 0, 0, 0}, 2,
     14, 1},
    {"msg_series_end", NULL, NULL, BEAM_MSG_SERIES_END, 0, BEAM_DT_NONE, 0, BEAM_CODEC_RAW, 0,
     {0, 0, 0, 0}, 3, 15, 0},
};

static void test_golden_messages(void **state) {
  (void)state;
  for (size_t g = 0; g < sizeof goldens / sizeof goldens[0]; g++) {
    const golden_msg_t *e = &goldens[g];
    char fn[128];
    snprintf(fn, sizeof fn, "%s.parts", e->name);
    size_t len;
    uint8_t *b = load_file(fn, &len);
    beam_part_t parts[24];
    size_t n = split_parts(b, len, parts, 24);
    beam_msg_t msg;
    const char *why = NULL;
    if (beam_msg_parse(parts, n, NULL, &msg, &why) != 0) fail_msg("%s: %s", e->name, why);
    const beam_hdr_t *h = &msg.hdr;
    assert_int_equal(h->type, e->type);
    assert_int_equal(h->flags, e->flags);
    assert_int_equal(h->series_id, 7);
    assert_int_equal(h->frame_id, e->frame_id);
    assert_int_equal(h->seq, e->seq);
    assert_int_equal(h->t_acq_ns, 1700000000000000000ull);
    assert_int_equal(h->t_send_ns, 1700000000000500000ull);
    assert_int_equal(h->dtype, e->dtype);
    assert_int_equal(h->ndim, e->ndim);
    assert_int_equal(h->codec, e->codec);
    assert_int_equal(h->nparts, e->nparts);
    assert_memory_equal(h->shape, e->shape, sizeof e->shape);
    assert_int_equal(msg.meta != NULL, e->has_meta);
    if (e->topic) {
      assert_int_equal(msg.topic_len, strlen(e->topic));
      assert_memory_equal(msg.topic, e->topic, msg.topic_len);
    } else {
      assert_null(msg.topic);
    }
    if (e->flags & BEAM_FLAG_POS)
      assert_true(h->pos[0] == 1.5e-6 && h->pos[1] == -2.0e-6 && h->pos[2] == 0.0);
    if (e->raw) {
      size_t rlen;
      uint8_t *raw = load_file(e->raw, &rlen);
      assert_int_equal(rlen, h->raw_size);
      uint8_t *out = malloc(rlen), *scratch = malloc(rlen);
      if (beam_msg_payload(&msg, out, scratch, &why) != 0) fail_msg("%s: %s", e->name, why);
      assert_memory_equal(out, raw, rlen);
      free(out);
      free(scratch);
      free(raw);
    }
    /* Re-encoding the decoded header gives the golden header bytes. */
    uint8_t again[128];
    beam_hdr_encode(h, again, sizeof again);
    assert_memory_equal(again, parts[e->topic ? 1 : 0].data, 128);
    free(b);
  }
}

/* The loss count of an INCOMPLETE message, read only where PROTOCOL.md
 * puts it. */
static void test_missing_frames(void **state) {
  (void)state;
  beam_msg_t m;
  memset(&m, 0, sizeof m);
  uint64_t n = 0;
  const char *js = "{\"missing_frames\": 17, \"other\": 1}";
  m.meta = js;
  m.meta_len = strlen(js);
  assert_int_equal(beam_msg_missing_frames(&m, &n), 0); /* no INCOMPLETE flag */
  m.hdr.flags = BEAM_FLAG_INCOMPLETE;
  assert_int_equal(beam_msg_missing_frames(&m, &n), 1);
  assert_int_equal(n, 17);
  const char *bad[] = {"{\"missing_frames\": -3}", "{\"missing_frames\": 2.5}", "{\"other\": 4}",
                       "[17]", "{\"missing_frames\": 17", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    m.meta = bad[i];
    m.meta_len = strlen(bad[i]);
    assert_int_equal(beam_msg_missing_frames(&m, &n), 0);
  }
  m.meta = NULL;
  m.meta_len = 0;
  assert_int_equal(beam_msg_missing_frames(&m, &n), 0);
}

/* What beam_meta_with_missing writes, beam_msg_missing_frames reads back;
 * the rest of the object is kept as it was. */
static void test_meta_with_missing(void **state) {
  (void)state;
  char buf[128];
  const char *objs[] = {NULL, "{}", "{\"stage\":\"vd\",\"shape\":[3]}", "{\"a\":1} \n"};
  const char *want[] = {"{\"missing_frames\":9}", "{\"missing_frames\":9}",
                        "{\"stage\":\"vd\",\"shape\":[3],\"missing_frames\":9}",
                        "{\"a\":1,\"missing_frames\":9}"};
  for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) {
    int k = beam_meta_with_missing(objs[i], 9, buf, sizeof buf);
    assert_int_equal(k, (int)strlen(want[i]));
    assert_string_equal(buf, want[i]);
    beam_msg_t m;
    memset(&m, 0, sizeof m);
    m.hdr.flags = BEAM_FLAG_INCOMPLETE;
    m.meta = buf;
    m.meta_len = (size_t)k;
    uint64_t n = 0;
    assert_int_equal(beam_msg_missing_frames(&m, &n), 1);
    assert_int_equal(n, 9);
  }
  assert_int_equal(beam_meta_with_missing("[1]", 9, buf, sizeof buf), -1);
  assert_int_equal(beam_meta_with_missing("", 9, buf, sizeof buf), -1);
  assert_int_equal(beam_meta_with_missing("{}", 9, buf, 10), -1); /* does not fit */
  /* The sequence number set after encoding is the one decoded. */
  beam_hdr_t h = {0}, back;
  h.type = BEAM_MSG_SERIES_END;
  h.series_id = 5;
  uint8_t enc[BEAM_HDR_SIZE_V1];
  assert_int_equal(beam_hdr_encode(&h, enc, sizeof enc), (int)BEAM_HDR_SIZE_V1);
  beam_hdr_set_seq(enc, 0x0102030405060708ull);
  const char *why = NULL;
  assert_int_equal(beam_hdr_decode(enc, sizeof enc, &beam_limits_default, &back, &why), 0);
  assert_true(back.seq == 0x0102030405060708ull && back.series_id == 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_roundtrip_dtypes_ndim),
      cmocka_unit_test(test_longer_header),
      cmocka_unit_test(test_reject_bytes),
      cmocka_unit_test(test_reject_type),
      cmocka_unit_test(test_reject_geometry),
      cmocka_unit_test(test_reject_too_large),
      cmocka_unit_test(test_reject_payload),
      cmocka_unit_test(test_reject_meta_pos),
      cmocka_unit_test(test_series_messages),
      cmocka_unit_test(test_parse_ok),
      cmocka_unit_test(test_parse_reject),
      cmocka_unit_test(test_payload_errors),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_topics_limits),
      cmocka_unit_test(test_golden_messages),
      cmocka_unit_test(test_missing_frames),
      cmocka_unit_test(test_meta_with_missing),
  };
  return beam_run_tests(tests, NULL, NULL);
}
