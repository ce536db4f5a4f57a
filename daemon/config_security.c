/* The security half of the configuration: which endpoints use CURVE, the
 * daemon's keys, the metrics token, and the rule that nothing other hosts
 * can reach runs in plaintext unless the operator said so.
 *
 * The rule looks at bound endpoints: a bound socket is what a stranger can
 * connect to. A connected one reaches a host the operator named (a
 * detector, an upstream daemon); it may use CURVE but is not refused
 * without it. Every check runs at load, so `beamd --check-config`, start
 * and reload refuse the same files with the same file:line:col. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/config.h"
#include "daemon/curve.h"

const beam_param_t beam_config_curve_params[] = {
    {"secret_key", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "this daemon's secret certificate (zcert NAME_secret or pyzmq NAME.key_secret, made by "
     "beamd-keygen); needed by any endpoint with curve: true", NULL},
    {"allow", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "directory of the public certificates of the clients let in to bound CURVE endpoints "
     "(every file except *_secret; read again on SIGHUP and reload)", NULL},
    BEAM_PARAM_END};

typedef struct ep_ref_s {
  const char *where; /* "control.endpoint" */
  const beam_cnode_t *node;
  int bound;
  beam_ep_sec_t *sec; /* filled here; NULL for endpoints the source reads itself */
} ep_ref_t;

int beam_ep_sec_from_node(const beam_cnode_t *v, beam_ep_sec_t *out) {
  beam_cfg_endpoint_t ep;
  memset(out, 0, sizeof *out);
  int rc = beam_cfg_endpoint(v, &ep);
  out->curve = ep.curve;
  out->insecure = ep.insecure;
  snprintf(out->server_key, sizeof out->server_key, "%s", ep.server_key);
  return rc;
}

static int check_file(const beam_cnode_t *at, const char *what, const char *path, int dir,
                      beam_cfg_errs_t *errs) {
  struct stat st;
  if (stat(path, &st) != 0) {
    beam_cfg_err(errs, at, "%s: %s: %s", what, path, strerror(errno));
    return 1;
  }
  if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
    beam_cfg_err(errs, at, "%s: %s is not a %s", what, path, dir ? "directory" : "file");
    return 1;
  }
  return 0;
}

static int check_cert(const beam_cnode_t *at, const char *what, const char *path, int secret,
                      beam_cfg_errs_t *errs) {
  if (check_file(at, what, path, 0, errs))
    return 1;
  struct stat st;
  /* As ssh does with private keys: a secret others can read is no secret. */
  if (secret && stat(path, &st) == 0 && (st.st_mode & 0007)) {
    beam_cfg_err(errs, at, "%s: %s can be read by every user (mode %03o); chmod 600 it",
                 what, path, (unsigned)(st.st_mode & 0777));
    return 1;
  }
  beam_cert_t c;
  beam_diag_t wd = {0};
  if (beam_cert_load(path, &c, secret, &wd) != 0) {
    beam_cfg_err(errs, at, "%s: %s", what, wd.msg);
    return 1;
  }
  return 0;
}

static int check_endpoint(beam_config_t *c, const ep_ref_t *r, beam_cfg_errs_t *errs) {
  beam_cfg_endpoint_t ep;
  if (!r->node || beam_cfg_endpoint(r->node, &ep) != 0 || !ep.address[0])
    return 0;
  if (r->sec)
    beam_ep_sec_from_node(r->node, r->sec);
  const char *addr = ep.address;
  int tcp = !strncmp(addr, "tcp://", 6);
  if (ep.curve && ep.insecure) {
    beam_cfg_err(errs, ep.node, "%s: curve and insecure together: pick one", r->where);
    return 1;
  }
  if (ep.curve && !tcp) {
    beam_cfg_err(errs, ep.node, "%s: curve is for tcp:// endpoints (%s is local: its file "
                 "permissions protect it)", r->where, addr);
    return 1;
  }
  if (!ep.curve && ep.server_key[0]) {
    beam_cfg_err(errs, ep.node, "%s: server_key without curve: true", r->where);
    return 1;
  }
  if (ep.curve) {
    c->curve.any = 1;
    if (r->bound) {
      c->curve.any_server = 1;
      if (ep.server_key[0]) {
        beam_cfg_err(errs, ep.node, "%s: server_key is for endpoints beamd connects to; a "
                     "bound one is the server (its key is curve.secret_key)", r->where);
        return 1;
      }
    } else if (!ep.server_key[0]) {
      beam_cfg_err(errs, ep.node, "%s: beamd connects here with curve, so it needs the "
                   "server's public certificate: add server_key: FILE", r->where);
      return 1;
    } else {
      return check_cert(ep.node, r->where, ep.server_key, 0, errs);
    }
    return 0;
  }
  if (r->bound && tcp && !ep.insecure && !beam_endpoint_is_loopback(addr)) {
    beam_cfg_err(errs, ep.node,
                 "%s: %s can be reached from other hosts without authentication; write "
                 "{address: %s, curve: true} (with curve.secret_key and curve.allow), or "
                 "insecure: true for a network whose peers cannot do CURVE",
                 r->where, addr, addr);
    return 1;
  }
  return 0;
}

static int metrics_reachable(const char *listen) {
  if (!listen[0])
    return 0;
  char ep[160];
  snprintf(ep, sizeof ep, "tcp://%s", listen);
  return !beam_endpoint_is_loopback(ep);
}

int beam_config_security(beam_config_t *c, beam_cfg_errs_t *errs) {
  const beam_cnode_t *r = c->root;
  const beam_cnode_t *in = beam_cfg_get(r, "input"), *out = beam_cfg_get(r, "output");
  const beam_cnode_t *ctl = beam_cfg_get(r, "control"), *met = beam_cfg_get(r, "metrics");
  const beam_cnode_t *cur = beam_cfg_get(r, "curve");
  int nerr = 0;
  ep_ref_t refs[] = {
      {"input.endpoint", beam_cfg_get(in, "endpoint"), c->input.bind, &c->input.endpoint_sec},
      {"output.publish", beam_cfg_get(out, "publish"), 1, &c->output.publish_sec},
      {"output.push", beam_cfg_get(out, "push"), 1, &c->output.push_sec},
      {"control.endpoint", beam_cfg_get(ctl, "endpoint"), 1, &c->control.endpoint_sec},
  };
  for (size_t i = 0; i < sizeof refs / sizeof refs[0]; i++)
    nerr += check_endpoint(c, &refs[i], errs);
  ep_ref_t kout = {"output.karabo.endpoint",
                   beam_cfg_get(beam_cfg_get(out, "karabo"), "endpoint"), 1, NULL};
  nerr += check_endpoint(c, &kout, errs);
  /* The DECTRIS source's further streams share input.bind. */
  const beam_cnode_t *more = beam_cfg_get(beam_cfg_get(in, "dectris"), "endpoints");
  for (size_t i = 0; i < beam_cfg_len(more); i++) {
    char where[64];
    snprintf(where, sizeof where, "input.dectris.endpoints[%zu]", i);
    ep_ref_t ref = {where, beam_cfg_at(more, i), c->input.bind, NULL};
    nerr += check_endpoint(c, &ref, errs);
  }

  const beam_cnode_t *sk = beam_cfg_get(cur, "secret_key"), *al = beam_cfg_get(cur, "allow");
  snprintf(c->curve.secret_key, sizeof c->curve.secret_key, "%s",
           beam_cfg_str(cur, "secret_key") ? beam_cfg_str(cur, "secret_key") : "");
  snprintf(c->curve.allow, sizeof c->curve.allow, "%s",
           beam_cfg_str(cur, "allow") ? beam_cfg_str(cur, "allow") : "");
  const beam_cnode_t *at = sk && sk->line ? sk : cur;
  if (c->curve.any && !c->curve.secret_key[0]) {
    beam_cfg_err(errs, at, "curve.secret_key: an endpoint has curve: true, so beamd needs "
                 "its key pair (make one with beamd-keygen)");
    nerr++;
  } else if (c->curve.secret_key[0]) {
    nerr += check_cert(sk, "curve.secret_key", c->curve.secret_key, 1, errs);
  }
  if (c->curve.any_server && !c->curve.allow[0]) {
    beam_cfg_err(errs, al && al->line ? al : cur,
                 "curve.allow: a bound endpoint has curve: true, so beamd needs the directory "
                 "of client keys to let in");
    nerr++;
  } else if (c->curve.allow[0]) {
    nerr += check_file(al, "curve.allow", c->curve.allow, 1, errs);
  }

  const char *tok = beam_cfg_str(met, "token_file");
  snprintf(c->metrics.token_file, sizeof c->metrics.token_file, "%s", tok ? tok : "");
  c->metrics.insecure = beam_cfg_bool(met, "insecure", 0);
  const beam_cnode_t *ln = beam_cfg_get(met, "listen");
  if (c->metrics.token_file[0]) {
    nerr += check_file(beam_cfg_get(met, "token_file"), "metrics.token_file",
                       c->metrics.token_file, 0, errs);
  } else if (metrics_reachable(c->metrics.listen) && !c->metrics.insecure) {
    beam_cfg_err(errs, ln,
                 "metrics.listen: %s can be reached from other hosts; set metrics.token_file "
                 "(scrapers send Authorization: Bearer <token>) or metrics.insecure: true",
                 c->metrics.listen);
    nerr++;
  }
  return nerr;
}
