/* The bounded queue in front of each stage of the graph (graph.c) and the
 * items it carries: START, FRAME, END and QUIT, in order, from exactly one
 * producer. Frames wait for space (backpressure: nothing inside the graph
 * is ever dropped); control items have a small reserve on top, so a series
 * can always be closed. Internal to pipeline/. */
#ifndef BEAM_GRAPH_QUEUE_H
#define BEAM_GRAPH_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "pipeline/frame.h"
#include "pipeline/stage.h"

enum { IT_START, IT_FRAME, IT_END, IT_QUIT };
#define CTRL_RESERVE 16u
/* Input frames pushed in a batch (beam_graph_batch) wake a root stage once
 * per this many. A stage that is faster than the loop thread's ingest
 * otherwise sleeps after every frame and is woken for the next: a futex
 * call and two context switches per frame, which cost more than a small
 * stage's work on a virtual machine. */
#define BATCH_WAKE 16u

/* Shared by the END items of one series: the last stage to finish it
 * reports the series done. */
typedef struct end_tracker_s {
  atomic_int remaining;
  beam_series_t *series;
  int aborted;
} end_tracker_t;

typedef struct item_s {
  int kind;
  beam_frame_t *frame;     /* FRAME */
  beam_series_t *series;   /* START (one ref) */
  beam_indesc_t in;        /* START: what the frames look like; dtype NONE = upstream rejected */
  end_tracker_t *tracker;  /* END */
} item_t;

typedef struct queue_s {
  pthread_mutex_t mu;
  pthread_cond_t not_empty, not_full;
  item_t *buf;
  unsigned cap;   /* frames */
  unsigned size;  /* cap + CTRL_RESERVE */
  unsigned head, count;
  unsigned nframes; /* FRAME items among count: only these are held to cap */
  unsigned unsignalled; /* items pushed in a batch whose consumer was not woken */
} queue_t;

/* What each does and why: graph_queue.c. */
int beam_queue_init(queue_t *q, unsigned cap);
void beam_queue_free(queue_t *q);
void beam_queue_push_b(queue_t *q, const item_t *it, int batch);
void beam_queue_push(queue_t *q, const item_t *it);
void beam_queue_kick(queue_t *q);
int beam_queue_pop(queue_t *q, item_t *it, uint64_t *cur, int wait, int *busy, pthread_cond_t *quiet);
unsigned beam_queue_depth(queue_t *q);
unsigned beam_queue_frame_space(queue_t *q);

#endif
