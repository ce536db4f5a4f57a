/* beamd-replay internals: the HDF5 frame source, its metadata, the reply
 * arena and the REP server.
 *
 * beamd-replay serves the frames of an HDF5 file (one 3-D dataset, or an
 * Eiger/NXmx master with external links to data files) over a ZeroMQ REP
 * socket, as proto/PROTOCOL.md section 13 specifies. This header is shared by
 * the tool's own files only; nothing else links against it. Which HDF5 paths
 * are read is documented in docs/replay.md.
 */
#ifndef BEAMD_REPLAY_H
#define BEAMD_REPLAY_H

#include <hdf5.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/filemap.h"
#include "proto/err.h"
#include "proto/proto.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/sig.h"

#define RP_CREDIT_MAX 4096u
#define RP_DEFAULT_MAX_BYTES (256ull << 20)
#define RP_REASON_MAX 768 /* bytes of a corrupt frame's {"error": ...} */
#define RP_SHM_NAME BEAM_SHM_MEMFD_NAME
#define RP_META_LISTS_MAX 8 /* --meta-list options */

/* One stack of frames in one HDF5 dataset: the dataset itself, or one data
 * file of a master. */
typedef struct rp_part_s {
  char *file;         /* data file path, for messages and file_id */
  char *dataset;      /* dataset path inside `file` */
  char *link;         /* master only: the link in the master, else NULL */
  hid_t dset;         /* -1 when the part could not be opened */
  hid_t fspace;       /* file dataspace, for hyperslab reads */
  char *open_error;   /* why dset is -1 (dangling link, missing file) */
  uint64_t first;     /* global index of the part's frame 0 */
  uint64_t nframes;
  uint64_t chunk0;    /* frames per chunk; 0 when not chunked */
  int forward;        /* stored chunks are sent as they are */
  beam_codec_t codec; /* codec of forwarded chunks */
  char plan[96];      /* "forward bslz4", "decode (deflate)", for the log */
  beam_fmap_t *map;   /* our mapping of the file, to check chunks read in place */
  int map_fd;         /* the driver's descriptor it maps */
  uint64_t size, size_batch; /* the file's size, as of rp_src_locate_many call size_batch */
} rp_part_t;

typedef struct rp_src_s {
  char *path;          /* absolute path of the file given */
  char *dataset;       /* dataset given or found; "/entry/data" for a master */
  int is_master;
  hid_t file;
  rp_part_t *parts;
  size_t nparts;
  uint64_t nframes;    /* all parts together */
  beam_dtype_t dtype;
  size_t esize;
  uint32_t h, w;
  size_t raw_size;     /* bytes of one decoded frame */
  size_t slot_size;    /* most payload bytes one frame can take */
  hid_t memtype;       /* native type to read decoded frames as */
  hid_t memspace;
  double *pos;         /* nframes x 3 metres, NULL without positions */
  char pos_dataset[64];
  char pos_units[32];
  char file_id[17];    /* 16 hex digits */
  uint64_t forwarded, decoded; /* frames read either way */
  int locatable;       /* opened through beamd's chunk-locating driver (h5chunkloc.h) */
  struct rp_batch_s *batch; /* rp_src_locate_many's scratch, RP_CREDIT_MAX entries */
  uint64_t batches;    /* rp_src_locate_many calls, so a file is fstat'ed once per reply */
  uint64_t look_g;     /* the frame whose chunk size was looked up last */
  hsize_t look_n;
  int look_valid;
} rp_src_t;

/* Opens `path` and finds the frames (see docs/replay.md): `dataset` NULL
 * auto-detects. Warnings (dangling links, ignored positions) are printed on
 * stderr. Returns 0 or a negative BEAM_E* with d naming file and dataset. */
int rp_src_open(rp_src_t *self, const char *path, const char *dataset, beam_diag_t *d);
void rp_src_close(rp_src_t *self);

/* Payload bytes frame g will take when read (stored chunk size when it is
 * forwarded, raw size otherwise): what the max_bytes budget counts. */
size_t rp_src_frame_bytes(rp_src_t *self, uint64_t g);

/* Reads frame g into buf (cap >= slot_size). Returns 0 with *codec and
 * *len set, or BEAM_EIO with a reason "file F dataset D frame K: ..." in
 * why (the frame is then sent as CORRUPT). Never allocates on our side. */
int rp_src_read(rp_src_t *self, uint64_t g, void *buf, size_t cap, beam_codec_t *codec,
                size_t *len, char *why, size_t whylen);

/* Where frame g lies in its file when it can be read there in place
 * (PROTOCOL.md section 13.8): a forwarded chunk, located, whose filter
 * ran, of the raw size at an 8-byte aligned offset or of a compressed
 * codec whose framing checks out (read from our own mapping). */
typedef struct rp_loc_s {
  int fd;             /* the HDF5 driver's descriptor of the file */
  uint64_t off;
  size_t len;
  beam_codec_t codec;
  const char *file;   /* the data file's path */
  const uint8_t *base; /* our mapping of it */
} rp_loc_t;

/* Frames gs[0..n): ok[i] = 1 with locs[i] set when frame gs[i] can be read
 * in place, else 0: read it with rp_src_read instead, which also says what
 * is wrong with a bad chunk. The compressed chunks' framing is checked for
 * all n at once (rp_chunk_check_many). n <= RP_CREDIT_MAX. */
void rp_src_locate_many(rp_src_t *self, const uint64_t *gs, size_t n, rp_loc_t *locs,
                        uint8_t *ok);

/* Checks the framing of a stored lz4/bslz4 chunk without decompressing:
 * header, every block size, the tail. Returns NULL when it accounts for
 * exactly len bytes, else a static reason (PROTOCOL.md section 11 strings). */
const char *rp_chunk_check(beam_codec_t codec, const uint8_t *p, size_t len, size_t raw_size,
                           size_t esize);

/* rp_chunk_check of n chunks (codec[i], p[i], len[i]) into bad[i], their
 * header walks interleaved so that their cache misses overlap. */
void rp_chunk_check_many(const beam_codec_t *codec, const uint8_t *const *p, const size_t *len,
                         size_t n, size_t raw, size_t esize, const char **bad);

/* Innermost message of the current HDF5 error stack, which is cleared. */
const char *rp_h5_reason(char *buf, size_t len);

/* Series metadata from the file (PROTOCOL.md 7.1 keys plus pixel_mask,
 * scan_positions and source references). nframes and the replay block are
 * filled in by the server. Returns a new object or NULL (ENOMEM). */
json_t *rp_meta_build(rp_src_t *src);

/* The file's pixel mask (the dataset rp_meta_build refers to) as a
 * SERIES_START payload (PROTOCOL.md 7.1 "mask", 13.5): the frames' dtype
 * and shape, nonzero = bad, a value the dtype cannot hold sent as its
 * largest (2^N-1 unsigned). Adds the "mask" description to meta. Returns
 * src->raw_size malloc'd bytes, or NULL (no mask, or one that cannot be
 * sent: a warning says why). */
void *rp_mask_load(rp_src_t *src, json_t *meta);

/* --meta-list [KEY=]DSET: each 1-D numeric dataset DSET of the file given
 * (one value per frame of the file, indexed like frame ids) goes into m as
 * KEY: [...] (KEY default: DSET's last path component), non-finite values
 * as null, and its "units" attribute, when it has one, as KEY_units.
 * Returns 0, or < 0 with d naming the file and dataset. */
int rp_meta_lists(json_t *m, rp_src_t *src, const char *const *specs, unsigned n,
                  beam_diag_t *d);

/* A reference-counted buffer replies are built in and sent from zero-copy:
 * the server holds one reference and every ZeroMQ message one more; the
 * last release frees it, so a peer that keeps messages cannot make the
 * server overwrite them. */
typedef struct rp_arena_s {
  atomic_int refs;
  size_t cap, used;
  uint8_t *data;
} rp_arena_t;

typedef struct rp_opts_s {
  const char *file;
  const char *endpoint;
  const char *dataset;
  uint64_t first, last, stride;
  int have_last;
  double rate;        /* frames/s, 0 = unpaced */
  int loop;
  uint64_t series_id;
  uint64_t max_bytes; /* server cap on a reply's payload bytes */
  int quiet, stats_json, progress;
  int no_shm;         /* refuse shared-memory payloads (section 13.6) */
  int no_map;         /* refuse to name files for reading in place (section 13.8) */
  const char *meta_list[RP_META_LISTS_MAX]; /* --meta-list [KEY=]DSET */
  unsigned n_meta_list;
  const char *bad_frames;  /* --bad-frames 3,7,10-20 (dataset indices) */
  const char *bad_dataset; /* --bad-dataset DSET: nonzero = bad */
} rp_opts_t;

typedef struct rp_stats_s {
  uint64_t requests, bad_requests, info_requests;
  uint64_t frames, corrupt, bad, series_started, series_ended;
  uint64_t payload_bytes, bytes;
  uint64_t arena_allocs;   /* reply buffers allocated (reuse keeps this small) */
  uint64_t shm_frames, shm_refused; /* payloads put in a landing area; requests refused it */
  uint64_t map_frames, map_refused; /* payloads left in the file for the consumer to read */
  uint64_t t_start_ns, t_first_frame_ns, t_last_frame_ns;
} rp_stats_t;

/* A consumer's landing area, mapped (shm.c). */
typedef struct rp_shm_s {
  char path[128];
  int fd;
  uint8_t *base;
  size_t size;
  dev_t dev;
  ino_t ino;
} rp_shm_t;

/* Maps the landing area `path` names (a /proc/PID/fd/N link to a memfd
 * named RP_SHM_NAME...) of at least size bytes, reusing the mapping of the
 * last request when it is the same file. Returns the base, or NULL with
 * why set (the reply then carries payloads inline). */
uint8_t *rp_shm_attach(rp_shm_t *m, const char *path, size_t size, char *why, size_t wl);
void rp_shm_detach(rp_shm_t *m);

typedef struct rp_server_s {
  void *sock;
  rp_src_t *src;
  const rp_opts_t *o;
  uint64_t T;           /* frames per pass */
  uint64_t seq;         /* next message sequence number (section 6) */
  rp_arena_t *arena;
  json_t *meta;         /* series metadata without the per-pass part */
  void *mask;           /* the SERIES_START payload (src->raw_size bytes), or NULL */
  double tokens;        /* rate limiter */
  uint64_t tokens_ns;
  uint64_t last_next;   /* for the progress line */
  rp_stats_t st;
  struct rp_rec_s *recs; /* RP_CREDIT_MAX + 2 message records */
  rp_shm_t shm;
  json_int_t req_id;     /* the request's "id", echoed in its reply; -1 = none */
  uint32_t *slots;       /* RP_CREDIT_MAX slot numbers of the request being served */
  uint8_t *bad;          /* per file frame: served flagged BAD; NULL: none */
  uint64_t nbad;         /* frames marked in bad */
  uint64_t *gs;          /* RP_CREDIT_MAX frames of a reply, located together */
  rp_loc_t *locs;
  uint8_t *loc_ok;
} rp_server_t;

/* One decoded request (PROTOCOL.md section 13): "info", or "get" with its
 * credit, byte cap, start flag, optional shared-memory landing area and
 * in-place flag. */
typedef struct rp_req_s {
  json_int_t id;        /* "id" to echo, -1 = none */
  int info;             /* 1: op "info"; 0: op "get" */
  uint64_t next, credit, max_bytes;
  int start;
  char *shm_path;       /* NULL: payloads inline; owned (free) */
  uint64_t shm_size, shm_slot_bytes, nslots; /* slot numbers in the caller's array */
  int map;              /* the consumer can read payloads in place */
} rp_req_t;

/* Parses one request part (request.c; pure, no sockets). slots: room for
 * RP_CREDIT_MAX slot numbers. Returns NULL, or the reason to send back
 * (q->id is set either way, as far as it could be read; nothing is left
 * to free on error). */
const char *rp_request_parse(const void *buf, size_t len, rp_req_t *q, uint32_t *slots,
                             char *why, size_t wl);

int rp_server_init(rp_server_t *self, void *sock, rp_src_t *src, const rp_opts_t *o,
                   beam_diag_t *d);
/* The BAD table from --bad-frames and --bad-dataset (badframes.c): *out
 * NULL when neither is given; errors name the option, file and dataset. */
int rp_bad_frames(rp_src_t *s, const char *list, const char *dataset, uint8_t **out,
                  uint64_t *nbad, beam_diag_t *d);
void rp_server_destroy(rp_server_t *self);
/* Receives one request (without blocking) and sends its one reply.
 * Returns 1 when a request was served, 0 when none was waiting, or -1 with
 * d set on a socket error (d->code 0 when a signal interrupted). */
int rp_server_handle(rp_server_t *self, volatile sig_atomic_t *stop, beam_diag_t *d);
/* Frame index k -> dataset index of the file. */
uint64_t rp_server_frame_index(const rp_server_t *self, uint64_t k);

#endif
