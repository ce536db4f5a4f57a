/* beamd-sim CBOR writer (see cbor_enc.h), written from RFC 8949:
 *
 *   section 3:   an item starts with one byte, major type in the top 3 bits,
 *                additional information in the low 5: 0..23 is the
 *                argument itself, 24/25/26/27 say a 1/2/4/8-byte big-endian
 *                argument follows.
 *   section 3.1: major 0 unsigned, 1 negative (-1 - arg), 2 byte string,
 *                3 text string (UTF-8), 4 array, 5 map (arg = pairs),
 *                6 tag, 7 simple values and floats (20 false, 21 true,
 *                27 binary64).
 *
 * Only the encoder side; Python's cbor2 decodes what this writes in the
 * tests, which is the independent check of this file.
 */
#include "tools/beamd-sim/cbor_enc.h"

#include <stdlib.h>
#include <string.h>

void sim_cbor_reset(sim_cbor_t *self) {
  self->len = 0;
  self->oom = 0;
}

int sim_cbor_reserve(sim_cbor_t *self, size_t extra) {
  if (self->oom)
    return -1;
  if (extra <= self->cap - self->len)
    return 0;
  size_t want = self->len + extra;
  size_t cap = self->cap ? self->cap : 4096;
  while (cap < want)
    cap = cap > SIZE_MAX / 2 ? want : cap * 2;
  uint8_t *p = realloc(self->buf, cap);
  if (!p) {
    self->oom = 1;
    return -1;
  }
  self->buf = p;
  self->cap = cap;
  return 0;
}

void sim_cbor_free(sim_cbor_t *self) {
  if (!self)
    return;
  free(self->buf);
  memset(self, 0, sizeof *self);
}

void sim_cbor_raw(sim_cbor_t *self, const void *p, size_t n) {
  if (sim_cbor_reserve(self, n) < 0)
    return;
  if (n)
    memcpy(self->buf + self->len, p, n);
  self->len += n;
}

void sim_cbor_head(sim_cbor_t *self, unsigned major, uint64_t arg) {
  uint8_t b[9];
  size_t n;
  uint8_t mt = (uint8_t)(major << 5);
  if (arg < 24) {
    b[0] = (uint8_t)(mt | arg);
    n = 1;
  } else if (arg <= 0xffu) {
    b[0] = mt | 24;
    b[1] = (uint8_t)arg;
    n = 2;
  } else if (arg <= 0xffffu) {
    b[0] = mt | 25;
    n = 3;
  } else if (arg <= 0xffffffffu) {
    b[0] = mt | 26;
    n = 5;
  } else {
    b[0] = mt | 27;
    n = 9;
  }
  /* Big-endian argument of n - 1 bytes ("network byte order", 3.). */
  for (size_t i = 1; n > 2 && i < n; i++)
    b[i] = (uint8_t)(arg >> (8 * (n - 1 - i)));
  sim_cbor_raw(self, b, n);
}

void sim_cbor_uint(sim_cbor_t *self, uint64_t v) { sim_cbor_head(self, 0, v); }

void sim_cbor_int(sim_cbor_t *self, int64_t v) {
  if (v >= 0)
    sim_cbor_head(self, 0, (uint64_t)v);
  else
    sim_cbor_head(self, 1, (uint64_t)(-(v + 1))); /* -1 - arg, no overflow at INT64_MIN */
}

void sim_cbor_bytes(sim_cbor_t *self, const void *p, size_t n) {
  sim_cbor_head(self, 2, n);
  sim_cbor_raw(self, p, n);
}

void sim_cbor_text_n(sim_cbor_t *self, const char *s, size_t n) {
  sim_cbor_head(self, 3, n);
  sim_cbor_raw(self, s, n);
}

void sim_cbor_text(sim_cbor_t *self, const char *s) { sim_cbor_text_n(self, s, strlen(s)); }

void sim_cbor_array(sim_cbor_t *self, uint64_t n) { sim_cbor_head(self, 4, n); }

void sim_cbor_map(sim_cbor_t *self, uint64_t npairs) { sim_cbor_head(self, 5, npairs); }

void sim_cbor_tag(sim_cbor_t *self, uint64_t tag) { sim_cbor_head(self, 6, tag); }

void sim_cbor_bool(sim_cbor_t *self, int b) {
  uint8_t v = b ? 0xf5 : 0xf4;
  sim_cbor_raw(self, &v, 1);
}

void sim_cbor_double(sim_cbor_t *self, double v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u); /* IEEE 754 binary64 on every target we build for */
  uint8_t b[9];
  b[0] = 0xfb;
  for (int i = 0; i < 8; i++)
    b[1 + i] = (uint8_t)(u >> (56 - 8 * i));
  sim_cbor_raw(self, b, sizeof b);
}
