/* Source replay: a REQ socket asking a beamd-replay server (REP) for
 * frames, as proto/PROTOCOL.md §13 specifies. Its keys are input.replay.
 *
 * Lossless by construction: requests never ask for more frames than the
 * graph can take at that moment (free input slots and queue places, less
 * what requests in flight asked for), so every frame of a reply is accepted
 * without waiting. A reply carries up to `credit` frames, so throughput is
 * not bound by the round trip.
 *
 * Pipelining (input.replay.depth): a DEALER socket keeps up to `depth` requests
 * in flight for consecutive ranges, so the server reads the next batch while
 * we hand this one to the graph. Each request carries an id the server
 * echoes; replies come back in order on one connection and only the
 * oldest request's reply is taken. A request is sized never to cross the
 * end of a pass or the reply size cap, so replies come back full; when one
 * comes back short anyway (rate limit, eof), the requests after it asked
 * for the wrong range: their replies are discarded when they arrive
 * (`discarded`) and pipelining stops until a reply is full again.
 *
 * Resuming: the server is stateless, every request names the next frame
 * index. Progress (the graph's watermark: every frame below it processed by
 * every stage and its results handed to the outputs) is written to
 * input.replay.state_file once it is commit_delay old, so results still inside
 * ZeroMQ's queues at a kill -9 are produced again after the restart
 * (at-least-once; beamd-record keeps one copy per frame).
 *
 * Shared memory (input.replay.shm, §13.6): each request also offers one free slot
 * of our landing area (landing.c) per frame asked for; the server reads
 * payloads into them and sends empty payload parts. Offered slots stay
 * reserved until a reply arrives (a resent request offers the same ones),
 * and those no frame kept go back after it. A server that cannot use them
 * says why in shm_error and sends payloads inline; we keep offering, so a
 * server restarted with shared memory allowed picks it up again.
 *
 * Reading in place (§13.8), asked for wherever shared memory is: the
 * server names, for each forwarded chunk, the file (as /proc/PID/fd/N) and
 * the offset it lies at, and we map the file and hand the stages pointers
 * into it, so the bytes are never copied at all. Mappings are cached per
 * path (re-checked by device and inode every reply: a restarted server can
 * reuse pid and fd). A file we cannot open or map makes us stop asking: the
 * rest of that reply is asked for again without it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zmq.h>

#include "daemon/beamd.h"
#include "daemon/replay_reply.h"

#define HIST 256          /* watermark samples kept for commit_delay */
#define TICK_MS 100
#define REPLY_MAX_BYTES (32 << 20)
#define MAX_REPLY_PARTS(credit) ((size_t)(credit) * (2u + BEAM_MAX_PAYLOAD_PARTS) + 9u)
#define DEPTH_MAX 4
#define FMAP_CACHE 8      /* mapped data files kept between replies */

/* A request in flight. */
typedef struct inflight_s {
  uint64_t id, next, sent_ns;
  unsigned credit;
  int info;       /* the resume check */
  int map;        /* it asked to read payloads in place */
  int stale;      /* asked for a range an earlier short reply made wrong */
  char *text;     /* the request (resent as it is) */
  unsigned *offer; /* landing slots it offered */
  unsigned noffer;
} inflight_t;

typedef struct fmap_ent_s {
  char path[64]; /* /proc/PID/fd/N as the server named it */
  char name[256]; /* the file's own path, for messages */
  beam_fmap_t *m;
  int damage_logged;
} fmap_ent_t;

typedef struct replay_s {
  beamd_zsock_t zs;        /* DEALER to the server's REP */
  /* input.replay */
  unsigned credit, cfg_depth;
  char state_file[BEAM_ENDPOINT_MAX];
  double commit_delay_s, timeout_s;
  int exit_on_eof, shm, map;
  uv_timer_t tick;
  uv_idle_t kick;          /* reads replies a send left unannounced (send_req) */
  inflight_t q[DEPTH_MAX]; /* oldest first */
  unsigned qn, depth;
  uint64_t next_id;
  int short_seen;        /* the last reply was short: one request at a time */
  size_t req_cap;
  size_t frame_bytes;    /* raw bytes of a frame (from info), for the reply cap */
  beamd_landing_t *land; /* NULL: payloads inline only */
  int shm_refused;       /* the last reply said shm_error (logged once per change) */
  uint64_t shm_frames, discarded;
  int map_ask;           /* offer to read payloads in place (§13.8) */
  int map_refused;       /* the last reply said map_error */
  char map_error[256];   /* why we stopped asking, or the server refused */
  fmap_ent_t fmaps[FMAP_CACHE];
  unsigned fmap_next;    /* the entry replaced next */
  uint64_t map_frames, map_damaged;
  uint64_t next;        /* frame index after the last reply taken */
  int want_start;       /* ask for SERIES_START with the next request */
  int eof;
  int eof_logged;
  uint64_t resume_next; /* from the state file */
  char resume_id[256];
  char file_id[256];
  char file[512];
  uint64_t total;
  int loop;
  uint64_t requests, replies, resends, corrupt;
  uint64_t masks, mask_refused; /* SERIES_START pixel masks taken, refused */
  /* commit bookkeeping */
  struct {
    uint64_t t_ns, w;
  } hist[HIST];
  unsigned hist_n, hist_head;
  uint64_t committed;
  int have_committed;
  zmq_msg_t *parts; /* reply buffer, sized once from credit */
  beam_part_t *views; /* its bytes, as replay_reply.c reads them */
  size_t parts_cap;
} replay_t;

static replay_t *R(beamd_t *d) { return d->in.src_state; }

/* ---- state file --------------------------------------------------------- */

static void state_write(beamd_t *d, uint64_t next) {
  replay_t *r = R(d);
  const char *path = r->state_file;
  if (!path[0] || !r->file_id[0])
    return;
  char tmp[BEAM_ENDPOINT_MAX + 16];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  json_t *o = json_pack("{s:s, s:I, s:s, s:s}", "file_id", r->file_id, "next", (json_int_t)next,
                        "file", r->file, "endpoint", d->cfg->input.endpoint);
  char *txt = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  int fd = txt ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
  int ok = fd >= 0;
  if (ok) {
    size_t len = strlen(txt);
    ok = write(fd, txt, len) == (ssize_t)len && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    ok = (close(fd) == 0) && ok;
    /* rename is atomic: a crash leaves the old state or the new one. */
    ok = ok && rename(tmp, path) == 0;
  }
  free(txt);
  if (!ok) {
    static beam_ratelimit_t rl = {.per_s = 1};
    beam_log_rl(&rl, LOG_ERR, "replay: cannot write state file %s: %s", path, strerror(errno));
    return;
  }
  r->committed = next;
  r->have_committed = 1;
}

static void state_read(beamd_t *d) {
  replay_t *r = R(d);
  const char *path = r->state_file;
  if (!path[0])
    return;
  json_error_t je;
  json_t *o = json_load_file(path, 0, &je);
  if (!o) {
    if (access(path, F_OK) == 0)
      BEAM_LOG(LOG_WARNING, "replay: ignoring unreadable state file %s: %s (line %d)", path, je.text,
               je.line);
    return;
  }
  json_t *id = json_object_get(o, "file_id"), *nx = json_object_get(o, "next");
  if (json_is_string(id) && json_is_integer(nx) && json_integer_value(nx) >= 0) {
    snprintf(r->resume_id, sizeof r->resume_id, "%s", json_string_value(id));
    r->resume_next = (uint64_t)json_integer_value(nx);
  } else {
    BEAM_LOG(LOG_WARNING, "replay: state file %s lacks file_id/next; starting from the beginning", path);
  }
  json_decref(o);
}

/* ---- requests ------------------------------------------------------------ */

static void on_replay_event(beamd_zsock_t *zs);
static void pump(beamd_t *d);

static void kick_cb(uv_idle_t *h) {
  beamd_t *d = h->data;
  uv_idle_stop(h);
  on_replay_event(&R(d)->zs);
}

static void send_req(beamd_t *d, inflight_t *e) {
  replay_t *r = R(d);
  /* DEALER to REP: an empty delimiter, then the request. */
  if (zmq_send(r->zs.sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(r->zs.sock, e->text, strlen(e->text), ZMQ_DONTWAIT) < 0) {
    BEAM_LOG(LOG_ERR, "replay: cannot send a request: %s", zmq_strerror(errno));
    return; /* resent at the timeout */
  }
  e->sent_ns = beam_now_ns();
  r->requests++;
  /* ZMQ_FD is edge-triggered and a send may take in a reply that arrived
   * meanwhile without the fd ever signalling it: with requests pipelined,
   * sends happen outside the read loop (room came back, a timeout), so
   * look, and read on the next loop turn. */
  if (beamd_zsock_events(&r->zs) & ZMQ_POLLIN)
    uv_idle_start(&r->kick, kick_cb);
}

/* Landing slots the request offered and no frame kept go back. */
static void offer_return(replay_t *r, inflight_t *e) {
  for (unsigned i = 0; i < e->noffer; i++)
    if (e->offer[i] != UINT_MAX)
      beamd_landing_put(r->land, e->offer[i]);
  e->noffer = 0;
}

/* Removes entry i (0 = oldest) from the queue, giving its slots back. */
static void q_remove(replay_t *r, unsigned i) {
  offer_return(r, &r->q[i]);
  for (; i + 1 < r->qn; i++) {
    inflight_t tmp = r->q[i];
    r->q[i] = r->q[i + 1];
    r->q[i + 1] = tmp; /* buffers move with the entries, none is lost */
  }
  r->qn--;
}

static inflight_t *q_push(replay_t *r) {
  inflight_t *e = &r->q[r->qn++];
  e->id = ++r->next_id;
  e->info = e->stale = e->map = 0;
  e->noffer = 0;
  return e;
}

/* Most frames one request may ask for at index `at`: never across the end
 * of a pass (the server stops a reply there), and inline, never more than
 * the reply size cap holds (max_bytes would cut the reply short). */
static unsigned range_cap(const replay_t *r, uint64_t at, unsigned credit) {
  if (r->total) {
    uint64_t left = r->total - (r->loop ? at % r->total : (at < r->total ? at : r->total));
    if (left && left < credit)
      credit = (unsigned)left;
  }
  if (!r->land && r->frame_bytes) {
    size_t fit = REPLY_MAX_BYTES / r->frame_bytes;
    if (fit < credit)
      credit = fit ? (unsigned)fit : 1;
  }
  return credit;
}

static void pump(beamd_t *d) {
  replay_t *r = R(d);
  if (!r || r->eof || d->state != BEAMD_RUNNING || d->in.stopped)
    return;
  unsigned depth = r->short_seen || r->want_start ? 1 : r->depth;
  if (r->qn >= depth || (r->qn && r->q[0].info))
    return;
  uint64_t ask = r->next;
  unsigned busy = 0;
  for (unsigned i = 0; i < r->qn; i++) {
    inflight_t *e = &r->q[i];
    if (!e->stale) {
      ask = e->next + e->credit;
      busy += e->credit;
    }
  }
  if (!r->loop && r->total && ask >= r->total && r->qn)
    return; /* the end is asked for already */
  /* Batching: when the stages are the bottleneck, room comes back a slot at
   * a time, and asking at once would make a round trip per frame. Wait for
   * a quarter of the pool (or the credit) unless nothing of ours is in the
   * graph, in which case this room is all there will be. Every input slot
   * comes back (stages never keep frames), so the wait always ends. */
  unsigned slots = beam_graph_input_slots(d->graph);
  unsigned want = slots / 4 ? slots / 4 : 1;
  want = range_cap(r, ask, want < r->credit ? want : r->credit);
  unsigned credit = 0;
  for (int again = 0;; again = 1) {
    unsigned room = beam_graph_room_count(d->graph); /* at 0 it asks for on_room itself */
    room = room > busy ? room - busy : 0;
    credit = range_cap(r, ask, r->credit < room ? r->credit : room);
    if (credit >= want || (credit > 0 && !busy && beam_graph_input_free(d->graph) == slots))
      break;
    if (r->qn)
      return; /* the reply in flight asks again */
    if (credit == 0 || again) {
      beamd_ingest_pause(d); /* on_room resumes us */
      return;
    }
    /* Then count again: a slot released before the flag was set would
     * not call on_room. */
    beam_graph_want_room(d->graph, want);
  }
  inflight_t *e = q_push(r);
  e->next = ask;
  e->credit = credit;
  /* max_bytes keeps one reply to a size the allocator reuses instead of
   * mapping afresh (a 256 MiB reply of 2048x2048 frames cost 5x in page
   * faults); the credit still bounds the frame count. */
  int n = snprintf(e->text, r->req_cap,
                   "{\"op\":\"get\",\"id\":%llu,\"next\":%llu,\"credit\":%u,\"start\":%s,"
                   "\"max_bytes\":%d", (unsigned long long)e->id, (unsigned long long)ask, credit,
                   r->want_start ? "true" : "false", REPLY_MAX_BYTES);
  while (r->land && e->noffer < credit && beamd_landing_take(r->land, &e->offer[e->noffer]) == 0)
    e->noffer++;
  if (e->noffer) {
    n += snprintf(e->text + n, r->req_cap - (size_t)n,
                  ",\"shm\":{\"path\":\"%s\",\"size\":%zu,\"slot_bytes\":%zu,\"slots\":[",
                  beamd_landing_path(r->land), beamd_landing_size(r->land),
                  beamd_landing_slot_bytes(r->land));
    for (unsigned i = 0; i < e->noffer; i++)
      n += snprintf(e->text + n, r->req_cap - (size_t)n, "%s%u", i ? "," : "", e->offer[i]);
    n += snprintf(e->text + n, r->req_cap - (size_t)n, "]}");
  }
  e->map = r->map_ask;
  if (e->map)
    n += snprintf(e->text + n, r->req_cap - (size_t)n, ",\"map\":true");
  snprintf(e->text + n, r->req_cap - (size_t)n, "}");
  send_req(d, e);
  pump(d); /* fill the pipeline */
}

static void shm_status(beamd_t *d, const beamd_rr_status_t *s) {
  replay_t *r = R(d);
  /* A server that knows nothing of section 13.6 ignores the offer. */
  int refused = !s->shm;
  if (refused && !r->shm_refused)
    BEAM_LOG(LOG_WARNING, "replay: the server does not use shared memory (%s); frames come inside "
             "the replies", s->shm_error ? s->shm_error : "it does not support it");
  else if (!refused && r->shm_refused)
    BEAM_LOG(LOG_NOTICE, "replay: the server now uses shared memory");
  r->shm_refused = refused;
}

/* ---- owners of payloads that are not in the reply (input.h) ------------------ */

/* A landing slot the server read a payload into. */
typedef struct land_owner_s {
  beam_owner_t base;
  beamd_landing_t *land;
  unsigned idx;
} land_owner_t;

static int land_lend(beam_owner_t *self, const void *data, beam_frame_t *f) {
  land_owner_t *o = (land_owner_t *)self;
  if (beamd_landing_ptr(o->land, o->idx) != data)
    return 0;
  beamd_landing_lend(o->land, o->idx, f);
  self->taken = 1;
  return 1;
}

/* A chunk read in place from our mapping of the server's file. */
typedef struct fmap_owner_s {
  beam_owner_t base;
  beam_fmap_t *m;
  uint64_t off;
} fmap_owner_t;

static int fmap_lend(beam_owner_t *self, const void *data, beam_frame_t *f) {
  fmap_owner_t *o = (fmap_owner_t *)self;
  if (beam_fmap_base(o->m) + o->off != data)
    return 0;
  beam_fmap_lend(o->m, o->off, f);
  self->taken = 1;
  return 1;
}

/* ---- files read in place (§13.8) ----------------------------------------- */

static void fmap_check_damage(replay_t *r, fmap_ent_t *e) {
  if (e->m && !e->damage_logged && beam_fmap_damaged(e->m)) {
    e->damage_logged = 1;
    r->map_damaged++;
    BEAM_LOG(LOG_ERR, "replay: %s shrank while frames were read from it in place; what lay past "
             "its new end was read as zeros: replay those frames again", e->name);
  }
}

static void fmap_drop(replay_t *r, fmap_ent_t *e) {
  fmap_check_damage(r, e);
  beam_fmap_unref(e->m);
  e->m = NULL;
  e->path[0] = '\0';
}

/* The mapping of the file `path` names, from the cache while the path
 * still names the same file at the same size (a file that grew, being
 * written under SWMR, is mapped afresh). Returns a new reference, or NULL
 * with why set. */
static beam_fmap_t *fmap_get(replay_t *r, const char *path, const char *name, char *why,
                             size_t wl) {
  struct stat st;
  int have = stat(path, &st) == 0;
  for (unsigned i = 0; i < FMAP_CACHE; i++) {
    fmap_ent_t *e = &r->fmaps[i];
    if (!e->m || strcmp(e->path, path))
      continue;
    if (have && st.st_dev == beam_fmap_dev(e->m) && st.st_ino == beam_fmap_ino(e->m) &&
        (uint64_t)st.st_size == beam_fmap_size(e->m)) {
      beam_fmap_ref(e->m);
      return e->m;
    }
    fmap_drop(r, e);
  }
  if (strlen(path) >= sizeof r->fmaps[0].path) {
    snprintf(why, wl, "file reference %.80s is too long", path);
    return NULL;
  }
  beam_fmap_t *m = beam_fmap_open_proc(path, why, wl);
  if (!m)
    return NULL;
  fmap_ent_t *e = &r->fmaps[r->fmap_next];
  r->fmap_next = (r->fmap_next + 1) % FMAP_CACHE;
  if (e->m)
    fmap_drop(r, e);
  snprintf(e->path, sizeof e->path, "%s", path);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->m = m;
  e->damage_logged = 0;
  beam_fmap_ref(m);
  return m;
}

/* The files the reply names for reading in place (replay_reply.c read
 * them) mapped into rm: NULL for one we could not map, with the reason in
 * r->map_error. Returns how many. */
static size_t map_open(replay_t *r, const beamd_rr_t *rr, beam_fmap_t **rm) {
  for (size_t i = 0; i < rr->nfiles; i++) {
    char why[200];
    rm[i] = fmap_get(r, rr->files[i].path, rr->files[i].name, why, sizeof why);
    if (!rm[i])
      snprintf(r->map_error, sizeof r->map_error, "%s: %s", rr->files[i].name, why);
  }
  return rr->nfiles;
}

/* A FRAME the server left in its file (m->file, m->off; the reference is
 * well formed, replay_reply.c checked it): point its payload into our
 * mapping, owned by fo. Returns 1, or -2 when we cannot read the file
 * (reason in r->map_error). */
static int in_place(replay_t *r, const beamd_rr_msg_t *m, beam_fmap_t **rm, beam_part_t *bp,
                    fmap_owner_t *fo) {
  beam_fmap_t *fm = rm[m->file];
  if (!fm)
    return -2;
  if (!beam_fmap_covers(fm, m->off, m->h.payload_size)) {
    snprintf(r->map_error, sizeof r->map_error, "a chunk at byte %llu (%llu bytes) lies past "
             "the end of its file (%zu bytes)", (unsigned long long)m->off,
             (unsigned long long)m->h.payload_size, beam_fmap_size(fm));
    return -2;
  }
  bp[1].data = beam_fmap_base(fm) + m->off;
  bp[1].size = m->h.payload_size;
  *fo = (fmap_owner_t){{fmap_lend, 0}, fm, m->off};
  bp[1].owner = &fo->base;
  return 1;
}

static void map_status(beamd_t *d, const beamd_rr_status_t *s) {
  replay_t *r = R(d);
  int refused = !s->has_map;
  if (refused && !r->map_refused) {
    snprintf(r->map_error, sizeof r->map_error, "%s",
             s->map_error ? s->map_error : "it does not support it");
    BEAM_LOG(LOG_NOTICE, "replay: the server does not let frames be read in place (%s)",
             r->map_error);
  } else if (!refused && r->map_refused) {
    BEAM_LOG(LOG_NOTICE, "replay: the server now lets frames be read in place");
  }
  r->map_refused = refused;
}

/* ---- replies ------------------------------------------------------------- */

static void on_status(beamd_t *d, const beamd_rr_status_t *s, int was_info) {
  replay_t *r = R(d);
  if (s->file_id)
    snprintf(r->file_id, sizeof r->file_id, "%s", s->file_id);
  if (s->file)
    snprintf(r->file, sizeof r->file, "%s", s->file);
  if (s->has_total)
    r->total = s->total;
  r->loop = s->loop;
  if (s->has_frame_bytes)
    r->frame_bytes = s->frame_bytes;
  if (was_info) {
    if (r->resume_id[0] && strcmp(r->resume_id, r->file_id) == 0) {
      r->next = r->resume_next;
      r->want_start = r->next > 0;
      BEAM_LOG(LOG_NOTICE, "replay: resuming %s at frame index %llu of %llu", r->file,
               (unsigned long long)r->next, (unsigned long long)r->total);
      if (!r->loop && r->total && r->next >= r->total) {
        r->eof = 1;
        BEAM_LOG(LOG_NOTICE, "replay: %s was already replayed completely (delete %s to replay again)",
                 r->file, r->state_file);
      }
    } else if (r->resume_id[0]) {
      BEAM_LOG(LOG_WARNING, "replay: state file %s is for another file (%s); starting from the beginning",
               r->state_file, r->resume_id);
    }
    d->in.fed_next = r->next;
  }
}

/* A FRAME whose payload the server put in landing slot offer[m->frame]
 * (replay_reply.c checked it was offered and is large enough): point its
 * empty payload part at the slot, owned by lo. */
static void landed(replay_t *r, inflight_t *e, const beamd_rr_msg_t *m, beam_part_t *bp,
                   land_owner_t *lo) {
  bp[1].data = beamd_landing_ptr(r->land, e->offer[m->frame]);
  bp[1].size = m->h.payload_size;
  *lo = (land_owner_t){{land_lend, 0}, r->land, e->offer[m->frame]};
  bp[1].owner = &lo->base;
}

/* A SERIES_START, with the pixel mask it carries (replay_reply.c checked
 * it against the "mask" description and the frame geometry) as the
 * series' "pixel_mask" array, uint32 as a DECTRIS detector sends it. A
 * refused mask is counted and logged, and the series starts without one:
 * stages with mask: series then refuse it with their own message. */
static void start_series(beamd_t *d, const beamd_rr_msg_t *m, const beamd_rr_t *rr,
                         const beam_part_t *bp) {
  replay_t *r = R(d);
  beam_series_array_t a = {.name = "pixel_mask"};
  if (m->mask == BEAMD_RR_MASK_OK) {
    size_t n = beam_hdr_nelems(&m->h);
    a.arr = (beam_array_t){.dtype = BEAM_DT_U32, .ndim = 2, .shape = {m->h.shape[0], m->h.shape[1]},
                           .nbytes = n * sizeof(uint32_t)};
    a.arr.data = malloc(a.arr.nbytes ? a.arr.nbytes : 1);
    if (!a.arr.data || beamd_rr_mask_u32((beam_dtype_t)m->h.dtype, m->mask_data, n, a.arr.data) < 0) {
      free(a.arr.data);
      a.arr.data = NULL;
      BEAM_LOG(LOG_ERR, "replay: series %llu: out of memory for its pixel mask; it starts "
               "without one", (unsigned long long)m->h.series_id);
      r->mask_refused++;
    } else {
      r->masks++;
    }
  } else if (m->mask == BEAMD_RR_MASK_BAD) {
    r->mask_refused++;
    BEAM_LOG(LOG_WARNING, "replay: series %llu: pixel mask refused: %s; the series starts "
             "without one", (unsigned long long)m->h.series_id, rr->mask_why);
  }
  if (m->mask != BEAMD_RR_MASK_OK && m->h.nparts) {
    /* A payload we did not take must not cost the series its start (a
     * part size the message parser would refuse): the start goes on
     * without it. */
    beam_hdr_t h = m->h;
    h.nparts = 0;
    h.payload_size = 0;
    h.codec = BEAM_CODEC_RAW;
    uint8_t hb[BEAM_HDR_SIZE_V1];
    beam_part_t p2[2] = {{hb, sizeof hb, NULL}, {NULL, 0, NULL}};
    size_t n2 = 1;
    if (beam_hdr_encode(&h, hb, sizeof hb) == (int)BEAM_HDR_SIZE_V1) {
      if (h.flags & BEAM_FLAG_META)
        p2[n2++] = bp[m->nparts - 1];
      beamd_ingest_parts(d, p2, n2);
      return;
    }
  }
  beamd_ingest_parts_array(d, bp, m->nparts, a.arr.data ? &a : NULL);
  free(a.arr.data);
}

/* The request a reply answers: its id (servers that do not echo ids answer
 * the oldest, and so does a status we cannot read). Returns its queue
 * position, or -1 for a late copy of a reply already taken (a request
 * resent at the timeout was answered twice). */
static int match(replay_t *r, const beamd_rr_status_t *s) {
  if (!s->has_id)
    return r->qn ? 0 : -1;
  for (unsigned i = 0; i < r->qn; i++)
    if (r->q[i].id == s->id)
      return (int)i;
  return -1;
}

static void on_reply(beamd_t *d, zmq_msg_t *parts, size_t n) {
  replay_t *r = R(d);
  r->replies++;
  for (size_t i = 0; i < n; i++)
    r->views[i] = (beam_part_t){zmq_msg_data(&parts[i]), zmq_msg_size(&parts[i]), NULL};
  /* Read as an answer to the oldest request: a reply to any other is
   * discarded below before more than its id is looked at. */
  beamd_rr_ask_t ask = {0};
  if (r->qn)
    ask = (beamd_rr_ask_t){r->q[0].info, r->q[0].map, r->q[0].noffer,
                           r->land ? beamd_landing_slot_bytes(r->land) : 0};
  beamd_rr_t rr;
  int rc = beamd_rr_parse(&rr, r->views, n, &ask);
  int at = match(r, &rr.st);
  if (at != 0) {
    /* A later request's reply while the oldest is unanswered (its request
     * or reply was lost: the server restarted) cannot be taken out of
     * order; nor can a late copy. Both are asked for again. */
    if (at > 0)
      q_remove(r, (unsigned)at);
    r->discarded++;
    beamd_rr_release(&rr);
    pump(d);
    return;
  }
  inflight_t *e = &r->q[0];
  if (rc < 0) {
    static beam_ratelimit_t rl = {.per_s = 1};
    beam_log_rl(&rl, LOG_ERR, "replay: server refused the request %s: %s", e->text,
                rr.st.error ? rr.st.error : "unreadable status part");
    beamd_rr_release(&rr);
    /* Sent again at the timeout, so a broken server is not hammered; it
     * stays the oldest, so later replies are discarded meanwhile. */
    e->sent_ns = beam_now_ns();
    return;
  }
  if (e->stale) {
    q_remove(r, 0);
    r->discarded++;
    beamd_rr_release(&rr);
    pump(d);
    return;
  }
  int was_info = e->info;
  on_status(d, &rr.st, was_info);
  if (e->noffer)
    shm_status(d, &rr.st);
  if (e->map && !was_info && rr.st.count > 0)
    map_status(d, &rr.st);
  if (was_info) {
    beamd_rr_release(&rr);
    q_remove(r, 0);
    pump(d);
    return;
  }
  uint64_t next2 = (uint64_t)rr.st.next;
  uint64_t count = (uint64_t)rr.st.count;
  r->eof = rr.st.eof;
  /* "corrupt" counts this reply's frames; stale replies were dropped above,
   * so summing counts each frame once. */
  r->corrupt += rr.st.corrupt;
  beam_fmap_t *rm[BEAMD_RR_FILES_MAX];
  size_t nrm = map_open(r, &rr, rm);
  uint64_t idx = next2 >= count ? next2 - count : 0;
  beam_part_t bp[2 + BEAM_MAX_PAYLOAD_PARTS];
  beamd_zmsg_owner_t zo[2 + BEAM_MAX_PAYLOAD_PARTS];
  land_owner_t lo = {0};
  fmap_owner_t fo = {0};
  beamd_rr_msg_t m;
  int got;
  beam_graph_batch(d->graph, 1);
  while ((got = beamd_rr_next(&rr, &m)) > 0) {
    for (size_t j = 0; j < m.nparts; j++) {
      beamd_zmsg_owner_init(&zo[j], &parts[m.part + j]);
      bp[j] = (beam_part_t){r->views[m.part + j].data, r->views[m.part + j].size, &zo[j].base};
    }
    lo.base.taken = fo.base.taken = 0;
    if (m.src == BEAMD_RR_MAPPED && in_place(r, &m, rm, bp, &fo) < 0) {
      /* Lossless: what is left of the reply is asked for again, read by
       * the server this time. */
      r->map_ask = 0;
      BEAM_LOG(LOG_WARNING, "replay: cannot read frames in place (%s); asking for them "
               "inside the replies or landing slots from frame index %llu on", r->map_error,
               (unsigned long long)idx);
      next2 = idx;
      r->eof = 0;
      break;
    }
    if (m.src == BEAMD_RR_LANDED)
      landed(r, e, &m, bp, &lo);
    const beam_series_t *open_s = beamd_ingest_series(d);
    if (m.h.type == BEAM_MSG_SERIES_START && open_s && open_s->series_id == m.h.series_id) {
      /* A range asked for again from the first frame of a pass starts with
       * the pass's SERIES_START once more; the series is open already, and
       * taking it again would end it as aborted. */
      continue;
    }
    if (m.is_frame)
      d->in.fed_next = idx;
    if (m.h.type == BEAM_MSG_SERIES_START)
      start_series(d, &m, &rr, bp);
    else
      beamd_ingest_parts(d, bp, m.nparts);
    if (lo.base.taken) {
      e->offer[m.frame] = UINT_MAX; /* the frame holds it now */
      r->shm_frames++;
    }
    r->map_frames += (uint64_t)fo.base.taken;
    if (m.is_frame)
      d->in.fed_next = ++idx; /* a frame dropped at ingest counts as handled */
  }
  if (got < 0) {
    if (got == -BEAMD_RR_EMAP) {
      /* As for a file we cannot read: the rest comes without "map". */
      snprintf(r->map_error, sizeof r->map_error, "the server sent malformed file references");
      r->map_ask = 0;
      BEAM_LOG(LOG_WARNING, "replay: cannot read frames in place (%s); asking for them "
               "inside the replies or landing slots from frame index %llu on", r->map_error,
               (unsigned long long)idx);
    }
    atomic_fetch_add(&d->in.malformed, 1);
    BEAM_LOG(LOG_ERR, "replay: reply to %s has %s at part %zu; the rest of the reply is "
                      "skipped and asked for again", e->text, beamd_rr_what(got), rr.err_part);
    BEAM_LOG(LOG_DEBUG, "replay: part %zu: %s", rr.err_part, rr.why);
    next2 = idx;
    r->eof = 0; /* the end was in what is asked for again */
  }
  beam_graph_batch(d->graph, 0);
  for (size_t i = 0; i < nrm; i++)
    beam_fmap_unref(rm[i]);
  beamd_rr_release(&rr);
  /* A short reply (rate limit, end of file, a skipped rest) leaves the
   * requests after it asking for the wrong range. */
  int full = count == e->credit && next2 == e->next + e->credit;
  q_remove(r, 0);
  for (unsigned j = 0; j < r->qn; j++)
    r->q[j].stale |= !full;
  r->short_seen = !full && !r->eof;
  r->next = next2;
  r->want_start = 0;
  if (r->eof && !r->eof_logged) {
    /* Frames still in the graph keep their mappings; the cache lets go,
     * so a file deleted after its replay frees its space. */
    for (unsigned i = 0; i < FMAP_CACHE; i++)
      if (r->fmaps[i].m)
        fmap_drop(r, &r->fmaps[i]);
    r->eof_logged = 1;
    BEAM_LOG(LOG_NOTICE, "replay: %s served completely (%llu frames, %llu corrupt)", r->file,
             (unsigned long long)r->total, (unsigned long long)r->corrupt);
  }
  pump(d);
}

static void on_replay_event(beamd_zsock_t *zs) {
  beamd_t *d = zs->d;
  replay_t *r = R(d);
  while (zs->open && (beamd_zsock_events(zs) & ZMQ_POLLIN)) {
    size_t n = 0;
    int more = 1;
    while (more) {
      zmq_msg_t *p = &r->parts[n < r->parts_cap ? n : r->parts_cap - 1];
      if (n >= r->parts_cap)
        zmq_msg_close(p); /* oversized reply: keep draining, reject below */
      zmq_msg_init(p);
      if (zmq_msg_recv(p, zs->sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
        zmq_msg_close(p);
        if (n == 0)
          return;
        break;
      }
      more = zmq_msg_more(p);
      if (n < r->parts_cap)
        n++;
    }
    /* DEALER: the REP envelope's empty delimiter comes first. */
    size_t base = n > 0 && zmq_msg_size(&r->parts[0]) == 0 ? 1 : 0;
    if (n >= r->parts_cap || n <= base) {
      BEAM_LOG(LOG_ERR, "replay: reply with %s parts rejected", n <= base ? "no" : "too many");
      atomic_fetch_add(&d->in.malformed, 1);
      if (r->qn)
        q_remove(r, 0); /* asked for again by the next request */
      pump(d);
    } else if (d->state == BEAMD_RUNNING) {
      on_reply(d, r->parts + base, n - base);
    } else {
      /* draining: frames not taken are asked for again after a restart */
      while (r->qn)
        q_remove(r, 0);
    }
    for (size_t i = 0; i < n; i++)
      zmq_msg_close(&r->parts[i]);
  }
}

/* ---- progress and timeouts --------------------------------------------------- */

static uint64_t watermark(beamd_t *d) {
  /* Frames still inside a graph replaced by a reload count too. */
  uint64_t w = d->graph ? beam_graph_watermark(d->graph, d->in.fed_next) : d->in.fed_next;
  if (d->next_graph) {
    uint64_t w2 = beam_graph_watermark(d->next_graph, d->in.fed_next);
    w = w2 < w ? w2 : w;
  }
  return w;
}

static void tick_cb(uv_timer_t *t) {
  beamd_t *d = t->data;
  replay_t *r = R(d);
  uint64_t now = beam_now_ns();
  if (r->qn && now - r->q[0].sent_ns > (uint64_t)(r->timeout_s * 1e9) &&
      d->state == BEAMD_RUNNING) {
    BEAM_LOG(LOG_WARNING, "replay: no answer from %s within %.1f s; asking again",
             d->cfg->input.endpoint, r->timeout_s);
    r->resends++;
    /* Every request in flight again, in order, with its own id: a late
     * reply to the first sending is then a late copy and is discarded. The
     * stale ones are dropped; their slots are safe to offer again because
     * the server handles requests one at a time, in order. */
    for (unsigned i = 0; i < r->qn;)
      if (r->q[i].stale)
        q_remove(r, i);
      else
        send_req(d, &r->q[i++]);
  }
  for (unsigned i = 0; i < FMAP_CACHE; i++)
    fmap_check_damage(r, &r->fmaps[i]);
  /* Results of frames below the watermark are in the result queue or
   * already sent; publish what is queued before recording progress. */
  uint64_t w = watermark(d);
  beamd_wake(d);
  r->hist[r->hist_head].t_ns = now;
  r->hist[r->hist_head].w = w;
  r->hist_head = (r->hist_head + 1) % HIST;
  if (r->hist_n < HIST)
    r->hist_n++;
  uint64_t delay = (uint64_t)(r->commit_delay_s * 1e9), best = 0;
  int found = 0;
  for (unsigned i = 0; i < r->hist_n; i++)
    if (now - r->hist[i].t_ns >= delay && r->hist[i].w >= best) {
      best = r->hist[i].w;
      found = 1;
    }
  if (found && (!r->have_committed || best > r->committed) && beamd_publish_backlog(d) == 0)
    state_write(d, best);
  if (r->eof && r->exit_on_eof && d->state == BEAMD_RUNNING && w >= r->next &&
      (!d->graph || !beam_graph_series_open(d->graph)))
    beamd_input_eof(d, "replay complete (input.replay.exit_on_eof)");
}

/* ---- open / close -------------------------------------------------------------- */

/* In the order of the shm enum's choices. */
enum { SHM_AUTO = 0, SHM_ON = 1, SHM_OFF = 2 };

const beam_param_t beamd_replay_params[] = {
    {"credit", BEAM_P_INT, "64", 0, 1, 4096, NULL, NULL,
     "frames asked for per request (capped by free pool slots)", NULL},
    {"state_file", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "file where progress is kept so a restarted daemon resumes; \"\" = no resume", NULL},
    {"commit_delay", BEAM_P_DURATION, "2s", 0, 0, 3600, NULL, NULL,
     "how long progress is held back before it is written to state_file", NULL},
    {"timeout", BEAM_P_DURATION, "10s", 0, 0.1, 3600, NULL, NULL,
     "a request unanswered this long is sent again (server restarted)", NULL},
    {"exit_on_eof", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "drain and exit 0 when the file has been served completely", NULL},
    {"shm", BEAM_P_ENUM, "auto", 0, 0, 0, "auto|on|off", NULL,
     "let the server read payloads into shared memory (same host); auto = for ipc://", NULL},
    {"map", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL,
     "with shm: read stored chunks in place from beamd's own mapping of the file", NULL},
    {"depth", BEAM_P_INT, "2", 0, 1, 4, NULL, NULL,
     "requests in flight at once, so the server reads while beamd ingests", NULL},
    BEAM_PARAM_END};

static void read_conf(replay_t *r, const beam_cnode_t *c, const char *endpoint) {
  r->credit = (unsigned)beam_cfg_int(c, "credit", 64);
  const char *sf = beam_cfg_str(c, "state_file");
  snprintf(r->state_file, sizeof r->state_file, "%s", sf ? sf : "");
  r->commit_delay_s = beam_cfg_float(c, "commit_delay", 2.0);
  r->timeout_s = beam_cfg_float(c, "timeout", 10.0);
  r->exit_on_eof = beam_cfg_bool(c, "exit_on_eof", 0);
  int shm = (int)beam_cfg_int(c, "shm", SHM_AUTO);
  r->shm = shm == SHM_AUTO ? strncmp(endpoint, "ipc://", 6) == 0 : shm == SHM_ON;
  r->map = beam_cfg_bool(c, "map", 1);
  r->cfg_depth = (unsigned)beam_cfg_int(c, "depth", 2);
}

static int replay_open(beamd_t *d, void **state, const beam_cnode_t *conf, char *err,
                       size_t errlen) {
  replay_t *r = calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "input: out of memory");
    return BEAM_ENOMEM;
  }
  *state = r;
  /* Handles first: close must find them initialised whatever fails below. */
  uv_timer_init(&d->loop, &r->tick);
  r->tick.data = d;
  uv_idle_init(&d->loop, &r->kick);
  r->kick.data = d;
  read_conf(r, conf, d->cfg->input.endpoint);
  r->parts_cap = MAX_REPLY_PARTS(r->credit);
  r->parts = calloc(r->parts_cap, sizeof *r->parts);
  r->views = calloc(r->parts_cap, sizeof *r->views);
  /* The endpoint and a list of up to `credit` slot numbers. */
  r->req_cap = 512 + BEAM_ENDPOINT_MAX + 11u * r->credit;
  r->depth = r->cfg_depth < DEPTH_MAX ? r->cfg_depth : DEPTH_MAX;
  for (unsigned i = 0; i < r->depth; i++) {
    r->q[i].text = malloc(r->req_cap);
    r->q[i].offer = calloc(r->credit, sizeof *r->q[i].offer);
    if (!r->q[i].text || !r->q[i].offer) {
      snprintf(err, errlen, "input: out of memory");
      return BEAM_ENOMEM;
    }
  }
  if (!r->parts || !r->views) {
    snprintf(err, errlen, "input: out of memory");
    return BEAM_ENOMEM;
  }
  if (r->shm) {
    /* Slots as many as the pool's: a frame holds at most one, so a free
     * pool slot always finds a free landing slot. Sized for the largest
     * compressed chunk a frame_bytes frame can take. */
    size_t fb = d->cfg->pool.frame_bytes;
    size_t b1 = beam_codec_bound(BEAM_CODEC_BSLZ4, fb, 1), b2 = beam_codec_bound(BEAM_CODEC_LZ4, fb, 1);
    r->land = beamd_landing_new(d->cfg->pool.frames, b1 > b2 ? b1 : b2, d->cfg->pool.prefault, err,
                                errlen);
    if (!r->land)
      return BEAM_ENOMEM;
    r->map_ask = r->map;
  }
  char zerr[512];
  beamd_zopts_t o = {.rcvhwm = d->cfg->input.hwm, .sec = &d->cfg->input.endpoint_sec,
                     .what = "input.endpoint"};
  int rc = beamd_zsock_open(d, &r->zs, ZMQ_DEALER, d->cfg->input.endpoint, d->cfg->input.bind,
                            &o, on_replay_event, zerr, sizeof zerr);
  if (rc < 0) {
    snprintf(err, errlen, "input: %s", zerr);
    return rc;
  }
  uv_timer_start(&r->tick, tick_cb, TICK_MS, TICK_MS);
  state_read(d);
  /* Always start with "info": it tells the file and whether a stored
   * position belongs to it. */
  inflight_t *e = q_push(r);
  e->info = 1;
  snprintf(e->text, r->req_cap, "{\"op\":\"info\",\"id\":%llu}", (unsigned long long)e->id);
  send_req(d, e);
  return 0;
}

static void replay_resume(beamd_t *d, void *state) {
  (void)state;
  pump(d);
}

/* Frames never asked for are asked for after a restart: nothing to read. */
static int replay_drain(beamd_t *d, void *state) {
  (void)d;
  (void)state;
  return 0;
}

static void replay_stop(beamd_t *d, void *state) {
  (void)d;
  replay_t *r = state;
  if (r->zs.open && r->zs.polling) {
    uv_poll_stop(&r->zs.poll);
    r->zs.polling = 0;
  }
}

static void replay_close(beamd_t *d, void *state) {
  replay_t *r = state;
  if (!r)
    return;
  /* A clean exit with nothing waiting for a consumer: everything fed was
   * processed and handed to ZeroMQ, which lingers to send it. */
  if (!d->graph && d->ndraining == 0 && beamd_publish_backlog(d) == 0 && r->file_id[0])
    state_write(d, d->in.fed_next);
  beamd_zsock_close(&r->zs, 0);
  if (!uv_is_closing((uv_handle_t *)&r->tick))
    uv_close((uv_handle_t *)&r->tick, NULL);
  if (!uv_is_closing((uv_handle_t *)&r->kick))
    uv_close((uv_handle_t *)&r->kick, NULL);
  free(r->parts);
  free(r->views);
  while (r->qn)
    q_remove(r, 0);
  beamd_landing_close(&r->land);
  for (unsigned i = 0; i < FMAP_CACHE; i++)
    if (r->fmaps[i].m)
      fmap_drop(r, &r->fmaps[i]);
  for (unsigned i = 0; i < DEPTH_MAX; i++) {
    free(r->q[i].text);
    free(r->q[i].offer);
    r->q[i].text = NULL;
    r->q[i].offer = NULL;
  }
  /* The handles live in r: it is freed after their close callbacks ran,
   * which beamd_fini's last uv_run does. */
  d->src_garbage = r;
}

static void replay_stats(beamd_t *d, void *state, json_t *obj) {
  (void)d;
  replay_t *r = state;
  json_t *o = json_object();
  json_object_set_new(o, "file", json_string(r->file));
  json_object_set_new(o, "file_id", json_string(r->file_id));
  json_object_set_new(o, "next", json_integer((json_int_t)r->next));
  json_object_set_new(o, "total", json_integer((json_int_t)r->total));
  json_object_set_new(o, "eof", json_boolean(r->eof));
  json_object_set_new(o, "requests", json_integer((json_int_t)r->requests));
  json_object_set_new(o, "replies", json_integer((json_int_t)r->replies));
  json_object_set_new(o, "resends", json_integer((json_int_t)r->resends));
  json_object_set_new(o, "corrupt", json_integer((json_int_t)r->corrupt));
  json_object_set_new(o, "masks", json_integer((json_int_t)r->masks));
  json_object_set_new(o, "mask_refused", json_integer((json_int_t)r->mask_refused));
  json_object_set_new(o, "shm", json_string(!r->land ? "off" : r->shm_refused ? "refused" : "on"));
  json_object_set_new(o, "shm_frames", json_integer((json_int_t)r->shm_frames));
  json_object_set_new(o, "map", json_string(!r->land || !r->map ? "off"
                                            : !r->map_ask ? "failed"
                                            : r->map_refused ? "refused" : "on"));
  json_object_set_new(o, "map_frames", json_integer((json_int_t)r->map_frames));
  json_object_set_new(o, "map_damaged", json_integer((json_int_t)r->map_damaged));
  if (r->map_error[0])
    json_object_set_new(o, "map_error", json_string(r->map_error));
  json_object_set_new(o, "inflight", json_integer((json_int_t)r->qn));
  json_object_set_new(o, "discarded", json_integer((json_int_t)r->discarded));
  json_object_set_new(o, "committed", r->have_committed ? json_integer((json_int_t)r->committed) : json_null());
  json_object_set_new(obj, "replay", o);
}

static void replay_progress(const void *state, uint64_t *done, uint64_t *expected) {
  const replay_t *r = state;
  *done = r->next;
  *expected = r->loop ? 0 : r->total;
}

const beamd_source_ops_t beamd_src_replay = {
    .progress = replay_progress,
    .mode = "replay",
    .lossless = 1,
    .params = beamd_replay_params,
    .open = replay_open,
    .resume = replay_resume,
    .drain = replay_drain,
    .stop = replay_stop,
    .close = replay_close,
    .stats = replay_stats,
};
