/* SIGINT/SIGTERM handling shared by the beamd tools (see sig.h). */
#include "tools/common/sig.h"

#include <string.h>

volatile sig_atomic_t tool_stop;

static void on_signal(int sig) {
  (void)sig;
  tool_stop = 1;
}

void tool_catch_stop(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}
