/* The series side of the DECTRIS source (src_dectris.c decodes and reads
 * sockets; dectris_series.c holds the series). Internal to those two. */
#ifndef BEAMD_DECTRIS_SERIES_H
#define BEAMD_DECTRIS_SERIES_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "pipeline/frame.h"
#include "proto/dectris.h"

typedef struct beamd_s beamd_t;

typedef struct beamd_dxs_s {
  beamd_t *d;
  int verify_hash;                 /* input.dectris.verify_hash */
  char channel[BEAM_DX_NAME_MAX];  /* input.dectris.channel */
  /* the series being received */
  int have_start; /* a start message was taken (the beamd series may wait: pending) */
  int version;
  uint64_t series_id, expected, next_frame, received;
  uint32_t width, height;
  beam_dtype_t dtype;
  int chan;       /* index of the channel taken (v2); < 0: the series has no such channel */
  char date_text[40]; /* the last v2 series_date seen, and its value */
  uint64_t date_ns;
  beam_series_t *pending; /* series waiting for its first image to know its dtype */
  /* counters (stats input.dectris) */
  uint64_t starts, images, ends, before_header, stale, gaps, missing, unsupported,
      size_mismatch, hash_mismatch, no_channel, incomplete;
} beamd_dxs_t;

/* A start message: returns 1 when it began a series, 0 when it repeated
 * the open one's (each socket of a split stream sends it). */
int beamd_dxs_start(beamd_dxs_t *s, const beam_dx_start_t *st, int version);
/* An image; parts are its message's, whose owners lend the blob. */
void beamd_dxs_image(beamd_dxs_t *s, const beam_dx_image_t *im, const beam_part_t *parts,
                     size_t n, uint64_t t_recv);
void beamd_dxs_end(beamd_dxs_t *s, uint64_t series_id);
void beamd_dxs_stats(const beamd_dxs_t *s, json_t *o);
void beamd_dxs_fini(beamd_dxs_t *s);

#endif
