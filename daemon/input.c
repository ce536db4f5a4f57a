/* The input side's registry and life cycle (input.h): which source each
 * input.mode is, the input section's schema (common keys, then each
 * source's own sub-table), and the glue the daemon calls (open, resume,
 * drain, stop, close, stats), which only forwards to the source.
 *
 * Adding a source: its file, its line in `sources` below and in the mode
 * enum's choices, and its sub-table here when it has keys of its own. */
#include <string.h>

#include "daemon/beamd.h"

/* In the order of input.mode's choices (and of beam_input_mode_t). */
static const beamd_source_ops_t *const sources[] = {&beamd_src_live, &beamd_src_pull,
                                                    &beamd_src_replay, &beamd_src_dectris,
                                                    &beamd_src_karabo};

const beamd_source_ops_t *beamd_source_find(unsigned mode) {
  return mode < sizeof sources / sizeof sources[0] ? sources[mode] : NULL;
}

/* "" (frames only) or a topic a RESULT may carry (PROTOCOL.md 9). */
static const char *result_topic_valid(const beam_cnode_t *v) {
  const char *t = v->scalar ? v->scalar : "";
  return !t[0] || beam_topic_valid(t, strlen(t))
             ? NULL
             : "expected \"\" or a topic of 1..64 characters [a-z0-9_.-], such as corr.frame";
}

static const char *input_endpoint_valid(const beam_cnode_t *v) {
  beam_cfg_endpoint_t ep;
  return beam_cfg_endpoint(v, &ep) == 0 && ep.address[0] ? NULL : "the input needs an endpoint";
}

const beam_param_t beamd_input_params[] = {
    {"mode", BEAM_P_ENUM, "live", 0, 0, 0, "live|pull|replay|dectris|karabo", NULL,
     "live: SUB to a PUB (lossy, gaps counted); pull: PULL from a PUSH (lossless); "
     "replay: REQ to a replay server (lossless, credit based); dectris: PULL from a DECTRIS "
     "detector's stream (SIMPLON v1 or v2, Jungfraujoch; lossless); karabo: a European XFEL "
     "Karabo bridge server (REQ next, SUB or PULL; input.karabo)", NULL},
    {"endpoint", BEAM_P_ENDPOINT, "tcp://127.0.0.1:5500", 0, 0, 0, NULL, NULL,
     "where frames come from", input_endpoint_valid},
    {"bind", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "bind the endpoint instead of connecting to it", NULL},
    {"hwm", BEAM_P_INT, "1000", 0, 0, 10000000, NULL, NULL,
     "receive high-water mark (messages); 0 = no limit", NULL},
    {"result_topic", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "modes live and pull: take the RESULT messages of this topic (another daemon's output, "
     "<stage>.<output>) as the frames of each series; \"\" = FRAME messages only",
     result_topic_valid},
    {"replay", BEAM_P_MAP, NULL, 0, 0, 0, NULL, beamd_replay_params,
     "mode replay: how beamd asks a replay server for frames", NULL},
    {"dectris", BEAM_P_MAP, NULL, 0, 0, 0, NULL, beamd_dectris_params,
     "mode dectris: the detector stream's format and checks", NULL},
    {"karabo", BEAM_P_MAP, NULL, 0, 0, 0, NULL, beamd_karabo_params,
     "mode karabo: the bridge socket pattern and which array of which source becomes frames",
     NULL},
    BEAM_PARAM_END};

/* ---- the ZeroMQ message owner ------------------------------------------------- */

static void release_zmsg(beam_frame_t *f, void *ctx) {
  (void)ctx;
  zmq_msg_close((zmq_msg_t *)f->user);
}

/* The frame's slot keeps the message in its user storage (sized for a
 * zmq_msg_t); the payload may lie anywhere inside it (a DECTRIS v2 blob is
 * inside its CBOR message). Small messages live inside the zmq_msg_t
 * itself, so the offset is taken before the move and applied after. */
static int zmsg_lend(beam_owner_t *self, const void *data, beam_frame_t *f) {
  beamd_zmsg_owner_t *o = (beamd_zmsg_owner_t *)self;
  const char *base = zmq_msg_data(o->msg);
  size_t off = (size_t)((const char *)data - base);
  if (!f->user || (const char *)data < base || off >= zmq_msg_size(o->msg))
    return 0;
  zmq_msg_t *keep = f->user;
  zmq_msg_init(keep);
  zmq_msg_move(keep, o->msg);
  f->data = (char *)zmq_msg_data(keep) + off;
  f->release = release_zmsg;
  f->release_ctx = NULL;
  self->taken = 1;
  return 1;
}

void beamd_zmsg_owner_init(beamd_zmsg_owner_t *o, zmq_msg_t *msg) {
  o->base.lend = zmsg_lend;
  o->base.taken = 0;
  o->msg = msg;
}

/* ---- life cycle ------------------------------------------------------------------ */

int beamd_ingest_open(beamd_t *d, char *err, size_t errlen) {
  beamd_ingest_t *in = &d->in;
  const beam_config_t *c = d->cfg;
  in->src = beamd_source_find(c->input.mode);
  BEAM_ASSERT(in->src);
  in->scratch_len = c->pool.frame_bytes;
  in->scratch = malloc(in->scratch_len ? in->scratch_len : 1);
  if (!in->scratch) {
    snprintf(err, errlen, "input: cannot allocate %llu bytes of decode scratch",
             (unsigned long long)in->scratch_len);
    return BEAM_ENOMEM;
  }
  beam_ratelimit_init(&in->rl, c->log.rate_limit);
  const beam_cnode_t *conf = c->input.node;
  if (in->src->params)
    conf = beam_cfg_get(conf, in->src->mode);
  return in->src->open(d, &in->src_state, conf, err, errlen);
}

void beamd_ingest_resume(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  if (in->paused) {
    in->paused = 0;
    in->paused_ns += beam_now_ns() - in->paused_since;
  }
  if (in->src && in->src_state)
    in->src->resume(d, in->src_state);
}

int beamd_ingest_drain(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  /* Set first: the source's reads look at it, and it may finish (and call
   * beamd_input_drained, which clears it) before drain returns. */
  in->drain_read = 1;
  if (!in->src || !in->src_state || !in->src->drain(d, in->src_state)) {
    in->drain_read = 0;
    return 0;
  }
  return 1;
}

void beamd_ingest_stop(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  in->stopped = 1;
  if (in->src && in->src_state)
    in->src->stop(d, in->src_state);
  /* An open series is ended as aborted by beam_graph_shutdown; forget it
   * here so a late end of series is not matched against it. */
  beam_series_unref(&in->series);
  beamd__ingest_forget_pending(d);
}

void beamd_ingest_close(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  if (in->src)
    in->src->close(d, in->src_state);
  in->src_state = NULL;
  beam_series_unref(&in->series);
  beamd__ingest_forget_pending(d);
  free(in->scratch);
  in->scratch = NULL;
}

void beamd_ingest_stats(beamd_t *d, void *obj) {
  beamd_ingest_t *in = &d->in;
  if (in->src && in->src_state && in->src->stats)
    in->src->stats(d, in->src_state, obj);
}
