#include "pipeline/decode_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct beam_decode_pool_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  beam_frame_t **ring;
  unsigned cap, head, count;
  int stop;
  unsigned nthreads, nscratch; /* started; scratch buffers (one per thread asked for) */
  pthread_t *threads;
  void **scratch;
  atomic_ullong decoded;
};

typedef struct {
  beam_decode_pool_t *p;
  unsigned i;
} arg_t;

static void *run(void *a) {
  arg_t *arg = a;
  beam_decode_pool_t *p = arg->p;
  void *scratch = p->scratch[arg->i];
  free(arg);
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->count && !p->stop)
      pthread_cond_wait(&p->cv, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    beam_frame_t *f = p->ring[p->head];
    p->head = (p->head + 1) % p->cap;
    p->count--;
    pthread_mutex_unlock(&p->mu);
    /* A failed decode marks the frame CORRUPT; the stages report it. */
    if (atomic_load(&f->dec_state) == BEAM_DEC_PENDING) {
      beam_frame_decode(f, scratch, NULL);
      atomic_fetch_add(&p->decoded, 1);
    }
    beam_frame_unref(f);
  }
}

beam_decode_pool_t *beam_decode_pool_new(unsigned nthreads, unsigned cap, size_t scratch_bytes,
                                         beam_diag_t *d) {
  if (!nthreads || !cap) {
    BEAM_DIAG(d, BEAM_EINVAL, "decode pool: %u threads, queue of %u", nthreads, cap);
    return NULL;
  }
  beam_decode_pool_t *p = calloc(1, sizeof *p);
  if (!p) {
    BEAM_DIAG(d, BEAM_ENOMEM, "decode pool: out of memory");
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->cap = cap;
  p->ring = calloc(cap, sizeof *p->ring);
  p->threads = calloc(nthreads, sizeof *p->threads);
  p->scratch = calloc(nthreads, sizeof *p->scratch);
  if (!p->ring || !p->threads || !p->scratch)
    goto oom;
  p->nscratch = nthreads;
  for (unsigned i = 0; i < nthreads; i++) {
    arg_t *arg = malloc(sizeof *arg);
    p->scratch[i] = malloc(scratch_bytes ? scratch_bytes : 1);
    if (!arg || !p->scratch[i]) {
      free(arg);
      goto oom;
    }
    *arg = (arg_t){p, i};
    if (pthread_create(&p->threads[i], NULL, run, arg) != 0) {
      free(arg);
      beam_decode_pool_free(&p);
      BEAM_DIAG(d, BEAM_ENOMEM, "decode pool: cannot start thread %u", i);
      return NULL;
    }
    p->nthreads++;
  }
  return p;
oom:
  beam_decode_pool_free(&p);
  BEAM_DIAG(d, BEAM_ENOMEM, "decode pool: out of memory");
  return NULL;
}

void beam_decode_pool_push(beam_decode_pool_t *p, beam_frame_t *f) {
  pthread_mutex_lock(&p->mu);
  int room = p->count < p->cap && !p->stop;
  if (room) {
    p->ring[(p->head + p->count) % p->cap] = f;
    p->count++;
    pthread_cond_signal(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  if (!room)
    beam_frame_unref(f);
}

unsigned long long beam_decode_pool_decoded(beam_decode_pool_t *p) {
  return p ? atomic_load(&p->decoded) : 0;
}

void beam_decode_pool_free(beam_decode_pool_t **pp) {
  beam_decode_pool_t *p = *pp;
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (unsigned i = 0; i < p->nthreads; i++)
    pthread_join(p->threads[i], NULL);
  for (; p->count; p->count--) {
    beam_frame_unref(p->ring[p->head]);
    p->head = (p->head + 1) % p->cap;
  }
  for (unsigned i = 0; i < p->nscratch; i++)
    free(p->scratch[i]);
  free(p->scratch);
  free(p->threads);
  free(p->ring);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
  *pp = NULL;
}
