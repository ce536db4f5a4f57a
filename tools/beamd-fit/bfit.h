/* beamd-fit internals, shared by the tool's own files only.
 *
 * The job in four steps (docs/fit.md "beamd-fit"):
 *   input.c     every rank opens the scan (tools/beamd-replay/h5src.c, so
 *               the same layouts and codecs as beamd-replay), reads x, the
 *               mask and ROI, then reads and decodes its own chunk-aligned
 *               frame range once, keeping only the selected pixels in the
 *               file's element type (the "slab")
 *   exchange.c  the pixel tiles and one round of the all-to-all: each rank
 *               sends every other rank its frames of that rank's tile, so
 *               every rank ends with one tile x all frames, frame-major
 *   solve.c     the tile fitted by beam_fit_cpu_range on T threads
 *   maps.c      rank 0 creates MAPS.h5 and writes each gathered tile
 */
#ifndef BEAMD_FIT_TOOL_H
#define BEAMD_FIT_TOOL_H

#include <hdf5.h>
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "pipeline/fit.h"
#include "proto/err.h"
#include "tools/beamd-replay/replay.h"

/* BF_AUTO is resolved per rank in main (CUDA when this rank sees a device). */
typedef enum bf_backend_e { BF_CPU = 0, BF_CUDA, BF_AUTO } bf_backend_t;

typedef struct bf_opts_s {
  const char *input, *output, *dataset;
  const char *x_dataset;     /* NULL: x_start + k * x_step */
  double x_start, x_step;
  const char *mask;          /* DSET in the scan, or FILE:DSET; nonzero = excluded */
  int have_roi;
  uint32_t roi[4];           /* y0, y1, x0, x1, half-open */
  beam_fit_batch_t batch;    /* model, degree, lo, hi, p0 (shared p0 row) */
  beam_fit_opts_t fit;
  double lo[BEAM_FIT_MAX_PARAMS], hi[BEAM_FIT_MAX_PARAMS], p0[BEAM_FIT_MAX_PARAMS];
  int have_bounds;
  int np;                    /* parameters of the model */
  uint64_t tile;             /* pixels per tile; 0: from --tile-bytes */
  uint32_t threads;          /* 0: cores / local ranks */
  bf_backend_t backend;
  int cuda_dev;              /* BF_CUDA: local rank mod the devices seen */
  int cuda_starts_host;      /* --cuda-starts host: INIT_AUTO starts on the host */
  int progress, quiet;
} bf_opts_t;

typedef struct bf_mpi_s {
  MPI_Comm comm;
  int rank, size, local_rank, local_size;
} bf_mpi_t;

/* The selected pixels and the frames this rank holds. */
typedef struct bf_input_s {
  rp_src_t src;
  int src_open;
  uint64_t T;                /* frames of the series = points per fit */
  double *x;                 /* T */
  char x_what[1100];          /* "dataset /entry/data/delay" or "x = 0 + k * 1" */
  uint32_t h, w;
  uint64_t npix;             /* selected pixels */
  uint32_t *pix;             /* npix flattened indices y * w + x, ascending */
  uint64_t f0, f1;           /* this rank's frames [f0, f1) */
  uint8_t *slab;             /* (f1 - f0) x npix elements of src.esize bytes */
  size_t esize;
  beam_dtype_t dtype;
} bf_input_t;

/* input.c ---------------------------------------------------------------- */

/* Opens the scan, x, mask and ROI: the same on every rank. 0 or BEAM_E*. */
int bf_input_open(bf_input_t *in, const bf_opts_t *o, beam_diag_t *d);
/* This rank's frame range for `size` ranks, aligned to the chunks (a chunk
 * of several frames is decoded by one rank only). */
void bf_input_range(const bf_input_t *in, int rank, int size, uint64_t *f0, uint64_t *f1);
/* Reads and decodes [f0, f1) into the slab. 0, or BEAM_E* with d naming
 * file, dataset and frame. */
int bf_input_read(bf_input_t *in, uint64_t f0, uint64_t f1, beam_diag_t *d);
void bf_input_close(bf_input_t *in);

/* exchange.c ------------------------------------------------------------- */

typedef struct bf_xchg_s {
  uint64_t tile, ntiles, rounds;
  int size, rank;
  uint64_t *frame0;          /* size + 1 frame boundaries of the ranks */
  float *send, *recv;        /* this round's buffers */
  int *scount, *sdispl, *rcount, *rdispl;
} bf_xchg_t;

/* Tile t covers selected pixels [t * tile, min((t + 1) * tile, npix)). */
int bf_xchg_init(bf_xchg_t *x, const bf_input_t *in, uint64_t tile, const bf_mpi_t *m,
                 beam_diag_t *d);
/* Round r: this rank receives tile r * size + rank, [*a, *b) of the
 * selected pixels, as recv[T][b - a] (empty when past the last tile). */
int bf_xchg_round(bf_xchg_t *x, const bf_input_t *in, uint64_t r, MPI_Comm comm, uint64_t *a,
                  uint64_t *b, beam_diag_t *d);
void bf_xchg_free(bf_xchg_t *x);
/* Bytes one rank needs, for the report and the documented formula. */
double bf_mem_estimate(uint64_t npix, uint64_t T, uint64_t frames_here, size_t esize,
                       uint64_t tile, int size, int np, int threads, size_t ws);

/* solve.c ---------------------------------------------------------------- */

/* Result of one tile, packed as doubles per pixel: P params, P errors,
 * chi2, chi2_red, iters, n_used, status. */
#define BF_STRIDE(P) (2 * (P) + 5)

typedef struct bf_solver_s {
  int threads, np;
  void **ws;
  size_t ws_bytes;
  beam_fit_result_t r;
  size_t cap;                /* fits the result arrays hold */
  double *p0rows;
  float *xf;                 /* x as the engine takes it */
  const char *isa;
  struct beam_fit_cuda_s *cuda; /* BF_CUDA: the engine context on cuda_dev */
  char isa_buf[32];
} bf_solver_t;

/* NULL when the backend can run here, else why not (BF_CUDA: a CUDA build
 * and at least one device; BF_AUTO and BF_CPU always run). */
const char *bf_backend_unavailable(bf_backend_t b);
/* BF_AUTO -> BF_CUDA when a device is usable, else BF_CPU (why: the
 * reason, for the notice); others unchanged. Sets o->cuda_dev from the
 * local rank for BF_CUDA. */
bf_backend_t bf_backend_resolve(bf_opts_t *o, int local_rank, char *why, size_t why_len);
int bf_solver_init(bf_solver_t *s, const bf_opts_t *o, uint64_t T, uint64_t tile,
                   beam_diag_t *d);
/* Fits n pixels whose y is frame-major [T][n] into out (n x BF_STRIDE). */
int bf_solve(bf_solver_t *s, const bf_opts_t *o, const double *x, uint64_t T, const float *y,
             uint64_t n, double *out, beam_diag_t *d);
void bf_solver_free(bf_solver_t *s);

/* maps.c ------------------------------------------------------------------ */

typedef struct bf_maps_s {
  hid_t file;
  int nds;
  hid_t ds[2 * BEAM_FIT_MAX_PARAMS + 5];
  hid_t mtype[2 * BEAM_FIT_MAX_PARAMS + 5];
  uint32_t h, w;
  double *row;               /* one image row of doubles */
  uint8_t *rowb;
} bf_maps_t;

/* Creates MAPS.h5 with every dataset filled with "not fitted" and the
 * model, options and provenance as attributes. */
int bf_maps_create(bf_maps_t *m, const char *path, const bf_opts_t *o, const bf_input_t *in,
                   const bf_mpi_t *mpi, int threads, uint64_t tile, const char *isa,
                   const char *cmdline, beam_diag_t *d);
/* Writes the results of selected pixels [a, b) (res: (b - a) x stride). */
int bf_maps_write(bf_maps_t *m, const bf_input_t *in, int np, uint64_t a, uint64_t b,
                  const double *res, beam_diag_t *d);
int bf_maps_close(bf_maps_t *m, double seconds, beam_diag_t *d);

#endif
