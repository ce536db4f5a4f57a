/* YAML text -> beam_cnode_t tree, with libyaml's event parser.
 *
 * The only file that includes yaml.h. It knows nothing of the schema: it
 * keeps every node's file name and 1-based line/column (libyaml's marks are
 * 0-based), records whether a scalar was quoted, and refuses the YAML
 * features a configuration has no use for and that would make positions
 * ambiguous: anchors, aliases, tags, several documents, non-scalar keys.
 * Syntax errors come out as "file:line:col: error: <problem> (<context>)".
 *
 * The tree points at `name` for its file strings (it does not copy it): the
 * caller keeps name alive as long as the tree. */
#include <stdio.h>
#include <string.h>
#include <yaml.h>

#include "daemon/config.h"
#include "proto/err.h"

/* Far deeper than any configuration; bounds the recursion of the code that
 * walks the tree (free, validate, dump). */
#define MAX_DEPTH 64

typedef struct frame_s {
  beam_cnode_t *node;
  char *key; /* MAP: key waiting for its value */
  int key_line, key_col;
} frame_t;

typedef struct loader_s {
  const char *name;
  const char *text;
  size_t len;
  beam_cfg_errs_t *errs;
  int nerr;
  frame_t stack[MAX_DEPTH + 1];
  int depth;
  beam_cnode_t *root;
  int skip; /* > 0 while inside a subtree that is being dropped */
} loader_t;

static void lerr(loader_t *L, yaml_mark_t m, const char *fmt, const char *arg) {
  beam_cfg_err_at(L->errs, L->name, (int)m.line + 1, (int)m.column + 1, fmt, arg);
  L->nerr++;
}

/* Reader errors carry a byte offset, not a mark. */
static void offset_to_pos(const loader_t *L, size_t off, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < off && i < L->len; i++) {
    if (L->text[i] == '\n') {
      (*line)++;
      *col = 1;
    } else if (((unsigned char)L->text[i] & 0xc0) != 0x80) {
      (*col)++;
    }
  }
}

static void parser_error(loader_t *L, const yaml_parser_t *p) {
  const char *problem = p->problem ? p->problem : "syntax error";
  int line, col;
  if (p->error == YAML_MEMORY_ERROR) {
    beam_cfg_err_at(L->errs, L->name, 0, 0, "out of memory while parsing");
    L->nerr++;
    return;
  }
  if (p->error == YAML_READER_ERROR) {
    offset_to_pos(L, p->problem_offset, &line, &col);
    if (p->problem_value >= 0)
      beam_cfg_err_at(L->errs, L->name, line, col, "%s (byte 0x%02x)", problem,
                      (unsigned)p->problem_value & 0xff);
    else
      beam_cfg_err_at(L->errs, L->name, line, col, "%s", problem);
    L->nerr++;
    return;
  }
  line = (int)p->problem_mark.line + 1;
  col = (int)p->problem_mark.column + 1;
  /* libyaml's words for a tab are obscure; tabs are the usual cause. */
  if (p->problem_mark.index < L->len && L->text[p->problem_mark.index] == '\t')
    problem = "a tab character; YAML is indented with spaces";
  if (p->context) {
    int cl = (int)p->context_mark.line + 1, cc = (int)p->context_mark.column + 1;
    if (cl != line || cc != col)
      beam_cfg_err_at(L->errs, L->name, line, col, "%s (%s at %d:%d)", problem, p->context,
                      cl, cc);
    else
      beam_cfg_err_at(L->errs, L->name, line, col, "%s (%s)", problem, p->context);
  } else {
    beam_cfg_err_at(L->errs, L->name, line, col, "%s", problem);
  }
  L->nerr++;
}

/* Hangs a finished node under the current container (or makes it the root).
 * Takes ownership of n. */
static int attach(loader_t *L, beam_cnode_t *n, yaml_mark_t m) {
  if (L->depth == 0) {
    L->root = n;
    return 0;
  }
  frame_t *f = &L->stack[L->depth - 1];
  if (f->node->kind == BEAM_CN_SEQ)
    return beam_cnode_seq_add(f->node, n);
  if (!f->key) {
    /* In a map with no pending key, this node is the key. */
    if (n->kind != BEAM_CN_SCALAR) {
      lerr(L, m, "%s", "mapping keys must be plain strings, not maps or lists");
      beam_cnode_free(n);
      f->key = strdup("?"); /* keeps key/value pairing for the rest of the map */
      f->key_line = (int)m.line + 1;
      f->key_col = (int)m.column + 1;
      return f->key ? 0 : BEAM_ENOMEM;
    }
    f->key = n->scalar ? n->scalar : strdup("");
    n->scalar = NULL;
    f->key_line = n->line;
    f->key_col = n->col;
    beam_cnode_free(n);
    return f->key ? 0 : BEAM_ENOMEM;
  }
  int rc = beam_cnode_map_add(f->node, f->key, f->key_line, f->key_col, n);
  free(f->key);
  f->key = NULL;
  return rc;
}

static int no_extras(loader_t *L, const yaml_char_t *anchor, const yaml_char_t *tag,
                     yaml_mark_t m) {
  int ok = 1;
  if (anchor) {
    lerr(L, m, "anchors (&%s) are not supported; write the value out in full",
         (const char *)anchor);
    ok = 0;
  }
  if (tag) {
    /* libyaml hands back the resolved tag; show it as it was written. */
    static const char core[] = "tag:yaml.org,2002:";
    const char *t = (const char *)tag;
    char shown[128];
    if (!strncmp(t, core, sizeof core - 1))
      snprintf(shown, sizeof shown, "!!%s", t + sizeof core - 1);
    else
      snprintf(shown, sizeof shown, "%s", t);
    lerr(L, m, "tags (%s) are not supported; the schema decides each value's type", shown);
    ok = 0;
  }
  return ok;
}

static int on_event(loader_t *L, yaml_event_t *ev, int *docs) {
  yaml_mark_t m = ev->start_mark;
  int line = (int)m.line + 1, col = (int)m.column + 1;
  beam_cnode_t *n;
  switch (ev->type) {
  case YAML_DOCUMENT_START_EVENT:
    if (++*docs > 1) {
      lerr(L, m, "%s", "a configuration file holds one YAML document (found a second \"---\")");
      return 1; /* stop: the rest belongs to another document */
    }
    return 0;
  case YAML_ALIAS_EVENT:
    lerr(L, m, "aliases (*%s) are not supported; write the value out in full",
         (const char *)ev->data.alias.anchor);
    /* A null placeholder keeps the map's key/value pairing intact. */
    n = beam_cnode_new(BEAM_CN_SCALAR, L->name, line, col);
    if (!n || !(n->scalar = strdup(""))) {
      beam_cnode_free(n);
      return -1;
    }
    return attach(L, n, m) < 0 ? -1 : 0;
  case YAML_SCALAR_EVENT: {
    no_extras(L, ev->data.scalar.anchor, ev->data.scalar.tag, m);
    size_t len = ev->data.scalar.length;
    const char *v = (const char *)ev->data.scalar.value;
    if (memchr(v, '\0', len))
      lerr(L, m, "%s", "a NUL character is not allowed in a value");
    n = beam_cnode_new(BEAM_CN_SCALAR, L->name, line, col);
    if (!n || !(n->scalar = strndup(v, len))) {
      beam_cnode_free(n);
      return -1;
    }
    /* Block scalars (| and >) are text too: never numbers or booleans. */
    n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    return attach(L, n, m) < 0 ? -1 : 0;
  }
  case YAML_SEQUENCE_START_EVENT:
  case YAML_MAPPING_START_EVENT: {
    int is_map = ev->type == YAML_MAPPING_START_EVENT;
    if (is_map)
      no_extras(L, ev->data.mapping_start.anchor, ev->data.mapping_start.tag, m);
    else
      no_extras(L, ev->data.sequence_start.anchor, ev->data.sequence_start.tag, m);
    if (L->depth >= MAX_DEPTH) {
      lerr(L, m, "nesting deeper than %s levels", "64");
      return 1;
    }
    n = beam_cnode_new(is_map ? BEAM_CN_MAP : BEAM_CN_SEQ, L->name, line, col);
    if (!n)
      return -1;
    L->stack[L->depth].node = n;
    L->stack[L->depth].key = NULL;
    L->depth++;
    return 0;
  }
  case YAML_SEQUENCE_END_EVENT:
  case YAML_MAPPING_END_EVENT: {
    frame_t *f = &L->stack[--L->depth];
    free(f->key);
    f->key = NULL;
    n = f->node;
    f->node = NULL;
    yaml_mark_t start = {0, (size_t)(n->line - 1), (size_t)(n->col - 1)};
    return attach(L, n, start) < 0 ? -1 : 0;
  }
  default:
    return 0;
  }
}

beam_cnode_t *beam_yaml_parse(const char *text, size_t len, const char *name,
                              beam_cfg_errs_t *errs) {
  loader_t L = {0};
  L.name = name ? name : "<string>";
  L.text = text;
  L.len = len;
  L.errs = errs;
  yaml_parser_t p;
  if (!yaml_parser_initialize(&p)) {
    beam_cfg_err_at(errs, L.name, 0, 0, "out of memory while parsing");
    return NULL;
  }
  yaml_parser_set_input_string(&p, (const unsigned char *)(text ? text : ""), text ? len : 0);
  int docs = 0, done = 0, oom = 0;
  while (!done) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&p, &ev)) {
      parser_error(&L, &p);
      break;
    }
    int rc = on_event(&L, &ev, &docs);
    done = ev.type == YAML_STREAM_END_EVENT || rc != 0;
    oom = rc < 0;
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&p);
  if (oom) {
    beam_cfg_err_at(errs, L.name, 0, 0, "out of memory while parsing");
    L.nerr++;
  }
  /* Unwind whatever a syntax error left open. */
  while (L.depth > 0) {
    frame_t *f = &L.stack[--L.depth];
    free(f->key);
    beam_cnode_free(f->node);
  }
  if (L.nerr) {
    beam_cnode_free(L.root);
    return NULL;
  }
  /* A file with only comments is an empty configuration: all defaults. */
  if (!L.root || (L.root->kind == BEAM_CN_SCALAR && !L.root->quoted && L.root->scalar &&
                  !L.root->scalar[0])) {
    beam_cnode_free(L.root);
    L.root = beam_cnode_new(BEAM_CN_MAP, L.name, 1, 1);
    if (!L.root)
      beam_cfg_err_at(errs, L.name, 0, 0, "out of memory while parsing");
  }
  return L.root;
}
