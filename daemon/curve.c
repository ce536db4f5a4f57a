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
int beamd_cert_parse(const char *text, size_t len, const char *path, beamd_cert_t *c,
                     int need_secret, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  char line[1024], section[64] = "";
  int lineno = 0;
  for (size_t pos = 0; pos < len;) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t n = nl ? (size_t)(nl - (text + pos)) : len - pos;
    lineno++;
    if (n >= sizeof line) {
      snprintf(err, errlen, "%s:%d: a line longer than %zu bytes: not a certificate", path,
               lineno, sizeof line - 1);
      return -1;
    }
    memcpy(line, text + pos, n);
    line[n] = 0;
    pos += n + (nl != NULL);
    if (memchr(line, 0, n)) {
      snprintf(err, errlen, "%s:%d: a NUL byte: not a certificate", path, lineno);
      return -1;
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
      snprintf(err, errlen, "%s:%d: a name longer than %zu characters", path, lineno,
               sizeof key - 1);
      return -1;
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
      snprintf(err, errlen, "%s:%d: %s is not a 40-character Z85 key", path, lineno, key);
      return -1;
    }
    memcpy(dst, val, BEAMD_Z85_KEY);
  }
  if (!c->public_z85[0]) {
    snprintf(err, errlen, "%s: no curve public-key: not a CURVE certificate", path);
    return -1;
  }
  if (need_secret && !c->secret_z85[0]) {
    snprintf(err, errlen, "%s: has no secret-key (give the NAME_secret file of the pair)", path);
    return -1;
  }
  if (c->secret_z85[0]) {
    char derived[BEAMD_Z85_KEY];
    if (zmq_curve_public(derived, c->secret_z85) != 0 || strcmp(derived, c->public_z85)) {
      snprintf(err, errlen, "%s: the public key does not belong to the secret key", path);
      return -1;
    }
  }
  cert_name(path, c->name, sizeof c->name);
  return 0;
}

int beamd_cert_load(const char *path, beamd_cert_t *c, int need_secret, char *err,
                    size_t errlen) {
  memset(c, 0, sizeof *c);
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return -1;
  }
  char *buf = malloc(CERT_MAX_BYTES + 1);
  size_t n = buf ? fread(buf, 1, CERT_MAX_BYTES + 1, f) : 0;
  int bad = ferror(f);
  fclose(f);
  int rc = -1;
  if (!buf)
    snprintf(err, errlen, "%s: out of memory", path);
  else if (bad)
    snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
  else if (n > CERT_MAX_BYTES)
    snprintf(err, errlen, "%s: larger than %d bytes: not a certificate", path, CERT_MAX_BYTES);
  else
    rc = beamd_cert_parse(buf, n, path, c, need_secret, err, errlen);
  free(buf);
  return rc;
}

static int write_cert(const char *path, const beamd_cert_t *c, int secret, int force, char *err,
                      size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | (force ? O_TRUNC : O_EXCL) | O_CLOEXEC,
                secret ? 0600 : 0644);
  if (fd < 0) {
    snprintf(err, errlen, "%s: %s%s", path, strerror(errno),
             errno == EEXIST ? " (will not overwrite a key; remove it or use --force)" : "");
    return -1;
  }
  if (secret && fchmod(fd, 0600) != 0) { /* O_TRUNC keeps an old file's mode */
    snprintf(err, errlen, "%s: chmod: %s", path, strerror(errno));
    close(fd);
    return -1;
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
    snprintf(err, errlen, "%s: write: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int beamd_cert_generate(const char *dir, const char *name, int pyzmq_names, int force,
                        beamd_cert_t *out, char *err, size_t errlen) {
  beamd_cert_t c = {0};
  if (!name[0] || strchr(name, '/') || strlen(name) >= sizeof c.name) {
    snprintf(err, errlen, "bad key name '%s' (no '/', 1..%zu characters)", name,
             sizeof c.name - 1);
    return -1;
  }
  if (zmq_curve_keypair(c.public_z85, c.secret_z85) != 0) {
    snprintf(err, errlen, "zmq_curve_keypair: %s (is libzmq built with CURVE?)",
             zmq_strerror(errno));
    return -1;
  }
  snprintf(c.name, sizeof c.name, "%s", name);
  char pub[4096], sec[4096];
  snprintf(pub, sizeof pub, "%s/%s%s", dir, name, pyzmq_names ? ".key" : "");
  snprintf(sec, sizeof sec, "%s/%s%s", dir, name, pyzmq_names ? ".key_secret" : "_secret");
  /* The secret first: if it cannot be written no public half is left over. */
  if (write_cert(sec, &c, 1, force, err, errlen) || write_cert(pub, &c, 0, force, err, errlen))
    return -1;
  if (out)
    *out = c;
  return 0;
}

int beamd_endpoint_is_loopback(const char *ep) {
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

static int set_key(void *sock, int opt, const char *z85, const char *what, char *err,
                   size_t errlen) {
  if (zmq_setsockopt(sock, opt, z85, 40) != 0) {
    snprintf(err, errlen, "setting the CURVE %s: %s", what, zmq_strerror(errno));
    return -1;
  }
  return 0;
}

int beamd_curve_server(void *sock, const beamd_cert_t *own, char *err, size_t errlen) {
  int one = 1;
  if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0) {
    snprintf(err, errlen, "ZMQ_CURVE_SERVER: %s (is libzmq built with CURVE?)",
             zmq_strerror(errno));
    return -1;
  }
  if (set_key(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, "secret key", err, errlen))
    return -1;
  if (zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, BEAMD_ZAP_DOMAIN, strlen(BEAMD_ZAP_DOMAIN)) != 0 ||
      zmq_setsockopt(sock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one) != 0) {
    snprintf(err, errlen, "cannot make the CURVE server fail closed (ZAP domain): %s",
             zmq_strerror(errno));
    return -1;
  }
  return 0;
}

int beamd_curve_client(void *sock, const beamd_cert_t *own, const char *server_public_z85,
                       char *err, size_t errlen) {
  if (set_key(sock, ZMQ_CURVE_SERVERKEY, server_public_z85, "server key", err, errlen) ||
      set_key(sock, ZMQ_CURVE_PUBLICKEY, own->public_z85, "public key", err, errlen) ||
      set_key(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, "secret key", err, errlen))
    return -1;
  return 0;
}

const char *beamd_curve_peer(void *zmq_msg) {
  const char *u = zmq_msg_gets(zmq_msg, "User-Id");
  return u ? u : "";
}
