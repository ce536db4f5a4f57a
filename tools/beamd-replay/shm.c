/* The consumer's landing area (PROTOCOL.md section 13.6): a memfd that a
 * beamd on this host maps and offers slots of, so payloads are read from
 * the file straight into memory the daemon will process them in, with no
 * socket copy on either side.
 *
 * The request names the area by a /proc/PID/fd/N path. That name comes
 * from whoever can reach our REP socket, so it is trusted only when it
 * resolves to a memfd whose name says beamd made it: anything else (a
 * regular file, a device) would let a client make us overwrite it. The
 * mapping is kept between requests and re-made when the path names another
 * file (a restarted daemon can get the same pid and fd number). */
#include "tools/beamd-replay/replay.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MEMFD_PREFIX "/memfd:" RP_SHM_NAME

void rp_shm_detach(rp_shm_t *m) {
  if (m->base)
    munmap(m->base, m->size);
  if (m->fd >= 0)
    close(m->fd);
  m->base = NULL;
  m->fd = -1;
  m->size = 0;
  m->path[0] = 0;
}

static int is_landing(const char *path, char *why, size_t wl) {
  if (!beam_proc_fd_path(path)) {
    snprintf(why, wl, "shm path %.100s is not /proc/PID/fd/N", path);
    return 0;
  }
  char target[256];
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n < 0) {
    snprintf(why, wl, "shm path %.100s: %s (another host, user or pid namespace?)", path,
             strerror(errno));
    return 0;
  }
  target[n] = 0;
  if (strncmp(target, MEMFD_PREFIX, strlen(MEMFD_PREFIX)) != 0) {
    snprintf(why, wl, "shm path %.100s is not a beamd landing area (it is %.100s)", path, target);
    return 0;
  }
  return 1;
}

uint8_t *rp_shm_attach(rp_shm_t *m, const char *path, size_t size, char *why, size_t wl) {
  struct stat st;
  if (m->base && !strcmp(m->path, path) && stat(path, &st) == 0 && st.st_ino == m->ino &&
      st.st_dev == m->dev && m->size == size)
    return m->base;
  rp_shm_detach(m);
  if (!is_landing(path, why, wl))
    return NULL;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    snprintf(why, wl, "shm path %.100s: %s", path, strerror(errno));
    return NULL;
  }
  if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < size) {
    snprintf(why, wl, "shm area %.100s is smaller than the %zu bytes the request names", path,
             size);
    close(fd);
    return NULL;
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(why, wl, "mapping shm area %.100s (%zu bytes): %s", path, size, strerror(errno));
    close(fd);
    return NULL;
  }
  m->base = p;
  m->size = size;
  m->fd = fd;
  m->dev = st.st_dev;
  m->ino = st.st_ino;
  snprintf(m->path, sizeof m->path, "%s", path);
  return m->base;
}
