/* DECTRIS stream messages for the benchmarks (bench/dectris_send.c,
 * bench/dectris_parse.c): a bank of EIGER-like frames encoded once, and the
 * SIMPLON stream v1 (JSON multipart) and v2 (CBOR) messages that carry
 * them, laid out as beamd-sim writes them (docs/tools.md, DECTRIS detector
 * streams; shared/notes/detector-streams.md sections 1-2).
 *
 * Pixels: uint16 Poisson counts of a low mean (sampled from the CDF), the
 * sparse frames an EIGER records in most experiments, so bitshuffle-LZ4
 * compresses them 4-8x as it does real frames. Each bank frame has its own
 * seed.
 *
 * v2 image messages are built whole (the blob sits inside the one CBOR
 * part), with series_id and image_id written as fixed-width 8-byte
 * unsigned integers (major type 0, additional info 27) so a sender patches
 * them in place; dxb_v2_image returns their offsets. Every other field is
 * the preferred (shortest) serialisation, as DECTRIS writes it.
 *
 * Header-only (static functions), shared by two programs; no sockets. */
#ifndef BEAM_BENCH_DECTRIS_H
#define BEAM_BENCH_DECTRIS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "daemon/md5hex.h"
#include "proto/proto.h"

#define DXB_TICKS_V2 50000000u /* EIGER2 16M time base (notes 2.3) */
#define DXB_PIXEL_M 75e-6
#define DXB_ENERGY_EV 12000.0
#define DXB_UID "01HBV3JPF9T4ZDPADX6EMK6XMZ" /* 26-character ULID, as captured */
#define DXB_DATE "2024-05-01T12:00:00.000000Z"

/* ---- frames --------------------------------------------------------------------- */

static inline uint64_t dxb_rng(uint64_t *s) { /* xorshift64* */
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* n uint16 Poisson(mean) counts: a uniform draw looked up in the CDF. */
static inline void dxb_poisson(uint16_t *px, size_t n, double mean, uint64_t seed) {
  double cdf[64];
  int kmax = 0;
  double p = exp(-mean), c = 0;
  for (int k = 0; k < 64; k++) {
    c += p;
    cdf[k] = c;
    kmax = k;
    if (c > 1.0 - 1e-15)
      break;
    p *= mean / (k + 1);
  }
  cdf[kmax] = 2.0; /* every draw ends by the last entry */
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1u;
  for (size_t i = 0; i < n; i++) {
    double u = (double)(dxb_rng(&s) >> 11) * (1.0 / 9007199254740992.0);
    int k = 0;
    while (u >= cdf[k])
      k++;
    px[i] = (uint16_t)k;
  }
}

/* K frames of h x w uint16, bslz4-encoded once. */
typedef struct dxb_bank_s {
  uint32_t h, w;
  double mean;
  unsigned k;
  size_t raw_bytes;
  uint8_t **blob;
  size_t *len;
  char (*hash)[33]; /* v1 dimage hash: md5 of the blob */
  double encode_s;  /* time spent generating and encoding */
} dxb_bank_t;

static inline double dxb_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void dxb_bank_free(dxb_bank_t *b) {
  for (unsigned i = 0; b->blob && i < b->k; i++)
    free(b->blob[i]);
  free(b->blob);
  free(b->len);
  free(b->hash);
  memset(b, 0, sizeof *b);
}

static inline int dxb_bank_make(dxb_bank_t *b, uint32_t h, uint32_t w, double mean, unsigned k) {
  memset(b, 0, sizeof *b);
  b->h = h, b->w = w, b->mean = mean, b->k = k;
  b->raw_bytes = (size_t)h * w * 2;
  double t0 = dxb_now_s();
  size_t cap = beam_codec_bound(BEAM_CODEC_BSLZ4, b->raw_bytes, 2);
  uint16_t *px = malloc(b->raw_bytes);
  void *scratch = malloc(b->raw_bytes);
  b->blob = calloc(k, sizeof *b->blob);
  b->len = calloc(k, sizeof *b->len);
  b->hash = calloc(k, sizeof *b->hash);
  int rc = px && scratch && b->blob && b->len && b->hash && cap ? 0 : -1;
  for (unsigned i = 0; rc == 0 && i < k; i++) {
    dxb_poisson(px, (size_t)h * w, mean, i + 1);
    uint8_t *enc = malloc(cap);
    int64_t n = enc ? beam_codec_encode(BEAM_CODEC_BSLZ4, px, b->raw_bytes, 2, enc, cap, scratch)
                    : -1;
    if (n < 0) {
      free(enc);
      rc = -1;
      break;
    }
    /* Shrink to size; 64-byte aligned copy (zero-copy sends point here). */
    b->blob[i] = aligned_alloc(64, ((size_t)n + 63) & ~(size_t)63);
    if (!b->blob[i]) {
      free(enc);
      rc = -1;
      break;
    }
    memcpy(b->blob[i], enc, (size_t)n);
    free(enc);
    b->len[i] = (size_t)n;
    beamd_md5_hex(b->blob[i], b->len[i], b->hash[i]);
  }
  free(px);
  free(scratch);
  b->encode_s = dxb_now_s() - t0;
  if (rc < 0)
    dxb_bank_free(b);
  return rc;
}

/* A bank kept in a file between processes (the benchmark driver starts a
 * sender per run; encoding a 16M bank takes about a second): header, then
 * per frame its length, md5 hex and bytes. Returns 0 when path held a bank
 * of exactly these parameters, -1 otherwise (absent, other parameters,
 * short). */
#define DXB_BANK_MAGIC 0x314b4e4142584444ull /* "DDXBANK1" */

typedef struct dxb_bank_file_s {
  uint64_t magic;
  uint32_t h, w, k, pad;
  double mean;
} dxb_bank_file_t;

static inline int dxb_bank_load(dxb_bank_t *b, const char *path, uint32_t h, uint32_t w,
                                double mean, unsigned k) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return -1;
  memset(b, 0, sizeof *b);
  double t0 = dxb_now_s();
  dxb_bank_file_t hd;
  int rc = fread(&hd, sizeof hd, 1, f) == 1 && hd.magic == DXB_BANK_MAGIC && hd.h == h &&
                   hd.w == w && hd.k == k && hd.mean == mean
               ? 0
               : -1;
  b->h = h, b->w = w, b->mean = mean, b->k = k;
  b->raw_bytes = (size_t)h * w * 2;
  if (rc == 0) {
    b->blob = calloc(k, sizeof *b->blob);
    b->len = calloc(k, sizeof *b->len);
    b->hash = calloc(k, sizeof *b->hash);
    rc = b->blob && b->len && b->hash ? 0 : -1;
  }
  for (unsigned i = 0; rc == 0 && i < k; i++) {
    uint64_t n;
    if (fread(&n, sizeof n, 1, f) != 1 || n == 0 || n > ((uint64_t)1 << 32) ||
        fread(b->hash[i], 32, 1, f) != 1 ||
        !(b->blob[i] = aligned_alloc(64, ((size_t)n + 63) & ~(size_t)63)) ||
        fread(b->blob[i], (size_t)n, 1, f) != 1) {
      rc = -1;
      break;
    }
    b->hash[i][32] = '\0';
    b->len[i] = (size_t)n;
  }
  fclose(f);
  b->encode_s = dxb_now_s() - t0;
  if (rc < 0)
    dxb_bank_free(b);
  return rc;
}

/* Writes the bank to path (through a temporary name, so a reader never
 * sees half a file). */
static inline int dxb_bank_save(const dxb_bank_t *b, const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return -1;
  dxb_bank_file_t hd = {DXB_BANK_MAGIC, b->h, b->w, b->k, 0, b->mean};
  int rc = fwrite(&hd, sizeof hd, 1, f) == 1 ? 0 : -1;
  for (unsigned i = 0; rc == 0 && i < b->k; i++) {
    uint64_t n = b->len[i];
    if (fwrite(&n, sizeof n, 1, f) != 1 || fwrite(b->hash[i], 32, 1, f) != 1 ||
        fwrite(b->blob[i], b->len[i], 1, f) != 1)
      rc = -1;
  }
  if (fclose(f) != 0)
    rc = -1;
  if (rc == 0 && rename(tmp, path) != 0)
    rc = -1;
  if (rc < 0)
    remove(tmp);
  return rc;
}

/* The bank from path when it holds these parameters, else made (and saved
 * there when path is not NULL). *loaded says which. */
static inline int dxb_bank_get(dxb_bank_t *b, const char *path, uint32_t h, uint32_t w,
                               double mean, unsigned k, int *loaded) {
  *loaded = 0;
  if (path && dxb_bank_load(b, path, h, w, mean, k) == 0) {
    *loaded = 1;
    return 0;
  }
  if (dxb_bank_make(b, h, w, mean, k) < 0)
    return -1;
  if (path && dxb_bank_save(b, path) < 0)
    fprintf(stderr, "dectris bench: cannot write the bank to %s (continuing)\n", path);
  return 0;
}

static inline double dxb_bank_ratio(const dxb_bank_t *b) {
  double enc = 0;
  for (unsigned i = 0; i < b->k; i++)
    enc += (double)b->len[i];
  return enc > 0 ? (double)b->raw_bytes * b->k / enc : 0;
}

/* ---- stream v1 ------------------------------------------------------------------ */

/* dheader + detector config (header_detail basic): the keys beamd-sim and
 * a DCU send, sorted. nimages 0 = not known in advance (a run timed by
 * seconds): beamd then expects no count. Returns malloc'd text. */
static inline char *dxb_v1_dheader(uint64_t series, const char *detail) {
  char *s = malloc(160);
  if (s)
    snprintf(s, 160, "{\"header_detail\":\"%s\",\"htype\":\"dheader-1.0\",\"series\":%llu}", detail,
             (unsigned long long)series);
  return s;
}

static inline char *dxb_v1_config(uint32_t h, uint32_t w, uint64_t nimages, double frame_time) {
  json_t *c = json_object();
#define SETR(k, v) json_object_set_new(c, k, json_real(v))
#define SETI(k, v) json_object_set_new(c, k, json_integer((json_int_t)(v)))
#define SETS(k, v) json_object_set_new(c, k, json_string(v))
#define SETB(k, v) json_object_set_new(c, k, json_boolean(v))
  SETB("auto_summation", 1);
  SETR("beam_center_x", w / 2.0);
  SETR("beam_center_y", h / 2.0);
  SETI("bit_depth_image", 16);
  SETI("bit_depth_readout", 16);
  SETS("calibration_type", "standard");
  SETR("chi_increment", 0.0);
  SETR("chi_start", 0.0);
  SETS("compression", "bslz4");
  SETR("count_time", frame_time - 1e-7);
  SETB("countrate_correction_applied", 0);
  SETI("countrate_correction_count_cutoff", 64512);
  SETS("data_collection_date", DXB_DATE);
  SETS("description", "Dectris EIGER2 Si (beamd bench)");
  SETR("detector_distance", 0.2);
  SETS("detector_number", "E-32-0000-BENCH");
  SETR("detector_readout_time", 1e-7);
  json_object_set_new(c, "detector_translation", json_pack("[fff]", 0.0, 0.0, 0.2));
  SETB("efficiency_correction_applied", 0);
  SETB("flatfield_correction_applied", 0);
  SETR("frame_count_time", frame_time - 1e-7);
  SETR("frame_time", frame_time);
  SETR("kappa_increment", 0.0);
  SETR("kappa_start", 0.0);
  SETI("nframes_sum", 1);
  SETI("nimages", nimages);
  SETI("ntrigger", 1);
  SETI("number_of_excluded_pixels", 0);
  SETR("omega_increment", 0.1);
  SETR("omega_start", 0.0);
  SETR("phi_increment", 0.0);
  SETR("phi_start", 0.0);
  SETR("photon_energy", DXB_ENERGY_EV);
  SETB("pixel_mask_applied", 0);
  SETS("roi_mode", "disabled");
  SETS("sensor_material", "Si");
  SETR("sensor_thickness", 450e-6);
  SETS("software_version", "1.8.0");
  SETR("threshold_energy", DXB_ENERGY_EV / 2);
  SETS("trigger_mode", "ints");
  SETR("two_theta_increment", 0.0);
  SETR("two_theta_start", 0.0);
  SETB("virtual_pixel_correction_applied", 0);
  SETR("wavelength", 12398.419843320026 / DXB_ENERGY_EV);
  SETR("x_pixel_size", DXB_PIXEL_M);
  SETI("x_pixels_in_detector", w);
  SETR("y_pixel_size", DXB_PIXEL_M);
  SETI("y_pixels_in_detector", h);
#undef SETR
#undef SETI
#undef SETS
#undef SETB
  char *s = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
  json_decref(c);
  return s;
}

/* The JSON parts of header_detail all (flatfield, pixel mask, count-rate
 * table); their blobs are h*w*4 bytes (and 2*4000*4). */
static inline void dxb_v1_array_headers(uint32_t h, uint32_t w, char flat[160],
                                        char mask[160], char crt[160]) {
  snprintf(flat, 160, "{\"htype\":\"dflatfield-1.0\",\"shape\":[%u,%u],\"type\":\"float32\"}",
           w, h);
  snprintf(mask, 160, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[%u,%u],\"type\":\"uint32\"}", w, h);
  snprintf(crt, 160,
           "{\"htype\":\"dcountrate_table-1.0\",\"shape\":[2,4000],\"type\":\"float32\"}");
}

/* Part 1 of an image, rewritten per frame. Returns its length. */
static inline int dxb_v1_dimage(char *out, size_t cap, uint64_t series, uint64_t frame,
                                const char hash[33]) {
  return snprintf(out, cap,
                  "{\"frame\":%llu,\"hash\":\"%s\",\"htype\":\"dimage-1.0\",\"series\":%llu}",
                  (unsigned long long)frame, hash, (unsigned long long)series);
}

/* Part 2 (per bank frame: the size differs). */
static inline int dxb_v1_dimage_d(char *out, size_t cap, uint32_t h, uint32_t w, size_t size) {
  return snprintf(out, cap,
                  "{\"encoding\":\"bs16-lz4<\",\"htype\":\"dimage_d-1.0\",\"shape\":[%u,%u],"
                  "\"size\":%zu,\"type\":\"uint16\"}",
                  w, h, size);
}

/* Part 4: dconfig ticks of frame f (10 ns ticks, 1 ms frames). */
static inline int dxb_v1_dconfig(char *out, size_t cap, uint64_t f) {
  uint64_t t0 = f * 100000u;
  return snprintf(out, cap,
                  "{\"htype\":\"dconfig-1.0\",\"real_time\":99990,\"start_time\":%llu,"
                  "\"stop_time\":%llu}",
                  (unsigned long long)t0, (unsigned long long)(t0 + 99990u));
}

static inline int dxb_v1_end(char *out, size_t cap, uint64_t series) {
  return snprintf(out, cap, "{\"htype\":\"dseries_end-1.0\",\"series\":%llu}",
                  (unsigned long long)series);
}

/* ---- stream v2: a minimal CBOR writer ----------------------------------------- */

typedef struct dxb_cbor_s {
  uint8_t *buf;
  size_t len, cap;
  int oom;
} dxb_cbor_t;

static inline uint8_t *dxb_cb_room(dxb_cbor_t *c, size_t n) {
  if (c->oom)
    return NULL;
  if (c->len + n > c->cap) {
    size_t cap = c->cap ? c->cap : 256;
    while (cap < c->len + n)
      cap *= 2;
    uint8_t *p = realloc(c->buf, cap);
    if (!p) {
      c->oom = 1;
      return NULL;
    }
    c->buf = p, c->cap = cap;
  }
  uint8_t *p = c->buf + c->len;
  c->len += n;
  return p;
}

static inline void dxb_cb_put(dxb_cbor_t *c, const void *p, size_t n) {
  uint8_t *d = dxb_cb_room(c, n);
  if (d && n)
    memcpy(d, p, n);
}

static inline void dxb_be(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

static inline void dxb_cb_head(dxb_cbor_t *c, unsigned major, uint64_t v) {
  uint8_t b[9];
  int n;
  if (v < 24) {
    b[0] = (uint8_t)(major << 5 | v), n = 1;
  } else if (v <= 0xff) {
    b[0] = (uint8_t)(major << 5 | 24), b[1] = (uint8_t)v, n = 2;
  } else if (v <= 0xffff) {
    b[0] = (uint8_t)(major << 5 | 25), dxb_be(b + 1, v, 2), n = 3;
  } else if (v <= 0xffffffffu) {
    b[0] = (uint8_t)(major << 5 | 26), dxb_be(b + 1, v, 4), n = 5;
  } else {
    b[0] = (uint8_t)(major << 5 | 27), dxb_be(b + 1, v, 8), n = 9;
  }
  dxb_cb_put(c, b, (size_t)n);
}

/* A uint with an 8-byte argument whatever its value; returns the offset of
 * the 8 bytes (patched in place later). */
static inline size_t dxb_cb_u64_fixed(dxb_cbor_t *c, uint64_t v) {
  uint8_t b[9];
  b[0] = 27; /* major 0, additional info 27 */
  dxb_be(b + 1, v, 8);
  dxb_cb_put(c, b, 9);
  return c->len - 8;
}

static inline void dxb_cb_text(dxb_cbor_t *c, const char *s) {
  size_t n = strlen(s);
  dxb_cb_head(c, 3, n);
  dxb_cb_put(c, s, n);
}

static inline void dxb_cb_bytes(dxb_cbor_t *c, const void *p, size_t n) {
  dxb_cb_head(c, 2, n);
  dxb_cb_put(c, p, n);
}

static inline void dxb_cb_double(dxb_cbor_t *c, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  uint8_t b[9] = {0xfb};
  dxb_be(b + 1, u, 8);
  dxb_cb_put(c, b, 9);
}

static inline void dxb_cb_bool(dxb_cbor_t *c, int v) {
  uint8_t b = v ? 0xf5 : 0xf4;
  dxb_cb_put(c, &b, 1);
}

#define dxb_cb_uint(c, v) dxb_cb_head(c, 0, v)
#define dxb_cb_array(c, n) dxb_cb_head(c, 4, n)
#define dxb_cb_map(c, n) dxb_cb_head(c, 5, n)
#define dxb_cb_tag(c, t) dxb_cb_head(c, 6, t)

static inline void dxb_cb_self_describe(dxb_cbor_t *c) {
  static const uint8_t sig[3] = {0xd9, 0xd9, 0xf7};
  dxb_cb_put(c, sig, 3);
}

static inline void dxb_cb_rational(dxb_cbor_t *c, uint64_t num) {
  dxb_cb_array(c, 2);
  dxb_cb_uint(c, num);
  dxb_cb_uint(c, DXB_TICKS_V2);
}

/* 40([[h, w], T(bytes)]) of an uncompressed per-pixel array. */
static inline void dxb_cb_multidim(dxb_cbor_t *c, uint32_t h, uint32_t w, unsigned tag,
                                   const void *p, size_t n) {
  dxb_cb_tag(c, 40);
  dxb_cb_array(c, 2);
  dxb_cb_array(c, 2);
  dxb_cb_uint(c, h);
  dxb_cb_uint(c, w);
  dxb_cb_tag(c, tag);
  dxb_cb_bytes(c, p, n);
}

/* The start message (header_detail basic; all: + flatfield, pixel mask
 * (h*w float32 / uint32 each) and a 4096-entry count-rate table). */
static inline void dxb_v2_start(dxb_cbor_t *c, uint64_t series, uint32_t h, uint32_t w,
                                uint64_t nimages, double frame_time, const float *flat,
                                const uint32_t *mask, const uint32_t *lut) {
  int all = flat && mask && lut;
  dxb_cb_self_describe(c);
  dxb_cb_map(c, 30 + (all ? 3 : 0));
  dxb_cb_text(c, "type"), dxb_cb_text(c, "start");
  dxb_cb_text(c, "series_id"), dxb_cb_uint(c, series);
  dxb_cb_text(c, "series_unique_id"), dxb_cb_text(c, DXB_UID);
  dxb_cb_text(c, "arm_date"), dxb_cb_tag(c, 0), dxb_cb_text(c, DXB_DATE);
  dxb_cb_text(c, "beam_center_x"), dxb_cb_double(c, w / 2.0);
  dxb_cb_text(c, "beam_center_y"), dxb_cb_double(c, h / 2.0);
  dxb_cb_text(c, "channels"), dxb_cb_array(c, 1), dxb_cb_text(c, "threshold_1");
  dxb_cb_text(c, "count_time"), dxb_cb_double(c, frame_time - 1e-7);
  dxb_cb_text(c, "countrate_correction_enabled"), dxb_cb_bool(c, 0);
  if (all) {
    dxb_cb_text(c, "countrate_correction_lookup_table");
    dxb_cb_tag(c, 70);
    dxb_cb_bytes(c, lut, 4096 * 4);
  }
  dxb_cb_text(c, "detector_description"), dxb_cb_text(c, "Dectris EIGER2 Si (beamd bench)");
  dxb_cb_text(c, "detector_serial_number"), dxb_cb_text(c, "E-32-0000-BENCH");
  dxb_cb_text(c, "detector_translation"), dxb_cb_array(c, 3);
  dxb_cb_double(c, 0.0), dxb_cb_double(c, 0.0), dxb_cb_double(c, 0.2);
  if (all) {
    dxb_cb_text(c, "flatfield"), dxb_cb_map(c, 1), dxb_cb_text(c, "threshold_1");
    dxb_cb_multidim(c, h, w, 85, flat, (size_t)h * w * 4);
  }
  dxb_cb_text(c, "flatfield_enabled"), dxb_cb_bool(c, 0);
  dxb_cb_text(c, "frame_time"), dxb_cb_double(c, frame_time);
  dxb_cb_text(c, "goniometer"), dxb_cb_map(c, 5);
  static const char *axes[] = {"chi", "kappa", "omega", "phi", "two_theta"};
  for (int a = 0; a < 5; a++) {
    dxb_cb_text(c, axes[a]), dxb_cb_map(c, 2);
    dxb_cb_text(c, "increment"), dxb_cb_double(c, a == 2 ? 0.1 : 0.0);
    dxb_cb_text(c, "start"), dxb_cb_double(c, 0.0);
  }
  dxb_cb_text(c, "image_dtype"), dxb_cb_text(c, "uint16");
  dxb_cb_text(c, "image_size_x"), dxb_cb_uint(c, w);
  dxb_cb_text(c, "image_size_y"), dxb_cb_uint(c, h);
  dxb_cb_text(c, "incident_energy"), dxb_cb_double(c, DXB_ENERGY_EV);
  dxb_cb_text(c, "incident_wavelength"), dxb_cb_double(c, 12398.419843320026 / DXB_ENERGY_EV);
  dxb_cb_text(c, "number_of_images"), dxb_cb_uint(c, nimages);
  if (all) {
    dxb_cb_text(c, "pixel_mask"), dxb_cb_map(c, 1), dxb_cb_text(c, "threshold_1");
    dxb_cb_multidim(c, h, w, 70, mask, (size_t)h * w * 4);
  }
  dxb_cb_text(c, "pixel_mask_enabled"), dxb_cb_bool(c, 0);
  dxb_cb_text(c, "pixel_size_x"), dxb_cb_double(c, DXB_PIXEL_M);
  dxb_cb_text(c, "pixel_size_y"), dxb_cb_double(c, DXB_PIXEL_M);
  dxb_cb_text(c, "saturation_value"), dxb_cb_uint(c, 64512);
  dxb_cb_text(c, "sensor_material"), dxb_cb_text(c, "Si");
  dxb_cb_text(c, "sensor_thickness"), dxb_cb_double(c, 450e-6);
  dxb_cb_text(c, "threshold_energy"), dxb_cb_map(c, 2);
  dxb_cb_text(c, "threshold_1"), dxb_cb_double(c, DXB_ENERGY_EV / 2);
  dxb_cb_text(c, "threshold_2"), dxb_cb_double(c, DXB_ENERGY_EV * 0.75);
  dxb_cb_text(c, "user_data"), dxb_cb_text(c, "");
  dxb_cb_text(c, "virtual_pixel_interpolation_enabled"), dxb_cb_bool(c, 0);
}

/* An image message of one bslz4 blob: 40([[h, w], 69(56500(["bslz4", 2,
 * blob]))]) under data.threshold_1. *series_off and *id_off: where the
 * 8-byte series_id and image_id are. */
static inline void dxb_v2_image(dxb_cbor_t *c, uint64_t series, uint64_t image_id, uint32_t h,
                                uint32_t w, const void *blob, size_t len, size_t *series_off,
                                size_t *id_off) {
  uint64_t t0 = image_id * 50000u; /* 1 ms frames on the 50 MHz time base */
  dxb_cb_self_describe(c);
  dxb_cb_map(c, 10);
  dxb_cb_text(c, "type"), dxb_cb_text(c, "image");
  dxb_cb_text(c, "series_id");
  size_t so = dxb_cb_u64_fixed(c, series);
  dxb_cb_text(c, "series_unique_id"), dxb_cb_text(c, DXB_UID);
  dxb_cb_text(c, "image_id");
  size_t io = dxb_cb_u64_fixed(c, image_id);
  dxb_cb_text(c, "start_time"), dxb_cb_rational(c, t0);
  dxb_cb_text(c, "stop_time"), dxb_cb_rational(c, t0 + 49995u);
  dxb_cb_text(c, "real_time"), dxb_cb_rational(c, 49995u);
  dxb_cb_text(c, "series_date"), dxb_cb_tag(c, 0), dxb_cb_text(c, DXB_DATE);
  dxb_cb_text(c, "data"), dxb_cb_map(c, 1), dxb_cb_text(c, "threshold_1");
  dxb_cb_tag(c, 40);
  dxb_cb_array(c, 2);
  dxb_cb_array(c, 2);
  dxb_cb_uint(c, h);
  dxb_cb_uint(c, w);
  dxb_cb_tag(c, 69);
  dxb_cb_tag(c, 56500);
  dxb_cb_array(c, 3);
  dxb_cb_text(c, "bslz4");
  dxb_cb_uint(c, 2);
  dxb_cb_bytes(c, blob, len);
  dxb_cb_text(c, "user_data"), dxb_cb_text(c, "");
  if (series_off)
    *series_off = so;
  if (id_off)
    *id_off = io;
}

static inline void dxb_v2_end(dxb_cbor_t *c, uint64_t series) {
  dxb_cb_self_describe(c);
  dxb_cb_map(c, 3);
  dxb_cb_text(c, "type"), dxb_cb_text(c, "end");
  dxb_cb_text(c, "series_id"), dxb_cb_uint(c, series);
  dxb_cb_text(c, "series_unique_id"), dxb_cb_text(c, DXB_UID);
}

/* Shapes by name: "4m" (EIGER 4M, 2167 x 2070) and "16m" (EIGER2 16M,
 * 4362 x 4148), C order [y, x]; else HxW. */
static inline int dxb_parse_shape(const char *s, uint32_t *h, uint32_t *w) {
  if (!strcmp(s, "4m") || !strcmp(s, "4M")) {
    *h = 2167, *w = 2070;
    return 0;
  }
  if (!strcmp(s, "16m") || !strcmp(s, "16M")) {
    *h = 4362, *w = 4148;
    return 0;
  }
  unsigned hh, ww;
  char tail;
  if (sscanf(s, "%ux%u%c", &hh, &ww, &tail) != 2 || !hh || !ww || hh > 65536 || ww > 65536)
    return -1;
  *h = hh, *w = ww;
  return 0;
}

#endif
