/* Read-only file mappings for in-place chunk reads, and the SIGBUS guard
 * that keeps a truncated file from killing the process (filemap.h).
 *
 * The guard is a fixed table of address ranges that a signal handler can
 * scan without locks: an entry is claimed by a compare-and-swap on its
 * start and published by setting its end last, and it is cleared before
 * the range is unmapped. Frames hold references, so nothing reads a range
 * after its entry is gone. */
#include "daemon/filemap.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GUARD_SLOTS 256

struct beam_fmap_s {
  atomic_int refs;
  int fd;
  uint8_t *base;
  size_t size;
  dev_t dev;
  ino_t ino;
  int guard; /* entry in the guard table */
};

typedef struct guard_s {
  atomic_uintptr_t lo, hi; /* hi == 0: not yet published */
  atomic_int hit;
} guard_t;

static guard_t guards[GUARD_SLOTS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction prev; /* the handler ours replaced, for faults not ours */
static uintptr_t page_mask = ~(uintptr_t)4095; /* set before the handler exists */

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  uintptr_t a = (uintptr_t)si->si_addr;
  if (si->si_code > 0) {
    for (int i = 0; i < GUARD_SLOTS; i++) {
      uintptr_t lo = atomic_load(&guards[i].lo), hi = atomic_load(&guards[i].hi);
      if (!hi || a < lo || a >= hi)
        continue;
      /* Zero pages from the fault to the end: the reads that follow (the
       * rest of this frame, later frames) see zeros instead of faulting
       * one page at a time. mmap is a plain system call here. */
      uintptr_t pg = a & page_mask;
      if (mmap((void *)pg, hi - pg, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
        atomic_store(&guards[i].hit, 1);
        return;
      }
      break;
    }
  }
  /* Not ours: what would have happened without us. */
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, si, uc);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, NULL);
  if (si->si_code <= 0)
    raise(sig); /* sent by kill(): no instruction to fault again */
}

/* Installs the handler unless it is in place; checked at every mapping
 * because a library may have put its own in meanwhile (ours then passes
 * it the faults that are not ours). */
static int guard_install(void) {
  struct sigaction cur, sa;
  pthread_mutex_lock(&guard_mu);
  int ok = sigaction(SIGBUS, NULL, &cur) == 0;
  if (ok && !((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_sigbus)) {
    long pg = sysconf(_SC_PAGESIZE);
    if (pg > 0)
      page_mask = ~(uintptr_t)(pg - 1);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    prev = cur;
    ok = sigaction(SIGBUS, &sa, NULL) == 0;
  }
  pthread_mutex_unlock(&guard_mu);
  return ok;
}

static int guard_add(const void *p, size_t n) {
  if (!guard_install())
    return -1;
  for (int i = 0; i < GUARD_SLOTS; i++) {
    uintptr_t zero = 0;
    if (atomic_compare_exchange_strong(&guards[i].lo, &zero, (uintptr_t)p)) {
      atomic_store(&guards[i].hit, 0);
      atomic_store(&guards[i].hi, (uintptr_t)p + n);
      return i;
    }
  }
  return -1;
}

static void guard_del(int i) {
  atomic_store(&guards[i].hi, 0);
  atomic_store(&guards[i].lo, 0);
}

beam_fmap_t *beam_fmap_from_fd(int fd, char *err, size_t errlen) {
  struct stat st;
  if (fstat(fd, &st) < 0) {
    snprintf(err, errlen, "%s", strerror(errno));
    return NULL;
  }
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    snprintf(err, errlen, "not a regular file with data");
    return NULL;
  }
  beam_fmap_t *m = calloc(1, sizeof *m);
  if (!m) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  m->size = (size_t)st.st_size;
  m->base = m->fd < 0 ? MAP_FAILED
                      : mmap(NULL, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, m->fd, 0);
  if (m->base == MAP_FAILED) {
    snprintf(err, errlen, "mapping %zu bytes: %s", m->size, strerror(errno));
    if (m->fd >= 0)
      close(m->fd);
    free(m);
    return NULL;
  }
  m->guard = guard_add(m->base, m->size);
  if (m->guard < 0) {
    snprintf(err, errlen, "more than %d files mapped at once, or no SIGBUS handler",
             GUARD_SLOTS);
    munmap(m->base, m->size);
    close(m->fd);
    free(m);
    return NULL;
  }
  m->dev = st.st_dev;
  m->ino = st.st_ino;
  atomic_init(&m->refs, 1);
  return m;
}

/* HDF5 puts its superblock at 0 or after a user block of 512 x 2^k bytes. */
static int is_hdf5(int fd, off_t size) {
  static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  for (off_t at = 0; at + 8 <= size; at = at ? at * 2 : 512) {
    uint8_t b[8];
    if (pread(fd, b, 8, at) == 8 && !memcmp(b, sig, 8))
      return 1;
  }
  return 0;
}

int beam_proc_fd_path(const char *path) {
  int pid, n, end = 0;
  return sscanf(path, "/proc/%d/fd/%d%n", &pid, &n, &end) == 2 && !path[end] && pid > 0 && n >= 0;
}

beam_fmap_t *beam_fmap_open_proc(const char *path, char *err, size_t errlen) {
  if (!beam_proc_fd_path(path)) {
    snprintf(err, errlen, "%.100s is not /proc/PID/fd/N", path);
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "%.100s: %s (another host, user or pid namespace?)", path,
             strerror(errno));
    return NULL;
  }
  struct stat st;
  beam_fmap_t *m = NULL;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && !is_hdf5(fd, st.st_size)) {
    snprintf(err, errlen, "%.100s is not an HDF5 file", path);
  } else {
    char why[160];
    m = beam_fmap_from_fd(fd, why, sizeof why);
    if (!m)
      snprintf(err, errlen, "%.100s: %s", path, why);
  }
  close(fd);
  return m;
}

void beam_fmap_ref(beam_fmap_t *m) {
  atomic_fetch_add(&m->refs, 1);
}

void beam_fmap_unref(beam_fmap_t *m) {
  if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
    return;
  guard_del(m->guard);
  munmap(m->base, m->size);
  close(m->fd);
  free(m);
}

const uint8_t *beam_fmap_base(const beam_fmap_t *m) { return m->base; }
size_t beam_fmap_size(const beam_fmap_t *m) { return m->size; }
dev_t beam_fmap_dev(const beam_fmap_t *m) { return m->dev; }
ino_t beam_fmap_ino(const beam_fmap_t *m) { return m->ino; }

int beam_fmap_covers(const beam_fmap_t *m, uint64_t off, uint64_t len) {
  return off <= m->size && len <= m->size - off;
}

int beam_fmap_damaged(const beam_fmap_t *m) {
  return atomic_load(&guards[m->guard].hit);
}

static void release_fmap(beam_frame_t *f, void *ctx) {
  (void)f;
  beam_fmap_unref(ctx);
}

void beam_fmap_lend(beam_fmap_t *m, uint64_t off, beam_frame_t *f) {
  beam_fmap_ref(m);
  f->data = m->base + off;
  f->release = release_fmap;
  f->release_ctx = m;
}
