/* libFuzzer entry for the DECTRIS stream v1 decoder and its JSON scanner
 * (built by `make fuzz`).
 *
 * The input is a multipart message in the .parts layout of the other
 * seeds: per part a u32 little-endian length then that many bytes (a
 * length past the end takes what is left), at most 24 parts. Each message
 * goes through beam_dx_detect and beam_dx1_parse; an accepted one is
 * checked against what dectris.h promises (every pointer inside the
 * input, sizes that agree with shapes) and its image blob is decoded into
 * an exact-size heap buffer when small, so an over-read or over-write in
 * either the decoder or the codec shows up under ASan. Part 1 is also
 * walked through the scanner's iterators and readers: a document the
 * validator accepts must never make them fail.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dectris.h"
#include "proto/err.h"
#include "proto/json_scan.h"
#include "proto/proto.h"
#include "tests/fuzz/parts.h"

#define MAX_PARTS 24
#define FUZZ_MAX_RAW (1u << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t *in_lo, *in_hi;

/* A returned span must lie inside the fuzz input (that is, a caller part). */
static void inside(const void *p, size_t n) {
  if (!p) {
    if (n) abort();
    return;
  }
  const uint8_t *q = p;
  if (q < in_lo || q > in_hi || n > (size_t)(in_hi - q)) abort();
}

static void walk(beam_js_t v, int depth) {
  if (depth > BEAM_JS_MAX_DEPTH) abort(); /* the validator let it through */
  beam_js_t k, e;
  size_t pos = 0;
  int r;
  char buf[16];
  uint64_t u;
  double d;
  int b;
  switch (beam_js_typeof(v)) {
  case BEAM_JS_OBJECT:
    while ((r = beam_js_member(v, &pos, &k, &e)) > 0) {
      if (beam_js_str_raw(k, NULL, NULL)) abort();
      if (beam_js_str_copy(k, buf, sizeof buf) >= 0 && beam_js_get(v, buf, NULL) != 1) abort();
      walk(e, depth + 1);
    }
    if (r < 0) abort();
    break;
  case BEAM_JS_ARRAY:
    while ((r = beam_js_element(v, &pos, &e)) > 0) walk(e, depth + 1);
    if (r < 0) abort();
    (void)beam_js_u64_array(v, &u, 1, &pos);
    break;
  case BEAM_JS_STRING:
    if (beam_js_str_raw(v, NULL, NULL)) abort();
    (void)beam_js_str_copy(v, buf, sizeof buf);
    (void)beam_js_str_prefix(v, "d");
    break;
  case BEAM_JS_NUMBER:
    (void)beam_js_u64(v, &u);
    (void)beam_js_num(v, &d);
    break;
  case BEAM_JS_TRUE:
  case BEAM_JS_FALSE:
    if (beam_js_bool(v, &b)) abort();
    break;
  case BEAM_JS_NULL:
    break;
  default:
    abort();
  }
}

static void check_array(const beam_dx_array_t *a, int decode) {
  if (!a->data) return;
  inside(a->data, a->size);
  size_t es = beam_dtype_size(a->dtype);
  if (!es || a->ndim < 1 || a->ndim > 2) abort();
  uint64_t n = es;
  for (uint32_t i = 0; i < a->ndim; i++) {
    if (!a->shape[i]) abort();
    n *= a->shape[i];
  }
  if (n != a->raw_size) abort();
  if (a->codec == BEAM_CODEC_RAW && a->size != a->raw_size) abort();
  if (a->codec == BEAM_CODEC_BSLZ4 && a->size < 12) abort();
  if (!decode || a->raw_size > FUZZ_MAX_RAW) return;
  /* Exact-size heap buffers so ASan flags a single byte of overrun. */
  size_t raw = (size_t)a->raw_size;
  uint8_t *dst = malloc(raw), *scratch = malloc(raw);
  if (!dst || !scratch) abort();
  const char *why = NULL;
  int rc = beam_codec_decode(a->codec, a->data, a->size, dst, raw, es, scratch, &why);
  if (rc != 0 && (rc != BEAM_EPROTO || !why)) abort();
  free(dst);
  free(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  beam_part_t parts[MAX_PARTS];
  size_t n = fuzz_split_parts(data, size, parts, MAX_PARTS);
  in_lo = data;
  in_hi = data + size;

  int v = beam_dx_detect(parts, n);
  if (v < 0 || v > 2) abort();
  if (n > 0) {
    beam_js_t doc;
    if (beam_js_parse(parts[0].data, parts[0].size, &doc) == 0) {
      inside(doc.p, doc.len);
      walk(doc, 1);
    }
  }

  beam_dx_msg_t msg;
  const char *why = NULL;
  int rc = beam_dx1_parse(parts, n, &msg, &why);
  if (rc != 0) {
    if ((rc != BEAM_EPROTO && rc != BEAM_ENOTSUP && rc != BEAM_ESHAPE) || !why ||
        strncmp(why, "dectris v1: ", 12) != 0 || msg.kind != BEAM_DX_NONE)
      abort();
    return 0;
  }
  if (msg.version != 1 || v != 1) abort(); /* accepted v1 starts with '{' */
  switch (msg.kind) {
  case BEAM_DX_START: {
    const beam_dx_start_t *s = &msg.start;
    if (s->header_detail < 0 || s->header_detail > 2) abort();
    if (s->have_config != (s->header_detail > 0)) abort();
    inside(s->config, s->config_len);
    inside(s->user_data, s->user_data_len);
    check_array(&s->flatfield[0], 0);
    check_array(&s->pixel_mask[0], 0);
    check_array(&s->countrate, 0);
    if (s->trigger_mode[sizeof s->trigger_mode - 1]) abort();
    break;
  }
  case BEAM_DX_IMAGE: {
    const beam_dx_image_t *im = &msg.image;
    if (im->nchannels != 1 || im->data[0].ndim != 2 || !im->data[0].data) abort();
    inside(im->hash, im->hash_len);
    inside(im->user_data, im->user_data_len);
    check_array(&im->data[0], 1);
    break;
  }
  case BEAM_DX_END:
    if (n != 1) abort();
    break;
  default:
    abort();
  }
  return 0;
}
