"""CURVE for beamd_client sockets, with the same key files as beamd.

    from beamd_client import Curve, Subscriber
    curve = Curve(secret_key="alice_secret", server_key="beamd")
    with Subscriber("tcp://beamline-node:5600", curve=curve) as sub:
        ...

Key files are CZMQ zcert certificates (what `beamd-keygen NAME` writes:
NAME and NAME_secret) or pyzmq's NAME.key / NAME.key_secret; pyzmq's
zmq.auth.load_certificate reads both. A client needs its own secret file and
the server's public file. A server (Publisher, ReplayServer) needs its
secret file and a directory of the client public files it lets in; it runs
a ZAP handler in its context and, as beamd does, enforces the ZAP domain so
that no handshake succeeds without it.

Curve.from_env() reads $BEAMD_CURVE_SECRET, $BEAMD_CURVE_SERVER and
$BEAMD_CURVE_ALLOW, the variables beamd's C tools read.
"""

import os

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

ZAP_DOMAIN = b"beamd"
_ZAP_ENFORCE_DOMAIN = getattr(zmq, "ZAP_ENFORCE_DOMAIN", 93)


def allowed_keys(directory):
    """Public keys (Z85 bytes) of every certificate below directory, except
    secret files, as beamd's allow-list reads them."""
    keys = set()
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") or name.endswith("_secret"):
                continue
            try:
                public, _ = zmq.auth.load_certificate(os.path.join(root, name))
            except (ValueError, OSError):
                continue  # not a certificate: skipped, as beamd does
            if public:
                keys.add(public)
    return keys


class _Keys:
    """pyzmq's CURVE callback: the allow-list, read once."""

    def __init__(self, directory):
        self.keys = allowed_keys(directory)

    def callback(self, domain, key):
        return key in self.keys


class Curve:
    def __init__(self, secret_key=None, server_key=None, allow=None):
        self.public = self.secret = self.server_public = None
        if secret_key:
            self.public, self.secret = zmq.auth.load_certificate(secret_key)
            if not self.secret:
                raise ValueError("%s has no secret-key (give the NAME_secret file)" % secret_key)
        if server_key:
            self.server_public, _ = zmq.auth.load_certificate(server_key)
        self.allow = allow
        self._auth = {}

    @classmethod
    def from_env(cls):
        def get(name):
            return os.environ.get(name) or None
        return cls(get("BEAMD_CURVE_SECRET"), get("BEAMD_CURVE_SERVER"),
                   get("BEAMD_CURVE_ALLOW"))

    def client(self, sock):
        """Before connect: CURVE client to the server whose key was given."""
        if not (self.secret and self.server_public):
            raise ValueError("a CURVE client needs secret_key and server_key")
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_public

    def server(self, sock, context):
        """Before bind: CURVE server letting in the keys in `allow`."""
        if not (self.secret and self.allow):
            raise ValueError("a CURVE server needs secret_key and allow")
        key = id(context)
        if key not in self._auth:
            auth = ThreadAuthenticator(context)
            auth.start()
            auth.configure_curve_callback(domain=ZAP_DOMAIN.decode(),
                                          credentials_provider=_Keys(self.allow))
            self._auth[key] = auth
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True
        sock.zap_domain = ZAP_DOMAIN
        sock.setsockopt(_ZAP_ENFORCE_DOMAIN, 1)

    def apply(self, sock, context, bind):
        (self.server(sock, context) if bind else self.client(sock))

    def close(self):
        for auth in self._auth.values():
            auth.stop()
        self._auth.clear()
