/* Test harness: drives one stage's ops (init, start, process, end,
 * destroy) without a graph, capturing what it emits, and builds the config
 * trees and frames the tests feed it.
 *
 * Emitted frames come from the harness, not a pool: each is malloc'd with
 * exactly the bytes its output declaration allows, so a stage writing past
 * its declared shape is caught by ASan. The emitter is the real
 * beam_emit_* dispatch (pipeline/emit.c) through pipeline/emit_int.h; this
 * file defines no beam_emit_* symbol. */
#ifndef BEAM_STAGE_HARNESS_H
#define BEAM_STAGE_HARNESS_H

#include "pipeline/cfg.h"
#include "pipeline/emit_int.h"
#include "pipeline/stage.h"

typedef struct bh_s {
  beam_stage_t st;
  beam_cnode_t *cfg;       /* owned */
  beam_emit_t emit;
  const beam_frame_t *cur; /* frame being processed; NULL in end */
  beam_series_t series;
  int inited;
  beam_frame_t **res;      /* emitted, in order */
  unsigned *res_out;       /* which output each came from */
  size_t nres, cap;
  size_t outstanding;      /* got but neither put nor dropped */
} bh_t;

/* ---- config trees ---- */
beam_cnode_t *bh_map(void);
beam_cnode_t *bh_seq(void);
beam_cnode_t *bh_scalar(const char *text);
/* map[key] = scalar text; text "[1, 2, 3]" becomes a sequence of scalars. */
void bh_set(beam_cnode_t *map, const char *key, const char *text);
void bh_put(beam_cnode_t *map, const char *key, beam_cnode_t *node); /* takes node */
void bh_push(beam_cnode_t *seq, beam_cnode_t *node);                /* takes node */
/* A stage map with name/kind set. */
beam_cnode_t *bh_stage_cfg(const char *kind);
/* Sets key/value pairs (kv: NULL-terminated) on map c. Values "@rect" (one
 * rectangle ROI [0, 0, 8, 8], a list of maps), "@labels" (a map {file:
 * labels}) and "@dir" (dir) stand for what text cannot say; the sweeps of
 * every stage kind share it. */
void bh_set_kv(beam_cnode_t *c, const char *const *kv, const char *labels, const char *dir);
/* Validates against params; returns the error count and, when msg is not
 * NULL, copies the first message into it. */
int bh_validate(beam_cnode_t *cfg, const beam_param_t *params, char *msg, size_t len);

/* ---- life cycle ---- */
/* Takes cfg (freed by bh_free even on failure). Runs init; returns its rc
 * with the message in d. *out is set either way (destroy runs in bh_free). */
int bh_new(bh_t **out, const beam_stage_ops_t *ops, beam_cnode_t *cfg, beam_diag_t *d);
/* bh_new in two steps, for a test that must act between them (the
 * allocation-failure sweep arms its counter after the harness's own). */
bh_t *bh_alloc(const beam_stage_ops_t *ops, beam_cnode_t *cfg);
int bh_init(bh_t *h, beam_diag_t *d);
/* init, start on f's geometry, n copies of f (frame ids 0..n-1), end:
 * a whole series as the graph runs it. Returns the first error, its
 * message in d. */
int bh_series(bh_t *h, beam_frame_t *f, int n, beam_diag_t *d);
/* Validates cfg against params (a failure fails the test), runs bh_new and
 * fails the test unless init returned expect_rc and, when expect_msg is
 * given, its message contains expect_msg. */
bh_t *bh_make(beam_cnode_t *cfg, const beam_param_t *params, const beam_stage_ops_t *ops,
              int expect_rc, const char *expect_msg);
int bh_start(bh_t *h, beam_dtype_t dt, uint32_t ndim, const uint32_t *shape, beam_diag_t *d);
int bh_process(bh_t *h, const beam_frame_t *in);
int bh_end(bh_t *h);
/* The last captured result of output `out`, or NULL. */
beam_frame_t *bh_last(bh_t *h, unsigned out);
void bh_clear(bh_t *h); /* frees captured results */
void bh_free(bh_t **h);

/* ---- frames ---- */
beam_frame_t *bh_frame_new(beam_dtype_t dt, uint32_t ndim, const uint32_t *shape, uint64_t frame_id);
void bh_frame_free(beam_frame_t *f);
/* Fills with deterministic pseudo-random values in [0, maxval] (integers
 * for integer dtypes, fractions for floats). */
void bh_frame_fill(beam_frame_t *f, uint64_t seed, double maxval);

/* GPU cross-checks: 1 when a CUDA device is usable; otherwise prints why
 * (the caller then calls cmocka's skip()), or fails the test when
 * BEAM_REQUIRE_GPU=1 is set (make check-gpu on a GPU runner). */
int bh_gpu_available(void);

/* Counts mismatching bytes of n floats/doubles (bitwise, NaN == NaN). */
size_t bh_bits_differ(const void *a, const void *b, size_t nbytes);

/* Writes a little-endian C-order .npy file; returns 0 or -1. */
int bh_write_npy(const char *path, const char *descr, uint32_t ndim, const uint32_t *shape,
                 const void *data, size_t nbytes);
/* A fresh temporary directory for the test's files (mkdtemp). */
const char *bh_tmpdir(void);

#endif
