/* beamd-replay framing check of stored lz4 / bitshuffle+lz4 chunks.
 *
 * A forwarded chunk is sent as HDF5 stored it, so the server checks, without
 * decompressing, that its HDF5 filter framing (PROTOCOL.md section 5.2)
 * accounts for exactly the frame: a garbage or truncated chunk is then sent
 * as a CORRUPT frame rather than passed on for the consumer to reject. The
 * LZ4 data inside the blocks is not checked; that costs a decompression.
 *
 * The check walks a chain of block headers, each found from the one
 * before: one cache miss after another when the chunk is read in place
 * from the page cache (a 512x512 frame has 64 blocks). rp_chunk_check_many
 * therefore walks the chunks of a reply side by side, one block of each in
 * turn, so their misses overlap instead of adding up.
 */
#include "tools/beamd-replay/replay.h"

typedef struct walk_s {
  const uint8_t *p;
  size_t len, pos;
  size_t raw, esize;
  size_t bbytes;  /* lz4: bytes per block */
  size_t b, n, i; /* bslz4: elements per block, in the frame, done; lz4: i = bytes done */
  int bs;
  const char *bad; /* the verdict, once done */
  int done;
} walk_t;

static uint64_t be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void finish(walk_t *w, const char *bad) {
  w->bad = bad;
  w->done = 1;
}

/* The trailer once every block is accounted for. */
static void tail(walk_t *w) {
  if (!w->bs) {
    finish(w, w->pos == w->len ? NULL : "lz4: trailing bytes after the last block");
    return;
  }
  size_t t = (w->n % 8) * w->esize;
  if (w->len - w->pos < t)
    finish(w, "bslz4: truncated trailing elements");
  else
    finish(w, w->len - w->pos == t ? NULL : "bslz4: trailing bytes after the last block");
}

static void start(walk_t *w, beam_codec_t codec, const uint8_t *p, size_t len, size_t raw,
                  size_t esize) {
  *w = (walk_t){.p = p, .len = len, .pos = 12, .raw = raw, .esize = esize,
                .bs = codec == BEAM_CODEC_BSLZ4};
  int bs = w->bs;
  if (len < 12)
    return finish(w, bs ? "bslz4: truncated framing header" : "lz4: truncated framing header");
  if (be64(p) != raw)
    return finish(w, bs ? "bslz4: total size does not match raw_size"
                        : "lz4: total size does not match raw_size");
  w->bbytes = be32(p + 8);
  if (!bs) {
    if (w->bbytes == 0)
      return finish(w, raw ? "lz4: block size 0" : NULL);
    if (raw == 0)
      tail(w);
    return;
  }
  if (w->bbytes % esize)
    return finish(w, "bslz4: block size not a multiple of the element size");
  w->b = w->bbytes / esize;
  w->n = raw / esize;
  if (w->b == 0 || w->b % 8)
    return finish(w, "bslz4: block size not a positive multiple of 8 elements");
}

/* One block header; the next one is prefetched, for the interleaved walk. */
static void step(walk_t *w) {
  size_t want;
  if (!w->bs) {
    want = w->raw - w->i < w->bbytes ? w->raw - w->i : w->bbytes;
  } else {
    size_t cnt = w->n - w->i < w->b ? w->n - w->i : w->b;
    cnt -= cnt % 8;
    if (w->i >= w->n || !cnt)
      return tail(w);
    want = cnt * w->esize;
  }
  if (w->len - w->pos < 4)
    return finish(w, w->bs ? "bslz4: truncated block header" : "lz4: truncated block header");
  size_t c = be32(w->p + w->pos);
  w->pos += 4;
  if (c > w->len - w->pos)
    return finish(w, w->bs ? "bslz4: block runs past the payload"
                           : "lz4: block runs past the payload");
  if (!w->bs && c > want)
    return finish(w, "lz4: compressed block larger than its data");
  /* LZ4's worst case for `want` bytes (LZ4_COMPRESSBOUND). */
  if (w->bs && c > want + want / 255 + 16)
    return finish(w, "bslz4: corrupt block");
  w->pos += c;
  if (w->pos + 4 <= w->len)
    __builtin_prefetch(w->p + w->pos);
  w->i += w->bs ? w->b : w->bbytes;
  if (!w->bs && w->i >= w->raw)
    tail(w);
}

const char *rp_chunk_check(beam_codec_t codec, const uint8_t *p, size_t len, size_t raw,
                           size_t esize) {
  walk_t w;
  start(&w, codec, p, len, raw, esize);
  while (!w.done)
    step(&w);
  return w.bad;
}

void rp_chunk_check_many(const beam_codec_t *codec, const uint8_t *const *p, const size_t *len,
                         size_t n, size_t raw, size_t esize, const char **bad) {
  enum { LANES = 16 }; /* misses in flight: about what a core keeps */
  for (size_t base = 0; base < n; base += LANES) {
    walk_t w[LANES];
    size_t k = n - base < LANES ? n - base : LANES, left = 0;
    for (size_t j = 0; j < k; j++) {
      start(&w[j], codec[base + j], p[base + j], len[base + j], raw, esize);
      left += !w[j].done;
    }
    while (left) {
      left = 0;
      for (size_t j = 0; j < k; j++)
        if (!w[j].done) {
          step(&w[j]);
          left += !w[j].done;
        }
    }
    for (size_t j = 0; j < k; j++)
      bad[base + j] = w[j].bad;
  }
}
