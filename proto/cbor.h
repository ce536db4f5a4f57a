/* A small CBOR (RFC 8949) walker over a caller's buffer: no allocation, no
 * copy, no libcbor. It exists for the DECTRIS stream v2 decoder
 * (proto/dectris2.c), whose messages use a handful of item types; it is not
 * a general CBOR library (no encoder, no canonical-form checks, no
 * validation of UTF-8 or of tag semantics).
 *
 * Why not libcbor: proto/ stays libc-only, byte and text strings are
 * returned as pointers into the message (zero-copy), nothing is allocated
 * per message, and what DECTRIS sends needs a few hundred lines.
 *
 * What it reads: major types 0-7 with 1/2/4/8-byte arguments, tags, the
 * simple values, half/single/double floats (half converted by hand, no
 * libm). Definite-length items everywhere; indefinite-length arrays and
 * maps too (break-terminated, as tinycbor-based senders may write them when
 * the field count is not known up front). Indefinite-length (chunked) byte
 * and text strings are rejected: they cannot be returned as one pointer.
 *
 * Safety rules, all checked before anything is used:
 *   - a string length must fit the bytes left (so a 64-bit length that would
 *     overflow size_t, or run past the end, is rejected);
 *   - an array of n items needs at least n bytes left, a map 2n, so a huge
 *     count is rejected at once instead of being walked;
 *   - nesting is bounded: the depth of an item is the number of arrays, maps
 *     and tags around it (the caller says where it starts); an array, map or
 *     tag at depth >= BEAM_CBOR_MAX_DEPTH is rejected, so no walk recurses or
 *     stacks more than BEAM_CBOR_MAX_DEPTH levels;
 *   - reserved additional information (28-30), a break outside an
 *     indefinite-length container, an indefinite map whose last key has no
 *     value and a two-byte simple value below 32 are not well formed.
 * Every failure returns BEAM_EPROTO and leaves the reason in c->err. */
#ifndef BEAM_CBOR_H
#define BEAM_CBOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_CBOR_MAX_DEPTH 32

typedef enum beam_cbor_major_e {
  BEAM_CBOR_UINT = 0,
  BEAM_CBOR_NEGINT = 1, /* value -1 - val */
  BEAM_CBOR_BYTES = 2,
  BEAM_CBOR_TEXT = 3,
  BEAM_CBOR_ARRAY = 4,
  BEAM_CBOR_MAP = 5,
  BEAM_CBOR_TAG = 6,
  BEAM_CBOR_SIMPLE = 7, /* simple values and floats */
} beam_cbor_major_t;

/* Simple values (major 7, val) that CBOR names. */
enum {
  BEAM_CBOR_FALSE = 20,
  BEAM_CBOR_TRUE = 21,
  BEAM_CBOR_NULL = 22,
  BEAM_CBOR_UNDEFINED = 23,
};

typedef enum beam_cbor_err_e {
  BEAM_CBOR_OK = 0,
  BEAM_CBOR_ETRUNC,     /* item (or its length or count) runs past the end */
  BEAM_CBOR_ERESERVED,  /* additional information 28-30, or 31 on an integer or tag */
  BEAM_CBOR_EINDEF_STR, /* indefinite-length byte or text string */
  BEAM_CBOR_EBREAK,     /* break (0xff) where an item is due */
  BEAM_CBOR_EDEPTH,     /* array, map or tag at depth >= BEAM_CBOR_MAX_DEPTH */
  BEAM_CBOR_EODDMAP,    /* indefinite-length map ends after a key */
  BEAM_CBOR_ESIMPLE,    /* two-byte simple value below 32 */
  BEAM_CBOR_ECOUNT_
} beam_cbor_err_t;

/* A cursor: the next item starts at p; end is one past the buffer. */
typedef struct beam_cbor_s {
  const uint8_t *p, *end;
  beam_cbor_err_t err; /* why the last failing call failed */
} beam_cbor_t;

/* One item's head, as beam_cbor_read leaves it. */
typedef struct beam_cbor_item_s {
  const uint8_t *start; /* first byte of the head */
  uint8_t major;        /* beam_cbor_major_t */
  uint8_t indef;        /* array or map of indefinite length (val is 0) */
  uint8_t flt;          /* major 7: 2, 4 or 8 when a float of that size, else 0 */
  /* UINT: the value; NEGINT: -1 - value; BYTES, TEXT: length in bytes;
   * ARRAY: items; MAP: pairs; TAG: tag number; SIMPLE: the simple value
   * (or the raw bits of a float). */
  uint64_t val;
  const uint8_t *data; /* BYTES, TEXT: the content (not NUL-terminated) */
  double f;            /* float: its value as a double */
} beam_cbor_item_t;

/* Walks the items of one array or map (see beam_cbor_next). */
typedef struct beam_cbor_iter_s {
  uint64_t left; /* definite: items or pairs still to come */
  uint8_t indef; /* 1 until the break has been read */
} beam_cbor_iter_t;

void beam_cbor_init(beam_cbor_t *c, const void *buf, size_t len);

/* Reads one head and moves past it; for a byte or text string also past
 * its content (it->data points at it). For an array, map or tag the content
 * follows at c->p: walk it with beam_cbor_iter/next, or skip it with
 * beam_cbor_skip_content. Returns 0 or BEAM_EPROTO. */
int beam_cbor_read(beam_cbor_t *c, beam_cbor_item_t *it);

/* Skips one whole item (head and content) at depth `depth`. */
int beam_cbor_skip(beam_cbor_t *c, unsigned depth);

/* Skips the content of an item whose head was just read at depth `depth`
 * (nothing to do for anything but arrays, maps and tags). */
int beam_cbor_skip_content(beam_cbor_t *c, const beam_cbor_item_t *it, unsigned depth);

/* Starts a walk over the array or map whose head is `it`; then call
 * beam_cbor_next before each item (array) or each key/value pair (map):
 * it returns 1 when one follows (read it, and for a map its value too), 0 at
 * the end (an indefinite container's break is consumed), BEAM_EPROTO when
 * the message ends first. */
void beam_cbor_iter(const beam_cbor_item_t *it, beam_cbor_iter_t *k);
int beam_cbor_next(beam_cbor_t *c, beam_cbor_iter_t *k);

/* IEEE 754 binary16 bits to double, exact (subnormals, infinities, NaN). */
double beam_cbor_half(uint16_t h);

/* An integer or float item as a double: 0, or -1 for any other item. */
int beam_cbor_number(const beam_cbor_item_t *it, double *out);

/* 1 when `it` is a text string equal to the NUL-terminated s. */
int beam_cbor_text_is(const beam_cbor_item_t *it, const char *s);

/* "truncated item" etc. (no prefix). */
const char *beam_cbor_strerror(beam_cbor_err_t e);

#ifdef __cplusplus
}
#endif
#endif
