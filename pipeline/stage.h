/* The stage interface: what every stage kind implements, per backend.
 *
 * Life cycle, all calls on the one thread that runs the stage (its own
 * worker, or its upstream's: stage key `thread`, graph.c) except init and
 * destroy (graph build / teardown thread):
 *   init    reads parameters from self->cfg, loads files (masks, darks),
 *           allocates what does not depend on the frame shape. On failure it
 *           fills d and returns < 0, leaving self destroyable: whoever calls
 *           init (the graph, the test harness) calls destroy afterwards
 *           whatever init returned, so cleaning up is destroy's alone.
 *   start   a series begins: `in` says what frames this stage will receive.
 *           Validate (shape, dtype), size per-series buffers (allocation is
 *           allowed here: it is not the per-frame path) and declare outputs
 *           in self->outs[0..nouts). Returning < 0 rejects the series for
 *           this stage: its frames are counted as rejected and skipped.
 *   process borrows `in` (read only, do not keep the pointer) and emits zero
 *           or more results through `emit`. Never allocates. Returns 0, or
 *           < 0 for a frame it rejects (counted, logged rate-limited).
 *   end     the series ended (or was aborted): emit final results.
 *   destroy frees everything; idempotent; cannot fail.
 *
 * A stage with work of its own between frames (an iterative reconstruction
 * that refines while views arrive) sets self->idle in init. The worker then
 * calls idle(self, emit) whenever its input queue is empty while a series is
 * open; idle does one bounded piece of work (one iteration) and returns 1
 * to be called again, 0 when it has nothing to do until the next frame, or
 * < 0 on error (counted and reported like a process error; idle is not
 * called again until the next frame). Results emitted from idle carry the
 * series identity, as from end. Long loops in end or idle poll
 * self->interrupt: it becomes non-zero when the graph shuts down.
 *
 * Output 0 is the one downstream stages receive when their `input:` names
 * this stage; `input: stage.output` picks another. */
#ifndef BEAM_STAGE_H
#define BEAM_STAGE_H

#include "pipeline/cfg.h"
#include "proto/err.h"
#include "pipeline/frame.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BEAM_STAGE_MAX_OUTS 8
#define BEAM_NAME_MAX 48
#define BEAM_STAGE_MAX_COUNTERS 4

#ifdef __cplusplus
using std::atomic_uint_fast64_t;
#endif

typedef struct beam_stage_s beam_stage_t;
typedef struct beam_emit_s beam_emit_t;
/* Tile fusion (beam_stage_s.reduce_mapped): fills out with elements
 * [off, off + n) of the upstream's output for the frame; < 0 on error (the
 * upstream's: the reduction then emits nothing and returns it). */
typedef int (*beam_produce_fn)(void *ctx, size_t off, size_t n, void *out);

/* What a stage receives: the series' frame geometry, or the upstream
 * stage's output geometry. */
typedef struct beam_indesc_s {
  beam_dtype_t dtype;
  uint32_t ndim;
  uint32_t shape[BEAM_MAX_NDIM];
} beam_indesc_t;

/* One declared output. shape is the largest the stage will emit (slots are
 * sized from it); an emitted frame may set a smaller shape. */
typedef struct beam_outdesc_s {
  char name[BEAM_NAME_MAX];  /* topic is "<stage>.<name>" */
  beam_dtype_t dtype;
  uint32_t ndim;
  uint32_t shape[BEAM_MAX_NDIM];
  const char *units;              /* e.g. "counts", "" */
  const char *axes[BEAM_MAX_NDIM]; /* axis names, e.g. "y", "x", "roi" */
  const char *labels_json;        /* optional JSON array (roi names) or NULL */
  unsigned slots;                 /* output slots; 0 = default (8, 64 when small) */
  int per_frame;                  /* 1: one result per input frame */
} beam_outdesc_t;

typedef struct beam_stage_ops_s {
  const char *kind;    /* matches `kind:` in YAML */
  const char *backend; /* "cpu" or "cuda" */
  int (*init)(beam_stage_t *self, beam_diag_t *d);
  int (*start)(beam_stage_t *self, const beam_series_t *series,
               const beam_indesc_t *in, beam_diag_t *d);
  int (*process)(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit);
  int (*end)(beam_stage_t *self, beam_emit_t *emit);
  void (*destroy)(beam_stage_t *self);
} beam_stage_ops_t;

struct beam_stage_s {
  const beam_stage_ops_t *ops;
  char name[BEAM_NAME_MAX];
  const beam_cnode_t *cfg; /* this stage's validated config map */
  void *priv;              /* backend state, owned by the backend */
  beam_outdesc_t outs[BEAM_STAGE_MAX_OUTS];
  unsigned nouts;
  beam_diag_t diag;        /* last process/end error, for rate-limited logs */
  int end_aborted;         /* during end: 1 when the series was cut short
                            * (drain, a new SERIES_START, ABORTED flag) */
  uint64_t end_missing;    /* during end: frames the source knows never came
                            * (beam_series_t.missing_frames; final by then) */
  int (*idle)(beam_stage_t *self, beam_emit_t *emit); /* optional, see above */
  /* Set in init by a stage whose process only reads its input during the
   * call, keeps no frame, and costs about one read of it (roi_sum with a
   * few ROIs): the only consumer of its upstream, it then runs on that
   * upstream's thread under `thread: auto` (graph.c). */
  int light;
  atomic_int interrupt;    /* set (never cleared) when the graph shuts down */
  /* Optional, set in init by a stage that can use an input frame still in
   * its wire codec (dec_state BEAM_DEC_PENDING, see frame.h) without its
   * pixels. The worker offers such a frame here before decoding it, and
   * once more after a decode that kept the wire bytes (frame.h
   * keep_encoded, beam_frame_encoded_kept): return 1 when the frame was
   * handled (process is not called), 0 to have it decoded and given to
   * process as usual, < 0 on error (counted and reported like a process
   * error). The frame is borrowed as in
   * process; take its encoded bytes only through beam_frame_encoded_lend,
   * since other stages may decode it at the same time. */
  int (*process_encoded)(beam_stage_t *self, beam_frame_t *in, beam_emit_t *emit);
  /* Tile fusion, both optional. A pointwise stage, whose process emits for
   * each frame (not CORRUPT) exactly one output-0 frame with the input's
   * element count, element i a function of input element i alone, sets
   * `map` in init: it writes elements [off, off + n) of that output for
   * `in` into out (n elements of output 0's dtype), or returns < 0 where
   * process would reject the frame. A light reduction that can sum its
   * input piece by piece sets `reduce_mapped` in start (or clears it) for
   * the series: instead of the frame's pixels (in->data is NULL; identity,
   * dtype and shape are the upstream output's) it receives produce, which
   * fills any range of them into its own buffer, and emits what process
   * would, bit for bit. When such a stage runs on such an upstream's
   * thread as its only reader (nothing published, no other consumer), the
   * graph calls them in place of the upstream's process and its own, so
   * the upstream's output is never written to memory (graph.c). */
  int (*map)(beam_stage_t *self, const beam_frame_t *in, size_t off, size_t n, void *out);
  int (*reduce_mapped)(beam_stage_t *self, const beam_frame_t *in, beam_produce_fn produce,
                       void *ctx, beam_emit_t *emit);
  /* Stage-specific counters, named in init (static strings) and counted by
   * the stage's own thread; stats and metrics read them from any thread. */
  struct {
    const char *name;
    atomic_uint_fast64_t value;
  } counters[BEAM_STAGE_MAX_COUNTERS];
  unsigned ncounters;
};

/* Emitting results from process/end. get returns a frame for output `out`
 * with dtype/shape from the declaration and identity copied from the input
 * frame being processed (or the series for end); it waits for a free slot
 * (backpressure) and returns NULL only when the graph is shutting down. put
 * hands it on (downstream stages and/or the publisher); drop returns it
 * unused. Both consume the frame. */
beam_frame_t *beam_emit_get(beam_emit_t *e, unsigned out);
void beam_emit_put(beam_emit_t *e, beam_frame_t *f);
void beam_emit_drop(beam_emit_t *e, beam_frame_t *f);

/* Stage kinds known to this build. Each kind's params table starts with
 * BEAM_STAGE_COMMON_PARAMS so a stage's map validates against one table. */
typedef struct beam_stage_kind_s {
  const char *kind;
  const char *doc;
  const beam_param_t *params;
  const beam_stage_ops_t *cpu;
  const beam_stage_ops_t *cuda; /* stubs in CPU-only builds; NULL: no CUDA backend */
  /* Optional checks across keys of one validated stage map (a key that is
   * valid alone but not with another), run at config load so that
   * --check-config reports them too: adds errors at file:line:col to errs
   * and returns how many. */
  int (*check)(const beam_cnode_t *cfg, beam_cfg_errs_t *errs);
} beam_stage_kind_t;

#define BEAM_STAGE_COMMON_PARAMS                                                       \
  {"name", BEAM_P_STRING, NULL, 1, 0, 0, NULL, NULL,                                   \
   "unique stage name; results are published as <name>.<output>", beam_stage_name_valid}, \
  {"kind", BEAM_P_STRING, NULL, 1, 0, 0, NULL, NULL, "stage kind", NULL},              \
  {"input", BEAM_P_STRING, "frames", 0, 0, 0, NULL, NULL,                              \
   "\"frames\" (the input stream), another stage's name, or stage.output", NULL},     \
  {"backend", BEAM_P_ENUM, "auto", 0, 0, 0, "cpu|cuda|auto", NULL,                     \
   "cpu, cuda, or auto (cuda when a GPU is present, else cpu)", NULL},                 \
  {"publish", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL,                                \
   "publish this stage's results on the output sockets", NULL},                        \
  {"queue", BEAM_P_INT, "32", 0, 1, 65536, NULL, NULL,                                 \
   "input queue depth (frames) in front of this stage", NULL},                         \
  {"thread", BEAM_P_ENUM, "auto", 0, 0, 0, "auto|own|upstream", NULL,                  \
   "own: a thread of its own; upstream: on the thread of the stage it reads (which "    \
   "must feed nothing else); auto: upstream for a light CPU stage (roi_sum, <= 8 ROIs) after a "   \
   "CPU stage when its input frames stay in the last-level cache, else own", NULL}

const char *beam_stage_name_valid(const beam_cnode_t *v);

const beam_stage_kind_t *beam_stage_kind_find(const char *kind);
/* NULL-terminated list of every kind. */
const beam_stage_kind_t *const *beam_stage_kinds(void);
/* Adds a kind defined outside pipeline/ (e.g. daemon/'s HDF5 `record`).
 * Call at start-up, before any config is loaded; not thread-safe. Returns
 * BEAM_EINVAL when another kind has the same name. */
int beam_stage_kind_register(const beam_stage_kind_t *k);

#ifdef __cplusplus
}
#endif
#endif
