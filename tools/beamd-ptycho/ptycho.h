/* beamd-ptycho internals: the scan reader (scan.c), the result writer
 * (result.c) and the PNG writer (png.c), shared by the tool's files only.
 * docs/ptycho.md "beamd-ptycho" is the user's description. */
#ifndef BEAMD_PTYCHO_TOOL_H
#define BEAMD_PTYCHO_TOOL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/err.h"
#include "pipeline/ptycho/dm.h"
#include "pipeline/ptycho/setup.h"

/* ---- command line (cli.c) ------------------------------------------------- */

typedef struct pt_opts_s {
  const char *input, *output, *dataset, *png_dir;
  uint32_t iterations, n, margin;
  int center_mode; /* 0: file, else centre of mass; 1: centre of mass; 2: given */
  double cy, cx;
  double energy, distance, pixel; /* 0: from the file */
  const char *probe_init;         /* mean | zp | FILE[:/dataset] */
  double zp_diam, zp_drn, zp_cs, defocus;
  const char *object_init;        /* flat | FILE[:/dataset] */
  beam_dm_conf_t conf;
  beam_dm_backend_t backend;
  int threads_set, device_set;
  double diverge;
  double max_memory;              /* bytes; 0: MemAvailable / local ranks */
  uint32_t progress_every;
  int quiet;
} pt_opts_t;

void pt_usage(FILE *f);
/* Parses argv into o (defaults first); 0, or what tool_args_exit takes. */
int pt_parse_args(int argc, char **argv, pt_opts_t *o);

/* ---- scan file (scan.c) ---------------------------------------------------- */

typedef struct pt_part_s {
  char name[64];      /* dataset path in the file (a link for masters) */
  hid_t ds, space;
  uint64_t first, count;
} pt_part_t;

typedef struct pt_scan_s {
  const char *path;
  hid_t file;
  pt_part_t *parts;   /* one for a 3-D dataset, one per data_NNNNNN link */
  size_t nparts;
  uint64_t nframes;
  uint32_t h, w;
  double *pos_yx;     /* nframes x 2: (y, x) in metres */
  double energy, distance, pixel; /* eV, m, m; 0 = not in the file */
  int have_center;
  double cy, cx;      /* beam centre (pixels) from the file */
  uint8_t *mask;      /* h x w, nonzero = bad pixel; NULL when none */
  char mask_path[96];
} pt_scan_t;

/* Opens the frames (dataset, or /entry/data/data, a master's data_NNNNNN
 * links, or the only 3-D dataset), the positions (/entry/sample/positions,
 * (N, 2|3) x, y[, z] with length units) and the NXmx geometry. Every
 * problem is an error naming the file, dataset and index. */
int pt_scan_open(pt_scan_t *s, const char *path, const char *dataset, beam_diag_t *d);
/* Reads frame idx as doubles (h x w). */
int pt_scan_frame(pt_scan_t *s, uint64_t idx, double *out, beam_diag_t *d);
void pt_scan_close(pt_scan_t *s);

/* A complex array from FILE[:/dataset] (compound of two floats, or real):
 * rank 2 or 3, shape checked by the caller. *out is malloc'ed, interleaved
 * doubles; dims[0..2] (dims[0] = 1 for rank 2). cands: dataset paths tried
 * in order when spec has no ":/dataset". */
int pt_read_complex(const char *spec, const char *const *cands, size_t ncands, double **out,
                    uint64_t dims[3], char *used, size_t used_len, beam_diag_t *d);

/* ---- result (result.c) -------------------------------------------------- */

typedef struct pt_param_s {
  const char *name;
  int is_str;
  double num;
  const char *str;
} pt_param_t;

typedef struct pt_result_s {
  const char *path;
  const beam_dm_conf_t *conf;
  const double *object;          /* M_O x obj_h x obj_w */
  const double *probe;           /* M_P x n x n */
  const beam_ptycho_geom_t *geom;
  const double *pos_yx;          /* nviews x 2 */
  const int32_t *rc;             /* nviews x 2 */
  uint32_t nviews;
  const beam_dm_metrics_t *hist;
  uint32_t niter;
  double energy, distance, det_pixel, cy, cx;
  const char *status;            /* completed, diverged, interrupted */
  const char *command_line;
  const pt_param_t *params;
  size_t nparams;
} pt_result_t;

int pt_result_write(const pt_result_t *r, beam_diag_t *d);

/* ---- PNGs (png.c) -------------------------------------------------------------- */

/* object_amplitude.png, object_phase.png (per object mode k > 0:
 * object_mode<k>_...), probe_mode<j>_amplitude.png in dir (created).
 * Scaling: amplitude 1st..99th percentile over the scanned region (rows
 * r0..r1, cols c0..c1), phase -pi..pi after removing the mean phase of
 * that region; probe amplitude 0..max. */
int pt_png_write(const char *dir, const double *object, uint32_t obj_modes, uint32_t h,
                 uint32_t w, uint32_t r0, uint32_t r1, uint32_t c0, uint32_t c1,
                 const double *probe, uint32_t probe_modes, uint32_t n, beam_diag_t *d);

#endif
