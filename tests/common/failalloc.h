/* Allocation fault injection for tests: a binary linked with
 * FAILALLOC_LDFLAGS (Makefile: -Wl,--wrap=malloc,...) routes every
 * malloc/calloc/realloc/strdup/posix_memalign/aligned_alloc made by code
 * linked into it (beamd's own libraries; not libzmq, HDF5 or libc
 * internals) through failalloc.c, which can make the N-th one from now
 * return NULL. */
#ifndef BEAM_TESTS_FAILALLOC_H
#define BEAM_TESTS_FAILALLOC_H

/* Fail the n-th allocation from now (1 = the next); 0: none, only count. */
void failalloc_arm(long n);
/* 1 once the armed allocation has been failed (stays until re-armed). */
int failalloc_hit(void);
/* Allocations made since the last arm. */
long failalloc_count(void);

#endif
