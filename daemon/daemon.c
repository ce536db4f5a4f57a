/* The daemon's life cycle: start-up in dependency order, the loop, reload
 * (validate, build, swap at a series boundary, keep the old graph on any
 * error) and drain (finish everything in flight, publish, exit 0).
 *
 * Everything here runs on the loop thread except the graph hooks at the
 * top, which run on stage workers and only enqueue and wake the loop. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "daemon/beamd.h"
#include "daemon/notify.h"
#include "pipeline/device.h"

enum { RQ_RESULT = 1, RQ_SERIES_DONE = 2 };
static void heartbeat_cb(uv_timer_t *t);
#define INPUT_DRAIN_GRACE_NS 1000000000ull  /* lossless drain: read what ZeroMQ holds */


/* ---- result queue: workers -> loop ---------------------------------------- */

static void rq_push(beamd_t *d, const beamd_rq_item_t *it) {
  pthread_mutex_lock(&d->rq.mu);
  int was_empty = d->rq.q.count == 0;
  int rc = beam_fifo_push(&d->rq.q, it);
  pthread_mutex_unlock(&d->rq.mu);
  /* A few dozen bytes per item at most twice the largest backlog; failing
   * here would lose a result silently, so stop loudly instead. */
  BEAM_ASSERT(rc == 0);
  /* wake_cb pops until the queue is empty, so items behind others are
   * taken by the wake-up the first one sent. */
  if (was_empty)
    uv_async_send(&d->wake);
}

static int rq_pop(beamd_t *d, beamd_rq_item_t *it) {
  pthread_mutex_lock(&d->rq.mu);
  int ok = beam_fifo_pop(&d->rq.q, it);
  pthread_mutex_unlock(&d->rq.mu);
  return ok;
}

static size_t rq_count(beamd_t *d) {
  pthread_mutex_lock(&d->rq.mu);
  size_t n = d->rq.q.count;
  pthread_mutex_unlock(&d->rq.mu);
  return n;
}

/* ---- graph hooks (worker threads) -------------------------------------------- */

static void hook_result(void *ctx, beam_frame_t *f) {
  beamd_rq_item_t it = {.kind = RQ_RESULT, .frame = f};
  rq_push(ctx, &it);
}

static void hook_series_done(void *ctx, beam_series_t *s, int aborted) {
  beamd_rq_item_t it = {.kind = RQ_SERIES_DONE, .series = s, .aborted = aborted};
  rq_push(ctx, &it);
}

static void hook_room(void *ctx) {
  beamd_t *d = ctx;
  atomic_store(&d->room_flag, 1);
  uv_async_send(&d->wake);
}

static void hook_error(void *ctx, const char *stage, uint64_t sid, uint64_t fid, const char *msg) {
  beamd_t *d = ctx;
  beam_log_rl(&d->stage_rl, LOG_WARNING, "stage \"%s\" series %llu frame %llu: %s", stage,
              (unsigned long long)sid, (unsigned long long)fid, msg);
}

static void hook_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  BEAM_LOG(level, "%s", msg);
}

static void hook_finished(void *ctx) {
  beamd_t *d = ctx;
  atomic_store(&d->graph_finished, 1);
  uv_async_send(&d->wake);
}

const beam_graph_hooks_t beamd_graph_hooks_template = {
    .on_result = hook_result,
    .on_series_done = hook_series_done,
    .on_room = hook_room,
    .on_error = hook_error,
    .on_log = hook_log,
    .on_finished = hook_finished,
};

void beamd_wake(beamd_t *d) { uv_async_send(&d->wake); }

/* ---- graph construction and swapping --------------------------------------- */

static int build_graph(beamd_t *d, const beam_config_t *cfg, beam_graph_t **out, char *err,
                       size_t errlen) {
  beam_graph_hooks_t hooks = beamd_graph_hooks_template;
  hooks.ctx = d;
  int pinned = cfg->pool.pinned;
  beam_graph_params_t gp = {.pool_frames = cfg->pool.frames,
                            .frame_bytes = cfg->pool.frame_bytes,
                            .pinned = pinned,
                            .pin_auto = cfg->pool.pin_auto,
                            .slot_user_bytes = sizeof(zmq_msg_t),
                            .prefault = cfg->pool.prefault,
                            .decode_threads = cfg->pool.decode_threads};
  beam_diag_t diag = {0};
  int rc = beam_graph_new(out, cfg->stages, cfg->nstages, &gp, &hooks, &diag);
  if (rc < 0)
    snprintf(err, errlen, "%s", diag.msg[0] ? diag.msg : beam_strerror(rc));
  return rc;
}

static void park_draining(beamd_t *d, beam_graph_t *g, beam_config_t *cfg) {
  beam_graph_shutdown(g);
  for (int i = 0; i < BEAMD_MAX_DRAINING; i++)
    if (!d->draining[i].graph) {
      d->draining[i].graph = g;
      d->draining[i].cfg = cfg;
      d->ndraining++;
      return;
    }
  /* More than BEAMD_MAX_DRAINING reloads within one drain: wait here. Its
   * workers only need the publisher for output slots, which a short block
   * cannot starve for long because pools are per series and this graph has
   * no open series. */
  beam_graph_destroy(&g);
  beam_config_free(&cfg);
}

static void reap_draining(beamd_t *d) {
  for (int i = 0; i < BEAMD_MAX_DRAINING; i++)
    if (d->draining[i].graph && beam_graph_finished(d->draining[i].graph)) {
      beam_graph_destroy(&d->draining[i].graph);
      beam_config_free(&d->draining[i].cfg);
      d->ndraining--;
    }
}

static void apply_runtime_settings(beamd_t *d) {
  beam_log_set_level(d->cfg->log.level);
  beamd_publish_budgets(d);
  beam_ratelimit_init(&d->stage_rl, d->cfg->log.rate_limit);
  uint64_t hb = (uint64_t)(d->cfg->heartbeat_s * 1000.0);
  uv_timer_stop(&d->heartbeat);
  uv_timer_start(&d->heartbeat, heartbeat_cb, hb, hb);
}

static void swap_graph(beamd_t *d) {
  beam_graph_t *old = d->graph;
  beam_config_t *old_cfg = d->cfg;
  d->graph = d->next_graph;
  d->cfg = d->next_cfg;
  d->next_graph = NULL;
  d->next_cfg = NULL;
  d->reloads++;
  beam_graph_batch(old, 0); /* its stages must see every frame it was given */
  park_draining(d, old, old_cfg);
  apply_runtime_settings(d);
  BEAM_LOG(LOG_NOTICE, "reload: new pipeline is live (%zu stages)", d->cfg->nstages);
}

beam_graph_t *beamd_graph_for_start(beamd_t *d) {
  if (d->next_graph && !beam_graph_series_open(d->graph))
    swap_graph(d);
  return d->graph;
}

/* Socket settings are bound once; a reload that changes them is refused
 * rather than half-applied. */
static int same_tree(const beam_cnode_t *a, const beam_cnode_t *b) {
  char *x = beam_cfg_dump(a), *y = beam_cfg_dump(b);
  int same = x && y && strcmp(x, y) == 0;
  free(x);
  free(y);
  return same;
}

static int same_key(const beam_config_t *a, const beam_config_t *b, const char *sec,
                    const char *key) {
  const beam_cnode_t *x = beam_cfg_get(a->root, sec), *y = beam_cfg_get(b->root, sec);
  if (key) {
    x = beam_cfg_get(x, key);
    y = beam_cfg_get(y, key);
  }
  return (!x && !y) || (x && y && same_tree(x, y));
}

static const char *socket_change(const beam_config_t *a, const beam_config_t *b) {
  /* The whole input section: every source's keys shape its sockets. */
  if (!same_tree(a->input.node, b->input.node))
    return "input";
  /* Endpoints in either form: their security settings are the socket's. */
  if (!same_key(a, b, "output", "publish") || !same_key(a, b, "output", "push") ||
      a->output.hwm != b->output.hwm || a->output.push_hwm != b->output.push_hwm ||
      !beamd_karabo_same(a, b))
    return "output";
  if (!same_key(a, b, "control", "endpoint"))
    return "control";
  if (!same_key(a, b, "metrics", NULL))
    return "metrics";
  /* The keys; the allow-list directory's contents are read again anyway. */
  if (!same_key(a, b, "curve", NULL))
    return "curve";
  return NULL;
}

/* The key pair, and the ZAP handler before any CURVE server socket binds. */
static int security_open(beamd_t *d, char *err, size_t errlen) {
  const beam_config_t *c = d->cfg;
  beam_diag_t wd = {0};
  if (c->curve.secret_key[0]) {
    if (beam_cert_load(c->curve.secret_key, &d->cert, 1, &wd) != 0) {
      snprintf(err, errlen, "curve.secret_key: %s", wd.msg);
      return BEAM_ECONFIG;
    }
    d->curve_ready = 1;
  }
  if (c->curve.any_server) {
    if (!(d->zap = beam_zap_start(d->zctx, c->curve.allow, &wd))) {
      snprintf(err, errlen, "curve.allow: %s", wd.msg);
      return BEAM_ECONFIG;
    }
  }
  return 0;
}

int beamd_reload(beamd_t *d, beam_cfg_errs_t *errs, char *err, size_t errlen) {
  if (d->state != BEAMD_RUNNING) {
    snprintf(err, errlen, "not running (draining)");
    return BEAM_ESTATE;
  }
  if (!d->cfg_path) {
    snprintf(err, errlen, "running on the built-in default configuration: nothing to reload "
                          "(start beamd with -c FILE)");
    BEAM_LOG(LOG_WARNING, "reload: %s", err);
    return BEAM_ESTATE;
  }
  beam_notify_reloading();
  if (d->zap) {
    beam_diag_t wd = {0};
    if (beam_zap_reload(d->zap, &wd) != 0)
      BEAM_LOG(LOG_ERR, "reload: curve.allow kept as it was: %s", wd.msg);
  }
  BEAM_LOG(LOG_NOTICE, "reload: reading %s", d->cfg_path);
  beam_config_t *ncfg = NULL;
  int rc = beam_config_load_file(d->cfg_path, &ncfg, errs);
  const char *what = NULL;
  beam_graph_t *ng = NULL;
  if (rc < 0) {
    /* One line per error, every one of them: the journal is where an
     * operator who typed `systemctl reload` looks, and a list cut short
     * means another edit-reload round per hidden error. */
    for (size_t i = 0; i < errs->n; i++)
      BEAM_LOG(LOG_ERR, "%s", errs->msgs[i]);
    if (errs->n > 1)
      snprintf(err, errlen, "%zu errors (each logged above), the first: %s", errs->n,
               errs->msgs[0]);
    else
      snprintf(err, errlen, "%s", errs->n ? errs->msgs[0] : "configuration error");
  } else if ((what = socket_change(d->cfg, ncfg))) {
    snprintf(err, errlen, "%s: changing the %s section needs a restart; reload refused", d->cfg_path,
             what);
    rc = BEAM_ECONFIG;
  } else {
    rc = build_graph(d, ncfg, &ng, err, errlen);
  }
  if (rc < 0) {
    d->reload_failures++;
    snprintf(d->last_reload_error, sizeof d->last_reload_error, "%s", err);
    BEAM_LOG(LOG_ERR, "reload refused, the running pipeline is unchanged: %s", err);
    beam_config_free(&ncfg);
    beam_notify_ready();
    return rc < 0 ? rc : BEAM_ECONFIG;
  }
  if (d->next_graph) {
    /* An earlier reload still waiting for its series boundary: replaced. */
    park_draining(d, d->next_graph, d->next_cfg);
    d->next_graph = NULL;
    d->next_cfg = NULL;
  }
  d->next_graph = ng;
  d->next_cfg = ncfg;
  d->last_reload_error[0] = 0;
  if (!beam_graph_series_open(d->graph)) {
    swap_graph(d);
    snprintf(err, errlen, "reloaded");
  } else {
    snprintf(err, errlen, "reload validated; the new pipeline starts at the next series boundary");
    BEAM_LOG(LOG_NOTICE, "reload: %s", err);
  }
  beam_notify_ready();
  return 0;
}

/* ---- drain and exit -------------------------------------------------------------- */

static void close_all(beamd_t *d);

static int drain_complete(beamd_t *d) {
  return !d->graph && d->ndraining == 0 && rq_count(d) == 0 && beamd_publish_backlog(d) == 0;
}

static void maybe_finish(beamd_t *d) {
  if (d->state != BEAMD_DRAINING)
    return;
  if (d->graph && beam_graph_finished(d->graph))
    beam_graph_destroy(&d->graph);
  reap_draining(d);
  if (!d->push.discard && beamd_publish_backlog(d) &&
      beam_now_ns() - d->drain_started_ns > (uint64_t)(d->cfg->output.drain_timeout_s * 1e9)) {
    BEAM_LOG(LOG_ERR, "drain: no PUSH consumer took %d waiting results within output.drain_timeout "
                      "(%.0f s); dropping them and what is still being produced",
             beamd_publish_backlog(d), d->cfg->output.drain_timeout_s);
    beamd_publish_discard(d);
  }
  if (!drain_complete(d))
    return;
  BEAM_LOG(LOG_NOTICE, "drained: %llu frames in, %llu results out; exiting",
           (unsigned long long)atomic_load(&d->in.frames), (unsigned long long)atomic_load(&d->pub.results));
  d->state = BEAMD_STOPPED;
  close_all(d);
}

void beamd_input_eof(beamd_t *d, const char *why) { beamd_drain(d, why); }

void beamd_input_drained(beamd_t *d) {
  if (d->in.stopped)
    return;
  d->in.drain_read = 0;
  if (d->in.series)
    atomic_fetch_add(&d->in.series_aborted, 1);
  beamd_ingest_stop(d);
  if (d->next_graph) {
    park_draining(d, d->next_graph, d->next_cfg);
    d->next_graph = NULL;
    d->next_cfg = NULL;
  }
  /* Ends an open series as aborted so stages publish final results. */
  beam_graph_shutdown(d->graph);
}

static void drain_timer_cb(uv_timer_t *t) {
  beamd_t *d = t->data;
  if (d->in.drain_read && beam_now_ns() - d->drain_started_ns > INPUT_DRAIN_GRACE_NS)
    beamd_input_drained(d);
  maybe_finish(d);
}

void beamd_drain(beamd_t *d, const char *why) {
  if (d->state != BEAMD_RUNNING)
    return;
  BEAM_LOG(LOG_NOTICE, "draining: %s", why);
  beam_notify_stopping();
  d->state = BEAMD_DRAINING;
  d->drain_started_ns = beam_now_ns();
  uv_timer_start(&d->drain_timer, drain_timer_cb, 50, 50);
  /* A lossless push source reads what ZeroMQ already took from the
   * sender; the others stop at once (input.h, drain). */
  if (!beamd_ingest_drain(d))
    beamd_input_drained(d);
}

/* ---- loop callbacks ---------------------------------------------------------------- */

static void wake_cb(uv_async_t *a) {
  beamd_t *d = a->data;
  beamd_rq_item_t it;
  while (rq_pop(d, &it)) {
    if (it.kind == RQ_RESULT) {
      beamd_publish_result(d, it.frame);
    } else {
      beamd_publish_series(d, it.series, BEAM_MSG_SERIES_END, it.aborted);
      BEAM_LOG(LOG_INFO, "series %llu done%s", (unsigned long long)it.series->series_id,
               it.aborted ? " (aborted)" : "");
      beam_series_unref(&it.series);
    }
  }
  beamd_publish_flush(d);
  if (atomic_exchange(&d->room_flag, 0))
    beamd_ingest_resume(d);
  if (atomic_exchange(&d->graph_finished, 0)) {
    reap_draining(d);
    maybe_finish(d);
  }
}

static void heartbeat_cb(uv_timer_t *t) {
  beamd_t *d = t->data;
  uint64_t now = beam_now_ns();
  uint64_t frames = atomic_load(&d->in.frames), results = atomic_load(&d->pub.results),
           bytes = atomic_load(&d->in.bytes);
  if (d->last_hb_ns) {
    double dt = (double)(now - d->last_hb_ns) * 1e-9;
    d->rate_fps = (double)(frames - d->last_frames) / dt;
    d->rate_rps = (double)(results - d->last_results) / dt;
    d->rate_mbps = (double)(bytes - d->last_bytes) / dt / 1e6;
  }
  d->last_hb_ns = now;
  d->last_frames = frames;
  d->last_results = results;
  d->last_bytes = bytes;
  d->push_stalled_s = beamd_publish_stall(d, now);
  beamd_metrics_render(d);
  char *js = beamd_stats_json(d, 0);
  if (js) {
    beamd_publish_stats(d, js);
    free(js);
  }
  uint64_t drops = atomic_load(&d->in.lost) + atomic_load(&d->in.dropped_busy);
  char stall[160] = "";
  if (d->push_stalled_s > 0)
    snprintf(stall, sizeof stall, "BLOCKED %.0f s on output.push (no consumer), ", d->push_stalled_s);
  beam_notify_status("%s%s: %.1f frames/s, %.1f MB/s, %.1f results/s, %llu dropped, %llu malformed",
                     stall, d->state == BEAMD_RUNNING ? "running" : "draining", d->rate_fps, d->rate_mbps,
                     d->rate_rps, (unsigned long long)drops,
                     (unsigned long long)atomic_load(&d->in.malformed));
}

static void watchdog_cb(uv_timer_t *t) {
  (void)t;
  beam_notify_watchdog();
}

/* The loop's check phase: a PUSH peer may have become writable without an
 * event we were polling for (ZMQ_FD is edge-triggered and shared). */
static void check_cb(uv_check_t *c) {
  beamd_t *d = c->data;
  if (beamd_publish_backlog(d))
    beamd_publish_flush(d);
}

static void signal_cb(uv_signal_t *s, int signum) {
  beamd_t *d = s->data;
  if (signum == SIGHUP) {
    beam_cfg_errs_t errs = {0};
    char err[1024];
    beamd_reload(d, &errs, err, sizeof err);
    beam_cfg_errs_free(&errs);
    return;
  }
  if (d->state == BEAMD_DRAINING) {
    BEAM_LOG(LOG_WARNING, "second %s while draining: exiting now, frames in flight are lost",
             strsignal(signum));
    d->exit_code = 1;
    d->state = BEAMD_STOPPED;
    close_all(d);
    return;
  }
  beamd_drain(d, strsignal(signum));
}

/* ---- start-up and shutdown ------------------------------------------------------------ */

int beamd_init(beamd_t *d, beam_config_t *cfg, const char *cfg_path, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  d->cfg = cfg;
  d->cfg_path = cfg_path;
  d->state = BEAMD_STARTING;
  d->started_ns = beam_now_ns();
  beam_hist_reset(&d->e2e);
  pthread_mutex_init(&d->rq.mu, NULL);
  beam_fifo_init(&d->rq.q, sizeof(beamd_rq_item_t));
  uv_loop_init(&d->loop);
  d->zctx = zmq_ctx_new();
  if (!d->zctx) {
    snprintf(err, errlen, "zmq_ctx_new: %s", zmq_strerror(errno));
    return BEAM_EIO;
  }
  uv_async_init(&d->loop, &d->wake, wake_cb);
  d->wake.data = d;
  /* Every handle close_all may close is initialised here, before anything
   * can fail, so a failed start-up tears down cleanly. */
  uv_timer_init(&d->loop, &d->heartbeat);
  d->heartbeat.data = d;
  uv_timer_init(&d->loop, &d->watchdog);
  d->watchdog.data = d;
  uv_timer_init(&d->loop, &d->drain_timer);
  d->drain_timer.data = d;
  uv_check_init(&d->loop, &d->check);
  d->check.data = d;
  uv_check_start(&d->check, check_cb);
  uv_signal_init(&d->loop, &d->sig_term);
  uv_signal_init(&d->loop, &d->sig_int);
  uv_signal_init(&d->loop, &d->sig_hup);
  d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
  uv_signal_start(&d->sig_term, signal_cb, SIGTERM);
  uv_signal_start(&d->sig_int, signal_cb, SIGINT);
  uv_signal_start(&d->sig_hup, signal_cb, SIGHUP);
  apply_runtime_settings(d);

  /* Order: stages (files, devices) first, then outputs, control and
   * metrics, and the input last, so no frame arrives before the pipeline
   * can take it. Any failure leaves nothing running. */
  int rc;
  if ((rc = build_graph(d, cfg, &d->graph, err, errlen)) < 0 ||
      (rc = security_open(d, err, errlen)) < 0 ||
      (rc = beamd_publish_open(d, err, errlen)) < 0 || (rc = beamd_control_open(d, err, errlen)) < 0 ||
      (rc = beamd_metrics_open(d, err, errlen)) < 0 || (rc = beamd_ingest_open(d, err, errlen)) < 0)
    return rc;
  uint64_t wd = beam_notify_watchdog_usec();
  if (wd)
    uv_timer_start(&d->watchdog, watchdog_cb, 0, wd / 2000 ? wd / 2000 : 1);
  d->state = BEAMD_RUNNING;
  beamd_metrics_render(d);
  char gpu[256];
  beam_gpu_describe(gpu, sizeof gpu);
  BEAM_LOG(LOG_NOTICE, "beamd %s ready: config %s, input %s %s (%s), publish %s%s%s, control %s, metrics %s, gpu %s",
           BEAMD_VERSION, cfg->path, d->in.src->mode,
           cfg->input.endpoint, cfg->input.bind ? "bind" : "connect",
           cfg->output.publish[0] ? cfg->output.publish : "off", cfg->output.push[0] ? ", push " : "",
           cfg->output.push, cfg->control.endpoint[0] ? cfg->control.endpoint : "off",
           cfg->metrics.listen[0] ? cfg->metrics.listen : "off", gpu);
  beam_notify_ready();
  return 0;
}

static void close_cb_noop(uv_handle_t *h) { (void)h; }

static void close_all(beamd_t *d) {
  beamd_ingest_close(d);
  beamd_control_close(d);
  beamd_metrics_close(d);
  beamd_publish_unwatch(d); /* sockets stay open so queued results can leave */
  uv_timer_stop(&d->heartbeat);
  uv_timer_stop(&d->watchdog);
  uv_timer_stop(&d->drain_timer);
  uv_check_stop(&d->check);
  uv_handle_t *hs[] = {(uv_handle_t *)&d->wake,      (uv_handle_t *)&d->heartbeat,
                       (uv_handle_t *)&d->watchdog,  (uv_handle_t *)&d->drain_timer,
                       (uv_handle_t *)&d->check,     (uv_handle_t *)&d->sig_term,
                       (uv_handle_t *)&d->sig_int,   (uv_handle_t *)&d->sig_hup};
  for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
    if (!uv_is_closing(hs[i]))
      uv_close(hs[i], close_cb_noop);
}

int beamd_run(beamd_t *d) {
  uv_run(&d->loop, UV_RUN_DEFAULT);
  return d->exit_code;
}

void beamd_fini(beamd_t *d) {
  if (d->state != BEAMD_STOPPED) {
    /* Start-up failed part way: stop what was started, in reverse. */
    d->state = BEAMD_STOPPED;
    close_all(d);
  }
  if (d->graph) {
    /* Workers may wait for output slots the publisher would free: drain
     * results while joining is not possible here, so release them first. */
    beam_graph_shutdown(d->graph);
    while (!beam_graph_finished(d->graph)) {
      beamd_rq_item_t it;
      while (rq_pop(d, &it))
        it.kind == RQ_RESULT ? beam_frame_unref(it.frame) : beam_series_unref(&it.series);
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    beam_graph_destroy(&d->graph);
  }
  if (d->next_graph) {
    beam_graph_destroy(&d->next_graph);
    beam_config_free(&d->next_cfg);
  }
  for (int i = 0; i < BEAMD_MAX_DRAINING; i++)
    if (d->draining[i].graph) {
      beam_graph_destroy(&d->draining[i].graph);
      beam_config_free(&d->draining[i].cfg);
    }
  beamd_rq_item_t it;
  while (rq_pop(d, &it))
    it.kind == RQ_RESULT ? beam_frame_unref(it.frame) : beam_series_unref(&it.series);
  /* Let queued PUB messages leave (viewers get the final results). */
  beamd_publish_close(d, 2000);
  uv_run(&d->loop, UV_RUN_NOWAIT);
  uv_loop_close(&d->loop);
  free(d->src_garbage);
  beam_zap_stop(&d->zap);
  if (d->zctx)
    zmq_ctx_term(d->zctx);
  free(d->kout_garbage);
  beam_fifo_free(&d->rq.q);
  pthread_mutex_destroy(&d->rq.mu);
  if (d->cfg != NULL)
    beam_config_free(&d->cfg);
}
