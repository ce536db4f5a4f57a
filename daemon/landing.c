/* The replay input's landing area (PROTOCOL.md section 13.6): a memfd of
 * equal slots that a beamd-replay on this host maps and reads payloads
 * into, so a raw frame reaches the stages with no copy after the server's
 * H5Dread_chunk, and a compressed one is decoded straight from it.
 *
 * A frame borrows its slot like it borrows a ZeroMQ message (ingest.c):
 * the slot returns to the free list when the frame's payload is released,
 * which lazy decode does as soon as the pixels are out. Release happens on
 * stage threads, hence the lock; a slot is taken on the loop thread only.
 * The area is reference counted by its owner and by every borrowed slot,
 * so frames still in a graph outlive the replay input safely.
 *
 * A memfd rather than a named /dev/shm file: nothing is left behind when
 * the daemon is killed, and it is not bounded by the size of /dev/shm
 * (64 MiB in many containers). The server opens it as /proc/PID/fd/N,
 * which needs the same user (or CAP_SYS_PTRACE) and the same pid
 * namespace; otherwise it says so and payloads travel inline. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/beamd.h"

typedef struct land_slot_s {
  beamd_landing_t *l;
  unsigned idx;
} land_slot_t;

struct beamd_landing_s {
  atomic_int refs;
  int fd;
  uint8_t *base;
  size_t slot_bytes, size;
  pthread_mutex_t mu;
  unsigned *free_list, nfree;
  land_slot_t *desc;
  char path[64];
};

static void landing_unref(beamd_landing_t *l) {
  if (!l || atomic_fetch_sub(&l->refs, 1) != 1)
    return;
  munmap(l->base, l->size);
  close(l->fd);
  pthread_mutex_destroy(&l->mu);
  free(l->free_list);
  free(l->desc);
  free(l);
}

beamd_landing_t *beamd_landing_new(unsigned nslots, size_t slot_bytes, int prefault, char *err,
                                   size_t errlen) {
  long page = sysconf(_SC_PAGESIZE);
  size_t pg = page > 0 ? (size_t)page : 4096;
  slot_bytes = (slot_bytes + pg - 1) / pg * pg; /* slots start on pages: aligned for any load */
  if (!nslots || slot_bytes > SIZE_MAX / nslots) {
    snprintf(err, errlen, "landing area: %u slots of %zu bytes", nslots, slot_bytes);
    return NULL;
  }
  beamd_landing_t *l = calloc(1, sizeof *l);
  if (!l) {
    snprintf(err, errlen, "landing area: out of memory");
    return NULL;
  }
  l->fd = memfd_create(BEAM_SHM_MEMFD_NAME, MFD_CLOEXEC);
  l->size = slot_bytes * nslots;
  l->free_list = calloc(nslots, sizeof *l->free_list);
  l->desc = calloc(nslots, sizeof *l->desc);
  /* ftruncate makes a sparse file: pages are allocated when first written,
   * as the input pool's are, unless pool.prefault asks for them now
   * (fallocate, then MAP_POPULATE for our page tables). */
  if (l->fd < 0 || !l->free_list || !l->desc || ftruncate(l->fd, (off_t)l->size) < 0 ||
      (prefault && fallocate(l->fd, 0, 0, (off_t)l->size) < 0) ||
      (l->base = mmap(NULL, l->size, PROT_READ | PROT_WRITE, MAP_SHARED | (prefault ? MAP_POPULATE : 0),
                      l->fd, 0)) == MAP_FAILED) {
    snprintf(err, errlen, "landing area of %u x %zu bytes: %s", nslots, slot_bytes, strerror(errno));
    if (l->fd >= 0)
      close(l->fd);
    free(l->free_list);
    free(l->desc);
    free(l);
    return NULL;
  }
  atomic_init(&l->refs, 1);
  pthread_mutex_init(&l->mu, NULL);
  l->slot_bytes = slot_bytes;
  /* Handed out lowest first, so a slow stream keeps touching the same few
   * slots and little of the area becomes resident. */
  for (unsigned i = 0; i < nslots; i++) {
    l->free_list[i] = nslots - 1 - i;
    l->desc[i] = (land_slot_t){l, i};
  }
  l->nfree = nslots;
  snprintf(l->path, sizeof l->path, "/proc/%ld/fd/%d", (long)getpid(), l->fd);
  return l;
}

void beamd_landing_close(beamd_landing_t **l) {
  landing_unref(*l);
  *l = NULL;
}

const char *beamd_landing_path(const beamd_landing_t *l) { return l->path; }
size_t beamd_landing_size(const beamd_landing_t *l) { return l->size; }
size_t beamd_landing_slot_bytes(const beamd_landing_t *l) { return l->slot_bytes; }
uint8_t *beamd_landing_ptr(const beamd_landing_t *l, unsigned idx) {
  return l->base + (size_t)idx * l->slot_bytes;
}

int beamd_landing_take(beamd_landing_t *l, unsigned *idx) {
  pthread_mutex_lock(&l->mu);
  int ok = l->nfree > 0;
  if (ok)
    *idx = l->free_list[--l->nfree];
  pthread_mutex_unlock(&l->mu);
  return ok ? 0 : -1;
}

void beamd_landing_put(beamd_landing_t *l, unsigned idx) {
  pthread_mutex_lock(&l->mu);
  l->free_list[l->nfree++] = idx;
  pthread_mutex_unlock(&l->mu);
}

static void release_slot(beam_frame_t *f, void *ctx) {
  (void)f;
  land_slot_t *s = ctx;
  beamd_landing_t *l = s->l;
  beamd_landing_put(l, s->idx);
  landing_unref(l);
}

void beamd_landing_lend(beamd_landing_t *l, unsigned idx, beam_frame_t *f) {
  atomic_fetch_add(&l->refs, 1);
  f->data = beamd_landing_ptr(l, idx);
  f->release = release_slot;
  f->release_ctx = &l->desc[idx];
}
