/* Configuration tree, schema validation, typed accessors and the normalised
 * dump (see cfg.h).
 *
 * The validator walks a tree the YAML loader built and checks it against
 * beam_param_t tables. It never stops at the first problem: every error is
 * collected as "file:line:col: error: <ctx>.<key>: <what is wrong>" so one
 * run of `beamd --check-config` shows them all. Conversions store the typed
 * value in the scalar node itself (ival/fval), defaults become synthetic
 * scalar nodes (line 0) and map keys are put into schema order, so the
 * accessors cannot fail and the dump is stable. Not here: YAML parsing
 * (daemon/yaml_load.c, the only user of libyaml) and the daemon's own
 * sections and cross-references (daemon/config.c).
 *
 * Range convention: a bound at or beyond +-1e300 means "unbounded on that
 * side", so such a side admits an infinity; NaN is admitted only where both
 * sides are unbounded (a NaN is inside no finite range). */
#include "pipeline/cfg.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/err.h"

/* Endpoints are copied into fixed buffers by the daemon
 * (BEAM_ENDPOINT_MAX = 256 in daemon/config.h, NUL included). */
#define ENDPOINT_MAX_LEN 255
/* sun_path is 108 bytes on Linux, NUL included. */
#define IPC_PATH_MAX 107
#define UNBOUNDED 1e300
/* How much of an offending value a message quotes. */
#define QUOTE_MAX 60

/* ---- errors --------------------------------------------------------------- */

static void errs_push(beam_cfg_errs_t *e, char *msg) {
  if (!e || !msg) {
    free(msg);
    return;
  }
  if (e->n == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 8;
    char **m = realloc(e->msgs, cap * sizeof *m);
    if (!m) { /* the error count returned by the validator stays right */
      free(msg);
      return;
    }
    e->msgs = m;
    e->cap = cap;
  }
  e->msgs[e->n++] = msg;
}

static void errs_vadd(beam_cfg_errs_t *e, const char *file, int line, int col,
                      const char *fmt, va_list ap) {
  char body[1024];
  vsnprintf(body, sizeof body, fmt, ap);
  const char *f = file ? file : "<config>";
  char *msg = NULL;
  int rc;
  /* Synthetic nodes (defaults) have no position: say the file only. */
  if (line > 0)
    rc = asprintf(&msg, "%s:%d:%d: error: %s", f, line, col > 0 ? col : 1, body);
  else
    rc = asprintf(&msg, "%s: error: %s", f, body);
  if (rc < 0)
    msg = NULL;
  errs_push(e, msg);
}

void beam_cfg_err(beam_cfg_errs_t *e, const beam_cnode_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  errs_vadd(e, at ? at->file : NULL, at ? at->line : 0, at ? at->col : 0, fmt, ap);
  va_end(ap);
}

void beam_cfg_err_at(beam_cfg_errs_t *e, const char *file, int line, int col,
                     const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  errs_vadd(e, file, line, col, fmt, ap);
  va_end(ap);
}

void beam_cfg_errs_free(beam_cfg_errs_t *e) {
  if (!e)
    return;
  for (size_t i = 0; i < e->n; i++)
    free(e->msgs[i]);
  free(e->msgs);
  e->msgs = NULL;
  e->n = e->cap = 0;
}

/* ---- tree ----------------------------------------------------------------- */

beam_cnode_t *beam_cnode_new(beam_cn_kind_t kind, const char *file, int line, int col) {
  beam_cnode_t *n = calloc(1, sizeof *n);
  if (!n)
    return NULL;
  n->kind = kind;
  n->file = file;
  n->line = line;
  n->col = col;
  return n;
}

/* Capacity is implicit: 4, then doubling, so a node needs no cap field. */
static int grow(beam_cnode_t *n, int with_keys) {
  if (n->n != 0 && (n->n < 4 || (n->n & (n->n - 1))))
    return 0;
  size_t cap = n->n ? n->n * 2 : 4;
  beam_cnode_t **it = realloc(n->items, cap * sizeof *it);
  if (!it)
    return BEAM_ENOMEM;
  n->items = it;
  if (!with_keys)
    return 0;
  char **k = realloc(n->keys, cap * sizeof *k);
  if (!k)
    return BEAM_ENOMEM;
  n->keys = k;
  int *kl = realloc(n->key_line, cap * sizeof *kl);
  if (!kl)
    return BEAM_ENOMEM;
  n->key_line = kl;
  int *kc = realloc(n->key_col, cap * sizeof *kc);
  if (!kc)
    return BEAM_ENOMEM;
  n->key_col = kc;
  return 0;
}

int beam_cnode_map_add(beam_cnode_t *map, const char *key, int line, int col, beam_cnode_t *val) {
  BEAM_ASSERT(map && map->kind == BEAM_CN_MAP && key);
  char *k = strdup(key);
  if (!k || grow(map, 1) < 0) {
    free(k);
    beam_cnode_free(val);
    return BEAM_ENOMEM;
  }
  map->keys[map->n] = k;
  map->key_line[map->n] = line;
  map->key_col[map->n] = col;
  map->items[map->n] = val;
  map->n++;
  return 0;
}

int beam_cnode_seq_add(beam_cnode_t *seq, beam_cnode_t *item) {
  BEAM_ASSERT(seq && seq->kind == BEAM_CN_SEQ);
  if (grow(seq, 0) < 0) {
    beam_cnode_free(item);
    return BEAM_ENOMEM;
  }
  seq->items[seq->n++] = item;
  return 0;
}

void beam_cnode_free(beam_cnode_t *n) {
  if (!n)
    return;
  for (size_t i = 0; i < n->n; i++) {
    beam_cnode_free(n->items[i]);
    if (n->keys)
      free(n->keys[i]);
  }
  free(n->items);
  free(n->keys);
  free(n->key_line);
  free(n->key_col);
  free(n->scalar);
  free(n);
}

beam_cnode_t *beam_cnode_dup(const beam_cnode_t *n) {
  if (!n)
    return NULL;
  beam_cnode_t *c = beam_cnode_new(n->kind, n->file, n->line, n->col);
  if (!c)
    return NULL;
  c->quoted = n->quoted;
  c->typed = n->typed;
  c->ival = n->ival;
  c->fval = n->fval;
  if (n->scalar && !(c->scalar = strdup(n->scalar)))
    goto fail;
  for (size_t i = 0; i < n->n; i++) {
    beam_cnode_t *it = beam_cnode_dup(n->items[i]);
    if (!it)
      goto fail;
    int rc = n->kind == BEAM_CN_MAP
                 ? beam_cnode_map_add(c, n->keys[i], n->key_line[i], n->key_col[i], it)
                 : beam_cnode_seq_add(c, it);
    if (rc < 0)
      goto fail;
  }
  return c;
fail:
  beam_cnode_free(c);
  return NULL;
}

/* ---- helpers for messages ------------------------------------------------- */

/* The value as a message quotes it: escaped, cut at QUOTE_MAX. */
static void quote_val(char *out, size_t cap, const char *s) {
  size_t o = 0;
  for (size_t i = 0; s && s[i] && o + 8 < cap; i++) {
    if (i == QUOTE_MAX) {
      o += (size_t)snprintf(out + o, cap - o, "...");
      break;
    }
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      o += (size_t)snprintf(out + o, cap - o, "\\%c", c);
    else if (c < 0x20 || c == 0x7f)
      o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    else
      out[o++] = (char)c;
  }
  out[o] = '\0';
}

/* Shortest %g form that reads back as the same double. */
static void fmt_num(char *out, size_t cap, double v) {
  if (isnan(v)) {
    snprintf(out, cap, "nan");
    return;
  }
  if (isinf(v)) {
    snprintf(out, cap, v < 0 ? "-inf" : "inf");
    return;
  }
  for (int p = 15; p <= 17; p++) {
    snprintf(out, cap, "%.*g", p, v);
    if (strtod(out, NULL) == v)
      return;
  }
}

static void fmt_size(char *out, size_t cap, double v) {
  static const char *units[] = {"Gi", "Mi", "Ki"};
  static const double mult[] = {1073741824.0, 1048576.0, 1024.0};
  for (int i = 0; i < 3; i++)
    if (v >= mult[i] && fmod(v, mult[i]) == 0) {
      snprintf(out, cap, "%.0f%s", v / mult[i], units[i]);
      return;
    }
  fmt_num(out, cap, v);
}

static void fmt_bound(char *out, size_t cap, beam_ptype_t t, double v) {
  if (t == BEAM_P_SIZE) {
    fmt_size(out, cap, v);
  } else if (t == BEAM_P_DURATION) {
    char b[48];
    fmt_num(b, sizeof b, v);
    snprintf(out, cap, "%ss", b);
  } else {
    fmt_num(out, cap, v);
  }
}

static const char *kind_name(const beam_cnode_t *n) {
  switch (n->kind) {
  case BEAM_CN_MAP: return "a map";
  case BEAM_CN_SEQ: return "a list";
  default: return "a scalar";
  }
}

static const char *type_name(beam_ptype_t t) {
  switch (t) {
  case BEAM_P_INT: return "an integer";
  case BEAM_P_FLOAT: return "a number";
  case BEAM_P_BOOL: return "a boolean (true/false, yes/no, on/off)";
  case BEAM_P_STRING: return "a string";
  case BEAM_P_ENUM: return "a string";
  case BEAM_P_SIZE: return "a size (bytes, optional suffix k, M, G, Ki, Mi, Gi)";
  case BEAM_P_DURATION: return "a duration (seconds, optional suffix ms, s, min, h)";
  case BEAM_P_ENDPOINT: return "an endpoint (tcp://host:port, ipc://path, inproc://name or \"\")";
  case BEAM_P_PATH: return "a path";
  case BEAM_P_INFILE: return "a path";
  case BEAM_P_INT_LIST: return "a list of integers";
  case BEAM_P_FLOAT_LIST: return "a list of numbers";
  case BEAM_P_ENDPOINT_LIST: return "a list of endpoints";
  case BEAM_P_MAP: return "a map";
  case BEAM_P_MAP_LIST: return "a list of maps";
  default: return "a value";
  }
}

/* "a.b" from ctx "a" and key "b"; the top level has an empty ctx. */
static void join_path(char *out, size_t cap, const char *ctx, const char *key) {
  if (ctx && ctx[0])
    snprintf(out, cap, "%s.%s", ctx, key);
  else
    snprintf(out, cap, "%s", key);
}

/* Edit distance counting a transposition of neighbours as one edit
 * (optimal string alignment): "mdoe" is one slip away from "mode". */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 63 || lb > 63)
    return 64;
  size_t d[64][64];
  for (size_t i = 0; i <= la; i++)
    d[i][0] = i;
  for (size_t j = 0; j <= lb; j++)
    d[0][j] = j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      size_t v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < v)
        v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v)
        v = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[la][lb];
}

/* ---- scalar conversions ----------------------------------------------------
 * Each returns NULL on success (node typed) or writes a reason to why. */

static int is_null(const beam_cnode_t *v) {
  if (v->kind != BEAM_CN_SCALAR || v->quoted || !v->scalar)
    return v->kind == BEAM_CN_SCALAR && !v->scalar;
  const char *s = v->scalar;
  return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
         !strcmp(s, "NULL");
}

static int parse_int(const char *s, int64_t *out, int *range) {
  *range = 0;
  if (!s[0] || !(isdigit((unsigned char)s[0]) || ((s[0] == '-' || s[0] == '+') &&
                                                 isdigit((unsigned char)s[1]))))
    return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*end)
    return -1;
  if (errno == ERANGE) {
    *range = 1;
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_float(const char *s, double *out) {
  const char *p = s;
  int neg = 0;
  if (*p == '+' || *p == '-')
    neg = *p++ == '-';
  /* YAML spells them .inf/.nan; people write inf/nan. */
  if (*p == '.' && isalpha((unsigned char)p[1]))
    p++;
  if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity")) {
    *out = neg ? -INFINITY : INFINITY;
    return 0;
  }
  if (!strcasecmp(p, "nan")) {
    *out = NAN;
    return 0;
  }
  /* strtod would also take hex floats and leading spaces; a config should not. */
  int digits = 0;
  for (const char *q = p; *q; q++) {
    if (isdigit((unsigned char)*q))
      digits = 1;
    else if (!strchr(".eE+-", *q))
      return -1;
  }
  if (!digits)
    return -1;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (*end || (errno == ERANGE && isinf(v)))
    return -1;
  *out = v;
  return 0;
}

static int parse_bool(const char *s, int *out) {
  static const char *yes[] = {"true", "yes", "on"}, *no[] = {"false", "no", "off"};
  for (int i = 0; i < 3; i++) {
    if (!strcasecmp(s, yes[i])) {
      *out = 1;
      return 0;
    }
    if (!strcasecmp(s, no[i])) {
      *out = 0;
      return 0;
    }
  }
  return -1;
}

/* Splits "16Mi" into a plain decimal number and a unit suffix. */
static int split_unit(const char *s, double *num, const char **unit) {
  size_t i = 0;
  int digits = 0, dot = 0;
  for (; s[i]; i++) {
    if (isdigit((unsigned char)s[i]))
      digits = 1;
    else if (s[i] == '.' && !dot)
      dot = 1;
    else
      break;
  }
  if (!digits)
    return -1;
  char buf[64];
  if (i >= sizeof buf)
    return -1;
  memcpy(buf, s, i);
  buf[i] = '\0';
  *num = strtod(buf, NULL);
  *unit = s + i;
  if (**unit == ' ') /* "16 Mi" reads naturally too */
    (*unit)++;
  return 0;
}

static int parse_size(const char *s, int64_t *out, const char **why) {
  static const struct { const char *u; double m; } units[] = {
      {"", 1}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"Ki", 1024.0}, {"Mi", 1048576.0},
      {"Gi", 1073741824.0}};
  double num;
  const char *unit;
  *why = NULL;
  if (split_unit(s, &num, &unit) < 0)
    return -1;
  for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
    if (strcmp(unit, units[i].u))
      continue;
    double v = num * units[i].m;
    if (!(v < 9.2e18)) {
      *why = "is too large";
      return -1;
    }
    if (v != floor(v)) {
      *why = "is not a whole number of bytes";
      return -1;
    }
    *out = (int64_t)v;
    return 0;
  }
  return -1;
}

static int parse_duration(const char *s, double *out) {
  static const struct { const char *u; double m; } units[] = {
      {"", 1}, {"s", 1}, {"ms", 1e-3}, {"min", 60}, {"h", 3600}};
  double num;
  const char *unit;
  if (split_unit(s, &num, &unit) < 0)
    return -1;
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (!strcmp(unit, units[i].u)) {
      *out = num * units[i].m;
      return isfinite(*out) ? 0 : -1;
    }
  return -1;
}

static int host_ok(const char *h, size_t len) {
  if (len == 0)
    return 0;
  if (h[0] == '[') /* IPv6 literal */
    return len > 2 && h[len - 1] == ']';
  for (size_t i = 0; i < len; i++)
    if (!isalnum((unsigned char)h[i]) && !strchr(".-_*", h[i]))
      return 0;
  return 1;
}

/* "" when the port is fine, else why not. */
static const char *port_why(const char *p) {
  if (!strcmp(p, "*"))
    return NULL;
  int64_t v;
  int range;
  if (parse_int(p, &v, &range) < 0 || v < 1 || v > 65535 || p[0] == '+' || p[0] == '-')
    return "the port must be 1..65535 (or * for any)";
  return NULL;
}

/* Splits host:port (host may be [v6]) and checks both; NULL when valid. */
static const char *hostport_why(const char *s) {
  const char *colon = NULL;
  if (s[0] == '[') {
    const char *rb = strchr(s, ']');
    if (rb && rb[1] == ':')
      colon = rb + 1;
  } else {
    colon = strrchr(s, ':');
  }
  if (!colon)
    return "missing \":port\" after the host";
  if (colon == s)
    return "missing host before \":port\" (use * for every interface)";
  if (!host_ok(s, (size_t)(colon - s)))
    return "the host must be a name, an IPv4 address, [IPv6] or *";
  return port_why(colon + 1);
}

const char *beam_cfg_endpoint_why(const char *s) {
  if (!s[0])
    return NULL; /* disabled */
  if (strlen(s) > ENDPOINT_MAX_LEN)
    return "longer than 255 characters";
  for (const char *p = s; *p; p++)
    if (isspace((unsigned char)*p))
      return "contains whitespace";
  const char *sep = strstr(s, "://");
  if (!sep)
    return "expected tcp://host:port, ipc://path or inproc://name (\"\" disables it)";
  size_t tlen = (size_t)(sep - s);
  const char *rest = sep + 3;
  if (tlen == 3 && !strncmp(s, "tcp", 3))
    return hostport_why(rest);
  if (tlen == 3 && !strncmp(s, "ipc", 3)) {
    if (!rest[0])
      return "ipc:// needs a path";
    if (strlen(rest) > IPC_PATH_MAX)
      return "the ipc path is longer than 107 bytes (the Unix socket limit)";
    return NULL;
  }
  if (tlen == 6 && !strncmp(s, "inproc", 6))
    return rest[0] ? NULL : "inproc:// needs a name";
  return "unsupported transport (expected tcp://, ipc:// or inproc://)";
}

/* The index of s among "a|b|c", or -1. */
static int enum_index(const char *choices, const char *s) {
  size_t len = strlen(s);
  int idx = 0;
  for (const char *p = choices; p; idx++) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (n == len && !strncmp(p, s, n))
      return idx;
    p = bar ? bar + 1 : NULL;
  }
  return -1;
}

typedef struct vctx_s {
  beam_cfg_errs_t *errs;
  int nerr;
  unsigned flags;
} vctx_t;

static void verr(vctx_t *vc, const beam_cnode_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void verr(vctx_t *vc, const beam_cnode_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  errs_vadd(vc->errs, at ? at->file : NULL, at ? at->line : 0, at ? at->col : 0, fmt, ap);
  va_end(ap);
  vc->nerr++;
}

static int has_min(const beam_param_t *p) { return p->min <= p->max && p->min > -UNBOUNDED; }
static int has_max(const beam_param_t *p) { return p->min <= p->max && p->max < UNBOUNDED; }

/* Range check of a converted number; v is in the type's unit. */
static int check_range(vctx_t *vc, const beam_cnode_t *v, const beam_param_t *p,
                       const char *path, double x) {
  char q[QUOTE_MAX * 2 + 16], lo[64], hi[64];
  if (p->min > p->max)
    return 0;
  quote_val(q, sizeof q, v->scalar);
  fmt_bound(lo, sizeof lo, p->type, p->min);
  fmt_bound(hi, sizeof hi, p->type, p->max);
  if (isnan(x) && (has_min(p) || has_max(p))) {
    verr(vc, v, "%s: nan is not allowed here (range %s..%s)", path,
         has_min(p) ? lo : "-inf", has_max(p) ? hi : "inf");
    return -1;
  }
  if (has_min(p) && x < p->min) {
    verr(vc, v, "%s: %s is below the minimum %s", path, q, lo);
    return -1;
  }
  if (has_max(p) && x > p->max) {
    verr(vc, v, "%s: %s is above the maximum %s", path, q, hi);
    return -1;
  }
  return 0;
}

/* An input file must be there when the config is loaded, not only when a
 * stage first opens it: --check-config (the unit's ExecStartPre) then
 * catches a missing mask before the service starts, and a reload naming
 * one is refused while the running graph is kept. Run as the daemon runs
 * (its user, its sandbox), so the answer is the daemon's. O_NONBLOCK: a
 * FIFO given by mistake must not hang the check. */
static int check_infile(vctx_t *vc, const beam_cnode_t *v, const char *path) {
  int fd = open(v->scalar, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    verr(vc, v, "%s: %s: %s", path, v->scalar, strerror(errno));
    return -1;
  }
  struct stat st;
  int isdir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  close(fd);
  if (isdir) {
    verr(vc, v, "%s: %s: is a directory, expected a file", path, v->scalar);
    return -1;
  }
  return 0;
}

/* Converts one scalar for a scalar-typed param (or an element of a list). */
static int convert_scalar(vctx_t *vc, beam_cnode_t *v, const beam_param_t *p,
                          beam_ptype_t t, const char *path) {
  char q[QUOTE_MAX * 2 + 16];
  if (v->kind != BEAM_CN_SCALAR) {
    verr(vc, v, "%s: expected %s, got %s", path, type_name(t), kind_name(v));
    return -1;
  }
  if (is_null(v)) {
    if (t == BEAM_P_ENDPOINT)
      verr(vc, v, "%s: expected %s, got an empty value (write \"\" to disable it)", path,
           type_name(t));
    else if (t == BEAM_P_STRING || t == BEAM_P_PATH || t == BEAM_P_INFILE || t == BEAM_P_ENUM)
      verr(vc, v, "%s: expected %s, got an empty value (write \"\" for an empty string)",
           path, type_name(t));
    else
      verr(vc, v, "%s: expected %s, got an empty value", path, type_name(t));
    return -1;
  }
  const char *s = v->scalar;
  quote_val(q, sizeof q, s);
  /* A quoted "5" is a string in YAML; accepting it would hide a typo. */
  if (v->quoted && (t == BEAM_P_INT || t == BEAM_P_FLOAT || t == BEAM_P_BOOL)) {
    verr(vc, v, "%s: expected %s, got the string \"%s\" (remove the quotes)", path,
         type_name(t), q);
    return -1;
  }
  switch (t) {
  case BEAM_P_INT: {
    int64_t x;
    int range;
    if (parse_int(s, &x, &range) < 0) {
      if (range)
        verr(vc, v, "%s: %s is out of range for a 64-bit integer", path, q);
      else
        verr(vc, v, "%s: expected an integer, got \"%s\"", path, q);
      return -1;
    }
    if (check_range(vc, v, p, path, (double)x) < 0)
      return -1;
    v->ival = x;
    v->fval = (double)x;
    break;
  }
  case BEAM_P_FLOAT: {
    double x;
    if (parse_float(s, &x) < 0) {
      verr(vc, v, "%s: expected a number, got \"%s\"", path, q);
      return -1;
    }
    if (check_range(vc, v, p, path, x) < 0)
      return -1;
    v->fval = x;
    v->ival = isfinite(x) && fabs(x) < 9.2e18 ? (int64_t)x : 0;
    break;
  }
  case BEAM_P_BOOL: {
    int b;
    if (parse_bool(s, &b) < 0) {
      verr(vc, v, "%s: expected a boolean (true/false, yes/no, on/off), got \"%s\"", path, q);
      return -1;
    }
    /* Normalised so the dump says true/false whatever was written. */
    char *canon = strdup(b ? "true" : "false");
    if (canon) {
      free(v->scalar);
      v->scalar = canon;
    }
    v->ival = b;
    v->fval = b;
    break;
  }
  case BEAM_P_ENUM: {
    int idx = enum_index(p->choices ? p->choices : "", s);
    if (idx < 0) {
      verr(vc, v, "%s: expected one of %s, got \"%s\"", path, p->choices ? p->choices : "",
           q);
      return -1;
    }
    v->ival = idx;
    v->fval = idx;
    break;
  }
  case BEAM_P_SIZE: {
    int64_t x;
    const char *why;
    if (parse_size(s, &x, &why) < 0) {
      if (why)
        verr(vc, v, "%s: %s %s", path, q, why);
      else
        verr(vc, v, "%s: expected %s, got \"%s\"", path, type_name(t), q);
      return -1;
    }
    if (check_range(vc, v, p, path, (double)x) < 0)
      return -1;
    v->ival = x;
    v->fval = (double)x;
    break;
  }
  case BEAM_P_DURATION: {
    double x;
    if (parse_duration(s, &x) < 0) {
      verr(vc, v, "%s: expected %s, got \"%s\"", path, type_name(t), q);
      return -1;
    }
    if (check_range(vc, v, p, path, x) < 0)
      return -1;
    v->fval = x;
    v->ival = (int64_t)x;
    break;
  }
  case BEAM_P_ENDPOINT: {
    const char *why = beam_cfg_endpoint_why(s);
    if (why) {
      verr(vc, v, "%s: invalid endpoint \"%s\": %s", path, q, why);
      return -1;
    }
    break;
  }
  case BEAM_P_PATH:
  case BEAM_P_INFILE:
    if (!s[0]) {
      verr(vc, v, "%s: a path cannot be empty", path);
      return -1;
    }
    if (t == BEAM_P_INFILE && !(vc->flags & BEAM_CFG_NO_FILE_CHECK) &&
        !(p->choices && enum_index(p->choices, s) >= 0) && check_infile(vc, v, path) < 0)
      return -1;
    break;
  default: /* STRING */
    break;
  }
  v->typed = 1;
  return 0;
}

static int validate_map(vctx_t *vc, beam_cnode_t *node, const beam_param_t *params,
                        const char *ctx);

/* The long form of an endpoint value, for the settings a plain string
 * cannot carry. The checks that need the whole configuration (keys exist,
 * exposure of non-loopback addresses) are the daemon's. */
static const beam_param_t endpoint_params[] = {
    {"address", BEAM_P_ENDPOINT, NULL, 1, 0, 0, NULL, NULL,
     "the ZeroMQ endpoint (tcp://host:port, ipc://path, inproc://name)", NULL},
    {"curve", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "CURVE: encrypted, and only listed keys get in (beamd is the server when it binds, the "
     "client when it connects)", NULL},
    {"insecure", BEAM_P_BOOL, "false", 0, 0, 0, NULL, NULL,
     "plaintext on an address other hosts can reach, on purpose (a detector network whose "
     "peer cannot do CURVE)", NULL},
    {"server_key", BEAM_P_STRING, "", 0, 0, 0, NULL, NULL,
     "connected with curve: the server's public certificate file", NULL},
    BEAM_PARAM_END};

/* An endpoint: a string, or the map above. */
static int convert_endpoint(vctx_t *vc, beam_cnode_t *v, const beam_param_t *p,
                            const char *path) {
  if (v->kind != BEAM_CN_MAP || p == &endpoint_params[0])
    return convert_scalar(vc, v, p, BEAM_P_ENDPOINT, path);
  return validate_map(vc, v, endpoint_params, path) > 0 ? -1 : 0;
}

static int call_is_valid(vctx_t *vc, const beam_cnode_t *v, const beam_param_t *p,
                         const char *path) {
  if (!p->is_valid)
    return 0;
  const char *why = p->is_valid(v);
  if (!why)
    return 0;
  if (v->kind == BEAM_CN_SCALAR) {
    char q[QUOTE_MAX * 2 + 16];
    quote_val(q, sizeof q, v->scalar);
    verr(vc, v, "%s: invalid value \"%s\": %s", path, q, why);
  } else {
    verr(vc, v, "%s: %s", path, why);
  }
  return -1;
}

/* Checks one value against its param; recursion for maps and lists. */
static int convert_value(vctx_t *vc, beam_cnode_t *v, const beam_param_t *p, const char *path) {
  char sub[512];
  int bad = 0;
  switch (p->type) {
  case BEAM_P_ANY:
    break;
  case BEAM_P_INT_LIST:
  case BEAM_P_FLOAT_LIST:
  case BEAM_P_ENDPOINT_LIST:
    /* A list key may also take one of its choices' words instead of a list
     * (`center: series`); the stage tells the two apart by the node kind. */
    if (v->kind == BEAM_CN_SCALAR && p->choices && v->scalar &&
        enum_index(p->choices, v->scalar) >= 0) {
      v->typed = 1;
      break;
    }
    if (v->kind != BEAM_CN_SEQ) {
      char q[QUOTE_MAX * 2 + 16];
      if (v->kind == BEAM_CN_SCALAR) {
        quote_val(q, sizeof q, v->scalar);
        verr(vc, v, "%s: expected %s such as %s%s%s, got \"%s\"", path, type_name(p->type),
             p->type == BEAM_P_ENDPOINT_LIST ? "[tcp://host:5500, tcp://host:5501]" : "[1, 2]",
             p->choices ? ", or " : "", p->choices ? p->choices : "", q);
      } else {
        verr(vc, v, "%s: expected %s, got %s", path, type_name(p->type), kind_name(v));
      }
      return -1;
    }
    for (size_t i = 0; i < v->n; i++) {
      snprintf(sub, sizeof sub, "%s[%zu]", path, i);
      beam_ptype_t it = p->type == BEAM_P_INT_LIST     ? BEAM_P_INT
                        : p->type == BEAM_P_FLOAT_LIST ? BEAM_P_FLOAT
                                                       : BEAM_P_ENDPOINT;
      if (it == BEAM_P_ENDPOINT ? convert_endpoint(vc, v->items[i], p, sub) < 0
                                : convert_scalar(vc, v->items[i], p, it, sub) < 0)
        bad = 1;
    }
    break;
  case BEAM_P_MAP:
    if (v->kind != BEAM_CN_MAP) {
      verr(vc, v, "%s: expected a map, got %s", path, kind_name(v));
      return -1;
    }
    bad = validate_map(vc, v, p->sub, path) > 0;
    break;
  case BEAM_P_MAP_LIST:
    if (v->kind != BEAM_CN_SEQ) {
      verr(vc, v, "%s: expected a list of maps, got %s", path, kind_name(v));
      return -1;
    }
    for (size_t i = 0; i < v->n; i++) {
      snprintf(sub, sizeof sub, "%s[%zu]", path, i);
      if (v->items[i]->kind != BEAM_CN_MAP) {
        verr(vc, v->items[i], "%s: expected a map, got %s", sub, kind_name(v->items[i]));
        bad = 1;
        continue;
      }
      if (validate_map(vc, v->items[i], p->sub, sub) > 0)
        bad = 1;
    }
    break;
  case BEAM_P_ENDPOINT:
    if (convert_endpoint(vc, v, p, path) < 0)
      return -1;
    break;
  default:
    if (convert_scalar(vc, v, p, p->type, path) < 0)
      return -1;
  }
  if (bad)
    return -1;
  return call_is_valid(vc, v, p, path);
}

/* A default as a synthetic node (line 0). Lists take "a, b" or "[a, b]". */
static beam_cnode_t *default_node(const beam_param_t *p, const char *file) {
  if (p->type != BEAM_P_INT_LIST && p->type != BEAM_P_FLOAT_LIST &&
      p->type != BEAM_P_ENDPOINT_LIST) {
    beam_cnode_t *n = beam_cnode_new(BEAM_CN_SCALAR, file, 0, 0);
    if (n && !(n->scalar = strdup(p->def))) {
      beam_cnode_free(n);
      return NULL;
    }
    /* An empty default ("" = off) must not read back as a null. */
    if (n)
      n->quoted = !p->def[0];
    return n;
  }
  beam_cnode_t *seq = beam_cnode_new(BEAM_CN_SEQ, file, 0, 0);
  const char *s = p->def;
  while (seq && *s) {
    s += strspn(s, "[ ,]");
    size_t len = strcspn(s, " ,]");
    if (!len)
      break;
    beam_cnode_t *it = beam_cnode_new(BEAM_CN_SCALAR, file, 0, 0);
    if (!it || !(it->scalar = strndup(s, len)) || beam_cnode_seq_add(seq, it) < 0) {
      if (it && !it->scalar)
        beam_cnode_free(it);
      beam_cnode_free(seq);
      return NULL;
    }
    s += len;
  }
  return seq;
}

static int sub_has_required(const beam_param_t *sub) {
  for (; sub && sub->name; sub++)
    if (sub->required)
      return 1;
  return 0;
}

static const beam_param_t *find_param(const beam_param_t *params, const char *key) {
  for (const beam_param_t *p = params; p && p->name; p++)
    if (!strcmp(p->name, key))
      return p;
  return NULL;
}

/* Puts keys into schema order (unknown ones last, in file order) so that
 * the dump is stable whatever order the file used. */
static void reorder(beam_cnode_t *m, const beam_param_t *params) {
  size_t n = m->n, o = 0;
  if (n < 2)
    return;
  char **k = malloc(n * sizeof *k);
  beam_cnode_t **it = malloc(n * sizeof *it);
  int *kl = malloc(n * sizeof *kl), *kc = malloc(n * sizeof *kc);
  char *used = calloc(n, 1);
  if (!k || !it || !kl || !kc || !used)
    goto out; /* order is cosmetic: keep the file's order */
  for (const beam_param_t *p = params; p && p->name; p++)
    for (size_t i = 0; i < n; i++)
      if (!used[i] && !strcmp(m->keys[i], p->name)) {
        used[i] = 1;
        k[o] = m->keys[i], it[o] = m->items[i], kl[o] = m->key_line[i], kc[o] = m->key_col[i];
        o++;
      }
  for (size_t i = 0; i < n; i++)
    if (!used[i]) {
      k[o] = m->keys[i], it[o] = m->items[i], kl[o] = m->key_line[i], kc[o] = m->key_col[i];
      o++;
    }
  memcpy(m->keys, k, n * sizeof *k);
  memcpy(m->items, it, n * sizeof *it);
  memcpy(m->key_line, kl, n * sizeof *kl);
  memcpy(m->key_col, kc, n * sizeof *kc);
out:
  free(k), free(it), free(kl), free(kc), free(used);
}

static void unknown_key(vctx_t *vc, const beam_cnode_t *m, size_t i,
                        const beam_param_t *params, const char *ctx) {
  const char *key = m->keys[i];
  const char *best = NULL;
  size_t bestd = (size_t)-1;
  for (const beam_param_t *p = params; p && p->name; p++) {
    size_t d = edit_distance(key, p->name);
    if (d < bestd)
      bestd = d, best = p->name;
  }
  char q[QUOTE_MAX * 2 + 16], pre[600];
  quote_val(q, sizeof q, key);
  snprintf(pre, sizeof pre, "%s%s", ctx && ctx[0] ? ctx : "", ctx && ctx[0] ? ": " : "");
  size_t klen = strlen(key);
  /* A hint is only useful when it is clearly the same word mistyped. */
  size_t blen = best ? strlen(best) : 0;
  if (best && bestd <= 2 && bestd < klen && bestd <= (blen / 2 > 1 ? blen / 2 : 1)) {
    beam_cfg_err_at(vc->errs, m->file, m->key_line[i], m->key_col[i],
                    "%sunknown key \"%s\" (did you mean \"%s\"?)", pre, q, best);
  } else {
    char list[512];
    size_t o = 0;
    list[0] = '\0';
    for (const beam_param_t *p = params; p && p->name && o + 2 < sizeof list; p++)
      o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", o ? ", " : "", p->name);
    beam_cfg_err_at(vc->errs, m->file, m->key_line[i], m->key_col[i],
                    "%sunknown key \"%s\" (expected one of: %s)", pre, q, list);
  }
  vc->nerr++;
}

static int validate_map(vctx_t *vc, beam_cnode_t *m, const beam_param_t *params,
                        const char *ctx) {
  int before = vc->nerr;
  char path[512];
  if (m->kind != BEAM_CN_MAP) {
    if (ctx && ctx[0])
      verr(vc, m, "%s: expected a map, got %s", ctx, kind_name(m));
    else
      verr(vc, m, "the configuration must be a map of sections, got %s", kind_name(m));
    return vc->nerr - before;
  }
  for (size_t i = 0; i < m->n; i++) {
    size_t j;
    for (j = 0; j < i && strcmp(m->keys[j], m->keys[i]); j++)
      ;
    if (j < i) {
      char q[QUOTE_MAX * 2 + 16];
      quote_val(q, sizeof q, m->keys[i]);
      beam_cfg_err_at(vc->errs, m->file, m->key_line[i], m->key_col[i],
                      "%s%sduplicate key \"%s\" (first at %d:%d)", ctx && ctx[0] ? ctx : "",
                      ctx && ctx[0] ? ": " : "", q, m->key_line[j], m->key_col[j]);
      vc->nerr++;
      continue;
    }
    const beam_param_t *p = find_param(params, m->keys[i]);
    if (!p) {
      unknown_key(vc, m, i, params, ctx);
      continue;
    }
    join_path(path, sizeof path, ctx, p->name);
    convert_value(vc, m->items[i], p, path);
  }
  for (const beam_param_t *p = params; p && p->name; p++) {
    if (beam_cfg_get(m, p->name))
      continue;
    join_path(path, sizeof path, ctx, p->name);
    if (p->required) {
      verr(vc, m, "%s%smissing required key \"%s\"", ctx && ctx[0] ? ctx : "",
           ctx && ctx[0] ? ": " : "", p->name);
      continue;
    }
    beam_cnode_t *d = NULL;
    if (p->def)
      d = default_node(p, m->file);
    else if (p->type == BEAM_P_MAP && p->sub && !sub_has_required(p->sub))
      d = beam_cnode_new(BEAM_CN_MAP, m->file, 0, 0); /* a section left out: all defaults */
    else
      continue;
    if (!d || beam_cnode_map_add(m, p->name, 0, 0, d) < 0) {
      verr(vc, m, "%s: out of memory filling in the default", path);
      continue;
    }
    /* Defaults go through the same checks: a bad one is a schema bug that
     * should be loud. */
    convert_value(vc, d, p, path);
  }
  reorder(m, params);
  return vc->nerr - before;
}

int beam_cfg_validate(beam_cnode_t *node, const beam_param_t *params, const char *ctx,
                      beam_cfg_errs_t *errs) {
  return beam_cfg_validate_flags(node, params, ctx, errs, 0);
}

int beam_cfg_validate_flags(beam_cnode_t *node, const beam_param_t *params, const char *ctx,
                            beam_cfg_errs_t *errs, unsigned flags) {
  vctx_t vc = {errs, 0, flags};
  if (!node) {
    beam_cfg_err_at(errs, NULL, 0, 0, "%s: no configuration", ctx && ctx[0] ? ctx : "config");
    return 1;
  }
  return validate_map(&vc, node, params, ctx ? ctx : "");
}

/* ---- accessors -------------------------------------------------------------- */

const beam_cnode_t *beam_cfg_get(const beam_cnode_t *map, const char *key) {
  if (!map || map->kind != BEAM_CN_MAP || !key)
    return NULL;
  for (size_t i = 0; i < map->n; i++)
    if (!strcmp(map->keys[i], key))
      return map->items[i];
  return NULL;
}

int beam_cfg_endpoint(const beam_cnode_t *v, beam_cfg_endpoint_t *out) {
  memset(out, 0, sizeof *out);
  out->server_key = "";
  if (v && v->kind == BEAM_CN_SCALAR) {
    out->address = v->scalar;
    out->node = v;
    return 0;
  }
  if (!v || v->kind != BEAM_CN_MAP)
    return -1;
  out->node = beam_cfg_get(v, "address");
  out->address = beam_cfg_str(v, "address");
  out->curve = beam_cfg_bool(v, "curve", 0);
  out->insecure = beam_cfg_bool(v, "insecure", 0);
  const char *sk = beam_cfg_str(v, "server_key");
  out->server_key = sk ? sk : "";
  if (!out->address) {
    out->node = v;
    return -1;
  }
  return 0;
}

const char *beam_cfg_str(const beam_cnode_t *map, const char *key) {
  const beam_cnode_t *v = beam_cfg_get(map, key);
  return v && v->kind == BEAM_CN_SCALAR ? v->scalar : NULL;
}

int64_t beam_cfg_int(const beam_cnode_t *map, const char *key, int64_t fallback) {
  const beam_cnode_t *v = beam_cfg_get(map, key);
  if (!v || v->kind != BEAM_CN_SCALAR)
    return fallback;
  if (v->typed)
    return v->ival;
  int64_t x;
  int range;
  return v->scalar && parse_int(v->scalar, &x, &range) == 0 ? x : fallback;
}

double beam_cfg_float(const beam_cnode_t *map, const char *key, double fallback) {
  const beam_cnode_t *v = beam_cfg_get(map, key);
  if (!v || v->kind != BEAM_CN_SCALAR)
    return fallback;
  if (v->typed)
    return v->fval;
  double x;
  return v->scalar && parse_float(v->scalar, &x) == 0 ? x : fallback;
}

int beam_cfg_bool(const beam_cnode_t *map, const char *key, int fallback) {
  const beam_cnode_t *v = beam_cfg_get(map, key);
  if (!v || v->kind != BEAM_CN_SCALAR)
    return fallback;
  if (v->typed)
    return v->ival != 0;
  int b;
  return v->scalar && parse_bool(v->scalar, &b) == 0 ? b : fallback;
}

size_t beam_cfg_len(const beam_cnode_t *seq) {
  return seq && seq->kind == BEAM_CN_SEQ ? seq->n : 0;
}

const beam_cnode_t *beam_cfg_at(const beam_cnode_t *seq, size_t i) {
  return seq && seq->kind == BEAM_CN_SEQ && i < seq->n ? seq->items[i] : NULL;
}

/* ---- dump ------------------------------------------------------------------- */

typedef struct sbuf_s {
  char *p;
  size_t n, cap;
  int oom;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *s, size_t len) {
  if (b->oom)
    return;
  if (b->n + len + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + len + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, len);
  b->n += len;
  b->p[b->n] = '\0';
}

static void sb_str(sbuf_t *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_indent(sbuf_t *b, int n) {
  for (int i = 0; i < n; i++)
    sb_add(b, " ", 1);
}

/* Plain scalars that YAML would misread, or that our loader would read as
 * a null, are written in double quotes. */
static int needs_quotes(const char *s) {
  if (!s[0] || isspace((unsigned char)s[0]) || isspace((unsigned char)s[strlen(s) - 1]))
    return 1;
  if (strchr("!&*[]{}|>'\"%@`#,", s[0]))
    return 1;
  if (strchr("-?:", s[0]) && (!s[1] || s[1] == ' '))
    return 1;
  if (!strcmp(s, "~") || !strcasecmp(s, "null"))
    return 1;
  for (const char *p = s; *p; p++) {
    unsigned char c = (unsigned char)*p;
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\')
      return 1;
    if (c == ':' && (!p[1] || p[1] == ' '))
      return 1;
    if (c == '#' && p > s && p[-1] == ' ')
      return 1;
    if (strchr(",[]{}", c)) /* harmless in block context, not in flow lists */
      return 1;
  }
  return 0;
}

static void sb_scalar(sbuf_t *b, const char *s, int quoted) {
  if (!s)
    s = "";
  if (!quoted && !needs_quotes(s)) {
    sb_str(b, s);
    return;
  }
  sb_add(b, "\"", 1);
  for (const char *p = s; *p; p++) {
    unsigned char c = (unsigned char)*p;
    char e[8];
    if (c == '"' || c == '\\') {
      e[0] = '\\', e[1] = (char)c;
      sb_add(b, e, 2);
    } else if (c == '\n') {
      sb_str(b, "\\n");
    } else if (c == '\t') {
      sb_str(b, "\\t");
    } else if (c < 0x20 || c == 0x7f) {
      snprintf(e, sizeof e, "\\x%02x", c);
      sb_str(b, e);
    } else {
      sb_add(b, (const char *)p, 1);
    }
  }
  sb_add(b, "\"", 1);
}

static int all_scalars(const beam_cnode_t *seq) {
  for (size_t i = 0; i < seq->n; i++)
    if (seq->items[i]->kind != BEAM_CN_SCALAR)
      return 0;
  return 1;
}

static void dump_node(sbuf_t *b, const beam_cnode_t *n, int indent, int depth);

/* Writes "key: value" pairs of a map, each line starting at indent (the first
 * key's indentation is assumed to be already written when first_inline). */
static void dump_map_body(sbuf_t *b, const beam_cnode_t *m, int indent, int first_inline,
                          int depth) {
  for (size_t i = 0; i < m->n; i++) {
    if (i > 0 || !first_inline)
      sb_indent(b, indent);
    sb_scalar(b, m->keys[i], 0);
    sb_add(b, ":", 1);
    const beam_cnode_t *v = m->items[i];
    if (v->kind == BEAM_CN_MAP && v->n) {
      sb_add(b, "\n", 1);
      dump_map_body(b, v, indent + 2, 0, depth + 1);
    } else if (v->kind == BEAM_CN_SEQ && v->n && !all_scalars(v)) {
      sb_add(b, "\n", 1);
      dump_node(b, v, indent + 2, depth + 1);
    } else {
      sb_add(b, " ", 1);
      dump_node(b, v, indent, depth + 1);
      sb_add(b, "\n", 1);
    }
  }
}

static void dump_node(sbuf_t *b, const beam_cnode_t *n, int indent, int depth) {
  if (depth > 200) { /* the loader caps nesting far below this */
    b->oom = 1;
    return;
  }
  switch (n->kind) {
  case BEAM_CN_SCALAR:
    sb_scalar(b, n->scalar, n->quoted);
    break;
  case BEAM_CN_MAP:
    if (!n->n) {
      sb_str(b, "{}");
      break;
    }
    dump_map_body(b, n, indent, 0, depth);
    break;
  case BEAM_CN_SEQ:
    if (!n->n) {
      sb_str(b, "[]");
      break;
    }
    if (all_scalars(n)) {
      sb_add(b, "[", 1);
      for (size_t i = 0; i < n->n; i++) {
        if (i)
          sb_str(b, ", ");
        sb_scalar(b, n->items[i]->scalar, n->items[i]->quoted);
      }
      sb_add(b, "]", 1);
      break;
    }
    for (size_t i = 0; i < n->n; i++) {
      const beam_cnode_t *it = n->items[i];
      sb_indent(b, indent);
      sb_str(b, "- ");
      if (it->kind == BEAM_CN_MAP && it->n) {
        dump_map_body(b, it, indent + 2, 1, depth + 1);
      } else if (it->kind == BEAM_CN_SEQ && it->n && !all_scalars(it)) {
        sb_add(b, "\n", 1);
        dump_node(b, it, indent + 2, depth + 1);
      } else {
        dump_node(b, it, indent + 2, depth + 1);
        sb_add(b, "\n", 1);
      }
    }
    break;
  }
}

char *beam_cfg_dump(const beam_cnode_t *root) {
  sbuf_t b = {0};
  if (!root)
    return NULL;
  if (root->kind == BEAM_CN_MAP && root->n) {
    dump_map_body(&b, root, 0, 0, 0);
  } else {
    dump_node(&b, root, 0, 0);
    sb_add(&b, "\n", 1);
  }
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  return b.p;
}
