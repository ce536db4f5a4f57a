/* European XFEL Karabo bridge messages: a pure decoder of one ZeroMQ
 * multipart message (protocol 2.2, and 1.0), and the encoder pieces beamd's
 * Karabo output packs its messages from. Field facts:
 * shared/notes/detector-streams.md section 5; docs/karabo.md says what
 * beamd does with them.
 *
 * Protocol 2.2: an even number of parts, pairs (msgpack header, data). Per
 * source a header {source, content: "msgpack", metadata: {source,
 * timestamp, timestamp.sec, timestamp.frac, timestamp.tid, ...}} with the
 * msgpack map of the non-array keys as data, then per array a header
 * {source, content: "array", path, dtype, shape} with the raw C-contiguous
 * bytes as data. Protocol 1.0: one part, a msgpack map {source -> {key ->
 * value, metadata: {...}}} whose arrays are msgpack-numpy maps {nd: true,
 * type: "<u2", kind: "", shape: [...], data: bin}.
 *
 * The rules are the C++ client's (karabo-bridge-cpp), which is stricter
 * than the Python one: an odd part count, a header without content, a
 * msgpack header without metadata, an array without shape, dtype or path,
 * a dtype that is not a numpy name beamd knows, shape x itemsize != data
 * bytes: each refuses the whole message.
 *
 * Unlike the rest of proto/ this decoder uses a library, msgpack-c (C,
 * no I/O; the issue asks for it so the format is read by a maintained
 * implementation). It reads each header part with msgpack_unpack_next,
 * whose zone is one small allocation per header, freed before the call
 * returns; every string, data part and array below points into the
 * caller's parts (no pixel byte is copied). Before msgpack-c sees a
 * buffer, a walk of our own checks that every container's count fits the
 * bytes left, so a 5-byte message claiming 2^32 elements cannot make the
 * zone allocate gigabytes.
 *
 * Rejections return a negative code with *why set to a static reason:
 *   BEAM_EPROTO   malformed: odd part count, not msgpack, a header that is
 *                 not a map or lacks content/source/metadata/path/shape;
 *   BEAM_ENOTSUP  well formed but not decodable here: unknown content,
 *                 unknown dtype, a 1.0 big-endian array;
 *   BEAM_ESHAPE   shape x itemsize != data bytes;
 *   BEAM_ELIMIT   more sources, arrays or dimensions than the limits below.
 */
#ifndef BEAM_KARABO_H
#define BEAM_KARABO_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_KB_MAX_SOURCES 64
#define BEAM_KB_MAX_ARRAYS 256
#define BEAM_KB_MAX_NDIM 8

/* Text inside the message, not NUL-terminated. */
typedef struct beam_kb_str_s {
  const char *p;
  size_t n;
} beam_kb_str_t;

typedef struct beam_kb_array_s {
  unsigned source;    /* index into beam_kb_msg_t.src */
  beam_kb_str_t path; /* "image.data" */
  beam_dtype_t dtype;
  unsigned ndim;
  uint64_t shape[BEAM_KB_MAX_NDIM]; /* C order, slowest first */
  const void *data;                 /* raw C-contiguous little-endian bytes */
  size_t size;                      /* == prod(shape) x itemsize */
  int part;                         /* 2.2: index of its data part; 1.0: 0 */
} beam_kb_array_t;

typedef struct beam_kb_source_s {
  beam_kb_str_t name;
  int has_meta;        /* a metadata map came with it */
  int has_tid;
  uint64_t tid;        /* metadata timestamp.tid: the train id */
  int has_time;
  uint64_t sec;        /* metadata timestamp.sec and .frac (attoseconds), or */
  uint64_t frac_as;    /* from the float timestamp when only that came */
  const void *data;    /* 2.2: the data part of its msgpack header (a msgpack map) */
  size_t data_len;
  unsigned narrays;
} beam_kb_source_t;

typedef struct beam_kb_msg_s {
  int version; /* 1 (1.0) or 2 (2.2) */
  unsigned nsources, narrays;
  beam_kb_source_t src[BEAM_KB_MAX_SOURCES];
  beam_kb_array_t arr[BEAM_KB_MAX_ARRAYS];
} beam_kb_msg_t;

/* Which protocol: 1 for a single part, 2 for more (the Python client's
 * rule: fewer than 2 parts is 1.0), 0 for none. */
int beam_kb_detect(const beam_part_t *parts, size_t n);

/* Decodes one message of either protocol into out. Returns 0 or a negative
 * code (above) with *why; out is then empty (nsources 0). */
int beam_kb_parse(const beam_part_t *parts, size_t n, beam_kb_msg_t *out, const char **why);

/* The source named name (n bytes), or NULL. */
const beam_kb_source_t *beam_kb_source(const beam_kb_msg_t *m, const char *name, size_t n);
/* The array of source index s at path, or NULL. */
const beam_kb_array_t *beam_kb_array(const beam_kb_msg_t *m, unsigned s, const char *path,
                                     size_t n);

/* The numpy name of a numpy 1.0 type string ("<u2" -> BEAM_DT_U16);
 * BEAM_DT_NONE for big-endian or unknown ones. */
beam_dtype_t beam_kb_typestr_dtype(const char *s, size_t n);

/* 0 when buf is exactly one well-formed msgpack item whose containers'
 * counts all fit the bytes (the check run before msgpack-c), else -1. */
int beam_kb_msgpack_check(const void *buf, size_t len);

/* ---- encoding (protocol 2.2) ------------------------------------------------- */

/* Timestamps as the bridge writes them: sec, and the fraction as 18
 * digits of attoseconds. */
typedef struct beam_kb_time_s {
  uint64_t sec;
  uint64_t frac_as; /* < 10^18 */
} beam_kb_time_t;

beam_kb_time_t beam_kb_time_from_ns(uint64_t realtime_ns);

/* The msgpack header of a source: {source, content: "msgpack", metadata:
 * {source, timestamp, timestamp.sec, timestamp.frac, timestamp.tid,
 * ignored_keys: []}}. Appends to pk's buffer; 0 or BEAM_ENOMEM. */
int beam_kb_pack_source_header(msgpack_packer *pk, const char *source, beam_kb_time_t t,
                               uint64_t tid);
/* An array header: {source, content: "array", path, dtype (numpy name),
 * shape}. BEAM_EINVAL for a dtype without a numpy name. */
int beam_kb_pack_array_header(msgpack_packer *pk, const char *source, const char *path,
                              beam_dtype_t dtype, unsigned ndim, const uint32_t *shape);
/* A str (use_bin_type: text is str, bytes are bin). */
int beam_kb_pack_str(msgpack_packer *pk, const char *s);

#ifdef __cplusplus
}
#endif
#endif
