/* A set of 64-bit frame ids per topic: what makes at-least-once delivery
 * (replay resumption, PROTOCOL.md section 13.4) record each result once.
 * Open addressing with linear probing; UINT64_MAX marks an empty slot and
 * is tracked by a flag when it is itself a member. */
#include "tools/beamd-record/rec.h"

#include <stdlib.h>
#include <string.h>

#define EMPTY UINT64_MAX

static size_t slot(uint64_t v, size_t cap) {
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull; /* murmur3 finaliser: ids are sequential */
  v ^= v >> 33;
  return (size_t)v & (cap - 1);
}

static int grow(idset_t *s) {
  size_t ncap = s->cap ? 2 * s->cap : 1024;
  uint64_t *nk = malloc(ncap * sizeof *nk);
  if (!nk)
    return -1;
  memset(nk, 0xff, ncap * sizeof *nk);
  for (size_t i = 0; i < s->cap; i++) {
    if (s->keys[i] == EMPTY)
      continue;
    size_t j = slot(s->keys[i], ncap);
    while (nk[j] != EMPTY)
      j = (j + 1) & (ncap - 1);
    nk[j] = s->keys[i];
  }
  free(s->keys);
  s->keys = nk;
  s->cap = ncap;
  return 0;
}

int idset_add(idset_t *s, uint64_t v) {
  if (v == EMPTY) {
    int added = !s->has_max;
    s->has_max = 1;
    return added;
  }
  if ((s->n + 1) * 2 > s->cap && grow(s) < 0)
    return -1;
  size_t j = slot(v, s->cap);
  while (s->keys[j] != EMPTY) {
    if (s->keys[j] == v)
      return 0;
    j = (j + 1) & (s->cap - 1);
  }
  s->keys[j] = v;
  s->n++;
  return 1;
}

void idset_free(idset_t *s) {
  free(s->keys);
  memset(s, 0, sizeof *s);
}
