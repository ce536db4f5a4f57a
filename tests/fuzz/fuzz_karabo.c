/* libFuzzer entry for the Karabo bridge decoder (built by `make fuzz`).
 *
 * The input is one multipart message in the .parts layout (parts.h; seeds:
 * tests/fuzz/seeds/karabo_*.parts, written by tests/unit/test_karabo with
 * KB_SEED_DIR). Each part is copied into a heap block of its exact size,
 * so ASan flags a read one byte past a part's end. An accepted message has
 * every borrowed pointer checked against its part and every array's size
 * against shape x itemsize; a refusal must come with a "karabo: " reason
 * and one of the documented codes. The bounds walk runs on the raw input
 * too, and where it accepts, msgpack-c must parse the same bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/err.h"
#include "proto/karabo.h"
#include "tests/fuzz/parts.h"

#define MAXP 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int inside(const void *p, size_t n, const beam_part_t *parts, size_t np) {
  for (size_t i = 0; i < np; i++) {
    const uint8_t *b = parts[i].data;
    if ((const uint8_t *)p >= b && n <= parts[i].size &&
        (size_t)((const uint8_t *)p - b) <= parts[i].size - n)
      return 1;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  beam_part_t raw[MAXP], parts[MAXP];
  size_t n = fuzz_split_parts(data, size, raw, MAXP);
  for (size_t i = 0; i < n; i++) {
    void *c = malloc(raw[i].size ? raw[i].size : 1);
    if (!c) abort();
    if (raw[i].size) memcpy(c, raw[i].data, raw[i].size);
    parts[i] = (beam_part_t){c, raw[i].size, NULL};
  }
  static beam_kb_msg_t m;
  const char *why = NULL;
  int rc = beam_kb_parse(parts, n, &m, &why);
  if (rc != 0) {
    if (rc != BEAM_EPROTO && rc != BEAM_ENOTSUP && rc != BEAM_ESHAPE && rc != BEAM_ELIMIT) abort();
    if (!why || strncmp(why, "karabo: ", 8) != 0 || m.nsources || m.narrays) abort();
  } else {
    if (m.version != (n == 1 ? 1 : 2) || m.nsources > BEAM_KB_MAX_SOURCES) abort();
    if (m.narrays > BEAM_KB_MAX_ARRAYS) abort();
    for (unsigned i = 0; i < m.nsources; i++) {
      const beam_kb_source_t *s = &m.src[i];
      if (!inside(s->name.p, s->name.n, parts, n)) abort();
      if (s->data && !inside(s->data, s->data_len, parts, n)) abort();
      if (s->frac_as >= 1000000000000000000ull) abort();
    }
    for (unsigned i = 0; i < m.narrays; i++) {
      const beam_kb_array_t *a = &m.arr[i];
      if (a->source >= m.nsources || a->ndim > BEAM_KB_MAX_NDIM) abort();
      if (!inside(a->path.p, a->path.n, parts, n)) abort();
      if (a->size && !inside(a->data, a->size, parts, n)) abort();
      uint64_t want = beam_dtype_size(a->dtype);
      for (unsigned k = 0; k < a->ndim; k++) want *= a->shape[k];
      if (!beam_dtype_size(a->dtype) || want != a->size) abort();
    }
  }
  if (n && beam_kb_msgpack_check(parts[0].data, parts[0].size) == 0) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&u, parts[0].data, parts[0].size, &off);
    /* Only msgpack-c's nesting limit may refuse what the walk accepted. */
    if (r == MSGPACK_UNPACK_SUCCESS && off != parts[0].size) abort();
    if (r == MSGPACK_UNPACK_CONTINUE || r == MSGPACK_UNPACK_EXTRA_BYTES) abort();
    msgpack_unpacked_destroy(&u);
  }
  for (size_t i = 0; i < n; i++) free((void *)parts[i].data);
  return 0;
}
