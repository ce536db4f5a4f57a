/* Renders every counter in Prometheus text format 0.0.4. Counters end in
 * _total, gauges do not; stage metrics carry stage/kind/backend labels. */
#include <stdarg.h>
#include <string.h>

#include "daemon/beamd.h"

typedef struct sbuf_s {
  char *p;
  size_t len, cap;
  int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...) {
  if (b->oom)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->oom = 1;
      return;
    }
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t ncap = (b->cap ? b->cap * 2 : 8192) + (size_t)n;
    char *np = realloc(b->p, ncap);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = ncap;
  }
}

static void metric(sbuf_t *b, const char *name, const char *type, const char *help, double v) {
  sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

#define A(x) ((double)atomic_load(&(x)))

void beamd_metrics_render(beamd_t *d) {
  sbuf_t b = {0};
  beamd_ingest_t *in = &d->in;
  metric(&b, "beamd_up", "gauge", "1 while running, 0 while draining", d->state == BEAMD_RUNNING);
  metric(&b, "beamd_uptime_seconds", "gauge", "seconds since start",
         (double)(beam_now_ns() - d->started_ns) * 1e-9);
  metric(&b, "beamd_input_messages_total", "counter", "messages received", A(in->messages));
  metric(&b, "beamd_input_frames_total", "counter", "frames accepted into the pipeline", A(in->frames));
  metric(&b, "beamd_input_bytes_total", "counter", "payload bytes accepted", A(in->bytes));
  metric(&b, "beamd_input_series_total", "counter", "series started", A(in->series_started));
  metric(&b, "beamd_input_malformed_total", "counter", "malformed messages dropped", A(in->malformed));
  metric(&b, "beamd_input_lost_total", "counter", "messages missing from the sequence (live gaps)", A(in->lost));
  metric(&b, "beamd_input_gaps_total", "counter", "sequence gaps", A(in->gaps));
  metric(&b, "beamd_input_dropped_busy_total", "counter", "live frames dropped because the pipeline was full",
         A(in->dropped_busy));
  metric(&b, "beamd_input_unknown_series_total", "counter", "frames for a series that never started",
         A(in->unknown_series));
  metric(&b, "beamd_input_shape_mismatch_total", "counter", "frames whose geometry differs from the series",
         A(in->shape_mismatch));
  metric(&b, "beamd_input_too_large_total", "counter", "frames larger than pool.frame_bytes", A(in->too_large));
  metric(&b, "beamd_input_missing_total", "counter",
         "frames a source knows never came (detector frame-number gaps, short series)",
         A(in->missing));
  metric(&b, "beamd_input_upstream_missing_total", "counter",
         "frames an upstream daemon reported missing (input.result_topic)", A(in->upstream_missing));
  metric(&b, "beamd_input_other_topics_total", "counter",
         "results of other topics skipped (input.result_topic)", A(in->other_topics));
  metric(&b, "beamd_input_corrupt_total", "counter",
         "frames that arrived marked CORRUPT (undecodable at the source; their results are NaN)",
         A(in->corrupt));
  const beam_series_t *cur = beamd_ingest_series(d);
  metric(&b, "beamd_series_missing_frames", "gauge",
         "frames the open series has lost so far (0 without one)",
         cur ? (double)cur->missing_frames : 0.0);
  if (in->src && in->src->progress && in->src_state) {
    uint64_t done = 0, expected = 0;
    in->src->progress(in->src_state, &done, &expected);
    metric(&b, "beamd_input_progress_frames", "gauge", "frames the source has asked for or served so far",
           (double)done);
    metric(&b, "beamd_input_expected_frames", "gauge", "frames the source will serve in all (0: unknown)",
           (double)expected);
  }
  metric(&b, "beamd_input_paused", "gauge", "1 while lossless input waits for room", in->paused);
  metric(&b, "beamd_input_rate_fps", "gauge", "frames per second over the last heartbeat", d->rate_fps);
  if (d->zap) {
    beam_zap_counts_t z;
    beam_zap_counts(d->zap, &z);
    metric(&b, "beam_curve_keys", "gauge", "client keys in the CURVE allow-list", (double)z.keys);
    metric(&b, "beam_curve_accepted_total", "counter", "CURVE handshakes with a listed key",
           (double)z.accepted);
    metric(&b, "beam_curve_refused_key_total", "counter", "CURVE clients refused: key not listed",
           (double)z.denied_key);
    metric(&b, "beam_curve_refused_handshake_total", "counter",
           "clients refused in the handshake: plaintext, wrong server key, not CURVE",
           (double)(z.handshake_failed + z.denied_other));
  }
  metric(&b, "beamd_metrics_refused_total", "counter", "metrics requests without the bearer token",
         A(d->met.denied));
  if (d->graph) {
    metric(&b, "beamd_pool_free", "gauge", "free input slots", beam_graph_input_free(d->graph));
    metric(&b, "beamd_pool_slots", "gauge", "input slots", beam_graph_input_slots(d->graph));
  }
  metric(&b, "beamd_results_total", "counter", "results published", A(d->pub.results));
  metric(&b, "beamd_publish_messages_total", "counter", "messages sent on the PUB", A(d->pub.messages));
  metric(&b, "beamd_push_messages_total", "counter", "messages sent on the PUSH", A(d->push.messages));
  uint64_t kb_served, kb_dropped;
  beamd_karabo_counters(d, &kb_served, &kb_dropped);
  metric(&b, "beamd_karabo_served_total", "counter", "results served on output.karabo",
         (double)kb_served);
  metric(&b, "beamd_karabo_dropped_total", "counter",
         "results output.karabo dropped (replaced before a request, over its buffer, no peer)",
         (double)kb_dropped);
  metric(&b, "beamd_push_backlog", "gauge", "messages waiting for a PUSH consumer", beamd_publish_backlog(d));
  metric(&b, "beamd_publish_dropped_total", "counter",
         "results the PUB dropped (slow subscribers, over output.pub_buffer)", A(d->pub.dropped));
  metric(&b, "beamd_push_dropped_total", "counter",
         "results the PUSH dropped (drain timeout with no consumer, out of memory)", A(d->push.dropped));
  double blocked = (double)d->push.blocked_ns * 1e-9;
  if (d->push.blocked_since)
    blocked += (double)(beam_now_ns() - d->push.blocked_since) * 1e-9;
  metric(&b, "beamd_push_blocked_seconds_total", "counter",
         "time the PUSH held messages a consumer had not taken", blocked);
  metric(&b, "beamd_push_stalled_seconds", "gauge",
         "how long no PUSH consumer has taken a message while some wait (0: flowing)",
         d->push_stalled_s);
  metric(&b, "beamd_reloads_total", "counter", "successful reloads", (double)d->reloads);
  metric(&b, "beamd_reload_failures_total", "counter", "refused reloads", (double)d->reload_failures);
  sb_printf(&b, "# HELP beamd_latency_seconds frame received -> result sent\n# TYPE beamd_latency_seconds summary\n");
  static const double qs[] = {0.5, 0.9, 0.99};
  for (int i = 0; i < 3; i++)
    sb_printf(&b, "beamd_latency_seconds{quantile=\"%g\"} %.9g\n", qs[i], beam_hist_quantile(&d->e2e, qs[i]) * 1e-9);
  sb_printf(&b, "beamd_latency_seconds_sum %.9g\n", (double)atomic_load(&d->e2e.sum_ns) * 1e-9);
  sb_printf(&b, "beamd_latency_seconds_count %llu\n", (unsigned long long)beam_hist_count(&d->e2e));
  size_t n = d->graph ? beam_graph_nstages(d->graph) : 0;
  static const char *const names[] = {"frames_in", "frames_out", "results", "rejected", "errors"};
  for (int k = 0; k < 5; k++) {
    sb_printf(&b, "# HELP beamd_stage_%s_total per-stage %s\n# TYPE beamd_stage_%s_total counter\n", names[k],
              names[k], names[k]);
    for (size_t i = 0; i < n; i++) {
      beam_stage_stats_t s;
      beam_graph_stage_stats(d->graph, i, &s);
      uint64_t v[] = {s.frames_in, s.frames_out, s.results, s.rejected, s.errors};
      sb_printf(&b, "beamd_stage_%s_total{stage=\"%s\",kind=\"%s\",backend=\"%s\"} %llu\n", names[k], s.name,
                s.kind, s.backend, (unsigned long long)v[k]);
    }
  }
  sb_printf(&b, "# HELP beamd_stage_queue_depth frames waiting in front of a stage\n# TYPE beamd_stage_queue_depth gauge\n");
  for (size_t i = 0; i < n; i++) {
    beam_stage_stats_t s;
    beam_graph_stage_stats(d->graph, i, &s);
    sb_printf(&b, "beamd_stage_queue_depth{stage=\"%s\"} %u\n", s.name, s.queue_depth);
  }
  sb_printf(&b, "# HELP beamd_stage_process_seconds time per frame inside a stage\n# TYPE beamd_stage_process_seconds summary\n");
  for (size_t i = 0; i < n; i++) {
    beam_stage_stats_t s;
    beam_graph_stage_stats(d->graph, i, &s);
    for (int q = 0; q < 3; q++)
      sb_printf(&b, "beamd_stage_process_seconds{stage=\"%s\",quantile=\"%g\"} %.9g\n", s.name, qs[q],
                beam_hist_quantile(s.latency, qs[q]) * 1e-9);
    sb_printf(&b, "beamd_stage_process_seconds_sum{stage=\"%s\"} %.9g\n", s.name,
              (double)atomic_load(&s.latency->sum_ns) * 1e-9);
    sb_printf(&b, "beamd_stage_process_seconds_count{stage=\"%s\"} %llu\n", s.name,
              (unsigned long long)beam_hist_count(s.latency));
  }
  if (b.oom) {
    free(b.p);
    return; /* keep the previous page */
  }
  free(d->met.text);
  d->met.text = b.p;
  d->met.len = b.len;
}
