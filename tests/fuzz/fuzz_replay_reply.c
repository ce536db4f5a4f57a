/* libFuzzer entry for the replay input's reply parser
 * (daemon/replay_reply.c): every reply a beamd-replay server sends goes
 * through it before the daemon maps a file or points a frame at a landing
 * slot (built by `make fuzz`).
 *
 * The input is one byte saying what the request asked (bit 0 info, bit 1
 * map, bits 2-4 the landing slots offered, bits 5-7 their size as 64 << k),
 * then the reply in the .parts layout (parts.h; seeds: tests/fuzz/seeds/
 * replay_reply_*.parts, written by tests/unit/test_replay_reply with
 * RR_SEED_DIR). Each part is an exact-size heap copy, so ASan flags a read
 * past any part, not only the last. What the parser hands the daemon is
 * checked against what the daemon then trusts: messages tile the parts,
 * a landed FRAME had a slot offered that holds it, an in-place one names
 * a file the reply listed; any error carries a reason and its part. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/replay_reply.h"
#include "tests/fuzz/parts.h"

#define MAX_PARTS 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static beam_part_t parts[MAX_PARTS];

static void check_msg(const beamd_rr_t *rr, const beamd_rr_msg_t *m, size_t want_part,
                      unsigned want_frame, size_t n) {
  if (m->part != want_part || m->nparts < 1 || m->nparts > n - m->part) abort();
  size_t k = 1u + m->h.nparts + ((m->h.flags & BEAM_FLAG_META) ? 1u : 0u);
  if (m->nparts != k || m->is_frame != (m->h.type == BEAM_MSG_FRAME)) abort();
  if (m->is_frame && m->frame != want_frame) abort();
  switch (m->src) {
  case BEAMD_RR_INLINE: break;
  case BEAMD_RR_LANDED:
    if (!m->is_frame || !rr->in_shm || m->frame >= rr->ask.noffer ||
        m->h.payload_size > rr->ask.slot_bytes || m->h.nparts != 1 || parts[m->part + 1].size)
      abort();
    break;
  case BEAMD_RR_MAPPED:
    if (!m->is_frame || !rr->ask.map || m->file >= rr->nfiles || m->h.nparts != 1 ||
        parts[m->part + 1].size || m->h.payload_size == 0 || m->off > (uint64_t)INT64_MAX)
      abort();
    break;
  default: abort();
  }
}

/* A start's mask is taken only as one raw part of the frame size, and a
 * refused one says why; nothing else carries one. */
static void check_mask(const beamd_rr_t *rr, const beamd_rr_msg_t *m) {
  if (m->h.type != BEAM_MSG_SERIES_START) {
    if (m->mask != BEAMD_RR_MASK_NONE || m->mask_data) abort();
    return;
  }
  switch (m->mask) {
  case BEAMD_RR_MASK_NONE:
    if (m->mask_data || m->h.nparts) abort();
    break;
  case BEAMD_RR_MASK_BAD:
    if (m->mask_data || !rr->mask_why[0]) abort();
    break;
  case BEAMD_RR_MASK_OK: {
    if (m->h.nparts != 1 || m->h.codec != BEAM_CODEC_RAW || m->h.ndim != 2 ||
        m->mask_data != parts[m->part + 1].data || parts[m->part + 1].size != m->h.raw_size)
      abort();
    size_t ne = (size_t)beam_hdr_nelems(&m->h);
    uint32_t *out = malloc(ne * sizeof *out);
    if (!out || beamd_rr_mask_u32((beam_dtype_t)m->h.dtype, m->mask_data, ne, out) != 0) abort();
    free(out);
    break;
  }
  default: abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  beamd_rr_ask_t ask = {data[0] & 1, (data[0] >> 1) & 1, (data[0] >> 2) & 7,
                        (size_t)64 << (data[0] >> 5)};
  size_t n = fuzz_split_parts(data + 1, size - 1, parts, MAX_PARTS);
  for (size_t i = 0; i < n; i++) {
    void *c = malloc(parts[i].size ? parts[i].size : 1);
    if (!c) abort();
    memcpy(c, parts[i].data, parts[i].size);
    parts[i].data = c;
  }
  beamd_rr_t rr;
  int rc = beamd_rr_parse(&rr, parts, n, &ask);
  if (rc != 0 && rc != -BEAMD_RR_ESTATUS && rc != -BEAMD_RR_EREFUSED) abort();
  if (rc != -rr.err || (rc && !rr.why[0]) || rr.nfiles > BEAMD_RR_FILES_MAX) abort();
  if (rc == 0 && !rr.st.ok) abort();
  for (size_t i = 0; i < rr.nfiles; i++)
    if (!rr.files[i].path || !rr.files[i].name) abort();
  size_t pos = 1;
  unsigned nframe = 0;
  beamd_rr_msg_t m;
  int got;
  while ((got = beamd_rr_next(&rr, &m)) > 0) {
    if (rc || ask.info) abort();
    check_msg(&rr, &m, pos, nframe, n);
    check_mask(&rr, &m);
    pos = m.part + m.nparts;
    nframe += (unsigned)m.is_frame;
  }
  if (got < 0) {
    if (got != -rr.err || !rr.why[0] || !beamd_rr_what(got)[0]) abort();
    if (rc == 0 && (got != -BEAMD_RR_EMSG && got != -BEAMD_RR_EMAP && got != -BEAMD_RR_ESLOT))
      abort();
    if (rc == 0 && rr.err_part != pos) abort(); /* the first part not taken */
    if (beamd_rr_next(&rr, &m) != got) abort(); /* an error stays */
  } else if (rc == 0 && !ask.info && pos != (n > 1 ? n : 1)) {
    abort(); /* the end of the reply, and no part left over */
  }
  beamd_rr_release(&rr);
  for (size_t i = 0; i < n; i++) free((void *)parts[i].data);
  return 0;
}
