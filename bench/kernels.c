/* kernels: per-frame time of the CPU stage kernels, driven through their
 * stage ops exactly as the graph drives them (init, start, process), but
 * with a private emitter so no pool, queue or thread is involved. memcpy of
 * the same bytes is measured beside them as the memory-bandwidth yardstick.
 *
 * Stage configs are YAML text parsed with beam_yaml_parse and validated with
 * the kind's own schema, so defaults are filled in as in the daemon.
 *
 * Input frames rotate through a bank of at least BANK_BYTES, larger than the
 * last-level cache, so every frame is read from memory as it would be after
 * arriving from the network on a busy node ("cold" figures).
 *
 *   kernels [--runs N] [--min-ms MS] [--json FILE] [--sizes 512,2048]
 *
 * Prints a table; --json writes the same figures for bench/run.py. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/config.h"
#include "bench/bench_stage.h"
#include "pipeline/emit_int.h"
#include "pipeline/stage.h"

#define BANK_BYTES (96u << 20)
#define MAX_RUNS 101
#define MAX_SIZES 8

typedef struct result_s {
  char name[48];
  uint32_t h, w;
  double ns_med, ns_min, ns_max;
  double in_bytes;
  int runs;
} result_t;

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct bench_s {
  int runs;
  double min_ms;
} bench_t;

/* Times fn over the frame bank; returns 0 and fills r. */
typedef int (*step_fn)(void *ctx, const beam_frame_t *in);

static void measure(const bench_t *b, step_fn fn, void *ctx, beam_frame_t *bank, size_t nbank,
                    result_t *r) {
  /* Calibrate: enough frames per run for min_ms, at least one pass. */
  uint64_t t0 = bench_now_ns();
  for (size_t i = 0; i < nbank; i++)
    fn(ctx, &bank[i]);
  double per = (double)(bench_now_ns() - t0) / (double)nbank;
  size_t iters = (size_t)(b->min_ms * 1e6 / (per > 1 ? per : 1)) + 1;
  if (iters < nbank)
    iters = nbank;
  double v[MAX_RUNS];
  for (int k = 0; k < b->runs; k++) {
    uint64_t a = bench_now_ns();
    for (size_t i = 0; i < iters; i++)
      fn(ctx, &bank[i % nbank]);
    v[k] = (double)(bench_now_ns() - a) / (double)iters;
  }
  qsort(v, (size_t)b->runs, sizeof v[0], cmp_d);
  r->ns_med = v[b->runs / 2];
  r->ns_min = v[0];
  r->ns_max = v[b->runs - 1];
  r->runs = b->runs;
}

/* ---- stage driving ---------------------------------------------------------- */

typedef struct stage_run_s {
  beam_stage_t st;
  beam_cnode_t *cfg;
  bench_emitter_t em;
  beam_emit_t e;
  beam_series_t *series;
  int inited;
} stage_run_t;

static void stage_run_free(stage_run_t *s) {
  if (s->inited && s->st.ops->destroy)
    s->st.ops->destroy(&s->st);
  bench_emitter_free(&s->em);
  beam_cnode_free(s->cfg);
  beam_series_unref(&s->series);
  memset(s, 0, sizeof *s);
}

static int stage_run_setup(stage_run_t *s, const char *yaml, beam_dtype_t dt, uint32_t h,
                           uint32_t w) {
  memset(s, 0, sizeof *s);
  beam_cfg_errs_t errs = {0};
  s->cfg = beam_yaml_parse(yaml, strlen(yaml), "<bench>", &errs);
  const char *kind = s->cfg ? beam_cfg_str(s->cfg, "kind") : NULL;
  const beam_stage_kind_t *k = kind ? beam_stage_kind_find(kind) : NULL;
  if (!k) {
    fprintf(stderr, "kernels: cannot build stage from \"%s\"%s%s\n", yaml,
            errs.n ? ": " : "", errs.n ? errs.msgs[0] : "");
    beam_cfg_errs_free(&errs);
    stage_run_free(s);
    return -1;
  }
  if (beam_cfg_validate(s->cfg, k->params, "bench stage", &errs) > 0) {
    for (size_t i = 0; i < errs.n; i++)
      fprintf(stderr, "%s\n", errs.msgs[i]);
    beam_cfg_errs_free(&errs);
    stage_run_free(s);
    return -1;
  }
  beam_cfg_errs_free(&errs);
  s->st.ops = k->cpu;
  s->st.cfg = s->cfg;
  snprintf(s->st.name, sizeof s->st.name, "%s", beam_cfg_str(s->cfg, "name"));
  beam_diag_t d = {0};
  if (s->st.ops->init(&s->st, &d) < 0) {
    fprintf(stderr, "kernels: %s init: %s\n", kind, d.msg);
    stage_run_free(s);
    return -1;
  }
  s->inited = 1;
  uint32_t shape[2] = {h, w};
  s->series = beam_series_new(1, dt, 2, shape, NULL, 0);
  beam_indesc_t in = {dt, 2, {h, w, 0, 0}};
  if (!s->series || s->st.ops->start(&s->st, s->series, &in, &d) < 0) {
    fprintf(stderr, "kernels: %s start: %s\n", kind, s->series ? d.msg : "out of memory");
    stage_run_free(s);
    return -1;
  }
  if (bench_emitter_init(&s->em, &s->st) < 0) {
    stage_run_free(s);
    return -1;
  }
  s->e = bench_emit(&s->em);
  return 0;
}

static int stage_step(void *ctx, const beam_frame_t *in) {
  stage_run_t *s = ctx;
  s->em.in = in;
  int rc = s->st.ops->process(&s->st, in, &s->e);
  if (rc < 0) {
    fprintf(stderr, "kernels: %s process: %s\n", s->st.name, s->st.diag.msg);
    exit(1);
  }
  return rc;
}

typedef struct copy_ctx_s {
  void *dst;
} copy_ctx_t;

static int copy_step(void *ctx, const beam_frame_t *in) {
  memcpy(((copy_ctx_t *)ctx)->dst, in->data, in->nbytes);
  return 0;
}

/* ---- frame banks --------------------------------------------------------------- */

static beam_frame_t *bank_new(beam_dtype_t dt, uint32_t h, uint32_t w, size_t *nbank) {
  size_t npix = (size_t)h * w, nb = npix * beam_dtype_size(dt);
  size_t n = BANK_BYTES / nb;
  if (n < 2)
    n = 2;
  beam_frame_t *b = calloc(n, sizeof *b);
  if (!b)
    return NULL;
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    b[i].data = aligned_alloc(64, (nb + 63) & ~(size_t)63);
    if (!b[i].data) {
      for (size_t j = 0; j < i; j++)
        free(b[j].data);
      free(b);
      return NULL;
    }
    for (size_t p = 0; p < npix; p++) {
      x = x * 1664525u + 1013904223u;
      uint16_t v = (uint16_t)((x >> 24) & 0x3f);
      if (dt == BEAM_DT_U16)
        ((uint16_t *)b[i].data)[p] = v;
      else
        ((float *)b[i].data)[p] = (float)v;
    }
    b[i].series_id = 1;
    b[i].frame_id = i;
    b[i].dtype = dt;
    b[i].ndim = 2;
    b[i].shape[0] = h;
    b[i].shape[1] = w;
    b[i].nbytes = b[i].cap = nb;
  }
  *nbank = n;
  return b;
}

static void bank_free(beam_frame_t *b, size_t n) {
  for (size_t i = 0; b && i < n; i++)
    free(b[i].data);
  free(b);
}

/* ---- cases ----------------------------------------------------------------------- */

typedef struct kcase_s {
  const char *label;
  beam_dtype_t dtype;
  const char *yaml_fmt; /* %u = width, for geometry that scales with the frame */
} kcase_t;

/* Three STEM-like virtual detectors (bright field, ADF, HAADF) that together
 * cover pi/4 of the frame: the typical roi_sum load. */
#define ROIS                                                                       \
  "rois: [{name: bf, shape: disk, radius: %u}, "                                   \
  "{name: adf, shape: annulus, radii: [%u, %u]}, "                                 \
  "{name: haadf, shape: annulus, radii: [%u, %u]}]"

static const kcase_t cases[] = {
    {"correct", BEAM_DT_U16,
     "{name: k, kind: correct, backend: cpu, threshold: 0.5, saturation: 60000}"},
    {"roi_sum", BEAM_DT_U16, "{name: k, kind: roi_sum, backend: cpu, " ROIS "}"},
    {"roi_sum(f32)", BEAM_DT_F32, "{name: k, kind: roi_sum, backend: cpu, " ROIS "}"},
    {"bin2", BEAM_DT_U16, "{name: k, kind: bin, backend: cpu, factor: 2, mode: sum}"},
    {"bin4", BEAM_DT_U16, "{name: k, kind: bin, backend: cpu, factor: 4, mode: mean}"},
};

static int run_size(const bench_t *b, uint32_t sz, result_t *res, size_t *nres, size_t cap) {
  size_t nb16 = 0, nb32 = 0;
  beam_frame_t *bank16 = bank_new(BEAM_DT_U16, sz, sz, &nb16);
  beam_frame_t *bank32 = bank_new(BEAM_DT_F32, sz, sz, &nb32);
  if (!bank16 || !bank32) {
    fprintf(stderr, "kernels: cannot allocate frame banks\n");
    bank_free(bank16, nb16);
    bank_free(bank32, nb32);
    return -1;
  }
  int rc = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0] && *nres < cap; c++) {
    char yaml[512];
    unsigned q = sz / 8;
    snprintf(yaml, sizeof yaml, cases[c].yaml_fmt, q, q, 2 * q, 2 * q, 4 * q);
    stage_run_t s;
    beam_frame_t *bank = cases[c].dtype == BEAM_DT_U16 ? bank16 : bank32;
    size_t nbank = cases[c].dtype == BEAM_DT_U16 ? nb16 : nb32;
    if (stage_run_setup(&s, yaml, cases[c].dtype, sz, sz) < 0) {
      rc = -1;
      continue;
    }
    result_t *r = &res[(*nres)++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", cases[c].label);
    r->h = r->w = sz;
    r->in_bytes = (double)bank[0].nbytes;
    measure(b, stage_step, &s, bank, nbank, r);
    if (s.em.puts == 0) {
      fprintf(stderr, "kernels: %s emitted nothing\n", cases[c].label);
      rc = -1;
    }
    stage_run_free(&s);
  }
  if (*nres < cap) {
    copy_ctx_t cc = {aligned_alloc(64, bank16[0].nbytes)};
    if (cc.dst) {
      result_t *r = &res[(*nres)++];
      memset(r, 0, sizeof *r);
      snprintf(r->name, sizeof r->name, "memcpy");
      r->h = r->w = sz;
      r->in_bytes = (double)bank16[0].nbytes;
      measure(b, copy_step, &cc, bank16, nb16, r);
      free(cc.dst);
    }
  }
  bank_free(bank16, nb16);
  bank_free(bank32, nb32);
  return rc;
}

int main(int argc, char **argv) {
  bench_t b = {.runs = 7, .min_ms = 100};
  const char *json = NULL;
  uint32_t sizes[MAX_SIZES] = {512, 2048};
  size_t nsizes = 2;
  static const struct option lo[] = {{"runs", required_argument, 0, 'r'},
                                     {"min-ms", required_argument, 0, 'm'},
                                     {"json", required_argument, 0, 'j'},
                                     {"sizes", required_argument, 0, 's'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "r:m:j:s:h", lo, NULL)) != -1) {
    char *end;
    switch (c) {
    case 'r':
      b.runs = (int)strtol(optarg, &end, 10);
      if (*end || b.runs < 1 || b.runs > MAX_RUNS) {
        fprintf(stderr, "kernels: --runs must be 1..%d\n", MAX_RUNS);
        return 2;
      }
      break;
    case 'm':
      b.min_ms = strtod(optarg, &end);
      if (*end || !(b.min_ms > 0 && b.min_ms <= 60000)) {
        fprintf(stderr, "kernels: --min-ms must be in (0, 60000]\n");
        return 2;
      }
      break;
    case 'j': json = optarg; break;
    case 's': {
      nsizes = 0;
      for (char *p = optarg; *p && nsizes < MAX_SIZES;) {
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v < 16 || v > 16384 || (*end && *end != ',')) {
          fprintf(stderr, "kernels: --sizes takes a comma list of 16..16384, got \"%s\"\n", optarg);
          return 2;
        }
        sizes[nsizes++] = (uint32_t)v;
        p = *end ? end + 1 : end;
      }
      break;
    }
    case 'h':
      printf("usage: kernels [--runs N] [--min-ms MS] [--json FILE] [--sizes 512,2048]\n");
      return 0;
    default: return 2;
    }
  }
  result_t res[64];
  size_t nres = 0;
  int rc = 0;
  for (size_t i = 0; i < nsizes; i++)
    if (run_size(&b, sizes[i], res, &nres, sizeof res / sizeof res[0]) < 0)
      rc = 1;
  printf("%-14s %-10s %12s %10s %12s   (median of %d runs, input GB/s, cold frames)\n", "kernel",
         "frame", "ns/frame", "GB/s", "frames/s", b.runs);
  for (size_t i = 0; i < nres; i++) {
    const result_t *r = &res[i];
    char fr[32];
    snprintf(fr, sizeof fr, "%ux%u", r->h, r->w);
    printf("%-14s %-10s %12.0f %10.2f %12.0f\n", r->name, fr, r->ns_med, r->in_bytes / r->ns_med,
           1e9 / r->ns_med);
  }
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) {
      perror(json);
      return 1;
    }
    fprintf(f, "{\"runs\":%d,\"min_ms\":%g,\"bank_bytes\":%u,\"results\":[", b.runs, b.min_ms,
            BANK_BYTES);
    for (size_t i = 0; i < nres; i++) {
      const result_t *r = &res[i];
      fprintf(f,
              "%s{\"kernel\":\"%s\",\"h\":%u,\"w\":%u,\"in_bytes\":%.0f,\"ns_per_frame\":%.1f,"
              "\"ns_min\":%.1f,\"ns_max\":%.1f,\"gbps\":%.4f,\"fps\":%.1f}",
              i ? "," : "", r->name, r->h, r->w, r->in_bytes, r->ns_med, r->ns_min, r->ns_max,
              r->in_bytes / r->ns_med, 1e9 / r->ns_med);
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) {
      perror(json);
      return 1;
    }
  }
  return rc;
}
