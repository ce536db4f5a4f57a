/* The ZAP handler (ZeroMQ RFC 27) and the handshake-failure monitors of
 * CURVE server sockets, on one thread.
 *
 * libzmq asks the handler about every CURVE handshake on a socket with a ZAP
 * domain: "1.0", request id, domain, peer address, routing id, mechanism,
 * client key. The answer 200 carries the key's name as User-Id, which
 * messages from that peer then carry (beam_curve_peer). Peers that never
 * get that far (plaintext, a wrong server key, garbage) are seen only by a
 * socket monitor, so each server socket gets one and its failures are
 * counted here too. */
#include <errno.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <zmq.h>

#include "daemon/curve.h"
#include "daemon/log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define MAX_WATCH 32
#define MAX_KEYS 65536
#define MAX_DEPTH 4
#define POLL_MS 100

typedef struct zkey_s {
  uint8_t key[32];
  char name[BEAM_KEY_NAME];
} zkey_t;

typedef struct allow_s {
  zkey_t *keys; /* sorted by key */
  size_t n, cap;
} allow_t;

/* The monitor says which connection failed only by order: ACCEPTED(fd),
 * then HANDSHAKE_FAILED, then DISCONNECTED(fd). The peer is read when the
 * connection is accepted, and the failure is logged when it closes. */
#define PEERS 64
typedef struct peer_s {
  int fd;
  char addr[64];
} peer_t;

typedef struct watch_s {
  void *pair;
  char what[32];
  peer_t peers[PEERS];
  unsigned npeers;
  const char *failed; /* a failure waiting for its connection's DISCONNECTED */
} watch_t;

struct beam_zap_s {
  void *zctx;
  void *rep;
  pthread_t thread;
  atomic_int stop;
  char *dir;
  pthread_mutex_t mu; /* allow, watches, nwatch */
  allow_t allow;
  watch_t watches[MAX_WATCH];
  int nwatch;
  int serial;
  atomic_uint_fast64_t accepted, denied_key, denied_other, handshake_failed;
  beam_ratelimit_t rl;
};

static int key_cmp(const void *a, const void *b) { return memcmp(a, b, 32); }

static void allow_free(allow_t *a) {
  free(a->keys);
  memset(a, 0, sizeof *a);
}

static int allow_add(allow_t *a, const beam_cert_t *c) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 16;
    zkey_t *k = realloc(a->keys, cap * sizeof *k);
    if (!k)
      return -1;
    a->keys = k;
    a->cap = cap;
  }
  zkey_t *k = &a->keys[a->n++];
  zmq_z85_decode(k->key, c->public_z85);
  snprintf(k->name, sizeof k->name, "%s", c->name);
  return 0;
}

static int ends_with(const char *s, const char *sfx) {
  size_t n = strlen(s), k = strlen(sfx);
  return n >= k && !strcmp(s + n - k, sfx);
}

/* As CZMQ's zcertstore: every regular file below dir except secret files.
 * A file that is not a certificate is skipped with a warning: one stray
 * README must not lock every client out. */
static int allow_scan(allow_t *a, const char *dir, int depth, beam_diag_t *d) {
  DIR *dh = opendir(dir);
  if (!dh) {
    return BEAM_DIAG(d, BEAM_EIO, "allow-list %s: %s", dir, strerror(errno));
  }
  struct dirent *e;
  int rc = 0;
  while (rc == 0 && (e = readdir(dh))) {
    if (e->d_name[0] == '.' || ends_with(e->d_name, "_secret"))
      continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0)
      continue;
    if (S_ISDIR(st.st_mode)) {
      if (depth < MAX_DEPTH)
        rc = allow_scan(a, path, depth + 1, d);
      continue;
    }
    if (!S_ISREG(st.st_mode))
      continue;
    beam_cert_t c;
    beam_diag_t wd = {0};
    if (beam_cert_load(path, &c, 0, &wd) != 0) {
      BEAM_LOG(LOG_WARNING, "curve: allow-list: skipped %s", wd.msg);
      continue;
    }
    if (a->n >= MAX_KEYS) {
      rc = BEAM_DIAG(d, BEAM_ELIMIT, "allow-list %s: more than %d keys", dir, MAX_KEYS);
    } else if (allow_add(a, &c) != 0) {
      rc = BEAM_DIAG(d, BEAM_ENOMEM, "allow-list %s: out of memory", dir);
    }
  }
  closedir(dh);
  return rc;
}

static int allow_load(allow_t *out, const char *dir, beam_diag_t *d) {
  allow_t a = {0};
  if (allow_scan(&a, dir, 0, d) != 0) {
    allow_free(&a);
    return -1;
  }
  if (a.n)
    qsort(a.keys, a.n, sizeof *a.keys, key_cmp);
  *out = a;
  return 0;
}

/* ---- one ZAP request -------------------------------------------------------- */
#define ZAP_FRAMES 7

static void reply(void *rep, const zmq_msg_t *reqid, const char *status, const char *text,
                  const char *user) {
  zmq_send(rep, "1.0", 3, ZMQ_SNDMORE);
  zmq_send(rep, zmq_msg_data((zmq_msg_t *)reqid), zmq_msg_size((zmq_msg_t *)reqid), ZMQ_SNDMORE);
  zmq_send(rep, status, strlen(status), ZMQ_SNDMORE);
  zmq_send(rep, text, strlen(text), ZMQ_SNDMORE);
  zmq_send(rep, user, strlen(user), ZMQ_SNDMORE);
  zmq_send(rep, "", 0, 0);
}

static void handle_request(beam_zap_t *z) {
  zmq_msg_t f[ZAP_FRAMES + 1];
  int n = 0, more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, z->rep, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      if (n == 0)
        return;
      break; /* a multipart message arrives whole; cannot happen */
    }
    more = zmq_msg_more(&m);
    if (n < ZAP_FRAMES + 1)
      f[n++] = m;
    else
      zmq_msg_close(&m);
  }
  char addr[64] = "?";
  if (n >= 4) {
    size_t an = zmq_msg_size(&f[3]) < sizeof addr - 1 ? zmq_msg_size(&f[3]) : sizeof addr - 1;
    memcpy(addr, zmq_msg_data(&f[3]), an);
    addr[an] = 0;
  }
  static const zmq_msg_t empty_id;
  const zmq_msg_t *reqid = n >= 2 ? &f[1] : &empty_id;
  int curve = n == ZAP_FRAMES + 0 && zmq_msg_size(&f[5]) == 5 &&
              !memcmp(zmq_msg_data(&f[5]), "CURVE", 5) && zmq_msg_size(&f[6]) == 32;
  /* One more frame than CURVE's would also be malformed. */
  if (n != ZAP_FRAMES || zmq_msg_size(&f[0]) != 3 || memcmp(zmq_msg_data(&f[0]), "1.0", 3) ||
      !curve) {
    atomic_fetch_add(&z->denied_other, 1);
    beam_log_rl(&z->rl, LOG_WARNING, "curve: refused a %s handshake from %s (only CURVE)",
                n == ZAP_FRAMES && zmq_msg_size(&f[5]) < 16 ? "non-CURVE" : "malformed", addr);
    reply(z->rep, reqid, n >= 2 ? "400" : "500", "only CURVE with a listed key", "");
  } else {
    zkey_t probe;
    memcpy(probe.key, zmq_msg_data(&f[6]), 32);
    pthread_mutex_lock(&z->mu);
    const zkey_t *k =
        z->allow.n ? bsearch(&probe, z->allow.keys, z->allow.n, sizeof probe, key_cmp) : NULL;
    char name[BEAM_KEY_NAME] = "";
    if (k)
      snprintf(name, sizeof name, "%s", k->name);
    pthread_mutex_unlock(&z->mu);
    if (k) {
      atomic_fetch_add(&z->accepted, 1);
      BEAM_LOG(LOG_INFO, "curve: %s connected from %s", name, addr);
      reply(z->rep, reqid, "200", "OK", name);
    } else {
      char z85[BEAM_Z85_KEY];
      zmq_z85_encode(z85, probe.key, 32);
      atomic_fetch_add(&z->denied_key, 1);
      beam_log_rl(&z->rl, LOG_WARNING, "curve: refused client key %s from %s (not in %s)", z85,
                  addr, z->dir);
      reply(z->rep, reqid, "400", "key not allowed", "");
    }
  }
  for (int i = 0; i < n; i++)
    zmq_msg_close(&f[i]);
}

/* ---- monitors --------------------------------------------------------------- */
static const char *failure_name(uint16_t ev, uint32_t val) {
  if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
    if (val == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
      return "a client with another mechanism than CURVE";
    if (val == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
      return "a client with the wrong server key or a bad CURVE handshake";
    return "a client breaking the ZMTP handshake";
  }
  if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
    return NULL; /* the ZAP refusal, counted where it was made */
  /* What a plaintext (NULL) client or a non-ZeroMQ peer produces. */
  return "a client that broke off the handshake (plaintext, or not ZeroMQ)";
}

static void peer_name(int fd, char *out, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "";
  snprintf(out, cap, "an unknown peer");
  if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0)
    return;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(out, cap, "%s:%u", host, ntohs(a->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    snprintf(out, cap, "[%s]:%u", host, ntohs(a->sin6_port));
  }
}

static peer_t *peer_find(watch_t *w, int fd) {
  for (unsigned i = 0; i < w->npeers; i++)
    if (w->peers[i].fd == fd)
      return &w->peers[i];
  return NULL;
}

static void peer_forget(watch_t *w, peer_t *p) { *p = w->peers[--w->npeers]; }

static void log_failure(beam_zap_t *z, watch_t *w, const char *peer) {
  beam_log_rl(&z->rl, LOG_WARNING, "curve: %s: refused %s from %s", w->what, w->failed, peer);
  w->failed = NULL;
}

/* Returns 1 when the monitor has ended (its socket closed). */
static int handle_monitor(beam_zap_t *z, watch_t *w) {
  zmq_msg_t ev, ad;
  zmq_msg_init(&ev);
  zmq_msg_init(&ad);
  int ended = 0;
  if (zmq_msg_recv(&ev, w->pair, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&ev);
    return 0;
  }
  if (zmq_msg_more(&ev))
    zmq_msg_recv(&ad, w->pair, 0);
  if (zmq_msg_size(&ev) >= 6) {
    uint16_t id;
    uint32_t val;
    memcpy(&id, zmq_msg_data(&ev), 2);
    memcpy(&val, (char *)zmq_msg_data(&ev) + 2, 4);
    if (id == ZMQ_EVENT_MONITOR_STOPPED) {
      ended = 1;
    } else if (id == ZMQ_EVENT_ACCEPTED) {
      peer_t *p = peer_find(w, (int)val);
      if (!p && w->npeers < PEERS)
        p = &w->peers[w->npeers++];
      if (p) {
        p->fd = (int)val;
        peer_name(p->fd, p->addr, sizeof p->addr);
      }
    } else if (id == ZMQ_EVENT_DISCONNECTED) {
      peer_t *p = peer_find(w, (int)val);
      if (w->failed)
        log_failure(z, w, p ? p->addr : "an unknown peer");
      if (p)
        peer_forget(w, p);
    } else {
      const char *what = failure_name(id, val);
      if (what) {
        atomic_fetch_add(&z->handshake_failed, 1);
        if (w->failed) /* two failures before a close: say both */
          log_failure(z, w, "an unknown peer");
        w->failed = what;
      }
    }
  }
  zmq_msg_close(&ev);
  zmq_msg_close(&ad);
  return ended;
}

static void *zap_main(void *arg) {
  beam_zap_t *z = arg;
  while (!atomic_load(&z->stop)) {
    zmq_pollitem_t items[1 + MAX_WATCH];
    watch_t *ws[MAX_WATCH];
    int n = 0;
    items[n++] = (zmq_pollitem_t){.socket = z->rep, .events = ZMQ_POLLIN};
    pthread_mutex_lock(&z->mu);
    for (int i = 0; i < z->nwatch; i++) {
      ws[n - 1] = &z->watches[i];
      items[n++] = (zmq_pollitem_t){.socket = z->watches[i].pair, .events = ZMQ_POLLIN};
    }
    pthread_mutex_unlock(&z->mu);
    if (zmq_poll(items, n, POLL_MS) < 0) {
      if (zmq_errno() == ETERM)
        break;
      continue;
    }
    if (items[0].revents & ZMQ_POLLIN)
      handle_request(z);
    for (int i = 1; i < n; i++) {
      if (!(items[i].revents & ZMQ_POLLIN) || !handle_monitor(z, ws[i - 1]))
        continue;
      pthread_mutex_lock(&z->mu);
      zmq_close(ws[i - 1]->pair);
      ws[i - 1]->pair = NULL;
      pthread_mutex_unlock(&z->mu);
    }
    /* Drop ended monitors (the array is only changed on this thread or
     * under mu by beam_zap_watch, which only appends). */
    pthread_mutex_lock(&z->mu);
    int k = 0;
    for (int i = 0; i < z->nwatch; i++)
      if (z->watches[i].pair)
        z->watches[k++] = z->watches[i];
    z->nwatch = k;
    pthread_mutex_unlock(&z->mu);
  }
  return NULL;
}

beam_zap_t *beam_zap_start(void *zctx, const char *allow_dir, beam_diag_t *d) {
  beam_zap_t *z = calloc(1, sizeof *z);
  if (!z || !(z->dir = strdup(allow_dir))) {
    free(z);
    (void)BEAM_DIAG(d, BEAM_ENOMEM, "out of memory");
    return NULL;
  }
  z->zctx = zctx;
  pthread_mutex_init(&z->mu, NULL);
  beam_ratelimit_init(&z->rl, 5);
  if (allow_load(&z->allow, allow_dir, d) != 0)
    goto fail;
  z->rep = zmq_socket(zctx, ZMQ_REP);
  int zero = 0;
  if (z->rep)
    zmq_setsockopt(z->rep, ZMQ_LINGER, &zero, sizeof zero);
  if (!z->rep || zmq_bind(z->rep, ZAP_ENDPOINT) != 0) {
    (void)BEAM_DIAG(d, BEAM_EIO, "cannot bind the ZAP handler at %s: %s", ZAP_ENDPOINT,
                    zmq_strerror(errno));
    goto fail;
  }
  if (pthread_create(&z->thread, NULL, zap_main, z) != 0) {
    (void)BEAM_DIAG(d, BEAM_EIO, "cannot start the ZAP thread: %s", strerror(errno));
    goto fail;
  }
  BEAM_LOG(LOG_INFO, "curve: %zu client key%s allowed (from %s)", z->allow.n,
           z->allow.n == 1 ? "" : "s", allow_dir);
  return z;
fail:
  if (z->rep)
    zmq_close(z->rep);
  allow_free(&z->allow);
  pthread_mutex_destroy(&z->mu);
  free(z->dir);
  free(z);
  return NULL;
}

int beam_zap_reload(beam_zap_t *z, beam_diag_t *d) {
  allow_t a;
  if (allow_load(&a, z->dir, d) != 0)
    return -1;
  pthread_mutex_lock(&z->mu);
  allow_t old = z->allow;
  z->allow = a;
  pthread_mutex_unlock(&z->mu);
  allow_free(&old);
  BEAM_LOG(LOG_NOTICE, "curve: allow-list reloaded: %zu key%s (from %s)", a.n,
           a.n == 1 ? "" : "s", z->dir);
  return 0;
}

int beam_zap_watch(beam_zap_t *z, void *sock, const char *what, beam_diag_t *d) {
  char ep[64];
  pthread_mutex_lock(&z->mu);
  int full = z->nwatch >= MAX_WATCH;
  int serial = z->serial++;
  pthread_mutex_unlock(&z->mu);
  if (full) {
    return BEAM_DIAG(d, BEAM_EIO, "more than %d CURVE server sockets", MAX_WATCH);
  }
  snprintf(ep, sizeof ep, "inproc://beamd-zap-monitor-%p-%d", (void *)z, serial);
  int events = ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_MONITOR_STOPPED | ZMQ_EVENT_ACCEPTED |
               ZMQ_EVENT_DISCONNECTED;
  if (zmq_socket_monitor(sock, ep, events) != 0) {
    return BEAM_DIAG(d, BEAM_EIO, "zmq_socket_monitor: %s", zmq_strerror(errno));
  }
  void *pair = zmq_socket(z->zctx, ZMQ_PAIR);
  int zero = 0;
  if (!pair || zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
      zmq_connect(pair, ep) != 0) {
    int rc = BEAM_DIAG(d, BEAM_EIO, "cannot connect the monitor of %s: %s", what, zmq_strerror(errno));
    if (pair)
      zmq_close(pair);
    return rc;
  }
  /* The PAIR moves to the ZAP thread; the mutex is the barrier ZeroMQ asks
   * for when a socket changes threads. */
  pthread_mutex_lock(&z->mu);
  watch_t *w = &z->watches[z->nwatch++];
  memset(w, 0, sizeof *w);
  w->pair = pair;
  snprintf(w->what, sizeof w->what, "%s", what);
  pthread_mutex_unlock(&z->mu);
  return 0;
}

void beam_zap_counts(beam_zap_t *z, beam_zap_counts_t *out) {
  memset(out, 0, sizeof *out);
  if (!z)
    return;
  out->accepted = atomic_load(&z->accepted);
  out->denied_key = atomic_load(&z->denied_key);
  out->denied_other = atomic_load(&z->denied_other);
  out->handshake_failed = atomic_load(&z->handshake_failed);
  pthread_mutex_lock(&z->mu);
  out->keys = z->allow.n;
  pthread_mutex_unlock(&z->mu);
}

void beam_zap_stop(beam_zap_t **zp) {
  beam_zap_t *z = *zp;
  if (!z)
    return;
  *zp = NULL;
  atomic_store(&z->stop, 1);
  pthread_join(z->thread, NULL);
  for (int i = 0; i < z->nwatch; i++)
    if (z->watches[i].pair)
      zmq_close(z->watches[i].pair);
  zmq_close(z->rep);
  allow_free(&z->allow);
  pthread_mutex_destroy(&z->mu);
  free(z->dir);
  free(z);
}
