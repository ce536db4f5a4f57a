/* Stage kind `xpcs_multitau`, CPU backend: per frame, gather the ROI
 * pixels once into a compact array (sorted by ROI, from the index list
 * built at start), push it through the level rings (level L+1 frame = sum
 * of the two latest level-L frames, as scikit-beam's binomial tree but
 * with sums instead of means), and for each new level frame add its pairs
 * with the buffered frames of lag channels i_min..min(n, nb)-1 to the
 * per-row, per-ROI accumulators.
 *
 * Integer input: int64 level sums; products summed in int64 over chunks
 * short enough that no partial sum can overflow (x->chunk[L], from the
 * dtype's range), then into 128-bit accumulators: exact, and the chunked
 * inner loop vectorises. Float input: double throughout, one accumulator
 * per dot in index order (the CUDA backend sums in another order, so float
 * results agree to round-off only; integer results are bit-identical).
 * Single-threaded: one stage, one worker. */
#include <math.h>
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_multitau.h"

#define GATHER_CASE(T, DT)                                                     \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    if (x->exact) {                                                            \
      int64_t *restrict o = dst;                                               \
      for (size_t p = 0; p < n; p++)                                           \
        o[p] = (int64_t)px[idx[p]];                                            \
    } else {                                                                   \
      double *restrict o = dst;                                                \
      for (size_t p = 0; p < n; p++)                                           \
        o[p] = (double)px[idx[p]];                                             \
    }                                                                          \
    break;                                                                     \
  }

static void gather(const beam_xmt_t *x, const void *frame, void *dst) {
  const uint32_t *restrict idx = x->rois.idx;
  size_t n = x->P;
  switch (x->in.dtype) {
    BEAM__REAL_DTYPES(GATHER_CASE)
  default: BEAM_ASSERT(!"xpcs_multitau: dtype not accepted at start");
  }
}

static inline void *lvl_at(const beam_xmt_t *x, unsigned L, size_t slot) {
  return (char *)x->lvl + ((size_t)L * x->conf.nb + slot) * x->P * beam_xmt_lvl_size(x);
}

static inline void *lsum_at(const beam_xmt_t *x, unsigned L, size_t slot) {
  return (char *)x->lsum + ((size_t)L * x->conf.nb + slot) * x->R * beam_xmt_acc_size(x);
}

/* Per-ROI sums of a level frame; returns 1 when one is NaN (a NaN pixel
 * makes the frame bad, as np.isnan(img).any() does in scikit-beam). */
static int roi_sums(const beam_xmt_t *x, const void *v, void *sums) {
  const uint64_t *off = x->rois.off;
  int nan = 0;
  for (size_t r = 0; r < x->R; r++) {
    size_t a = off[r], b = off[r + 1];
    if (x->exact) {
      /* Once per level frame (the dots cost nb times more): no need to
       * chunk, 128 bits per term. */
      const int64_t *p = v;
      beam_i128 t = 0;
      for (size_t k = a; k < b; k++)
        t += p[k];
      ((beam_i128 *)sums)[r] = t;
    } else {
      const double *p = v;
      double s = 0;
      for (size_t k = a; k < b; k++)
        s += p[k];
      ((double *)sums)[r] = s;
      nan |= isnan(s);
    }
  }
  return nan;
}

static beam_i128 dot_exact(const int64_t *restrict a, const int64_t *restrict b, size_t n, size_t chunk) {
  beam_i128 s = 0;
  if (chunk == 0) {
    for (size_t k = 0; k < n; k++)
      s += (beam_i128)a[k] * b[k];
    return s;
  }
  while (n > 0) {
    size_t m = n < chunk ? n : chunk;
    int64_t t = 0;
    for (size_t k = 0; k < m; k++)
      t += a[k] * b[k];
    s += t;
    a += m, b += m, n -= m;
  }
  return s;
}

static double dot_dbl(const double *restrict a, const double *restrict b, size_t n) {
  double s = 0;
  for (size_t k = 0; k < n; k++)
    s += a[k] * b[k];
  return s;
}

/* Level L just received its frame number n = nlev[L] (1-based): pairs with
 * the frames i back, i from i_min (0 at level 0, nb/2 above) to
 * min(n, nb) - 1 (scikit-beam's _one_time_process). */
static void accumulate(beam_xmt_t *x, unsigned L) {
  size_t nb = x->conf.nb, n = x->nlev[L], s = (n - 1) % nb, R = x->R;
  size_t imin = L ? nb / 2 : 0, imax = (n < nb ? n : nb);
  const uint8_t *bad = x->bad + (size_t)L * nb;
  const uint64_t *off = x->rois.off;
  if (bad[s])
    return;
  for (size_t i = imin; i < imax; i++) {
    size_t o = (n - 1 - i) % nb, t = beam_xmt_row(x, L, (unsigned)i);
    if (bad[o])
      continue;
    x->npairs[t]++;
    if (x->exact) {
      const int64_t *xs = lvl_at(x, L, s), *xo = lvl_at(x, L, o);
      const beam_i128 *ss = lsum_at(x, L, s), *so = lsum_at(x, L, o);
      beam_i128 *G = (beam_i128 *)x->G + t * R, *IP = (beam_i128 *)x->IP + t * R,
                *IF = (beam_i128 *)x->IF + t * R;
      for (size_t r = 0; r < R; r++) {
        G[r] += dot_exact(xo + off[r], xs + off[r], off[r + 1] - off[r], x->chunk[L]);
        IP[r] += so[r];
        IF[r] += ss[r];
      }
    } else {
      const double *xs = lvl_at(x, L, s), *xo = lvl_at(x, L, o);
      const double *ss = lsum_at(x, L, s), *so = lsum_at(x, L, o);
      double *G = (double *)x->G + t * R, *IP = (double *)x->IP + t * R, *IF = (double *)x->IF + t * R;
      for (size_t r = 0; r < R; r++) {
        G[r] += dot_dbl(xo + off[r], xs + off[r], off[r + 1] - off[r]);
        IP[r] += so[r];
        IF[r] += ss[r];
      }
    }
  }
}

void beam_xmt_push_cpu(beam_xmt_t *x, const void *frame, int bad) {
  size_t nb = x->conf.nb, P = x->P;
  size_t s = x->nlev[0] % nb;
  if (!bad) {
    gather(x, frame, lvl_at(x, 0, s));
    bad = roi_sums(x, lvl_at(x, 0, s), lsum_at(x, 0, s));
  }
  x->bad[s] = (uint8_t)bad;
  x->nframes++;
  x->nbad += bad != 0;
  x->nlev[0]++;
  accumulate(x, 0);
  for (unsigned L = 0; L + 1 < x->conf.levels && x->nlev[L] % 2 == 0; L++) {
    size_t n = x->nlev[L], a = (n - 2) % nb, b = (n - 1) % nb, d = x->nlev[L + 1] % nb;
    const uint8_t *bl = x->bad + (size_t)L * nb;
    /* NaN propagates through scikit-beam's means: one bad half spoils it */
    int bd = bl[a] || bl[b];
    if (!bd) {
      if (x->exact) {
        const int64_t *pa = lvl_at(x, L, a), *pb = lvl_at(x, L, b);
        int64_t *o = lvl_at(x, L + 1, d);
        for (size_t p = 0; p < P; p++)
          o[p] = pa[p] + pb[p];
      } else {
        const double *pa = lvl_at(x, L, a), *pb = lvl_at(x, L, b);
        double *o = lvl_at(x, L + 1, d);
        for (size_t p = 0; p < P; p++)
          o[p] = pa[p] + pb[p];
      }
      roi_sums(x, lvl_at(x, L + 1, d), lsum_at(x, L + 1, d));
    }
    x->bad[(size_t)(L + 1) * nb + d] = (uint8_t)bd;
    x->nlev[L + 1]++;
    accumulate(x, L + 1);
  }
}

/* ---- stage ops ------------------------------------------------------------ */

static void cpu_destroy(beam_stage_t *self) {
  beam_xmt_t *x = self->priv;
  if (!x)
    return;
  beam_xmt_free(x);
  free(x);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  beam_xmt_t *x = calloc(1, sizeof *x);
  if (!x)
    return BEAM_DIAG(d, BEAM_ENOMEM, "xpcs_multitau: out of memory");
  self->priv = x;
  int rc = beam_xmt_init(x, self->cfg, d);
  if (rc < 0)
    cpu_destroy(self);
  return rc;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  return beam_xmt_start(self, self->priv, series, in, d);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_xmt_t *x = self->priv;
  int bad = beam_xmt_flag_bad(in->flags);
  if (!(in->flags & BEAM_FLAG_CORRUPT)) {
    int rc = beam__frame_matches(self, in, x->in.dtype, x->in.ndim, x->in.shape);
    if (rc < 0)
      return rc;
  }
  beam_xmt_push_cpu(x, bad ? NULL : in->data, bad);
  if (x->conf.publish_every && x->nframes % x->conf.publish_every == 0)
    return beam_xmt_publish(x, emit, BEAM_FLAG_PARTIAL);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  return beam_xmt_publish(self->priv, emit, BEAM_FLAG_FINAL);
}

const beam_stage_ops_t beam_xpcs_multitau_cpu_ops = {
    "xpcs_multitau", "cpu", cpu_init, cpu_start, cpu_process, cpu_end, cpu_destroy};
