/* Error names and diagnostic helpers (see err.h). */
#include "proto/err.h"

#include <string.h>

const char *beam_strerror(int code) {
  switch (code) {
  case BEAM_OK: return "success";
#define BEAM_ERR_STR_(name, msg) case BEAM_##name: return msg;
    BEAM_ERR_MAP(BEAM_ERR_STR_)
#undef BEAM_ERR_STR_
  default: return "unknown error";
  }
}

const char *beam_err_name(int code) {
  switch (code) {
  case BEAM_OK: return "OK";
#define BEAM_ERR_NAME_(name, msg) case BEAM_##name: return #name;
    BEAM_ERR_MAP(BEAM_ERR_NAME_)
#undef BEAM_ERR_NAME_
  default: return "EUNKNOWN";
  }
}

int beam_diag_set(beam_diag_t *d, int code, const char *file, int line,
                  const char *fmt, ...) {
  if (!d || d->code != 0)
    return code;
  d->code = code;
  d->file = file;
  d->line = line;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->msg, sizeof d->msg, fmt, ap);
  va_end(ap);
  return code;
}

void beam_diag_clear(beam_diag_t *d) {
  if (d)
    memset(d, 0, sizeof *d);
}
