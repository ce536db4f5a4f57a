/* Per-module Karabo sources stacked into one detector frame: the pure
 * pieces of input.karabo.source patterns (docs/karabo.md, "Modules").
 *
 * At European XFEL, AGIPD, LPD, DSSC and JUNGFRAU data often come as one
 * source per module, SPB_DET_AGIPD1M-1/DET/0CH0:xtdf .. 15CH0:xtdf, each
 * with image.data for its module only. A glob pattern names them all; the
 * module's number is read from the name where the pattern's first wildcard
 * is, so digits elsewhere in the name (the "1" of AGIPD1M-1) never count.
 *
 * The stacked train is pulse-major: pulse p's frame is modules consecutive
 * module images, module m at offset m x module bytes, which is the
 * (modules x ss, fs) image with the modules along the slow axis that the
 * combined bridge sources give once flattened. */
#ifndef BEAM_KARABO_STACK_H
#define BEAM_KARABO_STACK_H

#include <stddef.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when s holds a glob wildcard (*, ? or [), so it names module sources. */
int beam_kb_is_pattern(const char *s);

/* The module number of the source name (n bytes, not NUL-terminated) under
 * the glob pattern (fnmatch, no flags): the decimal number in name at the
 * offset of the pattern's first wildcard. -1 when name does not match, has
 * no digits there, or the number exceeds 999999. */
long beam_kb_module_number(const char *pattern, const char *name, size_t n);

/* Copies one module's train into its place in the stacked pulse-major
 * buffer out (pulses x modules x melems elements of es bytes). in is the
 * module's array: (melems, pulses) when pulse_last (the online layout,
 * transposed here tile by tile), else (pulses, melems). */
void beam_kb_stack_module(void *out, const void *in, size_t pulses, size_t melems, size_t es,
                          unsigned modules, unsigned mod, int pulse_last);

/* Fills module mod's place in every pulse with fill: NaN stays NaN in
 * floating-point types and is 0 in integer ones; other values are rounded
 * and clamped to the integer type's range. Complex types get fill in both
 * components. */
void beam_kb_stack_fill(void *out, size_t pulses, size_t melems, beam_dtype_t dt,
                        unsigned modules, unsigned mod, double fill);

#ifdef __cplusplus
}
#endif
#endif
