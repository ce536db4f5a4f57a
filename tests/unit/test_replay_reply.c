/* Unit tests of the replay input's reply parser (daemon/replay_reply.c):
 * good replies inline, in landing slots and read in place, and every
 * malformed case the daemon skips, each with its reason and its part.
 *
 * RR_SEED_DIR=dir writes the replies built here as fuzz seeds for
 * tests/fuzz/fuzz_replay_reply.c (replay_reply_*.parts: the ask byte, then
 * the .parts layout). */
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

#include "daemon/replay_reply.h"

#define MAXP 64

/* A reply under construction: parts point into hdr[] or static strings. */
typedef struct reply_s {
  beam_part_t p[MAXP];
  uint8_t hdr[MAXP][BEAM_HDR_SIZE_V1];
  size_t n;
} reply_t;

static uint8_t payload[64];

static void status(reply_t *r, const char *json) {
  r->n = 0;
  r->p[r->n++] = (beam_part_t){json, strlen(json), NULL};
}

/* A message: type, codec, payload parts (each `part_bytes` long, carrying
 * payload_size), metadata or not; a FRAME without parts is CORRUPT. */
static void msg(reply_t *r, unsigned type, unsigned codec, unsigned nparts, size_t part_bytes,
                uint64_t payload_size, int meta) {
  beam_hdr_t h = {0};
  h.type = (uint16_t)type;
  h.dtype = BEAM_DT_U16;
  h.ndim = 2;
  h.shape[0] = 4;
  h.shape[1] = 8;
  h.raw_size = 64;
  h.codec = (uint8_t)codec;
  h.nparts = (uint8_t)nparts;
  h.payload_size = payload_size;
  h.flags = meta ? BEAM_FLAG_META : 0;
  h.meta_size = meta ? 2 : 0;
  if (type == BEAM_MSG_FRAME && nparts == 0)
    h.flags |= BEAM_FLAG_CORRUPT; /* the one FRAME without a payload */
  h.series_id = 7;
  assert_int_equal(beam_hdr_encode(&h, r->hdr[r->n], BEAM_HDR_SIZE_V1), BEAM_HDR_SIZE_V1);
  r->p[r->n] = (beam_part_t){r->hdr[r->n], BEAM_HDR_SIZE_V1, NULL};
  r->n++;
  for (unsigned i = 0; i < nparts; i++)
    r->p[r->n++] = (beam_part_t){payload, part_bytes, NULL};
  if (meta)
    r->p[r->n++] = (beam_part_t){"{}", 2, NULL};
}

static void frame_inline(reply_t *r) { msg(r, BEAM_MSG_FRAME, BEAM_CODEC_RAW, 1, 64, 64, 0); }
/* A FRAME whose payload is elsewhere: an empty part standing for 48 bytes. */
static void frame_away(reply_t *r) { msg(r, BEAM_MSG_FRAME, BEAM_CODEC_LZ4, 1, 0, 48, 0); }

static unsigned ask_byte(const beamd_rr_ask_t *a) {
  unsigned k = 0;
  while (k < 7 && ((size_t)64 << k) < a->slot_bytes)
    k++;
  return (unsigned)a->info | (unsigned)a->map << 1 | (a->noffer > 7 ? 7 : a->noffer) << 2 | k << 5;
}

static void seed(const char *name, const reply_t *r, const beamd_rr_ask_t *a) {
  const char *dir = getenv("RR_SEED_DIR");
  if (!dir)
    return;
  char path[512];
  snprintf(path, sizeof path, "%s/replay_reply_%s.parts", dir, name);
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputc((int)ask_byte(a), f);
  for (size_t i = 0; i < r->n; i++) {
    uint8_t len[4] = {(uint8_t)r->p[i].size, (uint8_t)(r->p[i].size >> 8),
                      (uint8_t)(r->p[i].size >> 16), (uint8_t)(r->p[i].size >> 24)};
    assert_int_equal(fwrite(len, 1, 4, f), 4);
    assert_int_equal(fwrite(r->p[i].data, 1, r->p[i].size, f), r->p[i].size);
  }
  fclose(f);
}

/* Reads every message into m[]; returns how many, *rc the last result. */
static size_t read_all(beamd_rr_t *rr, beamd_rr_msg_t *m, int *rc) {
  size_t k = 0;
  while (k < MAXP && (*rc = beamd_rr_next(rr, &m[k])) > 0)
    k++;
  return k;
}

static const char *GET_OK = "{\"ok\":true,\"id\":5,\"next\":12,\"count\":2,\"total\":100,"
                            "\"loop\":false,\"eof\":false,\"file\":\"/d/x.h5\",\"file_id\":"
                            "\"0123456789abcdef\",\"corrupt\":1}";

static void test_get_inline(void **state) {
  (void)state;
  reply_t r;
  status(&r, GET_OK);
  msg(&r, BEAM_MSG_SERIES_START, BEAM_CODEC_RAW, 0, 0, 0, 1);
  frame_inline(&r);
  msg(&r, BEAM_MSG_FRAME, BEAM_CODEC_RAW, 0, 0, 0, 1); /* CORRUPT-like: no payload */
  msg(&r, BEAM_MSG_SERIES_END, BEAM_CODEC_RAW, 0, 0, 0, 0);
  beamd_rr_ask_t ask = {0};
  seed("get_inline", &r, &ask);
  beamd_rr_t rr;
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_true(rr.st.ok && rr.st.has_id);
  assert_int_equal(rr.st.id, 5);
  assert_int_equal(rr.st.next, 12);
  assert_int_equal(rr.st.count, 2);
  assert_true(rr.st.has_total);
  assert_int_equal(rr.st.total, 100);
  assert_int_equal(rr.st.corrupt, 1);
  assert_string_equal(rr.st.file, "/d/x.h5");
  assert_string_equal(rr.st.file_id, "0123456789abcdef");
  assert_false(rr.st.loop || rr.st.eof || rr.st.shm || rr.st.has_map || rr.in_shm);
  beamd_rr_msg_t m[MAXP];
  int rc;
  assert_int_equal(read_all(&rr, m, &rc), 4);
  assert_int_equal(rc, 0);
  assert_int_equal(m[0].part, 1);
  assert_int_equal(m[0].nparts, 2);
  assert_false(m[0].is_frame);
  assert_int_equal(m[1].part, 3);
  assert_int_equal(m[1].nparts, 2);
  assert_true(m[1].is_frame);
  assert_int_equal(m[1].frame, 0);
  assert_int_equal(m[1].src, BEAMD_RR_INLINE);
  assert_int_equal(m[2].frame, 1);
  assert_int_equal(m[3].h.type, BEAM_MSG_SERIES_END);
  assert_int_equal(beamd_rr_next(&rr, m), 0); /* the end stays the end */
  beamd_rr_release(&rr);
}

static void test_info(void **state) {
  (void)state;
  reply_t r;
  status(&r, "{\"ok\":true,\"op\":\"info\",\"id\":1,\"next\":0,\"count\":0,\"total\":10,"
             "\"loop\":true,\"dtype\":\"uint16\",\"shape\":[512,1024]}");
  beamd_rr_ask_t ask = {.info = 1};
  seed("info", &r, &ask);
  beamd_rr_t rr;
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_true(rr.st.loop && rr.st.has_frame_bytes);
  assert_int_equal(rr.st.frame_bytes, 2u * 512 * 1024);
  beamd_rr_msg_t m;
  assert_int_equal(beamd_rr_next(&rr, &m), 0);
  beamd_rr_release(&rr);
  /* An unknown dtype still counts as given (0 bytes), as the daemon read it. */
  status(&r, "{\"ok\":true,\"dtype\":\"nonesuch\",\"shape\":[2,2]}");
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_true(rr.st.has_frame_bytes);
  assert_int_equal(rr.st.frame_bytes, 0);
  assert_null(rr.st.file_id);
  assert_false(rr.st.has_id || rr.st.has_total);
  beamd_rr_release(&rr);
}

static void test_bad_status(void **state) {
  (void)state;
  static const char *bad[] = {"", "not json", "[1,2]", "{\"ok\":", "42"};
  beamd_rr_ask_t ask = {0};
  beamd_rr_t rr;
  beamd_rr_msg_t m;
  reply_t r;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    status(&r, bad[i]);
    frame_inline(&r);
    assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), -BEAMD_RR_ESTATUS);
    assert_true(rr.why[0] != 0);
    assert_false(rr.st.has_id);
    assert_int_equal(beamd_rr_next(&rr, &m), -BEAMD_RR_ESTATUS);
    beamd_rr_release(&rr);
  }
  assert_int_equal(beamd_rr_parse(&rr, r.p, 0, &ask), -BEAMD_RR_ESTATUS);
  assert_non_null(strstr(rr.why, "missing"));
  beamd_rr_release(&rr);
}

static void test_refused(void **state) {
  (void)state;
  reply_t r;
  beamd_rr_ask_t ask = {0};
  beamd_rr_t rr;
  status(&r, "{\"ok\":false,\"id\":9,\"error\":\"credit 0 out of range\"}");
  seed("refused", &r, &ask);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), -BEAMD_RR_EREFUSED);
  assert_true(rr.st.has_id); /* still matched to its request */
  assert_int_equal(rr.st.id, 9);
  assert_string_equal(rr.st.error, "credit 0 out of range");
  assert_non_null(strstr(rr.why, "credit 0 out of range"));
  beamd_rr_release(&rr);
  status(&r, "{\"id\":3}"); /* no "ok" at all */
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), -BEAMD_RR_EREFUSED);
  assert_null(rr.st.error);
  beamd_rr_release(&rr);
}

static void test_undecodable(void **state) {
  (void)state;
  reply_t r;
  beamd_rr_ask_t ask = {0};
  beamd_rr_t rr;
  beamd_rr_msg_t m[MAXP];
  int rc;
  /* A good FRAME, then a part that is no header. */
  status(&r, GET_OK);
  frame_inline(&r);
  r.p[r.n++] = (beam_part_t){"garbage", 7, NULL};
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 1);
  assert_int_equal(rc, -BEAMD_RR_EMSG);
  assert_int_equal(rr.err_part, 3);
  assert_non_null(strstr(rr.why, "header"));
  assert_string_equal(beamd_rr_what(rc), "an undecodable message");
  assert_int_equal(beamd_rr_next(&rr, m), -BEAMD_RR_EMSG);
  beamd_rr_release(&rr);
  /* A header naming more parts than are left. */
  status(&r, GET_OK);
  frame_inline(&r);
  r.n--; /* its payload part gone */
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 0);
  assert_int_equal(rc, -BEAMD_RR_EMSG);
  assert_int_equal(rr.err_part, 1);
  assert_non_null(strstr(rr.why, "parts"));
  beamd_rr_release(&rr);
}

static void test_landed(void **state) {
  (void)state;
  reply_t r;
  beamd_rr_ask_t ask = {.noffer = 2, .slot_bytes = 64};
  beamd_rr_t rr;
  beamd_rr_msg_t m[MAXP];
  int rc;
  status(&r, "{\"ok\":true,\"next\":2,\"count\":2,\"shm\":true}");
  frame_away(&r);
  frame_inline(&r); /* a FRAME with its payload inline keeps its slot unused */
  seed("landed", &r, &ask);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_true(rr.in_shm);
  assert_int_equal(read_all(&rr, m, &rc), 2);
  assert_int_equal(rc, 0);
  assert_int_equal(m[0].src, BEAMD_RR_LANDED);
  assert_int_equal(m[0].frame, 0);
  assert_int_equal(m[1].src, BEAMD_RR_INLINE);
  beamd_rr_release(&rr);
  /* More landed FRAMEs than slots offered. */
  frame_away(&r);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 2);
  assert_int_equal(rc, -BEAMD_RR_ESLOT);
  assert_int_equal(rr.err_part, 5);
  assert_non_null(strstr(beamd_rr_what(rc), "landing slot it was not offered"));
  beamd_rr_release(&rr);
  /* A payload larger than a slot. */
  ask.slot_bytes = 32;
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 0);
  assert_int_equal(rc, -BEAMD_RR_ESLOT);
  assert_int_equal(rr.err_part, 1);
  beamd_rr_release(&rr);
  /* The server did not use the slots: an empty part is an empty payload. */
  status(&r, "{\"ok\":true,\"shm\":false,\"shm_error\":\"--no-shm\"}");
  frame_away(&r);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_false(rr.in_shm);
  assert_string_equal(rr.st.shm_error, "--no-shm");
  assert_int_equal(read_all(&rr, m, &rc), 1);
  assert_int_equal(rc, 0);
  assert_int_equal(m[0].src, BEAMD_RR_INLINE);
  beamd_rr_release(&rr);
}

static const char *MAP_OK = "{\"ok\":true,\"next\":3,\"count\":3,\"map\":{\"files\":["
                            "{\"path\":\"/proc/1/fd/3\",\"name\":\"/d/a.h5\"},"
                            "{\"path\":\"/proc/1/fd/4\"}],\"at\":[[1,4096],null]}}";

static void test_mapped(void **state) {
  (void)state;
  reply_t r;
  beamd_rr_ask_t ask = {.map = 1};
  beamd_rr_t rr;
  beamd_rr_msg_t m[MAXP];
  int rc;
  status(&r, MAP_OK);
  msg(&r, BEAM_MSG_SERIES_START, BEAM_CODEC_RAW, 0, 0, 0, 0);
  frame_away(&r);
  frame_inline(&r); /* at[1] null */
  frame_inline(&r); /* past the end of at */
  seed("mapped", &r, &ask);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_true(rr.map_ok && rr.st.has_map);
  assert_int_equal(rr.nfiles, 2);
  assert_string_equal(rr.files[0].name, "/d/a.h5");
  assert_string_equal(rr.files[1].name, "/proc/1/fd/4"); /* no name: the path */
  assert_int_equal(read_all(&rr, m, &rc), 4);
  assert_int_equal(rc, 0);
  assert_int_equal(m[1].src, BEAMD_RR_MAPPED);
  assert_int_equal(m[1].file, 1);
  assert_int_equal(m[1].off, 4096);
  assert_int_equal(m[2].src, BEAMD_RR_INLINE);
  assert_int_equal(m[3].src, BEAMD_RR_INLINE);
  beamd_rr_release(&rr);
  /* Not asked for: "map" is not read at all. */
  beamd_rr_ask_t plain = {0};
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &plain), 0);
  assert_int_equal(rr.nfiles, 0);
  assert_int_equal(read_all(&rr, m, &rc), 4);
  assert_int_equal(m[1].src, BEAMD_RR_INLINE);
  beamd_rr_release(&rr);
  /* Refused: absent, with the reason. */
  status(&r, "{\"ok\":true,\"count\":1,\"map_error\":\"--no-map\"}");
  frame_inline(&r);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_false(rr.st.has_map);
  assert_string_equal(rr.st.map_error, "--no-map");
  assert_int_equal(read_all(&rr, m, &rc), 1);
  assert_int_equal(rc, 0);
  beamd_rr_release(&rr);
}

/* Each malformed "map": the messages before the first FRAME are taken,
 * that FRAME is the error. */
static void test_mapped_bad(void **state) {
  (void)state;
  static const struct {
    const char *st;
    size_t nfiles;  /* files read before the fault */
    int frames_ok;  /* FRAMEs taken before the fault */
    const char *why;
  } c[] = {
      {"{\"ok\":true,\"map\":true}", 0, 0, "both arrays"},
      {"{\"ok\":true,\"map\":{\"files\":[],\"at\":{}}}", 0, 0, "both arrays"},
      {"{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"},{\"name\":\"b\"}],\"at\":[]}}", 1, 0,
       "\"path\""},
      {"{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"}],\"at\":[[0]]}}", 1, 0, "\"at\"[0]"},
      {"{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"}],\"at\":[[1,0]]}}", 1, 0, "\"at\"[0]"},
      {"{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"}],\"at\":[[0,-1]]}}", 1, 0, "\"at\"[0]"},
      {"{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"}],\"at\":[null,[0,1.5]]}}", 1, 1,
       "\"at\"[1]"},
      {"{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"}],\"at\":[\"x\"]}}", 1, 0, "\"at\"[0]"},
  };
  beamd_rr_ask_t ask = {.map = 1};
  beamd_rr_t rr;
  beamd_rr_msg_t m[MAXP];
  reply_t r;
  int rc;
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    status(&r, c[i].st);
    msg(&r, BEAM_MSG_SERIES_START, BEAM_CODEC_RAW, 0, 0, 0, 0);
    frame_away(&r);
    frame_away(&r);
    assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
    assert_int_equal(rr.nfiles, c[i].nfiles);
    assert_int_equal(read_all(&rr, m, &rc), 1 + c[i].frames_ok);
    assert_int_equal(rc, -BEAMD_RR_EMAP);
    assert_int_equal(rr.err_part, 2 + 2 * (size_t)c[i].frames_ok);
    assert_non_null(strstr(rr.why, c[i].why));
    assert_string_equal(beamd_rr_what(rc), "a malformed in-place file reference");
    beamd_rr_release(&rr);
  }
  /* Without a FRAME a malformed "map" harms nothing. */
  status(&r, c[0].st);
  msg(&r, BEAM_MSG_SERIES_END, BEAM_CODEC_RAW, 0, 0, 0, 0);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 1);
  assert_int_equal(rc, 0);
  beamd_rr_release(&rr);
  /* Too many files. */
  char big[4096];
  int n = snprintf(big, sizeof big, "{\"ok\":true,\"map\":{\"at\":[],\"files\":[");
  for (int i = 0; i <= BEAMD_RR_FILES_MAX; i++)
    n += snprintf(big + n, sizeof big - (size_t)n, "%s{\"path\":\"/p\"}", i ? "," : "");
  snprintf(big + n, sizeof big - (size_t)n, "]}}");
  status(&r, big);
  frame_away(&r);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(rr.nfiles, 0);
  assert_int_equal(read_all(&rr, m, &rc), 0);
  assert_int_equal(rc, -BEAMD_RR_EMAP);
  assert_non_null(strstr(rr.why, "more than"));
  beamd_rr_release(&rr);
  /* Read in place, but with a payload inline. */
  status(&r, "{\"ok\":true,\"map\":{\"files\":[{\"path\":\"/a\"}],\"at\":[[0,8]]}}");
  frame_inline(&r);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 0);
  assert_int_equal(rc, -BEAMD_RR_EMAP);
  assert_non_null(strstr(rr.why, "read in place but"));
  beamd_rr_release(&rr);
}

/* Bytes from a fixed generator: the parser says why or takes the message,
 * and its messages tile the parts it was given. */
static void test_noise(void **state) {
  (void)state;
  static uint8_t buf[MAXP][160];
  uint64_t x = 88172645463325252ull;
  reply_t good;
  status(&good, MAP_OK);
  frame_away(&good);
  frame_inline(&good);
  for (int it = 0; it < 20000; it++) {
    beam_part_t p[MAXP];
    size_t n = 1 + (size_t)(it % 7);
    for (size_t i = 0; i < n; i++) {
      /* Mostly good parts with a byte flipped, so the checks past the
       * header decoder are reached too. */
      const beam_part_t *g = &good.p[i % good.n];
      size_t len = g->size < sizeof buf[i] ? g->size : sizeof buf[i];
      memcpy(buf[i], g->data, len);
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      if (len && (x & 3))
        buf[i][(x >> 8) % len] ^= (uint8_t)(x >> 32);
      p[i] = (beam_part_t){buf[i], len, NULL};
    }
    beamd_rr_ask_t ask = {(int)(x >> 40) & 1, (int)(x >> 41) & 1, (unsigned)(x >> 42) & 3, 64};
    beamd_rr_t rr;
    int rc = beamd_rr_parse(&rr, p, n, &ask);
    assert_true(rc == 0 || rr.why[0]);
    beamd_rr_msg_t m;
    size_t pos = 1;
    int got;
    while ((got = beamd_rr_next(&rr, &m)) > 0) {
      assert_int_equal(m.part, pos);
      pos += m.nparts;
      assert_true(pos <= n);
    }
    if (got < 0)
      assert_true(rr.why[0] != 0);
    beamd_rr_release(&rr);
  }
}

/* A SERIES_START of the 4x8 uint16 frames with metadata `meta` and
 * nparts payload parts of part_bytes each. */
static void start(reply_t *r, const char *meta, unsigned codec, unsigned nparts, size_t part_bytes,
                  uint64_t payload_size) {
  beam_hdr_t h = {0};
  h.type = BEAM_MSG_SERIES_START;
  h.dtype = BEAM_DT_U16;
  h.ndim = 2;
  h.shape[0] = 4;
  h.shape[1] = 8;
  h.raw_size = 64;
  h.codec = (uint8_t)codec;
  h.nparts = (uint8_t)nparts;
  h.payload_size = payload_size;
  h.flags = meta ? BEAM_FLAG_META : 0;
  h.meta_size = meta ? (uint32_t)strlen(meta) : 0;
  h.series_id = 7;
  assert_int_equal(beam_hdr_encode(&h, r->hdr[r->n], BEAM_HDR_SIZE_V1), BEAM_HDR_SIZE_V1);
  r->p[r->n] = (beam_part_t){r->hdr[r->n], BEAM_HDR_SIZE_V1, NULL};
  r->n++;
  for (unsigned i = 0; i < nparts; i++)
    r->p[r->n++] = (beam_part_t){payload, part_bytes, NULL};
  if (meta)
    r->p[r->n++] = (beam_part_t){meta, strlen(meta), NULL};
}

#define MASK_META "{\"detector\":\"x\",\"mask\":{\"array\":\"pixel_mask\",\"dtype\":\"uint16\"," \
                  "\"shape\":[4,8],\"dataset\":\"/entry/instrument/detector/pixel_mask\"}}"

static void test_mask(void **state) {
  (void)state;
  reply_t r;
  status(&r, GET_OK);
  start(&r, MASK_META, BEAM_CODEC_RAW, 1, 64, 64);
  frame_inline(&r);
  beamd_rr_ask_t ask = {0};
  seed("start_mask", &r, &ask);
  uint16_t v[32] = {0};
  v[3] = 8;      /* hot (DECTRIS bit 3) */
  v[9] = 1;      /* gap */
  v[31] = 65535; /* a value above 16 bits, as the server sends it */
  memcpy(payload, v, sizeof v);
  beamd_rr_t rr;
  beamd_rr_msg_t m[4];
  int rc;
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 2);
  assert_int_equal(rc, 0);
  assert_int_equal(m[0].mask, BEAMD_RR_MASK_OK);
  assert_ptr_equal(m[0].mask_data, payload);
  assert_int_equal(m[0].nparts, 3);
  assert_int_equal(m[1].mask, BEAMD_RR_MASK_NONE);
  uint32_t out[32];
  assert_int_equal(beamd_rr_mask_u32((beam_dtype_t)m[0].h.dtype, m[0].mask_data, 32, out), 0);
  for (int i = 0; i < 32; i++)
    assert_int_equal(out[i], v[i]);
  beamd_rr_release(&rr);
  memset(payload, 0, sizeof payload);

  /* A start without payload or description carries no mask and is no fault. */
  status(&r, GET_OK);
  start(&r, "{\"detector\":\"x\"}", BEAM_CODEC_RAW, 0, 0, 0);
  assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
  assert_int_equal(read_all(&rr, m, &rc), 1);
  assert_int_equal(m[0].mask, BEAMD_RR_MASK_NONE);
  assert_null(m[0].mask_data);
  beamd_rr_release(&rr);
}

/* Each mask the start cannot be trusted with: refused with its reason, and
 * the start and the frame after it still taken. */
static void test_mask_bad(void **state) {
  (void)state;
  static const struct {
    const char *meta;
    unsigned codec, nparts;
    size_t part_bytes;
    uint64_t payload_size;
    const char *why;
  } cases[] = {
      {"{\"mask\":{\"array\":\"pixel_mask\",\"dtype\":\"uint32\",\"shape\":[4,8]}}",
       BEAM_CODEC_RAW, 1, 64, 64, "not the frames' real dtype"},
      {"{\"mask\":{\"array\":\"pixel_mask\",\"shape\":[4,8]}}", BEAM_CODEC_RAW, 1, 64, 64,
       "not the frames' real dtype"},
      {"{\"mask\":{\"array\":\"pixel_mask\",\"dtype\":\"uint16\",\"shape\":[8,4]}}",
       BEAM_CODEC_RAW, 1, 64, 64, "not the frame shape"},
      {"{\"mask\":{\"array\":\"pixel_mask\",\"dtype\":\"uint16\",\"shape\":[4,8,1]}}",
       BEAM_CODEC_RAW, 1, 64, 64, "not the frame shape"},
      {"{\"mask\":{\"array\":\"pixel_mask\",\"dtype\":\"uint16\",\"shape\":[4.0,8]}}",
       BEAM_CODEC_RAW, 1, 64, 64, "not the frame shape"},
      {"{\"mask\":{\"array\":\"flatfield\",\"dtype\":\"uint16\",\"shape\":[4,8]}}",
       BEAM_CODEC_RAW, 1, 64, 64, "not {\"array\": \"pixel_mask\""},
      {"{\"mask\":[1]}", BEAM_CODEC_RAW, 1, 64, 64, "not {\"array\""},
      {"{}", BEAM_CODEC_RAW, 1, 64, 64, "has no \"mask\""},
      {"not json", BEAM_CODEC_RAW, 1, 64, 64, "has no \"mask\""},
      {NULL, BEAM_CODEC_RAW, 1, 64, 64, "has no \"mask\""},
      {MASK_META, BEAM_CODEC_RAW, 0, 0, 0, "no payload"},
      {MASK_META, BEAM_CODEC_RAW, 2, 32, 64, "one raw part"},
      {MASK_META, BEAM_CODEC_RAW, 1, 60, 64, "one raw part"},
      {MASK_META, BEAM_CODEC_LZ4, 1, 48, 48, "one raw part"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    reply_t r;
    status(&r, GET_OK);
    start(&r, cases[c].meta, cases[c].codec, cases[c].nparts, cases[c].part_bytes,
          cases[c].payload_size);
    frame_inline(&r);
    beamd_rr_ask_t ask = {0};
    if (c == 2)
      seed("start_mask_shape", &r, &ask);
    beamd_rr_t rr;
    beamd_rr_msg_t m[4];
    int rc;
    assert_int_equal(beamd_rr_parse(&rr, r.p, r.n, &ask), 0);
    size_t k = read_all(&rr, m, &rc);
    if (k != 2 || m[0].mask != BEAMD_RR_MASK_BAD || !strstr(rr.mask_why, cases[c].why))
      fail_msg("case %zu: %zu messages, mask %d, why \"%s\"", c, k, m[0].mask, rr.mask_why);
    assert_int_equal(rc, 0);
    assert_null(m[0].mask_data);
    assert_true(m[1].is_frame);
    beamd_rr_release(&rr);
  }
}

/* The payload's values as the series' uint32 array: zero stays zero and
 * anything else stays bad. */
static void test_mask_u32(void **state) {
  (void)state;
  uint32_t out[6];
  int16_t i16[6] = {0, -3, 7, 32767, 1, 0};
  assert_int_equal(beamd_rr_mask_u32(BEAM_DT_I16, i16, 6, out), 0);
  uint32_t want16[6] = {0, 1, 7, 32767, 1, 0};
  assert_memory_equal(out, want16, sizeof out);
  float f32[6] = {0.0f, 0.25f, NAN, 3.9f, 1e20f, -0.0f};
  assert_int_equal(beamd_rr_mask_u32(BEAM_DT_F32, f32, 6, out), 0);
  uint32_t wantf[6] = {0, 1, 1, 3, UINT32_MAX, 0};
  assert_memory_equal(out, wantf, sizeof out);
  uint32_t u32[6] = {0, 1u << 31, UINT32_MAX, 8, 0, 2};
  /* At an odd address: the payload part need not be aligned. */
  uint8_t raw[sizeof u32 + 1];
  memcpy(raw + 1, u32, sizeof u32);
  assert_int_equal(beamd_rr_mask_u32(BEAM_DT_U32, raw + 1, 6, out), 0);
  assert_memory_equal(out, u32, sizeof out);
  uint64_t u64[2] = {1ull << 40, 0};
  assert_int_equal(beamd_rr_mask_u32(BEAM_DT_U64, u64, 2, out), 0);
  assert_int_equal(out[0], UINT32_MAX);
  assert_int_equal(out[1], 0);
  assert_int_equal(beamd_rr_mask_u32(BEAM_DT_C64, f32, 1, out), -1);
  assert_int_equal(beamd_rr_mask_u32(BEAM_DT_NONE, f32, 1, out), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_inline), cmocka_unit_test(test_info),
      cmocka_unit_test(test_bad_status), cmocka_unit_test(test_refused),
      cmocka_unit_test(test_undecodable), cmocka_unit_test(test_landed),
      cmocka_unit_test(test_mapped),     cmocka_unit_test(test_mapped_bad),
      cmocka_unit_test(test_noise),      cmocka_unit_test(test_mask),
      cmocka_unit_test(test_mask_bad),   cmocka_unit_test(test_mask_u32),
  };
  return beam_run_tests(tests, NULL, NULL);
}
