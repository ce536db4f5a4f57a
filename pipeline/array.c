/* Array files for stage init (see array.h): the .npy reader and the hook to
 * the HDF5 loader.
 *
 * The .npy header is a Python dict literal; only the three keys numpy
 * writes (descr, fortran_order, shape) are read, and anything unexpected is
 * an error naming the file, because a silently misread dark or mask would
 * corrupt every frame after it. */
#include "pipeline/array.h"

#include <ctype.h>
#include <math.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .npy reader assumes a little-endian host"
#endif

static beam_h5_loader_fn h5_loader;

void beam_array_set_h5_loader(beam_h5_loader_fn fn) { h5_loader = fn; }

void beam_array_free(beam_array_t *a) {
  if (!a)
    return;
  free(a->data);
  memset(a, 0, sizeof *a);
}

size_t beam_array_elems(const beam_array_t *a) {
  if (!a->ndim)
    return 0;
  size_t n = 1;
  for (uint32_t i = 0; i < a->ndim; i++)
    n *= a->shape[i];
  return n;
}

double beam_array_get(const beam_array_t *a, size_t i) { return beam_elem_get(a->data, a->dtype, i); }

double beam_elem_get(const void *p, beam_dtype_t dt, size_t i) {
  switch (dt) {
  case BEAM_DT_U8: return ((const uint8_t *)p)[i];
  case BEAM_DT_U16: return ((const uint16_t *)p)[i];
  case BEAM_DT_U32: return ((const uint32_t *)p)[i];
  case BEAM_DT_U64: return (double)((const uint64_t *)p)[i];
  case BEAM_DT_I8: return ((const int8_t *)p)[i];
  case BEAM_DT_I16: return ((const int16_t *)p)[i];
  case BEAM_DT_I32: return ((const int32_t *)p)[i];
  case BEAM_DT_I64: return (double)((const int64_t *)p)[i];
  case BEAM_DT_F32: return ((const float *)p)[i];
  case BEAM_DT_F64: return ((const double *)p)[i];
  case BEAM_DT_C64: return ((const float *)p)[2 * i];
  case BEAM_DT_C128: return ((const double *)p)[2 * i];
  default: return NAN;
  }
}

const char *beam_shape_str(uint32_t ndim, const uint32_t *shape, char *buf, size_t len) {
  size_t o = 0;
  if (len == 0)
    return buf;
  buf[0] = '\0';
  o += (size_t)snprintf(buf, len, "[");
  for (uint32_t i = 0; i < ndim && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%u", i ? ", " : "", shape[i]);
  if (o < len)
    snprintf(buf + o, len - o, "]");
  return buf;
}

/* ---- .npy ---------------------------------------------------------------- */

static const char *skip_ws(const char *s) {
  while (*s && isspace((unsigned char)*s))
    s++;
  return s;
}

/* Value of dict key `key` in the header text, or NULL. */
static const char *npy_value(const char *hdr, const char *key) {
  char pat1[32], pat2[32];
  snprintf(pat1, sizeof pat1, "'%s'", key);
  snprintf(pat2, sizeof pat2, "\"%s\"", key);
  const char *k = strstr(hdr, pat1);
  if (!k)
    k = strstr(hdr, pat2);
  if (!k)
    return NULL;
  const char *s = skip_ws(k + strlen(pat1));
  if (*s != ':')
    return NULL;
  return skip_ws(s + 1);
}

static int npy_descr(const char *path, const char *v, beam_dtype_t *dt, beam_diag_t *d) {
  char q = *v;
  if (q != '\'' && q != '"')
    return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: .npy dtype is not a simple numeric type (structured arrays are not supported)", path);
  const char *e = strchr(v + 1, q);
  if (!e || e - (v + 1) < 2 || e - (v + 1) > 4)
    return BEAM_DIAG(d, BEAM_EPROTO, "%s: malformed .npy descr", path);
  char s[8] = {0};
  memcpy(s, v + 1, (size_t)(e - (v + 1)));
  char order = s[0];
  const char *t = s + 1;
  if (order != '<' && order != '|' && order != '=' && order != '>')
    return BEAM_DIAG(d, BEAM_EPROTO, "%s: malformed .npy descr '%s'", path, s);
  static const struct { const char *code; beam_dtype_t dt; } map[] = {
      {"b1", BEAM_DT_U8},   {"u1", BEAM_DT_U8},   {"i1", BEAM_DT_I8},  {"u2", BEAM_DT_U16},
      {"i2", BEAM_DT_I16},  {"u4", BEAM_DT_U32},  {"i4", BEAM_DT_I32}, {"u8", BEAM_DT_U64},
      {"i8", BEAM_DT_I64},  {"f4", BEAM_DT_F32},  {"f8", BEAM_DT_F64}, {"c8", BEAM_DT_C64},
      {"c16", BEAM_DT_C128},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    if (strcmp(t, map[i].code) != 0)
      continue;
    if (order == '>' && beam_dtype_size(map[i].dt) > 1)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: big-endian .npy data ('%s') is not supported; save it little-endian", path, s);
    *dt = map[i].dt;
    return 0;
  }
  return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: .npy dtype '%s' is not supported (bool, integers, float32/64, complex64/128)", path, s);
}

static int npy_shape(const char *path, const char *v, beam_array_t *a, beam_diag_t *d) {
  if (*v != '(')
    return BEAM_DIAG(d, BEAM_EPROTO, "%s: malformed .npy shape", path);
  v++;
  uint32_t n = 0;
  uint64_t bytes = beam_dtype_size(a->dtype);
  for (;;) {
    v = skip_ws(v);
    if (*v == ')')
      break;
    if (!isdigit((unsigned char)*v))
      return BEAM_DIAG(d, BEAM_EPROTO, "%s: malformed .npy shape", path);
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || x > UINT32_MAX)
      return BEAM_DIAG(d, BEAM_ELIMIT, "%s: .npy dimension too large", path);
    if (n == BEAM_MAX_NDIM)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: .npy array has more than %d dimensions", path, BEAM_MAX_NDIM);
    if (x == 0)
      return BEAM_DIAG(d, BEAM_EPROTO, "%s: .npy array is empty (a dimension is 0)", path);
    if (bytes > BEAM_ARRAY_MAX_BYTES / x)
      return BEAM_DIAG(d, BEAM_ELIMIT, "%s: .npy array larger than %llu bytes", path,
                       (unsigned long long)BEAM_ARRAY_MAX_BYTES);
    bytes *= x;
    a->shape[n++] = (uint32_t)x;
    v = skip_ws(end);
    if (*v == ',')
      v++;
    else if (*v != ')')
      return BEAM_DIAG(d, BEAM_EPROTO, "%s: malformed .npy shape", path);
  }
  if (n == 0)
    return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: .npy holds a 0-d scalar, an array is needed", path);
  a->ndim = n;
  a->nbytes = (size_t)bytes;
  return 0;
}

static int npy_load(FILE *fp, const char *path, beam_array_t *a, beam_diag_t *d) {
  unsigned char pre[12];
  if (fread(pre, 1, 10, fp) != 10)
    return BEAM_DIAG(d, BEAM_EPROTO, "%s: truncated .npy header", path);
  unsigned major = pre[6];
  size_t hlen;
  if (major == 1) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
  } else if (major == 2 || major == 3) {
    if (fread(pre + 10, 1, 2, fp) != 2)
      return BEAM_DIAG(d, BEAM_EPROTO, "%s: truncated .npy header", path);
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  } else {
    return BEAM_DIAG(d, BEAM_ENOTSUP, "%s: .npy format version %u is not supported", path, major);
  }
  if (hlen == 0 || hlen > (1u << 20))
    return BEAM_DIAG(d, BEAM_EPROTO, "%s: implausible .npy header length %zu", path, hlen);
  char *hdr = malloc(hlen + 1);
  if (!hdr)
    return BEAM_DIAG(d, BEAM_ENOMEM, "%s: out of memory", path);
  int rc = 0;
  if (fread(hdr, 1, hlen, fp) != hlen) {
    rc = BEAM_DIAG(d, BEAM_EPROTO, "%s: truncated .npy header", path);
    goto out;
  }
  hdr[hlen] = '\0';
  const char *v = npy_value(hdr, "descr");
  if (!v) {
    rc = BEAM_DIAG(d, BEAM_EPROTO, "%s: .npy header has no 'descr'", path);
    goto out;
  }
  if ((rc = npy_descr(path, v, &a->dtype, d)) < 0)
    goto out;
  v = npy_value(hdr, "fortran_order");
  if (!v || (strncmp(v, "False", 5) != 0 && strncmp(v, "True", 4) != 0)) {
    rc = BEAM_DIAG(d, BEAM_EPROTO, "%s: .npy header has no valid 'fortran_order'", path);
    goto out;
  }
  if (v[0] == 'T') {
    rc = BEAM_DIAG(d, BEAM_ENOTSUP, "%s: Fortran-order .npy arrays are not supported; save with np.ascontiguousarray", path);
    goto out;
  }
  v = npy_value(hdr, "shape");
  if (!v) {
    rc = BEAM_DIAG(d, BEAM_EPROTO, "%s: .npy header has no 'shape'", path);
    goto out;
  }
  if ((rc = npy_shape(path, v, a, d)) < 0)
    goto out;
  a->data = malloc(a->nbytes ? a->nbytes : 1);
  if (!a->data) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "%s: cannot allocate %zu bytes", path, a->nbytes);
    goto out;
  }
  size_t got = fread(a->data, 1, a->nbytes, fp);
  if (got != a->nbytes) {
    rc = BEAM_DIAG(d, BEAM_EPROTO, "%s: .npy data truncated (%zu of %zu bytes)", path, got, a->nbytes);
    goto out;
  }
  if (fgetc(fp) != EOF)
    rc = BEAM_DIAG(d, BEAM_EPROTO, "%s: .npy file has bytes after the data (not a plain .npy array?)", path);
out:
  free(hdr);
  return rc;
}

int beam_array_load(const char *path, const char *dataset, beam_array_t *out, beam_diag_t *d) {
  memset(out, 0, sizeof *out);
  if (!path || !*path)
    return BEAM_DIAG(d, BEAM_EINVAL, "array file: empty path");
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return BEAM_DIAG(d, BEAM_EIO, "%s: cannot open: %s", path, strerror(errno));
  unsigned char magic[6] = {0};
  size_t n = fread(magic, 1, sizeof magic, fp);
  int rc;
  if (n == 6 && memcmp(magic, "\x93NUMPY", 6) == 0) {
    rewind(fp);
    rc = npy_load(fp, path, out, d);
    fclose(fp);
  } else {
    fclose(fp);
    if (!h5_loader)
      rc = BEAM_DIAG(d, BEAM_ENOTSUP, "%s: not a .npy file, and no HDF5 loader is registered in this program", path);
    else
      rc = h5_loader(path, dataset ? dataset : "/data", out, d);
  }
  if (rc < 0)
    beam_array_free(out);
  return rc;
}
