/* md5 as hex (md5hex.h). */
#include "daemon/md5hex.h"

#include <stdint.h>

#include <md5.h>

void beamd_md5_hex(const void *p, size_t n, char out[33]) {
  static const char hx[] = "0123456789abcdef";
  MD5_CTX c;
  uint8_t dg[MD5_DIGEST_LENGTH];
  MD5Init(&c);
  MD5Update(&c, p, n);
  MD5Final(dg, &c);
  for (int i = 0; i < MD5_DIGEST_LENGTH; i++) {
    out[2 * i] = hx[dg[i] >> 4];
    out[2 * i + 1] = hx[dg[i] & 15];
  }
  out[32] = '\0';
}
