/* Growable FIFO (see fifo.h). */
#include "daemon/fifo.h"

#include <stdlib.h>
#include <string.h>

#include "proto/err.h"

void beam_fifo_init(beam_fifo_t *f, size_t esize) {
  memset(f, 0, sizeof *f);
  f->esize = esize;
}

int beam_fifo_push(beam_fifo_t *f, const void *e) {
  if (f->count == f->cap) {
    size_t ncap = f->cap ? f->cap * 2 : 64;
    char *nb = malloc(ncap * f->esize);
    if (!nb)
      return BEAM_ENOMEM;
    /* Unwrap into the new buffer so the ring starts at 0. */
    size_t first = f->cap - f->head < f->count ? f->cap - f->head : f->count;
    if (f->count) {
      memcpy(nb, f->buf + f->head * f->esize, first * f->esize);
      memcpy(nb + first * f->esize, f->buf, (f->count - first) * f->esize);
    }
    free(f->buf);
    f->buf = nb;
    f->cap = ncap;
    f->head = 0;
  }
  memcpy(f->buf + ((f->head + f->count) % f->cap) * f->esize, e, f->esize);
  f->count++;
  return 0;
}

void *beam_fifo_front(beam_fifo_t *f) { return f->count ? f->buf + f->head * f->esize : NULL; }

int beam_fifo_pop(beam_fifo_t *f, void *out) {
  if (!f->count)
    return 0;
  if (out)
    memcpy(out, f->buf + f->head * f->esize, f->esize);
  f->head = (f->head + 1) % f->cap;
  f->count--;
  return 1;
}

void beam_fifo_free(beam_fifo_t *f) {
  free(f->buf);
  memset(f, 0, sizeof *f);
}
