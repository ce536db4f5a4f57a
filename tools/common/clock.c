/* Nanosecond clock readings shared by the beamd tools (see clock.h). */
#include "tools/common/clock.h"

#include <time.h>

static uint64_t now_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t tool_now_mono_ns(void) { return now_ns(CLOCK_MONOTONIC); }

uint64_t tool_now_real_ns(void) { return now_ns(CLOCK_REALTIME); }
