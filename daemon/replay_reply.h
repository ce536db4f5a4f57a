/* The replay input's reading of one reply (proto/PROTOCOL.md §13.3, 13.6,
 * 13.8), as a pure function of the reply's parts: no sockets, no files, no
 * daemon state, so that tests/fuzz/fuzz_replay_reply.c and
 * tests/unit/test_replay_reply.c can drive it with any bytes.
 *
 * It is not for deciding what to do with a reply: matching it to a
 * request, mapping the files it names, landing slots and ingest stay in
 * daemon/src_replay.c, which calls beamd_rr_parse once per reply and then
 * beamd_rr_next once per message, in order, so that the messages before a
 * malformed one are still taken (the rest is asked for again).
 *
 *   beamd_rr_t rr;
 *   if (beamd_rr_parse(&rr, parts, n, &ask) == 0)
 *     while ((rc = beamd_rr_next(&rr, &m)) > 0)
 *       ...
 *   beamd_rr_release(&rr);
 */
#ifndef BEAMD_REPLAY_REPLY_H
#define BEAMD_REPLAY_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define BEAMD_RR_FILES_MAX 32 /* most files one reply may name for reading in place */

/* What the request a reply answers asked for: it decides what the reply
 * may carry. */
typedef struct beamd_rr_ask_s {
  int info;             /* "op":"info": the status alone is read */
  int map;              /* it asked to read payloads in place ("map":true) */
  unsigned noffer;      /* landing slots it offered (0: no "shm") */
  size_t slot_bytes;    /* their size */
} beamd_rr_ask_t;

/* Where a FRAME's payload lies. */
enum {
  BEAMD_RR_INLINE = 0, /* in its payload parts (or none: CORRUPT) */
  BEAMD_RR_LANDED,     /* in the landing slot offered for its ordinal */
  BEAMD_RR_MAPPED,     /* in files[file] at byte off (payload_size bytes) */
};

/* Why the reply or a message of it is malformed; the text of each is in
 * beamd_rr_what (the phrase src_replay.c has always logged). */
enum {
  BEAMD_RR_OK = 0,
  BEAMD_RR_ESTATUS, /* part 0 is not a JSON object */
  BEAMD_RR_EREFUSED, /* "ok" is not true */
  BEAMD_RR_EMSG,    /* a header that does not decode, or a message past the last part */
  BEAMD_RR_EMAP,    /* a malformed "map" object or "at" entry */
  BEAMD_RR_ESLOT,   /* a landed payload without its slot, or too large for one */
};

/* A file the reply names for reading in place: strings point into the
 * status part's parse, valid until beamd_rr_release. */
typedef struct beamd_rr_file_s {
  const char *path; /* /proc/PID/fd/N as the server sees it (not checked here) */
  const char *name; /* the file's own path, for messages (path when not given) */
} beamd_rr_file_t;

/* The status part's fields, as src_replay.c reads them. Integers absent or
 * not JSON integers read as 0 and strings as NULL. */
typedef struct beamd_rr_status_s {
  int has_id;
  uint64_t id;
  int ok;
  const char *error;     /* the server's reason when not ok */
  const char *file_id, *file;
  int has_total;
  uint64_t total;
  int loop, eof;
  int64_t next, count;   /* as sent: a negative count stays negative */
  uint64_t corrupt;      /* 0 unless a positive integer */
  int has_frame_bytes;   /* dtype and a 2-element shape were given */
  size_t frame_bytes;    /* element size * shape[0] * shape[1] (0 for an unknown dtype) */
  int shm;               /* "shm": true */
  const char *shm_error;
  int has_map;           /* "map" present, of any type (the server did not refuse) */
  const char *map_error;
} beamd_rr_status_t;

/* What a SERIES_START says of the pixel mask it may carry as its payload
 * (PROTOCOL.md 7.1 "mask", 13.5). */
enum {
  BEAMD_RR_MASK_NONE = 0, /* neither a payload nor a "mask" description */
  BEAMD_RR_MASK_OK,       /* mask_data: the frames' dtype and shape, raw */
  BEAMD_RR_MASK_BAD,      /* refused: why in beamd_rr_t.mask_why; the start itself is good */
};

/* One v1 message of the reply. */
typedef struct beamd_rr_msg_s {
  beam_hdr_t h;
  size_t part;     /* its header's index in the parts */
  size_t nparts;   /* header, payload parts and metadata */
  int is_frame;
  unsigned frame;  /* FRAME ordinal in the reply (its landing slot's); FRAMEs only */
  int src;         /* BEAMD_RR_INLINE, _LANDED or _MAPPED */
  unsigned file;   /* MAPPED: index in files */
  uint64_t off;    /* MAPPED: byte offset of the payload in that file */
  int mask;        /* SERIES_START: BEAMD_RR_MASK_* */
  const void *mask_data; /* MASK_OK: h.raw_size bytes in the payload part */
} beamd_rr_msg_t;

/* The parse of one reply. Borrows the parts (they must outlive it); owns
 * the status part's JSON parse. */
typedef struct beamd_rr_s {
  beamd_rr_status_t st;
  beamd_rr_file_t files[BEAMD_RR_FILES_MAX];
  size_t nfiles;   /* files read before a malformed one: all of them when map_ok */
  int map_ok;      /* with ask.map: "map" absent, or well formed */
  int in_shm;      /* slots were offered and the server used them */
  int err;         /* BEAMD_RR_E*, 0 while none */
  size_t err_part; /* the part the error is at */
  char why[200];   /* the detail of err */
  char mask_why[200]; /* why the last SERIES_START's mask was refused */
  /* internal */
  char map_why[160]; /* what is wrong with "map", told at the first FRAME */
  const beam_part_t *parts;
  size_t n, pos;
  unsigned nframe;
  beamd_rr_ask_t ask;
  void *root, *at; /* json_t: the status object and the "at" array */
} beamd_rr_t;

/* Reads the status part (parts[0]) of the n parts of a reply (the
 * envelope's delimiter removed) to the request that asked `ask`, and, for
 * a get that asked for "map", the "map" object. Returns 0 when the reply
 * is ok; -BEAMD_RR_ESTATUS or -BEAMD_RR_EREFUSED otherwise, with self->st
 * filled as far as the status lets (its id, to match the request). A
 * malformed "map" is not an error here: it is the error of the first FRAME
 * (beamd_rr_next), as the messages before that FRAME are good. Always
 * release self afterwards. */
int beamd_rr_parse(beamd_rr_t *self, const beam_part_t *parts, size_t n, const beamd_rr_ask_t *ask);

/* The next message of an ok get reply into *m. Returns 1 with a message,
 * 0 at the end of the reply, or a negative BEAMD_RR_E* (also in self->err,
 * with err_part and why) for a malformed message; after an error, or for
 * an info reply, it returns that again (or 0). A MAPPED file index is
 * below nfiles, but whether the file holds off + payload_size bytes is for
 * the caller, which maps it. */
int beamd_rr_next(beamd_rr_t *self, beamd_rr_msg_t *m);

/* A MASK_OK payload (n elements of dtype dt, as the frames) as the
 * series' "pixel_mask" array into out (n uint32): 0 stays 0, any other
 * value (negative, fractional, NaN) is bad and stays nonzero, clamped to
 * 1..2^32-1. Returns 0, or -1 for a dtype no mask comes in (complex,
 * none). */
int beamd_rr_mask_u32(beam_dtype_t dt, const void *src, size_t n, uint32_t *out);

/* Frees the status part's parse; the strings in self go with it. */
void beamd_rr_release(beamd_rr_t *self);

/* The phrase for BEAMD_RR_E* code (positive or negative), as in "the reply
 * has <phrase> at part N". */
const char *beamd_rr_what(int code);

#endif
