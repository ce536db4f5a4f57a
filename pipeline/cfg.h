/* Configuration tree and declarative schema.
 *
 * The YAML loader (daemon/yaml_load.c) turns a file into a tree of
 * beam_cnode_t in which every node keeps its file, line and column. The
 * validator (pipeline/cfg.c) checks a tree against beam_param_t tables, one
 * per section and per stage kind, collects every error as
 * "file:line:col: error: message", and fills in defaults as synthetic nodes so
 * that the typed accessors below cannot fail on a validated tree.
 *
 * This header has no libyaml dependency: stages read their parameters only
 * through the accessors. */
#ifndef BEAM_CFG_H
#define BEAM_CFG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum beam_cn_kind_e {
  BEAM_CN_SCALAR = 1,
  BEAM_CN_SEQ = 2,
  BEAM_CN_MAP = 3,
} beam_cn_kind_t;

typedef struct beam_cnode_s beam_cnode_t;
struct beam_cnode_s {
  beam_cn_kind_t kind;
  const char *file; /* borrowed: the name passed to the loader, kept alive by its owner */
  int line, col;    /* 1-based; 0 for defaults filled in by the validator */
  char *scalar;     /* SCALAR: the text; NULL otherwise */
  int quoted;       /* SCALAR: was quoted in the source (never a number/bool) */
  size_t n;         /* SEQ: items; MAP: pairs */
  char **keys;      /* MAP: keys[i] */
  int *key_line, *key_col; /* MAP: where keys[i] was written */
  beam_cnode_t **items;    /* SEQ items or MAP values */
  /* Set by the validator on scalars: */
  int typed;   /* 1 once converted */
  int64_t ival;
  double fval;
};

typedef enum beam_ptype_e {
  BEAM_P_INT = 1,   /* integer, min/max inclusive */
  BEAM_P_FLOAT,     /* number, min/max inclusive */
  BEAM_P_BOOL,      /* true/false/yes/no/on/off */
  BEAM_P_STRING,
  BEAM_P_ENUM,      /* one of choices "a|b|c" */
  BEAM_P_SIZE,      /* bytes, with optional suffix k/M/G/Ki/Mi/Gi (ival) */
  BEAM_P_DURATION,  /* seconds, with optional suffix ms/s/min/h (fval, seconds) */
  BEAM_P_ENDPOINT,  /* ZeroMQ endpoint tcp://host:port | ipc://path | inproc://x */
  BEAM_P_PATH,      /* file path, not checked here (e.g. an output directory) */
  BEAM_P_INFILE,    /* a file the daemon reads (mask, flat field, probe...): must exist
                     * and be readable when the config is loaded (start, reload and
                     * --check-config alike); `choices` lists words that name no file
                     * ("series"), which pass unchecked */
  BEAM_P_INT_LIST,  /* sequence of ints (each within min/max) */
  BEAM_P_FLOAT_LIST,
  BEAM_P_ENDPOINT_LIST, /* sequence of endpoints, each as BEAM_P_ENDPOINT */
  BEAM_P_MAP,       /* nested map validated against sub[] */
  BEAM_P_MAP_LIST,  /* sequence of maps, each validated against sub[] */
  BEAM_P_ANY,       /* not checked here; the owner validates it (e.g. stages list) */
} beam_ptype_t;

typedef struct beam_param_s beam_param_t;
struct beam_param_s {
  const char *name;
  beam_ptype_t type;
  const char *def;     /* default as scalar text; NULL = no default */
  int required;        /* error when absent (def must be NULL) */
  double min, max;     /* INT/FLOAT/SIZE/DURATION/lists; ignored when min > max */
  const char *choices; /* ENUM: "cpu|cuda|auto"; INFILE and lists: words taken instead ("series") */
  const beam_param_t *sub; /* MAP/MAP_LIST: terminated by {NULL} */
  const char *doc;     /* one line: units and meaning; the reference config repeats it */
  /* Optional extra check on the converted node; returns NULL when valid or a
   * static reason string. */
  const char *(*is_valid)(const beam_cnode_t *v);
};
#define BEAM_PARAM_END {0}

/* An error list collected during loading and validation. */
typedef struct beam_cfg_errs_s {
  char **msgs; /* "file:line:col: error: ..." */
  size_t n, cap;
} beam_cfg_errs_t;

void beam_cfg_err(beam_cfg_errs_t *e, const beam_cnode_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void beam_cfg_err_at(beam_cfg_errs_t *e, const char *file, int line, int col,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void beam_cfg_errs_free(beam_cfg_errs_t *e);

/* Validates map `node` against params; `ctx` prefixes messages, e.g.
 * `stage "g2"` or `input`. Unknown keys are errors (with a did-you-mean hint),
 * required keys must be present, ranges and enum values are checked, and
 * missing optional keys with a default get a synthetic node. Returns the
 * number of errors added. */
int beam_cfg_validate(beam_cnode_t *node, const beam_param_t *params,
                      const char *ctx, beam_cfg_errs_t *errs);

/* beam_cfg_validate with flags. BEAM_CFG_NO_FILE_CHECK leaves BEAM_P_INFILE
 * values unchecked on disk: for tests that build a stage on a file they
 * mean to be missing, to exercise the stage's own error path. */
#define BEAM_CFG_NO_FILE_CHECK 1u
int beam_cfg_validate_flags(beam_cnode_t *node, const beam_param_t *params,
                            const char *ctx, beam_cfg_errs_t *errs, unsigned flags);

/* Tree construction and release (used by the loader and by tests). */
beam_cnode_t *beam_cnode_new(beam_cn_kind_t kind, const char *file, int line, int col);
int beam_cnode_map_add(beam_cnode_t *map, const char *key, int line, int col, beam_cnode_t *val);
int beam_cnode_seq_add(beam_cnode_t *seq, beam_cnode_t *item);
void beam_cnode_free(beam_cnode_t *n);
/* Deep copy (file strings shared by pointer). */
beam_cnode_t *beam_cnode_dup(const beam_cnode_t *n);

/* Accessors on a validated map. Missing keys without defaults: get returns
 * NULL, str returns NULL, the numeric ones return the given fallback. */
const beam_cnode_t *beam_cfg_get(const beam_cnode_t *map, const char *key);
const char *beam_cfg_str(const beam_cnode_t *map, const char *key);
int64_t beam_cfg_int(const beam_cnode_t *map, const char *key, int64_t fallback);
double beam_cfg_float(const beam_cnode_t *map, const char *key, double fallback);
int beam_cfg_bool(const beam_cnode_t *map, const char *key, int fallback);
/* An endpoint value (BEAM_P_ENDPOINT, or an item of an ENDPOINT_LIST):
 * either "tcp://..." or {address, curve, insecure, server_key}. Pointers
 * into the tree; node is the address node, where messages point. Returns
 * -1 (address NULL) when v is neither. */
typedef struct beam_cfg_endpoint_s {
  const char *address;
  int curve, insecure;
  const char *server_key; /* "" when not given */
  const beam_cnode_t *node;
} beam_cfg_endpoint_t;
int beam_cfg_endpoint(const beam_cnode_t *v, beam_cfg_endpoint_t *out);
/* Why the endpoint string s is not one beamd accepts (tcp://host:port,
 * ipc://path, inproc://name; "" = disabled), or NULL when it is. The one
 * rule set for the schema and the tools (beamd-ctl). */
const char *beam_cfg_endpoint_why(const char *s);
/* Sequences: length (0 when not a sequence) and item i. */
size_t beam_cfg_len(const beam_cnode_t *seq);
const beam_cnode_t *beam_cfg_at(const beam_cnode_t *seq, size_t i);

/* Writes the tree as normalised YAML (defaults included) to a malloc'd
 * string, for `beamd --check-config`. */
char *beam_cfg_dump(const beam_cnode_t *root);

#ifdef __cplusplus
}
#endif
#endif
