/* Unit tests of CURVE in beamd (daemon/curve.c, daemon/zap.c): key files in
 * CZMQ's and pyzmq's layouts (with '#' inside keys), the loopback rule, and
 * real handshakes over tcp on loopback: a listed key gets through; an
 * unlisted key, a plaintext client and a wrong server key get nothing and
 * are counted; without a ZAP handler the server fails closed; a reloaded
 * allow-list lets a new key in. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "daemon/curve.h"

static char tmpdir[256];

static int setup(void **state) {
  (void)state;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/beamd-test-curve-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* A key pair whose public and secret keys both contain '#': the case a
 * parser that strips "comments" anywhere on a line gets wrong. */
static void keypair_with_hash(char pub[41], char sec[41]) {
  for (int i = 0; i < 100000; i++) {
    assert_int_equal(zmq_curve_keypair(pub, sec), 0);
    if (strchr(pub, '#') && strchr(sec, '#'))
      return;
  }
  fail_msg("no key pair with '#' found");
}

static void test_cert_zcert_with_hash(void **state) {
  (void)state;
  char pub[41], sec[41], text[1024], path[300];
  beam_diag_t ed = {0};
  keypair_with_hash(pub, sec);
  snprintf(text, sizeof text,
           "#   ****  Generated on 2026-12-02 by CZMQ  ****\n"
           "#   ZeroMQ CURVE **Secret** Certificate\n"
           "\n"
           "metadata\n"
           "    name = \"detector # 1\"\n"
           "    # an indented comment\n"
           "curve\n"
           "    public-key = \"%s\"\n"
           "    secret-key = \"%s\"\n",
           pub, sec);
  snprintf(path, sizeof path, "%s/det_secret", tmpdir);
  write_file(path, text);
  beam_cert_t c;
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_load(path, &c, 1, &ed), 0);
  assert_string_equal(c.public_z85, pub);
  assert_string_equal(c.secret_z85, sec);
  assert_string_equal(c.name, "det");
}

static void test_cert_pyzmq_layout(void **state) {
  (void)state;
  char pub[41], sec[41], text[1024], path[300];
  beam_diag_t ed = {0};
  keypair_with_hash(pub, sec);
  /* pyzmq: .key names, unquoted metadata; a value may come unquoted too. */
  snprintf(text, sizeof text, "metadata\n    user = alice\ncurve\n    public-key = %s\n", pub);
  snprintf(path, sizeof path, "%s/alice.key", tmpdir);
  write_file(path, text);
  beam_cert_t c;
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_load(path, &c, 0, &ed), 0);
  assert_string_equal(c.public_z85, pub);
  assert_string_equal(c.secret_z85, "");
  assert_string_equal(c.name, "alice");
  /* A public file where the secret is needed says what to give instead. */
  beam_diag_clear(&ed);
  assert_true(beam_cert_load(path, &c, 1, &ed) < 0);
  assert_non_null(strstr(ed.msg, "_secret"));
}

static void test_cert_errors(void **state) {
  (void)state;
  char pub[41], sec[41], pub2[41], sec2[41], text[1024], path[300];
  beam_diag_t ed = {0};
  beam_cert_t c;
  snprintf(path, sizeof path, "%s/missing", tmpdir);
  beam_diag_clear(&ed);
  assert_true(beam_cert_load(path, &c, 0, &ed) < 0);
  assert_non_null(strstr(ed.msg, "No such file"));

  snprintf(path, sizeof path, "%s/short", tmpdir);
  write_file(path, "curve\n    public-key = \"abc\"\n");
  beam_diag_clear(&ed);
  assert_true(beam_cert_load(path, &c, 0, &ed) < 0);
  assert_non_null(strstr(ed.msg, ":2: public-key is not a 40-character Z85 key"));

  snprintf(path, sizeof path, "%s/nokey", tmpdir);
  write_file(path, "metadata\n    name = \"x\"\n");
  beam_diag_clear(&ed);
  assert_true(beam_cert_load(path, &c, 0, &ed) < 0);
  assert_non_null(strstr(ed.msg, "no curve public-key"));

  /* A public key from another pair: a copy-paste slip that would make
   * every handshake fail with no hint why. */
  zmq_curve_keypair(pub, sec);
  zmq_curve_keypair(pub2, sec2);
  snprintf(text, sizeof text, "curve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n", pub2,
           sec);
  snprintf(path, sizeof path, "%s/mixed_secret", tmpdir);
  write_file(path, text);
  beam_diag_clear(&ed);
  assert_true(beam_cert_load(path, &c, 1, &ed) < 0);
  assert_non_null(strstr(ed.msg, "does not belong"));
}

static void test_generate(void **state) {
  (void)state;
  char path[300];
  beam_diag_t ed = {0};
  beam_cert_t out, c;
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_generate(tmpdir, "gen", 0, 0, &out, &ed), 0);
  struct stat st;
  snprintf(path, sizeof path, "%s/gen_secret", tmpdir);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_load(path, &c, 1, &ed), 0);
  assert_string_equal(c.public_z85, out.public_z85);
  snprintf(path, sizeof path, "%s/gen", tmpdir);
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_load(path, &c, 0, &ed), 0);
  assert_string_equal(c.secret_z85, "");
  /* Never overwrites a key by accident. */
  beam_diag_clear(&ed);
  assert_true(beam_cert_generate(tmpdir, "gen", 0, 0, &out, &ed) < 0);
  assert_non_null(strstr(ed.msg, "will not overwrite"));
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_generate(tmpdir, "gen", 0, 1, &out, &ed), 0);
  beam_diag_clear(&ed);
  assert_true(beam_cert_generate(tmpdir, "a/b", 0, 0, &out, &ed) < 0);
}

static void test_loopback(void **state) {
  (void)state;
  const char *yes[] = {"tcp://127.0.0.1:5600", "tcp://127.1.2.3:1", "tcp://localhost:5600",
                       "tcp://[::1]:5600", "ipc:///tmp/x", "inproc://x",
                       "tcp://10.0.0.1:7;127.0.0.1:5600"};
  const char *no[] = {"tcp://*:5600",        "tcp://0.0.0.0:5600",   "tcp://eth0:5600",
                      "tcp://10.1.2.3:5600", "tcp://[::]:5600",      "tcp://127.example:1",
                      "tcp://127.0.0.1.nip.io:1", "tcp://localhost.evil:1", "udp://127.0.0.1:1"};
  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
    assert_true(beam_endpoint_is_loopback(yes[i]));
  for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
    if (beam_endpoint_is_loopback(no[i]))
      fail_msg("%s taken for loopback", no[i]);
  }
}

/* ---- handshakes ------------------------------------------------------------ */

static int free_port(void) {
  /* Ask ZeroMQ for an ephemeral port and give it back. */
  void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_REP);
  char ep[64];
  size_t len = sizeof ep;
  assert_int_equal(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
  zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len);
  zmq_close(s);
  zmq_ctx_term(ctx);
  return atoi(strrchr(ep, ':') + 1);
}

/* One REQ round trip to the server within ms; returns 1 on a reply. */
static int round_trip(void *ctx, const char *ep, const beam_cert_t *own,
                      const char *server_pub, int ms) {
  void *c = zmq_socket(ctx, ZMQ_REQ);
  int zero = 0;
  zmq_setsockopt(c, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(c, ZMQ_RCVTIMEO, &ms, sizeof ms);
  beam_diag_t ed = {0};
  if (own)
    assert_int_equal(beam_curve_client(c, own, server_pub, &ed), 0);
  assert_int_equal(zmq_connect(c, ep), 0);
  zmq_send(c, "ping", 4, ZMQ_DONTWAIT);
  char buf[64];
  int n = zmq_recv(c, buf, sizeof buf, 0);
  zmq_close(c);
  return n > 0;
}

typedef struct server_s {
  void *ctx, *sock;
  pthread_t th;
  atomic_int stop;
  /* The reply orders the write before the test's read, but through
   * libzmq, which ThreadSanitizer cannot see: a lock says it in C. */
  pthread_mutex_t mu;
  char who[BEAM_KEY_NAME];
} server_t;

static const char *server_who(server_t *s) {
  static char copy[BEAM_KEY_NAME];
  pthread_mutex_lock(&s->mu);
  snprintf(copy, sizeof copy, "%s", s->who);
  pthread_mutex_unlock(&s->mu);
  return copy;
}

/* Echoes the peer's key name back. */
static void *serve(void *arg) {
  server_t *s = arg;
  int ms = 50;
  zmq_setsockopt(s->sock, ZMQ_RCVTIMEO, &ms, sizeof ms);
  while (!atomic_load(&s->stop)) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->sock, 0) < 0) {
      zmq_msg_close(&m);
      continue;
    }
    const char *who = beam_curve_peer(&m);
    pthread_mutex_lock(&s->mu);
    snprintf(s->who, sizeof s->who, "%s", who);
    pthread_mutex_unlock(&s->mu);
    zmq_send(s->sock, who[0] ? who : "-", who[0] ? strlen(who) : 1, 0);
    zmq_msg_close(&m);
  }
  return NULL;
}

static void server_start(server_t *s, void *ctx, const beam_cert_t *key, const char *ep,
                         beam_zap_t *zap) {
  beam_diag_t ed = {0};
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->mu, NULL);
  s->ctx = ctx;
  s->sock = zmq_socket(ctx, ZMQ_REP);
  int zero = 0;
  zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero);
  beam_diag_clear(&ed);
  assert_int_equal(beam_curve_server(s->sock, key, &ed), 0);
  assert_int_equal(zmq_bind(s->sock, ep), 0);
  if (zap)
    assert_int_equal(beam_zap_watch(zap, s->sock, "test", &ed), 0);
  assert_int_equal(pthread_create(&s->th, NULL, serve, s), 0);
}

static void server_stop(server_t *s) {
  atomic_store(&s->stop, 1);
  pthread_join(s->th, NULL);
  zmq_close(s->sock);
  pthread_mutex_destroy(&s->mu);
}

static void make_pair(const char *name, beam_cert_t *c) {
  beam_diag_t ed = {0};
  beam_diag_clear(&ed);
  assert_int_equal(beam_cert_generate(tmpdir, name, 0, 1, c, &ed), 0);
}

static void move_public(const char *name, const char *dir) {
  char from[400], to[400];
  snprintf(from, sizeof from, "%s/%s", tmpdir, name);
  snprintf(to, sizeof to, "%s/%s", dir, name);
  assert_int_equal(rename(from, to), 0);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void test_zap_handshakes(void **state) {
  (void)state;
  char allow[300], ep[64];
  beam_diag_t ed = {0};
  snprintf(allow, sizeof allow, "%s/allow", tmpdir);
  assert_int_equal(mkdir(allow, 0700), 0);
  beam_cert_t srv, alice, mallory, bob, impostor;
  make_pair("srv", &srv);
  make_pair("alice", &alice);
  make_pair("mallory", &mallory);
  make_pair("bob", &bob);
  make_pair("impostor", &impostor);
  move_public("alice", allow);
  /* A stray non-certificate and a secret file: skipped, not fatal. */
  char stray[400];
  snprintf(stray, sizeof stray, "%s/README", allow);
  write_file(stray, "client keys go here\n");
  snprintf(stray, sizeof stray, "%s/x_secret", allow);
  write_file(stray, "not read\n");

  void *ctx = zmq_ctx_new();
  beam_diag_clear(&ed);
  beam_zap_t *zap = beam_zap_start(ctx, allow, &ed);
  assert_non_null(zap);
  beam_zap_counts_t n;
  beam_zap_counts(zap, &n);
  assert_int_equal(n.keys, 1);
  snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_port());
  server_t s;
  server_start(&s, ctx, &srv, ep, zap);

  void *cctx = zmq_ctx_new(); /* clients in another context: no handler there */
  assert_true(round_trip(cctx, ep, &alice, srv.public_z85, 3000));
  assert_string_equal(server_who(&s), "alice");
  assert_false(round_trip(cctx, ep, &mallory, srv.public_z85, 300));  /* unlisted */
  assert_false(round_trip(cctx, ep, NULL, NULL, 300));                /* plaintext */
  assert_false(round_trip(cctx, ep, &alice, impostor.public_z85, 300)); /* wrong server key */
  sleep_ms(200); /* the monitors report on the ZAP thread */
  beam_zap_counts(zap, &n);
  assert_int_equal(n.accepted, 1);
  assert_true(n.denied_key >= 1);
  /* Plaintext and the wrong server key fail before ZAP is asked. */
  assert_true(n.handshake_failed >= 2);

  /* A reload lets bob in; a failed reload keeps the list. */
  move_public("bob", allow);
  assert_false(round_trip(cctx, ep, &bob, srv.public_z85, 300));
  beam_diag_clear(&ed);
  assert_int_equal(beam_zap_reload(zap, &ed), 0);
  assert_true(round_trip(cctx, ep, &bob, srv.public_z85, 3000));
  assert_string_equal(server_who(&s), "bob");
  beam_zap_counts(zap, &n);
  assert_int_equal(n.keys, 2);

  server_stop(&s);
  zmq_ctx_term(cctx);
  beam_zap_stop(&zap);
  assert_null(zap);
  zmq_ctx_term(ctx);
}

/* libzmq's default would let any client in without a handler; the ZAP
 * domain with ZMQ_ZAP_ENFORCE_DOMAIN must make the handshake fail. */
static void test_no_handler_fails_closed(void **state) {
  (void)state;
  char ep[64];
  beam_cert_t srv, alice;
  make_pair("srv2", &srv);
  make_pair("alice2", &alice);
  void *ctx = zmq_ctx_new();
  snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", free_port());
  server_t s;
  server_start(&s, ctx, &srv, ep, NULL);
  void *cctx = zmq_ctx_new();
  assert_false(round_trip(cctx, ep, &alice, srv.public_z85, 500));
  server_stop(&s);
  zmq_ctx_term(cctx);
  zmq_ctx_term(ctx);
}

static void test_zap_missing_dir(void **state) {
  (void)state;
  char dir[300];
  beam_diag_t ed = {0};
  snprintf(dir, sizeof dir, "%s/nope", tmpdir);
  void *ctx = zmq_ctx_new();
  beam_diag_clear(&ed);
  assert_null(beam_zap_start(ctx, dir, &ed));
  assert_non_null(strstr(ed.msg, "No such file"));
  zmq_ctx_term(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cert_zcert_with_hash),
      cmocka_unit_test(test_cert_pyzmq_layout),
      cmocka_unit_test(test_cert_errors),
      cmocka_unit_test(test_generate),
      cmocka_unit_test(test_loopback),
      cmocka_unit_test(test_zap_handshakes),
      cmocka_unit_test(test_no_handler_fails_closed),
      cmocka_unit_test(test_zap_missing_dir),
  };
  return beam_run_tests(tests, setup, teardown);
}
