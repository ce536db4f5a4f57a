/* Logging (see log.h). */
#include "daemon/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/frame.h"

static atomic_int g_level = LOG_INFO;
static int g_journald = -1;
static char g_ident[32] = "beamd";

static const char *const level_names[] = {"emerg", "alert", "crit", "err",
                                          "warning", "notice", "info", "debug"};

void beam_log_init(const char *ident) {
  if (ident)
    snprintf(g_ident, sizeof g_ident, "%s", ident);
  g_journald = getenv("JOURNAL_STREAM") || getenv("NOTIFY_SOCKET");
}

void beam_log_set_level(int level) {
  if (level >= LOG_EMERG && level <= LOG_DEBUG)
    atomic_store(&g_level, level);
}
int beam_log_level(void) { return atomic_load(&g_level); }
int beam_log_journald(void) {
  if (g_journald < 0)
    beam_log_init(NULL);
  return g_journald;
}

const char *beam_log_level_name(int level) {
  return level >= 0 && level <= 7 ? level_names[level] : "?";
}

int beam_log_level_from_name(const char *name) {
  for (int i = 0; name && i < 8; i++)
    if (strcmp(name, level_names[i]) == 0)
      return i;
  return -1;
}

static void vwrite_line(int level, const char *fmt, va_list ap) {
  char line[2048];
  int n;
  if (beam_log_journald()) {
    n = snprintf(line, sizeof line, "<%d>", level);
  } else {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, ts.tv_nsec / 1000000, g_ident, (int)getpid(),
                 beam_log_level_name(level));
  }
  if (n < 0 || (size_t)n >= sizeof line)
    n = 0;
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof line - (size_t)n - 1 ? (size_t)m : sizeof line - (size_t)n - 2));
  line[len++] = '\n';
  /* One write per line keeps lines whole when several threads log. */
  ssize_t w = write(STDERR_FILENO, line, len);
  (void)w;
}

void beam_log_write(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vwrite_line(level, fmt, ap);
  va_end(ap);
}

void beam_ratelimit_init(beam_ratelimit_t *rl, double per_s) {
  memset(rl, 0, sizeof *rl);
  rl->per_s = per_s > 0 ? per_s : 10;
}

void beam_log_rl(beam_ratelimit_t *rl, int level, const char *fmt, ...) {
  if (level > beam_log_level())
    return;
  while (__atomic_exchange_n(&rl->lock, 1, __ATOMIC_ACQUIRE))
    ;
  uint64_t now = beam_now_ns();
  uint64_t suppressed = 0;
  if (now - rl->window_ns >= 1000000000ull) {
    suppressed = rl->suppressed;
    rl->suppressed = 0;
    rl->window_ns = now;
    rl->used = 0;
  }
  int allow = rl->used < (unsigned)rl->per_s;
  if (allow)
    rl->used++;
  else
    rl->suppressed++;
  __atomic_store_n(&rl->lock, 0, __ATOMIC_RELEASE);
  if (suppressed)
    beam_log_write(level, "suppressed %llu similar messages", (unsigned long long)suppressed);
  if (!allow)
    return;
  va_list ap;
  va_start(ap, fmt);
  vwrite_line(level, fmt, ap);
  va_end(ap);
}
