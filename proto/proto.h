/* beamd wire protocol v1: pure encode/decode over byte buffers.
 *
 * The normative description is proto/PROTOCOL.md; this header is its C
 * binding. Nothing here touches a socket, allocates, or logs: every decoder
 * checks hard limits before the caller allocates anything, and reports why a
 * message was rejected through a static reason string.
 *
 * A message is a ZeroMQ multipart message:
 *     [topic]? [header] [payload part]*  [metadata]?
 * - topic: optional first part, 1..BEAM_TOPIC_MAX bytes of [a-z0-9_.-]. It
 *   exists so ZeroMQ SUB prefix filtering works on result streams. A header
 *   part can never be mistaken for a topic: its first byte is 0x89.
 * - header: exactly hdr_size bytes (>= BEAM_HDR_SIZE_V1), little-endian.
 * - payload: hdr.nparts parts whose sizes add up to hdr.payload_size. Raw
 *   payloads may be split over several parts; compressed payloads are one
 *   part in HDF5 filter framing (LZ4 = filter 32004, bitshuffle+LZ4 = 32008).
 * - metadata: one JSON part, present iff BEAM_FLAG_META is set.
 */
#ifndef BEAM_PROTO_H
#define BEAM_PROTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_PROTO_MAJOR 1
#define BEAM_PROTO_MINOR 0
#define BEAM_HDR_SIZE_V1 128u
#define BEAM_HDR_SIZE_MAX 4096u   /* a later minor may grow the header */
#define BEAM_MAX_NDIM 4
#define BEAM_TOPIC_MAX 64
#define BEAM_MAX_PAYLOAD_PARTS 16
/* Replay over shared memory (section 13.6): the memfd name of a consumer's
 * landing area; a server maps only memfds whose name starts with it. */
#define BEAM_SHM_MEMFD_NAME "beamd-landing"
#define BEAM_MAGIC0 0x89u
#define BEAM_MAGIC1 'B'
#define BEAM_MAGIC2 'M'
#define BEAM_MAGIC3 'D'

typedef enum beam_msg_type_e {
  BEAM_MSG_SERIES_START = 1,
  BEAM_MSG_FRAME = 2,
  BEAM_MSG_SERIES_END = 3,
  BEAM_MSG_RESULT = 4,
} beam_msg_type_t;

typedef enum beam_dtype_e {
  BEAM_DT_NONE = 0,
  BEAM_DT_U8 = 1,
  BEAM_DT_U16 = 2,
  BEAM_DT_U32 = 3,
  BEAM_DT_U64 = 4,
  BEAM_DT_I8 = 5,
  BEAM_DT_I16 = 6,
  BEAM_DT_I32 = 7,
  BEAM_DT_I64 = 8,
  BEAM_DT_F32 = 9,
  BEAM_DT_F64 = 10,
  BEAM_DT_C64 = 11,  /* complex float: re, im float32 interleaved */
  BEAM_DT_C128 = 12, /* complex double */
  BEAM_DT_COUNT_
} beam_dtype_t;

typedef enum beam_codec_e {
  BEAM_CODEC_RAW = 0,
  BEAM_CODEC_LZ4 = 1,   /* HDF5 filter 32004 framing */
  BEAM_CODEC_BSLZ4 = 2, /* HDF5 filter 32008 framing (bitshuffle + LZ4) */
  BEAM_CODEC_WIRE_COUNT_, /* codecs below this one travel in beamd messages */
  /* Detector codecs a daemon's adapters keep frames in, so the loop thread
   * never decompresses; never on the wire (beam_hdr_decode rejects them). */
  BEAM_CODEC_LZ4_BLOCK = 3, /* one bare LZ4 block (DECTRIS stream v1 "lz4<") */
  BEAM_CODEC_BSZSTD = 4,    /* 32008 framing with Zstandard blocks (bitshuffle's zstd) */
  BEAM_CODEC_COUNT_
} beam_codec_t;

/* Header flags. Unknown flag bits are preserved and ignored by readers. */
enum {
  BEAM_FLAG_BAD = 1u << 0,      /* frame is bad (stages skip it, e.g. XPCS pairs) */
  BEAM_FLAG_META = 1u << 1,     /* a JSON metadata part follows the payload */
  BEAM_FLAG_POS = 1u << 2,      /* pos[] holds the scan position in metres */
  BEAM_FLAG_PARTIAL = 1u << 3,  /* RESULT: intermediate, more will follow */
  BEAM_FLAG_FINAL = 1u << 4,    /* RESULT: final result of the series */
  BEAM_FLAG_CORRUPT = 1u << 5,  /* source could not read this frame; no payload */
  BEAM_FLAG_ANOMALY = 1u << 6,  /* a stage flagged this frame (e.g. PCA residual) */
  BEAM_FLAG_ABORTED = 1u << 7,  /* SERIES_END: the series ended early (drain, error) */
  BEAM_FLAG_INCOMPLETE = 1u << 8, /* SERIES_END: frames of the series never arrived */
};

/* Decoded header (host form). Wire layout, little-endian, 128 bytes:
 *   0 u8[4] magic 0x89 'B' 'M' 'D'   4 u8 major   5 u8 minor   6 u16 hdr_size
 *   8 u16 type   10 u16 reserved   12 u32 flags
 *  16 u64 series_id   24 u64 frame_id   32 u64 seq
 *  40 u64 t_acq_ns    48 u64 t_send_ns
 *  56 u8 dtype  57 u8 ndim  58 u8 codec  59 u8 nparts   60 u32 stage_id
 *  64 u32 shape[4]    80 u64 raw_size   88 u64 payload_size
 *  96 f64 pos[3]     120 u32 meta_size 124 u32 reserved
 */
typedef struct beam_hdr_s {
  uint8_t major, minor;
  uint16_t hdr_size;
  uint16_t type;
  uint32_t flags;
  uint64_t series_id;
  uint64_t frame_id;
  uint64_t seq;       /* per sending endpoint, +1 per message, for gap detection */
  uint64_t t_acq_ns;  /* acquisition time, CLOCK_REALTIME ns (0 = unknown) */
  uint64_t t_send_ns; /* when the sender sent it */
  uint8_t dtype, ndim, codec, nparts;
  uint32_t stage_id;
  uint32_t shape[BEAM_MAX_NDIM]; /* slowest first, C order; unused dims are 0 */
  uint64_t raw_size;     /* decoded payload bytes = prod(shape) * dtype size */
  uint64_t payload_size; /* bytes on the wire over all payload parts */
  double pos[3];
  uint32_t meta_size;
} beam_hdr_t;

/* Hard limits, checked by the decoder before any caller allocation. */
typedef struct beam_limits_s {
  uint64_t max_raw_bytes;  /* decoded frame size */
  uint32_t max_dim;        /* per axis */
  uint32_t max_meta_bytes;
} beam_limits_t;

/* Defaults: 1 GiB frames, 65536 per axis, 16 MiB metadata. */
extern const beam_limits_t beam_limits_default;

/* Whoever holds the buffer a part's bytes lie in (a received ZeroMQ
 * message, a shared-memory slot, a mapped file) and can lend it to a frame
 * so the bytes are kept without a copy. proto/ only carries the pointer;
 * its users define it (daemon/input.h). */
typedef struct beam_owner_s beam_owner_t;

/* One part of a multipart message, borrowed. owner may be NULL (nobody can
 * keep the buffer: a reader that needs the bytes later copies them). */
typedef struct beam_part_s {
  const void *data;
  size_t size;
  beam_owner_t *owner;
} beam_part_t;

/* A parsed message: pointers into the caller's parts, nothing owned. */
typedef struct beam_msg_s {
  const char *topic; /* NULL when absent; not NUL-terminated */
  size_t topic_len;
  beam_hdr_t hdr;
  beam_part_t payload[BEAM_MAX_PAYLOAD_PARTS];
  unsigned npayload;
  const char *meta; /* JSON, not NUL-terminated; NULL when absent */
  size_t meta_len;
} beam_msg_t;

size_t beam_dtype_size(beam_dtype_t dt);  /* 0 for unknown */
/* Bytes of an array of dtype dt and shape[0..ndim): the one place that
 * multiplies them out (0 for an unknown dtype). */
size_t beam_geom_bytes(beam_dtype_t dt, uint32_t ndim, const uint32_t *shape);
const char *beam_dtype_name(beam_dtype_t dt);        /* "uint16", ... numpy names */
beam_dtype_t beam_dtype_from_name(const char *name); /* BEAM_DT_NONE if unknown */
const char *beam_msg_type_name(unsigned type);        /* "FRAME", ... or "UNKNOWN" */
const char *beam_codec_name(beam_codec_t c);         /* "raw", "lz4", "bslz4" */
uint64_t beam_hdr_nelems(const beam_hdr_t *h);       /* product of shape[0..ndim) */

/* Writes the 128-byte v1 header. h->hdr_size/major/minor are ignored (v1 is
 * written). Returns bytes written (BEAM_HDR_SIZE_V1) or a negative BEAM_E*. */
int beam_hdr_encode(const beam_hdr_t *h, uint8_t *out, size_t cap);

/* Decodes and validates one header part: magic, major version, hdr_size
 * (larger sizes from newer minors are accepted, extra bytes skipped), type,
 * dtype, ndim, codec, shape within limits, raw_size == nelems * dtype size,
 * and for RAW codec payload_size == raw_size. Returns 0 or BEAM_EPROTO with
 * *why set to a static reason. */
int beam_hdr_decode(const void *buf, size_t len, const beam_limits_t *lim,
                    beam_hdr_t *out, const char **why);

/* Splits a multipart message into topic/header/payload/metadata and checks
 * that the part count and sizes agree with the header. */
int beam_msg_parse(const beam_part_t *parts, size_t nparts,
                   const beam_limits_t *lim, beam_msg_t *out, const char **why);

/* Upper bound of the encoded size of n raw bytes with this codec. */
size_t beam_codec_bound(beam_codec_t codec, size_t raw_bytes, size_t elem_size);

/* Encodes raw -> dst in the codec's HDF5 filter framing. scratch must hold
 * raw_bytes (bitshuffle) or may be NULL (raw, lz4). Bitshuffle uses its
 * default block size (8192 bytes / elem_size, a multiple of 8, >= 128). Returns encoded size or a negative BEAM_E*. */
int64_t beam_codec_encode(beam_codec_t codec, const void *raw, size_t raw_bytes,
                          size_t elem_size, void *dst, size_t dst_cap,
                          void *scratch);

/* Decodes one payload buffer into dst (exactly raw_bytes). scratch must hold
 * raw_bytes for bitshuffle. Never writes past dst+raw_bytes, never reads past
 * src+src_len, rejects framing whose sizes disagree. Returns 0 or BEAM_EPROTO
 * with *why. */
int beam_codec_decode(beam_codec_t codec, const void *src, size_t src_len,
                      void *dst, size_t raw_bytes, size_t elem_size,
                      void *scratch, const char **why);

/* Decodes the whole payload of a parsed message (all parts) into dst, which
 * must hold msg->hdr.raw_size bytes. */
int beam_msg_payload(const beam_msg_t *msg, void *dst, void *scratch,
                     const char **why);

/* Bit transpose of bitshuffle (bshuf_trans_bit_elem / untrans), exact: a
 * portable vectorised path for element sizes 1/2/4/8/16, the scalar
 * per-tile loop otherwise; n must be a multiple of 8. Exposed for tests. */
void beam_bitshuffle(const void *in, void *out, size_t n, size_t elem_size);
void beam_bitunshuffle(const void *in, void *out, size_t n, size_t elem_size);

/* The loss count an INCOMPLETE message carries (PROTOCOL.md: a result's
 * or SERIES_END's metadata {"missing_frames": N}): 1 and *n when the flag
 * is set and the count is there and readable, else 0. */
int beam_msg_missing_frames(const beam_msg_t *msg, uint64_t *n);
/* The other side: the metadata that says so, into buf (cap bytes, NUL
 * terminated). obj NULL: {"missing_frames":N} alone (SERIES_END); else the
 * JSON object obj (a result's descriptor) with the key added last. Returns
 * the length, or -1 when it does not fit or obj is not an object (the
 * caller then sends obj unchanged). */
int beam_meta_with_missing(const char *obj, uint64_t n, char *buf, size_t cap);

/* Sets the seq field of a header already encoded by beam_hdr_encode (an
 * endpoint numbers the messages it sends, one encoding shared by all). */
void beam_hdr_set_seq(uint8_t *hdr, uint64_t seq);

/* Topic validity: 1..BEAM_TOPIC_MAX chars of [a-z0-9_.-]. */
int beam_topic_valid(const char *t, size_t len);

#ifdef __cplusplus
}
#endif
#endif
