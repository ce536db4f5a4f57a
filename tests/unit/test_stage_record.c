/* The `record` stage driven through its ops by the stage harness, files read
 * back with the HDF5 C API: frames bit-exact through the 32008 filter, stored
 * bitshuffle-LZ4 chunks decodable by our own beam_codec_decode, raw chunks of
 * several frames, the .partial name of an incomplete series, and the errors
 * at init. Pass-through: frames still bitshuffle-LZ4 from the wire are
 * stored as they came (never decoded), everything else, and every chunk that
 * would not decode, takes the decode + encode path, also while another
 * thread decodes the same frame. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <hdf5.h>
#include <lz4.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/h5util.h"
#include "daemon/stage_record.h"
#include "tests/common/stage_harness.h"

static const char *g_check; /* record's check key for the next new_stage, NULL = default */

static int new_stage(bh_t **h, const char *dir, const char *compress, const char *chunk,
                     const char *prefix, beam_diag_t *d) {
  beam_cnode_t *cfg = bh_stage_cfg("record");
  if (g_check)
    bh_set(cfg, "check", g_check);
  bh_set(cfg, "dir", dir);
  if (compress)
    bh_set(cfg, "compress", compress);
  if (chunk)
    bh_set(cfg, "chunk_frames", chunk);
  if (prefix)
    bh_set(cfg, "prefix", prefix);
  assert_int_equal(bh_validate(cfg, beam_record_params, NULL, 0), 0);
  return bh_new(h, &beam_record_cpu_ops, cfg, d);
}

static char *path_of(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", bh_tmpdir(), name);
  return buf;
}

static uint64_t attr_u64(hid_t obj, const char *name) {
  uint64_t v = 0;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  assert_true(a >= 0);
  assert_true(H5Aread(a, H5T_NATIVE_UINT64, &v) >= 0);
  H5Aclose(a);
  return v;
}

static int attr_bool(hid_t obj, const char *name) {
  int8_t v = -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  assert_true(a >= 0);
  hid_t t = H5Aget_type(a);
  assert_true(H5Aread(a, t, &v) >= 0);
  H5Tclose(t);
  H5Aclose(a);
  return v;
}

/* Records nframes of 2-D frames, returns them (caller frees). */
static beam_frame_t **record(bh_t *h, beam_dtype_t dt, const uint32_t *shape, unsigned n) {
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, shape, &d), 0);
  assert_int_equal(h->st.nouts, 0);
  beam_frame_t **fr = calloc(n, sizeof *fr);
  for (unsigned i = 0; i < n; i++) {
    fr[i] = bh_frame_new(dt, 2, shape, 100 + i);
    fr[i]->series_id = h->series.series_id;
    fr[i]->t_acq_ns = 5000 + i;
    bh_frame_fill(fr[i], 17 + i, i % 2 ? 4000.0 : 30.0); /* some compress well, some not */
    int rc = bh_process(h, fr[i]);
    if (rc < 0)
      print_error("process: %s\n", h->st.diag.msg);
    assert_int_equal(rc, 0);
  }
  return fr;
}

/* Reads the file back and compares it with fr[0..n) bit for bit. With bslz4
 * and one frame per chunk, each stored chunk is also decoded by our own
 * beam_codec_decode. */
static void check_file_cf(const char *path, beam_frame_t **fr, unsigned n, int bslz4, unsigned cf) {
  beam_h5_quiet();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t ds = H5Dopen2(f, "/entry/data/data", H5P_DEFAULT);
  assert_true(ds >= 0);
  hid_t sp = H5Dget_space(ds);
  hsize_t dims[3];
  assert_int_equal(H5Sget_simple_extent_ndims(sp), 3);
  H5Sget_simple_extent_dims(sp, dims, NULL);
  H5Sclose(sp);
  assert_int_equal(dims[0], n);
  assert_int_equal(dims[1], fr[0]->shape[0]);
  assert_int_equal(dims[2], fr[0]->shape[1]);
  size_t fb = fr[0]->nbytes;
  uint8_t *all = malloc(fb * n);
  hid_t mt = H5Dget_type(ds);
  /* Through the HDF5 filter pipeline (the Debian 32008 plugin for bslz4). */
  assert_true(H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, all) >= 0);
  for (unsigned i = 0; i < n; i++)
    assert_int_equal(bh_bits_differ(all + i * fb, fr[i]->data, fb), 0);
  hid_t pl = H5Dget_create_plist(ds);
  int nf = H5Pget_nfilters(pl);
  assert_int_equal(nf, bslz4 ? 1 : 0);
  if (bslz4 && cf == 1) {
    unsigned flags, cd[8];
    size_t ncd = 8;
    char name[64];
    assert_int_equal(H5Pget_filter2(pl, 0, &flags, &ncd, cd, sizeof name, name, NULL),
                     BEAM_H5_BSLZ4_FILTER);
    /* Each stored chunk is exactly our codec's framing. */
    uint8_t *chunk = malloc(beam_codec_bound(BEAM_CODEC_BSLZ4, fb, beam_dtype_size(fr[0]->dtype)));
    uint8_t *raw = malloc(fb), *scratch = malloc(fb);
    for (unsigned i = 0; i < n; i++) {
      hsize_t off[3] = {i, 0, 0}, csize = 0;
      uint32_t fm = 1;
      assert_true(H5Dget_chunk_storage_size(ds, off, &csize) >= 0);
      assert_true(csize > 12);
      assert_true(H5Dread_chunk(ds, H5P_DEFAULT, off, &fm, chunk) >= 0);
      assert_int_equal(fm, 0);
      const char *why = NULL;
      int rc = beam_codec_decode(BEAM_CODEC_BSLZ4, chunk, csize, raw, fb,
                                 beam_dtype_size(fr[0]->dtype), scratch, &why);
      if (rc)
        print_error("chunk %u: %s\n", i, why);
      assert_int_equal(rc, 0);
      assert_int_equal(bh_bits_differ(raw, fr[i]->data, fb), 0);
    }
    free(chunk);
    free(raw);
    free(scratch);
  }
  H5Pclose(pl);
  H5Tclose(mt);
  H5Dclose(ds);
  free(all);
  uint64_t ids[64], tq[64];
  hid_t fid = H5Dopen2(f, "/entry/data/frame_id", H5P_DEFAULT);
  hid_t tqd = H5Dopen2(f, "/entry/data/t_acq_ns", H5P_DEFAULT);
  assert_true(fid >= 0 && tqd >= 0);
  assert_true(H5Dread(fid, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids) >= 0);
  assert_true(H5Dread(tqd, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, tq) >= 0);
  for (unsigned i = 0; i < n; i++) {
    assert_int_equal(ids[i], fr[i]->frame_id);
    assert_int_equal(tq[i], fr[i]->t_acq_ns);
  }
  H5Dclose(fid);
  H5Dclose(tqd);
  hid_t e = H5Gopen2(f, "/entry", H5P_DEFAULT);
  assert_int_equal(attr_u64(e, "frames_written"), n);
  assert_int_equal(attr_bool(e, "complete"), 1);
  H5Gclose(e);
  H5Fclose(f);
}

static void check_file(const char *path, beam_frame_t **fr, unsigned n, int bslz4) {
  check_file_cf(path, fr, n, bslz4, 1);
}

static void free_frames(beam_frame_t **fr, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    bh_frame_free(fr[i]);
  free(fr);
}

static void test_bslz4_round_trip(void **state) {
  (void)state;
  if (H5Zfilter_avail(BEAM_H5_BSLZ4_FILTER) <= 0) {
    print_message("# bitshuffle HDF5 plugin (hdf5-filter-plugin) missing: H5Dread check needs it\n");
    fail();
  }
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), NULL, NULL, "a_", &d), 0);
  uint32_t shape[2] = {37, 53}; /* odd sizes: a tail outside the bitshuffle blocks */
  beam_frame_t **fr = record(h, BEAM_DT_U16, shape, 6);
  char partial[512];
  snprintf(partial, sizeof partial, "%s", path_of("a_series_1.h5.partial"));
  assert_int_equal(access(partial, F_OK), 0);
  assert_int_equal(bh_end(h), 0);
  assert_int_not_equal(access(partial, F_OK), 0);
  check_file(path_of("a_series_1.h5"), fr, 6, 1);
  free_frames(fr, 6);

  /* A second series with the same id never overwrites the first file. */
  h->series.series_id = 0;
  uint32_t s2[2] = {8, 8};
  fr = record(h, BEAM_DT_F32, s2, 2);
  assert_int_equal(bh_end(h), 0);
  check_file(path_of("a_series_1-1.h5"), fr, 2, 1);
  free_frames(fr, 2);
  bh_free(&h);
}

static void test_raw_multi_frame_chunks(void **state) {
  (void)state;
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), "none", "3", "raw_", &d), 0);
  uint32_t shape[2] = {16, 24};
  beam_frame_t **fr = record(h, BEAM_DT_U32, shape, 7); /* 3 + 3 + a partial chunk of 1 */
  assert_int_equal(bh_end(h), 0);
  check_file(path_of("raw_series_1.h5"), fr, 7, 0);
  free_frames(fr, 7);
  bh_free(&h);
}

static void test_incomplete_stays_partial(void **state) {
  (void)state;
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), NULL, NULL, "inc_", &d), 0);
  h->series.nframes = 10; /* announced 10, only 3 arrive: the series was cut short */
  uint32_t shape[2] = {4, 4};
  beam_frame_t **fr = record(h, BEAM_DT_U8, shape, 3);
  assert_true(bh_end(h) < 0);
  assert_non_null(strstr(h->st.diag.msg, "incomplete"));
  assert_non_null(strstr(h->st.diag.msg, "inc_series_1.h5.partial"));
  assert_int_not_equal(access(path_of("inc_series_1.h5"), F_OK), 0);
  hid_t f = H5Fopen(path_of("inc_series_1.h5.partial"), H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t e = H5Gopen2(f, "/entry", H5P_DEFAULT);
  assert_int_equal(attr_bool(e, "complete"), 0);
  assert_int_equal(attr_u64(e, "frames_written"), 3);
  assert_int_equal(attr_u64(e, "frames_expected"), 10);
  H5Gclose(e);
  H5Fclose(f);
  free_frames(fr, 3);
  bh_free(&h);
}

static void test_series_metadata(void **state) {
  (void)state;
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), NULL, NULL, "meta_", &d), 0);
  static char meta[] = "{\"detector\":\"eiger\",\"energy\":8000.5,\"nframes\":1,\"pixel_size\":[7.5e-5,7.5e-5],\"scan\":{\"n\":2}}";
  h->series.meta_json = meta;
  h->series.meta_len = strlen(meta);
  uint32_t shape[2] = {4, 4};
  beam_frame_t **fr = record(h, BEAM_DT_I16, shape, 1);
  assert_int_equal(bh_end(h), 0);
  hid_t f = H5Fopen(path_of("meta_series_1.h5"), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t g = H5Gopen2(f, "/series", H5P_DEFAULT);
  assert_true(g >= 0);
  double en = 0;
  hid_t a = H5Aopen(g, "energy", H5P_DEFAULT);
  H5Aread(a, H5T_NATIVE_DOUBLE, &en);
  H5Aclose(a);
  assert_true(en == 8000.5);
  assert_int_equal(H5Aexists(g, "detector"), 1);
  assert_int_equal(H5Aexists(g, "scan"), 1); /* nested object: its JSON text */
  assert_int_equal(H5Aexists(g, "metadata_json"), 1);
  assert_int_equal(attr_bool(g, "metadata_missing"), 0);
  H5Gclose(g);
  H5Fclose(f);
  h->series.meta_json = NULL;
  free_frames(fr, 1);
  bh_free(&h);
}

static void test_init_errors(void **state) {
  (void)state;
  bh_t *h;
  beam_diag_t d = {0};
  char bad[512];
  snprintf(bad, sizeof bad, "%s/no/such/dir", bh_tmpdir());
  assert_true(new_stage(&h, bad, NULL, NULL, NULL, &d) < 0);
  assert_non_null(strstr(d.msg, bad));
  bh_free(&h);

  char file[512];
  snprintf(file, sizeof file, "%s/plainfile", bh_tmpdir());
  FILE *fp = fopen(file, "w");
  fclose(fp);
  memset(&d, 0, sizeof d);
  assert_true(new_stage(&h, file, NULL, NULL, NULL, &d) < 0);
  assert_non_null(strstr(d.msg, "not a directory"));
  bh_free(&h);

  /* The schema refuses what init would: a prefix with a slash, chunk_frames 0. */
  beam_cnode_t *cfg = bh_stage_cfg("record");
  bh_set(cfg, "dir", "/tmp");
  bh_set(cfg, "prefix", "a/b");
  char msg[256];
  assert_true(bh_validate(cfg, beam_record_params, msg, sizeof msg) > 0);
  assert_non_null(strstr(msg, "prefix"));
  beam_cnode_free(cfg);
  cfg = bh_stage_cfg("record");
  bh_set(cfg, "dir", "/tmp");
  bh_set(cfg, "chunk_frames", "0");
  assert_true(bh_validate(cfg, beam_record_params, msg, sizeof msg) > 0);
  beam_cnode_free(cfg);

  /* A directory that does not exist yet (but whose parent does) is made. */
  char fresh[512];
  snprintf(fresh, sizeof fresh, "%s/fresh", bh_tmpdir());
  memset(&d, 0, sizeof d);
  assert_int_equal(new_stage(&h, fresh, NULL, NULL, NULL, &d), 0);
  assert_int_equal(access(fresh, W_OK), 0);
  bh_free(&h);
}

static void test_registered(void **state) {
  (void)state;
  beam_record_stage_register();
  beam_record_stage_register(); /* twice is harmless */
  const beam_stage_kind_t *k = beam_stage_kind_find("record");
  assert_non_null(k);
  assert_ptr_equal(k->cpu, &beam_record_cpu_ops);
  assert_null(k->cuda);
}

/* ---- pass-through of frames still encoded (pipeline/frame.h lazy decode) ---- */

typedef struct enc_s {
  uint8_t *buf;
  size_t len;
  atomic_int released;
} enc_t;

static void release_enc(beam_frame_t *f, void *ctx) {
  (void)f;
  enc_t *e = ctx;
  atomic_fetch_add(&e->released, 1);
  free(e->buf);
  e->buf = NULL;
}

static void put_be(uint8_t *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

/* A 32008 chunk of raw with blocks of blk elements: the sender's choice,
 * not our encoder's (its default is 8192 bytes), so a stored chunk equal to
 * it byte for byte can only have been passed through. */
static size_t encode_blocks(const uint8_t *raw, size_t raw_bytes, size_t es, size_t blk, uint8_t *out) {
  size_t n = raw_bytes / es, pos = 12;
  uint8_t *tmp = malloc(blk * es);
  assert_non_null(tmp);
  put_be(out, raw_bytes, 8);
  put_be(out + 8, blk * es, 4);
  for (size_t i = 0; i < n; i += blk) {
    size_t cnt = n - i < blk ? n - i : blk;
    cnt -= cnt % 8;
    if (!cnt)
      break;
    beam_bitshuffle(raw + i * es, tmp, cnt, es);
    int c = LZ4_compress_default((const char *)tmp, (char *)out + pos + 4, (int)(cnt * es),
                                 LZ4_compressBound((int)(cnt * es)));
    assert_true(c > 0);
    put_be(out + pos, (uint64_t)c, 4);
    pos += 4 + (size_t)c;
  }
  size_t tail = (n % 8) * es;
  memcpy(out + pos, raw + raw_bytes - tail, tail);
  free(tmp);
  return pos + tail;
}

enum { SPOIL_NONE, SPOIL_SIZE, SPOIL_BODY, SPOIL_TRAIL };

/* A slot of pool p holding ref's pixels in codec, borrowed from a heap
 * buffer as ingest borrows a ZeroMQ message, dec_state PENDING. blk: bslz4
 * block in elements, 0 for our encoder's default. */
static beam_frame_t *pending_frame(beam_pool_t *p, const beam_frame_t *ref, beam_codec_t codec,
                                   size_t blk, int spoil, enc_t *e) {
  size_t es = beam_dtype_size(ref->dtype), raw = ref->nbytes;
  size_t cap = beam_codec_bound(codec, raw, es) + raw + 64;
  uint8_t *scratch = malloc(raw);
  e->buf = malloc(cap);
  atomic_init(&e->released, 0);
  assert_non_null(scratch);
  assert_non_null(e->buf);
  if (codec == BEAM_CODEC_BSLZ4 && blk) {
    e->len = encode_blocks(ref->data, raw, es, blk, e->buf);
  } else {
    int64_t n = beam_codec_encode(codec, ref->data, raw, es, e->buf, cap, scratch);
    assert_true(n > 16);
    e->len = (size_t)n;
  }
  free(scratch);
  if (spoil == SPOIL_SIZE) /* the header claims two more bytes than the frame has */
    put_be(e->buf, raw + 2, 8);
  else if (spoil == SPOIL_BODY) /* framing intact, LZ4 stream of the first block ruined */
    memset(e->buf + 16, 0xff, e->len - 16 < 64 ? e->len - 16 : 64);
  else if (spoil == SPOIL_TRAIL) /* a byte after the last block (the buffer has room) */
    e->buf[e->len++] = 0;
  beam_frame_t *f = beam_pool_try_get(p);
  assert_non_null(f);
  beam_frame_copy_ident(f, ref);
  f->dtype = ref->dtype;
  f->ndim = ref->ndim;
  memcpy(f->shape, ref->shape, sizeof f->shape);
  f->nbytes = raw;
  f->data = e->buf;
  f->release = release_enc;
  f->release_ctx = e;
  f->codec = (uint8_t)codec;
  f->enc_size = e->len;
  atomic_store(&f->dec_state, BEAM_DEC_PENDING);
  return f;
}

/* What the graph's worker does with an input frame (pipeline/graph.c
 * on_frame): offer it still encoded; otherwise decode it (a failure makes
 * it CORRUPT) and process it. Returns 1 when it was stored encoded. */
static int feed(bh_t *h, beam_frame_t *f, void *scratch) {
  int rc = 0;
  beam_diag_clear(&h->st.diag);
  if (h->st.process_encoded && atomic_load(&f->dec_state) == BEAM_DEC_PENDING)
    rc = h->st.process_encoded(&h->st, f, &h->emit);
  if (rc < 0)
    print_error("process_encoded: %s\n", h->st.diag.msg);
  assert_true(rc == 0 || rc == 1);
  if (rc == 1)
    return 1;
  (void)beam_frame_decode(f, scratch, NULL);
  rc = bh_process(h, f);
  if (rc < 0)
    print_error("process: %s\n", h->st.diag.msg);
  assert_int_equal(rc, 0);
  return 0;
}

static uint64_t passthrough_count(bh_t *h) {
  assert_int_equal(h->st.ncounters, 1);
  assert_string_equal(h->st.counters[0].name, "passthrough");
  return atomic_load(&h->st.counters[0].value);
}

/* Reference frames (bh frames: plain pixels) for a series of h. */
static beam_frame_t **refs(bh_t *h, beam_dtype_t dt, const uint32_t *shape, unsigned n) {
  beam_frame_t **r = calloc(n, sizeof *r);
  for (unsigned i = 0; i < n; i++) {
    r[i] = bh_frame_new(dt, 2, shape, 200 + i);
    r[i]->series_id = h->series.series_id;
    r[i]->t_acq_ns = 9000 + i;
    bh_frame_fill(r[i], 71 + i, i % 2 ? 60000.0 : 20.0);
  }
  return r;
}

static void assert_stored_chunk(const char *path, unsigned row, const uint8_t *buf, size_t len) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "/entry/data/data", H5P_DEFAULT);
  assert_true(ds >= 0);
  hsize_t off[3] = {row, 0, 0}, csize = 0;
  uint32_t fm = 1;
  assert_true(H5Dget_chunk_storage_size(ds, off, &csize) >= 0);
  assert_int_equal(csize, len);
  uint8_t *got = malloc(len);
  assert_true(H5Dread_chunk(ds, H5P_DEFAULT, off, &fm, got) >= 0);
  assert_memory_equal(got, buf, len);
  free(got);
  H5Dclose(ds);
  H5Fclose(f);
}

static void assert_entry_u64(const char *path, const char *attr, uint64_t want) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t e = H5Gopen2(f, "/entry", H5P_DEFAULT);
  assert_int_equal(attr_u64(e, attr), want);
  H5Gclose(e);
  H5Fclose(f);
}

static void test_passthrough_bslz4(void **state) {
  (void)state;
  enum { N = 6 };
  static const struct { beam_dtype_t dt; uint32_t shape[2]; } cases[] = {
      {BEAM_DT_U16, {61, 67}}, /* odd: a tail outside the bitshuffle blocks */
      {BEAM_DT_U32, {32, 48}},
  };
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), NULL, NULL, "pt_", &d), 0);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    assert_int_equal(bh_start(h, cases[c].dt, 2, cases[c].shape, &d), 0);
    beam_frame_t **r = refs(h, cases[c].dt, cases[c].shape, N);
    beam_pool_t *p = beam_pool_new(N, r[0]->nbytes, 0, &d);
    assert_non_null(p);
    enc_t e[N];
    beam_frame_t *f[N];
    uint64_t before = passthrough_count(h);
    for (unsigned i = 0; i < N; i++) {
      /* a sender's smaller blocks (compressible frames), our encoder's
       * (incompressible ones: small blocks there would outgrow our bound) */
      f[i] = pending_frame(p, r[i], BEAM_CODEC_BSLZ4, i % 2 ? 0 : 64, SPOIL_NONE, &e[i]);
      assert_int_equal(feed(h, f[i], NULL), 1);
      /* never decoded: still pending, the borrowed bytes not released */
      assert_int_equal(atomic_load(&f[i]->dec_state), BEAM_DEC_PENDING);
      assert_int_equal(atomic_load(&e[i].released), 0);
    }
    assert_int_equal(passthrough_count(h) - before, N);
    assert_int_equal(bh_end(h), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/pt_series_%llu.h5", bh_tmpdir(),
             (unsigned long long)h->series.series_id);
    check_file(path, r, N, 1);
    for (unsigned i = 0; i < N; i++)
      assert_stored_chunk(path, i, e[i].buf, e[i].len);
    assert_entry_u64(path, "frames_passthrough", N);
    for (unsigned i = 0; i < N; i++) {
      beam_frame_unref(f[i]);
      assert_int_equal(atomic_load(&e[i].released), 1);
    }
    beam_pool_close(&p);
    free_frames(r, N);
  }
  bh_free(&h);
}

/* Runs n frames through a stage with the given compress/chunk_frames, each
 * made by make(i), and checks the file against the references of the
 * frames that should land there (good[i]). Returns the pass-through count. */
typedef struct fb_case_s {
  const char *compress, *chunk, *prefix;
  beam_codec_t codec;
  int predecode; /* decode before the stage sees it (another stage got there first) */
  const int *spoil;
} fb_case_t;

static uint64_t run_case(const fb_case_t *k, unsigned n, int bslz4, unsigned cf) {
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), k->compress, k->chunk, k->prefix, &d), 0);
  uint32_t shape[2] = {40, 36};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shape, &d), 0);
  beam_frame_t **r = refs(h, BEAM_DT_U16, shape, n);
  beam_pool_t *p = beam_pool_new(n, r[0]->nbytes, 0, &d);
  void *scratch = malloc(r[0]->nbytes);
  enc_t *e = calloc(n, sizeof *e);
  beam_frame_t **f = calloc(n, sizeof *f), **good = calloc(n, sizeof *good);
  unsigned ngood = 0, nbad = 0;
  for (unsigned i = 0; i < n; i++) {
    int sp = k->spoil ? k->spoil[i] : SPOIL_NONE;
    f[i] = pending_frame(p, r[i], k->codec, 0, sp, &e[i]);
    if (k->predecode)
      assert_int_equal(beam_frame_decode(f[i], scratch, NULL), 0);
    feed(h, f[i], scratch);
    if (sp == SPOIL_NONE) {
      good[ngood++] = r[i];
      /* whatever path it took, the pixels are right */
    } else {
      nbad++;
      assert_true(f[i]->flags & BEAM_FLAG_CORRUPT);
    }
  }
  uint64_t pt = passthrough_count(h);
  assert_int_equal(bh_end(h), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/%sseries_1.h5", bh_tmpdir(), k->prefix);
  check_file_cf(path, good, ngood, bslz4, cf);
  assert_entry_u64(path, "frames_passthrough", pt);
  assert_entry_u64(path, "frames_corrupt", nbad);
  for (unsigned i = 0; i < n; i++)
    beam_frame_unref(f[i]);
  beam_pool_close(&p);
  free_frames(r, n);
  free(scratch);
  free(e);
  free(f);
  free(good);
  bh_free(&h);
  return pt;
}

static void test_passthrough_fallbacks(void **state) {
  (void)state;
  /* Decoded already (another stage got there first): encoded as before. */
  fb_case_t done = {NULL, NULL, "done_", BEAM_CODEC_BSLZ4, 1, NULL};
  assert_int_equal(run_case(&done, 4, 1, 1), 0);
  /* Several frames per chunk: the chunk is ours to build. */
  fb_case_t cf2 = {"bslz4", "2", "cf2_", BEAM_CODEC_BSLZ4, 0, NULL};
  assert_int_equal(run_case(&cf2, 5, 1, 2), 0);
  /* Uncompressed file. */
  fb_case_t raw = {"none", NULL, "none_", BEAM_CODEC_BSLZ4, 0, NULL};
  assert_int_equal(run_case(&raw, 3, 0, 1), 0);
  /* LZ4 (32004) on the wire is not what the dataset declares. */
  fb_case_t lz4 = {NULL, NULL, "lz4_", BEAM_CODEC_LZ4, 0, NULL};
  assert_int_equal(run_case(&lz4, 3, 1, 1), 0);
  /* A header whose size is not the frame's, a body whose LZ4 is broken
   * under intact framing, a stray byte after the last block: none is
   * stored; each goes the ordinary way, fails to decode and is recorded as
   * CORRUPT (no row), as before. The good frames around them still pass
   * through. */
  static const int spoil[6] = {SPOIL_NONE, SPOIL_SIZE, SPOIL_NONE, SPOIL_BODY, SPOIL_TRAIL, SPOIL_NONE};
  fb_case_t bad = {NULL, NULL, "bad_", BEAM_CODEC_BSLZ4, 0, spoil};
  assert_int_equal(run_case(&bad, 6, 1, 1), 3);
  /* check: decode decompresses where full (the default) walks: the same verdicts. */
  g_check = "decode";
  fb_case_t dec = {NULL, NULL, "dec_", BEAM_CODEC_BSLZ4, 0, spoil};
  assert_int_equal(run_case(&dec, 6, 1, 1), 3);
  g_check = NULL;
}

/* check: framing takes the LZ4 streams on trust: the broken body is stored
 * as it came (passes through), while a wrong size or a stray byte, which
 * the framing shows, still go the ordinary way and are CORRUPT. */
static void test_passthrough_check_framing(void **state) {
  (void)state;
  g_check = "framing";
  static const int spoil[4] = {SPOIL_NONE, SPOIL_SIZE, SPOIL_TRAIL, SPOIL_NONE};
  fb_case_t bad = {NULL, NULL, "frm_", BEAM_CODEC_BSLZ4, 0, spoil};
  assert_int_equal(run_case(&bad, 4, 1, 1), 2);
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), NULL, NULL, "frm2_", &d), 0);
  uint32_t shape[2] = {40, 36};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shape, &d), 0);
  beam_frame_t **r = refs(h, BEAM_DT_U16, shape, 1);
  beam_pool_t *p = beam_pool_new(1, r[0]->nbytes, 0, &d);
  enc_t e;
  beam_frame_t *f = pending_frame(p, r[0], BEAM_CODEC_BSLZ4, 0, SPOIL_BODY, &e);
  assert_int_equal(feed(h, f, NULL), 1); /* stored without a decode */
  assert_int_equal(passthrough_count(h), 1);
  assert_int_equal(bh_end(h), 0);
  char path[512];
  snprintf(path, sizeof path, "%s/frm2_series_%llu.h5", bh_tmpdir(),
           (unsigned long long)h->series.series_id);
  assert_stored_chunk(path, 0, e.buf, e.len);
  beam_frame_unref(f);
  beam_pool_close(&p);
  free_frames(r, 1);
  bh_free(&h);
  g_check = NULL;
}

/* Another stage decodes each frame on its own thread while record stores it:
 * whichever wins, the decoder gets the exact pixels and the file holds
 * them. For even frames the decoder and the stage start together after a
 * barrier (either may win); for odd ones the decoder waits for the frame to
 * leave PENDING, i.e. for record's loan, and asks for pixels right then
 * (or once record is done, if it missed the loan). */
typedef struct dec_s {
  beam_frame_t *f;
  const beam_frame_t *ref;
  void *scratch;
  pthread_barrier_t *go;
  int rc, same, watch, saw_loan;
  atomic_int *fed;
} dec_t;

static void *decoder(void *arg) {
  dec_t *c = arg;
  pthread_barrier_wait(c->go);
  if (c->watch) {
    while (atomic_load(&c->f->dec_state) == BEAM_DEC_PENDING && !atomic_load(c->fed))
      ;
    c->saw_loan = atomic_load(&c->f->dec_state) == BEAM_DEC_BUSY;
  }
  c->rc = beam_frame_decode(c->f, c->scratch, NULL);
  c->same = c->rc == 0 && c->f->nbytes == c->ref->nbytes &&
            memcmp(c->f->data, c->ref->data, c->ref->nbytes) == 0;
  return NULL;
}

static void test_passthrough_concurrent_decoder(void **state) {
  (void)state;
  enum { N = 48 };
  bh_t *h;
  beam_diag_t d = {0};
  assert_int_equal(new_stage(&h, bh_tmpdir(), NULL, NULL, "race_", &d), 0);
  /* Large enough that the loan (a copy of the encoded frame) lasts long
   * enough for the decoder to find it taken now and then. */
  uint32_t shape[2] = {256, 256};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shape, &d), 0);
  beam_frame_t **r = refs(h, BEAM_DT_U16, shape, N);
  beam_pool_t *p = beam_pool_new(N, r[0]->nbytes, 0, &d);
  void *scratch = malloc(r[0]->nbytes);
  enc_t e[N];
  beam_frame_t *f[N];
  unsigned through = 0, loans_seen = 0;
  for (unsigned i = 0; i < N; i++) {
    f[i] = pending_frame(p, r[i], BEAM_CODEC_BSLZ4, 0, SPOIL_NONE, &e[i]);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 2);
    atomic_int fed;
    atomic_init(&fed, 0);
    dec_t c = {f[i], r[i], malloc(r[i]->nbytes), &go, -1, 0, (int)(i % 2), 0, &fed};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, decoder, &c), 0);
    pthread_barrier_wait(&go);
    through += (unsigned)feed(h, f[i], scratch);
    atomic_store(&fed, 1);
    pthread_join(th, NULL);
    loans_seen += (unsigned)c.saw_loan;
    pthread_barrier_destroy(&go);
    free(c.scratch);
    assert_int_equal(c.rc, 0);
    assert_true(c.same);
    assert_int_equal(atomic_load(&f[i]->dec_state), BEAM_DEC_DONE);
    assert_int_equal(atomic_load(&e[i].released), 1);
  }
  print_message("# %u of %d frames passed through, the rest decoded first; the decoder "
                "arrived during %u loans\n", through, N, loans_seen);
  assert_int_equal(passthrough_count(h), through);
  assert_int_equal(bh_end(h), 0);
  check_file(path_of("race_series_1.h5"), r, N, 1);
  for (unsigned i = 0; i < N; i++)
    beam_frame_unref(f[i]);
  beam_pool_close(&p);
  free_frames(r, N);
  free(scratch);
  bh_free(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bslz4_round_trip),   cmocka_unit_test(test_raw_multi_frame_chunks),
      cmocka_unit_test(test_incomplete_stays_partial), cmocka_unit_test(test_series_metadata),
      cmocka_unit_test(test_init_errors),        cmocka_unit_test(test_registered),
      cmocka_unit_test(test_passthrough_bslz4),  cmocka_unit_test(test_passthrough_fallbacks),
      cmocka_unit_test(test_passthrough_check_framing),
      cmocka_unit_test(test_passthrough_concurrent_decoder),
  };
  return beam_run_tests(tests, NULL, NULL);
}
