/* Stage kind `roi_sum`, CPU backend: hand-computed disk/annulus/rect sums;
 * the run and index-list sums against the plain reference loop on random
 * data of every dtype (overlapping and disjoint ROIs, rects at and past
 * the frame edge, empty rows, single-pixel runs, label images dense and
 * fragmented, weight stacks), exact integer sums where a 32-bit lane or a
 * double would overflow or round; the scan image, CORRUPT frames, and
 * every configuration or shape error. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pipeline/kern/kinds.h"
#include "pipeline/kern/roi_sum.h"
#include "tests/common/stage_harness.h"

static char *tmp_path(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 256, "%s/%s", bh_tmpdir(), name);
  return p;
}

static beam_cnode_t *roi(const char *name, const char *shape) {
  beam_cnode_t *m = bh_map();
  bh_set(m, "name", name);
  bh_set(m, "shape", shape);
  return m;
}

static bh_t *make(beam_cnode_t *cfg, int expect_rc, const char *expect_msg) {
  return bh_make(cfg, beam_roi_sum_params, &beam_roi_sum_cpu_ops, expect_rc, expect_msg);
}

/* bf, adf and r on a 5x5 frame whose pixel (x, y) holds x + 10 y.
 * Centre (2, 2). Disk r 1.5: d2 in {0, 1, 2}, the 3x3 block: 9 x 22 = 198.
 * Annulus [1.5, 2.5): d2 = 4 (4 pixels: 2, 20, 24, 42 = 88) and d2 = 5
 * (8 pixels: 1, 3, 41, 43, 10, 30, 14, 34 = 176): 264. Rect [0, 0, 2, 1]:
 * pixels (0, 0) and (1, 0): 1. */
static beam_cnode_t *three_rois(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m;
  m = roi("bf", "disk");
  bh_set(m, "radius", "1.5");
  bh_push(rois, m);
  m = roi("adf", "annulus");
  bh_set(m, "radii", "[1.5, 2.5]");
  bh_push(rois, m);
  m = roi("r", "rect");
  bh_set(m, "rect", "[0, 0, 2, 1]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  return cfg;
}

static void test_hand_computed(void **state) {
  bh_t *h = make(three_rois(), 0, NULL);
  uint32_t shp[2] = {5, 5};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 1);
  assert_string_equal(h->st.outs[0].name, "sums");
  assert_int_equal(h->st.outs[0].dtype, BEAM_DT_F64);
  assert_int_equal(h->st.outs[0].shape[0], 3);
  assert_string_equal(h->st.outs[0].axes[0], "roi");
  assert_string_equal(h->st.outs[0].labels_json, "[\"bf\",\"adf\",\"r\"]");
  beam_frame_t *in = bh_frame_new(BEAM_DT_U16, 2, shp, 0);
  for (int y = 0; y < 5; y++)
    for (int x = 0; x < 5; x++)
      ((uint16_t *)in->data)[y * 5 + x] = (uint16_t)(x + 10 * y);
  assert_int_equal(bh_process(h, in), 0);
  assert_int_equal(h->nres, 1);
  const double *s = h->res[0]->data;
  assert_true(s[0] == 198.0);
  assert_true(s[1] == 264.0);
  assert_true(s[2] == 1.0);
  bh_frame_free(in);
  bh_free(&h);
}

/* Independent membership for the random test (same formulas as the
 * documentation, written again here). */
static double indep_sum(const double *px, int H, int W, double cx, double cy, double rin, double rout) {
  double s = 0;
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) {
      double d2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
      if (d2 >= rin * rin && d2 < rout * rout)
        s += px[y * W + x];
    }
  return s;
}

static void run_random(beam_dtype_t dt) {
  enum { H = 67, W = 80 };
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m;
  m = roi("bf", "disk");
  bh_set(m, "radius", "9.3");
  bh_push(rois, m);
  m = roi("adf", "annulus");
  bh_set(m, "radii", "[12, 30.5]");
  bh_set(m, "center", "[41.25, 30.5]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {H, W};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, dt, 2, shp, &d), 0);
  beam_roi_host_t *host = h->st.priv;
  static double px[H * W];
  for (int fr = 0; fr < 4; fr++) {
    beam_frame_t *in = bh_frame_new(dt, 2, shp, (uint64_t)fr);
    bh_frame_fill(in, 77 + (uint64_t)fr, 60000);
    for (int i = 0; i < H * W; i++)
      px[i] = dt == BEAM_DT_U16 ? ((uint16_t *)in->data)[i] : ((float *)in->data)[i];
    assert_int_equal(bh_process(h, in), 0);
    const double *s = h->res[h->nres - 1]->data;
    double ref[2];
    beam_roi_sum_ref(&host->conf, dt, H, W, in->data, ref);
    double want[2] = {indep_sum(px, H, W, (W - 1) / 2.0, (H - 1) / 2.0, 0, 9.3),
                      indep_sum(px, H, W, 41.25, 30.5, 12, 30.5)};
    for (int r = 0; r < 2; r++) {
      double mag = indep_sum(px, H, W, 0, 0, 0, 1e9); /* >= sum |x| over the ROI */
      double tol = dt == BEAM_DT_U16 ? 0.0 : 1e-12 * mag;
      if (!(fabs(s[r] - ref[r]) <= tol) || !(fabs(s[r] - want[r]) <= tol))
        fail_msg("frame %d roi %d: fast %.17g ref %.17g independent %.17g", fr, r, s[r], ref[r], want[r]);
      assert_true(want[r] > 0);
    }
    bh_frame_free(in);
  }
  bh_free(&h);
}

static void test_random_u16(void **state) { run_random(BEAM_DT_U16); }
static void test_random_f32(void **state) { run_random(BEAM_DT_F32); }

/* ---- fast sums against the reference, every dtype ------------------------ */

static const beam_dtype_t all_dtypes[] = {BEAM_DT_U8,  BEAM_DT_U16, BEAM_DT_U32, BEAM_DT_U64,
                                          BEAM_DT_I8,  BEAM_DT_I16, BEAM_DT_I32, BEAM_DT_I64,
                                          BEAM_DT_F32, BEAM_DT_F64};
#define NDT (sizeof all_dtypes / sizeof all_dtypes[0])

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Random pixels over each integer type's whole range (64-bit ones within
 * +-2^40, so sums of a few thousand stay exact in double), signed ones
 * negative too; floats of either sign over 2^-10 .. 2^10 x 1000. */
static void fill_any(beam_frame_t *f, uint64_t seed) {
  size_t n = beam_frame_elems(f);
  for (size_t i = 0; i < n; i++) {
    uint64_t z = mix(&seed);
    double fv = ((double)(z >> 11) / 9007199254740992.0 - 0.3) * 1000.0 * ldexp(1.0, (int)(z % 21) - 10);
    switch (f->dtype) {
    case BEAM_DT_U8: ((uint8_t *)f->data)[i] = (uint8_t)z; break;
    case BEAM_DT_U16: ((uint16_t *)f->data)[i] = (uint16_t)z; break;
    case BEAM_DT_U32: ((uint32_t *)f->data)[i] = (uint32_t)z; break;
    case BEAM_DT_U64: ((uint64_t *)f->data)[i] = z >> 24; break;
    case BEAM_DT_I8: ((int8_t *)f->data)[i] = (int8_t)((int)(z % 256) - 128); break;
    case BEAM_DT_I16: ((int16_t *)f->data)[i] = (int16_t)((int)(z % 65536) - 32768); break;
    case BEAM_DT_I32: ((int32_t *)f->data)[i] = (int32_t)((int64_t)(z % 4294967296ull) - 2147483648ll); break;
    case BEAM_DT_I64: ((int64_t *)f->data)[i] = (int64_t)(z >> 23) - ((int64_t)1 << 40); break;
    case BEAM_DT_F32: ((float *)f->data)[i] = (float)fv; break;
    case BEAM_DT_F64: ((double *)f->data)[i] = fv; break;
    default: fail_msg("dtype %d", (int)f->dtype);
    }
  }
}

static double px_val(const beam_frame_t *f, size_t i) {
  switch (f->dtype) {
  case BEAM_DT_U8: return ((const uint8_t *)f->data)[i];
  case BEAM_DT_U16: return ((const uint16_t *)f->data)[i];
  case BEAM_DT_U32: return ((const uint32_t *)f->data)[i];
  case BEAM_DT_U64: return (double)((const uint64_t *)f->data)[i];
  case BEAM_DT_I8: return ((const int8_t *)f->data)[i];
  case BEAM_DT_I16: return ((const int16_t *)f->data)[i];
  case BEAM_DT_I32: return ((const int32_t *)f->data)[i];
  case BEAM_DT_I64: return (double)((const int64_t *)f->data)[i];
  case BEAM_DT_F32: return ((const float *)f->data)[i];
  case BEAM_DT_F64: return ((const double *)f->data)[i];
  default: fail_msg("dtype %d", (int)f->dtype); return 0;
  }
}

enum { LAYOUT_ANY, LAYOUT_RUNS, LAYOUT_LISTS };

/* The runs' documented shape: sorted by (start, roi), inside the frame,
 * never touching another run of the same ROI (it would have been merged),
 * and covering exactly the ROI's pixels. */
static void check_runs(const beam_roi_host_t *host, uint32_t hh, uint32_t ww) {
  const beam_roi_runs_t *rs = &host->runs;
  size_t nroi = host->conf.nroi;
  uint64_t *cover = calloc(nroi, sizeof *cover), *end = calloc(nroi, sizeof *end);
  for (size_t k = 0; k < rs->n; k++) {
    const beam_roi_run_t *u = &rs->run[k];
    assert_true(u->roi < nroi && u->len > 0);
    assert_true((uint64_t)u->start + u->len <= (uint64_t)hh * ww);
    if (k > 0) {
      const beam_roi_run_t *p = &rs->run[k - 1];
      assert_true(p->start < u->start || (p->start == u->start && p->roi < u->roi));
    }
    if (cover[u->roi])
      assert_true(u->start > end[u->roi]);
    end[u->roi] = (uint64_t)u->start + u->len;
    cover[u->roi] += u->len;
  }
  for (size_t r = 0; r < nroi; r++) {
    uint64_t want = 0;
    for (uint32_t y = 0; y < hh; y++)
      for (uint32_t x = 0; x < ww; x++)
        want += beam_roi_weight(&host->conf, r, hh, ww, y, x) != 0.0;
    assert_int_equal(cover[r], want);
  }
  free(cover);
  free(end);
}

/* Starts `cfg` on h x w frames of every dtype and checks, frame by frame,
 * the stage's sums (whichever layout start chose; `want` pins it) and the
 * index-list sums against the reference: integer dtypes exactly (every
 * sum here is below 2^53, so the reference is exact too), floats and
 * weights within 2 n 2^-53 sum |pixel x weight| (roi_sum.h). */
static void check_vs_ref(beam_cnode_t *(*mkcfg)(void), uint32_t hh, uint32_t ww, int want) {
  uint32_t shp[2] = {hh, ww};
  size_t npix = (size_t)hh * ww;
  for (size_t t = 0; t < NDT; t++) {
    beam_dtype_t dt = all_dtypes[t];
    bh_t *h = make(mkcfg(), 0, NULL);
    beam_diag_t d = {0};
    if (bh_start(h, dt, 2, shp, &d) != 0)
      fail_msg("start %s: %s", beam_dtype_name(dt), d.msg);
    beam_roi_host_t *host = h->st.priv;
    if (want == LAYOUT_RUNS) {
      assert_non_null(host->runs.run);
      check_runs(host, hh, ww);
    }
    if (want == LAYOUT_LISTS)
      assert_non_null(host->lists.off);
    size_t nroi = host->conf.nroi;
    double *ref = malloc(nroi * sizeof *ref), *mag = malloc(nroi * sizeof *mag);
    double *lst = malloc(nroi * sizeof *lst);
    for (uint64_t fr = 0; fr < 3; fr++) {
      beam_frame_t *in = bh_frame_new(dt, 2, shp, fr);
      fill_any(in, 1000 * t + fr);
      assert_int_equal(bh_process(h, in), 0);
      const double *got = h->res[h->nres - 1]->data;
      beam_roi_sum_ref(&host->conf, dt, hh, ww, in->data, ref);
      for (size_t r = 0; r < nroi; r++) {
        mag[r] = 0;
        for (uint32_t y = 0; y < hh; y++)
          for (uint32_t x = 0; x < ww; x++)
            mag[r] += fabs(px_val(in, (size_t)y * ww + x) * beam_roi_weight(&host->conf, r, hh, ww, y, x));
      }
      /* The same frame through index lists (start again without runs). */
      beam_indesc_t ind = {dt, 2, {hh, ww}};
      assert_int_equal(beam_roi_host_start(&h->st, host, NULL, &ind, 0, &d), 0);
      assert_null(host->runs.run);
      beam_roi_sum_cpu(host, dt, in->data, lst);
      assert_int_equal(beam_roi_host_start(&h->st, host, NULL, &ind, 1, &d), 0);
      int exact = dt != BEAM_DT_F32 && dt != BEAM_DT_F64 && !host->lists.w;
      for (size_t r = 0; r < nroi; r++) {
        double tol = exact ? 0.0 : 2.0 * (double)npix * 0x1p-53 * mag[r] * 1.001;
        if (!(fabs(got[r] - ref[r]) <= tol) || !(fabs(lst[r] - ref[r]) <= tol))
          fail_msg("%s frame %llu roi %zu: stage %.17g lists %.17g ref %.17g (tol %.3g)",
                   beam_dtype_name(dt), (unsigned long long)fr, r, got[r], lst[r], ref[r], tol);
        if (!exact && !(mag[r] > 0))
          fail_msg("roi %zu has no mass: the tolerance would be vacuous", r);
      }
      bh_frame_free(in);
    }
    free(ref);
    free(mag);
    free(lst);
    bh_free(&h);
  }
}

static void add_rect(beam_cnode_t *rois, const char *name, const char *rect) {
  beam_cnode_t *m = roi(name, "rect");
  bh_set(m, "rect", rect);
  bh_push(rois, m);
}

static void add_round(beam_cnode_t *rois, const char *name, const char *shape, const char *key,
                      const char *val, const char *center) {
  beam_cnode_t *m = roi(name, shape);
  bh_set(m, key, val);
  if (center)
    bh_set(m, "center", center);
  bh_push(rois, m);
}

/* On 67 x 80, none overlapping: a one-pixel disk, a disk and an annulus
 * round the centre (rows 2-12 hold no ROI pixel), the two top rows whole
 * (one run across the row end), a rect running past the bottom-right
 * edge, and a one-pixel-wide column (single-pixel runs). */
static beam_cnode_t *disjoint_cfg(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq();
  add_round(rois, "dot", "disk", "radius", "0.5", "[3, 60]");
  add_round(rois, "bf", "disk", "radius", "9.3", NULL);
  add_round(rois, "ring", "annulus", "radii", "[12, 20]", NULL);
  add_rect(rois, "top", "[0, 0, 80, 2]");
  add_rect(rois, "edge", "[75, 40, 200, 300]");
  add_rect(rois, "col", "[0, 30, 1, 35]");
  bh_put(cfg, "rois", rois);
  return cfg;
}

/* Overlapping: disk inside an annulus's hole and across it, a rect over
 * both, the whole frame (one run), two identical disks, and the last
 * pixel of the frame alone. */
static beam_cnode_t *overlap_cfg(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq();
  add_round(rois, "bf", "disk", "radius", "15", NULL);
  add_round(rois, "adf", "annulus", "radii", "[5, 25]", "[41.25, 30.5]");
  add_rect(rois, "box", "[30, 20, 50, 40]");
  add_rect(rois, "all", "[0, 0, 80, 67]");
  add_round(rois, "bf2", "disk", "radius", "15", NULL);
  add_rect(rois, "last", "[79, 66, 90, 90]");
  bh_put(cfg, "rois", rois);
  return cfg;
}

/* Nineteen rings one pixel wide: runs of one or two pixels, so start
 * picks the index lists. */
static beam_cnode_t *thin_rings_cfg(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq();
  for (int r = 2; r <= 20; r++) {
    char name[16], radii[32];
    snprintf(name, sizeof name, "r%d", r);
    snprintf(radii, sizeof radii, "[%d, %d]", r, r + 1);
    add_round(rois, name, "annulus", "radii", radii, NULL);
  }
  bh_put(cfg, "rois", rois);
  return cfg;
}

static void test_fast_disjoint(void **state) { check_vs_ref(disjoint_cfg, 67, 80, LAYOUT_RUNS); }
static void test_fast_overlap(void **state) { check_vs_ref(overlap_cfg, 67, 80, LAYOUT_RUNS); }
static void test_fast_thin_rings(void **state) { check_vs_ref(thin_rings_cfg, 67, 80, LAYOUT_LISTS); }

/* Tile fusion: produce hands out ranges of a frame held whole here, and
 * counts what it was asked for. */
typedef struct mapsrc_s {
  const float *px;
  size_t n, made, calls;
  int fail_at; /* call number that fails (0: none) */
} mapsrc_t;

static int map_from(void *ctx, size_t off, size_t n, void *out) {
  mapsrc_t *m = ctx;
  assert_true(n > 0 && off < m->n && n <= m->n - off);
  if (++m->calls == (size_t)m->fail_at)
    return BEAM_EIO;
  memcpy(out, m->px + off, n * sizeof(float));
  m->made += n;
  return 0;
}

/* The sums made tile by tile equal the sums over the whole frame bit for
 * bit, on frames large enough for many tiles and for runs longer than a
 * tile (overlap_cfg's "all", the top rows of disjoint_cfg), and only the
 * pixels some ROI covers (and gaps inside a tile) are ever made. */
static void check_mapped(beam_cnode_t *(*mkcfg)(void), uint32_t hh, uint32_t ww) {
  uint32_t shp[2] = {hh, ww};
  bh_t *h = make(mkcfg(), 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_F32, 2, shp, &d), 0);
  beam_roi_host_t *host = h->st.priv;
  assert_non_null(host->runs.run);
  assert_non_null(h->st.reduce_mapped);
  size_t nroi = host->conf.nroi;
  double *whole = malloc(nroi * sizeof *whole), *tiled = malloc(nroi * sizeof *tiled);
  for (uint64_t fr = 0; fr < 3; fr++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_F32, 2, shp, fr);
    fill_any(in, 77 * fr + 5);
    beam_roi_sum_runs(&host->runs, BEAM_DT_F32, in->data, whole);
    mapsrc_t m = {in->data, (size_t)hh * ww, 0, 0, 0};
    assert_int_equal(beam_roi_sum_runs_mapped(&host->runs, map_from, &m, tiled), 0);
    assert_memory_equal(whole, tiled, nroi * sizeof *whole);
    if (!(m.calls > ((size_t)hh * ww > 100000 ? 3u : 0u))) /* several tiles on the big frames */
      fail_msg("%ux%u: %zu calls, %zu made", hh, ww, m.calls, m.made);
    m.fail_at = (int)m.calls; /* the last piece fails: the error comes out */
    m.calls = 0;
    assert_int_equal(beam_roi_sum_runs_mapped(&host->runs, map_from, &m, tiled), BEAM_EIO);
    bh_frame_free(in);
  }
  free(whole);
  free(tiled);
  bh_free(&h);
}

static void test_mapped_bitwise(void **state) {
  (void)state;
  check_mapped(disjoint_cfg, 67, 80);
  check_mapped(overlap_cfg, 67, 80);
  check_mapped(disjoint_cfg, 330, 411);
  check_mapped(overlap_cfg, 330, 411);
  /* Only the covered part of the frame is made: a small disk in a big frame. */
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq();
  add_round(rois, "bf", "disk", "radius", "20", NULL);
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  uint32_t shp[2] = {500, 500};
  assert_int_equal(bh_start(h, BEAM_DT_F32, 2, shp, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_F32, 2, shp, 0);
  fill_any(in, 9);
  mapsrc_t m = {in->data, 250000, 0, 0, 0};
  double a, b;
  beam_roi_sum_runs(&((beam_roi_host_t *)h->st.priv)->runs, BEAM_DT_F32, in->data, &a);
  assert_int_equal(beam_roi_sum_runs_mapped(&((beam_roi_host_t *)h->st.priv)->runs, map_from, &m, &b), 0);
  assert_memory_equal(&a, &b, sizeof a);
  assert_true(m.made < 41 * 500); /* the disk's rows, not the frame */
  bh_frame_free(in);
  /* Not offered where the pieces would not add in the runs' order: other
   * dtypes, index lists. */
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), 0);
  assert_null(h->st.reduce_mapped);
  bh_free(&h);
  h = make(thin_rings_cfg(), 0, NULL);
  uint32_t small[2] = {67, 80};
  assert_int_equal(bh_start(h, BEAM_DT_F32, 2, small, &d), 0);
  assert_null(h->st.reduce_mapped);
  bh_free(&h);
}

static char label_file[256];
static beam_cnode_t *file_cfg(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *mk = bh_map();
  bh_set(mk, "file", label_file);
  bh_put(cfg, "masks", mk);
  return cfg;
}

/* Label images on 45 x 70: blocks of 10 x 10 with holes (0 and negative
 * labels) and stray single pixels (runs), then a checkerboard of three
 * labels (single-pixel runs everywhere: index lists). */
static void test_fast_labels(void **state) {
  enum { LH = 45, LW = 70 };
  static int32_t lab[LH * LW];
  uint32_t shp[2] = {LH, LW};
  uint64_t seed = 5;
  for (int y = 0; y < LH; y++)
    for (int x = 0; x < LW; x++) {
      int32_t v = 1 + x / 10 + 8 * (y / 10);
      if ((x / 10 + y / 10) % 5 == 3)
        v = (y / 10) % 2 ? 0 : -4;
      if (mix(&seed) % 40 == 0)
        v = 99;
      lab[y * LW + x] = v;
    }
  snprintf(label_file, sizeof label_file, "%s", tmp_path("blocks.npy"));
  assert_int_equal(bh_write_npy(label_file, "<i4", 2, shp, lab, sizeof lab), 0);
  check_vs_ref(file_cfg, LH, LW, LAYOUT_RUNS);
  for (int y = 0; y < LH; y++)
    for (int x = 0; x < LW; x++)
      lab[y * LW + x] = 1 + (x + y) % 3;
  snprintf(label_file, sizeof label_file, "%s", tmp_path("checker.npy"));
  assert_int_equal(bh_write_npy(label_file, "<i4", 2, shp, lab, sizeof lab), 0);
  check_vs_ref(file_cfg, LH, LW, LAYOUT_LISTS);
}

/* A weight stack of four masks on 33 x 41 with zeros, negatives and
 * fractions: the weighted gather, every dtype. */
static void test_fast_weights(void **state) {
  enum { WH = 33, WW = 41 };
  static float w[4 * WH * WW];
  uint64_t seed = 9;
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
    uint64_t z = mix(&seed);
    w[i] = z % 3 == 0 ? 0.0f : (float)((int)(z % 2001) - 1000) / 256.0f;
  }
  uint32_t shp3[3] = {4, WH, WW};
  snprintf(label_file, sizeof label_file, "%s", tmp_path("wstack.npy"));
  assert_int_equal(bh_write_npy(label_file, "<f4", 3, shp3, w, sizeof w), 0);
  check_vs_ref(file_cfg, WH, WW, LAYOUT_LISTS);
}

/* Sums that overflow a 32-bit lane (uint16 runs longer than 65536 pixels,
 * 16-bit lanes of a negative int16 run) or whose uint32 pixels are near
 * 2^32: every run and list sum is exact, checked against closed forms. */
static beam_cnode_t *whole_cfg(void) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq();
  add_rect(rois, "all", "[0, 0, 300, 300]");
  add_rect(rois, "rows", "[0, 100, 300, 103]");
  bh_put(cfg, "rois", rois);
  return cfg;
}

static void test_exact_large(void **state) {
  uint32_t shp[2] = {300, 300};
  const struct {
    beam_dtype_t dt;
    double v;
  } cases[] = {{BEAM_DT_U8, 255},         {BEAM_DT_U16, 65535},         {BEAM_DT_I16, -32768},
               {BEAM_DT_I8, -128},        {BEAM_DT_U32, 4294967295.0}, {BEAM_DT_I32, -2147483648.0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    bh_t *h = make(whole_cfg(), 0, NULL);
    beam_diag_t d = {0};
    assert_int_equal(bh_start(h, cases[c].dt, 2, shp, &d), 0);
    beam_roi_host_t *host = h->st.priv;
    assert_non_null(host->runs.run);
    assert_int_equal(host->runs.n, 2); /* whole frame and 3 whole rows: one run each */
    beam_frame_t *in = bh_frame_new(cases[c].dt, 2, shp, 0);
    for (size_t i = 0; i < 90000; i++)
      switch (cases[c].dt) {
      case BEAM_DT_U8: ((uint8_t *)in->data)[i] = 255; break;
      case BEAM_DT_U16: ((uint16_t *)in->data)[i] = 65535; break;
      case BEAM_DT_I16: ((int16_t *)in->data)[i] = INT16_MIN; break;
      case BEAM_DT_I8: ((int8_t *)in->data)[i] = INT8_MIN; break;
      case BEAM_DT_U32: ((uint32_t *)in->data)[i] = UINT32_MAX; break;
      case BEAM_DT_I32: ((int32_t *)in->data)[i] = INT32_MIN; break;
      default: break;
      }
    assert_int_equal(bh_process(h, in), 0);
    const double *s = h->res[0]->data;
    double lst[2];
    beam_indesc_t ind = {cases[c].dt, 2, {300, 300}};
    assert_int_equal(beam_roi_host_start(&h->st, host, NULL, &ind, 0, &d), 0);
    beam_roi_sum_cpu(host, cases[c].dt, in->data, lst);
    if (!(s[0] == 90000 * cases[c].v && s[1] == 900 * cases[c].v && lst[0] == s[0] && lst[1] == s[1]))
      fail_msg("%s: runs %.17g %.17g lists %.17g %.17g, want %.17g %.17g", beam_dtype_name(cases[c].dt),
               s[0], s[1], lst[0], lst[1], 90000 * cases[c].v, 900 * cases[c].v);
    bh_frame_free(in);
    bh_free(&h);
  }
  /* uint32 near 2^32 at random against an independent 64-bit integer sum. */
  bh_t *h = make(disjoint_cfg(), 0, NULL);
  uint32_t shp2[2] = {67, 80};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U32, 2, shp2, &d), 0);
  beam_roi_host_t *host = h->st.priv;
  beam_frame_t *in = bh_frame_new(BEAM_DT_U32, 2, shp2, 0);
  uint64_t seed = 3;
  for (size_t i = 0; i < 67 * 80; i++)
    ((uint32_t *)in->data)[i] = UINT32_MAX - (uint32_t)(mix(&seed) % 1000);
  assert_int_equal(bh_process(h, in), 0);
  const double *s = h->res[0]->data;
  for (size_t r = 0; r < host->conf.nroi; r++) {
    uint64_t want = 0;
    for (uint32_t y = 0; y < 67; y++)
      for (uint32_t x = 0; x < 80; x++)
        if (beam_roi_weight(&host->conf, r, 67, 80, y, x) != 0.0)
          want += ((uint32_t *)in->data)[y * 80 + x];
    if (!(s[r] == (double)want))
      fail_msg("roi %zu: %.17g, want %llu", r, s[r], (unsigned long long)want);
  }
  bh_frame_free(in);
  bh_free(&h);
}

static void test_labels(void **state) {
  uint32_t shp[2] = {3, 4};
  int32_t lab[12] = {0, 3, 3, 7, 7, 0, -2, 3, 0, 0, 7, 7};
  assert_int_equal(bh_write_npy(tmp_path("lab.npy"), "<i4", 2, shp, lab, sizeof lab), 0);
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *mk = bh_map();
  bh_set(mk, "file", tmp_path("lab.npy"));
  bh_put(cfg, "masks", mk);
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_F64, 2, shp, &d), 0);
  assert_string_equal(h->st.outs[0].labels_json, "[\"label_3\",\"label_7\"]");
  beam_frame_t *in = bh_frame_new(BEAM_DT_F64, 2, shp, 0);
  for (int i = 0; i < 12; i++)
    ((double *)in->data)[i] = 1 << i;
  assert_int_equal(bh_process(h, in), 0);
  const double *s = h->res[0]->data;
  assert_true(s[0] == 2 + 4 + 128);
  assert_true(s[1] == 8 + 16 + 1024 + 2048);
  bh_frame_free(in);
  bh_free(&h);
}

static void test_weights(void **state) {
  uint32_t shp3[3] = {2, 2, 3}, shp[2] = {2, 3};
  float w[12] = {1, 0, 0.5f, 0, 0, 0, /* mask 0 */ 0, 0, 0, 2, 2, -1 /* mask 1 */};
  assert_int_equal(bh_write_npy(tmp_path("w.npy"), "<f4", 3, shp3, w, sizeof w), 0);
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *mk = bh_map();
  bh_set(mk, "file", tmp_path("w.npy"));
  bh_put(cfg, "masks", mk);
  bh_t *h = make(cfg, 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_I32, 2, shp, &d), 0);
  beam_frame_t *in = bh_frame_new(BEAM_DT_I32, 2, shp, 0);
  int32_t v[6] = {10, 20, 30, 40, 50, 60};
  memcpy(in->data, v, sizeof v);
  assert_int_equal(bh_process(h, in), 0);
  const double *s = h->res[0]->data;
  assert_true(s[0] == 10 + 15);
  assert_true(s[1] == 80 + 100 - 60);
  /* Mask shape must match the frame. */
  uint32_t other[2] = {3, 2};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_I32, 2, other, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "masks have shape [2, 2, 3] but the frames are [3, 2]"));
  bh_frame_free(in);
  bh_free(&h);
}

/* scan_shape [2, 3], image_every 4, 7 frames: a PARTIAL image after frame
 * 4, a FINAL one at end; frame k lands in pixel k mod 6. */
static void test_scan_image(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m = roi("all", "rect");
  bh_set(m, "rect", "[0, 0, 2, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_set(cfg, "scan_shape", "[2, 3]");
  bh_set(cfg, "image_every", "4");
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {2, 2};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 2);
  assert_string_equal(h->st.outs[1].name, "image");
  assert_int_equal(h->st.outs[1].shape[1], 2);
  assert_int_equal(h->st.outs[1].shape[2], 3);
  for (uint64_t k = 0; k < 7; k++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_U8, 2, shp, k);
    memset(in->data, (int)k + 1, 4); /* sum = 4 (k + 1) */
    if (k == 2)
      in->flags = BEAM_FLAG_CORRUPT;
    assert_int_equal(bh_process(h, in), 0);
    bh_frame_free(in);
  }
  assert_int_equal(bh_end(h), 0);
  /* 7 sums + partial image after the 4th frame + final image */
  assert_int_equal(h->nres, 9);
  assert_int_equal(h->res_out[4], 1);
  assert_true(h->res[4]->flags & BEAM_FLAG_PARTIAL);
  const float *p = h->res[4]->data;
  assert_true(p[0] == 4 && p[1] == 8 && isnan(p[2]) && p[3] == 16 && isnan(p[4]) && isnan(p[5]));
  assert_true(isnan(((double *)h->res[2]->data)[0])); /* CORRUPT -> NaN sum */
  assert_true(h->res[2]->flags & BEAM_FLAG_CORRUPT);
  assert_int_equal(h->res_out[8], 1);
  assert_true(h->res[8]->flags & BEAM_FLAG_FINAL);
  const float *f = h->res[8]->data;
  assert_true(f[0] == 28 && f[1] == 8 && isnan(f[2]) && f[3] == 16 && f[4] == 20 && f[5] == 24);
  bh_free(&h);
}

/* Without scan_shape in the config the series metadata's is used, series
 * by series; the config's wins where both are; a bad one refuses the
 * series; none at all: sums only. */
static void test_scan_shape_from_series(void **state) {
  (void)state;
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m = roi("all", "rect");
  bh_set(m, "rect", "[0, 0, 2, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {2, 2};
  beam_diag_t d = {0};
  static const char meta[] = "{\"detector\": \"sim\", \"scan_shape\": [3, 2]}";
  h->series.meta_json = (char *)meta;
  h->series.meta_len = sizeof meta - 1;
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 2);
  assert_int_equal(h->st.outs[1].shape[1], 3);
  assert_int_equal(h->st.outs[1].shape[2], 2);
  for (uint64_t k = 0; k < 6; k++) {
    beam_frame_t *in = bh_frame_new(BEAM_DT_U8, 2, shp, k);
    memset(in->data, (int)k + 1, 4);
    assert_int_equal(bh_process(h, in), 0);
    bh_frame_free(in);
  }
  assert_int_equal(bh_end(h), 0);
  const float *f = bh_last(h, 1)->data;
  for (int k = 0; k < 6; k++)
    assert_true(f[k] == 4.0f * (float)(k + 1));
  static const char bad[] = "{\"scan_shape\": [3]}";
  h->series.meta_json = (char *)bad;
  h->series.meta_len = sizeof bad - 1;
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "scan_shape"));
  static const char none[] = "{\"detector\": \"sim\"}";
  h->series.meta_json = (char *)none;
  h->series.meta_len = sizeof none - 1;
  memset(&d, 0, sizeof d);
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), 0);
  assert_int_equal(h->st.nouts, 1);
  h->series.meta_json = NULL;
  h->series.meta_len = 0;
  bh_free(&h);
  /* The config's scan_shape over the series'. */
  cfg = bh_stage_cfg("roi_sum"), rois = bh_seq(), m = roi("all", "rect");
  bh_set(m, "rect", "[0, 0, 2, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_set(cfg, "scan_shape", "[1, 6]");
  h = make(cfg, 0, NULL);
  h->series.meta_json = (char *)meta;
  h->series.meta_len = sizeof meta - 1;
  assert_int_equal(bh_start(h, BEAM_DT_U8, 2, shp, &d), 0);
  assert_int_equal(h->st.outs[1].shape[1], 1);
  assert_int_equal(h->st.outs[1].shape[2], 6);
  h->series.meta_json = NULL;
  h->series.meta_len = 0;
  bh_free(&h);
}

static void test_config_errors(void **state) {
  /* neither */
  bh_t *h = make(bh_stage_cfg("roi_sum"), BEAM_ECONFIG, "exactly one of rois");
  bh_free(&h);
  /* both */
  beam_cnode_t *cfg = three_rois(), *mk = bh_map();
  bh_set(mk, "file", "/nonexistent.npy");
  bh_put(cfg, "masks", mk);
  h = make(cfg, BEAM_ECONFIG, "not both");
  bh_free(&h);
  /* missing mask file */
  cfg = bh_stage_cfg("roi_sum");
  mk = bh_map();
  bh_set(mk, "file", "/nonexistent/masks.h5");
  bh_put(cfg, "masks", mk);
  h = make(cfg, BEAM_EIO, "/nonexistent/masks.h5");
  bh_free(&h);
  /* annulus radii reversed; disk without radius; duplicate names */
  cfg = bh_stage_cfg("roi_sum");
  beam_cnode_t *rois = bh_seq(), *m = roi("a", "annulus");
  bh_set(m, "radii", "[5, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  h = make(cfg, BEAM_ECONFIG, "inner < outer");
  bh_free(&h);
  cfg = bh_stage_cfg("roi_sum");
  rois = bh_seq();
  bh_push(rois, roi("d", "disk"));
  bh_put(cfg, "rois", rois);
  h = make(cfg, BEAM_ECONFIG, "needs radius");
  bh_free(&h);
  cfg = bh_stage_cfg("roi_sum");
  rois = bh_seq();
  m = roi("x", "rect");
  bh_set(m, "rect", "[0, 0, 1, 1]");
  bh_push(rois, m);
  m = roi("x", "rect");
  bh_set(m, "rect", "[1, 1, 2, 2]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  h = make(cfg, BEAM_ECONFIG, "two ROIs are named \"x\"");
  bh_free(&h);
  /* a 2-D float mask is not a label image */
  uint32_t shp[2] = {2, 2};
  float fm[4] = {0, 1, 1, 0};
  assert_int_equal(bh_write_npy(tmp_path("fm.npy"), "<f4", 2, shp, fm, sizeof fm), 0);
  cfg = bh_stage_cfg("roi_sum");
  mk = bh_map();
  bh_set(mk, "file", tmp_path("fm.npy"));
  bh_put(cfg, "masks", mk);
  h = make(cfg, BEAM_ENOTSUP, "integer label image");
  bh_free(&h);
}

static void test_start_errors(void **state) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m = roi("far", "rect");
  bh_set(m, "rect", "[100, 100, 110, 110]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  bh_t *h = make(cfg, 0, NULL);
  uint32_t shp[2] = {16, 16};
  beam_diag_t d = {0};
  assert_int_equal(bh_start(h, BEAM_DT_U16, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "ROI \"far\" has no pixel inside the 16x16 frame"));
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_C64, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "complex64"));
  uint32_t shp3[3] = {2, 16, 16};
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U16, 3, shp3, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "2-D"));
  bh_free(&h);
}

/* ---- mask and centre from the series --------------------------------------- */

/* A 9 x 11 uint32 series: pixel_mask bad at three pixels, one of them the
 * hot pixel (huge value) inside every ROI below; beam_center [y, x] =
 * [4, 6] in the metadata. with_mask / with_center leave either out. */
enum { SH = 9, SW = 11 };
static const size_t bad_px[3] = {4 * SW + 6, 4 * SW + 7, 0};
static beam_series_t *meta_series(int with_mask, int with_center) {
  uint32_t shp[2] = {SH, SW};
  const char *meta = with_center ? "{\"detector\":\"t\",\"beam_center\":[4,6]}" : "{\"detector\":\"t\"}";
  beam_series_t *s = beam_series_new(3, BEAM_DT_U32, 2, shp, meta, strlen(meta));
  assert_non_null(s);
  uint32_t mask[SH * SW] = {0};
  for (int i = 0; i < 3; i++)
    mask[bad_px[i]] = 1u << i; /* any bit set is bad (DECTRIS gap, dead, cold...) */
  if (with_mask)
    assert_int_equal(beam_series_add_array(s, "pixel_mask", BEAM_DT_U32, 2, shp, mask, sizeof mask), 0);
  return s;
}

static int start_on(bh_t *h, const beam_series_t *s, int use_runs, beam_diag_t *d) {
  beam_indesc_t in;
  memset(&in, 0, sizeof in);
  in.dtype = s->dtype;
  in.ndim = s->ndim;
  memcpy(in.shape, s->shape, sizeof in.shape);
  h->st.nouts = 0;
  return beam_roi_host_start(&h->st, h->st.priv, s, &in, use_runs, d);
}

/* Value x + 100 y, and 4e9 at the hot pixel (6, 4). */
static beam_frame_t *hot_frame(void) {
  uint32_t shp[2] = {SH, SW};
  beam_frame_t *f = bh_frame_new(BEAM_DT_U32, 2, shp, 0);
  for (size_t i = 0; i < SH * SW; i++)
    ((uint32_t *)f->data)[i] = (uint32_t)(i % SW + 100 * (i / SW));
  ((uint32_t *)f->data)[bad_px[0]] = 4000000000u;
  return f;
}

static int is_bad(size_t i) { return i == bad_px[0] || i == bad_px[1] || i == bad_px[2]; }

/* Independent sum over a disk of radius r at (cx, cy), bad pixels out. */
static double disk_sum(const beam_frame_t *f, double cx, double cy, double r, int mask) {
  double sum = 0;
  for (size_t i = 0; i < SH * SW; i++) {
    double dx = (double)(i % SW) - cx, dy = (double)(i / SW) - cy;
    if (dx * dx + dy * dy < r * r && !(mask && is_bad(i)))
      sum += ((const uint32_t *)f->data)[i];
  }
  return sum;
}

static beam_cnode_t *disk_cfg(const char *center, const char *mask) {
  beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *rois = bh_seq(), *m = roi("bf", "disk");
  bh_set(m, "radius", "2.5");
  if (center)
    bh_set(m, "center", center);
  bh_push(rois, m);
  m = roi("all", "rect");
  bh_set(m, "rect", "[0, 0, 11, 9]");
  bh_push(rois, m);
  bh_put(cfg, "rois", rois);
  if (mask)
    bh_set(cfg, "mask", mask);
  return cfg;
}

static void test_series_mask_center(void **state) {
  beam_frame_t *f = hot_frame();
  beam_series_t *s = meta_series(1, 1);
  double typed[2];
  /* The centre typed in, no mask: the hot pixel is in both sums. */
  bh_t *h = make(disk_cfg("[6, 4]", NULL), 0, NULL);
  beam_diag_t d = {0};
  assert_int_equal(start_on(h, s, 1, &d), 0);
  assert_int_equal(bh_process(h, f), 0);
  memcpy(typed, h->res[0]->data, sizeof typed);
  assert_true(typed[0] == disk_sum(f, 6, 4, 2.5, 0));
  assert_true(typed[0] > 4e9);
  bh_free(&h);
  /* center: series and mask: series, runs and lists: the centre is the
   * same, the three bad pixels are out of both ROIs. */
  for (int use_runs = 0; use_runs < 2; use_runs++) {
    h = make(disk_cfg("series", "series"), 0, NULL);
    beam_diag_clear(&d);
    assert_int_equal(start_on(h, s, use_runs, &d), 0);
    assert_int_equal(bh_process(h, f), 0);
    const double *got = h->res[0]->data;
    assert_true(got[0] == disk_sum(f, 6, 4, 2.5, 1));
    assert_true(got[0] == typed[0] - 4000000000.0 - 7.0 - 400.0); /* (7, 4) = 7 + 400 */
    double all = 0;
    for (size_t i = 0; i < SH * SW; i++)
      all += is_bad(i) ? 0 : ((const uint32_t *)f->data)[i];
    assert_true(got[1] == all);
    bh_free(&h);
  }
  /* Label images honour the mask too (runs and lists). */
  uint32_t shp[2] = {SH, SW};
  int32_t lab[SH * SW];
  for (size_t i = 0; i < SH * SW; i++)
    lab[i] = (int32_t)(i / SW) + 1; /* one label per row */
  assert_int_equal(bh_write_npy(tmp_path("rows.npy"), "<i4", 2, shp, lab, sizeof lab), 0);
  for (int use_runs = 0; use_runs < 2; use_runs++) {
    beam_cnode_t *cfg = bh_stage_cfg("roi_sum"), *mk = bh_map();
    bh_set(mk, "file", tmp_path("rows.npy"));
    bh_put(cfg, "masks", mk);
    bh_set(cfg, "mask", "series");
    h = make(cfg, 0, NULL);
    beam_diag_clear(&d);
    assert_int_equal(start_on(h, s, use_runs, &d), 0);
    assert_int_equal(bh_process(h, f), 0);
    const double *got = h->res[0]->data;
    for (uint32_t y = 0; y < SH; y++) {
      double want = 0;
      for (uint32_t x = 0; x < SW; x++)
        want += is_bad(y * SW + x) ? 0 : ((const uint32_t *)f->data)[y * SW + x];
      assert_true(got[y] == want);
    }
    bh_free(&h);
  }
  beam_series_unref(&s);
  bh_frame_free(f);
}

/* What the config asks the series for must be there: refused at start. */
static void test_series_missing(void **state) {
  beam_diag_t d = {0};
  beam_series_t *nomask = meta_series(0, 1), *nocenter = meta_series(1, 0);
  bh_t *h = make(disk_cfg(NULL, "series"), 0, NULL);
  assert_int_equal(start_on(h, nomask, 1, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "roi_sum: mask: series, but series 3 carries no \"pixel_mask\""));
  beam_diag_clear(&d);
  assert_int_equal(start_on(h, nocenter, 1, &d), 0); /* the mask is all it needs */
  bh_free(&h);
  h = make(disk_cfg("series", NULL), 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(start_on(h, nocenter, 1, &d), BEAM_ECONFIG);
  assert_non_null(strstr(d.msg, "roi_sum: ROI \"bf\": center: series, but the metadata of series 3 has no beam_center"));
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U32, 2, nocenter->shape, &d), BEAM_ECONFIG); /* no metadata at all */
  bh_free(&h);
  /* A mask of another shape; a file mask like the series one. */
  uint32_t other[2] = {SW, SH};
  beam_series_t *o = beam_series_new(4, BEAM_DT_U32, 2, other, NULL, 0);
  uint32_t m[SH * SW] = {0};
  assert_int_equal(beam_series_add_array(o, "pixel_mask", BEAM_DT_U32, 2, other, m, sizeof m), 0);
  uint32_t shp[2] = {SH, SW};
  h = make(disk_cfg(NULL, "series"), 0, NULL);
  beam_indesc_t in = {.dtype = BEAM_DT_U32, .ndim = 2, .shape = {SH, SW}};
  beam_diag_clear(&d);
  assert_int_equal(beam_roi_host_start(&h->st, h->st.priv, o, &in, 1, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "the mask (from the series) is [11, 9] but the frames are [9, 11]"));
  bh_free(&h);
  uint8_t fm[SH * SW] = {0};
  fm[bad_px[0]] = 1;
  assert_int_equal(bh_write_npy(tmp_path("m.npy"), "|u1", 2, shp, fm, sizeof fm), 0);
  h = make(disk_cfg("[6, 4]", tmp_path("m.npy")), 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U32, 2, shp, &d), 0);
  beam_frame_t *f = hot_frame();
  assert_int_equal(bh_process(h, f), 0);
  assert_true(((const double *)h->res[0]->data)[0] == disk_sum(f, 6, 4, 2.5, 0) - 4000000000.0);
  bh_frame_free(f);
  bh_free(&h);
  /* A disk wholly masked is an empty ROI. */
  fm[bad_px[0]] = 0;
  for (size_t i = 0; i < SH * SW; i++)
    fm[i] = 1;
  assert_int_equal(bh_write_npy(tmp_path("m1.npy"), "|u1", 2, shp, fm, sizeof fm), 0);
  h = make(disk_cfg(NULL, tmp_path("m1.npy")), 0, NULL);
  beam_diag_clear(&d);
  assert_int_equal(bh_start(h, BEAM_DT_U32, 2, shp, &d), BEAM_ESHAPE);
  assert_non_null(strstr(d.msg, "(after the bad-pixel mask)"));
  bh_free(&h);
  /* center takes a list or the word series, nothing else. */
  char msg[256];
  beam_cnode_t *cfg = disk_cfg("middle", NULL);
  assert_true(bh_validate(cfg, beam_roi_sum_params, msg, sizeof msg) > 0);
  assert_non_null(strstr(msg, "or series"));
  beam_cnode_free(cfg);
  beam_series_unref(&o);
  beam_series_unref(&nomask);
  beam_series_unref(&nocenter);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hand_computed), cmocka_unit_test(test_random_u16),
      cmocka_unit_test(test_random_f32),    cmocka_unit_test(test_labels),
      cmocka_unit_test(test_weights),       cmocka_unit_test(test_scan_image),
      cmocka_unit_test(test_scan_shape_from_series),
      cmocka_unit_test(test_config_errors), cmocka_unit_test(test_start_errors),
      cmocka_unit_test(test_fast_disjoint),
      cmocka_unit_test(test_mapped_bitwise), cmocka_unit_test(test_fast_overlap),
      cmocka_unit_test(test_fast_thin_rings), cmocka_unit_test(test_fast_labels),
      cmocka_unit_test(test_fast_weights),  cmocka_unit_test(test_exact_large),
      cmocka_unit_test(test_series_mask_center), cmocka_unit_test(test_series_missing),
  };
  return beam_run_tests(tests, NULL, NULL);
}
