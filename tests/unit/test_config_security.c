/* Unit tests of the security half of the configuration
 * (daemon/config_security.c): the long form of endpoints, the refusal of
 * plaintext binds other hosts can reach, CURVE settings that cannot work,
 * key files checked at load with their position, and the metrics token. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/config.h"
#include "daemon/curve.h"
#include "proto/err.h"

static char dir[256];
static char secret[300], pub[300], allow[300], token[300];

static int setup(void **state) {
  (void)state;
  beam_diag_t ed = {0};
  snprintf(dir, sizeof dir, "/tmp/beamd-test-cfgsec-XXXXXX");
  if (!mkdtemp(dir))
    return -1;
  beam_cert_t c;
  if (beam_cert_generate(dir, "beamd", 0, 0, &c, &ed) != 0)
    return -1;
  snprintf(secret, sizeof secret, "%s/beamd_secret", dir);
  snprintf(pub, sizeof pub, "%s/beamd", dir);
  snprintf(allow, sizeof allow, "%s/clients", dir);
  snprintf(token, sizeof token, "%s/token", dir);
  FILE *f = fopen(token, "w");
  if (!f)
    return -1;
  fputs("0123456789abcdef0123\n", f);
  fclose(f);
  return mkdir(allow, 0700);
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Loads y; each of the n expected fragments must appear in its own
 * message, in order. */
static void expect(const char *y, const char *const *frags, size_t n) {
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  int rc = beam_config_load_string(y, strlen(y), "s.yaml", &c, &e);
  for (size_t i = 0; i < e.n; i++)
    if (e.n != n || !strstr(e.msgs[i], frags[i]))
      print_error("got: %s\n", e.msgs[i]);
  assert_int_equal(e.n, n);
  for (size_t i = 0; i < n; i++)
    assert_non_null(strstr(e.msgs[i], frags[i]));
  assert_int_equal(rc, n ? BEAM_ECONFIG : 0);
  beam_config_free(&c);
  beam_cfg_errs_free(&e);
}

static void test_reachable_plaintext_refused(void **state) {
  (void)state;
  /* In the order the checks run: input, output, control, metrics. */
  static const char *const frags[] = {
      "s.yaml:3:19: error: input.endpoint: tcp://eth0:5500 can be reached",
      "s.yaml:1:19: error: output.publish: tcp://*:5600 can be reached from other hosts "
      "without authentication; write {address: tcp://*:5600, curve: true}",
      "s.yaml:2:21: error: control.endpoint: tcp://0.0.0.0:5601 can be reached",
      "s.yaml:4:19: error: metrics.listen: 0.0.0.0:9464 can be reached from other hosts; set "
      "metrics.token_file",
  };
  expect("output: {publish: 'tcp://*:5600'}\n"
         "control: {endpoint: 'tcp://0.0.0.0:5601'}\n"
         "input: {endpoint: 'tcp://eth0:5500', bind: true}\n"
         "metrics: {listen: '0.0.0.0:9464'}\n",
         frags, 4);
  /* Connected, loopback, ipc or said insecure: accepted. */
  expect("input: {endpoint: 'tcp://10.0.0.7:9999'}\n"
         "output: {publish: 'tcp://localhost:5600', push: 'ipc:///tmp/beamd-push'}\n"
         "control: {endpoint: {address: 'tcp://*:5601', insecure: true}}\n"
         "metrics: {listen: '0.0.0.0:9464', insecure: true}\n",
         NULL, 0);
}

static void test_curve_needs_keys(void **state) {
  (void)state;
  static const char *const frags[] = {
      "input.endpoint: beamd connects here with curve, so it needs the server's public "
      "certificate",
      "output.publish: curve and insecure together: pick one",
      "output.push: curve is for tcp:// endpoints",
      "control.endpoint: server_key is for endpoints beamd connects to",
      "curve.secret_key: an endpoint has curve: true",
      "curve.allow: a bound endpoint has curve: true",
  };
  expect("output:\n"
         "  publish: {address: 'tcp://*:5600', curve: true, insecure: true}\n"
         "  push: {address: 'ipc:///tmp/x', curve: true}\n"
         "control: {endpoint: {address: 'tcp://*:5601', curve: true, server_key: /x}}\n"
         "input: {endpoint: {address: 'tcp://10.1.1.1:5500', curve: true}}\n",
         frags, 6);
}

static void test_key_files_checked(void **state) {
  (void)state;
  char y[2048];
  /* Missing files, a public file given as the secret, a readable secret. */
  snprintf(y, sizeof y,
           "control: {endpoint: {address: 'tcp://*:5601', curve: true}}\n"
           "input: {endpoint: {address: 'tcp://10.1.1.1:5500', curve: true, server_key: "
           "%s/none}}\n"
           "curve: {secret_key: %s, allow: %s/nodir}\n",
           dir, pub, dir);
  static const char *const frags[] = {
      "s.yaml:2:29: error: input.endpoint: ",
      "s.yaml:3:21: error: curve.secret_key: ",
      "s.yaml:3:",
  };
  expect(y, frags, 3);
  chmod(secret, 0644);
  snprintf(y, sizeof y,
           "control: {endpoint: {address: 'tcp://*:5601', curve: true}}\n"
           "curve: {secret_key: %s, allow: %s}\n",
           secret, allow);
  static const char *const world[] = {"can be read by every user (mode 644); chmod 600 it"};
  expect(y, world, 1);
  chmod(secret, 0600);
  expect(y, NULL, 0);
}

static void test_good_curve_config(void **state) {
  (void)state;
  char y[2048];
  snprintf(y, sizeof y,
           "input: {mode: pull, endpoint: {address: 'tcp://10.1.1.1:5500', curve: true, "
           "server_key: %s}}\n"
           "output:\n"
           "  publish: {address: 'tcp://*:5600', curve: true}\n"
           "  push: {address: 'tcp://*:5602', insecure: true}\n"
           "control: {endpoint: {address: 'tcp://*:5601', curve: true}}\n"
           "metrics: {listen: '0.0.0.0:9464', token_file: %s}\n"
           "curve: {secret_key: %s, allow: %s}\n",
           pub, token, secret, allow);
  beam_cfg_errs_t e = {0};
  beam_config_t *c = NULL;
  int rc = beam_config_load_string(y, strlen(y), "s.yaml", &c, &e);
  for (size_t i = 0; i < e.n; i++)
    print_error("%s\n", e.msgs[i]);
  assert_int_equal(rc, 0);
  assert_string_equal(c->input.endpoint, "tcp://10.1.1.1:5500");
  assert_int_equal(c->input.endpoint_sec.curve, 1);
  assert_string_equal(c->input.endpoint_sec.server_key, pub);
  assert_string_equal(c->output.publish, "tcp://*:5600");
  assert_int_equal(c->output.publish_sec.curve, 1);
  assert_int_equal(c->output.push_sec.insecure, 1);
  assert_int_equal(c->control.endpoint_sec.curve, 1);
  assert_string_equal(c->metrics.token_file, token);
  assert_string_equal(c->curve.secret_key, secret);
  assert_string_equal(c->curve.allow, allow);
  assert_int_equal(c->curve.any, 1);
  assert_int_equal(c->curve.any_server, 1);
  beam_config_free(&c);
}

static void test_long_form_schema(void **state) {
  (void)state;
  static const char *const frags[] = {
      "s.yaml:1:33: error: output.publish: unknown key \"curv\" (did you mean \"curve\"?)",
      "s.yaml:1:60: error: output.push.curve: expected a boolean",
      "s.yaml:1:52: error: output.push: missing required key \"address\"",
  };
  expect("output: {publish: {address: '', curv: true}, push: {curve: maybe}}\n", frags, 3);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reachable_plaintext_refused),
      cmocka_unit_test(test_curve_needs_keys),
      cmocka_unit_test(test_key_files_checked),
      cmocka_unit_test(test_good_curve_config),
      cmocka_unit_test(test_long_form_schema),
  };
  return beam_run_tests(tests, setup, teardown);
}
