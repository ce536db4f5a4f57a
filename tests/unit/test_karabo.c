/* Unit tests for proto/karabo.c: 2.2 messages packed with the encoder
 * pieces (and by hand with msgpack_packer where a test needs a field
 * missing or wrong) decoded back; the C++ client's rules (odd part count,
 * no content, no metadata, array keys, dtype names, size); 1.0 messages;
 * the bounds walk that runs before msgpack-c; module sources stacked into
 * one frame (proto/karabo_stack.c); every prefix of a valid
 * header part refused, never read past (each part is copied into a heap
 * block of its exact size so ASan sees a read one byte past the end).
 *
 * KB_SEED_DIR=dir writes valid and invalid messages as fuzz seeds
 * (karabo_*.parts, the layout of tests/fuzz/parts.h) into dir.
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

#include <msgpack.h>

#include "proto/err.h"
#include "proto/karabo.h"
#include "proto/karabo_stack.h"

#define MAXP 16

/* A message under construction: each part its own sbuffer. */
typedef struct msg_s {
  msgpack_sbuffer sb[MAXP];
  void *copy[MAXP];
  beam_part_t parts[MAXP];
  size_t n;
} msg_t;

static msgpack_packer *part(msg_t *m, msgpack_packer *pk) {
  msgpack_sbuffer_init(&m->sb[m->n]);
  msgpack_packer_init(pk, &m->sb[m->n], msgpack_sbuffer_write);
  m->n++;
  return pk;
}

static void raw_part(msg_t *m, const void *p, size_t n) {
  msgpack_sbuffer_init(&m->sb[m->n]);
  if (n) /* an empty part: msgpack-c would memcpy to its NULL buffer */
    msgpack_sbuffer_write(&m->sb[m->n], p, n);
  m->n++;
}

/* Exact-size heap copies of every part. */
static const beam_part_t *seal(msg_t *m) {
  for (size_t i = 0; i < m->n; i++) {
    size_t n = m->sb[i].size;
    m->copy[i] = malloc(n ? n : 1);
    if (n)
      memcpy(m->copy[i], m->sb[i].data, n);
    m->parts[i] = (beam_part_t){m->copy[i], n, NULL};
  }
  return m->parts;
}

static void done(msg_t *m) {
  for (size_t i = 0; i < m->n; i++) {
    msgpack_sbuffer_destroy(&m->sb[i]);
    free(m->copy[i]);
    m->copy[i] = NULL;
  }
  m->n = 0;
}

static void seed(msg_t *m, const char *name) {
  const char *dir = getenv("KB_SEED_DIR");
  if (!dir)
    return;
  char path[512];
  snprintf(path, sizeof path, "%s/karabo_%s.parts", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  for (size_t i = 0; i < m->n; i++) {
    uint32_t n = (uint32_t)m->sb[i].size;
    uint8_t le[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
    fwrite(le, 1, 4, f);
    if (n)
      fwrite(m->sb[i].data, 1, n, f);
  }
  fclose(f);
}

static void str(msgpack_packer *pk, const char *s) { assert_int_equal(beam_kb_pack_str(pk, s), 0); }

static uint16_t PIX[2 * 3 * 4];

/* A valid 2.2 train: source "det" (data map {"a": 7}) with image.data
 * uint16 (2, 3, 4), and source "aaa" with a float64 (2,) array. */
static void train(msg_t *m, uint64_t tid) {
  msgpack_packer pk;
  beam_kb_time_t t = {1700000000, 250000000000000000ull};
  uint32_t sh[3] = {2, 3, 4}, sh2[1] = {2};
  static double d2[2] = {1.5, -2};
  for (int i = 0; i < 24; i++)
    PIX[i] = (uint16_t)(i * 1000 + 7);
  assert_int_equal(beam_kb_pack_source_header(part(m, &pk), "aaa", t, tid), 0);
  msgpack_pack_map(part(m, &pk), 0);
  assert_int_equal(beam_kb_pack_array_header(part(m, &pk), "aaa", "x.y", BEAM_DT_F64, 1, sh2), 0);
  raw_part(m, d2, sizeof d2);
  assert_int_equal(beam_kb_pack_source_header(part(m, &pk), "det", t, tid), 0);
  part(m, &pk);
  msgpack_pack_map(&pk, 1);
  str(&pk, "a");
  msgpack_pack_int(&pk, 7);
  assert_int_equal(
      beam_kb_pack_array_header(part(m, &pk), "det", "image.data", BEAM_DT_U16, 3, sh), 0);
  raw_part(m, PIX, sizeof PIX);
}

static void test_roundtrip(void **st) {
  (void)st;
  msg_t m = {0};
  train(&m, 123456789);
  seed(&m, "train22");
  static beam_kb_msg_t k;
  const char *why = NULL;
  const beam_part_t *p = seal(&m);
  assert_int_equal(beam_kb_detect(p, m.n), 2);
  assert_int_equal(beam_kb_parse(p, m.n, &k, &why), 0);
  assert_int_equal(k.version, 2);
  assert_int_equal(k.nsources, 2);
  assert_int_equal(k.narrays, 2);
  const beam_kb_source_t *s = beam_kb_source(&k, "det", 3);
  assert_non_null(s);
  assert_true(s->has_meta && s->has_tid && s->has_time);
  assert_int_equal(s->tid, 123456789);
  assert_int_equal(s->sec, 1700000000);
  assert_int_equal(s->frac_as, 250000000000000000ull);
  assert_ptr_equal(s->data, p[5].data);
  const beam_kb_array_t *a = beam_kb_array(&k, (unsigned)(s - k.src), "image.data", 10);
  assert_non_null(a);
  assert_int_equal(a->dtype, BEAM_DT_U16);
  assert_int_equal(a->ndim, 3);
  assert_int_equal(a->shape[0], 2);
  assert_int_equal(a->shape[2], 4);
  assert_ptr_equal(a->data, p[7].data); /* borrowed, not copied */
  assert_int_equal(a->size, sizeof PIX);
  assert_int_equal(a->part, 7);
  assert_memory_equal(a->data, PIX, sizeof PIX);
  assert_null(beam_kb_array(&k, 0, "image.data", 10));
  assert_null(beam_kb_source(&k, "nope", 4));
  /* The headers the encoder wrote are one msgpack item each. */
  for (size_t i = 0; i < m.n; i += 2)
    assert_int_equal(beam_kb_msgpack_check(p[i].data, p[i].size), 0);
  done(&m);
}

/* The encoder's metadata as msgpack-c reads it back. */
static void test_encoder_fields(void **st) {
  (void)st;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  beam_kb_time_t t = beam_kb_time_from_ns(1700000000123456789ull);
  assert_int_equal(t.sec, 1700000000);
  assert_int_equal(t.frac_as, 123456789000000000ull);
  assert_int_equal(beam_kb_pack_source_header(&pk, "beamd/x", t, 42), 0);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, &off), MSGPACK_UNPACK_SUCCESS);
  const msgpack_object *md = NULL;
  for (uint32_t i = 0; i < u.data.via.map.size; i++)
    if (u.data.via.map.ptr[i].key.via.str.size == 8 &&
        !memcmp(u.data.via.map.ptr[i].key.via.str.ptr, "metadata", 8))
      md = &u.data.via.map.ptr[i].val;
  assert_non_null(md);
  int seen = 0;
  for (uint32_t i = 0; i < md->via.map.size; i++) {
    const msgpack_object_kv *kv = &md->via.map.ptr[i];
    assert_int_equal(kv->key.type, MSGPACK_OBJECT_STR); /* use_bin_type: text is str */
    char key[32] = {0};
    memcpy(key, kv->key.via.str.ptr, kv->key.via.str.size);
    if (!strcmp(key, "timestamp.frac")) {
      assert_int_equal(kv->val.type, MSGPACK_OBJECT_STR);
      assert_int_equal(kv->val.via.str.size, 18);
      assert_memory_equal(kv->val.via.str.ptr, "123456789000000000", 18);
      seen++;
    } else if (!strcmp(key, "timestamp.sec")) {
      assert_memory_equal(kv->val.via.str.ptr, "1700000000", 10);
      seen++;
    } else if (!strcmp(key, "timestamp.tid")) {
      assert_int_equal(kv->val.via.u64, 42);
      seen++;
    } else if (!strcmp(key, "timestamp")) {
      assert_true(kv->val.type == MSGPACK_OBJECT_FLOAT64);
      assert_true(kv->val.via.f64 > 1700000000.12 && kv->val.via.f64 < 1700000000.13);
      seen++;
    }
  }
  assert_int_equal(seen, 4);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_clear(&sb);
  uint32_t sh[1] = {1};
  assert_int_equal(beam_kb_pack_array_header(&pk, "s", "p", BEAM_DT_NONE, 1, sh), BEAM_EINVAL);
  msgpack_sbuffer_destroy(&sb);
}

/* A header map with the given keys; skip names the one left out. */
static void header(msg_t *m, const char *content, const char *skip, const char *dtype,
                   const uint32_t *shape, unsigned ndim) {
  msgpack_packer pk;
  part(m, &pk);
  int n = 0;
  const char *keys[] = {"source", "content", "metadata", "path", "dtype", "shape"};
  int want[6] = {1, 1, !strcmp(content, "msgpack"), strcmp(content, "msgpack") != 0,
                 strcmp(content, "msgpack") != 0, strcmp(content, "msgpack") != 0};
  for (int i = 0; i < 6; i++) {
    if (skip && !strcmp(skip, keys[i]))
      want[i] = 0;
    n += want[i];
  }
  msgpack_pack_map(&pk, (size_t)n);
  if (want[0]) { str(&pk, "source"); str(&pk, "det"); }
  if (want[1]) { str(&pk, "content"); str(&pk, content); }
  if (want[2]) {
    str(&pk, "metadata");
    msgpack_pack_map(&pk, 1);
    str(&pk, "timestamp.tid");
    msgpack_pack_uint64(&pk, 5);
  }
  if (want[3]) { str(&pk, "path"); str(&pk, "image.data"); }
  if (want[4]) { str(&pk, "dtype"); str(&pk, dtype); }
  if (want[5]) {
    str(&pk, "shape");
    msgpack_pack_array(&pk, ndim);
    for (unsigned i = 0; i < ndim; i++)
      msgpack_pack_uint32(&pk, shape[i]);
  }
}

static int parse_rc(msg_t *m, const char *seedname, const char **why) {
  static beam_kb_msg_t k;
  if (seedname)
    seed(m, seedname);
  int rc = beam_kb_parse(seal(m), m->n, &k, why);
  if (rc < 0)
    assert_int_equal(k.nsources, 0);
  done(m);
  return rc;
}

static void data_map(msg_t *m) {
  msgpack_packer pk;
  msgpack_pack_map(part(m, &pk), 0);
}

static void test_cpp_rules(void **st) {
  (void)st;
  msg_t m = {0};
  const char *why = NULL;
  uint32_t sh[2] = {3, 4};
  static uint8_t px[24];
  /* odd part count */
  train(&m, 1);
  msgpack_sbuffer_destroy(&m.sb[--m.n]);
  assert_int_equal(parse_rc(&m, "odd", &why), BEAM_EPROTO);
  assert_non_null(strstr(why, "odd number of parts"));
  /* every header needs content */
  header(&m, "msgpack", "content", NULL, NULL, 0);
  data_map(&m);
  assert_int_equal(parse_rc(&m, "no_content", &why), BEAM_EPROTO);
  assert_non_null(strstr(why, "without content"));
  /* a msgpack header must carry metadata */
  header(&m, "msgpack", "metadata", NULL, NULL, 0);
  data_map(&m);
  assert_int_equal(parse_rc(&m, "no_metadata", &why), BEAM_EPROTO);
  assert_non_null(strstr(why, "without metadata"));
  /* array: shape, dtype, path */
  const char *need[] = {"shape", "dtype", "path", "source"};
  for (int i = 0; i < 4; i++) {
    header(&m, "array", need[i], "uint16", sh, 2);
    raw_part(&m, px, 24);
    assert_int_equal(parse_rc(&m, NULL, &why), BEAM_EPROTO);
    assert_non_null(strstr(why, need[i]));
  }
  /* a known numpy name */
  header(&m, "array", NULL, "float16", sh, 2);
  raw_part(&m, px, 24);
  assert_int_equal(parse_rc(&m, "bad_dtype", &why), BEAM_ENOTSUP);
  assert_non_null(strstr(why, "dtype"));
  header(&m, "array", NULL, "<u2", sh, 2);
  raw_part(&m, px, 24);
  assert_int_equal(parse_rc(&m, NULL, &why), BEAM_ENOTSUP);
  /* shape x itemsize == data bytes */
  header(&m, "array", NULL, "uint16", sh, 2);
  raw_part(&m, px, 23);
  assert_int_equal(parse_rc(&m, "short", &why), BEAM_ESHAPE);
  header(&m, "array", NULL, "uint8", sh, 2);
  raw_part(&m, px, 24);
  assert_int_equal(parse_rc(&m, NULL, &why), BEAM_ESHAPE);
  header(&m, "array", NULL, "uint8", sh, 2);
  raw_part(&m, px, 12);
  assert_int_equal(parse_rc(&m, "array_only", &why), 0); /* no msgpack header: allowed */
  /* unknown content; the data of a msgpack header must be a map */
  header(&m, "pickle", NULL, "uint8", sh, 2);
  raw_part(&m, px, 12);
  assert_int_equal(parse_rc(&m, NULL, &why), BEAM_ENOTSUP);
  header(&m, "msgpack", NULL, NULL, NULL, 0);
  raw_part(&m, "\x92\x01\x02", 3);
  assert_int_equal(parse_rc(&m, NULL, &why), BEAM_EPROTO);
  /* a dimension product that overflows */
  {
    msgpack_packer pk;
    part(&m, &pk);
    msgpack_pack_map(&pk, 5);
    str(&pk, "source"); str(&pk, "s");
    str(&pk, "content"); str(&pk, "array");
    str(&pk, "path"); str(&pk, "p");
    str(&pk, "dtype"); str(&pk, "uint64");
    str(&pk, "shape");
    msgpack_pack_array(&pk, 3);
    for (int i = 0; i < 3; i++)
      msgpack_pack_uint64(&pk, 1ull << 40);
    raw_part(&m, px, 8);
    assert_int_equal(parse_rc(&m, NULL, &why), BEAM_ESHAPE);
  }
  /* garbage and an empty message */
  raw_part(&m, "\xc1", 1);
  raw_part(&m, "", 0);
  assert_int_equal(parse_rc(&m, "garbage", &why), BEAM_EPROTO);
  static beam_kb_msg_t k;
  assert_int_equal(beam_kb_parse(NULL, 0, &k, &why), BEAM_EPROTO);
}

/* Each prefix of a header part is refused, never read past. */
static void test_prefixes(void **st) {
  (void)st;
  msg_t m = {0};
  train(&m, 9);
  size_t n = m.sb[6].size;
  char *full = malloc(n);
  memcpy(full, m.sb[6].data, n);
  done(&m);
  for (size_t len = 0; len < n; len++) {
    msg_t p = {0};
    raw_part(&p, full, len);
    raw_part(&p, PIX, sizeof PIX);
    const char *why = NULL;
    assert_true(parse_rc(&p, NULL, &why) < 0);
  }
  free(full);
}

static void test_msgpack_check(void **st) {
  (void)st;
  /* an array claiming 2^32-1 elements in 5 bytes: refused before msgpack-c */
  assert_int_equal(beam_kb_msgpack_check("\xdd\xff\xff\xff\xff", 5), -1);
  assert_int_equal(beam_kb_msgpack_check("\xdf\x00\x00\x00\x01\x01", 6), -1); /* map: 2 items */
  assert_int_equal(beam_kb_msgpack_check("\xdf\x00\x00\x00\x01\x01\x02", 7), 0);
  assert_int_equal(beam_kb_msgpack_check("\xc6\xff\xff\xff\xff", 5), -1); /* bin32 past end */
  assert_int_equal(beam_kb_msgpack_check("\x01\x02", 2), -1);             /* two items */
  assert_int_equal(beam_kb_msgpack_check("\xc1", 1), -1);
  assert_int_equal(beam_kb_msgpack_check("", 0), -1);
  assert_int_equal(beam_kb_msgpack_check("\xd8\x01" "0123456789abcdef", 18), 0); /* fixext16 */
  assert_int_equal(beam_kb_msgpack_check("\xcb" "1234567", 8), -1);
  char deep[64];
  memset(deep, 0x91, sizeof deep); /* 63 nested arrays of one, then nil */
  deep[63] = (char)0xc0;
  assert_int_equal(beam_kb_msgpack_check(deep, 64), 0);
  msg_t m = {0};
  raw_part(&m, deep, 64); /* deeper than msgpack-c's stack: refused, not a crash */
  raw_part(&m, "", 0);
  const char *why = NULL;
  assert_int_equal(parse_rc(&m, "deep", &why), BEAM_EPROTO);
  raw_part(&m, "\xdd\xff\xff\xff\xff", 5);
  raw_part(&m, "", 0);
  assert_int_equal(parse_rc(&m, "huge_count", &why), BEAM_EPROTO);
}

static void test_protocol_10(void **st) {
  (void)st;
  msg_t m = {0};
  msgpack_packer pk;
  static const uint16_t px[6] = {1, 2, 3, 4, 5, 6};
  part(&m, &pk);
  msgpack_pack_map(&pk, 1);
  str(&pk, "SPB/DET:xtdf");
  msgpack_pack_map(&pk, 3);
  str(&pk, "metadata");
  msgpack_pack_map(&pk, 3);
  str(&pk, "timestamp.tid");
  msgpack_pack_uint64(&pk, 77);
  str(&pk, "timestamp.sec");
  str(&pk, "12");
  str(&pk, "timestamp.frac");
  str(&pk, "5");
  str(&pk, "image.data");
  msgpack_pack_map(&pk, 5); /* msgpack-numpy, keys as bytes */
  msgpack_pack_bin(&pk, 2); msgpack_pack_bin_body(&pk, "nd", 2);
  msgpack_pack_true(&pk);
  msgpack_pack_bin(&pk, 4); msgpack_pack_bin_body(&pk, "type", 4);
  str(&pk, "<u2");
  msgpack_pack_bin(&pk, 4); msgpack_pack_bin_body(&pk, "kind", 4);
  msgpack_pack_bin(&pk, 0);
  msgpack_pack_bin(&pk, 5); msgpack_pack_bin_body(&pk, "shape", 5);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_uint32(&pk, 2);
  msgpack_pack_uint32(&pk, 3);
  msgpack_pack_bin(&pk, 4); msgpack_pack_bin_body(&pk, "data", 4);
  msgpack_pack_bin(&pk, sizeof px);
  msgpack_pack_bin_body(&pk, px, sizeof px);
  str(&pk, "other");
  msgpack_pack_int(&pk, 3);
  seed(&m, "train10");
  static beam_kb_msg_t k;
  const char *why = NULL;
  const beam_part_t *p = seal(&m);
  assert_int_equal(beam_kb_detect(p, 1), 1);
  assert_int_equal(beam_kb_parse(p, 1, &k, &why), 0);
  assert_int_equal(k.version, 1);
  assert_int_equal(k.nsources, 1);
  assert_int_equal(k.src[0].tid, 77);
  assert_int_equal(k.src[0].sec, 12);
  assert_int_equal(k.src[0].frac_as, 500000000000000000ull); /* ".5" */
  const beam_kb_array_t *a = beam_kb_array(&k, 0, "image.data", 10);
  assert_non_null(a);
  assert_int_equal(a->dtype, BEAM_DT_U16);
  assert_int_equal(a->ndim, 2);
  assert_memory_equal(a->data, px, sizeof px);
  assert_true((const char *)a->data > (const char *)p[0].data &&
              (const char *)a->data + a->size <= (const char *)p[0].data + p[0].size);
  done(&m);
  assert_int_equal(beam_kb_typestr_dtype("<f4", 3), BEAM_DT_F32);
  assert_int_equal(beam_kb_typestr_dtype("|u1", 3), BEAM_DT_U8);
  assert_int_equal(beam_kb_typestr_dtype("<c16", 4), BEAM_DT_C128);
  assert_int_equal(beam_kb_typestr_dtype(">u2", 3), BEAM_DT_NONE);
  assert_int_equal(beam_kb_typestr_dtype("<f2", 3), BEAM_DT_NONE);
  assert_int_equal(beam_kb_typestr_dtype("<u", 2), BEAM_DT_NONE);
}

/* Module numbers come from where the pattern's first wildcard is, so the
 * digits of "AGIPD1M-1" never count. */
static void test_module_number(void **st) {
  (void)st;
  const char *pat = "SPB_DET_AGIPD1M-1/DET/*CH0:xtdf";
#define NUM(p, n) beam_kb_module_number(p, n, strlen(n))
  assert_true(beam_kb_is_pattern(pat));
  assert_false(beam_kb_is_pattern("SPB_DET_AGIPD1M-1/CAL/APPEND_CORRECTED"));
  assert_false(beam_kb_is_pattern(NULL));
  assert_int_equal(NUM(pat, "SPB_DET_AGIPD1M-1/DET/0CH0:xtdf"), 0);
  assert_int_equal(NUM(pat, "SPB_DET_AGIPD1M-1/DET/15CH0:xtdf"), 15);
  assert_int_equal(NUM(pat, "SPB_DET_AGIPD1M-1/DET/15CH0:output"), -1); /* no match */
  assert_int_equal(NUM(pat, "SPB_DET_AGIPD1M-1/DET/xCH0:xtdf"), -1);    /* no digits */
  assert_int_equal(NUM(pat, "SPB_DET_AGIPD1M-1/DET/9999999CH0:xtdf"), -1);
  assert_int_equal(NUM("FXE_XAD_JF1M/DET/JNGFR*:daqOutput", "FXE_XAD_JF1M/DET/JNGFR02:daqOutput"),
                   2);
  assert_int_equal(NUM("M[0-9]", "M7"), 7);
  assert_int_equal(NUM("M?", "M"), -1);
  /* Not NUL-terminated: only n bytes are the name. */
  assert_int_equal(beam_kb_module_number("D/*", "D/3xyz", 3), 3);
#undef NUM
}

/* Two modules of 3 pulses x 4 pixels, from either layout, land pulse-major
 * with module m at m x 4 in each pulse's frame; a missing one is filled. */
static void test_stack(void **st) {
  (void)st;
  enum { P = 3, E = 4, M = 3 };
  uint16_t first[2][P][E], last[2][E][P];
  for (int m = 0; m < 2; m++)
    for (int p = 0; p < P; p++)
      for (int e = 0; e < E; e++)
        first[m][p][e] = last[m][e][p] = (uint16_t)(1000 * m + 10 * p + e + 1);
  for (int pl = 0; pl < 2; pl++) {
    uint16_t out[P][M][E];
    memset(out, 0xee, sizeof out);
    beam_kb_stack_module(out, pl ? (void *)last[1] : (void *)first[1], P, E, 2, M, 0, pl);
    beam_kb_stack_module(out, pl ? (void *)last[0] : (void *)first[0], P, E, 2, M, 2, pl);
    beam_kb_stack_fill(out, P, E, BEAM_DT_U16, M, 1, NAN);
    for (int p = 0; p < P; p++)
      for (int e = 0; e < E; e++) {
        assert_int_equal(out[p][0][e], 1000 + 10 * p + e + 1);
        assert_int_equal(out[p][1][e], 0); /* NaN is 0 in integers */
        assert_int_equal(out[p][2][e], 10 * p + e + 1);
      }
  }
  /* A larger online module goes through the tiled transpose's edges. */
  enum { P2 = 37, E2 = 70 };
  static float in[E2][P2], out2[P2][2][E2];
  for (int e = 0; e < E2; e++)
    for (int p = 0; p < P2; p++)
      in[e][p] = (float)(p * 1000 + e);
  beam_kb_stack_module(out2, in, P2, E2, 4, 2, 1, 1);
  beam_kb_stack_fill(out2, P2, E2, BEAM_DT_F32, 2, 0, NAN);
  for (int p = 0; p < P2; p++)
    for (int e = 0; e < E2; e++) {
      assert_true(isnan(out2[p][0][e]));
      assert_true(out2[p][1][e] == (float)(p * 1000 + e));
    }
  /* A data part may start at an odd address (UBSan: no aligned loads). */
  uint8_t odd[1 + sizeof last[0]], oout[1 + P * E * 2];
  memcpy(odd + 1, last[0], sizeof last[0]);
  beam_kb_stack_module(oout + 1, odd + 1, P, E, 2, 1, 0, 1);
  for (int p = 0; p < P; p++)
    assert_memory_equal(oout + 1 + p * E * 2, first[0][p], E * 2);
  /* Sizes without a typed loop (complex128: 16 bytes) take the byte copy. */
  double cin[3][2][2], cout[2][2][3][2]; /* (melems 3, pulses 2, re/im) -> (2, mods 2, 3) */
  for (int e = 0; e < 3; e++)
    for (int p = 0; p < 2; p++)
      cin[e][p][0] = 10 * p + e, cin[e][p][1] = -(10 * p + e);
  beam_kb_stack_module(cout, cin, 2, 3, 16, 2, 1, 1);
  for (int p = 0; p < 2; p++)
    for (int e = 0; e < 3; e++)
      assert_true(cout[p][1][e][0] == 10 * p + e && cout[p][1][e][1] == -(10 * p + e));
  /* Fill values of integer types are rounded and clamped. */
  uint16_t u[1][1][2];
  beam_kb_stack_fill(u, 1, 2, BEAM_DT_U16, 1, 0, 70000);
  assert_int_equal(u[0][0][1], 65535);
  int8_t i8[2];
  beam_kb_stack_fill(i8, 1, 2, BEAM_DT_I8, 1, 0, -3.6);
  assert_int_equal(i8[0], -4);
  beam_kb_stack_fill(i8, 1, 2, BEAM_DT_I8, 1, 0, -1e9);
  assert_int_equal(i8[1], -128);
  double c[2][2];
  beam_kb_stack_fill(c, 1, 2, BEAM_DT_C128, 1, 0, 2.5);
  assert_true(c[1][0] == 2.5 && c[1][1] == 2.5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),     cmocka_unit_test(test_encoder_fields),
      cmocka_unit_test(test_cpp_rules),     cmocka_unit_test(test_prefixes),
      cmocka_unit_test(test_msgpack_check), cmocka_unit_test(test_protocol_10),
      cmocka_unit_test(test_module_number), cmocka_unit_test(test_stack),
  };
  return beam_run_tests(tests, NULL, NULL);
}
