/* Karabo bridge messages (karabo.h): the 2.2 and 1.0 decoders and the 2.2
 * header encoders. Not the sockets, not what a train becomes in beamd
 * (daemon/src_karabo.c, daemon/karabo_out.c).
 *
 * Decisions where the protocol text is silent:
 *   - text fields (source, content, path, dtype, metadata keys) are taken
 *     as str or bin: use_bin_type=False senders (old pickled Karabo
 *     devices) write bin for text;
 *   - an array whose source had no msgpack header is kept, with no
 *     metadata (the C++ client allows it: it only demands metadata of
 *     msgpack headers);
 *   - timestamp.frac is the digits after the decimal point (18 of them,
 *     attoseconds, as the bridge writes it; shorter is right-padded);
 *   - 1.0 sources need no metadata; values that are not msgpack-numpy maps
 *     are skipped (1.0 keys are flat: "image.data", not nested maps);
 *   - "ImageData" content (the C++ client's other array kind) is read as
 *     "array". */
#include "proto/karabo.h"

#include <math.h>
#include <string.h>

#include "proto/err.h"

#define FAIL(code, msg)                                                                           \
  do {                                                                                            \
    rc = (code);                                                                                  \
    *why = "karabo: " msg;                                                                        \
    goto out;                                                                                     \
  } while (0)

/* ---- a bounds walk before msgpack-c --------------------------------------------- */

static uint64_t be(const uint8_t *p, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++)
    v = v << 8 | p[i];
  return v;
}

/* msgpack-c allocates an array's or map's objects when it reads the count,
 * before the elements; each element takes at least one byte, so a count
 * over the bytes left is a lie we refuse here. Iterative: no depth limit
 * to overflow (msgpack-c's own stack of 32 levels refuses deeper ones). */
int beam_kb_msgpack_check(const void *buf, size_t len) {
  const uint8_t *p = buf;
  size_t pos = 0;
  uint64_t pending = 1;
  if (!p)
    return -1;
  while (pending) {
    if (pos >= len)
      return -1;
    uint8_t b = p[pos++];
    pending--;
    uint64_t items = 0, skip = 0;
    unsigned lenb = 0; /* bytes of a big-endian length or count that follow */
    int kind = 0;      /* 0 scalar of `skip` bytes, 1 bytes of a length, 2 array, 3 map */
    if (b <= 0x7f || b >= 0xe0) {
    } else if (b <= 0x8f) {
      items = 2u * (b & 0x0f);
    } else if (b <= 0x9f) {
      items = b & 0x0f;
    } else if (b <= 0xbf) {
      skip = b & 0x1f;
    } else {
      switch (b) {
      case 0xc0: case 0xc2: case 0xc3: break;
      case 0xc1: return -1; /* never used */
      case 0xc4: case 0xd9: lenb = 1; kind = 1; break;
      case 0xc5: case 0xda: lenb = 2; kind = 1; break;
      case 0xc6: case 0xdb: lenb = 4; kind = 1; break;
      case 0xc7: lenb = 1; kind = 1; skip = 1; break; /* ext: + type byte */
      case 0xc8: lenb = 2; kind = 1; skip = 1; break;
      case 0xc9: lenb = 4; kind = 1; skip = 1; break;
      case 0xca: skip = 4; break;
      case 0xcb: skip = 8; break;
      case 0xcc: case 0xd0: skip = 1; break;
      case 0xcd: case 0xd1: skip = 2; break;
      case 0xce: case 0xd2: skip = 4; break;
      case 0xcf: case 0xd3: skip = 8; break;
      case 0xd4: skip = 2; break;
      case 0xd5: skip = 3; break;
      case 0xd6: skip = 5; break;
      case 0xd7: skip = 9; break;
      case 0xd8: skip = 17; break;
      case 0xdc: lenb = 2; kind = 2; break;
      case 0xdd: lenb = 4; kind = 2; break;
      case 0xde: lenb = 2; kind = 3; break;
      case 0xdf: lenb = 4; kind = 3; break;
      }
    }
    if (lenb) {
      if (lenb > len - pos)
        return -1;
      uint64_t v = be(p + pos, lenb);
      pos += lenb;
      if (kind == 1)
        skip += v;
      else
        items = kind == 2 ? v : 2 * v;
    }
    if (skip > len - pos)
      return -1;
    pos += (size_t)skip;
    pending += items;
    if (pending > len - pos)
      return -1;
  }
  return pos == len ? 0 : -1; /* one item, nothing after it */
}

/* ---- msgpack object helpers ----------------------------------------------------- */

static int text(const msgpack_object *o, beam_kb_str_t *s) {
  if (o && o->type == MSGPACK_OBJECT_STR) {
    s->p = o->via.str.ptr;
    s->n = o->via.str.size;
    return 1;
  }
  if (o && o->type == MSGPACK_OBJECT_BIN) {
    s->p = o->via.bin.ptr;
    s->n = o->via.bin.size;
    return 1;
  }
  return 0;
}

static int is(const beam_kb_str_t *s, const char *lit) {
  size_t n = strlen(lit);
  return s->n == n && memcmp(s->p, lit, n) == 0;
}

static const msgpack_object *get(const msgpack_object *map, const char *key) {
  if (!map || map->type != MSGPACK_OBJECT_MAP)
    return NULL;
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    beam_kb_str_t k;
    if (text(&map->via.map.ptr[i].key, &k) && is(&k, key))
      return &map->via.map.ptr[i].val;
  }
  return NULL;
}

/* Digits as an integer; with frac, the digits after a decimal point as
 * attoseconds (18 places). 0 when not all digits or too many. */
static int digits(const beam_kb_str_t *s, int frac, uint64_t *out) {
  uint64_t v = 0;
  if (!s->n || s->n > (frac ? 64 : 19))
    return 0;
  for (size_t i = 0; i < s->n; i++) {
    if (s->p[i] < '0' || s->p[i] > '9')
      return 0;
    if (!frac || i < 18)
      v = v * 10 + (uint64_t)(s->p[i] - '0');
  }
  for (size_t i = s->n; frac && i < 18; i++)
    v *= 10;
  *out = v;
  return 1;
}

static void read_meta(beam_kb_source_t *s, const msgpack_object *md) {
  s->has_meta = 1;
  const msgpack_object *tid = get(md, "timestamp.tid");
  if (tid && tid->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    s->has_tid = 1;
    s->tid = tid->via.u64;
  }
  beam_kb_str_t sec, frac;
  const msgpack_object *osec = get(md, "timestamp.sec"), *ofrac = get(md, "timestamp.frac");
  if (osec && osec->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    s->sec = osec->via.u64;
    s->has_time = 1;
  } else if (text(osec, &sec) && digits(&sec, 0, &s->sec)) {
    s->has_time = 1;
  }
  if (s->has_time && text(ofrac, &frac) && !digits(&frac, 1, &s->frac_as))
    s->frac_as = 0;
  const msgpack_object *ts = get(md, "timestamp");
  if (!s->has_time && ts &&
      (ts->type == MSGPACK_OBJECT_FLOAT64 || ts->type == MSGPACK_OBJECT_FLOAT32) &&
      ts->via.f64 >= 0 && ts->via.f64 < 1e15) {
    double whole = floor(ts->via.f64);
    s->sec = (uint64_t)whole;
    s->frac_as = (uint64_t)((ts->via.f64 - whole) * 1e18);
    if (s->frac_as >= 1000000000000000000ull)
      s->frac_as = 999999999999999999ull;
    s->has_time = 1;
  }
}

static int add_source(beam_kb_msg_t *m, const beam_kb_str_t *name) {
  for (unsigned i = 0; i < m->nsources; i++)
    if (m->src[i].name.n == name->n && memcmp(m->src[i].name.p, name->p, name->n) == 0)
      return (int)i;
  if (m->nsources >= BEAM_KB_MAX_SOURCES)
    return -1;
  beam_kb_source_t *s = &m->src[m->nsources];
  memset(s, 0, sizeof *s);
  s->name = *name;
  return (int)m->nsources++;
}

/* shape (a msgpack array of non-negative ints) into a; 0 or a code. */
static int read_shape(const msgpack_object *o, beam_kb_array_t *a, const char **why) {
  if (!o || o->type != MSGPACK_OBJECT_ARRAY) {
    *why = "karabo: an array header without a shape list";
    return BEAM_EPROTO;
  }
  if (o->via.array.size > BEAM_KB_MAX_NDIM) {
    *why = "karabo: an array of more than 8 dimensions";
    return BEAM_ELIMIT;
  }
  a->ndim = o->via.array.size;
  for (unsigned i = 0; i < a->ndim; i++) {
    const msgpack_object *d = &o->via.array.ptr[i];
    if (d->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
      *why = "karabo: a shape entry that is not a non-negative integer";
      return BEAM_EPROTO;
    }
    a->shape[i] = d->via.u64;
  }
  return 0;
}

/* shape x itemsize == size, without overflow. */
static int size_ok(const beam_kb_array_t *a) {
  uint64_t n = beam_dtype_size(a->dtype);
  for (unsigned i = 0; i < a->ndim; i++) {
    if (a->shape[i] && n > UINT64_MAX / a->shape[i])
      return 0;
    n *= a->shape[i];
  }
  return n == a->size;
}

/* ---- protocol 2.2 ---------------------------------------------------------------- */

static int add_array(beam_kb_msg_t *m, const msgpack_object *h, unsigned src, const beam_part_t *d,
                     int part, const char **why) {
  if (m->narrays >= BEAM_KB_MAX_ARRAYS) {
    *why = "karabo: more than 256 arrays";
    return BEAM_ELIMIT;
  }
  beam_kb_array_t *a = &m->arr[m->narrays];
  memset(a, 0, sizeof *a);
  beam_kb_str_t dt;
  if (!text(get(h, "path"), &a->path)) {
    *why = "karabo: an array header without a path";
    return BEAM_EPROTO;
  }
  if (!text(get(h, "dtype"), &dt)) {
    *why = "karabo: an array header without a dtype";
    return BEAM_EPROTO;
  }
  int rc = read_shape(get(h, "shape"), a, why);
  if (rc < 0)
    return rc;
  char name[16];
  a->dtype = BEAM_DT_NONE;
  if (dt.n < sizeof name) {
    memcpy(name, dt.p, dt.n);
    name[dt.n] = 0;
    a->dtype = beam_dtype_from_name(name);
  }
  if (a->dtype == BEAM_DT_NONE) {
    *why = "karabo: an array dtype that is not a numpy name beamd knows";
    return BEAM_ENOTSUP;
  }
  a->source = src;
  a->data = d->data;
  a->size = d->size;
  a->part = part;
  if (!size_ok(a)) {
    *why = "karabo: an array's shape x itemsize differs from its data part's size";
    return BEAM_ESHAPE;
  }
  m->src[src].narrays++;
  m->narrays++;
  return 0;
}

static int parse22(const beam_part_t *parts, size_t n, beam_kb_msg_t *m, const char **why) {
  int rc = 0;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  if (n % 2)
    FAIL(BEAM_EPROTO, "an odd number of parts (2.2 sends header and data pairs)");
  for (size_t i = 0; i < n; i += 2) {
    const beam_part_t *hp = &parts[i], *dp = &parts[i + 1];
    size_t off = 0;
    if (beam_kb_msgpack_check(hp->data, hp->size) < 0 ||
        msgpack_unpack_next(&u, hp->data, hp->size, &off) != MSGPACK_UNPACK_SUCCESS)
      FAIL(BEAM_EPROTO, "a header part that is not one msgpack item");
    const msgpack_object *h = &u.data;
    if (h->type != MSGPACK_OBJECT_MAP)
      FAIL(BEAM_EPROTO, "a header that is not a map");
    beam_kb_str_t content, source;
    if (!text(get(h, "content"), &content))
      FAIL(BEAM_EPROTO, "a header without content");
    if (!text(get(h, "source"), &source))
      FAIL(BEAM_EPROTO, "a header without source");
    int s = add_source(m, &source);
    if (s < 0)
      FAIL(BEAM_ELIMIT, "more than 64 sources");
    if (is(&content, "msgpack")) {
      const msgpack_object *md = get(h, "metadata");
      if (!md || md->type != MSGPACK_OBJECT_MAP)
        FAIL(BEAM_EPROTO, "a msgpack header without metadata");
      const uint8_t *db = dp->data;
      if (!dp->size || beam_kb_msgpack_check(dp->data, dp->size) < 0 ||
          !((db[0] & 0xf0) == 0x80 || db[0] == 0xde || db[0] == 0xdf))
        FAIL(BEAM_EPROTO, "a msgpack data part that is not a msgpack map");
      read_meta(&m->src[s], md);
      m->src[s].data = dp->data;
      m->src[s].data_len = dp->size;
    } else if (is(&content, "array") || is(&content, "ImageData")) {
      if ((rc = add_array(m, h, (unsigned)s, dp, (int)i + 1, why)) < 0)
        goto out;
    } else {
      FAIL(BEAM_ENOTSUP, "a header of unknown content (not msgpack or array)");
    }
  }
out:
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* ---- protocol 1.0 ---------------------------------------------------------------- */

beam_dtype_t beam_kb_typestr_dtype(const char *s, size_t n) {
  if (n < 3 || n > 4 || !(s[0] == '<' || s[0] == '|' || s[0] == '='))
    return BEAM_DT_NONE;
  int size = 0;
  for (size_t i = 2; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return BEAM_DT_NONE;
    size = size * 10 + (s[i] - '0');
  }
  static const struct {
    char kind;
    int size;
    beam_dtype_t dt;
  } map[] = {{'u', 1, BEAM_DT_U8},  {'u', 2, BEAM_DT_U16}, {'u', 4, BEAM_DT_U32},
             {'u', 8, BEAM_DT_U64}, {'i', 1, BEAM_DT_I8},  {'i', 2, BEAM_DT_I16},
             {'i', 4, BEAM_DT_I32}, {'i', 8, BEAM_DT_I64}, {'f', 4, BEAM_DT_F32},
             {'f', 8, BEAM_DT_F64}, {'c', 8, BEAM_DT_C64}, {'c', 16, BEAM_DT_C128}};
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (map[i].kind == s[1] && map[i].size == size)
      return map[i].dt;
  return BEAM_DT_NONE;
}

/* A msgpack-numpy map {nd: true, type, shape, data} as array a. 1 when it
 * is one, 0 when the value is no array, < 0 when it is a bad one. */
static int numpy_array(const msgpack_object *v, beam_kb_array_t *a, const char **why) {
  const msgpack_object *nd = get(v, "nd");
  if (!nd || nd->type != MSGPACK_OBJECT_BOOLEAN || !nd->via.boolean)
    return 0;
  beam_kb_str_t ts;
  const msgpack_object *data = get(v, "data");
  if (!text(get(v, "type"), &ts) || !data || data->type != MSGPACK_OBJECT_BIN) {
    *why = "karabo: 1.0 array without type or data";
    return BEAM_EPROTO;
  }
  int rc = read_shape(get(v, "shape"), a, why);
  if (rc < 0)
    return rc;
  a->dtype = beam_kb_typestr_dtype(ts.p, ts.n);
  if (a->dtype == BEAM_DT_NONE) {
    *why = "karabo: 1.0 array of a type beamd does not read (big-endian or unknown)";
    return BEAM_ENOTSUP;
  }
  a->data = data->via.bin.ptr;
  a->size = data->via.bin.size;
  if (!size_ok(a)) {
    *why = "karabo: an array's shape x itemsize differs from its data size";
    return BEAM_ESHAPE;
  }
  return 1;
}

static int parse10(const beam_part_t *p, beam_kb_msg_t *m, const char **why) {
  int rc = 0;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  if (beam_kb_msgpack_check(p->data, p->size) < 0 ||
      msgpack_unpack_next(&u, p->data, p->size, &off) != MSGPACK_UNPACK_SUCCESS)
    FAIL(BEAM_EPROTO, "1.0 message that is not one msgpack item");
  if (u.data.type != MSGPACK_OBJECT_MAP)
    FAIL(BEAM_EPROTO, "1.0 message that is not a map of sources");
  for (uint32_t i = 0; i < u.data.via.map.size; i++) {
    const msgpack_object_kv *kv = &u.data.via.map.ptr[i];
    beam_kb_str_t name;
    if (!text(&kv->key, &name) || kv->val.type != MSGPACK_OBJECT_MAP)
      FAIL(BEAM_EPROTO, "1.0 source that is not a named map");
    int s = add_source(m, &name);
    if (s < 0)
      FAIL(BEAM_ELIMIT, "more than 64 sources");
    const msgpack_object *md = get(&kv->val, "metadata");
    if (md && md->type == MSGPACK_OBJECT_MAP)
      read_meta(&m->src[s], md);
    for (uint32_t j = 0; j < kv->val.via.map.size; j++) {
      const msgpack_object_kv *e = &kv->val.via.map.ptr[j];
      if (e->val.type != MSGPACK_OBJECT_MAP)
        continue;
      if (m->narrays >= BEAM_KB_MAX_ARRAYS)
        FAIL(BEAM_ELIMIT, "more than 256 arrays");
      beam_kb_array_t *a = &m->arr[m->narrays];
      memset(a, 0, sizeof *a);
      int r = numpy_array(&e->val, a, why);
      if (r < 0) {
        rc = r;
        goto out;
      }
      if (r == 0 || !text(&e->key, &a->path))
        continue;
      a->source = (unsigned)s;
      a->part = 0;
      m->src[s].narrays++;
      m->narrays++;
    }
  }
out:
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* ---- entry points ---------------------------------------------------------------- */

int beam_kb_detect(const beam_part_t *parts, size_t n) {
  (void)parts;
  return n == 0 ? 0 : n == 1 ? 1 : 2;
}

int beam_kb_parse(const beam_part_t *parts, size_t n, beam_kb_msg_t *out, const char **why) {
  out->nsources = out->narrays = 0;
  out->version = beam_kb_detect(parts, n);
  int rc;
  const char *w = NULL;
  if (out->version == 0) {
    w = "karabo: an empty message";
    rc = BEAM_EPROTO;
  } else {
    rc = out->version == 1 ? parse10(&parts[0], out, &w) : parse22(parts, n, out, &w);
  }
  if (rc < 0) {
    out->nsources = out->narrays = 0;
    if (why)
      *why = w ? w : "karabo: malformed";
  }
  return rc;
}

const beam_kb_source_t *beam_kb_source(const beam_kb_msg_t *m, const char *name, size_t n) {
  for (unsigned i = 0; i < m->nsources; i++)
    if (m->src[i].name.n == n && memcmp(m->src[i].name.p, name, n) == 0)
      return &m->src[i];
  return NULL;
}

const beam_kb_array_t *beam_kb_array(const beam_kb_msg_t *m, unsigned s, const char *path,
                                     size_t n) {
  for (unsigned i = 0; i < m->narrays; i++)
    if (m->arr[i].source == s && m->arr[i].path.n == n && memcmp(m->arr[i].path.p, path, n) == 0)
      return &m->arr[i];
  return NULL;
}

/* ---- encoding -------------------------------------------------------------------- */

beam_kb_time_t beam_kb_time_from_ns(uint64_t ns) {
  beam_kb_time_t t = {ns / 1000000000ull, (ns % 1000000000ull) * 1000000000ull};
  return t;
}

int beam_kb_pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n) ? BEAM_ENOMEM : 0;
}

#define P(x)                                                                                      \
  do {                                                                                            \
    if ((x) != 0)                                                                                 \
      return BEAM_ENOMEM;                                                                         \
  } while (0)

int beam_kb_pack_source_header(msgpack_packer *pk, const char *source, beam_kb_time_t t,
                               uint64_t tid) {
  char sec[24], frac[24];
  snprintf(sec, sizeof sec, "%llu", (unsigned long long)t.sec);
  snprintf(frac, sizeof frac, "%018llu", (unsigned long long)(t.frac_as % 1000000000000000000ull));
  P(msgpack_pack_map(pk, 3));
  P(beam_kb_pack_str(pk, "source"));
  P(beam_kb_pack_str(pk, source));
  P(beam_kb_pack_str(pk, "content"));
  P(beam_kb_pack_str(pk, "msgpack"));
  P(beam_kb_pack_str(pk, "metadata"));
  P(msgpack_pack_map(pk, 6));
  P(beam_kb_pack_str(pk, "source"));
  P(beam_kb_pack_str(pk, source));
  P(beam_kb_pack_str(pk, "timestamp"));
  P(msgpack_pack_double(pk, (double)t.sec + (double)t.frac_as * 1e-18));
  P(beam_kb_pack_str(pk, "timestamp.sec"));
  P(beam_kb_pack_str(pk, sec));
  P(beam_kb_pack_str(pk, "timestamp.frac"));
  P(beam_kb_pack_str(pk, frac));
  P(beam_kb_pack_str(pk, "timestamp.tid"));
  P(msgpack_pack_uint64(pk, tid));
  P(beam_kb_pack_str(pk, "ignored_keys"));
  P(msgpack_pack_array(pk, 0));
  return 0;
}

int beam_kb_pack_array_header(msgpack_packer *pk, const char *source, const char *path,
                              beam_dtype_t dtype, unsigned ndim, const uint32_t *shape) {
  if (!beam_dtype_size(dtype))
    return BEAM_EINVAL;
  P(msgpack_pack_map(pk, 5));
  P(beam_kb_pack_str(pk, "source"));
  P(beam_kb_pack_str(pk, source));
  P(beam_kb_pack_str(pk, "content"));
  P(beam_kb_pack_str(pk, "array"));
  P(beam_kb_pack_str(pk, "path"));
  P(beam_kb_pack_str(pk, path));
  P(beam_kb_pack_str(pk, "dtype"));
  P(beam_kb_pack_str(pk, beam_dtype_name(dtype)));
  P(beam_kb_pack_str(pk, "shape"));
  P(msgpack_pack_array(pk, ndim));
  for (unsigned i = 0; i < ndim; i++)
    P(msgpack_pack_uint32(pk, shape[i]));
  return 0;
}
