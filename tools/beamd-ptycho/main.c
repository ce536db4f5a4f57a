/* beamd-ptycho: difference-map ptychography of a scan file, on one process
 * or distributed with MPI (docs/ptycho.md "beamd-ptycho").
 *
 *   beamd-ptycho SCAN.h5 -o RESULT.h5 [options]
 *   mpirun -n K beamd-ptycho SCAN.h5 -o RESULT.h5 [options]
 *
 * Every rank reads the metadata and the full position list, so all build
 * the same object grid; rank r prepares only its contiguous block of
 * frames [N r / K, N (r + 1) / K). The engine's reducer sums the object
 * and probe accumulators and the metric sums over ranks (MPI_Allreduce in
 * place), so every rank holds the same object and probe after each
 * iteration; rank 0 writes the result. Initial probe and object are made
 * on rank 0 and broadcast, so the ranks start bit-identical.
 *
 * Exit codes: 0 done, 1 bad input or runtime error, 2 bad command line,
 * 3 diverged (the result is written with status "diverged"), 130
 * interrupted (result written with status "interrupted").
 */
#include "pipeline/cache.h"
#include "tools/beamd-ptycho/ptycho.h"
#include "tools/common/cli.h"
#include "pipeline/frame.h"
#include "tools/common/sig.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_OBJ_SIDE 32768u
#define EXIT_DIVERGED 3
#define EXIT_INTERRUPTED 130


typedef struct mpi_s {
  MPI_Comm comm;
  int rank, size, local_rank, local_size;
} mpi_t;

static mpi_t M;

/* ---- MPI helpers -------------------------------------------------------------- */

static int reduce_cb(void *ctx, void *buf, size_t nreal, int is_double) {
  (void)ctx;
  char *p = buf;
  size_t es = is_double ? sizeof(double) : sizeof(float);
  while (nreal) {
    int c = nreal > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)nreal;
    if (MPI_Allreduce(MPI_IN_PLACE, p, c, is_double ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, M.comm) !=
        MPI_SUCCESS)
      return BEAM_EIO;
    p += (size_t)c * es;
    nreal -= (size_t)c;
  }
  return 0;
}

/* 1 when every rank's rc is >= 0. */
static int all_ok(int rc) {
  int bad = rc < 0, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, M.comm);
  return !any;
}

/* A problem every rank meets alike (metadata, geometry): rank 0 says it. */
static void err_global(const beam_diag_t *d) {
  if (M.rank == 0)
    tool_log("%s", d->msg);
}

/* A problem of this rank's own frames or engine. */
static void err_local(const beam_diag_t *d) {
  if (M.size > 1)
    tool_log("rank %d: %s", M.rank, d->msg);
  else
    tool_log("%s", d->msg);
}

static int bcast_doubles(double *v, size_t count) {
  while (count) {
    int c = count > (size_t)(INT_MAX / 2) ? INT_MAX / 2 : (int)count;
    if (MPI_Bcast(v, c, MPI_DOUBLE, 0, M.comm) != MPI_SUCCESS)
      return -1;
    v += c;
    count -= (size_t)c;
  }
  return 0;
}

/* ---- set-up steps ---------------------------------------------------------------- */

typedef struct run_s {
  pt_opts_t *o;
  pt_scan_t scan;
  uint32_t n, nv;          /* view side, total views */
  uint64_t first, count;   /* this rank's views */
  double energy, distance, pixel, px;
  double cy, cx;
  const char *center_src;
  beam_ptycho_geom_t geom;
  int32_t *rc;             /* nv x 2 */
  float *amp;              /* count x n x n */
  double photons;          /* mean per frame, all ranks */
  double *amp_sum, *amp_cnt; /* n x n, all ranks */
  double *probe, *object;
  beam_dm_t *e;
  beam_dm_metrics_t *hist;
  uint32_t niter;
  char probe_src[4200], object_src[4200];
} run_t;

static int geometry(run_t *r, beam_diag_t *d) {
  pt_opts_t *o = r->o;
  pt_scan_t *s = &r->scan;
  r->energy = o->energy > 0 ? o->energy : s->energy;
  r->distance = o->distance > 0 ? o->distance : s->distance;
  r->pixel = o->pixel > 0 ? o->pixel : s->pixel;
  if (!(r->energy > 0))
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no photon energy "
                     "(/entry/instrument/beam/incident_energy); give --energy", s->path);
  if (!(r->distance > 0))
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no detector distance "
                     "(/entry/instrument/detector/detector_distance); give --distance", s->path);
  if (!(r->pixel > 0))
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: no detector pixel size "
                     "(/entry/instrument/detector/x_pixel_size); give --pixel-size", s->path);
  uint32_t m = s->h < s->w ? s->h : s->w;
  r->n = o->n ? o->n : (m > 256 ? 256 : m & ~1u);
  if (r->n > m || r->n < 8)
    return BEAM_DIAG(d, BEAM_ESHAPE, "file %s dataset %s: frames are %ux%u, too small for "
                     "%ux%u views", s->path, s->parts[0].name, s->h, s->w, r->n, r->n);
  if (s->nframes > UINT32_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "file %s: %llu frames", s->path,
                     (unsigned long long)s->nframes);
  r->nv = (uint32_t)s->nframes;
  if (r->nv < (uint32_t)M.size)
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: %u frames for %d ranks", s->path, r->nv, M.size);
  r->px = beam_ptycho_obj_pixel(r->energy, r->distance, r->pixel, r->n);
  r->rc = malloc((size_t)r->nv * 2 * sizeof *r->rc);
  if (!r->rc)
    return BEAM_DIAG(d, BEAM_ENOMEM, "window table");
  int rc = beam_ptycho_place(s->pos_yx, r->nv, r->px, r->n, o->margin, MAX_OBJ_SIDE, r->rc,
                             NULL, &r->geom, d);
  if (rc < 0) {
    char why[1024];
    snprintf(why, sizeof why, "%s", d->msg);
    beam_diag_clear(d);
    return BEAM_DIAG(d, rc, "file %s dataset /entry/sample/positions: %s", s->path, why);
  }
  r->first = (uint64_t)r->nv * (uint64_t)M.rank / (uint64_t)M.size;
  r->count = (uint64_t)r->nv * (uint64_t)(M.rank + 1) / (uint64_t)M.size - r->first;
  return 0;
}

/* Beam centre: given, the file's, or the centre of mass of the mean of all
 * frames (valid, unmasked pixels), reduced over the ranks. */
static int centre(run_t *r, double *frame, beam_diag_t *d) {
  pt_opts_t *o = r->o;
  pt_scan_t *s = &r->scan;
  if (o->center_mode == 2) {
    r->cy = o->cy;
    r->cx = o->cx;
    r->center_src = "command line";
    return 0;
  }
  if (o->center_mode == 0 && s->have_center) {
    r->cy = s->cy;
    r->cx = s->cx;
    r->center_src = "file";
    return 0;
  }
  double m[3] = {0, 0, 0};
  int rc = 0;
  for (uint64_t i = 0; i < r->count && rc == 0; i++) {
    rc = pt_scan_frame(s, r->first + i, frame, d);
    for (uint32_t y = 0; y < s->h && rc == 0; y++)
      for (uint32_t x = 0; x < s->w; x++) {
        size_t p = (size_t)y * s->w + x;
        double v = frame[p];
        if ((s->mask && s->mask[p]) || !isfinite(v) || v < 0)
          continue;
        m[0] += v;
        m[1] += v * y;
        m[2] += v * x;
      }
  }
  if (!all_ok(rc))
    return rc < 0 ? rc : BEAM_EIO;
  MPI_Allreduce(MPI_IN_PLACE, m, 3, MPI_DOUBLE, MPI_SUM, M.comm);
  if (!(m[0] > 0))
    return BEAM_DIAG(d, BEAM_EINVAL, "file %s: the frames hold no counts, no centre of mass",
                     s->path);
  r->cy = m[1] / m[0];
  r->cx = m[2] / m[0];
  r->center_src = "centre of mass";
  return 0;
}

static int prepare(run_t *r, double *frame, beam_diag_t *d) {
  pt_scan_t *s = &r->scan;
  size_t nn = (size_t)r->n * r->n;
  r->amp = malloc((r->count ? r->count : 1) * nn * sizeof *r->amp);
  r->amp_sum = calloc(nn, sizeof *r->amp_sum);
  r->amp_cnt = calloc(nn, sizeof *r->amp_cnt);
  if (!r->amp || !r->amp_sum || !r->amp_cnt)
    return BEAM_DIAG(d, BEAM_ENOMEM, "amplitudes of %llu views of %ux%u",
                     (unsigned long long)r->count, r->n, r->n);
  double photons = 0;
  for (uint64_t i = 0; i < r->count; i++) {
    int rc = pt_scan_frame(s, r->first + i, frame, d);
    if (rc < 0)
      return rc;
    float *a = r->amp + i * nn;
    double ph = beam_ptycho_prep_frame(frame, BEAM_DT_F64, s->h, s->w, r->cy, r->cx, r->n,
                                       s->mask, a);
    if (ph < 0)
      return BEAM_DIAG(d, BEAM_EINVAL, "file %s: frame %llu: cannot prepare (centre %g, %g)",
                       s->path, (unsigned long long)(r->first + i), r->cy, r->cx);
    photons += ph;
    for (size_t p = 0; p < nn; p++)
      if (a[p] >= 0) {
        r->amp_sum[p] += a[p];
        r->amp_cnt[p] += 1;
      }
  }
  r->photons = photons;
  return 0;
}

static void extra_object_modes(double *obj, uint32_t modes, size_t np) {
  /* Identical modes would stay identical under the update; a weak,
   * deterministic pseudo-random texture (10 % amplitude) breaks that. */
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (uint32_t k = 1; k < modes; k++)
    for (size_t p = 0; p < np; p++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      double u = 0.5 + 0.5 * (double)(x >> 11) / 9007199254740992.0;
      obj[2 * (k * np + p)] = 0.1 * u * obj[2 * p];
      obj[2 * (k * np + p) + 1] = 0.1 * u * obj[2 * p + 1];
    }
}

/* Probe and object guesses, on rank 0 (called there only). */
static int guesses(run_t *r, beam_diag_t *d) {
  pt_opts_t *o = r->o;
  const beam_dm_conf_t *c = &o->conf;
  size_t nn = (size_t)r->n * r->n, np = (size_t)r->geom.obj_h * r->geom.obj_w;
  const char *pi = o->probe_init ? o->probe_init : "mean";
  int rc = 0;
  if (!strcmp(pi, "mean")) {
    float *am = malloc(nn * sizeof *am);
    if (!am)
      return BEAM_DIAG(d, BEAM_ENOMEM, "mean amplitude");
    for (size_t p = 0; p < nn; p++)
      am[p] = r->amp_cnt[p] > 0 ? (float)(r->amp_sum[p] / r->amp_cnt[p]) : -1.0f;
    rc = beam_ptycho_probe_from_mean(am, r->n, c->probe_modes, r->photons, r->probe, d);
    free(am);
    snprintf(r->probe_src, sizeof r->probe_src, "mean");
  } else if (!strcmp(pi, "zp")) {
    rc = beam_ptycho_probe_zone_plate(r->n, r->px, r->energy, o->zp_diam, o->zp_drn, o->zp_cs,
                                      o->defocus, c->probe_modes, r->photons, r->probe, d);
    snprintf(r->probe_src, sizeof r->probe_src, "zone plate");
  } else {
    static const char *const cands[] = {"/entry_1/image_1/probe", "/entry/truth/probe"};
    double *v = NULL;
    uint64_t dims[3];
    rc = pt_read_complex(pi, cands, 2, &v, dims, r->probe_src, sizeof r->probe_src, d);
    if (rc == 0 && (dims[1] != r->n || dims[2] != r->n ||
                    (dims[0] != 1 && dims[0] < c->probe_modes)))
      rc = BEAM_DIAG(d, BEAM_ESHAPE, "probe %s: shape %llux%llux%llu, expected (modes, %u, %u) "
                     "with 1 or at least %u modes", r->probe_src, (unsigned long long)dims[0],
                     (unsigned long long)dims[1], (unsigned long long)dims[2], r->n, r->n,
                     c->probe_modes);
    if (rc == 0) {
      size_t have = dims[0] < c->probe_modes ? dims[0] : c->probe_modes;
      memcpy(r->probe, v, have * nn * 2 * sizeof *v);
      if (have < c->probe_modes)
        beam_ptycho_probe_extra_modes(r->n, c->probe_modes, r->probe);
    }
    free(v);
  }
  if (rc < 0)
    return rc;
  const char *oi = o->object_init ? o->object_init : "flat";
  if (!strcmp(oi, "flat")) {
    for (size_t p = 0; p < np; p++) {
      r->object[2 * p] = 1.0;
      r->object[2 * p + 1] = 0.0;
    }
    snprintf(r->object_src, sizeof r->object_src, "flat");
  } else {
    static const char *const cands[] = {"/entry_1/image_1/data", "/entry/truth/object"};
    double *v = NULL;
    uint64_t dims[3];
    rc = pt_read_complex(oi, cands, 2, &v, dims, r->object_src, sizeof r->object_src, d);
    if (rc == 0 && (dims[1] != r->geom.obj_h || dims[2] != r->geom.obj_w || dims[0] != 1))
      rc = BEAM_DIAG(d, BEAM_ESHAPE, "object %s: shape %llux%llux%llu, this scan needs a "
                     "%ux%u object", r->object_src, (unsigned long long)dims[0],
                     (unsigned long long)dims[1], (unsigned long long)dims[2], r->geom.obj_h,
                     r->geom.obj_w);
    if (rc == 0)
      memcpy(r->object, v, np * 2 * sizeof *v);
    free(v);
    if (rc < 0)
      return rc;
  }
  extra_object_modes(r->object, c->object_modes, np);
  return 0;
}

static int make_engine(run_t *r, beam_diag_t *d) {
  pt_opts_t *o = r->o;
  beam_dm_conf_t *c = &o->conf;
  c->n = r->n;
  c->max_views = (uint32_t)r->count;
  c->obj_h = r->geom.obj_h;
  c->obj_w = r->geom.obj_w;
  if (!o->threads_set) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = (int)(cores > 0 ? cores : 1) / (M.local_size > 0 ? M.local_size : 1);
    c->threads = t < 1 ? 1 : t;
  }
  if (!o->device_set)
    c->device = M.local_rank;
  double bytes = (double)beam_dm_bytes(c);
  double limit = o->max_memory > 0 ? o->max_memory : (double)beam_mem_available() / M.local_size;
  if (o->backend == BEAM_DM_CPU && limit > 0 && bytes > limit)
    return BEAM_DIAG(d, BEAM_ELIMIT, "file %s: %u views of %ux%u and a %ux%u object need "
                     "%.1f MiB per rank, above the limit of %.1f MiB (%s); use more ranks or "
                     "a smaller --n", r->scan.path, c->max_views, r->n, r->n, c->obj_h,
                     c->obj_w, bytes / 1048576.0, limit / 1048576.0,
                     o->max_memory > 0 ? "--max-memory" : "MemAvailable / local ranks");
  int rc = beam_dm_create(&r->e, c, o->backend, d);
  if (rc < 0)
    return rc;
  if (M.size > 1)
    beam_dm_set_reducer(r->e, reduce_cb, NULL);
  if ((rc = beam_dm_set_probe(r->e, r->probe, d)) < 0 ||
      (rc = beam_dm_set_object(r->e, r->object, d)) < 0)
    return rc;
  return beam_dm_add_views(r->e, (uint32_t)r->count, r->amp, r->rc + 2 * r->first, d);
}

/* ---- iterations ------------------------------------------------------------------------ */

static void progress(const run_t *r, uint32_t it, double t0, int tty, int last) {
  const pt_opts_t *o = r->o;
  if (M.rank != 0 || o->quiet)
    return;
  uint32_t every = o->progress_every ? o->progress_every
                                     : (o->iterations >= 20 ? o->iterations / 20 : 1);
  if (!tty && !last && (it + 1) % every)
    return;
  const beam_dm_metrics_t *m = &r->hist[it];
  double el = (beam_now_ns() - t0) / 1e9, rate = el > 0 ? (it + 1) / el : 0;
  double left = rate > 0 ? (o->iterations - it - 1) / rate : 0;
  if (tty)
    fprintf(stderr, "\r\033[Kbeamd-ptycho: iteration %u/%u  error %.4e  %.2f it/s  %.0f s left",
            it + 1, o->iterations, m->fourier_error, rate, left);
  else
    fprintf(stderr, "beamd-ptycho: iteration %u/%u error %.4e probe_change %.3e "
            "object_change %.3e %.2f it/s %.0f s left\n", it + 1, o->iterations,
            m->fourier_error, m->probe_change, m->object_change, rate, left);
  if (tty && last)
    fputc('\n', stderr);
}

/* Returns the status: "completed", "diverged", "interrupted"; NULL after
 * a local engine error (the caller aborts the job). */
static const char *iterate(run_t *r, beam_diag_t *d) {
  pt_opts_t *o = r->o;
  int tty = isatty(2);
  double t0 = (double)beam_now_ns();
  for (uint32_t it = 0; it < o->iterations; it++) {
    int stop = tool_stop != 0;
    if (M.size > 1)
      MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, M.comm);
    if (stop) {
      if (tty && it && M.rank == 0 && !o->quiet)
        fputc('\n', stderr);
      return "interrupted";
    }
    if (beam_dm_iterate(r->e, &r->hist[it], d) < 0)
      return NULL;
    r->niter = it + 1;
    int div = o->diverge > 0 && beam_dm_diverged(r->hist, r->niter, o->diverge);
    progress(r, it, t0, tty, div || it + 1 == o->iterations);
    if (div)
      return "diverged";
  }
  return "completed";
}

/* ---- output -------------------------------------------------------------------------- */

static char *join_args(int argc, char **argv) {
  size_t len = 1;
  for (int i = 0; i < argc; i++)
    len += strlen(argv[i]) + 1;
  char *s = malloc(len);
  if (!s)
    return NULL;
  s[0] = '\0';
  for (int i = 0; i < argc; i++) {
    strcat(s, argv[i]);
    if (i + 1 < argc)
      strcat(s, " ");
  }
  return s;
}

static int write_outputs(run_t *r, const char *status, char *cmdline, beam_diag_t *d) {
  pt_opts_t *o = r->o;
  const beam_dm_conf_t *c = beam_dm_conf(r->e);
  int rc;
  if ((rc = beam_dm_get_object(r->e, r->object, d)) < 0 ||
      (rc = beam_dm_get_probe(r->e, r->probe, d)) < 0)
    return rc;
  const pt_param_t params[] = {
      {"input", 1, 0, o->input}, {"dataset", 1, 0, r->scan.parts[0].name},
      {"n", 0, r->n, NULL}, {"iterations", 0, o->iterations, NULL},
      {"algorithm", 1, 0, c->algorithm == BEAM_DM_ALG_RAAR ? "raar" : "dm"},
      {"beta", 0, c->beta, NULL}, {"obj_reg", 0, c->obj_reg, NULL},
      {"probe_reg", 0, c->probe_reg, NULL}, {"probe_update_start", 0, c->probe_update_start, NULL},
      {"inner_passes", 0, c->inner_passes, NULL}, {"fourier_relax", 0, c->fourier_relax, NULL},
      {"probe_support", 0, c->probe_support, NULL}, {"probe_modes", 0, c->probe_modes, NULL},
      {"object_modes", 0, c->object_modes, NULL},
      {"precision", 1, 0, c->prec == BEAM_DM_F64 ? "double" : "single"},
      {"backend", 1, 0, o->backend == BEAM_DM_CUDA ? "cuda" : "cpu"},
      {"threads_per_rank", 0, c->threads, NULL}, {"ranks", 0, M.size, NULL},
      {"margin", 0, o->margin, NULL}, {"center_y", 0, r->cy, NULL}, {"center_x", 0, r->cx, NULL},
      {"center_source", 1, 0, r->center_src}, {"energy_ev", 0, r->energy, NULL},
      {"distance_m", 0, r->distance, NULL}, {"detector_pixel_m", 0, r->pixel, NULL},
      {"object_pixel_m", 0, r->px, NULL}, {"probe_init", 1, 0, r->probe_src},
      {"object_init", 1, 0, r->object_src}, {"diverge_factor", 0, o->diverge, NULL},
      {"photons_per_frame", 0, r->photons, NULL}, {"views", 0, r->nv, NULL},
  };
  pt_result_t res = {
      .path = o->output, .conf = c, .object = r->object, .probe = r->probe, .geom = &r->geom,
      .pos_yx = r->scan.pos_yx, .rc = r->rc, .nviews = r->nv, .hist = r->hist,
      .niter = r->niter, .energy = r->energy, .distance = r->distance, .det_pixel = r->pixel,
      .cy = r->cy, .cx = r->cx, .status = status, .command_line = cmdline ? cmdline : "",
      .params = params, .nparams = sizeof params / sizeof params[0],
  };
  if ((rc = pt_result_write(&res, d)) < 0)
    return rc;
  if (o->png_dir) {
    /* The scanned region: window centres, where every pixel is covered. */
    int32_t lo[2] = {INT32_MAX, INT32_MAX}, hi[2] = {0, 0};
    for (uint32_t i = 0; i < r->nv; i++)
      for (int a = 0; a < 2; a++) {
        int32_t v = r->rc[2 * i + a] + (int32_t)(r->n / 2);
        lo[a] = v < lo[a] ? v : lo[a];
        hi[a] = v > hi[a] ? v : hi[a];
      }
    rc = pt_png_write(o->png_dir, r->object, c->object_modes, c->obj_h, c->obj_w,
                      (uint32_t)lo[0], (uint32_t)hi[0] + 1, (uint32_t)lo[1],
                      (uint32_t)hi[1] + 1, r->probe, c->probe_modes, r->n, d);
  }
  return rc;
}

static void run_free(run_t *r) {
  beam_dm_destroy(&r->e);
  pt_scan_close(&r->scan);
  free(r->rc);
  free(r->amp);
  free(r->amp_sum);
  free(r->amp_cnt);
  free(r->probe);
  free(r->object);
  free(r->hist);
}

static int finish(int code) {
  MPI_Finalize();
  return code;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  M.comm = MPI_COMM_WORLD;
  MPI_Comm_rank(M.comm, &M.rank);
  MPI_Comm_size(M.comm, &M.size);
  MPI_Comm local;
  MPI_Comm_split_type(M.comm, MPI_COMM_TYPE_SHARED, M.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &M.local_rank);
  MPI_Comm_size(local, &M.local_size);
  MPI_Comm_free(&local);
  tool_cli_init("beamd-ptycho");

  pt_opts_t o;
  memset(&o, 0, sizeof o);
  beam_dm_conf_default(&o.conf);
  /* RAAR by default: on noisy data plain DM's exit waves drift (dm.h) */
  o.conf.algorithm = BEAM_DM_ALG_RAAR;
  o.conf.beta = 0.8;
  o.iterations = 100;
  o.margin = 8;
  o.zp_diam = 100e-6;
  o.zp_drn = 130e-9;
  o.zp_cs = 40e-6;
  o.defocus = 1.1e-3;
  o.diverge = 1000;
  o.backend = BEAM_DM_CPU;
  /* Only rank 0 talks about the command line; every rank parses it. */
  FILE *devnull = NULL;
  int saved = -1;
  if (M.rank != 0) {
    devnull = fopen("/dev/null", "w");
    saved = dup(2);
    if (devnull)
      dup2(fileno(devnull), 2);
  }
  int ex = tool_args_exit(pt_parse_args(argc, argv, &o), pt_usage);
  if (M.rank != 0 && saved >= 0) {
    dup2(saved, 2);
    close(saved);
  }
  if (devnull)
    fclose(devnull);
  if (ex >= 0)
    return finish(ex);
  tool_catch_stop();

  beam_diag_t d;
  beam_diag_clear(&d);
  run_t r;
  memset(&r, 0, sizeof r);
  r.o = &o;
  r.scan.file = -1;
  int code = 1;
  double *frame = NULL;
  char *cmdline = join_args(argc, argv);
  int rc = pt_scan_open(&r.scan, o.input, o.dataset, &d);
  if (rc == 0)
    rc = geometry(&r, &d);
  if (!all_ok(rc)) {
    err_global(&d);
    goto out;
  }
  frame = malloc((size_t)r.scan.h * r.scan.w * sizeof *frame);
  rc = frame ? 0 : BEAM_DIAG(&d, BEAM_ENOMEM, "frame buffer");
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  rc = centre(&r, frame, &d);
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  rc = prepare(&r, frame, &d);
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  size_t nn = (size_t)r.n * r.n;
  MPI_Allreduce(MPI_IN_PLACE, &r.photons, 1, MPI_DOUBLE, MPI_SUM, M.comm);
  MPI_Allreduce(MPI_IN_PLACE, r.amp_sum, (int)nn, MPI_DOUBLE, MPI_SUM, M.comm);
  MPI_Allreduce(MPI_IN_PLACE, r.amp_cnt, (int)nn, MPI_DOUBLE, MPI_SUM, M.comm);
  r.photons /= r.nv;
  if (!(r.photons > 0)) {
    BEAM_DIAG(&d, BEAM_EINVAL, "file %s: no counts in the %ux%u views around the centre "
              "(%g, %g) [%s]", o.input, r.n, r.n, r.cy, r.cx, r.center_src);
    err_global(&d);
    goto out;
  }
  size_t pbytes = (size_t)o.conf.probe_modes * nn * 2;
  size_t obytes = (size_t)o.conf.object_modes * r.geom.obj_h * r.geom.obj_w * 2;
  r.probe = calloc(pbytes, sizeof *r.probe);
  r.object = calloc(obytes, sizeof *r.object);
  r.hist = calloc(o.iterations, sizeof *r.hist);
  rc = r.probe && r.object && r.hist ? 0 : BEAM_DIAG(&d, BEAM_ENOMEM, "probe/object/history");
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  if (M.rank == 0)
    rc = guesses(&r, &d);
  if (!all_ok(rc)) {
    err_global(&d);
    goto out;
  }
  if (bcast_doubles(r.probe, pbytes) < 0 || bcast_doubles(r.object, obytes) < 0)
    goto out;
  MPI_Bcast(r.probe_src, sizeof r.probe_src, MPI_CHAR, 0, M.comm);
  MPI_Bcast(r.object_src, sizeof r.object_src, MPI_CHAR, 0, M.comm);
  rc = make_engine(&r, &d);
  if (!all_ok(rc)) {
    err_local(&d);
    goto out;
  }
  free(r.amp); /* the engine holds its own copy */
  r.amp = NULL;
  if (M.rank == 0 && !o.quiet)
    tool_log("%s: %u views of %ux%u (centre %.1f, %.1f from %s), object %ux%u of %.3g m, "
             "%d rank%s x %d threads, %s %s", o.input, r.nv, r.n, r.n, r.cy, r.cx,
             r.center_src, r.geom.obj_h, r.geom.obj_w, r.px, M.size, M.size > 1 ? "s" : "",
             o.conf.threads, o.backend == BEAM_DM_CUDA ? "cuda" : "cpu",
             o.conf.prec == BEAM_DM_F64 ? "double" : "single");
  const char *status = iterate(&r, &d);
  if (!status) {
    err_local(&d);
    if (M.size > 1)
      MPI_Abort(M.comm, 1); /* the other ranks wait in a reduction */
    goto out;
  }
  code = !strcmp(status, "diverged") ? EXIT_DIVERGED
       : !strcmp(status, "interrupted") ? EXIT_INTERRUPTED : 0;
  if (M.rank == 0) {
    if (code == EXIT_DIVERGED)
      tool_log("diverged at iteration %u: Fourier error %.4e is over %g x its minimum; "
               "writing what there is to %s", r.niter, r.hist[r.niter - 1].fourier_error,
               o.diverge, o.output);
    else if (code == EXIT_INTERRUPTED)
      tool_log("interrupted after %u iterations; writing %s", r.niter, o.output);
    rc = write_outputs(&r, status, cmdline, &d);
    if (rc < 0) {
      tool_log("%s", d.msg);
      code = 1;
    } else if (!o.quiet && code == 0) {
      double secs = 0;
      for (uint32_t i = 0; i < r.niter; i++)
        secs += r.hist[i].seconds;
      tool_log("done: %u iterations, %.3f s/iteration, final error %.4e; wrote %s", r.niter,
               r.niter ? secs / r.niter : 0, r.hist[r.niter - 1].fourier_error, o.output);
    }
  }
  MPI_Bcast(&code, 1, MPI_INT, 0, M.comm);
out:
  free(frame);
  free(cmdline);
  run_free(&r);
  return finish(code);
}
