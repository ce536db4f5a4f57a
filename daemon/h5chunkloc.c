/* beamd's read-only POSIX file driver and the chunk locator built on it
 * (see h5chunkloc.h for why it exists).
 *
 * The driver follows HDF5 1.10.8's sec2 driver for everything it does
 * (pread, zeros past the end of file, flock, dev/ino comparison) so that
 * files read the same through it. Its one addition is the probe: while the
 * calling thread has it armed, a raw-data read is noted and not done.
 * Metadata reads (object headers, B-tree nodes) still go to the file,
 * because H5Dread_chunk needs them to find the chunk. */
#include "daemon/h5chunkloc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/h5util.h"

/* Largest address an off_t can reach, as sec2 computes it. */
#define LOC_MAXADDR ((haddr_t)(((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1))
/* Linux transfers at most this much per read call. */
#define LOC_MAX_IO ((size_t)0x7ffff000)

typedef struct loc_file_s {
  H5FD_t pub; /* first: HDF5 casts between H5FD_t * and this */
  int fd;
  haddr_t eoa, eof;
  dev_t dev;
  ino_t ino;
} loc_file_t;

/* One per thread: H5Dread_chunk runs the driver in the thread that called
 * it, so a locate in one thread never sees another thread's reads. */
typedef struct probe_s {
  int armed;
  int nraw;         /* raw reads seen while armed */
  int fd;           /* of the last one */
  haddr_t addr;
  size_t size;
  int asked;        /* while set, get_handle notes the file it was asked for */
  const loc_file_t *file;
} probe_t;
static _Thread_local probe_t probe;

#define PUSH(minor, ...)                                                                        \
  H5Epush2(H5E_DEFAULT, __FILE__, __func__, __LINE__, H5E_ERR_CLS, H5E_VFL, minor, __VA_ARGS__)

/* Worded like sec2's system errors so beam_h5_reason picks out the errno. */
#define PUSH_SYS(minor, what, e)                                                                \
  PUSH(minor, "%s, errno = %d, error message = '%s'", what, e, strerror(e))

static H5FD_t *loc_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  (void)fapl;
  if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF || maxaddr > LOC_MAXADDR) {
    PUSH(H5E_BADVALUE, "invalid file name or maximum address");
    return NULL;
  }
  if (flags & (H5F_ACC_RDWR | H5F_ACC_TRUNC | H5F_ACC_CREAT | H5F_ACC_EXCL)) {
    PUSH(H5E_CANTOPENFILE, "%s: beamd's chunk-locating driver is read-only", name);
    return NULL;
  }
  int fd = open(name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    char what[600];
    snprintf(what, sizeof what, "unable to open file: name = '%s'", name);
    PUSH_SYS(H5E_CANTOPENFILE, what, e);
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) < 0) {
    PUSH_SYS(H5E_BADFILE, "unable to fstat file", errno);
    close(fd);
    return NULL;
  }
  loc_file_t *f = calloc(1, sizeof *f);
  if (!f) {
    PUSH(H5E_CANTALLOC, "out of memory");
    close(fd);
    return NULL;
  }
  f->fd = fd;
  f->eof = (haddr_t)sb.st_size;
  f->dev = sb.st_dev;
  f->ino = sb.st_ino;
  return &f->pub;
}

static herr_t loc_close(H5FD_t *file) {
  loc_file_t *f = (loc_file_t *)file;
  int rc = close(f->fd);
  int e = errno;
  free(f);
  if (rc < 0) {
    PUSH_SYS(H5E_CANTCLOSEFILE, "unable to close file", e);
    return -1;
  }
  return 0;
}

/* HDF5 uses this to notice the same file opened twice (e.g. through an
 * external link back into an open file). */
static int loc_cmp(const H5FD_t *a, const H5FD_t *b) {
  const loc_file_t *x = (const loc_file_t *)a, *y = (const loc_file_t *)b;
  if (x->dev != y->dev)
    return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino)
    return x->ino < y->ino ? -1 : 1;
  return 0;
}

/* sec2's read features: the metadata accumulator and the sieve buffer cut
 * small reads, and the handle is a POSIX fd. The allocation features are
 * left out since nothing is ever allocated in a read-only file. */
static herr_t loc_query(const H5FD_t *file, unsigned long *flags) {
  (void)file;
  if (flags)
    *flags = H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_POSIX_COMPAT_HANDLE |
             H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
  return 0;
}

static haddr_t loc_get_eoa(const H5FD_t *file, H5FD_mem_t type) {
  (void)type;
  return ((const loc_file_t *)file)->eoa;
}

static herr_t loc_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr) {
  (void)type;
  ((loc_file_t *)file)->eoa = addr;
  return 0;
}

static haddr_t loc_get_eof(const H5FD_t *file, H5FD_mem_t type) {
  (void)type;
  return ((const loc_file_t *)file)->eof;
}

static herr_t loc_get_handle(H5FD_t *file, hid_t fapl, void **handle) {
  (void)fapl;
  if (!handle) {
    PUSH(H5E_BADVALUE, "file handle not valid");
    return -1;
  }
  if (probe.asked)
    probe.file = (const loc_file_t *)file;
  *handle = &((loc_file_t *)file)->fd;
  return 0;
}

static herr_t loc_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                       void *buf) {
  loc_file_t *f = (loc_file_t *)file;
  (void)dxpl;
  /* The library maps global-heap reads onto H5FD_MEM_DRAW as well, but
   * H5Dread_chunk reads no global heap: the dataset's layout is in memory
   * and the chunk index is B-tree, array or header metadata. */
  if (probe.armed && type == H5FD_MEM_DRAW) {
    probe.nraw++;
    probe.fd = f->fd;
    probe.addr = addr;
    probe.size = size;
    return 0;
  }
  if (addr == HADDR_UNDEF || addr > LOC_MAXADDR || size > LOC_MAXADDR - addr) {
    PUSH(H5E_OVERFLOW, "addr overflow, addr = %llu, size = %zu", (unsigned long long)addr, size);
    return -1;
  }
  unsigned char *p = buf;
  off_t at = (off_t)addr;
  size_t total = size;
  while (size > 0) {
    size_t want = size < LOC_MAX_IO ? size : LOC_MAX_IO;
    ssize_t got;
    do
      got = pread(f->fd, p, want, at);
    while (got < 0 && errno == EINTR);
    if (got < 0) {
      PUSH_SYS(H5E_READERROR, "file read failed", errno);
      return -1;
    }
    /* HDF5 may read a metadata block that ends past the end of the file
     * (the accumulator rounds reads up); the missing part reads as zeros.
     * Raw data never lies past the end HDF5 checked at open, so there it
     * means the file was cut short since: zeros would pass for pixels. */
    if (got == 0) {
      if (type == H5FD_MEM_DRAW) {
        PUSH(H5E_READERROR, "bytes %llu..%llu lie past the end of the file: it was cut short "
             "after it was opened", (unsigned long long)addr, (unsigned long long)(addr + total));
        return -1;
      }
      memset(p, 0, size);
      break;
    }
    size -= (size_t)got;
    p += got;
    at += got;
  }
  return 0;
}

static herr_t loc_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size,
                        const void *buf) {
  (void)file, (void)type, (void)dxpl, (void)addr, (void)size, (void)buf;
  PUSH(H5E_WRITEERROR, "beamd's chunk-locating driver is read-only");
  return -1;
}

static herr_t loc_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing) {
  (void)file, (void)dxpl, (void)closing;
  PUSH(H5E_CANTUPDATE, "beamd's chunk-locating driver is read-only");
  return -1;
}

/* A shared lock whatever HDF5 asks for: the file is never written here. */
static herr_t loc_lock(H5FD_t *file, hbool_t rw) {
  (void)rw;
  if (flock(((loc_file_t *)file)->fd, LOCK_SH | LOCK_NB) < 0 && errno != ENOSYS) {
    PUSH_SYS(H5E_CANTLOCKFILE, "unable to lock file", errno);
    return -1;
  }
  return 0;
}

static herr_t loc_unlock(H5FD_t *file) {
  if (flock(((loc_file_t *)file)->fd, LOCK_UN) < 0 && errno != ENOSYS) {
    PUSH_SYS(H5E_CANTUNLOCKFILE, "unable to unlock file", errno);
    return -1;
  }
  return 0;
}

/* Positional initialisers would follow H5FD_class_t's field order, which
 * changes between HDF5 releases (1.12 and 1.14 add fields); designated ones
 * fail to compile instead of filling the wrong slots. */
static const H5FD_class_t loc_class = {
    .name = "beamd_chunkloc",
    .maxaddr = LOC_MAXADDR,
    .fc_degree = H5F_CLOSE_WEAK,
    .open = loc_open,
    .close = loc_close,
    .cmp = loc_cmp,
    .query = loc_query,
    .get_eoa = loc_get_eoa,
    .set_eoa = loc_set_eoa,
    .get_eof = loc_get_eof,
    .get_handle = loc_get_handle,
    .read = loc_read,
    .write = loc_write,
    .truncate = loc_truncate,
    .lock = loc_lock,
    .unlock = loc_unlock,
    .fl_map = H5FD_FLMAP_DICHOTOMY,
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static hid_t reg_id = -1;

/* The id dies with the library (H5close, or HDF5's atexit), so it is
 * checked rather than kept for good. */
static hid_t driver_id(void) {
  pthread_mutex_lock(&reg_lock);
  if (reg_id < 0 || H5Iis_valid(reg_id) <= 0)
    reg_id = H5FDregister(&loc_class);
  hid_t id = reg_id;
  pthread_mutex_unlock(&reg_lock);
  return id;
}

hid_t beam_h5loc_fapl(void) {
  hid_t id = driver_id();
  if (id < 0)
    return -1;
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0)
    return -1;
  if (H5Pset_driver(fapl, id, NULL) < 0) {
    H5Pclose(fapl);
    return -1;
  }
  return fapl;
}

static void say(char *why, size_t wl, const char *msg) {
  if (why && wl)
    snprintf(why, wl, "%s", msg);
}

static int fail_h5(char *why, size_t wl, const char *what) {
  char r[512];
  beam_h5_reason(r, sizeof r, NULL);
  if (why && wl)
    snprintf(why, wl, "%s: %s", what, r);
  return -1;
}

/* The descriptor of the file holding dset when that file was opened with
 * our driver, else -1. This must hold before the probe runs: through any
 * other driver H5Dread_chunk would write the whole chunk into the probe's
 * few bytes of buffer. Our get_handle notes the file it was asked about;
 * through another driver the note stays empty. That costs 0.2 us, where
 * comparing H5Pget_driver of H5Fget_access_plist costs 4.6 us (the list is
 * copied), four times the rest of a locate. */
static int our_fd(hid_t dset, char *why, size_t wl) {
  hid_t file = H5Iget_file_id(dset);
  if (file < 0)
    return fail_h5(why, wl, "H5Iget_file_id");
  void *h = NULL;
  probe.asked = 1;
  probe.file = NULL;
  herr_t hr = H5Fget_vfd_handle(file, H5P_DEFAULT, &h);
  const loc_file_t *f = probe.file;
  probe.asked = 0;
  H5Fclose(file);
  if (hr < 0)
    return fail_h5(why, wl, "H5Fget_vfd_handle");
  if (!f || h != (const void *)&f->fd) {
    say(why, wl, "the dataset's file was not opened with beam_h5loc_fapl()");
    return -1;
  }
  return f->fd;
}

/* HDF5 1.10.8 does not check: H5Dget_chunk_storage_size reads past the end
 * of a fixed-array index (AddressSanitizer shows it) and returns whatever
 * lies there, and the index walk answers "never written". */
static int inside(hid_t dset, const hsize_t *off, char *why, size_t wl) {
  hid_t sp = H5Dget_space(dset);
  if (sp < 0)
    return fail_h5(why, wl, "H5Dget_space");
  hsize_t dims[H5S_MAX_RANK];
  int nd = H5Sget_simple_extent_dims(sp, dims, NULL);
  H5Sclose(sp);
  if (nd < 0)
    return fail_h5(why, wl, "H5Sget_simple_extent_dims");
  for (int k = 0; k < nd; k++)
    if (off[k] >= dims[k]) {
      say(why, wl, "chunk offset outside the dataset");
      return -1;
    }
  return 0;
}

static _Thread_local void *scratch; /* the probe's buffer, per thread, kept */
static _Thread_local size_t scratch_cap;

int beam_h5loc_chunk(hid_t dset, const hsize_t *off, int *fd, uint64_t *addr, uint64_t *size,
                     unsigned *mask, char *why, size_t wl) {
  int hfd = our_fd(dset, why, wl);
  if (hfd < 0 || inside(dset, off, why, wl) < 0)
    return -1;
  hsize_t n;
  int rc = beam_h5_chunk_size(dset, off, &n, why, wl);
  if (rc <= 0)
    return rc;

  /* The buffer H5Dread_chunk is given is as large as the chunk, so that a
   * read HDF5 did after all (one the probe did not catch) cannot write past
   * it; it is never touched otherwise, so its pages cost nothing. Its start
   * carries a pattern that shows such a read. */
  if (n > scratch_cap) {
    void *p = mmap(NULL, (size_t)n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      say(why, wl, "no address space for the probe buffer");
      return -1;
    }
    if (scratch)
      munmap(scratch, scratch_cap);
    scratch = p;
    scratch_cap = (size_t)n;
  }
  unsigned char *dummy = scratch;
  size_t ndummy = n < 64 ? (size_t)n : 64;
  memset(dummy, 0xa5, ndummy);
  uint32_t filters = 0;
  probe = (probe_t){.armed = 1, .fd = -1};
  herr_t hr = H5Dread_chunk(dset, H5P_DEFAULT, off, &filters, dummy);
  probe_t seen = probe;
  probe.armed = 0;
  if (hr < 0)
    return fail_h5(why, wl, "H5Dread_chunk");

  for (size_t i = 0; i < ndummy; i++)
    if (dummy[i] != 0xa5) {
      say(why, wl, "H5Dread_chunk wrote into the probe buffer: the driver missed the read");
      return -1;
    }
  if (seen.nraw != 1 || seen.size != n || seen.fd != hfd) {
    if (why && wl)
      snprintf(why, wl,
               "H5Dread_chunk did %d raw reads (last of %zu bytes, fd %d) where one of %llu "
               "from fd %d was expected",
               seen.nraw, seen.size, seen.fd, (unsigned long long)n, hfd);
    return -1;
  }
  *fd = seen.fd;
  *addr = seen.addr;
  *size = seen.size;
  *mask = filters;
  return 1;
}
