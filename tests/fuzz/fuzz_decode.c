/* libFuzzer entry for the protocol decoder (built by `make fuzz`).
 *
 * The input is a multipart message in the .parts layout of tests/golden:
 * per part a u32 little-endian length then that many bytes (a length past
 * the end takes what is left), at most 24 parts. Each message goes through
 * beam_msg_parse and, when accepted, beam_msg_payload into a scratch buffer
 * bounded by a fuzz-sized limit, so a decoder over-read or over-write shows
 * up under ASan. Tight limits keep each run cheap; the decoder treats them
 * exactly like the defaults.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/err.h"
#include "proto/proto.h"
#include "tests/fuzz/parts.h"

#define MAX_PARTS 24
#define FUZZ_MAX_RAW (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  beam_part_t parts[MAX_PARTS];
  size_t n = fuzz_split_parts(data, size, parts, MAX_PARTS);
  beam_limits_t lim = beam_limits_default;
  lim.max_raw_bytes = FUZZ_MAX_RAW;
  lim.max_meta_bytes = 1u << 16;

  beam_msg_t msg;
  const char *why = NULL;
  int rc = beam_msg_parse(parts, n, &lim, &msg, &why);
  if (rc != 0) {
    if (rc != BEAM_EPROTO || !why) abort();
    return 0;
  }
  if (msg.npayload == 0) return 0;
  if (msg.hdr.raw_size > FUZZ_MAX_RAW) abort(); /* the limit must hold */
  /* Exact-size heap buffers so ASan flags a single byte of overrun. */
  size_t raw = (size_t)msg.hdr.raw_size;
  uint8_t *dst = malloc(raw), *scratch = malloc(raw);
  if (!dst || !scratch) abort();
  rc = beam_msg_payload(&msg, dst, scratch, &why);
  if (rc != 0 && (rc != BEAM_EPROTO || !why)) abort();
  free(dst);
  free(scratch);
  return 0;
}
