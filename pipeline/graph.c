/* The stage graph at run time: one worker thread per stage, a bounded queue
 * in front of each, per-series output pools, and the hooks back to the
 * daemon (see graph.h for the threading contract).
 *
 * Items on a queue are START, FRAME, END and QUIT. Every stage receives
 * them from exactly one producer (ingest or its upstream stage) and handles
 * them in order, which is what makes each stage's output ordered and lets
 * END/QUIT double as barriers. Frames wait for queue space (backpressure:
 * nothing inside the graph is ever dropped); control items have a small
 * reserve on top so a series can always be closed. */
#include "pipeline/graph.h"

#include "pipeline/decode_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <syslog.h>

#include <jansson.h>

#include "pipeline/cache.h"
#include "pipeline/device.h"
#include "pipeline/emit_int.h"
#include "pipeline/graph_queue.h"

#define MAX_CONSUMERS 32
#define DEFAULT_OUT_SLOTS 8u
/* Small outputs (sums, scores, g2 rows) get more slots, up to this many
 * bytes: a stage that may emit only 8 results before the loop thread
 * publishes them waits on that thread every 8 frames of a 32-frame burst,
 * a futex and two context switches each time. */
#define SMALL_OUT_SLOTS 64u
#define SMALL_OUT_BYTES (1u << 20)
/* Frames up to this size wake the next stage once per few frames (queue
 * BATCH_WAKE, or when their producer waits), as input frames in a batch
 * do: a stage faster than its upstream would otherwise sleep and be woken
 * for every frame. Larger frames wake it at once, while the frame the
 * upstream just wrote is still in the cache. */
#define BATCH_OUT_BYTES (2u << 20)

/* `thread: auto` runs a light stage on its upstream's thread when the
 * frames it reads stay in cache between the two (beam_cache_resident, or
 * beam_graph_params_t.inline_max_bytes): it then reads them from the
 * cache of the core that wrote them, and no thread is woken per frame.
 * Frames read from memory whichever core reads them gain more from the
 * two stages running side by side. bench/run.py throughput prints both.
 * Except where the two fuse (stage.h map / reduce_mapped: the upstream's
 * output is then made a tile at a time for the consumer and never written
 * whole), which works at any size: auto then takes the upstream's thread
 * whatever the cache, and gives it back at once if the consumer's start
 * did not offer fusion for the series. */
enum { THREAD_AUTO, THREAD_OWN, THREAD_UPSTREAM };


typedef struct node_s node_t;
typedef struct out_s {
  beam_pool_t *pool;
  node_t *cons[MAX_CONSUMERS];
  unsigned ncons;
  int batch; /* small frames: consumers woken per few frames (BATCH_OUT_BYTES) */
} out_t;

/* A downstream stage and which of our outputs it reads (by name, resolved
 * at every series start because outputs are declared then). */
typedef struct cons_spec_s {
  node_t *node;
  char out[BEAM_NAME_MAX]; /* "" = output 0 */
  int resolved;            /* index into outs, -1 when this series has no such output */
} cons_spec_t;

struct node_s {
  beam_stage_t stage;
  cons_spec_t cons[MAX_CONSUMERS];
  unsigned ncons;
  const beam_stage_kind_t *kind;
  const char *backend;
  beam_graph_t *g;
  queue_t q;
  pthread_t thread;
  int started, inited;
  int publish;
  out_t outs[BEAM_STAGE_MAX_OUTS];
  beam_series_t *series; /* current series when start succeeded */
  int series_ok;
  int idle_more; /* the stage's idle op asked to be called again */
  int kick;      /* frames pushed downstream without waking their stage */
  int upstream;          /* node index of the input stage, -1 = frames */
  /* Where this stage runs (stage key `thread`, see thread_for). A stage
   * that may run on its upstream's thread (`may_inline`: it is that
   * upstream's only consumer and has no idle work) still has a thread of
   * its own; on_upstream says, per series, which one handles its items:
   * while set, its upstream hands them over by a call instead of the
   * queue, so the frame just written is read from that core's cache and
   * no thread is woken. Changed only by the upstream's thread at a series
   * start, under q.mu, when this stage's thread is idle with nothing
   * queued (wait_quiet), so the two threads never both run its items. */
  int thread_mode;
  int may_inline;
  int on_upstream;
  /* Own thread anywhere but asleep on an empty queue (under q.mu; 1 from
   * the start, so that an upstream never runs our items before our thread
   * has reached its first wait). */
  int busy;
  pthread_cond_t quiet;  /* signalled when busy drops to 0 */
  int quiet_init;
  node_t *inl;           /* our only consumer, when it may run on our thread */
  uint64_t nested_ns;    /* time spent in inl's items during our own (stats) */
  /* ingest_idx of the frame being processed, UINT64_MAX when idle (read
   * by beam_graph_watermark under the queue lock). */
  uint64_t cur_idx;
  uint64_t last_idx;     /* of the last frame processed (for end results) */
  uint64_t last_fid;     /* its frame_id: end results carry it */
  void *dec_scratch;     /* stages reading "frames": lazy decode (beam_frame_decode) */
  atomic_uint_fast64_t frames_in, frames_out, results, rejected, errors, nseries, busy_ns;
  atomic_uint_fast64_t fused; /* frames whose output went to inl by tile fusion */
  beam_hist_t lat;
};

struct beam_graph_s {
  node_t *nodes;
  size_t n;
  node_t *roots[MAX_CONSUMERS]; /* fed by "frames" */
  unsigned nroots;
  beam_pool_t *input;
  beam_graph_hooks_t hooks;
  beam_series_t *open; /* ingest's open series */
  atomic_int inflight;  /* frames + control items not yet fully handled */
  atomic_int running;   /* workers alive */
  atomic_int want_room;
  int shutting_down;
  int batch; /* beam_graph_batch: root stages woken once per BATCH_WAKE frames */
  int pinned;
  int keep_encoded; /* a root stage can store wire bytes as they are */
  beam_decode_pool_t *dpool; /* NULL: stages decode lazily themselves */
  size_t inline_max; /* beam_graph_params_t.inline_max_bytes */
  /* beam_graph_watermark (loop thread only): the nodes in dependency
   * order, wm_n of them, and each one's value, so no call allocates. */
  size_t *wm_order, wm_n;
  uint64_t *wm;
};

/* ---- helpers ------------------------------------------------------------ */

static void room_maybe(beam_graph_t *g) {
  /* want_room > 1 (beam_graph_want_room): not before that many input
   * slots are free, so a caller waiting for a batch is woken once. */
  int w = atomic_load(&g->want_room);
  if (w > 1 && beam_pool_free_count(g->input) < (unsigned)w)
    return;
  if (w && atomic_exchange(&g->want_room, 0) && g->hooks.on_room)
    g->hooks.on_room(g->hooks.ctx);
}

static void input_released(void *ctx) { room_maybe(ctx); }

static void report(node_t *nd, uint64_t sid, uint64_t fid, const char *msg) {
  beam_graph_t *g = nd->g;
  if (g->hooks.on_error)
    g->hooks.on_error(g->hooks.ctx, nd->stage.name, sid, fid, msg);
}

static size_t out_bytes(const beam_outdesc_t *o) { return beam_geom_bytes(o->dtype, o->ndim, o->shape); }

static char *describe_out(const node_t *nd, const beam_outdesc_t *o, uint64_t series_id) {
  json_t *d = json_object();
  json_object_set_new(d, "stage", json_string(nd->stage.name));
  json_object_set_new(d, "kind", json_string(nd->kind->kind));
  json_object_set_new(d, "output", json_string(o->name));
  json_object_set_new(d, "dtype", json_string(beam_dtype_name(o->dtype)));
  json_t *shape = json_array(), *axes = json_array();
  for (uint32_t i = 0; i < o->ndim; i++) {
    json_array_append_new(shape, json_integer(o->shape[i]));
    json_array_append_new(axes, json_string(o->axes[i] ? o->axes[i] : ""));
  }
  json_object_set_new(d, "shape", shape);
  json_object_set_new(d, "axes", axes);
  json_object_set_new(d, "units", json_string(o->units ? o->units : ""));
  json_object_set_new(d, "per_frame", json_boolean(o->per_frame));
  json_object_set_new(d, "series_id", json_integer((json_int_t)series_id));
  if (o->labels_json) {
    json_t *l = json_loads(o->labels_json, 0, NULL);
    if (l)
      json_object_set_new(d, "labels", l);
  }
  char *s = json_dumps(d, JSON_COMPACT);
  json_decref(d);
  return s;
}

/* ---- emit --------------------------------------------------------------- */

static int run_item(node_t *nd, item_t *it);
static void watermark_order(beam_graph_t *g);

/* Hands an item to a consumer: on its queue, or, for one that runs on
 * this thread, by handling it now (its time kept apart from ours). */
static void deliver(node_t *from, node_t *to, item_t *it, int batch) {
  /* QUIT always goes by the queue: it is what ends the consumer's thread. */
  if (!to->on_upstream || it->kind == IT_QUIT) {
    beam_queue_push_b(&to->q, it, batch);
    return;
  }
  if (it->kind == IT_FRAME) {
    pthread_mutex_lock(&to->q.mu); /* the watermark reads it under this lock */
    to->cur_idx = it->frame->ingest_idx;
    pthread_mutex_unlock(&to->q.mu);
  }
  uint64_t t0 = beam_now_ns();
  run_item(to, it);
  from->nested_ns += beam_now_ns() - t0;
}

typedef struct emit_ctx_s {
  node_t *nd;
  const beam_frame_t *in;
} emit_ctx_t;

/* Wakes the downstream stages for the frames emit_put gave them without
 * waking them (small frames, BATCH_OUT_BYTES): before this worker waits,
 * for its next item or for an output slot (which only they can give
 * back), and when it has nothing more queued. */
/* Whether kick_consumers has anything to wake: ours, or those of a
 * consumer running on this thread. */
static int kick_pending(const node_t *nd) {
  return nd->kick || (nd->inl && nd->inl->on_upstream && kick_pending(nd->inl));
}

static void kick_consumers(node_t *nd) {
  if (nd->inl && nd->inl->on_upstream)
    kick_consumers(nd->inl);
  if (!nd->kick)
    return;
  nd->kick = 0;
  for (unsigned o = 0; o < nd->stage.nouts; o++)
    for (unsigned i = 0; i < nd->outs[o].ncons; i++)
      beam_queue_kick(&nd->outs[o].cons[i]->q);
}

static beam_frame_t *emit_get(void *ctx, unsigned out) {
  emit_ctx_t *ec = ctx;
  node_t *nd = ec->nd;
  if (out >= nd->stage.nouts || !nd->outs[out].pool)
    return NULL;
  beam_frame_t *f = beam_pool_try_get(nd->outs[out].pool);
  if (!f) {
    kick_consumers(nd);
    f = beam_pool_get(nd->outs[out].pool, -1);
  }
  if (!f)
    return NULL;
  const beam_outdesc_t *o = &nd->stage.outs[out];
  if (ec->in) {
    beam_frame_copy_ident(f, ec->in);
    f->flags &= ~(uint32_t)BEAM_FLAG_META;
  } else if (nd->series) {
    f->series_id = nd->series->series_id;
    f->t_recv_ns = beam_now_ns();
    f->ingest_idx = nd->last_idx;
    f->frame_id = nd->last_fid;
  }
  f->dtype = o->dtype;
  f->ndim = o->ndim;
  memcpy(f->shape, o->shape, sizeof f->shape);
  f->nbytes = out_bytes(o);
  return f;
}

static void emit_put(void *ctx, beam_frame_t *f) {
  emit_ctx_t *ec = ctx;
  node_t *nd = ec->nd;
  beam_graph_t *g = nd->g;
  out_t *o = NULL;
  for (unsigned i = 0; i < nd->stage.nouts && !o; i++)
    if (nd->outs[i].pool == f->pool)
      o = &nd->outs[i];
  BEAM_ASSERT(o); /* put of a frame that beam_emit_get did not hand out */
  /* Recompute nbytes from the (possibly reduced) shape the stage set. */
  size_t nb = beam_geom_bytes(f->dtype, f->ndim, f->shape);
  BEAM_ASSERT(nb <= f->cap);
  f->nbytes = nb;
  unsigned consumers = o->ncons + (nd->publish ? 1u : 0u);
  atomic_fetch_add(&nd->results, 1);
  if (consumers == 0) {
    beam_frame_unref(f);
    return;
  }
  if (consumers > 1)
    beam_frame_ref(f, (int)consumers - 1);
  for (unsigned i = 0; i < o->ncons; i++) {
    item_t it = {.kind = IT_FRAME, .frame = f};
    atomic_fetch_add(&g->inflight, 1);
    deliver(nd, o->cons[i], &it, o->batch);
  }
  nd->kick |= o->batch && o->ncons;
  if (nd->publish)
    g->hooks.on_result(g->hooks.ctx, f);
}

static void emit_drop(void *ctx, beam_frame_t *f) {
  (void)ctx;
  beam_frame_unref(f);
}

/* ---- worker ------------------------------------------------------------- */

/* Waits until nd's own thread has handled everything queued to it. */
static void wait_quiet(node_t *nd) {
  while (nd->q.count || nd->busy)
    pthread_cond_wait(&nd->quiet, &nd->q.mu);
}

/* At a series start (on the upstream's thread): whether consumer c runs on
 * this thread for the series. upstream: always; auto: when the frame it
 * reads stays in cache (beam_cache_resident, or the graph's inline_max). */
static void set_on_upstream(node_t *c, int want) {
  if (want == c->on_upstream)
    return;
  pthread_mutex_lock(&c->q.mu);
  if (want)
    wait_quiet(c);
  c->on_upstream = want;
  pthread_mutex_unlock(&c->q.mu);
}

/* Returns 1 when the choice rests on tile fusion alone (the frame would
 * not stay in cache): forward takes it back if c's start then declines. */
static int thread_for(node_t *nd, node_t *c, int out) {
  if (!c->may_inline)
    return 0;
  int want = c->thread_mode == THREAD_UPSTREAM, for_fusion = 0;
  if (c->thread_mode == THREAD_AUTO && nd->series_ok && out >= 0) {
    want = nd->g->inline_max ? out_bytes(&nd->stage.outs[out]) <= nd->g->inline_max
                             : beam_cache_resident(out_bytes(&nd->stage.outs[out]));
    /* Fused, the output is never written whatever its size. */
    if (!want && out == 0 && nd->stage.map && !nd->publish)
      want = for_fusion = 1;
  }
  set_on_upstream(c, want);
  return for_fusion;
}

static void forward(node_t *nd, const item_t *it) {
  for (unsigned c = 0; c < nd->ncons; c++) {
    item_t copy = *it;
    int for_fusion = 0;
    if (it->kind == IT_START) {
      for_fusion = thread_for(nd, nd->cons[c].node, nd->cons[c].resolved);
      beam_series_ref(copy.series);
      int o = nd->cons[c].resolved;
      if (nd->series_ok && o >= 0) {
        const beam_outdesc_t *od = &nd->stage.outs[o];
        copy.in.dtype = od->dtype;
        copy.in.ndim = od->ndim;
        memcpy(copy.in.shape, od->shape, sizeof copy.in.shape);
      } else {
        memset(&copy.in, 0, sizeof copy.in); /* upstream rejected the series */
      }
    }
    atomic_fetch_add(&nd->g->inflight, 1);
    deliver(nd, nd->cons[c].node, &copy, 0);
    /* Its start just ran here: without fusion, its own thread again. */
    if (for_fusion && !nd->cons[c].node->stage.reduce_mapped)
      set_on_upstream(nd->cons[c].node, 0);
  }
}

/* Maps each consumer's output name onto this series' declared outputs. */
static void resolve_consumers(node_t *nd) {
  for (unsigned o = 0; o < BEAM_STAGE_MAX_OUTS; o++)
    nd->outs[o].ncons = 0;
  for (unsigned c = 0; c < nd->ncons; c++) {
    cons_spec_t *cs = &nd->cons[c];
    cs->resolved = -1;
    /* "a+b+c": one consumer of several outputs, which receives their
     * frames in the order this stage emits them (one queue); START carries
     * the geometry of the first. All must exist, or none is fed. */
    int idx[BEAM_STAGE_MAX_OUTS], nidx = 0, bad = 0;
    const char *p = cs->out;
    do {
      const char *e = strchr(p, '+');
      size_t len = e ? (size_t)(e - p) : strlen(p);
      int found = -1;
      for (unsigned o = 0; o < nd->stage.nouts && found < 0; o++)
        if (cs->out[0] ? strlen(nd->stage.outs[o].name) == len && !strncmp(p, nd->stage.outs[o].name, len)
                       : o == 0)
          found = (int)o;
      if (found < 0 || nidx >= BEAM_STAGE_MAX_OUTS)
        bad = 1;
      else
        idx[nidx++] = found;
      p = e ? e + 1 : p + len;
    } while (*p);
    if (bad) {
      char msg[256];
      snprintf(msg, sizeof msg, "stage \"%s\" has no output \"%s\" for this series; \"%s\" skips it",
               nd->stage.name, cs->out[0] ? cs->out : "0", cs->node->stage.name);
      report(nd, nd->series ? nd->series->series_id : 0, 0, msg);
      continue;
    }
    cs->resolved = idx[0];
    for (int k = 0; k < nidx; k++) {
      out_t *out = &nd->outs[idx[k]];
      int dup = 0;
      for (unsigned j = 0; j < out->ncons; j++)
        dup |= out->cons[j] == cs->node;
      if (!dup)
        out->cons[out->ncons++] = cs->node;
    }
  }
}

static void close_out_pools(node_t *nd) {
  for (unsigned o = 0; o < BEAM_STAGE_MAX_OUTS; o++)
    beam_pool_close(&nd->outs[o].pool);
}

static void on_start(node_t *nd, item_t *it) {
  beam_stage_t *st = &nd->stage;
  close_out_pools(nd);
  beam_series_unref(&nd->series);
  nd->series_ok = 0;
  st->nouts = 0;
  memset(st->outs, 0, sizeof st->outs);
  atomic_fetch_add(&nd->nseries, 1);
  if (it->in.dtype == BEAM_DT_NONE) {
    report(nd, it->series->series_id, 0, "series skipped: the upstream stage rejected it");
    return;
  }
  beam_diag_t d = {0};
  int rc = st->ops->start(st, it->series, &it->in, &d);
  if (rc < 0) {
    char msg[1200];
    snprintf(msg, sizeof msg, "series rejected: %s", d.msg[0] ? d.msg : beam_strerror(rc));
    report(nd, it->series->series_id, 0, msg);
    return;
  }
  for (unsigned o = 0; o < st->nouts; o++) {
    const beam_outdesc_t *od = &st->outs[o];
    beam_diag_t pd = {0};
    size_t bytes = out_bytes(od);
    unsigned slots = od->slots ? od->slots
                     : bytes * SMALL_OUT_SLOTS <= SMALL_OUT_BYTES ? SMALL_OUT_SLOTS
                                                                  : DEFAULT_OUT_SLOTS;
    nd->outs[o].pool = beam_pool_new(slots, bytes ? bytes : 1, 0, &pd);
    nd->outs[o].batch = bytes <= BATCH_OUT_BYTES;
    if (!nd->outs[o].pool) {
      report(nd, it->series->series_id, 0, pd.msg);
      close_out_pools(nd);
      return;
    }
    char topic[BEAM_TOPIC_MAX + 2];
    int tn = snprintf(topic, sizeof topic, "%s.%s", st->name, od->name);
    if (tn < 0 || tn > BEAM_TOPIC_MAX || !beam_topic_valid(topic, (size_t)tn)) {
      /* A stage bug, but say so instead of publishing unreadable topics. */
      char msg[256];
      snprintf(msg, sizeof msg, "series rejected: output \"%s\" makes topic \"%s\", which is not "
               "1-%d characters of a-z, 0-9, _, . and -", od->name, topic, BEAM_TOPIC_MAX);
      report(nd, it->series->series_id, 0, msg);
      close_out_pools(nd);
      return;
    }
    char *desc = describe_out(nd, od, it->series->series_id);
    beam_pool_set_label(nd->outs[o].pool, topic, desc);
    free(desc);
  }
  nd->series = beam_series_ref(it->series);
  nd->series_ok = 1;
  nd->last_fid = 0;
  resolve_consumers(nd);
}

/* ---- tile fusion (stage.h map / reduce_mapped) ---------------------------- */

/* nd's consumer that takes frame f by tile fusion, or NULL: it runs on
 * nd's thread this series and is the only reader of nd's output, which is
 * not published (so nothing else needs the output frame). */
static node_t *fused_consumer(const node_t *nd, const beam_frame_t *f) {
  node_t *c = nd->inl;
  if (!c || !c->on_upstream || !nd->stage.map || !c->stage.reduce_mapped || nd->publish ||
      (f->flags & BEAM_FLAG_CORRUPT) || !nd->series_ok || nd->stage.nouts < 1 ||
      nd->outs[0].ncons != 1 || nd->outs[0].cons[0] != c || !c->series_ok ||
      c->series->series_id != f->series_id)
    return NULL;
  for (unsigned o = 1; o < nd->stage.nouts; o++)
    if (nd->outs[o].ncons)
      return NULL;
  return c;
}

typedef struct fuse_ctx_s {
  node_t *nd;
  const beam_frame_t *in;
  uint64_t ns; /* time in nd's map: nd's own, not the consumer's */
  int rc;      /* nd's first error */
} fuse_ctx_t;

static int fuse_produce(void *ctx, size_t off, size_t n, void *out) {
  fuse_ctx_t *fc = ctx;
  uint64_t t0 = beam_now_ns();
  int rc = fc->nd->stage.map(&fc->nd->stage, fc->in, off, n, out);
  fc->ns += beam_now_ns() - t0;
  if (rc < 0 && fc->rc == 0)
    fc->rc = rc;
  return rc;
}

/* In place of nd's process and then c's, as deliver and on_frame would
 * run them: c sees the frame nd would have emitted (identity, geometry)
 * without its pixels, which nd's map makes tile by tile as c asks. Counted
 * as both would have been; returns nd's error, if any (c then emitted
 * nothing). */
static int run_fused(node_t *nd, node_t *c, const beam_frame_t *f) {
  const beam_outdesc_t *od = &nd->stage.outs[0];
  beam_frame_t view;
  memset(&view, 0, sizeof view);
  beam_frame_copy_ident(&view, f);
  view.flags &= ~(uint32_t)BEAM_FLAG_META;
  view.dtype = od->dtype;
  view.ndim = od->ndim;
  memcpy(view.shape, od->shape, sizeof view.shape);
  view.nbytes = out_bytes(od);
  pthread_mutex_lock(&c->q.mu); /* as deliver: the watermark reads it */
  c->cur_idx = f->ingest_idx;
  pthread_mutex_unlock(&c->q.mu);
  fuse_ctx_t fc = {nd, f, 0, 0};
  emit_ctx_t ec = {c, &view};
  beam_emit_t e = {&ec, emit_get, emit_put, emit_drop};
  beam_diag_clear(&c->stage.diag);
  uint64_t t0 = beam_now_ns(), n0 = c->nested_ns;
  int rc = c->stage.reduce_mapped(&c->stage, &view, fuse_produce, &fc, &e);
  uint64_t dt = beam_now_ns() - t0;
  nd->nested_ns += dt - fc.ns;
  c->last_idx = f->ingest_idx;
  c->last_fid = f->frame_id;
  pthread_mutex_lock(&c->q.mu);
  c->cur_idx = UINT64_MAX;
  pthread_mutex_unlock(&c->q.mu);
  if (fc.rc < 0)
    return fc.rc; /* nd rejects the frame: c never saw it */
  atomic_fetch_add(&nd->results, 1);
  atomic_fetch_add(&nd->fused, 1);
  atomic_fetch_add(&c->frames_in, 1);
  uint64_t cdt = dt - fc.ns - (c->nested_ns - n0);
  atomic_fetch_add(&c->busy_ns, cdt);
  beam_hist_add(&c->lat, cdt);
  if (rc < 0) {
    atomic_fetch_add(&c->errors, 1);
    report(c, f->series_id, f->frame_id, c->stage.diag.msg[0] ? c->stage.diag.msg : beam_strerror(rc));
  } else {
    atomic_fetch_add(&c->frames_out, 1);
  }
  return 0;
}

static void on_frame(node_t *nd, beam_frame_t *f) {
  atomic_fetch_add(&nd->frames_in, 1);
  if (!nd->series_ok || f->series_id != nd->series->series_id) {
    atomic_fetch_add(&nd->rejected, 1);
    return;
  }
  emit_ctx_t ec = {nd, f};
  beam_emit_t e = {&ec, emit_get, emit_put, emit_drop};
  beam_diag_clear(&nd->stage.diag);
  uint64_t t0 = beam_now_ns(), n0 = nd->nested_ns;
  const char *why = NULL;
  int rc = 0;
  int enc = nd->stage.process_encoded != NULL;
  if (enc && atomic_load(&f->dec_state) == BEAM_DEC_PENDING)
    rc = nd->stage.process_encoded(&nd->stage, f, &e);
  if (rc == 0 && atomic_load(&f->dec_state) != BEAM_DEC_NONE && beam_frame_decode(f, nd->dec_scratch, &why) < 0) {
    /* Passed on as CORRUPT, as a frame the source could not read: the
     * stage keeps its per-frame accounting (a NaN row, a skipped frame). */
    atomic_fetch_add(&nd->errors, 1);
    char msg[160];
    snprintf(msg, sizeof msg, "undecodable payload (%s); processed as CORRUPT", why ? why : "?");
    report(nd, f->series_id, f->frame_id, msg);
  }
  /* Decoded by another thread (a stage, the decode pool: the loan above
   * can lose that race, or wait on it) with its wire bytes kept
   * (keep_encoded): the stage may still store those as they are. */
  if (rc == 0 && enc && atomic_load(&f->dec_state) == BEAM_DEC_DONE && f->enc_data)
    rc = nd->stage.process_encoded(&nd->stage, f, &e);
  if (rc == 0) {
    node_t *c = fused_consumer(nd, f);
    rc = c ? run_fused(nd, c, f) : nd->stage.ops->process(&nd->stage, f, &e);
  }
  uint64_t dt = beam_now_ns() - t0 - (nd->nested_ns - n0);
  atomic_fetch_add(&nd->busy_ns, dt);
  beam_hist_add(&nd->lat, dt);
  if (rc < 0) {
    atomic_fetch_add(&nd->errors, 1);
    report(nd, f->series_id, f->frame_id,
           nd->stage.diag.msg[0] ? nd->stage.diag.msg : beam_strerror(rc));
  } else {
    atomic_fetch_add(&nd->frames_out, 1);
  }
}

static void on_idle(node_t *nd) {
  emit_ctx_t ec = {nd, NULL};
  beam_emit_t e = {&ec, emit_get, emit_put, emit_drop};
  beam_diag_clear(&nd->stage.diag);
  uint64_t t0 = beam_now_ns(), n0 = nd->nested_ns;
  int rc = nd->stage.idle(&nd->stage, &e);
  atomic_fetch_add(&nd->busy_ns, beam_now_ns() - t0 - (nd->nested_ns - n0));
  nd->idle_more = rc > 0;
  if (rc < 0) {
    atomic_fetch_add(&nd->errors, 1);
    report(nd, nd->series->series_id, 0,
           nd->stage.diag.msg[0] ? nd->stage.diag.msg : beam_strerror(rc));
  }
}

static void series_done(beam_graph_t *g, end_tracker_t *t) {
  if (atomic_fetch_sub(&t->remaining, 1) != 1)
    return;
  if (g->hooks.on_series_done)
    g->hooks.on_series_done(g->hooks.ctx, t->series, t->aborted);
  else
    beam_series_unref(&t->series);
  free(t);
}

static void on_end(node_t *nd, item_t *it) {
  nd->stage.end_aborted = it->tracker->aborted;
  /* Written by the loop thread before it ended the series; the queue that
   * brought this end orders that write before this read. */
  nd->stage.end_missing = nd->series ? nd->series->missing_frames : 0;
  if (nd->series_ok) {
    emit_ctx_t ec = {nd, NULL};
    beam_emit_t e = {&ec, emit_get, emit_put, emit_drop};
    beam_diag_clear(&nd->stage.diag);
    uint64_t t0 = beam_now_ns(), n0 = nd->nested_ns;
    int rc = nd->stage.ops->end(&nd->stage, &e);
    atomic_fetch_add(&nd->busy_ns, beam_now_ns() - t0 - (nd->nested_ns - n0));
    if (rc < 0) {
      atomic_fetch_add(&nd->errors, 1);
      report(nd, nd->series->series_id, 0,
             nd->stage.diag.msg[0] ? nd->stage.diag.msg : beam_strerror(rc));
    }
  }
  nd->series_ok = 0;
  beam_series_unref(&nd->series);
}

/* One item, in order, on whichever thread runs this node; returns 1 for
 * QUIT. */
static int run_item(node_t *nd, item_t *it) {
  beam_graph_t *g = nd->g;
  nd->idle_more = it->kind == IT_FRAME || it->kind == IT_START;
  int quit = it->kind == IT_QUIT;
  switch (it->kind) {
  case IT_START:
    on_start(nd, it);
    forward(nd, it);
    beam_series_unref(&it->series);
    break;
  case IT_FRAME:
    on_frame(nd, it->frame);
    nd->last_idx = it->frame->ingest_idx;
    nd->last_fid = it->frame->frame_id;
    beam_frame_unref(it->frame);
    pthread_mutex_lock(&nd->q.mu);
    nd->cur_idx = UINT64_MAX;
    pthread_mutex_unlock(&nd->q.mu);
    break;
  case IT_END:
    on_end(nd, it);
    forward(nd, it);
    series_done(g, it->tracker);
    break;
  case IT_QUIT:
    forward(nd, it);
    break;
  }
  /* Nothing more queued: what this item produced goes on now. */
  if (!nd->on_upstream && kick_pending(nd) && beam_queue_depth(&nd->q) == 0)
    kick_consumers(nd);
  atomic_fetch_sub(&g->inflight, 1);
  room_maybe(g);
  return quit;
}

static void *worker_main(void *arg) {
  node_t *nd = arg;
  beam_graph_t *g = nd->g;
  /* "st:<stage>" (cut to 15 bytes) in ps, top and perf, so that each
   * stage's CPU time can be told apart (/proc/PID/task/TID/comm). */
  char tname[16] = "st:";
  size_t tl = strnlen(nd->stage.name, sizeof tname - 4);
  memcpy(tname + 3, nd->stage.name, tl);
  tname[3 + tl] = 0;
  pthread_setname_np(pthread_self(), tname);
  for (;;) {
    item_t it;
    int idle = nd->idle_more && nd->series_ok && nd->stage.idle && !nd->stage.interrupt;
    if (!beam_queue_pop(&nd->q, &it, &nd->cur_idx, 0, NULL, NULL)) {
      /* Nothing queued: what this stage emitted goes on now. */
      kick_consumers(nd);
      if (idle) {
        on_idle(nd);
        continue;
      }
      beam_queue_pop(&nd->q, &it, &nd->cur_idx, 1, &nd->busy, &nd->quiet);
    }
    if (run_item(nd, &it))
      break;
  }
  if (atomic_fetch_sub(&g->running, 1) == 1 && g->hooks.on_finished)
    g->hooks.on_finished(g->hooks.ctx);
  return NULL;
}

/* ---- build ---------------------------------------------------------------- */

static int find_node(beam_graph_t *g, const char *name, size_t len) {
  for (size_t i = 0; i < g->n; i++)
    if (strlen(g->nodes[i].stage.name) == len && strncmp(g->nodes[i].stage.name, name, len) == 0)
      return (int)i;
  return -1;
}

static void glog(beam_graph_t *g, int level, const char *fmt, const char *a, const char *b) {
  if (!g->hooks.on_log)
    return;
  char msg[512];
  snprintf(msg, sizeof msg, fmt, a, b);
  g->hooks.on_log(g->hooks.ctx, level, msg);
}

static int pick_backend(beam_graph_t *g, node_t *nd, const beam_stage_spec_t *sp, beam_diag_t *d) {
  char why[256] = "";
  const char *want = sp->backend ? sp->backend : "auto";
  if (strcmp(want, "cpu") == 0) {
    nd->stage.ops = nd->kind->cpu;
  } else if (strcmp(want, "cuda") == 0) {
    if (beam_gpu_count(why, sizeof why) <= 0)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "stage \"%s\": backend cuda requested but no GPU is usable: %s",
                       sp->name, why);
    if (!nd->kind->cuda)
      return BEAM_DIAG(d, BEAM_ENOTSUP, "stage \"%s\": kind %s has no CUDA backend yet (use backend: cpu or auto)",
                       sp->name, nd->kind->kind);
    nd->stage.ops = nd->kind->cuda;
  } else {
    if (nd->kind->cuda && beam_gpu_count(why, sizeof why) > 0) {
      nd->stage.ops = nd->kind->cuda;
    } else {
      nd->stage.ops = nd->kind->cpu;
      glog(g, LOG_NOTICE, "stage \"%s\": backend auto -> cpu (%s)", sp->name,
           why[0] ? why : "no CUDA backend for this kind");
    }
  }
  nd->backend = nd->stage.ops->backend;
  return 0;
}

/* Whether a stage may run on its upstream's thread (see node_t). Its
 * upstream must feed nothing else (that thread then serves one consumer,
 * in order) and it must have no idle work (idle runs on its own thread
 * between items). auto asks for a light CPU stage after a CPU stage: a
 * CUDA stage's thread mostly waits for its device and should not wait
 * for another's. */
static int thread_setup(beam_graph_t *g, node_t *nd, const char *m, beam_diag_t *d) {
  nd->thread_mode = !m || !strcmp(m, "auto") ? THREAD_AUTO : !strcmp(m, "own") ? THREAD_OWN
                                                                             : THREAD_UPSTREAM;
  if (pthread_cond_init(&nd->quiet, NULL) != 0)
    return BEAM_DIAG(d, BEAM_ENOMEM, "graph: out of memory");
  nd->quiet_init = 1;
  nd->busy = 1;
  if (nd->thread_mode == THREAD_OWN)
    return 0;
  node_t *up = nd->upstream >= 0 ? &g->nodes[nd->upstream] : NULL;
  const char *why = !up ? "it reads the input frames, which the loop thread delivers"
                    : up->ncons != 1 ? "its upstream stage feeds other stages too"
                    : nd->stage.idle ? "it has work of its own between frames"
                                     : NULL;
  if (why && nd->thread_mode == THREAD_UPSTREAM)
    return BEAM_DIAG(d, BEAM_ECONFIG, "stage \"%s\": thread: upstream is not possible: %s",
                     nd->stage.name, why);
  if (why)
    return 0;
  if (nd->thread_mode == THREAD_AUTO &&
      (!nd->stage.light || strcmp(nd->backend, "cpu") || strcmp(up->backend, "cpu")))
    return 0;
  nd->may_inline = 1;
  up->inl = nd;
  return 0;
}

int beam_graph_new(beam_graph_t **out, const beam_stage_spec_t *specs, size_t n,
                   const beam_graph_params_t *gp, const beam_graph_hooks_t *hooks,
                   beam_diag_t *d) {
  *out = NULL;
  BEAM_ASSERT(hooks && hooks->on_result);
  beam_graph_t *g = calloc(1, sizeof *g);
  if (!g)
    return BEAM_DIAG(d, BEAM_ENOMEM, "graph: out of memory");
  g->hooks = *hooks;
  g->inline_max = gp->inline_max_bytes;
  g->nodes = calloc(n ? n : 1, sizeof *g->nodes);
  g->wm_order = calloc(n ? n : 1, sizeof *g->wm_order);
  g->wm = calloc(n ? n : 1, sizeof *g->wm);
  g->n = g->nodes ? n : 0; /* destroy walks n nodes */
  int rc = 0;
  if (!g->nodes || !g->wm_order || !g->wm) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "graph: out of memory");
    goto fail;
  }
  for (size_t i = 0; i < n; i++) {
    node_t *nd = &g->nodes[i];
    nd->g = g;
    snprintf(nd->stage.name, sizeof nd->stage.name, "%s", specs[i].name);
    nd->stage.cfg = specs[i].node;
    nd->publish = specs[i].publish;
    nd->upstream = -1;
    nd->cur_idx = UINT64_MAX;
    nd->kind = specs[i].kind_def ? specs[i].kind_def : beam_stage_kind_find(specs[i].kind);
    if (!nd->kind) {
      rc = BEAM_DIAG(d, BEAM_ECONFIG, "stage \"%s\": unknown kind \"%s\"", specs[i].name, specs[i].kind);
      goto fail;
    }
    beam_hist_reset(&nd->lat);
    if ((rc = beam_queue_init(&nd->q, specs[i].queue ? specs[i].queue : 32)) < 0) {
      BEAM_DIAG(d, rc, "graph: out of memory");
      goto fail;
    }
  }
  /* Wire edges: "frames", "stage" (output 0) or "stage.output". */
  for (size_t i = 0; i < n; i++) {
    node_t *nd = &g->nodes[i];
    const char *in = specs[i].input ? specs[i].input : "frames";
    if (strcmp(in, "frames") == 0) {
      if (g->nroots >= MAX_CONSUMERS) {
        rc = BEAM_DIAG(d, BEAM_ECONFIG, "graph: more than %d stages read frames", MAX_CONSUMERS);
        goto fail;
      }
      g->roots[g->nroots++] = nd;
      continue;
    }
    const char *dot = strchr(in, '.');
    int up = find_node(g, in, dot ? (size_t)(dot - in) : strlen(in));
    if (up < 0 || up == (int)i) {
      rc = BEAM_DIAG(d, BEAM_ECONFIG, "stage \"%s\": input \"%s\" is not a stage", nd->stage.name, in);
      goto fail;
    }
    node_t *upn = &g->nodes[up];
    nd->upstream = up;
    if (upn->ncons >= MAX_CONSUMERS) {
      rc = BEAM_DIAG(d, BEAM_ECONFIG, "stage \"%s\": too many consumers", upn->stage.name);
      goto fail;
    }
    cons_spec_t *cs = &upn->cons[upn->ncons++];
    cs->node = nd;
    snprintf(cs->out, sizeof cs->out, "%s", dot ? dot + 1 : "");
  }
  for (size_t i = 0; i < n; i++) {
    node_t *nd = &g->nodes[i];
    if ((rc = pick_backend(g, nd, &specs[i], d)) < 0)
      goto fail;
    beam_diag_t sd = {0};
    rc = nd->stage.ops->init(&nd->stage, &sd);
    nd->inited = 1;
    if (rc < 0) {
      BEAM_DIAG(d, rc, "stage \"%s\" (%s, %s): %s", nd->stage.name, nd->kind->kind, nd->backend,
                sd.msg[0] ? sd.msg : beam_strerror(rc));
      goto fail;
    }
    glog(g, LOG_INFO, "stage \"%s\": backend %s", nd->stage.name, nd->backend);
  }
  for (size_t i = 0; i < n; i++)
    if ((rc = thread_setup(g, &g->nodes[i], specs[i].thread, d)) < 0)
      goto fail;
  watermark_order(g);
  int any_cuda = 0;
  for (size_t i = 0; i < n; i++)
    any_cuda |= g->nodes[i].backend && !strcmp(g->nodes[i].backend, "cuda");
  g->pinned = gp->pinned && (!gp->pin_auto || any_cuda);
  /* Beside stages or a decode pool that decode, such a stage would almost
   * never see a frame still encoded: the decode keeps the wire bytes for it. */
  for (unsigned i = 0; i < g->nroots; i++)
    g->keep_encoded |= g->roots[i]->stage.process_encoded != NULL && (g->nroots > 1 || gp->decode_threads);
  g->input = beam_pool_new(gp->pool_frames, gp->frame_bytes, g->pinned, d);
  if (!g->input) {
    rc = BEAM_ENOMEM;
    goto fail;
  }
  if (gp->prefault)
    beam_pool_prefault(g->input);
  beam_pool_on_release(g->input, input_released, g);
  /* Input frames may arrive still compressed (ingest's lazy decode); the
   * stages that read them decode on their own thread into this. */
  for (unsigned i = 0; i < g->nroots; i++) {
    g->roots[i]->dec_scratch = malloc(gp->frame_bytes ? gp->frame_bytes : 1);
    if (!g->roots[i]->dec_scratch) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "graph: cannot allocate %zu bytes of decode scratch",
                     (size_t)gp->frame_bytes);
      goto fail;
    }
  }
  if (gp->decode_threads && g->nroots &&
      !(g->dpool = beam_decode_pool_new(gp->decode_threads, gp->pool_frames, gp->frame_bytes, d))) {
    rc = d->code ? d->code : BEAM_ENOMEM;
    goto fail;
  }
  if (gp->slot_user_bytes && beam_pool_set_user(g->input, gp->slot_user_bytes) < 0) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "graph: out of memory");
    goto fail;
  }
  for (size_t i = 0; i < n; i++) {
    node_t *nd = &g->nodes[i];
    atomic_fetch_add(&g->running, 1);
    if (pthread_create(&nd->thread, NULL, worker_main, nd) != 0) {
      atomic_fetch_sub(&g->running, 1);
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "stage \"%s\": cannot start a thread", nd->stage.name);
      goto fail;
    }
    nd->started = 1;
  }
  *out = g;
  return 0;
fail:
  beam_graph_destroy(&g);
  return rc < 0 ? rc : BEAM_EINVAL;
}

/* ---- ingest --------------------------------------------------------------- */

int beam_graph_input_pinned(const beam_graph_t *g) { return g->pinned; }
int beam_graph_keeps_encoded(const beam_graph_t *g) { return g->keep_encoded; }
unsigned long long beam_graph_decoded_ahead(beam_graph_t *g) {
  return beam_decode_pool_decoded(g->dpool);
}

int beam_graph_room(beam_graph_t *g) {
  if (g->shutting_down)
    return 0;
  int room = beam_pool_free_count(g->input) > 0;
  for (unsigned i = 0; room && i < g->nroots; i++)
    room = beam_queue_frame_space(&g->roots[i]->q) > 0;
  if (!room) {
    atomic_store(&g->want_room, 1);
    /* Re-check: room may have appeared between the test and the flag. */
    int again = beam_pool_free_count(g->input) > 0;
    for (unsigned i = 0; again && i < g->nroots; i++)
      again = beam_queue_frame_space(&g->roots[i]->q) > 0;
    if (again) {
      atomic_store(&g->want_room, 0);
      room = 1;
    }
  }
  return room;
}

beam_frame_t *beam_graph_input_slot(beam_graph_t *g) { return beam_pool_try_get(g->input); }

static void push_roots(beam_graph_t *g, item_t *it) {
  for (unsigned i = 0; i < g->nroots; i++) {
    item_t copy = *it;
    if (copy.kind == IT_START)
      beam_series_ref(copy.series);
    atomic_fetch_add(&g->inflight, 1);
    beam_queue_push(&g->roots[i]->q, &copy);
  }
}

void beam_graph_series_start(beam_graph_t *g, beam_series_t *s) {
  if (g->open)
    beam_graph_series_end(g, g->open->series_id, 1);
  g->open = s;
  item_t it = {.kind = IT_START, .series = s};
  it.in.dtype = s->dtype;
  it.in.ndim = s->ndim;
  memcpy(it.in.shape, s->shape, sizeof it.in.shape);
  push_roots(g, &it);
}

void beam_graph_frame(beam_graph_t *g, beam_frame_t *f) {
  if (g->nroots == 0) {
    beam_frame_unref(f);
    return;
  }
  if (g->dpool && atomic_load(&f->dec_state) == BEAM_DEC_PENDING) {
    beam_frame_ref(f, 1);
    beam_decode_pool_push(g->dpool, f);
  }
  if (g->nroots > 1)
    beam_frame_ref(f, (int)g->nroots - 1);
  for (unsigned i = 0; i < g->nroots; i++) {
    item_t it = {.kind = IT_FRAME, .frame = f};
    atomic_fetch_add(&g->inflight, 1);
    beam_queue_push_b(&g->roots[i]->q, &it, g->batch);
  }
}

void beam_graph_batch(beam_graph_t *g, int on) {
  if (!g)
    return;
  g->batch = on;
  if (!on)
    for (unsigned i = 0; i < g->nroots; i++)
      beam_queue_kick(&g->roots[i]->q);
}

void beam_graph_series_end(beam_graph_t *g, uint64_t series_id, int aborted) {
  if (!g->open || g->open->series_id != series_id)
    return;
  end_tracker_t *t = calloc(1, sizeof *t);
  BEAM_ASSERT(t); /* a few bytes per series; failing here means the process is lost anyway */
  atomic_init(&t->remaining, (int)g->n);
  t->series = g->open; /* the ingest's reference moves to the tracker */
  t->aborted = aborted;
  g->open = NULL;
  if (g->n == 0) {
    atomic_init(&t->remaining, 1);
    series_done(g, t);
    return;
  }
  item_t it = {.kind = IT_END, .tracker = t};
  push_roots(g, &it);
}

unsigned beam_graph_room_count(beam_graph_t *g) {
  if (g->shutting_down)
    return 0;
  unsigned n = beam_pool_free_count(g->input);
  for (unsigned i = 0; n && i < g->nroots; i++) {
    unsigned space = beam_queue_frame_space(&g->roots[i]->q);
    if (space < n)
      n = space;
  }
  if (n == 0)
    atomic_store(&g->want_room, 1);
  return n;
}

void beam_graph_want_room(beam_graph_t *g, unsigned n) {
  atomic_store(&g->want_room, n > 1 ? (int)n : 1);
}

/* The smallest ingest_idx a node still has to handle: the frame it is
 * processing or the first frame in its queue, else whatever its upstream
 * may still send it. Upstreams are snapshotted before their consumers, so
 * a frame moving downstream between the two reads is never missed. */
static uint64_t node_pending(node_t *nd, uint64_t upstream_w) {
  uint64_t w = upstream_w;
  pthread_mutex_lock(&nd->q.mu);
  if (nd->cur_idx < w)
    w = nd->cur_idx;
  for (unsigned i = 0; i < nd->q.count; i++) {
    const item_t *it = &nd->q.buf[(nd->q.head + i) % nd->q.size];
    if (it->kind == IT_FRAME && it->frame->ingest_idx < w)
      w = it->frame->ingest_idx;
  }
  pthread_mutex_unlock(&nd->q.mu);
  return w;
}

/* Nodes in dependency order, once at build: repeat until every node is
 * placed (the config validator guarantees a DAG, so this ends within n
 * rounds; a node left over would keep the watermark at 0, claiming
 * nothing). */
static void watermark_order(beam_graph_t *g) {
  char *have = g->n ? calloc(g->n, 1) : NULL;
  size_t k = 0;
  for (size_t round = 0; have && round <= g->n && k < g->n; round++)
    for (size_t i = 0; i < g->n; i++) {
      node_t *nd = &g->nodes[i];
      if (have[i] || (nd->upstream >= 0 && !have[nd->upstream]))
        continue;
      g->wm_order[k++] = i;
      have[i] = 1;
    }
  g->wm_n = k;
  free(have);
}

uint64_t beam_graph_watermark(beam_graph_t *g, uint64_t fed_next) {
  if (g->wm_n != g->n)
    return 0; /* no progress claimed: safe */
  uint64_t wmin = fed_next;
  for (size_t k = 0; k < g->wm_n; k++) {
    size_t i = g->wm_order[k];
    node_t *nd = &g->nodes[i];
    g->wm[i] = node_pending(nd, nd->upstream >= 0 ? g->wm[nd->upstream] : fed_next);
    if (g->wm[i] < wmin)
      wmin = g->wm[i];
  }
  return wmin;
}

int beam_graph_idle(beam_graph_t *g) { return !g->open && atomic_load(&g->inflight) == 0; }
int beam_graph_series_open(beam_graph_t *g) { return g->open != NULL; }

/* ---- shutdown --------------------------------------------------------------- */

void beam_graph_shutdown(beam_graph_t *g) {
  if (!g || g->shutting_down)
    return;
  if (g->open)
    beam_graph_series_end(g, g->open->series_id, 1);
  g->shutting_down = 1;
  for (size_t i = 0; i < g->n; i++)
    atomic_store(&g->nodes[i].stage.interrupt, 1);
  if (atomic_load(&g->running) == 0) {
    if (g->hooks.on_finished)
      g->hooks.on_finished(g->hooks.ctx);
    return;
  }
  item_t it = {.kind = IT_QUIT};
  push_roots(g, &it);
}

int beam_graph_finished(beam_graph_t *g) { return g->shutting_down && atomic_load(&g->running) == 0; }

void beam_graph_destroy(beam_graph_t **gp) {
  if (!gp || !*gp)
    return;
  beam_graph_t *g = *gp;
  *gp = NULL;
  beam_decode_pool_free(&g->dpool);
  int any_started = 0;
  for (size_t i = 0; i < g->n; i++)
    any_started |= g->nodes[i].started;
  if (any_started) {
    if (!g->shutting_down)
      beam_graph_shutdown(g);
    for (size_t i = 0; i < g->n; i++)
      if (g->nodes[i].started)
        pthread_join(g->nodes[i].thread, NULL);
  }
  for (size_t i = 0; i < g->n; i++) {
    node_t *nd = &g->nodes[i];
    if (nd->inited && nd->stage.ops && nd->stage.ops->destroy)
      nd->stage.ops->destroy(&nd->stage);
    close_out_pools(nd);
    beam_series_unref(&nd->series);
    /* Items left in a queue (only possible when workers never started). */
    item_t it;
    while (nd->q.buf && beam_queue_pop(&nd->q, &it, NULL, 0, NULL, NULL)) {
      if (it.kind == IT_FRAME)
        beam_frame_unref(it.frame);
      else if (it.kind == IT_START)
        beam_series_unref(&it.series);
      else if (it.kind == IT_END)
        series_done(g, it.tracker);
    }
    beam_queue_free(&nd->q);
    if (nd->quiet_init)
      pthread_cond_destroy(&nd->quiet);
    free(nd->dec_scratch);
  }
  beam_series_unref(&g->open);
  beam_pool_close(&g->input);
  free(g->nodes);
  free(g->wm_order);
  free(g->wm);
  free(g);
}

/* ---- stats ---------------------------------------------------------------- */

size_t beam_graph_nstages(const beam_graph_t *g) { return g->n; }

void beam_graph_stage_stats(const beam_graph_t *g, size_t i, beam_stage_stats_t *s) {
  node_t *nd = &g->nodes[i];
  s->name = nd->stage.name;
  s->kind = nd->kind ? nd->kind->kind : "";
  s->backend = nd->backend ? nd->backend : "";
  s->frames_in = atomic_load(&nd->frames_in);
  s->frames_out = atomic_load(&nd->frames_out);
  s->results = atomic_load(&nd->results);
  s->rejected = atomic_load(&nd->rejected);
  s->errors = atomic_load(&nd->errors);
  s->series = atomic_load(&nd->nseries);
  s->queue_depth = beam_queue_depth(&nd->q);
  s->queue_cap = nd->q.cap;
  s->busy_s = (double)atomic_load(&nd->busy_ns) * 1e-9;
  pthread_mutex_lock(&nd->q.mu); /* written under it by the upstream's thread */
  s->runs_on = nd->on_upstream ? g->nodes[nd->upstream].stage.name : NULL;
  s->fused = atomic_load(&nd->fused);
  pthread_mutex_unlock(&nd->q.mu);
  s->latency = &nd->lat;
  s->ncounters = nd->stage.ncounters;
  for (unsigned k = 0; k < s->ncounters; k++) {
    s->counter_names[k] = nd->stage.counters[k].name;
    s->counters[k] = atomic_load(&nd->stage.counters[k].value);
  }
}

unsigned beam_graph_input_free(beam_graph_t *g) { return beam_pool_free_count(g->input); }
unsigned beam_graph_input_slots(beam_graph_t *g) { return beam_pool_size(g->input); }
