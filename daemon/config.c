/* The daemon's configuration: the top-level schema tables, loading a file or
 * a string (parse, validate, cross-check the stage graph), and the typed
 * beam_config_t the rest of the daemon reads.
 *
 * Every error from every step is collected before the load is refused, so a
 * user sees all of them at once. The stage list is validated here rather
 * than by the generic validator because each item's schema depends on its
 * `kind`, and because the graph checks (unique names, existing inputs, no
 * cycles) need every stage at once. etc/beamd.yaml documents every key of
 * these tables; tests/unit/test_config_sanity.c keeps the two in step. */
#include "daemon/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/err.h"
#include "daemon/input.h"
#include "pipeline/stage.h"

/* A configuration is a few kilobytes; anything this large is a mistake. */
#define CONFIG_MAX_BYTES (16u << 20)

static const char *metrics_listen_valid(const beam_cnode_t *v) {
  const char *s = v->scalar;
  static const char *why =
      "expected host:port (for example 127.0.0.1:9464), or \"\" to turn metrics off";
  if (!s || !s[0])
    return NULL;
  if (strlen(s) >= sizeof ((beam_config_t *)0)->metrics.listen)
    return "longer than 127 characters";
  const char *colon = strrchr(s, ':');
  if (!colon || colon == s || !colon[1])
    return why;
  if (s[0] == '[' ? colon[-1] != ']' : memchr(s, ':', (size_t)(colon - s)) != NULL)
    return why; /* a bare IPv6 address needs brackets */
  for (const char *p = s; p < colon; p++)
    if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') && !(*p >= '0' && *p <= '9') &&
        !strchr(".-_[]:*", *p))
      return why;
  char *end;
  errno = 0;
  long port = strtol(colon + 1, &end, 10);
  if (*end || errno || port < 1 || port > 65535 || colon[1] == '+' || colon[1] == '-')
    return "the port must be 1..65535";
  return NULL;
}

static const beam_param_t output_params[] = {
    {"publish", BEAM_P_ENDPOINT, "tcp://127.0.0.1:5600", 0, 0, 0, NULL, NULL,
     "PUB endpoint (bound) for viewers: lossy, slow subscribers lose messages; \"\" = none",
     NULL},
    {"push", BEAM_P_ENDPOINT, "", 0, 0, 0, NULL, NULL,
     "PUSH endpoint (bound) for lossless consumers (recorder, next daemon); \"\" = none", NULL},
    {"hwm", BEAM_P_INT, "1000", 0, 0, 10000000, NULL, NULL,
     "send high-water mark of the PUB (messages); 0 = no limit", NULL},
    {"push_hwm", BEAM_P_INT, "1000", 0, 0, 10000000, NULL, NULL,
     "send high-water mark of the PUSH (messages); 0 = no limit", NULL},
    {"pub_buffer", BEAM_P_SIZE, "256Mi", 0, 0, 1099511627776.0, NULL, NULL,
     "bytes of result copies the PUB may hold for slow subscribers; beyond it results are "
     "dropped for the PUB (counted), never held", NULL},
    {"push_copy_buffer", BEAM_P_SIZE, "32Mi", 0, 0, 1099511627776.0, NULL, NULL,
     "bytes of small-result copies (16 KiB or less each) the PUSH may hold queued; beyond it "
     "results are sent without a copy, holding their stage's output slots", NULL},
    {"drain_timeout", BEAM_P_DURATION, "30s", 0, 0, 86400, NULL, NULL,
     "on shutdown, how long results wait for a PUSH consumer before they are dropped", NULL},
    {"publish_frames_meta", BEAM_P_BOOL, "true", 0, 0, 0, NULL, NULL,
     "republish each series' SERIES_START and SERIES_END on the outputs", NULL},
    {"karabo", BEAM_P_MAP, NULL, 0, 0, 0, NULL, beamd_karabo_out_params,
     "results served as a Karabo bridge 2.2 server (daemon/karabo_out.c, docs/karabo.md)", NULL},
    BEAM_PARAM_END};

static const beam_param_t pool_params[] = {
    {"frames", BEAM_P_INT, "128", 0, 1, 1048576, NULL, NULL, "input frame slots", NULL},
    {"frame_bytes", BEAM_P_SIZE, "16Mi", 0, 1024, 4294967296.0, NULL, NULL,
     "bytes per slot: the largest decoded frame", NULL},
    {"pinned", BEAM_P_ENUM, "auto", 0, 0, 0, "auto|yes|no", NULL,
     "page-locked slots for fast GPU copies; auto = when a stage runs on CUDA", NULL},
    {"prefault", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "write every slot once at start-up so no frame pays first-touch page faults", NULL},
    {"decode_threads", BEAM_P_INT, "0", 0, 0, 64, NULL, NULL,
     "threads decoding compressed input frames ahead of the stages; 0 = each frame on the "
     "first stage thread that reads it", NULL},
    BEAM_PARAM_END};

static const beam_param_t control_params[] = {
    {"endpoint", BEAM_P_ENDPOINT, "tcp://127.0.0.1:5601", 0, 0, 0, NULL, NULL,
     "REP endpoint (bound) for status, stats, reload, stop; \"\" = none", NULL},
    BEAM_PARAM_END};

static const beam_param_t metrics_params[] = {
    {"listen", BEAM_P_STRING, "127.0.0.1:9464", 0, 0, 0, NULL, NULL,
     "host:port of the HTTP /metrics endpoint (Prometheus); \"\" = off", metrics_listen_valid},
    {"token_file", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "file holding the bearer token a scraper must send (Authorization: Bearer ...); needed "
     "on a non-loopback listen address unless insecure", NULL},
    {"insecure", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "serve /metrics on a non-loopback address without a token, on purpose", NULL},
    BEAM_PARAM_END};

static const beam_param_t log_params[] = {
    {"level", BEAM_P_ENUM, "info", 0, 0, 0, "emerg|alert|crit|err|warning|notice|info|debug",
     NULL, "least severe level logged (syslog levels)", NULL},
    {"rate_limit", BEAM_P_FLOAT, "10", 0, 0.01, 1e6, NULL, NULL,
     "per-frame messages per second, per kind; the rest are counted as suppressed", NULL},
    BEAM_PARAM_END};

const beam_param_t beam_config_params[] = {
    {"input", BEAM_P_MAP, NULL, 0, 0, 0, NULL, beamd_input_params, "the frame source", NULL},
    {"output", BEAM_P_MAP, NULL, 0, 0, 0, NULL, output_params, "the result sockets", NULL},
    {"pool", BEAM_P_MAP, NULL, 0, 0, 0, NULL, pool_params, "the input frame pool", NULL},
    {"control", BEAM_P_MAP, NULL, 0, 0, 0, NULL, control_params, "the control socket", NULL},
    {"metrics", BEAM_P_MAP, NULL, 0, 0, 0, NULL, metrics_params, "Prometheus metrics", NULL},
    {"log", BEAM_P_MAP, NULL, 0, 0, 0, NULL, log_params, "logging", NULL},
    {"curve", BEAM_P_MAP, NULL, 0, 0, 0, NULL, beam_config_curve_params,
     "this daemon's CURVE keys, for endpoints with curve: true", NULL},
    {"heartbeat", BEAM_P_DURATION, "1s", 0, 0.05, 60, NULL, NULL,
     "period of stats publishing, systemd STATUS= and metrics refresh", NULL},
    {"stages", BEAM_P_ANY, NULL, 0, 0, 0, NULL, NULL,
     "the processing stages; each item's keys depend on its kind", NULL},
    BEAM_PARAM_END};

static const char default_yaml[] =
    "# beamd built-in configuration (used when beamd runs without -c).\n"
    "input:\n"
    "  mode: live\n"
    "  endpoint: tcp://127.0.0.1:5500\n"
    "output:\n"
    "  publish: tcp://127.0.0.1:5600\n"
    "control:\n"
    "  endpoint: tcp://127.0.0.1:5601\n"
    "metrics:\n"
    "  listen: 127.0.0.1:9464\n"
    "pool:\n"
    "  frames: 128\n"
    "  frame_bytes: 16Mi\n"
    "stages:\n"
    "  - name: corr\n"
    "    kind: correct\n"
    "    publish: false   # full corrected frames stay inside; previews go out\n"
    "  - name: vd\n"
    "    kind: roi_sum\n"
    "    input: corr\n"
    "    rois:\n"
    "      - {name: bf, shape: disk, radius: 16}\n"
    "      - {name: adf, shape: annulus, radii: [32, 128]}\n"
    "  - name: preview\n"
    "    kind: preview\n"
    "    input: corr\n"
    "    rate: 2\n";

const char *beam_config_default_yaml(void) { return default_yaml; }

/* ---- stages ------------------------------------------------------------------ */

typedef struct st_s {
  const beam_cnode_t *map;
  const char *name; /* NULL when the stage has no usable name */
  const beam_cnode_t *name_node, *input_node;
  int in; /* index of the input stage, -1 for frames or unknown */
} st_t;

static void known_kinds(char *out, size_t cap) {
  const beam_stage_kind_t *const *k = beam_stage_kinds();
  size_t o = 0;
  out[0] = '\0';
  for (size_t i = 0; k[i] && o + 2 < cap; i++)
    o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? ", " : "", k[i]->kind);
}

static void known_stages(char *out, size_t cap, const st_t *st, size_t n, size_t self) {
  size_t o = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n && o + 2 < cap; i++)
    if (st[i].name && i != self)
      o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? ", " : "", st[i].name);
}

/* Context for a stage's messages: its name when it has a valid one. */
static void stage_ctx(char *out, size_t cap, const beam_cnode_t *item, size_t i) {
  const beam_cnode_t *nm = beam_cfg_get(item, "name");
  if (nm && nm->kind == BEAM_CN_SCALAR && nm->scalar && !beam_stage_name_valid(nm))
    snprintf(out, cap, "stage \"%s\"", nm->scalar);
  else
    snprintf(out, cap, "stages[%zu]", i);
}

/* Follows inputs from stage s; reports a cycle once, at the stage of the
 * cycle that comes first in the file. */
static int check_cycle(const st_t *st, size_t n, size_t s, beam_cfg_errs_t *errs) {
  size_t cur = s, steps = 0;
  while (st[cur].in >= 0 && steps <= n) {
    cur = (size_t)st[cur].in;
    steps++;
    if (cur == s)
      break;
  }
  if (cur != s || steps < 2) /* steps 1 is a self-reference, reported apart */
    return 0;
  /* s is on a cycle: report only from its first member in file order. */
  for (size_t c = (size_t)st[s].in; c != s; c = (size_t)st[c].in)
    if (c < s)
      return 0;
  /* Inputs point upstream; print the data flow, which runs the other way. */
  size_t chain[64], k = 0;
  chain[k++] = s;
  for (size_t c = (size_t)st[s].in; c != s && k < 63; c = (size_t)st[c].in)
    chain[k++] = c;
  char path[1024];
  size_t o = (size_t)snprintf(path, sizeof path, "%s", st[s].name);
  for (size_t i = k; i-- > 1 && o + 8 < sizeof path;)
    o += (size_t)snprintf(path + o, sizeof path - o, " -> %s", st[chain[i]].name);
  snprintf(path + o, sizeof path - o, " -> %s", st[s].name);
  beam_cfg_err(errs, st[s].input_node, "stage \"%s\".input: cycle in the stage graph: %s",
               st[s].name, path);
  return 1;
}

static int validate_stages(beam_cnode_t *root, beam_cfg_errs_t *errs) {
  int nerr = 0;
  beam_cnode_t *seq = (beam_cnode_t *)beam_cfg_get(root, "stages");
  if (!seq) {
    beam_cnode_t *empty = beam_cnode_new(BEAM_CN_SEQ, root->file, 0, 0);
    if (!empty || beam_cnode_map_add(root, "stages", 0, 0, empty) < 0) {
      beam_cfg_err_at(errs, root->file, 0, 0, "out of memory");
      return 1;
    }
    return 0;
  }
  if (seq->kind != BEAM_CN_SEQ) {
    beam_cfg_err(errs, seq, "stages: expected a list of stages, got %s",
                 seq->kind == BEAM_CN_MAP ? "a map" : "a scalar");
    return 1;
  }
  st_t *st = calloc(seq->n ? seq->n : 1, sizeof *st);
  if (!st) {
    beam_cfg_err_at(errs, root->file, 0, 0, "out of memory");
    return 1;
  }
  char ctx[128], list[512];
  for (size_t i = 0; i < seq->n; i++) {
    beam_cnode_t *item = seq->items[i];
    st[i].in = -1;
    if (item->kind != BEAM_CN_MAP) {
      beam_cfg_err(errs, item, "stages[%zu]: expected a map with name and kind, got %s", i,
                   item->kind == BEAM_CN_SEQ ? "a list" : "a scalar");
      nerr++;
      continue;
    }
    stage_ctx(ctx, sizeof ctx, item, i);
    /* Names count for the graph checks even when the stage has other
     * problems, so one bad stage does not cascade into "no stage named"
     * messages for the stages that read from it. Invalid names are reported
     * by the schema's is_valid and left out here. */
    const beam_cnode_t *nm = beam_cfg_get(item, "name");
    if (nm && nm->kind == BEAM_CN_SCALAR && nm->scalar && !beam_stage_name_valid(nm)) {
      st[i].name = nm->scalar;
      st[i].name_node = nm;
    }
    const beam_cnode_t *kn = beam_cfg_get(item, "kind");
    if (!kn) {
      beam_cfg_err(errs, item, "%s: missing required key \"kind\"", ctx);
      nerr++;
      continue;
    }
    if (kn->kind != BEAM_CN_SCALAR || !kn->scalar) {
      beam_cfg_err(errs, kn, "%s.kind: expected a string", ctx);
      nerr++;
      continue;
    }
    const beam_stage_kind_t *k = beam_stage_kind_find(kn->scalar);
    if (!k) {
      known_kinds(list, sizeof list);
      beam_cfg_err(errs, kn, "%s.kind: unknown stage kind \"%.60s\" (known kinds: %s)", ctx,
                   kn->scalar, list);
      nerr++;
      continue;
    }
    int kerr = beam_cfg_validate(item, k->params, ctx, errs);
    nerr += kerr;
    if (kerr == 0 && k->check)
      nerr += k->check(item, errs);
    st[i].map = item;
    const beam_cnode_t *in = beam_cfg_get(item, "input");
    if (in && in->typed)
      st[i].input_node = in;
  }
  /* Unique names. */
  for (size_t i = 0; i < seq->n; i++)
    for (size_t j = 0; st[i].name && j < i; j++)
      if (st[j].name && !strcmp(st[i].name, st[j].name)) {
        beam_cfg_err(errs, st[i].name_node,
                     "stage \"%s\".name: duplicate stage name (first at %d:%d)", st[i].name,
                     st[j].name_node->line, st[j].name_node->col);
        nerr++;
        st[i].name = NULL; /* its edges would be ambiguous */
        break;
      }
  /* Inputs: frames, a stage, or stage.output. */
  for (size_t i = 0; i < seq->n; i++) {
    if (!st[i].name || !st[i].input_node)
      continue;
    const char *in = st[i].input_node->scalar;
    if (!strcmp(in, "frames"))
      continue;
    const char *dot = strchr(in, '.');
    size_t len = dot ? (size_t)(dot - in) : strlen(in);
    if (dot && !dot[1]) {
      beam_cfg_err(errs, st[i].input_node,
                   "stage \"%s\".input: \"%.60s\" names no output after the dot", st[i].name,
                   in);
      nerr++;
      continue;
    }
    size_t j;
    for (j = 0; j < seq->n; j++)
      if (st[j].name && strlen(st[j].name) == len && !strncmp(st[j].name, in, len))
        break;
    if (j == i) {
      beam_cfg_err(errs, st[i].input_node,
                   "stage \"%s\".input: a stage cannot take its own output as input",
                   st[i].name);
      nerr++;
    } else if (j == seq->n) {
      known_stages(list, sizeof list, st, seq->n, i);
      beam_cfg_err(errs, st[i].input_node,
                   "stage \"%s\".input: no stage named \"%.*s\" (expected \"frames\"%s%s, or "
                   "<stage>.<output>)",
                   st[i].name, (int)(len > 60 ? 60 : len), in, list[0] ? " or one of " : "",
                   list);
      nerr++;
    } else {
      st[i].in = (int)j;
    }
  }
  for (size_t i = 0; i < seq->n; i++)
    if (st[i].name && st[i].in >= 0)
      nerr += check_cycle(st, seq->n, i, errs);
  free(st);
  return nerr;
}

/* ---- typed struct ---------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const char *s) {
  snprintf(dst, cap, "%s", s ? s : "");
}

/* The address of an endpoint key, whichever form it was written in. */
static void copy_ep(char *dst, size_t cap, const beam_cnode_t *map, const char *key) {
  beam_cfg_endpoint_t ep;
  beam_cfg_endpoint(beam_cfg_get(map, key), &ep);
  copy_str(dst, cap, ep.address);
}

static int fill(beam_config_t *c, beam_cfg_errs_t *errs) {
  const beam_cnode_t *r = c->root;
  const beam_cnode_t *in = beam_cfg_get(r, "input"), *out = beam_cfg_get(r, "output");
  const beam_cnode_t *pool = beam_cfg_get(r, "pool"), *ctl = beam_cfg_get(r, "control");
  const beam_cnode_t *met = beam_cfg_get(r, "metrics"), *log = beam_cfg_get(r, "log");
  /* ENUM values carry their index in ival; the tables list them in the
   * order of the C enums (input mode, syslog level). */
  c->input.mode = (beam_input_mode_t)beam_cfg_int(in, "mode", BEAM_IN_LIVE);
  copy_ep(c->input.endpoint, sizeof c->input.endpoint, in, "endpoint");
  c->input.bind = beam_cfg_bool(in, "bind", 0);
  c->input.hwm = (int)beam_cfg_int(in, "hwm", 1000);
  c->input.node = in;
  const beam_cnode_t *rt = beam_cfg_get(in, "result_topic");
  copy_str(c->input.result_topic, sizeof c->input.result_topic, beam_cfg_str(in, "result_topic"));
  if (c->input.result_topic[0] && c->input.mode != BEAM_IN_LIVE &&
      c->input.mode != BEAM_IN_PULL) {
    beam_cfg_err(errs, rt, "input.result_topic: only for input.mode live or pull (the beamd "
                           "protocol inputs)");
    return BEAM_ECONFIG;
  }
  copy_ep(c->output.publish, sizeof c->output.publish, out, "publish");
  copy_ep(c->output.push, sizeof c->output.push, out, "push");
  c->output.hwm = (int)beam_cfg_int(out, "hwm", 1000);
  c->output.push_hwm = (int)beam_cfg_int(out, "push_hwm", 1000);
  c->output.publish_frames_meta = beam_cfg_bool(out, "publish_frames_meta", 1);
  c->output.drain_timeout_s = beam_cfg_float(out, "drain_timeout", 30.0);
  c->output.pub_buffer = (uint64_t)beam_cfg_int(out, "pub_buffer", 256 << 20);
  c->output.push_copy_buffer = (uint64_t)beam_cfg_int(out, "push_copy_buffer", 32 << 20);
  c->pool.frames = (unsigned)beam_cfg_int(pool, "frames", 128);
  c->pool.frame_bytes = (uint64_t)beam_cfg_int(pool, "frame_bytes", 16 << 20);
  copy_ep(c->control.endpoint, sizeof c->control.endpoint, ctl, "endpoint");
  copy_str(c->metrics.listen, sizeof c->metrics.listen, beam_cfg_str(met, "listen"));
  c->log.level = (int)beam_cfg_int(log, "level", 6);
  c->log.rate_limit = beam_cfg_float(log, "rate_limit", 10);
  c->heartbeat_s = beam_cfg_float(r, "heartbeat", 1.0);

  const beam_cnode_t *seq = beam_cfg_get(r, "stages");
  c->nstages = beam_cfg_len(seq);
  if (c->nstages) {
    c->stages = calloc(c->nstages, sizeof *c->stages);
    if (!c->stages) {
      beam_cfg_err_at(errs, c->path, 0, 0, "out of memory");
      return BEAM_ENOMEM;
    }
  }
  int may_cuda = 0;
  for (size_t i = 0; i < c->nstages; i++) {
    const beam_cnode_t *s = beam_cfg_at(seq, i);
    beam_stage_spec_t *sp = &c->stages[i];
    sp->name = beam_cfg_str(s, "name");
    sp->kind = beam_cfg_str(s, "kind");
    sp->input = beam_cfg_str(s, "input");
    sp->backend = beam_cfg_str(s, "backend");
    sp->thread = beam_cfg_str(s, "thread");
    sp->publish = beam_cfg_bool(s, "publish", 1);
    sp->queue = (unsigned)beam_cfg_int(s, "queue", 32);
    sp->node = s;
    if (sp->backend && strcmp(sp->backend, "cpu"))
      may_cuda = 1;
  }
  /* auto: pin only when some stage may run on CUDA (the allocator further
   * falls back to ordinary memory when there is no device). */
  const char *pinned = beam_cfg_str(pool, "pinned");
  c->pool.pinned = pinned && !strcmp(pinned, "yes") ? 1
                   : pinned && !strcmp(pinned, "no") ? 0
                                                     : may_cuda;
  c->pool.pin_auto = !pinned || !strcmp(pinned, "auto");
  c->pool.prefault = beam_cfg_bool(pool, "prefault", 0);
  c->pool.decode_threads = (unsigned)beam_cfg_int(pool, "decode_threads", 0);
  return 0;
}

void beam_config_free(beam_config_t **c) {
  if (!c || !*c)
    return;
  beam_cnode_free((*c)->root);
  free((*c)->stages);
  free((*c)->path);
  free(*c);
  *c = NULL;
}

int beam_config_load_string(const char *text, size_t len, const char *name,
                            beam_config_t **out, beam_cfg_errs_t *errs) {
  BEAM_ASSERT(out);
  *out = NULL;
  beam_config_t *c = calloc(1, sizeof *c);
  if (!c || !(c->path = strdup(name ? name : "<string>"))) {
    free(c);
    beam_cfg_err_at(errs, name ? name : "<string>", 0, 0, "out of memory");
    return BEAM_ECONFIG;
  }
  /* The tree's nodes point at c->path for their file name. */
  c->root = beam_yaml_parse(text, len, c->path, errs);
  if (!c->root)
    goto fail;
  int nerr = beam_cfg_validate(c->root, beam_config_params, "", errs);
  if (c->root->kind != BEAM_CN_MAP)
    goto fail;
  nerr += validate_stages(c->root, errs);
  if (nerr)
    goto fail;
  if (fill(c, errs) < 0 || beam_config_security(c, errs) > 0)
    goto fail;
  *out = c;
  return 0;
fail:
  beam_config_free(&c);
  return BEAM_ECONFIG;
}

int beam_config_load_file(const char *path, beam_config_t **out, beam_cfg_errs_t *errs) {
  BEAM_ASSERT(out && path);
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    beam_cfg_err_at(errs, path, 0, 0, "cannot open: %s", strerror(errno));
    return BEAM_ECONFIG;
  }
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      if (cap >= CONFIG_MAX_BYTES) {
        beam_cfg_err_at(errs, path, 0, 0, "file is larger than %u MiB; not a configuration",
                        CONFIG_MAX_BYTES >> 20);
        goto fail;
      }
      cap = cap ? cap * 2 : 16384;
      char *b = realloc(buf, cap + 1);
      if (!b) {
        beam_cfg_err_at(errs, path, 0, 0, "out of memory");
        goto fail;
      }
      buf = b;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (r == 0) {
      if (ferror(f)) {
        beam_cfg_err_at(errs, path, 0, 0, "cannot read: %s", strerror(errno));
        goto fail;
      }
      break;
    }
  }
  fclose(f);
  buf[n] = '\0';
  int rc = beam_config_load_string(buf, n, path, out, errs);
  free(buf);
  return rc;
fail:
  fclose(f);
  free(buf);
  return BEAM_ECONFIG;
}
