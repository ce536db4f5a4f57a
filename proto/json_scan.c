/* The JSON scanner of proto/json_scan.h: a strict RFC 8259 validator that
 * walks the text once per question instead of building a tree, which is
 * all the DECTRIS v1 decoder needs for its few small objects per message.
 *
 * Every function takes spans that may come from anywhere (a fuzzer, a
 * caller's mistake), so every read is bounded by the span's end even where
 * the scanner produced the span itself; recursion is bounded by the depth
 * argument, never by the input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proto/json_scan.h"

static const char *scan_value(const char *p, const char *end, int depth);

static const char *skip_ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
  return p;
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int hex4(const char *p, const char *end, unsigned *out) {
  if (end - p < 4) return -1;
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval((unsigned char)p[i]);
    if (h < 0) return -1;
    v = (v << 4) | (unsigned)h;
  }
  *out = v;
  return 0;
}

static int is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

/* One UTF-8 sequence starting at p (p[0] >= 0x80): the well-formed ranges of
 * Unicode 15 table 3-7, which excludes overlong forms, surrogates and code
 * points above U+10FFFF. Returns the byte after it, or NULL. */
static const char *scan_utf8(const char *p, const char *end) {
  const unsigned char *u = (const unsigned char *)p;
  size_t left = (size_t)(end - p);
  unsigned char c = u[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) n = 3, lo = 0xA0;
  else if (c == 0xED) n = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) n = 3;
  else if (c == 0xF0) n = 4, lo = 0x90;
  else if (c == 0xF4) n = 4, hi = 0x8F;
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else return NULL;
  if (left < n || u[1] < lo || u[1] > hi) return NULL;
  for (size_t i = 2; i < n; i++)
    if (!is_cont(u[i])) return NULL;
  return p + n;
}

/* p at the opening quote; returns the byte after the closing quote. */
static const char *scan_string(const char *p, const char *end) {
  p++;
  while (p < end) {
    unsigned char c = (unsigned char)*p;
    if (c == '"') return p + 1;
    if (c < 0x20) return NULL;
    if (c == '\\') {
      if (end - p < 2) return NULL;
      switch (p[1]) {
      case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
        p += 2;
        break;
      case 'u': {
        unsigned cp;
        if (hex4(p + 2, end, &cp)) return NULL;
        p += 6;
        break;
      }
      default:
        return NULL;
      }
    } else if (c >= 0x80) {
      p = scan_utf8(p, end);
      if (!p) return NULL;
    } else {
      p++;
    }
  }
  return NULL; /* truncated */
}

static const char *scan_digits(const char *p, const char *end) {
  const char *s = p;
  while (p < end && *p >= '0' && *p <= '9') p++;
  return p > s ? p : NULL;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static const char *scan_number(const char *p, const char *end) {
  if (p < end && *p == '-') p++;
  if (p >= end) return NULL;
  if (*p == '0') p++;
  else if (!(p = scan_digits(p, end))) return NULL;
  if (p < end && *p == '.') {
    if (!(p = scan_digits(p + 1, end))) return NULL;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < end && (*p == '+' || *p == '-')) p++;
    if (!(p = scan_digits(p, end))) return NULL;
  }
  return p;
}

static const char *scan_literal(const char *p, const char *end, const char *lit) {
  size_t n = strlen(lit);
  if ((size_t)(end - p) < n || memcmp(p, lit, n) != 0) return NULL;
  return p + n;
}

/* p at '{' or '['; depth = containers already open around it. */
static const char *scan_container(const char *p, const char *end, int depth) {
  char close = *p == '{' ? '}' : ']';
  int is_obj = *p == '{';
  if (depth + 1 > BEAM_JS_MAX_DEPTH) return NULL;
  p = skip_ws(p + 1, end);
  if (p < end && *p == close) return p + 1;
  for (;;) {
    if (is_obj) {
      if (p >= end || *p != '"') return NULL;
      if (!(p = scan_string(p, end))) return NULL;
      p = skip_ws(p, end);
      if (p >= end || *p != ':') return NULL;
      p = skip_ws(p + 1, end);
    }
    if (!(p = scan_value(p, end, depth + 1))) return NULL;
    p = skip_ws(p, end);
    if (p >= end) return NULL;
    if (*p == close) return p + 1;
    if (*p != ',') return NULL;
    p = skip_ws(p + 1, end);
  }
}

/* p at the first byte of a value (no leading whitespace); returns the byte
 * after the value, or NULL when it is not one complete JSON value. */
static const char *scan_value(const char *p, const char *end, int depth) {
  if (p >= end) return NULL;
  switch (*p) {
  case '{':
  case '[':
    return scan_container(p, end, depth);
  case '"':
    return scan_string(p, end);
  case 't':
    return scan_literal(p, end, "true");
  case 'f':
    return scan_literal(p, end, "false");
  case 'n':
    return scan_literal(p, end, "null");
  default:
    if (*p == '-' || (*p >= '0' && *p <= '9')) return scan_number(p, end);
    return NULL;
  }
}

int beam_js_parse(const void *buf, size_t len, beam_js_t *out) {
  if (!buf || !out) return -1;
  const char *p = buf, *end = p + len;
  p = skip_ws(p, end);
  const char *v = p;
  p = scan_value(p, end, 0);
  if (!p || skip_ws(p, end) != end) return -1;
  out->p = v;
  out->len = (size_t)(p - v);
  return 0;
}

int beam_js_object(const void *buf, size_t len, beam_js_t *out) {
  beam_js_t v;
  if (beam_js_parse(buf, len, &v) || v.p[0] != '{') return -1;
  *out = v;
  return 0;
}

beam_js_type_t beam_js_typeof(beam_js_t v) {
  if (!v.p || !v.len) return BEAM_JS_INVALID;
  switch (v.p[0]) {
  case '{': return BEAM_JS_OBJECT;
  case '[': return BEAM_JS_ARRAY;
  case '"': return BEAM_JS_STRING;
  case 't': return BEAM_JS_TRUE;
  case 'f': return BEAM_JS_FALSE;
  case 'n': return BEAM_JS_NULL;
  default:
    return v.p[0] == '-' || (v.p[0] >= '0' && v.p[0] <= '9') ? BEAM_JS_NUMBER : BEAM_JS_INVALID;
  }
}

/* Shared step of member and element iteration: positions q on the next
 * item of the container c (open byte c.p[0]), or reports its end. */
static int next_item(beam_js_t c, char open, size_t *pos, const char **q) {
  if (!c.p || c.len < 2 || c.p[0] != open || !pos || *pos >= c.len) return -1;
  const char *end = c.p + c.len;
  char close = open == '{' ? '}' : ']';
  const char *p = skip_ws(c.p + (*pos ? *pos : 1), end);
  if (p >= end) return -1;
  if (*p == close) return 0;
  if (*pos) { /* after an item: a separator must follow */
    if (*p != ',') return -1;
    p = skip_ws(p + 1, end);
  }
  *q = p;
  return 1;
}

int beam_js_member(beam_js_t obj, size_t *pos, beam_js_t *key, beam_js_t *val) {
  const char *p = NULL;
  int r = next_item(obj, '{', pos, &p);
  if (r <= 0) return r;
  const char *end = obj.p + obj.len;
  if (p >= end || *p != '"') return -1;
  const char *k = p;
  if (!(p = scan_string(p, end))) return -1;
  const char *kend = p;
  p = skip_ws(p, end);
  if (p >= end || *p != ':') return -1;
  p = skip_ws(p + 1, end);
  const char *v = p;
  /* Depth restarts at 1 here: spans come from a validated document, and for
   * any other span the limit still bounds the recursion. */
  if (!(p = scan_value(p, end, 1))) return -1;
  if (key) key->p = k, key->len = (size_t)(kend - k);
  if (val) val->p = v, val->len = (size_t)(p - v);
  *pos = (size_t)(p - obj.p);
  return 1;
}

int beam_js_element(beam_js_t arr, size_t *pos, beam_js_t *val) {
  const char *p = NULL;
  int r = next_item(arr, '[', pos, &p);
  if (r <= 0) return r;
  const char *v = p;
  if (!(p = scan_value(p, arr.p + arr.len, 1))) return -1;
  if (val) val->p = v, val->len = (size_t)(p - v);
  *pos = (size_t)(p - arr.p);
  return 1;
}

/* ---- strings ---- */

static size_t utf8_put(unsigned cp, unsigned char *o) {
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Decodes the next unit of a string body at *pp into o (1..4 bytes).
 * Returns the byte count, 0 at the closing quote, -1 on anything else
 * (including an unpaired surrogate, which has no UTF-8 form). Raw bytes,
 * multi-byte UTF-8 included, pass one at a time. */
static int str_unit(const char **pp, const char *end, unsigned char o[4]) {
  const char *p = *pp;
  if (p >= end) return -1;
  if (*p == '"') return 0;
  if ((unsigned char)*p < 0x20) return -1;
  if (*p != '\\') {
    o[0] = (unsigned char)*p;
    *pp = p + 1;
    return 1;
  }
  if (end - p < 2) return -1;
  char e = p[1];
  unsigned char simple = 0;
  switch (e) {
  case '"': simple = '"'; break;
  case '\\': simple = '\\'; break;
  case '/': simple = '/'; break;
  case 'b': simple = '\b'; break;
  case 'f': simple = '\f'; break;
  case 'n': simple = '\n'; break;
  case 'r': simple = '\r'; break;
  case 't': simple = '\t'; break;
  case 'u': break;
  default: return -1;
  }
  if (simple) {
    o[0] = simple;
    *pp = p + 2;
    return 1;
  }
  unsigned cp;
  if (hex4(p + 2, end, &cp)) return -1;
  p += 6;
  if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    unsigned lo;
    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) ||
        lo < 0xDC00 || lo > 0xDFFF)
      return -1;
    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    p += 6;
  }
  *pp = p;
  return (int)utf8_put(cp, o);
}

static int is_string(beam_js_t v) { return v.p && v.len >= 2 && v.p[0] == '"'; }

int beam_js_str_raw(beam_js_t v, const char **s, size_t *n) {
  if (!is_string(v) || v.p[v.len - 1] != '"') return -1;
  if (s) *s = v.p + 1;
  if (n) *n = v.len - 2;
  return 0;
}

int64_t beam_js_str_copy(beam_js_t v, char *dst, size_t cap) {
  if (!is_string(v) || !dst || !cap) return -1;
  const char *p = v.p + 1, *end = v.p + v.len;
  size_t n = 0;
  unsigned char u[4];
  int k;
  while ((k = str_unit(&p, end, u)) > 0) {
    if (n + (size_t)k >= cap) return -1;
    for (int i = 0; i < k; i++) {
      if (!u[i]) return -1;
      dst[n++] = (char)u[i];
    }
  }
  if (k < 0) return -1;
  dst[n] = '\0';
  return (int64_t)n;
}

/* Compares the decoded string with lit: 1 when equal (whole) or when lit is
 * a prefix (!whole). */
static int str_cmp(beam_js_t v, const char *lit, int whole) {
  if (!is_string(v) || !lit) return 0;
  const char *p = v.p + 1, *end = v.p + v.len;
  size_t i = 0, n = strlen(lit);
  unsigned char u[4];
  int k;
  while (i < n) {
    k = str_unit(&p, end, u);
    if (k <= 0 || (size_t)k > n - i || memcmp(u, lit + i, (size_t)k) != 0) return 0;
    i += (size_t)k;
  }
  if (!whole) return 1;
  return str_unit(&p, end, u) == 0;
}

int beam_js_str_eq(beam_js_t v, const char *lit) { return str_cmp(v, lit, 1); }
int beam_js_str_prefix(beam_js_t v, const char *lit) { return str_cmp(v, lit, 0); }

int beam_js_get(beam_js_t obj, const char *key, beam_js_t *val) {
  size_t pos = 0;
  beam_js_t k, v;
  int r, found = 0;
  while ((r = beam_js_member(obj, &pos, &k, &v)) > 0) {
    if (beam_js_str_eq(k, key)) {
      found = 1;
      if (val) *val = v;
    }
  }
  return r < 0 ? -1 : found;
}

/* ---- numbers ---- */

int beam_js_u64(beam_js_t v, uint64_t *out) {
  if (!v.p || !v.len || (v.p[0] == '0' && v.len > 1)) return -1;
  uint64_t x = 0;
  for (size_t i = 0; i < v.len; i++) {
    char c = v.p[i];
    if (c < '0' || c > '9') return -1;
    unsigned d = (unsigned)(c - '0');
    if (x > (UINT64_MAX - d) / 10) return -1;
    x = x * 10 + d;
  }
  if (out) *out = x;
  return 0;
}

int beam_js_num(beam_js_t v, double *out) {
  char buf[256];
  if (beam_js_typeof(v) != BEAM_JS_NUMBER || v.len >= sizeof buf) return -1;
  /* Re-check the grammar: strtod also takes hex, "inf" and leading '+'. */
  if (scan_number(v.p, v.p + v.len) != v.p + v.len) return -1;
  memcpy(buf, v.p, v.len);
  buf[v.len] = '\0';
  char *e = NULL;
  double d = strtod(buf, &e);
  if (e != buf + v.len || isinf(d)) return -1;
  if (out) *out = d;
  return 0;
}

int beam_js_bool(beam_js_t v, int *out) {
  beam_js_type_t t = beam_js_typeof(v);
  if (t == BEAM_JS_TRUE && v.len == 4 && memcmp(v.p, "true", 4) == 0) {
    if (out) *out = 1;
    return 0;
  }
  if (t == BEAM_JS_FALSE && v.len == 5 && memcmp(v.p, "false", 5) == 0) {
    if (out) *out = 0;
    return 0;
  }
  return -1;
}

int beam_js_u64_array(beam_js_t v, uint64_t *out, size_t cap, size_t *count) {
  size_t pos = 0, n = 0;
  beam_js_t e;
  int r;
  if (beam_js_typeof(v) != BEAM_JS_ARRAY) return -1;
  while ((r = beam_js_element(v, &pos, &e)) > 0) {
    uint64_t x;
    if (beam_js_u64(e, &x)) return -1;
    if (n < cap && out) out[n] = x;
    n++;
  }
  if (r < 0) return -1;
  if (count) *count = n;
  return 0;
}

int beam_js_num_array(beam_js_t v, double *out, size_t cap, size_t *count) {
  size_t pos = 0, n = 0;
  beam_js_t e;
  int r;
  if (beam_js_typeof(v) != BEAM_JS_ARRAY) return -1;
  while ((r = beam_js_element(v, &pos, &e)) > 0) {
    double x;
    if (beam_js_num(e, &x)) return -1;
    if (n < cap && out) out[n] = x;
    n++;
  }
  if (r < 0) return -1;
  if (count) *count = n;
  return 0;
}
