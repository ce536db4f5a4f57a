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

#define DET "/entry/instrument/detector/"
#define BEAM "/entry/instrument/beam/"
#define POS_PATH "/entry/sample/positions"
#define HC_EV_M 1.239841984332e-6

/* H5Lexists fails on a missing intermediate group; test each prefix. */
static int exists(hid_t f, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *c = buf + 1; *c; c++) {
    if (*c != '/')
      continue;
    *c = '\0';
    htri_t e = H5Lexists(f, buf, H5P_DEFAULT);
    *c = '/';
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return 0;
    }
  }
  htri_t e = H5Lexists(f, buf, H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  return e > 0;
}

static void units_of(hid_t obj, char *buf, size_t len) {
  buf[0] = '\0';
  if (H5Aexists(obj, "units") <= 0) {
    H5Eclear2(H5E_DEFAULT);
    return;
  }
  hid_t a = H5Aopen(obj, "units", H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : -1;
  if (t >= 0 && H5Tget_class(t) == H5T_STRING) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(t));
    if (H5Tis_variable_str(t) > 0) {
      H5Tset_size(mt, H5T_VARIABLE);
      char *v = NULL;
      if (H5Aread(a, mt, &v) >= 0 && v) {
        snprintf(buf, len, "%s", v);
        H5free_memory(v);
      }
    } else {
      size_t n = H5Tget_size(t);
      char *v = calloc(1, n + 1);
      H5Tset_size(mt, n + 1);
      if (v && H5Aread(a, mt, v) >= 0)
        snprintf(buf, len, "%s", v);
      free(v);
    }
    H5Tclose(mt);
  }
  if (t >= 0)
    H5Tclose(t);
  if (a >= 0)
    H5Aclose(a);
  H5Eclear2(H5E_DEFAULT);
}

typedef enum { Q_LENGTH, Q_ENERGY, Q_PIXELS } qkind_t;

/* Multiplier from units to SI (eV for energy); 0 when unknown. */
static double unit_scale(qkind_t k, const char *u, double dflt) {
  static const struct { qkind_t k; const char *name; double f; } t[] = {
      {Q_LENGTH, "m", 1}, {Q_LENGTH, "meter", 1}, {Q_LENGTH, "metre", 1}, {Q_LENGTH, "mm", 1e-3},
      {Q_LENGTH, "cm", 1e-2}, {Q_LENGTH, "um", 1e-6}, {Q_LENGTH, "\xc2\xb5m", 1e-6},
      {Q_LENGTH, "micron", 1e-6}, {Q_LENGTH, "microns", 1e-6}, {Q_LENGTH, "nm", 1e-9},
      {Q_LENGTH, "pm", 1e-12}, {Q_LENGTH, "angstrom", 1e-10}, {Q_LENGTH, "Angstrom", 1e-10},
      {Q_LENGTH, "A", 1e-10}, {Q_LENGTH, "\xc3\x85", 1e-10},
      {Q_ENERGY, "eV", 1}, {Q_ENERGY, "keV", 1e3}, {Q_ENERGY, "MeV", 1e6},
      {Q_PIXELS, "pixel", 1}, {Q_PIXELS, "pixels", 1}, {Q_PIXELS, "px", 1},
  };
  if (!u[0])
    return dflt;
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (t[i].k == k && !strcmp(u, t[i].name))
      return t[i].f;
  return 0;
}

/* First element of a numeric dataset in SI: 1 found, 0 absent, < 0 error
 * (unknown units, not a number). */
static int quantity(pt_scan_t *s, const char *path, qkind_t k, double dflt, double *out,
                    beam_diag_t *d) {
  if (!exists(s->file, path))
    return 0;
  hid_t ds = H5Dopen2(s->file, path, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  char u[32];
  units_of(ds, u, sizeof u);
  double f = unit_scale(k, u, dflt);
  hid_t sp = H5Dget_space(ds);
  hssize_t np = H5Sget_simple_extent_npoints(sp);
  int rc = 0;
  double *v = np > 0 ? malloc((size_t)np * sizeof *v) : NULL;
  if (f == 0) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: unknown units \"%s\"", s->path, path, u);
  } else if (!v || H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0 ||
             !isfinite(v[0])) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: not a finite number", s->path, path);
  } else {
    *out = v[0] * f;
    rc = 1;
  }
  free(v);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  return rc;
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

typedef struct names_s {
  char (*v)[64];
  size_t n, cap;
} names_t;

static herr_t link_cb(hid_t g, const char *name, const H5L_info_t *info, void *ctx) {
  names_t *l = ctx;
  (void)g;
  (void)info;
  if (strncmp(name, "data_", 5) || strlen(name) != 11 || strspn(name + 5, "0123456789") != 6)
    return 0;
  if (l->n == l->cap) {
    size_t nc = l->cap ? 2 * l->cap : 16;
    void *nv = realloc(l->v, nc * sizeof *l->v);
    if (!nv)
      return -1;
    l->v = nv;
    l->cap = nc;
  }
  snprintf(l->v[l->n++], 64, "/entry/data/%s", name);
  return 0;
}

typedef struct find3_s {
  char first[64];
  int n;
} find3_t;

static herr_t visit_cb(hid_t o, const char *name, const H5O_info_t *info, void *ctx) {
  find3_t *f = ctx;
  if (info->type != H5O_TYPE_DATASET)
    return 0;
  hid_t ds = H5Dopen2(o, name, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  hid_t sp = H5Dget_space(ds);
  if (H5Sget_simple_extent_ndims(sp) == 3 && strncmp(name, "entry/truth", 11)) {
    if (!f->n)
      snprintf(f->first, sizeof f->first, "/%s", name);
    f->n++;
  }
  H5Sclose(sp);
  H5Dclose(ds);
  return 0;
}

static int open_frames(pt_scan_t *s, const char *dataset, beam_diag_t *d) {
  names_t l = {0};
  if (!dataset && exists(s->file, "/entry/data")) {
    hid_t g = H5Gopen2(s->file, "/entry/data", H5P_DEFAULT);
    if (g >= 0) {
      if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, link_cb, &l) < 0)
        H5Eclear2(H5E_DEFAULT);
      H5Gclose(g);
    }
    H5Eclear2(H5E_DEFAULT);
  }
  char one[64] = "";
  if (!l.n) {
    if (dataset) {
      if (!exists(s->file, dataset))
        return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no dataset %s", s->path, dataset);
      snprintf(one, sizeof one, "%s", dataset);
    } else if (exists(s->file, "/entry/data/data")) {
      snprintf(one, sizeof one, "/entry/data/data");
    } else {
      find3_t f = {{0}, 0};
      if (H5Ovisit(s->file, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &f) < 0)
        H5Eclear2(H5E_DEFAULT);
      if (f.n != 1)
        return BEAM_DIAG(d, BEAM_EINVAL, "file %s: %s; name the frames with --dataset",
                         s->path, f.n ? "several 3-D datasets" : "no 3-D (frames, y, x) dataset");
      snprintf(one, sizeof one, "%s", f.first);
    }
  }
  size_t np = l.n ? l.n : 1;
  s->parts = calloc(np, sizeof *s->parts);
  if (!s->parts) {
    free(l.v);
    return BEAM_DIAG(d, BEAM_ENOMEM, "part table");
  }
  int rc = 0;
  for (size_t i = 0; i < np && rc == 0; i++) {
    pt_part_t *p = &s->parts[i];
    p->ds = p->space = -1;
    snprintf(p->name, sizeof p->name, "%s", l.n ? l.v[i] : one);
    rc = open_part(s, p, d);
    p->first = s->nframes;
    s->nframes += p->count;
    s->nparts = i + 1;
  }
  free(l.v);
  if (rc == 0 && s->nframes == 0)
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: holds no frames", s->path,
                   s->parts[0].name);
  return rc;
}

static int load_positions(pt_scan_t *s, beam_diag_t *d) {
  if (!exists(s->file, POS_PATH))
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no dataset %s (beamd-ptycho needs the scan "
                     "positions: (frames, 2) x, y with a length unit)", s->path, POS_PATH);
  hid_t ds = H5Dopen2(s->file, POS_PATH, H5P_DEFAULT);
  if (ds < 0)
    return BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: cannot open", s->path, POS_PATH);
  hid_t sp = H5Dget_space(ds);
  hsize_t dims[2] = {0, 0};
  int nd = H5Sget_simple_extent_ndims(sp);
  if (nd == 2)
    H5Sget_simple_extent_dims(sp, dims, NULL);
  char u[32];
  units_of(ds, u, sizeof u);
  double f = unit_scale(Q_LENGTH, u, 1.0);
  double *tmp = NULL;
  int rc = 0;
  if (nd != 2 || (dims[1] != 2 && dims[1] != 3)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: expected (frames, 2|3) x, y[, z], "
                   "rank %d", s->path, POS_PATH, nd);
  } else if (dims[0] < s->nframes) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: %llu positions for %llu frames",
                   s->path, POS_PATH, (unsigned long long)dims[0],
                   (unsigned long long)s->nframes);
  } else if (f == 0) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: unknown length units \"%s\"", s->path,
                   POS_PATH, u);
  } else if (!(tmp = malloc(dims[0] * dims[1] * sizeof *tmp)) ||
             !(s->pos_yx = malloc(s->nframes * 2 * sizeof *s->pos_yx))) {
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "%llu positions", (unsigned long long)dims[0]);
  } else if (H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, tmp) < 0) {
    rc = BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: read failed", s->path, POS_PATH);
  } else {
    if (dims[0] > s->nframes)
      fprintf(stderr, "beamd-ptycho: warning: file %s dataset %s: %llu positions for %llu "
              "frames; the first %llu are used\n", s->path, POS_PATH,
              (unsigned long long)dims[0], (unsigned long long)s->nframes,
              (unsigned long long)s->nframes);
    for (uint64_t i = 0; i < s->nframes && rc == 0; i++) {
      double x = tmp[i * dims[1]] * f, y = tmp[i * dims[1] + 1] * f;
      if (!isfinite(x) || !isfinite(y))
        rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: position %llu is not finite "
                       "(x %g, y %g)", s->path, POS_PATH, (unsigned long long)i, x, y);
      s->pos_yx[2 * i] = y;
      s->pos_yx[2 * i + 1] = x;
    }
  }
  free(tmp);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}

static int load_mask(pt_scan_t *s, beam_diag_t *d) {
  static const char *paths[] = {DET "pixel_mask", DET "detectorSpecific/pixel_mask"};
  for (size_t i = 0; i < 2; i++) {
    if (!exists(s->file, paths[i]))
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
  if (rc == 0) {
    if ((q = quantity(s, BEAM "incident_energy", Q_ENERGY, 1, &v, d)) == 0)
      q = quantity(s, DET "detectorSpecific/photon_energy", Q_ENERGY, 1, &v, d);
    if (q == 1)
      s->energy = v;
    else if (q == 0 && (q = quantity(s, BEAM "incident_wavelength", Q_LENGTH, 1e-10, &v, d)) == 1)
      s->energy = v > 0 ? HC_EV_M / v : 0;
    if (q < 0)
      rc = q;
  }
  if (rc == 0) {
    if ((q = quantity(s, DET "detector_distance", Q_LENGTH, 1, &v, d)) == 0)
      q = quantity(s, DET "distance", Q_LENGTH, 1, &v, d);
    if (q == 1)
      s->distance = v;
    if (q < 0)
      rc = q;
  }
  if (rc == 0 && (q = quantity(s, DET "x_pixel_size", Q_LENGTH, 1, &v, d)) != 0) {
    if (q < 0)
      rc = q;
    else
      s->pixel = v;
  }
  if (rc == 0) {
    int a = quantity(s, DET "beam_center_x", Q_PIXELS, 1, &x, d);
    int b = a < 0 ? a : quantity(s, DET "beam_center_y", Q_PIXELS, 1, &y, d);
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
  const char *dset = NULL;
  char *colon = strrchr(path, ':');
  if (colon && colon[1] == '/') {
    *colon = '\0';
    dset = colon + 1;
  }
  *out = NULL;
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    H5Eclear2(H5E_DEFAULT);
    return BEAM_DIAG(d, BEAM_EIO, "file %s: cannot open as HDF5", path);
  }
  hid_t ds = -1;
  if (dset) {
    ds = exists(f, dset) ? H5Dopen2(f, dset, H5P_DEFAULT) : -1;
  } else {
    for (size_t i = 0; i < ncands && ds < 0; i++)
      if (exists(f, cands[i]) && (ds = H5Dopen2(f, cands[i], H5P_DEFAULT)) >= 0)
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
  hid_t sp = H5Dget_space(ds), t = H5Dget_type(ds), mt = -1;
  int nd = H5Sget_simple_extent_ndims(sp), rc = 0;
  int cplx = H5Tget_class(t) == H5T_COMPOUND && H5Tget_nmembers(t) == 2;
  hsize_t dims[3] = {1, 1, 1};
  if ((nd != 2 && nd != 3) ||
      !(cplx || H5Tget_class(t) == H5T_FLOAT || H5Tget_class(t) == H5T_INTEGER)) {
    rc = BEAM_DIAG(d, BEAM_EINVAL, "file %s dataset %s: expected a 2-D or 3-D complex or real "
                   "array", path, dset);
  } else {
    H5Sget_simple_extent_dims(sp, nd == 3 ? dims : dims + 1, NULL);
    size_t np = (size_t)(dims[0] * dims[1] * dims[2]);
    double *v = malloc(np * 2 * sizeof *v);
    if (!v) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "file %s dataset %s: %zu values", path, dset, np);
    } else {
      if (cplx) {
        mt = H5Tcreate(H5T_COMPOUND, 2 * sizeof(double));
        char *n0 = H5Tget_member_name(t, 0), *n1 = H5Tget_member_name(t, 1);
        H5Tinsert(mt, n0, 0, H5T_NATIVE_DOUBLE);
        H5Tinsert(mt, n1, sizeof(double), H5T_NATIVE_DOUBLE);
        H5free_memory(n0);
        H5free_memory(n1);
      }
      if (H5Dread(ds, cplx ? mt : H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0) {
        rc = BEAM_DIAG(d, BEAM_EIO, "file %s dataset %s: read failed", path, dset);
      } else {
        if (!cplx) /* real values: spread into (re, 0) from the back */
          for (size_t i = np; i-- > 0;) {
            v[2 * i] = v[i];
            v[2 * i + 1] = 0.0;
          }
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
  if (mt >= 0)
    H5Tclose(mt);
  H5Tclose(t);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  H5Eclear2(H5E_DEFAULT);
  return rc;
}
