/* dectris_parse: per-message cost of the DECTRIS decoders, beam_dx1_parse
 * (SIMPLON stream v1, JSON multipart) and beam_dx2_parse (stream v2,
 * CBOR), on the image and start messages of EIGER 4M (2167 x 2070) and
 * EIGER2 16M (4362 x 4148) uint16 bslz4 frames, as bench/dectris_send.c
 * sends them (bench/dectris_bench.h).
 *
 *   dectris_parse [--runs N] [--min-ms MS] [--shapes 4m,16m] [--json FILE]
 *
 * Each message is parsed in a loop of enough calls for MS milliseconds
 * (default 20); the figure is the median over N runs (default 21) of the
 * time per call, with the min and max beside it. The decoders read the
 * blob's 12-byte framing header, never its body, so the cost does not grow
 * with the frame: what it shows is the per-message overhead on beamd's
 * loop thread. Start messages: header_detail basic (dheader + config /
 * the start map) and all (plus flatfield, pixel mask and count-rate table:
 * three more parts in v1, 145 MB of byte strings inside the one v2 map
 * for the 16M). Every message is checked once (kind, id, shape) before it
 * is timed. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/dectris_bench.h"
#include "proto/dectris.h"

#define MAX_RUNS 201
#define MAX_SHAPES 4

typedef struct res_s {
  char shape[16], msg[24];
  int version;
  size_t bytes;
  unsigned nparts;
  double ns_med, ns_min, ns_max;
} res_t;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static beam_dx_msg_t g_msg; /* large: off the stack */

static int parse_once(int version, const beam_part_t *parts, size_t n, const char **why) {
  return version == 1 ? beam_dx1_parse(parts, n, &g_msg, why)
                      : beam_dx2_parse(parts[0].data, parts[0].size, &g_msg, why);
}

static int measure(int version, const beam_part_t *parts, size_t n, int runs, double min_ms,
                   res_t *r) {
  const char *why = NULL;
  uint64_t t0 = now_ns();
  size_t calib = 0;
  do {
    if (parse_once(version, parts, n, &why) < 0) {
      fprintf(stderr, "dectris_parse: %s: %s\n", r->msg, why ? why : "?");
      return -1;
    }
    calib++;
  } while (now_ns() - t0 < 2000000u); /* 2 ms */
  double per = (double)(now_ns() - t0) / (double)calib;
  size_t iters = (size_t)(min_ms * 1e6 / per) + 1;
  double v[MAX_RUNS];
  for (int k = 0; k < runs; k++) {
    uint64_t a = now_ns();
    for (size_t i = 0; i < iters; i++)
      parse_once(version, parts, n, &why);
    v[k] = (double)(now_ns() - a) / (double)iters;
  }
  qsort(v, (size_t)runs, sizeof v[0], cmp_d);
  r->version = version;
  r->nparts = (unsigned)n;
  r->bytes = 0;
  for (size_t i = 0; i < n; i++)
    r->bytes += parts[i].size;
  r->ns_med = v[runs / 2];
  r->ns_min = v[0];
  r->ns_max = v[runs - 1];
  return 0;
}

/* What a parsed message must hold: kind, image id and geometry. */
static int check(int version, const beam_part_t *parts, size_t n, beam_dx_kind_t kind,
                 uint32_t h, uint32_t w, uint64_t id, const char *what) {
  const char *why = NULL;
  int rc = parse_once(version, parts, n, &why);
  const char *bad = rc < 0 ? (why ? why : "rejected") : NULL;
  if (!bad && g_msg.kind != kind)
    bad = "wrong kind";
  if (!bad && kind == BEAM_DX_IMAGE) {
    const beam_dx_array_t *a = &g_msg.image.data[0];
    if (g_msg.image.image_id != id || a->shape[0] != h || a->shape[1] != w ||
        a->codec != BEAM_CODEC_BSLZ4 || a->raw_size != (uint64_t)h * w * 2)
      bad = "image id, shape or codec differ";
  }
  if (!bad && kind == BEAM_DX_START &&
      (g_msg.start.height != h || g_msg.start.width != w || g_msg.start.dtype != BEAM_DT_U16))
    bad = "start geometry differs";
  if (bad)
    fprintf(stderr, "dectris_parse: v%d %s: %s\n", version, what, bad);
  return bad ? -1 : 0;
}

static int run_shape(const char *name, int runs, double min_ms, res_t *out, int *nout) {
  uint32_t h, w;
  if (dxb_parse_shape(name, &h, &w) < 0) {
    fprintf(stderr, "dectris_parse: bad shape \"%s\"\n", name);
    return -1;
  }
  dxb_bank_t bank;
  if (dxb_bank_make(&bank, h, w, 1.0, 1) < 0) {
    fprintf(stderr, "dectris_parse: cannot encode a %ux%u frame\n", h, w);
    return -1;
  }
  const size_t npix = (size_t)h * w;
  float *flat = malloc(npix * 4);
  uint32_t *mask = calloc(npix, 4);
  uint32_t *lut = malloc(4096 * 4);
  float *crt = malloc(2 * 4000 * 4);
  int rc = flat && mask && lut && crt ? 0 : -1;
  for (size_t i = 0; rc == 0 && i < npix; i++)
    flat[i] = 1.0f + 0.001f * (float)(i % 8u);
  for (unsigned i = 0; rc == 0 && i < 4096; i++)
    lut[i] = i;
  for (unsigned i = 0; rc == 0 && i < 8000; i++)
    crt[i] = (float)i;
  const uint64_t series = 42, frame = 123456;
  /* v1 image */
  char p1[192], p2[160], p4[160];
  dxb_v1_dimage(p1, sizeof p1, series, frame, bank.hash[0]);
  dxb_v1_dimage_d(p2, sizeof p2, h, w, bank.len[0]);
  dxb_v1_dconfig(p4, sizeof p4, frame);
  beam_part_t v1i[4] = {{p1, strlen(p1), NULL}, {p2, strlen(p2), NULL},
                        {bank.blob[0], bank.len[0], NULL}, {p4, strlen(p4), NULL}};
  /* v1 start, basic and all */
  char *hb = dxb_v1_dheader(series, "basic"), *ha = dxb_v1_dheader(series, "all");
  char *cfg = dxb_v1_config(h, w, 1000, 0.001);
  char jf[160], jm[160], jc[160];
  dxb_v1_array_headers(h, w, jf, jm, jc);
  if (!hb || !ha || !cfg)
    rc = -1;
  beam_part_t v1s[8];
  if (rc == 0) {
    beam_part_t t[8] = {{ha, strlen(ha), NULL}, {cfg, strlen(cfg), NULL},
                        {jf, strlen(jf), NULL}, {flat, npix * 4, NULL},
                        {jm, strlen(jm), NULL}, {mask, npix * 4, NULL},
                        {jc, strlen(jc), NULL}, {crt, 8000 * 4, NULL}};
    memcpy(v1s, t, sizeof t);
  }
  beam_part_t v1b[2] = {{hb, hb ? strlen(hb) : 0, NULL}, {cfg, cfg ? strlen(cfg) : 0, NULL}};
  /* v2 */
  dxb_cbor_t im = {0}, sb = {0}, sa = {0};
  dxb_v2_image(&im, series, frame, h, w, bank.blob[0], bank.len[0], NULL, NULL);
  dxb_v2_start(&sb, series, h, w, 1000, 0.001, NULL, NULL, NULL);
  if (rc == 0)
    dxb_v2_start(&sa, series, h, w, 1000, 0.001, flat, mask, lut);
  if (im.oom || sb.oom || sa.oom)
    rc = -1;
  beam_part_t v2i = {im.buf, im.len, NULL}, v2b = {sb.buf, sb.len, NULL},
              v2a = {sa.buf, sa.len, NULL};
  struct {
    const char *msg;
    int version;
    const beam_part_t *parts;
    size_t n;
    beam_dx_kind_t kind;
  } cases[] = {
      {"image", 1, v1i, 4, BEAM_DX_IMAGE},         {"start (basic)", 1, v1b, 2, BEAM_DX_START},
      {"start (all)", 1, v1s, 8, BEAM_DX_START},   {"image", 2, &v2i, 1, BEAM_DX_IMAGE},
      {"start (basic)", 2, &v2b, 1, BEAM_DX_START}, {"start (all)", 2, &v2a, 1, BEAM_DX_START},
  };
  for (size_t c = 0; rc == 0 && c < sizeof cases / sizeof cases[0]; c++) {
    res_t *r = &out[(*nout)];
    memset(r, 0, sizeof *r);
    snprintf(r->shape, sizeof r->shape, "%s", name);
    snprintf(r->msg, sizeof r->msg, "%s", cases[c].msg);
    if (check(cases[c].version, cases[c].parts, cases[c].n, cases[c].kind, h, w, frame,
              cases[c].msg) < 0 ||
        measure(cases[c].version, cases[c].parts, cases[c].n, runs, min_ms, r) < 0) {
      rc = -1;
      break;
    }
    printf("  %-4s v%d %-14s %2u part(s) %11zu B  %8.2f us  (min %.2f, max %.2f)\n", r->shape,
           r->version, r->msg, r->nparts, r->bytes, r->ns_med / 1e3, r->ns_min / 1e3,
           r->ns_max / 1e3);
    fflush(stdout);
    (*nout)++;
  }
  if (rc < 0)
    fprintf(stderr, "dectris_parse: %s failed\n", name);
  free(im.buf);
  free(sb.buf);
  free(sa.buf);
  free(hb);
  free(ha);
  free(cfg);
  free(flat);
  free(mask);
  free(lut);
  free(crt);
  dxb_bank_free(&bank);
  return rc;
}

int main(int argc, char **argv) {
  int runs = 21;
  double min_ms = 20;
  const char *json = NULL;
  char shapes[64] = "4m,16m";
  static const struct option lo[] = {{"runs", required_argument, 0, 'r'},
                                     {"min-ms", required_argument, 0, 'm'},
                                     {"shapes", required_argument, 0, 's'},
                                     {"json", required_argument, 0, 'j'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "r:m:s:j:h", lo, NULL)) != -1) {
    switch (c) {
    case 'r': runs = atoi(optarg); break;
    case 'm': min_ms = atof(optarg); break;
    case 's': snprintf(shapes, sizeof shapes, "%s", optarg); break;
    case 'j': json = optarg; break;
    case 'h':
      printf("usage: dectris_parse [--runs N] [--min-ms MS] [--shapes 4m,16m] [--json FILE]\n");
      return 0;
    default: return 2;
    }
  }
  if (runs < 1 || runs > MAX_RUNS || !(min_ms > 0)) {
    fprintf(stderr, "dectris_parse: --runs 1..%d, --min-ms > 0\n", MAX_RUNS);
    return 2;
  }
  res_t res[MAX_SHAPES * 6];
  int nres = 0, nshape = 0, rc = 0;
  printf("DECTRIS decoders, one thread, median of %d runs of >= %g ms\n", runs, min_ms);
  for (char *save = NULL, *tok = strtok_r(shapes, ",", &save); tok && rc == 0;
       tok = strtok_r(NULL, ",", &save)) {
    if (nshape++ >= MAX_SHAPES) {
      fprintf(stderr, "dectris_parse: at most %d shapes\n", MAX_SHAPES);
      return 2;
    }
    rc = run_shape(tok, runs, min_ms, res, &nres);
  }
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) {
      perror(json);
      return 1;
    }
    fprintf(f, "{\"runs\":%d,\"min_ms\":%g,\"results\":[", runs, min_ms);
    for (int i = 0; i < nres; i++)
      fprintf(f,
              "%s{\"shape\":\"%s\",\"stream\":%d,\"message\":\"%s\",\"parts\":%u,\"bytes\":%zu,"
              "\"us\":%.4f,\"us_min\":%.4f,\"us_max\":%.4f}",
              i ? "," : "", res[i].shape, res[i].version, res[i].msg, res[i].nparts, res[i].bytes,
              res[i].ns_med / 1e3, res[i].ns_min / 1e3, res[i].ns_max / 1e3);
    fprintf(f, "]}\n");
    fclose(f);
  }
  return rc ? 1 : 0;
}
