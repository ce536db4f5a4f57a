/* libFuzzer entry for the DECTRIS stream v2 decoder (built by `make fuzz`).
 *
 * The input is one ZeroMQ message body (seeds: tests/fuzz/seeds/
 * dectris2_*.cbor, written by tests/unit/test_dectris2 with DX2_SEED_DIR).
 * It goes through beam_dx2_parse from an exact-size heap copy, so ASan
 * flags a read one byte past the end; an accepted message has its
 * borrowed pointers and sizes checked against the input, and a start
 * message goes through beam_dx_meta_json at a roomy and at a tight
 * capacity. The JSON converter also runs on the raw input as if it were a
 * start message's config, which reaches it with CBOR the parser would have
 * refused. Any return code or reason outside the documented set aborts.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dectris.h"
#include "proto/err.h"

#define JSON_CAP (1u << 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_array(const beam_dx_array_t *a, const uint8_t *buf, size_t len) {
  if (!a->data) abort();
  const uint8_t *p = a->data;
  if (p < buf || a->size > len || p - buf > (ptrdiff_t)(len - a->size)) abort(); /* inside the input */
  size_t es = beam_dtype_size(a->dtype);
  if (es == 0 || a->ndim < 1 || a->ndim > 2) abort();
  uint64_t n = a->shape[0];
  if (a->ndim == 2) n *= a->shape[1];
  if (a->raw_size != n * es) abort();
  if (a->codec == BEAM_CODEC_RAW ? a->size != a->raw_size : a->size < 12) abort();
  if (memchr(a->channel, 0, sizeof a->channel) == NULL) abort();
}

static void check_json(const beam_dx_start_t *s, size_t cap, size_t max_inline) {
  char *out = malloc(cap);
  if (!out) abort();
  int64_t n = beam_dx_meta_json(s, 2, out, cap, max_inline);
  if (n >= 0) {
    if ((size_t)n >= cap || out[n] != 0 || strlen(out) != (size_t)n) abort();
  } else if (n == BEAM_ELIMIT || n == BEAM_EPROTO) {
    if (memchr(out, 0, cap) == NULL) abort(); /* still a C string */
  } else {
    abort();
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint8_t *buf = malloc(size ? size : 1);
  if (!buf) abort();
  if (size) memcpy(buf, data, size);

  beam_dx_msg_t m;
  const char *why = NULL;
  int rc = beam_dx2_parse(size ? buf : NULL, size, &m, &why);
  if (rc != 0) {
    if (rc != BEAM_EPROTO && rc != BEAM_ENOTSUP && rc != BEAM_ESHAPE) abort();
    if (!why || strncmp(why, "dectris v2: ", 12) != 0 || m.kind != BEAM_DX_NONE) abort();
  } else {
    if (m.version != 2) abort();
    switch (m.kind) {
    case BEAM_DX_START: {
      const beam_dx_start_t *s = &m.start;
      if (s->config != buf || s->config_len != size || s->nchannels > BEAM_DX_MAX_CHANNELS) abort();
      if (s->nflatfield > BEAM_DX_MAX_CHANNELS || s->npixel_mask > BEAM_DX_MAX_CHANNELS) abort();
      for (unsigned i = 0; i < s->nflatfield; i++) check_array(&s->flatfield[i], buf, size);
      for (unsigned i = 0; i < s->npixel_mask; i++) check_array(&s->pixel_mask[i], buf, size);
      if (s->countrate.data) check_array(&s->countrate, buf, size);
      if (s->user_data && ((const uint8_t *)s->user_data < buf ||
                           (const uint8_t *)s->user_data + s->user_data_len > buf + size))
        abort();
      check_json(s, JSON_CAP, 64);
      check_json(s, 1 + size % 97, size % 5);
      break;
    }
    case BEAM_DX_IMAGE:
      if (m.image.nchannels > BEAM_DX_MAX_CHANNELS) abort();
      for (unsigned i = 0; i < m.image.nchannels; i++) check_array(&m.image.data[i], buf, size);
      break;
    case BEAM_DX_END: break;
    case BEAM_DX_OTHER:
      if (memchr(m.other_type, 0, sizeof m.other_type) == NULL) abort();
      break;
    default: abort();
    }
  }

  /* The converter on CBOR the parser never vetted. */
  beam_dx_start_t raw;
  memset(&raw, 0, sizeof raw);
  raw.config = size ? buf : NULL;
  raw.config_len = size;
  check_json(&raw, JSON_CAP, 16);
  free(buf);
  return 0;
}
