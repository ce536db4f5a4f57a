/* The stage queues of the graph (graph_queue.h). */
#include "pipeline/graph_queue.h"

#include <stdlib.h>

#include "proto/err.h"

int beam_queue_init(queue_t *q, unsigned cap) {
  q->cap = cap;
  q->size = cap + CTRL_RESERVE;
  q->buf = calloc(q->size, sizeof *q->buf);
  if (!q->buf)
    return BEAM_ENOMEM;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->not_empty, NULL);
  pthread_cond_init(&q->not_full, NULL);
  return 0;
}

void beam_queue_free(queue_t *q) {
  if (!q->buf)
    return;
  free(q->buf);
  q->buf = NULL;
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->not_empty);
  pthread_cond_destroy(&q->not_full);
}

/* Frames are held to cap; control items (START/END/QUIT) only need a
 * free place, which the reserve provides, so a series start never takes a
 * place that room() promised to a frame. */
void beam_queue_push_b(queue_t *q, const item_t *it, int batch) {
  int frame = it->kind == IT_FRAME;
  pthread_mutex_lock(&q->mu);
  while (q->count >= q->size || (frame && q->nframes >= q->cap)) {
    /* A consumer asleep on an unsignalled batch would never make room. */
    if (q->unsignalled) {
      q->unsignalled = 0;
      pthread_cond_signal(&q->not_empty);
    }
    pthread_cond_wait(&q->not_full, &q->mu);
  }
  q->buf[(q->head + q->count) % q->size] = *it;
  q->count++;
  q->nframes += frame;
  /* A queue half full wakes its stage whatever the batch: a live input
   * that finds no room drops frames, and a short queue must not fill up
   * while its stage sleeps. */
  if (batch && ++q->unsignalled < BATCH_WAKE && 2 * q->nframes < q->cap) {
    pthread_mutex_unlock(&q->mu);
    return;
  }
  q->unsignalled = 0;
  pthread_cond_signal(&q->not_empty);
  pthread_mutex_unlock(&q->mu);
}

void beam_queue_push(queue_t *q, const item_t *it) { beam_queue_push_b(q, it, 0); }

/* Wakes the consumer for what a batch pushed without waking it. */
void beam_queue_kick(queue_t *q) {
  pthread_mutex_lock(&q->mu);
  if (q->unsignalled) {
    q->unsignalled = 0;
    pthread_cond_signal(&q->not_empty);
  }
  pthread_mutex_unlock(&q->mu);
}

/* cur (may be NULL) is set under the queue lock to the popped frame's
 * ingest_idx, so a watermark reader never sees a frame in neither place.
 * With wait 0 it returns 0 at once when the queue is empty (a stage with
 * idle work); otherwise it blocks until an item is there and returns 1. */
/* busy and quiet (both may be NULL): see node_t; busy is 0 exactly while
 * the caller sleeps here on an empty queue. */
int beam_queue_pop(queue_t *q, item_t *it, uint64_t *cur, int wait, int *busy, pthread_cond_t *quiet) {
  pthread_mutex_lock(&q->mu);
  while (q->count == 0) {
    if (!wait) {
      pthread_mutex_unlock(&q->mu);
      return 0;
    }
    if (busy && *busy) {
      *busy = 0;
      pthread_cond_broadcast(quiet);
    }
    pthread_cond_wait(&q->not_empty, &q->mu);
  }
  if (busy)
    *busy = 1;
  *it = q->buf[q->head];
  if (cur && it->kind == IT_FRAME)
    *cur = it->frame->ingest_idx;
  q->head = (q->head + 1) % q->size;
  q->count--;
  q->nframes -= it->kind == IT_FRAME;
  pthread_cond_broadcast(&q->not_full);
  pthread_mutex_unlock(&q->mu);
  return 1;
}

unsigned beam_queue_depth(queue_t *q) {
  pthread_mutex_lock(&q->mu);
  unsigned n = q->count;
  pthread_mutex_unlock(&q->mu);
  return n;
}

/* Frames the queue can still take without waiting. */
unsigned beam_queue_frame_space(queue_t *q) {
  pthread_mutex_lock(&q->mu);
  unsigned n = q->nframes < q->cap ? q->cap - q->nframes : 0;
  if (q->count + n > q->size)
    n = q->size - q->count;
  pthread_mutex_unlock(&q->mu);
  return n;
}
