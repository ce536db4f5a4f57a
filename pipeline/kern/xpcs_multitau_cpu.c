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
 * Narrow slots (roi mode, integer input): a level frame whose values all
 * fit |v| <= 32767, which is every level frame of photon-counting data up
 * to high levels, is stored as int16 (x->lv16) instead of int64, and the
 * dots of two narrow frames run blocked over pixels (a 4096-pixel chunk of
 * the new frame stays in L1 while every lag's old frame streams past it)
 * with 16-bit multiply-adds into int32 partial sums short enough not to
 * overflow (from the slots' actual maxima), compiled for AVX2 (and baseline) by
 * function multiversioning. Same exact integers, a quarter of the memory
 * traffic; wide slots take the int64 path above.
 * normalization per_pixel: the same rings, but each pair adds into
 * per-pixel accumulators [row][pixel] (plain streams over all ROI pixels),
 * with the int64 overflow bound of xpcs_multitau.h checked per pair.
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

#define NARROW_MAX 32767
#define CHUNK16 4096 /* int16 pixels per block: 8 KiB of the new frame in L1 */

static inline int16_t *l16_at(const beam_xmt_t *x, unsigned L, size_t slot) {
  return x->lv16 + ((size_t)L * x->conf.nb + slot) * x->P;
}

static inline int is_wide(const beam_xmt_t *x, unsigned L, size_t slot) {
  return !x->lv16 || x->wide[(size_t)L * x->conf.nb + slot];
}

/* Level-0 slot s as int16, with the extremes; exact dtypes only. By runs
 * of consecutive pixels when x->run_src exists (a vectorisable copy per
 * run), else one index per pixel. */
#define GATHER16_CASE(T, DT)                                                   \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    T lo = 0, hi = 0;                                                          \
    if (x->run_src) {                                                          \
      int16_t *restrict q = o;                                                 \
      for (size_t j = 0; j < x->nruns; j++) {                                  \
        const T *restrict src = px + x->run_src[j];                            \
        size_t len = x->run_len[j];                                            \
        for (size_t k = 0; k < len; k++) {                                     \
          T v = src[k];                                                        \
          q[k] = (int16_t)v; /* kept only when every value fits */             \
          lo = v < lo ? v : lo;                                                \
          hi = v > hi ? v : hi;                                                \
        }                                                                      \
        q += len;                                                              \
      }                                                                        \
    } else {                                                                   \
      for (size_t p = 0; p < n; p++) {                                         \
        T v = px[idx[p]];                                                      \
        o[p] = (int16_t)v;                                                     \
        lo = v < lo ? v : lo;                                                  \
        hi = v > hi ? v : hi;                                                  \
      }                                                                        \
    }                                                                          \
    m = (int64_t)hi > -(int64_t)lo ? (int64_t)hi : -(int64_t)lo;               \
    break;                                                                     \
  }

/* Returns max |pixel|; the int16 copy is valid when that is <= NARROW_MAX.
 * (Clones as for the dots below: the per-frame streams are the rest of the
 * time.) */
__attribute__((target_clones("avx2", "default"))) static int64_t gather16(const beam_xmt_t *x, const void *frame, int16_t *restrict o) {
  const uint32_t *restrict idx = x->rois.idx;
  size_t n = x->P;
  int64_t m = 0;
  switch (x->in.dtype) {
    GATHER16_CASE(uint8_t, BEAM_DT_U8)
    GATHER16_CASE(uint16_t, BEAM_DT_U16)
    GATHER16_CASE(uint32_t, BEAM_DT_U32)
    GATHER16_CASE(int8_t, BEAM_DT_I8)
    GATHER16_CASE(int16_t, BEAM_DT_I16)
    GATHER16_CASE(int32_t, BEAM_DT_I32)
  default: BEAM_ASSERT(!"xpcs_multitau: narrow slots need an integer dtype");
  }
  return m;
}

/* Per-ROI sums of a narrow slot: int32 partials over 65536 pixels
 * (65536 * 32767 < 2^31, and they vectorise), int64 totals. */
__attribute__((target_clones("avx2", "default"))) static void roi_sums16(const beam_xmt_t *x,
                                                                         const int16_t *v,
                                                                         beam_i128 *sums) {
  const uint64_t *off = x->rois.off;
  for (size_t r = 0; r < x->R; r++) {
    int64_t t = 0;
    for (size_t c = off[r]; c < off[r + 1]; c += 65536) {
      size_t e = off[r + 1] - c < 65536 ? off[r + 1] : c + 65536;
      int32_t u = 0;
      for (size_t k = c; k < e; k++)
        u += v[k];
      t += u;
    }
    sums[r] = t;
  }
}

/* o = a + b over n narrow pixels; returns max |o|. */
__attribute__((target_clones("avx2", "default"))) static uint64_t add16(const int16_t *restrict a,
                                                                        const int16_t *restrict b,
                                                                        int16_t *restrict o, size_t n) {
  int lo = 0, hi = 0;
  for (size_t p = 0; p < n; p++) {
    int v = a[p] + b[p];
    o[p] = (int16_t)v;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  return (uint64_t)(hi > -lo ? hi : -lo);
}

/* Dots of two narrow frames. int32 partials when n * max|a| * max|b| fits
 * (the caller checks): the pattern GCC turns into pmaddwd. The clones let
 * one portable binary use the widest vectors of the machine it runs on. */
__attribute__((target_clones("avx2", "default"))) static int32_t
dot16_32(const int16_t *restrict a, const int16_t *restrict b, size_t n) {
  int32_t t = 0;
  for (size_t k = 0; k < n; k++)
    t += a[k] * b[k];
  return t;
}

__attribute__((target_clones("avx2", "default"))) static int64_t
dot16_64(const int16_t *restrict a, const int16_t *restrict b, size_t n) {
  int64_t t = 0;
  for (size_t k = 0; k < n; k++)
    t += a[k] * b[k]; /* each product <= 2^30 fits int */
  return t;
}

/* A narrow and a wide frame (slots straddling the 16-bit limit: rare). */
static beam_i128 dot_mixed(const int16_t *a, const int64_t *b, size_t n) {
  beam_i128 s = 0;
  for (size_t k = 0; k < n; k++)
    s += (beam_i128)a[k] * b[k];
  return s;
}

/* Per-ROI sums of a level frame; returns 1 when one is NaN (a NaN pixel
 * makes the frame bad, as np.isnan(img).any() does in scikit-beam).
 * per_pixel with integers: also the frame's max |pixel| into *vmax. */
static int roi_sums(const beam_xmt_t *x, const void *v, void *sums, uint64_t *vmax) {
  if (vmax && x->exact && x->conf.per_pixel) {
    const int64_t *p = v;
    uint64_t m = 0;
    for (size_t k = 0; k < x->P; k++) {
      uint64_t a = p[k] < 0 ? -(uint64_t)p[k] : (uint64_t)p[k];
      m = a > m ? a : m;
    }
    *vmax = m;
  }
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

/* per_pixel: one pair (frames xo, xs) into row t's per-pixel sums. */
static void pair_pixels(beam_xmt_t *x, size_t t, const void *vo, const void *vs) {
  size_t P = x->P;
  if (x->exact) {
    const int64_t *restrict xo = vo, *restrict xs = vs;
    int64_t *restrict g = (int64_t *)x->pG + t * P, *restrict ip = (int64_t *)x->pIP + t * P,
                      *restrict fu = (int64_t *)x->pIF + t * P;
    for (size_t p = 0; p < P; p++) {
      g[p] += xo[p] * xs[p];
      ip[p] += xo[p];
      fu[p] += xs[p];
    }
  } else {
    const double *restrict xo = vo, *restrict xs = vs;
    double *restrict g = (double *)x->pG + t * P, *restrict ip = (double *)x->pIP + t * P,
                     *restrict fu = (double *)x->pIF + t * P;
    for (size_t p = 0; p < P; p++) {
      g[p] += xo[p] * xs[p];
      ip[p] += xo[p];
      fu[p] += xs[p];
    }
  }
}

/* The nn narrow pairs (new slot s, old slots ol[], rows tl[]) of level L:
 * per ROI, per 4096-pixel block of s, every old frame's dot with it. */
static void accumulate16(beam_xmt_t *x, unsigned L, size_t s, const unsigned short *ol,
                         const unsigned short *tl, size_t nn) {
  size_t nb = x->conf.nb, R = x->R;
  const uint64_t *off = x->rois.off, *mx = x->lmax + (size_t)L * nb;
  const int16_t *xs = l16_at(x, L, s);
  const beam_i128 *ss = lsum_at(x, L, s);
  beam_i128 *part = x->scratch;
  int fits32[1024];
  for (size_t j = 0; j < nn; j++) /* |partial| <= CHUNK16 max|o| max|s| */
    fits32[j] = (uint64_t)mx[ol[j]] * mx[s] * CHUNK16 <= (uint64_t)INT32_MAX;
  for (size_t r = 0; r < R; r++) {
    for (size_t j = 0; j < nn; j++)
      part[j] = 0;
    for (size_t c = off[r]; c < off[r + 1]; c += CHUNK16) {
      size_t len = off[r + 1] - c < CHUNK16 ? off[r + 1] - c : CHUNK16;
      for (size_t j = 0; j < nn; j++) {
        const int16_t *xo = l16_at(x, L, ol[j]) + c;
        part[j] += fits32[j] ? dot16_32(xo, xs + c, len) : dot16_64(xo, xs + c, len);
      }
    }
    for (size_t j = 0; j < nn; j++) {
      size_t k = (size_t)tl[j] * R + r;
      ((beam_i128 *)x->G)[k] += part[j];
      ((beam_i128 *)x->IP)[k] += ((const beam_i128 *)lsum_at(x, L, ol[j]))[r];
      ((beam_i128 *)x->IF)[k] += ss[r];
    }
  }
}

/* Level L just received its frame number n = nlev[L] (1-based): pairs with
 * the frames i back, i from i_min (0 at level 0, nb/2 above) to
 * min(n, nb) - 1 (scikit-beam's _one_time_process). */
static int accumulate(beam_xmt_t *x, unsigned L) {
  size_t nb = x->conf.nb, n = x->nlev[L], s = (n - 1) % nb, R = x->R;
  size_t imin = L ? nb / 2 : 0, imax = (n < nb ? n : nb);
  const uint8_t *bad = x->bad + (size_t)L * nb;
  const uint64_t *off = x->rois.off;
  if (bad[s])
    return 0;
  unsigned short ol[1024], tl[1024]; /* narrow pairs, done blocked below */
  size_t nn = 0;
  int sw = is_wide(x, L, s);
  for (size_t i = imin; i < imax; i++) {
    size_t o = (n - 1 - i) % nb, t = beam_xmt_row(x, L, (unsigned)i);
    if (bad[o])
      continue;
    x->npairs[t]++;
    int ow = is_wide(x, L, o);
    if (x->exact && !x->conf.per_pixel && (!sw || !ow)) {
      if (!sw && !ow) {
        ol[nn] = (unsigned short)o, tl[nn] = (unsigned short)t, nn++;
        continue;
      }
      /* one narrow, one wide */
      const int16_t *xn = l16_at(x, L, sw ? o : s);
      const int64_t *xw = lvl_at(x, L, sw ? s : o);
      const beam_i128 *ss = lsum_at(x, L, s), *so = lsum_at(x, L, o);
      beam_i128 *G = (beam_i128 *)x->G + t * R, *IP = (beam_i128 *)x->IP + t * R,
                *IF = (beam_i128 *)x->IF + t * R;
      for (size_t r = 0; r < R; r++) {
        G[r] += dot_mixed(xn + off[r], xw + off[r], off[r + 1] - off[r]);
        IP[r] += so[r];
        IF[r] += ss[r];
      }
    } else if (x->conf.per_pixel) {
      const uint64_t *mx = x->lmax + (size_t)L * nb;
      /* check before adding: a wrapped int64 must never be published */
      if (x->exact && beam_xmt_bound(x, t, mx[o], mx[s]) < 0)
        return BEAM_ELIMIT;
      pair_pixels(x, t, lvl_at(x, L, o), lvl_at(x, L, s));
    } else if (x->exact) {
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
  if (nn)
    accumulate16(x, L, s, ol, tl, nn);
  return 0;
}

/* Narrow-mode combine of level-L slots a, b into level L+1 slot d: int16
 * when both halves are narrow and their sum provably fits, else int64
 * from whichever form each half has. */
static void combine16(beam_xmt_t *x, unsigned L, size_t a, size_t b, size_t d) {
  size_t nb = x->conf.nb, P = x->P, ka = (size_t)L * nb + a, kb = (size_t)L * nb + b,
         kd = (size_t)(L + 1) * nb + d;
  int aw = x->wide[ka], bw = x->wide[kb];
  if (!aw && !bw && x->lmax[ka] + x->lmax[kb] <= NARROW_MAX) {
    int16_t *o = l16_at(x, L + 1, d);
    x->wide[kd] = 0;
    x->lmax[kd] = add16(l16_at(x, L, a), l16_at(x, L, b), o, P);
    roi_sums16(x, o, lsum_at(x, L + 1, d));
    return;
  }
  int64_t *restrict o = lvl_at(x, L + 1, d);
  if (aw && bw) {
    const int64_t *pa = lvl_at(x, L, a), *pb = lvl_at(x, L, b);
    for (size_t p = 0; p < P; p++)
      o[p] = pa[p] + pb[p];
  } else if (!aw && !bw) {
    const int16_t *pa = l16_at(x, L, a), *pb = l16_at(x, L, b);
    for (size_t p = 0; p < P; p++)
      o[p] = (int64_t)pa[p] + pb[p];
  } else {
    const int16_t *pn = l16_at(x, L, aw ? b : a);
    const int64_t *pw = lvl_at(x, L, aw ? a : b);
    for (size_t p = 0; p < P; p++)
      o[p] = pn[p] + pw[p];
  }
  x->wide[kd] = 1;
  x->lmax[kd] = 0; /* unused for wide slots */
  roi_sums(x, o, lsum_at(x, L + 1, d), NULL);
}

static uint64_t *lmax_at(const beam_xmt_t *x, unsigned L, size_t slot) {
  return x->lmax ? x->lmax + (size_t)L * x->conf.nb + slot : NULL;
}

int beam_xmt_push_cpu(beam_xmt_t *x, const void *frame, int bad) {
  size_t nb = x->conf.nb, P = x->P;
  size_t s = x->nlev[0] % nb;
  if (x->ovf_row >= 0)
    return BEAM_ELIMIT; /* the series' results are withdrawn */
  if (!bad && x->lv16) {
    int64_t m = gather16(x, frame, l16_at(x, 0, s));
    x->lmax[s] = (uint64_t)m;
    x->wide[s] = m > NARROW_MAX;
    if (x->wide[s]) {
      gather(x, frame, lvl_at(x, 0, s));
      roi_sums(x, lvl_at(x, 0, s), lsum_at(x, 0, s), NULL);
    } else {
      roi_sums16(x, l16_at(x, 0, s), lsum_at(x, 0, s));
    }
  } else if (!bad) {
    gather(x, frame, lvl_at(x, 0, s));
    bad = roi_sums(x, lvl_at(x, 0, s), lsum_at(x, 0, s), lmax_at(x, 0, s));
  }
  x->bad[s] = (uint8_t)bad;
  x->nframes++;
  x->nbad += bad != 0;
  x->nlev[0]++;
  if (accumulate(x, 0) < 0)
    return BEAM_ELIMIT;
  for (unsigned L = 0; L + 1 < x->conf.levels && x->nlev[L] % 2 == 0; L++) {
    size_t n = x->nlev[L], a = (n - 2) % nb, b = (n - 1) % nb, d = x->nlev[L + 1] % nb;
    const uint8_t *bl = x->bad + (size_t)L * nb;
    /* NaN propagates through scikit-beam's means: one bad half spoils it */
    int bd = bl[a] || bl[b];
    if (!bd && x->lv16) {
      combine16(x, L, a, b, d);
    } else if (!bd) {
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
      roi_sums(x, lvl_at(x, L + 1, d), lsum_at(x, L + 1, d), lmax_at(x, L + 1, d));
    }
    x->bad[(size_t)(L + 1) * nb + d] = (uint8_t)bd;
    x->nlev[L + 1]++;
    if (accumulate(x, L + 1) < 0)
      return BEAM_ELIMIT;
  }
  return 0;
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
  x->cpu_narrow = 1; /* after init, which clears x */
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
  if (beam_xmt_push_cpu(x, bad ? NULL : in->data, bad) < 0)
    return beam_xmt_check(x, &self->diag);
  if (x->conf.publish_every && x->nframes % x->conf.publish_every == 0)
    return beam_xmt_publish(x, emit, BEAM_FLAG_PARTIAL);
  return 0;
}

static int cpu_end(beam_stage_t *self, beam_emit_t *emit) {
  int rc = beam_xmt_check(self->priv, &self->diag);
  if (rc < 0)
    return rc;
  return beam_xmt_publish(self->priv, emit, BEAM_FLAG_FINAL);
}

const beam_stage_ops_t beam_xpcs_multitau_cpu_ops = {
    "xpcs_multitau", "cpu", cpu_init, cpu_start, cpu_process, cpu_end, cpu_destroy};
