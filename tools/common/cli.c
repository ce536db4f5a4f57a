/* Option-value parsing and message helpers shared by the beamd tools; the
 * conventions are described in cli.h. */
#include "tools/common/cli.h"

#include "daemon/version.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>

static const char *g_prog = "beamd-tool";

void tool_cli_init(const char *prog) { g_prog = prog; }

const char *tool_prog(void) { return g_prog; }

void tool_log(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", g_prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int tool_bad(const char *opt, const char *val, const char *why) {
  fprintf(stderr, "%s: bad value for --%s: '%s' (%s)\n", g_prog, opt, val, why);
  return -1;
}

int tool_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  char *end;
  errno = 0;
  /* strtoull accepts "-1" and wraps it; refuse the sign first. */
  if (*s == '-' || *s == '\0')
    return tool_bad(opt, s, "expected a non-negative integer");
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end)
    return tool_bad(opt, s, "expected a non-negative integer");
  if (v < lo || v > hi) {
    char why[96];
    snprintf(why, sizeof why, "must be in %llu..%llu", (unsigned long long)lo,
             (unsigned long long)hi);
    return tool_bad(opt, s, why);
  }
  *out = v;
  return 0;
}

int tool_parse_u64_max(const char *opt, const char *s, uint64_t hi, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = *s == '-' ? 0 : strtoull(s, &end, 10);
  if (*s == '-' || *s == '\0' || errno || *end || v > hi)
    return tool_bad(opt, s, "expected a non-negative integer in range");
  *out = v;
  return 0;
}

int tool_parse_double(const char *opt, const char *s, double lo, double hi, const char *why,
                      double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || *s == '\0' || *end || !(v >= lo && v <= hi)) {
    char buf[96];
    if (!why) {
      snprintf(buf, sizeof buf, "expected a number in %g..%g", lo, hi);
      why = buf;
    }
    return tool_bad(opt, s, why);
  }
  *out = v;
  return 0;
}

int tool_bad_option(char *const *argv, int tell_missing) {
  if (!tell_missing)
    tool_log("unknown option or missing value: %s", argv[optind - 1]);
  else if (optopt)
    tool_log("option needs a value or is unknown: %s", argv[optind - 1]);
  else
    tool_log("unknown option: %s", argv[optind - 1]);
  return -1;
}

int tool_no_operands(int argc, char *const *argv) {
  if (optind < argc) {
    tool_log("unexpected argument: %s", argv[optind]);
    return -1;
  }
  return 0;
}

void tool_print_version(void) { printf("%s %s\n", g_prog, BEAMD_VERSION); }

int tool_args_exit(int parsed, void (*usage)(FILE *)) {
  if (parsed == TOOL_ARGS_VERSION) {
    tool_print_version();
    return 0;
  }
  if (parsed == 1) {
    usage(stdout);
    return 0;
  }
  if (parsed < 0) {
    tool_log("try --help");
    return 2;
  }
  return -1;
}
