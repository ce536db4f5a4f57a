/* Array loader: .npy parsing (dtypes, shapes, every rejection with its
 * message) and the HDF5 loader (integer, float, h5py-style bool enum,
 * missing file and dataset, non-numeric types). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

#include "daemon/h5array.h"
#include "pipeline/array.h"
#include "tests/common/stage_harness.h"

static char *path(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 256, "%s/%s", bh_tmpdir(), name);
  return p;
}

static void write_raw(const char *p, const char *bytes, size_t n) {
  FILE *fp = fopen(p, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(bytes, 1, n, fp), n);
  fclose(fp);
}

static void expect_fail(const char *p, int code, const char *needle) {
  beam_array_t a;
  beam_diag_t d = {0};
  int rc = beam_array_load(p, "/data", &a, &d);
  if (rc != code || !strstr(d.msg, needle))
    fail_msg("%s: rc %d msg \"%s\", want %d with \"%s\"", p, rc, d.msg, code, needle);
  assert_null(a.data);
}

static void test_npy_dtypes(void **state) {
  uint32_t shp[3] = {2, 3, 4};
  int16_t v[24];
  for (int i = 0; i < 24; i++)
    v[i] = (int16_t)(i * 1000 - 7000);
  assert_int_equal(bh_write_npy(path("a.npy"), "<i2", 3, shp, v, sizeof v), 0);
  beam_array_t a;
  beam_diag_t d = {0};
  assert_int_equal(beam_array_load(path("a.npy"), NULL, &a, &d), 0);
  assert_int_equal(a.dtype, BEAM_DT_I16);
  assert_int_equal(a.ndim, 3);
  assert_int_equal(a.shape[2], 4);
  assert_int_equal(beam_array_elems(&a), 24);
  assert_true(beam_array_get(&a, 23) == 23 * 1000 - 7000);
  beam_array_free(&a);
  beam_array_free(&a); /* idempotent */
  double dv[5] = {1.5, -2, 3, 4, 5};
  uint32_t s1[1] = {5};
  assert_int_equal(bh_write_npy(path("b.npy"), "<f8", 1, s1, dv, sizeof dv), 0);
  assert_int_equal(beam_array_load(path("b.npy"), NULL, &a, &d), 0);
  assert_int_equal(a.dtype, BEAM_DT_F64);
  assert_true(beam_array_get(&a, 0) == 1.5);
  beam_array_free(&a);
  uint8_t bv[4] = {0, 1, 1, 0};
  uint32_t s2[2] = {2, 2};
  assert_int_equal(bh_write_npy(path("c.npy"), "|b1", 2, s2, bv, sizeof bv), 0);
  assert_int_equal(beam_array_load(path("c.npy"), NULL, &a, &d), 0);
  assert_int_equal(a.dtype, BEAM_DT_U8);
  beam_array_free(&a);
}

static void test_npy_rejects(void **state) {
  uint32_t shp[2] = {2, 2};
  float v[4] = {0};
  assert_int_equal(bh_write_npy(path("be.npy"), ">f4", 2, shp, v, sizeof v), 0);
  expect_fail(path("be.npy"), BEAM_ENOTSUP, "big-endian");
  assert_int_equal(bh_write_npy(path("u.npy"), "<U4", 2, shp, v, sizeof v), 0);
  expect_fail(path("u.npy"), BEAM_ENOTSUP, "dtype '<U4' is not supported");
  assert_int_equal(bh_write_npy(path("short.npy"), "<f4", 2, shp, v, sizeof v - 1), 0);
  expect_fail(path("short.npy"), BEAM_EPROTO, "truncated (15 of 16 bytes)");
  assert_int_equal(bh_write_npy(path("long.npy"), "<f4", 1, shp, v, sizeof v), 0);
  expect_fail(path("long.npy"), BEAM_EPROTO, "bytes after the data");
  const char fort[] = "\x93NUMPY\x01\x00\x40\x00{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }          \n";
  char buf[sizeof fort + 4];
  memcpy(buf, fort, sizeof fort - 1);
  memset(buf + sizeof fort - 1, 0, 4);
  write_raw(path("f.npy"), buf, sizeof fort - 1 + 4);
  expect_fail(path("f.npy"), BEAM_ENOTSUP, "Fortran-order");
  write_raw(path("trunc.npy"), "\x93NUMPY\x01\x00\xff", 9);
  expect_fail(path("trunc.npy"), BEAM_EPROTO, "truncated .npy header");
  expect_fail("/nonexistent/x.npy", BEAM_EIO, "/nonexistent/x.npy: cannot open");
  /* not .npy and no HDF5 loader yet */
  write_raw(path("junk.bin"), "hello world", 11);
  beam_array_set_h5_loader(NULL);
  expect_fail(path("junk.bin"), BEAM_ENOTSUP, "no HDF5 loader");
  /* with the loader: HDF5 says why */
  beam_h5array_register();
  expect_fail(path("junk.bin"), BEAM_EIO, "cannot open as HDF5");
}

static void write_h5(const char *p) {
  hid_t f = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  assert_true(f >= 0);
  hsize_t dims[2] = {2, 3};
  hid_t sp = H5Screate_simple(2, dims, NULL);
  int32_t iv[6] = {1, -2, 3, -4, 5, -6};
  hid_t ds = H5Dcreate2(f, "/labels", H5T_STD_I32BE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, iv);
  H5Dclose(ds);
  float fv[6] = {0.5f, 1, 2, 3, 4, 5};
  ds = H5Dcreate2(f, "/data", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, fv);
  H5Dclose(ds);
  hid_t et = H5Tenum_create(H5T_NATIVE_INT8);
  int8_t fa = 0, tr = 1;
  H5Tenum_insert(et, "FALSE", &fa);
  H5Tenum_insert(et, "TRUE", &tr);
  int8_t bv[6] = {0, 1, 0, 1, 1, 0};
  ds = H5Dcreate2(f, "/mask", et, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, et, H5S_ALL, H5S_ALL, H5P_DEFAULT, bv);
  H5Dclose(ds);
  H5Tclose(et);
  hid_t st = H5Tcopy(H5T_C_S1);
  H5Tset_size(st, 4);
  ds = H5Dcreate2(f, "/names", st, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dclose(ds);
  H5Tclose(st);
  H5Sclose(sp);
  H5Fclose(f);
}

static void test_h5(void **state) {
  beam_h5array_register();
  const char *p = path("t.h5");
  write_h5(p);
  beam_array_t a;
  beam_diag_t d = {0};
  assert_int_equal(beam_array_load(p, "/labels", &a, &d), 0);
  assert_int_equal(a.dtype, BEAM_DT_I32);
  assert_int_equal(a.ndim, 2);
  assert_int_equal(a.shape[1], 3);
  assert_true(beam_array_get(&a, 5) == -6); /* big-endian file, converted */
  beam_array_free(&a);
  assert_int_equal(beam_array_load(p, "/data", &a, &d), 0);
  assert_int_equal(a.dtype, BEAM_DT_F32);
  assert_true(beam_array_get(&a, 0) == 0.5);
  beam_array_free(&a);
  assert_int_equal(beam_array_load(p, "/mask", &a, &d), 0);
  assert_int_equal(a.dtype, BEAM_DT_I8);
  assert_true(beam_array_get(&a, 3) == 1 && beam_array_get(&a, 5) == 0);
  beam_array_free(&a);
  expect_fail(path("nothere.h5"), BEAM_EIO, "nothere.h5: cannot open: No such file");
  beam_diag_clear(&d);
  assert_int_equal(beam_array_load(p, "/nope", &a, &d), BEAM_EIO);
  assert_non_null(strstr(d.msg, "cannot open dataset \"/nope\""));
  assert_non_null(strstr(d.msg, "t.h5"));
  beam_diag_clear(&d);
  assert_int_equal(beam_array_load(p, "/names", &a, &d), BEAM_ENOTSUP);
  assert_non_null(strstr(d.msg, "/names"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_npy_dtypes),
      cmocka_unit_test(test_npy_rejects),
      cmocka_unit_test(test_h5),
  };
  return beam_run_tests(tests, NULL, NULL);
}
