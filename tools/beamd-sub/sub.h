/* beamd-sub internals: options, per-message reporting and HDF5 output
 * (.npy files are written by daemon/npy_write.c).
 *
 * beamd-sub subscribes to beamd result streams (or any stream in the wire
 * format of proto/proto.h), decodes every message and prints, saves or
 * counts it. This header is shared by the tool's own files only.
 */
#ifndef BEAMD_SUB_H
#define BEAMD_SUB_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"
#include "proto/proto.h"

#define SUB_MAX_CONNECT 16
#define SUB_MAX_TOPICS 32
#define SUB_JSON_VALUES_MAX 4096u /* --json: full values up to this many elements */
#define SUB_PRINT_VALUES_MAX 16u  /* --print: values up to this many, else min/mean/max */

typedef struct sub_opts_s {
  const char *connect[SUB_MAX_CONNECT];
  int nconnect;
  int sock_type; /* ZMQ_SUB or ZMQ_PULL */
  const char *topics[SUB_MAX_TOPICS];
  int ntopics;
  uint64_t count; /* 0: none */
  uint64_t ends;  /* 0: none */
  double timeout; /* seconds; 0: none */
  int hwm;        /* ZMQ_RCVHWM; -1: ZeroMQ default */
  int print, json, all_types, stats;
  const char *save_dir;
  const char *save_h5;
} sub_opts_t;

/* Summary of a decoded array, computed once per message. Integers are
 * summed exactly; min/max/mean skip NaN and Inf, which are counted; complex
 * values are summarised by their modulus (sum keeps re and im). */
typedef struct sub_vstats_s {
  uint64_t n;
  uint64_t nonfinite;
  double min, max, mean;
  int is_int, is_complex;
  __int128 isum;
  double dsum, dsum_im;
} sub_vstats_t;

void sub_vstats(const void *data, beam_dtype_t dt, uint64_t n, sub_vstats_t *out);

/* Writes one line for the message to stdout: a JSON object (json != 0) or a
 * human-readable line. data is the decoded payload (NULL when none).
 * orphan: a FRAME whose series was never started on this connection. */
void sub_report(const beam_msg_t *m, const void *data, const sub_vstats_t *vs,
                int orphan, int json);
/* 1 for a beamd.stats RESULT: a JSON document sent as a 1-D uint8 array
 * (PROTOCOL.md section 9), reported as "doc" and never saved. */
int sub_is_stats_doc(const beam_msg_t *m);
/* One line for a message that failed to parse or decode. */
void sub_report_malformed(const char *why, size_t nparts, int json);

/* Name used for a message's directory (--save) and dataset (--save-h5):
 * the topic, else the lower-case type name; a leading '.' becomes "_." so
 * "." and ".." can never name a path. */
void sub_out_name(const beam_msg_t *m, char *buf, size_t cap);

/* HDF5 appender: one dataset per name, (rows, *shape), unlimited along rows,
 * chunked by row, with the first descriptor JSON as attribute "descriptor";
 * "<name>:ids" holds (series_id, frame_id) per row. */
typedef struct sub_h5_s sub_h5_t;
int sub_h5_open(sub_h5_t **out, const char *path, beam_diag_t *d);
int sub_h5_append(sub_h5_t *self, const char *name, const beam_msg_t *m,
                  const void *data, beam_diag_t *d);
void sub_h5_close(sub_h5_t **self);

#endif
