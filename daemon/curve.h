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
#ifndef BEAM_CURVE_H
#define BEAM_CURVE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"

#define BEAM_Z85_KEY 41   /* 40 Z85 characters + NUL */
#define BEAM_KEY_NAME 64
#define BEAM_ZAP_DOMAIN "beamd"

typedef struct beam_cert_s {
  char public_z85[BEAM_Z85_KEY];
  char secret_z85[BEAM_Z85_KEY]; /* "" when the file is a public certificate */
  char name[BEAM_KEY_NAME];      /* the file's name without _secret / .key / .key_secret */
} beam_cert_t;

/* Reads a zcert or pyzmq certificate. need_secret: the file must hold a
 * secret key. Returns 0, or < 0 with the reason (naming the file and line) in d. */
int beam_cert_load(const char *path, beam_cert_t *c, int need_secret, beam_diag_t *d);
/* The same from text already read; path names it in messages and gives the
 * key's name. */
int beam_cert_parse(const char *text, size_t len, const char *path, beam_cert_t *c,
                     int need_secret, beam_diag_t *d);

/* A fresh key pair written as dir/NAME and dir/NAME_secret (zcert names)
 * or dir/NAME.key and dir/NAME.key_secret (pyzmq names). The secret file is
 * created with mode 0600 and never overwrites an existing file unless
 * force. Returns 0 or < 0 with the reason in d. */
int beam_cert_generate(const char *dir, const char *name, int pyzmq_names, int force,
                        beam_cert_t *out, beam_diag_t *d);

/* 1 when nothing outside this host can reach ep: ipc://, inproc://, and
 * tcp:// on 127.0.0.0/8, ::1 or localhost. A bind to * or 0.0.0.0, an
 * interface name or any other address is 0. */
int beam_endpoint_is_loopback(const char *ep);

/* Socket options for each role; set before bind/connect. */
int beam_curve_server(void *sock, const beam_cert_t *own, beam_diag_t *d);
int beam_curve_client(void *sock, const beam_cert_t *own, const char *server_public_z85,
                       beam_diag_t *d);

/* ---- the ZAP handler (zap.c) ----------------------------------------------- */
typedef struct beam_zap_s beam_zap_t;

typedef struct beam_zap_counts_s {
  uint64_t accepted;       /* handshakes with a listed key */
  uint64_t denied_key;     /* unlisted client key (ZAP said 400) */
  uint64_t denied_other;   /* not CURVE, or a malformed ZAP request */
  uint64_t handshake_failed; /* wrong server key, plaintext client, garbage (socket monitors) */
  uint64_t keys;           /* keys in the allow-list now */
} beam_zap_counts_t;

/* Starts the handler thread in zctx with the public keys found under
 * allow_dir (every regular file except *_secret, recursively). Must run
 * before any CURVE server socket binds. NULL with the reason in d on failure. */
beam_zap_t *beam_zap_start(void *zctx, const char *allow_dir, beam_diag_t *d);
/* Reads allow_dir again; on any error the old list stays and < 0 comes back (the reason in d). */
int beam_zap_reload(beam_zap_t *z, beam_diag_t *d);
/* Counts (and logs, rate-limited) the handshake failures of sock, a CURVE
 * server socket named `what` ("control", "publish", ...). */
int beam_zap_watch(beam_zap_t *z, void *sock, const char *what, beam_diag_t *d);
void beam_zap_counts(beam_zap_t *z, beam_zap_counts_t *out);
/* Stops the thread and closes its sockets; before zmq_ctx_term. NULL-safe. */
void beam_zap_stop(beam_zap_t **z);

/* The key name ZAP gave a message's peer ("" for plaintext peers): the
 * User-Id property of a received message. */
const char *beam_curve_peer(void *zmq_msg);

#endif
