/* xpcs_multitau: frames/s of the CPU xpcs_multitau stage, driven through
 * its stage ops (init, start, process, end) with a private emitter, so the
 * figure is the kernel alone (no pool, queue, thread or socket).
 *
 * Cases (uint16 Poisson frames, mean 20, cycled from a bank of 16):
 *   big   1000x1000, all pixels in 16 rings, buffers 8, levels 8 (lags to
 *         896 frames), 1000 frames
 *   skb   128x128, 8 rings, levels 7, buffers 16, 1000 frames: the size
 *         scikit-beam's multi_tau_auto_corr is usually timed at
 * Reports frames/s (wall clock) and the process CPU seconds per frame,
 * ns per ROI pixel per frame pair (pairs counted from the stage's own
 * pair counters), for normalization roi and per_pixel, at `threads` 1 and
 * 2, and the 1-minute load average before each case (this machine is
 * shared: wall-clock figures under load understate what the code does,
 * CPU time per frame does not). Also the pool's handoff: empty fork-join
 * phases per second at 2 threads (the fixed cost every frame pays once).
 * Each case also prints a `json: {...}` line (bench/xpcs.py reads those).
 * Not a test: no pass/fail.
 *
 *   xpcs_multitau [--backend cpu|cuda] [--quick | --big N [THREADS]]
 *
 * --backend cuda (or --cuda) drives the stage's CUDA backend
 * (beam_xpcs_multitau_cuda_ops) with the same cases (threads do not
 * apply: one run each; no pool handoff), the frame bank in pinned host
 * memory as the daemon's pool is for CUDA stages. Integer frames are
 * queued on the stage's stream without a wait, so the rate is taken over
 * process of every frame plus end (its publish waits for the stream):
 * only then is the work done. One untimed pass of 64 frames first (CUDA
 * loads kernels lazily), then the case is timed --reps times (default 3)
 * on a restarted series and the median is printed, with the slowest and
 * fastest, the enqueue time alone (process calls) and the input rate in
 * GB/s; pairs are counted by the bench's own model of the level counters
 * (count_pairs, checked against the CPU backend's counters in CPU runs).
 * Without a device it prints "skipped: no GPU (<reason>)" and exits 0. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/config.h"
#include "gpu/gpu.h"
#include "bench/bench_stage.h"
#include "pipeline/emit_int.h"
#include "pipeline/kern/xpcs_multitau.h"
#include "pipeline/fjpool.h"
#include "pipeline/stage.h"




static double load1(void) {
  double l = -1;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &l) != 1)
      l = -1;
    fclose(f);
  }
  return l;
}

static uint64_t rng_next(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

static int use_cuda; /* --backend cuda */
static int cuda_reps = 3;

/* Frame pairs the stage counts for n good frames: the level counters of
 * xpcs_multitau.h (a level-L frame completes when two level-(L-1) frames
 * did; each new frame pairs with the older slots of its level, lags
 * imin..imax-1). The CUDA backend keeps these counters on the host but
 * in its private state, which this C program cannot see. */
static uint64_t count_pairs(unsigned levels, unsigned nb, uint64_t n) {
  uint64_t nlev[64] = {0}, pairs = 0;
  if (levels > 64)
    return 0;
  for (uint64_t f = 0; f < n; f++) {
    for (unsigned L = 0; L < levels; L++) {
      if (L > 0 && nlev[L - 1] % 2 != 0)
        break;
      uint64_t m = ++nlev[L];
      uint64_t imin = L ? nb / 2 : 0, imax = m < nb ? m : nb;
      pairs += imax > imin ? imax - imin : 0;
    }
  }
  return pairs;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The timed part on the CUDA backend (see the top of the file). */
static int run_cuda(beam_stage_t *st, beam_emit_t *e, beam_frame_t *f, int bank, const beam_series_t *series,
                    const beam_indesc_t *in, const char *name, uint32_t H, uint32_t W, int levels, int nb,
                    int nframes, const char *norm) {
  beam_diag_t d = {0};
  beam_xpcs_rois_t rois;
  memset(&rois, 0, sizeof rois);
  if (beam_xpcs_rois_init(&rois, beam_cfg_get(st->cfg, "rois"), "bench", &d) < 0 ||
      beam_xpcs_rois_start(&rois, H, W, series, "bench", &d) < 0) {
    fprintf(stderr, "xpcs_multitau: rois: %s\n", d.msg);
    beam_xpcs_rois_free(&rois);
    return -1;
  }
  size_t R = rois.nroi, P = rois.total;
  beam_xpcs_rois_free(&rois);
  double t[16], tq[16], tp[16], la = load1();
  for (int r = -1; r < cuda_reps; r++) {
    int n = r < 0 ? (nframes < 64 ? nframes : 64) : nframes;
    if (r >= 0 && st->ops->start(st, series, in, &d) < 0) {
      fprintf(stderr, "xpcs_multitau: start (cuda): %s\n", d.msg);
      return -1;
    }
    double t0 = bench_now_s();
    for (int i = 0; i < n; i++) {
      f[i % bank].frame_id = (uint64_t)i;
      if (st->ops->process(st, &f[i % bank], e) < 0) {
        fprintf(stderr, "xpcs_multitau: process (cuda): %s\n", st->diag.msg);
        return -1;
      }
    }
    double t1 = bench_now_s();
    if (st->ops->end(st, e) < 0) {
      fprintf(stderr, "xpcs_multitau: end (cuda): %s\n", st->diag.msg);
      return -1;
    }
    double t2 = bench_now_s();
    if (r >= 0)
      t[r] = t2 - t0, tq[r] = t1 - t0, tp[r] = t2 - t1;
  }
  double ts[16];
  memcpy(ts, t, sizeof ts);
  qsort(ts, (size_t)cuda_reps, sizeof *ts, cmp_double);
  int m = 0;
  while (t[m] != ts[cuda_reps / 2])
    m++;
  double sec = t[m], pairs = (double)count_pairs((unsigned)levels, (unsigned)nb, (uint64_t)nframes);
  double gbs = (double)nframes * H * W * sizeof(uint16_t) / sec * 1e-9;
  printf("%-4s %-9s %4ux%-4u rois %2zu levels %d buffers %2d pixels %7zu backend=cuda: %8.1f frames/s "
         "(median of %d, %.1f..%.1f), %6.3f ms/frame, enqueue %6.3f ms/frame, %.2f pairs/frame, "
         "%.3f ns per ROI pixel per frame pair, input %.2f GB/s; publish %.1f ms; load %.2f\n",
         name, norm, H, W, R, levels, nb, P, nframes / sec, cuda_reps, nframes / ts[cuda_reps - 1],
         nframes / ts[0], 1e3 * sec / nframes, 1e3 * tq[m] / nframes, pairs / nframes,
         1e9 * sec / (pairs * (double)P), gbs, 1e3 * tp[m], la);
  printf("json: {\"case\":\"%s\",\"backend\":\"cuda\",\"normalization\":\"%s\",\"h\":%u,\"w\":%u,"
         "\"rois\":%zu,\"levels\":%d,\"buffers\":%d,\"pixels\":%zu,\"frames\":%d,\"reps\":%d,"
         "\"fps\":%.2f,\"fps_min\":%.2f,\"fps_max\":%.2f,\"ms_per_frame\":%.4f,\"enqueue_ms_per_frame\":%.4f,"
         "\"pairs_per_frame\":%.3f,\"ns_per_pixel_pair\":%.4f,\"input_gb_s\":%.3f,\"publish_ms\":%.3f,"
         "\"load1\":%.2f}\n",
         name, norm, H, W, R, levels, nb, P, nframes, cuda_reps, nframes / sec, nframes / ts[cuda_reps - 1],
         nframes / ts[0], 1e3 * sec / nframes, 1e3 * tq[m] / nframes, pairs / nframes,
         1e9 * sec / (pairs * (double)P), gbs, 1e3 * tp[m], la);
  fflush(stdout);
  return 0;
}

static int run(const char *name, uint32_t H, uint32_t W, int rings, int levels, int nb, int nframes,
               const char *norm, int threads) {
  char yaml[512];
  double rmax = hypot(H / 2.0, W / 2.0) + 1;
  /* rings from the centre to beyond the corners: every pixel in an ROI */
  int n = snprintf(yaml, sizeof yaml,
                   "{name: b, kind: xpcs_multitau, levels: %d, buffers: %d, publish_every: 0, "
                   "normalization: %s, threads: %d, rois: {center: [%.1f, %.1f], radii: [",
                   levels, nb, norm, threads, (W - 1) / 2.0, (H - 1) / 2.0);
  for (int k = 0; k <= rings; k++)
    n += snprintf(yaml + n, sizeof yaml - (size_t)n, "%s%.3f", k ? ", " : "",
                  k == 0 ? 0.0 : k == 1 ? 1.0 : rmax * k / rings);
  snprintf(yaml + n, sizeof yaml - (size_t)n, "]}}");
  beam_cfg_errs_t errs = {0};
  beam_cnode_t *cfg = beam_yaml_parse(yaml, strlen(yaml), "<bench>", &errs);
  const beam_stage_kind_t *k = beam_stage_kind_find("xpcs_multitau");
  if (!cfg || !k || beam_cfg_validate(cfg, k->params, "bench", &errs) > 0) {
    fprintf(stderr, "xpcs_multitau: bad config %s: %s\n", yaml, errs.n ? errs.msgs[0] : "");
    return -1;
  }
  beam_cfg_errs_free(&errs);
  beam_stage_t st;
  memset(&st, 0, sizeof st);
  st.ops = use_cuda ? k->cuda : k->cpu;
  st.cfg = cfg;
  snprintf(st.name, sizeof st.name, "b");
  beam_diag_t d = {0};
  uint32_t shape[2] = {H, W};
  beam_series_t *series = beam_series_new(1, BEAM_DT_U16, 2, shape, NULL, 0);
  beam_indesc_t in = {BEAM_DT_U16, 2, {H, W, 0, 0}};
  if (st.ops->init(&st, &d) < 0 || st.ops->start(&st, series, &in, &d) < 0) {
    fprintf(stderr, "xpcs_multitau: %s\n", d.msg);
    st.ops->destroy(&st);
    return -1;
  }
  bench_emitter_t em;
  if (bench_emitter_init(&em, &st) < 0) {
    fprintf(stderr, "xpcs_multitau: out of memory for the outputs\n");
    st.ops->destroy(&st);
    return -1;
  }
  beam_emit_t e = bench_emit(&em);
  enum { BANK = 16 };
  beam_frame_t f[BANK];
  uint64_t seed = 42;
  for (int b = 0; b < BANK; b++) {
    memset(&f[b], 0, sizeof f[b]);
    f[b].dtype = BEAM_DT_U16, f[b].ndim = 2, f[b].shape[0] = H, f[b].shape[1] = W;
    f[b].nbytes = f[b].cap = (size_t)H * W * 2;
    f[b].data = use_cuda ? beam_host_alloc(f[b].nbytes, 1) : malloc(f[b].nbytes);
    if (!f[b].data) {
      fprintf(stderr, "xpcs_multitau: out of memory for the frame bank\n");
      return -1;
    }
    uint16_t *v = f[b].data;
    for (size_t p = 0; p < (size_t)H * W; p++) /* ~Poisson(20): sum of 40 Bernoulli(1/2) */
      v[p] = (uint16_t)__builtin_popcountll(rng_next(&seed) << 31 ^ rng_next(&seed)) % 41;
  }
  if (use_cuda) {
    int rc = run_cuda(&st, &e, f, BANK, series, &in, name, H, W, levels, nb, nframes, norm);
    st.ops->destroy(&st);
    for (int b = 0; b < BANK; b++)
      beam_host_free(f[b].data, 1);
    bench_emitter_free(&em);
    beam_series_unref(&series);
    beam_cnode_free(cfg);
    return rc;
  }
  double la = load1();
  double t0 = bench_now_s(), c0 = bench_cpu_s();
  for (int i = 0; i < nframes; i++) {
    f[i % BANK].frame_id = (uint64_t)i;
    if (st.ops->process(&st, &f[i % BANK], &e) < 0) {
      fprintf(stderr, "xpcs_multitau: process: %s\n", st.diag.msg);
      return -1;
    }
  }
  double t1 = bench_now_s(), c1 = bench_cpu_s();
  st.ops->end(&st, &e);
  double t2 = bench_now_s();
  beam_xmt_t *x = st.priv;
  uint64_t pairs = 0;
  for (size_t t = 0; t < x->nlags; t++)
    pairs += x->npairs[t];
  if (pairs != count_pairs((unsigned)levels, (unsigned)nb, (uint64_t)nframes))
    fprintf(stderr, "xpcs_multitau: count_pairs gives %llu pairs, the stage counted %llu: fix count_pairs\n",
            (unsigned long long)count_pairs((unsigned)levels, (unsigned)nb, (uint64_t)nframes),
            (unsigned long long)pairs);
  double sec = t1 - t0;
  printf("%-4s %-9s %4ux%-4u rois %2zu levels %d buffers %2d pixels %7zu threads %d: %8.1f frames/s, "
         "%6.3f ms/frame, cpu %6.3f ms/frame, %.2f pairs/frame, %.3f ns per ROI pixel per frame pair; "
         "publish %.1f ms; load %.2f\n",
         name, norm, H, W, x->R, levels, nb, x->P, threads, nframes / sec, 1e3 * sec / nframes,
         1e3 * (c1 - c0) / nframes, (double)pairs / nframes, 1e9 * sec / ((double)pairs * (double)x->P),
         1e3 * (t2 - t1), la);
  printf("json: {\"case\":\"%s\",\"normalization\":\"%s\",\"h\":%u,\"w\":%u,\"rois\":%zu,"
         "\"levels\":%d,\"buffers\":%d,\"pixels\":%zu,\"threads\":%d,\"frames\":%d,\"fps\":%.2f,"
         "\"ms_per_frame\":%.4f,\"cpu_ms_per_frame\":%.4f,\"pairs_per_frame\":%.3f,"
         "\"ns_per_pixel_pair\":%.4f,\"publish_ms\":%.3f,\"load1\":%.2f}\n",
         name, norm, H, W, x->R, levels, nb, x->P, threads, nframes, nframes / sec, 1e3 * sec / nframes,
         1e3 * (c1 - c0) / nframes, (double)pairs / nframes, 1e9 * sec / ((double)pairs * (double)x->P),
         1e3 * (t2 - t1), la);
  fflush(stdout);
  st.ops->destroy(&st);
  for (int b = 0; b < BANK; b++)
    free(f[b].data);
  bench_emitter_free(&em);
  beam_series_unref(&series);
  beam_cnode_free(cfg);
  return 0;
}

/* A rendezvous: each task waits until every task of the run has started,
 * so a phase cannot complete on the caller alone (which claims tasks too)
 * and the time is the helpers' wake-up, claim and join. */
static void meet(void *ctx, unsigned k) {
  _Atomic unsigned *arrived = ctx;
  (void)k;
  atomic_fetch_add(arrived, 1);
  while (atomic_load(arrived) < 2)
    ;
}

/* Empty phases through the pool: the handoff cost alone. */
static int handoff(int threads, int n) {
  beam_fjpool_t *p;
  beam_diag_t d = {0};
  if (beam_fjpool_new(&p, (unsigned)threads, "bench", &d) < 0) {
    fprintf(stderr, "%s\n", d.msg);
    return -1;
  }
  double la = load1(), t0 = bench_now_s(), c0 = bench_cpu_s();
  _Atomic unsigned arrived;
  for (int i = 0; i < n; i++) {
    atomic_store(&arrived, 0);
    beam_fjpool_run(p, 2, meet, &arrived);
  }
  double t1 = bench_now_s(), c1 = bench_cpu_s();
  /* the same after 1 ms idle: the helper has gone to sleep (futex) */
  double slept = 0;
  int ns = n / 20;
  for (int i = 0; i < ns; i++) {
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
    double a = bench_now_s();
    atomic_store(&arrived, 0);
    beam_fjpool_run(p, 2, meet, &arrived);
    slept += bench_now_s() - a;
  }
  beam_fjpool_destroy(&p);
  printf("pool handoff, threads %d: %.2f us per phase of 2 tasks that wait for each other, back to back "
         "(%.2f us cpu); %.2f us after 1 ms idle (helper asleep); load %.2f\n",
         threads, 1e6 * (t1 - t0) / n, 1e6 * (c1 - c0) / n, 1e6 * slept / ns, la);
  printf("json: {\"case\":\"handoff\",\"threads\":%d,\"phases\":%d,\"us_per_phase\":%.3f,"
         "\"cpu_us_per_phase\":%.3f,\"us_after_idle\":%.3f,\"load1\":%.2f}\n",
         threads, n, 1e6 * (t1 - t0) / n, 1e6 * (c1 - c0) / n, 1e6 * slept / ns, la);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  /* --backend/--cuda/--reps may come anywhere; the rest is positional */
  int na = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--cuda") == 0)
      use_cuda = 1;
    else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc &&
             (strcmp(argv[i + 1], "cpu") == 0 || strcmp(argv[i + 1], "cuda") == 0))
      use_cuda = strcmp(argv[++i], "cuda") == 0;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 && atoi(argv[i + 1]) <= 16)
      cuda_reps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--backend") == 0 || strcmp(argv[i], "--reps") == 0) {
      fprintf(stderr, "usage: xpcs_multitau [--backend cpu|cuda] [--reps 1..16] [--quick | --big N [THREADS]]\n");
      return 2;
    } else
      argv[na++] = argv[i];
  }
  argc = na;
  if (use_cuda) {
    char why[256] = "", dev[256];
    if (beam_gpu_count(why, sizeof why) == 0) {
      printf("skipped: no GPU (%s)\n", why);
      return 0;
    }
    beam_gpu_describe(dev, sizeof dev);
    printf("xpcs_multitau stage, CUDA backend on %s; frames from pinned host memory; rate over process + end\n",
           dev);
  }
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && strcmp(argv[1], "--big") == 0) /* for perf: the big case alone */
    return run("big", 1000, 1000, 16, 8, 8, argc > 2 ? atoi(argv[2]) : 1000, "roi", argc > 3 ? atoi(argv[3]) : 1)
               ? 1
               : 0;
  if (use_cuda) { /* threads do not apply: each case once */
    int rc = run("big", 1000, 1000, 16, 8, 8, quick ? 100 : 1000, "roi", 1);
    rc |= run("skb", 128, 128, 8, 7, 16, 1000, "roi", 1);
    rc |= run("skb", 128, 128, 8, 7, 16, 1000, "per_pixel", 1);
    rc |= run("big", 1000, 1000, 16, 8, 8, quick ? 100 : 1000, "per_pixel", 1);
    return rc ? 1 : 0;
  }
  int rc = handoff(2, 20000);
  for (int th = 1; th <= 2; th++) {
    rc |= run("big", 1000, 1000, 16, 8, 8, quick ? 100 : 1000, "roi", th);
    rc |= run("skb", 128, 128, 8, 7, 16, 1000, "roi", th);
    rc |= run("skb", 128, 128, 8, 7, 16, 1000, "per_pixel", th);
    if (!quick)
      rc |= run("big", 1000, 1000, 16, 8, 8, 300, "per_pixel", th);
  }
  return rc ? 1 : 0;
}
