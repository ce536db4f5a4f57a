/* Unit tests of the configuration system: every scalar type's conversion
 * and its error message, defaults, accessors, duplicate and unknown keys,
 * collecting every error at once, the stage graph cross-checks, the
 * built-in default and the dump round trip. The files under tests/configs
 * are exercised by test_config_files.c; etc/beamd.yaml by
 * test_config_sanity.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "proto/err.h"

static const char *no_x(const beam_cnode_t *v) {
  return v->scalar && !strcmp(v->scalar, "x") ? "must not be x" : NULL;
}

static const beam_param_t sub_p[] = {
    {"name", BEAM_P_STRING, NULL, 1, 0, 0, NULL, NULL, "name", NULL},
    {"shape", BEAM_P_ENUM, NULL, 1, 0, 0, "disk|rect", NULL, "shape", NULL},
    {"r", BEAM_P_FLOAT, "1", 0, 0, 10, NULL, NULL, "radius", NULL},
    BEAM_PARAM_END};

static const beam_param_t opt_p[] = {
    {"level", BEAM_P_INT, "3", 0, 0, 9, NULL, NULL, "level", NULL}, BEAM_PARAM_END};

static const beam_param_t tp[] = {
    {"i", BEAM_P_INT, "5", 0, 1, 100, NULL, NULL, "int", NULL},
    {"f", BEAM_P_FLOAT, "0.5", 0, -1e300, 1e300, NULL, NULL, "float, unbounded", NULL},
    {"fr", BEAM_P_FLOAT, NULL, 0, 0, 1, NULL, NULL, "float in 0..1", NULL},
    {"fl0", BEAM_P_FLOAT, NULL, 0, 0, 1e300, NULL, NULL, "float >= 0", NULL},
    {"b", BEAM_P_BOOL, "no", 0, 0, 0, NULL, NULL, "bool", NULL},
    {"s", BEAM_P_STRING, "hello", 0, 0, 0, NULL, NULL, "string", NULL},
    {"e", BEAM_P_ENUM, "cpu", 0, 0, 0, "cpu|cuda|auto", NULL, "enum", NULL},
    {"sz", BEAM_P_SIZE, "16Mi", 0, 1024, 4294967296.0, NULL, NULL, "size", NULL},
    {"usz", BEAM_P_SIZE, NULL, 0, 0, -1, NULL, NULL, "size, no range", NULL},
    {"d", BEAM_P_DURATION, "1s", 0, 0.05, 60, NULL, NULL, "duration", NULL},
    {"ud", BEAM_P_DURATION, NULL, 0, 0, -1, NULL, NULL, "duration, no range", NULL},
    {"ep", BEAM_P_ENDPOINT, "", 0, 0, 0, NULL, NULL, "endpoint", NULL},
    {"p", BEAM_P_PATH, NULL, 0, 0, 0, NULL, NULL, "path", NULL},
    {"il", BEAM_P_INT_LIST, NULL, 0, 0, 10, NULL, NULL, "ints", NULL},
    {"fl", BEAM_P_FLOAT_LIST, NULL, 0, -1, 1, NULL, NULL, "floats", NULL},
    {"dl", BEAM_P_INT_LIST, "[1, 2]", 0, 0, 10, NULL, NULL, "ints with a default", NULL},
    {"m", BEAM_P_MAP, NULL, 0, 0, 0, NULL, sub_p, "map with required keys", NULL},
    {"o", BEAM_P_MAP, NULL, 0, 0, 0, NULL, opt_p, "map of optional keys", NULL},
    {"ml", BEAM_P_MAP_LIST, NULL, 0, 0, 0, NULL, sub_p, "list of maps", NULL},
    {"v", BEAM_P_STRING, NULL, 0, 0, 0, NULL, NULL, "checked string", no_x},
    {"any", BEAM_P_ANY, NULL, 0, 0, 0, NULL, NULL, "anything", NULL},
    BEAM_PARAM_END};

static const beam_param_t req_p[] = {
    {"must", BEAM_P_INT, NULL, 1, 0, 0, NULL, NULL, "required", NULL}, BEAM_PARAM_END};

/* Parses yaml and validates it against tp with ctx "t"; returns the tree
 * (freed by the caller) and leaves messages in e. */
static beam_cnode_t *vparse(const char *yaml, beam_cfg_errs_t *e, int *nerr) {
  beam_cnode_t *root = beam_yaml_parse(yaml, strlen(yaml), "t.yaml", e);
  assert_non_null(root);
  *nerr = beam_cfg_validate(root, tp, "t", e);
  return root;
}

static void expect_ok(const char *yaml, beam_cnode_t **out) {
  beam_cfg_errs_t e = {0};
  int n;
  beam_cnode_t *root = vparse(yaml, &e, &n);
  for (size_t i = 0; i < e.n; i++)
    print_error("unexpected: %s\n", e.msgs[i]);
  assert_int_equal(n, 0);
  assert_int_equal(e.n, 0);
  beam_cfg_errs_free(&e);
  if (out)
    *out = root;
  else
    beam_cnode_free(root);
}

/* Exactly one error, with this text. */
static void expect_err(const char *yaml, const char *msg) {
  beam_cfg_errs_t e = {0};
  int n;
  beam_cnode_t *root = vparse(yaml, &e, &n);
  for (size_t i = 0; i < e.n; i++)
    if (e.n != 1 || strcmp(e.msgs[i], msg))
      print_error("for %s got: %s\nwanted: %s\n", yaml, e.msgs[i], msg);
  assert_int_equal(n, 1);
  assert_int_equal(e.n, 1);
  assert_string_equal(e.msgs[0], msg);
  beam_cfg_errs_free(&e);
  beam_cnode_free(root);
}

static void test_int(void **state) {
  beam_cnode_t *r;
  expect_ok("i: 42", &r);
  assert_int_equal(beam_cfg_int(r, "i", -1), 42);
  assert_true(beam_cfg_get(r, "i")->typed);
  beam_cnode_free(r);
  expect_ok("i: +7", &r);
  assert_int_equal(beam_cfg_int(r, "i", -1), 7);
  beam_cnode_free(r);
  expect_err("i: abc", "t.yaml:1:4: error: t.i: expected an integer, got \"abc\"");
  expect_err("i: 1.5", "t.yaml:1:4: error: t.i: expected an integer, got \"1.5\"");
  expect_err("i: 0", "t.yaml:1:4: error: t.i: 0 is below the minimum 1");
  expect_err("i: 101", "t.yaml:1:4: error: t.i: 101 is above the maximum 100");
  expect_err("i: 99999999999999999999",
             "t.yaml:1:4: error: t.i: 99999999999999999999 is out of range for a 64-bit integer");
  expect_err("i: '5'",
             "t.yaml:1:4: error: t.i: expected an integer, got the string \"5\" (remove the quotes)");
  expect_err("i: [1]", "t.yaml:1:4: error: t.i: expected an integer, got a list");
  expect_err("i:", "t.yaml:1:3: error: t.i: expected an integer, got an empty value");
}

static void test_float(void **state) {
  beam_cnode_t *r;
  expect_ok("f: 1e3\nfr: 0.25\nfl0: inf", &r);
  assert_true(beam_cfg_float(r, "f", 0) == 1000.0);
  assert_true(beam_cfg_float(r, "fr", 0) == 0.25);
  assert_true(isinf(beam_cfg_float(r, "fl0", 0)));
  beam_cnode_free(r);
  expect_ok("f: -inf", &r);
  assert_true(isinf(beam_cfg_float(r, "f", 0)) && beam_cfg_float(r, "f", 0) < 0);
  beam_cnode_free(r);
  expect_ok("f: nan", &r);
  assert_true(isnan(beam_cfg_float(r, "f", 0)));
  beam_cnode_free(r);
  expect_ok("f: .inf", &r);
  assert_true(isinf(beam_cfg_float(r, "f", 0)));
  beam_cnode_free(r);
  expect_err("f: x1", "t.yaml:1:4: error: t.f: expected a number, got \"x1\"");
  expect_err("f: 0x10", "t.yaml:1:4: error: t.f: expected a number, got \"0x10\"");
  expect_err("fr: 2", "t.yaml:1:5: error: t.fr: 2 is above the maximum 1");
  expect_err("fr: -0.5", "t.yaml:1:5: error: t.fr: -0.5 is below the minimum 0");
  expect_err("fr: inf", "t.yaml:1:5: error: t.fr: inf is above the maximum 1");
  expect_err("fr: nan", "t.yaml:1:5: error: t.fr: nan is not allowed here (range 0..1)");
  expect_err("fl0: -inf", "t.yaml:1:6: error: t.fl0: -inf is below the minimum 0");
  expect_err("fl0: nan", "t.yaml:1:6: error: t.fl0: nan is not allowed here (range 0..inf)");
  expect_err("f: \"1.0\"",
             "t.yaml:1:4: error: t.f: expected a number, got the string \"1.0\" (remove the quotes)");
}

static void test_bool(void **state) {
  static const char *yes[] = {"true", "yes", "on", "TRUE", "Yes"};
  static const char *no[] = {"false", "no", "off", "False"};
  char buf[64];
  beam_cnode_t *r;
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
    snprintf(buf, sizeof buf, "b: %s", yes[i]);
    expect_ok(buf, &r);
    assert_int_equal(beam_cfg_bool(r, "b", 0), 1);
    assert_string_equal(beam_cfg_str(r, "b"), "true"); /* normalised */
    beam_cnode_free(r);
  }
  for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
    snprintf(buf, sizeof buf, "b: %s", no[i]);
    expect_ok(buf, &r);
    assert_int_equal(beam_cfg_bool(r, "b", 1), 0);
    beam_cnode_free(r);
  }
  expect_err("b: maybe",
             "t.yaml:1:4: error: t.b: expected a boolean (true/false, yes/no, on/off), got \"maybe\"");
  expect_err("b: 1",
             "t.yaml:1:4: error: t.b: expected a boolean (true/false, yes/no, on/off), got \"1\"");
}

static void test_string_enum_path(void **state) {
  beam_cnode_t *r;
  expect_ok("s: 123\ne: cuda\np: /data/x.h5\nv: y", &r);
  assert_string_equal(beam_cfg_str(r, "s"), "123");
  assert_string_equal(beam_cfg_str(r, "e"), "cuda");
  assert_int_equal(beam_cfg_int(r, "e", -1), 1); /* enum index */
  assert_string_equal(beam_cfg_str(r, "p"), "/data/x.h5");
  beam_cnode_free(r);
  expect_ok("s: \"\"", NULL);
  expect_err("e: gpu", "t.yaml:1:4: error: t.e: expected one of cpu|cuda|auto, got \"gpu\"");
  expect_err("e: CPU", "t.yaml:1:4: error: t.e: expected one of cpu|cuda|auto, got \"CPU\"");
  expect_err("p: \"\"", "t.yaml:1:4: error: t.p: a path cannot be empty");
  expect_err("s:",
             "t.yaml:1:3: error: t.s: expected a string, got an empty value (write \"\" for an "
             "empty string)");
  expect_err("s: {a: 1}", "t.yaml:1:4: error: t.s: expected a string, got a map");
  expect_err("v: x", "t.yaml:1:4: error: t.v: invalid value \"x\": must not be x");
}

static void test_size(void **state) {
  static const struct { const char *text; int64_t v; } ok[] = {
      {"1024", 1024},          {"2k", 2000},         {"3M", 3000000},
      {"1G", 1000000000},      {"1Ki", 1024},        {"16Mi", 16777216},
      {"1Gi", 1073741824},     {"4Gi", 4294967296LL}, {"1.5Ki", 1536},
      {"16 Mi", 16777216}};
  char buf[64];
  beam_cnode_t *r;
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    snprintf(buf, sizeof buf, "sz: %s", ok[i].text);
    expect_ok(buf, &r);
    assert_int_equal(beam_cfg_int(r, "sz", -1), ok[i].v);
    beam_cnode_free(r);
  }
  expect_ok("usz: 0", &r);
  assert_int_equal(beam_cfg_int(r, "usz", -1), 0);
  beam_cnode_free(r);
  expect_err("sz: 512", "t.yaml:1:5: error: t.sz: 512 is below the minimum 1Ki");
  expect_err("sz: 5Gi", "t.yaml:1:5: error: t.sz: 5Gi is above the maximum 4Gi");
  expect_err("sz: 16MB",
             "t.yaml:1:5: error: t.sz: expected a size (bytes, optional suffix k, M, G, Ki, Mi, "
             "Gi), got \"16MB\"");
  expect_err("sz: -1",
             "t.yaml:1:5: error: t.sz: expected a size (bytes, optional suffix k, M, G, Ki, Mi, "
             "Gi), got \"-1\"");
  expect_err("usz: 0.5", "t.yaml:1:6: error: t.usz: 0.5 is not a whole number of bytes");
  expect_err("usz: 99999999999G", "t.yaml:1:6: error: t.usz: 99999999999G is too large");
}

static void test_duration(void **state) {
  static const struct { const char *text; double v; } ok[] = {
      {"0.5", 0.5}, {"2s", 2}, {"250ms", 0.25}, {"1min", 60}, {"60", 60}};
  char buf[64];
  beam_cnode_t *r;
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    snprintf(buf, sizeof buf, "d: %s", ok[i].text);
    expect_ok(buf, &r);
    assert_true(fabs(beam_cfg_float(r, "d", -1) - ok[i].v) <= 1e-12);
    beam_cnode_free(r);
  }
  expect_ok("ud: 2h", &r);
  assert_true(beam_cfg_float(r, "ud", -1) == 7200.0);
  beam_cnode_free(r);
  expect_err("d: 10ms", "t.yaml:1:4: error: t.d: 10ms is below the minimum 0.05s");
  expect_err("d: 2min", "t.yaml:1:4: error: t.d: 2min is above the maximum 60s");
  expect_err("d: 1sec",
             "t.yaml:1:4: error: t.d: expected a duration (seconds, optional suffix ms, s, min, "
             "h), got \"1sec\"");
}

static void test_endpoint(void **state) {
  static const char *ok[] = {"tcp://127.0.0.1:5500", "tcp://*:5600", "tcp://[::1]:7",
                             "tcp://detector-3.lan:9999", "tcp://127.0.0.1:*",
                             "ipc:///run/beamd/results", "inproc://x", "\"\""};
  char buf[128];
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    snprintf(buf, sizeof buf, "ep: %s", ok[i]);
    expect_ok(buf, NULL);
  }
  expect_err("ep: udp://x:1",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"udp://x:1\": unsupported transport "
             "(expected tcp://, ipc:// or inproc://)");
  expect_err("ep: localhost:5",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"localhost:5\": expected "
             "tcp://host:port, ipc://path or inproc://name (\"\" disables it)");
  expect_err("ep: tcp://host",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"tcp://host\": missing \":port\" after "
             "the host");
  expect_err("ep: tcp://h:0",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"tcp://h:0\": the port must be 1..65535 "
             "(or * for any)");
  expect_err("ep: tcp://h:70000",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"tcp://h:70000\": the port must be "
             "1..65535 (or * for any)");
  expect_err("ep: tcp://:5",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"tcp://:5\": missing host before "
             "\":port\" (use * for every interface)");
  expect_err("ep: ipc://", "t.yaml:1:5: error: t.ep: invalid endpoint \"ipc://\": ipc:// needs a path");
  expect_err("ep: inproc://",
             "t.yaml:1:5: error: t.ep: invalid endpoint \"inproc://\": inproc:// needs a name");
}

static void test_lists(void **state) {
  beam_cnode_t *r;
  expect_ok("il: [1, 2, 10]\nfl: [-1, 0.5, 1]", &r);
  const beam_cnode_t *il = beam_cfg_get(r, "il");
  assert_int_equal(beam_cfg_len(il), 3);
  assert_int_equal(beam_cfg_at(il, 2)->ival, 10);
  assert_null(beam_cfg_at(il, 3));
  assert_true(beam_cfg_at(beam_cfg_get(r, "fl"), 1)->fval == 0.5);
  /* A default list is filled in as a synthetic sequence. */
  const beam_cnode_t *dl = beam_cfg_get(r, "dl");
  assert_int_equal(beam_cfg_len(dl), 2);
  assert_int_equal(beam_cfg_at(dl, 1)->ival, 2);
  assert_int_equal(dl->line, 0);
  beam_cnode_free(r);
  expect_ok("il: []", NULL);
  expect_err("il: [1, x]", "t.yaml:1:9: error: t.il[1]: expected an integer, got \"x\"");
  expect_err("il: [1, 11]", "t.yaml:1:9: error: t.il[1]: 11 is above the maximum 10");
  expect_err("il: 5",
             "t.yaml:1:5: error: t.il: expected a list of integers such as [1, 2], got \"5\"");
  expect_err("fl: [0.5, 2]", "t.yaml:1:11: error: t.fl[1]: 2 is above the maximum 1");
  expect_err("fl: {a: 1}", "t.yaml:1:5: error: t.fl: expected a list of numbers, got a map");
}

static void test_maps(void **state) {
  beam_cnode_t *r;
  expect_ok("m: {name: a, shape: disk}\nml:\n  - {name: a, shape: disk, r: 2}\n  - {name: b, "
            "shape: rect}",
            &r);
  const beam_cnode_t *m = beam_cfg_get(r, "m");
  assert_true(beam_cfg_float(m, "r", -1) == 1.0); /* default inside a nested map */
  const beam_cnode_t *ml = beam_cfg_get(r, "ml");
  assert_int_equal(beam_cfg_len(ml), 2);
  assert_true(beam_cfg_float(beam_cfg_at(ml, 0), "r", -1) == 2.0);
  assert_string_equal(beam_cfg_str(beam_cfg_at(ml, 1), "shape"), "rect");
  /* A map left out whose keys are all optional is filled in whole; one
   * with required keys is not. */
  assert_int_equal(beam_cfg_int(beam_cfg_get(r, "o"), "level", -1), 3);
  beam_cnode_free(r);
  expect_ok("", &r);
  assert_null(beam_cfg_get(r, "m"));
  assert_non_null(beam_cfg_get(r, "o"));
  beam_cnode_free(r);
  expect_err("m: {name: a, shape: tri}",
             "t.yaml:1:21: error: t.m.shape: expected one of disk|rect, got \"tri\"");
  expect_err("m: {shape: disk}", "t.yaml:1:4: error: t.m: missing required key \"name\"");
  expect_err("ml: [{name: a, shape: disk}, {name: b, shape: oval}]",
             "t.yaml:1:47: error: t.ml[1].shape: expected one of disk|rect, got \"oval\"");
  expect_err("ml: [{name: a, shape: disk}, 3]",
             "t.yaml:1:30: error: t.ml[1]: expected a map, got a scalar");
  expect_err("m: [1]", "t.yaml:1:4: error: t.m: expected a map, got a list");
  expect_err("o: {level: 10}", "t.yaml:1:12: error: t.o.level: 10 is above the maximum 9");
  expect_err("ml:\n  - name: a\n    shape: disk\n    rr: 1",
             "t.yaml:4:5: error: t.ml[0]: unknown key \"rr\" (did you mean \"r\"?)");
}

static void test_required_and_top(void **state) {
  beam_cfg_errs_t e = {0};
  beam_cnode_t *r = beam_yaml_parse("x: 1\n", 5, "r.yaml", &e);
  assert_non_null(r);
  assert_int_equal(beam_cfg_validate(r, req_p, "", &e), 2);
  assert_int_equal(e.n, 2);
  assert_string_equal(e.msgs[0],
                      "r.yaml:1:1: error: unknown key \"x\" (expected one of: must)");
  assert_string_equal(e.msgs[1], "r.yaml:1:1: error: missing required key \"must\"");
  beam_cfg_errs_free(&e);
  beam_cnode_free(r);
  r = beam_yaml_parse("- 1\n", 4, "r.yaml", &e);
  assert_int_equal(beam_cfg_validate(r, req_p, "", &e), 1);
  assert_string_equal(e.msgs[0],
                      "r.yaml:1:1: error: the configuration must be a map of sections, got a list");
  beam_cfg_errs_free(&e);
  beam_cnode_free(r);
}

static void test_defaults(void **state) {
  beam_cnode_t *r;
  expect_ok("{}", &r);
  assert_int_equal(beam_cfg_int(r, "i", -1), 5);
  assert_true(beam_cfg_float(r, "f", -1) == 0.5);
  assert_int_equal(beam_cfg_bool(r, "b", 1), 0);
  assert_string_equal(beam_cfg_str(r, "s"), "hello");
  assert_string_equal(beam_cfg_str(r, "e"), "cpu");
  assert_int_equal(beam_cfg_int(r, "sz", -1), 16777216);
  assert_true(beam_cfg_float(r, "d", -1) == 1.0);
  assert_string_equal(beam_cfg_str(r, "ep"), "");
  const beam_cnode_t *d = beam_cfg_get(r, "i");
  assert_int_equal(d->line, 0);
  assert_int_equal(d->col, 0);
  assert_string_equal(d->file, "t.yaml");
  /* No default: absent. */
  assert_null(beam_cfg_get(r, "p"));
  assert_null(beam_cfg_str(r, "p"));
  assert_null(beam_cfg_get(r, "fr"));
  /* Keys come out in schema order whatever the file's order. */
  beam_cnode_free(r);
  expect_ok("s: a\ni: 7", &r);
  assert_string_equal(r->keys[0], "i");
  assert_int_equal(r->key_line[0], 2);
  beam_cnode_free(r);
}

static void test_accessors(void **state) {
  beam_cnode_t *r;
  expect_ok("i: 9\ns: str\nil: [4, 5]\nany: {k: v, n: 12, t: yes, f: 2.5}", &r);
  assert_int_equal(beam_cfg_int(r, "i", -1), 9);
  assert_true(beam_cfg_float(r, "i", -1) == 9.0);
  assert_int_equal(beam_cfg_int(r, "nope", -7), -7);
  assert_true(beam_cfg_float(r, "nope", 2.5) == 2.5);
  assert_int_equal(beam_cfg_bool(r, "nope", 1), 1);
  assert_null(beam_cfg_get(r, "nope"));
  assert_null(beam_cfg_str(r, "il")); /* not a scalar */
  assert_int_equal(beam_cfg_int(r, "il", -3), -3);
  assert_int_equal(beam_cfg_len(beam_cfg_get(r, "il")), 2);
  assert_int_equal(beam_cfg_len(beam_cfg_get(r, "i")), 0);
  assert_null(beam_cfg_at(beam_cfg_get(r, "i"), 0));
  /* ANY subtrees are not converted; the accessors parse on demand. */
  const beam_cnode_t *any = beam_cfg_get(r, "any");
  assert_string_equal(beam_cfg_str(any, "k"), "v");
  assert_int_equal(beam_cfg_int(any, "n", -1), 12);
  assert_int_equal(beam_cfg_int(any, "k", -1), -1);
  assert_int_equal(beam_cfg_bool(any, "t", 0), 1);
  assert_int_equal(beam_cfg_bool(any, "k", 0), 0);
  assert_true(beam_cfg_float(any, "f", 0) == 2.5);
  /* NULL and non-map inputs are safe. */
  assert_null(beam_cfg_get(NULL, "i"));
  assert_null(beam_cfg_get(beam_cfg_get(r, "i"), "x"));
  assert_int_equal(beam_cfg_len(NULL), 0);
  assert_null(beam_cfg_at(NULL, 0));
  /* dup is deep and keeps positions. */
  beam_cnode_t *c = beam_cnode_dup(r);
  assert_non_null(c);
  assert_int_equal(beam_cfg_int(c, "i", -1), 9);
  assert_int_equal(beam_cfg_get(c, "i")->line, beam_cfg_get(r, "i")->line);
  assert_ptr_not_equal(beam_cfg_get(c, "any"), any);
  assert_int_equal(beam_cfg_len(beam_cfg_get(c, "il")), 2);
  beam_cnode_free(c);
  beam_cnode_free(r);
}

static void test_tree_build(void **state) {
  /* Built by hand, as the loader does: many keys force the arrays to grow. */
  beam_cnode_t *m = beam_cnode_new(BEAM_CN_MAP, "h", 1, 1);
  char key[16];
  for (int i = 0; i < 100; i++) {
    beam_cnode_t *v = beam_cnode_new(BEAM_CN_SCALAR, "h", i + 1, 4);
    v->scalar = strdup("1");
    snprintf(key, sizeof key, "k%d", i);
    assert_int_equal(beam_cnode_map_add(m, key, i + 1, 1, v), 0);
  }
  assert_int_equal(m->n, 100);
  assert_string_equal(m->keys[57], "k57");
  assert_int_equal(beam_cfg_int(m, "k99", 0), 1);
  beam_cnode_t *s = beam_cnode_new(BEAM_CN_SEQ, "h", 1, 1);
  for (int i = 0; i < 9; i++)
    assert_int_equal(beam_cnode_seq_add(s, beam_cnode_new(BEAM_CN_SCALAR, "h", 1, 1)), 0);
  assert_int_equal(beam_cfg_len(s), 9);
  assert_int_equal(beam_cnode_map_add(m, "seq", 1, 1, s), 0);
  beam_cnode_free(m);
  beam_cnode_free(NULL);
}

static void test_errors_format(void **state) {
  beam_cfg_errs_t e = {0};
  beam_cnode_t n = {.kind = BEAM_CN_SCALAR, .file = "f.yaml", .line = 3, .col = 7};
  beam_cfg_err(&e, &n, "bad %s", "thing");
  beam_cfg_err_at(&e, "g.yaml", 10, 2, "other %d", 5);
  beam_cfg_err_at(&e, "g.yaml", 0, 0, "no position");
  assert_int_equal(e.n, 3);
  assert_string_equal(e.msgs[0], "f.yaml:3:7: error: bad thing");
  assert_string_equal(e.msgs[1], "g.yaml:10:2: error: other 5");
  assert_string_equal(e.msgs[2], "g.yaml: error: no position");
  beam_cfg_errs_free(&e);
  assert_int_equal(e.n, 0);
  beam_cfg_errs_free(&e);
}

static void test_duplicate_and_unknown(void **state) {
  expect_err("i: 1\ns: a\ni: 2", "t.yaml:3:1: error: t: duplicate key \"i\" (first at 1:1)");
  expect_err("anyy: 1", "t.yaml:1:1: error: t: unknown key \"anyy\" (did you mean \"any\"?)");
  expect_err("frobnicate: 1",
             "t.yaml:1:1: error: t: unknown key \"frobnicate\" (expected one of: i, f, fr, fl0, "
             "b, s, e, sz, usz, d, ud, ep, p, il, fl, dl, m, o, ml, v, any)");
  /* Through the daemon schema, with the section as context. */
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  const char *y = "input:\n  mdoe: live\npool:\n  frames: 4\n  frames: 5\n";
  assert_int_equal(beam_config_load_string(y, strlen(y), "d.yaml", &c, &e), BEAM_ECONFIG);
  assert_null(c);
  assert_int_equal(e.n, 2);
  assert_string_equal(e.msgs[0],
                      "d.yaml:2:3: error: input: unknown key \"mdoe\" (did you mean \"mode\"?)");
  assert_string_equal(e.msgs[1],
                      "d.yaml:5:3: error: pool: duplicate key \"frames\" (first at 4:3)");
  beam_cfg_errs_free(&e);
}

static void test_yaml_rejects(void **state) {
  static const struct { const char *y, *msg; } cases[] = {
      {"a: &x 1\nb: 2\n",
       "y.yaml:1:4: error: anchors (&x) are not supported; write the value out in full"},
      {"a: 1\nb: *x\n",
       "y.yaml:2:4: error: aliases (*x) are not supported; write the value out in full"},
      {"a: !!str 1\n",
       "y.yaml:1:4: error: tags (!!str) are not supported; the schema decides "
       "each value's type"},
      {"a: 1\n---\nb: 2\n",
       "y.yaml:2:1: error: a configuration file holds one YAML document (found a second \"---\")"},
      {"a: [1, 2\n",
       "y.yaml:2:1: error: did not find expected ',' or ']' (while parsing a flow sequence at 1:4)"},
      {"a:\n\tb: 1\n",
       "y.yaml:2:1: error: a tab character; YAML is indented with spaces (while scanning for the "
       "next token)"},
      {"? [1]\n: 2\n", "y.yaml:1:3: error: mapping keys must be plain strings, not maps or lists"},
      {"a: \"x\\0y\"\n", "y.yaml:1:4: error: a NUL character is not allowed in a value"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    beam_cfg_errs_t e = {0};
    beam_cnode_t *r = beam_yaml_parse(cases[i].y, strlen(cases[i].y), "y.yaml", &e);
    assert_null(r);
    if (e.n != 1 || strcmp(e.msgs[0], cases[i].msg))
      print_error("case %zu: got %s\n", i, e.n ? e.msgs[0] : "(none)");
    assert_int_equal(e.n, 1);
    assert_string_equal(e.msgs[0], cases[i].msg);
    beam_cfg_errs_free(&e);
  }
  /* Positions are 1-based, for keys and values, quoted or not. */
  beam_cfg_errs_t e = {0};
  const char *y = "# c\nsec:\n  k: 'v'\n  l: [a, \"b\"]\n";
  beam_cnode_t *r = beam_yaml_parse(y, strlen(y), "p.yaml", &e);
  assert_non_null(r);
  const beam_cnode_t *sec = beam_cfg_get(r, "sec");
  assert_int_equal(r->key_line[0], 2);
  assert_int_equal(r->key_col[0], 1);
  assert_int_equal(sec->key_line[0], 3);
  assert_int_equal(sec->key_col[0], 3);
  const beam_cnode_t *k = beam_cfg_get(sec, "k");
  assert_int_equal(k->line, 3);
  assert_int_equal(k->col, 6);
  assert_int_equal(k->quoted, 1);
  const beam_cnode_t *l = beam_cfg_get(sec, "l");
  assert_int_equal(beam_cfg_at(l, 0)->quoted, 0);
  assert_int_equal(beam_cfg_at(l, 1)->quoted, 1);
  assert_int_equal(beam_cfg_at(l, 1)->col, 10);
  assert_string_equal(beam_cfg_at(l, 1)->file, "p.yaml");
  beam_cnode_free(r);
  /* An empty file (or comments only) is an empty map: all defaults. */
  r = beam_yaml_parse("# nothing\n", 10, "e.yaml", &e);
  assert_non_null(r);
  assert_int_equal(r->kind, BEAM_CN_MAP);
  assert_int_equal(r->n, 0);
  beam_cnode_free(r);
  assert_int_equal(e.n, 0);
}

static void test_deep_nesting(void **state) {
  char y[400];
  size_t o = 0;
  for (int i = 0; i < 100; i++)
    y[o++] = '[';
  for (int i = 0; i < 100; i++)
    y[o++] = ']';
  y[o] = '\0';
  beam_cfg_errs_t e = {0};
  assert_null(beam_yaml_parse(y, o, "deep.yaml", &e));
  assert_int_equal(e.n, 1);
  assert_string_equal(e.msgs[0], "deep.yaml:1:65: error: nesting deeper than 64 levels");
  beam_cfg_errs_free(&e);
}

/* Loads text with the daemon schema; on failure checks the messages. */
static void load_expect(const char *y, const char *const *msgs, size_t n) {
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  int rc = beam_config_load_string(y, strlen(y), "c.yaml", &c, &e);
  for (size_t i = 0; i < e.n; i++)
    if (e.n != n || strcmp(e.msgs[i], msgs[i]))
      print_error("got: %s\n", e.msgs[i]);
  assert_int_equal(e.n, n);
  for (size_t i = 0; i < n; i++)
    assert_string_equal(e.msgs[i], msgs[i]);
  assert_int_equal(rc, n ? BEAM_ECONFIG : 0);
  if (n)
    assert_null(c);
  beam_config_free(&c);
  beam_cfg_errs_free(&e);
}

static void test_all_errors_at_once(void **state) {
  static const char *msgs[] = {
      "c.yaml:2:11: error: pool.frames: 0 is below the minimum 1",
      "c.yaml:4:9: error: output.push: invalid endpoint \"udp://x:1\": unsupported transport "
      "(expected tcp://, ipc:// or inproc://)",
      "c.yaml:8:14: error: stage \"c\".backend: expected one of cpu|cuda|auto, got \"gpu\"",
  };
  load_expect("pool:\n  frames: 0\noutput:\n  push: udp://x:1\nstages:\n  - name: c\n"
              "    kind: correct\n    backend: gpu\n",
              msgs, 3);
}

static void test_stage_checks(void **state) {
  {
    static const char *m[] = {"c.yaml:2:21: error: stage \"a\".kind: unknown stage kind "
                              "\"corect\" (known kinds: correct, roi_sum, bin, preview, xpcs_multitau, xpcs_twotime, pca, ptycho_dm, fit, com, azint)"};
    load_expect("stages:\n  - {name: a, kind: corect}\n", m, 1);
  }
  {
    static const char *m[] = {"c.yaml:3:33: error: stage \"b\".input: no stage named \"aa\" "
                              "(expected \"frames\" or one of a, or <stage>.<output>)"};
    load_expect("stages:\n  - {name: a, kind: bin}\n  - {name: b, kind: bin, input: aa}\n", m, 1);
  }
  {
    static const char *m[] = {
        "c.yaml:2:33: error: stage \"a\".input: a stage cannot take its own output as input"};
    load_expect("stages:\n  - {name: a, kind: bin, input: a}\n", m, 1);
  }
  {
    static const char *m[] = {
        "c.yaml:2:33: error: stage \"a\".input: cycle in the stage graph: a -> b -> a"};
    load_expect("stages:\n  - {name: a, kind: bin, input: b}\n  - {name: b, kind: bin, input: "
                "a}\n",
                m, 1);
  }
  {
    /* a reads c, b reads a, c reads b: data flows a -> b -> c -> a. The
     * stage d hangs off the cycle and gets no message of its own. */
    static const char *m[] = {
        "c.yaml:2:33: error: stage \"a\".input: cycle in the stage graph: a -> b -> c -> a"};
    load_expect("stages:\n  - {name: a, kind: bin, input: c}\n  - {name: b, kind: bin, input: "
                "a}\n  - {name: c, kind: bin, input: b.binned}\n  - {name: d, kind: bin, input: "
                "a}\n",
                m, 1);
  }
  {
    static const char *m[] = {
        "c.yaml:3:12: error: stage \"a\".name: duplicate stage name (first at 2:12)"};
    load_expect("stages:\n  - {name: a, kind: bin}\n  - {name: a, kind: preview}\n", m, 1);
  }
  {
    static const char *m[] = {"c.yaml:2:5: error: stages[0]: missing required key \"name\"",
                              "c.yaml:3:5: error: stages[1]: expected a map with name and kind, "
                              "got a scalar"};
    load_expect("stages:\n  - {kind: bin}\n  - bin\n", m, 2);
  }
  {
    static const char *m[] = {
        "c.yaml:2:12: error: stages[0].name: invalid value \"Big Name\": stage names are 1-64 "
        "characters of a-z, 0-9, _ and - (no dots)",
        "c.yaml:3:12: error: stages[1].name: invalid value \"frames\": \"frames\" and \"beamd\" "
        "are reserved names"};
    load_expect("stages:\n  - {name: Big Name, kind: bin}\n  - {name: frames, kind: bin}\n", m, 2);
  }
  {
    static const char *m[] = {"c.yaml:1:9: error: stages: expected a list of stages, got a map"};
    load_expect("stages: {name: a}\n", m, 1);
  }
  {
    static const char *m[] = {
        "c.yaml:4:53: error: stage \"vd\".rois[1].shape: expected one of disk|annulus|rect, got "
        "\"ring\""};
    load_expect("stages:\n  - name: vd\n    kind: roi_sum\n    rois: [{name: a, shape: disk}, "
                "{name: b, shape: ring}]\n",
                m, 1);
  }
  /* Valid graphs: stage.output references, fan-out, any order in the file. */
  load_expect("stages:\n  - {name: p, kind: preview, input: b.binned}\n  - {name: b, kind: bin, "
              "input: c}\n  - {name: c, kind: correct}\n",
              NULL, 0);
}

static void test_daemon_sections(void **state) {
  {
    static const char *m[] = {
        "c.yaml:1:19: error: metrics.listen: invalid value \"9464\": expected host:port (for "
        "example 127.0.0.1:9464), or \"\" to turn metrics off",
        "c.yaml:2:19: error: input.endpoint: invalid value \"\": the input needs an endpoint",
        "c.yaml:3:14: error: log.level: expected one of "
        "emerg|alert|crit|err|warning|notice|info|debug, got \"verbose\"",
        "c.yaml:4:12: error: heartbeat: 10ms is below the minimum 0.05s",
        "c.yaml:5:32: error: pool.frame_bytes: 8Gi is above the maximum 4Gi",
        "c.yaml:5:45: error: pool.pinned: expected one of auto|yes|no, got \"maybe\""};
    load_expect("metrics: {listen: 9464}\ninput: {endpoint: \"\"}\nlog: {level: verbose}\n"
                "heartbeat: 10ms\npool: {frames: 2, frame_bytes: 8Gi, pinned: maybe}\n",
                m, 6);
  }
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  const char *y = "input: {mode: replay, endpoint: 'ipc:///tmp/r', bind: yes, hwm: 0, "
                  "replay: {credit: 8}}\n"
                  "output: {publish: '', push: {address: 'tcp://*:7000', insecure: true}, hwm: 5, push_hwm: 6, "
                  "publish_frames_meta: off}\n"
                  "pool: {frames: 4, frame_bytes: 1Mi, pinned: no}\ncontrol: {endpoint: ''}\n"
                  "metrics: {listen: ''}\nlog: {level: debug, rate_limit: 0.5}\nheartbeat: 250ms\n"
                  "stages: [{name: b, kind: bin, backend: cpu, publish: no, queue: 3}]\n";
  assert_int_equal(beam_config_load_string(y, strlen(y), "s.yaml", &c, &e), 0);
  assert_int_equal(e.n, 0);
  assert_int_equal(c->input.mode, BEAM_IN_REPLAY);
  assert_string_equal(c->input.endpoint, "ipc:///tmp/r");
  assert_int_equal(c->input.bind, 1);
  assert_int_equal(c->input.hwm, 0);
  assert_int_equal(beam_cfg_int(beam_cfg_get(c->input.node, "replay"), "credit", 0), 8);
  assert_string_equal(c->output.publish, "");
  assert_string_equal(c->output.push, "tcp://*:7000");
  assert_int_equal(c->output.push_sec.insecure, 1);
  assert_int_equal(c->output.push_sec.curve, 0);
  assert_int_equal(c->output.hwm, 5);
  assert_int_equal(c->output.push_hwm, 6);
  assert_int_equal(c->output.publish_frames_meta, 0);
  assert_int_equal(c->pool.frames, 4);
  assert_int_equal(c->pool.frame_bytes, 1048576);
  assert_int_equal(c->pool.pinned, 0);
  assert_string_equal(c->control.endpoint, "");
  assert_string_equal(c->metrics.listen, "");
  assert_int_equal(c->log.level, 7);
  assert_true(c->log.rate_limit == 0.5);
  assert_true(c->heartbeat_s == 0.25);
  assert_int_equal(c->nstages, 1);
  assert_string_equal(c->stages[0].name, "b");
  assert_string_equal(c->stages[0].kind, "bin");
  assert_string_equal(c->stages[0].input, "frames");
  assert_string_equal(c->stages[0].backend, "cpu");
  assert_int_equal(c->stages[0].publish, 0);
  assert_int_equal(c->stages[0].queue, 3);
  assert_int_equal(beam_cfg_int(c->stages[0].node, "factor", -1), 2);
  assert_string_equal(c->path, "s.yaml");
  beam_config_free(&c);
  assert_null(c);
  beam_config_free(&c);
  /* pinned: auto follows the stages' backends. */
  y = "stages: [{name: b, kind: bin, backend: cpu}]\n";
  assert_int_equal(beam_config_load_string(y, strlen(y), "s.yaml", &c, &e), 0);
  assert_int_equal(c->pool.pinned, 0);
  beam_config_free(&c);
  y = "stages: [{name: b, kind: bin, backend: cpu}, {name: p, kind: preview, backend: cuda}]\n";
  assert_int_equal(beam_config_load_string(y, strlen(y), "s.yaml", &c, &e), 0);
  assert_int_equal(c->pool.pinned, 1);
  assert_int_equal(c->pool.pin_auto, 1); /* the graph pins only if a stage resolves to cuda */
  beam_config_free(&c);
  y = "pool: {pinned: yes}\n";
  assert_int_equal(beam_config_load_string(y, strlen(y), "s.yaml", &c, &e), 0);
  assert_int_equal(c->pool.pinned, 1);
  assert_int_equal(c->pool.pin_auto, 0);
  beam_config_free(&c);
  /* An empty configuration is all defaults and no stages. */
  assert_int_equal(beam_config_load_string("", 0, NULL, &c, &e), 0);
  assert_int_equal(c->nstages, 0);
  assert_string_equal(c->input.endpoint, "tcp://127.0.0.1:5500");
  assert_string_equal(c->path, "<string>");
  beam_config_free(&c);
  assert_int_equal(e.n, 0);
}

static void test_builtin_default(void **state) {
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  const char *y = beam_config_default_yaml();
  assert_int_equal(beam_config_load_string(y, strlen(y), "<built-in>", &c, &e), 0);
  assert_int_equal(e.n, 0);
  assert_int_equal(c->input.mode, BEAM_IN_LIVE);
  assert_string_equal(c->input.endpoint, "tcp://127.0.0.1:5500");
  assert_string_equal(c->output.publish, "tcp://127.0.0.1:5600");
  assert_string_equal(c->output.push, "");
  assert_string_equal(c->control.endpoint, "tcp://127.0.0.1:5601");
  assert_string_equal(c->metrics.listen, "127.0.0.1:9464");
  assert_int_equal(c->pool.frames, 128);
  assert_int_equal(c->pool.frame_bytes, 16u << 20);
  assert_int_equal(c->pool.pinned, 1);
  assert_int_equal(c->log.level, 6);
  assert_true(c->log.rate_limit == 10.0);
  assert_true(c->heartbeat_s == 1.0);
  assert_int_equal(c->nstages, 3);
  assert_string_equal(c->stages[0].name, "corr");
  assert_string_equal(c->stages[0].kind, "correct");
  assert_string_equal(c->stages[0].input, "frames");
  assert_string_equal(c->stages[1].name, "vd");
  assert_string_equal(c->stages[1].kind, "roi_sum");
  assert_string_equal(c->stages[1].input, "corr");
  const beam_cnode_t *rois = beam_cfg_get(c->stages[1].node, "rois");
  assert_int_equal(beam_cfg_len(rois), 2);
  assert_string_equal(beam_cfg_str(beam_cfg_at(rois, 0), "shape"), "disk");
  assert_true(beam_cfg_float(beam_cfg_at(rois, 0), "radius", 0) == 16.0);
  assert_null(beam_cfg_get(beam_cfg_at(rois, 0), "center"));
  const beam_cnode_t *radii = beam_cfg_get(beam_cfg_at(rois, 1), "radii");
  assert_true(beam_cfg_at(radii, 0)->fval == 32.0 && beam_cfg_at(radii, 1)->fval == 128.0);
  assert_string_equal(c->stages[2].kind, "preview");
  assert_string_equal(c->stages[2].input, "corr");
  assert_true(beam_cfg_float(c->stages[2].node, "rate", 0) == 2.0);
  beam_config_free(&c);
}

static void roundtrip(const char *y, const char *name) {
  beam_cfg_errs_t e = {0};
  beam_config_t *c1 = NULL, *c2 = NULL;
  assert_int_equal(beam_config_load_string(y, strlen(y), name, &c1, &e), 0);
  char *d1 = beam_cfg_dump(c1->root);
  assert_non_null(d1);
  int rc = beam_config_load_string(d1, strlen(d1), "dump1", &c2, &e);
  for (size_t i = 0; i < e.n; i++)
    print_error("%s\n--- dump:\n%s", e.msgs[i], d1);
  assert_int_equal(rc, 0);
  char *d2 = beam_cfg_dump(c2->root);
  assert_non_null(d2);
  if (strcmp(d1, d2))
    print_error("dump 1:\n%s\ndump 2:\n%s", d1, d2);
  assert_string_equal(d1, d2);
  free(d1);
  free(d2);
  beam_config_free(&c1);
  beam_config_free(&c2);
}

static void test_dump(void **state) {
  roundtrip(beam_config_default_yaml(), "<built-in>");
  /* Awkward strings, empty lists and maps, booleans spelled oddly. */
  roundtrip("input: {bind: on}\noutput: {push: \"\"}\nmetrics: {listen: ''}\n"
            "stages:\n  - name: x\n    kind: correct\n    flat_dataset: \"/data/a: b #c\"\n"
            "    dark_dataset: '\"q\"\\ and\ttab'\n    threshold: -inf\n"
            "  - name: r\n    kind: roi_sum\n    input: x\n    rois: []\n"
            "    scan_shape: [3, 4]\n  - name: b\n    kind: bin\n    input: x\n    crop: [0, 0, "
            "8, 8]\n    mode: mean\n",
            "odd.yaml");
  roundtrip("stages: []\n", "empty.yaml");
  /* The dump is normalised: defaults present, schema order, canonical
   * booleans. */
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  const char *y = "heartbeat: 2s\ninput: {bind: on, mode: pull}\n";
  assert_int_equal(beam_config_load_string(y, strlen(y), "n.yaml", &c, &e), 0);
  char *d = beam_cfg_dump(c->root);
  assert_non_null(d);
  assert_non_null(strstr(d, "input:\n  mode: pull\n  endpoint: tcp://127.0.0.1:5500\n  bind: "
                            "true\n  hwm: 1000\n  result_topic: \"\"\n  replay:\n    credit: 64\n    state_file: \"\"\n"
                            "    commit_delay: 2s\n    timeout: 10s\n    exit_on_eof: false\n"
                            "    shm: auto\n    map: true\n    depth: 2\n  dectris:\n"
                            "    format: auto\n    channel: \"\"\n    verify_hash: false\n"
                            "    endpoints: []\n    merge_wait: 200ms\n  karabo:\n"
                            "    pattern: req\n    source: \"\"\n    path: image.data\n"
                            "    pulse_axis: last\n    flatten: true\n    timeout: 1s\n"
                            "    series_idle: 10s\n    modules: 0\n    first_module: 0\n"
                            "    incomplete: fill\n    fill_value: nan\n"
                            "output:\n"));
  assert_non_null(strstr(d, "push: \"\"\n"));
  assert_non_null(strstr(d, "heartbeat: 2s\nstages: []\n"));
  assert_true(strstr(d, "input:") < strstr(d, "heartbeat:"));
  free(d);
  beam_config_free(&c);
}

/* Input files (BEAM_P_INFILE) are checked when the config is loaded: a
 * missing, unreadable or directory path is an error at the value, words
 * listed in choices are no files, and the check can be turned off. */
static const beam_param_t inf_p[] = {
    {"in", BEAM_P_INFILE, NULL, 0, 0, 0, NULL, NULL, "input file", NULL},
    {"ins", BEAM_P_INFILE, NULL, 0, 0, 0, "series", NULL, "input file or series", NULL},
    {"out", BEAM_P_PATH, NULL, 0, 0, 0, NULL, NULL, "output path: never checked", NULL},
    BEAM_PARAM_END};

static int inf_validate(const char *yaml, unsigned flags, beam_cfg_errs_t *e) {
  beam_cnode_t *root = beam_yaml_parse(yaml, strlen(yaml), "f.yaml", e);
  assert_non_null(root);
  int n = beam_cfg_validate_flags(root, inf_p, "t", e, flags);
  beam_cnode_free(root);
  return n;
}

static void inf_expect(const char *yaml, const char *msg) {
  beam_cfg_errs_t e = {0};
  int n = inf_validate(yaml, 0, &e);
  for (size_t i = 0; i < e.n; i++)
    if (!msg || strcmp(e.msgs[i], msg))
      print_error("got: %s\n", e.msgs[i]);
  assert_int_equal(n, msg ? 1 : 0);
  assert_int_equal(e.n, msg ? 1 : 0);
  if (msg)
    assert_string_equal(e.msgs[0], msg);
  beam_cfg_errs_free(&e);
}

static void test_input_files(void **state) {
  char dir[] = "/tmp/beamd-test-infile-XXXXXX", file[64], yaml[256], msg[256];
  assert_non_null(mkdtemp(dir));
  snprintf(file, sizeof file, "%s/mask.npy", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fputs("x", f);
  fclose(f);

  snprintf(yaml, sizeof yaml, "in: %s\nins: %s\nout: /nonexistent/out\n", file, file);
  inf_expect(yaml, NULL);
  inf_expect("ins: series\n", NULL);
  inf_expect("in: /nonexistent/beamd/mask.h5\n",
             "f.yaml:1:5: error: t.in: /nonexistent/beamd/mask.h5: No such file or directory");
  /* "series" is a word only where the schema says so. */
  inf_expect("in: series\n", "f.yaml:1:5: error: t.in: series: No such file or directory");
  snprintf(yaml, sizeof yaml, "ins: %s\n", dir);
  snprintf(msg, sizeof msg, "f.yaml:1:6: error: t.ins: %s: is a directory, expected a file", dir);
  inf_expect(yaml, msg);
  inf_expect("in: \"\"\n", "f.yaml:1:5: error: t.in: a path cannot be empty");
  if (geteuid() != 0) { /* root reads anything */
    assert_int_equal(chmod(file, 0), 0);
    snprintf(yaml, sizeof yaml, "in: %s\n", file);
    snprintf(msg, sizeof msg, "f.yaml:1:5: error: t.in: %s: Permission denied", file);
    inf_expect(yaml, msg);
  }
  beam_cfg_errs_t e = {0};
  assert_int_equal(inf_validate("in: /nonexistent/x.h5\n", BEAM_CFG_NO_FILE_CHECK, &e), 0);
  beam_cfg_errs_free(&e);

  /* Through a stage's schema, as beamd loads a file: every missing input
   * is reported at its value, the "series" mask passes. */
  static const char *m[] = {
      "c.yaml:4:11: error: stage \"c\".dark: /nonexistent/dark.npy: No such file or directory",
      "c.yaml:8:19: error: stage \"v\".masks.file: /nonexistent/masks.h5: No such file or "
      "directory",
  };
  load_expect("stages:\n  - name: c\n    kind: correct\n    dark: /nonexistent/dark.npy\n"
              "    mask: series\n  - name: v\n    kind: roi_sum\n    masks: {file: "
              "/nonexistent/masks.h5}\n    input: c\n",
              m, 2);
  unlink(file);
  rmdir(dir);
}

static void test_missing_file(void **state) {
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  assert_int_equal(beam_config_load_file("/nonexistent/beamd.yaml", &c, &e), BEAM_ECONFIG);
  assert_null(c);
  assert_int_equal(e.n, 1);
  assert_string_equal(e.msgs[0],
                      "/nonexistent/beamd.yaml: error: cannot open: No such file or directory");
  beam_cfg_errs_free(&e);
  assert_int_equal(beam_config_load_file("/", &c, &e), BEAM_ECONFIG);
  assert_int_equal(e.n, 1);
  assert_string_equal(e.msgs[0], "/: error: cannot read: Is a directory");
  beam_cfg_errs_free(&e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_int),
      cmocka_unit_test(test_float),
      cmocka_unit_test(test_bool),
      cmocka_unit_test(test_string_enum_path),
      cmocka_unit_test(test_size),
      cmocka_unit_test(test_duration),
      cmocka_unit_test(test_endpoint),
      cmocka_unit_test(test_lists),
      cmocka_unit_test(test_maps),
      cmocka_unit_test(test_required_and_top),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_accessors),
      cmocka_unit_test(test_tree_build),
      cmocka_unit_test(test_errors_format),
      cmocka_unit_test(test_duplicate_and_unknown),
      cmocka_unit_test(test_yaml_rejects),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_all_errors_at_once),
      cmocka_unit_test(test_stage_checks),
      cmocka_unit_test(test_daemon_sections),
      cmocka_unit_test(test_builtin_default),
      cmocka_unit_test(test_dump),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_input_files),
  };
  return beam_run_tests(tests, NULL, NULL);
}
