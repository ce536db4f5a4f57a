/* A growable FIFO of fixed-size elements (a ring buffer that doubles when
 * full). It grows to the largest backlog ever seen and then stays, so the
 * steady state allocates nothing. Not thread-safe: callers lock. */
#ifndef BEAM_FIFO_H
#define BEAM_FIFO_H

#include <stddef.h>

typedef struct beam_fifo_s {
  char *buf;
  size_t esize, cap, head, count;
} beam_fifo_t;

void beam_fifo_init(beam_fifo_t *f, size_t esize);
/* Copies *e in at the back; BEAM_ENOMEM when it cannot grow. */
int beam_fifo_push(beam_fifo_t *f, const void *e);
/* The front element, or NULL when empty. */
void *beam_fifo_front(beam_fifo_t *f);
/* Removes the front element, copying it to out (may be NULL); 0 when empty. */
int beam_fifo_pop(beam_fifo_t *f, void *out);
void beam_fifo_free(beam_fifo_t *f);

#endif
