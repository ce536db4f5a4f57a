/* beamd-replay REP server: one request in, exactly one reply out
 * (proto/PROTOCOL.md section 13).
 *
 * A "get" reply is built in full before anything is sent, because its
 * status part states how many frames follow: the frames are read into a
 * reference-counted arena and every header and payload part is then handed
 * to ZeroMQ zero-copy, the arena staying alive until ZeroMQ has released
 * the last part. The arena is sized from credit x frame size, capped by
 * max_bytes, so memory stays bounded; it is reused from reply to reply and
 * only replaced when a request needs more room or a peer still holds parts.
 * The rate limit (--rate) is a token bucket: a reply is delayed until at
 * least one frame (or 5 ms worth) is due and carries no more than are due.
 *
 * A consumer on this host may ask to read payloads in place (section 13.8):
 * a frame whose stored chunk can be forwarded is then not read at all; the
 * reply names the file (our descriptor, /proc/PID/fd/N) and the offset, and
 * the payload part stays empty. Only the framing of compressed chunks is
 * read, from our own mapping, so a bad chunk is still reported as CORRUPT.
 */
#include "tools/beamd-replay/replay.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define ALIGN 64u
#define HDR_SLOT 128u            /* BEAM_HDR_SIZE_V1, a multiple of ALIGN */
#define ARENA_WAIT_NS 200000000ull /* for ZeroMQ to release the last reply */
#define RATE_BATCH_S 0.005       /* wait for this much of the rate per reply */
#define RATE_BURST_S 0.1         /* most credit saved while nobody asks */
#define MAP_FILES_MAX 32         /* files one reply may name (the consumer's limit) */

typedef struct rp_rec_s {
  uint8_t *hdr;      /* in the arena */
  uint8_t *payload;  /* in the arena; NULL when none */
  size_t plen;
  uint8_t *meta;     /* in the arena, or meta_owned */
  size_t mlen;
  char *meta_owned;  /* malloc'd JSON (SERIES_START), freed after sending */
  int payload_copy;  /* the payload is the server's (the mask), sent as a copy */
  int in_shm;        /* the payload is in the consumer's landing slot */
  int in_place;      /* the payload is left in the file (section 13.8) */
} rp_rec_t;

static size_t align_up(size_t n) {
  return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

/* ---- arena ------------------------------------------------------------------ */

static void arena_release(rp_arena_t *a) {
  if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
    free(a->data);
    free(a);
  }
}

/* ZeroMQ's free callback, called from its I/O thread. */
static void arena_free_cb(void *data, void *hint) {
  (void)data;
  arena_release(hint);
}

static int arena_prepare(rp_server_t *self, size_t need) {
  rp_arena_t *a = self->arena;
  size_t cap = align_up(need);
  if (a) {
    /* ZeroMQ closes the last part of a reply just after writing it, which
     * can trail the peer's next request by a moment. */
    uint64_t until = beam_now_ns() + ARENA_WAIT_NS;
    while (atomic_load(&a->refs) > 1 && beam_now_ns() < until) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
    if (atomic_load(&a->refs) == 1 && a->cap >= need) {
      a->used = 0;
      return 0;
    }
    if (a->cap > cap)
      cap = a->cap;
    arena_release(a); /* the last part still out frees it */
    self->arena = NULL;
  }
  a = malloc(sizeof *a);
  if (!a)
    return -1;
  a->data = aligned_alloc(ALIGN, cap);
  if (!a->data) {
    free(a);
    return -1;
  }
  atomic_init(&a->refs, 1);
  a->cap = cap;
  a->used = 0;
  self->arena = a;
  self->st.arena_allocs++;
  return 0;
}

static uint8_t *arena_take(rp_arena_t *a, size_t n) {
  size_t n2 = align_up(n);
  if (a->cap - a->used < n2)
    return NULL;
  uint8_t *p = a->data + a->used;
  a->used += n2;
  return p;
}

/* ---- init ------------------------------------------------------------------- */

int rp_server_init(rp_server_t *self, void *sock, rp_src_t *src, const rp_opts_t *o,
                   beam_diag_t *d) {
  memset(self, 0, sizeof *self);
  self->sock = sock;
  self->src = src;
  self->o = o;
  uint64_t last = o->have_last ? o->last : src->nframes - 1;
  if (o->first >= src->nframes)
    return BEAM_DIAG(d, BEAM_EINVAL, "--first %llu: the file has %llu frames (0..%llu)",
                     (unsigned long long)o->first, (unsigned long long)src->nframes,
                     (unsigned long long)(src->nframes - 1));
  if (last >= src->nframes)
    return BEAM_DIAG(d, BEAM_EINVAL, "--last %llu: the file has %llu frames (0..%llu)",
                     (unsigned long long)last, (unsigned long long)src->nframes,
                     (unsigned long long)(src->nframes - 1));
  if (last < o->first)
    return BEAM_DIAG(d, BEAM_EINVAL, "--last %llu is before --first %llu",
                     (unsigned long long)last, (unsigned long long)o->first);
  self->T = (last - o->first) / o->stride + 1;
  self->meta = rp_meta_build(src);
  self->recs = calloc(RP_CREDIT_MAX + 2, sizeof *self->recs);
  self->slots = calloc(RP_CREDIT_MAX, sizeof *self->slots);
  self->gs = calloc(RP_CREDIT_MAX, sizeof *self->gs);
  self->locs = calloc(RP_CREDIT_MAX, sizeof *self->locs);
  self->loc_ok = calloc(RP_CREDIT_MAX, 1);
  self->shm.fd = -1;
  if (!self->meta || !self->recs || !self->slots || !self->gs || !self->locs || !self->loc_ok)
    return BEAM_DIAG(d, BEAM_ENOMEM, "server tables");
  self->mask = rp_mask_load(src, self->meta);
  int mrc = rp_meta_lists(self->meta, src, o->meta_list, o->n_meta_list, d);
  if (mrc < 0)
    return mrc;
  if ((mrc = rp_bad_frames(src, o->bad_frames, o->bad_dataset, &self->bad, &self->nbad, d)) < 0)
    return mrc;
  json_object_set_new(self->meta, "nframes", json_integer((json_int_t)self->T));
  /* JSON carries UTF-8 only: a path that is not would fail every reply. */
  json_t *probe = json_string(src->path);
  if (!probe)
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: the path is not valid UTF-8, which the "
                     "JSON replies cannot carry", src->path);
  json_decref(probe);
  self->tokens = 1.0;
  self->tokens_ns = 0;
  self->st.t_start_ns = beam_now_ns();
  return 0;
}

void rp_server_destroy(rp_server_t *self) {
  if (!self)
    return;
  arena_release(self->arena);
  self->arena = NULL;
  json_decref(self->meta);
  self->meta = NULL;
  free(self->mask);
  self->mask = NULL;
  free(self->recs);
  self->recs = NULL;
  free(self->bad);
  self->bad = NULL;
  free(self->slots);
  self->slots = NULL;
  free(self->gs);
  free(self->locs);
  free(self->loc_ok);
  self->gs = NULL;
  self->locs = NULL;
  self->loc_ok = NULL;
  rp_shm_detach(&self->shm);
}

uint64_t rp_server_frame_index(const rp_server_t *self, uint64_t k) {
  return self->o->first + (k % self->T) * self->o->stride;
}

/* ---- sending ------------------------------------------------------------------ */

static int send_part(rp_server_t *self, zmq_msg_t *m, int more, volatile sig_atomic_t *stop) {
  /* A part interrupted by a signal is retried: giving up half-way would
   * leave the REP socket unable to ever answer again. */
  for (;;) {
    if (zmq_msg_send(m, self->sock, more ? ZMQ_SNDMORE : 0) >= 0)
      return 0;
    if (errno != EINTR || *stop)
      break;
  }
  int e = errno;
  zmq_msg_close(m);
  errno = e;
  return -1;
}

static int send_zc(rp_server_t *self, const void *p, size_t n, int more,
                   volatile sig_atomic_t *stop) {
  zmq_msg_t m;
  rp_arena_t *a = self->arena;
  atomic_fetch_add(&a->refs, 1);
  if (zmq_msg_init_data(&m, (void *)p, n, arena_free_cb, a) < 0) {
    arena_release(a);
    return -1;
  }
  self->st.bytes += n;
  return send_part(self, &m, more, stop);
}

static int send_copy(rp_server_t *self, const void *p, size_t n, int more,
                     volatile sig_atomic_t *stop) {
  zmq_msg_t m;
  if (zmq_msg_init_size(&m, n) < 0)
    return -1;
  if (n)
    memcpy(zmq_msg_data(&m), p, n);
  self->st.bytes += n;
  return send_part(self, &m, more, stop);
}

/* Sends a reply's status object: every reply has one, and it carries the
 * request's id when the request had one (section 13.7). */
static int send_json(rp_server_t *self, json_t *j, int more, volatile sig_atomic_t *stop,
                     beam_diag_t *d) {
  if (j && self->req_id >= 0)
    json_object_set_new(j, "id", json_integer(self->req_id));
  char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
  json_decref(j);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "reply JSON"), -1;
  int rc = send_copy(self, s, strlen(s), more, stop);
  free(s);
  if (rc < 0 && errno != EINTR)
    BEAM_DIAG(d, BEAM_EIO, "sending reply: %s", zmq_strerror(errno));
  return rc;
}

static int send_error(rp_server_t *self, const char *why, volatile sig_atomic_t *stop,
                      beam_diag_t *d) {
  self->st.bad_requests++;
  return send_json(self, json_pack("{s:b, s:s}", "ok", 0, "error", why), 0, stop, d);
}

/* ---- building ------------------------------------------------------------------- */

static void hdr_common(rp_server_t *self, beam_hdr_t *h, unsigned type, uint64_t series,
                       uint64_t frame_id) {
  const rp_src_t *s = self->src;
  memset(h, 0, sizeof *h);
  h->type = (uint16_t)type;
  h->series_id = series;
  h->frame_id = frame_id;
  h->seq = self->seq++;
  h->t_send_ns = beam_realtime_ns(); /* t_acq_ns stays 0: unknown for a file */
  h->dtype = (uint8_t)s->dtype;
  h->ndim = 2;
  h->shape[0] = s->h;
  h->shape[1] = s->w;
  h->raw_size = s->raw_size;
}

/* JSON string body: escapes what JSON requires, so a path with quotes
 * or control characters still makes a valid {"error": ...}. */
static size_t json_escape(char *out, size_t cap, const char *in) {
  size_t o = 0;
  for (; *in && o + 7 < cap; in++) {
    unsigned char c = (unsigned char)*in;
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
    } else if (c < 0x20) {
      o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
    } else {
      out[o++] = (char)c;
    }
  }
  out[o] = '\0';
  return o;
}

static int add_control(rp_server_t *self, rp_rec_t *r, unsigned type, uint64_t series,
                       uint64_t pass, beam_diag_t *d) {
  beam_hdr_t h;
  memset(r, 0, sizeof *r);
  hdr_common(self, &h, type, series, type == BEAM_MSG_SERIES_END ? self->T : 0);
  if (type == BEAM_MSG_SERIES_START) {
    json_t *rep = json_pack("{s:I, s:I, s:I, s:I, s:b}", "first", (json_int_t)self->o->first,
                            "last", (json_int_t)rp_server_frame_index(self, self->T - 1),
                            "stride", (json_int_t)self->o->stride, "pass", (json_int_t)pass,
                            "loop", self->o->loop);
    json_object_set_new(self->meta, "replay", rep);
    r->meta_owned = json_dumps(self->meta, JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (!r->meta_owned)
      return BEAM_DIAG(d, BEAM_ENOMEM, "series metadata");
    r->meta = (uint8_t *)r->meta_owned;
    r->mlen = strlen(r->meta_owned);
    h.flags |= BEAM_FLAG_META;
    h.meta_size = (uint32_t)r->mlen;
    if (self->mask) {
      /* Once per pass, so a copy costs nothing next to the frames. */
      h.nparts = 1;
      h.payload_size = self->src->raw_size;
      r->payload = self->mask;
      r->plen = self->src->raw_size;
      r->payload_copy = 1;
    }
    self->st.series_started++;
  } else {
    self->st.series_ended++;
  }
  r->hdr = arena_take(self->arena, HDR_SLOT);
  BEAM_ASSERT(r->hdr); /* reserved by the sizing in serve_get */
  int n = beam_hdr_encode(&h, r->hdr, HDR_SLOT);
  BEAM_ASSERT(n == (int)BEAM_HDR_SIZE_V1);
  return 0;
}

/* Reads frame k (sequence index) into record r: into `land` (a landing
 * slot of `room` bytes) when given, else into the arena. Returns 1 when the
 * frame was corrupt. */
static void frame_hdr(rp_server_t *self, beam_hdr_t *h, uint64_t series, uint64_t g) {
  const rp_src_t *s = self->src;
  hdr_common(self, h, BEAM_MSG_FRAME, series, g);
  if (self->bad && self->bad[g]) {
    h->flags |= BEAM_FLAG_BAD;
    self->st.bad++;
  }
  if (s->pos) {
    const double *p = &s->pos[g * 3];
    if (isfinite(p[0]) && isfinite(p[1]) && isfinite(p[2])) {
      h->flags |= BEAM_FLAG_POS;
      memcpy(h->pos, p, sizeof h->pos);
    }
  }
}

/* Frame g, located in its file, as a header with an empty payload part. */
static void add_in_place(rp_server_t *self, rp_rec_t *r, uint64_t g, uint64_t series,
                         const rp_loc_t *loc) {
  beam_hdr_t h;
  memset(r, 0, sizeof *r);
  r->hdr = arena_take(self->arena, HDR_SLOT);
  BEAM_ASSERT(r->hdr);
  frame_hdr(self, &h, series, g);
  h.codec = (uint8_t)loc->codec;
  h.nparts = 1;
  h.payload_size = loc->len;
  r->in_place = 1;
  int n = beam_hdr_encode(&h, r->hdr, HDR_SLOT);
  BEAM_ASSERT(n == (int)BEAM_HDR_SIZE_V1);
}

static int add_frame(rp_server_t *self, rp_rec_t *r, uint64_t k, uint64_t series, size_t room,
                     uint8_t *land) {
  rp_src_t *s = self->src;
  uint64_t g = rp_server_frame_index(self, k);
  beam_hdr_t h;
  memset(r, 0, sizeof *r);
  r->hdr = arena_take(self->arena, HDR_SLOT);
  uint8_t *buf = land ? land : arena_take(self->arena, room);
  BEAM_ASSERT(r->hdr && buf);
  frame_hdr(self, &h, series, g);
  beam_codec_t codec;
  size_t len;
  char why[RP_REASON_MAX - 16];
  int corrupt = rp_src_read(s, g, buf, room, &codec, &len, why, sizeof why) < 0;
  if (corrupt) {
    /* The metadata {"error": "..."} goes where the payload would have,
     * or in the arena when that is the consumer's memory. */
    char *e = land ? (char *)arena_take(self->arena, RP_REASON_MAX) : (char *)buf;
    BEAM_ASSERT(e); /* reserved by the sizing in serve_get */
    int n = snprintf(e, RP_REASON_MAX, "{\"error\":\"");
    n += (int)json_escape(e + n, RP_REASON_MAX - (size_t)n - 3, why);
    n += snprintf(e + n, RP_REASON_MAX - (size_t)n, "\"}");
    r->meta = (uint8_t *)e;
    r->mlen = (size_t)n;
    h.flags |= BEAM_FLAG_CORRUPT | BEAM_FLAG_META;
    h.meta_size = (uint32_t)n;
  } else {
    r->payload = buf;
    r->plen = len;
    r->in_shm = land != NULL;
    h.codec = (uint8_t)codec;
    h.nparts = 1;
    h.payload_size = len;
  }
  /* The arena keeps only what was used, so small chunks pack tightly. */
  if (!land)
    self->arena->used = (size_t)(buf - self->arena->data) +
                        align_up(corrupt ? r->mlen : r->plen);
  int n = beam_hdr_encode(&h, r->hdr, HDR_SLOT);
  BEAM_ASSERT(n == (int)BEAM_HDR_SIZE_V1);
  return corrupt;
}

/* Frames the rate allows now, after waiting for at least one batch. */
static uint64_t rate_allow(rp_server_t *self, uint64_t want, volatile sig_atomic_t *stop) {
  double rate = self->o->rate;
  if (rate <= 0)
    return want;
  double burst = fmax(1.0, rate * RATE_BURST_S);
  double batch = fmin((double)want, fmax(1.0, floor(rate * RATE_BATCH_S)));
  for (;;) {
    uint64_t now = beam_now_ns();
    if (self->tokens_ns)
      self->tokens += (double)(now - self->tokens_ns) * 1e-9 * rate;
    self->tokens_ns = now;
    if (self->tokens > burst)
      self->tokens = burst;
    if (self->tokens >= batch || *stop)
      break;
    double wait = (batch - self->tokens) / rate;
    struct timespec ts = {(time_t)wait, (long)((wait - floor(wait)) * 1e9)};
    nanosleep(&ts, NULL); /* EINTR: the loop re-checks stop */
  }
  uint64_t n = (uint64_t)floor(self->tokens);
  if (n < 1)
    n = 1;
  return n < want ? n : want;
}

static json_t *status(rp_server_t *self, uint64_t next, uint64_t count, uint64_t series,
                      int eof, uint64_t corrupt) {
  return json_pack("{s:b, s:I, s:I, s:I, s:b, s:b, s:I, s:s, s:s, s:I, s:I}", "ok", 1,
                   "next", (json_int_t)next, "count", (json_int_t)count, "total",
                   (json_int_t)self->T, "loop", self->o->loop, "eof", eof, "series_id",
                   (json_int_t)series, "file", self->src->path, "file_id", self->src->file_id,
                   "corrupt", (json_int_t)corrupt, "corrupt_total",
                   (json_int_t)self->st.corrupt);
}

static int serve_info(rp_server_t *self, volatile sig_atomic_t *stop, beam_diag_t *d) {
  const rp_src_t *s = self->src;
  self->st.info_requests++;
  json_t *j = status(self, self->last_next, 0, self->o->series_id, 0, 0);
  json_t *parts = json_array();
  for (size_t i = 0; i < s->nparts; i++)
    json_array_append_new(parts, json_pack("{s:s, s:s, s:I, s:s}", "file", s->parts[i].file,
                                           "dataset", s->parts[i].dataset, "frames",
                                           (json_int_t)s->parts[i].nframes, "read",
                                           s->parts[i].plan));
  json_t *more = json_pack("{s:s, s:s, s:[ii], s:I, s:I, s:I, s:I, s:f, s:o}",
      "op", "info", "dtype", beam_dtype_name(s->dtype), "shape", (int)s->h, (int)s->w,
      "frames_in_file", (json_int_t)s->nframes, "first", (json_int_t)self->o->first,
      "stride", (json_int_t)self->o->stride, "frames_served", (json_int_t)self->st.frames,
      "rate", self->o->rate, "parts", parts);
  json_object_update_missing(j, more);
  json_decref(more);
  json_object_set_new(j, "dataset", json_string(s->dataset));
  return send_json(self, j, 0, stop, d);
}


/* Whether this reply can put payloads in the consumer's landing area:
 * returns its base, or NULL with why (sent back as shm_error). */
static uint8_t *shm_for(rp_server_t *self, const rp_req_t *q, char *why, size_t wl) {
  if (self->o->no_shm) {
    snprintf(why, wl, "the server was started with --no-shm");
    return NULL;
  }
  if (q->shm_slot_bytes < self->src->slot_size) {
    snprintf(why, wl, "frames of this file take up to %zu bytes; landing slots hold %llu",
             self->src->slot_size, (unsigned long long)q->shm_slot_bytes);
    return NULL;
  }
  return rp_shm_attach(&self->shm, q->shm_path, q->shm_size, why, wl);
}

/* Whether this reply may leave payloads in the file: NULL, or why not
 * (sent back as map_error). */
static const char *map_refusal(const rp_server_t *self) {
  const rp_src_t *s = self->src;
  if (self->o->no_map)
    return "the server was started with --no-map";
  if (!s->locatable)
    return "the file could not be opened through the chunk-locating driver";
  for (size_t i = 0; i < s->nparts; i++)
    if (s->parts[i].forward)
      return NULL;
  return "the server decodes every frame of this file (its chunks are not stored in a codec "
         "the protocol carries)";
}

/* The reply's index of the file at fd in `files`, appending it; -1 when a
 * reply already names as many files as a consumer takes. */
static int map_file(json_t *files, int *fds, int *nfd, const rp_loc_t *loc) {
  for (int i = 0; i < *nfd; i++)
    if (fds[i] == loc->fd)
      return i;
  if (*nfd == MAP_FILES_MAX)
    return -1;
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/fd/%d", (long)getpid(), loc->fd);
  json_array_append_new(files, json_pack("{s:s, s:s}", "path", path, "name", loc->file));
  fds[*nfd] = loc->fd;
  return (*nfd)++;
}

static int serve_get(rp_server_t *self, const rp_req_t *q, volatile sig_atomic_t *stop,
                     beam_diag_t *d) {
  const rp_opts_t *o = self->o;
  uint64_t T = self->T, k = q->next;
  char why[160];
  if (!o->loop && k > T) {
    snprintf(why, sizeof why, "next %llu is past the end (%llu frames)",
             (unsigned long long)k, (unsigned long long)T);
    return send_error(self, why, stop, d);
  }
  uint64_t pass = k / T, idx = k % T;
  uint64_t series = o->series_id + pass;
  if (!o->loop && k == T) {
    self->last_next = k;
    return send_json(self, status(self, T, 0, o->series_id, 1, 0), 0, stop, d);
  }
  char shm_why[256] = "";
  uint8_t *land = q->shm_path ? shm_for(self, q, shm_why, sizeof shm_why) : NULL;
  if (q->shm_path && !land)
    self->st.shm_refused++;
  const char *map_why = q->map ? map_refusal(self) : NULL;
  json_t *map_files = NULL, *map_at = NULL;
  int map_fds[MAP_FILES_MAX], map_nfd = 0;
  if (q->map && !map_why) {
    map_files = json_array();
    map_at = json_array();
  }
  self->st.map_refused += (uint64_t)(map_why != NULL);
  uint64_t want = T - idx < q->credit ? T - idx : q->credit;
  if (land && want > q->nslots)
    want = q->nslots;
  want = rate_allow(self, want, stop);
  uint64_t maxb = q->max_bytes && q->max_bytes < o->max_bytes ? q->max_bytes : o->max_bytes;
  const rp_src_t *s = self->src;
  size_t room = s->slot_size > RP_REASON_MAX ? s->slot_size : RP_REASON_MAX;
  /* With a landing area the arena holds headers and error texts only, and
   * max_bytes (a bound on the reply's size) does not count landed payloads. */
  size_t per = HDR_SLOT + align_up(land ? RP_REASON_MAX : room);
  /* Room for `want` frames, but never much more than max_bytes of
   * payload: a reply holds at most max_bytes plus one frame. */
  double need = 3.0 * HDR_SLOT + (double)want * per;
  double capb = 3.0 * HDR_SLOT + (double)maxb + (double)per + (double)want * (HDR_SLOT + ALIGN);
  if (need > capb)
    need = capb;
  if (arena_prepare(self, (size_t)need) < 0) {
    snprintf(why, sizeof why, "out of memory for a reply of %.0f bytes (lower credit or "
             "max_bytes)", need);
    return send_error(self, why, stop, d);
  }
  rp_rec_t *recs = self->recs;
  size_t nrec = 0;
  int rc = 0;
  if (idx == 0 || q->start)
    rc = add_control(self, &recs[nrec++], BEAM_MSG_SERIES_START, series, pass, d);
  if (map_at) {
    /* Located together: their framing checks overlap (chunk.c). */
    for (uint64_t i = 0; i < want; i++)
      self->gs[i] = rp_server_frame_index(self, k + i);
    rp_src_locate_many(self->src, self->gs, (size_t)want, self->locs, self->loc_ok);
  }
  /* The SERIES_END header is reserved now so frames cannot take its place. */
  uint8_t *end_hdr = arena_take(self->arena, HDR_SLOT);
  uint64_t n = 0, payload = 0, corrupt = 0;
  while (rc == 0 && n < want) {
    rp_arena_t *a = self->arena;
    if (a->cap - a->used < per)
      break;
    uint64_t g = rp_server_frame_index(self, k + n);
    if (!land && n > 0 && payload + rp_src_frame_bytes(self->src, g) > maxb)
      break;
    int fi = -1;
    const rp_loc_t *loc = &self->locs[n];
    if (map_at && self->loc_ok[n] && (fi = map_file(map_files, map_fds, &map_nfd, loc)) >= 0) {
      add_in_place(self, &recs[nrec++], g, series, loc);
      json_array_append_new(map_at, json_pack("[iI]", fi, (json_int_t)loc->off));
      self->st.map_frames++;
      self->src->forwarded++;
      payload += loc->len;
      n++;
      continue;
    }
    if (map_at)
      json_array_append_new(map_at, json_null());
    uint8_t *slot = land ? land + (size_t)self->slots[n] * q->shm_slot_bytes : NULL;
    corrupt += (uint64_t)add_frame(self, &recs[nrec++], k + n, series,
                                   land ? q->shm_slot_bytes : room, slot);
    payload += recs[nrec - 1].plen;
    self->st.shm_frames += (uint64_t)recs[nrec - 1].in_shm;
    n++;
  }
  if (rc == 0 && idx + n == T) {
    size_t keep = self->arena->used;
    self->arena->used = (size_t)(end_hdr - self->arena->data);
    rc = add_control(self, &recs[nrec++], BEAM_MSG_SERIES_END, series, pass, d);
    self->arena->used = keep;
  }
  if (rc < 0) {
    for (size_t i = 0; i < nrec; i++)
      free(recs[i].meta_owned);
    json_decref(map_files);
    json_decref(map_at);
    return send_error(self, d->msg, stop, d);
  }
  int eof = !o->loop && k + n == T;
  self->last_next = k + n;
  self->st.corrupt += corrupt; /* before the status, which reports the total */
  json_t *stj = status(self, k + n, n, series, eof, corrupt);
  if (land)
    json_object_set_new(stj, "shm", json_true());
  else if (q->shm_path)
    json_object_set_new(stj, "shm_error", json_string(shm_why));
  if (map_at)
    json_object_set_new(stj, "map", json_pack("{s:o, s:o}", "files", map_files, "at", map_at));
  else if (map_why)
    json_object_set_new(stj, "map_error", json_string(map_why));
  rc = send_json(self, stj, nrec > 0, stop, d);
  for (size_t i = 0; i < nrec && rc == 0; i++) {
    rp_rec_t *r = &recs[i];
    int last = i + 1 == nrec;
    rc = send_zc(self, r->hdr, BEAM_HDR_SIZE_V1, !last || r->payload || r->in_place || r->meta,
                 stop);
    if (rc == 0 && (r->in_shm || r->in_place)) /* empty: the payload is in the slot or file */
      rc = send_copy(self, NULL, 0, !last || r->meta, stop);
    else if (rc == 0 && r->payload)
      rc = r->payload_copy ? send_copy(self, r->payload, r->plen, !last || r->meta, stop)
                           : send_zc(self, r->payload, r->plen, !last || r->meta, stop);
    if (rc == 0 && r->meta)
      rc = r->meta_owned ? send_copy(self, r->meta, r->mlen, !last, stop)
                         : send_zc(self, r->meta, r->mlen, !last, stop);
    if (rc < 0 && errno != EINTR)
      BEAM_DIAG(d, BEAM_EIO, "sending reply: %s", zmq_strerror(errno));
  }
  for (size_t i = 0; i < nrec; i++) {
    free(recs[i].meta_owned);
    recs[i].meta_owned = NULL;
  }
  if (rc < 0)
    return -1;
  uint64_t now = beam_now_ns();
  if (n) {
    if (!self->st.t_first_frame_ns)
      self->st.t_first_frame_ns = now;
    self->st.t_last_frame_ns = now;
  }
  self->st.frames += n;
  self->st.payload_bytes += payload;
  if (o->rate > 0)
    self->tokens -= (double)n;
  return 0;
}

/* ---- requests (parsed by request.c) -------------------------------------------------- */

int rp_server_handle(rp_server_t *self, volatile sig_atomic_t *stop, beam_diag_t *d) {
  zmq_msg_t m;
  zmq_msg_init(&m);
  if (zmq_msg_recv(&m, self->sock, ZMQ_DONTWAIT) < 0) {
    int e = errno;
    zmq_msg_close(&m);
    if (e == EAGAIN || e == EINTR)
      return 0;
    return BEAM_DIAG(d, BEAM_EIO, "receiving a request: %s", zmq_strerror(e)), -1;
  }
  self->st.requests++;
  self->req_id = -1;
  int nparts = 1;
  while (zmq_msg_more(&m)) {
    /* Every part of the request must be taken before the reply can go. */
    zmq_msg_close(&m);
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, self->sock, 0) < 0 && errno == EINTR)
      ;
    nparts++;
  }
  char why[256];
  const char *err = NULL;
  rp_req_t q = {.id = -1};
  if (nparts != 1) {
    snprintf(why, sizeof why, "a request is one part, got %d", nparts);
    err = why;
  } else {
    err = rp_request_parse(zmq_msg_data(&m), zmq_msg_size(&m), &q, self->slots, why, sizeof why);
  }
  zmq_msg_close(&m);
  self->req_id = q.id;
  int rc;
  if (err)
    rc = send_error(self, err, stop, d);
  else if (q.info)
    rc = serve_info(self, stop, d);
  else
    rc = serve_get(self, &q, stop, d);
  free(q.shm_path);
  return rc < 0 ? -1 : 1;
}
