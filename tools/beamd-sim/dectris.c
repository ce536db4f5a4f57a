/* beamd-sim DECTRIS emitters: the SIMPLON detector streams v1 ("legacy",
 * JSON multipart) and v2 (CBOR, one part per message), as an EIGER/EIGER2
 * DCU sends them, for testing beamd's detector adapters without a detector.
 *
 * What the messages hold follows shared/notes/detector-streams.md sections
 * 1-3 (part layouts, keys and types, blob framing, taken from DECTRIS'
 * documentation and real captures); docs/tools.md is the user's view,
 * including every value this file makes up where the notes say nothing
 * (geometry, flatfield, mask, count-rate tables, Jungfraujoch extras).
 * Pixels come from the frame bank (bank.c), so the counter pattern makes
 * every decoded pixel checkable. --fault injects one faulty message of
 * each chosen kind per series, in the middle of it, next to the intact
 * stream, for the negative tests of a decoder.
 *
 * Not a model of a detector's timing or its REST interface: the series
 * start when the first PULL peer takes the first message (a PUSH blocks
 * until then, which is also what a DCU does), and times in the messages are
 * nominal (frame k starts at k * frame_time), not clock readings.
 */
#include "daemon/md5hex.h"
#include "tools/beamd-sim/cbor_enc.h"
#include "tools/beamd-sim/rng.h"
#include "tools/beamd-sim/sim.h"

#include <errno.h>
#include <lz4.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define DX1_DEFAULT_ENDPOINT "tcp://127.0.0.1:9999"  /* DCU stream v1 port */
#define DX2_DEFAULT_ENDPOINT "tcp://127.0.0.1:31001" /* DCU stream v2 port */

/* dconfig times count 10 ns ticks: a real EIGER's real_time 99251 at a
 * 0.99 ms exposure (notes section 1). v2 Rationals use the EIGER2 16M time
 * base, 50 MHz (notes section 2.3). */
#define DX_V1_TICKS_PER_S 1e8
#define DX_V2_TICKS_PER_S 50000000u
#define DX_READOUT_S 1e-7     /* EIGER2 dead time between frames */
#define DX_ENERGY_EV 12000.0
#define DX_HC_EV_ANGSTROM 12398.419843320026
#define DX_PIXEL_M 75e-6
#define DX_DISTANCE_M 0.2
#define DX_THICKNESS_M 450e-6
#define DX_LZ4_BLOCK 8192u    /* v2 "lz4" block: every DECTRIS capture uses 8192 */
#define DX_CRT_ROWS 4000u     /* v1 dcountrate_table shape [2, 4000], as captured */
#define DX_LUT_LEN 4096u      /* v2 countrate_correction_lookup_table entries */
#define DX_DEAD_TIME_S 1e-7   /* the count-rate tables' dead time */
/* Jungfraujoch's interface version: the notes do not record the real
 * value, so this is a placeholder decoders must not rely on. */
#define DX_JFJ_MAGIC 0x4a464a3031ull
#define DX_BAD_ENCODING "lzma<"  /* v1 fault "encoding" */
#define DX_BAD_DTYPE "uint24"    /* v1 fault "dtype" */
#define DX_BAD_ALGORITHM "lzma"  /* v2 fault "algorithm" */
/* v1 fault "nonjson": the dimage_d part. Not UTF-8, not JSON. */
static const char dx_garbage[] = "\xde\xad\xbe\xef not json {\"htype\":";

/* ---- options ---------------------------------------------------------- */

static const struct {
  const char *name;
  unsigned char v1, v2; /* the protocols it applies to */
} fault_tab[SIM_FAULT_COUNT_] = {
  [SIM_FAULT_NONJSON] = {"nonjson", 1, 0},
  [SIM_FAULT_TRUNCATED] = {"truncated", 1, 0},
  [SIM_FAULT_BEFORE_HEADER] = {"image-before-header", 1, 0},
  [SIM_FAULT_STALE] = {"stale", 1, 1},
  [SIM_FAULT_GAP] = {"gap", 1, 1},
  [SIM_FAULT_SIZE] = {"size", 1, 0},
  [SIM_FAULT_ENCODING] = {"encoding", 1, 0},
  [SIM_FAULT_DTYPE] = {"dtype", 1, 0},
  [SIM_FAULT_HASH] = {"hash", 1, 0},
  [SIM_FAULT_NOSIG] = {"nosig", 0, 1},
  [SIM_FAULT_TYPENOTFIRST] = {"typenotfirst", 0, 1},
  [SIM_FAULT_NESTING] = {"nesting", 0, 1},
  [SIM_FAULT_DIMS] = {"dims", 0, 1},
  [SIM_FAULT_SHORT] = {"short", 0, 1},
  [SIM_FAULT_ALGORITHM] = {"algorithm", 0, 1},
};

static const char *proto_name(sim_protocol_t p) {
  return p == SIM_PROTO_DECTRIS1 ? "dectris1" : p == SIM_PROTO_DECTRIS2 ? "dectris2" : "beamd";
}

static const char *enc_name(sim_dx_enc_t e) {
  switch (e) {
  case SIM_DX_RAW: return "raw";
  case SIM_DX_LZ4: return "lz4";
  case SIM_DX_BSLZ4: return "bslz4";
  case SIM_DX_BSZSTD: return "bszstd";
  }
  return "?";
}

void sim_dectris_defaults(sim_opts_t *o) {
  o->protocol = SIM_PROTO_BEAMD;
  o->dx_detail = SIM_DX_BASIC;
  o->dx_enc = SIM_DX_BSLZ4; /* what an EIGER2 DCU streams by default */
  o->dx_header_appendix = o->dx_image_appendix = NULL;
  o->dx_channels = 1;
  o->dx_jfj = 0;
  o->dx_faults = 0;
  o->dx_opt = NULL;
}

static int parse_faults(const char *s, sim_opts_t *o) {
  const char *p = s;
  for (;;) {
    size_t n = strcspn(p, ",");
    int k = -1;
    for (int i = 0; i < SIM_FAULT_COUNT_; i++)
      if (strlen(fault_tab[i].name) == n && !strncmp(p, fault_tab[i].name, n))
        k = i;
    if (k < 0)
      return tool_bad("fault", s,
                      "comma-separated kinds: nonjson, truncated, image-before-header, stale, "
                      "gap, size, encoding, dtype, hash (v1); nosig, typenotfirst, nesting, "
                      "dims, short, algorithm, gap, stale (v2)");
    o->dx_faults |= 1u << k;
    if (!p[n])
      return 0;
    p += n + 1;
  }
}

int sim_dectris_opt(int code, const char *arg, sim_opts_t *o) {
  uint64_t u;
  switch (code) {
  case SIM_DX_PROTOCOL:
    if (!strcmp(arg, "beamd")) o->protocol = SIM_PROTO_BEAMD;
    else if (!strcmp(arg, "dectris1")) o->protocol = SIM_PROTO_DECTRIS1;
    else if (!strcmp(arg, "dectris2")) o->protocol = SIM_PROTO_DECTRIS2;
    else return tool_bad("protocol", arg, "beamd, dectris1 or dectris2");
    return 0;
  case SIM_DX_DETAIL:
    if (!strcmp(arg, "none")) o->dx_detail = SIM_DX_NONE;
    else if (!strcmp(arg, "basic")) o->dx_detail = SIM_DX_BASIC;
    else if (!strcmp(arg, "all")) o->dx_detail = SIM_DX_ALL;
    else return tool_bad("header-detail", arg, "none, basic or all");
    o->dx_opt = "--header-detail";
    return 0;
  case SIM_DX_ENCODING:
    if (!strcmp(arg, "raw")) o->dx_enc = SIM_DX_RAW;
    else if (!strcmp(arg, "lz4")) o->dx_enc = SIM_DX_LZ4;
    else if (!strcmp(arg, "bslz4")) o->dx_enc = SIM_DX_BSLZ4;
    else if (!strcmp(arg, "bszstd")) o->dx_enc = SIM_DX_BSZSTD;
    else return tool_bad("encoding", arg, "raw, lz4, bslz4 or bszstd");
    o->dx_opt = "--encoding";
    return 0;
  case SIM_DX_HAPPENDIX:
    o->dx_header_appendix = arg;
    o->dx_opt = "--header-appendix";
    return 0;
  case SIM_DX_IAPPENDIX:
    o->dx_image_appendix = arg;
    o->dx_opt = "--image-appendix";
    return 0;
  case SIM_DX_CHANNELS:
    if (tool_parse_u64("channels", arg, 1, 2, &u))
      return -1;
    o->dx_channels = (uint32_t)u;
    o->dx_opt = "--channels";
    return 0;
  case SIM_DX_JFJ:
    o->dx_jfj = 1;
    o->dx_opt = "--jfj";
    return 0;
  case SIM_DX_FAULT:
    o->dx_opt = "--fault";
    return parse_faults(arg, o);
  default: /* main.c hands over only codes of the enum */
    fprintf(stderr, "beamd-sim: internal: DECTRIS option code %d\n", code);
    return -1;
  }
}

static int dx_refuse(const char *why) {
  fprintf(stderr, "beamd-sim: %s\n", why);
  return -1;
}

int sim_dectris_check(sim_opts_t *o, int have_bind, int have_connect, int have_socket,
                      int have_codec) {
  if (o->protocol == SIM_PROTO_BEAMD) {
    if (o->dx_opt) {
      fprintf(stderr, "beamd-sim: %s applies to --protocol dectris1 or dectris2 only\n",
              o->dx_opt);
      return -1;
    }
    return 0;
  }
  int v2 = o->protocol == SIM_PROTO_DECTRIS2;
  if (have_connect)
    return dx_refuse("--connect: a DECTRIS detector binds its PUSH socket (use --bind)");
  if (have_socket)
    return dx_refuse("--socket: DECTRIS streams are always PUSH");
  if (have_codec)
    return dx_refuse("--codec: DECTRIS streams take --encoding");
  if (o->malformed)
    return dx_refuse("--malformed: DECTRIS streams take --fault");
  if (o->meta)
    return dx_refuse("--meta applies to --protocol beamd only");
  if (o->dtype != BEAM_DT_U8 && o->dtype != BEAM_DT_U16 && o->dtype != BEAM_DT_U32)
    return dx_refuse("--dtype: DECTRIS detectors send uint8, uint16 or uint32");
  if (o->frames == 0)
    return dx_refuse("--frames 0: a DECTRIS series has a fixed number of images");
  if (!v2 && o->dx_enc == SIM_DX_BSZSTD)
    return dx_refuse("--encoding bszstd: stream v1 has no such encoding (dectris2 only)");
  if (!v2 && o->dx_channels != 1)
    return dx_refuse("--channels: stream v1 has one channel (dectris2 only)");
  if (!v2 && o->dx_jfj)
    return dx_refuse("--jfj: Jungfraujoch speaks stream v2 (dectris2 only)");
  if (o->dx_jfj && o->dx_enc == SIM_DX_LZ4)
    return dx_refuse("--jfj --encoding lz4: Jungfraujoch does not allow LZ4 alone");
  for (int i = 0; i < SIM_FAULT_COUNT_; i++)
    if ((o->dx_faults >> i & 1u) && !(v2 ? fault_tab[i].v2 : fault_tab[i].v1)) {
      fprintf(stderr, "beamd-sim: --fault %s does not apply to --protocol %s\n",
              fault_tab[i].name, proto_name(o->protocol));
      return -1;
    }
  if ((o->dx_faults >> SIM_FAULT_STALE & 1u) && o->series_id0 == 0)
    return dx_refuse("--fault stale needs --series-id >= 1 (it sends series id - 1)");
  if (!have_bind)
    o->endpoint = v2 ? DX2_DEFAULT_ENDPOINT : DX1_DEFAULT_ENDPOINT;
  o->bind = 1;
  o->sock_type = ZMQ_PUSH;
  return 0;
}

void sim_dectris_describe(const sim_opts_t *o) {
  static const char *detail[] = {"none", "basic", "all"};
  fprintf(stderr,
          "beamd-sim: %s on %s (push), %ux%u %s, encoding %s, header_detail %s%s, %s, "
          "%llu series x %llu images",
          proto_name(o->protocol), o->endpoint, o->h, o->w, beam_dtype_name(o->dtype),
          enc_name(o->dx_enc), detail[o->dx_detail],
          o->dx_channels == 2 ? ", 2 channels" : "", sim_pattern_name(o->pattern),
          (unsigned long long)o->nseries, (unsigned long long)o->frames);
  if (o->rate > 0)
    fprintf(stderr, " at %g Hz\n", o->rate);
  else
    fprintf(stderr, " unpaced\n");
}

/* ---- the emitter -------------------------------------------------------- */

typedef struct dx_s {
  void *sock;
  const sim_opts_t *o;
  sim_bank_t *bank;
  sim_stats_t *st;
  int v2;
  size_t npix, esize, raw_bytes;
  uint8_t *frame_buf;        /* rendered frame (stem, xpcs, pca, ptycho) */
  uint8_t *ch2_buf;          /* v2 threshold_2 pixels */
  const uint8_t *px[2];      /* current frame's pixels per channel */
  uint8_t *enc_buf[2];       /* encoded blob per channel (NULL for raw) */
  size_t enc_cap;
  const uint8_t *blob[2];    /* what goes on the wire per channel */
  size_t blob_len[2];
  char hash[33];             /* v1: md5 of blob[0] */
  uint8_t *scratch;          /* bitshuffle scratch */
  sim_cbor_t cb;             /* v2 message, reused */
  /* header_detail all: per-pixel arrays and the count-rate tables */
  float *flatfield;
  uint32_t *mask;
  float *crt;                /* v1: [4000][2] (measured, true) */
  uint32_t *lut;             /* v2 */
  uint64_t nmasked;
  double frame_time, count_time;
  uint64_t t1_frame, t1_count; /* v1 ticks */
  uint64_t t2_frame, t2_count; /* v2 ticks */
  char uid[27], prev_uid[27];  /* series_unique_id of this and the last series */
  char date[40];             /* RFC 3339 time of the series' start */
  uint64_t nkeys;            /* v2: map pairs written, checked against the head */
  uint64_t faults[SIM_FAULT_COUNT_];
  uint64_t messages;
} dx_t;

static int zfail(beam_diag_t *d, const char *what) {
  int e = errno;
  if (e != EINTR)
    BEAM_DIAG(d, BEAM_EIO, "%s: %s", what, zmq_strerror(e));
  errno = e;
  return -1;
}

static void account(dx_t *dx, size_t bytes) {
  uint64_t now = beam_now_ns();
  if (!dx->st->t_first_ns)
    dx->st->t_first_ns = now;
  dx->st->t_last_ns = now;
  dx->st->bytes += bytes;
}

/* One part. EINTR on a message's first part drops the message (nothing is
 * queued yet); on a later part it is retried, since a half-sent multipart
 * message would glue itself onto the next one. */
static int dx_part(dx_t *dx, const void *p, size_t n, int more, int first) {
  for (;;) {
    if (zmq_send(dx->sock, p, n, more ? ZMQ_SNDMORE : 0) >= 0) {
      account(dx, n);
      return 0;
    }
    if (errno != EINTR || first)
      return -1;
  }
}

static void be32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void be64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static size_t lz4_framed_bound(size_t n) {
  size_t nblk = (n + DX_LZ4_BLOCK - 1) / DX_LZ4_BLOCK;
  return 12 + nblk * (4 + (size_t)LZ4_COMPRESSBOUND(DX_LZ4_BLOCK));
}

/* v2 "lz4": the 32004 framing of notes section 2.4 with DECTRIS' 8192-byte
 * blocks. beam_codec_encode's LZ4 writes one block of the whole frame (the
 * HDF5 plugin's default), a valid framing but not what a detector sends, so
 * a decoder that only ever saw one block would pass against it. A block
 * LZ4 does not shrink is stored raw (stored length == block length), which
 * small frames and short last blocks exercise. */
static size_t lz4_framed(const uint8_t *raw, size_t n, uint8_t *dst) {
  be64(dst, n);
  be32(dst + 8, DX_LZ4_BLOCK);
  size_t pos = 12;
  for (size_t off = 0; off < n; off += DX_LZ4_BLOCK) {
    size_t len = n - off < DX_LZ4_BLOCK ? n - off : DX_LZ4_BLOCK;
    int c = LZ4_compress_default((const char *)raw + off, (char *)dst + pos + 4, (int)len,
                                 LZ4_COMPRESSBOUND(DX_LZ4_BLOCK));
    if (c <= 0 || (size_t)c >= len) {
      memcpy(dst + pos + 4, raw + off, len);
      c = (int)len;
    }
    be32(dst + pos, (uint32_t)c);
    pos += 4 + (size_t)c;
  }
  return pos;
}

/* Encodes channel ch's pixels into blob[ch] (and hash for v1). */
static int dx_encode(dx_t *dx, int ch, beam_diag_t *d) {
  const sim_opts_t *o = dx->o;
  const uint8_t *px = dx->px[ch];
  int64_t n;
  switch (o->dx_enc) {
  case SIM_DX_RAW:
    dx->blob[ch] = px;
    dx->blob_len[ch] = dx->raw_bytes;
    goto hash;
  case SIM_DX_LZ4:
    if (dx->v2) {
      n = (int64_t)lz4_framed(px, dx->raw_bytes, dx->enc_buf[ch]);
    } else {
      /* v1 "lz4<": one bare LZ4 block, no framing (notes section 1). */
      n = beam_codec_encode(BEAM_CODEC_LZ4_BLOCK, px, dx->raw_bytes, dx->esize,
                            dx->enc_buf[ch], dx->enc_cap, NULL);
    }
    break;
  case SIM_DX_BSLZ4:
    n = beam_codec_encode(BEAM_CODEC_BSLZ4, px, dx->raw_bytes, dx->esize, dx->enc_buf[ch],
                          dx->enc_cap, dx->scratch);
    break;
  case SIM_DX_BSZSTD:
    n = beam_codec_encode(BEAM_CODEC_BSZSTD, px, dx->raw_bytes, dx->esize, dx->enc_buf[ch],
                          dx->enc_cap, dx->scratch);
    break;
  default:
    n = BEAM_EINVAL;
  }
  if (n < 0)
    return BEAM_DIAG(d, (int)n, "encoding a frame as %s: %s", enc_name(o->dx_enc),
                     beam_strerror((int)n));
  dx->blob[ch] = dx->enc_buf[ch];
  dx->blob_len[ch] = (size_t)n;
hash:
  if (!dx->v2 && ch == 0)
    beamd_md5_hex(dx->blob[0], dx->blob_len[0], dx->hash);
  return 0;
}

/* A higher threshold counts fewer photons: threshold_2 is threshold_1
 * halved (floor), pixel by pixel, whatever the pattern. */
static void make_ch2(dx_t *dx) {
  size_t n = dx->npix;
  switch (dx->o->dtype) {
  case BEAM_DT_U8:
    for (size_t i = 0; i < n; i++) dx->ch2_buf[i] = dx->px[0][i] >> 1;
    break;
  case BEAM_DT_U16: {
    const uint16_t *a = (const uint16_t *)dx->px[0];
    uint16_t *b = (uint16_t *)dx->ch2_buf;
    for (size_t i = 0; i < n; i++) b[i] = a[i] >> 1;
    break;
  }
  default: {
    const uint32_t *a = (const uint32_t *)dx->px[0];
    uint32_t *b = (uint32_t *)dx->ch2_buf;
    for (size_t i = 0; i < n; i++) b[i] = a[i] >> 1;
    break;
  }
  }
  dx->px[1] = dx->ch2_buf;
}

/* Pixels of frame f for every channel, encoded. src: NULL renders frame f
 * from the bank, else these pixels are used (frame-sized). */
static int dx_frame(dx_t *dx, uint64_t f, const void *src, beam_diag_t *d) {
  double pos[3];
  int has_pos;
  dx->px[0] = src ? src : sim_bank_frame(dx->bank, f, dx->frame_buf, pos, &has_pos);
  if (dx->o->dx_channels == 2)
    make_ch2(dx);
  for (uint32_t c = 0; c < dx->o->dx_channels; c++)
    if (dx_encode(dx, (int)c, d) < 0)
      return -1;
  return 0;
}

static uint64_t dtype_max(beam_dtype_t dt) {
  return dt == BEAM_DT_U8 ? 0xffu : dt == BEAM_DT_U16 ? 0xffffu : 0xffffffffu;
}

/* Counts above this are not count-rate corrected and saturate (EIGER's
 * countrate_correction_count_cutoff; here 1/64 below the dtype's top). */
static uint64_t count_cutoff(beam_dtype_t dt) {
  uint64_t m = dtype_max(dt);
  return m - m / 64;
}

/* ULID-like series_unique_id (26 Crockford base32 characters, as in the
 * EIGER2 capture): 48 bits of milliseconds, 80 bits from seed and id. */
static void make_uid(char out[27], uint64_t ms, uint64_t seed, uint64_t sid) {
  static const char b32[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
  uint64_t x = seed ^ (sid * 0x9e3779b97f4a7c15ull);
  uint64_t r1 = sim_splitmix64(&x), r2 = sim_splitmix64(&x);
  uint64_t hi = (ms & 0xffffffffffffull) << 16 | (r1 >> 48);
  unsigned __int128 v = ((unsigned __int128)hi << 64) | r2;
  for (int i = 0; i < 26; i++)
    out[i] = b32[(unsigned)(v >> (5 * (25 - i))) & 31u];
  out[26] = '\0';
}

static void make_date(char out[40], uint64_t real_ns) {
  time_t t = (time_t)(real_ns / 1000000000ull);
  struct tm tm;
  gmtime_r(&t, &tm);
  size_t n = strftime(out, 40, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + n, 40 - n, ".%06uZ", (unsigned)(real_ns % 1000000000ull / 1000u));
}

/* The header_detail=all arrays. Flatfield 1 + 0.001 * (x mod 8) (float32
 * arithmetic); mask: the middle row is a module gap (bit 0), pixel (0, 0)
 * is dead (bit 1); count-rate tables of a paralysable dead time. */
static int make_tables(dx_t *dx, beam_diag_t *d) {
  const sim_opts_t *o = dx->o;
  dx->flatfield = malloc(dx->npix * sizeof *dx->flatfield);
  dx->mask = malloc(dx->npix * sizeof *dx->mask);
  dx->crt = malloc(2 * DX_CRT_ROWS * sizeof *dx->crt);
  dx->lut = malloc(DX_LUT_LEN * sizeof *dx->lut);
  if (!dx->flatfield || !dx->mask || !dx->crt || !dx->lut)
    return BEAM_DIAG(d, BEAM_ENOMEM, "flatfield and mask of %zu pixels", dx->npix);
  dx->nmasked = 0;
  for (uint32_t y = 0; y < o->h; y++)
    for (uint32_t x = 0; x < o->w; x++) {
      size_t i = (size_t)y * o->w + x;
      dx->flatfield[i] = 1.0f + 0.001f * (float)(x % 8u);
      dx->mask[i] = (y == o->h / 2 ? 1u : 0u) | (y == 0 && x == 0 ? 2u : 0u);
      dx->nmasked += dx->mask[i] != 0;
    }
  for (uint32_t r = 0; r < DX_CRT_ROWS; r++) {
    double m = r * 1000.0; /* measured counts/s */
    dx->crt[2 * r] = (float)m;
    dx->crt[2 * r + 1] = (float)(m / (1.0 - m * DX_DEAD_TIME_S));
  }
  for (uint32_t i = 0; i < DX_LUT_LEN; i++)
    dx->lut[i] = i + (uint32_t)((uint64_t)i * i / 16384u);
  return 0;
}

static int dx_init(dx_t *dx, void *sock, const sim_opts_t *o, sim_bank_t *bank,
                   sim_stats_t *st, beam_diag_t *d) {
  memset(dx, 0, sizeof *dx);
  dx->sock = sock;
  dx->o = o;
  dx->bank = bank;
  dx->st = st;
  dx->v2 = o->protocol == SIM_PROTO_DECTRIS2;
  dx->npix = bank->npix;
  dx->esize = bank->esize;
  dx->raw_bytes = dx->npix * dx->esize;
  dx->frame_time = sim_frame_time(o);
  dx->count_time = dx->frame_time > 2 * DX_READOUT_S ? dx->frame_time - DX_READOUT_S
                                                     : dx->frame_time / 2;
  /* Start times are frame number x the rounded frame period, so they are
   * exact integers a test recomputes without floating point. */
  dx->t1_frame = (uint64_t)llround(dx->frame_time * DX_V1_TICKS_PER_S);
  dx->t1_count = (uint64_t)llround(dx->count_time * DX_V1_TICKS_PER_S);
  dx->t2_frame = (uint64_t)llround(dx->frame_time * DX_V2_TICKS_PER_S);
  dx->t2_count = (uint64_t)llround(dx->count_time * DX_V2_TICKS_PER_S);
  if (!sim_bank_is_static(bank) && !(dx->frame_buf = malloc(dx->raw_bytes)))
    return BEAM_DIAG(d, BEAM_ENOMEM, "frame buffer of %zu bytes", dx->raw_bytes);
  if (o->dx_channels == 2 && !(dx->ch2_buf = malloc(dx->raw_bytes)))
    return BEAM_DIAG(d, BEAM_ENOMEM, "second channel of %zu bytes", dx->raw_bytes);
  switch (o->dx_enc) {
  case SIM_DX_RAW: dx->enc_cap = 0; break;
  case SIM_DX_LZ4:
    dx->enc_cap = dx->v2 ? lz4_framed_bound(dx->raw_bytes)
                         : beam_codec_bound(BEAM_CODEC_LZ4_BLOCK, dx->raw_bytes, dx->esize);
    break;
  case SIM_DX_BSLZ4:
    dx->enc_cap = beam_codec_bound(BEAM_CODEC_BSLZ4, dx->raw_bytes, dx->esize);
    break;
  case SIM_DX_BSZSTD:
    dx->enc_cap = beam_codec_bound(BEAM_CODEC_BSZSTD, dx->raw_bytes, dx->esize);
    break;
  }
  if (o->dx_enc != SIM_DX_RAW) {
    if (!dx->enc_cap)
      return BEAM_DIAG(d, BEAM_EINVAL, "a %zu-byte frame is too large for %s",
                       dx->raw_bytes, enc_name(o->dx_enc));
    for (uint32_t c = 0; c < o->dx_channels; c++)
      if (!(dx->enc_buf[c] = malloc(dx->enc_cap)))
        return BEAM_DIAG(d, BEAM_ENOMEM, "encode buffer of %zu bytes", dx->enc_cap);
    if (!(dx->scratch = malloc(dx->raw_bytes ? dx->raw_bytes : 1)))
      return BEAM_DIAG(d, BEAM_ENOMEM, "bitshuffle scratch of %zu bytes", dx->raw_bytes);
  }
  if (o->dx_detail == SIM_DX_ALL)
    return make_tables(dx, d);
  return 0;
}

static void dx_destroy(dx_t *dx) {
  free(dx->frame_buf);
  free(dx->ch2_buf);
  free(dx->enc_buf[0]);
  free(dx->enc_buf[1]);
  free(dx->scratch);
  free(dx->flatfield);
  free(dx->mask);
  free(dx->crt);
  free(dx->lut);
  sim_cbor_free(&dx->cb);
  memset(dx, 0, sizeof *dx);
}

/* ---- stream v1 ---------------------------------------------------------- */

/* JSON parts are written with sorted keys, as the captured DCU parts are. */
static json_t *v1_config(dx_t *dx) {
  const sim_opts_t *o = dx->o;
  json_t *c = json_object();
  const char *enc = o->dx_enc == SIM_DX_RAW ? "none" : enc_name(o->dx_enc);
#define SETR(k, v) json_object_set_new(c, k, json_real(v))
#define SETI(k, v) json_object_set_new(c, k, json_integer((json_int_t)(v)))
#define SETS(k, v) json_object_set_new(c, k, json_string(v))
#define SETB(k, v) json_object_set_new(c, k, json_boolean(v))
  SETB("auto_summation", 1);
  SETR("beam_center_x", o->w / 2.0);
  SETR("beam_center_y", o->h / 2.0);
  SETI("bit_depth_image", 8 * dx->esize);
  SETI("bit_depth_readout", dx->esize >= 2 ? 16 : 8);
  SETS("calibration_type", "standard");
  SETR("chi_increment", 0.0);
  SETR("chi_start", 0.0);
  SETS("compression", enc);
  SETR("count_time", dx->count_time);
  /* The pixels are the pattern as it is: no correction was applied. */
  SETB("countrate_correction_applied", 0);
  SETI("countrate_correction_count_cutoff", count_cutoff(o->dtype));
  SETS("data_collection_date", dx->date);
  SETS("description", "Dectris EIGER2 Si (beamd-sim)");
  SETR("detector_distance", DX_DISTANCE_M);
  SETS("detector_number", "E-32-0000-SIM");
  SETR("detector_readout_time", DX_READOUT_S);
  json_object_set_new(c, "detector_translation", json_pack("[fff]", 0.0, 0.0, DX_DISTANCE_M));
  SETB("efficiency_correction_applied", 0);
  SETB("flatfield_correction_applied", 0);
  SETR("frame_count_time", dx->count_time);
  SETR("frame_time", dx->frame_time);
  SETR("kappa_increment", 0.0);
  SETR("kappa_start", 0.0);
  SETI("nframes_sum", 1);
  SETI("nimages", o->frames);
  SETI("ntrigger", 1);
  SETI("number_of_excluded_pixels", (o->dx_detail == SIM_DX_ALL) ? dx->nmasked : 0);
  SETR("omega_increment", 0.1);
  SETR("omega_start", 0.0);
  SETR("phi_increment", 0.0);
  SETR("phi_start", 0.0);
  SETR("photon_energy", DX_ENERGY_EV);
  SETB("pixel_mask_applied", 0);
  SETS("roi_mode", "disabled");
  SETS("sensor_material", "Si");
  SETR("sensor_thickness", DX_THICKNESS_M);
  SETS("software_version", "1.8.0");
  SETR("threshold_energy", DX_ENERGY_EV / 2);
  SETS("trigger_mode", "ints");
  SETR("two_theta_increment", 0.0);
  SETR("two_theta_start", 0.0);
  SETB("virtual_pixel_correction_applied", 0);
  SETR("wavelength", DX_HC_EV_ANGSTROM / DX_ENERGY_EV);
  SETR("x_pixel_size", DX_PIXEL_M);
  SETI("x_pixels_in_detector", o->w);
  SETR("y_pixel_size", DX_PIXEL_M);
  SETI("y_pixels_in_detector", o->h);
#undef SETR
#undef SETI
#undef SETS
#undef SETB
  return c;
}

static const char *v1_encoding(dx_t *dx, char buf[16]) {
  switch (dx->o->dx_enc) {
  case SIM_DX_RAW: return "<";
  case SIM_DX_LZ4: return "lz4<";
  default: snprintf(buf, 16, "bs%zu-lz4<", 8 * dx->esize); return buf;
  }
}

static int v1_header(dx_t *dx, uint64_t sid, beam_diag_t *d) {
  static const char *detail[] = {"none", "basic", "all"};
  const sim_opts_t *o = dx->o;
  const char *app = o->dx_header_appendix && *o->dx_header_appendix ? o->dx_header_appendix : NULL;
  int basic = o->dx_detail != SIM_DX_NONE, all = o->dx_detail == SIM_DX_ALL;
  char h[160];
  snprintf(h, sizeof h, "{\"header_detail\":\"%s\",\"htype\":\"dheader-1.0\",\"series\":%llu}",
           detail[o->dx_detail], (unsigned long long)sid);
  char *cfg = NULL;
  if (basic) {
    json_t *c = v1_config(dx);
    cfg = c ? json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(c);
    if (!cfg)
      return BEAM_DIAG(d, BEAM_ENOMEM, "detector config JSON"), -1;
  }
  int rc = -1;
  if (dx_part(dx, h, strlen(h), basic || app, 1) < 0)
    goto fail;
  if (basic && dx_part(dx, cfg, strlen(cfg), all || app, 0) < 0)
    goto fail;
  if (all) {
    char j[160];
    snprintf(j, sizeof j, "{\"htype\":\"dflatfield-1.0\",\"shape\":[%u,%u],\"type\":\"float32\"}",
             o->w, o->h);
    if (dx_part(dx, j, strlen(j), 1, 0) < 0 ||
        dx_part(dx, dx->flatfield, dx->npix * 4, 1, 0) < 0)
      goto fail;
    snprintf(j, sizeof j, "{\"htype\":\"dpixelmask-1.0\",\"shape\":[%u,%u],\"type\":\"uint32\"}",
             o->w, o->h);
    if (dx_part(dx, j, strlen(j), 1, 0) < 0 || dx_part(dx, dx->mask, dx->npix * 4, 1, 0) < 0)
      goto fail;
    snprintf(j, sizeof j,
             "{\"htype\":\"dcountrate_table-1.0\",\"shape\":[2,%u],\"type\":\"float32\"}",
             DX_CRT_ROWS);
    if (dx_part(dx, j, strlen(j), 1, 0) < 0 ||
        dx_part(dx, dx->crt, 2 * DX_CRT_ROWS * 4, app != NULL, 0) < 0)
      goto fail;
  }
  if (app && dx_part(dx, app, strlen(app), 0, 0) < 0)
    goto fail;
  dx->messages++;
  rc = 0;
fail:
  if (rc < 0)
    zfail(d, "sending the v1 header");
  free(cfg);
  return rc;
}

/* One image message of the current blob. fault: SIM_FAULT_COUNT_ for a
 * good image, else the v1 kind it carries. */
static int v1_image(dx_t *dx, uint64_t sid, uint64_t f, int fault, beam_diag_t *d) {
  const sim_opts_t *o = dx->o;
  const char *app = o->dx_image_appendix && *o->dx_image_appendix ? o->dx_image_appendix : NULL;
  char p1[192], p2[224], p4[192], encbuf[16], hash[33];
  memcpy(hash, dx->hash, sizeof hash);
  if (fault == SIM_FAULT_HASH) /* one hex digit off: still 32 lower-case hex digits */
    hash[0] = "123456789abcdef0"[hash[0] <= '9' ? hash[0] - '0' : hash[0] - 'a' + 10];
  snprintf(p1, sizeof p1, "{\"frame\":%llu,\"hash\":\"%s\",\"htype\":\"dimage-1.0\",\"series\":%llu}",
           (unsigned long long)f, hash, (unsigned long long)sid);
  const char *enc = fault == SIM_FAULT_ENCODING ? DX_BAD_ENCODING : v1_encoding(dx, encbuf);
  const char *type = fault == SIM_FAULT_DTYPE ? DX_BAD_DTYPE : beam_dtype_name(o->dtype);
  size_t size = dx->blob_len[0] + (fault == SIM_FAULT_SIZE ? 1 : 0);
  snprintf(p2, sizeof p2,
           "{\"encoding\":\"%s\",\"htype\":\"dimage_d-1.0\",\"shape\":[%u,%u],\"size\":%zu,"
           "\"type\":\"%s\"}",
           enc, o->w, o->h, size, type);
  uint64_t t0 = f * dx->t1_frame;
  snprintf(p4, sizeof p4,
           "{\"htype\":\"dconfig-1.0\",\"real_time\":%llu,\"start_time\":%llu,\"stop_time\":%llu}",
           (unsigned long long)dx->t1_count, (unsigned long long)t0,
           (unsigned long long)(t0 + dx->t1_count));
  const char *q2 = fault == SIM_FAULT_NONJSON ? dx_garbage : p2;
  size_t q2len = fault == SIM_FAULT_NONJSON ? sizeof dx_garbage - 1 : strlen(p2);
  if (dx_part(dx, p1, strlen(p1), 1, 1) < 0)
    return zfail(d, "sending dimage");
  /* truncated: the message ends after dimage_d, without blob and dconfig. */
  if (dx_part(dx, q2, q2len, fault != SIM_FAULT_TRUNCATED, 0) < 0)
    return zfail(d, "sending dimage_d");
  if (fault != SIM_FAULT_TRUNCATED) {
    if (dx_part(dx, dx->blob[0], dx->blob_len[0], 1, 0) < 0 ||
        dx_part(dx, p4, strlen(p4), app != NULL, 0) < 0 ||
        (app && dx_part(dx, app, strlen(app), 0, 0) < 0))
      return zfail(d, "sending an image");
  }
  dx->messages++;
  return 0;
}

static int v1_end(dx_t *dx, uint64_t sid, beam_diag_t *d) {
  char e[96];
  snprintf(e, sizeof e, "{\"htype\":\"dseries_end-1.0\",\"series\":%llu}", (unsigned long long)sid);
  if (dx_part(dx, e, strlen(e), 0, 1) < 0)
    return zfail(d, "sending dseries_end");
  dx->messages++;
  return 0;
}

/* ---- stream v2 ---------------------------------------------------------- */

static void key(dx_t *dx, const char *k) {
  sim_cbor_text(&dx->cb, k);
  dx->nkeys++;
}

static void map(dx_t *dx, uint64_t n) {
  sim_cbor_map(&dx->cb, n);
}

static unsigned typed_tag(size_t esize) {
  return esize == 1 ? SIM_CBOR_TAG_U8 : esize == 2 ? SIM_CBOR_TAG_U16LE : SIM_CBOR_TAG_U32LE;
}

/* 40([[rows, cols], tag(bytes)]): an uncompressed MultiDimArray. */
static void multidim(dx_t *dx, unsigned tag, const void *p, size_t bytes) {
  sim_cbor_t *c = &dx->cb;
  sim_cbor_tag(c, SIM_CBOR_TAG_MULTIDIM);
  sim_cbor_array(c, 2);
  sim_cbor_array(c, 2);
  sim_cbor_uint(c, dx->o->h);
  sim_cbor_uint(c, dx->o->w);
  sim_cbor_tag(c, tag);
  sim_cbor_bytes(c, p, bytes);
}

static void rational(dx_t *dx, uint64_t num) {
  sim_cbor_array(&dx->cb, 2);
  sim_cbor_uint(&dx->cb, num);
  sim_cbor_uint(&dx->cb, DX_V2_TICKS_PER_S);
}

static void date(dx_t *dx) {
  sim_cbor_tag(&dx->cb, SIM_CBOR_TAG_DATETIME);
  sim_cbor_text(&dx->cb, dx->date);
}

static const char *channel_name(unsigned c) { return c ? "threshold_2" : "threshold_1"; }

static int v2_send(dx_t *dx, int nosig, const char *what, beam_diag_t *d) {
  if (dx->cb.oom)
    return BEAM_DIAG(d, BEAM_ENOMEM, "%s message", what), -1;
  size_t skip = nosig ? 3 : 0; /* the self-described CBOR prefix d9 d9 f7 */
  if (dx_part(dx, dx->cb.buf + skip, dx->cb.len - skip, 0, 1) < 0)
    return zfail(d, what);
  dx->messages++;
  return 0;
}

static void v2_begin(dx_t *dx) {
  sim_cbor_reset(&dx->cb);
  sim_cbor_tag(&dx->cb, SIM_CBOR_TAG_SELF_DESCRIBE);
  dx->nkeys = 0;
}

static int v2_start(dx_t *dx, uint64_t sid, beam_diag_t *d) {
  const sim_opts_t *o = dx->o;
  sim_cbor_t *c = &dx->cb;
  int all = o->dx_detail == SIM_DX_ALL;
  uint64_t n = 30 + (all ? 3 : 0) + (o->dx_jfj ? 3 : 0);
  v2_begin(dx);
  map(dx, n);
  key(dx, "type"); sim_cbor_text(c, "start");
  key(dx, "series_id"); sim_cbor_uint(c, sid);
  key(dx, "series_unique_id"); sim_cbor_text(c, dx->uid);
  key(dx, "arm_date"); date(dx);
  key(dx, "beam_center_x"); sim_cbor_double(c, o->w / 2.0);
  key(dx, "beam_center_y"); sim_cbor_double(c, o->h / 2.0);
  key(dx, "channels");
  sim_cbor_array(c, o->dx_channels);
  for (unsigned ch = 0; ch < o->dx_channels; ch++)
    sim_cbor_text(c, channel_name(ch));
  key(dx, "count_time"); sim_cbor_double(c, dx->count_time);
  key(dx, "countrate_correction_enabled"); sim_cbor_bool(c, 0);
  if (all) {
    key(dx, "countrate_correction_lookup_table");
    sim_cbor_tag(c, SIM_CBOR_TAG_U32LE);
    sim_cbor_bytes(c, dx->lut, DX_LUT_LEN * 4);
  }
  key(dx, "detector_description"); sim_cbor_text(c, "Dectris EIGER2 Si (beamd-sim)");
  key(dx, "detector_serial_number"); sim_cbor_text(c, "E-32-0000-SIM");
  key(dx, "detector_translation");
  sim_cbor_array(c, 3);
  sim_cbor_double(c, 0.0);
  sim_cbor_double(c, 0.0);
  sim_cbor_double(c, DX_DISTANCE_M);
  if (all) {
    key(dx, "flatfield");
    sim_cbor_map(c, o->dx_channels);
    for (unsigned ch = 0; ch < o->dx_channels; ch++) {
      sim_cbor_text(c, channel_name(ch));
      multidim(dx, SIM_CBOR_TAG_F32LE, dx->flatfield, dx->npix * 4);
    }
  }
  key(dx, "flatfield_enabled"); sim_cbor_bool(c, 0);
  key(dx, "frame_time"); sim_cbor_double(c, dx->frame_time);
  key(dx, "goniometer");
  static const char *axes[] = {"chi", "kappa", "omega", "phi", "two_theta"};
  sim_cbor_map(c, 5);
  for (int a = 0; a < 5; a++) {
    sim_cbor_text(c, axes[a]);
    sim_cbor_map(c, 2);
    sim_cbor_text(c, "increment");
    sim_cbor_double(c, a == 2 ? 0.1 : 0.0); /* an omega rotation, as in v1's config */
    sim_cbor_text(c, "start");
    sim_cbor_double(c, 0.0);
  }
  key(dx, "image_dtype"); sim_cbor_text(c, beam_dtype_name(o->dtype));
  key(dx, "image_size_x"); sim_cbor_uint(c, o->w);
  key(dx, "image_size_y"); sim_cbor_uint(c, o->h);
  key(dx, "incident_energy"); sim_cbor_double(c, DX_ENERGY_EV);
  key(dx, "incident_wavelength"); sim_cbor_double(c, DX_HC_EV_ANGSTROM / DX_ENERGY_EV);
  key(dx, "number_of_images"); sim_cbor_uint(c, o->frames);
  if (all) {
    key(dx, "pixel_mask");
    sim_cbor_map(c, o->dx_channels);
    for (unsigned ch = 0; ch < o->dx_channels; ch++) {
      sim_cbor_text(c, channel_name(ch));
      multidim(dx, SIM_CBOR_TAG_U32LE, dx->mask, dx->npix * 4);
    }
  }
  key(dx, "pixel_mask_enabled"); sim_cbor_bool(c, 0);
  key(dx, "pixel_size_x"); sim_cbor_double(c, DX_PIXEL_M);
  key(dx, "pixel_size_y"); sim_cbor_double(c, DX_PIXEL_M);
  key(dx, "saturation_value"); sim_cbor_uint(c, count_cutoff(o->dtype));
  key(dx, "sensor_material"); sim_cbor_text(c, "Si");
  key(dx, "sensor_thickness"); sim_cbor_double(c, DX_THICKNESS_M);
  /* Both thresholds even with one active channel, as in the EIGER2 capture. */
  key(dx, "threshold_energy");
  sim_cbor_map(c, 2);
  sim_cbor_text(c, "threshold_1");
  sim_cbor_double(c, DX_ENERGY_EV / 2);
  sim_cbor_text(c, "threshold_2");
  sim_cbor_double(c, DX_ENERGY_EV * 0.75);
  key(dx, "user_data");
  sim_cbor_text(c, o->dx_header_appendix ? o->dx_header_appendix : "");
  key(dx, "virtual_pixel_interpolation_enabled"); sim_cbor_bool(c, 0);
  if (o->dx_jfj) {
    key(dx, "detector_distance"); sim_cbor_double(c, DX_DISTANCE_M);
    key(dx, "error_value"); sim_cbor_int(c, (int64_t)dtype_max(o->dtype));
    key(dx, "magic_number"); sim_cbor_uint(c, DX_JFJ_MAGIC);
  }
  BEAM_ASSERT(dx->nkeys == n);
  return v2_send(dx, 0, "sending start", d);
}

/* Jungfraujoch sends a calibration message after start. Its fields are not
 * in the notes, so this is a stand-in of the right shape that a DECTRIS
 * decoder must skip: type, series ids, and data.pedestal_g0, an H x W
 * float32 map of zeros. */
static int v2_calibration(dx_t *dx, uint64_t sid, beam_diag_t *d) {
  sim_cbor_t *c = &dx->cb;
  v2_begin(dx);
  map(dx, 4);
  key(dx, "type"); sim_cbor_text(c, "calibration");
  key(dx, "series_id"); sim_cbor_uint(c, sid);
  key(dx, "series_unique_id"); sim_cbor_text(c, dx->uid);
  key(dx, "data");
  sim_cbor_map(c, 1);
  sim_cbor_text(c, "pedestal_g0");
  /* float32 0.0 is four zero bytes: written in place, no buffer needed. */
  sim_cbor_tag(c, SIM_CBOR_TAG_MULTIDIM);
  sim_cbor_array(c, 2);
  sim_cbor_array(c, 2);
  sim_cbor_uint(c, dx->o->h);
  sim_cbor_uint(c, dx->o->w);
  sim_cbor_tag(c, SIM_CBOR_TAG_F32LE);
  sim_cbor_head(c, 2, dx->npix * 4);
  if (sim_cbor_reserve(c, dx->npix * 4) == 0) {
    memset(c->buf + c->len, 0, dx->npix * 4);
    c->len += dx->npix * 4;
  }
  return v2_send(dx, 0, "sending calibration", d);
}

/* data[channel]: 40([[H, W], T(56500([alg, modifier, blob]))]) or, raw,
 * 40([[H, W], T(blob)]), with T the typed-array tag. fault applies to
 * this channel (SIM_FAULT_COUNT_: none). */
static void v2_channel(dx_t *dx, unsigned ch, int fault) {
  const sim_opts_t *o = dx->o;
  sim_cbor_t *c = &dx->cb;
  if (fault != SIM_FAULT_NESTING)
    sim_cbor_tag(c, SIM_CBOR_TAG_MULTIDIM);
  sim_cbor_array(c, 2);
  sim_cbor_array(c, 2);
  sim_cbor_uint(c, o->h + (fault == SIM_FAULT_DIMS ? 1u : 0u));
  sim_cbor_uint(c, o->w);
  sim_cbor_tag(c, typed_tag(dx->esize));
  if (o->dx_enc == SIM_DX_RAW && fault != SIM_FAULT_SHORT && fault != SIM_FAULT_ALGORITHM) {
    sim_cbor_bytes(c, dx->blob[ch], dx->blob_len[ch]);
    return;
  }
  const char *alg;
  uint64_t mod;
  switch (o->dx_enc) {
  case SIM_DX_LZ4: alg = "lz4"; mod = 0; break;
  case SIM_DX_BSZSTD: alg = "bszstd"; mod = dx->esize; break;
  case SIM_DX_RAW: /* raw pixels inside a compression tag: the faults only */
    alg = "bslz4";
    mod = fault == SIM_FAULT_SHORT ? dx->esize : 0;
    break;
  default: alg = "bslz4"; mod = dx->esize; break;
  }
  if (fault == SIM_FAULT_ALGORITHM)
    alg = DX_BAD_ALGORITHM;
  sim_cbor_tag(c, SIM_CBOR_TAG_COMPRESSED);
  sim_cbor_array(c, 3);
  sim_cbor_text(c, alg);
  sim_cbor_uint(c, mod);
  if (fault == SIM_FAULT_SHORT) {
    /* What is left of a framing cut after orig_size: 8 of the 12 header bytes. */
    uint8_t b[8];
    be64(b, dx->raw_bytes);
    sim_cbor_bytes(c, b, sizeof b);
  } else {
    sim_cbor_bytes(c, dx->blob[ch], dx->blob_len[ch]);
  }
}

static int v2_image(dx_t *dx, uint64_t sid, const char *uid, uint64_t f, int fault,
                    beam_diag_t *d) {
  const sim_opts_t *o = dx->o;
  sim_cbor_t *c = &dx->cb;
  uint64_t t0 = f * dx->t2_frame;
  v2_begin(dx);
  map(dx, 10);
  if (fault == SIM_FAULT_TYPENOTFIRST) {
    key(dx, "series_id"); sim_cbor_uint(c, sid);
    key(dx, "type"); sim_cbor_text(c, "image");
  } else {
    key(dx, "type"); sim_cbor_text(c, "image");
    key(dx, "series_id"); sim_cbor_uint(c, sid);
  }
  key(dx, "series_unique_id"); sim_cbor_text(c, uid);
  key(dx, "image_id"); sim_cbor_uint(c, f);
  key(dx, "start_time"); rational(dx, t0);
  key(dx, "stop_time"); rational(dx, t0 + dx->t2_count);
  key(dx, "real_time"); rational(dx, dx->t2_count);
  key(dx, "series_date"); date(dx);
  key(dx, "data");
  sim_cbor_map(c, o->dx_channels);
  for (unsigned ch = 0; ch < o->dx_channels; ch++) {
    sim_cbor_text(c, channel_name(ch));
    v2_channel(dx, ch, ch == 0 ? fault : SIM_FAULT_COUNT_);
  }
  key(dx, "user_data");
  sim_cbor_text(c, o->dx_image_appendix ? o->dx_image_appendix : "");
  BEAM_ASSERT(dx->nkeys == 10);
  return v2_send(dx, fault == SIM_FAULT_NOSIG, "sending an image", d);
}

static int v2_end(dx_t *dx, uint64_t sid, beam_diag_t *d) {
  sim_cbor_t *c = &dx->cb;
  v2_begin(dx);
  map(dx, 3);
  key(dx, "type"); sim_cbor_text(c, "end");
  key(dx, "series_id"); sim_cbor_uint(c, sid);
  key(dx, "series_unique_id"); sim_cbor_text(c, dx->uid);
  return v2_send(dx, 0, "sending end", d);
}

/* ---- the run ------------------------------------------------------------ */

static int has(const dx_t *dx, sim_dx_fault_t k) { return (dx->o->dx_faults >> k & 1u) != 0; }

static void sleep_until(uint64_t deadline_ns) {
  struct timespec ts = {(time_t)(deadline_ns / 1000000000ull),
                        (long)(deadline_ns % 1000000000ull)};
  while (!tool_stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

/* A faulty message was sent. */
static void faulted(dx_t *dx, sim_dx_fault_t k) {
  dx->faults[k]++;
  dx->st->malformed_sent++;
}

/* The faulty copies of the middle frame, sent just before the good one, in
 * a fixed order: a receiver that rejects them sees an intact series. */
static const sim_dx_fault_t v1_copies[] = {SIM_FAULT_NONJSON, SIM_FAULT_TRUNCATED,
                                           SIM_FAULT_SIZE, SIM_FAULT_ENCODING,
                                           SIM_FAULT_DTYPE, SIM_FAULT_HASH};
static const sim_dx_fault_t v2_copies[] = {SIM_FAULT_NOSIG, SIM_FAULT_TYPENOTFIRST,
                                           SIM_FAULT_NESTING, SIM_FAULT_DIMS,
                                           SIM_FAULT_SHORT, SIM_FAULT_ALGORITHM};

static int series(dx_t *dx, uint64_t sid, uint64_t *g, uint64_t *t0, beam_diag_t *d) {
  const sim_opts_t *o = dx->o;
  uint64_t now = beam_realtime_ns();
  memcpy(dx->prev_uid, dx->uid, sizeof dx->uid);
  make_uid(dx->uid, now / 1000000u, o->seed, sid);
  make_date(dx->date, now);
  if (dx->bank->pca) /* each series draws from its own streams, as in tx.c */
    sim_pca_series_start(dx->bank->pca);
  if (dx->v2) {
    if (v2_start(dx, sid, d) < 0 || (o->dx_jfj && v2_calibration(dx, sid, d) < 0))
      return -1;
  } else {
    if (has(dx, SIM_FAULT_BEFORE_HEADER)) {
      /* Frame 0 of this series before its header: the bank's first window
       * (frame 0 itself for the static patterns). */
      if (dx_frame(dx, 0, dx->bank->data, d) < 0 ||
          v1_image(dx, sid, 0, SIM_FAULT_COUNT_, d) < 0)
        return -1;
      faulted(dx, SIM_FAULT_BEFORE_HEADER);
    }
    if (v1_header(dx, sid, d) < 0)
      return -1;
  }
  dx->st->series++;
  uint64_t mid = o->frames / 2;
  for (uint64_t f = 0; f < o->frames && !tool_stop; f++, (*g)++) {
    if (o->rate > 0) {
      if (!*t0)
        *t0 = beam_now_ns();
      sleep_until(*t0 + (uint64_t)((double)*g * 1e9 / o->rate));
      if (tool_stop)
        break;
    }
    if (dx_frame(dx, f, NULL, d) < 0)
      return -1;
    if (f == mid) {
      if (has(dx, SIM_FAULT_STALE)) {
        /* A late image of the previous series, well formed otherwise. */
        char old[27];
        if (dx->prev_uid[0])
          memcpy(old, dx->prev_uid, sizeof old);
        else
          make_uid(old, now / 1000000u, o->seed, sid - 1);
        if ((dx->v2 ? v2_image(dx, sid - 1, old, f, SIM_FAULT_COUNT_, d)
                    : v1_image(dx, sid - 1, f, SIM_FAULT_COUNT_, d)) < 0)
          return -1;
        faulted(dx, SIM_FAULT_STALE);
      }
      const sim_dx_fault_t *cp = dx->v2 ? v2_copies : v1_copies;
      for (size_t i = 0; i < 6; i++) {
        if (!has(dx, cp[i]))
          continue;
        if ((dx->v2 ? v2_image(dx, sid, dx->uid, f, (int)cp[i], d)
                    : v1_image(dx, sid, f, (int)cp[i], d)) < 0)
          return -1;
        faulted(dx, cp[i]);
      }
      if (has(dx, SIM_FAULT_GAP)) {
        dx->faults[SIM_FAULT_GAP]++; /* frame number f is never sent */
        continue;
      }
    }
    if ((dx->v2 ? v2_image(dx, sid, dx->uid, f, SIM_FAULT_COUNT_, d)
                : v1_image(dx, sid, f, SIM_FAULT_COUNT_, d)) < 0)
      return -1;
    uint64_t t = dx->st->t_last_ns;
    if (!dx->st->frames_sent)
      dx->st->t_first_frame_ns = t;
    dx->st->t_last_frame_ns = t;
    dx->st->frames_sent++;
  }
  /* A DCU ends every series it armed, an interrupted one too. */
  return dx->v2 ? v2_end(dx, sid, d) : v1_end(dx, sid, d);
}

static void summary(const dx_t *dx) {
  fprintf(stderr, "{\"protocol\":\"%s\",\"series\":%llu,\"frames_sent\":%llu,\"messages\":%llu,"
                  "\"bytes\":%llu,\"faults\":{",
          proto_name(dx->o->protocol), (unsigned long long)dx->st->series,
          (unsigned long long)dx->st->frames_sent, (unsigned long long)dx->messages,
          (unsigned long long)dx->st->bytes);
  int first = 1;
  for (int k = 0; k < SIM_FAULT_COUNT_; k++)
    if (dx->o->dx_faults >> k & 1u) {
      fprintf(stderr, "%s\"%s\":%llu", first ? "" : ",", fault_tab[k].name,
              (unsigned long long)dx->faults[k]);
      first = 0;
    }
  fprintf(stderr, "}}\n");
  fflush(stderr);
}

int sim_dectris_run(void *sock, const sim_opts_t *o, sim_bank_t *bank, sim_stats_t *st,
                    beam_diag_t *d) {
  dx_t dx;
  int rc = dx_init(&dx, sock, o, bank, st, d);
  uint64_t g = 0, t0 = 0;
  for (uint64_t s = 0; rc == 0 && s < o->nseries && !tool_stop; s++)
    rc = series(&dx, o->series_id0 + s, &g, &t0, d);
  summary(&dx);
  dx_destroy(&dx);
  return rc < 0 ? -1 : 0;
}
