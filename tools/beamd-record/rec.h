/* beamd-record internals: options, per-series HDF5 files, duplicate sets.
 *
 * beamd-record subscribes to (SUB) or pulls (PULL) a beamd result stream and
 * writes one HDF5 file per series (layout: docs/recording.md). main.c owns
 * the sockets and the loop, rfile.c the files, idset.c the per-topic sets of
 * frame ids that make replayed (at-least-once) results land exactly once,
 * xpcs.c the APS-8IDI layout of XPCS results (pyXpcsViewer, XPCS-Toolkit).
 * Shared by the tool's own files only. */
#ifndef BEAMD_RECORD_H
#define BEAMD_RECORD_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/proto.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/sig.h"

#define REC_MAX_CONNECT 16
#define REC_MAX_LATEST 32
#define REC_MAX_TOPICS 256 /* per series file */
#define REC_MAX_OPEN 16    /* series files open at once */

enum { REC_COMP_NONE, REC_COMP_GZIP, REC_COMP_BSLZ4 };
enum { REC_XPCS_APS, REC_XPCS_NONE };

typedef struct rec_opts_s {
  const char *connect[REC_MAX_CONNECT];
  int nconnect;
  int pull;
  const char *dir, *prefix;
  int latest_default; /* --mode latest */
  const char *latest[REC_MAX_LATEST];
  int nlatest;
  int compress;
  uint64_t swmr_after; /* results before SWMR starts */
  double swmr_delay;   /* seconds after the file opened before SWMR starts */
  int no_swmr;
  int stats;           /* record beamd.stats documents */
  uint64_t count;      /* exit after this many results written (0: none) */
  uint64_t nseries;    /* exit after this many complete series (0: none) */
  double timeout;      /* seconds (0: none) */
  int hwm;
  int stats_json;
  int xpcs_layout;       /* REC_XPCS_APS (default) or REC_XPCS_NONE */
  const char *xpcs_qmap; /* FILE[:/DATASET] label image for /xpcs/qmap, or NULL */
} rec_opts_t;

/* Counters, reported by --stats-json. */
typedef struct rec_counts_s {
  uint64_t messages, malformed, results, written, duplicates, late_topic, swmr_pauses, mismatched;
  uint64_t late_join, series_started, series_complete, series_aborted, ignored_series;
  uint64_t stats_docs, dup_starts, write_errors;
} rec_counts_t;

/* ---- idset.c: set of uint64 (open addressing, grows by doubling) ---- */
typedef struct idset_s {
  uint64_t *keys;
  size_t cap, n;
  int has_max; /* UINT64_MAX is the empty marker, kept aside */
} idset_t;
/* 1 when v was added, 0 when already present, -1 out of memory. */
int idset_add(idset_t *s, uint64_t v);
void idset_free(idset_t *s);

/* ---- xpcs.c: the APS-8IDI XPCS layout (docs/recording.md) ---- */
typedef struct rxpcs_s rxpcs_t;
rxpcs_t *xpcs_new(void); /* NULL when out of memory */
void xpcs_free(rxpcs_t **x);
/* The SERIES_START of the file (frame shape, metadata JSON). -1 no memory. */
int xpcs_series(rxpcs_t *x, const beam_hdr_t *start, const char *meta, size_t len);
/* Keeps what a RESULT adds to an xpcs_multitau/xpcs_twotime analysis
 * (descriptor kind, labels, the latest g2, g2_err, lags, info, c2). -1 no memory. */
int xpcs_note(rxpcs_t *x, const beam_msg_t *m, const void *data);
/* Writes /xpcs and /entry/instrument into file (open for writing, not in
 * SWMR mode) when an analysis was seen and the layout is on. 0, or -1 with
 * ctx->err set. */
struct rec_ctx_s;
int xpcs_write(struct rec_ctx_s *ctx, rxpcs_t *x, hid_t file, const char *path);

/* ---- rfile.c: one series file ---- */
/* Rows of an "every" topic received but not yet in the file, all of one
 * shape: HDF5's per-call cost (extent, dataspaces, write), five datasets a
 * result, is far above the cost of copying a small result, so rows go out
 * in blocks. Written when full (REC_BLOCK_ROWS rows or REC_BLOCK_BYTES of
 * data), when a result of another shape arrives, when the file's block
 * buffers would pass REC_FILE_BLOCKS, before SWMR starts, before every flush
 * and at close. */
#define REC_BLOCK_ROWS 256
#define REC_BLOCK_BYTES (1u << 20)
#define REC_FILE_BLOCKS (4u << 20) /* block buffers of one file, all topics */
typedef struct rblock_s {
  uint32_t k;                    /* rows pending */
  uint32_t shape[BEAM_MAX_NDIM]; /* of every pending row */
  size_t cap;                    /* bytes allocated at data */
  uint8_t *data;
  uint64_t fid[REC_BLOCK_ROWS], tacq[REC_BLOCK_ROWS];
  uint32_t flg[REC_BLOCK_ROWS], shp[REC_BLOCK_ROWS * BEAM_MAX_NDIM];
} rblock_t;

typedef struct rtopic_s {
  char name[BEAM_TOPIC_MAX + 1];
  int latest;
  int late; /* first seen after SWMR began: stored after a SWMR pause */
  hid_t grp, data, fid, tacq, flg;
  hid_t shp; /* per-result shape (ndim > 0 only): results may grow */
  hid_t mtype; /* data's type, as the memory type of writes */
  /* data is uncompressed: a row as large as its chunk (chunk: the result
   * dimensions of data's chunks) is that chunk's bytes, written directly */
  int direct;
  hsize_t chunk[BEAM_MAX_NDIM];
  beam_dtype_t dtype;
  uint32_t ndim;
  uint32_t shape[BEAM_MAX_NDIM]; /* of the first result */
  /* Bounds of a result's dimensions (the descriptor's declared shape, the
   * size of the stage's output slots; H5S_UNLIMITED without a descriptor)
   * and the current extent of data's result dimensions (every mode: the
   * largest seen, rows padded with the fill value). */
  hsize_t maxd[BEAM_MAX_NDIM], ext[BEAM_MAX_NDIM];
  hsize_t ext_file[BEAM_MAX_NDIM]; /* ext as far as the file has it (blk not yet written) */
  uint64_t reshaped; /* results whose shape differs from the first */
  uint64_t n; /* rows accepted (every: nfile in the file, the rest in blk) or results stored (latest) */
  uint64_t nfile;
  rblock_t *blk; /* every mode, allocated with the first row */
  int have_desc;
  idset_t seen, seen_final;
  uint64_t dups, mismatched;
} rtopic_t;

typedef struct rfile_s {
  uint64_t series_id;
  char final_path[4300], path[4320];
  hid_t file;
  int swmr, swmr_began; /* in SWMR now; SWMR was started at least once */
  int have_meta;
  uint64_t opened_ns, last_flush_ns;
  int dirty;
  int failed; /* a write failed: closed without reopening (the disk may be full) */
  uint64_t written;
  /* Frames the series lost upstream, from an INCOMPLETE SERIES_END
   * (PROTOCOL.md): /entry@missing_frames, so the file says it too. */
  uint64_t missing_frames;
  uint64_t swmr_pauses; /* SWMR ended to create objects (rfile.c) */
  size_t block_bytes; /* allocated for the topics' blocks, at most REC_FILE_BLOCKS */
  rtopic_t *topics[REC_MAX_TOPICS];
  int ntopics;
  rxpcs_t *xpcs; /* XPCS results kept for the APS layout */
} rfile_t;

typedef struct rec_ctx_s {
  const rec_opts_t *o;
  rec_counts_t *c;
  char err[10000]; /* the last file error (fatal) */
} rec_ctx_t;

/* Creates DIR/<prefix>series_<id>.h5.partial (an old .partial of the same
 * name is moved aside to .partial.N first). meta may be NULL (series start
 * not seen). Returns NULL with ctx->err set. */
rfile_t *rfile_open(rec_ctx_t *ctx, uint64_t series_id, const beam_hdr_t *start,
                    const char *meta, size_t meta_len);
/* A SERIES_START for a file opened without one (before SWMR started). */
int rfile_set_meta(rec_ctx_t *ctx, rfile_t *f, const beam_hdr_t *start, const char *meta,
                   size_t meta_len);
/* Stores one RESULT (payload decoded into data). Returns 0 (stored, skipped
 * as duplicate or refused, all counted) or -1 on a write error (ctx->err). */
int rfile_result(rec_ctx_t *ctx, rfile_t *f, const beam_msg_t *m, const void *data);
/* Starts SWMR when due, flushes (blocks too) when a second has passed. -1 on error. */
int rfile_tick(rec_ctx_t *ctx, rfile_t *f, uint64_t now_ns, int force_flush);
/* Closes the file: complete renames NAME.partial to NAME (after writing
 * complete=true); otherwise it stays .partial with complete=false. -1 on
 * error (the file is closed either way). Frees f. */
int rfile_close(rec_ctx_t *ctx, rfile_t **f, int complete, const char *why);

/* "DIR/<prefix>series_<id>.h5" into buf. */
void rec_final_name(const rec_opts_t *o, uint64_t series_id, char *buf, size_t cap);

#endif
