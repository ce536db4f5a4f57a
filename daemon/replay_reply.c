/* The replay input's reading of one reply (replay_reply.h): the status
 * part's fields, the "map" object and the v1 messages after it, checked as
 * src_replay.c always checked them, and nothing done with any of it. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "daemon/replay_reply.h"

static const char *str_or_null(json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static void read_status(beamd_rr_status_t *s, json_t *st) {
  json_t *v = json_object_get(st, "id");
  if ((s->has_id = json_is_integer(v)))
    s->id = (uint64_t)json_integer_value(v);
  s->ok = json_is_true(json_object_get(st, "ok"));
  s->error = str_or_null(st, "error");
  s->file_id = str_or_null(st, "file_id");
  s->file = str_or_null(st, "file");
  v = json_object_get(st, "total");
  if ((s->has_total = json_is_integer(v)))
    s->total = (uint64_t)json_integer_value(v);
  s->loop = json_is_true(json_object_get(st, "loop"));
  s->eof = json_is_true(json_object_get(st, "eof"));
  /* json_integer_value is 0 for anything but an integer, which is how the
   * daemon has always read a missing next or count. */
  s->next = json_integer_value(json_object_get(st, "next"));
  s->count = json_integer_value(json_object_get(st, "count"));
  v = json_object_get(st, "corrupt");
  if (json_is_integer(v) && json_integer_value(v) > 0)
    s->corrupt = (uint64_t)json_integer_value(v);
  json_t *dt = json_object_get(st, "dtype"), *sh = json_object_get(st, "shape");
  if (json_is_string(dt) && json_is_array(sh) && json_array_size(sh) == 2) {
    /* Unsigned arithmetic, so a hostile shape wraps instead of being
     * undefined; the product only caps the request size (src_replay.c). */
    size_t es = beam_dtype_size(beam_dtype_from_name(json_string_value(dt)));
    s->has_frame_bytes = 1;
    s->frame_bytes = es * (size_t)json_integer_value(json_array_get(sh, 0)) *
                     (size_t)json_integer_value(json_array_get(sh, 1));
  }
  s->shm = json_is_true(json_object_get(st, "shm"));
  s->shm_error = str_or_null(st, "shm_error");
  s->has_map = json_object_get(st, "map") != NULL;
  s->map_error = str_or_null(st, "map_error");
}

/* The "map" object (§13.8). The files before a malformed one are kept:
 * the daemon maps them before it finds the fault, as it always has. */
static void read_map(beamd_rr_t *self, json_t *st) {
  json_t *mp = json_object_get(st, "map");
  self->map_ok = 1;
  if (!mp)
    return;
  json_t *files = json_object_get(mp, "files"), *at = json_object_get(mp, "at");
  self->map_ok = 0;
  if (!json_is_array(files) || !json_is_array(at)) {
    snprintf(self->map_why, sizeof self->map_why,
             "\"map\" needs \"files\" and \"at\", both arrays");
    return;
  }
  if (json_array_size(files) > BEAMD_RR_FILES_MAX) {
    snprintf(self->map_why, sizeof self->map_why, "\"map\" names %zu files, more than %d",
             json_array_size(files), BEAMD_RR_FILES_MAX);
    return;
  }
  for (size_t i = 0; i < json_array_size(files); i++) {
    json_t *f = json_array_get(files, i);
    const char *path = str_or_null(f, "path"), *name = str_or_null(f, "name");
    if (!path) {
      snprintf(self->map_why, sizeof self->map_why, "\"map\".\"files\"[%zu] has no \"path\" string",
               i);
      return;
    }
    self->files[i] = (beamd_rr_file_t){path, name ? name : path};
    self->nfiles++;
  }
  self->map_ok = 1;
  self->at = at;
}

int beamd_rr_parse(beamd_rr_t *self, const beam_part_t *parts, size_t n, const beamd_rr_ask_t *ask) {
  memset(self, 0, sizeof *self);
  self->parts = parts;
  self->n = n;
  self->pos = 1;
  self->ask = *ask;
  self->map_ok = 1;
  json_error_t je;
  json_t *st = n ? json_loadb(parts[0].data, parts[0].size, 0, &je) : NULL;
  if (!json_is_object(st)) {
    snprintf(self->why, sizeof self->why, "the status part is %s",
             !n ? "missing" : st ? "JSON but not an object" : "not JSON");
    json_decref(st);
    self->err = BEAMD_RR_ESTATUS;
    return -BEAMD_RR_ESTATUS;
  }
  self->root = st;
  read_status(&self->st, st);
  if (!self->st.ok) {
    snprintf(self->why, sizeof self->why, "the server refused the request: %s",
             self->st.error ? self->st.error : "no reason given");
    self->err = BEAMD_RR_EREFUSED;
    return -BEAMD_RR_EREFUSED;
  }
  self->in_shm = ask->noffer && self->st.shm;
  if (!ask->info && ask->map)
    read_map(self, st);
  return 0;
}

static int fail(beamd_rr_t *self, int code, size_t part) {
  self->err = code;
  self->err_part = part;
  return -code;
}

/* A FRAME's "at" entry (§13.8): MAPPED with its file and offset, left
 * INLINE for null or none, or an error. */
static int read_at(beamd_rr_t *self, size_t i, beamd_rr_msg_t *m) {
  json_t *a = json_array_get(self->at, self->nframe);
  if (!a || json_is_null(a))
    return 0;
  json_t *fi = json_array_get(a, 0), *off = json_array_get(a, 1);
  if (!json_is_array(a) || json_array_size(a) != 2 || !json_is_integer(fi) ||
      !json_is_integer(off) || json_integer_value(fi) < 0 ||
      (size_t)json_integer_value(fi) >= self->nfiles || json_integer_value(off) < 0) {
    snprintf(self->why, sizeof self->why, "\"at\"[%u] is not [file index below %zu, offset >= 0]",
             self->nframe, self->nfiles);
    return fail(self, BEAMD_RR_EMAP, i);
  }
  /* Read in place means one payload part, empty, standing for a payload. */
  if (m->h.nparts != 1 || self->parts[i + 1].size != 0 || m->h.payload_size == 0) {
    snprintf(self->why, sizeof self->why, "FRAME %u is read in place but has %u payload parts, "
             "a non-empty one or payload_size 0", self->nframe, m->h.nparts);
    return fail(self, BEAMD_RR_EMAP, i);
  }
  m->src = BEAMD_RR_MAPPED;
  m->file = (unsigned)json_integer_value(fi);
  m->off = (uint64_t)json_integer_value(off);
  return 0;
}

static int mask_bad(beamd_rr_t *self, const char *why, const char *detail) {
  snprintf(self->mask_why, sizeof self->mask_why, "%s%s", why, detail ? detail : "");
  return BEAMD_RR_MASK_BAD;
}

/* A SERIES_START's mask (PROTOCOL.md 7.1, 13.5): the payload is the mask
 * only when the metadata's "mask" describes exactly it, the frames' dtype
 * and shape in one raw part; anything else is refused here and the series
 * starts without it. The header decode checked raw_size and payload_size
 * against the shape already. */
static int read_mask(beamd_rr_t *self, size_t i, beamd_rr_msg_t *m) {
  const beam_hdr_t *h = &m->h;
  json_t *meta = NULL, *d = NULL;
  if (h->flags & BEAM_FLAG_META) {
    const beam_part_t *mp = &self->parts[i + 1 + h->nparts];
    meta = json_loadb(mp->data, mp->size, 0, NULL);
    d = json_object_get(meta, "mask");
  }
  int rc = BEAMD_RR_MASK_NONE;
  if (!d && h->nparts == 0)
    goto out;
  if (!d) {
    rc = mask_bad(self, "a payload the metadata has no \"mask\" for", NULL);
    goto out;
  }
  if (h->nparts == 0) {
    rc = mask_bad(self, "a \"mask\" in the metadata but no payload", NULL);
    goto out;
  }
  json_t *arr = json_object_get(d, "array"), *dt = json_object_get(d, "dtype"),
         *sh = json_object_get(d, "shape");
  char got[96];
  if (!json_is_object(d) || !json_is_string(arr) || strcmp(json_string_value(arr), "pixel_mask")) {
    rc = mask_bad(self, "a \"mask\" that is not {\"array\": \"pixel_mask\", ...}", NULL);
    goto out;
  }
  if (!json_is_string(dt) || beam_dtype_from_name(json_string_value(dt)) != h->dtype ||
      h->dtype == BEAM_DT_C64 || h->dtype == BEAM_DT_C128) {
    snprintf(got, sizeof got, " (%s; frames %s)", json_is_string(dt) ? json_string_value(dt) : "?",
             beam_dtype_name((beam_dtype_t)h->dtype));
    rc = mask_bad(self, "a mask dtype that is not the frames' real dtype", got);
    goto out;
  }
  int same = h->ndim == 2 && json_is_array(sh) && json_array_size(sh) == 2;
  for (size_t k = 0; same && k < 2; k++) {
    json_t *v = json_array_get(sh, k);
    same = json_is_integer(v) && json_integer_value(v) == (json_int_t)h->shape[k];
  }
  if (!same) {
    snprintf(got, sizeof got, " (frames %ux%u)", h->shape[0], h->shape[1]);
    rc = mask_bad(self, "a mask shape that is not the frame shape [y, x]", got);
    goto out;
  }
  if (h->codec != BEAM_CODEC_RAW || h->nparts != 1 || self->parts[i + 1].size != h->raw_size) {
    snprintf(got, sizeof got, " (codec %s, %u parts, %zu bytes for %llu)",
             beam_codec_name((beam_codec_t)h->codec), h->nparts, self->parts[i + 1].size,
             (unsigned long long)h->raw_size);
    rc = mask_bad(self, "a mask payload that is not one raw part of the frame size", got);
    goto out;
  }
  m->mask_data = self->parts[i + 1].data;
  rc = BEAMD_RR_MASK_OK;
out:
  json_decref(meta);
  return rc;
}

int beamd_rr_mask_u32(beam_dtype_t dt, const void *src, size_t n, uint32_t *out) {
  /* double holds every value of the integer types a mask comes in closely
   * enough for the clamp; the element is read with memcpy (any alignment). */
  size_t es = beam_dtype_size(dt);
  if (!es || dt == BEAM_DT_C64 || dt == BEAM_DT_C128)
    return -1;
  const unsigned char *p = src;
  for (size_t i = 0; i < n; i++, p += es) {
    double x;
    switch (dt) {
    case BEAM_DT_U8: x = *p; break;
    case BEAM_DT_U16: { uint16_t v; memcpy(&v, p, 2); x = v; break; }
    case BEAM_DT_U32: { uint32_t v; memcpy(&v, p, 4); out[i] = v; continue; }
    case BEAM_DT_U64: { uint64_t v; memcpy(&v, p, 8); x = (double)v; break; }
    case BEAM_DT_I8: x = (int8_t)*p; break;
    case BEAM_DT_I16: { int16_t v; memcpy(&v, p, 2); x = v; break; }
    case BEAM_DT_I32: { int32_t v; memcpy(&v, p, 4); x = v; break; }
    case BEAM_DT_I64: { int64_t v; memcpy(&v, p, 8); x = (double)v; break; }
    case BEAM_DT_F32: { float v; memcpy(&v, p, 4); x = v; break; }
    default: { double v; memcpy(&v, p, 8); x = v; break; }
    }
    out[i] = x == 0.0 ? 0u : !(x >= 1.0) ? 1u : x >= 4294967295.0 ? UINT32_MAX : (uint32_t)x;
  }
  return 0;
}

int beamd_rr_next(beamd_rr_t *self, beamd_rr_msg_t *m) {
  if (self->err)
    return -self->err;
  size_t i = self->pos;
  if (self->ask.info || i >= self->n)
    return 0;
  memset(m, 0, sizeof *m);
  const char *why;
  if (beam_hdr_decode(self->parts[i].data, self->parts[i].size, &beam_limits_default, &m->h,
                      &why) < 0) {
    snprintf(self->why, sizeof self->why, "header: %s", why);
    return fail(self, BEAMD_RR_EMSG, i);
  }
  size_t k = 1u + m->h.nparts + ((m->h.flags & BEAM_FLAG_META) ? 1u : 0u);
  if (k > self->n - i) {
    snprintf(self->why, sizeof self->why, "the message needs %zu parts, the reply has %zu left",
             k, self->n - i);
    return fail(self, BEAMD_RR_EMSG, i);
  }
  m->part = i;
  m->nparts = k;
  m->is_frame = m->h.type == BEAM_MSG_FRAME;
  m->src = BEAMD_RR_INLINE;
  if (m->h.type == BEAM_MSG_SERIES_START)
    m->mask = read_mask(self, i, m);
  if (m->is_frame && self->ask.map && (self->at || !self->map_ok)) {
    if (!self->map_ok) {
      snprintf(self->why, sizeof self->why, "%s", self->map_why);
      return fail(self, BEAMD_RR_EMAP, i);
    }
    int rc = read_at(self, i, m);
    if (rc < 0)
      return rc;
  }
  /* An empty payload part standing for a payload, and not read in place:
   * the server wrote it into the slot offered for this FRAME (§13.6). */
  if (m->src == BEAMD_RR_INLINE && self->in_shm && m->is_frame && m->h.nparts == 1 &&
      self->parts[i + 1].size == 0 && m->h.payload_size != 0) {
    if (self->nframe >= self->ask.noffer || m->h.payload_size > self->ask.slot_bytes) {
      snprintf(self->why, sizeof self->why, "FRAME %u of %llu bytes landed, with %u slots of %zu "
               "bytes offered", self->nframe, (unsigned long long)m->h.payload_size,
               self->ask.noffer, self->ask.slot_bytes);
      return fail(self, BEAMD_RR_ESLOT, i);
    }
    m->src = BEAMD_RR_LANDED;
  }
  if (m->is_frame)
    m->frame = self->nframe++;
  self->pos = i + k;
  return 1;
}

void beamd_rr_release(beamd_rr_t *self) {
  json_decref(self->root);
  self->root = self->at = NULL;
  self->nfiles = 0;
  memset(&self->st, 0, sizeof self->st);
}

const char *beamd_rr_what(int code) {
  switch (code < 0 ? -code : code) {
  case BEAMD_RR_OK: return "no fault";
  case BEAMD_RR_ESTATUS: return "an unreadable status part";
  case BEAMD_RR_EREFUSED: return "a refusal";
  case BEAMD_RR_EMSG: return "an undecodable message";
  case BEAMD_RR_EMAP: return "a malformed in-place file reference";
  case BEAMD_RR_ESLOT: return "a landing slot it was not offered, or a payload larger than a slot,";
  default: return "an unknown fault";
  }
}
