/* Keeps etc/beamd.yaml, the reference manual, in step with the schema.
 *
 * The file must load cleanly, and every key of beam_config_params
 * (recursively) and of every stage kind's params must appear in it, in the
 * right place, with a comment block that follows the convention stated at
 * the top of the file:
 *   - the block is the run of comment lines right above the key's line,
 *     ended by a blank line or a bare "#";
 *   - it contains "required" for a required key, "default: <def>" (the
 *     schema's text, "" written as "") for a key with a default, and
 *     "default: none" for any other optional key except sections;
 *   - it contains "range: <min>..<max>" for numeric, size and duration keys
 *     that have bounds (sizes as 1Ki/16Mi/4Gi, durations with "s", "-inf"
 *     and "inf" for an unbounded side; none when both sides are unbounded).
 * A key may be written commented out ("# key: value"); its indentation is
 * then the column of '#' plus the spaces after it, less one.
 *
 * Stage kinds are found through the loaded tree: the first stage of each
 * kind in `stages:` is that kind's example, and its keys are looked for
 * between it and the next stage. A new param without documentation, or a
 * default changed in the code but not in the file, fails this test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/stage_record.h"
#include "daemon/config.h"
#include "proto/err.h"
#include "pipeline/stage.h"

typedef struct line_s {
  const char *text;
  int blank, comment, bare_hash; /* bare_hash: a comment with no text */
  char key[64];                  /* "" when the line holds no key */
  int indent;                    /* of the key (see the header) */
  int content_indent;            /* for non-comment lines: where the content starts */
} line_t;

typedef struct doc_s {
  char *text;
  line_t *lines;
  size_t n;
  char report[16384];
  size_t rlen;
  int failures;
} doc_t;

static void problem(doc_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(doc_t *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (d->rlen + 2 < sizeof d->report) {
    int w = vsnprintf(d->report + d->rlen, sizeof d->report - d->rlen - 1, fmt, ap);
    if (w > 0)
      d->rlen += (size_t)w < sizeof d->report - d->rlen - 1 ? (size_t)w
                                                            : sizeof d->report - d->rlen - 2;
    d->report[d->rlen++] = '\n';
    d->report[d->rlen] = '\0';
  }
  va_end(ap);
  d->failures++;
}

/* "key:" followed by a space or the end of the line, key in [a-z_0-9]. */
static int scan_key(const char *s, char *key, size_t cap) {
  size_t i = 0;
  if (!(s[0] >= 'a' && s[0] <= 'z') && s[0] != '_')
    return 0;
  while ((islower((unsigned char)s[i]) || isdigit((unsigned char)s[i]) || s[i] == '_') &&
         i + 1 < cap) {
    key[i] = s[i];
    i++;
  }
  key[i] = '\0';
  return s[i] == ':' && (s[i + 1] == ' ' || s[i + 1] == '\0');
}

static void classify(line_t *l) {
  const char *s = l->text;
  int sp = 0;
  while (s[sp] == ' ')
    sp++;
  l->blank = s[sp] == '\0';
  l->comment = s[sp] == '#';
  l->key[0] = '\0';
  l->content_indent = sp;
  if (l->blank)
    return;
  int col = sp;
  const char *p = s + sp;
  if (l->comment) {
    int after = 0;
    p++;
    while (p[after] == ' ')
      after++;
    l->bare_hash = p[after] == '\0';
    p += after;
    col = sp + (after > 0 ? after - 1 : 0);
  }
  if (p[0] == '-' && p[1] == ' ') {
    p += 2;
    col += 2;
  }
  if (!l->comment)
    l->content_indent = col;
  if (scan_key(p, l->key, sizeof l->key))
    l->indent = col;
  else
    l->key[0] = '\0';
}

static void doc_load(doc_t *d, char *text) {
  memset(d, 0, sizeof *d);
  d->text = text;
  size_t cap = 16;
  d->lines = malloc(cap * sizeof *d->lines);
  for (char *p = text; p && *p;) {
    char *nl = strchr(p, '\n');
    if (nl)
      *nl = '\0';
    if (d->n == cap)
      d->lines = realloc(d->lines, (cap *= 2) * sizeof *d->lines);
    memset(&d->lines[d->n], 0, sizeof *d->lines);
    d->lines[d->n].text = p;
    classify(&d->lines[d->n]);
    d->n++;
    p = nl ? nl + 1 : NULL;
  }
}

/* The comment block right above line i, joined; "" when there is none. */
static void doc_block(const doc_t *d, size_t i, char *out, size_t cap) {
  size_t start = i;
  while (start > 0 && d->lines[start - 1].comment && !d->lines[start - 1].bare_hash)
    start--;
  size_t o = 0;
  out[0] = '\0';
  for (size_t k = start; k < i && o + 2 < cap; k++)
    o += (size_t)snprintf(out + o, cap - o, "%s\n", d->lines[k].text);
}

/* needle present and followed by the end, a space, a newline or ,;) or a
 * full stop that ends the sentence. */
static int has_phrase(const char *hay, const char *needle) {
  size_t len = strlen(needle);
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) {
    char c = p[len];
    if (c == '\0' || c == ' ' || c == '\n' || c == ',' || c == ';' || c == ')')
      return 1;
    if (c == '.' && (p[len + 1] == ' ' || p[len + 1] == '\n' || p[len + 1] == '\0'))
      return 1;
  }
  return 0;
}

static void fmt_num(char *out, size_t cap, double v) {
  for (int p = 15; p <= 17; p++) {
    snprintf(out, cap, "%.*g", p, v);
    if (strtod(out, NULL) == v)
      return;
  }
}

static void fmt_bound(char *out, size_t cap, beam_ptype_t t, double v, int lower) {
  if (lower ? v <= -1e300 : v >= 1e300) {
    snprintf(out, cap, lower ? "-inf" : "inf");
    return;
  }
  if (t == BEAM_P_SIZE) {
    static const char *u[] = {"Gi", "Mi", "Ki"};
    static const double m[] = {1073741824.0, 1048576.0, 1024.0};
    for (int i = 0; i < 3; i++)
      if (v >= m[i] && fmod(v, m[i]) == 0) {
        snprintf(out, cap, "%.0f%s", v / m[i], u[i]);
        return;
      }
  }
  char b[40];
  fmt_num(b, sizeof b, v);
  snprintf(out, cap, "%s%s", b, t == BEAM_P_DURATION ? "s" : "");
}

static int numeric(beam_ptype_t t) {
  return t == BEAM_P_INT || t == BEAM_P_FLOAT || t == BEAM_P_SIZE || t == BEAM_P_DURATION ||
         t == BEAM_P_INT_LIST || t == BEAM_P_FLOAT_LIST;
}

/* What is wrong with this block for p, or NULL. */
static const char *block_problem(const beam_param_t *p, const char *block, char *why,
                                 size_t cap) {
  char want[256];
  if (!block[0])
    return "has no comment above it";
  if (p->required && !strstr(block, "required"))
    return "is required but its comment does not say \"required\"";
  if (p->def) {
    snprintf(want, sizeof want, "default: %s", p->def[0] ? p->def : "\"\"");
    if (!has_phrase(block, want)) {
      snprintf(why, cap, "has a default but its comment does not say \"%s\"", want);
      return why;
    }
  } else if (!p->required && p->type != BEAM_P_MAP && !has_phrase(block, "default: none")) {
    return "is optional without a default but its comment does not say \"default: none\"";
  }
  if (numeric(p->type) && p->min <= p->max && !(p->min <= -1e300 && p->max >= 1e300)) {
    char lo[64], hi[64];
    fmt_bound(lo, sizeof lo, p->type, p->min, 1);
    fmt_bound(hi, sizeof hi, p->type, p->max, 0);
    snprintf(want, sizeof want, "range: %s..%s", lo, hi);
    if (!has_phrase(block, want)) {
      snprintf(why, cap, "has bounds but its comment does not say \"%s\"", want);
      return why;
    }
  }
  return NULL;
}

/* Last line of the block opened by the key at line k: up to the next
 * non-comment line indented no deeper than the key. */
static size_t sub_end(const doc_t *d, size_t k, size_t end) {
  int ind = d->lines[k].indent;
  for (size_t i = k + 1; i <= end; i++) {
    const line_t *l = &d->lines[i];
    if (!l->blank && !l->comment && l->content_indent <= ind)
      return i - 1;
  }
  return end;
}

static void check_params(doc_t *d, const beam_param_t *params, size_t a, size_t b,
                         int indent, const char *ctx);

/* Indentation of the children in [a, b]: that of the first line whose key
 * is one of params (commented or not), or -1. */
static int child_indent(const doc_t *d, const beam_param_t *params, size_t a, size_t b) {
  for (size_t i = a; i <= b && i < d->n; i++)
    for (const beam_param_t *p = params; d->lines[i].key[0] && p->name; p++)
      if (!strcmp(d->lines[i].key, p->name))
        return d->lines[i].indent;
  return -1;
}

static void check_params(doc_t *d, const beam_param_t *params, size_t a, size_t b,
                         int indent, const char *ctx) {
  char block[4096], why[512], reason[512], path[256];
  for (const beam_param_t *p = params; p && p->name; p++) {
    snprintf(path, sizeof path, "%s%s%s", ctx, ctx[0] ? "." : "", p->name);
    size_t found = (size_t)-1, any = (size_t)-1;
    reason[0] = '\0';
    /* Any one well-documented occurrence will do (a key such as `name`
     * appears once per example). */
    for (size_t i = a; i <= b && i < d->n; i++) {
      const line_t *l = &d->lines[i];
      if (strcmp(l->key, p->name) || l->indent != indent)
        continue;
      doc_block(d, i, block, sizeof block);
      const char *w = block_problem(p, block, why, sizeof why);
      if (!w) {
        found = i;
        break;
      }
      if (any == (size_t)-1) {
        any = i;
        snprintf(reason, sizeof reason, "%s", w);
      }
    }
    if (found == (size_t)-1) {
      if (any == (size_t)-1)
        problem(d, "%s: is not in etc/beamd.yaml (expected at indentation %d)", path, indent);
      else
        problem(d, "%s (line %zu) %s", path, any + 1, reason);
      continue;
    }
    if ((p->type == BEAM_P_MAP || p->type == BEAM_P_MAP_LIST) && p->sub) {
      size_t e = sub_end(d, found, b);
      int ci = child_indent(d, p->sub, found + 1, e);
      if (ci <= d->lines[found].indent)
        problem(d, "%s (line %zu): none of its keys are documented below it", path, found + 1);
      else
        check_params(d, p->sub, found + 1, e, ci, path);
    }
  }
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0, r;
  char *buf = malloc(cap);
  while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (n + 1 == cap)
      buf = realloc(buf, cap *= 2);
  }
  fclose(f);
  buf[n] = '\0';
  return buf;
}

/* Checks text (the reference file, possibly edited by a test) and returns
 * the number of problems; the report is in d->report. */
static int check_reference(doc_t *d, const char *text_in, const char *name) {
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  char *text = strdup(text_in);
  doc_load(d, text);
  if (beam_config_load_string(text_in, strlen(text_in), name, &c, &e) != 0) {
    for (size_t i = 0; i < e.n; i++)
      problem(d, "%s", e.msgs[i]);
    beam_cfg_errs_free(&e);
    return d->failures;
  }
  /* The top level, sections recursively. */
  check_params(d, beam_config_params, 0, d->n - 1, 0, "");

  /* Each stage kind: its first example between it and the next stage. */
  const beam_cnode_t *seq = beam_cfg_get(c->root, "stages");
  const beam_stage_kind_t *const *kinds = beam_stage_kinds();
  for (size_t k = 0; kinds[k]; k++) {
    size_t j;
    for (j = 0; j < beam_cfg_len(seq); j++)
      if (!strcmp(beam_cfg_str(beam_cfg_at(seq, j), "kind"), kinds[k]->kind))
        break;
    if (j == beam_cfg_len(seq)) {
      problem(d, "stage kind %s: no example under stages:", kinds[k]->kind);
      continue;
    }
    /* A stage's region starts with the comment block above its first key,
     * and ends where the next stage's does. */
    size_t start = (size_t)beam_cfg_at(seq, j)->line - 1;
    while (start > 0 && d->lines[start - 1].comment && !d->lines[start - 1].bare_hash)
      start--;
    size_t end = d->n - 1;
    if (j + 1 < beam_cfg_len(seq)) {
      end = (size_t)beam_cfg_at(seq, j + 1)->line - 1;
      while (end > 0 && d->lines[end - 1].comment && !d->lines[end - 1].bare_hash)
        end--;
      end = end > 0 ? end - 1 : 0;
    }
    const beam_cnode_t *item = beam_cfg_at(seq, j);
    char ctx[96];
    snprintf(ctx, sizeof ctx, "stage kind %s", kinds[k]->kind);
    check_params(d, kinds[k]->params, start, end, item->col - 1, ctx);
  }
  beam_config_free(&c);
  return d->failures;
}

static void doc_free(doc_t *d) {
  free(d->text);
  free(d->lines);
}

static char *reference_text(void) {
  const char *src = getenv("BEAM_SRCDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/etc/beamd.yaml", src && src[0] ? src : ".");
  char *t = read_text(path);
  if (!t) {
    print_error("cannot read %s (set BEAM_SRCDIR to the source tree)\n", path);
    fail();
  }
  return t;
}

/* etc/NAME loaded; fails the test on any error. */
static beam_config_t *load_etc(const char *name) {
  const char *src = getenv("BEAM_SRCDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/etc/%s", src && src[0] ? src : ".", name);
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  int rc = beam_config_load_file(path, &c, &e);
  for (size_t i = 0; i < e.n; i++)
    print_error("%s\n", e.msgs[i]);
  assert_int_equal(rc, 0);
  assert_int_equal(e.n, 0);
  beam_cfg_errs_free(&e);
  return c;
}

static void test_reference_loads(void **state) {
  beam_config_t *c = load_etc("beamd.yaml");
  /* What the file sets matches the built-in defaults it documents. */
  assert_string_equal(c->input.endpoint, "tcp://127.0.0.1:5500");
  assert_int_equal(c->pool.frames, 128);
  beam_config_free(&c);
}

/* etc/beamd-minimal.yaml, what `make install` puts in /etc: it must load,
 * and stay safe to start as it is: every socket on loopback, no stage
 * writing to disk. */
static void test_minimal_loads_and_is_safe(void **state) {
  beam_config_t *c = load_etc("beamd-minimal.yaml");
  assert_true(c->nstages >= 1);
  int previews = 0;
  for (size_t i = 0; i < c->nstages; i++) {
    if (!strcmp(c->stages[i].kind, "record"))
      print_error("stage \"%s\" records to disk\n", c->stages[i].name);
    assert_string_not_equal(c->stages[i].kind, "record");
    previews += !strcmp(c->stages[i].kind, "preview");
  }
  assert_true(previews >= 1);
  const char *eps[] = {c->input.endpoint, beam_cfg_str(beam_cfg_get(c->root, "output"), "publish"),
                       beam_cfg_str(beam_cfg_get(c->root, "control"), "endpoint"),
                       beam_cfg_str(beam_cfg_get(c->root, "metrics"), "listen")};
  for (size_t i = 0; i < sizeof eps / sizeof *eps; i++) {
    assert_non_null(eps[i]);
    if (!strstr(eps[i], "127.0.0.1"))
      print_error("not on loopback: %s\n", eps[i]);
    assert_non_null(strstr(eps[i], "127.0.0.1"));
  }
  const char *push = beam_cfg_str(beam_cfg_get(c->root, "output"), "push");
  assert_true(!push || !push[0]);
  assert_int_equal(c->pool.pinned, 0);
  beam_config_free(&c);
}

static void test_reference_documents_schema(void **state) {
  char *text = reference_text();
  doc_t d;
  int n = check_reference(&d, text, "etc/beamd.yaml");
  if (n)
    print_error("etc/beamd.yaml is out of step with the schema:\n%s", d.report);
  assert_int_equal(n, 0);
  doc_free(&d);
  free(text);
}

/* Replaces the first occurrence of from with to (to may be ""). */
static char *edit(const char *text, const char *from, const char *to) {
  const char *p = strstr(text, from);
  assert_non_null(p);
  size_t a = (size_t)(p - text), fl = strlen(from), tl = strlen(to);
  char *out = malloc(strlen(text) - fl + tl + 1);
  memcpy(out, text, a);
  memcpy(out + a, to, tl);
  strcpy(out + a + tl, p + fl);
  return out;
}

/* The checker must catch each kind of drift (a checker that passes
 * everything would make the test above worthless). */
static void test_checker_catches_drift(void **state) {
  char *text = reference_text();
  static const struct { const char *from, *to, *expect; } cases[] = {
      /* a default that no longer matches the code */
      {"    # range: 1..4096. default: 64",
       "    # range: 1..4096. default: 65", "input.replay.credit (line"},
      /* a key removed from the file */
      {"    credit: 64\n", "", "input.replay.credit: is not in etc/beamd.yaml"},
      /* a range that no longer matches */
      {"range: 1..1048576. default: 128", "range: 1..1000000. default: 128",
       "pool.frames (line"},
      /* a stage kind's key without its comment */
      {"    # Sum or mean over each block: one of sum|mean. default: sum\n", "",
       "stage kind bin.mode (line"},
      /* a nested key of a list of maps */
      {"        # Geometry: one of disk|annulus|rect. required\n", "",
       "stage kind roi_sum.rois.shape (line"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *t = edit(text, cases[i].from, cases[i].to);
    doc_t d;
    int n = check_reference(&d, t, "edited.yaml");
    if (n < 1 || !strstr(d.report, cases[i].expect))
      print_error("case %zu: report was:\n%s\n", i, d.report);
    assert_true(n >= 1);
    assert_non_null(strstr(d.report, cases[i].expect));
    doc_free(&d);
    free(t);
  }
  free(text);
}

int main(void) {
  beam_record_stage_register();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_loads),
      cmocka_unit_test(test_minimal_loads_and_is_safe),
      cmocka_unit_test(test_reference_documents_schema),
      cmocka_unit_test(test_checker_catches_drift),
  };
  return beam_run_tests(tests, NULL, NULL);
}
