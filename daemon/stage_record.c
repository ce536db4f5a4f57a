/* Stage kind `record`: the frames a stage receives (raw detector frames when
 * its input is "frames"), written to HDF5 as they arrive, one file per
 * series, so that beamd-replay can serve them again.
 *
 * Layout (docs/recording.md): /entry/data/data (N, *frame shape), chunked
 * chunk_frames frames per chunk; /entry/data/{frame_id, t_acq_ns, flags}
 * (N,); series metadata as attributes of /series, and the detector's
 * geometry and pixel mask as NXmx fields (nxmx_write.h) so beamd-replay
 * reads them back; /entry attributes series_id, frames_written, complete. The file is DIR/<prefix>series_<id>.h5,
 * written as NAME.partial and renamed at the end of the series.
 *
 * Compression: bitshuffle+LZ4 chunks are made by our own encoder
 * (beam_codec_encode, HDF5 filter 32008 framing) and stored with
 * H5Dwrite_chunk, so writing needs no plugin and no second copy through the
 * filter pipeline; readers need the 32008 plugin (Debian:
 * hdf5-filter-plugin). The dataset declares the filter as mandatory when the
 * plugin is loadable here, optional otherwise (HDF5 refuses to create a
 * dataset with a mandatory filter it cannot find).
 *
 * Pass-through: an input frame that is still bitshuffle-LZ4 on the wire
 * (ingest's lazy decode) already is a 32008 chunk. With one frame per chunk
 * it is stored as it came (process_encoded), never decoded and re-encoded.
 * Its encoded bytes are borrowed under beam_frame_encoded_lend, copied, and
 * given back at once, so other stages that decode the frame wait for a
 * memcpy, not for the disk; when this stage is the graph's only reader (one
 * root, no decode pool) nobody waits, and the bytes are checked and stored
 * in place under the loan. They are checked before they are stored: the
 * framing must describe exactly this frame's bytes and every LZ4 block must
 * decode to its stated size (check: full proves that by walking the block's
 * sequences, proto/lz4_check.c, at a fifth of the cost of decompressing
 * it), so a chunk that the filter could not read is never written; anything
 * else goes the ordinary way (decode, whose failure makes the frame CORRUPT
 * as before, then encode).
 *
 * Threads: init runs on the graph build thread and does not touch HDF5; all
 * HDF5 calls are made from start/process/end on the stage's worker thread.
 * The library Debian ships is thread-safe (one global lock), and its error
 * stacks are per thread, hence beam_h5_quiet() in start.
 *
 * Not known to a stage: whether the series was aborted (end() has no flag).
 * A series that was cut short (the graph says so in end_aborted), whose
 * source knows frames never came (end_missing: a detector's frame-number
 * gap), or that announced nframes and delivered fewer, is incomplete: its
 * file keeps the .partial name and complete=false. */
#include "daemon/stage_record.h"

#include <errno.h>
#include <sys/statvfs.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lz4.h>

#include "daemon/h5util.h"
#include "daemon/nxmx_write.h"
#include "proto/lz4_check.h"

#define REC_IDS_FLUSH 1024u     /* companions (frame_id ...) written in batches of this */
#define REC_IDS_BUF 2048u       /* >= REC_IDS_FLUSH + the largest chunk_frames */
#define REC_MAX_CHUNK (1u << 30) /* HDF5 chunks must stay below 4 GiB; keep well clear */
#define REC_FLUSH_NS 1000000000ull
#define REC_FRAMING_HDR 12u      /* 32008 chunk: BE u64 raw bytes, BE u32 block bytes */
#define REC_BSHUF_MULT 8u        /* bitshuffle blocks are multiples of 8 elements */
enum { REC_CHECK_FULL, REC_CHECK_DECODE, REC_CHECK_FRAMING };
#define REC_CTR_PASSTHROUGH 0    /* self->counters[]: frames stored without decoding */

static const char *prefix_valid(const beam_cnode_t *v) {
  if (!v->scalar || strchr(v->scalar, '/') || strlen(v->scalar) > 128)
    return "a file name prefix: no '/', at most 128 characters";
  return NULL;
}

const beam_param_t beam_record_params[] = {
    BEAM_STAGE_COMMON_PARAMS,
    {"dir", BEAM_P_PATH, NULL, 1, 0, 0, NULL, NULL,
     "directory for the files (created if missing; its parent must exist)", NULL},
    {"prefix", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "file name prefix: files are DIR/<prefix>series_<id>.h5", prefix_valid},
    {"compress", BEAM_P_ENUM, "bslz4", 0, 0, 0, "bslz4|none", NULL,
     "chunk compression: bslz4 (HDF5 filter 32008) or none", NULL},
    {"chunk_frames", BEAM_P_INT, "1", 0, 1, 1024, NULL, NULL,
     "frames per HDF5 chunk", NULL},
    {"check", BEAM_P_ENUM, "full", 0, 0, 0, "full|decode|framing", NULL,
     "bitshuffle-LZ4 frames stored as they came: full = every LZ4 block's sequences walked, "
     "which proves it decompresses to its stated size without decompressing it; decode = every "
     "block decompressed (the same guarantee, several times slower); framing = block headers "
     "and sizes only (a corrupt LZ4 stream inside intact framing would be stored)", NULL},
    BEAM_PARAM_END};

typedef struct rec_s {
  /* config */
  char dir[4096];
  char prefix[132];
  int bslz4;
  int check; /* REC_CHECK_*: how far a pass-through chunk is checked */
  unsigned chunk_frames;
  /* series (copied: the stage keeps no reference to the series object) */
  int open;
  uint64_t series_id, nframes;
  beam_dtype_t dtype;
  uint32_t ndim;
  uint32_t shape[BEAM_MAX_NDIM];
  size_t elem, frame_bytes, chunk_bytes;
  char final_path[4300], path[4320];
  hid_t file, data, fid, tacq, flg;
  uint64_t written;   /* rows in /entry/data/data (frames accepted) */
  uint64_t committed; /* rows whose chunk is on disk */
  uint64_t corrupt, errors, passthrough;
  uint8_t *chunk, *enc, *scratch; /* chunk_bytes, codec bound, chunk_bytes */
  size_t enc_cap;
  unsigned in_chunk; /* frames in the chunk being filled */
  uint64_t ids[REC_IDS_BUF], tacqs[REC_IDS_BUF];
  uint32_t flags[REC_IDS_BUF];
  unsigned nids;
  uint64_t ids_written; /* rows of the companion datasets on disk */
  uint64_t last_flush_ns;
  int full; /* the disk is (nearly) full: no more frames this series */
} rec_t;

/* Bytes kept free on the record disk for HDF5's own writes (frame ids,
 * B-tree nodes, the final attributes and flush): past it no chunk is
 * written, so the file can still be flushed and closed consistently.
 * HDF5 itself, meeting ENOSPC mid-write, can leave metadata on disk that
 * points past the end of the file, an unreadable file. */
#define REC_DISK_RESERVE (256u << 10)

static void close_file(rec_t *s) {
  hid_t *h[] = {&s->data, &s->fid, &s->tacq, &s->flg};
  for (size_t i = 0; i < sizeof h / sizeof *h; i++)
    if (*h[i] >= 0) {
      H5Dclose(*h[i]);
      *h[i] = -1;
    }
  if (s->file >= 0) {
    H5Fclose(s->file);
    s->file = -1;
  }
}

static void free_series(rec_t *s) {
  close_file(s);
  free(s->chunk);
  free(s->enc);
  free(s->scratch);
  s->chunk = s->enc = s->scratch = NULL;
  s->open = 0;
}

static void rec_destroy(beam_stage_t *self) {
  rec_t *s = self->priv;
  if (!s)
    return;
  if (s->file >= 0)
    H5Fflush(s->file, H5F_SCOPE_GLOBAL); /* whatever was written stays readable */
  free_series(s);
  free(s);
  self->priv = NULL;
}

/* The directory exists (or is created) and a file can be created in it: a
 * real probe, because access(W_OK) says yes to root on a read-only mount. */
static int check_dir(const char *dir, beam_diag_t *d) {
  struct stat st;
  if (stat(dir, &st) < 0) {
    if (errno != ENOENT || mkdir(dir, 0777) < 0)
      return BEAM_DIAG(d, BEAM_ECONFIG, "record: directory %s: %s", dir, strerror(errno));
  } else if (!S_ISDIR(st.st_mode)) {
    return BEAM_DIAG(d, BEAM_ECONFIG, "record: %s is not a directory", dir);
  }
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.beamd-record-XXXXXX", dir);
  int fd = mkstemp(probe);
  if (fd < 0)
    return BEAM_DIAG(d, BEAM_ECONFIG, "record: cannot create files in %s: %s", dir, strerror(errno));
  close(fd);
  unlink(probe);
  return 0;
}

static int rec_process_encoded(beam_stage_t *self, beam_frame_t *in, beam_emit_t *emit);

static int rec_init(beam_stage_t *self, beam_diag_t *d) {
  rec_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "record: out of memory");
  s->file = s->data = s->fid = s->tacq = s->flg = -1;
  self->priv = s;
  const char *dir = beam_cfg_str(self->cfg, "dir");
  const char *prefix = beam_cfg_str(self->cfg, "prefix");
  const char *comp = beam_cfg_str(self->cfg, "compress");
  int64_t cf = beam_cfg_int(self->cfg, "chunk_frames", 1);
  const char *check = beam_cfg_str(self->cfg, "check");
  int rc = 0;
  if (!dir || !dir[0] || strlen(dir) >= sizeof s->dir)
    rc = BEAM_DIAG(d, BEAM_ECONFIG, "record: dir must be a path of 1..%zu characters", sizeof s->dir - 1);
  else if (prefix && (strchr(prefix, '/') || strlen(prefix) >= sizeof s->prefix))
    rc = BEAM_DIAG(d, BEAM_ECONFIG, "record: prefix must not contain '/' (at most 128 characters)");
  else if (cf < 1 || cf > 1024)
    rc = BEAM_DIAG(d, BEAM_ECONFIG, "record: chunk_frames %lld outside 1..1024", (long long)cf);
  else if (comp && strcmp(comp, "bslz4") && strcmp(comp, "none"))
    rc = BEAM_DIAG(d, BEAM_ECONFIG, "record: compress must be bslz4 or none, got \"%s\"", comp);
  if (rc == 0) {
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    snprintf(s->prefix, sizeof s->prefix, "%s", prefix ? prefix : "");
    s->bslz4 = !comp || !strcmp(comp, "bslz4");
    s->chunk_frames = (unsigned)cf;
    s->check = !check || !strcmp(check, "full") ? REC_CHECK_FULL
               : !strcmp(check, "decode")       ? REC_CHECK_DECODE
                                                : REC_CHECK_FRAMING;
    rc = check_dir(s->dir, d);
  }
  self->process_encoded = rec_process_encoded;
  self->counters[REC_CTR_PASSTHROUGH].name = "passthrough";
  self->ncounters = 1;
  return rc;
}

/* Error from the current HDF5 stack into the stage diagnostic. */
static int h5fail(beam_stage_t *self, rec_t *s, beam_diag_t *d, const char *what) {
  char why[512];
  int e = 0;
  beam_h5_reason(why, sizeof why, &e);
  (void)e;
  return BEAM_DIAG(d, BEAM_EIO, "record \"%s\": %s: %s: %s", self->name, s->path, what, why);
}

static hid_t make_1d(hid_t loc, const char *name, hid_t type) {
  hsize_t dim = 0, maxd = H5S_UNLIMITED, chunk = REC_IDS_FLUSH;
  hid_t sp = H5Screate_simple(1, &dim, &maxd);
  hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t ds = -1;
  if (sp >= 0 && pl >= 0 && H5Pset_chunk(pl, 1, &chunk) >= 0)
    ds = H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
  if (pl >= 0) H5Pclose(pl);
  if (sp >= 0) H5Sclose(sp);
  return ds;
}

/* Picks DIR/<prefix>series_<id>[-n].h5 so an earlier recording (a daemon
 * restart reuses series ids) is never overwritten. */
static void pick_names(rec_t *s, uint64_t sid) {
  for (unsigned n = 0;; n++) {
    char suffix[24] = "";
    if (n)
      snprintf(suffix, sizeof suffix, "-%u", n);
    snprintf(s->final_path, sizeof s->final_path, "%s/%sseries_%llu%s.h5", s->dir, s->prefix,
             (unsigned long long)sid, suffix);
    snprintf(s->path, sizeof s->path, "%s.partial", s->final_path);
    if (access(s->final_path, F_OK) != 0 && access(s->path, F_OK) != 0)
      return;
  }
}

static int write_series_attrs(rec_t *s, const beam_series_t *series) {
  hid_t g = H5Gcreate2(s->file, "/series", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0)
    return -1;
  int rc = 0;
  const char *dtn = beam_dtype_name(s->dtype);
  uint64_t shape[BEAM_MAX_NDIM];
  for (uint32_t i = 0; i < s->ndim; i++)
    shape[i] = s->shape[i];
  rc |= beam_h5_attr_u64(g, "series_id", series->series_id);
  rc |= beam_h5_attr_str(g, "frame_dtype", dtn);
  rc |= beam_h5_attr_u64s(g, "frame_shape", shape, s->ndim);
  rc |= beam_h5_attr_bool(g, "metadata_missing", series->meta_json == NULL);
  if (series->meta_json) {
    rc |= beam_h5_attr_strn(g, "metadata_json", series->meta_json, series->meta_len);
    char msg[128];
    /* Malformed metadata is kept verbatim above; only the flattening fails. */
    if (beam_h5_attrs_from_json(g, series->meta_json, series->meta_len, 1, msg, sizeof msg) < 0)
      H5Eclear2(H5E_DEFAULT);
  }
  H5Gclose(g);
  return rc ? -1 : 0;
}

static int create_file(beam_stage_t *self, rec_t *s, const beam_series_t *series, beam_diag_t *d) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  /* 1.8 object headers at least: large metadata attributes need dense storage. */
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  s->file = H5Fcreate(s->path, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
  H5Pclose(fapl);
  if (s->file < 0)
    return h5fail(self, s, d, "cannot create file");
  hid_t entry = H5Gcreate2(s->file, "/entry", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  hid_t dg = entry >= 0 ? H5Gcreate2(entry, "data", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
  hid_t ftype = beam_h5_type(s->dtype);
  hid_t sp = -1, pl = -1;
  int rc = entry >= 0 && dg >= 0 && ftype >= 0 ? 0 : -1;
  if (rc == 0) {
    hsize_t dims[BEAM_MAX_NDIM + 1] = {0}, maxd[BEAM_MAX_NDIM + 1], chunk[BEAM_MAX_NDIM + 1];
    maxd[0] = H5S_UNLIMITED;
    chunk[0] = s->chunk_frames;
    for (uint32_t i = 0; i < s->ndim; i++)
      dims[i + 1] = maxd[i + 1] = chunk[i + 1] = s->shape[i];
    sp = H5Screate_simple((int)s->ndim + 1, dims, maxd);
    pl = H5Pcreate(H5P_DATASET_CREATE);
    rc = sp >= 0 && pl >= 0 && H5Pset_chunk(pl, (int)s->ndim + 1, chunk) >= 0 ? 0 : -1;
    if (rc == 0 && s->bslz4) {
      /* With the plugin loadable, its set_local fills in the element size
       * from (block size 0 = default, compression 2 = LZ4); without it we
       * state the full parameter list ourselves. */
      if (H5Zfilter_avail(BEAM_H5_BSLZ4_FILTER) > 0) {
        const unsigned cd[2] = {0, 2};
        rc = H5Pset_filter(pl, BEAM_H5_BSLZ4_FILTER, H5Z_FLAG_MANDATORY, 2, cd) < 0 ? -1 : 0;
      } else {
        H5Eclear2(H5E_DEFAULT);
        const unsigned cd[5] = {0, 3, (unsigned)s->elem, 0, 2};
        rc = H5Pset_filter(pl, BEAM_H5_BSLZ4_FILTER, H5Z_FLAG_OPTIONAL, 5, cd) < 0 ? -1 : 0;
      }
    }
    if (rc == 0)
      s->data = H5Dcreate2(dg, "data", ftype, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    s->fid = s->data >= 0 ? make_1d(dg, "frame_id", H5T_STD_U64LE) : -1;
    s->tacq = s->fid >= 0 ? make_1d(dg, "t_acq_ns", H5T_STD_U64LE) : -1;
    s->flg = s->tacq >= 0 ? make_1d(dg, "flags", H5T_STD_U32LE) : -1;
    rc = s->flg >= 0 ? 0 : -1;
  }
  if (rc == 0) {
    rc |= beam_h5_attr_str(entry, "NX_class", "NXentry");
    rc |= beam_h5_attr_str(entry, "writer", "beamd record stage");
    rc |= beam_h5_attr_str(entry, "stage", self->name);
    rc |= beam_h5_attr_u64(entry, "series_id", series->series_id);
    rc |= beam_h5_attr_u64(entry, "frames_expected", series->nframes);
    rc |= beam_h5_attr_bool(entry, "complete", 0);
    rc |= beam_h5_attr_str(dg, "NX_class", "NXdata");
    rc |= beam_h5_attr_str(dg, "signal", "data");
    rc |= beam_h5_attr_str(entry, "compression", s->bslz4 ? "bslz4" : "none");
    rc |= write_series_attrs(s, series);
    rc |= beam_nx_write_series(s->file, series, s->dtype);
  }
  if (pl >= 0) H5Pclose(pl);
  if (sp >= 0) H5Sclose(sp);
  if (ftype >= 0) H5Tclose(ftype);
  if (dg >= 0) H5Gclose(dg);
  if (entry >= 0) H5Gclose(entry);
  if (rc < 0) {
    int r = h5fail(self, s, d, "cannot create the datasets");
    close_file(s);
    unlink(s->path);
    return r;
  }
  return 0;
}

static int rec_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  rec_t *s = self->priv;
  beam_h5_quiet();
  if (s->open) /* end() did not run (a rejected series, say): keep what was written */
    free_series(s);
  self->nouts = 0; /* a sink: nothing is published */
  s->elem = beam_dtype_size(in->dtype);
  if (!s->elem || in->ndim < 1 || in->ndim > 3)
    return BEAM_DIAG(d, BEAM_ESHAPE, "record: frames must be 1-3 dimensional with a known dtype");
  s->dtype = in->dtype;
  s->ndim = in->ndim;
  memcpy(s->shape, in->shape, sizeof s->shape);
  s->frame_bytes = s->elem;
  for (uint32_t i = 0; i < in->ndim; i++)
    s->frame_bytes *= in->shape[i];
  if (s->frame_bytes == 0 || s->frame_bytes > REC_MAX_CHUNK / s->chunk_frames)
    return BEAM_DIAG(d, BEAM_ELIMIT, "record: a chunk of %u frames of %zu bytes exceeds %u bytes",
                     s->chunk_frames, s->frame_bytes, REC_MAX_CHUNK);
  s->chunk_bytes = s->frame_bytes * s->chunk_frames;
  s->enc_cap = s->bslz4 ? beam_codec_bound(BEAM_CODEC_BSLZ4, s->chunk_bytes, s->elem) : 0;
  s->chunk = calloc(1, s->chunk_bytes);
  s->enc = s->bslz4 ? malloc(s->enc_cap) : NULL;
  s->scratch = s->bslz4 ? malloc(s->chunk_bytes) : NULL;
  if (!s->chunk || (s->bslz4 && (!s->enc || !s->scratch))) {
    free_series(s);
    return BEAM_DIAG(d, BEAM_ENOMEM, "record: cannot allocate %zu-byte chunk buffers", s->chunk_bytes);
  }
  s->written = s->committed = s->corrupt = s->errors = s->passthrough = s->ids_written = 0;
  s->full = 0;
  s->in_chunk = s->nids = 0;
  pick_names(s, series->series_id);
  int rc = create_file(self, s, series, d);
  if (rc < 0) {
    free_series(s);
    return rc;
  }
  s->open = 1;
  s->series_id = series->series_id;
  s->nframes = series->nframes;
  s->last_flush_ns = beam_now_ns();
  return 0;
}

/* Writes the companions of the rows whose pixels are on disk (rows
 * [ids_written, committed)); rows of a chunk still being filled wait. */
static int flush_ids(beam_stage_t *self, rec_t *s, beam_diag_t *d) {
  unsigned n = (unsigned)(s->committed - s->ids_written);
  if (!n)
    return 0;
  if (beam_h5_append_rows(s->fid, s->ids_written, n, H5T_NATIVE_UINT64, s->ids, 0, NULL, NULL) < 0 ||
      beam_h5_append_rows(s->tacq, s->ids_written, n, H5T_NATIVE_UINT64, s->tacqs, 0, NULL, NULL) < 0 ||
      beam_h5_append_rows(s->flg, s->ids_written, n, H5T_NATIVE_UINT32, s->flags, 0, NULL, NULL) < 0) {
    /* Leave the three companions at the same length; retried next time. */
    hsize_t len = s->ids_written;
    H5Dset_extent(s->fid, &len);
    H5Dset_extent(s->tacq, &len);
    H5Dset_extent(s->flg, &len);
    return h5fail(self, s, d, "writing frame ids");
  }
  s->ids_written += n;
  s->nids -= n;
  memmove(s->ids, s->ids + n, s->nids * sizeof *s->ids);
  memmove(s->tacqs, s->tacqs + n, s->nids * sizeof *s->tacqs);
  memmove(s->flags, s->flags + n, s->nids * sizeof *s->flags);
  return 0;
}

/* Stores the n frames of the last n rows (already counted in written and
 * ids) as one chunk of size bytes, exactly as HDF5 keeps it. On failure the
 * rows are forgotten, ids included, so the file never holds a row without
 * its pixels. rc is an error already diagnosed (encoding) or 0. */
static int store_chunk(beam_stage_t *self, rec_t *s, unsigned n, const void *buf, size_t size,
                       int rc, beam_diag_t *d) {
  hsize_t dims[BEAM_MAX_NDIM + 1] = {0}, off[BEAM_MAX_NDIM + 1] = {0};
  dims[0] = s->committed + n;
  off[0] = s->committed;
  for (uint32_t i = 0; i < s->ndim; i++)
    dims[i + 1] = s->shape[i];
  struct statvfs vfs;
  if (rc == 0 && !s->full && statvfs(s->dir, &vfs) == 0 &&
      (uint64_t)vfs.f_bavail * vfs.f_frsize < (uint64_t)size + REC_DISK_RESERVE + s->chunk_bytes) {
    s->full = 1;
    rc = BEAM_DIAG(d, BEAM_EIO, "record \"%s\": %s: No space left on device (%llu bytes free "
                   "on %s): frames from %llu on are not recorded this series; the file keeps the "
                   "%llu written, closed cleanly", self->name, s->path,
                   (unsigned long long)vfs.f_bavail * vfs.f_frsize, s->dir,
                   (unsigned long long)s->committed, (unsigned long long)s->committed);
  } else if (rc == 0 && s->full) {
    rc = BEAM_DIAG(d, BEAM_EIO, "record \"%s\": %s: No space left on device: frame not recorded",
                   self->name, s->path);
  }
  if (rc == 0 && (H5Dset_extent(s->data, dims) < 0 ||
                  H5Dwrite_chunk(s->data, H5P_DEFAULT, 0, off, size, buf) < 0)) {
    rc = h5fail(self, s, d, "writing frames");
    dims[0] = s->committed; /* no row without its pixels */
    H5Dset_extent(s->data, dims);
    H5Eclear2(H5E_DEFAULT);
  }
  if (rc < 0) {
    s->errors++;
    s->nids -= n;
    s->written -= n;
    return rc;
  }
  s->committed += n;
  return 0;
}

/* Writes the chunk being filled (a last partial chunk is zero padded: HDF5
 * stores a chunk whole). */
static int flush_chunk(beam_stage_t *self, rec_t *s, beam_diag_t *d) {
  if (!s->in_chunk)
    return 0;
  unsigned n = s->in_chunk;
  s->in_chunk = 0;
  if (n < s->chunk_frames)
    memset(s->chunk + (size_t)n * s->frame_bytes, 0, (size_t)(s->chunk_frames - n) * s->frame_bytes);
  const void *buf = s->chunk;
  size_t size = s->chunk_bytes;
  int rc = 0;
  if (s->bslz4) {
    int64_t e = beam_codec_encode(BEAM_CODEC_BSLZ4, s->chunk, s->chunk_bytes, s->elem, s->enc,
                                  s->enc_cap, s->scratch);
    if (e < 0)
      rc = BEAM_DIAG(d, (int)e, "record \"%s\": %s: bitshuffle-LZ4 encoding failed: %s",
                     self->name, s->path, beam_strerror((int)e));
    buf = s->enc;
    size = e < 0 ? 0 : (size_t)e;
  }
  return store_chunk(self, s, n, buf, size, rc, d);
}

static int periodic_flush(beam_stage_t *self, rec_t *s, int force) {
  uint64_t now = beam_now_ns();
  int rc = 0;
  if (s->nids >= REC_IDS_FLUSH || force || now - s->last_flush_ns >= REC_FLUSH_NS)
    if ((rc = flush_ids(self, s, &self->diag)) < 0)
      s->errors++;
  if (force || now - s->last_flush_ns >= REC_FLUSH_NS) {
    s->last_flush_ns = now;
    if (H5Fflush(s->file, H5F_SCOPE_GLOBAL) < 0 && rc == 0) {
      rc = h5fail(self, s, &self->diag, "flush");
      s->errors++;
    }
  }
  return rc;
}

static int same_geometry(const rec_t *s, const beam_frame_t *in) {
  int ok = in->dtype == s->dtype && in->ndim == s->ndim && in->nbytes >= s->frame_bytes;
  for (uint32_t i = 0; ok && i < s->ndim; i++)
    ok = in->shape[i] == s->shape[i];
  return ok;
}

static void add_row(rec_t *s, const beam_frame_t *in, uint32_t flags) {
  s->ids[s->nids] = in->frame_id;
  s->tacqs[s->nids] = in->t_acq_ns;
  s->flags[s->nids] = flags;
  s->nids++;
  s->written++;
}

static int rec_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  rec_t *s = self->priv;
  (void)emit;
  if (!s->open || s->file < 0)
    return BEAM_DIAG(&self->diag, BEAM_ESTATE, "record \"%s\": no open file for this series", self->name);
  if (in->flags & BEAM_FLAG_CORRUPT) {
    s->corrupt++; /* no pixels to record; frame_id keeps the numbering honest */
    return 0;
  }
  if (!same_geometry(s, in))
    return BEAM_DIAG(&self->diag, BEAM_ESHAPE, "record \"%s\": frame %llu does not match the series geometry",
                     self->name, (unsigned long long)in->frame_id);
  memcpy(s->chunk + (size_t)s->in_chunk * s->frame_bytes, in->data, s->frame_bytes);
  s->in_chunk++;
  add_row(s, in, in->flags);
  if (s->in_chunk == s->chunk_frames) {
    int rc = flush_chunk(self, s, &self->diag);
    if (rc < 0)
      return rc;
  }
  return periodic_flush(self, s, 0);
}

static uint64_t rd_be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = v << 8 | p[i];
  return v;
}

/* 1 when src is a 32008 chunk the filter will turn into exactly raw_bytes:
 * the checks of beam_codec_decode, each LZ4 block walked (full) or
 * decompressed into scratch (decode), never bit-unshuffled, which cannot
 * fail. With check: framing the LZ4 streams themselves are taken on trust:
 * only the framing must account for every byte. */
static int bslz4_chunk_ok(const uint8_t *src, size_t len, size_t raw_bytes, size_t es,
                          uint8_t *scratch, int check) {
  if (len < REC_FRAMING_HDR || rd_be(src, 8) != raw_bytes)
    return 0;
  size_t bbytes = (size_t)rd_be(src + 8, 4);
  if (bbytes % es || bbytes / es == 0 || (bbytes / es) % REC_BSHUF_MULT ||
      bbytes > (size_t)LZ4_MAX_INPUT_SIZE)
    return 0;
  size_t b = bbytes / es, n = raw_bytes / es, pos = REC_FRAMING_HDR;
  for (size_t i = 0; i < n; i += b) {
    size_t cnt = n - i < b ? n - i : b;
    cnt -= cnt % REC_BSHUF_MULT;
    if (!cnt)
      break;
    if (len - pos < 4)
      return 0;
    size_t c = (size_t)rd_be(src + pos, 4);
    pos += 4;
    if (c > len - pos || c > (size_t)LZ4_MAX_INPUT_SIZE)
      return 0;
    if (check == REC_CHECK_FULL) {
      if (!beam_lz4_block_check(src + pos, c, cnt * es))
        return 0;
    } else if (check == REC_CHECK_DECODE) {
      int got = LZ4_decompress_safe((const char *)src + pos, (char *)scratch, (int)c,
                                    (int)(cnt * es));
      if (got < 0 || (size_t)got != cnt * es)
        return 0;
    } else if ((size_t)c > LZ4_COMPRESSBOUND(cnt * es)) {
      return 0; /* more than LZ4 could have made of the block */
    }
    pos += c;
  }
  return len - pos == (n % REC_BSHUF_MULT) * es;
}

static int store_passthrough(beam_stage_t *self, rec_t *s, const beam_frame_t *in, const void *chunk,
                             size_t len, uint32_t flags);

/* Pass-through (see the top of the file). Returns 1 when the frame was
 * stored (or its store failed: < 0), 0 to have it decoded and given to
 * rec_process. */
static int rec_process_encoded(beam_stage_t *self, beam_frame_t *in, beam_emit_t *emit) {
  rec_t *s = self->priv;
  (void)emit;
  if (!s->open || s->file < 0 || !s->bslz4 || s->chunk_frames != 1 || s->in_chunk)
    return 0;
  /* A decoder on another thread rewrites data, codec, enc_size, nbytes and
   * flags: read them only while the frame is lent (dtype and shape are
   * never rewritten). */
  const void *kept;
  size_t len;
  beam_codec_t codec;
  uint32_t flags = in->flags;
  const uint8_t *chunk = s->enc;
  int decoded_ok = beam_frame_encoded_kept(in, &kept, &len, &codec);
  if (decoded_ok) {
    /* Decoded by another stage, the wire bytes kept for us (frame.h):
     * immutable while we hold the frame, no loan or copy needed, and
     * known good: that decode succeeded. */
    if (codec != BEAM_CODEC_BSLZ4 || in->nbytes != s->frame_bytes || !same_geometry(s, in))
      return 0;
    chunk = kept;
  } else {
    if (!beam_frame_encoded_lend(in))
      return 0;
    len = in->enc_size;
    flags = in->flags;
    int fits = in->codec == BEAM_CODEC_BSLZ4 && !(in->flags & BEAM_FLAG_CORRUPT) &&
               in->nbytes == s->frame_bytes && same_geometry(s, in) && len <= s->enc_cap;
    /* keep_encoded is 0 only when this stage is the graph's one root and
     * no decode pool runs: no one else will ever ask for these pixels, so
     * the loan may last the check and the write, and the copy is saved. */
    int sole = !in->keep_encoded;
    if (fits && sole) {
      int rc = bslz4_chunk_ok(in->data, len, s->frame_bytes, s->elem, s->scratch, s->check)
                   ? store_passthrough(self, s, in, in->data, len, flags)
                   : 0;
      beam_frame_encoded_return(in);
      return rc;
    }
    if (fits)
      memcpy(s->enc, in->data, len);
    beam_frame_encoded_return(in);
    if (!fits)
      return 0;
    if (!bslz4_chunk_ok(chunk, len, s->frame_bytes, s->elem, s->scratch, s->check))
      return 0;
  }
  return store_passthrough(self, s, in, chunk, len, flags);
}

/* Stores a checked pass-through chunk: 1, or < 0 when the store failed. */
static int store_passthrough(beam_stage_t *self, rec_t *s, const beam_frame_t *in, const void *chunk,
                             size_t len, uint32_t flags) {
  add_row(s, in, flags);
  int rc = store_chunk(self, s, 1, chunk, len, 0, &self->diag);
  if (rc < 0)
    return rc;
  s->passthrough++;
  atomic_fetch_add(&self->counters[REC_CTR_PASSTHROUGH].value, 1);
  rc = periodic_flush(self, s, 0);
  return rc < 0 ? rc : 1;
}

static int rec_end(beam_stage_t *self, beam_emit_t *emit) {
  rec_t *s = self->priv;
  (void)emit;
  if (!s->open)
    return 0;
  beam_h5_quiet();
  beam_diag_t *d = &self->diag;
  int rc = 0;
  if (s->file >= 0) {
    if (flush_chunk(self, s, d) < 0)
      rc = d->code;
    if (periodic_flush(self, s, 1) < 0)
      rc = rc ? rc : d->code;
  }
  int complete = s->file >= 0 && s->errors == 0 && !self->end_aborted && !self->end_missing &&
                 (s->nframes == 0 || s->written + s->corrupt >= s->nframes);
  if (s->file >= 0) {
    hid_t entry = H5Gopen2(s->file, "/entry", H5P_DEFAULT);
    int arc = entry >= 0 ? 0 : -1;
    if (entry >= 0) {
      arc |= beam_h5_attr_u64(entry, "frames_written", s->committed);
      arc |= beam_h5_attr_u64(entry, "frames_corrupt", s->corrupt);
      arc |= beam_h5_attr_u64(entry, "frames_missing", self->end_missing);
      arc |= beam_h5_attr_u64(entry, "write_errors", s->errors);
      arc |= beam_h5_attr_u64(entry, "frames_passthrough", s->passthrough);
      arc |= beam_h5_attr_bool(entry, "complete", complete);
      H5Gclose(entry);
    }
    if (arc < 0 || H5Fflush(s->file, H5F_SCOPE_GLOBAL) < 0) {
      int r = h5fail(self, s, d, "writing the final attributes");
      rc = rc ? rc : r;
      complete = 0;
    }
    close_file(s);
    if (complete && rename(s->path, s->final_path) < 0)
      rc = rc ? rc
              : BEAM_DIAG(d, BEAM_EIO, "record \"%s\": rename %s -> %s: %s", self->name, s->path,
                          s->final_path, strerror(errno));
    else if (!complete && rc == 0)
      rc = BEAM_DIAG(d, BEAM_EIO, "record \"%s\": series %llu incomplete (%llu of %llu frames, %llu write errors); left as %s",
                     self->name, (unsigned long long)s->series_id, (unsigned long long)s->committed,
                     (unsigned long long)s->nframes, (unsigned long long)s->errors, s->path);
  }
  free_series(s);
  return rc;
}

const beam_stage_ops_t beam_record_cpu_ops = {
    .kind = "record", .backend = "cpu",
    .init = rec_init, .start = rec_start, .process = rec_process, .end = rec_end, .destroy = rec_destroy,
};

const beam_stage_kind_t beam_record_kind = {
    "record", "frames to HDF5, one file per series (bitshuffle-LZ4 chunks), replayable",
    beam_record_params, &beam_record_cpu_ops, NULL, NULL};

void beam_record_stage_register(void) { (void)beam_stage_kind_register(&beam_record_kind); }
