/* systemd notification (sd_notify): READY only when everything is up,
 * STATUS with rates, WATCHDOG from a timer, RELOADING/READY around reloads,
 * STOPPING on shutdown. Without NOTIFY_SOCKET every call is a no-op. */
#ifndef BEAM_NOTIFY_H
#define BEAM_NOTIFY_H

#include <stdint.h>

void beam_notify_ready(void);
void beam_notify_reloading(void);
void beam_notify_stopping(void);
void beam_notify_watchdog(void);
void beam_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Watchdog interval in microseconds (0 when systemd asks for none). */
uint64_t beam_notify_watchdog_usec(void);

#endif
