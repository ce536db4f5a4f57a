/* beamd-replay frame source: finds the frames in an HDF5 file and reads one
 * frame at a time, forwarding stored chunks when the protocol carries their
 * codec and decoding through HDF5 otherwise.
 *
 * A source is one 3-D dataset, or an Eiger/NXmx master whose
 * /entry/data/data_NNNNNN links (usually external) are concatenated in
 * name order. A data file that cannot be opened is kept as a "dangling"
 * part whose frames are served as CORRUPT, so the frames around it still
 * flow; only a source with no readable part at all is refused. HDF5's own
 * error printing is off for the whole process: errors are taken from the
 * error stack into our messages (rp_h5_reason). Metadata lives in h5meta.c,
 * the framing check of forwarded chunks in chunk.c.
 */
#include "tools/beamd-replay/replay.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/h5chunkloc.h"
#include "daemon/h5util.h"
#include "daemon/nxmx.h"

#define FILTER_LZ4 32004
#define FILTER_BSHUF 32008
#define BSHUF_LZ4 2         /* cd_values[4] of 32008: LZ4 compression */
#define CHUNK_CACHE_MAX (256u << 20)

/* ---- HDF5 errors ---------------------------------------------------------- */

typedef struct h5walk_s {
  char *buf;
  size_t len;
} h5walk_t;

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *ctx) {
  h5walk_t *w = ctx;
  /* The downward walk ends at the innermost entry, the most specific one. */
  if (e->desc && e->desc[0])
    snprintf(w->buf, w->len, "%s", e->desc);
  (void)n;
  return 0;
}

const char *rp_h5_reason(char *buf, size_t len) {
  h5walk_t w = {buf, len};
  buf[0] = '\0';
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &w);
  H5Eclear2(H5E_DEFAULT);
  if (!buf[0])
    snprintf(buf, len, "HDF5 error without detail");
  return buf;
}

/* ---- helpers -------------------------------------------------------------- */

static char *xstrdup(const char *s) {
  return s ? strdup(s) : NULL;
}

static int is_dataset(hid_t loc, const char *path) {
  H5O_info_t oi;
  if (!beam_h5_exists(loc, path))
    return 0;
  if (H5Oget_info_by_name(loc, path, &oi, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  return oi.type == H5O_TYPE_DATASET;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t fnv_file(uint64_t h, const char *path) {
  char rp[PATH_MAX];
  struct stat st;
  const char *p = realpath(path, rp) ? rp : path;
  h = fnv1a(h, p, strlen(p) + 1);
  if (stat(p, &st) == 0) {
    uint64_t v[2] = {(uint64_t)st.st_size,
                     (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec};
    h = fnv1a(h, v, sizeof v);
  }
  return h;
}

/* Maps a dataset type to a wire dtype and the native type to decode into. */
static int map_type(hid_t t, beam_dtype_t *dt, hid_t *mem, int *le, char *why, size_t wl) {
  H5T_class_t cls = H5Tget_class(t);
  size_t sz = H5Tget_size(t);
  H5T_order_t ord = H5Tget_order(t);
  *le = ord == H5T_ORDER_LE || sz == 1;
  if (cls == H5T_INTEGER) {
    int sgn = H5Tget_sign(t) == H5T_SGN_2;
    switch (sz) {
    case 1: *dt = sgn ? BEAM_DT_I8 : BEAM_DT_U8; *mem = sgn ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8; return 0;
    case 2: *dt = sgn ? BEAM_DT_I16 : BEAM_DT_U16; *mem = sgn ? H5T_NATIVE_INT16 : H5T_NATIVE_UINT16; return 0;
    case 4: *dt = sgn ? BEAM_DT_I32 : BEAM_DT_U32; *mem = sgn ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT32; return 0;
    case 8: *dt = sgn ? BEAM_DT_I64 : BEAM_DT_U64; *mem = sgn ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64; return 0;
    default: break;
    }
  } else if (cls == H5T_FLOAT && (sz == 4 || sz == 8)) {
    *dt = sz == 4 ? BEAM_DT_F32 : BEAM_DT_F64;
    *mem = sz == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
    return 0;
  }
  snprintf(why, wl, "element type (HDF5 class %d, %zu bytes) is not supported "
           "(uint8/16/32/64, int8/16/32/64, float32/64)", (int)cls, sz);
  return -1;
}

/* ---- one part -------------------------------------------------------------- */

/* Decides how a part's frames are read: forwarded as stored when every
 * chunk is one whole frame, the data is little-endian and the pipeline is
 * empty or exactly one of LZ4 (32004) and bitshuffle+LZ4 (32008); decoded
 * by HDF5 otherwise, in which case every filter must be available. */
static int plan_part(rp_src_t *s, rp_part_t *p, hid_t dcpl, int le, beam_diag_t *d) {
  char name[64];
  unsigned flags, cd[16];
  size_t ncd;
  int nf = H5Pget_nfilters(dcpl);
  int chunk1 = 0;
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t cdim[3];
    if (H5Pget_chunk(dcpl, 3, cdim) == 3 && cdim[0] == 1 && cdim[1] == s->h && cdim[2] == s->w)
      chunk1 = 1;
  }
  p->forward = 0;
  p->codec = BEAM_CODEC_RAW;
  p->chunk0 = 0;
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t cdim[3];
    if (H5Pget_chunk(dcpl, 3, cdim) == 3)
      p->chunk0 = cdim[0];
  }
  if (chunk1 && le) {
    if (nf == 0) {
      p->forward = 1;
    } else if (nf == 1) {
      ncd = sizeof cd / sizeof cd[0];
      H5Z_filter_t id = H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, sizeof name, name, NULL);
      if (id == FILTER_LZ4) {
        p->forward = 1;
        p->codec = BEAM_CODEC_LZ4;
      } else if (id == FILTER_BSHUF && ncd >= 5 && cd[4] == BSHUF_LZ4 &&
                 (cd[2] == 0 || cd[2] == s->esize)) {
        p->forward = 1;
        p->codec = BEAM_CODEC_BSLZ4;
      }
    }
  }
  if (p->forward) {
    snprintf(p->plan, sizeof p->plan, "forward %s chunks", beam_codec_name(p->codec));
    return 0;
  }
  /* Decoding needs the filters; say which one is missing now rather than
   * turning every frame into a CORRUPT one. */
  char list[64] = "";
  for (int i = 0; i < nf; i++) {
    ncd = sizeof cd / sizeof cd[0];
    name[0] = '\0';
    H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof name, name, NULL);
    if (id < 0)
      return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: cannot read filter %d", p->file,
                       p->dataset, i);
    htri_t av = H5Zfilter_avail(id);
    if (av <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return BEAM_DIAG(d, BEAM_ENOTSUP,
                       "file %s dataset %s: HDF5 filter %d (%s) is not available (is its "
                       "plugin in HDF5_PLUGIN_PATH?)", p->file, p->dataset, (int)id,
                       name[0] ? name : "unknown filter");
    }
    size_t l = strlen(list);
    snprintf(list + l, sizeof list - l, "%s%d", i ? "+" : "", (int)id);
  }
  snprintf(p->plan, sizeof p->plan, "decode %s%s%s%s", chunk1 ? "" : "(chunks are not one frame) ",
           nf ? "filters " : "", list, le ? "" : " big-endian");
  return 0;
}

/* Opens part p (its dataset already named). Fills geometry into s when
 * it is the first readable part, else checks it matches. A part that cannot
 * be opened gets open_error and returns 0; a part that opens but is not a
 * valid frame stack is an error. */
static int open_part(rp_src_t *s, rp_part_t *p, const char *open_path, int *have_geom,
                     beam_diag_t *d) {
  char why[512];
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  p->dset = H5Dopen2(s->file, open_path, dapl);
  H5Pclose(dapl);
  if (p->dset < 0) {
    rp_h5_reason(why, sizeof why);
    struct stat st;
    if (p->link && stat(p->file, &st) != 0)
      snprintf(why, sizeof why, "data file %s: %s", p->file, strerror(errno));
    p->open_error = xstrdup(why);
    return 0;
  }
  p->fspace = H5Dget_space(p->dset);
  int nd = H5Sget_simple_extent_ndims(p->fspace);
  hsize_t dims[8];
  if (nd != 3) {
    return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: has %d dimensions, expected 3 "
                     "(frames, y, x)", p->file, p->dataset, nd);
  }
  H5Sget_simple_extent_dims(p->fspace, dims, NULL);
  hid_t t = H5Dget_type(p->dset);
  beam_dtype_t dt;
  hid_t mem;
  int le;
  int trc = map_type(t, &dt, &mem, &le, why, sizeof why);
  H5Tclose(t);
  if (trc < 0)
    return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: %s", p->file, p->dataset, why);
  if (!*have_geom) {
    if (dims[1] < 1 || dims[2] < 1 || dims[1] > beam_limits_default.max_dim ||
        dims[2] > beam_limits_default.max_dim)
      return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: frame shape %llux%llu outside "
                       "1..%u per axis", p->file, p->dataset, (unsigned long long)dims[1],
                       (unsigned long long)dims[2], beam_limits_default.max_dim);
    s->h = (uint32_t)dims[1];
    s->w = (uint32_t)dims[2];
    s->dtype = dt;
    s->esize = beam_dtype_size(dt);
    s->memtype = mem;
    if ((uint64_t)s->h * s->w * s->esize > beam_limits_default.max_raw_bytes)
      return BEAM_DIAG(d, BEAM_ELIMIT, "file %s dataset %s: a frame of %ux%u %s exceeds the "
                       "protocol limit", p->file, p->dataset, s->h, s->w, beam_dtype_name(dt));
    s->raw_size = (size_t)s->h * s->w * s->esize;
    *have_geom = 1;
  } else if (dims[1] != s->h || dims[2] != s->w || dt != s->dtype) {
    return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: frames are %llux%llu %s, but the "
                     "first data file has %ux%u %s", p->file, p->dataset,
                     (unsigned long long)dims[1], (unsigned long long)dims[2],
                     beam_dtype_name(dt), s->h, s->w, beam_dtype_name(s->dtype));
  }
  p->nframes = dims[0];
  hid_t dcpl = H5Dget_create_plist(p->dset);
  int rc = plan_part(s, p, dcpl, le, d);
  /* Decoding frames of a multi-frame chunk one by one would inflate the
   * chunk once per frame; a cache that holds two chunks avoids that. */
  if (rc == 0 && !p->forward && H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t cdim[3];
    if (H5Pget_chunk(dcpl, 3, cdim) == 3) {
      double cb = (double)cdim[0] * (double)cdim[1] * (double)cdim[2] * (double)s->esize;
      size_t want = cb * 2 > CHUNK_CACHE_MAX ? CHUNK_CACHE_MAX : (size_t)(cb * 2);
      if (want > (1u << 20)) {
        H5Dclose(p->dset);
        H5Sclose(p->fspace);
        dapl = H5Pcreate(H5P_DATASET_ACCESS);
        H5Pset_chunk_cache(dapl, 521, want, 1.0);
        p->dset = H5Dopen2(s->file, open_path, dapl);
        H5Pclose(dapl);
        p->fspace = p->dset >= 0 ? H5Dget_space(p->dset) : -1;
        if (p->dset < 0)
          rc = BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: reopening: %s", p->file, p->dataset,
                         rp_h5_reason(why, sizeof why));
      }
    }
  }
  H5Pclose(dcpl);
  return rc;
}

/* ---- master files ------------------------------------------------------------ */

/* The data file an external link points to, resolved the way HDF5 looks
 * for it last (relative to the master's directory), for messages. */
static char *link_target(rp_src_t *s, const char *lpath, char **obj) {
  H5L_info_t li;
  *obj = NULL;
  if (H5Lget_info(s->file, lpath, &li, H5P_DEFAULT) < 0 || li.type != H5L_TYPE_EXTERNAL) {
    H5Eclear2(H5E_DEFAULT);
    return NULL;
  }
  char *val = malloc(li.u.val_size + 1);
  const char *fname = NULL, *opath = NULL;
  unsigned fl;
  char *out = NULL;
  if (val && H5Lget_val(s->file, lpath, val, li.u.val_size, H5P_DEFAULT) >= 0 &&
      H5Lunpack_elink_val(val, li.u.val_size, &fl, &fname, &opath) >= 0) {
    if (fname[0] == '/') {
      out = strdup(fname);
    } else {
      const char *slash = strrchr(s->path, '/');
      size_t dl = slash ? (size_t)(slash - s->path) : 0;
      size_t n = dl + 1 + strlen(fname) + 1;
      out = malloc(n);
      if (out)
        snprintf(out, n, "%.*s/%s", (int)dl, s->path, fname);
    }
    *obj = xstrdup(opath);
  }
  H5Eclear2(H5E_DEFAULT);
  free(val);
  return out;
}

/* Eiger masters state the series length (nimages x ntrigger); used only to
 * size a dangling last data file. Returns 0 when unknown. */
static uint64_t master_nimages(hid_t f) {
  const char *pn = "/entry/instrument/detector/detectorSpecific/nimages";
  const char *pt = "/entry/instrument/detector/detectorSpecific/ntrigger";
  uint64_t v[2] = {0, 1};
  const char *paths[2] = {pn, pt};
  for (int i = 0; i < 2; i++) {
    if (!is_dataset(f, paths[i]))
      continue;
    hid_t ds = H5Dopen2(f, paths[i], H5P_DEFAULT);
    unsigned long long x = 0;
    if (ds >= 0 && H5Dread(ds, H5T_NATIVE_ULLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, &x) >= 0)
      v[i] = x;
    if (ds >= 0)
      H5Dclose(ds);
    H5Eclear2(H5E_DEFAULT);
  }
  return v[0] * (v[1] ? v[1] : 1);
}

static int open_master(rp_src_t *s, char **names, size_t n, beam_diag_t *d) {
  s->parts = calloc(n, sizeof *s->parts);
  if (!s->parts)
    return BEAM_DIAG(d, BEAM_ENOMEM, "part table");
  s->nparts = n;
  int have_geom = 0;
  char lp[64];
  for (size_t i = 0; i < n; i++) {
    rp_part_t *p = &s->parts[i];
    p->dset = p->fspace = -1;
    snprintf(lp, sizeof lp, "/entry/data/%s", names[i]);
    p->link = strdup(lp);
    char *obj = NULL;
    p->file = link_target(s, lp, &obj);
    if (!p->file) { /* a link inside the master itself */
      p->file = strdup(s->path);
      p->dataset = strdup(lp);
    } else {
      p->dataset = obj ? obj : strdup("/entry/data/data");
    }
    if (!p->link || !p->file || !p->dataset)
      return BEAM_DIAG(d, BEAM_ENOMEM, "part names");
    int rc = open_part(s, p, lp, &have_geom, d);
    if (rc < 0)
      return rc;
  }
  if (!have_geom) {
    return BEAM_DIAG(d, BEAM_EIO, "file %s: none of its %zu data files can be read (%s: %s)",
                     s->path, s->nparts, s->parts[0].file, s->parts[0].open_error);
  }
  /* A dangling data file's length is unknown: Eiger writes a fixed number
   * of frames per data file, so the first readable file's count is used,
   * and for the last file the remainder of the series when the master says
   * how long it is. */
  uint64_t per_file = 0;
  for (size_t i = 0; i < s->nparts && !per_file; i++)
    if (s->parts[i].dset >= 0)
      per_file = s->parts[i].nframes;
  uint64_t known = 0, total = master_nimages(s->file);
  for (size_t i = 0; i < s->nparts; i++)
    if (s->parts[i].dset >= 0)
      known += s->parts[i].nframes;
  uint64_t first = 0;
  for (size_t i = 0; i < s->nparts; i++) {
    rp_part_t *p = &s->parts[i];
    if (p->dset < 0) {
      p->nframes = per_file;
      if (i == s->nparts - 1 && total) {
        uint64_t other = known;
        for (size_t j = 0; j < i; j++)
          if (s->parts[j].dset < 0)
            other += per_file;
        if (total > other)
          p->nframes = total - other;
      }
      snprintf(p->plan, sizeof p->plan, "unreadable, %llu frames served as CORRUPT",
               (unsigned long long)p->nframes);
      fprintf(stderr, "beamd-replay: warning: file %s dataset %s (%s): %s; its %llu frames "
              "(%llu..%llu) will be sent as CORRUPT\n", p->file, p->dataset, p->link,
              p->open_error, (unsigned long long)p->nframes, (unsigned long long)first,
              (unsigned long long)(first + p->nframes - 1));
    }
    p->first = first;
    first += p->nframes;
  }
  s->nframes = first;
  return 0;
}

/* ---- single dataset -------------------------------------------------------- */

static int open_single(rp_src_t *s, const char *dataset, beam_diag_t *d) {
  char name[512];
  if (dataset) {
    if (!beam_h5_exists(s->file, dataset))
      return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no dataset %s", s->path, dataset);
    if (!is_dataset(s->file, dataset))
      return BEAM_DIAG(d, BEAM_EINVAL, "file %s: %s is not a dataset (a group, or a link "
                       "that cannot be followed)", s->path, dataset);
    snprintf(name, sizeof name, "%s", dataset);
  } else if (is_dataset(s->file, "/entry/data/data")) {
    snprintf(name, sizeof name, "/entry/data/data");
  } else {
    beam_h5_dsets_t f = {.skip = NULL};
    beam_h5_find_dsets(s->file, &f);
    if (f.n3d != 1) {
      if (f.n3d == 0)
        return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no 3-D dataset (frames, y, x) and no "
                         "/entry/data/data_NNNNNN links; datasets: %s", s->path,
                         f.n ? f.list : "none");
      return BEAM_DIAG(d, BEAM_EINVAL, "file %s: %d 3-D datasets, choose one with --dataset; "
                       "datasets: %s", s->path, f.n3d, f.list);
    }
    snprintf(name, sizeof name, "%s", f.first3d);
  }
  s->dataset = strdup(name);
  s->parts = calloc(1, sizeof *s->parts);
  if (!s->dataset || !s->parts)
    return BEAM_DIAG(d, BEAM_ENOMEM, "part table");
  s->nparts = 1;
  rp_part_t *p = &s->parts[0];
  p->dset = p->fspace = -1;
  p->file = strdup(s->path);
  p->dataset = strdup(name);
  if (!p->file || !p->dataset)
    return BEAM_DIAG(d, BEAM_ENOMEM, "part names");
  int have_geom = 0;
  int rc = open_part(s, p, name, &have_geom, d);
  if (rc < 0)
    return rc;
  if (p->dset < 0)
    return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: cannot open: %s", s->path, name,
                     p->open_error);
  s->nframes = p->nframes;
  return 0;
}

/* ---- positions ---------------------------------------------------------------- */

/* /entry/sample/positions: (N, 2) or (N, 3) of x, y[, z] with a "units"
 * attribute (default m), N = frames of the source. Anything else is
 * reported and ignored: the frames are still worth serving. */
static void load_positions(rp_src_t *s) {
  beam_nx_pos_t p;
  const char *pp = BEAM_NX_POSITIONS;
  switch (beam_nx_positions(s->file, s->nframes, 0, &p, rp_h5_reason)) {
  case BEAM_NX_POS_ABSENT:
  case BEAM_NX_POS_OPEN:
    return;
  case BEAM_NX_POS_SHAPE:
    fprintf(stderr, "beamd-replay: warning: file %s dataset %s: expected (frames, 2|3) "
            "positions; ignored\n", s->path, pp);
    return;
  case BEAM_NX_POS_COUNT:
    fprintf(stderr, "beamd-replay: warning: file %s dataset %s: %llu positions for %llu "
            "frames; ignored\n", s->path, pp, (unsigned long long)p.n,
            (unsigned long long)s->nframes);
    return;
  case BEAM_NX_POS_UNITS:
    fprintf(stderr, "beamd-replay: warning: file %s dataset %s: unknown length units \"%s\"; "
            "ignored\n", s->path, pp, p.units);
    return;
  case BEAM_NX_POS_NOMEM:
    fprintf(stderr, "beamd-replay: warning: no memory for %llu positions; ignored\n",
            (unsigned long long)p.n);
    return;
  case BEAM_NX_POS_READ:
    fprintf(stderr, "beamd-replay: warning: file %s dataset %s: %s; ignored\n", s->path, pp,
            p.why);
    return;
  case BEAM_NX_POS_OK:
    break;
  }
  if (!(s->pos = calloc(p.n * 3, sizeof *s->pos))) {
    fprintf(stderr, "beamd-replay: warning: no memory for %llu positions; ignored\n",
            (unsigned long long)p.n);
  } else {
    for (uint64_t i = 0; i < p.n; i++)
      for (unsigned j = 0; j < p.cols; j++)
        s->pos[i * 3 + j] = p.xyz[i * p.cols + j];
    snprintf(s->pos_dataset, sizeof s->pos_dataset, "%s", pp);
    snprintf(s->pos_units, sizeof s->pos_units, "%s", p.units[0] ? p.units : "m");
  }
  free(p.xyz);
}

/* ---- open / close ------------------------------------------------------------------- */

int rp_src_open(rp_src_t *s, const char *path, const char *dataset, beam_diag_t *d) {
  char why[512];
  memset(s, 0, sizeof *s);
  s->file = s->memspace = -1;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  struct stat st;
  if (stat(path, &st) != 0)
    return BEAM_DIAG(d, BEAM_EIO, "file %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return BEAM_DIAG(d, BEAM_EIO, "file %s: not a regular file", path);
  char rp[PATH_MAX];
  s->path = strdup(realpath(path, rp) ? rp : path);
  if (!s->path)
    return BEAM_DIAG(d, BEAM_ENOMEM, "path");
  /* Through the chunk-locating driver, which external links to data files
   * inherit, so frames can be read in place; HDF5's own driver when that
   * one cannot open the file, so serving never depends on it. */
  hid_t fapl = beam_h5loc_fapl();
  if (fapl >= 0) {
    s->file = H5Fopen(s->path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    H5Eclear2(H5E_DEFAULT);
  }
  s->locatable = s->file >= 0;
  if (s->file < 0)
    s->file = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (s->file < 0)
    return BEAM_DIAG(d, BEAM_EIO, "file %s: cannot open as HDF5: %s", path,
                     rp_h5_reason(why, sizeof why));
  int rc;
  char **links = NULL;
  size_t nl = 0;
  if (!dataset)
    beam_h5_data_links(s->file, &links, &nl);
  if (nl) {
    s->is_master = 1;
    s->dataset = strdup("/entry/data");
    rc = s->dataset ? open_master(s, links, nl, d) : BEAM_DIAG(d, BEAM_ENOMEM, "name");
  } else {
    rc = open_single(s, dataset, d);
  }
  beam_h5_names_free(links, nl);
  if (rc < 0)
    return rc;
  if (s->nframes == 0)
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: holds no frames", s->path,
                     s->dataset);
  hsize_t md[2] = {s->h, s->w};
  s->memspace = H5Screate_simple(2, md, NULL);
  /* A forwarded chunk may be larger than the frame (incompressible data);
   * the protocol caps it at the codec bound, and bigger chunks are decoded
   * instead, so the bound is the most one frame can take. */
  s->slot_size = s->raw_size;
  for (size_t i = 0; i < s->nparts; i++) {
    if (s->parts[i].forward && s->parts[i].codec != BEAM_CODEC_RAW) {
      size_t b = beam_codec_bound(s->parts[i].codec, s->raw_size, s->esize);
      if (b > s->slot_size)
        s->slot_size = b;
    }
  }
  load_positions(s);
  uint64_t h = 0xcbf29ce484222325ull;
  h = fnv_file(h, s->path);
  for (size_t i = 0; i < s->nparts; i++)
    if (s->parts[i].link)
      h = fnv_file(h, s->parts[i].file);
  snprintf(s->file_id, sizeof s->file_id, "%016llx", (unsigned long long)h);
  return 0;
}

void rp_src_close(rp_src_t *s) {
  if (!s)
    return;
  for (size_t i = 0; i < s->nparts; i++) {
    rp_part_t *p = &s->parts[i];
    if (p->fspace >= 0)
      H5Sclose(p->fspace);
    if (p->dset >= 0)
      H5Dclose(p->dset);
    free(p->file);
    free(p->dataset);
    free(p->link);
    free(p->open_error);
    beam_fmap_unref(p->map);
  }
  free(s->parts);
  if (s->memspace >= 0)
    H5Sclose(s->memspace);
  if (s->file >= 0)
    H5Fclose(s->file);
  free(s->path);
  free(s->dataset);
  free(s->pos);
  free(s->batch);
  memset(s, 0, sizeof *s);
  s->file = s->memspace = -1;
}

/* ---- frames ------------------------------------------------------------------------ */

static rp_part_t *part_of(rp_src_t *s, uint64_t g) {
  size_t lo = 0, hi = s->nparts;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (s->parts[mid].first <= g)
      lo = mid;
    else
      hi = mid;
  }
  return &s->parts[lo];
}

/* beam_h5_chunk_size of a forwarded frame, remembered for the one frame
 * last asked about: the server sizes a reply by it and then reads the same
 * frame. */
static int frame_chunk(rp_src_t *s, rp_part_t *p, uint64_t g, hsize_t *n, char *why,
                       size_t wl) {
  if (s->look_valid && s->look_g == g) {
    *n = s->look_n;
    return 1;
  }
  hsize_t off[3] = {g - p->first, 0, 0};
  int st = beam_h5_chunk_size(p->dset, off, n, why, wl);
  s->look_valid = st == 1;
  s->look_g = g;
  s->look_n = *n;
  return st;
}

size_t rp_src_frame_bytes(rp_src_t *s, uint64_t g) {
  rp_part_t *p = part_of(s, g);
  if (p->dset < 0)
    return 0;
  if (!p->forward)
    return s->raw_size;
  hsize_t n = 0;
  char why[256];
  if (frame_chunk(s, p, g, &n, why, sizeof why) <= 0)
    return 0;
  return n > s->slot_size ? s->raw_size : (size_t)n;
}

static int decode_frame(rp_src_t *s, rp_part_t *p, uint64_t k, void *buf, char *why,
                        size_t wl) {
  hsize_t start[3] = {k, 0, 0}, count[3] = {1, s->h, s->w};
  char r[512];
  if (p->chunk0) {
    /* HDF5 would return fill values for a chunk that was never written;
     * for a detector that is a lost frame, as on the forwarding path. */
    hsize_t off[3] = {k - k % p->chunk0, 0, 0}, n = 0;
    char cr[256];
    int st = beam_h5_chunk_size(p->dset, off, &n, cr, sizeof cr);
    if (st <= 0) {
      snprintf(why, wl, "%s%s", st < 0 ? "chunk index: " : "chunk was never written",
               st < 0 ? cr : "");
      return -1;
    }
  }
  if (H5Sselect_hyperslab(p->fspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
      H5Dread(p->dset, s->memtype, s->memspace, p->fspace, H5P_DEFAULT, buf) < 0) {
    snprintf(why, wl, "%s", rp_h5_reason(r, sizeof r));
    return -1;
  }
  s->decoded++;
  return 0;
}

int rp_src_read(rp_src_t *s, uint64_t g, void *buf, size_t cap, beam_codec_t *codec,
                size_t *len, char *why, size_t wl) {
  rp_part_t *p = part_of(s, g);
  uint64_t k = g - p->first;
  char r[512];
  const char *bad = NULL;
  r[0] = '\0';
  *codec = BEAM_CODEC_RAW;
  *len = s->raw_size;
  BEAM_ASSERT(cap >= s->slot_size);
  if (p->dset < 0) {
    snprintf(r, sizeof r, "%s", p->open_error);
    goto corrupt;
  }
  if (p->forward) {
    hsize_t off[3] = {k, 0, 0}, n = 0;
    uint32_t mask = 0;
    int st = frame_chunk(s, p, g, &n, why, wl);
    if (st <= 0) {
      snprintf(r, sizeof r, "%s%s", st < 0 ? "chunk index: " : "chunk was never written",
               st < 0 ? why : "");
      goto corrupt;
    }
    if (n > s->slot_size) /* beyond what the protocol may carry: decode */
      goto decode;
    if (H5Dread_chunk(p->dset, H5P_DEFAULT, off, &mask, buf) < 0) {
      snprintf(r, sizeof r, "reading chunk: %s", rp_h5_reason(why, wl));
      goto corrupt;
    }
    if (mask != 0) {
      /* HDF5 skipped the filter for this chunk (an optional filter that
       * did not help): the bytes are the raw frame. */
      if (n == s->raw_size) {
        *len = (size_t)n;
        s->forwarded++;
        return 0;
      }
      goto decode;
    }
    if (p->codec == BEAM_CODEC_RAW) {
      if (n != s->raw_size) {
        snprintf(r, sizeof r, "stored chunk is %llu bytes, a frame is %zu",
                 (unsigned long long)n, s->raw_size);
        goto corrupt;
      }
    } else if ((bad = rp_chunk_check(p->codec, buf, (size_t)n, s->raw_size, s->esize))) {
      snprintf(r, sizeof r, "stored chunk (%llu bytes): %s", (unsigned long long)n, bad);
      goto corrupt;
    }
    *codec = p->codec;
    *len = (size_t)n;
    s->forwarded++;
    return 0;
  }
decode:
  if (decode_frame(s, p, k, buf, r, sizeof r) < 0)
    goto corrupt;
  *len = s->raw_size;
  return 0;
corrupt:
  snprintf(why, wl, "file %s dataset %s frame %llu: %s", p->file, p->dataset,
           (unsigned long long)k, r);
  return BEAM_EIO;
}

/* ---- in place ------------------------------------------------------------------------ */

/* Our mapping of the file at fd, covering [off, off + n): a file that grew
 * (written under SWMR) is mapped afresh. The size is taken once per reply:
 * a file cut short since is mapped afresh too, and a chunk past its end is
 * left to rp_src_read, which reports it. */
static int part_map(rp_src_t *s, rp_part_t *p, int fd, uint64_t off, uint64_t n) {
  if (p->size_batch != s->batches || p->map_fd != fd) {
    struct stat st;
    if (fstat(fd, &st) < 0)
      return 0;
    p->size = (uint64_t)st.st_size;
    p->size_batch = s->batches;
  }
  if (p->size < off || p->size - off < n)
    return 0;
  if (p->map && p->map_fd == fd && beam_fmap_size(p->map) == p->size)
    return 1;
  char err[160];
  beam_fmap_t *m = beam_fmap_from_fd(fd, err, sizeof err);
  if (!m)
    return 0;
  beam_fmap_unref(p->map);
  p->map = m;
  p->map_fd = fd;
  return beam_fmap_covers(m, off, n);
}

/* Frame g located when it may be read in place; a compressed chunk's
 * framing still to be checked. */
static int locate(rp_src_t *s, uint64_t g, rp_loc_t *loc) {
  rp_part_t *p = part_of(s, g);
  if (!s->locatable || p->dset < 0 || !p->forward)
    return 0;
  hsize_t off[3] = {g - p->first, 0, 0};
  int fd;
  uint64_t addr, n;
  unsigned mask;
  char why[256];
  if (beam_h5loc_chunk(p->dset, off, &fd, &addr, &n, &mask, why, sizeof why) != 1 || mask ||
      n == 0 || n > s->slot_size || !part_map(s, p, fd, addr, n))
    return 0;
  /* Raw frames are handed to stages as they lie, so they must be aligned
   * for any element type's loads, as a ZeroMQ buffer is. */
  if (p->codec == BEAM_CODEC_RAW && (n != s->raw_size || addr % 8))
    return 0;
  loc->fd = fd;
  loc->off = addr;
  loc->len = (size_t)n;
  loc->codec = p->codec;
  loc->file = p->file;
  loc->base = beam_fmap_base(p->map);
  return 1;
}

struct rp_batch_s {
  beam_codec_t codec[RP_CREDIT_MAX];
  const uint8_t *ptr[RP_CREDIT_MAX];
  size_t len[RP_CREDIT_MAX], idx[RP_CREDIT_MAX];
  const char *bad[RP_CREDIT_MAX];
};

void rp_src_locate_many(rp_src_t *s, const uint64_t *gs, size_t n, rp_loc_t *locs,
                        uint8_t *ok) {
  BEAM_ASSERT(n <= RP_CREDIT_MAX);
  if (!s->batch && !(s->batch = malloc(sizeof *s->batch))) {
    memset(ok, 0, n);
    return;
  }
  struct rp_batch_s *b = s->batch;
  size_t nc = 0;
  s->batches++;
  for (size_t i = 0; i < n; i++) {
    ok[i] = (uint8_t)locate(s, gs[i], &locs[i]);
    if (ok[i] && locs[i].codec != BEAM_CODEC_RAW) {
      b->codec[nc] = locs[i].codec;
      b->ptr[nc] = locs[i].base + locs[i].off;
      b->len[nc] = locs[i].len;
      b->idx[nc++] = i;
    }
  }
  rp_chunk_check_many(b->codec, b->ptr, b->len, nc, s->raw_size, s->esize, b->bad);
  for (size_t j = 0; j < nc; j++)
    if (b->bad[j])
      ok[b->idx[j]] = 0;
}
