/* Source karabo: trains from a European XFEL Karabo bridge server
 * (protocol 2.2, and 1.0), docs/karabo.md. Pattern req (the bridge's
 * default: REQ `next`, re-sent after input.karabo.timeout), sub or pull.
 *
 * One array of one source (input.karabo.source and path, "image.data")
 * becomes beamd frames: with a pulse axis (pulse_axis first or last), one
 * frame per pulse, frame id = train id x pulses per train + pulse index
 * (pulses per train from the series' first train); pulse_axis none, one
 * frame per train, frame id = train id. flatten merges the frame's leading
 * axes (modules, rows) into one, so a (16, 512, 128) AGIPD pulse is the
 * 2-D (8192, 128) image the stages expect. A series starts with the first
 * train (series id = its train id), again when the frame geometry
 * changes, and ends after series_idle without a train (0: never).
 *
 * req and pull are lossless: a train whose pulses do not all fit in the
 * graph is kept (its message parts) and fed on as room appears, and req
 * asks for the next train only then. sub is live: pulses without room are
 * dropped by the ingest core (counted as dropped_busy).
 *
 * With pulse_axis last (the bridge's "online" layout, (modules, ss, fs,
 * pulses)) a pulse is strided through the whole train, so the train is
 * transposed once, tile by tile, into a pulse-major buffer; copying each
 * pulse out of the message instead would read the train once per pulse.
 * A source pattern (a glob) names one source per module instead: their
 * arrays are stacked in module order into one frame per pulse
 * (proto/karabo_stack.c), modules along the slow axis, and a train missing
 * a module has its pixels filled and its frames flagged bad, or is dropped
 * as missing frames (input.karabo.incomplete).
 * Decoding is proto/karabo.c (pure, borrowed). A message that does not
 * decode is counted with its reason and dropped; the next one goes on. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"
#include "proto/karabo.h"
#include "proto/karabo_stack.h"

#define MAX_PARTS (2 * (BEAM_KB_MAX_SOURCES + BEAM_KB_MAX_ARRAYS))
#define BATCH 16    /* trains per wake-up before yielding to the loop */
#define TICK_MS 20  /* request timeout and series idle checks */

enum { PAT_REQ = 0, PAT_SUB = 1, PAT_PULL = 2 };  /* the pattern enum's order */
enum { AX_LAST = 0, AX_FIRST = 1, AX_NONE = 2 }; /* the pulse_axis enum's order */
enum { INC_FILL = 0, INC_DROP = 1 };               /* the incomplete enum's order */
#define MAX_MODULES BEAM_KB_MAX_SOURCES

const beam_param_t beamd_karabo_params[] = {
    {"pattern", BEAM_P_ENUM, "req", 0, 0, 0, "req|sub|pull", NULL,
     "req: REQ `next` to the bridge's REP (lossless: asks only when there is room); sub: SUB "
     "to its PUB (live); pull: PULL from its PUSH (lossless)", NULL},
    {"source", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "the Karabo source whose array becomes frames, for example "
     "SPB_DET_AGIPD1M-1/CAL/APPEND_CORRECTED; \"\" = the first source that has `path`; a glob "
     "pattern (SPB_DET_AGIPD1M-1/DET/*CH0:xtdf) names one source per module, stacked in module "
     "order into one frame (the module number is read where the first wildcard is)", NULL},
    {"path", BEAM_P_STRING, "image.data", 0, 0, 0, NULL, NULL,
     "the array of that source (its key)", NULL},
    {"pulse_axis", BEAM_P_ENUM, "last", 0, 0, 0, "last|first|none", NULL,
     "where the array's pulse axis is: last (online layout (modules, ss, fs, pulses)), "
     "first ((pulses, ...), as in files), none (one frame per train)", NULL},
    {"flatten", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL,
     "merge a frame's leading axes into one, so frames are 2-D (modules stacked along the "
     "slow axis)", NULL},
    {"timeout", BEAM_P_DURATION, "1s", 0, 0.01, 3600, NULL, NULL,
     "req: how long a `next` waits for its reply before it is sent again", NULL},
    {"series_idle", BEAM_P_DURATION, "10s", 0, 0, 86400, NULL, NULL,
     "the series ends after this long without a train; 0 = never (only a geometry change or "
     "shutdown ends it)", NULL},
    {"modules", BEAM_P_INT, "0", 0, 0, MAX_MODULES, NULL, NULL,
     "a source pattern: the detector's module count, so a train missing a module is seen; 0 = "
     "the highest module number of the first train + 1 - first_module", NULL},
    {"first_module", BEAM_P_INT, "0", 0, 0, 999999, NULL, NULL,
     "a source pattern: the number of the first module (JUNGFRAU's JNGFR01 is 1)", NULL},
    {"incomplete", BEAM_P_ENUM, "fill", 0, 0, 0, "fill|drop", NULL,
     "a train missing modules: fill = its frames have the missing modules' pixels set to "
     "fill_value and are flagged bad; drop = its frames are dropped and counted as missing",
     NULL},
    {"fill_value", BEAM_P_FLOAT, "nan", 0, 1, 0, NULL, NULL, /* min > max: no range */
     "the pixels of a missing module: nan (0 for integer data), or a number", NULL},
    BEAM_PARAM_END};

typedef struct ksrc_s {
  beamd_t *d;
  beamd_zsock_t zs;
  uv_timer_t tick;
  uv_idle_t more;
  int more_on, stopped, pattern, axis, flatten;
  char source[256], path[128];
  /* a source pattern: module sources stacked into one frame */
  int stacking, incomplete;
  unsigned nmod, first_module;
  double fill;
  const beam_kb_array_t *mod[MAX_MODULES]; /* this train's, NULL: missing */
  unsigned missing;                        /* of this train */
  uint64_t timeout_ns, idle_ns;
  /* req */
  int awaiting;
  uint64_t sent_ns;
  /* the message being fed (parts), kept while the graph has no room */
  zmq_msg_t parts[MAX_PARTS];
  beamd_zmsg_owner_t owners[MAX_PARTS];
  size_t nparts;
  int holding, resuming;
  unsigned next_pulse; /* of the held train */
  int transposed;      /* tbuf holds the held train pulse-major */
  uint64_t t_recv;
  beam_kb_msg_t msg; /* large: kept off the stack */
  /* the series */
  int open;
  uint64_t series_id, last_tid, pulses, last_train_ns;
  beam_dtype_t dtype;
  uint32_t ndim, shape[BEAM_MAX_NDIM];
  void *tbuf;
  size_t tcap;
  uint64_t v1_messages, v2_messages, trains, pulses_in, unsupported, size_mismatch, no_source,
      no_train_id, stale, train_gaps, trains_skipped, extra_pulses, requests, retries, series,
      incomplete_trains, modules_missing, module_mismatch, bad_module;
} ksrc_t;

static void warn(ksrc_t *s, const char *what, const char *why) {
  beam_log_rl(&s->d->in.rl, LOG_WARNING, "input: karabo: %s: %s", what, why);
}

/* Every endpoint this file reads, in one place (CURVE settings will join
 * them here). */
static const char *endpoint_of(const beamd_t *d) { return d->cfg->input.endpoint; }

/* ---- the series ------------------------------------------------------------------ */

static void series_end(ksrc_t *s) {
  if (!s->open)
    return;
  s->open = 0;
  beamd_ingest_series_end(s->d, s->series_id, 0);
}

static int series_start(ksrc_t *s, const beam_kb_source_t *src, const beam_kb_array_t *a,
                        uint64_t pulses, beam_dtype_t dt, uint32_t ndim, const uint32_t *shape) {
  series_end(s);
  json_t *o = json_object(), *k = json_object(), *sh = json_array();
  for (unsigned i = 0; i < a->ndim; i++)
    json_array_append_new(sh, json_integer((json_int_t)a->shape[i]));
  static const char *const axes[] = {"last", "first", "none"};
  json_object_set_new(o, "detector", json_string("Karabo bridge"));
  json_object_set_new(k, "protocol", json_string(s->msg.version == 1 ? "1.0" : "2.2"));
  if (s->stacking) { /* the pattern, and the modules' own array shape below */
    json_object_set_new(k, "source", json_string(s->source));
    json_object_set_new(k, "modules", json_integer((json_int_t)s->nmod));
    json_object_set_new(k, "first_module", json_integer((json_int_t)s->first_module));
  } else {
    json_object_set_new(k, "source", json_stringn(src->name.p, src->name.n));
  }
  json_object_set_new(k, "path", json_stringn(a->path.p, a->path.n));
  json_object_set_new(k, "first_train_id", json_integer((json_int_t)src->tid));
  json_object_set_new(k, "pulses_per_train", json_integer((json_int_t)pulses));
  json_object_set_new(k, "pulse_axis", json_string(axes[s->axis]));
  json_object_set_new(k, "array_shape", sh);
  json_object_set_new(o, "karabo", k);
  char *meta = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  beam_series_t *ser = beam_series_new(src->tid, dt, ndim, shape, meta, meta ? strlen(meta) : 0);
  free(meta);
  if (!ser) {
    warn(s, "series start", "out of memory");
    return -1;
  }
  s->open = 1;
  s->series_id = src->tid;
  s->pulses = pulses;
  s->dtype = dt;
  s->ndim = ndim;
  memcpy(s->shape, shape, sizeof s->shape);
  s->series++;
  beamd_ingest_series_start(s->d, ser);
  return 0;
}

/* ---- a train into frames ----------------------------------------------------------- */

/* (m, p) elements of es bytes -> (p, m): one module of one, stacked. */
static void transpose(const uint8_t *in, uint8_t *out, size_t m, size_t p, size_t es) {
  beam_kb_stack_module(out, in, p, m, es, 1, 0, 1);
}

static const beam_kb_source_t *pick(ksrc_t *s, const beam_kb_array_t **arr) {
  const beam_kb_msg_t *m = &s->msg;
  size_t pl = strlen(s->path);
  for (unsigned i = 0; i < m->nsources; i++) {
    const beam_kb_source_t *src = &m->src[i];
    if (s->source[0] && (src->name.n != strlen(s->source) ||
                         memcmp(src->name.p, s->source, src->name.n) != 0))
      continue;
    if ((*arr = beam_kb_array(m, i, s->path, pl)))
      return src;
    if (s->source[0])
      return NULL;
  }
  return NULL;
}

/* The module sources of a pattern into s->mod by module number. The first
 * present module in module order is the reference: its train id and array
 * geometry are the train's, and a module whose differ counts as missing
 * (the bridge's train matcher should never send such a message, but a
 * module restarting with another layout is better seen than stacked).
 * count: this is the message's first pass (resumes count nothing). */
static const beam_kb_source_t *pick_modules(ksrc_t *s, const beam_kb_array_t **arr, int count) {
  const beam_kb_msg_t *m = &s->msg;
  const beam_kb_source_t *msrc[MAX_MODULES] = {0};
  size_t pl = strlen(s->path);
  long hi = -1;
  memset(s->mod, 0, sizeof s->mod);
  for (unsigned i = 0; i < m->nsources; i++) {
    const beam_kb_source_t *src = &m->src[i];
    long num = beam_kb_module_number(s->source, src->name.p, src->name.n);
    const beam_kb_array_t *a = num >= 0 ? beam_kb_array(m, i, s->path, pl) : NULL;
    if (!a)
      continue; /* another source, or a module without the array: missing */
    long slot = num - (long)s->first_module;
    if (slot < 0 || slot >= MAX_MODULES || (s->nmod && slot >= (long)s->nmod) || s->mod[slot]) {
      if (count) {
        s->bad_module++;
        beam_log_rl(&s->d->in.rl, LOG_WARNING, "input: karabo: source %.*s: module number %ld "
                    "is outside input.karabo first_module..modules or repeated: ignored",
                    (int)src->name.n, src->name.p, num);
      }
      continue;
    }
    s->mod[slot] = a;
    msrc[slot] = src;
    if (slot > hi)
      hi = slot;
  }
  if (!s->nmod && hi >= 0)
    s->nmod = (unsigned)hi + 1; /* modules 0: the first train with module sources says */
  const beam_kb_array_t *ref = NULL;
  const beam_kb_source_t *rsrc = NULL;
  unsigned rk = 0;
  s->missing = 0;
  for (unsigned k = 0; k < s->nmod; k++) {
    const beam_kb_array_t *a = s->mod[k];
    if (!a) {
      s->missing++;
      continue;
    }
    if (!ref) {
      ref = a;
      rsrc = msrc[k];
      rk = k;
      continue;
    }
    if (a->dtype != ref->dtype || a->ndim != ref->ndim ||
        memcmp(a->shape, ref->shape, ref->ndim * sizeof ref->shape[0]) != 0 ||
        msrc[k]->has_tid != rsrc->has_tid || msrc[k]->tid != rsrc->tid) {
      if (count) {
        s->module_mismatch++;
        beam_log_rl(&s->d->in.rl, LOG_WARNING, "input: karabo: source %.*s: its train id, "
                    "dtype or shape differs from module %u's: taken as missing",
                    (int)msrc[k]->name.n, msrc[k]->name.p, rk + s->first_module);
      }
      s->mod[k] = NULL;
      s->missing++;
    }
  }
  *arr = ref;
  return rsrc;
}

static int decode(ksrc_t *s, const beam_part_t *bp, size_t n) {
  const char *why = NULL;
  int rc = beam_kb_parse(bp, n, &s->msg, &why);
  if (rc == 0)
    return 0;
  if (rc == BEAM_ENOTSUP)
    s->unsupported++;
  else if (rc == BEAM_ESHAPE)
    s->size_mismatch++;
  else
    atomic_fetch_add(&s->d->in.malformed, 1);
  warn(s, "message dropped", why ? why : "?");
  return rc;
}

/* Feeds the train in parts from s->next_pulse on. Returns 1 when it is
 * done with it (fed or dropped), 0 when the graph ran out of room (the
 * caller keeps the parts and calls again on resume). */
static int feed(ksrc_t *s, const beam_part_t *bp, size_t n) {
  beamd_t *d = s->d;
  int resumed = s->resuming;
  if (decode(s, bp, n) < 0)
    return 1;
  if (!resumed) {
    if (s->msg.version == 1)
      s->v1_messages++;
    else
      s->v2_messages++;
  }
  const beam_kb_array_t *a = NULL;
  const beam_kb_source_t *src = s->stacking ? pick_modules(s, &a, !resumed) : pick(s, &a);
  if (!src) {
    s->no_source++;
    warn(s, "message dropped", "no such source or path in it (input.karabo.source, path)");
    return 1;
  }
  if (!src->has_tid) {
    s->no_train_id++;
    warn(s, "message dropped", "its source has no metadata timestamp.tid");
    return 1;
  }
  uint64_t tid = src->tid;
  /* Geometry of one frame. */
  uint64_t pulses = 1;
  unsigned lo = 0, hi = a->ndim; /* the frame's axes of the array */
  if (s->axis != AX_NONE) {
    if (a->ndim < 2) {
      s->unsupported++;
      warn(s, "message dropped", "a pulse axis needs an array of 2 or more dimensions");
      return 1;
    }
    if (s->axis == AX_LAST)
      pulses = a->shape[--hi];
    else
      pulses = a->shape[lo++];
  }
  uint64_t fshape[BEAM_KB_MAX_NDIM];
  unsigned fnd = hi - lo;
  for (unsigned i = 0; i < fnd; i++)
    fshape[i] = a->shape[lo + i];
  if (s->flatten && fnd > 2) {
    for (unsigned i = 1; i + 1 < fnd; i++)
      fshape[0] *= fshape[i];
    fshape[1] = fshape[fnd - 1];
    fnd = 2;
  }
  /* Modules along the slow axis: flattened, (modules x ss, fs); else a
   * leading module axis. */
  if (s->stacking && s->flatten && fnd >= 2) {
    fshape[0] *= s->nmod;
  } else if (s->stacking && fnd < BEAM_KB_MAX_NDIM) {
    memmove(fshape + 1, fshape, fnd * sizeof fshape[0]);
    fshape[0] = s->nmod;
    fnd++;
  }
  uint32_t shape[BEAM_MAX_NDIM] = {0};
  int fits = fnd >= 1 && fnd <= BEAM_MAX_NDIM && pulses > 0;
  for (unsigned i = 0; fits && i < fnd; i++) {
    fits = fshape[i] > 0 && fshape[i] <= UINT32_MAX;
    shape[i] = (uint32_t)fshape[i];
  }
  if (!fits) {
    s->unsupported++;
    warn(s, "message dropped", "a frame of 1 to 4 non-empty dimensions (each < 2^32) is needed");
    return 1;
  }
  size_t es = beam_dtype_size(a->dtype), mbytes = a->size / pulses;
  size_t fbytes = s->stacking ? mbytes * s->nmod : mbytes;
  uint64_t np; /* pulses fed: at most the series' count */
  if (!resumed) {
    if (s->open && tid <= s->last_tid) {
      s->stale++;
      beam_log_rl(&d->in.rl, LOG_WARNING, "input: karabo: train %llu again or out of order "
                  "(last was %llu): dropped", (unsigned long long)tid,
                  (unsigned long long)s->last_tid);
      return 1;
    }
    int same = s->open && s->dtype == a->dtype && s->ndim == fnd &&
               memcmp(s->shape, shape, sizeof shape) == 0;
    if (!same && series_start(s, src, a, pulses, a->dtype, fnd, shape) < 0)
      return 1;
    if (same && tid > s->last_tid + 1) {
      s->train_gaps++;
      s->trains_skipped += tid - s->last_tid - 1;
    }
    s->last_tid = tid;
    s->last_train_ns = beam_now_ns();
    s->trains++;
    s->transposed = 0;
    if (pulses > s->pulses) {
      s->extra_pulses += pulses - s->pulses;
      beam_log_rl(&d->in.rl, LOG_WARNING, "input: karabo: train %llu has %llu pulses, the "
                  "series %llu: the rest are dropped", (unsigned long long)tid,
                  (unsigned long long)pulses, (unsigned long long)s->pulses);
    }
    np = pulses < s->pulses ? pulses : s->pulses;
    if (s->stacking && s->missing) {
      s->incomplete_trains++;
      s->modules_missing += s->missing;
      beam_log_rl(&d->in.rl, LOG_WARNING, "input: karabo: train %llu misses %u of %u modules: "
                  "%s", (unsigned long long)tid, s->missing, s->nmod,
                  s->incomplete == INC_DROP ? "its frames are dropped (missing)"
                                            : "filled, its frames flagged bad");
      if (s->incomplete == INC_DROP) {
        beamd_ingest_missing(d, np);
        return 1;
      }
    }
  }
  np = pulses < s->pulses ? pulses : s->pulses;
  const uint8_t *base = a->data;
  if (s->stacking && !s->transposed) {
    size_t need = fbytes * pulses;
    if (s->tcap < need) {
      void *nb = realloc(s->tbuf, need);
      if (!nb) {
        warn(s, "train dropped", "out of memory for its stacked copy");
        return 1;
      }
      s->tbuf = nb;
      s->tcap = need;
    }
    for (unsigned k = 0; k < s->nmod; k++)
      if (s->mod[k])
        beam_kb_stack_module(s->tbuf, s->mod[k]->data, pulses, mbytes / es, es, s->nmod, k,
                             s->axis == AX_LAST);
      else
        beam_kb_stack_fill(s->tbuf, pulses, mbytes / es, a->dtype, s->nmod, k, s->fill);
    s->transposed = 1;
  }
  if (s->stacking)
    base = s->tbuf;
  if (!s->stacking && s->axis == AX_LAST && pulses > 1 && !s->transposed) {
    if (s->tcap < a->size) {
      void *nb = realloc(s->tbuf, a->size);
      if (!nb) {
        warn(s, "train dropped", "out of memory for its pulse-major copy");
        return 1;
      }
      s->tbuf = nb;
      s->tcap = a->size;
    }
    transpose(base, s->tbuf, a->size / es / pulses, pulses, es);
    s->transposed = 1;
  }
  if (!s->stacking && s->axis == AX_LAST && pulses > 1)
    base = s->tbuf;
  uint64_t t_acq = src->has_time ? src->sec * 1000000000ull + src->frac_as / 1000000000ull : 0;
  for (; s->next_pulse < np; s->next_pulse++) {
    if (s->pattern != PAT_SUB && !beamd_ingest_room(d)) {
      beamd_ingest_pause(d);
      return 0;
    }
    beam_msg_t m;
    memset(&m, 0, sizeof m);
    beam_hdr_t *h = &m.hdr;
    h->type = BEAM_MSG_FRAME;
    h->series_id = s->series_id;
    h->frame_id = s->axis == AX_NONE ? tid : tid * s->pulses + s->next_pulse;
    h->seq = h->frame_id;
    h->flags = s->stacking && s->missing ? BEAM_FLAG_BAD : 0;
    h->t_acq_ns = t_acq;
    h->dtype = (uint8_t)a->dtype;
    h->ndim = (uint8_t)fnd;
    memcpy(h->shape, shape, sizeof h->shape);
    h->raw_size = h->payload_size = fbytes;
    h->codec = BEAM_CODEC_RAW;
    h->nparts = 1;
    m.npayload = 1;
    m.payload[0].data = base + (size_t)s->next_pulse * fbytes;
    m.payload[0].size = fbytes;
    /* A whole data part can be kept as the frame's buffer; a pulse of
     * many is copied (a part has one owner). */
    m.payload[0].owner =
        pulses == 1 && s->msg.version == 2 && !s->stacking ? bp[a->part].owner : NULL;
    if (beamd_ingest_frame(d, &m, s->t_recv))
      s->pulses_in++;
  }
  s->next_pulse = 0;
  return 1;
}

/* ---- the socket ------------------------------------------------------------------ */

static void close_parts(ksrc_t *s) {
  for (size_t i = 0; i < s->nparts; i++)
    zmq_msg_close(&s->parts[i]);
  s->nparts = 0;
  s->holding = s->resuming = 0;
  s->next_pulse = 0;
}

/* The held (or just received) message through feed; 1 when done with it. */
static int feed_parts(ksrc_t *s) {
  beam_part_t bp[MAX_PARTS];
  for (size_t i = 0; i < s->nparts; i++) {
    beamd_zmsg_owner_init(&s->owners[i], &s->parts[i]);
    bp[i] = (beam_part_t){zmq_msg_data(&s->parts[i]), zmq_msg_size(&s->parts[i]),
                          &s->owners[i].base};
  }
  int done = feed(s, bp, s->nparts);
  if (done)
    close_parts(s);
  else
    s->holding = s->resuming = 1; /* its frames so far are in: go on from next_pulse */
  return done;
}

/* One multipart message into s->parts: its part count, 0 on EAGAIN, -1
 * when it had more parts than any message beamd reads (drained, dropped). */
static int recv_parts(ksrc_t *s) {
  size_t n = 0;
  int more = 1, over = 0;
  while (more) {
    zmq_msg_t *p = &s->parts[n < MAX_PARTS ? n : MAX_PARTS - 1];
    if (n >= MAX_PARTS) {
      over = 1;
      zmq_msg_close(p);
    }
    zmq_msg_init(p);
    if (zmq_msg_recv(p, s->zs.sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
      zmq_msg_close(p);
      return 0; /* only the first part can EAGAIN: delivery is atomic */
    }
    more = zmq_msg_more(p);
    if (n < MAX_PARTS)
      n++;
  }
  s->nparts = n;
  if (over) {
    close_parts(s);
    return -1;
  }
  return (int)n;
}

static void set_more(ksrc_t *s, int on);

static void send_next(ksrc_t *s) {
  if (zmq_send(s->zs.sock, "next", 4, ZMQ_DONTWAIT) == 4) {
    s->awaiting = 1;
    s->sent_ns = beam_now_ns();
    s->requests++;
  }
}

/* Draining, pull reads what ZeroMQ already took from the bridge's PUSH
 * (which counts it as delivered) until EAGAIN, as zread.c does for the
 * other lossless push inputs. */
static int draining(const ksrc_t *s) {
  return s->pattern == PAT_PULL && s->d->state == BEAMD_DRAINING && s->d->in.drain_read;
}

static int may_read(ksrc_t *s) {
  beamd_t *d = s->d;
  return s->zs.open && !s->stopped && !d->in.stopped &&
         (d->state == BEAMD_RUNNING || draining(s));
}

static void burst(ksrc_t *s) {
  beamd_t *d = s->d;
  if (!may_read(s)) {
    set_more(s, 0);
    if (s->zs.open)
      beamd_zsock_events(&s->zs); /* settles ZMQ_FD; the tick reads later */
    return;
  }
  for (int i = 0; i < BATCH; i++) {
    if (s->holding && !feed_parts(s)) {
      set_more(s, 0);
      return; /* resume comes back */
    }
    if (s->pattern != PAT_SUB && !beamd_ingest_room(d)) {
      beamd_ingest_pause(d);
      set_more(s, 0);
      beamd_zsock_events(&s->zs);
      return;
    }
    if (s->pattern == PAT_REQ && !s->awaiting)
      send_next(s);
    int n = recv_parts(s);
    if (n == 0) {
      set_more(s, 0);
      if (draining(s)) { /* everything delivered to us is in the graph */
        beamd_input_drained(d);
        return;
      }
      beamd_zsock_events(&s->zs); /* settles ZMQ_FD (see zread.c) */
      return;
    }
    s->awaiting = 0;
    atomic_fetch_add(&d->in.messages, 1);
    if (n < 0) {
      beamd_ingest_malformed(d, "karabo message", "more parts than beamd reads");
      continue;
    }
    s->t_recv = beam_now_ns();
    s->next_pulse = 0;
    if (!feed_parts(s)) {
      set_more(s, 0);
      return;
    }
    if (s->stopped || d->in.stopped)
      return;
  }
  set_more(s, 1); /* more may wait: ZMQ_FD will not say so again */
}

static void read_all(ksrc_t *s) {
  beam_graph_batch(s->d->graph, 1);
  burst(s);
  beam_graph_batch(s->d->graph, 0);
}

static void more_cb(uv_idle_t *h) { read_all(h->data); }

static void set_more(ksrc_t *s, int on) {
  if (on && !s->more_on)
    uv_idle_start(&s->more, more_cb);
  else if (!on && s->more_on)
    uv_idle_stop(&s->more);
  s->more_on = on;
}

static void on_event(beamd_zsock_t *zs) {
  read_all((ksrc_t *)((char *)zs - offsetof(ksrc_t, zs)));
}

/* The first request, lost replies (REQ_RELAXED lets a `next` go again;
 * REQ_CORRELATE drops a late reply to the old one) and the idle end of a
 * series. */
static void tick_cb(uv_timer_t *t) {
  ksrc_t *s = t->data;
  uint64_t now = beam_now_ns();
  if (s->open && s->idle_ns && !s->holding && now - s->last_train_ns >= s->idle_ns) {
    BEAM_LOG(LOG_INFO, "input: karabo: no train for %.3g s: series %llu ends",
             (double)s->idle_ns * 1e-9, (unsigned long long)s->series_id);
    series_end(s);
  }
  if (!may_read(s) || s->holding || s->more_on)
    return;
  if (s->pattern == PAT_REQ && s->awaiting && now - s->sent_ns >= s->timeout_ns) {
    s->retries++;
    s->awaiting = 0;
  }
  /* Also what came before the daemon ran (ZMQ_FD said so only then). */
  if (s->pattern == PAT_SUB || beamd_ingest_room(s->d))
    read_all(s);
}

/* ---- the source ------------------------------------------------------------------ */

static int ksrc_open(beamd_t *d, void **state, const beam_cnode_t *conf, char *err,
                     size_t errlen) {
  ksrc_t *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "input: out of memory");
    return BEAM_ENOMEM;
  }
  *state = s;
  s->d = d;
  uv_idle_init(&d->loop, &s->more);
  s->more.data = s;
  uv_timer_init(&d->loop, &s->tick);
  s->tick.data = s;
  s->pattern = (int)beam_cfg_int(conf, "pattern", PAT_REQ);
  s->axis = (int)beam_cfg_int(conf, "pulse_axis", AX_LAST);
  s->flatten = beam_cfg_bool(conf, "flatten", 1);
  s->timeout_ns = (uint64_t)(beam_cfg_float(conf, "timeout", 1.0) * 1e9);
  s->idle_ns = (uint64_t)(beam_cfg_float(conf, "series_idle", 10.0) * 1e9);
  const char *src = beam_cfg_str(conf, "source"), *path = beam_cfg_str(conf, "path");
  snprintf(s->source, sizeof s->source, "%s", src ? src : "");
  snprintf(s->path, sizeof s->path, "%s", path ? path : "image.data");
  s->stacking = beam_kb_is_pattern(s->source);
  s->nmod = (unsigned)beam_cfg_int(conf, "modules", 0);
  s->first_module = (unsigned)beam_cfg_int(conf, "first_module", 0);
  s->incomplete = (int)beam_cfg_int(conf, "incomplete", INC_FILL);
  s->fill = beam_cfg_float(conf, "fill_value", NAN);
  static const int types[] = {ZMQ_REQ, ZMQ_SUB, ZMQ_PULL};
  beamd_zopts_t o = {.rcvhwm = d->cfg->input.hwm, .sec = &d->cfg->input.endpoint_sec,
                     .what = "input.endpoint"};
  char zerr[512];
  if (beamd_zsock_open(d, &s->zs, types[s->pattern], endpoint_of(d), d->cfg->input.bind, &o,
                       on_event, zerr, sizeof zerr) < 0) {
    snprintf(err, errlen, "input: %s", zerr);
    return BEAM_EIO;
  }
  if (s->pattern == PAT_REQ) {
    int one = 1;
    zmq_setsockopt(s->zs.sock, ZMQ_REQ_RELAXED, &one, sizeof one);
    zmq_setsockopt(s->zs.sock, ZMQ_REQ_CORRELATE, &one, sizeof one);
  }
  uv_timer_start(&s->tick, tick_cb, TICK_MS, TICK_MS);
  return 0;
}

static void ksrc_resume(beamd_t *d, void *st) {
  (void)d;
  read_all(st);
}

/* pull: the bridge's PUSH counted what ZeroMQ took as delivered, so that
 * (and a held train's rest) goes into the graph first; burst says when it
 * is empty. req and sub owe nothing: a REP server keeps its train for the
 * next request, a PUB never waited. */
static int ksrc_drain(beamd_t *d, void *st) {
  ksrc_t *s = st;
  if (s->pattern != PAT_PULL || !s->zs.open || s->stopped)
    return 0;
  (void)d;
  read_all(s);
  return 1;
}

static void ksrc_stop(beamd_t *d, void *st) {
  (void)d;
  ksrc_t *s = st;
  s->stopped = 1;
  set_more(s, 0);
  uv_timer_stop(&s->tick);
  if (s->zs.open && s->zs.polling) {
    uv_poll_stop(&s->zs.poll);
    s->zs.polling = 0;
  }
}

static void ksrc_close(beamd_t *d, void *st) {
  ksrc_t *s = st;
  if (!s)
    return;
  close_parts(s);
  beamd_zsock_close(&s->zs, 0);
  if (!uv_is_closing((uv_handle_t *)&s->more))
    uv_close((uv_handle_t *)&s->more, NULL);
  if (!uv_is_closing((uv_handle_t *)&s->tick))
    uv_close((uv_handle_t *)&s->tick, NULL);
  free(s->tbuf);
  s->tbuf = NULL;
  d->src_garbage = s; /* freed once the loop closed its handles */
}

static void ksrc_stats(beamd_t *d, void *st, json_t *obj) {
  (void)d;
  ksrc_t *s = st;
  json_t *o = json_object();
#define C(name) json_object_set_new(o, #name, json_integer((json_int_t)s->name))
  C(v1_messages);
  C(v2_messages);
  C(trains);
  C(pulses_in);
  C(unsupported);
  C(size_mismatch);
  C(no_source);
  C(no_train_id);
  C(stale);
  C(train_gaps);
  C(trains_skipped);
  C(extra_pulses);
  C(requests);
  C(retries);
  C(series);
  if (s->stacking) {
    C(incomplete_trains);
    C(modules_missing);
    C(module_mismatch);
    C(bad_module);
    json_object_set_new(o, "modules", json_integer((json_int_t)s->nmod));
  }
#undef C
  json_object_set_new(o, "series_open", json_boolean(s->open));
  if (s->open) {
    json_object_set_new(o, "series_id", json_integer((json_int_t)s->series_id));
    json_object_set_new(o, "last_train_id", json_integer((json_int_t)s->last_tid));
    json_object_set_new(o, "pulses_per_train", json_integer((json_int_t)s->pulses));
  }
  json_object_set_new(obj, "karabo", o);
}

const beamd_source_ops_t beamd_src_karabo = {
    .mode = "karabo",
    .lossless = 1,
    .params = beamd_karabo_params,
    .open = ksrc_open,
    .resume = ksrc_resume,
    .drain = ksrc_drain,
    .stop = ksrc_stop,
    .close = ksrc_close,
    .stats = ksrc_stats,
};
