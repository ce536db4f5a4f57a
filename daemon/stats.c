/* Statistics as JSON, for `stats` on the control socket and the beamd.stats
 * topic. Counters are atomics written by the loop and the workers; a
 * snapshot is not a transaction, which is fine for monitoring. */
#include <unistd.h>

#include <jansson.h>

#include "daemon/beamd.h"
#include "pipeline/device.h"

#define U(x) json_integer((json_int_t)atomic_load(&(x)))

static const char *state_name(int s) {
  switch (s) {
  case BEAMD_STARTING: return "starting";
  case BEAMD_RUNNING: return "running";
  case BEAMD_DRAINING: return "draining";
  default: return "stopped";
  }
}

static const char *mode_name(beam_input_mode_t m) {
  const beamd_source_ops_t *s = beamd_source_find(m);
  return s ? s->mode : "?";
}

static json_t *latency(const beam_hist_t *h) {
  json_t *o = json_object();
  json_object_set_new(o, "count", json_integer((json_int_t)beam_hist_count(h)));
  json_object_set_new(o, "p50_us", json_real(beam_hist_quantile(h, 0.50) / 1e3));
  json_object_set_new(o, "p90_us", json_real(beam_hist_quantile(h, 0.90) / 1e3));
  json_object_set_new(o, "p99_us", json_real(beam_hist_quantile(h, 0.99) / 1e3));
  return o;
}

static json_t *input_json(beamd_t *d) {
  beamd_ingest_t *in = &d->in;
  json_t *o = json_object();
  json_object_set_new(o, "mode", json_string(mode_name(d->cfg->input.mode)));
  json_object_set_new(o, "endpoint", json_string(d->cfg->input.endpoint));
  json_object_set_new(o, "messages", U(in->messages));
  json_object_set_new(o, "frames", U(in->frames));
  json_object_set_new(o, "bytes", U(in->bytes));
  json_object_set_new(o, "series", U(in->series_started));
  json_object_set_new(o, "series_aborted", U(in->series_aborted));
  json_object_set_new(o, "malformed", U(in->malformed));
  json_object_set_new(o, "gaps", U(in->gaps));
  json_object_set_new(o, "lost", U(in->lost));
  json_object_set_new(o, "dropped_busy", U(in->dropped_busy));
  json_object_set_new(o, "unknown_series", U(in->unknown_series));
  json_object_set_new(o, "shape_mismatch", U(in->shape_mismatch));
  json_object_set_new(o, "too_large", U(in->too_large));
  json_object_set_new(o, "unexpected", U(in->unexpected));
  json_object_set_new(o, "corrupt", U(in->corrupt));
  json_object_set_new(o, "missing", U(in->missing));
  json_object_set_new(o, "other_topics", U(in->other_topics));
  json_object_set_new(o, "upstream_missing", U(in->upstream_missing));
  json_object_set_new(o, "seq_resets", U(in->seq_resets));
  uint64_t drops = atomic_load(&in->lost) + atomic_load(&in->dropped_busy);
  json_object_set_new(o, "dropped_total", json_integer((json_int_t)drops));
  json_object_set_new(o, "paused", json_boolean(in->paused));
  double paused_s = (double)in->paused_ns * 1e-9;
  if (in->paused)
    paused_s += (double)(beam_now_ns() - in->paused_since) * 1e-9;
  json_object_set_new(o, "paused_s", json_real(paused_s));
  json_object_set_new(o, "decoded_ahead",
                      json_integer(d->graph ? (json_int_t)beam_graph_decoded_ahead(d->graph) : 0));
  json_object_set_new(o, "rate_fps", json_real(d->rate_fps));
  json_object_set_new(o, "rate_mbps", json_real(d->rate_mbps));
  beamd_ingest_stats(d, o);
  if (d->graph) {
    json_object_set_new(o, "pool_free", json_integer(beam_graph_input_free(d->graph)));
    json_object_set_new(o, "pool_slots", json_integer(beam_graph_input_slots(d->graph)));
  }
  return o;
}

static json_t *stages_json(beam_graph_t *g) {
  json_t *a = json_array();
  for (size_t i = 0; g && i < beam_graph_nstages(g); i++) {
    beam_stage_stats_t s;
    beam_graph_stage_stats(g, i, &s);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(s.name));
    json_object_set_new(o, "kind", json_string(s.kind));
    json_object_set_new(o, "backend", json_string(s.backend));
    json_object_set_new(o, "frames_in", json_integer((json_int_t)s.frames_in));
    json_object_set_new(o, "frames_out", json_integer((json_int_t)s.frames_out));
    json_object_set_new(o, "results", json_integer((json_int_t)s.results));
    json_object_set_new(o, "rejected", json_integer((json_int_t)s.rejected));
    json_object_set_new(o, "errors", json_integer((json_int_t)s.errors));
    json_object_set_new(o, "series", json_integer((json_int_t)s.series));
    json_object_set_new(o, "queue_depth", json_integer(s.queue_depth));
    json_object_set_new(o, "queue_cap", json_integer(s.queue_cap));
    json_object_set_new(o, "busy_s", json_real(s.busy_s));
    json_object_set_new(o, "runs_on", s.runs_on ? json_string(s.runs_on) : json_null());
    json_object_set_new(o, "fused", json_integer((json_int_t)s.fused));
    json_object_set_new(o, "latency", latency(s.latency));
    for (unsigned k = 0; k < s.ncounters; k++) /* stage-specific, e.g. record's passthrough */
      json_object_set_new(o, s.counter_names[k], json_integer((json_int_t)s.counters[k]));
    json_array_append_new(a, o);
  }
  return a;
}

static json_t *out_json(beamd_t *d, beamd_out_t *o, const char *endpoint) {
  json_t *j = json_object();
  json_object_set_new(j, "endpoint", json_string(endpoint));
  json_object_set_new(j, "messages", U(o->messages));
  json_object_set_new(j, "bytes", U(o->bytes));
  json_object_set_new(j, "dropped", U(o->dropped));
  if (o->lossless) {
    json_object_set_new(j, "backlog", json_integer(beamd_publish_backlog(d)));
    double blocked = (double)o->blocked_ns * 1e-9;
    if (o->blocked_since)
      blocked += (double)(beam_now_ns() - o->blocked_since) * 1e-9;
    json_object_set_new(j, "blocked_s", json_real(blocked));
    json_object_set_new(j, "stalled_s", json_real(d->push_stalled_s));
  }
  return j;
}

char *beamd_stats_json(beamd_t *d, int pretty) {
  json_t *root = json_object();
  json_object_set_new(root, "version", json_string(BEAMD_VERSION));
  json_object_set_new(root, "state", json_string(state_name(d->state)));
  json_object_set_new(root, "uptime_s", json_real((double)(beam_now_ns() - d->started_ns) * 1e-9));
  json_object_set_new(root, "input", input_json(d));
  json_object_set_new(root, "stages", stages_json(d->graph));
  json_t *outs = json_object();
  if (d->pub.zs.open)
    json_object_set_new(outs, "publish", out_json(d, &d->pub, d->cfg->output.publish));
  if (d->push.zs.open)
    json_object_set_new(outs, "push", out_json(d, &d->push, d->cfg->output.push));
  beamd_karabo_stats(d, outs);
  json_object_set_new(root, "outputs", outs);
  json_object_set_new(root, "results", U(d->pub.results));
  json_object_set_new(root, "results_per_s", json_real(d->rate_rps));
  json_object_set_new(root, "latency", latency(&d->e2e));
  json_t *rl = json_object();
  json_object_set_new(rl, "count", json_integer((json_int_t)d->reloads));
  json_object_set_new(rl, "failures", json_integer((json_int_t)d->reload_failures));
  json_object_set_new(rl, "pending", json_boolean(d->next_graph != NULL));
  json_object_set_new(rl, "last_error", json_string(d->last_reload_error));
  json_object_set_new(root, "reload", rl);
  if (d->zap) {
    beam_zap_counts_t z;
    beam_zap_counts(d->zap, &z);
    json_object_set_new(root, "curve",
                        json_pack("{s:I, s:I, s:I, s:I, s:I}", "keys", (json_int_t)z.keys,
                                  "accepted", (json_int_t)z.accepted, "refused_key",
                                  (json_int_t)z.denied_key, "refused_handshake",
                                  (json_int_t)z.handshake_failed, "refused_other",
                                  (json_int_t)z.denied_other));
  }
  json_object_set_new(root, "metrics_refused", U(d->met.denied));
  char *s = json_dumps(root, pretty ? JSON_INDENT(2) : JSON_COMPACT);
  json_decref(root);
  return s;
}

char *beamd_status_json(beamd_t *d) {
  json_t *root = json_object();
  char gpu[256];
  beam_gpu_describe(gpu, sizeof gpu);
  json_object_set_new(root, "version", json_string(BEAMD_VERSION));
  json_object_set_new(root, "state", json_string(state_name(d->state)));
  json_object_set_new(root, "pid", json_integer((json_int_t)getpid()));
  json_object_set_new(root, "config", json_string(d->cfg->path));
  json_object_set_new(root, "uptime_s", json_real((double)(beam_now_ns() - d->started_ns) * 1e-9));
  json_object_set_new(root, "gpu", json_string(gpu));
  json_object_set_new(root, "input", json_string(d->cfg->input.endpoint));
  json_object_set_new(root, "mode", json_string(mode_name(d->cfg->input.mode)));
  json_object_set_new(root, "publish", json_string(d->cfg->output.publish));
  json_object_set_new(root, "push", json_string(d->cfg->output.push));
  json_t *st = json_array();
  for (size_t i = 0; d->graph && i < beam_graph_nstages(d->graph); i++) {
    beam_stage_stats_t s;
    beam_graph_stage_stats(d->graph, i, &s);
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(s.name));
    json_object_set_new(o, "kind", json_string(s.kind));
    json_object_set_new(o, "backend", json_string(s.backend));
    json_array_append_new(st, o);
  }
  json_object_set_new(root, "stages", st);
  json_object_set_new(root, "series_open", json_boolean(d->graph && beam_graph_series_open(d->graph)));
  json_object_set_new(root, "frames", U(d->in.frames));
  json_object_set_new(root, "rate_fps", json_real(d->rate_fps));
  char *s = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return s;
}
