/* What the machine offers, read from the kernel: the CPU's last-level
 * cache, for decisions that depend on whether a frame just written is
 * still in cache when the next stage reads it (streaming stores in
 * correct, stage placement in the graph), and the memory available. */
#ifndef BEAM_CACHE_H
#define BEAM_CACHE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of the last-level cache the kernel or the C library reports (the
 * whole L3 a virtual machine is shown, which is what its loads hit), or 0
 * when neither knows. Read once; thread-safe. */
size_t beam_llc_bytes(void);

/* Whether a frame of `bytes` written by one stage is likely still in the
 * last-level cache when the next stage reads it: at most a quarter of the
 * cache, so that its input, the frames queued around it and other work
 * fit beside it. Without a known cache size, up to 2 MiB (an L2). */
int beam_cache_resident(size_t bytes);

/* MemAvailable of /proc/meminfo in bytes (memory that can be had without
 * swapping), read at each call; 0 when unknown. */
size_t beam_mem_available(void);

#ifdef __cplusplus
}
#endif
#endif
