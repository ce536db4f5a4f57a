/* Sources live and pull: beamd protocol messages over one ZeroMQ socket,
 * SUB (live: lossy, gaps counted from sequence numbers) or PULL (pull:
 * lossless, the sender blocks when beamd is full). The reading itself is
 * zread.c's; each message goes to the ingest core as it is. */
#include <string.h>

#include <zmq.h>

#include "daemon/beamd.h"

static void handle(beamd_zread_t *zr, const beam_part_t *parts, size_t n, uint64_t t_recv) {
  (void)t_recv; /* the core stamps beamd protocol frames itself */
  beamd_ingest_parts(zr->d, parts, n);
}

static int zsrc_open(beamd_t *d, void **state, int type, char *err, size_t errlen) {
  beamd_zread_t *zr = calloc(1, sizeof *zr);
  if (!zr) {
    snprintf(err, errlen, "input: out of memory");
    return BEAM_ENOMEM;
  }
  *state = zr;
  zr->handle = handle;
  return beamd_zread_open(d, zr, type, d->cfg->input.endpoint, &d->cfg->input.endpoint_sec,
                          "input.endpoint", d->cfg->input.bind,
                          d->cfg->input.hwm, type == ZMQ_PULL, err, errlen);
}

static int live_open(beamd_t *d, void **st, const beam_cnode_t *c, char *err, size_t el) {
  (void)c;
  return zsrc_open(d, st, ZMQ_SUB, err, el);
}

static int pull_open(beamd_t *d, void **st, const beam_cnode_t *c, char *err, size_t el) {
  (void)c;
  return zsrc_open(d, st, ZMQ_PULL, err, el);
}

static void zsrc_resume(beamd_t *d, void *st) {
  (void)d;
  beamd_zread_read(st);
}

/* Pull: read what ZeroMQ already took from the sender, which counts it as
 * delivered. Live owes nobody anything. */
static int zsrc_drain(beamd_t *d, void *st) {
  (void)d;
  return beamd_zread_drain(st);
}

static void zsrc_stop(beamd_t *d, void *st) {
  (void)d;
  beamd_zread_stop(st);
}

static void zsrc_close(beamd_t *d, void *st) {
  if (!st)
    return;
  beamd_zread_close(st);
  d->src_garbage = st; /* freed once the loop closed its idle handle */
}

const beamd_source_ops_t beamd_src_live = {
    .mode = "live",
    .lossless = 0,
    .open = live_open,
    .resume = zsrc_resume,
    .drain = zsrc_drain,
    .stop = zsrc_stop,
    .close = zsrc_close,
};

const beamd_source_ops_t beamd_src_pull = {
    .mode = "pull",
    .lossless = 1,
    .open = pull_open,
    .resume = zsrc_resume,
    .drain = zsrc_drain,
    .stop = zsrc_stop,
    .close = zsrc_close,
};
