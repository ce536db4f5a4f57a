/* Checks an LZ4 block without decompressing it (lz4_check.h).
 *
 * The walk follows the block format sequence by sequence (token, literal
 * length, literals, offset, match length) and keeps only positions. Each
 * rule below is at least as strict as LZ4_decompress_safe's own checks, so
 * a block accepted here decodes there; the fuzz target fuzz_lz4_check holds
 * this against liblz4 byte for byte. The end-of-block rules are the format's
 * (the last 5 bytes are literals, the last match starts 12 bytes or more
 * before the end), which every conforming compressor follows and the
 * decoder relies on:
 *   - a literal run that is not the last ends at least 12 bytes before the
 *     output's end and 8 bytes before the input's (the decoder treats any
 *     run nearer the end as the last one, which must then end both exactly);
 *   - a match has offset 1..(bytes produced so far), no dictionary, and ends
 *     at least 5 bytes before the output's end;
 *   - the last run leaves input and output both exactly consumed. */
#include "proto/lz4_check.h"

#define LC_MINMATCH 4u
#define LC_LASTLITERALS 5u
#define LC_MFLIMIT 12u
#define LC_TAIL_IN 8u /* offset (2) + token (1) + last literals (5) */

/* Reads the extension bytes of a 15 nibble; 0 when the input ends first
 * or the length would pass limit. */
static int ext_len(const uint8_t **ip, const uint8_t *iend, size_t *len, size_t limit) {
  unsigned b;
  do {
    if (*ip >= iend)
      return 0;
    b = *(*ip)++;
    *len += b;
    if (*len > limit)
      return 0;
  } while (b == 255);
  return 1;
}

int beam_lz4_block_check(const void *src, size_t src_len, size_t out_len) {
  const uint8_t *ip = src, *const iend = ip + src_len;
  size_t op = 0;
  if (src_len == 0)
    return 0; /* the decoder refuses an empty block, even for out_len 0 */
  if (out_len == 0)
    return src_len == 1 && ip[0] == 0; /* the decoder's one form of nothing */
  for (;;) {
    unsigned token = *ip++;
    size_t lit = token >> 4;
    if (lit == 15 && !ext_len(&ip, iend, &lit, out_len - op))
      return 0;
    if (lit > (size_t)(iend - ip) || lit > out_len - op)
      return 0;
    ip += lit;
    op += lit;
    if (ip == iend)
      return op == out_len;
    /* Not the last run: the decoder's end zones. */
    if ((size_t)(iend - ip) < LC_TAIL_IN || out_len - op < LC_MFLIMIT)
      return 0;
    size_t off = (size_t)ip[0] | (size_t)ip[1] << 8;
    ip += 2;
    if (off == 0 || off > op)
      return 0;
    size_t mlen = token & 15u;
    if (mlen == 15 && !ext_len(&ip, iend, &mlen, out_len))
      return 0;
    mlen += LC_MINMATCH;
    if (mlen > out_len - op || out_len - op - mlen < LC_LASTLITERALS)
      return 0;
    if ((size_t)(iend - ip) < 1 + LC_LASTLITERALS)
      return 0; /* no room left for the last run */
    op += mlen;
  }
}
