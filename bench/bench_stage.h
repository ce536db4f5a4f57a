/* What the benchmark drivers share: clocks, and an emitter that drives one
 * stage's ops without a graph. Header-only because each driver in bench/ is its
 * own program (the Makefile builds one binary per file).
 *
 * The emitter hands out one fixed buffer per output, sized and shaped from
 * the stage's declarations as the graph's pool slots are, and counts puts.
 * Unlike tests/common/stage_harness it allocates nothing per result, so it
 * does not enter the timings. */
#ifndef BEAM_BENCH_STAGE_H
#define BEAM_BENCH_STAGE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipeline/emit_int.h"
#include "pipeline/stage.h"

static inline uint64_t bench_clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t bench_now_ns(void) { return bench_clock_ns(CLOCK_MONOTONIC); }
static inline double bench_now_s(void) { return 1e-9 * (double)bench_now_ns(); }
/* CPU time of every thread of the process: on a shared machine it moves
 * less than the wall clock, and it counts worker threads spinning idle. */
static inline uint64_t bench_cpu_ns(void) { return bench_clock_ns(CLOCK_PROCESS_CPUTIME_ID); }
static inline double bench_cpu_s(void) { return 1e-9 * (double)bench_cpu_ns(); }

typedef struct bench_emitter_s {
  beam_frame_t outs[BEAM_STAGE_MAX_OUTS];
  const beam_frame_t *in; /* when set, results get its identity (as the graph does) */
  uint64_t puts;
} bench_emitter_t;

static inline beam_frame_t *bench_em_get(void *ctx, unsigned out) {
  bench_emitter_t *e = ctx;
  if (out >= BEAM_STAGE_MAX_OUTS || !e->outs[out].data)
    return NULL;
  beam_frame_t *f = &e->outs[out];
  if (e->in)
    beam_frame_copy_ident(f, e->in);
  return f;
}
static inline void bench_em_put(void *ctx, beam_frame_t *f) {
  (void)f;
  ((bench_emitter_t *)ctx)->puts++;
}
static inline void bench_em_drop(void *ctx, beam_frame_t *f) {
  (void)ctx;
  (void)f;
}

/* Zeroes em and gives each of st's declared outputs a 64-byte aligned
 * buffer of its largest size. Returns 0, or -1 when out of memory (what was
 * allocated is freed). */
static inline int bench_emitter_init(bench_emitter_t *em, const beam_stage_t *st) {
  memset(em, 0, sizeof *em);
  for (unsigned o = 0; o < st->nouts; o++) {
    const beam_outdesc_t *od = &st->outs[o];
    size_t nb = beam_dtype_size(od->dtype);
    for (uint32_t i = 0; i < od->ndim; i++)
      nb *= od->shape[i];
    beam_frame_t *f = &em->outs[o];
    f->data = aligned_alloc(64, (nb + 63) & ~(size_t)63);
    if (!f->data) {
      for (unsigned p = 0; p < o; p++)
        free(em->outs[p].data);
      memset(em, 0, sizeof *em);
      return -1;
    }
    f->cap = f->nbytes = nb;
    f->dtype = od->dtype;
    f->ndim = od->ndim;
    memcpy(f->shape, od->shape, sizeof f->shape);
  }
  return 0;
}

static inline void bench_emitter_free(bench_emitter_t *em) {
  for (unsigned o = 0; o < BEAM_STAGE_MAX_OUTS; o++)
    free(em->outs[o].data);
  memset(em, 0, sizeof *em);
}

static inline beam_emit_t bench_emit(bench_emitter_t *em) {
  return (beam_emit_t){em, bench_em_get, bench_em_put, bench_em_drop};
}

#endif
