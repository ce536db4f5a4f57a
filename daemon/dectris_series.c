/* The series side of the DECTRIS source (dectris_series.h): what a start
 * message makes of a beamd series (geometry, metadata JSON, the detector's
 * mask / flat field / count-rate table as series arrays), the checks of
 * each image against it (series id, frame number, shape, dtype, md5), the
 * frame handed to the ingest core with its blob as it came, and the end
 * (frames that never came counted, the end flagged INCOMPLETE). Not the
 * sockets or the decoding: src_dectris.c. Loop thread only. */
#include "daemon/dectris_series.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/beamd.h"
#include "daemon/md5hex.h"

#define META_MAX (1u << 20)  /* series metadata JSON (the detector config) */
#define INLINE_MAX 64        /* byte strings kept inline in it */

static void warn(beamd_dxs_t *s, const char *what, const char *why) {
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

static char *series_meta(beamd_dxs_t *s, const beam_dx_start_t *st, int version, int *flat_done) {
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
static void add_array(beamd_dxs_t *s, beam_series_t *ser, const char *name, const beam_dx_array_t *a) {
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

static int channel_index(const beamd_dxs_t *s, const beam_dx_start_t *st) {
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
static void begin_series(beamd_dxs_t *s, beam_series_t *ser) {
  s->pending = NULL;
  beamd_ingest_series_start(s->d, ser);
}

int beamd_dxs_start(beamd_dxs_t *s, const beam_dx_start_t *st, int version) {
  beamd_t *d = s->d;
  if (s->have_start && s->series_id == st->series_id && s->version == version)
    return 0; /* the same start again (a split stream's every socket, a re-arm) */
  if (s->pending)
    beam_series_unref(&s->pending);
  s->starts++;
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
    return 1;
  int flat_done = 0;
  char *meta = series_meta(s, st, version, &flat_done);
  uint32_t shape[2] = {st->height, st->width};
  beam_series_t *ser = beam_series_new(st->series_id, st->dtype, 2, shape, meta,
                                       meta ? strlen(meta) : 0);
  free(meta);
  if (!ser) {
    warn(s, "series start", "out of memory");
    s->have_start = 0;
    return 1;
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
  return 1;
}

/* ---- images ------------------------------------------------------------------------ */

static int hash_ok(const beam_dx_image_t *im, const beam_dx_array_t *a) {
  if (!im->hash || im->hash_len != 32)
    return 0;
  char want[33];
  beamd_md5_hex(a->data, a->size, want);
  for (int i = 0; i < 32; i++)
    if ((im->hash[i] | 0x20) != want[i]) /* either case */
      return 0;
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
static uint64_t acq_ns(beamd_dxs_t *s, const beam_dx_image_t *im) {
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

static void frame_in(beamd_dxs_t *s, const beam_dx_image_t *im, const beam_dx_array_t *a,
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

static const beam_dx_array_t *pick(const beamd_dxs_t *s, const beam_dx_image_t *im) {
  if (s->version == 1 || !s->channel[0])
    return im->nchannels ? &im->data[0] : NULL;
  for (unsigned i = 0; i < im->nchannels; i++)
    if (strcmp(im->data[i].channel, s->channel) == 0)
      return &im->data[i];
  return NULL;
}

void beamd_dxs_image(beamd_dxs_t *s, const beam_dx_image_t *im, const beam_part_t *parts,
                     size_t n, uint64_t t_recv) {
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

void beamd_dxs_end(beamd_dxs_t *s, uint64_t series_id) {
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


void beamd_dxs_stats(const beamd_dxs_t *s, json_t *o) {
#define C(name) json_object_set_new(o, #name, json_integer((json_int_t)s->name))
  C(starts);
  C(images);
  C(ends);
  C(before_header);
  C(stale);
  C(gaps);
  C(missing);
  C(unsupported);
  C(size_mismatch);
  C(hash_mismatch);
  C(no_channel);
  C(incomplete);
#undef C
  json_object_set_new(o, "series_open", json_boolean(s->have_start));
  if (s->have_start) {
    json_object_set_new(o, "series_id", json_integer((json_int_t)s->series_id));
    json_object_set_new(o, "expected", json_integer((json_int_t)s->expected));
    json_object_set_new(o, "received", json_integer((json_int_t)s->received));
  }
}

void beamd_dxs_fini(beamd_dxs_t *s) { beam_series_unref(&s->pending); }
