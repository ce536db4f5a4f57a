/* Stage kind `correct`, CPU backend: the fast table-driven loop, the plain
 * reference loop it is tested against, and the stage ops.
 *
 * The fast loop is branch-free per pixel (selects, not ifs) so the compiler
 * vectorises it; the reference re-derives every decision from the loaded
 * arrays. Both do the same float32 operations in the same order,
 * (float)raw - dark, then / flat, so their outputs are bit-identical.
 *
 * The gap value is an equality test on the raw value, in double (NaN when
 * there is none, which equals nothing). The float-only loops test
 * v == gap_f instead: gap_f is the gap when float32 holds it exactly, else
 * NaN, and since (float)r is exact for uint16 and float32, v == gap_f
 * decides as (double)r == gap does. */
#include <math.h>
#include "proto/clones.h"
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target)
#include <immintrin.h>
#define CORRECT_STREAM 1
#endif
#endif

#include "pipeline/cache.h"
#include "pipeline/kern/correct.h"
#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"

#define CORRECT_LOOP(T)                                                         \
  do {                                                                          \
    const T *restrict r = raw;                                                  \
    for (size_t i = 0; i < n; i++) {                                            \
      float v = (float)r[i];                                                    \
      float o = (v - dk[i]) / fl[i];                                            \
      o = (double)o < thr ? 0.0f : o;                                           \
      int b = bad[i] | ((double)r[i] >= sat) | ((double)r[i] == gap);           \
      out[i] = b ? badv : o;                                                    \
    }                                                                           \
  } while (0)

/* float-only form: (float)r is exact for uint16 and float32, and comparing a
 * float with the smallest float >= x decides exactly as comparing it with x
 * in double, so this is bit-identical to CORRECT_LOOP and vectorises. */
#define CORRECT_LOOP_F(T)                                                       \
  do {                                                                          \
    const T *restrict r = raw;                                                  \
    for (size_t i = 0; i < n; i++) {                                            \
      float v = (float)r[i];                                                    \
      float o = (v - dk[i]) / fl[i];                                            \
      o = o < thr_f ? 0.0f : o;                                                 \
      int b = bad[i] | (v >= sat_f) | (v == gap_f);                             \
      out[i] = b ? badv : o;                                                    \
    }                                                                           \
  } while (0)

/* No dark, flat or mask (threshold, saturation and gap value only, as the
 * built-in configuration runs): (v - 0.0f) / 1.0f == v exactly, so skipping
 * the table reads gives the same bits with a third of the memory traffic. */
#define CORRECT_LOOP_PLAIN(T)                                                   \
  do {                                                                          \
    const T *restrict r = raw;                                                  \
    for (size_t i = 0; i < n; i++) {                                            \
      float v = (float)r[i];                                                    \
      float o = v < thr_f ? 0.0f : v;                                           \
      out[i] = ((v >= sat_f) | (v == gap_f)) ? badv : o;                        \
    }                                                                           \
  } while (0)

/* The same when the gap test cannot change the result: no gap value (NaN
 * equals nothing), or one at or above saturation (v == gap_f >= sat_f
 * implies v >= sat_f), as uint16 with saturation below 65535 has. Two
 * vector operations of nine fewer per 8 pixels, the same bits. */
#define CORRECT_LOOP_PLAIN_SAT(T)                                               \
  do {                                                                          \
    const T *restrict r = raw;                                                  \
    for (size_t i = 0; i < n; i++) {                                            \
      float v = (float)r[i];                                                    \
      float o = v < thr_f ? 0.0f : v;                                           \
      out[i] = v >= sat_f ? badv : o;                                           \
    }                                                                           \
  } while (0)

static float ceil_float(double x) {
  float f = (float)x;
  if ((double)f < x)
    f = nextafterf(f, INFINITY);
  return f;
}

/* x when float32 holds it exactly, else NaN (no float equals x then). */
static float exact_float(double x) {
  float f = (float)x;
  return (double)f == x ? f : NAN;
}

/* An AVX2 clone where the CPU has it, as roi_sum has: the baseline
 * x86-64 build (SSE2) lacks the widening loads and blends these loops
 * need and emulates them: 512x512 uint16 without tables, 49 -> 21 us a
 * frame (16-18 us with the saturation-only loop), against 10 us for a
 * memcpy of the input bytes. The same operations in the same order, so
 * the same bits. */
#if !defined(CORRECT_CLONES) && defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones) /* -DCORRECT_CLONES= builds SSE2 only */
#define CORRECT_CLONES BEAM_TARGET_CLONES("avx2", "default")
#endif
#endif
#ifndef CORRECT_CLONES
#define CORRECT_CLONES
#endif

CORRECT_CLONES
void beam_correct_cpu(const beam_correct_tab_t *t, const beam_correct_conf_t *c,
                      beam_dtype_t dt, const void *raw, float *restrict out) {
  const float *restrict dk = t->dark, *restrict fl = t->flat;
  const uint8_t *restrict bad = t->bad;
  const size_t n = t->n;
  const double thr = c->threshold, sat = c->saturation, gap = t->gap;
  const float thr_f = ceil_float(thr), sat_f = ceil_float(sat), gap_f = exact_float(gap);
  const float badv = c->bad_value;
  const int gap_moot = isnan(gap_f) || gap_f >= sat_f;
  if (t->plain && dt == BEAM_DT_U16 && gap_moot) {
    CORRECT_LOOP_PLAIN_SAT(uint16_t);
    return;
  }
  if (t->plain && dt == BEAM_DT_U16) {
    CORRECT_LOOP_PLAIN(uint16_t);
    return;
  }
  if (t->plain && dt == BEAM_DT_F32) {
    CORRECT_LOOP_PLAIN(float);
    return;
  }
  switch (dt) {
  case BEAM_DT_U16: CORRECT_LOOP_F(uint16_t); break;
  case BEAM_DT_U32: CORRECT_LOOP(uint32_t); break;
  case BEAM_DT_F32: CORRECT_LOOP_F(float); break;
  default: BEAM_ASSERT(!"correct: dtype not accepted at start");
  }
}

void beam_correct_ref(const beam_correct_conf_t *c, const beam_correct_src_t *src,
                      beam_dtype_t dt, const void *raw, size_t n, float *out) {
  for (size_t i = 0; i < n; i++) {
    double r = beam_elem_get(raw, dt, i);
    float dark = src->dark ? (float)beam_array_get(src->dark, i) : 0.0f;
    float flat = 1.0f;
    if (src->flat && src->flat_mul) /* out = (raw - dark) x factor, as / (1 / factor) */
      flat = (float)(1.0 / beam_array_get(src->flat, i));
    else if (src->flat)
      flat = (float)beam_array_get(src->flat, i);
    int masked = src->mask && beam_array_get(src->mask, i) != 0.0;
    /* The gap value straight from the configuration: 2^N - 1 of an
     * unsigned N-bit dtype for auto. */
    int gap = 0;
    if (c->gap_mode == BEAM_CORRECT_GAP_AUTO)
      gap = (dt == BEAM_DT_U16 && r == 65535.0) || (dt == BEAM_DT_U32 && r == 4294967295.0);
    else if (c->gap_mode == BEAM_CORRECT_GAP_VALUE)
      gap = r == c->gap_value;
    if (masked || gap || !isfinite(dark) || !isfinite(flat) || flat <= 0.0f ||
        r >= c->saturation) {
      out[i] = c->bad_value;
      continue;
    }
    /* (float)r is exact for uint16 and float32 and is the one rounding of a
     * uint32, the same as the fast loop's direct conversion. */
    float v = ((float)r - dark) / flat;
    out[i] = (double)v < c->threshold ? 0.0f : v;
  }
}

/* ---- stage ops ------------------------------------------------------------ */

typedef struct cpu_s {
  beam_correct_conf_t conf;
  beam_correct_tab_t tab;
  beam_indesc_t in;
} cpu_t;

static int cpu_map(beam_stage_t *self, const beam_frame_t *in, size_t off, size_t n, void *out);

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *s = self->priv;
  if (!s)
    return;
  beam_correct_conf_free(&s->conf);
  beam_correct_tab_free(&s->tab);
  free(s);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *s = calloc(1, sizeof *s);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "correct: out of memory");
  self->priv = s;
  int rc = beam_correct_conf_load(&s->conf, self->cfg, d);
  if (rc == 0)
    self->map = cpu_map;
  return rc;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *s = self->priv;
  /* src borrows the series' arrays for `series` keys: used here only, the
   * tables keep what process needs. */
  beam_correct_src_t src;
  int rc = beam_correct_start(self, &s->conf, series, in, &src, d);
  if (rc < 0)
    return rc;
  size_t n = 1;
  for (uint32_t i = 0; i < in->ndim; i++)
    n *= in->shape[i];
  if ((rc = beam_correct_tab_build(&s->tab, &src, n, d)) < 0)
    return rc;
  s->in = *in;
  return 0;
}

/* The tables of elements [off, off + n): the loops on them give those
 * elements' bits exactly. */
static beam_correct_tab_t tab_range(const beam_correct_tab_t *t, size_t off, size_t n) {
  beam_correct_tab_t b = *t;
  b.n = n;
  if (b.dark)
    b.dark += off;
  if (b.flat)
    b.flat += off;
  if (b.bad)
    b.bad += off;
  return b;
}

/* Frames whose float32 output will not stay in the last-level cache until
 * the next stage reads it (beam_cache_resident) are written with
 * streaming stores: ordinary stores first read every line they write
 * (write-allocate), a third more memory traffic for a loop that is memory
 * bound at that size (2048x2048: 16 MiB written, 8 MiB read). Where the
 * output does stay, streaming would push it out to memory for the reader
 * to fetch back: on a 2-core VM with 480 MiB of L3, 2048x2048 uint16
 * correct -> roi_sum went from 55-61 % to 69-97 % of raw ZeroMQ without
 * them (bench/run.py throughput); on a Zen 4 VM with 32 MiB they gained. */
/* Pixels per block: computed into an L1-resident buffer by the loops
 * above, then streamed out, so the bits are the loops' own. */
#define STREAM_BLOCK 2048

#ifdef CORRECT_STREAM
__attribute__((target("avx2"))) static void stream_out(float *restrict dst,
                                                       const float *restrict src, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_stream_ps(dst + i, _mm256_load_ps(src + i));
  for (; i < n; i++)
    dst[i] = src[i];
}

/* Out in blocks through buf: the same loop on each block's pixels (the
 * tables offset to match), streamed to out; 0 when it does not apply. */
static int correct_streamed(const beam_correct_tab_t *t, const beam_correct_conf_t *c,
                            beam_dtype_t dt, const void *raw, float *out) {
  if (beam_cache_resident(t->n * sizeof(float)) || ((uintptr_t)out & 31) ||
      !__builtin_cpu_supports("avx2"))
    return 0;
  _Alignas(64) float buf[STREAM_BLOCK];
  size_t esz = beam_dtype_size(dt);
  for (size_t off = 0; off < t->n; off += STREAM_BLOCK) {
    beam_correct_tab_t b = tab_range(t, off, t->n - off < STREAM_BLOCK ? t->n - off : STREAM_BLOCK);
    beam_correct_cpu(&b, c, dt, (const char *)raw + off * esz, buf);
    stream_out(out + off, buf, b.n);
  }
  _mm_sfence(); /* the frame is handed to another thread next */
  return 1;
}
#endif

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  cpu_t *s = self->priv;
  int corrupt = (in->flags & BEAM_FLAG_CORRUPT) != 0;
  int rc;
  if (!corrupt && (rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape)) < 0)
    return rc;
  beam_frame_t *f = beam_emit_get(emit, 0);
  if (!f)
    return 0; /* shutting down */
  if (corrupt) {
    /* No payload: keep the stream's frame count and shape, with NaN pixels. */
    float *o = f->data;
    for (size_t i = 0; i < s->tab.n; i++)
      o[i] = NAN;
  } else {
#ifdef CORRECT_STREAM
    if (!correct_streamed(&s->tab, &s->conf, in->dtype, in->data, f->data))
#endif
      beam_correct_cpu(&s->tab, &s->conf, in->dtype, in->data, f->data);
  }
  beam_emit_put(emit, f);
  return 0;
}

/* Tile fusion (stage.h): the same loop on elements [off, off + n), the
 * tables offset to match, so the bits are process's own. */
static int cpu_map(beam_stage_t *self, const beam_frame_t *in, size_t off, size_t n, void *out) {
  cpu_t *s = self->priv;
  int rc = beam__frame_matches(self, in, s->in.dtype, s->in.ndim, s->in.shape);
  if (rc < 0)
    return rc;
  if (off > s->tab.n || n > s->tab.n - off)
    return BEAM_DIAG(&self->diag, BEAM_EINVAL, "correct: range %zu+%zu outside the frame", off, n);
  beam_correct_tab_t b = tab_range(&s->tab, off, n);
  beam_correct_cpu(&b, &s->conf, in->dtype, (const char *)in->data + off * beam_dtype_size(in->dtype), out);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) { return 0; }

const beam_stage_ops_t beam_correct_cpu_ops = {
    .kind = "correct", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
