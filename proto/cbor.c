/* CBOR walker (see proto/cbor.h): heads, strings as borrowed pointers, a
 * non-recursive skip over any item with an explicit stack of at most
 * BEAM_CBOR_MAX_DEPTH levels, and half-float conversion by hand. Written
 * from RFC 8949 sections 3 (encoding), 3.2 (indefinite lengths) and
 * appendix D (half precision). */
#include "proto/cbor.h"

#include <string.h>

#include "proto/err.h"

static int bad(beam_cbor_t *c, beam_cbor_err_t e) {
  c->err = e;
  return BEAM_EPROTO;
}

void beam_cbor_init(beam_cbor_t *c, const void *buf, size_t len) {
  c->p = buf;
  c->end = buf ? c->p + len : c->p; /* no arithmetic on a NULL pointer */
  c->err = BEAM_CBOR_OK;
}

/* Builds the double's bits directly so no libm is needed: a half is
 * s eeeee mmmmmmmmmm, value (1 + m/1024) * 2^(e-15) for 0 < e < 31,
 * m * 2^-24 for e == 0, infinity or NaN for e == 31. */
double beam_cbor_half(uint16_t h) {
  uint64_t sign = (uint64_t)(h >> 15) << 63;
  unsigned e = (h >> 10) & 31u, m = h & 1023u;
  uint64_t bits;
  double d;
  if (e == 0) {
    d = (double)m / 16777216.0; /* exact: m < 2^10, 2^-24 is a power of two */
    return sign ? -d : d;
  }
  if (e == 31)
    bits = sign | ((uint64_t)0x7ff << 52) | ((uint64_t)m << 42); /* keeps a NaN payload */
  else
    bits = sign | ((uint64_t)(e - 15 + 1023) << 52) | ((uint64_t)m << 42);
  memcpy(&d, &bits, sizeof d);
  return d;
}

int beam_cbor_read(beam_cbor_t *c, beam_cbor_item_t *it) {
  const uint8_t *p = c->p;
  if (p >= c->end) return bad(c, BEAM_CBOR_ETRUNC);
  uint8_t ib = *p++;
  unsigned major = ib >> 5, ai = ib & 31u;
  uint64_t v = 0;
  memset(it, 0, sizeof *it);
  it->start = c->p;
  it->major = (uint8_t)major;
  if (ai < 24) {
    v = ai;
  } else if (ai <= 27) {
    size_t n = (size_t)1 << (ai - 24);
    if ((size_t)(c->end - p) < n) return bad(c, BEAM_CBOR_ETRUNC);
    for (size_t i = 0; i < n; i++) v = (v << 8) | p[i];
    p += n;
  } else if (ai == 31) {
    switch (major) {
    case BEAM_CBOR_BYTES:
    case BEAM_CBOR_TEXT: return bad(c, BEAM_CBOR_EINDEF_STR);
    case BEAM_CBOR_ARRAY:
    case BEAM_CBOR_MAP: it->indef = 1; break;
    case BEAM_CBOR_SIMPLE: return bad(c, BEAM_CBOR_EBREAK);
    default: return bad(c, BEAM_CBOR_ERESERVED); /* integers and tags have no indefinite form */
    }
  } else {
    return bad(c, BEAM_CBOR_ERESERVED);
  }
  /* Bytes left after the head; every length and count is compared with it
   * as a uint64_t, so a length that would not even fit a size_t fails here. */
  uint64_t left = (uint64_t)(c->end - p);
  switch (major) {
  case BEAM_CBOR_BYTES:
  case BEAM_CBOR_TEXT:
    if (v > left) return bad(c, BEAM_CBOR_ETRUNC);
    it->data = p;
    p += (size_t)v;
    break;
  case BEAM_CBOR_ARRAY: /* each item takes at least one byte */
    if (v > left) return bad(c, BEAM_CBOR_ETRUNC);
    break;
  case BEAM_CBOR_MAP:
    if (v > left / 2) return bad(c, BEAM_CBOR_ETRUNC);
    break;
  case BEAM_CBOR_SIMPLE:
    if (ai == 24 && v < 32) return bad(c, BEAM_CBOR_ESIMPLE);
    if (ai == 25) {
      it->flt = 2;
      it->f = beam_cbor_half((uint16_t)v);
    } else if (ai == 26) {
      uint32_t b = (uint32_t)v;
      float f;
      memcpy(&f, &b, sizeof f);
      it->flt = 4;
      it->f = (double)f;
    } else if (ai == 27) {
      memcpy(&it->f, &v, sizeof it->f);
      it->flt = 8;
    }
    break;
  default:
    break;
  }
  it->val = v;
  c->p = p;
  return 0;
}

static int opens(const beam_cbor_item_t *it) {
  return it->major == BEAM_CBOR_ARRAY || it->major == BEAM_CBOR_MAP || it->major == BEAM_CBOR_TAG;
}

/* One level of the skip stack: what is left of an open array, map or tag. */
typedef struct level_s {
  uint64_t left; /* definite: items still due; indefinite: items seen so far */
  uint8_t indef, map;
} level_t;

static void level_of(const beam_cbor_item_t *it, level_t *l) {
  l->indef = it->indef;
  l->map = it->major == BEAM_CBOR_MAP;
  if (it->indef) l->left = 0;
  else if (it->major == BEAM_CBOR_TAG) l->left = 1;
  else l->left = l->map ? 2 * it->val : it->val; /* val <= bytes left / 2 */
}

int beam_cbor_skip_content(beam_cbor_t *c, const beam_cbor_item_t *it, unsigned depth) {
  if (!opens(it)) return 0;
  if (depth >= BEAM_CBOR_MAX_DEPTH) return bad(c, BEAM_CBOR_EDEPTH);
  /* st[k] holds the container whose items are at depth + k + 1. */
  level_t st[BEAM_CBOR_MAX_DEPTH];
  unsigned n = 1;
  level_of(it, &st[0]);
  while (n) {
    level_t *l = &st[n - 1];
    if (l->indef) {
      if (c->p >= c->end) return bad(c, BEAM_CBOR_ETRUNC);
      if (*c->p == 0xff) {
        if (l->map && (l->left & 1)) return bad(c, BEAM_CBOR_EODDMAP);
        c->p++;
        n--;
        continue;
      }
      l->left++;
    } else {
      if (l->left == 0) {
        n--;
        continue;
      }
      l->left--;
    }
    beam_cbor_item_t x;
    if (beam_cbor_read(c, &x)) return BEAM_EPROTO;
    if (opens(&x)) {
      if (depth + n >= BEAM_CBOR_MAX_DEPTH) return bad(c, BEAM_CBOR_EDEPTH);
      level_of(&x, &st[n++]);
    }
  }
  return 0;
}

int beam_cbor_skip(beam_cbor_t *c, unsigned depth) {
  beam_cbor_item_t it;
  if (beam_cbor_read(c, &it)) return BEAM_EPROTO;
  return beam_cbor_skip_content(c, &it, depth);
}

void beam_cbor_iter(const beam_cbor_item_t *it, beam_cbor_iter_t *k) {
  k->indef = it->indef;
  k->left = it->indef ? 0 : it->val;
}

int beam_cbor_next(beam_cbor_t *c, beam_cbor_iter_t *k) {
  if (k->indef) {
    if (c->p >= c->end) return bad(c, BEAM_CBOR_ETRUNC);
    if (*c->p != 0xff) return 1;
    c->p++;
    k->indef = 0;
    return 0;
  }
  if (k->left == 0) return 0;
  k->left--;
  return 1;
}

int beam_cbor_number(const beam_cbor_item_t *it, double *out) {
  switch (it->major) {
  case BEAM_CBOR_UINT: *out = (double)it->val; return 0;
  case BEAM_CBOR_NEGINT: *out = -1.0 - (double)it->val; return 0;
  case BEAM_CBOR_SIMPLE:
    if (!it->flt) return -1;
    *out = it->f;
    return 0;
  default: return -1;
  }
}

int beam_cbor_text_is(const beam_cbor_item_t *it, const char *s) {
  size_t n = strlen(s);
  return it->major == BEAM_CBOR_TEXT && it->val == n && memcmp(it->data, s, n) == 0;
}

const char *beam_cbor_strerror(beam_cbor_err_t e) {
  switch (e) {
  case BEAM_CBOR_OK: return "no error";
  case BEAM_CBOR_ETRUNC: return "item runs past the end of the buffer";
  case BEAM_CBOR_ERESERVED: return "reserved additional information";
  case BEAM_CBOR_EINDEF_STR: return "indefinite-length string";
  case BEAM_CBOR_EBREAK: return "unexpected break";
  case BEAM_CBOR_EDEPTH: return "nesting too deep";
  case BEAM_CBOR_EODDMAP: return "map key without a value";
  case BEAM_CBOR_ESIMPLE: return "two-byte simple value below 32";
  default: return "unknown CBOR error";
  }
}
