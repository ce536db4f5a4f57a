/* The release version, alone in a header so that the tools can print the
 * same one as beamd without pulling in the daemon's internals (beamd.h
 * includes libuv and every daemon part). Bump it here only. */
#ifndef BEAMD_VERSION_H
#define BEAMD_VERSION_H

#define BEAMD_VERSION "0.1.0"

#endif
