/* Error codes and diagnostics shared by every module. They live in proto/,
 * the ground floor, so that every layer above can name them without
 * depending on anything but libc.
 *
 * Functions return 0 or a negative BEAM_E* code. The human-readable context
 * (which file, which stage, which frame, the CUDA status name) goes into a
 * beam_diag_t passed down by the caller, never into a global. Not for
 * logging: the caller decides whether and how to log a diagnostic. */
#ifndef BEAM_ERR_H
#define BEAM_ERR_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_ERR_MAP(X)                                   \
  X(EINVAL,  "invalid argument")                          \
  X(ENOMEM,  "out of memory")                             \
  X(ECONFIG, "configuration error")                       \
  X(ECUDA,   "CUDA error")                                \
  X(ENOTSUP, "backend not built or no device")            \
  X(EPROTO,  "malformed frame or message")                \
  X(EIO,     "input/output error")                        \
  X(EAGAIN,  "no output yet")                             \
  X(ESHAPE,  "frame shape or dtype does not match")       \
  X(EBUSY,   "resource busy")                             \
  X(ELIMIT,  "size limit exceeded")                       \
  X(ESTATE,  "operation not valid in this state")

enum {
  BEAM_OK = 0,
#define BEAM_ERR_ENUM_(name, msg) BEAM_##name##_IDX_,
  BEAM_ERR_MAP(BEAM_ERR_ENUM_)
#undef BEAM_ERR_ENUM_
  BEAM_ERR_COUNT_
};

#define BEAM_ERR_CODE_(name, msg) BEAM_##name = -(BEAM_##name##_IDX_ + 1),
enum { BEAM_ERR_MAP(BEAM_ERR_CODE_) };
#undef BEAM_ERR_CODE_

/* "invalid argument" etc.; "unknown error" for anything else. */
const char *beam_strerror(int code);
/* "EINVAL" etc. */
const char *beam_err_name(int code);

typedef struct beam_diag_s {
  int code;
  const char *file; /* source file of the check that failed */
  int line;
  char msg[1024];
} beam_diag_t;

/* Records code and message in d (when d is not NULL) and returns code, so
 * callers can write `return BEAM_DIAG(d, BEAM_EINVAL, "bad %s", x);`. The
 * first error wins: a later call does not overwrite an earlier message. */
int beam_diag_set(beam_diag_t *d, int code, const char *file, int line,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define BEAM_DIAG(d, code, ...) beam_diag_set((d), (code), __FILE__, __LINE__, __VA_ARGS__)
void beam_diag_clear(beam_diag_t *d);

/* Caller bugs (broken invariants) abort with file:line, in release builds too. */
#define BEAM_ASSERT(cond)                                                     \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__,   \
              #cond);                                                         \
      abort();                                                                \
    }                                                                         \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
