/* The stop flag of the beamd tools: SIGINT and SIGTERM set tool_stop, which
 * every loop polls. No SA_RESTART, so a blocking send, receive, poll or
 * sleep returns EINTR and the loop sees the flag at once. */
#ifndef BEAMD_TOOLS_COMMON_SIG_H
#define BEAMD_TOOLS_COMMON_SIG_H

#include <signal.h>

extern volatile sig_atomic_t tool_stop;

/* Installs the SIGINT/SIGTERM handler that sets tool_stop. */
void tool_catch_stop(void);

#endif
