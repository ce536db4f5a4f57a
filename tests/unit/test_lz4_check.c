/* Unit tests of the LZ4 block walk (proto/lz4_check.c), with liblz4 as the
 * independent side: every block liblz4 writes is accepted for its size and
 * refused for any other; damaged blocks are accepted only when liblz4's
 * decoder, too, regenerates exactly the size asked; hand-made blocks break
 * each rule of the block format once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <lz4.h>
#include <lz4hc.h>
#include <stdlib.h>
#include <string.h>

#include "proto/lz4_check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

/* Data that compresses like detector bit planes: runs of zeros, repeats,
 * noise, in proportions set by kind. */
static void fill(uint8_t *p, size_t n, unsigned kind) {
  for (size_t i = 0; i < n; i++) {
    uint32_t r = rnd();
    switch (kind % 4) {
    case 0: p[i] = (uint8_t)r; break;                             /* incompressible */
    case 1: p[i] = r % 16 ? 0 : (uint8_t)(r >> 8); break;          /* sparse */
    case 2: p[i] = i >= 7 && r % 4 ? p[i - 7] : (uint8_t)r; break; /* periodic */
    default: p[i] = 0; break;                                      /* all zero */
    }
  }
}

static int decodes_to(const uint8_t *c, size_t clen, size_t n) {
  char *dst = malloc(n ? n : 1);
  assert_non_null(dst);
  int got = LZ4_decompress_safe((const char *)c, dst, (int)clen, (int)n);
  free(dst);
  return got >= 0 && (size_t)got == n;
}

static const size_t sizes[] = {0, 1, 5, 12, 13, 14, 15, 16, 19, 20, 64, 255, 270, 1000, 8192, 65536};

static void test_encoder_output_accepted(void **st) {
  (void)st;
  uint8_t *raw = malloc(65536);
  char *c = malloc((size_t)LZ4_compressBound(65536));
  assert_non_null(raw);
  assert_non_null(c);
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (unsigned kind = 0; kind < 4; kind++)
      for (int hc = 0; hc < 2; hc++) {
        size_t n = sizes[s];
        fill(raw, n, kind);
        int clen = hc ? LZ4_compress_HC((const char *)raw, c, (int)n, LZ4_compressBound((int)n), 9)
                      : LZ4_compress_default((const char *)raw, c, (int)n, LZ4_compressBound((int)n));
        assert_true(clen > 0);
        assert_int_equal(beam_lz4_block_check(c, (size_t)clen, n), 1);
        assert_int_equal(beam_lz4_block_check(c, (size_t)clen, n + 1), 0);
        if (n)
          assert_int_equal(beam_lz4_block_check(c, (size_t)clen, n - 1), 0);
        /* Every truncation is refused (liblz4 agrees: none decodes whole). */
        for (int cut = 1; cut <= clen && cut <= 40; cut++)
          assert_int_equal(beam_lz4_block_check(c, (size_t)(clen - cut), n), 0);
      }
  free(raw);
  free(c);
}

/* One byte changed anywhere: the walk may accept only what liblz4 decodes
 * to exactly the same size. Most changes to literals keep the block valid;
 * changes to tokens, lengths and offsets mostly do not. */
static void test_damage_never_more_lenient(void **st) {
  (void)st;
  size_t n = 8192;
  uint8_t *raw = malloc(n);
  char *c = malloc((size_t)LZ4_compressBound((int)n));
  assert_non_null(raw);
  assert_non_null(c);
  unsigned accepted = 0, refused = 0;
  for (unsigned kind = 0; kind < 3; kind++) {
    fill(raw, n, kind);
    int clen = LZ4_compress_default((const char *)raw, c, (int)n, LZ4_compressBound((int)n));
    assert_true(clen > 0);
    for (int i = 0; i < clen; i++)
      for (unsigned v = 0; v < 3; v++) {
        uint8_t keep = (uint8_t)c[i];
        c[i] = (char)(v == 0 ? keep ^ 0x01 : v == 1 ? keep ^ 0xf0 : 0xff);
        if (beam_lz4_block_check(c, (size_t)clen, n)) {
          assert_int_equal(decodes_to((const uint8_t *)c, (size_t)clen, n), 1);
          accepted++;
        } else {
          refused++;
        }
        c[i] = (char)keep;
      }
  }
  assert_true(accepted > 0 && refused > 0); /* both sides were exercised */
  free(raw);
  free(c);
}

/* Hand-made blocks, each breaking one rule; out sizes in the comments. */
static void test_rules(void **st) {
  (void)st;
  /* 20 literals, the whole block: fine. */
  uint8_t lit[22] = {0xf0, 5};
  memset(lit + 2, 'a', 20);
  assert_int_equal(beam_lz4_block_check(lit, sizeof lit, 20), 1);
  assert_int_equal(beam_lz4_block_check(lit, sizeof lit - 1, 20), 0); /* input short */
  assert_int_equal(beam_lz4_block_check(lit, 0, 0), 0);               /* empty block */
  uint8_t zero = 0;
  assert_int_equal(beam_lz4_block_check(&zero, 1, 0), 1); /* the empty input's block */
  uint8_t nib = 0x04; /* found by fuzz_lz4_check: liblz4 wants exactly 0x00 for nothing */
  assert_int_equal(beam_lz4_block_check(&nib, 1, 0), 0);
  assert_int_equal(decodes_to(&nib, 1, 0), 0);
  uint8_t ext[2] = {0xf0, 255};                           /* length bytes run off the end */
  assert_int_equal(beam_lz4_block_check(ext, sizeof ext, 300), 0);

  /* 1 literal, match offset 1 length 20, 5 literals: 26 bytes. */
  uint8_t ok[] = {0x1f, 'x', 1, 0, 1, 0x50, 'a', 'b', 'c', 'd', 'e'};
  assert_int_equal(beam_lz4_block_check(ok, sizeof ok, 26), 1);
  assert_int_equal(decodes_to(ok, sizeof ok, 26), 1);
  uint8_t off0[sizeof ok];
  memcpy(off0, ok, sizeof ok);
  off0[2] = 0; /* offset 0 */
  assert_int_equal(beam_lz4_block_check(off0, sizeof off0, 26), 0);
  off0[2] = 2; /* offset past the start of the output */
  assert_int_equal(beam_lz4_block_check(off0, sizeof off0, 26), 0);
  assert_int_equal(decodes_to(off0, sizeof off0, 26), 0);
  /* The same with 4 last literals: the last 5 bytes must be literals. */
  uint8_t last4[] = {0x1f, 'x', 1, 0, 2, 0x40, 'a', 'b', 'c', 'd'};
  assert_int_equal(beam_lz4_block_check(last4, sizeof last4, 26), 0);
  assert_int_equal(decodes_to(last4, sizeof last4, 26), 0);
  /* A block that ends after a match (no last literals). */
  uint8_t nolast[] = {0x1f, 'x', 1, 0, 6};
  assert_int_equal(beam_lz4_block_check(nolast, sizeof nolast, 26), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_encoder_output_accepted),
      cmocka_unit_test(test_damage_never_more_lenient),
      cmocka_unit_test(test_rules),
  };
  return beam_run_tests(tests, NULL, NULL);
}
