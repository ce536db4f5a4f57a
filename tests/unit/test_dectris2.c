/* Unit tests for proto/cbor.c and proto/dectris2.c: the CBOR walker (heads,
 * half floats, skipping, indefinite lengths, limits) and the DECTRIS stream
 * v2 / Jungfraujoch decoder (start, image, end, other types; every codec;
 * every rejection; each prefix of each valid message; meta_json parsed back
 * with jansson and held to its capacity).
 *
 * Messages are built with a tiny CBOR encoder written here from RFC 8949
 * section 3 (preferred serialisation, section 4.2.1, unless a test forces
 * a longer argument), not from the decoder. Pixel blobs come from
 * beam_codec_encode. Everything handed to the decoder is copied into a heap
 * block of its exact size, so ASan sees a read one byte past the end.
 *
 * DX2_SEED_DIR=dir writes the valid messages as fuzz seeds
 * (dectris2_*.cbor) into dir.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/cbor.h"
#include "proto/dectris.h"
#include "proto/err.h"
#include "proto/proto.h"

/* ---- a tiny CBOR encoder (RFC 8949 section 3) ---- */

typedef struct enc_s {
  uint8_t *b;
  size_t n, cap;
} enc_t;

static void e_raw(enc_t *e, const void *p, size_t n) {
  if (e->n + n > e->cap) {
    size_t c = e->cap ? e->cap : 256;
    while (c < e->n + n) c *= 2;
    e->b = realloc(e->b, c);
    assert_non_null(e->b);
    e->cap = c;
  }
  if (n) memcpy(e->b + e->n, p, n);
  e->n += n;
}
static void e_byte(enc_t *e, uint8_t v) { e_raw(e, &v, 1); }
static void e_be(enc_t *e, uint64_t v, unsigned width) {
  for (unsigned i = width; i-- > 0;) e_byte(e, (uint8_t)(v >> (8 * i)));
}
/* Head with the argument in `width` bytes (0 = in the initial byte). */
static void e_head_w(enc_t *e, unsigned major, uint64_t v, unsigned width) {
  static const uint8_t ai[9] = {0, 24, 25, 0, 26, 0, 0, 0, 27};
  if (width == 0) {
    e_byte(e, (uint8_t)(major << 5 | v));
    return;
  }
  e_byte(e, (uint8_t)(major << 5 | ai[width]));
  e_be(e, v, width);
}
/* Preferred serialisation: the shortest argument. */
static void e_head(enc_t *e, unsigned major, uint64_t v) {
  unsigned w = v < 24 ? 0 : v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
  e_head_w(e, major, v, w);
}
static void e_uint(enc_t *e, uint64_t v) { e_head(e, 0, v); }
static void e_int(enc_t *e, int64_t v) {
  if (v < 0) e_head(e, 1, (uint64_t)(-1 - v));
  else e_head(e, 0, (uint64_t)v);
}
static void e_textn(enc_t *e, const char *s, size_t n) {
  e_head(e, 3, n);
  e_raw(e, s, n);
}
static void e_text(enc_t *e, const char *s) { e_textn(e, s, strlen(s)); }
static void e_bytes(enc_t *e, const void *p, size_t n) {
  e_head(e, 2, n);
  e_raw(e, p, n);
}
static void e_array(enc_t *e, uint64_t n) { e_head(e, 4, n); }
static void e_map(enc_t *e, uint64_t n) { e_head(e, 5, n); }
static void e_tag(enc_t *e, uint64_t t) { e_head(e, 6, t); }
static void e_indef(enc_t *e, unsigned major) { e_byte(e, (uint8_t)(major << 5 | 31)); }
static void e_break(enc_t *e) { e_byte(e, 0xff); }
static void e_double(enc_t *e, double d) {
  uint64_t v;
  memcpy(&v, &d, 8);
  e_byte(e, 0xfb);
  e_be(e, v, 8);
}
static void e_single(enc_t *e, float f) {
  uint32_t v;
  memcpy(&v, &f, 4);
  e_byte(e, 0xfa);
  e_be(e, v, 4);
}
static void e_half(enc_t *e, uint16_t bits) {
  e_byte(e, 0xf9);
  e_be(e, bits, 2);
}
static void e_bool(enc_t *e, int b) { e_byte(e, b ? 0xf5 : 0xf4); }
static void e_sig(enc_t *e) { e_raw(e, "\xd9\xd9\xf7", 3); }
static void e_free(enc_t *e) {
  free(e->b);
  memset(e, 0, sizeof *e);
}

/* Map bodies are built in a second buffer and counted as they go, so the
 * head can be written with the real (shortest) count. */
typedef struct mapb_s {
  enc_t body;
  uint64_t n;
} mapb_t;
static enc_t *kv(mapb_t *m, const char *key) {
  m->n++;
  e_text(&m->body, key);
  return &m->body;
}
static void e_mapb(enc_t *e, mapb_t *m) {
  e_map(e, m->n);
  e_raw(e, m->body.b, m->body.n);
  e_free(&m->body);
  m->n = 0;
}

/* ---- helpers ---- */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Detector-like pixels: mostly small counts. */
static void *pixels(size_t n, size_t es) {
  uint8_t *p = malloc(n * es > 0 ? n * es : 1);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    uint32_t v = rnd() % 13 == 0 ? rnd() : rnd() % 7;
    if (es == 4 && rnd() % 2) {
      float f = (float)(v % 1000) * 0.25f;
      memcpy(p + i * es, &f, 4);
    } else {
      for (size_t j = 0; j < es; j++) p[i * es + j] = (uint8_t)(v >> (8 * j));
    }
  }
  return p;
}

static int dx2(const uint8_t *msg, size_t len, beam_dx_msg_t *out, const char **why) {
  uint8_t *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  if (len) memcpy(copy, msg, len);
  *why = NULL;
  int rc = beam_dx2_parse(len ? copy : NULL, len, out, why);
  free(copy);
  return rc;
}

/* Parses in place (the pointers in *out stay valid). */
static void must_parse(const enc_t *e, beam_dx_msg_t *out) {
  const char *why = NULL;
  int rc = beam_dx2_parse(e->b, e->n, out, &why);
  if (rc != 0) fail_msg("rejected (%s): %s", beam_err_name(rc), why ? why : "(no reason)");
  assert_int_equal(out->version, 2);
}

static void expect_reject(const enc_t *e, int code, const char *reason) {
  beam_dx_msg_t m;
  const char *why;
  int rc = dx2(e->b, e->n, &m, &why);
  if (rc != code || !why || (reason && strcmp(why, reason) != 0))
    fail_msg("expected %s \"%s\", got %s \"%s\"", beam_err_name(code), reason ? reason : "*",
             beam_err_name(rc), why ? why : "(none)");
  if (strncmp(why, "dectris v2: ", 12) != 0) fail_msg("reason without prefix: %s", why);
  assert_int_equal(m.kind, BEAM_DX_NONE);
}

/* Every proper prefix of a valid message must be rejected as malformed. */
static void all_prefixes_rejected(const enc_t *e) {
  for (size_t len = 0; len < e->n; len++) {
    beam_dx_msg_t m;
    const char *why;
    int rc = dx2(e->b, len, &m, &why);
    if (rc != BEAM_EPROTO || !why || strncmp(why, "dectris v2: ", 12) != 0)
      fail_msg("prefix %zu of %zu: got %s \"%s\"", len, e->n, beam_err_name(rc), why ? why : "(none)");
    assert_int_equal(m.kind, BEAM_DX_NONE);
  }
}

static void write_seed(const char *name, const enc_t *e) {
  const char *dir = getenv("DX2_SEED_DIR");
  if (!dir) return;
  char path[512];
  snprintf(path, sizeof path, "%s/dectris2_%s.cbor", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(e->b, 1, e->n, f), e->n);
  fclose(f);
}

static const char *UID = "01HBV3JPF9T4ZDPADX6EMK6XMZ";

/* ---- the CBOR walker ---- */

static void test_cbor_half(void **state) {
  (void)state;
  static const struct {
    uint16_t h;
    double d;
  } t[] = {
      {0x0000, 0.0},         {0x3c00, 1.0},          {0xc000, -2.0},
      {0x7bff, 65504.0},     {0x0001, 5.960464477539063e-8}, {0x03ff, 6.097555160522461e-5},
      {0x0400, 6.103515625e-5}, {0x3555, 0.333251953125}, {0x6000, 512.0},
      {0x7c00, INFINITY},    {0xfc00, -INFINITY},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (beam_cbor_half(t[i].h) != t[i].d)
      fail_msg("half %04x: got %.17g want %.17g", t[i].h, beam_cbor_half(t[i].h), t[i].d);
  assert_true(isnan(beam_cbor_half(0x7e00)));
  assert_true(signbit(beam_cbor_half(0x8000)) && beam_cbor_half(0x8000) == 0.0);
}

static void test_cbor_read(void **state) {
  (void)state;
  enc_t e = {0};
  e_uint(&e, 0);
  e_uint(&e, 23);
  e_uint(&e, 24);
  e_uint(&e, 65536);
  e_head_w(&e, 0, 7, 8); /* not preferred, still valid */
  e_uint(&e, UINT64_MAX);
  e_int(&e, -1);
  e_int(&e, INT64_MIN);
  e_bytes(&e, "\x01\x02", 2);
  e_text(&e, "héllo");
  e_array(&e, 2);
  e_map(&e, 1);
  e_tag(&e, 55799);
  e_bool(&e, 1);
  e_byte(&e, 0xf6);
  e_half(&e, 0x3e00);
  e_single(&e, 0.25f);
  e_double(&e, -1e300);
  e_byte(&e, 0xf8);
  e_byte(&e, 0xff); /* simple value 255 */
  beam_cbor_t c;
  beam_cbor_item_t it;
  beam_cbor_init(&c, e.b, e.n);
  static const struct {
    uint8_t major;
    uint64_t val;
  } want[] = {{0, 0}, {0, 23}, {0, 24}, {0, 65536}, {0, 7}, {0, UINT64_MAX},
              {1, 0}, {1, (uint64_t)INT64_MAX}, {2, 2}, {3, 6}, {4, 2}, {5, 1},
              {6, 55799}, {7, 21}, {7, 22}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    assert_int_equal(beam_cbor_read(&c, &it), 0);
    assert_int_equal(it.major, want[i].major);
    if (it.val != want[i].val) fail_msg("item %zu: val %llu", i, (unsigned long long)it.val);
    assert_int_equal(it.flt, 0);
  }
  assert_int_equal(beam_cbor_read(&c, &it), 0);
  assert_int_equal(it.flt, 2);
  assert_true(it.f == 1.5);
  assert_int_equal(beam_cbor_read(&c, &it), 0);
  assert_int_equal(it.flt, 4);
  assert_true(it.f == 0.25);
  assert_int_equal(beam_cbor_read(&c, &it), 0);
  assert_int_equal(it.flt, 8);
  assert_true(it.f == -1e300);
  double d;
  assert_int_equal(beam_cbor_number(&it, &d), 0);
  assert_true(d == -1e300);
  assert_int_equal(beam_cbor_read(&c, &it), 0);
  assert_int_equal(it.major, 7);
  assert_int_equal(it.val, 255);
  assert_ptr_equal(c.p, c.end);
  assert_int_equal(beam_cbor_read(&c, &it), BEAM_EPROTO);
  assert_int_equal(c.err, BEAM_CBOR_ETRUNC);
  e_free(&e);
}

static int read_err(const char *bytes, size_t n) {
  beam_cbor_t c;
  uint8_t *b = malloc(n);
  memcpy(b, bytes, n);
  beam_cbor_init(&c, b, n);
  int rc = beam_cbor_skip(&c, 0);
  free(b);
  return rc ? (int)c.err : 0;
}

static void test_cbor_malformed(void **state) {
  (void)state;
  assert_int_equal(read_err("\x1c", 1), BEAM_CBOR_ERESERVED);
  assert_int_equal(read_err("\x5d", 1), BEAM_CBOR_ERESERVED);
  assert_int_equal(read_err("\x1f", 1), BEAM_CBOR_ERESERVED);     /* indefinite uint */
  assert_int_equal(read_err("\xdf\x00", 2), BEAM_CBOR_ERESERVED); /* indefinite tag */
  assert_int_equal(read_err("\x5f\x41\x00\xff", 4), BEAM_CBOR_EINDEF_STR);
  assert_int_equal(read_err("\x7f\x61\x61\xff", 4), BEAM_CBOR_EINDEF_STR);
  assert_int_equal(read_err("\xff", 1), BEAM_CBOR_EBREAK);
  assert_int_equal(read_err("\x82\x01\xff", 3), BEAM_CBOR_EBREAK); /* break in a definite array */
  assert_int_equal(read_err("\xbf\x61\x61\xff", 4), BEAM_CBOR_EODDMAP);
  assert_int_equal(read_err("\xf8\x10", 2), BEAM_CBOR_ESIMPLE);
  assert_int_equal(read_err("\x19\x01", 2), BEAM_CBOR_ETRUNC);
  assert_int_equal(read_err("\x9f\x01", 2), BEAM_CBOR_ETRUNC); /* indefinite array, no break */
  assert_int_equal(read_err("\x43\x01\x02", 3), BEAM_CBOR_ETRUNC);
  /* Huge lengths and counts are refused at the head, before any walk. */
  assert_int_equal(read_err("\x5b\xff\xff\xff\xff\xff\xff\xff\xff\x00", 10), BEAM_CBOR_ETRUNC);
  assert_int_equal(read_err("\x5b\x80\x00\x00\x00\x00\x00\x00\x00\x00", 10), BEAM_CBOR_ETRUNC);
  assert_int_equal(read_err("\x7a\xff\xff\xff\xff\x00", 6), BEAM_CBOR_ETRUNC);
  assert_int_equal(read_err("\x9b\x00\x00\x01\x00\x00\x00\x00\x00\x00", 10), BEAM_CBOR_ETRUNC);
  assert_int_equal(read_err("\xa2\x00\x00\x00", 4), BEAM_CBOR_ETRUNC); /* 2 pairs need 4 bytes */
  assert_int_equal(read_err("\xa2\x00\x00\x00\x00", 5), 0);
  assert_int_equal(read_err("\xbf\x61\x61\x9f\xff\xff", 6), 0);
  assert_int_equal(read_err("\xc1\xc2\x9f\x9f\xff\xbf\xff\xff", 8), 0);
}

/* Depth: an array, map or tag at depth >= 32 is refused. */
static void test_cbor_depth(void **state) {
  (void)state;
  for (unsigned k = 30; k <= 34; k++) {
    for (int kind = 0; kind < 3; kind++) {
      enc_t e = {0};
      for (unsigned i = 0; i < k; i++) {
        if (kind == 0) e_array(&e, 1);
        else if (kind == 1) e_indef(&e, 4);
        else e_tag(&e, 1);
      }
      e_uint(&e, 1);
      if (kind == 1)
        for (unsigned i = 0; i < k; i++) e_break(&e);
      beam_cbor_t c;
      beam_cbor_init(&c, e.b, e.n);
      int rc = beam_cbor_skip(&c, 0); /* containers at depths 0 .. k-1 */
      if (k <= 32) {
        if (rc) fail_msg("k=%u kind=%d: %s", k, kind, beam_cbor_strerror(c.err));
        assert_ptr_equal(c.p, c.end);
      } else {
        assert_int_equal(rc, BEAM_EPROTO);
        assert_int_equal(c.err, BEAM_CBOR_EDEPTH);
      }
      /* Starting deeper counts: from depth 1 one level less fits. */
      beam_cbor_init(&c, e.b, e.n);
      rc = beam_cbor_skip(&c, 1);
      assert_int_equal(rc != 0, k > 31);
      e_free(&e);
    }
  }
}

static void test_cbor_iter(void **state) {
  (void)state;
  enc_t e = {0};
  e_indef(&e, 5);
  e_text(&e, "a");
  e_uint(&e, 1);
  e_text(&e, "b");
  e_array(&e, 2);
  e_uint(&e, 2);
  e_uint(&e, 3);
  e_break(&e);
  beam_cbor_t c;
  beam_cbor_item_t it;
  beam_cbor_iter_t k;
  beam_cbor_init(&c, e.b, e.n);
  assert_int_equal(beam_cbor_read(&c, &it), 0);
  assert_true(it.indef);
  beam_cbor_iter(&it, &k);
  int pairs = 0;
  while (beam_cbor_next(&c, &k) == 1) {
    assert_int_equal(beam_cbor_read(&c, &it), 0);
    assert_int_equal(it.major, BEAM_CBOR_TEXT);
    assert_int_equal(beam_cbor_skip(&c, 1), 0);
    pairs++;
  }
  assert_int_equal(pairs, 2);
  assert_ptr_equal(c.p, c.end);
  assert_int_equal(beam_cbor_next(&c, &k), 0); /* stays at the end */
  e_free(&e);
}

/* ---- message builders ---- */

/* The full start message; user_data's offset and length in the message
 * come back through ud_off / ud_len. */
static const float ctable[8] = {1.0f, 1.5f, 2.25f, -3.0f, 100.0f, 0.125f, 7.0f, 65504.0f};

static void mda_raw(enc_t *e, uint32_t y, uint32_t x, unsigned tag, const void *p, size_t n) {
  e_tag(e, 40);
  e_array(e, 2);
  e_array(e, 2);
  e_uint(e, y);
  e_uint(e, x);
  e_tag(e, tag);
  e_bytes(e, p, n);
}

static uint8_t ff_data[2][96], pm_data[2][96];

static void build_start(enc_t *e, size_t *ud_off, size_t *ud_len) {
  mapb_t m = {0};
  enc_t *b;
  for (int c = 0; c < 2; c++)
    for (int i = 0; i < 96; i++) {
      ff_data[c][i] = (uint8_t)(i * 7 + c);
      pm_data[c][i] = (uint8_t)(i % 5 == 0 ? c + 1 : 0);
    }
  e_text(kv(&m, "type"), "start");
  e_uint(kv(&m, "series_id"), 7);
  e_text(kv(&m, "series_unique_id"), UID);
  b = kv(&m, "arm_date");
  e_tag(b, 0);
  e_text(b, "2024-05-01T12:00:00.000Z");
  e_double(kv(&m, "beam_center_x"), 1024.5);
  e_half(kv(&m, "beam_center_y"), 0x6000); /* 512.0 as a half float */
  /* threshold_energy before channels: matched after the whole map */
  b = kv(&m, "threshold_energy");
  e_map(b, 3);
  e_text(b, "threshold_1");
  e_single(b, 6200.0f);
  e_text(b, "threshold_9");
  e_double(b, 1.0);
  e_text(b, "threshold_2");
  e_uint(b, 9000);
  b = kv(&m, "channels");
  e_array(b, 2);
  e_text(b, "threshold_1");
  e_text(b, "threshold_2");
  e_double(kv(&m, "count_time"), 0.0005);
  e_bool(kv(&m, "countrate_correction_enabled"), 1);
  b = kv(&m, "countrate_correction_lookup_table");
  e_tag(b, 85);
  e_bytes(b, ctable, sizeof ctable);
  e_text(kv(&m, "detector_description"), "Dectris EIGER2 Si 4M");
  e_text(kv(&m, "detector_serial_number"), "E-32-0123");
  b = kv(&m, "detector_translation");
  e_array(b, 3);
  e_double(b, 0.0);
  e_double(b, 0.0);
  e_double(b, -0.12);
  b = kv(&m, "flatfield");
  e_map(b, 2);
  e_text(b, "threshold_1");
  mda_raw(b, 4, 6, 85, ff_data[0], 96);
  e_text(b, "threshold_2");
  mda_raw(b, 4, 6, 85, ff_data[1], 96);
  e_bool(kv(&m, "flatfield_enabled"), 0);
  e_double(kv(&m, "frame_time"), 0.001);
  b = kv(&m, "goniometer");
  e_map(b, 2);
  e_text(b, "omega");
  e_map(b, 2);
  e_text(b, "increment");
  e_double(b, 0.1);
  e_text(b, "start");
  e_double(b, 10.0);
  e_text(b, "kappa");
  e_map(b, 2);
  e_text(b, "increment");
  e_uint(b, 0);
  e_text(b, "start");
  e_int(b, -30);
  e_text(kv(&m, "image_dtype"), "uint16");
  e_uint(kv(&m, "image_size_x"), 6);
  e_uint(kv(&m, "image_size_y"), 4);
  e_uint(kv(&m, "incident_energy"), 12400); /* an integer where a float is due */
  e_double(kv(&m, "incident_wavelength"), 0.99987);
  e_uint(kv(&m, "number_of_images"), 1000);
  b = kv(&m, "pixel_mask");
  e_map(b, 2);
  e_text(b, "threshold_1");
  mda_raw(b, 4, 6, 70, pm_data[0], 96);
  e_text(b, "threshold_2");
  mda_raw(b, 4, 6, 70, pm_data[1], 96);
  e_bool(kv(&m, "pixel_mask_enabled"), 1);
  e_double(kv(&m, "pixel_size_x"), 7.5e-5);
  e_single(kv(&m, "pixel_size_y"), 7.5e-5f);
  e_uint(kv(&m, "saturation_value"), 65534);
  e_text(kv(&m, "sensor_material"), "Si");
  e_double(kv(&m, "sensor_thickness"), 4.5e-4);
  e_bool(kv(&m, "virtual_pixel_interpolation_enabled"), 1);
  /* user_data: anything; its raw bytes come back */
  b = kv(&m, "user_data");
  size_t at = b->n;
  e_map(b, 8);
  e_text(b, "operator");
  e_text(b, "ada");
  e_text(b, "scan");
  e_array(b, 3);
  e_uint(b, 1);
  e_uint(b, 2);
  e_uint(b, 3);
  e_uint(b, 1); /* integer key */
  e_text(b, "int key");
  e_bytes(b, "\x00", 1); /* byte-string key: dropped from JSON */
  e_text(b, "bytes key");
  e_text(b, "nan");
  e_double(b, NAN);
  e_text(b, "inf");
  e_half(b, 0xfc00);
  e_text(b, "esc");
  e_text(b, "q\"b\\n\n\x01\xc3\xa9\x7f");
  e_text(b, "bad");
  e_textn(b, "\xff\xfe\xed\xa0\x80", 5); /* invalid UTF-8, a surrogate among it */
  size_t ud_n = b->n - at;
  /* unknown keys of every kind are skipped */
  b = kv(&m, "future_key");
  e_map(b, 3);
  e_text(b, "nested");
  e_array(b, 2);
  e_uint(b, 1);
  e_map(b, 1);
  e_text(b, "a");
  e_int(b, -5);
  e_text(b, "when");
  e_tag(b, 1);
  e_uint(b, 1700000000);
  e_text(b, "undef");
  e_byte(b, 0xf7);
  e_text(kv(&m, "series_id_and_then_some_more_text_to_make_this_key_64_bytes_long"), "x");
  e_bytes(kv(&m, "small_bytes"), "\x01\x02\x03", 3);
  {
    uint8_t z[100] = {0};
    e_bytes(kv(&m, "big_bytes"), z, sizeof z);
  }
  b = kv(&m, "small_typed_u16");
  e_tag(b, 69);
  e_bytes(b, "\x01\x00\x02\x01", 4);
  b = kv(&m, "typed_i16_be");
  e_tag(b, 73);
  e_bytes(b, "\xff\xfe\x00\x05", 4);
  b = kv(&m, "typed_compressed");
  e_tag(b, 69);
  e_tag(b, 56500);
  e_array(b, 3);
  e_text(b, "bslz4");
  e_uint(b, 2);
  e_bytes(b, "\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x20\x00", 12);
  e_int(kv(&m, "neg"), -5);
  e_sig(e);
  size_t head = e->n;
  /* the map head is 1 + (n >= 24) bytes: user_data's offset follows */
  uint64_t n = m.n;
  size_t body_at_ud = at;
  e_mapb(e, &m);
  size_t maphead = n < 24 ? 1 : n <= 0xff ? 2 : 3;
  *ud_off = head + maphead + body_at_ud;
  *ud_len = ud_n;
}

/* One image channel: raw when alg is NULL. */
typedef struct chan_s {
  const char *name;
  unsigned tag; /* 64, 69, 70, 85 */
  const char *alg;
  beam_codec_t codec;
  uint32_t y, x;
  void *raw; /* y*x elements, owned */
} chan_t;

static size_t tag_es(unsigned tag) { return tag == 64 ? 1 : tag == 69 ? 2 : 4; }

static void e_chan(enc_t *e, const chan_t *c) {
  size_t es = tag_es(c->tag), nb = (size_t)c->y * c->x * es;
  e_tag(e, 40);
  e_array(e, 2);
  e_array(e, 2);
  e_uint(e, c->y);
  e_uint(e, c->x);
  e_tag(e, c->tag);
  if (!c->alg) {
    e_bytes(e, c->raw, nb);
    return;
  }
  size_t cap = beam_codec_bound(c->codec, nb, es);
  uint8_t *blob = malloc(cap), *scratch = malloc(nb ? nb : 1);
  int64_t n = beam_codec_encode(c->codec, c->raw, nb, es, blob, cap, scratch);
  assert_true(n >= 12);
  e_tag(e, 56500);
  e_array(e, 3);
  e_text(e, c->alg);
  e_uint(e, c->codec == BEAM_CODEC_LZ4 ? 0 : es);
  e_bytes(e, blob, (size_t)n);
  free(blob);
  free(scratch);
}

static void build_image(enc_t *e, uint64_t image_id, const chan_t *ch, unsigned n) {
  mapb_t m = {0};
  enc_t *b;
  e_text(kv(&m, "type"), "image");
  e_uint(kv(&m, "series_id"), 7);
  e_text(kv(&m, "series_unique_id"), UID);
  e_uint(kv(&m, "image_id"), image_id);
  b = kv(&m, "real_time");
  e_array(b, 2);
  e_uint(b, 215873);
  e_uint(b, 50000000);
  b = kv(&m, "series_date");
  e_tag(b, 0);
  e_text(b, "2024-05-01T12:00:00.000Z");
  b = kv(&m, "start_time");
  e_array(b, 2);
  e_uint(b, 100000000);
  e_uint(b, 50000000);
  b = kv(&m, "stop_time");
  e_array(b, 2);
  e_uint(b, 100215873);
  e_uint(b, 50000000);
  b = kv(&m, "data");
  e_map(b, n);
  for (unsigned i = 0; i < n; i++) {
    e_text(b, ch[i].name);
    e_chan(b, &ch[i]);
  }
  e_text(kv(&m, "user_data"), "appendix");
  e_sig(e);
  e_mapb(e, &m);
}

static void check_image(const beam_dx_msg_t *m, const enc_t *e, const chan_t *ch, unsigned n) {
  assert_int_equal(m->kind, BEAM_DX_IMAGE);
  const beam_dx_image_t *im = &m->image;
  assert_int_equal(im->series_id, 7);
  assert_int_equal(m->end_series_id, 7);
  assert_int_equal(im->nchannels, n);
  assert_true(im->start_time_s == 2.0);
  assert_non_null(im->series_date); /* the text inside tag 0, borrowed */
  assert_int_equal(im->series_date_len, 24);
  assert_memory_equal(im->series_date, "2024-05-01T12:00:00.000Z", 24);
  assert_true(im->stop_time_s == 100215873.0 / 50000000.0);
  assert_true(im->real_time_s == 215873.0 / 50000000.0);
  assert_true(fabs(im->real_time_s - 0.00431746) < 1e-12);
  assert_non_null(im->user_data);
  assert_int_equal(im->user_data_len, 9); /* 0x68 "appendix" */
  assert_memory_equal(im->user_data, "\x68" "appendix", 9);
  for (unsigned i = 0; i < n; i++) {
    const beam_dx_array_t *a = &im->data[i];
    size_t es = tag_es(ch[i].tag), nb = (size_t)ch[i].y * ch[i].x * es;
    assert_string_equal(a->channel, ch[i].name);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], ch[i].y);
    assert_int_equal(a->shape[1], ch[i].x);
    assert_int_equal(a->raw_size, nb);
    assert_int_equal(beam_dtype_size(a->dtype), es);
    assert_int_equal(a->codec, ch[i].alg ? ch[i].codec : BEAM_CODEC_RAW);
    /* borrowed: inside the message */
    assert_true((const uint8_t *)a->data >= e->b && (const uint8_t *)a->data + a->size <= e->b + e->n);
    uint8_t *dst = malloc(nb ? nb : 1), *scratch = malloc(nb ? nb : 1);
    const char *why = NULL;
    int rc = beam_codec_decode(a->codec, a->data, a->size, dst, nb, es, scratch, &why);
    if (rc) fail_msg("channel %u: decode failed: %s", i, why ? why : "?");
    assert_memory_equal(dst, ch[i].raw, nb);
    free(dst);
    free(scratch);
  }
}

static void free_chans(chan_t *ch, unsigned n) {
  for (unsigned i = 0; i < n; i++) free(ch[i].raw);
}

/* ---- start ---- */

static void test_start_full(void **state) {
  (void)state;
  enc_t e = {0};
  size_t ud_off, ud_len;
  build_start(&e, &ud_off, &ud_len);
  write_seed("start", &e);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  const beam_dx_start_t *s = &m.start;
  assert_int_equal(m.kind, BEAM_DX_START);
  assert_int_equal(s->series_id, 7);
  assert_int_equal(m.end_series_id, 7);
  assert_string_equal(s->series_unique_id, UID);
  assert_int_equal(s->header_detail, -1);
  assert_int_equal(s->width, 6);
  assert_int_equal(s->height, 4);
  assert_int_equal(s->dtype, BEAM_DT_U16);
  assert_int_equal(s->nimages, 1000);
  assert_int_equal(s->ntrigger, 1);
  assert_int_equal(s->expected_frames, 1000);
  assert_string_equal(s->trigger_mode, "");
  assert_true(s->count_time == 0.0005);
  assert_true(s->frame_time == 0.001);
  assert_true(s->energy_ev == 12400.0);
  assert_true(s->wavelength_a == 0.99987);
  assert_true(isnan(s->distance_m));
  assert_true(s->pixel_size_x == 7.5e-5);
  assert_true(s->pixel_size_y == (double)7.5e-5f);
  assert_true(s->beam_center_x == 1024.5);
  assert_true(s->beam_center_y == 512.0);
  assert_true(s->sensor_thickness_m == 4.5e-4);
  assert_int_equal(s->saturation_value, 65534);
  assert_int_equal(s->has_saturation, 1);
  assert_int_equal(s->has_error_value, 0);
  assert_int_equal(s->magic_number, 0);
  assert_int_equal(s->nchannels, 2);
  assert_string_equal(s->channels[0], "threshold_1");
  assert_string_equal(s->channels[1], "threshold_2");
  assert_true(s->threshold_ev[0] == 6200.0);
  assert_true(s->threshold_ev[1] == 9000.0);
  assert_non_null(s->arm_date);
  assert_int_equal(s->arm_date_len, 24);
  assert_true(isnan(s->threshold_ev[2]) && isnan(s->threshold_ev[3]));
  assert_int_equal(s->nflatfield, 2);
  assert_int_equal(s->npixel_mask, 2);
  for (int c = 0; c < 2; c++) {
    const beam_dx_array_t *f = &s->flatfield[c], *p = &s->pixel_mask[c];
    assert_string_equal(f->channel, c ? "threshold_2" : "threshold_1");
    assert_string_equal(p->channel, f->channel);
    assert_int_equal(f->dtype, BEAM_DT_F32);
    assert_int_equal(p->dtype, BEAM_DT_U32);
    assert_int_equal(f->codec, BEAM_CODEC_RAW);
    assert_int_equal(f->ndim, 2);
    assert_int_equal(f->shape[0], 4);
    assert_int_equal(f->shape[1], 6);
    assert_int_equal(p->shape[0], 4);
    assert_int_equal(f->raw_size, 96);
    assert_int_equal(f->size, 96);
    assert_memory_equal(f->data, ff_data[c], 96);
    assert_memory_equal(p->data, pm_data[c], 96);
  }
  assert_non_null(s->countrate.data);
  assert_int_equal(s->countrate.ndim, 1);
  assert_int_equal(s->countrate.shape[0], 8);
  assert_int_equal(s->countrate.dtype, BEAM_DT_F32);
  assert_memory_equal(s->countrate.data, ctable, sizeof ctable);
  assert_ptr_equal(s->config, e.b);
  assert_int_equal(s->config_len, e.n);
  assert_ptr_equal(s->user_data, e.b + ud_off);
  assert_int_equal(s->user_data_len, ud_len);
  assert_int_equal(((const uint8_t *)s->user_data)[0], 0xa8); /* map of 8 */
  all_prefixes_rejected(&e);
  e_free(&e);
}

/* Jungfraujoch: an indefinite-length map (tinycbor), its extra fields. */
static void build_jfj_start(enc_t *e) {
  e_sig(e);
  e_indef(e, 5);
  e_text(e, "type");
  e_text(e, "start");
  e_text(e, "magic_number");
  e_uint(e, 0x52320004u);
  e_text(e, "series_id");
  e_uint(e, 3);
  e_text(e, "series_unique_id");
  e_text(e, "lyso_run_with_a_very_long_name_that_jungfraujoch_uses_as_a_file_prefix/data");
  e_text(e, "detector_distance");
  e_double(e, 0.155);
  e_text(e, "error_value");
  e_int(e, -1);
  e_text(e, "image_dtype");
  e_text(e, "uint32");
  e_text(e, "image_size_x");
  e_uint(e, 1030);
  e_text(e, "image_size_y");
  e_uint(e, 514);
  e_text(e, "channels");
  e_indef(e, 4);
  e_text(e, "default");
  e_break(e);
  e_text(e, "threshold_energy");
  e_map(e, 1);
  e_text(e, "default");
  e_single(e, 6000.0f);
  e_text(e, "incident_energy");
  e_single(e, 12400.0f);
  e_text(e, "pixel_mask");
  e_map(e, 1);
  e_text(e, "default");
  {
    uint32_t mask[4] = {0, 1, 0, 4};
    mda_raw(e, 2, 2, 70, mask, sizeof mask);
  }
  e_text(e, "number_of_images");
  e_uint(e, 20000);
  e_break(e);
}

static void test_start_jungfraujoch(void **state) {
  (void)state;
  enc_t e = {0};
  build_jfj_start(&e);
  write_seed("start_jfj", &e);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  const beam_dx_start_t *s = &m.start;
  assert_int_equal(m.kind, BEAM_DX_START);
  assert_int_equal(s->series_id, 3);
  assert_int_equal(s->magic_number, 0x52320004u);
  assert_true(s->distance_m == 0.155);
  assert_int_equal(s->has_error_value, 1);
  assert_true(s->error_value == -1);
  assert_int_equal(s->dtype, BEAM_DT_U32);
  assert_int_equal(s->width, 1030);
  assert_int_equal(s->height, 514);
  assert_int_equal(s->nchannels, 1);
  assert_string_equal(s->channels[0], "default");
  assert_true(s->threshold_ev[0] == 6000.0);
  assert_true(s->energy_ev == 12400.0);
  assert_int_equal(s->npixel_mask, 1);
  assert_int_equal(s->nflatfield, 0);
  assert_null(s->countrate.data);
  assert_null(s->user_data);
  assert_int_equal(s->expected_frames, 20000);
  assert_int_equal(s->has_saturation, 0);
  assert_true(isnan(s->count_time));
  /* cut to 63 bytes */
  assert_int_equal(strlen(s->series_unique_id), 63);
  assert_memory_equal(s->series_unique_id, "lyso_run_with_a_very_long_name", 30);
  all_prefixes_rejected(&e);
  e_free(&e);
}

/* ---- image ---- */

static void image_case(const char *seed, chan_t *ch, unsigned n) {
  enc_t e = {0};
  build_image(&e, 42, ch, n);
  if (seed) write_seed(seed, &e);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  assert_int_equal(m.image.image_id, 42);
  check_image(&m, &e, ch, n);
  all_prefixes_rejected(&e);
  e_free(&e);
}

static void test_image_raw(void **state) {
  (void)state;
  chan_t u16 = {"threshold_1", 69, NULL, BEAM_CODEC_RAW, 5, 7, pixels(35, 2)};
  image_case("image_raw_u16", &u16, 1);
  chan_t u32 = {"threshold_1", 70, NULL, BEAM_CODEC_RAW, 4, 9, pixels(36, 4)};
  image_case("image_raw_u32", &u32, 1);
  chan_t f32 = {"threshold_1", 85, NULL, BEAM_CODEC_RAW, 3, 3, pixels(9, 4)};
  image_case("image_raw_f32", &f32, 1);
  chan_t u8 = {"t", 64, NULL, BEAM_CODEC_RAW, 2, 5, pixels(10, 1)};
  image_case(NULL, &u8, 1);
  chan_t empty = {"t", 69, NULL, BEAM_CODEC_RAW, 0, 7, pixels(0, 2)};
  image_case(NULL, &empty, 1);
  free(u16.raw);
  free(u32.raw);
  free(f32.raw);
  free(u8.raw);
  free(empty.raw);
}

static void test_image_compressed(void **state) {
  (void)state;
  /* 37 x 53 is not a multiple of 8 elements: bitshuffle's raw tail. */
  chan_t bs = {"threshold_1", 69, "bslz4", BEAM_CODEC_BSLZ4, 37, 53, pixels(37 * 53, 2)};
  image_case("image_bslz4", &bs, 1);
  chan_t lz = {"threshold_1", 70, "lz4", BEAM_CODEC_LZ4, 16, 16, pixels(256, 4)};
  image_case("image_lz4", &lz, 1);
  chan_t zs = {"default", 69, "bszstd", BEAM_CODEC_BSZSTD, 19, 21, pixels(19 * 21, 2)};
  image_case("image_bszstd", &zs, 1);
  chan_t bs32 = {"threshold_1", 70, "bslz4", BEAM_CODEC_BSLZ4, 8, 8, pixels(64, 4)};
  image_case(NULL, &bs32, 1);
  free(bs.raw);
  free(lz.raw);
  free(zs.raw);
  free(bs32.raw);
}

/* A frame big enough for several bitshuffle blocks (8192 bytes each). */
static void test_image_large(void **state) {
  (void)state;
  chan_t bs = {"threshold_1", 69, "bslz4", BEAM_CODEC_BSLZ4, 300, 201, pixels(300 * 201, 2)};
  enc_t e = {0};
  build_image(&e, 0, &bs, 1);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  assert_int_equal(m.image.image_id, 0);
  check_image(&m, &e, &bs, 1);
  e_free(&e);
  free(bs.raw);
}

static void test_image_channels(void **state) {
  (void)state;
  chan_t ch[4] = {
      {"threshold_1", 69, "bslz4", BEAM_CODEC_BSLZ4, 6, 10, pixels(60, 2)},
      {"threshold_2", 69, NULL, BEAM_CODEC_RAW, 6, 10, pixels(60, 2)},
      {"threshold_3", 70, "lz4", BEAM_CODEC_LZ4, 6, 10, pixels(60, 4)},
      {"diff", 85, NULL, BEAM_CODEC_RAW, 6, 10, pixels(60, 4)},
  };
  image_case("image_two_channels", ch, 2);
  image_case(NULL, ch, 4);
  free_chans(ch, 4);
}

/* ---- end, other types ---- */

static void test_end_and_other(void **state) {
  (void)state;
  enc_t e = {0};
  mapb_t m = {0};
  e_text(kv(&m, "type"), "end");
  e_uint(kv(&m, "series_id"), 7);
  e_text(kv(&m, "series_unique_id"), UID);
  e_sig(&e);
  e_mapb(&e, &m);
  write_seed("end", &e);
  beam_dx_msg_t msg;
  must_parse(&e, &msg);
  assert_int_equal(msg.kind, BEAM_DX_END);
  assert_int_equal(msg.end_series_id, 7);
  all_prefixes_rejected(&e);
  e_free(&e);

  /* Jungfraujoch calibration: named, walked, not decoded */
  e_text(kv(&m, "type"), "calibration");
  enc_t *b = kv(&m, "data");
  e_map(b, 1);
  e_text(b, "pedestal_g0");
  {
    float ped[6] = {1, 2, 3, 4, 5, 6};
    mda_raw(b, 2, 3, 85, ped, sizeof ped);
  }
  e_uint(kv(&m, "series_id"), 3);
  e_sig(&e);
  e_mapb(&e, &m);
  write_seed("calibration", &e);
  must_parse(&e, &msg);
  assert_int_equal(msg.kind, BEAM_DX_OTHER);
  assert_string_equal(msg.other_type, "calibration");
  all_prefixes_rejected(&e);
  e_free(&e);

  static const char *const others[] = {"metadata", "status", "",
                                       "a_type_name_longer_than_thirty_one_bytes"};
  for (size_t i = 0; i < 4; i++) {
    e_text(kv(&m, "type"), others[i]);
    b = kv(&m, "images");
    e_array(b, 1);
    e_map(b, 1);
    e_text(b, "image_id");
    e_text(b, "not even an integer"); /* fields of other types are not checked */
    e_sig(&e);
    e_mapb(&e, &m);
    must_parse(&e, &msg);
    assert_int_equal(msg.kind, BEAM_DX_OTHER);
    assert_int_equal(strncmp(msg.other_type, others[i], 31), 0);
    assert_true(strlen(msg.other_type) <= 31);
    e_free(&e);
  }
}

/* ---- rejections ---- */

/* A one-channel image whose data value is written by fn. */
typedef void (*data_fn)(enc_t *b, void *arg);
static void image_with(enc_t *e, data_fn fn, void *arg) {
  mapb_t m = {0};
  e_text(kv(&m, "type"), "image");
  e_uint(kv(&m, "series_id"), 1);
  e_uint(kv(&m, "image_id"), 0);
  enc_t *b = kv(&m, "data");
  e_map(b, 1);
  e_text(b, "threshold_1");
  fn(b, arg);
  e_sig(e);
  e_mapb(e, &m);
}

static void expect_image_reject(data_fn fn, void *arg, int code, const char *reason) {
  enc_t e = {0};
  image_with(&e, fn, arg);
  expect_reject(&e, code, reason);
  e_free(&e);
}

static void d_no_mda(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 69);
  e_bytes(b, "\x00\x00\x00\x00", 4);
}
static void d_no_typed(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 2);
  e_bytes(b, "\x00\x00\x00\x00", 4);
}
static void d_compressed_no_typed(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 2);
  e_tag(b, 56500);
  e_array(b, 3);
  e_text(b, "bslz4");
  e_uint(b, 2);
  e_bytes(b, "\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x20\x00", 12);
}
/* 40([[1, 2], 69(56500(X))]) with X from the arg: an array of `n` items or a map */
static void d_c56500(enc_t *b, void *a) {
  int n = *(int *)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 2);
  e_tag(b, 69);
  e_tag(b, 56500);
  if (n < 0) {
    e_map(b, 1);
    e_text(b, "bslz4");
    e_uint(b, 2);
    return;
  }
  e_array(b, (uint64_t)n);
  static const char blob[] = "\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x20\x00";
  if (n > 0) e_text(b, "bslz4");
  if (n > 1) e_uint(b, 2);
  if (n > 2) e_bytes(b, blob, 12);
  for (int i = 3; i < n; i++) e_uint(b, 0);
}
static void d_mda_bytes(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 40);
  e_bytes(b, "\x00\x00", 2);
}
static void d_other_tag(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 1);
  e_tag(b, 69);
  e_tag(b, 1);
  e_bytes(b, "\x00\x00", 2);
}
/* Raw data of `len` bytes under 40([[2, 3], 69(...)]). */
static void d_raw_len(enc_t *b, void *a) {
  size_t len = *(size_t *)a;
  uint8_t z[64] = {0};
  mda_raw(b, 2, 3, 69, z, len);
}
typedef struct comp_s {
  const char *alg;
  uint64_t modifier;
  uint64_t orig;
  size_t blob_len;
  unsigned tag;
  uint32_t y, x;
} comp_t;
static void d_comp(enc_t *b, void *a) {
  const comp_t *c = a;
  uint8_t blob[64] = {0};
  for (int i = 0; i < 8; i++) blob[i] = (uint8_t)(c->orig >> (56 - 8 * i));
  blob[10] = 0x20; /* block 8192 */
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, c->y);
  e_uint(b, c->x);
  e_tag(b, c->tag);
  e_tag(b, 56500);
  e_array(b, 3);
  e_text(b, c->alg);
  e_uint(b, c->modifier);
  e_bytes(b, blob, c->blob_len);
}
static void d_typed_tag(enc_t *b, void *a) {
  unsigned tag = *(unsigned *)a;
  uint8_t z[16] = {0};
  mda_raw(b, 1, 1, tag, z, tag == 64 ? 1 : tag == 69 ? 2 : tag == 70 || tag == 85 ? 4 : 8);
}
static void d_dims(enc_t *b, void *a) {
  int nd = *(int *)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, (uint64_t)nd);
  for (int i = 0; i < nd; i++) e_uint(b, 1);
  e_tag(b, 64);
  e_bytes(b, "\x00", 1);
}
static void d_dim_huge(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1ull << 32);
  e_uint(b, 1);
  e_tag(b, 64);
  e_bytes(b, "\x00", 1);
}
static void d_colmajor(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 1040);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 1);
  e_tag(b, 64);
  e_bytes(b, "\x00", 1);
}
static void d_mda_3(enc_t *b, void *a) {
  (void)a;
  e_tag(b, 40);
  e_array(b, 3);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 1);
  e_tag(b, 64);
  e_bytes(b, "\x00", 1);
  e_uint(b, 0);
}

/* 40([[1, 2], 69(56500([alg, mod, data]))]) with one field of the wrong type */
static void d_comp_types(enc_t *b, void *a) {
  int bad = *(int *)a;
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 2);
  e_tag(b, 69);
  e_tag(b, 56500);
  e_array(b, 3);
  if (bad == 0) e_bytes(b, "bslz4", 5);
  else e_text(b, "bslz4");
  if (bad == 1) e_int(b, -2);
  else e_uint(b, 2);
  if (bad == 2) e_textn(b, "\0\0\0\0\0\0\0\4\0\0\x20\0", 12);
  else e_bytes(b, "\0\0\0\0\0\0\0\4\0\0\x20\0", 12);
}

static void test_reject_nesting(void **state) {
  (void)state;
  const char *nest = "dectris v2: wrong tag nesting";
  expect_image_reject(d_no_mda, NULL, BEAM_EPROTO, nest);
  expect_image_reject(d_no_typed, NULL, BEAM_EPROTO, nest);
  expect_image_reject(d_compressed_no_typed, NULL, BEAM_EPROTO, nest);
  expect_image_reject(d_mda_bytes, NULL, BEAM_EPROTO, nest);
  expect_image_reject(d_other_tag, NULL, BEAM_EPROTO, nest);
  for (int n = -1; n <= 5; n++) {
    if (n == 3) continue;
    expect_image_reject(d_c56500, &n, BEAM_EPROTO, nest);
  }
  for (int bad = 0; bad < 3; bad++)
    expect_image_reject(d_comp_types, &bad, BEAM_EPROTO,
                        "dectris v2: compression tag is not [algorithm, modifier, bytes]");
  expect_image_reject(d_mda_3, NULL, BEAM_EPROTO, NULL);
  expect_image_reject(d_colmajor, NULL, BEAM_ENOTSUP, NULL);
  /* the good one of the same family is accepted */
  int three = 3;
  enc_t e = {0};
  image_with(&e, d_c56500, &three);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  assert_int_equal(m.image.data[0].codec, BEAM_CODEC_BSLZ4);
  assert_int_equal(m.image.data[0].size, 12);
  e_free(&e);
}

static void test_reject_sizes(void **state) {
  (void)state;
  for (size_t len = 0; len <= 14; len++) {
    if (len == 12) continue;
    expect_image_reject(d_raw_len, &len, BEAM_ESHAPE, "dectris v2: data size does not match dims x element size");
  }
  comp_t c = {"bslz4", 2, 12, 11, 69, 2, 3};
  expect_image_reject(d_comp, &c, BEAM_ESHAPE, "dectris v2: compressed blob under 12 bytes");
  c.blob_len = 0;
  expect_image_reject(d_comp, &c, BEAM_ESHAPE, "dectris v2: compressed blob under 12 bytes");
  c.blob_len = 12;
  c.orig = 14;
  expect_image_reject(d_comp, &c, BEAM_ESHAPE, "dectris v2: decoded size does not match dims x element size");
  c.orig = 12;
  c.modifier = 4;
  expect_image_reject(d_comp, &c, BEAM_ESHAPE,
                      "dectris v2: bitshuffle element size does not match the typed array");
  c.alg = "bszstd";
  expect_image_reject(d_comp, &c, BEAM_ESHAPE, NULL);
  c.alg = "lz4"; /* the lz4 modifier is not checked */
  {
    enc_t e = {0};
    image_with(&e, d_comp, &c);
    beam_dx_msg_t m;
    must_parse(&e, &m);
    assert_int_equal(m.image.data[0].codec, BEAM_CODEC_LZ4);
    assert_int_equal(m.image.data[0].raw_size, 12);
    e_free(&e);
  }
  /* dims x element size that overflows 64 bits */
  comp_t big = {"bslz4", 4, 0, 12, 70, 0xffffffffu, 0xffffffffu};
  expect_image_reject(d_comp, &big, BEAM_ESHAPE, NULL);
  expect_image_reject(d_dim_huge, NULL, BEAM_ESHAPE, NULL);
  for (int nd = 0; nd <= 4; nd++) {
    if (nd == 2) continue;
    expect_image_reject(d_dims, &nd, BEAM_ENOTSUP, "dectris v2: MultiDimArray without exactly 2 dims");
  }
}

static void test_reject_algorithm_and_types(void **state) {
  (void)state;
  static const char *const algs[] = {"zlib", "bszstd_rlehuf", "BSLZ4", "lz4 ", "", "bs"};
  for (size_t i = 0; i < sizeof algs / sizeof algs[0]; i++) {
    comp_t c = {algs[i], 2, 12, 12, 69, 2, 3};
    expect_image_reject(d_comp, &c, BEAM_ENOTSUP, "dectris v2: unknown compression algorithm");
  }
  for (unsigned tag = 64; tag <= 87; tag++) {
    if (tag == 64 || tag == 69 || tag == 70 || tag == 72 || tag == 77 || tag == 78 || tag == 85)
      continue;
    expect_image_reject(d_typed_tag, &tag, BEAM_ENOTSUP, "dectris v2: unsupported typed array");
  }
  unsigned t63 = 63, t88 = 88;
  expect_image_reject(d_typed_tag, &t63, BEAM_EPROTO, "dectris v2: wrong tag nesting");
  expect_image_reject(d_typed_tag, &t88, BEAM_EPROTO, "dectris v2: wrong tag nesting");
}

static void test_reject_framing(void **state) {
  (void)state;
  enc_t e = {0};
  const char *nosig = "dectris v2: no CBOR signature";
  expect_reject(&e, BEAM_EPROTO, nosig); /* empty */
  e_raw(&e, "\xd9\xd9", 2);
  expect_reject(&e, BEAM_EPROTO, nosig);
  e_free(&e);
  e_raw(&e, "\xd9\xd9\xf6\xa1\x64type\x63""end", 13);
  expect_reject(&e, BEAM_EPROTO, nosig);
  e_free(&e);
  e_raw(&e, "\xa1\x64type\x63""end", 10); /* no tag at all */
  expect_reject(&e, BEAM_EPROTO, nosig);
  e_free(&e);
  /* the valid version of the same */
  e_raw(&e, "\xd9\xd9\xf7\xa1\x64type\x63""end", 13);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  assert_int_equal(m.kind, BEAM_DX_END);
  e_byte(&e, 0x00); /* one byte too many */
  expect_reject(&e, BEAM_EPROTO, "dectris v2: bytes after the top-level map");
  e_free(&e);
  const char *notmap = "dectris v2: top level is not a map";
  e_sig(&e);
  e_array(&e, 2);
  e_text(&e, "type");
  e_text(&e, "end");
  expect_reject(&e, BEAM_EPROTO, notmap);
  e_free(&e);
  e_sig(&e);
  e_uint(&e, 1);
  expect_reject(&e, BEAM_EPROTO, notmap);
  e_free(&e);
  e_sig(&e);
  e_tag(&e, 55799);
  e_map(&e, 1);
  e_text(&e, "type");
  e_text(&e, "end");
  expect_reject(&e, BEAM_EPROTO, notmap);
  e_free(&e);
  e_sig(&e);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: CBOR item runs past the end of the message");
  e_free(&e);
  const char *first = "dectris v2: type is not the first key";
  e_sig(&e);
  e_map(&e, 0);
  expect_reject(&e, BEAM_EPROTO, first);
  e_free(&e);
  e_sig(&e);
  e_indef(&e, 5);
  e_break(&e);
  expect_reject(&e, BEAM_EPROTO, first);
  e_free(&e);
  e_sig(&e);
  e_map(&e, 2);
  e_text(&e, "series_id");
  e_uint(&e, 1);
  e_text(&e, "type");
  e_text(&e, "end");
  expect_reject(&e, BEAM_EPROTO, first);
  e_free(&e);
  e_sig(&e);
  e_map(&e, 1);
  e_uint(&e, 1);
  e_text(&e, "end");
  expect_reject(&e, BEAM_EPROTO, first);
  e_free(&e);
  e_sig(&e);
  e_map(&e, 1);
  e_text(&e, "Type");
  e_text(&e, "end");
  expect_reject(&e, BEAM_EPROTO, first);
  e_free(&e);
  e_sig(&e);
  e_map(&e, 1);
  e_text(&e, "type");
  e_uint(&e, 2);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: type is not a text string");
  e_free(&e);
  e_sig(&e);
  e_map(&e, 2);
  e_text(&e, "type");
  e_text(&e, "end");
  e_uint(&e, 5);
  e_uint(&e, 5);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: map key is not a text string");
  e_free(&e);
  e_sig(&e);
  e_map(&e, 3);
  e_text(&e, "type");
  e_text(&e, "end");
  e_text(&e, "series_id");
  e_uint(&e, 5);
  e_text(&e, "series_id");
  e_uint(&e, 6);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: duplicate key");
  e_free(&e);
  /* an indefinite-length string, a reserved head, a stray break */
  e_sig(&e);
  e_map(&e, 2);
  e_text(&e, "type");
  e_text(&e, "end");
  e_text(&e, "x");
  e_raw(&e, "\x7f\x61z\xff", 4);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: indefinite-length CBOR string");
  e_free(&e);
  e_sig(&e);
  e_map(&e, 2);
  e_text(&e, "type");
  e_text(&e, "end");
  e_text(&e, "x");
  e_byte(&e, 0x1d);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: CBOR reserved additional information");
  e_free(&e);
  e_sig(&e);
  e_map(&e, 2);
  e_text(&e, "type");
  e_text(&e, "end");
  e_text(&e, "x");
  e_break(&e);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: unexpected CBOR break");
  e_free(&e);
  /* NULL arguments */
  const char *why = NULL;
  assert_int_equal(beam_dx2_parse(NULL, 0, &m, &why), BEAM_EPROTO);
  assert_int_equal(beam_dx2_parse("\xd9\xd9\xf7", 3, NULL, &why), BEAM_EINVAL);
  assert_int_equal(beam_dx2_parse(NULL, 3, &m, &why), BEAM_EINVAL);
}

/* Lengths and counts far past the message, each at a place the decoder
 * reads: top-level map, key, string value, blob, channel array, data map. */
static void test_reject_huge(void **state) {
  (void)state;
  static const uint64_t huge[] = {0xffffffffffffffffull, 0x8000000000000000ull, 1ull << 40,
                                  0xffffffffu, 1000};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    uint64_t h = huge[i];
    for (int where = 0; where < 7; where++) {
      enc_t e = {0};
      e_sig(&e);
      if (where == 0) {
        e_head_w(&e, 5, h, 8);
        e_text(&e, "type");
        e_text(&e, "end");
      } else {
        e_map(&e, 2);
        e_text(&e, "type");
        e_text(&e, where == 5 || where == 6 ? "image" : "start");
        switch (where) {
        case 1: e_head_w(&e, 3, h, 8); e_raw(&e, "series_id", 9); break;
        case 2: e_text(&e, "series_unique_id"); e_head_w(&e, 3, h, 8); e_raw(&e, "abc", 3); break;
        case 3: e_text(&e, "countrate_correction_lookup_table"); e_tag(&e, 85); e_head_w(&e, 2, h, 8); break;
        case 4: e_text(&e, "channels"); e_head_w(&e, 4, h, 8); e_text(&e, "a"); break;
        case 5: e_text(&e, "data"); e_head_w(&e, 5, h, 4 + 4 * (h > 0xffffffffu)); e_text(&e, "a"); break;
        case 6:
          e_text(&e, "data");
          e_map(&e, 1);
          e_text(&e, "a");
          e_tag(&e, 40);
          e_array(&e, 2);
          e_array(&e, 2);
          e_uint(&e, 1);
          e_uint(&e, 1);
          e_tag(&e, 64);
          e_head_w(&e, 2, h, 8);
          e_byte(&e, 0);
          break;
        }
      }
      expect_reject(&e, BEAM_EPROTO, "dectris v2: CBOR item runs past the end of the message");
      e_free(&e);
    }
  }
}

/* user_data nested k deep: its outermost container is at depth 1, so 31
 * levels fit under the limit of 32 and 32 do not. */
static void deep_start(enc_t *e, unsigned k, int kind) {
  e_sig(e);
  e_map(e, 3);
  e_text(e, "type");
  e_text(e, "start");
  e_text(e, "series_id");
  e_uint(e, 1);
  e_text(e, "user_data");
  for (unsigned i = 0; i < k; i++) {
    if (kind == 0) e_array(e, 1);
    else if (kind == 1) {
      e_map(e, 1);
      e_text(e, "a");
    } else e_tag(e, 1000 + i);
  }
  e_uint(e, 9);
}

static void test_reject_depth(void **state) {
  (void)state;
  for (int kind = 0; kind < 3; kind++) {
    for (unsigned k = 29; k <= 33; k++) {
      enc_t e = {0};
      deep_start(&e, k, kind);
      if (k <= 31) {
        beam_dx_msg_t m;
        must_parse(&e, &m);
        char out[4096];
        int64_t n = beam_dx_meta_json(&m.start, 2, out, sizeof out, 64);
        if (n < 0) fail_msg("meta_json at depth %u: %s", k, beam_err_name((int)n));
        json_error_t err;
        json_t *j = json_loads(out, 0, &err);
        if (!j) fail_msg("bad JSON: %s in %s", err.text, out);
        json_t *u = json_object_get(j, "user_data");
        for (unsigned i = 0; i < k && kind < 2; i++) u = kind == 0 ? json_array_get(u, 0) : json_object_get(u, "a");
        assert_int_equal(json_integer_value(u), 9);
        json_decref(j);
      } else {
        expect_reject(&e, BEAM_EPROTO, "dectris v2: CBOR nesting too deep");
      }
      e_free(&e);
    }
  }
  /* tags on a plain value count too */
  for (unsigned k = 30; k <= 33; k++) {
    enc_t e = {0};
    e_sig(&e);
    e_map(&e, 2);
    e_text(&e, "type");
    e_text(&e, "end");
    e_text(&e, "series_id");
    for (unsigned i = 0; i < k; i++) e_tag(&e, 1);
    e_uint(&e, 77);
    beam_dx_msg_t m;
    const char *why;
    int rc = dx2(e.b, e.n, &m, &why);
    if (k <= 31) {
      assert_int_equal(rc, 0);
      assert_int_equal(m.end_series_id, 77);
    } else {
      assert_int_equal(rc, BEAM_EPROTO);
    }
    e_free(&e);
  }
}

static void test_reject_channels(void **state) {
  (void)state;
  /* five channels in start */
  enc_t e = {0};
  mapb_t m = {0};
  e_text(kv(&m, "type"), "start");
  enc_t *b = kv(&m, "channels");
  e_array(b, 5);
  for (int i = 0; i < 5; i++) e_textn(b, "vwxyz" + i, 1);
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ENOTSUP, "dectris v2: too many channels");
  e_free(&e);
  /* five in image data */
  chan_t ch[5];
  for (int i = 0; i < 5; i++) {
    static const char *names[5] = {"a", "b", "c", "d", "e"};
    ch[i] = (chan_t){names[i], 64, NULL, BEAM_CODEC_RAW, 2, 2, pixels(4, 1)};
  }
  build_image(&e, 1, ch, 5);
  expect_reject(&e, BEAM_ENOTSUP, "dectris v2: too many channels");
  e_free(&e);
  /* five flatfields */
  e_text(kv(&m, "type"), "start");
  b = kv(&m, "flatfield");
  e_map(b, 5);
  for (int i = 0; i < 5; i++) {
    e_text(b, ch[i].name);
    mda_raw(b, 1, 1, 85, "\0\0\0\0", 4);
  }
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ENOTSUP, "dectris v2: too many channels");
  e_free(&e);
  /* duplicate channel in data, in channels */
  ch[1].name = "a";
  build_image(&e, 1, ch, 2);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: duplicate channel name");
  e_free(&e);
  e_text(kv(&m, "type"), "start");
  b = kv(&m, "channels");
  e_array(b, 2);
  e_text(b, "x");
  e_text(b, "x");
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: duplicate channel name");
  e_free(&e);
  /* a 64-byte channel name does not fit; 63 does */
  char name[65];
  memset(name, 'n', 64);
  name[64] = 0;
  ch[1].name = name;
  build_image(&e, 1, ch, 2);
  expect_reject(&e, BEAM_ENOTSUP, "dectris v2: channel name over 63 bytes");
  e_free(&e);
  name[63] = 0;
  build_image(&e, 1, ch, 2);
  beam_dx_msg_t msg;
  must_parse(&e, &msg);
  assert_string_equal(msg.image.data[1].channel, name);
  e_free(&e);
  free_chans(ch, 5);
}

static void test_reject_fields(void **state) {
  (void)state;
  enc_t e = {0};
  mapb_t m = {0};
  enc_t *b;
  /* rationals */
  for (int v = 0; v < 7; v++) {
    e_text(kv(&m, "type"), "image");
    e_uint(kv(&m, "image_id"), 1);
    b = kv(&m, "real_time");
    switch (v) {
    case 0: e_array(b, 1); e_uint(b, 1); break;
    case 1: e_array(b, 2); e_uint(b, 1); e_uint(b, 0); break;
    case 2: e_array(b, 2); e_uint(b, 1); e_int(b, -1); break;
    case 3: e_array(b, 3); e_uint(b, 1); e_uint(b, 2); e_uint(b, 3); break;
    case 4: e_text(b, "1/2"); break;
    case 5: e_array(b, 2); e_double(b, 1.0); e_uint(b, 2); break;
    case 6: e_array(b, 0); break;
    }
    b = kv(&m, "data");
    e_map(b, 0);
    e_sig(&e);
    e_mapb(&e, &m);
    expect_reject(&e, BEAM_EPROTO, NULL);
    e_free(&e);
  }
  /* wrong types of start fields */
  static const char *const keys[] = {"series_id", "image_size_x", "count_time", "channels",
                                     "threshold_energy", "saturation_value", "image_dtype",
                                     "error_value", "flatfield", "series_unique_id"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    e_text(kv(&m, "type"), "start");
    b = kv(&m, "channels_");
    e_uint(b, 0);
    b = kv(&m, keys[i]);
    if (strcmp(keys[i], "series_id") == 0 || strcmp(keys[i], "image_size_x") == 0) e_int(b, -1);
    else if (strcmp(keys[i], "image_dtype") == 0 || strcmp(keys[i], "series_unique_id") == 0) e_uint(b, 2);
    else if (strcmp(keys[i], "channels") == 0) { e_array(b, 1); e_uint(b, 1); }
    else if (strcmp(keys[i], "threshold_energy") == 0) { e_map(b, 1); e_text(b, "a"); e_text(b, "b"); }
    else if (strcmp(keys[i], "flatfield") == 0) { e_array(b, 0); }
    else e_text(b, "x");
    e_sig(&e);
    e_mapb(&e, &m);
    expect_reject(&e, BEAM_EPROTO, NULL);
    e_free(&e);
  }
  /* values beamd cannot hold */
  e_text(kv(&m, "type"), "start");
  e_uint(kv(&m, "image_size_x"), 1ull << 32);
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ENOTSUP, NULL);
  e_free(&e);
  e_text(kv(&m, "type"), "start");
  e_uint(kv(&m, "error_value"), 1ull << 63);
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ENOTSUP, NULL);
  e_free(&e);
  e_text(kv(&m, "type"), "start");
  e_text(kv(&m, "image_dtype"), "complex256");
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ENOTSUP, "dectris v2: unknown image_dtype");
  e_free(&e);
  e_text(kv(&m, "type"), "start");
  e_text(kv(&m, "image_dtype"), "uint16_and_then_some");
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ENOTSUP, "dectris v2: unknown image_dtype");
  e_free(&e);
  /* an image needs image_id and data */
  e_text(kv(&m, "type"), "image");
  e_uint(kv(&m, "image_id"), 1);
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: image without data");
  e_free(&e);
  e_text(kv(&m, "type"), "image");
  e_map(kv(&m, "data"), 0);
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_EPROTO, "dectris v2: image without image_id");
  e_free(&e);
}

/* What is accepted though it is not what DECTRIS writes. */
static void test_accept_variants(void **state) {
  (void)state;
  enc_t e = {0};
  mapb_t m = {0};
  beam_dx_msg_t msg;
  /* non-preferred argument widths, a tag on a plain value, a 64-byte key of the wrong type */
  e_text(kv(&m, "type"), "image");
  enc_t *b = kv(&m, "image_id");
  e_tag(b, 1);
  e_head_w(b, 0, 5, 8);
  b = kv(&m, "series_id");
  e_head_w(b, 0, 9, 2);
  e_map(kv(&m, "data"), 0);
  e_text(kv(&m, "unknown"), "x");
  e_sig(&e);
  e_mapb(&e, &m);
  must_parse(&e, &msg);
  assert_int_equal(msg.image.image_id, 5);
  assert_int_equal(msg.image.series_id, 9);
  assert_int_equal(msg.image.nchannels, 0);
  assert_true(isnan(msg.image.real_time_s));
  assert_null(msg.image.user_data);
  e_free(&e);
  /* a 63-byte unknown key and a 64-byte one that would be known if cut */
  char k63[64], k64[65];
  memset(k63, 'k', 63);
  k63[63] = 0;
  memcpy(k64, "series_id", 9);
  memset(k64 + 9, '_', 55);
  k64[64] = 0;
  e_text(kv(&m, "type"), "end");
  e_text(kv(&m, k63), "x");
  e_text(kv(&m, k64), "not an integer");
  e_uint(kv(&m, "series_id"), 4);
  e_sig(&e);
  e_mapb(&e, &m);
  must_parse(&e, &msg);
  assert_int_equal(msg.end_series_id, 4);
  e_free(&e);
  /* series_unique_id is cut at 63 bytes, not inside a UTF-8 sequence */
  char uid[80];
  memset(uid, 'u', 62);
  memcpy(uid + 62, "\xc3\xa9tail", 7);
  e_text(kv(&m, "type"), "start");
  e_text(kv(&m, "series_unique_id"), uid);
  e_sig(&e);
  e_mapb(&e, &m);
  must_parse(&e, &msg);
  assert_int_equal(strlen(msg.start.series_unique_id), 62);
  assert_memory_equal(msg.start.series_unique_id, uid, 62);
  e_free(&e);
  memcpy(uid + 61, "\xc3\xa9", 3); /* exactly 63 bytes, ending in a whole 2-byte sequence */
  e_text(kv(&m, "type"), "start");
  e_text(kv(&m, "series_unique_id"), uid);
  e_sig(&e);
  e_mapb(&e, &m);
  must_parse(&e, &msg);
  assert_string_equal(msg.start.series_unique_id, uid);
  e_free(&e);
  /* the countrate table as a compressed typed array and as a MultiDimArray */
  e_text(kv(&m, "type"), "start");
  b = kv(&m, "countrate_correction_lookup_table");
  e_tag(b, 85);
  e_tag(b, 56500);
  e_array(b, 3);
  e_text(b, "bslz4");
  e_uint(b, 4);
  e_bytes(b, "\x00\x00\x00\x00\x00\x00\x0f\xa0\x00\x00\x20\x00", 12);
  e_sig(&e);
  e_mapb(&e, &m);
  must_parse(&e, &msg);
  assert_int_equal(msg.start.countrate.codec, BEAM_CODEC_BSLZ4);
  assert_int_equal(msg.start.countrate.shape[0], 1000);
  assert_int_equal(msg.start.countrate.raw_size, 4000);
  e_free(&e);
  e_text(kv(&m, "type"), "start");
  mda_raw(kv(&m, "countrate_correction_lookup_table"), 2, 2, 85, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
  e_sig(&e);
  e_mapb(&e, &m);
  must_parse(&e, &msg);
  assert_int_equal(msg.start.countrate.ndim, 2);
  e_free(&e);
  /* 1-D table whose size is not whole elements */
  e_text(kv(&m, "type"), "start");
  b = kv(&m, "countrate_correction_lookup_table");
  e_tag(b, 85);
  e_bytes(b, "\0\0\0\0\0\0", 6);
  e_sig(&e);
  e_mapb(&e, &m);
  expect_reject(&e, BEAM_ESHAPE, NULL);
  e_free(&e);
}

/* ---- meta_json ---- */

static json_t *jget(json_t *o, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  json_t *cur = o;
  for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
    cur = json_is_array(cur) ? json_array_get(cur, (size_t)atoi(tok)) : json_object_get(cur, tok);
  if (!cur) fail_msg("no %s in JSON", path);
  return cur;
}
static double jnum(json_t *o, const char *path) {
  json_t *v = jget(o, path);
  if (!json_is_number(v)) fail_msg("%s is not a number", path);
  return json_number_value(v);
}
static const char *jstr(json_t *o, const char *path) {
  json_t *v = jget(o, path);
  if (!json_is_string(v)) fail_msg("%s is not a string", path);
  return json_string_value(v);
}

static void test_meta_json_start(void **state) {
  (void)state;
  enc_t e = {0};
  size_t a, b;
  build_start(&e, &a, &b);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  size_t cap = 1 << 16;
  char *out = malloc(cap);
  int64_t n = beam_dx_meta_json(&m.start, 2, out, cap, 64);
  if (n < 0) fail_msg("meta_json: %s", beam_err_name((int)n));
  assert_int_equal(strlen(out), (size_t)n);
  json_error_t err;
  json_t *j = json_loads(out, 0, &err);
  if (!j) fail_msg("bad JSON (%s at %d): %s", err.text, err.position, out);
  assert_string_equal(jstr(j, "type"), "start");
  assert_true(jnum(j, "series_id") == 7);
  assert_true(json_is_integer(jget(j, "series_id")));
  assert_string_equal(jstr(j, "series_unique_id"), UID);
  assert_string_equal(jstr(j, "arm_date"), "2024-05-01T12:00:00.000Z"); /* tag 0 dropped */
  assert_true(jnum(j, "beam_center_y") == 512.0);
  assert_true(json_is_real(jget(j, "beam_center_y"))); /* written 512.0, not 512 */
  assert_non_null(strstr(out, "\"count_time\": 0.0005, ")); /* shortest exact form */
  assert_true(jnum(j, "count_time") == 0.0005); /* %.17g round-trips */
  assert_true(jnum(j, "incident_wavelength") == 0.99987);
  assert_true(jnum(j, "pixel_size_y") == (double)7.5e-5f);
  assert_true(jnum(j, "incident_energy") == 12400);
  assert_true(jnum(j, "threshold_energy.threshold_1") == 6200.0);
  assert_true(jnum(j, "threshold_energy.threshold_2") == 9000);
  assert_string_equal(jstr(j, "channels.1"), "threshold_2");
  assert_true(json_is_true(jget(j, "countrate_correction_enabled")));
  assert_true(json_is_false(jget(j, "flatfield_enabled")));
  assert_true(jnum(j, "detector_translation.2") == -0.12);
  assert_true(jnum(j, "goniometer.omega.start") == 10.0);
  assert_true(jnum(j, "goniometer.kappa.start") == -30);
  /* MultiDimArray summaries */
  assert_int_equal(json_array_size(jget(j, "flatfield.threshold_1.shape")), 2);
  assert_true(jnum(j, "flatfield.threshold_1.shape.0") == 4);
  assert_true(jnum(j, "flatfield.threshold_1.shape.1") == 6);
  assert_true(jnum(j, "flatfield.threshold_2.bytes") == 96);
  assert_true(jnum(j, "pixel_mask.threshold_1.bytes") == 96);
  /* a 32-byte typed array under max_inline 64: its numbers */
  json_t *ct = jget(j, "countrate_correction_lookup_table");
  assert_int_equal(json_array_size(ct), 8);
  for (int i = 0; i < 8; i++) assert_true(json_number_value(json_array_get(ct, (size_t)i)) == ctable[i]);
  assert_true(jnum(j, "small_typed_u16.1") == 258);
  assert_true(jnum(j, "typed_i16_be.0") == -2);
  assert_true(jnum(j, "typed_i16_be.1") == 5);
  assert_true(jnum(j, "typed_compressed.bytes") == 256);
  assert_true(jnum(j, "small_bytes.bytes") == 3);
  assert_string_equal(jstr(j, "small_bytes.base64"), "AQID");
  assert_true(jnum(j, "big_bytes.bytes") == 100);
  assert_null(json_object_get(jget(j, "big_bytes"), "base64"));
  /* user_data */
  assert_string_equal(jstr(j, "user_data.operator"), "ada");
  assert_true(jnum(j, "user_data.scan.2") == 3);
  assert_string_equal(jstr(j, "user_data.1"), "int key");
  assert_int_equal(json_object_size(jget(j, "user_data")), 7); /* the byte-string key is dropped */
  assert_true(json_is_null(jget(j, "user_data.nan")));
  assert_true(json_is_null(jget(j, "user_data.inf")));
  assert_string_equal(jstr(j, "user_data.esc"), "q\"b\\n\n\x01\xc3\xa9\x7f");
  assert_string_equal(jstr(j, "user_data.bad"), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  assert_true(jnum(j, "future_key.nested.1.a") == -5);
  assert_true(jnum(j, "future_key.when") == 1700000000);
  assert_true(json_is_null(jget(j, "future_key.undef")));
  assert_true(jnum(j, "neg") == -5);
  json_decref(j);

  /* max_inline 16: the table becomes a summary, small_bytes stays inline */
  n = beam_dx_meta_json(&m.start, 2, out, cap, 16);
  assert_true(n > 0);
  j = json_loads(out, 0, &err);
  assert_non_null(j);
  assert_true(jnum(j, "countrate_correction_lookup_table.bytes") == 32);
  assert_string_equal(jstr(j, "small_bytes.base64"), "AQID");
  assert_true(jnum(j, "small_typed_u16.0") == 1);
  json_decref(j);
  /* the limit itself is inline: 3-byte bytes at 3, a 4-byte typed array at 4 */
  n = beam_dx_meta_json(&m.start, 2, out, cap, 3);
  j = json_loads(out, 0, &err);
  assert_non_null(j);
  assert_string_equal(jstr(j, "small_bytes.base64"), "AQID");
  assert_true(jnum(j, "small_typed_u16.bytes") == 4);
  json_decref(j);
  n = beam_dx_meta_json(&m.start, 2, out, cap, 4);
  j = json_loads(out, 0, &err);
  assert_non_null(j);
  assert_true(jnum(j, "small_typed_u16.1") == 258);
  json_decref(j);
  n = beam_dx_meta_json(&m.start, 2, out, cap, 0);
  j = json_loads(out, 0, &err);
  assert_non_null(j);
  assert_true(jnum(j, "small_typed_u16.bytes") == 4);
  assert_null(json_object_get(jget(j, "small_bytes"), "base64"));
  json_decref(j);

  /* Capacity: every cap up to the length is ELIMIT and never written past;
   * length + 1 fits. The exact-size heap block lets ASan check the first. */
  int64_t full = beam_dx_meta_json(&m.start, 2, out, cap, 64);
  char *ref = strdup(out);
  for (size_t c = 0; c <= (size_t)full + 1; c++) {
    char *o = malloc(c + 8);
    memset(o, 0x5a, c + 8);
    int64_t r = beam_dx_meta_json(&m.start, 2, c ? o : NULL, c, 64);
    if (c <= (size_t)full) {
      if (r != BEAM_ELIMIT) fail_msg("cap %zu: got %lld", c, (long long)r);
      if (c) assert_true(memchr(o, 0, c) != NULL);
    } else {
      assert_int_equal(r, full);
      assert_string_equal(o, ref);
    }
    for (size_t i = c; i < c + 8; i++)
      if ((uint8_t)o[i] != 0x5a) fail_msg("cap %zu: byte %zu written", c, i);
    free(o);
  }
  free(ref);
  free(out);
  e_free(&e);
}

static void test_meta_json_misc(void **state) {
  (void)state;
  char out[512];
  /* Jungfraujoch start: indefinite map, error_value -1 */
  enc_t e = {0};
  build_jfj_start(&e);
  beam_dx_msg_t m;
  must_parse(&e, &m);
  int64_t n = beam_dx_meta_json(&m.start, 2, out, sizeof out, 0);
  assert_true(n > 0);
  json_error_t err;
  json_t *j = json_loads(out, 0, &err);
  if (!j) fail_msg("bad JSON: %s: %s", err.text, out);
  assert_true(jnum(j, "error_value") == -1);
  assert_true(jnum(j, "detector_distance") == 0.155);
  assert_true(jnum(j, "magic_number") == 0x52320004u);
  assert_string_equal(jstr(j, "channels.0"), "default");
  assert_true(jnum(j, "pixel_mask.default.shape.1") == 2);
  json_decref(j);
  e_free(&e);
  /* numbers JSON parsers may not hold, checked as text */
  e_sig(&e);
  e_map(&e, 4);
  e_text(&e, "type");
  e_text(&e, "start");
  e_text(&e, "a");
  e_head(&e, 1, UINT64_MAX);
  e_text(&e, "b");
  e_uint(&e, UINT64_MAX);
  e_text(&e, "c");
  e_double(&e, -INFINITY);
  must_parse(&e, &m);
  n = beam_dx_meta_json(&m.start, 2, out, sizeof out, 0);
  assert_true(n > 0);
  assert_string_equal(out, "{\"type\": \"start\", \"a\": -18446744073709551616, "
                           "\"b\": 18446744073709551615, \"c\": null}");
  e_free(&e);
  /* v1: the config part as it is */
  beam_dx_start_t s;
  memset(&s, 0, sizeof s);
  s.config = "{\"nimages\": 5}";
  s.config_len = 14;
  assert_int_equal(beam_dx_meta_json(&s, 1, out, sizeof out, 0), 14);
  assert_string_equal(out, "{\"nimages\": 5}");
  assert_int_equal(beam_dx_meta_json(&s, 1, out, 14, 0), BEAM_ELIMIT);
  assert_int_equal(beam_dx_meta_json(&s, 1, out, 15, 0), 14);
  s.config = NULL;
  s.config_len = 0;
  assert_int_equal(beam_dx_meta_json(&s, 1, out, sizeof out, 0), 2);
  assert_string_equal(out, "{}");
  assert_int_equal(beam_dx_meta_json(&s, 2, out, 2, 0), BEAM_ELIMIT);
  /* not CBOR; bad arguments */
  s.config = "{}";
  s.config_len = 2;
  assert_int_equal(beam_dx_meta_json(&s, 2, out, sizeof out, 0), BEAM_EPROTO);
  s.config = "\xd9\xd9\xf7\x82\x01\x02";
  s.config_len = 6;
  assert_int_equal(beam_dx_meta_json(&s, 2, out, sizeof out, 0), BEAM_EPROTO);
  s.config = "\xd9\xd9\xf7\xa1\x61";
  s.config_len = 5;
  assert_int_equal(beam_dx_meta_json(&s, 2, out, sizeof out, 0), BEAM_EPROTO);
  assert_int_equal(beam_dx_meta_json(&s, 3, out, sizeof out, 0), BEAM_EINVAL);
  assert_int_equal(beam_dx_meta_json(NULL, 2, out, sizeof out, 0), BEAM_EINVAL);
  assert_int_equal(beam_dx_meta_json(&s, 2, NULL, 10, 0), BEAM_EINVAL);
  assert_int_equal(beam_dx_meta_json(&s, 2, out, 0, 0), BEAM_ELIMIT);
}

static void le_bytes(uint8_t *p, uint64_t v, unsigned n) {
  for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Typed arrays of every kind, keys JSON has no form for, tags that only
 * look like arrays, and UTF-8 edge cases, all in user_data. */
static void test_meta_json_typed(void **state) {
  (void)state;
  enc_t e = {0};
  mapb_t m = {0};
  uint8_t b16[16];
  e_text(kv(&m, "type"), "start");
  enc_t *b = kv(&m, "user_data");
  e_map(b, 20);
  double f64[2] = {1.5, -2.25};
  for (int i = 0; i < 2; i++) {
    uint64_t v;
    memcpy(&v, &f64[i], 8);
    le_bytes(b16 + 8 * i, v, 8);
  }
  e_text(b, "f64");
  e_tag(b, 86);
  e_bytes(b, b16, 16);
  le_bytes(b16, (uint64_t)-3, 8);
  le_bytes(b16 + 8, (uint64_t)INT64_MIN, 8);
  e_text(b, "i64");
  e_tag(b, 79);
  e_bytes(b, b16, 16);
  e_text(b, "u64be");
  e_tag(b, 67);
  e_bytes(b, "\0\0\0\0\0\0\1\0", 8);
  e_text(b, "i32le");
  e_tag(b, 78);
  e_bytes(b, "\xfe\xff\xff\xff", 4);
  e_text(b, "u8c");
  e_tag(b, 68);
  e_bytes(b, "\xff", 1);
  e_text(b, "f16be");
  e_tag(b, 80);
  e_bytes(b, "\x3c\x00\xc0\x00", 4);
  e_text(b, "f32be");
  e_tag(b, 81);
  e_bytes(b, "\x3f\xc0\x00\x00", 4);
  e_text(b, "f128");
  e_tag(b, 87);
  e_bytes(b, b16, 16);
  e_text(b, "r76");
  e_tag(b, 76);
  e_bytes(b, "\0", 1);
  e_text(b, "ragged");
  e_tag(b, 69);
  e_bytes(b, "\0\0\0", 3);
  e_text(b, "badmda"); /* tag 40 on something that is not [dims, typed] */
  e_tag(b, 40);
  e_array(b, 2);
  e_uint(b, 1);
  e_uint(b, 2);
  e_text(b, "badtyped");
  e_tag(b, 69);
  e_text(b, "text");
  e_text(b, "mda3");
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 3);
  e_uint(b, 2);
  e_uint(b, 3);
  e_uint(b, 4);
  e_tag(b, 64);
  {
    uint8_t z[24] = {0};
    e_bytes(b, z, 24);
  }
  e_text(b, "mdacomp");
  e_tag(b, 40);
  e_array(b, 2);
  e_array(b, 2);
  e_uint(b, 2);
  e_uint(b, 2);
  e_tag(b, 69);
  e_tag(b, 56500);
  e_array(b, 3);
  e_text(b, "bslz4");
  e_uint(b, 2);
  e_bytes(b, "\0\0\0\0\0\0\0\x08\0\0\x20\0", 12);
  e_int(b, -3); /* keys */
  e_text(b, "neg key");
  e_half(b, 0x3e00);
  e_text(b, "float key");
  e_bool(b, 1);
  e_text(b, "bool key");
  e_tag(b, 1);
  e_text(b, "tagged");
  e_text(b, "tagged key");
  e_array(b, 1); /* dropped with its value */
  e_uint(b, 1);
  e_map(b, 1);
  e_text(b, "x");
  e_uint(b, 2);
  e_text(b, "utf8");
  e_text(b, "\xf0\x9f\x98\x80|\xf0\x9f\x98|\xf4\x90\x80\x80|\xe0\x80\xaf|\xc0\xaf");
  e_sig(&e);
  e_mapb(&e, &m);
  beam_dx_msg_t msg;
  must_parse(&e, &msg);
  char out[4096];
  int64_t n = beam_dx_meta_json(&msg.start, 2, out, sizeof out, 64);
  assert_true(n > 0);
  json_error_t err;
  json_t *j = json_loads(out, 0, &err);
  if (!j) fail_msg("bad JSON (%s): %s", err.text, out);
  json_t *u = jget(j, "user_data");
  assert_true(jnum(u, "f64.0") == 1.5);
  assert_true(jnum(u, "f64.1") == -2.25);
  assert_int_equal(json_integer_value(jget(u, "i64.0")), -3);
  assert_true(json_integer_value(jget(u, "i64.1")) == INT64_MIN);
  assert_int_equal(json_integer_value(jget(u, "u64be.0")), 256);
  assert_int_equal(json_integer_value(jget(u, "i32le.0")), -2);
  assert_int_equal(json_integer_value(jget(u, "u8c.0")), 255);
  assert_true(jnum(u, "f16be.0") == 1.0);
  assert_true(jnum(u, "f16be.1") == -2.0);
  assert_true(jnum(u, "f32be.0") == 1.5);
  assert_true(jnum(u, "f128.bytes") == 16);
  assert_true(jnum(u, "r76.bytes") == 1);
  assert_true(jnum(u, "ragged.bytes") == 3);
  assert_true(jnum(u, "badmda.1") == 2);
  assert_string_equal(jstr(u, "badtyped"), "text");
  assert_true(jnum(u, "mda3.shape.2") == 4);
  assert_true(jnum(u, "mda3.bytes") == 24);
  assert_true(jnum(u, "mdacomp.bytes") == 8);
  assert_string_equal(jstr(u, "-3"), "neg key");
  assert_string_equal(json_string_value(json_object_get(u, "1.5")), "float key");
  assert_string_equal(jstr(u, "true"), "bool key");
  assert_string_equal(jstr(u, "tagged"), "tagged key");
  assert_int_equal(json_object_size(u), 19);
  assert_string_equal(jstr(u, "utf8"), "\xf0\x9f\x98\x80|\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|"
                                       "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|"
                                       "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd");
  json_decref(j);
  e_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cbor_half),
      cmocka_unit_test(test_cbor_read),
      cmocka_unit_test(test_cbor_malformed),
      cmocka_unit_test(test_cbor_depth),
      cmocka_unit_test(test_cbor_iter),
      cmocka_unit_test(test_start_full),
      cmocka_unit_test(test_start_jungfraujoch),
      cmocka_unit_test(test_image_raw),
      cmocka_unit_test(test_image_compressed),
      cmocka_unit_test(test_image_large),
      cmocka_unit_test(test_image_channels),
      cmocka_unit_test(test_end_and_other),
      cmocka_unit_test(test_reject_nesting),
      cmocka_unit_test(test_reject_sizes),
      cmocka_unit_test(test_reject_algorithm_and_types),
      cmocka_unit_test(test_reject_framing),
      cmocka_unit_test(test_reject_huge),
      cmocka_unit_test(test_reject_depth),
      cmocka_unit_test(test_reject_channels),
      cmocka_unit_test(test_reject_fields),
      cmocka_unit_test(test_accept_variants),
      cmocka_unit_test(test_meta_json_start),
      cmocka_unit_test(test_meta_json_misc),
      cmocka_unit_test(test_meta_json_typed),
  };
  return beam_run_tests(tests, NULL, NULL);
}
