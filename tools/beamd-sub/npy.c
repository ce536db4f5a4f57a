/* beamd-sub .npy writer: numpy format 1.0, little-endian, C order.
 *
 * Layout (numpy NEP 1): "\x93NUMPY", major 1, minor 0, u16 LE header length,
 * then a Python dict literal padded with spaces and ended by '\n' so the
 * data starts on a 64-byte boundary, then the raw array bytes. Only what
 * beamd sends is covered (the wire dtypes, up to 4 dimensions).
 */
#include "tools/beamd-sub/sub.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *npy_descr(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return "|u1";
  case BEAM_DT_U16: return "<u2";
  case BEAM_DT_U32: return "<u4";
  case BEAM_DT_U64: return "<u8";
  case BEAM_DT_I8: return "|i1";
  case BEAM_DT_I16: return "<i2";
  case BEAM_DT_I32: return "<i4";
  case BEAM_DT_I64: return "<i8";
  case BEAM_DT_F32: return "<f4";
  case BEAM_DT_F64: return "<f8";
  case BEAM_DT_C64: return "<c8";
  case BEAM_DT_C128: return "<c16";
  default: return NULL;
  }
}

int sub_npy_write(const char *path, const beam_hdr_t *h, const void *data,
                  beam_diag_t *d) {
  const char *descr = npy_descr((beam_dtype_t)h->dtype);
  if (!descr)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: dtype %u has no .npy form", path, h->dtype);
  char shape[128];
  size_t n = 0;
  n += (size_t)snprintf(shape + n, sizeof shape - n, "(");
  for (unsigned i = 0; i < h->ndim; i++)
    n += (size_t)snprintf(shape + n, sizeof shape - n, "%u,%s", h->shape[i],
                          i + 1 < h->ndim ? " " : "");
  if (h->ndim > 1)
    n--; /* "(3, 4,)" is legal, but numpy itself writes "(3, 4)" */
  snprintf(shape + n, sizeof shape - n, ")");

  char hdr[256];
  int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    descr, shape);
  /* Pad so that 10 + header length (with the final '\n') is a multiple of 64. */
  size_t total = 10 + (size_t)hl + 1;
  size_t pad = (64 - total % 64) % 64;
  if ((size_t)hl + pad + 1 >= sizeof hdr)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: .npy header too long", path);
  memset(hdr + hl, ' ', pad);
  hdr[(size_t)hl + pad] = '\n';
  uint16_t hlen = (uint16_t)((size_t)hl + pad + 1);

  FILE *f = fopen(path, "wb");
  if (!f)
    return BEAM_DIAG(d, BEAM_EIO, "%s: %s", path, strerror(errno));
  uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)(hlen & 0xff),
                     (uint8_t)(hlen >> 8)};
  int ok = fwrite(pre, 1, sizeof pre, f) == sizeof pre &&
           fwrite(hdr, 1, hlen, f) == hlen &&
           (h->raw_size == 0 || fwrite(data, 1, (size_t)h->raw_size, f) == h->raw_size);
  int e = errno;
  if (fclose(f) != 0 && ok) {
    ok = 0;
    e = errno;
  }
  if (!ok)
    return BEAM_DIAG(d, BEAM_EIO, "%s: write failed: %s", path, strerror(e));
  return 0;
}
