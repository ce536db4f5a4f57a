/* libFuzzer entry for the CURVE certificate parser (daemon/curve.c), which
 * reads operator-supplied key files and every file dropped in an allow-list
 * directory (built by `make fuzz`).
 *
 * The input is the file's text. An accepted certificate must hold valid
 * Z85 keys of 40 characters, a secret only when its public key matches it,
 * and a name taken from the path. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "daemon/curve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_key(const char *z85) {
  uint8_t bin[32];
  if (strlen(z85) != 40 || !zmq_z85_decode(bin, z85))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, so any read past the text shows under ASan. */
  char *text = malloc(size ? size : 1);
  if (!text)
    return 0;
  if (size)
    memcpy(text, data, size);
  beam_diag_t ed = {0};
  beam_cert_t c;
  for (int need = 0; need < 2; need++) {
    if (beam_cert_parse(text, size, "dir/client_secret", &c, need, &ed) != 0)
      continue;
    check_key(c.public_z85);
    if (c.secret_z85[0]) {
      char derived[41];
      check_key(c.secret_z85);
      if (zmq_curve_public(derived, c.secret_z85) != 0 || strcmp(derived, c.public_z85))
        abort();
    } else if (need) {
      abort();
    }
    if (strcmp(c.name, "client"))
      abort();
  }
  free(text);
  return 0;
}
