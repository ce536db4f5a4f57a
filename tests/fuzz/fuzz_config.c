/* libFuzzer entry for the YAML config loader (daemon/config*.c over
 * pipeline/cfg.c and every stage kind's schema and check hook): what
 * `beamd -c`, `--check-config` and every reload read (built by `make fuzz`).
 *
 * The input is the file's text. The loader either accepts it (a config,
 * no errors) or refuses it with at least one error, each of which names
 * the place: "fuzz.yaml:LINE:COL: ..." with LINE and COL >= 1. It never
 * touches the disk for INFILE values (masks, keys) it does not find. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_place(const char *msg) {
  int line = 0, col = 0;
  if (strncmp(msg, "fuzz.yaml:", 10) || sscanf(msg + 10, "%d:%d", &line, &col) != 2 || line < 1 ||
      col < 1) {
    fprintf(stderr, "config error without its place: %s\n", msg);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, so any read past the text shows under ASan. */
  char *text = malloc(size ? size : 1);
  if (!text)
    return 0;
  if (size)
    memcpy(text, data, size);
  beam_config_t *c = NULL;
  beam_cfg_errs_t errs = {0};
  int rc = beam_config_load_string(text, size, "fuzz.yaml", &c, &errs);
  if (rc == 0) {
    if (!c || errs.n)
      abort();
  } else {
    if (c || errs.n == 0)
      abort();
    for (size_t i = 0; i < errs.n; i++)
      check_place(errs.msgs[i]);
  }
  beam_config_free(&c);
  beam_cfg_errs_free(&errs);
  free(text);
  return 0;
}
