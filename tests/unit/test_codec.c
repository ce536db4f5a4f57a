/* Unit tests for proto/codec.c: the bit transpose against a plain per-bit
 * oracle and its fast path against the scalar per-tile loops, round trips
 * for every element size (1, 2, 4, 8, 16 bytes) and for sizes that are not
 * multiples of 8 or of the block, decoding of chunks
 * written by the real HDF5 plugins (tests/golden, see tools/gen_golden.py),
 * and rejection of truncated, padded and corrupted framing. Decode buffers
 * are allocated at their exact size so ASan builds catch any overrun.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/err.h"
#include "proto/proto.h"

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

static void expect_str(const char *got, const char *want) {
  if (!got || strcmp(got, want) != 0) fail_msg("expected \"%s\", got \"%s\"", want, got ? got : "(none)");
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { /* xorshift64*: deterministic, no libc rand state */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Detector-like data: small counts with the odd large value, so LZ4 finds
 * something to compress after the transpose but not everything. */
static void fill(uint8_t *p, size_t nbytes, size_t es) {
  for (size_t i = 0; i < nbytes; i++) {
    size_t byte = i % es;
    p[i] = byte == 0 ? (uint8_t)(rnd() % 7) : (rnd() % 50 == 0 ? (uint8_t)rnd() : 0);
  }
}

/* ---- bit transpose ---- */

/* The definition, one bit at a time: bit k of byte j of element i goes to
 * row 8j+k, bit position i (rows are n/8 bytes, bits LSB first). */
static void oracle_shuffle(const uint8_t *in, uint8_t *out, size_t n, size_t es) {
  memset(out, 0, n * es);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < es; j++)
      for (size_t k = 0; k < 8; k++) {
        size_t row = 8 * j + k;
        if (in[i * es + j] >> k & 1) out[row * (n / 8) + i / 8] |= (uint8_t)(1u << (i % 8));
      }
}

static void test_bitshuffle_oracle(void **state) {
  (void)state;
  static const size_t sizes[] = {1, 2, 4, 8, 16, 3, 12};
  static const size_t counts[] = {8, 16, 64, 136, 1024};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      size_t es = sizes[s], n = counts[c], nb = n * es;
      uint8_t *in = malloc(nb), *a = malloc(nb), *b = malloc(nb), *back = malloc(nb);
      for (size_t i = 0; i < nb; i++) in[i] = (uint8_t)rnd();
      beam_bitshuffle(in, a, n, es);
      oracle_shuffle(in, b, n, es);
      if (memcmp(a, b, nb) != 0) fail_msg("bitshuffle differs from oracle: es=%zu n=%zu", es, n);
      beam_bitunshuffle(a, back, n, es);
      assert_memory_equal(back, in, nb);
      free(in); free(a); free(b); free(back);
    }
}

/* The scalar per-tile transpose that proto/codec.c had before its fast
 * path, kept verbatim as the oracle of that fast path (codec.c still uses
 * the same loops for tails and odd element sizes). */
static uint64_t ref_trans8x8(uint64_t x) {
  uint64_t t;
  t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
  x = x ^ t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
  x = x ^ t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
  x = x ^ t ^ (t << 28);
  return x;
}

static void ref_bitshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t es) {
  size_t row = n / 8;
  for (size_t j = 0; j < es; j++)
    for (size_t g = 0; g < row; g++) {
      const uint8_t *e = src + 8 * g * es + j;
      uint64_t x = 0;
      for (unsigned b = 0; b < 8; b++) x |= (uint64_t)e[b * es] << (8 * b);
      x = ref_trans8x8(x);
      for (unsigned k = 0; k < 8; k++) dst[(8 * j + k) * row + g] = (uint8_t)(x >> (8 * k));
    }
}

static void ref_bitunshuffle(const uint8_t *src, uint8_t *dst, size_t n, size_t es) {
  size_t row = n / 8;
  for (size_t j = 0; j < es; j++)
    for (size_t g = 0; g < row; g++) {
      uint64_t x = 0;
      for (unsigned k = 0; k < 8; k++) x |= (uint64_t)src[(8 * j + k) * row + g] << (8 * k);
      x = ref_trans8x8(x);
      uint8_t *e = dst + 8 * g * es + j;
      for (unsigned b = 0; b < 8; b++) e[b * es] = (uint8_t)(x >> (8 * b));
    }
}

/* The fast transpose against the scalar one, both directions on independent
 * random input (not only a round trip, which a transpose and its matching
 * wrong inverse would pass), for counts around the fast path's 256-element
 * groups, around bitshuffle's 8192-byte blocks and up to 100000. Exact-size
 * buffers so ASan sees any write or read past the end. */
static void test_bitshuffle_fast_vs_scalar(void **state) {
  (void)state;
  static const size_t sizes[] = {1, 2, 4, 8, 16, 3, 12};
  static const size_t base[] = {8, 16, 56, 64, 248, 256, 264, 504, 512, 768, 1016, 1024,
                                4096, 12344, 65536, 99992, 100000};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t es = sizes[s], blk = 8192 / es - (8192 / es) % 8;
    size_t counts[sizeof base / sizeof base[0] + 8];
    size_t nc = 0;
    for (size_t c = 0; c < sizeof base / sizeof base[0]; c++) counts[nc++] = base[c];
    counts[nc++] = blk - 8; /* the bitshuffle block of this element size */
    counts[nc++] = blk;
    counts[nc++] = blk + 8;
    counts[nc++] = 2 * blk;
    for (int r = 0; r < 4; r++) counts[nc++] = 8 * (1 + rnd() % 12500); /* 8 .. 100000 */
    for (size_t c = 0; c < nc; c++) {
      size_t n = counts[c], nb = n * es;
      uint8_t *in = malloc(nb), *fast = malloc(nb), *ref = malloc(nb);
      assert_true(in && fast && ref);
      for (size_t i = 0; i < nb; i++) in[i] = (uint8_t)rnd();
      beam_bitshuffle(in, fast, n, es);
      ref_bitshuffle(in, ref, n, es);
      if (memcmp(fast, ref, nb) != 0) fail_msg("bitshuffle differs from scalar: es=%zu n=%zu", es, n);
      beam_bitunshuffle(in, fast, n, es);
      ref_bitunshuffle(in, ref, n, es);
      if (memcmp(fast, ref, nb) != 0)
        fail_msg("bitunshuffle differs from scalar: es=%zu n=%zu", es, n);
      free(in); free(fast); free(ref);
    }
  }
}

/* A single set bit lands exactly where the layout says. */
static void test_bitshuffle_single_bit(void **state) {
  (void)state;
  uint16_t in[16] = {0};
  uint8_t out[32];
  in[9] = 1u << 10; /* element 9, byte 1, bit 2 -> row 10, byte 1, bit 1 */
  beam_bitshuffle(in, out, 16, 2);
  for (size_t i = 0; i < sizeof out; i++) assert_int_equal(out[i], i == 10 * 2 + 1 ? 2 : 0);
}

/* ---- round trips ---- */

static void roundtrip(beam_codec_t codec, size_t es, size_t n) {
  size_t nb = n * es;
  size_t bound = beam_codec_bound(codec, nb, es);
  assert_true(bound >= nb || codec != BEAM_CODEC_RAW);
  uint8_t *raw = malloc(nb ? nb : 1), *enc = malloc(bound), *dec = malloc(nb ? nb : 1),
          *scratch = malloc(nb ? nb : 1);
  fill(raw, nb, es);
  int64_t len = beam_codec_encode(codec, raw, nb, es, enc, bound, scratch);
  if (len < 0) fail_msg("encode %s es=%zu n=%zu: %d", beam_codec_name(codec), es, n, (int)len);
  assert_true((size_t)len <= bound);
  const char *why = NULL;
  int rc = beam_codec_decode(codec, enc, (size_t)len, dec, nb, es, scratch, &why);
  if (rc) fail_msg("decode %s es=%zu n=%zu: %s", beam_codec_name(codec), es, n, why);
  assert_memory_equal(dec, raw, nb);
  /* One byte short of the encoded size is refused. */
  if (len > 0) {
    int64_t r = beam_codec_encode(codec, raw, nb, es, enc, (size_t)len - 1, scratch);
    assert_true(r < 0);
  }
  free(raw); free(enc); free(dec); free(scratch);
}

static void test_roundtrip_all(void **state) {
  (void)state;
  static const size_t sizes[] = {1, 2, 4, 8, 16};
  /* Around 8, around the block (8192 B / es), and odd lengths. */
  static const size_t counts[] = {1, 7, 8, 9, 127, 128, 129, 512, 1023, 1024, 1031,
                                  2047, 2048, 2055, 4095, 4096, 4103, 8191, 8192, 8199, 20001};
  for (int codec = 0; codec < BEAM_CODEC_COUNT_; codec++)
    for (size_t s = 0; s < 5; s++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        roundtrip((beam_codec_t)codec, sizes[s], counts[c]);
}

/* Incompressible data: LZ4 stores the block raw (csize == block length). */
static void test_lz4_stored_block(void **state) {
  (void)state;
  size_t nb = 5000;
  uint8_t *raw = malloc(nb), *enc = malloc(beam_codec_bound(BEAM_CODEC_LZ4, nb, 1)), *dec = malloc(nb);
  for (size_t i = 0; i < nb; i++) raw[i] = (uint8_t)rnd();
  int64_t len = beam_codec_encode(BEAM_CODEC_LZ4, raw, nb, 1, enc,
                                  beam_codec_bound(BEAM_CODEC_LZ4, nb, 1), NULL);
  assert_int_equal(len, 12 + 4 + nb);
  assert_memory_equal(enc + 8, "\x00\x00\x13\x88\x00\x00\x13\x88", 8); /* block 5000, csize 5000 */
  const char *why;
  assert_int_equal(beam_codec_decode(BEAM_CODEC_LZ4, enc, (size_t)len, dec, nb, 1, NULL, &why), 0);
  assert_memory_equal(dec, raw, nb);
  free(raw); free(enc); free(dec);
}

static void test_encode_args(void **state) {
  (void)state;
  uint8_t raw[16] = {0}, dst[128], scratch[16];
  assert_int_equal(beam_codec_encode(BEAM_CODEC_BSLZ4, raw, 15, 2, dst, sizeof dst, scratch), BEAM_EINVAL);
  assert_int_equal(beam_codec_encode(BEAM_CODEC_BSLZ4, raw, 16, 0, dst, sizeof dst, scratch), BEAM_EINVAL);
  assert_int_equal(beam_codec_encode(BEAM_CODEC_BSLZ4, raw, 16, 2, dst, sizeof dst, NULL), BEAM_EINVAL);
  assert_int_equal(beam_codec_encode(BEAM_CODEC_COUNT_, raw, 16, 2, dst, sizeof dst, NULL), BEAM_EINVAL);
  assert_int_equal(beam_codec_encode(BEAM_CODEC_RAW, raw, 16, 1, dst, 15, NULL), BEAM_ELIMIT);
  assert_int_equal(beam_codec_encode(BEAM_CODEC_LZ4, raw, 16, 1, dst, 11, NULL), BEAM_ELIMIT);
  assert_int_equal(beam_codec_encode(BEAM_CODEC_RAW, NULL, 16, 1, dst, 16, NULL), BEAM_EINVAL);
  assert_int_equal(beam_codec_bound(BEAM_CODEC_BSLZ4, 15, 2), 0);
  assert_int_equal(beam_codec_bound(BEAM_CODEC_BSLZ4, 16, 0), 0);
  assert_int_equal(beam_codec_bound(BEAM_CODEC_COUNT_, 16, 1), 0);
  assert_int_equal(beam_codec_bound(BEAM_CODEC_RAW, (size_t)1 << 49, 1), 0);
  assert_int_equal(beam_codec_bound(BEAM_CODEC_RAW, 77, 1), 77);
}

/* ---- golden chunks written by the HDF5 plugins ---- */

typedef struct {
  const char *name;
  beam_codec_t codec;
  size_t es;
} golden_chunk_t;

static const golden_chunk_t chunks[] = {
    {"bslz4_u16", BEAM_CODEC_BSLZ4, 2},  {"bslz4_u8", BEAM_CODEC_BSLZ4, 1},
    {"bslz4_u32", BEAM_CODEC_BSLZ4, 4},  {"bslz4_i64", BEAM_CODEC_BSLZ4, 8},
    {"bslz4_f32", BEAM_CODEC_BSLZ4, 4},  {"bslz4_c128", BEAM_CODEC_BSLZ4, 16},
    {"bslz4_f64_tiny", BEAM_CODEC_BSLZ4, 8}, {"lz4_u16", BEAM_CODEC_LZ4, 2},
    {"lz4_u8_random", BEAM_CODEC_LZ4, 1}, {"lz4_f32", BEAM_CODEC_LZ4, 4},
};
#define NCHUNKS (sizeof chunks / sizeof chunks[0])

typedef struct {
  uint8_t *chunk, *raw;
  size_t clen, rlen;
} golden_t;

static golden_t load_golden(const golden_chunk_t *g) {
  golden_t r;
  char fn[128];
  snprintf(fn, sizeof fn, "%s.chunk.bin", g->name);
  r.chunk = load_file(fn, &r.clen);
  snprintf(fn, sizeof fn, "%s.raw.bin", g->name);
  r.raw = load_file(fn, &r.rlen);
  return r;
}

static int try_decode(const golden_chunk_t *g, const uint8_t *src, size_t len, size_t rlen,
                      const char **why) {
  uint8_t *dst = malloc(rlen ? rlen : 1), *scratch = malloc(rlen ? rlen : 1);
  int rc = beam_codec_decode(g->codec, src, len, dst, rlen, g->es, scratch, why);
  free(dst);
  free(scratch);
  return rc;
}

static void test_golden_decode(void **state) {
  (void)state;
  for (size_t i = 0; i < NCHUNKS; i++) {
    golden_t gd = load_golden(&chunks[i]);
    uint8_t *dst = malloc(gd.rlen), *scratch = malloc(gd.rlen);
    const char *why = NULL;
    int rc = beam_codec_decode(chunks[i].codec, gd.chunk, gd.clen, dst, gd.rlen, chunks[i].es,
                               scratch, &why);
    if (rc) fail_msg("%s: %s", chunks[i].name, why);
    if (memcmp(dst, gd.raw, gd.rlen) != 0) fail_msg("%s: decoded data differs", chunks[i].name);
    /* Our own encoding of the same array must decode to it as well, and has
     * the same 12-byte framing header the plugin wrote. */
    size_t bound = beam_codec_bound(chunks[i].codec, gd.rlen, chunks[i].es);
    uint8_t *enc = malloc(bound);
    int64_t len = beam_codec_encode(chunks[i].codec, gd.raw, gd.rlen, chunks[i].es, enc, bound, scratch);
    assert_true(len > 0);
    assert_memory_equal(enc, gd.chunk, 12);
    assert_int_equal(beam_codec_decode(chunks[i].codec, enc, (size_t)len, dst, gd.rlen,
                                       chunks[i].es, scratch, &why), 0);
    assert_memory_equal(dst, gd.raw, gd.rlen);
    free(enc); free(dst); free(scratch);
    free(gd.chunk); free(gd.raw);
  }
}

/* Every strict prefix of a valid chunk is rejected, and so is any padding. */
static void test_golden_truncated_padded(void **state) {
  (void)state;
  for (size_t i = 0; i < NCHUNKS; i++) {
    golden_t gd = load_golden(&chunks[i]);
    const char *why;
    for (size_t len = 0; len < gd.clen; len++) {
      uint8_t *cut = malloc(len ? len : 1); /* exact size: ASan sees any over-read */
      memcpy(cut, gd.chunk, len);
      why = NULL;
      int rc = try_decode(&chunks[i], cut, len, gd.rlen, &why);
      if (rc != BEAM_EPROTO) fail_msg("%s: prefix %zu accepted", chunks[i].name, len);
      assert_non_null(why);
      free(cut);
    }
    uint8_t *pad = malloc(gd.clen + 1);
    memcpy(pad, gd.chunk, gd.clen);
    pad[gd.clen] = 0;
    assert_int_equal(try_decode(&chunks[i], pad, gd.clen + 1, gd.rlen, &why), BEAM_EPROTO);
    expect_str(why, chunks[i].codec == BEAM_CODEC_LZ4 ? "lz4: trailing bytes after the last block"
                                                      : "bslz4: trailing bytes after the last block");
    free(pad);
    free(gd.chunk); free(gd.raw);
  }
}

/* Random byte flips: decoding returns 0 or BEAM_EPROTO, never crashes or
 * writes out of bounds (the ASan build is what makes this test bite). */
static void test_golden_mutations(void **state) {
  (void)state;
  for (size_t i = 0; i < NCHUNKS; i++) {
    golden_t gd = load_golden(&chunks[i]);
    uint8_t *m = malloc(gd.clen);
    for (int round = 0; round < 300; round++) {
      memcpy(m, gd.chunk, gd.clen);
      int flips = 1 + (int)(rnd() % 4);
      for (int f = 0; f < flips; f++) m[rnd() % gd.clen] ^= (uint8_t)(1u << (rnd() % 8));
      const char *why = NULL;
      int rc = try_decode(&chunks[i], m, gd.clen, gd.rlen, &why);
      assert_true(rc == 0 || rc == BEAM_EPROTO);
      if (rc) assert_non_null(why);
    }
    free(m);
    free(gd.chunk); free(gd.raw);
  }
}

/* ---- each rejection reason ---- */

static void wbe32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

static void test_reject_lz4(void **state) {
  (void)state;
  golden_t gd = load_golden(&chunks[7]); /* lz4_u16: one compressed block */
  const golden_chunk_t *g = &chunks[7];
  size_t n = gd.clen;
  uint8_t *m = malloc(n + 8);
  const char *why;

  assert_int_equal(try_decode(g, gd.chunk, 11, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: truncated framing header");
  assert_int_equal(try_decode(g, gd.chunk, n, gd.rlen - 2, &why), BEAM_EPROTO);
  expect_str(why, "lz4: total size does not match raw_size");
  memcpy(m, gd.chunk, n);
  wbe32(m + 8, 0);
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: block size 0");
  assert_int_equal(try_decode(g, gd.chunk, 14, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: truncated block header");
  assert_int_equal(try_decode(g, gd.chunk, n - 1, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: block runs past the payload");
  /* csize one more than the block: the plugin never writes that. */
  size_t big = gd.rlen + 1;
  uint8_t *b = malloc(16 + big);
  memcpy(b, gd.chunk, 12);
  wbe32(b + 12, (uint32_t)big);
  memset(b + 16, 0, big);
  assert_int_equal(try_decode(g, b, 16 + big, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: compressed block larger than its data");
  free(b);
  /* Drop the last byte of the LZ4 stream and shrink csize to match. */
  memcpy(m, gd.chunk, n);
  uint32_t c = (uint32_t)(n - 16);
  wbe32(m + 12, c - 1);
  assert_int_equal(try_decode(g, m, n - 1, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: corrupt block");
  /* Garbage in place of the stream. */
  memcpy(m, gd.chunk, n);
  memset(m + 16, 0xFF, n - 16);
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "lz4: corrupt block");
  /* A block size beyond what LZ4 can address is refused before use. */
  uint8_t hdr[16] = {0};
  uint64_t huge = 0x80000000ull;
  for (int i = 0; i < 8; i++) hdr[i] = (uint8_t)(huge >> (56 - 8 * i));
  wbe32(hdr + 8, 0x80000000u);
  const char *why2 = NULL;
  uint8_t dummy[1];
  assert_int_equal(beam_codec_decode(BEAM_CODEC_LZ4, hdr, 16, dummy, (size_t)huge, 1, NULL, &why2),
                   BEAM_EPROTO);
  expect_str(why2, "lz4: block size too large");
  free(m);
  free(gd.chunk); free(gd.raw);
}

static void test_reject_bslz4(void **state) {
  (void)state;
  const golden_chunk_t *g = &chunks[0]; /* bslz4_u16: 3 blocks + 4-element tail */
  golden_t gd = load_golden(g);
  size_t n = gd.clen;
  uint8_t *m = malloc(n);
  const char *why;

  assert_int_equal(try_decode(g, gd.chunk, 11, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: truncated framing header");
  assert_int_equal(try_decode(g, gd.chunk, n, gd.rlen - 2, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: total size does not match raw_size");
  assert_int_equal(try_decode(g, gd.chunk, n, gd.rlen - 1, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: raw_size not a multiple of the element size");
  memcpy(m, gd.chunk, n);
  wbe32(m + 8, 8191);
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: block size not a multiple of the element size");
  wbe32(m + 8, 8); /* 4 elements */
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: block size not a positive multiple of 8 elements");
  wbe32(m + 8, 0);
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: block size not a positive multiple of 8 elements");
  assert_int_equal(try_decode(g, gd.chunk, 14, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: truncated block header");
  assert_int_equal(try_decode(g, gd.chunk, 100, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: block runs past the payload");
  assert_int_equal(try_decode(g, gd.chunk, n - 1, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: truncated trailing elements");
  memcpy(m, gd.chunk, n);
  uint32_t c0 = ((uint32_t)m[12] << 24) | ((uint32_t)m[13] << 16) | ((uint32_t)m[14] << 8) | m[15];
  memset(m + 16, 0xFF, c0);
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: corrupt block");
  /* The right block size in elements, but the next block's data is shifted. */
  memcpy(m, gd.chunk, n);
  wbe32(m + 12, c0 - 1);
  assert_int_equal(try_decode(g, m, n, gd.rlen, &why), BEAM_EPROTO);
  uint8_t dst[16], scratch[16];
  assert_int_equal(beam_codec_decode(BEAM_CODEC_BSLZ4, gd.chunk, n, dst, 16, 2, scratch, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: total size does not match raw_size");
  assert_int_equal(beam_codec_decode(BEAM_CODEC_BSLZ4, gd.chunk, n, NULL, 16, 2, scratch, &why), BEAM_EINVAL);
  expect_str(why, "NULL buffer");
  free(m);
  free(gd.chunk); free(gd.raw);
}

static void test_reject_misc(void **state) {
  (void)state;
  uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8], scratch[8];
  const char *why;
  assert_int_equal(beam_codec_decode(BEAM_CODEC_RAW, src, 7, dst, 8, 1, NULL, &why), BEAM_EPROTO);
  expect_str(why, "raw: payload size != raw_size");
  assert_int_equal(beam_codec_decode(BEAM_CODEC_RAW, src, 8, dst, 8, 1, NULL, &why), 0);
  assert_memory_equal(dst, src, 8);
  assert_int_equal(beam_codec_decode(BEAM_CODEC_COUNT_, src, 8, dst, 8, 1, NULL, &why), BEAM_EPROTO);
  expect_str(why, "unknown codec");
  assert_int_equal(beam_codec_decode(BEAM_CODEC_BSLZ4, src, 8, dst, 8, 0, scratch, &why), BEAM_EPROTO);
  expect_str(why, "bslz4: raw_size not a multiple of the element size");
  assert_int_equal(beam_codec_decode(BEAM_CODEC_BSLZ4, src, 8, dst, 8, 2, NULL, &why), BEAM_EINVAL);
  expect_str(why, "bslz4: no scratch buffer");
}

/* ---- beam_msg_payload over a compressed message ---- */

static void test_msg_payload_compressed(void **state) {
  (void)state;
  size_t n = 1000, nb = n * 4;
  uint8_t *raw = malloc(nb), *scratch = malloc(nb), *dst = malloc(nb);
  fill(raw, nb, 4);
  size_t bound = beam_codec_bound(BEAM_CODEC_BSLZ4, nb, 4);
  uint8_t *enc = malloc(bound);
  int64_t len = beam_codec_encode(BEAM_CODEC_BSLZ4, raw, nb, 4, enc, bound, scratch);
  assert_true(len > 0);
  beam_hdr_t h;
  memset(&h, 0, sizeof h);
  h.type = BEAM_MSG_FRAME;
  h.dtype = BEAM_DT_F32;
  h.ndim = 2;
  h.shape[0] = 10;
  h.shape[1] = 100;
  h.codec = BEAM_CODEC_BSLZ4;
  h.nparts = 1;
  h.raw_size = nb;
  h.payload_size = (uint64_t)len;
  uint8_t hb[128];
  beam_hdr_encode(&h, hb, sizeof hb);
  beam_part_t parts[2] = {{hb, 128, NULL}, {enc, (size_t)len, NULL}};
  beam_msg_t msg;
  const char *why = NULL;
  assert_int_equal(beam_msg_parse(parts, 2, NULL, &msg, &why), 0);
  assert_int_equal(beam_msg_payload(&msg, dst, scratch, &why), 0);
  assert_memory_equal(dst, raw, nb);
  /* A corrupted stream behind a valid header is caught at payload time. */
  enc[len - 5] ^= 0xFF;
  enc[20] ^= 0xFF;
  int rc = beam_msg_payload(&msg, dst, scratch, &why);
  assert_true(rc == 0 || rc == BEAM_EPROTO);
  free(raw); free(scratch); free(dst); free(enc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bitshuffle_oracle),
      cmocka_unit_test(test_bitshuffle_fast_vs_scalar),
      cmocka_unit_test(test_bitshuffle_single_bit),
      cmocka_unit_test(test_roundtrip_all),
      cmocka_unit_test(test_lz4_stored_block),
      cmocka_unit_test(test_encode_args),
      cmocka_unit_test(test_golden_decode),
      cmocka_unit_test(test_golden_truncated_padded),
      cmocka_unit_test(test_golden_mutations),
      cmocka_unit_test(test_reject_lz4),
      cmocka_unit_test(test_reject_bslz4),
      cmocka_unit_test(test_reject_misc),
      cmocka_unit_test(test_msg_payload_compressed),
  };
  return beam_run_tests(tests, NULL, NULL);
}
