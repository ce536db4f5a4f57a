/* ZeroMQ CURVE for beamd and its tools: key files, the allow-list of client
 * keys, the ZAP handler that enforces it, and the socket options of each
 * role.
 *
 * Key files are CZMQ zcert certificates (public "NAME", secret
 * "NAME_secret"; pyzmq writes the same layout as NAME.key /
 * NAME.key_secret). The secret file holds both keys, so a program needs only
 * its secret file for its own identity and the peer's public file.
 *
 * A CURVE server socket sets ZMQ_ZAP_DOMAIN and ZMQ_ZAP_ENFORCE_DOMAIN: with
 * the handler bound (inproc://zeromq.zap.01 in the same context) only listed
 * keys get in; without one libzmq fails the handshake instead of letting
 * any client in, which is its default. */
#ifndef BEAMD_CURVE_H
#define BEAMD_CURVE_H

#include <stddef.h>
#include <stdint.h>

#define BEAMD_Z85_KEY 41   /* 40 Z85 characters + NUL */
#define BEAMD_KEY_NAME 64
#define BEAMD_ZAP_DOMAIN "beamd"

typedef struct beamd_cert_s {
  char public_z85[BEAMD_Z85_KEY];
  char secret_z85[BEAMD_Z85_KEY]; /* "" when the file is a public certificate */
  char name[BEAMD_KEY_NAME];      /* the file's name without _secret / .key / .key_secret */
} beamd_cert_t;

/* Reads a zcert or pyzmq certificate. need_secret: the file must hold a
 * secret key. Returns 0, or -1 with a reason naming the file and line. */
int beamd_cert_load(const char *path, beamd_cert_t *c, int need_secret, char *err, size_t errlen);
/* The same from text already read; path names it in messages and gives the
 * key's name. */
int beamd_cert_parse(const char *text, size_t len, const char *path, beamd_cert_t *c,
                     int need_secret, char *err, size_t errlen);

/* A fresh key pair written as dir/NAME and dir/NAME_secret (zcert names)
 * or dir/NAME.key and dir/NAME.key_secret (pyzmq names). The secret file is
 * created with mode 0600 and never overwrites an existing file unless
 * force. Returns 0 or -1 with a reason. */
int beamd_cert_generate(const char *dir, const char *name, int pyzmq_names, int force,
                        beamd_cert_t *out, char *err, size_t errlen);

/* 1 when nothing outside this host can reach ep: ipc://, inproc://, and
 * tcp:// on 127.0.0.0/8, ::1 or localhost. A bind to * or 0.0.0.0, an
 * interface name or any other address is 0. */
int beamd_endpoint_is_loopback(const char *ep);

/* Socket options for each role; set before bind/connect. */
int beamd_curve_server(void *sock, const beamd_cert_t *own, char *err, size_t errlen);
int beamd_curve_client(void *sock, const beamd_cert_t *own, const char *server_public_z85,
                       char *err, size_t errlen);

/* ---- the ZAP handler (zap.c) ----------------------------------------------- */
typedef struct beamd_zap_s beamd_zap_t;

typedef struct beamd_zap_counts_s {
  uint64_t accepted;       /* handshakes with a listed key */
  uint64_t denied_key;     /* unlisted client key (ZAP said 400) */
  uint64_t denied_other;   /* not CURVE, or a malformed ZAP request */
  uint64_t handshake_failed; /* wrong server key, plaintext client, garbage (socket monitors) */
  uint64_t keys;           /* keys in the allow-list now */
} beamd_zap_counts_t;

/* Starts the handler thread in zctx with the public keys found under
 * allow_dir (every regular file except *_secret, recursively). Must run
 * before any CURVE server socket binds. NULL with a reason on failure. */
beamd_zap_t *beamd_zap_start(void *zctx, const char *allow_dir, char *err, size_t errlen);
/* Reads allow_dir again; on any error the old list stays and -1 comes back. */
int beamd_zap_reload(beamd_zap_t *z, char *err, size_t errlen);
/* Counts (and logs, rate-limited) the handshake failures of sock, a CURVE
 * server socket named `what` ("control", "publish", ...). */
int beamd_zap_watch(beamd_zap_t *z, void *sock, const char *what, char *err, size_t errlen);
void beamd_zap_counts(beamd_zap_t *z, beamd_zap_counts_t *out);
/* Stops the thread and closes its sockets; before zmq_ctx_term. NULL-safe. */
void beamd_zap_stop(beamd_zap_t **z);

/* The key name ZAP gave a message's peer ("" for plaintext peers): the
 * User-Id property of a received message. */
const char *beamd_curve_peer(void *zmq_msg);

#endif
