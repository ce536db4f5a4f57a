/* Test harness for stage ops (see stage_harness.h). Test-only code: it
 * allocates per emitted frame on purpose, so ASan sees each frame's exact
 * bounds. */
#include "tests/common/stage_harness.h"

#include "gpu/gpu.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

static const char *H_FILE = "test.yaml";

/* ---- config trees ---- */

beam_cnode_t *bh_map(void) { return beam_cnode_new(BEAM_CN_MAP, H_FILE, 1, 1); }
beam_cnode_t *bh_seq(void) { return beam_cnode_new(BEAM_CN_SEQ, H_FILE, 1, 1); }

beam_cnode_t *bh_scalar(const char *text) {
  beam_cnode_t *n = beam_cnode_new(BEAM_CN_SCALAR, H_FILE, 1, 1);
  BEAM_ASSERT(n);
  n->scalar = strdup(text);
  BEAM_ASSERT(n->scalar);
  return n;
}

void bh_put(beam_cnode_t *map, const char *key, beam_cnode_t *node) {
  BEAM_ASSERT(beam_cnode_map_add(map, key, 1, 1, node) == 0);
}

void bh_push(beam_cnode_t *seq, beam_cnode_t *node) { BEAM_ASSERT(beam_cnode_seq_add(seq, node) == 0); }

void bh_set(beam_cnode_t *map, const char *key, const char *text) {
  if (text[0] != '[') {
    bh_put(map, key, bh_scalar(text));
    return;
  }
  beam_cnode_t *seq = bh_seq();
  char buf[256];
  snprintf(buf, sizeof buf, "%s", text + 1);
  char *save = NULL;
  for (char *t = strtok_r(buf, ",] ", &save); t; t = strtok_r(NULL, ",] ", &save))
    bh_push(seq, bh_scalar(t));
  bh_put(map, key, seq);
}

beam_cnode_t *bh_stage_cfg(const char *kind) {
  beam_cnode_t *m = bh_map();
  bh_set(m, "name", "st");
  bh_set(m, "kind", kind);
  return m;
}

void bh_set_kv(beam_cnode_t *c, const char *const *kv, const char *labels, const char *dir) {
  for (size_t i = 0; kv[i]; i += 2) {
    const char *v = kv[i + 1];
    if (!strcmp(v, "@labels")) {
      beam_cnode_t *m = bh_map();
      bh_set(m, "file", labels);
      bh_put(c, kv[i], m);
    } else if (!strcmp(v, "@rect")) {
      beam_cnode_t *roi = bh_map(), *seq = bh_seq();
      bh_set(roi, "name", "a");
      bh_set(roi, "shape", "rect");
      bh_set(roi, "rect", "[0, 0, 8, 8]");
      bh_push(seq, roi);
      bh_put(c, kv[i], seq);
    } else {
      bh_set(c, kv[i], !strcmp(v, "@dir") ? dir : v);
    }
  }
}

int bh_validate(beam_cnode_t *cfg, const beam_param_t *params, char *msg, size_t len) {
  beam_cfg_errs_t errs = {0};
  /* Stage tests exercise init on missing files: the load-time check would
   * refuse them first. */
  int n = beam_cfg_validate_flags(cfg, params, "stage \"st\"", &errs, BEAM_CFG_NO_FILE_CHECK);
  if (msg && len)
    snprintf(msg, len, "%s", errs.n ? errs.msgs[0] : "");
  for (size_t i = 0; i < errs.n && !msg; i++)
    fprintf(stderr, "%s\n", errs.msgs[i]);
  beam_cfg_errs_free(&errs);
  return n;
}

/* ---- emitter ---- */

static size_t desc_bytes(const beam_outdesc_t *o) {
  size_t nb = beam_dtype_size(o->dtype);
  for (uint32_t i = 0; i < o->ndim; i++)
    nb *= o->shape[i];
  return nb;
}

static beam_frame_t *h_get(void *ctx, unsigned out) {
  bh_t *h = ctx;
  if (out >= h->st.nouts)
    return NULL;
  const beam_outdesc_t *o = &h->st.outs[out];
  /* Out of memory (the allocation-failure sweep): no slot, as a graph
   * that is shutting down answers; stages must cope with NULL. */
  beam_frame_t *f = calloc(1, sizeof *f);
  if (!f)
    return NULL;
  f->cap = desc_bytes(o);
  f->data = malloc(f->cap ? f->cap : 1);
  if (!f->data) {
    free(f);
    return NULL;
  }
  memset(f->data, 0xA5, f->cap); /* garbage a stage must overwrite */
  if (h->cur) {
    beam_frame_copy_ident(f, h->cur);
    f->flags &= ~(uint32_t)BEAM_FLAG_META;
  } else {
    f->series_id = h->series.series_id;
  }
  f->dtype = o->dtype;
  f->ndim = o->ndim;
  memcpy(f->shape, o->shape, sizeof f->shape);
  f->nbytes = f->cap;
  /* Remember which output, in the refs field that harness frames never use. */
  atomic_store(&f->refs, (int)out);
  h->outstanding++;
  return f;
}

static void h_put(void *ctx, beam_frame_t *f) {
  bh_t *h = ctx;
  size_t nb = beam_dtype_size(f->dtype);
  for (uint32_t i = 0; i < f->ndim; i++)
    nb *= f->shape[i];
  BEAM_ASSERT(nb <= f->cap);
  f->nbytes = nb;
  if (h->nres == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 16;
    beam_frame_t **r = realloc(h->res, cap * sizeof *r);
    if (r)
      h->res = r;
    unsigned *ro = r ? realloc(h->res_out, cap * sizeof *ro) : NULL;
    if (ro)
      h->res_out = ro;
    if (!r || !ro) { /* out of memory (the sweep): the result is lost */
      h->outstanding--;
      bh_frame_free(f);
      return;
    }
    h->cap = cap;
  }
  h->res_out[h->nres] = (unsigned)atomic_load(&f->refs);
  h->res[h->nres++] = f;
  h->outstanding--;
}

static void h_drop(void *ctx, beam_frame_t *f) {
  bh_t *h = ctx;
  bh_frame_free(f);
  h->outstanding--;
}

/* ---- life cycle ---- */

bh_t *bh_make(beam_cnode_t *cfg, const beam_param_t *params, const beam_stage_ops_t *ops,
              int expect_rc, const char *expect_msg) {
  char msg[512];
  if (bh_validate(cfg, params, msg, sizeof msg) != 0)
    fail_msg("validate: %s", msg);
  bh_t *h;
  beam_diag_t d = {0};
  int rc = bh_new(&h, ops, cfg, &d);
  if (rc != expect_rc)
    fail_msg("init rc %d (%s), want %d", rc, d.msg, expect_rc);
  if (expect_msg && !strstr(d.msg, expect_msg))
    fail_msg("message \"%s\" lacks \"%s\"", d.msg, expect_msg);
  return h;
}

beam_frame_t *bh_last(bh_t *h, unsigned out) {
  for (size_t i = h->nres; i-- > 0;)
    if (h->res_out[i] == out)
      return h->res[i];
  return NULL;
}

bh_t *bh_alloc(const beam_stage_ops_t *ops, beam_cnode_t *cfg) {
  bh_t *h = calloc(1, sizeof *h);
  BEAM_ASSERT(h);
  h->cfg = cfg;
  h->st.ops = ops;
  snprintf(h->st.name, sizeof h->st.name, "st");
  h->st.cfg = cfg;
  h->emit.ctx = h;
  h->emit.get = h_get;
  h->emit.put = h_put;
  h->emit.drop = h_drop;
  return h;
}

int bh_init(bh_t *h, beam_diag_t *d) {
  h->inited = 1;
  return h->st.ops->init(&h->st, d);
}

int bh_series(bh_t *h, beam_frame_t *f, int n, beam_diag_t *d) {
  int rc = bh_init(h, d);
  if (rc == 0)
    rc = bh_start(h, f->dtype, f->ndim, f->shape, d);
  if (rc < 0)
    return rc;
  for (int j = 0; j < n && rc == 0; j++) {
    f->frame_id = (uint64_t)j;
    rc = bh_process(h, f);
  }
  if (rc == 0)
    rc = bh_end(h);
  if (rc < 0)
    *d = h->st.diag;
  return rc;
}

int bh_new(bh_t **out, const beam_stage_ops_t *ops, beam_cnode_t *cfg, beam_diag_t *d) {
  *out = bh_alloc(ops, cfg);
  return bh_init(*out, d);
}

int bh_start(bh_t *h, beam_dtype_t dt, uint32_t ndim, const uint32_t *shape, beam_diag_t *d) {
  beam_indesc_t in;
  memset(&in, 0, sizeof in);
  in.dtype = dt;
  in.ndim = ndim;
  memcpy(in.shape, shape, ndim * sizeof *shape);
  h->series.series_id++;
  h->series.dtype = dt;
  h->series.ndim = ndim;
  memcpy(h->series.shape, shape, ndim * sizeof *shape);
  h->st.nouts = 0;
  return h->st.ops->start(&h->st, &h->series, &in, d);
}

int bh_process(bh_t *h, const beam_frame_t *in) {
  h->cur = in;
  beam_diag_clear(&h->st.diag);
  int rc = h->st.ops->process(&h->st, in, &h->emit);
  h->cur = NULL;
  BEAM_ASSERT(h->outstanding == 0); /* every get was put or dropped */
  return rc;
}

int bh_end(bh_t *h) {
  h->cur = NULL;
  beam_diag_clear(&h->st.diag);
  int rc = h->st.ops->end(&h->st, &h->emit);
  BEAM_ASSERT(h->outstanding == 0);
  return rc;
}

void bh_clear(bh_t *h) {
  for (size_t i = 0; i < h->nres; i++)
    bh_frame_free(h->res[i]);
  h->nres = 0;
}

void bh_free(bh_t **hp) {
  bh_t *h = *hp;
  if (!h)
    return;
  if (h->inited && h->st.ops->destroy) {
    h->st.ops->destroy(&h->st);
    h->st.ops->destroy(&h->st); /* destroy must be idempotent */
  }
  bh_clear(h);
  free(h->res);
  free(h->res_out);
  beam_cnode_free(h->cfg);
  free(h);
  *hp = NULL;
}

/* ---- frames ---- */

beam_frame_t *bh_frame_new(beam_dtype_t dt, uint32_t ndim, const uint32_t *shape, uint64_t frame_id) {
  beam_frame_t *f = calloc(1, sizeof *f);
  BEAM_ASSERT(f);
  f->dtype = dt;
  f->ndim = ndim;
  memcpy(f->shape, shape, ndim * sizeof *shape);
  f->nbytes = f->cap = beam_frame_elems(f) * beam_dtype_size(dt);
  f->data = calloc(1, f->cap ? f->cap : 1);
  BEAM_ASSERT(f->data);
  f->frame_id = frame_id;
  f->series_id = 1;
  return f;
}

void bh_frame_free(beam_frame_t *f) {
  if (!f)
    return;
  free(f->data);
  free(f);
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void bh_frame_fill(beam_frame_t *f, uint64_t seed, double maxval) {
  size_t n = beam_frame_elems(f);
  for (size_t i = 0; i < n; i++) {
    double u = (double)(splitmix(&seed) >> 11) / 9007199254740992.0; /* [0, 1) */
    double v = u * maxval;
    switch (f->dtype) {
#define FILL(T, DT) case DT: ((T *)f->data)[i] = (T)(DT == BEAM_DT_F32 || DT == BEAM_DT_F64 ? v : (double)(uint64_t)(u * (maxval + 1))); break;
      FILL(uint8_t, BEAM_DT_U8) FILL(uint16_t, BEAM_DT_U16) FILL(uint32_t, BEAM_DT_U32)
      FILL(uint64_t, BEAM_DT_U64) FILL(int8_t, BEAM_DT_I8) FILL(int16_t, BEAM_DT_I16)
      FILL(int32_t, BEAM_DT_I32) FILL(int64_t, BEAM_DT_I64) FILL(float, BEAM_DT_F32)
      FILL(double, BEAM_DT_F64)
#undef FILL
    default: break;
    }
  }
}

int bh_gpu_available(void) {
  char why[256] = "";
  if (beam_gpu_count(why, sizeof why) > 0) {
    char desc[256];
    beam_gpu_describe(desc, sizeof desc);
    fprintf(stderr, "# GPU: %s\n", desc);
    return 1;
  }
  const char *req = getenv("BEAM_REQUIRE_GPU");
  if (req && strcmp(req, "1") == 0) {
    fprintf(stderr, "BEAM_REQUIRE_GPU=1 but no GPU: %s\n", why);
    abort();
  }
  fprintf(stderr, "# skipped: no GPU (%s)\n", why);
  return 0;
}

size_t bh_bits_differ(const void *a, const void *b, size_t nbytes) {
  const unsigned char *x = a, *y = b;
  size_t n = 0;
  for (size_t i = 0; i < nbytes; i++)
    n += x[i] != y[i];
  return n;
}

int bh_write_npy(const char *path, const char *descr, uint32_t ndim, const uint32_t *shape,
                 const void *data, size_t nbytes) {
  char dict[256], shp[96] = "";
  size_t o = 0;
  for (uint32_t i = 0; i < ndim; i++)
    o += (size_t)snprintf(shp + o, sizeof shp - o, "%u,%s", shape[i], i + 1 < ndim ? " " : "");
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shp);
  size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
  size_t hlen = (size_t)n + pad + 1;
  FILE *fp = fopen(path, "wb");
  if (!fp)
    return -1;
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                           (unsigned char)(hlen >> 8)};
  fwrite(pre, 1, 10, fp);
  fwrite(dict, 1, (size_t)n, fp);
  for (size_t i = 0; i < pad; i++)
    fputc(' ', fp);
  fputc('\n', fp);
  fwrite(data, 1, nbytes, fp);
  return fclose(fp) == 0 ? 0 : -1;
}

static char tmpdir[64];
static void rm_tmpdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmpdir);
}

const char *bh_tmpdir(void) {
  if (!tmpdir[0]) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/beam-test-XXXXXX");
    BEAM_ASSERT(mkdtemp(tmpdir));
    atexit(rm_tmpdir);
  }
  return tmpdir;
}
