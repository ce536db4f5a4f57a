/* Logging to stderr: journald priority prefixes ("<3>") under systemd,
 * ISO timestamp + pid elsewhere. Thread-safe (one write(2) per line).
 * Per-frame errors go through a rate limiter so a bad stream cannot flood
 * the journal: past the limit, lines are counted and summarised as
 * "suppressed N similar messages" once the window passes. */
#ifndef BEAM_LOG_H
#define BEAM_LOG_H

#include <stdint.h>
#include <syslog.h>

void beam_log_init(const char *ident);
void beam_log_set_level(int level);
int beam_log_level(void);
/* 1 when stderr goes to journald (JOURNAL_STREAM or NOTIFY_SOCKET set). */
int beam_log_journald(void);

void beam_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define BEAM_LOG(level, ...)                                                  \
  do {                                                                        \
    if ((level) <= beam_log_level())                                          \
      beam_log_write((level), __VA_ARGS__);                                   \
  } while (0)

typedef struct beam_ratelimit_s {
  double per_s;        /* messages allowed per window of 1 s */
  uint64_t window_ns;  /* start of the current window */
  unsigned used;
  uint64_t suppressed;
  int lock;            /* spin flag: callers may be on several threads */
} beam_ratelimit_t;

void beam_ratelimit_init(beam_ratelimit_t *rl, double per_s);
/* Logs through rl: at most per_s lines a second, then a summary. */
void beam_log_rl(beam_ratelimit_t *rl, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *beam_log_level_name(int level);
int beam_log_level_from_name(const char *name); /* -1 if unknown */

#endif
