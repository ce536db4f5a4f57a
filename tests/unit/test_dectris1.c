/* Unit tests for the DECTRIS stream v1 decoder (proto/dectris1.c) and the
 * JSON scanner under it (proto/json_scan.c).
 *
 * Messages are built here from literal JSON and byte arrays modelled on the
 * real captures quoted in shared/notes/detector-streams.md section 1 (DLS
 * EIGER 4M stream, fw 1.6.6): every header_detail level, both appendices,
 * EigerFan's extra acqID key, each encoding with real compressed blobs made
 * by beam_codec_encode and decoded back, and every rejection reason. The
 * scanner tests pin the JSON grammar (escapes, numbers, UTF-8, nesting
 * depth) since the decoder's strictness rests on it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dectris.h"
#include "proto/err.h"
#include "proto/json_scan.h"
#include "proto/proto.h"

/* ---- helpers ---- */

#define MAXP 16
typedef struct mp_s {
  beam_part_t p[MAXP];
  size_t n;
} mp_t;

static void add(mp_t *m, const void *d, size_t len) {
  assert_true(m->n < MAXP);
  m->p[m->n].data = d;
  m->p[m->n].size = len;
  m->n++;
}
static void adds(mp_t *m, const char *s) { add(m, s, strlen(s)); }
static void sets(mp_t *m, size_t i, const char *s) {
  assert_true(i < m->n);
  m->p[i].data = s;
  m->p[i].size = strlen(s);
}

static void parse_ok(const mp_t *m, beam_dx_msg_t *out) {
  const char *why = NULL;
  int rc = beam_dx1_parse(m->p, m->n, out, &why);
  if (rc != 0) fail_msg("rejected (%d): %s", rc, why ? why : "(no reason)");
  assert_int_equal(out->version, 1);
}

static void expect_reject_at(const mp_t *m, int code, const char *reason, int line) {
  beam_dx_msg_t out;
  const char *why = NULL;
  int rc = beam_dx1_parse(m->p, m->n, &out, &why);
  if (rc != code || !why || strcmp(why, reason) != 0)
    fail_msg("line %d: expected %s \"%s\", got %s \"%s\"", line, beam_err_name(code), reason,
             rc ? beam_err_name(rc) : "accepted", why ? why : "(none)");
  if (strncmp(why, "dectris v1: ", 12) != 0) fail_msg("line %d: reason not prefixed: %s", line, why);
  assert_int_equal(out.kind, BEAM_DX_NONE);
}
#define EXPECT_REJECT(m, code, reason) expect_reject_at((m), (code), (reason), __LINE__)

/* ---- detect ---- */

static void test_detect(void **state) {
  (void)state;
  static const uint8_t cbor[] = {0xd9, 0xd9, 0xf7, 0xa1};
  beam_part_t p[2] = {{cbor, sizeof cbor, NULL}, {"{}", 2, NULL}};
  assert_int_equal(beam_dx_detect(p, 1), 2);
  assert_int_equal(beam_dx_detect(p, 2), 0); /* v2 is always one part */
  p[0].size = 2;                             /* d9 d9 only */
  assert_int_equal(beam_dx_detect(p, 1), 0);
  p[0] = (beam_part_t){" \r\n\t{\"htype\":1}", 15, NULL};
  assert_int_equal(beam_dx_detect(p, 1), 1);
  assert_int_equal(beam_dx_detect(p, 2), 1);
  p[0] = (beam_part_t){"[1]", 3, NULL};
  assert_int_equal(beam_dx_detect(p, 1), 0);
  p[0] = (beam_part_t){"  ", 2, NULL};
  assert_int_equal(beam_dx_detect(p, 1), 0);
  p[0] = (beam_part_t){"", 0, NULL};
  assert_int_equal(beam_dx_detect(p, 1), 0);
  assert_int_equal(beam_dx_detect(p, 0), 0);
  assert_int_equal(beam_dx_detect(NULL, 1), 0);
}

/* ---- series start ---- */

/* The detector config of the DLS EIGER 4M capture, abridged (no
 * bit_depth_image, as in fw 1.6.6) plus keys the decoder must skip. */
static const char *CONFIG_4M =
    "{\"auto_summation\":true,\"beam_center_x\":1041.5,\"beam_center_y\":1088.25,"
    "\"bit_depth_readout\":12,\"count_time\":0.00099,\"countrate_correction_applied\":true,"
    "\"countrate_correction_count_cutoff\":12440,\"description\":\"Dectris Eiger 4M\","
    "\"detector_distance\":0.12,\"detector_number\":\"E-08-0105\",\"frame_time\":0.002,"
    "\"goniometer\":{\"omega\":{\"start\":0.0,\"increment\":[0.1,0.2]}},"
    "\"nimages\":3,\"ntrigger\":2,\"photon_energy\":12398.4,\"sensor_thickness\":4.5E-4,"
    "\"software_version\":\"1.6.6\",\"threshold_energy\":6199.2,\"trigger_mode\":\"ints\","
    "\"wavelength\":1.0,\"x_pixel_size\":7.5e-05,\"x_pixels_in_detector\":2070,"
    "\"y_pixel_size\":7.5e-05,\"y_pixels_in_detector\":2167,"
    "\"data_collection_date\":\"2019-05-01T10:00:00.000+01:00\",\"nframes_sum\":1}";

static void check_all_nan(const beam_dx_start_t *s) {
  assert_true(isnan(s->count_time) && isnan(s->frame_time) && isnan(s->energy_ev));
  assert_true(isnan(s->wavelength_a) && isnan(s->distance_m) && isnan(s->pixel_size_x));
  assert_true(isnan(s->pixel_size_y) && isnan(s->beam_center_x) && isnan(s->beam_center_y));
  assert_true(isnan(s->sensor_thickness_m));
}

static void test_header_none(void **state) {
  (void)state;
  mp_t m = {0};
  adds(&m, "{\"header_detail\":\"none\",\"htype\":\"dheader-1.0\",\"series\":7}");
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  assert_int_equal(out.kind, BEAM_DX_START);
  const beam_dx_start_t *s = &out.start;
  assert_int_equal(s->series_id, 7);
  assert_int_equal(out.end_series_id, 7);
  assert_int_equal(s->header_detail, 0);
  assert_int_equal(s->have_config, 0);
  assert_int_equal(s->width, 0);
  assert_int_equal(s->height, 0);
  assert_int_equal(s->dtype, BEAM_DT_NONE);
  assert_int_equal(s->expected_frames, 0);
  assert_null(s->config);
  assert_null(s->user_data);
  assert_null(s->flatfield[0].data);
  assert_null(s->countrate.data);
  assert_int_equal(s->nflatfield, 0);
  assert_string_equal(s->trigger_mode, "");
  assert_string_equal(s->series_unique_id, "");
  check_all_nan(s);
  assert_true(isnan(s->threshold_ev[0]));

  /* header_appendix: one more part, any bytes. */
  static const uint8_t app[] = {0x00, 0xff, 'x'};
  add(&m, app, sizeof app);
  parse_ok(&m, &out);
  assert_ptr_equal(out.start.user_data, app);
  assert_int_equal(out.start.user_data_len, 3);
  add(&m, app, sizeof app);
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dheader: more parts than header_detail and an appendix");
}

static void test_header_basic(void **state) {
  (void)state;
  mp_t m = {0};
  /* EigerFan adds acqID to part 1; keys come in any order. */
  adds(&m, "{\"series\":6,\"acqID\":\"test_1\",\"htype\":\"dheader-1.0\",\"header_detail\":\"basic\"}");
  adds(&m, CONFIG_4M);
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  const beam_dx_start_t *s = &out.start;
  assert_int_equal(out.kind, BEAM_DX_START);
  assert_int_equal(s->series_id, 6);
  assert_int_equal(s->header_detail, 1);
  assert_int_equal(s->have_config, 1);
  assert_int_equal(s->width, 2070);
  assert_int_equal(s->height, 2167);
  assert_int_equal(s->nimages, 3);
  assert_int_equal(s->ntrigger, 2);
  assert_string_equal(s->trigger_mode, "ints");
  assert_int_equal(s->expected_frames, 6);
  assert_true(s->count_time == 0.00099);
  assert_true(s->frame_time == 0.002);
  assert_true(s->energy_ev == 12398.4);
  assert_true(s->wavelength_a == 1.0);
  assert_true(s->distance_m == 0.12);
  assert_true(s->pixel_size_x == 7.5e-05 && s->pixel_size_y == 7.5e-05);
  assert_true(s->beam_center_x == 1041.5 && s->beam_center_y == 1088.25);
  assert_true(s->sensor_thickness_m == 4.5e-4);
  assert_int_equal(s->bit_depth_readout, 12);
  assert_int_equal(s->bit_depth_image, 0);
  assert_int_equal(s->dtype, BEAM_DT_NONE); /* not sent by fw 1.6.6 */
  assert_int_equal(s->has_saturation, 1);
  assert_int_equal(s->saturation_value, 12440);
  assert_ptr_equal(s->config, m.p[1].data);
  assert_int_equal(s->config_len, strlen(CONFIG_4M));
  assert_null(s->user_data);
  assert_null(s->flatfield[0].data);

  adds(&m, "{\"acqID\": \"test_1\"}");
  parse_ok(&m, &out);
  assert_ptr_equal(out.start.user_data, m.p[2].data);
  assert_int_equal(out.start.user_data_len, m.p[2].size);

  /* Truncated multipart: basic without its config part. */
  m.n = 1;
  EXPECT_REJECT(&m, BEAM_EPROTO,
                "dectris v1: dheader: truncated multipart (fewer parts than header_detail needs)");
}

/* Config variants: trigger modes, bit depths, absent and null values. */
static void test_header_config_fields(void **state) {
  (void)state;
  static const struct {
    const char *cfg;
    uint64_t expected;
    beam_dtype_t dt;
  } cases[] = {
      {"{\"nimages\":5,\"ntrigger\":10,\"trigger_mode\":\"exte\",\"bit_depth_image\":32}", 10, BEAM_DT_U32},
      {"{\"nimages\":5,\"ntrigger\":10,\"trigger_mode\":\"inte\",\"bit_depth_image\":8}", 10, BEAM_DT_U8},
      {"{\"nimages\":5,\"ntrigger\":10,\"trigger_mode\":\"exts\",\"bit_depth_image\":16}", 50, BEAM_DT_U16},
      {"{\"nimages\":5,\"ntrigger\":10,\"bit_depth_image\":12}", 50, BEAM_DT_NONE},
      {"{\"nimages\":5}", 5, BEAM_DT_NONE},          /* ntrigger defaults to 1 */
      {"{\"ntrigger\":5}", 0, BEAM_DT_NONE},         /* unknown */
      {"{\"nimages\":5.0,\"ntrigger\":2e0}", 10, BEAM_DT_NONE}, /* integral numbers */
      {"{\"nimages\":null,\"count_time\":null}", 0, BEAM_DT_NONE},
      {"{\"nimages\":4294967296,\"ntrigger\":4294967296}", 0, BEAM_DT_NONE}, /* product overflows */
      {"{}", 0, BEAM_DT_NONE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    mp_t m = {0};
    adds(&m, "{\"header_detail\":\"basic\",\"htype\":\"dheader-1.0\",\"series\":1}");
    adds(&m, cases[i].cfg);
    beam_dx_msg_t out;
    parse_ok(&m, &out);
    if (out.start.expected_frames != cases[i].expected || out.start.dtype != cases[i].dt)
      fail_msg("case %zu: expected_frames %llu dtype %d", i,
               (unsigned long long)out.start.expected_frames, (int)out.start.dtype);
  }
  mp_t m = {0};
  adds(&m, "{\"header_detail\":\"basic\",\"htype\":\"dheader-1.0\",\"series\":1}");
  adds(&m, "{}");
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  check_all_nan(&out.start);
  assert_int_equal(out.start.has_saturation, 0);
  assert_int_equal(out.start.width, 0);

  /* Wrong key types name the key. */
  static const struct {
    const char *cfg, *why;
  } bad[] = {
      {"{\"count_time\":\"0.1\"}", "dectris v1: config: count_time is not a number"},
      {"{\"photon_energy\":true}", "dectris v1: config: photon_energy is not a number"},
      {"{\"x_pixels_in_detector\":-1}", "dectris v1: config: x_pixels_in_detector is not an unsigned 32-bit integer"},
      {"{\"y_pixels_in_detector\":4294967296}", "dectris v1: config: y_pixels_in_detector is not an unsigned 32-bit integer"},
      {"{\"bit_depth_image\":16.5}", "dectris v1: config: bit_depth_image is not an unsigned 32-bit integer"},
      {"{\"nimages\":\"3\"}", "dectris v1: config: nimages is not an unsigned integer"},
      {"{\"ntrigger\":[1]}", "dectris v1: config: ntrigger is not an unsigned integer"},
      {"{\"countrate_correction_count_cutoff\":1e300}", "dectris v1: config: countrate_correction_count_cutoff is not an unsigned integer"},
      {"{\"trigger_mode\":\"external\"}", "dectris v1: config: trigger_mode is not a string of at most 7 bytes"},
      {"{\"trigger_mode\":4}", "dectris v1: config: trigger_mode is not a string of at most 7 bytes"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    sets(&m, 1, bad[i].cfg);
    EXPECT_REJECT(&m, BEAM_EPROTO, bad[i].why);
  }
  sets(&m, 1, "x_pixels_in_detector=2070");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: config part is not a JSON object");
  sets(&m, 1, "{\"x_pixels_in_detector\":2070,");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: config part is not a JSON object");
  sets(&m, 1, "[2070]");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: config part is not a JSON object");
}

static float flat[12];
static uint32_t mask[12];
static float rate[10];

/* header_detail all at 4 x 3 pixels, countrate table [2, 5]. */
static void build_all(mp_t *m) {
  memset(m, 0, sizeof *m);
  for (int i = 0; i < 12; i++) flat[i] = 1.0f + (float)i / 16, mask[i] = i == 5 ? 1u : 0u;
  for (int i = 0; i < 10; i++) rate[i] = (float)i;
  adds(m, "{\"header_detail\":\"all\",\"htype\":\"dheader-1.0\",\"series\":6}");
  adds(m, "{\"x_pixels_in_detector\":4,\"y_pixels_in_detector\":3,\"bit_depth_image\":32,"
          "\"nimages\":2,\"ntrigger\":5,\"trigger_mode\":\"exte\"}");
  adds(m, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,3],\"type\":\"float32\"}");
  add(m, flat, sizeof flat);
  adds(m, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[4,3],\"type\":\"uint32\"}");
  add(m, mask, sizeof mask);
  adds(m, "{\"htype\":\"dcountrate_table-1.0\",\"shape\":[2,5],\"type\":\"float32\"}");
  add(m, rate, sizeof rate);
}

static void check_array(const beam_dx_array_t *a, const void *data, size_t size, beam_dtype_t dt,
                        uint32_t ndim, uint32_t s0, uint32_t s1) {
  assert_ptr_equal(a->data, data);
  assert_int_equal(a->size, size);
  assert_int_equal(a->raw_size, size);
  assert_int_equal(a->codec, BEAM_CODEC_RAW);
  assert_int_equal(a->dtype, dt);
  assert_int_equal(a->ndim, ndim);
  assert_int_equal(a->shape[0], s0);
  if (ndim > 1) assert_int_equal(a->shape[1], s1);
  assert_string_equal(a->channel, "");
}

static void test_header_all(void **state) {
  (void)state;
  mp_t m;
  build_all(&m);
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  const beam_dx_start_t *s = &out.start;
  assert_int_equal(s->header_detail, 2);
  assert_int_equal(s->have_config, 1);
  assert_int_equal(s->width, 4);
  assert_int_equal(s->height, 3);
  assert_int_equal(s->dtype, BEAM_DT_U32);
  assert_int_equal(s->expected_frames, 5);
  assert_int_equal(s->nflatfield, 1);
  assert_int_equal(s->npixel_mask, 1);
  check_array(&s->flatfield[0], flat, sizeof flat, BEAM_DT_F32, 2, 3, 4);
  check_array(&s->pixel_mask[0], mask, sizeof mask, BEAM_DT_U32, 2, 3, 4);
  /* [2, N] on the wire is [N, 2] in C order (see dectris.h). */
  check_array(&s->countrate, rate, sizeof rate, BEAM_DT_F32, 2, 5, 2);
  assert_null(s->user_data);

  /* The DLS capture: 9 parts, part 9 the appendix. */
  adds(&m, "{\"acqID\": \"test_1\"}");
  parse_ok(&m, &out);
  assert_ptr_equal(out.start.user_data, m.p[8].data);
  adds(&m, "{}");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dheader: more parts than header_detail and an appendix");

  /* A one-dimensional table, and parts without htype, are accepted. */
  build_all(&m);
  sets(&m, 6, "{\"shape\":[10],\"type\":\"float32\"}");
  parse_ok(&m, &out);
  check_array(&out.start.countrate, rate, sizeof rate, BEAM_DT_F32, 1, 10, 0);

  /* Each truncation point. */
  for (size_t n = 2; n < 8; n++) {
    build_all(&m);
    m.n = n;
    EXPECT_REJECT(&m, BEAM_EPROTO,
                  "dectris v1: dheader: truncated multipart (fewer parts than header_detail needs)");
  }
}

static void test_header_reject(void **state) {
  (void)state;
  mp_t m;
  static const struct {
    size_t part;
    const char *json;
    int code;
    const char *why;
  } cases[] = {
      {0, "{\"header_detail\":\"all\",\"htype\":\"dheader-1.0\"}", BEAM_EPROTO, "dectris v1: dheader: no series"},
      {0, "{\"header_detail\":\"all\",\"htype\":\"dheader-1.0\",\"series\":\"6\"}", BEAM_EPROTO,
       "dectris v1: dheader: series is not an unsigned integer"},
      {0, "{\"header_detail\":\"all\",\"htype\":\"dheader-1.0\",\"series\":-6}", BEAM_EPROTO,
       "dectris v1: dheader: series is not an unsigned integer"},
      {0, "{\"htype\":\"dheader-1.0\",\"series\":6}", BEAM_EPROTO, "dectris v1: dheader: no header_detail"},
      {0, "{\"header_detail\":2,\"htype\":\"dheader-1.0\",\"series\":6}", BEAM_EPROTO,
       "dectris v1: dheader: header_detail is not a string"},
      {0, "{\"header_detail\":\"full\",\"htype\":\"dheader-1.0\",\"series\":6}", BEAM_ENOTSUP,
       "dectris v1: dheader: unknown header_detail"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,3],\"type\":\"float32\"", BEAM_EPROTO,
       "dectris v1: dflatfield part is not a JSON object"},
      {2, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[4,3],\"type\":\"float32\"}", BEAM_EPROTO,
       "dectris v1: dflatfield: unexpected htype"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,3],\"type\":\"float64\"}", BEAM_ENOTSUP,
       "dectris v1: dflatfield: type is not \"float32\""},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,3],\"type\":9}", BEAM_EPROTO,
       "dectris v1: dflatfield: type is not \"float32\""},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,3,1],\"type\":\"float32\"}", BEAM_EPROTO,
       "dectris v1: dflatfield: shape is not [x] or [x, y]"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[],\"type\":\"float32\"}", BEAM_EPROTO,
       "dectris v1: dflatfield: shape is not [x] or [x, y]"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":\"4x3\",\"type\":\"float32\"}", BEAM_EPROTO,
       "dectris v1: dflatfield: shape is not an array of unsigned integers"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"type\":\"float32\"}", BEAM_EPROTO,
       "dectris v1: dflatfield: shape is not an array of unsigned integers"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,0],\"type\":\"float32\"}", BEAM_ESHAPE,
       "dectris v1: dflatfield: zero or too large dimension"},
      {2, "{\"htype\":\"dflatfield-1.0\",\"shape\":[4,2],\"type\":\"float32\"}", BEAM_ESHAPE,
       "dectris v1: dflatfield: blob size does not match shape x type"},
      {4, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[4,3],\"type\":\"float32\"}", BEAM_ENOTSUP,
       "dectris v1: dpixelmask: type is not \"uint32\""},
      {4, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[4294967296,3],\"type\":\"uint32\"}", BEAM_ESHAPE,
       "dectris v1: dpixelmask: zero or too large dimension"},
      {4, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[4294967295,4294967295],\"type\":\"uint32\"}", BEAM_ESHAPE,
       "dectris v1: dpixelmask: shape x type overflows"},
      {4, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[4,3],\"type\":\"uint32\"}  x", BEAM_EPROTO,
       "dectris v1: dpixelmask part is not a JSON object"},
      /* Parts out of order: a pixel mask where the table is due. */
      {6, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[2,5],\"type\":\"float32\"}", BEAM_EPROTO,
       "dectris v1: dcountrate_table: unexpected htype"},
      {6, "{\"htype\":\"dcountrate_table-1.0\",\"shape\":[5,2],\"type\":\"float32\"}", 0, NULL},
      {6, "{\"htype\":\"dcountrate_table-1.0\",\"shape\":[3,5],\"type\":\"float32\"}", BEAM_ESHAPE,
       "dectris v1: dcountrate_table: blob size does not match shape x type"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    build_all(&m);
    sets(&m, cases[i].part, cases[i].json);
    if (cases[i].code) {
      EXPECT_REJECT(&m, cases[i].code, cases[i].why);
    } else {
      beam_dx_msg_t out;
      parse_ok(&m, &out);
    }
  }
  /* A blob where a JSON part is due. */
  build_all(&m);
  m.p[4] = m.p[5];
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dpixelmask part is not a JSON object");
}

/* ---- images ---- */

static const char *DIMAGE = "{\"frame\":2,\"hash\":\"0123456789abcdef0123456789abcdef\","
                            "\"htype\":\"dimage-1.0\",\"series\":6}";
static const char *DCONFIG = "{\"htype\":\"dconfig-1.0\",\"real_time\":99251,"
                             "\"start_time\":400242,\"stop_time\":499493}";

static void build_image(mp_t *m, const char *d, const void *blob, size_t len) {
  memset(m, 0, sizeof *m);
  adds(m, DIMAGE);
  adds(m, d);
  add(m, blob, len);
  adds(m, DCONFIG);
}

static uint16_t px16[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 65535};

static void test_image_raw(void **state) {
  (void)state;
  mp_t m;
  build_image(&m, "{\"encoding\":\"<\",\"htype\":\"dimage_d-1.0\",\"shape\":[4,3],\"size\":24,\"type\":\"uint16\"}",
              px16, sizeof px16);
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  assert_int_equal(out.kind, BEAM_DX_IMAGE);
  const beam_dx_image_t *im = &out.image;
  assert_int_equal(im->series_id, 6);
  assert_int_equal(out.end_series_id, 6);
  assert_int_equal(im->image_id, 2);
  assert_int_equal(im->nchannels, 1);
  const beam_dx_array_t *a = &im->data[0];
  assert_ptr_equal(a->data, px16);
  assert_int_equal(a->size, 24);
  assert_int_equal(a->codec, BEAM_CODEC_RAW);
  assert_int_equal(a->dtype, BEAM_DT_U16);
  assert_int_equal(a->ndim, 2);
  assert_int_equal(a->shape[0], 3); /* y */
  assert_int_equal(a->shape[1], 4); /* x */
  assert_int_equal(a->raw_size, 24);
  assert_int_equal(im->has_ticks, 1);
  assert_int_equal(im->start_ticks, 400242);
  assert_int_equal(im->stop_ticks, 499493);
  assert_int_equal(im->real_ticks, 99251);
  assert_true(isnan(im->start_time_s) && isnan(im->stop_time_s) && isnan(im->real_time_s));
  assert_int_equal(im->hash_len, 32);
  assert_memory_equal(im->hash, "0123456789abcdef0123456789abcdef", 32);
  assert_true(im->hash > (const char *)m.p[0].data &&
              im->hash < (const char *)m.p[0].data + m.p[0].size);
  assert_null(im->user_data);

  /* image_appendix, extra keys, no size/hash/ticks, a later minor version. */
  memset(&m, 0, sizeof m);
  adds(&m, "{\"acqID\":\"a\",\"frame\":0,\"htype\":\"dimage-1.1\",\"series\":6}");
  adds(&m, "{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"uint16\",\"extra\":{\"x\":[1,2]}}");
  add(&m, px16, sizeof px16);
  adds(&m, "{\"htype\":\"dconfig-1.0\",\"start_time\":5}");
  adds(&m, "appendix: not JSON");
  parse_ok(&m, &out);
  assert_int_equal(out.image.image_id, 0);
  assert_null(out.image.hash);
  assert_int_equal(out.image.has_ticks, 0);
  assert_int_equal(out.image.start_ticks, 5);
  assert_ptr_equal(out.image.user_data, m.p[4].data);
  assert_int_equal(out.image.user_data_len, m.p[4].size);
  add(&m, px16, 2);
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dimage: more than 4 parts and an appendix");

  /* uint8 and uint32 raw. */
  static const uint8_t px8[6] = {1, 2, 3, 4, 5, 6};
  build_image(&m, "{\"encoding\":\"<\",\"shape\":[3,2],\"size\":6,\"type\":\"uint8\"}", px8, 6);
  parse_ok(&m, &out);
  assert_int_equal(out.image.data[0].dtype, BEAM_DT_U8);
  static const uint32_t px32[6] = {1, 2, 3, 4, 5, 6};
  build_image(&m, "{\"encoding\":\"<\",\"shape\":[3,2],\"size\":24,\"type\":\"uint32\"}", px32, 24);
  parse_ok(&m, &out);
  assert_int_equal(out.image.data[0].dtype, BEAM_DT_U32);
  assert_int_equal(out.image.data[0].raw_size, 24);
}

/* The EIGER 4M frame of the DLS capture: 2070 x 2167 uint16, bs16-lz4<,
 * built with the real codec and decoded back. */
static void test_image_bslz4_real(void **state) {
  (void)state;
  const size_t x = 2070, y = 2167, raw = x * y * 2;
  uint16_t *img = malloc(raw);
  assert_non_null(img);
  for (size_t i = 0; i < x * y; i++) img[i] = (uint16_t)((i * 2654435761u >> 28) % 7 == 0 ? i % 5 : 0);
  img[12345] = 65535;
  size_t cap = beam_codec_bound(BEAM_CODEC_BSLZ4, raw, 2);
  uint8_t *blob = malloc(cap), *scratch = malloc(raw), *back = malloc(raw);
  assert_true(blob && scratch && back);
  int64_t len = beam_codec_encode(BEAM_CODEC_BSLZ4, img, raw, 2, blob, cap, scratch);
  assert_true(len > 12);
  /* The framing header of streamfile_12: 8 971 380 bytes, 8192-B blocks. */
  static const uint8_t hdr[12] = {0, 0, 0, 0, 0x00, 0x88, 0xe4, 0x74, 0x00, 0x00, 0x20, 0x00};
  assert_memory_equal(blob, hdr, 12);

  char d[160];
  snprintf(d, sizeof d, "{\"encoding\":\"bs16-lz4<\",\"shape\":[2070,2167],\"size\":%lld,\"type\":\"uint16\"}",
           (long long)len);
  mp_t m;
  build_image(&m, d, blob, (size_t)len);
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  const beam_dx_array_t *a = &out.image.data[0];
  assert_int_equal(a->codec, BEAM_CODEC_BSLZ4);
  assert_int_equal(a->shape[0], 2167);
  assert_int_equal(a->shape[1], 2070);
  assert_int_equal(a->raw_size, raw);
  assert_ptr_equal(a->data, blob);
  assert_int_equal(a->size, (size_t)len);
  const char *why = NULL;
  assert_int_equal(beam_codec_decode(a->codec, a->data, a->size, back, (size_t)a->raw_size,
                                     beam_dtype_size(a->dtype), scratch, &why), 0);
  assert_memory_equal(back, img, raw);

  /* size key off by one. */
  snprintf(d, sizeof d, "{\"encoding\":\"bs16-lz4<\",\"shape\":[2070,2167],\"size\":%lld,\"type\":\"uint16\"}",
           (long long)len + 1);
  build_image(&m, d, blob, (size_t)len);
  EXPECT_REJECT(&m, BEAM_ESHAPE, "dectris v1: dimage_d: size does not match the blob part");
  /* The shape of a different detector than the blob's framing says. */
  snprintf(d, sizeof d, "{\"encoding\":\"bs16-lz4<\",\"shape\":[2070,2166],\"size\":%lld,\"type\":\"uint16\"}",
           (long long)len);
  build_image(&m, d, blob, (size_t)len);
  EXPECT_REJECT(&m, BEAM_ESHAPE, "dectris v1: decoded size does not match the shape");
  /* Under the 12-byte framing header. */
  build_image(&m, "{\"encoding\":\"bs16-lz4<\",\"shape\":[2070,2167],\"type\":\"uint16\"}", blob, 11);
  EXPECT_REJECT(&m, BEAM_ESHAPE, "dectris v1: dimage: compressed blob under 12 bytes");
  /* bs16 on uint32 pixels. */
  build_image(&m, "{\"encoding\":\"bs16-lz4<\",\"shape\":[2070,2167],\"type\":\"uint32\"}", blob, (size_t)len);
  EXPECT_REJECT(&m, BEAM_ENOTSUP, "dectris v1: dimage_d: bitshuffle element size differs from the type");
  free(img);
  free(blob);
  free(scratch);
  free(back);
}

/* bs8 and bs32, and lz4< (a bare LZ4 block), each decoded back. */
static void test_image_other_codecs(void **state) {
  (void)state;
  static const struct {
    const char *enc, *type;
    beam_codec_t codec;
    size_t elem;
  } cases[] = {
      {"bs8-lz4<", "uint8", BEAM_CODEC_BSLZ4, 1},
      {"bs32-lz4<", "uint32", BEAM_CODEC_BSLZ4, 4},
      {"lz4<", "uint16", BEAM_CODEC_LZ4_BLOCK, 2},
      {"lz4<", "uint32", BEAM_CODEC_LZ4_BLOCK, 4},
      {"\\u003c", "uint8", BEAM_CODEC_RAW, 1}, /* "<" escaped */
  };
  const size_t x = 100, y = 37;
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    size_t raw = x * y * cases[c].elem;
    uint8_t *img = malloc(raw), *scratch = malloc(raw), *back = malloc(raw);
    size_t cap = beam_codec_bound(cases[c].codec, raw, cases[c].elem);
    uint8_t *blob = malloc(cap);
    assert_true(img && scratch && back && blob && cap);
    for (size_t i = 0; i < raw; i++) img[i] = (uint8_t)(i % 3 == 0 ? i / 7 : 0);
    int64_t len = beam_codec_encode(cases[c].codec, img, raw, cases[c].elem, blob, cap, scratch);
    assert_true(len > 0);
    char d[160];
    snprintf(d, sizeof d, "{\"encoding\":\"%s\",\"shape\":[100,37],\"size\":%lld,\"type\":\"%s\"}",
             cases[c].enc, (long long)len, cases[c].type);
    mp_t m;
    build_image(&m, d, blob, (size_t)len);
    beam_dx_msg_t out;
    parse_ok(&m, &out);
    const beam_dx_array_t *a = &out.image.data[0];
    assert_int_equal(a->codec, cases[c].codec);
    assert_int_equal(a->raw_size, raw);
    assert_int_equal(beam_dtype_size(a->dtype), cases[c].elem);
    const char *why = NULL;
    if (beam_codec_decode(a->codec, a->data, a->size, back, (size_t)a->raw_size, cases[c].elem, scratch, &why))
      fail_msg("case %zu: decode failed: %s", c, why);
    assert_memory_equal(back, img, raw);
    free(img);
    free(scratch);
    free(back);
    free(blob);
  }
  /* A bare LZ4 block declares no size: any length is left to the decoder,
   * even for a shape whose product only just fits 64 bits. */
  static const uint8_t junk[3] = {1, 2, 3};
  mp_t m;
  build_image(&m, "{\"encoding\":\"lz4<\",\"shape\":[4294967295,4294967295],\"type\":\"uint8\"}", junk, 3);
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  assert_true(out.image.data[0].raw_size == 4294967295ull * 4294967295ull);
}

static void test_image_reject(void **state) {
  (void)state;
  static const struct {
    const char *d;
    int code;
    const char *why;
  } cases[] = {
      {"{\"encoding\":\">\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_ENOTSUP, "dectris v1: unknown encoding"},
      {"{\"encoding\":\"bs16<\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_ENOTSUP, "dectris v1: unknown encoding"},
      {"{\"encoding\":\"bs16-lz4>\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_ENOTSUP, "dectris v1: unknown encoding"},
      {"{\"encoding\":\"lz4<x\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_ENOTSUP, "dectris v1: unknown encoding"},
      {"{\"encoding\":\"\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_ENOTSUP, "dectris v1: unknown encoding"},
      {"{\"encoding\":\"bs64-lz4<\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_ENOTSUP, "dectris v1: unknown encoding"},
      {"{\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_EPROTO, "dectris v1: dimage_d: encoding is not a string"},
      {"{\"encoding\":60,\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_EPROTO, "dectris v1: dimage_d: encoding is not a string"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"float32\"}", BEAM_ENOTSUP, "dectris v1: unknown dtype"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"int16\"}", BEAM_ENOTSUP, "dectris v1: unknown dtype"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"uint64\"}", BEAM_ENOTSUP, "dectris v1: unknown dtype"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"UINT16\"}", BEAM_ENOTSUP, "dectris v1: unknown dtype"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":16}", BEAM_EPROTO, "dectris v1: dimage_d: type is not a string"},
      {"{\"encoding\":\"<\",\"shape\":[4,3]}", BEAM_EPROTO, "dectris v1: dimage_d: type is not a string"},
      {"{\"encoding\":\"<\",\"shape\":[4,3,1],\"type\":\"uint16\"}", BEAM_EPROTO, "dectris v1: dimage_d: shape is not [x, y]"},
      {"{\"encoding\":\"<\",\"shape\":[12],\"type\":\"uint16\"}", BEAM_EPROTO, "dectris v1: dimage_d: shape is not [x, y]"},
      {"{\"encoding\":\"<\",\"shape\":[\"4\",3],\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: shape is not an array of unsigned integers"},
      {"{\"encoding\":\"<\",\"shape\":[-4,3],\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: shape is not an array of unsigned integers"},
      {"{\"encoding\":\"<\",\"shape\":[4.0,3],\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: shape is not an array of unsigned integers"},
      {"{\"encoding\":\"<\",\"shape\":{\"x\":4},\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: shape is not an array of unsigned integers"},
      {"{\"encoding\":\"<\",\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: shape is not an array of unsigned integers"},
      {"{\"encoding\":\"<\",\"shape\":[0,3],\"type\":\"uint16\"}", BEAM_ESHAPE, "dectris v1: dimage_d: zero or too large dimension"},
      {"{\"encoding\":\"<\",\"shape\":[4,0],\"type\":\"uint16\"}", BEAM_ESHAPE, "dectris v1: dimage_d: zero or too large dimension"},
      {"{\"encoding\":\"<\",\"shape\":[4294967296,1],\"type\":\"uint8\"}", BEAM_ESHAPE, "dectris v1: dimage_d: zero or too large dimension"},
      {"{\"encoding\":\"<\",\"shape\":[18446744073709551615,1],\"type\":\"uint8\"}", BEAM_ESHAPE,
       "dectris v1: dimage_d: zero or too large dimension"},
      {"{\"encoding\":\"<\",\"shape\":[18446744073709551616,1],\"type\":\"uint8\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: shape is not an array of unsigned integers"},
      {"{\"encoding\":\"lz4<\",\"shape\":[4294967295,4294967295],\"type\":\"uint16\"}", BEAM_ESHAPE,
       "dectris v1: dimage_d: shape x type overflows"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"size\":23,\"type\":\"uint16\"}", BEAM_ESHAPE,
       "dectris v1: dimage_d: size does not match the blob part"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"size\":\"24\",\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: size is not an unsigned integer"},
      {"{\"encoding\":\"<\",\"shape\":[4,4],\"type\":\"uint16\"}", BEAM_ESHAPE,
       "dectris v1: dimage: raw blob size does not match shape x type"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"uint8\"}", BEAM_ESHAPE,
       "dectris v1: dimage: raw blob size does not match shape x type"},
      {"{\"encoding\":\"bs16-lz4<\",\"shape\":[2,6],\"type\":\"uint16\"}", BEAM_ESHAPE,
       "dectris v1: decoded size does not match the shape"},
      {"{\"encoding\":\"<\",\"htype\":\"dconfig-1.0\",\"shape\":[4,3],\"type\":\"uint16\"}", BEAM_EPROTO,
       "dectris v1: dimage_d: unexpected htype"},
      {"{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"uint16\"", BEAM_EPROTO, "dectris v1: dimage_d part is not a JSON object"},
      {"encoding=<", BEAM_EPROTO, "dectris v1: dimage_d part is not a JSON object"},
      {"", BEAM_EPROTO, "dectris v1: dimage_d part is not a JSON object"},
  };
  /* 24 bytes: the right size for raw [4,3] uint16; read as a bitshuffle
   * framing header it declares 25 decoded bytes, which no shape above has. */
  static uint8_t blob[24] = {0, 0, 0, 0, 0, 0, 0, 25, 0, 0, 0x20, 0};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    mp_t m;
    build_image(&m, cases[i].d, blob, sizeof blob);
    EXPECT_REJECT(&m, cases[i].code, cases[i].why);
  }

  /* dimage (part 1) and dconfig (part 4). */
  static const char *D_OK = "{\"encoding\":\"<\",\"shape\":[4,3],\"type\":\"uint16\"}";
  static const struct {
    size_t part;
    const char *json;
    int code;
    const char *why;
  } parts[] = {
      {0, "{\"frame\":2,\"htype\":\"dimage-1.0\"}", BEAM_EPROTO, "dectris v1: dimage: no series"},
      {0, "{\"frame\":2,\"htype\":\"dimage-1.0\",\"series\":6.5}", BEAM_EPROTO,
       "dectris v1: dimage: series is not an unsigned integer"},
      {0, "{\"htype\":\"dimage-1.0\",\"series\":6}", BEAM_EPROTO, "dectris v1: dimage: no frame"},
      {0, "{\"frame\":-1,\"htype\":\"dimage-1.0\",\"series\":6}", BEAM_EPROTO,
       "dectris v1: dimage: frame is not an unsigned integer"},
      {0, "{\"frame\":\"2\",\"htype\":\"dimage-1.0\",\"series\":6}", BEAM_EPROTO,
       "dectris v1: dimage: frame is not an unsigned integer"},
      {0, "{\"frame\":2,\"hash\":12,\"htype\":\"dimage-1.0\",\"series\":6}", BEAM_EPROTO,
       "dectris v1: dimage: hash is not a string"},
      {3, "{\"htype\":\"dconfig-1.0\",\"real_time\":99251,\"start_time\":400242", BEAM_EPROTO,
       "dectris v1: dconfig part is not a JSON object"},
      {3, "real_time=99251", BEAM_EPROTO, "dectris v1: dconfig part is not a JSON object"},
      {3, "{\"htype\":\"dimage-1.0\"}", BEAM_EPROTO, "dectris v1: dconfig: unexpected htype"},
      {3, "{\"start_time\":\"1\"}", BEAM_EPROTO, "dectris v1: dconfig: start_time is not an unsigned integer"},
      {3, "{\"stop_time\":-1}", BEAM_EPROTO, "dectris v1: dconfig: stop_time is not an unsigned integer"},
      {3, "{\"real_time\":0.5}", BEAM_EPROTO, "dectris v1: dconfig: real_time is not an unsigned integer"},
  };
  for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
    mp_t m;
    build_image(&m, D_OK, px16, sizeof px16);
    sets(&m, parts[i].part, parts[i].json);
    EXPECT_REJECT(&m, parts[i].code, parts[i].why);
  }

  /* Truncated multipart. */
  for (size_t n = 1; n < 4; n++) {
    mp_t m;
    build_image(&m, D_OK, px16, sizeof px16);
    m.n = n;
    EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dimage: truncated multipart (fewer than 4 parts)");
  }
}

/* ---- end, classification ---- */

static void test_end(void **state) {
  (void)state;
  mp_t m = {0};
  adds(&m, "{\"htype\":\"dseries_end-1.0\",\"series\":6}");
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  assert_int_equal(out.kind, BEAM_DX_END);
  assert_int_equal(out.end_series_id, 6);
  adds(&m, "{}");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dseries_end: more than one part");
  m.n = 1;
  sets(&m, 0, "{\"htype\":\"dseries_end-1.0\"}");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dseries_end: no series");
  sets(&m, 0, "{\"htype\":\"dseries_end-1.0\",\"series\":null}");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: dseries_end: series is not an unsigned integer");
}

static void test_classify(void **state) {
  (void)state;
  mp_t m = {0};
  static const uint8_t bin[] = {0xd9, 0xd9, 0xf7, 0xa1, 0x64};
  add(&m, bin, sizeof bin);
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 is not a JSON object");
  static const char *not_obj[] = {
      "", "   ", "hello", "[]", "\"dheader-1.0\"", "{\"htype\":\"dimage-1.0\"",
      "{\"htype\":\"dimage-1.0\",}", "{'htype':'dimage-1.0'}", "{\"htype\":\"dimage-1.0\"}\n{}",
  };
  for (size_t i = 0; i < sizeof not_obj / sizeof *not_obj; i++) {
    sets(&m, 0, not_obj[i]);
    EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 is not a JSON object");
  }
  /* A NUL terminator sent along is not JSON. */
  static const char with_nul[] = "{\"htype\":\"dseries_end-1.0\",\"series\":6}";
  m.p[0] = (beam_part_t){with_nul, sizeof with_nul, NULL};
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 is not a JSON object");

  sets(&m, 0, "{}");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 has no htype string");
  sets(&m, 0, "{\"htype\":1.0,\"series\":6}");
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 has no htype string");
  sets(&m, 0, "{\"a\":{\"htype\":\"dseries_end-1.0\"},\"series\":6}"); /* nested does not count */
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 has no htype string");
  static const char *unknown[] = {
      "{\"htype\":\"dfoo-1.0\",\"series\":6}",
      "{\"htype\":\"deseries_end-1.0\",\"series\":6}", /* LiberTEM's generator quirk */
      "{\"htype\":\"dheader\",\"series\":6}",
      "{\"htype\":\"dimage_d-1.0\",\"series\":6}", /* dimage_d is no dimage */
      "{\"htype\":\"\",\"series\":6}",
  };
  for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
    sets(&m, 0, unknown[i]);
    EXPECT_REJECT(&m, BEAM_ENOTSUP, "dectris v1: unknown htype");
  }
  /* An escaped htype is the same htype. */
  sets(&m, 0, "{\"\\u0068type\":\"dseries_end\\u002d1.0\",\"series\":9}");
  beam_dx_msg_t out;
  parse_ok(&m, &out);
  assert_int_equal(out.end_series_id, 9);

  m.n = 0;
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: no parts");
  const char *why = NULL;
  assert_int_equal(beam_dx1_parse(NULL, 1, &out, &why), BEAM_EINVAL);
  assert_int_equal(beam_dx1_parse(m.p, 1, NULL, &why), BEAM_EINVAL);
  beam_part_t nul = {NULL, 0, NULL};
  assert_int_equal(beam_dx1_parse(&nul, 1, &out, NULL), BEAM_EPROTO); /* why may be NULL */
}

/* ---- JSON scanner ---- */

static int valid(const char *s) {
  beam_js_t v;
  return beam_js_parse(s, strlen(s), &v) == 0;
}

static void test_js_grammar(void **state) {
  (void)state;
  static const char *good[] = {
      "{}", " { } ", "[]", "0", "-0", "1.5e-3", "1E+2", "-12.25", "1e5", "true", "false", "null",
      "\"\"", "{\"a\":[1,{\"b\":null},\"x\",true,false,-0.0]}", "\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"",
      "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"", "\"\\udc00\"", /* lone surrogates are grammatical */
      "[\n\t1 ,\r 2 ]",
  };
  for (size_t i = 0; i < sizeof good / sizeof *good; i++)
    if (!valid(good[i])) fail_msg("rejected valid JSON: %s", good[i]);
  static const char *bad[] = {
      "", " ", "{", "}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "[1,]", "[,1]", "{'a':1}", "{a:1}",
      "01", "1.", ".5", "1e", "1e+", "+1", "-", "--1", "0x10", "NaN", "Infinity", "-Infinity", "tru",
      "nul", "True", "\"abc", "\"\\q\"", "\"\\u12\"", "\"\\u12G4\"", "\"tab\there\"", "\"a\nb\"",
      "{\"a\":1} x", "{}{}", "[1 2]", "{\"a\" 1}", "{\"a\":1 \"b\":2}", "/*c*/{}", "{}//", "\"\xc0\xaf\"",
      "\"\xed\xa0\x80\"", "\"\x80\"", "\"\xe2\x82\"", "\"\xf5\x80\x80\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xe0\x80\xaf\"",
      "\"\xff\"", "[1]]", "[[1]",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (valid(bad[i])) fail_msg("accepted invalid JSON: %s", bad[i]);
  /* Embedded and trailing NUL bytes. */
  beam_js_t v;
  assert_int_equal(beam_js_parse("{}\0", 3, &v), -1);
  assert_int_equal(beam_js_parse("\"a\0b\"", 5, &v), -1);
  assert_int_equal(beam_js_parse("{}", 2, &v), 0);
  assert_int_equal(beam_js_parse(NULL, 0, &v), -1);
  assert_int_equal(beam_js_object("[1]", 3, &v), -1);
  assert_int_equal(beam_js_object(" {\"a\":1}\n", 9, &v), 0);
  assert_int_equal(v.len, 7);
  assert_int_equal(v.p[0], '{');
  /* Every prefix of a valid document is invalid (truncation). */
  const char *doc = "{\"a\":[1,2.5e3,{\"b\":\"x\\u0041\"}],\"c\":true,\"d\":null}";
  for (size_t n = 0; n < strlen(doc); n++)
    if (beam_js_parse(doc, n, &v) == 0) fail_msg("accepted a truncation at %zu", n);
  assert_int_equal(beam_js_parse(doc, strlen(doc), &v), 0);
}

static void test_js_depth(void **state) {
  (void)state;
  char buf[20100];
  for (int depth = 30; depth <= 34; depth++) {
    size_t n = 0;
    for (int i = 0; i < depth; i++) buf[n++] = '[';
    for (int i = 0; i < depth; i++) buf[n++] = ']';
    beam_js_t v;
    int ok = beam_js_parse(buf, n, &v) == 0;
    assert_int_equal(ok, depth <= BEAM_JS_MAX_DEPTH);
    /* The same with objects. */
    n = 0;
    for (int i = 0; i < depth; i++) memcpy(buf + n, "{\"a\":", 5), n += 5;
    buf[n++] = '1';
    for (int i = 0; i < depth; i++) buf[n++] = '}';
    ok = beam_js_parse(buf, n, &v) == 0;
    assert_int_equal(ok, depth <= BEAM_JS_MAX_DEPTH);
  }
  /* Far deeper than the limit: refused, not a stack overflow. */
  memset(buf, '[', 10000);
  memset(buf + 10000, ']', 10000);
  beam_js_t v;
  assert_int_equal(beam_js_parse(buf, 20000, &v), -1);
  /* The decoder rejects a deeply nested part as not JSON. */
  mp_t m = {0};
  size_t n = 0;
  n += (size_t)sprintf(buf, "{\"htype\":\"dseries_end-1.0\",\"series\":6,\"x\":");
  for (int i = 0; i < 40; i++) buf[n++] = '[';
  for (int i = 0; i < 40; i++) buf[n++] = ']';
  buf[n++] = '}';
  add(&m, buf, n);
  EXPECT_REJECT(&m, BEAM_EPROTO, "dectris v1: part 1 is not a JSON object");
}

static void test_js_get_members(void **state) {
  (void)state;
  const char *s = "{\"a\":1,\"b\":{\"a\":2,\"c\":[3]},\"a\":4,\"\\u0068type\":\"x\",\"e\":[]}";
  beam_js_t obj, v, k;
  assert_int_equal(beam_js_object(s, strlen(s), &obj), 0);
  uint64_t x;
  assert_int_equal(beam_js_get(obj, "a", &v), 1);
  assert_int_equal(beam_js_u64(v, &x), 0);
  assert_int_equal(x, 4); /* the last duplicate counts */
  assert_int_equal(beam_js_get(obj, "c", &v), 0); /* nested keys are not top level */
  assert_int_equal(beam_js_get(obj, "htype", &v), 1);
  assert_true(beam_js_str_eq(v, "x"));
  assert_int_equal(beam_js_get(obj, "b", &v), 1);
  assert_int_equal(beam_js_typeof(v), BEAM_JS_OBJECT);
  assert_int_equal(beam_js_get(v, "a", &v), 1);
  assert_int_equal(beam_js_u64(v, &x), 0);
  assert_int_equal(x, 2);
  assert_int_equal(beam_js_get(obj, "", &v), 0);
  size_t pos = 0, count = 0;
  int r;
  while ((r = beam_js_member(obj, &pos, &k, &v)) > 0) count++;
  assert_int_equal(r, 0);
  assert_int_equal(count, 5);
  assert_int_equal(k.p[0], '"');
  assert_int_equal(beam_js_typeof(v), BEAM_JS_ARRAY);
  pos = 0;
  assert_int_equal(beam_js_element(v, &pos, &k), 0); /* empty array */
  /* Not an object: -1. */
  beam_js_t arr = {"[1]", 3};
  pos = 0;
  assert_int_equal(beam_js_member(arr, &pos, &k, &v), -1);
  assert_int_equal(beam_js_get(arr, "a", &v), -1);
  beam_js_t broken = {"{\"a\":1,", 7};
  assert_int_equal(beam_js_get(broken, "b", &v), -1);
  beam_js_t empty = {"{}", 2};
  assert_int_equal(beam_js_get(empty, "a", &v), 0);
}

static beam_js_t js(const char *s) {
  beam_js_t v;
  if (beam_js_parse(s, strlen(s), &v)) fail_msg("not JSON: %s", s);
  return v;
}

static void test_js_numbers(void **state) {
  (void)state;
  uint64_t x = 7;
  assert_int_equal(beam_js_u64(js("0"), &x), 0);
  assert_int_equal(x, 0);
  assert_int_equal(beam_js_u64(js("18446744073709551615"), &x), 0);
  assert_true(x == UINT64_MAX);
  assert_int_equal(beam_js_u64(js("18446744073709551616"), &x), -1);
  assert_int_equal(beam_js_u64(js("99999999999999999999"), &x), -1);
  assert_int_equal(beam_js_u64(js("-1"), &x), -1);
  assert_int_equal(beam_js_u64(js("-0"), &x), -1);
  assert_int_equal(beam_js_u64(js("1.0"), &x), -1);
  assert_int_equal(beam_js_u64(js("1e3"), &x), -1);
  assert_int_equal(beam_js_u64(js("\"1\""), &x), -1);
  assert_int_equal(beam_js_u64(js("true"), &x), -1);

  double d = 0;
  assert_int_equal(beam_js_num(js("1.5e-3"), &d), 0);
  assert_true(d == 1.5e-3);
  assert_int_equal(beam_js_num(js("-0.25"), &d), 0);
  assert_true(d == -0.25);
  assert_int_equal(beam_js_num(js("12"), &d), 0);
  assert_true(d == 12.0);
  assert_int_equal(beam_js_num(js("1E2"), &d), 0);
  assert_true(d == 100.0);
  assert_int_equal(beam_js_num(js("-7.5E+1"), &d), 0);
  assert_true(d == -75.0);
  assert_int_equal(beam_js_num(js("2.5e-400"), &d), 0); /* underflow is fine */
  assert_true(d >= 0 && d < 1e-300);
  assert_int_equal(beam_js_num(js("1e400"), &d), -1); /* overflow to inf is not */
  assert_int_equal(beam_js_num(js("-1e400"), &d), -1);
  assert_int_equal(beam_js_num(js("null"), &d), -1);
  assert_int_equal(beam_js_num(js("\"1\""), &d), -1);
  /* Spans the scanner did not make: strtod's extras are refused. */
  beam_js_t hex = {"0x10", 4}, inf = {"-inf", 4}, sp = {"1 ", 2};
  assert_int_equal(beam_js_num(hex, &d), -1);
  assert_int_equal(beam_js_num(inf, &d), -1);
  assert_int_equal(beam_js_num(sp, &d), -1);
  char longnum[300];
  memset(longnum, '1', sizeof longnum - 1);
  longnum[sizeof longnum - 1] = 0;
  assert_int_equal(beam_js_num(js(longnum), &d), -1);

  int b = 5;
  assert_int_equal(beam_js_bool(js("true"), &b), 0);
  assert_int_equal(b, 1);
  assert_int_equal(beam_js_bool(js("false"), &b), 0);
  assert_int_equal(b, 0);
  assert_int_equal(beam_js_bool(js("1"), &b), -1);
  assert_int_equal(beam_js_bool(js("null"), &b), -1);

  assert_int_equal(beam_js_typeof(js("-1")), BEAM_JS_NUMBER);
  assert_int_equal(beam_js_typeof(js("\"\"")), BEAM_JS_STRING);
  assert_int_equal(beam_js_typeof(js("null")), BEAM_JS_NULL);
  assert_int_equal(beam_js_typeof(js("true")), BEAM_JS_TRUE);
  assert_int_equal(beam_js_typeof(js("false")), BEAM_JS_FALSE);
  beam_js_t none = {NULL, 0};
  assert_int_equal(beam_js_typeof(none), BEAM_JS_INVALID);

  uint64_t u[2] = {0, 0};
  size_t n = 0;
  assert_int_equal(beam_js_u64_array(js("[2070, 2167]"), u, 2, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(u[0], 2070);
  assert_int_equal(u[1], 2167);
  assert_int_equal(beam_js_u64_array(js("[1,2,3]"), u, 2, &n), 0);
  assert_int_equal(n, 3); /* longer than cap: counted, not written */
  assert_int_equal(u[1], 2);
  assert_int_equal(beam_js_u64_array(js("[]"), u, 2, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(beam_js_u64_array(js("[1,-2]"), u, 2, &n), -1);
  assert_int_equal(beam_js_u64_array(js("[1,[2]]"), u, 2, &n), -1);
  assert_int_equal(beam_js_u64_array(js("{\"a\":1}"), u, 2, &n), -1);
  double da[3];
  assert_int_equal(beam_js_num_array(js("[0.5,-1e1,3]"), da, 3, &n), 0);
  assert_int_equal(n, 3);
  assert_true(da[0] == 0.5 && da[1] == -10.0 && da[2] == 3.0);
  assert_int_equal(beam_js_num_array(js("[0.5,\"x\"]"), da, 3, &n), -1);
  assert_int_equal(beam_js_num_array(js("7"), da, 3, &n), -1);
}

static void test_js_strings(void **state) {
  (void)state;
  char buf[64];
  beam_js_t s = js("\"a\\\"b\\\\c\\/d\\n\\u00e9\\ud83d\\ude00\\t\"");
  int64_t n = beam_js_str_copy(s, buf, sizeof buf);
  static const char want[] = "a\"b\\c/d\n\xc3\xa9\xf0\x9f\x98\x80\t";
  assert_int_equal(n, (int64_t)strlen(want));
  assert_string_equal(buf, want);
  assert_int_equal(beam_js_str_copy(s, buf, (size_t)n), -1); /* no room for the NUL */
  assert_int_equal(beam_js_str_copy(s, buf, (size_t)n + 1), n);
  assert_int_equal(beam_js_str_copy(js("\"\\ud83d\""), buf, sizeof buf), -1); /* unpaired */
  assert_int_equal(beam_js_str_copy(js("\"\\ude00\""), buf, sizeof buf), -1);
  assert_int_equal(beam_js_str_copy(js("\"\\ud83d\\u0041\""), buf, sizeof buf), -1);
  assert_int_equal(beam_js_str_copy(js("\"a\\u0000b\""), buf, sizeof buf), -1);
  assert_int_equal(beam_js_str_copy(js("12"), buf, sizeof buf), -1);
  assert_int_equal(beam_js_str_copy(js("\"\""), buf, sizeof buf), 0);
  assert_string_equal(buf, "");
  assert_int_equal(beam_js_str_copy(js("\"\\u20AC\\u007f\""), buf, sizeof buf), 4);
  assert_string_equal(buf, "\xe2\x82\xac\x7f");

  assert_true(beam_js_str_eq(js("\"dheader-1.0\""), "dheader-1.0"));
  assert_true(beam_js_str_eq(js("\"d\\u0068eader\""), "dheader"));
  assert_false(beam_js_str_eq(js("\"dheader-1.0\""), "dheader-"));
  assert_false(beam_js_str_eq(js("\"dheader\""), "dheader-1.0"));
  assert_true(beam_js_str_prefix(js("\"dheader-1.0\""), "dheader-"));
  assert_true(beam_js_str_prefix(js("\"dheader-1.0\""), ""));
  assert_false(beam_js_str_prefix(js("\"dhead\""), "dheader-"));
  assert_false(beam_js_str_prefix(js("7"), ""));
  assert_true(beam_js_str_eq(js("\"\\u00e9\""), "\xc3\xa9"));
  assert_false(beam_js_str_eq(js("\"\\u00e9\""), "\xc3"));

  const char *raw = NULL;
  size_t len = 0;
  assert_int_equal(beam_js_str_raw(js("\"a\\nb\""), &raw, &len), 0);
  assert_int_equal(len, 4);
  assert_memory_equal(raw, "a\\nb", 4);
  assert_int_equal(beam_js_str_raw(js("[]"), &raw, &len), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_header_none),
      cmocka_unit_test(test_header_basic),
      cmocka_unit_test(test_header_config_fields),
      cmocka_unit_test(test_header_all),
      cmocka_unit_test(test_header_reject),
      cmocka_unit_test(test_image_raw),
      cmocka_unit_test(test_image_bslz4_real),
      cmocka_unit_test(test_image_other_codecs),
      cmocka_unit_test(test_image_reject),
      cmocka_unit_test(test_end),
      cmocka_unit_test(test_classify),
      cmocka_unit_test(test_js_grammar),
      cmocka_unit_test(test_js_depth),
      cmocka_unit_test(test_js_get_members),
      cmocka_unit_test(test_js_numbers),
      cmocka_unit_test(test_js_strings),
  };
  return beam_run_tests(tests, NULL, NULL);
}
