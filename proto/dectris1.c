/* DECTRIS SIMPLON stream v1 ("legacy" JSON multipart) decoder, and the
 * byte-level stream detection shared with v2: turns the parts of one
 * ZeroMQ message into a beam_dx_msg_t whose pointers all lead back into
 * those parts.
 *
 * Layouts (shared/notes/detector-streams.md section 1):
 *   dheader  none: [dheader]; basic: + [config]; all: + [dflatfield, blob,
 *            dpixelmask, blob, dcountrate_table, blob]; then an optional
 *            appendix part (header_appendix).
 *   dimage   [dimage, dimage_d, blob, dconfig] + optional appendix.
 *   dseries_end  [dseries_end].
 * The kind comes from part 1's htype, matched by prefix like the reference
 * clients do, so a later minor version ("dimage-1.1") still decodes.
 *
 * Only what one message can prove is checked here: JSON well-formedness,
 * key types, the part count, and blob sizes against shape x dtype (or the
 * decoded size a bitshuffle blob declares). Decoding pixels, the md5 hash
 * and every check against the series (frame order, stale series, image
 * shape vs the header) belong to the caller. This file is not a JSON
 * library and does not log: a rejection is a negative code and a static
 * reason.
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "proto/dectris.h"
#include "proto/err.h"
#include "proto/json_scan.h"

#define R "dectris v1: "
#define FRAMING_HDR 12u /* bitshuffle blob: u64 BE orig size, u32 BE block */

static int fail(const char **why, const char *reason, int code) {
  if (why) *why = reason;
  return code;
}

int beam_dx_detect(const beam_part_t *parts, size_t n) {
  if (!parts || n == 0 || (!parts[0].data && parts[0].size)) return 0;
  const unsigned char *p = parts[0].data;
  size_t len = parts[0].size;
  if (n == 1 && len >= 3 && p[0] == 0xd9 && p[1] == 0xd9 && p[2] == 0xf7) return 2;
  size_t i = 0;
  while (i < len && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
  return i < len && p[i] == '{' ? 1 : 0;
}

static int part_object(const beam_part_t *part, beam_js_t *obj) {
  if (!part->data) return -1;
  return beam_js_object(part->data, part->size, obj);
}

/* Key lookups: 0 found and read, 1 absent (or null where allowed), -1 of
 * the wrong type. */
static int get_u64(beam_js_t obj, const char *key, uint64_t *out) {
  beam_js_t v;
  if (beam_js_get(obj, key, &v) != 1) return 1;
  return beam_js_u64(v, out) ? -1 : 0;
}

/* A part's own htype, when it sends one, must be the part it stands for:
 * a message whose parts are out of order must not decode as another. */
static int htype_ok(beam_js_t obj, const char *prefix) {
  beam_js_t v;
  if (beam_js_get(obj, "htype", &v) != 1) return 1;
  return beam_js_str_prefix(v, prefix);
}

/* ---- shapes ---- */

typedef struct shape_why_s {
  const char *type;  /* shape is not an array of unsigned integers */
  const char *ndim;  /* wrong number of dimensions */
  const char *dim;   /* a dimension is 0 or above UINT32_MAX */
  const char *over;  /* shape x element size overflows 64 bits */
} shape_why_t;

/* Reads shape (sent fast axis first) into a->shape in C order and sets
 * a->ndim and a->raw_size. min_ndim..2 dimensions. */
static int read_shape(beam_js_t obj, beam_dx_array_t *a, size_t elem, unsigned min_ndim,
                      const shape_why_t *w, const char **why) {
  beam_js_t v;
  uint64_t d[2];
  size_t n = 0;
  if (beam_js_get(obj, "shape", &v) != 1 || beam_js_u64_array(v, d, 2, &n))
    return fail(why, w->type, BEAM_EPROTO);
  if (n < min_ndim || n > 2) return fail(why, w->ndim, BEAM_EPROTO);
  uint64_t total = elem;
  for (size_t i = 0; i < n; i++) {
    if (d[i] == 0 || d[i] > UINT32_MAX) return fail(why, w->dim, BEAM_ESHAPE);
    if (total > UINT64_MAX / d[i]) return fail(why, w->over, BEAM_ESHAPE);
    total *= d[i];
  }
  if (total > SIZE_MAX) return fail(why, w->over, BEAM_ESHAPE);
  a->ndim = (uint32_t)n;
  /* [x, y] on the wire is [y, x] in C order. */
  for (size_t i = 0; i < n; i++) a->shape[i] = (uint32_t)d[n - 1 - i];
  a->raw_size = total;
  return 0;
}

/* ---- series start ---- */

/* Config keys by kind: the reason for a wrong type names the key. */
#define CFG_WHY(k, what) R "config: " k " is not " what
typedef struct cfg_key_s {
  const char *key;
  size_t off;
  const char *why;
} cfg_key_t;

#define CD(k, f) {k, offsetof(beam_dx_start_t, f), CFG_WHY(k, "a number")}
static const cfg_key_t cfg_doubles[] = {
    CD("count_time", count_time),
    CD("frame_time", frame_time),
    CD("photon_energy", energy_ev),
    CD("wavelength", wavelength_a),
    CD("detector_distance", distance_m),
    CD("x_pixel_size", pixel_size_x),
    CD("y_pixel_size", pixel_size_y),
    CD("beam_center_x", beam_center_x),
    CD("beam_center_y", beam_center_y),
    CD("sensor_thickness", sensor_thickness_m),
};
#undef CD
#define CU(k, f) {k, offsetof(beam_dx_start_t, f), CFG_WHY(k, "an unsigned 32-bit integer")}
static const cfg_key_t cfg_u32[] = {
    CU("x_pixels_in_detector", width),
    CU("y_pixels_in_detector", height),
    CU("bit_depth_image", bit_depth_image),
    CU("bit_depth_readout", bit_depth_readout),
};
#undef CU
#define CU(k, f) {k, offsetof(beam_dx_start_t, f), CFG_WHY(k, "an unsigned integer")}
static const cfg_key_t cfg_u64[] = {
    CU("nimages", nimages),
    CU("ntrigger", ntrigger),
    CU("countrate_correction_count_cutoff", saturation_value),
};
#undef CU

/* A config integer. The config part is the detector's generic key/value
 * description, so an integral number written as 1.0 or 1e3 is taken too
 * (up to 2^53, where doubles stop being exact); null counts as not sent.
 * 0 read, 1 absent, -1 wrong type. */
static int cfg_uint(beam_js_t cfg, const char *key, uint64_t max, uint64_t *out) {
  beam_js_t v;
  double d;
  if (beam_js_get(cfg, key, &v) != 1 || beam_js_typeof(v) == BEAM_JS_NULL) return 1;
  if (beam_js_u64(v, out) == 0) return *out <= max ? 0 : -1;
  if (beam_js_num(v, &d) || !(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return -1;
  *out = (uint64_t)d;
  return *out <= max ? 0 : -1;
}

static int parse_config(beam_js_t cfg, beam_dx_start_t *s, const char **why) {
  char *base = (char *)s;
  beam_js_t v;
  for (size_t i = 0; i < sizeof cfg_doubles / sizeof *cfg_doubles; i++) {
    if (beam_js_get(cfg, cfg_doubles[i].key, &v) != 1 || beam_js_typeof(v) == BEAM_JS_NULL)
      continue;
    double d;
    if (beam_js_num(v, &d)) return fail(why, cfg_doubles[i].why, BEAM_EPROTO);
    memcpy(base + cfg_doubles[i].off, &d, sizeof d);
  }
  for (size_t i = 0; i < sizeof cfg_u32 / sizeof *cfg_u32; i++) {
    uint64_t x;
    int r = cfg_uint(cfg, cfg_u32[i].key, UINT32_MAX, &x);
    if (r < 0) return fail(why, cfg_u32[i].why, BEAM_EPROTO);
    if (r == 0) {
      uint32_t x32 = (uint32_t)x;
      memcpy(base + cfg_u32[i].off, &x32, sizeof x32);
    }
  }
  for (size_t i = 0; i < sizeof cfg_u64 / sizeof *cfg_u64; i++) {
    uint64_t x;
    int r = cfg_uint(cfg, cfg_u64[i].key, UINT64_MAX, &x);
    if (r < 0) return fail(why, cfg_u64[i].why, BEAM_EPROTO);
    if (r == 0) {
      memcpy(base + cfg_u64[i].off, &x, sizeof x);
      if (cfg_u64[i].off == offsetof(beam_dx_start_t, saturation_value)) s->has_saturation = 1;
    }
  }
  if (beam_js_get(cfg, "trigger_mode", &v) == 1 && beam_js_typeof(v) != BEAM_JS_NULL &&
      beam_js_str_copy(v, s->trigger_mode, sizeof s->trigger_mode) < 0)
    return fail(why, R "config: trigger_mode is not a string of at most 7 bytes", BEAM_EPROTO);

  switch (s->bit_depth_image) {
  case 8: s->dtype = BEAM_DT_U8; break;
  case 16: s->dtype = BEAM_DT_U16; break;
  case 32: s->dtype = BEAM_DT_U32; break;
  default: s->dtype = BEAM_DT_NONE; break; /* the first image tells */
  }
  /* External/internal enable: one frame per trigger (the gate or the
   * enable length sets the exposure); otherwise nimages per trigger. A
   * missing ntrigger is SIMPLON's default of 1. */
  uint64_t ntrig = s->ntrigger ? s->ntrigger : 1;
  if (strcmp(s->trigger_mode, "exte") == 0 || strcmp(s->trigger_mode, "inte") == 0)
    s->expected_frames = s->ntrigger;
  else if (s->nimages && ntrig <= UINT64_MAX / s->nimages)
    s->expected_frames = s->nimages * ntrig;
  else
    s->expected_frames = 0; /* unknown (not sent, or no count fits) */
  return 0;
}

typedef struct arr_desc_s {
  const char *htype;     /* prefix */
  const char *type;      /* the only dtype name v1 sends for it */
  beam_dtype_t dtype;
  const char *not_json;
  const char *bad_htype;
  const char *bad_type;
  const char *bad_size;
  shape_why_t shape;
} arr_desc_t;

#define ARR_DESC(name, tname, dt)                                                        \
  {                                                                                      \
    name "-", tname, dt, R name " part is not a JSON object", R name ": unexpected htype", \
        R name ": type is not \"" tname "\"",                                            \
        R name ": blob size does not match shape x type",                                \
    {                                                                                    \
      R name ": shape is not an array of unsigned integers",                             \
          R name ": shape is not [x] or [x, y]", R name ": zero or too large dimension", \
          R name ": shape x type overflows"                                              \
    }                                                                                    \
  }
static const arr_desc_t arr_flat = ARR_DESC("dflatfield", "float32", BEAM_DT_F32);
static const arr_desc_t arr_mask = ARR_DESC("dpixelmask", "uint32", BEAM_DT_U32);
static const arr_desc_t arr_rate = ARR_DESC("dcountrate_table", "float32", BEAM_DT_F32);
#undef ARR_DESC

/* A header array: its JSON description part, then the raw little-endian
 * blob part. */
static int parse_array(const beam_part_t *hdr, const beam_part_t *blob, const arr_desc_t *d,
                       beam_dx_array_t *a, const char **why) {
  beam_js_t obj, v;
  if (part_object(hdr, &obj)) return fail(why, d->not_json, BEAM_EPROTO);
  if (!htype_ok(obj, d->htype)) return fail(why, d->bad_htype, BEAM_EPROTO);
  if (beam_js_get(obj, "type", &v) != 1 || beam_js_typeof(v) != BEAM_JS_STRING)
    return fail(why, d->bad_type, BEAM_EPROTO);
  if (!beam_js_str_eq(v, d->type)) return fail(why, d->bad_type, BEAM_ENOTSUP);
  int rc = read_shape(obj, a, beam_dtype_size(d->dtype), 1, &d->shape, why);
  if (rc) return rc;
  if (blob->size != a->raw_size) return fail(why, d->bad_size, BEAM_ESHAPE);
  a->data = blob->data;
  a->size = blob->size;
  a->codec = BEAM_CODEC_RAW;
  a->dtype = d->dtype;
  return 0;
}

static int parse_header(const beam_part_t *parts, size_t n, beam_js_t h, beam_dx_msg_t *out,
                        const char **why) {
  beam_dx_start_t *s = &out->start;
  beam_js_t v;
  int r = get_u64(h, "series", &s->series_id);
  if (r > 0) return fail(why, R "dheader: no series", BEAM_EPROTO);
  if (r < 0) return fail(why, R "dheader: series is not an unsigned integer", BEAM_EPROTO);
  if (beam_js_get(h, "header_detail", &v) != 1)
    return fail(why, R "dheader: no header_detail", BEAM_EPROTO);
  if (beam_js_typeof(v) != BEAM_JS_STRING)
    return fail(why, R "dheader: header_detail is not a string", BEAM_EPROTO);
  size_t layout;
  if (beam_js_str_eq(v, "none")) s->header_detail = 0, layout = 1;
  else if (beam_js_str_eq(v, "basic")) s->header_detail = 1, layout = 2;
  else if (beam_js_str_eq(v, "all")) s->header_detail = 2, layout = 8;
  else return fail(why, R "dheader: unknown header_detail", BEAM_ENOTSUP);
  if (n < layout)
    return fail(why, R "dheader: truncated multipart (fewer parts than header_detail needs)",
                BEAM_EPROTO);
  if (n > layout + 1)
    return fail(why, R "dheader: more parts than header_detail and an appendix", BEAM_EPROTO);

  if (layout >= 2) {
    beam_js_t cfg;
    if (part_object(&parts[1], &cfg)) return fail(why, R "config part is not a JSON object", BEAM_EPROTO);
    int rc = parse_config(cfg, s, why);
    if (rc) return rc;
    s->have_config = 1;
    s->config = parts[1].data;
    s->config_len = parts[1].size;
  }
  if (layout >= 8) {
    int rc = parse_array(&parts[2], &parts[3], &arr_flat, &s->flatfield[0], why);
    if (!rc) rc = parse_array(&parts[4], &parts[5], &arr_mask, &s->pixel_mask[0], why);
    if (!rc) rc = parse_array(&parts[6], &parts[7], &arr_rate, &s->countrate, why);
    if (rc) return rc;
    s->nflatfield = 1;
    s->npixel_mask = 1;
  }
  if (n == layout + 1) {
    s->user_data = parts[layout].data;
    s->user_data_len = parts[layout].size;
  }
  out->kind = BEAM_DX_START;
  out->end_series_id = s->series_id;
  return 0;
}

/* ---- image ---- */

static const shape_why_t image_shape_why = {
    R "dimage_d: shape is not an array of unsigned integers",
    R "dimage_d: shape is not [x, y]",
    R "dimage_d: zero or too large dimension",
    R "dimage_d: shape x type overflows",
};

/* The encodings of the grammar [bs<BIT>][[-]lz4][<|>] that beamd decodes:
 * little-endian only, bitshuffle only together with LZ4. bits = the
 * bitshuffle element size in bits, 0 when not shuffled. */
static const struct {
  const char *name;
  beam_codec_t codec;
  unsigned bits;
} encodings[] = {
    {"<", BEAM_CODEC_RAW, 0},
    {"lz4<", BEAM_CODEC_LZ4_BLOCK, 0},
    {"bs8-lz4<", BEAM_CODEC_BSLZ4, 8},
    {"bs16-lz4<", BEAM_CODEC_BSLZ4, 16},
    {"bs32-lz4<", BEAM_CODEC_BSLZ4, 32},
};

static uint64_t rbe64(const unsigned char *p) {
  uint64_t x = 0;
  for (int i = 0; i < 8; i++) x = (x << 8) | p[i];
  return x;
}

static int parse_image(const beam_part_t *parts, size_t n, beam_js_t h, beam_dx_msg_t *out,
                       const char **why) {
  beam_dx_image_t *im = &out->image;
  beam_dx_array_t *a = &im->data[0];
  beam_js_t d, c, v;
  if (n < 4) return fail(why, R "dimage: truncated multipart (fewer than 4 parts)", BEAM_EPROTO);
  if (n > 5) return fail(why, R "dimage: more than 4 parts and an appendix", BEAM_EPROTO);

  int r = get_u64(h, "series", &im->series_id);
  if (r > 0) return fail(why, R "dimage: no series", BEAM_EPROTO);
  if (r < 0) return fail(why, R "dimage: series is not an unsigned integer", BEAM_EPROTO);
  r = get_u64(h, "frame", &im->image_id);
  if (r > 0) return fail(why, R "dimage: no frame", BEAM_EPROTO);
  if (r < 0) return fail(why, R "dimage: frame is not an unsigned integer", BEAM_EPROTO);
  if (beam_js_get(h, "hash", &v) == 1 && beam_js_typeof(v) != BEAM_JS_NULL &&
      beam_js_str_raw(v, &im->hash, &im->hash_len))
    return fail(why, R "dimage: hash is not a string", BEAM_EPROTO);

  /* dimage_d: what the blob is. */
  if (part_object(&parts[1], &d)) return fail(why, R "dimage_d part is not a JSON object", BEAM_EPROTO);
  if (!htype_ok(d, "dimage_d-")) return fail(why, R "dimage_d: unexpected htype", BEAM_EPROTO);
  if (beam_js_get(d, "type", &v) != 1 || beam_js_typeof(v) != BEAM_JS_STRING)
    return fail(why, R "dimage_d: type is not a string", BEAM_EPROTO);
  if (beam_js_str_eq(v, "uint8")) a->dtype = BEAM_DT_U8;
  else if (beam_js_str_eq(v, "uint16")) a->dtype = BEAM_DT_U16;
  else if (beam_js_str_eq(v, "uint32")) a->dtype = BEAM_DT_U32;
  else return fail(why, R "unknown dtype", BEAM_ENOTSUP);
  size_t elem = beam_dtype_size(a->dtype);
  if (beam_js_get(d, "encoding", &v) != 1 || beam_js_typeof(v) != BEAM_JS_STRING)
    return fail(why, R "dimage_d: encoding is not a string", BEAM_EPROTO);
  size_t e = 0, ne = sizeof encodings / sizeof *encodings;
  while (e < ne && !beam_js_str_eq(v, encodings[e].name)) e++;
  if (e == ne) return fail(why, R "unknown encoding", BEAM_ENOTSUP);
  /* beam_codec_decode unshuffles with the dtype's element size, so a blob
   * shuffled with another one is valid data beamd does not decode. */
  if (encodings[e].bits && encodings[e].bits != 8 * elem)
    return fail(why, R "dimage_d: bitshuffle element size differs from the type", BEAM_ENOTSUP);
  a->codec = encodings[e].codec;
  int rc = read_shape(d, a, elem, 2, &image_shape_why, why);
  if (rc) return rc;
  uint64_t size;
  r = get_u64(d, "size", &size);
  if (r < 0) return fail(why, R "dimage_d: size is not an unsigned integer", BEAM_EPROTO);
  if (r == 0 && size != parts[2].size)
    return fail(why, R "dimage_d: size does not match the blob part", BEAM_ESHAPE);

  /* The blob, against the shape as far as its framing tells without
   * decoding; a bare LZ4 block declares nothing. */
  const beam_part_t *blob = &parts[2];
  if (!blob->data && blob->size) return fail(why, R "dimage: blob part has no data", BEAM_EPROTO);
  if (a->codec == BEAM_CODEC_RAW && blob->size != a->raw_size)
    return fail(why, R "dimage: raw blob size does not match shape x type", BEAM_ESHAPE);
  if (a->codec == BEAM_CODEC_BSLZ4) {
    if (blob->size < FRAMING_HDR) return fail(why, R "dimage: compressed blob under 12 bytes", BEAM_ESHAPE);
    if (rbe64(blob->data) != a->raw_size)
      return fail(why, R "decoded size does not match the shape", BEAM_ESHAPE);
  }
  a->data = blob->data;
  a->size = blob->size;

  /* dconfig: detector clock ticks of the exposure. */
  if (part_object(&parts[3], &c)) return fail(why, R "dconfig part is not a JSON object", BEAM_EPROTO);
  if (!htype_ok(c, "dconfig-")) return fail(why, R "dconfig: unexpected htype", BEAM_EPROTO);
  static const char *const tick_why[3] = {
      R "dconfig: start_time is not an unsigned integer",
      R "dconfig: stop_time is not an unsigned integer",
      R "dconfig: real_time is not an unsigned integer",
  };
  static const char *const tick_key[3] = {"start_time", "stop_time", "real_time"};
  uint64_t *tick[3] = {&im->start_ticks, &im->stop_ticks, &im->real_ticks};
  int sent = 0;
  for (int i = 0; i < 3; i++) {
    r = get_u64(c, tick_key[i], tick[i]);
    if (r < 0) return fail(why, tick_why[i], BEAM_EPROTO);
    sent += r == 0;
  }
  im->has_ticks = sent == 3;

  if (n == 5) {
    im->user_data = parts[4].data;
    im->user_data_len = parts[4].size;
  }
  im->nchannels = 1;
  out->kind = BEAM_DX_IMAGE;
  out->end_series_id = im->series_id;
  return 0;
}

/* ---- entry ---- */

static void init_msg(beam_dx_msg_t *out) {
  memset(out, 0, sizeof *out);
  out->version = 1;
  beam_dx_start_t *s = &out->start;
  s->count_time = s->frame_time = s->energy_ev = s->wavelength_a = s->distance_m = NAN;
  s->pixel_size_x = s->pixel_size_y = s->beam_center_x = s->beam_center_y = NAN;
  s->sensor_thickness_m = NAN;
  for (int i = 0; i < BEAM_DX_MAX_CHANNELS; i++) s->threshold_ev[i] = NAN;
  out->image.start_time_s = out->image.stop_time_s = out->image.real_time_s = NAN;
}

int beam_dx1_parse(const beam_part_t *parts, size_t n, beam_dx_msg_t *out, const char **why) {
  if (!out || (!parts && n)) return fail(why, R "invalid argument", BEAM_EINVAL);
  init_msg(out);
  if (n == 0) return fail(why, R "no parts", BEAM_EPROTO);
  beam_js_t h, v;
  if (part_object(&parts[0], &h)) return fail(why, R "part 1 is not a JSON object", BEAM_EPROTO);
  if (beam_js_get(h, "htype", &v) != 1 || beam_js_typeof(v) != BEAM_JS_STRING)
    return fail(why, R "part 1 has no htype string", BEAM_EPROTO);
  int rc;
  if (beam_js_str_prefix(v, "dheader-")) {
    rc = parse_header(parts, n, h, out, why);
  } else if (beam_js_str_prefix(v, "dimage-")) {
    rc = parse_image(parts, n, h, out, why);
  } else if (beam_js_str_prefix(v, "dseries_end-")) {
    if (n != 1) return fail(why, R "dseries_end: more than one part", BEAM_EPROTO);
    int r = get_u64(h, "series", &out->end_series_id);
    if (r > 0) return fail(why, R "dseries_end: no series", BEAM_EPROTO);
    if (r < 0) return fail(why, R "dseries_end: series is not an unsigned integer", BEAM_EPROTO);
    out->kind = BEAM_DX_END;
    rc = 0;
  } else {
    return fail(why, R "unknown htype", BEAM_ENOTSUP);
  }
  if (rc) out->kind = BEAM_DX_NONE;
  return rc;
}
