/* CURVE key files and socket roles (see curve.h). */
#include "daemon/curve.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
/* A draft option in libzmq 4.3's header, but the library takes it (checked
 * by tests/unit/test_curve.c: without a handler the handshake fails). */
#define ZMQ_ZAP_ENFORCE_DOMAIN 93
#endif

#define CERT_MAX_BYTES 65536

static int z85_ok(const char *s) {
  uint8_t bin[32];
  return strlen(s) == 40 && zmq_z85_decode(bin, s) != NULL;
}

/* The value after '=': trimmed, one level of quotes removed. */
static void cert_value(char *v, char *out, size_t cap) {
  while (*v == ' ' || *v == '\t')
    v++;
  size_t n = strlen(v);
  while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r'))
    n--;
  if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) {
    v++;
    n -= 2;
  }
  if (n >= cap)
    n = cap - 1;
  memcpy(out, v, n);
  out[n] = 0;
}

static void cert_name(const char *path, char *out, size_t cap) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t n = strlen(base);
  static const char *const sfx[] = {".key_secret", "_secret", ".key"};
  for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
    size_t k = strlen(sfx[i]);
    if (n > k && !strcmp(base + n - k, sfx[i])) {
      n -= k;
      break;
    }
  }
  if (n >= cap)
    n = cap - 1;
  memcpy(out, base, n);
  out[n] = 0;
}

/* ZPL (CZMQ's zconfig format): a line's indentation gives its depth, and
 * '#' starts a comment only as the first non-blank character, because Z85
 * keys contain '#'. Only curve/public-key and curve/secret-key matter. */
int beam_cert_parse(const char *text, size_t len, const char *path, beam_cert_t *c,
                     int need_secret, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  char line[1024], section[64] = "";
  int lineno = 0;
  for (size_t pos = 0; pos < len;) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
    lineno++;
    if (n >= sizeof line) {
      return BEAM_DIAG(d, BEAM_EINVAL, "%s:%d: a line longer than %zu bytes: not a certificate", path,
               lineno, sizeof line - 1);
    }
    memcpy(line, text + pos, n);
    line[n] = 0;
    pos += n + (nl != NULL);
    if (memchr(line, 0, n)) {
      return BEAM_DIAG(d, BEAM_EINVAL, "%s:%d: a NUL byte: not a certificate", path, lineno);
    }
    char *p = line;
    int indent = 0;
    while (*p == ' ' || *p == '\t') {
      p++;
      indent++;
    }
    if (!*p || *p == '#' || *p == '\r')
      continue;
    char *eq = strchr(p, '=');
    char key[64];
    size_t kn = eq ? (size_t)(eq - p) : strlen(p);
    while (kn && (p[kn - 1] == ' ' || p[kn - 1] == '\t' || p[kn - 1] == '\r'))
      kn--;
    if (kn >= sizeof key) {
      return BEAM_DIAG(d, BEAM_EINVAL, "%s:%d: a name longer than %zu characters", path, lineno,
               sizeof key - 1);
    }
    memcpy(key, p, kn);
    key[kn] = 0;
    if (indent == 0) {
      snprintf(section, sizeof section, "%s", key);
      continue;
    }
    if (strcmp(section, "curve") || !eq)
      continue;
    char *dst = !strcmp(key, "public-key")   ? c->public_z85
                : !strcmp(key, "secret-key") ? c->secret_z85
                                             : NULL;
    if (!dst)
      continue;
    char val[128];
    cert_value(eq + 1, val, sizeof val);
    if (!z85_ok(val)) {
      return BEAM_DIAG(d, BEAM_EINVAL, "%s:%d: %s is not a 40-character Z85 key", path, lineno, key);
    }
    memcpy(dst, val, BEAM_Z85_KEY);
  }
  if (!c->public_z85[0]) {
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: no curve public-key: not a CURVE certificate", path);
  }
  if (need_secret && !c->secret_z85[0]) {
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: has no secret-key (give the NAME_secret file of the pair)", path);
  }
  if (c->secret_z85[0]) {
    char derived[BEAM_Z85_KEY];
    if (zmq_curve_public(derived, c->secret_z85) != 0 || strcmp(derived, c->public_z85)) {
      return BEAM_DIAG(d, BEAM_EINVAL, "%s: the public key does not belong to the secret key", path);
    }
  }
  cert_name(path, c->name, sizeof c->name);
  return 0;
}

int beam_cert_load(const char *path, beam_cert_t *c, int need_secret, beam_diag_t *d) {
  memset(c, 0, sizeof *c);
  FILE *f = fopen(path, "r");
  if (!f) {
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: %s", path, strerror(errno));
  }
  char *buf = malloc(CERT_MAX_BYTES + 1);
  size_t n = buf ? fread(buf, 1, CERT_MAX_BYTES + 1, f) : 0;
  int bad = ferror(f);
  fclose(f);
  int rc;
  if (!buf)
    rc = BEAM_DIAG(d, BEAM_ENOMEM, "%s: out of memory", path);
  else if (bad)
    rc = BEAM_DIAG(d, BEAM_EIO, "%s: cannot read: %s", path, strerror(errno));
  else if (n > CERT_MAX_BYTES)
    rc = BEAM_DIAG(d, BEAM_EINVAL, "%s: larger than %d bytes: not a certificate", path, CERT_MAX_BYTES);
  else
    rc = beam_cert_parse(buf, n, path, c, need_secret, d);
  free(buf);
  return rc;
}

static int write_cert(const char *path, const beam_cert_t *c, int secret, int force, beam_diag_t *d) {
  int fd = open(path, O_WRONLY | O_CREAT | (force ? O_TRUNC : O_EXCL) | O_CLOEXEC,
                secret ? 0600 : 0644);
  if (fd < 0) {
    return BEAM_DIAG(d, BEAM_EIO, "%s: %s%s", path, strerror(errno),
                     errno == EEXIST ? " (will not overwrite a key; remove it or use --force)" : "");
  }
  if (secret && fchmod(fd, 0600) != 0) { /* O_TRUNC keeps an old file's mode */
    int rc = BEAM_DIAG(d, BEAM_EIO, "%s: chmod: %s", path, strerror(errno));
    close(fd);
    return rc;
  }
  char when[32];
  time_t now = time(NULL);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", localtime(&now));
  char buf[1024];
  int n = snprintf(buf, sizeof buf,
                   "#   ****  Generated on %s by beamd-keygen  ****\n"
                   "#   ZeroMQ CURVE %s Certificate\n"
                   "%s"
                   "\n"
                   "metadata\n"
                   "    name = \"%s\"\n"
                   "curve\n"
                   "    public-key = \"%s\"\n",
                   when, secret ? "**Secret**" : "Public",
                   secret ? "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its "
                            "permissions.\n"
                          : "#   Exchange securely, or use a secure mechanism to verify the "
                            "contents\n#   of this file after exchange.\n",
                   c->name, c->public_z85);
  if (secret)
    n += snprintf(buf + n, sizeof buf - (size_t)n, "    secret-key = \"%s\"\n", c->secret_z85);
  int ok = write(fd, buf, (size_t)n) == n;
  ok = (close(fd) == 0) && ok;
  if (!ok) {
    return BEAM_DIAG(d, BEAM_EINVAL, "%s: write: %s", path, strerror(errno));
  }
  return 0;
}

int beam_cert_generate(const char *dir, const char *name, int pyzmq_names, int force,
                        beam_cert_t *out, beam_diag_t *d) {
  beam_cert_t c = {0};
  if (!name[0] || strchr(name, '/') || strlen(name) >= sizeof c.name) {
    return BEAM_DIAG(d, BEAM_EINVAL, "bad key name '%s' (no '/', 1..%zu characters)", name,
             sizeof c.name - 1);
  }
  if (zmq_curve_keypair(c.public_z85, c.secret_z85) != 0) {
    return BEAM_DIAG(d, BEAM_EINVAL, "zmq_curve_keypair: %s (is libzmq built with CURVE?)",
             zmq_strerror(errno));
  }
  snprintf(c.name, sizeof c.name, "%s", name);
  char pub[4096], sec[4096];
  snprintf(pub, sizeof pub, "%s/%s%s", dir, name, pyzmq_names ? ".key" : "");
  snprintf(sec, sizeof sec, "%s/%s%s", dir, name, pyzmq_names ? ".key_secret" : "_secret");
  /* The secret first: if it cannot be written no public half is left over. */
  if (write_cert(sec, &c, 1, force, d) || write_cert(pub, &c, 0, force, d))
    return -1;
  if (out)
    *out = c;
  return 0;
}

int beam_endpoint_is_loopback(const char *ep) {
  if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9))
    return 1;
  if (strncmp(ep, "tcp://", 6))
    return 0;
  const char *h = ep + 6;
  /* tcp://source;dest: the connection goes to dest. */
  const char *semi = strchr(h, ';');
  if (semi)
    h = semi + 1;
  const char *end = h[0] == '[' ? strchr(h, ']') : strrchr(h, ':');
  if (!end)
    return 0;
  if (h[0] == '[')
    return end - h == 4 && !strncmp(h, "[::1", 4);
  size_t n = (size_t)(end - h);
  if (n == 9 && !strncmp(h, "localhost", 9))
    return 1;
  /* 127.0.0.0/8, as dotted digits only (a name like 127.example is not). */
  if (n < 9 || strncmp(h, "127.", 4))
    return 0;
  int dots = 0;
  for (size_t i = 0; i < n; i++) {
    if (h[i] == '.')
      dots++;
    else if (h[i] < '0' || h[i] > '9')
      return 0;
  }
  return dots == 3;
}

static int set_key(void *sock, int opt, const char *z85, const char *what, beam_diag_t *d) {
  if (zmq_setsockopt(sock, opt, z85, 40) != 0) {
    return BEAM_DIAG(d, BEAM_EINVAL, "setting the CURVE %s: %s", what, zmq_strerror(errno));
  }
  return 0;
}

int beam_curve_server(void *sock, const beam_cert_t *own, beam_diag_t *d) {
  int one = 1;
  if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0) {
    return BEAM_DIAG(d, BEAM_EINVAL, "ZMQ_CURVE_SERVER: %s (is libzmq built with CURVE?)",
             zmq_strerror(errno));
  }
  if (set_key(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, "secret key", d))
    return -1;
  if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, BEAM_ZAP_DOMAIN, strlen(BEAM_ZAP_DOMAIN)) != 0 ||
      zmq_setsockopt(sock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0) {
    return BEAM_DIAG(d, BEAM_EINVAL, "cannot make the CURVE server fail closed (ZAP domain): %s",
             zmq_strerror(errno));
  }
  return 0;
}

int beam_curve_client(void *sock, const beam_cert_t *own, const char *server_public_z85,
                       beam_diag_t *d) {
  if (set_key(sock, ZMQ_CURVE_SERVERKEY, server_public_z85, "server key", d) ||
      set_key(sock, ZMQ_CURVE_PUBLICKEY, own->public_z85, "public key", d) ||
      set_key(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, "secret key", d))
    return -1;
  return 0;
}

const char *beam_curve_peer(void *zmq_msg) {
  const char *u = zmq_msg_gets(zmq_msg, "User-Id");
  return u ? u : "";
}
