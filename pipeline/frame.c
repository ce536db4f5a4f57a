/* Frame pools, frame references and series records (see frame.h).
 *
 * A pool is a free list under one mutex: at 10^5 frames/s the lock is held
 * for a few instructions per frame, far below the cost of the frame itself,
 * and a condition variable gives stages a blocking get for backpressure. */
#include "pipeline/frame.h"

#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "pipeline/device.h"

struct beam_pool_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned nslots, nfree;
  size_t slot_bytes;
  int pinned;
  int closed;   /* owner released it */
  int waking;   /* beam_pool_wake: gets return NULL */
  beam_frame_t *frames;
  beam_frame_t **free_list;
  void *mem;
  void (*release_cb)(void *);
  void *release_ctx;
  char topic[BEAM_TOPIC_MAX + 1];
  char *desc_json;
  void *user_mem;
};

static void pool_free(beam_pool_t *p) {
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  beam_host_free(p->mem, p->pinned);
  free(p->frames);
  free(p->free_list);
  free(p->desc_json);
  free(p->user_mem);
  free(p);
}

beam_pool_t *beam_pool_new(unsigned nslots, size_t slot_bytes, int pinned, beam_diag_t *d) {
  if (nslots == 0) {
    BEAM_DIAG(d, BEAM_EINVAL, "pool: zero slots");
    return NULL;
  }
  /* Round slots to 64 bytes so every frame is aligned for SIMD loads. */
  size_t stride = (slot_bytes + 63) & ~(size_t)63;
  if (stride == 0)
    stride = 64;
  if (stride > SIZE_MAX / nslots) {
    BEAM_DIAG(d, BEAM_ENOMEM, "pool: %u x %zu bytes overflows", nslots, slot_bytes);
    return NULL;
  }
  beam_pool_t *p = calloc(1, sizeof *p);
  if (!p) {
    BEAM_DIAG(d, BEAM_ENOMEM, "pool: out of memory");
    return NULL;
  }
  p->frames = calloc(nslots, sizeof *p->frames);
  p->free_list = calloc(nslots, sizeof *p->free_list);
  p->mem = beam_host_alloc(stride * nslots, pinned);
  if (!p->frames || !p->free_list || !p->mem) {
    BEAM_DIAG(d, BEAM_ENOMEM, "pool: cannot allocate %u frames of %zu bytes (%.1f MiB%s)", nslots,
              slot_bytes, (double)stride * nslots / 1048576.0, pinned ? ", pinned" : "");
    beam_host_free(p->mem, pinned);
    free(p->frames);
    free(p->free_list);
    free(p);
    return NULL;
  }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->nslots = p->nfree = nslots;
  p->slot_bytes = slot_bytes;
  p->pinned = pinned;
  for (unsigned i = 0; i < nslots; i++) {
    beam_frame_t *f = &p->frames[i];
    f->data = f->own_data = (char *)p->mem + (size_t)i * stride;
    f->index = i;
    f->cap = slot_bytes;
    f->pool = p;
    atomic_init(&f->refs, 0);
    atomic_init(&f->dec_state, BEAM_DEC_NONE);
    p->free_list[i] = f;
  }
  return p;
}

int beam_pool_set_user(beam_pool_t *p, size_t bytes) {
  size_t stride = (bytes + 15) & ~(size_t)15;
  if (!stride)
    return 0;
  void *m = NULL;
  if (posix_memalign(&m, 16, stride * p->nslots) != 0)
    return BEAM_ENOMEM;
  memset(m, 0, stride * p->nslots);
  free(p->user_mem);
  p->user_mem = m;
  for (unsigned i = 0; i < p->nslots; i++)
    p->frames[i].user = (char *)m + (size_t)i * stride;
  return 0;
}

void beam_pool_prefault(beam_pool_t *p) {
  if (p->pinned)
    return;
  size_t stride = (p->slot_bytes + 63) & ~(size_t)63;
  memset(p->mem, 0, (stride ? stride : 64) * p->nslots);
}

void beam_pool_close(beam_pool_t **pp) {
  if (!pp || !*pp)
    return;
  beam_pool_t *p = *pp;
  *pp = NULL;
  pthread_mutex_lock(&p->mu);
  p->closed = 1;
  int all_back = p->nfree == p->nslots;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (all_back)
    pool_free(p);
}

static beam_frame_t *take_locked(beam_pool_t *p) {
  beam_frame_t *f = p->free_list[--p->nfree];
  atomic_store(&f->refs, 1);
  f->flags = 0;
  f->missing_before = 0;
  f->nbytes = 0;
  f->ndim = 0;
  memset(f->shape, 0, sizeof f->shape);
  memset(f->pos, 0, sizeof f->pos);
  return f;
}

beam_frame_t *beam_pool_try_get(beam_pool_t *p) {
  beam_frame_t *f = NULL;
  pthread_mutex_lock(&p->mu);
  if (!p->closed && p->nfree > 0)
    f = take_locked(p);
  pthread_mutex_unlock(&p->mu);
  return f;
}

beam_frame_t *beam_pool_get(beam_pool_t *p, int timeout_ms) {
  struct timespec dl;
  if (timeout_ms >= 0) {
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000L;
    }
  }
  beam_frame_t *f = NULL;
  pthread_mutex_lock(&p->mu);
  while (!p->closed && !p->waking && p->nfree == 0) {
    if (timeout_ms < 0)
      pthread_cond_wait(&p->cv, &p->mu);
    else if (pthread_cond_timedwait(&p->cv, &p->mu, &dl) != 0)
      break;
  }
  if (!p->closed && !p->waking && p->nfree > 0)
    f = take_locked(p);
  pthread_mutex_unlock(&p->mu);
  return f;
}

void beam_pool_wake(beam_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  p->waking = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

unsigned beam_pool_free_count(beam_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  unsigned n = p->nfree;
  pthread_mutex_unlock(&p->mu);
  return n;
}

unsigned beam_pool_size(const beam_pool_t *p) { return p->nslots; }
size_t beam_pool_slot_bytes(const beam_pool_t *p) { return p->slot_bytes; }

void beam_pool_on_release(beam_pool_t *p, void (*cb)(void *ctx), void *ctx) {
  pthread_mutex_lock(&p->mu);
  p->release_cb = cb;
  p->release_ctx = ctx;
  pthread_mutex_unlock(&p->mu);
}

void beam_pool_set_label(beam_pool_t *p, const char *topic, const char *desc_json) {
  snprintf(p->topic, sizeof p->topic, "%s", topic ? topic : "");
  free(p->desc_json);
  p->desc_json = desc_json ? strdup(desc_json) : NULL;
}
const char *beam_pool_topic(const beam_pool_t *p) { return p->topic; }
const char *beam_pool_desc(const beam_pool_t *p) { return p->desc_json; }

void beam_frame_ref(beam_frame_t *f, int n) { atomic_fetch_add(&f->refs, n); }

void beam_frame_unref(beam_frame_t *f) {
  if (!f)
    return;
  int prev = atomic_fetch_sub(&f->refs, 1);
  BEAM_ASSERT(prev > 0);
  if (prev != 1)
    return;
  if (f->release) {
    f->release(f, f->release_ctx);
    f->release = NULL;
    f->data = f->own_data;
  }
  f->codec = BEAM_CODEC_RAW;
  f->enc_size = 0;
  f->keep_encoded = 0;
  f->enc_data = NULL;
  f->enc_len = 0;
  atomic_store(&f->dec_state, BEAM_DEC_NONE);
  beam_pool_t *p = f->pool;
  pthread_mutex_lock(&p->mu);
  p->free_list[p->nfree++] = f;
  int done = p->closed && p->nfree == p->nslots;
  void (*cb)(void *) = p->release_cb;
  void *ctx = p->release_ctx;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (done)
    pool_free(p);
  else if (cb)
    cb(ctx);
}

int beam_frame_decode(beam_frame_t *f, void *scratch, const char **why) {
  int st;
again:
  st = atomic_load(&f->dec_state);
  if (st == BEAM_DEC_PENDING && atomic_compare_exchange_strong(&f->dec_state, &st, BEAM_DEC_BUSY)) {
    const char *w = NULL;
    size_t es = beam_dtype_size(f->dtype);
    int rc = f->nbytes > f->cap ? BEAM_EPROTO : 0;
    if (rc < 0)
      w = "decoded frame larger than its slot";
    else
      rc = beam_codec_decode((beam_codec_t)f->codec, f->data, f->enc_size, f->own_data, f->nbytes,
                             es ? es : 1, scratch, &w);
    /* The encoded bytes are not needed any more: give the ZeroMQ message
     * back now rather than when the frame's last reference goes, unless a
     * stage will store them as they are. */
    if (rc == 0 && f->keep_encoded) {
      f->enc_data = f->data;
      f->enc_len = f->enc_size;
      f->enc_codec = f->codec;
    } else if (f->release) {
      f->release(f, f->release_ctx);
      f->release = NULL;
    }
    f->data = f->own_data;
    f->codec = BEAM_CODEC_RAW;
    f->enc_size = 0;
    if (rc < 0) {
      f->dec_why = w ? w : "undecodable payload";
      f->nbytes = 0;
      f->flags |= BEAM_FLAG_CORRUPT;
    }
    atomic_store(&f->dec_state, rc < 0 ? BEAM_DEC_FAILED : BEAM_DEC_DONE);
    st = rc < 0 ? BEAM_DEC_FAILED : BEAM_DEC_DONE;
  }
  /* Another stage thread is decoding this frame (well under a millisecond
   * at 512x512, ~10 ms at 2048x2048): yield rather than block on a
   * condition, which would cost every frame a mutex for the rare case. */
  while (st == BEAM_DEC_BUSY) {
    sched_yield();
    st = atomic_load(&f->dec_state);
  }
  /* BUSY was a loan of the encoded bytes (beam_frame_encoded_lend), not a
   * decode: the frame is still encoded and someone must decode it. */
  if (st == BEAM_DEC_PENDING)
    goto again;
  if (st == BEAM_DEC_FAILED) {
    if (why)
      *why = f->dec_why;
    return BEAM_EPROTO;
  }
  return 0;
}

int beam_frame_encoded_lend(beam_frame_t *f) {
  int st = BEAM_DEC_PENDING;
  return atomic_compare_exchange_strong(&f->dec_state, &st, BEAM_DEC_BUSY);
}

int beam_frame_encoded_kept(beam_frame_t *f, const void **data, size_t *len, beam_codec_t *codec) {
  /* The decoder wrote enc_* before its release store of DONE. */
  if (atomic_load(&f->dec_state) != BEAM_DEC_DONE || !f->enc_data)
    return 0;
  *data = f->enc_data;
  *len = f->enc_len;
  *codec = (beam_codec_t)f->enc_codec;
  return 1;
}

void beam_frame_encoded_return(beam_frame_t *f) {
  BEAM_ASSERT(atomic_load(&f->dec_state) == BEAM_DEC_BUSY);
  atomic_store(&f->dec_state, BEAM_DEC_PENDING);
}

void beam_frame_copy_ident(beam_frame_t *dst, const beam_frame_t *src) {
  dst->series_id = src->series_id;
  dst->frame_id = src->frame_id;
  dst->seq = src->seq;
  dst->ingest_idx = src->ingest_idx;
  dst->t_acq_ns = src->t_acq_ns;
  dst->t_recv_ns = src->t_recv_ns;
  dst->flags = src->flags;
  dst->missing_before = src->missing_before;
  memcpy(dst->pos, src->pos, sizeof dst->pos);
}

size_t beam_frame_elems(const beam_frame_t *f) {
  size_t n = f->ndim ? 1 : 0;
  for (uint32_t i = 0; i < f->ndim; i++)
    n *= f->shape[i];
  return n;
}

static double meta_num(json_t *root, const char *key) {
  json_t *v = json_object_get(root, key);
  return json_is_number(v) ? json_number_value(v) : 0.0;
}

beam_series_t *beam_series_new(uint64_t series_id, beam_dtype_t dtype, uint32_t ndim,
                               const uint32_t *shape, const char *meta, size_t meta_len) {
  beam_series_t *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->series_id = series_id;
  s->dtype = dtype;
  s->ndim = ndim > BEAM_MAX_NDIM ? BEAM_MAX_NDIM : ndim;
  for (uint32_t i = 0; i < s->ndim; i++)
    s->shape[i] = shape[i];
  atomic_init(&s->refs, 1);
  if (meta && meta_len) {
    s->meta_json = malloc(meta_len + 1);
    if (!s->meta_json) {
      free(s);
      return NULL;
    }
    memcpy(s->meta_json, meta, meta_len);
    s->meta_json[meta_len] = 0;
    s->meta_len = meta_len;
    /* Metadata that is not valid JSON is kept verbatim but gives no values:
     * the frames themselves never depend on it. */
    json_t *root = json_loadb(meta, meta_len, 0, NULL);
    if (json_is_object(root)) {
      s->frame_time_s = meta_num(root, "frame_time");
      s->energy_ev = meta_num(root, "energy");
      s->distance_m = meta_num(root, "distance");
      s->pixel_size_m = meta_num(root, "pixel_size");
      double nf = meta_num(root, "nframes");
      s->nframes = nf > 0 ? (uint64_t)nf : 0;
    }
    json_decref(root);
  }
  return s;
}

beam_series_t *beam_series_ref(beam_series_t *s) {
  if (s)
    atomic_fetch_add(&s->refs, 1);
  return s;
}

void beam_series_unref(beam_series_t **sp) {
  if (!sp || !*sp)
    return;
  beam_series_t *s = *sp;
  *sp = NULL;
  if (atomic_fetch_sub(&s->refs, 1) == 1) {
    for (unsigned i = 0; i < s->narrays; i++)
      beam_array_free(&s->arrays[i].arr);
    free(s->meta_json);
    free(s);
  }
}

int beam_series_add_array(beam_series_t *s, const char *name, beam_dtype_t dtype, uint32_t ndim,
                          const uint32_t *shape, const void *data, size_t nbytes) {
  if (!s || !name || !shape)
    return BEAM_EINVAL;
  /* Immutable once shared: stage threads read the arrays without a lock. */
  if (atomic_load(&s->refs) != 1)
    return BEAM_ESTATE;
  size_t len = strnlen(name, BEAM_SERIES_ARRAY_NAME_MAX + 1);
  if (len == 0 || len > BEAM_SERIES_ARRAY_NAME_MAX || beam_series_array(s, name))
    return BEAM_EINVAL;
  if (s->narrays >= BEAM_SERIES_MAX_ARRAYS)
    return BEAM_ELIMIT;
  size_t esz = beam_dtype_size(dtype);
  if (esz == 0 || ndim < 1 || ndim > BEAM_MAX_NDIM)
    return BEAM_EINVAL;
  /* prod(shape) x esz without overflow: every partial product stays below
   * the limit, which is far below SIZE_MAX. */
  uint64_t want = esz;
  for (uint32_t i = 0; i < ndim; i++) {
    if (shape[i] == 0)
      return BEAM_EINVAL;
    if (want > BEAM_ARRAY_MAX_BYTES / shape[i])
      return BEAM_ELIMIT;
    want *= shape[i];
  }
  if ((uint64_t)nbytes != want || !data)
    return BEAM_EINVAL;
  beam_series_array_t *a = &s->arrays[s->narrays];
  void *copy = malloc(nbytes);
  if (!copy)
    return BEAM_ENOMEM;
  memcpy(copy, data, nbytes);
  memset(a, 0, sizeof *a);
  memcpy(a->name, name, len);
  a->arr.dtype = dtype;
  a->arr.ndim = ndim;
  for (uint32_t i = 0; i < ndim; i++)
    a->arr.shape[i] = shape[i];
  a->arr.nbytes = nbytes;
  a->arr.data = copy;
  s->narrays++;
  return 0;
}

const beam_series_array_t *beam_series_array(const beam_series_t *s, const char *name) {
  if (!s || !name)
    return NULL;
  for (unsigned i = 0; i < s->narrays; i++)
    if (strcmp(s->arrays[i].name, name) == 0)
      return &s->arrays[i];
  return NULL;
}

uint64_t beam_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t beam_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
