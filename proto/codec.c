/* Payload codecs of the wire protocol: raw, LZ4 and bitshuffle+LZ4, framed
 * exactly as the HDF5 filters frame a chunk, so a chunk read from an HDF5
 * file with H5Dread_chunk can be forwarded untouched and decoded here.
 *
 * LZ4, filter 32004 (HDF5 LZ4 plugin):
 *   u64 BE total bytes | u32 BE block bytes | per block: u32 BE csize, data
 *   (a block whose csize equals its length is stored uncompressed; the last
 *   block may be short).
 * Bitshuffle+LZ4, filter 32008 (bitshuffle bshuf_h5filter.c):
 *   u64 BE total bytes | u32 BE block size in BYTES (block elements x
 *   element size) | per block of full-size or (tail rounded down to 8)
 *   elements: u32 BE csize, LZ4 of the bit-transposed block | the last
 *   n % 8 elements copied verbatim.
 *
 * Two more framings are daemon-internal (detector adapters keep frames in
 * them; never on the wire): a bare LZ4 block (DECTRIS stream v1 "lz4<",
 * decoding to exactly raw_size), and bitshuffle's Zstandard variant of the
 * 32008 framing (each block a zstd frame instead of an LZ4 block; what
 * Jungfraujoch calls bszstd).
 *
 * Decoders trust nothing in the framing: every size is checked against the
 * input left and the output expected before a byte moves. No allocation:
 * the caller passes a scratch buffer for the transposed block.
 */
#include <lz4.h>
#include "proto/clones.h"
#include <string.h>
#include <zstd.h>
/* gcc on x86-64: the AVX2 paths below are picked at run time (target
 * attributes, target_clones); elsewhere only the portable code is built. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define BS_X86 1
#include <immintrin.h>
#else
#define BS_X86 0
#endif

#include "proto/err.h"
#include "proto/proto.h"

#define LZ4F_DEFAULT_BLOCK ((size_t)1 << 30) /* HDF5 LZ4 plugin default */
#define BSHUF_TARGET_BYTES 8192u
#define BSHUF_MIN_BLOCK 128u
#define BSHUF_MULT 8u
#define FRAMING_HDR 12u
/* Sizes above this are refused by the bound (2^48 bytes): it keeps the
 * bound arithmetic far from size_t overflow. */
#define CODEC_MAX_RAW ((size_t)1 << 48)

static void be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static void be64(uint8_t *p, uint64_t v) {
  be32(p, (uint32_t)(v >> 32));
  be32(p + 4, (uint32_t)v);
}
static uint32_t rbe32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static uint64_t rbe64(const uint8_t *p) {
  return ((uint64_t)rbe32(p) << 32) | rbe32(p + 4);
}

static int fail(const char **why, const char *reason, int code) {
  if (why) *why = reason;
  return code;
}

/* bitshuffle's bshuf_default_block_size(): must never change, old data
 * depends on it (it is written in the framing, but encoders must agree). */
static size_t bshuf_default_block(size_t elem_size) {
  size_t b = BSHUF_TARGET_BYTES / elem_size;
  b = (b / BSHUF_MULT) * BSHUF_MULT;
  return b > BSHUF_MIN_BLOCK ? b : BSHUF_MIN_BLOCK;
}

/* Forced inlining: the per-size copies of the fast path must each see the
 * element size as a constant, and the tile transpose is their inner step. */
#if defined(__GNUC__)
#define BS_INLINE __attribute__((always_inline))
#else
#define BS_INLINE
#endif
/* The fast path works on 256-bit vectors (bs_vec): with AVX2 each is one
 * register, without it two SSE2 halves. Chosen at load time. */
#if BS_X86
#define BS_CLONES BEAM_TARGET_CLONES("avx2", "default")
#else
#define BS_CLONES
#endif

/* ---- bit transpose ----
 * Output layout of bshuf_trans_bit_elem for n elements (n % 8 == 0): bit k
 * of byte j of element i lands in row r = 8*j + k, at byte r*(n/8) + i/8,
 * bit i%8. Each 8x8 tile (8 elements x 8 bits of one byte) is transposed in
 * a register with bitshuffle's three delta swaps. */
static inline BS_INLINE uint64_t trans8x8(uint64_t x) {
  uint64_t t;
  t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
  x = x ^ t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
  x = x ^ t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
  x = x ^ t ^ (t << 28);
  return x;
}

/* The plain per-tile loops over tiles [g0, g1) of every byte plane: the
 * reference the fast path is tested against (tests/unit/test_codec.c keeps
 * a copy), and the path for tails, odd element sizes and big-endian hosts. */
static void shuffle_tiles(const uint8_t *src, uint8_t *dst, size_t g0, size_t g1,
                          size_t elem_size, size_t row) {
  for (size_t j = 0; j < elem_size; j++) {
    for (size_t g = g0; g < g1; g++) {
      const uint8_t *e = src + 8 * g * elem_size + j;
      uint64_t x = 0;
      for (unsigned b = 0; b < 8; b++) x |= (uint64_t)e[b * elem_size] << (8 * b);
      x = trans8x8(x);
      for (unsigned k = 0; k < 8; k++) dst[(8 * j + k) * row + g] = (uint8_t)(x >> (8 * k));
    }
  }
}

static void unshuffle_tiles(const uint8_t *src, uint8_t *dst, size_t g0, size_t g1,
                            size_t elem_size, size_t row) {
  for (size_t j = 0; j < elem_size; j++) {
    for (size_t g = g0; g < g1; g++) {
      uint64_t x = 0;
      for (unsigned k = 0; k < 8; k++)
        x |= (uint64_t)src[(8 * j + k) * row + g] << (8 * k);
      x = trans8x8(x); /* a transpose is its own inverse */
      uint8_t *e = dst + 8 * g * elem_size + j;
      for (unsigned b = 0; b < 8; b++) e[b * elem_size] = (uint8_t)(x >> (8 * b));
    }
  }
}

/* Fast path, bitshuffle's three steps on super-groups of 4 x 64 elements:
 * trans_byte_elem (the bytes of the elements split into byte planes),
 * trans_bit_byte (trans8x8 on each 8-byte tile of a plane) and
 * trans_bitrow_eight (an 8x8 byte transpose of eight tiles, so each output
 * row gets whole words instead of scattered bytes). The 8x8 transposes are
 * written once on a GNU C vector of 4 uint64_t lanes, lane l working on the
 * l-th group of 64 elements: every lane does the same shifts and masks, the
 * four row words of one row land side by side in the output, and gcc and
 * clang lower the vector to whatever the target has (two SSE2 registers,
 * one AVX2 register, NEON, or plain scalar code). No intrinsics. */
#define BS_GROUP 64u    /* elements per lane: 8 tiles, one word per row */
#define BS_LANES 4u
#define BS_SUPER (BS_GROUP * BS_LANES)
#define BS_MAX_FAST 16u /* widest element with its own byte step */

/* The tile layout assumes byte b of a loaded word is element b; big-endian
 * hosts and compilers without vector extensions take the scalar path. */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__

typedef uint64_t bs_vec __attribute__((vector_size(8 * BS_LANES)));

/* Vectors go by pointer: passing 32-byte vectors by value changes the ABI
 * with the target (gcc -Wpsabi). */
static inline BS_INLINE void vload(bs_vec *v, const uint8_t *p) { memcpy(v, p, sizeof *v); }
static inline BS_INLINE void vstore(uint8_t *p, const bs_vec *v) { memcpy(p, v, sizeof *v); }

static inline BS_INLINE void vtrans8x8(bs_vec *v) {
  bs_vec x = *v, t;
  t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
  x = x ^ t ^ (t << 7);
  t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
  x = x ^ t ^ (t << 14);
  t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
  x = x ^ t ^ (t << 28);
  *v = x;
}

/* 8x8 byte transpose of eight words, lane by lane: byte k of w[g] <-> byte
 * g of w[k]. The same recursive block swap as trans8x8, one level up. */
static inline BS_INLINE void vtrans_bytes8(bs_vec w[8]) {
  for (unsigned g = 0; g < 4; g++) {
    bs_vec t = ((w[g] >> 32) ^ w[g + 4]) & 0x00000000FFFFFFFFULL;
    w[g] ^= t << 32;
    w[g + 4] ^= t;
  }
  for (unsigned i = 0; i < 4; i++) {
    unsigned g = i + (i & 2); /* 0, 1, 4, 5 */
    bs_vec t = ((w[g] >> 16) ^ w[g + 2]) & 0x0000FFFF0000FFFFULL;
    w[g] ^= t << 16;
    w[g + 2] ^= t;
  }
  for (unsigned g = 0; g < 8; g += 2) {
    bs_vec t = ((w[g] >> 8) ^ w[g + 1]) & 0x00FF00FF00FF00FFULL;
    w[g] ^= t << 8;
    w[g + 1] ^= t;
  }
}

static inline BS_INLINE uint64_t load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
static inline BS_INLINE void store64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The even bytes of x packed into its low 4 bytes, and the inverse (the
 * low 4 bytes of x spread to the even bytes, odd bytes zero). */
static inline BS_INLINE uint64_t unzip_even(uint64_t x) {
  x &= 0x00FF00FF00FF00FFULL;
  x = (x | x >> 8) & 0x0000FFFF0000FFFFULL;
  return (x | x >> 16) & 0x00000000FFFFFFFFULL;
}
static inline BS_INLINE uint64_t zip_even(uint64_t x) {
  x &= 0x00000000FFFFFFFFULL;
  x = (x | x << 16) & 0x0000FFFF0000FFFFULL;
  return (x | x << 8) & 0x00FF00FF00FF00FFULL;
}

/* The plane buffer of one super-group: tile t of plane j of lane l at
 * planes + ((j*8 + t)*BS_LANES + l)*8, so one vector load holds tile t of
 * all four lanes. */
#define PLANE_AT(planes, j, t) ((planes) + ((size_t)(j) * 8 + (t)) * 8 * BS_LANES)

/* trans_byte_elem with vtrans_bytes8 doing the work: the word fed for
 * element g holds its bytes plus, for elements narrower than 8 bytes,
 * those of elements g+8, g+16, ... above them, so after the transpose word
 * q*es+j is byte j of 8 consecutive elements: one plane tile. 16-byte
 * elements go through as two 8-byte halves. */
static inline BS_INLINE void split_super(const uint8_t *restrict src, uint8_t *restrict planes,
                                         size_t es) {
  size_t half = es > 8 ? 8 : es, per = 8 / half; /* elements per word */
  if (es == 2) { /* cheaper in-register: even bytes to plane 0, odd to 1 */
    for (unsigned t = 0; t < 8; t++)
      for (unsigned l = 0; l < BS_LANES; l++) {
        const uint8_t *e = src + (l * BS_GROUP + 8 * t) * 2;
        uint64_t a = load64(e), b = load64(e + 8);
        uint64_t p0 = unzip_even(a) | unzip_even(b) << 32;
        uint64_t p1 = unzip_even(a >> 8) | unzip_even(b >> 8) << 32;
        memcpy(PLANE_AT(planes, 0, t) + 8 * l, &p0, 8);
        memcpy(PLANE_AT(planes, 1, t) + 8 * l, &p1, 8);
      }
    return;
  }
  if (es == 1) { /* already one plane: only the lanes to interleave */
    for (unsigned t = 0; t < 8; t++)
      for (unsigned l = 0; l < BS_LANES; l++)
        memcpy(PLANE_AT(planes, 0, t) + 8 * l, src + l * BS_GROUP + 8 * t, 8);
    return;
  }
  for (size_t h = 0; h < es / half; h++)
    for (size_t blk = 0; blk < BS_GROUP / (8 * per); blk++) {
      bs_vec w[8];
      for (unsigned g = 0; g < 8; g++)
        for (unsigned l = 0; l < BS_LANES; l++) {
          uint64_t x = 0;
          for (size_t q = 0; q < per; q++) {
            uint64_t v = 0;
            memcpy(&v, src + (l * BS_GROUP + (blk * per + q) * 8 + g) * es + 8 * h, half);
            x |= v << (8 * half * q);
          }
          w[g][l] = x;
        }
      vtrans_bytes8(w);
      for (size_t q = 0; q < per; q++)
        for (size_t j = 0; j < half; j++)
          vstore(PLANE_AT(planes, 8 * h + j, blk * per + q), &w[q * half + j]);
    }
}
static inline BS_INLINE void join_super(const uint8_t *restrict planes, uint8_t *restrict dst,
                                        size_t es) {
  size_t half = es > 8 ? 8 : es, per = 8 / half;
  if (es == 2) {
    for (unsigned t = 0; t < 8; t++)
      for (unsigned l = 0; l < BS_LANES; l++) {
        uint64_t p0 = load64(PLANE_AT(planes, 0, t) + 8 * l);
        uint64_t p1 = load64(PLANE_AT(planes, 1, t) + 8 * l);
        uint8_t *e = dst + (l * BS_GROUP + 8 * t) * 2;
        store64(e, zip_even(p0) | zip_even(p1) << 8);
        store64(e + 8, zip_even(p0 >> 32) | zip_even(p1 >> 32) << 8);
      }
    return;
  }
  if (es == 1) {
    for (unsigned t = 0; t < 8; t++)
      for (unsigned l = 0; l < BS_LANES; l++)
        memcpy(dst + l * BS_GROUP + 8 * t, PLANE_AT(planes, 0, t) + 8 * l, 8);
    return;
  }
  for (size_t h = 0; h < es / half; h++)
    for (size_t blk = 0; blk < BS_GROUP / (8 * per); blk++) {
      bs_vec w[8];
      for (size_t q = 0; q < per; q++)
        for (size_t j = 0; j < half; j++)
          vload(&w[q * half + j], PLANE_AT(planes, 8 * h + j, blk * per + q));
      vtrans_bytes8(w);
      for (unsigned g = 0; g < 8; g++)
        for (unsigned l = 0; l < BS_LANES; l++)
          for (size_t q = 0; q < per; q++) {
            uint64_t v = w[g][l] >> (8 * half * q);
            memcpy(dst + (l * BS_GROUP + (blk * per + q) * 8 + g) * es + 8 * h, &v, half);
          }
    }
}

/* One body per element size, so es is a constant inside each copy. */
static inline BS_INLINE void shuffle_supers(const uint8_t *src, uint8_t *dst, size_t nsuper,
                                            size_t es, size_t row) {
  uint8_t planes[BS_SUPER * BS_MAX_FAST];
  for (size_t s = 0; s < nsuper; s++) {
    split_super(src + s * BS_SUPER * es, planes, es);
    for (size_t j = 0; j < es; j++) {
      bs_vec w[8];
      for (unsigned t = 0; t < 8; t++) {
        vload(&w[t], PLANE_AT(planes, j, t));
        vtrans8x8(&w[t]);
      }
      vtrans_bytes8(w);
      uint8_t *out = dst + 8 * j * row + s * (BS_SUPER / 8);
      for (unsigned k = 0; k < 8; k++) vstore(out + k * row, &w[k]);
    }
  }
}
static inline BS_INLINE void unshuffle_supers(const uint8_t *src, uint8_t *dst, size_t nsuper,
                                              size_t es, size_t row) {
  uint8_t planes[BS_SUPER * BS_MAX_FAST];
  for (size_t s = 0; s < nsuper; s++) {
    for (size_t j = 0; j < es; j++) {
      bs_vec w[8];
      const uint8_t *in = src + 8 * j * row + s * (BS_SUPER / 8);
      for (unsigned k = 0; k < 8; k++) vload(&w[k], in + k * row);
      vtrans_bytes8(w);
      for (unsigned t = 0; t < 8; t++) {
        vtrans8x8(&w[t]);
        vstore(PLANE_AT(planes, j, t), &w[t]);
      }
    }
    join_super(planes, dst + s * BS_SUPER * es, es);
  }
}

/* Returns how many elements it handled (whole super-groups), 0 for element
 * sizes without a fast copy. */
BS_CLONES static size_t shuffle_fast(const uint8_t *src, uint8_t *dst, size_t n, size_t es) {
  size_t row = n / 8, ns = n / BS_SUPER;
  switch (es) {
  case 1: shuffle_supers(src, dst, ns, 1, row); break;
  case 2: shuffle_supers(src, dst, ns, 2, row); break;
  case 4: shuffle_supers(src, dst, ns, 4, row); break;
  case 8: shuffle_supers(src, dst, ns, 8, row); break;
  case 16: shuffle_supers(src, dst, ns, 16, row); break;
  default: return 0;
  }
  return ns * BS_SUPER;
}
BS_CLONES static size_t unshuffle_fast(const uint8_t *src, uint8_t *dst, size_t n, size_t es) {
  size_t row = n / 8, ns = n / BS_SUPER;
  switch (es) {
  case 1: unshuffle_supers(src, dst, ns, 1, row); break;
  case 2: unshuffle_supers(src, dst, ns, 2, row); break;
  case 4: unshuffle_supers(src, dst, ns, 4, row); break;
  case 8: unshuffle_supers(src, dst, ns, 8, row); break;
  case 16: unshuffle_supers(src, dst, ns, 16, row); break;
  default: return 0;
  }
  return ns * BS_SUPER;
}
#else
static size_t shuffle_fast(const uint8_t *src, uint8_t *dst, size_t n, size_t es) {
  (void)src, (void)dst, (void)n, (void)es;
  return 0;
}
static size_t unshuffle_fast(const uint8_t *src, uint8_t *dst, size_t n, size_t es) {
  (void)src, (void)dst, (void)n, (void)es;
  return 0;
}
#endif

void beam_bitshuffle(const void *in, void *out, size_t n, size_t elem_size) {
  BEAM_ASSERT(n % 8 == 0);
  size_t done = shuffle_fast(in, out, n, elem_size);
  shuffle_tiles(in, out, done / 8, n / 8, elem_size, n / 8);
}

#if BS_X86
/* 16-bit elements (most detectors) with AVX2, 256 at a time. The 16 row
 * segments of 32 bytes are byte-transposed within each 128-bit lane, so
 * register g then holds the 16 row bytes of byte column g (lane 0) and of
 * column g + 16 (lane 1): two 8x8 bit tiles each, one per byte of the
 * elements, which trans8x8's delta swaps (on all four 64-bit words at once)
 * turn into the low and the high bytes of 8 elements; one byte shuffle
 * interleaves them. tests/unit/test_codec.c checks it against the scalar
 * reference. */
__attribute__((target("avx2"))) static inline __m256i trans8x8_avx2(__m256i x) {
  __m256i t;
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 7)),
                       _mm256_set1_epi64x(0x00AA00AA00AA00AALL));
  x = _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 7));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 14)),
                       _mm256_set1_epi64x(0x0000CCCC0000CCCCLL));
  x = _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 14));
  t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, 28)),
                       _mm256_set1_epi64x(0x00000000F0F0F0F0LL));
  return _mm256_xor_si256(_mm256_xor_si256(x, t), _mm256_slli_epi64(t, 28));
}

__attribute__((target("avx2"))) static size_t unshuffle2_avx2(const uint8_t *src, uint8_t *dst,
                                                               size_t n) {
  size_t row = n / 8, ns = n / BS_SUPER;
  const __m256i zip = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                       0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  for (size_t s = 0; s < ns; s++) {
    __m256i r[16], a[16], b[16], c[16];
    for (int k = 0; k < 16; k++)
      r[k] = _mm256_loadu_si256((const __m256i *)(src + (size_t)k * row + s * 32));
    /* a[2i]: columns 0-7 as (row 2i, row 2i+1) pairs; a[2i+1]: columns 8-15. */
    for (int i = 0; i < 8; i++) {
      a[2 * i] = _mm256_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
      a[2 * i + 1] = _mm256_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    /* b[4m+q]: rows 4m..4m+3 of columns 4q..4q+3. */
    for (int m = 0; m < 4; m++) {
      b[4 * m + 0] = _mm256_unpacklo_epi16(a[4 * m], a[4 * m + 2]);
      b[4 * m + 1] = _mm256_unpackhi_epi16(a[4 * m], a[4 * m + 2]);
      b[4 * m + 2] = _mm256_unpacklo_epi16(a[4 * m + 1], a[4 * m + 3]);
      b[4 * m + 3] = _mm256_unpackhi_epi16(a[4 * m + 1], a[4 * m + 3]);
    }
    /* c[h]: rows 0-7 of columns 2h, 2h+1; c[8+h]: rows 8-15. */
    for (int q = 0; q < 4; q++) {
      c[2 * q] = _mm256_unpacklo_epi32(b[q], b[4 + q]);
      c[2 * q + 1] = _mm256_unpackhi_epi32(b[q], b[4 + q]);
      c[8 + 2 * q] = _mm256_unpacklo_epi32(b[8 + q], b[12 + q]);
      c[8 + 2 * q + 1] = _mm256_unpackhi_epi32(b[8 + q], b[12 + q]);
    }
    uint8_t *out = dst + s * BS_SUPER * 2;
    for (int h = 0; h < 8; h++) {
      for (int odd = 0; odd < 2; odd++) {
        __m256i t = odd ? _mm256_unpackhi_epi64(c[h], c[8 + h])
                        : _mm256_unpacklo_epi64(c[h], c[8 + h]);
        int g = 2 * h + odd;
        __m256i v = _mm256_shuffle_epi8(trans8x8_avx2(t), zip);
        _mm_storeu_si128((__m128i *)(out + 16 * g), _mm256_castsi256_si128(v));
        _mm_storeu_si128((__m128i *)(out + 16 * (g + 16)), _mm256_extracti128_si256(v, 1));
      }
    }
  }
  return ns * BS_SUPER;
}
#endif

void beam_bitunshuffle(const void *in, void *out, size_t n, size_t elem_size) {
  BEAM_ASSERT(n % 8 == 0);
  size_t done;
#if BS_X86
  if (elem_size == 2 && __builtin_cpu_supports("avx2"))
    done = unshuffle2_avx2(in, out, n);
  else
#endif
    done = unshuffle_fast(in, out, n, elem_size);
  unshuffle_tiles(in, out, done / 8, n / 8, elem_size, n / 8);
}

/* ---- bounds ---- */

static size_t lz4_bound(size_t n) { return (size_t)LZ4_COMPRESSBOUND(n); }

size_t beam_codec_bound(beam_codec_t codec, size_t raw_bytes, size_t elem_size) {
  if (raw_bytes > CODEC_MAX_RAW) return 0;
  switch (codec) {
  case BEAM_CODEC_RAW:
    return raw_bytes;
  case BEAM_CODEC_LZ4: {
    size_t blk = raw_bytes < LZ4F_DEFAULT_BLOCK ? raw_bytes : LZ4F_DEFAULT_BLOCK;
    size_t nblk = blk ? (raw_bytes + blk - 1) / blk : 0;
    return FRAMING_HDR + nblk * (4 + lz4_bound(blk));
  }
  case BEAM_CODEC_BSLZ4: {
    if (elem_size == 0 || raw_bytes % elem_size) return 0;
    size_t n = raw_bytes / elem_size, b = bshuf_default_block(elem_size);
    size_t last = (n % b) - (n % b) % BSHUF_MULT;
    size_t bound = FRAMING_HDR + (n / b) * (4 + lz4_bound(b * elem_size));
    if (last) bound += 4 + lz4_bound(last * elem_size);
    return bound + (n % BSHUF_MULT) * elem_size;
  }
  case BEAM_CODEC_LZ4_BLOCK:
    return raw_bytes > (size_t)LZ4_MAX_INPUT_SIZE ? 0 : lz4_bound(raw_bytes);
  case BEAM_CODEC_BSZSTD: {
    if (elem_size == 0 || raw_bytes % elem_size) return 0;
    size_t n = raw_bytes / elem_size, b = bshuf_default_block(elem_size);
    size_t last = (n % b) - (n % b) % BSHUF_MULT;
    size_t bound = FRAMING_HDR + (n / b) * (4 + ZSTD_compressBound(b * elem_size));
    if (last) bound += 4 + ZSTD_compressBound(last * elem_size);
    return bound + (n % BSHUF_MULT) * elem_size;
  }
  default:
    return 0;
  }
}

/* ---- encode ---- */

static int clamp_int(size_t v) { return v > (size_t)LZ4_MAX_INPUT_SIZE ? LZ4_MAX_INPUT_SIZE : (int)v; }

static int64_t lz4_encode(const uint8_t *raw, size_t raw_bytes, uint8_t *dst, size_t cap) {
  size_t blk = raw_bytes < LZ4F_DEFAULT_BLOCK ? raw_bytes : LZ4F_DEFAULT_BLOCK;
  if (cap < FRAMING_HDR) return BEAM_ELIMIT;
  be64(dst, raw_bytes);
  be32(dst + 8, (uint32_t)blk);
  size_t pos = FRAMING_HDR;
  for (size_t off = 0; off < raw_bytes; off += blk) {
    size_t len = raw_bytes - off < blk ? raw_bytes - off : blk;
    if (cap - pos < 4) return BEAM_ELIMIT;
    int c = LZ4_compress_default((const char *)raw + off, (char *)dst + pos + 4,
                                 (int)len, clamp_int(cap - pos - 4));
    /* The plugin stores a block raw when LZ4 does not shrink it; 0 here
     * means LZ4 ran out of room, i.e. it would not have shrunk it either. */
    if (c <= 0 || (size_t)c >= len) {
      if (cap - pos - 4 < len) return BEAM_ELIMIT;
      memcpy(dst + pos + 4, raw + off, len);
      c = (int)len;
    }
    be32(dst + pos, (uint32_t)c);
    pos += 4 + (size_t)c;
  }
  return (int64_t)pos;
}

/* zstd: each block a Zstandard frame (bitshuffle's zstd variant). */
static int64_t bs_encode(const uint8_t *raw, size_t raw_bytes, size_t es,
                         uint8_t *dst, size_t cap, uint8_t *scratch, int zstd) {
  size_t n = raw_bytes / es, b = bshuf_default_block(es);
  if (cap < FRAMING_HDR) return BEAM_ELIMIT;
  be64(dst, raw_bytes);
  be32(dst + 8, (uint32_t)(b * es));
  size_t pos = FRAMING_HDR;
  for (size_t i = 0; i < n; i += b) {
    size_t cnt = n - i < b ? n - i : b;
    cnt -= cnt % BSHUF_MULT;
    if (!cnt) break;
    beam_bitshuffle(raw + i * es, scratch, cnt, es);
    if (cap - pos < 4) return BEAM_ELIMIT;
    int64_t c;
    if (zstd) {
      size_t z = ZSTD_compress(dst + pos + 4, cap - pos - 4, scratch, cnt * es, 1);
      c = ZSTD_isError(z) ? -1 : (int64_t)z;
    } else {
      c = LZ4_compress_default((const char *)scratch, (char *)dst + pos + 4, (int)(cnt * es),
                               clamp_int(cap - pos - 4));
    }
    if (c <= 0) return BEAM_ELIMIT;
    be32(dst + pos, (uint32_t)c);
    pos += 4 + (size_t)c;
  }
  size_t tail = (n % BSHUF_MULT) * es;
  if (cap - pos < tail) return BEAM_ELIMIT;
  memcpy(dst + pos, raw + raw_bytes - tail, tail);
  return (int64_t)(pos + tail);
}

int64_t beam_codec_encode(beam_codec_t codec, const void *raw, size_t raw_bytes,
                          size_t elem_size, void *dst, size_t dst_cap, void *scratch) {
  if ((!raw && raw_bytes) || !dst || raw_bytes > CODEC_MAX_RAW) return BEAM_EINVAL;
  switch (codec) {
  case BEAM_CODEC_RAW:
    if (dst_cap < raw_bytes) return BEAM_ELIMIT;
    if (raw_bytes) memcpy(dst, raw, raw_bytes);
    return (int64_t)raw_bytes;
  case BEAM_CODEC_LZ4:
    /* The framing stores the block size in 32 bits. */
    return lz4_encode(raw, raw_bytes, dst, dst_cap);
  case BEAM_CODEC_BSLZ4:
    if (elem_size == 0 || raw_bytes % elem_size || !scratch) return BEAM_EINVAL;
    if (bshuf_default_block(elem_size) * elem_size > UINT32_MAX) return BEAM_EINVAL;
    return bs_encode(raw, raw_bytes, elem_size, dst, dst_cap, scratch, 0);
  case BEAM_CODEC_BSZSTD:
    if (elem_size == 0 || raw_bytes % elem_size || !scratch) return BEAM_EINVAL;
    return bs_encode(raw, raw_bytes, elem_size, dst, dst_cap, scratch, 1);
  case BEAM_CODEC_LZ4_BLOCK: {
    if (raw_bytes > (size_t)LZ4_MAX_INPUT_SIZE) return BEAM_EINVAL;
    int c = LZ4_compress_default(raw, dst, (int)raw_bytes, clamp_int(dst_cap));
    return c > 0 || !raw_bytes ? (int64_t)c : BEAM_ELIMIT;
  }
  default:
    return BEAM_EINVAL;
  }
}

/* ---- decode ---- */

static int lz4_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t raw_bytes,
                      const char **why) {
  if (len < FRAMING_HDR) return fail(why, "lz4: truncated framing header", BEAM_EPROTO);
  if (rbe64(src) != raw_bytes)
    return fail(why, "lz4: total size does not match raw_size", BEAM_EPROTO);
  size_t blk = rbe32(src + 8);
  if (blk == 0 && raw_bytes) return fail(why, "lz4: block size 0", BEAM_EPROTO);
  if (blk > raw_bytes) blk = raw_bytes; /* as the plugin does */
  if (blk > (size_t)LZ4_MAX_INPUT_SIZE) return fail(why, "lz4: block size too large", BEAM_EPROTO);
  size_t pos = FRAMING_HDR;
  for (size_t off = 0; off < raw_bytes; off += blk) {
    size_t want = raw_bytes - off < blk ? raw_bytes - off : blk;
    if (len - pos < 4) return fail(why, "lz4: truncated block header", BEAM_EPROTO);
    size_t c = rbe32(src + pos);
    pos += 4;
    if (c > len - pos) return fail(why, "lz4: block runs past the payload", BEAM_EPROTO);
    if (c == want) {
      memcpy(dst + off, src + pos, want);
    } else if (c > want) {
      return fail(why, "lz4: compressed block larger than its data", BEAM_EPROTO);
    } else {
      int d = LZ4_decompress_safe((const char *)src + pos, (char *)dst + off, (int)c, (int)want);
      if (d < 0 || (size_t)d != want) return fail(why, "lz4: corrupt block", BEAM_EPROTO);
    }
    pos += c;
  }
  if (pos != len) return fail(why, "lz4: trailing bytes after the last block", BEAM_EPROTO);
  return 0;
}

/* Both bitshuffle framings; the reasons name the codec (bslz4: / bszstd:). */
#define BS_FAIL(msg) fail(why, zstd ? "bszstd: " msg : "bslz4: " msg, BEAM_EPROTO)

static int bs_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t raw_bytes,
                     size_t es, uint8_t *scratch, int zstd, const char **why) {
  if (len < FRAMING_HDR) return BS_FAIL("truncated framing header");
  if (rbe64(src) != raw_bytes)
    return BS_FAIL("total size does not match raw_size");
  size_t bbytes = rbe32(src + 8);
  if (bbytes % es) return BS_FAIL("block size not a multiple of the element size");
  size_t b = bbytes / es, n = raw_bytes / es;
  if (b == 0 || b % BSHUF_MULT)
    return BS_FAIL("block size not a positive multiple of 8 elements");
  if (bbytes > (size_t)LZ4_MAX_INPUT_SIZE) return BS_FAIL("block size too large");
  size_t pos = FRAMING_HDR;
  for (size_t i = 0; i < n; i += b) {
    size_t cnt = n - i < b ? n - i : b;
    cnt -= cnt % BSHUF_MULT;
    if (!cnt) break;
    if (len - pos < 4) return BS_FAIL("truncated block header");
    size_t c = rbe32(src + pos);
    pos += 4;
    if (c > len - pos) return BS_FAIL("block runs past the payload");
    int ok;
    if (zstd) {
      size_t d = ZSTD_decompress(scratch, cnt * es, src + pos, c);
      ok = !ZSTD_isError(d) && d == cnt * es;
    } else {
      int d = LZ4_decompress_safe((const char *)src + pos, (char *)scratch, (int)c, (int)(cnt * es));
      ok = d >= 0 && (size_t)d == cnt * es;
    }
    if (!ok) return BS_FAIL("corrupt block");
    beam_bitunshuffle(scratch, dst + i * es, cnt, es);
    pos += c;
  }
  size_t tail = (n % BSHUF_MULT) * es;
  if (len - pos < tail) return BS_FAIL("truncated trailing elements");
  memcpy(dst + raw_bytes - tail, src + pos, tail);
  pos += tail;
  if (pos != len) return BS_FAIL("trailing bytes after the last block");
  return 0;
}

int beam_codec_decode(beam_codec_t codec, const void *src, size_t src_len, void *dst,
                      size_t raw_bytes, size_t elem_size, void *scratch, const char **why) {
  if ((!src && src_len) || (!dst && raw_bytes))
    return fail(why, "NULL buffer", BEAM_EINVAL);
  switch (codec) {
  case BEAM_CODEC_RAW:
    if (src_len != raw_bytes) return fail(why, "raw: payload size != raw_size", BEAM_EPROTO);
    if (raw_bytes) memcpy(dst, src, raw_bytes);
    return 0;
  case BEAM_CODEC_LZ4:
    return lz4_decode(src, src_len, dst, raw_bytes, why);
  case BEAM_CODEC_BSLZ4:
    if (elem_size == 0 || raw_bytes % elem_size)
      return fail(why, "bslz4: raw_size not a multiple of the element size", BEAM_EPROTO);
    if (!scratch && raw_bytes) return fail(why, "bslz4: no scratch buffer", BEAM_EINVAL);
    return bs_decode(src, src_len, dst, raw_bytes, elem_size, scratch, 0, why);
  case BEAM_CODEC_BSZSTD:
    if (elem_size == 0 || raw_bytes % elem_size)
      return fail(why, "bszstd: raw_size not a multiple of the element size", BEAM_EPROTO);
    if (!scratch && raw_bytes) return fail(why, "bszstd: no scratch buffer", BEAM_EINVAL);
    return bs_decode(src, src_len, dst, raw_bytes, elem_size, scratch, 1, why);
  case BEAM_CODEC_LZ4_BLOCK: {
    if (raw_bytes > (size_t)LZ4_MAX_INPUT_SIZE || src_len > (size_t)LZ4_MAX_INPUT_SIZE)
      return fail(why, "lz4 block: too large", BEAM_EPROTO);
    if (!raw_bytes) return src_len <= 1 ? 0 : fail(why, "lz4 block: corrupt block", BEAM_EPROTO);
    int d = LZ4_decompress_safe(src, dst, (int)src_len, (int)raw_bytes);
    if (d < 0) return fail(why, "lz4 block: corrupt block", BEAM_EPROTO);
    if ((size_t)d != raw_bytes) return fail(why, "lz4 block: decodes to fewer bytes than the frame", BEAM_EPROTO);
    return 0;
  }
  default:
    return fail(why, "unknown codec", BEAM_EPROTO);
  }
}

int beam_msg_payload(const beam_msg_t *msg, void *dst, void *scratch, const char **why) {
  if (!msg || (!dst && msg->hdr.raw_size)) return fail(why, "NULL argument", BEAM_EINVAL);
  const beam_hdr_t *h = &msg->hdr;
  if (msg->npayload == 0 || msg->npayload != h->nparts)
    return fail(why, "message has no payload", BEAM_EPROTO);
  size_t es = beam_dtype_size((beam_dtype_t)h->dtype);
  if (h->codec != BEAM_CODEC_RAW) {
    if (msg->npayload != 1) return fail(why, "compressed payload must be one part", BEAM_EPROTO);
    return beam_codec_decode((beam_codec_t)h->codec, msg->payload[0].data, msg->payload[0].size,
                             dst, (size_t)h->raw_size, es, scratch, why);
  }
  /* Raw payloads may be split over parts (e.g. one per detector module). */
  uint8_t *out = dst;
  size_t off = 0;
  for (unsigned i = 0; i < msg->npayload; i++) {
    size_t sz = msg->payload[i].size;
    if (sz > h->raw_size - off) return fail(why, "payload size mismatch", BEAM_EPROTO);
    if (sz) memcpy(out + off, msg->payload[i].data, sz);
    off += sz;
  }
  if (off != h->raw_size) return fail(why, "payload size mismatch", BEAM_EPROTO);
  return 0;
}
