/* The stage kinds of this build, printed for a person (beamd --list-stages,
 * --describe-stage). Call after every kind is registered (record). */
#ifndef BEAMD_STAGE_LIST_H
#define BEAMD_STAGE_LIST_H

#include <stdio.h>

/* The keys every stage takes, then each kind with its own keys. */
void beamd_stage_list(FILE *f);

/* One kind, every key, on out; returns 0. An unknown kind gets a message
 * naming the known kinds on err and returns 1 (the exit code). */
int beamd_stage_describe(FILE *out, FILE *err, const char *kind);

#endif
