/* Stage kind `com`, CPU backend: the per-frame sums S, Sx, Sy over the
 * runs of pixels inside the disc, the plain reference they are tested
 * against, and the stage ops. The maps are com.c's, shared with CUDA.
 *
 * Per run (one row's stretch of the disc): 8- and 16-bit unsigned pixels
 * in 32-bit integers over chunks of 128 (sum v < 2^23, sum v j < 2^30
 * with j the index in the chunk), then Sx += (x0 + chunk start) x chunk
 * sum + sum v j in 64 bits: exact. Other dtypes in four independent double
 * lanes of sum v and sum v x, combined (l0 + l1) + (l2 + l3), so the loop
 * pipelines without the compiler reassociating a floating-point chain.
 * Sy gets y x (run sum), one multiply per run. Integer pixels: every
 * partial sum is an integer, exact while below 2^53, so the order does not
 * matter and the result equals the reference's.
 *
 * Measured (a throwaway bench over beam_com_sums_cpu, medians of 21 runs,
 * a shared 2-core VM under load 8, so noisy; ratios from one run):
 * 256x256, r = 64 (12.9k pixels): uint16 3.8 us (8.3 us before the AVX2
 * clone and the chunked integer form), float32 5.9 us, the reference loop
 * ~100 us; whole 512x512 uint16 frame 270 us vs reference 1490 us. */
#include <math.h>
#include <string.h>

#include "proto/clones.h"
#include "pipeline/kern/com.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define RUN_CASE(T, DT)                                                        \
  case DT: {                                                                   \
    const T *px = frame;                                                       \
    for (size_t k = 0; k < h->nrun; k++) {                                     \
      const beam_com_run_t *u = &h->run[k];                                    \
      const T *p = px + (size_t)u->y * w + u->x0;                              \
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;   \
      double x = u->x0;                                                        \
      uint32_t i = 0;                                                          \
      for (; i + 4 <= u->len; i += 4, x += 4) {                                \
        double v0 = (double)p[i], v1 = (double)p[i + 1], v2 = (double)p[i + 2], \
               v3 = (double)p[i + 3];                                          \
        a0 += v0, a1 += v1, a2 += v2, a3 += v3;                                \
        b0 += v0 * x, b1 += v1 * (x + 1), b2 += v2 * (x + 2), b3 += v3 * (x + 3); \
      }                                                                        \
      for (; i < u->len; i++, x++) {                                           \
        double v = (double)p[i];                                               \
        a0 += v;                                                               \
        b0 += v * x;                                                           \
      }                                                                        \
      double rs = (a0 + a1) + (a2 + a3);                                       \
      S += rs;                                                                 \
      Sx += (b0 + b1) + (b2 + b3);                                             \
      Sy += rs * (double)u->y;                                                 \
    }                                                                          \
    break;                                                                     \
  }

#define CHUNK 128
/* 0, 1, ..., CHUNK-1: the in-chunk index as data, so sum v j is a dot
 * product the vectoriser takes (an induction variable in the product is
 * not). */
static const uint32_t CHUNK_IDX[CHUNK] = {
#define I8(k) k, k + 1, k + 2, k + 3, k + 4, k + 5, k + 6, k + 7
    I8(0), I8(8), I8(16), I8(24), I8(32), I8(40), I8(48), I8(56),
    I8(64), I8(72), I8(80), I8(88), I8(96), I8(104), I8(112), I8(120)
#undef I8
};

/* Full chunks have a constant trip count (vectorised without an
 * epilogue, which -O2's cost model insists on); the tail is plain. */
#define NARROW_CASE(T, DT)                                                     \
  case DT: {                                                                   \
    const T *px = frame;                                                       \
    for (size_t k = 0; k < h->nrun; k++) {                                     \
      const beam_com_run_t *u = &h->run[k];                                    \
      const T *restrict p = px + (size_t)u->y * w + u->x0;                     \
      uint64_t rs = 0, rx = 0;                                                 \
      uint32_t c = 0;                                                          \
      for (; c + CHUNK <= u->len; c += CHUNK) {                                \
        uint32_t cs = 0, cx = 0;                                               \
        for (int j = 0; j < CHUNK; j++) {                                      \
          uint32_t v = p[c + j];                                               \
          cs += v;                                                             \
          cx += v * CHUNK_IDX[j];                                              \
        }                                                                      \
        rs += cs;                                                              \
        rx += (uint64_t)(u->x0 + c) * cs + cx;                                 \
      }                                                                        \
      for (; c < u->len; c++) {                                                \
        rs += p[c];                                                            \
        rx += (uint64_t)p[c] * (u->x0 + c);                                    \
      }                                                                        \
      S += (double)rs;                                                         \
      Sx += (double)rx;                                                        \
      Sy += (double)rs * (double)u->y;                                         \
    }                                                                          \
    break;                                                                     \
  }

/* Baseline x86-64 (SSE2) has no 32-bit multiply to vectorise v j with;
 * an AVX2 clone, picked at load time where the CPU has it, does. Integer
 * sums are exact, so both clones give the same result. */
#if !defined(COM_CLONES) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define COM_CLONES BEAM_TARGET_CLONES("avx2", "default")
#endif
#endif
#ifndef COM_CLONES
#define COM_CLONES
#endif

COM_CLONES
void beam_com_sums_cpu(const beam_com_host_t *h, beam_dtype_t dt, const void *frame, double s[3]) {
  size_t w = h->in.shape[1];
  double S = 0, Sx = 0, Sy = 0;
  switch (dt) {
    NARROW_CASE(uint8_t, BEAM_DT_U8)
    NARROW_CASE(uint16_t, BEAM_DT_U16)
    RUN_CASE(uint32_t, BEAM_DT_U32)
    RUN_CASE(uint64_t, BEAM_DT_U64)
    RUN_CASE(int8_t, BEAM_DT_I8)
    RUN_CASE(int16_t, BEAM_DT_I16)
    RUN_CASE(int32_t, BEAM_DT_I32)
    RUN_CASE(int64_t, BEAM_DT_I64)
    RUN_CASE(float, BEAM_DT_F32)
    RUN_CASE(double, BEAM_DT_F64)
  default: BEAM_ASSERT(!"com: dtype not accepted at start");
  }
  s[0] = S, s[1] = Sx, s[2] = Sy;
}

static double px_at(beam_dtype_t dt, const void *frame, size_t i) {
  switch (dt) {
#define PX_CASE(T, DT) case DT: return (double)((const T *)frame)[i];
    BEAM__REAL_DTYPES(PX_CASE)
#undef PX_CASE
  default: BEAM_ASSERT(!"com: dtype not accepted at start"); return 0;
  }
}

void beam_com_sums_ref(const beam_com_host_t *h, beam_dtype_t dt, const void *frame, double s[3]) {
  uint32_t hh = h->in.shape[0], w = h->in.shape[1];
  double S = 0, Sx = 0, Sy = 0;
  for (uint32_t y = 0; y < hh; y++)
    for (uint32_t x = 0; x < w; x++) {
      if (!beam_com_inside(h, y, x))
        continue;
      double v = px_at(dt, frame, (size_t)y * w + x);
      S += v;
      Sx += v * x;
      Sy += v * y;
    }
  s[0] = S, s[1] = Sx, s[2] = Sy;
}

/* ---- stage ops ------------------------------------------------------------ */

static void cpu_destroy(beam_stage_t *self) {
  beam_com_host_t *h = self->priv;
  if (!h)
    return;
  beam_com_host_free(h);
  free(h);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  beam_com_host_t *h = calloc(1, sizeof *h);
  if (!h)
    return BEAM_DIAG(d, BEAM_ENOMEM, "com: out of memory");
  self->priv = h;
  return beam_com_host_init(h, self->cfg, d);
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  return beam_com_host_start(self, self->priv, series, in, 0, d);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_com_host_t *h = self->priv;
  if (in->flags & BEAM_FLAG_CORRUPT)
    return beam_com_host_corrupt(self, h, emit);
  int rc = beam__frame_matches(self, in, h->in.dtype, h->in.ndim, h->in.shape);
  if (rc < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0;
  double s[3];
  beam_com_sums_cpu(h, in->dtype, in->data, s);
  beam_com_finish(h, s, f->data);
  beam_com_host_record(h, in->frame_id, f->data);
  beam_emit_put(emit, f);
  return beam_com_host_maps(self, h, emit, 0);
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  return beam_com_host_maps(self, self->priv, emit, 1);
}

const beam_stage_ops_t beam_com_cpu_ops = {
    .kind = "com", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
