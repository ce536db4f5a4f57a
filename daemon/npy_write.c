/* .npy writer: numpy format 1.0, little-endian, C order (see npy_write.h).
 *
 * Layout (numpy NEP 1): "\x93NUMPY", major 1, minor 0, u16 LE header length,
 * then a Python dict literal padded with spaces and ended by '\n' so the
 * data starts on a 64-byte boundary, then the raw array bytes.
 */
#include "daemon/npy_write.h"

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

int beam_npy_write(const char *path, beam_dtype_t dt, unsigned ndim,
                   const uint32_t *shape, const void *data, size_t nbytes,
                   beam_diag_t *d) {
  const char *descr = npy_descr(dt);
  if (!descr)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: dtype %u has no .npy form", path, (unsigned)dt);
  if (ndim > BEAM_NPY_MAX_NDIM)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: %u dimensions (at most %d)", path, ndim,
                     BEAM_NPY_MAX_NDIM);
  unsigned __int128 want = beam_dtype_size(dt);
  char shp[8 + 12 * BEAM_NPY_MAX_NDIM];
  size_t n = 0;
  n += (size_t)snprintf(shp + n, sizeof shp - n, "(");
  for (unsigned i = 0; i < ndim; i++) {
    want *= shape[i];
    n += (size_t)snprintf(shp + n, sizeof shp - n, "%u,%s", shape[i], i + 1 < ndim ? " " : "");
  }
  if (ndim > 1)
    n--; /* "(3, 4,)" is legal, but numpy itself writes "(3, 4)" */
  snprintf(shp + n, sizeof shp - n, ")");
  if (want != nbytes)
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: %zu data bytes do not match shape %s of %s", path,
                     nbytes, shp, beam_dtype_name(dt));

  char hdr[256];
  int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                    descr, shp);
  /* Pad so that 10 + header length (with the final '\n') is a multiple of 64. */
  size_t total = 10 + (size_t)hl + 1;
  size_t pad = (64 - total % 64) % 64;
  if (hl < 0 || (size_t)hl + pad + 1 >= sizeof hdr)
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
           (nbytes == 0 || fwrite(data, 1, nbytes, f) == nbytes);
  int e = errno;
  if (fclose(f) != 0 && ok) {
    ok = 0;
    e = errno;
  }
  if (!ok)
    return BEAM_DIAG(d, BEAM_EIO, "%s: write failed: %s", path, strerror(e));
  return 0;
}
