/* The `record` stage driven through its ops by the stage harness, files read
 * back with the HDF5 C API: frames bit-exact through the 32008 filter, stored
 * bitshuffle-LZ4 chunks decodable by our own beam_codec_decode, raw chunks of
 * several frames, the .partial name of an incomplete series, and the errors
 * at init. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/h5util.h"
#include "daemon/stage_record.h"
#include "tests/common/stage_harness.h"

static int new_stage(bh_t **h, const char *dir, const char *compress, const char *chunk,
                     const char *prefix, beam_diag_t *d) {
  beam_cnode_t *cfg = bh_stage_cfg("record");
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

static void check_file(const char *path, beam_frame_t **fr, unsigned n, int bslz4) {
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
  if (bslz4) {
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bslz4_round_trip),   cmocka_unit_test(test_raw_multi_frame_chunks),
      cmocka_unit_test(test_incomplete_stays_partial), cmocka_unit_test(test_series_metadata),
      cmocka_unit_test(test_init_errors),        cmocka_unit_test(test_registered),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
