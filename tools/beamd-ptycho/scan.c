/* beamd-ptycho scan reader: the frame layouts beamd-replay serves
 * (docs/replay.md) that carry positions, read one frame at a time with
 * hyperslabs, so each MPI rank touches only its own frames. Every problem
 * is reported with the file, the dataset and the index; nothing is
 * guessed except what docs/ptycho.md says (NXmx paths, units). */
#include "tools/beamd-ptycho/ptycho.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/h5util.h"
#include "daemon/nxmx.h"

#define DET BEAM_NX_DET
#define POS_PATH BEAM_NX_POSITIONS

/* A field that exists but is unusable is an error here: reconstructing
 * with a guessed geometry would give a wrong image without saying so. */
typedef struct bad_ctx_s {
  const char *file;
  beam_diag_t *d;
} bad_ctx_t;

static int bad_field(void *ctx, const char *path, int code, const char *units) {
  bad_ctx_t *c = ctx;
  if (code == BEAM_NX_EUNITS)
    return BEAM_DIAG(c->d, BEAM_EINVAL, "file %s dataset %s: unknown units \"%s\"", c->file,
                     path, units);
  return BEAM_DIAG(c->d, BEAM_EINVAL, "file %s dataset %s: not a finite number", c->file, path);
}

static int open_part(pt_scan_t *s, pt_part_t *p, beam_diag_t *d) {
  p->ds = H5Dopen2(s->file, p->name, H5P_DEFAULT);
  if (p->ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: cannot open (a missing external data "
                     "file?)", s->path, p->name);
  }
  p->space = H5Dget_space(p->ds);
  hid_t t = H5Dget_type(p->ds);
  H5T_class_t cls = H5Tget_class(t);
  H5Tclose(t);
  hsize_t dims[3];
  if (H5Sget_simple_extent_ndims(p->space) != 3)
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: expected (frames, y, x), rank %d",
                     s->path, p->name, H5Sget_simple_extent_ndims(p->space));
  if (cls != H5T_INTEGER && cls != H5T_FLOAT)
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: frames are not numbers", s->path,
                     p->name);
  H5Sget_simple_extent_dims(p->space, dims, NULL);
  if (s->nparts && p != s->parts && (dims[1] != s->h || dims[2] != s->w))
    return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: frames are %llux%llu, but %s has "
                     "%ux%u frames", s->path, p->name, (unsigned long long)dims[1],
                     (unsigned long long)dims[2], s->parts[0].name, s->h, s->w);
  if (dims[1] == 0 || dims[2] == 0 || dims[1] > 65536 || dims[2] > 65536)
    return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: frame shape %llux%llu", s->path,
                     p->name, (unsigned long long)dims[1], (unsigned long long)dims[2]);
  s->h = (uint32_t)dims[1];
  s->w = (uint32_t)dims[2];
  p->count = dims[0];
  return 0;
}

static int open_frames(pt_scan_t *s, const char *dataset, beam_diag_t *d) {
  char **links = NULL;
  size_t nl = 0;
  if (!dataset)
    beam_h5_data_links(s->file, &links, &nl);
  char one[64] = "";
  if (!nl) {
    if (dataset) {
      if (!beam_h5_exists(s->file, dataset))
        return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no dataset %s", s->path, dataset);
      snprintf(one, sizeof one, "%s", dataset);
    } else if (beam_h5_exists(s->file, "/entry/data/data")) {
      snprintf(one, sizeof one, "/entry/data/data");
    } else {
      beam_h5_dsets_t f = {.skip = "entry/truth"}; /* beamd-sim's ground truth */
      beam_h5_find_dsets(s->file, &f);
      if (f.n3d != 1)
        return BEAM_DIAG(d, BEAM_EINVAL, "file %s: %s; name the frames with --dataset",
                         s->path,
                         f.n3d ? "several 3-D datasets" : "no 3-D (frames, y, x) dataset");
      snprintf(one, sizeof one, "%.*s", (int)sizeof one - 1, f.first3d);
    }
  }
  size_t np = nl ? nl : 1;
  s->parts = calloc(np, sizeof *s->parts);
  if (!s->parts) {
    beam_h5_names_free(links, nl);
    return BEAM_DIAG(d, BEAM_ENOMEM, "part table");
  }
  int rc = 0;
  for (size_t i = 0; i < np && rc == 0; i++) {
    pt_part_t *p = &s->parts[i];
    p->ds = p->space = -1;
    if (nl)
      snprintf(p->name, sizeof p->name, "/entry/data/%s", links[i]);
    else
      snprintf(p->name, sizeof p->name, "%s", one);
    rc = open_part(s, p, d);
    p->first = s->nframes;
    s->nframes += p->count;
    s->nparts = i + 1;
  }
  beam_h5_names_free(links, nl);
  if (rc == 0 && s->nframes == 0)
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: holds no frames", s->path,
                   s->parts[0].name);
  return rc;
}

static int load_positions(pt_scan_t *s, beam_diag_t *d) {
  beam_nx_pos_t p;
  int rc = 0;
  switch (beam_nx_positions(s->file, s->nframes, 1, &p, NULL)) {
  case BEAM_NX_POS_ABSENT:
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no dataset %s (beamd-ptycho needs the scan "
                     "positions: (frames, 2) x, y with a length unit)", s->path, POS_PATH);
  case BEAM_NX_POS_OPEN:
    return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: cannot open", s->path, POS_PATH);
  case BEAM_NX_POS_SHAPE:
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: expected (frames, 2|3) x, y[, z], "
                     "rank %d", s->path, POS_PATH, p.rank);
  case BEAM_NX_POS_COUNT:
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: %llu positions for %llu frames",
                     s->path, POS_PATH, (unsigned long long)p.n, (unsigned long long)s->nframes);
  case BEAM_NX_POS_UNITS:
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: unknown length units \"%s\"", s->path,
                     POS_PATH, p.units);
  case BEAM_NX_POS_NOMEM:
    return BEAM_DIAG(d, BEAM_ENOMEM, "%llu positions", (unsigned long long)p.n);
  case BEAM_NX_POS_READ:
    return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: read failed", s->path, POS_PATH);
  case BEAM_NX_POS_OK:
    break;
  }
  if (!(s->pos_yx = malloc(s->nframes * 2 * sizeof *s->pos_yx))) {
    free(p.xyz);
    return BEAM_DIAG(d, BEAM_ENOMEM, "%llu positions", (unsigned long long)p.n);
  }
  if (p.n > s->nframes)
    fprintf(stderr, "beamd-ptycho: warning: file %s dataset %s: %llu positions for %llu "
            "frames; the first %llu are used\n", s->path, POS_PATH, (unsigned long long)p.n,
            (unsigned long long)s->nframes, (unsigned long long)s->nframes);
  for (uint64_t i = 0; i < s->nframes && rc == 0; i++) {
    double x = p.xyz[i * p.cols], y = p.xyz[i * p.cols + 1];
    if (!isfinite(x) || !isfinite(y))
      rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: position %llu is not finite "
                     "(x %g, y %g)", s->path, POS_PATH, (unsigned long long)i, x, y);
    s->pos_yx[2 * i] = y;
    s->pos_yx[2 * i + 1] = x;
  }
  free(p.xyz);
  return rc;
}

static int load_mask(pt_scan_t *s, beam_diag_t *d) {
  static const char *paths[] = {DET "pixel_mask", DET "detectorSpecific/pixel_mask"};
  for (size_t i = 0; i < 2; i++) {
    if (!beam_h5_exists(s->file, paths[i]))
      continue;
    hid_t ds = H5Dopen2(s->file, paths[i], H5P_DEFAULT);
    if (ds < 0)
      continue;
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[2] = {0, 0};
    int rc = 0;
    if (H5Sget_simple_extent_ndims(sp) != 2 ||
        (H5Sget_simple_extent_dims(sp, dims, NULL), dims[0] != s->h || dims[1] != s->w)) {
      rc = BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: mask is not %ux%u like the frames",
                     s->path, paths[i], s->h, s->w);
    } else {
      uint32_t *m = malloc((size_t)s->h * s->w * sizeof *m);
      s->mask = malloc((size_t)s->h * s->w);
      if (!m || !s->mask)
        rc = BEAM_DIAG(d, BEAM_ENOMEM, "pixel mask");
      else if (H5Dread(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, m) < 0)
        rc = BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: read failed", s->path, paths[i]);
      else
        for (size_t p = 0; p < (size_t)s->h * s->w; p++)
          s->mask[p] = m[p] != 0;
      free(m);
      snprintf(s->mask_path, sizeof s->mask_path, "%s", paths[i]);
    }
    H5Sclose(sp);
    H5Dclose(ds);
    H5Eclear2(H5E_DEFAULT);
    return rc;
  }
  return 0;
}

int pt_scan_open(pt_scan_t *s, const char *path, const char *dataset, beam_diag_t *d) {
  memset(s, 0, sizeof *s);
  s->path = path;
  s->file = -1;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  s->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (s->file < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_DIAG(d, BEAM_EIO, "file %s: cannot open as HDF5", path);
  }
  int rc = open_frames(s, dataset, d);
  if (rc == 0)
    rc = load_positions(s, d);
  if (rc == 0)
    rc = load_mask(s, d);
  double v, x, y;
  int q;
  bad_ctx_t bc = {s->path, d};
  if (rc == 0 && (q = beam_nx_energy(s->file, &v, bad_field, &bc)) != 0) {
    if (q < 0)
      rc = q;
    else
      s->energy = v;
  }
  if (rc == 0 && (q = beam_nx_distance(s->file, &v, bad_field, &bc)) != 0) {
    if (q < 0)
      rc = q;
    else
      s->distance = v;
  }
  if (rc == 0 &&
      (q = beam_nx_get(s->file, DET "x_pixel_size", BEAM_NX_LENGTH, 1, &v, bad_field, &bc)) !=
          0) {
    if (q < 0)
      rc = q;
    else
      s->pixel = v;
  }
  if (rc == 0) {
    int a = beam_nx_get(s->file, DET "beam_center_x", BEAM_NX_PIXELS, 1, &x, bad_field, &bc);
    int b = a < 0 ? a : beam_nx_get(s->file, DET "beam_center_y", BEAM_NX_PIXELS, 1, &y,
                                    bad_field, &bc);
    if (a < 0 || b < 0)
      rc = a < 0 ? a : b;
    else if (a == 1 && b == 1) {
      s->have_center = 1;
      s->cy = y;
      s->cx = x;
    }
  }
  return rc;
}

int pt_scan_frame(pt_scan_t *s, uint64_t idx, double *out, beam_diag_t *d) {
  size_t lo = 0, hi = s->nparts;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (s->parts[mid].first <= idx)
      lo = mid;
    else
      hi = mid;
  }
  pt_part_t *p = &s->parts[lo];
  hsize_t off[3] = {idx - p->first, 0, 0}, cnt[3] = {1, s->h, s->w};
  hid_t ms = H5Screate_simple(3, cnt, NULL);
  H5Sselect_hyperslab(p->space, H5S_SELECT_SET, off, NULL, cnt, NULL);
  herr_t e = H5Dread(p->ds, H5T_NATIVE_DOUBLE, ms, p->space, H5P_DEFAULT, out);
  H5Sclose(ms);
  if (e < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: cannot read frame %llu (a missing "
                     "filter plugin?)", s->path, p->name, (unsigned long long)off[0]);
  }
  return 0;
}

void pt_scan_close(pt_scan_t *s) {
  for (size_t i = 0; i < s->nparts; i++) {
    if (s->parts[i].space >= 0)
      H5Sclose(s->parts[i].space);
    if (s->parts[i].ds >= 0)
      H5Dclose(s->parts[i].ds);
  }
  free(s->parts);
  free(s->pos_yx);
  free(s->mask);
  if (s->file >= 0)
    H5Fclose(s->file);
  memset(s, 0, sizeof *s);
  s->file = -1;
}

int pt_read_complex(const char *spec, const char *const *cands, size_t ncands, double **out,
                    uint64_t dims3[3], char *used, size_t used_len, beam_diag_t *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s", spec);
  const char *dset = beam_h5_split_spec(path);
  *out = NULL;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_DIAG(d, BEAM_EIO, "file %s: cannot open as HDF5", path);
  }
  hid_t ds = -1;
  if (dset) {
    ds = beam_h5_exists(f, dset) ? H5Dopen2(f, dset, H5P_DEFAULT) : -1;
  } else {
    for (size_t i = 0; i < ncands && ds < 0; i++)
      if (beam_h5_exists(f, cands[i]) && (ds = H5Dopen2(f, cands[i], H5P_DEFAULT)) >= 0)
        dset = cands[i];
  }
  H5Eclear2(H5E_DEFAULT);
  if (ds < 0) {
    char list[512] = "";
    for (size_t i = 0; i < ncands; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", cands[i]);
    H5Fclose(f);
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no dataset %s", path, dset ? dset : list);
  }
  snprintf(used, used_len, "%s:%s", path, dset);
  hid_t sp = H5Dget_space(ds);
  int nd = H5Sget_simple_extent_ndims(sp), rc = 0;
  hsize_t dims[3] = {1, 1, 1};
  if ((nd != 2 && nd != 3) || !beam_h5_cplx_kind(ds)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: expected a 2-D or 3-D complex or real "
                   "array", path, dset);
  } else {
    H5Sget_simple_extent_dims(sp, nd == 3 ? dims : dims + 1, NULL);
    size_t np = (size_t)(dims[0] * dims[1] * dims[2]);
    double *v = malloc(np * 2 * sizeof *v);
    if (!v) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "file %s dataset %s: %zu values", path, dset, np);
    } else {
      if (beam_h5_read_cplx(ds, v) < 0) {
        rc = BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: read failed", path, dset);
      } else {
        for (size_t i = 0; i < 2 * np && rc == 0; i++)
          if (!isfinite(v[i]))
            rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: element %zu is not finite",
                           path, dset, i / 2);
      }
      if (rc == 0)
        *out = v;
      else
        free(v);
    }
  }
  for (int i = 0; i < 3; i++)
    dims3[i] = dims[i];
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}
