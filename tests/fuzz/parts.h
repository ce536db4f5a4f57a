/* The .parts layout every fuzz target reads its multipart message from
 * (tests/golden, tests/fuzz/seeds): per part a u32 little-endian length,
 * then that many bytes; a length past the end takes what is left. */
#ifndef BEAM_FUZZ_PARTS_H
#define BEAM_FUZZ_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

static inline size_t fuzz_split_parts(const uint8_t *data, size_t size, beam_part_t *parts,
                                      size_t max) {
  size_t n = 0, pos = 0;
  while (pos + 4 <= size && n < max) {
    uint32_t len = (uint32_t)data[pos] | ((uint32_t)data[pos + 1] << 8) |
                   ((uint32_t)data[pos + 2] << 16) | ((uint32_t)data[pos + 3] << 24);
    pos += 4;
    if (len > size - pos) len = (uint32_t)(size - pos);
    parts[n] = (beam_part_t){data + pos, len, NULL};
    n++;
    pos += len;
  }
  return n;
}

#endif
