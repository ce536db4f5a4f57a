/* Unit tests of the frame pool, the latency histogram and the stage graph
 * (ordering, fan-out reference counts, chaining by output name,
 * backpressure, series rejection, shutdown of an open series), using a
 * test-only stage kind so timing and failures can be controlled. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "pipeline/graph.h"
#include "pipeline/cache.h"
#include "pipeline/hist.h"

/* ---- a test stage: out = in + add (uint32), optional delay, optional reject ---- */

typedef struct tag_s {
  uint32_t add;
  int delay_us;
  int reject_series;
  int ends;
} tag_t;

static tag_t g_tag_cfg[8];
static int g_tag_next;

static const beam_stage_ops_t ltag_ops, rtag_ops;

static int tag_init(beam_stage_t *self, beam_diag_t *d) {
  tag_t *t = calloc(1, sizeof *t);
  if (!t)
    return BEAM_DIAG(d, BEAM_ENOMEM, "oom");
  *t = g_tag_cfg[g_tag_next++];
  self->priv = t;
  self->light = self->ops == &ltag_ops || self->ops == &rtag_ops;
  return 0;
}

static int tag_start(beam_stage_t *self, const beam_series_t *s, const beam_indesc_t *in, beam_diag_t *d) {
  tag_t *t = self->priv;
  if (t->reject_series)
    return BEAM_DIAG(d, BEAM_ESHAPE, "rejected on purpose");
  if (in->dtype != BEAM_DT_U32)
    return BEAM_DIAG(d, BEAM_ESHAPE, "want uint32");
  beam_outdesc_t *o = &self->outs[0];
  snprintf(o->name, sizeof o->name, "frame");
  o->dtype = BEAM_DT_U32;
  o->ndim = in->ndim;
  memcpy(o->shape, in->shape, sizeof o->shape);
  o->slots = 4;
  o->per_frame = 1;
  /* A second output so chaining by name can be tested. */
  beam_outdesc_t *o2 = &self->outs[1];
  snprintf(o2->name, sizeof o2->name, "sum");
  o2->dtype = BEAM_DT_U32;
  o2->ndim = 1;
  o2->shape[0] = 1;
  self->nouts = 2;
  (void)s;
  return 0;
}

/* The thread the last tag frame ran on, and how often a light tag ran on
 * that same thread (stage key thread). */
static unsigned long g_tag_tid;
static int g_ltag_same, g_ltag_n;

static int tag_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *e) {
  tag_t *t = self->priv;
  if (self->light) {
    __atomic_add_fetch(&g_ltag_n, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&g_tag_tid, __ATOMIC_SEQ_CST) == (unsigned long)pthread_self())
      __atomic_add_fetch(&g_ltag_same, 1, __ATOMIC_SEQ_CST);
  } else {
    __atomic_store_n(&g_tag_tid, (unsigned long)pthread_self(), __ATOMIC_SEQ_CST);
  }
  if (t->delay_us)
    usleep((useconds_t)t->delay_us);
  beam_frame_t *f = beam_emit_get(e, 0);
  if (!f)
    return BEAM_ESTATE;
  const uint32_t *src = in->data;
  uint32_t *dst = f->data;
  uint32_t sum = 0;
  for (size_t i = 0; i < beam_frame_elems(in); i++) {
    dst[i] = src[i] + t->add;
    sum += dst[i];
  }
  beam_emit_put(e, f);
  beam_frame_t *g = beam_emit_get(e, 1);
  ((uint32_t *)g->data)[0] = sum;
  beam_emit_put(e, g);
  return 0;
}

static int tag_end(beam_stage_t *self, beam_emit_t *e) {
  tag_t *t = self->priv;
  t->ends++;
  beam_frame_t *g = beam_emit_get(e, 1);
  ((uint32_t *)g->data)[0] = 0xFFFFFFFFu; /* end marker */
  g->flags |= BEAM_FLAG_FINAL;
  beam_emit_put(e, g);
  return 0;
}

static void tag_destroy(beam_stage_t *self) {
  free(self->priv);
  self->priv = NULL;
}

static const beam_stage_ops_t tag_ops = {
    .kind = "tag", .backend = "cpu",
    .init = tag_init, .start = tag_start, .process = tag_process, .end = tag_end, .destroy = tag_destroy,
};
static const beam_stage_kind_t tag_kind = {"tag", "test stage", NULL, &tag_ops, NULL, NULL};
/* The same stage declared light: thread auto may run it on its upstream's. */
static const beam_stage_ops_t ltag_ops = {
    .kind = "ltag", .backend = "cpu",
    .init = tag_init, .start = tag_start, .process = tag_process, .end = tag_end, .destroy = tag_destroy,
};
static const beam_stage_kind_t ltag_kind = {"ltag", "light test stage", NULL, &ltag_ops, NULL, NULL};

/* Tile fusion (stage.h map / reduce_mapped): mtag is tag with one output
 * and a map (out = in + add, any range; fails on frame ids of 7 mod 10
 * when g_map_fail is set); rtag is the light tag whose reduce_mapped
 * builds its output through produce in pieces of 3 elements, then adds its
 * own add, as its process would. */
static int g_map_fail, g_reduce_calls;

static int mtag_start(beam_stage_t *self, const beam_series_t *s, const beam_indesc_t *in,
                      beam_diag_t *d) {
  int rc = tag_start(self, s, in, d);
  self->nouts = 1;
  return rc;
}

static int mtag_map(beam_stage_t *self, const beam_frame_t *in, size_t off, size_t n, void *out) {
  tag_t *t = self->priv;
  if (g_map_fail && in->frame_id % 10 == 7)
    return BEAM_DIAG(&self->diag, BEAM_EIO, "map fails on purpose");
  const uint32_t *src = in->data;
  for (size_t i = 0; i < n; i++)
    ((uint32_t *)out)[i] = src[off + i] + t->add;
  return 0;
}

static int mtag_init(beam_stage_t *self, beam_diag_t *d) {
  int rc = tag_init(self, d);
  self->map = mtag_map;
  return rc;
}

static int mtag_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *e) {
  beam_frame_t *f = beam_emit_get(e, 0);
  if (!f)
    return BEAM_ESTATE;
  int rc = mtag_map(self, in, 0, beam_frame_elems(in), f->data);
  if (rc < 0) {
    beam_emit_drop(e, f);
    return rc;
  }
  beam_emit_put(e, f);
  return 0;
}

static int mtag_end(beam_stage_t *self, beam_emit_t *e) {
  (void)self;
  (void)e;
  return 0;
}

static int rtag_reduce(beam_stage_t *self, const beam_frame_t *in, beam_produce_fn produce, void *ctx,
                       beam_emit_t *e) {
  tag_t *t = self->priv;
  __atomic_add_fetch(&g_reduce_calls, 1, __ATOMIC_SEQ_CST);
  assert_null(in->data);
  beam_frame_t *f = beam_emit_get(e, 0);
  if (!f)
    return BEAM_ESTATE;
  uint32_t *dst = f->data;
  size_t n = beam_frame_elems(in);
  for (size_t off = 0; off < n; off += 3) {
    int rc = produce(ctx, off, n - off < 3 ? n - off : 3, dst + off);
    if (rc < 0) {
      beam_emit_drop(e, f);
      return rc;
    }
  }
  for (size_t i = 0; i < n; i++)
    dst[i] += t->add;
  beam_emit_put(e, f);
  return 0;
}

static int rtag_start(beam_stage_t *self, const beam_series_t *s, const beam_indesc_t *in,
                      beam_diag_t *d) {
  int rc = tag_start(self, s, in, d);
  self->reduce_mapped = rtag_reduce;
  return rc;
}

static const beam_stage_ops_t mtag_ops = {
    .kind = "mtag", .backend = "cpu",
    .init = mtag_init, .start = mtag_start, .process = mtag_process, .end = mtag_end, .destroy = tag_destroy,
};
static const beam_stage_kind_t mtag_kind = {"mtag", "pointwise test stage", NULL, &mtag_ops, NULL, NULL};
static const beam_stage_ops_t rtag_ops = {
    .kind = "rtag", .backend = "cpu",
    .init = tag_init, .start = rtag_start, .process = tag_process, .end = tag_end, .destroy = tag_destroy,
};
static const beam_stage_kind_t rtag_kind = {"rtag", "fusable light test stage", NULL, &rtag_ops, NULL, NULL};

/* ---- a fake loop: collects results and series completions ---- */

#define MAXR 20000
typedef struct sink_s {
  pthread_mutex_t mu;
  char topic[MAXR][32];
  uint64_t fid[MAXR];
  uint32_t v0[MAXR];
  uint32_t flags[MAXR];
  int n;
  int done, aborted, finished;
  int order_ok; /* series_done came after every result of the series */
  int room_calls;
} sink_t;

static sink_t *g_sink;

static void on_result(void *ctx, beam_frame_t *f) {
  sink_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  if (s->n < MAXR) {
    snprintf(s->topic[s->n], 32, "%s", beam_pool_topic(f->pool));
    s->fid[s->n] = f->frame_id;
    s->v0[s->n] = ((uint32_t *)f->data)[0];
    s->flags[s->n] = f->flags;
    s->n++;
  }
  if (s->done)
    s->order_ok = 0;
  pthread_mutex_unlock(&s->mu);
  beam_frame_unref(f); /* as the publisher would after sending */
}

static void on_series_done(void *ctx, beam_series_t *ser, int aborted) {
  sink_t *s = ctx;
  pthread_mutex_lock(&s->mu);
  s->done++;
  s->aborted += aborted;
  pthread_mutex_unlock(&s->mu);
  beam_series_unref(&ser);
}

static void on_room(void *ctx) {
  sink_t *s = ctx;
  __atomic_add_fetch(&s->room_calls, 1, __ATOMIC_SEQ_CST);
}

static void on_finished(void *ctx) {
  sink_t *s = ctx;
  __atomic_store_n(&s->finished, 1, __ATOMIC_SEQ_CST);
}

static beam_graph_hooks_t hooks(sink_t *s) {
  beam_graph_hooks_t h = {0};
  h.ctx = s;
  h.on_result = on_result;
  h.on_series_done = on_series_done;
  h.on_room = on_room;
  h.on_finished = on_finished;
  return h;
}

static sink_t *sink_new(void) {
  sink_t *s = calloc(1, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  s->order_ok = 1;
  g_sink = s;
  return s;
}

static void sink_free(sink_t *s) {
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void wait_for(int (*cond)(void *), void *arg) {
  for (int i = 0; i < 5000 && !cond(arg); i++)
    usleep(1000);
}

static int is_done(void *a) {
  sink_t *s = a;
  pthread_mutex_lock(&s->mu);
  int d = s->done;
  pthread_mutex_unlock(&s->mu);
  return d > 0;
}

static int is_finished(void *a) { return __atomic_load_n(&((sink_t *)a)->finished, __ATOMIC_SEQ_CST); }

static beam_stage_spec_t spec(const char *name, const char *input, int publish, unsigned queue) {
  beam_stage_spec_t sp = {0};
  sp.name = name;
  sp.kind = "tag";
  sp.input = input;
  sp.backend = "cpu";
  sp.publish = publish;
  sp.queue = queue;
  sp.kind_def = &tag_kind;
  return sp;
}

/* Input frame fid of series sid: 4x4 uint32, every value fid. */
static void fill(beam_frame_t *f, uint64_t sid, uint64_t fid) {
  f->series_id = sid;
  f->frame_id = fid;
  f->ingest_idx = fid;
  f->dtype = BEAM_DT_U32;
  f->ndim = 2;
  f->shape[0] = f->shape[1] = 4;
  f->nbytes = 64;
  for (int k = 0; k < 16; k++)
    ((uint32_t *)f->data)[k] = (uint32_t)fid;
}

/* Feeds n frames of h x w uint32 (value = frame id) as the loop thread
 * would: waits (spins) for room instead of blocking. */
static void feed_shape(beam_graph_t *g, uint64_t sid, int n, uint32_t h, uint32_t w, int end) {
  uint32_t shape[4] = {h, w, 0, 0};
  beam_series_t *s = beam_series_new(sid, BEAM_DT_U32, 2, shape, NULL, 0);
  beam_graph_series_start(g, s);
  for (int i = 0; i < n; i++) {
    while (!beam_graph_room(g))
      usleep(50);
    beam_frame_t *f = beam_graph_input_slot(g);
    assert_non_null(f);
    fill(f, sid, (uint64_t)i);
    f->shape[0] = h;
    f->shape[1] = w;
    f->nbytes = (size_t)h * w * 4;
    for (size_t k = 0; k < (size_t)h * w; k++)
      ((uint32_t *)f->data)[k] = (uint32_t)i;
    beam_graph_frame(g, f);
  }
  if (end)
    beam_graph_series_end(g, sid, 0);
}

/* n frames of 4x4 (fill's geometry). */
static void feed(beam_graph_t *g, uint64_t sid, int n, int end) { feed_shape(g, sid, n, 4, 4, end); }

/* ---- tests ---- */

static void test_pool_basics(void **state) {
  (void)state;
  beam_diag_t d = {0};
  beam_pool_t *p = beam_pool_new(3, 100, 0, &d);
  assert_non_null(p);
  beam_frame_t *a = beam_pool_try_get(p), *b = beam_pool_try_get(p), *c = beam_pool_try_get(p);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  assert_int_equal((uintptr_t)a->data % 64, 0);
  assert_null(beam_pool_try_get(p));
  assert_null(beam_pool_get(p, 20)); /* times out */
  beam_frame_ref(a, 2);
  beam_frame_unref(a);
  beam_frame_unref(a);
  assert_int_equal(beam_pool_free_count(p), 0);
  beam_frame_unref(a);
  assert_int_equal(beam_pool_free_count(p), 1);
  /* Closing with frames out: memory stays until the last one returns
   * (ASan would flag a use after free below). */
  beam_pool_close(&p);
  assert_null(p);
  memset(b->data, 1, 100);
  beam_frame_unref(b);
  beam_frame_unref(c);
}

static void test_pool_zero_slots(void **state) {
  (void)state;
  beam_diag_t d = {0};
  assert_null(beam_pool_new(0, 10, 0, &d));
  assert_int_equal(d.code, BEAM_EINVAL);
}

static void test_hist(void **state) {
  (void)state;
  beam_hist_t h;
  beam_hist_reset(&h);
  assert_true(beam_hist_quantile(&h, 0.5) == 0.0);
  for (int i = 1; i <= 1000; i++)
    beam_hist_add(&h, (uint64_t)i * 1000); /* 1 us .. 1 ms */
  assert_int_equal(beam_hist_count(&h), 1000);
  double p50 = beam_hist_quantile(&h, 0.5), p99 = beam_hist_quantile(&h, 0.99);
  /* One bucket is 10^(1/20) = 12 % wide. */
  assert_true(p50 > 500e3 / 1.13 && p50 < 500e3 * 1.13);
  assert_true(p99 > 990e3 / 1.13 && p99 < 990e3 * 1.13);
}

static void test_graph_order_and_done(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].add = 1000;
  beam_stage_spec_t sp[] = {spec("a", "frames", 1, 4)};
  beam_graph_params_t gp = {.pool_frames = 8, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), 0);
  feed(g, 7, 500, 1);
  wait_for(is_done, s);
  assert_int_equal(s->done, 1);
  assert_int_equal(s->aborted, 0);
  assert_true(s->order_ok);
  /* 500 frames x 2 outputs + 1 end marker, in order per output. */
  assert_int_equal(s->n, 1001);
  uint64_t next = 0;
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->topic[i], "a.frame") == 0) {
      assert_int_equal(s->fid[i], next);
      assert_int_equal(s->v0[i], next + 1000);
      next++;
    }
  assert_int_equal(next, 500);
  assert_string_equal(s->topic[s->n - 1], "a.sum");
  assert_int_equal(s->v0[s->n - 1], 0xFFFFFFFFu);
  assert_true(s->flags[s->n - 1] & BEAM_FLAG_FINAL);
  assert_true(beam_graph_idle(g));
  assert_int_equal(beam_graph_input_free(g), 8);
  beam_stage_stats_t st;
  beam_graph_stage_stats(g, 0, &st);
  assert_int_equal(st.frames_in, 500);
  assert_int_equal(st.results, 1001);
  beam_graph_destroy(&g);
  assert_null(g);
  sink_free(s);
}

/* pool.pinned auto pins only when a stage runs on CUDA: a graph of CPU
 * stages keeps its frames zero-copy and lazily decoded (daemon/ingest.c). */
static void test_graph_pin_auto(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  beam_stage_spec_t sp[] = {spec("a", "frames", 1, 4)};
  beam_graph_hooks_t h = hooks(s);
  for (int pin_auto = 0; pin_auto <= 1; pin_auto++) {
    beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64, .pinned = 1, .pin_auto = pin_auto};
    beam_graph_t *g = NULL;
    beam_diag_t d = {0};
    assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), 0);
    assert_int_equal(beam_graph_input_pinned(g), !pin_auto);
    beam_graph_destroy(&g);
  }
  sink_free(s);
}

static void test_graph_fanout_chain(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].add = 1;   /* a: frames + 1 */
  g_tag_cfg[1].add = 10;  /* b: frames + 10 */
  g_tag_cfg[2].add = 100; /* c: a.frame + 100 */
  beam_stage_spec_t sp[] = {spec("a", "frames", 0, 2), spec("b", "frames", 1, 2), spec("c", "a.frame", 1, 2)};
  beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 3, &gp, &h, &d), 0);
  feed(g, 1, 200, 1);
  wait_for(is_done, s);
  int nb = 0, nc = 0, na = 0;
  for (int i = 0; i < s->n; i++) {
    if (strcmp(s->topic[i], "b.frame") == 0) {
      assert_int_equal(s->v0[i], s->fid[i] + 10);
      nb++;
    } else if (strcmp(s->topic[i], "c.frame") == 0) {
      assert_int_equal(s->v0[i], s->fid[i] + 101);
      nc++;
    } else if (strncmp(s->topic[i], "a.", 2) == 0) {
      na++;
    }
  }
  assert_int_equal(nb, 200);
  assert_int_equal(nc, 200);
  assert_int_equal(na, 0); /* a does not publish */
  assert_int_equal(s->done, 1);
  assert_int_equal(beam_graph_input_free(g), 4); /* every fan-out reference came back */
  beam_graph_destroy(&g);
  sink_free(s);
}

static void test_graph_backpressure(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].delay_us = 2000;
  beam_stage_spec_t sp[] = {spec("slow", "frames", 1, 2)};
  beam_graph_params_t gp = {.pool_frames = 3, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), 0);
  uint32_t shape[4] = {4, 4, 0, 0};
  beam_graph_series_start(g, beam_series_new(3, BEAM_DT_U32, 2, shape, NULL, 0));
  int accepted = 0, full_seen = 0;
  for (int i = 0; i < 10; i++) {
    if (!beam_graph_room(g)) {
      full_seen = 1;
      break;
    }
    beam_frame_t *f = beam_graph_input_slot(g);
    f->series_id = 3;
    f->frame_id = (uint64_t)i;
    f->dtype = BEAM_DT_U32;
    f->ndim = 2;
    f->shape[0] = f->shape[1] = 4;
    f->nbytes = 64;
    beam_graph_frame(g, f);
    accepted++;
  }
  assert_true(full_seen);
  assert_true(accepted <= 3);
  /* Room comes back, and the graph says so through on_room. */
  for (int i = 0; i < 2000 && !beam_graph_room(g); i++)
    usleep(1000);
  assert_true(beam_graph_room(g));
  /* The slot is back before on_room runs (the worker frees, then calls):
   * wait for the call too, which a slow (sanitizer) run makes visible. */
  for (int i = 0; i < 2000 && __atomic_load_n(&s->room_calls, __ATOMIC_SEQ_CST) < 1; i++)
    usleep(1000);
  assert_true(__atomic_load_n(&s->room_calls, __ATOMIC_SEQ_CST) >= 1);
  beam_graph_series_end(g, 3, 0);
  wait_for(is_done, s);
  int frames = 0;
  for (int i = 0; i < s->n; i++)
    frames += strcmp(s->topic[i], "slow.frame") == 0;
  assert_int_equal(frames, accepted);
  beam_graph_destroy(&g);
  sink_free(s);
}

/* Frames given in a batch wake the stage once per few frames. A batch
 * larger than the stage's queue must still get through: the loop thread
 * blocks on the full queue, so the stage must have been woken for what is
 * in it (else both wait for ever; the alarm turns that into a failure).
 * The frames of a batch smaller than the wake interval are processed once
 * the batch ends. A live input never blocks: it asks for room and drops the
 * frame without it, so a short queue must wake its stage before it is
 * full (the third batch waits for room after every frame). */
static void test_graph_batch_wake(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  beam_stage_spec_t sp[] = {spec("b", "frames", 1, 4)};
  beam_graph_params_t gp = {.pool_frames = 64, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), 0);
  uint32_t shape[4] = {4, 4, 0, 0};
  beam_graph_series_start(g, beam_series_new(5, BEAM_DT_U32, 2, shape, NULL, 0));
  alarm(20);
  const int sizes[3] = {40, 3, 12};
  int fid = 0;
  for (int b = 0; b < 3; b++) {
    beam_graph_batch(g, 1);
    for (int i = 0; i < sizes[b]; i++, fid++) {
      for (int t = 0; b == 2 && t < 2000 && !beam_graph_room(g); t++)
        usleep(1000);
      assert_true(b < 2 || beam_graph_room(g));
      beam_frame_t *f = NULL;
      for (int t = 0; t < 5000 && !(f = beam_graph_input_slot(g)); t++)
        usleep(1000);
      assert_non_null(f);
      fill(f, 5, (uint64_t)fid);
      beam_graph_frame(g, f); /* blocks while the queue of 4 is full */
    }
    beam_graph_batch(g, 0);
  }
  beam_graph_series_end(g, 5, 0);
  wait_for(is_done, s);
  alarm(0);
  int frames = 0;
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->topic[i], "b.frame") == 0) {
      assert_int_equal(s->fid[i], (uint64_t)frames);
      assert_int_equal(s->v0[i], (uint32_t)frames);
      frames++;
    }
  assert_int_equal(frames, 55);
  beam_graph_destroy(&g);
  sink_free(s);
}

static void test_graph_reject_series(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].reject_series = 1;
  beam_stage_spec_t sp[] = {spec("a", "frames", 1, 4), spec("b", "a", 1, 4)};
  beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 2, &gp, &h, &d), 0);
  feed(g, 9, 20, 1);
  wait_for(is_done, s);
  assert_int_equal(s->n, 0);
  assert_int_equal(s->done, 1);
  beam_stage_stats_t st;
  beam_graph_stage_stats(g, 0, &st);
  assert_int_equal(st.rejected, 20);
  assert_int_equal(st.results, 0);
  beam_graph_destroy(&g);
  sink_free(s);
}

static void test_graph_shutdown_open_series(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  beam_stage_spec_t sp[] = {spec("a", "frames", 1, 4)};
  beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), 0);
  feed(g, 5, 30, 0);
  assert_true(beam_graph_series_open(g));
  beam_graph_shutdown(g);
  wait_for(is_finished, s);
  assert_true(beam_graph_finished(g));
  assert_int_equal(s->done, 1);
  assert_int_equal(s->aborted, 1);
  int frames = 0, marker = 0;
  for (int i = 0; i < s->n; i++) {
    frames += strcmp(s->topic[i], "a.frame") == 0;
    marker += strcmp(s->topic[i], "a.sum") == 0 && s->v0[i] == 0xFFFFFFFFu;
  }
  assert_int_equal(frames, 30); /* nothing in flight was lost */
  assert_int_equal(marker, 1);  /* the stage's end ran */
  assert_false(beam_graph_room(g));
  beam_graph_destroy(&g);
  sink_free(s);
}

static void test_graph_bad_input_name(void **state) {
  (void)state;
  sink_t *s = sink_new();
  beam_stage_spec_t sp[] = {spec("a", "nosuch", 1, 4)};
  beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), BEAM_ECONFIG);
  assert_null(g);
  assert_non_null(strstr(d.msg, "nosuch"));
  sink_free(s);
}

static void test_graph_cuda_without_gpu(void **state) {
  (void)state;
  sink_t *s = sink_new();
  static const beam_stage_kind_t k = {"tag", "test", NULL, &tag_ops, &tag_ops, NULL};
  beam_stage_spec_t sp[] = {spec("a", "frames", 1, 4)};
  sp[0].kind_def = &k;
  sp[0].backend = "cuda";
  beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  int rc = beam_graph_new(&g, sp, 1, &gp, &h, &d);
  if (beam_gpu_count(NULL, 0) > 0) {
    assert_int_equal(rc, 0);
    beam_graph_destroy(&g);
  } else {
    assert_int_equal(rc, BEAM_ENOTSUP);
    assert_non_null(strstr(d.msg, "no GPU"));
  }
  sink_free(s);
}

static void test_graph_watermark(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].delay_us = 3000; /* a: slow */
  beam_stage_spec_t sp[] = {spec("a", "frames", 0, 8), spec("b", "a", 1, 8)};
  beam_graph_params_t gp = {.pool_frames = 16, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 2, &gp, &h, &d), 0);
  assert_int_equal(beam_graph_watermark(g, 0), 0);
  feed(g, 4, 6, 0);
  uint64_t w = beam_graph_watermark(g, 6);
  assert_true(w < 6); /* a is still busy */
  uint64_t prev = w;
  for (int i = 0; i < 3000 && (w = beam_graph_watermark(g, 6)) < 6; i++) {
    assert_true(w >= prev); /* never goes back */
    prev = w;
    usleep(500);
  }
  assert_int_equal(w, 6);
  /* Everything below the watermark has its results out: b published 6. */
  pthread_mutex_lock(&s->mu);
  int nb = 0;
  for (int i = 0; i < s->n; i++)
    nb += strcmp(s->topic[i], "b.frame") == 0;
  pthread_mutex_unlock(&s->mu);
  assert_int_equal(nb, 6);
  assert_int_equal(beam_graph_room_count(g), 8); /* min(16 free slots, queue 8) */
  beam_graph_series_end(g, 4, 0);
  wait_for(is_done, s);
  beam_graph_destroy(&g);
  sink_free(s);
}

/* ---- the idle op: a toy iterative stage ----
 * idle counts its calls and emits each count on output "it". grant < 0:
 * idle always asks for more (an endless reconstruction); grant >= 0: each
 * frame allows that many calls, the last of which returns 0. end waits
 * (bounded) for interrupt when told to, as a long final loop polls it. */

typedef struct itoy_s {
  int grant;          /* config: calls allowed per frame; < 0 = endless */
  int wait_interrupt; /* config: end loops until interrupt (2 s bound) */
  int idle_us;        /* config: work per idle call */
  atomic_int left;    /* calls left of the current grant */
  atomic_int zeroed;  /* idle returned 0 and no frame came since */
  atomic_int calls, spurious, frames, ends, saw_interrupt, end_aborted;
  atomic_int calls_after_interrupt;
} itoy_t;

static itoy_t g_itoy;

static int itoy_idle(beam_stage_t *self, beam_emit_t *e) {
  itoy_t *t = self->priv;
  if (atomic_load(&self->interrupt))
    atomic_fetch_add(&t->calls_after_interrupt, 1);
  if (atomic_load(&t->zeroed)) {
    atomic_fetch_add(&t->spurious, 1); /* called again after it returned 0 */
    return 0;
  }
  if (t->grant >= 0 && atomic_load(&t->left) <= 0) {
    atomic_store(&t->zeroed, 1); /* after START, before any frame: nothing to do */
    return 0;
  }
  int n = atomic_fetch_add(&t->calls, 1) + 1;
  if (t->idle_us)
    usleep((useconds_t)t->idle_us);
  beam_frame_t *f = beam_emit_get(e, 0);
  if (f) {
    ((uint32_t *)f->data)[0] = (uint32_t)n;
    f->flags |= BEAM_FLAG_PARTIAL;
    beam_emit_put(e, f);
  }
  if (t->grant < 0)
    return 1;
  int more = atomic_fetch_sub(&t->left, 1) - 1 > 0;
  if (!more)
    atomic_store(&t->zeroed, 1);
  return more;
}

static int itoy_init(beam_stage_t *self, beam_diag_t *d) {
  self->priv = &g_itoy;
  self->idle = itoy_idle;
  return 0;
}

static int itoy_start(beam_stage_t *self, const beam_series_t *s, const beam_indesc_t *in, beam_diag_t *d) {
  itoy_t *t = self->priv;
  atomic_store(&t->zeroed, 0);
  beam_outdesc_t *o = &self->outs[0];
  snprintf(o->name, sizeof o->name, "it");
  o->dtype = BEAM_DT_U32;
  o->ndim = 1;
  o->shape[0] = 1;
  o->slots = 4;
  self->nouts = 1;
  return 0;
}

static int itoy_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *e) {
  itoy_t *t = self->priv;
  atomic_store(&t->left, t->grant);
  atomic_store(&t->zeroed, 0);
  atomic_fetch_add(&t->frames, 1);
  return 0;
}

static int itoy_end(beam_stage_t *self, beam_emit_t *e) {
  itoy_t *t = self->priv;
  atomic_store(&t->end_aborted, self->end_aborted);
  for (int i = 0; t->wait_interrupt && i < 2000 && !atomic_load(&self->interrupt); i++)
    usleep(1000);
  atomic_store(&t->saw_interrupt, atomic_load(&self->interrupt));
  atomic_fetch_add(&t->ends, 1);
  return 0;
}

static void itoy_destroy(beam_stage_t *self) { self->priv = NULL; }

static const beam_stage_ops_t itoy_ops = {
    .kind = "itoy", .backend = "cpu",
    .init = itoy_init, .start = itoy_start, .process = itoy_process, .end = itoy_end, .destroy = itoy_destroy,
};
static const beam_stage_kind_t itoy_kind = {"itoy", "idle test stage", NULL, &itoy_ops, NULL, NULL};

static beam_graph_t *itoy_graph(sink_t *s, int grant, int wait_interrupt, int idle_us) {
  memset(&g_itoy, 0, sizeof g_itoy);
  g_itoy.grant = grant, g_itoy.wait_interrupt = wait_interrupt, g_itoy.idle_us = idle_us;
  beam_stage_spec_t sp[] = {spec("it", "frames", 1, 8)};
  sp[0].kind = "itoy";
  sp[0].kind_def = &itoy_kind;
  beam_graph_params_t gp = {.pool_frames = 8, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 1, &gp, &h, &d), 0);
  return g;
}

static void push_frame(beam_graph_t *g, uint64_t sid, uint64_t fid) {
  while (!beam_graph_room(g))
    usleep(50);
  beam_frame_t *f = beam_graph_input_slot(g);
  assert_non_null(f);
  f->series_id = sid, f->frame_id = fid, f->ingest_idx = fid;
  f->dtype = BEAM_DT_U32, f->ndim = 2, f->shape[0] = f->shape[1] = 4, f->nbytes = 64;
  memset(f->data, 0, 64);
  beam_graph_frame(g, f);
}

static void series_open(beam_graph_t *g, uint64_t sid) {
  uint32_t shape[4] = {4, 4, 0, 0};
  beam_graph_series_start(g, beam_series_new(sid, BEAM_DT_U32, 2, shape, NULL, 0));
}

/* Waits up to ms for *v >= want; returns the elapsed microseconds. */
static long wait_atomic(atomic_int *v, int want, int ms) {
  uint64_t t0 = beam_now_ns();
  while (atomic_load(v) < want && beam_now_ns() - t0 < (uint64_t)ms * 1000000u)
    usleep(100);
  return (long)((beam_now_ns() - t0) / 1000);
}

static int count_topic(sink_t *s, const char *topic) {
  pthread_mutex_lock(&s->mu);
  int k = 0;
  for (int i = 0; i < s->n; i++)
    k += strcmp(s->topic[i], topic) == 0;
  pthread_mutex_unlock(&s->mu);
  return k;
}

/* (a) idle runs while the queue is empty during an open series, (b) frames
 * are still handled promptly while idle work remains, (d) shutdown sets
 * interrupt, which a long end loop sees, and idle is not called again. */
static void test_graph_idle_endless(void **state) {
  (void)state;
  sink_t *s = sink_new();
  beam_graph_t *g = itoy_graph(s, -1, 1, 1000);
  series_open(g, 3);
  /* (a) from the start on: the series is open and the queue empty. */
  wait_atomic(&g_itoy.calls, 5, 2000);
  assert_true(atomic_load(&g_itoy.calls) >= 5);
  push_frame(g, 3, 0);
  wait_atomic(&g_itoy.frames, 1, 2000);
  int c0 = atomic_load(&g_itoy.calls);
  wait_atomic(&g_itoy.calls, c0 + 20, 2000);
  assert_true(atomic_load(&g_itoy.calls) >= c0 + 20); /* (a) */
  /* (b): each frame waits at most for the idle call in progress (1 ms). */
  long worst = 0;
  for (int i = 1; i <= 20; i++) {
    int before = atomic_load(&g_itoy.calls);
    push_frame(g, 3, (uint64_t)i);
    long us = wait_atomic(&g_itoy.frames, i + 1, 2000);
    worst = us > worst ? us : worst;
    assert_int_equal(atomic_load(&g_itoy.frames), i + 1);
    wait_atomic(&g_itoy.calls, before + 2, 2000);
    assert_true(atomic_load(&g_itoy.calls) >= before + 2); /* and idle resumes */
  }
  print_message("worst frame wait behind idle work: %ld us\n", worst);
  assert_true(worst < 200000); /* generous for a loaded 2-core machine; typically ~1 ms */
  assert_true(count_topic(s, "it.it") > 0);
  /* (d) */
  beam_graph_shutdown(g);
  wait_for(is_finished, s);
  assert_true(beam_graph_finished(g));
  assert_int_equal(atomic_load(&g_itoy.ends), 1);
  assert_int_equal(atomic_load(&g_itoy.saw_interrupt), 1);
  assert_int_equal(atomic_load(&g_itoy.end_aborted), 1);
  /* At most the call that was already past the worker's check when
   * interrupt was set. */
  assert_true(atomic_load(&g_itoy.calls_after_interrupt) <= 1);
  beam_graph_destroy(&g);
  sink_free(s);
}

/* (c) after idle returns 0 it is not called until the next frame, and
 * never between series. */
static void test_graph_idle_stops(void **state) {
  (void)state;
  sink_t *s = sink_new();
  beam_graph_t *g = itoy_graph(s, 3, 0, 0);
  series_open(g, 4);
  usleep(20000); /* idle after START finds nothing to do and returns 0 */
  assert_int_equal(atomic_load(&g_itoy.calls), 0);
  push_frame(g, 4, 0);
  wait_atomic(&g_itoy.calls, 3, 2000);
  usleep(30000);
  assert_int_equal(atomic_load(&g_itoy.calls), 3);
  push_frame(g, 4, 1);
  wait_atomic(&g_itoy.calls, 6, 2000);
  usleep(30000);
  assert_int_equal(atomic_load(&g_itoy.calls), 6);
  assert_int_equal(atomic_load(&g_itoy.spurious), 0);
  beam_graph_series_end(g, 4, 0);
  wait_for(is_done, s);
  assert_int_equal(atomic_load(&g_itoy.ends), 1);
  assert_int_equal(atomic_load(&g_itoy.end_aborted), 0);
  usleep(20000);
  assert_int_equal(atomic_load(&g_itoy.calls), 6);
  assert_int_equal(atomic_load(&g_itoy.spurious), 0);
  assert_int_equal(count_topic(s, "it.it"), 6);
  beam_graph_destroy(&g);
  sink_free(s);
}

/* ---- where a stage runs (stage key thread) ---- */

static int done_n(sink_t *s) {
  pthread_mutex_lock(&s->mu);
  int d = s->done;
  pthread_mutex_unlock(&s->mu);
  return d;
}

/* Runs series of the given frame sizes through a (tag) -> c (ltag, thread
 * mode); checks every c result in order and value; returns how many of c's
 * frames ran on a's thread. */
static int run_chain(const char *mode, const uint32_t *sizes, int nseries, int nframes) {
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].add = 1;
  g_tag_cfg[1].add = 100;
  g_ltag_same = g_ltag_n = 0;
  beam_stage_spec_t sp[] = {spec("a", "frames", 0, 4), spec("c", "a.frame", 1, 4)};
  sp[1].kind = "ltag";
  sp[1].kind_def = &ltag_kind;
  sp[1].thread = mode;
  beam_graph_params_t gp = {.pool_frames = 6, .frame_bytes = (size_t)1100 * 1100 * 4,
                            .inline_max_bytes = 2u << 20};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 2, &gp, &h, &d), 0);
  for (int k = 0; k < nseries; k++) {
    feed_shape(g, (uint64_t)k + 1, nframes, sizes[k], sizes[k], 1);
    for (int i = 0; i < 5000 && done_n(s) <= k; i++)
      usleep(1000);
    assert_int_equal(done_n(s), k + 1);
  }
  int next = 0, series = 0;
  for (int i = 0; i < s->n; i++) {
    if (strcmp(s->topic[i], "c.frame"))
      continue;
    assert_int_equal(s->fid[i], (uint64_t)next); /* in order within each series */
    assert_int_equal(s->v0[i], (uint32_t)next + 101);
    if (++next == nframes) {
      next = 0;
      series++;
    }
  }
  assert_int_equal(series, nseries);
  assert_int_equal(beam_graph_input_free(g), 6);
  beam_graph_destroy(&g);
  sink_free(s);
  assert_int_equal(g_ltag_n, nseries * nframes);
  return g_ltag_same;
}

static void test_graph_thread_modes(void **state) {
  (void)state;
  const uint32_t small[3] = {4, 4, 4};
  /* auto: a light CPU stage after a CPU stage, small frames: a's thread. */
  assert_int_equal(run_chain(NULL, small, 3, 300), 900);
  assert_int_equal(run_chain("upstream", small, 3, 300), 900);
  assert_int_equal(run_chain("own", small, 3, 300), 0);
}

/* auto decides per series from the frame size: 1024x1024 uint32 (4 MiB)
 * on c's own thread, 4x4 on a's; switching back and forth keeps every
 * frame, in order, with no item handled by both threads. */
static void test_graph_thread_auto_switches(void **state) {
  (void)state;
  const uint32_t sizes[5] = {4, 1024, 4, 1024, 4};
  assert_int_equal(run_chain("auto", sizes, 5, 20), 3 * 20);
  const uint32_t big[2] = {1024, 1024};
  assert_int_equal(run_chain("upstream", big, 2, 10), 20);
}

static void test_graph_thread_upstream_refused(void **state) {
  (void)state;
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  beam_stage_spec_t sp[] = {spec("a", "frames", 0, 4), spec("b", "a.frame", 1, 4),
                            spec("c", "a.frame", 1, 4)};
  sp[2].thread = "upstream";
  beam_graph_params_t gp = {.pool_frames = 4, .frame_bytes = 64};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 3, &gp, &h, &d), BEAM_ECONFIG);
  assert_null(g);
  assert_non_null(strstr(d.msg, "stage \"c\": thread: upstream is not possible: its upstream stage "
                                "feeds other stages too"));
  sp[0].thread = "upstream"; /* a root: frames come from the loop thread */
  sp[2].thread = NULL;
  memset(&d, 0, sizeof d);
  g_tag_next = 0;
  assert_int_equal(beam_graph_new(&g, sp, 3, &gp, &h, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "it reads the input frames"));
  /* auto with two consumers: both keep their own threads, and run. */
  sp[0].thread = NULL;
  g_tag_next = 0;
  assert_int_equal(beam_graph_new(&g, sp, 3, &gp, &h, &d), 0);
  feed(g, 1, 50, 1);
  wait_for(is_done, s);
  assert_int_equal(s->done, 1);
  beam_graph_destroy(&g);
  sink_free(s);
}

/* a (mtag, unpublished) -> c (rtag): fused at any frame size under auto
 * (1024 x 1024 uint32 is past inline_max: fusion alone puts c on a's
 * thread), every value right; not fused with thread own or when a
 * publishes; a map error is a's (counted there, c never sees the frame). */
static void run_fusion(const char *mode, int publish, int fail, uint32_t side, int want_fused) {
  sink_t *s = sink_new();
  memset(g_tag_cfg, 0, sizeof g_tag_cfg);
  g_tag_next = 0;
  g_tag_cfg[0].add = 1;
  g_tag_cfg[1].add = 100;
  g_map_fail = fail;
  g_reduce_calls = 0;
  beam_stage_spec_t sp[] = {spec("a", "frames", publish, 4), spec("c", "a.frame", 1, 4)};
  sp[0].kind = "mtag";
  sp[0].kind_def = &mtag_kind;
  sp[1].kind = "rtag";
  sp[1].kind_def = &rtag_kind;
  sp[1].thread = mode;
  beam_graph_params_t gp = {.pool_frames = 6, .frame_bytes = (size_t)1024 * 1024 * 4,
                            .inline_max_bytes = 2u << 20};
  beam_graph_hooks_t h = hooks(s);
  beam_graph_t *g = NULL;
  beam_diag_t d = {0};
  assert_int_equal(beam_graph_new(&g, sp, 2, &gp, &h, &d), 0);
  int n = 30;
  feed_shape(g, 1, n, side, side, 1);
  for (int i = 0; i < 5000 && done_n(s) < 1; i++)
    usleep(1000);
  assert_int_equal(done_n(s), 1);
  int got = 0;
  for (int i = 0; i < s->n; i++) {
    if (strcmp(s->topic[i], "c.frame"))
      continue;
    assert_true(!fail || s->fid[i] % 10 != 7);
    assert_int_equal(s->v0[i], (uint32_t)s->fid[i] + 101);
    got++;
  }
  int lost = fail ? 3 : 0;
  assert_int_equal(got, n - lost);
  beam_stage_stats_t sa, sc;
  beam_graph_stage_stats(g, 0, &sa);
  beam_graph_stage_stats(g, 1, &sc);
  assert_int_equal(sa.fused, want_fused ? (uint64_t)(n - lost) : 0);
  assert_int_equal(g_reduce_calls, want_fused ? n : 0); /* failing frames too: the map fails inside */
  assert_int_equal(sa.errors, (uint64_t)lost);
  assert_int_equal(sc.frames_in, (uint64_t)(n - lost));
  assert_int_equal(sc.frames_out, (uint64_t)(n - lost));
  assert_int_equal(sc.errors, 0);
  assert_int_equal(beam_graph_input_free(g), 6);
  beam_graph_destroy(&g);
  sink_free(s);
}

static void test_graph_fusion(void **state) {
  (void)state;
  run_fusion(NULL, 0, 0, 4, 1);
  run_fusion(NULL, 0, 0, 1024, 1);
  run_fusion("upstream", 0, 1, 16, 1);
  run_fusion("own", 0, 0, 16, 0);
  run_fusion(NULL, 1, 0, 16, 0);
  run_fusion(NULL, 1, 1, 16, 0);
}

static void test_cache_resident(void **state) {
  (void)state;
  size_t llc = beam_llc_bytes();
  assert_int_equal(beam_llc_bytes(), llc); /* read once, the same after */
  assert_true(beam_cache_resident(0));
  assert_false(beam_cache_resident(SIZE_MAX));
  size_t lim = llc ? llc / 4 : 2u << 20;
  assert_true(beam_cache_resident(lim));
  assert_false(beam_cache_resident(lim + 1));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_basics),
      cmocka_unit_test(test_pool_zero_slots),
      cmocka_unit_test(test_hist),
      cmocka_unit_test(test_graph_order_and_done),
      cmocka_unit_test(test_graph_fanout_chain),
      cmocka_unit_test(test_graph_backpressure),
      cmocka_unit_test(test_graph_batch_wake),
      cmocka_unit_test(test_graph_reject_series),
      cmocka_unit_test(test_graph_shutdown_open_series),
      cmocka_unit_test(test_graph_bad_input_name),
      cmocka_unit_test(test_graph_cuda_without_gpu),
      cmocka_unit_test(test_graph_watermark),
      cmocka_unit_test(test_graph_idle_endless),
      cmocka_unit_test(test_graph_idle_stops),
      cmocka_unit_test(test_graph_pin_auto),
      cmocka_unit_test(test_graph_thread_modes),
      cmocka_unit_test(test_graph_thread_auto_switches),
      cmocka_unit_test(test_graph_thread_upstream_refused),
      cmocka_unit_test(test_graph_fusion),
      cmocka_unit_test(test_cache_resident),
  };
  return beam_run_tests(tests, NULL, NULL);
}
