/* Stage kind `xpcs_multitau`, CPU backend: per frame, gather the ROI
 * pixels once into a compact array (sorted by ROI, from the index list
 * built at start), push it through the level rings (level L+1 frame = sum
 * of the two latest level-L frames, as scikit-beam's binomial tree but
 * with sums instead of means), and for each new level frame add its pairs
 * with the buffered frames of lag channels i_min..min(n, nb)-1 to the
 * per-row, per-ROI accumulators.
 *
 * Tiles and threads. The compact pixels are cut into blocks of at most
 * BLK pixels that never straddle an ROI, and the blocks into
 * TILES_PER_THREAD x `threads` contiguous tiles of about equal pixel
 * counts (one tile for threads 1). Every per-pixel step of a frame
 * (gather, level sums, the dots of each pair) touches only the pixels of
 * one tile, so whichever thread claims a tile runs the whole level/pair
 * recurrence of the frame on it, in one fork-join phase per frame
 * (fjpool.h: no thread creation, no allocation, one handoff). A tile
 * writes one partial sum per block: the ROI sums of each new level frame
 * and the dot of each pair. The calling thread then folds the partials
 * into the ROI accumulators in block order. Blocks do not depend on the
 * thread count, so the sums are the same numbers in the same order for
 * any `threads`: integer results are exact (and equal to the CUDA
 * backend's), float results bit-identical between thread counts. What a
 * tile cannot know before the phase is decided after it: a NaN pixel
 * (float input) makes the frame bad when folding, and the pairs already
 * computed with it are dropped then.
 *
 * Integer input: int64 level sums; products summed in int64 over chunks
 * short enough that no partial sum can overflow (x->chunk[L], from the
 * dtype's range), then into 128-bit accumulators: exact, and the chunked
 * inner loop vectorises. Float input: double throughout (the CUDA backend
 * sums in another order, so float results agree with it to round-off).
 * Narrow tiles (roi mode, integer input): a tile of a level frame whose
 * values all fit |v| <= 32767, which is every level frame of
 * photon-counting data up to high levels, is stored as int16 (c->lv16)
 * instead of int64; the form is chosen per (tile, slot) from the tile's
 * own maxima, so no thread waits for another to choose it. The dots of
 * two narrow tiles run per block (a block of the new frame stays in L1
 * while every lag's old frame streams past it) with 16-bit multiply-adds
 * into int32 sums short enough not to overflow, compiled for AVX2 (and
 * baseline) by function multiversioning. Same exact integers, a quarter of
 * the memory traffic; wide tiles take the int64 path above.
 * normalization per_pixel: the same rings, but each pair adds into
 * per-pixel accumulators [row][pixel]. Its int64 overflow bound
 * (xpcs_multitau.h) needs the maxima of a level frame before its pairs,
 * so a per_pixel frame runs one phase per level it touches. */
#include <math.h>
#include "proto/clones.h"
#include <string.h>

#include "pipeline/kern/kern_int.h"
#include "pipeline/kern/kinds.h"
#include "pipeline/kern/xpcs_multitau.h"
#include "pipeline/fjpool.h"

#define NARROW_MAX 32767
#define BLK 4096 /* pixels per block: 8 KiB of an int16 frame stays in L1 */
#define WHO "xpcs_multitau"
#define TILES_PER_THREAD 4
#define MAX_TILES (TILES_PER_THREAD * BEAM_FJPOOL_MAX)

/* A block partial: int128 (integer input) or double. */
typedef union acc_u {
  beam_i128 i;
  double f;
} acc_t;

typedef struct tile_s {
  size_t b0, b1; /* blocks */
  size_t p0, p1; /* compact pixels */
  size_t j0, j1; /* pixel runs overlapping [p0, p1) (run_src) */
} tile_t;

enum { OP_GATHER, OP_COMBINE, OP_PAIRS };

/* One step of a frame, run by every tile in order. */
typedef struct op_s {
  int kind;
  unsigned L;   /* level of the frame made (GATHER 0, COMBINE) or paired */
  size_t s;     /* its slot */
  size_t a, b;  /* COMBINE: the level L-1 halves */
  size_t j0, nj; /* PAIRS: pairs j0..j0+nj-1 of po/pt */
} op_t;

#define MAX_OPS (2 * BEAM_XMT_MAX_LEVELS + 1)

typedef struct cpu_s {
  beam_xmt_t x; /* first: self->priv is also the beam_xmt_t */
  beam_fjpool_t *pool;
  /* Per series. */
  size_t nblk, ntiles, LN; /* LN = levels * nb slots */
  uint64_t *boff;          /* [nblk + 1] block b = compact pixels boff[b]..boff[b+1] */
  uint64_t *rblk;          /* [R + 1] ROI r = blocks rblk[r]..rblk[r+1] */
  uint64_t *rpos;          /* [nruns] compact position of run j */
  tile_t tile[MAX_TILES];
  uint8_t *tw;             /* [ntiles][LN] narrow: 1 = the tile of the slot is int64 */
  uint64_t *tmax;          /* [ntiles][LN] narrow: max |v| of the tile of the slot */
  uint64_t *nmax;          /* [ntiles][levels] per_pixel: max |v| of the tile of
                            * the level-L frame made in this phase */
  acc_t *bsum;             /* [levels][nblk] block sums of the level-L frame made */
  acc_t *part;             /* [nlags][nblk] block dots of pair j */
  uint16_t *po, *pt;       /* [nlags] pair j: old slot, row */
  op_t ops[MAX_OPS];
  size_t nops, npair;
  const void *frame;       /* during a phase */
  /* Integer input, roi mode: where a slot's values all fit |v| <= 32767
   * they are kept as int16 in lv16 instead of int64 in x.lvl, so the dots
   * stream a quarter of the bytes and use 16-bit multiply-adds; still
   * exact. Which form each pixel tile of a slot has: tw. NULL otherwise. */
  int16_t *lv16;           /* [levels][nb][P] */
  uint32_t *run_src, *run_len; /* x.rois.idx as runs of consecutive raster
                                * indices (narrow mode, when they are long
                                * enough to pay: nruns <= P/4), else NULL */
  size_t nruns;
} cpu_t;

/* ---- per-tile kernels ----------------------------------------------------- */

static inline void *lvl_at(const beam_xmt_t *x, unsigned L, size_t slot) {
  return (char *)x->lvl + ((size_t)L * x->conf.nb + slot) * x->P * beam_xmt_lvl_size(x);
}

static inline void *lsum_at(const beam_xmt_t *x, unsigned L, size_t slot) {
  return (char *)x->lsum + ((size_t)L * x->conf.nb + slot) * x->R * beam_xmt_acc_size(x);
}

static inline int16_t *l16_at(const cpu_t *c, unsigned L, size_t slot) {
  return c->lv16 + ((size_t)L * c->x.conf.nb + slot) * c->x.P;
}

#define GATHER_CASE(T, DT)                                                     \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    if (x->exact) {                                                            \
      int64_t *restrict o = dst;                                               \
      for (size_t p = p0; p < p1; p++)                                         \
        o[p] = (int64_t)px[idx[p]];                                            \
    } else {                                                                   \
      double *restrict o = dst;                                                \
      for (size_t p = p0; p < p1; p++)                                         \
        o[p] = (double)px[idx[p]];                                             \
    }                                                                          \
    break;                                                                     \
  }

/* Compact pixels p0..p1 of a frame into dst (int64 or double). */
static void gather(const beam_xmt_t *x, const void *frame, void *dst, size_t p0, size_t p1) {
  const uint32_t *restrict idx = x->rois.idx;
  switch (x->in.dtype) {
    BEAM__REAL_DTYPES(GATHER_CASE)
  default: BEAM_ASSERT(!"xpcs_multitau: dtype not accepted at start");
  }
}

/* Tile t of a level-0 slot as int16, returning max |pixel| (the copy is
 * valid when that is <= NARROW_MAX); exact dtypes only. By runs of
 * consecutive pixels, clipped to the tile, when c->run_src exists (a
 * vectorisable copy per run), else one index per pixel. */
#define GATHER16_CASE(T, DT)                                                   \
  case DT: {                                                                   \
    const T *restrict px = frame;                                              \
    T lo = 0, hi = 0;                                                          \
    if (c->run_src) {                                                          \
      for (size_t j = t->j0; j < t->j1; j++) {                                 \
        size_t a = rpos[j] > t->p0 ? rpos[j] : t->p0;                          \
        size_t e = rpos[j] + c->run_len[j] < t->p1 ? rpos[j] + c->run_len[j]   \
                                                   : t->p1;                    \
        const T *restrict src = px + c->run_src[j] + (a - rpos[j]);            \
        int16_t *restrict q = o + a;                                           \
        for (size_t k = 0; k < e - a; k++) {                                   \
          T v = src[k];                                                        \
          q[k] = (int16_t)v; /* kept only when every value fits */             \
          lo = v < lo ? v : lo;                                                \
          hi = v > hi ? v : hi;                                                \
        }                                                                      \
      }                                                                        \
    } else {                                                                   \
      for (size_t p = t->p0; p < t->p1; p++) {                                 \
        T v = px[idx[p]];                                                      \
        o[p] = (int16_t)v;                                                     \
        lo = v < lo ? v : lo;                                                  \
        hi = v > hi ? v : hi;                                                  \
      }                                                                        \
    }                                                                          \
    m = (int64_t)hi > -(int64_t)lo ? (int64_t)hi : -(int64_t)lo;               \
    break;                                                                     \
  }

/* (Clones as for the dots below: the per-frame streams are the rest of
 * the time.) */
BEAM_TARGET_CLONES("avx2", "default") static int64_t
gather16(const cpu_t *c, const tile_t *t, const void *frame, int16_t *restrict o) {
  const beam_xmt_t *x = &c->x;
  const uint64_t *rpos = c->rpos;
  const uint32_t *restrict idx = x->rois.idx;
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

/* Block sums of a tile. int16: one block's sum fits int32 (BLK * 32767). */
BEAM_TARGET_CLONES("avx2", "default") static void sums16(const cpu_t *c, const tile_t *t,
                                                                     const int16_t *v, acc_t *bs) {
  for (size_t b = t->b0; b < t->b1; b++) {
    int32_t u = 0;
    for (size_t k = c->boff[b]; k < c->boff[b + 1]; k++)
      u += v[k];
    bs[b].i = u;
  }
}

/* int64 block sums (128 bits per term: once per level frame, the dots
 * cost nb times more); *vmax (may be NULL) = the tile's max |v|. */
static void sums64(const cpu_t *c, const tile_t *t, const int64_t *v, acc_t *bs, uint64_t *vmax) {
  for (size_t b = t->b0; b < t->b1; b++) {
    beam_i128 s = 0;
    for (size_t k = c->boff[b]; k < c->boff[b + 1]; k++)
      s += v[k];
    bs[b].i = s;
  }
  if (vmax) {
    uint64_t m = 0;
    for (size_t k = t->p0; k < t->p1; k++) {
      uint64_t a = v[k] < 0 ? -(uint64_t)v[k] : (uint64_t)v[k];
      m = a > m ? a : m;
    }
    *vmax = m;
  }
}

static void sumsd(const cpu_t *c, const tile_t *t, const double *v, acc_t *bs) {
  for (size_t b = t->b0; b < t->b1; b++) {
    double s = 0;
    for (size_t k = c->boff[b]; k < c->boff[b + 1]; k++)
      s += v[k];
    bs[b].f = s;
  }
}

/* o = a + b over n narrow pixels; returns max |o|. */
BEAM_TARGET_CLONES("avx2", "default") static uint64_t add16(const int16_t *restrict a,
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
BEAM_TARGET_CLONES("avx2", "default") static int32_t
dot16_32(const int16_t *restrict a, const int16_t *restrict b, size_t n) {
  int32_t t = 0;
  for (size_t k = 0; k < n; k++)
    t += a[k] * b[k];
  return t;
}

BEAM_TARGET_CLONES("avx2", "default") static int64_t
dot16_64(const int16_t *restrict a, const int16_t *restrict b, size_t n) {
  int64_t t = 0;
  for (size_t k = 0; k < n; k++)
    t += a[k] * b[k]; /* each product <= 2^30 fits int */
  return t;
}

/* A narrow and a wide tile (slots straddling the 16-bit limit: rare). */
static beam_i128 dot_mixed(const int16_t *a, const int64_t *b, size_t n) {
  beam_i128 s = 0;
  for (size_t k = 0; k < n; k++)
    s += (beam_i128)a[k] * b[k];
  return s;
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
static void pair_pixels(beam_xmt_t *x, size_t t, const void *vo, const void *vs, size_t p0, size_t p1) {
  size_t P = x->P;
  if (x->exact) {
    const int64_t *restrict xo = vo, *restrict xs = vs;
    int64_t *restrict g = (int64_t *)x->pG + t * P, *restrict ip = (int64_t *)x->pIP + t * P,
                      *restrict fu = (int64_t *)x->pIF + t * P;
    for (size_t p = p0; p < p1; p++) {
      g[p] += xo[p] * xs[p];
      ip[p] += xo[p];
      fu[p] += xs[p];
    }
  } else {
    const double *restrict xo = vo, *restrict xs = vs;
    double *restrict g = (double *)x->pG + t * P, *restrict ip = (double *)x->pIP + t * P,
                     *restrict fu = (double *)x->pIF + t * P;
    for (size_t p = p0; p < p1; p++) {
      g[p] += xo[p] * xs[p];
      ip[p] += xo[p];
      fu[p] += xs[p];
    }
  }
}

/* The frame's level-0 slot, tile k. */
static void tile_gather(cpu_t *c, unsigned k, const op_t *op) {
  beam_xmt_t *x = &c->x;
  const tile_t *t = &c->tile[k];
  acc_t *bs = c->bsum; /* level 0 */
  if (c->lv16) {
    int16_t *o = l16_at(c, 0, op->s);
    int64_t m = gather16(c, t, c->frame, o);
    size_t ks = k * c->LN + op->s;
    c->tmax[ks] = (uint64_t)m;
    c->tw[ks] = m > NARROW_MAX;
    if (c->tw[ks]) {
      gather(x, c->frame, lvl_at(x, 0, op->s), t->p0, t->p1);
      sums64(c, t, lvl_at(x, 0, op->s), bs, NULL);
    } else {
      sums16(c, t, o, bs);
    }
  } else {
    gather(x, c->frame, lvl_at(x, 0, op->s), t->p0, t->p1);
    if (x->exact)
      sums64(c, t, lvl_at(x, 0, op->s), bs, x->conf.per_pixel ? &c->nmax[k * x->conf.levels] : NULL);
    else
      sumsd(c, t, lvl_at(x, 0, op->s), bs);
  }
}

/* Level L slot s = level L-1 slots a + b, tile k. Narrow: int16 when both
 * halves' tiles are narrow and their sum provably fits, else int64 from
 * whichever form each half has. */
static void tile_combine(cpu_t *c, unsigned k, const op_t *op) {
  beam_xmt_t *x = &c->x;
  const tile_t *t = &c->tile[k];
  size_t nb = x->conf.nb, p0 = t->p0, n = t->p1 - t->p0;
  unsigned L = op->L, H = L - 1;
  acc_t *bs = c->bsum + (size_t)L * c->nblk;
  if (c->lv16) {
    size_t ka = k * c->LN + H * nb + op->a, kb = k * c->LN + H * nb + op->b, kd = k * c->LN + L * nb + op->s;
    int aw = c->tw[ka], bw = c->tw[kb];
    if (!aw && !bw && c->tmax[ka] + c->tmax[kb] <= NARROW_MAX) {
      int16_t *o = l16_at(c, L, op->s);
      c->tw[kd] = 0;
      c->tmax[kd] = add16(l16_at(c, H, op->a) + p0, l16_at(c, H, op->b) + p0, o + p0, n);
      sums16(c, t, o, bs);
      return;
    }
    int64_t *restrict o = (int64_t *)lvl_at(x, L, op->s) + p0;
    if (aw && bw) {
      const int64_t *pa = (const int64_t *)lvl_at(x, H, op->a) + p0, *pb = (const int64_t *)lvl_at(x, H, op->b) + p0;
      for (size_t p = 0; p < n; p++)
        o[p] = pa[p] + pb[p];
    } else if (!aw && !bw) {
      const int16_t *pa = l16_at(c, H, op->a) + p0, *pb = l16_at(c, H, op->b) + p0;
      for (size_t p = 0; p < n; p++)
        o[p] = (int64_t)pa[p] + pb[p];
    } else {
      const int16_t *pn = l16_at(c, H, aw ? op->b : op->a) + p0;
      const int64_t *pw = (const int64_t *)lvl_at(x, H, aw ? op->a : op->b) + p0;
      for (size_t p = 0; p < n; p++)
        o[p] = pn[p] + pw[p];
    }
    c->tw[kd] = 1;
    c->tmax[kd] = 0; /* unused for wide tiles */
    sums64(c, t, lvl_at(x, L, op->s), bs, NULL);
  } else if (x->exact) {
    const int64_t *pa = (const int64_t *)lvl_at(x, H, op->a) + p0, *pb = (const int64_t *)lvl_at(x, H, op->b) + p0;
    int64_t *restrict o = (int64_t *)lvl_at(x, L, op->s) + p0;
    for (size_t p = 0; p < n; p++)
      o[p] = pa[p] + pb[p];
    sums64(c, t, lvl_at(x, L, op->s), bs, x->conf.per_pixel ? &c->nmax[k * x->conf.levels + L] : NULL);
  } else {
    const double *pa = (const double *)lvl_at(x, H, op->a) + p0, *pb = (const double *)lvl_at(x, H, op->b) + p0;
    double *restrict o = (double *)lvl_at(x, L, op->s) + p0;
    for (size_t p = 0; p < n; p++)
      o[p] = pa[p] + pb[p];
    sumsd(c, t, lvl_at(x, L, op->s), bs);
  }
}

/* The pairs of level L's new slot s with the old slots po[j], tile k:
 * per block of s, every old frame's dot with it, into part[j][block]. */
static void tile_pairs(cpu_t *c, unsigned k, const op_t *op) {
  beam_xmt_t *x = &c->x;
  const tile_t *t = &c->tile[k];
  size_t nb = x->conf.nb, nblk = c->nblk, s = op->s;
  unsigned L = op->L;
  if (x->conf.per_pixel) {
    for (size_t j = op->j0; j < op->j0 + op->nj; j++)
      pair_pixels(x, c->pt[j], lvl_at(x, L, c->po[j]), lvl_at(x, L, s), t->p0, t->p1);
    return;
  }
  if (!x->exact) {
    const double *xs = lvl_at(x, L, s);
    for (size_t b = t->b0; b < t->b1; b++) {
      size_t a = c->boff[b], n = c->boff[b + 1] - a;
      for (size_t j = op->j0; j < op->j0 + op->nj; j++)
        c->part[j * nblk + b].f = dot_dbl((const double *)lvl_at(x, L, c->po[j]) + a, xs + a, n);
    }
    return;
  }
  BEAM_ASSERT(c->lv16); /* exact roi mode on the CPU is always narrow-capable */
  const uint8_t *tw = c->tw + k * c->LN + (size_t)L * nb;
  const uint64_t *mx = c->tmax + k * c->LN + (size_t)L * nb;
  int sw = tw[s];
  unsigned char fits32[1024]; /* |block partial| <= BLK max|o| max|s| */
  for (size_t j = op->j0; j < op->j0 + op->nj; j++)
    fits32[j - op->j0] = !sw && !tw[c->po[j]] && mx[c->po[j]] * mx[s] * BLK <= (uint64_t)INT32_MAX;
  const int16_t *ns = l16_at(c, L, s);
  const int64_t *ws = lvl_at(x, L, s);
  for (size_t b = t->b0; b < t->b1; b++) {
    size_t a = c->boff[b], n = c->boff[b + 1] - a;
    for (size_t j = op->j0; j < op->j0 + op->nj; j++) {
      size_t o = c->po[j];
      beam_i128 v;
      if (!sw && !tw[o])
        v = fits32[j - op->j0] ? dot16_32(l16_at(c, L, o) + a, ns + a, n) : dot16_64(l16_at(c, L, o) + a, ns + a, n);
      else if (sw && tw[o])
        v = dot_exact((const int64_t *)lvl_at(x, L, o) + a, ws + a, n, x->chunk[L]);
      else if (sw)
        v = dot_mixed(l16_at(c, L, o) + a, ws + a, n);
      else
        v = dot_mixed(ns + a, (const int64_t *)lvl_at(x, L, o) + a, n);
      c->part[j * nblk + b].i = v;
    }
  }
}

static void run_tile(void *ctx, unsigned k) {
  cpu_t *c = ctx;
  for (size_t i = 0; i < c->nops; i++) {
    const op_t *op = &c->ops[i];
    if (op->kind == OP_GATHER)
      tile_gather(c, k, op);
    else if (op->kind == OP_COMBINE)
      tile_combine(c, k, op);
    else
      tile_pairs(c, k, op);
  }
}

/* ---- the calling thread: plan, phase, fold --------------------------------- */

/* ROI sums of the level-L frame in slot s from its block sums; returns 1
 * when one is NaN (a NaN pixel makes the frame bad, as np.isnan(img).any()
 * does in scikit-beam). */
static int fold_sums(cpu_t *c, unsigned L, size_t s) {
  beam_xmt_t *x = &c->x;
  const acc_t *bs = c->bsum + (size_t)L * c->nblk;
  int nan = 0;
  for (size_t r = 0; r < x->R; r++) {
    if (x->exact) {
      beam_i128 v = 0;
      for (size_t b = c->rblk[r]; b < c->rblk[r + 1]; b++)
        v += bs[b].i;
      ((beam_i128 *)lsum_at(x, L, s))[r] = v;
    } else {
      double v = 0;
      for (size_t b = c->rblk[r]; b < c->rblk[r + 1]; b++)
        v += bs[b].f;
      ((double *)lsum_at(x, L, s))[r] = v;
      nan |= isnan(v);
    }
  }
  if (x->conf.per_pixel && x->exact) {
    uint64_t m = 0;
    for (size_t k = 0; k < c->ntiles; k++)
      m = c->nmax[k * x->conf.levels + L] > m ? c->nmax[k * x->conf.levels + L] : m;
    x->lmax[(size_t)L * x->conf.nb + s] = m;
  }
  return nan;
}

static void fold_pairs(cpu_t *c, const op_t *op) {
  beam_xmt_t *x = &c->x;
  size_t nb = x->conf.nb, R = x->R;
  const uint8_t *bad = x->bad + (size_t)op->L * nb;
  if (bad[op->s])
    return; /* made bad by a NaN found in this phase: its pairs are void */
  for (size_t j = op->j0; j < op->j0 + op->nj; j++) {
    size_t o = c->po[j], t = c->pt[j];
    x->npairs[t]++;
    if (x->conf.per_pixel)
      continue; /* the pixel sums are the result; ROI sums at publish */
    const acc_t *pj = c->part + j * c->nblk;
    if (x->exact) {
      const beam_i128 *ss = lsum_at(x, op->L, op->s), *so = lsum_at(x, op->L, o);
      beam_i128 *G = (beam_i128 *)x->G + t * R, *IP = (beam_i128 *)x->IP + t * R, *IF = (beam_i128 *)x->IF + t * R;
      for (size_t r = 0; r < R; r++) {
        beam_i128 g = 0;
        for (size_t b = c->rblk[r]; b < c->rblk[r + 1]; b++)
          g += pj[b].i;
        G[r] += g;
        IP[r] += so[r];
        IF[r] += ss[r];
      }
    } else {
      const double *ss = lsum_at(x, op->L, op->s), *so = lsum_at(x, op->L, o);
      double *G = (double *)x->G + t * R, *IP = (double *)x->IP + t * R, *IF = (double *)x->IF + t * R;
      for (size_t r = 0; r < R; r++) {
        double g = 0;
        for (size_t b = c->rblk[r]; b < c->rblk[r + 1]; b++)
          g += pj[b].f;
        G[r] += g;
        IP[r] += so[r];
        IF[r] += ss[r];
      }
    }
  }
}

/* Runs the planned ops on every tile, then folds them in order. */
static void flush(cpu_t *c) {
  beam_xmt_t *x = &c->x;
  size_t nb = x->conf.nb;
  if (c->nops == 0)
    return;
  beam_fjpool_run(c->pool, (unsigned)c->ntiles, run_tile, c);
  for (size_t i = 0; i < c->nops; i++) {
    const op_t *op = &c->ops[i];
    if (op->kind == OP_GATHER) {
      if (fold_sums(c, 0, op->s)) {
        x->bad[op->s] = 1;
        x->nbad++;
      }
    } else if (op->kind == OP_COMBINE) {
      const uint8_t *bl = x->bad + (size_t)(op->L - 1) * nb;
      /* a half made bad by a NaN in this phase spoils this frame too */
      x->bad[(size_t)op->L * nb + op->s] = bl[op->a] || bl[op->b];
      fold_sums(c, op->L, op->s);
    } else {
      fold_pairs(c, op);
    }
  }
  c->nops = 0;
  c->npair = 0;
}

static void add_op(cpu_t *c, int kind, unsigned L, size_t s, size_t a, size_t b) {
  BEAM_ASSERT(c->nops < MAX_OPS);
  op_t *op = &c->ops[c->nops++];
  op->kind = kind, op->L = L, op->s = s, op->a = a, op->b = b, op->j0 = c->npair, op->nj = 0;
}

/* Level L just received its frame number n = nlev[L] (1-based): its pairs
 * with the frames i back, i from i_min (0 at level 0, nb/2 above) to
 * min(n, nb) - 1 (scikit-beam's _one_time_process). */
static int plan_pairs(cpu_t *c, unsigned L) {
  beam_xmt_t *x = &c->x;
  size_t nb = x->conf.nb, n = x->nlev[L], s = (n - 1) % nb;
  size_t imin = L ? nb / 2 : 0, imax = n < nb ? n : nb;
  const uint8_t *bad = x->bad + (size_t)L * nb;
  if (bad[s])
    return 0;
  add_op(c, OP_PAIRS, L, s, 0, 0);
  op_t *op = &c->ops[c->nops - 1];
  for (size_t i = imin; i < imax; i++) {
    size_t o = (n - 1 - i) % nb, t = beam_xmt_row(x, L, (unsigned)i);
    if (bad[o])
      continue;
    /* per_pixel: checked before adding, a wrapped int64 must never be
     * published (the maxima are final: this level's frame was folded) */
    if (x->conf.per_pixel && x->exact &&
        beam_xmt_bound(x, t, x->lmax[(size_t)L * nb + o], x->lmax[(size_t)L * nb + s]) < 0)
      return BEAM_ELIMIT;
    c->po[c->npair] = (uint16_t)o;
    c->pt[c->npair] = (uint16_t)t;
    c->npair++, op->nj++;
  }
  if (op->nj == 0)
    c->nops--;
  return 0;
}

int beam_xmt_push_cpu(beam_xmt_t *x, const void *frame, int bad) {
  cpu_t *c = (cpu_t *)x;
  size_t nb = x->conf.nb;
  int pp = x->conf.per_pixel;
  if (x->ovf_row >= 0)
    return BEAM_ELIMIT; /* the series' results are withdrawn */
  size_t s = x->nlev[0] % nb;
  c->frame = frame;
  c->nops = c->npair = 0;
  x->bad[s] = (uint8_t)(bad != 0);
  x->nframes++;
  x->nbad += bad != 0;
  x->nlev[0]++;
  if (!bad)
    add_op(c, OP_GATHER, 0, s, 0, 0);
  /* roi mode: the whole frame is one phase, planned as if no NaN turns
   * up (the fold corrects). per_pixel: its pairs need the bad flag and
   * maxima of their frames first. */
  if (pp)
    flush(c);
  if (plan_pairs(c, 0) < 0)
    return BEAM_ELIMIT;
  for (unsigned L = 0; L + 1 < x->conf.levels && x->nlev[L] % 2 == 0; L++) {
    size_t n = x->nlev[L], a = (n - 2) % nb, b = (n - 1) % nb, d = x->nlev[L + 1] % nb;
    const uint8_t *bl = x->bad + (size_t)L * nb;
    /* NaN propagates through scikit-beam's means: one bad half spoils it */
    int bd = bl[a] || bl[b];
    x->bad[(size_t)(L + 1) * nb + d] = (uint8_t)bd;
    x->nlev[L + 1]++;
    if (!bd)
      add_op(c, OP_COMBINE, L + 1, d, a, b);
    if (pp)
      flush(c);
    if (plan_pairs(c, L + 1) < 0)
      return BEAM_ELIMIT;
  }
  flush(c);
  return 0;
}

/* ---- per series: blocks and tiles ------------------------------------------ */

static void tiles_free(cpu_t *c) {
  free(c->boff), free(c->rblk), free(c->rpos), free(c->tw), free(c->tmax), free(c->nmax);
  free(c->bsum), free(c->part), free(c->po), free(c->pt);
  c->boff = c->rblk = c->rpos = c->tmax = c->nmax = NULL;
  c->tw = NULL, c->bsum = c->part = NULL, c->po = c->pt = NULL;
  c->nblk = c->ntiles = 0;
}

/* Blocks of at most BLK pixels inside each ROI; tiles of whole blocks,
 * split where the running pixel count passes k P / threads. */
static int tiles_start(cpu_t *c, beam_diag_t *d) {
  beam_xmt_t *x = &c->x;
  const uint64_t *off = x->rois.off;
  size_t R = x->R, P = x->P, nb = x->conf.nb, L = x->conf.levels, nblk = 0;
  tiles_free(c);
  for (size_t r = 0; r < R; r++)
    nblk += (off[r + 1] - off[r] + BLK - 1) / BLK;
  c->nblk = nblk;
  c->LN = L * nb;
  /* More tiles than threads: a thread preempted inside a tile holds the
   * phase up for one tile, not for 1/threads of the frame. */
  size_t th = beam_fjpool_size(c->pool), want = th > 1 ? TILES_PER_THREAD * th : 1;
  c->ntiles = want < nblk ? want : nblk;
  c->boff = malloc((nblk + 1) * sizeof *c->boff);
  c->rblk = malloc((R + 1) * sizeof *c->rblk);
  c->rpos = malloc((c->nruns + 1) * sizeof *c->rpos);
  c->bsum = calloc(L * nblk, sizeof *c->bsum);
  c->part = calloc(x->nlags * nblk, sizeof *c->part);
  c->po = calloc(x->nlags, sizeof *c->po);
  c->pt = calloc(x->nlags, sizeof *c->pt);
  c->nmax = calloc(c->ntiles * L, sizeof *c->nmax);
  if (c->lv16) {
    c->tw = calloc(c->ntiles * c->LN, 1);
    c->tmax = calloc(c->ntiles * c->LN, sizeof *c->tmax);
  }
  if (!c->boff || !c->rblk || !c->rpos || !c->bsum || !c->part || !c->po || !c->pt || !c->nmax ||
      (c->lv16 && (!c->tw || !c->tmax)))
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %zu pixel blocks x %zu lags", nblk, x->nlags);
  size_t b = 0;
  for (size_t r = 0; r < R; r++) {
    c->rblk[r] = b;
    for (uint64_t p = off[r]; p < off[r + 1]; p += BLK)
      c->boff[b++] = p;
  }
  c->rblk[R] = b;
  c->boff[nblk] = P;
  for (size_t j = 0, p = 0; j < c->nruns; p += c->run_len[j++])
    c->rpos[j] = p;
  size_t b0 = 0, j0 = 0;
  for (size_t k = 0; k < c->ntiles; k++) {
    tile_t *t = &c->tile[k];
    size_t b1 = b0 + 1; /* at least one block each */
    if (k + 1 == c->ntiles)
      b1 = nblk;
    else
      while (b1 < nblk - (c->ntiles - k - 1) && c->boff[b1] * c->ntiles < (k + 1) * P)
        b1++;
    t->b0 = b0, t->b1 = b1, t->p0 = c->boff[b0], t->p1 = c->boff[b1];
    /* runs: first one ending after p0, up to the first starting at p1 */
    while (j0 < c->nruns && c->rpos[j0] + c->run_len[j0] <= t->p0)
      j0++;
    size_t j1 = j0;
    while (j1 < c->nruns && c->rpos[j1] < t->p1)
      j1++;
    t->j0 = j0, t->j1 = j1;
    b0 = b1;
  }
  return 0;
}

/* ---- stage ops ------------------------------------------------------------ */

size_t beam_xmt_cpu_gather_runs(const beam_stage_t *self) {
  const cpu_t *c = self->priv;
  return c->run_src ? c->nruns : 0;
}

static void narrow_free(cpu_t *c) {
  free(c->lv16), free(c->run_src), free(c->run_len);
  c->lv16 = NULL, c->run_src = c->run_len = NULL, c->nruns = 0;
}

static void cpu_destroy(beam_stage_t *self) {
  cpu_t *c = self->priv;
  if (!c)
    return;
  beam_fjpool_destroy(&c->pool);
  tiles_free(c);
  narrow_free(c);
  beam_xmt_free(&c->x);
  free(c);
  self->priv = NULL;
}

static int cpu_init(beam_stage_t *self, beam_diag_t *d) {
  cpu_t *c = calloc(1, sizeof *c);
  if (!c)
    return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": out of memory");
  self->priv = c;
  int rc = beam_xmt_init(&c->x, self->cfg, d);
  if (rc == 0) {
    unsigned th = c->x.conf.threads;
    if (th == 0) {
      th = beam_fjpool_cores();
      th = th > BEAM_XMT_AUTO_THREADS ? BEAM_XMT_AUTO_THREADS : th;
    }
    rc = beam_fjpool_new(&c->pool, th, WHO, d);
  }
  return rc;
}

/* The CPU backend's share of a series start: the rings touched now, their
 * first-touch page faults (hundreds of MB for a megapixel ROI set) would
 * otherwise land on the per-frame path (the CUDA backend keeps its rings
 * on the device), and the narrow form's state. */
static int narrow_start(cpu_t *c, beam_diag_t *d) {
  beam_xmt_t *x = &c->x;
  size_t L = x->conf.levels, nb = x->conf.nb;
  narrow_free(c);
  memset(x->lvl, 0, L * nb * x->P * beam_xmt_lvl_size(x));
  if (x->exact && !x->conf.per_pixel) {
    c->lv16 = calloc(L * nb * x->P, sizeof *c->lv16);
    if (!c->lv16)
      return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %zu levels x %zu buffers x %zu pixels (int16)", L,
                       nb, x->P);
    /* Rings and label images give long raster runs: the gather then
     * streams rows (vectorised) instead of reading one index per pixel. */
    size_t nr = x->P > 0;
    for (size_t p = 1; p < x->P; p++)
      nr += x->rois.idx[p] != x->rois.idx[p - 1] + 1;
    if (nr <= x->P / 4) {
      c->run_src = malloc(nr * sizeof *c->run_src);
      c->run_len = malloc(nr * sizeof *c->run_len);
      if (!c->run_src || !c->run_len)
        return BEAM_DIAG(d, BEAM_ENOMEM, WHO ": cannot allocate %zu pixel runs", nr);
      size_t j = 0;
      for (size_t p = 0; p < x->P; p++) {
        if (p == 0 || x->rois.idx[p] != x->rois.idx[p - 1] + 1) {
          c->run_src[j] = x->rois.idx[p];
          c->run_len[j++] = 0;
        }
        c->run_len[j - 1]++;
      }
      c->nruns = nr;
    }
  }
  return 0;
}

static int cpu_start(beam_stage_t *self, const beam_series_t *series, const beam_indesc_t *in,
                     beam_diag_t *d) {
  cpu_t *c = self->priv;
  int rc = beam_xmt_start(self, &c->x, series, in, d);
  if (rc == 0)
    rc = narrow_start(c, d);
  return rc < 0 ? rc : tiles_start(c, d);
}

static int cpu_process(beam_stage_t *self, const beam_frame_t *in, beam_emit_t *emit) {
  beam_xmt_t *x = self->priv;
  int bad = beam_xmt_flag_bad(in->flags);
  if (!(in->flags & BEAM_FLAG_CORRUPT)) {
    int rc = beam__frame_matches(self, in, x->in.dtype, x->in.ndim, x->in.shape);
    if (rc < 0)
      return rc;
  }
  /* Frames lost before this one are absent frames: bad, their pairs
   * skipped, exactly as the closed form with those frames removed. */
  for (uint32_t k = 0; k < in->missing_before; k++)
    if (beam_xmt_push_cpu(x, NULL, 1) < 0)
      return beam_xmt_check(x, &self->diag);
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
    .kind = "xpcs_multitau", .backend = "cpu",
    .init = cpu_init, .start = cpu_start, .process = cpu_process, .end = cpu_end, .destroy = cpu_destroy,
};
