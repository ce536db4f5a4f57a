/* sd_notify wrappers (see notify.h). */
#include "daemon/notify.h"

#include <stdarg.h>
#include <stdio.h>
#include "pipeline/frame.h"

#include <systemd/sd-daemon.h>

void beam_notify_ready(void) { sd_notify(0, "READY=1"); }

void beam_notify_reloading(void) {
  /* MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match the reload. */
  sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu", (unsigned long long)(beam_now_ns() / 1000u));
}

void beam_notify_stopping(void) { sd_notify(0, "STOPPING=1"); }
void beam_notify_watchdog(void) { sd_notify(0, "WATCHDOG=1"); }

void beam_notify_status(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  sd_notifyf(0, "STATUS=%s", buf);
}

uint64_t beam_notify_watchdog_usec(void) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0)
    return usec;
  return 0;
}
