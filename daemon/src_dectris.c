/* Source dectris: a DECTRIS detector's stream, SIMPLON stream v1 (JSON
 * multipart, EIGER) or v2 (one CBOR message per event, EIGER2, PSI
 * Jungfraujoch), over a PULL connected to the detector's PUSH. Lossless:
 * when beamd is full it stops reading and the detector's send queue fills.
 *
 * proto/dectris*.c decode each message (pure, borrowed); this file holds
 * the series: it turns a start message into a beamd series (geometry,
 * metadata JSON, the mask/flatfield/count-rate arrays), checks each image
 * against it (series id, frame number, shape, dtype, optional md5) and
 * hands the pixel blob to the ingest core as it came, still compressed
 * (bslz4, lz4, bare LZ4, bszstd): it is decoded on a stage thread, only
 * where a stage needs pixels, never here.
 *
 * What cannot be used is counted with its own reason and dropped; the
 * messages around it go on. A dropped image does not take its frame
 * number, so a good copy may still follow; frames that never came (a
 * number gap, fewer than announced at the end) are counted as missing and
 * the series' end is flagged INCOMPLETE. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <md5.h>
#include <zmq.h>

#include "daemon/beamd.h"
#include "proto/dectris.h"

#define META_MAX (1u << 20)  /* series metadata JSON (the detector config) */
#define INLINE_MAX 64        /* byte strings kept inline in it */

#define MAX_STREAMS 16

static const char *endpoints_valid(const beam_cnode_t *v) {
  if (v->n + 1 > MAX_STREAMS)
    return "at most 15 further endpoints";
  for (size_t i = 0; i < v->n; i++)
    if (!v->items[i]->scalar || !v->items[i]->scalar[0])
      return "an endpoint cannot be \"\"";
  return NULL;
}

/* In the order of the format enum's choices. */
enum { FMT_AUTO = 0, FMT_V1 = 1, FMT_V2 = 2 };

const beam_param_t beamd_dectris_params[] = {
    {"format", BEAM_P_ENUM, "auto", 0, 0, 0, "auto|v1|v2", NULL,
     "stream format: v1 = SIMPLON legacy JSON (stream format legacy), v2 = CBOR (format cbor, "
     "also Jungfraujoch); auto = told by each message's first bytes", NULL},
    {"channel", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "v2 with several thresholds: the channel the pipeline receives (for example threshold_2); "
     "\"\" = the first one the start message lists", NULL},
    {"verify_hash", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "v1: check each image's md5 against its dimage hash (costs a pass over the blob; some "
     "detector firmware sends hashes that do not match)", NULL},
    {"endpoints", BEAM_P_ENDPOINT_LIST, "[]", 0, 0, 0, NULL, NULL,
     "further PUSH sockets of one image stream split over several (Jungfraujoch writers): "
     "beamd reads endpoint and each of these and merges the images by image id", endpoints_valid},
    {"merge_wait", BEAM_P_DURATION, "200ms", 0, 0.001, 60, NULL, NULL,
     "with endpoints: how long an image waits for a lower image id from another socket "
     "before it is taken anyway (the ids skipped count as missing)", NULL},
    BEAM_PARAM_END};

/* One socket of the stream. With several (a split image stream), each
 * socket's images come in order but interleave with the others': an image
 * ahead of the next id waits here (its socket not read meanwhile) until
 * the lower ids came from the other sockets, every other live socket has
 * an image waiting too, or merge_wait ran out. */
typedef struct stream_s {
  beamd_zread_t zr;
  struct dsrc_s *src;
  int held;                 /* an image waits in hparts */
  zmq_msg_t hparts[BEAMD_ZREAD_MAX_PARTS];
  size_t hn;
  uint64_t held_id, held_ns;
  int ended;                /* its end of the open series came */
  int drained;
} stream_t;

typedef struct dsrc_s {
  beamd_t *d;
  stream_t st[MAX_STREAMS];
  unsigned nst;
  uv_timer_t merge_timer;
  int timer_on, force_one, end_pending, drain_pending;
  uint64_t merge_wait_ns, end_id;
  int format, verify_hash;
  char channel[BEAM_DX_NAME_MAX];
  /* the series being received */
  int have_start; /* a start message was taken (beamd series maybe not yet) */
  int version;
  uint64_t series_id, expected, next_frame, received;
  uint32_t width, height;
  beam_dtype_t dtype;
  int chan;       /* index of the channel taken (v2) */
  char date_text[40]; /* the last v2 series_date seen, and its value */
  uint64_t date_ns;
  beam_series_t *pending; /* series waiting for its first image to know its dtype */
  beam_dx_msg_t msg;      /* decoded message (large: kept off the stack) */
  /* counters */
  uint64_t v1_messages, v2_messages, starts, images, ends, other, before_header, stale,
      gaps, missing, unsupported, size_mismatch, hash_mismatch, no_channel, incomplete,
      merge_held, merge_timeouts;
} dsrc_t;

static void warn(dsrc_t *s, const char *what, const char *why) {
  beam_log_rl(&s->d->in.rl, LOG_WARNING, "input: dectris: %s: %s", what, why);
}

/* ---- series start ---------------------------------------------------------------- */

static void set_num(json_t *o, const char *k, double v) {
  if (isfinite(v))
    json_object_set_new(o, k, json_real(v));
}

/* Series metadata (PROTOCOL.md 7.1 keys, then everything the detector
 * said under "dectris"). */
/* Whether the detector says it applied the flat field itself (v1 config
 * flatfield_correction_applied, v2 flatfield_enabled): then its flatfield
 * array must not reach `correct`, which would apply it a second time. */
static int flat_applied(const json_t *cfg) {
  return json_is_true(json_object_get(cfg, "flatfield_correction_applied")) ||
         json_is_true(json_object_get(cfg, "flatfield_enabled"));
}

static char *series_meta(dsrc_t *s, const beam_dx_start_t *st, int version, int *flat_done) {
  json_t *o = json_object();
  json_object_set_new(o, "detector", json_string(version == 1 ? "DECTRIS (stream v1)"
                                                              : "DECTRIS (stream v2)"));
  json_object_set_new(o, "frame_time", json_real(isfinite(st->frame_time) ? st->frame_time : 0));
  json_object_set_new(o, "nframes", json_integer((json_int_t)st->expected_frames));
  set_num(o, "energy", st->energy_ev);
  set_num(o, "wavelength", st->wavelength_a);
  set_num(o, "distance", st->distance_m);
  set_num(o, "count_time", st->count_time);
  if (isfinite(st->pixel_size_x) && isfinite(st->pixel_size_y)) {
    if (st->pixel_size_x == st->pixel_size_y)
      json_object_set_new(o, "pixel_size", json_real(st->pixel_size_x));
    else
      json_object_set_new(o, "pixel_size", json_pack("[f,f]", st->pixel_size_y, st->pixel_size_x));
  }
  if (isfinite(st->beam_center_x) && isfinite(st->beam_center_y))
    json_object_set_new(o, "beam_center", json_pack("[f,f]", st->beam_center_y, st->beam_center_x));
  json_t *dx = json_object();
  json_object_set_new(dx, "stream", json_integer(version));
  json_object_set_new(dx, "series", json_integer((json_int_t)st->series_id));
  if (st->series_unique_id[0])
    json_object_set_new(dx, "series_unique_id", json_string(st->series_unique_id));
  if (st->header_detail >= 0)
    json_object_set_new(dx, "header_detail",
                        json_string(st->header_detail == 2   ? "all"
                                    : st->header_detail == 1 ? "basic"
                                                             : "none"));
  if (st->nchannels) {
    json_object_set_new(dx, "channel", json_string(st->channels[s->chan]));
    set_num(dx, "threshold_energy", st->threshold_ev[s->chan]);
  }
  if (st->has_saturation)
    json_object_set_new(dx, "saturation_value", json_integer((json_int_t)st->saturation_value));
  if (st->has_error_value)
    json_object_set_new(dx, "error_value", json_integer((json_int_t)st->error_value));
  if (st->magic_number)
    json_object_set_new(dx, "magic_number", json_integer((json_int_t)st->magic_number));
  if (st->config) {
    char *txt = malloc(META_MAX);
    int64_t n = txt ? beam_dx_meta_json(st, version, txt, META_MAX, INLINE_MAX) : -1;
    json_t *cfg = n >= 0 ? json_loadb(txt, (size_t)n, 0, NULL) : NULL;
    *flat_done = flat_applied(cfg);
    /* Stream v2 gives the distance only as the detector's position (x, y,
     * z), z along the beam from the sample. */
    json_t *tr = json_object_get(cfg, "detector_translation");
    if (!isfinite(st->distance_m) && json_array_size(tr) == 3 &&
        json_is_number(json_array_get(tr, 2)))
      json_object_set_new(o, "distance", json_real(json_number_value(json_array_get(tr, 2))));
    if (*flat_done)
      json_object_set_new(dx, "flatfield_applied_by_detector", json_true());
    if (cfg)
      json_object_set_new(dx, "config", cfg);
    else
      warn(s, "series start", "the detector description could not be kept in the metadata");
    free(txt);
  }
  json_object_set_new(o, "dectris", dx);
  char *out = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return out;
}

/* One series array, decoded when it came compressed (v2 may compress the
 * mask). Series starts are rare: allocating here is fine. */
static void add_array(dsrc_t *s, beam_series_t *ser, const char *name, const beam_dx_array_t *a) {
  if (!a->data)
    return;
  const void *raw = a->data;
  void *buf = NULL, *scratch = NULL;
  const char *why = "out of memory";
  size_t es = beam_dtype_size(a->dtype);
  if (a->codec != BEAM_CODEC_RAW) {
    buf = malloc(a->raw_size ? a->raw_size : 1);
    scratch = malloc(a->raw_size ? a->raw_size : 1);
    if (!buf || !scratch ||
        beam_codec_decode(a->codec, a->data, a->size, buf, a->raw_size, es, scratch, &why) < 0) {
      warn(s, name, why);
      free(buf);
      free(scratch);
      return;
    }
    raw = buf;
  }
  if (beam_series_add_array(ser, name, a->dtype, a->ndim, a->shape, raw, a->raw_size) < 0)
    warn(s, name, "not kept with the series (size or count limit)");
  free(buf);
  free(scratch);
}

static int channel_index(const dsrc_t *s, const beam_dx_start_t *st) {
  if (!st->nchannels || !s->channel[0])
    return 0;
  for (unsigned i = 0; i < st->nchannels; i++)
    if (strcmp(st->channels[i], s->channel) == 0)
      return (int)i;
  return -1;
}

static const beam_dx_array_t *of_channel(const beam_dx_array_t *a, unsigned n, const char *ch) {
  for (unsigned i = 0; i < n; i++)
    if (!ch || !a[i].channel[0] || strcmp(a[i].channel, ch) == 0)
      return &a[i];
  return NULL;
}

/* A beamd series needs its dtype; v1 without bit_depth_image (and a start
 * without a size) learns it from the first image, so the series waits. */
static void begin_series(dsrc_t *s, beam_series_t *ser) {
  s->pending = NULL;
  beamd_ingest_series_start(s->d, ser);
}

static void on_start(dsrc_t *s, const beam_dx_start_t *st, int version) {
  beamd_t *d = s->d;
  if (s->have_start && s->series_id == st->series_id && s->version == version)
    return; /* the same start again (a detector re-arming with one series id) */
  if (s->pending)
    beam_series_unref(&s->pending);
  s->starts++;
  /* A split stream's sockets each end the series; a new start forgets
   * ends that were waiting for the others. */
  for (unsigned i = 0; i < s->nst; i++)
    s->st[i].ended = 0;
  s->end_pending = 0;
  int chan = channel_index(s, st);
  if (chan < 0) {
    s->no_channel++;
    beam_log_rl(&d->in.rl, LOG_ERR, "input: dectris: series %llu has no channel \"%s\" "
                "(input.dectris.channel); its images are counted and dropped",
                (unsigned long long)st->series_id, s->channel);
  }
  s->have_start = 1;
  s->version = version;
  s->series_id = st->series_id;
  s->expected = st->expected_frames;
  s->next_frame = 0;
  s->received = 0;
  s->width = st->width;
  s->height = st->height;
  s->dtype = st->dtype;
  s->chan = chan;
  if (chan < 0)
    return;
  int flat_done = 0;
  char *meta = series_meta(s, st, version, &flat_done);
  uint32_t shape[2] = {st->height, st->width};
  beam_series_t *ser = beam_series_new(st->series_id, st->dtype, 2, shape, meta,
                                       meta ? strlen(meta) : 0);
  free(meta);
  if (!ser) {
    warn(s, "series start", "out of memory");
    s->have_start = 0;
    return;
  }
  const char *ch = st->nchannels ? st->channels[chan] : NULL;
  const beam_dx_array_t *mask = of_channel(st->pixel_mask, st->npixel_mask, ch);
  const beam_dx_array_t *flat = of_channel(st->flatfield, st->nflatfield, ch);
  if (mask)
    add_array(s, ser, "pixel_mask", mask);
  if (flat && !flat_done)
    add_array(s, ser, "flatfield", flat);
  add_array(s, ser, "countrate_table", &st->countrate);
  if (st->dtype != BEAM_DT_NONE && st->width && st->height)
    begin_series(s, ser);
  else
    s->pending = ser;
}

/* ---- images ------------------------------------------------------------------------ */

static int hash_ok(const beam_dx_image_t *im, const beam_dx_array_t *a) {
  static const char hex[] = "0123456789abcdef";
  if (!im->hash || im->hash_len != 32)
    return 0;
  MD5_CTX c;
  uint8_t dg[16];
  MD5Init(&c);
  MD5Update(&c, a->data, a->size);
  MD5Final(dg, &c);
  for (int i = 0; i < 16; i++) {
    char hi = im->hash[2 * i] | 0x20, lo = im->hash[2 * i + 1] | 0x20; /* either case */
    if (hi != hex[dg[i] >> 4] || lo != hex[dg[i] & 15])
      return 0;
  }
  return 1;
}

/* An RFC 3339 date-time ("2026-12-02T06:00:00.25Z", "...+02:00") as ns
 * since the epoch; 0 when it is not one. */
static uint64_t rfc3339_ns(const char *p, size_t n) {
  char b[40];
  if (!p || n >= sizeof b)
    return 0;
  memcpy(b, p, n);
  b[n] = 0;
  int y, mo, d, h, mi, sec, used = 0;
  if (sscanf(b, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &used) != 6 ||
      !used)
    return 0;
  const char *q = b + used;
  double frac = 0;
  if (*q == '.') {
    char *e;
    frac = strtod(q, &e);
    q = e;
  }
  long off = 0;
  if (*q == 'Z' || *q == 'z') {
    q++;
  } else if (*q == '+' || *q == '-') {
    int oh, om, k = 0;
    if (sscanf(q + 1, "%2d:%2d%n", &oh, &om, &k) != 2 || k != 5)
      return 0;
    off = (oh * 60L + om) * 60L * (*q == '-' ? -1 : 1);
    q += 6;
  } else {
    return 0;
  }
  struct tm tm = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                  .tm_min = mi, .tm_sec = sec};
  time_t t = timegm(&tm);
  if (*q || t == (time_t)-1 || t - off < 0 || !(frac >= 0 && frac < 1))
    return 0;
  return (uint64_t)(t - off) * 1000000000ull + (uint64_t)(frac * 1e9);
}

/* v2: when the image was taken (series_date + start_time), realtime ns; 0
 * when the detector did not say. v1's dconfig ticks count from an arm time
 * the stream does not carry. */
static uint64_t acq_ns(dsrc_t *s, const beam_dx_image_t *im) {
  if (!im->series_date || !isfinite(im->start_time_s) || im->start_time_s < 0)
    return 0;
  if (im->series_date_len >= sizeof s->date_text ||
      memcmp(s->date_text, im->series_date, im->series_date_len) ||
      s->date_text[im->series_date_len]) {
    s->date_ns = 0;
    s->date_text[0] = 0;
    if (im->series_date_len < sizeof s->date_text) {
      memcpy(s->date_text, im->series_date, im->series_date_len);
      s->date_text[im->series_date_len] = 0;
      s->date_ns = rfc3339_ns(im->series_date, im->series_date_len);
    }
  }
  return s->date_ns ? s->date_ns + (uint64_t)(im->start_time_s * 1e9) : 0;
}

/* The part (of the message's) that holds the blob: v1 sends it as its own
 * part, v2 inside the one CBOR part. */
static beam_owner_t *blob_owner(const beam_part_t *parts, size_t n, const void *blob) {
  for (size_t i = 0; i < n; i++) {
    const char *b = parts[i].data;
    if ((const char *)blob >= b && (const char *)blob < b + parts[i].size)
      return parts[i].owner;
  }
  return NULL;
}

static void frame_in(dsrc_t *s, const beam_dx_image_t *im, const beam_dx_array_t *a,
                     const beam_part_t *parts, size_t n, uint64_t t_recv) {
  /* Sent as it came: no copy, no decode on the loop thread. */
  beam_msg_t m;
  memset(&m, 0, sizeof m);
  beam_hdr_t *h = &m.hdr;
  h->type = BEAM_MSG_FRAME;
  h->series_id = s->series_id;
  h->frame_id = im->image_id;
  h->seq = im->image_id;
  h->t_acq_ns = acq_ns(s, im);
  h->dtype = (uint8_t)s->dtype;
  h->ndim = 2;
  h->shape[0] = s->height;
  h->shape[1] = s->width;
  h->raw_size = (uint64_t)s->height * s->width * beam_dtype_size(s->dtype);
  h->codec = (uint8_t)a->codec;
  h->nparts = 1;
  h->payload_size = a->size;
  m.npayload = 1;
  m.payload[0].data = a->data;
  m.payload[0].size = a->size;
  m.payload[0].owner = blob_owner(parts, n, a->data);
  beamd_ingest_frame(s->d, &m, t_recv);
}

static const beam_dx_array_t *pick(const dsrc_t *s, const beam_dx_image_t *im) {
  if (s->version == 1 || !s->channel[0])
    return im->nchannels ? &im->data[0] : NULL;
  for (unsigned i = 0; i < im->nchannels; i++)
    if (strcmp(im->data[i].channel, s->channel) == 0)
      return &im->data[i];
  return NULL;
}

static void on_image(dsrc_t *s, const beam_dx_image_t *im, const beam_part_t *parts, size_t n,
                     uint64_t t_recv) {
  beamd_t *d = s->d;
  s->images++;
  if (!s->have_start) {
    s->before_header++;
    warn(s, "image before any series start", "dropped");
    return;
  }
  if (im->series_id != s->series_id) {
    /* Older: left over from an earlier arm (LiberTEM drains these too);
     * newer: its start never reached us. Either way not this series'. */
    s->stale++;
    beam_log_rl(&d->in.rl, LOG_WARNING, "input: dectris: image %llu of series %llu while series "
                "%llu is open: dropped", (unsigned long long)im->image_id,
                (unsigned long long)im->series_id, (unsigned long long)s->series_id);
    return;
  }
  if (s->chan < 0) {
    s->no_channel++;
    return;
  }
  const beam_dx_array_t *a = pick(s, im);
  if (s->pending) {
    if (!a) {
      s->no_channel++;
      warn(s, "first image of a series", "has no data for the channel taken; dropped");
      return;
    }
    /* The series' geometry comes from its first image; nothing has seen
     * the series yet, so it may still change. */
    if (!s->width || !s->height) {
      s->height = a->shape[0];
      s->width = a->shape[1];
      s->pending->shape[0] = s->height;
      s->pending->shape[1] = s->width;
    }
    s->dtype = s->pending->dtype = a->dtype;
    begin_series(s, s->pending);
  }
  const char *why = NULL;
  if (!a) {
    s->no_channel++;
    why = "no data for the channel taken";
  } else if (a->ndim != 2 || a->shape[0] != s->height || a->shape[1] != s->width) {
    s->size_mismatch++;
    why = "its shape differs from the series' detector size";
  } else if (a->dtype != s->dtype) {
    s->unsupported++;
    why = "its dtype differs from the series'";
  } else if (s->verify_hash && s->version == 1 && !hash_ok(im, a)) {
    s->hash_mismatch++;
    why = "its md5 does not match the hash sent with it";
  }
  if (why) {
    /* Like a message that does not decode: its frame number is not taken,
     * so a good copy may still come; if none does, it is missing. */
    beam_log_rl(&d->in.rl, LOG_WARNING, "input: dectris: series %llu image %llu: %s; dropped",
                (unsigned long long)s->series_id, (unsigned long long)im->image_id, why);
    return;
  }
  if (im->image_id < s->next_frame) {
    s->stale++;
    beam_log_rl(&d->in.rl, LOG_WARNING, "input: dectris: image %llu of series %llu again or out "
                "of order (next is %llu): dropped", (unsigned long long)im->image_id,
                (unsigned long long)im->series_id, (unsigned long long)s->next_frame);
    return;
  }
  if (im->image_id > s->next_frame) {
    s->gaps++;
    s->missing += im->image_id - s->next_frame;
    beamd_ingest_missing(d, im->image_id - s->next_frame);
    beam_log_rl(&d->in.rl, LOG_WARNING, "input: dectris: series %llu: images %llu..%llu never "
                "came", (unsigned long long)s->series_id, (unsigned long long)s->next_frame,
                (unsigned long long)im->image_id - 1);
  }
  s->next_frame = im->image_id + 1;
  s->received++;
  frame_in(s, im, a, parts, n, t_recv);
}

static void on_end(dsrc_t *s, uint64_t series_id) {
  beamd_t *d = s->d;
  s->ends++;
  if (!s->have_start || series_id != s->series_id) {
    s->stale++;
    warn(s, "end of a series that is not open", "dropped");
    return;
  }
  if (s->pending)
    begin_series(s, s->pending); /* a series without one image is a series still */
  if (s->expected > s->next_frame) {
    s->missing += s->expected - s->next_frame;
    beamd_ingest_missing(d, s->expected - s->next_frame);
  }
  const beam_series_t *ser = beamd_ingest_series(d);
  if (ser && ser->missing_frames) {
    s->incomplete++;
    BEAM_LOG(LOG_WARNING, "input: dectris: series %llu ended with %llu of %llu images (%llu "
             "never came)", (unsigned long long)series_id, (unsigned long long)s->received,
             (unsigned long long)s->expected, (unsigned long long)ser->missing_frames);
  }
  s->have_start = 0;
  beamd_ingest_series_end(d, series_id, 0);
}

/* ---- messages ------------------------------------------------------------------------ */

/* Decodes one message into s->msg: its stream version, or 0 when it was
 * counted and dropped. */
static int decode(dsrc_t *s, const beam_part_t *parts, size_t n) {
  beamd_t *d = s->d;
  int v = s->format == FMT_AUTO ? beam_dx_detect(parts, n) : s->format;
  const char *why = NULL;
  int rc;
  if (v == 1) {
    s->v1_messages++;
    rc = beam_dx1_parse(parts, n, &s->msg, &why);
  } else if (v == 2) {
    s->v2_messages++;
    rc = n == 1 ? beam_dx2_parse(parts[0].data, parts[0].size, &s->msg, &why) : BEAM_EPROTO;
    if (n != 1)
      why = "dectris v2: a message of more than one part";
  } else {
    beamd_ingest_malformed(d, "dectris message", "neither a JSON (v1) nor a CBOR (v2) message");
    return 0;
  }
  if (rc < 0) {
    if (rc == BEAM_ENOTSUP)
      s->unsupported++;
    else if (rc == BEAM_ESHAPE)
      s->size_mismatch++;
    else
      atomic_fetch_add(&d->in.malformed, 1);
    warn(s, "message dropped", why ? why : "?");
    return 0;
  }
  return v;
}

/* ---- several sockets: merging by image id ------------------------------------------------ */

static void merge_arm(dsrc_t *s);

/* The held image of stream k goes in (decoded again: its parts moved since). */
static void release_held(dsrc_t *s, stream_t *k) {
  beam_part_t bp[BEAMD_ZREAD_MAX_PARTS];
  beamd_zmsg_owner_t zo[BEAMD_ZREAD_MAX_PARTS];
  for (size_t i = 0; i < k->hn; i++) {
    beamd_zmsg_owner_init(&zo[i], &k->hparts[i]);
    bp[i] = (beam_part_t){zmq_msg_data(&k->hparts[i]), zmq_msg_size(&k->hparts[i]), &zo[i].base};
  }
  s->images--; /* counted when it arrived */
  if (decode(s, bp, k->hn) && s->msg.kind == BEAM_DX_IMAGE)
    on_image(s, &s->msg.image, bp, k->hn, beam_now_ns());
  for (size_t i = 0; i < k->hn; i++)
    zmq_msg_close(&k->hparts[i]);
  k->held = 0;
  k->hn = 0;
  beamd_zread_hold(&k->zr, 0);
}

static stream_t *lowest_held(dsrc_t *s) {
  stream_t *lo = NULL;
  for (unsigned i = 0; i < s->nst; i++)
    if (s->st[i].held && (!lo || s->st[i].held_id < lo->held_id))
      lo = &s->st[i];
  return lo;
}

/* Lets in every held image that is next; the lowest one even across a gap
 * when every live socket has one waiting, when merge_wait ran out
 * (force_one), or when every socket has ended the series or drained. Only
 * while the graph has room (lossless: resume comes back here). When
 * nothing is held any more, a series end or a drain waiting for that
 * completes. */
static void merge_progress(dsrc_t *s) {
  beamd_t *d = s->d;
  int all_ended = 1, all_drained = 1;
  for (unsigned i = 0; i < s->nst; i++) {
    all_ended &= s->st[i].ended;
    all_drained &= s->st[i].drained;
  }
  for (stream_t *lo; (lo = lowest_held(s));) {
    int all_wait = 1;
    for (unsigned i = 0; i < s->nst; i++)
      all_wait &= s->st[i].held || s->st[i].ended;
    if (lo->held_id > s->next_frame && !all_wait && !all_ended && !s->drain_pending &&
        !s->force_one)
      break;
    if (!beamd_ingest_room(d)) {
      beamd_ingest_pause(d); /* the graph calls resume, which comes back here */
      break;
    }
    s->force_one = 0;
    release_held(s, lo);
  }
  s->force_one = 0;
  if (!lowest_held(s)) {
    if (all_ended && s->end_pending) {
      s->end_pending = 0;
      for (unsigned i = 0; i < s->nst; i++)
        s->st[i].ended = 0;
      s->ends += s->nst - 1; /* one end per socket, one series end */
      on_end(s, s->end_id);
    }
    if (all_drained && s->drain_pending) {
      s->drain_pending = 0;
      beamd_input_drained(d);
    }
  }
  merge_arm(s);
}

static void merge_timer_cb(uv_timer_t *t) {
  dsrc_t *s = t->data;
  stream_t *lo = lowest_held(s);
  if (lo && beam_now_ns() - lo->held_ns >= s->merge_wait_ns) {
    s->merge_timeouts++;
    s->force_one = 1;
    merge_progress(s);
  }
}

static void merge_arm(dsrc_t *s) {
  int any = lowest_held(s) != NULL;
  if (any && !s->timer_on) {
    uint64_t ms = s->merge_wait_ns / 2000000 + 1;
    uv_timer_start(&s->merge_timer, merge_timer_cb, ms, ms);
  } else if (!any && s->timer_on) {
    uv_timer_stop(&s->merge_timer);
  }
  s->timer_on = any;
}

/* An image of stream k that is ahead of the next id: keep it back. */
static void hold(dsrc_t *s, stream_t *k, beamd_zread_t *zr, size_t n) {
  for (size_t i = 0; i < n; i++) {
    zmq_msg_init(&k->hparts[i]);
    zmq_msg_move(&k->hparts[i], &zr->parts[i]);
  }
  k->hn = n;
  k->held = 1;
  k->held_id = s->msg.image.image_id;
  k->held_ns = beam_now_ns();
  s->merge_held++;
  beamd_zread_hold(zr, 1);
  merge_progress(s);
}

static void stream_end(dsrc_t *s, stream_t *k, uint64_t series_id) {
  if (!s->have_start || series_id != s->series_id) {
    on_end(s, series_id); /* counts it */
    return;
  }
  k->ended = 1;
  s->end_pending = 1;
  s->end_id = series_id;
  merge_progress(s); /* the series ends with its last socket's end */
}

static void handle(beamd_zread_t *zr, const beam_part_t *parts, size_t n, uint64_t t_recv) {
  stream_t *k = zr->ctx;
  dsrc_t *s = k->src;
  beamd_t *d = s->d;
  atomic_fetch_add(&d->in.messages, 1);
  int v = decode(s, parts, n);
  if (!v)
    return;
  switch (s->msg.kind) {
  case BEAM_DX_START:
    on_start(s, &s->msg.start, v);
    break;
  case BEAM_DX_IMAGE:
    if (s->nst > 1 && s->have_start && s->msg.image.series_id == s->series_id &&
        s->msg.image.image_id > s->next_frame && !s->drain_pending && !k->held) {
      s->images++;
      hold(s, k, zr, n);
    } else {
      on_image(s, &s->msg.image, parts, n, t_recv);
      if (s->nst > 1)
        merge_progress(s);
    }
    break;
  case BEAM_DX_END:
    if (s->nst > 1)
      stream_end(s, k, s->msg.end_series_id);
    else
      on_end(s, s->msg.end_series_id);
    break;
  default:
    s->other++;
    beam_log_rl(&d->in.rl, LOG_INFO, "input: dectris: \"%s\" message skipped", s->msg.other_type);
  }
}

/* ---- the source ------------------------------------------------------------------------ */

/* Draining: everything received goes in, held images too (lossless to
 * the end), and the drain is complete when every socket is empty. */
static void stream_drained(beamd_zread_t *zr) {
  stream_t *k = zr->ctx;
  k->drained = 1;
  merge_progress(k->src);
}

static int dsrc_open(beamd_t *d, void **state, const beam_cnode_t *conf, char *err,
                     size_t errlen) {
  dsrc_t *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "input: out of memory");
    return BEAM_ENOMEM;
  }
  *state = s;
  s->d = d;
  uv_timer_init(&d->loop, &s->merge_timer);
  s->merge_timer.data = s;
  s->format = (int)beam_cfg_int(conf, "format", FMT_AUTO);
  s->verify_hash = beam_cfg_bool(conf, "verify_hash", 0);
  s->merge_wait_ns = (uint64_t)(beam_cfg_float(conf, "merge_wait", 0.2) * 1e9);
  const char *ch = beam_cfg_str(conf, "channel");
  snprintf(s->channel, sizeof s->channel, "%s", ch ? ch : "");
  const beam_cnode_t *more = beam_cfg_get(conf, "endpoints");
  s->nst = 1 + (unsigned)beam_cfg_len(more);
  int rc = 0;
  for (unsigned i = 0; i < s->nst && rc == 0; i++) {
    stream_t *k = &s->st[i];
    k->src = s;
    k->zr.ctx = k;
    k->zr.handle = handle;
    k->zr.drained = stream_drained;
    const char *ep = i ? beam_cfg_at(more, i - 1)->scalar : d->cfg->input.endpoint;
    rc = beamd_zread_open(d, &k->zr, ZMQ_PULL, ep, d->cfg->input.bind, d->cfg->input.hwm, 1, err,
                          errlen);
  }
  return rc;
}

static void dsrc_resume(beamd_t *d, void *st) {
  (void)d;
  dsrc_t *s = st;
  if (s->nst > 1)
    merge_progress(s);
  for (unsigned i = 0; i < s->nst; i++)
    beamd_zread_read(&s->st[i].zr);
}

/* The detector counts what ZeroMQ took as delivered: read it all. */
static int dsrc_drain(beamd_t *d, void *st) {
  (void)d;
  dsrc_t *s = st;
  if (s->nst == 1)
    return beamd_zread_drain(&s->st[0].zr);
  s->drain_pending = 1;
  merge_progress(s); /* held images first, in order */
  for (unsigned i = 0; i < s->nst; i++) {
    s->st[i].drained = !s->st[i].zr.zs.open;
    beamd_zread_hold(&s->st[i].zr, 0);
  }
  for (unsigned i = 0; i < s->nst; i++)
    if (!s->st[i].drained)
      beamd_zread_drain(&s->st[i].zr);
  merge_progress(s);
  return 1;
}

static void dsrc_stop(beamd_t *d, void *st) {
  (void)d;
  dsrc_t *s = st;
  for (unsigned i = 0; i < s->nst; i++)
    beamd_zread_stop(&s->st[i].zr);
  uv_timer_stop(&s->merge_timer);
}

static void dsrc_close(beamd_t *d, void *st) {
  dsrc_t *s = st;
  if (!s)
    return;
  beam_series_unref(&s->pending);
  for (unsigned i = 0; i < s->nst; i++) {
    stream_t *k = &s->st[i];
    for (size_t j = 0; k->held && j < k->hn; j++)
      zmq_msg_close(&k->hparts[j]);
    k->held = 0;
    if (k->zr.d)
      beamd_zread_close(&k->zr);
  }
  if (!uv_is_closing((uv_handle_t *)&s->merge_timer))
    uv_close((uv_handle_t *)&s->merge_timer, NULL);
  d->src_garbage = s; /* freed once the loop closed the readers' handles */
}

static void dsrc_stats(beamd_t *d, void *st, json_t *obj) {
  (void)d;
  dsrc_t *s = st;
  json_t *o = json_object();
#define C(name) json_object_set_new(o, #name, json_integer((json_int_t)s->name))
  C(v1_messages);
  C(v2_messages);
  C(starts);
  C(images);
  C(ends);
  C(other);
  C(before_header);
  C(stale);
  C(gaps);
  C(missing);
  C(unsupported);
  C(size_mismatch);
  C(hash_mismatch);
  C(no_channel);
  C(incomplete);
  C(merge_held);
  C(merge_timeouts);
#undef C
  json_object_set_new(o, "sockets", json_integer(s->nst));
  json_object_set_new(o, "series_open", json_boolean(s->have_start));
  if (s->have_start) {
    json_object_set_new(o, "series_id", json_integer((json_int_t)s->series_id));
    json_object_set_new(o, "expected", json_integer((json_int_t)s->expected));
    json_object_set_new(o, "received", json_integer((json_int_t)s->received));
  }
  json_object_set_new(obj, "dectris", o);
}

const beamd_source_ops_t beamd_src_dectris = {
    .mode = "dectris",
    .lossless = 1,
    .params = beamd_dectris_params,
    .open = dsrc_open,
    .resume = dsrc_resume,
    .drain = dsrc_drain,
    .stop = dsrc_stop,
    .close = dsrc_close,
    .stats = dsrc_stats,
};
