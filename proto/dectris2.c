/* DECTRIS SIMPLON stream v2 (and PSI Jungfraujoch's superset): one CBOR
 * message per event into beam_dx_msg_t, and the start message's map as
 * JSON for the series metadata (beam_dx_meta_json, which also does v1's
 * copy). Field facts: shared/notes/detector-streams.md sections 2 and 3;
 * the checks are those of DECTRIS's reference decoder (stream2.c), section
 * 2.5. Not for v1's JSON messages (proto/dectris1.c), not for anything that
 * needs the series (image before start, gaps): the caller holds that.
 *
 * CBOR: our own walker (proto/cbor.h), not libcbor: proto/ stays libc-only,
 * pixel blobs stay where they are (zero-copy), nothing is allocated per
 * message, and the item types DECTRIS uses take a few hundred lines.
 * Indefinite-length arrays and maps are accepted (tinycbor senders, which
 * Jungfraujoch is, can write them); indefinite-length strings are rejected
 * (BEAM_EPROTO) because a chunked blob cannot be borrowed as one pointer.
 *
 * Decisions where the spec is silent:
 *   - the message must be exactly one item: bytes after the top-level map
 *     are rejected (a ZeroMQ message has no padding);
 *   - a known key twice in one message is rejected (RFC 8949 calls such a
 *     map invalid; accepting it would make "which one wins" an accident);
 *   - a map key of 64 bytes or more is unknown and skipped, as stream2.c's
 *     MAX_KEY_LEN does, even when it starts like a known one;
 *   - series_unique_id is cut at 63 bytes (on a UTF-8 boundary): the full
 *     text is still in config; channel names over 63 bytes are refused
 *     (BEAM_ENOTSUP), since cutting them could make two channels one;
 *   - threshold_energy is matched to channels after the whole map is read,
 *     so the two may come in either order; thresholds of channels that are
 *     not in `channels` are dropped (the recorded EIGER2 start has one);
 *   - an image needs image_id and data (BEAM_EPROTO without): a missing
 *     image_id would read as frame 0;
 *   - the lz4 modifier is not checked (the tag document says 0); bslz4's
 *     and bszstd's must equal the element size;
 *   - tag 1040 (column-major MultiDimArray) is BEAM_ENOTSUP, a dims array
 *     of other than 2 entries BEAM_ENOTSUP, a dimension over 2^32-1
 *     BEAM_ESHAPE;
 *   - a calibration, metadata or unknown type is still walked to its end,
 *     so a malformed message is BEAM_EPROTO whatever its type;
 *   - countrate_correction_lookup_table may also come as a MultiDimArray;
 *   - a v2 start has have_config = 1 (config is the message itself);
 *     beam_dx_meta_json writes "{}" for a start without config (v1
 *     header_detail none).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/cbor.h"
#include "proto/dectris.h"
#include "proto/err.h"
#include "proto/proto.h"

#define R(msg) "dectris v2: " msg
#define KEY_MAX 64 /* keys this long or longer are unknown (stream2.c MAX_KEY_LEN) */
#define TAG_SELF_DESCRIBE 55799u
#define TAG_MDA 40u           /* RFC 8746 multi-dimensional array, row-major */
#define TAG_MDA_COLMAJOR 1040u
#define TAG_COMPRESSED 56500u /* DECTRIS: [algorithm, modifier, bytes] */
#define BLOB_HDR 12u          /* u64 BE orig_size, u32 BE block size */

static int fail(const char **why, const char *reason, int code) {
  if (why) *why = reason;
  return code;
}

/* The walker's reasons with our prefix, indexed by beam_cbor_err_t. */
static const char *const cbor_why[BEAM_CBOR_ECOUNT_] = {
    [BEAM_CBOR_OK] = R("malformed CBOR"),
    [BEAM_CBOR_ETRUNC] = R("CBOR item runs past the end of the message"),
    [BEAM_CBOR_ERESERVED] = R("CBOR reserved additional information"),
    [BEAM_CBOR_EINDEF_STR] = R("indefinite-length CBOR string"),
    [BEAM_CBOR_EBREAK] = R("unexpected CBOR break"),
    [BEAM_CBOR_EDEPTH] = R("CBOR nesting too deep"),
    [BEAM_CBOR_EODDMAP] = R("CBOR map key without a value"),
    [BEAM_CBOR_ESIMPLE] = R("CBOR two-byte simple value below 32"),
};

typedef struct dx_s {
  beam_cbor_t c;
  const char **why;
} dx_t;

static int cbor_fail(dx_t *x) {
  unsigned e = x->c.err;
  return fail(x->why, e < BEAM_CBOR_ECOUNT_ ? cbor_why[e] : cbor_why[0], BEAM_EPROTO);
}

static int rd(dx_t *x, beam_cbor_item_t *it) {
  return beam_cbor_read(&x->c, it) ? cbor_fail(x) : 0;
}
static int skip(dx_t *x, unsigned depth) {
  return beam_cbor_skip(&x->c, depth) ? cbor_fail(x) : 0;
}
static int next(dx_t *x, beam_cbor_iter_t *k) {
  int r = beam_cbor_next(&x->c, k);
  return r < 0 ? cbor_fail(x) : r;
}

/* Reads one item at *depth, stepping over any tags on it (tag 0 on
 * arm_date, tag 1 on times): plain values carry no meaning in their tags.
 * *depth ends as the depth of the untagged item. */
static int rd_plain(dx_t *x, unsigned *depth, beam_cbor_item_t *it) {
  for (;;) {
    if (rd(x, it)) return BEAM_EPROTO;
    if (it->major != BEAM_CBOR_TAG) return 0;
    if (*depth >= BEAM_CBOR_MAX_DEPTH) return fail(x->why, cbor_why[BEAM_CBOR_EDEPTH], BEAM_EPROTO);
    (*depth)++;
  }
}

static uint64_t rbe64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return v;
}

/* ---- known fields ---- */

enum {
  K_START = 1,
  K_IMAGE = 2,
  K_END = 4,
};

typedef enum field_e {
  F_SERIES_ID,
  F_SERIES_UNIQUE_ID,
  F_IMAGE_SIZE_X,
  F_IMAGE_SIZE_Y,
  F_IMAGE_DTYPE,
  F_NUMBER_OF_IMAGES,
  F_COUNT_TIME,
  F_FRAME_TIME,
  F_INCIDENT_ENERGY,
  F_INCIDENT_WAVELENGTH,
  F_PIXEL_SIZE_X,
  F_PIXEL_SIZE_Y,
  F_BEAM_CENTER_X,
  F_BEAM_CENTER_Y,
  F_SENSOR_THICKNESS,
  F_DETECTOR_DISTANCE,
  F_SATURATION_VALUE,
  F_ERROR_VALUE,
  F_MAGIC_NUMBER,
  F_CHANNELS,
  F_THRESHOLD_ENERGY,
  F_FLATFIELD,
  F_PIXEL_MASK,
  F_COUNTRATE,
  F_USER_DATA,
  F_IMAGE_ID,
  F_START_TIME,
  F_STOP_TIME,
  F_REAL_TIME,
  F_DATA,
  F_ARM_DATE,
  F_SERIES_DATE,
  F_COUNT_
} field_t;

/* Name, the message types it belongs to, and the reason when its value
 * has the wrong CBOR type. */
static const struct {
  const char *name;
  unsigned kinds;
  const char *why;
} fields[F_COUNT_] = {
#define FLD(id, name, kinds, what) [id] = {name, kinds, R(name " is not " what)}
    FLD(F_SERIES_ID, "series_id", K_START | K_IMAGE | K_END, "an unsigned integer"),
    FLD(F_SERIES_UNIQUE_ID, "series_unique_id", K_START, "a text string"),
    FLD(F_IMAGE_SIZE_X, "image_size_x", K_START, "an unsigned integer"),
    FLD(F_IMAGE_SIZE_Y, "image_size_y", K_START, "an unsigned integer"),
    FLD(F_IMAGE_DTYPE, "image_dtype", K_START, "a text string"),
    FLD(F_NUMBER_OF_IMAGES, "number_of_images", K_START, "an unsigned integer"),
    FLD(F_COUNT_TIME, "count_time", K_START, "a number"),
    FLD(F_FRAME_TIME, "frame_time", K_START, "a number"),
    FLD(F_INCIDENT_ENERGY, "incident_energy", K_START, "a number"),
    FLD(F_INCIDENT_WAVELENGTH, "incident_wavelength", K_START, "a number"),
    FLD(F_PIXEL_SIZE_X, "pixel_size_x", K_START, "a number"),
    FLD(F_PIXEL_SIZE_Y, "pixel_size_y", K_START, "a number"),
    FLD(F_BEAM_CENTER_X, "beam_center_x", K_START, "a number"),
    FLD(F_BEAM_CENTER_Y, "beam_center_y", K_START, "a number"),
    FLD(F_SENSOR_THICKNESS, "sensor_thickness", K_START, "a number"),
    FLD(F_DETECTOR_DISTANCE, "detector_distance", K_START, "a number"),
    FLD(F_SATURATION_VALUE, "saturation_value", K_START, "an unsigned integer"),
    FLD(F_ERROR_VALUE, "error_value", K_START, "an integer"),
    FLD(F_MAGIC_NUMBER, "magic_number", K_START, "an unsigned integer"),
    FLD(F_CHANNELS, "channels", K_START, "an array of text strings"),
    FLD(F_THRESHOLD_ENERGY, "threshold_energy", K_START, "a map of channel to number"),
    FLD(F_FLATFIELD, "flatfield", K_START, "a map of channel to MultiDimArray"),
    FLD(F_PIXEL_MASK, "pixel_mask", K_START, "a map of channel to MultiDimArray"),
    FLD(F_COUNTRATE, "countrate_correction_lookup_table", K_START, "a typed array"),
    FLD(F_USER_DATA, "user_data", K_START | K_IMAGE, "a CBOR item"),
    FLD(F_IMAGE_ID, "image_id", K_IMAGE, "an unsigned integer"),
    FLD(F_START_TIME, "start_time", K_IMAGE, "a Rational [num, den]"),
    FLD(F_STOP_TIME, "stop_time", K_IMAGE, "a Rational [num, den]"),
    FLD(F_REAL_TIME, "real_time", K_IMAGE, "a Rational [num, den]"),
    FLD(F_DATA, "data", K_IMAGE, "a map of channel to MultiDimArray"),
    FLD(F_ARM_DATE, "arm_date", K_START, "a DateTime text"),
    FLD(F_SERIES_DATE, "series_date", K_IMAGE, "a DateTime text"),
#undef FLD
};

static int field_of(const beam_cbor_item_t *key, unsigned kind) {
  if (key->val >= KEY_MAX) return -1;
  for (int f = 0; f < F_COUNT_; f++)
    if ((fields[f].kinds & kind) && beam_cbor_text_is(key, fields[f].name)) return f;
  return -1;
}

/* ---- plain values ---- */

static int get_u64(dx_t *x, unsigned depth, field_t f, uint64_t *v) {
  beam_cbor_item_t it;
  if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_UINT) return fail(x->why, fields[f].why, BEAM_EPROTO);
  *v = it.val;
  return 0;
}

static int get_u32(dx_t *x, unsigned depth, field_t f, uint32_t *v) {
  uint64_t u;
  if (get_u64(x, depth, f, &u)) return BEAM_EPROTO;
  if (u > UINT32_MAX) return fail(x->why, R("image size over 2^32-1"), BEAM_ENOTSUP);
  *v = (uint32_t)u;
  return 0;
}

/* Floats may come as integers too (an energy of 12400 eV is an integer). */
static int get_num(dx_t *x, unsigned depth, field_t f, double *v) {
  beam_cbor_item_t it;
  if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
  if (beam_cbor_number(&it, v)) return fail(x->why, fields[f].why, BEAM_EPROTO);
  return 0;
}

static int get_text(dx_t *x, unsigned depth, field_t f, beam_cbor_item_t *it) {
  if (rd_plain(x, &depth, it)) return BEAM_EPROTO;
  if (it->major != BEAM_CBOR_TEXT) return fail(x->why, fields[f].why, BEAM_EPROTO);
  return 0;
}

/* NUL-terminated copy cut to fit dst, never in the middle of a UTF-8
 * sequence. */
static void copy_cut(char *dst, size_t cap, const uint8_t *s, size_t n) {
  if (n >= cap) {
    n = cap - 1;
    while (n > 0 && (s[n] & 0xc0) == 0x80) n--; /* s[n] would start the next piece */
  }
  memcpy(dst, s, n);
  dst[n] = 0;
}

/* A channel name: refused when it does not fit (cutting could merge two). */
static int get_channel(dx_t *x, const beam_cbor_item_t *it, char dst[BEAM_DX_NAME_MAX]) {
  if (it->major != BEAM_CBOR_TEXT) return fail(x->why, R("channel name is not a text string"), BEAM_EPROTO);
  if (it->val >= BEAM_DX_NAME_MAX) return fail(x->why, R("channel name over 63 bytes"), BEAM_ENOTSUP);
  if (memchr(it->data, 0, (size_t)it->val)) return fail(x->why, R("channel name contains NUL"), BEAM_EPROTO);
  memcpy(dst, it->data, (size_t)it->val);
  dst[it->val] = 0;
  return 0;
}

static int channel_dup(char names[][BEAM_DX_NAME_MAX], unsigned n, const char *name) {
  for (unsigned i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return 1;
  return 0;
}

/* Rational [num, den], den != 0, as seconds. */
static int get_rational(dx_t *x, unsigned depth, field_t f, double *sec) {
  beam_cbor_item_t it;
  beam_cbor_iter_t k;
  uint64_t v[2];
  if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_ARRAY) return fail(x->why, fields[f].why, BEAM_EPROTO);
  beam_cbor_iter(&it, &k);
  for (int i = 0; i < 2; i++) {
    int r = next(x, &k);
    if (r < 0) return r;
    if (r == 0) return fail(x->why, fields[f].why, BEAM_EPROTO);
    unsigned d = depth + 1;
    if (rd_plain(x, &d, &it)) return BEAM_EPROTO;
    if (it.major != BEAM_CBOR_UINT) return fail(x->why, fields[f].why, BEAM_EPROTO);
    v[i] = it.val;
  }
  int r = next(x, &k);
  if (r < 0) return r;
  if (r) return fail(x->why, fields[f].why, BEAM_EPROTO);
  if (v[1] == 0) return fail(x->why, R("Rational with denominator 0"), BEAM_EPROTO);
  *sec = (double)v[0] / (double)v[1];
  return 0;
}

/* ---- typed and multi-dimensional arrays ---- */

/* RFC 8746 typed-array tags beamd decodes: little-endian u8, u16, u32, f32
 * (DECTRIS), and the signed i8, i16, i32 JUNGFRAU data may come in
 * (pedestal-subtracted pixels go negative; Jungfraujoch's error_value). */
static beam_dtype_t typed_dtype(uint64_t tag) {
  switch (tag) {
  case 64: return BEAM_DT_U8;
  case 69: return BEAM_DT_U16;
  case 70: return BEAM_DT_U32;
  case 72: return BEAM_DT_I8;
  case 77: return BEAM_DT_I16;
  case 78: return BEAM_DT_I32;
  case 85: return BEAM_DT_F32;
  default: return BEAM_DT_NONE;
  }
}

/* A typed array at `depth`: tag 64/69/70/85 on a byte string (raw) or on
 * tag 56500 [algorithm, modifier, bytes] (compressed). With nelem_known the
 * decoded size must be nelem x element size; without it the array is 1-D
 * and its length follows from the data. */
static int parse_typed(dx_t *x, unsigned depth, int nelem_known, uint64_t nelem, beam_dx_array_t *a) {
  beam_cbor_item_t it;
  if (depth >= BEAM_CBOR_MAX_DEPTH) return fail(x->why, cbor_why[BEAM_CBOR_EDEPTH], BEAM_EPROTO);
  if (rd(x, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_TAG || it.val < 64 || it.val > 87)
    return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
  beam_dtype_t dt = typed_dtype(it.val);
  if (dt == BEAM_DT_NONE) return fail(x->why, R("unsupported typed array"), BEAM_ENOTSUP);
  uint64_t es = beam_dtype_size(dt);
  if (rd(x, &it)) return BEAM_EPROTO;
  a->dtype = dt;
  if (it.major == BEAM_CBOR_BYTES) {
    if (nelem_known ? (nelem > UINT64_MAX / es || nelem * es != it.val) : it.val % es != 0)
      return fail(x->why, R("data size does not match dims x element size"), BEAM_ESHAPE);
    a->codec = BEAM_CODEC_RAW;
    a->data = it.data;
    a->size = (size_t)it.val;
    a->raw_size = it.val;
  } else if (it.major == BEAM_CBOR_TAG && it.val == TAG_COMPRESSED) {
    beam_cbor_item_t f[3];
    beam_cbor_iter_t k;
    if (depth + 2 >= BEAM_CBOR_MAX_DEPTH) return fail(x->why, cbor_why[BEAM_CBOR_EDEPTH], BEAM_EPROTO);
    if (rd(x, &it)) return BEAM_EPROTO;
    if (it.major != BEAM_CBOR_ARRAY) return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
    beam_cbor_iter(&it, &k);
    for (int i = 0; i < 3; i++) {
      int r = next(x, &k);
      if (r < 0) return r;
      if (r == 0) return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
      if (rd(x, &f[i])) return BEAM_EPROTO;
      /* Only the three plain types; anything else is not [text, uint, bytes]. */
      static const uint8_t want[3] = {BEAM_CBOR_TEXT, BEAM_CBOR_UINT, BEAM_CBOR_BYTES};
      if (f[i].major != want[i])
        return fail(x->why, R("compression tag is not [algorithm, modifier, bytes]"), BEAM_EPROTO);
    }
    int r = next(x, &k);
    if (r < 0) return r;
    if (r) return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
    beam_codec_t codec;
    if (beam_cbor_text_is(&f[0], "bslz4")) codec = BEAM_CODEC_BSLZ4;
    else if (beam_cbor_text_is(&f[0], "lz4")) codec = BEAM_CODEC_LZ4;
    else if (beam_cbor_text_is(&f[0], "bszstd")) codec = BEAM_CODEC_BSZSTD;
    else return fail(x->why, R("unknown compression algorithm"), BEAM_ENOTSUP);
    if (f[2].val < BLOB_HDR) return fail(x->why, R("compressed blob under 12 bytes"), BEAM_ESHAPE);
    uint64_t orig = rbe64(f[2].data);
    if (nelem_known ? (nelem > UINT64_MAX / es || nelem * es != orig) : orig % es != 0)
      return fail(x->why, R("decoded size does not match dims x element size"), BEAM_ESHAPE);
    if (codec != BEAM_CODEC_LZ4 && f[1].val != es)
      return fail(x->why, R("bitshuffle element size does not match the typed array"), BEAM_ESHAPE);
    a->codec = codec;
    a->data = f[2].data;
    a->size = (size_t)f[2].val;
    a->raw_size = orig;
  } else {
    return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
  }
  if (!nelem_known) {
    if (a->raw_size / es > UINT32_MAX) return fail(x->why, R("typed array over 2^32-1 elements"), BEAM_ESHAPE);
    a->ndim = 1;
    a->shape[0] = (uint32_t)(a->raw_size / es);
  }
  return 0;
}

/* MultiDimArray 40([[dim0, dim1], typed array]) at `depth`, whose tag head
 * `tag` has been read: dim0 = rows (y), dim1 = columns (x). */
static int parse_mda_body(dx_t *x, unsigned depth, const beam_cbor_item_t *tag, beam_dx_array_t *a) {
  beam_cbor_item_t it;
  beam_cbor_iter_t k, kd;
  uint64_t dim[2];
  if (tag->major != BEAM_CBOR_TAG) return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
  if (tag->val == TAG_MDA_COLMAJOR)
    return fail(x->why, R("column-major MultiDimArray (tag 1040)"), BEAM_ENOTSUP);
  if (tag->val != TAG_MDA) return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
  if (depth + 2 >= BEAM_CBOR_MAX_DEPTH) return fail(x->why, cbor_why[BEAM_CBOR_EDEPTH], BEAM_EPROTO);
  if (rd(x, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_ARRAY) return fail(x->why, R("wrong tag nesting"), BEAM_EPROTO);
  beam_cbor_iter(&it, &k);
  int r = next(x, &k);
  if (r <= 0) return r < 0 ? r : fail(x->why, R("MultiDimArray is not [dims, typed array]"), BEAM_EPROTO);
  if (rd(x, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_ARRAY) return fail(x->why, R("MultiDimArray is not [dims, typed array]"), BEAM_EPROTO);
  beam_cbor_iter(&it, &kd);
  unsigned nd = 0;
  while ((r = next(x, &kd)) > 0) {
    if (nd == 2) return fail(x->why, R("MultiDimArray without exactly 2 dims"), BEAM_ENOTSUP);
    if (rd(x, &it)) return BEAM_EPROTO;
    if (it.major != BEAM_CBOR_UINT) return fail(x->why, R("MultiDimArray dim is not an unsigned integer"), BEAM_EPROTO);
    if (it.val > UINT32_MAX) return fail(x->why, R("MultiDimArray dim over 2^32-1"), BEAM_ESHAPE);
    dim[nd++] = it.val;
  }
  if (r < 0) return r;
  if (nd != 2) return fail(x->why, R("MultiDimArray without exactly 2 dims"), BEAM_ENOTSUP);
  r = next(x, &k);
  if (r <= 0) return r < 0 ? r : fail(x->why, R("wrong tag nesting"), BEAM_EPROTO); /* no typed array */
  /* dims < 2^32 each, so the product fits 64 bits. */
  if ((r = parse_typed(x, depth + 2, 1, dim[0] * dim[1], a))) return r;
  r = next(x, &k);
  if (r) return r < 0 ? r : fail(x->why, R("MultiDimArray is not [dims, typed array]"), BEAM_EPROTO);
  a->ndim = 2;
  a->shape[0] = (uint32_t)dim[0];
  a->shape[1] = (uint32_t)dim[1];
  return 0;
}

static int parse_mda(dx_t *x, unsigned depth, beam_dx_array_t *a) {
  beam_cbor_item_t tag;
  if (rd(x, &tag)) return BEAM_EPROTO;
  return parse_mda_body(x, depth, &tag, a);
}

/* Map channel -> MultiDimArray at `depth` (image data, flatfield,
 * pixel_mask), in the message's order. */
static int parse_channel_map(dx_t *x, unsigned depth, field_t f, beam_dx_array_t *arr, unsigned *n) {
  beam_cbor_item_t it;
  beam_cbor_iter_t k;
  char names[BEAM_DX_MAX_CHANNELS][BEAM_DX_NAME_MAX];
  int r;
  if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_MAP) return fail(x->why, fields[f].why, BEAM_EPROTO);
  beam_cbor_iter(&it, &k);
  *n = 0;
  while ((r = next(x, &k)) > 0) {
    if (*n == BEAM_DX_MAX_CHANNELS) return fail(x->why, R("too many channels"), BEAM_ENOTSUP);
    beam_dx_array_t *a = &arr[*n];
    memset(a, 0, sizeof *a);
    unsigned d = depth + 1;
    if (rd_plain(x, &d, &it)) return BEAM_EPROTO;
    if ((r = get_channel(x, &it, a->channel))) return r;
    if (channel_dup(names, *n, a->channel)) return fail(x->why, R("duplicate channel name"), BEAM_EPROTO);
    memcpy(names[*n], a->channel, sizeof names[0]);
    if ((r = parse_mda(x, depth + 1, a))) return r;
    (*n)++;
  }
  return r;
}

/* ---- messages ---- */

static void start_init(beam_dx_start_t *s) {
  s->header_detail = -1;
  s->ntrigger = 1;
  s->count_time = s->frame_time = s->energy_ev = s->wavelength_a = s->distance_m = NAN;
  s->pixel_size_x = s->pixel_size_y = s->beam_center_x = s->beam_center_y = NAN;
  s->sensor_thickness_m = NAN;
  for (unsigned i = 0; i < BEAM_DX_MAX_CHANNELS; i++) s->threshold_ev[i] = NAN;
}

static int start_channels(dx_t *x, unsigned depth, beam_dx_start_t *s) {
  beam_cbor_item_t it;
  beam_cbor_iter_t k;
  int r;
  if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_ARRAY) return fail(x->why, fields[F_CHANNELS].why, BEAM_EPROTO);
  beam_cbor_iter(&it, &k);
  while ((r = next(x, &k)) > 0) {
    if (s->nchannels == BEAM_DX_MAX_CHANNELS) return fail(x->why, R("too many channels"), BEAM_ENOTSUP);
    unsigned d = depth + 1;
    if (rd_plain(x, &d, &it)) return BEAM_EPROTO;
    if ((r = get_channel(x, &it, s->channels[s->nchannels]))) return r;
    if (channel_dup(s->channels, s->nchannels, s->channels[s->nchannels]))
      return fail(x->why, R("duplicate channel name"), BEAM_EPROTO);
    s->nchannels++;
  }
  return r;
}

/* threshold_energy, read after the whole map so `channels` is known. */
static int start_thresholds(dx_t *x, unsigned depth, beam_dx_start_t *s) {
  beam_cbor_item_t it;
  beam_cbor_iter_t k;
  int r;
  if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_MAP) return fail(x->why, fields[F_THRESHOLD_ENERGY].why, BEAM_EPROTO);
  beam_cbor_iter(&it, &k);
  while ((r = next(x, &k)) > 0) {
    unsigned d = depth + 1;
    if (rd_plain(x, &d, &it)) return BEAM_EPROTO;
    if (it.major != BEAM_CBOR_TEXT) return fail(x->why, fields[F_THRESHOLD_ENERGY].why, BEAM_EPROTO);
    int ch = -1;
    for (unsigned i = 0; i < s->nchannels; i++)
      if (beam_cbor_text_is(&it, s->channels[i])) ch = (int)i;
    double e;
    if (get_num(x, depth + 1, F_THRESHOLD_ENERGY, &e)) return BEAM_EPROTO;
    if (ch >= 0) s->threshold_ev[ch] = e;
  }
  return r;
}

static int start_field(dx_t *x, field_t f, unsigned depth, beam_dx_start_t *s, const uint8_t **thr) {
  beam_cbor_item_t it;
  const uint8_t *at = x->c.p;
  int r;
  switch (f) {
  case F_SERIES_ID: return get_u64(x, depth, f, &s->series_id);
  case F_SERIES_UNIQUE_ID:
    if (get_text(x, depth, f, &it)) return BEAM_EPROTO;
    copy_cut(s->series_unique_id, sizeof s->series_unique_id, it.data, (size_t)it.val);
    return 0;
  case F_IMAGE_SIZE_X: return get_u32(x, depth, f, &s->width);
  case F_IMAGE_SIZE_Y: return get_u32(x, depth, f, &s->height);
  case F_IMAGE_DTYPE: {
    char name[16];
    if (get_text(x, depth, f, &it)) return BEAM_EPROTO;
    if (it.val >= sizeof name || memchr(it.data, 0, (size_t)it.val))
      return fail(x->why, R("unknown image_dtype"), BEAM_ENOTSUP);
    memcpy(name, it.data, (size_t)it.val);
    name[it.val] = 0;
    s->dtype = beam_dtype_from_name(name);
    if (s->dtype == BEAM_DT_NONE) return fail(x->why, R("unknown image_dtype"), BEAM_ENOTSUP);
    return 0;
  }
  case F_NUMBER_OF_IMAGES:
    if (get_u64(x, depth, f, &s->nimages)) return BEAM_EPROTO;
    s->expected_frames = s->nimages; /* ntrigger is 1 in v2 */
    return 0;
  case F_COUNT_TIME: return get_num(x, depth, f, &s->count_time);
  case F_FRAME_TIME: return get_num(x, depth, f, &s->frame_time);
  case F_INCIDENT_ENERGY: return get_num(x, depth, f, &s->energy_ev);
  case F_INCIDENT_WAVELENGTH: return get_num(x, depth, f, &s->wavelength_a);
  case F_PIXEL_SIZE_X: return get_num(x, depth, f, &s->pixel_size_x);
  case F_PIXEL_SIZE_Y: return get_num(x, depth, f, &s->pixel_size_y);
  case F_BEAM_CENTER_X: return get_num(x, depth, f, &s->beam_center_x);
  case F_BEAM_CENTER_Y: return get_num(x, depth, f, &s->beam_center_y);
  case F_SENSOR_THICKNESS: return get_num(x, depth, f, &s->sensor_thickness_m);
  case F_DETECTOR_DISTANCE: return get_num(x, depth, f, &s->distance_m);
  case F_SATURATION_VALUE:
    if (get_u64(x, depth, f, &s->saturation_value)) return BEAM_EPROTO;
    s->has_saturation = 1;
    return 0;
  case F_ERROR_VALUE:
    if (rd_plain(x, &depth, &it)) return BEAM_EPROTO;
    if (it.major == BEAM_CBOR_UINT && it.val <= INT64_MAX) s->error_value = (int64_t)it.val;
    else if (it.major == BEAM_CBOR_NEGINT && it.val <= INT64_MAX) s->error_value = -1 - (int64_t)it.val;
    else if (it.major == BEAM_CBOR_UINT || it.major == BEAM_CBOR_NEGINT)
      return fail(x->why, R("error_value outside int64"), BEAM_ENOTSUP);
    else return fail(x->why, fields[f].why, BEAM_EPROTO);
    s->has_error_value = 1;
    return 0;
  case F_MAGIC_NUMBER: return get_u64(x, depth, f, &s->magic_number);
  case F_CHANNELS: return start_channels(x, depth, s);
  case F_THRESHOLD_ENERGY:
    *thr = at; /* parsed once channels are known; checked well formed now */
    return skip(x, depth);
  case F_FLATFIELD: return parse_channel_map(x, depth, f, s->flatfield, &s->nflatfield);
  case F_PIXEL_MASK: return parse_channel_map(x, depth, f, s->pixel_mask, &s->npixel_mask);
  case F_COUNTRATE:
    if (rd(x, &it)) return BEAM_EPROTO;
    if (it.major == BEAM_CBOR_TAG && it.val == TAG_MDA) {
      r = parse_mda_body(x, depth, &it, &s->countrate);
    } else {
      x->c.p = at; /* the typed-array parser wants the tag */
      r = parse_typed(x, depth, 0, 0, &s->countrate);
    }
    return r;
  case F_USER_DATA:
    if (skip(x, depth)) return BEAM_EPROTO;
    s->user_data = at;
    s->user_data_len = (size_t)(x->c.p - at);
    return 0;
  case F_ARM_DATE:
    if (get_text(x, depth, f, &it)) return BEAM_EPROTO;
    s->arm_date = (const char *)it.data;
    s->arm_date_len = (size_t)it.val;
    return 0;
  default: return skip(x, depth); /* not a start field: field_of() filters these */
  }
}

static int image_field(dx_t *x, field_t f, unsigned depth, beam_dx_image_t *im) {
  const uint8_t *at = x->c.p;
  switch (f) {
  case F_SERIES_ID: return get_u64(x, depth, f, &im->series_id);
  case F_IMAGE_ID: return get_u64(x, depth, f, &im->image_id);
  case F_START_TIME: return get_rational(x, depth, f, &im->start_time_s);
  case F_STOP_TIME: return get_rational(x, depth, f, &im->stop_time_s);
  case F_REAL_TIME: return get_rational(x, depth, f, &im->real_time_s);
  case F_DATA: return parse_channel_map(x, depth, f, im->data, &im->nchannels);
  case F_SERIES_DATE: {
    beam_cbor_item_t it;
    if (get_text(x, depth, f, &it)) return BEAM_EPROTO;
    im->series_date = (const char *)it.data;
    im->series_date_len = (size_t)it.val;
    return 0;
  }
  case F_USER_DATA:
    if (skip(x, depth)) return BEAM_EPROTO;
    im->user_data = at;
    im->user_data_len = (size_t)(x->c.p - at);
    return 0;
  default: return skip(x, depth);
  }
}

static int parse(const uint8_t *b, size_t len, beam_dx_msg_t *out, const char **why) {
  dx_t x = {.why = why};
  beam_cbor_item_t top, it;
  beam_cbor_iter_t k;
  const uint8_t *thr = NULL;
  uint64_t seen = 0;
  unsigned kind;
  int r;
  if (len < 3 || b[0] != 0xd9 || b[1] != 0xd9 || b[2] != 0xf7)
    return fail(why, R("no CBOR signature"), BEAM_EPROTO);
  beam_cbor_init(&x.c, b + 3, len - 3);
  if (rd(&x, &top)) return BEAM_EPROTO;
  if (top.major != BEAM_CBOR_MAP) return fail(why, R("top level is not a map"), BEAM_EPROTO);
  beam_cbor_iter(&top, &k);
  /* The first key must be "type" (stream2.c parse_msg_type). */
  if ((r = next(&x, &k)) < 0) return r;
  if (r == 0) return fail(why, R("type is not the first key"), BEAM_EPROTO);
  if (rd(&x, &it)) return BEAM_EPROTO;
  if (!beam_cbor_text_is(&it, "type")) return fail(why, R("type is not the first key"), BEAM_EPROTO);
  unsigned d = 1;
  if (rd_plain(&x, &d, &it)) return BEAM_EPROTO;
  if (it.major != BEAM_CBOR_TEXT) return fail(why, R("type is not a text string"), BEAM_EPROTO);
  if (beam_cbor_text_is(&it, "start")) {
    out->kind = BEAM_DX_START, kind = K_START;
    start_init(&out->start);
    out->start.have_config = 1; /* config is the message itself */
    out->start.config = b;
    out->start.config_len = len;
  } else if (beam_cbor_text_is(&it, "image")) {
    out->kind = BEAM_DX_IMAGE, kind = K_IMAGE;
    out->image.nchannels = 0;
    out->image.start_time_s = out->image.stop_time_s = out->image.real_time_s = NAN;
  } else if (beam_cbor_text_is(&it, "end")) {
    out->kind = BEAM_DX_END, kind = K_END;
  } else {
    /* Jungfraujoch calibration / metadata, or a type from a later release:
     * named for the caller, which counts and drops it. */
    out->kind = BEAM_DX_OTHER, kind = 0;
    size_t n = (size_t)it.val < sizeof out->other_type - 1 ? (size_t)it.val : sizeof out->other_type - 1;
    memcpy(out->other_type, it.data, n);
    out->other_type[n] = 0;
  }
  while ((r = next(&x, &k)) > 0) {
    if (rd(&x, &it)) return BEAM_EPROTO;
    if (it.major != BEAM_CBOR_TEXT) return fail(why, R("map key is not a text string"), BEAM_EPROTO);
    int f = field_of(&it, kind);
    if (f < 0) {
      if (skip(&x, 1)) return BEAM_EPROTO;
      continue;
    }
    if (seen & ((uint64_t)1 << f)) return fail(why, R("duplicate key"), BEAM_EPROTO);
    seen |= (uint64_t)1 << f;
    if (kind == K_START) r = start_field(&x, (field_t)f, 1, &out->start, &thr);
    else if (kind == K_IMAGE) r = image_field(&x, (field_t)f, 1, &out->image);
    else r = get_u64(&x, 1, (field_t)f, &out->end_series_id); /* end: series_id only */
    if (r) return r;
  }
  if (r < 0) return r;
  if (x.c.p != x.c.end) return fail(why, R("bytes after the top-level map"), BEAM_EPROTO);
  switch (kind) {
  case K_START:
    if (thr) {
      x.c.p = thr;
      if ((r = start_thresholds(&x, 1, &out->start))) return r;
    }
    out->end_series_id = out->start.series_id;
    break;
  case K_IMAGE:
    if (!(seen & ((uint64_t)1 << F_IMAGE_ID))) return fail(why, R("image without image_id"), BEAM_EPROTO);
    if (!(seen & ((uint64_t)1 << F_DATA))) return fail(why, R("image without data"), BEAM_EPROTO);
    out->end_series_id = out->image.series_id;
    break;
  default: break;
  }
  return 0;
}

int beam_dx2_parse(const void *buf, size_t len, beam_dx_msg_t *out, const char **why) {
  if (!out || (!buf && len)) return fail(why, R("NULL argument"), BEAM_EINVAL);
  memset(out, 0, sizeof *out);
  out->version = 2;
  int r = parse(buf, len, out, why);
  if (r) out->kind = BEAM_DX_NONE; /* the rest is half-filled: not to be used */
  return r;
}

/* ---- JSON of the start message ----
 * The map in message order; byte strings, typed arrays and MultiDimArrays
 * summarised (below); other tags dropped with their content kept; floats
 * exact (shortest round-trip form, at most %.17g; NaN and infinities
 * are null); text escaped, invalid UTF-8 replaced
 * by U+FFFD so the output is always valid JSON. Map keys: text as it is,
 * numbers and simple values as their JSON text in quotes; a pair whose key
 * is a byte string, array or map is dropped (JSON has no such keys).
 * Summaries (max_inline = the caller's limit in bytes):
 *   byte string    {"bytes": N, "base64": "..."}  when N <= max_inline,
 *                  {"bytes": N}                   otherwise;
 *   typed array    [v, ...]                       when N <= max_inline and
 *                                                 the element type is known,
 *                  {"bytes": N}                   otherwise (N decoded bytes,
 *                                                 also for compressed ones);
 *   MultiDimArray  {"shape": [d0, d1, ...], "bytes": N}, always.
 * Numbers are formatted by snprintf, so the C locale's decimal point is
 * assumed (beamd never calls setlocale). */

typedef struct jw_s {
  char *out;
  size_t cap, len; /* len < cap always: one byte stays for the NUL */
  int full;
  size_t max_inline;
  beam_cbor_t c;
} jw_t;

static void put(jw_t *w, const char *s, size_t n) {
  if (w->full) return;
  if (n > w->cap - 1 - w->len) {
    w->full = 1;
    return;
  }
  memcpy(w->out + w->len, s, n);
  w->len += n;
}
static void puts_(jw_t *w, const char *s) { put(w, s, strlen(s)); }

static void put_u64(jw_t *w, uint64_t v) {
  char b[24];
  int n = snprintf(b, sizeof b, "%" PRIu64, v);
  put(w, b, (size_t)n);
}

/* CBOR negative integer -1 - v, which may be below INT64_MIN. */
static void put_neg(jw_t *w, uint64_t v) {
  if (v == UINT64_MAX) {
    puts_(w, "-18446744073709551616");
    return;
  }
  put(w, "-", 1);
  put_u64(w, v + 1);
}

/* The shortest of %.15g, %.16g, %.17g that reads back as the same double
 * (%.17g always does), so 0.0005 stays 0.0005; ".0" is added to integral
 * values so a JSON reader keeps them floats. */
static void put_double(jw_t *w, double d) {
  char b[40];
  int n = 0;
  if (isnan(d) || isinf(d)) {
    puts_(w, "null");
    return;
  }
  for (int prec = 15; prec <= 17; prec++) {
    n = snprintf(b, sizeof b - 2, "%.*g", prec, d);
    if (prec == 17 || strtod(b, NULL) == d) break;
  }
  if (!strpbrk(b, ".eE")) {
    memcpy(b + n, ".0", 3);
    n += 2;
  }
  put(w, b, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), 0 when there is none. */
static size_t utf8_len(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  size_t k;
  uint8_t lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) k = 2;
  else if (c >= 0xe0 && c <= 0xef) {
    k = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    k = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (n < k || s[1] < lo || s[1] > hi) return 0;
  for (size_t i = 2; i < k; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  return k;
}

static void put_str(jw_t *w, const uint8_t *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t run = 0; /* bytes s[run..i) are copied as they are */
  put(w, "\"", 1);
  for (size_t i = 0; i < n && !w->full;) {
    uint8_t c = s[i];
    const char *esc = NULL;
    char u[7];
    size_t k = 1;
    if (c == '"') esc = "\\\"";
    else if (c == '\\') esc = "\\\\";
    else if (c == '\n') esc = "\\n";
    else if (c == '\r') esc = "\\r";
    else if (c == '\t') esc = "\\t";
    else if (c == '\b') esc = "\\b";
    else if (c == '\f') esc = "\\f";
    else if (c < 0x20) {
      memcpy(u, "\\u00", 4);
      u[4] = hex[c >> 4], u[5] = hex[c & 15], u[6] = 0;
      esc = u;
    } else if (c >= 0x80 && (k = utf8_len(s + i, n - i)) == 0) {
      esc = "\\ufffd";
      k = 1;
    }
    if (esc) {
      put(w, (const char *)s + run, i - run);
      puts_(w, esc);
      run = i + k;
    }
    i += k;
  }
  if (run < n) put(w, (const char *)s + run, n - run);
  put(w, "\"", 1);
}

static void put_base64(jw_t *w, const uint8_t *s, size_t n) {
  static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  put(w, "\"", 1);
  for (size_t i = 0; i < n && !w->full; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16;
    if (i + 1 < n) v |= (uint32_t)s[i + 1] << 8;
    if (i + 2 < n) v |= s[i + 2];
    char q[4] = {a[(v >> 18) & 63], a[(v >> 12) & 63], i + 1 < n ? a[(v >> 6) & 63] : '=',
                 i + 2 < n ? a[v & 63] : '='};
    put(w, q, 4);
  }
  put(w, "\"", 1);
}

static void put_bytes_summary(jw_t *w, uint64_t n) {
  puts_(w, "{\"bytes\": ");
  put_u64(w, n);
  put(w, "}", 1);
}

/* RFC 8746 section 2.1: tag 0b010_f_s_e_ll. */
static size_t typed_size(uint64_t tag) { return (size_t)1 << (((tag >> 4) & 1) + (tag & 3)); }

static uint64_t load(const uint8_t *p, size_t es, int le) {
  uint64_t v = 0;
  for (size_t i = 0; i < es; i++) v = (v << 8) | p[le ? es - 1 - i : i];
  return v;
}

/* A typed array's bytes: numbers when small and of a known type. */
static void put_typed(jw_t *w, uint64_t tag, const uint8_t *p, size_t n) {
  size_t es = typed_size(tag);
  int flt = (tag >> 4) & 1, sgn = !flt && ((tag >> 3) & 1), le = (tag >> 2) & 1;
  /* 76 is reserved; float128 has no C type here. */
  if (n > w->max_inline || n % es || tag == 76 || (flt && es == 16)) {
    put_bytes_summary(w, n);
    return;
  }
  if (tag == 68) le = 0; /* uint8 clamped: one byte, no endianness */
  put(w, "[", 1);
  for (size_t i = 0; i < n && !w->full; i += es) {
    uint64_t v = load(p + i, es, le);
    if (i) put(w, ", ", 2);
    if (flt) {
      double d;
      if (es == 2) d = beam_cbor_half((uint16_t)v);
      else if (es == 4) {
        uint32_t b = (uint32_t)v;
        float f;
        memcpy(&f, &b, sizeof f);
        d = (double)f;
      } else memcpy(&d, &v, sizeof d);
      put_double(w, d);
    } else if (sgn && es < 8 && (v >> (8 * es - 1))) {
      put_neg(w, (~v) & (((uint64_t)1 << (8 * es)) - 1)); /* two's complement: -1 - ~v */
    } else if (sgn && es == 8 && (v >> 63)) {
      put_neg(w, ~v);
    } else {
      put_u64(w, v);
    }
  }
  put(w, "]", 1);
}

/* Decoded bytes of a typed-array body at c->p (bytes, or 56500 [alg, mod,
 * bytes >= 12]), or -1 when it is neither; moves past it on success. The
 * body starts at depth d (the typed-array tag's content). */
static int64_t probe_typed_body(beam_cbor_t *c, unsigned d, beam_cbor_item_t *raw) {
  beam_cbor_item_t it, f = {0};
  beam_cbor_iter_t k;
  if (beam_cbor_read(c, &it)) return -1;
  if (it.major == BEAM_CBOR_BYTES) {
    *raw = it;
    return it.val > INT64_MAX ? -1 : (int64_t)it.val;
  }
  if (it.major != BEAM_CBOR_TAG || it.val != TAG_COMPRESSED || d + 1 >= BEAM_CBOR_MAX_DEPTH) return -1;
  if (beam_cbor_read(c, &it) || it.major != BEAM_CBOR_ARRAY) return -1;
  beam_cbor_iter(&it, &k);
  static const uint8_t want[3] = {BEAM_CBOR_TEXT, BEAM_CBOR_UINT, BEAM_CBOR_BYTES};
  for (int i = 0; i < 3; i++) {
    if (beam_cbor_next(c, &k) != 1 || beam_cbor_read(c, &f) || f.major != want[i]) return -1;
  }
  if (beam_cbor_next(c, &k) != 0 || f.val < BLOB_HDR) return -1;
  raw->major = 0; /* compressed: nothing to print inline */
  uint64_t orig = rbe64(f.data);
  return orig > INT64_MAX ? -1 : (int64_t)orig;
}

static int json_item(jw_t *w, unsigned depth);

/* The MultiDimArray summary, when what follows tag 40 at depth d has its
 * shape: [[dims...], typed array]. 0 and moved past it, -1 otherwise (the
 * cursor is then wherever the probe stopped: the caller restores it). */
static int probe_mda(jw_t *w, unsigned d) {
  beam_cbor_t *c = &w->c;
  beam_cbor_item_t it, raw;
  beam_cbor_iter_t k, kd;
  uint64_t dims[8];
  unsigned nd = 0;
  /* array at d, dims array and typed tag at d + 1, 56500 at d + 2, its array at d + 3 */
  if (d + 3 >= BEAM_CBOR_MAX_DEPTH) return -1;
  if (beam_cbor_read(c, &it) || it.major != BEAM_CBOR_ARRAY) return -1;
  beam_cbor_iter(&it, &k);
  if (beam_cbor_next(c, &k) != 1 || beam_cbor_read(c, &it) || it.major != BEAM_CBOR_ARRAY) return -1;
  beam_cbor_iter(&it, &kd);
  int r;
  while ((r = beam_cbor_next(c, &kd)) == 1) {
    if (nd == 8 || beam_cbor_read(c, &it) || it.major != BEAM_CBOR_UINT) return -1;
    dims[nd++] = it.val;
  }
  if (r != 0 || beam_cbor_next(c, &k) != 1) return -1;
  if (beam_cbor_read(c, &it) || it.major != BEAM_CBOR_TAG || it.val < 64 || it.val > 87) return -1;
  int64_t n = probe_typed_body(c, d + 2, &raw);
  if (n < 0 || beam_cbor_next(c, &k) != 0) return -1;
  puts_(w, "{\"shape\": [");
  for (unsigned i = 0; i < nd; i++) {
    if (i) put(w, ", ", 2);
    put_u64(w, dims[i]);
  }
  puts_(w, "], \"bytes\": ");
  put_u64(w, (uint64_t)n);
  put(w, "}", 1);
  return 0;
}

/* A map key: 1 written, 0 dropped (its content skipped), <0 error. */
static int json_key(jw_t *w, unsigned depth) {
  beam_cbor_item_t it;
  for (;;) { /* tags on keys carry nothing for JSON */
    if (beam_cbor_read(&w->c, &it)) return BEAM_EPROTO;
    if (it.major != BEAM_CBOR_TAG) break;
    if (depth >= BEAM_CBOR_MAX_DEPTH) return BEAM_EPROTO;
    depth++;
  }
  switch (it.major) {
  case BEAM_CBOR_TEXT: put_str(w, it.data, (size_t)it.val); return 1;
  case BEAM_CBOR_UINT: put(w, "\"", 1); put_u64(w, it.val); put(w, "\"", 1); return 1;
  case BEAM_CBOR_NEGINT: put(w, "\"", 1); put_neg(w, it.val); put(w, "\"", 1); return 1;
  case BEAM_CBOR_SIMPLE:
    put(w, "\"", 1);
    if (it.flt) put_double(w, it.f);
    else puts_(w, it.val == BEAM_CBOR_FALSE ? "false" : it.val == BEAM_CBOR_TRUE ? "true" : "null");
    put(w, "\"", 1);
    return 1;
  default: return beam_cbor_skip_content(&w->c, &it, depth) ? BEAM_EPROTO : 0;
  }
}

static int json_item(jw_t *w, unsigned depth) {
  beam_cbor_t *c = &w->c;
  beam_cbor_item_t it;
  beam_cbor_iter_t k;
  int r;
  if (w->full) return BEAM_ELIMIT;
  if (beam_cbor_read(c, &it)) return BEAM_EPROTO;
  switch (it.major) {
  case BEAM_CBOR_UINT: put_u64(w, it.val); break;
  case BEAM_CBOR_NEGINT: put_neg(w, it.val); break;
  case BEAM_CBOR_TEXT: put_str(w, it.data, (size_t)it.val); break;
  case BEAM_CBOR_BYTES:
    puts_(w, "{\"bytes\": ");
    put_u64(w, it.val);
    if (it.val <= w->max_inline) {
      puts_(w, ", \"base64\": ");
      put_base64(w, it.data, (size_t)it.val);
    }
    put(w, "}", 1);
    break;
  case BEAM_CBOR_ARRAY:
  case BEAM_CBOR_MAP: {
    int map = it.major == BEAM_CBOR_MAP, first = 1;
    if (depth >= BEAM_CBOR_MAX_DEPTH) return BEAM_EPROTO;
    put(w, map ? "{" : "[", 1);
    beam_cbor_iter(&it, &k);
    while ((r = beam_cbor_next(c, &k)) > 0) {
      size_t mark = w->len;
      if (!first) put(w, ", ", 2);
      if (map) {
        if ((r = json_key(w, depth + 1)) < 0) return r;
        if (r == 0) { /* dropped key: drop its value and the comma */
          if (!w->full) w->len = mark;
          if (beam_cbor_skip(c, depth + 1)) return BEAM_EPROTO;
          continue;
        }
        put(w, ": ", 2);
      }
      if ((r = json_item(w, depth + 1))) return r;
      first = 0;
      if (w->full) return BEAM_ELIMIT;
    }
    if (r < 0) return BEAM_EPROTO;
    put(w, map ? "}" : "]", 1);
    break;
  }
  case BEAM_CBOR_TAG: {
    if (depth >= BEAM_CBOR_MAX_DEPTH) return BEAM_EPROTO;
    beam_cbor_t save = *c;
    if (it.val == TAG_MDA) {
      if (probe_mda(w, depth + 1) == 0) break;
      *c = save;
    } else if (it.val >= 64 && it.val <= 87) {
      beam_cbor_item_t raw = {0};
      int64_t n = probe_typed_body(c, depth + 1, &raw);
      if (n >= 0) {
        if (raw.major == BEAM_CBOR_BYTES) put_typed(w, it.val, raw.data, (size_t)raw.val);
        else put_bytes_summary(w, (uint64_t)n);
        break;
      }
      *c = save;
    }
    return json_item(w, depth + 1); /* other tags: the content without the tag */
  }
  default: /* simple values and floats */
    if (it.flt) put_double(w, it.f);
    else if (it.val == BEAM_CBOR_FALSE) puts_(w, "false");
    else if (it.val == BEAM_CBOR_TRUE) puts_(w, "true");
    else puts_(w, "null"); /* null, undefined, unassigned simple values */
    break;
  }
  return w->full ? BEAM_ELIMIT : 0;
}

int64_t beam_dx_meta_json(const beam_dx_start_t *s, int version, char *out, size_t cap, size_t max_inline) {
  if (!s || (!out && cap) || (version != 1 && version != 2)) return BEAM_EINVAL;
  if (cap == 0) return BEAM_ELIMIT;
  if (!s->config) { /* v1 header_detail none: no description */
    if (cap < 3) return BEAM_ELIMIT;
    memcpy(out, "{}", 3);
    return 2;
  }
  if (version == 1) {
    if (s->config_len > cap - 1) return BEAM_ELIMIT;
    memcpy(out, s->config, s->config_len);
    out[s->config_len] = 0;
    return (int64_t)s->config_len;
  }
  const uint8_t *b = s->config;
  if (s->config_len < 3 || b[0] != 0xd9 || b[1] != 0xd9 || b[2] != 0xf7) return BEAM_EPROTO;
  jw_t w = {.out = out, .cap = cap, .max_inline = max_inline};
  beam_cbor_init(&w.c, b + 3, s->config_len - 3);
  if (w.c.p >= w.c.end || (*w.c.p >> 5) != BEAM_CBOR_MAP) return BEAM_EPROTO;
  int r = json_item(&w, 0);
  out[w.len] = 0; /* also after a failure: out is always a C string */
  if (r) return r;
  return (int64_t)w.len;
}
