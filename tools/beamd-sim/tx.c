/* beamd-sim sender: builds wire messages (proto/proto.h) and sends them.
 *
 * One sim_tx_t per socket: it owns the per-socket sequence counter, so every
 * well-formed message gets the next number, and malformed ones carry the
 * next number without consuming it (see docs/tools.md). Raw frames of static patterns go out zero-copy from the
 * bank; compressed frames are encoded into a buffer made at start-up and
 * copied into the message.
 */
#include "tools/beamd-sim/sim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

/* Orphan frames use series ids no real series can have (the simulator's
 * ids count up from --series-id and stay far below this); below 2^63 so
 * JSON readers with signed 64-bit integers show them unchanged. */
#define SIM_ORPHAN_SERIES_BASE 0x7bad000000000000ull
#define SIM_BAD_TYPE 0x7fu
#define SIM_BAD_DTYPE 0xeeu
#define SIM_TRUNC_BYTES 60u

/* The bank outlives the socket (the context is terminated first), so
 * ZeroMQ may hold on to bank pointers for as long as it likes. */
static void no_free(void *data, void *hint) {
  (void)data;
  (void)hint;
}

int sim_tx_init(sim_tx_t *self, void *sock, const sim_opts_t *o,
                sim_bank_t *bank, beam_diag_t *d) {
  memset(self, 0, sizeof *self);
  self->sock = sock;
  self->o = o;
  self->bank = bank;
  self->raw_bytes = bank->npix * bank->esize;
  if (!sim_bank_is_static(bank) || o->codec != BEAM_CODEC_RAW) {
    self->frame_buf = malloc(self->raw_bytes);
    if (!self->frame_buf)
      return BEAM_DIAG(d, BEAM_ENOMEM, "frame buffer of %zu bytes", self->raw_bytes);
  }
  if (o->codec != BEAM_CODEC_RAW) {
    self->enc_cap = beam_codec_bound(o->codec, self->raw_bytes, bank->esize);
    self->enc_buf = malloc(self->enc_cap);
    self->scratch = malloc(self->raw_bytes);
    if (!self->enc_buf || !self->scratch)
      return BEAM_DIAG(d, BEAM_ENOMEM, "codec buffers of %zu bytes", self->enc_cap);
  }
  return 0;
}

void sim_tx_destroy(sim_tx_t *self) {
  if (!self)
    return;
  free(self->frame_buf);
  free(self->enc_buf);
  free(self->scratch);
  self->frame_buf = self->enc_buf = self->scratch = NULL;
}

static void account(sim_tx_t *self, size_t bytes) {
  uint64_t now = beam_now_ns();
  if (!self->st.t_first_ns)
    self->st.t_first_ns = now;
  self->st.t_last_ns = now;
  self->st.bytes += bytes;
}

/* Sends one part. EINTR on the first part of a message aborts the message
 * (nothing was queued); on later parts it is retried, because a half-sent
 * multipart message would glue itself onto the next one. */
static int send_copy(sim_tx_t *self, const void *p, size_t n, int more, int first) {
  for (;;) {
    if (zmq_send(self->sock, p, n, more ? ZMQ_SNDMORE : 0) >= 0)
      return 0;
    if (errno != EINTR || first)
      return -1;
  }
}

static int send_msg(sim_tx_t *self, zmq_msg_t *m, int more) {
  for (;;) {
    if (zmq_msg_send(m, self->sock, more ? ZMQ_SNDMORE : 0) >= 0)
      return 0;
    if (errno != EINTR)
      break;
  }
  int e = errno;
  zmq_msg_close(m);
  errno = e;
  return -1;
}

static void hdr_common(sim_tx_t *self, beam_hdr_t *h, unsigned type,
                       uint64_t series_id, uint64_t frame_id) {
  memset(h, 0, sizeof *h);
  h->type = (uint16_t)type;
  h->series_id = series_id;
  h->frame_id = frame_id;
  h->seq = self->seq;
  h->t_send_ns = beam_realtime_ns();
  h->t_acq_ns = h->t_send_ns;
  h->dtype = (uint8_t)self->o->dtype;
  h->ndim = 2;
  h->shape[0] = self->o->h;
  h->shape[1] = self->o->w;
  h->raw_size = self->raw_bytes;
}

static int zmq_fail(beam_diag_t *d, const char *what) {
  int e = errno;
  if (e != EINTR)
    BEAM_DIAG(d, BEAM_EIO, "%s: %s", what, zmq_strerror(e));
  errno = e;
  return -1;
}

/* Header-only message (SERIES_START, SERIES_END) with an optional JSON part. */
static int send_control(sim_tx_t *self, beam_hdr_t *h, const char *meta,
                        beam_diag_t *d) {
  uint8_t buf[BEAM_HDR_SIZE_V1];
  size_t mlen = meta ? strlen(meta) : 0;
  h->codec = BEAM_CODEC_RAW;
  h->nparts = 0;
  h->payload_size = 0;
  if (meta) {
    h->flags |= BEAM_FLAG_META;
    h->meta_size = (uint32_t)mlen;
  }
  int n = beam_hdr_encode(h, buf, sizeof buf);
  if (n < 0)
    return BEAM_DIAG(d, n, "encoding %s header: %s",
                     beam_msg_type_name(h->type), beam_strerror(n)), -1;
  if (send_copy(self, buf, (size_t)n, meta != NULL, 1) < 0)
    return zmq_fail(d, "sending header");
  if (meta && send_copy(self, meta, mlen, 0, 0) < 0)
    return zmq_fail(d, "sending metadata");
  self->seq++;
  account(self, (size_t)n + mlen);
  return 0;
}

double sim_frame_time(const sim_opts_t *o) {
  if (o->frame_time >= 0)
    return o->frame_time;
  return o->rate > 0 ? 1.0 / o->rate : 0.001;
}

static json_t *series_meta(const sim_tx_t *self) {
  const sim_opts_t *o = self->o;
  const sim_bank_t *b = self->bank;
  json_t *m = json_object();
  json_object_set_new(m, "frame_time", json_real(sim_frame_time(o)));
  json_object_set_new(m, "nframes", json_integer((json_int_t)o->frames));
  json_object_set_new(m, "detector", json_string("beamd-sim"));
  json_object_set_new(m, "pattern", json_string(sim_pattern_name(o->pattern)));
  if (o->pattern != SIM_PAT_COUNTER)
    json_object_set_new(m, "mean", json_real(o->mean));
  json_object_set_new(m, "seed", json_integer((json_int_t)o->seed));
  if (o->pattern == SIM_PAT_STEM) {
    json_object_set_new(m, "scan_shape", json_pack("[ii]", (int)b->scan_ny, (int)b->scan_nx));
    json_object_set_new(m, "scan_step", json_real(1e-9));
  }
  if (o->pattern == SIM_PAT_XPCS) {
    json_t *x = sim_xpcs_meta(b->xpcs);
    if (!x) {
      json_decref(m);
      return NULL;
    }
    json_object_set_new(m, "xpcs", x);
  }
  if (o->pattern == SIM_PAT_PCA) {
    json_t *x = sim_pca_meta(b->pca, o->pca_basis_file);
    if (!x) {
      json_decref(m);
      return NULL;
    }
    json_object_set_new(m, "pca", x);
  }
  if (o->pattern == SIM_PAT_PUMPPROBE) {
    json_t *x = sim_pp_meta(b->pp, o);
    if (!x) {
      json_decref(m);
      return NULL;
    }
    /* The per-frame delays at the top level, where a stage's `x: delay`
     * looks (the protocol's per-series list, like scan.positions). */
    json_object_set(m, "delay", json_object_get(x, "delays"));
    json_object_del(x, "delays");
    json_object_set_new(m, "delay_units", json_string("ps"));
    json_object_set_new(m, "pumpprobe", x);
  }
  if (o->pattern == SIM_PAT_PTYCHO && sim_ptycho_meta(b->ptycho, m) < 0) {
    json_decref(m);
    return NULL;
  }
  if (o->meta)
    json_object_update(m, o->meta); /* --meta applied last: it overrides */
  return m;
}

int sim_tx_series_start(sim_tx_t *self, uint64_t series_id, beam_diag_t *d) {
  beam_hdr_t h;
  hdr_common(self, &h, BEAM_MSG_SERIES_START, series_id, 0);
  if (self->bank->pca)
    sim_pca_series_start(self->bank->pca);
  json_t *m = series_meta(self);
  char *s = m ? json_dumps(m, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
  json_decref(m);
  if (!s)
    return BEAM_DIAG(d, BEAM_ENOMEM, "series metadata JSON"), -1;
  int rc = send_control(self, &h, s, d);
  free(s);
  if (rc == 0)
    self->st.series++;
  return rc;
}

int sim_tx_series_end(sim_tx_t *self, uint64_t series_id, uint64_t nframes,
                      int aborted, beam_diag_t *d) {
  beam_hdr_t h;
  hdr_common(self, &h, BEAM_MSG_SERIES_END, series_id, nframes);
  if (aborted)
    h.flags |= BEAM_FLAG_ABORTED;
  return send_control(self, &h, NULL, d);
}

/* Payload of one frame: a pointer that stays valid until exit (zero-copy
 * candidate) or a pointer into frame_buf/enc_buf valid until the next call.
 * *stable tells which. */
static const void *frame_payload(sim_tx_t *self, uint64_t frame_id, beam_hdr_t *h,
                                 size_t *len, int *stable, beam_diag_t *d) {
  int has_pos = 0;
  const void *px = sim_bank_frame(self->bank, frame_id, self->frame_buf, h->pos, &has_pos);
  if (has_pos)
    h->flags |= BEAM_FLAG_POS;
  *stable = sim_bank_is_static(self->bank);
  *len = self->raw_bytes;
  h->codec = (uint8_t)self->o->codec;
  if (self->o->codec == BEAM_CODEC_RAW)
    return px;
  int64_t n = beam_codec_encode(self->o->codec, px, self->raw_bytes, self->bank->esize,
                                self->enc_buf, self->enc_cap, self->scratch);
  if (n < 0) {
    BEAM_DIAG(d, (int)n, "encoding frame %llu with %s: %s", (unsigned long long)frame_id,
              beam_codec_name(self->o->codec), beam_strerror((int)n));
    return NULL;
  }
  *stable = 0;
  *len = (size_t)n;
  return self->enc_buf;
}

/* Sends [header][payload]; the payload zero-copy when it is stable. */
static int send_frame_msg(sim_tx_t *self, const uint8_t *hbuf, size_t hlen,
                          const void *payload, size_t plen, int stable,
                          beam_diag_t *d) {
  if (send_copy(self, hbuf, hlen, 1, 1) < 0)
    return zmq_fail(d, "sending frame header");
  zmq_msg_t m;
  int rc = stable ? zmq_msg_init_data(&m, (void *)payload, plen, no_free, NULL)
                  : zmq_msg_init_size(&m, plen);
  if (rc < 0)
    return zmq_fail(d, "allocating frame message");
  if (!stable)
    memcpy(zmq_msg_data(&m), payload, plen);
  if (send_msg(self, &m, 0) < 0)
    return zmq_fail(d, "sending frame payload");
  account(self, hlen + plen);
  return 0;
}

int sim_tx_frame(sim_tx_t *self, uint64_t series_id, uint64_t frame_id,
                 beam_diag_t *d) {
  beam_hdr_t h;
  uint8_t hbuf[BEAM_HDR_SIZE_V1];
  hdr_common(self, &h, BEAM_MSG_FRAME, series_id, frame_id);
  size_t plen;
  int stable;
  const void *p = frame_payload(self, frame_id, &h, &plen, &stable, d);
  if (!p)
    return -1;
  h.nparts = 1;
  h.payload_size = plen;
  int n = beam_hdr_encode(&h, hbuf, sizeof hbuf);
  if (n < 0)
    return BEAM_DIAG(d, n, "encoding frame header: %s", beam_strerror(n)), -1;
  if (send_frame_msg(self, hbuf, (size_t)n, p, plen, stable, d) < 0)
    return -1;
  self->seq++;
  uint64_t now = self->st.t_last_ns;
  if (!self->st.frames_sent)
    self->st.t_first_frame_ns = now;
  self->st.t_last_frame_ns = now;
  self->st.frames_sent++;
  return 0;
}

/* Malformed kinds, in the order they cycle (docs/tools.md lists them). */
enum {
  MAL_TRUNCATED = 0, /* header part of 60 bytes */
  MAL_BAD_MAGIC,     /* 'B' 'M' 'D' replaced */
  MAL_SHORT_PAYLOAD, /* raw payload one element shorter than the header says */
  MAL_BAD_TYPE,      /* message type 0x7f */
  MAL_ORPHAN,        /* valid FRAME of a series that never started */
  MAL_BAD_DTYPE,     /* dtype byte 0xee */
  MAL_KINDS_
};

int sim_tx_malformed(sim_tx_t *self, uint64_t k, uint64_t series_id,
                     beam_diag_t *d) {
  beam_hdr_t h;
  uint8_t hbuf[BEAM_HDR_SIZE_V1];
  unsigned kind = (unsigned)(k % MAL_KINDS_);
  /* Every kind sends raw bank pixels of frame 0 (always inside the bank,
   * whatever the pattern), so no encoding happens on this path. */
  const void *px = self->bank->data;
  size_t plen = self->raw_bytes;
  if (kind == MAL_ORPHAN)
    series_id = SIM_ORPHAN_SERIES_BASE + k;
  hdr_common(self, &h, BEAM_MSG_FRAME, series_id, kind == MAL_ORPHAN ? 0 : k);
  h.codec = BEAM_CODEC_RAW;
  h.nparts = 1;
  h.payload_size = plen;
  int n = beam_hdr_encode(&h, hbuf, sizeof hbuf);
  if (n < 0)
    return BEAM_DIAG(d, n, "encoding malformed header: %s", beam_strerror(n)), -1;
  size_t hlen = (size_t)n;
  switch (kind) {
  case MAL_TRUNCATED:
    hlen = SIM_TRUNC_BYTES;
    plen = 0;
    break;
  case MAL_BAD_MAGIC:
    memcpy(hbuf + 1, "XYZ", 3);
    break;
  case MAL_SHORT_PAYLOAD:
    plen -= self->bank->esize;
    break;
  case MAL_BAD_TYPE:
    hbuf[8] = SIM_BAD_TYPE;
    hbuf[9] = 0;
    break;
  case MAL_BAD_DTYPE:
    hbuf[56] = SIM_BAD_DTYPE;
    break;
  default:
    break;
  }
  if (kind == MAL_TRUNCATED) {
    if (send_copy(self, hbuf, hlen, 0, 1) < 0)
      return zmq_fail(d, "sending malformed header");
    account(self, hlen);
  } else if (send_frame_msg(self, hbuf, hlen, px, plen, 1, d) < 0) {
    return -1;
  }
  /* Messages a receiver rejects in beam_msg_parse do not consume a sequence
   * number (nothing trustworthy can be read from them). The orphan frame is
   * well-formed on the wire (PROTOCOL.md section 6 numbers every message of
   * any type), so it takes one and receivers see no gap and no restart. */
  if (kind == MAL_ORPHAN)
    self->seq++;
  self->st.malformed_sent++;
  return 0;
}
