/* beamd-replay framing check of stored lz4 / bitshuffle+lz4 chunks.
 *
 * A forwarded chunk is sent as HDF5 stored it, so the server checks, without
 * decompressing, that its HDF5 filter framing (PROTOCOL.md section 5.2)
 * accounts for exactly the frame: a garbage or truncated chunk is then sent
 * as a CORRUPT frame rather than passed on for the consumer to reject. The
 * LZ4 data inside the blocks is not checked; that costs a decompression.
 */
#include "tools/beamd-replay/replay.h"


static uint64_t be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

const char *rp_chunk_check(beam_codec_t codec, const uint8_t *p, size_t len, size_t raw,
                           size_t esize) {
  int bs = codec == BEAM_CODEC_BSLZ4;
  if (len < 12)
    return bs ? "bslz4: truncated framing header" : "lz4: truncated framing header";
  if (be64(p) != raw)
    return bs ? "bslz4: total size does not match raw_size"
              : "lz4: total size does not match raw_size";
  size_t bbytes = be32(p + 8), pos = 12;
  if (!bs) {
    if (bbytes == 0)
      return raw ? "lz4: block size 0" : NULL;
    for (size_t off = 0; off < raw; off += bbytes) {
      size_t want = raw - off < bbytes ? raw - off : bbytes;
      if (len - pos < 4)
        return "lz4: truncated block header";
      size_t c = be32(p + pos);
      pos += 4;
      if (c > len - pos)
        return "lz4: block runs past the payload";
      if (c > want)
        return "lz4: compressed block larger than its data";
      pos += c;
    }
    return pos == len ? NULL : "lz4: trailing bytes after the last block";
  }
  if (bbytes % esize)
    return "bslz4: block size not a multiple of the element size";
  size_t b = bbytes / esize, n = raw / esize;
  if (b == 0 || b % 8)
    return "bslz4: block size not a positive multiple of 8 elements";
  for (size_t i = 0; i < n; i += b) {
    size_t cnt = n - i < b ? n - i : b;
    cnt -= cnt % 8;
    if (!cnt)
      break;
    if (len - pos < 4)
      return "bslz4: truncated block header";
    size_t c = be32(p + pos);
    pos += 4;
    if (c > len - pos)
      return "bslz4: block runs past the payload";
    /* LZ4's worst case for cnt*esize bytes (LZ4_COMPRESSBOUND). */
    if (c > cnt * esize + cnt * esize / 255 + 16)
      return "bslz4: corrupt block";
    pos += c;
  }
  size_t tail = (n % 8) * esize;
  if (len - pos < tail)
    return "bslz4: truncated trailing elements";
  return len - pos == tail ? NULL : "bslz4: trailing bytes after the last block";
}
