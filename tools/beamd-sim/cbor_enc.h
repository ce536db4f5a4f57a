/* beamd-sim CBOR writer: the few RFC 8949 items the DECTRIS stream v2
 * emitter (dectris.c) needs, appended to one growable buffer.
 *
 * Every item is written with definite lengths and the shortest argument
 * (RFC 8949 section 4.2.1 "preferred serialization" for heads); floats are
 * always binary64, as DECTRIS' own messages carry them. There is no decoder
 * here and no validation of what the caller nests: the caller counts map
 * pairs and array items itself. The buffer is kept between messages, so
 * once it has grown to the largest message nothing is allocated again.
 * Not a general CBOR library (no indefinite lengths, no bignums).
 */
#ifndef BEAMD_SIM_CBOR_ENC_H
#define BEAMD_SIM_CBOR_ENC_H

#include <stddef.h>
#include <stdint.h>

typedef struct sim_cbor_s {
  uint8_t *buf;
  size_t len, cap;
  int oom; /* a growth failed: the message is incomplete, do not send it */
} sim_cbor_t;

/* CBOR tags (RFC 8949 section 3.4, RFC 8746, DECTRIS compression tag). */
enum {
  SIM_CBOR_TAG_DATETIME = 0,       /* RFC 3339 text */
  SIM_CBOR_TAG_MULTIDIM = 40,      /* [[dims], array], row-major */
  SIM_CBOR_TAG_U8 = 64,            /* typed arrays, little-endian */
  SIM_CBOR_TAG_U16LE = 69,
  SIM_CBOR_TAG_U32LE = 70,
  SIM_CBOR_TAG_F32LE = 85,
  SIM_CBOR_TAG_COMPRESSED = 56500, /* ["algorithm", modifier, bytes] */
  SIM_CBOR_TAG_SELF_DESCRIBE = 55799,
};

/* Empties the buffer (keeps its memory) and clears oom. */
void sim_cbor_reset(sim_cbor_t *self);
/* Makes room for extra more bytes; 0 or -1 (and oom set). */
int sim_cbor_reserve(sim_cbor_t *self, size_t extra);
/* Frees the buffer; NULL-safe, the struct is left empty and reusable. */
void sim_cbor_free(sim_cbor_t *self);

/* Initial byte of major type 0..7 plus its argument in the shortest form. */
void sim_cbor_head(sim_cbor_t *self, unsigned major, uint64_t arg);
void sim_cbor_uint(sim_cbor_t *self, uint64_t v);
void sim_cbor_int(sim_cbor_t *self, int64_t v);
void sim_cbor_bytes(sim_cbor_t *self, const void *p, size_t n);
void sim_cbor_text(sim_cbor_t *self, const char *s);
void sim_cbor_text_n(sim_cbor_t *self, const char *s, size_t n);
void sim_cbor_array(sim_cbor_t *self, uint64_t n);
void sim_cbor_map(sim_cbor_t *self, uint64_t npairs);
void sim_cbor_tag(sim_cbor_t *self, uint64_t tag);
void sim_cbor_bool(sim_cbor_t *self, int b);
void sim_cbor_double(sim_cbor_t *self, double v);
/* Raw bytes appended as they are (a pre-encoded item). */
void sim_cbor_raw(sim_cbor_t *self, const void *p, size_t n);

#endif
