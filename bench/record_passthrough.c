/* Per-frame cost of the `record` stage for frames that arrive
 * bitshuffle-LZ4 encoded: pass-through (the payload stored as the HDF5
 * chunk, checked but never decoded) against the path every such frame took
 * before (lazy decode on the stage thread, then process: bitshuffle + LZ4
 * encode and H5Dwrite_chunk).
 *
 *   record_passthrough [--shape HxW] [--frames N] [--mean M] [--dir DIR]
 *
 * Frames are uint16 Poisson counts of mean M (default 2, a sparse detector
 * frame), K different ones encoded once with our codec and reused. The two
 * paths alternate frame by frame into one file, so both see the same disk
 * and the same load; each frame's time is what the graph's worker would
 * spend in the stage (decode included for the old path). Medians of N
 * frames per path; decode alone, and the LZ4 decompression that
 * pass-through's check performs, are reported too. The file is deleted at the
 * end. Not a test: it prints figures and checks nothing but errors. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lz4.h>

#include "bench/bench_stage.h"
#include "daemon/config.h"
#include "daemon/stage_record.h"
#include "proto/lz4_check.h"

#define K 8 /* distinct frames */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double median_ms(uint64_t *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_u64);
  return 1e-6 * (double)(n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static uint16_t poisson(double mean) {
  double l = exp(-mean), p = 1.0;
  unsigned k = 0;
  do {
    k++;
    p *= urand();
  } while (p > l && k < 65535);
  return (uint16_t)(k - 1);
}

static uint32_t rd_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* What pass-through's check costs: every LZ4 block of enc walked (check:
 * full, dst NULL) or decompressed (check: decode), the framing read. */
static int lz4_blocks(const uint8_t *enc, size_t len, size_t raw, uint8_t *dst) {
  size_t b = rd_be32(enc + 8) / 2, n = raw / 2, pos = 12;
  for (size_t i = 0; i < n; i += b) {
    size_t cnt = n - i < b ? n - i : b;
    cnt -= cnt % 8;
    if (!cnt)
      break;
    size_t c = rd_be32(enc + pos);
    if (dst ? LZ4_decompress_safe((const char *)enc + pos + 4, (char *)dst, (int)c, (int)(cnt * 2)) < 0
            : !beam_lz4_block_check(enc + pos + 4, c, cnt * 2))
      return -1;
    pos += 4 + c;
  }
  return pos <= len ? 0 : -1;
}

static void noop_release(beam_frame_t *f, void *ctx) {
  (void)f;
  (void)ctx;
}

/* A slot of p holding enc as the ingest leaves a bslz4 frame (lazy decode). */
static beam_frame_t *pending(beam_pool_t *p, const uint8_t *enc, size_t len, size_t raw,
                             const uint32_t *shape, uint64_t fid) {
  beam_frame_t *f = beam_pool_try_get(p);
  if (!f)
    return NULL;
  f->series_id = 1;
  f->frame_id = fid;
  f->dtype = BEAM_DT_U16;
  f->ndim = 2;
  f->shape[0] = shape[0];
  f->shape[1] = shape[1];
  f->nbytes = raw;
  f->data = (void *)enc;
  f->release = noop_release;
  f->codec = BEAM_CODEC_BSLZ4;
  f->enc_size = len;
  atomic_store(&f->dec_state, BEAM_DEC_PENDING);
  return f;
}

int main(int argc, char **argv) {
  uint32_t shape[2] = {512, 512};
  unsigned nframes = 100;
  double mean = 2.0;
  const char *dir = "/tmp";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
      if (sscanf(argv[++i], "%ux%u", &shape[0], &shape[1]) != 2)
        return 2;
    } else if (!strcmp(argv[i], "--frames") && i + 1 < argc) {
      nframes = (unsigned)atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--mean") && i + 1 < argc) {
      mean = atof(argv[++i]);
    } else if (!strcmp(argv[i], "--dir") && i + 1 < argc) {
      dir = argv[++i];
    } else {
      fprintf(stderr, "usage: record_passthrough [--shape HxW] [--frames N] [--mean M] [--dir DIR]\n");
      return 2;
    }
  }
  if (!nframes || !shape[0] || !shape[1])
    return 2;
  beam_record_stage_register();
  char yaml[4400];
  snprintf(yaml, sizeof yaml, "{name: rec, kind: record, dir: \"%s\", prefix: bench_pt_%d_}", dir,
           (int)getpid());
  beam_cfg_errs_t errs = {0};
  beam_cnode_t *cfg = beam_yaml_parse(yaml, strlen(yaml), "<bench>", &errs);
  if (!cfg || beam_cfg_validate(cfg, beam_record_params, "bench", &errs) > 0) {
    fprintf(stderr, "record_passthrough: bad config %s: %s\n", yaml, errs.n ? errs.msgs[0] : "");
    return 1;
  }
  beam_cfg_errs_free(&errs);

  size_t n = (size_t)shape[0] * shape[1], raw = n * 2;
  size_t cap = beam_codec_bound(BEAM_CODEC_BSLZ4, raw, 2);
  uint16_t *px = malloc(raw);
  uint8_t *scratch = malloc(raw), *enc[K];
  size_t len[K], enc_total = 0;
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < n; i++)
      px[i] = poisson(mean);
    enc[k] = malloc(cap);
    int64_t e = beam_codec_encode(BEAM_CODEC_BSLZ4, px, raw, 2, enc[k], cap, scratch);
    if (e < 0)
      return 1;
    len[k] = (size_t)e;
    enc_total += len[k];
  }

  beam_stage_t st;
  memset(&st, 0, sizeof st);
  st.ops = &beam_record_cpu_ops;
  st.cfg = cfg;
  snprintf(st.name, sizeof st.name, "rec");
  beam_diag_t d = {0};
  beam_series_t *series = beam_series_new(1, BEAM_DT_U16, 2, shape, NULL, 0);
  beam_indesc_t in = {BEAM_DT_U16, 2, {shape[0], shape[1], 0, 0}};
  beam_pool_t *pool = beam_pool_new(1, raw, 0, &d);
  if (!pool || st.ops->init(&st, &d) < 0 || st.ops->start(&st, series, &in, &d) < 0 ||
      !st.process_encoded) {
    fprintf(stderr, "record_passthrough: %s\n", d.msg);
    return 1;
  }
  bench_emitter_t em;
  bench_emitter_init(&em, &st);
  beam_emit_t e = bench_emit(&em);
  uint64_t *t_pt = calloc(nframes, sizeof *t_pt), *t_old = calloc(nframes, sizeof *t_old),
           *t_dec = calloc(nframes, sizeof *t_dec), *t_lz4 = calloc(nframes, sizeof *t_lz4),
           *t_walk = calloc(nframes, sizeof *t_walk);
  unsigned warm = 3;
  uint64_t fid = 0;
  for (unsigned i = 0; i < nframes + warm; i++) {
    int k = (int)(i % K);
    /* pass-through */
    beam_frame_t *f = pending(pool, enc[k], len[k], raw, shape, fid++);
    uint64_t t0 = bench_now_ns();
    int rc = st.process_encoded(&st, f, &e);
    uint64_t t1 = bench_now_ns();
    if (rc != 1 || atomic_load(&f->dec_state) != BEAM_DEC_PENDING) {
      fprintf(stderr, "record_passthrough: frame not passed through (%d): %s\n", rc, st.diag.msg);
      return 1;
    }
    beam_frame_unref(f);
    /* before: decode on the stage thread, then encode and write */
    f = pending(pool, enc[k], len[k], raw, shape, fid++);
    uint64_t t2 = bench_now_ns();
    rc = beam_frame_decode(f, scratch, NULL);
    uint64_t t3 = bench_now_ns();
    if (rc == 0)
      rc = st.ops->process(&st, f, &e);
    uint64_t t4 = bench_now_ns();
    if (rc < 0) {
      fprintf(stderr, "record_passthrough: %s\n", st.diag.msg);
      return 1;
    }
    beam_frame_unref(f);
    uint64_t t5 = bench_now_ns();
    if (lz4_blocks(enc[k], len[k], raw, scratch) < 0)
      return 1;
    uint64_t t6 = bench_now_ns();
    if (lz4_blocks(enc[k], len[k], raw, NULL) < 0)
      return 1;
    uint64_t t7 = bench_now_ns();
    if (i >= warm) {
      t_walk[i - warm] = t7 - t6;
      t_lz4[i - warm] = t6 - t5;
      t_pt[i - warm] = t1 - t0;
      t_old[i - warm] = t4 - t2;
      t_dec[i - warm] = t3 - t2;
    }
  }
  int erc = st.ops->end(&st, &e);
  char path[4500];
  snprintf(path, sizeof path, "%s/bench_pt_%d_series_1.h5", dir, (int)getpid());
  unlink(path);
  st.ops->destroy(&st);
  double pt = median_ms(t_pt, nframes), old = median_ms(t_old, nframes), dec = median_ms(t_dec, nframes);
  double lz = median_ms(t_lz4, nframes), wk = median_ms(t_walk, nframes);
  printf("record_passthrough %ux%u uint16 poisson mean %.3g: %.1f%% of raw size (%zu of %zu bytes "
         "per frame), %u frames per path, medians:\n",
         shape[0], shape[1], mean, 100.0 * (double)enc_total / K / (double)raw, enc_total / K, raw, nframes);
  printf("  pass-through          %8.3f ms/frame (its LZ4 check alone: walked %.3f ms, "
         "decompressed %.3f ms)\n", pt, wk, lz);
  printf("  decode + encode path  %8.3f ms/frame (decode alone %.3f ms)\n", old, dec);
  printf("  ratio                 %8.2fx\n", old / pt);
  if (erc < 0)
    fprintf(stderr, "record_passthrough: end: %s\n", st.diag.msg);
  bench_emitter_free(&em);
  beam_pool_close(&pool);
  beam_series_unref(&series);
  beam_cnode_free(cfg);
  for (int k = 0; k < K; k++)
    free(enc[k]);
  free(px);
  free(scratch);
  free(t_pt);
  free(t_old);
  free(t_dec);
  free(t_lz4);
  free(t_walk);
  return erc < 0 ? 1 : 0;
}
