/* libFuzzer entry for the LZ4 block walk (proto/lz4_check.c), held against
 * liblz4 itself (built by `make fuzz`).
 *
 * Input: one mode byte, two bytes of output size (little-endian), then the
 * body. Mode even: the body is an LZ4 block; whenever the walk accepts it,
 * LZ4_decompress_safe must decode it to exactly that size (the walk is
 * never more lenient than the decoder). Mode odd: the body is data,
 * compressed by liblz4 (fast or HC, by the mode's next bit); the walk must
 * accept the block for the data's size and refuse it for any other size
 * (never stricter than the format on what a conforming encoder writes). */
#include <lz4.h>
#include <lz4hc.h>
#include <stdint.h>
#include <stdlib.h>

#include "proto/lz4_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  unsigned mode = data[0];
  size_t out = (size_t)data[1] | (size_t)data[2] << 8;
  const uint8_t *body = data + 3;
  size_t n = size - 3;
  if (!(mode & 1)) {
    if (!beam_lz4_block_check(body, n, out))
      return 0;
    char *dst = malloc(out ? out : 1); /* exact size: ASan sees any overrun */
    if (!dst)
      abort();
    int got = LZ4_decompress_safe((const char *)body, dst, (int)n, (int)out);
    if (got < 0 || (size_t)got != out)
      abort();
    free(dst);
    return 0;
  }
  int cap = LZ4_compressBound((int)n);
  char *c = malloc((size_t)cap + 1);
  if (!c)
    abort();
  int clen = mode & 2 ? LZ4_compress_HC((const char *)body, c, (int)n, cap, (int)(mode >> 2) % 13)
                      : LZ4_compress_default((const char *)body, c, (int)n, cap);
  if (clen <= 0)
    abort();
  if (!beam_lz4_block_check(c, (size_t)clen, n))
    abort();
  if (beam_lz4_block_check(c, (size_t)clen, n + 1 + out % 64) || (n && beam_lz4_block_check(c, (size_t)clen, n - 1)))
    abort();
  free(c);
  return 0;
}
