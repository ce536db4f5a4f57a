/* Stage kind `roi_sum`, CPU backend: the run and index-list sums, the
 * plain reference, and the stage ops.
 *
 * Runs (unit weights): one pass over the runs in raster order; each run is
 * a contiguous loop the compiler vectorises, added to its ROI's
 * accumulator. 8/16-bit pixels add into 32-bit lanes in chunks short
 * enough that a lane cannot overflow (65536 x 65535 < 2^32), then into
 * 64 bits; 32-bit pixels add into 64 bits directly (2^32 pixels x 2^32
 * cannot overflow either). So integer sums are exact and rounded once to
 * double. 64-bit integers and floats add in double: runs shorter than 16
 * in one chain, longer ones in 16 lanes (independent lanes vectorise
 * without reassociating a reduction, which the compiler may not do to
 * floating point) combined pairwise, then run after run into the ROI.
 * A pixel goes through at most about len/16 + 20 + (runs in its ROI)
 * roundings, far fewer than in the reference's single chain.
 *
 * Index lists (weights, fragmented ROIs): a gather through each ROI's
 * sorted list; unit weights on integers up to 32 bits again in 64-bit
 * integers, otherwise four double accumulators (combined (s0 + s1) +
 * (s2 + s3)) to hide the add latency.
 *
 * Measured (bench/kernels, disk + two annuli covering pi/4 of the frame,
 * cold frames, medians on a shared 2-core AMD EPYC VM): 512x512 uint16
 * 132 -> ~25 us/frame, float32 211 -> ~50 us; 2048x2048 uint16 2.6 ->
 * ~0.47 ms, float32 3.6 -> ~0.95 ms. A plain sum over the whole frame
 * reads at about the same rate (uint16 19 us, float32 36 us at 512x512).
 * In cache, runs of 1, 4, 8, 16 pixels cost 1.1, 0.36, 0.17, 0.11 ns per
 * uint16 pixel and the lists 0.25 ns whatever the length (float32: runs
 * win from 3 pixels on), hence BEAM_ROI_RUN_MIN_MEAN. */
#include <math.h>
#include "proto/clones.h"
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/roi_sum.h"

/* Exact integer sum of one run: NARROW lanes over chunks of CHUNK pixels,
 * each chunk then added into ACC. */
#define RUN_INT(T, ACC, NARROW, CHUNK)                                         \
  static inline ACC run_##T(const T *restrict p, size_t n) {                   \
    ACC s = 0;                                                                 \
    if (n < 16) {                                                              \
      for (size_t i = 0; i < n; i++)                                           \
        s += (ACC)p[i];                                                        \
      return s;                                                                \
    }                                                                          \
    while (n > 0) {                                                            \
      size_t m = n < (CHUNK) ? n : (CHUNK);                                    \
      NARROW t = 0;                                                            \
      for (size_t i = 0; i < m; i++)                                           \
        t += (NARROW)p[i];                                                     \
      s += (ACC)t;                                                             \
      p += m;                                                                  \
      n -= m;                                                                  \
    }                                                                          \
    return s;                                                                  \
  }
RUN_INT(uint8_t, uint64_t, uint32_t, (size_t)1 << 16)
RUN_INT(uint16_t, uint64_t, uint32_t, (size_t)1 << 16)
RUN_INT(uint32_t, uint64_t, uint64_t, SIZE_MAX)
RUN_INT(int8_t, int64_t, int32_t, (size_t)1 << 16)   /* |sum| <= 2^23 */
RUN_INT(int16_t, int64_t, int32_t, (size_t)1 << 16)  /* -2^31 <= sum < 2^31 */
RUN_INT(int32_t, int64_t, int64_t, SIZE_MAX)

#define LANES 16 /* the pairwise combination below assumes 16 */
static inline double lanes_sum(double *a) {
  for (int j = 0; j < 8; j++)
    a[j] += a[j + 8];
  for (int j = 0; j < 4; j++)
    a[j] += a[j + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

#define RUN_DBL(T)                                                             \
  static inline double run_##T(const T *restrict p, size_t n) {                \
    if (n < LANES) {                                                           \
      double s = 0;                                                            \
      for (size_t i = 0; i < n; i++)                                           \
        s += (double)p[i];                                                     \
      return s;                                                                \
    }                                                                          \
    double a[LANES] = {0};                                                     \
    size_t i = 0;                                                              \
    for (; i + LANES <= n; i += LANES)                                         \
      for (int j = 0; j < LANES; j++)                                          \
        a[j] += (double)p[i + j];                                              \
    double s = lanes_sum(a);                                                   \
    for (; i < n; i++)                                                         \
      s += (double)p[i];                                                       \
    return s;                                                                  \
  }
RUN_DBL(uint64_t)
RUN_DBL(int64_t)
RUN_DBL(float)
RUN_DBL(double)

/* M(pixel type, dtype, accumulator type) for every real dtype. */
#define ROI_DTYPES(M)                                                          \
  M(uint8_t, BEAM_DT_U8, uint64_t) M(uint16_t, BEAM_DT_U16, uint64_t)          \
  M(uint32_t, BEAM_DT_U32, uint64_t) M(uint64_t, BEAM_DT_U64, double)          \
  M(int8_t, BEAM_DT_I8, int64_t) M(int16_t, BEAM_DT_I16, int64_t)              \
  M(int32_t, BEAM_DT_I32, int64_t) M(int64_t, BEAM_DT_I64, double)             \
  M(float, BEAM_DT_F32, double) M(double, BEAM_DT_F64, double)

/* Bytes of frame requested ahead of the run being summed. Runs leave gaps
 * (the corners outside every ROI, row after row) that the hardware
 * prefetcher does not bridge well; asking for the lines of the next runs
 * gained 20-30% on cold frames (bench/kernels; 1-32 KiB tried, 4-8 best
 * on the first machine). On the 2-core EPYC VM (Zen 4, about 40 GB/s),
 * 4 -> 8 -> 16 -> 32 KiB: float32 2048x2048 630 -> 530 -> 390 -> 400 us,
 * uint16 2048x2048 290 -> 200 -> 167 -> 190 us, 512x512 the same or
 * better (float32 28 -> 23 us): memory that far away needs more requests
 * in flight to be read at full speed. */
#ifndef ROI_PREFETCH_AHEAD
#define ROI_PREFETCH_AHEAD 16384
#endif

/* thread: auto counts roi_sum as light up to this many ROIs (stage.h). */
#define ROI_LIGHT_MAX 8

/* Where the prefetch has got to: run j, next cache line at byte b. */
typedef struct pf_s {
  size_t j, b;
} pf_t;

/* Requests every line of the runs below byte `limit` not yet requested. */
static inline void prefetch_to(const beam_roi_runs_t *r, const char *base, size_t esz,
                               size_t limit, pf_t *pf) {
  for (; pf->j < r->n; pf->j++) {
    size_t s = (size_t)r->run[pf->j].start * esz, e = s + (size_t)r->run[pf->j].len * esz;
    if (pf->b < (s & ~(size_t)63))
      pf->b = s & ~(size_t)63;
    size_t stop = e < limit ? e : limit;
    for (; pf->b < stop; pf->b += 64)
      __builtin_prefetch(base + pf->b);
    if (pf->b < e)
      return;
  }
}

#define RUNS_CASE(T, DT, ACC)                                                  \
  case DT: {                                                                   \
    const T *px = frame;                                                       \
    ACC *acc = r->acc;                                                         \
    pf_t pf = {0, 0};                                                          \
    for (size_t k = 0; k < r->nroi; k++)                                       \
      acc[k] = 0;                                                              \
    for (size_t k = 0; k < r->n; k++) {                                        \
      const beam_roi_run_t *u = &r->run[k];                                    \
      prefetch_to(r, frame, sizeof(T),                                         \
                  (size_t)u->start * sizeof(T) + ROI_PREFETCH_AHEAD, &pf);     \
      acc[u->roi] += run_##T(px + u->start, u->len);                           \
    }                                                                          \
    for (size_t k = 0; k < r->nroi; k++)                                       \
      sums[k] = (double)acc[k];                                                \
    break;                                                                     \
  }

/* The build targets baseline x86-64 (SSE2). An AVX2 clone, picked at
 * load time where the CPU has it, widens and converts twice as many
 * pixels per instruction (float32 in cache: 33 -> 20 us at 512x512). The
 * lanes are written out in the source, so both clones add in the same
 * order and give identical sums. */
#if !defined(ROI_CLONES) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) /* -DROI_CLONES= builds SSE2 only */
#define ROI_CLONES BEAM_TARGET_CLONES("avx2", "default")
#endif
#endif
#ifndef ROI_CLONES
#define ROI_CLONES
#endif

ROI_CLONES
void beam_roi_sum_runs(beam_roi_runs_t *r, beam_dtype_t dt, const void *frame, double *sums) {
  switch (dt) {
    ROI_DTYPES(RUNS_CASE)
  default: BEAM_ASSERT(!"roi_sum: dtype not accepted at start");
  }
}

/* Tile fusion (stage.h reduce_mapped), float32 input: the runs in order,
 * grouped so that each group's pixels fit one tile, which produce fills
 * (only pixels some ROI covers, and gaps inside a group, are ever made);
 * a run longer than a tile is made piece by piece with its lanes carried
 * across pieces of whole lanes. Each run is thus summed by run_float's own
 * operations in run_float's order, into the same accumulators in the same
 * order: the sums are beam_roi_sum_runs's, bit for bit. */
#define ROI_TILE 8192 /* float32 elements (32 KiB, stays in L1/L2); a multiple of LANES */

static int run_float_long(beam_produce_fn produce, void *ctx, size_t start, size_t len, float *tile,
                          double *out) {
  double a[LANES] = {0};
  size_t body = len - len % LANES, done = 0;
  while (done < body) {
    size_t m = body - done < ROI_TILE ? body - done : ROI_TILE;
    int rc = produce(ctx, start + done, m, tile);
    if (rc < 0)
      return rc;
    for (size_t i = 0; i < m; i += LANES)
      for (int j = 0; j < LANES; j++)
        a[j] += (double)tile[i + j];
    done += m;
  }
  double s = lanes_sum(a);
  if (len > body) {
    int rc = produce(ctx, start + body, len - body, tile);
    if (rc < 0)
      return rc;
    for (size_t i = 0; i < len - body; i++)
      s += (double)tile[i];
  }
  *out = s;
  return 0;
}

ROI_CLONES
int beam_roi_sum_runs_mapped(beam_roi_runs_t *r, beam_produce_fn produce, void *ctx, double *sums) {
  float tile[ROI_TILE];
  double *acc = r->acc;
  for (size_t k = 0; k < r->nroi; k++)
    acc[k] = 0;
  for (size_t k = 0; k < r->n;) {
    const beam_roi_run_t *u = &r->run[k];
    size_t off = u->start, end = off + u->len, j = k + 1;
    int rc;
    if (u->len > ROI_TILE) {
      double v;
      if ((rc = run_float_long(produce, ctx, off, u->len, tile, &v)) < 0)
        return rc;
      acc[u->roi] += v;
      k++;
      continue;
    }
    for (; j < r->n && (size_t)r->run[j].start + r->run[j].len - off <= ROI_TILE; j++)
      if ((size_t)r->run[j].start + r->run[j].len > end)
        end = (size_t)r->run[j].start + r->run[j].len;
    if ((rc = produce(ctx, off, end - off, tile)) < 0)
      return rc;
    for (; k < j; k++)
      acc[r->run[k].roi] += run_float(tile + (r->run[k].start - off), r->run[k].len);
  }
  for (size_t k = 0; k < r->nroi; k++)
    sums[k] = acc[k];
  return 0;
}

/* Unit weights: ACC is an integer type (exact) or double (4 lanes). */
#define GATHER_UNIT(T, ACC)                                                    \
  do {                                                                         \
    ACC s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                        \
    for (; k + 4 <= n; k += 4) {                                               \
      s0 += (ACC)px[ix[k]];                                                    \
      s1 += (ACC)px[ix[k + 1]];                                                \
      s2 += (ACC)px[ix[k + 2]];                                                \
      s3 += (ACC)px[ix[k + 3]];                                                \
    }                                                                          \
    for (; k < n; k++)                                                         \
      s0 += (ACC)px[ix[k]];                                                    \
    sums[r] = (double)((s0 + s1) + (s2 + s3));                                 \
  } while (0)

#define LISTS_CASE(T, DT, ACC)                                                 \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    for (size_t r = 0; r < l->nroi; r++) {                                     \
      const uint32_t *restrict ix = l->idx + l->off[r];                        \
      size_t n = (size_t)(l->off[r + 1] - l->off[r]), k = 0;                   \
      if (!l->w) {                                                             \
        GATHER_UNIT(T, ACC);                                                   \
        continue;                                                              \
      }                                                                        \
      const double *restrict w = l->w + l->off[r];                             \
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                   \
      for (; k + 4 <= n; k += 4) {                                             \
        s0 += (double)px[ix[k]] * w[k];                                        \
        s1 += (double)px[ix[k + 1]] * w[k + 1];                                \
        s2 += (double)px[ix[k + 2]] * w[k + 2];                                \
        s3 += (double)px[ix[k + 3]] * w[k + 3];                                \
      }                                                                        \
      for (; k < n; k++)                                                       \
        s0 += (double)px[ix[k]] * w[k];                                        \
      sums[r] = (s0 + s1) + (s2 + s3);                                         \
    }                                                                          \
    break;                                                                     \
  }

void beam_roi_sum_lists(const beam_roi_lists_t *l, beam_dtype_t dt, const void *frame, double *sums) {
  switch (dt) {
    ROI_DTYPES(LISTS_CASE)
  default: BEAM_ASSERT(!"roi_sum: dtype not accepted at start");
  }
}

void beam_roi_sum_cpu(beam_roi_host_t *h, beam_dtype_t dt, const void *frame, double *sums) {
  if (h->runs.run)
    beam_roi_sum_runs(&h->runs, dt, frame, sums);
  else {
    BEAM_ASSERT(h->lists.off);
    beam_roi_sum_lists(&h->lists, dt, frame, sums);
  }
}

void beam_roi_sum_ref(const beam_roi_sum_conf_t *c, beam_dtype_t dt, uint32_t h, uint32_t w,
                      const void *frame, double *sums) {
  for (size_t r = 0; r < c->nroi; r++) {
    double s = 0.0;
    for (uint32_t y = 0; y < h; y++)
      for (uint32_t x = 0; x < w; x++) {
        double wt = beam_roi_weight(c, r, h, w, y, x);
        if (wt != 0.0)
          s += beam_elem_get(frame, dt, (size_t)y * w + x) * wt;
      }
    sums[r] = s;
  }
}

/* ---- stage ops ------------------------------------------------------------ */

static void cpu_destroy(beam_stage_t *self) {
  beam_roi_host_t *h = self->priv;
  if (!h)
    return;
  beam_roi_host_free(h);
  free(h);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  beam_roi_host_t *h = calloc(1, sizeof *h);
  if (!h)
    return BEAM_DIAG(d, BEAM_ENOMEM, "roi_sum: out of memory");
  self->priv = h;
  int rc = beam_roi_host_init(h, self->cfg, d);
  /* Each frame is read about once when ROIs are few (runs, then sums);
   * many overlapping ROIs read it many times over, work enough for a
   * thread of its own. */
  if (rc == 0)
    self->light = h->conf.nroi <= ROI_LIGHT_MAX;
  return rc;
}

static int cpu_reduce_mapped(beam_stage_t *self, const beam_frame_t *in, beam_produce_fn produce,
                             void *ctx, beam_emit_t *emit);

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  beam_roi_host_t *h = self->priv;
  int rc = beam_roi_host_start(self, h, series, in, 1, d);
  /* Pieces add in the runs' order only on the runs path (float32 is what
   * a pointwise upstream such as correct makes). */
  self->reduce_mapped = rc == 0 && h->runs.run && in->dtype == BEAM_DT_F32 ? cpu_reduce_mapped : NULL;
  return rc;
}

/* One frame's sums, from its pixels or (produce set: tile fusion) from
 * its upstream's map, then the scan image. */
static int sum_frame(beam_stage_t *self, const beam_frame_t *in, beam_produce_fn produce, void *ctx,
                     beam_emit_t *emit) {
  beam_roi_host_t *h = self->priv;
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  if (!produce)
    beam_roi_sum_cpu(h, in->dtype, in->data, f->data);
  else if ((rc = beam_roi_sum_runs_mapped(&h->runs, produce, ctx, f->data)) < 0) {
    beam_emit_drop(emit, f);
    return rc;
  }
  beam_roi_host_record(h, in->frame_id, f->data);
  beam_emit_put(emit, f);
  return beam_roi_host_image(h, emit, 0);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_roi_host_corrupt(self->priv, emit);
  return sum_frame(self, in, NULL, NULL, emit);
}

static int cpu_reduce_mapped(beam_stage_t *self, const beam_frame_t *in, beam_produce_fn produce,
                             void *ctx, beam_emit_t *emit) {
  return sum_frame(self, in, produce, ctx, emit);
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  return beam_roi_host_image(self->priv, emit, 1);
}

const beam_stage_ops_t beam_roi_sum_cpu_ops = {
    .kind = "roi_sum", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
