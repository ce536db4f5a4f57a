/* The md5 of a buffer as 32 lowercase hex digits, as DECTRIS stream v1
 * sends it in dimage.hash (libmd underneath). One for the daemon's
 * verify_hash, the simulator and the benchmark's sender. */
#ifndef BEAMD_MD5HEX_H
#define BEAMD_MD5HEX_H

#include <stddef.h>

/* Writes 32 hex digits and a NUL into out. */
void beamd_md5_hex(const void *p, size_t n, char out[33]);

#endif
