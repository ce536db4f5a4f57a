/* Where a stored HDF5 chunk lies in its file, so that a consumer can mmap
 * the file and read the chunk in place instead of having it copied.
 *
 * HDF5 1.10.8 (Debian 12) has no cheap public way to ask for a chunk's
 * address: H5Dget_chunk_info_by_coord walks the whole chunk index up to the
 * chunk (170 us at frame 16,000) and H5Dchunk_iter only came in 1.14. Its
 * H5Dread_chunk, though, looks the chunk up in O(log n) and then does exactly
 * one raw-data read of (address, stored size) through the file driver. So
 * files opened with beam_h5loc_fapl() use our own read-only POSIX driver,
 * and beam_h5loc_chunk() runs H5Dread_chunk with that driver told to note
 * the raw read instead of doing it.
 *
 * Not a general driver: read-only (create, read-write, write and truncate
 * are refused), no SWMR, no file images. HDF5 is thread-safe in Debian's
 * build and the driver runs in the calling thread, so several threads may
 * locate chunks at once. */
#ifndef BEAM_H5CHUNKLOC_H
#define BEAM_H5CHUNKLOC_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

/* A new file access property list that selects beamd's read-only POSIX
 * driver (registered on first use, once per process and again after an
 * H5close; safe to call from several threads). Files opened through it read
 * like sec2 files, and external links followed from them open their target
 * files with the same driver unless the link access list says otherwise.
 * The caller H5Pclose()s it. -1 on failure (the reason is on the calling
 * thread's HDF5 error stack). */
hid_t beam_h5loc_fapl(void);

/* Locates the stored chunk of chunked dataset dset whose first element is at
 * dataset coordinates off (one value per dimension).
 *
 * Returns 1 when located, with
 *   *fd   the driver's descriptor of the file that holds the chunk (for an
 *         external link, the linked file, not the master). It belongs to
 *         HDF5 and stays valid while that file is open: dup() it to keep it.
 *   *addr absolute byte offset of the chunk in that file (a user block, if
 *         any, included, unlike H5Dget_chunk_info_by_coord's address);
 *   *size stored (possibly compressed) bytes;
 *   *mask filter mask, bit i set when filter i was skipped for this chunk.
 * Returns 0 when the chunk was never written (outputs untouched), -1 on error
 * with a reason in why (wl bytes, may be 0): HDF5 failures, off outside the
 * dataset, a file not opened with beam_h5loc_fapl, or HDF5 not doing the one
 * raw read expected. Reads no chunk bytes; the HDF5 error stack is left
 * clear. About 1 us (v1 B-tree or extensible array, 16,000 chunks); a chunk
 * never written costs the index walk of H5Dget_chunk_info_by_coord.
 * Like H5Dread_chunk, it drops the chunk from the dataset's chunk cache. */
int beam_h5loc_chunk(hid_t dset, const hsize_t *off, int *fd, uint64_t *addr, uint64_t *size,
                     unsigned *mask, char *why, size_t wl);

#endif
