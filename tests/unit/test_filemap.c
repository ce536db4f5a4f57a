/* Unit tests of daemon/filemap.c, the mappings frames are read in place
 * from (PROTOCOL.md 13.8): only /proc/PID/fd/N paths to regular HDF5
 * files are mapped; a frame borrowing from a mapping keeps it alive; a
 * file truncated under a mapping reads as zeros past its new end, marks
 * the mapping damaged and does not kill the process, while a SIGBUS that
 * is not ours still does. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/filemap.h"

static const uint8_t SIG[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

/* A file of `pages` pages, byte i = i % 251 + 1 (never 0), with the HDF5
 * signature at `sig_at` (-1: none). Returns its descriptor. */
static int make_file(size_t pages, long sig_at) {
  char path[] = "/tmp/beamd-filemap-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  size_t n = pages * (size_t)sysconf(_SC_PAGESIZE);
  uint8_t *b = malloc(n);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++)
    b[i] = (uint8_t)(i % 251 + 1);
  if (sig_at >= 0)
    memcpy(b + sig_at, SIG, sizeof SIG);
  assert_int_equal(pwrite(fd, b, n, 0), (ssize_t)n);
  free(b);
  return fd;
}

static void proc_path(char *out, size_t n, int fd) {
  snprintf(out, n, "/proc/%ld/fd/%d", (long)getpid(), fd);
}

static void test_maps_hdf5_files_only(void **state) {
  (void)state;
  char path[64], err[256];
  int fd = make_file(2, 512); /* after a 512-byte user block, as HDF5 allows */
  proc_path(path, sizeof path, fd);
  beam_fmap_t *m = beam_fmap_open_proc(path, err, sizeof err);
  assert_non_null(m);
  assert_int_equal(beam_fmap_size(m), 2 * (size_t)sysconf(_SC_PAGESIZE));
  assert_memory_equal(beam_fmap_base(m) + 512, SIG, sizeof SIG);
  assert_int_equal(beam_fmap_base(m)[7], 8);
  assert_true(beam_fmap_covers(m, 0, beam_fmap_size(m)));
  assert_false(beam_fmap_covers(m, 1, beam_fmap_size(m)));
  assert_false(beam_fmap_covers(m, UINT64_MAX, 2));
  assert_false(beam_fmap_damaged(m));
  beam_fmap_unref(m);
  close(fd);

  fd = make_file(1, 100); /* not at 0 or 512 x 2^k: not HDF5 */
  proc_path(path, sizeof path, fd);
  assert_null(beam_fmap_open_proc(path, err, sizeof err));
  assert_non_null(strstr(err, "not an HDF5 file"));
  close(fd);

  assert_null(beam_fmap_open_proc("/etc/passwd", err, sizeof err));
  assert_non_null(strstr(err, "is not /proc/PID/fd/N"));
  assert_null(beam_fmap_open_proc("/proc/self/fd/0", err, sizeof err));
  int dir = open("/tmp", O_RDONLY | O_DIRECTORY);
  proc_path(path, sizeof path, dir);
  assert_null(beam_fmap_open_proc(path, err, sizeof err));
  assert_non_null(strstr(err, "not a regular file"));
  close(dir);
}

static void test_frame_keeps_mapping(void **state) {
  (void)state;
  char path[64], err[256];
  int fd = make_file(2, 0);
  proc_path(path, sizeof path, fd);
  beam_fmap_t *m = beam_fmap_open_proc(path, err, sizeof err);
  assert_non_null(m);
  close(fd); /* the mapping holds its own descriptor */
  beam_frame_t f;
  memset(&f, 0, sizeof f);
  beam_fmap_lend(m, 4096, &f);
  beam_fmap_unref(m); /* the opener's reference: the frame's is left */
  assert_int_equal(((uint8_t *)f.data)[0], 4096 % 251 + 1);
  f.release(&f, f.release_ctx);
}

static void test_truncated_file_reads_zeros(void **state) {
  (void)state;
  long pg = sysconf(_SC_PAGESIZE);
  char path[64], err[256];
  int fd = make_file(4, 0);
  proc_path(path, sizeof path, fd);
  beam_fmap_t *m = beam_fmap_open_proc(path, err, sizeof err);
  assert_non_null(m);
  const volatile uint8_t *p = beam_fmap_base(m);
  assert_int_equal(p[2 * pg + 5], (2 * pg + 5) % 251 + 1);
  assert_int_equal(ftruncate(fd, pg), 0);
  /* Page 1 was never read: past the new end it faults. */
  assert_int_equal(p[pg + 3], 0);
  assert_true(beam_fmap_damaged(m));
  assert_int_equal(p[3 * pg + 1], 0);
  assert_int_equal(p[100], 101); /* before the new end: the file's bytes */
  beam_fmap_unref(m);
  close(fd);
}

static void test_foreign_sigbus_still_kills(void **state) {
  (void)state;
  char path[64], err[256];
  int fd = make_file(1, 0);
  proc_path(path, sizeof path, fd);
  for (int how = 0; how < 2; how++) {
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
      /* The test runner catches SIGBUS itself: start from the default, then
       * map again so the module's handler is installed over it. */
      signal(SIGBUS, SIG_DFL);
      beam_fmap_t *m2 = beam_fmap_open_proc(path, err, sizeof err);
      if (!m2)
        _exit(3);
      if (how == 0)
        raise(SIGBUS);
      /* A mapping of our own, not the module's, past the end of a file. */
      long pg = sysconf(_SC_PAGESIZE);
      volatile uint8_t *q = mmap(NULL, 2 * pg, PROT_READ, MAP_SHARED, fd, 0);
      if (q != MAP_FAILED)
        (void)q[pg + 1];
      _exit(0);
    }
    int ws = 0;
    assert_int_equal(waitpid(c, &ws, 0), c);
    assert_true(WIFSIGNALED(ws));
    assert_int_equal(WTERMSIG(ws), SIGBUS);
  }
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_maps_hdf5_files_only),
      cmocka_unit_test(test_frame_keeps_mapping),
      cmocka_unit_test(test_truncated_file_reads_zeros),
      cmocka_unit_test(test_foreign_sigbus_still_kills),
  };
  return beam_run_tests(tests, NULL, NULL);
}
