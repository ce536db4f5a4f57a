/* HDF5 helpers shared by the `record` stage and beamd-record (see
 * h5util.h). Attributes are written as h5py reads them without surprises:
 * strings variable-length UTF-8 (h5py returns str), booleans as the int8
 * enum h5py uses for numpy bool. */
#include "daemon/h5util.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void beam_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

typedef struct walk_s {
  char inner[512];
  char sys[256];
  int err;
} walk_t;

static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *ctx) {
  walk_t *w = ctx;
  (void)n;
  if (!e->desc || !e->desc[0])
    return 0;
  /* Walking downward, the last entry seen is the innermost one. */
  snprintf(w->inner, sizeof w->inner, "%s (in %s)", e->desc, e->func_name ? e->func_name : "?");
  /* The sec2 driver reports "..., errno = 28, error message = 'No space
   * left on device', ...": keep the system part. */
  const char *en = strstr(e->desc, "errno = ");
  const char *em = strstr(e->desc, "error message = '");
  if (en && !w->err)
    w->err = atoi(en + 8);
  if (em && !w->sys[0]) {
    em += 17;
    const char *q = strchr(em, '\'');
    size_t len = q ? (size_t)(q - em) : strlen(em);
    snprintf(w->sys, sizeof w->sys, "%.*s", (int)len, em);
  }
  return 0;
}

const char *beam_h5_reason(char *buf, size_t cap, int *errno_out) {
  walk_t w;
  memset(&w, 0, sizeof w);
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &w);
  H5Eclear2(H5E_DEFAULT);
  if (w.sys[0])
    snprintf(buf, cap, "%s", w.sys);
  else if (w.inner[0])
    snprintf(buf, cap, "%s", w.inner);
  else
    snprintf(buf, cap, "no HDF5 error detail");
  if (errno_out)
    *errno_out = w.err;
  return buf;
}

static hid_t complex_type(hid_t part, size_t psize) {
  hid_t t = H5Tcreate(H5T_COMPOUND, 2 * psize);
  if (t < 0)
    return -1;
  if (H5Tinsert(t, "r", 0, part) < 0 || H5Tinsert(t, "i", psize, part) < 0) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

hid_t beam_h5_type(beam_dtype_t dt) {
  switch (dt) {
  case BEAM_DT_U8: return H5Tcopy(H5T_STD_U8LE);
  case BEAM_DT_U16: return H5Tcopy(H5T_STD_U16LE);
  case BEAM_DT_U32: return H5Tcopy(H5T_STD_U32LE);
  case BEAM_DT_U64: return H5Tcopy(H5T_STD_U64LE);
  case BEAM_DT_I8: return H5Tcopy(H5T_STD_I8LE);
  case BEAM_DT_I16: return H5Tcopy(H5T_STD_I16LE);
  case BEAM_DT_I32: return H5Tcopy(H5T_STD_I32LE);
  case BEAM_DT_I64: return H5Tcopy(H5T_STD_I64LE);
  case BEAM_DT_F32: return H5Tcopy(H5T_IEEE_F32LE);
  case BEAM_DT_F64: return H5Tcopy(H5T_IEEE_F64LE);
  case BEAM_DT_C64: return complex_type(H5T_IEEE_F32LE, 4);
  case BEAM_DT_C128: return complex_type(H5T_IEEE_F64LE, 8);
  default: return -1;
  }
}

/* Creates (replacing any existing one) and writes an attribute. */
static int put_attr(hid_t obj, const char *name, hid_t type, hid_t space, const void *buf) {
  if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0)
    return -1;
  hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0)
    return -1;
  int rc = H5Awrite(a, type, buf) < 0 ? -1 : 0;
  H5Aclose(a);
  return rc;
}

static hid_t vlen_str(void) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t >= 0 && (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0)) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

int beam_h5_attr_strs(hid_t obj, const char *name, const char *const *vals, size_t n) {
  hsize_t dim = n;
  hid_t t = vlen_str();
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  int rc = t >= 0 && sp >= 0 ? put_attr(obj, name, t, sp, vals) : -1;
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  return rc;
}

int beam_h5_attr_str(hid_t obj, const char *name, const char *val) {
  hid_t t = vlen_str();
  hid_t sp = H5Screate(H5S_SCALAR);
  const char *p = val ? val : "";
  int rc = t >= 0 && sp >= 0 ? put_attr(obj, name, t, sp, &p) : -1;
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  return rc;
}

int beam_h5_attr_strn(hid_t obj, const char *name, const char *val, size_t len) {
  char *s = malloc(len + 1);
  if (!s)
    return -1;
  memcpy(s, val, len);
  s[len] = '\0';
  int rc = beam_h5_attr_str(obj, name, s);
  free(s);
  return rc;
}

static int scalar_attr(hid_t obj, const char *name, hid_t type, const void *v) {
  hid_t sp = H5Screate(H5S_SCALAR);
  int rc = sp >= 0 ? put_attr(obj, name, type, sp, v) : -1;
  if (sp >= 0) H5Sclose(sp);
  return rc;
}

int beam_h5_attr_i64(hid_t obj, const char *name, int64_t v) {
  return scalar_attr(obj, name, H5T_NATIVE_INT64, &v);
}
int beam_h5_attr_u64(hid_t obj, const char *name, uint64_t v) {
  return scalar_attr(obj, name, H5T_NATIVE_UINT64, &v);
}
int beam_h5_attr_f64(hid_t obj, const char *name, double v) {
  return scalar_attr(obj, name, H5T_NATIVE_DOUBLE, &v);
}

int beam_h5_attr_bool(hid_t obj, const char *name, int v) {
  /* h5py's numpy-bool mapping: an enum over int8 with FALSE = 0, TRUE = 1. */
  hid_t t = H5Tenum_create(H5T_NATIVE_INT8);
  int8_t f = 0, tr = 1, val = v ? 1 : 0;
  int rc = -1;
  if (t >= 0 && H5Tenum_insert(t, "FALSE", &f) >= 0 && H5Tenum_insert(t, "TRUE", &tr) >= 0)
    rc = scalar_attr(obj, name, t, &val);
  if (t >= 0) H5Tclose(t);
  return rc;
}

int beam_h5_attr_u64s(hid_t obj, const char *name, const uint64_t *v, size_t n) {
  hsize_t dim = n;
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  int rc = sp >= 0 ? put_attr(obj, name, H5T_NATIVE_UINT64, sp, v) : -1;
  if (sp >= 0) H5Sclose(sp);
  return rc;
}

int beam_h5_attr_f64s(hid_t obj, const char *name, const double *v, size_t n) {
  if (n == 1)
    return beam_h5_attr_f64(obj, name, v[0]);
  hsize_t dim = n;
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  int rc = sp >= 0 ? put_attr(obj, name, H5T_NATIVE_DOUBLE, sp, v) : -1;
  if (sp >= 0) H5Sclose(sp);
  return rc;
}

hid_t beam_h5_group(hid_t loc, const char *path, const char *nx_class) {
  hid_t g = H5Gcreate2(loc, path, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g >= 0 && nx_class && beam_h5_attr_str(g, "NX_class", nx_class) < 0) {
    H5Gclose(g);
    return -1;
  }
  return g;
}

hid_t beam_h5_dataset(hid_t loc, const char *path, hid_t ft, hid_t mt, int nd,
                      const hsize_t *dims, const void *data, const char *units) {
  hid_t sp = nd ? H5Screate_simple(nd, dims, NULL) : H5Screate(H5S_SCALAR);
  if (sp < 0)
    return -1;
  hid_t ds = H5Dcreate2(loc, path, ft, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Sclose(sp);
  if (ds >= 0 && (H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0 ||
                  (units && beam_h5_attr_str(ds, "units", units) < 0))) {
    H5Dclose(ds);
    return -1;
  }
  return ds;
}

int beam_h5_scalar_f64(hid_t loc, const char *path, double v, const char *units) {
  hid_t ds = beam_h5_dataset(loc, path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 0, NULL, &v, units);
  if (ds < 0)
    return -1;
  H5Dclose(ds);
  return 0;
}

/* ---- readers ------------------------------------------------------------- */

int beam_h5_chunk_size(hid_t dset, const hsize_t *off, hsize_t *n, char *why, size_t wl) {
  unsigned mask = 0;
  haddr_t addr = HADDR_UNDEF;
  *n = 0;
  if (H5Dget_chunk_storage_size(dset, off, n) >= 0 && *n > 0)
    return 1;
  H5Eclear2(H5E_DEFAULT);
  *n = 0;
  if (H5Dget_chunk_info_by_coord(dset, off, &mask, &addr, n) < 0) {
    char r[512];
    beam_h5_reason(r, sizeof r, NULL);
    if (why && wl)
      snprintf(why, wl, "%s", r);
    return -1;
  }
  return addr != HADDR_UNDEF && *n > 0;
}

int beam_h5_exists(hid_t loc, const char *path) {
  char buf[512];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof buf)
    return 0;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0')
      continue;
    char c = buf[i];
    buf[i] = '\0';
    htri_t e = H5Lexists(loc, buf, H5P_DEFAULT);
    buf[i] = c;
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return 0;
    }
  }
  return 1;
}

const char *beam_h5_split_spec(char *spec) {
  char *colon = strrchr(spec, ':');
  if (!colon || colon[1] != '/')
    return NULL;
  *colon = '\0';
  return colon + 1;
}

int beam_h5_cplx_kind(hid_t ds) {
  hid_t t = H5Dget_type(ds);
  if (t < 0)
    return 0;
  H5T_class_t c = H5Tget_class(t);
  int k = c == H5T_COMPOUND && H5Tget_nmembers(t) == 2 ? 2
        : c == H5T_FLOAT || c == H5T_INTEGER          ? 1
                                                      : 0;
  H5Tclose(t);
  return k;
}

int beam_h5_read_cplx(hid_t ds, double *out) {
  hid_t t = H5Dget_type(ds), sp = H5Dget_space(ds), mt = -1;
  hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
  int cplx = t >= 0 && H5Tget_class(t) == H5T_COMPOUND && H5Tget_nmembers(t) == 2;
  if (cplx) {
    /* Member names as stored: h5py writes r, i, other writers real, imag. */
    mt = H5Tcreate(H5T_COMPOUND, 2 * sizeof(double));
    char *n0 = H5Tget_member_name(t, 0), *n1 = H5Tget_member_name(t, 1);
    H5Tinsert(mt, n0, 0, H5T_NATIVE_DOUBLE);
    H5Tinsert(mt, n1, sizeof(double), H5T_NATIVE_DOUBLE);
    H5free_memory(n0);
    H5free_memory(n1);
  }
  int rc = -1;
  if (np >= 0 && H5Dread(ds, cplx ? mt : H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                         out) >= 0) {
    rc = 0;
    if (!cplx) /* real values: spread into (re, 0) from the back */
      for (size_t i = (size_t)np; i-- > 0;) {
        out[2 * i] = out[i];
        out[2 * i + 1] = 0.0;
      }
  }
  if (mt >= 0) H5Tclose(mt);
  if (t >= 0) H5Tclose(t);
  if (sp >= 0) H5Sclose(sp);
  return rc;
}

static herr_t dsets_cb(hid_t o, const char *name, const H5O_info_t *info, void *ctx) {
  beam_h5_dsets_t *f = ctx;
  if (info->type != H5O_TYPE_DATASET)
    return 0;
  if (f->skip && !strncmp(name, f->skip, strlen(f->skip)))
    return 0;
  hid_t ds = H5Dopen2(o, name, H5P_DEFAULT);
  if (ds < 0) {
    H5Eclear2(H5E_DEFAULT);
    return 0;
  }
  hid_t sp = H5Dget_space(ds);
  int nd = H5Sget_simple_extent_ndims(sp);
  hsize_t dims[8] = {0};
  if (nd > 0 && nd <= 8)
    H5Sget_simple_extent_dims(sp, dims, NULL);
  H5Sclose(sp);
  H5Dclose(ds);
  size_t l = strlen(f->list);
  char shape[96] = "";
  for (int i = 0; i < nd && i < 8; i++) {
    size_t sl = strlen(shape);
    snprintf(shape + sl, sizeof shape - sl, "%s%llu", i ? "x" : "", (unsigned long long)dims[i]);
  }
  if (f->n < 12)
    snprintf(f->list + l, sizeof f->list - l, "%s/%s (%s)", f->n ? ", " : "", name,
             nd ? shape : "scalar");
  f->n++;
  if (nd == 3) {
    if (!f->n3d)
      snprintf(f->first3d, sizeof f->first3d, "/%s", name);
    f->n3d++;
  }
  return 0;
}

void beam_h5_find_dsets(hid_t f, beam_h5_dsets_t *r) {
  r->first3d[0] = r->list[0] = '\0';
  r->n3d = r->n = 0;
  if (H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, dsets_cb, r) < 0)
    H5Eclear2(H5E_DEFAULT);
}

typedef struct links_s {
  char **names;
  size_t n, cap;
} links_t;

static herr_t links_cb(hid_t g, const char *name, const H5L_info_t *info, void *ctx) {
  links_t *l = ctx;
  (void)g;
  (void)info;
  if (strncmp(name, "data_", 5) || strlen(name) != 11 || strspn(name + 5, "0123456789") != 6)
    return 0;
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 16;
    char **nn = realloc(l->names, nc * sizeof *nn);
    if (!nn)
      return -1;
    l->names = nn;
    l->cap = nc;
  }
  if (!(l->names[l->n] = strdup(name)))
    return -1;
  l->n++;
  return 0;
}

void beam_h5_data_links(hid_t f, char ***names, size_t *n) {
  links_t l = {0};
  if (beam_h5_exists(f, "/entry/data")) {
    hid_t g = H5Gopen2(f, "/entry/data", H5P_DEFAULT);
    if (g >= 0) {
      if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, links_cb, &l) < 0)
        H5Eclear2(H5E_DEFAULT);
      H5Gclose(g);
    }
    H5Eclear2(H5E_DEFAULT);
  }
  *names = l.names;
  *n = l.n;
}

void beam_h5_names_free(char **names, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
}

/* 'i' all integers, 'f' numbers, 's' strings, 0 otherwise (or empty). */
static char array_kind(const json_t *a) {
  size_t n = json_array_size(a), i;
  char k = 0;
  json_t *v;
  if (n == 0)
    return 0;
  json_array_foreach(a, i, v) {
    char vk = json_is_integer(v) ? 'i' : json_is_real(v) ? 'f' : json_is_string(v) ? 's' : 0;
    if (!vk)
      return 0;
    if (!k)
      k = vk;
    else if (k != vk) {
      if ((k == 'i' && vk == 'f') || (k == 'f' && vk == 'i'))
        k = 'f';
      else
        return 0;
    }
  }
  return k;
}

static int array_attr(hid_t obj, const char *name, const json_t *a, char kind) {
  size_t n = json_array_size(a), i;
  json_t *v;
  int rc = -1;
  if (kind == 's') {
    const char **s = malloc(n * sizeof *s);
    if (!s)
      return -1;
    json_array_foreach(a, i, v) s[i] = json_string_value(v);
    rc = beam_h5_attr_strs(obj, name, s, n);
    free(s);
    return rc;
  }
  hsize_t dim = n;
  hid_t sp = H5Screate_simple(1, &dim, NULL);
  if (sp < 0)
    return -1;
  if (kind == 'i') {
    int64_t *b = malloc(n * sizeof *b);
    if (b) {
      json_array_foreach(a, i, v) b[i] = (int64_t)json_integer_value(v);
      rc = put_attr(obj, name, H5T_NATIVE_INT64, sp, b);
      free(b);
    }
  } else {
    double *b = malloc(n * sizeof *b);
    if (b) {
      json_array_foreach(a, i, v) b[i] = json_number_value(v);
      rc = put_attr(obj, name, H5T_NATIVE_DOUBLE, sp, b);
      free(b);
    }
  }
  H5Sclose(sp);
  return rc;
}

int beam_h5_attrs_from_json(hid_t obj, const char *json, size_t len, int skip_existing,
                            char *msg, size_t cap) {
  json_error_t je;
  json_t *root = json_loadb(json, len, 0, &je);
  if (!root || !json_is_object(root)) {
    snprintf(msg, cap, "metadata is not a JSON object%s%s", root ? "" : ": ", root ? "" : je.text);
    json_decref(root);
    return -1;
  }
  const char *key;
  json_t *v;
  int n = 0;
  json_object_foreach(root, key, v) {
    if (!key[0] || strchr(key, '/') || (skip_existing && H5Aexists(obj, key) > 0))
      continue; /* HDF5 cannot name an attribute "" and '/' reads badly */
    int rc;
    char kind;
    if (json_is_string(v))
      rc = beam_h5_attr_str(obj, key, json_string_value(v));
    else if (json_is_integer(v))
      rc = beam_h5_attr_i64(obj, key, (int64_t)json_integer_value(v));
    else if (json_is_real(v))
      rc = beam_h5_attr_f64(obj, key, json_real_value(v));
    else if (json_is_boolean(v))
      rc = beam_h5_attr_bool(obj, key, json_is_true(v));
    else if (json_is_array(v) && (kind = array_kind(v)) != 0)
      rc = array_attr(obj, key, v, kind);
    else {
      char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      rc = s ? beam_h5_attr_str(obj, key, s) : -1;
      free(s);
    }
    if (rc < 0) {
      snprintf(msg, cap, "cannot write attribute \"%s\"", key);
      json_decref(root);
      return -1;
    }
    n++;
  }
  json_decref(root);
  return n;
}

/* Writes rows row0 .. row0+k-1 of ds (extent (row0 + k, *ext)) from buf of
 * k rows of shape; the rest of each row, where shape is smaller than ext,
 * keeps the fill value. */
int beam_h5_append_rows(hid_t ds, uint64_t row0, uint64_t k, hid_t memtype, const void *buf,
                        unsigned ndim, const hsize_t *ext, const uint32_t *shape) {
  hsize_t dims[BEAM_MAX_NDIM + 1], start[BEAM_MAX_NDIM + 1] = {0}, count[BEAM_MAX_NDIM + 1];
  dims[0] = row0 + k;
  start[0] = row0;
  count[0] = k;
  for (unsigned i = 0; i < ndim; i++) {
    dims[i + 1] = ext[i];
    count[i + 1] = shape[i];
  }
  if (H5Dset_extent(ds, dims) < 0)
    return -1;
  hid_t fs = H5Dget_space(ds), ms = H5Screate_simple((int)ndim + 1, count, NULL);
  int rc = fs >= 0 && ms >= 0 &&
                   H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0 &&
                   H5Dwrite(ds, memtype, ms, fs, H5P_DEFAULT, buf) >= 0
               ? 0
               : -1;
  /* H5Sclose would clear the error stack that says why the write failed. */
  hid_t es = rc < 0 ? H5Eget_current_stack() : -1;
  if (ms >= 0) H5Sclose(ms);
  if (fs >= 0) H5Sclose(fs);
  if (es >= 0)
    H5Eset_current_stack(es);
  return rc;
}
