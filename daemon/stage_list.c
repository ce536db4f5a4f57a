/* beamd --list-stages and --describe-stage KIND: the stage kinds of this
 * build printed from their schema tables (beam_stage_kind_t, beam_param_t),
 * so the listing cannot drift from what the config loader accepts. Not a
 * reference manual: etc/beamd.yaml and docs/ explain how to use the keys. */
#include "daemon/stage_list.h"

#include <string.h>

#include "pipeline/device.h"
#include "pipeline/stage.h"

/* The keys every kind's table starts with; printed once by --list-stages. */
static const beam_param_t common[] = {BEAM_STAGE_COMMON_PARAMS, BEAM_PARAM_END};

/* Short names: a listing is read line by line, not as an error message. */
static const char *type_word(beam_ptype_t t) {
  switch (t) {
  case BEAM_P_INT: return "int";
  case BEAM_P_FLOAT: return "float";
  case BEAM_P_BOOL: return "bool";
  case BEAM_P_STRING: return "string";
  case BEAM_P_ENUM: return "enum";
  case BEAM_P_SIZE: return "size";
  case BEAM_P_DURATION: return "duration";
  case BEAM_P_ENDPOINT: return "endpoint";
  case BEAM_P_PATH: return "path";
  case BEAM_P_INFILE: return "file";
  case BEAM_P_INT_LIST: return "list of int";
  case BEAM_P_FLOAT_LIST: return "list of float";
  case BEAM_P_ENDPOINT_LIST: return "list of endpoint";
  case BEAM_P_MAP: return "map";
  case BEAM_P_MAP_LIST: return "list of maps";
  default: return "any";
  }
}

/* The loader checks min/max only for numbers, and only when min <= max;
 * beyond +-1e300 a side is open (pipeline/cfg.c), and a range open on both
 * sides says nothing. */
static int has_range(const beam_param_t *p) {
  switch (p->type) {
  case BEAM_P_INT: case BEAM_P_FLOAT: case BEAM_P_SIZE: case BEAM_P_DURATION:
  case BEAM_P_INT_LIST: case BEAM_P_FLOAT_LIST:
    return p->min <= p->max && (p->min > -1e300 || p->max < 1e300);
  default:
    return 0;
  }
}

static void bound(char *out, size_t cap, double v) {
  if (v <= -1e300 || v >= 1e300)
    snprintf(out, cap, "%s", v < 0 ? "-inf" : "inf");
  else
    snprintf(out, cap, "%.10g", v);
}

/* One key: "  path (type, default D, range lo..hi, one of a|b): doc", then
 * its sub-keys (maps) one level deeper as path.key or path[].key. */
static void print_param(FILE *f, const beam_param_t *p, const char *prefix, int depth) {
  char path[256];
  snprintf(path, sizeof path, "%s%s", prefix, p->name);
  fprintf(f, "%*s%s (%s", 2 + 2 * depth, "", path, type_word(p->type));
  if (p->required)
    fputs(", required", f);
  if (p->def)
    fprintf(f, ", default %s", p->def[0] ? p->def : "\"\"");
  if (has_range(p)) {
    char lo[32], hi[32];
    bound(lo, sizeof lo, p->min);
    bound(hi, sizeof hi, p->max);
    fprintf(f, ", range %s..%s", lo, hi);
  }
  /* INFILE's and lists' choices are words taken instead (no file, no list); ENUM's are the values. */
  if (p->choices)
    fprintf(f, ", %s %s", p->type == BEAM_P_ENUM ? "one of" : "or", p->choices);
  fprintf(f, "): %s\n", p->doc ? p->doc : "");
  if (p->sub && (p->type == BEAM_P_MAP || p->type == BEAM_P_MAP_LIST)) {
    char sub[272];
    snprintf(sub, sizeof sub, "%s%s", path, p->type == BEAM_P_MAP_LIST ? "[]." : ".");
    for (const beam_param_t *q = p->sub; q->name; q++)
      print_param(f, q, sub, depth + 1);
  }
}

/* Index of the first key after the common ones (0 when a kind's table does
 * not start with them). */
static size_t own_keys(const beam_param_t *params) {
  size_t i = 0;
  while (common[i].name && params[i].name && !strcmp(common[i].name, params[i].name))
    i++;
  return common[i].name ? 0 : i;
}

/* A CPU-only build links stubs as the CUDA ops: say so, or a reader would
 * expect `backend: cuda` to work here. */
static const char *backends(const beam_stage_kind_t *k) {
  if (!k->cuda)
    return "cpu";
  return beam_gpu_built() ? "cpu, cuda" : "cpu, cuda (not in this build)";
}

static void print_kind(FILE *f, const beam_stage_kind_t *k, int with_common) {
  fprintf(f, "%s: %s\n  backends: %s\n", k->kind, k->doc ? k->doc : "", backends(k));
  for (size_t i = with_common ? 0 : own_keys(k->params); k->params[i].name; i++)
    print_param(f, &k->params[i], "", 0);
}

void beamd_stage_list(FILE *f) {
  const beam_stage_kind_t *const *ks = beam_stage_kinds();
  fputs("Keys every stage takes:\n", f);
  for (const beam_param_t *p = common; p->name; p++)
    print_param(f, p, "", 0);
  for (size_t i = 0; ks[i]; i++) {
    fputc('\n', f);
    print_kind(f, ks[i], 0);
  }
}

int beamd_stage_describe(FILE *out, FILE *err, const char *kind) {
  const beam_stage_kind_t *k = beam_stage_kind_find(kind);
  if (k) {
    print_kind(out, k, 1);
    return 0;
  }
  const beam_stage_kind_t *const *ks = beam_stage_kinds();
  fprintf(err, "beamd: unknown stage kind \"%s\"; known kinds:", kind);
  for (size_t i = 0; ks[i]; i++)
    fprintf(err, "%s %s", i ? "," : "", ks[i]->kind);
  fputc('\n', err);
  return 1;
}
