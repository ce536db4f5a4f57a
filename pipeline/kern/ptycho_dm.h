/* Stage kind `ptycho_dm`: live difference-map ptychography. Diffraction
 * frames of a scan arrive with their positions; each is prepared once
 * (crop around the beam centre, FFT order, square root, mask:
 * beam_ptycho_prep_frame) and handed to the DM engine (pipeline/ptycho/dm.h)
 * in batches; while the input queue is empty the stage iterates (the
 * graph's idle op), publishing the object, probe and error history as they
 * improve, and after SERIES_END it keeps iterating up to `iterations` in
 * total and publishes the final result. docs/ptycho.md ("Live stage
 * ptycho_dm") states the rules; etc/beamd.yaml documents every parameter.
 *
 * This header and ptycho_dm.c hold everything both backends share: the
 * schema, parameter loading, geometry and outputs at series start, frame
 * preparation, and the iteration/publication logic. ptycho_dm_cpu.c and
 * gpu/ptycho_dm_cuda.cu only pick the engine backend (BEAM_DM_CPU or
 * BEAM_DM_CUDA): the engine owns every large buffer and every FFT.
 *
 * Not for offline reconstruction of files (tools/beamd-ptycho does that
 * with the same engine). */
#ifndef BEAM_KERN_PTYCHO_DM_H
#define BEAM_KERN_PTYCHO_DM_H

#include "pipeline/array.h"
#include "pipeline/ptycho/dm.h"
#include "pipeline/ptycho/setup.h"
#include "pipeline/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output indices (declaration order). */
enum {
  BEAM_PTYCHO_OUT_OBJECT = 0, /* complex64 [obj_h, obj_w] or [modes, obj_h, obj_w] */
  BEAM_PTYCHO_OUT_PROBE,      /* complex64 [modes, n, n] */
  BEAM_PTYCHO_OUT_ERROR,      /* float64 [k, 4]: iteration, fourier_error, probe_change, object_change */
  BEAM_PTYCHO_NOUTS
};

/* Columns of the error history rows. */
#define BEAM_PTYCHO_ERR_COLS 4

typedef enum { BEAM_PTYCHO_PROBE_MEAN = 0, BEAM_PTYCHO_PROBE_FILE, BEAM_PTYCHO_PROBE_ZONE_PLATE } beam_ptycho_probe_init_t;

/* The parameters, checked at init. */
typedef struct beam_ptycho_dm_conf_s {
  uint32_t n;
  int have_center;           /* center given in the config */
  double cy, cx;
  uint32_t auto_frames;      /* frames summed for the automatic centre */
  uint32_t max_frames, min_frames;
  uint32_t iterations, final_iterations;
  beam_dm_conf_t dm;         /* algorithm switches (geometry set at start) */
  beam_ptycho_probe_init_t probe_init;
  beam_array_t probe_file;   /* complex [n, n] or [modes, n, n] when probe_init == FILE */
  double zp_diam, zp_drn, zp_cs, zp_defocus; /* zone plate, metres */
  beam_array_t object_file;  /* complex [h, w] or [modes, h, w]; data NULL = flat */
  int positions_meta;        /* positions from the series metadata, not per frame */
  int units_pixels;          /* positions in object pixels, not metres */
  double energy_ev, distance_m, pixel_size_m; /* 0 = from the series */
  int have_extent;
  double extent[4];          /* y0, x0, y1, x1 in position units */
  uint32_t margin;
  uint32_t publish_every;    /* iterations; 0 = off */
  double publish_interval;   /* seconds; 0 = off */
  double diverge_factor;
  uint64_t max_memory;       /* bytes for the engine; 0 = 3/4 of physical memory (CPU) */
  beam_array_t mask;         /* frame-shaped, nonzero = masked; data NULL = none */
} beam_ptycho_dm_conf_t;

/* Stage state: everything sized at start, nothing allocated per frame. */
typedef struct beam_ptycho_dm_s {
  beam_ptycho_dm_conf_t conf;
  beam_dm_backend_t backend;
  beam_dm_t *eng;            /* made at the first start, kept while the geometry holds */
  /* series geometry */
  uint32_t fh, fw;           /* frame shape */
  beam_dtype_t fdt;
  beam_ptycho_geom_t geom;
  double pixel_m;            /* object pixel (0: positions in pixels) */
  double energy_ev;          /* of this series (config override or metadata) */
  double *meta_pos;          /* nmeta x 2 (y, x) from the metadata, or NULL */
  size_t nmeta;
  uint8_t *mask8;            /* fh x fw or NULL */
  int have_center;
  double cy, cx;
  /* automatic centre: raw frames (as float) held until it is known */
  float *cbuf;
  int32_t *cpos;             /* (row, col) of the held frames */
  double *csum;              /* fh x fw */
  uint32_t ncbuf, cbuf_cap;
  /* staged views, added to the engine between iterations */
  float *amp;                /* stage_cap x n x n */
  int32_t *pos;              /* stage_cap x 2 */
  uint32_t nstage, stage_cap;
  /* probe made from the first views (mean amplitude, mean photons) */
  double *amp_sum;           /* n x n */
  uint32_t *amp_cnt;         /* n x n */
  float *amp_mean;           /* n x n scratch for the probe */
  double photons;
  uint64_t nphot;
  int probe_set;
  /* results */
  double *obj_h, *probe_h;   /* host copies (interleaved complex doubles) */
  beam_dm_metrics_t *hist;   /* conf.iterations */
  uint32_t nhist;
  uint32_t it_pub;           /* iterations at the last publication */
  uint64_t t_pub_ns;
  int failed;                /* diverged or engine error: idle until the next series */
  int series_open;
  uint64_t accepted, rejected;
  char labels[512];          /* the object's axis origins/steps (descriptor labels) */
} beam_ptycho_dm_t;

extern const beam_param_t beam_ptycho_dm_params[];

/* The ops both backends share; be picks the engine backend. init fills
 * self->priv and sets self->idle. */
int beam_ptycho_dm_init(beam_stage_t *self, beam_dm_backend_t be, beam_diag_t *d);
int beam_ptycho_dm_start(beam_stage_t *self, const beam_series_t *series,
                         const beam_indesc_t *in, beam_diag_t *d);
int beam_ptycho_dm_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit);
int beam_ptycho_dm_idle(beam_stage_t *self, beam_emit_t *emit);
int beam_ptycho_dm_end(beam_stage_t *self, beam_emit_t *emit);
void beam_ptycho_dm_destroy(beam_stage_t *self);

/* Parameters and files of a stage's config into c (ptycho_dm_conf.c); on
 * failure what was loaded is freed by beam_ptycho_dm_conf_free (the
 * stage's destroy). */
int beam_ptycho_dm_conf_load(beam_ptycho_dm_conf_t *c, const beam_cnode_t *cfg, beam_diag_t *d);
void beam_ptycho_dm_conf_free(beam_ptycho_dm_conf_t *c);

/* Parses "scan": {"positions": [[x, y], ...]} and "beam_center": [y, x]
 * from series metadata JSON (may be NULL). *pos (count x 2, y then x) is
 * malloc'd, NULL when absent; *have_bc says whether bc holds a centre.
 * Returns 0 or BEAM_EPROTO / BEAM_ENOMEM with the reason in d. */
int beam_ptycho_dm_parse_meta(const char *json, double **pos, size_t *count, int *have_bc,
                              double bc[2], beam_diag_t *d);

#ifdef __cplusplus
}
#endif
#endif
