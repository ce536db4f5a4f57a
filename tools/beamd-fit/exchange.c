/* beamd-fit transpose: frames (held by the rank that read them) to pixel
 * tiles (fitted by one rank each), one MPI_Alltoallv per round of `size`
 * tiles, so no rank ever holds more than one tile x all frames of float32
 * on the receiving side.
 *
 * Ranks own ascending frame ranges, so the blocks a rank receives, laid
 * out in source-rank order, are already [frame][pixel] for all frames of
 * its tile: the fit reads them frame-major (point stride = tile width)
 * without a second copy. */
#include "tools/beamd-fit/bfit.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

int bf_xchg_init(bf_xchg_t *x, const bf_input_t *in, uint64_t tile, const bf_mpi_t *m,
                 beam_diag_t *d) {
  memset(x, 0, sizeof *x);
  x->tile = tile;
  x->size = m->size;
  x->rank = m->rank;
  x->ntiles = (in->npix + tile - 1) / tile;
  x->rounds = (x->ntiles + (uint64_t)m->size - 1) / (uint64_t)m->size;
  /* MPI counts are int: the largest block is one tile x all frames. */
  if ((double)tile * (double)in->T > (double)INT_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "--tile %llu x %llu frames exceeds an MPI count; use a "
                     "smaller --tile", (unsigned long long)tile, (unsigned long long)in->T);
  x->frame0 = calloc((size_t)m->size + 1, sizeof *x->frame0);
  x->scount = calloc((size_t)m->size * 4, sizeof(int));
  uint64_t f1;
  for (int r = 0; r < m->size && x->frame0; r++)
    bf_input_range(in, r, m->size, &x->frame0[r], &f1);
  if (x->frame0)
    x->frame0[m->size] = in->T;
  uint64_t here = in->f1 - in->f0;
  x->send = malloc(((size_t)m->size * tile * here + 1) * sizeof(float));
  x->recv = malloc((tile * in->T + 1) * sizeof(float));
  if (!x->frame0 || !x->scount || !x->send || !x->recv)
    return BEAM_DIAG(d, BEAM_ENOMEM, "exchange buffers for tiles of %llu pixels",
                     (unsigned long long)tile);
  x->sdispl = x->scount + m->size;
  x->rcount = x->scount + 2 * m->size;
  x->rdispl = x->scount + 3 * m->size;
  return 0;
}

static void tile_span(const bf_xchg_t *x, const bf_input_t *in, uint64_t t, uint64_t *a,
                      uint64_t *b) {
  *a = t * x->tile < in->npix ? t * x->tile : in->npix;
  *b = *a + x->tile < in->npix ? *a + x->tile : in->npix;
}

/* n elements of the file's type to float32. */
static void to_f32(beam_dtype_t dt, const uint8_t *src, size_t n, float *dst) {
  switch (dt) {
#define CONV(T) { const T *s = (const T *)src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; break; }
  case BEAM_DT_U8: CONV(uint8_t)
  case BEAM_DT_I8: CONV(int8_t)
  case BEAM_DT_U16: CONV(uint16_t)
  case BEAM_DT_I16: CONV(int16_t)
  case BEAM_DT_U32: CONV(uint32_t)
  case BEAM_DT_I32: CONV(int32_t)
  case BEAM_DT_U64: CONV(uint64_t)
  case BEAM_DT_I64: CONV(int64_t)
  case BEAM_DT_F32: CONV(float)
  case BEAM_DT_F64: CONV(double)
#undef CONV
  default: for (size_t i = 0; i < n; i++) dst[i] = 0; break;
  }
}

int bf_xchg_round(bf_xchg_t *x, const bf_input_t *in, uint64_t r, MPI_Comm comm, uint64_t *a,
                  uint64_t *b, beam_diag_t *d) {
  uint64_t here = in->f1 - in->f0;
  size_t row = (size_t)in->npix * in->esize;
  size_t off = 0;
  for (int j = 0; j < x->size; j++) {
    uint64_t ja, jb;
    tile_span(x, in, r * (uint64_t)x->size + (uint64_t)j, &ja, &jb);
    uint64_t n = jb - ja;
    for (uint64_t t = 0; t < here; t++)
      to_f32(in->dtype, in->slab + t * row + ja * in->esize, n, x->send + off + t * n);
    x->scount[j] = (int)(n * here);
    x->sdispl[j] = (int)off;
    off += n * here;
  }
  tile_span(x, in, r * (uint64_t)x->size + (uint64_t)x->rank, a, b);
  uint64_t n = *b - *a;
  for (int s = 0; s < x->size; s++) {
    x->rcount[s] = (int)((x->frame0[s + 1] - x->frame0[s]) * n);
    x->rdispl[s] = (int)(x->frame0[s] * n);
  }
  if (off > (size_t)INT_MAX)
    return BEAM_DIAG(d, BEAM_ELIMIT, "a round's send buffer exceeds an MPI displacement; use a "
                     "smaller --tile");
  if (MPI_Alltoallv(x->send, x->scount, x->sdispl, MPI_FLOAT, x->recv, x->rcount, x->rdispl,
                    MPI_FLOAT, comm) != MPI_SUCCESS)
    return BEAM_DIAG(d, BEAM_EIO, "MPI_Alltoallv failed in round %llu", (unsigned long long)r);
  return 0;
}

void bf_xchg_free(bf_xchg_t *x) {
  free(x->frame0);
  free(x->scount);
  free(x->send);
  free(x->recv);
  memset(x, 0, sizeof *x);
}

double bf_mem_estimate(uint64_t npix, uint64_t T, uint64_t frames_here, size_t esize,
                       uint64_t tile, int size, int np, int threads, size_t ws) {
  double slab = (double)npix * (double)frames_here * (double)esize;
  double send = (double)size * (double)tile * (double)frames_here * 4;
  double recv = (double)tile * (double)T * 4;
  double res = (double)tile * (double)BF_STRIDE(np) * 8 * 2;   /* results + packed */
  double gather = (double)size * (double)tile * (double)BF_STRIDE(np) * 8; /* rank 0 */
  return slab + send + recv + res + gather + (double)threads * (double)ws;
}
