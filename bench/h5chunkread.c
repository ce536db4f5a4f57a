/* h5chunkread: how fast this machine reads the frames of an HDF5 file, the
 * yardstick for the replay benchmark (bench/replay.py).
 *
 * The default mode reads every chunk of a (frames, y, x) dataset as stored
 * with H5Dread_chunk, which is what beamd-replay does for forwarded chunks
 * (one frame per chunk, no filter or LZ4/bitshuffle-LZ4): no decompression,
 * one read into one reused buffer. `--decode` reads each frame with H5Dread
 * through the filter pipeline instead (the plugin must be on
 * HDF5_PLUGIN_PATH), which shows what decompressing on the reading side
 * would cost. `--beam-decode` reads the chunk as stored and decodes it with
 * beamd's own decoder (beam_codec_decode, the codec taken from the
 * dataset's filter: 32004 lz4, 32008 bslz4), one thread: what one beamd
 * stage thread pays per frame for lazy decode. Passes over the file repeat until --min-seconds have passed, so
 * a file that sits in the page cache still gives a steady figure.
 *
 * `--ring N` reads frame k into buffer k % N of N, the way any reader that
 * keeps frames in flight (a pool of N slots) must: each frame lands in
 * memory that is no longer in cache, where the one reused buffer stays hot.
 * It shows how much of the yardstick a consumer holding frames can reach.
 *
 * Prints one JSON line: frames, passes, stored and decoded bytes, seconds
 * (first read to last; opening and touching the buffers are not counted),
 * frames/s and GB/s of decoded frame bytes, the figure beamd's throughput
 * is compared with. Not a general HDF5 reader:
 * chunked 3-D datasets with chunks of one frame only. */
#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_stage.h"
#include "proto/proto.h"

static void usage(FILE *f) {
  fprintf(f, "usage: h5chunkread FILE [--dataset PATH] [--min-seconds S] [--ring N]\n"
             "                   [--decode | --beam-decode]\n"
             "Reads every frame chunk of FILE (default dataset /entry/data/data) and prints\n"
             "one JSON line with frames/s and GB/s.\n");
}

typedef struct {
  const char *file, *dataset;
  double min_s;
  int decode;      /* H5Dread through the filter */
  int beam_decode; /* H5Dread_chunk + beam_codec_decode */
  unsigned ring;   /* buffers read into in turn */
} opts_t;

static int parse(int argc, char **argv, opts_t *o) {
  o->file = NULL;
  o->dataset = "/entry/data/data";
  o->min_s = 1.0;
  o->decode = 0;
  o->beam_decode = 0;
  o->ring = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--dataset") && i + 1 < argc) {
      o->dataset = argv[++i];
    } else if (!strcmp(a, "--min-seconds") && i + 1 < argc) {
      char *end;
      o->min_s = strtod(argv[++i], &end);
      if (*end || !(o->min_s >= 0 && o->min_s <= 3600)) {
        fprintf(stderr, "h5chunkread: --min-seconds: expected 0..3600, got \"%s\"\n", argv[i]);
        return -1;
      }
    } else if (!strcmp(a, "--ring") && i + 1 < argc) {
      char *end;
      unsigned long n = strtoul(argv[++i], &end, 10);
      if (*end || n < 1 || n > 65536) {
        fprintf(stderr, "h5chunkread: --ring: expected 1..65536, got \"%s\"\n", argv[i]);
        return -1;
      }
      o->ring = (unsigned)n;
    } else if (!strcmp(a, "--decode")) {
      o->decode = 1;
    } else if (!strcmp(a, "--beam-decode")) {
      o->beam_decode = 1;
    } else if (a[0] != '-' && !o->file) {
      o->file = a;
    } else {
      fprintf(stderr, "h5chunkread: unexpected argument \"%s\"\n", a);
      return -1;
    }
  }
  if (!o->file) {
    fprintf(stderr, "h5chunkread: no FILE given\n");
    return -1;
  }
  if (o->decode && o->beam_decode) {
    fprintf(stderr, "h5chunkread: --decode and --beam-decode exclude each other\n");
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  opts_t o;
  if (parse(argc, argv, &o) < 0) {
    usage(stderr);
    return 2;
  }
  int rc = 1;
  hid_t f = -1, d = -1, space = -1, dcpl = -1, type = -1, mspace = -1;
  void *buf = NULL, *pix = NULL, *scratch = NULL;
  double t0 = bench_now_s();
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* our messages name the file and dataset */
  if ((f = H5Fopen(o.file, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
    fprintf(stderr, "h5chunkread: %s: cannot open as HDF5\n", o.file);
    goto out;
  }
  if ((d = H5Dopen2(f, o.dataset, H5P_DEFAULT)) < 0) {
    fprintf(stderr, "h5chunkread: %s: no dataset %s\n", o.file, o.dataset);
    goto out;
  }
  space = H5Dget_space(d);
  dcpl = H5Dget_create_plist(d);
  type = H5Dget_type(d);
  hsize_t dims[3], chunk[3];
  if (H5Sget_simple_extent_ndims(space) != 3 || H5Pget_layout(dcpl) != H5D_CHUNKED ||
      H5Pget_chunk(dcpl, 3, chunk) != 3 || chunk[0] != 1) {
    fprintf(stderr, "h5chunkread: %s:%s: need a 3-D dataset chunked one frame per chunk\n",
            o.file, o.dataset);
    goto out;
  }
  H5Sget_simple_extent_dims(space, dims, NULL);
  size_t elem = H5Tget_size(type);
  size_t frame_bytes = (size_t)(dims[1] * dims[2]) * elem;
  if (dims[0] == 0 || chunk[1] != dims[1] || chunk[2] != dims[2]) {
    fprintf(stderr, "h5chunkread: %s:%s: empty, or chunks smaller than a frame\n", o.file,
            o.dataset);
    goto out;
  }
  /* A compressed chunk can exceed the frame when the data does not
   * compress; the largest stored chunk sizes the buffer. */
  size_t cap = frame_bytes;
  for (hsize_t k = 0; k < dims[0]; k++) {
    hsize_t off[3] = {k, 0, 0}, nb = 0;
    if (H5Dget_chunk_storage_size(d, off, &nb) >= 0 && nb > cap)
      cap = (size_t)nb;
  }
  size_t stride = (cap + 4095) & ~(size_t)4095;
  if (!(buf = malloc(stride * o.ring))) {
    fprintf(stderr, "h5chunkread: out of memory (%zu bytes)\n", stride * o.ring);
    goto out;
  }
  /* Pages faulted in before the clock starts; not with zeros, which a
   * hypervisor may keep unbacked until the first other write. */
  memset(buf, 0xa5, stride * o.ring);
  beam_codec_t codec = BEAM_CODEC_RAW;
  if (o.beam_decode) {
    int nf = H5Pget_nfilters(dcpl);
    unsigned flags, cd[8];
    size_t ncd = 8;
    H5Z_filter_t id = nf == 1 ? H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, 0, NULL, NULL) : -1;
    if (id == 32004)
      codec = BEAM_CODEC_LZ4;
    else if (id == 32008 && ncd >= 5 && cd[4] == 2)
      codec = BEAM_CODEC_BSLZ4;
    else {
      fprintf(stderr, "h5chunkread: %s:%s: --beam-decode needs exactly one lz4 (32004) or "
                      "bitshuffle-lz4 (32008) filter\n", o.file, o.dataset);
      goto out;
    }
    if (!(pix = malloc(frame_bytes)) || !(scratch = malloc(frame_bytes))) {
      fprintf(stderr, "h5chunkread: out of memory (%zu bytes)\n", frame_bytes);
      goto out;
    }
  }
  void *const buf0 = buf;
  hsize_t one[3] = {1, dims[1], dims[2]};
  mspace = H5Screate_simple(3, one, NULL);
  uint64_t frames = 0, stored = 0, passes = 0;
  t0 = bench_now_s(); /* after the buffers were touched */
  double t1 = t0;
  do {
    for (hsize_t k = 0; k < dims[0]; k++) {
      hsize_t off[3] = {k, 0, 0};
      void *buf = (char *)buf0 + (size_t)(frames % o.ring) * stride;
      if (o.decode) {
        if (H5Sselect_hyperslab(space, H5S_SELECT_SET, off, NULL, one, NULL) < 0 ||
            H5Dread(d, type, mspace, space, H5P_DEFAULT, buf) < 0) {
          fprintf(stderr, "h5chunkread: %s:%s: frame %llu: H5Dread failed (filter plugin missing?)\n",
                  o.file, o.dataset, (unsigned long long)k);
          goto out;
        }
        stored += frame_bytes;
      } else {
        hsize_t nb = 0;
        uint32_t mask = 0;
        if (H5Dget_chunk_storage_size(d, off, &nb) < 0 ||
            H5Dread_chunk(d, H5P_DEFAULT, off, &mask, buf) < 0) {
          fprintf(stderr, "h5chunkread: %s:%s: frame %llu: H5Dread_chunk failed\n", o.file,
                  o.dataset, (unsigned long long)k);
          goto out;
        }
        stored += nb;
        const char *why = NULL;
        if (o.beam_decode &&
            beam_codec_decode(codec, buf, (size_t)nb, pix, frame_bytes, elem, scratch, &why) < 0) {
          fprintf(stderr, "h5chunkread: %s:%s: frame %llu: %s\n", o.file, o.dataset,
                  (unsigned long long)k, why ? why : "cannot decode");
          goto out;
        }
      }
      frames++;
    }
    passes++;
    t1 = bench_now_s();
  } while (t1 - t0 < o.min_s);
  double secs = t1 - t0;
  printf("{\"file\":\"%s\",\"mode\":\"%s\",\"frames\":%llu,\"passes\":%llu,\"frame_bytes\":%zu,"
         "\"ring\":%u,\"stored_bytes\":%llu,\"seconds\":%.6f,\"fps\":%.3f,\"gbps\":%.4f,"
         "\"stored_gbps\":%.4f}\n",
         o.file, o.decode ? "decode" : o.beam_decode ? "beam_decode" : "chunk", (unsigned long long)frames,
         (unsigned long long)passes, frame_bytes, o.ring, (unsigned long long)stored, secs,
         (double)frames / secs, (double)frames * (double)frame_bytes / secs / 1e9,
         (double)stored / secs / 1e9);
  rc = 0;
out:
  free(buf);
  free(pix);
  free(scratch);
  if (mspace >= 0)
    H5Sclose(mspace);
  if (type >= 0)
    H5Tclose(type);
  if (dcpl >= 0)
    H5Pclose(dcpl);
  if (space >= 0)
    H5Sclose(space);
  if (d >= 0)
    H5Dclose(d);
  if (f >= 0)
    H5Fclose(f);
  return rc;
}
