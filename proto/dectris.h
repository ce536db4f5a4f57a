/* DECTRIS SIMPLON detector streams: pure decoders of one ZeroMQ message.
 *
 * Stream v1 ("legacy", EIGER/EIGER2): JSON multipart messages (dheader,
 * dimage, dseries_end). Stream v2 (EIGER2 and later; PSI Jungfraujoch
 * speaks a superset): one single-part CBOR message per event (start,
 * image, end; Jungfraujoch adds calibration and metadata). Field facts:
 * shared/notes/detector-streams.md sections 1-3; docs/detectors.md says
 * what beamd does with each field.
 *
 * Like the rest of proto/: no sockets, no allocation, no logging, and no
 * copy of pixel data. Every blob, string and array below points into the
 * caller's parts and lives as long as they do. Rejections return a negative
 * code with *why set to a static reason:
 *   BEAM_EPROTO   malformed: not JSON / not CBOR where it is due, a part
 *                 missing (truncated multipart), a key of the wrong type,
 *                 wrong tag nesting, no CBOR signature, "type" not first;
 *   BEAM_ENOTSUP  well formed but not something beamd decodes: an unknown
 *                 encoding, dtype or compression algorithm, an unknown
 *                 htype or type;
 *   BEAM_ESHAPE   sizes disagree: blob size vs shape x dtype (or the
 *                 decoded size a compressed blob's framing declares),
 *                 dims x element size != data size, a compressed blob
 *                 under 12 bytes.
 * Stateful checks (image before a header, stale series, frame gaps, shape
 * against the series' configured size, the md5 hash) belong to the caller,
 * which holds the series. */
#ifndef BEAM_DECTRIS_H
#define BEAM_DECTRIS_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_DX_MAX_CHANNELS 4
#define BEAM_DX_NAME_MAX 64

typedef enum beam_dx_kind_e {
  BEAM_DX_NONE = 0,
  BEAM_DX_START = 1, /* v1 dheader (+ config, arrays); v2 "start" */
  BEAM_DX_IMAGE = 2, /* v1 dimage (+ dimage_d, blob, dconfig); v2 "image" */
  BEAM_DX_END = 3,   /* v1 dseries_end; v2 "end" */
  BEAM_DX_OTHER = 4, /* v2 messages beamd does not use (Jungfraujoch
                      * "calibration", "metadata"): other_type names it */
} beam_dx_kind_t;

/* A pixel array as sent: raw little-endian, or compressed (codec). */
typedef struct beam_dx_array_s {
  const void *data;  /* NULL: absent */
  size_t size;       /* bytes at data (encoded bytes when compressed) */
  beam_codec_t codec; /* RAW, LZ4 (32004 framing), BSLZ4, LZ4_BLOCK, BSZSTD */
  beam_dtype_t dtype;
  uint32_t ndim;     /* 1 or 2 */
  uint32_t shape[2]; /* C order, slowest first: [y, x] for images */
  uint64_t raw_size; /* decoded bytes = prod(shape) x dtype size */
  char channel[BEAM_DX_NAME_MAX]; /* v2: channel it belongs to; v1: "" */
} beam_dx_array_t;

typedef struct beam_dx_start_s {
  uint64_t series_id;
  char series_unique_id[BEAM_DX_NAME_MAX]; /* v2; v1: "" */
  int header_detail; /* v1: 0 none, 1 basic, 2 all; v2: -1 (not sent) */
  int have_config;   /* v1: the detector config part was there (basic, all) */
  /* Geometry: width = x_pixels_in_detector / image_size_x, height = y. 0 =
   * not sent (v1 header_detail none). */
  uint32_t width, height;
  beam_dtype_t dtype; /* v2 image_dtype; v1 from bit_depth_image when sent,
                       * else BEAM_DT_NONE (the first image tells) */
  uint64_t nimages, ntrigger; /* v1; v2: nimages = number_of_images, ntrigger 1 */
  /* Frames the series will carry: v1 ntrigger for trigger modes exte/inte,
   * nimages x ntrigger otherwise; v2 number_of_images. 0 = unknown. */
  uint64_t expected_frames;
  char trigger_mode[8];  /* v1: ints, inte, exts, exte; "" when not sent */
  /* NaN when not sent. Units: s, eV, angstrom, m, pixels. */
  double count_time, frame_time, energy_ev, wavelength_a, distance_m;
  double pixel_size_x, pixel_size_y, beam_center_x, beam_center_y, sensor_thickness_m;
  uint32_t bit_depth_image, bit_depth_readout; /* v1; 0 = not sent */
  uint64_t saturation_value; /* v2 saturation_value, v1 countrate_correction_count_cutoff; */
  int has_saturation;        /* 0 when not sent */
  int64_t error_value;       /* Jungfraujoch: marks error/missing pixels */
  int has_error_value;
  uint64_t magic_number;     /* Jungfraujoch interface version, 0 = not sent */
  /* v2 channels, in the order image data is serialised; v1: none. */
  unsigned nchannels;
  char channels[BEAM_DX_MAX_CHANNELS][BEAM_DX_NAME_MAX];
  double threshold_ev[BEAM_DX_MAX_CHANNELS]; /* by channel index; NaN = not sent */
  /* Series arrays (v1 header_detail all; v2 header_detail all): per channel
   * for v2, one each for v1: flatfield float32, pixel_mask uint32, the
   * count-rate table float32. Shapes in C order: v1 sends [x, y] (fast axis
   * first) and is reversed like an image's, so a v1 table of shape [2, N]
   * is [N, 2] here. */
  unsigned nflatfield, npixel_mask;
  beam_dx_array_t flatfield[BEAM_DX_MAX_CHANNELS];
  beam_dx_array_t pixel_mask[BEAM_DX_MAX_CHANNELS];
  beam_dx_array_t countrate; /* data NULL when absent */
  /* The whole detector description as sent: v1 the config part (JSON
   * text), v2 the whole start message (CBOR); beam_dx_meta_json turns
   * either into JSON. */
  const void *config;
  size_t config_len;
  const void *user_data; /* v1 header appendix part; v2 user_data (raw CBOR item) */
  size_t user_data_len;
  const char *arm_date;  /* v2 arm_date, RFC 3339 text (not NUL-terminated); NULL when not sent */
  size_t arm_date_len;
} beam_dx_start_t;

typedef struct beam_dx_image_s {
  uint64_t series_id;
  uint64_t image_id; /* v1 frame, v2 image_id */
  unsigned nchannels; /* v1: 1 */
  beam_dx_array_t data[BEAM_DX_MAX_CHANNELS]; /* v2: in the message's map order */
  /* v2 Rationals as seconds (NaN when not sent); v1 dconfig ticks. */
  double start_time_s, stop_time_s, real_time_s;
  uint64_t start_ticks, stop_ticks, real_ticks;
  int has_ticks;
  const char *hash; /* v1 md5 hex of the blob as sent (not NUL-terminated), NULL when not sent */
  size_t hash_len;
  const void *user_data; /* v1 image appendix part; v2 user_data (raw CBOR item) */
  size_t user_data_len;
  /* v2 series_date, RFC 3339 text (not NUL-terminated), NULL when not
   * sent: start_time and stop_time count from it. */
  const char *series_date;
  size_t series_date_len;
} beam_dx_image_t;

typedef struct beam_dx_msg_s {
  beam_dx_kind_t kind;
  int version; /* 1 or 2 */
  beam_dx_start_t start; /* kind START */
  beam_dx_image_t image; /* kind IMAGE */
  uint64_t end_series_id; /* kind END (also image/start's series_id) */
  char other_type[32];    /* kind OTHER */
} beam_dx_msg_t;

/* Which stream a message belongs to: 2 when it is one part starting with
 * the CBOR self-describe tag (d9 d9 f7), 1 when the first part starts (after
 * JSON whitespace) with '{', 0 otherwise. Looks at bytes, decides nothing
 * else. */
int beam_dx_detect(const beam_part_t *parts, size_t n);

/* Stream v1: the parts of one multipart message. Extra unknown keys are
 * ignored; an appendix (one part more than the fixed layout) is returned
 * in user_data. */
int beam_dx1_parse(const beam_part_t *parts, size_t n, beam_dx_msg_t *out, const char **why);

/* Stream v2 (and Jungfraujoch): one CBOR message. */
int beam_dx2_parse(const void *buf, size_t len, beam_dx_msg_t *out, const char **why);

/* JSON text of a start message's detector description, for the series
 * metadata: v1 copies the config part as it is; v2 converts the start
 * message's map to a JSON object (byte strings and typed arrays above
 * max_inline bytes become {"bytes": N}; Rationals [n, d] stay arrays; tags
 * other than typed arrays are dropped, their content kept). Writes at most
 * cap bytes including the NUL; returns the length written without the
 * NUL, or BEAM_ELIMIT when it did not fit, or BEAM_EPROTO. */
int64_t beam_dx_meta_json(const beam_dx_start_t *s, int version, char *out, size_t cap,
                          size_t max_inline);

#ifdef __cplusplus
}
#endif
#endif
