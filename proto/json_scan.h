/* A small JSON scanner for the detector streams that speak JSON (DECTRIS
 * stream v1): validates one document, finds a key of an object, and reads
 * numbers, strings, booleans and arrays of numbers in place.
 *
 * It is not a JSON library: it builds no tree, allocates nothing and
 * copies nothing but the few strings a caller asks to have decoded. Every
 * value is a span of the caller's buffer, valid as long as the buffer is.
 * Validation follows RFC 8259 strictly (no comments, no trailing commas, no
 * NaN, no leading zeros, UTF-8 checked, control characters in strings
 * refused), so non-JSON and truncated JSON are told apart from JSON.
 * Nesting is limited to BEAM_JS_MAX_DEPTH containers because the scanner
 * recurses once per level; a document nested deeper is refused.
 *
 * Number conversion uses strtod, so it assumes LC_NUMERIC is "C" (beamd
 * never calls setlocale).
 */
#ifndef BEAM_JSON_SCAN_H
#define BEAM_JSON_SCAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Containers (objects and arrays) that may be open at once. */
#define BEAM_JS_MAX_DEPTH 32

typedef enum beam_js_type_e {
  BEAM_JS_INVALID = 0,
  BEAM_JS_OBJECT,
  BEAM_JS_ARRAY,
  BEAM_JS_STRING,
  BEAM_JS_NUMBER,
  BEAM_JS_TRUE,
  BEAM_JS_FALSE,
  BEAM_JS_NULL,
} beam_js_type_t;

/* One JSON value as a span of the caller's text: p[0] is its first byte
 * ('{', '[', '"', a digit or '-', or a literal), p[len-1] its last. */
typedef struct beam_js_s {
  const char *p;
  size_t len;
} beam_js_t;

/* Validates that buf holds exactly one JSON value, with nothing but JSON
 * whitespace around it, and sets *out to the value's span. Returns 0, or
 * -1 when the text is not JSON, is truncated, or nests too deeply. */
int beam_js_parse(const void *buf, size_t len, beam_js_t *out);

/* beam_js_parse, and the value must be an object. */
int beam_js_object(const void *buf, size_t len, beam_js_t *out);

/* The type of a span's value, judged by its first byte (the span must come
 * from this scanner). */
beam_js_type_t beam_js_typeof(beam_js_t v);

/* Member iteration over an object: start with *pos = 0; each call returns
 * 1 and the next key (string span, quotes included) and value, or 0 at the
 * end, or -1 when obj is not a valid object. */
int beam_js_member(beam_js_t obj, size_t *pos, beam_js_t *key, beam_js_t *val);

/* Element iteration over an array, like beam_js_member. */
int beam_js_element(beam_js_t arr, size_t *pos, beam_js_t *val);

/* Finds a key of the object (compared after decoding escapes, so "\u0068"
 * matches "h"). When the key occurs more than once the last one counts, as
 * in Python's json and jansson. Returns 1 and *val, 0 when absent, -1 when
 * obj is not a valid object. */
int beam_js_get(beam_js_t obj, const char *key, beam_js_t *val);

/* Readers: 0 and *out, or -1 when the value is not of that kind. */
/* An unsigned integer written as one: digits only, no sign, fraction or
 * exponent, at most UINT64_MAX. */
int beam_js_u64(beam_js_t v, uint64_t *out);
/* Any JSON number as a double; -1 also when it overflows to infinity or is
 * longer than 255 characters. */
int beam_js_num(beam_js_t v, double *out);
int beam_js_bool(beam_js_t v, int *out);
/* A string's raw contents between the quotes, escapes not decoded. */
int beam_js_str_raw(beam_js_t v, const char **s, size_t *n);
/* A string decoded (escapes, \u surrogate pairs to UTF-8) into dst, NUL
 * terminated. Returns its length, or -1 when v is not a string, it does
 * not fit in cap bytes with the NUL, or it holds an unpaired surrogate or
 * a NUL character (neither survives as a C string). */
int64_t beam_js_str_copy(beam_js_t v, char *dst, size_t cap);
/* 1 when v is a string whose decoded text equals lit (beam_js_str_eq) or
 * starts with it (beam_js_str_prefix), else 0 (also when not a string). */
int beam_js_str_eq(beam_js_t v, const char *lit);
int beam_js_str_prefix(beam_js_t v, const char *lit);

/* Arrays of numbers: fills out[0..min(count, cap)) and sets *count to the
 * number of elements, so a caller sees an array longer than it expected.
 * Returns 0, or -1 when v is not an array or an element is not of the
 * reader's kind (beam_js_u64 / beam_js_num). */
int beam_js_u64_array(beam_js_t v, uint64_t *out, size_t cap, size_t *count);
int beam_js_num_array(beam_js_t v, double *out, size_t cap, size_t *count);

#ifdef __cplusplus
}
#endif
#endif
