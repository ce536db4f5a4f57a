/* Read-only mappings of data files whose chunks are read in place
 * (PROTOCOL.md section 13.8): the replay server checks compressed chunks
 * from its mapping, and beamd's replay input hands stages pointers into
 * its own, so a frame's bytes go from the page cache to the stage that
 * reads them without being copied.
 *
 * A file that shrinks under a mapping turns reads past its new end into
 * SIGBUS. A process that maps through this module gets a SIGBUS handler
 * that, for an address inside one of these mappings, puts zero pages over
 * the rest of that mapping and marks it damaged (beam_fmap_damaged), so a
 * replay whose file was truncated behind its back reports it instead of
 * taking the daemon down. Any other SIGBUS keeps its default action. */
#ifndef BEAM_FILEMAP_H
#define BEAM_FILEMAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "pipeline/frame.h"

typedef struct beam_fmap_s beam_fmap_t;

/* Maps the whole regular file open at fd (duplicated: the caller keeps
 * its fd). The mapping is private and writable, so a stage that writes
 * into a frame in place gets its own copy of the page instead of a fault;
 * the file is never written. Returns NULL with err set. */
beam_fmap_t *beam_fmap_from_fd(int fd, char *err, size_t errlen);

/* 1 when path is exactly /proc/PID/fd/N (PID > 0): a descriptor another
 * process holds, the only form in which peers name files to each other
 * (landing areas, files read in place). */
int beam_proc_fd_path(const char *path);

/* Opens a /proc/PID/fd/N path (a descriptor another process of this user
 * holds) and maps it when it is a regular HDF5 file (the signature at 0,
 * 512, 1024, ...): a peer can make us read only what it could have sent
 * itself, and only HDF5 files. Returns NULL with err set. */
beam_fmap_t *beam_fmap_open_proc(const char *path, char *err, size_t errlen);

void beam_fmap_ref(beam_fmap_t *m);
void beam_fmap_unref(beam_fmap_t *m); /* any thread; the last unmaps */

const uint8_t *beam_fmap_base(const beam_fmap_t *m);
size_t beam_fmap_size(const beam_fmap_t *m);
/* The file's identity, to tell whether a path still names it. */
dev_t beam_fmap_dev(const beam_fmap_t *m);
ino_t beam_fmap_ino(const beam_fmap_t *m);
/* Bytes [off, off + len) lie inside the mapping. */
int beam_fmap_covers(const beam_fmap_t *m, uint64_t off, uint64_t len);
/* A SIGBUS inside the mapping zero-filled it from the faulting page on. */
int beam_fmap_damaged(const beam_fmap_t *m);

/* Frame f borrows bytes at off (covered): f->data points into the mapping,
 * which stays mapped until f's release. */
void beam_fmap_lend(beam_fmap_t *m, uint64_t off, beam_frame_t *f);

#endif
