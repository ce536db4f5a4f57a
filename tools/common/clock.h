/* Clock readings of the beamd tools, in nanoseconds: monotonic for pacing,
 * deadlines and rates; real time for timestamps put on the wire. */
#ifndef BEAMD_TOOLS_COMMON_CLOCK_H
#define BEAMD_TOOLS_COMMON_CLOCK_H

#include <stdint.h>

uint64_t tool_now_mono_ns(void);
uint64_t tool_now_real_ns(void);

#endif
