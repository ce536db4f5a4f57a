/* The daemon's configuration: YAML file (or the built-in default) ->
 * validated tree -> typed struct. All errors are collected as
 * "file:line:col: error: message" before anything is refused.
 *
 * Sections: input, output, pool, control, metrics, log, heartbeat, stages.
 * etc/beamd.yaml documents every key; tests keep it in step with the schema
 * tables exported here. */
#ifndef BEAM_CONFIG_H
#define BEAM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "pipeline/cfg.h"
#include "proto/proto.h"
#include "pipeline/graph.h"

/* In the order of input.mode's choices and of input.c's source registry. */
typedef enum beam_input_mode_e {
  BEAM_IN_LIVE = 0,    /* SUB to a PUB: lossy, gaps counted */
  BEAM_IN_PULL = 1,    /* PULL from a PUSH: lossless, backpressure */
  BEAM_IN_REPLAY = 2,  /* REQ to a replay server (beamd-replay): lossless, credit based */
  BEAM_IN_DECTRIS = 3, /* PULL from a DECTRIS detector (SIMPLON v1/v2, Jungfraujoch) */
  BEAM_IN_KARABO = 4,  /* a European XFEL Karabo bridge server (src_karabo.c) */
} beam_input_mode_t;

#define BEAM_ENDPOINT_MAX 256
#define BEAM_PATH_MAX 1024

/* How an endpoint is secured (its long form in the file, pipeline/cfg.h).
 * Nothing set: plaintext, which only loopback addresses may use. */
typedef struct beam_ep_sec_s {
  int curve;                        /* CURVE server when bound, client when connected */
  int insecure;                     /* plaintext on a reachable address, said explicitly */
  char server_key[BEAM_PATH_MAX];   /* connected with curve: the server's public cert */
} beam_ep_sec_t;

typedef struct beam_config_s {
  beam_cnode_t *root; /* validated tree (defaults filled in), owned */
  char *path;         /* file name, or "<built-in>" */

  struct {
    beam_input_mode_t mode;
    char endpoint[BEAM_ENDPOINT_MAX];
    beam_ep_sec_t endpoint_sec;
    int bind;       /* bind instead of connect */
    int hwm;        /* ZMQ_RCVHWM (messages) */
    /* Modes live and pull: RESULTs of this topic are the series' frames
     * (a daemon chained after another, ingest.c); "" = none. */
    char result_topic[BEAM_TOPIC_MAX + 1];
    /* The validated input map: each source reads its own sub-table
     * (input.<mode>) from it when it opens (input.h). */
    const beam_cnode_t *node;
  } input;
  struct {
    char publish[BEAM_ENDPOINT_MAX]; /* "" = no PUB */
    char push[BEAM_ENDPOINT_MAX];    /* "" = no PUSH */
    beam_ep_sec_t publish_sec, push_sec;
    int hwm;                         /* ZMQ_SNDHWM of the PUB */
    int push_hwm;
    int publish_frames_meta;         /* republish SERIES_START/END */
    double drain_timeout_s;          /* drain: how long results wait for a PUSH consumer */
    uint64_t pub_buffer;             /* bytes of result copies the PUB may have queued */
    uint64_t push_copy_buffer;       /* the same for small results on the PUSH */
  } output;
  struct {
    unsigned frames;     /* input slots */
    uint64_t frame_bytes; /* bytes per slot (largest decoded frame) */
    int pinned;          /* 1 when CUDA may be used (auto) */
    int pin_auto;        /* auto: the graph pins only if a stage runs on CUDA */
    int prefault;        /* touch every slot at start-up */
    unsigned decode_threads; /* decode compressed input ahead of the stages */
  } pool;
  struct {
    char endpoint[BEAM_ENDPOINT_MAX]; /* "" = no control socket */
    beam_ep_sec_t endpoint_sec;
  } control;
  struct {
    char listen[128]; /* "127.0.0.1:9464", "" = off */
    char token_file[BEAM_PATH_MAX]; /* bearer token clients must send; "" = none */
    int insecure;     /* no token on a reachable address, said explicitly */
  } metrics;
  /* This daemon's CURVE identity (config_security.c). */
  struct {
    char secret_key[BEAM_PATH_MAX]; /* its secret certificate; "" = no CURVE endpoint */
    char allow[BEAM_PATH_MAX];      /* directory of the client keys let in */
    int any, any_server;            /* some endpoint uses CURVE; some bound one does */
  } curve;
  struct {
    int level;           /* syslog level 0..7 */
    double rate_limit;   /* per-frame messages per second, per kind */
  } log;
  double heartbeat_s;    /* stats publish, STATUS=, metrics refresh */

  size_t nstages;
  beam_stage_spec_t *stages; /* point into root */
} beam_config_t;

extern const beam_param_t beam_config_params[]; /* top-level schema */
extern const beam_param_t beam_config_curve_params[]; /* the curve section */

/* Fills the security settings of c (endpoint long forms, curve, metrics
 * token) and refuses what would expose the daemon: a reachable address
 * without CURVE or `insecure: true`, CURVE without its keys, unreadable key
 * files. Returns the number of errors added (config_security.c). */
int beam_config_security(beam_config_t *c, beam_cfg_errs_t *errs);
/* The security settings of one endpoint value (either form). */
int beam_ep_sec_from_node(const beam_cnode_t *v, beam_ep_sec_t *out);
extern const beam_param_t beamd_karabo_out_params[]; /* output.karabo (daemon/karabo_out.c) */

/* Load and validate. On error returns BEAM_ECONFIG, *out NULL, and errs
 * holds every message. */
int beam_config_load_file(const char *path, beam_config_t **out, beam_cfg_errs_t *errs);
int beam_config_load_string(const char *text, size_t len, const char *name,
                            beam_config_t **out, beam_cfg_errs_t *errs);
/* The built-in default, used when beamd runs without -c. */
const char *beam_config_default_yaml(void);
void beam_config_free(beam_config_t **c);

/* Parses YAML text into a node tree (no schema), errors with positions. */
beam_cnode_t *beam_yaml_parse(const char *text, size_t len, const char *name,
                              beam_cfg_errs_t *errs);

#endif
