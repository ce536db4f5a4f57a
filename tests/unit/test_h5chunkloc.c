/* The chunk locator (daemon/h5chunkloc.c) against files written here with
 * the plain HDF5 API: chunks of known bytes and uneven sizes stored with
 * H5Dwrite_chunk, 3000 of them so that the chunk index has inner nodes, in
 * the index kinds HDF5 1.10 writes for frame stacks (v1 B-tree; in
 * libver-latest files the extensible array of one unlimited dimension and
 * the fixed array of fixed dimensions). Each located chunk must agree
 * with H5Dget_chunk_info_by_coord, and pread() of it must give the bytes
 * written and the bytes H5Dread_chunk reads through the same driver.
 * Also: ordinary filtered reads through the driver, a chunk never written,
 * a file opened with another driver, a user block, writes refused, an
 * external link (the fd is the data file's), two threads at once. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <hdf5.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/h5chunkloc.h"
#include "daemon/h5util.h"
#include "tests/common/stage_harness.h"

#define NF 3000      /* frames (chunks) per test dataset */
#define MISSING 1234 /* the frame never written */
#define FH 16
#define FW 16
#define CHUNK_BYTES (FH * FW * 2)

/* Stored sizes vary from chunk to chunk so that addresses are irregular. */
static size_t chunk_len(unsigned i) { return 40 + (i * 37u) % 400; }

static void chunk_bytes(unsigned i, unsigned char *b) {
  for (size_t j = 0; j < chunk_len(i); j++)
    b[j] = (unsigned char)(i * 7 + j * 13 + (i >> 8));
}

static unsigned chunk_mask(unsigned i) { return i % 5 == 0 ? 1 : 0; }

static const char *path_of(const char *name) {
  static _Thread_local char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", bh_tmpdir(), name);
  return buf;
}

/* A deflate-filtered uint16 dataset of nf 16x16 frames, one chunk per
 * frame, each chunk stored directly (filters never run on these bytes). */
static void write_frames(hid_t loc, const char *name, unsigned nf, int unlimited) {
  hsize_t dims[3] = {nf, FH, FW}, maxd[3] = {unlimited ? H5S_UNLIMITED : nf, FH, FW};
  hsize_t cdims[3] = {1, FH, FW};
  hid_t sp = H5Screate_simple(3, dims, maxd);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  assert_true(H5Pset_chunk(dcpl, 3, cdims) >= 0);
  assert_true(H5Pset_deflate(dcpl, 4) >= 0);
  hid_t d = H5Dcreate2(loc, name, H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  assert_true(d >= 0);
  unsigned char b[CHUNK_BYTES];
  for (unsigned i = 0; i < nf; i++) {
    if (i == MISSING)
      continue;
    hsize_t off[3] = {i, 0, 0};
    chunk_bytes(i, b);
    assert_true(H5Dwrite_chunk(d, H5P_DEFAULT, chunk_mask(i), off, chunk_len(i), b) >= 0);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
}

static void gz_values(uint16_t *v, size_t n) {
  for (size_t k = 0; k < n; k++)
    v[k] = (uint16_t)(k % 97 * 300 + k / 256);
}

/* 10 frames written the ordinary way, through the deflate filter. */
static void write_gz(hid_t f) {
  hsize_t dims[3] = {10, FH, FW}, cdims[3] = {1, FH, FW};
  hid_t sp = H5Screate_simple(3, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  assert_true(H5Pset_chunk(dcpl, 3, cdims) >= 0);
  assert_true(H5Pset_deflate(dcpl, 6) >= 0);
  hid_t d = H5Dcreate2(f, "gz", H5T_STD_U16LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  assert_true(d >= 0);
  uint16_t *v = malloc(10 * FH * FW * sizeof *v);
  gz_values(v, 10 * FH * FW);
  assert_true(H5Dwrite(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  free(v);
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
}

static void make_file(const char *name, int latest, hsize_t userblock) {
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (userblock)
    assert_true(H5Pset_userblock(fcpl, userblock) >= 0);
  if (latest)
    assert_true(H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) >= 0);
  hid_t f = H5Fcreate(path_of(name), H5F_ACC_TRUNC, fcpl, fapl);
  assert_true(f >= 0);
  write_frames(f, "frames", NF, latest);
  /* Fixed dimensions in a libver-latest file: a fixed-array index. */
  if (latest)
    write_frames(f, "fixed", NF, 0);
  write_gz(f);
  H5Fclose(f);
  H5Pclose(fcpl);
  H5Pclose(fapl);
}

static int setup(void **state) {
  (void)state;
  beam_h5_quiet();
  make_file("btree.h5", 0, 0);
  make_file("earray.h5", 1, 0);
  make_file("ublock.h5", 0, 512);
  return 0;
}

static hid_t open_loc(const char *name) {
  hid_t fapl = beam_h5loc_fapl();
  assert_true(fapl >= 0);
  hid_t f = H5Fopen(path_of(name), H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  assert_true(f >= 0);
  return f;
}

/* Locates frame i of d and checks it every way; base is the user block. */
static void check_frame(hid_t d, unsigned i, hsize_t base) {
  hsize_t off[3] = {i, 0, 0};
  int fd = -1;
  uint64_t addr = 0, size = 0;
  unsigned mask = 99;
  char why[256] = "";
  int rc = beam_h5loc_chunk(d, off, &fd, &addr, &size, &mask, why, sizeof why);
  if (rc != 1)
    print_error("frame %u: %d %s\n", i, rc, why);
  assert_int_equal(rc, 1);

  unsigned im = 0;
  haddr_t ia = HADDR_UNDEF;
  hsize_t is = 0;
  assert_true(H5Dget_chunk_info_by_coord(d, off, &im, &ia, &is) >= 0);
  assert_int_equal(addr, ia + base);
  assert_int_equal(size, is);
  assert_int_equal(size, chunk_len(i));
  assert_int_equal(mask, im);
  assert_int_equal(mask, chunk_mask(i));

  unsigned char want[CHUNK_BYTES], got[CHUNK_BYTES], viah5[CHUNK_BYTES];
  chunk_bytes(i, want);
  assert_int_equal(pread(fd, got, size, (off_t)addr), (ssize_t)size);
  assert_memory_equal(got, want, size);
  /* The ordinary read through the same driver, right after a probe. */
  uint32_t filt = 99;
  memset(viah5, 0, sizeof viah5);
  assert_true(H5Dread_chunk(d, H5P_DEFAULT, off, &filt, viah5) >= 0);
  assert_int_equal(filt, mask);
  assert_memory_equal(viah5, want, size);
}

static void check_file(const char *name, const char *dset, hsize_t base) {
  hid_t f = open_loc(name);
  hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
  assert_true(d >= 0);
  /* Both ends, around the gap, and a spread in between, out of order so
   * that lookups do not just follow the previous one. */
  unsigned some[] = {0, 1, 2, 63, 64, 65, MISSING - 1, MISSING + 1, NF - 2, NF - 1, 1500, 7};
  for (size_t k = 0; k < sizeof some / sizeof *some; k++)
    check_frame(d, some[k], base);
  for (int i = NF - 3; i > 3; i -= 97)
    check_frame(d, (unsigned)i, base);

  hsize_t off[3] = {MISSING, 0, 0};
  int fd = -7;
  uint64_t addr = 7, size = 7;
  unsigned mask = 7;
  char why[256] = "";
  assert_int_equal(beam_h5loc_chunk(d, off, &fd, &addr, &size, &mask, why, sizeof why), 0);
  assert_int_equal(fd, -7);
  assert_int_equal(H5Eget_num(H5E_DEFAULT), 0);
  /* Past the end is an error, not a chunk never written. */
  off[0] = NF;
  assert_int_equal(beam_h5loc_chunk(d, off, &fd, &addr, &size, &mask, why, sizeof why), -1);
  assert_non_null(strstr(why, "outside"));
  H5Dclose(d);
  H5Fclose(f);
}

static void test_btree_index(void **state) {
  (void)state;
  check_file("btree.h5", "frames", 0);
}

static void test_earray_index(void **state) {
  (void)state;
  check_file("earray.h5", "frames", 0);
}

static void test_farray_index(void **state) {
  (void)state;
  check_file("earray.h5", "fixed", 0);
}

/* H5Dget_chunk_info_by_coord's addresses are relative to the HDF5 base
 * (after the user block); the fd needs the absolute one. */
static void test_user_block(void **state) {
  (void)state;
  check_file("ublock.h5", "frames", 512);
}

/* Metadata and raw reads through the driver, filters run, probe unarmed. */
static void test_ordinary_read(void **state) {
  (void)state;
  hid_t f = open_loc("btree.h5");
  hid_t d = H5Dopen2(f, "gz", H5P_DEFAULT);
  assert_true(d >= 0);
  size_t n = 10 * FH * FW;
  uint16_t *want = malloc(n * sizeof *want), *got = calloc(n, sizeof *got);
  gz_values(want, n);
  assert_true(H5Dread(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
  assert_memory_equal(got, want, n * sizeof *want);

  /* The chunks really are deflated, and the locator finds them too. */
  hsize_t off[3] = {3, 0, 0};
  int fd;
  uint64_t addr, size;
  unsigned mask;
  char why[256] = "";
  assert_int_equal(beam_h5loc_chunk(d, off, &fd, &addr, &size, &mask, why, sizeof why), 1);
  assert_true(size < CHUNK_BYTES);
  assert_int_equal(mask, 0);
  /* A filtered read after the probe still reads (cache evicted by it). */
  memset(got, 0, n * sizeof *got);
  assert_true(H5Dread(d, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
  assert_memory_equal(got, want, n * sizeof *want);
  free(want);
  free(got);
  H5Dclose(d);
  H5Fclose(f);
}

static void test_other_driver(void **state) {
  (void)state;
  hid_t f = H5Fopen(path_of("btree.h5"), H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t d = H5Dopen2(f, "frames", H5P_DEFAULT);
  hsize_t off[3] = {5, 0, 0};
  int fd = -7;
  uint64_t addr = 0, size = 0;
  unsigned mask = 0;
  char why[256] = "";
  assert_int_equal(beam_h5loc_chunk(d, off, &fd, &addr, &size, &mask, why, sizeof why), -1);
  assert_non_null(strstr(why, "beam_h5loc_fapl"));
  assert_int_equal(fd, -7);
  H5Dclose(d);
  H5Fclose(f);
}

static void test_read_only(void **state) {
  (void)state;
  hid_t fapl = beam_h5loc_fapl();
  assert_true(fapl >= 0);
  assert_true(H5Fcreate(path_of("new.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, fapl) < 0);
  assert_true(H5Fopen(path_of("btree.h5"), H5F_ACC_RDWR, fapl) < 0);
  char why[256];
  beam_h5_reason(why, sizeof why, NULL);
  assert_non_null(strstr(why, "read-only"));
  H5Pclose(fapl);
}

/* Eiger layout: the master's /entry/data/data_000001 links into a data
 * file, which HDF5 1.10 opens with the master's driver. */
static void test_external_link(void **state) {
  (void)state;
  hid_t f = H5Fcreate(path_of("data_000001.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  write_frames(f, "data", 300, 0);
  H5Fclose(f);
  f = H5Fcreate(path_of("master.h5"), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  assert_true(H5Pset_create_intermediate_group(lcpl, 1) >= 0);
  assert_true(H5Lcreate_external("data_000001.h5", "/data", f, "/entry/data/data_000001", lcpl,
                                 H5P_DEFAULT) >= 0);
  H5Pclose(lcpl);
  H5Fclose(f);

  struct stat ds, ms;
  assert_int_equal(stat(path_of("data_000001.h5"), &ds), 0);
  assert_int_equal(stat(path_of("master.h5"), &ms), 0);
  hid_t m = open_loc("master.h5");
  hid_t d = H5Dopen2(m, "/entry/data/data_000001", H5P_DEFAULT);
  assert_true(d >= 0);
  for (unsigned i = 0; i < 300; i += 37) {
    hsize_t off[3] = {i, 0, 0};
    int fd = -1;
    uint64_t addr, size;
    unsigned mask;
    char why[256] = "";
    int rc = beam_h5loc_chunk(d, off, &fd, &addr, &size, &mask, why, sizeof why);
    if (rc < 0)
      print_error("frame %u: %s\n", i, why);
    assert_int_equal(rc, 1);
    struct stat fs;
    assert_int_equal(fstat(fd, &fs), 0);
    assert_true(fs.st_dev == ds.st_dev && fs.st_ino == ds.st_ino);
    assert_false(fs.st_ino == ms.st_ino && fs.st_dev == ms.st_dev);
    unsigned char want[CHUNK_BYTES], got[CHUNK_BYTES];
    chunk_bytes(i, want);
    assert_int_equal(size, chunk_len(i));
    assert_int_equal(pread(fd, got, size, (off_t)addr), (ssize_t)size);
    assert_memory_equal(got, want, size);
  }
  H5Dclose(d);
  H5Fclose(m);
}

typedef struct worker_s {
  hid_t d;
  unsigned first;
  int bad;
} worker_t;

static void *locate_many(void *arg) {
  worker_t *w = arg;
  beam_h5_quiet();
  unsigned char want[CHUNK_BYTES], got[CHUNK_BYTES];
  for (unsigned i = w->first; i < NF; i += 2) {
    if (i == MISSING)
      continue;
    hsize_t off[3] = {i, 0, 0};
    int fd;
    uint64_t addr, size;
    unsigned mask;
    char why[256];
    chunk_bytes(i, want);
    if (beam_h5loc_chunk(w->d, off, &fd, &addr, &size, &mask, why, sizeof why) != 1 ||
        size != chunk_len(i) || pread(fd, got, size, (off_t)addr) != (ssize_t)size ||
        memcmp(got, want, size) != 0)
      w->bad++;
  }
  return NULL;
}

/* Each thread's probe sees only its own H5Dread_chunk. */
static void test_two_threads(void **state) {
  (void)state;
  hid_t f = open_loc("earray.h5");
  hid_t d = H5Dopen2(f, "frames", H5P_DEFAULT);
  worker_t w[2] = {{d, 0, 0}, {d, 1, 0}};
  pthread_t t[2];
  for (int k = 0; k < 2; k++)
    assert_int_equal(pthread_create(&t[k], NULL, locate_many, &w[k]), 0);
  for (int k = 0; k < 2; k++)
    pthread_join(t[k], NULL);
  assert_int_equal(w[0].bad, 0);
  assert_int_equal(w[1].bad, 0);
  H5Dclose(d);
  H5Fclose(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_btree_index),   cmocka_unit_test(test_earray_index),
      cmocka_unit_test(test_farray_index),  cmocka_unit_test(test_user_block),
      cmocka_unit_test(test_ordinary_read),
      cmocka_unit_test(test_other_driver),  cmocka_unit_test(test_read_only),
      cmocka_unit_test(test_external_link), cmocka_unit_test(test_two_threads),
  };
  return beam_run_tests(tests, setup, NULL);
}
