/* Frames, series and the fixed pools that hold them.
 *
 * A beam_frame_t is a preallocated slot of a beam_pool_t: pixel bytes plus
 * the identity the wire header carried. Slots are reference counted so one
 * frame can feed several stages and the publisher without a copy; the last
 * unref returns the slot to its pool. Nothing here allocates on the
 * per-frame path: pools are sized when created (at start-up for the input
 * pool, at series start for stage outputs).
 *
 * A pool is itself reference counted by its outstanding frames, so an owner
 * may close it while frames are still in flight (in the publisher, say); the
 * memory goes when the last frame comes back. */
#ifndef BEAM_FRAME_H
#define BEAM_FRAME_H

/* C11 atomics; CUDA translation units (C++) get the layout-compatible
 * std::atomic types (gpu/cuda_int.h checks size and alignment). */
#ifdef __cplusplus
#include <atomic>
using std::atomic_int;
#else
#include <stdatomic.h>
#endif
#include <stddef.h>
#include <stdint.h>

#include "pipeline/array.h"
#include "proto/err.h"
#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct beam_pool_s beam_pool_t;

typedef struct beam_frame_s beam_frame_t;
struct beam_frame_s {
  uint64_t series_id, frame_id, seq;
  /* Position in the input's own order, monotonic for this daemon: the
   * replay index for replay input, a counter otherwise. Results inherit it,
   * which is how the graph knows which input frames are fully processed. */
  uint64_t ingest_idx;
  uint64_t t_acq_ns;  /* from the wire header (realtime ns, 0 = unknown) */
  uint64_t t_recv_ns; /* monotonic ns when beamd received the input frame */
  uint32_t flags;     /* BEAM_FLAG_* */
  /* Frames of the series lost just before this one (dropped or gone at
   * ingest): stateful stages account for them as absent frames (XPCS:
   * bad frames, their pairs skipped). Results inherit it (copy_ident). */
  uint32_t missing_before;
  beam_dtype_t dtype;
  uint32_t ndim;
  uint32_t shape[BEAM_MAX_NDIM];
  double pos[3];
  size_t nbytes; /* valid bytes in data */
  void *data;    /* slot storage (64-byte aligned), or a borrowed buffer (see release) */
  size_t cap;    /* slot capacity in bytes */
  beam_pool_t *pool;
  atomic_int refs;
  unsigned index; /* slot number within its pool */
  /* Zero-copy ingest: data may point at a buffer owned elsewhere (a ZeroMQ
   * message, at least 8-byte aligned). The last unref calls release (from
   * whichever thread drops it) and points data back at the slot. */
  void (*release)(beam_frame_t *f, void *ctx);
  void *release_ctx;
  void *own_data;
  void *user; /* per-slot scratch for the pool's user (beam_pool_set_user) */
  /* Lazy decode. An input frame may enter the graph still in its wire
   * codec (lz4 or bslz4, borrowed from the ZeroMQ message): then
   * dec_state is BEAM_DEC_PENDING, codec says which, data holds enc_size
   * encoded bytes and nbytes is the decoded size. beam_frame_decode turns
   * it into pixels in the slot's own storage, once, on the first stage
   * thread that needs them, so decompression never runs on the loop
   * thread. Every other frame has dec_state BEAM_DEC_NONE and codec RAW. */
  atomic_int dec_state;
  uint8_t codec;      /* beam_codec_t of data while pending */
  size_t enc_size;    /* encoded bytes in data while pending */
  const char *dec_why; /* static reason when the decode failed */
  /* Set at ingest when a stage can store the wire bytes as they are
   * (record's pass-through) beside stages that decode: the decode then
   * keeps the encoded buffer, immutable, until the last unref instead of
   * giving it back at once (beam_frame_encoded_kept). */
  uint8_t keep_encoded;
  uint8_t enc_codec;
  const void *enc_data;
  size_t enc_len;
};

enum { BEAM_DEC_NONE = 0, BEAM_DEC_PENDING, BEAM_DEC_BUSY, BEAM_DEC_DONE, BEAM_DEC_FAILED };

/* Named arrays a series may carry: per-detector calibration sent at series
 * start (DECTRIS header_detail "all"), which stages use at start to build
 * their per-series tables. The names inputs use, and what they mean:
 *   "pixel_mask"       uint32, the frame shape: nonzero = bad pixel (DECTRIS
 *                      bits 0 gap, 1 dead, 2 cold, 3 hot/noisy, ...)
 *   "flatfield"        float32, the frame shape: multiplicative factors,
 *                      corrected = raw x flatfield (the DECTRIS convention,
 *                      the inverse of the correct stage's `flat` file); an
 *                      input adds it only when the detector has not already
 *                      applied it to the frames
 *   "countrate_table"  float32 [N, 2]: the count-rate correction table
 * The data are the detector's, copied as sent (C order, little-endian). */
#define BEAM_SERIES_MAX_ARRAYS 8
#define BEAM_SERIES_ARRAY_NAME_MAX 31 /* characters, without the NUL */

typedef struct beam_series_array_s {
  char name[BEAM_SERIES_ARRAY_NAME_MAX + 1];
  beam_array_t arr; /* data owned by the series (malloc'd, freed with it) */
} beam_series_array_t;

/* Metadata of a series, immutable once created and shared by reference. */
typedef struct beam_series_s {
  uint64_t series_id;
  beam_dtype_t dtype;
  uint32_t ndim;
  uint32_t shape[BEAM_MAX_NDIM];
  double frame_time_s;   /* 0 = unknown */
  double energy_ev;      /* 0 = unknown */
  double distance_m;     /* 0 = unknown */
  double pixel_size_m;   /* 0 = unknown */
  uint64_t nframes;      /* announced frame count, 0 = unknown */
  /* Frames the source knows never came (a detector's frame-number gap, a
   * series ended short of nframes): the end is published INCOMPLETE. The
   * one field written after creation; by the loop thread only, which also
   * is the only reader. */
  uint64_t missing_frames;
  char *meta_json;       /* the SERIES_START metadata part, NUL-terminated, or NULL */
  size_t meta_len;
  unsigned narrays;      /* arrays[0..narrays), see beam_series_add_array */
  beam_series_array_t arrays[BEAM_SERIES_MAX_ARRAYS];
  atomic_int refs;
} beam_series_t;

/* Copies meta (may be NULL) and parses the common keys from it
 * (frame_time, energy, distance, pixel_size, nframes; see PROTOCOL.md). */
beam_series_t *beam_series_new(uint64_t series_id, beam_dtype_t dtype, uint32_t ndim,
                               const uint32_t *shape, const char *meta, size_t meta_len);
beam_series_t *beam_series_ref(beam_series_t *s);
/* NULLs the caller's pointer; the last unref frees the series' arrays too. */
void beam_series_unref(beam_series_t **s);

/* Attaches a copy of an n-d array to a series under `name` (1 to
 * BEAM_SERIES_ARRAY_NAME_MAX characters, unique within the series). Call
 * it right after beam_series_new, before the series is shared: a series is
 * immutable once other threads hold it, so this is refused (BEAM_ESTATE)
 * unless the caller holds the only reference. nbytes must equal
 * prod(shape) x the dtype's size; data is copied (the caller keeps its
 * buffer). Allocates: for series start, not the per-frame path. Returns 0,
 * or BEAM_EINVAL (NULL series, empty/too long/duplicate name, ndim not
 * 1..BEAM_MAX_NDIM, a zero dimension, unknown dtype, nbytes mismatch, NULL
 * data), BEAM_ELIMIT (already BEAM_SERIES_MAX_ARRAYS arrays, or larger
 * than BEAM_ARRAY_MAX_BYTES), BEAM_ENOMEM; the series is unchanged then. */
int beam_series_add_array(beam_series_t *s, const char *name, beam_dtype_t dtype, uint32_t ndim,
                          const uint32_t *shape, const void *data, size_t nbytes);
/* The array called name, or NULL when the series has none (s may be NULL).
 * Borrowed: valid while the caller holds its reference to the series. */
const beam_series_array_t *beam_series_array(const beam_series_t *s, const char *name);

size_t beam_frame_elems(const beam_frame_t *f);

/* Pool of nslots frames of slot_bytes each. pinned asks for page-locked
 * memory through gpu/ (falls back to ordinary memory without CUDA). */
beam_pool_t *beam_pool_new(unsigned nslots, size_t slot_bytes, int pinned, beam_diag_t *d);
/* Gives every slot `bytes` of zeroed, 16-byte aligned user storage (the
 * ingest keeps a ZeroMQ message there). Call before the first get. */
int beam_pool_set_user(beam_pool_t *p, size_t bytes);
/* Writes every slot once, so the pages are resident before the first frame
 * (the kernel maps anonymous memory at first touch, which in a VM costs
 * as much as decoding the frame). For the input pool, whose slots lazy
 * decode and ingest fill in any order. Pinned pools are resident already. */
void beam_pool_prefault(beam_pool_t *p);
/* Owner's release: no more gets; freed when the last frame comes back. */
void beam_pool_close(beam_pool_t **p);
/* A free slot with refs = 1, or NULL when none is free. */
beam_frame_t *beam_pool_try_get(beam_pool_t *p);
/* Waits up to timeout_ms (< 0: forever) for a slot; NULL on timeout or when
 * the pool is being shut down (beam_pool_wake). */
beam_frame_t *beam_pool_get(beam_pool_t *p, int timeout_ms);
/* Wakes every waiter of beam_pool_get, which then returns NULL. */
void beam_pool_wake(beam_pool_t *p);
unsigned beam_pool_free_count(beam_pool_t *p);
unsigned beam_pool_size(const beam_pool_t *p);
size_t beam_pool_slot_bytes(const beam_pool_t *p);
/* Called from whichever thread returns a slot (keep it short and
 * thread-safe: uv_async_send is the intended use). */
void beam_pool_on_release(beam_pool_t *p, void (*cb)(void *ctx), void *ctx);

/* Opaque per-pool annotations used for stage outputs (topic and JSON
 * descriptor live with the pool so they outlive the stage that made them). */
void beam_pool_set_label(beam_pool_t *p, const char *topic, const char *desc_json);
const char *beam_pool_topic(const beam_pool_t *p);
const char *beam_pool_desc(const beam_pool_t *p);

void beam_frame_ref(beam_frame_t *f, int n);
void beam_frame_unref(beam_frame_t *f);
/* Decodes a frame left in its wire codec (dec_state BEAM_DEC_PENDING) into
 * the slot's own storage and drops the borrowed encoded buffer; a no-op
 * for frames with pixels. Safe to call from several threads on one frame
 * (fan-out): one decodes, the others wait for it. scratch must hold the
 * slot's bytes (bitshuffle's per-block buffer). On a bad payload the frame
 * becomes CORRUPT (nbytes 0, flag BEAM_FLAG_CORRUPT, as a frame the source
 * could not read) and BEAM_EPROTO is returned with *why set; every caller
 * sees the same outcome. Returns 0 otherwise. */
int beam_frame_decode(beam_frame_t *f, void *scratch, const char **why);

/* Lends the encoded bytes of a frame still in its wire codec to a stage that
 * can use them as they are (record stores a bitshuffle-LZ4 payload as an
 * HDF5 chunk). Moves dec_state PENDING -> BUSY, so a concurrent
 * beam_frame_decode waits instead of decoding (and releasing) the buffer
 * under the caller. Returns 1 when lent: f->data holds f->enc_size bytes in
 * codec f->codec until the caller gives them back with
 * beam_frame_encoded_return, which it must do promptly (other stages spin
 * meanwhile). Returns 0 when the frame has pixels, is being or has been
 * decoded, or failed: the caller then decodes as usual. */
int beam_frame_encoded_lend(beam_frame_t *f);
/* Ends a loan: BUSY -> PENDING. A decoder waiting on the frame then decodes it. */
void beam_frame_encoded_return(beam_frame_t *f);
/* The wire bytes of a frame decoded with keep_encoded set: returns 1 with
 * them (valid and unchanging while the caller holds its reference), 0 when
 * the frame was not decoded that way. */
int beam_frame_encoded_kept(beam_frame_t *f, const void **data, size_t *len, beam_codec_t *codec);

/* Copies identity (ids, times, flags, pos) from src, not pixels or shape. */
void beam_frame_copy_ident(beam_frame_t *dst, const beam_frame_t *src);

uint64_t beam_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t beam_realtime_ns(void); /* CLOCK_REALTIME */

#ifdef __cplusplus
}
#endif
#endif
